/* dispatcher/api_nn.c - reductions, row ops (softmax family, norms), losses,
 * matmul, linear, embedding. */
#include <math.h>
#include <string.h>

#include "dispatcher/dispatch.h"
#include "core/rng.h"
#include "core/tlkey.h"
#include "fusion/graph.h"

static bool need_float(nt__call *c, nt_tensor *t, const char *arg)
{
    if (nt__dtype_is_float((nt_dtype)t->dtype))
        return nt__no_fp8(c->site, c->fn, arg, t);
    nt__err(c->site, NT_EDTYPE, c->fn, "argument '%s' has dtype %s; expected f32, bf16 or f16",
            arg, nt_dtype_name((nt_dtype)t->dtype));
    return false;
}

static bool need_int(nt__call *c, nt_tensor *t, const char *arg)
{
    if (!nt__dtype_is_float((nt_dtype)t->dtype))
        return true;
    nt__err(c->site, NT_EDTYPE, c->fn, "argument '%s' has dtype %s; expected i32, i64 or u8", arg,
            nt_dtype_name((nt_dtype)t->dtype));
    return false;
}

static bool norm_dim(nt__call *c, nt_tensor *t, int dim, int *out)
{
    int nd = t->ndim ? t->ndim : 1; /* a 0-d tensor accepts dim 0 and -1 */
    int d = nt__norm_dim(dim, nd);
    if (d < 0) {
        nt__err(c->site, NT_EDIM, c->fn, "dim %d is out of range for a tensor with %d dims", dim,
                t->ndim);
        return false;
    }
    *out = t->ndim ? d : 0;
    return true;
}

/* ---------------- reductions ---------------- */

/* The reductions; ord is nt_norm's (ignored by the others). */
static nt_tensor *reduce_ord(const nt_site *site, const char *fn, int op, nt_tensor *t, int dim,
                             bool keepdim, double ord)
{
    nt__call c;
    if (!nt__call_begin(&c, site, fn, op, 1, &t, "t"))
        return nt__call_fail(&c);
    t = c.in[0];
    nt_dtype dt = (nt_dtype)t->dtype;
    if ((op == NT_OP_MEAN || op == NT_OP_NORM) && !need_float(&c, t, "t"))
        return nt__call_fail(&c);
    if (op == NT_OP_NORM && isnan(ord)) {
        nt__err(site, NT_EINVAL, fn, "argument 'ord' is NaN; expected a number or +-INFINITY");
        return nt__call_fail(&c);
    }
    c.p.f[0] = op == NT_OP_NORM ? ord : 0.0;
    if (op == NT_OP_SUM && !nt__dtype_is_float(dt))
        dt = dt == NT_I64 || dt == NT_BOOL ? NT_I64 : NT_I32; /* PyTorch: i64 */
    if (op == NT_OP_ARGMAX || op == NT_OP_ARGMIN)
        dt = NT_I32;
    if (op == NT_OP_ANY)
        dt = NT_U8;
    int64_t n;
    int o = 0;
    if (dim == NT_DIM_ALL) {
        c.p.dim = NT_DIM_ALL;
        n = nt__numel(t->ndim, t->shape);
        if (keepdim)
            for (int i = 0; i < t->ndim; i++)
                c.oshape[0][o++] = 1;
    } else {
        int d;
        if (!norm_dim(&c, t, dim, &d))
            return nt__call_fail(&c);
        c.p.dim = d;
        n = t->ndim ? t->shape[d] : 1;
        for (int i = 0; i < t->ndim; i++) {
            if (i != d)
                c.oshape[0][o++] = t->shape[i];
            else if (keepdim)
                c.oshape[0][o++] = 1;
        }
    }
    bool no_identity = op == NT_OP_MAX || op == NT_OP_ARGMAX || op == NT_OP_MIN ||
                       op == NT_OP_AMAX || op == NT_OP_AMIN ||
                       op == NT_OP_ARGMIN || (op == NT_OP_NORM && isinf(ord));
    if (n == 0 && no_identity) {
        nt__err(site, NT_ESHAPE, fn, "cannot take the %s of an empty dim (it has no identity)",
                op == NT_OP_NORM ? (ord > 0 ? "inf-norm" : "-inf-norm") : nt__op_name(op));
        return nt__call_fail(&c);
    }
    c.p.flag = keepdim;
    c.ondim[0] = o;
    c.odt[0] = dt;
    c.flops = (double)nt__numel(t->ndim, t->shape);
    return nt__dispatch(&c);
}

nt_tensor *nt__reduce(const nt_site *site, const char *fn, int op, nt_tensor *t, int dim,
                      bool keepdim)
{
    return reduce_ord(site, fn, op, t, dim, keepdim, 0.0);
}

