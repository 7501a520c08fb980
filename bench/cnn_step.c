/* bench/cnn_step.c - the ResNet-style CNN of examples/cnn.c against its
 * PyTorch peer (bench/peer/cnn.py), in one run.
 *
 * Step time: --steps training steps (after --warmup untimed ones) of the
 * default model (width 16, batch 128, SGD with Nesterov momentum, the
 * first batches of epoch 1's order) on the CPU backend and on the
 * simulated NeuronCore, each step's host wall time (the step and reading
 * its loss: the one sync a training loop needs, as the peer's loss.item()),
 * and in PyTorch 1.13 eager fp32 at 1 and at 2 threads (the faster counts);
 * prints the medians, each one's ratio to PyTorch's, the process CPU time a
 * step of each (every thread; the peer reports its own), and for the simulator
 * the simulated time per step, MFU, TensorE utilisation, HBM bytes and
 * kernels per step.  With --rounds N every configuration runs N times in
 * turn and each ratio is the median of its rounds'.
 *
 * Accuracy: with --epochs E (0, the default: none) it also trains E epochs
 * on the CPU backend and the peer at its faster thread count, from the same
 * initial parameters (examples/cnn --dump-init's file, the peer's --init)
 * and batch order, and prints both test accuracies and wall times.
 *
 * Targets: cpu <= 0.7x PyTorch eager's step time, sim <= 1.0x; test
 * accuracy >= 92.5% within 10 minutes, within 0.3 points of PyTorch's.
 * The first line names the CPU (/proc/cpuinfo).
 *
 * Usage: cnn_step [--steps N] [--warmup N] [--rounds N] [--configs peer,cpu,sim]
 *                 [--width N] [--batch N] [--epochs E] [--peer PATH] [--python PATH]
 *                 [--data DIR] */
#include <math.h>
#include <ntensor.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench/cnn_step"
#include "bench.h"
#include "examples/fmnist.h"
#include "examples/cnn_model.h"

#ifndef CNN_PEER_SCRIPT
#define CNN_PEER_SCRIPT "bench/peer/cnn.py"
#endif

#define SIM_TARGET 1.0
#define CPU_TARGET 0.7
#define ACC_TARGET 92.5
#define ACC_GAP 0.3
#define MAX_ROUNDS 16

typedef struct {
    double ms;                  /* median host wall time per step */
    double cpu_ms;              /* the process's CPU time per step (every thread) */
    double sim_ms, mfu, tensor; /* simulated: per step, MFU, TensorE busy share */
    double hbm_mb, kernels;     /* per step */
    bool ran;
} result;

typedef struct {
    int width, batch, steps, warmup, epochs;
    const char *python, *peer, *data;
} bench_opts;

static void cpu_name(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            snprintf(out, cap, "%s", v);
            out[strcspn(out, "\n")] = '\0';
            break;
        }
    if (f)
        fclose(f);
}

static void make_model(const bench_opts *b, const cnn_data *train, cnn_model *m, nt_optim **opt,
                       nt_scheduler **sched, int epochs)
{
    cnn_train_opts t = {.batch = b->batch, .width = b->width, .warmup = -1, .lr = 0, .wd = -1};
    t.total_steps = (int64_t)(epochs > 0 ? epochs : 1) * ((train->n + b->batch - 1) / b->batch);
    cnn_opts_defaults(&t, train->n);
    bench_check(cnn_init(m, b->width, 1), "cnn_init");
    if (!(*opt = cnn_optimizer(m, &t, sched)))
        bench_fail("cnn_optimizer");
}

