/* bench/gpt_step.c - the character GPT of examples/char_gpt.c against its
 * PyTorch peer (bench/peer/char_gpt.py), in one run.
 *
 * Trains the default model (examples/gpt_model.h: 4 layers, 4 heads, width
 * 128, context 128, batch 16) for --steps steps from the same seed on the
 * simulated NeuronCore (the default backend), on the CPU backend, with
 * --amp bf16 on the simulator, and in PyTorch 1.13 eager fp32 at 1 and at 2
 * threads (when /usr/bin/python3 imports torch; else it says so), and
 * prints for each the wall time per step, its ratio to PyTorch's faster
 * thread count, the simulated NeuronCore time per step and MFU, and the
 * validation loss after the last step with its difference from PyTorch's.
 * The peer runs at its best (bench/peer/peer_env.py) and its first line
 * says which OpenBLAS core and vector level it ran.
 *
 * Targets: sim <= 1.0x PyTorch eager fp32's step time, CPU backend <= 0.7x;
 * validation loss within 0.05 nats of PyTorch's after the default steps.
 * A step's time is the wall time of all steps (batch, forward, backward,
 * clipping, AdamW) over their count, evaluations excluded, in both.  With
 * --rounds N every configuration runs N times in turn and each ratio is the
 * median of its rounds' (a neighbour's load on a shared machine then hits
 * both sides of a round alike).  docs/sim.md section 11 has the latest
 * figures and the CPU that measured them.  What bounds the cpu step: the
 * GEMMs (matmuls and their backward, fused matmul epilogues: about 45% of a
 * step, core/gemm.c), then attention (about 18%, mostly its small products)
 * and memory-bound elementwise passes.
 *
 * Every --eval-every steps each run prints an "eval step=N train=X val=Y"
 * line (the mean training loss since the last one, the loss on fixed
 * validation batches); --curves DIR also writes each run's lines (the last
 * round's) to DIR/peer-1t.log, DIR/peer-2t.log, DIR/sim.log ... for
 * bench/peer/plot_loss.py.
 *
 * simcap and cpucap (not in the default --configs) train the same way with
 * the step captured once and replayed (char_gpt --capture), and print
 * captured / op-by-op wall time per step next to the other ratios.  fp8
 * (not in the default --configs either) trains on the simulator under fp8
 * autocast with delayed scaling (char_gpt --amp fp8, docs/amp.md) and,
 * with bf16, prints fp8 / bf16 simulated time and the val loss difference
 * (run it with NT_SIM_TARGET=trn2, where fp8 runs at twice bf16's rate).
 *
 * gpt2, gpt2cap, gpt2bf16, gpt2bf16cap (not in the default --configs
 * either) train a GPT-2-small-shaped model (run_gpt2 below) and print a
 * row per target: simulated ms, MFU, TensorE busy, kernels, HBM bytes.
 *
 * Usage: gpt_step [--steps N] [--configs peer,sim,cpu,bf16,simcap,cpucap,fp8] [--rounds N]
 *                 [--peer PATH] [--python PATH] [--eval-every N]
 *                 [--eval-batches N] [--curves DIR] [--data DIR]
 *                 [--gpt2-layers N] [--gpt2-steps N] [--targets trn1,trn2] */
#include <math.h>
#include <ntensor.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench/gpt_step"
#include "bench.h"
#include "examples/gpt_model.h"

#ifndef GPT_PEER_SCRIPT
#define GPT_PEER_SCRIPT "bench/peer/char_gpt.py"
#endif

#define STEPS 300 /* examples/char_gpt.c's default */
#define SIM_TARGET 1.0
#define CPU_TARGET 0.7
#define LOSS_TARGET 0.05

typedef struct {
    char name[16]; /* also its --curves log's name */
    bool ran;
    double ms, sim_ms, mfu, val;
    double cpu_ms; /* CPU time a step, every thread of the process (ours only) */
} result;

static const char *curves_dir; /* --curves DIR: each run's eval lines in DIR/NAME.log */

static FILE *curves_open(const char *name)
{
    if (!curves_dir)
        return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.log", curves_dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "gpt_step: cannot write '%s'\n", path);
    return f;
}

