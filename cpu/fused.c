/* cpu/fused.c - the CPU backend's fused-program executor (run_fused).
 *
 * Every value lives in a register block, already rounded the way its op
 * would have stored it: floating dtypes as the f32 of the rounded value,
 * integer dtypes as the stored int.  An op reads its operands exactly as the
 * unfused kernel would have loaded them from memory (f32 widening, (float)
 * of an int) and computes through the same core/ewise.h definitions, so the
 * fused result has the bits of the ops run one by one. */
#include "cpu/cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "fusion/ir.h"
#include "core/gemm.h"
#include "core/ewise.h"
#include "core/reduce.h"
#include "cpu/subnormal.h"

/* elements per chunk of an EW program: 2048 (8 KiB registers; a chain of a
 * few registers and its input stay in L1) halved the per-op call overhead
 * of 1024 and took 5% off the 8-op chain's CPU time; 4096 spilled L1 */
#define CH 2048
/* elements per chunk of a row program's full-row ops: its rows are L2
 * resident already, and smaller chunks spread its prefetch finer (1024
 * measured faster than 2048 on softmax) */
#define ROW_CH 1024
/* elements per subnormal test (cpu/subnormal.h): a few vectors */
#define SN_BLK 64

/* A register: CH values and a cache line of padding, so that registers (and
 * the inputs read in place) are not 4 KiB apart: loads and stores at the
 * same address bits modulo 4 KiB stall on each other (4K aliasing). */
typedef union {
    float f[CH + 16];
    int32_t i[CH + 16];
} blk;

static inline bool isf(nt_dtype dt) { return nt__dtype_is_float(dt); }

/* v, or 1.0 where the mask k is all ones (an integer select: it vectorises,
 * a float ?: does not under -ftrapping-math) */
static inline float sel1(float v, uint32_t k)
{
    return nt__bits_f32((nt__f32_bits(v) & ~k) | (0x3f800000u & k));
}

/* An operand as the op sees it: n values or one broadcast value. */
typedef struct {
    const void *p;
    nt_dtype dt;
    bool scalar;
} opnd;

static void to_f32(float *dst, const opnd *o, int64_t n)
{
    if (isf(o->dt)) {
        const float *s = o->p;
        if (o->scalar)
            for (int64_t i = 0; i < n; i++)
                dst[i] = s[0];
        else
            memcpy(dst, s, (size_t)n * sizeof(float));
    } else {
        const int32_t *s = o->p;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)s[o->scalar ? 0 : i];
    }
}

static void to_i32(int32_t *dst, const opnd *o, int64_t n)
{
    /* integer ops only ever see integer operands */
    const int32_t *s = o->p;
    for (int64_t i = 0; i < n; i++)
        dst[i] = s[o->scalar ? 0 : i];
}

/* The ops a row program computes as a reduction of its row: the
 * reductions whose recipe (core/optable.h's NT_OPF_RED) is a sum, max or
 * min of the elements as they are, perhaps over their count. */
static inline bool row_reduces(int op)
{
    int rop, pre, fin;
    return nt__op_red(op, &rop, &pre, &fin) &&
           (rop == NT_RED_SUM || rop == NT_RED_MAX || rop == NT_RED_MIN) &&
           pre == NT_RED_PRE_NONE && (fin == NT_RED_FIN_NONE || fin == NT_RED_FIN_MEAN);
}

/* A row program's reduction of one contiguous f32 row of C elements, as
 * the unfused kernel computes it (row_span and row_span_tiled share it). */
static float row_reduce(int op, const float *row, int64_t C)
{
    int rop, pre, fin;
    nt__op_red(op, &rop, &pre, &fin);
    float v = rop == NT_RED_MAX   ? nt__red_max_f32(row, C, 1)
              : rop == NT_RED_MIN ? nt__red_min_f32(row, C, 1)
                                  : nt__red_sum_f32(row, C, 1);
    return fin == NT_RED_FIN_MEAN ? v / (float)C : v;
}

/* Rounds an f32 compute result to the value's dtype, as storing it and
 * loading it back would.  `out` may be `y` (in place). */

static void settle_f(void *out, nt_dtype dt, float *y, int64_t n)
{
    switch (dt) {
    case NT_F32:
    case NT_BF16:
    case NT_F16: /* core/convert.c: vector forms of the element rules */
    case NT_E4M3:
    case NT_E5M2:
        nt__settle_f32(out, dt, y, n);
        break;
    case NT_I32:
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)out)[i] = nt__f64_to_i32((double)y[i]);
        break;
    case NT_U8:
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)out)[i] = nt__f64_to_u8((double)y[i]);
        break;
    default: break;
    }
}

static void settle_i(void *out, nt_dtype dt, const int32_t *y, int64_t n)
{
    switch (dt) {
    case NT_I32:
        if (out != y)
            memcpy(out, y, (size_t)n * sizeof(int32_t));
        break;
    case NT_U8:
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)out)[i] = (uint8_t)(uint32_t)y[i];
        break;
    default: /* an exact integer rounded once to a float dtype */
        for (int64_t i = 0; i < n; i++) {
            char tmp[8] = {0};
            nt__store_f64(tmp, dt, 0, (double)y[i]);
            ((float *)out)[i] = nt__load_f32(tmp, dt, 0);
        }
        break;
    }
}

/* An operand as f32 / i32 values: registers of that class are used in
 * place; anything else is converted into tmp. */
static const float *as_f32(const opnd *o, float *tmp, int64_t n)
{
    if (isf(o->dt) && !o->scalar)
        return o->p;
    to_f32(tmp, o, n);
    return tmp;
}

static const int32_t *as_i32(const opnd *o, int32_t *tmp, int64_t n)
{
    if (!o->scalar)
        return o->p;
    to_i32(tmp, o, n);
    return tmp;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define NT_FUSED_X86 1
#include <immintrin.h>

/* calls of the AVX-512 passes on this thread still to run with the
 * subnormal test (sn_pick512) */
static _Thread_local int sn_tested;
#define SN_TESTED_CALLS 1024
#endif

/* nt__fused_cpu_set_routes (tests): chains in registers; the subnormal
 * test of the AVX-512 passes (0: after a subnormal operand, > 0: always,
 * < 0: never, and no switch after one) */
static atomic_bool route_chains = true;
static atomic_int route_sn_test = 0;

void nt__fused_cpu_set_routes(bool chains, int sn_test)
{
    atomic_store(&route_chains, chains);
    atomic_store(&route_sn_test, sn_test);
}

/* chunks run as chains in registers, and of those computed again by the
 * per-op passes (a tiny result) */
static atomic_uint_fast64_t chain_chunks, chain_redone;

void nt__fused_cpu_route_counts(uint64_t *chunks, uint64_t *redone)
{
    *chunks = atomic_load(&chain_chunks);
    *redone = atomic_load(&chain_redone);
}

#ifdef NT_FUSED_X86
/* An untested pass met a subnormal operand (MXCSR.DE): this thread's next
 * SN_TESTED_CALLS passes test operands instead (where one is, more are
 * likely, and each took an assist) -- unless this CPU's assists are cheap
 * (cpu/subnormal.c), where the plain operations are the faster route */
static void sn_met(void)
{
    if (atomic_load_explicit(&route_sn_test, memory_order_relaxed) == 0 &&
        !nt__sn_assists_cheap())
        sn_tested = SN_TESTED_CALLS;
}
#endif

#ifdef NT_FUSED_X86

/* AVX-512 level: y = x * z or x / z (z == NULL: by s) over n elements,
 * NaN made canonical when `canon`, in one pass that takes no microcode
 * assist: it runs with MXCSR's FTZ set, and DAZ where `test`.  Those change
 * a result only through a subnormal operand (an exponent-bits test notes
 * every one) or a tiny result (MXCSR.UE notes every one under FTZ); when
 * neither happened the results are IEEE's and true is returned.  Otherwise
 * false, and the caller computes the block exactly (cpu/subnormal.h).
 * Costs two mask uops an operand vector, where the full integer test of the
 * exponents (subnormal operand or result) cost more (measured: the 8-op
 * chain of bench/fusion 1.45x slower).  With `ieee` (this CPU's assists
 * are cheap, cpu/subnormal.c) the pass runs the plain IEEE operations,
 * neither flag set, and is always exact. */
static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) bool
sn_fast512_body(bool mul, bool zvec, const float *x, const float *z, float s, float *y, int64_t n,
                bool canon, bool stream, bool test, bool ieee)
{
    if (!ieee && !zvec && nt__sn_sub(nt__sn_abs(s)))
        return false; /* a subnormal scalar: every element is the exact path's */
    const unsigned csr = _mm_getcsr();
    /* flags clear; FTZ [and DAZ] unless ieee */
    _mm_setcsr((csr & ~0x807fu) | (ieee ? 0u : test ? 0x8040u : 0x8000u));
    __asm__ volatile("" ::: "memory");
    const __m512 vs = _mm512_set1_ps(s);
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i qnan = _mm512_set1_epi32((int)NT__QNAN_F32);
    const __m512i expm = _mm512_set1_epi32(0x7f800000), mantm = _mm512_set1_epi32(0x007fffff);
    __mmask16 den = 0;
    /* subnormal lanes: exponent bits 0, mantissa not (vfpclassps would see
     * zeros: it honours DAZ) */
#define SN_SUBNORMAL(v)                                                                    \
    _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(_mm512_castps_si512(v), expm),     \
                                _mm512_castps_si512(v), mantm)
    /* full vectors, then the tail under a mask (masked stores cost more) */
#define SN_FAST_VEC(LOAD, STORE)                                                           \
    do {                                                                                   \
        __m512 a = LOAD(x + i), b = zvec ? LOAD(z + i) : vs;                               \
        if (test)                                                                          \
            den |= SN_SUBNORMAL(a);                                                        \
        if (zvec && test)                                                                  \
            den |= SN_SUBNORMAL(b);                                                        \
        __m512 r = mul ? _mm512_mul_ps(a, b) : _mm512_div_ps(a, b);                        \
        if (canon) {                                                                       \
            __m512i u = _mm512_castps_si512(r);                                            \
            __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absm), inf);       \
            r = _mm512_castsi512_ps(_mm512_mask_mov_epi32(u, nan, qnan));                  \
        }                                                                                  \
        STORE(y + i, r);                                                                   \
    } while (0)
#define SN_TAIL_LOAD(p) _mm512_maskz_loadu_ps(m, (p))
#define SN_TAIL_STORE(p, r) _mm512_mask_storeu_ps((p), m, (r))
    int64_t i = 0;
    if (stream) /* y 64-byte aligned: one whole line a store */
        for (; i + 16 <= n; i += 16)
            SN_FAST_VEC(_mm512_loadu_ps, _mm512_stream_ps);
    else
        for (; i + 16 <= n; i += 16)
            SN_FAST_VEC(_mm512_loadu_ps, _mm512_storeu_ps);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        SN_FAST_VEC(SN_TAIL_LOAD, SN_TAIL_STORE);
    }
#undef SN_FAST_VEC
#undef SN_SUBNORMAL
#undef SN_TAIL_LOAD
#undef SN_TAIL_STORE
    __asm__ volatile("" ::: "memory");
    const unsigned flags = _mm_getcsr();
    _mm_setcsr(csr);
    if (ieee)
        return true;
    if (!test && (flags & 0x02u)) /* 0x02: a subnormal operand, which took an assist */
        sn_met();
    return !den && !(flags & 0x10u); /* 0x10: underflow */
}

/* One instantiation of sn_fast512_body per (* or /, by z or by s, canon),
 * each with its flags constant: no test of them per vector. */
static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) bool
sn_pick512t(bool mul, const float *x, const float *z, float s, float *y, int64_t n, bool canon,
            bool stream, bool test, bool ieee)
{
    bool tensor = z != NULL;
    switch (mul * 4 + tensor * 2 + canon) {
    case 7: return sn_fast512_body(true, true, x, z, s, y, n, true, stream, test, ieee);
    case 6: return sn_fast512_body(true, true, x, z, s, y, n, false, stream, test, ieee);
    case 5: return sn_fast512_body(true, false, x, z, s, y, n, true, stream, test, ieee);
    case 4: return sn_fast512_body(true, false, x, z, s, y, n, false, stream, test, ieee);
    case 3: return sn_fast512_body(false, true, x, z, s, y, n, true, stream, test, ieee);
    case 2: return sn_fast512_body(false, true, x, z, s, y, n, false, stream, test, ieee);
    case 1: return sn_fast512_body(false, false, x, z, s, y, n, true, stream, test, ieee);
    default: return sn_fast512_body(false, false, x, z, s, y, n, false, stream, test, ieee);
    }
}

/* The untested pass unless a recent one on this thread met a subnormal
 * operand (sn_tested counts the calls left to test): where subnormals are
 * common, testing for them costs less than the assists.  Where the assists
 * are cheap, the plain IEEE pass (unless a test forces the tested one). */
static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) bool
sn_pick512(bool mul, const float *x, const float *z, float s, float *y, int64_t n, bool canon,
           bool stream)
{
    const int mode = atomic_load_explicit(&route_sn_test, memory_order_relaxed);
    if ((sn_tested && mode == 0) || mode > 0) {
        sn_tested -= sn_tested > 0;
        return sn_pick512t(mul, x, z, s, y, n, canon, stream, true, false);
    }
    return sn_pick512t(mul, x, z, s, y, n, canon, stream, false, nt__sn_assists_cheap());
}

__attribute__((target(NT_TARGET_AVX512))) static bool
sn_fast512(bool mul, const float *x, const float *z, float s, float *y, int64_t n, bool canon)
{
    return sn_pick512(mul, x, z, s, y, n, canon, false);
}

/* sn_fast512 with streaming stores: y 64-byte aligned, n a multiple of 16 */
__attribute__((target(NT_TARGET_AVX512))) static bool
sn_stream512(bool mul, const float *x, const float *z, float s, float *y, int64_t n, bool canon)
{
    return sn_pick512(mul, x, z, s, y, n, canon, true);
}
#endif

/* One evaluation of one op over n elements (eval_body below): its operands
 * and buffers, shared by the helpers of each op family.  Every helper is
 * always_inline into eval_body, itself inlined once per ISA level, so the
 * loops are compiled as if written in one function: each helper copies the
 * fields it uses into locals first. */
typedef struct eval_job {
    const nt__fop *o;
    nt_dtype odt;
    const opnd *a;
    void *out;
    int64_t n;
    float *t0, *t1, *t2, *t3; /* scratch: 4 chunks of n */
    float *y;                 /* an f32 compute result: `out`, else t3 */
    int32_t *yi;              /* an integer compute result: t3, else `out` */
    bool fc;                  /* computed in float (an operand or the result is) */
    bool cf;                  /* an f32 result's NaNs made canonical here */
} eval_job;

#define EVAL_INLINE static inline __attribute__((always_inline))

/* F32_LOOP(E): y[i] = E for every i < n; an f32 result is canonicalised in
 * the same pass (y is `out`), any other dtype is rounded by settle_f after
 * it.  Reads the locals n, y and cf. */
#define F32_LOOP(E)                                                                        \
    do {                                                                                   \
        if (cf)                                                                            \
            for (int64_t i = 0; i < n; i++)                                                \
                y[i] = nt__canon(E);                                                       \
        else                                                                               \
            for (int64_t i = 0; i < n; i++)                                                \
                y[i] = (E);                                                                \
    } while (0)

/* SN_LOOP(RISK, E, F64): F32_LOOP for an op that takes a microcode assist
 * on subnormals (cpu/subnormal.h).  RISK is an integer test of element i's
 * operand bits; E(k) the op on operands that are replaced by 1.0 where k is
 * all ones (sel1: such lanes never reach the f32 unit with a subnormal,
 * and one pass does test and op).  Then, only where RISK held somewhere,
 * the blocks of SN_BLK elements where it held are recomputed by F64(i0,
 * len), through f64: the same bits as the f32 op, at a small fraction of
 * the assists' cost.  Reads the locals n, y and cf. */
#define SN_LOOP(RISK, E, F64)                                                              \
    do {                                                                                   \
        uint32_t risk = 0;                                                                 \
        if (cf)                                                                            \
            for (int64_t i = 0; i < n; i++) {                                              \
                uint32_t k = 0u - (uint32_t)(RISK);                                        \
                risk |= k;                                                                 \
                y[i] = nt__canon(E(k));                                                    \
            }                                                                              \
        else                                                                               \
            for (int64_t i = 0; i < n; i++) {                                              \
                uint32_t k = 0u - (uint32_t)(RISK);                                        \
                risk |= k;                                                                 \
                y[i] = E(k);                                                               \
            }                                                                              \
        if (!risk)                                                                         \
            break;                                                                         \
        for (int64_t i0 = 0; i0 < n; i0 += SN_BLK) {                                       \
            int64_t i1 = n - i0 < SN_BLK ? n : i0 + SN_BLK;                                \
            uint32_t r = 0;                                                                \
            for (int64_t i = i0; i < i1; i++)                                              \
                r |= (RISK);                                                               \
            if (!r)                                                                        \
                continue;                                                                  \
            F64(i0, i1 - i0);                                                              \
            if (cf)                                                                        \
                for (int64_t i = i0; i < i1; i++)                                          \
                    y[i] = nt__canon(y[i]);                                                \
        }                                                                                  \
    } while (0)

