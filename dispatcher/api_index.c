/* dispatcher/api_index.c - gather, index_select (kernels: cpu/index.c,
 * neuron/index.c), and the composites repeat and split. */
#include <math.h>

#include "dispatcher/dispatch.h"

/* An index argument: i32, i64 or u8, like nt_embedding's. */
static bool index_dtype(nt__call *c, nt_tensor *ix)
{
    if (ix->dtype == NT_I32 || ix->dtype == NT_U8 || ix->dtype == NT_I64)
        return true;
    nt__err(c->site, NT_EDTYPE, c->fn, "argument 'index' has dtype %s; expected i32, i64 or u8",
            nt_dtype_name((nt_dtype)ix->dtype));
    return false;
}

/* dim of t (at least 1-D), normalised into *d. */
static bool index_dim(nt__call *c, nt_tensor *t, int dim, int *d)
{
    if (t->ndim == 0) {
        nt__err(c->site, NT_ESHAPE, c->fn, "argument 't' is 0-d; expected at least 1 dim");
        return false;
    }
    *d = nt__norm_dim(dim, t->ndim);
    if (*d < 0) {
        nt__err(c->site, NT_EDIM, c->fn, "dim %d is out of range for a tensor with %d dims", dim,
                t->ndim);
        return false;
    }
    return true;
}

NT_API nt_tensor *nt_gather_at(const nt_site *site, nt_tensor *t, int dim, nt_tensor *index)
{
    nt__call c;
    nt_tensor *in[2] = {t, index};
    if (!nt__call_begin(&c, site, "nt_gather", NT_OP_GATHER, 2, in, "t,index"))
        return nt__call_fail(&c);
    t = c.in[0], index = c.in[1];
    int d;
    if (!index_dtype(&c, index) || !index_dim(&c, t, dim, &d))
        return nt__call_fail(&c);
    bool ok = index->ndim == t->ndim;
    for (int i = 0; ok && i < t->ndim; i++)
        ok = i == d || index->shape[i] <= t->shape[i];
    if (!ok) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, "nt_gather", "argument 'index' has shape %s; expected %d dims, "
                "each no larger than t's %s except dim %d",
                nt__shape_str(index->ndim, index->shape, s1, sizeof s1), t->ndim,
                nt__shape_str(t->ndim, t->shape, s2, sizeof s2), d);
        return nt__call_fail(&c);
    }
    c.p.dim = d;
    c.odt[0] = (nt_dtype)t->dtype;
    c.ondim[0] = index->ndim;
    for (int i = 0; i < index->ndim; i++)
        c.oshape[0][i] = index->shape[i];
    c.flops = (double)nt__numel(index->ndim, index->shape);
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_gather(nt_tensor *t, int dim, nt_tensor *index)
{
    return nt_gather_at(NT_RA_SITE, t, dim, index);
}

