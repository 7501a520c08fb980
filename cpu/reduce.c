/* cpu/reduce.c - sum, mean, max, argmax over one dim (p.dim, p.flag =
 * keepdim) or over every element (NT_DIM_ALL, row-major order); and the row
 * walkers of cpu/rows.h.
 *
 * Arithmetic (the contract every backend reproduces):
 *   sum    floats: the reduced sequence widened to f32, summed in the
 *          canonical order of core/reduce.h, rounded once to the output.
 *          Integers: wrapping i32 sum (exact, so order is irrelevant) -> i32.
 *   mean   canonical f32 sum / (float)n, rounded once (n = 0 gives NaN).
 *   max    floats: canonical nt__ew_maximum reduction (NaN propagates);
 *          integers: plain max, same dtype.
 *   argmax i32 index of the first maximum; a NaN counts as the maximum, so
 *          the first NaN wins.
 *   min, argmin  the same with nt__ew_minimum (identity +Inf / INT32_MAX);
 *          a NaN counts as the minimum (PyTorch propagates NaN both ways).
 *   any    u8: 1 if an element is nonzero (NaN is nonzero), computed as the
 *          max of the 0/1 flags (f32 for floats, i32 for ints) from 0.
 *   norm   floats only, p.f[0] = ord: each element widened to f32 and
 *          mapped (ord 2: v*v; 1, +-Inf: |v|; 0: v != 0 as 1/0; p:
 *          nt__ew_pow_scalar(|v|, p)), reduced in the canonical order (sum;
 *          max for +Inf, min for -Inf), then ord 2: sqrtf, other p:
 *          nt__ew_pow_scalar(s, (float)(1 / p)); rounded once to the output.
 * The canonical order is consumed block by block (NT_RED_BLOCK elements,
 * acc = op(acc, block partial) from the identity), exactly as
 * nt__red_sum_f32 / nt__red_max_f32 do, so a long row never needs to be held
 * in memory at once. */
#include "cpu/rows.h"

#include <stdlib.h>
#include <string.h>

#include "core/ewise.h"
#include "core/ewise64.h"
#include "core/gemm.h"
#include "core/reduce.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && NT_RED_LANES == 16
#include <immintrin.h>
#define COLS_AVX512 1
#endif

/* ---------------- rows ---------------- */

void nt__rows_init(nt__rows *R, const nt_tensor *t, int d, bool same_shape)
{
    nt__rows_shape(R, t, d, same_shape);
    R->x = nt__tensor_data(t);
    R->dt = (nt_dtype)t->dtype;
    R->es = (int64_t)nt__dtype_size(R->dt);
    /* Tiles pay off when the batch dim is the more contiguous one. */
    R->tile = R->C > 1 && R->n > 1 && R->sc < R->sn;
}

/* Groups per batch index, and in all (0: nothing to walk). */
static int64_t groups_per(const nt__rows *R, int64_t wmax)
{
    return (R->C + wmax - 1) / wmax;
}

int64_t nt__rows_groups(const nt__rows *R, int64_t wmax)
{
    if (R->C == 0)
        return 0;
    if (!R->tile || wmax < 1)
        wmax = 1;
    int64_t g = groups_per(R, wmax);
    for (int i = 0; i < R->nouter; i++)
        g *= R->oshape[i];
    return g;
}

void nt__rows_range(const nt__rows *R, int64_t wmax, int64_t g0, int64_t g1, nt__rows_fn fn,
                    void *ctx)
{
    if (g0 >= g1)
        return;
    if (!R->tile || wmax < 1)
        wmax = 1;
    int64_t per = groups_per(R, wmax);
    /* the batch index of group g0, row-major over the outer dims */
    int64_t idx[NT_MAX_DIMS] = {0}, rem = g0 / per, c0 = (g0 % per) * wmax;
    for (int i = R->nouter - 1; i >= 0; i--) {
        idx[i] = rem % R->oshape[i];
        rem /= R->oshape[i];
    }
    for (int64_t g = g0; g < g1;) {
        int64_t oi = 0, oo = 0;
        for (int i = 0; i < R->nouter; i++)
            oi += idx[i] * R->osi[i], oo += idx[i] * R->oso[i];
        for (; c0 < R->C && g < g1; c0 += wmax, g++) {
            int64_t w = R->C - c0 < wmax ? R->C - c0 : wmax;
            fn(R, ctx, R->x + (oi + c0 * R->sc) * R->es, oo + c0 * R->oc, w);
        }
        c0 = 0;
        nt__idx_next(idx, R->nouter, R->oshape);
    }
}

void nt__rows_each(const nt__rows *R, int64_t wmax, nt__rows_fn fn, void *ctx)
{
    nt__rows_range(R, wmax, 0, nt__rows_groups(R, wmax), fn, ctx);
}

