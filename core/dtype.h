/* core/dtype.h - element types and their exact conversions.
 *
 * Every path (CPU kernels, simulator instructions, fused kernels) converts
 * through these functions, so a value is rounded the same way wherever it is
 * stored.  Floating math is done in f32; storing rounds to nearest even. */
#ifndef NT_CORE_DTYPE_H
#define NT_CORE_DTYPE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ntensor.h"

static inline uint32_t nt__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float nt__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* NaN is canonical (a positive quiet NaN) at every rounding point.  C leaves
 * the payload of an op on two NaNs to the compiler -- `a + b` may be emitted
 * as `b + a` -- so two compiled copies of one expression can disagree on it.
 * With every stored value canonical, fused == unfused holds for NaNs too. */
#define NT__QNAN_F32 0x7fc00000u
#define NT__QNAN_BF16 0x7fc0u
#define NT__QNAN_F16 0x7e00u
#define NT__QNAN_F64 UINT64_C(0x7ff8000000000000)

static inline float nt__canon(float f)
{
    /* integer select: vectorises (a float ?: does not under -ftrapping-math) */
    uint32_t u = nt__f32_bits(f);
    /* |u| as a signed int: one signed compare (vpcmpgtd), no unsigned min */
    uint32_t nan = 0u - (uint32_t)((int32_t)(u & 0x7fffffffu) > (int32_t)0x7f800000);
    return nt__bits_f32((u & ~nan) | (NT__QNAN_F32 & nan));
}

/* f64: the same canonical NaN rule, in binary64 */
static inline double nt__canon64(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    if ((u & UINT64_C(0x7fffffffffffffff)) > UINT64_C(0x7ff0000000000000))
        u = NT__QNAN_F64;
    memcpy(&d, &u, 8);
    return d;
}

static inline float nt__bf16_to_f32(uint16_t h)
{
    return nt__bits_f32((uint32_t)h << 16);
}

/* Round to nearest even; NaN becomes the canonical NaN. */
static inline uint16_t nt__f32_to_bf16(float f)
{
    uint32_t u = nt__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)NT__QNAN_BF16;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float nt__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return nt__bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        /* subnormal: m * 2^-24 is exact in f32 */
        float v = (float)m * 0x1p-24f;
        return nt__bits_f32(nt__f32_bits(v) | sign);
    }
    return nt__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Round to nearest even, with f16 subnormals, overflow to Inf; NaN becomes
 * the canonical NaN. */
static inline uint16_t nt__f32_to_f16(float f)
{
    uint32_t x = nt__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)NT__QNAN_F16;
    if (ax == 0x7f800000u) /* Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal in f16 (>= 2^-14) */
        uint32_t odd = (ax >> 13) & 1u;
        ax = ax - (112u << 23) + 0xfffu + odd;
        return (uint16_t)(sign | (ax >> 13));
    }
    /* Subnormal or zero: adding 0.5 leaves a float whose ulp is 2^-24, so the
     * FPU's own round-to-nearest-even does the rounding. */
    float t = nt__bits_f32(ax) + 0.5f;
    return (uint16_t)(sign | (nt__f32_bits(t) - 0x3f000000u));
}

/* ---------------- fp8 (OCP 8-bit floating point, docs/ops.md "fp8") ------
 *
 * E4M3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits; no
 * infinities, NaN is S.1111.111; max 448, smallest subnormal 2^-9.
 * E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like (the
 * top byte of an f16): infinities and NaNs; max 57344, smallest subnormal
 * 2^-16.  Every fp8 value is exact in f32, bf16 and f16.
 *
 * Rounding to fp8 is to nearest even.  Overflow: E4M3 saturates (a finite
 * value past 448 gives +-448: it has no infinity, and NaN would turn one
 * stale scale's overflow into a NaN that poisons a whole matmul; Transformer
 * Engine's and the Neuron compiler's casts saturate too); +-Inf, which is
 * not a value an fp8 scale can bring into range, becomes NaN.  E5M2
 * overflows to +-Inf as IEEE formats do (>= 61440, the midpoint past
 * 57344, rounds to Inf).  NaN becomes the canonical NaN: 0x7f (E4M3), 0x7e
 * (E5M2, a quiet NaN, the top byte of f16's). */
