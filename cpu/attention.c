/* cpu/attention.c - scaled dot-product attention and its backward: the
 * reference the simulator's tile program (neuron/attention.c) matches
 * bit for bit.
 *
 * The arithmetic is the op's definition (docs/ops.md §7a), flash-attention
 * style: per batch and query block of NT_ATTN_BLOCK rows, the key blocks in
 * ascending order, each folded into a running max m, sum l and f32
 * accumulator o; scores never exist for more than one block.  Every product
 * goes through nt__gemm_ktile (one K-tile: D, Dv and the block sizes are <=
 * 128) and every scalar step through core/ewise.h and the canonical
 * reductions, in the order the tile program issues its instructions.
 *
 * sdpa:     in q, k, v, mask (NULL, u8 or floating); out o (q's dtype),
 *           lse (f32 [..., Tq]: m + log(max(l, 1)), for the backward).
 * sdpa_bwd: in qx = [q | dO | O], kv = [k | v] (per batch, the row-major
 *           blocks one after the other: [..., Tq*D + 2*Tq*Dv] and [...,
 *           Tk*D + Tk*Dv]), lse, mask; out dq [..., Tq, D] and dkv = [dk |
 *           dv] packed like kv.  p.i[0..3] = D, Dv, Tq, Tk.  The scores are recomputed block by block
 *           (FlashAttention-2): P = exp(s - lse), Dr = rowsum(dO * O),
 *           dS = ((dP - Dr) * scale) * P. */
#include "cpu/cpu.h"

#include <math.h>
#include <float.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "core/attn.h"
#include "core/ewise.h"
#include "core/gemm.h"
#include "core/nmath.h"
#include "core/reduce.h"

#define BLK NT_ATTN_BLOCK

typedef struct attn_ctx {
    nt__attn_geom g;
    nt__attn_opnd q, k, v, m, o, dO, O, lse, dq, dk, dv;
    bool has_mask, causal;
    bool placed; /* the backward's dq, dk, dv where q, k, v lie (p.i[5]) */
    float scale;
    float exp_lo; /* exp(-104): nt__expf's value for every x < -104 */
    int64_t Tq, Tk, D, Dv;
} attn_ctx;

static inline float ld(const nt__attn_opnd *x, int64_t boff, int64_t r, int64_t c)
{
    return nt__load_f32(x->base, x->dt, boff + r * x->rs + c * x->cs);
}

/* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols, in tiles of
 * 16 x 16: a row-at-a-time transpose writes one cache line per element. */
static void transpose(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                      int64_t cols)
{
    enum { TB = 16 };
    for (int64_t r0 = 0; r0 < rows; r0 += TB) {
        int64_t r1 = r0 + TB < rows ? r0 + TB : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += TB) {
            int64_t c1 = c0 + TB < cols ? c0 + TB : cols;
            int64_t c = c0;
#if defined(__SSE2__)
            /* whole 4 x 4 squares with SSE shuffles (copies: no value changes) */
            int64_t r4 = r0 + (r1 - r0) / 4 * 4;
            for (; c + 4 <= c1; c += 4) {
                for (int64_t r = r0; r < r4; r += 4) {
                    __m128 x0 = _mm_loadu_ps(src + r * lds + c);
                    __m128 x1 = _mm_loadu_ps(src + (r + 1) * lds + c);
                    __m128 x2 = _mm_loadu_ps(src + (r + 2) * lds + c);
                    __m128 x3 = _mm_loadu_ps(src + (r + 3) * lds + c);
                    _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
                    _mm_storeu_ps(dst + c * ldd + r, x0);
                    _mm_storeu_ps(dst + (c + 1) * ldd + r, x1);
                    _mm_storeu_ps(dst + (c + 2) * ldd + r, x2);
                    _mm_storeu_ps(dst + (c + 3) * ldd + r, x3);
                }
                for (int64_t cc = c; cc < c + 4; cc++)
                    for (int64_t r = r4; r < r1; r++)
                        dst[cc * ldd + r] = src[r * lds + cc];
            }
#endif
            for (; c < c1; c++)
                for (int64_t r = r0; r < r1; r++)
                    dst[c * ldd + r] = src[r * lds + c];
        }
    }
}

/* block [r0, r0+nr) x [0, nc) of x at batch offset boff -> f32, row-major
 * (ld = nc) or transposed (trans: [nc][nr]) */