/* The process's CPU time (every thread), ms. */
static double process_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Times b->steps steps on `backend`. */
static void run_ours(const char *backend, const bench_opts *b, const cnn_data *train,
                     const int *order, result *r)
{
    bench_check(nt_config_set("NT_BACKEND", backend), "nt_config_set NT_BACKEND");
    cnn_model m;
    nt_optim *opt;
    nt_scheduler *sched;
    make_model(b, train, &m, &opt, &sched, 1);
    float *xb = malloc(sizeof(float) * (size_t)b->batch * CNN_PIXELS);
    int32_t *yb = malloc(sizeof(int32_t) * (size_t)b->batch);
    double *ms = malloc(sizeof(double) * (size_t)b->steps);
    nt_stats st0, st1;
    nt_sim_stats s0, s1;
    int per_epoch = train->n / b->batch;
    double c0 = 0;
    for (int k = 0; k < b->warmup + b->steps; k++) {
        if (k == b->warmup) {
            bench_check(nt_sync(), "nt_sync");
            nt_stats_get(&st0);
            nt_sim_stats_get(&s0);
            c0 = process_cpu_ms();
        }
        double t0 = bench_now_ns(), l;
        nt_tensor *loss = cnn_train_step(&m, opt, sched, train,
                                         order + (size_t)(k % per_epoch) * b->batch, b->batch, xb,
                                         yb, NULL);
        if (!loss || nt_item(loss, &l) != 0)
            bench_fail("training step");
        nt_release(loss);
        if (k >= b->warmup)
            ms[k - b->warmup] = (bench_now_ns() - t0) * 1e-6;
    }
    bench_check(nt_sync(), "nt_sync");
    r->cpu_ms = (process_cpu_ms() - c0) / b->steps;
    nt_stats_get(&st1);
    nt_sim_stats_get(&s1);
    double n = b->steps, sim_ns = s1.sim_ns - s0.sim_ns;
    r->ms = bench_median(ms, b->steps);
    r->sim_ms = sim_ns * 1e-6 / n;
    r->mfu = sim_ns > 0 ? (s1.tensor_ideal_ns - s0.tensor_ideal_ns) / sim_ns : 0;
    r->tensor = sim_ns > 0 ? (s1.busy_ns[NT_ENGINE_TENSOR] - s0.busy_ns[NT_ENGINE_TENSOR]) / sim_ns
                           : 0;
    r->hbm_mb = (double)(s1.hbm_read_bytes + s1.hbm_write_bytes - s0.hbm_read_bytes -
                         s0.hbm_write_bytes) * 1e-6 / n;
    r->kernels = (double)(st1.kernels_launched - st0.kernels_launched) / n;
    r->ran = true;
    printf("  %-4s %8.1f ms/step (median of %d), CPU time %.1f ms/step", backend, r->ms, b->steps,
           r->cpu_ms);
    if (sim_ns > 0)
        printf("; simulated %.2f ms/step, MFU %.1f%%, TensorE %.0f%%, HBM %.1f MB/step",
               r->sim_ms, 100 * r->mfu, 100 * r->tensor, r->hbm_mb);
    printf("; %.0f kernels/step\n", r->kernels);
    fflush(stdout);
    free(xb);
    free(yb);
    free(ms);
    nt_scheduler_destroy(sched);
    nt_optim_destroy(opt);
    cnn_free(&m);
}

typedef struct {
    result *r;
    double acc, ms;
    bool final;
} peer_out;

static void peer_line(const char *line, void *arg)
{
    peer_out *o = arg;
    double med, best, acc, ms;
    if (sscanf(line, "timed median_ms=%lf min_ms=%lf", &med, &best) == 2) {
        const char *c = strstr(line, "cpu_ms=");
        o->r->ms = med;
        o->r->cpu_ms = c ? atof(c + 7) : NAN;
        o->r->ran = true;
    }
    if (sscanf(line, "final test_acc=%lf ms_per_step=%lf", &acc, &ms) == 2) {
        o->acc = acc;
        o->ms = ms;
        o->final = true;
    }
    printf("    peer: %s", line);
    fflush(stdout);
}

/* Runs the peer at `threads` threads: timing (init NULL) or training
 * b->epochs from the parameters in `init`. */
static int run_peer(const bench_opts *b, int threads, const char *init, peer_out *o)
{
    char cmd[8192];
    if (init)
        snprintf(cmd, sizeof cmd,
                 "'%s' '%s' --threads %d --width %d --batch %d --epochs %d --init '%s' "
                 "--data '%s'",
                 b->python, b->peer, threads, b->width, b->batch, b->epochs, init, b->data);
    else
        snprintf(cmd, sizeof cmd,
                 "'%s' '%s' --threads %d --width %d --batch %d --time-steps %d --time-warmup %d "
                 "--data '%s'",
                 b->python, b->peer, threads, b->width, b->batch, b->steps, b->warmup, b->data);
    return bench_peer_lines(cmd, peer_line, o);
}