int nt__rows_blocks(const nt__rows *R, int64_t wmax, int64_t *per_block)
{
    int64_t G = nt__rows_groups(R, wmax);
    if (G == 0)
        return 0;
    int64_t w = R->tile && wmax > 1 ? (wmax < R->C ? wmax : R->C) : 1;
    int64_t elems = G * w * (R->n > 0 ? R->n : 1); /* about: the last group may be narrower */
    int64_t nb = elems / NT_ROWS_BLOCK_ELEMS;
    nb = nb < 1 ? 1 : nb > NT_ROWS_MAX_BLOCKS ? NT_ROWS_MAX_BLOCKS : nb;
    nb = nb < G ? nb : G;
    *per_block = (G + nb - 1) / nb;
    return (int)((G + *per_block - 1) / *per_block);
}

void nt__rows_load_f32(const nt__rows *R, const char *x, int64_t k0, int64_t m, int64_t w,
                       float *T)
{
    if (w == 1) {
        nt__ld_f32(T, x + k0 * R->sn * R->es, R->dt, R->sn, m);
        return;
    }
    for (int64_t k = 0; k < m; k++)
        nt__ld_f32(T + k * w, x + (k0 + k) * R->sn * R->es, R->dt, R->sc, w);
}

void nt__rows_load_i32(const nt__rows *R, const char *x, int64_t k0, int64_t m, int64_t w,
                       int32_t *T)
{
    if (w == 1) {
        nt__ld_i32(T, x + k0 * R->sn * R->es, R->dt, R->sn, m);
        return;
    }
    for (int64_t k = 0; k < m; k++)
        nt__ld_i32(T + k * w, x + (k0 + k) * R->sn * R->es, R->dt, R->sc, w);
}

/* ---------------- flat reader ---------------- */

void nt__flat_init(nt__flat *F, const nt_tensor *t)
{
    memset(F, 0, sizeof *F);
    F->v.data = nt__tensor_data(t);
    F->v.dt = (nt_dtype)t->dtype;
    F->es = (int64_t)nt__dtype_size(F->v.dt);
    /* Merge dim i into the previous one where the two are contiguous
     * together; drop size-1 dims.  A 0-d view becomes [1]. */
    int nd = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 1)
            continue;
        if (nd > 0 && F->v.stride[nd - 1] == t->stride[i] * t->shape[i]) {
            F->v.shape[nd - 1] *= t->shape[i];
            F->v.stride[nd - 1] = t->stride[i];
            continue;
        }
        F->v.shape[nd] = t->shape[i];
        F->v.stride[nd] = t->stride[i];
        nd++;
    }
    if (nd == 0) {
        F->v.shape[0] = nt__numel(t->ndim, t->shape); /* 1, or 0 if a dim is 0 */
        F->v.stride[0] = 1;
        nd = 1;
    }
    F->v.ndim = nd;
}

static void flat_read(nt__flat *F, void *dst, int64_t m, bool ints)
{
    nt__kv *v = &F->v;
    int last = v->ndim - 1;
    while (m > 0) {
        int64_t take = v->shape[last] - F->idx[last];
        take = take < m ? take : m;
        const char *p = v->data + nt__kv_off(v, F->idx) * F->es;
        if (ints) {
            nt__ld_i32(dst, p, v->dt, v->stride[last], take);
            dst = (int32_t *)dst + take;
        } else {
            nt__ld_f32(dst, p, v->dt, v->stride[last], take);
            dst = (float *)dst + take;
        }
        m -= take;
        F->idx[last] += take;
        if (F->idx[last] == v->shape[last]) {
            F->idx[last] = v->shape[last] - 1;
            nt__idx_next(F->idx, v->ndim, v->shape);
        }
    }
}

void nt__flat_read_f32(nt__flat *F, float *dst, int64_t m) { flat_read(F, dst, m, false); }
void nt__flat_read_i32(nt__flat *F, int32_t *dst, int64_t m) { flat_read(F, dst, m, true); }

/* ---------------- the reductions ---------------- */

/* Rows reduced per group at most; the tile is NT_RED_BLOCK x RED_W floats at
 * most (32K floats, 128 KB: stays in L2). */
#define RED_W 64
#define RED_TILE (32 * 1024)

typedef struct red {
    int op;
    int rop, pre, fin;  /* nt__red_plan */
    float p;            /* norm: ord (NT_RED_PRE_POW) */
    bool ints;          /* integer input: integer compute */
    int64_t n;          /* reduced length */
    char *y;            /* output */
    nt_dtype ydt;
    int64_t yes;
    bool direct;        /* f32 sum of contiguous columns: no tile (red_group) */
    float *T;           /* tile buffers */
    int32_t *Ti;
    /* accumulators per column */
    float f[RED_W];
    int32_t i[RED_W];
    int32_t bi[RED_W];
} red;