static void pack(float *dst, const nt__attn_opnd *x, int64_t boff, int64_t r0, int64_t nr,
                 int64_t nc, bool trans)
{
    if (x->dt == NT_F32 && x->cs == 1) { /* the usual case: rows of floats */
        const float *rows = (const float *)x->base + boff + r0 * x->rs;
        if (trans) {
            transpose(dst, nr, rows, x->rs, nr, nc);
            return;
        }
        for (int64_t r = 0; r < nr; r++)
            memcpy(dst + r * nc, rows + r * x->rs, (size_t)nc * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) {
            float v = ld(x, boff, r0 + r, c);
            if (trans)
                dst[c * nr + r] = v;
            else
                dst[r * nc + c] = v;
        }
}

/* Rows [r0, r0+nr) x [0, nc) of x as f32 rows, *ld apart: where they are
 * when x holds rows of floats, else packed into buf (*ld = nc).  The
 * products take them row-major (nt__gemm_ktile_rowa, or as B), so nothing
 * is transposed or copied for them. */
static const float *rows_f32(float *buf, const nt__attn_opnd *x, int64_t boff, int64_t r0,
                             int64_t nr, int64_t nc, int *ld)
{
    if (x->dt == NT_F32 && x->cs == 1 && x->rs >= nc && x->rs <= INT32_MAX) {
        *ld = (int)x->rs;
        return (const float *)x->base + boff + r0 * x->rs;
    }
    pack(buf, x, boff, r0, nr, nc, false);
    *ld = (int)nc;
    return buf;
}

/* Keys of row q (absolute) that block k0 of nk lets it attend: the first
 * valid_keys ones; the causal rule makes the rest -Inf. */
static inline int valid_keys(const attn_ctx *a, int64_t q, int64_t k0, int nk)
{
    if (!a->causal)
        return nk;
    int64_t c = q - k0 + 1;
    return c < 0 ? 0 : c > nk ? nk : (int)c;
}

/* s[i][j] = S * scale, then the mask and the causal rule (-Inf where a
 * query may not attend): the scores of one block, as the tile program
 * makes them (tensor_scalar, tensor_tensor add or select, affine_select).
 * Keys past a row's causal limit are -Inf whatever the product and mask,
 * so they are only stored; the loops have no branch and vectorise. */
static void scores(const attn_ctx *a, float *s, int64_t mb, int64_t q0, int Mq, int64_t k0,
                   int nk)
{
    for (int i = 0; i < Mq; i++) {
        float *si = s + i * nk;
        int c = valid_keys(a, q0 + i, k0, nk);
        if (!a->has_mask) {
            for (int j = 0; j < c; j++)
                si[j] = nt__ew_mul(si[j], a->scale);
        } else {
            for (int j = 0; j < c; j++) {
                float x = nt__ew_mul(si[j], a->scale);
                float mv = ld(&a->m, mb, q0 + i, k0 + j);
                if (a->m.dt == NT_U8)
                    x = mv != 0.0f ? x : -INFINITY;
                else
                    x = nt__ew_add(x, mv);
                si[j] = x;
            }
        }
        for (int j = c; j < nk; j++)
            si[j] = -INFINITY;
    }
}

/* nt__ew_exp(x): nt__expf clamps x below -104 to -104, so those all get
 * a->exp_lo, here without the exp (it underflows: on x86 a microcode assist
 * per underflowing operation, hundreds of cycles). */
static inline float exp_clamped(const attn_ctx *a, float x)
{
    return x < -104.0f ? a->exp_lo : nt__ew_exp(x);
}

/* S[i][j] = exp(S[i][j] + bias[i]) for rows [0, Mq) of S (nk a row), c =
 * valid_keys(q0 + i) of them valid: the causal tail (-Inf) gets the one
 * value exp(-Inf + bias) without an exp per element (see exp_clamped).  The
 * rows' valid scores plus bias are gathered into buf one after the other
 * and exponentiated by one nt__expf_n call (nt__ew_exp's bits whatever the
 * length), then put back: the same add and exp per element as one row at a
 * time, where each call had computed its row's tail padded to 64 (a causal
 * block's rows average 64 valid keys) and paid the call. */
static void exp_rows(const attn_ctx *a, float *S, int Mq, int nk, int64_t q0, int64_t k0,
                     const float *bias, float *buf)
{
    int64_t n = 0;
    for (int i = 0; i < Mq; i++) {
        const float *si = S + (int64_t)i * nk;
        int c = valid_keys(a, q0 + i, k0, nk);
        for (int j = 0; j < c; j++)
            buf[n + j] = nt__ew_add(si[j], bias[i]);
        n += c;
    }
    nt__expf_n(buf, buf, n);
    n = 0;
    for (int i = 0; i < Mq; i++) {
        float *si = S + (int64_t)i * nk;
        int c = valid_keys(a, q0 + i, k0, nk);
        memcpy(si, buf + n, (size_t)c * sizeof(float));
        n += c;
        if (c < nk) {
            float e = exp_clamped(a, nt__ew_add(-INFINITY, bias[i]));
            for (int j = c; j < nk; j++)
                si[j] = e;
        }
    }
}

/* whether key block k0 lies wholly after query block [q0, q0+Mq): causal
 * skips it (docs/ops.md §7a) */
static inline bool skip_block(const attn_ctx *a, int64_t q0, int Mq, int64_t k0)
{
    return a->causal && k0 > q0 + Mq - 1;
}

/* ---- the causal block's masked half, not computed ----
 *
 * In a key block that the causal rule cuts (valid_keys < nk for its first
 * query), the products run on row (or, for dK and dV, key) groups of SUB
 * over only the keys (queries) the group's rows can see.  Each element of a
 * product is its own fma recurrence over the shared dim from +0 (core/
 * gemm.h), so the elements computed have the full product's bits; the ones
 * not computed are scores the causal rule makes -Inf anyway (scores()
 * stores them), or dS entries, which are zeros (P = exp(-Inf - lse) = +0
 * there; the sign of a zero dS is immaterial below, so +0 is stored).  The
 * terms left out of a recurrence are those zeros times an operand: each
 * is +-0 when that operand is finite, and adding +-0 to a recurrence that
 * started from +0 (and so is never -0) changes no bit; a recurrence of
 * only such terms is +0, and C + +0 == C for a C that is never -0 (every
 * accumulator here is a sum of such recurrences).  So the skip is taken
 * only when the operands the left-out terms read are all finite (V
 * forward; Q, K, dO and the rows' lse backward): otherwise 0 * Inf = NaN
 * belongs to the result and the whole block is computed.  The same bits as
 * the whole block in every case (tests/test_ops.c compares both). */
#define SUB 32

/* Test hook: 0 computes every causal block whole. */
int nt__cpu_attn_causal_skip = 1;

/* The largest |x| of the rows as f32 bits (x & 0x7fffffff): for
 * non-negative floats the integer order is the float order, and a value at
 * or above 0x7f800000 is an Inf or a NaN.  One integer max a lane, so it
 * vectorises (the checks run once per block, beside its products). */
#define ABS_MAX_BODY                                                    \
    uint32_t m = 0;                                                     \
    for (int64_t r = 0; r < nr; r++) {                                  \
        const uint32_t *row = (const uint32_t *)(const void *)(x + r * ld); \
        for (int64_t c = 0; c < nc; c++) {                              \
            uint32_t u = row[c] & 0x7fffffffu;                          \
            m = u > m ? u : m;                                          \
        }                                                               \
    }                                                                   \
    return m;
static uint32_t abs_max_bits_c(const float *x, int64_t ld, int64_t nr, int64_t nc)
{
    ABS_MAX_BODY
}
#if defined(__x86_64__) && defined(__GNUC__)
/* one vector of maxima across all the rows, reduced once at the end */
__attribute__((target(NT_TARGET_AVX512))) static uint32_t
abs_max_bits_512(const float *x, int64_t ld, int64_t nr, int64_t nc)
{
    if (ld == nc) /* rows one after the other: one long row */
        nc *= nr, nr = 1;
    const __m512i am = _mm512_set1_epi32(0x7fffffff);
    const __mmask16 tail = (__mmask16)((1u << (nc % 16)) - 1u);
    __m512i m = _mm512_setzero_si512();
    for (int64_t r = 0; r < nr; r++) {
        const float *row = x + r * ld;
        int64_t c = 0;
        for (; c + 16 <= nc; c += 16)
            m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(row + c), am));
        if (tail)
            m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_maskz_loadu_epi32(tail, row + c), am));
    }
    return _mm512_reduce_max_epu32(m);
}
#endif
#undef ABS_MAX_BODY