#define NT__QNAN_E4M3 0x7fu
#define NT__QNAN_E5M2 0x7eu

static inline bool nt__dtype_is_fp8(nt_dtype dt) { return dt == NT_E4M3 || dt == NT_E5M2; }

/* f32, bf16 or f16: widened to f32 exactly, so summed in f32 by the lone
 * sum op and by a matmul's column sums alike (a side sum, fusion/plan.c;
 * nt_tile_matmul's a_colsum, neuron/tp_matmul.c). */
static inline bool nt__dtype_is_f32_or_half(nt_dtype dt)
{
    return dt == NT_F32 || dt == NT_BF16 || dt == NT_F16;
}

static inline float nt__e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
    if ((c & 0x7fu) == 0x7fu)
        return nt__bits_f32(NT__QNAN_F32);
    if (e == 0) /* subnormal: m * 2^-9, exact */
        return nt__bits_f32(nt__f32_bits((float)m * 0x1p-9f) | sign);
    return nt__bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

static inline float nt__e5m2_to_f32(uint8_t c)
{
    return nt__f16_to_f32((uint16_t)((unsigned)c << 8));
}

static inline uint8_t nt__f32_to_e4m3(float f)
{
    uint32_t x = nt__f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* NaN, +-Inf */
        return (uint8_t)NT__QNAN_E4M3;
    if (ax >= 0x43e00000u) /* >= 448: saturates */
        return (uint8_t)(sign | 0x7eu);
    if (ax >= 0x3c800000u) { /* normal in E4M3 (>= 2^-6): drop 20 bits, to even */
        uint32_t odd = (ax >> 20) & 1u;
        ax = ax - (120u << 23) + 0x7ffffu + odd;
        return (uint8_t)(sign | (ax >> 20));
    }
    /* subnormal or zero: 2^14's ulp is 2^-9, so the FPU's own
     * round-to-nearest-even of the sum rounds (a carry gives 2^-6, code 8) */
    float t = nt__bits_f32(ax) + 0x1p14f;
    return (uint8_t)(sign | (nt__f32_bits(t) - 0x46800000u));
}

static inline uint8_t nt__f32_to_e5m2(float f)
{
    uint32_t x = nt__f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint8_t)NT__QNAN_E5M2;
    if (ax >= 0x47700000u) /* >= 61440 (and Inf): Inf */
        return (uint8_t)(sign | 0x7cu);
    if (ax >= 0x38800000u) { /* normal in E5M2 (>= 2^-14): drop 21 bits, to even */
        uint32_t odd = (ax >> 21) & 1u;
        ax = ax - (112u << 23) + 0xfffffu + odd;
        return (uint8_t)(sign | (ax >> 21));
    }
    /* subnormal or zero: 2^7's ulp is 2^-16 */
    float t = nt__bits_f32(ax) + 0x1p7f;
    return (uint8_t)(sign | (nt__f32_bits(t) - 0x43000000u));
}

/* Stochastic rounding to fp8 (the scheme of nt__f32_to_bf16_sr below: add
 * random bits just below the last bit kept, truncate).  In the normal range
 * the dropped f32 bits (20 for E4M3, 21 for E5M2) are exactly the bits beyond
 * fp8's precision, so the rounding is exactly unbiased there; below the
 * smallest normal the magnitude is first truncated to a multiple of 2^-29
 * (E4M3) or 2^-37 (E5M2), then the same bits decide.  E4M3: a result past
 * 448 saturates to 448, Inf and NaN give NaN; E5M2: |f| >= 65536 and Inf
 * give Inf (a value in (57344, 65536) reaches Inf with the probability of
 * its distance to 57344 over 8192), NaN the canonical NaN. */
