/* neuron/rope.c - rotary position embedding (op ROPE) as one tile program:
 * the CPU kernel's arithmetic (cpu/rope.c, core/rope.h) on the NeuronCore.
 *
 * x and y contiguous [N, T, D].  The offset goes to a [128, 1] i32 tile
 * (memset to the parameter, or DMA'd from the offset tensor at partition
 * step 0); the cos/sin table comes from one GpSimd custom operator (the
 * runtime's custom C code, as sin and cos are: the NKI ISA's sin takes only
 * [-pi, pi], and the exact argument reduction needs integer products no ALU
 * operator gives) running nt__rope_table from that tile: the CPU's table,
 * bit for bit.  Then per tile, with the table read at step 0 along the
 * dims it does not depend on: A = x1 * c, B = x2 * s, y1 = A - B on VectorE,
 * A' = x2 * c, B' = x1 * s, y2 = A' + B' on GpSimd (f32 temporaries: each
 * product rounded once as the CPU's; y rounded once to its dtype).  x1, x2
 * are strided patterns of the loaded tile (step 1 from 0 and dims/2, or
 * step 2 from 0 and 1 interleaved).  The features dims .. D-1 are stored
 * from the loaded tile by DMA, bit for bit.  x and y tiles are
 * double-buffered so the next load overlaps this tile's compute.  Two
 * layouts:
 *   - chunks (short sequences, rope_chunk_k): the N * T rows in chunks of
 *     k consecutive positions, k D contiguous elements (one descriptor run
 *     of at least 512 B of f32 where T allows), chunk g on partition
 *     g % 128; with C = T / k dividing 128, partition p always holds
 *     positions (p % C) k .. + k - 1, so one [128, k dims] table serves
 *     the kernel.  [16, 4, 64, 32] f32: 11.7 us simulated (22.8 with the
 *     position layout's 128 B runs);
 *   - positions (otherwise): a block of up to 128 positions on partitions
 *     with its [128, dims] table, the rows of up to 4096 / D consecutive n
 *     along the free dims ([np, nn, D], one strided DMA). */
#include "neuron/sk.h"

#include <string.h>

#include "core/rope.h"

#define RF 4096 /* free elements of x per tile (nn * D) */
#define ROPE_ENG2 NT_ENGINE_GPSIMD /* the y2 chain's engine: VectorE does y1's */
#define ROPE_TILES 4 /* the chunk layout's tiles, at least: loads overlap compute */

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

/* The GpSimd operator's context: partition p's k table rows, of positions
 * off + q + j (j < k), q = t0 + p (the position layout, k = 1) or (p % C) * k
 * (the chunk layout). */
typedef struct rope_tab {
    sk_k *s;
    int64_t t0, k, C, T, dims;
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
        nt__rope_table((float *)((char *)dst->data + p * dst->pstride), off,
                       c->C ? (p % c->C) * c->k : c->t0 + p, c->k, c->dims, c->base, c->scale,
                       c->inverse);
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
    const nt_engine V = NT_ENGINE_VECTOR, V2 = ROPE_ENG2;
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[0], &x1, &cc, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[1], &x2, &ss, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &y1, &T[0], &T[1], NT_ALU_SUB, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[2], &x2, &cc, NT_ALU_MUL, V2);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &T[3], &x1, &ss, NT_ALU_MUL, V2);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &y2, &T[2], &T[3], NT_ALU_ADD, V2);
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

/* The offset on every partition: the parameter, or the tensor's value. */
static int rope_offset(rope_k *c)
{
    nt_ap off = nt_tile_slice(c->off, 0, 128, 0, 1);
    if (!c->r->in[1])
        return nt_isa_memset(c->s->k, &off, (double)c->r->p.i[1], NT_ENGINE_GPSIMD);
    nt_ap h = nt_hbm_ap(nt__tensor_data(c->r->in[1]), NT_I32, 0, 128, 0, 1);
    return nt_isa_dma_copy(c->s->k, &off, &h, sk_qin(c->s));
}

/* The position layout: every block of positions, its table, then its groups. */
static int rope_all(rope_k *c)
{
    nt_sim_kernel *k = c->s->k;
    const nt__rec *r = c->r;
    int rc = 0;
    for (int64_t t0 = 0; t0 < c->T && !rc; t0 += 128) {
        int np = (int)(c->T - t0 < 128 ? c->T - t0 : 128);
        rope_tab tab = {c->s, t0, 1, 0, c->T, c->dims, r->p.f[0], r->p.f[1],
                        (r->p.flag & NT__ROPE_INVERSE) != 0};
        nt_ap cs = nt_tile_slice(c->cs, 0, np, 0, c->dims), o1 = nt_tile_slice(c->off, 0, np, 0, 1);
        const nt_ap *src[1] = {&o1};
        rc = nt_isa_gpsimd_custom(k, "rope.table", &cs, src, 1, 24.0, rope_tab_fn, &tab);
        for (int64_t n0 = 0; n0 < c->N && !rc; n0 += c->nn)
            rc = rope_group(c, n0, c->N - n0 < c->nn ? c->N - n0 : c->nn, t0, np);
    }
    return rc;
}

