/* dispatcher/api_conv.c - convolutions of NCHW tensors (issue 33): conv2d,
 * conv1d and conv_transpose2d with PyTorch 1.13's arguments, and their
 * gradients.
 *
 * Every one is an instance of nt_matmul's arithmetic through the kernel op
 * conv_gemm (core/conv.h: per group, W[co, K] . col[K, (n, oh, ow)] with K =
 * (ki, kj, ci), padding taps and the holes of a dilated input as zero
 * products), and every weight gradient one conv_wgrad (a matmul contracting
 * over (n, oh, ow)).  docs/ops.md, "Convolution", is the contract:
 *   conv2d(x, w)            conv_gemm(x, w; stride s, offset p, dilation d)
 *   conv_transpose2d(x, w)  conv_gemm(x, flipT(w); stride 1, offset
 *                           d (k - 1) - p, dilation d, x dilated by s)
 * so conv2d's input gradient is conv_transpose2d's forward of g and the other
 * way round (one formulation for both); a bias is added once after, by
 * nt_add, as nt_linear does.  conv2d and conv_transpose2d are composites
 * autograd records as one node (kind VIEW, like nt_flip); their backward
 * (autograd/backward.c) calls nt__conv_grads here. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dispatcher/dispatch.h"

typedef struct cgeo {
    int64_t N, C, H, W, CO, kh, kw, OH, OW, G;
    int64_t s[2], p[2], d[2], op[2];
    bool batched;
} cgeo;

/* Issues conv_gemm on contiguous x [N, C, H, W] and w [CO, C/G, kh, kw]
 * (flip: w [C, CO/G, kh, kw], read as the adjoint's weight, core/conv.h). */
nt_tensor *nt__conv_gemm(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                         bool flip, const int64_t s[2], const int64_t lo[2], const int64_t d[2],
                         const int64_t u[2], int64_t G, int64_t OH, int64_t OW)
{
    nt__call c;
    nt_tensor *in[2] = {x ? nt_contiguous_at(site, x) : NULL, w ? nt_contiguous_at(site, w) : NULL};
    if (!in[0] || !in[1])
        return NULL;
    if (!nt__call_begin(&c, site, fn, NT_OP_CONV_GEMM, 2, in, "input,weight"))
        return nt__call_fail(&c);
    for (int i = 0; i < 2; i++)
        c.p.i[i] = s[i], c.p.i[2 + i] = lo[i], c.p.i[4 + i] = d[i], c.p.i[6 + i] = u[i];
    c.p.flag = (int32_t)G;
    c.p.dim = flip;
    nt_tensor *xx = c.in[0], *ww = c.in[1];
    c.odt[0] = (nt_dtype)xx->dtype;
    c.ondim[0] = 4;
    int64_t sh[4] = {xx->shape[0], flip ? ww->shape[1] * G : ww->shape[0], OH, OW};
    memcpy(c.oshape[0], sh, sizeof sh);
    c.flops = 2.0 * (double)(sh[0] * sh[1] * OH * OW) *
              (double)(xx->shape[1] / G * ww->shape[2] * ww->shape[3]);
    return nt__dispatch(&c);
}

/* Issues conv_wgrad: dw [CO, C/G, kh, kw] from x [N, C, H, W] and gy [N, CO,
 * OH, OW]. */