static inline uint8_t nt__f32_to_e4m3_sr(float f, uint32_t r)
{
    uint32_t x = nt__f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r20 = r >> 12, c;
    if (ax >= 0x7f800000u)
        return (uint8_t)NT__QNAN_E4M3;
    if (ax >= 0x43e00000u) /* >= 448 */
        return (uint8_t)(sign | 0x7eu);
    if (ax >= 0x3c800000u)
        c = (ax - (120u << 23) + r20) >> 20;
    else
        c = ((uint32_t)(nt__bits_f32(ax) * 0x1p29f) + r20) >> 20;
    return (uint8_t)(sign | (c > 0x7eu ? 0x7eu : c));
}

static inline uint8_t nt__f32_to_e5m2_sr(float f, uint32_t r)
{
    uint32_t x = nt__f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r21 = r >> 11;
    if (ax > 0x7f800000u)
        return (uint8_t)NT__QNAN_E5M2;
    if (ax >= 0x47800000u) /* >= 65536 (and Inf) */
        return (uint8_t)(sign | 0x7cu);
    if (ax >= 0x38800000u) /* a carry may reach 2^16 = Inf */
        return (uint8_t)(sign | ((ax - (112u << 23) + r21) >> 21));
    return (uint8_t)(sign | (((uint32_t)(nt__bits_f32(ax) * 0x1p37f) + r21) >> 21));
}

/* double -> f32 rounding to odd: the sticky bit keeps a second rounding to a
 * narrower format (bf16, f16: >= 2 bits fewer) correct. */
static inline float nt__f64_to_f32_odd(double d)
{
    float f = (float)d;
    if (isnan(d) || isinf(f) || (double)f == d)
        return f;
    /* f was rounded; step toward zero if it went away, then set the lsb */
    if (fabs((double)f) > fabs(d))
        f = nextafterf(f, 0.0f);
    return nt__bits_f32(nt__f32_bits(f) | 1u);
}

static inline uint16_t nt__f64_to_bf16(double d)
{
    return nt__f32_to_bf16(nt__f64_to_f32_odd(d));
}

static inline uint16_t nt__f64_to_f16(double d)
{
    return nt__f32_to_f16(nt__f64_to_f32_odd(d));
}

static inline uint8_t nt__f64_to_e4m3(double d)
{
    return nt__f32_to_e4m3(nt__f64_to_f32_odd(d));
}

static inline uint8_t nt__f64_to_e5m2(double d)
{
    return nt__f32_to_e5m2(nt__f64_to_f32_odd(d));
}

/* Float to int: truncate toward zero, saturate, NaN -> 0. */
static inline int32_t nt__f64_to_i32(double d)
{
    if (isnan(d))
        return 0;
    if (d >= 2147483647.0)
        return INT32_MAX;
    if (d <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)d;
}

static inline uint8_t nt__f64_to_u8(double d)
{
    if (isnan(d) || d <= 0.0)
        return 0;
    if (d >= 255.0)
        return 255;
    return (uint8_t)d;
}

/* Per-dtype facts, one row per nt_dtype (a new dtype adds its row here,
 * its name in core/optable.c and its cases in the load/store switches
 * below; docs/ops.md "Dtypes" lists what each op takes).
 *   size       bytes per element
 *   is_float   floating (f32, bf16, f16, f64, e4m3, e5m2)
 *   on_device  the NeuronCore's engines have the datapath (f64, i64: no;
 *              bool: kept off the simulator too, whose kernels know u8
 *              masks; such tensors run on the CPU backend, docs/sim.md).
 *              fp8 is on the device but a storage dtype: only the ops
 *              core/ewise64.h lists take it (nt__dtype_all_ops). */
