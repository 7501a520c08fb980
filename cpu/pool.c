/* cpu/pool.c - max_pool2d_fwd: every window's maximum and its flat position
 * in one pass over the planes (core/pool.h has the geometry and the scan:
 * PyTorch's, so its values, NaNs and indices).  Planes in blocks across the
 * host threads; each output is written by one thread, so the order of the
 * blocks never shows in the values. */
#include "core/dtype.h"
#include "core/gemm.h"
#include "core/pool.h"
#include "cpu/cpu.h"

#include <string.h>

#define PLANES_PER_BLOCK 16

typedef struct poolk {
    nt__pool2d g;
    const float *x;
    float *y;
    int32_t *idx;
} poolk;

/* [*lo, *hi): the slots a < k whose row (column) st + a d lies in [0, n). */
static void inside(int64_t st, int64_t d, int64_t k, int64_t n, int64_t *lo, int64_t *hi)
{
    int64_t a0 = st < 0 ? (-st + d - 1) / d : 0, a1 = st < n ? (n - st + d - 1) / d : 0;
    *lo = a0, *hi = a1 < k ? a1 : k;
}

/* One plane: xp [H, W] -> yp, ip [OH, OW]. */
static void pool_plane(const nt__pool2d *g, const float *xp, float *yp, int32_t *ip)
{
    for (int64_t oh = 0; oh < g->OH; oh++) {
        int64_t hs = oh * g->s[0] - g->p[0], a0, a1;
        inside(hs, g->d[0], g->k[0], g->H, &a0, &a1);
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t ws = ow * g->s[1] - g->p[1], b0, b1;
            inside(ws, g->d[1], g->k[1], g->W, &b0, &b1);
            int64_t mi = (hs + a0 * g->d[0]) * g->W + ws + b0 * g->d[1];
            float m = xp[mi];
            for (int64_t a = a0; a < a1; a++) {
                const float *row = xp + (hs + a * g->d[0]) * g->W + ws;
                for (int64_t b = b0; b < b1; b++) {
                    float v = row[b * g->d[1]];
                    if (v > m || v != v)
                        m = v, mi = (hs + a * g->d[0]) * g->W + ws + b * g->d[1];
                }
            }
            yp[oh * g->OW + ow] = nt__canon(xp[mi]);
            ip[oh * g->OW + ow] = (int32_t)mi;
        }
    }
}

/* The 2 x 2 windows with stride 2, no padding, no dilation (the usual
 * downsampling): the same scan, unrolled (with AVX-512 or AVX2: below). */
static void pool_plane_2x2(const nt__pool2d *g, const float *xp, float *yp, int32_t *ip)
{
    int64_t W = g->W;
    for (int64_t oh = 0; oh < g->OH; oh++) {
        const float *r0 = xp + 2 * oh * W, *r1 = r0 + W;
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t c = 2 * ow, mi = c;
            float m = r0[c], v;
            if ((v = r0[c + 1]) > m || v != v)
                m = v, mi = c + 1;
            if ((v = r1[c]) > m || v != v)
                m = v, mi = W + c;
            if ((v = r1[c + 1]) > m || v != v)
                mi = W + c + 1;
            mi += 2 * oh * W;
            yp[oh * g->OW + ow] = nt__canon(xp[mi]);
            ip[oh * g->OW + ow] = (int32_t)mi;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define POOL_X86 1

/* The 2 x 2 scan with AVX-512, 16 windows of a row pair at a time: the
 * four slots' values (the even and odd columns of two masked loads per
 * row), each later slot replacing where v > m or v != v (the same tests,
 * so the same pick as pool_plane_2x2), the kept value's NaN canonical. */
__attribute__((target(NT_TARGET_AVX512))) static void pool_plane_2x2_avx512(
    const nt__pool2d *g, const float *xp, float *yp, int32_t *ip)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512i lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000));
    int64_t W = g->W;
    for (int64_t oh = 0; oh < g->OH; oh++) {
        const float *r0 = xp + 2 * oh * W, *r1 = r0 + W;
        for (int64_t ow = 0; ow < g->OW; ow += 16) {
            int64_t cnt = g->OW - ow < 16 ? g->OW - ow : 16, span = 2 * cnt;
            __mmask16 mlo = (__mmask16)(span >= 16 ? 0xffffu : (1u << span) - 1u);
            __mmask16 mhi = (__mmask16)(span > 16 ? (1u << (span - 16)) - 1u : 0u);
            __mmask16 mo = (__mmask16)(cnt >= 16 ? 0xffffu : (1u << cnt) - 1u);
            __m512 a = _mm512_maskz_loadu_ps(mlo, r0 + 2 * ow);
            __m512 b = _mm512_maskz_loadu_ps(mhi, r0 + 2 * ow + 16);
            __m512 c = _mm512_maskz_loadu_ps(mlo, r1 + 2 * ow);
            __m512 d = _mm512_maskz_loadu_ps(mhi, r1 + 2 * ow + 16);
            __m512 v0 = _mm512_permutex2var_ps(a, ev, b), v1 = _mm512_permutex2var_ps(a, od, b);
            __m512 v2 = _mm512_permutex2var_ps(c, ev, d), v3 = _mm512_permutex2var_ps(c, od, d);
            __m512i base = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * oh * W + 2 * ow)), lane2);
            __m512i pos = base;
            __m512 m = v0;
            __mmask16 p = _mm512_cmp_ps_mask(v1, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
            m = _mm512_mask_blend_ps(p, m, v1);
            pos = _mm512_mask_blend_epi32(p, pos, _mm512_add_epi32(base, _mm512_set1_epi32(1)));
            p = _mm512_cmp_ps_mask(v2, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v2, v2, _CMP_UNORD_Q);
            m = _mm512_mask_blend_ps(p, m, v2);
            pos = _mm512_mask_blend_epi32(p, pos, _mm512_add_epi32(base, _mm512_set1_epi32((int32_t)W)));
            p = _mm512_cmp_ps_mask(v3, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v3, v3, _CMP_UNORD_Q);
            m = _mm512_mask_blend_ps(p, m, v3);
            pos = _mm512_mask_blend_epi32(p, pos,
                                          _mm512_add_epi32(base, _mm512_set1_epi32((int32_t)W + 1)));
            m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q), m, qnan);
            _mm512_mask_storeu_ps(yp + oh * g->OW + ow, mo, m);
            _mm512_mask_storeu_epi32(ip + oh * g->OW + ow, mo, pos);
        }
    }
}

