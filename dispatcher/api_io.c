/* dispatcher/api_io.c - creating tensors and reading them back (sync points). */
#include <math.h>
#include <string.h>

#include "debug/debug.h"
#include "dispatcher/dispatch.h"
#include "fusion/graph.h"
#include "streams/stream.h"


bool nt__check_shape(const nt_site *site, const char *fn, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > NT_MAX_DIMS) {
        nt__err(site, NT_EINVAL, fn, "argument 'ndim' is %d; expected 0..%d", ndim, NT_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        nt__err(site, NT_EINVAL, fn, "argument 'shape' is NULL for ndim %d", ndim);
        return false;
    }
    char why[256];
    if (!nt__shape_ok(ndim, shape, why, sizeof why)) {
        nt__err(site, NT_EINVAL, fn, "argument 'shape': %s", why);
        return false;
    }
    return true;
}

static bool check_dtype(const nt_site *site, const char *fn, nt_dtype dt, bool float_only)
{
    if ((unsigned)dt >= NT_DTYPE_COUNT) {
        nt__err(site, NT_EDTYPE, fn, "argument 'dt' is %d; expected an nt_dtype", (int)dt);
        return false;
    }
    if (float_only && !nt__dtype_is_float(dt)) {
        nt__err(site, NT_EDTYPE, fn, "argument 'dt' is %s; expected f32, bf16 or f16",
                nt_dtype_name(dt));
        return false;
    }
    return true;
}

/* ---------------- creation ---------------- */

NT_API nt_tensor *nt_from_host_at(const nt_site *site, const void *src, nt_dtype dt, int ndim,
                                  const int64_t *shape)
{
    const char *fn = "nt_from_host";
    if (!nt__ensure_init() || !check_dtype(site, fn, dt, false) ||
        !nt__check_shape(site, fn, ndim, shape))
        return NULL;
    int64_t n = nt__numel(ndim, shape);
    if (!src && n > 0) {
        nt__err(site, NT_EINVAL, fn, "argument 'src' is NULL");
        return NULL;
    }
    nt__alloc_dev = nt__stream_current()->dev; /* the current device's memory */
    nt_tensor *t = nt__tensor_empty(dt, ndim, shape, site, fn);
    nt__alloc_dev = 0;
    if (!t)
        return NULL;
    size_t nbytes = (size_t)n * nt__dtype_size(dt);
    /* a big tensor's block is taken now (nt__tensor_data would abort) */
    void *d = nbytes ? nt__storage_materialize(t->st) : NULL;
    if (nbytes && !d) {
        nt_release(t);
        char sh[128];
        nt__err(site, NT_EHOSTMEM, fn, "out of host memory for the %zu bytes of a %s tensor of "
                "shape %s", nbytes, nt_dtype_name(dt), nt__shape_str(ndim, shape, sh, sizeof sh));
        return NULL;
    }
    if (nbytes)
        memcpy(d, src, nbytes);
    NT__COUNT(bytes_from_host, nbytes);
    if (NT__CFG(check_nan))
        nt__nan_note_host(t, site, fn);
    return nt__scope_adopt(t, fn);
}

static nt_tensor *fill_op(const nt_site *site, const char *fn, int op, nt_dtype dt, int ndim,
                          const int64_t *shape, double v0, double v1, uint64_t seed)
{
    if (!nt__ensure_init() ||
        !check_dtype(site, fn, dt, op == NT_OP_RAND || op == NT_OP_RANDN) ||
        !nt__check_shape(site, fn, ndim, shape))
        return NULL;
    nt__call c;
    if (!nt__call_begin(&c, site, fn, op, 0, NULL, ""))
        return nt__call_fail(&c);
    c.odt[0] = dt;
    c.ondim[0] = ndim;
    for (int i = 0; i < ndim; i++)
        c.oshape[0][i] = shape[i];
    c.p.f[0] = v0;
    c.p.f[1] = v1;
    c.p.seed = seed;
    c.flops = (double)nt__numel(ndim, shape);
    return nt__dispatch(&c);
}

