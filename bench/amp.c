/* bench/amp.c - mixed precision on the Fashion-MNIST MLP (784-1024-1024-10,
 * ReLU, cross-entropy, AdamW, f32 parameters): wall time and simulated
 * NeuronCore time per training step in f32, under bf16 autocast, and under
 * f16 autocast with the loss scaler, in the same run; and, for comparison,
 * bf16 parameters with f32 master weights in the optimizer
 * (nt_optim_set_master_weights), which saves autocast its per-step casts of
 * the weights; and fp8 autocast with delayed scaling (nt_fp8_autocast_begin,
 * the recipe updated after each backward; docs/amp.md "fp8 autocast").
 *
 * A step is: forward (under autocast), backward, optimizer step (through
 * the scaler for f16), zero_grad, read the loss.  Per step: the median wall
 * time over STEPS steps after WARMUP, and from nt_sim_stats the simulated
 * time, TensorE busy time, TensorE time at peak for the FLOPs (bf16/f16 at
 * 4x the f32 rate) and HBM bytes moved.  Batch 128 is the example's; a
 * bigger batch shows where the matmuls, and so the low precision, start to
 * matter.
 *
 * On the sim backend every configuration runs on both simulated targets,
 * trn1 (NeuronCore-v2) and trn2 (NeuronCore-v3): a row each (--targets).
 *
 * Usage: amp [--steps N] [--warmup N] [--batches 128,1024] [--mode adaptive]
 *            [--targets trn1,trn2] */
#include <ntensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "bench/amp"
#include "bench.h"

#define IN 784
#define HID 1024
#define OUT 10

typedef struct {
    double ms, sim_ms, tensor_ms, ideal_ms, mbytes, kernels, loss;
} result;

/* amp: NT_DTYPE_COUNT (f32), NT_BF16, or NT_F16 (with the loss scaler);
 * master: bf16 parameters with f32 masters (amp NT_BF16); fp8: fp8
 * autocast with a default recipe (amp unused). */
static result run(nt_dtype amp, bool master, bool fp8, int batch, int warmup, int steps)
{
    nt_fp8_recipe *recipe = fp8 ? nt_fp8_recipe_create(NULL) : NULL;
    if (fp8 && !recipe)
        bench_fail("nt_fp8_recipe_create");
    nt_tensor *p[6];
    bench_mlp_params(p, IN, HID, OUT);
    /* synthetic data: pixels in [0, 1), labels from a fixed pattern */
    nt_tensor *x = nt_rand(NT_F32, 2, (int64_t[]){batch, IN}, 42);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)batch);
    for (int i = 0; i < batch; i++)
        lab[i] = (i * 7) % OUT;
    nt_tensor *y = nt_from_host(lab, NT_I32, 1, (int64_t[]){batch});
    free(lab);
    for (int i = 0; master && i < 6; i++) {
        nt_no_grad_begin();
        nt_tensor *b = nt_cast(p[i], NT_BF16);
        nt_no_grad_end();
        nt_release(p[i]);
        p[i] = b;
        if (!b || nt_set_requires_grad(b, true))
            bench_fail("bf16 parameters");
    }
    nt_optim *opt = nt_optim_adamw(p, 6, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    if (master && (!opt || nt_optim_set_master_weights(opt, true)))
        bench_fail("master weights");
    nt_grad_scaler *scaler = amp == NT_F16 ? nt_grad_scaler_create(NULL) : NULL;
    if (!x || !y || !opt || (amp == NT_F16 && !scaler))
        bench_fail("set-up");
    double *t = malloc(sizeof(double) * (size_t)steps);
    nt_stats st0, st1;
    nt_sim_stats s0, s1;
    double l = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) {
            nt_sync();
            nt_stats_get(&st0);
            nt_sim_stats_get(&s0);
        }
        double t0 = bench_now_ns() * 1e-6;
        nt_scope *sc = nt_scope_begin();
        if (recipe ? nt_fp8_autocast_begin(recipe)
                   : amp != NT_DTYPE_COUNT && nt_autocast_begin(amp))
            bench_fail("nt_autocast_begin");
        nt_tensor *h1 = nt_relu(nt_linear(x, p[0], p[1]));
        nt_tensor *h2 = nt_relu(nt_linear(h1, p[2], p[3]));
        nt_tensor *loss = nt_cross_entropy(nt_linear(h2, p[4], p[5]), y);
        if (recipe || amp != NT_DTYPE_COUNT)
            nt_autocast_end();
        int rc;
        if (scaler)
            rc = nt_backward(nt_grad_scaler_scale(scaler, loss)) ||
                 nt_grad_scaler_step(scaler, opt) < 0 || nt_grad_scaler_update(scaler);
        else
            rc = nt_backward(loss) || (recipe && nt_fp8_recipe_update(recipe, NULL)) ||
                 nt_optim_step(opt);
        if (rc || nt_optim_zero_grad(opt) || nt_item(loss, &l))
            bench_fail("step");
        nt_scope_end(sc);
        if (s >= warmup)
            t[s - warmup] = bench_now_ns() * 1e-6 - t0;
    }
    nt_sync();
    nt_stats_get(&st1);
    nt_sim_stats_get(&s1);
    qsort(t, (size_t)steps, sizeof t[0], bench_cmp);
    result r = {
        .ms = t[steps / 2],
        .sim_ms = (s1.sim_ns - s0.sim_ns) * 1e-6 / steps,
        .tensor_ms = (s1.busy_ns[NT_ENGINE_TENSOR] - s0.busy_ns[NT_ENGINE_TENSOR]) * 1e-6 / steps,
        .ideal_ms = (s1.tensor_ideal_ns - s0.tensor_ideal_ns) * 1e-6 / steps,
        .mbytes = (double)(s1.hbm_read_bytes + s1.hbm_write_bytes - s0.hbm_read_bytes -
                           s0.hbm_write_bytes) * 1e-6 / steps,
        .kernels = (double)(st1.kernels_launched - st0.kernels_launched) / steps,
        .loss = l,
    };
    free(t);
    nt_grad_scaler_destroy(scaler);
    nt_fp8_recipe_destroy(recipe);
    nt_optim_destroy(opt);
    nt_release(x);
    nt_release(y);
    for (int i = 0; i < 6; i++)
        nt_release(p[i]);
    return r;
}

