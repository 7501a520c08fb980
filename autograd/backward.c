/* autograd/backward.c - the backward table: one function per differentiable
 * op, with the inputs/outputs it needs saved.  Each computes its inputs'
 * gradients from the output's gradient g with ordinary ops (queued, fused
 * and run on the backend like any other), issued at the forward's call site.
 * Gradients are borrowed: nt_backward runs inside a scope that owns every
 * tensor made during the pass.
 * tests/test_autograd.c checks every entry with finite differences. */
#include "autograd/autograd.h"
#include "core/rope.h"

#include <math.h>
#include <string.h>

bool nt__edge_live(const nt__node *n, int i) { return i < n->nin && n->next[i].node != NULL; }
/* Saved tensors.  In a create_graph pass each comes with its place in the
 * graph (PyTorch's unpacked SavedVariable): an input with its edge, an
 * output as output i of the node itself, so the gradient the backward
 * computes from them is a function of them that a later backward can
 * follow.  Otherwise the plain saved handle. */
nt_tensor *nt__saved_in(nt__bctx *b, int i)
{
    nt_tensor *t = b->n->saved_in[i];
    if (!b->create || !t || i >= b->n->nin || !b->n->next[i].node)
        return t;
    if (!b->uin[i])
        b->uin[i] = nt__unpack(t, b->n->next[i]);
    return b->uin[i];
}
nt_tensor *nt__saved_out(nt__bctx *b, int i)
{
    nt_tensor *t = b->n->saved_out[i];
    if (!b->create || !t)
        return t;
    if (!b->uout[i])
        b->uout[i] = nt__unpack(t, (nt__edge){b->n, i});
    return b->uout[i];
}

#define S (b->site)
#define G (b->gout[0])
#define LIVE(i) nt__edge_live(b->n, (i))
#define IN(i) nt__saved_in(b, (i))
#define OUT(i) nt__saved_out(b, (i))
#define META(i) (&b->n->in_meta[(i)])
/* every op returns NULL on failure with the error set */
#define TRY(x)                                                                              \
    do {                                                                                    \
        if (!(x))                                                                           \
            return nt__err_or(NT_EEXEC);                            \
    } while (0)

/* Sums g over the dims that broadcasting added or stretched, so it has the
 * shape of the input it belongs to.  The leading run of such dims (the added
 * ones, then stretched ones right after them: a bias's [B, T, C] -> [C]) is
 * one dim of g reshaped to [prod, rest...] and summed once, in the canonical
 * order over all prod positions (PyTorch's sum over several dims; one kernel
 * over B*T rows, not one per dim).  A stretched dim after a kept one is
 * summed alone, keepdim (docs/ops.md, section 7b). */
static nt_tensor *reduce_to(nt__bctx *b, nt_tensor *g, const nt__tmeta *m)
{
    nt_tensor *t = g;
    if (!t)
        return NULL;
    int lead = t->ndim - m->ndim, pre = 0;
    bool sum = lead > 0; /* added dims are summed even when of size 1, as before */
    while (pre < t->ndim && (pre < lead || m->shape[pre - lead] == 1)) {
        if (pre >= lead && t->shape[pre] != 1)
            sum = true;
        pre++;
    }
    if (sum) {
        int64_t sh[NT_MAX_DIMS], P = 1;
        int k = 1;
        for (int d = 0; d < pre; d++)
            P *= g->shape[d];
        sh[0] = P;
        for (int d = pre; d < g->ndim; d++)
            sh[k++] = g->shape[d];
        t = nt_sum_at(S, nt_reshape_at(S, g, k, sh), 0, false);
        /* the stretched dims of the run come back as 1s (keepdim) */
        if (t && pre > lead) {
            k = 0;
            for (int d = lead; d < pre; d++)
                sh[k++] = 1;
            for (int d = pre; d < g->ndim; d++)
                sh[k++] = g->shape[d];
            t = nt_reshape_at(S, t, k, sh);
        }
    } else {
        pre = lead;
    }
    for (int d = pre - lead; t && d < m->ndim; d++)
        if (m->shape[d] == 1 && t->shape[d] != 1)
            t = nt_sum_at(S, t, d, true);
    return t;
}

static nt_tensor *zero0d(nt__bctx *b, nt_tensor *like)
{
    return nt_zeros_at(S, (nt_dtype)like->dtype, 0, NULL);
}

/* g of a reduction, reshaped to keepdim form and expanded to the input. */
static nt_tensor *expand_back(nt__bctx *b, nt_tensor *g)
{
    const nt__tmeta *m = META(0);
    int64_t ks[NT_MAX_DIMS];
    int dim = b->n->p.dim;
    for (int i = 0; i < m->ndim; i++)
        ks[i] = (dim == NT_DIM_ALL || i == dim) ? 1 : m->shape[i];
    nt_tensor *r = nt_reshape_at(S, g, m->ndim, ks);
    return r ? nt_expand_at(S, r, m->ndim, m->shape) : NULL;
}

/* ---------------- binary ---------------- */

static int bwd_add(nt__bctx *b)
{
    if (LIVE(0))
        TRY(b->gin[0] = reduce_to(b, G, META(0)));
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(b, G, META(1)));
    return 0;
}

static int bwd_sub(nt__bctx *b)
{
    if (LIVE(0))
        TRY(b->gin[0] = reduce_to(b, G, META(0)));
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(b, nt_neg_at(S, G), META(1)));
    return 0;
}

static int bwd_mul(nt__bctx *b)
{
    if (LIVE(0))
        TRY(b->gin[0] = reduce_to(b, nt_mul_at(S, G, IN(1)), META(0)));
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(b, nt_mul_at(S, G, IN(0)), META(1)));
    return 0;
}

static int bwd_div(nt__bctx *b)
{
    nt_tensor *t;
    TRY(t = nt_div_at(S, G, IN(1))); /* g / b */
    if (LIVE(0))
        TRY(b->gin[0] = reduce_to(b, t, META(0)));
    if (LIVE(1)) /* -g a / b^2 = -(g / b) (a / b) */
        TRY(b->gin[1] = reduce_to(b, nt_neg_at(S, nt_mul_at(S, t, nt_div_at(S, IN(0), IN(1)))),
                                  META(1)));
    return 0;
}

/* maximum/minimum: the first operand wins ties (core/ewise.h), so it gets the
 * gradient there. */
static int minmax(nt__bctx *b, bool is_max)
{
    nt_tensor *mask, *z;
    TRY(mask = is_max ? nt_ge_at(S, IN(0), IN(1)) : nt_le_at(S, IN(0), IN(1)));
    TRY(z = zero0d(b, G));
    if (LIVE(0))
        TRY(b->gin[0] = reduce_to(b, nt_where_at(S, mask, G, z), META(0)));
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(b, nt_where_at(S, mask, z, G), META(1)));
    return 0;
}
static int bwd_maximum(nt__bctx *b) { return minmax(b, true); }
static int bwd_minimum(nt__bctx *b) { return minmax(b, false); }

static int bwd_where(nt__bctx *b)
{
    nt_tensor *z;
    TRY(z = zero0d(b, G));
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(b, nt_where_at(S, IN(0), G, z), META(1)));
    if (LIVE(2))
        TRY(b->gin[2] = reduce_to(b, nt_where_at(S, IN(0), z, G), META(2)));
    return 0;
}

/* ---------------- unary ---------------- */

static int bwd_neg(nt__bctx *b)
{
    TRY(b->gin[0] = nt_neg_at(S, G));
    return 0;
}
static int bwd_exp(nt__bctx *b)
{
    TRY(b->gin[0] = nt_mul_at(S, G, OUT(0)));
    return 0;
}
static int bwd_log(nt__bctx *b)
{
    TRY(b->gin[0] = nt_div_at(S, G, IN(0)));
    return 0;
}
static int bwd_sqrt(nt__bctx *b) /* g / (2 y) */
{
    TRY(b->gin[0] = nt_div_at(S, G, nt_mul_scalar_at(S, OUT(0), 2.0)));
    return 0;
}
static int bwd_rsqrt(nt__bctx *b) /* -0.5 g y^3 */
{
    nt_tensor *y = OUT(0);
    TRY(b->gin[0] = nt_mul_at(S, G, nt_mul_scalar_at(S, nt_mul_at(S, y, nt_mul_at(S, y, y)), -0.5)));
    return 0;
}
static int bwd_abs(nt__bctx *b) /* g sign(x), 0 at 0 */
{
    nt_tensor *x = IN(0), *z, *pos, *neg;
    TRY(z = zero0d(b, x));
    TRY(pos = nt_cast_at(S, nt_gt_at(S, x, z), (nt_dtype)G->dtype));
    TRY(neg = nt_cast_at(S, nt_lt_at(S, x, z), (nt_dtype)G->dtype));
    TRY(b->gin[0] = nt_mul_at(S, G, nt_sub_at(S, pos, neg)));
    return 0;
}

/* bwd column `helper(H)`: H(g, v), the op's own backward helper (relu,
 * gelu, silu, sigmoid, tanh: their bits predate `dx`), v the saved input or
 * output as the op's save column says. */
static int bwd_by_helper(nt__bctx *b)
{
    const nt__bwd_entry *e = &nt__bwd_table[b->n->op];
    TRY(b->gin[0] = nt__binary(S, nt__op_api(e->helper), e->helper, G,
                               e->save_out ? OUT(0) : IN(0)));
    return 0;
}
/* UNARY_BWD(g, v) for forward op `op` with its scalars p->f: no_grad in a
 * plain pass, recorded in a create_graph pass (its own backward is
 * bwd_unary_bwd), the same kernel either way. */
