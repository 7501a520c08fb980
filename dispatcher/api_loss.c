/* dispatcher/api_loss.c - the losses of torch.nn.functional beyond
 * cross_entropy and mse_loss (issue 34): binary_cross_entropy (and with
 * logits), nll_loss, l1_loss, smooth_l1_loss, huber_loss and kl_div, each
 * with PyTorch's reduction modes (nt_reduction).
 *
 * Each is a composite of existing ops, like nt_cross_entropy_ex: every
 * backend, mode, fusion and autograd have it through those ops, and its
 * bits are the composite's, written out in docs/ops.md.  The arithmetic is
 * f32 (bf16/f16 inputs are widened first: autocast's F32 policy) and the
 * result is rounded once to the inputs' promoted dtype at the end (f32
 * inside an autocast region).  The reductions are nt_sum / nt_mean over
 * every element: the canonical order of core/reduce.h; mean is that sum
 * divided by (float)numel. */
#include <math.h>
#include <string.h>

#include "dispatcher/dispatch.h"

typedef struct lctx {
    const nt_site *site;
    const char *fn;
    nt_scope *sc;
    nt_dtype odt; /* the result's dtype */
    nt_dtype cd;  /* the dtype it is computed in: f64 for an f64 result, else f32 */
    int nk;       /* the 0-d constants (in cd) made so far (each made once) */
    double kv[4];
    nt_tensor *kt[4];
} lctx;

static bool need_float(const lctx *L, nt_tensor *t, const char *arg)
{
    if (nt__dtype_is_float((nt_dtype)t->dtype))
        return nt__no_fp8(L->site, L->fn, arg, t);
    nt__err(L->site, NT_EDTYPE, L->fn, "argument '%s' has dtype %s; expected f32, bf16 or f16",
            arg, nt_dtype_name((nt_dtype)t->dtype));
    return false;
}

static bool check_red(const lctx *L, nt_reduction r, bool batchmean)
{
    if (r == NT_REDUCTION_NONE || r == NT_REDUCTION_MEAN || r == NT_REDUCTION_SUM ||
        (batchmean && r == NT_REDUCTION_BATCHMEAN))
        return true;
    nt__err(L->site, NT_EINVAL, L->fn,
            "argument 'reduction' is %d; expected NT_REDUCTION_NONE, NT_REDUCTION_MEAN or "
            "NT_REDUCTION_SUM%s", (int)r, batchmean ? " or NT_REDUCTION_BATCHMEAN" : "");
    return false;
}

/* Checks the arguments (ts[i] named names[i]; opt[i]: may be NULL), each
 * floating; opens the composite's scope.  odt: the promoted dtype. */
static bool loss_begin(lctx *L, const nt_site *site, const char *fn, int n, nt_tensor *const *ts,
                       const char *const *names, const bool *opt)
{
    memset(L, 0, sizeof *L);
    L->site = site, L->fn = fn;
    if (!nt__ensure_init())
        return false;
    nt_dtype odt = NT_DTYPE_COUNT;
    for (int i = 0; i < n; i++) {
        if (opt[i] && !ts[i])
            continue;
        if (!nt__check_arg(site, fn, names[i], ts[i]) || !need_float(L, ts[i], names[i]))
            return false;
        odt = odt == NT_DTYPE_COUNT ? (nt_dtype)ts[i]->dtype
                                    : nt__promote(odt, (nt_dtype)ts[i]->dtype);
    }
    L->odt = nt_autocast_dtype() != NT_DTYPE_COUNT ? NT_F32 : odt;
    L->cd = L->odt == NT_F64 ? NT_F64 : NT_F32;
    return true;
}

static bool open_scope(lctx *L)
{
    L->sc = nt_scope_begin();
    if (!L->sc)
        nt__err_hostmem(L->site, L->fn, "a scope");
    return L->sc != NULL;
}

/* Rounds loss to the result's dtype, hands it to the caller's scope. */
static nt_tensor *loss_end(lctx *L, nt_tensor *loss)
{
    if (loss && loss->dtype != L->odt)
        loss = nt__copy_to(L->site, L->fn, loss, L->odt);
    if (loss)
        nt_keep(loss);
    else
        nt__err_within(L->fn);
    nt_scope_end(L->sc);
    return loss ? nt__scope_adopt(loss, L->fn) : NULL;
}

