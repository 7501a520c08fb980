/* core/nmath.c - out-of-line parts of core/nmath.h: powf and the array forms.
 *
 * The array forms work through a 64-float block on the stack: a loop with a
 * fixed count of 64 over a local array has no aliasing question (y == x is
 * fine) and no epilogue, so GCC vectorises it even with its -O2 cost model.
 * The tail of a call is padded with zeros and goes through the same loop, so
 * every element is computed by the same vector code, and that code performs
 * the same IEEE operations as the scalar inline function: bit-identical. */
#include "core/nmath.h"

float nt__powf(float x, float y) { return powf(x, y); }

#define NT__BLOCK 64

/* The binary targets generic x86-64 (SSE2), where the array forms run at
 * ~1.3 ns/element.  On CPUs with AVX2 / AVX-512 the loader picks a clone of
 * the same C compiled for those (ifunc): 2-4x faster.  The clones perform
 * the same IEEE operations (no FMA: -ffp-contract=off, and neither target
 * enables it) so every clone gives the same bits as the scalar functions. */
/* Not under ThreadSanitizer: ifunc resolvers run during relocation, before
 * TSan's runtime is up, and an instrumented resolver crashes there. */
#if defined(__x86_64__) && defined(__has_attribute) && !defined(NT_NMATH_NO_CLONES) && \
    !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define NT__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef NT__CLONES
#define NT__CLONES
#endif

#define NT__ARRAY_FORM(name, fn)                                              \
    NT__CLONES void name(float *y, const float *x, long n)                    \
    {                                                                         \
        float t[NT__BLOCK];                                                   \
        for (; n >= NT__BLOCK; n -= NT__BLOCK, x += NT__BLOCK, y += NT__BLOCK) { \
            for (int i = 0; i < NT__BLOCK; i++)                               \
                t[i] = fn(x[i]);                                              \
            memcpy(y, t, sizeof t);                                           \
        }                                                                     \
        if (n > 0) {                                                          \
            memcpy(t, x, (size_t)n * sizeof *t);                              \
            memset(t + n, 0, (size_t)(NT__BLOCK - n) * sizeof *t);            \
            for (int i = 0; i < NT__BLOCK; i++)                               \
                t[i] = fn(t[i]);                                              \
            memcpy(y, t, (size_t)n * sizeof *t);                              \
        }                                                                     \
    }

NT__ARRAY_FORM(nt__expf_n, nt__expf)
NT__ARRAY_FORM(nt__logf_n, nt__logf)
NT__ARRAY_FORM(nt__tanhf_n, nt__tanhf)
NT__ARRAY_FORM(nt__erff_n, nt__erff)

/* ---- sin, cos, log1p, expm1, atan2 (issue 34) ---- */

/* 2/pi to 384 bits (b_1 is the top bit of the first word) */
static const uint32_t nt__two_over_pi[12] = {
    0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u,
    0xfe5163abu, 0xdebbc561u, 0xb7246e3au, 0x424dd2e0u, 0x06492eeau, 0x09d1921cu,
};

/* the 64 bits b_pos .. b_pos+63 of 2/pi; bits before b_1 are 0 */
static uint64_t nt__tpi_bits(int pos)
{
    if (pos < 1)
        return nt__tpi_bits(1) >> (1 - pos);
    int idx = pos - 1, w = idx >> 5, s = idx & 31;
    uint64_t a = ((uint64_t)nt__two_over_pi[w] << 32) | nt__two_over_pi[w + 1];
    uint64_t b = ((uint64_t)nt__two_over_pi[w + 2] << 32) | nt__two_over_pi[w + 3];
    return s ? (a << s) | (b >> (64 - s)) : a;
}

#define NT__PIO2 1.57079632679489661923

