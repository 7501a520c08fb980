/* bench/fma_peak.h - the machine's FMA peak, measured in the same run as a
 * benchmark's figures (bench/sim_matmul's matmul, bench/train_step's CPU
 * step against its FLOP floor): a loop of independent FMA chains at the
 * widest vector width this CPU runs, on one or more threads at once.
 * Include after bench.h (bench_now_ns); link with the threads dependency. */
#ifndef NT_BENCH_FMA_PEAK_H
#define NT_BENCH_FMA_PEAK_H

#include <pthread.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_X86 1
/* Twelve independent chains: enough to cover the FMA latency (4 cycles) on
 * two FMA ports.  Each step is acc = acc * m + c, which stays finite. */
#define PEAK_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
__attribute__((target("avx512f"))) static float peak_avx512(long iters)
{
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.0f + (float)i);
    PEAK_CHAINS(DECL)
#undef DECL
    for (long it = 0; it < iters; it++) {
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
        PEAK_CHAINS(STEP)
#undef STEP
    }
    __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, a##i);
    PEAK_CHAINS(SUM)
#undef SUM
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float peak_avx2(long iters)
{
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
#define DECL(i) __m256 a##i = _mm256_set1_ps(1.0f + (float)i);
    PEAK_CHAINS(DECL)
#undef DECL
    for (long it = 0; it < iters; it++) {
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
        PEAK_CHAINS(STEP)
#undef STEP
    }
    __m256 s = _mm256_setzero_ps();
#define SUM(i) s = _mm256_add_ps(s, a##i);
    PEAK_CHAINS(SUM)
#undef SUM
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#else
#define PEAK_X86 0
#endif

/* Lanes of the widest FMA this CPU runs (0: none measured). */
static int peak_lanes(const char **name)
{
#if PEAK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *name = "AVX-512";
        return 16;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *name = "AVX2";
        return 8;
    }
#endif
    *name = "none";
    return 0;
}

static volatile float peak_sink;

static void *peak_thread(void *arg)
{
    long iters = *(const long *)arg;
#if PEAK_X86
    peak_sink = peak_lanes(&(const char *){0}) == 16 ? peak_avx512(iters) : peak_avx2(iters);
#endif
    return NULL;
}

/* GFLOPS of nthreads threads running the loop at once: best of runs, after
 * one untimed run (a core's vector units may start slow). */
static double peak_gflops(int nthreads, int lanes, int runs)
{
    long iters = 1000000; /* ~20 ms per run at 3 GHz */
    double best = 0;
    for (int r = -1; r < runs; r++) {
        pthread_t th[8];
        double t0 = bench_now_ns();
        for (int i = 1; i < nthreads; i++)
            pthread_create(&th[i], NULL, peak_thread, &iters);
        peak_thread(&iters);
        for (int i = 1; i < nthreads; i++)
            pthread_join(th[i], NULL);
        double t = (bench_now_ns() - t0) * 1e-9;
        double g = (double)nthreads * (double)iters * 12.0 * lanes * 2.0 / t * 1e-9;
        if (r >= 0 && g > best)
            best = g;
    }
    return best;
}

/* GFLOPS of one thread running the loop, timed by its own CPU time (what
 * the scheduler gave it, so a busy machine's other processes take nothing
 * from the figure): best of runs, after one untimed run. */
static inline double peak_gflops_cpu(int lanes, int runs)
{
    long iters = 1000000;
    double best = 0;
    for (int r = -1; r < runs; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        peak_thread(&iters);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        double t = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
        double g = t > 0 ? (double)iters * 12.0 * lanes * 2.0 / t * 1e-9 : 0;
        if (r >= 0 && g > best)
            best = g;
    }
    return best;
}

#endif