static nt_tensor *unary_bwd(nt__bctx *b, int op, const nt__params *p, nt_tensor *g, nt_tensor *v)
{
    nt__call c;
    nt_tensor *in[2] = {g, v};
    if (!nt__call_begin(&c, S, nt__op_api(op), NT_OP_UNARY_BWD, 2, in, "g,v"))
        return NULL;
    c.no_grad = !b->create;
    c.p.i[0] = op;
    c.p.f[0] = p->f[0]; /* a tensor-scalar op's scalars */
    c.p.f[1] = p->f[1];
    c.odt[0] = nt__promote((nt_dtype)g->dtype, (nt_dtype)v->dtype);
    c.ondim[0] = g->ndim;
    for (int i = 0; i < g->ndim; i++)
        c.oshape[0][i] = g->shape[i];
    c.flops = (double)nt__numel(g->ndim, g->shape);
    return nt__dispatch(&c);
}
/* The generic backward of an elementwise unary or tensor-scalar op (bwd
 * column `dx`): g * nt__ew_<f>_dx(v[, s0, s1]), one UNARY_BWD helper for
 * every such op, with v the saved input or output as the op's save column
 * says. */
static int bwd_dx(nt__bctx *b)
{
    int op = b->n->op;
    nt_tensor *v = nt__bwd_table[op].save_out ? OUT(0) : IN(0);
    TRY(b->gin[0] = unary_bwd(b, op, &b->n->p, G, v));
    return 0;
}
/* The generic backward of a binary op (bwd column `dxy`): g times its
 * partial d/da or d/db (BINARY_DX, through the table on every backend),
 * summed back over broadcast dims. */
static nt_tensor *binary_dx(nt__bctx *b, int which)
{
    nt__call c;
    nt_tensor *in[2] = {IN(0), IN(1)};
    if (!nt__call_begin(&c, S, nt__op_api(b->n->op), NT_OP_BINARY_DX, 2, in, "a,b"))
        return NULL;
    c.no_grad = true;
    c.p.i[0] = b->n->op;
    c.p.i[1] = which;
    int nd;
    if (!nt__broadcast(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &nd, c.oshape[0]))
        return NULL; /* the forward broadcast them: cannot happen */
    c.ondim[0] = nd;
    c.odt[0] = nt__promote((nt_dtype)in[0]->dtype, (nt_dtype)in[1]->dtype);
    c.flops = (double)nt__numel(nd, c.oshape[0]);
    return nt__dispatch(&c);
}
/* The same partial in a create_graph pass, from recorded ops, so it
 * differentiates again (pow's masks by where, as PyTorch's
 * pow_backward_self / _exponent; fmod's trunc has a zero gradient): each op
 * is the function the BINARY_DX kernel calls, in the same order, in f32
 * rounded once to the result's dtype as the kernel does, so the first
 * gradients keep their bits (tests/test_gradgrad.c). */
static nt_tensor *binary_dx_graph(nt__bctx *b, int which)
{
    nt_tensor *a = IN(0), *c = IN(1), *z;
    nt_dtype odt = nt__promote((nt_dtype)a->dtype, (nt_dtype)c->dtype);
    /* (a floating dtype wider than f32 computes in itself) */
    nt_dtype wdt = nt__dtype_size(odt) > 4 ? odt : NT_F32;
    if (!(a = nt_cast_at(S, a, wdt)) || !(c = nt_cast_at(S, c, wdt)) ||
        !(z = nt_zeros_at(S, wdt, 0, NULL)))
        return NULL;
    nt_tensor *d = NULL;
    switch (b->n->op) {
    case NT_OP_POW:
        if (which == 0) /* b == 0 ? 0 : b a^(b-1) */
            d = nt_where_at(S, nt_eq_at(S, c, z), z,
                            nt_mul_at(S, c, nt_pow_at(S, a, nt_add_scalar_at(S, c, -1.0))));
        else { /* a == 0 && b >= 0 ? 0 : a^b log(a) */
            nt_tensor *v = nt_mul_at(S, nt_pow_at(S, a, c), nt_log_at(S, a));
            d = nt_where_at(S, nt_eq_at(S, a, z), nt_where_at(S, nt_ge_at(S, c, z), z, v), v);
        }
        break;
    case NT_OP_ATAN2: { /* (+-operand) (1 / (a^2 + b^2)) */
        nt_tensor *r = nt_reciprocal_at(S, nt_add_at(S, nt_mul_at(S, a, a), nt_mul_at(S, c, c)));
        d = which == 0 ? nt_mul_at(S, c, r) : nt_mul_at(S, nt_neg_at(S, a), r);
        break;
    }
    case NT_OP_FMOD: /* 1, -trunc(a / b) */
        if (which == 0) {
            int nd;
            int64_t sh[NT_MAX_DIMS];
            if (!nt__broadcast(a->ndim, a->shape, c->ndim, c->shape, &nd, sh))
                return NULL;
            d = nt_ones_at(S, wdt, nd, sh);
        } else
            d = nt_neg_at(S, nt_trunc_at(S, nt_div_at(S, a, c)));
        break;
    default:
        nt__dbl_refuse(S, "its partial derivatives have no derivatives of their own yet");
        return NULL;
    }
    return d ? nt_cast_at(S, d, odt) : NULL;
}
static int bwd_dxy(nt__bctx *b)
{
    for (int i = 0; i < 2; i++)
        if (LIVE(i))
            TRY(b->gin[i] = reduce_to(
                    b, nt_mul_at(S, G, b->create ? binary_dx_graph(b, i) : binary_dx(b, i)),
                    META(i)));
    return 0;
}

/* ---------------- tensor-scalar ---------------- */

static int bwd_add_scalar(nt__bctx *b)
{
    b->gin[0] = G;
    return 0;
}
static int bwd_mul_scalar(nt__bctx *b)
{
    TRY(b->gin[0] = nt_mul_scalar_at(S, G, b->n->p.f[0]));
    return 0;
}
static int bwd_div_scalar(nt__bctx *b)
{
    TRY(b->gin[0] = nt_div_scalar_at(S, G, b->n->p.f[0]));
    return 0;
}
static int bwd_pow_scalar(nt__bctx *b) /* g s x^(s-1) */
{
    double s = b->n->p.f[0];
    if (s == 0) {
        TRY(b->gin[0] = nt_zeros_like_at(S, G));
        return 0;
    }
    TRY(b->gin[0] = nt_mul_at(S, G, nt_mul_scalar_at(S, nt_pow_scalar_at(S, IN(0), s - 1), s)));
    return 0;
}
static int bwd_clamp(nt__bctx *b) /* g where lo <= x <= hi */
{
    nt_tensor *x = IN(0), *lo, *hi, *z, *m;
    TRY(lo = nt_full_at(S, (nt_dtype)x->dtype, 0, NULL, b->n->p.f[0]));
    TRY(hi = nt_full_at(S, (nt_dtype)x->dtype, 0, NULL, b->n->p.f[1]));
    TRY(z = zero0d(b, G));
    TRY(m = nt_mul_at(S, nt_ge_at(S, x, lo), nt_le_at(S, x, hi)));
    TRY(b->gin[0] = nt_where_at(S, m, G, z));
    return 0;
}

/* ---------------- copies and views ---------------- */

static int bwd_identity(nt__bctx *b) /* copy, cast (the engine casts back), alias */
{
    if (META(0)->dev != G->dev) { /* nt_to_device: the gradient goes back */
        TRY(b->gin[0] = nt_to_device_at(S, G, META(0)->dev));
        return 0;
    }
    b->gin[0] = G;
    return 0;
}

/* sign, floor, ceil, round, trunc: PyTorch's zero gradient (zeros, not
 * g * 0, which would be NaN where g is not finite) */
static int bwd_zero(nt__bctx *b)
{
    TRY(b->gin[0] = nt_zeros_like_at(S, G));
    return 0;
}

static int bwd_none(nt__bctx *b) /* fill: the result depends on no input */
{
    (void)b;
    return 0;
}
static int bwd_flip(nt__bctx *b) /* g flipped back over the same dims (p.i[0], a mask) */
{
    int dims[NT_MAX_DIMS], n = 0;
    for (int d = 0; d < G->ndim; d++)
        if (b->n->p.i[0] >> d & 1)
            dims[n++] = d;
    TRY(b->gin[0] = nt_flip_at(S, G, n, dims));
    return 0;
}
/* conv2d, conv_transpose2d: dispatcher/api_conv.c (docs/ops.md, "Convolution") */
static int bwd_conv2d(nt__bctx *b)
{
    const bool live[3] = {LIVE(0), LIVE(1), LIVE(2)};
    return nt__conv_grads(S, b->n->op, &b->n->p, G, IN(0), IN(1), live, b->gin);
}
#define bwd_conv_transpose2d bwd_conv2d

/* grouped_mm (dispatcher/api_moe.c): y = x w[e] per run (p.dim 1: x
 * w[e]^T).  x's gradient is g times w[e]^T (w[e]) per run, w's the runs'
 * x_e^T g_e (g_e^T x_e), each a kernel op that records in a create_graph
 * pass. */
static int bwd_grouped_mm(nt__bctx *b)
{
    bool tr = b->n->p.dim == 1, ng = !b->create;
    if (!G)
        return 0;
    if (LIVE(0))
        TRY(b->gin[0] = nt__grouped_mm(S, "nt_grouped_mm", G, IN(1), IN(2), !tr, ng));
    if (LIVE(1))
        TRY(b->gin[1] = tr ? nt__grouped_mm_wgrad(S, "nt_grouped_mm", G, IN(0), IN(2), ng)
                           : nt__grouped_mm_wgrad(S, "nt_grouped_mm", IN(0), G, IN(2), ng));
    return 0;
}
/* grouped_mm_wgrad: dw[e] = a_e^T b_e; a's gradient b_e g[e]^T, b's a_e
 * g[e], per run. */
static int bwd_grouped_mm_wgrad(nt__bctx *b)
{
    bool ng = !b->create;
    if (!G)
        return 0;
    if (LIVE(0))
        TRY(b->gin[0] = nt__grouped_mm(S, "nt_grouped_mm", IN(1), G, IN(2), true, ng));
    if (LIVE(1))
        TRY(b->gin[1] = nt__grouped_mm(S, "nt_grouped_mm", IN(0), G, IN(2), false, ng));
    return 0;
}