static uint32_t abs_max_bits(const float *x, int64_t ld, int64_t nr, int64_t nc)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (nt__gemm_isa() == NT_ISA_AVX512)
        return abs_max_bits_512(x, ld, nr, nc);
#endif
    return abs_max_bits_c(x, ld, nr, nc);
}

static bool finite_rows(const float *x, int64_t ld, int64_t nr, int64_t nc)
{
    return abs_max_bits(x, ld, nr, nc) < 0x7f800000u;
}

/* The largest |x| of the rows, as a double: +Inf if one is not finite. */
static double max_abs(const float *x, int64_t ld, int64_t nr, int64_t nc)
{
    uint32_t m = abs_max_bits(x, ld, nr, nc);
    float f;
    memcpy(&f, &m, 4);
    return m < 0x7f800000u ? (double)f : INFINITY;
}

/* The block (q0, Mq) x (k0, nk) is cut by the causal rule and may skip its
 * masked part (the operands' finiteness is the caller's to check). */
static inline bool causal_cut(const attn_ctx *a, int64_t q0, int64_t k0, int nk)
{
    return a->causal && valid_keys(a, q0, k0, nk) < nk &&
           __atomic_load_n(&nt__cpu_attn_causal_skip, __ATOMIC_RELAXED);
}

/* C[Mq, ncol] (ldc) = A[Mq, K] (row-major, lda) . B[K, ncol], only the
 * columns each group of SUB rows can see (valid_keys of its last row);
 * acc: C += the product.  A group that sees no key: C = +0, or unchanged
 * under acc. */
