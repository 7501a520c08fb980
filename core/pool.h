/* core/pool.h - max_pool2d_fwd's geometry and its scan, shared by the CPU
 * kernel (cpu/pool.c) and the simulator's (neuron/pool.c).
 *
 * x [..., H, W] (contiguous f32: P planes of H W), y and idx [..., OH, OW].
 * Window (oh, ow) has slots (a, b), a < k0, b < k1, in row-major order, at
 * row oh s0 - p0 + a d0 and column ow s1 - p1 + b d1; a slot outside the
 * input is skipped.  PyTorch's scan over the slots inside: the first one
 * is taken, then a later value v replaces the kept one m when v > m or v is
 * a NaN.  So y is the first maximum (a NaN: the last NaN) with x's bits
 * (a NaN canonical, as every f32 store), idx its flat position h W + w in
 * the plane. */
#ifndef NT_CORE_POOL_H
#define NT_CORE_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"

typedef struct nt__pool2d {
    int64_t P, H, W, OH, OW;
    int64_t k[2], s[2], p[2], d[2];
} nt__pool2d;

/* The geometry of a max_pool2d_fwd or max_pool2d_bwd record (p.i: kernel, stride, padding,
 * dilation, two values each). */
static inline void nt__pool2d_geo(nt__pool2d *g, const nt__rec *r)
{
    bool bwd = r->op == NT_OP_MAX_POOL2D_BWD; /* x's shape is dx's, y's g's */
    const nt_tensor *x = bwd ? r->out[0] : r->in[0], *y = bwd ? r->in[0] : r->out[0];
    int nd = x->ndim;
    g->H = x->shape[nd - 2], g->W = x->shape[nd - 1];
    g->OH = y->shape[nd - 2], g->OW = y->shape[nd - 1];
    g->P = 1;
    for (int i = 0; i < nd - 2; i++)
        g->P *= x->shape[i];
    for (int i = 0; i < 2; i++)
        g->k[i] = r->p.i[i], g->s[i] = r->p.i[2 + i], g->p[i] = r->p.i[4 + i],
        g->d[i] = r->p.i[6 + i];
}

/* The padded plane the simulator's kernel keeps on chip: rows (columns)
 * -p .. ext - p - 1, ext covering the input and every window. */
static inline int64_t nt__pool2d_ext(const nt__pool2d *g, int i)
{
    int64_t in = i ? g->W : g->H, out = i ? g->OW : g->OH;
    int64_t need = (out - 1) * g->s[i] + (g->k[i] - 1) * g->d[i] + 1;
    return need > g->p[i] + in ? need : g->p[i] + in;
}

/* On-chip bytes per partition for q planes of g (neuron/pool.c's tiles:
 * the padded planes and a mask plane, five f32 and one i32 [q, OH, OW]). */
static inline int64_t nt__pool2d_bytes(const nt__pool2d *g, int64_t q)
{
    int64_t pp = nt__pool2d_ext(g, 0) * nt__pool2d_ext(g, 1);
    return 4 * (q * pp + pp + 6 * q * g->OH * g->OW);
}

/* The simulator's budget for them (of its 192 KiB per partition). */
#define NT_POOL2D_SBUF (128 * 1024)

#endif
