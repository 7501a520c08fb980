/* bench/ddp.c - data-parallel training of the main job's MLP (784-1024-1024-10,
 * ReLU, cross-entropy, AdamW) on simulated NeuronCores (docs/ddp.md):
 *
 * 1. Scaling (weak): cores 1, 2, 4, 8, 16, 32 of a trn1.32xlarge
 *    (NT_SIM_TOPOLOGY), a per-core batch that keeps TensorE busy (--batch,
 *    2048), global batch = per-core batch x cores, one shard per core.  A
 *    step's simulated time is how far the latest core clock moved (every
 *    core runs at once in simulated time; the gradient all-reduces are
 *    booked on the clocks), so throughput = samples per simulated second,
 *    collectives included.  Printed against the targets 2 cores >= 1.9x,
 *    8 >= 7x, 32 >= 24x one core.
 * 2. All-reduce: the simulated time of one nt_all_reduce (f32 SUM) of the
 *    MLP's whole gradient and of smaller tensors, on 2..32 cores, against
 *    the cost model's own closed formula (nt_collective_cost; target:
 *    within 10%).
 * 3. Bitwise: NT_SIM_CORES = 1, 2, 4, 8 (and, when mpirun exists and the
 *    library has MPI, 2 processes x 1, 2, 4 cores) train the same global
 *    batches (128 rows, 8 shards) for --bits-steps steps; the CRC-32 of the
 *    parameters must be the same in every run.
 * 4. Host wall time: bench/batch_split (next to this executable) run whole,
 *    B independent pieces on 2 simulated cores over 1 (target <= 0.6x).
 * 5. Captured (--capture runs this alone): the scaling's step op by op and
 *    captured with nt_graph_capture_begin_multi (docs/graphs.md, "Several
 *    devices") in the same child, on 1, 2, 4 and 8 cores: simulated ms and
 *    host ms a step, captured over op by op, and whether the parameters
 *    after the same steps are the same bits (they must be).
 *
 * nt_init reads NT_SIM_CORES, so every configuration runs in a child
 * process of this program (it re-executes itself with --child-*).
 *
 * Usage: ddp [--batch N] [--steps N] [--warmup N] [--max-cores N] [--bits-steps N]
 *            [--no-mpi] [--capture] */
#include <ntensor.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_NAME "bench/ddp"
#include "bench.h"

#define IN 784
#define HID 1024
#define OUT 10
#define NPARAMS 6
#define MAXDEV 64

/* ---------------- the model ---------------- */

static void init_params(nt_tensor **p)
{
    const int64_t shp[NPARAMS][2] = {{HID, IN}, {HID, 0}, {HID, HID}, {HID, 0}, {OUT, HID},
                                     {OUT, 0}};
    const double fan[NPARAMS] = {IN, IN, HID, HID, HID, HID};
    for (int i = 0; i < NPARAMS; i++)
        p[i] = bench_linear_param(shp[i][1] ? 2 : 1, shp[i], fan[i], (uint64_t)i + 1);
}

static nt_tensor *forward_loss(nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    nt_tensor *h1 = nt_relu(nt_linear(x, p[0], p[1]));
    nt_tensor *h2 = nt_relu(nt_linear(h1, p[2], p[3]));
    return nt_cross_entropy(nt_linear(h2, p[4], p[5]), y);
}

/* Synthetic batch: pixels in [0, 1), labels 0..9, from a seed. */
static void fill(float *x, int32_t *y, int rows, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < (size_t)rows * IN; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) / 16777216.0f;
    }
    for (int i = 0; i < rows; i++) {
        s = s * 1664525u + 1013904223u;
        y[i] = (int32_t)((s >> 16) % OUT);
    }
}

/* The data-parallel trainer over every local device. */
typedef struct trainer {
    int ndev, devs[MAXDEV], shards, batch;
    nt_tensor *p[NPARAMS];
    nt_ddp *d;
    nt_optim *opts[MAXDEV];
    float *xb;
    int32_t *yb;
} trainer;