/* an f32 compute result y rounded to a float output dtype other than f32 */
EVAL_INLINE void eval_settle(const eval_job *e)
{
    if (e->odt != NT_F32)
        settle_f(e->out, e->odt, e->y, e->n);
}

#ifdef NT_FUSED_X86
/* AVX-512 level: x * s and x / s, by a tensor-scalar op's scalar or a
 * binary op's second operand when that is one broadcast value (a row's
 * sum): the ops whose primitive (core/optable.h) is * or /.  False: not
 * such an op, nothing written. */
EVAL_INLINE bool eval_by_scalar512(const eval_job *e)
{
    const nt__fop *o = e->o;
    const opnd *a = e->a;
    const nt__prim prim = nt__op_prim(o->op);
    const nt__opkind kind = nt__ops[o->op].kind;
    if (!e->fc || (prim != NT__PRIM_MUL && prim != NT__PRIM_DIV) ||
        !(kind == NT_KIND_SCALAR || (kind == NT_KIND_BINARY && a[1].scalar && isf(a[1].dt))))
        return false;
    const int64_t n = e->n;
    float *const y = e->y;
    const bool cf = e->cf, mul = prim == NT__PRIM_MUL;
    float s0 = kind == NT_KIND_SCALAR ? (float)o->p.f[0] : *(const float *)a[1].p;
    const float *x = as_f32(&a[0], e->t0, n);
    if (!sn_fast512(mul, x, NULL, s0, y, n, cf)) {
        uint32_t bound = mul ? nt__sn_mul_bound(s0) : nt__sn_div_bound(s0);
#define SN_MULS(i0, len) nt__sn_mul_f64(y + (i0), x + (i0), &s0, true, (len))
#define SN_DIVS(i0, len) nt__sn_div_f64(y + (i0), x + (i0), &s0, true, (len))
#define SN_EMULS(k) (sel1(x[i], k) * s0)
#define SN_EDIVS(k) (sel1(x[i], k) / s0)
        if (mul)
            SN_LOOP(nt__sn_abs(x[i]) - 1u < bound, SN_EMULS, SN_MULS);
        else
            SN_LOOP(nt__sn_abs(x[i]) - 1u < bound, SN_EDIVS, SN_DIVS);
#undef SN_EMULS
#undef SN_EDIVS
#undef SN_MULS
#undef SN_DIVS
    }
    eval_settle(e);
    return true;
}

/* AVX-512 level: x * z and x / z of two float tensors (primitive * or /).
 * False: not such an op, nothing written. */
EVAL_INLINE bool eval_binary512(const eval_job *e, const float *x, const float *z)
{
    const nt__prim prim = nt__op_prim(e->o->op);
    if (prim != NT__PRIM_MUL && prim != NT__PRIM_DIV)
        return false;
    const int64_t n = e->n;
    float *const y = e->y;
    const bool cf = e->cf;
    if (!sn_fast512(prim == NT__PRIM_MUL, x, z, 0.0f, y, n, cf)) {
#define SN_MUL(i0, len) nt__sn_mul_f64(y + (i0), x + (i0), z + (i0), false, (len))
#define SN_DIV(i0, len) nt__sn_div_f64(y + (i0), x + (i0), z + (i0), false, (len))
#define SN_EMUL(k) (sel1(x[i], k) * sel1(z[i], k))
#define SN_EDIV(k) (sel1(x[i], k) / sel1(z[i], k))
        if (prim == NT__PRIM_MUL)
            SN_LOOP(nt__sn_mul_risk(nt__sn_abs(x[i]), nt__sn_abs(z[i])), SN_EMUL, SN_MUL);
        else
            SN_LOOP(nt__sn_div_risk(nt__sn_abs(x[i]), nt__sn_abs(z[i])), SN_EDIV, SN_DIV);
#undef SN_EMUL
#undef SN_EDIV
#undef SN_MUL
#undef SN_DIV
    }
    eval_settle(e);
    return true;
}
#endif

EVAL_INLINE void eval_fill(const eval_job *e)
{
    const int64_t n = e->n;
    char tmp[8] = {0};
    nt__store_f64(tmp, e->odt, 0, e->o->p.f[0]);
    if (isf(e->odt)) {
        float v = nt__load_f32(tmp, e->odt, 0);
        for (int64_t i = 0; i < n; i++)
            ((float *)e->out)[i] = v;
    } else {
        int32_t v = nt__load_i32(tmp, e->odt, 0);
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)e->out)[i] = v;
    }
}

EVAL_INLINE void eval_copy(const eval_job *e)
{
    const int64_t n = e->n;
    const nt_dtype odt = e->odt;
    float *const y = e->y;
    if (isf(e->a[0].dt)) {
        const float *x = as_f32(&e->a[0], e->t0, n);
        if (odt == NT_F32 && x != y) { /* copy and canonicalise in one pass */
            for (int64_t i = 0; i < n; i++)
                y[i] = nt__canon(x[i]);
            return;
        }
        if (isf(odt) && x != y)
            memcpy(y, x, (size_t)n * sizeof(float));
        settle_f(e->out, odt, isf(odt) ? y : (float *)x, n);
    } else {
        settle_i(e->out, odt, as_i32(&e->a[0], (int32_t *)e->t0, n), n);
    }
}