#define NT_DEF_REDUCE(name, ID)                                                             \
    NT_API nt_tensor *nt_##name##_at(const nt_site *site, nt_tensor *t, int dim, bool keep)  \
    {                                                                                        \
        return nt__reduce(site, "nt_" #name, NT_OP_##ID, t, dim, keep);                     \
    }                                                                                        \
    NT_API nt_tensor *nt_##name(nt_tensor *t, int dim, bool keep)                            \
    {                                                                                        \
        return nt_##name##_at(NT_RA_SITE, t, dim, keep);                                    \
    }
NT_DEF_REDUCE(sum, SUM)
NT_DEF_REDUCE(mean, MEAN)
NT_DEF_REDUCE(max, MAX)
NT_DEF_REDUCE(argmax, ARGMAX)
NT_DEF_REDUCE(min, MIN)
NT_DEF_REDUCE(argmin, ARGMIN)
NT_DEF_REDUCE(any, ANY)

NT_API nt_tensor *nt_norm_at(const nt_site *site, nt_tensor *t, double ord, int dim, bool keep)
{
    return reduce_ord(site, "nt_norm", NT_OP_NORM, t, dim, keep, ord);
}
NT_API nt_tensor *nt_norm(nt_tensor *t, double ord, int dim, bool keep)
{
    return nt_norm_at(NT_RA_SITE, t, ord, dim, keep);
}

/* ---------------- softmax family ---------------- */

static nt_tensor *softmax_like(const nt_site *site, const char *fn, int op, nt_tensor *t, int dim)
{
    nt__call c;
    if (!nt__call_begin(&c, site, fn, op, 1, &t, "t"))
        return nt__call_fail(&c);
    t = c.in[0];
    int d;
    if (!need_float(&c, t, "t") || !norm_dim(&c, t, dim, &d))
        return nt__call_fail(&c);
    c.p.dim = d;
    c.odt[0] = (nt_dtype)t->dtype;
    c.ondim[0] = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        c.oshape[0][i] = t->shape[i];
    c.flops = 5.0 * (double)nt__numel(t->ndim, t->shape);
    return nt__dispatch(&c);
}

NT_API nt_tensor *nt_softmax_at(const nt_site *site, nt_tensor *t, int dim)
{
    return softmax_like(site, "nt_softmax", NT_OP_SOFTMAX, t, dim);
}
NT_API nt_tensor *nt_log_softmax_at(const nt_site *site, nt_tensor *t, int dim)
{
    return softmax_like(site, "nt_log_softmax", NT_OP_LOG_SOFTMAX, t, dim);
}
NT_API nt_tensor *nt_softmax(nt_tensor *t, int dim) { return nt_softmax_at(NT_RA_SITE, t, dim); }
NT_API nt_tensor *nt_log_softmax(nt_tensor *t, int dim)
{
    return nt_log_softmax_at(NT_RA_SITE, t, dim);
}

/* ---------------- norms ---------------- */

static bool check_affine(nt__call *c, nt_tensor *x, nt_tensor *p, const char *arg)
{
    if (!p)
        return true;
    if (!need_float(c, p, arg))
        return false;
    if (p->ndim != 1 || p->shape[0] != x->shape[x->ndim - 1]) {
        char s1[128];
        nt__err(c->site, NT_ESHAPE, c->fn, "argument '%s' has shape %s; expected [%lld] (the last "
                "dim of 'x')", arg, nt__shape_str(p->ndim, p->shape, s1, sizeof s1),
                (long long)x->shape[x->ndim - 1]);
        return false;
    }
    return true;
}

static nt_tensor *norm_like(const nt_site *site, const char *fn, int op, nt_tensor *x,
                            nt_tensor *w, nt_tensor *b, double eps)
{
    nt__call c;
    nt_tensor *in[3] = {x, w, b};
    int nin = op == NT_OP_LAYER_NORM ? 3 : 2;
    if (!nt__call_begin(&c, site, fn, op, nin, in, "x,?w,?b"))
        return nt__call_fail(&c);
    x = c.in[0], w = c.in[1], b = nin == 3 ? c.in[2] : NULL;
    if (!need_float(&c, x, "x"))
        return nt__call_fail(&c);
    if (x->ndim < 1) {
        nt__err(site, NT_ESHAPE, fn, "argument 'x' is 0-d; it needs a last dim to normalise");
        return nt__call_fail(&c);
    }
    if (!check_affine(&c, x, w, "w") || !check_affine(&c, x, b, "b"))
        return nt__call_fail(&c);
    if (!(eps >= 0) || !isfinite(eps)) {
        nt__err(site, NT_EINVAL, fn, "argument 'eps' is %g; expected a finite value >= 0", eps);
        return nt__call_fail(&c);
    }
    c.p.f[0] = eps;
    c.p.dim = x->ndim - 1;
    c.odt[0] = (nt_dtype)x->dtype;
    c.ondim[0] = x->ndim;
    for (int i = 0; i < x->ndim; i++)
        c.oshape[0][i] = x->shape[i];
    c.flops = 8.0 * (double)nt__numel(x->ndim, x->shape);
    return nt__dispatch(&c);
}

NT_API nt_tensor *nt_layer_norm_at(const nt_site *site, nt_tensor *x, nt_tensor *w,
                                   nt_tensor *b, double eps)
{
    return norm_like(site, "nt_layer_norm", NT_OP_LAYER_NORM, x, w, b, eps);
}
NT_API nt_tensor *nt_rms_norm_at(const nt_site *site, nt_tensor *x, nt_tensor *w, double eps)
{
    return norm_like(site, "nt_rms_norm", NT_OP_RMS_NORM, x, w, NULL, eps);
}
NT_API nt_tensor *nt_layer_norm(nt_tensor *x, nt_tensor *w, nt_tensor *b, double eps)
{
    return nt_layer_norm_at(NT_RA_SITE, x, w, b, eps);
}
NT_API nt_tensor *nt_rms_norm(nt_tensor *x, nt_tensor *w, double eps)
{
    return nt_rms_norm_at(NT_RA_SITE, x, w, eps);
}

/* ---------------- losses ---------------- */

/* The argument checks of the cross-entropies, in fn's name. */
/* empty: N = 0 is allowed (nt_cross_entropy_ex: a mean over no rows, NaN
 * as in PyTorch), with any C */
static bool xent_args(nt__call *c, const char *fn, nt_tensor *logits, nt_tensor *labels,
                      bool empty)
{
    if (!need_float(c, logits, "logits") || !need_int(c, labels, "labels"))
        return false;
    char s1[128], s2[128];
    bool none = empty && logits->ndim == 2 && logits->shape[0] == 0;
    if (logits->ndim != 2 || (!none && (logits->shape[0] < 1 || logits->shape[1] < 1))) {
        nt__err(c->site, NT_ESHAPE, fn,
                "argument 'logits' has shape %s; expected [N, C] with N, C >= 1%s",
                nt__shape_str(logits->ndim, logits->shape, s1, sizeof s1),
                empty ? " (or N = 0)" : "");
        return false;
    }
    if (labels->ndim != 1 || labels->shape[0] != logits->shape[0]) {
        nt__err(c->site, NT_ESHAPE, fn,
                "argument 'labels' has shape %s; expected [%lld] to match 'logits' %s",
                nt__shape_str(labels->ndim, labels->shape, s1, sizeof s1),
                (long long)logits->shape[0],
                nt__shape_str(logits->ndim, logits->shape, s2, sizeof s2));
        return false;
    }
    return true;
}

/* The CROSS_ENTROPY op, issued by fn (nt_cross_entropy, or the label check
 * of nt_cross_entropy_ex, whose run-time errors then name it). */
static nt_tensor *xent_op(const nt_site *site, const char *fn, nt_tensor *logits,
                          nt_tensor *labels)
{
    nt__call c;
    nt_tensor *in[2] = {logits, labels};
    if (!nt__call_begin(&c, site, fn, NT_OP_CROSS_ENTROPY, 2, in, "logits,labels"))
        return nt__call_fail(&c);
    logits = c.in[0], labels = c.in[1];
    if (!xent_args(&c, fn, logits, labels, false))
        return nt__call_fail(&c);
    c.odt[0] = (nt_dtype)logits->dtype;
    c.ondim[0] = 0;
    c.flops = 6.0 * (double)nt__numel(2, logits->shape);
    return nt__dispatch(&c);
}

static nt_tensor *xent_ex(const nt_site *site, const char *fn, nt_tensor *logits,
                          nt_tensor *labels, int64_t ignore_index, double label_smoothing);

/* y [M] (M >= 1, C >= 1) checked against [0, C) when it runs: the
 * CROSS_ENTROPY op on zero logits [M, C] checks the labels on the device,
 * and y passes through a select on its result, so its error poisons what
 * uses the returned labels (no host sync).  Run-time errors name fn. */
nt_tensor *nt__labels_checked(const nt_site *site, const char *fn, nt_tensor *y, int64_t C)
{
    if (!y)
        return NULL;
    int64_t M = y->ndim ? y->shape[0] : 1;
    nt_tensor *z = nt_expand_at(site, nt_zeros_at(site, NT_F32, 2, (int64_t[]){1, 1}), 2,
                                (int64_t[]){M, C});
    nt_tensor *chk = xent_op(site, fn, z, y);
    return chk ? nt_where_at(site, nt__binary(site, fn, NT_OP_EQ, chk, chk), y, y) : NULL;
}

/* [N, C, d1, ...] as [N * d1 * ..., C] (the class dim moved last, rows in
 * the row-major order of [N, d1, ...]); a 2-D t as it is. */
nt_tensor *nt__classes_last(const nt_site *site, nt_tensor *t)
{
    if (!t || t->ndim <= 2)
        return t;
    int perm[NT_MAX_DIMS];
    int64_t M = t->shape[0];
    perm[0] = 0;
    for (int i = 2; i < t->ndim; i++) {
        perm[i - 1] = i;
        M *= t->shape[i];
    }
    perm[t->ndim - 1] = 1;
    return nt_reshape_at(site, nt_permute_at(site, t, perm), 2, (int64_t[]){M, t->shape[1]});
}

/* The cross-entropies over [N, C, d1, ...] logits and [N, d1, ...] labels:
 * checked here (in fn's name), then the 2-D composite on the flattened
 * rows; NULL (no error set) when logits are not > 2-D. */
static nt_tensor *xent_nd(const nt_site *site, const char *fn, nt_tensor *logits,
                          nt_tensor *labels, int64_t ignore_index, double label_smoothing)
{
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "logits", logits) ||
        !nt__check_arg(site, fn, "labels", labels) || logits->ndim <= 2)
        return NULL;
    bool ok = labels->ndim == logits->ndim - 1 && labels->shape[0] == logits->shape[0];
    for (int i = 2; ok && i < logits->ndim; i++)
        ok = labels->shape[i - 1] == logits->shape[i];
    if (!ok) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn,
                "argument 'labels' has shape %s; expected 'logits' %s without its class dim 1",
                nt__shape_str(labels->ndim, labels->shape, s1, sizeof s1),
                nt__shape_str(logits->ndim, logits->shape, s2, sizeof s2));
        return NULL;
    }
    nt_scope *sc = nt_scope_begin();
    if (!sc) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *l2 = nt__classes_last(site, logits);
    nt_tensor *y1 = l2 ? nt_reshape_at(site, labels, 1, (int64_t[]){l2->shape[0]}) : NULL;
    nt_tensor *loss = y1 ? xent_ex(site, fn, l2, y1, ignore_index, label_smoothing) : NULL;
    if (loss)
        nt_keep(loss);
    else
        nt__err_within(fn);
    nt_scope_end(sc);
    return loss ? nt__scope_adopt(loss, fn) : NULL;
}