static void acc_init(red *c, int64_t w)
{
    bool lo = c->rop == NT_RED_MAX || c->rop == NT_RED_ARGMAX, hi = c->rop == NT_RED_MIN || c->rop == NT_RED_ARGMIN;
    if (c->op == NT_OP_ANY)
        lo = false; /* any of nothing is false */
    for (int64_t j = 0; j < w; j++) {
        c->f[j] = lo ? -INFINITY : hi ? INFINITY : 0.0f;
        c->i[j] = lo ? INT32_MIN : hi ? INT32_MAX : 0;
        c->bi[j] = -1;
    }
}

/* The element map of any / norm, in place on m x w loaded elements. */
static void pre_map(red *c, int64_t n)
{
    if (c->pre == NT_RED_PRE_NONE)
        return;
    if (c->ints) { /* any */
        for (int64_t k = 0; k < n; k++)
            c->Ti[k] = c->Ti[k] != 0;
        return;
    }
    float *T = c->T;
    switch (c->pre) {
    case NT_RED_PRE_NZ:
        for (int64_t k = 0; k < n; k++)
            T[k] = T[k] != 0.0f ? 1.0f : 0.0f;
        break;
    case NT_RED_PRE_SQ:
        for (int64_t k = 0; k < n; k++)
            T[k] = nt__ew_mul(T[k], T[k]);
        break;
    case NT_RED_PRE_ABS:
        for (int64_t k = 0; k < n; k++)
            T[k] = nt__ew_abs(T[k]);
        break;
    case NT_RED_PRE_POW:
        for (int64_t k = 0; k < n; k++)
            T[k] = nt__ew_pow_scalar(nt__ew_abs(T[k]), c->p, 0.0f);
        break;
    default: break;
    }
}

/* First extreme of column j over elements k0 .. k0+m-1; once a float
 * column holds a NaN it keeps it. */
static void acc_arg(red *c, int64_t k0, int64_t m, int64_t w, int64_t j, bool is_max)
{
    int32_t bi = c->bi[j];
    if (c->ints) {
        int32_t best = c->i[j];
        for (int64_t k = 0; k < m; k++) {
            int32_t v = c->Ti[k * w + j];
            if (bi < 0 || (is_max ? v > best : v < best))
                best = v, bi = (int32_t)(k0 + k);
        }
        c->i[j] = best;
    } else {
        float best = c->f[j];
        for (int64_t k = 0; k < m; k++) {
            float v = c->T[k * w + j];
            if (bi < 0 || (best == best && ((is_max ? v > best : v < best) || v != v)))
                best = v, bi = (int32_t)(k0 + k);
        }
        c->f[j] = best;
    }
    c->bi[j] = bi;
}

/* part[j] = nt__red_block_sum_f32(T + j, m, ld) for every column j < w of
 * the m rows T + k * ld at once: each column gets the same lanes, in the
 * same order, and the same folds, but the loops run across the columns,
 * which are contiguous, so they vectorise (a column alone is a strided
 * walk). */
#define COLS_BLOCK_SUM(T, m, w, ld, part)                \
    do {                                                 \
        float lane[NT_RED_LANES][RED_W];                 \
        for (int l = 0; l < NT_RED_LANES; l++)           \
            for (int64_t j = 0; j < w; j++)              \
                lane[l][j] = 0.0f;                       \
        int64_t k = 0;                                   \
        for (; k + NT_RED_LANES <= m; k += NT_RED_LANES) \
            for (int l = 0; l < NT_RED_LANES; l++) {     \
                const float *row = T + (k + l) * ld;     \
                for (int64_t j = 0; j < w; j++)          \
                    lane[l][j] += row[j];                \
            }                                            \
        for (int l = 0; k < m; k++, l++)                 \
            for (int64_t j = 0; j < w; j++)              \
                lane[l][j] += T[k * ld + j];             \
        for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)   \
            for (int l = 0; l < h; l++)                  \
                for (int64_t j = 0; j < w; j++)          \
                    lane[l][j] += lane[l + h][j];        \
        for (int64_t j = 0; j < w; j++)                  \
            part[j] = lane[0][j];                        \
    } while (0)

static void cols_block_sum(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
    COLS_BLOCK_SUM(T, m, w, ld, part);
}

#ifdef COLS_AVX512
/* cols_block_sum's loops with 512-bit vectors (GCC's generic tuning keeps
 * them at 256): the same adds in the same order per column, so the same
 * bits.  (Keeping a 16-column strip's lanes in registers instead was slower:
 * it walks the rows once per strip.) */
__attribute__((target(NT_TARGET_AVX512))) static void
cols_block_sum_avx512(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
    COLS_BLOCK_SUM(T, m, w, ld, part);
}
#endif

#ifdef COLS_AVX512
/* cols_block_sum for m <= NT_RED_LANES rows: each lane holds one row (+0 +
 * x), then the halving folds, all in registers, 16 columns a vector: the
 * same adds per column in the same order (a NaN's payload aside, which the
 * store makes canonical), without the lanes' round trips through memory,
 * their zeroing and their folds' loads.  The batch sums of a 3-D bias or
 * weight gradient (16 rows of [T * N]) are all such. */
