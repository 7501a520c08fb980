/* cpu/subnormal.c - whether this CPU's subnormal arithmetic is slow,
 * measured once.
 *
 * The AVX-512 passes of cpu/fused.c keep every result IEEE f32 with
 * subnormals, and cpu/subnormal.h says how they avoid the microcode assist
 * an x86 multiply, divide or square root takes on a subnormal operand or a
 * tiny result: flush-to-zero runs redone exactly where MXCSR.UE says a
 * result was tiny, exponent tests, f64.  Those cost time of their own: a
 * redone block runs twice, an FTZ block's outputs wait in a buffer.  Where
 * the assist costs 35-60 ns a vector (an Intel Xeon) they pay many times
 * over; where it costs about what the plain operation does (an AMD Zen 4
 * core: a divide with a subnormal dividend 2.3x a normal one, a square
 * root 1.8x, a product that underflows 1.4x), the plain IEEE operation is
 * the faster route, and the same bits.
 *
 * So the first use times those operations on subnormal and on normal
 * values (16 KiB in L1, the fastest of many runs each, interleaved) and
 * calls the assists cheap when the slowest case is within SN_CHEAP times
 * its normal twin.  The two outcomes are far apart on the CPUs measured
 * (at most 2.3x against about 90x), so the limit sits between them, and
 * a wrong verdict only picks the slower of two exact routes: the result
 * is the same either way, and tests/test_fusion.c runs both. */
#include "cpu/subnormal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/gemm.h"

/* the slowest subnormal case within this many times its normal twin */
#define SN_CHEAP 6.0

/* -1: not measured yet, else the verdict; forced by nt__sn_set_assists */
static atomic_int sn_verdict = -1, sn_forced = -1;
static double sn_ratio;
static pthread_once_t sn_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <x86intrin.h>

#define SN_V 128 /* vectors a run: 8 KiB in, 8 KiB out */
enum { SN_DIV, SN_SQRT, SN_MUL, SN_ADD, SN_OPS };

/* Cycles for one run of op over SN_V vectors of a (and b). */
__attribute__((target(NT_TARGET_AVX512), noinline)) static uint64_t
sn_run(int op, const float *a, __m512 b, float *c)
{
    _mm_lfence();
    const uint64_t t0 = __rdtsc();
    _mm_lfence();
    for (int i = 0; i < 16 * SN_V; i += 16) {
        const __m512 x = _mm512_load_ps(a + i);
        __m512 z;
        switch (op) {
        case SN_DIV: z = _mm512_div_ps(x, b); break;
        case SN_SQRT: z = _mm512_sqrt_ps(x); break;
        case SN_MUL: z = _mm512_mul_ps(x, b); break;
        default: z = _mm512_add_ps(x, b); break;
        }
        _mm512_store_ps(c + i, z);
    }
    _mm_lfence();
    return __rdtsc() - t0;
}

__attribute__((target(NT_TARGET_AVX512))) static double sn_measure(void)
{
    static float a[2][16 * SN_V] __attribute__((aligned(64)));
    static float c[16 * SN_V] __attribute__((aligned(64)));
    /* per op: the normal operands, then the slow ones -- a subnormal
     * dividend (and quotient), a subnormal root, a product of normals that
     * underflows, a sum of subnormals */
    static const float x[SN_OPS][2] = {
        {1.5f, 1e-39f}, {1.5f, 1e-39f}, {1.5f, 1e-20f}, {1.5f, 1e-39f}};
    static const float y[SN_OPS][2] = {
        {0.75f, 0.75f}, {0.75f, 0.75f}, {0.75f, 1e-20f}, {0.75f, 1e-39f}};
    double worst = 0.0;
    /* round to nearest, exceptions masked, no FTZ or DAZ: the plain ops */
    const unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0xe07fu) | 0x1f80u);
    for (int op = 0; op < SN_OPS; op++) {
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 16 * SN_V; i++)
                a[k][i] = x[op][k];
        uint64_t best[2] = {UINT64_MAX, UINT64_MAX};
        for (int rep = 0; rep < 24; rep++)
            for (int k = 0; k < 2; k++) {
                uint64_t t = sn_run(op, a[k], _mm512_set1_ps(y[op][k]), c);
                best[k] = t < best[k] ? t : best[k];
            }
        double r = (double)best[1] / (double)(best[0] ? best[0] : 1);
        worst = r > worst ? r : worst;
    }
    _mm_setcsr(csr);
    return worst;
}

static void sn_probe(void)
{
    /* only the AVX-512 passes consult the verdict */
    if (!nt__gemm_isa_runs(NT_ISA_AVX512)) {
        atomic_store(&sn_verdict, 0);
        return;
    }
    sn_ratio = sn_measure();
    atomic_store(&sn_verdict, sn_ratio <= SN_CHEAP);
}
#else
static void sn_probe(void) { atomic_store(&sn_verdict, 0); }
#endif

bool nt__sn_assists_cheap(void)
{
    int f = atomic_load_explicit(&sn_forced, memory_order_relaxed);
    if (f >= 0)
        return f;
    int v = atomic_load_explicit(&sn_verdict, memory_order_acquire);
    if (v < 0) {
        pthread_once(&sn_once, sn_probe);
        v = atomic_load_explicit(&sn_verdict, memory_order_acquire);
    }
    return v;
}

double nt__sn_assist_ratio(void)
{
    pthread_once(&sn_once, sn_probe);
    return sn_ratio;
}

void nt__sn_set_assists(int mode) { atomic_store(&sn_forced, mode < 0 ? -1 : mode > 0); }
