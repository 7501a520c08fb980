/* neuron/index.c - gather, index_select and index_add on the simulator.
 *
 * The CPU's contract (cpu/index.c): every index is checked first, in idx's
 * row-major order; elements are copied bit for bit; index_add adds g's
 * elements, in g's row-major order, into an f32 accumulator from +0 and
 * rounds once.
 *
 * Positions (of the output, or of g) go in rounds of [np, w] tiles: position
 * p0 + q * w + j at partition q, column j.  index_select's 1-D index is read
 * through a broadcast view of the output's shape (stride 0 except along
 * dim), copied contiguous, so both ops see one index per position.
 *
 * gather: a GpSimd operator turns each position's index into the flat
 * element offset of its source in x (x's strides), and one indirect DMA per
 * column (dma_gather, rows of one element) brings each partition its
 * element; the [np, w] block is then stored with one DMA.
 * index_add: like embedding_bwd, the output's elements are taken in blocks
 * held in SBUF as f32 [128, F] (element e0 + q * F + j at partition q,
 * column j); a GpSimd scatter-add walks each tile of positions in order and
 * adds the ones that land in the block; the block is rounded once
 * (tensor_copy) and stored.
 * scatter / scatter_add use the same kernel: the block starts as t's
 * elements (DMA; an add widens them to f32 with tensor_copy), scatter_add's
 * GpSimd adds alpha * g, scatter's copies each element's bytes into a block
 * held in the result's dtype (stored without rounding). */
#include "neuron/sk.h"

#include <string.h>

#define W 64       /* positions per partition per round */
#define FB 4096    /* index_add: accumulator elements per partition */

typedef struct ixk {
    sk_k *s;
    int dim, nd;
    int64_t shape[NT_MAX_DIMS]; /* positions' shape */
    int64_t st[NT_MAX_DIMS];    /* element strides of the target (x, or gx) */
    int64_t V;                  /* bound of an index */
    int64_t base, w;            /* the round: first position, columns */
    int64_t e0, ne, F;          /* index_add: the block */
    float alpha;                /* scatter_add's alpha (integers: integral) */
} ixk;

static int32_t ld_ix(const nt_gpsimd_operand *o, int q, int64_t j)
{
    const char *p = (const char *)o->data + q * o->pstride;
    return o->dtype == NT_U8 ? ((const uint8_t *)p)[j] : ((const int32_t *)p)[j];
}

static int check_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                    void *ctx, char *msg, size_t msglen)
{
    (void)dst, (void)nsrc;
    ixk *c = ctx;
    for (int q = 0; q < src[0].np; q++)
        for (int64_t j = 0; j < c->w; j++) {
            int32_t v = ld_ix(&src[0], q, j);
            if (v < 0 || v >= c->V) {
                snprintf(msg, msglen, "index[%lld] = %d is out of range [0, %lld)",
                         (long long)(c->base + q * c->w + j), v, (long long)c->V);
                return sk_data_error(c->s, NT_ERANGE, "%s", msg);
            }
        }
    return 0;
}

/* Flat target offset of position p whose index is v. */
static int64_t target(const ixk *c, int64_t p, int32_t v)
{
    int64_t off = 0;
    for (int i = c->nd - 1; i >= 0; i--) {
        int64_t ci = p % c->shape[i];
        p /= c->shape[i];
        off += (i == c->dim ? v : ci) * c->st[i];
    }
    return off;
}

static int offsets_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                      void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    ixk *c = ctx;
    for (int q = 0; q < src[0].np; q++) {
        int32_t *o = (int32_t *)((char *)dst->data + q * dst->pstride);
        for (int64_t j = 0; j < c->w; j++)
            o[j] = (int32_t)target(c, c->base + q * c->w + j, ld_ix(&src[0], q, j));
    }
    return 0;
}

/* dst: the block [128, F] f32; src[0]: g [np, w]; src[1]: indices [np, w] */
static int scatter_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                      void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    ixk *c = ctx;
    float gv[W];
    for (int q = 0; q < src[0].np; q++) {
        nt__ld_f32(gv, (const char *)src[0].data + q * src[0].pstride, src[0].dtype, 1, c->w);
        for (int64_t j = 0; j < c->w; j++) {
            int64_t rel = target(c, c->base + q * c->w + j, ld_ix(&src[1], q, j)) - c->e0;
            if (rel < 0 || rel >= c->ne)
                continue;
            float *a = (float *)((char *)dst->data + (rel / c->F) * dst->pstride);
            a[rel % c->F] += c->alpha == 1.0f ? gv[j] : gv[j] * c->alpha;
        }
    }
    return 0;
}

/* scatter's overwrite: dst the block [128, F] in the result's dtype; each
 * position that lands in it writes its source element's bits there, in
 * order (the last write wins) */