NT_API nt_tensor *nt_cross_entropy_at(const nt_site *site, nt_tensor *logits, nt_tensor *labels)
{
    const char *fn = "nt_cross_entropy";
    if (logits && logits->ndim > 2 && logits->magic == NT__MAGIC_LIVE)
        return xent_nd(site, fn, logits, labels, INT64_MIN, 0.0); /* ignores no label */
    /* no rows: a mean over none, NaN as in PyTorch (the op wants rows; the
     * composite gives the same bits as the op wherever both run) */
    if (nt__ensure_init() && nt__check_arg(site, fn, "logits", logits) &&
        nt__check_arg(site, fn, "labels", labels) && logits->ndim == 2 && logits->shape[0] == 0)
        return xent_ex(site, fn, logits, labels, -100, 0.0);
    return xent_op(site, fn, logits, labels);
}
NT_API nt_tensor *nt_cross_entropy(nt_tensor *logits, nt_tensor *labels)
{
    return nt_cross_entropy_at(NT_RA_SITE, logits, labels);
}

/* A composite of existing ops (so every backend, fusion and autograd have
 * it), in f32 and rounded once to the logits' dtype at the end:
 *   valid = labels != ignore_index; y = valid ? labels : 0
 *   nll = valid ? -log_softmax(logits)[i, y] : 0; n = sum(valid)
 *   loss = sum(nll) / n                                  (eps == 0)
 *   loss = loss * (1 - eps) + (sum(sm) / n) * (eps / C)  (eps > 0),
 *     sm = valid ? -sum_c log_softmax(logits)[i, c] : 0
 * log_softmax's d - log(s) is the bits of nt_cross_entropy's d_label - ls
 * and the sums are the canonical ones over the rows in order, so with no
 * row ignored and eps == 0 this is nt_cross_entropy's value bit for bit.
 * Labels out of range that are not ignored: the CROSS_ENTROPY op run on
 * y over zero logits checks them on the device, and y passes through a
 * select on its result, so its error poisons the loss (no host sync). */