static void trainer_init(trainer *t, int shards, int batch)
{
    memset(t, 0, sizeof *t);
    t->ndev = nt_device_count();
    for (int i = 0; i < t->ndev; i++)
        t->devs[i] = i;
    t->shards = shards;
    t->batch = batch;
    bench_check(nt_device_set(0), "nt_device_set");
    init_params(t->p);
    t->d = nt_ddp_create(t->p, NPARAMS, shards, t->devs, t->ndev);
    if (!t->d)
        bench_fail("nt_ddp_create");
    for (int i = 0; i < t->ndev; i++) {
        bench_check(nt_device_set(i), "nt_device_set");
        t->opts[i] = nt_optim_adamw(nt_ddp_params(t->d, i), NPARAMS, 1e-3, 0.9, 0.999, 1e-8,
                                    0.01);
        if (!t->opts[i])
            bench_fail("nt_optim_adamw");
    }
    t->xb = malloc(sizeof(float) * (size_t)batch * IN);
    t->yb = malloc(sizeof(int32_t) * (size_t)batch);
    if (!t->xb || !t->yb) {
        fprintf(stderr, "%s: out of memory\n", BENCH_NAME);
        exit(1);
    }
}

/* One step on global batch `seed`; fill: whether to make new host data. */
static void trainer_step(trainer *t, uint32_t seed, bool refill)
{
    if (refill)
        fill(t->xb, t->yb, t->batch, seed);
    const int64_t xs[2] = {t->batch, IN}, ys[1] = {t->batch};
    for (int s = 0; s < t->shards; s++) {
        int dev = nt_ddp_shard_device(t->d, s);
        if (dev < 0)
            continue;
        bench_check(nt_device_set(dev), "nt_device_set");
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_ddp_shard_from_host(t->d, s, t->xb, NT_F32, 2, xs);
        nt_tensor *y = nt_ddp_shard_from_host(t->d, s, t->yb, NT_I32, 1, ys);
        bench_check(nt_ddp_backward(t->d, s, forward_loss(nt_ddp_params(t->d, dev), x, y)),
                    "nt_ddp_backward");
        nt_scope_end(sc);
    }
    bench_check(nt_ddp_reduce(t->d), "nt_ddp_reduce");
    bench_check(nt_ddp_step(t->d, t->opts, t->ndev), "nt_ddp_step");
}

static void trainer_free(trainer *t)
{
    for (int i = 0; i < t->ndev; i++)
        nt_optim_destroy(t->opts[i]);
    nt_ddp_destroy(t->d);
    for (int i = 0; i < NPARAMS; i++)
        nt_release(t->p[i]);
    free(t->xb);
    free(t->yb);
}

/* TensorE's ideal time summed over the local cores (ns): the MFU's numerator. */
static double tensor_ideal(int ndev)
{
    double t = 0;
    for (int i = 0; i < ndev; i++) {
        nt_sim_stats st;
        bench_check(nt_device_stats_get(i, &st), "nt_device_stats_get");
        t += st.tensor_ideal_ns;
    }
    return t;
}

/* The latest simulated clock over the local cores (ns). */
static double max_clock(int ndev)
{
    double m = 0;
    for (int i = 0; i < ndev; i++) {
        nt_sim_stats st;
        bench_check(nt_device_stats_get(i, &st), "nt_device_stats_get");
        if (st.clock_ns > m)
            m = st.clock_ns;
    }
    return m;
}

/* ---------------- children ---------------- */

