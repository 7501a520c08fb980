/* dispatcher/api_shape.c - squeeze and unsqueeze (views, recorded as
 * reshapes), flatten, unflatten, narrow, chunk and stack (composites of
 * reshape, slice and cat: views wherever those give views), and diagonal
 * (a strided view, op DIAGONAL). */
#include "dispatcher/dispatch.h"

static bool arg_ok(const nt_site *site, const char *fn, nt_tensor *t)
{
    return nt__ensure_init() && nt__check_arg(site, fn, "t", t);
}

/* dim of a tensor with n dims (n == 0 takes 0 and -1, as PyTorch), or -1 */
static int dim_of(const nt_site *site, const char *fn, const char *what, int dim, int n)
{
    int d = nt__norm_dim(dim, n > 0 ? n : 1);
    if (d < 0)
        nt__err(site, NT_EDIM, fn, "%s %d is out of range for a tensor with %d dims", what, dim, n);
    return d;
}

/* reshape under fn's name: its errors say whose they are */
static nt_tensor *reshape_as(const nt_site *site, const char *fn, nt_tensor *t, int nd,
                             const int64_t *sh)
{
    nt_tensor *y = nt_reshape_at(site, t, nd, sh);
    if (!y)
        nt__err_within(fn);
    return y;
}

/* t's elements in the same order with size-1 dims dropped or added: always
 * a view (an expanded t too, as in PyTorch), recorded as a reshape (whose
 * backward reshapes g back) */
static nt_tensor *view_as(const nt_site *site, const char *fn, nt_tensor *t, int n,
                          const int64_t *sh, const int64_t *st)
{
    nt__call c;
    if (!nt__call_begin(&c, site, fn, NT_OP_RESHAPE, 1, &t, "t"))
        return nt__call_fail(&c);
    c.odt[0] = (nt_dtype)t->dtype;
    c.ondim[0] = n;
    for (int i = 0; i < n; i++)
        c.oshape[0][i] = sh[i];
    return nt__dispatch_view(&c, nt__make_view(c.in[0], n, sh, st, c.in[0]->offset, site));
}

NT_API nt_tensor *nt_squeeze_at(const nt_site *site, nt_tensor *t, int dim)
{
    const char *fn = "nt_squeeze";
    if (!arg_ok(site, fn, t))
        return NULL;
    int d = dim == NT_DIM_ALL ? -1 : dim_of(site, fn, "dim", dim, t->ndim);
    if (dim != NT_DIM_ALL && d < 0)
        return NULL;
    int64_t sh[NT_MAX_DIMS], st[NT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != 1 || (dim != NT_DIM_ALL && i != d))
            sh[n] = t->shape[i], st[n++] = t->stride[i];
    return view_as(site, fn, t, n, sh, st);
}
NT_API nt_tensor *nt_squeeze(nt_tensor *t, int dim) { return nt_squeeze_at(NT_RA_SITE, t, dim); }

NT_API nt_tensor *nt_unsqueeze_at(const nt_site *site, nt_tensor *t, int dim)
{
    const char *fn = "nt_unsqueeze";
    if (!arg_ok(site, fn, t))
        return NULL;
    if (t->ndim >= NT_MAX_DIMS) {
        nt__err(site, NT_EINVAL, fn, "argument 't' has %d dims, the most a tensor may have",
                t->ndim);
        return NULL;
    }
    int d = dim_of(site, fn, "dim", dim, t->ndim + 1);
    if (d < 0)
        return NULL;
    int64_t sh[NT_MAX_DIMS], st[NT_MAX_DIMS];
    for (int i = 0, k = 0; i <= t->ndim; i++) {
        /* the new dim's stride: PyTorch's (the next dim's extent), never used */
        st[i] = i == d ? (k < t->ndim ? t->shape[k] * t->stride[k] : 1) : t->stride[k];
        sh[i] = i == d ? 1 : t->shape[k++];
    }
    return view_as(site, fn, t, t->ndim + 1, sh, st);
}
NT_API nt_tensor *nt_unsqueeze(nt_tensor *t, int dim) { return nt_unsqueeze_at(NT_RA_SITE, t, dim); }