static void causal_rows_product(const attn_ctx *a, int64_t q0, int Mq, int64_t k0, int nk, int K,
                                const float *A, int lda, const float *B, int ldb, float *C,
                                int ldc, int ncol_all, bool cols_are_keys, bool acc)
{
    for (int i0 = 0; i0 < Mq; i0 += SUB) {
        int mi = Mq - i0 < SUB ? Mq - i0 : SUB;
        int kc = valid_keys(a, q0 + i0 + mi - 1, k0, nk);
        /* the product's columns are keys (S, dP), or its shared dim is (dS K) */
        int ncol = cols_are_keys ? kc : ncol_all, kk = cols_are_keys ? K : kc;
        if (ncol == 0)
            continue; /* every column of these rows is a masked score */
        if (kk == 0) {
            if (!acc)
                for (int i = 0; i < mi; i++)
                    memset(C + (int64_t)(i0 + i) * ldc, 0, (size_t)ncol * sizeof(float));
            continue;
        }
        nt__gemm_ktile_rowa(mi, ncol, kk, A + (int64_t)i0 * lda, lda, B, ldb,
                            C + (int64_t)i0 * ldc, ldc, acc);
    }
}

/* C[nk, N] (ldc) (+)= A^T B over the queries, A = P or dS [Mq, nk] (lda),
 * B [Mq, N] rows (ldb): each group of SUB keys over only the queries that
 * see them (key j from query j + k0 - q0 on). */
static void causal_keys_product(int64_t q0, int Mq, int64_t k0, int nk, int N, const float *A,
                                int lda, const float *B, int ldb, float *C, int ldc, bool acc)
{
    for (int j0 = 0; j0 < nk; j0 += SUB) {
        int mj = nk - j0 < SUB ? nk - j0 : SUB;
        int64_t is = k0 + j0 - q0;
        int i0 = is < 0 ? 0 : is > Mq ? Mq : (int)is;
        if (i0 == Mq) {
            if (!acc)
                for (int j = 0; j < mj; j++)
                    memset(C + (int64_t)(j0 + j) * ldc, 0, (size_t)N * sizeof(float));
            continue;
        }
        nt__gemm_ktile(mj, N, Mq - i0, A + (int64_t)i0 * lda + j0, lda, B + (int64_t)i0 * ldb,
                       ldb, C + (int64_t)j0 * ldc, ldc, acc);
    }
}

static void ctx_params(attn_ctx *a, const nt__rec *r)
{
    a->scale = (float)r->p.f[0];
    a->causal = r->p.flag != 0;
    a->has_mask = r->in[3] != NULL;
    a->exp_lo = nt__ew_exp(-104.0f);
}

/* Both kernels cut their work into independent units (a query block of a
 * batch forward, a whole batch backward: each writes its own part of the
 * outputs, in the one order of the op's definition) and run them on the
 * calling thread and the helper that the matmul primitive uses
 * (nt__par_blocks; NT_CPU_THREADS).  Two lanes, each with its own f32
 * scratch, claim units from a shared counter; which lane runs a unit never
 * changes its bits. */
#define NLANE 2

typedef struct par_run {
    attn_ctx *a;
    float *scratch[NLANE];
    int64_t nunits;
    volatile AO_t next;
    /* outputs */
    char *o, *dq, *dkv;
    float *lse;
    const float *lse_in;
    nt_dtype dt;
    int64_t es;
} par_run;

typedef void unit_fn(par_run *p, float *buf, int64_t u);

static void run_units(par_run *p, unit_fn *fn, float *buf)
{
    for (;;) {
        AO_t u = AO_fetch_and_add1(&p->next);
        if (u >= (AO_t)p->nunits)
            return;
        fn(p, buf, (int64_t)u);
    }
}

static void fwd_unit(par_run *p, float *buf, int64_t u);
static void bwd_unit(par_run *p, float *buf, int64_t u);

static void fwd_lane(void *arg, int lane)
{
    par_run *p = arg;
    run_units(p, fwd_unit, p->scratch[lane]);
}

static void bwd_lane(void *arg, int lane)
{
    par_run *p = arg;
    run_units(p, bwd_unit, p->scratch[lane]);
}

/* Lane scratch of nf floats each, or NULL (host memory short). */
static float *lanes_alloc(par_run *p, size_t nf)
{
    float *buf = g_try_malloc(nf * NLANE * sizeof(float));
    for (int i = 0; i < NLANE; i++)
        p->scratch[i] = buf ? buf + (size_t)i * nf : NULL;
    return buf;
}