/* t in the computing dtype (f32, or f64 when the result is f64) */
static nt_tensor *f32(const lctx *L, nt_tensor *t)
{
    return !t || t->dtype == L->cd ? t : nt__copy_to(L->site, L->fn, t, L->cd);
}

/* The 0-d constant v in the computing dtype, made once per call (one fill op each). */
static nt_tensor *scal(lctx *L, double v)
{
    for (int i = 0; i < L->nk; i++)
        if (L->kv[i] == v)
            return L->kt[i];
    nt_tensor *t = nt_full_at(L->site, L->cd, 0, NULL, v);
    if (t && L->nk < 4)
        L->kv[L->nk] = v, L->kt[L->nk++] = t;
    return t;
}
static nt_tensor *bin(const lctx *L, int op, nt_tensor *a, nt_tensor *b)
{
    return nt__binary(L->site, L->fn, op, a, b);
}
static nt_tensor *un(const lctx *L, int op, nt_tensor *a) { return nt__unary(L->site, L->fn, op, a); }
static nt_tensor *sc1(const lctx *L, int op, nt_tensor *a, double s)
{
    return nt__scalar(L->site, L->fn, op, a, s, 0.0);
}

/* PyTorch's apply_loss_reduction; batch: batchmean's divisor. */
static nt_tensor *reduce(const lctx *L, nt_tensor *t, nt_reduction r, int64_t batch)
{
    switch (r) {
    case NT_REDUCTION_SUM:
        return nt__reduce(L->site, L->fn, NT_OP_SUM, t, NT_DIM_ALL, false);
    case NT_REDUCTION_MEAN:
        return nt__reduce(L->site, L->fn, NT_OP_MEAN, t, NT_DIM_ALL, false);
    case NT_REDUCTION_BATCHMEAN:
        return sc1(L, NT_OP_DIV_SCALAR, nt__reduce(L->site, L->fn, NT_OP_SUM, t, NT_DIM_ALL, false),
                   (double)batch);
    default:
        return t;
    }
}