NT_API nt_tensor *nt_index_select_at(const nt_site *site, nt_tensor *t, int dim,
                                     nt_tensor *index)
{
    nt__call c;
    nt_tensor *in[2] = {t, index};
    if (!nt__call_begin(&c, site, "nt_index_select", NT_OP_INDEX_SELECT, 2, in, "t,index"))
        return nt__call_fail(&c);
    t = c.in[0], index = c.in[1];
    int d;
    if (!index_dtype(&c, index) || !index_dim(&c, t, dim, &d))
        return nt__call_fail(&c);
    if (index->ndim > 1) {
        char s1[128];
        nt__err(site, NT_ESHAPE, "nt_index_select", "argument 'index' has shape %s; expected "
                "1-D (or 0-d)", nt__shape_str(index->ndim, index->shape, s1, sizeof s1));
        return nt__call_fail(&c);
    }
    c.p.dim = d;
    c.p.flag = 1; /* index_add's mode for the backward */
    c.odt[0] = (nt_dtype)t->dtype;
    c.ondim[0] = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        c.oshape[0][i] = i == d ? nt__numel(index->ndim, index->shape) : t->shape[i];
    c.flops = (double)nt__numel(c.ondim[0], c.oshape[0]);
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_index_select(nt_tensor *t, int dim, nt_tensor *index)
{
    return nt_index_select_at(NT_RA_SITE, t, dim, index);
}

/* ---------------- repeat ---------------- */

/* One dim i of x (n dims, contiguous or not) repeated r times: x as
 * [P, a, Q] -> [P, 1, a, Q] -> expand [P, r, a, Q] -> a contiguous copy ->
 * x's shape with dim i of r * a.  The expand's backward sums the r copies
 * (nt_sum over that dim: the canonical order). */
static nt_tensor *repeat_dim(const nt_site *site, nt_tensor *x, int i, int64_t r)
{
    int64_t P = 1, Q = 1, a = x->shape[i];
    for (int k = 0; k < x->ndim; k++) {
        if (k < i)
            P *= x->shape[k];
        else if (k > i)
            Q *= x->shape[k];
    }
    int64_t s4[4] = {P, 1, a, Q}, e4[4] = {P, r, a, Q}, out[NT_MAX_DIMS];
    for (int k = 0; k < x->ndim; k++)
        out[k] = k == i ? r * a : x->shape[k];
    nt_tensor *y = nt_reshape_at(site, x, 4, s4);
    y = y ? nt_expand_at(site, y, 4, e4) : NULL;
    y = y ? nt__copy_to(site, "nt_repeat", y, (nt_dtype)-1) : NULL;
    return y ? nt_reshape_at(site, y, x->ndim, out) : NULL;
}

NT_API nt_tensor *nt_repeat_at(const nt_site *site, nt_tensor *t, const int64_t *repeats, int n)
{
    const char *fn = "nt_repeat";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t))
        return NULL;
    if (n < t->ndim || n > NT_MAX_DIMS || (n > 0 && !repeats)) {
        nt__err(site, NT_EINVAL, fn, "argument 'n' is %d; expected %d..%d (t's dims or more) "
                "with a repeats array", n, t->ndim, NT_MAX_DIMS);
        return NULL;
    }
    int64_t sh[NT_MAX_DIMS], total = 1;
    for (int i = 0; i < n; i++) {
        int64_t a = i < n - t->ndim ? 1 : t->shape[i - (n - t->ndim)];
        if (repeats[i] < 0) {
            nt__err(site, NT_EINVAL, fn, "repeats[%d] is %lld; expected >= 0", i,
                    (long long)repeats[i]);
            return NULL;
        }
        if (__builtin_mul_overflow(a, repeats[i], &sh[i]) ||
            __builtin_mul_overflow(total, sh[i], &total) || total > NT__MAX_NUMEL) {
            nt__err(site, NT_EINVAL, fn, "the result would have more than 2^48 elements (the "
                    "most a tensor may have)");
            return NULL;
        }
    }
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *y = t;
    if (n > t->ndim) { /* leading repeats add dims of 1 */
        int64_t s1[NT_MAX_DIMS];
        for (int i = 0; i < n; i++)
            s1[i] = i < n - t->ndim ? 1 : t->shape[i - (n - t->ndim)];
        y = nt_reshape_at(site, y, n, s1);
    }
    bool copied = false;
    for (int i = 0; y && i < n; i++)
        if (repeats[i] != 1) {
            y = repeat_dim(site, y, i, repeats[i]);
            copied = true;
        }
    if (y && !copied) /* all ones: still a new tensor, as in PyTorch */
        y = nt__copy_to(site, fn, y, (nt_dtype)-1);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn); /* an inner op's error (nt_reshape, a copy): say whose */
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_repeat(nt_tensor *t, const int64_t *repeats, int n)
{
    return nt_repeat_at(NT_RA_SITE, t, repeats, n);
}

/* ---------------- split ---------------- */

