/* neuron/rope.c - rotary position embedding (op ROPE) as one tile program:
 * the CPU kernel's arithmetic (cpu/rope.c, core/rope.h) on the NeuronCore.
 *
 * x and y contiguous [N, T, D].  Positions go on partitions: a block of up
 * to 128 positions t0 .. t0+np-1 and, along the free dims, the rows of up to
 * nn consecutive n ([np, nn, D], one strided DMA).  Per block of positions:
 *   - the offset: a [np, 1] i32 tile, memset to the parameter or DMA'd
 *     from the offset tensor (partition step 0);
 *   - the cos/sin table [np, dims]: one GpSimd custom operator (the
 *     runtime's custom C code, as sin and cos are: the NKI ISA's sin takes
 *     only [-pi, pi], and the exact argument reduction needs integer
 *     products no ALU operator gives) running nt__rope_table from the
 *     offset tile: the CPU's table, bit for bit;
 * then per group of rows, on VectorE, with the table read at step 0 along
 * n: A = x1 * c, B = x2 * s, y1 = A - B; A' = x2 * c, B' = x1 * s, y2 = A' +
 * B' (f32 temporaries: each product rounded once as the CPU's; y rounded
 * once to its dtype).  x1, x2 are strided patterns of the loaded tile
 * (step 1 from 0 and dims/2, or step 2 from 0 and 1 interleaved).  The
 * features dims .. D-1 are stored from the loaded tile by DMA, bit for bit.
 * Tiles of x and y are double-buffered so the next group's load overlaps
 * this one's compute. */
#include "neuron/sk.h"

#include <string.h>

#include "core/rope.h"

#define RF 4096 /* free elements of x per tile (nn * D) */

typedef struct rope_k {
    sk_k *s;
    const nt__rec *r;
    nt_dtype dt;
    char *xb, *yb;
    int64_t N, T, D, dims, h, nn;
    bool il;
    nt_tile *off, *cs, *xt[2], *yt[2], *tf[4];
    int b; /* the double buffers' index */
} rope_k;

/* The GpSimd operator's context: the table rows of positions off + t0 + p. */
typedef struct rope_tab {
    sk_k *s;
    int64_t t0, T, dims;
    double base, scale;
    bool inverse;
} rope_tab;

static int rope_tab_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                       void *ctx, char *msg, size_t msglen)
{
    (void)nsrc;
    const rope_tab *c = ctx;
    int64_t off = nt__load_i32(src[0].data, src[0].dtype, 0);
    if (!nt__rope_pos_ok(off, c->T, msg, msglen))
        return sk_data_error(c->s, NT_EINVAL, "%s", msg);
    for (int p = 0; p < dst->np; p++)
        nt__rope_table((float *)((char *)dst->data + p * dst->pstride), off, c->t0 + p, 1,
                       c->dims, c->base, c->scale, c->inverse);
    return 0;
}

/* [np, w, n] of tile t from element f0: rows D apart, n elements `step`
 * apart (step 0 along w: the table). */
static nt_ap pat(const nt_tile *t, int np, int64_t f0, int64_t w, int64_t wstep, int64_t n,
                 int64_t step)
{
    nt_ap a = nt_tile_slice(t, 0, np, f0, 1);
    a.ndim = 2;
    a.num[0] = w, a.step[0] = wstep;
    a.num[1] = n, a.step[1] = step;
    return a;
}

/* HBM [np, w, n]: x or y at (n0, t0), feature f0 */
static nt_ap hpat(const rope_k *c, char *base, int64_t n0, int64_t t0, int np, int64_t w,
                  int64_t f0, int64_t n)
{
    nt_ap a = nt_hbm_ap(base, c->dt, (n0 * c->T + t0) * c->D + f0, np, c->D, 1);
    a.ndim = 2;
    a.num[0] = w, a.step[0] = c->T * c->D;
    a.num[1] = n, a.step[1] = 1;
    return a;
}

