/* neuron/gather.c - embedding and its backward on the simulator.
 *
 * embedding: out[p, :] = weight[idx[p], :], rows copied bit for bit (as the
 * CPU's memcpy): positions go on partitions, 128 at a time; the indices are
 * DMA'd into SBUF, checked in position order by a GpSimd check (so a bad
 * index fails with the CPU's message, naming the first bad position), and
 * an indirect DMA (dma_gather) brings each partition its weight row.
 *
 * embedding_bwd: gw[V, D] = sum over positions p, in order, of g[p, :] added
 * into row idx[p], accumulated in f32 from +0 and rounded once (cpu/bwd.c).
 * The accumulator lives in SBUF transposed, feature d at partition d (D in
 * chunks of 128, V in blocks when it does not fit); a GpSimd scatter-add
 * walks the positions of each transposed [128, 128] tile of g in order on
 * every lane, so every element sees its additions in the CPU's order. */
#include "neuron/sk.h"

#include <string.h>

#define EMB_RING 8 /* embedding: groups of positions in flight */

typedef struct idx_check {
    sk_k *s;
    int64_t base, V;
} idx_check;

static int32_t ld_idx(const nt_gpsimd_operand *o, int p)
{
    const char *q = (const char *)o->data + p * o->pstride;
    return o->dtype == NT_U8 ? *(const uint8_t *)q : *(const int32_t *)q;
}

static int check_idx(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                     void *ctx, char *msg, size_t msglen)
{
    (void)dst, (void)nsrc;
    idx_check *c = ctx;
    for (int p = 0; p < src[0].np; p++) {
        int32_t v = ld_idx(&src[0], p);
        if (v < 0 || v >= c->V) {
            snprintf(msg, msglen, "idx[%lld] = %d is out of range [0, %lld)",
                     (long long)(c->base + p), v, (long long)c->V);
            return sk_data_error(c->s, NT_ERANGE, "%s", msg);
        }
    }
    return 0;
}

/* idx positions p0 .. p0+np of a contiguous index array into column col
 * of t, checked */
static int load_idx(sk_k *s, const void *ib, nt_dtype dt, int64_t p0, int np, int64_t V,
                    nt_tile *t, int64_t col, nt_ap *out)
{
    *out = nt_tile_slice(t, 0, np, col, 1);
    nt_ap h = nt_hbm_ap(ib, dt, p0, np, 1, 1);
    int rc = nt_isa_dma_copy(s->k, out, &h, sk_qin(s));
    idx_check c = {s, p0, V};
    const nt_ap *src[1] = {out};
    return rc ? rc : nt_isa_gpsimd_custom(s->k, "check_idx", NULL, src, 1, 1.0, check_idx, &c);
}

int nt__sk_embedding(const nt__rec *r)
{
    const nt_tensor *w = r->in[0], *ix = r->in[1], *o = r->out[0];
    int64_t V = w->shape[0], D = w->shape[1], n = nt__numel(ix->ndim, ix->shape);
    if (n == 0 || D == 0)
        return 0;
    sk_k s;
    int rc = sk_begin(&s, "embedding");
    if (rc)
        return rc;
    nt_dtype wdt = (nt_dtype)w->dtype, idt = (nt_dtype)ix->dtype;
    const void *ib = sk_contig_of(&s, ix);
    int64_t Dc = D < 8192 ? D : 8192;
    /* EMB_RING index columns 64 bytes apart (the unit of on-chip
     * dependencies) and EMB_RING row tiles when they take 64 KiB a
     * partition or less (else two): a group's index load waited for the
     * group before it to have gathered with the one index tile (an index
     * load, its check, the gather and the store, ~6.5 us, a chain per
     * group: 72 us for the char GPT's 2048 positions; 4 in flight 27 us,
     * 8 about 20) */
    int64_t icol = 64 / (int64_t)nt__dtype_size(idt);
    int nrow = Dc * (int64_t)nt__dtype_size(wdt) * EMB_RING <= 64 * 1024 ? EMB_RING : 2;
    nt_tile *it = sk_tile(&s, "emb.idx", idt, 128, EMB_RING * icol), *rows[EMB_RING];
    for (int b = 0; b < nrow; b++)
        rows[b] = sk_tile(&s, "emb.rows", wdt, 128, Dc);
    char *wb = nt__tensor_data(w), *ob = nt__tensor_data(o);
    int t = 0, g = 0;
    for (int64_t p0 = 0; p0 < n && ib && !nt_sim_kernel_error(s.k); p0 += 128, g++) {
        int np = (int)(n - p0 < 128 ? n - p0 : 128);
        nt_ap idx;
        if (load_idx(&s, ib, idt, p0, np, V, it, (g % EMB_RING) * icol, &idx))
            break;
        for (int64_t d0 = 0; d0 < D; d0 += Dc, t++) {
            int64_t dw = D - d0 < Dc ? D - d0 : Dc;
            nt_ap dst = nt_tile_slice(rows[t % nrow], 0, np, 0, dw);
            nt_ap src;
            memset(&src, 0, sizeof src);
            src.hbm = wb;
            src.dtype = wdt;
            src.np = (int32_t)V;
            src.pstep = w->stride[0];
            src.offset = d0 * w->stride[1];
            src.ndim = 1;
            src.num[0] = dw;
            src.step[0] = w->stride[1];
            nt_ap out = nt_hbm_ap(ob, wdt, p0 * D + d0, np, D, dw);
            if (nt_isa_dma_gather(s.k, &dst, &src, &idx, sk_qin(&s)) ||
                nt_isa_dma_copy(s.k, &out, &dst, sk_qout(&s)))
                break;
        }
    }
    return sk_end(&s);
}

