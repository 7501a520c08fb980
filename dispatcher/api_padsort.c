/* dispatcher/api_padsort.c - nt_pad, nt_roll, nt_sort, nt_argsort and
 * nt_interpolate (issue 33): composites of ops that already give the same
 * bits on every backend and mode (nt_index_select, nt_slice, nt_cat,
 * nt_full, nt_topk, nt_mul, nt_add), so their values and gradients are
 * those ops' (docs/ops.md, "Padding, rolling, sorting, resizing").  The
 * indices and weights are computed here on the host, from the shapes only. */
#include <math.h>
#include <stdlib.h>

#include "dispatcher/dispatch.h"

/* A 1-D i32 index of n entries, or NULL (error set naming fn). */
static nt_tensor *host_index(const nt_site *site, const char *fn, const int32_t *v, int64_t n)
{
    nt_tensor *t = nt_from_host_at(site, v ? (const void *)v : (const void *)"", NT_I32, 1, &n);
    if (!t)
        nt__err_within(fn);
    return t;
}

/* y with index_select along d by idx(o) for o in [0, m): idx from fill */
typedef int64_t (*idx_fn)(int64_t o, int64_t n, int64_t a, int64_t b);

static nt_tensor *select_by(const nt_site *site, const char *fn, nt_tensor *y, int d, int64_t m,
                            idx_fn f, int64_t a, int64_t b)
{
    int64_t n = nt_shape(y, d);
    int32_t *v = malloc((size_t)(m > 0 ? m : 1) * sizeof *v);
    if (!v) {
        nt__err_hostmem(site, fn, "an index");
        return NULL;
    }
    for (int64_t o = 0; o < m; o++)
        v[o] = (int32_t)f(o, n, a, b);
    nt_tensor *ix = host_index(site, fn, v, m);
    free(v);
    return ix ? nt_index_select_at(site, y, d, ix) : NULL;
}

/* ---------------- pad ---------------- */

static int64_t reflect_ix(int64_t o, int64_t n, int64_t l, int64_t unused)
{
    (void)unused;
    int64_t i = o - l;
    if (i < 0)
        i = -i;
    if (i >= n)
        i = 2 * (n - 1) - i;
    return i;
}

static int64_t replicate_ix(int64_t o, int64_t n, int64_t l, int64_t unused)
{
    (void)unused;
    int64_t i = o - l;
    return i < 0 ? 0 : i >= n ? n - 1 : i;
}

/* constant pad of dim d by l before and r after: the crop (negative pads)
 * as a slice, then cat(full(l), the crop, full(r)) */