/* Weak scaling: one shard of `batch` rows per core. */
static int child_scale(int batch, int steps, int warmup)
{
    bench_check(nt_init(), "nt_init");
    trainer t;
    int ndev = nt_device_count();
    trainer_init(&t, ndev, batch * ndev);
    for (int i = 0; i < warmup; i++)
        trainer_step(&t, 1, i == 0);
    bench_check(nt_sync(), "nt_sync");
    double c0 = max_clock(ndev), w0 = bench_now_ns(), i0 = tensor_ideal(ndev);
    for (int i = 0; i < steps; i++)
        trainer_step(&t, 1, false); /* the same batch: the host's filling is not timed */
    bench_check(nt_sync(), "nt_sync");
    double c1 = max_clock(ndev), w1 = bench_now_ns(), i1 = tensor_ideal(ndev);
    printf("scale cores %d step_ns %.1f wall_ms %.1f mfu %.3f\n", ndev, (c1 - c0) / steps,
           (w1 - w0) * 1e-6 / steps, (i1 - i0) / (ndev * (c1 - c0)));
    trainer_free(&t);
    nt_shutdown();
    return 0;
}

static uint32_t params_crc(trainer *t)
{
    uint32_t crc = 0xFFFFFFFFu;
    for (int j = 0; j < NPARAMS; j++) {
        size_t nb = (size_t)nt_numel(t->p[j]) * 4;
        uint8_t *b = malloc(nb);
        if (!b)
            bench_fail("malloc");
        bench_check(nt_to_host(nt_ddp_params(t->d, 0)[j], b, nb), "nt_to_host");
        for (size_t i = 0; i < nb; i++) { /* CRC-32 (IEEE) */
            crc ^= b[i];
            for (int k = 0; k < 8; k++)
                crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
        }
        free(b);
    }
    return crc ^ 0xFFFFFFFFu;
}

/* The scaling's step op by op, then on a second trainer captured (its
 * first step) and replayed, the same batch every step. */
static int child_capture(int batch, int steps)
{
    bench_check(nt_init(), "nt_init");
    int ndev = nt_device_count();
    trainer e, c;
    trainer_init(&e, ndev, batch * ndev);
    trainer_init(&c, ndev, batch * ndev);
    trainer_step(&e, 1, true); /* AdamW's state made, as the capture makes it */
    bench_check(nt_sync(), "nt_sync");
    double c0 = max_clock(ndev), w0 = bench_now_ns();
    for (int i = 0; i < steps; i++)
        trainer_step(&e, 1, false);
    bench_check(nt_sync(), "nt_sync");
    double c1 = max_clock(ndev), w1 = bench_now_ns();
    fill(c.xb, c.yb, c.batch, 1);
    const int64_t xs[2] = {c.batch, IN}, ys[1] = {c.batch};
    nt_tensor *x[MAXDEV], *y[MAXDEV];
    for (int s = 0; s < c.shards; s++) {
        x[s] = nt_ddp_shard_from_host(c.d, s, c.xb, NT_F32, 2, xs);
        y[s] = nt_ddp_shard_from_host(c.d, s, c.yb, NT_I32, 1, ys);
    }
    bench_check(nt_sync(), "nt_sync");
    bench_check(nt_graph_capture_begin_multi(), "nt_graph_capture_begin_multi");
    for (int s = 0; s < c.shards; s++) {
        int dev = nt_ddp_shard_device(c.d, s);
        bench_check(nt_device_set(dev), "nt_device_set");
        nt_scope *sc = nt_scope_begin();
        bench_check(nt_ddp_backward(c.d, s, forward_loss(nt_ddp_params(c.d, dev), x[s], y[s])),
                    "nt_ddp_backward");
        nt_scope_end(sc);
    }
    bench_check(nt_ddp_reduce(c.d), "nt_ddp_reduce");
    bench_check(nt_ddp_step(c.d, c.opts, c.ndev), "nt_ddp_step");
    bench_check(nt_device_set(0), "nt_device_set");
    nt_graph *g = nt_graph_capture_end();
    if (!g)
        bench_fail("nt_graph_capture_end");
    bench_check(nt_sync(), "nt_sync");
    double c2 = max_clock(ndev), w2 = bench_now_ns();
    for (int i = 0; i < steps; i++)
        bench_check(nt_graph_replay(g), "nt_graph_replay");
    bench_check(nt_sync(), "nt_sync");
    double c3 = max_clock(ndev), w3 = bench_now_ns();
    uint32_t ce = params_crc(&e), cc = params_crc(&c);
    printf("capture cores %d eager_ns %.1f captured_ns %.1f eager_wall_ms %.1f "
           "captured_wall_ms %.1f same %d\n",
           ndev, (c1 - c0) / steps, (c3 - c2) / steps, (w1 - w0) * 1e-6 / steps,
           (w3 - w2) * 1e-6 / steps, ce == cc);
    nt_graph_destroy(g);
    for (int s = 0; s < c.shards; s++) {
        nt_release(x[s]);
        nt_release(y[s]);
    }
    trainer_free(&e);
    trainer_free(&c);
    nt_shutdown();
    return 0;
}