__attribute__((target(NT_TARGET_AVX512))) static void
cols_small_sum_avx512(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
    const __m512 z = _mm512_setzero_ps();
    for (int64_t j = 0; j < w; j += 16) {
        __mmask16 k = (__mmask16)(w - j >= 16 ? 0xffffu : (1u << (w - j)) - 1u);
        __m512 L[NT_RED_LANES];
        for (int l = 0; l < NT_RED_LANES; l++)
            L[l] = l < m ? _mm512_add_ps(z, _mm512_maskz_loadu_ps(k, T + l * ld + j)) : z;
        for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
            for (int l = 0; l < h; l++)
                L[l] = _mm512_add_ps(L[l], L[l + h]);
        _mm512_mask_storeu_ps(part + j, k, L[0]);
    }
}
#endif

/* The column sums of cols_block_sum, at the widest vector level the
 * reductions' ISA (nt__gemm_isa) allows. */
static void cols_sum(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
#ifdef COLS_AVX512
    if (m <= NT_RED_LANES && nt__gemm_isa() == NT_ISA_AVX512) {
        cols_small_sum_avx512(T, m, w, ld, part);
        return;
    }
    if (w >= 16 && nt__gemm_isa() == NT_ISA_AVX512) {
        cols_block_sum_avx512(T, m, w, ld, part);
        return;
    }
#endif
    cols_block_sum(T, m, w, ld, part);
}

/* part[j] = nt__red_block_max_f32 (mx) or nt__red_block_min_f32 (!mx) of
 * column j < w of the m rows T + k * ld, all columns at once: each column
 * gets the same lanes (the identity, then its elements in order), the same
 * halving folds and the same nt__ew_maximum / nt__ew_minimum (written with
 * both arms computed and picked by masks, the same values, so the loops
 * over the contiguous columns vectorise).  A reduction over a short middle
 * dim (a pooling window's slots, [N, C, K, L] over K) was one strided call
 * per column: its 16 lanes' setup and 15 folds cost more than its few
 * elements. */
#define NT__EXT(mx, a, b) \
    nt__fsel(((a) != (a)) | ((b) != (b)), (a) + (b), nt__fsel((mx) ? (b) > (a) : (b) < (a), (b), (a)))
#define COLS_BLOCK_EXT(T, m, w, ld, part, mx)                   \
    do {                                                        \
        float lane[NT_RED_LANES][RED_W];                        \
        const float id = (mx) ? -INFINITY : INFINITY;           \
        for (int l = 0; l < NT_RED_LANES; l++)                  \
            for (int64_t j = 0; j < w; j++)                     \
                lane[l][j] = id;                                \
        for (int64_t k = 0; k < m; k++) {                       \
            float *ln = lane[k % NT_RED_LANES];                 \
            const float *row = T + k * ld;                      \
            for (int64_t j = 0; j < w; j++)                     \
                ln[j] = NT__EXT(mx, ln[j], row[j]);             \
        }                                                       \
        for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)          \
            for (int l = 0; l < h; l++)                         \
                for (int64_t j = 0; j < w; j++)                 \
                    lane[l][j] = NT__EXT(mx, lane[l][j], lane[l + h][j]); \
        for (int64_t j = 0; j < w; j++)                         \
            part[j] = lane[0][j];                               \
    } while (0)

static void cols_block_max(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
    COLS_BLOCK_EXT(T, m, w, ld, part, true);
}
static void cols_block_min(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
    COLS_BLOCK_EXT(T, m, w, ld, part, false);
}
#ifdef COLS_AVX512
__attribute__((target(NT_TARGET_AVX512))) static void
cols_block_max_avx512(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
    COLS_BLOCK_EXT(T, m, w, ld, part, true);
}
__attribute__((target(NT_TARGET_AVX512))) static void
cols_block_min_avx512(const float *T, int64_t m, int64_t w, int64_t ld, float *part)
{
    COLS_BLOCK_EXT(T, m, w, ld, part, false);
}
#endif

/* The column maxima (mx) or minima of COLS_BLOCK_EXT, at the widest vector
 * level the reductions' ISA allows. */
static void cols_ext(const float *T, int64_t m, int64_t w, int64_t ld, float *part, bool mx)
{
#ifdef COLS_AVX512
    if (w >= 16 && nt__gemm_isa() == NT_ISA_AVX512) {
        if (mx)
            cols_block_max_avx512(T, m, w, ld, part);
        else
            cols_block_min_avx512(T, m, w, ld, part);
        return;
    }
#endif
    if (mx)
        cols_block_max(T, m, w, ld, part);
    else
        cols_block_min(T, m, w, ld, part);
}

