/* dispatcher/api_ew.c - elementwise ops, casts, where, and the in-place forms.
 * Each entry point checks its arguments, runs the op's shape and dtype rule,
 * and hands the call to nt__dispatch. */
#include <math.h>

#include "dispatcher/dispatch.h"

static void out_like(nt__call *c, const nt_tensor *t, nt_dtype dt)
{
    c->odt[0] = dt;
    c->ondim[0] = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        c->oshape[0][i] = t->shape[i];
    c->flops = (double)nt__numel(t->ndim, t->shape);
}

static bool is_int_valued(double s)
{
    return isfinite(s) && s == floor(s) && s >= -2147483648.0 && s <= 2147483647.0;
}

/* The ints column of core/optable.h: INTONLY ops refuse floats, FLOAT ops
 * refuse integers (the evaluators have no form for them). */
static bool ints_ok(nt__call *c, int op, nt_dtype dt, const char *arg)
{
    unsigned fl = nt__ops[op].flags;
    bool isfl = nt__dtype_is_float(dt);
    if (isfl && (fl & NT_OPF_INTONLY)) {
        nt__err(c->site, NT_EDTYPE, c->fn, "argument '%s' is %s; expected an integer dtype (i32, u8)",
                arg, nt_dtype_name(dt));
        return false;
    }
    if (!isfl && !(fl & (NT_OPF_INT | NT_OPF_F32INT))) {
        nt__err(c->site, NT_EDTYPE, c->fn, "argument '%s' is %s; expected a floating dtype (f32, bf16, f16)",
                arg, nt_dtype_name(dt));
        return false;
    }
    return true;
}

/* ---------------- unary ---------------- */

nt_tensor *nt__unary(const nt_site *site, const char *fn, int op, nt_tensor *t)
{
    nt__call c;
    if (!nt__call_begin(&c, site, fn, op, 1, &t, "t"))
        return nt__call_fail(&c);
    t = c.in[0];
    nt_dtype dt = (nt_dtype)t->dtype;
    if (!ints_ok(&c, op, dt, "t"))
        return nt__call_fail(&c);
    if (!nt__dtype_is_float(dt) && (nt__ops[op].flags & NT_OPF_F32INT))
        dt = NT_F32;
    out_like(&c, t, dt);
    return nt__dispatch(&c);
}