NT_API nt_tensor *nt_flatten_at(const nt_site *site, nt_tensor *t, int start_dim, int end_dim)
{
    const char *fn = "nt_flatten";
    if (!arg_ok(site, fn, t))
        return NULL;
    int a = dim_of(site, fn, "start_dim", start_dim, t->ndim);
    int b = a < 0 ? -1 : dim_of(site, fn, "end_dim", end_dim, t->ndim);
    if (a < 0 || b < 0)
        return NULL;
    if (a > b) {
        nt__err(site, NT_EINVAL, fn, "start_dim %d comes after end_dim %d", start_dim, end_dim);
        return NULL;
    }
    if (t->ndim == 0) /* PyTorch: a 0-d tensor flattens to [1] */
        return reshape_as(site, fn, t, 1, (int64_t[]){1});
    int64_t sh[NT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i <= a || i > b)
            sh[n++] = t->shape[i];
        else
            sh[n - 1] *= t->shape[i];
    }
    return reshape_as(site, fn, t, n, sh);
}
NT_API nt_tensor *nt_flatten(nt_tensor *t, int start_dim, int end_dim)
{
    return nt_flatten_at(NT_RA_SITE, t, start_dim, end_dim);
}

NT_API nt_tensor *nt_unflatten_at(const nt_site *site, nt_tensor *t, int dim, int n,
                                  const int64_t *sizes)
{
    const char *fn = "nt_unflatten";
    if (!arg_ok(site, fn, t))
        return NULL;
    int d = t->ndim ? dim_of(site, fn, "dim", dim, t->ndim) : -1;
    if (t->ndim == 0)
        nt__err(site, NT_EDIM, fn, "argument 't' is 0-d; expected at least 1 dim");
    if (d < 0)
        return NULL;
    if (n < 1 || !sizes || t->ndim - 1 + n > NT_MAX_DIMS) {
        nt__err(site, NT_EINVAL, fn, "argument 'n' is %d; expected 1..%d with a sizes array", n,
                NT_MAX_DIMS - t->ndim + 1);
        return NULL;
    }
    int64_t known = 1;
    int infer = -1;
    for (int i = 0; i < n; i++) {
        if (sizes[i] == -1 && infer < 0)
            infer = i;
        else if (sizes[i] < 0 || __builtin_mul_overflow(known, sizes[i], &known)) {
            nt__err(site, NT_EINVAL, fn, "sizes[%d] is %lld; expected a size >= 0 or one -1", i,
                    (long long)sizes[i]);
            return NULL;
        }
    }
    int64_t len = t->shape[d], sh[NT_MAX_DIMS];
    if (infer >= 0 ? (known == 0 || len % known) : known != len) {
        nt__err(site, NT_ESHAPE, fn, "sizes multiply to %lld%s; expected dim %d's size %lld",
                (long long)known, infer >= 0 ? " (with one -1)" : "", d, (long long)len);
        return NULL;
    }
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i != d) {
            sh[k++] = t->shape[i];
            continue;
        }
        for (int j = 0; j < n; j++)
            sh[k++] = j == infer ? len / known : sizes[j];
    }
    return reshape_as(site, fn, t, k, sh);
}
NT_API nt_tensor *nt_unflatten(nt_tensor *t, int dim, int n, const int64_t *sizes)
{
    return nt_unflatten_at(NT_RA_SITE, t, dim, n, sizes);
}