/* t [N, C, *] as the rows [C, N * S] (a copy), and back. */
static nt_tensor *bn_rows(nt__bctx *b, nt_tensor *t)
{
    int perm[NT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        perm[i] = i;
    perm[0] = 1, perm[1] = 0;
    int64_t C = t->shape[1], M = nt__numel(t->ndim, t->shape) / (C ? C : 1);
    nt_tensor *p = nt_contiguous_at(S, nt_permute_at(S, t, perm));
    return p ? nt_reshape_at(S, p, 2, (int64_t[]){C, M}) : NULL;
}
static nt_tensor *bn_unrows(nt__bctx *b, nt_tensor *r, const nt__tmeta *m)
{
    int64_t sh[NT_MAX_DIMS];
    int perm[NT_MAX_DIMS];
    for (int i = 0; i < m->ndim; i++)
        sh[i] = m->shape[i], perm[i] = i;
    sh[0] = m->shape[1], sh[1] = m->shape[0];
    perm[0] = 1, perm[1] = 0;
    return nt_contiguous_at(S, nt_permute_at(S, nt_reshape_at(S, r, m->ndim, sh), perm));
}

/* batch_norm_fwd (dispatcher/api_norm.c): one batch_norm_bwd kernel.  A
 * create_graph pass takes the same steps (docs/ops.md) from ops that
 * record, on the rows [C, M] so every sum is the kernel's. */
static int bwd_bn_fwd(nt__bctx *b)
{
    const bool live[3] = {LIVE(0), LIVE(1), LIVE(2)};
    double eps = b->n->p.f[0];
    if (!G)
        return 0;
    if (!b->create)
        return nt__bn_grads(S, eps, G, IN(0), IN(1), OUT(1), live, b->gin);
    nt_tensor *x, *g, *w = IN(1), *mu, *d, *r, *xh, *gx, *m1, *m2, *t;
    int64_t C = META(0)->shape[1];
    TRY(x = bn_rows(b, IN(0)));
    TRY(g = bn_rows(b, G));
    TRY(mu = nt_mean_at(S, x, -1, true));
    TRY(d = nt_sub_at(S, x, mu));
    TRY(r = nt_rsqrt_at(S, nt_add_scalar_at(S, nt_mean_at(S, nt_mul_at(S, d, d), -1, true), eps)));
    TRY(xh = nt_mul_at(S, d, r));
    if (LIVE(2))
        TRY(b->gin[2] = nt_reshape_at(S, nt_sum_at(S, g, 1, false), 1, (int64_t[]){C}));
    if (LIVE(1))
        TRY(b->gin[1] = nt_sum_at(S, nt_mul_at(S, g, xh), 1, false));
    if (LIVE(0)) {
        TRY(gx = w ? nt_mul_at(S, g, nt_reshape_at(S, w, 2, (int64_t[]){C, 1})) : g);
        TRY(m1 = nt_mean_at(S, gx, -1, true));
        TRY(m2 = nt_mean_at(S, nt_mul_at(S, gx, xh), -1, true));
        TRY(t = nt_mul_at(S, r, nt_sub_at(S, nt_sub_at(S, gx, m1), nt_mul_at(S, xh, m2))));
        TRY(b->gin[0] = bn_unrows(b, t, META(0)));
    }
    return 0;
}
static int bwd_reshape(nt__bctx *b)
{
    TRY(b->gin[0] = nt_reshape_at(S, G, META(0)->ndim, META(0)->shape));
    return 0;
}
static int bwd_transpose(nt__bctx *b)
{
    TRY(b->gin[0] = nt_transpose_at(S, G, (int)b->n->p.i[0], (int)b->n->p.i[1]));
    return 0;
}
static int bwd_permute(nt__bctx *b)
{
    int inv[NT_MAX_DIMS];
    for (int k = 0; k < META(0)->ndim; k++)
        inv[b->n->p.i[k]] = k;
    TRY(b->gin[0] = nt_permute_at(S, G, inv));
    return 0;
}
/* slice in a create_graph pass: g between zeros by cat (a step > 1 puts
 * step - 1 zeros after each element first: [.., n, 1, ..] cat zeros
 * [.., n, step - 1, ..] along the new dim, reshaped and cut), with no write
 * in place, so the gradient records as a function of g.  Copies only: the
 * values and bits of g copied into zeros. */
static nt_tensor *slice_back_cat(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    const nt__params *p = &b->n->p;
    int d = p->dim, nd = m->ndim;
    int64_t lo = p->i[0], step = p->i[2], cnt = G->shape[d], sh[NT_MAX_DIMS];
    nt_dtype dt = (nt_dtype)G->dtype;
    nt_tensor *g = G, *z, *parts[3];
    if (cnt == 0)
        return nt_zeros_at(S, dt, nd, m->shape);
    if (step > 1 && cnt > 1) {
        if (nd == NT_MAX_DIMS) {
            nt__dbl_refuse(S, "a slice with a step of a tensor of NT_MAX_DIMS dims");
            return NULL;
        }
        for (int i = 0, k = 0; i < nd; i++) {
            sh[k++] = G->shape[i];
            if (i == d)
                sh[k++] = 1;
        }
        nt_tensor *g1 = nt_reshape_at(S, G, nd + 1, sh);
        sh[d + 1] = step - 1;
        if (!g1 || !(z = nt_zeros_at(S, dt, nd + 1, sh)))
            return NULL;
        memcpy(sh, G->shape, sizeof(int64_t) * (size_t)nd);
        sh[d] = cnt * step;
        g = nt_reshape_at(S, nt_cat_at(S, (nt_tensor *[]){g1, z}, 2, d + 1), nd, sh);
        if (!(g = nt_slice_at(S, g, d, 0, (cnt - 1) * step + 1, 1)))
            return NULL;
    }
    int k = 0;
    int64_t after = m->shape[d] - lo - g->shape[d];
    memcpy(sh, m->shape, sizeof(int64_t) * (size_t)nd);
    if (lo > 0) {
        sh[d] = lo;
        if (!(parts[k++] = nt_zeros_at(S, dt, nd, sh)))
            return NULL;
    }
    parts[k++] = g;
    if (after > 0) {
        sh[d] = after;
        if (!(parts[k++] = nt_zeros_at(S, dt, nd, sh)))
            return NULL;
    }
    return k == 1 ? g : nt_cat_at(S, parts, k, d);
}

static int bwd_slice(nt__bctx *b) /* g placed into zeros of the input's shape */
{
    const nt__tmeta *m = META(0);
    nt_tensor *z, *v;
    if (b->create) {
        TRY(b->gin[0] = slice_back_cat(b));
        return 0;
    }
    TRY(z = nt_zeros_at(S, (nt_dtype)G->dtype, m->ndim, m->shape));
    const nt__params *p = &b->n->p;
    TRY(v = nt_slice_at(S, z, p->dim, p->i[0], p->i[1], p->i[2]));
    if (nt_copy_into_at(S, v, G))
        return nt_last_error();
    b->gin[0] = z;
    return 0;
}
static int bwd_expand(nt__bctx *b)
{
    TRY(b->gin[0] = reduce_to(b, G, META(0)));
    return 0;
}
/* diagonal: g placed on the diagonal of zeros of the input's shape */
static int bwd_diagonal(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    const nt__params *p = &b->n->p;
    nt_tensor *z, *v;
    if (b->create) {
        /* no copy in place in a recorded backward: g scattered into a
         * flat zero tensor at the diagonal's flat positions (the diagonal
         * of arange(numel) in x's shape), the same values; scatter's
         * gradient with respect to g gathers them back */
        int64_t ne = nt__numel(m->ndim, m->shape), one = -1;
        nt_tensor *pos;
        TRY(pos = nt_reshape_at(S, nt_arange_at(S, NT_I32, 0, (double)ne, 1), m->ndim, m->shape));
        TRY(pos = nt_reshape_at(S, nt_diagonal_at(S, pos, p->i[0], (int)p->i[1], (int)p->i[2]),
                                1, &one));
        TRY(z = nt_scatter_at(S, nt_zeros_at(S, (nt_dtype)G->dtype, 1, &ne), 0, pos,
                              nt_reshape_at(S, G, 1, &one)));
        TRY(b->gin[0] = nt_reshape_at(S, z, m->ndim, m->shape));
        return 0;
    }
    TRY(z = nt_zeros_at(S, (nt_dtype)G->dtype, m->ndim, m->shape));
    TRY(v = nt_diagonal_at(S, z, p->i[0], (int)p->i[1], (int)p->i[2]));
    if (nt_copy_into_at(S, v, G))
        return nt_last_error();
    b->gin[0] = z;
    return 0;
}
static int bwd_cat(nt__bctx *b)
{
    int64_t off = 0;
    for (int i = 0; i < b->n->nin; i++) {
        int64_t len = b->n->sizes[i];
        if (LIVE(i))
            TRY(b->gin[i] = nt_slice_at(S, G, b->n->p.dim, off, off + len, 1));
        off += len;
    }
    return 0;
}

/* ---------------- reductions ---------------- */

static int bwd_sum(nt__bctx *b)
{
    TRY(b->gin[0] = expand_back(b, G));
    return 0;
}
static int bwd_mean(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    int dim = b->n->p.dim;
    double n = dim == NT_DIM_ALL ? (double)nt__numel(m->ndim, m->shape) : (double)m->shape[dim];
    TRY(b->gin[0] = nt_div_scalar_at(S, expand_back(b, G), n));
    return 0;
}
/* max and min: the gradient goes to the first extreme, the element `arg`
 * (nt_argmax_at / nt_argmin_at) picks. */
typedef nt_tensor *(*argext_fn)(const nt_site *, nt_tensor *, int, bool);
static int extreme_bwd(nt__bctx *b, argext_fn arg)
{
    const nt__tmeta *m = META(0);
    nt_tensor *x = IN(0), *z, *idx, *ar, *mask, *gk;
    int dim = b->n->p.dim;
    TRY(z = zero0d(b, G));
    if (dim == NT_DIM_ALL || m->ndim == 0) {
        int64_t n = nt__numel(m->ndim, m->shape);
        nt_tensor *xf;
        TRY(xf = nt_reshape_at(S, x, 1, &n));
        TRY(idx = arg(S, xf, 0, true));
        TRY(ar = nt_arange_at(S, NT_I32, 0, (double)n, 1));
        TRY(mask = nt_eq_at(S, ar, idx));
        TRY(gk = nt_reshape_at(S, G, 1, (int64_t[]){1}));
        nt_tensor *gf;
        TRY(gf = nt_where_at(S, mask, gk, z));
        TRY(b->gin[0] = nt_reshape_at(S, gf, m->ndim, m->shape));
        return 0;
    }
    int64_t as[NT_MAX_DIMS], ks[NT_MAX_DIMS];
    for (int i = 0; i < m->ndim; i++) {
        as[i] = i == dim ? m->shape[i] : 1;
        ks[i] = i == dim ? 1 : m->shape[i];
    }
    TRY(idx = arg(S, x, dim, true));
    TRY(ar = nt_reshape_at(S, nt_arange_at(S, NT_I32, 0, (double)m->shape[dim], 1), m->ndim, as));
    TRY(mask = nt_eq_at(S, ar, idx));
    TRY(gk = nt_reshape_at(S, G, m->ndim, ks));
    TRY(b->gin[0] = nt_where_at(S, mask, gk, z));
    return 0;
}

static int bwd_max(nt__bctx *b) { return extreme_bwd(b, nt_argmax_at); }
static int bwd_min(nt__bctx *b) { return extreme_bwd(b, nt_argmin_at); }

/* amax and amin (torch.amax's backward, PyTorch 1.13): with y the result
 * and g its gradient broadcast back over the reduced dim(s), the elements
 * equal to y share g evenly: (g / count) * mask, count the number of them
 * (keepdim).  A row whose result is NaN has no element equal to it: count
 * 0, so g / 0 * 0 gives NaN over the row, as PyTorch. */
static int bwd_amax(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    nt_tensor *x = IN(0), *g, *yb, *mask, *cnt;
    int dim = b->n->p.dim;
    TRY(g = expand_back(b, G));
    TRY(yb = expand_back(b, OUT(0)));
    TRY(mask = nt_cast_at(S, nt_eq_at(S, x, yb), (nt_dtype)G->dtype));
    TRY(cnt = nt_sum_at(S, mask, m->ndim ? dim : NT_DIM_ALL, true));
    if (cnt->dtype != G->dtype)
        TRY(cnt = nt_cast_at(S, cnt, (nt_dtype)G->dtype));
    TRY(b->gin[0] = nt_mul_at(S, nt_div_at(S, g, cnt), mask));
    return 0;
}

/* t with dim d reversed (index_select with n-1 .. 0). */
static nt_tensor *rev(nt__bctx *b, nt_tensor *t, int d)
{
    int64_t n = t ? t->shape[d] : 0;
    return t ? nt_index_select_at(S, t, d, nt_arange_at(S, NT_I32, (double)(n - 1), -1.0, -1.0))
             : NULL;
}

/* rope: y = R(theta) x per pair, a rotation, so gx = R(-theta) g: the same
 * op with the inverse flag toggled (sin negated: exact), the same offset
 * (the saved tensor, or the parameter). */
static int bwd_rope(nt__bctx *b)
{
    const nt__params *p = &b->n->p;
    TRY(b->gin[0] = nt__rope(S, "nt_rope", G, p->i[0], p->flag ^ NT__ROPE_INVERSE, p->f[0],
                             p->f[1], p->i[1], IN(1)));
    return 0;
}

/* cumsum: each x_i reaches every y_j, j >= i: the reversed running sum of
 * g (the running kernel on g reversed, reversed back). */
static int bwd_cumsum(nt__bctx *b)
{
    int d = b->n->p.dim;
    TRY(b->gin[0] = rev(b, nt_cumsum_at(S, rev(b, G, d), d), d));
    return 0;
}

/* cumprod, with no division (exact with zeros along the dim, like
 * PyTorch's cumprod_backward): dy_j/dx_i = E_i * prod_{i<m<=j} x_m for
 * j >= i, E_i = y_(i-1) (1 for i = 0) the product before i, so
 *   gx_i = E_i * S_i,  S_i = g_i + x_(i+1) * S_(i+1),  S_(n-1) = g_(n-1):
 * a running op from the end (linrec on the reversed a = x shifted by one,
 * 1 at the end, and b = g). */
static int bwd_cumprod(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    int d = b->n->p.dim;
    int64_t n = m->shape[d], s1[NT_MAX_DIMS];
    if (n == 1) {
        b->gin[0] = G;
        return 0;
    }
    nt_tensor *x = IN(0), *y = OUT(0), *one, *e, *a, *sr;
    memcpy(s1, m->shape, sizeof s1);
    s1[d] = 1;
    TRY(one = nt_ones_at(S, (nt_dtype)G->dtype, m->ndim, s1));
    TRY(e = nt_cat_at(S, (nt_tensor *[]){one, nt_slice_at(S, y, d, 0, n - 1, 1)}, 2, d));
    TRY(a = nt_cat_at(S, (nt_tensor *[]){nt_slice_at(S, x, d, 1, n, 1), one}, 2, d));
    TRY(sr = nt__linrec(S, rev(b, a, d), rev(b, G, d), d));
    TRY(b->gin[0] = nt_mul_at(S, e, rev(b, sr, d)));
    return 0;
}

/* linrec (cumprod's backward, recorded by a create_graph pass): y_j = a_j
 * y_(j-1) + b_j, y_(-1) = -0.  With T_i = g_i + a_(i+1) T_(i+1) (the same
 * running op from the end, as cumprod's backward): gb = T, ga_j = T_j
 * y_(j-1) (0 for j = 0).  Built from differentiable ops and linrec itself:
 * third derivatives follow. */
static int bwd_linrec(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    int d = b->n->p.dim;
    int64_t n = m->shape[d], s1[NT_MAX_DIMS];
    nt_tensor *t = G, *one, *zero, *a;
    memcpy(s1, m->shape, sizeof s1);
    s1[d] = 1;
    TRY(one = nt_ones_at(S, (nt_dtype)G->dtype, m->ndim, s1));
    TRY(zero = nt_zeros_at(S, (nt_dtype)G->dtype, m->ndim, s1));
    if (n > 1) {
        TRY(a = nt_cat_at(S, (nt_tensor *[]){nt_slice_at(S, IN(0), d, 1, n, 1), one}, 2, d));
        TRY(t = rev(b, nt__linrec(S, rev(b, a, d), rev(b, G, d), d), d));
    }
    if (LIVE(1))
        b->gin[1] = t;
    if (LIVE(0)) {
        nt_tensor *ys = n > 1 ? nt_cat_at(S, (nt_tensor *[]){zero, nt_slice_at(S, OUT(0), d, 0, n - 1, 1)}, 2, d)
                              : zero;
        TRY(b->gin[0] = nt_mul_at(S, t, ys));
    }
    return 0;
}

/* sign(x) in x's dtype: 1, -1, 0 at +-0 (and 0 at NaN: it compares false
 * both ways). */
static nt_tensor *sgn(nt__bctx *b, nt_tensor *x)
{
    nt_tensor *one, *mone, *z;
    nt_dtype dt = (nt_dtype)x->dtype;
    if (!(one = nt_full_at(S, dt, 0, NULL, 1.0)) || !(mone = nt_full_at(S, dt, 0, NULL, -1.0)) ||
        !(z = nt_zeros_at(S, dt, 0, NULL)))
        return NULL;
    return nt_where_at(S, nt_gt_at(S, x, z), one, nt_where_at(S, nt_lt_at(S, x, z), mone, z));
}

/* torch.linalg.vector_norm's backward (PyTorch's norm_backward): with n the
 * norm and g its gradient, both broadcast back over the reduced dims,
 *   ord 0:       0
 *   ord 1:       sgn(x) g
 *   ord 2:       x g / n, 0 where n == 0
 *   ord +-inf:   sgn(x) g / count on the elements with |x| == n or x NaN
 *                (the count of them shares g evenly), else 0
 *   ord p < 1:   sgn(x) |x|^(p-1) g n^(1-p), 0 where x == 0
 *   other p:     sgn(x) |x|^(p-1) g / n^(p-1), 0 where n == 0
 * (x |x|^(p-2) for p >= 2 in PyTorch: the same value away from 0.)
 * Computed in the input's dtype with ordinary ops. */
static int bwd_norm(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    double p = b->n->p.f[0];
    nt_tensor *x = IN(0), *n = OUT(0), *g, *nb, *z, *r;
    if (p == 0.0) {
        TRY(b->gin[0] = nt_zeros_at(S, (nt_dtype)m->dtype, m->ndim, m->shape));
        return 0;
    }
    TRY(g = expand_back(b, G));
    if (p == 1.0) {
        TRY(b->gin[0] = nt_mul_at(S, sgn(b, x), g));
        return 0;
    }
    TRY(nb = expand_back(b, n));
    TRY(z = zero0d(b, G));
    if (isinf(p)) {
        nt_tensor *mask, *cnt;
        int dim = b->n->p.dim;
        TRY(mask = nt_maximum_at(S, nt_eq_at(S, nt_abs_at(S, x), nb), nt_ne_at(S, x, x)));
        /* keepdim: broadcasts back over the reduced dims */
        TRY(cnt = nt_sum_at(S, nt_cast_at(S, mask, (nt_dtype)m->dtype), dim, true));
        TRY(r = nt_mul_at(S, sgn(b, x), nt_div_at(S, g, cnt)));
        TRY(b->gin[0] = nt_where_at(S, mask, r, z));
        return 0;
    }
    if (p == 2.0) {
        TRY(r = nt_div_at(S, nt_mul_at(S, x, g), nb));
        TRY(b->gin[0] = nt_where_at(S, nt_eq_at(S, nb, z), z, r));
        return 0;
    }
    nt_tensor *xs;
    TRY(xs = nt_mul_at(S, sgn(b, x), nt_pow_scalar_at(S, nt_abs_at(S, x), p - 1.0)));
    if (p < 1.0) {
        TRY(xs = nt_where_at(S, nt_eq_at(S, x, z), z, xs));
        TRY(b->gin[0] = nt_mul_at(S, nt_mul_at(S, xs, g), nt_pow_scalar_at(S, nb, 1.0 - p)));
        return 0;
    }
    TRY(r = nt_div_at(S, g, nt_pow_scalar_at(S, nb, p - 1.0)));
    TRY(r = nt_where_at(S, nt_eq_at(S, nb, z), z, r));
    TRY(b->gin[0] = nt_mul_at(S, xs, r));
    return 0;
}

/* ---------------- row ops ---------------- */

static int bwd_softmax(nt__bctx *b) /* y (g - sum(g y)) */
{
    nt_tensor *y = OUT(0), *s;
    TRY(s = nt_sum_at(S, nt_mul_at(S, G, y), b->n->p.dim, true));
    TRY(b->gin[0] = nt_mul_at(S, y, nt_sub_at(S, G, s)));
    return 0;
}
static int bwd_log_softmax(nt__bctx *b) /* g - exp(y) sum(g) */
{
    nt_tensor *s;
    TRY(s = nt_sum_at(S, G, b->n->p.dim, true));
    TRY(b->gin[0] = nt_sub_at(S, G, nt_mul_at(S, nt_exp_at(S, OUT(0)), s)));
    return 0;
}

static nt_tensor *as_f32(nt__bctx *b, nt_tensor *t)
{
    return t->dtype == NT_F32 ? t : nt_cast_at(S, t, NT_F32);
}

/* layer_norm: with xhat = (x - mu) r, r = rsqrt(var + eps), gxhat = g w:
 * gx = r (gxhat - mean(gxhat) - xhat mean(gxhat xhat)), gw = sum(g xhat),
 * gb = sum(g).  Statistics are recomputed in f32.  gb comes first, gw's
 * sum last, so that the statistics, gx and g xhat are one row kernel
 * (docs/fusion.md): a sum over dim 0 ends a group, and between the
 * statistics and gx it split them into two kernels, r and xhat written out
 * by one and read back by the other.  (With gb's sum there too, g's first
 * reader would be an elementwise op, and the matmul that made g would move
 * up to it and take the row ops' products as its epilogue.)  Each op reads
 * what it read before, so the bits are the same. */
static int bwd_layer_norm(nt__bctx *b)
{
    nt_tensor *x, *g, *w = IN(1), *mu, *d, *var, *r, *xhat, *gxhat;
    double eps = b->n->p.f[0];
    TRY(x = as_f32(b, IN(0)));
    TRY(g = as_f32(b, G));
    if (LIVE(2))
        TRY(b->gin[2] = reduce_to(b, g, META(2)));
    TRY(mu = nt_mean_at(S, x, -1, true));
    TRY(d = nt_sub_at(S, x, mu));
    TRY(var = nt_mean_at(S, nt_mul_at(S, d, d), -1, true));
    TRY(r = nt_rsqrt_at(S, nt_add_scalar_at(S, var, eps)));
    TRY(xhat = nt_mul_at(S, d, r));
    if (LIVE(0)) {
        TRY(gxhat = w ? nt_mul_at(S, g, as_f32(b, w)) : g);
        nt_tensor *m1, *m2;
        TRY(m1 = nt_mean_at(S, gxhat, -1, true));
        TRY(m2 = nt_mean_at(S, nt_mul_at(S, gxhat, xhat), -1, true));
        TRY(b->gin[0] = nt_mul_at(S, r, nt_sub_at(S, nt_sub_at(S, gxhat, m1), nt_mul_at(S, xhat, m2))));
    }
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(b, nt_mul_at(S, g, xhat), META(1)));
    return 0;
}