NT_API nt_tensor *nt_cross_entropy_ex_at(const nt_site *site, nt_tensor *logits,
                                         nt_tensor *labels, int64_t ignore_index,
                                         double label_smoothing)
{
    const char *fn = "nt_cross_entropy_ex";
    if (logits && logits->ndim > 2 && logits->magic == NT__MAGIC_LIVE)
        return xent_nd(site, fn, logits, labels, ignore_index, label_smoothing);
    return xent_ex(site, fn, logits, labels, ignore_index, label_smoothing);
}

/* fn: the function the user called (nt_cross_entropy_ex, or
 * nt_cross_entropy for no rows) */
static nt_tensor *xent_ex(const nt_site *site, const char *fn, nt_tensor *logits,
                          nt_tensor *labels, int64_t ignore_index, double label_smoothing)
{
    nt__call c;
    memset(&c, 0, sizeof c);
    c.site = site, c.fn = fn;
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "logits", logits) ||
        !nt__check_arg(site, fn, "labels", labels) || !xent_args(&c, fn, logits, labels, true))
        return NULL;
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
        nt__err(site, NT_EINVAL, fn, "argument 'label_smoothing' is %g; expected a value in [0, 1]",
                label_smoothing);
        return NULL;
    }
    int64_t N = logits->shape[0], C = logits->shape[1];
    nt_dtype ldt = (nt_dtype)labels->dtype, odt = (nt_dtype)logits->dtype;
    int64_t lo = ldt == NT_U8 ? 0 : INT32_MIN, hi = ldt == NT_U8 ? 255 : INT32_MAX;
    nt_scope *sc = nt_scope_begin();
    if (!sc) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *y = labels, *valid = NULL, *loss = NULL;
    if (ignore_index >= lo && ignore_index <= hi) { /* else no label can equal it */
        valid = nt__binary(site, fn, NT_OP_NE, labels, nt_full_at(site, ldt, 0, NULL, (double)ignore_index));
        y = nt_where_at(site, valid, labels, nt_zeros_at(site, ldt, 0, NULL));
    }
    if (N > 0) /* no rows, no labels to check */
        y = nt__labels_checked(site, fn, y, C);
    nt_tensor *x = odt == NT_F32 ? logits : nt__copy_to(site, fn, logits, NT_F32);
    nt_tensor *lp = nt_log_softmax_at(site, x, 1);
    nt_tensor *zf = nt_zeros_at(site, NT_F32, 0, NULL);
    nt_tensor *nll = nt__unary(site, fn, NT_OP_NEG,
                               nt_reshape_at(site, nt_gather_at(site, lp, 1,
                                                                nt_reshape_at(site, y, 2, (int64_t[]){N, 1})),
                                             1, (int64_t[]){N}));
    nt_tensor *n;
    if (valid) {
        nll = nt_where_at(site, valid, nll, zf);
        n = nt__reduce(site, fn, NT_OP_SUM, nt__copy_to(site, fn, valid, NT_F32), -1, false);
    } else {
        n = nt_full_at(site, NT_F32, 0, NULL, (double)N);
    }
    loss = nt__binary(site, fn, NT_OP_DIV, nt__reduce(site, fn, NT_OP_SUM, nll, -1, false), n);
    if (loss && label_smoothing > 0.0) {
        nt_tensor *sm = nt__unary(site, fn, NT_OP_NEG, nt__reduce(site, fn, NT_OP_SUM, lp, 1, false));
        if (valid)
            sm = nt_where_at(site, valid, sm, zf);
        nt_tensor *smean = nt__binary(site, fn, NT_OP_DIV, nt__reduce(site, fn, NT_OP_SUM, sm, -1, false), n);
        loss = nt__binary(site, fn, NT_OP_ADD,
                          nt__scalar(site, fn, NT_OP_MUL_SCALAR, loss, 1.0 - label_smoothing, 0),
                          nt__scalar(site, fn, NT_OP_MUL_SCALAR, smean,
                                     C ? label_smoothing / (double)C : 0.0, 0)); /* C = 0: N = 0, smean NaN */
    }
    if (loss && odt != NT_F32)
        loss = nt__copy_to(site, fn, loss, odt);
    if (loss) {
        nt_keep(loss);
    } else {
        nt__err_within(fn);
    }
    nt_scope_end(sc);
    return loss ? nt__scope_adopt(loss, fn) : NULL; /* the caller's scope owns it, as any op's */
}
NT_API nt_tensor *nt_cross_entropy_ex(nt_tensor *logits, nt_tensor *labels, int64_t ignore_index,
                                      double label_smoothing)
{
    return nt_cross_entropy_ex_at(NT_RA_SITE, logits, labels, ignore_index, label_smoothing);
}