static int scatter_copy_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                           void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    ixk *c = ctx;
    size_t es = nt__dtype_size(dst->dtype);
    for (int q = 0; q < src[0].np; q++) {
        const char *gp = (const char *)src[0].data + q * src[0].pstride;
        for (int64_t j = 0; j < c->w; j++) {
            int64_t rel = target(c, c->base + q * c->w + j, ld_ix(&src[1], q, j)) - c->e0;
            if (rel < 0 || rel >= c->ne)
                continue;
            char *a = (char *)dst->data + (rel / c->F) * dst->pstride;
            memcpy(a + (size_t)(rel % c->F) * es, gp + (size_t)j * es, es);
        }
    }
    return 0;
}

/* The next round of positions from p0 of n: [np, w]. */
static void round_of(int64_t p0, int64_t n, int *np, int64_t *w)
{
    int64_t m = n - p0;
    if (m >= W) {
        *w = W;
        *np = (int)(m / W < 128 ? m / W : 128);
    } else {
        *w = m;
        *np = 1;
    }
}

/* Checks every index of the contiguous array ib (n of dtype idt) in order. */
static int check_all(sk_k *s, ixk *c, const void *ib, nt_dtype idt, int64_t n, nt_tile *it)
{
    int np;
    for (int64_t p0 = 0; p0 < n; p0 += np * c->w) {
        round_of(p0, n, &np, &c->w);
        nt_ap t = nt_tile_slice(it, 0, np, 0, c->w), h = nt_hbm_ap(ib, idt, p0, np, c->w, c->w);
        c->base = p0;
        const nt_ap *src[1] = {&t};
        if (nt_isa_dma_copy(s->k, &t, &h, sk_qin(s)) ||
            nt_isa_gpsimd_custom(s->k, "check_index", NULL, src, 1, 1.0, check_fn, c))
            return -1;
    }
    return 0;
}

/* One index per position: idx itself (gather), or index_select's 1-D idx
 * broadcast to the positions' shape along dim, copied contiguous. */
static const void *per_position(sk_k *s, const nt_tensor *ix, bool select, int nd,
                                const int64_t *shape, int dim)
{
    if (!select)
        return sk_contig_of(s, ix);
    /* a broadcast view of idx's storage: only the view fields (the counts
     * of the real handle change under other threads) */
    nt_tensor v;
    memset(&v, 0, sizeof v);
    v.st = ix->st;
    v.offset = ix->offset;
    v.dtype = ix->dtype;
    v.ndim = (int8_t)nd;
    for (int i = 0; i < nd; i++) {
        v.shape[i] = shape[i];
        v.stride[i] = i == dim && ix->ndim ? ix->stride[0] : 0;
    }
    return sk_contig_of(s, &v);
}

int nt__sk_gather(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *ix = r->in[1], *o = r->out[0];
    bool select = r->op == NT_OP_INDEX_SELECT;
    int64_t n = nt__numel(o->ndim, o->shape), ni = nt__numel(ix->ndim, ix->shape);
    /* x's elements as rows of one: the bound of the offsets */
    int64_t span = 1;
    for (int i = 0; i < x->ndim; i++)
        span += x->shape[i] > 0 ? (x->shape[i] - 1) * x->stride[i] : 0;
    if (span > INT32_MAX)
        return nt__kerr(NT_ESIM, "%s: x spans %lld elements; the simulator's gather offsets "
                        "are i32", nt__op_name(r->op), (long long)span);
    sk_k s;
    int rc = sk_begin(&s, nt__op_name(r->op));
    if (rc)
        return rc;
    nt_dtype xdt = (nt_dtype)x->dtype, idt = (nt_dtype)ix->dtype;
    ixk c = {.s = &s, .dim = r->p.dim, .nd = o->ndim, .V = x->ndim ? x->shape[r->p.dim] : 1};
    for (int i = 0; i < o->ndim; i++)
        c.shape[i] = o->shape[i], c.st[i] = x->stride[i];
    nt_tile *it = sk_tile(&s, "ix.idx", idt, 128, W), *ot = sk_tile(&s, "ix.off", NT_I32, 128, W);
    nt_tile *vt = sk_tile(&s, "ix.vals", xdt, 128, W);
    const void *ib = ni ? sk_contig_of(&s, ix) : NULL;
    if (ni && ib && !nt_sim_kernel_error(s.k) && !check_all(&s, &c, ib, idt, ni, it) && n) {
        const void *pb = per_position(&s, ix, select, o->ndim, o->shape, r->p.dim);
        char *ob = nt__tensor_data(o);
        nt_ap src;
        memset(&src, 0, sizeof src);
        src.hbm = nt__tensor_data(x);
        src.dtype = xdt;
        src.np = (int32_t)span;
        src.pstep = 1;
        src.ndim = 1;
        src.num[0] = 1;
        src.step[0] = 1;
        int np;
        for (int64_t p0 = 0; pb && p0 < n; p0 += np * c.w) {
            round_of(p0, n, &np, &c.w);
            c.base = p0;
            nt_ap ti = nt_tile_slice(it, 0, np, 0, c.w), to = nt_tile_slice(ot, 0, np, 0, c.w);
            nt_ap h = nt_hbm_ap(pb, idt, p0, np, c.w, c.w);
            const nt_ap *in[1] = {&ti};
            if (nt_isa_dma_copy(s.k, &ti, &h, sk_qin(&s)) ||
                nt_isa_gpsimd_custom(s.k, "gather_offsets", &to, in, 1, 4.0, offsets_fn, &c))
                break;
            bool ok = true;
            for (int64_t j = 0; j < c.w && ok; j++) {
                nt_ap d = nt_tile_slice(vt, 0, np, j, 1), oj = nt_tile_slice(ot, 0, np, j, 1);
                ok = !nt_isa_dma_gather(s.k, &d, &src, &oj, sk_qin(&s));
            }
            nt_ap v = nt_tile_slice(vt, 0, np, 0, c.w), out = nt_hbm_ap(ob, xdt, p0, np, c.w, c.w);
            if (!ok || nt_isa_dma_copy(s.k, &out, &v, sk_qout(&s)))
                break;
        }
    }
    return sk_end(&s);
}