#define NT__DTYPE_TABLE(X)                                                                 \
    X(NT_F32, 4, 1, 1)                                                                     \
    X(NT_BF16, 2, 1, 1)                                                                    \
    X(NT_F16, 2, 1, 1)                                                                     \
    X(NT_I32, 4, 0, 1)                                                                     \
    X(NT_U8, 1, 0, 1)                                                                      \
    X(NT_F64, 8, 1, 0)                                                                     \
    X(NT_I64, 8, 0, 0)                                                                     \
    X(NT_BOOL, 1, 0, 0)                                                                    \
    X(NT_E4M3, 1, 1, 1)                                                                    \
    X(NT_E5M2, 1, 1, 1)

/* Float to i64: truncate toward zero, saturate, NaN -> 0 */
static inline int64_t nt__f64_to_i64(double d)
{
    if (isnan(d))
        return 0;
    if (d >= 9223372036854775807.0)
        return INT64_MAX;
    if (d <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)d;
}

/* i64 to i32 for index reads: saturating, so an index outside i32 stays
 * out of range (never wraps onto a valid row) */
static inline int32_t nt__i64_to_i32_sat(int64_t v)
{
    return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
}

static inline bool nt__dtype_is_float(nt_dtype dt)
{
    switch (dt) {
#define NT__DT_FLOAT(D, sz, fl, dev) case D: return fl;
        NT__DTYPE_TABLE(NT__DT_FLOAT)
#undef NT__DT_FLOAT
    default: return false;
    }
}

static inline bool nt__dtype_on_device(nt_dtype dt)
{
    switch (dt) {
#define NT__DT_DEV(D, sz, fl, dev) case D: return dev;
        NT__DTYPE_TABLE(NT__DT_DEV)
#undef NT__DT_DEV
    default: return false;
    }
}

/* Every op takes dt (the dispatcher asks core/ewise64.h's lists only about
 * the others: off-device dtypes and fp8). */
static inline bool nt__dtype_all_ops(nt_dtype dt)
{
    return nt__dtype_on_device(dt) && !nt__dtype_is_fp8(dt);
}

static inline size_t nt__dtype_size(nt_dtype dt)
{
    static const unsigned char sz[NT_DTYPE_COUNT] = {
#define NT__DT_SIZE(D, size, fl, dev) [D] = size,
        NT__DTYPE_TABLE(NT__DT_SIZE)
#undef NT__DT_SIZE
    };
    return (unsigned)dt < NT_DTYPE_COUNT ? sz[dt] : 0;
}

/* Element i of a typed buffer as float (for floating compute). */
static inline float nt__load_f32(const void *p, nt_dtype dt, int64_t i)
{
    switch (dt) {
    case NT_F32: return ((const float *)p)[i];
    case NT_BF16: return nt__bf16_to_f32(((const uint16_t *)p)[i]);
    case NT_F16: return nt__f16_to_f32(((const uint16_t *)p)[i]);
    case NT_I32: return (float)((const int32_t *)p)[i];
    case NT_U8: return (float)((const uint8_t *)p)[i];
    case NT_F64: return (float)((const double *)p)[i];
    case NT_I64: return (float)((const int64_t *)p)[i];
    case NT_BOOL: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    case NT_E4M3: return nt__e4m3_to_f32(((const uint8_t *)p)[i]);
    case NT_E5M2: return nt__e5m2_to_f32(((const uint8_t *)p)[i]);
    default: return 0.0f;
    }
}

/* Element i as double (exact for every dtype but i64 beyond 2^53). */
static inline double nt__load_f64(const void *p, nt_dtype dt, int64_t i)
{
    switch (dt) {
    case NT_I32: return (double)((const int32_t *)p)[i];
    case NT_U8: return (double)((const uint8_t *)p)[i];
    case NT_F64: return ((const double *)p)[i];
    case NT_I64: return (double)((const int64_t *)p)[i]; /* exact to 2^53 */
    default: return (double)nt__load_f32(p, dt, i);
    }
}