/* Trains on `backend` (amp: NT_BF16 or NT_DTYPE_COUNT; fp8: fp8 autocast
 * with a default recipe instead) and fills r;
 * captured: the first step recorded as a program (docs/graphs.md) and
 * replayed for the others with each step's batch bound, as char_gpt
 * --capture does. */
static void run_ours(const char *backend, nt_dtype amp, bool fp8, bool captured,
                     const gpt_data *d, int steps, int eval_every, int eval_batches, result *r)
{
    bench_check(nt_config_set("NT_BACKEND", backend), "nt_config_set NT_BACKEND");
    nt_fp8_recipe *recipe = fp8 ? nt_fp8_recipe_create(NULL) : NULL;
    if (fp8 && !recipe)
        bench_fail("nt_fp8_recipe_create");
    gpt_config c = {.n_layer = 4, .n_head = 4, .width = 128, .context = 128,
                    .vocab = d->vocab};
    gpt_train_opts o = {.batch = 16, .lr = 2e-3, .clip = 1.0, .steps = steps,
                        .warmup = steps / 10, .amp = amp, .fp8 = recipe, .seed = 1};
    gpt_model m;
    bench_check(gpt_init(&m, &c, 1), "gpt_init");
    nt_optim *opt = gpt_optimizer(&m, &o, 0.1);
    if (!opt)
        bench_fail("gpt_optimizer");
    int32_t *xb = malloc(sizeof *xb * 16 * 128), *yb = malloc(sizeof *yb * 16 * 128);
    nt_tensor *sum = nt_zeros(NT_F32, 0, NULL);
    bench_check(nt_sync(), "nt_sync");
    FILE *log = curves_open(r->name);
    nt_sim_stats s0, s1, e0, e1;
    nt_sim_stats_get(&s0);
    double t0 = bench_now_ns(), train_ns = 0, eval_sim_ns = 0, eval_ideal_ns = 0, total = 0;
    double c0 = bench_cpu_ns(), cpu_ns = 0;
    int since = 0;
    gpt_capture cap = {0}; /* captured: step 1 recorded, replayed after */
    for (int s = 0; s < steps; s++) {
        nt_tensor *loss = captured ? gpt_captured_step(&m, opt, d, &o, s, xb, yb, &cap)
                                   : gpt_train_step(&m, opt, d, &o, s, xb, yb);
        if (!loss)
            bench_fail("training step");
        nt_no_grad_begin();
        bench_check(nt_add_inplace(sum, loss), "summing the loss");
        nt_no_grad_end();
        nt_release(loss);
        since++;
        if ((s + 1) % eval_every == 0 || s + 1 == steps) {
            /* the evaluation's wall and simulated time are not a step's */
            double l;
            bench_check(nt_item(sum, &l), "reading the loss");
            bench_check(nt_fill_inplace(sum, 0), "resetting the loss sum");
            double t1 = bench_now_ns();
            train_ns += t1 - t0;
            cpu_ns += bench_cpu_ns() - c0;
            total += l;
            nt_sim_stats_get(&e0);
            r->val = gpt_eval_fp8(&m, d, 16, eval_batches, amp, recipe);
            nt_sim_stats_get(&e1);
            eval_sim_ns += e1.sim_ns - e0.sim_ns;
            eval_ideal_ns += e1.tensor_ideal_ns - e0.tensor_ideal_ns;
            char line[256];
            snprintf(line, sizeof line, "eval step=%d train=%.4f val=%.4f ms_per_step=%.1f\n",
                     s + 1, l / since, r->val, (t1 - t0) * 1e-6 / since);
            printf("  %s: %s", r->name, line);
            fflush(stdout);
            if (log)
                fputs(line, log);
            since = 0;
            t0 = bench_now_ns();
            c0 = bench_cpu_ns();
        }
    }
    if (log)
        fclose(log);
    r->ms = train_ns * 1e-6 / steps;
    r->cpu_ms = cpu_ns * 1e-6 / steps;
    nt_sim_stats_get(&s1);
    double sim_ns = s1.sim_ns - s0.sim_ns - eval_sim_ns;
    r->sim_ms = sim_ns * 1e-6 / steps;
    r->mfu = sim_ns > 0 ? (s1.tensor_ideal_ns - s0.tensor_ideal_ns - eval_ideal_ns) / sim_ns : 0;
    r->ran = true;
    printf("  %-5s %8.1f ms/step (CPU time %.1f ms)", r->name, r->ms, r->cpu_ms);
    if (sim_ns > 0)
        printf("  NeuronCore (simulated) %.2f ms/step, MFU %.1f%%", r->sim_ms, 100 * r->mfu);
    printf("  train loss (mean) %.4f  val loss %.4f\n", total / steps, r->val);
    fflush(stdout);
    nt_release(sum);
    gpt_capture_free(&cap);
    gpt_optimizer_free(opt, &o);
    nt_fp8_recipe_destroy(recipe);
    gpt_free(&m);
    free(xb);
    free(yb);
}