#define NT_DEF_UNARY(ID, name, nin, kind, flags, ...)                                            \
    NT_API nt_tensor *nt_##name##_at(const nt_site *site, nt_tensor *t)                    \
    {                                                                                       \
        return nt__unary(site, "nt_" #name, NT_OP_##ID, t);                                \
    }                                                                                       \
    NT_API nt_tensor *nt_##name(nt_tensor *t) { return nt_##name##_at(NT_RA_SITE, t); }
NT_OPS_UNARY(NT_DEF_UNARY)

/* ---------------- binary and compare ---------------- */

static bool bcast_out(nt__call *c, nt_tensor *a, nt_tensor *b, const char *an, const char *bn)
{
    int nd;
    int64_t sh[NT_MAX_DIMS];
    if (!nt__broadcast(a->ndim, a->shape, b->ndim, b->shape, &nd, sh)) {
        char s1[128], s2[128];
        nt__err(c->site, NT_ESHAPE, c->fn,
                "arguments '%s' %s and '%s' %s cannot be broadcast together", an,
                nt__shape_str(a->ndim, a->shape, s1, sizeof s1), bn,
                nt__shape_str(b->ndim, b->shape, s2, sizeof s2));
        return false;
    }
    c->ondim[0] = nd;
    for (int i = 0; i < nd; i++)
        c->oshape[0][i] = sh[i];
    c->flops = (double)nt__numel(nd, sh);
    return true;
}

nt_tensor *nt__binary(const nt_site *site, const char *fn, int op, nt_tensor *a, nt_tensor *b)
{
    nt__call c;
    nt_tensor *in[2] = {a, b};
    if (!nt__call_begin(&c, site, fn, op, 2, in, "a,b"))
        return nt__call_fail(&c);
    a = c.in[0];
    b = c.in[1];
    if (!bcast_out(&c, a, b, "a", "b"))
        return nt__call_fail(&c);
    nt_dtype dt = nt__promote((nt_dtype)a->dtype, (nt_dtype)b->dtype);
    if (!ints_ok(&c, op, dt, nt__dtype_is_float((nt_dtype)a->dtype) ? "b" : "a"))
        return nt__call_fail(&c);
    if (nt__ops[op].kind == NT_KIND_CMP)
        dt = NT_U8;
    else if (!nt__dtype_is_float(dt) && (nt__ops[op].flags & NT_OPF_F32INT))
        dt = NT_F32;
    c.odt[0] = dt;
    return nt__dispatch(&c);
}

#define NT_DEF_BINARY(ID, name, nin, kind, flags, ...)                                           \
    NT_API nt_tensor *nt_##name##_at(const nt_site *site, nt_tensor *a, nt_tensor *b)      \
    {                                                                                       \
        return nt__binary(site, "nt_" #name, NT_OP_##ID, a, b);                            \
    }                                                                                       \
    NT_API nt_tensor *nt_##name(nt_tensor *a, nt_tensor *b)                                \
    {                                                                                       \
        return nt_##name##_at(NT_RA_SITE, a, b);                                           \
    }
NT_OPS_BINARY(NT_DEF_BINARY)
NT_OPS_CMP(NT_DEF_BINARY)

/* ---------------- tensor-scalar ---------------- */

static nt_dtype scalar_dtype(int op, nt_dtype dt, double s0, double s1, bool two)
{
    if (nt__dtype_is_float(dt))
        return dt;
    if (nt__ops[op].flags & NT_OPF_F32INT)
        return NT_F32;
    if (!is_int_valued(s0) || (two && !is_int_valued(s1)))
        return NT_F32;
    return dt;
}

nt_tensor *nt__scalar(const nt_site *site, const char *fn, int op, nt_tensor *t, double s0,
                      double s1)
{
    nt__call c;
    if (!nt__call_begin(&c, site, fn, op, 1, &t, "t"))
        return nt__call_fail(&c);
    t = c.in[0];
    if (!ints_ok(&c, op, (nt_dtype)t->dtype, "t"))
        return nt__call_fail(&c);
    out_like(&c, t, scalar_dtype(op, (nt_dtype)t->dtype, s0, s1, op == NT_OP_CLAMP));
    c.p.f[0] = s0;
    c.p.f[1] = s1;
    return nt__dispatch(&c);
}

NT_API nt_tensor *nt_add_scalar_at(const nt_site *site, nt_tensor *t, double s)
{
    return nt__scalar(site, "nt_add_scalar", NT_OP_ADD_SCALAR, t, s, 0);
}
NT_API nt_tensor *nt_mul_scalar_at(const nt_site *site, nt_tensor *t, double s)
{
    return nt__scalar(site, "nt_mul_scalar", NT_OP_MUL_SCALAR, t, s, 0);
}
NT_API nt_tensor *nt_div_scalar_at(const nt_site *site, nt_tensor *t, double s)
{
    return nt__scalar(site, "nt_div_scalar", NT_OP_DIV_SCALAR, t, s, 0);
}
NT_API nt_tensor *nt_pow_scalar_at(const nt_site *site, nt_tensor *t, double s)
{
    return nt__scalar(site, "nt_pow_scalar", NT_OP_POW_SCALAR, t, s, 0);
}
NT_API nt_tensor *nt_clamp_at(const nt_site *site, nt_tensor *t, double lo, double hi)
{
    if (isnan(lo) || isnan(hi)) {
        nt__err(site, NT_EINVAL, "nt_clamp", "bounds must not be NaN (got lo=%g, hi=%g)", lo, hi);
        return NULL;
    }
    return nt__scalar(site, "nt_clamp", NT_OP_CLAMP, t, lo, hi);
}
NT_API nt_tensor *nt_leaky_relu_at(const nt_site *site, nt_tensor *t, double negative_slope)
{
    if (isnan(negative_slope)) {
        nt__err(site, NT_EINVAL, "nt_leaky_relu", "argument 'negative_slope' must not be NaN");
        return NULL;
    }
    return nt__scalar(site, "nt_leaky_relu", NT_OP_LEAKY_RELU, t, negative_slope, 0);
}
NT_API nt_tensor *nt_hardtanh_at(const nt_site *site, nt_tensor *t, double min_val, double max_val)
{
    if (isnan(min_val) || isnan(max_val) || min_val > max_val) {
        nt__err(site, NT_EINVAL, "nt_hardtanh",
                "arguments 'min_val' %g and 'max_val' %g: expected min_val <= max_val, not NaN",
                min_val, max_val);
        return NULL;
    }
    return nt__scalar(site, "nt_hardtanh", NT_OP_HARDTANH, t, min_val, max_val);
}
NT_API nt_tensor *nt_leaky_relu(nt_tensor *t, double negative_slope)
{
    return nt_leaky_relu_at(NT_RA_SITE, t, negative_slope);
}
NT_API nt_tensor *nt_hardtanh(nt_tensor *t, double min_val, double max_val)
{
    return nt_hardtanh_at(NT_RA_SITE, t, min_val, max_val);
}
NT_API nt_tensor *nt_add_scalar(nt_tensor *t, double s) { return nt_add_scalar_at(NT_RA_SITE, t, s); }
NT_API nt_tensor *nt_mul_scalar(nt_tensor *t, double s) { return nt_mul_scalar_at(NT_RA_SITE, t, s); }
NT_API nt_tensor *nt_div_scalar(nt_tensor *t, double s) { return nt_div_scalar_at(NT_RA_SITE, t, s); }
NT_API nt_tensor *nt_pow_scalar(nt_tensor *t, double s) { return nt_pow_scalar_at(NT_RA_SITE, t, s); }
NT_API nt_tensor *nt_clamp(nt_tensor *t, double lo, double hi)
{
    return nt_clamp_at(NT_RA_SITE, t, lo, hi);
}

/* ---------------- where ---------------- */

NT_API nt_tensor *nt_where_at(const nt_site *site, nt_tensor *cond, nt_tensor *a, nt_tensor *b)
{
    nt__call c;
    nt_tensor *in[3] = {cond, a, b};
    if (!nt__call_begin(&c, site, "nt_where", NT_OP_WHERE, 3, in, "cond,a,b"))
        return nt__call_fail(&c);
    cond = c.in[0], a = c.in[1], b = c.in[2];
    if (!bcast_out(&c, a, b, "a", "b"))
        return nt__call_fail(&c);
    int nd;
    int64_t sh[NT_MAX_DIMS];
    if (!nt__broadcast(c.ondim[0], c.oshape[0], cond->ndim, cond->shape, &nd, sh)) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, "nt_where",
                "argument 'cond' %s cannot be broadcast with the values' shape %s",
                nt__shape_str(cond->ndim, cond->shape, s1, sizeof s1),
                nt__shape_str(c.ondim[0], c.oshape[0], s2, sizeof s2));
        return nt__call_fail(&c);
    }
    c.ondim[0] = nd;
    for (int i = 0; i < nd; i++)
        c.oshape[0][i] = sh[i];
    c.odt[0] = nt__promote((nt_dtype)a->dtype, (nt_dtype)b->dtype);
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_where(nt_tensor *cond, nt_tensor *a, nt_tensor *b)
{
    return nt_where_at(NT_RA_SITE, cond, a, b);
}

/* ---------------- tril, triu, masked_fill ---------------- */

/* A select the dispatcher set up (core/optable.h): in = {cond, a, b}, the
 * result t's shape and dtype.  The caller releases its temporaries after
 * (a queued record keeps its inputs alive). */
static nt_tensor *select_op(const nt_site *site, const char *fn, int op, nt_tensor *cond,
                            nt_tensor *a, nt_tensor *b, const char *names, nt_tensor *t)
{
    nt__call c;
    nt_tensor *in[3] = {cond, a, b};
    if (!nt__call_begin(&c, site, fn, op, 3, in, names))
        return nt__call_fail(&c);
    c.ondim[0] = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        c.oshape[0][i] = t->shape[i];
    c.odt[0] = (nt_dtype)t->dtype;
    c.flops = (double)nt__numel(t->ndim, t->shape);
    return nt__dispatch(&c);
}

/* u8 [R, C] mask of the kept triangle: col - row <= d (tril) or >= d
 * (triu), computed on the device.  d is clamped to [-R, C], which keeps
 * every answer and keeps col - row - d inside i32. */
static nt_tensor *tri_mask(const nt_site *site, const char *fn, int64_t R, int64_t C, int64_t d,
                           bool lower)
{
    if (d < -R)
        d = -R;
    if (d > C)
        d = C;
    int64_t sh[2] = {R, C};
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *m = NULL;
    if (R == 0 || C == 0) {
        m = nt_zeros_at(site, NT_U8, 2, sh);
    } else {
        nt_tensor *row = nt_reshape_at(site, nt_arange_at(site, NT_I32, 0, (double)R, 1),
                                       2, (int64_t[]){R, 1});
        nt_tensor *col = nt_reshape_at(site, nt_arange_at(site, NT_I32, 0, (double)C, 1),
                                       2, (int64_t[]){1, C});
        nt_tensor *off = nt_sub_at(site, col, row);
        nt_tensor *dd = nt_full_at(site, NT_I32, 0, NULL, (double)d);
        if (off && dd)
            m = lower ? nt_le_at(site, off, dd) : nt_ge_at(site, off, dd);
    }
    if (m)
        nt_keep(m);
    else
        nt__err_within(fn); /* the inner op's error: say whose mask it was */
    nt_scope_end(s);
    return m;
}

static nt_tensor *tri(const nt_site *site, const char *fn, int op, nt_tensor *t,
                      int64_t diagonal)
{
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t))
        return NULL;
    if (t->ndim < 2) {
        char s1[128];
        nt__err(site, NT_ESHAPE, fn,
                "argument 't' %s must have at least 2 dimensions (the matrix is the last two)",
                nt__shape_str(t->ndim, t->shape, s1, sizeof s1));
        return NULL;
    }
    nt_tensor *m = tri_mask(site, fn, t->shape[t->ndim - 2], t->shape[t->ndim - 1], diagonal,
                            op == NT_OP_TRIL);
    if (!m)
        return NULL;
    nt_tensor *z = nt_zeros_at(site, (nt_dtype)t->dtype, 0, NULL);
    if (!z) {
        nt__err_within(fn);
        nt_release(m);
        return NULL;
    }
    nt_keep(z);
    nt_tensor *y = select_op(site, fn, op, m, t, z, "mask,t,zero", t);
    nt_release(m);
    nt_release(z);
    return y;
}