/* The forward of query block q0 of batch b (unit b * nqb + q0 / BLK). */
static void fwd_unit(par_run *p, float *buf, int64_t u)
{
    const attn_ctx *ap = p->a;
    const attn_ctx a = *ap;
    int64_t D = a.D, Dv = a.Dv;
    int64_t nqb = (a.Tq + BLK - 1) / BLK;
    int64_t b = u / nqb, q0 = (u % nqb) * BLK;
    float *Qb = buf, *Kt = Qb + D * BLK, *S = Kt + D * BLK, *Pt = S + BLK * BLK,
          *Vb = Pt + BLK * BLK, *PV = Vb + BLK * Dv, *acc = PV + BLK * Dv, *m = acc + BLK * Dv,
          *l = m + BLK;
    int64_t qb = nt__attn_boff(&a.q, &a.g, b), kb = nt__attn_boff(&a.k, &a.g, b);
    int64_t vb = nt__attn_boff(&a.v, &a.g, b);
    int64_t mb = a.has_mask ? nt__attn_boff(&a.m, &a.g, b) : 0;
    int Mq = (int)(a.Tq - q0 < BLK ? a.Tq - q0 : BLK);
    int ldq, ldv;
    const float *Q = rows_f32(Qb, &a.q, qb, q0, Mq, D, &ldq);
    for (int i = 0; i < Mq; i++)
        m[i] = -FLT_MAX, l[i] = 0.0f;
    memset(acc, 0, (size_t)(Mq * Dv) * sizeof(float));
    for (int64_t k0 = 0; k0 < a.Tk && !skip_block(&a, q0, Mq, k0); k0 += BLK) {
        int nk = (int)(a.Tk - k0 < BLK ? a.Tk - k0 : BLK);
        pack(Kt, &a.k, kb, k0, nk, D, true);
        const float *V = rows_f32(Vb, &a.v, vb, k0, nk, Dv, &ldv);
        bool cut = causal_cut(&a, q0, k0, nk) && finite_rows(V, ldv, nk, Dv);
        if (cut)
            causal_rows_product(&a, q0, Mq, k0, nk, (int)D, Q, ldq, Kt, nk, S, nk, nk, true,
                                false);
        else
            nt__gemm_ktile_rowa(Mq, nk, (int)D, Q, ldq, Kt, nk, S, nk, false);
        scores(&a, S, mb, q0, Mq, k0, nk);
        /* per row: the new max, then (all rows at once) the exps, then the
         * running sums: each row's steps in the order exp_row's loop had */
        float mnew[BLK], alpha[BLK], negm[BLK];
        for (int i = 0; i < Mq; i++) {
            mnew[i] = nt__ew_maximum(m[i], nt__red_max_f32(S + i * nk, nk, 1));
            alpha[i] = exp_clamped(&a, nt__ew_sub(m[i], mnew[i])); /* m = -FLT_MAX: 0 */
            negm[i] = nt__ew_mul(mnew[i], -1.0f);
        }
        exp_rows(&a, S, Mq, nk, q0, k0, negm, Pt);
        for (int i = 0; i < Mq; i++) {
            float rs = nt__red_sum_f32(S + i * nk, nk, 1);
            l[i] = nt__ew_add(nt__ew_mul(l[i], alpha[i]), rs);
            m[i] = mnew[i];
            for (int64_t d = 0; d < Dv; d++)
                acc[i * Dv + d] = nt__ew_mul(acc[i * Dv + d], alpha[i]);
        }
        if (cut) /* P V over the keys each row group sees */
            causal_rows_product(&a, q0, Mq, k0, nk, nk, S, nk, V, ldv, PV, (int)Dv, (int)Dv,
                                false, false);
        else
            nt__gemm_ktile_rowa(Mq, (int)Dv, nk, S, nk, V, ldv, PV, (int)Dv, false);
        for (int64_t e = 0; e < Mq * Dv; e++)
            acc[e] = nt__ew_add(acc[e], PV[e]);
    }
    for (int i = 0; i < Mq; i++) {
        float ls = nt__ew_maximum(l[i], 1.0f);
        for (int64_t d = 0; d < Dv; d++)
            acc[i * Dv + d] = nt__ew_div(acc[i * Dv + d], ls);
        p->lse[b * a.Tq + q0 + i] = nt__canon(nt__ew_add(m[i], nt__ew_log(ls)));
    }
    /* out is fresh: [nbatch, Tq, Dv], or [.., Tq, H, Dv] (heads inside rows:
     * the rows Dv apart no more) */
    char *ob = p->o + (nt__attn_boff(&a.o, &a.g, b) + q0 * a.o.rs) * p->es;
    if (a.o.rs == Dv)
        nt__st_f32(ob, p->dt, 1, acc, Mq * Dv);
    else
        for (int i = 0; i < Mq; i++)
            nt__st_f32(ob + i * a.o.rs * p->es, p->dt, 1, acc + i * Dv, Dv);
}

