/* autograd/clip.c - nt_clip_grad_norm: torch.nn.utils.clip_grad_norm_ (L2)
 * built from ops, so it runs on the device with no host sync:
 *   n_i   = nt_norm(g_i, 2) over all of g_i (f32; a bf16/f16 g_i widened first;
 *           an f64 g_i: sqrt(sum(g_i * g_i)) in double, and then every n_i
 *           widened to f64 and total, coef in double: an f64 total),
 *           computed by grad_norms for up to 4 gradients of a device at a time
 *           (one kernel, each norm's bits those of nt_norm)
 *   total = nt_norm([n_0, n_1, ...], 2)        (PyTorch: the norm of the stack)
 *   coef  = min(reciprocal(total + 1e-6) * max_norm, 1)
 *                                              (PyTorch's max_norm / t is t.reciprocal() * max_norm)
 *   g_i  *= coef, in place                     (by 1 exactly when not clipping)
 * Parameters without a .grad are skipped; with none, total is 0.
 *
 * Devices, as PyTorch does with gradients on several: each n_i is computed
 * on g_i's device and copied to the calling thread's device, where total
 * and coef are; coef is copied to each other device that holds a gradient
 * (copies are exact, so the bits are those of one device). */
#include "autograd/autograd.h"

#include <math.h>

static bool clip_param(const char *fn, const char *arg, nt_tensor *const *ps, int i)
{
    nt_tensor *t = ps[i];
    if (!nt__dtype_is_float((nt_dtype)t->dtype)) {
        nt__err(NULL, NT_EDTYPE, fn, "argument '%s' is %s; parameters must be floating", arg,
                nt_dtype_name((nt_dtype)t->dtype));
        return false;
    }
    for (int j = 0; j < i; j++)
        if (ps[j] == t) {
            nt__err(NULL, NT_EINVAL, fn,
                    "argument 'params' lists the same tensor at %d and %d (its gradient would "
                    "count twice)", j, i);
            return false;
        }
    return true;
}

/* The L2 norm of all of an f64 g in double, shape [1]: sqrt of the
 * canonical f64 sum of the squares (nt_norm takes no f64). */
static nt_tensor *norm64(const nt_site *site, const char *fn, nt_tensor *g)
{
    nt_tensor *sq = nt__binary(site, fn, NT_OP_MUL, g, g);
    nt_tensor *s = sq ? nt__reduce(site, fn, NT_OP_SUM, sq, NT_DIM_ALL, false) : NULL;
    nt_tensor *r = s ? nt__unary(site, fn, NT_OP_SQRT, s) : NULL;
    return r ? nt_reshape_at(site, r, 1, (const int64_t[]){1}) : NULL;
}