/* rms_norm: xhat = x r, r = rsqrt(mean(x^2) + eps): gx = r (gxhat - xhat
 * mean(gxhat xhat)), gw = sum(g xhat). */
static int bwd_rms_norm(nt__bctx *b)
{
    nt_tensor *x, *g, *w = IN(1), *r, *xhat, *gxhat, *m2;
    TRY(x = as_f32(b, IN(0)));
    TRY(g = as_f32(b, G));
    TRY(r = nt_rsqrt_at(S, nt_add_scalar_at(S, nt_mean_at(S, nt_mul_at(S, x, x), -1, true),
                                            b->n->p.f[0])));
    TRY(xhat = nt_mul_at(S, x, r));
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(b, nt_mul_at(S, g, xhat), META(1)));
    if (LIVE(0)) {
        TRY(gxhat = w ? nt_mul_at(S, g, as_f32(b, w)) : g);
        TRY(m2 = nt_mean_at(S, nt_mul_at(S, gxhat, xhat), -1, true));
        TRY(b->gin[0] = nt_mul_at(S, r, nt_sub_at(S, gxhat, nt_mul_at(S, xhat, m2))));
    }
    return 0;
}

/* ---------------- losses ---------------- */

/* d/dlogits mean(-log_softmax[label]) = (softmax - onehot(label)) / N */
static int bwd_cross_entropy(nt__bctx *b)
{
    nt_tensor *logits = IN(0), *labels = IN(1), *p, *ar, *lab, *onehot;
    int64_t N = logits->shape[0], C = logits->shape[1];
    TRY(p = nt_softmax_at(S, logits, 1));
    TRY(ar = nt_reshape_at(S, nt_arange_at(S, NT_I32, 0, (double)C, 1), 2, (int64_t[]){1, C}));
    TRY(lab = nt_reshape_at(S, labels, 2, (int64_t[]){N, 1}));
    TRY(onehot = nt_cast_at(S, nt_eq_at(S, ar, lab), (nt_dtype)p->dtype));
    TRY(b->gin[0] = nt_mul_at(S, nt_sub_at(S, p, onehot), nt_div_scalar_at(S, G, (double)N)));
    return 0;
}

