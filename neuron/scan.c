/* neuron/scan.c - cumsum, cumprod and linrec: the running kernel of
 * cpu/scan.c (core/optable.h) as tile programs.
 *
 * The CPU's arithmetic: contiguous inputs of the output's shape, seen as
 * [O, n, I] around p.dim; per row (o, i): r = init; r = a[j] * r + b[j]
 * (two f32 roundings), y[j] = r rounded once; a absent = 1, b absent = -0.
 * That is NKI's tensor_tensor_scan with op0 = multiply, op1 = add, data0 =
 * a (or a [np, 1] tile of ones at step 0), data1 = b (or one of -0s).  A
 * row goes on a partition: I == 1, up to 128 consecutive rows per tile, each
 * one contiguous run per descriptor; I > 1, 128 adjacent i of one o, the
 * row at step I.  Rows longer than a tile go in chunks of SC elements, the
 * scan of a chunk starting from the f32 running value the last one ended
 * with (its last column: the scan's initial operand), so the f32 r of the
 * CPU carries over exactly; bf16/f16 outputs are rounded by a tensor_copy
 * from the f32 scan. */
#include "neuron/sk.h"

#include <string.h>

#define SC 2048 /* elements of a row per tile */

typedef struct scan {
    sk_k *s;
    const nt_tensor *a, *b;
    float init;
    nt_dtype odt;
    char *ab, *bb, *ob;
    int64_t n, pstep, step; /* a row: n elements `step` apart; rows pstep apart */
    nt_tile *at[2], *bt[2], *yf[2], *yo[2], *one, *nz;
    int t;                  /* tiles issued: the double buffers' index */
} scan;

static int scan_group(scan *c, int64_t off, int np)
{
    nt_sim_kernel *k = c->s->k;
    int rc = 0;
    nt_ap carry;
    memset(&carry, 0, sizeof carry);
    for (int64_t j0 = 0; j0 < c->n && !rc; j0 += SC) {
        int64_t m = c->n - j0 < SC ? c->n - j0 : SC;
        int b = c->t++ & 1;
        int64_t o0 = off + j0 * c->step;
        nt_ap d0 = nt_tile_slice(c->one, 0, np, 0, 1), d1 = nt_tile_slice(c->nz, 0, np, 0, 1);
        d0.num[0] = d1.num[0] = m;
        d0.step[0] = d1.step[0] = 0;
        if (c->a) {
            d0 = nt_tile_slice(c->at[b], 0, np, 0, m);
            nt_ap h = sk_hbm_rows(c->ab, (nt_dtype)c->a->dtype, o0, np, c->pstep, m, c->step);
            rc = nt_isa_dma_copy(k, &d0, &h, sk_qin(c->s));
        }
        if (c->b && !rc) {
            d1 = nt_tile_slice(c->bt[b], 0, np, 0, m);
            nt_ap h = sk_hbm_rows(c->bb, (nt_dtype)c->b->dtype, o0, np, c->pstep, m, c->step);
            rc = nt_isa_dma_copy(k, &d1, &h, sk_qin(c->s));
        }
        nt_ap y = nt_tile_slice(c->yf[b], 0, np, 0, m);
        nt_isa_scalar ini = {j0 ? &carry : NULL, c->init};
        if (!rc)
            rc = nt_isa_tensor_tensor_scan(k, &y, &d0, &d1, &ini, NT_ALU_MUL, NT_ALU_ADD);
        carry = nt_tile_slice(c->yf[b], 0, np, m - 1, 1);
        nt_ap yo = y;
        if (c->odt != NT_F32 && !rc) {
            yo = nt_tile_slice(c->yo[b], 0, np, 0, m);
            rc = nt_isa_tensor_copy(k, &yo, &y, NT_ENGINE_VECTOR);
        }
        nt_ap h = sk_hbm_rows(c->ob, c->odt, o0, np, c->pstep, m, c->step);
        if (!rc)
            rc = nt_isa_dma_copy(k, &h, &yo, sk_qout(c->s));
    }
    return rc;
}

static int scan_all(scan *c, int64_t O, int64_t I)
{
    int rc = 0;
    if (I == 1) {
        c->pstep = c->n, c->step = 1;
        for (int64_t o = 0; o < O && !rc; o += 128)
            rc = scan_group(c, o * c->n, (int)(O - o < 128 ? O - o : 128));
        return rc;
    }
    c->pstep = 1, c->step = I;
    for (int64_t o = 0; o < O && !rc; o++)
        for (int64_t i = 0; i < I && !rc; i += 128)
            rc = scan_group(c, o * c->n * I + i, (int)(I - i < 128 ? I - i : 128));
    return rc;
}

int nt__sk_scan(const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    scan c;
    memset(&c, 0, sizeof c);
    c.init = -0.0f;
    switch (r->op) {
    case NT_OP_CUMSUM: c.b = r->in[0]; break;
    case NT_OP_CUMPROD: c.a = r->in[0], c.init = 1.0f; break;
    case NT_OP_LINREC: c.a = r->in[0], c.b = r->in[1]; break;
    default: return nt__kerr(NT_EINVAL, "op %s is not a running op", nt__op_name(r->op));
    }
    int d = r->p.dim;
    int64_t O = nt__numel(d, o->shape), I = nt__numel(o->ndim - d - 1, o->shape + d + 1);
    c.n = o->shape[d];
    if (O * c.n * I == 0)
        return 0;
    sk_k s;
    int rc = sk_begin(&s, nt__op_name(r->op));
    if (rc)
        return rc;
    bool values = sk_values_begin(&s);
    if (values && sk_memo_rec(&s, r, false))
        return sk_end_values(&s, values, 0, r);
    c.s = &s;
    c.odt = (nt_dtype)o->dtype;
    c.ob = nt__tensor_data(o);
    c.ab = c.a ? nt__tensor_data(c.a) : NULL;
    c.bb = c.b ? nt__tensor_data(c.b) : NULL;
    for (int b = 0; b < 2; b++) {
        if (c.a)
            c.at[b] = sk_tile(&s, "scan.a", (nt_dtype)c.a->dtype, 128, SC);
        if (c.b)
            c.bt[b] = sk_tile(&s, "scan.b", (nt_dtype)c.b->dtype, 128, SC);
        c.yf[b] = sk_tile(&s, "scan.y", NT_F32, 128, SC);
        if (c.odt != NT_F32)
            c.yo[b] = sk_tile(&s, "scan.yo", c.odt, 128, SC);
    }
    c.one = sk_tile(&s, "scan.one", NT_F32, 128, 1);
    c.nz = sk_tile(&s, "scan.negzero", NT_F32, 128, 1);
    nt_ap one = nt_tile_ap(c.one), nz = nt_tile_ap(c.nz);
    nt_isa_memset(s.k, &one, 1.0, NT_ENGINE_GPSIMD);
    nt_isa_memset(s.k, &nz, -0.0, NT_ENGINE_GPSIMD);
    if (!nt_sim_kernel_error(s.k))
        scan_all(&c, O, I);
    return sk_end_values(&s, values, 0, r);
}
