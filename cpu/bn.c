/* cpu/bn.c - training batch norm in one kernel each way: batch_norm_fwd and
 * batch_norm_bwd (dispatcher/api_norm.c issues them; docs/ops.md,
 * "Normalisation over channels", is the contract).
 *
 * x is contiguous f32 [N, C, S]; channel c's row is its M = N S values
 * x[n, c, s] in (n, s) row-major order, the order every sum below takes
 * (the canonical one of core/reduce.h: acc = +0, then acc += each
 * 2048-element block's lane-and-fold partial, in order).  Per channel, in
 * f32, each step rounded:
 *   forward   mean = sum(x) / (float)M; d = x - mean; ss = sum(d * d);
 *             r = rsqrt(ss / (float)M + eps); y = d * r, then * w[c], then
 *             + b[c] (when given); stats[0][c] = mean, stats[1][c] = ss
 *   backward  r as above from stats; xh = (x - mean) * r; gx = g * w[c]
 *             (g without w); db = sum(g); dw = sum(g * xh);
 *             m1 = sum(gx) / (float)M; m2 = sum(gx * xh) / (float)M;
 *             dx = r * ((gx - m1) - xh * m2); dwb[0][c] = dw, dwb[1][c] = db
 * which are the steps, and so the bits, of the composite it replaces
 * (layer_norm's row kernel and backward over the rows [C, M], then the
 * affine ops).  Stored NaNs are canonical (core/dtype.h).
 *
 * How it runs: in phases (forward: the block partials of x, of d * d, then
 * y; backward: the four sums' partials, then dx), each over units of at
 * most UNIT row elements -- a channel's row cut at block boundaries --
 * that the calling thread and the pool's helper take as they come
 * (nt__par_blocks); a unit reads its blocks where they lie in the
 * [N, C, S] layout, run by run (a block is at most ceil(2048 / S) + 1 runs
 * of at most S contiguous values), element i of a block into lane
 * i mod NT_RED_LANES as nt__red_block_sum_f32 takes it, and writes y or
 * dx in place (when S is not a multiple of NT_RED_LANES, runs start
 * mid-lane-group, and the sums gather the block into L1 instead); each
 * block's partial goes to its slot; with AVX2 the sums of a run that
 * starts at lane 0 keep the 16 lanes in two vectors (the same terms, steps
 * and lanes), with AVX-512 in one, and the block's code is then built for
 * that level (block_512: its y and dx loops 16 floats a step; chosen at
 * run time, nt__gemm_isa, so NT_CPU_ISA=avx2 keeps the AVX2 code).  (The reference
 * paths, nt__cpu_ref_paths, gather each block into L1 and take the
 * separate passes: tests/test_cnnperf.c checks the bits are the same.)
 * Between phases the calling thread adds each channel's partials in block
 * order.  So the sums are the canonical ones whatever thread ran a block,
 * and units are short (tens of microseconds): a thread that finishes
 * first waits little for the other.  With four channels or more a unit is
 * instead a whole channel through every phase (bn_chan): the same blocks,
 * partials and folds, so the same bits, while the channel's row is still
 * in the core's cache for the phase after (a phase over all channels
 * reads a [128, 16, 28, 28] tensor from memory again each time). */
#include "cpu/cpu.h"

#include <string.h>

#include "core/ewise.h"
#include "core/gemm.h"
#include "core/reduce.h"

#define UNIT (8 * NT_RED_BLOCK)

atomic_int nt__cpu_ref_paths;

_Static_assert(NT_RED_BLOCK % NT_RED_LANES == 0, "block_inplace's lanes");

enum { P_FWD_SUM, P_FWD_SQ, P_FWD_Y, P_BWD_SUMS, P_BWD_DX };

typedef struct bnk {
    const float *x, *g, *w, *b;
    float *y, *out2;  /* y (NULL: not stored) or dx; stats or dwb */
    float *relu;      /* forward: relu(y) as well, NULL none (nt__cpu_bn_relu_fwd) */
    const float *ym;  /* backward: g is first masked by relu's output, NULL none */
    int64_t N, C, S, M, nbk, nun; /* blocks and units per row */
    float eps;
    int phase;
    float *part;      /* [C][nbk][4] block partials */
    float *mean, *r, *m1, *m2; /* [C] each */
} bnk;

/* Row elements j0 .. j0+m of channel c (row j = n S + s) into T, and T
 * back to y. */
static void gather(float *T, const float *x, const bnk *k, int64_t c, int64_t j0, int64_t m)
{
    int64_t S = k->S;
    while (m > 0) {
        int64_t n = j0 / S, s = j0 % S, len = S - s < m ? S - s : m;
        memcpy(T, x + (n * k->C + c) * S + s, (size_t)len * sizeof(float));
        T += len, j0 += len, m -= len;
    }
}

static void scatter(float *y, const float *T, const bnk *k, int64_t c, int64_t j0, int64_t m)
{
    int64_t S = k->S;
    while (m > 0) {
        int64_t n = j0 / S, s = j0 % S, len = S - s < m ? S - s : m;
        memcpy(y + (n * k->C + c) * S + s, T, (size_t)len * sizeof(float));
        T += len, j0 += len, m -= len;
    }
}