NT_API nt_tensor *nt_tril_at(const nt_site *site, nt_tensor *t, int64_t diagonal)
{
    return tri(site, "nt_tril", NT_OP_TRIL, t, diagonal);
}
NT_API nt_tensor *nt_tril(nt_tensor *t, int64_t diagonal)
{
    return nt_tril_at(NT_RA_SITE, t, diagonal);
}
NT_API nt_tensor *nt_triu_at(const nt_site *site, nt_tensor *t, int64_t diagonal)
{
    return tri(site, "nt_triu", NT_OP_TRIU, t, diagonal);
}
NT_API nt_tensor *nt_triu(nt_tensor *t, int64_t diagonal)
{
    return nt_triu_at(NT_RA_SITE, t, diagonal);
}

NT_API nt_tensor *nt_masked_fill_at(const nt_site *site, nt_tensor *t, nt_tensor *mask,
                                    double value)
{
    const char *fn = "nt_masked_fill";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t) ||
        !nt__check_arg(site, fn, "mask", mask))
        return NULL;
    if (mask->dtype != NT_U8 && mask->dtype != NT_BOOL) {
        nt__err(site, NT_EDTYPE, fn, "argument 'mask' has dtype %s; expected u8 or bool",
                nt_dtype_name((nt_dtype)mask->dtype));
        return NULL;
    }
    int nd;
    int64_t sh[NT_MAX_DIMS];
    bool same = nt__broadcast(mask->ndim, mask->shape, t->ndim, t->shape, &nd, sh) &&
                nd == t->ndim;
    for (int i = 0; same && i < nd; i++)
        same = sh[i] == t->shape[i];
    if (!same) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn, "argument 'mask' %s does not broadcast to 't' %s",
                nt__shape_str(mask->ndim, mask->shape, s1, sizeof s1),
                nt__shape_str(t->ndim, t->shape, s2, sizeof s2));
        return NULL;
    }
    /* the value rounds to t's dtype exactly as nt_full rounds it */
    nt_tensor *v = nt_full_at(site, (nt_dtype)t->dtype, 0, NULL, value);
    if (!v)
        return NULL;
    nt_keep(v);
    nt_tensor *y = select_op(site, fn, NT_OP_MASKED_FILL, mask, v, t, "mask,value,t", t);
    nt_release(v);
    return y;
}
NT_API nt_tensor *nt_masked_fill(nt_tensor *t, nt_tensor *mask, double value)
{
    return nt_masked_fill_at(NT_RA_SITE, t, mask, value);
}

