/* dispatcher/api_scatter.c - scatter, scatter_add, index_add, index_put and
 * one_hot (kernels: the SCATTER and SCATTER_ADD ops of cpu/index.c and
 * neuron/index.c; docs/ops.md, "Scatter").
 *
 * An index is i32 or u8 (index_put: a u8 index is a mask, as PyTorch's
 * bool/uint8 index).  Shapes are checked here; the index values when the
 * op runs (every one, in the index's row-major order, before anything is
 * written): the first outside [0, size) is NT_ERANGE naming the call and
 * its line, as for nt_gather. */
#include <math.h>

#include "dispatcher/dispatch.h"

static bool index_dtype(const nt_site *site, const char *fn, const char *arg, nt_tensor *ix)
{
    if (ix->dtype == NT_I32 || ix->dtype == NT_U8 || ix->dtype == NT_I64)
        return true;
    nt__err(site, NT_EDTYPE, fn, "argument '%s' has dtype %s; expected i32, i64 or u8", arg,
            nt_dtype_name((nt_dtype)ix->dtype));
    return false;
}

static bool same_dtype(const nt_site *site, const char *fn, const char *arg, nt_tensor *t,
                       nt_tensor *src)
{
    if (src->dtype == t->dtype)
        return true;
    nt__err(site, NT_EDTYPE, fn, "argument '%s' has dtype %s; expected t's dtype %s", arg,
            nt_dtype_name((nt_dtype)src->dtype), nt_dtype_name((nt_dtype)t->dtype));
    return false;
}

/* t (at least 1-D), its dim normalised into *d */
static bool scat_dim(const nt_site *site, const char *fn, nt_tensor *t, int dim, int *d)
{
    if (t->ndim == 0) {
        nt__err(site, NT_ESHAPE, fn, "argument 't' is 0-d; expected at least 1 dim");
        return false;
    }
    *d = nt__norm_dim(dim, t->ndim);
    if (*d < 0) {
        nt__err(site, NT_EDIM, fn, "dim %d is out of range for a tensor with %d dims", dim,
                t->ndim);
        return false;
    }
    return true;
}

/* The op on checked arguments: out = t's shape and dtype.  select: index
 * is 1-D along d (index_add, index_put). */
static nt_tensor *scat_dispatch(const nt_site *site, const char *fn, int op, nt_tensor *t, int d,
                                nt_tensor *index, nt_tensor *src, bool select, double alpha)
{
    nt__call c;
    nt_tensor *in[3] = {t, index, src};
    if (!nt__call_begin(&c, site, fn, op, 3, in, "t,index,src"))
        return nt__call_fail(&c);
    t = c.in[0];
    c.p.dim = d;
    c.p.flag = select;
    c.p.f[0] = alpha;
    c.odt[0] = (nt_dtype)t->dtype;
    c.ondim[0] = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        c.oshape[0][i] = t->shape[i];
    c.flops = (double)nt__numel(t->ndim, t->shape) + (double)nt__numel(src->ndim, src->shape);
    return nt__dispatch(&c);
}

/* scatter and scatter_add: index has t's ndim, index.shape[i] <=
 * src.shape[i] for every i and <= t.shape[i] for i != dim; src is read on
 * index's shape (a slice of it, so the gradient comes back zero-padded). */