/* ---------------- the GPT-2-small-shaped block ---------------- */

/* gpt2, gpt2cap, gpt2bf16, gpt2bf16cap (not in the default --configs): the
 * model of examples/gpt_model.h at GPT-2 small's shape -- width 768, 12
 * heads, context 1024, batch 4 -- with --gpt2-layers blocks (default 2) and
 * the data's character vocabulary (so the blocks, not the head, are the
 * step), trained --gpt2-steps steps (default 3) of AdamW with clipping on
 * the simulator, op by op or captured, f32 or bf16 autocast, once per
 * target of --targets (trn1,trn2: nt_sim_set_target).  The first step
 * (AdamW's moments made; captured: the capture) is not counted; each row
 * gives per later step the simulated ms, MFU (of the peak for the dtypes
 * used), TensorE's busy share, kernels, HBM bytes read + written and the
 * host's wall time, and the train loss of the last step (the same bits
 * captured and op by op). */
typedef struct {
    double sim_ms, mfu, tensor_util, kernels, hbm_mib, host_s, loss;
} gpt2_row;

static void run_gpt2(int layers, nt_dtype amp, bool captured, nt_sim_target target,
                     const gpt_data *d, int steps, gpt2_row *row)
{
    bench_check(nt_config_set("NT_BACKEND", "sim"), "nt_config_set NT_BACKEND");
    bench_check(nt_sync(), "nt_sync");
    bench_check(nt_sim_set_target(target), "nt_sim_set_target");
    enum { B = 4, T = 1024 };
    gpt_config c = {.n_layer = layers, .n_head = 12, .width = 768, .context = T,
                    .vocab = d->vocab};
    gpt_train_opts o = {.batch = B, .lr = 6e-4, .clip = 1.0, .steps = steps, .warmup = 0,
                        .amp = amp, .seed = 1};
    gpt_model m;
    bench_check(gpt_init(&m, &c, 1), "gpt_init");
    nt_optim *opt = gpt_optimizer(&m, &o, 0.1);
    if (!opt)
        bench_fail("gpt_optimizer");
    int32_t *xb = malloc(sizeof *xb * B * T), *yb = malloc(sizeof *yb * B * T);
    gpt_capture cap = {0};
    nt_sim_stats s0, s1;
    double t0 = 0;
    for (int s = 0; s < steps; s++) {
        if (s == 1) { /* the first step made the moments (and the capture) */
            bench_check(nt_sync(), "nt_sync");
            nt_sim_stats_get(&s0);
            t0 = bench_now_ns();
        }
        nt_tensor *loss = captured ? gpt_captured_step(&m, opt, d, &o, s, xb, yb, &cap)
                                   : gpt_train_step(&m, opt, d, &o, s, xb, yb);
        if (!loss)
            bench_fail("training step");
        if (s + 1 == steps)
            bench_check(nt_item(loss, &row->loss), "reading the loss");
        nt_release(loss);
    }
    bench_check(nt_sync(), "nt_sync");
    nt_sim_stats_get(&s1);
    int n = steps - 1;
    double sim_ns = s1.sim_ns - s0.sim_ns;
    row->sim_ms = sim_ns * 1e-6 / n;
    row->mfu = sim_ns > 0 ? (s1.tensor_ideal_ns - s0.tensor_ideal_ns) / sim_ns : 0;
    row->tensor_util =
        sim_ns > 0 ? (s1.busy_ns[NT_ENGINE_TENSOR] - s0.busy_ns[NT_ENGINE_TENSOR]) / sim_ns : 0;
    row->kernels = (double)(s1.kernels - s0.kernels) / n;
    row->hbm_mib = (double)(s1.hbm_read_bytes - s0.hbm_read_bytes + s1.hbm_write_bytes -
                            s0.hbm_write_bytes) /
                   (1024.0 * 1024.0) / n;
    row->host_s = (bench_now_ns() - t0) * 1e-9 / n;
    gpt_capture_free(&cap);
    gpt_optimizer_free(opt, &o);
    gpt_free(&m);
    free(xb);
    free(yb);
}

