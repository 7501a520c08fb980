/* dispatcher/api_norm.c - normalisation over channels:
 * batch_norm and group_norm of [N, C, *] tensors, with PyTorch 1.13's
 * arguments and semantics (docs/ops.md, "Normalisation over channels",
 * gives every step):
 *   batch_norm (training): one kernel op each way on x made contiguous f32,
 *     batch_norm_fwd(x, w, b) -> y, stats [2, C] (per channel the mean and
 *     the sum of squared deviations, canonical sums over the channel's
 *     N * S values in (n, s) order) and, as its backward,
 *     batch_norm_bwd(g, x, stats, w) -> dx, [dw; db] (cpu/bn.c,
 *     neuron/bn.c): the steps of the composite they replaced (layer_norm
 *     over the rows [C, N * S], the affine ops on the rows), so its bits.
 *     The running statistics: rm = rm * (1 - m) + mean * m, rv likewise
 *     with ss / (M - 1), in place (queued ops on [C]);
 *   batch_norm (evaluation): a = w / sqrt(rv + eps), c = b - rm * a per
 *     channel, y = x * a + c (PyTorch's transform);
 *   group_norm: x seen as [N, G, C / G * S] (a view when contiguous),
 *     nt_layer_norm over the rows, then w and b per channel.
 * bf16/f16 x are widened to f32 first and the result rounded once to x's
 * dtype (f32 inside an autocast region: the F32 policy of layer_norm).
 *
 * nt_ddp_batch_norm (dist/ddp.c) is the data-parallel form: per-shard
 * statistics (the kernel's stats), the running update from their shard
 * tree (docs/ddp.md). */
#include <math.h>
#include <string.h>

#include "dispatcher/dispatch.h"

typedef struct nctx {
    const nt_site *site;
    const char *fn;
    nt_scope *sc;
    int64_t N, C, S; /* x as [N, C, S] */
} nctx;

/* x: a floating tensor of >= 2 dims. */
static bool check_x(nctx *P, nt_tensor *x)
{
    if (!nt__ensure_init() || !nt__check_arg(P->site, P->fn, "x", x))
        return false;
    if (!nt__dtype_is_float((nt_dtype)x->dtype)) {
        nt__err(P->site, NT_EDTYPE, P->fn, "argument 'x' has dtype %s; expected f32, bf16 or f16",
                nt_dtype_name((nt_dtype)x->dtype));
        return false;
    }
    if (x->dtype == NT_F64) { /* the statistics' kernels are f32: refused, not narrowed */
        nt__err(P->site, NT_ENOTSUP, P->fn, "argument 'x' is f64, which this normalisation does "
                "not take (it computes in f32: f32, bf16 or f16; docs/ops.md, section 14)");
        return false;
    }
    if (x->ndim < 2) {
        char sb[128];
        nt__err(P->site, NT_ESHAPE, P->fn,
                "argument 'x' has shape %s; expected at least 2 dims [N, C, *]",
                nt__shape_str(x->ndim, x->shape, sb, sizeof sb));
        return false;
    }
    P->N = x->shape[0], P->C = x->shape[1];
    P->S = nt__numel(x->ndim - 2, x->shape + 2);
    return true;
}

/* A per-channel tensor: NULL when opt, else [C] of dtype dt (NT_DTYPE_COUNT:
 * any floating), on x's device. */
static bool check_chan(const nctx *P, nt_tensor *x, nt_tensor *t, const char *arg, bool opt,
                       nt_dtype dt)
{
    if (!t && opt)
        return true;
    if (!t) {
        nt__err(P->site, NT_EINVAL, P->fn, "argument '%s' is NULL; expected a [%lld] f32 tensor",
                arg, (long long)P->C);
        return false;
    }
    if (!nt__check_arg(P->site, P->fn, arg, t))
        return false;
    bool dt_ok = dt == NT_DTYPE_COUNT ? nt__dtype_is_float((nt_dtype)t->dtype) : t->dtype == dt;
    if (!dt_ok) {
        nt__err(P->site, NT_EDTYPE, P->fn, "argument '%s' has dtype %s; expected %s", arg,
                nt_dtype_name((nt_dtype)t->dtype),
                dt == NT_DTYPE_COUNT ? "f32, bf16 or f16" : nt_dtype_name(dt));
        return false;
    }
    if (t->ndim != 1 || t->shape[0] != P->C) {
        char sb[128];
        nt__err(P->site, NT_ESHAPE, P->fn,
                "argument '%s' has shape %s; expected [%lld] (the channels, dim 1 of 'x')", arg,
                nt__shape_str(t->ndim, t->shape, sb, sizeof sb), (long long)P->C);
        return false;
    }
    if (t->dev != x->dev) {
        nt__err(P->site, NT_EINVAL, P->fn, "argument '%s' is on device %d; expected x's device %d",
                arg, (int)t->dev, (int)x->dev);
        return false;
    }
    return true;
}