/* ---------------- casts and copies ---------------- */

/* A copy (dt == -1) or a cast.  An f32 -> bf16/f16 cast rounds
 * stochastically when `sr` is set or NT_STOCHASTIC_ROUNDING=1: the record
 * carries the flag and the seed, the kernels draw the bits (core/dtype.h). */
static nt_tensor *copy_to(const nt_site *site, const char *fn, nt_tensor *src, nt_dtype dt,
                          bool sr)
{
    nt__call c;
    if (!nt__call_begin(&c, site, fn, dt == (nt_dtype)-1 ? NT_OP_COPY : NT_OP_CAST, 1, &src,
                        "t"))
        return nt__call_fail(&c);
    src = c.in[0];
    out_like(&c, src, dt == (nt_dtype)-1 ? (nt_dtype)src->dtype : dt);
    /* (NT_STOCHASTIC_ROUNDING=1 covers f32 -> bf16/f16 only; an fp8 cast
     * rounds stochastically when nt_cast_sr asks) */
    if ((sr && nt__dtype_is_fp8(dt)) ||
        ((sr || NT__CFG(sr)) && src->dtype == NT_F32 && (dt == NT_BF16 || dt == NT_F16))) {
        c.p.flag |= NT__CAST_SR;
        c.p.seed = NT__CFG(sr_seed);
    }
    return nt__dispatch(&c);
}