/* One all-reduce of `floats` f32 per core, timed on the cores' clocks. */
static int child_allreduce(void)
{
    bench_check(nt_init(), "nt_init");
    int ndev = nt_device_count(), devs[MAXDEV];
    for (int i = 0; i < ndev; i++)
        devs[i] = i;
    nt_comm *c = nt_comm_create(devs, ndev);
    if (!c)
        bench_fail("nt_comm_create");
    const int64_t sizes[] = {(int64_t)HID * IN + HID + HID * HID + HID + OUT * HID + OUT,
                             1 << 18, 1 << 14};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        nt_tensor *in[MAXDEV], *out[MAXDEV];
        for (int i = 0; i < ndev; i++) {
            bench_check(nt_device_set(i), "nt_device_set");
            /* made by a kernel: ready at its core's clock */
            in[i] = nt_add_scalar(nt_zeros(NT_F32, 1, &sizes[k]), 1.0);
            if (!in[i])
                bench_fail("input");
            nt_keep(in[i]);
        }
        /* The collective moves no core's clock: its outputs become ready
         * when the transfer ends, and the next kernel that reads one starts
         * then.  So a one-element kernel reads each output, and its own
         * duration (measured on a ready input) comes off. */
        bench_check(nt_sync(), "nt_sync");
        double k0 = max_clock(ndev);
        for (int i = 0; i < ndev; i++) {
            bench_check(nt_device_set(i), "nt_device_set");
            nt_release(nt_add_scalar(nt_slice(in[i], 0, 0, 1, 1), 0.0));
        }
        bench_check(nt_sync(), "nt_sync");
        double kernel = max_clock(ndev) - k0;
        double c0 = k0; /* when the last input was ready: where the collective starts */
        bench_check(nt_all_reduce(c, in, out, NT_REDUCE_SUM), "nt_all_reduce");
        for (int i = 0; i < ndev; i++) {
            bench_check(nt_device_set(i), "nt_device_set");
            nt_release(nt_add_scalar(nt_slice(out[i], 0, 0, 1, 1), 0.0));
        }
        bench_check(nt_sync(), "nt_sync");
        double c1 = max_clock(ndev) - kernel;
        double formula = 0, schedule = 0;
        bench_check(nt_collective_cost(NT_COLL_ALL_REDUCE, ndev, (double)sizes[k] * 4, &formula,
                                       &schedule),
                    "nt_collective_cost");
        printf("allreduce cores %d bytes %lld sim_ns %.1f formula_ns %.1f\n", ndev,
               (long long)sizes[k] * 4, c1 - c0, formula);
        for (int i = 0; i < ndev; i++) {
            nt_release(in[i]);
            nt_release(out[i]);
        }
    }
    nt_comm_destroy(c);
    nt_shutdown();
    return 0;
}