static nt_tensor *pad_const_dim(const nt_site *site, const char *fn, nt_tensor *y, int d,
                                int64_t l, int64_t r, double value)
{
    int64_t n = nt_shape(y, d);
    int64_t a = l < 0 ? -l : 0, b = r < 0 ? n + r : n;
    nt_tensor *mid = nt_slice_at(site, y, d, a, b, 1), *parts[3];
    int np = 0, nd = nt_ndim(y);
    int64_t sh[NT_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        sh[i] = nt_shape(y, i);
    if (!mid)
        return NULL;
    if (l > 0) {
        sh[d] = l;
        parts[np++] = nt_full_at(site, nt_dtype_of(y), nd, sh, value);
    }
    parts[np++] = mid;
    if (r > 0) {
        sh[d] = r;
        parts[np++] = nt_full_at(site, nt_dtype_of(y), nd, sh, value);
    }
    for (int i = 0; i < np; i++)
        if (!parts[i])
            return NULL;
    return np == 1 ? nt__copy_to(site, fn, mid, (nt_dtype)-1) : nt_cat_at(site, parts, np, d);
}

static const char *const PAD_NAMES[3] = {"constant", "reflect", "replicate"};

/* the checks of nt_pad before anything is made; true if all pass */
static bool pad_check(const nt_site *site, const char *fn, nt_tensor *x, int npad,
                      const int64_t *pads, nt_pad_mode mode, double value)
{
    if ((int)mode < 0 || (int)mode > NT_PAD_REPLICATE)
        return !nt__err(site, NT_EINVAL, fn, "argument 'mode' is %d; expected NT_PAD_CONSTANT, "
                        "NT_PAD_REFLECT or NT_PAD_REPLICATE", (int)mode);
    if (npad < 0 || (npad > 0 && !pads))
        return !nt__err(site, NT_EINVAL, fn, "argument 'pads' is %s with npad = %d; expected an "
                        "array of npad >= 0 pads", pads ? "an array" : "NULL", npad);
    if (npad % 2)
        return !nt__err(site, NT_EINVAL, fn, "argument 'npad' is %d; expected an even number (a "
                        "before and an after pad per dim)", npad);
    int k = npad / 2, nd = x->ndim;
    if (k > nd)
        return !nt__err(site, NT_EINVAL, fn, "argument 'npad' is %d; expected at most %d (two "
                        "per dim of x)", npad, 2 * nd);
    if (mode != NT_PAD_CONSTANT) {
        if (value != 0)
            return !nt__err(site, NT_EINVAL, fn, "argument 'value' is %g; mode %s takes none "
                            "(expected 0)", value, PAD_NAMES[mode]);
        if (k < 1 || k > 3 || (nd != k + 1 && nd != k + 2))
            return !nt__err(site, NT_ESHAPE, fn, "x has %d dims; mode %s with npad = %d expects "
                            "%d or %d dims (as PyTorch)", nd, PAD_NAMES[mode], npad, k + 1,
                            k + 2);
    }
    int64_t total = 1;
    for (int i = 0; i < nd; i++) {
        int64_t n = x->shape[i], l = 0, r = 0;
        int p = nd - 1 - i; /* pads[2p], pads[2p+1] pad dim i */
        if (p < k)
            l = pads[2 * p], r = pads[2 * p + 1];
        bool bad;
        if (mode == NT_PAD_CONSTANT)
            bad = l < -n || r < -n || n + l + r < 0;
        else if (mode == NT_PAD_REFLECT)
            bad = p < k && (l >= n || r >= n || l <= -n || r <= -n || n + l + r < 1);
        else
            bad = p < k && (n < 1 || l <= -n || r <= -n || n + l + r < 1);
        if (bad)
            return !nt__err(site, NT_EINVAL, fn, "pads[%d] = %lld and pads[%d] = %lld do not fit "
                            "dim %d of size %lld in mode %s (expected %s)", 2 * p, (long long)l,
                            2 * p + 1, (long long)r, i, (long long)n, PAD_NAMES[mode],
                            mode == NT_PAD_CONSTANT ? "crops within the dim and a size >= 0"
                            : mode == NT_PAD_REFLECT ? "-size < pad < size and a size >= 1"
                                                     : "-size < pad and a size >= 1");
        if (__builtin_mul_overflow(total, n + l + r, &total) || total > NT__MAX_NUMEL)
            return !nt__err(site, NT_EINVAL, fn, "the result would have more than 2^48 "
                            "elements (the most a tensor may have)");
    }
    return true;
}

NT_API nt_tensor *nt_pad_at(const nt_site *site, nt_tensor *x, int npad, const int64_t *pads,
                            nt_pad_mode mode, double value)
{
    const char *fn = "nt_pad";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x))
        return NULL;
    if (!pad_check(site, fn, x, npad, pads, mode, value))
        return NULL;
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *y = x;
    for (int p = 0; y && p < npad / 2; p++) {
        int d = x->ndim - 1 - p;
        int64_t l = pads[2 * p], r = pads[2 * p + 1], m = x->shape[d] + l + r;
        if (l == 0 && r == 0)
            continue;
        if (mode == NT_PAD_CONSTANT)
            y = pad_const_dim(site, fn, y, d, l, r, value);
        else
            y = select_by(site, fn, y, d, m, mode == NT_PAD_REFLECT ? reflect_ix : replicate_ix, l,
                          r);
    }
    if (y == x) /* nothing padded: still a new tensor, as in PyTorch */
        y = nt__copy_to(site, fn, x, (nt_dtype)-1);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_pad(nt_tensor *x, int npad, const int64_t *pads, nt_pad_mode mode,
                         double value)
{
    return nt_pad_at(NT_RA_SITE, x, npad, pads, mode, value);
}