NT_API nt_tensor *nt_full_at(const nt_site *site, nt_dtype dt, int ndim, const int64_t *shape,
                             double value)
{
    return fill_op(site, "nt_full", NT_OP_FILL, dt, ndim, shape, value, 0, 0);
}
NT_API nt_tensor *nt_zeros_at(const nt_site *site, nt_dtype dt, int ndim, const int64_t *shape)
{
    return fill_op(site, "nt_zeros", NT_OP_FILL, dt, ndim, shape, 0.0, 0, 0);
}
NT_API nt_tensor *nt_ones_at(const nt_site *site, nt_dtype dt, int ndim, const int64_t *shape)
{
    return fill_op(site, "nt_ones", NT_OP_FILL, dt, ndim, shape, 1.0, 0, 0);
}
NT_API nt_tensor *nt_rand_at(const nt_site *site, nt_dtype dt, int ndim, const int64_t *shape,
                             uint64_t seed)
{
    return fill_op(site, "nt_rand", NT_OP_RAND, dt, ndim, shape, 0, 0, seed);
}
NT_API nt_tensor *nt_randn_at(const nt_site *site, nt_dtype dt, int ndim, const int64_t *shape,
                              uint64_t seed)
{
    return fill_op(site, "nt_randn", NT_OP_RANDN, dt, ndim, shape, 0, 0, seed);
}

static nt_tensor *like(const nt_site *site, const char *fn, nt_tensor *t, double v)
{
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t))
        return NULL;
    return fill_op(site, fn, NT_OP_FILL, (nt_dtype)t->dtype, t->ndim, t->shape, v, 0, 0);
}
NT_API nt_tensor *nt_zeros_like_at(const nt_site *site, nt_tensor *t)
{
    return like(site, "nt_zeros_like", t, 0.0);
}
NT_API nt_tensor *nt_ones_like_at(const nt_site *site, nt_tensor *t)
{
    return like(site, "nt_ones_like", t, 1.0);
}
NT_API nt_tensor *nt_full_like_at(const nt_site *site, nt_tensor *t, double v)
{
    return like(site, "nt_full_like", t, v);
}

NT_API nt_tensor *nt_arange_at(const nt_site *site, nt_dtype dt, double start, double end,
                               double step)
{
    const char *fn = "nt_arange";
    if (!nt__ensure_init() || !check_dtype(site, fn, dt, false))
        return NULL;
    if (!isfinite(start) || !isfinite(end) || !isfinite(step) || step == 0 ||
        (step > 0 && end < start) || (step < 0 && end > start)) {
        nt__err(site, NT_EINVAL, fn,
                "cannot count from %g to %g by %g (need finite values, a nonzero step, and "
                "the step's sign pointing from start to end)", start, end, step);
        return NULL;
    }
    double n = ceil((end - start) / step);
    if (n > 2147483647.0) {
        nt__err(site, NT_EINVAL, fn, "%g elements is too many", n);
        return NULL;
    }
    int64_t shape[1] = {(int64_t)n};
    return fill_op(site, fn, NT_OP_ARANGE, dt, 1, shape, start, step, 0);
}

NT_API nt_tensor *nt_from_host(const void *src, nt_dtype dt, int ndim, const int64_t *shape)
{
    return nt_from_host_at(NT_RA_SITE, src, dt, ndim, shape);
}
NT_API nt_tensor *nt_zeros(nt_dtype dt, int ndim, const int64_t *shape)
{
    return nt_zeros_at(NT_RA_SITE, dt, ndim, shape);
}
NT_API nt_tensor *nt_ones(nt_dtype dt, int ndim, const int64_t *shape)
{
    return nt_ones_at(NT_RA_SITE, dt, ndim, shape);
}
NT_API nt_tensor *nt_full(nt_dtype dt, int ndim, const int64_t *shape, double v)
{
    return nt_full_at(NT_RA_SITE, dt, ndim, shape, v);
}
NT_API nt_tensor *nt_zeros_like(nt_tensor *t) { return nt_zeros_like_at(NT_RA_SITE, t); }
NT_API nt_tensor *nt_ones_like(nt_tensor *t) { return nt_ones_like_at(NT_RA_SITE, t); }
NT_API nt_tensor *nt_full_like(nt_tensor *t, double v) { return nt_full_like_at(NT_RA_SITE, t, v); }
NT_API nt_tensor *nt_arange(nt_dtype dt, double start, double end, double step)
{
    return nt_arange_at(NT_RA_SITE, dt, start, end, step);
}
NT_API nt_tensor *nt_rand(nt_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    return nt_rand_at(NT_RA_SITE, dt, ndim, shape, seed);
}
NT_API nt_tensor *nt_randn(nt_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    return nt_randn_at(NT_RA_SITE, dt, ndim, shape, seed);
}