NT_API int nt_split_at(const nt_site *site, nt_tensor *t, int64_t split_size, int dim,
                       nt_tensor **out, int max_out)
{
    const char *fn = "nt_split";
    if (!nt__ensure_init())
        return nt__err_or(NT_ESTATE);
    if (!nt__check_arg(site, fn, "t", t))
        return nt_last_error();
    int d = nt__norm_dim(dim, t->ndim);
    if (d < 0) {
        nt__err(site, NT_EDIM, fn, "dim %d is out of range for a tensor with %d dims", dim,
                t->ndim);
        return NT_EDIM;
    }
    if (split_size <= 0) {
        nt__err(site, NT_EINVAL, fn, "argument 'split_size' is %lld; expected >= 1",
                (long long)split_size);
        return NT_EINVAL;
    }
    int64_t len = t->shape[d];
    int64_t cnt = len == 0 ? 1 : (len - 1) / split_size + 1;
    if (!out && max_out == 0)
        return cnt > INT32_MAX ? INT32_MAX : (int)cnt;
    if (!out || max_out < cnt) {
        nt__err(site, NT_EINVAL, fn, "argument 'max_out' is %d%s; the split makes %lld views",
                max_out, out ? "" : " with out NULL", (long long)cnt);
        return NT_EINVAL;
    }
    for (int64_t k = 0; k < cnt; k++) {
        int64_t a = k * split_size, b = len - a < split_size ? len : a + split_size;
        out[k] = nt_slice_at(site, t, d, a, b, 1);
        if (!out[k]) {
            int rc = nt_last_error();
            while (k-- > 0) {
                nt_release(out[k]);
                out[k] = NULL;
            }
            return rc ? rc : NT_EINVAL;
        }
    }
    return (int)cnt;
}
NT_API int nt_split(nt_tensor *t, int64_t split_size, int dim, nt_tensor **out, int max_out)
{
    return nt_split_at(NT_RA_SITE, t, split_size, dim, out, max_out);
}

/* ---------------- topk ---------------- */

/* A 0-d x, as PyTorch: dim 0 or -1, k 0 or 1, and both k give the one
 * element (0-d values, a 0-d index 0) -- the topk of x viewed as [1],
 * viewed back as 0-d, so its gradient is the same ops'. */
static int topk_0d(const nt_site *site, const char *fn, nt_tensor *x, int64_t k, int dim,
                   bool largest, nt_tensor **values, nt_tensor **indices)
{
    if (dim != 0 && dim != -1)
        return nt__err(site, NT_EDIM, fn, "dim %d is out of range for a 0-d tensor (expected 0 "
                       "or -1)", dim);
    if (k != 0 && k != 1)
        return nt__err(site, NT_EINVAL, fn, "argument 'k' is %lld; expected 0 or 1 for a 0-d "
                       "tensor (either gives its one element, as in PyTorch)", (long long)k);
    nt_tensor *x1 = nt_reshape_at(site, x, 1, (int64_t[]){1}), *v1 = NULL, *i1 = NULL;
    int rc = x1 ? nt_topk_at(site, x1, 1, 0, largest, &v1, &i1) : nt_last_error();
    nt_tensor *v = rc ? NULL : nt_reshape_at(site, v1, 0, NULL);
    nt_tensor *ix = v ? nt_reshape_at(site, i1, 0, NULL) : NULL;
    if (!ix) {
        rc = nt__err_within(fn);
        if (v)
            nt_release(v);
    }
    nt_tensor *tmp[3] = {x1, v1, i1};
    for (int i = 0; i < 3; i++)
        if (tmp[i])
            nt_release(tmp[i]);
    if (rc)
        return rc;
    *values = v;
    *indices = ix;
    return 0;
}

/* The TOPK op gives the indices (cpu/sample.c, neuron/sample.c); the
 * values are gathered with them, so their gradient is gather's (index_add
 * into x's shape). */
