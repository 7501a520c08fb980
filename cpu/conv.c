/* cpu/conv.c - the convolution kernels conv_gemm and conv_wgrad (core/conv.h
 * has the geometry, docs/ops.md "Convolution" the contract): im2col into
 * scratch, then the project's own GEMM (core/gemm.h), so each output
 * element follows nt_matmul's recurrence exactly -- f32 (or f16 widened):
 * the fma recurrence per K-tile of 128; both operands bf16: the chunked
 * order of nt__gemm_bf16.  The GEMM picks AVX-512/AVX2 at run time and
 * shares big products with the helper thread; the per-element order does
 * not depend on the blocking, so these kernels equal the simulator's.  At
 * the AVX-512 level f32 convolutions with stride 1 (conv_gemm; at the AVX2
 * level too) and with at most 64 output channels per group (conv_wgrad)
 * build no columns: they read each column entry where it lies in a
 * zero-padded copy of x, in the same order (cgd_*, cgd2_*, wgd_* below). */
#include "cpu/cpu.h"

#include <glib.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include "core/tr16.h"
#define CONV_X86 1
#else
#define CONV_X86 0
#endif

#include "core/conv.h"
#include "core/gemm.h"

/* Positions per chunk of conv_wgrad's columns: a multiple of the K-tile,
 * so every chunk starts a tile. */
#define CONV_WCHUNK (32 * NT_GEMM_KTILE)

/* Writes positions [p0, p0 + np) of the flattened (n, oh, ow) of column row
 * (ci, ki, kj) of group grp into dst[0 .. np): f32, or the raw bf16 bits
 * when raw (x bf16). */
static void col_row(const nt__conv_geo *g, const char *x, nt_dtype dt, int64_t ci, int64_t ki,
                    int64_t kj, int64_t p0, int64_t np, void *dst, bool raw)
{
    int64_t L = g->OH * g->OW, es = (int64_t)nt__dtype_size(dt), wa, wb;
    nt__conv_wrange(g, kj, &wa, &wb);
    /* (n, oh, ow0) of p0, then advanced row by row without dividing */
    int64_t n = p0 / L, oh = p0 % L / g->OW, ow0 = p0 % g->OW;
    bool f32 = dt == NT_F32 && !raw;
    for (int64_t p = p0; p < p0 + np;) {
        int64_t ow1 = g->OW - ow0 < p0 + np - p ? g->OW : ow0 + (p0 + np - p);
        const char *plane = x + ((n * g->C + ci) * g->H * g->W) * es;
        int64_t off = p - p0;
        int64_t ih = oh * g->s[0] + ki * g->d[0] - g->lo[0];
        bool rowok = ih >= 0 && ih % g->u[0] == 0 && ih / g->u[0] < g->H;
        if (!rowok || g->u[1] != 1) {
            for (int64_t ow = ow0; ow < ow1; ow++) {
                int64_t sp = rowok ? nt__conv_src(g, ki, kj, oh, ow) : -1;
                if (raw)
                    ((uint16_t *)dst)[off + ow - ow0] =
                        sp < 0 ? 0 : ((const uint16_t *)plane)[sp];
                else
                    ((float *)dst)[off + ow - ow0] = sp < 0 ? 0.0f : nt__load_f32(plane, dt, sp);
            }
        } else {
            int64_t a = wa > ow0 ? wa : ow0, b = wb < ow1 ? wb : ow1;
            if (b < a)
                b = a;
            const char *src = plane + ((ih / g->u[0]) * g->W + a * g->s[1] + kj * g->d[1] -
                                       g->lo[1]) * es;
            if (raw) {
                uint16_t *d = (uint16_t *)dst + off - ow0;
                for (int64_t ow = ow0; ow < a; ow++)
                    d[ow] = 0;
                for (int64_t ow = a; ow < b; ow++)
                    d[ow] = ((const uint16_t *)src)[(ow - a) * g->s[1]];
                for (int64_t ow = b; ow < ow1; ow++)
                    d[ow] = 0;
            } else {
                float *d = (float *)dst + off - ow0;
                for (int64_t ow = ow0; ow < a; ow++)
                    d[ow] = 0.0f;
                if (f32 && g->s[1] == 1) /* a plain copy: the values' bits */
                    memcpy(d + a, src, (size_t)(b - a) * sizeof(float));
                else if (f32)
                    for (int64_t ow = a; ow < b; ow++)
                        d[ow] = ((const float *)src)[(ow - a) * g->s[1]];
                else if (b > a)
                    nt__ld_f32(d + a, src, dt, g->s[1], b - a);
                for (int64_t ow = b; ow < ow1; ow++)
                    d[ow] = 0.0f;
            }
        }
        p += ow1 - ow0;
        ow0 = 0;
        if (++oh == g->OH)
            oh = 0, n++;
    }
}

/* Column rows [k0, k1) (K = (ki, kj, ci), tap-major) of group grp over
 * positions [p0, p0 + np): rows of np, ld apart, from col. */
static void im2col_rows(const nt__conv_geo *g, const char *x, nt_dtype dt, int64_t grp,
                        int64_t k0, int64_t k1, int64_t p0, int64_t np, void *col, int64_t ld,
                        bool raw)
{
    int64_t Cg = g->C / g->G, es = raw ? 2 : 4;
    for (int64_t k = k0; k < k1; k++) {
        int64_t ci = k % Cg, t = k / Cg; /* K = (ki, kj, ci) */
        col_row(g, x, dt, grp * Cg + ci, t / g->kw, t % g->kw, p0, np,
                (char *)col + (k - k0) * ld * es, raw);
    }
}

/* All Kc column rows of group grp over positions [p0, p0 + np). */
static void im2col(const nt__conv_geo *g, const char *x, nt_dtype dt, int64_t grp, int64_t p0,
                   int64_t np, void *col, int64_t ld, bool raw)
{
    im2col_rows(g, x, dt, grp, 0, g->C / g->G * g->kh * g->kw, p0, np, col, ld, raw);
}

static int too_big(const nt__conv_geo *g, int64_t Kc)
{
    if (Kc > INT32_MAX || g->OH * g->OW > INT32_MAX || g->CO > INT32_MAX)
        return nt__kerr(NT_ENOTSUP, "convolution dims exceed the int range");
    return 0;
}

/* conv_gemm's work, shared by the blocks of nt__par_blocks: block b is
 * image b (with more than one image) -- its columns and its products, in
 * the block's own scratch -- so both threads build columns, and each
 * image's product is the same call whichever thread runs it (the same
 * bits).  One image alone shares its products instead. */
typedef struct cg_job {
    const nt__conv_geo *g;
    const char *xd, *wd;
    const float *wf; /* w' packed (f32, or bf16 bits), or NULL: wd as it is */
    char *yd;
    nt_dtype dt, odt;
    atomic_int failed;
    const float *wt; /* non-NULL: the kernel without columns, w'^T [G][Kc][COg] */
    bool v512;       /* its AVX-512 blocks (else its AVX2 ones) */
    const struct cgd_vec *vt; /* the AVX-512 blocks' vectors (cgd_vecs, cgd_pack_vecs) */
    int m;           /* > 0: block b is images [b m, b m + m) packed, unpadded (cgd_pack) */
    const uint16_t *lt; /* packed: the load masks [taps][cgd_pack_nvec] */
} cg_job;

/* ---------------- conv_gemm without columns (f32, stride 1, AVX-512) ----------------
 *
 * With stride 1 a column row is x's padded plane shifted: col[(ki, kj, ci),
 * (oh, ow)] = xp[ci][oh + ki d0][ow + kj d1] for xp x with its padding made
 * real zeros (the +0 a column holds).  Over the flat positions q = oh Wp + ow
 * of the padded width Wp the row is contiguous, xp + ko[k] + q, so a block of
 * 8 output channels x 48 positions runs nt_matmul's recurrence straight from
 * xp -- per K-tile of 128, s = +0, s = fma(w'[co, k], col[k, q], s) in
 * ascending k, then C = s or C + s, NaNs canonical at the end -- and the
 * positions ow >= OW (the padded width's extra columns) are dropped.  The
 * rows of xp are Wp = W + max(lo, hi) apart (at least OW, at most the full
 * padded width Wf = W + lo + hi), not Wf: a row's zeros on the right are
 * also the next row's on the left, so a read at padded column c >= Wp,
 * which lands at column c - Wp < min(lo, hi) of the next row, still reads
 * +0 -- the same values, fewer dropped positions (28 -> 29, not 30). */
#define CGD_Q 48

#if CONV_X86
#define CGD_R8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define CGD_ZERO(r) __m512 s##r##a = _mm512_setzero_ps(), s##r##b = s##r##a, s##r##c = s##r##a;
#define CGD_FMA(r)                                                                           \
    {                                                                                        \
        __m512 v = _mm512_set1_ps(wk[r]);                                                    \
        s##r##a = _mm512_fmadd_ps(v, b0, s##r##a), s##r##b = _mm512_fmadd_ps(v, b1, s##r##b); \
        s##r##c = _mm512_fmadd_ps(v, b2, s##r##c);                                           \
    }