static bool same_shape(const nt_tensor *a, const nt_tensor *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

/* b must have a's shape (PyTorch's BCE losses refuse anything else). */
static bool need_same(const lctx *L, nt_tensor *a, const char *an, nt_tensor *b, const char *bn)
{
    if (same_shape(a, b))
        return true;
    char s1[128], s2[128];
    nt__err(L->site, NT_ESHAPE, L->fn, "argument '%s' has shape %s; expected the shape of '%s' %s",
            bn, nt__shape_str(b->ndim, b->shape, s1, sizeof s1), an,
            nt__shape_str(a->ndim, a->shape, s2, sizeof s2));
    return false;
}

/* w (optional) must broadcast to a's shape without growing it. */
static bool need_bcast_to(const lctx *L, nt_tensor *a, const char *an, nt_tensor *w, const char *wn)
{
    int nd;
    int64_t sh[NT_MAX_DIMS];
    if (!w || (nt__broadcast(a->ndim, a->shape, w->ndim, w->shape, &nd, sh) && nd == a->ndim &&
               memcmp(sh, a->shape, (size_t)nd * sizeof *sh) == 0))
        return true;
    char s1[128], s2[128];
    nt__err(L->site, NT_ESHAPE, L->fn, "argument '%s' has shape %s; expected one that broadcasts "
            "to '%s' %s", wn, nt__shape_str(w->ndim, w->shape, s1, sizeof s1), an,
            nt__shape_str(a->ndim, a->shape, s2, sizeof s2));
    return false;
}

/* max(log(q), -100) as PyTorch's BCE, with log's input 1 where q == 0 so
 * that the gradient there is 0, not 0 * inf (a NaN q stays NaN). */
static nt_tensor *clamped_log(lctx *L, nt_tensor *q)
{
    nt_tensor *z = bin(L, NT_OP_EQ, q, scal(L, 0.0));
    nt_tensor *lq = nt_clamp_at(L->site, un(L, NT_OP_LOG, nt_where_at(L->site, z, scal(L, 1.0), q)),
                                -100.0, INFINITY);
    return nt_where_at(L->site, z, scal(L, -100.0), lq);
}

/* ---------------- binary cross-entropy ---------------- */

NT_API nt_tensor *nt_binary_cross_entropy_at(const nt_site *site, nt_tensor *p, nt_tensor *y,
                                             nt_tensor *weight, nt_reduction reduction)
{
    lctx L;
    nt_tensor *ts[3] = {p, y, weight};
    if (!loss_begin(&L, site, "nt_binary_cross_entropy", 3, ts,
                    (const char *const[]){"p", "y", "weight"}, (const bool[]){0, 0, 1}) ||
        !check_red(&L, reduction, false) || !need_same(&L, p, "p", y, "y") ||
        !need_bcast_to(&L, p, "p", weight, "weight") || !open_scope(&L))
        return NULL;
    /* (y - 1) * max(log(1 - p), -100) - y * max(log(p), -100), times w */
    nt_tensor *p32 = f32(&L, p), *y32 = f32(&L, y);
    nt_tensor *one_m_p = sc1(&L, NT_OP_ADD_SCALAR, un(&L, NT_OP_NEG, p32), 1.0);
    nt_tensor *l = bin(&L, NT_OP_SUB,
                       bin(&L, NT_OP_MUL, sc1(&L, NT_OP_ADD_SCALAR, y32, -1.0), clamped_log(&L, one_m_p)),
                       bin(&L, NT_OP_MUL, y32, clamped_log(&L, p32)));
    if (weight)
        l = bin(&L, NT_OP_MUL, l, f32(&L, weight));
    return loss_end(&L, reduce(&L, l, reduction, 0));
}
NT_API nt_tensor *nt_binary_cross_entropy(nt_tensor *p, nt_tensor *y, nt_tensor *weight,
                                          nt_reduction reduction)
{
    return nt_binary_cross_entropy_at(NT_RA_SITE, p, y, weight, reduction);
}

NT_API nt_tensor *nt_binary_cross_entropy_with_logits_at(const nt_site *site, nt_tensor *x,
                                                         nt_tensor *y, nt_tensor *weight,
                                                         nt_tensor *pos_weight,
                                                         nt_reduction reduction)
{
    lctx L;
    nt_tensor *ts[4] = {x, y, weight, pos_weight};
    if (!loss_begin(&L, site, "nt_binary_cross_entropy_with_logits", 4, ts,
                    (const char *const[]){"x", "y", "weight", "pos_weight"},
                    (const bool[]){0, 0, 1, 1}) ||
        !check_red(&L, reduction, false) || !need_same(&L, x, "x", y, "y") ||
        !need_bcast_to(&L, x, "x", weight, "weight") ||
        !need_bcast_to(&L, x, "x", pos_weight, "pos_weight") || !open_scope(&L))
        return NULL;
    /* PyTorch's stable form: m = max(-x, 0),
     * l = (1 - y) x + m + log(exp(-m) + exp(-x - m)), or with pos_weight
     * l = (1 - y) x + ((pw - 1) y + 1) (log(exp(-m) + exp(-x - m)) + m) */
    nt_tensor *x32 = f32(&L, x), *y32 = f32(&L, y);
    nt_tensor *nx = un(&L, NT_OP_NEG, x32);
    nt_tensor *m = nt_clamp_at(site, nx, 0.0, INFINITY);
    nt_tensor *lse = un(&L, NT_OP_LOG, bin(&L, NT_OP_ADD, un(&L, NT_OP_EXP, un(&L, NT_OP_NEG, m)),
                                          un(&L, NT_OP_EXP, bin(&L, NT_OP_SUB, nx, m))));
    nt_tensor *a = bin(&L, NT_OP_MUL, sc1(&L, NT_OP_ADD_SCALAR, un(&L, NT_OP_NEG, y32), 1.0), x32);
    nt_tensor *l;
    if (pos_weight) {
        nt_tensor *lw = sc1(&L, NT_OP_ADD_SCALAR,
                            bin(&L, NT_OP_MUL, sc1(&L, NT_OP_ADD_SCALAR, f32(&L, pos_weight), -1.0),
                                y32), 1.0);
        l = bin(&L, NT_OP_ADD, a, bin(&L, NT_OP_MUL, lw, bin(&L, NT_OP_ADD, lse, m)));
    } else {
        l = bin(&L, NT_OP_ADD, bin(&L, NT_OP_ADD, a, m), lse);
    }
    if (weight)
        l = bin(&L, NT_OP_MUL, l, f32(&L, weight));
    return loss_end(&L, reduce(&L, l, reduction, 0));
}
NT_API nt_tensor *nt_binary_cross_entropy_with_logits(nt_tensor *x, nt_tensor *y,
                                                      nt_tensor *weight, nt_tensor *pos_weight,
                                                      nt_reduction reduction)
{
    return nt_binary_cross_entropy_with_logits_at(NT_RA_SITE, x, y, weight, pos_weight, reduction);
}

/* ---------------- nll_loss ---------------- */

/* logp [C] with a 0-d label, or [N, C, d1, ...] with labels [N, d1, ...] */
static bool nll_shapes(const lctx *L, const char *xn, nt_tensor *lp, nt_tensor *y, nt_tensor *w)
{
    char s1[128], s2[128];
    if (lp->ndim < 1) {
        nt__err(L->site, NT_ESHAPE, L->fn, "argument '%s' is 0-d; expected [C] or [N, C, ...]", xn);
        return false;
    }
    int cd = lp->ndim == 1 ? 0 : 1;
    bool ok = y->ndim == lp->ndim - 1;
    for (int i = 0, j = 0; ok && i < lp->ndim; i++)
        if (i != cd)
            ok = y->shape[j++] == lp->shape[i];
    if (!ok) {
        nt__err(L->site, NT_ESHAPE, L->fn,
                "argument 'labels' has shape %s; expected '%s' %s without its class dim %d",
                nt__shape_str(y->ndim, y->shape, s1, sizeof s1), xn,
                nt__shape_str(lp->ndim, lp->shape, s2, sizeof s2), cd);
        return false;
    }
    int64_t M = nt__numel(y->ndim, y->shape);
    if (M > 0 && lp->shape[cd] < 1) {
        nt__err(L->site, NT_ESHAPE, L->fn, "argument '%s' has shape %s; expected C >= 1 classes",
                xn, nt__shape_str(lp->ndim, lp->shape, s1, sizeof s1));
        return false;
    }
    if (w && (w->ndim != 1 || w->shape[0] != lp->shape[cd])) {
        nt__err(L->site, NT_ESHAPE, L->fn, "argument 'weight' has shape %s; expected [%lld] (one "
                "per class)", nt__shape_str(w->ndim, w->shape, s1, sizeof s1),
                (long long)lp->shape[cd]);
        return false;
    }
    return true;
}

/* The labels' checks of the class losses: a live integer tensor. */
static bool need_labels(const lctx *L, nt_tensor *labels)
{
    if (!nt__check_arg(L->site, L->fn, "labels", labels))
        return false;
    if (!nt__dtype_is_float((nt_dtype)labels->dtype))
        return true;
    nt__err(L->site, NT_EDTYPE, L->fn, "argument 'labels' has dtype %s; expected i32, i64 or u8",
            nt_dtype_name((nt_dtype)labels->dtype));
    return false;
}

/* red of the class losses' parts: l (and sm, the smoothing part, when
 * eps > 0), with den the (weighted) count of the labels kept:
 *   NONE: l * (1 - eps) + sm * (eps / C), shaped like the labels
 *   SUM:  sum(l) * (1 - eps) + sum(sm) * (eps / C)
 *   MEAN: (sum(l) / den) * (1 - eps) + (sum(sm) / den) * (eps / C)
 * (PyTorch's cross_entropy order; eps == 0: l's part alone). */
static nt_tensor *class_reduce(lctx *L, nt_tensor *l, nt_tensor *sm, nt_tensor *den,
                               nt_tensor *labels, nt_reduction red, double eps, int64_t C)
{
    nt_tensor *parts[2] = {l, sm};
    for (int i = 0; i < (eps > 0 ? 2 : 1); i++) {
        nt_tensor *t = parts[i];
        if (red == NT_REDUCTION_NONE)
            t = nt_reshape_at(L->site, t, labels->ndim, labels->shape);
        else
            t = nt__reduce(L->site, L->fn, NT_OP_SUM, t, NT_DIM_ALL, false);
        if (red == NT_REDUCTION_MEAN)
            t = bin(L, NT_OP_DIV, t, den);
        parts[i] = t;
    }
    if (!(eps > 0))
        return parts[0];
    return bin(L, NT_OP_ADD, sc1(L, NT_OP_MUL_SCALAR, parts[0], 1.0 - eps),
               sc1(L, NT_OP_MUL_SCALAR, parts[1], C ? eps / (double)C : 0.0));
}

/* nll_loss and cross_entropy on x ([C] or [N, C, d1, ...], checked),
 * with eps the label smoothing (cross_entropy) and x log-softmaxed over
 * the classes first when softmax is set:
 *   lp = [M, C] rows of x (classes last), f32 (log_softmax'd)
 *   valid_i = y_i != ignore_index; y_i 0 where not, checked in [0, C)
 *   l_i = valid_i ? -lp[i, y_i] * w[y_i] : 0
 *   sm_i = valid_i ? -sum_c lp[i, c] * w[c] : 0          (eps > 0)
 *   den = sum(valid_i ? w[y_i] : 0), or sum(valid), or M  (MEAN) */
static nt_tensor *class_loss(lctx *L, nt_tensor *x, nt_tensor *labels, nt_tensor *weight,
                             int64_t ignore_index, nt_reduction reduction, double eps, bool softmax)
{
    const nt_site *site = L->site;
    int64_t C = x->ndim == 1 ? x->shape[0] : x->shape[1];
    int64_t M = nt__numel(labels->ndim, labels->shape);
    nt_dtype ldt = (nt_dtype)labels->dtype;
    int64_t lo = ldt == NT_U8 ? 0 : INT32_MIN, hi = ldt == NT_U8 ? 255 : INT32_MAX;
    nt_tensor *lp = f32(L, x->ndim == 1 ? nt_reshape_at(site, x, 2, (int64_t[]){1, C})
                                        : nt__classes_last(site, x));
    if (softmax)
        lp = nt_log_softmax_at(site, lp, 1);
    nt_tensor *y = nt_reshape_at(site, labels, 1, (int64_t[]){M}), *valid = NULL;
    if (ignore_index >= lo && ignore_index <= hi) { /* else no label can equal it */
        valid = bin(L, NT_OP_NE, y, nt_full_at(site, ldt, 0, NULL, (double)ignore_index));
        y = nt_where_at(site, valid, y, nt_zeros_at(site, ldt, 0, NULL));
    }
    if (M > 0)
        y = nt__labels_checked(site, L->fn, y, C);
    nt_tensor *l = un(L, NT_OP_NEG,
                      nt_reshape_at(site, nt_gather_at(site, lp, 1,
                                                       nt_reshape_at(site, y, 2, (int64_t[]){M, 1})),
                                    1, (int64_t[]){M}));
    nt_tensor *w = f32(L, weight), *sm = NULL;
    nt_tensor *wy = w ? nt_index_select_at(site, w, 0, y) : NULL;
    if (wy)
        l = bin(L, NT_OP_MUL, l, wy);
    if (eps > 0)
        sm = un(L, NT_OP_NEG, nt__reduce(site, L->fn, NT_OP_SUM, w ? bin(L, NT_OP_MUL, lp, w) : lp,
                                         1, false));
    nt_tensor *zf = scal(L, 0.0);
    if (valid) {
        l = nt_where_at(site, valid, l, zf);
        sm = sm ? nt_where_at(site, valid, sm, zf) : NULL;
        wy = wy ? nt_where_at(site, valid, wy, zf) : NULL;
    }
    nt_tensor *den = NULL;
    if (reduction == NT_REDUCTION_MEAN)
        den = wy      ? nt__reduce(site, L->fn, NT_OP_SUM, wy, NT_DIM_ALL, false)
              : valid ? nt__reduce(site, L->fn, NT_OP_SUM, nt__copy_to(site, L->fn, valid, NT_F32),
                                   NT_DIM_ALL, false)
                      : scal(L, (double)M);
    return class_reduce(L, l, sm, den, labels, reduction, eps, C);
}

NT_API nt_tensor *nt_nll_loss_at(const nt_site *site, nt_tensor *logp, nt_tensor *labels,
                                 nt_tensor *weight, int64_t ignore_index, nt_reduction reduction)
{
    lctx L;
    nt_tensor *ts[2] = {logp, weight};
    if (!loss_begin(&L, site, "nt_nll_loss", 2, ts, (const char *const[]){"logp", "weight"},
                    (const bool[]){0, 1}) ||
        !need_labels(&L, labels) || !check_red(&L, reduction, false) ||
        !nll_shapes(&L, "logp", logp, labels, weight) || !open_scope(&L))
        return NULL;
    return loss_end(&L, class_loss(&L, logp, labels, weight, ignore_index, reduction, 0.0, false));
}
NT_API nt_tensor *nt_nll_loss(nt_tensor *logp, nt_tensor *labels, nt_tensor *weight,
                              int64_t ignore_index, nt_reduction reduction)
{
    return nt_nll_loss_at(NT_RA_SITE, logp, labels, weight, ignore_index, reduction);
}

NT_API nt_tensor *nt_cross_entropy_loss_at(const nt_site *site, nt_tensor *logits,
                                           nt_tensor *labels, nt_tensor *weight,
                                           int64_t ignore_index, double label_smoothing,
                                           nt_reduction reduction)
{
    lctx L;
    nt_tensor *ts[2] = {logits, weight};
    if (!loss_begin(&L, site, "nt_cross_entropy_loss", 2, ts,
                    (const char *const[]){"logits", "weight"}, (const bool[]){0, 1}) ||
        !need_labels(&L, labels) || !check_red(&L, reduction, false) ||
        !nll_shapes(&L, "logits", logits, labels, weight))
        return NULL;
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
        nt__err(site, NT_EINVAL, L.fn, "argument 'label_smoothing' is %g; expected a value in "
                "[0, 1]", label_smoothing);
        return NULL;
    }
    if (!open_scope(&L))
        return NULL;
    return loss_end(&L, class_loss(&L, logits, labels, weight, ignore_index, reduction,
                                   label_smoothing, true));
}
NT_API nt_tensor *nt_cross_entropy_loss(nt_tensor *logits, nt_tensor *labels, nt_tensor *weight,
                                        int64_t ignore_index, double label_smoothing,
                                        nt_reduction reduction)
{
    return nt_cross_entropy_loss_at(NT_RA_SITE, logits, labels, weight, ignore_index,
                                    label_smoothing, reduction);
}