EVAL_INLINE void eval_unary(const eval_job *e)
{
    const nt__fop *o = e->o;
    const int64_t n = e->n;
    float *const y = e->y;
    int32_t *const yi = e->yi;
    const bool cf = e->cf;
    if (e->fc) {
        const float *x = as_f32(&e->a[0], e->t0, n);
        switch (o->op) {
#define NT__FU(ID, name, nin, kind, flags, ints, ...)                                       \
    NT__IF_FLOAT(ints, case NT_OP_##ID: F32_LOOP(nt__ew_##name(x[i])); break;)
            NT_OPS_UNARY(NT__FU)
#undef NT__FU
        default: nt__op_unhandled("fused cpu unary (float)", o->op);
        }
        eval_settle(e);
    } else {
        const int32_t *x = as_i32(&e->a[0], (int32_t *)e->t0, n);
        switch (o->op) {
#define NT__FUI(ID, name, nin, kind, flags, ints, ...)                                      \
    NT__IF_INT(ints, case NT_OP_##ID: for (int64_t i = 0; i < n; i++) yi[i] = nt__ewi_##name(x[i]); \
               break;)
            NT_OPS_UNARY(NT__FUI)
#undef NT__FUI
        default: nt__op_unhandled("fused cpu unary (int)", o->op);
        }
        settle_i(e->out, e->odt, yi, n);
    }
}

/* a tensor-scalar op: y = f(x, s0, s1) */
EVAL_INLINE void eval_tscalar(const eval_job *e)
{
    const nt__fop *o = e->o;
    const int64_t n = e->n;
    float *const y = e->y;
    int32_t *const yi = e->yi;
    const bool cf = e->cf;
    if (e->fc) {
        float s0 = (float)o->p.f[0], s1 = (float)o->p.f[1];
        const float *x = as_f32(&e->a[0], e->t0, n);
        switch (o->op) {
#define NT__FS(ID, name, nin, kind, flags, ...)                                                  \
    case NT_OP_##ID: F32_LOOP(nt__ew_##name(x[i], s0, s1)); break;
            NT_OPS_SCALAR(NT__FS)
#undef NT__FS
        default: nt__op_unhandled("fused cpu scalar (float)", o->op);
        }
        eval_settle(e);
    } else {
        int32_t s0 = nt__f64_to_i32(o->p.f[0]), s1 = nt__f64_to_i32(o->p.f[1]);
        const int32_t *x = as_i32(&e->a[0], (int32_t *)e->t0, n);
        switch (o->op) {
#define NT__FSI(ID, name, nin, kind, flags, ints, ...)                                      \
    NT__IF_INT(ints, case NT_OP_##ID:                                                       \
               for (int64_t i = 0; i < n; i++) yi[i] = nt__ewi_##name(x[i], s0, s1); break;)
            NT_OPS_SCALAR(NT__FSI)
#undef NT__FSI
        default: nt__op_unhandled("fused cpu scalar (int)", o->op);
        }
        settle_i(e->out, e->odt, yi, n);
    }
}

/* A float binary op of the public group whose second operand is one
 * broadcast value (a row's max): read once, not copied into a chunk first.
 * False: not such an op (the backward helpers), nothing written. */
EVAL_INLINE bool eval_binary_bcast(const eval_job *e)
{
    const nt__fop *o = e->o;
    const int64_t n = e->n;
    float *const y = e->y;
    const bool cf = e->cf;
    const float zs = *(const float *)e->a[1].p, *x = as_f32(&e->a[0], e->t0, n);
    switch (o->op) {
#define NT__FBS(ID, name, nin, kind, flags, ...)                                                 \
    case NT_OP_##ID: F32_LOOP(nt__ew_##name(x[i], zs)); break;
        NT_OPS_BINARY(NT__FBS)
#undef NT__FBS
    default: return false;
    }
    eval_settle(e);
    return true;
}

/* A float binary op of two operands of n values: the public group, the
 * backward helpers and the generic backwards. */
EVAL_INLINE void eval_binary_f(const eval_job *e, const float *x, const float *z)
{
    const nt__fop *o = e->o;
    const int64_t n = e->n;
    float *const y = e->y;
    const bool cf = e->cf;
    switch (o->op) {
#define NT__FB(ID, name, nin, kind, flags, ...)                                                  \
    case NT_OP_##ID: F32_LOOP(nt__ew_##name(x[i], z[i])); break;
        NT_OPS_BINARY(NT__FB)
        NT_OPS_EW_BWD(NT__FB)
#undef NT__FB
    case NT_OP_UNARY_BWD: {
        /* the forward op and its scalars */
        int f = (int)o->p.i[0];
        float s0 = (float)o->p.f[0], s1 = (float)o->p.f[1];
        F32_LOOP(nt__ew_unary_bwd(f, x[i], z[i], s0, s1));
        break;
    }
    case NT_OP_BINARY_DX: {
        int f = (int)o->p.i[0], which = (int)o->p.i[1]; /* forward op, d/da or d/db */
        F32_LOOP(nt__ew_binary_dx(f, which, x[i], z[i]));
        break;
    }
    default: nt__op_unhandled("fused cpu binary (float)", o->op);
    }
    eval_settle(e);
}

EVAL_INLINE void eval_binary(const eval_job *e, int lvl)
{
    const opnd *a = e->a;
    const int64_t n = e->n;
    (void)lvl; /* 2: AVX-512 */
    if (e->fc && a[1].scalar && isf(a[1].dt) && eval_binary_bcast(e))
        return;
    if (e->fc) {
        const float *x = as_f32(&a[0], e->t0, n), *z = as_f32(&a[1], e->t1, n);
#ifdef NT_FUSED_X86
        if (lvl == 2 && eval_binary512(e, x, z))
            return;
#endif
        eval_binary_f(e, x, z);
        return;
    }
    const nt__fop *o = e->o;
    int32_t *const yi = e->yi;
    const int32_t *x = as_i32(&a[0], (int32_t *)e->t0, n);
    const int32_t *z = as_i32(&a[1], (int32_t *)e->t1, n);
    switch (o->op) {
#define NT__FBI(ID, name, nin, kind, flags, ints, ...)                                      \
    NT__IF_INT(ints, case NT_OP_##ID:                                                       \
               for (int64_t i = 0; i < n; i++) yi[i] = nt__ewi_##name(x[i], z[i]); break;)
        NT_OPS_BINARY(NT__FBI)
#undef NT__FBI
    default: nt__op_unhandled("fused cpu binary (int)", o->op);
    }
    settle_i(e->out, e->odt, yi, n);
}

EVAL_INLINE void eval_cmp(const eval_job *e)
{
    const nt__fop *o = e->o;
    const opnd *a = e->a;
    const int64_t n = e->n;
    int32_t *r = (int32_t *)e->t2;
    if (isf(a[0].dt) || isf(a[1].dt)) {
        const float *x = as_f32(&a[0], e->t0, n), *z = as_f32(&a[1], e->t1, n);
        switch (o->op) {
#define NT__FC(ID, name, nin, kind, flags, ...)                                                  \
    case NT_OP_##ID:                                                                        \
        for (int64_t i = 0; i < n; i++)                                                     \
            r[i] = nt__ew_##name(x[i], z[i]);                                               \
        break;
            NT_OPS_CMP(NT__FC)
#undef NT__FC
        default: nt__op_unhandled("fused cpu compare (float)", o->op);
        }
    } else {
        const int32_t *x = as_i32(&a[0], (int32_t *)e->t0, n);
        const int32_t *z = as_i32(&a[1], (int32_t *)e->t1, n);
        switch (o->op) {
#define NT__FCI(ID, name, nin, kind, flags, ...)                                                 \
    case NT_OP_##ID:                                                                        \
        for (int64_t i = 0; i < n; i++)                                                     \
            r[i] = nt__ewi_##name(x[i], z[i]);                                              \
        break;
            NT_OPS_CMP(NT__FCI)
#undef NT__FCI
        default: nt__op_unhandled("fused cpu compare (int)", o->op);
        }
    }
    settle_i(e->out, e->odt, r, n);
}

EVAL_INLINE void eval_where(const eval_job *e)
{
    const opnd *a = e->a;
    const int64_t n = e->n;
    const float *m = as_f32(&a[0], e->t2, n); /* cond, as the kernel loads it */
    if (isf(e->odt)) {
        float *const y = e->y;
        const float *x = as_f32(&a[1], e->t0, n), *z = as_f32(&a[2], e->t1, n);
        for (int64_t i = 0; i < n; i++)
            y[i] = m[i] != 0.0f ? x[i] : z[i];
        settle_f(e->out, e->odt, y, n);
    } else {
        int32_t *const yi = e->yi;
        const int32_t *x = as_i32(&a[1], (int32_t *)e->t0, n);
        const int32_t *z = as_i32(&a[2], (int32_t *)e->t1, n);
        for (int64_t i = 0; i < n; i++)
            yi[i] = m[i] != 0.0f ? x[i] : z[i];
        settle_i(e->out, e->odt, yi, n);
    }
}
#undef F32_LOOP
#undef SN_LOOP

/* Evaluates one op over n elements into `out` (a register of the op's
 * output dtype, never one of its operands).  scratch: 4 * n floats.
 * Compiled once per vector ISA level (eval_isa below); the loops perform the
 * same IEEE operations at every width (-ffp-contract=off), so every level
 * gives the same bits. */
EVAL_INLINE void eval_body(const nt__fop *o, nt_dtype odt, const opnd *a, void *out, int64_t n,
                           float *scratch, bool canon, int lvl)
{
    bool fc = isf(odt);
    for (int k = 0; k < o->nin; k++)
        fc |= isf(a[k].dt);
    const eval_job e = {
        .o = o, .odt = odt, .a = a, .out = out, .n = n,
        .t0 = scratch, .t1 = scratch + n, .t2 = scratch + 2 * n, .t3 = scratch + 3 * n,
        /* an f32 result goes straight into a float register, else via t3 */
        .y = isf(odt) ? (float *)out : scratch + 3 * n,
        .yi = isf(odt) ? (int32_t *)(scratch + 3 * n) : (int32_t *)out,
        .fc = fc,
        /* an f32 result's NaNs made canonical here, unless plan_canon found
         * that only NaN-propagating ops read it */
        .cf = odt == NT_F32 && canon,
    };
    (void)lvl; /* 2: AVX-512, whose mul and div avoid subnormal assists */
#ifdef NT_FUSED_X86
    if (lvl == 2 && eval_by_scalar512(&e))
        return;
#endif
    switch (nt__ops[o->op].kind) {
    case NT_KIND_FILL: eval_fill(&e); return;
    case NT_KIND_COPY: eval_copy(&e); return;
    case NT_KIND_UNARY: eval_unary(&e); return;
    case NT_KIND_SCALAR: eval_tscalar(&e); return;
    case NT_KIND_BINARY: eval_binary(&e, lvl); return;
    case NT_KIND_CMP: eval_cmp(&e); return;
    case NT_KIND_WHERE: eval_where(&e); return;
    default: return;
    }
}

typedef void eval_fn(const nt__fop *o, nt_dtype odt, const opnd *a, void *out, int64_t n,
                     float *scratch, bool canon);

/* NT_CPU_ISA=scalar: the loops as written, one element at a time (the
 * reference the vector levels are tested against). */
#if defined(__clang__)
#define NT_FUSED_NOVEC /* clang has no optimize attribute: vector loops, same bits */
#else
#define NT_FUSED_NOVEC __attribute__((optimize("no-tree-vectorize")))
#endif
NT_FUSED_NOVEC static void
eval_scalar(const nt__fop *o, nt_dtype odt, const opnd *a, void *out, int64_t n, float *scratch,
            bool canon)
{
    eval_body(o, odt, a, out, n, scratch, canon, 0);
}

#ifdef NT_FUSED_X86
__attribute__((target("avx2,fma"))) static void
eval_avx2(const nt__fop *o, nt_dtype odt, const opnd *a, void *out, int64_t n, float *scratch,
          bool canon)
{
    eval_body(o, odt, a, out, n, scratch, canon, 1);
}

__attribute__((target(NT_TARGET_AVX512))) static void
eval_avx512(const nt__fop *o, nt_dtype odt, const opnd *a, void *out, int64_t n, float *scratch,
            bool canon)
{
    eval_body(o, odt, a, out, n, scratch, canon, 2);
}
#else
static void eval_vec(const nt__fop *o, nt_dtype odt, const opnd *a, void *out, int64_t n,
                     float *scratch, bool canon)
{
    eval_body(o, odt, a, out, n, scratch, canon, 0);
}
#endif

/* The evaluator of the ISA level the matmul uses (NT_CPU_ISA): one choice
 * for both, read once per kernel. */
static eval_fn *eval_isa(void)
{
    switch (nt__gemm_isa()) {
    case NT_ISA_SCALAR: return eval_scalar;
#ifdef NT_FUSED_X86
    case NT_ISA_AVX2: return eval_avx2;
    default: return eval_avx512;
#else
    default: return eval_vec;
#endif
    }
}

/* ---------------- stochastic rounding ---------------- */

/* A CAST op with NT__CAST_SR: its random bits come from its own record's
 * (seed, stream, seq), bound at run time (the cached program is shared by
 * every run), and from each element's row-major index in the cast's output,
 * so the bits are those of the unfused kernel. */
static bool is_sr(const nt__fop *o) { return o->op == NT_OP_CAST && (o->p.flag & NT__CAST_SR); }

static void sr_keys(const nt__fgroup *g, uint64_t *keys)
{
    const nt__fprog *P = g->prog;
    for (int k = 0; k < P->nops; k++)
        if (is_sr(&P->ops[k])) {
            const nt__rec *r = g->recs[k];
            keys[k] = nt__rec_sr_key(r);
        }
}

/* out[i] = x[i] rounded stochastically to odt; element i has index i0 + i. */
static void eval_sr(nt_dtype odt, const opnd *a, float *out, int64_t n, float *scratch,
                    uint64_t key, int64_t i0)
{
    const float *x = as_f32(&a[0], scratch, n);
    for (int64_t i = 0; i < n; i++)
        out[i] = nt__round_f32_sr(odt, x[i], nt__sr_bits(key, (uint64_t)(i0 + i)));
}

/* ---------------- memory views ---------------- */

typedef struct {
    char *data;
    nt_dtype dt;
    int64_t stride[NT_MAX_DIMS]; /* over the iteration shape */
} mview;

static void mview_of(mview *m, const nt_tensor *t, int ndim, const int64_t *shape)
{
    m->data = nt__tensor_data(t);
    m->dt = (nt_dtype)t->dtype;
    nt__bcast_strides(t, ndim, shape, m->stride);
}

static void load(void *reg, const mview *m, int64_t off, int64_t st, int64_t n)
{
    const char *p = m->data + off * (int64_t)nt__dtype_size(m->dt);
    if (isf(m->dt))
        nt__ld_f32(reg, p, m->dt, st, n);
    else
        nt__ld_i32(reg, p, m->dt, st, n);
}

static void store(const mview *m, int64_t off, int64_t st, const void *reg, nt_dtype vdt,
                  int64_t n)
{
    char *p = m->data + off * (int64_t)nt__dtype_size(m->dt);
    if (isf(vdt))
        nt__st_f32(p, m->dt, st, reg, n);
    else
        nt__st_i32(p, m->dt, st, reg, n);
}

static int64_t offset_of(const mview *m, const int64_t *idx, int ndim)
{
    int64_t o = 0;
    for (int i = 0; i < ndim; i++)
        o += idx[i] * m->stride[i];
    return o;
}

/* ---------------- registers ---------------- */

/* Registers by liveness: a value's register is taken when its op runs and
 * given back after its last reader, so a chain of n ops uses a few
 * registers instead of n, and the chunk's working set stays in L1.  An op's
 * output never shares a register with its operands (eval's contract); a
 * stored value holds its register to the end.  prev
 * (>= 0): a value that is there before op `from`.  Returns the count. */
static int plan_regs(const nt__fprog *P, int from, int prev, int8_t *reg)
{
    int last[NT_F_MAXVALS];
    bool busy[NT_F_MAXVALS] = {0};
    int n = 0;
    for (int v = 0; v < P->nvals; v++) {
        last[v] = P->vals[v].store >= 0 ? P->nops : -1;
        reg[v] = -1;
    }
    for (int k = from; k < P->nops; k++)
        for (int q = 0; q < P->ops[k].nin; q++)
            if (!NT_F_IS_EXT(P->ops[k].a[q]) && last[P->ops[k].a[q]] < k)
                last[P->ops[k].a[q]] = k;
    for (int k = from - 1; k < P->nops; k++) {
        int v = k < from ? prev : P->ops[k].out;
        if (v < 0)
            continue;
        int r = 0;
        while (busy[r])
            r++;
        busy[r] = true;
        reg[v] = (int8_t)r;
        n = r + 1 > n ? r + 1 : n;
        if (k >= from)
            for (int q = 0; q < P->ops[k].nin; q++) {
                int a = P->ops[k].a[q];
                if (!NT_F_IS_EXT(a) && last[a] == k)
                    busy[reg[a]] = false;
            }
        if (last[v] <= k) /* never read, never stored */
            busy[r] = false;
    }
    return n;
}

/* NaN canonicalisation once, not after every op.  An f32 value that is
 * not stored and whose every reader is one of the ops below is left as its
 * op computed it (canon[k] false): NaN or not exactly where the canonical
 * value is, and the same bits where it is not.  Each op below gives a NaN
 * whenever an operand is a NaN, whatever its sign and payload (IEEE
 * arithmetic; relu's a != a; nt__expf's clamps pass a NaN and its last
 * products keep it: the ops flagged NT_OPF_NANPROP in core/optable.h), and
 * otherwise reads only non-NaN operands, which are
 * the canonical ones' bits.  So a reader's result is NaN exactly where it
 * would be with canonical operands, and the same bits elsewhere: by
 * induction along the chain, the first op that canonicalises (a stored
 * value, or one read by any other op) gives the unfused bits.  The 8-op
 * chain of bench/fusion: 13% less CPU time. */
static bool nan_through(const nt__fop *o)
{
    return (nt__ops[o->op].flags & NT_OPF_NANPROP) != 0; /* the NANPROP flag */
}

static void plan_canon(const nt__fprog *P, int from, bool *canon)
{
    for (int k = 0; k < P->nops; k++) {
        int v = P->ops[k].out;
        canon[k] = true;
        if (k < from || P->vals[v].dtype != NT_F32 || P->vals[v].store >= 0)
            continue;
        bool loose = true;
        for (int r = k + 1; r < P->nops && loose; r++)
            for (int q = 0; q < P->ops[r].nin; q++)
                if (P->ops[r].a[q] == v && !nan_through(&P->ops[r]))
                    loose = false;
        canon[k] = !loose;
    }
}

/* The op that defines value v. */
static int def_op(const nt__fprog *P, int v)
{
    for (int k = 0; k < P->nops; k++)
        if (P->ops[k].out == v)
            return k;
    return 0;
}

/* Output slot sv may be computed straight into its memory (its op's
 * register is the output itself, no copy after): an f32 value into
 * contiguous f32 memory, whose storage no input and no other output shares
 * (an earlier write must not be seen by a later read of the chunk). */
static bool direct_out(const nt__fgroup *g, const mview *ov, int sv, int nd)
{
    const nt__fprog *P = g->prog;
    int v = P->out_val[sv];
    if (P->vals[v].dtype != NT_F32 || ov[sv].dt != NT_F32 || (nd && ov[sv].stride[nd - 1] != 1))
        return false;
    const nt__storage *st = g->out[sv]->st;
    for (int e = 0; e < P->next; e++)
        if (g->ext[e]->st == st)
            return false;
    for (int s = 0; s < P->nout; s++)
        if (s != sv && g->out[s]->st == st)
            return false;
    return true;
}

/* ---------------- EW (and MM epilogues) ---------------- */

/* An f32 output of at least this many bytes, far beyond both cores' L2,
 * is written with streaming stores: a store that misses first reads the
 * line it overwrites (a third transfer besides the input's read and the
 * output's write), a streaming one does not.  A later kernel then reads it
 * from memory instead of L3; smaller outputs stay cached. */
#define STREAM_MIN (8 << 20)

/* dst[0, n) = src[0, n), bit for bit, the aligned middle by streaming
 * stores (made visible by stream_fence before the span is reported done). */
static void stream_f32(float *dst, const float *src, int64_t n)
{
#ifdef NT_FUSED_X86
    int64_t i = 0;
    while (i < n && ((uintptr_t)(dst + i) & 31u))
        i++;
    memcpy(dst, src, (size_t)i * sizeof(float));
    for (; i + 8 <= n; i += 8)
        _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    memcpy(dst + i, src + i, (size_t)(n - i) * sizeof(float));
#else
    memcpy(dst, src, (size_t)n * sizeof(float));
#endif
}

static void stream_fence(void)
{
#ifdef NT_FUSED_X86
    _mm_sfence();
#endif
}

/* An f32 `*` or `/` (by a tensor or a scalar) of float operands, evaluated
 * at the AVX-512 level straight into its output memory dst by streaming
 * stores: no register pass and no copy after.  The same pass and test as
 * eval's (sn_fast512), so the same bits.  0: not such an op (nothing
 * written); 1: done; -1: the block needs the exact route, and dst holds
 * stray streamed lines (stream_fence them before rewriting dst). */
static int stream_direct(eval_fn *eval, const nt__fop *o, nt_dtype odt, const opnd *a, float *dst,
                         int64_t n, bool canon)
{
#ifdef NT_FUSED_X86
    if (eval != eval_avx512 || odt != NT_F32 || ((uintptr_t)dst & 63u) || n % 16 ||
        !isf(a[0].dt) || a[0].scalar)
        return 0;
    const nt__prim prim = nt__op_prim(o->op);
    const nt__opkind kind = nt__ops[o->op].kind;
    float s = 0.0f;
    const float *z = NULL;
    if ((prim != NT__PRIM_MUL && prim != NT__PRIM_DIV) ||
        (kind != NT_KIND_SCALAR && kind != NT_KIND_BINARY))
        return 0;
    if (kind == NT_KIND_SCALAR) {
        s = (float)o->p.f[0];
    } else if (!isf(a[1].dt)) {
        return 0;
    } else if (a[1].scalar) {
        s = *(const float *)a[1].p;
    } else {
        z = a[1].p;
    }
    return sn_stream512(prim == NT__PRIM_MUL, a[0].p, z, s, dst, n, canon) ? 1 : -1;
#else
    (void)eval, (void)o, (void)odt, (void)a, (void)dst, (void)n, (void)canon;
    return 0;
#endif
}

/* A row program's piece [j, j + n) of op o (operands aj, already at j):
 * the value a group output holds whole is written to its place dst + j -- straight, by
 * streaming stores, when the op can (stream_direct), else computed into
 * the L1 chunk cbuf and streamed out at once, so the stores overlap the
 * next piece's compute; any other value goes to out + j (dst NULL). */
static inline void row_piece(eval_fn *eval, const nt__fop *o, nt_dtype odt, const opnd *aj,
                             float *dst, float *out, int64_t j, int64_t n, float *cbuf,
                             float *scratch, bool canon)
{
    int sd;
    if (dst && (sd = stream_direct(eval, o, odt, aj, dst + j, n, canon)) <= 0) {
        if (sd < 0) /* stray streamed lines, rewritten below */
            stream_fence();
        eval(o, odt, aj, cbuf, n, scratch, canon);
        stream_f32(dst + j, cbuf, n);
    } else if (!dst) {
        eval(o, odt, aj, out + j, n, scratch, canon);
    }
}

/* ---------------- EW: a chain in vector registers ----------------
 *
 * Most elementwise programs are chains: each op reads the value of the op
 * before it and otherwise only inputs and scalars (the 8-op chain of
 * bench/fusion; bias + activation; AdamW's steps are not, their values fan
 * out).  At the AVX-512 level such a chain runs as one loop that keeps the
 * value in registers, 64 elements at a time, every op applied before the
 * next 64: one pass over memory instead of a pass over an L1 chunk per op
 * (the chain of bench/fusion took 8 loads, 8 stores and a call per op and
 * vector before).  Each op is the IEEE f32 operation of its core/ewise.h
 * definition (no contraction: -ffp-contract=off, and the intrinsics are the
 * operations themselves), NaN made canonical where plan_canon says, so the
 * bits are the per-op path's, with one exception handled by a test: the
 * loop runs with MXCSR.FTZ set (a tiny result would otherwise take a
 * microcode assist), which changes a result only when it is tiny, and then
 * MXCSR.UE is set; the chunk is then computed again by the per-op path,
 * exactly.  DAZ stays off, so a subnormal operand is used as it is (and
 * takes an assist: MXCSR.DE notes it, and the thread runs the per-op path,
 * which tests operands instead, for its next SN_TESTED_CALLS calls). */

/* the ops a chain may hold */
enum { LK_ADD, LK_SUB, LK_MUL, LK_DIV, LK_MAX, LK_MIN, LK_NEG, LK_RELU, LK_ABS, LK_COPY, LK_N };

/* An operand of a chain op besides the chain's value: LIN_NONE (unary), a
 * scalar (the op's own), or external input e (>= 0), read from memory or
 * broadcast along the row. */
#define LIN_NONE (-1)
#define LIN_SCALAR (-2)

typedef struct lin_op {
    uint8_t kind;  /* LK_* */
    uint8_t swap;  /* the chain's value is the second operand */
    uint8_t canon; /* make NaN canonical after it */
    int8_t other;  /* LIN_NONE, LIN_SCALAR, or an external input */
    float s;       /* LIN_SCALAR's value */
} lin_op;

typedef struct lin_prog {
    int nops;
    int8_t first; /* the external input the chain starts from */
    int8_t out;   /* the output slot of its last value */
    lin_op op[NT_F_MAXOPS];
} lin_prog;

/* A chunk's operands: src[e] for an input read in place (NULL: broadcast,
 * value bc[e]). */
typedef struct lin_io {
    const float *src[NT_F_MAXEXT];
    float bc[NT_F_MAXEXT];
} lin_io;

/* Is the EW program P (ops from 0, no epilogue input) such a chain?  Fills
 * L.  ev: the inputs' views; out slot `so` must be written directly
 * (direct or streamed). */
static bool lin_plan(const nt__fprog *P, const mview *ev, const bool *canon, lin_prog *L)
{
    int nd = P->ndim;
    if (P->kind != NT_FK_EW || P->nops < 1 || P->nout != 1)
        return false;
    for (int e = 0; e < P->next; e++) {
        int64_t st = nd ? ev[e].stride[nd - 1] : 1;
        if (ev[e].dt != NT_F32 || P->ext[e].dtype != NT_F32 || (st != 0 && st != 1))
            return false;
    }
    L->nops = P->nops;
    for (int k = 0; k < P->nops; k++) {
        const nt__fop *o = &P->ops[k];
        lin_op *l = &L->op[k];
        if (P->vals[o->out].dtype != NT_F32 || is_sr(o))
            return false;
        /* the value before this op: read by this op only, never stored */
        int acc = k ? P->ops[k - 1].out : -1;
        if (k && P->vals[acc].store >= 0)
            return false;
        int pos = -1; /* which operand is the chain's value */
        for (int q = 0; q < o->nin; q++) {
            if (NT_F_IS_EXT(o->a[q]))
                continue;
            if (o->a[q] != acc || pos >= 0)
                return false;
            pos = q;
        }
        if (k && pos < 0)
            return false;
        for (int r = k + 1; k && r < P->nops; r++)
            for (int q = 0; q < P->ops[r].nin; q++)
                if (P->ops[r].a[q] == acc)
                    return false;
        const nt__opkind kind = nt__ops[o->op].kind;
        /* the op's primitive (core/optable.h's NT_OPF_PRIM), or a copy */
        if (kind == NT_KIND_COPY) {
            l->kind = LK_COPY;
        } else if (kind == NT_KIND_UNARY || kind == NT_KIND_SCALAR || kind == NT_KIND_BINARY) {
            switch (nt__op_prim(o->op)) {
            case NT__PRIM_ADD: l->kind = LK_ADD; break;
            case NT__PRIM_SUB: l->kind = LK_SUB; break;
            case NT__PRIM_MUL: l->kind = LK_MUL; break;
            case NT__PRIM_DIV: l->kind = LK_DIV; break;
            case NT__PRIM_MAX: l->kind = LK_MAX; break;
            case NT__PRIM_MIN: l->kind = LK_MIN; break;
            case NT__PRIM_NEG: l->kind = LK_NEG; break;
            case NT__PRIM_RELU: l->kind = LK_RELU; break;
            case NT__PRIM_ABS: l->kind = LK_ABS; break;
            default: return false; /* no primitive, or one chains lack (not) */
            }
        } else {
            return false;
        }
        /* k == 0: the chain starts from operand 0, an input */
        if (!k) {
            if (!NT_F_IS_EXT(o->a[0]))
                return false;
            L->first = (int8_t)NT_F_EXT_IDX(o->a[0]);
            pos = 0;
        }
        l->swap = pos == 1;
        l->other = LIN_NONE;
        if (kind == NT_KIND_SCALAR) {
            l->other = LIN_SCALAR;
            l->s = (float)o->p.f[0];
        } else if (kind == NT_KIND_BINARY) {
            int q = 1 - pos;
            if (!NT_F_IS_EXT(o->a[q]))
                return false;
            l->other = (int8_t)NT_F_EXT_IDX(o->a[q]);
        } else if (o->nin != 1) {
            return false;
        }
        /* a copy's f32 result is always canonical (eval's COPY) */
        l->canon = canon[k] || l->kind == LK_COPY;
    }
    int last = P->ops[P->nops - 1].out;
    if (P->vals[last].store != 0 || P->out_val[0] != last)
        return false;
    L->out = 0;
    return true;
}

#ifdef NT_FUSED_X86
static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) __m512 lin_canon(__m512 r)
{
    __m512i u = _mm512_castps_si512(r);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(u, nan, _mm512_set1_epi32((int)NT__QNAN_F32)));
}

/* a (op) b, as core/ewise.h defines it */
static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) __m512
lin_bin(int kind, __m512 a, __m512 b)
{
    switch (kind) {
    case LK_ADD: return _mm512_add_ps(a, b);
    case LK_SUB: return _mm512_sub_ps(a, b);
    case LK_MUL: return _mm512_mul_ps(a, b);
    case LK_DIV: return _mm512_div_ps(a, b);
    case LK_MAX:
    case LK_MIN: {
        /* (a != a || b != b) ? a + b : (b > a ? b : a), or b < a for min */
        __mmask16 un = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
        __mmask16 pick = kind == LK_MAX ? _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ)
                                        : _mm512_cmp_ps_mask(b, a, _CMP_LT_OQ);
        __m512 r = _mm512_mask_mov_ps(a, pick, b);
        return _mm512_mask_add_ps(r, un, a, b);
    }
    default: return a;
    }
}