/* scatter_add of integers: dst the block in the result's dtype; each
 * position that lands in it adds alpha * its element, wrapping in i32, in
 * order (cpu/index.c) */
static int scatter_iadd_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                           void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    ixk *c = ctx;
    uint32_t al = (uint32_t)(int32_t)c->alpha;
    for (int q = 0; q < src[0].np; q++) {
        const char *gp = (const char *)src[0].data + q * src[0].pstride;
        for (int64_t j = 0; j < c->w; j++) {
            int64_t rel = target(c, c->base + q * c->w + j, ld_ix(&src[1], q, j)) - c->e0;
            if (rel < 0 || rel >= c->ne)
                continue;
            char *a = (char *)dst->data + (rel / c->F) * dst->pstride;
            uint32_t x = (uint32_t)nt__load_i32(a, dst->dtype, rel % c->F);
            uint32_t y = (uint32_t)nt__load_i32(gp, src[0].dtype, j);
            nt__store_i32(a, dst->dtype, rel % c->F, (int32_t)(x + y * al));
        }
    }
    return 0;
}

/* What a scatter-like kernel does: out starts as init (zeros without one);
 * src's positions, in order, add (f32 accumulator, rounded once) or write
 * their element at the indexed place. */
typedef struct scat {
    const nt_tensor *init, *ix, *src, *o;
    bool select, add;
} scat;

/* One DMA between the block's rows of the contiguous array hb (elements
 * e0.. of dtype dt) and the tile t: its full rows, then its tail. */
static bool block_dma(sk_k *s, nt_tile *t, const void *hb, nt_dtype dt, const ixk *c, bool in)
{
    int64_t full = c->ne / c->F, tail = c->ne % c->F;
    bool ok = true;
    for (int part = 0; part < 2 && ok; part++) {
        int64_t rows = part ? (tail ? 1 : 0) : full, w = part ? tail : c->F;
        if (!rows)
            continue;
        nt_ap ta = nt_tile_slice(t, part ? (int)full : 0, (int)rows, 0, w);
        nt_ap h = nt_hbm_ap(hb, dt, c->e0 + (part ? full * c->F : 0), rows, w, w);
        ok = in ? !nt_isa_dma_copy(s->k, &ta, &h, sk_qin(s))
                : !nt_isa_dma_copy(s->k, &h, &ta, sk_qout(s));
    }
    return ok;
}

/* The block's starting values: init's elements (widened to f32 for an
 * add), or zeros. */
static bool block_init(sk_k *s, const scat *a, const void *ib, nt_tile *acc, nt_tile *yt,
                       const ixk *c)
{
    nt_ap A = nt_tile_ap(acc), Y = nt_tile_ap(yt);
    if (!a->init)
        return !nt_isa_memset(s->k, &A, 0.0, NT_ENGINE_VECTOR);
    if (!a->add || !nt__dtype_is_float((nt_dtype)a->o->dtype)) /* the result's dtype */
        return block_dma(s, acc, ib, (nt_dtype)a->o->dtype, c, true);
    return block_dma(s, yt, ib, (nt_dtype)a->o->dtype, c, true) &&
           !nt_isa_tensor_copy(s->k, &A, &Y, NT_ENGINE_SCALAR);
}