int nt__cpu_scaled_dot_product_attention(const nt__rec *r)
{
    attn_ctx a;
    memset(&a, 0, sizeof a);
    ctx_params(&a, r);
    const nt_tensor *q = r->in[0], *k = r->in[1], *v = r->in[2];
    nt__attn_geom_of(&a.g, q);
    a.Tq = q->shape[q->ndim - 2], a.D = q->shape[q->ndim - 1];
    a.Tk = k->shape[k->ndim - 2], a.Dv = v->shape[v->ndim - 1];
    nt__attn_opnd_of(&a.q, q, &a.g, 0);
    nt__attn_opnd_of(&a.k, k, &a.g, 0);
    nt__attn_opnd_of(&a.v, v, &a.g, 0);
    if (a.has_mask)
        nt__attn_opnd_of(&a.m, r->in[3], &a.g, 0);
    const nt_tensor *o = r->out[0], *lse = r->out[1];
    nt__attn_opnd_out(&a.o, o, &a.g, r->p.i[4]);
    int64_t D = a.D, Dv = a.Dv;
    size_t nf = (size_t)(D * BLK * 2 + BLK * BLK * 2 + BLK * Dv * 3 + BLK * 2);
    par_run p;
    memset(&p, 0, sizeof p);
    float *buf = lanes_alloc(&p, nf);
    if (!buf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for attention buffers (%zu floats)",
                        nf * NLANE);
    p.a = &a;
    p.nunits = a.g.nbatch * ((a.Tq + BLK - 1) / BLK);
    p.o = nt__tensor_data(o);
    p.lse = nt__tensor_data(lse);
    p.dt = (nt_dtype)o->dtype;
    p.es = (int64_t)nt__dtype_size(p.dt);
    nt__par_blocks(NLANE, fwd_lane, &p, p.nunits >= 2);
    g_free(buf);
    return 0;
}

/* The number of f32 scratch values bwd_unit uses, and their split. */
#define BWD_NBUF 16
static size_t bwd_sizes(const attn_ctx *a, int64_t *sizes)
{
    int64_t D = a->D, Dv = a->Dv, Tq = a->Tq;
    int64_t sz[BWD_NBUF] = {Tq * D, Tq, Tq, BLK * D, BLK * D, BLK * Dv, BLK * D, BLK * Dv,
                            BLK * D, BLK * D, BLK * Dv, BLK * Dv, BLK * BLK, BLK * BLK,
                            BLK * BLK, Dv};
    size_t nf = 0;
    for (int i = 0; i < BWD_NBUF; i++)
        nf += (size_t)(sizes[i] = sz[i]);
    return nf;
}

/* Row i's dO . O elementwise into tmp (products rounded to f32). */
static void dO_times_O(const attn_ctx *a, float *tmp, int64_t gb, int64_t ob, int64_t i)
{
    if (a->dO.dt == NT_F32 && a->O.dt == NT_F32 && a->dO.cs == 1 && a->O.cs == 1) {
        /* rows of floats (packed by autograd, or dO and O read in place) */
        const float *x = (const float *)a->dO.base + gb + i * a->dO.rs;
        const float *y = (const float *)a->O.base + ob + i * a->O.rs;
        for (int64_t d = 0; d < a->Dv; d++)
            tmp[d] = nt__ew_mul(x[d], y[d]);
        return;
    }
    for (int64_t d = 0; d < a->Dv; d++)
        tmp[d] = nt__ew_mul(ld(&a->dO, gb, i, d), ld(&a->O, ob, i, d));
}

/* Rows [0, n) x [0, nc) of src (rows nc apart) to operand x (cs 1) from
 * element off, rounded to dt. */
static void store_rows(const nt__attn_opnd *x, int64_t off, nt_dtype dt, const float *src,
                       int64_t n, int64_t nc)
{
    int64_t es = (int64_t)nt__dtype_size(dt);
    for (int64_t r = 0; r < n; r++)
        nt__st_f32((char *)x->base + (off + r * x->rs) * es, dt, 1, src + r * nc, nc);
}