/* The rotation of rows n0 .. n0+w-1 at positions t0 .. t0+np-1. */
static int rope_group(rope_k *c, int64_t n0, int64_t w, int64_t t0, int np)
{
    nt_sim_kernel *k = c->s->k;
    int b = c->b++ & 1;
    int64_t D = c->D, h = c->h, i2 = c->il ? 1 : h, st = c->il ? 2 : 1;
    nt_ap xt = nt_tile_slice(c->xt[b], 0, np, 0, w * D);
    nt_ap hx = hpat(c, c->xb, n0, t0, np, w, 0, D);
    int rc = nt_isa_dma_copy(k, &xt, &hx, sk_qin(c->s));
    nt_ap x1 = pat(c->xt[b], np, 0, w, D, h, st), x2 = pat(c->xt[b], np, i2, w, D, h, st);
    nt_ap y1 = pat(c->yt[b], np, 0, w, D, h, st), y2 = pat(c->yt[b], np, i2, w, D, h, st);
    nt_ap cc = pat(c->cs, np, 0, w, 0, h, 1), ss = pat(c->cs, np, h, w, 0, h, 1);
    nt_ap T[4];
    for (int i = 0; i < 4; i++)
        T[i] = pat(c->tf[i], np, 0, w, h, h, 1);
    const nt_engine V = NT_ENGINE_VECTOR;
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[0], &x1, &cc, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[1], &x2, &ss, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &y1, &T[0], &T[1], NT_ALU_SUB, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[2], &x2, &cc, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[3], &x1, &ss, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &y2, &T[2], &T[3], NT_ALU_ADD, V);
    nt_ap yr = pat(c->yt[b], np, 0, w, D, c->dims, 1), hy = hpat(c, c->yb, n0, t0, np, w, 0, c->dims);
    if (!rc)
        rc = nt_isa_dma_copy(k, &hy, &yr, sk_qout(c->s));
    if (!rc && c->dims < D) { /* the features passed through, bit for bit */
        nt_ap xp = pat(c->xt[b], np, c->dims, w, D, D - c->dims, 1);
        nt_ap hp = hpat(c, c->yb, n0, t0, np, w, c->dims, D - c->dims);
        rc = nt_isa_dma_copy(k, &hp, &xp, sk_qout(c->s));
    }
    return rc;
}

/* Every block of positions: its offset tile, its table, then its groups. */
static int rope_all(rope_k *c)
{
    nt_sim_kernel *k = c->s->k;
    const nt__rec *r = c->r;
    int rc = 0;
    nt_ap off = nt_tile_slice(c->off, 0, 128, 0, 1);
    if (r->in[1]) {
        nt_ap h = nt_hbm_ap(nt__tensor_data(r->in[1]), NT_I32, 0, 128, 0, 1);
        rc = nt_isa_dma_copy(k, &off, &h, sk_qin(c->s));
    } else {
        rc = nt_isa_memset(k, &off, (double)r->p.i[1], NT_ENGINE_GPSIMD);
    }
    for (int64_t t0 = 0; t0 < c->T && !rc; t0 += 128) {
        int np = (int)(c->T - t0 < 128 ? c->T - t0 : 128);
        rope_tab tab = {c->s, t0, c->T, c->dims, r->p.f[0], r->p.f[1],
                        (r->p.flag & NT__ROPE_INVERSE) != 0};
        nt_ap cs = nt_tile_slice(c->cs, 0, np, 0, c->dims), o1 = nt_tile_slice(c->off, 0, np, 0, 1);
        const nt_ap *src[1] = {&o1};
        rc = nt_isa_gpsimd_custom(k, "rope.table", &cs, src, 1, 24.0, rope_tab_fn, &tab);
        for (int64_t n0 = 0; n0 < c->N && !rc; n0 += c->nn)
            rc = rope_group(c, n0, c->N - n0 < c->nn ? c->N - n0 : c->nn, t0, np);
    }
    return rc;
}

/* The widest D the kernel's tiles take (wider: the CPU runs it). */
bool nt__sk_rope_fits(const nt__params *p) { return p->i[2] <= RF; }

int nt__sk_rope(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    rope_k c;
    memset(&c, 0, sizeof c);
    int nd = x->ndim;
    c.D = x->shape[nd - 1], c.T = x->shape[nd - 2], c.N = nt__numel(nd - 2, x->shape);
    if (c.N * c.T * c.D == 0)
        return 0;
    if (c.D > RF)
        return nt__kerr(NT_ENOTSUP, "nt_rope on the simulator: D = %lld is over %d",
                        (long long)c.D, RF);
    sk_k s;
    int rc = sk_begin(&s, nt__op_name(r->op));
    if (rc)
        return rc;
    bool values = sk_values_begin(&s);
    if (values && sk_memo_rec(&s, r, false))
        return sk_end_values(&s, values, 0, r);
    c.s = &s, c.r = r;
    c.dt = (nt_dtype)x->dtype;
    c.xb = nt__tensor_data(x), c.yb = nt__tensor_data(o);
    c.dims = r->p.i[0], c.h = c.dims / 2, c.il = (r->p.flag & NT__ROPE_INTERLEAVED) != 0;
    c.nn = RF / c.D;
    if (c.nn > c.N)
        c.nn = c.N;
    c.off = sk_tile(&s, "rope.offset", NT_I32, 128, 1);
    c.cs = sk_tile(&s, "rope.cossin", NT_F32, 128, c.dims);
    for (int b = 0; b < 2; b++) {
        c.xt[b] = sk_tile(&s, "rope.x", c.dt, 128, c.nn * c.D);
        c.yt[b] = sk_tile(&s, "rope.y", c.dt, 128, c.nn * c.D);
    }
    for (int i = 0; i < 4; i++)
        c.tf[i] = sk_tile(&s, "rope.t", NT_F32, 128, c.nn * c.h);
    if (!nt_sim_kernel_error(s.k))
        rope_all(&c);
    return sk_end_values(&s, values, 0, r);
}
