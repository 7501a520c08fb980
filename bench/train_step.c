/* bench/train_step.c - milliseconds per training step of the Fashion-MNIST
 * MLP (784-1024-1024-10, ReLU, cross-entropy, AdamW) at batch 128 on
 * synthetic data, in each mode, and the kernels launched per step.
 *
 * A step is: upload the batch, forward, backward, AdamW update, zero_grad,
 * and read the loss (the one sync a training loop needs per step), so the
 * time is the whole step's wall time as a training program sees it.  Median
 * over STEPS steps after WARMUP steps (kernels compiled, memory cached).
 * Target: <= 8 ms per step.  PyTorch's figure for the same step is what
 * --peer measures, in the same run (docs/sim.md section 11 has the latest).
 *
 * It also trains a small character-level transformer (bench/models.h) and
 * prints each mode's peak device memory (nt_stats: reserved, live, backed)
 * for both models against deterministic mode's (target: async modes need
 * at most 1.5x the memory of NT_DETERMINISTIC=1).
 *
 * With --peer it also measures, in the same run, the MLP step on both
 * backends in f32 and under bf16 autocast, runs PyTorch's eager step
 * (bench/peer/mlp_train_step.py, or --peer-script PATH, with
 * /usr/bin/python3 when that has torch: `sh scripts/deps.sh --bench`) at 1
 * and at 2 threads, and prints our step time over PyTorch's faster one per
 * backend and precision, and bf16 over our own f32.  The peer runs at its
 * best (bench/peer/peer_env.py) and prints which OpenBLAS core it loaded.
 * It also prints the simulated step's TensorE and DMA busy %, and the
 * DMA-limited floor: the step's HBM bytes over the core's DMA rate (the
 * lower of HBM bandwidth and its DMA engines' sustained rate), the time no
 * schedule of those bytes can beat.
 *
 * "captured" is a mode of its own here: the step recorded once by
 * nt_graph_cache (docs/graphs.md) and replayed, in adaptive mode
 * ("captured_lazy": the same in lazy mode).  On the sim backend each mode
 * also prints its HBM bytes a step, its DMA-limited floor and the step over
 * that floor.  On the CPU backend each MLP mode's line gives the step
 * against its FLOP floor instead: the step's matmul FLOPs at the FMA peak
 * measured right then (bench/fma_peak.h): the step's CPU time against one
 * thread's peak (target <= 1.3x; both timed by CPU time, which a
 * neighbour's load moves least), and the wall time against every
 * processor's peak.
 *
 * Usage: train_step [--steps N] [--warmup N]
 *                   [--modes deterministic,eager,adaptive,lazy,captured,captured_lazy]
 *                   [--model mlp|tf|both]
 *                   [--peer] [--peer-script PATH] [--rounds N] [--amp f32|bf16]
 * (--amp bf16: the modes' steps under bf16 autocast, their FLOP floor still
 * f32's FMA peak; --rounds: the peer comparison N times over, each ratio the median of
 * its rounds'.) */
#include <ntensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench/train_step"
#ifndef MLP_PEER_SCRIPT /* set by bench/meson.build: the checkout's copy */
#define MLP_PEER_SCRIPT "bench/peer/mlp_train_step.py"
#endif
#include "bench.h"
#include "fma_peak.h"
#include "models.h"

#define BATCH 128
#define IN 784
#define HID 1024
#define OUT 10
#define TARGET_MS 8.0
#define MEM_TARGET 1.5

/* the transformer: vocabulary, width, heads, context, batch */
#define TF_V 64
#define TF_D 64
#define TF_H 4
#define TF_T 32
#define TF_B 8

typedef struct {
    double ms;              /* median wall time per step */
    double kernels, ops;    /* per step */
    double sim_ms;          /* simulated NeuronCore time per step (0: no sim kernels) */
    uint64_t peak, live_peak, backed_peak; /* device bytes, from the mode's start */
    double sim_ns;          /* ... and over all measured steps, exactly */
    double tensor_busy, dma_busy; /* simulated TensorE / DMA busy, fraction of sim time */
    double hbm_bytes;       /* HBM bytes read + written per step */
    double cpu_ms;          /* the process's CPU time per step (all threads), mean */
} result;

