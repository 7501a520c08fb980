/* neuron/pool.c - max_pool2d_fwd on the simulator: the CPU kernel's scan
 * (core/pool.h, cpu/pool.c) slot by slot on VectorE and GpSimd.
 *
 * Planes on partitions, q planes per partition (as many as fit, up to
 * P / 128), each padded on chip to the extent the windows read (-inf
 * outside the input) with one DMA.  Slot (a, b) of every window of the q
 * planes is one strided view [q, OH, OW] of the padded planes.  Kept value
 * m and position i, [q, OH, OW] each; for each slot in order, v its view:
 *   pred = (v > m) max (v != v)          the scan's test (1.0 or 0.0)
 *   with slots outside the input: pred = (pred max (i < 0)) * inside,
 *        inside the slot's view of a 1/0 mask plane (step 0 across the q
 *        planes), m starting at -inf and i at -1 (no slot taken yet);
 *        else slot 0 starts m (a copy) and i;
 *   m = select(pred, v, m); i = select(pred, pos, i)
 * pos the slot's flat positions (iota: (oh s0 - p0 + a d0) W + ow s1 - p1 +
 * b d1, exact in f32 below 2^24, the dispatcher's bound).  So each window
 * keeps what the CPU's scan keeps, with x's bits (select copies); i goes
 * out as i32 (tensor_copy).
 *
 * max_pool2d_bwd: the padded dx planes start at +0; for each slot from the
 * last to the first, dx's view of the slot += select(i == pos, g, 0)
 * (VectorE).  An input position gets its windows' terms in row-major
 * window order (a later slot of a window sits in an earlier window's row
 * or column), the CPU's order; the zeros added in between change nothing
 * (dx is never -0: it starts at +0).  A padding cell's sums are dropped. */
#include "core/pool.h"
#include "neuron/sk.h"

typedef struct poolc {
    sk_k *s;
    nt__pool2d g;
    int64_t Hp, Wp, L;
    bool mask;
    const char *x;
    char *y, *idx; /* the backward: y is dx */
    nt_tile *X, *MSK, *M, *I, *B, *Pr, *T, *I32, *Z;
    const char *g_in;
} poolc;

/* [q, OH, OW] contiguous in tile t. */
static nt_ap out_view(const poolc *c, nt_tile *t, int np, int64_t q)
{
    nt_ap v = nt_tile_slice(t, 0, np, 0, q * c->L);
    v.ndim = 3;
    v.num[0] = q, v.num[1] = c->g.OH, v.num[2] = c->g.OW;
    v.step[0] = c->L, v.step[1] = c->g.OW, v.step[2] = 1;
    return v;
}

/* Slot (a, b) of every window of q planes in t (plane step `ps`: 0 for the
 * mask plane). */
static nt_ap slot_view(const poolc *c, nt_tile *t, int np, int64_t q, int64_t a, int64_t b,
                       int64_t ps)
{
    nt_ap v = nt_tile_slice(t, 0, np, 0, 1);
    v.offset = a * c->g.d[0] * c->Wp + b * c->g.d[1];
    v.ndim = 3;
    v.num[0] = q, v.num[1] = c->g.OH, v.num[2] = c->g.OW;
    v.step[0] = ps, v.step[1] = c->g.s[0] * c->Wp, v.step[2] = c->g.s[1];
    return v;
}

/* The mask plane: 1 inside the input, 0 in the padding. */
static int mask_plane(poolc *c)
{
    nt_sim_kernel *k = c->s->k;
    nt_ap all = nt_tile_slice(c->MSK, 0, 128, 0, c->Hp * c->Wp);
    nt_ap in = nt_tile_slice(c->MSK, 0, 128, c->g.p[0] * c->Wp + c->g.p[1], 1);
    in.ndim = 2;
    in.num[0] = c->g.H, in.num[1] = c->g.W;
    in.step[0] = c->Wp, in.step[1] = 1;
    int rc = nt_isa_memset(k, &all, 0.0, NT_ENGINE_GPSIMD);
    return rc ? rc : nt_isa_memset(k, &in, 1.0, NT_ENGINE_GPSIMD);
}

