/* cpu/index.c - gather, index_select and their backward, index_add.
 *
 * gather(x, idx) along p.dim: out has idx's shape; out[c] = x[c with c[dim]
 * := idx[c]].  index_select(x, idx) along p.dim: out has x's shape with dim
 * p.dim of length numel(idx); out[c] = x[c with c[dim] := idx[c[dim]]].
 * Elements are copied bit for bit (no conversion).  Indices (i32 or u8, any
 * strides) are checked first, all of them, in idx's row-major order: the
 * first one outside [0, x.shape[dim]) is NT_ERANGE naming its position, and
 * nothing is written.
 *
 * index_add(g, idx) -> gx, the backward of both (p.flag = 1: index_select):
 * gx = 0 of x's shape; for every position c of g in row-major order,
 * gx[c with c[dim] := the index] += g[c], accumulated in f32 from +0 and
 * rounded once to gx's dtype.  A fixed order, so repeated indices always
 * add up the same way.
 *
 * scatter(t, idx, src) and scatter_add(t, idx, src) (public ops) share that
 * kernel: the result starts as t instead of zeros; scatter writes src's
 * elements bit for bit (the last write wins), scatter_add adds alpha * src
 * in f32 from t's value and rounds once.  p.flag 1 takes a 1-D index along
 * dim (index_put, index_add). */
#include "cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

/* The index array's values in row-major order, checked against [0, V). */
int nt__index_load(const nt_tensor *ix, int64_t V, int32_t **out)
{
    int64_t n = nt__numel(ix->ndim, ix->shape);
    int32_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for %lld indices", (long long)n);
    nt__kv kv;
    nt__kv_of(&kv, ix, 0, NULL);
    int64_t k = 0, id[NT_MAX_DIMS] = {0};
    if (n > 0)
        do
            v[k++] = nt__load_i32(kv.data, kv.dt, nt__kv_off(&kv, id));
        while (nt__idx_next(id, kv.ndim, kv.shape));
    for (k = 0; k < n; k++)
        if (v[k] < 0 || v[k] >= V) {
            int32_t bad = v[k];
            free(v);
            return nt__kerr(NT_ERANGE, "index[%lld] = %d is out of range [0, %lld)",
                            (long long)k, bad, (long long)V);
        }
    *out = v;
    return 0;
}

/* Which index the position with coordinates c (over the shape `sh` of n
 * positions, row-major flat position p) uses. */
static inline int32_t index_at(const int32_t *v, bool select, int dim, const int64_t *c,
                               int64_t p)
{
    return select ? v[c[dim]] : v[p];
}

static int gather_kernel(const nt__rec *r, bool select)
{
    const nt_tensor *x = r->in[0], *ix = r->in[1], *o = r->out[0];
    int dim = r->p.dim;
    int32_t *v;
    int rc = nt__index_load(ix, x->ndim ? x->shape[dim] : 1, &v);
    if (rc)
        return rc;
    int64_t n = nt__numel(o->ndim, o->shape);
    int64_t es = (int64_t)nt__dtype_size((nt_dtype)x->dtype);
    const char *xd = nt__tensor_data(x);
    char *y = nt__tensor_data(o);
    int64_t c[NT_MAX_DIMS] = {0};
    if (n > 0)
        for (int64_t p = 0;; p++) {
            int64_t off = 0;
            for (int i = 0; i < o->ndim; i++)
                off += (i == dim ? index_at(v, select, dim, c, p) : c[i]) * x->stride[i];
            memcpy(y + p * es, xd + off * es, (size_t)es);
            if (!nt__idx_next(c, o->ndim, o->shape))
                break;
        }
    free(v);
    return 0;
}

int nt__cpu_gather(const nt__rec *r) { return gather_kernel(r, false); }
int nt__cpu_index_select(const nt__rec *r) { return gather_kernel(r, true); }

/* The shared core of index_add (the gradient helper: no init, alpha 1),
 * scatter and scatter_add (docs/ops.md): out starts as init (zeros without
 * one); then for every position c of src in row-major order, with i its
 * index (idx[c] or, select, idx[c[dim]]): add: out[c with c[dim] := i] +=
 * alpha * src[c] in an f32 accumulator, rounded once to out's dtype;
 * overwrite: out[c with c[dim] := i] = src[c], bit for bit (the last
 * write wins). */
typedef struct scat {
    const nt_tensor *init, *ix, *src, *o;
    int dim;
    bool select, add;
    float alpha;
} scat;

