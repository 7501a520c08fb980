/* bench/sim_matmul.c - nt_matmul on the simulated NeuronCore against
 * OpenBLAS, measured in the same run.
 *
 * For 1024^3 and 2048^3 f32: the wall-clock GFLOPS of nt_matmul on the sim
 * backend (one tile program: K-tiles of 128 accumulated in PSUM, the
 * functional step of every nc_matmul a K-tile GEMM) and of cblas_sgemm, their
 * ratio (target for 2048^3 below), where the host time went (the values -- the GEMM,
 * computed once per program by the CPU backend's kernel by default
 * (NT_SIM_PROGRAM_VALUES) or by nc_matmul's functional step -- vs issuing,
 * checking and timing the program's instructions), and what
 * the simulated core took: simulated time and TensorE utilisation (model
 * FLOPs utilisation at the f32 rate).  Each figure is the best of a few
 * runs, which take turns with OpenBLAS and an FMA peak sample; the ratios
 * are also taken rep by rep and their median printed (the machine may be
 * shared: a neighbour's load then hits both sides of a ratio alike).
 *
 * First it measures the machine's FMA peak in the same run: a loop of
 * independent fused multiply-adds held in registers, at the widest vector
 * ISA the CPU runs, on one core and on as many threads as the matmul uses
 * (the caller and core/gemm.c's helper); the products are then quoted as a
 * fraction of that peak too (target for 2048^3: >= 0.7 of it and >= 1.0x
 * OpenBLAS).
 *
 * Both yardsticks at their best: each is warmed up untimed (the peak loop
 * once per sample, OpenBLAS and nt_matmul once per size, so neither side's
 * first call, thread start or buffer allocation is timed) and taken as the
 * best of several in this process.  OpenBLAS picks its kernels for this
 * CPU: when OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE is set (some hosts set
 * OPENBLAS_CORETYPE=Haswell, AVX2 kernels on AVX-512 CPUs) the bench runs
 * itself again without them, since OpenBLAS reads them when it is loaded;
 * ntensor reads neither.  It prints the core OpenBLAS chose (--openblas:
 * only that, for the meson test peer_env).  --fp8: only the simulated time
 * and TFLOPS of a 4096^3 product with e4m3 operands (nt_matmul_fp8) next to
 * bf16's, on trn1 and on trn2. */
#include <cblas.h>
#include <errno.h>
#include <ntensor.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench/sim_matmul"
#include "bench.h"

#include "fma_peak.h"

static int peak_nth, peak_lanes_n; /* the matmul's threads; lanes (0: no peak) */

static double cpu_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Waits (up to 0.5 s) until no other thread of the process is running.
 * OpenBLAS's worker threads spin on sched_yield for 2^28 cycles (~0.1 s)
 * after each call before they sleep: timed right after cblas_sgemm,
 * nt_matmul shared the two cores with them (7% of the process's samples
 * sat in sched_yield during nt_matmul).  Each product is timed with the
 * other's threads idle. */
static double settle_s[2]; /* seconds waited before OpenBLAS, before nt_matmul */

static void settle(int which)
{
    double t0 = bench_now_ns() * 1e-9, t_end = t0 + 0.5;
    while (bench_now_ns() * 1e-9 < t_end) {
        double p0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID), s0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
        struct timespec d = {0, 5000000};
        nanosleep(&d, NULL);
        double others = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - p0 - (cpu_s(CLOCK_THREAD_CPUTIME_ID) - s0);
        if (others < 0.0005) /* under 10% of one core over the 5 ms */
            break;
    }
    settle_s[which] += bench_now_ns() * 1e-9 - t0;
}