/* The backward of batch b (unit b): dq, dk and dv of that batch. */
static void bwd_unit(par_run *pr, float *buf, int64_t b)
{
    const attn_ctx *ap = pr->a;
    const attn_ctx a = *ap;
    int64_t D = a.D, Dv = a.Dv, Tq = a.Tq, Tk = a.Tk;
    int64_t sizes[BWD_NBUF];
    bwd_sizes(&a, sizes);
    float *p[BWD_NBUF];
    p[0] = buf;
    for (int i = 1; i < BWD_NBUF; i++)
        p[i] = p[i - 1] + sizes[i - 1];
    float *dqa = p[0], *Dr = p[1], *negl = p[2], *Kbuf = p[3], *Kt = p[4], *Vt = p[5],
          *dK = p[6], *dV = p[7], *Qbuf = p[9], *dObuf = p[10], *S = p[12], *dP = p[13],
          *tmp = p[15];
    nt_dtype dt = pr->dt;
    int64_t es = pr->es;
    int64_t qb = nt__attn_boff(&a.q, &a.g, b), kb = nt__attn_boff(&a.k, &a.g, b);
    /* (packed: the same offsets as q's and k's) */
    int64_t gb = nt__attn_boff(&a.dO, &a.g, b), ob = nt__attn_boff(&a.O, &a.g, b),
            vb = nt__attn_boff(&a.v, &a.g, b);
    int64_t mb = a.has_mask ? nt__attn_boff(&a.m, &a.g, b) : 0;
    /* Dr_i = rowsum(dO_i * O_i) (products rounded to f32, canonical sum);
     * -lse_i the exponent's bias */
    for (int64_t i = 0; i < Tq; i++) {
        dO_times_O(&a, tmp, gb, ob, i);
        Dr[i] = nt__red_sum_f32(tmp, Dv, 1);
        negl[i] = nt__ew_mul(pr->lse_in[b * Tq + i], -1.0f);
    }
    memset(dqa, 0, (size_t)(Tq * D) * sizeof(float));
    for (int64_t k0 = 0; k0 < Tk; k0 += BLK) {
        int nk = (int)(Tk - k0 < BLK ? Tk - k0 : BLK);
        int ldk, ldq, ldo;
        const float *Kb = rows_f32(Kbuf, &a.k, kb, k0, nk, D, &ldk);
        pack(Kt, &a.k, kb, k0, nk, D, true);
        pack(Vt, &a.v, vb, k0, nk, Dv, true);
        bool first = true;
        for (int64_t q0 = 0; q0 < Tq; q0 += BLK) {
            int Mq = (int)(Tq - q0 < BLK ? Tq - q0 : BLK);
            if (skip_block(&a, q0, Mq, k0))
                continue;
            const float *Qrow = rows_f32(Qbuf, &a.q, qb, q0, Mq, D, &ldq);
            const float *dOb = rows_f32(dObuf, &a.dO, gb, q0, Mq, Dv, &ldo);
            /* the left-out dS = ((dP - Dr) scale) P, P = +0, are zeros only
             * when (dP - Dr) scale is finite: |dP| <= Dv max|dO| max|V| */
            bool cut = causal_cut(&a, q0, k0, nk) && finite_rows(negl + q0, 1, Mq, 1) &&
                       finite_rows(Qrow, ldq, Mq, D) && finite_rows(Kb, ldk, nk, D);
            if (cut) {
                double bound = ((double)Dv * max_abs(dOb, ldo, Mq, Dv) * max_abs(Vt, nk, Dv, nk) +
                                max_abs(Dr + q0, 1, Mq, 1)) *
                               fabs((double)a.scale);
                cut = bound < 0x1p100;
            }
            if (cut)
                causal_rows_product(&a, q0, Mq, k0, nk, (int)D, Qrow, ldq, Kt, nk, S, nk, nk,
                                    true, false);
            else
                nt__gemm_ktile_rowa(Mq, nk, (int)D, Qrow, ldq, Kt, nk, S, nk, false);
            scores(&a, S, mb, q0, Mq, k0, nk);
            exp_rows(&a, S, Mq, nk, q0, k0, negl + q0, p[14]);
            /* dV += P^T dO (P is the stationary [Mq, nk] operand); dP = dO V^T */
            if (cut) {
                causal_keys_product(q0, Mq, k0, nk, (int)Dv, S, nk, dOb, ldo, dV, (int)Dv, !first);
                causal_rows_product(&a, q0, Mq, k0, nk, (int)Dv, dOb, ldo, Vt, nk, dP, nk, nk,
                                    true, false);
            } else {
                nt__gemm_ktile(nk, (int)Dv, Mq, S, nk, dOb, ldo, dV, (int)Dv, !first);
                nt__gemm_ktile_rowa(Mq, nk, (int)Dv, dOb, ldo, Vt, nk, dP, nk, false);
            }
            for (int i = 0; i < Mq; i++) {
                float dr = Dr[q0 + i];
                float *dPi = dP + i * nk;
                const float *Si = S + i * nk;
                int c = cut ? valid_keys(&a, q0 + i, k0, nk) : nk;
                for (int j = 0; j < c; j++)
                    dPi[j] = nt__ew_mul(nt__ew_mul(nt__ew_sub(dPi[j], dr), a.scale), Si[j]);
                for (int j = c; j < nk; j++) /* dS of a masked score: a zero */
                    dPi[j] = 0.0f;
            }
            /* dK += dS^T Q; dQ (+)= dS K, key blocks in ascending order */
            if (cut) {
                causal_keys_product(q0, Mq, k0, nk, (int)D, dP, nk, Qrow, ldq, dK, (int)D, !first);
                causal_rows_product(&a, q0, Mq, k0, nk, nk, dP, nk, Kb, ldk, dqa + q0 * D,
                                    (int)D, (int)D, false, k0 > 0);
            } else {
                nt__gemm_ktile(nk, (int)D, Mq, dP, nk, Qrow, ldq, dK, (int)D, !first);
                nt__gemm_ktile_rowa(Mq, (int)D, nk, dP, nk, Kb, ldk, dqa + q0 * D, (int)D,
                                    k0 > 0);
            }
            first = false;
        }
        if (first) { /* no query reached this block */
            memset(dK, 0, (size_t)(nk * D) * sizeof(float));
            memset(dV, 0, (size_t)(nk * Dv) * sizeof(float));
        }
        if (a.placed) { /* rows where k's and v's lie */
            store_rows(&a.dk, nt__attn_boff(&a.dk, &a.g, b) + k0 * a.dk.rs, dt, dK, nk, D);
            store_rows(&a.dv, nt__attn_boff(&a.dv, &a.g, b) + k0 * a.dv.rs, dt, dV, nk, Dv);
            continue;
        }
        /* dkv is fresh and contiguous: per batch Tk x D, then Tk x Dv */
        char *dkb = pr->dkv + b * Tk * (D + Dv) * es;
        nt__st_f32(dkb + k0 * D * es, dt, 1, dK, nk * D);
        nt__st_f32(dkb + (Tk * D + k0 * Dv) * es, dt, 1, dV, nk * Dv);
    }
    if (a.placed)
        store_rows(&a.dq, nt__attn_boff(&a.dq, &a.g, b), dt, dqa, Tq, D);
    else
        nt__st_f32(pr->dq + (b * Tq * D) * es, dt, 1, dqa, Tq * D);
}