/* The same scan with AVX2 (CPUs without AVX-512), 8 windows of a row pair
 * at a time: the even and odd columns of 16 values of each row (two loads,
 * masked for the row's last windows; shuffled back into column order),
 * the same tests and blends, so the same pick and bits as pool_plane_2x2.
 * (The last windows' outputs through a buffer: AMD's masked stores are
 * slow.) */
__attribute__((target("avx2,fma"))) static void pool_plane_2x2_avx2(const nt__pool2d *g,
                                                                   const float *xp, float *yp,
                                                                   int32_t *ip)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lane2 = _mm256_add_epi32(lane, lane);
    const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    const int64_t W = g->W, OH = g->OH, OW = g->OW;
    const __m256i o1 = _mm256_set1_epi32(1), oW = _mm256_set1_epi32((int32_t)W),
                  oW1 = _mm256_set1_epi32((int32_t)W + 1);
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *r0 = xp + 2 * oh * W, *r1 = r0 + W;
        float *yo = yp + oh * OW;
        int32_t *io = ip + oh * OW;
        for (int64_t ow = 0; ow < OW; ow += 8) {
            bool full = OW - ow >= 8;
            int cnt = full ? 8 : (int)(OW - ow), span = 2 * cnt;
            __m256i mlo = _mm256_cmpgt_epi32(_mm256_set1_epi32(span), lane);
            __m256i mhi = _mm256_cmpgt_epi32(_mm256_set1_epi32(span - 8), lane);
            __m256 a, b, c, d;
            if (full) {
                a = _mm256_loadu_ps(r0 + 2 * ow), b = _mm256_loadu_ps(r0 + 2 * ow + 8);
                c = _mm256_loadu_ps(r1 + 2 * ow), d = _mm256_loadu_ps(r1 + 2 * ow + 8);
            } else {
                a = _mm256_maskload_ps(r0 + 2 * ow, mlo), b = _mm256_maskload_ps(r0 + 2 * ow + 8, mhi);
                c = _mm256_maskload_ps(r1 + 2 * ow, mlo), d = _mm256_maskload_ps(r1 + 2 * ow + 8, mhi);
            }
            /* shuffle: [x0 x2 y0 y2 | x4 x6 y4 y6]; permute 0xd8: x0 x2 x4 x6 y0 y2 y4 y6 */
#define POOL_AVX2_COLS(p, q, imm) \
    _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(p, q, imm)), 0xd8))
            __m256 v0 = POOL_AVX2_COLS(a, b, 0x88), v1 = POOL_AVX2_COLS(a, b, 0xdd);
            __m256 v2 = POOL_AVX2_COLS(c, d, 0x88), v3 = POOL_AVX2_COLS(c, d, 0xdd);
#undef POOL_AVX2_COLS
            __m256i base = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(2 * oh * W + 2 * ow)), lane2);
            __m256 pos = _mm256_castsi256_ps(base), m = v0, p;