static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) __m512
lin_un(int kind, __m512 a)
{
    switch (kind) {
    case LK_NEG: /* -a: the sign bit flipped, NaN too */
        return _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32((int)0x80000000u)));
    case LK_RELU: { /* (a > 0 || a != a) ? a : 0 */
        __mmask16 k = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ) |
                      _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        return _mm512_maskz_mov_ps(k, a);
    }
    case LK_ABS: /* fabsf */
        return _mm512_castsi512_ps(
            _mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
    default: return a; /* LK_COPY */
    }
}

/* U vectors of the chain at element i (a tail: one vector under mask m).
 * v[] stays in registers: every index is a constant once unrolled. */
#define LIN_U 4
static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) void
lin_block(const lin_prog *L, const lin_io *io, int64_t i, __mmask16 m, bool tail, float *dst,
          bool stream)
{
    const int U = tail ? 1 : LIN_U;
    __m512 v[LIN_U];
    const float *s0 = io->src[L->first];
#define LIN_LD(p, u) (tail ? _mm512_maskz_loadu_ps(m, (p) + i) : _mm512_loadu_ps((p) + i + 16 * (u)))
    for (int u = 0; u < U; u++)
        v[u] = s0 ? LIN_LD(s0, u) : _mm512_set1_ps(io->bc[L->first]);
    for (int k = 0; k < L->nops; k++) {
        const lin_op *o = &L->op[k];
        const float *p = o->other >= 0 ? io->src[o->other] : NULL;
        const __m512 c = _mm512_set1_ps(o->other >= 0 ? io->bc[o->other] : o->s);
        /* one switch an op and block: each case a loop over the block */
#define LIN_BIN(K)                                                                         \
    case K:                                                                                \
        if (p && o->swap)                                                                  \
            for (int u = 0; u < U; u++)                                                    \
                v[u] = lin_bin(K, LIN_LD(p, u), v[u]);                                     \
        else if (p)                                                                        \
            for (int u = 0; u < U; u++)                                                    \
                v[u] = lin_bin(K, v[u], LIN_LD(p, u));                                     \
        else if (o->swap)                                                                  \
            for (int u = 0; u < U; u++)                                                    \
                v[u] = lin_bin(K, c, v[u]);                                                \
        else                                                                               \
            for (int u = 0; u < U; u++)                                                    \
                v[u] = lin_bin(K, v[u], c);                                                \
        break;
#define LIN_UN(K)                                                                          \
    case K:                                                                                \
        for (int u = 0; u < U; u++)                                                        \
            v[u] = lin_un(K, v[u]);                                                        \
        break;
        switch (o->kind) {
            LIN_BIN(LK_ADD)
            LIN_BIN(LK_SUB)
            LIN_BIN(LK_MUL)
            LIN_BIN(LK_DIV)
            LIN_BIN(LK_MAX)
            LIN_BIN(LK_MIN)
            LIN_UN(LK_NEG)
            LIN_UN(LK_RELU)
            LIN_UN(LK_ABS)
        default: break; /* LK_COPY */
        }
#undef LIN_BIN
#undef LIN_UN
        if (o->canon)
            for (int u = 0; u < U; u++)
                v[u] = lin_canon(v[u]);
    }
#undef LIN_LD
    if (tail)
        _mm512_mask_storeu_ps(dst + i, m, v[0]);
    else if (stream)
        for (int u = 0; u < U; u++)
            _mm512_stream_ps(dst + i + 16 * u, v[u]);
    else
        for (int u = 0; u < U; u++)
            _mm512_storeu_ps(dst + i + 16 * u, v[u]);
}

/* How far ahead the inputs read in place are prefetched, in elements (4
 * KiB: far enough to cover memory's latency at this loop's rate) */
#define LIN_PF 1024

/* The chain over elements [0, n) of a chunk into dst (stream: dst is
 * 64-byte aligned, written by streaming stores).  False: a result was tiny
 * (MXCSR.UE), dst holds some wrong values; compute the chunk again.  With
 * `ieee` (cheap assists, cpu/subnormal.c) it runs without FTZ, always
 * exact. */
__attribute__((target(NT_TARGET_AVX512))) static bool lin_run512(const lin_prog *L,
                                                                 const lin_io *io, int nsrc,
                                                                 const int8_t *srcs, float *dst,
                                                                 int64_t n, bool stream, bool ieee)
{
    const unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0x807fu) | (ieee ? 0u : 0x8000u)); /* [FTZ,] flags clear */
    __asm__ volatile("" ::: "memory");
    int64_t i = 0;
    for (; i + 16 * LIN_U <= n; i += 16 * LIN_U) {
        for (int e = 0; e < nsrc; e++)
            for (int u = 0; u < LIN_U; u++)
                _mm_prefetch((const char *)(io->src[srcs[e]] + i + LIN_PF + 16 * u), _MM_HINT_T0);
        lin_block(L, io, i, 0, false, dst, stream);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        lin_block(L, io, i, m, true, dst, stream);
    }
    __asm__ volatile("" ::: "memory");
    const unsigned flags = _mm_getcsr();
    _mm_setcsr(csr);
    if (ieee)
        return true;
    if (flags & 0x02u) /* a subnormal operand took an assist */
        sn_met();
    return !(flags & 0x10u);
}
#endif

/* An EW-shaped program over its iteration space, cut into spans of the
 * row-major element order that the caller and the gemm helper thread
 * (core/gemm.c, nt__par_blocks) claim.  Elements are independent and a
 * stochastic-rounding cast keys each element by its own row-major index, so
 * the cut never changes a bit. */
typedef struct ew_ctx {
    const nt__fgroup *g;
    int from, prev;
    const mview *pre;
    mview ev[NT_F_MAXEXT], ov[NT_F_MAXOUT];
    uint64_t keys[NT_F_MAXOPS];
    int64_t n_all, span;
    int8_t reg[NT_F_MAXVALS]; /* plan_regs */
    int nregs;
    int8_t direct[NT_F_MAXVALS]; /* >= 0: the value is output slot direct[v], computed in place */
    bool stream[NT_F_MAXOUT];    /* output slot written by stream_f32 */
    int8_t chunk_out[NT_F_MAXOPS]; /* >= 0: op k's value is streamed slot, by stream_direct */
    bool canon[NT_F_MAXOPS];       /* plan_canon */
    bool lin;                      /* a chain in registers (lin_plan) */
    bool ieee;                     /* it runs without FTZ (nt__sn_assists_cheap) */
    int nsrc;                      /* its inputs read in place */
    int8_t srcs[NT_F_MAXEXT];
    lin_prog L;
    /* the program over its coalesced iteration shape (coalesce_ew) */
    nt__fprog pc;
    nt__fgroup gc;
    mview prec;
    volatile int rc;
} ew_ctx;

/* Input e (view m) of an EW chunk of n elements at idx: read in place
 * (contiguous f32), or loaded into its register reg once a chunk (*loaded);
 * an input constant along the chunk (a per-row [R, 1] operand of an
 * [R, C] program) as its one value, a scalar operand (the chunk filled
 * with it took a quarter of the layer norm backward's last kernel). */
static opnd ext_opnd(const nt__fprog *P, const mview *m, int e, const int64_t *idx, int nd,
                     int64_t n, blk *reg, bool *loaded)
{
    int64_t est = nd ? m->stride[nd - 1] : 1;
    if (m->dt == NT_F32 && est == 1)
        return (opnd){(const float *)m->data + offset_of(m, idx, nd), NT_F32, false};
    bool one = nd && est == 0;
    if (!*loaded) {
        load(reg, m, offset_of(m, idx, nd), est, one ? 1 : n);
        *loaded = true;
    }
    return (opnd){reg, (nt_dtype)P->ext[e].dtype, one};
}

/* Elements [lo, hi) of the row-major order. */
static int ew_span(const ew_ctx *c, int64_t lo, int64_t hi)
{
    const nt__fprog *P = c->g->prog;
    int nd = P->ndim;
    const int64_t *shape = P->shape;
    const int from = c->from, prev = c->prev;
    const mview *pre = c->pre, *ev = c->ev, *ov = c->ov;
    /* cache-line aligned: a 64-byte vector never splits across two lines */
    blk *R = aligned_alloc(64, sizeof(blk) * (size_t)(c->nregs + P->next));
    float *scratch = malloc(sizeof(float) * 4 * CH);
    if (!R || !scratch) {
        free(R), free(scratch);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's buffers");
    }
    blk *E = R + c->nregs;
    const int8_t *reg = c->reg, *direct = c->direct;
    void *at[NT_F_MAXVALS]; /* each value's register in this chunk */
    for (int v = 0; v < P->nvals; v++)
        at[v] = reg[v] >= 0 ? (void *)&R[reg[v]] : NULL;
    eval_fn *eval = eval_isa();
    int64_t inner = nd ? shape[nd - 1] : 1;
    int64_t idx[NT_MAX_DIMS] = {0};
    for (int64_t rem = lo, d = nd - 1; d >= 0; d--) {
        idx[d] = rem % shape[d];
        rem /= shape[d];
    }
    uint64_t nlin = 0, nredo = 0;
    for (int64_t pos = lo; pos < hi;) {
        int64_t j = nd ? idx[nd - 1] : 0;
        int64_t n = inner - j < CH ? inner - j : CH;
        if (n > hi - pos)
            n = hi - pos;
        bool loaded[NT_F_MAXEXT] = {0}, streamed[NT_F_MAXOUT] = {0};
        for (int v = 0; v < P->nvals; v++)
            if (direct[v] >= 0)
                at[v] = (float *)ov[direct[v]].data + offset_of(&ov[direct[v]], idx, nd);
#ifdef NT_FUSED_X86
        if (c->lin && sn_tested &&
            atomic_load_explicit(&route_sn_test, memory_order_relaxed) == 0) {
            sn_tested--;
        } else if (c->lin) {
            lin_io io;
            for (int e = 0; e < P->next; e++) {
                const float *p = (const float *)ev[e].data + offset_of(&ev[e], idx, nd);
                io.src[e] = !nd || ev[e].stride[nd - 1] ? p : NULL;
                io.bc[e] = io.src[e] ? 0.0f : *p;
            }
            float *dst = (float *)ov[0].data + offset_of(&ov[0], idx, nd);
            nlin++;
            if (lin_run512(&c->L, &io, c->nsrc, c->srcs, dst, n,
                           c->stream[0] && !((uintptr_t)dst & 63u), c->ieee))
                goto chunk_done;
            nredo++;
            if (c->stream[0]) /* rewritten below */
                stream_fence();
        }
#endif
        if (prev >= 0)
            load(at[prev], pre, offset_of(pre, idx, nd), nd ? pre->stride[nd - 1] : 1, n);
        /* the next chunk of each input read in place, a slice before each
         * op: the hardware streamer, trained by one burst of reads per
         * chunk, left the chunk's first reader waiting on memory; all the
         * prefetches at once measured slower (they wait for fill buffers) */
        const char *pf[NT_F_MAXEXT];
        int npf = 0;
        if (pos + n < hi)
            for (int e = 0; e < P->next; e++)
                if (ev[e].dt == NT_F32 && (nd ? ev[e].stride[nd - 1] : 1) == 1)
                    pf[npf++] = (const char *)((const float *)ev[e].data +
                                               offset_of(&ev[e], idx, nd) + n);
        const int64_t pf_lines = (n * (int64_t)sizeof(float) + 63) / 64;
        const int64_t pf_per = (pf_lines + (P->nops - from) - 1) / (P->nops - from);
        for (int k = from; k < P->nops; k++) {
            const nt__fop *o = &P->ops[k];
            for (int e = 0; e < npf; e++)
                for (int64_t b = (k - from) * pf_per; b < (k - from + 1) * pf_per && b < pf_lines;
                     b++)
                    __builtin_prefetch(pf[e] + 64 * b, 0, 3);
            opnd a[3];
            for (int q = 0; q < o->nin; q++) {
                int sl = o->a[q];
                if (NT_F_IS_EXT(sl)) {
                    int e = NT_F_EXT_IDX(sl);
                    a[q] = ext_opnd(P, &ev[e], e, idx, nd, n, &E[e], &loaded[e]);
                } else {
                    a[q] = (opnd){at[sl], (nt_dtype)P->vals[sl].dtype, false};
                }
            }
            if (c->chunk_out[k] >= 0) {
                /* the value no later op reads: straight into its output
                 * memory by streaming stores when the op can */
                const int so = c->chunk_out[k];
                int sd = stream_direct(eval, o, (nt_dtype)P->vals[o->out].dtype, a,
                                       (float *)ov[so].data + offset_of(&ov[so], idx, nd), n,
                                       c->canon[k]);
                if (sd > 0) {
                    streamed[so] = true;
                    continue;
                }
                if (sd < 0) /* stream_f32 below rewrites those lines */
                    stream_fence();
            }
            if (is_sr(o))
                eval_sr((nt_dtype)P->vals[o->out].dtype, a, at[o->out], n, scratch,
                        c->keys[k], pos);
            else
                eval(o, (nt_dtype)P->vals[o->out].dtype, a, at[o->out], n, scratch, c->canon[k]);
        }
        for (int sv = 0; sv < P->nout; sv++) {
            int v = P->out_val[sv];
            if (direct[v] == sv || streamed[sv])
                continue;
            if (c->stream[sv])
                stream_f32((float *)ov[sv].data + offset_of(&ov[sv], idx, nd), at[v], n);
            else
                store(&ov[sv], offset_of(&ov[sv], idx, nd), nd ? ov[sv].stride[nd - 1] : 1,
                      at[v], (nt_dtype)P->vals[v].dtype, n);
        }
#ifdef NT_FUSED_X86
    chunk_done:
#endif
        pos += n;
        if (nd == 0)
            break;
        idx[nd - 1] += n;
        if (idx[nd - 1] == shape[nd - 1]) { /* next row */
            idx[nd - 1] = 0;
            nt__idx_next(idx, nd - 1, shape);
        }
    }
    if (nlin) {
        atomic_fetch_add_explicit(&chain_chunks, nlin, memory_order_relaxed);
        atomic_fetch_add_explicit(&chain_redone, nredo, memory_order_relaxed);
    }
    stream_fence();
    free(R);
    free(scratch);
    return 0;
}

static void ew_block(void *arg, int b)
{
    ew_ctx *c = arg;
    int64_t lo = (int64_t)b * c->span, hi = lo + c->span < c->n_all ? lo + c->span : c->n_all;
    int rc = ew_span(c, lo, hi);
    if (rc)
        c->rc = rc;
}

/* Spans of this many elements; programs smaller than two run on the
 * calling thread alone (waking the helper costs more). */
#define EW_SPAN (64 * 1024)

