/* core/attn.h - the geometry of scaled dot-product attention, shared by the
 * CPU kernel (cpu/attention.c) and the simulator's tile program
 * (neuron/attention.c), so both walk the same blocks.
 *
 * q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] share their leading
 * (batch) dims; the mask is broadcast to [..., Tq, Tk].  Every operand is
 * read through its own strides (no contiguous copies).  The arithmetic is
 * docs/ops.md §7a: key blocks of NT_ATTN_BLOCK, query blocks of the same
 * size, online softmax in f32. */
#ifndef NT_CORE_ATTN_H
#define NT_CORE_ATTN_H

#include "core/internal.h"

/* keys per block, and queries per block (one partition per query row) */
#define NT_ATTN_BLOCK 128

/* One operand as the kernels read it: element [b, r, c] (b the flat batch
 * index) at base + (boff(b) + r * rs + c * cs) elements. */
typedef struct nt__attn_opnd {
    const char *base; /* at the view's offset */
    nt_dtype dt;
    int64_t rs, cs;   /* row and column strides (0 on broadcast dims) */
    int nb;           /* leading dims of the iteration (right-aligned) */
    int64_t bst[NT_MAX_DIMS]; /* stride per leading dim (0 on broadcast) */
} nt__attn_opnd;

typedef struct nt__attn_geom {
    int nb;                        /* leading dims */
    int64_t bshape[NT_MAX_DIMS];
    int64_t nbatch;
} nt__attn_geom;

/* The batch geometry of q (ndim >= 2). */
static inline void nt__attn_geom_of(nt__attn_geom *g, const nt_tensor *q)
{
    g->nb = q->ndim - 2;
    g->nbatch = 1;
    for (int i = 0; i < g->nb; i++) {
        g->bshape[i] = q->shape[i];
        g->nbatch *= q->shape[i];
    }
}

/* t read at iteration shape bshape + [R, C] (t right-aligned, dims of 1
 * broadcast); col0 is a column offset (the packed backward inputs). */
static inline void nt__attn_opnd_of(nt__attn_opnd *o, const nt_tensor *t,
                                    const nt__attn_geom *g, int64_t col0)
{
    o->dt = (nt_dtype)t->dtype;
    int nd = t->ndim;
    o->rs = nd >= 2 && t->shape[nd - 2] != 1 ? t->stride[nd - 2] : 0;
    o->cs = nd >= 1 && t->shape[nd - 1] != 1 ? t->stride[nd - 1] : 0;
    o->nb = g->nb;
    for (int i = 0; i < g->nb; i++) {
        int ti = i - (g->nb - (nd - 2)); /* t's dim for leading dim i */
        o->bst[i] = ti >= 0 && t->shape[ti] != 1 ? t->stride[ti] : 0;
    }
    o->base = (const char *)nt__tensor_data(t) +
              col0 * (nd >= 1 ? t->stride[nd - 1] : 0) * (int64_t)nt__dtype_size(o->dt);
}

/* Whether attention's output takes q's layout of heads inside rows: q
 * [..., H, T, D] a view whose heads lie closer together than its rows (the
 * heads of a [B, T, H * D] projection, permuted).  Then the op's output is
 * [..., T, H, Dv] row-major (p.i[4] = 1) and the caller gets its view
 * [..., H, T, Dv], which permutes back to [B, T, H * Dv] for free
 * (dispatcher/api_attention.c; docs/ops.md §7a). */
static inline bool nt__attn_heads_inside(const nt_tensor *q)
{
    int nd = q->ndim;
    return nd >= 3 && q->shape[nd - 3] > 1 && q->shape[nd - 2] > 1 &&
           q->stride[nd - 3] < q->stride[nd - 2];
}

/* The output o as the kernels write it: o itself, or with heads_inside
 * (o [..., T, H, Dv] row-major) its view [..., H, T, Dv]. */
static inline void nt__attn_opnd_out(nt__attn_opnd *o, const nt_tensor *t,
                                     const nt__attn_geom *g, bool heads_inside)
{
    nt__attn_opnd_of(o, t, g, 0);
    if (heads_inside) {
        int nd = t->ndim;
        o->rs = t->stride[nd - 3];
        o->bst[g->nb - 1] = t->shape[nd - 2] != 1 ? t->stride[nd - 2] : 0;
    }
}

/* The backward's packed inputs (autograd/backward.c): t [..lead, N] holds,
 * per batch, several row-major blocks one after the other; the operand is
 * the block at element off, rows of stride rs, columns contiguous. */
static inline void nt__attn_opnd_flat(nt__attn_opnd *o, const nt_tensor *t,
                                      const nt__attn_geom *g, int64_t off, int64_t rs)
{
    o->dt = (nt_dtype)t->dtype;
    o->rs = rs;
    o->cs = 1;
    o->nb = g->nb;
    for (int i = 0; i < g->nb; i++)
        o->bst[i] = t->shape[i] != 1 ? t->stride[i] : 0;
    o->base = (const char *)nt__tensor_data(t) +
              off * t->stride[t->ndim - 1] * (int64_t)nt__dtype_size(o->dt);
}

/* The backward's unpacked q, k, v (autograd/backward.c, p.i[4] = 1): t
 * [3, ..lead, T, D] holds them along its first dim; operand i of the three,
 * read through t's strides. */
static inline void nt__attn_opnd_stack(nt__attn_opnd *o, const nt_tensor *t,
                                       const nt__attn_geom *g, int i)
{
    nt__attn_opnd_of(o, t, g, 0);
    o->base += (int64_t)i * t->stride[0] * (int64_t)nt__dtype_size(o->dt);
}

/* The backward's gradient i of q, k, v written in place (p.i[5] = 1): out
 * holds the elements of t [3, ..lead, T, D] (the q, k, v view,
 * nt__attn_opnd_stack) at the same places relative to t's first element,
 * so dq, dk, dv lie as q, k, v lie in their projection. */
static inline void nt__attn_opnd_placed(nt__attn_opnd *o, const nt_tensor *t,
                                        const nt__attn_geom *g, int i, const nt_tensor *out)
{
    nt__attn_opnd_stack(o, t, g, i);
    o->dt = (nt_dtype)out->dtype;
    o->base = (const char *)nt__tensor_data(out) +
              (int64_t)i * t->stride[0] * (int64_t)nt__dtype_size(o->dt);
}

/* The batch geometry of the packed t [..lead, N]. */
static inline void nt__attn_geom_flat(nt__attn_geom *g, const nt_tensor *t)
{
    g->nb = t->ndim - 1;
    g->nbatch = 1;
    for (int i = 0; i < g->nb; i++) {
        g->bshape[i] = t->shape[i];
        g->nbatch *= t->shape[i];
    }
}

/* Element offset of batch b (flat, row-major over g's leading dims). */
static inline int64_t nt__attn_boff(const nt__attn_opnd *o, const nt__attn_geom *g, int64_t b)
{
    int64_t off = 0;
    for (int i = g->nb - 1; i >= 0; i--) {
        int64_t n = g->bshape[i];
        off += (b % n) * o->bst[i];
        b /= n;
    }
    return off;
}

#endif