#define POOL_AVX2_SLOT(v, off)                                                                  \
    p = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));       \
    m = _mm256_blendv_ps(m, v, p);                                                              \
    pos = _mm256_blendv_ps(pos, _mm256_castsi256_ps(_mm256_add_epi32(base, off)), p)
            POOL_AVX2_SLOT(v1, o1);
            POOL_AVX2_SLOT(v2, oW);
            POOL_AVX2_SLOT(v3, oW1);
#undef POOL_AVX2_SLOT
            m = _mm256_blendv_ps(m, qnan, _mm256_cmp_ps(m, m, _CMP_UNORD_Q));
            if (full) {
                _mm256_storeu_ps(yo + ow, m);
                _mm256_storeu_si256((__m256i *)(io + ow), _mm256_castps_si256(pos));
            } else {
                float tm[8], tp[8];
                _mm256_storeu_ps(tm, m), _mm256_storeu_ps(tp, pos);
                memcpy(yo + ow, tm, (size_t)cnt * sizeof(float));
                memcpy(io + ow, tp, (size_t)cnt * sizeof(int32_t));
            }
        }
    }
}
#endif

static void pool_block(void *arg, int blk)
{
    const poolk *k = arg;
    const nt__pool2d *g = &k->g;
    bool two = g->k[0] == 2 && g->k[1] == 2 && g->s[0] == 2 && g->s[1] == 2 && g->p[0] == 0 &&
               g->p[1] == 0 && g->d[0] == 1 && g->d[1] == 1;
    int64_t p0 = (int64_t)blk * PLANES_PER_BLOCK, p1 = p0 + PLANES_PER_BLOCK;
    int64_t HW = g->H * g->W, L = g->OH * g->OW;
    void (*fn)(const nt__pool2d *, const float *, float *, int32_t *) =
        two ? pool_plane_2x2 : pool_plane;
#ifdef POOL_X86
    /* (the reference paths, nt__cpu_ref_paths: the scalar scan, which
     * tests/test_cnnperf.c checks the vector ones against) */
    int isa = atomic_load_explicit(&nt__cpu_ref_paths, memory_order_relaxed) ? NT_ISA_SCALAR
                                                                             : nt__gemm_isa();
    if (two && g->H * g->W < (1 << 30) && isa == NT_ISA_AVX512)
        fn = pool_plane_2x2_avx512;
    else if (two && g->H * g->W < (1 << 30) && isa == NT_ISA_AVX2)
        fn = pool_plane_2x2_avx2;
#endif
    for (int64_t pl = p0; pl < p1 && pl < g->P; pl++)
        fn(g, k->x + pl * HW, k->y + pl * L, k->idx + pl * L);
}

int nt__cpu_max_pool2d_fwd(const nt__rec *r)
{
    poolk k = {.x = nt__tensor_data(r->in[0]), .y = nt__tensor_data(r->out[0]),
               .idx = nt__tensor_data(r->out[1])};
    nt__pool2d_geo(&k.g, r);
    int64_t nb = (k.g.P + PLANES_PER_BLOCK - 1) / PLANES_PER_BLOCK;
    nt__par_blocks((int)nb, pool_block, &k, k.g.P * k.g.H * k.g.W >= 65536);
    return 0;
}

/* max_pool2d_bwd: per plane dx = +0, then dx[idx[l]] += g[l] for the
 * windows l in row-major order (scatter_add's order and bits; a position
 * outside the plane adds nothing), NaNs stored canonical. */
typedef struct poolb {
    nt__pool2d g;
    const float *gy;
    const int32_t *idx;
    float *dx;
} poolb;

static void bwd_block(void *arg, int blk)
{
    const poolb *k = arg;
    int64_t HW = k->g.H * k->g.W, L = k->g.OH * k->g.OW;
    int64_t p0 = (int64_t)blk * PLANES_PER_BLOCK, p1 = p0 + PLANES_PER_BLOCK;
    for (int64_t pl = p0; pl < p1 && pl < k->g.P; pl++) {
        float *d = k->dx + pl * HW;
        const float *gp = k->gy + pl * L;
        const int32_t *ip = k->idx + pl * L;
        memset(d, 0, sizeof(float) * (size_t)HW);
        for (int64_t l = 0; l < L; l++)
            if (ip[l] >= 0 && ip[l] < HW)
                d[ip[l]] += gp[l];
        for (int64_t i = 0; i < HW; i++)
            d[i] = nt__canon(d[i]);
    }
}

int nt__cpu_max_pool2d_bwd(const nt__rec *r)
{
    poolb k = {.gy = nt__tensor_data(r->in[0]), .idx = nt__tensor_data(r->in[1]),
               .dx = nt__tensor_data(r->out[0])};
    nt__pool2d_geo(&k.g, r);
    int64_t nb = (k.g.P + PLANES_PER_BLOCK - 1) / PLANES_PER_BLOCK;
    nt__par_blocks((int)nb, bwd_block, &k, k.g.P * k.g.H * k.g.W >= 65536);
    return 0;
}