/* The process's CPU time so far, ms (every thread's). */
static double bench_cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* "captured": the step (forward, backward, AdamW, zero_grad) recorded once
 * by nt_graph_cache and replayed, in adaptive mode; the loss is read after
 * each replay as in the other modes. */
typedef struct {
    bool tf;
    model_mlp *mlp;
    model_tf *tfm;
    nt_optim *opt;
    nt_dtype amp;
} cap_ctx;

static int cap_step(void *ctx, nt_tensor *const *in, int nin, nt_tensor **out, int nout)
{
    (void)in, (void)nin, (void)nout;
    const cap_ctx *c = ctx;
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt_last_error();
    int rc = c->amp != NT_F32 ? nt_autocast_begin(c->amp) : 0;
    nt_tensor *loss = rc ? NULL : c->tf ? model_tf_loss(c->tfm) : model_mlp_loss(c->mlp);
    if (c->amp != NT_F32 && !rc)
        nt_autocast_end();
    if (!rc && !loss)
        rc = nt_last_error();
    if (!rc)
        rc = nt_backward(loss);
    if (!rc)
        rc = nt_optim_step(c->opt);
    if (!rc)
        rc = nt_optim_zero_grad(c->opt);
    if (!rc)
        out[0] = nt_keep(loss);
    nt_scope_end(sc);
    return rc;
}

/* amp: NT_BF16 runs the forward under bf16 autocast; NT_F32 does not. */
static result run_amp(const char *mode, bool tf, int warmup, int steps, nt_dtype amp)
{
    /* "captured_lazy": the same, the step captured in lazy mode (its fusion
     * groups whole, as lazy mode forms them, not as adaptive mode's worker
     * happens to split them) */
    bool cap_lazy = !strcmp(mode, "captured_lazy");
    bool captured = cap_lazy || !strcmp(mode, "captured");
    if (nt_config_set("NT_MODE", cap_lazy ? "lazy" : captured ? "adaptive" : mode) != 0)
        bench_fail("nt_config_set");
    nt_sync();
    nt_stats_reset(); /* peaks from here: this mode's model and steps */
    model_mlp mlp;
    model_tf tfm;
    nt_tensor **p;
    int np;
    if (tf) {
        if (model_tf_init(&tfm, TF_V, TF_D, TF_H, TF_T, TF_B) != 0)
            bench_fail("model_tf_init");
        np = model_params(&tfm, true, &p);
    } else {
        if (model_mlp_init(&mlp, IN, HID, OUT, BATCH) != 0)
            bench_fail("model_mlp_init");
        np = model_params(&mlp, false, &p);
    }
    nt_optim *opt = nt_optim_adamw(p, np, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    if (!opt)
        bench_fail("nt_optim_adamw");
    cap_ctx cc = {tf, &mlp, &tfm, opt, amp};
    nt_graph_cache *cache = captured ? nt_graph_cache_create(cap_step, &cc, 0, 1, 1) : NULL;
    if (captured && !cache)
        bench_fail("nt_graph_cache_create");
    double *t = malloc(sizeof(double) * (size_t)steps);
    nt_stats st0, st1;
    nt_sim_stats sim0, sim1;
    double cpu0 = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) {
            nt_sync();
            nt_stats_get(&st0);
            nt_sim_stats_get(&sim0);
            cpu0 = bench_cpu_ms();
        }
        double t0 = bench_now_ns() * 1e-6;
        nt_scope *sc = nt_scope_begin();
        double l;
        if (cache) {
            nt_tensor *loss;
            if (nt_graph_cache_run(cache, NULL, &loss) || nt_item(loss, &l))
                bench_fail("the captured step");
        } else {
            if (amp != NT_F32 && nt_autocast_begin(amp) != 0)
                bench_fail("nt_autocast_begin");
            nt_tensor *loss = tf ? model_tf_loss(&tfm) : model_mlp_loss(&mlp);
            if (amp != NT_F32 && nt_autocast_end() != 0)
                bench_fail("nt_autocast_end");
            if (nt_backward(loss) || nt_optim_step(opt) || nt_optim_zero_grad(opt) ||
                nt_item(loss, &l))
                bench_fail("step");
        }
        nt_scope_end(sc);
        if (s >= warmup)
            t[s - warmup] = bench_now_ns() * 1e-6 - t0;
    }
    nt_sync();
    double cpu_ms = (bench_cpu_ms() - cpu0) / steps;
    nt_stats_get(&st1);
    nt_sim_stats_get(&sim1);
    qsort(t, (size_t)steps, sizeof t[0], bench_cmp);
    result r = {t[steps / 2], (double)(st1.kernels_launched - st0.kernels_launched) / steps,
                (double)(st1.ops_enqueued - st0.ops_enqueued) / steps,
                (sim1.sim_ns - sim0.sim_ns) * 1e-6 / steps, st1.device_bytes_peak,
                st1.device_bytes_live_peak, st1.device_bytes_backed_peak,
                sim1.sim_ns - sim0.sim_ns, 0, 0,
                (double)(sim1.hbm_read_bytes + sim1.hbm_write_bytes - sim0.hbm_read_bytes -
                         sim0.hbm_write_bytes) /
                    steps};
    if (r.sim_ns > 0) {
        r.tensor_busy = (sim1.busy_ns[NT_ENGINE_TENSOR] - sim0.busy_ns[NT_ENGINE_TENSOR]) / r.sim_ns;
        r.dma_busy = (sim1.busy_ns[NT_ENGINE_DMA] - sim0.busy_ns[NT_ENGINE_DMA]) / r.sim_ns;
    }
    r.cpu_ms = cpu_ms;
    free(t);
    nt_graph_cache_destroy(cache);
    nt_optim_destroy(opt);
    if (tf)
        model_tf_free(&tfm);
    else
        model_mlp_free(&mlp);
    return r;
}