/* The same global batches (128 rows, 8 shards) at any core count. */
static int child_bits(int steps)
{
    bench_check(nt_init(), "nt_init");
    trainer t;
    trainer_init(&t, 8, 128);
    for (int i = 0; i < steps; i++)
        trainer_step(&t, (uint32_t)i + 7, true);
    bench_check(nt_sync(), "nt_sync");
    uint32_t crc = 0xFFFFFFFFu;
    for (int j = 0; j < NPARAMS; j++) {
        size_t nb = (size_t)nt_numel(t.p[j]) * 4;
        uint8_t *b = malloc(nb);
        bench_check(nt_to_host(nt_ddp_params(t.d, 0)[j], b, nb), "nt_to_host");
        for (size_t i = 0; i < nb; i++) { /* CRC-32 (IEEE) */
            crc ^= b[i];
            for (int k = 0; k < 8; k++)
                crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
        }
        free(b);
    }
    if (nt_process_rank() <= 0)
        printf("bits cores %d procs %d crc %08x\n", t.ndev,
               nt_process_count() > 1 ? nt_process_count() : 1, crc ^ 0xFFFFFFFFu);
    trainer_free(&t);
    nt_shutdown();
    return 0;
}

/* ---------------- the parent ---------------- */

/* Runs `argv` (argv[0] a path) with NAME=VALUE strings added to the
 * environment; its whole output goes into out (cap bytes, NUL-terminated).
 * True when it exited with 0. */
static bool run_child(char *const *argv, const char *const *env, char *out, size_t cap)
{
    int st = bench_run_child(argv, env, out, cap);
    return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* run_child; the first line of its output that starts with `tag` goes
 * into line.  True when it exited with 0 and printed such a line. */
static bool run(char *const *argv, const char *const *env, const char *tag, char *line,
                size_t cap)
{
    static char buf[1 << 16];
    bool ok = run_child(argv, env, buf, sizeof buf);
    line[0] = '\0';
    for (char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, tag, strlen(tag))) {
            size_t k = strcspn(l, "\n");
            if (k >= cap)
                k = cap - 1;
            memcpy(line, l, k);
            line[k] = '\0';
            break;
        }
    return ok && line[0];
}

static long arg_long(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return strtol(argv[i + 1], NULL, 10);
    return def;
}

static bool has_flag(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name))
            return true;
    return false;
}