static inline __attribute__((always_inline)) void fwd_y(const float *restrict X, int64_t m,
                                                      float mean, float r, float wc, bool hw,
                                                      float bc, bool hb, float *restrict Y,
                                                      float *restrict R);

static float sq_sum(const float *restrict X, int64_t m, float mean);
static void bwd_sums(const float *restrict X, const float *restrict G, int64_t m, float mean,
                     float r, const float *w, float wc, float *p);

/* The run of channel c's row that starts at row element j (j < end):
 * its length (at most S, and up to end) and its offset in the [N, C, S]
 * layout. */
static inline int64_t run_at(const bnk *k, int64_t c, int64_t j, int64_t end, int64_t *off)
{
    int64_t S = k->S, n = j / S, s = j % S;
    *off = (n * k->C + c) * S + s;
    return S - s < end - j ? S - s : end - j;
}

/* STEP(l, i) for elements i = 0 .. len of a run whose element 0 is lane o
 * of its block (o = its index in the block mod NT_RED_LANES): lanes o ..
 * NT_RED_LANES - 1 first, then whole groups from lane 0, then the rest
 * from lane 0; so each lane takes its elements in ascending order, as
 * nt__red_block_sum_f32 does over the gathered block. */
#define LANES(len, o, STEP)                                                        \
    do {                                                                          \
        int64_t i_ = 0;                                                           \
        for (int l_ = (o); l_ > 0 && l_ < NT_RED_LANES && i_ < (len); l_++, i_++) \
            STEP(l_, i_);                                                         \
        for (; i_ + NT_RED_LANES <= (len); i_ += NT_RED_LANES)                    \
            for (int l_ = 0; l_ < NT_RED_LANES; l_++)                             \
                STEP(l_, i_ + l_);                                                \
        for (int l_ = 0; i_ < (len); i_++, l_++)                                  \
            STEP(l_, i_);                                                         \
    } while (0)

/* nt__red_block_sum_f32's halving fold of the lanes */
static inline float lane_fold(float *a)
{
    for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++)
            a[l] += a[l + h];
    return a[0];
}

/* One run's terms of the forward's sums: x, or (x - mean)^2 (run_sq). */
static inline void run_sum(float *restrict acc, const float *restrict X, int64_t len, int o)
{
    float a[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        a[l] = acc[l];
#define SUM_STEP(l, i) (a[l] += X[i])
    LANES(len, o, SUM_STEP);
#undef SUM_STEP
    for (int l = 0; l < NT_RED_LANES; l++)
        acc[l] = a[l];
}

static inline void run_sq(float *restrict acc, const float *restrict X, int64_t len, int o,
                          float mean)
{
    float a[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        a[l] = acc[l];
#define SQ_STEP(l, i)           \
    do {                        \
        float d_ = X[i] - mean; \
        a[l] += d_ * d_;        \
    } while (0)
    LANES(len, o, SQ_STEP);
#undef SQ_STEP
    for (int l = 0; l < NT_RED_LANES; l++)
        acc[l] = a[l];
}

/* Element i of the gradient the sums take: g, or with relu's output y
 * (Ym) relu_bwd's y > 0 ? g : +0, the fused relu backward (NaN y: 0). */
static inline float relu_g(const float *restrict G, const float *restrict Ym, int64_t i)
{
    return Ym ? nt__ew_relu_bwd(G[i], Ym[i]) : G[i];
}

/* g masked in place by relu's output y as relu_g (gathered blocks) */
static void relu_mask(float *restrict U, const float *restrict Yg, int64_t m)
{
    for (int64_t i = 0; i < m; i++)
        U[i] = nt__ew_relu_bwd(U[i], Yg[i]);
}

/* One run's terms of the backward's four sums: db, dw, sum(gx) and
 * sum(gx * xh), each product rounded before it is added, so lane by lane
 * the terms of nt__red_block_sum_f32 and block_dot over xh, g and g * w. */
static inline void run_bwd(float (*restrict acc)[NT_RED_LANES], const float *restrict X,
                           const float *restrict G, const float *restrict Ym, int64_t len, int o,
                           float mean, float r, float wc)
{
    float a0[NT_RED_LANES], a1[NT_RED_LANES], a2[NT_RED_LANES], a3[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        a0[l] = acc[0][l], a1[l] = acc[1][l], a2[l] = acc[2][l], a3[l] = acc[3][l];
#define BWD_STEP(l, i)                                                   \
    do {                                                                 \
        float t_ = (X[i] - mean) * r, u_ = relu_g(G, Ym, i), uw_ = u_ * wc; \
        a0[l] += u_, a1[l] += u_ * t_, a2[l] += uw_, a3[l] += uw_ * t_;  \
    } while (0)
    LANES(len, o, BWD_STEP);
#undef BWD_STEP
    for (int l = 0; l < NT_RED_LANES; l++)
        acc[0][l] = a0[l], acc[1][l] = a1[l], acc[2][l] = a2[l], acc[3][l] = a3[l];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BN_X86 1
_Static_assert(NT_RED_LANES == 16, "the AVX2 runs keep the lanes in two vectors");

/* run_sum, run_sq and run_bwd with AVX2 for a run whose element 0 is lane
 * 0 (o == 0): lanes 0-7 and 8-15 of each accumulator in two vectors, each
 * lane taking its terms in the same order with the same rounded steps
 * (no FMA: a product is rounded, then added), so the same bits as the
 * scalar lanes, which compilers vectorise only in part here; the run's
 * last partial group goes through them. */
__attribute__((target("avx2,fma"))) static void run_sum_avx2(float *restrict acc,
                                                             const float *restrict X,
                                                             int64_t len, int kind, float mean)
{
    __m256 lo = _mm256_loadu_ps(acc), hi = _mm256_loadu_ps(acc + 8), mv = _mm256_set1_ps(mean);
    int64_t i = 0;
    if (kind == 0)
        for (; i + NT_RED_LANES <= len; i += NT_RED_LANES) {
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(X + i));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(X + i + 8));
        }
    else
        for (; i + NT_RED_LANES <= len; i += NT_RED_LANES) {
            __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(X + i), mv);
            __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(X + i + 8), mv);
            lo = _mm256_add_ps(lo, _mm256_mul_ps(d0, d0));
            hi = _mm256_add_ps(hi, _mm256_mul_ps(d1, d1));
        }
    _mm256_storeu_ps(acc, lo), _mm256_storeu_ps(acc + 8, hi);
    for (int l = 0; i < len; i++, l++) {
        float d = X[i] - mean;
        acc[l] += kind == 0 ? X[i] : d * d;
    }
}