/* --amp bf16: the modes' steps under bf16 autocast (NT_F32: without) */
static nt_dtype modes_amp = NT_F32;

static result run(const char *mode, bool tf, int warmup, int steps)
{
    return run_amp(mode, tf, warmup, steps, modes_amp);
}

/* The DMA-limited floor of a step that moves `bytes` of HBM traffic, in ms:
 * the core's DMA rate is the lower of its HBM share and its DMA engines'
 * sustained rate (nt_sim_config). */
static double dma_floor_ms(double bytes)
{
    nt_sim_config c;
    if (nt_sim_config_get(&c) != 0)
        return 0;
    double rate = c.dma_engines * c.dma_engine_bytes_per_ns;
    if (c.hbm_bytes_per_ns > 0 && c.hbm_bytes_per_ns < rate)
        rate = c.hbm_bytes_per_ns;
    return rate > 0 ? bytes / rate * 1e-6 : 0;
}

/* The MLP step's matmul FLOPs: the forward's three products, the three
 * weight gradients and the input gradients of layers 2 and 3 (the data
 * needs none), 2 FLOPs a multiply-add.  The elementwise work (ReLU, loss,
 * AdamW's 17 ops a parameter: about 2.5% as many operations) is left out,
 * so the floor is below what any schedule reaches. */
static double mlp_flops(void)
{
    double l1 = (double)IN * HID, l2 = (double)HID * HID, l3 = (double)HID * OUT;
    return 2.0 * BATCH * (2 * (l1 + l2 + l3) + l2 + l3);
}

#define FLOP_TARGET 1.3 /* host step over its FLOP floor, CPU backend */

/* On the CPU backend, the MLP step against its FLOP floor: its matmul FLOPs
 * at the FMA peak measured now.  The verdict is the step's CPU time (every
 * thread's) against one thread's peak timed by its own CPU time: neither
 * side counts time the scheduler gave other processes, so a busy machine
 * moves it little.  The wall time against every processor's peak timed by
 * the wall clock follows, for a quiet machine. */
static void print_flop_floor(const result *r)
{
    const char *isa;
    int lanes = peak_lanes(&isa);
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = nproc < 1 ? 1 : nproc > 8 ? 8 : (int)nproc;
    if (!lanes) {
        printf("  %-13s host: no FMA peak measured on this CPU\n", "");
        return;
    }
    double one = peak_gflops_cpu(lanes, 3), all = peak_gflops(nth, lanes, 3);
    double fl = mlp_flops(), cpu_floor = fl / (one * 1e9) * 1e3, wall_floor = fl / (all * 1e9) * 1e3;
    double ratio = r->cpu_ms / cpu_floor;
    printf("  %-13s host: %.3f GFLOP/step of matmul; FMA peak (%s, now) %.1f GFLOPS a thread: "
           "CPU time %.2f ms/step over the FLOP floor %.2f ms: %.2fx (target <= %.1fx: %s); "
           "wall %.2f ms over %.2f ms at %.1f GFLOPS on %d threads: %.2fx\n",
           "", fl * 1e-9, isa, one, r->cpu_ms, cpu_floor, ratio, FLOP_TARGET,
           ratio <= FLOP_TARGET ? "met" : "NOT met", r->ms, wall_floor, all, nth,
           r->ms / wall_floor);
}

