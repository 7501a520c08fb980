/* dispatcher/api_attention.c - nt_scaled_dot_product_attention (kernels:
 * cpu/attention.c, neuron/attention.c; arithmetic: docs/ops.md §7a).
 *
 * One op, SDPA, with two outputs: the attention o and the per-row
 * log-sum-exp (f32 [..., Tq]) that only its backward reads; the caller
 * gets o.  Nothing of size Tq x Tk is ever allocated. */
#include "core/attn.h"
#include "dispatcher/dispatch.h"

#include <float.h>
#include <math.h>

static bool attn_float(nt__call *c, nt_tensor *t, const char *arg)
{
    if (nt__dtype_is_float((nt_dtype)t->dtype))
        return true;
    nt__err(c->site, NT_EDTYPE, c->fn, "argument '%s' has dtype %s; expected f32, bf16 or f16",
            arg, nt_dtype_name((nt_dtype)t->dtype));
    return false;
}

/* q, k, v: floating, the same dtype, at least 2-D, the same leading dims,
 * k's D = q's D, v's rows = k's rows, 1 <= D, Dv <= 128 (the tile
 * program's partition span: docs/ops.md §7a). */
static bool attn_qkv(nt__call *c, nt_tensor *q, nt_tensor *k, nt_tensor *v)
{
    const char *names[3] = {"q", "k", "v"};
    nt_tensor *t[3] = {q, k, v};
    char s1[128], s2[128];
    for (int i = 0; i < 3; i++) {
        if (!attn_float(c, t[i], names[i]))
            return false;
        if (t[i]->ndim < 2) {
            nt__err(c->site, NT_ESHAPE, c->fn, "argument '%s' has shape %s; expected at least 2 "
                    "dims [..., T, D]", names[i],
                    nt__shape_str(t[i]->ndim, t[i]->shape, s1, sizeof s1));
            return false;
        }
    }
    for (int i = 1; i < 3; i++)
        if (t[i]->dtype != q->dtype) {
            nt__err(c->site, NT_EDTYPE, c->fn, "argument '%s' has dtype %s; expected q's %s "
                    "(cast one, or use autocast)", names[i],
                    nt_dtype_name((nt_dtype)t[i]->dtype), nt_dtype_name((nt_dtype)q->dtype));
            return false;
        }
    int nd = q->ndim;
    for (int i = 1; i < 3; i++) {
        bool ok = t[i]->ndim == nd;
        for (int d = 0; ok && d < nd - 2; d++)
            ok = t[i]->shape[d] == q->shape[d];
        if (!ok) {
            nt__err(c->site, NT_ESHAPE, c->fn, "argument '%s' has shape %s; expected the leading "
                    "dims of q %s and 2 more", names[i],
                    nt__shape_str(t[i]->ndim, t[i]->shape, s1, sizeof s1),
                    nt__shape_str(nd, q->shape, s2, sizeof s2));
            return false;
        }
    }
    int64_t D = q->shape[nd - 1], Tk = k->shape[nd - 2], Dv = v->shape[nd - 1];
    if (k->shape[nd - 1] != D) {
        nt__err(c->site, NT_ESHAPE, c->fn, "argument 'k' has shape %s; expected its last dim to "
                "be q's %lld", nt__shape_str(nd, k->shape, s1, sizeof s1), (long long)D);
        return false;
    }
    if (v->shape[nd - 2] != Tk) {
        nt__err(c->site, NT_ESHAPE, c->fn, "argument 'v' has shape %s; expected %lld rows, as "
                "many as k has", nt__shape_str(nd, v->shape, s1, sizeof s1), (long long)Tk);
        return false;
    }
    if (D < 1 || D > 128) {
        nt__err(c->site, NT_ESHAPE, c->fn, "argument 'q' has head dim %lld; expected 1..128",
                (long long)D);
        return false;
    }
    if (Dv < 1 || Dv > 128) {
        nt__err(c->site, NT_ESHAPE, c->fn, "argument 'v' has head dim %lld; expected 1..128",
                (long long)Dv);
        return false;
    }
    return true;
}