/* Runs config `name` (gpt2, gpt2cap, gpt2bf16, gpt2bf16cap) on every
 * target of `targets` and prints its rows; false for another name. */
static bool gpt2_configs(const char *name, const char *targets, int layers, int steps,
                         const gpt_data *d)
{
    bool cap = strstr(name, "cap") != NULL, bf16 = strstr(name, "bf16") != NULL;
    if (strncmp(name, "gpt2", 4) || strlen(name) != (size_t)(4 + (cap ? 3 : 0) + (bf16 ? 4 : 0)))
        return false;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", targets);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        nt_sim_target tg = !strcmp(t, "trn2") ? NT_SIM_TRN2 : NT_SIM_TRN1;
        gpt2_row r;
        run_gpt2(layers, bf16 ? NT_BF16 : NT_DTYPE_COUNT, cap, tg, d, steps, &r);
        printf("| GPT-2-small block x%d, %s, %s, %s | %s | %.2f | %.1f%% | %.1f%% | %.0f | "
               "%.0f MiB | %.1f s | %.6f |\n",
               layers, bf16 ? "bf16" : "f32", cap ? "captured" : "eager",
               nt_config_get("NT_MODE"), tg == NT_SIM_TRN2 ? "trn2" : "trn1", r.sim_ms,
               100 * r.mfu, 100 * r.tensor_util, r.kernels, r.hbm_mib, r.host_s, r.loss);
        fflush(stdout);
    }
    nt_sim_set_target(NT_SIM_TRN1);
    return true;
}

/* The peer's output as it arrives: eval lines to the curve log, the
 * "final" line into the result. */
typedef struct {
    result *r;
    FILE *log;
} peer_out;

static void peer_line(const char *line, void *arg)
{
    peer_out *o = arg;
    if (o->log && !strncmp(line, "eval ", 5))
        fputs(line, o->log);
    double v, ms;
    if (sscanf(line, "final val=%lf ms_per_step=%lf", &v, &ms) == 2) {
        o->r->val = v;
        o->r->ms = ms;
        o->r->ran = true;
    }
    printf("  peer: %s", line);
}

/* Runs the peer at `threads` threads, echoing its eval lines; fills r from
 * its "final" line. */
static void run_peer(const char *python, const char *script, const char *data, int steps,
                     int threads, int eval_every, int eval_batches, result *r)
{
    r->ran = false;
    if (!bench_python_has_torch(python)) {
        printf("  %s skipped: %s cannot import torch (Debian: python3-torch; sh "
               "scripts/deps.sh --bench)\n",
               r->name, python);
        return;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' '%s' --steps %d --warmup %d --threads %d --eval-every %d --eval-batches %d "
             "--data '%s'",
             python, script, steps, steps / 10, threads, eval_every, eval_batches, data);
    peer_out o = {r, curves_open(r->name)};
    int st = bench_peer_lines(cmd, peer_line, &o);
    if (o.log)
        fclose(o.log);
    if (st != 0 || !r->ran) {
        printf("  %s failed (exit status %d)\n", r->name, st);
        r->ran = false;
        return;
    }
    printf("  %-7s %8.1f ms/step  val loss %.4f\n", r->name, r->ms, r->val);
    fflush(stdout);
}

#define MAX_ROUNDS 16