/* The peer's medians, ms/step: [precision: 0 f32, 1 bf16][threads - 1]. */
#define PEER_THREADS 2 /* it runs at 1 and at 2 threads */
typedef struct {
    double ms[2][PEER_THREADS];
} peer_ms;

/* The number after `"key": ` in a JSON line, or -1. */
static double json_num(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *m = strstr(line, k);
    return m ? atof(m + strlen(k)) : -1;
}

/* Echoes one line of the peer's output and takes its median from a JSON
 * line (precision, threads, median_ms). */
static void peer_line(const char *line, void *arg)
{
    peer_ms *p = arg;
    printf("peer: %s", line);
    double v = json_num(line, "median_ms"), th = json_num(line, "threads");
    int prec = strstr(line, "\"precision\": \"fp32\"")   ? 0
               : strstr(line, "\"precision\": \"bf16\"") ? 1
                                                          : -1;
    if (v > 0 && prec >= 0 && th >= 1 && th <= PEER_THREADS)
        p->ms[prec][(int)th - 1] = v;
}

/* PyTorch's median ms/step in f32 and bf16 at each thread count, from the
 * peer script's JSON lines; false (with the reason printed) when it cannot
 * run or a figure is missing. */
static bool run_peer(const char *script, int warmup, int steps, peer_ms *p)
{
    FILE *f = fopen(script, "r");
    if (!f) {
        printf("peer: %s not found: PyTorch not measured (--peer-script PATH)\n", script);
        return false;
    }
    fclose(f);
    if (!bench_python_has_torch("/usr/bin/python3")) {
        printf("peer: /usr/bin/python3 cannot import torch (sh scripts/deps.sh --bench "
               "installs python3-torch): PyTorch not measured\n");
        return false;
    }
    char cmd[1200];
    if (strlen(script) > 1000 || strchr(script, '\'')) {
        printf("peer: the script path is too long or has a quote: PyTorch not measured\n");
        return false;
    }
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s' --steps %d --warmup %d --precision fp32,bf16 --threads 1,2",
             script, steps, warmup);
    memset(p, 0, sizeof *p);
    int rc = bench_peer_lines(cmd, peer_line, p);
    bool all = true;
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < PEER_THREADS; t++)
            all = all && p->ms[i][t] > 0;
    if (rc != 0 || !all) {
        printf("peer: the PyTorch script failed (status %d)\n", rc);
        return false;
    }
    return true;
}

/* The faster of the peer's thread counts for precision i. */
static double peer_best(const peer_ms *p, int i)
{
    double b = p->ms[i][0];
    for (int t = 1; t < PEER_THREADS; t++)
        if (p->ms[i][t] < b)
            b = p->ms[i][t];
    return b;
}


/* The peer comparison: the MLP on both backends, f32 and bf16 autocast,
 * against PyTorch eager measured right after, in the same run.  With
 * rounds > 1 the whole comparison runs that many times, ours and PyTorch's
 * taking turns, and each ratio is the median of its rounds' ratios: on a
 * shared machine a neighbour's load comes and goes within a minute, and
 * hits both sides of a round's ratio alike. */
#define MAX_ROUNDS 16

/* What one round measures, in ms/step: ours on each backend in f32 and bf16,
 * then PyTorch's at the faster of its thread counts. */
enum { SIM_F32, SIM_BF16, CPU_F32, CPU_BF16, PT_F32, PT_BF16, N_MS };