/* Element i as int32 (floats truncate/saturate, see nt__f64_to_i32). */
static inline int32_t nt__load_i32(const void *p, nt_dtype dt, int64_t i)
{
    switch (dt) {
    case NT_I32: return ((const int32_t *)p)[i];
    case NT_U8: return ((const uint8_t *)p)[i];
    case NT_F64: return nt__f64_to_i32(((const double *)p)[i]);
    case NT_I64: return nt__i64_to_i32_sat(((const int64_t *)p)[i]);
    case NT_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return nt__f64_to_i32((double)nt__load_f32(p, dt, i));
    }
}

/* Stores a float compute value, rounding once to dt. */
static inline void nt__store_f32(void *p, nt_dtype dt, int64_t i, float v)
{
    switch (dt) {
    case NT_F32: ((float *)p)[i] = nt__canon(v); break;
    case NT_BF16: ((uint16_t *)p)[i] = nt__f32_to_bf16(v); break;
    case NT_F16: ((uint16_t *)p)[i] = nt__f32_to_f16(v); break;
    case NT_I32: ((int32_t *)p)[i] = nt__f64_to_i32((double)v); break;
    case NT_U8: ((uint8_t *)p)[i] = nt__f64_to_u8((double)v); break;
    case NT_F64: ((double *)p)[i] = nt__canon64((double)v); break;
    case NT_I64: ((int64_t *)p)[i] = nt__f64_to_i64((double)v); break;
    case NT_BOOL: ((uint8_t *)p)[i] = v != 0.0f; break; /* NaN is true */
    case NT_E4M3: ((uint8_t *)p)[i] = nt__f32_to_e4m3(v); break;
    case NT_E5M2: ((uint8_t *)p)[i] = nt__f32_to_e5m2(v); break;
    default: break;
    }
}

/* Stores a double with a single rounding to dt. */
static inline void nt__store_f64(void *p, nt_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case NT_F32: ((float *)p)[i] = nt__canon((float)v); break;
    case NT_BF16: ((uint16_t *)p)[i] = nt__f64_to_bf16(v); break;
    case NT_F16: ((uint16_t *)p)[i] = nt__f64_to_f16(v); break;
    case NT_I32: ((int32_t *)p)[i] = nt__f64_to_i32(v); break;
    case NT_U8: ((uint8_t *)p)[i] = nt__f64_to_u8(v); break;
    case NT_F64: ((double *)p)[i] = nt__canon64(v); break;
    case NT_I64: ((int64_t *)p)[i] = nt__f64_to_i64(v); break;
    case NT_BOOL: ((uint8_t *)p)[i] = v != 0.0; break;
    case NT_E4M3: ((uint8_t *)p)[i] = nt__f64_to_e4m3(v); break;
    case NT_E5M2: ((uint8_t *)p)[i] = nt__f64_to_e5m2(v); break;
    default: break;
    }
}

/* Stores an int compute value: ints wrap (two's complement, like C casts of
 * unsigned), floats round to nearest even from the exact integer. */
static inline void nt__store_i32(void *p, nt_dtype dt, int64_t i, int32_t v)
{
    switch (dt) {
    case NT_I32: ((int32_t *)p)[i] = v; break;
    case NT_U8: ((uint8_t *)p)[i] = (uint8_t)(uint32_t)v; break;
    case NT_I64: ((int64_t *)p)[i] = v; break;
    case NT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: nt__store_f64(p, dt, i, (double)v); break;
    }
}

/* Promotion for binary ops: float beats int; f64 beats every other type;
 * f32 beats half types; bf16 with f16 gives f32; among integers i64 beats
 * i32 beats u8 beats bool (PyTorch's). */