/* d/da mean((a - b)^2) = 2 (a - b) / n */
static int bwd_mse_loss(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    double n = (double)nt__numel(m->ndim, m->shape);
    nt_tensor *ga;
    TRY(ga = nt_mul_at(S, nt_sub_at(S, IN(0), IN(1)), nt_mul_scalar_at(S, G, 2.0 / n)));
    if (LIVE(0))
        b->gin[0] = ga;
    if (LIVE(1))
        TRY(b->gin[1] = nt_neg_at(S, ga));
    return 0;
}

/* ---------------- dropout ---------------- */

/* g * m: the same op on g with the forward's p and seed recomputes the mask */
static int bwd_dropout(nt__bctx *b)
{
    TRY(b->gin[0] = nt__dropout(S, "nt_dropout", G, b->n->p.f[0], b->n->p.seed));
    return 0;
}

/* ---------------- matmul, embedding ---------------- */

/* ga = g b^T, gb = a^T g, with 1-D operands promoted like the forward and
 * broadcast batch dims summed away. */
static int bwd_matmul(nt__bctx *b)
{
    nt_tensor *a = IN(0), *bb = IN(1), *g = G;
    bool av = a->ndim == 1, bv = bb->ndim == 1;
    if (av)
        TRY(a = nt_reshape_at(S, a, 2, (int64_t[]){1, a->shape[0]}));
    if (bv)
        TRY(bb = nt_reshape_at(S, bb, 2, (int64_t[]){bb->shape[0], 1}));
    /* g with the removed dims put back: batch + [M, N] */
    int64_t gs[NT_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < g->ndim - (av ? 0 : 1) - (bv ? 0 : 1); i++)
        gs[k++] = g->shape[i];
    gs[k++] = av ? 1 : g->shape[g->ndim - (bv ? 1 : 2)];
    gs[k++] = bv ? 1 : g->shape[g->ndim - 1];
    TRY(g = nt_reshape_at(S, g, k, gs));
    if (LIVE(0)) {
        nt_tensor *ga;
        TRY(ga = nt_matmul_at(S, g, nt_transpose_at(S, bb, -1, -2)));
        if (av) { /* batch + [1, K] -> batch + [K] */
            int64_t s[NT_MAX_DIMS];
            for (int i = 0; i < ga->ndim - 2; i++)
                s[i] = ga->shape[i];
            s[ga->ndim - 2] = ga->shape[ga->ndim - 1];
            TRY(ga = nt_reshape_at(S, ga, ga->ndim - 1, s));
        }
        TRY(b->gin[0] = reduce_to(b, ga, META(0)));
    }
    if (LIVE(1)) {
        nt_tensor *gb;
        if (bb->ndim == 2 && a->ndim > 2) {
            /* a 2-D b under batched rows (nt_linear on [B, T, C]): its
             * gradient is one product over every row, the batch folded
             * into K -- a [B*M, K]^T . g [B*M, N], K-tiles of 128 ascending
             * over all B*M rows (PyTorch's; docs/ops.md, section 7b) --
             * not B products summed afterwards */
            int64_t K = a->shape[a->ndim - 1], N = g->shape[g->ndim - 1];
            int64_t R = nt__numel(a->ndim - 1, a->shape);
            TRY(a = nt_reshape_at(S, a, 2, (int64_t[]){R, K}));
            TRY(g = nt_reshape_at(S, g, 2, (int64_t[]){R, N}));
        }
        if (bb->ndim == 2 && a->ndim == 2 && bb->stride[0] == 1 && bb->stride[1] != 1)
            /* b is a transposed view (linear's w^T): compute gb in that
             * layout, (g^T a)^T, so its way back to w is a contiguous
             * tensor, not a strided copy.  Same bits: each element is the
             * same products (fma commutes its factors) in the same order. */
            TRY(gb = nt_transpose_at(S, nt_matmul_at(S, nt_transpose_at(S, g, 0, 1), a), 0, 1));
        else
            TRY(gb = nt_matmul_at(S, nt_transpose_at(S, a, -1, -2), g));
        if (bv) { /* batch + [K, 1] -> batch + [K] */
            TRY(gb = nt_reshape_at(S, gb, gb->ndim - 1, gb->shape));
        }
        TRY(b->gin[1] = reduce_to(b, gb, META(1)));
    }
    return 0;
}

/* gather / index_select: g added into t's shape at the indexed places, in
 * g's row-major order (index_add, cpu/index.c). */
