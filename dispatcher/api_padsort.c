/* dispatcher/api_padsort.c - nt_pad, nt_roll, nt_sort, nt_argsort and
 * nt_interpolate (issue 33): composites of ops that already give the same
 * bits on every backend and mode (nt_index_select, nt_slice, nt_cat,
 * nt_full, nt_topk, nt_mul, nt_add), so their values and gradients are
 * those ops' (docs/ops.md, "Padding, rolling, sorting, resizing").  Every
 * index and weight is made on the device by nt_arange / nt_full (never
 * copied from the host), so the composites also record into a captured
 * graph. */
#include <math.h>
#include <stdlib.h>

#include "dispatcher/dispatch.h"

/* concatenates the n non-NULL parts along d (one part: a copy, so the
 * result is always a new tensor); NULL if any part failed */
static nt_tensor *cat_parts(const nt_site *site, const char *fn, nt_tensor **parts, int n,
                            int d)
{
    for (int i = 0; i < n; i++)
        if (!parts[i])
            return NULL;
    return n == 1 ? nt__copy_to(site, fn, parts[0], (nt_dtype)-1) : nt_cat_at(site, parts, n, d);
}

/* the k elements of y from a along d, reversed (k >= 1) */
static nt_tensor *flipped(const nt_site *site, nt_tensor *y, int d, int64_t a, int64_t k)
{
    nt_tensor *t = nt_slice_at(site, y, d, a, a + k, 1);
    return t ? nt_flip_at(site, t, 1, &d) : NULL;
}

/* y's element e along d repeated k times: an expand of the size-1 slice */
static nt_tensor *repeated(const nt_site *site, nt_tensor *y, int d, int64_t e, int64_t k)
{
    nt_tensor *t = nt_slice_at(site, y, d, e, e + 1, 1);
    int64_t sh[NT_MAX_DIMS];
    for (int i = 0; i < nt_ndim(y); i++)
        sh[i] = i == d ? k : nt_shape(y, i);
    return t ? nt_expand_at(site, t, nt_ndim(y), sh) : NULL;
}

/* reflect or replicate pad of dim d: cat(left, the crop, right), the left
 * part y[l], ..., y[1] (reflect) or l copies of y[0] (replicate), the right
 * part y[n-2], ..., y[n-1-r] or r copies of y[n-1] */
static nt_tensor *pad_edge_dim(const nt_site *site, const char *fn, nt_tensor *y, int d,
                               int64_t l, int64_t r, bool reflect)
{
    int64_t n = nt_shape(y, d);
    nt_tensor *parts[3];
    int np = 0;
    if (l > 0)
        parts[np++] = reflect ? flipped(site, y, d, 1, l) : repeated(site, y, d, 0, l);
    parts[np++] = nt_slice_at(site, y, d, l < 0 ? -l : 0, r < 0 ? n + r : n, 1);
    if (r > 0)
        parts[np++] = reflect ? flipped(site, y, d, n - 1 - r, r) : repeated(site, y, d, n - 1, r);
    return cat_parts(site, fn, parts, np, d);
}

/* circular pad of dim d: c, the crop of the negative pads, then cat(the
 * last l of c, c, the first r of c) */
static nt_tensor *pad_circular_dim(const nt_site *site, const char *fn, nt_tensor *y, int d,
                                   int64_t l, int64_t r)
{
    int64_t n = nt_shape(y, d);
    nt_tensor *c = nt_slice_at(site, y, d, l < 0 ? -l : 0, r < 0 ? n + r : n, 1), *parts[3];
    if (!c)
        return NULL;
    int64_t m = nt_shape(c, d);
    int np = 0;
    if (l > 0)
        parts[np++] = nt_slice_at(site, c, d, m - l, m, 1);
    parts[np++] = c;
    if (r > 0)
        parts[np++] = nt_slice_at(site, c, d, 0, r, 1);
    return cat_parts(site, fn, parts, np, d);
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
    return cat_parts(site, fn, parts, np, d);
}

static const char *const PAD_NAMES[4] = {"constant", "reflect", "replicate", "circular"};

