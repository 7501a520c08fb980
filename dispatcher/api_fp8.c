/* dispatcher/api_fp8.c - nt_matmul_fp8: the fp8 matrix product with
 * per-tensor scales (docs/ops.md "fp8").
 *
 * One MATMUL record with fp8 operands and an f32 result (the CPU kernel
 * widens the operands exactly and runs nt_matmul's recurrence; the
 * simulator's TensorE multiplies fp8 tiles at the target's fp8 rate, the
 * same K order, so the same bits), then ordinary ops: s = scale_a *
 * scale_b (f32), y = acc * s, and a cast to bf16 when asked.  The scales
 * are tensors read when those ops run, never host constants, so a captured
 * graph replays with whatever values they hold then; the multiply fuses
 * into its neighbours as any elementwise op. */
#include <string.h>

#include "dispatcher/dispatch.h"

static bool fp8_arg(const nt_site *site, const char *fn, const char *arg, nt_tensor *t,
                    nt_dtype want)
{
    if (nt__dtype_is_fp8((nt_dtype)t->dtype) && (want == NT_DTYPE_COUNT || t->dtype == want))
        return true;
    if (want == NT_DTYPE_COUNT)
        nt__err(site, NT_EDTYPE, fn, "argument '%s' is %s; expected e4m3 or e5m2 (cast it with "
                "nt_cast or nt_cast_sr)", arg, nt_dtype_name((nt_dtype)t->dtype));
    else
        nt__err(site, NT_EDTYPE, fn, "argument '%s' is %s; expected %s, a's dtype (both "
                "operands e4m3 or both e5m2)", arg, nt_dtype_name((nt_dtype)t->dtype),
                nt_dtype_name(want));
    return false;
}

static bool scale_arg(const nt_site *site, const char *fn, const char *arg, nt_tensor *t)
{
    if (t->dtype != NT_F32) {
        nt__err(site, NT_EDTYPE, fn, "argument '%s' is %s; expected a one-element f32 tensor",
                arg, nt_dtype_name((nt_dtype)t->dtype));
        return false;
    }
    if (t->ndim > 1 || nt__numel(t->ndim, t->shape) != 1) {
        char s[128];
        nt__err(site, NT_ESHAPE, fn, "argument '%s' has shape %s; expected one element "
                "(shape [] or [1]): the scales are per tensor", arg,
                nt__shape_str(t->ndim, t->shape, s, sizeof s));
        return false;
    }
    return true;
}

static bool args_ok(const nt_site *site, const char *fn, nt_tensor *const in[4],
                    nt_dtype out_dtype)
{
    static const char *const names[4] = {"a", "b", "scale_a", "scale_b"};
    for (int i = 0; i < 4; i++)
        if (!nt__check_arg(site, fn, names[i], in[i]))
            return false;
    if (!fp8_arg(site, fn, "a", in[0], NT_DTYPE_COUNT) ||
        !fp8_arg(site, fn, "b", in[1], (nt_dtype)in[0]->dtype) ||
        !scale_arg(site, fn, "scale_a", in[2]) || !scale_arg(site, fn, "scale_b", in[3]))
        return false;
    if (out_dtype != NT_F32 && out_dtype != NT_BF16) {
        nt__err(site, NT_EDTYPE, fn, "argument 'out_dtype' is %s; expected f32 or bf16",
                nt_dtype_name(out_dtype));
        return false;
    }
    for (int i = 0; nt_grad_enabled() && i < 4; i++)
        if (nt_requires_grad(in[i])) {
            nt__err(site, NT_EINVAL, fn, "argument '%s' requires grad; nt_matmul_fp8 is not "
                    "differentiable (fp8 autocast differentiates through its casts: "
                    "docs/ops.md \"fp8\")", names[i]);
            return false;
        }
    return true;
}