/* a = |x| finite: a = q pi/2 + r (q mod 4), |r| <= pi/4 (a hair more), r in
 * double.  a = M 2^E, M < 2^24: y = a 2/pi mod 4 from the bits of 2/pi
 * b_(E-1) .. b_(E+126) (the earlier ones give multiples of 4), as the low
 * 128 bits of M times that window with 126 fraction bits; the bits past the
 * window change y by < 2^-102. */
static double nt__rem_pio2(float a, int *q)
{
    if (a < 0.785f) {
        *q = 0;
        return (double)a;
    }
    uint32_t u = nt__f2u(a);
    int E = (int)(u >> 23) - 150;
    uint64_t M = (u & 0x7fffffu) | 0x800000u;
    uint64_t hi = nt__tpi_bits(E - 1), lo = nt__tpi_bits(E + 63);
    unsigned __int128 P = ((unsigned __int128)(uint64_t)(M * hi) << 64) + (unsigned __int128)M * lo;
    int qq = (int)(P >> 126);
    unsigned __int128 one = (unsigned __int128)1 << 126;
    __int128 f = (__int128)(P & (one - 1));
    if (f >= (__int128)(one >> 1)) {
        qq++;
        f -= (__int128)one;
    }
    *q = qq & 3;
    return ((double)f * 0x1p-126) * NT__PIO2;
}

/* Taylor polynomials on |r| <= pi/4 + tiny: the first omitted terms are
 * below 1e-19 relative */
static double nt__sin_poly(double r)
{
    double r2 = r * r, p = 1.0 / 355687428096000.0;  /* 1/17! */
    p = p * r2 - 1.0 / 1307674368000.0;             /* 1/15! */
    p = p * r2 + 1.0 / 6227020800.0;
    p = p * r2 - 1.0 / 39916800.0;
    p = p * r2 + 1.0 / 362880.0;
    p = p * r2 - 1.0 / 5040.0;
    p = p * r2 + 1.0 / 120.0;
    p = p * r2 - 1.0 / 6.0;
    return r + (r * r2) * p;
}
static double nt__cos_poly(double r)
{
    double r2 = r * r, p = 1.0 / 6402373705728000.0; /* 1/18! */
    p = p * r2 - 1.0 / 20922789888000.0;            /* 1/16! */
    p = p * r2 + 1.0 / 87178291200.0;
    p = p * r2 - 1.0 / 479001600.0;
    p = p * r2 + 1.0 / 3628800.0;
    p = p * r2 - 1.0 / 40320.0;
    p = p * r2 + 1.0 / 720.0;
    p = p * r2 - 1.0 / 24.0;
    p = p * r2 + 0.5;
    return 1.0 - r2 * p;
}

float nt__sinf(float x)
{
    float a = fabsf(x);
    if (!(a <= 0x1.fffffep127f))
        return x - x; /* NaN, +-Inf: NaN */
    int q;
    double r = nt__rem_pio2(a, &q);
    double v = q == 0 ? nt__sin_poly(r) : q == 1 ? nt__cos_poly(r)
             : q == 2 ? -nt__sin_poly(r) : -nt__cos_poly(r);
    return x < 0.0f || (x == 0.0f && signbit(x)) ? (float)-v : (float)v;
}

float nt__cosf(float x)
{
    float a = fabsf(x);
    if (!(a <= 0x1.fffffep127f))
        return x - x;
    int q;
    double r = nt__rem_pio2(a, &q);
    double v = q == 0 ? nt__cos_poly(r) : q == 1 ? -nt__sin_poly(r)
             : q == 2 ? -nt__cos_poly(r) : nt__sin_poly(r);
    return (float)v;
}