static nt_tensor *scatter_common(const nt_site *site, const char *fn, int op, nt_tensor *t,
                                 int dim, nt_tensor *index, nt_tensor *src)
{
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t) ||
        !nt__check_arg(site, fn, "index", index) || !nt__check_arg(site, fn, "src", src))
        return NULL;
    int d;
    if (!index_dtype(site, fn, "index", index) || !scat_dim(site, fn, t, dim, &d) ||
        !same_dtype(site, fn, "src", t, src))
        return NULL;
    bool ok = index->ndim == t->ndim && src->ndim == t->ndim, cut = false;
    for (int i = 0; ok && i < t->ndim; i++) {
        ok = index->shape[i] <= src->shape[i] && (i == d || index->shape[i] <= t->shape[i]);
        cut |= index->shape[i] < src->shape[i];
    }
    if (!ok) {
        char s1[128], s2[128], s3[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'index' has shape %s; expected %d dims, each no "
                "larger than src's %s, and than t's %s except dim %d",
                nt__shape_str(index->ndim, index->shape, s1, sizeof s1), t->ndim,
                nt__shape_str(src->ndim, src->shape, s2, sizeof s2),
                nt__shape_str(t->ndim, t->shape, s3, sizeof s3), d);
        return NULL;
    }
    if (!cut)
        return scat_dispatch(site, fn, op, t, d, index, src, false, 1.0);
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *v = src;
    for (int i = 0; v && i < t->ndim; i++)
        if (index->shape[i] < src->shape[i])
            v = nt_slice_at(site, v, i, 0, index->shape[i], 1);
    nt_tensor *y = v ? scat_dispatch(site, fn, op, t, d, index, v, false, 1.0) : NULL;
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}

NT_API nt_tensor *nt_scatter_at(const nt_site *site, nt_tensor *t, int dim, nt_tensor *index,
                                nt_tensor *src)
{
    return scatter_common(site, "nt_scatter", NT_OP_SCATTER, t, dim, index, src);
}
NT_API nt_tensor *nt_scatter(nt_tensor *t, int dim, nt_tensor *index, nt_tensor *src)
{
    return nt_scatter_at(NT_RA_SITE, t, dim, index, src);
}

NT_API nt_tensor *nt_scatter_add_at(const nt_site *site, nt_tensor *t, int dim,
                                    nt_tensor *index, nt_tensor *src)
{
    return scatter_common(site, "nt_scatter_add", NT_OP_SCATTER_ADD, t, dim, index, src);
}
NT_API nt_tensor *nt_scatter_add(nt_tensor *t, int dim, nt_tensor *index, nt_tensor *src)
{
    return nt_scatter_add_at(NT_RA_SITE, t, dim, index, src);
}

/* A 1-D (or 0-d) index along dim d of t, and src of t's shape with dim d of
 * the index's length. */
static bool select_shapes(const nt_site *site, const char *fn, nt_tensor *t, int d,
                          nt_tensor *index, nt_tensor *src, const char *sname)
{
    if (index->ndim > 1) {
        char s1[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'index' has shape %s; expected 1-D (or 0-d)",
                nt__shape_str(index->ndim, index->shape, s1, sizeof s1));
        return false;
    }
    int64_t n = nt__numel(index->ndim, index->shape);
    bool ok = src->ndim == t->ndim;
    for (int i = 0; ok && i < t->ndim; i++)
        ok = src->shape[i] == (i == d ? n : t->shape[i]);
    if (!ok) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn, "argument '%s' has shape %s; expected t's %s with dim %d "
                "of %lld (the index's length)", sname,
                nt__shape_str(src->ndim, src->shape, s1, sizeof s1),
                nt__shape_str(t->ndim, t->shape, s2, sizeof s2), d, (long long)n);
        return false;
    }
    return true;
}

NT_API nt_tensor *nt_index_add_at(const nt_site *site, nt_tensor *t, int dim, nt_tensor *index,
                                  nt_tensor *src, double alpha)
{
    const char *fn = "nt_index_add";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t) ||
        !nt__check_arg(site, fn, "index", index) || !nt__check_arg(site, fn, "src", src))
        return NULL;
    int d;
    if (!index_dtype(site, fn, "index", index) || !scat_dim(site, fn, t, dim, &d) ||
        !same_dtype(site, fn, "src", t, src) || !select_shapes(site, fn, t, d, index, src, "src"))
        return NULL;
    bool fl = nt__dtype_is_float((nt_dtype)t->dtype);
    if (!isfinite(alpha) || (!fl && (alpha != floor(alpha) || fabs(alpha) > 16777216.0))) {
        nt__err(site, NT_EINVAL, fn, "argument 'alpha' is %g; expected a finite number%s", alpha,
                fl ? "" : " (for an integer t an integer of magnitude <= 2^24)");
        return NULL;
    }
    return scat_dispatch(site, fn, NT_OP_SCATTER_ADD, t, d, index, src, true, alpha);
}
NT_API nt_tensor *nt_index_add(nt_tensor *t, int dim, nt_tensor *index, nt_tensor *src,
                               double alpha)
{
    return nt_index_add_at(NT_RA_SITE, t, dim, index, src, alpha);
}