/* One slot's step of the scan over q planes on np partitions. */
static int slot_step(poolc *c, int np, int64_t q, int64_t a, int64_t b, bool first)
{
    nt_sim_kernel *k = c->s->k;
    const nt__pool2d *g = &c->g;
    nt_ap v = slot_view(c, c->X, np, q, a, b, c->Hp * c->Wp);
    nt_ap m = out_view(c, c->M, np, q), i = out_view(c, c->I, np, q);
    nt_ap pos = out_view(c, c->B, np, q), pr = out_view(c, c->Pr, np, q);
    nt_ap t = out_view(c, c->T, np, q);
    nt_isa_affine e = {.offset = (int32_t)((a * g->d[0] - g->p[0]) * g->W + b * g->d[1] - g->p[1]),
                       .step = {0, (int32_t)(g->s[0] * g->W), (int32_t)g->s[1]}};
    int rc = nt_isa_iota(k, first ? &i : &pos, &e);
    if (first) /* slot 0 of windows that lie inside: the scan's start */
        return rc ? rc : nt_isa_tensor_copy(k, &m, &v, NT_ENGINE_VECTOR);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &pr, &v, &m, NT_ALU_GT, NT_ENGINE_VECTOR);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &t, &v, &v, NT_ALU_NE, NT_ENGINE_VECTOR);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &pr, &pr, &t, NT_ALU_MAX, NT_ENGINE_VECTOR);
    if (!rc && c->mask) {
        nt_ap in = slot_view(c, c->MSK, np, q, a, b, 0);
        rc = nt_isa_tensor_scalar(k, &t, &i, &(nt_isa_alu){NT_ALU_LT, {NULL, 0.0f}, false}, NULL,
                                  NT_ENGINE_VECTOR);
        if (!rc)
            rc = nt_isa_tensor_tensor(k, &pr, &pr, &t, NT_ALU_MAX, NT_ENGINE_VECTOR);
        if (!rc)
            rc = nt_isa_tensor_tensor(k, &pr, &pr, &in, NT_ALU_MUL, NT_ENGINE_VECTOR);
    }
    if (!rc)
        rc = nt_isa_select(k, &m, &pr, &v, &m, NT_ENGINE_VECTOR);
    return rc ? rc : nt_isa_select(k, &i, &pr, &pos, &i, NT_ENGINE_GPSIMD);
}

/* Planes pl0 .. pl0 + np q: q per partition. */
static int pool_group(poolc *c, int64_t pl0, int np, int64_t q)
{
    nt_sim_kernel *k = c->s->k;
    const nt__pool2d *g = &c->g;
    int64_t HW = g->H * g->W, pp = c->Hp * c->Wp;
    int rc = 0;
    if (c->mask) {
        nt_ap xall = nt_tile_slice(c->X, 0, np, 0, q * pp);
        nt_ap m = out_view(c, c->M, np, q), i = out_view(c, c->I, np, q);
        rc = nt_isa_memset(k, &xall, -INFINITY, NT_ENGINE_GPSIMD);
        if (!rc)
            rc = nt_isa_memset(k, &m, -INFINITY, NT_ENGINE_VECTOR);
        if (!rc)
            rc = nt_isa_memset(k, &i, -1.0, NT_ENGINE_VECTOR);
    }
    nt_ap dx = nt_tile_slice(c->X, 0, np, g->p[0] * c->Wp + g->p[1], 1);
    dx.ndim = 3;
    dx.num[0] = q, dx.num[1] = g->H, dx.num[2] = g->W;
    dx.step[0] = pp, dx.step[1] = c->Wp, dx.step[2] = 1;
    nt_ap hx = nt_hbm_ap(c->x, NT_F32, pl0 * HW, np, q * HW, q * HW);
    if (!rc)
        rc = nt_isa_dma_copy(k, &dx, &hx, sk_qin(c->s));
    for (int64_t a = 0; a < g->k[0] && !rc; a++)
        for (int64_t b = 0; b < g->k[1] && !rc; b++)
            rc = slot_step(c, np, q, a, b, !c->mask && a == 0 && b == 0);
    nt_ap m = out_view(c, c->M, np, q), i = out_view(c, c->I, np, q);
    nt_ap i32 = out_view(c, c->I32, np, q);
    nt_ap hy = nt_hbm_ap(c->y, NT_F32, pl0 * c->L, np, q * c->L, q * c->L);
    nt_ap hi = nt_hbm_ap(c->idx, NT_I32, pl0 * c->L, np, q * c->L, q * c->L);
    if (!rc)
        rc = nt_isa_dma_copy(k, &hy, &m, sk_qout(c->s));
    if (!rc)
        rc = nt_isa_tensor_copy(k, &i32, &i, NT_ENGINE_GPSIMD);
    return rc ? rc : nt_isa_dma_copy(k, &hi, &i32, sk_qout(c->s));
}