NT_API nt_tensor *nt_clip_grad_norm_at(const nt_site *site, nt_tensor *const *params, int n,
                                       double max_norm)
{
    const char *fn = "nt_clip_grad_norm";
    if (!nt__ensure_init())
        return NULL;
    if (!params || n < 0) {
        nt__err(site, NT_EINVAL, fn, "argument '%s' is %s; expected an array of n >= 0 tensors",
                params ? "n" : "params", params ? "< 0" : "NULL");
        return NULL;
    }
    if (!(max_norm > 0)) {
        nt__err(site, NT_EINVAL, fn, "argument 'max_norm' is %g; expected a value > 0", max_norm);
        return NULL;
    }
    if (n > 0 && !nt__check_list(fn, params, n, "parameter", clip_param))
        return NULL;
    nt_tensor **norms = calloc((size_t)n + 1, sizeof *norms);
    if (!norms) {
        nt__err_hostmem(site, fn, "the list of norms");
        return NULL;
    }
    nt_no_grad_begin();
    nt_scope *sc = nt_scope_begin();
    if (!sc) {
        nt_no_grad_end();
        free(norms);
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    int here = nt_device_current();
    int k = 0, rc = 0;
    bool any64 = false; /* an f64 gradient: the total and coef in double */
    int at = 0;
    while (at < n && !rc) { /* up to 4 gradients of one device per grad_norms */
        nt_tensor *gs[4];
        int m = 0, dev = -1;
        for (; at < n && m < 4; at++) {
            nt_tensor *g = params[at]->ag ? params[at]->ag->grad : NULL;
            if (!g)
                continue;
            if (m > 0 && (g->dev != dev || g->dtype == NT_F64))
                break;
            dev = g->dev;
            gs[m++] = g;
            if (g->dtype == NT_F64) { /* alone, in double */
                at++;
                break;
            }
        }
        if (m == 0)
            break;
        nt__devsw dv;
        nt__dev_enter(&dv, dev);
        bool g64 = gs[0]->dtype == NT_F64;
        any64 |= g64;
        for (int j = 0; j < m && !g64; j++)
            if (gs[j] && gs[j]->dtype != NT_F32)
                gs[j] = nt__copy_to(site, fn, gs[j], NT_F32);
        nt_tensor *ni = g64 ? norm64(site, fn, gs[0]) : nt__grad_norms(site, fn, gs, m);
        norms[k] = ni && dev != here ? nt_to_device_at(site, ni, here) : ni;
        nt__dev_leave(&dv);
        if (!norms[k++])
            rc = nt__err_or(NT_EINVAL);
    }
    nt_tensor *total = NULL;
    if (!rc && any64) {
        for (int j = 0; j < k && !rc; j++)
            if (norms[j]->dtype != NT_F64 && !(norms[j] = nt__copy_to(site, fn, norms[j], NT_F64)))
                rc = nt__err_or(NT_EINVAL);
        total = rc ? NULL : norm64(site, fn, k == 1 ? norms[0] : nt_cat_at(site, norms, k, 0));
        total = total ? nt_reshape_at(site, total, 0, NULL) : NULL;
    } else if (!rc) {
        total = k == 0 ? nt_zeros_at(site, NT_F32, 0, NULL)
                       : nt_norm_at(site, k == 1 ? norms[0] : nt_cat_at(site, norms, k, 0), 2.0,
                                    NT_DIM_ALL, false);
    }
    if (total && k > 0) {
        nt_tensor *coef = nt__scalar(
            site, fn, NT_OP_CLAMP,
            nt__scalar(site, fn, NT_OP_MUL_SCALAR,
                       nt__unary(site, fn, NT_OP_RECIPROCAL,
                                 nt__scalar(site, fn, NT_OP_ADD_SCALAR, total, 1e-6, 0)),
                       max_norm, 0),
            -INFINITY, 1.0);
        nt_tensor *on[NT_MAX_DEVICES] = {0}; /* coef's copy on each device */
        if (coef)
            on[here] = coef;
        for (int i = 0; i < n && !rc; i++) {
            nt_tensor *g = params[i]->ag ? params[i]->ag->grad : NULL;
            if (!g)
                continue;
            if (coef && !on[g->dev])
                on[g->dev] = nt_to_device_at(site, coef, g->dev);
            nt__devsw dv;
            nt__dev_enter(&dv, g->dev);
            nt_tensor *c = on[g->dev];
            if (c && g->dtype != c->dtype)
                c = nt__copy_to(site, fn, c, (nt_dtype)g->dtype);
            rc = c ? nt_mul_inplace_at(site, g, c) : (nt__err_or(NT_EINVAL));
            nt__dev_leave(&dv);
        }
    }
    if (total && !rc)
        nt_keep(total);
    else
        total = NULL;
    if (!total)
        nt__err_within(fn); /* an inner op's error (nt_norm, nt_cat ...): say whose */
    nt_scope_end(sc);
    nt_no_grad_end();
    free(norms);
    /* the caller's open scope owns it, as it owns any op's result (a
     * caller who ignores the norm, as PyTorch users do, leaks nothing) */
    return nt__scope_adopt(total, fn);
}
NT_API nt_tensor *nt_clip_grad_norm(nt_tensor *const *params, int n, double max_norm)
{
    return nt_clip_grad_norm_at(NT_RA_SITE, params, n, max_norm);
}

/* torch.nn.utils.clip_grad_value_: each .grad clamped in place, on its
 * device; every argument is checked before any gradient changes. */
NT_API int nt_clip_grad_value_at(const nt_site *site, nt_tensor *const *params, int n, double clip)
{
    const char *fn = "nt_clip_grad_value";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!params || n < 0)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is %s; expected an array of n >= 0 "
                       "tensors", params ? "n" : "params", params ? "< 0" : "NULL");
    if (!(clip >= 0))
        return nt__err(site, NT_EINVAL, fn, "argument 'clip' is %g; expected a value >= 0", clip);
    if (n > 0 && !nt__check_list(fn, params, n, "parameter", clip_param))
        return nt_last_error();
    int rc = 0;
    nt_no_grad_begin();
    for (int i = 0; i < n && !rc; i++) {
        nt_tensor *g = params[i]->ag ? params[i]->ag->grad : NULL;
        if (!g)
            continue;
        nt__devsw dv;
        nt__dev_enter(&dv, g->dev);
        rc = nt_clamp_inplace_at(site, g, -clip, clip);
        nt__dev_leave(&dv);
    }
    nt_no_grad_end();
    if (rc)
        nt__err_within(fn);
    return rc;
}
NT_API int nt_clip_grad_value(nt_tensor *const *params, int n, double clip)
{
    return nt_clip_grad_value_at(NT_RA_SITE, params, n, clip);
}
