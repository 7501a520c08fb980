/* cpu/scan.c - the running kernel of cumsum, cumprod and linrec (core/optable.h).
 *
 * Inputs and output are contiguous, of the output's shape, seen as
 * [O, n, I] around dim p.dim.  For every (o, i) in order:
 *   r = init; for j = 0 .. n-1: r = a[j] * r; r = r + b[j]; y[j] = r
 * in f32 (two roundings per step: no fused multiply-add), each y[j] rounded
 * once to y's dtype, r itself carried in f32.  An absent a is 1, an absent b
 * is -0 (x + -0 is x for every x, -0 included), so cumsum (a = 1, b = x,
 * init -0) gives y0 = x0, y_j = y_(j-1) + x_j and cumprod (a = x, b = -0,
 * init 1) y0 = x0, y_j = x_j * y_(j-1): the sequential sum and product.
 * The simulator's kernel (neuron/scan.c) is one tensor_tensor_scan per
 * tile with the same steps. */
#include "cpu/cpu.h"

#include <stdlib.h>

#include "core/dtype.h"

/* a, b and the initial value of the record's op */
static int scan_operands(const nt__rec *r, const nt_tensor **a, const nt_tensor **b, float *init)
{
    *a = *b = NULL;
    *init = -0.0f;
    switch (r->op) {
    case NT_OP_CUMSUM: *b = r->in[0]; break;
    case NT_OP_CUMPROD: *a = r->in[0], *init = 1.0f; break;
    case NT_OP_LINREC: *a = r->in[0], *b = r->in[1]; break;
    default: return nt__kerr(NT_EINVAL, "op %s is not a running op", nt__op_name(r->op));
    }
    return 0;
}

static int scan_kernel(const nt__rec *r)
{
    const nt_tensor *a, *b, *o = r->out[0];
    float init;
    int rc = scan_operands(r, &a, &b, &init);
    if (rc)
        return rc;
    int d = r->p.dim;
    int64_t O = nt__numel(d, o->shape), n = o->shape[d];
    int64_t I = nt__numel(o->ndim - d - 1, o->shape + d + 1);
    if (O * n * I == 0)
        return 0;
    float *acc = malloc(sizeof(float) * (size_t)I);
    if (!acc)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a %lld-element running row",
                        (long long)I);
    const void *ap = a ? nt__tensor_data(a) : NULL, *bp = b ? nt__tensor_data(b) : NULL;
    nt_dtype adt = a ? (nt_dtype)a->dtype : NT_F32, bdt = b ? (nt_dtype)b->dtype : NT_F32;
    nt_dtype odt = (nt_dtype)o->dtype;
    void *op = nt__tensor_data(o);
    for (int64_t oi = 0; oi < O; oi++) {
        for (int64_t i = 0; i < I; i++)
            acc[i] = init;
        for (int64_t j = 0; j < n; j++) {
            int64_t base = (oi * n + j) * I;
            for (int64_t i = 0; i < I; i++) {
                float t = (a ? nt__load_f32(ap, adt, base + i) : 1.0f) * acc[i];
                acc[i] = t + (b ? nt__load_f32(bp, bdt, base + i) : -0.0f);
                nt__store_f32(op, odt, base + i, acc[i]);
            }
        }
    }
    free(acc);
    return 0;
}

int nt__cpu_cumsum(const nt__rec *r) { return scan_kernel(r); }
int nt__cpu_cumprod(const nt__rec *r) { return scan_kernel(r); }
int nt__cpu_linrec(const nt__rec *r) { return scan_kernel(r); }