static int scatter_add_core(const scat *s, const int32_t *v)
{
    const nt_tensor *g = s->src, *o = s->o;
    int64_t N = nt__numel(o->ndim, o->shape), P = nt__numel(g->ndim, g->shape);
    float *acc = calloc((size_t)(N > 0 ? N : 1), sizeof *acc);
    float *gf = malloc((size_t)(P > 0 ? P : 1) * sizeof *gf);
    if (!acc || !gf) {
        free(acc), free(gf);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a %lld-element result",
                        (long long)N);
    }
    if (s->init && N > 0)
        nt__gather_f32(acc, s->init);
    if (P > 0)
        nt__gather_f32(gf, g);
    int64_t os[NT_MAX_DIMS], c[NT_MAX_DIMS] = {0};
    nt__contig_strides(o->ndim, o->shape, os);
    if (P > 0)
        for (int64_t p = 0;; p++) {
            int64_t off = 0;
            for (int i = 0; i < g->ndim; i++)
                off += (i == s->dim ? index_at(v, s->select, s->dim, c, p) : c[i]) * os[i];
            acc[off] += s->alpha == 1.0f ? gf[p] : gf[p] * s->alpha;
            if (!nt__idx_next(c, g->ndim, g->shape))
                break;
        }
    nt__st_f32(nt__tensor_data(o), (nt_dtype)o->dtype, 1, acc, N);
    free(acc), free(gf);
    return 0;
}

/* overwrite: bit copies; an integer add (s->add): out[...] += alpha *
 * src[c] wrapping in i32 (two's complement), then stored to the dtype
 * (u8: modulo 256), as PyTorch's integer adds */
static int scatter_copy_core(const scat *s, const int32_t *v)
{
    const nt_tensor *g = s->src, *o = s->o;
    int64_t N = nt__numel(o->ndim, o->shape), P = nt__numel(g->ndim, g->shape);
    int64_t es = (int64_t)nt__dtype_size((nt_dtype)o->dtype);
    char *y = nt__tensor_data(o);
    nt__kv iv, gv;
    nt__kv_of(&iv, s->init, 0, NULL); /* (integer scatter_add: always given) */
    nt__kv_of(&gv, g, 0, NULL);
    int64_t c[NT_MAX_DIMS] = {0}, os[NT_MAX_DIMS];
    if (N > 0)
        for (int64_t p = 0;; p++) {
            memcpy(y + p * es, iv.data + nt__kv_off(&iv, c) * es, (size_t)es);
            if (!nt__idx_next(c, o->ndim, o->shape))
                break;
        }
    nt__contig_strides(o->ndim, o->shape, os);
    memset(c, 0, sizeof c);
    if (P > 0)
        for (int64_t p = 0;; p++) {
            int64_t off = 0;
            for (int i = 0; i < g->ndim; i++)
                off += (i == s->dim ? index_at(v, s->select, s->dim, c, p) : c[i]) * os[i];
            if (s->add) {
                nt_dtype dt = (nt_dtype)o->dtype;
                uint32_t a = (uint32_t)nt__load_i32(y, dt, off);
                uint32_t b = (uint32_t)nt__load_i32(gv.data, dt, nt__kv_off(&gv, c));
                nt__store_i32(y, dt, off, (int32_t)(a + b * (uint32_t)(int32_t)s->alpha));
            } else {
                memcpy(y + off * es, gv.data + nt__kv_off(&gv, c) * es, (size_t)es);
            }
            if (!nt__idx_next(c, g->ndim, g->shape))
                break;
        }
    return 0;
}

static int scatter_kernel(const scat *s)
{
    int32_t *v;
    int rc = nt__index_load(s->ix, s->o->ndim ? s->o->shape[s->dim] : 1, &v);
    if (rc)
        return rc;
    bool fadd = s->add && nt__dtype_is_float((nt_dtype)s->o->dtype);
    rc = fadd ? scatter_add_core(s, v) : scatter_copy_core(s, v);
    free(v);
    return rc;
}

int nt__cpu_index_add(const nt__rec *r)
{
    scat s = {.ix = r->in[1], .src = r->in[0], .o = r->out[0], .dim = r->p.dim,
              .select = r->p.flag != 0, .add = true, .alpha = 1.0f};
    return scatter_kernel(&s);
}

/* scatter(t, index, src) and scatter_add(t, index, src): p.flag 1 takes a
 * 1-D index along dim (index_put, index_add); p.f[0] is scatter_add's alpha */
int nt__cpu_scatter(const nt__rec *r)
{
    scat s = {.init = r->in[0], .ix = r->in[1], .src = r->in[2], .o = r->out[0],
              .dim = r->p.dim, .select = r->p.flag != 0, .add = false};
    return scatter_kernel(&s);
}

int nt__cpu_scatter_add(const nt__rec *r)
{
    scat s = {.init = r->in[0], .ix = r->in[1], .src = r->in[2], .o = r->out[0],
              .dim = r->p.dim, .select = r->p.flag != 0, .add = true,
              .alpha = (float)r->p.f[0]}; /* integers: an integral alpha (the dispatcher's check) */
    return scatter_kernel(&s);
}