/* [np, a, b, n] of tile t from f0 with steps sa, sb, sn */
static nt_ap pat3(const nt_tile *t, int np, int64_t f0, int64_t a, int64_t sa, int64_t b,
                  int64_t sb, int64_t n, int64_t sn)
{
    nt_ap x = pat(t, np, f0, a, sa, b, sb);
    x.ndim = 3;
    x.num[2] = n, x.step[2] = sn;
    return x;
}

/* HBM [np, mm, k, n] of chunks g0 + j * 128 + p (k rows of D each) from
 * feature f0 of base */
static nt_ap hpat3(const rope_k *c, char *base, int64_t g0, int np, int64_t mm, int64_t k,
                   int64_t f0, int64_t n)
{
    int64_t KD = k * c->D;
    nt_ap a = nt_hbm_ap(base, c->dt, g0 * KD + f0, np, KD, 1);
    a.ndim = 3;
    a.num[0] = mm, a.step[0] = 128 * KD;
    a.num[1] = k, a.step[1] = c->D;
    a.num[2] = n, a.step[2] = 1;
    return a;
}

/* The chunk layout's tile: chunks g0 + j * 128 + p, j < mm, p < np. */
static int rope_chunks(rope_k *c, int64_t g0, int np, int64_t mm, int64_t k)
{
    nt_sim_kernel *K = c->s->k;
    int b = c->b++ & 1;
    int64_t D = c->D, h = c->h, KD = k * D, i2 = c->il ? 1 : h, st = c->il ? 2 : 1;
    nt_ap xt = nt_tile_slice(c->xt[b], 0, np, 0, mm * KD);
    nt_ap hx = hpat3(c, c->xb, g0, np, mm, k, 0, D);
    int rc = nt_isa_dma_copy(K, &xt, &hx, sk_qin(c->s));
    nt_ap x1 = pat3(c->xt[b], np, 0, mm, KD, k, D, h, st);
    nt_ap x2 = pat3(c->xt[b], np, i2, mm, KD, k, D, h, st);
    nt_ap y1 = pat3(c->yt[b], np, 0, mm, KD, k, D, h, st);
    nt_ap y2 = pat3(c->yt[b], np, i2, mm, KD, k, D, h, st);
    nt_ap cc = pat3(c->cs, np, 0, mm, 0, k, c->dims, h, 1);
    nt_ap ss = pat3(c->cs, np, h, mm, 0, k, c->dims, h, 1);
    nt_ap T[4];
    for (int i = 0; i < 4; i++)
        T[i] = pat3(c->tf[i], np, 0, mm, k * h, k, h, h, 1);
    const nt_engine V = NT_ENGINE_VECTOR, V2 = ROPE_ENG2;
    if (!rc)
        rc = nt_isa_tensor_tensor(K, &T[0], &x1, &cc, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(K, &T[1], &x2, &ss, NT_ALU_MUL, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(K, &y1, &T[0], &T[1], NT_ALU_SUB, V);
    if (!rc)
        rc = nt_isa_tensor_tensor(K, &T[2], &x2, &cc, NT_ALU_MUL, V2);
    if (!rc)
        rc = nt_isa_tensor_tensor(K, &T[3], &x1, &ss, NT_ALU_MUL, V2);
    if (!rc)
        rc = nt_isa_tensor_tensor(K, &y2, &T[2], &T[3], NT_ALU_ADD, V2);
    nt_ap yr = pat3(c->yt[b], np, 0, mm, KD, k, D, c->dims, 1);
    nt_ap hy = hpat3(c, c->yb, g0, np, mm, k, 0, c->dims);
    if (!rc)
        rc = nt_isa_dma_copy(K, &hy, &yr, sk_qout(c->s));
    if (!rc && c->dims < D) { /* the features passed through, bit for bit */
        nt_ap xp = pat3(c->xt[b], np, c->dims, mm, KD, k, D, D - c->dims, 1);
        nt_ap hp = hpat3(c, c->yb, g0, np, mm, k, c->dims, D - c->dims);
        rc = nt_isa_dma_copy(K, &hp, &xp, sk_qout(c->s));
    }
    return rc;
}

/* The chunk layout, for short sequences: the N * T rows in chunks of k
 * consecutive positions (k D contiguous elements, one run per descriptor),
 * chunk g on partition g % 128, C = T / k chunks a sequence with C | 128, so
 * partition p always holds positions (p % C) k .. (p % C) k + k - 1: one
 * table [128, k dims] for the whole kernel, read at step 0 along the chunks
 * a partition takes.  k: the smallest with runs of at least 128 elements
 * (512 B of f32), or T.  0: the layout does not apply (T has no such
 * split, the table would be over 512 elements a partition, or it would use
 * fewer partitions than the position layout). */
static int64_t rope_chunk_k(int64_t N, int64_t T, int64_t D, int64_t dims)
{
    for (int64_t C = 128; C >= 1; C /= 2) {
        int64_t k = T / C;
        if (T % C || (k * D < 128 && C > 1))
            continue;
        bool ok = k * dims <= 512 && k * D <= RF && N * C >= (T < 128 ? T : 128);
        return ok ? k : 0;
    }
    return 0;
}

static int rope_chunked(rope_k *c, int64_t k)
{
    const nt__rec *r = c->r;
    int64_t G = c->N * (c->T / k), m = RF / (k * c->D);
    rope_tab tab = {c->s, 0, k, c->T / k, c->T, c->dims, r->p.f[0], r->p.f[1],
                    (r->p.flag & NT__ROPE_INVERSE) != 0};
    nt_ap cs = nt_tile_slice(c->cs, 0, 128, 0, k * c->dims);
    nt_ap o1 = nt_tile_slice(c->off, 0, 128, 0, 1);
    const nt_ap *src[1] = {&o1};
    int rc = nt_isa_gpsimd_custom(c->s->k, "rope.table", &cs, src, 1, 24.0, rope_tab_fn, &tab);
    for (int64_t g0 = 0; g0 < G && !rc;) {
        int np = G - g0 >= 128 ? 128 : (int)(G - g0);
        int64_t mm = G - g0 >= 128 ? (G - g0) / 128 : 1;
        if (mm > m)
            mm = m;
        int64_t cap = (G / 128 + ROPE_TILES - 1) / ROPE_TILES; /* a few tiles: loads overlap */
        if (mm > cap && cap >= 1)
            mm = cap;
        rc = rope_chunks(c, g0, np, mm, k);
        g0 += np * mm;
    }
    return rc;
}

/* The widest D the kernel's tiles take (wider: the CPU runs it). */
bool nt__sk_rope_fits(const nt__params *p) { return p->i[2] <= RF; }

static int rope_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    rope_k *c = ctx;
    const nt_tensor *x = r->in[0], *o = r->out[0];
    c->s = s, c->r = r;
    c->dt = (nt_dtype)x->dtype;
    c->xb = nt__tensor_data(x), c->yb = nt__tensor_data(o);
    c->dims = r->p.i[0], c->h = c->dims / 2, c->il = (r->p.flag & NT__ROPE_INTERLEAVED) != 0;
    c->nn = RF / c->D;
    if (c->nn > c->N)
        c->nn = c->N;
    int64_t k = rope_chunk_k(c->N, c->T, c->D, c->dims);
    c->off = sk_tile(s, "rope.offset", NT_I32, 128, 1);
    c->cs = sk_tile(s, "rope.cossin", NT_F32, 128, k ? k * c->dims : c->dims);
    for (int b = 0; b < 2; b++) {
        c->xt[b] = sk_tile(s, "rope.x", c->dt, 128, RF);
        c->yt[b] = sk_tile(s, "rope.y", c->dt, 128, RF);
    }
    for (int i = 0; i < 4; i++)
        c->tf[i] = sk_tile(s, "rope.t", NT_F32, 128, RF / 2);
    if (!nt_sim_kernel_error(s->k) && !rope_offset(c))
        k ? rope_chunked(c, k) : rope_all(c);
    return 0;
}

int nt__sk_rope(const nt__rec *r)
{
    const nt_tensor *x = r->in[0];
    rope_k c;
    memset(&c, 0, sizeof c);
    int nd = x->ndim;
    c.D = x->shape[nd - 1], c.T = x->shape[nd - 2], c.N = nt__numel(nd - 2, x->shape);
    if (c.N * c.T * c.D == 0)
        return 0;
    if (c.D > RF)
        return nt__kerr(NT_ENOTSUP, "nt_rope on the simulator: D = %lld is over %d",
                        (long long)c.D, RF);
    return sk_run_prog(r, NULL, rope_prog, &c);
}