static int scatter_sk(const char *name, const scat *a, int dim, float alpha)
{
    const nt_tensor *g = a->src, *ix = a->ix, *o = a->o;
    int64_t N = nt__numel(o->ndim, o->shape), P = nt__numel(g->ndim, g->shape);
    int64_t ni = nt__numel(ix->ndim, ix->shape);
    if (N == 0 && ni == 0)
        return 0;
    sk_k s;
    int rc = sk_begin(&s, name);
    if (rc)
        return rc;
    nt_sim_kernel *k = s.k;
    nt_dtype gdt = (nt_dtype)g->dtype, idt = (nt_dtype)ix->dtype, odt = (nt_dtype)o->dtype;
    bool fadd = a->add && nt__dtype_is_float(odt); /* an f32 accumulator */
    nt_dtype adt = fadd ? NT_F32 : odt;
    ixk c = {.s = &s, .dim = dim, .nd = g->ndim, .V = o->ndim ? o->shape[dim] : 1,
             .alpha = alpha};
    int64_t os[NT_MAX_DIMS];
    nt__contig_strides(o->ndim, o->shape, os);
    for (int i = 0; i < g->ndim; i++)
        c.shape[i] = g->shape[i], c.st[i] = os[i];
    c.F = N == 0 ? 1 : (N + 127) / 128 < FB ? (N + 127) / 128 : FB;
    nt_tile *acc = sk_tile(&s, "ia.acc", adt, 128, c.F), *yt = sk_tile(&s, "ia.y", odt, 128, c.F);
    nt_tile *gt = sk_tile(&s, "ia.g", gdt, 128, W), *it = sk_tile(&s, "ia.idx", idt, 128, W);
    const void *ib = ni ? sk_contig_of(&s, ix) : NULL;
    const void *gb = P ? sk_contig_of(&s, g) : NULL;
    const void *pb = P ? per_position(&s, ix, a->select, g->ndim, g->shape, dim) : NULL;
    const void *tb = a->init ? sk_contig_of(&s, a->init) : NULL;
    bool ok = !nt_sim_kernel_error(k) && (!ni || (ib && !check_all(&s, &c, ib, idt, ni, it)));
    ok = ok && (!a->init || tb);
    char *ob = nt__tensor_data(o);
    for (int64_t e0 = 0; e0 < N && ok; e0 += 128 * c.F) {
        c.e0 = e0;
        c.ne = N - e0 < 128 * c.F ? N - e0 : 128 * c.F;
        nt_ap A = nt_tile_ap(acc);
        ok = block_init(&s, a, tb, acc, yt, &c);
        int np;
        for (int64_t p0 = 0; p0 < P && ok; p0 += np * c.w) {
            round_of(p0, P, &np, &c.w);
            c.base = p0;
            nt_ap gi = nt_tile_slice(gt, 0, np, 0, c.w), ii = nt_tile_slice(it, 0, np, 0, c.w);
            nt_ap hg = nt_hbm_ap(gb, gdt, p0, np, c.w, c.w), hi = nt_hbm_ap(pb, idt, p0, np, c.w, c.w);
            const nt_ap *src[2] = {&gi, &ii};
            ok = gb && pb && !nt_isa_dma_copy(k, &gi, &hg, sk_qin(&s)) &&
                 !nt_isa_dma_copy(k, &ii, &hi, sk_qin(&s)) &&
                 !nt_isa_gpsimd_custom(k, a->add ? "scatter_add" : "scatter", &A, src, 2, 4.0,
                                       fadd ? scatter_fn : a->add ? scatter_iadd_fn
                                                              : scatter_copy_fn, &c);
        }
        /* an add rounds once; the block is stored */
        nt_ap Y = nt_tile_ap(yt);
        if (fadd)
            ok = ok && !nt_isa_tensor_copy(k, &Y, &A, NT_ENGINE_SCALAR);
        ok = ok && block_dma(&s, fadd ? yt : acc, ob, odt, &c, false);
    }
    return sk_end(&s);
}

int nt__sk_index_add(const nt__rec *r)
{
    scat a = {.ix = r->in[1], .src = r->in[0], .o = r->out[0], .select = r->p.flag != 0,
              .add = true};
    return scatter_sk("index_add", &a, r->p.dim, 1.0f);
}

/* scatter and scatter_add (cpu/index.c says what they compute) */
int nt__sk_scatter(const nt__rec *r)
{
    scat a = {.init = r->in[0], .ix = r->in[1], .src = r->in[2], .o = r->out[0],
              .select = r->p.flag != 0, .add = r->op == NT_OP_SCATTER_ADD};
    return scatter_sk(nt__op_name(r->op), &a, r->p.dim, a.add ? (float)r->p.f[0] : 1.0f);
}