/* index_put with a u8 mask of t's leading dims and a one-element value:
 * where(mask, value (or t + value), t). */
static nt_tensor *index_put_mask(const nt_site *site, const char *fn, nt_tensor *t,
                                 nt_tensor *mask, nt_tensor *values, bool accumulate)
{
    bool ok = mask->ndim <= t->ndim;
    for (int i = 0; ok && i < mask->ndim; i++)
        ok = mask->shape[i] == t->shape[i];
    if (!ok) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'index' (a u8 mask) has shape %s; expected t's "
                "leading dims (t is %s)", nt__shape_str(mask->ndim, mask->shape, s1, sizeof s1),
                nt__shape_str(t->ndim, t->shape, s2, sizeof s2));
        return NULL;
    }
    if (nt__numel(values->ndim, values->shape) != 1) {
        char s1[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'values' has shape %s; with a mask index expected "
                "one element (values per selected element would need the mask's count, a host "
                "sync: not supported)", nt__shape_str(values->ndim, values->shape, s1, sizeof s1));
        return NULL;
    }
    int64_t ms[NT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        ms[i] = i < mask->ndim ? mask->shape[i] : 1;
    nt_tensor *m = nt_reshape_at(site, mask, t->ndim, ms);
    nt_tensor *v = m ? nt_reshape_at(site, values, 0, NULL) : NULL;
    if (v && accumulate)
        v = nt_add_at(site, t, v);
    return v ? nt_where_at(site, m, v, t) : NULL;
}

/* index_put with an i32 index along dim 0 (negative entries count from the
 * end, as in PyTorch); values broadcast to [n, t.shape[1:]]. */
static nt_tensor *index_put_index(const nt_site *site, const char *fn, nt_tensor *t,
                                  nt_tensor *index, nt_tensor *values, bool accumulate)
{
    if (index->ndim > 1) {
        char s1[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'index' has shape %s; expected 1-D (or 0-d) i32 "
                "indices into dim 0, or a u8 mask", nt__shape_str(index->ndim, index->shape, s1,
                                                                  sizeof s1));
        return NULL;
    }
    int64_t n = nt__numel(index->ndim, index->shape), sh[NT_MAX_DIMS];
    sh[0] = n;
    for (int i = 1; i < t->ndim; i++)
        sh[i] = t->shape[i];
    bool ok = values->ndim <= t->ndim;
    for (int i = 0; ok && i < values->ndim; i++) {
        int64_t v = values->shape[values->ndim - 1 - i], w = sh[t->ndim - 1 - i];
        ok = v == w || v == 1;
    }
    if (!ok) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'values' has shape %s; expected one that "
                "broadcasts to %s", nt__shape_str(values->ndim, values->shape, s1, sizeof s1),
                nt__shape_str(t->ndim, sh, s2, sizeof s2));
        return NULL;
    }
    nt_tensor *ix = nt_reshape_at(site, index, 1, &n);
    nt_tensor *neg = ix ? nt_lt_at(site, ix, nt_zeros_at(site, NT_I32, 0, NULL)) : NULL;
    ix = neg ? nt_where_at(site, neg, nt_add_scalar_at(site, ix, (double)t->shape[0]), ix) : NULL;
    nt_tensor *v = ix ? nt_expand_at(site, values, t->ndim, sh) : NULL;
    return v ? scat_dispatch(site, fn, accumulate ? NT_OP_SCATTER_ADD : NT_OP_SCATTER, t, 0, ix,
                             v, true, 1.0)
             : NULL;
}