int main(int argc, char **argv)
{
    int steps = STEPS, eval_batches = 8, eval_every = 50, rounds = 1, gpt2_layers = 2,
        gpt2_steps = 3;
    const char *targets = "trn1,trn2";
    const char *configs = "peer,sim,cpu,bf16", *peer = GPT_PEER_SCRIPT,
               *python = "/usr/bin/python3", *data = GPT_DATA_DIR;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--steps") && v)
            steps = atoi(v);
        else if (!strcmp(argv[i], "--eval-every") && v)
            eval_every = atoi(v);
        else if (!strcmp(argv[i], "--curves") && v)
            curves_dir = v;
        else if (!strcmp(argv[i], "--eval-batches") && v)
            eval_batches = atoi(v);
        else if (!strcmp(argv[i], "--configs") && v)
            configs = v;
        else if (!strcmp(argv[i], "--rounds") && v)
            rounds = atoi(v);
        else if (!strcmp(argv[i], "--peer") && v)
            peer = v;
        else if (!strcmp(argv[i], "--python") && v)
            python = v;
        else if (!strcmp(argv[i], "--data") && v)
            data = v;
        else if (!strcmp(argv[i], "--gpt2-layers") && v)
            gpt2_layers = atoi(v);
        else if (!strcmp(argv[i], "--gpt2-steps") && v)
            gpt2_steps = atoi(v);
        else if (!strcmp(argv[i], "--targets") && v)
            targets = v;
        else {
            fprintf(stderr, "usage: gpt_step [--steps N] [--configs sim,cpu,bf16,simcap,cpucap,fp8,peer] "
                            "[--rounds N] [--peer PATH] [--python PATH] [--eval-every N] "
                            "[--eval-batches N] [--curves DIR] [--data DIR] [--gpt2-layers N] "
                            "[--gpt2-steps N] [--targets trn1,trn2]\n");
            return 1;
        }
        i++;
    }
    if (gpt2_layers < 1 || gpt2_layers > 12 || gpt2_steps < 2) {
        fprintf(stderr, "gpt_step: --gpt2-layers 1 to 12, --gpt2-steps >= 2\n");
        return 1;
    }
    if (steps < 1 || eval_batches < 1 || eval_every < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "gpt_step: --steps, --eval-every and --eval-batches must be >= 1, "
                        "--rounds 1 to %d\n",
                MAX_ROUNDS);
        return 1;
    }
    if (strlen(python) > 1000 || strchr(python, '\'') || strlen(peer) > 1000 ||
        strchr(peer, '\'') || strlen(data) > 1000 || strchr(data, '\'')) {
        fprintf(stderr, "gpt_step: --python, --peer and --data must be paths of at most 1000 "
                        "characters without a quote\n");
        return 1;
    }
    gpt_data d;
    if (gpt_data_load(&d, data) != 0)
        return 1;
    if (nt_init() != 0)
        bench_fail("nt_init");
    printf("bench/gpt_step: character GPT (4 layers, 4 heads, width 128, context 128, batch "
           "16), %d steps of AdamW from seed 1 on %lld characters of %s; mode %s; %d round(s)\n",
           steps, (long long)d.n, data, nt_config_get("NT_MODE"), rounds);
    /* the peer at 1 and at 2 threads; PEER is the faster of the two, per round */
    enum { PEER1, PEER2, SIM, CPU, BF16, SIMCAP, CPUCAP, FP8, NCFG, PEER = NCFG };
    result r[NCFG] = {{.name = "peer-1t"}, {.name = "peer-2t"}, {.name = "sim"},
                      {.name = "cpu"},     {.name = "bf16"},    {.name = "sim-cap"},
                      {.name = "cpu-cap"}, {.name = "fp8"}};
    double ms[NCFG + 1][MAX_ROUNDS], cpu[NCFG + 1][MAX_ROUNDS];
    bool ran[NCFG] = {false}, all[NCFG]; /* ran in some round; in every round */
    for (int i = 0; i < NCFG; i++)
        all[i] = true;
    bool gpt2_head = false;
    for (int k = 0; k < rounds; k++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", configs);
        if (rounds > 1)
            printf("round %d of %d\n", k + 1, rounds);
        for (char *save = NULL, *c = strtok_r(buf, ",", &save); c;
             c = strtok_r(NULL, ",", &save)) {
            if (!strcmp(c, "peer")) {
                run_peer(python, peer, data, steps, 1, eval_every, eval_batches, &r[PEER1]);
                run_peer(python, peer, data, steps, 2, eval_every, eval_batches, &r[PEER2]);
            } else if (!strcmp(c, "sim"))
                run_ours("sim", NT_DTYPE_COUNT, false, false, &d, steps, eval_every, eval_batches,
                         &r[SIM]);
            else if (!strcmp(c, "cpu"))
                run_ours("cpu", NT_DTYPE_COUNT, false, false, &d, steps, eval_every, eval_batches,
                         &r[CPU]);
            else if (!strcmp(c, "bf16"))
                run_ours("sim", NT_BF16, false, false, &d, steps, eval_every, eval_batches, &r[BF16]);
            else if (!strcmp(c, "simcap"))
                run_ours("sim", NT_DTYPE_COUNT, false, true, &d, steps, eval_every, eval_batches,
                         &r[SIMCAP]);
            else if (!strcmp(c, "fp8"))
                run_ours("sim", NT_DTYPE_COUNT, true, false, &d, steps, eval_every,
                         eval_batches, &r[FP8]);
            else if (!strcmp(c, "cpucap"))
                run_ours("cpu", NT_DTYPE_COUNT, false, true, &d, steps, eval_every, eval_batches,
                         &r[CPUCAP]);
            else if (!strncmp(c, "gpt2", 4)) {
                if (!gpt2_head) /* the GPT-2-small rows' header, once */
                    printf("\n| GPT-2-small-shaped step | target | simulated ms/step | MFU | "
                           "TensorE busy | kernels/step | HBM/step | host/step | loss |\n"
                           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
                gpt2_head = true;
                if (!gpt2_configs(c, targets, gpt2_layers, gpt2_steps, &d)) {
                    fprintf(stderr, "gpt_step: unknown config '%s'\n", c);
                    return 1;
                }
            } else {
                fprintf(stderr, "gpt_step: unknown config '%s' (sim, cpu, bf16, simcap, cpucap, fp8, "
                                "peer)\n",
                        c);
                return 1;
            }
        }
        for (int i = 0; i < NCFG; i++) {
            ms[i][k] = r[i].ran ? r[i].ms : 0;
            cpu[i][k] = r[i].ran ? r[i].cpu_ms : 0;
            ran[i] = ran[i] || r[i].ran;
            all[i] = all[i] && r[i].ran;
            r[i].ran = false; /* each round's own */
        }
        ms[PEER][k] = ms[PEER1][k] > 0 && (ms[PEER2][k] <= 0 || ms[PEER1][k] <= ms[PEER2][k])
                          ? ms[PEER1][k]
                          : ms[PEER2][k];
    }
    /* a ratio needs the peer in every round; a figure that missed a round is not quoted */
    bool peer_ok = (all[PEER1] || all[PEER2]);
    for (int k = 0; k < rounds; k++)
        peer_ok = peer_ok && ms[PEER][k] > 0;
    int best_peer = PEER1; /* whose val loss is the reference: the faster in the last round */
    if (!all[PEER1] || (all[PEER2] && ms[PEER2][rounds - 1] < ms[PEER1][rounds - 1]))
        best_peer = PEER2;
    printf("\n| run | ms/step%s | x PyTorch fp32 (faster thread count) | simulated ms/step | MFU "
           "| val loss | val - PyTorch |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
           rounds > 1 ? " (median of rounds)" : "");
    const char *label[NCFG] = {"PyTorch 1.13 eager fp32, 1 thread",
                               "PyTorch 1.13 eager fp32, 2 threads", "ntensor sim", "ntensor cpu",
                               "ntensor sim bf16", "ntensor sim, captured step",
                               "ntensor cpu, captured step", "ntensor sim fp8 (delayed scaling)"};
    double ratio[NCFG];
    for (int i = 0; i < NCFG; i++) {
        ratio[i] = 0;
        if (!ran[i])
            continue;
        if (!all[i]) {
            printf("| %s | missed a round | - | - | - | - | - |\n", label[i]);
            continue;
        }
        double rr[MAX_ROUNDS], m[MAX_ROUNDS];
        for (int k = 0; k < rounds; k++) {
            m[k] = ms[i][k];
            rr[k] = peer_ok ? ms[i][k] / ms[PEER][k] : 0;
        }
        printf("| %s | %.1f |", label[i], bench_median(m, rounds));
        if (peer_ok) {
            ratio[i] = bench_median(rr, rounds); /* sorts rr */
            printf(" %.2fx", ratio[i]);
            if (rounds > 1) { /* how far a neighbour's load moved it; and the best
                               * rounds', since a neighbour only ever adds time */
                double bo = ms[i][0], bp = ms[PEER][0];
                for (int k = 1; k < rounds; k++)
                    bo = fmin(bo, ms[i][k]), bp = fmin(bp, ms[PEER][k]);
                printf(" (rounds %.2f-%.2fx; best round / best round %.2fx)", rr[0],
                       rr[rounds - 1], bo / bp);
            }
            printf(" |");
        } else
            printf(" - |");
        if (i >= SIM && r[i].sim_ms > 0)
            printf(" %.2f | %.1f%% |", r[i].sim_ms, 100 * r[i].mfu);
        else
            printf(" - | - |");
        printf(" %.4f |", r[i].val);
        if (peer_ok && i >= SIM)
            printf(" %+.4f |\n", r[i].val - r[best_peer].val);
        else
            printf(" - |\n");
    }
    /* a replayed step against the same step run op by op, each round's
     * pair in turn: the host's dispatch a replay saves */
    for (int i = SIMCAP; i <= CPUCAP; i++) {
        int e = i == SIMCAP ? SIM : CPU;
        if (!all[i] || !all[e])
            continue;
        double q[MAX_ROUNDS], qc[MAX_ROUNDS];
        for (int k = 0; k < rounds; k++) {
            q[k] = ms[i][k] / ms[e][k];
            qc[k] = cpu[e][k] > 0 ? cpu[i][k] / cpu[e][k] : 0;
        }
        /* CPU time (every thread's) varies far less than wall time when
         * other programs share the machine */
        double wq = bench_median(q, rounds), cq = bench_median(qc, rounds);
        printf("%s: captured / op by op, wall time per step %.2fx, CPU time %.2fx (medians of %d "
               "round(s))%s\n",
               r[e].name, wq, cq, rounds,
               r[i].val == r[e].val ? "; the same val loss, bit for bit" : "; val loss DIFFERS");
    }
    if (all[FP8] && all[BF16] && r[BF16].sim_ms > 0)
        printf("fp8 / bf16: simulated ms/step %.3f / %.3f = %.2fx, val loss %+.4f (fp8 - bf16)\n",
               r[FP8].sim_ms, r[BF16].sim_ms, r[FP8].sim_ms / r[BF16].sim_ms,
               r[FP8].val - r[BF16].val);
    if (peer_ok) {
        if (all[SIM])
            printf("sim backend <= %.1fx PyTorch's step time: %s (%.2fx)\n", SIM_TARGET,
                   ratio[SIM] <= SIM_TARGET ? "met" : "NOT met", ratio[SIM]);
        if (all[CPU])
            printf("cpu backend <= %.1fx PyTorch's step time: %s (%.2fx)\n", CPU_TARGET,
                   ratio[CPU] <= CPU_TARGET ? "met" : "NOT met", ratio[CPU]);
        for (int i = SIM; i < NCFG; i++)
            if (all[i])
                printf("%s: val loss within %.2f nats of PyTorch's (%s) after %d steps: %s "
                       "(%+.4f)\n",
                       r[i].name, LOSS_TARGET, r[best_peer].name, steps,
                       fabs(r[i].val - r[best_peer].val) <= LOSS_TARGET ? "met" : "NOT met",
                       r[i].val - r[best_peer].val);
    }
    gpt_data_free(&d);
    nt_shutdown();
    return 0;
}