static int bwd_gather(nt__bctx *b)
{
    const nt__tmeta *xm = META(0);
    nt__call c;
    nt_tensor *in[2] = {G, IN(1)};
    const char *fn = b->n->op == NT_OP_GATHER ? "nt_gather" : "nt_index_select";
    if (!nt__call_begin(&c, S, fn, NT_OP_INDEX_ADD, 2, in, "g,index"))
        return nt_last_error();
    c.no_grad = !b->create; /* recorded in a create_graph pass: bwd_index_add */
    c.p.dim = b->n->p.dim;
    c.p.flag = b->n->op == NT_OP_INDEX_SELECT;
    c.odt[0] = (nt_dtype)G->dtype;
    c.ondim[0] = xm->ndim;
    for (int i = 0; i < xm->ndim; i++)
        c.oshape[0][i] = xm->shape[i];
    c.flops = (double)nt__numel(G->ndim, G->shape);
    TRY(b->gin[0] = nt__dispatch(&c));
    return 0;
}

static int bwd_embedding(nt__bctx *b)
{
    const nt__tmeta *wm = META(0);
    nt__call c;
    nt_tensor *in[2] = {G, IN(1)};
    if (!nt__call_begin(&c, S, "nt_embedding", NT_OP_EMBEDDING_BWD, 2, in, "g,idx"))
        return nt_last_error();
    c.no_grad = !b->create; /* recorded in a create_graph pass: bwd_embedding_bwd */
    c.p.i[0] = wm->shape[0];
    c.odt[0] = (nt_dtype)G->dtype;
    c.ondim[0] = 2;
    c.oshape[0][0] = wm->shape[0];
    c.oshape[0][1] = wm->shape[1];
    c.flops = (double)nt__numel(G->ndim, G->shape);
    TRY(b->gin[0] = nt__dispatch(&c));
    return 0;
}

/* The backward kernels of gather / index_select (INDEX_ADD) and embedding
 * (EMBEDDING_BWD), recorded by a create_graph pass, are linear in g: their
 * gradient with respect to g is the forward op again on the incoming
 * gradient (gathering at the same index); the index gets none. */
static int bwd_index_add(nt__bctx *b)
{
    const nt__params *p = &b->n->p;
    if (LIVE(0))
        TRY(b->gin[0] = p->flag ? nt_index_select_at(S, G, p->dim, IN(1))
                                : nt_gather_at(S, G, p->dim, IN(1)));
    return 0;
}
static int bwd_embedding_bwd(nt__bctx *b)
{
    if (LIVE(0))
        TRY(b->gin[0] = nt_embedding_at(S, G, IN(1)));
    return 0;
}

/* scatter (p.flag: index_put's 1-D index along dim): t's gradient is g
 * with the written places zeroed (g scattered with zeros); src's is g
 * gathered at the index (index_select for a 1-D index). */
static nt_tensor *gather_back(nt__bctx *b)
{
    const nt__params *p = &b->n->p;
    return p->flag ? nt_index_select_at(S, G, p->dim, IN(1)) : nt_gather_at(S, G, p->dim, IN(1));
}

static int bwd_scatter(nt__bctx *b)
{
    if (LIVE(0)) {
        const nt__tmeta *sm = META(2);
        nt__call c;
        nt_tensor *z, *in[3] = {G, IN(1), NULL};
        TRY(z = nt_zeros_at(S, (nt_dtype)G->dtype, sm->ndim, sm->shape));
        in[2] = z;
        if (!nt__call_begin(&c, S, "nt_scatter", NT_OP_SCATTER, 3, in, "g,index,zeros"))
            return nt_last_error();
        c.no_grad = !b->create; /* a create_graph pass records scatter: linear in g */
        c.p = b->n->p;
        c.odt[0] = (nt_dtype)G->dtype;
        c.ondim[0] = G->ndim;
        for (int i = 0; i < G->ndim; i++)
            c.oshape[0][i] = G->shape[i];
        c.flops = (double)nt__numel(G->ndim, G->shape);
        TRY(b->gin[0] = nt__dispatch(&c));
    }
    if (LIVE(2))
        TRY(b->gin[2] = gather_back(b));
    return 0;
}

/* scatter_add, index_add: t's gradient is g; src's is alpha * g gathered
 * at the index. */
static int bwd_scatter_add(nt__bctx *b)
{
    if (LIVE(0))
        b->gin[0] = G;
    if (LIVE(2)) {
        double alpha = b->n->p.f[0];
        TRY(b->gin[2] = gather_back(b));
        if (alpha != 1.0)
            TRY(b->gin[2] = nt_mul_scalar_at(S, b->gin[2], alpha));
    }
    return 0;
}

/* max_pool2d_fwd (dispatcher/api_pool.c): g added at the saved flat
 * positions, windows in row-major order (PyTorch's max_pool2d backward),
 * into zeros: one max_pool2d_bwd kernel, or in a create_graph pass the
 * same sums by scatter_add into zeros [P, H W], which records. */
static int bwd_max_pool2d(nt__bctx *b)
{
    const nt__tmeta *m = META(0);
    if (!G || !LIVE(0))
        return 0;
    if (!b->create && G->dtype == NT_F32) {
        TRY(b->gin[0] = nt__max_pool2d_grad(S, G, OUT(1), &b->n->p, m->ndim, m->shape));
        return 0;
    }
    int nd = m->ndim;
    int64_t P = 1, HW = m->shape[nd - 2] * m->shape[nd - 1];
    for (int i = 0; i < nd - 2; i++)
        P *= m->shape[i];
    int64_t L = nt_numel(G) / (P > 0 ? P : 1);
    nt_tensor *z, *ix, *g;
    TRY(z = nt_zeros_at(S, (nt_dtype)G->dtype, 2, (int64_t[]){P, HW}));
    TRY(ix = nt_reshape_at(S, OUT(1), 2, (int64_t[]){P, L}));
    TRY(g = nt_reshape_at(S, G, 2, (int64_t[]){P, L}));
    TRY(g = nt_scatter_add_at(S, z, 1, ix, g));
    TRY(b->gin[0] = nt_reshape_at(S, g, nd, m->shape));
    return 0;
}

/* ---------------- attention ---------------- */

/* FlashAttention-2's backward as one op, SDPA_BWD (cpu/attention.c): the
 * scores are recomputed block by block from q, k and the saved log-sum-exp,
 * never stored.  An op has at most four inputs, so q, dO and O travel as
 * one tensor and k, v as another (copies of size T x D, not T x T): per
 * batch the three (two) row-major blocks one after the other, which copies
 * in long contiguous runs; dk and dv come back packed like k, v.  A
 * floating mask gets no gradient. */
/* The scores of sdpa, recomputed from differentiable ops in f32: s = q k^T
 * scale, the mask (u8: -Inf where 0; floating: added), the causal rule
 * (-Inf where key j > query i).  *empty: u8, the rows with no key left (the
 * forward gives them 0). */
static nt_tensor *sdpa_scores(nt__bctx *b, nt_tensor *q, nt_tensor *k, nt_tensor **empty)
{
    const nt__params *p = &b->n->p;
    nt_tensor *mask = b->n->saved_in[3], *sc, *ninf;
    int nd = q->ndim;
    int64_t Tq = q->shape[nd - 2], Tk = k->shape[nd - 2];
    if (!(sc = nt_mul_scalar_at(S, nt_matmul_at(S, q, nt_transpose_at(S, k, -1, -2)), (float)p->f[0])))
        return NULL;
    if (mask && mask->dtype == NT_U8)
        sc = nt_masked_fill_at(S, sc, nt_eq_at(S, mask, nt_zeros_at(S, NT_U8, 0, NULL)), -INFINITY);
    else if (mask)
        sc = nt_add_at(S, sc, nt_cast_at(S, mask, NT_F32));
    if (sc && p->flag) {
        nt_tensor *i = nt_reshape_at(S, nt_arange_at(S, NT_I32, 0, (double)Tq, 1), 2,
                                     (int64_t[]){Tq, 1});
        nt_tensor *j = nt_reshape_at(S, nt_arange_at(S, NT_I32, 0, (double)Tk, 1), 2,
                                     (int64_t[]){1, Tk});
        sc = nt_masked_fill_at(S, sc, nt_gt_at(S, j, i), -INFINITY);
    }
    if (!sc || !(ninf = nt_full_at(S, NT_F32, 0, NULL, -INFINITY)))
        return NULL;
    nt_tensor *m = nt_amax_at(S, nt_detach_at(S, sc), 1, (int[]){-1}, true);
    *empty = m ? nt_eq_at(S, m, ninf) : NULL;
    return *empty ? sc : NULL;
}

/* t of the shape of sdpa's output o: with heads inside rows (p.i[4], o
 * [..., T, H, Dv]: dispatcher/api_attention.c) its view [..., H, T, Dv],
 * else t. */
static nt_tensor *sdpa_heads_back(nt__bctx *b, nt_tensor *t)
{
    if (!t || !b->n->p.i[4])
        return t;
    return nt_transpose_at(S, t, t->ndim - 3, t->ndim - 2);
}

/* sdpa's backward in a create_graph pass: the same function as SDPA_BWD
 * from recorded ops (P = softmax(s); dv = P^T g, dP = g v^T, ds = P (dP -
 * rowsum(dP P)), dq = ds k scale, dk = ds^T q scale), in f32, cast back to
 * q's dtype, so it differentiates again.  Its first-order values round
 * differently from the fused kernel's (another order of the same sums),
 * as PyTorch's math and flash backends differ; rows with no key get 0. */