/* ---------------- EW: AdamW's update as one loop ----------------
 *
 * nt_optim_step records AdamW (autograd/optim.c, adamw_update) as a dozen
 * elementwise ops per parameter; fused, they are one program, most often
 * the epilogue of the weight gradient's matmul.  The per-op passes take an
 * L1 chunk through every op (a training step's AdamW ran at a third of the
 * speed of the same arithmetic written as one loop, measured over 1M
 * elements), and the values fan out, so the chain route cannot take it.
 * This route recognises the program op by op -- the exact sequence
 * adamw_update records, with or without weight decay, the gradient as the
 * matmul's value or an input, f32 or widened from bf16/f16 by a cast, the
 * new m, v and parameter stored (copies) and the parameter also cast for
 * the next forward's autocast (a cast, or in a captured step a copy into
 * the cast's storage: the same rounding) -- and runs it as one AVX-512 loop, 16
 * elements at a time, every value in a vector register.
 *
 * Each op is the IEEE f32 operation of its core/ewise.h definition, its
 * operands in the op's order (a NaN's payload follows the first operand),
 * NaN made canonical exactly where plan_canon says: the bits of the per-op
 * passes, by construction.  Blocks of OPT_B elements run with MXCSR's FTZ
 * set and DAZ clear, as the chain route does (a tiny result takes no
 * microcode assist); where MXCSR.UE says a result was tiny the block runs
 * again without FTZ, exactly.  A block's f32 outputs go to an L1 buffer
 * and are stored only after that, so they may be the very memory of an
 * input (AdamW updates its parameter, m and v in place); any other overlap
 * is refused.  Where this CPU's subnormal assists are cheap
 * (cpu/subnormal.c) a block runs once, without FTZ, and stores m', v' and
 * w' straight to their outputs (each vector's loads precede its stores, so
 * in place stays safe).  A bf16 gradient is widened and the parameter's bf16 cast
 * rounded in the loop (nt__bf16_to_f32, nt__f32_to_bf16), the cast stored
 * straight to its own memory (no input shares it; the redo rewrites it);
 * f16 ones go through eval and store on the block, as the passes would.
 * autograd/optim.c's adamw_update says that this route depends on its op
 * sequence; test_fused_adamw_route_bitwise fails if the route stops
 * taking it. */

/* whether the route runs (nt__fused_cpu_set_optim_route), and how often it did */
static atomic_bool route_optim = true;
static atomic_uint_fast64_t optim_runs, optim_redone, optim_direct;

void nt__fused_cpu_set_optim_route(bool on) { atomic_store(&route_optim, on); }
void nt__fused_cpu_optim_counts(uint64_t *runs, uint64_t *redone, uint64_t *direct)
{
    *runs = atomic_load(&optim_runs);
    *redone = atomic_load(&optim_redone);
    *direct = atomic_load(&optim_direct);
}

#ifdef NT_FUSED_X86

/* elements per block: its outputs wait in L1 buffers for its flags */
#define OPT_B 512

/* The pattern's ops, in adamw_update's order. */
enum {
    OP_GCAST, /* optional: g widened to f32 */
    OP_WD,    /* optional: w1 = w * (1 - lr wd) */
    OP_GM,    /* b = g - m */
    OP_B1,    /* c = b * (1 - beta1) */
    OP_M,     /* m' = m + c */
    OP_GG,    /* d = g * g */
    OP_B2G,   /* e = d * (1 - beta2) */
    OP_B2V,   /* f = v * beta2 */
    OP_V,     /* v' = f + e */
    OP_SQ,    /* s = sqrt(v') */
    OP_BC2,   /* t = s / sqrt(1 - beta2^t) */
    OP_EPS,   /* u = t + eps */
    OP_Q,     /* q = m' / u */
    OP_STEP,  /* r = q * lr / (1 - beta1^t) */
    OP_W,     /* w' = w1 - r */
    OP_N
};

/* an output: one of m', v', w' (f32, by a copy), or w' cast: to bf16 in
 * the loop (nt__f32_to_bf16's rounding), to another dtype by eval */
enum { OUT_M, OUT_V, OUT_W, OUT_CAST, OUT_BF16 };

typedef struct opt_prog {
    int k[OP_N];         /* each pattern op's index in the program (-1: absent) */
    bool canon[OP_N];    /* plan_canon's verdict for it */
    float s[OP_N];       /* the scalar ops' scalars */
    int g_ext;           /* the gradient's input (-1: the matmul's value, pre) */
    int w_ext, m_ext, v_ext;
    nt_dtype g_dt;       /* what the gradient is stored as (f32, or widened) */
    int nout;
    uint8_t out_kind[NT_F_MAXOUT];
    int out_k[NT_F_MAXOUT]; /* OUT_CAST: the cast's op */
    /* m', v' and w' each stored by exactly one f32 copy, out_of[kind] its
     * slot, and no cast by eval: the loop may store them straight there */
    bool direct;
    int8_t out_of[3];
} opt_prog;

typedef struct opt_ctx {
    const nt__fgroup *g;
    const opt_prog *O;
    const float *w, *m, *v; /* the parameter, m and v */
    const char *gd;         /* the gradient, stored as O->g_dt */
    const mview *ov;        /* the outputs */
    int64_t n_all, span;
    bool ieee; /* blocks run without FTZ, once (nt__sn_assists_cheap) */
    atomic_int rc; /* a span's failure (read after nt__par_blocks) */
} opt_ctx;

/* A view covers its n elements contiguously, in the iteration order. */
static bool opt_contig(const mview *m, int nd, const int64_t *shape)
{
    int64_t want = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (shape[d] != 1 && m->stride[d] != want)
            return false;
        want *= shape[d];
    }
    return true;
}

#define OPT_UNSET 1000 /* a slot not known yet */

/* Operand q of op o is slot (a value, or an input as NT_F_EXT). */
static bool opt_is(const nt__fop *o, int q, int slot) { return o->nin > q && o->a[q] == slot; }

/* opt_plan's slots: the values (>= 0) or inputs (NT_F_EXT, < 0) the
 * pattern reads as g, m, v and the parameter (OPT_UNSET: not known yet) */
typedef struct opt_slots {
    int g, m, v, w;
} opt_slots;

/* The pattern's head from op *k on: the gradient (the matmul's value prev,
 * or an input) perhaps widened from bf16/f16 by a cast, then perhaps the
 * weight decay w * s of an input w. */
static bool opt_match_head(const nt__fprog *P, int prev, int *k, opt_slots *sl, opt_prog *O)
{
    const nt__fop *o = &P->ops[*k];
    sl->g = prev >= 0 ? prev : OPT_UNSET;
    O->g_ext = -1;
    O->g_dt = NT_F32;
    if (o->op == NT_OP_CAST && !is_sr(o) && o->nin == 1 && P->vals[o->out].dtype == NT_F32) {
        int a = o->a[0];
        nt_dtype dt = NT_F_IS_EXT(a) ? (nt_dtype)P->ext[NT_F_EXT_IDX(a)].dtype
                                     : (a == prev ? (nt_dtype)P->vals[a].dtype : NT_F32);
        if ((dt != NT_BF16 && dt != NT_F16) || (!NT_F_IS_EXT(a) && a != prev))
            return false;
        if (NT_F_IS_EXT(a))
            O->g_ext = NT_F_EXT_IDX(a);
        O->g_dt = dt;
        O->k[OP_GCAST] = (*k)++;
        sl->g = o->out;
    }
    /* weight decay: w * s, w an input */
    o = &P->ops[*k];
    if (o->op == NT_OP_MUL_SCALAR && NT_F_IS_EXT(o->a[0]) && P->vals[o->out].dtype == NT_F32)
        O->k[OP_WD] = (*k)++;
    sl->w = O->k[OP_WD] >= 0 ? P->ops[O->k[OP_WD]].a[0] : OPT_UNSET;
    sl->m = sl->v = OPT_UNSET;
    return P->nops - *k >= OP_N - 2;
}

/* The pattern's body, OP_GM .. OP_W, from op *k on: each op as
 * adamw_update records it, unstored f32, reading g, m, v, the parameter
 * (w1: OP_WD's value or the parameter itself) or an earlier pattern op's
 * value, each input taken where the pattern first reads it. */
static bool opt_match_body(const nt__fprog *P, int *k, opt_slots *sl, opt_prog *O)
{
    enum { G = -1, M = -2, V = -3, W1 = -4, NONE = -9 };
    static const struct {
        uint16_t op;
        int8_t a0, a1; /* operands: G, M, V, W1 or a pattern op's value */
    } pat[] = {
        [OP_GM] = {NT_OP_SUB, G, M},
        [OP_B1] = {NT_OP_MUL_SCALAR, OP_GM, NONE},
        [OP_M] = {NT_OP_ADD, M, OP_B1},
        [OP_GG] = {NT_OP_MUL, G, G},
        [OP_B2G] = {NT_OP_MUL_SCALAR, OP_GG, NONE},
        [OP_B2V] = {NT_OP_MUL_SCALAR, V, NONE},
        [OP_V] = {NT_OP_ADD, OP_B2V, OP_B2G},
        [OP_SQ] = {NT_OP_SQRT, OP_V, NONE},
        [OP_BC2] = {NT_OP_DIV_SCALAR, OP_SQ, NONE},
        [OP_EPS] = {NT_OP_ADD_SCALAR, OP_BC2, NONE},
        [OP_Q] = {NT_OP_DIV, OP_M, OP_EPS},
        [OP_STEP] = {NT_OP_MUL_SCALAR, OP_Q, NONE},
        [OP_W] = {NT_OP_SUB, W1, OP_STEP},
    };
    for (int p = OP_GM; p <= OP_W; p++, (*k)++) {
        const nt__fop *o = &P->ops[*k];
        if (o->op != pat[p].op || P->vals[o->out].dtype != NT_F32 || P->vals[o->out].store >= 0)
            return false;
        int want[2] = {pat[p].a0, pat[p].a1};
        for (int q = 0; q < 2; q++) {
            int w = want[q], slot;
            if (w == NONE) {
                if (o->nin != q)
                    return false;
                break;
            }
            int *in = w == G ? &sl->g
                      : w == M ? &sl->m
                      : w == V ? &sl->v
                      : w == W1 && O->k[OP_WD] < 0 ? &sl->w
                                                   : NULL;
            if (in && *in == OPT_UNSET && NT_F_IS_EXT(o->a[q]))
                *in = o->a[q];
            slot = in ? *in : w == W1 ? P->ops[O->k[OP_WD]].out : P->ops[O->k[w]].out;
            if (slot == OPT_UNSET || !opt_is(o, q, slot))
                return false;
        }
        O->k[p] = *k;
    }
    return true;
}

/* The program's ops from k on: the outputs, stored copies of m', v', w'
 * and casts of w', read by no op, each contiguous in the output's dtype. */
static bool opt_match_outputs(const nt__fprog *P, int k, const mview *ov, opt_prog *O)
{
    const int vm = P->ops[O->k[OP_M]].out, vv = P->ops[O->k[OP_V]].out,
              vw = P->ops[O->k[OP_W]].out;
    if (P->nops - k != P->nout)
        return false;
    int nkind[3] = {0, 0, 0}; /* f32 copies of m', v', w' */
    O->direct = true;
    for (int sv = 0; sv < P->nout; sv++) {
        int ko = def_op(P, P->out_val[sv]);
        const nt__fop *o = &P->ops[ko];
        const nt_dtype odt = (nt_dtype)P->vals[o->out].dtype;
        if (ko < k || o->nin != 1 || P->vals[o->out].store != sv || ov[sv].dt != odt ||
            !opt_contig(&ov[sv], P->ndim, P->shape))
            return false;
        int a = o->a[0];
        if (o->op == NT_OP_COPY && odt == NT_F32 && (a == vm || a == vv || a == vw)) {
            const int kind = a == vm ? OUT_M : a == vv ? OUT_V : OUT_W;
            O->out_kind[sv] = (uint8_t)kind;
            nkind[kind]++, O->out_of[kind] = (int8_t)sv;
        } else if ((o->op == NT_OP_CAST || o->op == NT_OP_COPY) && !is_sr(o) && a == vw &&
                   isf(odt)) {
            /* a copy of w' into another float dtype (a captured step's cast
             * made ahead, autograd/optim.c ampcap_write) rounds as the cast
             * does (eval_copy for both): the same output */
            O->out_kind[sv] = odt == NT_BF16 ? OUT_BF16 : OUT_CAST;
            O->direct &= odt == NT_BF16; /* an eval'd cast reads w' from the buffer */
        } else {
            return false;
        }
        O->out_k[sv] = ko;
    }
    O->nout = P->nout;
    O->direct &= nkind[OUT_M] == 1 && nkind[OUT_V] == 1 && nkind[OUT_W] == 1;
    return true;
}

/* Memory: an output is an input's very elements or shares none of them,
 * and no two outputs share any.  in: the parameter, m, v (f32) and the
 * gradient's view gv. */
static bool opt_memory_ok(const nt__fprog *P, const mview *ev, const int *in, const mview *gv,
                          const mview *ov)
{
    const int64_t n = nt__numel(P->ndim, P->shape);
    const char *lo[4];
    int64_t len[4];
    for (int i = 0; i < 3; i++)
        lo[i] = ev[in[i]].data, len[i] = 4 * n;
    lo[3] = gv->data, len[3] = n * (int64_t)nt__dtype_size(gv->dt);
    for (int sv = 0; sv < P->nout; sv++) {
        const char *a = ov[sv].data;
        int64_t al = n * (int64_t)nt__dtype_size(ov[sv].dt);
        for (int i = 0; i < 4; i++) {
            bool same = a == lo[i] && al == len[i] && i < 3;
            if (!same && a < lo[i] + len[i] && lo[i] < a + al)
                return false;
        }
        for (int s2 = 0; s2 < sv; s2++) {
            const char *b = ov[s2].data;
            int64_t bl = n * (int64_t)nt__dtype_size(ov[s2].dt);
            if (a < b + bl && b < a + al)
                return false;
        }
    }
    return true;
}

/* Is the program from op `from` on adamw_update's sequence, with inputs and
 * outputs the loop can run?  Fills O. */
static bool opt_plan(const nt__fgroup *g, int from, int prev, const mview *pre, const mview *ev,
                     const mview *ov, const bool *canon, opt_prog *O)
{
    const nt__fprog *P = g->prog;
    const int nd = P->ndim;
    if (P->kind == NT_FK_ROW || P->nops - from < OP_N - 2)
        return false;
    for (int i = 0; i < OP_N; i++)
        O->k[i] = -1;
    int k = from;
    opt_slots sl;
    if (!opt_match_head(P, prev, &k, &sl, O) || !opt_match_body(P, &k, &sl, O))
        return false;
    /* the parameter, m and v: three distinct inputs besides g */
    if (O->k[OP_GCAST] < 0 && prev < 0)
        O->g_ext = NT_F_EXT_IDX(sl.g);
    O->w_ext = NT_F_EXT_IDX(sl.w), O->m_ext = NT_F_EXT_IDX(sl.m), O->v_ext = NT_F_EXT_IDX(sl.v);
    if (O->w_ext == O->m_ext || O->w_ext == O->v_ext || O->m_ext == O->v_ext ||
        O->g_ext == O->w_ext || O->g_ext == O->m_ext || O->g_ext == O->v_ext)
        return false;
    if (!opt_match_outputs(P, k, ov, O))
        return false;
    /* every input f32 and contiguous but a widened gradient; the gradient
     * (an input or the matmul's value) contiguous in its dtype */
    const int f32in[3] = {O->w_ext, O->m_ext, O->v_ext};
    for (int i = 0; i < 3; i++)
        if (ev[f32in[i]].dt != NT_F32 || P->ext[f32in[i]].dtype != NT_F32 ||
            !opt_contig(&ev[f32in[i]], nd, P->shape))
            return false;
    const mview *gv = O->g_ext >= 0 ? &ev[O->g_ext] : pre;
    if (!gv || gv->dt != O->g_dt || !opt_contig(gv, nd, P->shape))
        return false;
    if (!canon[O->k[OP_M]] || !canon[O->k[OP_V]] || !canon[O->k[OP_W]])
        return false; /* opt_run512 stores them as they are (unreachable: copies read them) */
    for (int p = 0; p < OP_N; p++) {
        O->canon[p] = O->k[p] >= 0 && canon[O->k[p]];
        O->s[p] = O->k[p] >= 0 ? (float)P->ops[O->k[p]].p.f[0] : 0.0f;
    }
    return opt_memory_ok(P, ev, f32in, gv, ov);
}