nt_tensor *nt__conv_wgrad(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *gy,
                          const int64_t s[2], const int64_t lo[2], const int64_t d[2], int64_t G,
                          int64_t kh, int64_t kw)
{
    nt__call c;
    if (x && gy && gy->dtype != x->dtype) /* one dtype for the product */
        gy = nt_cast_at(site, gy, (nt_dtype)x->dtype);
    nt_tensor *in[2] = {x ? nt_contiguous_at(site, x) : NULL,
                        gy ? nt_contiguous_at(site, gy) : NULL};
    if (!in[0] || !in[1])
        return NULL;
    if (!nt__call_begin(&c, site, fn, NT_OP_CONV_WGRAD, 2, in, "input,grad"))
        return nt__call_fail(&c);
    for (int i = 0; i < 2; i++)
        c.p.i[i] = s[i], c.p.i[2 + i] = lo[i], c.p.i[4 + i] = d[i], c.p.i[6 + i] = 1;
    c.p.flag = (int32_t)G;
    nt_tensor *xx = c.in[0], *gg = c.in[1];
    c.odt[0] = (nt_dtype)xx->dtype;
    c.ondim[0] = 4;
    int64_t sh[4] = {gg->shape[1], xx->shape[1] / G, kh, kw};
    memcpy(c.oshape[0], sh, sizeof sh);
    c.flops = 2.0 * (double)(sh[0] * sh[1] * kh * kw) *
              (double)(gg->shape[0] * gg->shape[2] * gg->shape[3]);
    return nt__dispatch(&c);
}

/* x as [N, C, H, W]. */
static nt_tensor *as4(const nt_site *site, nt_tensor *x)
{
    if (!x || x->ndim == 4)
        return x;
    return nt_reshape_at(site, x, 4, (int64_t[]){1, x->shape[0], x->shape[1], x->shape[2]});
}

/* y [N, CO, OH, OW] back to x's batchedness. */
static nt_tensor *unbatch(const nt_site *site, nt_tensor *y, bool batched)
{
    if (!y || batched)
        return y;
    return nt_reshape_at(site, y, 3, (int64_t[]){y->shape[1], y->shape[2], y->shape[3]});
}

/* conv2d's product: conv_gemm of x [N, C, H, W] (4-D) with w. */
static nt_tensor *fwd_conv(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                           const cgeo *g)
{
    return nt__conv_gemm(site, fn, x, w, false, g->s, g->p, g->d, (const int64_t[]){1, 1}, g->G,
                         g->OH, g->OW);
}

/* conv_transpose2d's product: conv_gemm of x dilated by s with w read as
 * the adjoint's weight (flipped, channel dims swapped per group). */
static nt_tensor *fwd_convt(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                            const int64_t s[2], const int64_t p[2], const int64_t d[2], int64_t G,
                            int64_t OH, int64_t OW)
{
    int64_t lo[2] = {d[0] * (w->shape[2] - 1) - p[0], d[1] * (w->shape[3] - 1) - p[1]};
    return nt__conv_gemm(site, fn, x, w, true, (const int64_t[]){1, 1}, lo, d, s, G, OH, OW);
}

/* The bias's gradient: g [N, CO, OH, OW] summed over (n, oh, ow), one sum
 * over the N OH OW positions per channel in the canonical order. */
static nt_tensor *bias_grad(const nt_site *site, nt_tensor *g4)
{
    int64_t CO = g4->shape[1], P = g4->shape[0] * g4->shape[2] * g4->shape[3];
    nt_tensor *t = nt_contiguous_at(site, nt_transpose_at(site, g4, 0, 1));
    t = t ? nt_reshape_at(site, t, 2, (int64_t[]){CO, P}) : NULL;
    return t ? nt_sum_at(site, t, 1, false) : NULL;
}

int nt__conv_grads(const nt_site *site, int op, const nt__params *p, nt_tensor *g, nt_tensor *x,
                   nt_tensor *w, const bool live[3], nt_tensor **gin)
{
    const char *fn = op == NT_OP_CONV2D ? "nt_conv2d" : "nt_conv_transpose2d";
    int64_t s[2] = {p->i[0], p->i[1]}, pd[2] = {p->i[2], p->i[3]}, d[2] = {p->i[4], p->i[5]};
    int64_t G = p->flag, kh = w->shape[2], kw = w->shape[3];
    bool batched = x->ndim == 4;
    nt_tensor *x4 = as4(site, x), *g4 = as4(site, g);
    if (!x4 || !g4)
        return nt_last_error();
    if (live[0]) {
        nt_tensor *dx = op == NT_OP_CONV2D
                            ? fwd_convt(site, fn, g4, w, s, pd, d, G, x4->shape[2], x4->shape[3])
                            : nt__conv_gemm(site, fn, g4, w, false, s, pd, d,
                                            (const int64_t[]){1, 1}, G, x4->shape[2], x4->shape[3]);
        if (!(gin[0] = unbatch(site, dx, batched)))
            return nt_last_error();
    }
    if (live[1]) {
        gin[1] = op == NT_OP_CONV2D ? nt__conv_wgrad(site, fn, x4, g4, s, pd, d, G, kh, kw)
                                    : nt__conv_wgrad(site, fn, g4, x4, s, pd, d, G, kh, kw);
        if (!gin[1])
            return nt_last_error();
    }
    if (live[2] && !(gin[2] = bias_grad(site, g4)))
        return nt_last_error();
    return 0;
}