static int bwd_sdpa_graph(nt__bctx *b)
{
    nt_tensor *q = IN(0), *k = IN(1), *v = IN(2), *g = G, *empty, *sc, *P, *dP, *ds, *z;
    nt_dtype dt = (nt_dtype)q->dtype;
    double scale = (float)b->n->p.f[0];
    TRY(q = nt_cast_at(S, q, NT_F32));
    TRY(k = nt_cast_at(S, k, NT_F32));
    TRY(v = nt_cast_at(S, v, NT_F32));
    TRY(g = nt_cast_at(S, sdpa_heads_back(b, g), NT_F32));
    TRY(sc = sdpa_scores(b, q, k, &empty));
    TRY(z = nt_zeros_at(S, NT_F32, 0, NULL));
    /* empty rows: scores 0 there (softmax finite), P 0 there: no NaN
     * reaches the gradient through where */
    TRY(P = nt_where_at(S, empty, z, nt_softmax_at(S, nt_where_at(S, empty, z, sc), -1)));
    TRY(dP = nt_matmul_at(S, g, nt_transpose_at(S, v, -1, -2)));
    TRY(ds = nt_mul_at(S, P, nt_sub_at(S, dP, nt_sum_at(S, nt_mul_at(S, dP, P), -1, true))));
    if (LIVE(0))
        TRY(b->gin[0] = nt_cast_at(S, nt_mul_scalar_at(S, nt_matmul_at(S, ds, k), scale), dt));
    if (LIVE(1))
        TRY(b->gin[1] = nt_cast_at(
                S, nt_mul_scalar_at(S, nt_matmul_at(S, nt_transpose_at(S, ds, -1, -2), q), scale), dt));
    if (LIVE(2))
        TRY(b->gin[2] = nt_cast_at(S, nt_matmul_at(S, nt_transpose_at(S, P, -1, -2), g), dt));
    return 0;
}

/* q, k, v of one shape, strides and dtype, views of one storage at
 * element offsets o, o + s, o + 2s (s > 0: attention's heads of one qkv
 * projection): one view [3, ..., T, D] of the three, which SDPA_BWD reads
 * in place of the packed copies of q, dO, O and k, v (p.i[4] = 1: inputs
 * qkv, dO, O, lse, no mask).  NULL when they are not such views (the
 * packed path then). */
static nt_tensor *sdpa_qkv_view(nt__bctx *b, nt_tensor *q, nt_tensor *k, nt_tensor *v)
{
    int nd = q->ndim;
    if (nd + 1 > NT_MAX_DIMS || k->st != q->st || v->st != q->st || k->ndim != nd ||
        v->ndim != nd || k->dtype != q->dtype || v->dtype != q->dtype || q->expanded ||
        k->expanded || v->expanded)
        return NULL;
    for (int i = 0; i < nd; i++)
        if (k->shape[i] != q->shape[i] || v->shape[i] != q->shape[i] ||
            k->stride[i] != q->stride[i] || v->stride[i] != q->stride[i])
            return NULL;
    int64_t st = k->offset - q->offset, sh[NT_MAX_DIMS], sd[NT_MAX_DIMS];
    if (st <= 0 || v->offset - k->offset != st)
        return NULL;
    sh[0] = 3;
    sd[0] = st;
    memcpy(sh + 1, q->shape, sizeof(int64_t) * (size_t)nd);
    memcpy(sd + 1, q->stride, sizeof(int64_t) * (size_t)nd);
    nt_tensor *t = nt__make_view(q, nd + 1, sh, sd, q->offset, S);
    return t ? nt__scope_adopt(t, "nt_backward") : NULL;
}

/* Whether view t (strides > 0) covers a dense block of elements from its
 * offset: its dims, taken by stride, nest with no gap or overlap. */
static bool sdpa_dense(const nt_tensor *t)
{
    bool used[NT_MAX_DIMS] = {false};
    int64_t want = 1;
    for (int k = 0; k < t->ndim; k++) {
        int best = -1;
        for (int i = 0; i < t->ndim; i++)
            if (!used[i] && t->shape[i] > 1 && (best < 0 || t->stride[i] < t->stride[best]))
                best = i;
        if (best < 0)
            break;
        used[best] = true;
        if (t->stride[best] != want)
            return false;
        want *= t->shape[best];
    }
    return true;
}

static int bwd_sdpa(nt__bctx *b)
{
    if (b->create && G && nt_requires_grad(G) | nt_requires_grad(IN(0)) | nt_requires_grad(IN(1)) |
                              nt_requires_grad(IN(2)))
        return bwd_sdpa_graph(b);
    nt_tensor *q = IN(0), *k = IN(1), *v = IN(2), *mask = IN(3), *o = OUT(0), *lse = OUT(1);
    nt_tensor *g = G;
    if (!g)
        return 0;
    TRY(q && k && v && o && lse); /* (a create_graph pass's handles: out of memory) */
    int nd = q->ndim;
    TRY(o = sdpa_heads_back(b, o));
    TRY(g = sdpa_heads_back(b, g));
    int64_t D = q->shape[nd - 1], Dv = v->shape[nd - 1];
    if (g->dtype != o->dtype)
        TRY(g = nt_cast_at(S, g, (nt_dtype)o->dtype));
    int64_t Tq = q->shape[nd - 2], Tk = k->shape[nd - 2], fs[NT_MAX_DIMS];
    for (int i = 0; i < nd - 2; i++)
        fs[i] = q->shape[i];
    nt_tensor *f[3] = {q, g, o}, *fk[2] = {k, v};
    nt_tensor *qx = NULL, *kv = NULL, *qkv = NULL;
    if (!mask && D == Dv && Tq == Tk && !g->expanded && !o->expanded)
        qkv = sdpa_qkv_view(b, q, k, v);
    if (qkv) {
        /* read where they are: no packing copies */
    } else if (D == Dv) {
        /* Blocks of one width: cat along the rows lays them out as the
         * flattened blocks' cat does, and a permuted q, k, v (heads of one
         * projection) is copied once, not first by its reshape. */
        TRY(qx = nt_cat_at(S, f, 3, nd - 2));
        TRY(kv = nt_cat_at(S, fk, 2, nd - 2));
        fs[nd - 2] = Tq * (D + 2 * Dv);
        TRY(qx = nt_reshape_at(S, qx, nd - 1, fs));
        fs[nd - 2] = Tk * (D + Dv);
        TRY(kv = nt_reshape_at(S, kv, nd - 1, fs));
    } else {
        int64_t qn[3] = {Tq * D, Tq * Dv, Tq * Dv}, kn[2] = {Tk * D, Tk * Dv};
        for (int i = 0; i < 3; i++) {
            fs[nd - 2] = qn[i];
            TRY(f[i] = nt_reshape_at(S, f[i], nd - 1, fs));
        }
        for (int i = 0; i < 2; i++) {
            fs[nd - 2] = kn[i];
            TRY(fk[i] = nt_reshape_at(S, fk[i], nd - 1, fs));
        }
        TRY(qx = nt_cat_at(S, f, 3, nd - 2));
        TRY(kv = nt_cat_at(S, fk, 2, nd - 2));
    }
    nt__call c;
    nt_tensor *in[4] = {qx, kv, lse, mask}, *ins[4] = {qkv, g, o, lse};
    if (!nt__call_begin(&c, S, "nt_scaled_dot_product_attention", NT_OP_SDPA_BWD, 4,
                        qkv ? ins : in, qkv ? "qkv,dO,O,lse" : "qx,kv,lse,?mask"))
        return nt_last_error();
    c.no_grad = true;
    c.p = b->n->p;
    c.p.i[0] = D;
    c.p.i[1] = Dv;
    c.p.i[2] = Tq;
    c.p.i[3] = Tk;
    c.p.i[4] = qkv != NULL;
    /* f32 q, k, v of one dense block (the heads of one projection):
     * dq, dk, dv written where q, k, v lie, into one buffer that becomes
     * the projection's gradient (nt__bctx.placed) -- no copies into it.
     * f32 only: the kernels' sums start from +0 and so are never -0, the
     * + 0 of a slice-gradient buffer's definition (autograd/tape.c, struct
     * scat) changes nothing; a bf16 or f16 rounding can give -0. */
    bool placed = qkv && q->dtype == NT_F32 && q->stride[nd - 1] == 1 && sdpa_dense(qkv);
    c.p.i[5] = placed;
    c.nout = 2;
    c.odt[0] = c.odt[1] = (nt_dtype)q->dtype;
    c.ondim[0] = nd;
    c.ondim[1] = nd - 1;
    for (int i = 0; i < nd - 2; i++)
        c.oshape[0][i] = c.oshape[1][i] = q->shape[i];
    c.oshape[0][nd - 2] = Tq;
    c.oshape[0][nd - 1] = D;
    c.oshape[1][nd - 2] = Tk * (D + Dv);
    c.flops = 4.0 * (double)nt__numel(nd - 2, q->shape) * (double)q->shape[nd - 2] *
              (double)k->shape[nd - 2] * (double)(D + Dv);
    if (placed) {
        c.nout = 1;
        c.ondim[0] = 1;
        c.oshape[0][0] = 3 * nt__numel(nd, q->shape);
    }
    nt_tensor *dq;
    TRY(dq = nt__dispatch(&c));
    if (placed) {
        nt_tensor *t[3] = {q, k, v};
        for (int i = 0; i < 3; i++) {
            if (!LIVE(i))
                continue;
            nt_tensor *w = nt__make_view(dq, nd, t[i]->shape, t[i]->stride,
                                         dq->offset + t[i]->offset - q->offset, S);
            TRY(w && (b->gin[i] = nt__scope_adopt(w, "nt_backward")));
        }
        b->placed = dq;
        return 0;
    }
    nt_tensor *dkv = c.out[1];
    if (LIVE(0))
        b->gin[0] = dq;
    int64_t ks[NT_MAX_DIMS];
    for (int i = 0; i < nd - 2; i++)
        ks[i] = q->shape[i];
    ks[nd - 2] = Tk;
    if (LIVE(1)) {
        ks[nd - 1] = D;
        TRY(b->gin[1] = nt_reshape_at(S, nt_slice_at(S, dkv, nd - 2, 0, Tk * D, 1), nd, ks));
    }
    if (LIVE(2)) {
        ks[nd - 1] = Dv;
        TRY(b->gin[2] = nt_reshape_at(S, nt_slice_at(S, dkv, nd - 2, Tk * D, Tk * (D + Dv), 1),
                                      nd, ks));
    }
    return 0;
}

/* ---------------- double backward of the helpers ---------------- */