/* ---------------- roll ---------------- */

static int64_t roll_ix(int64_t o, int64_t n, int64_t s, int64_t unused)
{
    (void)unused;
    return (o - s + n) % n; /* 0 <= s < n */
}

static nt_tensor *roll_dim(const nt_site *site, const char *fn, nt_tensor *y, int d, int64_t s)
{
    int64_t n = nt_shape(y, d);
    if (n == 0 || (s = (s % n + n) % n) == 0)
        return y;
    return select_by(site, fn, y, d, n, roll_ix, s, 0);
}

static bool roll_check(const nt_site *site, const char *fn, nt_tensor *x, int nshifts,
                       const int64_t *shifts, const int *dims)
{
    if (nshifts < 1 || !shifts)
        return !nt__err(site, NT_EINVAL, fn, "argument 'shifts' is %s with nshifts = %d; "
                        "expected at least one shift", shifts ? "an array" : "NULL", nshifts);
    if (!dims && nshifts != 1)
        return !nt__err(site, NT_EINVAL, fn, "argument 'dims' is NULL with nshifts = %d; "
                        "expected dims (one per shift), or one shift of the flattened x",
                        nshifts);
    for (int i = 0; dims && i < nshifts; i++)
        if (nt__norm_dim(dims[i], x->ndim) < 0)
            return !nt__err(site, NT_EDIM, fn, "dims[%d] = %d is out of range for a tensor "
                            "with %d dims", i, dims[i], x->ndim);
    return true;
}

NT_API nt_tensor *nt_roll_at(const nt_site *site, nt_tensor *x, int nshifts,
                             const int64_t *shifts, const int *dims)
{
    const char *fn = "nt_roll";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x))
        return NULL;
    if (!roll_check(site, fn, x, nshifts, shifts, dims))
        return NULL;
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *y = x;
    if (!dims) { /* flattened, rolled, viewed back */
        int64_t n = nt__numel(x->ndim, x->shape);
        y = nt_reshape_at(site, x, 1, &n);
        nt_tensor *f = y;
        y = y ? roll_dim(site, fn, y, 0, shifts[0]) : NULL;
        y = y && y != f ? nt_reshape_at(site, y, x->ndim, x->shape) : y == f ? x : NULL;
    } else {
        for (int i = 0; y && i < nshifts; i++)
            y = roll_dim(site, fn, y, nt__norm_dim(dims[i], x->ndim), shifts[i]);
    }
    if (y == x) /* nothing moved: still a new tensor, as in PyTorch */
        y = nt__copy_to(site, fn, x, (nt_dtype)-1);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_roll(nt_tensor *x, int nshifts, const int64_t *shifts, const int *dims)
{
    return nt_roll_at(NT_RA_SITE, x, nshifts, shifts, dims);
}

/* ---------------- sort, argsort ---------------- */

/* nt_topk of every element along dim: its order (core/sample.h) is
 * PyTorch's stable sort's, NaN above every number, ties by index */