NT_API nt_tensor *nt_mse_loss_at(const nt_site *site, nt_tensor *a, nt_tensor *b)
{
    nt__call c;
    nt_tensor *in[2] = {a, b};
    if (!nt__call_begin(&c, site, "nt_mse_loss", NT_OP_MSE_LOSS, 2, in, "a,b"))
        return nt__call_fail(&c);
    a = c.in[0], b = c.in[1];
    if (!need_float(&c, a, "a") || !need_float(&c, b, "b"))
        return nt__call_fail(&c);
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++)
        same = a->shape[i] == b->shape[i];
    if (!same) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, "nt_mse_loss", "arguments 'a' %s and 'b' %s differ in shape",
                nt__shape_str(a->ndim, a->shape, s1, sizeof s1),
                nt__shape_str(b->ndim, b->shape, s2, sizeof s2));
        return nt__call_fail(&c);
    }
    c.odt[0] = nt__promote((nt_dtype)a->dtype, (nt_dtype)b->dtype);
    c.ondim[0] = 0;
    c.flops = 3.0 * (double)nt__numel(a->ndim, a->shape);
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_mse_loss(nt_tensor *a, nt_tensor *b) { return nt_mse_loss_at(NT_RA_SITE, a, b); }

/* ---------------- matmul, linear ---------------- */

NT_API nt_tensor *nt_matmul_at(const nt_site *site, nt_tensor *a, nt_tensor *b)
{
    nt__call c;
    nt_tensor *in[2] = {a, b};
    if (nt__dhooks.amp_fp8_matmul) { /* an fp8 autocast region (amp/fp8.c) */
        bool handled = false;
        nt_tensor *y = nt__dhooks.amp_fp8_matmul(site, a, b, &handled);
        if (handled)
            return y;
    }
    if (!nt__call_begin(&c, site, "nt_matmul", NT_OP_MATMUL, 2, in, "a,b"))
        return nt__call_fail(&c);
    a = c.in[0], b = c.in[1];
    if (!need_float(&c, a, "a") || !need_float(&c, b, "b"))
        return nt__call_fail(&c);
    if (a->dtype != b->dtype) {
        nt__err(site, NT_EDTYPE, "nt_matmul",
                "arguments 'a' (%s) and 'b' (%s) must have the same dtype (cast one, or use "
                "autocast)", nt_dtype_name((nt_dtype)a->dtype), nt_dtype_name((nt_dtype)b->dtype));
        return nt__call_fail(&c);
    }
    nt__mminfo mi;
    char why[160];
    if (!nt__matmul_info(a, b, &mi, why, sizeof why)) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, "nt_matmul", "cannot multiply 'a' %s by 'b' %s: %s",
                nt__shape_str(a->ndim, a->shape, s1, sizeof s1),
                nt__shape_str(b->ndim, b->shape, s2, sizeof s2), why);
        return nt__call_fail(&c);
    }
    c.odt[0] = (nt_dtype)a->dtype;
    c.ondim[0] = mi.ondim;
    for (int i = 0; i < mi.ondim; i++)
        c.oshape[0][i] = mi.oshape[i];
    c.flops = 2.0 * (double)mi.M * (double)mi.N * (double)mi.K *
              (double)nt__numel(mi.nbatch, mi.batch);
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_matmul(nt_tensor *a, nt_tensor *b) { return nt_matmul_at(NT_RA_SITE, a, b); }

NT_API nt_tensor *nt_transpose_at(const nt_site *site, nt_tensor *t, int d0, int d1);
NT_API nt_tensor *nt_linear_at(const nt_site *site, nt_tensor *x, nt_tensor *w, nt_tensor *b)
{
    const char *fn = "nt_linear";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x) || !nt__check_arg(site, fn, "w", w))
        return NULL;
    if (b && !nt__check_arg(site, fn, "b", b))
        return NULL;
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn,
                "argument 'w' %s must be [out, in] with in = the last dim of 'x' %s",
                nt__shape_str(w->ndim, w->shape, s1, sizeof s1),
                nt__shape_str(x->ndim, x->shape, s2, sizeof s2));
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        char s1[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'b' %s must be [%lld] (the rows of 'w')",
                nt__shape_str(b->ndim, b->shape, s1, sizeof s1), (long long)w->shape[0]);
        return NULL;
    }
    /* Op for op the same as matmul(x, w^T) + b, so it fuses and rounds alike. */
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    /* Under autocast the bias add runs in the matmul's low dtype (amp/): cast
     * the bias first, so that its cast does not split the matmul's epilogue. */
    nt_dtype low = nt__dhooks.amp_active ? nt__dhooks.amp_active() : NT_DTYPE_COUNT;
    if (b && low != NT_DTYPE_COUNT && b->dtype != low && nt__dtype_is_float((nt_dtype)b->dtype))
        b = nt__dhooks.amp_cast ? nt__dhooks.amp_cast(site, fn, b, low)
                                : nt__copy_to(site, fn, b, low);
    nt_tensor *wt = nt_transpose_at(site, w, 0, 1);
    nt_tensor *y = nt_matmul_at(site, x, wt);
    if (y && b)
        y = nt__binary(site, fn, NT_OP_ADD, y, b);
    if (y) {
        nt_keep(y);
    } else {
        /* the inner op's error names itself: say which call it was part of */
        nt__err_within(fn);
    }
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_linear(nt_tensor *x, nt_tensor *w, nt_tensor *b)
{
    return nt_linear_at(NT_RA_SITE, x, w, b);
}