/* Elements [i0, i0 + n) (n <= OPT_B): m', v', w' to dst[OUT_M], dst[OUT_V],
 * dst[OUT_W] (element i0 first: an L1 buffer, or the outputs themselves);
 * the bf16 casts of w' straight to their outputs (which no input shares).
 * The gradient: f32 read in place, bf16 widened here (the bits
 * nt__bf16_to_f32 gives), or widened into gb by eval (f16).  Each vector's
 * loads come before its stores, so an output may be the very memory of an
 * input.
 *
 * NaNs are made canonical in m', v' and w' only (opt_plan takes the route
 * only where plan_canon canonicalises those three), not after every op as
 * the per-op passes do where plan_canon says: the same bits.  Every op
 * here is an IEEE add, subtract, multiply, divide or square root, whose
 * result is a NaN exactly when an operand is one (or it makes one of
 * non-NaN operands), whatever that NaN's sign and payload; and its result
 * for non-NaN operands does not depend on any canonicalisation.  So an
 * intermediate value is a NaN, or a given number, in both ways alike, and
 * the three stored values, each canonical, are the same bits (the bf16
 * cast is rounded from w', canonical too).  A NaN operand raises neither
 * MXCSR's UE nor its DE flag more in one way than in the other (its sign
 * and payload change neither), so the blocks redone and the subnormals
 * met are the same.  The canonicalisation after each of the dozen ops was
 * three instructions and a test each, and made this loop twice as slow on
 * a Zen 5 (0.9 against 0.5 ns an element, its operands from memory). */
__attribute__((target(NT_TARGET_AVX512))) static void opt_run512(const opt_ctx *c, int64_t i0,
                                                                 int64_t n, const float *gb,
                                                                 float *const dst[3])
{
    const opt_prog *O = c->O;
    const float *gp = O->g_dt == NT_F32 ? (const float *)c->gd + i0 : gb;
    const uint16_t *gh = O->g_dt == NT_BF16 ? (const uint16_t *)c->gd + i0 : NULL;
    uint16_t *hd[NT_F_MAXOUT];
    int nh = 0;
    for (int sv = 0; sv < O->nout; sv++)
        if (O->out_kind[sv] == OUT_BF16)
            hd[nh++] = (uint16_t *)c->ov[sv].data + i0;
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i rnd = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i qnan = _mm512_set1_epi32((int)NT__QNAN_BF16);
    const float *wp = c->w + i0, *mp = c->m + i0, *vp = c->v + i0;
    const bool wd = O->k[OP_WD] >= 0;
    const __m512 swd = _mm512_set1_ps(O->s[OP_WD]), sb1 = _mm512_set1_ps(O->s[OP_B1]),
                 sb2g = _mm512_set1_ps(O->s[OP_B2G]), sb2v = _mm512_set1_ps(O->s[OP_B2V]),
                 sbc2 = _mm512_set1_ps(O->s[OP_BC2]), seps = _mm512_set1_ps(O->s[OP_EPS]),
                 sstep = _mm512_set1_ps(O->s[OP_STEP]);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 g =
            gh ? _mm512_castsi512_ps(_mm512_slli_epi32(
                     _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, gh + i)), 16))
               : _mm512_maskz_loadu_ps(m, gp + i);
        const __m512 w = _mm512_maskz_loadu_ps(m, wp + i), mo = _mm512_maskz_loadu_ps(m, mp + i),
                     vo = _mm512_maskz_loadu_ps(m, vp + i);
        const __m512 w1 = wd ? _mm512_mul_ps(w, swd) : w;
        const __m512 b = _mm512_sub_ps(g, mo);
        const __m512 cc = _mm512_mul_ps(b, sb1);
        const __m512 mn = lin_canon(_mm512_add_ps(mo, cc));
        const __m512 dd = _mm512_mul_ps(g, g);
        const __m512 e = _mm512_mul_ps(dd, sb2g);
        const __m512 f = _mm512_mul_ps(vo, sb2v);
        const __m512 vn = lin_canon(_mm512_add_ps(f, e));
        const __m512 s = _mm512_sqrt_ps(vn);
        const __m512 t = _mm512_div_ps(s, sbc2);
        const __m512 u = _mm512_add_ps(t, seps);
        const __m512 q = _mm512_div_ps(mn, u);
        const __m512 r = _mm512_mul_ps(q, sstep);
        const __m512 wn = lin_canon(_mm512_sub_ps(w1, r));
        /* the copies' results: canonical (plan_canon canonicalises a value
         * a copy reads, as a copy is not NaN-through; see above) */
        if (m == 0xffff) {
            _mm512_storeu_ps(dst[OUT_M] + i, mn);
            _mm512_storeu_ps(dst[OUT_V] + i, vn);
            _mm512_storeu_ps(dst[OUT_W] + i, wn);
        } else {
            _mm512_mask_storeu_ps(dst[OUT_M] + i, m, mn);
            _mm512_mask_storeu_ps(dst[OUT_V] + i, m, vn);
            _mm512_mask_storeu_ps(dst[OUT_W] + i, m, wn);
        }
        if (nh) { /* nt__f32_to_bf16: round to nearest even, NaN the canonical one */
            const __m512i bits = _mm512_castps_si512(wn);
            const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, absm), inf);
            __m512i rb = _mm512_add_epi32(_mm512_add_epi32(bits, rnd),
                                          _mm512_and_si512(_mm512_srli_epi32(bits, 16), one));
            rb = _mm512_mask_mov_epi32(_mm512_srli_epi32(rb, 16), nan, qnan);
            const __m256i h = _mm512_cvtepi32_epi16(rb);
            for (int o = 0; o < nh; o++)
                _mm256_mask_storeu_epi16(hd[o] + i, m, h);
        }
    }
}

/* Elements [lo, hi) of the program, block by block: a block runs with
 * MXCSR's FTZ set (DAZ clear), as the chain route does, so a tiny result
 * takes no microcode assist; FTZ changes a result only when it is tiny,
 * and then MXCSR.UE is set, and the block runs again without it, exactly.
 * Its outputs are stored only then, so the inputs it reads are still
 * there for the second run.  Where the assists are cheap (c->ieee) a block
 * runs once, without FTZ, and (O->direct) stores straight to the outputs. */