/* Folds elements k0 .. k0+m-1 (m <= NT_RED_BLOCK: one canonical block) of w
 * columns, held in c->T / c->Ti as [m, w]. */
static void acc_block(red *c, int64_t k0, int64_t m, int64_t w)
{
    const float *T = c->T;
    const int32_t *Ti = c->Ti;
    pre_map(c, m * w);
    switch (c->rop) {
    case NT_RED_SUM:
        if (c->ints)
            for (int64_t j = 0; j < w; j++)
                c->i[j] = (int32_t)((uint32_t)c->i[j] + (uint32_t)nt__red_sum_i32(Ti + j, m, w));
        else if (w == 1)
            c->f[0] += nt__red_block_sum_f32(T, m, 1);
        else {
            float part[RED_W];
            cols_sum(T, m, w, w, part);
            for (int64_t j = 0; j < w; j++)
                c->f[j] += part[j];
        }
        break;
    case NT_RED_MAX:
        if (c->ints)
            for (int64_t k = 0; k < m; k++)
                for (int64_t j = 0; j < w; j++)
                    c->i[j] = Ti[k * w + j] > c->i[j] ? Ti[k * w + j] : c->i[j];
        else if (w == 1)
            c->f[0] = nt__ew_maximum(c->f[0], nt__red_block_max_f32(T, m, 1));
        else {
            float part[RED_W];
            cols_ext(T, m, w, w, part, true);
            for (int64_t j = 0; j < w; j++)
                c->f[j] = nt__ew_maximum(c->f[j], part[j]);
        }
        break;
    case NT_RED_MIN:
        if (c->ints)
            for (int64_t k = 0; k < m; k++)
                for (int64_t j = 0; j < w; j++)
                    c->i[j] = Ti[k * w + j] < c->i[j] ? Ti[k * w + j] : c->i[j];
        else if (w == 1)
            c->f[0] = nt__ew_minimum(c->f[0], nt__red_block_min_f32(T, m, 1));
        else {
            float part[RED_W];
            cols_ext(T, m, w, w, part, false);
            for (int64_t j = 0; j < w; j++)
                c->f[j] = nt__ew_minimum(c->f[j], part[j]);
        }
        break;
    case NT_RED_ARGMAX:
    case NT_RED_ARGMIN:
        for (int64_t j = 0; j < w; j++)
            acc_arg(c, k0, m, w, j, c->rop == NT_RED_ARGMAX);
        break;
    default: break;
    }
}

/* Writes the w results to y[oo + j * ost]. */
static void acc_store(red *c, int64_t oo, int64_t ost, int64_t w)
{
    char *y = c->y + oo * c->yes;
    if (c->rop == NT_RED_ARGMAX || c->rop == NT_RED_ARGMIN) {
        nt__st_i32(y, c->ydt, ost, c->bi, w);
    } else if (c->ints) {
        nt__st_i32(y, c->ydt, ost, c->i, w);
    } else {
        /* the finish chosen once, not per element (a sum, the common case,
         * has none: the loop per column with its three tests was a sixth
         * of a bias gradient's time) */
        float inv = (float)(1.0 / c->p), nf = (float)c->n;
        switch (c->fin) {
        case NT_RED_FIN_MEAN:
            for (int64_t j = 0; j < w; j++)
                c->f[j] = c->f[j] / nf;
            break;
        case NT_RED_FIN_SQRT:
            for (int64_t j = 0; j < w; j++)
                c->f[j] = nt__ew_sqrt(c->f[j]);
            break;
        case NT_RED_FIN_POW:
            for (int64_t j = 0; j < w; j++)
                c->f[j] = nt__ew_pow_scalar(c->f[j], inv, 0.0f);
            break;
        default: break;
        }
        nt__st_f32(y, c->ydt, ost, c->f, w);
    }
}

static void red_group(const nt__rows *R, void *ctx, const char *x, int64_t oo, int64_t w)
{
    red *c = ctx;
    acc_init(c, w);
    if (c->direct) { /* the tile's rows are the source's: sum them where they are */
        for (int64_t k0 = 0; k0 < R->n; k0 += NT_RED_BLOCK) {
            int64_t m = R->n - k0 < NT_RED_BLOCK ? R->n - k0 : NT_RED_BLOCK;
            float part[RED_W];
            cols_sum((const float *)x + k0 * R->sn, m, w, R->sn, part);
            for (int64_t j = 0; j < w; j++)
                c->f[j] += part[j];
        }
        acc_store(c, oo, R->oc, w);
        return;
    }
    for (int64_t k0 = 0; k0 < R->n; k0 += NT_RED_BLOCK) {
        int64_t m = R->n - k0 < NT_RED_BLOCK ? R->n - k0 : NT_RED_BLOCK;
        if (c->ints)
            nt__rows_load_i32(R, x, k0, m, w, c->Ti);
        else
            nt__rows_load_f32(R, x, k0, m, w, c->T);
        acc_block(c, k0, m, w);
    }
    acc_store(c, oo, R->oc, w);
}