/* ---------------- regression losses ---------------- */

enum { L1, SMOOTH_L1, HUBER };

/* |a - b| (l1); smooth_l1 (s = beta) and huber (s = delta) as PyTorch's
 * vectorised CPU kernels, z = |a - b|:
 *   smooth_l1: z < beta  ? 0.5 z z / beta : z - 0.5 beta
 *   huber:     z < delta ? 0.5 z z        : delta (z - 0.5 delta)
 * The quadratic branch reads min(z, s), equal to z where it is taken, so
 * the branch not taken has no Inf for autograd to multiply by 0. */
static nt_tensor *regression(const nt_site *site, const char *fn, int kind, nt_tensor *a,
                             nt_tensor *b, nt_reduction reduction, double s)
{
    lctx L;
    nt_tensor *ts[2] = {a, b};
    if (!loss_begin(&L, site, fn, 2, ts, (const char *const[]){"a", "b"}, (const bool[]){0, 0}) ||
        !check_red(&L, reduction, false))
        return NULL;
    if (kind != L1 && (kind == HUBER ? !(s > 0) : !(s >= 0)) ) {
        nt__err(site, NT_EINVAL, fn, "argument '%s' is %g; expected a value %s",
                kind == HUBER ? "delta" : "beta", s, kind == HUBER ? "> 0" : ">= 0");
        return NULL;
    }
    if (!open_scope(&L))
        return NULL;
    if (kind == SMOOTH_L1 && s == 0.0)
        kind = L1; /* PyTorch: beta == 0 is l1_loss */
    nt_tensor *z = un(&L, NT_OP_ABS, bin(&L, NT_OP_SUB, f32(&L, a), f32(&L, b)));
    if (kind != L1) {
        /* the parameter as the f32 PyTorch uses for f32 data; as passed in f64 */
        double sf = L.cd == NT_F64 ? s : (double)(float)s, half = 0.5 * sf;
        nt_tensor *zq = nt_clamp_at(site, z, -INFINITY, (double)sf);
        nt_tensor *q = bin(&L, NT_OP_MUL, sc1(&L, NT_OP_MUL_SCALAR, zq, 0.5), zq);
        nt_tensor *lin = sc1(&L, NT_OP_ADD_SCALAR, z, -(double)half);
        if (kind == SMOOTH_L1)
            q = sc1(&L, NT_OP_DIV_SCALAR, q, (double)sf);
        else
            lin = sc1(&L, NT_OP_MUL_SCALAR, lin, (double)sf);
        z = nt_where_at(site, bin(&L, NT_OP_LT, z, scal(&L, (double)sf)), q, lin);
    }
    return loss_end(&L, reduce(&L, z, reduction, 0));
}