/* ---------------- embedding ---------------- */

NT_API nt_tensor *nt_embedding_at(const nt_site *site, nt_tensor *weight, nt_tensor *idx)
{
    nt__call c;
    nt_tensor *in[2] = {weight, idx};
    if (!nt__call_begin(&c, site, "nt_embedding", NT_OP_EMBEDDING, 2, in, "weight,idx"))
        return nt__call_fail(&c);
    weight = c.in[0], idx = c.in[1];
    if (!need_int(&c, idx, "idx"))
        return nt__call_fail(&c);
    if (weight->ndim != 2) {
        char s1[128];
        nt__err(site, NT_ESHAPE, "nt_embedding", "argument 'weight' has shape %s; expected [V, D]",
                nt__shape_str(weight->ndim, weight->shape, s1, sizeof s1));
        return nt__call_fail(&c);
    }
    if (idx->ndim + 1 > NT_MAX_DIMS) {
        nt__err(site, NT_ESHAPE, "nt_embedding", "argument 'idx' has %d dims; at most %d allowed",
                idx->ndim, NT_MAX_DIMS - 1);
        return nt__call_fail(&c);
    }
    c.odt[0] = (nt_dtype)weight->dtype;
    c.ondim[0] = idx->ndim + 1;
    for (int i = 0; i < idx->ndim; i++)
        c.oshape[0][i] = idx->shape[i];
    c.oshape[0][idx->ndim] = weight->shape[1];
    c.flops = (double)nt__numel(c.ondim[0], c.oshape[0]);
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_embedding(nt_tensor *weight, nt_tensor *idx)
{
    return nt_embedding_at(NT_RA_SITE, weight, idx);
}

/* ---------------- dropout and the training mode ---------------- */

/* Per thread, like nt_no_grad_begin; a thread starts in training mode. */
static _Thread_local bool tls_eval;

NT_API void nt_set_training(bool on) { tls_eval = !on; }
NT_API bool nt_is_training(void) { return !tls_eval; }

/* The DROPOUT op, whatever the training mode (autograd's backward runs it on
 * g with the forward's p and seed). */
nt_tensor *nt__dropout(const nt_site *site, const char *fn, nt_tensor *x, double p, uint64_t seed)
{
    nt__call c;
    if (!nt__call_begin(&c, site, fn, NT_OP_DROPOUT, 1, &x, "x"))
        return nt__call_fail(&c);
    x = c.in[0];
    if (!need_float(&c, x, "x"))
        return nt__call_fail(&c);
    c.p.f[0] = p;
    c.p.seed = seed;
    c.odt[0] = (nt_dtype)x->dtype;
    c.ondim[0] = x->ndim;
    for (int i = 0; i < x->ndim; i++)
        c.oshape[0][i] = x->shape[i];
    c.flops = (double)nt__numel(x->ndim, x->shape);
    return nt__dispatch(&c);
}

NT_API nt_tensor *nt_dropout_at(const nt_site *site, nt_tensor *x, double p, uint64_t seed)
{
    const char *fn = "nt_dropout";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x))
        return NULL;
    if (!nt__dtype_is_float((nt_dtype)x->dtype)) {
        nt__err(site, NT_EDTYPE, fn, "argument 'x' has dtype %s; expected f32, bf16 or f16",
                nt_dtype_name((nt_dtype)x->dtype));
        return NULL;
    }
    if (!(p >= 0.0 && p < 1.0)) {
        nt__err(site, NT_EINVAL, fn, "argument 'p' is %g; expected a probability in [0, 1)", p);
        return NULL;
    }
    if (p == 0.0 || tls_eval) {
        /* the identity: a new handle on x's value, in the graph like x */
        nt__call c;
        if (!nt__call_begin(&c, site, fn, NT_OP_ALIAS, 1, &x, "x"))
            return nt__call_fail(&c);
        return nt__dispatch_view(&c, nt__make_view(x, x->ndim, x->shape, x->stride, x->offset,
                                                    site));
    }
    return nt__dropout(site, fn, x, p, seed);
}
NT_API nt_tensor *nt_dropout(nt_tensor *x, double p, uint64_t seed)
{
    return nt_dropout_at(NT_RA_SITE, x, p, seed);
}

/* ---------------- generators ---------------- */

#define GEN_MAGIC 0x47454e31u /* "GEN1" */

struct nt_generator {
    uint32_t magic;
    uint64_t seed;
    volatile AO_t offset;
    volatile AO_t refs;    /* the user's, plus captured programs' (their patches read it) */
    uint64_t cap;          /* the capture that last advanced it (nt__capture_serial: one
                              for all segments of a capture of several streams) */
    uint64_t cap_adv;      /* how far that capture advanced it */
    volatile AO_t busy;    /* a call is moving it: a second thread's call is refused */
    bool is_default;       /* a thread's default generator (nt_default_generator) */
    AO_t epoch;            /* a default's: the nt_init it was set at (NT_SEED, 0) for */
};

/* How far capture `cap` has advanced g so far (0 if it has not). */
static uint64_t gen_cap_adv(const nt_generator *g)
{
    return nt__capturing() && g->cap == nt__capture_serial() ? g->cap_adv : 0;
}