static int opt_span(const opt_ctx *c, int64_t lo, int64_t hi)
{
    const opt_prog *O = c->O;
    const nt__fprog *P = c->g->prog;
    /* m', v', w'; the gradient as stored and widened; the cast; eval's scratch */
    float *buf = aligned_alloc(64, sizeof(float) * 10 * OPT_B);
    if (!buf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's buffers");
    float *ob = buf, *graw = buf + 3 * OPT_B, *gb = buf + 4 * OPT_B, *cb = buf + 5 * OPT_B;
    float *scratch = buf + 6 * OPT_B;
    eval_fn *eval = eval_isa();
    const unsigned csr = _mm_getcsr();
    /* round to nearest, exceptions masked, flags clear; FTZ for the first run */
    const unsigned exact = (csr & ~0xe07fu) | 0x1f80u, ftz = exact | 0x8000u;
    unsigned seen = 0; /* flags of the exact runs */
    const bool direct = c->ieee && O->direct;
    for (int64_t i = lo; i < hi; i += OPT_B) {
        const int64_t n = hi - i < OPT_B ? hi - i : OPT_B;
        if (O->g_dt == NT_F16) { /* as the per-op passes: the stored value loaded, then the cast */
            const nt__fop *o = &P->ops[O->k[OP_GCAST]];
            nt__ld_f32(graw, c->gd + i * (int64_t)nt__dtype_size(O->g_dt), O->g_dt, 1, n);
            opnd a = {graw, O->g_dt, false};
            eval(o, NT_F32, &a, gb, n, scratch, O->canon[OP_GCAST]);
        }
        float *dst[3];
        for (int kind = OUT_M; kind <= OUT_W; kind++)
            dst[kind] = direct ? (float *)c->ov[O->out_of[kind]].data + i : ob + kind * OPT_B;
        _mm_setcsr(c->ieee ? exact : ftz);
        __asm__ volatile("" ::: "memory");
        opt_run512(c, i, n, gb, dst);
        __asm__ volatile("" ::: "memory");
        unsigned flags = _mm_getcsr();
        if (!c->ieee && (flags & 0x10u)) { /* a tiny result, flushed: the block again, IEEE */
            _mm_setcsr(exact);
            __asm__ volatile("" ::: "memory");
            opt_run512(c, i, n, gb, dst);
            __asm__ volatile("" ::: "memory");
            seen |= _mm_getcsr();
            atomic_fetch_add_explicit(&optim_redone, 1, memory_order_relaxed);
        }
        seen |= flags & 0x02u;
        _mm_setcsr(csr);
        for (int sv = 0; sv < O->nout && !direct; sv++) {
            const int kind = O->out_kind[sv];
            if (kind == OUT_BF16)
                continue; /* stored by opt_run512 */
            if (kind != OUT_CAST) {
                memcpy((float *)c->ov[sv].data + i, ob + kind * OPT_B, sizeof(float) * (size_t)n);
                continue;
            }
            const nt__fop *o = &P->ops[O->out_k[sv]];
            nt_dtype odt = (nt_dtype)P->vals[o->out].dtype;
            opnd a = {ob + 2 * OPT_B, NT_F32, false};
            eval(o, odt, &a, cb, n, scratch, true);
            store(&c->ov[sv], i, 1, cb, odt, n);
        }
    }
    if (seen & 0x02u) /* a subnormal operand took an assist */
        sn_met();
    if (direct && hi > lo) /* once a span: the two threads share the counter */
        atomic_fetch_add_explicit(&optim_direct, 1, memory_order_relaxed);
    free(buf);
    return 0;
}

static void opt_block(void *arg, int b)
{
    opt_ctx *c = arg;
    int64_t lo = (int64_t)b * c->span, hi = lo + c->span < c->n_all ? lo + c->span : c->n_all;
    int rc = opt_span(c, lo, hi);
    if (rc)
        atomic_store_explicit(&c->rc, rc, memory_order_relaxed);
}

/* Runs the program by this route if it is AdamW's (opt_plan): true, with
 * its status in *rc; false: not taken, nothing done. */
static bool opt_try(const nt__fgroup *g, int from, int prev, const mview *pre, const mview *ev,
                    const mview *ov, const bool *canon, int *rc)
{
    opt_prog O;
    /* where a subnormal operand was met lately, the per-op passes (which
     * test operands instead) take it, as they take a chain */
    if (!atomic_load(&route_optim) || eval_isa() != eval_avx512 ||
        (sn_tested && atomic_load_explicit(&route_sn_test, memory_order_relaxed) == 0 &&
         !nt__sn_assists_cheap()) ||
        !opt_plan(g, from, prev, pre, ev, ov, canon, &O))
        return false;
    opt_ctx c = {.g = g, .O = &O, .ov = ov, .ieee = nt__sn_assists_cheap()};
    atomic_init(&c.rc, 0);
    c.w = (const float *)ev[O.w_ext].data;
    c.m = (const float *)ev[O.m_ext].data;
    c.v = (const float *)ev[O.v_ext].data;
    c.gd = O.g_ext >= 0 ? ev[O.g_ext].data : pre->data;
    c.n_all = nt__numel(g->prog->ndim, g->prog->shape);
    c.span = EW_SPAN;
    int nblocks = (int)((c.n_all + EW_SPAN - 1) / EW_SPAN);
    if (c.n_all > 0)
        nt__par_blocks(nblocks, opt_block, &c, nblocks >= 2);
    atomic_fetch_add_explicit(&optim_runs, 1, memory_order_relaxed);
    /* nt__par_blocks returns after every block, its writes published */
    *rc = atomic_load_explicit(&c.rc, memory_order_relaxed);
    return true;
}
#endif /* NT_FUSED_X86 */

/* Merges adjacent dims of the iteration shape that every view in v steps
 * through as one (stride[d] == stride[d + 1] * shape[d + 1]) and drops
 * size-1 dims; returns the new ndim.  The row-major order of the elements
 * (and so every element's index) stays; a chunk then runs along the merged
 * inner dims: a permuted [N, C, H, W] operand (batch norm's channel rows)
 * went 28 elements a chunk, each paying every op's call. */
static int coalesce_dims(int nd, int64_t *shape, mview **v, int nv)
{
    int o = 0;
    for (int d = 0; d < nd; d++) {
        if (o > 0 && shape[d] == 1)
            continue;
        bool merge = o > 0;
        for (int i = 0; merge && shape[o - 1] != 1 && i < nv; i++)
            merge = v[i]->stride[o - 1] == v[i]->stride[d] * shape[d];
        if (merge)
            shape[o - 1] = shape[o - 1] == 1 ? shape[d] : shape[o - 1] * shape[d];
        else
            shape[o] = shape[d];
        for (int i = 0; i < nv; i++)
            v[i]->stride[merge ? o - 1 : o] = v[i]->stride[d];
        o += !merge;
    }
    return o;
}

/* c's views and, when dims merge, a copy of g's program over the coalesced
 * shape; returns g, or its stand-in (c->gc). */
static const nt__fgroup *coalesce_ew(ew_ctx *c, const nt__fgroup *g, const mview *pre)
{
    const nt__fprog *P = g->prog;
    mview *v[NT_F_MAXEXT + NT_F_MAXOUT + 1];
    int nv = 0;
    for (int k = 0; k < P->next; k++)
        v[nv++] = &c->ev[k];
    for (int sv = 0; sv < P->nout; sv++)
        v[nv++] = &c->ov[sv];
    if (pre) {
        c->prec = *pre;
        v[nv++] = &c->prec;
        c->pre = &c->prec;
    }
    int64_t shape[NT_MAX_DIMS];
    memcpy(shape, P->shape, sizeof shape);
    int nd = coalesce_dims(P->ndim, shape, v, nv);
    if (nd == P->ndim)
        return g; /* nothing merged or dropped: the views and shape stand */
    /* The program's own fields only: those from key on are the cache's
     * bookkeeping, which other threads update under its lock. */
    memset(&c->pc, 0, sizeof c->pc);
    memcpy(&c->pc, P, offsetof(nt__fprog, key));
    c->pc.ndim = nd;
    memcpy(c->pc.shape, shape, sizeof shape);
    c->gc = *g;
    c->gc.prog = &c->pc;
    return &c->gc;
}

/* Runs ops [from, nops) of an EW-shaped program over its iteration space.
 * pre: value `prev` (if >= 0) is read from `pre` instead of being computed. */
static int run_ew(const nt__fgroup *g, int from, int prev, const mview *pre)
{
    const nt__fprog *P = g->prog;
    ew_ctx *c = malloc(sizeof *c);
    if (!c)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's buffers");
    c->from = from;
    c->prev = prev;
    c->pre = pre;
    c->rc = 0;
    for (int k = 0; k < P->next; k++)
        mview_of(&c->ev[k], g->ext[k], P->ndim, P->shape);
    for (int sv = 0; sv < P->nout; sv++)
        mview_of(&c->ov[sv], g->out[sv], P->ndim, P->shape);
    g = c->g = coalesce_ew(c, g, pre);
    P = g->prog;
    pre = c->pre;
    plan_canon(P, from, c->canon);
#ifdef NT_FUSED_X86
    int orc;
    if (opt_try(g, from, prev, pre, c->ev, c->ov, c->canon, &orc)) {
        free(c);
        return orc;
    }
#endif
    sr_keys(g, c->keys);
    c->nregs = plan_regs(P, from, prev, c->reg);
    for (int v = 0; v < P->nvals; v++)
        c->direct[v] = -1;
    c->n_all = nt__numel(P->ndim, P->shape);
    for (int sv = 0; sv < P->nout; sv++) {
        int v = P->out_val[sv];
        /* not prev (loaded, not computed), not an SR cast (eval_sr writes
         * uncanonicalised f32), one slot per value */
        c->stream[sv] = false;
        if (v != prev && c->direct[v] < 0 && !is_sr(&P->ops[def_op(P, v)]) &&
            direct_out(g, c->ov, sv, P->ndim)) {
            if (c->n_all * (int64_t)sizeof(float) >= STREAM_MIN)
                c->stream[sv] = true; /* from its register, by stream_f32 */
            else
                c->direct[v] = (int8_t)sv;
        }
    }
    for (int k = 0; k < P->nops; k++)
        c->chunk_out[k] = -1;
    for (int sv = 0; sv < P->nout; sv++) {
        int v = P->out_val[sv], k = def_op(P, v);
        bool read_later = false;
        if (!c->stream[sv] || k < from)
            continue;
        for (int q = k + 1; q < P->nops; q++)
            for (int i = 0; i < P->ops[q].nin; i++)
                read_later |= P->ops[q].a[i] == v;
        for (int s2 = 0; s2 < P->nout; s2++) /* nor copied out to another slot */
            read_later |= s2 != sv && P->out_val[s2] == v;
        if (!read_later && c->chunk_out[k] < 0)
            c->chunk_out[k] = (int8_t)sv;
    }
    /* a chain in registers: AVX-512, a whole EW program whose one output
     * is computed straight into memory that no input shares */
    c->lin = false;
#ifdef NT_FUSED_X86
    if (atomic_load(&route_chains) && from == 0 && prev < 0 && eval_isa() == eval_avx512 && P->nout == 1 &&
        (c->stream[0] || c->direct[P->out_val[0]] == 0) &&
        lin_plan(P, c->ev, c->canon, &c->L)) {
        c->lin = true;
        c->ieee = nt__sn_assists_cheap();
        c->nsrc = 0;
        for (int e = 0; e < P->next; e++)
            if (!P->ndim || c->ev[e].stride[P->ndim - 1])
                c->srcs[c->nsrc++] = (int8_t)e;
    }
#endif
    c->span = EW_SPAN;
    int nblocks = (int)((c->n_all + EW_SPAN - 1) / EW_SPAN);
    if (c->n_all > 0)
        nt__par_blocks(nblocks, ew_block, c, nblocks >= 2);
    int rc = c->rc;
    free(c);
    return rc;
}

/* ---------------- ROW ---------------- */

/* A ROW program over rows [r0, r1); rows are independent (each reduction
 * runs over its own row, a stochastic-rounding cast keys by index), so the
 * cut into blocks of rows never changes a bit. */
typedef struct row_ctx {
    const nt__fgroup *g;
    mview ev[NT_F_MAXEXT], ov[NT_F_MAXOUT];
    uint64_t keys[NT_F_MAXOPS];
    int64_t R, C, rows; /* rows per block */
    int8_t reg[NT_F_MAXVALS]; /* plan_regs */
    int nregs;
    int8_t direct[NT_F_MAXVALS]; /* as ew_ctx's: a full-row f32 output computed in place */
    bool stream[NT_F_MAXOUT];    /* as ew_ctx's */
    /* >= 0: a streamed output slot whose value no later op reads, streamed
     * out chunk by chunk as its op computes it (no copy-out pass per row) */
    int8_t chunk_out[NT_F_MAXOPS];
    bool canon[NT_F_MAXOPS]; /* as ew_ctx's */
    int slots;               /* prefetch slices per row: see row_span */
    /* Rows per tile (row_span_tiled): 1 runs row_span, one row at a time */
    int64_t m;
    bool tile_in[NT_F_MAXEXT];  /* a full f32 input whose rows are adjacent: read in place */
    bool tile_inv[NT_F_MAXEXT]; /* an input every row reads at the same place (a weight) */
    volatile int rc;
} row_ctx;

/* Tiles of narrow rows: a program over rows of at most this many elements
 * runs ROW_CH / C rows per tile, each op over the whole tile in one call.
 * One row per call cost a call, a prefetch schedule and (at the AVX-512
 * level, for * and /) an MXCSR switch per row and op: for the GPT's rows of
 * 128, 40% of a layer norm backward's CPU time was that switch alone. */
#define ROW_TILE_MAXC (ROW_CH / 2)

/* Test hook: 0 runs every row program one row at a time (row_span), the
 * reference tests/test_fusion.c compares the tiles with. */
int nt__cpu_row_tiles = 1;

static int row_span(const row_ctx *c, int64_t r0, int64_t r1)
{
    const nt__fprog *P = c->g->prog;
    int nd = P->ndim;
    const int64_t *shape = P->shape;
    const int64_t C = c->C;
    const mview *ev = c->ev, *ov = c->ov;
    const uint64_t *keys = c->keys;
    /* one row of every value and loaded input */
    size_t cells = (size_t)(c->nregs + P->next) * (size_t)C;
    /* scratch: a whole row for reductions, then 4 chunks for eval; then
     * one chunk for a streamed output (chunk_out), cache-line aligned */
    size_t nbuf = (cells + (size_t)C + 5 * ROW_CH + 16 + 15) & ~(size_t)15; /* whole lines */
    float *buf = aligned_alloc(64, sizeof(float) * nbuf);
    if (!buf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's buffers");
    float *scratch = buf + cells;
    float *cbuf = (float *)(((uintptr_t)(scratch + C + 4 * ROW_CH) + 63) & ~(uintptr_t)63);
    float *V = buf, *E = buf + (size_t)c->nregs * (size_t)C;
    const int8_t *direct = c->direct;
    float *at[NT_F_MAXVALS]; /* each value's row */
    for (int v = 0; v < P->nvals; v++)
        at[v] = c->reg[v] >= 0 ? V + (size_t)c->reg[v] * (size_t)C : NULL;
    eval_fn *eval = eval_isa();
    int64_t idx[NT_MAX_DIMS] = {0};
    for (int64_t rem = r0, d = nd - 2; d >= 0; d--) {
        idx[d] = rem % shape[d];
        rem /= shape[d];
    }
    for (int64_t r = r0; r < r1; r++) {
        bool loaded[NT_F_MAXEXT] = {0};
        idx[nd - 1] = 0;
        for (int v = 0; v < P->nvals; v++)
            if (direct[v] >= 0)
                at[v] = (float *)ov[direct[v]].data + offset_of(&ov[direct[v]], idx, nd);
        /* the next row of each input read in place, into L2: the streamer
         * restarts at every 4 KiB page, and the row's first reader (its
         * max) waited on memory.  A slice before each chunk an op
         * evaluates (c->slots of them a row): all at once, the prefetches
         * waited for fill buffers (half of row_span's time, measured) */
        const char *pf[NT_F_MAXEXT];
        int npf = 0, slot = 0;
        const int64_t pf_lines = (C * (int64_t)sizeof(float) + 63) / 64;
        const int64_t pf_per = (pf_lines + c->slots - 1) / c->slots;
        if (r + 1 < r1) {
            int64_t nidx[NT_MAX_DIMS];
            memcpy(nidx, idx, sizeof nidx);
            nt__idx_next(nidx, nd - 1, shape);
            for (int e = 0; e < P->next; e++)
                if (!P->ext[e].red && ev[e].dt == NT_F32 && ev[e].stride[nd - 1] == 1)
                    pf[npf++] =
                        (const char *)((const float *)ev[e].data + offset_of(&ev[e], nidx, nd));
        }
#define ROW_PREFETCH()                                                                     \
    do {                                                                                   \
        for (int e = 0; e < npf; e++)                                                      \
            for (int64_t b = slot * pf_per; b < (slot + 1) * pf_per && b < pf_lines; b++)  \
                __builtin_prefetch(pf[e] + 64 * b, 0, 2);                                  \
        slot++;                                                                            \
    } while (0)
        for (int k = 0; k < P->nops; k++) {
            const nt__fop *o = &P->ops[k];
            const nt__fval *ov_ = &P->vals[o->out];
            opnd a[3];
            for (int q = 0; q < o->nin; q++) {
                int s = o->a[q];
                if (NT_F_IS_EXT(s)) {
                    int e = NT_F_EXT_IDX(s);
                    float *dst = E + (size_t)e * (size_t)C;
                    bool red = P->ext[e].red;
                    if (!red && ev[e].dt == NT_F32 && ev[e].stride[nd - 1] == 1) {
                        /* contiguous f32: read in place */
                        a[q] = (opnd){(const float *)ev[e].data + offset_of(&ev[e], idx, nd),
                                      NT_F32, false};
                        continue;
                    }
                    if (!loaded[e]) {
                        load(dst, &ev[e], offset_of(&ev[e], idx, nd), ev[e].stride[nd - 1],
                             red ? 1 : C);
                        loaded[e] = true;
                    }
                    a[q] = (opnd){dst, (nt_dtype)P->ext[e].dtype, red};
                } else {
                    a[q] = (opnd){at[s], (nt_dtype)P->vals[s].dtype, P->vals[s].red};
                }
            }
            float *out = at[o->out];
            if (row_reduces(o->op)) {
                /* the reduced row, as the unfused kernel loads it */
                ROW_PREFETCH();
                float v = row_reduce(o->op, as_f32(&a[0], scratch, C), C);
                settle_f(out, (nt_dtype)ov_->dtype, &v, 1);
                continue;
            }
            if (is_sr(o)) {
                /* a per-row value's index is its row; a full one's r*C + j */
                if (ov_->red)
                    eval_sr((nt_dtype)ov_->dtype, a, out, 1, scratch + C, keys[k], r);
                else
                    for (int64_t j = 0; j < C; j += ROW_CH) {
                        int64_t n = C - j < ROW_CH ? C - j : ROW_CH;
                        opnd aj = a[0];
                        if (!aj.scalar)
                            aj.p = (const float *)a[0].p + j;
                        eval_sr((nt_dtype)ov_->dtype, &aj, out + j, n, scratch + C, keys[k],
                                r * C + j);
                    }
            } else if (ov_->red) {
                eval(o, (nt_dtype)ov_->dtype, a, out, 1, scratch + C, c->canon[k]);
            } else {
                const int so = c->chunk_out[k];
                float *dst = so >= 0 ? (float *)ov[so].data + offset_of(&ov[so], idx, nd) : NULL;
                for (int64_t j = 0; j < C; j += ROW_CH) {
                    int64_t n = C - j < ROW_CH ? C - j : ROW_CH;
                    opnd aj[3];
                    ROW_PREFETCH();
                    for (int q = 0; q < o->nin; q++) /* field by field: no rep movs */
                        aj[q] = (opnd){a[q].scalar ? a[q].p : (const float *)a[q].p + j, a[q].dt,
                                       a[q].scalar};
                    row_piece(eval, o, (nt_dtype)ov_->dtype, aj, dst, out, j, n, cbuf,
                              scratch + C, c->canon[k]);
                }
            }
        }
#undef ROW_PREFETCH
        for (int s = 0; s < P->nout; s++) {
            int v = P->out_val[s];
            const nt__fval *val = &P->vals[v];
            if (direct[v] == s || c->chunk_out[def_op(P, v)] == s)
                continue;
            if (c->stream[s])
                stream_f32((float *)ov[s].data + offset_of(&ov[s], idx, nd), at[v], C);
            else
                store(&ov[s], offset_of(&ov[s], idx, nd), ov[s].stride[nd - 1], at[v],
                      (nt_dtype)val->dtype, val->red ? 1 : C);
        }
        nt__idx_next(idx, nd - 1, shape); /* next row */
    }
    stream_fence();
    free(buf);
    return 0;
}

/* row_span_tiled's buffers, and the tile it is on */
typedef struct tile_run {
    const row_ctx *c;
    eval_fn *eval;
    int64_t (*tidx)[NT_MAX_DIMS]; /* the index of each of the tile's rows */
    float *E, *X, *scratch, *cbuf; /* loaded inputs, expanded operands, eval's, a chunk */
    float *at[NT_F_MAXVALS];       /* each value's tile */
    bool inv_loaded[NT_F_MAXEXT];  /* a tile_inv input already loaded this span */
    int64_t r, mm, n_t;            /* the tile: rows [r, r + mm), mm * C elements */
    bool loaded[NT_F_MAXEXT];      /* an input loaded for this tile */
} tile_run;

/* The operands of op o over the tile: a value's tile, an input read in
 * place (tile_in) or loaded row by row (a tile_inv one once a span). */
static void tile_operands(tile_run *t, const nt__fop *o, opnd *a)
{
    const row_ctx *c = t->c;
    const nt__fprog *P = c->g->prog;
    const int nd = P->ndim;
    const int64_t C = c->C, TC = c->m * C;
    const mview *ev = c->ev;
    for (int q = 0; q < o->nin; q++) {
        int s = o->a[q];
        if (!NT_F_IS_EXT(s)) {
            a[q] = (opnd){t->at[s], (nt_dtype)P->vals[s].dtype, P->vals[s].red};
            continue;
        }
        int e = NT_F_EXT_IDX(s);
        bool red = P->ext[e].red;
        if (c->tile_in[e]) {
            a[q] = (opnd){(const float *)ev[e].data + offset_of(&ev[e], t->tidx[0], nd), NT_F32,
                          false};
            continue;
        }
        float *dst = t->E + (size_t)e * (size_t)TC;
        if (!t->loaded[e] && !(c->tile_inv[e] && t->inv_loaded[e])) {
            for (int64_t i = 0; i < t->mm; i++)
                load(red ? dst + i : dst + i * C, &ev[e], offset_of(&ev[e], t->tidx[i], nd),
                     ev[e].stride[nd - 1], red ? 1 : C);
            /* the first tile is the longest: every later one finds its
             * rows there */
            t->inv_loaded[e] = true;
        }
        t->loaded[e] = true;
        a[q] = (opnd){dst, (nt_dtype)P->ext[e].dtype, red};
    }
}

/* A reduction: row by row, each over its own row alone. */
static void tile_reduce(const tile_run *t, const nt__fop *o, const opnd *a)
{
    const int64_t C = t->c->C;
    const nt_dtype dt = (nt_dtype)t->c->g->prog->vals[o->out].dtype;
    float *out = t->at[o->out];
    for (int64_t i = 0; i < t->mm; i++) {
        opnd ai = a[0];
        ai.p = (const float *)a[0].p + (a[0].scalar ? i : i * C);
        float v = row_reduce(o->op, as_f32(&ai, t->scratch, C), C);
        settle_f(out + i, dt, &v, 1);
    }
}

/* A stochastic-rounding cast: a per-row value's index is its row; a full
 * one's r * C + j. */
static void tile_sr(const tile_run *t, int k, const opnd *a)
{
    const row_ctx *c = t->c;
    const nt__fop *o = &c->g->prog->ops[k];
    const nt__fval *ov_ = &c->g->prog->vals[o->out];
    const int64_t C = c->C;
    float *out = t->at[o->out], *scr = t->scratch + C;
    for (int64_t i = 0; i < t->mm; i++) {
        opnd ai = a[0];
        if (ov_->red) {
            ai.p = (const float *)a[0].p + i;
            eval_sr((nt_dtype)ov_->dtype, &ai, out + i, 1, scr, c->keys[k], t->r + i);
            continue;
        }
        for (int64_t j = 0; j < C; j += ROW_CH) {
            int64_t n = C - j < ROW_CH ? C - j : ROW_CH;
            ai.p = (const float *)a[0].p + (a[0].scalar ? i : i * C + j);
            eval_sr((nt_dtype)ov_->dtype, &ai, out + i * C + j, n, scr, c->keys[k],
                    (t->r + i) * C + j);
        }
    }
}

/* An op of a full-row result: each per-row operand expanded over its row
 * (row_span passes it as one broadcast value: the same value at each
 * element), then the whole tile in chunks, an output held whole streamed
 * out as it goes (chunk_out). */
static void tile_full(const tile_run *t, int k, opnd *a)
{
    const row_ctx *c = t->c;
    const nt__fprog *P = c->g->prog;
    const nt__fop *o = &P->ops[k];
    const int64_t C = c->C, TC = c->m * C;
    for (int q = 0; q < o->nin; q++)
        if (a[q].scalar) { /* a per-row operand, over its row */
            const uint32_t *src = a[q].p;
            uint32_t *x = (uint32_t *)t->X + (size_t)q * (size_t)TC;
            for (int64_t i = 0; i < t->mm; i++)
                for (int64_t j = 0; j < C; j++)
                    x[i * C + j] = src[i];
            a[q] = (opnd){x, a[q].dt, false};
        }
    const int so = c->chunk_out[k];
    float *dst = so >= 0 ? (float *)c->ov[so].data + offset_of(&c->ov[so], t->tidx[0], P->ndim)
                         : NULL;
    for (int64_t j = 0; j < t->n_t; j += ROW_CH) {
        int64_t n = t->n_t - j < ROW_CH ? t->n_t - j : ROW_CH;
        opnd aj[3];
        for (int q = 0; q < o->nin; q++)
            aj[q] = (opnd){(const float *)a[q].p + j, a[q].dt, false};
        row_piece(t->eval, o, (nt_dtype)P->vals[o->out].dtype, aj, dst, t->at[o->out], j, n,
                  t->cbuf, t->scratch + C, c->canon[k]);
    }
}

/* Op k over the tile. */
static void tile_op(tile_run *t, int k)
{
    const row_ctx *c = t->c;
    const nt__fop *o = &c->g->prog->ops[k];
    const nt__fval *ov_ = &c->g->prog->vals[o->out];
    opnd a[3];
    tile_operands(t, o, a);
    if (row_reduces(o->op)) {
        tile_reduce(t, o, a);
    } else if (is_sr(o)) {
        tile_sr(t, k, a);
    } else if (ov_->red) { /* every operand per-row: the tile's rows at once */
        opnd ar[3];
        for (int q = 0; q < o->nin; q++)
            ar[q] = (opnd){a[q].p, a[q].dt, false};
        t->eval(o, (nt_dtype)ov_->dtype, ar, t->at[o->out], t->mm, t->scratch + c->C,
                c->canon[k]);
    } else {
        tile_full(t, k, a);
    }
}

/* The tile's outputs not written in place: row by row at its end. */
static void tile_store(const tile_run *t)
{
    const row_ctx *c = t->c;
    const nt__fprog *P = c->g->prog;
    const int nd = P->ndim;
    const mview *ov = c->ov;
    for (int s = 0; s < P->nout; s++) {
        int v = P->out_val[s];
        const nt__fval *val = &P->vals[v];
        if (c->direct[v] == s || c->chunk_out[def_op(P, v)] == s)
            continue;
        if (c->stream[s]) {
            stream_f32((float *)ov[s].data + offset_of(&ov[s], t->tidx[0], nd), t->at[v], t->n_t);
            continue;
        }
        for (int64_t i = 0; i < t->mm; i++)
            store(&ov[s], offset_of(&ov[s], t->tidx[i], nd), ov[s].stride[nd - 1],
                  val->red ? t->at[v] + i : t->at[v] + i * c->C, (nt_dtype)val->dtype,
                  val->red ? 1 : c->C);
    }
}

/* row_span over tiles of c->m rows: each op runs over a whole tile at once
 * (a reduction still row by row, over its own row alone).  The same ops on
 * the same values as row_span, element by element -- only more elements a
 * call -- so the same bits:
 *  - a full-row value of a tile is its rows one after the other; an input
 *    whose rows are adjacent in memory (tile_in) is read in place, any other
 *    loaded row by row as row_span loads it (a weight read by every row at
 *    the same place, tile_inv, only once a span);
 *  - a per-row value is the tile's rows' values one after the other; an
 *    elementwise op of per-row values runs on all of them at once;
 *  - an op of a full-row result with a per-row operand reads that operand
 *    expanded over its row (row_span passes it as one broadcast value: the
 *    same value at each element, and each element's operation is IEEE's, or
 *    for * and / at the AVX-512 level the exact route's same bits);
 *  - a stochastic-rounding cast keys each element by its own index, as in
 *    row_span.
 * Outputs are written as row_span writes them: in place when the output's
 * rows are adjacent too (direct, chunk_out, stream: run_row checks), else
 * row by row at the tile's end. */
static int row_span_tiled(const row_ctx *c, int64_t r0, int64_t r1)
{
    const nt__fprog *P = c->g->prog;
    const int nd = P->ndim;
    const int64_t *shape = P->shape;
    const int64_t C = c->C, M = c->m, TC = M * C;
    const mview *ev = c->ev, *ov = c->ov;
    /* registers and loaded inputs of a tile each, three expanded operands;
     * then eval's scratch (4 chunks) and a row for a reduction's operand;
     * then one chunk for a streamed output (chunk_out), cache-line aligned */
    size_t cells = (size_t)(c->nregs + P->next + 3) * (size_t)TC;
    size_t nbuf = (cells + (size_t)C + 5 * ROW_CH + 16 + 15) & ~(size_t)15;
    float *buf = aligned_alloc(64, sizeof(float) * nbuf);
    tile_run t = {.c = c, .eval = eval_isa(), .tidx = malloc(sizeof *t.tidx * (size_t)M)};
    if (!buf || !t.tidx) {
        free(buf), free(t.tidx);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's buffers");
    }
    t.E = buf + (size_t)c->nregs * (size_t)TC;
    t.X = t.E + (size_t)P->next * (size_t)TC; /* expanded operands: 3 tiles */
    t.scratch = t.X + 3 * (size_t)TC;
    t.cbuf = (float *)(((uintptr_t)(t.scratch + C + 4 * ROW_CH) + 63) & ~(uintptr_t)63);
    for (int v = 0; v < P->nvals; v++)
        t.at[v] = c->reg[v] >= 0 ? buf + (size_t)c->reg[v] * (size_t)TC : NULL;
    int64_t idx[NT_MAX_DIMS] = {0};
    for (int64_t rem = r0, d = nd - 2; d >= 0; d--) {
        idx[d] = rem % shape[d];
        rem /= shape[d];
    }
    for (t.r = r0; t.r < r1; t.r += t.mm) {
        t.mm = r1 - t.r < M ? r1 - t.r : M, t.n_t = t.mm * C;
        for (int64_t i = 0; i < t.mm; i++) {
            idx[nd - 1] = 0;
            memcpy(t.tidx[i], idx, sizeof idx);
            nt__idx_next(idx, nd - 1, shape);
        }
        idx[nd - 1] = 0; /* now the next tile's first row */
        memset(t.loaded, 0, sizeof t.loaded);
        for (int v = 0; v < P->nvals; v++)
            if (c->direct[v] >= 0)
                t.at[v] = (float *)ov[c->direct[v]].data +
                          offset_of(&ov[c->direct[v]], t.tidx[0], nd);
        /* the next tile of each input read in place, into L2, a slice
         * before each op (as row_span does for the next row) */
        const char *pf[NT_F_MAXEXT];
        int npf = 0;
        const int64_t pf_lines = (TC * (int64_t)sizeof(float) + 63) / 64;
        const int64_t pf_per = (pf_lines + c->slots - 1) / c->slots;
        if (t.r + t.mm < r1)
            for (int e = 0; e < P->next; e++)
                if (c->tile_in[e])
                    pf[npf++] = (const char *)((const float *)ev[e].data + offset_of(&ev[e], idx, nd));
        for (int k = 0; k < P->nops; k++) {
            for (int e = 0; e < npf; e++)
                for (int64_t b = k * pf_per; b < (k + 1) * pf_per && b < pf_lines; b++)
                    __builtin_prefetch(pf[e] + 64 * b, 0, 2);
            tile_op(&t, k);
        }
        tile_store(&t);
    }
    stream_fence();
    free(buf);
    free(t.tidx);
    return 0;
}

static void row_block(void *arg, int b)
{
    row_ctx *c = arg;
    int64_t r0 = (int64_t)b * c->rows, r1 = r0 + c->rows < c->R ? r0 + c->rows : c->R;
    int rc = c->m > 1 ? row_span_tiled(c, r0, r1) : row_span(c, r0, r1);
    if (rc)
        c->rc = rc;
}

/* The rows of m (over the iteration shape [..., C]) follow one another in
 * memory: row r starts at r * C from row 0 (contiguous over every dim, or
 * only a dim of extent 1 out of step). */
static bool rows_adjacent(const mview *m, int nd, const int64_t *shape)
{
    if (m->stride[nd - 1] != 1)
        return false;
    int64_t want = shape[nd - 1];
    for (int d = nd - 2; d >= 0; d--) {
        if (shape[d] != 1 && m->stride[d] != want)
            return false;
        want *= shape[d];
    }
    return true;
}

/* Every row of m is the same memory (stride 0 along every dim but the
 * row's own). */
static bool rows_invariant(const mview *m, int nd, const int64_t *shape)
{
    for (int d = 0; d < nd - 1; d++)
        if (shape[d] != 1 && m->stride[d] != 0)
            return false;
    return true;
}

static int run_row(const nt__fgroup *g)
{
    const nt__fprog *P = g->prog;
    int nd = P->ndim;
    const int64_t *shape = P->shape;
    row_ctx *c = malloc(sizeof *c);
    if (!c)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's buffers");
    c->g = g;
    c->rc = 0;
    c->C = shape[nd - 1];
    c->R = c->C ? nt__numel(nd, shape) / c->C : 0;
    for (int k = 0; k < P->next; k++)
        mview_of(&c->ev[k], g->ext[k], nd, shape);
    for (int s = 0; s < P->nout; s++) {
        /* per-row outputs are [..., 1]: view them at the full shape, with
         * stride 0 along the row */
        mview_of(&c->ov[s], g->out[s], nd, shape);
    }
    sr_keys(g, c->keys);
    c->nregs = plan_regs(P, 0, -1, c->reg);
    plan_canon(P, 0, c->canon);
    c->m = c->C >= 1 && c->C <= ROW_TILE_MAXC && __atomic_load_n(&nt__cpu_row_tiles, __ATOMIC_RELAXED)
               ? ROW_CH / c->C
               : 1;
    for (int e = 0; e < P->next; e++) {
        c->tile_in[e] = !P->ext[e].red && c->ev[e].dt == NT_F32 && rows_adjacent(&c->ev[e], nd, shape);
        c->tile_inv[e] = rows_invariant(&c->ev[e], nd, shape);
    }
    for (int v = 0; v < P->nvals; v++)
        c->direct[v] = -1;
    for (int s = 0; s < P->nout; s++) {
        int v = P->out_val[s];
        /* full rows only (a per-row output is strided by 0 along the row);
         * in tiles, only into rows that are adjacent */
        c->stream[s] = false;
        if (!P->vals[v].red && c->direct[v] < 0 && !is_sr(&P->ops[def_op(P, v)]) &&
            direct_out(g, c->ov, s, nd) && (c->m == 1 || rows_adjacent(&c->ov[s], nd, shape))) {
            if (c->R * c->C * (int64_t)sizeof(float) >= STREAM_MIN)
                c->stream[s] = true;
            else
                c->direct[v] = (int8_t)s;
        }
    }
    for (int k = 0; k < P->nops; k++)
        c->chunk_out[k] = -1;
    for (int s = 0; s < P->nout; s++) {
        int v = P->out_val[s], k = def_op(P, v);
        bool read_later = false;
        for (int q = k + 1; q < P->nops; q++)
            for (int i = 0; i < P->ops[q].nin; i++)
                read_later |= P->ops[q].a[i] == v;
        for (int s2 = 0; s2 < P->nout; s2++) /* nor copied out to another slot */
            read_later |= s2 != s && P->out_val[s2] == v;
        /* an f32 value of one op (stream: not SR, not per-row) read by no
         * later op: its register holds nothing anyone needs */
        if (c->stream[s] && !read_later && c->chunk_out[k] < 0)
            c->chunk_out[k] = (int8_t)s;
    }
    /* one prefetch slice per reduction and per chunk of a full-row op */
    c->slots = 0;
    for (int k = 0; k < P->nops; k++) {
        const nt__fop *o = &P->ops[k];
        if (row_reduces(o->op))
            c->slots++;
        else if (!P->vals[o->out].red && !is_sr(o))
            c->slots += (int)((c->C + ROW_CH - 1) / ROW_CH);
    }
    if (c->m > 1) /* row_span_tiled: one slice before each op */
        c->slots = P->nops;
    if (c->slots < 1)
        c->slots = 1;
    /* blocks of about EW_SPAN elements; fewer than two run on this thread */
    c->rows = c->C >= EW_SPAN ? 1 : EW_SPAN / (c->C ? c->C : 1);
    int nblocks = (int)((c->R + c->rows - 1) / c->rows);
    if (c->R > 0)
        nt__par_blocks(nblocks, row_block, c, nblocks >= 2);
    int rc = c->rc;
    free(c);
    return rc;
}

/* ---------------- MM ---------------- */

/* A scratch buffer for a value the kernel does not store: a contiguous
 * tensor of the shape and dtype in *t (storage *st, its bytes *buf, which
 * the caller frees).  0 or the error. */
static int scratch_val(nt_tensor *t, nt__storage *st, void **buf, nt_dtype dt, int ndim,
                       const int64_t *shape)
{
    size_t nb = (size_t)nt__numel(ndim, shape) * nt__dtype_size(dt);
    *buf = malloc(nb ? nb : 1);
    if (!*buf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's buffers");
    memset(st, 0, sizeof *st);
    st->data = *buf;
    st->nbytes = nb;
    memset(t, 0, sizeof *t);
    t->st = st;
    t->dtype = dt;
    t->ndim = (int8_t)ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    nt__contig_strides(ndim, shape, t->stride);
    return 0;
}

/* The matmul runs as the CPU kernel does, into its output if that is
 * stored, else into a scratch buffer; the epilogue then reads it like an
 * input.  (On the CPU there is no accumulator to evacuate; what matters here
 * is the same bits.) */
/* A program whose ops[0] is a kernel of its own -- the matmul of NT_FK_MM,
 * the layer norm of NT_FK_NORM, its operands external inputs -- and the
 * rest an elementwise epilogue over its output: the op's own kernel into
 * its output (or a scratch buffer when the value is not stored), then the
 * epilogue over it as an elementwise program, so the bits of the records
 * one by one. */
static int run_head(const nt__fgroup *g)
{
    const nt__fprog *P = g->prog;
    const nt__fop *mm = &P->ops[0];
    const nt__fval *v0 = &P->vals[0];
    nt_tensor *dst = v0->store >= 0 ? g->out[v0->store] : NULL;
    nt__storage tmp_st;
    nt_tensor tmp;
    void *scratch = NULL;
    if (!dst) {
        int rc = scratch_val(&tmp, &tmp_st, &scratch, (nt_dtype)v0->dtype, P->ndim, P->shape);
        if (rc)
            return rc;
        dst = &tmp;
    }
    nt__rec r;
    nt__fop_rec(&r, g, mm, dst);
    int rc = nt__cpu_kernels[mm->op](&r);
    if (!rc && P->nops > 1) {
        mview pre;
        mview_of(&pre, dst, P->ndim, P->shape);
        rc = run_ew(g, 1, 0, &pre);
    }
    free(scratch);
    return rc;
}

/* A product with side ops (fusion/ir.h), each by its own record's kernel
 * on the operands that record read, in the group's record order (before
 * the product and its epilogue, which write nothing they read): the side
 * sum over A seen as [rows, K], the side product A^T . X through A's
 * transposed view (nt__fside_at) -- the bits of running each alone. */
static int run_mm_side(const nt__fgroup *g)
{
    const nt__fprog *P = g->prog;
    int ks = 0;
    for (int k = 1; k < P->nops && !ks; k++)
        ks = nt__fop_is_side(P, k) ? k : 0;
    if (!ks)
        return run_head(g);
    nt__fprog *rp = malloc(sizeof *rp);
    if (!rp)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a fused kernel's program");
    nt__fgroup rest;
    nt_tensor *so[2];
    int sk[2];
    const nt_tensor *A = g->ext[NT_F_EXT_IDX(P->ops[0].a[0])];
    int ns = nt__fgroup_split(g, &rest, rp, so, sk, 2);
    int rc = ns >= 1 && A->ndim >= 1 && nt__is_contig(A) ? 0 : NT_ENOTSUP;
    for (int i = 0; i < ns && !rc; i++) {
        const nt__fop *o = &P->ops[sk[i]];
        if (!so[i])
            continue; /* not stored: nothing reads it */
        nt_tensor x;
        nt__fside_at(A, &x); /* [K, rows] */
        nt__rec r;
        memset(&r, 0, sizeof r);
        r.op = o->op;
        r.nin = o->nin;
        r.nout = 1;
        r.out[0] = so[i];
        r.p = o->p;
        r.in[0] = &x;
        if (o->op == NT_OP_MATMUL) {
            r.in[1] = g->ext[NT_F_EXT_IDX(o->a[1])];
        } else { /* the sum's [rows, K] */
            x.shape[0] = x.shape[1], x.shape[1] = A->ndim ? A->shape[A->ndim - 1] : 1;
            x.stride[0] = x.shape[1], x.stride[1] = 1;
        }
        rc = nt__cpu_kernels[o->op](&r);
    }
    if (!rc)
        rc = run_head(&rest);
    free(rp);
    return rc;
}

/* NT_FK_BN (fusion/ir.h): the batch norm's kernel with the relu in its
 * passes (nt__cpu_bn_relu_fwd / _bwd), a value not stored going to a
 * scratch buffer; when the relu_bwd value is stored (something else reads
 * it), its own kernel and then the norm's on it.  The bits of the records
 * one by one either way. */
static int run_bn(const nt__fgroup *g)
{
    const nt__fprog *P = g->prog;
    const nt__fop *bo, *ro;
    bool fwd = nt__fbn_ops(P, &bo, &ro);
    /* the norm's two outputs and the relu's value: a stored tensor or scratch */
    int vs[3] = {bo->out, bo->out + 1, ro->out};
    nt_tensor *t[3], tmp[3];
    nt__storage st[3];
    void *buf[3] = {0};
    int64_t C = P->ndim >= 2 ? P->shape[1] : 0, sh2[2] = {2, C};
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        const nt__fval *v = &P->vals[vs[i]];
        t[i] = v->store >= 0 ? g->out[v->store] : NULL;
        if (!t[i] && !rc && !(fwd && i == 0)) /* the forward's y may go unwritten */
            rc = scratch_val(&tmp[i], &st[i], &buf[i], (nt_dtype)v->dtype, i == 1 ? 2 : P->ndim,
                             i == 1 ? sh2 : P->shape),
            t[i] = &tmp[i];
    }
    nt__rec r, rr;
    nt__fbn_rec(&r, g, t[0], t[1]);
    if (!rc && fwd) {
        rc = nt__cpu_bn_relu_fwd(&r, t[2]);
    } else if (!rc && P->vals[ro->out].store < 0) { /* the relu_bwd value stays in the passes */
        rc = nt__cpu_bn_relu_bwd(&r, g->ext[NT_F_EXT_IDX(ro->a[1])]);
    } else if (!rc) {
        nt__fop_rec(&rr, g, ro, t[2]);
        r.in[0] = t[2];
        rc = nt__cpu_kernels[NT_OP_RELU_BWD](&rr);
        if (!rc)
            rc = nt__cpu_kernels[NT_OP_BN_BWD](&r);
    }
    for (int i = 0; i < 3; i++)
        free(buf[i]);
    return rc;
}

int nt__fused_cpu(const nt__fgroup *g)
{
    switch (g->prog->kind) {
    case NT_FK_EW: return run_ew(g, 0, -1, NULL);
    case NT_FK_ROW: return run_row(g);
    case NT_FK_MM: return run_mm_side(g);
    case NT_FK_NORM: return run_head(g);
    case NT_FK_BN: return run_bn(g);
    }
    return NT_ENOTSUP;
}
