/* autograd/gradgradcheck.c - second derivatives against central
 * differences of the first (torch.autograd.gradgradcheck).
 *
 * The checked function is the first-order gradient itself,
 *   G(x, v) = d/dx <f(x), v>   (nt_autograd_grad with v as grad_output),
 * reduced to a scalar with fixed pseudo-random weights u_i, as nt_gradcheck
 * reduces f:  L(x, v) = sum_i <G_i(x, v), u_i>.  Its analytic gradient with
 * respect to every x_i and to v comes from a double backward (G recorded
 * with create_graph, then differentiated); its numeric one from central
 * differences of L, each evaluation a plain first-order backward.  As in
 * nt_gradcheck, an f64 input makes the whole check f64 (L, u, the host
 * copies and the perturbations); else it runs in f32. */
#include "autograd/autograd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GG_MAX_IN 16

typedef struct {
    nt_tensor *(*f)(nt_tensor *const *in, void *ctx);
    void *ctx;
    int n;
    nt_dtype cdt;             /* NT_F64 if an input is f64, else NT_F32 */
    nt_tensor *u[GG_MAX_IN]; /* the weights of G_i (cdt, x_i's shape) */
} gg_t;

/* L(in, v) as a tensor (a cdt scalar), G recorded when create.  An input that
 * f does not use (or v) contributes 0. */
static nt_tensor *gg_loss(gg_t *c, nt_tensor *const *in, nt_tensor *v, bool create)
{
    nt__user_code_begin();
    nt_tensor *y = c->f(in, c->ctx);
    nt__user_code_end();
    if (!y)
        return NULL;
    if (!nt_requires_grad(y)) { /* f ignores its inputs: G is 0 */
        nt_tensor *z = nt_zeros(c->cdt, 0, NULL);
        return z;
    }
    nt_tensor *g[GG_MAX_IN] = {0}, *L = NULL;
    /* (a recorded G keeps f's graph: its backward goes through it) */
    if (nt_autograd_grad(&y, 1, in, c->n, &v, create, create, true, g))
        return NULL;
    for (int i = 0; i < c->n; i++) {
        if (!g[i])
            continue;
        nt_tensor *d = nt_sum(nt_mul(nt_cast(g[i], c->cdt), c->u[i]), NT_DIM_ALL, false);
        L = L ? nt_add(L, d) : d;
        if (!L)
            return NULL;
    }
    return L ? L : nt_zeros(c->cdt, 0, NULL);
}

/* L as a double with x_i (i < n) or v (i == n) replaced by p. */
static int gg_eval(gg_t *c, nt_tensor *const *in, nt_tensor *v, int i, nt_tensor *p, double *out)
{
    nt_scope *s = nt_scope_begin();
    if (!s)
        return nt__err_hostmem(NULL, "nt_gradgradcheck", "a scope");
    nt_tensor *xs[GG_MAX_IN];
    for (int j = 0; j < c->n; j++)
        xs[j] = j == i ? p : in[j];
    int rc = nt_set_requires_grad(p, true);
    nt_tensor *L = rc ? NULL : gg_loss(c, xs, i == c->n ? p : v, false);
    if (!rc)
        rc = L ? nt_item(L, out) : (nt__err_or(NT_EEXEC));
    nt_scope_end(s);
    return rc;
}

/* Host copy of t in cdt (malloc'd; zeros for NULL), or NULL with the error
 * set. */
static char *gg_host(nt_tensor *t, int64_t ne, nt_dtype cdt)
{
    size_t es = nt__dtype_size(cdt);
    char *h = malloc((size_t)(ne ? ne : 1) * es);
    if (!h) {
        nt__err_hostmem(NULL, "nt_gradgradcheck", "the host copy of an input");
        return NULL;
    }
    if (!t) {
        memset(h, 0, (size_t)(ne ? ne : 1) * es);
        return h;
    }
    nt_tensor *tf = nt_cast(t, cdt);
    if (!tf || nt_to_host(tf, h, (size_t)ne * es)) {
        free(h);
        return NULL;
    }
    return h;
}

/* Element by element: the analytic d L / d t (ga) against central
 * differences; t is input i (i == n: the grad_output v). */
static int gg_compare(gg_t *c, nt_tensor *const *in, nt_tensor *v, int i, nt_tensor *ga_t,
                      double eps, double atol, double rtol)
{
    const char *fn = "nt_gradgradcheck";
    nt_tensor *t = i < c->n ? in[i] : v;
    int64_t ne = nt_numel(t);
    char *h = gg_host(t, ne, c->cdt), *ga = h ? gg_host(ga_t, ne, c->cdt) : NULL;
    int rc = ga ? 0 : nt_last_error();
    for (int64_t k = 0; k < ne && !rc; k++) {
        double l[2] = {0, 0};
        double keep = nt__load_f64(h, c->cdt, k);
        for (int sgn = 0; sgn < 2 && !rc; sgn++) {
            nt_scope *s = nt_scope_begin();
            if (!s) {
                rc = nt__err_hostmem(NULL, fn, "a scope");
                break;
            }
            /* f32: the perturbation rounded to f32, as nt_gradcheck's */
            double pv = c->cdt == NT_F64 ? keep + (sgn ? -eps : eps)
                                         : (double)((float)keep + (float)(sgn ? -eps : eps));
            nt__store_f64(h, c->cdt, k, pv);
            nt_tensor *p = nt_from_host(h, c->cdt, t->ndim, t->shape);
            p = p ? nt_detach(nt_cast(p, (nt_dtype)t->dtype)) : NULL;
            rc = p ? gg_eval(c, in, v, i, p, &l[sgn]) : nt_last_error();
            nt_scope_end(s);
        }
        nt__store_f64(h, c->cdt, k, keep);
        if (rc)
            break;
        double num = (l[0] - l[1]) / (2 * eps), ana = nt__load_f64(ga, c->cdt, k);
        if (!(fabs(ana - num) <= atol + rtol * fabs(num))) {
            char what[32];
            if (i < c->n)
                snprintf(what, sizeof what, "input %d", i);
            else
                snprintf(what, sizeof what, "grad_output");
            rc = nt__err(NULL, NT_ERANGE, fn,
                         "%s element %lld: analytic second derivative %.6g, numeric %.6g "
                         "(|diff| %.3g > atol %.3g + rtol %.3g * |numeric|)",
                         what, (long long)k, ana, num, fabs(ana - num), atol, rtol);
        }
    }
    free(h);
    free(ga);
    return rc;
}