nt_tensor *nt__copy_to(const nt_site *site, const char *fn, nt_tensor *src, nt_dtype dt)
{
    return copy_to(site, fn, src, dt, false);
}

NT_API nt_tensor *nt_to_device_at(const nt_site *site, nt_tensor *t, int dev)
{
    const char *fn = "nt_to_device";
    nt__call c;
    /* Begun without inputs: nt__call_begin's device check is for ops that
     * run where their inputs are, and a copy between devices reads another
     * device's memory by design. */
    if (!nt__call_begin(&c, site, fn, NT_OP_COPY, 0, NULL, ""))
        return nt__call_fail(&c);
    if (!nt__check_arg(site, fn, "t", t))
        return nt__call_fail(&c);
    int n = NT__CFG(devices);
    if (dev < 0 || dev >= n) {
        nt__err(site, NT_EINVAL, fn, "argument 'dev' is %d; expected a device from 0 to %d "
                "(NT_SIM_CORES=%d)", dev, n - 1, n);
        return nt__call_fail(&c);
    }
    c.in[0] = t;
    c.nin = 1;
    c.out_dev = dev;
    out_like(&c, t, (nt_dtype)t->dtype);
    return nt__dispatch(&c);
}
NT_API nt_tensor *nt_to_device(nt_tensor *t, int dev) { return nt_to_device_at(NT_RA_SITE, t, dev); }