/* ---------------- sync points ---------------- */

/* Waits for t's value.  Returns 0, or the poisoning error, with the thread
 * error naming the failed op and this sync point. */
int nt__wait_tensor(const nt_site *site, const char *fn, nt_tensor *t)
{
    if (nt__capturing())
        return nt__capture_refuse(site, fn);
    if (!nt__check_resident(site, fn, "t", t))
        return nt_last_error();
    NT__COUNT(syncs, 1);
    uint64_t lw = AO_load_acquire(&t->st->last_write);
    bool traced = nt__trace_enabled();
    double t0 = traced ? nt__htrace_now() : 0;
    if (lw)
        nt__wait_packed(lw);
    if (traced)
        nt__htrace_sync(fn, site, t->id, lw, t0);
    nt__errobj *e = (nt__errobj *)AO_load_acquire(&t->st->poison);
    if (!e)
        return 0;
    AO_store(&e->reported, 1);
    char where[NT__SITE_MAX], tail[NT__SITE_MAX + 128];
    nt__site_format(site, where, sizeof where);
    snprintf(tail, sizeof tail, " [reported by %s at %s]", fn, where);
    char msg[NT__ERRMSG_MAX]; /* on the stack: reporting must work with the host out of memory */
    nt__msg_join(msg, sizeof msg, "", e->msg, tail);
    nt__err_set(e->code, msg);
    return e->code;
}

/* Copies t's elements, row-major, into dst (t must be ready). */
static void gather(const nt_tensor *t, void *dst)
{
    size_t es = nt__dtype_size((nt_dtype)t->dtype);
    int64_t n = nt__numel(t->ndim, t->shape);
    if (n == 0)
        return;
    const char *base = (const char *)nt__tensor_data(t);
    if (nt__is_contig(t)) {
        memcpy(dst, base, (size_t)n * es);
        return;
    }
    int64_t idx[NT_MAX_DIMS] = {0};
    char *o = dst;
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int i = 0; i < t->ndim; i++)
            off += idx[i] * t->stride[i];
        memcpy(o, base + off * (int64_t)es, es);
        o += es;
        nt__idx_next(idx, t->ndim, t->shape);
    }
}

NT_API int nt_to_host_at(const nt_site *site, nt_tensor *t, void *dst, size_t nbytes)
{
    const char *fn = "nt_to_host";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!nt__check_arg(site, fn, "t", t))
        return nt__err_or(NT_EINVAL);
    size_t need = (size_t)nt__numel(t->ndim, t->shape) * nt__dtype_size((nt_dtype)t->dtype);
    if (!dst && need)
        return nt__err(site, NT_EINVAL, fn, "argument 'dst' is NULL");
    if (nbytes < need)
        return nt__err(site, NT_EINVAL, fn,
                       "argument 'nbytes' is %zu; the %s tensor needs %zu bytes", nbytes,
                       nt_dtype_name((nt_dtype)t->dtype), need);
    int rc = nt__wait_tensor(site, fn, t);
    if (rc)
        return rc;
    gather(t, dst);
    NT__COUNT(bytes_to_host, need);
    return 0;
}