/* ---------------- argument checks ---------------- */

static bool bad(const nt_site *site, const char *fn, int code, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);
static bool bad(const nt_site *site, const char *fn, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nt__err(site, code, fn, "%s", msg);
    return false;
}

/* A pair argument v (NULL: dflt), each value >= lo. */
static bool pair(const nt_site *site, const char *fn, const char *name, const int64_t *v,
                 int64_t dflt, int64_t lo, int64_t out[2])
{
    for (int i = 0; i < 2; i++)
        out[i] = v ? v[i] : dflt;
    if (out[0] < lo || out[1] < lo)
        return bad(site, fn, NT_EINVAL, "argument '%s' is [%lld, %lld]; expected values >= %lld",
                   name, (long long)out[0], (long long)out[1], (long long)lo);
    return true;
}

/* x [N, C, H, W] or [C, H, W] floating; w 4-D of x's dtype; b NULL or [n_b]
 * of x's dtype; groups >= 1 dividing C (and wdim0 of w: conv's CO). */
static bool check_tensors(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                          nt_tensor *b, int64_t G, bool transposed, cgeo *g)
{
    char sx[128], sw[128];
    nt_dtype dt = (nt_dtype)x->dtype;
    if (!nt__dtype_is_float(dt))
        return bad(site, fn, NT_EDTYPE, "argument 'input' has dtype %s; expected f32, bf16 or f16",
                   nt_dtype_name(dt));
    if (w->dtype != x->dtype || (b && b->dtype != x->dtype))
        return bad(site, fn, NT_EDTYPE,
                   "argument '%s' has dtype %s; expected input's dtype %s (cast it, or use autocast)",
                   w->dtype != x->dtype ? "weight" : "bias",
                   nt_dtype_name((nt_dtype)(w->dtype != x->dtype ? w->dtype : b->dtype)),
                   nt_dtype_name(dt));
    nt__shape_str(x->ndim, x->shape, sx, sizeof sx);
    nt__shape_str(w->ndim, w->shape, sw, sizeof sw);
    if (x->ndim != 3 && x->ndim != 4)
        return bad(site, fn, NT_ESHAPE,
                   "argument 'input' has shape %s; expected 3 dims [C, H, W] or 4 [N, C, H, W]", sx);
    if (w->ndim != 4)
        return bad(site, fn, NT_ESHAPE, "argument 'weight' has shape %s; expected 4 dims %s", sw,
                   transposed ? "[C_in, C_out / groups, kH, kW]" : "[C_out, C_in / groups, kH, kW]");
    int o = x->ndim - 3;
    g->batched = x->ndim == 4;
    g->N = g->batched ? x->shape[0] : 1;
    g->C = x->shape[o], g->H = x->shape[o + 1], g->W = x->shape[o + 2];
    g->kh = w->shape[2], g->kw = w->shape[3], g->G = G;
    if (g->C < 1 || g->H < 1 || g->W < 1)
        return bad(site, fn, NT_ESHAPE,
                   "argument 'input' has shape %s; expected C, H and W of at least 1", sx);
    if (w->shape[0] < 1 || w->shape[1] < 1 || g->kh < 1 || g->kw < 1)
        return bad(site, fn, NT_ESHAPE, "argument 'weight' has shape %s; expected no dim of 0", sw);
    if (G < 1)
        return bad(site, fn, NT_EINVAL, "argument 'groups' is %lld; expected at least 1",
                   (long long)G);
    if (g->C % G)
        return bad(site, fn, NT_ESHAPE,
                   "argument 'input' has %lld channels (shape %s); expected a multiple of "
                   "argument 'groups' = %lld", (long long)g->C, sx, (long long)G);
    if (!transposed) {
        g->CO = w->shape[0];
        if (g->CO % G)
            return bad(site, fn, NT_ESHAPE,
                       "argument 'weight' has shape %s; expected its dim 0 (C_out) a multiple of "
                       "argument 'groups' = %lld", sw, (long long)G);
        if (w->shape[1] != g->C / G)
            return bad(site, fn, NT_ESHAPE,
                       "argument 'weight' has shape %s; expected dim 1 = C_in / groups = %lld "
                       "(input %s, groups %lld)", sw, (long long)(g->C / G), sx, (long long)G);
    } else {
        g->CO = w->shape[1] * G;
        if (w->shape[0] != g->C)
            return bad(site, fn, NT_ESHAPE,
                       "argument 'weight' has shape %s; expected dim 0 = C_in = %lld (input %s)",
                       sw, (long long)g->C, sx);
    }
    if (b && (b->ndim != 1 || b->shape[0] != g->CO)) {
        char sb[128];
        return bad(site, fn, NT_ESHAPE, "argument 'bias' has shape %s; expected [%lld] (C_out)",
                   nt__shape_str(b->ndim, b->shape, sb, sizeof sb), (long long)g->CO);
    }
    return true;
}