NT_API nt_tensor *nt_cast_at(const nt_site *site, nt_tensor *t, nt_dtype dt)
{
    if ((unsigned)dt >= NT_DTYPE_COUNT) {
        if (!nt__check_arg(site, "nt_cast", "t", t))
            return NULL;
        nt__err(site, NT_EDTYPE, "nt_cast", "argument 'dt' is %d; expected an nt_dtype", (int)dt);
        return NULL;
    }
    if (t && t->magic == NT__MAGIC_LIVE && t->dtype == dt) {
        /* same dtype: a new handle on the same storage (like PyTorch's .to) */
        nt__call c;
        if (!nt__call_begin(&c, site, "nt_cast", NT_OP_ALIAS, 1, &t, "t"))
            return nt__call_fail(&c);
        return nt__dispatch_view(&c, nt__make_view(t, t->ndim, t->shape, t->stride, t->offset,
                                                    site));
    }
    return nt__copy_to(site, "nt_cast", t, dt);
}
NT_API nt_tensor *nt_cast(nt_tensor *t, nt_dtype dt) { return nt_cast_at(NT_RA_SITE, t, dt); }

NT_API nt_tensor *nt_cast_sr_at(const nt_site *site, nt_tensor *t, nt_dtype dt)
{
    const char *fn = "nt_cast_sr";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t))
        return NULL;
    bool to_half = t->dtype == NT_F32 && (dt == NT_BF16 || dt == NT_F16);
    bool to_fp8 = (t->dtype == NT_F32 || t->dtype == NT_BF16 || t->dtype == NT_F16) &&
                  (unsigned)dt < NT_DTYPE_COUNT && nt__dtype_is_fp8(dt);
    if (!to_half && !to_fp8) {
        nt__err(site, NT_EDTYPE, fn,
                "stochastic rounding casts f32 to bf16 or f16, or f32, bf16 or f16 to e4m3 or "
                "e5m2; got %s to %s (use nt_cast)",
                nt_dtype_name((nt_dtype)t->dtype), nt_dtype_name(dt));
        return NULL;
    }
    return copy_to(site, fn, t, dt, true);
}
NT_API nt_tensor *nt_cast_sr(nt_tensor *t, nt_dtype dt)
{
    return nt_cast_sr_at(NT_RA_SITE, t, dt);
}

/* ---------------- in place ---------------- */

/* Common checks for writing into dst: live, not an expanded view, src
 * broadcastable to exactly dst's shape.  A src that shares dst's storage
 * through a different view is copied first, so the op never reads what it
 * has already overwritten. */