/* The ratios printed: ms[num] / ms[den] against limit. */
static const struct {
    const char *what;
    int num, den;
    double limit;
} ratios[] = {
    {"bf16 / own f32, sim backend", SIM_BF16, SIM_F32, 0.8},
    {"bf16 / own f32, cpu backend", CPU_BF16, CPU_F32, 0.8},
    {"sim backend (adaptive) / PyTorch f32", SIM_F32, PT_F32, 1.0},
    {"cpu backend (lazy) / PyTorch f32", CPU_F32, PT_F32, 0.6},
    {"sim backend bf16 / PyTorch bf16", SIM_BF16, PT_BF16, 1.0},
    {"cpu backend bf16 / PyTorch bf16", CPU_BF16, PT_BF16, 1.0},
};

static void peer_compare(const char *script, int warmup, int steps, int rounds)
{
    const char *backend0 = nt_config_get("NT_BACKEND");
    char b0[16];
    snprintf(b0, sizeof b0, "%s", backend0 ? backend0 : "sim");
    const char *mode_sim = "adaptive", *mode_cpu = "lazy"; /* each backend's default / best */
    double ms[N_MS][MAX_ROUNDS], pt[2][PEER_THREADS][MAX_ROUNDS];
    bool peer_ok = true; /* PyTorch answered every round so far */
    for (int k = 0; k < rounds; k++) {
        if (nt_config_set("NT_BACKEND", "sim") != 0)
            bench_fail("nt_config_set NT_BACKEND sim");
        result sf = run_amp(mode_sim, false, warmup, steps, NT_F32);
        result sb = run_amp(mode_sim, false, warmup, steps, NT_BF16);
        if (nt_config_set("NT_BACKEND", "cpu") != 0)
            bench_fail("nt_config_set NT_BACKEND cpu");
        result cf = run_amp(mode_cpu, false, warmup, steps, NT_F32);
        result cb = run_amp(mode_cpu, false, warmup, steps, NT_BF16);
        if (nt_config_set("NT_BACKEND", b0) != 0)
            bench_fail("nt_config_set NT_BACKEND");
        ms[SIM_F32][k] = sf.ms, ms[SIM_BF16][k] = sb.ms;
        ms[CPU_F32][k] = cf.ms, ms[CPU_BF16][k] = cb.ms;
        if (k == 0) {
            printf("\npeer comparison (MLP 784-1024-1024-10, batch %d, AdamW), median ms/step:\n",
                   BATCH);
            printf("  ours sim %-8s f32 %8.2f   bf16 %8.2f\n", mode_sim, sf.ms, sb.ms);
            printf("  ours cpu %-8s f32 %8.2f   bf16 %8.2f\n", mode_cpu, cf.ms, cb.ms);
            const result *sims[2] = {&sf, &sb};
            for (int i = 0; i < 2; i++) {
                const result *r = sims[i];
                printf("  simulated NeuronCore, %s: %.3f ms/step, TensorE %.1f%% busy, DMA %.1f%% "
                       "busy, %.1f MB HBM traffic/step, DMA-limited floor %.3f ms (%.2fx of "
                       "it)\n",
                       i ? "bf16" : "f32 ", r->sim_ms, 100 * r->tensor_busy, 100 * r->dma_busy,
                       r->hbm_bytes / 1e6, dma_floor_ms(r->hbm_bytes),
                       dma_floor_ms(r->hbm_bytes) > 0 ? r->sim_ms / dma_floor_ms(r->hbm_bytes)
                                                      : 0);
            }
            printf("  simulated step target <= 0.4 ms (f32): %s\n",
                   sf.sim_ms <= 0.4 ? "met" : "NOT met");
            fflush(stdout);
        }
        peer_ms p;
        ms[PT_F32][k] = ms[PT_BF16][k] = 0;
        peer_ok = peer_ok && run_peer(script, warmup, steps, &p);
        if (peer_ok) {
            ms[PT_F32][k] = peer_best(&p, 0), ms[PT_BF16][k] = peer_best(&p, 1);
            for (int i = 0; i < 2; i++)
                for (int t = 0; t < PEER_THREADS; t++)
                    pt[i][t][k] = p.ms[i][t];
        }
        if (rounds > 1 && peer_ok)
            printf("  round %d: ours sim f32 %.2f bf16 %.2f, cpu f32 %.2f bf16 %.2f; PyTorch "
                   "f32 %.2f (1 thread) %.2f (2), bf16 %.2f (1) %.2f (2) ms/step\n",
                   k + 1, sf.ms, sb.ms, cf.ms, cb.ms, p.ms[0][0], p.ms[0][1], p.ms[1][0],
                   p.ms[1][1]);
        else if (rounds > 1) /* a failed peer's zeros are no figure */
            printf("  round %d: ours sim f32 %.2f bf16 %.2f, cpu f32 %.2f bf16 %.2f ms/step; "
                   "PyTorch not measured\n",
                   k + 1, sf.ms, sb.ms, cf.ms, cb.ms);
        fflush(stdout);
    }
    char of[40] = "";
    if (rounds > 1)
        snprintf(of, sizeof of, ", median of %d rounds", rounds);
    if (peer_ok) {
        printf("  PyTorch eager%s, ms/step: f32 %.2f at 1 thread, %.2f at 2; bf16 %.2f at 1, "
               "%.2f at 2\n",
               of, bench_median(pt[0][0], rounds), bench_median(pt[0][1], rounds),
               bench_median(pt[1][0], rounds), bench_median(pt[1][1], rounds));
        printf("  (each round's ratio is taken against PyTorch's faster thread count)\n");
    }
    for (size_t i = 0; i < sizeof ratios / sizeof ratios[0]; i++) {
        if (ratios[i].den >= PT_F32 && !peer_ok)
            continue;
        double r[MAX_ROUNDS];
        for (int k = 0; k < rounds; k++)
            r[k] = ms[ratios[i].num][k] / ms[ratios[i].den][k];
        double med = bench_median(r, rounds); /* sorts r */
        char what[96], spread[96] = "";
        snprintf(what, sizeof what, "%s%s", ratios[i].what, of);
        if (rounds > 1) { /* how far a neighbour's load moved it; and each side's best
                           * round, since a neighbour only ever adds time */
            double bn = ms[ratios[i].num][0], bd = ms[ratios[i].den][0];
            for (int k = 1; k < rounds; k++) {
                bn = fmin(bn, ms[ratios[i].num][k]);
                bd = fmin(bd, ms[ratios[i].den][k]);
            }
            snprintf(spread, sizeof spread, "; rounds %.2f-%.2fx; best round / best round %.2fx",
                     r[0], r[rounds - 1], bn / bd);
        }
        printf("  %-60s %6.2fx  (target <= %.1fx: %s%s)\n", what, med, ratios[i].limit,
               med <= ratios[i].limit ? "met" : "NOT met", spread);
    }
}