__attribute__((target("avx2,fma"))) static void run_bwd_avx2(float (*restrict acc)[NT_RED_LANES],
                                                             const float *restrict X,
                                                             const float *restrict G,
                                                             const float *restrict Ym, int64_t len,
                                                             float mean, float r, float wc)
{
    __m256 a[4][2];
    for (int q = 0; q < 4; q++)
        a[q][0] = _mm256_loadu_ps(acc[q]), a[q][1] = _mm256_loadu_ps(acc[q] + 8);
    const __m256 mv = _mm256_set1_ps(mean), rv = _mm256_set1_ps(r), wv = _mm256_set1_ps(wc);
    int64_t i = 0;
    for (; i + NT_RED_LANES <= len; i += NT_RED_LANES)
        for (int h = 0; h < 2; h++) {
            __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(X + i + 8 * h), mv), rv);
            __m256 u = _mm256_loadu_ps(G + i + 8 * h);
            if (Ym) /* relu_g: y > 0 ? g : +0 (a NaN y compares false) */
                u = _mm256_and_ps(u, _mm256_cmp_ps(_mm256_loadu_ps(Ym + i + 8 * h),
                                                   _mm256_setzero_ps(), _CMP_GT_OQ));
            __m256 uw = _mm256_mul_ps(u, wv);
            a[0][h] = _mm256_add_ps(a[0][h], u);
            a[1][h] = _mm256_add_ps(a[1][h], _mm256_mul_ps(u, t));
            a[2][h] = _mm256_add_ps(a[2][h], uw);
            a[3][h] = _mm256_add_ps(a[3][h], _mm256_mul_ps(uw, t));
        }
    for (int q = 0; q < 4; q++)
        _mm256_storeu_ps(acc[q], a[q][0]), _mm256_storeu_ps(acc[q] + 8, a[q][1]);
    for (int l = 0; i < len; i++, l++) {
        float t = (X[i] - mean) * r, u = relu_g(G, Ym, i), uw = u * wc;
        acc[0][l] += u, acc[1][l] += u * t, acc[2][l] += uw, acc[3][l] += uw * t;
    }
}

/* run_sum_avx2 and run_bwd_avx2 at the AVX-512 level: the 16 lanes of
 * each accumulator in one vector, the same terms, steps and lanes (no
 * FMA), so the same bits, in half the instructions; the run's last
 * partial group goes through the AVX2 ones. */
__attribute__((target(NT_TARGET_AVX512))) static void run_sum_avx512(float *restrict acc,
                                                                    const float *restrict X,
                                                                    int64_t len, int kind,
                                                                    float mean)
{
    __m512 a = _mm512_loadu_ps(acc), mv = _mm512_set1_ps(mean);
    int64_t i = 0;
    if (kind == 0)
        for (; i + NT_RED_LANES <= len; i += NT_RED_LANES)
            a = _mm512_add_ps(a, _mm512_loadu_ps(X + i));
    else
        for (; i + NT_RED_LANES <= len; i += NT_RED_LANES) {
            __m512 d = _mm512_sub_ps(_mm512_loadu_ps(X + i), mv);
            a = _mm512_add_ps(a, _mm512_mul_ps(d, d));
        }
    _mm512_storeu_ps(acc, a);
    if (i < len)
        run_sum_avx2(acc, X + i, len - i, kind, mean);
}