static void run(int64_t n, int reps)
{
    double flops = 2.0 * (double)n * (double)n * (double)n;
    size_t bytes = (size_t)(n * n) * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    for (int64_t i = 0; i < n * n; i++) {
        a[i] = (float)((i * 7 + 3) % 13) / 13.0f - 0.5f;
        b[i] = (float)((i * 5 + 1) % 11) / 11.0f - 0.5f;
    }
    int64_t shape[2] = {n, n};
    nt_tensor *A = nt_from_host(a, NT_F32, 2, shape), *B = nt_from_host(b, NT_F32, 2, shape);
    bench_check(nt_sync(), "upload");
    /* untimed warm-up of both: OpenBLAS starts its threads and allocates its
     * buffers, nt_matmul compiles its program and reserves its output */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a,
                (int)n, b, (int)n, 0.0f, c, (int)n);
    nt_tensor *W = nt_matmul(A, B);
    bench_check(nt_sync(), "nt_matmul (warm-up)");
    nt_release(W);
    /* OpenBLAS, nt_matmul and a peak sample in turn, so that all three see
     * the same machine (it is shared: a neighbour's load comes and goes);
     * the ratios are taken rep by rep and their median quoted */
    double tb = 1e30, ts = 1e30, pk = 0, host = 0, gemm = 0, sim = 0, mfu = 0;
    double hval = 0, hgemm = 0; /* the values: once per program / per instruction */
    settle_s[0] = settle_s[1] = 0;
    double *rb = malloc(sizeof(double) * (size_t)reps), *rp = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        settle(0);
        double t0 = bench_now_ns() * 1e-9;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a,
                    (int)n, b, (int)n, 0.0f, c, (int)n);
        double t_blas = bench_now_ns() * 1e-9 - t0;
        if (t_blas < tb)
            tb = t_blas;
        settle(1);
        nt_sim_stats_reset();
        t0 = bench_now_ns() * 1e-9;
        nt_tensor *C = nt_matmul(A, B);
        bench_check(nt_sync(), "nt_matmul");
        double t = bench_now_ns() * 1e-9 - t0;
        nt_sim_stats st;
        nt_sim_stats_get(&st);
        if (t < ts) {
            ts = t;
            host = st.host_ns * 1e-9;
            hval = st.host_values_ns * 1e-9;
            hgemm = st.host_gemm_ns * 1e-9;
            gemm = hval + hgemm; /* only one of them is not 0 */
            sim = st.sim_ns * 1e-9;
            mfu = st.mfu;
        }
        nt_release(C);
        double p = peak_lanes_n ? peak_gflops(peak_nth, peak_lanes_n, 3) : 0;
        if (p > pk)
            pk = p;
        rb[r] = t_blas / t;                        /* nt_matmul / OpenBLAS speed */
        rp[r] = p > 0 ? flops / t * 1e-9 / p : 0;  /* nt_matmul / FMA peak */
    }
    double gb = flops / tb * 1e-9, gs = flops / ts * 1e-9;
    printf("%5lld^3 f32: OpenBLAS %7.1f GFLOPS (%7.2f ms) | sim nt_matmul %7.1f GFLOPS (%7.2f ms) = "
           "%5.1f%% of OpenBLAS\n",
           (long long)n, gb, tb * 1e3, gs, ts * 1e3, 100.0 * gs / gb);
    printf("        rep by rep (median of %d): nt_matmul / OpenBLAS %.2fx, nt_matmul / FMA peak "
           "%.2f%s\n",
           reps, bench_median(rb, reps), bench_median(rp, reps),
           n == 2048 ? " (targets >= 1.0x and >= 0.7)" : "");
    if (pk > 0)
        printf("        best of each / best FMA peak on %d threads (%.1f GFLOPS): nt_matmul %.2f, "
               "its values (the GEMM) alone %.2f (%.1f GFLOPS), OpenBLAS %.2f\n",
               peak_nth, pk, gs / pk, gemm > 0 ? flops / gemm * 1e-9 / pk : 0.0,
               gemm > 0 ? flops / gemm * 1e-9 : 0.0, gb / pk);
    printf("        before each product the other's threads went idle (waited %.0f ms before "
           "OpenBLAS, %.0f ms before nt_matmul, on average)\n",
           settle_s[0] * 1e3 / reps, settle_s[1] * 1e3 / reps);
    free(rb), free(rp);
    printf("        host time inside the kernel %.2f ms: values %.2f ms (%.0f%%; %s), issuing and "
           "timing the program %.2f ms; runtime outside the kernel %.2f ms\n",
           host * 1e3, gemm * 1e3, host > 0 ? 100.0 * gemm / host : 0.0,
           hval > 0 ? "once per program, the CPU kernel: GEMM, NaN check"
                    : "nc_matmul's functional GEMM",
           (host - gemm) * 1e3, (ts - host) * 1e3);
    nt_sim_config cfg;
    nt_sim_config_get(&cfg); /* NT_SIM_TARGET: trn1 (NeuronCore-v2) or trn2 (v3) */
    printf("        simulated: %.3f ms on one %s core, TensorE utilisation (MFU, f32 rate) "
           "%.1f%%\n",
           sim * 1e3, cfg.name, 100.0 * mfu);
    nt_release(A);
    nt_release(B);
    free(a), free(b), free(c);
}

/* ---------------- fp8 against bf16 (--fp8) ---------------- */

/* Simulated time of one n^3 product with bf16 operands and with e4m3
 * operands (nt_matmul_fp8, scales 1), both with a bf16 result, on the
 * target NT_SIM_TARGET names (read when the simulator starts: the runtime
 * is restarted per target), in lazy mode (the scaling fuses into the
 * matmul's epilogue as it does in a training step); TFLOPS = 2 n^3 /
 * simulated time. */