/* ---------------- embedding_bwd ---------------- */

/* The accumulator is held transposed, accT[d, v] (feature d of the chunk on
 * partition d, row v of the block on the free axis): a position p adds
 * g[p, d] into accT[d, idx[p]] on every lane at once, each lane walking the
 * positions in order, so every element sees its additions in the CPU's
 * order.  With rows on partitions (row v at partition v % 128) a position
 * touched one lane, and the cost bound had to put all of a tile's positions
 * on one lane (2 cycles x 128 positions x the width: 414 us of the char
 * GPT's step for its 2048 x 128 gradient).  g's tiles reach that layout by
 * nc_transpose (bits moved), and the block back by nc_transpose before its
 * one rounding copy. */
typedef struct scat {
    sk_k *s;
    int64_t base; /* position of the tile's first column */
    int64_t V, v0, vb;
} scat;

/* dst: accT [dw, vb] f32; src[0]: gT [dw, np] f32; src[1]: idx [dw, np],
 * each lane a copy of the tile's indices */
static int scatter_add(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                       void *ctx, char *msg, size_t msglen)
{
    (void)nsrc;
    scat *c = ctx;
    const nt_gpsimd_operand *g = &src[0], *ix = &src[1];
    for (int64_t q = 0; q < g->n; q++) {
        int32_t v = ix->dtype == NT_U8 ? ((const uint8_t *)ix->data)[q]
                                       : ((const int32_t *)ix->data)[q];
        if (v < 0 || v >= c->V) {
            snprintf(msg, msglen, "idx[%lld] = %d is out of range [0, %lld)",
                     (long long)(c->base + q), v, (long long)c->V);
            return sk_data_error(c->s, NT_ERANGE, "%s", msg);
        }
        int64_t rel = v - c->v0;
        if (rel < 0 || rel >= c->vb)
            continue;
        for (int d = 0; d < g->np; d++) {
            float *a = (float *)((char *)dst->data + d * dst->pstride) + rel;
            *a += ((const float *)((const char *)g->data + d * g->pstride))[q];
        }
    }
    return 0;
}

typedef struct ebwd {
    sk_k s;
    nt_tile *graw[2], *gf[2], *it[2], *gT[2], *tp[2], *yt[2], *acc;
    int t;
} ebwd;

/* Positions p0 .. p0+np of g's columns d0 .. d0+dw into accT: g's tile
 * loaded (widened to f32 on chip when it is not f32), transposed, and the
 * tile's indices on every lane; one scatter-add. */
static int ebwd_tile(ebwd *e, const char *gb, nt_dtype gdt, int64_t D, const void *ib,
                     nt_dtype idt, int64_t p0, int np, int64_t d0, int dw, scat *c)
{
    nt_sim_kernel *k = e->s.k;
    int b = e->t++ & 1;
    nt_ap gr = nt_tile_slice(e->graw[b], 0, np, 0, dw);
    nt_ap hg = nt_hbm_ap(gb, gdt, p0 * D + d0, np, D, dw);
    nt_ap ii = nt_tile_slice(e->it[b], 0, dw, 0, np);
    nt_ap hi = nt_hbm_ap(ib, idt, p0, dw, 0, np); /* the same row on every lane */
    nt_ap tp = nt_tile_slice(e->tp[b], 0, dw, 0, np);
    nt_ap gT = nt_tile_slice(e->gT[b], 0, dw, 0, np);
    nt_ap A = nt_tile_slice(e->acc, 0, dw, 0, c->vb);
    int rc = nt_isa_dma_copy(k, &gr, &hg, sk_qin(&e->s));
    if (!rc && gdt != NT_F32) {
        nt_ap gf = nt_tile_slice(e->gf[b], 0, np, 0, dw);
        rc = nt_isa_tensor_copy(k, &gf, &gr, NT_ENGINE_VECTOR);
        gr = gf;
    }
    if (!rc)
        rc = nt_isa_dma_copy(k, &ii, &hi, sk_qin(&e->s));
    if (!rc)
        rc = nt_isa_nc_transpose(k, &tp, &gr);
    if (!rc)
        rc = nt_isa_tensor_copy(k, &gT, &tp, NT_ENGINE_SCALAR);
    /* every lane adds np elements, 2 cycles each, in parallel; charged per
     * element of dst's free size (vb) */
    const nt_ap *src[2] = {&gT, &ii};
    return rc ? rc
              : nt_isa_gpsimd_custom(k, "scatter_add", &A, src, 2,
                                     2.0 * (double)np / (double)c->vb, scatter_add, c);
}