/* conv2d's stride, padding, dilation and output size. */
static bool check_conv(const nt_site *site, const char *fn, const int64_t *stride,
                       const int64_t *padding, const int64_t *dilation, cgeo *g)
{
    if (!pair(site, fn, "stride", stride, 1, 1, g->s) ||
        !pair(site, fn, "padding", padding, 0, 0, g->p) ||
        !pair(site, fn, "dilation", dilation, 1, 1, g->d))
        return false;
    int64_t in[2] = {g->H, g->W}, k[2] = {g->kh, g->kw}, out[2];
    for (int i = 0; i < 2; i++) {
        int64_t ext = g->d[i] * (k[i] - 1) + 1, padded = in[i] + 2 * g->p[i];
        if (ext > padded)
            return bad(site, fn, NT_ESHAPE,
                       "argument 'weight' has a kernel of %lld x %lld (dilated: %lld along %s), "
                       "larger than argument 'input' padded: %lld x %lld; expected at most the "
                       "padded input", (long long)g->kh, (long long)g->kw, (long long)ext,
                       i ? "W" : "H", (long long)(g->H + 2 * g->p[0]),
                       (long long)(g->W + 2 * g->p[1]));
        out[i] = (padded - ext) / g->s[i] + 1;
    }
    g->OH = out[0], g->OW = out[1];
    return true;
}

/* conv_transpose2d's arguments and output size (PyTorch's rules). */
static bool check_convt(const nt_site *site, const char *fn, const int64_t *stride,
                        const int64_t *padding, const int64_t *output_padding,
                        const int64_t *dilation, cgeo *g)
{
    if (!pair(site, fn, "stride", stride, 1, 1, g->s) ||
        !pair(site, fn, "padding", padding, 0, 0, g->p) ||
        !pair(site, fn, "output_padding", output_padding, 0, 0, g->op) ||
        !pair(site, fn, "dilation", dilation, 1, 1, g->d))
        return false;
    for (int i = 0; i < 2; i++)
        if (g->op[i] >= g->s[i] && g->op[i] >= g->d[i])
            return bad(site, fn, NT_EINVAL,
                       "argument 'output_padding' is [%lld, %lld]; expected each smaller than "
                       "stride [%lld, %lld] or dilation [%lld, %lld]", (long long)g->op[0],
                       (long long)g->op[1], (long long)g->s[0], (long long)g->s[1],
                       (long long)g->d[0], (long long)g->d[1]);
    int64_t in[2] = {g->H, g->W}, k[2] = {g->kh, g->kw}, out[2];
    for (int i = 0; i < 2; i++)
        out[i] = (in[i] - 1) * g->s[i] - 2 * g->p[i] + g->d[i] * (k[i] - 1) + g->op[i] + 1;
    if (out[0] < 1 || out[1] < 1)
        return bad(site, fn, NT_ESHAPE,
                   "argument 'input' of size %lld x %lld gives an output of %lld x %lld (stride, "
                   "padding, dilation, output_padding); expected at least 1 x 1",
                   (long long)g->H, (long long)g->W, (long long)out[0], (long long)out[1]);
    g->OH = out[0], g->OW = out[1];
    return true;
}

