/* sim/kernels/gen.c - arange, rand and randn on the simulator.
 *
 * Generated tensors are produced on GpSimd by custom code (the engine that
 * runs C on the NeuronCore), tile by tile, and stored with DMA.  Element i
 * (row-major) is computed exactly as the CPU kernel computes it: arange in
 * double (start + i * step, rounded once), rand and randn from core/rng.h's
 * counter-based generators (so the same seed gives the same bits on every
 * backend, tiling and fusion). */
#include "sim/kernels/sk.h"

#include <string.h>

#include "core/rng.h"

typedef struct gen {
    int op;
    int64_t base, F;  /* element index of partition 0, elements per partition */
    double start, step;
    uint64_t key;
    int pbits;
} gen;

static int gen_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                  void *ctx, char *msg, size_t msglen)
{
    (void)src, (void)nsrc, (void)msg, (void)msglen;
    const gen *g = ctx;
    for (int p = 0; p < dst->np; p++) {
        char *row = (char *)dst->data + p * dst->pstride;
        int64_t i0 = g->base + p * g->F;
        switch (g->op) {
        case NT_OP_ARANGE:
            for (int64_t j = 0; j < dst->n; j++)
                nt__store_f64(row, dst->dtype, j, g->start + (double)(i0 + j) * g->step);
            break;
        case NT_OP_RAND:
            for (int64_t j = 0; j < dst->n; j++)
                nt__store_f32(row, dst->dtype, j,
                              nt__rng_uniform(g->key, (uint64_t)(i0 + j), g->pbits));
            break;
        default:
            for (int64_t j = 0; j < dst->n; j++)
                nt__store_f64(row, dst->dtype, j, nt__rng_normal(g->key, (uint64_t)(i0 + j)));
            break;
        }
    }
    return 0;
}

static int gen_kernel(const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    int64_t n = nt__numel(o->ndim, o->shape);
    if (n == 0)
        return 0;
    nt_dtype dt = (nt_dtype)o->dtype;
    sk_k s;
    int rc = sk_begin(&s, nt__op_name(r->op));
    if (rc)
        return rc;
    int64_t F = (n + 127) / 128;
    if (F > 2048)
        F = 2048;
    int64_t st = r->op == NT_OP_ARANGE ? o->stride[0] : 1;
    nt_tile *t[2] = {sk_tile(&s, "gen", dt, 128, F), sk_tile(&s, "gen", dt, 128, F)};
    double cyc = r->op == NT_OP_ARANGE ? 2.0 : r->op == NT_OP_RAND ? 8.0 : 40.0;
    char *ob = nt__tensor_data(o);
    int64_t rows = n / F, rem = n % F;
    int k = 0;
    for (int64_t r0 = 0; r0 < rows + (rem > 0) && !nt_sim_kernel_error(s.k); k++) {
        bool tail = r0 >= rows;
        int np = tail ? 1 : (int)(rows - r0 < 128 ? rows - r0 : 128);
        int64_t w = tail ? rem : F;
        gen g = {r->op, r0 * F, F, r->p.f[0], r->p.f[1], nt__rng_key(r->p.seed),
                 nt__rng_pbits(dt)};
        nt_ap d = nt_tile_slice(t[k & 1], 0, np, 0, w);
        nt_ap h = nt_hbm_ap(ob, dt, r0 * F * st, np, F * st, w);
        h.step[0] = st;
        if (nt_isa_gpsimd_custom(s.k, nt__op_name(r->op), &d, NULL, 0, cyc, gen_fn, &g) ||
            nt_isa_dma_copy(s.k, &h, &d, sk_qout(&s)))
            break;
        r0 += np;
    }
    return sk_end(&s);
}

int nt__sk_arange(const nt__rec *r) { return gen_kernel(r); }
int nt__sk_rand(const nt__rec *r) { return gen_kernel(r); }
int nt__sk_randn(const nt__rec *r) { return gen_kernel(r); }
