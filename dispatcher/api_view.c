/* dispatcher/api_view.c - views (no data moves), cat, contiguous, detach. */
#include "dispatcher/dispatch.h"
#include "streams/stream.h"

static bool begin1(nt__call *c, const nt_site *site, const char *fn, int op, nt_tensor *t)
{
    return nt__call_begin(c, site, fn, op, 1, &t, "t");
}

static void set_out(nt__call *c, nt_dtype dt, int ndim, const int64_t *shape)
{
    c->odt[0] = dt;
    c->ondim[0] = ndim;
    for (int i = 0; i < ndim; i++)
        c->oshape[0][i] = shape[i];
}

/* Strides st that view t's elements, in row-major order, as shape sh,
 * when t's strides allow it (a split or merge of dims happens only within a
 * run of t's dims that are contiguous with one another): splitting the last
 * dim of a slice, [B, T, 3D] sliced to [B, T, D] and viewed as [B, T, H,
 * D/H], needs no copy.  false: no such strides (the caller copies).  t is
 * neither contiguous nor empty here; an expanded t always copies. */
bool nt__view_strides(const nt_tensor *t, int ndim, const int64_t *sh, int64_t *st)
{
    if (t->expanded || t->ndim == 0 || nt__numel(t->ndim, t->shape) == 0)
        return false;
    int vd = ndim - 1;
    int64_t base = t->stride[t->ndim - 1], tn = 1, vn = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tn *= t->shape[td];
        /* the end of a run of dims contiguous with one another */
        if (td == 0 || (t->shape[td - 1] != 1 && t->stride[td - 1] != tn * base)) {
            while (vd >= 0 && (vn < tn || sh[vd] == 1)) {
                st[vd] = vn * base;
                vn *= sh[vd];
                vd--;
            }
            if (vn != tn)
                return false;
            if (td > 0) {
                base = t->stride[td - 1];
                tn = vn = 1;
            }
        }
    }
    return vd == -1;
}

NT_API nt_tensor *nt_reshape_at(const nt_site *site, nt_tensor *t, int ndim, const int64_t *shape)
{
    const char *fn = "nt_reshape";
    nt__call c;
    if (!begin1(&c, site, fn, NT_OP_RESHAPE, t))
        return nt__call_fail(&c);
    t = c.in[0];
    if (ndim < 0 || ndim > NT_MAX_DIMS || (ndim > 0 && !shape)) {
        nt__err(site, NT_EINVAL, fn, "argument 'ndim' is %d; expected 0..%d with a shape array",
                ndim, NT_MAX_DIMS);
        return nt__call_fail(&c);
    }
    int64_t sh[NT_MAX_DIMS];
    int infer = -1;
    int64_t known = 1, n = nt__numel(t->ndim, t->shape);
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (shape[i] == -1 && infer < 0) {
            infer = i;
        } else if (shape[i] < 0) {
            nt__err(site, NT_EINVAL, fn, "shape[%d] is %lld; expected a size >= 0 or one -1", i,
                    (long long)shape[i]);
            return nt__call_fail(&c);
        } else if (__builtin_mul_overflow(known, shape[i], &known) || known > NT__MAX_NUMEL) {
            char s2[160];
            nt__err(site, NT_EINVAL, fn, "argument 'shape' %s has more than 2^48 elements (the "
                    "most a tensor may have)", nt__shape_str(ndim, shape, s2, sizeof s2));
            return nt__call_fail(&c);
        }
    }
    if (infer >= 0) {
        if (known == 0 || n % known) {
            char s1[128];
            nt__err(site, NT_ESHAPE, fn, "cannot infer the -1 dim: %lld elements of %s do not "
                    "divide by %lld", (long long)n, nt__shape_str(t->ndim, t->shape, s1, sizeof s1),
                    (long long)known);
            return nt__call_fail(&c);
        }
        sh[infer] = n / known;
        known *= sh[infer];
    }
    if (known != n) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn, "cannot reshape %s (%lld elements) to %s",
                nt__shape_str(t->ndim, t->shape, s1, sizeof s1), (long long)n,
                nt__shape_str(ndim, sh, s2, sizeof s2));
        return nt__call_fail(&c);
    }
    char why[256];
    if (!nt__shape_ok(ndim, sh, why, sizeof why)) { /* [0] to [0, 2^60] has the same numel */
        nt__err(site, NT_EINVAL, fn, "argument 'shape': %s", why);
        return nt__call_fail(&c);
    }
    set_out(&c, (nt_dtype)t->dtype, ndim, sh);
    int64_t st[NT_MAX_DIMS];
    nt__contig_strides(ndim, sh, st);
    if (nt__is_contig(t))
        return nt__dispatch_view(&c, nt__make_view(t, ndim, sh, st, t->offset, site));
    if (nt__view_strides(t, ndim, sh, st))
        return nt__dispatch_view(&c, nt__make_view(t, ndim, sh, st, t->offset, site));
    /* Not viewable: copy to contiguous, then view the copy.  Autograd sees
     * the copy and the view as two nodes, which is exact. */
    nt__call_fail(&c);
    nt_tensor *cp = nt__copy_to(site, fn, t, (nt_dtype)-1);
    if (!cp)
        return NULL;
    nt_keep(cp);
    nt_tensor *v = nt_reshape_at(site, cp, ndim, sh);
    nt_release(cp);
    return v;
}
NT_API nt_tensor *nt_reshape(nt_tensor *t, int ndim, const int64_t *shape)
{
    return nt_reshape_at(NT_RA_SITE, t, ndim, shape);
}