/* Planes per partition: up to P / 128, as many as the budget holds. */
static int64_t planes_per_part(const nt__pool2d *g)
{
    int64_t q = g->P / 128 > 1 ? g->P / 128 : 1;
    while (q > 1 && nt__pool2d_bytes(g, q) > NT_POOL2D_SBUF)
        q--;
    return q;
}

/* The tiles of q planes' L window positions a partition, both passes
 * alike (in this order: SBUF places them as they come): the values (named
 * m), the indices, the positions, the predicate, a temporary and the
 * indices as i32. */
static void pool_window_tiles(poolc *c, const char *m, int64_t q)
{
    sk_k *s = c->s;
    c->M = sk_tile(s, m, NT_F32, 128, q * c->L);
    c->I = sk_tile(s, "pool.i", NT_F32, 128, q * c->L);
    c->B = sk_tile(s, "pool.pos", NT_F32, 128, q * c->L);
    c->Pr = sk_tile(s, "pool.pred", NT_F32, 128, q * c->L);
    c->T = sk_tile(s, "pool.t", NT_F32, 128, q * c->L);
    c->I32 = sk_tile(s, "pool.i32", NT_I32, 128, q * c->L);
}

static int max_pool2d_fwd_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    poolc c = {.s = s, .x = nt__tensor_data(r->in[0]), .y = nt__tensor_data(r->out[0]),
               .idx = nt__tensor_data(r->out[1])};
    nt__pool2d_geo(&c.g, r);
    const nt__pool2d *g = &c.g;
    c.Hp = nt__pool2d_ext(g, 0), c.Wp = nt__pool2d_ext(g, 1), c.L = g->OH * g->OW;
    c.mask = g->p[0] || g->p[1] || c.Hp > g->H || c.Wp > g->W;
    int64_t q = planes_per_part(g), pp = c.Hp * c.Wp;
    c.X = sk_tile(s, "pool.x", NT_F32, 128, q * pp);
    c.MSK = c.mask ? sk_tile(s, "pool.mask", NT_F32, 128, pp) : NULL;
    pool_window_tiles(&c, "pool.m", q);
    int rc = nt_sim_kernel_error(s->k);
    if (!rc && c.mask)
        rc = mask_plane(&c);
    for (int64_t pl0 = 0; pl0 < g->P && !rc;) {
        int64_t rem = g->P - pl0, qc = rem >= 128 ? (rem / 128 < q ? rem / 128 : q) : 1;
        int np = rem / qc < 128 ? (int)(rem / qc) : 128;
        rc = pool_group(&c, pl0, np, qc);
        pl0 += np * qc;
    }
    return rc;
}

int nt__sk_max_pool2d_fwd(const nt__rec *r)
{
    return sk_run_prog(r, NULL, max_pool2d_fwd_prog, NULL);
}

/* max_pool2d_bwd's planes pl0 .. pl0 + np q (X holds the padded dx, M g,
 * I the positions as f32, T the selected terms). */