/* Trains b->epochs on the CPU backend (the peer's --init written to
 * init_path first); returns the final test accuracy, *secs the wall time. */
static double train_ours(const bench_opts *b, const cnn_data *train, const cnn_data *test,
                         const char *init_path, double *secs)
{
    bench_check(nt_config_set("NT_BACKEND", "cpu"), "nt_config_set NT_BACKEND");
    cnn_model m;
    nt_optim *opt;
    nt_scheduler *sched;
    make_model(b, train, &m, &opt, &sched, b->epochs);
    if (cnn_dump_params(&m, init_path))
        exit(1);
    float *xb = malloc(sizeof(float) * (size_t)b->batch * CNN_PIXELS);
    int32_t *yb = malloc(sizeof(int32_t) * (size_t)b->batch);
    int *order = malloc(sizeof(int) * (size_t)train->n);
    double t0 = bench_now_ns(), acc = NAN;
    for (int ep = 0; ep < b->epochs; ep++) {
        cnn_epoch_order(order, train->n, 1, ep);
        for (int s0 = 0; s0 < train->n; s0 += b->batch) {
            int bs = train->n - s0 < b->batch ? train->n - s0 : b->batch;
            double l;
            nt_tensor *loss = cnn_train_step(&m, opt, sched, train, order + s0, bs, xb, yb, NULL);
            if (!loss || nt_item(loss, &l) != 0)
                bench_fail("training step");
            nt_release(loss);
        }
        acc = cnn_evaluate(&m, test, 0);
        printf("    ntensor cpu: epoch %d/%d test acc %.2f%% (%.1f s)\n", ep + 1, b->epochs, acc,
               (bench_now_ns() - t0) * 1e-9);
        fflush(stdout);
    }
    *secs = (bench_now_ns() - t0) * 1e-9;
    free(xb);
    free(yb);
    free(order);
    nt_scheduler_destroy(sched);
    nt_optim_destroy(opt);
    cnn_free(&m);
    return acc;
}

static void usage(void)
{
    fprintf(stderr, "usage: cnn_step [--steps N] [--warmup N] [--rounds N] [--configs "
                    "peer,cpu,sim] [--width N] [--batch N] [--epochs E] [--peer PATH] "
                    "[--python PATH] [--data DIR]\n");
    exit(1);
}

static void parse(int argc, char **argv, bench_opts *b, int *rounds, const char **configs)
{
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (!strcmp(argv[i], "--steps"))
            b->steps = atoi(v);
        else if (!strcmp(argv[i], "--warmup"))
            b->warmup = atoi(v);
        else if (!strcmp(argv[i], "--rounds"))
            *rounds = atoi(v);
        else if (!strcmp(argv[i], "--configs"))
            *configs = v;
        else if (!strcmp(argv[i], "--width"))
            b->width = atoi(v);
        else if (!strcmp(argv[i], "--batch"))
            b->batch = atoi(v);
        else if (!strcmp(argv[i], "--epochs"))
            b->epochs = atoi(v);
        else if (!strcmp(argv[i], "--peer"))
            b->peer = v;
        else if (!strcmp(argv[i], "--python"))
            b->python = v;
        else if (!strcmp(argv[i], "--data"))
            b->data = v;
        else
            usage();
        i++;
    }
    if (b->steps < 1 || b->warmup < 0 || *rounds < 1 || *rounds > MAX_ROUNDS || b->width < 1 ||
        b->batch < 2 || b->epochs < 0) {
        fprintf(stderr, "cnn_step: --steps, --width >= 1, --batch >= 2, --warmup, --epochs >= 0, "
                        "--rounds 1 to %d\n", MAX_ROUNDS);
        exit(1);
    }
    if (strlen(b->python) > 1000 || strchr(b->python, '\'') || strlen(b->peer) > 1000 ||
        strchr(b->peer, '\'') || strlen(b->data) > 1000 || strchr(b->data, '\'')) {
        fprintf(stderr, "cnn_step: --python, --peer and --data must be paths of at most 1000 "
                        "characters without a quote\n");
        exit(1);
    }
}