static void fp8_target(const char *target, int64_t n)
{
    setenv("NT_SIM_TARGET", target, 1);
    bench_check(nt_init(), "nt_init");
    bench_check(nt_config_set("NT_BACKEND", "sim"), "NT_BACKEND=sim");
    bench_check(nt_config_set("NT_MODE", "lazy"), "NT_MODE=lazy");
    nt_sim_config cfg;
    nt_sim_config_get(&cfg);
    int64_t shape[2] = {n, n};
    nt_tensor *X = nt_randn(NT_F32, 2, shape, 1), *Y = nt_randn(NT_F32, 2, shape, 2);
    nt_tensor *S = nt_full(NT_F32, 0, NULL, 1.0);
    nt_tensor *ops[2][2] = {{nt_cast(X, NT_BF16), nt_cast(Y, NT_BF16)},
                            {nt_cast(X, NT_E4M3), nt_cast(Y, NT_E4M3)}};
    bench_check(nt_sync(), "operands");
    double flops = 2.0 * (double)n * (double)n * (double)n, ms[2];
    for (int f = 0; f < 2; f++) {
        nt_sim_stats_reset();
        nt_tensor *C = f ? nt_matmul_fp8(ops[f][0], ops[f][1], S, S, NT_BF16)
                         : nt_matmul(ops[f][0], ops[f][1]);
        bench_check(nt_sync(), f ? "nt_matmul_fp8" : "nt_matmul");
        nt_sim_stats st;
        nt_sim_stats_get(&st);
        ms[f] = st.sim_ns * 1e-6;
        printf("%-5s %lld^3 %-4s: simulated %8.3f ms, %6.1f TFLOPS (peak %6.1f)\n", target,
               (long long)n, f ? "e4m3" : "bf16", ms[f], flops / (ms[f] * 1e-3) * 1e-12,
               cfg.tensor_peak_flops[f ? NT_SIM_MM_FP8 : NT_SIM_MM_BF16] * 1e-12);
        nt_release(C);
    }
    printf("%-5s fp8 / bf16 time: %.2f\n", target, ms[1] / ms[0]);
    nt_shutdown();
}

/* Runs this program again without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
 * when either is set: OpenBLAS read them when it was loaded, before main. */
static void openblas_unpinned(char **argv)
{
    const char *names[] = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"};
    bool set = false;
    for (int i = 0; i < 2; i++)
        if (getenv(names[i])) {
            printf("%s: %s=%s is set: running again without it, so that OpenBLAS picks its "
                   "own kernels\n",
                   BENCH_NAME, names[i], getenv(names[i]));
            set = true;
        }
    if (!set)
        return;
    for (int i = 0; i < 2; i++)
        unsetenv(names[i]);
    fflush(stdout);
    execv("/proc/self/exe", argv);
    printf("%s: cannot run again (%s): OpenBLAS keeps the host's setting\n", BENCH_NAME,
           strerror(errno));
}

static void openblas_line(void)
{
    printf("OpenBLAS: %s; core %s, %d threads\n", openblas_get_config(), openblas_get_corename(),
           openblas_get_num_threads());
}

int main(int argc, char **argv)
{
    /* --openblas: only the line that says which OpenBLAS core runs (a test
     * checks it is the one OpenBLAS picks with nothing pinned) */
    bool only_blas = argc == 2 && !strcmp(argv[1], "--openblas");
    bool fp8 = argc == 2 && !strcmp(argv[1], "--fp8");
    if (argc > 1 && !only_blas && !fp8) {
        fprintf(stderr, "usage: sim_matmul [--openblas | --fp8]\n");
        return 1;
    }
    if (fp8) { /* --fp8: e4m3 against bf16 on trn1 and trn2 */
        fp8_target("trn1", 4096);
        fp8_target("trn2", 4096);
        return 0;
    }
    openblas_unpinned(argv);
    if (only_blas) {
        openblas_line();
        return 0;
    }
    bench_check(nt_init(), "nt_init");
    bench_check(nt_config_set("NT_BACKEND", "sim"), "NT_BACKEND=sim");
    printf("bench/sim_matmul (backend %s, matmul kernel NT_CPU_ISA=%s)\n",
           nt_config_get("NT_BACKEND"), nt_config_get("NT_CPU_ISA"));
    openblas_line();
    const char *isa;
    int lanes = peak_lanes(&isa);
    if (lanes) {
        long nproc = sysconf(_SC_NPROCESSORS_ONLN);
        int nth = nproc > 1 ? 2 : 1; /* the caller and core/gemm.c's helper */
        double one = peak_gflops(1, lanes, 5), all = nth > 1 ? peak_gflops(nth, lanes, 5) : one;
        printf("FMA peak (%s, %d f32 lanes, register-resident loop, best of 5 after a "
               "warm-up): %.1f GFLOPS on one core, %.1f GFLOPS on %d threads (the matmul's); "
               "sampled again (best of 3) after each product below\n",
               isa, lanes, one, all, nth);
        peak_nth = nth, peak_lanes_n = lanes;
    }
    run(1024, 9);
    run(2048, 7);
    nt_shutdown();
    return 0;
}