NT_API nt_tensor *nt_narrow_at(const nt_site *site, nt_tensor *t, int dim, int64_t start,
                               int64_t length)
{
    const char *fn = "nt_narrow";
    if (!arg_ok(site, fn, t))
        return NULL;
    if (t->ndim == 0) {
        nt__err(site, NT_EDIM, fn, "argument 't' is 0-d; expected at least 1 dim");
        return NULL;
    }
    int d = dim_of(site, fn, "dim", dim, t->ndim);
    if (d < 0)
        return NULL;
    int64_t n = t->shape[d];
    if (start < -n || start > n) {
        nt__err(site, NT_EINVAL, fn, "start %lld is out of range [%lld, %lld] for dim %d",
                (long long)start, (long long)-n, (long long)n, d);
        return NULL;
    }
    if (start < 0)
        start += n;
    if (length < 0 || length > n - start) {
        nt__err(site, NT_EINVAL, fn, "length %lld is out of range: start %lld + length must lie "
                "in [start, %lld] (dim %d)", (long long)length, (long long)start, (long long)n, d);
        return NULL;
    }
    nt_tensor *y = nt_slice_at(site, t, d, start, start + length, 1);
    if (!y)
        nt__err_within(fn);
    return y;
}
NT_API nt_tensor *nt_narrow(nt_tensor *t, int dim, int64_t start, int64_t length)
{
    return nt_narrow_at(NT_RA_SITE, t, dim, start, length);
}

/* torch.chunk: split with ceil(size / chunks) elements each (so possibly
 * fewer than `chunks` views); an empty dim gives `chunks` empty views. */
NT_API int nt_chunk_at(const nt_site *site, nt_tensor *t, int64_t chunks, int dim,
                       nt_tensor **out, int max_out)
{
    const char *fn = "nt_chunk";
    if (!arg_ok(site, fn, t))
        return nt__err_or(NT_EINVAL);
    if (chunks <= 0)
        return nt__err(site, NT_EINVAL, fn, "argument 'chunks' is %lld; expected >= 1",
                       (long long)chunks);
    if (t->ndim == 0)
        return nt__err(site, NT_EDIM, fn, "argument 't' is 0-d; expected at least 1 dim");
    int d = dim_of(site, fn, "dim", dim, t->ndim);
    if (d < 0)
        return NT_EDIM;
    int64_t len = t->shape[d];
    if (len > 0) {
        int rc = nt_split_at(site, t, (len - 1) / chunks + 1, d, out, max_out);
        return rc >= 0 ? rc : nt__err_within(fn);
    }
    if (chunks > INT32_MAX || (out && max_out < chunks) || (!out && max_out != 0))
        return nt__err(site, NT_EINVAL, fn, "argument 'max_out' is %d%s; the chunk makes %lld "
                       "views", max_out, out ? "" : " with out NULL", (long long)chunks);
    for (int64_t k = 0; out && k < chunks; k++)
        if (!(out[k] = nt_slice_at(site, t, d, 0, 0, 1))) {
            int rc = nt__err_within(fn);
            while (k-- > 0)
                nt_release(out[k]), out[k] = NULL;
            return rc;
        }
    return (int)chunks;
}
NT_API int nt_chunk(nt_tensor *t, int64_t chunks, int dim, nt_tensor **out, int max_out)
{
    return nt_chunk_at(NT_RA_SITE, t, chunks, dim, out, max_out);
}