NT_API int nt_topk_at(const nt_site *site, nt_tensor *x, int64_t k, int dim, bool largest,
                      nt_tensor **values, nt_tensor **indices)
{
    const char *fn = "nt_topk";
    if (values)
        *values = NULL;
    if (indices)
        *indices = NULL;
    if (!nt__ensure_init())
        return nt__err_or(NT_EINVAL);
    if (!values || !indices)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL; expected where to put the %s",
                       values ? "indices" : "values", values ? "indices" : "values");
    if (nt__check_arg(site, fn, "x", x) && x->ndim == 0)
        return topk_0d(site, fn, x, k, dim, largest, values, indices);
    nt__call c;
    if (!nt__call_begin(&c, site, fn, NT_OP_TOPK, 1, &x, "x")) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    x = c.in[0];
    int d = nt__norm_dim(dim, x->ndim);
    if (d < 0) {
        nt__err(site, NT_EDIM, fn, "dim %d is out of range for a tensor with %d dims", dim,
                x->ndim);
    } else if (k < 0 || k > x->shape[d]) {
        nt__err(site, NT_EINVAL, fn, "argument 'k' is %lld; expected 0 <= k <= %lld, the size "
                "of dim %d", (long long)k, (long long)x->shape[d], d);
    } else {
        c.p.dim = d;
        c.p.i[0] = k;
        c.p.flag = largest;
        c.odt[0] = NT_I32;
        c.ondim[0] = x->ndim;
        for (int i = 0; i < x->ndim; i++)
            c.oshape[0][i] = i == d ? k : x->shape[i];
        double n = (double)nt__numel(x->ndim, x->shape);
        c.flops = n * (k > 1 ? log2((double)x->shape[d]) : 1.0);
        nt_tensor *ix = nt__dispatch(&c);
        nt_tensor *v = ix ? nt_gather_at(site, x, d, ix) : NULL;
        if (v) {
            *values = v;
            *indices = ix;
            return 0;
        }
        int rc = nt_last_error();
        if (ix)
            nt_release(ix);
        return rc ? rc : NT_EINVAL;
    }
    nt__call_fail(&c);
    return nt_last_error();
}
NT_API int nt_topk(nt_tensor *x, int64_t k, int dim, bool largest, nt_tensor **values,
                   nt_tensor **indices)
{
    return nt_topk_at(NT_RA_SITE, x, k, dim, largest, values, indices);
}

/* nt_flip: validates dims into a bit mask (*mask), or fails naming the
 * argument */
static bool flip_dims(const nt_site *site, const char *fn, const nt_tensor *t, int ndims,
                      const int *dims, unsigned *mask)
{
    *mask = 0;
    if (ndims < 0 || (ndims > 0 && !dims)) {
        nt__err(site, NT_EINVAL, fn, "argument 'dims' is %s with ndims = %d; expected an array "
                "of ndims >= 0 dims", dims ? "an array" : "NULL", ndims);
        return false;
    }
    for (int i = 0; i < ndims; i++) {
        int d = nt__norm_dim(dims[i], t->ndim);
        if (d < 0) {
            nt__err(site, NT_EDIM, fn, "dims[%d] = %d is out of range for a tensor with %d dims",
                    i, dims[i], t->ndim);
            return false;
        }
        if (*mask >> d & 1) {
            nt__err(site, NT_EINVAL, fn, "dims[%d] = %d names dim %d again; expected distinct "
                    "dims", i, dims[i], d);
            return false;
        }
        *mask |= 1u << d;
    }
    return true;
}

NT_API nt_tensor *nt_flip_at(const nt_site *site, nt_tensor *t, int ndims, const int *dims)
{
    const char *fn = "nt_flip";
    nt__call c;
    if (!nt__call_begin(&c, site, fn, NT_OP_FLIP, 1, &t, "t"))
        return nt__call_fail(&c);
    t = c.in[0];
    unsigned mask;
    if (!flip_dims(site, fn, t, ndims, dims, &mask))
        return nt__call_fail(&c);
    c.p.i[0] = mask;
    c.odt[0] = (nt_dtype)t->dtype;
    c.ondim[0] = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        c.oshape[0][i] = t->shape[i];
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return nt__call_fail(&c);
    }
    /* the gathers record nothing: the node is flip's (nt__dispatch_view) */
    nt_no_grad_begin();
    nt_tensor *y = t;
    for (int d = 0; y && d < t->ndim; d++)
        if ((mask >> d & 1) && t->shape[d] > 1) {
            double n = (double)t->shape[d];
            y = nt_index_select_at(site, y, d, nt_arange_at(site, NT_I32, n - 1, -1, -1));
        }
    if (y == t) /* nothing to reverse: still a new tensor, as in PyTorch */
        y = nt__copy_to(site, fn, t, (nt_dtype)-1);
    nt_no_grad_end();
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__dispatch_view(&c, y) : nt__call_fail(&c);
}
NT_API nt_tensor *nt_flip(nt_tensor *t, int ndims, const int *dims)
{
    return nt_flip_at(NT_RA_SITE, t, ndims, dims);
}