static inline nt_dtype nt__promote(nt_dtype a, nt_dtype b)
{
    if (a == b)
        return a;
    if (a == NT_F64 || b == NT_F64)
        return NT_F64;
    bool fa = nt__dtype_is_float(a), fb = nt__dtype_is_float(b);
    if (fa && fb)
        return NT_F32; /* f32 with a half type, or bf16 with f16 */
    if (fa)
        return a;
    if (fb)
        return b;
    if (a == NT_I64 || b == NT_I64)
        return NT_I64;
    if (a == NT_I32 || b == NT_I32)
        return NT_I32;
    return NT_U8; /* u8 with bool */
}

/* ---------------- stochastic rounding (amp, docs/amp.md) ----------------
 *
 * An f32 -> bf16 / f16 cast with stochastic rounding (NT_STOCHASTIC_ROUNDING=1
 * or nt_cast_sr) rounds each element to one of the two neighbouring values,
 * up in magnitude with probability equal to the distance to the lower one
 * over the gap: add uniformly random bits just below the last bit kept, then
 * truncate.  The random bits of an element depend only on
 * (seed, the CAST record's stream id and seq, the element's row-major index
 * in the cast's output), never on the kernel that runs it, so every path
 * (CPU kernel, fused CPU program, simulator) produces the same bits. */

/* nt__params.flag bit of a CAST record that rounds stochastically; its seed
 * is in nt__params.seed. */
#define NT__CAST_SR 1

static inline uint64_t nt__sr_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* The key of one CAST record: a mix of the seed, then of the record's
 * (stream id, seq) packed as the streams pack them (id << 48 | seq). */
static inline uint64_t nt__sr_key(uint64_t seed, uint32_t stream_id, uint64_t seq)
{
    uint64_t s = nt__sr_mix(seed ^ UINT64_C(0x73746f6368617374)); /* "stochast" */
    return nt__sr_mix(s ^ (((uint64_t)stream_id << 48) | (seq & ((UINT64_C(1) << 48) - 1))));
}

/* 32 random bits of element i (row-major index in the cast's output). */
static inline uint32_t nt__sr_bits(uint64_t key, uint64_t i)
{
    return (uint32_t)(nt__sr_mix(key + (i + 1) * UINT64_C(0x9e3779b97f4a7c15)) >> 32);
}

/* f32 -> bf16: add the top 16 bits of r to the 16 bits that bf16 drops,
 * truncate.  Finite values past the largest bf16 may round to Inf (with the
 * probability of their distance to it); Inf stays Inf, -0 stays -0, NaN
 * becomes the canonical NaN. */
static inline uint16_t nt__f32_to_bf16_sr(float f, uint32_t r)
{
    uint32_t u = nt__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)NT__QNAN_BF16;
    return (uint16_t)((u + (r >> 16)) >> 16);
}

/* f32 -> f16: add the top 13 bits of r below f16's last bit, truncate.  In
 * f16's normal range the 13 dropped bits are exactly the f32 bits beyond
 * f16's precision, so the rounding is exactly unbiased.  Below 2^-14 (f16
 * subnormals, steps of 2^-24) the magnitude is first truncated to a multiple
 * of 2^-37, then the same 13 bits decide: unbiased to within 2^-37.
 * |f| >= 65536 and Inf give Inf; NaN the canonical NaN. */
static inline uint16_t nt__f32_to_f16_sr(float f, uint32_t r)
{
    uint32_t x = nt__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r13 = r >> 19;
    if (ax > 0x7f800000u)
        return (uint16_t)NT__QNAN_F16;
    if (ax >= 0x47800000u) /* >= 65536 (and Inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) /* normal in f16; a carry may reach 2^16 = Inf */
        return (uint16_t)(sign | ((ax - (112u << 23) + r13) >> 13));
    /* exact: a power-of-two scaling that stays below 2^23 */
    uint32_t q = (uint32_t)(nt__bits_f32(ax) * 0x1p37f);
    return (uint16_t)(sign | ((q + r13) >> 13));
}

/* Stores v into element i of a bf16 or f16 buffer with stochastic rounding
 * (random bits r); other dtypes round to nearest as nt__store_f32 does. */