/* ---------------- the public ops ---------------- */

/* Runs the product (and bias) inside a scope without a graph, then records
 * the one node (nt__dispatch_view), as nt_flip does. */
static nt_tensor *finish(nt__call *c, const cgeo *g, bool transposed)
{
    nt_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    for (int i = 0; i < 2; i++)
        c->p.i[i] = g->s[i], c->p.i[2 + i] = g->p[i], c->p.i[4 + i] = g->d[i],
        c->p.i[6 + i] = g->op[i];
    c->p.flag = (int32_t)g->G;
    c->odt[0] = (nt_dtype)x->dtype;
    c->ondim[0] = x->ndim;
    int o = 0;
    if (g->batched)
        c->oshape[0][o++] = g->N;
    c->oshape[0][o++] = g->CO, c->oshape[0][o++] = g->OH, c->oshape[0][o++] = g->OW;
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(c->site, c->fn, "a scope");
        return nt__call_fail(c);
    }
    nt_no_grad_begin();
    nt_tensor *x4 = as4(c->site, x), *y;
    y = transposed ? fwd_convt(c->site, c->fn, x4, w, g->s, g->p, g->d, g->G, g->OH, g->OW)
                   : fwd_conv(c->site, c->fn, x4, w, g);
    if (y && b)
        y = nt_add_at(c->site, y, nt_reshape_at(c->site, b, 3, (int64_t[]){g->CO, 1, 1}));
    y = unbatch(c->site, y, g->batched);
    nt_no_grad_end();
    if (y)
        nt_keep(y);
    else
        nt__err_within(c->fn);
    nt_scope_end(s);
    return y ? nt__dispatch_view(c, y) : nt__call_fail(c);
}

NT_API nt_tensor *nt_conv2d_at(const nt_site *site, nt_tensor *x, nt_tensor *w, nt_tensor *b,
                               const int64_t *stride, const int64_t *padding,
                               const int64_t *dilation, int64_t groups)
{
    const char *fn = "nt_conv2d";
    nt__call c;
    nt_tensor *in[3] = {x, w, b};
    if (!nt__call_begin(&c, site, fn, NT_OP_CONV2D, 3, in, "input,weight,?bias"))
        return nt__call_fail(&c);
    cgeo g = {0};
    if (!check_tensors(site, fn, c.in[0], c.in[1], c.in[2], groups, false, &g) ||
        !check_conv(site, fn, stride, padding, dilation, &g))
        return nt__call_fail(&c);
    return finish(&c, &g, false);
}
NT_API nt_tensor *nt_conv2d(nt_tensor *x, nt_tensor *w, nt_tensor *b, const int64_t *stride,
                            const int64_t *padding, const int64_t *dilation, int64_t groups)
{
    return nt_conv2d_at(NT_RA_SITE, x, w, b, stride, padding, dilation, groups);
}