/* the checks of nt_pad before anything is made; true if all pass */
static bool pad_check(const nt_site *site, const char *fn, nt_tensor *x, int npad,
                      const int64_t *pads, nt_pad_mode mode, double value)
{
    if ((int)mode < 0 || (int)mode > NT_PAD_CIRCULAR)
        return !nt__err(site, NT_EINVAL, fn, "argument 'mode' is %d; expected NT_PAD_CONSTANT, "
                        "NT_PAD_REFLECT, NT_PAD_REPLICATE or NT_PAD_CIRCULAR", (int)mode);
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
        if (mode == NT_PAD_CIRCULAR && (k < 1 || k > 3 || nd != k + 2))
            return !nt__err(site, NT_ESHAPE, fn, "x has %d dims; mode circular with npad = %d "
                            "expects %d dims (batch, channel and the padded ones, as PyTorch)",
                            nd, npad, k + 2);
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
        else if (mode == NT_PAD_CIRCULAR) { /* m: the cropped size */
            int64_t m = n - (l < 0 ? -l : 0) - (r < 0 ? -r : 0);
            bad = p < k && (m < 0 || l > m || r > m || n + l + r < 1);
        }
        else
            bad = p < k && (n < 1 || l <= -n || r <= -n || n + l + r < 1);
        if (bad)
            return !nt__err(site, NT_EINVAL, fn, "pads[%d] = %lld and pads[%d] = %lld do not fit "
                            "dim %d of size %lld in mode %s (expected %s)", 2 * p, (long long)l,
                            2 * p + 1, (long long)r, i, (long long)n, PAD_NAMES[mode],
                            mode == NT_PAD_CONSTANT ? "crops within the dim and a size >= 0"
                            : mode == NT_PAD_REFLECT ? "-size < pad < size and a size >= 1"
                            : mode == NT_PAD_CIRCULAR ? "pads <= the size left by the crops "
                                                        "and a size >= 1"
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
        int64_t l = pads[2 * p], r = pads[2 * p + 1];
        if (l == 0 && r == 0)
            continue;
        if (mode == NT_PAD_CONSTANT)
            y = pad_const_dim(site, fn, y, d, l, r, value);
        else if (mode == NT_PAD_CIRCULAR)
            y = pad_circular_dim(site, fn, y, d, l, r);
        else
            y = pad_edge_dim(site, fn, y, d, l, r, mode == NT_PAD_REFLECT);
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

/* y rolled by s along d: cat(the last s elements, the first n - s) */
static nt_tensor *roll_dim(const nt_site *site, const char *fn, nt_tensor *y, int d, int64_t s)
{
    int64_t n = nt_shape(y, d);
    if (n == 0 || (s = (s % n + n) % n) == 0)
        return y;
    nt_tensor *parts[2] = {nt_slice_at(site, y, d, n - s, n, 1), nt_slice_at(site, y, d, 0, n - s, 1)};
    return cat_parts(site, fn, parts, 2, d);
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
        return nt__err_or(NT_EINVAL);
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

/* nearest along d, PyTorch 1.13's nearest_idx: out == in the identity,
 * out == 2 in o >> 1, else min(floor(o * scale), in - 1) with scale =
 * (float)in / out and the product in f32 -- nt_arange's element o is
 * o * scale computed in double (exact) and rounded once to f32, the same
 * value; then floor, clamp, cast to i32, index_select. */
static nt_tensor *nearest_dim(const nt_site *site, nt_tensor *y, int d, int64_t out)
{
    int64_t in = nt_shape(y, d);
    if (out == in)
        return y;
    double scale = out == 2 * in ? 0.5 : (double)((float)in / (float)out);
    nt_tensor *t = nt_arange_at(site, NT_F32, 0, ((double)out - 0.5) * scale, scale);
    t = t ? nt_floor_at(site, t) : NULL;
    t = t ? nt_clamp_at(site, t, 0, (double)(in - 1)) : NULL;
    t = t ? nt_cast_at(site, t, NT_I32) : NULL;
    return t ? nt_index_select_at(site, y, d, t) : NULL;
}

/* The weights of bilinear along one dim, PyTorch 1.13's
 * compute_source_index_and_lambda: scale in f32, the source position real
 * = scale * (o + 0.5) - 0.5 (align_corners: scale * o) in double, clamped
 * at 0, i0 = (int)real, i1 = i0 + (i0 < in - 1), w1 = (float)(real - i0),
 * w0 = 1 - w1 in f32.  Made on the device: over each run of outputs with
 * the same i0, w1 is an nt_arange (its elements real - i0 computed exactly
 * in double, rounded once) or an nt_full, i0 and i1 nt_fulls; the runs are
 * concatenated.  *w1, *i0, *i1: 1-D of length out (held by the scope). */
typedef struct {
    nt_tensor **p;
    int n;
} parts_t;

static bool linear_runs(const nt_site *site, int64_t in, int64_t out, bool align, parts_t *w,
                        parts_t *a, parts_t *b)
{
    float fs = align ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f)
                     : (float)in / (float)out;
    double step = fs, start = align ? 0.0 : 0.5 * step - 0.5;
    for (int64_t o = 0; o < out;) {
        double real = start + (double)o * step;
        int64_t k = real < 0 ? 0 : (int64_t)real, len = 1;
        if (real < 0) {
            while (o + len < out && start + (double)(o + len) * step < 0)
                len++;
        } else {
            while (o + len < out && (int64_t)(start + (double)(o + len) * step) == k)
                len++;
        }
        double s0 = real < 0 ? 0.0 : real - (double)k;
        w->p[w->n++] = real < 0 || len == 1
                           ? nt_full_at(site, NT_F32, 1, &len, s0)
                           : nt_arange_at(site, NT_F32, s0, s0 + ((double)len - 0.5) * step, step);
        a->p[a->n++] = nt_full_at(site, NT_I32, 1, &len, (double)k);
        b->p[b->n++] = nt_full_at(site, NT_I32, 1, &len, (double)(k + (k < in - 1)));
        if (!w->p[w->n - 1] || !a->p[a->n - 1] || !b->p[b->n - 1])
            return false;
        o += len;
    }
    return true;
}

/* one dim (d = 2 or 3) of bilinear: sel(y, i0) * w0 + sel(y, i1) * w1,
 * the weights shaped to broadcast along d; out == in: i0 = i1 = o, w0 = 1,
 * w1 = 0 (as PyTorch: y * 1 + y * 0) */
static nt_tensor *linear_dim(const nt_site *site, const char *fn, nt_tensor *y, int d,
                             int64_t out, bool align)
{
    int64_t in = nt_shape(y, d), nmax = (in < out ? in : out) + 2;
    nt_tensor *w1, *i0, *i1;
    if (out == in) {
        i0 = i1 = nt_arange_at(site, NT_I32, 0, (double)out, 1);
        w1 = nt_zeros_at(site, NT_F32, 1, &out);
    } else {
        nt_tensor **mem = malloc((size_t)nmax * 3 * sizeof *mem);
        if (!mem) {
            nt__err_hostmem(site, fn, "the weights");
            return NULL;
        }
        parts_t w = {mem, 0}, a = {mem + nmax, 0}, b = {mem + 2 * nmax, 0};
        bool ok = linear_runs(site, in, out, align, &w, &a, &b);
        w1 = ok ? cat_parts(site, fn, w.p, w.n, 0) : NULL;
        i0 = w1 ? cat_parts(site, fn, a.p, a.n, 0) : NULL;
        i1 = i0 ? cat_parts(site, fn, b.p, b.n, 0) : NULL;
        free(mem);
    }
    nt_tensor *w0 = w1 ? nt_add_scalar_at(site, nt_neg_at(site, w1), 1.0) : NULL;
    if (w0 && d == 2) {
        int64_t sh[2] = {out, 1};
        w0 = nt_reshape_at(site, w0, 2, sh);
        w1 = nt_reshape_at(site, w1, 2, sh);
    }
    if (!w0 || !w1 || !i0 || !i1)
        return NULL;
    nt_tensor *t0 = nt_mul_at(site, nt_index_select_at(site, y, d, i0), w0);
    nt_tensor *t1 = nt_mul_at(site, nt_index_select_at(site, y, d, i1), w1);
    return t0 && t1 ? nt_add_at(site, t0, t1) : NULL;
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
        y = nearest_dim(site, x, 2, out_h);
        y = y ? nearest_dim(site, y, 3, out_w) : NULL;
        if (y == x) /* the same size: still a new tensor */
            y = nt__copy_to(site, fn, x, (nt_dtype)-1);
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
