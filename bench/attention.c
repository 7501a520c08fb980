/* bench/attention.c - nt_scaled_dot_product_attention against the composite
 * attention a user writes without it (scores = q k^T * scale, the causal
 * mask by nt_masked_fill, nt_softmax, p v), forward + backward, in the same
 * run: peak device bytes above the inputs, simulated NeuronCore time, HBM
 * bytes and wall time, and the ratios (targets: memory <= 1/4,
 * simulated time <= 1/2 of the composite's).
 *
 * One step: the attention of q, k, v [B, H, T, D] (leaves that require
 * grad), loss = sum(y * g), nt_backward, read the loss.  The peak is
 * device_bytes_peak (nt_stats, reset before the step) minus the bytes live
 * before it (the inputs); the times are the median over the repeats.
 *
 * Usage: attention [--T 1024] [--H 4] [--D 64] [--B 1] [--reps 3] [--no-causal] */
#include <ntensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench/attention"
#include "bench.h"

typedef struct {
    double peak_mb, sim_ms, hbm_mb, wall_ms, loss;
    double busy_ms[NT_ENGINE_COUNT]; /* per engine, the last repeat */
} result;

static int64_t B = 1, H = 4, T = 1024, D = 64;
static bool causal = true;

static nt_tensor *composite(nt_tensor *q, nt_tensor *k, nt_tensor *v, nt_tensor *upper)
{
    nt_tensor *s = nt_mul_scalar(nt_matmul(q, nt_transpose(k, -1, -2)), 1.0 / sqrt((double)D));
    if (causal)
        s = nt_masked_fill(s, upper, -INFINITY);
    return nt_matmul(nt_softmax(s, -1), v);
}

static result step(bool fused, int reps)
{
    int64_t sh[4] = {B, H, T, D};
    nt_tensor *q = nt_randn(NT_F32, 4, sh, 1), *k = nt_randn(NT_F32, 4, sh, 2);
    nt_tensor *v = nt_randn(NT_F32, 4, sh, 3), *g = nt_randn(NT_F32, 4, sh, 4);
    nt_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        bench_check(nt_set_requires_grad(in[i], true), "requires_grad");
    /* the composite's mask: true above the diagonal (made once, like a
     * model's buffer) */
    uint8_t *m = malloc((size_t)(T * T));
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            m[i * T + j] = j > i;
    nt_tensor *upper = nt_from_host(m, NT_U8, 2, (int64_t[]){T, T});
    free(m);
    double *wall = malloc(sizeof(double) * (size_t)reps);
    double *sim = malloc(sizeof(double) * (size_t)reps);
    result r = {0};
    for (int it = 0; it < reps; it++) {
        for (int i = 0; i < 3; i++)
            nt_zero_grad(in[i]);
        bench_check(nt_sync(), "sync");
        nt_stats before;
        nt_stats_get(&before);
        nt_stats_reset();
        nt_sim_stats_reset();
        double t0 = bench_now_ns();
        nt_scope *sc = nt_scope_begin();
        nt_tensor *y = fused ? nt_scaled_dot_product_attention(q, k, v, NULL, causal, 0)
                             : composite(q, k, v, upper);
        nt_tensor *loss = nt_sum(nt_mul(y, g), NT_DIM_ALL, false);
        if (!loss)
            bench_fail("forward");
        bench_check(nt_backward(loss), "backward");
        bench_check(nt_item(loss, &r.loss), "item");
        nt_scope_end(sc);
        bench_check(nt_sync(), "sync");
        wall[it] = bench_now_ns() - t0;
        nt_stats st;
        nt_stats_get(&st);
        nt_sim_stats ss;
        nt_sim_stats_get(&ss);
        sim[it] = ss.sim_ns;
        r.peak_mb = (double)(st.device_bytes_peak - before.device_bytes_in_use) / 1e6;
        r.hbm_mb = (double)(ss.hbm_read_bytes + ss.hbm_write_bytes) / 1e6;
        for (int e = 0; e < NT_ENGINE_COUNT; e++)
            r.busy_ms[e] = ss.busy_ns[e] / 1e6;
    }
    r.wall_ms = bench_median(wall, reps) / 1e6;
    r.sim_ms = bench_median(sim, reps) / 1e6;
    free(wall);
    free(sim);
    nt_release(upper);
    for (int i = 0; i < 3; i++)
        nt_release(in[i]);
    nt_release(g);
    return r;
}

int main(int argc, char **argv)
{
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--T") && i + 1 < argc)
            T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--H") && i + 1 < argc)
            H = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--D") && i + 1 < argc)
            D = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--B") && i + 1 < argc)
            B = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-causal"))
            causal = false;
        else {
            fprintf(stderr, "usage: attention [--T n] [--H n] [--D n] [--B n] [--reps n] "
                            "[--no-causal]\n");
            return 2;
        }
    }
    if (nt_init())
        bench_fail("nt_init");
    printf("attention forward + backward, B=%lld H=%lld T=%lld D=%lld f32%s, backend %s\n",
           (long long)B, (long long)H, (long long)T, (long long)D, causal ? " causal" : "",
           nt_config_get("NT_BACKEND"));
    result c = step(false, reps), f = step(true, reps);
    printf("%-10s %14s %12s %12s %12s %14s\n", "", "peak dev MB", "sim ms", "HBM MB", "wall ms",
           "loss");
    printf("%-10s %14.2f %12.3f %12.1f %12.1f %14.6g\n", "composite", c.peak_mb, c.sim_ms,
           c.hbm_mb, c.wall_ms, c.loss);
    printf("%-10s %14.2f %12.3f %12.1f %12.1f %14.6g\n", "fused", f.peak_mb, f.sim_ms, f.hbm_mb,
           f.wall_ms, f.loss);
    printf("engine busy ms (TensorE VectorE ScalarE GpSimd DMA):\n");
    const result *rr[2] = {&c, &f};
    for (int i = 0; i < 2; i++) {
        printf("%-10s", i ? "fused" : "composite");
        for (int e = 0; e < NT_ENGINE_COUNT; e++)
            printf(" %8.3f", rr[i]->busy_ms[e]);
        printf("\n");
    }
    printf("fused / composite: peak memory %.3f (target <= 0.25), simulated time %.3f (target "
           "<= 0.5), HBM bytes %.3f, wall %.3f\n",
           f.peak_mb / c.peak_mb, f.sim_ms / c.sim_ms, f.hbm_mb / c.hbm_mb,
           f.wall_ms / c.wall_ms);
    nt_shutdown();
    return 0;
}