static void gen_free_ref(nt_generator *g)
{
    if (nt__ref_drop(&g->refs, 1))
        free(g);
}

NT_API nt_generator *nt_generator_create(uint64_t seed)
{
    nt_generator *g = calloc(1, sizeof *g);
    if (!g) {
        nt__err_hostmem(NULL, "nt_generator_create", "a generator");
        return NULL;
    }
    g->magic = GEN_MAGIC;
    g->seed = seed;
    g->refs = 1;
    return g;
}

NT_API void nt_generator_destroy(nt_generator *g)
{
    if (!g || g->magic != GEN_MAGIC || g->is_default)
        return; /* a thread's default lives as long as its thread */
    g->magic = 0;
    gen_free_ref(g);
}

static bool gen_ok(const nt_site *site, const char *fn, const nt_generator *g)
{
    if (!g || g->magic != GEN_MAGIC) {
        nt__err(site, NT_EINVAL, fn, "argument 'g' is %s", g ? "not a live generator" : "NULL");
        return false;
    }
    return true;
}

NT_API int nt_generator_get_state(const nt_generator *g, uint64_t *seed, uint64_t *offset)
{
    const char *fn = "nt_generator_get_state";
    if (!gen_ok(NULL, fn, g))
        return nt_last_error();
    if (!seed || !offset)
        return nt__err(NULL, NT_EINVAL, fn, "argument '%s' is NULL", seed ? "offset" : "seed");
    *seed = g->seed;
    *offset = (uint64_t)AO_load(&g->offset);
    return 0;
}

NT_API int nt_generator_set_state(nt_generator *g, uint64_t seed, uint64_t offset)
{
    if (!gen_ok(NULL, "nt_generator_set_state", g))
        return nt_last_error();
    g->seed = seed;
    AO_store(&g->offset, (AO_t)offset);
    return 0;
}

/* Draw i of g now: h(seed, offset + i), core/rng.h's counter-based bits. */
static uint64_t gen_draw(const nt_generator *g, uint64_t i)
{
    return nt__rng_bits(nt__rng_key(g->seed), (uint64_t)AO_load(&g->offset) + i);
}

/* A captured step's draw: at each replay, draw `index` at the offset the
 * generator has then; each replay advances it as the step did. */
static uint64_t gen_patch(void *ctx, int index) { return gen_draw(ctx, (uint64_t)index); }
static void gen_advance_hook(void *ctx, int64_t n) { AO_fetch_and_add(&((nt_generator *)ctx)->offset, (AO_t)n); }
static void gen_retain(void *ctx) { AO_fetch_and_add1(&((nt_generator *)ctx)->refs); }
static void gen_release(void *ctx) { gen_free_ref(ctx); }

/* One call at a time moves a generator: a second thread's call meanwhile
 * is refused (NT_ESTATE naming fn), not a race on its offset. */
static bool gen_enter(const nt_site *site, const char *fn, nt_generator *g)
{
    if (AO_compare_and_swap_full(&g->busy, 0, 1))
        return true;
    nt__err(site, NT_ESTATE, fn,
            "argument 'g' is in use by another thread's call: a generator is used by one "
            "thread at a time (each thread has its own nt_default_generator)");
    return false;
}
static void gen_leave(nt_generator *g) { AO_store_release(&g->busy, 0); }

/* offset += n (gen_enter held), and so at each replay of a capture */
static void gen_move(nt_generator *g, uint64_t n)
{
    AO_fetch_and_add(&g->offset, (AO_t)n);
    if (nt__capturing()) {
        uint64_t cap = nt__capture_serial();
        if (g->cap != cap) {
            g->cap = cap;
            g->cap_adv = 0;
        }
        g->cap_adv += n;
        nt__capture_on_replay(gen_advance_hook, g, (int64_t)g->cap_adv, gen_retain, gen_release);
    }
}

static int gen_advance(const nt_site *site, const char *fn, nt_generator *g, uint64_t n)
{
    if (!gen_enter(site, fn, g))
        return nt_last_error();
    gen_move(g, n);
    gen_leave(g);
    return 0;
}

NT_API int nt_generator_advance(nt_generator *g, uint64_t n)
{
    if (!gen_ok(NULL, "nt_generator_advance", g))
        return nt_last_error();
    return gen_advance(NULL, "nt_generator_advance", g, n);
}

NT_API nt_tensor *nt_dropout_gen_at(const nt_site *site, nt_tensor *x, double p, nt_generator *g,
                                    uint64_t index)
{
    const char *fn = "nt_dropout_gen";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x) || !gen_ok(site, fn, g))
        return NULL;
    if (!nt__dtype_is_float((nt_dtype)x->dtype)) {
        nt__err(site, NT_EDTYPE, fn, "argument 'x' has dtype %s; expected f32, bf16 or f16",
                nt_dtype_name((nt_dtype)x->dtype));
        return NULL;
    }
    if (!(p >= 0.0 && p < 1.0)) {
        nt__err(site, NT_EINVAL, fn, "argument 'p' is %g; expected a probability in [0, 1)", p);
        return NULL;
    }
    if (index > INT32_MAX || index + gen_cap_adv(g) > INT32_MAX) {
        nt__err(site, NT_EINVAL, fn,
                "argument 'index' is %llu; expected at most %d (less what the capture has "
                "advanced the generator by)",
                (unsigned long long)index, INT32_MAX);
        return NULL;
    }
    if (p == 0.0 || tls_eval)
        return nt_dropout_at(site, x, p, 0); /* the identity: no mask */
    if (nt__capturing()) {
        /* a replay draws it at the offset it has then (before the step's
         * advances: its patches are computed first), so past what the step
         * had advanced it by when it drew; the backward's dropout (same
         * seed) is patched with it (fusion/graph.c) */
        nt__capture_patch_next(gen_patch, g, (int)(index + gen_cap_adv(g)), NT__PATCH_SEED,
                               NT_OP_DROPOUT);
        nt__capture_on_replay(gen_advance_hook, g, (int64_t)gen_cap_adv(g), gen_retain,
                              gen_release);
    }
    return nt__dropout(site, fn, x, p, gen_draw(g, index));
}
NT_API nt_tensor *nt_dropout_gen(nt_tensor *x, double p, nt_generator *g, uint64_t index)
{
    return nt_dropout_gen_at(NT_RA_SITE, x, p, g, index);
}

