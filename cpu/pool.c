/* cpu/pool.c - max_pool2d_fwd: every window's maximum and its flat position
 * in one pass over the planes (core/pool.h has the geometry and the scan:
 * PyTorch's, so its values, NaNs and indices).  Planes in blocks across the
 * host threads; each output is written by one thread, so the order of the
 * blocks never shows in the values. */
#include "core/dtype.h"
#include "core/gemm.h"
#include "core/pool.h"
#include "cpu/cpu.h"

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
 * downsampling): the same scan, unrolled. */
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

static void pool_block(void *arg, int blk)
{
    const poolk *k = arg;
    const nt__pool2d *g = &k->g;
    bool two = g->k[0] == 2 && g->k[1] == 2 && g->s[0] == 2 && g->s[1] == 2 && g->p[0] == 0 &&
               g->p[1] == 0 && g->d[0] == 1 && g->d[1] == 1;
    int64_t p0 = (int64_t)blk * PLANES_PER_BLOCK, p1 = p0 + PLANES_PER_BLOCK;
    int64_t HW = g->H * g->W, L = g->OH * g->OW;
    for (int64_t pl = p0; pl < p1 && pl < g->P; pl++)
        (two ? pool_plane_2x2 : pool_plane)(g, k->x + pl * HW, k->y + pl * L, k->idx + pl * L);
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