static bool inplace_begin(nt__call *c, const nt_site *site, const char *fn, int op,
                          nt_tensor *dst, nt_tensor *src, bool has_src)
{
    nt_tensor *in[2] = {dst, src};
    /* has_src, not src != NULL: a NULL src is an error, not a unary op */
    if (!nt__call_begin(c, site, fn, op, has_src ? 2 : 1, in, has_src ? "dst,src" : "dst"))
        return false;
    dst = c->in[0];
    if (dst->expanded) {
        nt__err(site, NT_EINVAL, fn,
                "argument 'dst' is an expanded view (some elements share memory); write into "
                "a contiguous copy instead");
        return false;
    }
    if (has_src) {
        src = c->in[1];
        int nd;
        int64_t sh[NT_MAX_DIMS];
        bool ok = nt__broadcast(dst->ndim, dst->shape, src->ndim, src->shape, &nd, sh) &&
                  nd == dst->ndim;
        for (int i = 0; ok && i < nd; i++)
            ok = sh[i] == dst->shape[i];
        if (!ok) {
            char s1[128], s2[128];
            nt__err(site, NT_ESHAPE, fn,
                    "argument 'src' %s does not broadcast to the shape of 'dst' %s",
                    nt__shape_str(src->ndim, src->shape, s1, sizeof s1),
                    nt__shape_str(dst->ndim, dst->shape, s2, sizeof s2));
            return false;
        }
        bool same_view = src->st == dst->st && src->offset == dst->offset &&
                         src->ndim == dst->ndim && src->dtype == dst->dtype;
        for (int i = 0; same_view && i < src->ndim; i++)
            same_view = src->shape[i] == dst->shape[i] && src->stride[i] == dst->stride[i];
        if (src->st == dst->st && !same_view) {
            nt_tensor *copy = nt__copy_to(site, fn, src, (nt_dtype)-1);
            if (!copy)
                return false;
            /* the scope must not own it: the call does */
            nt_keep(copy);
            c->tmp[1] = copy;
            c->in[1] = copy;
        }
    }
    c->dst = dst;
    out_like(c, dst, (nt_dtype)dst->dtype);
    return true;
}

static int inplace_end(nt__call *c)
{
    return nt__dispatch(c) ? 0 : nt_last_error();
}

static int inplace_binary(const nt_site *site, const char *fn, int op, nt_tensor *dst,
                          nt_tensor *src)
{
    nt__call c;
    if (!inplace_begin(&c, site, fn, op, dst, src, true)) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    return inplace_end(&c);
}

/* nt_copy_into, recording an autograd node unless no_grad */
static int copy_into(const nt_site *site, const char *fn, nt_tensor *dst, nt_tensor *src,
                     bool no_grad)
{
    nt__call c;
    if (!inplace_begin(&c, site, fn, NT_OP_COPY, dst, src, true)) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    /* COPY reads only src: drop dst from the inputs */
    c.in[0] = c.in[1];
    c.in[1] = NULL;
    c.tmp[0] = c.tmp[1];
    c.tmp[1] = NULL;
    c.nin = 1;
    c.no_grad = no_grad;
    return inplace_end(&c);
}

NT_API int nt_copy_into_at(const nt_site *site, nt_tensor *dst, nt_tensor *src)
{
    return copy_into(site, "nt_copy_into", dst, src, false);
}

int nt__copy_into_nograd(const nt_site *site, const char *fn, nt_tensor *dst, nt_tensor *src)
{
    return copy_into(site, fn, dst, src, true);
}

int nt__add_scalar_into(const nt_site *site, const char *fn, nt_tensor *dst, nt_tensor *src,
                        double s)
{
    nt__call c;
    if (!inplace_begin(&c, site, fn, NT_OP_ADD_SCALAR, dst, src, true)) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    /* like nt_copy_into: the op reads src only */
    c.in[0] = c.in[1];
    c.in[1] = NULL;
    c.tmp[0] = c.tmp[1];
    c.tmp[1] = NULL;
    c.nin = 1;
    c.p.f[0] = s;
    return inplace_end(&c);
}

NT_API int nt_add_inplace_at(const nt_site *site, nt_tensor *dst, nt_tensor *src)
{
    return inplace_binary(site, "nt_add_inplace", NT_OP_ADD, dst, src);
}
NT_API int nt_sub_inplace_at(const nt_site *site, nt_tensor *dst, nt_tensor *src)
{
    return inplace_binary(site, "nt_sub_inplace", NT_OP_SUB, dst, src);
}
NT_API int nt_mul_inplace_at(const nt_site *site, nt_tensor *dst, nt_tensor *src)
{
    return inplace_binary(site, "nt_mul_inplace", NT_OP_MUL, dst, src);
}
NT_API int nt_div_inplace_at(const nt_site *site, nt_tensor *dst, nt_tensor *src)
{
    return inplace_binary(site, "nt_div_inplace", NT_OP_DIV, dst, src);
}

