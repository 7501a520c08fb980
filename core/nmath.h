/* core/nmath.h - the one implementation of every transcendental.
 *
 * CPU kernels, simulator instructions and fused kernels all call these, so a
 * value computed by exp() has the same bits on every path (docs/exactness.md, rule 2).
 *
 * nt__expf, nt__logf, nt__tanhf and nt__erff are static inline and written
 * without branches: every piece is computed and the answer is picked with
 * integer-mask selects (nt__fsel).  That keeps a loop that calls them free of
 * control flow, so GCC if-converts nothing and vectorises it (plain ?: on
 * floats is not enough under the default -ftrapping-math: GCC threads the
 * constant arm into separate blocks and then refuses to if-convert them).
 * Only IEEE + - * / and exact integer/bit operations are used, never FMA
 * (-ffp-contract=off), so a scalar call and a vector lane give the same bits.
 * Bit casts go through memcpy; all integer arithmetic is unsigned.
 *
 * Accuracy against the double-precision libm result, over every f32 input
 * (measured exhaustively, see tests/test_nmath.c): exp, log <= 1 ulp,
 * tanh, erf <= 2 ulp; Annex F special values; subnormals in and out.
 *
 * Coefficients are minimax (Remez) fits computed for this file with mpmath,
 * rounded to f32. */
#ifndef NT_CORE_NMATH_H
#define NT_CORE_NMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

float nt__powf(float x, float y);

/* sin, cos, log1p, expm1 and atan2 (issue 34): out of line, evaluated in
 * double from the f32 argument (every operation IEEE double, no FMA, no
 * libm), then rounded once to f32, so every backend gets the same bits.
 * sin and cos reduce the argument exactly (Payne-Hanek with 2/pi to 384
 * bits, 128-bit integer arithmetic), so sin(1e30f) is right, then use
 * Taylor polynomials on |r| <= pi/4 (truncation < 1e-19).  log1p:
 * 2 atanh(f / (2 + f)) after an exact 1 + x; expm1: a Taylor series for
 * |x| < 0.5, else exp(x) - 1 from an exp with a two-part ln2; atan2: Annex
 * F's special cases, atan of |y / x| after the reductions atan(t) = pi/2 -
 * atan(1/t) and atan(t) = pi/6 + atan((t sqrt3 - 1) / (sqrt3 + t)).
 * Measured against double libm over a sweep (tests/test_nmath.c): each
 * <= 1 ulp (the double result is within ~1e-15 relative of the exact one,
 * so only the final rounding is off, by at most a hair over half an ulp). */
float nt__sinf(float x);
float nt__cosf(float x);
float nt__log1pf(float x);
float nt__expm1f(float x);
float nt__atan2f(float y, float x);

/* Array forms: y[i] = f(x[i]), bitwise equal to the scalar functions below.
 * In-place (y == x) is allowed.  They run in fixed blocks of 64 so GCC
 * vectorises them at -O2 too (its "very cheap" -O2 cost model does not
 * vectorise loops with an unknown trip count or possible aliasing). */
void nt__expf_n(float *y, const float *x, long n);
void nt__logf_n(float *y, const float *x, long n);
void nt__tanhf_n(float *y, const float *x, long n);
void nt__erff_n(float *y, const float *x, long n);

/* Always inlined: a caller with a big body (cpu/fused.c's evaluators, one
 * switch over every op) otherwise gets an out-of-line copy, and its loops
 * then make one scalar call per element instead of vectorising (measured
 * 2026-11-24: the out-of-line erf was 17% of bench/gpt_step).  Inlining
 * changes no bit: the same IEEE operations run either way. */
#define NT__MATH_INLINE static inline __attribute__((always_inline))

/* ---- bit helpers ---- */
static inline uint32_t nt__f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float nt__u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* c ? a : b as a bit-mask blend (c is 0 or 1); both arms are already computed */
static inline float nt__fsel(int c, float a, float b)
{
    uint32_t m = 0u - (uint32_t)c;
    return nt__u2f((nt__f2u(a) & m) | (nt__f2u(b) & ~m));
}