static bool check_eps(const nctx *P, double eps)
{
    if (eps > 0 && isfinite(eps))
        return true;
    nt__err(P->site, NT_EINVAL, P->fn, "argument 'eps' is %g; expected a finite value > 0", eps);
    return false;
}

bool nt__bn_check(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *rm,
                  nt_tensor *rv, nt_tensor *w, nt_tensor *b, bool training, double momentum,
                  double eps)
{
    nctx P = {.site = site, .fn = fn};
    if (!check_x(&P, x))
        return false;
    if ((rm == NULL) != (rv == NULL)) {
        nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL but '%s' is not; expected both "
                "running statistics or neither", rm ? "running_var" : "running_mean",
                rm ? "running_mean" : "running_var");
        return false;
    }
    if (!training && !rm) {
        nt__err(site, NT_EINVAL, fn, "argument 'running_mean' is NULL; evaluation "
                "(training false) expects running_mean and running_var");
        return false;
    }
    if (!check_chan(&P, x, rm, "running_mean", true, NT_F32) ||
        !check_chan(&P, x, rv, "running_var", true, NT_F32) ||
        !check_chan(&P, x, w, "w", true, NT_DTYPE_COUNT) ||
        !check_chan(&P, x, b, "b", true, NT_DTYPE_COUNT) || !check_eps(&P, eps))
        return false;
    if (!(momentum >= 0 && momentum <= 1)) {
        nt__err(site, NT_EINVAL, fn, "argument 'momentum' is %g; expected 0 <= momentum <= 1",
                momentum);
        return false;
    }
    if (training && P.N * P.S == 1) {
        char sb[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'x' has shape %s: Expected more than 1 value per "
                "channel when training", nt__shape_str(x->ndim, x->shape, sb, sizeof sb));
        return false;
    }
    return true;
}

static bool open_scope(nctx *P)
{
    P->sc = nt_scope_begin();
    if (!P->sc)
        nt__err_hostmem(P->site, P->fn, "a scope");
    return P->sc != NULL;
}

/* Ends the composite: y rounded to x's dtype (f32 under autocast), kept
 * past the scope and handed to the caller's. */
static nt_tensor *norm_end(nctx *P, nt_tensor *y, nt_dtype xdt)
{
    nt_dtype odt = nt_autocast_dtype() != NT_DTYPE_COUNT ? NT_F32 : xdt;
    if (y && y->dtype != odt)
        y = nt__copy_to(P->site, P->fn, y, odt);
    if (y)
        nt_keep(y);
    else
        nt__err_within(P->fn);
    nt_scope_end(P->sc);
    return y ? nt__scope_adopt(y, P->fn) : NULL;
}

static nt_tensor *f32(const nctx *P, nt_tensor *t)
{
    return !t || t->dtype == NT_F32 ? t : nt__copy_to(P->site, P->fn, t, NT_F32);
}

/* A [C] tensor seen as [1, C, 1, ...] for x of ndim dims (as [C, 1] for
 * the rows [C, M]: ndim 0). */