/* mask: u8 or floating, broadcastable to q's leading dims + [Tq, Tk]. */
static bool attn_mask(nt__call *c, nt_tensor *m, nt_tensor *q, int64_t Tk)
{
    if (m->dtype != NT_U8 && !nt__dtype_is_float((nt_dtype)m->dtype)) {
        nt__err(c->site, NT_EDTYPE, c->fn, "argument 'mask' has dtype %s; expected u8 (true = "
                "may attend) or floating (added to the scores)",
                nt_dtype_name((nt_dtype)m->dtype));
        return false;
    }
    int nd = q->ndim;
    int64_t full[NT_MAX_DIMS];
    for (int i = 0; i < nd - 2; i++)
        full[i] = q->shape[i];
    full[nd - 2] = q->shape[nd - 2];
    full[nd - 1] = Tk;
    bool ok = m->ndim <= nd;
    for (int i = 0; ok && i < m->ndim; i++) {
        int64_t a = m->shape[m->ndim - 1 - i], b = full[nd - 1 - i];
        ok = a == 1 || a == b;
    }
    if (!ok) {
        char s1[128], s2[128];
        nt__err(c->site, NT_ESHAPE, c->fn, "argument 'mask' has shape %s; expected one that "
                "broadcasts to %s (q's leading dims + [Tq, Tk])",
                nt__shape_str(m->ndim, m->shape, s1, sizeof s1),
                nt__shape_str(nd, full, s2, sizeof s2));
        return false;
    }
    return true;
}

NT_API nt_tensor *nt_scaled_dot_product_attention_at(const nt_site *site, nt_tensor *q,
                                                     nt_tensor *k, nt_tensor *v, nt_tensor *mask,
                                                     bool causal, double scale)
{
    nt__call c;
    nt_tensor *in[4] = {q, k, v, mask};
    if (!nt__call_begin(&c, site, "nt_scaled_dot_product_attention", NT_OP_SDPA, 4, in,
                        "q,k,v,?mask"))
        return nt__call_fail(&c);
    q = c.in[0], k = c.in[1], v = c.in[2], mask = c.in[3];
    if (!attn_qkv(&c, q, k, v))
        return nt__call_fail(&c);
    int nd = q->ndim;
    int64_t Tq = q->shape[nd - 2], D = q->shape[nd - 1], Tk = k->shape[nd - 2];
    int64_t Dv = v->shape[nd - 1];
    if (mask && !attn_mask(&c, mask, q, Tk))
        return nt__call_fail(&c);
    if (!isfinite(scale) || fabs(scale) > FLT_MAX) { /* (float)scale must be finite */
        nt__err(site, NT_EINVAL, c.fn, "argument 'scale' is %g; expected a finite number (0: "
                "1/sqrt(D))", scale);
        return nt__call_fail(&c);
    }
    c.p.f[0] = scale == 0.0 ? 1.0 / sqrt((double)D) : scale;
    c.p.flag = causal;
    /* the sizes, for the simulator's question whether a head fits SBUF
     * (neuron/attention.c; else the op runs on the CPU) */
    c.p.i[0] = D, c.p.i[1] = Dv, c.p.i[2] = Tq, c.p.i[3] = Tk;
    /* heads inside rows, as in q: o is [..., Tq, H, Dv] row-major, handed
     * out as its view [..., H, Tq, Dv] (whose permute back to [B, Tq, H *
     * Dv] is a view, no copy) */
    bool inside = nt__attn_heads_inside(q);
    c.p.i[4] = inside;
    c.nout = 2;
    c.odt[0] = (nt_dtype)q->dtype;
    c.odt[1] = NT_F32;
    c.ondim[0] = nd;
    c.ondim[1] = nd - 1;
    for (int i = 0; i < nd - 2; i++)
        c.oshape[0][i] = c.oshape[1][i] = q->shape[i];
    c.oshape[0][nd - 2] = c.oshape[1][nd - 2] = Tq;
    c.oshape[0][nd - 1] = Dv;
    if (inside) {
        c.oshape[0][nd - 3] = Tq;
        c.oshape[0][nd - 2] = q->shape[nd - 3];
    }
    double nb = (double)nt__numel(nd - 2, q->shape);
    c.flops = 2.0 * nb * (double)Tq * (double)Tk * (double)(D + Dv);
    nt_tensor *o = nt__dispatch(&c);
    /* the log-sum-exp is the backward's (autograd saved it): the caller
     * never sees it */
    if (!o)
        return NULL;
    nt_release(c.out[1]);
    if (!inside)
        return o;
    nt_tensor *t = nt_transpose_at(site, o, nd - 3, nd - 2);
    nt_release(o);
    return t;
}

NT_API nt_tensor *nt_scaled_dot_product_attention(nt_tensor *q, nt_tensor *k, nt_tensor *v,
                                                  nt_tensor *mask, bool causal, double scale)
{
    return nt_scaled_dot_product_attention_at(NT_RA_SITE, q, k, v, mask, causal, scale);
}
