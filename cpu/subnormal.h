/* cpu/subnormal.h - f32 multiply and divide without subnormal slowdowns,
 * with the bits of the plain f32 operation.
 *
 * On x86 a vmulps or vdivps (and vsqrtps) whose operand or result is
 * subnormal takes a microcode assist: measured on a Sapphire Rapids-class
 * Xeon, 35-60 ns per 16-lane vector instead of 0.4 ns.  AdamW's moments of
 * parameters that stopped getting gradient decay into that range, and the
 * main job spent most of its evaluator time there.  Flush-to-zero would
 * change results (the bits must stay IEEE f32 with subnormals), so instead:
 *
 * - a cheap integer test on the operands' exponent bits (nt__sn_*_risk)
 *   says whether an element could touch the subnormal range: a subnormal
 *   operand, or a result exponent below the smallest normal's (with a
 *   margin: a conservative test only costs speed, never bits);
 * - such elements are computed in f64 (nt__sn_*_f64): conversions between
 *   f32 and f64 take no assist here, even on subnormals, and neither do the
 *   f64 operations, whose operands and results are all normal f64 numbers.
 *
 * Same bits: an f32 product is exact in f64 (24 + 24 <= 53 bits), so
 * rounding it once to f32 is the f32 multiplication.  For a quotient and a
 * square root, f64 has 53 >= 2 * 24 + 2 bits, so rounding first to f64 and
 * then to f32 gives the correctly rounded f32 result (double rounding is
 * innocuous); this holds on the subnormal grid too (|q| < 2^-126 means the
 * f64 half-ulp is at most 2^-179, while a quotient of two f32 that is not
 * on the 2^-150 midpoint grid is at least 2^-174 from it).  NaN, infinities,
 * signed zeros and overflow come out as the f32 operation gives them.
 * tests/test_fusion.c checks all of it against the plain operation. */
#ifndef NT_CPU_SUBNORMAL_H
#define NT_CPU_SUBNORMAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* |x|'s bits */
static inline uint32_t nt__sn_abs(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}

/* 1 when |x|'s bits ua are a subnormal */
static inline uint32_t nt__sn_sub(uint32_t ua) { return ua - 1u < 0x007fffffu; }

/* a * b: |a * b| >= 2^(ea + eb - 254) for normal a, b, so the product is
 * normal when ea + eb >= 128 (130: margin); a zero gives zero. */
static inline uint32_t nt__sn_mul_risk(uint32_t ua, uint32_t ub)
{
    uint32_t ea = ua >> 23, eb = ub >> 23;
    return nt__sn_sub(ua) | nt__sn_sub(ub) |
           ((uint32_t)(ea + eb < 130u) & (uint32_t)(ua != 0) & (uint32_t)(ub != 0));
}

/* a / b: |a / b| > 2^(ea - eb - 1), normal when eb <= ea + 125 (123:
 * margin); a zero dividend gives zero (or NaN). */
static inline uint32_t nt__sn_div_risk(uint32_t ua, uint32_t ub)
{
    uint32_t ea = ua >> 23, eb = ub >> 23;
    return nt__sn_sub(ua) | nt__sn_sub(ub) | ((uint32_t)(ea + 123u < eb) & (uint32_t)(ua != 0));
}

/* For a fixed second operand s: the risk of a * s or a / s is
 * ua - 1 < bound (unsigned), i.e. 0 < |a| < bound + 1.  A subnormal or zero
 * s marks every nonzero a. */
static inline uint32_t nt__sn_bound(uint32_t t)
{
    return (t < 0x00800000u ? 0x00800000u : t) - 1u;
}

static inline uint32_t nt__sn_mul_bound(float s)
{
    uint32_t us = nt__sn_abs(s), es = us >> 23;
    if (us == 0 || nt__sn_sub(us))
        return 0xfffffffeu;
    return nt__sn_bound(es < 130u ? (130u - es) << 23 : 0);
}

static inline uint32_t nt__sn_div_bound(float s)
{
    uint32_t us = nt__sn_abs(s), es = us >> 23;
    if (us == 0 || nt__sn_sub(us))
        return 0xfffffffeu;
    return nt__sn_bound(es > 123u ? (es - 123u) << 23 : 0);
}

/* The f64 route.  The asm hides the widened operand from the compiler,
 * which would otherwise fold (float)((double)a * (double)b) back into the
 * f32 operation (it may: the result is the same), taking the assist again. */
#if defined(__x86_64__) || defined(__i386__)
#define NT__SN_HIDE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define NT__SN_HIDE(v) __asm__("" : "+w"(v))
#else
#define NT__SN_HIDE(v) __asm__("" : "+m"(v))
#endif
#if defined(__x86_64__) && defined(__AVX__)
#include <immintrin.h>
#define NT__SN_V4 1 /* 4 lanes at a time in a ymm (every x86 level here has AVX) */
#endif

/* OP(da, db) on f64 values, rounded to f32; z[0] for every element when
 * zscalar. */
#define NT__SN_BINARY(NAME, OP)                                                              \
    static inline void NAME(float *y, const float *x, const float *z, bool zscalar, int64_t n) \
    {                                                                                        \
        int64_t i = 0;                                                                       \
        NT__SN_BINARY_V4(OP)                                                                 \
        for (; i < n; i++) {                                                                 \
            double da = x[i], db = z[zscalar ? 0 : i];                                       \
            NT__SN_HIDE(da);                                                                 \
            y[i] = (float)(OP(da, db));                                                      \
        }                                                                                    \
    }
#ifdef NT__SN_V4
#define NT__SN_BINARY_V4(OP)                                                                 \
    for (; i + 4 <= n; i += 4) {                                                             \
        __m256d da = _mm256_cvtps_pd(_mm_loadu_ps(x + i));                                   \
        __m256d db = _mm256_cvtps_pd(zscalar ? _mm_set1_ps(z[0]) : _mm_loadu_ps(z + i));     \
        NT__SN_HIDE(da);                                                                     \
        _mm_storeu_ps(y + i, _mm256_cvtpd_ps(OP(da, db)));                                   \
    }
#else
#define NT__SN_BINARY_V4(OP)
#endif
#define NT__SN_MUL(a, b) ((a) * (b))
#define NT__SN_DIV(a, b) ((a) / (b))
NT__SN_BINARY(nt__sn_mul_f64, NT__SN_MUL)
NT__SN_BINARY(nt__sn_div_f64, NT__SN_DIV)
#undef NT__SN_BINARY
#undef NT__SN_BINARY_V4
#undef NT__SN_MUL
#undef NT__SN_DIV

/* Whether this CPU's plain IEEE multiply, divide, square root and add on
 * subnormal operands and tiny results cost about what they do on normal
 * values (cpu/subnormal.c measures it once, at the first call).  Then
 * cpu/fused.c's AVX-512 passes, chains and AdamW route run the plain
 * operations, with no flush-to-zero run to redo and no operand test; else
 * the routes above.  The same bits either way. */
bool nt__sn_assists_cheap(void);
/* The measurement: the slowest subnormal case over its normal twin (0 where
 * there is no AVX-512 to measure). */
double nt__sn_assist_ratio(void);
/* For tests: 1 calls the assists cheap, 0 costly, -1 goes back to the
 * measurement. */
void nt__sn_set_assists(int mode);

#endif