/* accT's rows v0 .. v0+vb (features d0 .. d0+dw) transposed back, rounded
 * once to the output's dtype and stored, 128 rows at a time. */
static int ebwd_store(ebwd *e, char *ob, nt_dtype odt, int64_t D, int64_t v0, int64_t vb,
                      int64_t d0, int dw)
{
    nt_sim_kernel *k = e->s.k;
    int rc = 0;
    for (int64_t r = 0; r < vb && !rc; r += 128) {
        int nv = (int)(vb - r < 128 ? vb - r : 128), b = e->t++ & 1;
        nt_ap src = nt_tile_slice(e->acc, 0, dw, r, nv);
        nt_ap tp = nt_tile_slice(e->tp[b], 0, nv, 0, dw);
        nt_ap y = nt_tile_slice(e->yt[b], 0, nv, 0, dw);
        nt_ap out = nt_hbm_ap(ob, odt, (v0 + r) * D + d0, nv, D, dw);
        if (!(rc = nt_isa_nc_transpose(k, &tp, &src)) &&
            !(rc = nt_isa_tensor_copy(k, &y, &tp, NT_ENGINE_SCALAR)))
            rc = nt_isa_dma_copy(k, &out, &y, sk_qout(&e->s));
    }
    return rc;
}

int nt__sk_embedding_bwd(const nt__rec *r)
{
    const nt_tensor *g = r->in[0], *ix = r->in[1], *o = r->out[0];
    int64_t V = o->shape[0], D = o->shape[1], P = nt__numel(ix->ndim, ix->shape);
    if (V == 0 || D == 0)
        return 0;
    ebwd e;
    memset(&e, 0, sizeof e);
    int rc = sk_begin(&e.s, "embedding_bwd");
    if (rc)
        return rc;
    sk_k *s = &e.s;
    nt_dtype gdt = (nt_dtype)g->dtype, idt = (nt_dtype)ix->dtype, odt = (nt_dtype)o->dtype;
    const char *gb = sk_contig_of(s, g);
    const void *ib = sk_contig_of(s, ix);
    /* rows of a block: 96 KiB of f32 per partition */
    int64_t Vb = V < 24576 ? V : 24576;
    e.acc = sk_tile(s, "ebwd.accT", NT_F32, 128, Vb);
    for (int b = 0; b < 2; b++) {
        e.graw[b] = sk_tile(s, "ebwd.g", gdt, 128, 128);
        e.gf[b] = gdt != NT_F32 ? sk_tile(s, "ebwd.gf", NT_F32, 128, 128) : NULL;
        e.it[b] = sk_tile(s, "ebwd.idx", idt, 128, 128);
        e.gT[b] = sk_tile(s, "ebwd.gT", NT_F32, 128, 128);
        e.yt[b] = sk_tile(s, "ebwd.y", odt, 128, 128);
        e.tp[b] = nt_tile_alloc(s->k, "ebwd.tr", NT_MEM_PSUM, NT_F32, 128, 128);
    }
    char *ob = nt__tensor_data(o);
    rc = gb && ib ? nt_sim_kernel_error(s->k) : NT_EHOSTMEM;
    for (int64_t d0 = 0; d0 < D && !rc; d0 += 128) {
        int dw = (int)(D - d0 < 128 ? D - d0 : 128);
        for (int64_t v0 = 0; v0 < V && !rc; v0 += Vb) {
            int64_t vb = V - v0 < Vb ? V - v0 : Vb;
            nt_ap A = nt_tile_slice(e.acc, 0, dw, 0, vb);
            rc = nt_isa_memset(s->k, &A, 0.0, NT_ENGINE_VECTOR);
            for (int64_t p0 = 0; p0 < P && !rc; p0 += 128) {
                int np = (int)(P - p0 < 128 ? P - p0 : 128);
                scat c = {s, p0, V, v0, vb};
                rc = ebwd_tile(&e, gb, gdt, D, ib, idt, p0, np, d0, dw, &c);
            }
            if (!rc)
                rc = ebwd_store(&e, ob, odt, D, v0, vb, d0, dw);
        }
    }
    return sk_end(s);
}
