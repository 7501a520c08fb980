/* bench/train_step.c - milliseconds per training step of the Fashion-MNIST
 * MLP (784-1024-1024-10, ReLU, cross-entropy, AdamW) at batch 128 on
 * synthetic data, in each mode, and the kernels launched per step.
 *
 * A step is: upload the batch, forward, backward, AdamW update, zero_grad,
 * and read the loss (the one sync a training loop needs per step), so the
 * time is the whole step's wall time as a training program sees it.  Median
 * over STEPS steps after WARMUP steps (kernels compiled, memory cached).
 * Target (issue 5): <= 8 ms per step.  PyTorch 1.13 eager takes about
 * 10-31 ms per step for the same model on the CPU of this machine class
 * (10-15 ms when its threads are well behaved).
 *
 * Usage: train_step [--steps N] [--warmup N] [--modes eager,adaptive,lazy] */
#include <ntensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "bench/train_step"
#include "bench.h"

#define BATCH 128
#define IN 784
#define HID 1024
#define OUT 10
#define TARGET_MS 8.0

typedef struct {
    double ms;              /* median wall time per step */
    double kernels, ops;    /* per step */
    double sim_ms;          /* simulated NeuronCore time per step (0: no sim kernels) */
    double sim_ns;          /* ... and over all measured steps, exactly */
} result;

static result run(const char *mode, int warmup, int steps, nt_tensor *x, nt_tensor *y)
{
    if (nt_config_set("NT_MODE", mode) != 0)
        bench_fail("nt_config_set");
    nt_tensor *p[6];
    bench_mlp_params(p, IN, HID, OUT);
    nt_optim *opt = nt_optim_adamw(p, 6, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    if (!opt)
        bench_fail("nt_optim_adamw");
    double *t = malloc(sizeof(double) * (size_t)steps);
    nt_stats st0, st1;
    nt_sim_stats sim0, sim1;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) {
            nt_sync();
            nt_stats_get(&st0);
            nt_sim_stats_get(&sim0);
        }
        double t0 = bench_now_ns() * 1e-6;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *h1 = nt_relu(nt_linear(x, p[0], p[1]));
        nt_tensor *h2 = nt_relu(nt_linear(h1, p[2], p[3]));
        nt_tensor *loss = nt_cross_entropy(nt_linear(h2, p[4], p[5]), y);
        double l;
        if (nt_backward(loss) || nt_optim_step(opt) || nt_optim_zero_grad(opt) ||
            nt_item(loss, &l))
            bench_fail("step");
        nt_scope_end(sc);
        if (s >= warmup)
            t[s - warmup] = bench_now_ns() * 1e-6 - t0;
    }
    nt_sync();
    nt_stats_get(&st1);
    nt_sim_stats_get(&sim1);
    qsort(t, (size_t)steps, sizeof t[0], bench_cmp);
    result r = {t[steps / 2], (double)(st1.kernels_launched - st0.kernels_launched) / steps,
                (double)(st1.ops_enqueued - st0.ops_enqueued) / steps,
                (sim1.sim_ns - sim0.sim_ns) * 1e-6 / steps, sim1.sim_ns - sim0.sim_ns};
    free(t);
    nt_optim_destroy(opt);
    for (int i = 0; i < 6; i++)
        nt_release(p[i]);
    return r;
}

int main(int argc, char **argv)
{
    int warmup = 5, steps = 20;
    const char *modes_arg = "eager,adaptive,lazy";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--modes"))
            modes_arg = argv[i + 1];
        else {
            fprintf(stderr, "usage: train_step [--steps N] [--warmup N] [--modes a,b,c]\n");
            return 1;
        }
    }
    if (steps < 1 || warmup < 0) {
        fprintf(stderr, "train_step: --steps must be >= 1 and --warmup >= 0\n");
        return 1;
    }
    if (nt_init() != 0)
        bench_fail("nt_init");
    nt_tensor *x = nt_rand(NT_F32, 2, (int64_t[]){BATCH, IN}, 42);
    int32_t lab[BATCH];
    for (int i = 0; i < BATCH; i++)
        lab[i] = (int32_t)((i * 7 + 3) % OUT);
    nt_tensor *y = nt_from_host(lab, NT_I32, 1, (int64_t[]){BATCH});
    if (!x || !y)
        bench_fail("data");
    printf("bench/train_step: MLP 784-1024-1024-10, batch %d, AdamW; median of %d steps after "
           "%d warm-up; backend %s\n",
           BATCH, steps, warmup, nt_config_get("NT_BACKEND"));
    double best = INFINITY;
    const char *best_mode = "";
    char buf[256];
    snprintf(buf, sizeof buf, "%s", modes_arg);
    for (char *save = NULL, *m = strtok_r(buf, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        result r = run(m, warmup, steps, x, y);
        printf("  %-9s %8.2f ms/step  %7.1f kernels/step  %7.1f ops/step", m, r.ms, r.kernels,
               r.ops);
        if (r.sim_ms > 0)
            printf("  %8.3f ms/step simulated NeuronCore time (%.0f ns in all)", r.sim_ms,
                   r.sim_ns);
        printf("\n");
        fflush(stdout);
        if (r.ms < best)
            best = r.ms, best_mode = m;
    }
    printf("train_step: %.2f ms/step (best mode: %s); target <= %.0f ms: %s (ratio %.2f of the "
           "limit); PyTorch 1.13 eager: ~10-31 ms/step\n",
           best, best_mode, TARGET_MS, best <= TARGET_MS ? "met" : "NOT met", best / TARGET_MS);
    nt_release(x);
    nt_release(y);
    nt_shutdown();
    return 0;
}