/* ---- the random creation ops' draws (dispatcher/api_rand.c) ---- */

nt_generator *nt__gen_take(const nt_site *site, const char *fn, nt_generator *g, int op,
                           uint64_t *seed)
{
    if (!g && !(g = nt_default_generator())) {
        nt__err_within(fn);
        return NULL;
    }
    if (!gen_ok(site, fn, g) || !gen_enter(site, fn, g))
        return NULL;
    uint64_t adv = gen_cap_adv(g);
    if (nt__capturing()) {
        if (op < 0 || adv > INT32_MAX) {
            gen_leave(g);
            nt__err(site, NT_ESTATE, fn,
                    op < 0 ? "it draws on the host, so a captured program could not draw "
                             "again at each replay: make it before nt_graph_capture_begin "
                             "and pass it as an input (nt_graph_input)"
                           : "the capture advanced the generator past 2^31 draws");
            return NULL;
        }
        nt__capture_patch_next(gen_patch, g, (int)adv, NT__PATCH_SEED, op);
    }
    *seed = gen_draw(g, 0);
    return g;
}

void nt__gen_done(nt_generator *g, bool taken)
{
    if (taken)
        gen_move(g, 1);
    gen_leave(g);
}

static void gen_default_free(void *v) { gen_free_ref(v); }
static nt__tlkey gen_default_key = NT__TLKEY_INIT(gen_default_free);

NT_API nt_generator *nt_default_generator(void)
{
    const char *fn = "nt_default_generator";
    if (!nt__ensure_init())
        return NULL;
    nt_generator *g = nt__tlkey_get(&gen_default_key);
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g || !nt__tlkey_set(&gen_default_key, g)) {
            free(g);
            nt__err_hostmem(NULL, fn, "the thread's default generator");
            return NULL;
        }
        g->magic = GEN_MAGIC;
        g->refs = 1;
        g->is_default = true;
    }
    /* each nt_init starts every thread's default at (NT_SEED, 0) */
    AO_t ep = AO_load_acquire(&nt__init_epoch);
    if (g->epoch != ep) {
        g->seed = NT__CFG(seed);
        AO_store(&g->offset, 0);
        g->cap = 0;
        g->epoch = ep;
    }
    return g;
}

NT_API nt_tensor *nt_dropout_next_at(const nt_site *site, nt_tensor *x, double p,
                                     nt_generator *g)
{
    const char *fn = "nt_dropout_next";
    if (!nt__ensure_init())
        return NULL;
    if (!g && !(g = nt_default_generator()))
        return NULL;
    if (!gen_ok(site, fn, g))
        return NULL;
    nt_tensor *y = nt_dropout_gen_at(site, x, p, g, 0);
    if (!y) {
        nt__err_within(fn);
        return NULL;
    }
    if (p == 0.0 || tls_eval)
        return y; /* no draw taken: nothing to move */
    if (gen_advance(site, fn, g, 1) != 0) {
        nt_release(y);
        return NULL;
    }
    return y;
}
NT_API nt_tensor *nt_dropout_next(nt_tensor *x, double p, nt_generator *g)
{
    return nt_dropout_next_at(NT_RA_SITE, x, p, g);
}

/* ---------------- multinomial ---------------- */

NT_API nt_tensor *nt_multinomial_at(const nt_site *site, nt_tensor *probs, int64_t n,
                                    uint64_t seed)
{
    const char *fn = "nt_multinomial";
    nt__call c;
    if (!nt__call_begin(&c, site, fn, NT_OP_MULTINOMIAL, 1, &probs, "probs"))
        return nt__call_fail(&c);
    probs = c.in[0];
    if (!need_float(&c, probs, "probs"))
        return nt__call_fail(&c);
    if ((probs->ndim != 1 && probs->ndim != 2) || probs->shape[probs->ndim - 1] < 1) {
        char s1[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'probs' has shape %s; expected [C] or [N, C] "
                "with C >= 1", nt__shape_str(probs->ndim, probs->shape, s1, sizeof s1));
        return nt__call_fail(&c);
    }
    if (n < 1 || n > INT32_MAX) {
        nt__err(site, NT_EINVAL, fn, "argument 'n' is %lld; expected 1 <= n <= %d", (long long)n,
                INT32_MAX);
        return nt__call_fail(&c);
    }
    c.p.i[0] = n;
    c.p.seed = seed;
    c.odt[0] = NT_I32;
    c.ondim[0] = probs->ndim;
    if (probs->ndim == 2)
        c.oshape[0][0] = probs->shape[0];
    c.oshape[0][probs->ndim - 1] = n;
    c.flops = (double)nt__numel(probs->ndim, probs->shape) + (double)n;
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_multinomial(nt_tensor *probs, int64_t n, uint64_t seed)
{
    return nt_multinomial_at(NT_RA_SITE, probs, n, seed);
}
