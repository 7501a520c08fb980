/* core/conv.h - the geometry of the convolution kernels (issue 33), shared by
 * the CPU kernels (cpu/conv.c) and the simulator's (neuron/conv.c).
 *
 * Two kernel ops carry every convolution (dispatcher/api_conv.c builds the
 * public ones from them; docs/ops.md, "Convolution", has the contract):
 *
 *   conv_gemm(x [N, C, H, W], w [CO, C/G, kh, kw]) -> y [N, CO, OH, OW]
 *     per group and image, y[co, (oh, ow)] = sum over K = (ki, kj, ci), in
 *     row-major order of [kh, kw, C/G] (tap-major, channel-minor: w's own
 *     [C/G, kh, kw] rows permuted), of w[co, K] * col[K, (oh, ow)]:
 *     nt_matmul's arithmetic (docs/exactness.md, rule 4) with w as the left
 *     operand and the columns as the right one;
 *   conv_wgrad(x [N, C, H, W], gy [N, CO, OH, OW]) -> dw [CO, C/G, kh, kw]
 *     dw[co, K] = sum over P = (n, oh, ow), in that order, of
 *     col[K, P] * gy[co, P]: one matmul contracting over every image's
 *     positions, K-tiles of 128 positions in ascending order across the
 *     image boundaries.
 *
 * col[(ki, kj, ci), (oh, ow)] of image n is the element of x's channel
 * g * C/G + ci at (ih, iw) = ((oh s0 + ki d0 - lo0) / u0, (ow s1 + kj d1 -
 * lo1) / u1) when both divisions are exact and the result lies inside the
 * plane, else +0 (a padding tap, or a hole of the input dilated by u: the
 * transposed convolution's stride).  Those zeros are products like any other
 * (0 * w, NaN for an Inf or NaN weight), so the arithmetic is one dense
 * matmul whatever the padding.
 *
 * Parameters (the record's nt__params): i[0..1] stride s, i[2..3] the
 * offset lo (padding before; negative crops), i[4..5] dilation d, i[6..7]
 * the input dilation u (1: none), flag the groups G; conv_gemm's dim 1
 * (flip): w is given as [C, CO/G, kh, kw] (a transposed convolution's
 * weight) and read as w'[g COg + co, ci, ki, kj] = w[g Cg + ci, co, kh-1-ki,
 * kw-1-kj] (nt__conv_wpos).  OH and OW are the
 * output's (conv_gemm) or gy's (conv_wgrad) last dims; kh, kw w's (dw's). */
#ifndef NT_CORE_CONV_H
#define NT_CORE_CONV_H

#include "core/internal.h"

typedef struct nt__conv_geo {
    int64_t N, C, H, W;  /* the input x */
    int64_t CO, OH, OW;  /* output channels, positions */
    int64_t kh, kw, G;   /* kernel, groups */
    int64_t s[2], lo[2], d[2], u[2];
    bool flip;           /* conv_gemm: w in the transposed layout */
} nt__conv_geo;

static inline void nt__conv_geo_params(const nt__params *p, nt__conv_geo *g)
{
    for (int i = 0; i < 2; i++) {
        g->s[i] = p->i[i];
        g->lo[i] = p->i[2 + i];
        g->d[i] = p->i[4 + i];
        g->u[i] = p->i[6 + i];
    }
    g->G = p->flag;
    g->flip = p->dim == 1;
}

/* conv_gemm (wgrad false: x, w -> y) or conv_wgrad (true: x, gy -> dw). */
static inline void nt__conv_geo_of(const nt__rec *r, bool wgrad, nt__conv_geo *g)
{
    const nt_tensor *x = r->in[0], *o = wgrad ? r->in[1] : r->out[0];
    const nt_tensor *k = wgrad ? r->out[0] : r->in[1];
    nt__conv_geo_params(&r->p, g);
    g->N = x->shape[0], g->C = x->shape[1], g->H = x->shape[2], g->W = x->shape[3];
    g->CO = o->shape[1], g->OH = o->shape[2], g->OW = o->shape[3];
    g->kh = k->shape[2], g->kw = k->shape[3];
}

/* The flat position in w of the weight w'[grp COg + co][K = (ki, kj, ci)]
 * of conv_gemm (COg = CO / G, Cg = C / G). */
static inline int64_t nt__conv_wpos(const nt__conv_geo *g, int64_t grp, int64_t co, int64_t ci,
                                    int64_t ki, int64_t kj)
{
    int64_t COg = g->CO / g->G, Cg = g->C / g->G;
    if (!g->flip)
        return (((grp * COg + co) * Cg + ci) * g->kh + ki) * g->kw + kj;
    return (((grp * Cg + ci) * COg + co) * g->kh + (g->kh - 1 - ki)) * g->kw + (g->kw - 1 - kj);
}

/* The flat position ih * W + iw that column row (ki, kj) reads at output
 * position (oh, ow), or -1 for a zero. */
static inline int64_t nt__conv_src(const nt__conv_geo *g, int64_t ki, int64_t kj, int64_t oh,
                                   int64_t ow)
{
    int64_t ih = oh * g->s[0] + ki * g->d[0] - g->lo[0];
    int64_t iw = ow * g->s[1] + kj * g->d[1] - g->lo[1];
    if (ih < 0 || iw < 0 || ih % g->u[0] || iw % g->u[1])
        return -1;
    ih /= g->u[0], iw /= g->u[1];
    return ih < g->H && iw < g->W ? ih * g->W + iw : -1;
}

/* The output positions ow in [*a, *b) whose column (kj) reads inside the
 * plane along W, when u1 == 1 (the others read zeros). */
static inline void nt__conv_wrange(const nt__conv_geo *g, int64_t kj, int64_t *a, int64_t *b)
{
    int64_t off = kj * g->d[1] - g->lo[1], s = g->s[1]; /* iw = ow s + off */
    int64_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t hi = g->W - 1 - off < 0 ? 0 : (g->W - 1 - off) / s + 1;
    *a = lo < g->OW ? lo : g->OW;
    *b = hi < *a ? *a : hi < g->OW ? hi : g->OW;
}

#endif