NT_API int nt_sort_at(const nt_site *site, nt_tensor *x, int dim, bool descending, bool stable,
                      nt_tensor **values, nt_tensor **indices)
{
    const char *fn = "nt_sort";
    (void)stable; /* always stable: the order is total */
    if (values)
        *values = NULL;
    if (indices)
        *indices = NULL;
    if (!nt__ensure_init())
        return nt_last_error() ? nt_last_error() : NT_EINVAL;
    if (!values || !indices)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL; expected where to put the %s",
                       values ? "indices" : "values", values ? "indices" : "values");
    if (!nt__check_arg(site, fn, "x", x))
        return nt_last_error();
    int d = nt__norm_dim(dim, x->ndim ? x->ndim : 1);
    if (d < 0)
        return nt__err(site, NT_EDIM, fn, "dim %d is out of range for a tensor with %d dims%s",
                       dim, x->ndim, x->ndim ? "" : " (0-d: expected 0 or -1)");
    int64_t k = x->ndim ? x->shape[d] : 1;
    int rc = nt_topk_at(site, x, k, dim, descending, values, indices);
    return rc ? nt__err_within(fn) : 0;
}
NT_API int nt_sort(nt_tensor *x, int dim, bool descending, bool stable, nt_tensor **values,
                   nt_tensor **indices)
{
    return nt_sort_at(NT_RA_SITE, x, dim, descending, stable, values, indices);
}

NT_API nt_tensor *nt_argsort_at(const nt_site *site, nt_tensor *x, int dim, bool descending,
                                bool stable)
{
    nt_tensor *v, *ix;
    if (nt_sort_at(site, x, dim, descending, stable, &v, &ix)) {
        nt__err_within("nt_argsort");
        return NULL;
    }
    nt_release(v);
    return ix;
}
NT_API nt_tensor *nt_argsort(nt_tensor *x, int dim, bool descending, bool stable)
{
    return nt_argsort_at(NT_RA_SITE, x, dim, descending, stable);
}

/* ---------------- interpolate ---------------- */

/* PyTorch 1.13's nearest_idx (upsample_nearest2d): the same f32 steps */
static int64_t nearest_ix(int64_t o, int64_t in, int64_t out, int64_t unused)
{
    (void)unused;
    if (out == in)
        return o;
    if (out == 2 * in)
        return o >> 1;
    float scale = (float)in / (float)out;
    int64_t i = (int64_t)floorf((float)o * scale);
    return i < in - 1 ? i : in - 1;
}

/* PyTorch 1.13's compute_source_index_and_lambda (upsample_bilinear2d):
 * the scale in f32, the source position in double (its acc_type), the
 * weight w1 its fraction rounded to f32, w0 = 1 - w1 in f32: output o of
 * out reads i0 with weight w0 and i1 with weight w1 */
static void linear_src(int64_t o, int64_t in, int64_t out, bool align, int32_t *i0, int32_t *i1,
                       float *w0, float *w1)
{
    if (out == in) {
        *i0 = *i1 = (int32_t)o;
        *w0 = 1.0f, *w1 = 0.0f;
        return;
    }
    float scale = align ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f)
                        : (float)in / (float)out;
    double real = align ? (double)scale * (double)o : (double)scale * ((double)o + 0.5) - 0.5;
    if (real < 0)
        real = 0;
    int64_t a = (int64_t)real;
    *i0 = (int32_t)a;
    *i1 = (int32_t)(a + (a < in - 1 ? 1 : 0));
    double l1 = real - (double)a;
    *w1 = (float)(l1 < 0 ? 0 : l1 > 1 ? 1 : l1);
    *w0 = 1.0f - *w1;
}

/* one dim (d = 2 or 3) of bilinear: sel(y, i0) * w0 + sel(y, i1) * w1,
 * the weights shaped to broadcast along d */
static nt_tensor *linear_dim(const nt_site *site, const char *fn, nt_tensor *y, int d,
                             int64_t out, bool align)
{
    int64_t in = nt_shape(y, d);
    int32_t *ix = malloc((size_t)out * 2 * sizeof *ix);
    float *w = malloc((size_t)out * 2 * sizeof *w);
    if (!ix || !w) {
        free(ix);
        free(w);
        nt__err_hostmem(site, fn, "the weights");
        return NULL;
    }
    for (int64_t o = 0; o < out; o++)
        linear_src(o, in, out, align, &ix[o], &ix[out + o], &w[o], &w[out + o]);
    int64_t wsh[2] = {out, d == 2 ? 1 : out};
    int wnd = d == 2 ? 2 : 1;
    nt_tensor *t[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        nt_tensor *i = host_index(site, fn, ix + k * out, out);
        nt_tensor *wt = i ? nt_from_host_at(site, w + k * out, NT_F32, wnd, wsh) : NULL;
        nt_tensor *g = wt ? nt_index_select_at(site, y, d, i) : NULL;
        t[k] = g ? nt_mul_at(site, g, wt) : NULL;
    }
    free(ix);
    free(w);
    return t[0] && t[1] ? nt_add_at(site, t[0], t[1]) : NULL;
}