NT_API nt_tensor *nt_permute_at(const nt_site *site, nt_tensor *t, const int *perm)
{
    const char *fn = "nt_permute";
    nt__call c;
    if (!begin1(&c, site, fn, NT_OP_PERMUTE, t))
        return nt__call_fail(&c);
    t = c.in[0];
    if (!perm && t->ndim > 0) {
        nt__err(site, NT_EINVAL, fn, "argument 'perm' is NULL");
        return nt__call_fail(&c);
    }
    bool seen[NT_MAX_DIMS] = {0};
    int64_t sh[NT_MAX_DIMS], st[NT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        int d = nt__norm_dim(perm[i], t->ndim);
        if (d < 0 || seen[d]) {
            nt__err(site, NT_EDIM, fn, "perm[%d] = %d is %s; perm must be a permutation of the "
                    "%d dims", i, perm[i], d < 0 ? "out of range" : "repeated", t->ndim);
            return nt__call_fail(&c);
        }
        seen[d] = true;
        sh[i] = t->shape[d];
        st[i] = t->stride[d];
        c.p.i[i] = d;
    }
    set_out(&c, (nt_dtype)t->dtype, t->ndim, sh);
    return nt__dispatch_view(&c, nt__make_view(t, t->ndim, sh, st, t->offset, site));
}
NT_API nt_tensor *nt_permute(nt_tensor *t, const int *perm) { return nt_permute_at(NT_RA_SITE, t, perm); }

