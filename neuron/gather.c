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
 * The accumulator lives in SBUF, row v at partition v % 128 (V in blocks
 * when it does not fit); a GpSimd scatter-add walks the positions of each
 * [128, D] tile of g in order, so every row sees its additions in the CPU's
 * order. */
#include "neuron/sk.h"

#include <string.h>

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

/* idx positions p0 .. p0+np of a contiguous index array into t, checked */
static int load_idx(sk_k *s, const void *ib, nt_dtype dt, int64_t p0, int np, int64_t V,
                    nt_tile *t, nt_ap *out)
{
    *out = nt_tile_slice(t, 0, np, 0, 1);
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
    nt_tile *it = sk_tile(&s, "emb.idx", idt, 128, 1), *rows[2];
    for (int b = 0; b < 2; b++)
        rows[b] = sk_tile(&s, "emb.rows", wdt, 128, Dc);
    char *wb = nt__tensor_data(w), *ob = nt__tensor_data(o);
    int t = 0;
    for (int64_t p0 = 0; p0 < n && ib && !nt_sim_kernel_error(s.k); p0 += 128) {
        int np = (int)(n - p0 < 128 ? n - p0 : 128);
        nt_ap idx;
        if (load_idx(&s, ib, idt, p0, np, V, it, &idx))
            break;
        for (int64_t d0 = 0; d0 < D; d0 += Dc, t++) {
            int64_t dw = D - d0 < Dc ? D - d0 : Dc;
            nt_ap dst = nt_tile_slice(rows[t & 1], 0, np, 0, dw);
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

typedef struct scat {
    sk_k *s;
    int64_t base; /* position of the tile's first partition */
    int64_t V, v0, G, Dc, dw;
} scat;

/* dst: the accumulator [128, G * Dc] f32; src[0]: g [np, dw]; src[1]: idx [np, 1] */
static int scatter_add(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                       void *ctx, char *msg, size_t msglen)
{
    (void)nsrc;
    scat *c = ctx;
    const nt_gpsimd_operand *g = &src[0], *ix = &src[1];
    float tmp[2048];
    for (int q = 0; q < ix->np; q++) {
        int32_t v = ld_idx(ix, q);
        if (v < 0 || v >= c->V) {
            snprintf(msg, msglen, "idx[%lld] = %d is out of range [0, %lld)",
                     (long long)(c->base + q), v, (long long)c->V);
            return sk_data_error(c->s, NT_ERANGE, "%s", msg);
        }
        int64_t rel = v - c->v0;
        if (rel < 0 || rel >= 128 * c->G)
            continue;
        float *a = (float *)((char *)dst->data + (rel % 128) * dst->pstride) + (rel / 128) * c->Dc;
        const char *gr = (const char *)g->data + q * g->pstride;
        for (int64_t j0 = 0; j0 < c->dw; j0 += 2048) {
            int64_t m = c->dw - j0 < 2048 ? c->dw - j0 : 2048;
            nt__ld_f32(tmp, gr + j0 * (int64_t)nt__dtype_size(g->dtype), g->dtype, 1, m);
            for (int64_t j = 0; j < m; j++)
                a[j0 + j] += tmp[j];
        }
    }
    return 0;
}

int nt__sk_embedding_bwd(const nt__rec *r)
{
    const nt_tensor *g = r->in[0], *ix = r->in[1], *o = r->out[0];
    int64_t V = o->shape[0], D = o->shape[1], P = nt__numel(ix->ndim, ix->shape);
    if (V == 0 || D == 0)
        return 0;
    sk_k s;
    int rc = sk_begin(&s, "embedding_bwd");
    if (rc)
        return rc;
    nt_sim_kernel *k = s.k;
    nt_dtype gdt = (nt_dtype)g->dtype, idt = (nt_dtype)ix->dtype, odt = (nt_dtype)o->dtype;
    const char *gb = sk_contig_of(&s, g);
    const void *ib = sk_contig_of(&s, ix);
    int64_t Dc = D < 2048 ? D : 2048;
    int64_t G = 24576 / Dc, ng = (V + 127) / 128;
    if (G > ng)
        G = ng;
    nt_tile *acc = sk_tile(&s, "ebwd.acc", NT_F32, 128, G * Dc);
    nt_tile *yt = sk_tile(&s, "ebwd.y", odt, 128, G * Dc);
    nt_tile *gt = sk_tile(&s, "ebwd.g", gdt, 128, Dc), *it = sk_tile(&s, "ebwd.idx", idt, 128, 1);
    char *ob = nt__tensor_data(o);
    bool ok = gb && ib && !nt_sim_kernel_error(k);
    for (int64_t d0 = 0; d0 < D && ok; d0 += Dc) {
        int64_t dw = D - d0 < Dc ? D - d0 : Dc;
        for (int64_t v0 = 0; v0 < V && ok; v0 += 128 * G) {
            nt_ap A = nt_tile_ap(acc);
            ok = !nt_isa_memset(k, &A, 0.0, NT_ENGINE_VECTOR);
            for (int64_t p0 = 0; p0 < P && ok; p0 += 128) {
                int np = (int)(P - p0 < 128 ? P - p0 : 128);
                nt_ap gi = nt_tile_slice(gt, 0, np, 0, dw), ii = nt_tile_slice(it, 0, np, 0, 1);
                nt_ap hg = nt_hbm_ap(gb, gdt, p0 * D + d0, np, D, dw);
                nt_ap hi = nt_hbm_ap(ib, idt, p0, np, 1, 1);
                scat c = {&s, p0, V, v0, G, Dc, dw};
                const nt_ap *src[2] = {&gi, &ii};
                /* Its cost: 2 cycles for each element it adds (np rows of
                 * dw), all on one lane, since a row's additions keep the
                 * positions' order -- a bound no parallel schedule would
                 * exceed.  The instruction charges cycles_per_elem for each
                 * element of dst's free size (G * Dc), so per element of it
                 * that is 2 np dw / (G Dc).  (It was 2 dw per element of
                 * dst: quadratic in the width, 1.2M cycles a tile at
                 * D = 768 and 9.4M for 8 row blocks, where the adds are
                 * 197K.) */
                double cpe = 2.0 * (double)np * (double)dw / (double)(G * Dc);
                ok = !nt_isa_dma_copy(k, &gi, &hg, sk_qin(&s)) &&
                     !nt_isa_dma_copy(k, &ii, &hi, sk_qin(&s)) &&
                     !nt_isa_gpsimd_custom(k, "scatter_add", &A, src, 2, cpe, scatter_add, &c);
            }
            /* round once and store the block's rows */
            nt_ap Y = nt_tile_ap(yt);
            ok = ok && !nt_isa_tensor_copy(k, &Y, &A, NT_ENGINE_SCALAR);
            for (int64_t gi = 0; gi < G && ok; gi++) {
                int64_t r0 = v0 + gi * 128;
                if (r0 >= V)
                    break;
                int np = (int)(V - r0 < 128 ? V - r0 : 128);
                nt_ap src = nt_tile_slice(yt, 0, np, gi * Dc, dw);
                nt_ap out = nt_hbm_ap(ob, odt, r0 * D + d0, np, D, dw);
                ok = !nt_isa_dma_copy(k, &out, &src, sk_qout(&s));
            }
        }
    }
    return sk_end(&s);
}
