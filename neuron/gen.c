/* neuron/gen.c - arange, rand and randn on the simulator.
 *
 * Generated tensors are produced on GpSimd by custom code (the engine that
 * runs C on the NeuronCore), tile by tile, and stored with DMA.  Element i
 * (row-major) is computed exactly as the CPU kernel computes it: arange in
 * double (start + i * step, rounded once), rand and randn from core/rng.h's
 * counter-based generators (so the same seed gives the same bits on every
 * backend, tiling and fusion). */
#include "neuron/sk.h"

#include <string.h>

#include "core/rng.h"

typedef struct gen gen;

/* A generator: its op, element row [i0, i0 + n) into row (dtype dt), and
 * its GpSimd cycles per element.  Each kernel entry point passes its own,
 * so no op is ever run by another's generator. */
typedef struct gen_def {
    int op;
    void (*row)(const gen *g, char *row, nt_dtype dt, int64_t i0, int64_t n);
    double cyc;
    bool strided; /* its 1-D output's elements o->stride[0] apart (arange) */
} gen_def;

struct gen {
    const gen_def *def;
    int64_t base, F;  /* element index of partition 0, elements per partition */
    double start, step;
    uint64_t key;
    int pbits;
};

static void row_arange(const gen *g, char *row, nt_dtype dt, int64_t i0, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        nt__store_f64(row, dt, j, g->start + (double)(i0 + j) * g->step);
}

static void row_rand(const gen *g, char *row, nt_dtype dt, int64_t i0, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        nt__store_f32(row, dt, j, nt__rng_uniform(g->key, (uint64_t)(i0 + j), g->pbits));
}

static void row_randn(const gen *g, char *row, nt_dtype dt, int64_t i0, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        nt__store_f64(row, dt, j, nt__rng_normal(g->key, (uint64_t)(i0 + j)));
}

static const gen_def gen_arange = {NT_OP_ARANGE, row_arange, 2.0, true};
static const gen_def gen_rand = {NT_OP_RAND, row_rand, 8.0, false};
static const gen_def gen_randn = {NT_OP_RANDN, row_randn, 40.0, false};

static int gen_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                  void *ctx, char *msg, size_t msglen)
{
    (void)src, (void)nsrc, (void)msg, (void)msglen;
    const gen *g = ctx;
    for (int p = 0; p < dst->np; p++)
        g->def->row(g, (char *)dst->data + p * dst->pstride, dst->dtype, g->base + p * g->F,
                    dst->n);
    return 0;
}

static int gen_kernel(const nt__rec *r, const gen_def *def)
{
    /* a table entry that points an op at another op's generator (core's
     * "never a silent default") */
    if (r->op != def->op)
        return nt__kerr(NT_ENOTSUP, "the simulator's %s generator cannot run %s",
                        nt__op_name(def->op), nt__op_api(r->op));
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
    int64_t st = def->strided ? o->stride[0] : 1;
    nt_tile *t[2] = {sk_tile(&s, "gen", dt, 128, F), sk_tile(&s, "gen", dt, 128, F)};
    char *ob = nt__tensor_data(o);
    int64_t rows = n / F, rem = n % F;
    int k = 0;
    for (int64_t r0 = 0; r0 < rows + (rem > 0) && !nt_sim_kernel_error(s.k); k++) {
        bool tail = r0 >= rows;
        int np = tail ? 1 : (int)(rows - r0 < 128 ? rows - r0 : 128);
        int64_t w = tail ? rem : F;
        gen g = {def, r0 * F, F, r->p.f[0], r->p.f[1], nt__rng_key(r->p.seed),
                 nt__rng_pbits(dt)};
        nt_ap d = nt_tile_slice(t[k & 1], 0, np, 0, w);
        nt_ap h = nt_hbm_ap(ob, dt, r0 * F * st, np, F * st, w);
        h.step[0] = st;
        if (nt_isa_gpsimd_custom(s.k, nt__op_name(r->op), &d, NULL, 0, def->cyc, gen_fn, &g) ||
            nt_isa_dma_copy(s.k, &h, &d, sk_qout(&s)))
            break;
        r0 += np;
    }
    return sk_end(&s);
}

int nt__sk_arange(const nt__rec *r) { return gen_kernel(r, &gen_arange); }
int nt__sk_rand(const nt__rec *r) { return gen_kernel(r, &gen_rand); }
int nt__sk_randn(const nt__rec *r) { return gen_kernel(r, &gen_randn); }