__attribute__((target(NT_TARGET_AVX512))) static void
run_bwd_avx512(float (*restrict acc)[NT_RED_LANES], const float *restrict X,
               const float *restrict G, const float *restrict Ym, int64_t len, float mean, float r,
               float wc)
{
    __m512 a0 = _mm512_loadu_ps(acc[0]), a1 = _mm512_loadu_ps(acc[1]);
    __m512 a2 = _mm512_loadu_ps(acc[2]), a3 = _mm512_loadu_ps(acc[3]);
    const __m512 mv = _mm512_set1_ps(mean), rv = _mm512_set1_ps(r), wv = _mm512_set1_ps(wc);
    int64_t i = 0;
    for (; i + NT_RED_LANES <= len; i += NT_RED_LANES) {
        __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(X + i), mv), rv);
        __m512 u = _mm512_loadu_ps(G + i);
        if (Ym) /* relu_g: y > 0 ? g : +0 (a NaN y compares false) */
            u = _mm512_maskz_mov_ps(
                _mm512_cmp_ps_mask(_mm512_loadu_ps(Ym + i), _mm512_setzero_ps(), _CMP_GT_OQ), u);
        __m512 uw = _mm512_mul_ps(u, wv);
        a0 = _mm512_add_ps(a0, u), a1 = _mm512_add_ps(a1, _mm512_mul_ps(u, t));
        a2 = _mm512_add_ps(a2, uw), a3 = _mm512_add_ps(a3, _mm512_mul_ps(uw, t));
    }
    _mm512_storeu_ps(acc[0], a0), _mm512_storeu_ps(acc[1], a1);
    _mm512_storeu_ps(acc[2], a2), _mm512_storeu_ps(acc[3], a3);
    if (i < len)
        run_bwd_avx2(acc, X + i, G + i, Ym ? Ym + i : NULL, len - i, mean, r, wc);
}
#endif

/* Block bk of channel c in place: its forward partial (ph P_FWD_SUM or
 * P_FWD_SQ) or y (P_FWD_Y); the backward's four partials (P_BWD_SUMS) or
 * dx (P_BWD_DX).  The same terms, lanes and rounded steps as the gathered
 * passes, so the same bits. */