/* Runs every mode of modes_arg on one model; returns the best time and
 * prints the peaks against deterministic mode's, when it ran. */
static double run_model(bool tf, const char *modes_arg, int warmup, int steps,
                        const char **best_mode, bool *mem_ok)
{
    double best = INFINITY;
    static char buf[256]; /* *best_mode points into it */
    snprintf(buf, sizeof buf, "%s", modes_arg);
    char names[8][32];
    uint64_t peak[8];
    int n = 0;
    double det = 0;
    for (char *save = NULL, *m = strtok_r(buf, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        result r = run(m, tf, warmup, steps);
        printf("  %-13s %8.2f ms/step  %7.1f kernels/step  %7.1f ops/step", m, r.ms, r.kernels,
               r.ops);
        if (r.sim_ms > 0)
            printf("  %8.3f ms/step simulated NeuronCore time (%.0f ns in all)", r.sim_ms,
                   r.sim_ns);
        if (r.sim_ms > 0)
            printf("\n  %-13s simulated: %.1f MB HBM/step, DMA-limited floor %.3f ms (%.2fx of "
                   "it), TensorE %.1f%% busy, DMA %.1f%% busy",
                   "", r.hbm_bytes / 1e6, dma_floor_ms(r.hbm_bytes),
                   dma_floor_ms(r.hbm_bytes) > 0 ? r.sim_ms / dma_floor_ms(r.hbm_bytes) : 0,
                   100 * r.tensor_busy, 100 * r.dma_busy);
        if (r.sim_ms == 0 && !tf) {
            printf("\n");
            print_flop_floor(&r);
        }
        printf("%s  %-13s peak device memory %8.2f MiB reserved, %8.2f MiB live, %8.2f MiB "
               "backed\n",
               r.sim_ms == 0 && !tf ? "" : "\n", "", r.peak / 1048576.0,
               r.live_peak / 1048576.0, r.backed_peak / 1048576.0);
        fflush(stdout);
        if (!strcmp(m, "deterministic"))
            det = (double)r.peak;
        else if (n < 8) {
            snprintf(names[n], sizeof names[n], "%s", m);
            peak[n++] = r.peak;
        }
        if (r.ms < best)
            best = r.ms, *best_mode = m;
    }
    if (det > 0 && n > 0) {
        printf("  peak device memory against deterministic mode (%.2f MiB):", det / 1048576.0);
        for (int i = 0; i < n; i++) {
            printf(" %s %.2fx", names[i], (double)peak[i] / det);
            if ((double)peak[i] > MEM_TARGET * det)
                *mem_ok = false;
        }
        printf("\n");
    }
    return best;
}

int main(int argc, char **argv)
{
    int warmup = 5, steps = 20, rounds = 1;
    const char *modes_arg = "deterministic,eager,adaptive,lazy,captured", *model = "both";
    const char *peer_script = MLP_PEER_SCRIPT;
    bool peer = false;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--peer")) {
            peer = true;
            i--; /* a flag: no value */
            continue;
        }
        if (i + 1 >= argc)
            goto usage;
        if (!strcmp(argv[i], "--peer-script"))
            peer_script = argv[i + 1], peer = true;
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--modes"))
            modes_arg = argv[i + 1];
        else if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--amp") && !strcmp(argv[i + 1], "bf16"))
            modes_amp = NT_BF16;
        else if (!strcmp(argv[i], "--amp") && !strcmp(argv[i + 1], "f32"))
            modes_amp = NT_F32;
        else {
        usage:
            fprintf(stderr, "usage: train_step [--steps N] [--warmup N] [--modes a,b,c] "
                            "[--model mlp|tf|both] [--peer] [--peer-script PATH] "
                            "[--rounds N] [--amp f32|bf16]\n");
            return 1;
        }
    }
    bool do_mlp = !strcmp(model, "mlp") || !strcmp(model, "both");
    bool do_tf = !strcmp(model, "tf") || !strcmp(model, "both");
    if (steps < 1 || warmup < 0 || rounds < 1 || rounds > MAX_ROUNDS || (!do_mlp && !do_tf)) {
        fprintf(stderr, "train_step: --steps must be >= 1, --warmup >= 0, --rounds 1 to %d, "
                        "--model mlp, tf or both\n",
                MAX_ROUNDS);
        return 1;
    }
    if (nt_init() != 0)
        bench_fail("nt_init");
    bool mem_ok = true;
    const char *best_mode = "";
    double best = INFINITY;
    static char best_buf[32];
    if (do_mlp) {
        printf("bench/train_step: MLP 784-1024-1024-10, batch %d, AdamW; median of %d steps "
               "after %d warm-up; backend %s\n",
               BATCH, steps, warmup, nt_config_get("NT_BACKEND"));
        const char *bm = "";
        best = run_model(false, modes_arg, warmup, steps, &bm, &mem_ok);
        snprintf(best_buf, sizeof best_buf, "%s", bm); /* the next run_model reuses bm's buffer */
        best_mode = best_buf;
    }
    if (do_tf) {
        printf("bench/train_step: character transformer (vocabulary %d, width %d, %d heads, "
               "context %d, batch %d; one block), AdamW\n",
               TF_V, TF_D, TF_H, TF_T, TF_B);
        const char *bm = "";
        run_model(true, modes_arg, warmup, steps, &bm, &mem_ok);
    }
    printf("memory: async modes' peak device memory <= %.1fx deterministic mode's: %s\n",
           MEM_TARGET, mem_ok ? "met" : "NOT met");
    if (do_mlp)
        printf("train_step: %.2f ms/step (MLP, best mode: %s); target <= %.0f ms: %s (ratio "
               "%.2f of the limit)%s\n",
               best, best_mode, TARGET_MS, best <= TARGET_MS ? "met" : "NOT met",
               best / TARGET_MS, peer ? "" : "; --peer measures PyTorch's step in the same run");
    if (peer)
        peer_compare(peer_script, warmup, steps, rounds);
    nt_shutdown();
    return 0;
}
