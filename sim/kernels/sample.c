/* sim/kernels/sample.c - dropout, topk and multinomial on the simulator.
 *
 * Like arange and rand (gen.c), these run as custom code on GpSimd (the
 * engine that runs C on the NeuronCore), over tiles that DMA brings into
 * SBUF and takes out, computing each element with core/sample.h exactly as
 * the CPU kernels (cpu/sample.c) do. */
#include "sim/kernels/sk.h"

#include <string.h>

#include "core/sample.h"

/* ---------------- dropout ---------------- */

typedef struct drop_ctx {
    int64_t base, F; /* element index of partition 0, elements per partition */
    uint64_t key;
    double p;
    float scale;
} drop_ctx;

static int drop_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                   void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    const drop_ctx *c = ctx;
    for (int q = 0; q < dst->np; q++) {
        const char *x = (const char *)src[0].data + q * src[0].pstride;
        char *y = (char *)dst->data + q * dst->pstride;
        int64_t i0 = c->base + q * c->F;
        for (int64_t j = 0; j < dst->n; j++)
            nt__store_f32(y, dst->dtype, j,
                          nt__load_f32(x, src[0].dtype, j) *
                              nt__dropout_mul(c->key, (uint64_t)(i0 + j), c->p, c->scale));
    }
    return 0;
}

/* x (made contiguous) in [np, F] tiles of the row-major order; element
 * (q, j) of a tile is element base + q * F + j. */
int nt__sk_dropout(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    int64_t n = nt__numel(o->ndim, o->shape);
    if (n == 0)
        return 0;
    nt_dtype xdt = (nt_dtype)x->dtype, odt = (nt_dtype)o->dtype;
    sk_k s;
    int rc = sk_begin(&s, "dropout");
    if (rc)
        return rc;
    const char *xb = sk_contig_of(&s, x);
    int64_t F = (n + 127) / 128;
    if (F > 2048)
        F = 2048;
    nt_tile *tx[2] = {sk_tile(&s, "drop.x", xdt, 128, F), sk_tile(&s, "drop.x", xdt, 128, F)};
    nt_tile *ty[2] = {sk_tile(&s, "drop.y", odt, 128, F), sk_tile(&s, "drop.y", odt, 128, F)};
    char *ob = nt__tensor_data(o);
    int64_t rows = n / F, rem = n % F;
    int k = 0;
    for (int64_t r0 = 0; xb && r0 < rows + (rem > 0) && !nt_sim_kernel_error(s.k); k++) {
        bool tail = r0 >= rows;
        int np = tail ? 1 : (int)(rows - r0 < 128 ? rows - r0 : 128);
        int64_t w = tail ? rem : F;
        drop_ctx c = {r0 * F, F, nt__rng_key(r->p.seed), r->p.f[0],
                      nt__dropout_scale(r->p.f[0])};
        nt_ap xs = nt_tile_slice(tx[k & 1], 0, np, 0, w), ys = nt_tile_slice(ty[k & 1], 0, np, 0, w);
        nt_ap hx = nt_hbm_ap((char *)xb, xdt, r0 * F, np, F, w);
        nt_ap hy = nt_hbm_ap(ob, odt, r0 * F, np, F, w);
        const nt_ap *srcs[1] = {&xs};
        if (nt_isa_dma_copy(s.k, &xs, &hx, sk_qin(&s)) ||
            nt_isa_gpsimd_custom(s.k, "dropout", &ys, srcs, 1, 8.0, drop_fn, &c) ||
            nt_isa_dma_copy(s.k, &hy, &ys, sk_qout(&s)))
            break;
        r0 += np;
    }
    return sk_end(&s);
}
