/* dispatcher/api_rope.c - rotary position embedding: nt_rope and
 * nt_rope_offset, one ROPE op (core/optable.h; the arithmetic in
 * core/rope.h) on a contiguous copy of x.  Its backward is the same op with
 * the rotation inverted (autograd/backward.c). */
#include <math.h>

#include "dispatcher/dispatch.h"
#include "core/rope.h"
#include "fusion/graph.h"

/* The checks both entry points make, before anything is queued. */
static bool rope_args(const nt_site *site, const char *fn, nt_tensor *x, int64_t dims,
                      double base, double scale)
{
    if (!nt__dtype_is_float((nt_dtype)x->dtype)) {
        nt__err(site, NT_EDTYPE, fn, "argument 'x' has dtype %s; expected f32, bf16 or f16",
                nt_dtype_name((nt_dtype)x->dtype));
        return false;
    }
    if (x->ndim < 2) {
        nt__err(site, NT_ESHAPE, fn,
                "argument 'x' has %d dims; expected at least 2 ([..., T, D])", x->ndim);
        return false;
    }
    int64_t D = x->shape[x->ndim - 1];
    if (dims <= 0 || dims % 2 || dims > D) {
        nt__err(site, NT_EINVAL, fn,
                "argument 'dims' is %lld; expected an even count in [2, D] (D = %lld, the "
                "last dim of x)",
                (long long)dims, (long long)D);
        return false;
    }
    if (!(base > 0) || isinf(base)) {
        nt__err(site, NT_EINVAL, fn, "argument 'base' is %g; expected a finite value > 0", base);
        return false;
    }
    if (!isfinite(scale)) {
        nt__err(site, NT_EINVAL, fn, "argument 'scale' is %g; expected a finite value", scale);
        return false;
    }
    return true;
}

/* The ROPE op on x (any float dtype, made contiguous) with the offset
 * tensor ot (or NULL: the parameter off).  The arguments are checked. */
nt_tensor *nt__rope(const nt_site *site, const char *fn, nt_tensor *x, int64_t dims,
                    int flags, double base, double scale, int64_t off, nt_tensor *ot)
{
    nt__call c;
    nt_tensor *in[2] = {nt_contiguous_at(site, x), ot};
    if (!in[0])
        return NULL;
    if (!nt__call_begin(&c, site, fn, NT_OP_ROPE, 2, in, "x,?offset"))
        return nt__call_fail(&c);
    x = c.in[0];
    c.p.i[0] = dims;
    c.p.i[1] = off;
    c.p.i[2] = x->shape[x->ndim - 1];
    c.p.f[0] = base;
    c.p.f[1] = scale;
    c.p.flag = flags;
    c.ondim[0] = x->ndim;
    for (int i = 0; i < x->ndim; i++)
        c.oshape[0][i] = x->shape[i];
    c.odt[0] = (nt_dtype)x->dtype;
    c.flops = 3.0 * (double)nt__numel(x->ndim, x->shape);
    return nt__dispatch(&c);
}

NT_API nt_tensor *nt_rope_at(const nt_site *site, nt_tensor *x, int64_t dims, bool interleaved,
                             double base, double scale, int64_t offset)
{
    const char *fn = "nt_rope";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x) ||
        !rope_args(site, fn, x, dims, base, scale))
        return NULL;
    int64_t T = x->shape[x->ndim - 2];
    if (offset < 0 || offset > NT__ROPE_MAXPOS - T) {
        nt__err(site, NT_EINVAL, fn,
                "argument 'offset' is %lld; expected 0 <= offset and offset + T (T = %lld) "
                "<= 2^24, the positions exact in f32",
                (long long)offset, (long long)T);
        return NULL;
    }
    if (offset != 0 && nt__capturing()) {
        nt__err(site, NT_ESTATE, fn,
                "argument 'offset' is %lld while capturing a program: a replay would use it "
                "again; pass the offset as a tensor (nt_rope_offset) named with "
                "nt_graph_input",
                (long long)offset);
        return NULL;
    }
    return nt__rope(site, fn, x, dims, interleaved ? NT__ROPE_INTERLEAVED : 0, base, scale,
                    offset, NULL);
}
NT_API nt_tensor *nt_rope(nt_tensor *x, int64_t dims, bool interleaved, double base, double scale,
                          int64_t offset)
{
    return nt_rope_at(NT_RA_SITE, x, dims, interleaved, base, scale, offset);
}

NT_API nt_tensor *nt_rope_offset_at(const nt_site *site, nt_tensor *x, int64_t dims,
                                    bool interleaved, double base, double scale,
                                    nt_tensor *offset)
{
    const char *fn = "nt_rope_offset";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "x", x) ||
        !nt__check_arg(site, fn, "offset", offset) ||
        !rope_args(site, fn, x, dims, base, scale))
        return NULL;
    if (offset->dtype != NT_I32) {
        nt__err(site, NT_EDTYPE, fn, "argument 'offset' has dtype %s; expected i32",
                nt_dtype_name((nt_dtype)offset->dtype));
        return NULL;
    }
    if (nt__numel(offset->ndim, offset->shape) != 1) {
        nt__err(site, NT_ESHAPE, fn, "argument 'offset' has %lld elements; expected one",
                (long long)nt__numel(offset->ndim, offset->shape));
        return NULL;
    }
    return nt__rope(site, fn, x, dims, interleaved ? NT__ROPE_INTERLEAVED : 0, base, scale, 0,
                    offset);
}
NT_API nt_tensor *nt_rope_offset(nt_tensor *x, int64_t dims, bool interleaved, double base,
                                 double scale, nt_tensor *offset)
{
    return nt_rope_offset_at(NT_RA_SITE, x, dims, interleaved, base, scale, offset);
}