/* Blocks of groups (nt__rows_blocks), each with its own accumulators and
 * tile. */
typedef struct red_par {
    const nt__rows *R;
    const red *base;
    int64_t w, G, per;
    size_t cells;       /* floats of a block's tile (0: direct, none) */
    volatile AO_t fail; /* a block had no memory for its tile */
} red_par;

static void red_block(void *arg, int b)
{
    red_par *p = arg;
    red c = *p->base;
    void *buf = NULL;
    if (p->cells && !(buf = g_try_malloc(p->cells * 4))) {
        AO_store(&p->fail, 1);
        return;
    }
    c.T = buf;
    c.Ti = buf;
    int64_t g0 = (int64_t)b * p->per, g1 = g0 + p->per < p->G ? g0 + p->per : p->G;
    nt__rows_range(p->R, p->w, g0, g1, red_group, &c);
    g_free(buf);
}

/* ---------------- f64 ----------------
 *
 * An f64 input reduces in double in the canonical order of core/reduce.h
 * (blocks of NT_RED_BLOCK, NT_RED_LANES lanes folded in halves, the block
 * partials combined in order), each element loaded exactly; mean divides
 * the double sum by n; argmax/argmin pick the first extreme (a NaN counts
 * as the extreme, the first one wins), as for f32.  One pass per output
 * element on the calling thread: f64 is the precise path, not the fast
 * one. */
static double red64_fold(double a, double b, int rop)
{
    switch (rop) {
    case NT_RED_MAX: return nt__ew64_maximum(a, b);
    case NT_RED_MIN: return nt__ew64_minimum(a, b);
    default: return a + b;
    }
}

static double red64_run(const char *x, nt_dtype dt, int64_t n, int64_t st, int rop)
{
    double id = rop == NT_RED_MAX ? -INFINITY : rop == NT_RED_MIN ? INFINITY : 0.0;
    double acc = id;
    for (int64_t k0 = 0; k0 < n; k0 += NT_RED_BLOCK) {
        int64_t m = n - k0 < NT_RED_BLOCK ? n - k0 : NT_RED_BLOCK;
        double lane[NT_RED_LANES];
        for (int l = 0; l < NT_RED_LANES; l++)
            lane[l] = id;
        for (int64_t k = 0; k < m; k++)
            lane[k % NT_RED_LANES] =
                red64_fold(lane[k % NT_RED_LANES], nt__load_f64(x, dt, (k0 + k) * st), rop);
        for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
            for (int l = 0; l < h; l++)
                lane[l] = red64_fold(lane[l], lane[l + h], rop);
        acc = red64_fold(acc, lane[0], rop);
    }
    return acc;
}

static int64_t red64_arg(const char *x, nt_dtype dt, int64_t n, int64_t st, bool is_max)
{
    int64_t best = 0;
    double bv = n ? nt__load_f64(x, dt, 0) : 0.0;
    for (int64_t k = 1; k < n && bv == bv; k++) {
        double v = nt__load_f64(x, dt, k * st);
        if (v != v || (is_max ? v > bv : v < bv))
            best = k, bv = v;
    }
    return best;
}

static int reduce_f64(const nt__rec *r, int rop, int fin)
{
    const nt_tensor *t = r->in[0], *o = r->out[0];
    const char *x = nt__tensor_data(t);
    char *y = nt__tensor_data(o);
    nt_dtype dt = (nt_dtype)t->dtype, ydt = (nt_dtype)o->dtype;
    int nd = t->ndim, dim = r->p.dim;
    int64_t shape[NT_MAX_DIMS], idx[NT_MAX_DIMS] = {0}, n, st;
    double *flat = NULL;
    if (dim == NT_DIM_ALL || nd == 0) { /* every element, row-major, exact in double */
        n = nt__numel(t->ndim, t->shape), st = 1;
        flat = malloc((size_t)(n ? n : 1) * sizeof(double));
        if (!flat)
            return nt__kerr(NT_EHOSTMEM, "out of host memory for an f64 reduction");
        for (int64_t k = 0; k < n; k++) {
            int64_t rem = k, off = 0;
            for (int i = nd - 1; i >= 0; i--) {
                off += (rem % t->shape[i]) * t->stride[i];
                rem /= t->shape[i];
            }
            flat[k] = nt__load_f64(x, dt, off);
        }
        x = (const char *)flat, dt = NT_F64, nd = 0;
    } else {
        for (int i = 0; i < nd; i++)
            shape[i] = i == dim ? 1 : t->shape[i];
        n = t->shape[dim], st = t->stride[dim];
    }
    int64_t j = 0;
    do {
        int64_t off = 0;
        for (int i = 0; i < nd; i++)
            off += idx[i] * t->stride[i];
        const char *row = x + off * (int64_t)nt__dtype_size(dt);
        if (rop == NT_RED_ARGMAX || rop == NT_RED_ARGMIN) {
            nt__store_f64(y, ydt, j, (double)red64_arg(row, dt, n, st, rop == NT_RED_ARGMAX));
        } else {
            double v = red64_run(row, dt, n, st, rop);
            nt__store_f64(y, ydt, j, fin == NT_RED_FIN_MEAN ? v / (double)n : v);
        }
        j++;
    } while (nd > 0 && nt__idx_next(idx, nd, shape));
    free(flat);
    return 0;
}