NT_API nt_tensor *nt_conv_transpose2d_at(const nt_site *site, nt_tensor *x, nt_tensor *w,
                                         nt_tensor *b, const int64_t *stride,
                                         const int64_t *padding, const int64_t *output_padding,
                                         int64_t groups, const int64_t *dilation)
{
    const char *fn = "nt_conv_transpose2d";
    nt__call c;
    nt_tensor *in[3] = {x, w, b};
    if (!nt__call_begin(&c, site, fn, NT_OP_CONV_TRANSPOSE2D, 3, in, "input,weight,?bias"))
        return nt__call_fail(&c);
    cgeo g = {0};
    if (!check_tensors(site, fn, c.in[0], c.in[1], c.in[2], groups, true, &g) ||
        !check_convt(site, fn, stride, padding, output_padding, dilation, &g))
        return nt__call_fail(&c);
    return finish(&c, &g, true);
}
NT_API nt_tensor *nt_conv_transpose2d(nt_tensor *x, nt_tensor *w, nt_tensor *b,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *output_padding, int64_t groups,
                                      const int64_t *dilation)
{
    return nt_conv_transpose2d_at(NT_RA_SITE, x, w, b, stride, padding, output_padding, groups,
                                  dilation);
}

/* conv1d: conv2d of x [N, C, 1, L] with w [CO, C/G, 1, k] (views: the same
 * bits), the output back to [N, CO, OL]. */
NT_API nt_tensor *nt_conv1d_at(const nt_site *site, nt_tensor *x, nt_tensor *w, nt_tensor *b,
                               int64_t stride, int64_t padding, int64_t dilation, int64_t groups)
{
    const char *fn = "nt_conv1d";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "input", x) ||
        !nt__check_arg(site, fn, "weight", w) || (b && !nt__check_arg(site, fn, "bias", b)))
        return NULL;
    char sb[128];
    if (x->ndim != 2 && x->ndim != 3) {
        nt__err(site, NT_ESHAPE, fn,
                "argument 'input' has shape %s; expected 2 dims [C, L] or 3 [N, C, L]",
                nt__shape_str(x->ndim, x->shape, sb, sizeof sb));
        return NULL;
    }
    if (w->ndim != 3) {
        nt__err(site, NT_ESHAPE, fn,
                "argument 'weight' has shape %s; expected 3 dims [C_out, C_in / groups, k]",
                nt__shape_str(w->ndim, w->shape, sb, sizeof sb));
        return NULL;
    }
    if (stride < 1 || dilation < 1 || padding < 0) {
        const char *a = stride < 1 ? "stride" : dilation < 1 ? "dilation" : "padding";
        nt__err(site, NT_EINVAL, fn, "argument '%s' is %lld; expected %s", a,
                (long long)(stride < 1 ? stride : dilation < 1 ? dilation : padding),
                padding < 0 && stride >= 1 && dilation >= 1 ? "at least 0" : "at least 1");
        return NULL;
    }
    int64_t xs[4], k = 0;
    for (int i = 0; i < x->ndim - 1; i++)
        xs[k++] = x->shape[i];
    xs[k++] = 1, xs[k++] = x->shape[x->ndim - 1];
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_tensor *x2 = nt_reshape_at(site, x, (int)k, xs);
    nt_tensor *w2 = nt_reshape_at(site, w, 4, (int64_t[]){w->shape[0], w->shape[1], 1, w->shape[2]});
    nt_tensor *y = x2 && w2 ? nt_conv2d_at(site, x2, w2, b, (const int64_t[]){1, stride},
                                           (const int64_t[]){0, padding},
                                           (const int64_t[]){1, dilation}, groups)
                            : NULL;
    if (y) {
        int64_t ys[3], m = 0;
        for (int i = 0; i < y->ndim; i++)
            if (i != y->ndim - 2)
                ys[m++] = y->shape[i];
        y = nt_reshape_at(site, y, (int)m, ys);
    }
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    return y ? nt__scope_adopt(y, fn) : NULL;
}
NT_API nt_tensor *nt_conv1d(nt_tensor *x, nt_tensor *w, nt_tensor *b, int64_t stride,
                            int64_t padding, int64_t dilation, int64_t groups)
{
    return nt_conv1d_at(NT_RA_SITE, x, w, b, stride, padding, dilation, groups);
}
