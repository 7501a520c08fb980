/* bench/sim_matmul.c - nt_matmul on the simulated NeuronCore against
 * OpenBLAS, measured in the same run.
 *
 * For 1024^3 and 2048^3 f32: the wall-clock GFLOPS of nt_matmul on the sim
 * backend (one tile program: K-tiles of 128 accumulated in PSUM, the
 * functional step of every nc_matmul a K-tile GEMM) and of cblas_sgemm, their
 * ratio (target >= 75%), where the host time went (the functional GEMM vs
 * the rest of the simulator: DMA copies, transposes, scheduling), and what
 * the simulated core took: simulated time and TensorE utilisation (model
 * FLOPs utilisation at the f32 rate).  Each figure is the best of a few
 * runs. */
#include <cblas.h>
#include <ntensor.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "bench/sim_matmul"
#include "bench.h"

static void run(int64_t n, int reps)
{
    double flops = 2.0 * (double)n * (double)n * (double)n;
    size_t bytes = (size_t)(n * n) * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    for (int64_t i = 0; i < n * n; i++) {
        a[i] = (float)((i * 7 + 3) % 13) / 13.0f - 0.5f;
        b[i] = (float)((i * 5 + 1) % 11) / 11.0f - 0.5f;
    }
    /* OpenBLAS */
    double tb = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now_ns() * 1e-9;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a,
                    (int)n, b, (int)n, 0.0f, c, (int)n);
        double t = bench_now_ns() * 1e-9 - t0;
        if (t < tb)
            tb = t;
    }
    /* nt_matmul on the simulator */
    int64_t shape[2] = {n, n};
    nt_tensor *A = nt_from_host(a, NT_F32, 2, shape), *B = nt_from_host(b, NT_F32, 2, shape);
    bench_check(nt_sync(), "upload");
    double ts = 1e30, host = 0, gemm = 0, sim = 0, mfu = 0;
    for (int r = 0; r < reps; r++) {
        nt_sim_stats_reset();
        double t0 = bench_now_ns() * 1e-9;
        nt_tensor *C = nt_matmul(A, B);
        bench_check(nt_sync(), "nt_matmul");
        double t = bench_now_ns() * 1e-9 - t0;
        nt_sim_stats st;
        nt_sim_stats_get(&st);
        if (t < ts) {
            ts = t;
            host = st.host_ns * 1e-9;
            gemm = st.host_gemm_ns * 1e-9;
            sim = st.sim_ns * 1e-9;
            mfu = st.mfu;
        }
        nt_release(C);
    }
    double gb = flops / tb * 1e-9, gs = flops / ts * 1e-9;
    printf("%5lld^3 f32: OpenBLAS %7.1f GFLOPS (%7.2f ms) | sim nt_matmul %7.1f GFLOPS (%7.2f ms) = "
           "%5.1f%% of OpenBLAS (target >= 75%%)\n",
           (long long)n, gb, tb * 1e3, gs, ts * 1e3, 100.0 * gs / gb);
    printf("        host time inside the kernel %.2f ms: functional GEMM %.2f ms (%.0f%%), rest of "
           "the simulator %.2f ms; runtime outside the kernel %.2f ms\n",
           host * 1e3, gemm * 1e3, host > 0 ? 100.0 * gemm / host : 0.0, (host - gemm) * 1e3,
           (ts - host) * 1e3);
    printf("        simulated: %.3f ms on one NeuronCore-v2, TensorE utilisation (MFU, f32 rate) "
           "%.1f%%\n",
           sim * 1e3, 100.0 * mfu);
    nt_release(A);
    nt_release(B);
    free(a), free(b), free(c);
}

int main(void)
{
    bench_check(nt_init(), "nt_init");
    bench_check(nt_config_set("NT_BACKEND", "sim"), "NT_BACKEND=sim");
    printf("bench/sim_matmul (backend %s)\n", nt_config_get("NT_BACKEND"));
    run(1024, 5);
    run(2048, 3);
    nt_shutdown();
    return 0;
}
