/* neuron/conv.c - the convolution kernels conv_gemm and conv_wgrad on the
 * simulator (core/conv.h has the geometry, docs/ops.md "Convolution" the
 * contract, cpu/conv.c the reference).
 *
 * im2col by DMA access patterns, then nt_tile_matmul (PSUM accumulation
 * over K-tiles of 128 in ascending order: the CPU's recurrence, bit for
 * bit):
 *   1. x padded (and dilated, for the transposed convolution) into HBM
 *      scratch xp: zeros from an SBUF tile, then x's planes into the
 *      interior -- one strided DMA per 128 planes;
 *   2. the columns col [G][Kc][N OH OW]: one DMA per (image, channel), a
 *      pattern [ki (partitions), kj, oh, ow] over xp -- the padding and
 *      the holes are the zeros of xp, so no tap needs a case of its own;
 *   3. conv_gemm: per image and group w_g [COg, Kc] . col [Kc, OH OW];
 *      conv_wgrad: per group gy_g [COg, N OH OW] . col^T (col given as
 *      B^T), one product over every image's positions. */
#include "neuron/sk.h"

#include <string.h>

#include "core/conv.h"

/* n elements of HBM at base + off (dtype dt) set to zero from z, a zeroed
 * SBUF tile [128, F]. */
static int zero_hbm(sk_k *s, char *base, nt_dtype dt, int64_t n, nt_tile *z, int64_t F)
{
    int64_t off = 0;
    while (n - off >= F) {
        int rows = (int)((n - off) / F < 128 ? (n - off) / F : 128);
        nt_ap d = nt_hbm_ap(base, dt, off, rows, F, F), src = nt_tile_slice(z, 0, rows, 0, F);
        int rc = nt_isa_dma_copy(s->k, &d, &src, sk_qout(s));
        if (rc)
            return rc;
        off += rows * F;
    }
    if (off < n) {
        nt_ap d = nt_hbm_ap(base, dt, off, 1, n - off, n - off);
        nt_ap src = nt_tile_slice(z, 0, 1, 0, n - off);
        return nt_isa_dma_copy(s->k, &d, &src, sk_qout(s));
    }
    return 0;
}

typedef struct padded {
    char *xp;
    int64_t Hp, Wp, pb[2]; /* xp row r holds dilated x's row r - pb[0] */
} padded;

/* Steps 1 and 2: the columns of every group into col [G][Kc][N L]. */
static int columns(sk_k *s, const nt__conv_geo *g, const nt_tensor *x, char *col)
{
    nt_dtype dt = (nt_dtype)x->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt), L = g->OH * g->OW, NL = g->N * L;
    int64_t Cg = g->C / g->G, Kc = Cg * g->kh * g->kw;
    int64_t k[2] = {g->kh, g->kw}, o[2] = {g->OH, g->OW}, in[2] = {g->H, g->W}, ext[2];
    padded P;
    for (int i = 0; i < 2; i++) {
        P.pb[i] = g->lo[i] > 0 ? g->lo[i] : 0;
        int64_t need = (o[i] - 1) * g->s[i] + (k[i] - 1) * g->d[i] - g->lo[i] + P.pb[i] + 1;
        int64_t have = P.pb[i] + (in[i] - 1) * g->u[i] + 1;
        ext[i] = need > have ? need : have;
    }
    P.Hp = ext[0], P.Wp = ext[1];
    int64_t nxp = g->N * g->C * P.Hp * P.Wp;
    if (!(P.xp = sk_scratch(s, (size_t)(nxp * es))))
        return s->derr_code;
    int64_t F = 2048;
    nt_tile *z = sk_tile(s, "conv.zero", dt, 128, F);
    int rc = z ? 0 : nt_sim_kernel_error(s->k);
    nt_ap za = z ? nt_tile_ap(z) : (nt_ap){0};
    if (!rc)
        rc = nt_isa_memset(s->k, &za, 0.0, NT_ENGINE_GPSIMD);
    if (!rc)
        rc = zero_hbm(s, P.xp, dt, nxp, z, F);
    const char *xd = nt__tensor_data(x);
    int64_t planes = g->N * g->C;
    for (int64_t p0 = 0; !rc && p0 < planes; p0 += 128) {
        int np = (int)(planes - p0 < 128 ? planes - p0 : 128);
        nt_ap src = nt_hbm_ap(xd, dt, p0 * g->H * g->W, np, g->H * g->W, g->W);
        src.ndim = 2, src.num[0] = g->H, src.step[0] = g->W, src.num[1] = g->W, src.step[1] = 1;
        nt_ap d = src;
        d.hbm = P.xp;
        d.pstep = P.Hp * P.Wp;
        d.offset = p0 * P.Hp * P.Wp + P.pb[0] * P.Wp + P.pb[1];
        d.step[0] = g->u[0] * P.Wp, d.step[1] = g->u[1];
        rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
    }
    /* column row (ci, ki, kj) at (oh, ow) reads xp row oh s0 + ki d0 - lo0 + pb0 */
    int64_t base = (P.pb[0] - g->lo[0]) * P.Wp + (P.pb[1] - g->lo[1]);
    for (int64_t n = 0; !rc && n < g->N; n++)
        for (int64_t c = 0; !rc && c < g->C; c++) {
            int64_t grp = c / Cg, ci = c % Cg;
            nt_ap src;
            memset(&src, 0, sizeof src);
            src.hbm = P.xp, src.dtype = dt, src.np = (int)g->kh, src.pstep = g->d[0] * P.Wp;
            src.offset = (n * g->C + c) * P.Hp * P.Wp + base;
            src.ndim = 3;
            src.num[0] = g->kw, src.step[0] = g->d[1];
            src.num[1] = g->OH, src.step[1] = g->s[0] * P.Wp;
            src.num[2] = g->OW, src.step[2] = g->s[1];
            nt_ap d;
            memset(&d, 0, sizeof d);
            d.hbm = col, d.dtype = dt, d.np = (int)g->kh, d.pstep = g->kw * NL;
            d.offset = grp * Kc * NL + ci * g->kh * g->kw * NL + n * L;
            d.ndim = 2;
            d.num[0] = g->kw, d.step[0] = NL;
            d.num[1] = L, d.step[1] = 1;
            rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
        }
    if (z)
        nt_tile_release(s->k, z);
    return rc;
}