static bool interp_check(const nt_site *site, const char *fn, nt_tensor *x, int64_t out_h,
                         int64_t out_w, nt_interp_mode mode, bool align)
{
    if ((int)mode != NT_INTERP_NEAREST && (int)mode != NT_INTERP_BILINEAR)
        return !nt__err(site, NT_EINVAL, fn, "argument 'mode' is %d; expected NT_INTERP_NEAREST "
                        "or NT_INTERP_BILINEAR", (int)mode);
    if (mode == NT_INTERP_NEAREST && align)
        return !nt__err(site, NT_EINVAL, fn, "argument 'align_corners' is true; mode nearest "
                        "takes none (expected false, as PyTorch)");
    if (x->ndim != 4) {
        char s1[128];
        return !nt__err(site, NT_ESHAPE, fn, "argument 'x' has shape %s; expected 4 dims "
                        "[N, C, H, W]", nt__shape_str(x->ndim, x->shape, s1, sizeof s1));
    }
    if (mode == NT_INTERP_BILINEAR && x->dtype != NT_F32)
        return !nt__err(site, NT_EDTYPE, fn, "argument 'x' has dtype %s; mode bilinear expects "
                        "f32", nt_dtype_name((nt_dtype)x->dtype));
    if (out_h < 1 || out_w < 1 || out_h > INT32_MAX || out_w > INT32_MAX)
        return !nt__err(site, NT_EINVAL, fn, "the output size is %lld x %lld; expected each in "
                        "1..2^31-1", (long long)out_h, (long long)out_w);
    if (x->shape[2] < 1 || x->shape[3] < 1)
        return !nt__err(site, NT_ESHAPE, fn, "argument 'x' has H = %lld, W = %lld; expected "
                        "both >= 1", (long long)x->shape[2], (long long)x->shape[3]);
    int64_t total;
    if (__builtin_mul_overflow(x->shape[0] * x->shape[1], out_h * out_w, &total) ||
        total > NT__MAX_NUMEL)
        return !nt__err(site, NT_EINVAL, fn, "the result would have more than 2^48 elements "
                        "(the most a tensor may have)");
    return true;
}

NT_API nt_tensor *nt_interpolate_at(const nt_site *site, nt_tensor *x, int64_t out_h,
                                    int64_t out_w, nt_interp_mode mode, bool align_corners)
{
    const char *fn = "nt_interpolate";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x))
        return NULL;
    if (!interp_check(site, fn, x, out_h, out_w, mode, align_corners))
        return NULL;
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *y;
    if (mode == NT_INTERP_NEAREST) {
        y = select_by(site, fn, x, 2, out_h, nearest_ix, out_h, 0);
        y = y ? select_by(site, fn, y, 3, out_w, nearest_ix, out_w, 0) : NULL;
    } else { /* along W first: PyTorch's (x00 w0 + x01 w1) h0 + (x10 w0 + x11 w1) h1 */
        y = linear_dim(site, fn, x, 3, out_w, align_corners);
        y = y ? linear_dim(site, fn, y, 2, out_h, align_corners) : NULL;
    }
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_interpolate(nt_tensor *x, int64_t out_h, int64_t out_w, nt_interp_mode mode,
                                 bool align_corners)
{
    return nt_interpolate_at(NT_RA_SITE, x, out_h, out_w, mode, align_corners);
}