/* ---------------- i64 and bool ----------------
 *
 * An i64 or bool input reduces exactly in int64 (order does not matter:
 * the sum wraps in two's complement, max/min/any are exact): sum gives
 * i64, max/min/amax/amin t's dtype (bool: or / and), argmax/argmin the
 * first extreme (i32), any 0/1 (u8), as PyTorch's long and bool. */
static int64_t red_i64_fold(int64_t a, int64_t b, int rop)
{
    switch (rop) {
    case NT_RED_MAX: return a > b ? a : b;
    case NT_RED_MIN: return a < b ? a : b;
    default: return (int64_t)((uint64_t)a + (uint64_t)b);
    }
}

/* One output element: the n elements at x (dtype dt) k * st apart. */
static int64_t red_i64_row(const char *x, nt_dtype dt, int64_t n, int64_t st, int rop, int pre)
{
    if (rop == NT_RED_ARGMAX || rop == NT_RED_ARGMIN) {
        int64_t best = 0, bv = n ? nt__load_i64(x, dt, 0) : 0;
        for (int64_t k = 1; k < n; k++) {
            int64_t v = nt__load_i64(x, dt, k * st);
            if (rop == NT_RED_ARGMAX ? v > bv : v < bv)
                best = k, bv = v;
        }
        return best;
    }
    int64_t acc = rop == NT_RED_MAX ? INT64_MIN : rop == NT_RED_MIN ? INT64_MAX : 0;
    if (pre == NT_RED_PRE_NZ)
        acc = 0; /* any: the max of 0/1 flags from 0 */
    for (int64_t k = 0; k < n; k++) {
        int64_t v = nt__load_i64(x, dt, k * st);
        acc = red_i64_fold(acc, pre == NT_RED_PRE_NZ ? v != 0 : v, rop);
    }
    return acc;
}

static int reduce_i64(const nt__rec *r, int rop, int pre)
{
    const nt_tensor *t = r->in[0], *o = r->out[0];
    const char *x = nt__tensor_data(t);
    char *y = nt__tensor_data(o);
    nt_dtype dt = (nt_dtype)t->dtype, ydt = (nt_dtype)o->dtype;
    int nd = t->ndim, dim = r->p.dim;
    int64_t es = (int64_t)nt__dtype_size(dt), idx[NT_MAX_DIMS] = {0};
    if (dim == NT_DIM_ALL || nd == 0) { /* every element in row-major order */
        int64_t n = nt__numel(nd, t->shape), acc = 0, best = 0, k = 0;
        bool arg = rop == NT_RED_ARGMAX || rop == NT_RED_ARGMIN;
        if (!arg)
            acc = red_i64_row(x, dt, 0, 1, rop, pre); /* the identity */
        for (; n > 0; k++) {
            int64_t off = 0;
            for (int i = 0; i < nd; i++)
                off += idx[i] * t->stride[i];
            int64_t v = nt__load_i64(x, dt, off);
            if (arg) {
                if (k == 0 || (rop == NT_RED_ARGMAX ? v > acc : v < acc))
                    best = k, acc = v;
            } else {
                acc = red_i64_fold(acc, pre == NT_RED_PRE_NZ ? v != 0 : v, rop);
            }
            if (nd == 0 || !nt__idx_next(idx, nd, t->shape))
                break;
        }
        nt__store_i64(y, ydt, 0, arg ? best : acc);
        return 0;
    }
    int64_t shape[NT_MAX_DIMS], j = 0;
    for (int i = 0; i < nd; i++)
        shape[i] = i == dim ? 1 : t->shape[i];
    do {
        int64_t off = 0;
        for (int i = 0; i < nd; i++)
            off += idx[i] * t->stride[i];
        nt__store_i64(y, ydt, j++,
                      red_i64_row(x + off * es, dt, t->shape[dim], t->stride[dim], rop, pre));
    } while (nt__idx_next(idx, nd, shape));
    return 0;
}