/* The accuracy comparison of --epochs (the peer at `threads`). */
static void compare_accuracy(const bench_opts *b, const cnn_data *train, const cnn_data *test,
                             int threads, bool peer_ok)
{
    char init[64];
    snprintf(init, sizeof init, "/tmp/cnn_step_init.%d.f32", (int)getpid());
    printf("\naccuracy after %d epoch(s), the same initial parameters and batch order:\n",
           b->epochs);
    double secs, acc = train_ours(b, train, test, init, &secs);
    printf("  ntensor cpu: test accuracy %.2f%% in %.1f s (%.1f min)\n", acc, secs, secs / 60);
    printf("  test accuracy >= %.1f%% within 10 minutes: %s\n", ACC_TARGET,
           acc >= ACC_TARGET && secs <= 600 ? "met" : "NOT met");
    if (peer_ok) {
        peer_out o = {&(result){0}, NAN, NAN, false};
        double t0 = bench_now_ns();
        int st = run_peer(b, threads, init, &o);
        double ps = (bench_now_ns() - t0) * 1e-9;
        if (st == 0 && o.final) {
            printf("  PyTorch (%d thread(s)): test accuracy %.2f%% in %.1f s\n", threads, o.acc,
                   ps);
            printf("  within %.1f points of PyTorch's: %s (%+.2f)\n", ACC_GAP,
                   fabs(acc - o.acc) <= ACC_GAP ? "met" : "NOT met", acc - o.acc);
        } else
            printf("  the peer failed (exit status %d)\n", st);
    }
    unlink(init);
}