/* acc = a . b in f32: the MATMUL record with fp8 operands */
static nt_tensor *fp8_product(const nt_site *site, const char *fn, nt_tensor *a, nt_tensor *b)
{
    nt__call c;
    nt_tensor *in[2] = {a, b};
    if (!nt__call_begin(&c, site, fn, NT_OP_MATMUL, 2, in, "a,b"))
        return nt__call_fail(&c);
    a = c.in[0], b = c.in[1];
    nt__mminfo mi;
    char why[160];
    if (!nt__matmul_info(a, b, &mi, why, sizeof why)) {
        char s1[128], s2[128];
        nt__err(site, NT_ESHAPE, fn, "cannot multiply 'a' %s by 'b' %s: %s",
                nt__shape_str(a->ndim, a->shape, s1, sizeof s1),
                nt__shape_str(b->ndim, b->shape, s2, sizeof s2), why);
        return nt__call_fail(&c);
    }
    c.odt[0] = NT_F32;
    c.ondim[0] = mi.ondim;
    for (int i = 0; i < mi.ondim; i++)
        c.oshape[0][i] = mi.oshape[i];
    c.flops = 2.0 * (double)mi.M * (double)mi.N * (double)mi.K *
              (double)nt__numel(mi.nbatch, mi.batch);
    return nt__dispatch(&c);
}

static nt_tensor *fp8_scaled(const nt_site *site, const char *fn, nt_scope *sc, nt_tensor *a,
                             nt_tensor *b, nt_tensor *s, nt_dtype out_dtype);

NT_API nt_tensor *nt_matmul_fp8_at(const nt_site *site, nt_tensor *a, nt_tensor *b,
                                   nt_tensor *scale_a, nt_tensor *scale_b, nt_dtype out_dtype)
{
    const char *fn = "nt_matmul_fp8";
    nt_tensor *in[4] = {a, b, scale_a, scale_b};
    if (!nt__ensure_init() || !args_ok(site, fn, in, out_dtype))
        return NULL;
    if (scale_a->dev != a->dev || scale_b->dev != a->dev) {
        nt__device_mismatch(site, fn, scale_a->dev != a->dev ? "scale_a" : "scale_b",
                            scale_a->dev != a->dev ? scale_a->dev : scale_b->dev, a->dev);
        return NULL;
    }
    nt_scope *sc = nt_scope_begin();
    if (!sc) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    /* s = round_f32(scale_a * scale_b), 0-d so it broadcasts over any result;
     * made before the product, so that the product and its scaling are
     * neighbours in the queue and fuse (the scaling as the matmul's
     * epilogue, applied while the accumulator leaves PSUM) */
    nt_tensor *s = nt_mul_at(site, nt_reshape_at(site, scale_a, 0, NULL),
                             nt_reshape_at(site, scale_b, 0, NULL));
    return fp8_scaled(site, fn, sc, a, b, s, out_dtype);
}

/* acc(a, b) * s rounded to out_dtype, inside scope sc (ended here) */
static nt_tensor *fp8_scaled(const nt_site *site, const char *fn, nt_scope *sc, nt_tensor *a,
                             nt_tensor *b, nt_tensor *s, nt_dtype out_dtype)
{
    nt_tensor *y = s ? fp8_product(site, fn, a, b) : NULL;
    if (y)
        y = nt_mul_at(site, y, s);
    if (y && out_dtype != NT_F32)
        y = nt__copy_to(site, fn, y, out_dtype);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(sc);
    return y ? nt__scope_adopt(y, fn) : NULL;
}

nt_tensor *nt__matmul_fp8_prod(const nt_site *site, nt_tensor *a, nt_tensor *b, nt_tensor *s,
                               nt_dtype out_dtype)
{
    const char *fn = "nt_matmul_fp8";
    nt_tensor *in[4] = {a, b, s, s};
    if (!nt__ensure_init() || !args_ok(site, fn, in, out_dtype))
        return NULL;
    if (s->dev != a->dev) {
        nt__device_mismatch(site, fn, "scale_a", s->dev, a->dev);
        return NULL;
    }
    nt_scope *sc = nt_scope_begin();
    if (!sc) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    return fp8_scaled(site, fn, sc, a, b, nt_reshape_at(site, s, 0, NULL), out_dtype);
}

NT_API nt_tensor *nt_matmul_fp8(nt_tensor *a, nt_tensor *b, nt_tensor *scale_a,
                                nt_tensor *scale_b, nt_dtype out_dtype)
{
    return nt_matmul_fp8_at(NT_RA_SITE, a, b, scale_a, scale_b, out_dtype);
}