#define CGD_ST(r)                                                                            \
    if (last)                                                                                \
        cgd_fin(c + (r) * CGD_Q, s##r##a, acc, o, r, 0),                                     \
            cgd_fin(c + (r) * CGD_Q + 16, s##r##b, acc, o, r, 1),                            \
            cgd_fin(c + (r) * CGD_Q + 32, s##r##c, acc, o, r, 2);                            \
    else                                                                                     \
        cgd_put(c + (r) * CGD_Q, s##r##a, acc), cgd_put(c + (r) * CGD_Q + 16, s##r##b, acc), \
            cgd_put(c + (r) * CGD_Q + 32, s##r##c, acc);

/* Vector u of a block's flat positions: its kept lanes m, packed to the
 * low lanes, go to y in at most two pieces: the lanes n0 at y's offset d0
 * on, the lanes n1 at d1 on (d1 + l for lane l: the next image's first
 * position, where a vector of packed images crosses into it; else none). */
typedef struct cgd_vec {
    int64_t d0, d1;
    __mmask16 m, n0, n1;
} cgd_vec;

/* How a block reads and where its last K-tile goes in y: vector v of its
 * positions (16 lanes) loads the lanes lm[t lms + v] of tap t's column
 * rows (k in [t cg, (t + 1) cg); the others +0, a column's padding), keeps
 * the lanes m[v] and stores them as cgd_vec says; rows output channels, L
 * apart. */
typedef struct cgd_out {
    float *y;
    int64_t L, d0[3], d1[3];
    int rows, cg, lms;
    const uint16_t *lm;
    __mmask16 m[3], n0[3], n1[3];
} cgd_out;

/* C = s or C + s, an earlier K-tile's sums. */
__attribute__((target(NT_TARGET_AVX512), always_inline)) static inline void
cgd_put(float *c, __m512 s, bool acc)
{
    _mm512_storeu_ps(c, acc ? _mm512_add_ps(_mm512_loadu_ps(c), s) : s);
}

/* The last K-tile of row r, vector v: C = s or C + s, NaNs canonical
 * (nt__canon), its kept lanes packed and stored straight into y. */
__attribute__((target(NT_TARGET_AVX512), always_inline)) static inline void
cgd_fin(const float *c, __m512 s, bool acc, const cgd_out *o, int r, int v)
{
    if (r >= o->rows)
        return;
    __m512 t = acc ? _mm512_add_ps(_mm512_loadu_ps(c), s) : s;
    __m512i u = _mm512_castps_si512(t);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    t = _mm512_castsi512_ps(_mm512_mask_mov_epi32(u, nan, _mm512_set1_epi32((int)NT__QNAN_F32)));
    t = _mm512_maskz_compress_ps(o->m[v], t);
    _mm512_mask_storeu_ps(o->y + r * o->L + o->d0[v], o->n0[v], t);
    if (o->n1[v])
        _mm512_mask_storeu_ps(o->y + r * o->L + o->d1[v], o->n1[v], t);
}

/* The K-loop of a block over tile [k0, k1): tap by tap, each tap's load
 * masks (cgd_out's lm) fetched once, then LOADS and FMAS per k in
 * ascending order -- each sum's recurrence as before. */
#define CGD_KLOOP(LOADS, FMAS)                                                               \
    for (int k = k0, t = k0 / o->cg; k < k1; t++) {                                          \
        int ke = (t + 1) * o->cg < k1 ? (t + 1) * o->cg : k1;                                \
        const uint16_t *mk = o->lm + (int64_t)t * o->lms;                                   \
        for (; k < ke; k++) {                                                                \
            const float *b = xq + ko[k], *wk = wt + (int64_t)k * ldw;                        \
            LOADS                                                                            \
            FMAS                                                                             \
        }                                                                                    \
    }

/* The product of one block: w'^T rows wt (ldw apart, 8 channels from
 * wt[k * ldw]) and the column rows xq + ko[k], K-tile by K-tile, the
 * earlier tiles' sums in c [8][48], the last tile's into y as o says. */
__attribute__((target(NT_TARGET_AVX512))) static void cgd_block(const float *xq, const int64_t *ko,
                                                              int Kc, const float *wt, int ldw,
                                                              float *c, const cgd_out *o)
{
    for (int k0 = 0; k0 < Kc; k0 += NT_GEMM_KTILE) {
        int k1 = Kc - k0 < NT_GEMM_KTILE ? Kc : k0 + NT_GEMM_KTILE;
        bool acc = k0 > 0, last = k1 == Kc;
        CGD_R8(CGD_ZERO)
        CGD_KLOOP(__m512 b0 = _mm512_maskz_loadu_ps(mk[0], b);
                  __m512 b1 = _mm512_maskz_loadu_ps(mk[1], b + 16);
                  __m512 b2 = _mm512_maskz_loadu_ps(mk[2], b + 32);, CGD_R8(CGD_FMA))
        CGD_R8(CGD_ST)
    }
}

/* cgd_block for 16 positions (c's rows still CGD_Q apart): the tail of a
 * small plane, where a block of 48 would mostly compute past its end. */
#define CGD_ZERO1(r) __m512 s##r##a = _mm512_setzero_ps();
#define CGD_FMA1(r) s##r##a = _mm512_fmadd_ps(_mm512_set1_ps(wk[r]), b0, s##r##a);
#define CGD_ST1(r)                                                                           \
    if (last)                                                                                \
        cgd_fin(c + (r) * CGD_Q, s##r##a, acc, o, r, 0);                                     \
    else                                                                                     \
        cgd_put(c + (r) * CGD_Q, s##r##a, acc);
__attribute__((target(NT_TARGET_AVX512))) static void cgd_block16(const float *xq,
                                                                const int64_t *ko, int Kc,
                                                                const float *wt, int ldw,
                                                                float *c, const cgd_out *o)
{
    for (int k0 = 0; k0 < Kc; k0 += NT_GEMM_KTILE) {
        int k1 = Kc - k0 < NT_GEMM_KTILE ? Kc : k0 + NT_GEMM_KTILE;
        bool acc = k0 > 0, last = k1 == Kc;
        CGD_R8(CGD_ZERO1)
        CGD_KLOOP(__m512 b0 = _mm512_maskz_loadu_ps(mk[0], b);, CGD_R8(CGD_FMA1))
        CGD_R8(CGD_ST1)
    }
}

/* cgd_block for 32 positions: a tail of 17 to 32 positions in one pass
 * over the weights instead of two blocks of 16. */
#define CGD_ZERO2(r) __m512 s##r##a = _mm512_setzero_ps(), s##r##b = s##r##a;
#define CGD_FMA2(r)                                                                          \
    {                                                                                        \
        __m512 v = _mm512_set1_ps(wk[r]);                                                    \
        s##r##a = _mm512_fmadd_ps(v, b0, s##r##a), s##r##b = _mm512_fmadd_ps(v, b1, s##r##b); \
    }
#define CGD_ST2(r)                                                                           \
    if (last)                                                                                \
        cgd_fin(c + (r) * CGD_Q, s##r##a, acc, o, r, 0),                                     \
            cgd_fin(c + (r) * CGD_Q + 16, s##r##b, acc, o, r, 1);                            \
    else                                                                                     \
        cgd_put(c + (r) * CGD_Q, s##r##a, acc), cgd_put(c + (r) * CGD_Q + 16, s##r##b, acc);
__attribute__((target(NT_TARGET_AVX512))) static void cgd_block32(const float *xq,
                                                                const int64_t *ko, int Kc,
                                                                const float *wt, int ldw,
                                                                float *c, const cgd_out *o)
{
    for (int k0 = 0; k0 < Kc; k0 += NT_GEMM_KTILE) {
        int k1 = Kc - k0 < NT_GEMM_KTILE ? Kc : k0 + NT_GEMM_KTILE;
        bool acc = k0 > 0, last = k1 == Kc;
        CGD_R8(CGD_ZERO2)
        CGD_KLOOP(__m512 b0 = _mm512_maskz_loadu_ps(mk[0], b);
                  __m512 b1 = _mm512_maskz_loadu_ps(mk[1], b + 16);, CGD_R8(CGD_FMA2))
        CGD_R8(CGD_ST2)
    }
}

/* A run of a block's positions inside one output row: c's columns q ..
 * q + n go to y's positions dst .. dst + n. */
typedef struct cgd_run {
    int q, n;
    int64_t dst;
} cgd_run;

/* ---- the same blocks at the AVX2 level (cgd2_*) ----
 *
 * Sixteen 256-bit registers hold 4 output channels x 24 positions of sums
 * (3 vectors of 8 each), so a block of 8 x 48 is four such sub-blocks (two
 * halves of the channels, two of the positions), each over every K-tile:
 * an element's recurrence does not depend on the others, so the same bits
 * as the AVX-512 blocks and as the columns' product. */
#define CGD2_R4(M) M(0) M(1) M(2) M(3)
#define CGD2_Z3(r) __m256 s##r##a = _mm256_setzero_ps(), s##r##b = s##r##a, s##r##c = s##r##a;
#define CGD2_F3(r)                                                                           \
    {                                                                                        \
        __m256 v = _mm256_broadcast_ss(wk + (r));                                            \
        s##r##a = _mm256_fmadd_ps(v, b0, s##r##a), s##r##b = _mm256_fmadd_ps(v, b1, s##r##b); \
        s##r##c = _mm256_fmadd_ps(v, b2, s##r##c);                                           \
    }
#define CGD2_S3(r)                                                                           \
    cgd2_put(c + (r) * CGD_Q, s##r##a, acc, last),                                           \
        cgd2_put(c + (r) * CGD_Q + 8, s##r##b, acc, last),                                   \
        cgd2_put(c + (r) * CGD_Q + 16, s##r##c, acc, last);
#define CGD2_Z2(r) __m256 s##r##a = _mm256_setzero_ps(), s##r##b = s##r##a;
#define CGD2_F2(r)                                                                           \
    {                                                                                        \
        __m256 v = _mm256_broadcast_ss(wk + (r));                                            \
        s##r##a = _mm256_fmadd_ps(v, b0, s##r##a), s##r##b = _mm256_fmadd_ps(v, b1, s##r##b); \
    }
#define CGD2_S2(r)                                                                           \
    cgd2_put(c + (r) * CGD_Q, s##r##a, acc, last),                                           \
        cgd2_put(c + (r) * CGD_Q + 8, s##r##b, acc, last);
#define CGD2_Z1(r) __m256 s##r##a = _mm256_setzero_ps();
#define CGD2_F1(r) s##r##a = _mm256_fmadd_ps(_mm256_broadcast_ss(wk + (r)), b0, s##r##a);
#define CGD2_S1(r) cgd2_put(c + (r) * CGD_Q, s##r##a, acc, last);

/* cgd_put at the AVX2 level: C = s or C + s; the last K-tile's NaNs canonical. */
__attribute__((target("avx2,fma"), always_inline)) static inline void cgd2_put(float *c, __m256 s,
                                                                             bool acc, bool last)
{
    __m256 v = acc ? _mm256_add_ps(_mm256_loadu_ps(c), s) : s;
    if (last) {
        __m256i u = _mm256_castps_si256(v);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
        v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32((int)NT__QNAN_F32)),
                             _mm256_castsi256_ps(nan));
    }
    _mm256_storeu_ps(c, v);
}

/* c [4][8 nv] (rows CGD_Q apart) = 4 channels (w'^T from wt[k * ldw]) x
 * 8 nv positions (the column rows xq + ko[k]), K-tile by K-tile. */
#define CGD2_SUB(NAME, Z, F, S, LOADS)                                                       \
    __attribute__((target("avx2,fma"))) static void NAME(const float *xq, const int64_t *ko,  \
                                                         int Kc, const float *wt, int ldw,  \
                                                         float *c)                          \
    {                                                                                        \
        for (int k0 = 0; k0 < Kc; k0 += NT_GEMM_KTILE) {                                     \
            int k1 = Kc - k0 < NT_GEMM_KTILE ? Kc : k0 + NT_GEMM_KTILE;                      \
            bool acc = k0 > 0, last = k1 == Kc;                                              \
            CGD2_R4(Z)                                                                       \
            for (int k = k0; k < k1; k++) {                                                  \
                const float *b = xq + ko[k], *wk = wt + (int64_t)k * ldw;                    \
                LOADS                                                                        \
                CGD2_R4(F)                                                                   \
            }                                                                                \
            CGD2_R4(S)                                                                       \
        }                                                                                    \
    }
#define CGD2_L3                                                                              \
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16);
#define CGD2_L2 __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#define CGD2_L1 __m256 b0 = _mm256_loadu_ps(b);
CGD2_SUB(cgd2_sub24, CGD2_Z3, CGD2_F3, CGD2_S3, CGD2_L3)
CGD2_SUB(cgd2_sub16, CGD2_Z2, CGD2_F2, CGD2_S2, CGD2_L2)
CGD2_SUB(cgd2_sub8, CGD2_Z1, CGD2_F1, CGD2_S1, CGD2_L1)

/* The block of rows channels (<= 8) x bw positions (48, 32 or 16) into c
 * [8][CGD_Q], as cgd_block and its tails do: halves of 4 channels, the
 * positions in pieces of 24, then 16 or 8. */
static void cgd2_block(const float *xq, const int64_t *ko, int Kc, const float *wt, int ldw,
                       int rows, int bw, float *c)
{
    for (int h = 0; h < rows; h += 4)
        for (int q = 0; q < bw;) {
            int m = bw - q >= 24 ? 24 : bw - q >= 16 ? 16 : 8;
            float *ch = c + h * CGD_Q + q;
            if (m == 24)
                cgd2_sub24(xq + q, ko, Kc, wt + h, ldw, ch);
            else if (m == 16)
                cgd2_sub16(xq + q, ko, Kc, wt + h, ldw, ch);
            else
                cgd2_sub8(xq + q, ko, Kc, wt + h, ldw, ch);
            q += m;
        }
}

/* The AVX2 block's rows (c, CGD_Q apart) into y's rows (L apart), run by
 * run: the values as they are (the AVX-512 blocks store theirs into y
 * themselves, cgd_fin). */
static void cgd2_store(float *y, int64_t L, int rows, const float *c, const cgd_run *run,
                       int nrun)
{
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < nrun; i++)
            memcpy(y + r * L + run[i].dst, c + r * CGD_Q + run[i].q,
                   (size_t)run[i].n * sizeof(float));
}

/* The AVX-512 blocks over positions [q0, q0 + bw) of xq (column rows at
 * ko; group grp's weights) for every 8 output channels, y (output channel
 * 0 of the group) as j->vt says; packed (j->m), the load masks j->lt and
 * only positions below Q stored, else every lane loaded (the padded copy's
 * zeros are real). */
static void cgd_run512(const cg_job *j, const float *xq, const int64_t *ko, int64_t grp,
                       int64_t q0, int bw, int64_t Q, float *y, cgd_out *o, float *c)
{
    static const uint16_t all[3] = {0xffff, 0xffff, 0xffff};
    const nt__conv_geo *g = j->g;
    int64_t COg = g->CO / g->G, Kc = g->C / g->G * g->kh * g->kw, ldw = (COg + 7) / 8 * 8;
    if (j->m)
        o->lm = j->lt + q0 / 16;
    else
        o->lm = all, o->lms = 0, o->cg = (int)Kc;
    for (int v = 0; v < bw / 16; v++) { /* its vectors' kept lanes and where they land */
        const cgd_vec *e = &j->vt[q0 / 16 + v];
        int64_t lim = Q - q0 - 16 * v;
        uint32_t in = !j->m || lim >= 16 ? 0xffffu : lim > 0 ? (1u << lim) - 1u : 0u;
        o->m[v] = e->m, o->d0[v] = e->d0, o->d1[v] = e->d1;
        o->n0[v] = (__mmask16)(e->n0 & in), o->n1[v] = (__mmask16)(e->n1 & in);
    }
    for (int64_t co = 0; co < COg; co += 8) {
        const float *wg = j->wt + grp * Kc * ldw + co;
        o->y = y + co * o->L, o->rows = COg - co < 8 ? (int)(COg - co) : 8;
        if (bw == CGD_Q)
            cgd_block(xq + q0, ko, (int)Kc, wg, (int)ldw, c, o);
        else if (bw == 32)
            cgd_block32(xq + q0, ko, (int)Kc, wg, (int)ldw, c, o);
        else
            cgd_block16(xq + q0, ko, (int)Kc, wg, (int)ldw, c, o);
    }
}

/* The padded copy's row stride Wp (see above): the right padding of a row
 * and the left one of the next share their zeros. */
static int64_t cgd_wp(const nt__conv_geo *g)
{
    int64_t Wf = g->OW + (g->kw - 1) * g->d[1];
    int64_t hi1 = Wf - g->lo[1] - g->W, Wp = g->W + (g->lo[1] > hi1 ? g->lo[1] : hi1);
    return Wp < g->OW ? g->OW : Wp > Wf ? Wf : Wp;
}

/* Vectors of 16 flat positions of the padded copy (u: positions 16 u ..)
 * that the AVX-512 blocks cover, past the plane's end too (a block of 48
 * may start up to 32 positions before it). */
static int64_t cgd_nvec(const nt__conv_geo *g)
{
    return (g->OH * cgd_wp(g) + 47) / 16;
}

/* Fills vt [cgd_nvec]: vector u's kept lanes (ow < OW, oh < OH), where
 * the first lands in y, and the low popcount(m) lanes.  The same for every
 * image and group, so made once a call, not per block. */
static void cgd_vecs(const nt__conv_geo *g, cgd_vec *vt)
{
    int64_t Wp = cgd_wp(g), nv = cgd_nvec(g);
    for (int64_t u = 0, oh = 0, ow = 0; u < nv; u++) {
        vt[u].m = 0, vt[u].d0 = 0, vt[u].n1 = 0;
        for (int l = 0; l < 16; l++) {
            if (oh < g->OH && ow < g->OW) {
                if (!vt[u].m)
                    vt[u].d0 = oh * g->OW + ow;
                vt[u].m |= (__mmask16)(1u << l);
            }
            if (++ow == Wp)
                ow = 0, oh++;
        }
        vt[u].n0 = (__mmask16)((1u << __builtin_popcount(vt[u].m)) - 1u);
        vt[u].d1 = vt[u].d0;
    }
}

/* Image n without columns (see above). */
static void cgd_image(cg_job *j, int n)
{
    const nt__conv_geo *g = j->g;
    int64_t Cg = g->C / g->G, COg = g->CO / g->G, Kc = Cg * g->kh * g->kw, L = g->OH * g->OW;
    int64_t Wf = g->OW + (g->kw - 1) * g->d[1], Hp = g->OH + (g->kh - 1) * g->d[0];
    int64_t Wp = cgd_wp(g);
    int64_t Q = g->OH * Wp, ldw = (COg + 7) / 8 * 8, slack = (g->kw - 1) * g->d[1] + CGD_Q;
    size_t np = (size_t)(g->C * Hp * Wp + slack), npa = (np + 15) & ~(size_t)15;
    /* (ko after the planes at a multiple of 64 bytes: int64_t's alignment) */
    float *xp = g_try_malloc(npa * sizeof(float) + (size_t)Kc * sizeof(int64_t) + 64);
    if (!xp) {
        atomic_store_explicit(&j->failed, 1, memory_order_relaxed);
        return;
    }
    int64_t *ko = (int64_t *)(xp + npa);
    const float *xd = (const float *)j->xd + n * g->C * g->H * g->W;
    /* the planes, padded with +0: each row's copy and its zeros written
     * once (not the whole buffer zeroed first), then the slack after them */
    int64_t a = g->lo[1] < Wf ? g->lo[1] : Wf, b = g->lo[1] + g->W < Wf ? g->lo[1] + g->W : Wf;
    for (int64_t pl = 0; pl < g->C; pl++)
        for (int64_t r = 0; r < Hp; r++) {
            float *dst = xp + (pl * Hp + r) * Wp;
            int64_t ih = r - g->lo[0];
            if (ih < 0 || ih >= g->H || b <= a) {
                memset(dst, 0, (size_t)Wp * sizeof(float));
                continue;
            }
            memset(dst, 0, (size_t)a * sizeof(float));
            memcpy(dst + a, xd + (pl * g->H + ih) * g->W, (size_t)(b - a) * sizeof(float));
            memset(dst + b, 0, (size_t)(Wp - b) * sizeof(float));
        }
    memset(xp + g->C * Hp * Wp, 0, (npa - (size_t)(g->C * Hp * Wp)) * sizeof(float));
    float c[8 * CGD_Q];
    cgd_run run[CGD_Q];
    cgd_out o = {.L = L};
    for (int64_t grp = 0; grp < g->G; grp++) {
        /* K = (ki, kj, ci) */
        for (int64_t ki = 0, k = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++)
                for (int64_t ci = 0; ci < Cg; ci++, k++)
                    ko[k] = ((grp * Cg + ci) * Hp + ki * g->d[0]) * Wp + kj * g->d[1];
        float *y = (float *)j->yd + (n * g->CO + grp * COg) * L;
        for (int64_t q0 = 0, bw; q0 < Q; q0 += bw) {
            /* blocks of 48, a tail of one 32 or 16 (AVX2: of 8 to 40 in eights) */
            bw = Q - q0 > 32 ? CGD_Q : Q - q0 > 16 ? 32 : 16;
            if (!j->v512 && Q - q0 < CGD_Q)
                bw = (Q - q0 + 7) / 8 * 8;
            if (j->v512) {
                cgd_run512(j, xp, ko, grp, q0, (int)bw, Q, y, &o, c);
                continue;
            }
            int nrun = 0; /* the block's runs of positions with ow < OW */
            for (int64_t q = 0, oh = q0 / Wp, ow = q0 % Wp; q < bw && oh < g->OH;) {
                    int64_t l = Wp - ow < bw - q ? Wp - ow : bw - q;
                    if (ow < g->OW) {
                        run[nrun].q = (int)q, run[nrun].dst = oh * g->OW + ow;
                        run[nrun++].n = (int)(ow + l < g->OW ? l : g->OW - ow);
                    }
                    q += l, ow += l;
                    if (ow == Wp)
                        ow = 0, oh++;
                }
            for (int64_t co = 0; co < COg; co += 8) {
                const float *wg = j->wt + grp * Kc * ldw + co;
                int rows = COg - co < 8 ? (int)(COg - co) : 8;
                cgd2_block(xp + q0, ko, (int)Kc, wg, (int)ldw, rows, (int)bw, c);
                cgd2_store(y + co * L, L, rows, c, run, nrun);
            }
        }
    }
    g_free(xp);
}

/* ---- packed images without padding (cgd_pack*) ----
 *
 * Where the output plane is the input's (OH = H, OW = W: stride 1, the
 * padding that keeps the size), column row (ki, kj, ci) is x's plane ci
 * shifted by (ki d0 - lo0) W + kj d1 - lo1 flat positions, the entries
 * whose source (oh + ki d0 - lo0, ow + kj d1 - lo1) lies outside the plane
 * +0.  So the copy needs no padding: m images' planes side by side,
 * [C][m][L], flat positions q = i L + p, and the blocks load each tap's
 * column rows with a mask that gives +0 (the value the padded copy held)
 * wherever the source lies outside image i's plane.  A 7 x 7 plane then
 * computes 8 x 49 positions in 25 vectors (not 8 x 4 of 8 x 8), 14 x 14
 * 4 x 196 in 49 (not 4 x 14), 28 x 28 784 in 49 (not 51); each element's
 * sums, the masks' +0 included, in the same order as before. */

/* Images per block: enough that m L fills whole vectors (a plane of 16
 * positions or more, so a vector meets two images at most), at most 8, a
 * quarter of the batch and 64 K floats of copy; 0 where the planes differ. */
static int cgd_pack_imgs(const nt__conv_geo *g)
{
    int64_t L = g->OH * g->OW;
    if (g->OH != g->H || g->OW != g->W)
        return 0;
    int m = L >= 16 ? 16 / (int)(L & -L & 15 ? L & -L : 16) : 1;
    while (m > 1 && (m > 8 || 4 * m > g->N || m * g->C * L > (1 << 16)))
        m /= 2;
    return m;
}

static int64_t cgd_pack_nvec(const nt__conv_geo *g, int m)
{
    return (m * g->OH * g->OW + 15) / 16;
}

/* Fills lt [taps][nvec] (tap t = ki kw + kj: its lanes whose source lies
 * in the image's plane) and vt [nvec] (the lanes of image i at y's offset
 * i CO L + p, those of image i + 1 from (i + 1) CO L on). */
static void cgd_pack_vecs(const nt__conv_geo *g, int m, uint16_t *lt, cgd_vec *vt)
{
    int64_t L = g->OH * g->OW, nv = cgd_pack_nvec(g, m), Q = m * L;
    for (int64_t u = 0; u < nv; u++) {
        int64_t q = 16 * u, i = q / L, p = q % L, a = L - p < 16 ? L - p : 16;
        uint32_t in = Q - q >= 16 ? 0xffffu : (1u << (Q - q)) - 1u;
        vt[u].m = 0xffff, vt[u].d0 = i * g->CO * L + p;
        vt[u].n0 = (__mmask16)(in & ((1u << a) - 1u));
        vt[u].n1 = (__mmask16)(in & ~((1u << a) - 1u));
        vt[u].d1 = (i + 1) * g->CO * L - a;
        for (int64_t t = 0; t < g->kh * g->kw; t++) {
            uint32_t k = 0;
            for (int l = 0; l < 16; l++) {
                int64_t pl = (q + l) % L, ih = pl / g->W + t / g->kw * g->d[0] - g->lo[0];
                int64_t iw = pl % g->W + t % g->kw * g->d[1] - g->lo[1];
                if (q + l < Q && ih >= 0 && ih < g->H && iw >= 0 && iw < g->W)
                    k |= 1u << l;
            }
            lt[t * nv + u] = (uint16_t)k;
        }
    }
}

/* Block b: images [b m, b m + nm) (see above). */
static void cgd_pack(cg_job *j, int b)
{
    const nt__conv_geo *g = j->g;
    int64_t Cg = g->C / g->G, COg = g->CO / g->G, Kc = Cg * g->kh * g->kw, L = g->OH * g->OW;
    int64_t m = j->m, n0 = (int64_t)b * m, nm = g->N - n0 < m ? g->N - n0 : m;
    /* slack before and after the planes: a masked lane reads there, and a
     * block of 48 may start up to 32 positions before the end */
    int64_t lo = (g->lo[0] * g->W + g->lo[1] + 15) / 16 * 16;
    int64_t hi = ((g->kh - 1) * g->d[0] * g->W + (g->kw - 1) * g->d[1] + 48 + 15) / 16 * 16;
    size_t np = (size_t)(lo + g->C * m * L + hi), npa = (np + 15) & ~(size_t)15;
    float *buf = g_try_malloc(npa * sizeof(float) + (size_t)Kc * sizeof(int64_t) + 64);
    if (!buf) {
        atomic_store_explicit(&j->failed, 1, memory_order_relaxed);
        return;
    }
    int64_t *ko = (int64_t *)(buf + npa);
    float *xs = buf + lo;
    const float *xd = (const float *)j->xd;
    memset(buf, 0, (size_t)lo * sizeof(float));
    for (int64_t ci = 0; ci < g->C; ci++) {
        float *dst = xs + ci * m * L;
        for (int64_t i = 0; i < nm; i++)
            memcpy(dst + i * L, xd + ((n0 + i) * g->C + ci) * L, (size_t)L * sizeof(float));
        if (nm < m) /* the last block's missing images: +0, never stored */
            memset(dst + nm * L, 0, (size_t)((m - nm) * L) * sizeof(float));
    }
    memset(xs + g->C * m * L, 0, (npa - (size_t)(lo + g->C * m * L)) * sizeof(float));
    float c[8 * CGD_Q];
    cgd_out o = {.L = L, .cg = (int)Cg, .lms = (int)cgd_pack_nvec(g, (int)m)};
    int64_t Q = nm * L;
    for (int64_t grp = 0; grp < g->G; grp++) {
        for (int64_t ki = 0, k = 0; ki < g->kh; ki++) /* K = (ki, kj, ci) */
            for (int64_t kj = 0; kj < g->kw; kj++)
                for (int64_t ci = 0; ci < Cg; ci++, k++)
                    ko[k] = (grp * Cg + ci) * m * L + (ki * g->d[0] - g->lo[0]) * g->W +
                            kj * g->d[1] - g->lo[1];
        float *y = (float *)j->yd + (n0 * g->CO + grp * COg) * L;
        for (int64_t q0 = 0, bw; q0 < Q; q0 += bw) {
            bw = Q - q0 > 32 ? CGD_Q : Q - q0 > 16 ? 32 : 16;
            cgd_run512(j, xs, ko, grp, q0, (int)bw, Q, y, &o, c);
        }
    }
    g_free(buf);
}
#endif

static void cg_image(void *arg, int n)
{
    cg_job *j = arg;
#if CONV_X86
    if (j->wt) {
        if (j->m)
            cgd_pack(j, n);
        else
            cgd_image(j, n);
        return;
    }
#endif
    const nt__conv_geo *g = j->g;
    int64_t Cg = g->C / g->G, COg = g->CO / g->G, Kc = Cg * g->kh * g->kw, L = g->OH * g->OW;
    bool raw = j->dt == NT_BF16; /* bf16 x bf16: nt__gemm_bf16's chunked order */
    size_t es = raw ? 2 : 4, ncol = (size_t)(Kc * L), oes = nt__dtype_size(j->odt);
    size_t nab = (ncol * es + 63) & ~(size_t)63, nc = j->odt == NT_F32 ? 0 : (size_t)(COg * L);
    char *buf = g_try_malloc(nab + nc * sizeof(float) + 16);
    if (!buf) {
        atomic_store_explicit(&j->failed, 1, memory_order_relaxed);
        return;
    }
    float *C = (float *)(buf + nab);
    nt_dtype adt = raw ? NT_BF16 : NT_F32;
    for (int64_t grp = 0; grp < g->G; grp++) {
        im2col(g, j->xd, j->dt, grp, n * L, L, buf, L, raw);
        const void *A = j->wf ? (const void *)((const char *)j->wf + grp * COg * Kc * (int64_t)es)
                              : (const void *)(j->wd + grp * COg * Kc * (int64_t)es);
        char *out = j->yd + ((n * g->CO + grp * COg) * L) * (int64_t)oes;
        float *Cp = j->odt == NT_F32 ? (float *)out : C;
        if (nt__gemm_typed((int)COg, (int)L, (int)Kc, A, (int)Kc, true, adt, buf, (int)L, false,
                           adt, Cp, (int)L, out, j->odt) != 0) {
            /* no memory for the panels (f32 operands only here): the plain
             * product, the same bits */
            nt__gemm_ex_canon((int)COg, (int)L, (int)Kc, A, (int)Kc, true, (const float *)buf,
                              (int)L, false, Cp, (int)L);
            if (j->odt != NT_F32)
                nt__st_f32(out, j->odt, 1, Cp, COg * L);
        }
    }
    g_free(buf);
}

/* w'^T [G][Kc][COg rounded up to 8] (zeros past COg) from w' [CO][Kc] for
 * the kernel without columns when it applies: f32 in and out, stride 1, no
 * input dilation or crop, two images or more (one image shares its product
 * between the threads instead), the AVX-512 or AVX2 level (*v512 says
 * which blocks); else NULL. */
static float *cgd_weights(const nt__conv_geo *g, nt_dtype dt, nt_dtype odt, const float *w,
                          bool *v512)
{
#if CONV_X86
    int64_t COg = g->CO / g->G, Kc = g->C / g->G * g->kh * g->kw, ldw = (COg + 7) / 8 * 8;
    int isa = nt__gemm_isa();
    *v512 = isa == NT_ISA_AVX512;
    if (dt != NT_F32 || odt != NT_F32 || isa < NT_ISA_AVX2 || g->N < 2 ||
        atomic_load_explicit(&nt__cpu_ref_paths, memory_order_relaxed) ||
        g->s[0] != 1 || g->s[1] != 1 || g->u[0] != 1 || g->u[1] != 1 || g->lo[0] < 0 ||
        g->lo[1] < 0)
        return NULL;
    float *wt = g_try_malloc0((size_t)(g->G * Kc * ldw) * sizeof(float) + 16);
    for (int64_t grp = 0; wt && grp < g->G; grp++)
        for (int64_t co = 0; co < COg; co++)
            for (int64_t k = 0; k < Kc; k++)
                wt[(grp * Kc + k) * ldw + co] = w[(grp * COg + co) * Kc + k];
    return wt;
#else
    (void)g, (void)dt, (void)odt, (void)w;
    *v512 = false;
    return NULL;
#endif
}

int nt__cpu_conv_gemm(const nt__rec *r)
{
    nt__conv_geo g;
    nt__conv_geo_of(r, false, &g);
    const nt_tensor *x = r->in[0], *w = r->in[1], *y = r->out[0];
    nt_dtype dt = (nt_dtype)x->dtype, odt = (nt_dtype)y->dtype;
    int64_t Cg = g.C / g.G, COg = g.CO / g.G, Kc = Cg * g.kh * g.kw, L = g.OH * g.OW;
    if (g.N == 0 || L == 0 || g.CO == 0)
        return 0;
    if (too_big(&g, Kc) || g.N > INT32_MAX)
        return NT_ENOTSUP;
    bool raw = dt == NT_BF16, wide = dt == NT_F16;
    /* w' into scratch (f32, or bf16 bits) in K order (ki, kj, ci): w's own
     * rows are (ci, ki, kj), the same only for a 1x1 kernel or one channel */
    bool packw = wide || g.flip || (Cg > 1 && g.kh * g.kw > 1);
    const char *wd = nt__tensor_data(w);
    float *wf = packw ? g_try_malloc((size_t)(g.CO * Kc) * sizeof(float) + 16) : NULL;
    if (packw && !wf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for the convolution's weights");
    if (packw) /* w' row by row in K order (flip: gathered from w) */
        for (int64_t grp = 0, j = 0; grp < g.G; grp++)
            for (int64_t co = 0; co < COg; co++)
                for (int64_t ki = 0; ki < g.kh; ki++)
                    for (int64_t kj = 0; kj < g.kw; kj++)
                        for (int64_t ci = 0; ci < Cg; ci++, j++) {
                            int64_t at = nt__conv_wpos(&g, grp, co, ci, ki, kj);
                            if (raw)
                                ((uint16_t *)wf)[j] = ((const uint16_t *)wd)[at];
                            else
                                wf[j] = nt__load_f32(wd, dt, at);
                        }
    bool v512;
    float *wt = cgd_weights(&g, dt, odt, wf ? wf : (const float *)wd, &v512);
    struct cgd_vec *vt = NULL;
    uint16_t *lt = NULL;
    int m = 0, nb = (int)g.N;
#if CONV_X86
    if (wt && v512) { /* no memory for the tables: the columns' path, the same bits */
        m = cgd_pack_imgs(&g);
        int64_t nv = m ? cgd_pack_nvec(&g, m) : cgd_nvec(&g), nt = m ? g.kh * g.kw : 0;
        vt = g_try_malloc((size_t)nv * sizeof *vt + (size_t)(nt * nv) * sizeof *lt + 16);
        lt = vt ? (uint16_t *)(vt + nv) : NULL;
        if (vt && m)
            cgd_pack_vecs(&g, m, lt, vt), nb = (int)((g.N + m - 1) / m);
        else if (vt)
            cgd_vecs(&g, vt);
        else
            g_free(wt), wt = NULL, m = 0;
    }
#endif
    cg_job j = {&g, nt__tensor_data(x), wd, wf, nt__tensor_data(y), dt, odt, 0, wt, v512, vt,
                m, lt};
    if (g.N > 1)
        nt__par_blocks(nb, cg_image, &j, nb > 1);
    else
        cg_image(&j, 0);
    g_free(wf);
    g_free(wt);
    g_free(vt);
    /* nt__par_blocks returns after every block, its ends published */
    if (atomic_load_explicit(&j.failed, memory_order_relaxed))
        return nt__kerr(NT_EHOSTMEM, "out of host memory for the convolution's columns "
                        "(%zu bytes)", (size_t)(Kc * L) * (raw ? 2 : 4));
    return 0;
}

/* ---------------- conv_wgrad without columns (f32, AVX-512) ----------------
 *
 * The same recurrence as the product below, element by element: per K-tile
 * of 128 positions, s = +0, s = fma(col[k, p], gy[co, p], s) over the tile's
 * positions in order, then dw^T[k, co] = s on the first tile, else dw^T +
 * s.  The columns are not built: col[k, p] is read where it lies in xp, x
 * with its padding made real zeros (the same +0 a column holds), at
 * po[p] + ko[k]; a block of 8 rows k (4 past 32 channels) keeps its sums
 * in registers (co across the lanes, one, two or four vectors) over a
 * tile's positions, gy transposed position-major (zeros past COg) once. */
#define WGD_R 8

typedef struct wgd {
    const nt__conv_geo *g;
    float *xp;             /* [N][C][Hp][Wp] */
    float *gT;             /* the group's gy^T [P][16 nv], zeros past COg */
    const float *xd, *gd;
    int64_t Hp, Wp, *ko;   /* ko [Kc]: the column row's offset in xp */
    int64_t grp;
    int nv;
    bool cl;               /* xp channel-last [N][Hp][Wp][16] (wgc_* below) */
    int64_t *po, *gq;      /* channel-last: position p's offsets in xp and gy [P] */
    float *C;              /* channel-last: the sums [V3][CO][16] */
    bool v512;             /* the AVX-512 tiles (else the AVX2 ones, wgd2_*) */
} wgd;

#if CONV_X86
#define WGD_LOAD(r) const int64_t o##r = ko[(r) < rows ? (r) : rows - 1];
#define WGD_ONE(r) __m512 a##r = _mm512_setzero_ps();
#define WGD_TWO(r) __m512 a##r = _mm512_setzero_ps(), b##r = a##r;
#define WGD_R8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define WGD_FMA1(r) a##r = _mm512_fmadd_ps(_mm512_set1_ps(b[o##r]), g0, a##r);
#define WGD_FMA2(r)                                                                          \
    {                                                                                        \
        __m512 v = _mm512_set1_ps(b[o##r]);                                                  \
        a##r = _mm512_fmadd_ps(v, g0, a##r), b##r = _mm512_fmadd_ps(v, g1, b##r);            \
    }
#define WGD_ST1(r) _mm512_storeu_ps(s + (r) * 32, a##r);
#define WGD_ST2(r) _mm512_storeu_ps(s + (r) * 32, a##r), _mm512_storeu_ps(s + (r) * 32 + 16, b##r);

/* Rows ko[0 .. rows) (rows <= 8) over one tile of kt positions (xp offsets
 * po, gy^T rows gt of 16 nv floats): the tile's sums into s [8][32]. */
__attribute__((target(NT_TARGET_AVX512))) static void wgd_tile(const float *xp, const int64_t *po,
                                                             int kt, const int64_t *ko, int rows,
                                                             const float *gt, int nv, float *s)
{
    WGD_R8(WGD_LOAD)
    if (nv == 1) {
        WGD_R8(WGD_ONE)
        for (int p = 0; p < kt; p++) {
            const float *b = xp + po[p];
            __m512 g0 = _mm512_loadu_ps(gt + p * 16);
            WGD_R8(WGD_FMA1)
        }
        WGD_R8(WGD_ST1)
    } else {
        WGD_R8(WGD_TWO)
        for (int p = 0; p < kt; p++) {
            const float *b = xp + po[p];
            __m512 g0 = _mm512_loadu_ps(gt + p * 32), g1 = _mm512_loadu_ps(gt + p * 32 + 16);
            WGD_R8(WGD_FMA2)
        }
        WGD_R8(WGD_ST2)
    }
}

/* wgd_tile for 64 channels (nv 4): rows ko[0 .. rows) (rows <= 4), the
 * sums into s [4][64]. */
#define WGD_R4(M) M(0) M(1) M(2) M(3)
#define WGD_FOUR(r) __m512 a##r = _mm512_setzero_ps(), b##r = a##r, c##r = a##r, d##r = a##r;
#define WGD_FMA4(r)                                                                          \
    {                                                                                        \
        __m512 v = _mm512_set1_ps(b[o##r]);                                                  \
        a##r = _mm512_fmadd_ps(v, g0, a##r), b##r = _mm512_fmadd_ps(v, g1, b##r);            \
        c##r = _mm512_fmadd_ps(v, g2, c##r), d##r = _mm512_fmadd_ps(v, g3, d##r);            \
    }
#define WGD_ST4(r)                                                                           \
    _mm512_storeu_ps(s + (r) * 64, a##r), _mm512_storeu_ps(s + (r) * 64 + 16, b##r),         \
        _mm512_storeu_ps(s + (r) * 64 + 32, c##r), _mm512_storeu_ps(s + (r) * 64 + 48, d##r);
__attribute__((target(NT_TARGET_AVX512))) static void wgd_tile4(const float *xp, const int64_t *po,
                                                              int kt, const int64_t *ko, int rows,
                                                              const float *gt, float *s)
{
    WGD_R4(WGD_LOAD)
    WGD_R4(WGD_FOUR)
    for (int p = 0; p < kt; p++) {
        const float *b = xp + po[p], *gp = gt + p * 64;
        __m512 g0 = _mm512_loadu_ps(gp), g1 = _mm512_loadu_ps(gp + 16);
        __m512 g2 = _mm512_loadu_ps(gp + 32), g3 = _mm512_loadu_ps(gp + 48);
        WGD_R4(WGD_FMA4)
    }
    WGD_R4(WGD_ST4)
}
#endif

/* conv_wgrad: per group, dw^T [Kc, COg] = col [Kc, P] . gy^T [P, COg] over
 * chunks of CONV_WCHUNK positions, accumulated tile by tile (the same
 * recurrence as one product over all P: the chunks start K-tiles), then
 * transposed and rounded into dw.  The two blocks of nt__par_blocks take
 * the two halves of the rows K (their columns and their products, each in
 * its own scratch; the channel-last kernel's units instead, wgc_rows): a
 * row's recurrence does not depend on the others, so the bits do not
 * depend on the split. */
typedef struct wg_job {
    const nt__conv_geo *g;
    const char *xd, *gd;
    nt_dtype dt, gdt;
    int64_t grp, nblk;
    int64_t nvt; /* channel-last: the groups of vector triples (see wgc_rows) */
    float *CT; /* [Kc, COg] */
    atomic_int failed;
    const wgd *d; /* non-NULL: the kernel without columns */
} wg_job;

#if CONV_X86
/* ---- channel-last weight gradient (wgc_*) ----
 *
 * With 16 output channels a row k = (t, ci) of the columns meets one vector
 * of gy^T only, so the kernel above broadcasts one x value per FMA (with 32,
 * one per two).  When C and C_out are multiples of 16 (one group) xp is
 * channel-last instead, [N][Hp][Wp][C], so at a position the rows (t, ci ..
 * ci + 15) of one tap are one vector: a block of 3 such vectors x 8 output
 * channels keeps 24 vectors of sums (ci across the lanes) and loads 3
 * vectors and broadcasts 8 values of gy (where it lies) per position -- the forward
 * kernel's ratio.  Each sum is still fma(x, gy, s) over the tile's
 * positions in order from +0, and a tile's sums are added to the running C
 * (kept [vector][co][16], transposed into CT at the end) as C = s or
 * C + s: the same recurrence, the same bits. */
#define WGC_R8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define WGC_Z(c) __m512 a##c = _mm512_setzero_ps(), b##c = a##c, e##c = a##c;
#define WGC_F(c)                                                                             \
    {                                                                                        \
        __m512 v = _mm512_set1_ps(g[(c) * L]);                                               \
        a##c = _mm512_fmadd_ps(x0, v, a##c), b##c = _mm512_fmadd_ps(x1, v, b##c);            \
        e##c = _mm512_fmadd_ps(x2, v, e##c);                                                 \
    }
#define WGC_S(c) wgc_put(C + (c) * 16, a##c, acc), wgc_put(C + cs + (c) * 16, b##c, acc),    \
                 wgc_put(C + 2 * cs + (c) * 16, e##c, acc);
#define WGC_MAXV 48 /* vectors (taps x C / 16) */

__attribute__((target(NT_TARGET_AVX512), always_inline)) static inline void
wgc_put(float *c, __m512 s, bool acc)
{
    _mm512_storeu_ps(c, acc ? _mm512_add_ps(_mm512_loadu_ps(c), s) : s);
}

/* Vectors at xp offsets to[0 .. 3) x 8 output channels (gy's rows from gd,
 * L apart) over one tile of kt positions (xp offsets po, gy offsets gq):
 * the sums into C (vector v's 8 channels at C + v cs), = s, or C + s when
 * acc.  gy is read where it lies: no transposed copy. */
__attribute__((target(NT_TARGET_AVX512))) static void wgc_tile(const float *xp, const int64_t *po,
                                                             int kt, const int64_t *to,
                                                             const float *gd, const int64_t *gq,
                                                             int64_t L, float *C, int cs, bool acc)
{
    WGC_R8(WGC_Z)
    for (int p = 0; p < kt; p++) {
        const float *b = xp + po[p], *g = gd + gq[p];
        __m512 x0 = _mm512_loadu_ps(b + to[0]), x1 = _mm512_loadu_ps(b + to[1]);
        __m512 x2 = _mm512_loadu_ps(b + to[2]);
        WGC_R8(WGC_F)
    }
    WGC_R8(WGC_S)
}

/* The vectors (taps x C / 16) of the channel-last kernel, and rounded up to
 * whole triples (the last triple's spare vectors repeat vector 0). */
static int64_t wgc_nvec(const nt__conv_geo *g, int64_t *V3)
{
    int64_t V = g->kh * g->kw * (g->C / 16);
    *V3 = (V + 2) / 3 * 3;
    return V;
}

/* Unit b of nblk: output channel blocks of 8 [cg nb / ncg, (cg + 1) nb /
 * ncg) times vector triples [tg nt / nvt, (tg + 1) nt / nvt), with ncg =
 * nblk / nvt, cg = b % ncg, tg = b / ncg: each unit its own sums in d->C
 * (and its own entries of CT), over every tile in order, so the split
 * changes no bit.  With 16 output channels (two blocks of 8) the triples
 * are split too: six units or more, not two halves, so a helper thread
 * that starts late still takes its share. */
static void wgc_rows(wg_job *j, int b)
{
    const nt__conv_geo *g = j->g;
    const wgd *d = j->d;
    int64_t L = g->OH * g->OW, P = g->N * L, C16 = g->C / 16, CO = g->CO, V3;
    int64_t V = wgc_nvec(g, &V3), nb = CO / 8, nt = V3 / 3, to[WGC_MAXV + 2];
    for (int64_t v = 0; v < V3; v++) { /* v = (t, ci / 16); past V: vector 0 again */
        int64_t u = v < V ? v : 0, t = u / C16;
        to[v] = (t / g->kw * g->d[0] * d->Wp + t % g->kw * g->d[1]) * g->C + u % C16 * 16;
    }
    int64_t ncg = j->nblk / j->nvt, cg = b % ncg, tg = b / ncg;
    int64_t c0 = nb * cg / ncg, c1 = nb * (cg + 1) / ncg;
    int64_t v0 = 3 * (nt * tg / j->nvt), v1 = 3 * (nt * (tg + 1) / j->nvt);
    float *C = d->C;
    for (int64_t t0 = 0; t0 < P; t0 += NT_GEMM_KTILE) {
        int kt = (int)(P - t0 < NT_GEMM_KTILE ? P - t0 : NT_GEMM_KTILE);
        for (int64_t cb = c0; cb < c1; cb++)
            for (int64_t v = v0; v < v1; v += 3)
                wgc_tile(d->xp, d->po + t0, kt, to + v, d->gd + cb * 8 * L, d->gq + t0, L,
                         C + (v * CO + cb * 8) * 16, (int)(CO * 16), t0 > 0);
    }
    /* CT[k = t C + ci][co] = C[v = t C / 16 + ci / 16][co][ci % 16] */
    for (int64_t v = v0; v < v1 && v < V; v++)
        for (int64_t co = c0 * 8; co < c1 * 8; co++)
            for (int ci = 0; ci < 16; ci++)
                j->CT[(v * 16 + ci) * CO + co] = C[(v * CO + co) * 16 + ci];
}

/* Image b of the channel-last xp, padded with +0: 16 positions of a row x
 * 16 channels at a time, transposed in registers. */
__attribute__((target(NT_TARGET_AVX512))) static void wgc_pad_image(void *arg, int b)
{
    const wgd *d = arg;
    const nt__conv_geo *g = d->g;
    int64_t Cn = g->C, L = g->OH * g->OW;
    const float *xd = d->xd + (int64_t)b * Cn * g->H * g->W;
    /* image b's positions: their offsets in xp and in gy */
    for (int64_t oh = 0, p = b * L; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++, p++) {
            d->po[p] = ((b * d->Hp + oh * g->s[0]) * d->Wp + ow * g->s[1]) * Cn;
            d->gq[p] = b * g->CO * L + oh * g->OW + ow;
        }
    for (int64_t r = 0; r < d->Hp; r++) {
        float *dst = d->xp + (((int64_t)b * d->Hp + r) * d->Wp) * Cn;
        int64_t ih = r - g->lo[0], a = g->lo[1] < d->Wp ? g->lo[1] : d->Wp;
        int64_t e = g->lo[1] + g->W < d->Wp ? g->lo[1] + g->W : d->Wp;
        if (ih < 0 || ih >= g->H || e <= a) {
            memset(dst, 0, (size_t)(d->Wp * Cn) * sizeof(float));
            continue;
        }
        memset(dst, 0, (size_t)(a * Cn) * sizeof(float));
        for (int64_t c0 = 0; c0 < Cn; c0 += 16)
            for (int64_t w = a; w < e; w += 16) {
                int m = e - w < 16 ? (int)(e - w) : 16;
                __mmask16 k = (__mmask16)((1u << m) - 1u);
                __m512i v[16];
                for (int c = 0; c < 16; c++)
                    v[c] = _mm512_maskz_loadu_epi32(
                        k, xd + ((c0 + c) * g->H + ih) * g->W + (w - g->lo[1]));
                nt__tr16(v);
                for (int i = 0; i < m; i++)
                    _mm512_storeu_si512(dst + (w + i) * Cn + c0, v[i]);
            }
        memset(dst + e * Cn, 0, (size_t)((d->Wp - e) * Cn) * sizeof(float));
    }
}

/* ---- the same tiles at the AVX2 level (wgd2_*) ----
 *
 * Output channels across the lanes of 256-bit vectors: 6 rows k x 16
 * channels (2 vectors) of sums, or 3 rows x 32 channels (4 vectors), 12
 * registers, over a tile's positions; 64 channels are two such passes of
 * 32.  Each sum's recurrence is the AVX-512 tiles', so the same bits. */
#define WGD2_R6(M) M(0) M(1) M(2) M(3) M(4) M(5)
#define WGD2_R3(M) M(0) M(1) M(2)
#define WGD2_Z2(r) __m256 a##r = _mm256_setzero_ps(), b##r = a##r;
#define WGD2_F2(r)                                                                           \
    {                                                                                        \
        __m256 v = _mm256_broadcast_ss(b + o##r);                                            \
        a##r = _mm256_fmadd_ps(v, g0, a##r), b##r = _mm256_fmadd_ps(v, g1, b##r);            \
    }
#define WGD2_S2(r) _mm256_storeu_ps(s + (r) * sw, a##r), _mm256_storeu_ps(s + (r) * sw + 8, b##r);
#define WGD2_Z4(r) __m256 a##r = _mm256_setzero_ps(), b##r = a##r, c##r = a##r, d##r = a##r;
#define WGD2_F4(r)                                                                           \
    {                                                                                        \
        __m256 v = _mm256_broadcast_ss(b + o##r);                                            \
        a##r = _mm256_fmadd_ps(v, g0, a##r), b##r = _mm256_fmadd_ps(v, g1, b##r);            \
        c##r = _mm256_fmadd_ps(v, g2, c##r), d##r = _mm256_fmadd_ps(v, g3, d##r);            \
    }
#define WGD2_S4(r)                                                                           \
    _mm256_storeu_ps(s + (r) * sw, a##r), _mm256_storeu_ps(s + (r) * sw + 8, b##r),          \
        _mm256_storeu_ps(s + (r) * sw + 16, c##r), _mm256_storeu_ps(s + (r) * sw + 24, d##r);

/* NAME: rows ko[0 .. rows) (rows <= 6, or 3) x 16 channels (or 32) (gy^T
 * rows gt, gw floats apart) over a tile of kt positions: the sums into s
 * (rows sw apart). */
#define WGD2_TILE(NAME, RN, Z, F, S, LOADS)                                                  \
    __attribute__((target("avx2,fma"))) static void NAME(const float *xp, const int64_t *po, \
                                                         int kt, const int64_t *ko, int rows, \
                                                         const float *gt, int gw, float *s, \
                                                         int sw)                            \
    {                                                                                        \
        RN(WGD_LOAD)                                                                         \
        RN(Z)                                                                                \
        for (int p = 0; p < kt; p++) {                                                       \
            const float *b = xp + po[p], *gp = gt + (int64_t)p * gw;                         \
            LOADS                                                                            \
            RN(F)                                                                            \
        }                                                                                    \
        RN(S)                                                                                \
    }
#define WGD2_G2 __m256 g0 = _mm256_loadu_ps(gp), g1 = _mm256_loadu_ps(gp + 8);
#define WGD2_G4                                                                              \
    __m256 g0 = _mm256_loadu_ps(gp), g1 = _mm256_loadu_ps(gp + 8);                           \
    __m256 g2 = _mm256_loadu_ps(gp + 16), g3 = _mm256_loadu_ps(gp + 24);
WGD2_TILE(wgd2_tile6, WGD2_R6, WGD2_Z2, WGD2_F2, WGD2_S2, WGD2_G2)
WGD2_TILE(wgd2_tile3, WGD2_R3, WGD2_Z4, WGD2_F4, WGD2_S4, WGD2_G4)

/* wg_rows without columns: rows [k0, k1) of group grp (see wgd). */
static void wgd_rows(wg_job *j, int64_t k0, int64_t k1)
{
    const nt__conv_geo *g = j->g;
    const wgd *d = j->d;
    int64_t COg = g->CO / g->G, L = g->OH * g->OW, P = g->N * L;
    int nv = d->nv;
    int64_t po[NT_GEMM_KTILE];
    float s[WGD_R * 32];
    for (int64_t t0 = 0; t0 < P; t0 += NT_GEMM_KTILE) {
        int kt = (int)(P - t0 < NT_GEMM_KTILE ? P - t0 : NT_GEMM_KTILE);
        int64_t n = t0 / L, oh = t0 % L / g->OW, ow = t0 % g->OW;
        for (int p = 0; p < kt; p++) {
            po[p] = (n * g->C * d->Hp + oh * g->s[0]) * d->Wp + ow * g->s[1];
            if (++ow == g->OW && (ow = 0, ++oh == g->OH))
                oh = 0, n++;
        }
        const float *gt = d->gT + t0 * 16 * nv;
        int R = nv == 4 ? 4 : WGD_R, sw = nv == 4 ? 64 : 32, w = 16 * nv;
        if (!d->v512)
            R = nv == 1 ? 6 : 3, sw = w;
        for (int64_t k = k0; k < k1; k += R) {
            int rows = (int)(k1 - k < R ? k1 - k : R);
            if (!d->v512 && nv == 1)
                wgd2_tile6(d->xp, po, kt, d->ko + k, rows, gt, w, s, sw);
            else if (!d->v512) /* 32 channels at a time */
                for (int c0 = 0; c0 < w; c0 += 32)
                    wgd2_tile3(d->xp, po, kt, d->ko + k, rows, gt + c0, w, s + c0, sw);
            else if (nv == 4)
                wgd_tile4(d->xp, po, kt, d->ko + k, rows, gt, s);
            else
                wgd_tile(d->xp, po, kt, d->ko + k, rows, gt, nv, s);
            for (int r = 0; r < rows; r++) {
                float *c = j->CT + (k + r) * COg;
                for (int64_t q = 0; q < COg; q++) /* gemm.h's C = acc ? C + s : s */
                    c[q] = t0 > 0 ? c[q] + s[r * sw + q] : s[r * sw + q];
            }
        }
    }
}

/* dst [e][0 .. w) = src[c * ld + e] (zeros for c >= n) for the positions e
 * of whole 16 x 16 blocks, transposed in registers; returns how many (the
 * caller copies the rest). */
__attribute__((target(NT_TARGET_AVX512))) static int64_t wgd_tr16(const float *src, int64_t ld,
                                                                int64_t n, int64_t l, float *dst,
                                                                int w)
{
    int64_t e = 0;
    for (; e + 16 <= l; e += 16)
        for (int c0 = 0; c0 < w; c0 += 16) {
            __m512i v[16];
            for (int i = 0; i < 16; i++)
                v[i] = c0 + i < n ? _mm512_loadu_si512(src + (c0 + i) * ld + e)
                                  : _mm512_setzero_si512();
            nt__tr16(v);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_si512(dst + (e + i) * w + c0, v[i]);
        }
    return e;
}

/* wgd_tr16 at the AVX2 level: 8 x 8 blocks (w a multiple of 16). */
__attribute__((target("avx2,fma"))) static int64_t wgd_tr8(const float *src, int64_t ld,
                                                         int64_t n, int64_t l, float *dst, int w)
{
    int64_t e = 0;
    for (; e + 8 <= l; e += 8)
        for (int c0 = 0; c0 < w; c0 += 8) {
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++)
                r[i] = c0 + i < n ? _mm256_loadu_ps(src + (c0 + i) * ld + e) : _mm256_setzero_ps();
            for (int i = 0; i < 8; i += 2)
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]),
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            for (int i = 0; i < 8; i += 4) {
                u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
                u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
            }
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(dst + (e + i) * w + c0,
                                 _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
                _mm256_storeu_ps(dst + (e + i + 4) * w + c0,
                                 _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
            }
        }
    return e;
}

/* Block b of the group's gy^T: positions [b 8192, ..), along each image's
 * run: 16 x 16 blocks in registers, the run's last positions channel by
 * channel. */
#define WGD_TB 8192
static void wgd_transpose(void *arg, int b)
{
    const wgd *d = arg;
    const nt__conv_geo *g = d->g;
    int64_t COg = g->CO / g->G, L = g->OH * g->OW, P = g->N * L, w = 16 * d->nv;
    int64_t p0 = (int64_t)b * WGD_TB, p1 = P - p0 < WGD_TB ? P : p0 + WGD_TB;
    for (int64_t p = p0; p < p1;) {
        int64_t im = p / L, q = p % L, l = L - q < p1 - p ? L - q : p1 - p;
        int64_t e0 = (d->v512 ? wgd_tr16 : wgd_tr8)(d->gd + (im * g->CO + d->grp * COg) * L + q,
                                                    L, COg, l, d->gT + p * w, (int)w);
        for (int64_t c = 0; e0 < l && c < w; c++) {
            float *gp = d->gT + p * w + c;
            if (c >= COg) {
                for (int64_t e = e0; e < l; e++)
                    gp[e * w] = 0.0f;
                continue;
            }
            const float *src = d->gd + (im * g->CO + d->grp * COg + c) * L + q;
            for (int64_t e = e0; e < l; e++)
                gp[e * w] = src[e];
        }
        p += l;
    }
}

/* Image b's planes of xp, padded with +0. */
static void wgd_pad_image(void *arg, int b)
{
    const wgd *d = arg;
    const nt__conv_geo *g = d->g;
    for (int64_t pl = (int64_t)b * g->C; pl < ((int64_t)b + 1) * g->C; pl++)
        for (int64_t r = 0; r < d->Hp; r++) {
            float *dst = d->xp + (pl * d->Hp + r) * d->Wp;
            int64_t ih = r - g->lo[0], a = g->lo[1] < d->Wp ? g->lo[1] : d->Wp;
            int64_t e = g->lo[1] + g->W < d->Wp ? g->lo[1] + g->W : d->Wp;
            if (ih < 0 || ih >= g->H || e <= a) {
                memset(dst, 0, (size_t)d->Wp * sizeof(float));
                continue;
            }
            memset(dst, 0, (size_t)a * sizeof(float));
            memcpy(dst + a, d->xd + (pl * g->H + ih) * g->W, (size_t)(e - a) * sizeof(float));
            memset(dst + e, 0, (size_t)(d->Wp - e) * sizeof(float));
        }
}
#endif

static void wg_rows(void *arg, int b)
{
    wg_job *j = arg;
    const nt__conv_geo *g = j->g;
    int64_t Cg = g->C / g->G, COg = g->CO / g->G, Kc = Cg * g->kh * g->kw, L = g->OH * g->OW;
    int64_t P = g->N * L, k0 = Kc * b / j->nblk, k1 = Kc * (b + 1) / j->nblk, grp = j->grp;
#if CONV_X86
    if (j->d && j->d->cl) { /* units of output channels and vectors, not rows */
        wgc_rows(j, b);
        return;
    }
#endif
    if (k1 <= k0)
        return;
#if CONV_X86
    if (j->d) {
        wgd_rows(j, k0, k1);
        return;
    }
#endif
    bool raw = j->dt == NT_BF16;
    size_t es = raw ? 2 : 4, chunk = (size_t)(P < CONV_WCHUNK ? P : CONV_WCHUNK);
    char *buf = g_try_malloc(((size_t)(k1 - k0) + (size_t)COg) * chunk * es + 16);
    if (!buf) {
        atomic_store_explicit(&j->failed, 1, memory_order_relaxed);
        return;
    }
    char *gt = buf + (size_t)(k1 - k0) * chunk * es;
    float *CT = j->CT + k0 * COg;
    size_t gdes = nt__dtype_size(j->gdt);
    for (int64_t p0 = 0; p0 < P; p0 += (int64_t)chunk) {
        int64_t np = P - p0 < (int64_t)chunk ? P - p0 : (int64_t)chunk;
        im2col_rows(g, j->xd, j->dt, grp, k0, k1, p0, np, buf, np, raw);
        /* gy^T [np, COg]: position-major */
        for (int64_t p = p0; p < p0 + np; p++) {
            int64_t n = p / L, q = p % L;
            const char *src = j->gd + ((n * g->CO + grp * COg) * L + q) * (int64_t)gdes;
            if (raw)
                for (int64_t c = 0; c < COg; c++)
                    ((uint16_t *)gt)[(p - p0) * COg + c] = ((const uint16_t *)src)[c * L];
            else
                nt__ld_f32((float *)gt + (p - p0) * COg, src, j->gdt, L, COg);
        }
        if (raw) {
            nt__gemm_bf16((int)(k1 - k0), (int)COg, (int)np, buf, (int)np, true, NT_BF16, gt,
                          (int)COg, false, NT_BF16, CT, (int)COg, p0 > 0, false, NULL, NT_F32);
        } else {
            for (int64_t t = 0; t < np; t += NT_GEMM_KTILE) {
                int kt = (int)(np - t < NT_GEMM_KTILE ? np - t : NT_GEMM_KTILE);
                nt__gemm_ktile_rowa((int)(k1 - k0), (int)COg, kt, (const float *)buf + t,
                                    (int)np, (const float *)gt + t * COg, (int)COg, CT,
                                    (int)COg, p0 + t > 0);
            }
        }
    }
    g_free(buf);
}

/* xp (and d's geometry, its ko [Kc]) for the kernel without columns when it
 * applies: f32 x and gy, the AVX-512 or AVX2 level, at most 64 output channels per
 * group, no input dilation or crop; else NULL (or no memory: the columns'
 * path, the same bits). */
static float *wgd_pad(const nt__conv_geo *g, const nt_tensor *x, const nt_tensor *gy, wgd *d)
{
#if CONV_X86
    int64_t COg = g->CO / g->G, Kc = g->C / g->G * g->kh * g->kw, P = g->N * g->OH * g->OW;
    int isa = nt__gemm_isa();
    if (x->dtype != NT_F32 || gy->dtype != NT_F32 || isa < NT_ISA_AVX2 ||
        atomic_load_explicit(&nt__cpu_ref_paths, memory_order_relaxed) ||
        COg > 64 || g->u[0] != 1 || g->u[1] != 1 || g->lo[0] < 0 || g->lo[1] < 0 ||
        P == 0 || P / WGD_TB >= INT32_MAX)
        return NULL;
    d->g = g, d->nv = COg <= 16 ? 1 : COg <= 32 ? 2 : 4;
    d->Hp = (g->OH - 1) * g->s[0] + (g->kh - 1) * g->d[0] + 1;
    d->Wp = (g->OW - 1) * g->s[1] + (g->kw - 1) * g->d[1] + 1;
    d->v512 = isa == NT_ISA_AVX512;
    d->cl = d->v512 && g->G == 1 && g->C % 16 == 0 && g->CO % 16 == 0 &&
            g->kh * g->kw * (g->C / 16) <= WGC_MAXV;
    /* gT only for the column-major kernel: the channel-last one reads gy in
     * place, at offsets gq, and keeps its sums in C */
    size_t np = (size_t)(g->N * g->C * d->Hp * d->Wp), ng = d->cl ? 0 : (size_t)(P * 16 * d->nv);
    size_t npa = (np + 15) & ~(size_t)15; /* gT and ko 64-byte aligned */
    int64_t V3 = 0;
    if (d->cl)
        wgc_nvec(g, &V3);
    size_t nc = (size_t)(V3 * g->CO * 16), npo = d->cl ? (size_t)P * 4 : 0;
    float *xp = g_try_malloc((npa + ng + (size_t)Kc * 2 + npo + nc) * sizeof(float) + 64);
    if (!xp)
        return NULL;
    memset(xp + np, 0, (npa - np) * sizeof(float));
    d->xp = xp, d->gT = d->cl ? NULL : xp + npa, d->ko = (int64_t *)(xp + npa + ng);
    d->po = d->cl ? d->ko + Kc : NULL, d->gq = d->cl ? d->po + P : NULL;
    d->C = d->cl ? (float *)(d->ko + Kc + 2 * P) : NULL;
    d->xd = nt__tensor_data(x), d->gd = nt__tensor_data(gy);
    nt__par_blocks((int)g->N, d->cl ? wgc_pad_image : wgd_pad_image, d, g->N > 1);
    return xp;
#else
    (void)g, (void)x, (void)gy, (void)d;
    return NULL;
#endif
}

int nt__cpu_conv_wgrad(const nt__rec *r)
{
    nt__conv_geo g;
    nt__conv_geo_of(r, true, &g);
    const nt_tensor *x = r->in[0], *gy = r->in[1], *dw = r->out[0];
    nt_dtype dt = (nt_dtype)x->dtype, odt = (nt_dtype)dw->dtype;
    int64_t Cg = g.C / g.G, COg = g.CO / g.G, Kc = Cg * g.kh * g.kw, L = g.OH * g.OW;
    int64_t P = g.N * L;
    if (too_big(&g, Kc))
        return NT_ENOTSUP;
    size_t nct = (size_t)(Kc * COg);
    float *CT = g_try_malloc((nct + (size_t)Kc) * sizeof(float) + 16), *row = CT + nct;
    if (!CT)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for the convolution's weight gradient");
    char *od = nt__tensor_data(dw);
    size_t oes = nt__dtype_size(odt);
    wgd d = {0};
    float *xp = wgd_pad(&g, x, gy, &d);
    /* two halves where the product is worth a second thread (without
     * columns a half costs no columns of its own: the stem's 9 rows too) */
    int64_t nblk = (Kc >= 32 || xp) && (double)P * (double)Kc * (double)COg >= (double)(1 << 20)
                       ? 2 : 1;
    int64_t nvt = 1;
#if CONV_X86
    if (xp && d.cl && nblk > 1) { /* units (wgc_rows): every block of 8 channels, */
        int64_t V3;               /* and with two such blocks every triple too */
        wgc_nvec(&g, &V3);
        nvt = g.CO / 8 == 2 ? V3 / 3 : 1;
        nblk = g.CO / 8 * nvt;
    }
#endif
    for (int64_t grp = 0; grp < g.G; grp++) {
        wg_job j = {&g, nt__tensor_data(x), nt__tensor_data(gy), dt, (nt_dtype)gy->dtype,
                    grp, nblk, nvt, CT, 0, xp ? &d : NULL};
        for (int64_t k = 0; xp && k < Kc; k++) { /* K = (ki, kj, ci) */
            int64_t ci = k % Cg, t = k / Cg;
            d.ko[k] = ((grp * Cg + ci) * d.Hp + t / g.kw * g.d[0]) * d.Wp + t % g.kw * g.d[1];
        }
#if CONV_X86
        if (xp && !d.cl) { /* (the channel-last kernel reads gy in place) */
            d.grp = grp;
            nt__par_blocks((int)((P + WGD_TB - 1) / WGD_TB), wgd_transpose, &d, P > WGD_TB);
        }
#endif
        if (P == 0)
            memset(CT, 0, nct * sizeof(float));
        else if (nblk > 1)
            nt__par_blocks((int)nblk, wg_rows, &j, true);
        else
            wg_rows(&j, 0);
        if (atomic_load_explicit(&j.failed, memory_order_relaxed)) {
            g_free(CT);
            g_free(xp);
            return nt__kerr(NT_EHOSTMEM, "out of host memory for the convolution's columns");
        }
        /* dw[grp * COg + c][ci][t] = CT[k = t Cg + ci][c], rounded (NaNs
         * canonical): K's (ki, kj, ci) back to w's (ci, ki, kj) */
        int64_t T = g.kh * g.kw;
        for (int64_t c = 0; c < COg; c++) {
            for (int64_t k = 0; k < Kc; k++)
                row[(k % Cg) * T + k / Cg] = nt__canon(CT[k * COg + c]);
            nt__st_f32(od + ((grp * COg + c) * Kc) * (int64_t)oes, odt, 1, row, Kc);
        }
    }
    g_free(CT);
    g_free(xp);
    return 0;
}