NT_API int nt_item_at(const nt_site *site, nt_tensor *t, double *out)
{
    const char *fn = "nt_item";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!nt__check_arg(site, fn, "t", t))
        return nt__err_or(NT_EINVAL);
    if (!out)
        return nt__err(site, NT_EINVAL, fn, "argument 'out' is NULL");
    int64_t n = nt__numel(t->ndim, t->shape);
    if (n != 1) {
        char s1[128];
        return nt__err(site, NT_ESHAPE, fn, "the tensor has shape %s (%lld elements); expected one "
                       "element", nt__shape_str(t->ndim, t->shape, s1, sizeof s1), (long long)n);
    }
    int rc = nt__wait_tensor(site, fn, t);
    if (rc)
        return rc;
    *out = nt__load_f64(nt__tensor_data(t), (nt_dtype)t->dtype, 0);
    NT__COUNT(bytes_to_host, nt__dtype_size((nt_dtype)t->dtype));
    return 0;
}

NT_API char *nt_format_at(const nt_site *site, nt_tensor *t)
{
    const char *fn = "nt_format";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t))
        return NULL;
    if (nt__wait_tensor(site, fn, t))
        return NULL;
    NT__COUNT(bytes_to_host, (size_t)nt__numel(t->ndim, t->shape) *
                                 nt__dtype_size((nt_dtype)t->dtype));
    char *text = nt__format_tensor(t);
    if (!text)
        nt__err_hostmem(site, fn, "the text");
    return text;
}

NT_API int nt_print_at(const nt_site *site, nt_tensor *t)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (!nt__check_arg(site, "nt_print", "t", t))
        return nt__err_or(NT_EINVAL);
    if (nt__wait_tensor(site, "nt_print", t))
        return nt_last_error();
    NT__COUNT(bytes_to_host, (size_t)nt__numel(t->ndim, t->shape) *
                                 nt__dtype_size((nt_dtype)t->dtype));
    char *s = nt__format_tensor(t);
    if (!s)
        return nt__err_hostmem(site, "nt_print", "the text");
    fputs(s, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    free(s);
    return 0;
}

typedef struct {
    nt__errobj *first;
} sync_acc;

static void sync_one(nt_stream *s, void *arg)
{
    sync_acc *acc = arg;
    nt__stream_drain(s);
    nt__errobj *e = nt__stream_take_error(s);
    if (!e)
        return;
    if (!acc->first && !AO_load(&e->reported))
        acc->first = e;
    else
        nt__errobj_unref(e);
}

NT_API int nt_sync_at(const nt_site *site)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (nt__capturing())
        return nt__capture_refuse(site, "nt_sync");
    NT__COUNT(syncs, 1);
    sync_acc acc = {NULL};
    bool traced = nt__trace_enabled();
    double t0 = traced ? nt__htrace_now() : 0;
    nt__streams_foreach(sync_one, &acc);
    if (traced)
        nt__htrace_sync("nt_sync", site, 0, 0, t0);
    if (!acc.first)
        return 0;
    nt__errobj *e = acc.first;
    AO_store(&e->reported, 1);
    char where[NT__SITE_MAX], tail[NT__SITE_MAX + 64];
    nt__site_format(site, where, sizeof where);
    snprintf(tail, sizeof tail, " [reported by nt_sync at %s]", where);
    char msg[NT__ERRMSG_MAX];
    nt__msg_join(msg, sizeof msg, "", e->msg, tail);
    nt__err_set(e->code, msg);
    int code = e->code;
    nt__errobj_unref(e);
    return code;
}

NT_API int nt_to_host(nt_tensor *t, void *dst, size_t nbytes)
{
    return nt_to_host_at(NT_RA_SITE, t, dst, nbytes);
}
NT_API int nt_item(nt_tensor *t, double *out) { return nt_item_at(NT_RA_SITE, t, out); }
NT_API int nt_print(nt_tensor *t) { return nt_print_at(NT_RA_SITE, t); }
NT_API char *nt_format(nt_tensor *t) { return nt_format_at(NT_RA_SITE, t); }
NT_API int nt_sync(void) { return nt_sync_at(NT_RA_SITE); }