/* One batch size on the active target: the five precisions, the bf16 /
 * f32 and fp8 / bf16 ratios, each row labelled with the target. */
static void run_batch(const char *target, int batch, int warmup, int steps)
{
    const nt_dtype amps[5] = {NT_DTYPE_COUNT, NT_BF16, NT_F16, NT_BF16, NT_DTYPE_COUNT};
    const char *names[5] = {"f32", "bf16", "fp16+scale", "bf16+master", "fp8 delayed"};
    result r[5];
    for (int k = 0; k < 5; k++) {
        r[k] = run(amps[k], k == 3, k == 4, batch, warmup, steps);
        printf("%6d %-6s %-11s %9.2f %9.3f %9.3f %9.3f %9.1f %8.1f %8.4f\n", batch, target,
               names[k], r[k].ms, r[k].sim_ms, r[k].tensor_ms, r[k].ideal_ms, r[k].mbytes,
               r[k].kernels, r[k].loss);
        fflush(stdout);
    }
    /* bf16's figure over f32's, as the target reads (bf16 <= 0.8x
     * of f32): below 1 means bf16 takes less */
    printf("%6d %-6s bf16 / f32: wall x%.2f, simulated x%.2f, TensorE x%.2f, HBM bytes x%.2f\n",
           batch, target, r[1].ms / r[0].ms, r[1].sim_ms / r[0].sim_ms,
           r[1].tensor_ms / r[0].tensor_ms, r[1].mbytes / r[0].mbytes);
    printf("%6d %-6s fp8 / bf16: wall x%.2f, simulated x%.2f, TensorE x%.2f, HBM bytes x%.2f\n",
           batch, target, r[4].ms / r[1].ms, r[4].sim_ms / r[1].sim_ms,
           r[4].tensor_ms / r[1].tensor_ms, r[4].mbytes / r[1].mbytes);
}

int main(int argc, char **argv)
{
    int warmup = 5, steps = 20;
    const char *batches = "128,1024", *mode = "adaptive", *targets = "trn1,trn2";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batches"))
            batches = argv[i + 1];
        else if (!strcmp(argv[i], "--mode"))
            mode = argv[i + 1];
        else if (!strcmp(argv[i], "--targets"))
            targets = argv[i + 1];
        else {
            fprintf(stderr, "usage: amp [--steps N] [--warmup N] [--batches 128,1024] "
                            "[--mode adaptive] [--targets trn1,trn2]\n");
            return 1;
        }
    }
    if (steps < 1 || warmup < 0 || nt_init() != 0 || nt_config_set("NT_MODE", mode) != 0)
        bench_fail("set-up");
    const char *backend = nt_config_get("NT_BACKEND");
    bool sim = backend && !strcmp(backend, "sim");
    printf("amp: MLP 784-1024-1024-10, AdamW; mode %s, backend %s; median of "
           "%d steps after %d\n", mode, backend, steps, warmup);
    printf("%6s %-6s %-11s %9s %9s %9s %9s %9s %8s %8s\n", "batch", "target", "precision",
           "wall ms", "sim ms", "TensorE", "at peak", "HBM MB", "kernels", "loss");
    char *list = strdup(batches);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int batch = atoi(tok);
        if (batch < 1)
            bench_fail("--batches");
        if (!sim) { /* nothing simulated: one set of rows */
            run_batch("-", batch, warmup, steps);
            continue;
        }
        char *tl = strdup(targets);
        for (char *ts = NULL, *t = strtok_r(tl, ",", &ts); t; t = strtok_r(NULL, ",", &ts)) {
            nt_sim_target tg = !strcmp(t, "trn1") ? NT_SIM_TRN1
                               : !strcmp(t, "trn2") ? NT_SIM_TRN2 : (nt_sim_target)-1;
            /* every queued op finished on the previous target first */
            if (nt_sync() || nt_sim_set_target(tg))
                bench_fail("--targets (trn1 or trn2)");
            run_batch(t, batch, warmup, steps);
        }
        free(tl);
    }
    free(list);
    nt_sync();
    nt_sim_set_target(NT_SIM_TRN1);
    nt_shutdown();
    return 0;
}