NT_API nt_tensor *nt_l1_loss_at(const nt_site *site, nt_tensor *a, nt_tensor *b,
                                nt_reduction reduction)
{
    return regression(site, "nt_l1_loss", L1, a, b, reduction, 0.0);
}
NT_API nt_tensor *nt_l1_loss(nt_tensor *a, nt_tensor *b, nt_reduction reduction)
{
    return nt_l1_loss_at(NT_RA_SITE, a, b, reduction);
}
NT_API nt_tensor *nt_smooth_l1_loss_at(const nt_site *site, nt_tensor *a, nt_tensor *b,
                                       nt_reduction reduction, double beta)
{
    return regression(site, "nt_smooth_l1_loss", SMOOTH_L1, a, b, reduction, beta);
}
NT_API nt_tensor *nt_smooth_l1_loss(nt_tensor *a, nt_tensor *b, nt_reduction reduction, double beta)
{
    return nt_smooth_l1_loss_at(NT_RA_SITE, a, b, reduction, beta);
}
NT_API nt_tensor *nt_huber_loss_at(const nt_site *site, nt_tensor *a, nt_tensor *b,
                                   nt_reduction reduction, double delta)
{
    return regression(site, "nt_huber_loss", HUBER, a, b, reduction, delta);
}
NT_API nt_tensor *nt_huber_loss(nt_tensor *a, nt_tensor *b, nt_reduction reduction, double delta)
{
    return nt_huber_loss_at(NT_RA_SITE, a, b, reduction, delta);
}