static int bwd_group(poolc *c, int64_t pl0, int np, int64_t q)
{
    nt_sim_kernel *k = c->s->k;
    const nt__pool2d *g = &c->g;
    int64_t HW = g->H * g->W, pp = c->Hp * c->Wp;
    nt_ap xall = nt_tile_slice(c->X, 0, np, 0, q * pp);
    nt_ap gv = out_view(c, c->M, np, q), i = out_view(c, c->I, np, q);
    nt_ap i32 = out_view(c, c->I32, np, q), pos = out_view(c, c->B, np, q);
    nt_ap pr = out_view(c, c->Pr, np, q), t = out_view(c, c->T, np, q);
    nt_ap z = nt_tile_slice(c->Z, 0, np, 0, 1);
    z.ndim = 3, z.num[0] = q, z.num[1] = g->OH, z.num[2] = g->OW;
    z.step[0] = z.step[1] = z.step[2] = 0;
    nt_ap hg = nt_hbm_ap(c->g_in, NT_F32, pl0 * c->L, np, q * c->L, q * c->L);
    nt_ap hi = nt_hbm_ap(c->idx, NT_I32, pl0 * c->L, np, q * c->L, q * c->L);
    int rc = nt_isa_memset(k, &xall, 0.0, NT_ENGINE_GPSIMD);
    if (!rc)
        rc = nt_isa_dma_copy(k, &gv, &hg, sk_qin(c->s));
    if (!rc)
        rc = nt_isa_dma_copy(k, &i32, &hi, sk_qin(c->s));
    if (!rc)
        rc = nt_isa_tensor_copy(k, &i, &i32, NT_ENGINE_GPSIMD);
    for (int64_t a = g->k[0] - 1; a >= 0 && !rc; a--)
        for (int64_t b = g->k[1] - 1; b >= 0 && !rc; b--) {
            nt_ap v = slot_view(c, c->X, np, q, a, b, pp);
            nt_isa_affine e = {
                .offset = (int32_t)((a * g->d[0] - g->p[0]) * g->W + b * g->d[1] - g->p[1]),
                .step = {0, (int32_t)(g->s[0] * g->W), (int32_t)g->s[1]}};
            rc = nt_isa_iota(k, &pos, &e);
            if (!rc)
                rc = nt_isa_tensor_tensor(k, &pr, &i, &pos, NT_ALU_EQ, NT_ENGINE_VECTOR);
            if (!rc)
                rc = nt_isa_select(k, &t, &pr, &gv, &z, NT_ENGINE_VECTOR);
            if (!rc)
                rc = nt_isa_tensor_tensor(k, &v, &v, &t, NT_ALU_ADD, NT_ENGINE_VECTOR);
        }
    nt_ap dx = nt_tile_slice(c->X, 0, np, g->p[0] * c->Wp + g->p[1], 1);
    dx.ndim = 3;
    dx.num[0] = q, dx.num[1] = g->H, dx.num[2] = g->W;
    dx.step[0] = pp, dx.step[1] = c->Wp, dx.step[2] = 1;
    nt_ap hx = nt_hbm_ap(c->y, NT_F32, pl0 * HW, np, q * HW, q * HW);
    return rc ? rc : nt_isa_dma_copy(k, &hx, &dx, sk_qout(c->s));
}

static int max_pool2d_bwd_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    poolc c = {.s = s, .g_in = nt__tensor_data(r->in[0]), .idx = nt__tensor_data(r->in[1]),
               .y = nt__tensor_data(r->out[0])};
    nt__pool2d_geo(&c.g, r);
    const nt__pool2d *g = &c.g;
    c.Hp = nt__pool2d_ext(g, 0), c.Wp = nt__pool2d_ext(g, 1), c.L = g->OH * g->OW;
    int64_t q = planes_per_part(g), pp = c.Hp * c.Wp;
    c.X = sk_tile(s, "pool.dx", NT_F32, 128, q * pp);
    pool_window_tiles(&c, "pool.g", q);
    c.Z = sk_tile(s, "pool.zero", NT_F32, 128, 1);
    int rc = nt_sim_kernel_error(s->k);
    if (!rc) {
        nt_ap z = nt_tile_ap(c.Z);
        rc = nt_isa_memset(s->k, &z, 0.0, NT_ENGINE_VECTOR);
    }
    for (int64_t pl0 = 0; pl0 < g->P && !rc;) {
        int64_t rem = g->P - pl0, qc = rem >= 128 ? (rem / 128 < q ? rem / 128 : q) : 1;
        int np = rem / qc < 128 ? (int)(rem / qc) : 128;
        rc = bwd_group(&c, pl0, np, qc);
        pl0 += np * qc;
    }
    return rc;
}

int nt__sk_max_pool2d_bwd(const nt__rec *r)
{
    return sk_run_prog(r, NULL, max_pool2d_bwd_prog, NULL);
}