int main(int argc, char **argv)
{
    bench_opts b = {.width = 16, .batch = 128, .steps = 30, .warmup = 5, .epochs = 0,
                    .python = "/usr/bin/python3", .peer = CNN_PEER_SCRIPT, .data = FMNIST_DIR};
    int rounds = 1;
    const char *configs = "peer,cpu,sim";
    parse(argc, argv, &b, &rounds, &configs);
    cnn_data train, test;
    if (fmnist_load("cnn", b.data, "train", &train) || fmnist_load("cnn", b.data, "t10k", &test))
        return 1;
    if (nt_init() != 0)
        bench_fail("nt_init");
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf("bench/cnn_step: CNN of examples/cnn.c (width %d, batch %d), %d timed steps after %d; "
           "CPU %s, %ld online processor(s); mode %s; %d round(s)\n",
           b.width, b.batch, b.steps, b.warmup, cpu, sysconf(_SC_NPROCESSORS_ONLN),
           nt_config_get("NT_MODE"), rounds);
    int *order = malloc(sizeof(int) * (size_t)train.n);
    cnn_epoch_order(order, train.n, 1, 0);
    enum { PEER1, PEER2, CPU, SIM, NCFG };
    const char *label[NCFG] = {"PyTorch 1.13 eager fp32, 1 thread",
                               "PyTorch 1.13 eager fp32, 2 threads", "ntensor cpu",
                               "ntensor sim"};
    result r[NCFG][MAX_ROUNDS];
    memset(r, 0, sizeof r);
    bool has_torch = bench_python_has_torch(b.python);
    for (int k = 0; k < rounds; k++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", configs);
        if (rounds > 1)
            printf("round %d of %d\n", k + 1, rounds);
        for (char *save = NULL, *c = strtok_r(buf, ",", &save); c;
             c = strtok_r(NULL, ",", &save)) {
            if (!strcmp(c, "none")) /* --configs none --epochs E: accuracy only */
                continue;
            if (!strcmp(c, "peer")) {
                if (!has_torch) {
                    printf("  peer skipped: %s cannot import torch (Debian: python3-torch; sh "
                           "scripts/deps.sh --bench)\n", b.python);
                    continue;
                }
                for (int t = 1; t <= 2; t++) {
                    peer_out o = {&r[PEER1 + t - 1][k], NAN, NAN, false};
                    int st = run_peer(&b, t, NULL, &o);
                    if (st != 0 || !o.r->ran) {
                        printf("  peer at %d thread(s) failed (exit status %d)\n", t, st);
                        o.r->ran = false;
                    } else
                        printf("  peer-%dt %8.1f ms/step (median of %d)\n", t, o.r->ms, b.steps);
                }
            } else if (!strcmp(c, "cpu") || !strcmp(c, "sim"))
                run_ours(c, &b, &train, order, &r[!strcmp(c, "cpu") ? CPU : SIM][k]);
            else {
                fprintf(stderr, "cnn_step: unknown config '%s' (peer, cpu, sim, none)\n", c);
                return 1;
            }
        }
    }
    /* per round: the faster peer; ratios are medians over the rounds */
    double peer_ms[MAX_ROUNDS];
    bool peer_ok = rounds > 0;
    int faster, wins2 = 0;
    for (int k = 0; k < rounds; k++) {
        double a = r[PEER1][k].ran ? r[PEER1][k].ms : INFINITY;
        double c = r[PEER2][k].ran ? r[PEER2][k].ms : INFINITY;
        peer_ms[k] = fmin(a, c);
        wins2 += c < a;
        peer_ok = peer_ok && isfinite(peer_ms[k]);
    }
    faster = 2 * wins2 > rounds || !r[PEER1][0].ran ? 2 : 1; /* 2 when not timed */
    printf("\n| run | ms/step%s | x PyTorch (faster thread count) | simulated ms/step | MFU | "
           "TensorE | HBM MB/step | kernels/step |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
           rounds > 1 ? " (median of rounds)" : "");
    double ratio[NCFG] = {0};
    for (int i = 0; i < NCFG; i++) {
        double ms[MAX_ROUNDS], q[MAX_ROUNDS];
        bool all = true;
        for (int k = 0; k < rounds; k++) {
            all = all && r[i][k].ran;
            ms[k] = r[i][k].ms;
            q[k] = peer_ok ? r[i][k].ms / peer_ms[k] : 0;
        }
        if (!all)
            continue;
        printf("| %s | %.1f |", label[i], bench_median(ms, rounds));
        if (peer_ok)
            printf(" %.2fx |", ratio[i] = bench_median(q, rounds));
        else
            printf(" - |");
        const result *l = &r[i][rounds - 1];
        if (i == SIM)
            printf(" %.2f | %.1f%% | %.0f%% | %.1f | %.0f |\n", l->sim_ms, 100 * l->mfu,
                   100 * l->tensor, l->hbm_mb, l->kernels);
        else if (i == CPU)
            printf(" - | - | - | - | %.0f |\n", l->kernels);
        else
            printf(" - | - | - | - | - |\n");
    }
    /* CPU time (every thread of each process): steadier than wall time on
       a shared host; against PyTorch at 2 threads, median of the rounds */
    bool cpu_ok = rounds > 0;
    double cq[NCFG][MAX_ROUNDS];
    for (int i = 0; i < NCFG; i++)
        for (int k = 0; k < rounds; k++) {
            cpu_ok = cpu_ok && (!r[i][k].ran || isfinite(r[i][k].cpu_ms));
            cq[i][k] = r[i][k].ran ? r[i][k].cpu_ms : NAN;
        }
    if (cpu_ok && r[PEER2][0].ran) {
        static const char *const name[NCFG] = {"PyTorch-1t", "PyTorch-2t", "cpu", "sim"};
        double q[NCFG][MAX_ROUNDS], med[NCFG]; /* the ratios before any sorting */
        for (int i = 0; i < NCFG; i++)
            for (int k = 0; k < rounds; k++)
                q[i][k] = cq[i][k] / cq[PEER2][k];
        printf("CPU time a step (median of rounds):");
        for (int i = 0; i < NCFG; i++) {
            if (!r[i][0].ran)
                continue;
            med[i] = bench_median(cq[i], rounds);
            printf(" %s %.1f ms (%.2fx PyTorch-2t)%s", name[i], med[i], bench_median(q[i], rounds),
                   i + 1 < NCFG ? "," : "");
        }
        printf("\n");
    }
    if (peer_ok) {
        if (ratio[CPU] > 0)
            printf("cpu backend <= %.1fx PyTorch's step time: %s (%.2fx)\n", CPU_TARGET,
                   ratio[CPU] <= CPU_TARGET ? "met" : "NOT met", ratio[CPU]);
        if (ratio[SIM] > 0)
            printf("sim backend <= %.1fx PyTorch's step time: %s (%.2fx)\n", SIM_TARGET,
                   ratio[SIM] <= SIM_TARGET ? "met" : "NOT met", ratio[SIM]);
    }
    if (b.epochs > 0)
        compare_accuracy(&b, &train, &test, faster, has_torch);
    free(order);
    fmnist_free(&train);
    fmnist_free(&test);
    nt_shutdown();
    return 0;
}