/* ---------------- kl_div ---------------- */

NT_API nt_tensor *nt_kl_div_at(const nt_site *site, nt_tensor *input, nt_tensor *target,
                               nt_reduction reduction, bool log_target)
{
    lctx L;
    nt_tensor *ts[2] = {input, target};
    if (!loss_begin(&L, site, "nt_kl_div", 2, ts, (const char *const[]){"input", "target"},
                    (const bool[]){0, 0}) ||
        !check_red(&L, reduction, true) || !open_scope(&L))
        return NULL;
    /* PyTorch's: log_target ? exp(t) (t - x) : xlogy(t, t) - t x, with
     * xlogy(t, t) = t == 0 ? 0 : t log(t) (log's input 1 where t == 0, so
     * its gradient is 0 there, not 0 * inf) */
    nt_tensor *x = f32(&L, input), *t = f32(&L, target), *l;
    if (log_target) {
        l = bin(&L, NT_OP_MUL, un(&L, NT_OP_EXP, t), bin(&L, NT_OP_SUB, t, x));
    } else {
        nt_tensor *z = bin(&L, NT_OP_EQ, t, scal(&L, 0.0));
        nt_tensor *tl = bin(&L, NT_OP_MUL, t, un(&L, NT_OP_LOG, nt_where_at(site, z, scal(&L, 1.0), t)));
        l = bin(&L, NT_OP_SUB, nt_where_at(site, z, scal(&L, 0.0), tl), bin(&L, NT_OP_MUL, t, x));
    }
    /* batchmean: the sum over input.size(0) (the sum for a 0-d input) */
    int64_t batch = input->ndim ? input->shape[0] : 1;
    if (reduction == NT_REDUCTION_BATCHMEAN && input->ndim == 0)
        reduction = NT_REDUCTION_SUM;
    return loss_end(&L, reduce(&L, l, reduction, batch));
}
NT_API nt_tensor *nt_kl_div(nt_tensor *input, nt_tensor *target, nt_reduction reduction,
                            bool log_target)
{
    return nt_kl_div_at(NT_RA_SITE, input, target, reduction, log_target);
}