static inline __attribute__((always_inline)) void
block_body(const bnk *k, int ph, int64_t c, int64_t bk, float *restrict T, float *restrict U,
           float *restrict B, bool v512)
{
    int64_t j0 = bk * NT_RED_BLOCK, m = k->M - j0 < NT_RED_BLOCK ? k->M - j0 : NT_RED_BLOCK;
    int64_t end = j0 + m, off, len;
    float *p = k->part + (c * k->nbk + bk) * 4, mean = k->mean[c], r = k->r[c];
    float wc = k->w ? k->w[c] : 1.0f;
    bool avx2 = false;
#ifdef BN_X86
    avx2 = nt__gemm_isa() >= NT_ISA_AVX2;
#endif
    (void)avx2, (void)v512; /* (no vector runs off x86) */
    if (k->S % NT_RED_LANES && ph != P_FWD_Y && ph != P_BWD_DX) {
        /* runs that start mid-lane-group (S = 196, 49): most of a run
         * would go lane by lane; the sums over the block gathered into L1
         * instead (the outputs are written in place either way) */
        gather(T, k->x, k, c, j0, m);
        if (ph == P_BWD_SUMS) {
            gather(U, k->g, k, c, j0, m);
            if (k->ym)
                gather(B, k->ym, k, c, j0, m), relu_mask(U, B, m);
        }
#ifdef BN_X86
        if (avx2 && ph == P_FWD_SQ) { /* sq_sum's terms and fold */
            float a[NT_RED_LANES] = {0};
            (v512 ? run_sum_avx512 : run_sum_avx2)(a, T, m, 1, mean);
            p[0] = lane_fold(a);
            return;
        }
        if (avx2 && ph == P_BWD_SUMS) { /* bwd_sums' */
            float a[4][NT_RED_LANES] = {{0}};
            (v512 ? run_bwd_avx512 : run_bwd_avx2)(a, T, U, NULL, m, mean, r, k->w ? wc : 0.0f);
            p[0] = lane_fold(a[0]), p[1] = lane_fold(a[1]);
            if (k->w)
                p[2] = lane_fold(a[2]), p[3] = lane_fold(a[3]);
            return;
        }
#endif
        if (ph == P_FWD_SUM)
            p[0] = nt__red_block_sum_f32(T, m, 1);
        else if (ph == P_FWD_SQ)
            p[0] = sq_sum(T, m, mean);
        else
            bwd_sums(T, U, m, mean, r, k->w, k->w ? wc : 0.0f, p);
        return;
    }
    if (ph == P_FWD_SUM || ph == P_FWD_SQ) {
        float a[NT_RED_LANES];
        for (int l = 0; l < NT_RED_LANES; l++)
            a[l] = 0.0f;
        for (int64_t j = j0; j < end; j += len) {
            len = run_at(k, c, j, end, &off);
#ifdef BN_X86
            if (avx2 && (j - j0) % NT_RED_LANES == 0) {
                (v512 ? run_sum_avx512 : run_sum_avx2)(a, k->x + off, len, ph == P_FWD_SQ, mean);
                continue;
            }
#endif
            if (ph == P_FWD_SQ)
                run_sq(a, k->x + off, len, (int)((j - j0) % NT_RED_LANES), mean);
            else
                run_sum(a, k->x + off, len, (int)((j - j0) % NT_RED_LANES));
        }
        p[0] = lane_fold(a);
        return;
    }
    if (ph == P_BWD_SUMS) {
        float a[4][NT_RED_LANES];
        for (int q = 0; q < 4; q++)
            for (int l = 0; l < NT_RED_LANES; l++)
                a[q][l] = 0.0f;
        for (int64_t j = j0; j < end; j += len) {
            len = run_at(k, c, j, end, &off);
#ifdef BN_X86
            if (avx2 && (j - j0) % NT_RED_LANES == 0) {
                (v512 ? run_bwd_avx512 : run_bwd_avx2)(a, k->x + off, k->g + off,
                                                       k->ym ? k->ym + off : NULL, len, mean, r,
                                                       k->w ? wc : 0.0f);
                continue;
            }
#endif
            run_bwd(a, k->x + off, k->g + off, k->ym ? k->ym + off : NULL, len,
                    (int)((j - j0) % NT_RED_LANES), mean, r, k->w ? wc : 0.0f);
        }
        p[0] = lane_fold(a[0]), p[1] = lane_fold(a[1]);
        if (k->w)
            p[2] = lane_fold(a[2]), p[3] = lane_fold(a[3]);
        return;
    }
    for (int64_t j = j0; j < end; j += len) {
        len = run_at(k, c, j, end, &off);
        const float *restrict X = k->x + off;
        if (ph == P_FWD_Y) {
            fwd_y(X, len, mean, r, wc, k->w != NULL, k->b ? k->b[c] : 0.0f, k->b != NULL,
                  k->y ? k->y + off : NULL, k->relu ? k->relu + off : NULL);
            continue;
        }
        float *restrict Y = k->y + off;
        const float *restrict G = k->g + off, *restrict Ym = k->ym ? k->ym + off : NULL;
        float m1 = k->m1[c], m2 = k->m2[c];
        if (Ym && k->w)
            for (int64_t i = 0; i < len; i++)
                Y[i] = nt__canon(r * ((relu_g(G, Ym, i) * wc - m1) - ((X[i] - mean) * r) * m2));
        else if (Ym)
            for (int64_t i = 0; i < len; i++)
                Y[i] = nt__canon(r * ((relu_g(G, Ym, i) - m1) - ((X[i] - mean) * r) * m2));
        else if (k->w)
            for (int64_t i = 0; i < len; i++)
                Y[i] = nt__canon(r * ((G[i] * wc - m1) - ((X[i] - mean) * r) * m2));
        else
            for (int64_t i = 0; i < len; i++)
                Y[i] = nt__canon(r * ((G[i] - m1) - ((X[i] - mean) * r) * m2));
    }
}

/* block_body at the baseline level and, with AVX-512 (nt__gemm_isa), built
 * for it: its sums' runs in 512-bit vectors and its y and dx loops
 * vectorised at that width, the same steps element by element. */
static void block_base(const bnk *k, int ph, int64_t c, int64_t bk, float *restrict T,
                       float *restrict U, float *restrict B)
{
    block_body(k, ph, c, bk, T, U, B, false);
}

#ifdef BN_X86
__attribute__((target(NT_TARGET_AVX512))) static void block_512(const bnk *k, int ph, int64_t c,
                                                               int64_t bk, float *restrict T,
                                                               float *restrict U,
                                                               float *restrict B)
{
    block_body(k, ph, c, bk, T, U, B, true);
}
#endif

static void block_inplace(const bnk *k, int ph, int64_t c, int64_t bk, float *restrict T,
                          float *restrict U, float *restrict B)
{
#ifdef BN_X86
    if (nt__gemm_isa() == NT_ISA_AVX512) {
        block_512(k, ph, c, bk, T, U, B);
        return;
    }
#endif
    block_base(k, ph, c, bk, T, U, B);
}

/* the canonical block partial of t[i] * u[i] (B: scratch) */
static float block_dot(const float *restrict t, const float *restrict u, int64_t m,
                       float *restrict B)
{
    for (int64_t i = 0; i < m; i++)
        B[i] = t[i] * u[i];
    return nt__red_block_sum_f32(B, m, 1);
}

/* The backward's four block partials in one pass over the block (x and g
 * as gathered): lane l of each takes the same terms in the same order as
 * nt__red_block_sum_f32's (elements i = l mod NT_RED_LANES, ascending;
 * each product rounded before it is added), then the same halving fold,
 * so the same bits as the sums and block_dot over xh, g and g * w. */