/* ---- exp ----
 * k = round(x / ln2) (add-and-subtract 1.5*2^23), r = x - k*ln2 in two
 * Cody-Waite steps (k*NT__LN2_HI is exact: 15-bit constant times |k| <= 150),
 * exp(r) = 1 + r + r^2 q(r) on |r| <= ln2/2 (rel. error 0.06 ulp), the 1 + r
 * split exactly so only the final add rounds; then a scaling by 2^k in two
 * halves, so subnormal results round once and k = 128 needs no special case.
 * x is clamped to [-104, 89] (exp(-104) < 2^-150 rounds to 0, exp(89) > FLT_MAX
 * overflows to inf); the clamps keep NaN. */
#define NT__LN2_HI 0x1.62e4p-1f      /* 0.693145751953125, 15 significant bits */
#define NT__LN2_LO 0x1.7f7d1cp-20f   /* ln2 - NT__LN2_HI */

NT__MATH_INLINE float nt__expf(float x)
{
    float xc = nt__fsel(x < -104.0f, -104.0f, x);
    xc = nt__fsel(xc > 89.0f, 89.0f, xc);
    float kk = xc * 0x1.715476p+0f + 0x1.8p23f;  /* bits: 0x4B400000 + k */
    float k = kk - 0x1.8p23f;
    float r = (xc - k * NT__LN2_HI) - k * NT__LN2_LO;
    float q = 0x1.6a7b8cp-10f;
    q = q * r + 0x1.12385p-7f;
    q = q * r + 0x1.555886p-5f;
    q = q * r + 0x1.555494p-3f;
    q = q * r + 0x1.fffffcp-2f;
    float t = (r * r) * q;                       /* exp(r) - 1 - r */
    float h = 1.0f + r;
    float e = (1.0f - h) + r;                    /* exact: 1 + r == h + e */
    float p = h + (e + t);                       /* exp(r) in [0.70, 1.42] */
    /* 2^k = s1 * s2, j = k + 150 in [0, 278] split as j1 + j2 with
     * s1 = 2^(j1 - 75), s2 = 2^(j2 - 75), both exponents in [-75, 64]:
     * p * s1 is exact, p * s1 * s2 rounds once, also into the subnormal
     * range, and k = 128 overflows to inf.  For NaN the bits are garbage but
     * p is NaN. */
    uint32_t j = nt__f2u(kk) - 0x4B400000u + 150u;
    uint32_t j1 = j >> 1;
    float s1 = nt__u2f((j1 + 52u) << 23);
    float s2 = nt__u2f((j - j1 + 52u) << 23);
    return (p * s1) * s2;
}

/* ---- log ----
 * x = 2^e * m with m in [sqrt(1/2), sqrt(2)) (subnormals are first scaled
 * by 2^23), f = m - 1 exactly, log(1+f) = f - f^2/2 + f^3 P(f)
 * (rel. error 0.11 ulp).  e*ln2 + f is summed with an exact error term so
 * only the final add rounds. */
NT__MATH_INLINE float nt__logf(float x)
{
    int sub = x < 0x1p-126f;                     /* also 0, negatives, -inf */
    float xs = nt__fsel(sub, x * 0x1p23f, x);
    uint32_t u = nt__f2u(xs) + (0x3f800000u - 0x3f3504f3u);
    int32_t ei = (int32_t)(u >> 23) - (sub ? 150 : 127);
    float e = (float)ei;
    float m = nt__u2f((u & 0x007fffffu) + 0x3f3504f3u);
    float f = m - 1.0f;
    float P = -0x1.38ff9ap-4f;
    P = P * f + 0x1.05732ap-3f;
    P = P * f + -0x1.0d8142p-3f;
    P = P * f + 0x1.22d5e2p-3f;
    P = P * f + -0x1.547228p-3f;
    P = P * f + 0x1.99a036p-3f;
    P = P * f + -0x1.000228p-2f;
    P = P * f + 0x1.555554p-2f;
    float tail = (f * f) * (f * P - 0.5f);      /* log(1+f) - f */
    float hi = e * NT__LN2_HI;                   /* exact */
    float s = hi + f;
    float err = (hi - s) + f;                    /* exact: |hi| >= |f| or hi == 0 */
    float r = s + (err + (tail + e * NT__LN2_LO));
    r = nt__fsel(x == INFINITY, x, r);
    r = nt__fsel(x == 0.0f, -INFINITY, r);
    return nt__fsel(!(x >= 0.0f), NAN, r);      /* negative or NaN */
}