static int inplace_scalar(const nt_site *site, const char *fn, int op, nt_tensor *dst, double s0,
                          double s1)
{
    nt__call c;
    if (!inplace_begin(&c, site, fn, op, dst, NULL, false)) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    c.p.f[0] = s0;
    c.p.f[1] = s1;
    return inplace_end(&c);
}

NT_API int nt_add_scalar_inplace_at(const nt_site *site, nt_tensor *dst, double s)
{
    return inplace_scalar(site, "nt_add_scalar_inplace", NT_OP_ADD_SCALAR, dst, s, 0);
}
NT_API int nt_mul_scalar_inplace_at(const nt_site *site, nt_tensor *dst, double s)
{
    return inplace_scalar(site, "nt_mul_scalar_inplace", NT_OP_MUL_SCALAR, dst, s, 0);
}
NT_API int nt_clamp_inplace_at(const nt_site *site, nt_tensor *dst, double lo, double hi)
{
    if (isnan(lo) || isnan(hi))
        return nt__err(site, NT_EINVAL, "nt_clamp_inplace",
                       "bounds must not be NaN (got lo=%g, hi=%g)", lo, hi);
    return inplace_scalar(site, "nt_clamp_inplace", NT_OP_CLAMP, dst, lo, hi);
}

NT_API int nt_fill_inplace_at(const nt_site *site, nt_tensor *dst, double value)
{
    nt__call c;
    if (!inplace_begin(&c, site, "nt_fill_inplace", NT_OP_FILL, dst, NULL, false)) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    c.in[0] = NULL; /* a fill reads nothing */
    c.nin = 0;
    c.p.f[0] = value;
    return inplace_end(&c);
}

static int inplace_unary(const nt_site *site, const char *fn, int op, nt_tensor *dst)
{
    nt__call c;
    if (!inplace_begin(&c, site, fn, op, dst, NULL, false)) {
        nt__call_fail(&c);
        return nt_last_error();
    }
    return inplace_end(&c);
}

NT_API int nt_relu_inplace_at(const nt_site *site, nt_tensor *dst)
{
    return inplace_unary(site, "nt_relu_inplace", NT_OP_RELU, dst);
}
NT_API int nt_neg_inplace_at(const nt_site *site, nt_tensor *dst)
{
    return inplace_unary(site, "nt_neg_inplace", NT_OP_NEG, dst);
}

NT_API int nt_copy_into(nt_tensor *dst, nt_tensor *src) { return nt_copy_into_at(NT_RA_SITE, dst, src); }
NT_API int nt_add_inplace(nt_tensor *dst, nt_tensor *src) { return nt_add_inplace_at(NT_RA_SITE, dst, src); }
NT_API int nt_sub_inplace(nt_tensor *dst, nt_tensor *src) { return nt_sub_inplace_at(NT_RA_SITE, dst, src); }
NT_API int nt_mul_inplace(nt_tensor *dst, nt_tensor *src) { return nt_mul_inplace_at(NT_RA_SITE, dst, src); }
NT_API int nt_div_inplace(nt_tensor *dst, nt_tensor *src) { return nt_div_inplace_at(NT_RA_SITE, dst, src); }
NT_API int nt_add_scalar_inplace(nt_tensor *dst, double s) { return nt_add_scalar_inplace_at(NT_RA_SITE, dst, s); }
NT_API int nt_mul_scalar_inplace(nt_tensor *dst, double s) { return nt_mul_scalar_inplace_at(NT_RA_SITE, dst, s); }
NT_API int nt_clamp_inplace(nt_tensor *dst, double lo, double hi) { return nt_clamp_inplace_at(NT_RA_SITE, dst, lo, hi); }
NT_API int nt_fill_inplace(nt_tensor *dst, double v) { return nt_fill_inplace_at(NT_RA_SITE, dst, v); }
NT_API int nt_relu_inplace(nt_tensor *dst) { return nt_relu_inplace_at(NT_RA_SITE, dst); }
NT_API int nt_neg_inplace(nt_tensor *dst) { return nt_neg_inplace_at(NT_RA_SITE, dst); }