static void bwd_sums(const float *restrict X, const float *restrict G, int64_t m, float mean,
                     float r, const float *w, float wc, float *p)
{
    float a0[NT_RED_LANES], a1[NT_RED_LANES], a2[NT_RED_LANES], a3[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        a0[l] = a1[l] = a2[l] = a3[l] = 0.0f;
    int64_t i = 0;
    for (; i + NT_RED_LANES <= m; i += NT_RED_LANES)
        for (int l = 0; l < NT_RED_LANES; l++) {
            float t = (X[i + l] - mean) * r, u = G[i + l], uw = u * wc;
            a0[l] += u, a1[l] += u * t, a2[l] += uw, a3[l] += uw * t;
        }
    for (int l = 0; i < m; i++, l++) {
        float t = (X[i] - mean) * r, u = G[i], uw = u * wc;
        a0[l] += u, a1[l] += u * t, a2[l] += uw, a3[l] += uw * t;
    }
    for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++)
            a0[l] += a0[l + h], a1[l] += a1[l + h], a2[l] += a2[l + h], a3[l] += a3[l + h];
    p[0] = a0[0], p[1] = a1[0];
    if (w)
        p[2] = a2[0], p[3] = a3[0];
}

/* The forward's sum of (x - mean)^2 over a block in one pass, in
 * nt__red_block_sum_f32's lane order (as block_dot of x - mean with
 * itself: the same bits). */
static float sq_sum(const float *restrict X, int64_t m, float mean)
{
    float a[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        a[l] = 0.0f;
    int64_t i = 0;
    for (; i + NT_RED_LANES <= m; i += NT_RED_LANES)
        for (int l = 0; l < NT_RED_LANES; l++) {
            float d = X[i + l] - mean;
            a[l] += d * d;
        }
    for (int l = 0; i < m; i++, l++) {
        float d = X[i] - mean;
        a[l] += d * d;
    }
    for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++)
            a[l] += a[l + h];
    return a[0];
}

/* y = ((x - mean) * r) * w, + b, NaNs canonical, each step rounded as the
 * passes below take them, in one pass: into Y (when given), and relu(y)
 * into R (when given; the relu kernel's nt__ew_relu of the stored y). */
static inline __attribute__((always_inline)) void fwd_y(const float *restrict X, int64_t m,
                                                      float mean, float r, float wc, bool hw,
                                                      float bc, bool hb, float *restrict Y,
                                                      float *restrict R)
{
    for (int64_t i = 0; i < m; i++) {
        float v = (X[i] - mean) * r;
        v = hw ? v * wc : v;
        v = hb ? v + bc : v;
        v = nt__canon(v);
        if (Y)
            Y[i] = v;
        if (R)
            R[i] = nt__ew_relu(v);
    }
}

/* One forward block: bk the block's number in channel c's row.  In
 * place (block_inplace), or on the reference paths gathered into T and
 * the separate passes. */
static void fwd_block(const bnk *k, int ph, int64_t c, int64_t bk, float *restrict T,
                      float *restrict B)
{
    int64_t j0 = bk * NT_RED_BLOCK, m = k->M - j0 < NT_RED_BLOCK ? k->M - j0 : NT_RED_BLOCK;
    float *p = k->part + (c * k->nbk + bk) * 4;
    if (!atomic_load_explicit(&nt__cpu_ref_paths, memory_order_relaxed)) {
        block_inplace(k, ph, c, bk, T, NULL, B);
        return;
    }
    gather(T, k->x, k, c, j0, m);
    if (ph == P_FWD_SUM) {
        p[0] = nt__red_block_sum_f32(T, m, 1);
        return;
    }
    float mean = k->mean[c];
    for (int64_t i = 0; i < m; i++)
        T[i] = T[i] - mean;
    if (ph == P_FWD_SQ) {
        p[0] = block_dot(T, T, m, B);
        return;
    }
    float r = k->r[c], wc = k->w ? k->w[c] : 0.0f, bc = k->b ? k->b[c] : 0.0f;
    for (int64_t i = 0; i < m; i++)
        B[i] = T[i] * r;
    if (k->w)
        for (int64_t i = 0; i < m; i++)
            B[i] = B[i] * wc;
    if (k->b)
        for (int64_t i = 0; i < m; i++)
            B[i] = B[i] + bc;
    for (int64_t i = 0; i < m; i++)
        B[i] = nt__canon(B[i]);
    if (k->y)
        scatter(k->y, B, k, c, j0, m);
    if (k->relu) { /* the relu pass after */
        for (int64_t i = 0; i < m; i++)
            B[i] = nt__ew_relu(B[i]);
        scatter(k->relu, B, k, c, j0, m);
    }
}

/* One backward block in place, or on the reference paths: xh into T, g
 * (gx with w) into U; the partials of
 * db, dw, sum(gx), sum(gx * xh), or dx. */