static inline void nt__store_f32_sr(void *p, nt_dtype dt, int64_t i, float v, uint32_t r)
{
    switch (dt) {
    case NT_BF16: ((uint16_t *)p)[i] = nt__f32_to_bf16_sr(v, r); break;
    case NT_F16: ((uint16_t *)p)[i] = nt__f32_to_f16_sr(v, r); break;
    case NT_E4M3: ((uint8_t *)p)[i] = nt__f32_to_e4m3_sr(v, r); break;
    case NT_E5M2: ((uint8_t *)p)[i] = nt__f32_to_e5m2_sr(v, r); break;
    default: nt__store_f32(p, dt, i, v); break;
    }
}

/* The value as f32 after a stochastic rounding to dt (what storing it and
 * loading it back gives): for fused programs, which keep values in f32. */
static inline float nt__round_f32_sr(nt_dtype dt, float v, uint32_t r)
{
    switch (dt) {
    case NT_BF16: return nt__bf16_to_f32(nt__f32_to_bf16_sr(v, r));
    case NT_F16: return nt__f16_to_f32(nt__f32_to_f16_sr(v, r));
    case NT_E4M3: return nt__e4m3_to_f32(nt__f32_to_e4m3_sr(v, r));
    case NT_E5M2: return nt__e5m2_to_f32(nt__f32_to_e5m2_sr(v, r));
    default: return nt__canon(v);
    }
}

/* Element i as int64 (integers exactly; floats truncate and saturate) and
 * an int64 stored with one rounding (floats), wrapping (narrower ints) or
 * v != 0 (bool): the integer path of i64 ops (cpu/ewise.c). */
static inline int64_t nt__load_i64(const void *p, nt_dtype dt, int64_t i)
{
    switch (dt) {
    case NT_I64: return ((const int64_t *)p)[i];
    case NT_I32: return ((const int32_t *)p)[i];
    case NT_U8: return ((const uint8_t *)p)[i];
    case NT_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return nt__f64_to_i64(nt__load_f64(p, dt, i));
    }
}

static inline void nt__store_i64(void *p, nt_dtype dt, int64_t i, int64_t v)
{
    switch (dt) {
    case NT_I64: ((int64_t *)p)[i] = v; break;
    case NT_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case NT_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break;
    case NT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case NT_F64: ((double *)p)[i] = (double)v; break;
    case NT_F32: ((float *)p)[i] = (float)v; break;
    default: nt__store_f32(p, dt, i, (float)v); break; /* bf16, f16: through f32, as PyTorch */
    }
}

/* Block conversions (core/convert.c): n elements at stride (in elements)
 * to/from f32 or i32 registers. */
void nt__ld_f32(float *dst, const char *src, nt_dtype dt, int64_t stride, int64_t n);
void nt__st_f32(char *dst, nt_dtype dt, int64_t stride, const float *src, int64_t n);
/* out[i] = y[i] rounded to float dtype dt and widened back (what storing
 * and loading it gives; f32: NaN made canonical), unit stride; out may be
 * y. */
void nt__settle_f32(float *out, nt_dtype dt, const float *y, int64_t n);
void nt__ld_i32(int32_t *dst, const char *src, nt_dtype dt, int64_t stride, int64_t n);
void nt__st_i32(char *dst, nt_dtype dt, int64_t stride, const int32_t *src, int64_t n);

/* dst[k][m] = src[m * ms + k * ks] for k < K, m < M, widened exactly to f32
 * (ldd: dst's row stride; es: the source's element size): the matmul
 * operand packing.  When the source runs along k, blocks of 32 x 32 go
 * through a small buffer, so both sides stream instead of one striding. */
void nt__mm_pack(float *dst, int64_t ldd, const char *src, nt_dtype dt, int64_t es, int64_t K,
                 int64_t M, int64_t ks, int64_t ms);

#endif