int nt__cpu_sdpa_bwd(const nt__rec *r)
{
    attn_ctx a;
    memset(&a, 0, sizeof a);
    ctx_params(&a, r);
    const nt_tensor *qx = r->in[0], *kv = r->in[1], *lse = r->in[2];
    a.D = r->p.i[0], a.Dv = r->p.i[1], a.Tq = r->p.i[2], a.Tk = r->p.i[3];
    int64_t D = a.D, Dv = a.Dv;
    if (r->p.i[4]) { /* q, k, v in one view, dO, O, lse: read where they are */
        lse = r->in[3];
        a.has_mask = false;
        nt__attn_geom_of(&a.g, r->in[1]);
        nt__attn_opnd_stack(&a.q, qx, &a.g, 0);
        nt__attn_opnd_stack(&a.k, qx, &a.g, 1);
        nt__attn_opnd_stack(&a.v, qx, &a.g, 2);
        nt__attn_opnd_of(&a.dO, r->in[1], &a.g, 0);
        nt__attn_opnd_of(&a.O, r->in[2], &a.g, 0);
    } else {
        nt__attn_geom_flat(&a.g, qx);
        nt__attn_opnd_flat(&a.q, qx, &a.g, 0, D);
        nt__attn_opnd_flat(&a.dO, qx, &a.g, a.Tq * D, Dv);
        nt__attn_opnd_flat(&a.O, qx, &a.g, a.Tq * (D + Dv), Dv);
        nt__attn_opnd_flat(&a.k, kv, &a.g, 0, D);
        nt__attn_opnd_flat(&a.v, kv, &a.g, a.Tk * D, Dv);
    }
    if (a.has_mask)
        nt__attn_opnd_of(&a.m, r->in[3], &a.g, 0);
    const nt_tensor *dq = r->out[0], *dkv = r->p.i[5] ? NULL : r->out[1];
    if (r->p.i[5]) { /* dq, dk, dv into one buffer laid out as q, k, v */
        a.placed = true;
        nt__attn_opnd_placed(&a.dq, qx, &a.g, 0, dq);
        nt__attn_opnd_placed(&a.dk, qx, &a.g, 1, dq);
        nt__attn_opnd_placed(&a.dv, qx, &a.g, 2, dq);
    }
    /* f32 scratch per lane: dQ's accumulator and the per-row terms for a
     * whole batch, the rest per block */
    int64_t sizes[BWD_NBUF];
    size_t nf = bwd_sizes(&a, sizes) + 1;
    par_run p;
    memset(&p, 0, sizeof p);
    float *buf = lanes_alloc(&p, nf);
    if (!buf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for attention buffers (%zu floats)",
                        nf * NLANE);
    p.a = &a;
    p.nunits = a.g.nbatch;
    p.lse_in = nt__tensor_data(lse);
    p.dt = (nt_dtype)dq->dtype;
    p.es = (int64_t)nt__dtype_size(p.dt);
    p.dq = nt__tensor_data(dq);
    p.dkv = dkv ? nt__tensor_data(dkv) : NULL;
    nt__par_blocks(NLANE, bwd_lane, &p, p.nunits >= 2);
    g_free(buf);
    return 0;
}
