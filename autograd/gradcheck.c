/* autograd/gradcheck.c - analytic gradients against central differences. */
#include "autograd/autograd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* loss = sum(f(x) * w) as a double, graph off, in w's dtype (f32, or f64
 * when an input is f64). */
static int eval_loss(nt_tensor *(*f)(nt_tensor *const *, void *), nt_tensor *const *in, void *ctx,
                     nt_tensor *w, double *out)
{
    nt_scope *s = nt_scope_begin();
    if (!s)
        return nt__err_hostmem(NULL, "nt_gradcheck", "a scope");
    nt_no_grad_begin();
    nt__user_code_begin();
    nt_tensor *y = f(in, ctx);
    nt__user_code_end();
    nt_tensor *l = y ? nt_sum(nt_mul(nt_cast(y, nt_dtype_of(w)), w), NT_DIM_ALL, false) : NULL;
    int rc = l ? nt_item(l, out) : (nt__err_or(NT_EEXEC));
    nt_no_grad_end();
    nt_scope_end(s);
    return rc;
}

NT_API int nt_gradcheck(nt_tensor *(*f)(nt_tensor *const *in, void *ctx), nt_tensor *const *in,
                        int n, void *ctx, double eps, double atol, double rtol)
{
    const char *fn = "nt_gradcheck";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!f || !in || n < 1 || n > 16 || !(eps > 0))
        return nt__err(NULL, NT_EINVAL, fn, "need f, 1..16 inputs and eps > 0");
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "in[%d]", i);
        if (!nt__check_arg(NULL, fn, name, in[i]))
            return nt_last_error();
        if (!nt_requires_grad(in[i]))
            return nt__err(NULL, NT_EINVAL, fn, "in[%d] does not require grad", i);
    }
    /* An f64 input makes the whole check f64: the loss, w, the host copies
     * and the perturbed inputs (PyTorch's gradcheck in double); else f32. */
    nt_dtype cdt = NT_F32;
    for (int i = 0; i < n; i++)
        if (in[i]->dtype == NT_F64)
            cdt = NT_F64;
    size_t es = cdt == NT_F64 ? sizeof(double) : sizeof(float);
    nt_scope *s = nt_scope_begin();
    if (!s)
        return nt__err_hostmem(NULL, fn, "a scope");
    int rc = 0;
    /* analytic */
    nt__user_code_begin();
    nt_tensor *y = f(in, ctx);
    nt__user_code_end();
    if (!y) {
        rc = nt__err_or(NT_EEXEC);
        goto out;
    }
    /* each tensor is worked on on its own device (inputs may be on several) */
    nt__devsw dv;
    nt__dev_enter(&dv, y->dev);
    nt_tensor *w = nt_cast(nt_randn(NT_F32, y->ndim, y->shape, 0x6a09e667f3bcc908ull), cdt);
    for (int i = 0; i < n; i++)
        nt_zero_grad(in[i]);
    nt_tensor *loss = nt_sum(nt_mul(nt_cast(y, cdt), w), NT_DIM_ALL, false);
    nt__dev_leave(&dv);
    if (!loss || (rc = nt_backward(loss)) != 0) {
        rc = rc ? rc : nt_last_error();
        goto out;
    }
    /* numeric, element by element, on host copies in cdt */
    for (int i = 0; i < n && !rc; i++) {
        nt_tensor *x = in[i];
        int64_t ne = nt_numel(x);
        char *h = malloc((size_t)(ne ? ne : 1) * es);
        char *ga = malloc((size_t)(ne ? ne : 1) * es);
        nt_tensor *g = nt_grad(x);
        nt__dev_enter(&dv, x->dev);
        nt_tensor *xf = nt_cast(x, cdt);
        nt_tensor *gf = g ? nt_cast(g, cdt) : NULL;
        nt__dev_leave(&dv);
        if (!h || !ga) {
            rc = nt__err_hostmem(NULL, fn, "the host copies of an input");
        } else if (!xf || nt_to_host(xf, h, (size_t)ne * es)) {
            rc = nt_last_error();
        } else if (g) {
            rc = nt_to_host(gf, ga, (size_t)ne * es);
        } else {
            memset(ga, 0, (size_t)ne * es);
        }
        for (int64_t k = 0; k < ne && !rc; k++) {
            nt_tensor *pert[16];
            double lp = 0, lm = 0;
            double keep = nt__load_f64(h, cdt, k);
            for (int sgn = 0; sgn < 2 && !rc; sgn++) {
                /* f32: the perturbation rounded to f32, as before */
                double v = cdt == NT_F64 ? keep + (sgn ? -eps : eps)
                                         : (double)((float)keep + (float)(sgn ? -eps : eps));
                nt__store_f64(h, cdt, k, v);
                for (int j = 0; j < n; j++)
                    pert[j] = in[j];
                nt__dev_enter(&dv, x->dev);
                pert[i] = nt_cast(nt_from_host(h, cdt, x->ndim, x->shape), (nt_dtype)x->dtype);
                nt__dev_leave(&dv);
                rc = eval_loss(f, pert, ctx, w, sgn ? &lm : &lp);
            }
            nt__store_f64(h, cdt, k, keep);
            if (rc)
                break;
            double num = (lp - lm) / (2 * eps), ana = nt__load_f64(ga, cdt, k);
            if (!(fabs(ana - num) <= atol + rtol * fabs(num))) {
                rc = nt__err(NULL, NT_ERANGE, fn,
                             "input %d element %lld: analytic gradient %.6g, numeric %.6g "
                             "(|diff| %.3g > atol %.3g + rtol %.3g * |numeric|)",
                             i, (long long)k, ana, num, fabs(ana - num), atol, rtol);
            }
        }
        free(h);
        free(ga);
    }
out:
    if (rc)
        nt__err_within(fn); /* f's or an inner op's error: say it was a gradcheck */
    nt_scope_end(s);
    return rc;
}