static int conv_gemm_run(sk_k *s, const nt__rec *r)
{
    nt__conv_geo g;
    nt__conv_geo_of(r, false, &g);
    const nt_tensor *x = r->in[0], *w = r->in[1], *y = r->out[0];
    nt_dtype dt = (nt_dtype)x->dtype, odt = (nt_dtype)y->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt), oes = (int64_t)nt__dtype_size(odt);
    int64_t Cg = g.C / g.G, COg = g.CO / g.G, Kc = Cg * g.kh * g.kw, L = g.OH * g.OW;
    int64_t NL = g.N * L;
    if (NL == 0 || g.CO == 0)
        return 0;
    char *col = sk_scratch(s, (size_t)(g.G * Kc * NL * es));
    if (!col)
        return s->derr_code;
    int rc = columns(s, &g, x, col);
    const char *wd = nt__tensor_data(w);
    char *yd = nt__tensor_data(y);
    for (int64_t n = 0; !rc && n < g.N; n++)
        for (int64_t grp = 0; !rc && grp < g.G; grp++) {
            nt_tile_matmul_args a;
            memset(&a, 0, sizeof a);
            a.M = COg, a.N = L, a.K = Kc;
            a.a = wd + grp * COg * Kc * es, a.lda = Kc;
            a.b = col + (grp * Kc * NL + n * L) * es, a.ldb = NL;
            a.in_dtype = dt;
            a.c = yd + (n * g.CO + grp * COg) * L * oes, a.ldc = L;
            a.out_dtype = odt;
            rc = nt_tile_matmul(s->k, &a);
        }
    return rc;
}

static int conv_wgrad_run(sk_k *s, const nt__rec *r)
{
    nt__conv_geo g;
    nt__conv_geo_of(r, true, &g);
    const nt_tensor *x = r->in[0], *gy = r->in[1], *dw = r->out[0];
    nt_dtype dt = (nt_dtype)x->dtype, odt = (nt_dtype)dw->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt), oes = (int64_t)nt__dtype_size(odt);
    int64_t Cg = g.C / g.G, COg = g.CO / g.G, Kc = Cg * g.kh * g.kw, L = g.OH * g.OW;
    int64_t NL = g.N * L;
    char *col = NL ? sk_scratch(s, (size_t)(g.G * Kc * NL * es)) : NULL;
    char *gs = NL ? sk_scratch(s, (size_t)(g.CO * NL * es)) : NULL;
    if (NL && (!col || !gs))
        return s->derr_code;
    int rc = NL ? columns(s, &g, x, col) : 0;
    /* gy [N, CO, L] -> gs [CO, N L] */
    const char *gd = nt__tensor_data(gy);
    for (int64_t n = 0; !rc && n < g.N; n++)
        for (int64_t c0 = 0; !rc && c0 < g.CO; c0 += 128) {
            int np = (int)(g.CO - c0 < 128 ? g.CO - c0 : 128);
            nt_ap src = nt_hbm_ap(gd, dt, (n * g.CO + c0) * L, np, L, L);
            nt_ap d = nt_hbm_ap(gs, dt, c0 * NL + n * L, np, NL, L);
            rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
        }
    char *od = nt__tensor_data(dw);
    for (int64_t grp = 0; !rc && grp < g.G; grp++) {
        nt_tile_matmul_args a;
        memset(&a, 0, sizeof a);
        a.M = COg, a.N = Kc, a.K = NL;
        a.a = gs + grp * COg * NL * es, a.lda = NL;
        a.b = col + grp * Kc * NL * es, a.ldb = NL, a.b_trans = true;
        a.in_dtype = dt;
        a.c = od + grp * COg * Kc * oes, a.ldc = Kc;
        a.out_dtype = odt;
        rc = nt_tile_matmul(s->k, &a);
    }
    return rc;
}

int nt__sk_conv_gemm(const nt__rec *r)
{
    sk_k s;
    int rc = sk_begin(&s, "conv_gemm");
    if (rc)
        return rc;
    bool values = sk_values_begin(&s);
    if (values && sk_memo_rec(&s, r, false))
        return sk_end_values(&s, values, 0, r);
    return sk_end_values(&s, values, conv_gemm_run(&s, r), r);
}

int nt__sk_conv_wgrad(const nt__rec *r)
{
    sk_k s;
    int rc = sk_begin(&s, "conv_wgrad");
    if (rc)
        return rc;
    bool values = sk_values_begin(&s);
    if (values && sk_memo_rec(&s, r, false))
        return sk_end_values(&s, values, 0, r);
    return sk_end_values(&s, values, conv_wgrad_run(&s, r), r);
}