/* ---- tanh ----
 * Odd: computed on a = |x|, the sign bit put back at the end.
 * a < 0.625: tanh(a) = a + a^3 P(a^2) (rel. error 0.05 ulp);
 * otherwise 1 - 2 / (1 + exp(2a)) (exp(2a) = inf gives exactly 1). */
NT__MATH_INLINE float nt__tanhf(float x)
{
    uint32_t sx = nt__f2u(x) & 0x80000000u;
    float a = nt__u2f(nt__f2u(x) ^ sx);
    float a2 = a * a;
    float P = 0x1.9ca03ap-9f;
    P = P * a2 + -0x1.2fab02p-7f;
    P = P * a2 + 0x1.6a868ap-6f;
    P = P * a2 + -0x1.ba8376p-5f;
    P = P * a2 + 0x1.1112b2p-3f;
    P = P * a2 + -0x1.555556p-2f;
    float small = a + (a * a2) * P;
    float big = 1.0f - 2.0f / (1.0f + nt__expf(2.0f * a));
    float r = nt__fsel(a < 0.625f, small, big);  /* NaN takes big: NaN */
    return nt__u2f(nt__f2u(r) | sx);
}

/* ---- erf ----
 * Odd: computed on a = |x|.
 * a < 0.875: erf(a) = a + a Q(a^2) (rel. error 0.02 ulp);
 * otherwise erf(a) = 1 - exp(L(a - 0.875)), L ~ log(erfc) on [0.875, 4]
 * (erfc error 0.15 ulp of erf); a is clamped to 4 there, where
 * erfc(4) < 2^-25 already rounds the result to 1. */
NT__MATH_INLINE float nt__erff(float x)
{
    uint32_t sx = nt__f2u(x) & 0x80000000u;
    float a = nt__u2f(nt__f2u(x) ^ sx);
    float a2 = a * a;
    float Q = 0x1.4a0074p-14f;
    Q = Q * a2 + -0x1.a4d10ep-11f;
    Q = Q * a2 + 0x1.54318ep-8f;
    Q = Q * a2 + -0x1.b7ff9p-6f;
    Q = Q * a2 + 0x1.ce2d5cp-4f;
    Q = Q * a2 + -0x1.81274p-2f;
    Q = Q * a2 + 0x1.06eba8p-3f;
    float small = a + a * Q;
    float u = nt__fsel(a > 4.0f, 4.0f, a) - 0.875f;   /* keeps NaN */
    float L = -0x1.f8073ap-21f;
    L = L * u + -0x1.fa2864p-17f;
    L = L * u + 0x1.30092ap-12f;
    L = L * u + -0x1.2194d8p-9f;
    L = L * u + 0x1.73f7fp-7f;
    L = L * u + -0x1.803a4p-5f;
    L = L * u + -0x1.a7306p-1f;
    L = L * u + -0x1.37117p+1f;
    L = L * u + -0x1.88672ep+0f;
    float big = 1.0f - nt__expf(L);
    float r = nt__fsel(a < 0.875f, small, big);  /* NaN takes big: NaN */
    return nt__u2f(nt__f2u(r) | sx);
}

/* binary64 (NT_F64 tensors, docs/ops.md "Dtypes"): the C library's double
 * functions, called through these names only.  f64 ops run on the CPU
 * backend alone and never in a fused kernel, so one build gives one answer
 * in every mode; across C libraries the last bit may differ (glibc's exp,
 * log, sin, cos, pow are correctly rounded in practice; erf, tanh, expm1,
 * log1p, atan2 within 1-2 ulp of binary64). */
static inline double nt__exp64(double x) { return exp(x); }
static inline double nt__log64(double x) { return log(x); }
static inline double nt__tanh64(double x) { return tanh(x); }
static inline double nt__erf64(double x) { return erf(x); }
static inline double nt__sin64(double x) { return sin(x); }
static inline double nt__cos64(double x) { return cos(x); }
static inline double nt__log1p64(double x) { return log1p(x); }
static inline double nt__expm164(double x) { return expm1(x); }
static inline double nt__pow64(double x, double y) { return pow(x, y); }
static inline double nt__atan264(double y, double x) { return atan2(y, x); }

#endif