/* All of t's elements (in index order) into y[oo]. */
static void red_all(red *c, const nt_tensor *t, int64_t oo)
{
    c->n = nt__numel(t->ndim, t->shape);
    float T[NT_RED_BLOCK];
    int32_t Ti[NT_RED_BLOCK];
    c->T = T, c->Ti = Ti;
    nt__flat F;
    nt__flat_init(&F, t);
    acc_init(c, 1);
    for (int64_t k0 = 0; k0 < c->n; k0 += NT_RED_BLOCK) {
        int64_t m = c->n - k0 < NT_RED_BLOCK ? c->n - k0 : NT_RED_BLOCK;
        if (c->ints)
            nt__flat_read_i32(&F, Ti, m);
        else
            nt__flat_read_f32(&F, T, m);
        acc_block(c, k0, m, 1);
    }
    acc_store(c, oo, 1, 1);
    c->T = NULL, c->Ti = NULL;
}

static int reduce_kernel(const nt__rec *r)
{
    const nt_tensor *t = r->in[0], *o = r->out[0];
    if (t->dtype == NT_F64 || o->dtype == NT_F64) {
        int rop, pre, fin;
        if (nt__red_plan(r->op, r->p.f[0], &rop, &pre, &fin) || pre != NT_RED_PRE_NONE)
            return nt__kerr(NT_EINVAL, "op %s has no f64 reduction", nt__op_name(r->op));
        if (nt__numel(o->ndim, o->shape) == 0)
            return 0;
        return reduce_f64(r, rop, fin);
    }
    if (t->dtype == NT_I64 || t->dtype == NT_BOOL) {
        int rop, pre, fin;
        if (nt__red_plan(r->op, r->p.f[0], &rop, &pre, &fin) ||
            (pre != NT_RED_PRE_NONE && pre != NT_RED_PRE_NZ) || fin != NT_RED_FIN_NONE)
            return nt__kerr(NT_EINVAL, "op %s has no %s reduction", nt__op_name(r->op),
                            nt_dtype_name((nt_dtype)t->dtype));
        if (nt__numel(o->ndim, o->shape) == 0)
            return 0;
        return reduce_i64(r, rop, pre);
    }
    red c;
    memset(&c, 0, sizeof c);
    c.op = r->op;
    if (nt__red_plan(r->op, r->p.f[0], &c.rop, &c.pre, &c.fin))
        return nt__kerr(NT_EINVAL, "op %s is not a reduction", nt__op_name(r->op));
    c.p = (float)r->p.f[0];
    c.ints = !nt__dtype_is_float((nt_dtype)t->dtype);
    c.y = nt__tensor_data(o);
    c.ydt = (nt_dtype)o->dtype;
    c.yes = (int64_t)nt__dtype_size(c.ydt);
    if (nt__numel(o->ndim, o->shape) == 0)
        return 0;

    if (r->p.dim == NT_DIM_ALL) {
        red_all(&c, t, 0);
        return 0;
    }

    nt__rows R;
    nt__rows_init(&R, t, r->p.dim, false);
    c.n = R.n;
    /* A sum over a dim whose neighbour columns are contiguous f32 (a bias
     * gradient: [N, C] over dim 0) reads the rows in place, RED_W columns
     * at a time, instead of copying a tile of them first. */
    c.direct = R.tile && R.sc == 1 && R.dt == NT_F32 && !c.ints && c.rop == NT_RED_SUM &&
               c.pre == NT_RED_PRE_NONE;
    red_par p = {.R = &R, .base = &c, .w = RED_W};
    if (!c.direct) {
        int64_t m = R.n < NT_RED_BLOCK ? R.n : NT_RED_BLOCK;
        int64_t w = nt__rows_width(&R, m, RED_TILE);
        p.w = w < RED_W ? w : RED_W;
        p.cells = (size_t)(m > 0 ? m : 1) * (size_t)p.w;
    }
    p.G = nt__rows_groups(&R, p.w);
    int nb = nt__rows_blocks(&R, p.w, &p.per);
    nt__par_blocks(nb, red_block, &p, nb >= 2);
    if (AO_load(&p.fail))
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a %zu-byte reduction tile",
                        p.cells * 4);
    return 0;
}

int nt__cpu_sum(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_mean(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_max(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_argmax(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_min(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_argmin(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_any(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_norm(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_amax(const nt__rec *r) { return reduce_kernel(r); }
int nt__cpu_amin(const nt__rec *r) { return reduce_kernel(r); }

/* grad_norms: y[j] = nt_norm(in[j], 2) over all of in[j], each reduced
 * exactly as the norm kernel above reduces it. */
int nt__cpu_grad_norms(const nt__rec *r)
{
    red c;
    memset(&c, 0, sizeof c);
    c.op = NT_OP_NORM;
    if (nt__red_plan(NT_OP_NORM, 2.0, &c.rop, &c.pre, &c.fin))
        return nt__kerr(NT_EINVAL, "op norm is not a reduction");
    c.p = 2.0f;
    c.y = nt__tensor_data(r->out[0]);
    c.ydt = (nt_dtype)r->out[0]->dtype;
    c.yes = (int64_t)nt__dtype_size(c.ydt);
    for (int j = 0; j < r->nin; j++)
        if (r->in[j])
            red_all(&c, r->in[j], j);
    return 0;
}
