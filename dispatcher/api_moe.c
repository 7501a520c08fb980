/* dispatcher/api_moe.c - the grouped matmul of mixture-of-experts layers:
 * nt_grouped_mm and the kernel ops grouped_mm and grouped_mm_wgrad
 * (core/optable.h; cpu/moe.c, neuron/moe.c; docs/ops.md, "Grouped matmul").
 *
 * x's rows come in consecutive runs of counts[e] rows (i32, on the device;
 * the kernels read them when they run, so issuing needs no host sync) and
 * run e is multiplied by w[e], each run exactly nt_matmul's arithmetic.
 * Both ops are differentiable (autograd/backward.c): grouped_mm's
 * gradients are a grouped_mm with w read the other way and a
 * grouped_mm_wgrad; grouped_mm_wgrad's are two grouped_mm -- so double
 * backward works too. */
#include <stdio.h>
#include <string.h>

#include "dispatcher/dispatch.h"

nt_tensor *nt__grouped_mm(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                          nt_tensor *counts, bool tr, bool no_grad)
{
    nt__call c;
    nt_tensor *in[3] = {x ? nt_contiguous_at(site, x) : NULL, w ? nt_contiguous_at(site, w) : NULL,
                        counts};
    if (!in[0] || !in[1])
        return NULL;
    if (!nt__call_begin(&c, site, fn, NT_OP_GMM, 3, in, "x,w,counts"))
        return nt__call_fail(&c);
    c.p.dim = tr;
    c.no_grad = no_grad;
    c.odt[0] = (nt_dtype)in[0]->dtype;
    c.ondim[0] = 2;
    c.oshape[0][0] = in[0]->shape[0];
    c.oshape[0][1] = in[1]->shape[tr ? 1 : 2];
    c.flops = 2.0 * (double)in[0]->shape[0] * (double)in[1]->shape[1] * (double)in[1]->shape[2];
    return nt__dispatch(&c);
}

nt_tensor *nt__grouped_mm_wgrad(const nt_site *site, const char *fn, nt_tensor *x,
                                nt_tensor *gy, nt_tensor *counts, bool no_grad)
{
    nt__call c;
    nt_tensor *in[3] = {x ? nt_contiguous_at(site, x) : NULL,
                        gy ? nt_contiguous_at(site, gy) : NULL, counts};
    if (!in[0] || !in[1] || !counts)
        return NULL;
    if (!nt__call_begin(&c, site, fn, NT_OP_GMM_WGRAD, 3, in, "x,grad,counts"))
        return nt__call_fail(&c);
    c.no_grad = no_grad;
    c.odt[0] = (nt_dtype)in[0]->dtype;
    c.ondim[0] = 3;
    c.oshape[0][0] = counts->shape[0];
    c.oshape[0][1] = in[0]->shape[1];
    c.oshape[0][2] = in[1]->shape[1];
    c.flops = 2.0 * (double)in[0]->shape[0] * (double)in[0]->shape[1] * (double)in[1]->shape[1];
    return nt__dispatch(&c);
}

static int gmm_check(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                     nt_tensor *counts)
{
    if (!nt__check_arg(site, fn, "x", x) || !nt__check_arg(site, fn, "w", w) ||
        !nt__check_arg(site, fn, "counts", counts))
        return nt_last_error();
    char a[128], b[128];
    nt_dtype dt = (nt_dtype)x->dtype;
    if (dt != NT_F32 && dt != NT_BF16)
        return nt__err(site, NT_EDTYPE, fn, "x is %s; expected f32 or bf16", nt_dtype_name(dt));
    if (w->dtype != x->dtype)
        return nt__err(site, NT_EDTYPE, fn, "w is %s; expected %s (x's dtype)",
                       nt_dtype_name((nt_dtype)w->dtype), nt_dtype_name(dt));
    if (counts->dtype != NT_I32)
        return nt__err(site, NT_EDTYPE, fn, "counts is %s; expected i32",
                       nt_dtype_name((nt_dtype)counts->dtype));
    if (x->ndim != 2 || w->ndim != 3 || w->shape[1] != x->shape[1])
        return nt__err(site, NT_ESHAPE, fn, "x has shape %s and w %s; expected x [M, K] and w "
                       "[E, K, N]", nt__shape_str(x->ndim, x->shape, a, sizeof a),
                       nt__shape_str(w->ndim, w->shape, b, sizeof b));
    if (counts->ndim != 1 || counts->shape[0] != w->shape[0])
        return nt__err(site, NT_ESHAPE, fn, "counts has shape %s; expected [%lld] (w's experts)",
                       nt__shape_str(counts->ndim, counts->shape, a, sizeof a),
                       (long long)w->shape[0]);
    if (x->shape[0] > INT32_MAX || x->shape[1] > INT32_MAX || w->shape[2] > INT32_MAX)
        return nt__err(site, NT_ESHAPE, fn, "x has shape %s and w %s: a dim past 2^31 - 1",
                       nt__shape_str(x->ndim, x->shape, a, sizeof a),
                       nt__shape_str(w->ndim, w->shape, b, sizeof b));
    return 0;
}

nt_tensor *nt_grouped_mm_at(const nt_site *site, nt_tensor *x, nt_tensor *w, nt_tensor *counts)
{
    const char *fn = "nt_grouped_mm";
    if (gmm_check(site, fn, x, w, counts))
        return NULL;
    return nt__grouped_mm(site, fn, x, w, counts, false, false);
}

#undef nt_grouped_mm
NT_API nt_tensor *nt_grouped_mm(nt_tensor *x, nt_tensor *w, nt_tensor *counts)
{
    return nt_grouped_mm_at(NT_RA_SITE, x, w, counts);
}