/* The backward helpers of relu, tanh, sigmoid, gelu and silu, h(g, v) =
 * g * f'(v), recorded by a create_graph pass: d/dg is h(gg, v) itself (the
 * same kernel, so the same bits as a first backward), d/dv is gg * g *
 * f''(v) from ordinary ops, each as PyTorch 1.13's derivatives.yaml writes
 * it (threshold_backward, tanh_backward, sigmoid_backward,
 * gelu_double_backward, silu_double_backward); both summed back over
 * broadcast dims.  They record in turn: third derivatives follow. */
static int helper_dg(nt__bctx *b)
{
    int op = b->n->op;
    if (LIVE(0))
        TRY(b->gin[0] = reduce_to(b, nt__binary(S, nt__op_api(op), op, G, IN(1)), META(0)));
    return 0;
}
/* gg * g * f''(v), f'' given as t */
static int helper_dv(nt__bctx *b, nt_tensor *t)
{
    TRY(b->gin[1] = reduce_to(b, nt_mul_at(S, nt_mul_at(S, G, IN(0)), t), META(1)));
    return 0;
}
static int bwd_relu_bwd(nt__bctx *b) /* d/dy: 0 (zeros, as PyTorch) */
{
    const nt__tmeta *m = META(1);
    if (LIVE(1))
        TRY(b->gin[1] = nt_zeros_at(S, (nt_dtype)m->dtype, m->ndim, m->shape));
    return helper_dg(b);
}
static int bwd_tanh_bwd(nt__bctx *b) /* d/dy: gg ((-2 y) g) */
{
    if (LIVE(1))
        TRY(b->gin[1] = reduce_to(
                b, nt_mul_at(S, G, nt_mul_at(S, nt_mul_scalar_at(S, IN(1), -2.0), IN(0))),
                META(1)));
    return helper_dg(b);
}
static int bwd_sigmoid_bwd(nt__bctx *b) /* d/dy: (gg g) (-2 y + 1) */
{
    if (LIVE(1) && helper_dv(b, nt_add_scalar_at(S, nt_mul_scalar_at(S, IN(1), -2.0), 1.0)))
        return nt_last_error();
    return helper_dg(b);
}
/* d/dx: (gg g) (phi(x) (2 - x^2)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
static int bwd_gelu_bwd(nt__bctx *b)
{
    if (LIVE(1)) {
        nt_tensor *x = IN(1), *x2, *pdf;
        TRY(x2 = nt_mul_at(S, x, x));
        TRY(pdf = nt_mul_scalar_at(S, nt_exp_at(S, nt_mul_scalar_at(S, x2, -0.5)),
                                   0.39894228040143267794));
        if (helper_dv(b, nt_mul_at(S, pdf, nt_add_scalar_at(S, nt_neg_at(S, x2), 2.0))))
            return nt_last_error();
    }
    return helper_dg(b);
}
/* d/dx: (gg g) (s (1 - s)) (2 + x (1 - 2 s)), s = sigmoid(x) */
static int bwd_silu_bwd(nt__bctx *b)
{
    if (LIVE(1)) {
        nt_tensor *x = IN(1), *s, *t, *u;
        TRY(s = nt_sigmoid_at(S, x));
        TRY(t = nt_mul_at(S, s, nt_add_scalar_at(S, nt_neg_at(S, s), 1.0)));
        TRY(u = nt_add_scalar_at(
                S, nt_mul_at(S, x, nt_add_scalar_at(S, nt_mul_scalar_at(S, s, -2.0), 1.0)), 2.0));
        if (helper_dv(b, nt_mul_at(S, t, u)))
            return nt_last_error();
    }
    return helper_dg(b);
}

/* UNARY_BWD(g, v) = g * d(v), d = nt__ew_<f>_dx, recorded by a
 * create_graph pass (bwd_dx): d/dg is UNARY_BWD(gg, v) itself (the same
 * kernel: a create_graph pass's first gradients keep a plain pass's bits),
 * d/dv is gg * g * d'(v), d' from ordinary ops (PyTorch 1.13's
 * derivatives.yaml where it has the op).  v is x or y as f's save column
 * says, so d' is the derivative of d in that variable: reciprocal's d(y) =
 * -y^2 gives -2y, expm1's d(y) = y + 1 gives 1. */
static nt_tensor *one_minus(nt__bctx *b, nt_tensor *t)
{
    return t ? nt_add_scalar_at(S, nt_neg_at(S, t), 1.0) : NULL;
}
static nt_tensor *unary_dd(nt__bctx *b, int f, nt_tensor *v)
{
    nt_tensor *t, *s, *u;
    switch (f) {
    case NT_OP_SIN: /* d = cos x */
        return nt_neg_at(S, nt_sin_at(S, v));
    case NT_OP_COS: /* d = -sin x */
        return nt_neg_at(S, nt_cos_at(S, v));
    case NT_OP_ERF: /* d = 2/sqrt(pi) exp(-x^2): d' = -2x d */
        return nt_mul_at(S, nt_mul_scalar_at(S, v, -2.0 * 1.12837916709551257390),
                         nt_exp_at(S, nt_neg_at(S, nt_mul_at(S, v, v))));
    case NT_OP_LOG1P: /* d = 1/(1 + x): d' = -d^2 */
        return (t = nt_reciprocal_at(S, nt_add_scalar_at(S, v, 1.0))) ? nt_neg_at(S, nt_mul_at(S, t, t))
                                                                       : NULL;
    case NT_OP_EXPM1: /* d = y + 1 */
        return nt_ones_at(S, (nt_dtype)v->dtype, v->ndim, v->shape);
    case NT_OP_RECIPROCAL: /* d = -y^2 */
        return nt_mul_scalar_at(S, v, -2.0);
    case NT_OP_SOFTPLUS: /* d = x > 20 ? 1 : s: d' = x > 20 ? 0 : s (1 - s) */
        if (!(s = nt_sigmoid_at(S, v)) || !(t = zero0d(b, v)))
            return NULL;
        return nt_where_at(S, nt_gt_at(S, v, nt_full_at(S, (nt_dtype)v->dtype, 0, NULL, 20.0)), t,
                           nt_mul_at(S, s, one_minus(b, s)));
    case NT_OP_SOFTSIGN: /* d = (1 + |x|)^-2: d' = -2 sgn(x) (1 + |x|)^-3 */
        if (!(t = nt_reciprocal_at(S, nt_add_scalar_at(S, nt_abs_at(S, v), 1.0))))
            return NULL;
        return nt_mul_at(S, nt_mul_scalar_at(S, sgn(b, v), -2.0),
                         nt_mul_at(S, t, nt_mul_at(S, t, t)));
    case NT_OP_MISH: /* t = tanh(softplus x), s = sigmoid x:
                        d' = (1 - t^2) s (2 + x (1 - s (2 t + 1))) */
        if (!(t = nt_tanh_at(S, nt_softplus_at(S, v))) || !(s = nt_sigmoid_at(S, v)))
            return NULL;
        u = one_minus(b, nt_mul_at(S, s, nt_add_scalar_at(S, nt_mul_scalar_at(S, t, 2.0), 1.0)));
        return nt_mul_at(S, nt_mul_at(S, one_minus(b, nt_mul_at(S, t, t)), s),
                         nt_add_scalar_at(S, nt_mul_at(S, v, u), 2.0));
    case NT_OP_GELU_TANH: { /* u = c (x + k x^3), t = tanh u:
                               d' = (1 - t^2) (u' + x/2 (u'' - 2 t u'^2)) */
        const double c = 0.79788456080286535588, k = 0.044715;
        nt_tensor *x2, *x3, *du, *ddu;
        if (!(x2 = nt_mul_at(S, v, v)) || !(x3 = nt_mul_at(S, x2, v)) ||
            !(t = nt_tanh_at(S, nt_mul_scalar_at(S, nt_add_at(S, v, nt_mul_scalar_at(S, x3, k)), c))) ||
            !(du = nt_mul_scalar_at(S, nt_add_scalar_at(S, nt_mul_scalar_at(S, x2, 3.0 * k), 1.0), c)) ||
            !(ddu = nt_mul_scalar_at(S, v, 6.0 * k * c)))
            return NULL;
        u = nt_sub_at(S, ddu, nt_mul_at(S, nt_mul_scalar_at(S, t, 2.0), nt_mul_at(S, du, du)));
        return nt_mul_at(S, one_minus(b, nt_mul_at(S, t, t)),
                         nt_add_at(S, du, nt_mul_at(S, nt_mul_scalar_at(S, v, 0.5), u)));
    }
    case NT_OP_LEAKY_RELU: /* piecewise constant d */
    case NT_OP_HARDTANH:
        return nt_zeros_at(S, (nt_dtype)v->dtype, v->ndim, v->shape);
    default:
        nt__dbl_of = nt__op_name(f);
        nt__dbl_refuse(S, "its derivative has no derivative of its own yet");
        return NULL;
    }
}
static int bwd_unary_bwd(nt__bctx *b)
{
    const nt__params *p = &b->n->p;
    int f = p->i[0];
    if (LIVE(1))
        TRY(b->gin[1] = nt_mul_at(S, nt_mul_at(S, G, IN(0)), unary_dd(b, f, IN(1))));
    if (LIVE(0))
        TRY(b->gin[0] = unary_bwd(b, f, p, G, IN(1)));
    return 0;
}

/* ---------------- the table ---------------- */

/* Generated from the bwd and save columns of core/optable.h: op ->
 * {saved inputs, saved outputs, bwd_<bwd>[, the helper op]}. */
#define bwd_nograd NULL
#define bwd_helper(H) bwd_by_helper, NT_OP_##H
#define NT__BWD_ROW(ID, name, nin, kind, flags, ints, amp, bwd, save, sim)                   \
    [NT_OP_##ID] = {NT__SAVE_##save, bwd_##bwd},

/* Unsized (autograd/autograd.h too): the assert sees a missing last row. */
const nt__bwd_entry nt__bwd_table[] = {NT_OP_TABLE(NT__BWD_ROW)};
#undef NT__BWD_ROW
#undef bwd_helper
_Static_assert(sizeof nt__bwd_table / sizeof nt__bwd_table[0] == NT_OP_COUNT,
               "backward table out of step with the op table");