NT_API nt_tensor *nt_index_put_at(const nt_site *site, nt_tensor *t, nt_tensor *index,
                                  nt_tensor *values, bool accumulate)
{
    const char *fn = "nt_index_put";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t) ||
        !nt__check_arg(site, fn, "index", index) || !nt__check_arg(site, fn, "values", values))
        return NULL;
    if (!index_dtype(site, fn, "index", index) || !same_dtype(site, fn, "values", t, values))
        return NULL;
    if (t->ndim == 0) {
        nt__err(site, NT_ESHAPE, fn, "argument 't' is 0-d; expected at least 1 dim");
        return NULL;
    }
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *y = index->dtype == NT_U8
                       ? index_put_mask(site, fn, t, index, values, accumulate)
                       : index_put_index(site, fn, t, index, values, accumulate);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_index_put(nt_tensor *t, nt_tensor *index, nt_tensor *values,
                               bool accumulate)
{
    return nt_index_put_at(NT_RA_SITE, t, index, values, accumulate);
}

/* ---------------- one_hot ---------------- */

/* num_classes -1: the largest label + 1, read back from the device (a sync) */
static int64_t infer_classes(const nt_site *site, const char *fn, nt_tensor *labels)
{
    if (nt__numel(labels->ndim, labels->shape) == 0) {
        nt__err(site, NT_EINVAL, fn, "num_classes -1 cannot be inferred from an empty 'labels'");
        return -1;
    }
    double mx = 0;
    nt_tensor *m = nt_max_at(site, labels, NT_DIM_ALL, false);
    if (!m || nt_item_at(site, m, &mx))
        return -1;
    if (mx < 0) {
        nt__err(site, NT_ERANGE, fn, "argument 'labels' has largest value %g; class values must "
                "be non-negative", mx);
        return -1;
    }
    return (int64_t)mx + 1;
}

NT_API nt_tensor *nt_one_hot_at(const nt_site *site, nt_tensor *labels, int64_t num_classes)
{
    const char *fn = "nt_one_hot";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "labels", labels) ||
        !index_dtype(site, fn, "labels", labels))
        return NULL;
    if (num_classes < -1 || labels->ndim >= NT_MAX_DIMS) {
        nt__err(site, NT_EINVAL, fn, num_classes < -1
                    ? "argument 'num_classes' is %lld; expected >= 0, or -1 (the largest label + 1)"
                    : "argument 'labels' has %lld dims; expected fewer than NT_MAX_DIMS",
                num_classes < -1 ? (long long)num_classes : (long long)labels->ndim);
        return NULL;
    }
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    int nd = labels->ndim + 1;
    int64_t C = num_classes == -1 ? infer_classes(site, fn, labels) : num_classes;
    int64_t sh[NT_MAX_DIMS], s1[NT_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        sh[i] = i < labels->ndim ? labels->shape[i] : C, s1[i] = i < labels->ndim ? sh[i] : 1;
    nt_tensor *z = C >= 0 ? nt_zeros_at(site, NT_I32, nd, sh) : NULL;
    nt_tensor *ix = z ? nt_reshape_at(site, labels, nd, s1) : NULL;
    nt_tensor *one = ix ? nt_expand_at(site, nt_ones_at(site, NT_I32, 0, NULL), nd, s1) : NULL;
    nt_tensor *y = one ? scat_dispatch(site, fn, NT_OP_SCATTER, z, nd - 1, ix, one, false, 1.0)
                       : NULL;
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_one_hot(nt_tensor *labels, int64_t num_classes)
{
    return nt_one_hot_at(NT_RA_SITE, labels, num_classes);
}