NT_API nt_tensor *nt_transpose_at(const nt_site *site, nt_tensor *t, int d0, int d1)
{
    const char *fn = "nt_transpose";
    nt__call c;
    if (!begin1(&c, site, fn, NT_OP_TRANSPOSE, t))
        return nt__call_fail(&c);
    t = c.in[0];
    int a = nt__norm_dim(d0, t->ndim), b = nt__norm_dim(d1, t->ndim);
    if (a < 0 || b < 0) {
        nt__err(site, NT_EDIM, fn, "dims (%d, %d) are out of range for a tensor with %d dims", d0,
                d1, t->ndim);
        return nt__call_fail(&c);
    }
    int64_t sh[NT_MAX_DIMS], st[NT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        sh[i] = t->shape[i], st[i] = t->stride[i];
    sh[a] = t->shape[b], st[a] = t->stride[b];
    sh[b] = t->shape[a], st[b] = t->stride[a];
    c.p.i[0] = a;
    c.p.i[1] = b;
    set_out(&c, (nt_dtype)t->dtype, t->ndim, sh);
    return nt__dispatch_view(&c, nt__make_view(t, t->ndim, sh, st, t->offset, site));
}
NT_API nt_tensor *nt_transpose(nt_tensor *t, int d0, int d1)
{
    return nt_transpose_at(NT_RA_SITE, t, d0, d1);
}

NT_API nt_tensor *nt_slice_at(const nt_site *site, nt_tensor *t, int dim, int64_t start,
                              int64_t end, int64_t step)
{
    const char *fn = "nt_slice";
    nt__call c;
    if (!begin1(&c, site, fn, NT_OP_SLICE, t))
        return nt__call_fail(&c);
    t = c.in[0];
    int d = nt__norm_dim(dim, t->ndim);
    if (d < 0) {
        nt__err(site, NT_EDIM, fn, "dim %d is out of range for a tensor with %d dims", dim,
                t->ndim);
        return nt__call_fail(&c);
    }
    if (step < 1) {
        nt__err(site, NT_EINVAL, fn, "argument 'step' is %lld; expected >= 1", (long long)step);
        return nt__call_fail(&c);
    }
    int64_t n = t->shape[d];
    /* Python slice semantics: negative counts from the end, then clamp. */
    if (start < 0)
        start += n;
    if (end < 0)
        end += n;
    start = start < 0 ? 0 : (start > n ? n : start);
    end = end < start ? start : (end > n ? n : end);
    /* ceil((end - start) / step) without forming end - start + step, which
     * overflows for a huge step */
    int64_t len = end > start ? (end - start - 1) / step + 1 : 0;
    int64_t sh[NT_MAX_DIMS], st[NT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        sh[i] = t->shape[i], st[i] = t->stride[i];
    sh[d] = len;
    /* With two or more elements step < n, so stride * step stays inside the
     * storage; with fewer the stride is never used and keeps t's. */
    if (len > 1)
        st[d] = t->stride[d] * step;
    c.p.dim = d;
    c.p.i[0] = start;
    c.p.i[1] = end;
    c.p.i[2] = step;
    set_out(&c, (nt_dtype)t->dtype, t->ndim, sh);
    return nt__dispatch_view(&c, nt__make_view(t, t->ndim, sh, st,
                                                t->offset + start * t->stride[d], site));
}
NT_API nt_tensor *nt_slice(nt_tensor *t, int dim, int64_t start, int64_t end, int64_t step)
{
    return nt_slice_at(NT_RA_SITE, t, dim, start, end, step);
}

NT_API nt_tensor *nt_expand_at(const nt_site *site, nt_tensor *t, int ndim, const int64_t *shape)
{
    const char *fn = "nt_expand";
    nt__call c;
    if (!begin1(&c, site, fn, NT_OP_EXPAND, t))
        return nt__call_fail(&c);
    t = c.in[0];
    if (ndim < t->ndim || ndim > NT_MAX_DIMS || (ndim && !shape)) {
        nt__err(site, NT_EINVAL, fn, "argument 'ndim' is %d; expected %d..%d with a shape array",
                ndim, t->ndim, NT_MAX_DIMS);
        return nt__call_fail(&c);
    }
    int64_t sh[NT_MAX_DIMS], st[NT_MAX_DIMS];
    int off = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - off;
        int64_t want = shape[i];
        if (j < 0) {
            if (want < 0) {
                nt__err(site, NT_EINVAL, fn, "shape[%d] is %lld; new leading dims need a size", i,
                        (long long)want);
                return nt__call_fail(&c);
            }
            sh[i] = want, st[i] = 0;
        } else if (want == -1 || want == t->shape[j]) {
            sh[i] = t->shape[j], st[i] = t->stride[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            sh[i] = want, st[i] = 0;
        } else {
            char s1[128], s2[128];
            nt__err(site, NT_ESHAPE, fn, "cannot expand %s to %s: dim %d has size %lld, not 1",
                    nt__shape_str(t->ndim, t->shape, s1, sizeof s1),
                    nt__shape_str(ndim, shape, s2, sizeof s2), i, (long long)t->shape[j]);
            return nt__call_fail(&c);
        }
    }
    char why[256];
    if (!nt__shape_ok(ndim, sh, why, sizeof why)) {
        nt__err(site, NT_EINVAL, fn, "argument 'shape': %s", why);
        return nt__call_fail(&c);
    }
    set_out(&c, (nt_dtype)t->dtype, ndim, sh);
    return nt__dispatch_view(&c, nt__make_view(t, ndim, sh, st, t->offset, site));
}
NT_API nt_tensor *nt_expand(nt_tensor *t, int ndim, const int64_t *shape)
{
    return nt_expand_at(NT_RA_SITE, t, ndim, shape);
}

NT_API nt_tensor *nt_contiguous_at(const nt_site *site, nt_tensor *t)
{
    if (t && t->magic == NT__MAGIC_LIVE && nt__is_contig(t)) {
        nt__call c;
        if (!begin1(&c, site, "nt_contiguous", NT_OP_ALIAS, t))
            return nt__call_fail(&c);
        set_out(&c, (nt_dtype)t->dtype, t->ndim, t->shape);
        return nt__dispatch_view(&c, nt__make_view(t, t->ndim, t->shape, t->stride, t->offset,
                                                    site));
    }
    return nt__copy_to(site, "nt_contiguous", t, (nt_dtype)-1);
}
NT_API nt_tensor *nt_contiguous(nt_tensor *t) { return nt_contiguous_at(NT_RA_SITE, t); }

NT_API nt_tensor *nt_cat_at(const nt_site *site, nt_tensor *const *ts, int n, int dim)
{
    const char *fn = "nt_cat";
    if (!nt__ensure_init())
        return NULL;
    if (!ts || n < 1) {
        nt__err(site, NT_EINVAL, fn, "expected an array of n >= 1 tensors (got %s, n = %d)",
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
    int d = nt__norm_dim(dim, t0->ndim);
    if (d < 0) {
        nt__err(site, NT_EDIM, fn, "dim %d is out of range for tensors with %d dims", dim,
                t0->ndim);
        return NULL;
    }
    int64_t sh[NT_MAX_DIMS];
    for (int i = 0; i < t0->ndim; i++)
        sh[i] = t0->shape[i];
    sh[d] = 0;
    for (int k = 0; k < n; k++) {
        nt_tensor *t = ts[k];
        bool ok = t->ndim == t0->ndim && t->dtype == t0->dtype;
        for (int i = 0; ok && i < t0->ndim; i++)
            ok = i == d || t->shape[i] == t0->shape[i];
        if (!ok) {
            char s1[128], s2[128];
            nt__err(site, NT_ESHAPE, fn, "ts[%d] (%s %s) does not match ts[0] (%s %s) outside "
                    "dim %d", k, nt_dtype_name((nt_dtype)t->dtype),
                    nt__shape_str(t->ndim, t->shape, s1, sizeof s1),
                    nt_dtype_name((nt_dtype)t0->dtype),
                    nt__shape_str(t0->ndim, t0->shape, s2, sizeof s2), d);
            return NULL;
        }
        if (__builtin_add_overflow(sh[d], t->shape[d], &sh[d])) {
            nt__err(site, NT_ESHAPE, fn, "the sizes of dim %d add up to more than 2^63", d);
            return NULL;
        }
    }
    /* on the current device (the copies into it below check the inputs),
     * written only by those copies */
    nt_tensor *out = nt__empty_for_stream(site, fn, (nt_dtype)t0->dtype, t0->ndim, sh,
                                          nt__stream_current()->dev);
    if (!out)
        return NULL;
    /* One copy per input into its slice of the output. */
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        int64_t len = ts[k]->shape[d];
        int64_t vs[NT_MAX_DIMS];
        for (int i = 0; i < t0->ndim; i++)
            vs[i] = sh[i];
        vs[d] = len;
        nt_tensor *v = nt__make_view(out, t0->ndim, vs, out->stride, off * out->stride[d], site);
        if (!v) {
            nt_release(out);
            return NULL;
        }
        nt__call c;
        nt_tensor *src = ts[k];
        if (!nt__call_begin(&c, site, fn, NT_OP_COPY, 1, &src, "t")) {
            nt_release(v);
            nt_release(out);
            return nt__call_fail(&c);
        }
        c.dst = v;
        c.no_grad = true; /* the node is cat's, below */
        c.odt[0] = (nt_dtype)v->dtype;
        c.ondim[0] = v->ndim;
        for (int i = 0; i < v->ndim; i++)
            c.oshape[0][i] = v->shape[i];
        c.flops = (double)nt__numel(v->ndim, v->shape);
        nt_tensor *r = nt__dispatch(&c);
        nt_release(v); /* the queued copy keeps it alive */
        if (!r) {
            nt_release(out);
            return NULL;
        }
        off += len;
    }
    if (nt__dhooks.ag_on_cat && nt__dhooks.ag_on_cat(site, ts, n, d, out) < 0) {
        nt_release(out);
        return NULL;
    }
    return nt__scope_adopt(out, fn);
}
NT_API nt_tensor *nt_cat(nt_tensor *const *ts, int n, int dim) { return nt_cat_at(NT_RA_SITE, ts, n, dim); }

NT_API nt_tensor *nt_detach_at(const nt_site *site, nt_tensor *t)
{
    nt__call c;
    if (!begin1(&c, site, "nt_detach", NT_OP_ALIAS, t))
        return nt__call_fail(&c);
    t = c.in[0];
    c.no_grad = true;
    set_out(&c, (nt_dtype)t->dtype, t->ndim, t->shape);
    return nt__dispatch_view(&c, nt__make_view(t, t->ndim, t->shape, t->stride, t->offset, site));
}
NT_API nt_tensor *nt_detach(nt_tensor *t) { return nt_detach_at(NT_RA_SITE, t); }