static nt_tensor *chan_view(const nctx *P, nt_tensor *t, int ndim)
{
    int64_t sh[NT_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        sh[i] = 1;
    if (ndim == 0)
        ndim = 2, sh[0] = P->C, sh[1] = 1;
    else
        sh[1] = P->C;
    return t ? nt_reshape_at(P->site, t, ndim, sh) : NULL;
}

/* x's layout: [1, C, 1, ...] expanded to [N, C, 1, ...], so the gradient
 * sums along the last dims first ([N, C, S] -> [N, C, 1], a row sum), then
 * over N (the expand's backward): two fast reductions instead of one over
 * dims {0, 2, ...}, which needs a permuting copy. */
static nt_tensor *per_sample(const nctx *P, nt_tensor *c, bool rows)
{
    if (!c || rows)
        return c;
    int64_t sh[NT_MAX_DIMS];
    for (int i = 0; i < c->ndim; i++)
        sh[i] = c->shape[i];
    sh[0] = P->N;
    return nt_expand_at(P->site, c, c->ndim, sh);
}

/* v * w + b per channel (each optional); a fresh contiguous result.  rows:
 * v is the rows [C, M], else x's layout. */
static nt_tensor *affine(const nctx *P, nt_tensor *v, nt_tensor *w, nt_tensor *b, bool rows)
{
    if (!v)
        return NULL;
    int nd = rows ? 0 : v->ndim;
    if (w)
        v = nt__binary(P->site, P->fn, NT_OP_MUL, v, per_sample(P, chan_view(P, f32(P, w), nd), rows));
    if (v && b)
        v = nt__binary(P->site, P->fn, NT_OP_ADD, v, per_sample(P, chan_view(P, f32(P, b), nd), rows));
    if (v && !w && !b)
        v = nt_contiguous_at(P->site, v);
    return v;
}

int nt__bn_update(const nt_site *site, const char *fn, nt_tensor *r, nt_tensor *stat,
                  double momentum)
{
    nt_tensor *a = nt__scalar(site, fn, NT_OP_MUL_SCALAR, r, 1.0 - momentum, 0);
    nt_tensor *c = a ? nt__scalar(site, fn, NT_OP_MUL_SCALAR, stat, momentum, 0) : NULL;
    nt_tensor *n = c ? nt__binary(site, fn, NT_OP_ADD, a, c) : NULL;
    if (!n)
        return nt__err_or(NT_EINVAL);
    return nt_copy_into_at(site, r, n);
}

/* Issues batch_norm_fwd on xf (f32): y (f32, x's shape), and *stats
 * [2, C] (the per-channel mean and ssd; in the open scope). */
static nt_tensor *bn_fwd(nctx *P, nt_tensor *xf, nt_tensor *w, nt_tensor *b, double eps,
                         nt_tensor **stats)
{
    nt__call c;
    nt_tensor *in[3] = {nt_contiguous_at(P->site, xf), f32(P, w), f32(P, b)};
    if (!in[0] || (w && !in[1]) || (b && !in[2]))
        return NULL;
    if (!nt__call_begin(&c, P->site, P->fn, NT_OP_BN_FWD, 3, in, "x,?w,?b"))
        return nt__call_fail(&c);
    c.p.f[0] = eps;
    c.nout = 2;
    c.odt[0] = c.odt[1] = NT_F32;
    c.ondim[0] = xf->ndim;
    memcpy(c.oshape[0], xf->shape, (size_t)xf->ndim * sizeof(int64_t));
    c.ondim[1] = 2;
    c.oshape[1][0] = 2, c.oshape[1][1] = P->C;
    c.flops = 10.0 * (double)(P->N * P->C * P->S);
    nt_tensor *y = nt__dispatch(&c);
    *stats = y ? c.out[1] : NULL;
    return y;
}

/* Row i of stats [2, C] as [C] (a view). */
static nt_tensor *stat_row(const nt_site *site, nt_tensor *st, int i)
{
    nt_tensor *r = st ? nt_slice_at(site, st, 0, i, i + 1, 1) : NULL;
    return r ? nt_reshape_at(site, r, 1, (int64_t[]){st->shape[1]}) : NULL;
}

int nt__bn_grads(const nt_site *site, double eps, nt_tensor *g, nt_tensor *x, nt_tensor *w,
                 nt_tensor *stats, const bool live[3], nt_tensor **gin)
{
    const char *fn = "nt_batch_norm";
    nt__call c;
    if (g && g->dtype != NT_F32)
        g = nt_cast_at(site, g, NT_F32);
    nt_tensor *in[4] = {g ? nt_contiguous_at(site, g) : NULL, x, stats, w};
    if (!in[0])
        return nt__err_or(NT_EINVAL);
    if (!nt__call_begin(&c, site, fn, NT_OP_BN_BWD, 4, in, "grad,x,stats,?w")) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    c.no_grad = true;
    c.p.f[0] = eps;
    c.nout = 2;
    c.odt[0] = c.odt[1] = NT_F32;
    c.ondim[0] = x->ndim;
    memcpy(c.oshape[0], x->shape, (size_t)x->ndim * sizeof(int64_t));
    c.ondim[1] = 2;
    c.oshape[1][0] = 2, c.oshape[1][1] = x->shape[1];
    c.flops = 14.0 * (double)nt__numel(x->ndim, x->shape);
    nt_tensor *dx = nt__dispatch(&c);
    if (!dx)
        return nt__err_or(NT_EINVAL);
    nt_tensor *dwb = c.out[1];
    if (live[0])
        gin[0] = dx;
    if (live[1] && !(gin[1] = stat_row(site, dwb, 0)))
        return nt_last_error();
    if (live[2] && !(gin[2] = stat_row(site, dwb, 1)))
        return nt_last_error();
    return 0;
}

/* Training: y; with rm, the running statistics updated; with *smean (the
 * data-parallel form), the batch's mean and ssd returned there instead. */
static nt_tensor *bn_train(nctx *P, nt_tensor *xf, nt_tensor *rm, nt_tensor *rv, nt_tensor *w,
                           nt_tensor *b, double momentum, double eps, nt_tensor **smean,
                           nt_tensor **sssd)
{
    nt_tensor *stats = NULL;
    nt_tensor *y = bn_fwd(P, xf, w, b, eps, &stats);
    if (y && smean) {
        *smean = stat_row(P->site, stats, 0), *sssd = stat_row(P->site, stats, 1);
        return *smean && *sssd ? y : NULL;
    }
    if (y && rm && P->N * P->S > 0) { /* an empty batch leaves them, as PyTorch */
        nt_tensor *mean = stat_row(P->site, stats, 0), *ssd = stat_row(P->site, stats, 1), *var;
        if (!mean || !ssd ||
            !(var = nt__scalar(P->site, P->fn, NT_OP_DIV_SCALAR, ssd,
                               (double)(P->N * P->S - 1), 0)) ||
            nt__bn_update(P->site, P->fn, rm, mean, momentum) ||
            nt__bn_update(P->site, P->fn, rv, var, momentum))
            return NULL;
    }
    return y;
}

/* a = w / sqrt(rv + eps) (1 / sqrt without w), c = b - rm * a; x * a + c. */
static nt_tensor *bn_eval(nctx *P, nt_tensor *xf, nt_tensor *rm, nt_tensor *rv, nt_tensor *w,
                          nt_tensor *b, double eps)
{
    const nt_site *S = P->site;
    const char *fn = P->fn;
    nt_tensor *e = nt__scalar(S, fn, NT_OP_ADD_SCALAR, rv, eps, 0);
    nt_tensor *r = e ? nt__unary(S, fn, NT_OP_RECIPROCAL, nt__unary(S, fn, NT_OP_SQRT, e)) : NULL;
    nt_tensor *a = r && w ? nt__binary(S, fn, NT_OP_MUL, r, f32(P, w)) : r;
    nt_tensor *ma = a ? nt__binary(S, fn, NT_OP_MUL, rm, a) : NULL;
    nt_tensor *c = !ma ? NULL
                   : b ? nt__binary(S, fn, NT_OP_SUB, f32(P, b), ma)
                       : nt__unary(S, fn, NT_OP_NEG, ma);
    nt_tensor *y = c ? nt__binary(S, fn, NT_OP_MUL, xf, chan_view(P, a, xf->ndim)) : NULL;
    return y ? nt__binary(S, fn, NT_OP_ADD, y, chan_view(P, c, xf->ndim)) : NULL;
}

NT_API nt_tensor *nt_batch_norm_at(const nt_site *site, nt_tensor *x, nt_tensor *running_mean,
                                   nt_tensor *running_var, nt_tensor *w, nt_tensor *b,
                                   bool training, double momentum, double eps)
{
    const char *fn = "nt_batch_norm";
    nctx P = {.site = site, .fn = fn};
    if (!nt__bn_check(site, fn, x, running_mean, running_var, w, b, training, momentum, eps) ||
        !check_x(&P, x) || !open_scope(&P))
        return NULL;
    nt_tensor *xf = f32(&P, x);
    nt_tensor *y = !xf ? NULL
                   : training ? bn_train(&P, xf, running_mean, running_var, w, b, momentum, eps,
                                         NULL, NULL)
                              : bn_eval(&P, xf, running_mean, running_var, w, b, eps);
    return norm_end(&P, y, (nt_dtype)x->dtype);
}

nt_tensor *nt__bn_shard(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                        nt_tensor *b, double eps, nt_tensor **mean, nt_tensor **ssd)
{
    nctx P = {.site = site, .fn = fn};
    *mean = *ssd = NULL;
    if (!check_x(&P, x) || !open_scope(&P))
        return NULL;
    nt_tensor *xf = f32(&P, x);
    nt_tensor *m = NULL, *q = NULL;
    nt_tensor *y = xf ? bn_train(&P, xf, NULL, NULL, w, b, 0.0, eps, &m, &q) : NULL;
    if (y && m && q)
        nt_keep(m), nt_keep(q);
    y = norm_end(&P, y && m && q ? y : NULL, (nt_dtype)x->dtype);
    if (y) {
        *mean = nt__scope_adopt(m, fn), *ssd = nt__scope_adopt(q, fn);
    } else if (m && q) {
        nt_release(m), nt_release(q);
    }
    return y;
}
NT_API nt_tensor *nt_batch_norm(nt_tensor *x, nt_tensor *running_mean, nt_tensor *running_var,
                                nt_tensor *w, nt_tensor *b, bool training, double momentum,
                                double eps)
{
    return nt_batch_norm_at(NT_RA_SITE, x, running_mean, running_var, w, b, training, momentum,
                            eps);
}

NT_API nt_tensor *nt_group_norm_at(const nt_site *site, nt_tensor *x, int64_t num_groups,
                                   nt_tensor *w, nt_tensor *b, double eps)
{
    nctx P = {.site = site, .fn = "nt_group_norm"};
    if (!check_x(&P, x))
        return NULL;
    if (num_groups <= 0 || P.C % num_groups != 0) {
        nt__err(site, NT_EINVAL, P.fn, "argument 'num_groups' is %lld; expected a positive "
                "divisor of the %lld channels (dim 1 of 'x')", (long long)num_groups,
                (long long)P.C);
        return NULL;
    }
    if (!check_chan(&P, x, w, "w", true, NT_DTYPE_COUNT) ||
        !check_chan(&P, x, b, "b", true, NT_DTYPE_COUNT) || !check_eps(&P, eps) ||
        !open_scope(&P))
        return NULL;
    nt_tensor *xf = f32(&P, x);
    int64_t gsh[3] = {P.N, num_groups, P.C / num_groups * P.S};
    nt_tensor *g = xf ? nt_reshape_at(site, xf, 3, gsh) : NULL;
    nt_tensor *xh = g ? nt_layer_norm_at(site, g, NULL, NULL, eps) : NULL;
    nt_tensor *v = xh ? nt_reshape_at(site, xh, x->ndim, x->shape) : NULL;
    return norm_end(&P, affine(&P, v, w, b, false), (nt_dtype)x->dtype);
}
NT_API nt_tensor *nt_group_norm(nt_tensor *x, int64_t num_groups, nt_tensor *w, nt_tensor *b,
                                double eps)
{
    return nt_group_norm_at(NT_RA_SITE, x, num_groups, w, b, eps);
}

/* Gradient clipping's per-parameter norms, k (1..4) at a time: one
 * grad_norms kernel, y[j] = nt_norm(g[j], 2) over all of g[j] with the
 * same bits (the f32 g[j] on one device, the current one). */
nt_tensor *nt__grad_norms(const nt_site *site, const char *fn, nt_tensor *const *g, int k)
{
    nt__call c;
    nt_tensor *in[4] = {0};
    for (int j = 0; j < k && j < 4; j++)
        if (!(in[j] = g[j]))
            return NULL; /* a widening copy failed: its error is set */
    if (!nt__call_begin(&c, site, fn, NT_OP_GRAD_NORMS, 4, in, "g0,?g1,?g2,?g3"))
        return nt__call_fail(&c);
    c.no_grad = true;
    c.nout = 1;
    c.odt[0] = NT_F32;
    c.ondim[0] = 1;
    c.oshape[0][0] = k;
    double n = 0;
    for (int j = 0; j < k; j++)
        n += (double)nt__numel(g[j]->ndim, g[j]->shape);
    c.flops = 2.0 * n;
    return nt__dispatch(&c);
}