NT_API nt_tensor *nt_stack_at(const nt_site *site, nt_tensor *const *ts, int n, int dim)
{
    const char *fn = "nt_stack";
    if (!nt__ensure_init())
        return NULL;
    if (!ts || n < 1 || n > 4096) {
        nt__err(site, NT_EINVAL, fn, "expected an array of 1..4096 tensors (got %s, n = %d)",
                ts ? "an array" : "NULL", n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        char name[24];
        snprintf(name, sizeof name, "ts[%d]", i);
        if (!nt__check_arg(site, fn, name, ts[i]))
            return NULL;
    }
    nt_tensor *t0 = ts[0];
    for (int k = 1; k < n; k++) {
        bool ok = ts[k]->ndim == t0->ndim && ts[k]->dtype == t0->dtype;
        for (int i = 0; ok && i < t0->ndim; i++)
            ok = ts[k]->shape[i] == t0->shape[i];
        if (!ok) {
            char s1[128], s2[128];
            nt__err(site, NT_ESHAPE, fn, "ts[%d] (%s %s) does not match ts[0] (%s %s); stack "
                    "expects equal shapes and dtypes", k, nt_dtype_name((nt_dtype)ts[k]->dtype),
                    nt__shape_str(ts[k]->ndim, ts[k]->shape, s1, sizeof s1),
                    nt_dtype_name((nt_dtype)t0->dtype),
                    nt__shape_str(t0->ndim, t0->shape, s2, sizeof s2));
            return NULL;
        }
    }
    if (t0->ndim >= NT_MAX_DIMS) {
        nt__err(site, NT_EINVAL, fn, "ts[0] has %d dims, the most a tensor may have", t0->ndim);
        return NULL;
    }
    int d = dim_of(site, fn, "dim", dim, t0->ndim + 1);
    if (d < 0)
        return NULL;
    nt_tensor **u = malloc((size_t)n * sizeof *u);
    nt_scope *s = u ? nt_scope_begin() : NULL;
    if (!s) {
        free(u);
        nt__err_hostmem(site, fn, "the stacked list");
        return NULL;
    }
    nt_tensor *y = NULL;
    int k = 0;
    while (k < n && (u[k] = nt_unsqueeze_at(site, ts[k], d)))
        k++;
    if (k == n)
        y = nt_cat_at(site, u, n, d);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    free(u);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_stack(nt_tensor *const *ts, int n, int dim)
{
    return nt_stack_at(NT_RA_SITE, ts, n, dim);
}

/* torch.diagonal: the elements (i, i + offset) of dims dim1 and dim2, as a
 * last dim; the other dims keep their order.  A view (stride the sum of
 * the two). */
NT_API nt_tensor *nt_diagonal_at(const nt_site *site, nt_tensor *t, int64_t offset, int dim1,
                                 int dim2)
{
    const char *fn = "nt_diagonal";
    nt__call c;
    if (!nt__call_begin(&c, site, fn, NT_OP_DIAGONAL, 1, &t, "t"))
        return nt__call_fail(&c);
    t = c.in[0];
    if (t->ndim < 2) {
        nt__err(site, NT_EDIM, fn, "argument 't' has %d dims; expected at least 2", t->ndim);
        return nt__call_fail(&c);
    }
    int a = nt__norm_dim(dim1, t->ndim), b = nt__norm_dim(dim2, t->ndim);
    if (a < 0 || b < 0 || a == b) {
        nt__err(site, NT_EDIM, fn, "dims (%d, %d) are %s for a tensor with %d dims", dim1, dim2,
                a < 0 || b < 0 ? "out of range" : "the same dim", t->ndim);
        return nt__call_fail(&c);
    }
    int64_t n1 = t->shape[a], n2 = t->shape[b], L, off = t->offset;
    if (offset >= 0)
        L = n2 - offset < n1 ? n2 - offset : n1;
    else
        L = n1 + offset < n2 ? n1 + offset : n2;
    if (L <= 0)
        L = 0;
    else
        off += offset >= 0 ? offset * t->stride[b] : -offset * t->stride[a];
    int64_t sh[NT_MAX_DIMS], st[NT_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++)
        if (i != a && i != b)
            sh[k] = t->shape[i], st[k++] = t->stride[i];
    sh[k] = L, st[k++] = t->stride[a] + t->stride[b];
    c.p.i[0] = offset;
    c.p.i[1] = a;
    c.p.i[2] = b;
    c.odt[0] = (nt_dtype)t->dtype;
    c.ondim[0] = k;
    for (int i = 0; i < k; i++)
        c.oshape[0][i] = sh[i];
    return nt__dispatch_view(&c, nt__make_view(t, k, sh, st, off, site));
}
NT_API nt_tensor *nt_diagonal(nt_tensor *t, int64_t offset, int dim1, int dim2)
{
    return nt_diagonal_at(NT_RA_SITE, t, offset, dim1, dim2);
}