static void bwd_block(const bnk *k, int ph, int64_t c, int64_t bk, float *restrict T,
                      float *restrict U, float *restrict B)
{
    int64_t j0 = bk * NT_RED_BLOCK, m = k->M - j0 < NT_RED_BLOCK ? k->M - j0 : NT_RED_BLOCK;
    float *p = k->part + (c * k->nbk + bk) * 4, mean = k->mean[c], r = k->r[c];
    float wc = k->w ? k->w[c] : 0.0f;
    if (!atomic_load_explicit(&nt__cpu_ref_paths, memory_order_relaxed)) {
        block_inplace(k, ph, c, bk, T, U, B);
        return;
    }
    gather(T, k->x, k, c, j0, m);
    gather(U, k->g, k, c, j0, m);
    if (k->ym) /* the relu_bwd pass before */
        gather(B, k->ym, k, c, j0, m), relu_mask(U, B, m);
    for (int64_t i = 0; i < m; i++)
        T[i] = (T[i] - mean) * r;
    if (ph == P_BWD_SUMS) {
        p[0] = nt__red_block_sum_f32(U, m, 1);
        p[1] = block_dot(U, T, m, B);
    }
    if (k->w)
        for (int64_t i = 0; i < m; i++)
            U[i] = U[i] * wc;
    if (ph == P_BWD_SUMS) {
        if (k->w) {
            p[2] = nt__red_block_sum_f32(U, m, 1);
            p[3] = block_dot(U, T, m, B);
        }
        return;
    }
    float m1 = k->m1[c], m2 = k->m2[c];
    for (int64_t i = 0; i < m; i++)
        B[i] = nt__canon(r * ((U[i] - m1) - T[i] * m2));
    scatter(k->y, B, k, c, j0, m);
}

static void bn_unit(void *arg, int u)
{
    const bnk *k = arg;
    float T[NT_RED_BLOCK], U[NT_RED_BLOCK], B[NT_RED_BLOCK];
    int64_t c = u / k->nun, b0 = u % k->nun * (UNIT / NT_RED_BLOCK);
    int64_t b1 = b0 + UNIT / NT_RED_BLOCK < k->nbk ? b0 + UNIT / NT_RED_BLOCK : k->nbk;
    for (int64_t bk = b0; bk < b1; bk++) {
        if (k->phase >= P_BWD_SUMS)
            bwd_block(k, k->phase, c, bk, T, U, B);
        else
            fwd_block(k, k->phase, c, bk, T, B);
    }
}

static void phase(bnk *k, int ph)
{
    int nu = (int)(k->C * k->nun);
    k->phase = ph;
    nt__par_blocks(nu, bn_unit, k, nu >= 2 && k->C * k->M >= 32768);
}

/* acc = +0; acc += partial i of each block in order (channel c) */
static float fold(const bnk *k, int64_t c, int i)
{
    float acc = 0.0f;
    for (int64_t bk = 0; bk < k->nbk; bk++)
        acc += k->part[(c * k->nbk + bk) * 4 + i];
    return acc;
}

static float rstd(const bnk *k, float ss)
{
    return nt__ew_rsqrt(ss / (float)k->M + k->eps);
}

/* Shapes from x [N, C, *]; the per-channel arrays (a pointer each, into
 * buf).  0 or the error. */
static int bn_begin(bnk *k, const nt__rec *r, const nt_tensor *x, float **buf)
{
    k->N = x->shape[0], k->C = x->shape[1];
    k->S = nt__numel(x->ndim - 2, x->shape + 2);
    k->M = k->N * k->S;
    k->eps = (float)r->p.f[0];
    k->nbk = (k->M + NT_RED_BLOCK - 1) / NT_RED_BLOCK;
    k->nun = (k->M + UNIT - 1) / UNIT;
    size_t C = (size_t)(k->C > 0 ? k->C : 1), nb = (size_t)(k->nbk > 0 ? k->nbk : 1);
    *buf = g_try_malloc((C * nb * 4 + 6 * C) * sizeof(float));
    if (!*buf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for %lld channels' partial sums",
                        (long long)k->C);
    k->part = *buf;
    k->mean = k->part + C * nb * 4, k->r = k->mean + C, k->m1 = k->r + C, k->m2 = k->m1 + C;
    float *wb = k->m2 + C;
    if (r->op == NT_OP_BN_FWD) {
        if (r->in[1])
            nt__gather_f32(wb, r->in[1]), k->w = wb;
        if (r->in[2])
            nt__gather_f32(wb + C, r->in[2]), k->b = wb + C;
    } else if (r->in[3]) {
        nt__gather_f32(wb, r->in[3]), k->w = wb;
    }
    return 0;
}

/* The per-channel steps between the phases (channel c; each writes c's
 * slots only). */
static void fwd_mean(bnk *k, int64_t c)
{
    k->mean[c] = fold(k, c, 0) / (float)k->M;
}

static void fwd_rstd(bnk *k, int64_t c)
{
    float ss = fold(k, c, 0);
    k->r[c] = rstd(k, ss);
    k->out2[c] = nt__canon(k->mean[c]), k->out2[k->C + c] = nt__canon(ss);
}