static int gg_args(nt_tensor *(*f)(nt_tensor *const *, void *), nt_tensor *const *in, int n,
                   double eps)
{
    const char *fn = "nt_gradgradcheck";
    if (!f)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'f' is NULL; expected a function");
    if (!in || n < 1 || n > GG_MAX_IN)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'n' is %d (in %s); expected 1..%d inputs",
                       n, in ? "given" : "NULL", GG_MAX_IN);
    if (!(eps > 0) || !isfinite(eps))
        return nt__err(NULL, NT_EINVAL, fn, "argument 'eps' is %g; expected a finite eps > 0", eps);
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "in[%d]", i);
        if (!nt__check_arg(NULL, fn, name, in[i]))
            return nt_last_error();
        if (!nt_requires_grad(in[i]))
            return nt__err(NULL, NT_EINVAL, fn, "argument 'in[%d]' does not require grad", i);
    }
    return 0;
}

/* v: grad_output (checked against y) or a pseudo-random one of y's shape,
 * a leaf that requires grad either way. */
static nt_tensor *gg_grad_output(nt_tensor *y, nt_tensor *grad_output)
{
    const char *fn = "nt_gradgradcheck";
    nt_tensor *v;
    if (grad_output) {
        if (!nt__check_arg(NULL, fn, "grad_output", grad_output))
            return NULL;
        char s1[128], s2[128];
        if (!nt__dtype_is_float((nt_dtype)grad_output->dtype) || grad_output->ndim != y->ndim ||
            memcmp(grad_output->shape, y->shape, (size_t)y->ndim * sizeof *y->shape)) {
            nt__err(NULL, NT_ESHAPE, fn,
                    "argument 'grad_output' is %s %s; expected a floating tensor of f's output "
                    "shape %s", nt_dtype_name((nt_dtype)grad_output->dtype),
                    nt__shape_str(grad_output->ndim, grad_output->shape, s1, sizeof s1),
                    nt__shape_str(y->ndim, y->shape, s2, sizeof s2));
            return NULL;
        }
        v = nt_detach(nt_cast(grad_output, (nt_dtype)y->dtype));
    } else {
        v = nt_cast(nt_randn(NT_F32, y->ndim, y->shape, 0xbb67ae8584caa73bull), (nt_dtype)y->dtype);
        v = v ? nt_detach(v) : NULL;
    }
    if (v && nt_set_requires_grad(v, true))
        return NULL;
    return v;
}

NT_API int nt_gradgradcheck(nt_tensor *(*f)(nt_tensor *const *in, void *ctx),
                            nt_tensor *const *in, int n, void *ctx, nt_tensor *grad_output,
                            double eps, double atol, double rtol)
{
    const char *fn = "nt_gradgradcheck";
    if (!nt__ensure_init())
        return nt_last_error();
    int rc = gg_args(f, in, n, eps);
    if (rc)
        return rc;
    nt_scope *s = nt_scope_begin();
    if (!s)
        return nt__err_hostmem(NULL, fn, "a scope");
    gg_t c = {.f = f, .ctx = ctx, .n = n, .cdt = NT_F32};
    for (int i = 0; i < n; i++)
        if (in[i]->dtype == NT_F64)
            c.cdt = NT_F64;
    nt__user_code_begin();
    nt_tensor *y = f(in, ctx);
    nt__user_code_end();
    nt_tensor *v = NULL, *L = NULL, *ga[GG_MAX_IN + 1] = {0}, *wrt[GG_MAX_IN + 1];
    if (!y && !nt_last_error()) {
        rc = nt__err(NULL, NT_EINVAL, fn, "f returned NULL without an error; expected its result");
        goto out;
    }
    if (!y || !(v = gg_grad_output(y, grad_output))) {
        rc = nt__err_or(NT_EEXEC);
        goto out;
    }
    for (int i = 0; i < n && !rc; i++) {
        c.u[i] = nt_cast(nt_randn(NT_F32, in[i]->ndim, in[i]->shape,
                                  0x3c6ef372fe94f82bull + (uint64_t)i), c.cdt);
        if (!c.u[i])
            rc = nt_last_error();
        wrt[i] = in[i];
    }
    wrt[n] = v;
    /* analytic: the double backward of L */
    if (!rc && !(L = gg_loss(&c, in, v, true)))
        rc = nt__err_or(NT_EEXEC);
    if (!rc && nt_requires_grad(L))
        rc = nt_autograd_grad(&L, 1, wrt, n + 1, NULL, false, false, true, ga);
    /* (L without a graph: every second derivative is 0, ga stays NULL) */
    for (int i = 0; i <= n && !rc; i++)
        rc = gg_compare(&c, in, v, i, ga[i], eps, atol, rtol);
out:
    if (rc)
        nt__err_within(fn); /* f's or an inner op's error: say it was a gradgradcheck */
    nt_scope_end(s);
    return rc;
}