float nt__log1pf(float x)
{
    if (x != x || x == INFINITY)
        return x;
    if (x < -1.0f)
        return NAN;
    if (x == -1.0f)
        return -INFINITY;
    double d = (double)x;
    if (fabs(d) < 0x1p-10) { /* x - x^2/2 + ... ; the x^7 term is < 2^-60 x */
        double p = -1.0 / 6.0;
        p = p * d + 1.0 / 5.0;
        p = p * d - 1.0 / 4.0;
        p = p * d + 1.0 / 3.0;
        p = p * d - 0.5;
        return (float)(d + (d * d) * p);
    }
    double u = 1.0 + d; /* exact: |x| >= 2^-10 has no bit below 2^-34 */
    uint64_t b;
    memcpy(&b, &u, sizeof b);
    /* u = 2^e m, m in [sqrt(1/2), sqrt(2)) */
    int e = (int)((b + (0x3ff0000000000000ull - 0x3fe6a09e667f3bcdull)) >> 52) - 1023;
    uint64_t mb = b - ((uint64_t)(int64_t)e << 52);
    double m;
    memcpy(&m, &mb, sizeof m);
    double f = m - 1.0, s = f / (2.0 + f), s2 = s * s;
    double p = 1.0 / 23.0;
    for (int k = 21; k >= 1; k -= 2)
        p = p * s2 + 1.0 / (double)k;
    double lm = 2.0 * s * p;
    return (float)((double)e * 0x1.62e42fefa39efp-1 + lm);
}

float nt__expm1f(float x)
{
    if (x != x)
        return x;
    double d = (double)x;
    if (fabs(d) < 0.5) { /* x (1 + x/2 (1 + x/3 (1 + ...))), to x^17/17! */
        double p = 1.0;
        for (int k = 17; k >= 2; k--)
            p = 1.0 + (d / (double)k) * p;
        return (float)(d * p);
    }
    d = d > 100.0 ? 100.0 : d < -30.0 ? -30.0 : d; /* inf, -1 once rounded */
    double k = d * 1.4426950408889634 + 0x1.8p52;
    k -= 0x1.8p52;                                  /* nearest integer */
    double r = (d - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
    double p = 1.0;                                 /* exp(r), |r| <= 0.35 */
    for (int j = 15; j >= 1; j--)
        p = 1.0 + (r / (double)j) * p;
    uint64_t sb = (uint64_t)(1023 + (int64_t)k) << 52;
    double s;
    memcpy(&s, &sb, sizeof s);
    return (float)(p * s - 1.0);
}

/* atan(t) for t >= 0 (t may be +Inf), in double */
static double nt__atan_d(double t)
{
    double base = 0.0, sgn = 1.0;
    if (t > 1.0) {
        t = 1.0 / t;
        base = NT__PIO2;
        sgn = -1.0;
    }
    double off = 0.0;
    if (t > 0.26794919243112270) { /* tan(pi/12) */
        const double r3 = 1.7320508075688772;
        t = (t * r3 - 1.0) / (r3 + t);
        off = 0.52359877559829887; /* pi/6 */
    }
    /* t (1 - t^2/3 + t^4/5 - ...) to t^32/33: |t| <= 0.268, the next term
     * is < 1e-19 t */
    double t2 = t * t, p = 1.0 / 33.0;
    for (int k = 15; k >= 0; k--)
        p = (k & 1 ? -1.0 : 1.0) / (double)(2 * k + 1) + t2 * p;
    return base + sgn * (off + t * p);
}

float nt__atan2f(float y, float x)
{
    if (x != x || y != y)
        return x + y;
    const double pi = 3.14159265358979323846;
    double ay = fabs((double)y), ax = fabs((double)x), r;
    if (ay == 0.0)
        r = signbit(x) ? pi : 0.0;
    else if (ax == 0.0)
        r = NT__PIO2;
    else if (isinf(ay))
        r = isinf(ax) ? (signbit(x) ? 3.0 * pi / 4.0 : pi / 4.0) : NT__PIO2;
    else if (isinf(ax))
        r = signbit(x) ? pi : 0.0;
    else {
        double a = nt__atan_d(ay / ax);
        r = signbit(x) ? pi - a : a;
    }
    return signbit(y) ? (float)-r : (float)r;
}