static void bwd_moments(bnk *k, int64_t c)
{
    float db = fold(k, c, 0), dw = fold(k, c, 1);
    float s1 = k->w ? fold(k, c, 2) : db, s2 = k->w ? fold(k, c, 3) : dw;
    k->m1[c] = s1 / (float)k->M, k->m2[c] = s2 / (float)k->M;
    k->out2[c] = nt__canon(dw), k->out2[k->C + c] = nt__canon(db);
}

/* Channel c through every phase in one go (k->phase P_FWD_SUM: the
 * forward, else the backward): the same blocks, partials and folds as the
 * phases over all channels, so the same bits, but the channel's row is
 * still in this core's cache when the next phase reads it again. */
static void bn_chan(void *arg, int ci)
{
    bnk *k = arg;
    float T[NT_RED_BLOCK], U[NT_RED_BLOCK], B[NT_RED_BLOCK];
    int64_t c = ci;
    if (k->phase == P_FWD_SUM) {
        for (int64_t bk = 0; bk < k->nbk; bk++)
            fwd_block(k, P_FWD_SUM, c, bk, T, B);
        fwd_mean(k, c);
        for (int64_t bk = 0; bk < k->nbk; bk++)
            fwd_block(k, P_FWD_SQ, c, bk, T, B);
        fwd_rstd(k, c);
        for (int64_t bk = 0; bk < k->nbk; bk++)
            fwd_block(k, P_FWD_Y, c, bk, T, B);
        return;
    }
    for (int64_t bk = 0; bk < k->nbk; bk++)
        bwd_block(k, P_BWD_SUMS, c, bk, T, U, B);
    bwd_moments(k, c);
    for (int64_t bk = 0; bk < k->nbk; bk++)
        bwd_block(k, P_BWD_DX, c, bk, T, U, B);
}

/* Whole channels as the units when there are enough of them to share
 * between the two threads (a unit then runs every phase of its channel);
 * else the phases over units of UNIT elements. */
static bool by_channel(const bnk *k)
{
    return k->C >= 4 && k->C <= INT32_MAX &&
           !atomic_load_explicit(&nt__cpu_ref_paths, memory_order_relaxed);
}

/* The forward of r (r->out[0] NULL: y not stored), with relu(y) into relu
 * when given (nt__cpu_bn_relu_fwd). */
static int bn_fwd_run(const nt__rec *r, float *relu)
{
    const nt_tensor *x = r->in[0];
    bnk k = {.x = nt__tensor_data(x), .y = r->out[0] ? nt__tensor_data(r->out[0]) : NULL,
             .out2 = nt__tensor_data(r->out[1]), .relu = relu};
    float *buf;
    int rc = bn_begin(&k, r, x, &buf);
    if (rc)
        return rc;
    if (by_channel(&k)) {
        k.phase = P_FWD_SUM;
        nt__par_blocks((int)k.C, bn_chan, &k, k.C * k.M >= 32768);
        g_free(buf);
        return 0;
    }
    phase(&k, P_FWD_SUM);
    for (int64_t c = 0; c < k.C; c++)
        fwd_mean(&k, c);
    phase(&k, P_FWD_SQ);
    for (int64_t c = 0; c < k.C; c++)
        fwd_rstd(&k, c);
    phase(&k, P_FWD_Y);
    g_free(buf);
    return 0;
}

/* The backward of r, its gradient first masked by relu's output ym when
 * given (nt__cpu_bn_relu_bwd). */
static int bn_bwd_run(const nt__rec *r, const float *ym)
{
    const nt_tensor *x = r->in[1];
    const float *st = nt__tensor_data(r->in[2]);
    bnk k = {.g = nt__tensor_data(r->in[0]), .x = nt__tensor_data(x), .ym = ym,
             .y = nt__tensor_data(r->out[0]), .out2 = nt__tensor_data(r->out[1])};
    float *buf;
    int rc = bn_begin(&k, r, x, &buf);
    if (rc)
        return rc;
    for (int64_t c = 0; c < k.C; c++)
        k.mean[c] = st[c], k.r[c] = rstd(&k, st[k.C + c]);
    if (by_channel(&k)) {
        k.phase = P_BWD_SUMS;
        nt__par_blocks((int)k.C, bn_chan, &k, k.C * k.M >= 32768);
        g_free(buf);
        return 0;
    }
    phase(&k, P_BWD_SUMS);
    for (int64_t c = 0; c < k.C; c++)
        bwd_moments(&k, c);
    phase(&k, P_BWD_DX);
    g_free(buf);
    return 0;
}

int nt__cpu_batch_norm_fwd(const nt__rec *r)
{
    return bn_fwd_run(r, NULL);
}

int nt__cpu_batch_norm_bwd(const nt__rec *r)
{
    return bn_bwd_run(r, NULL);
}

int nt__cpu_bn_relu_fwd(const nt__rec *r, nt_tensor *relu)
{
    return bn_fwd_run(r, nt__tensor_data(relu));
}

int nt__cpu_bn_relu_bwd(const nt__rec *r, const nt_tensor *y)
{
    return bn_bwd_run(r, nt__tensor_data(y));
}