int main(int argc, char **argv)
{
    int batch = (int)arg_long(argc, argv, "--batch", 2048);
    int steps = (int)arg_long(argc, argv, "--steps", 2);
    int warmup = (int)arg_long(argc, argv, "--warmup", 1);
    int max_cores = (int)arg_long(argc, argv, "--max-cores", 32);
    int bits_steps = (int)arg_long(argc, argv, "--bits-steps", 5);
    if (has_flag(argc, argv, "--child-scale"))
        return child_scale(batch, steps, warmup);
    if (has_flag(argc, argv, "--child-allreduce"))
        return child_allreduce();
    if (has_flag(argc, argv, "--child-bits"))
        return child_bits(bits_steps);
    if (has_flag(argc, argv, "--child-capture"))
        return child_capture(batch, steps);
    if (batch < 1 || steps < 1 || warmup < 0 || max_cores < 1 || max_cores > 32 ||
        bits_steps < 1) {
        fprintf(stderr, "usage: ddp [--batch N] [--steps N] [--warmup N] [--max-cores 1..32] "
                        "[--bits-steps N] [--no-mpi]\n");
        return 2;
    }
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) {
        fprintf(stderr, "%s: cannot find its own executable\n", BENCH_NAME);
        return 1;
    }
    self[k] = '\0';
    char sbatch[32], ssteps[32], swarm[32], sbits[32], cores_env[32];
    snprintf(sbatch, sizeof sbatch, "%d", batch);
    snprintf(ssteps, sizeof ssteps, "%d", steps);
    snprintf(swarm, sizeof swarm, "%d", warmup);
    snprintf(sbits, sizeof sbits, "%d", bits_steps);
    const char *topo = "NT_SIM_TOPOLOGY=trn1.32xlarge";
    char line[512];
    int fails = 0;

    if (has_flag(argc, argv, "--capture")) {
        /* 5. captured against op by op, in the same child */
        printf("%s: the scaling's step (784-%d-%d-10 MLP, AdamW, %d samples per core) op by "
               "op and captured (nt_graph_capture_begin_multi), trn1.32xlarge, mean of %d "
               "steps\n", BENCH_NAME, HID, HID, batch, steps);
        printf("  cores  sim ms op by op  captured  ratio   host ms op by op  captured  ratio  "
               "same bits\n");
        for (int c = 1; c <= max_cores && c <= 8; c *= 2) {
            snprintf(cores_env, sizeof cores_env, "NT_SIM_CORES=%d", c);
            const char *env[] = {cores_env, topo, NULL};
            char *av[] = {self, "--child-capture", "--batch", sbatch, "--steps", ssteps, NULL};
            int nc, same;
            double en, cn, ew, cw;
            if (!run(av, env, "capture", line, sizeof line) ||
                sscanf(line, "capture cores %d eager_ns %lf captured_ns %lf eager_wall_ms %lf "
                             "captured_wall_ms %lf same %d",
                       &nc, &en, &cn, &ew, &cw, &same) != 6) {
                printf("  %5d  failed: %s\n", c, line);
                fails++;
                continue;
            }
            printf("  %5d  %15.3f  %8.3f  %5.2fx  %16.1f  %8.1f  %5.2fx  %s\n", c, en * 1e-6,
                   cn * 1e-6, cn / en, ew, cw, cw / ew, same ? "yes" : "NO");
            fails += !same;
            fflush(stdout);
        }
        return fails ? 1 : 0;
    }

    /* 1. scaling */
    printf("%s: weak scaling of the 784-%d-%d-10 MLP, AdamW, %d samples per core per step, "
           "trn1.32xlarge (simulated; collectives included)\n", BENCH_NAME, HID, HID, batch);
    printf("  cores  global batch  sim ms/step  samples/sim s   vs 1 core  target       MFU  "
           "host ms/step\n");
    double base = 0;
    for (int c = 1; c <= max_cores; c *= 2) {
        snprintf(cores_env, sizeof cores_env, "NT_SIM_CORES=%d", c);
        const char *env[] = {cores_env, topo, NULL};
        char *av[] = {self, "--child-scale", "--batch", sbatch, "--steps", ssteps, "--warmup",
                      swarm, NULL};
        if (!run(av, env, "scale", line, sizeof line)) {
            printf("  %5d  failed\n", c);
            fails++;
            continue;
        }
        int nc;
        double ns, wall, mfu;
        if (sscanf(line, "scale cores %d step_ns %lf wall_ms %lf mfu %lf", &nc, &ns, &wall,
                   &mfu) != 4) {
            printf("  %5d  unreadable: %s\n", c, line);
            fails++;
            continue;
        }
        double thr = (double)batch * c / (ns * 1e-9);
        if (c == 1)
            base = thr;
        double ratio = base > 0 ? thr / base : 0, target = c == 2 ? 1.9 : c == 8 ? 7 : c == 32 ? 24 : 0;
        char tg[32] = "";
        if (target > 0) {
            snprintf(tg, sizeof tg, ">= %.1fx %s", target, ratio >= target ? "ok" : "MISS");
            fails += ratio < target;
        }
        printf("  %5d  %12d  %11.3f  %13.0f  %9.2fx  %-12s %4.0f%%  %8.0f\n", c, batch * c,
               ns * 1e-6, thr, ratio, tg, 100 * mfu, wall);
        fflush(stdout);
    }

    /* 2. all-reduce against the formula */
    printf("\n%s: simulated nt_all_reduce (f32 SUM) vs the cost model's formula "
           "(trn1.32xlarge; target within 10%%)\n", BENCH_NAME);
    printf("  cores        bytes    sim us  formula us   sim/formula\n");
    for (int c = 2; c <= max_cores; c *= 2) {
        snprintf(cores_env, sizeof cores_env, "NT_SIM_CORES=%d", c);
        const char *env[] = {cores_env, topo, NULL};
        char *av[] = {self, "--child-allreduce", NULL};
        static char out[1 << 14];
        bool ran = run_child(av, env, out, sizeof out); /* every line of the child */
        int rows = 0;
        for (char *l = strstr(out, "allreduce"); l; l = strstr(l + 1, "\nallreduce")) {
            if (*l == '\n')
                l++;
            int nc;
            long long bytes;
            double sim, formula;
            if (sscanf(l, "allreduce cores %d bytes %lld sim_ns %lf formula_ns %lf", &nc, &bytes,
                       &sim, &formula) != 4)
                break;
            double q = formula > 0 ? sim / formula : 0;
            bool ok = q >= 0.9 && q <= 1.1;
            printf("  %5d  %11lld  %8.1f  %10.1f   %6.3f %s\n", nc, bytes, sim * 1e-3,
                   formula * 1e-3, q, ok ? "ok" : "MISS");
            fails += !ok;
            rows++;
        }
        if (!rows || !ran) {
            printf("  %5d  failed\n", c);
            fails++;
        }
    }

    /* 3. bitwise */
    printf("\n%s: parameters after %d AdamW steps of global batch 128 in 8 shards "
           "(crc32; must be equal)\n", BENCH_NAME, bits_steps);
    printf("  processes  cores each  crc32\n");
    unsigned first = 0;
    bool have = false, same = true;
    for (int procs = 1; procs <= 2; procs++)
        for (int c = 1; c <= 8; c *= 2) {
            if (procs == 2 && (c > 4 || has_flag(argc, argv, "--no-mpi")))
                continue;
            snprintf(cores_env, sizeof cores_env, "NT_SIM_CORES=%d", c);
            const char *env[] = {cores_env, NULL};
            char *av1[] = {self, "--child-bits", "--bits-steps", sbits, NULL};
            char *av2[] = {"mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", self,
                           "--child-bits", "--bits-steps", sbits, NULL};
            if (!run(procs == 1 ? av1 : av2, env, "bits", line, sizeof line)) {
                printf("  %9d  %10d  %s\n", procs, c,
                       procs == 2 ? "not run (no mpirun, or the library has no MPI)" : "failed");
                fails += procs == 1;
                continue;
            }
            int nc, np;
            unsigned crc;
            if (sscanf(line, "bits cores %d procs %d crc %x", &nc, &np, &crc) != 3 ||
                np != procs) {
                printf("  %9d  %10d  %s\n", procs, c,
                       procs == 2 ? "not run (the library has no MPI)" : line);
                fails += procs == 1;
                continue;
            }
            if (!have)
                first = crc, have = true;
            same &= crc == first;
            printf("  %9d  %10d  %08x %s\n", procs, c, crc, crc == first ? "" : "DIFFERS");
        }
    printf("  bit-identical: %s\n", have && same ? "yes" : "NO");
    fails += !(have && same);

    /* 4. the host wall time of batch-split work: bench/batch_split, beside
     * this executable, run whole (its own table and target line) */
    printf("\n%s: host wall time of batch-split work, 2 simulated cores over 1 "
           "(bench/batch_split)\n", BENCH_NAME);
    char split[4096 + 16];
    char *slash = strrchr(self, '/');
    snprintf(split, sizeof split, "%.*sbatch_split", slash ? (int)(slash - self + 1) : 0, self);
    char *avs[] = {split, NULL};
    const char *envs[] = {NULL};
    static char sout[1 << 14];
    if (run_child(avs, envs, sout, sizeof sout)) {
        fputs(sout, stdout);
    } else {
        printf("  failed (%s)\n", split);
        fails++;
    }
    return fails ? 1 : 0;
}
