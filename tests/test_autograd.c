/* tests/test_autograd.c - the tape, every op's backward against finite
 * differences (nt_gradcheck), hand-checked gradients, accumulation, no-grad,
 * in-place rules, error paths, user ops, and mode invariance. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "core/optable.h"
#include "nt_test.h"

/* A leaf with pseudo-random values in [lo, hi). */
static nt_tensor *leaf(int ndim, const int64_t *shape, double lo, double hi, uint64_t seed)
{
    nt_tensor *u = nt_rand(NT_F32, ndim, shape, seed);
    nt_tensor *x = nt_add_scalar(nt_mul_scalar(u, hi - lo), lo);
    nt_tensor *d = nt_detach(x);
    nt_set_requires_grad(d, true);
    nt_release(u);
    nt_release(x);
    return d;
}

static void grad_ok(nt_tensor *(*f)(nt_tensor *const *, void *), nt_tensor *const *in, int n,
                    void *ctx)
{
    int rc = nt_gradcheck(f, in, n, ctx, 1e-2, 2e-2, 2e-2);
    if (rc)
        print_error("%s\n", nt_last_error_message());
    assert_int_equal(rc, 0);
}

/* ---------------- gradcheck of every op ---------------- */

typedef struct {
    int which;
    int dim;
    double s0, s1;
} opctx;

enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_MAXIMUM, BIN_MINIMUM };

static nt_tensor *f_binary(nt_tensor *const *x, void *c)
{
    switch (((opctx *)c)->which) {
    case BIN_ADD: return nt_add(x[0], x[1]);
    case BIN_SUB: return nt_sub(x[0], x[1]);
    case BIN_MUL: return nt_mul(x[0], x[1]);
    case BIN_DIV: return nt_div(x[0], x[1]);
    case BIN_MAXIMUM: return nt_maximum(x[0], x[1]);
    default: return nt_minimum(x[0], x[1]);
    }
}

static void test_binary_broadcast(void **state)
{
    (void)state;
    /* same shape, and [3,1] with [4] broadcasting to [3,4] */
    int64_t s34[2] = {3, 4}, s31[2] = {3, 1}, s4[1] = {4};
    for (int op = BIN_ADD; op <= BIN_MINIMUM; op++) {
        opctx c = {op, 0, 0, 0};
        double lo = op == BIN_DIV ? 0.5 : -2;
        nt_tensor *a = leaf(2, s34, lo, 2, 10 + op), *b = leaf(2, s34, lo, 2, 20 + op);
        if (op == BIN_MAXIMUM || op == BIN_MINIMUM) {
            /* values on a grid 0.25 apart, a and b interleaved: no ties
             * within the finite-difference step */
            float av[12], bv[12], pv[3], qv[4];
            for (int k = 0; k < 12; k++) {
                av[k] = (float)((k * 7) % 12) * 0.25f - 1.5f;
                bv[k] = (float)((k * 5) % 12) * 0.25f - 1.375f;
            }
            for (int k = 0; k < 3; k++)
                pv[k] = (float)k * 0.5f - 0.5f;
            for (int k = 0; k < 4; k++)
                qv[k] = (float)k * 0.5f - 0.875f;
            nt_release(a), nt_release(b);
            a = nt_from_host(av, NT_F32, 2, s34), b = nt_from_host(bv, NT_F32, 2, s34);
            nt_set_requires_grad(a, true), nt_set_requires_grad(b, true);
            nt_tensor *in0[2] = {a, b};
            grad_ok(f_binary, in0, 2, &c);
            nt_tensor *p = nt_from_host(pv, NT_F32, 2, s31), *q = nt_from_host(qv, NT_F32, 1, s4);
            nt_set_requires_grad(p, true), nt_set_requires_grad(q, true);
            nt_tensor *in1[2] = {p, q};
            grad_ok(f_binary, in1, 2, &c);
            nt_release(a), nt_release(b), nt_release(p), nt_release(q);
            continue;
        }
        nt_tensor *in[2] = {a, b};
        grad_ok(f_binary, in, 2, &c);
        nt_tensor *p = leaf(2, s31, lo, 2, 30 + op), *q = leaf(1, s4, lo, 2, 40 + op);
        nt_tensor *in2[2] = {p, q};
        grad_ok(f_binary, in2, 2, &c);
        nt_release(a), nt_release(b), nt_release(p), nt_release(q);
    }
}

enum { UN_NEG, UN_EXP, UN_LOG, UN_SQRT, UN_RSQRT, UN_ABS, UN_RELU, UN_GELU, UN_SIGMOID, UN_TANH,
       UN_SILU, UN_ADDS, UN_MULS, UN_DIVS, UN_POWS, UN_CLAMP, UN_CAST, UN_CONTIG, UN_COUNT };
/* The ops added since (softplus, mish, reciprocal; leaky_relu, hardtanh)
 * are gradchecked by tests/test_conformance.c, which runs every
 * differentiable op of the table. */

static nt_tensor *f_unary(nt_tensor *const *x, void *cp)
{
    opctx *c = cp;
    nt_tensor *t = x[0];
    switch (c->which) {
    case UN_NEG: return nt_neg(t);
    case UN_EXP: return nt_exp(t);
    case UN_LOG: return nt_log(t);
    case UN_SQRT: return nt_sqrt(t);
    case UN_RSQRT: return nt_rsqrt(t);
    case UN_ABS: return nt_abs(t);
    case UN_RELU: return nt_relu(t);
    case UN_GELU: return nt_gelu(t);
    case UN_SIGMOID: return nt_sigmoid(t);
    case UN_TANH: return nt_tanh(t);
    case UN_SILU: return nt_silu(t);
    case UN_ADDS: return nt_add_scalar(t, 1.25);
    case UN_MULS: return nt_mul_scalar(t, -1.5);
    case UN_DIVS: return nt_div_scalar(t, 3.0);
    case UN_POWS: return nt_pow_scalar(t, 2.5);
    case UN_CLAMP: return nt_clamp(t, -0.5, 0.75);
    case UN_CAST: return nt_cast(nt_cast(t, NT_F16), NT_F32);
    default: return nt_contiguous(nt_transpose(t, 0, 1));
    }
}

static void test_unary_and_scalar(void **state)
{
    (void)state;
    int64_t s[2] = {3, 5};
    for (int op = 0; op < UN_COUNT; op++) {
        opctx c = {op, 0, 0, 0};
        bool pos = op == UN_LOG || op == UN_SQRT || op == UN_RSQRT || op == UN_POWS;
        nt_tensor *x = leaf(2, s, pos ? 0.5 : -2, 2, 100 + op);
        nt_tensor *in[1] = {x};
        if (op == UN_CAST) /* f16 rounding: a looser bound */
            assert_int_equal(nt_gradcheck(f_unary, in, 1, &c, 5e-2, 5e-2, 5e-2), 0);
        else
            grad_ok(f_unary, in, 1, &c);
        nt_release(x);
    }
}

static nt_tensor *f_where(nt_tensor *const *x, void *c)
{
    (void)c;
    nt_tensor *cond = nt_gt(x[2], nt_zeros(NT_F32, 0, NULL));
    return nt_where(cond, x[0], x[1]);
}

static void test_where(void **state)
{
    (void)state;
    int64_t s[2] = {4, 3}, sb[1] = {3};
    nt_tensor *a = leaf(2, s, -1, 1, 1), *b = leaf(1, sb, -1, 1, 2), *c = leaf(2, s, -1, 1, 3);
    nt_tensor *in[3] = {a, b, c};
    grad_ok(f_where, in, 3, NULL);
    nt_release(a), nt_release(b), nt_release(c);
}

enum { R_SUM, R_MEAN, R_MAX, R_MIN };

static nt_tensor *f_reduce(nt_tensor *const *x, void *cp)
{
    opctx *c = cp;
    bool keep = c->s0 != 0;
    switch (c->which) {
    case R_SUM: return nt_sum(x[0], c->dim, keep);
    case R_MEAN: return nt_mean(x[0], c->dim, keep);
    case R_MAX: return nt_max(x[0], c->dim, keep);
    default: return nt_min(x[0], c->dim, keep);
    }
}

static void test_reductions(void **state)
{
    (void)state;
    int64_t s[3] = {2, 3, 4};
    int dims[] = {0, 1, -1, NT_DIM_ALL};
    for (int op = R_SUM; op <= R_MIN; op++)
        for (int d = 0; d < 4; d++)
            for (int keep = 0; keep < 2; keep++) {
                opctx c = {op, dims[d], keep, 0};
                nt_tensor *x = leaf(3, s, -2, 2, 200 + op * 10 + d);
                nt_tensor *in[1] = {x};
                grad_ok(f_reduce, in, 1, &c);
                nt_release(x);
            }
}

enum { ROW_SOFTMAX, ROW_LOGSOFTMAX, ROW_LN, ROW_LN_NOAFFINE, ROW_RMS, ROW_RMS_NOW };

static nt_tensor *f_row(nt_tensor *const *x, void *cp)
{
    opctx *c = cp;
    switch (c->which) {
    case ROW_SOFTMAX: return nt_softmax(x[0], c->dim);
    case ROW_LOGSOFTMAX: return nt_log_softmax(x[0], c->dim);
    case ROW_LN: return nt_layer_norm(x[0], x[1], x[2], 1e-5);
    case ROW_LN_NOAFFINE: return nt_layer_norm(x[0], NULL, NULL, 1e-5);
    case ROW_RMS: return nt_rms_norm(x[0], x[1], 1e-6);
    default: return nt_rms_norm(x[0], NULL, 1e-6);
    }
}

static void test_rows(void **state)
{
    (void)state;
    int64_t s[2] = {3, 5}, sw[1] = {5};
    for (int d = 0; d < 2; d++)
        for (int op = ROW_SOFTMAX; op <= ROW_LOGSOFTMAX; op++) {
            opctx c = {op, d, 0, 0};
            nt_tensor *x = leaf(2, s, -2, 2, 300 + op + d);
            nt_tensor *in[1] = {x};
            grad_ok(f_row, in, 1, &c);
            nt_release(x);
        }
    for (int op = ROW_LN; op <= ROW_RMS_NOW; op++) {
        opctx c = {op, -1, 0, 0};
        nt_tensor *x = leaf(2, s, -2, 2, 310 + op), *w = leaf(1, sw, 0.5, 1.5, 320 + op),
                  *b = leaf(1, sw, -1, 1, 330 + op);
        nt_tensor *in[3] = {x, w, b};
        int n = op == ROW_LN ? 3 : op == ROW_RMS ? 2 : 1;
        grad_ok(f_row, in, n, &c);
        nt_release(x), nt_release(w), nt_release(b);
    }
}

static nt_tensor *f_ce(nt_tensor *const *x, void *c)
{
    int32_t lab[4] = {2, 0, 4, 1};
    nt_tensor *labels = nt_from_host(lab, NT_I32, 1, (int64_t[]){4});
    (void)c;
    return nt_cross_entropy(x[0], labels);
}
static nt_tensor *f_mse(nt_tensor *const *x, void *c)
{
    (void)c;
    return nt_mse_loss(x[0], x[1]);
}

static void test_losses(void **state)
{
    (void)state;
    int64_t s[2] = {4, 5};
    nt_tensor *x = leaf(2, s, -2, 2, 400), *y = leaf(2, s, -2, 2, 401);
    nt_tensor *in[2] = {x, y};
    grad_ok(f_ce, in, 1, NULL);
    grad_ok(f_mse, in, 2, NULL);
    nt_release(x), nt_release(y);
}

static nt_tensor *f_matmul(nt_tensor *const *x, void *c)
{
    (void)c;
    return nt_matmul(x[0], x[1]);
}
static nt_tensor *f_linear(nt_tensor *const *x, void *c)
{
    return nt_linear(x[0], x[1], c ? x[2] : NULL);
}

static void test_matmul_family(void **state)
{
    (void)state;
    struct {
        int na, nb;
        int64_t a[3], b[3];
    } cases[] = {
        {2, 2, {3, 4}, {4, 2}},          /* plain */
        {3, 2, {2, 3, 4}, {4, 5}},       /* batched with a broadcast matrix */
        {3, 3, {1, 3, 4}, {2, 4, 2}},    /* broadcast batch dim */
        {1, 2, {4}, {4, 3}},             /* vector . matrix */
        {2, 1, {3, 4}, {4}},             /* matrix . vector */
        {1, 1, {4}, {4}},                /* dot */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        nt_tensor *a = leaf(cases[k].na, cases[k].a, -1, 1, 500 + k);
        nt_tensor *b = leaf(cases[k].nb, cases[k].b, -1, 1, 510 + k);
        nt_tensor *in[2] = {a, b};
        grad_ok(f_matmul, in, 2, NULL);
        nt_release(a), nt_release(b);
    }
    int64_t sx[2] = {3, 4}, sw[2] = {2, 4}, sb[1] = {2};
    nt_tensor *x = leaf(2, sx, -1, 1, 520), *w = leaf(2, sw, -1, 1, 521), *b = leaf(1, sb, -1, 1, 522);
    nt_tensor *in[3] = {x, w, b};
    grad_ok(f_linear, in, 3, (void *)1);
    grad_ok(f_linear, in, 2, NULL);
    nt_release(x), nt_release(w), nt_release(b);
}

static nt_tensor *f_embed(nt_tensor *const *x, void *c)
{
    (void)c;
    int32_t ix[5] = {3, 0, 3, 1, 3}; /* repeats accumulate */
    return nt_embedding(x[0], nt_from_host(ix, NT_I32, 2, (int64_t[]){5, 1}));
}

static void test_embedding(void **state)
{
    (void)state;
    int64_t s[2] = {4, 3};
    nt_tensor *w = leaf(2, s, -1, 1, 600);
    nt_tensor *in[1] = {w};
    grad_ok(f_embed, in, 1, NULL);
    nt_release(w);
}

enum { V_RESHAPE, V_TRANSPOSE, V_PERMUTE, V_SLICE, V_EXPAND, V_CAT, V_COUNT };

static nt_tensor *f_view(nt_tensor *const *x, void *cp)
{
    opctx *c = cp;
    nt_tensor *t = x[0];
    switch (c->which) {
    case V_RESHAPE: return nt_mul(nt_reshape(t, 2, (int64_t[]){4, -1}), nt_reshape(t, 2, (int64_t[]){4, 6}));
    case V_TRANSPOSE: return nt_exp(nt_transpose(t, 0, 2));
    case V_PERMUTE: return nt_tanh(nt_permute(t, (int[]){2, 0, 1}));
    case V_SLICE: return nt_mul_scalar(nt_slice(t, 2, 1, 4, 2), 3.0);
    case V_EXPAND: {
        nt_tensor *s = nt_slice(t, 0, 0, 1, 1); /* [1, 3, 4] */
        return nt_mul(nt_expand(s, 3, (int64_t[]){5, 3, 4}), nt_ones(NT_F32, 1, (int64_t[]){4}));
    }
    case V_CAT: {
        nt_tensor *parts[3] = {t, nt_neg(t), nt_slice(t, 1, 0, 1, 1)};
        return nt_cat(parts, 3, 1);
    }
    default:
        return NULL;
    }
}

static void test_views(void **state)
{
    (void)state;
    int64_t s[3] = {2, 3, 4};
    for (int v = 0; v < V_COUNT; v++) {
        opctx c = {v, 0, 0, 0};
        nt_tensor *x = leaf(3, s, -1, 1, 700 + v);
        nt_tensor *in[1] = {x};
        grad_ok(f_view, in, 1, &c);
        nt_release(x);
    }
}

/* ---------------- issue 15's ops ---------------- */

static const double NORM_ORDS[] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5, -1.5};

/* x in [0.3, 1.5) with fixed signs: away from 0, where |x|^p is smooth */
static nt_tensor *f_norm(nt_tensor *const *x, void *cp)
{
    opctx *c = cp;
    float sg[24];
    for (int i = 0; i < 24; i++)
        sg[i] = (i * 7) % 3 ? 1.0f : -1.0f;
    nt_tensor *s = nt_from_host(sg, NT_F32, 3, (int64_t[]){2, 3, 4});
    return nt_norm(nt_mul(x[0], s), c->s1, c->dim, c->s0 != 0);
}

enum { G_GATHER0, G_GATHER2, G_SELECT, G_REPEAT, G_SPLIT, G_COUNT };

static nt_tensor *f_index(nt_tensor *const *x, void *cp)
{
    opctx *c = cp;
    nt_tensor *t = x[0]; /* [2, 3, 4] */
    switch (c->which) {
    case G_GATHER0: { /* repeated indices accumulate */
        int32_t ix[12] = {1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1};
        return nt_gather(t, 0, nt_from_host(ix, NT_I32, 3, (int64_t[]){1, 3, 4}));
    }
    case G_GATHER2: {
        uint8_t ix[12] = {3, 3, 0, 2, 1, 3, 3, 3, 0, 0, 2, 1};
        return nt_gather(t, -1, nt_from_host(ix, NT_U8, 3, (int64_t[]){2, 3, 2}));
    }
    case G_SELECT: {
        int32_t ix[5] = {2, 0, 2, 2, 1};
        return nt_index_select(t, 1, nt_from_host(ix, NT_I32, 1, (int64_t[]){5}));
    }
    case G_REPEAT: return nt_repeat(nt_transpose(t, 0, 2), (int64_t[]){2, 1, 3, 2}, 4);
    case G_SPLIT: {
        nt_tensor *p[3];
        if (nt_split(t, 3, 2, p, 3) != 2)
            return NULL;
        /* [2, 3, 3] and [2, 3, 1]: different weights so each part's grad shows */
        return nt_add(nt_mul_scalar(p[0], 2.0), nt_exp(p[1]));
    }
    default: return NULL;
    }
}

static void test_new_ops_gradcheck(void **state)
{
    (void)state;
    int64_t s[3] = {2, 3, 4};
    int dims[] = {0, -1, NT_DIM_ALL};
    for (size_t o = 0; o < sizeof NORM_ORDS / sizeof *NORM_ORDS; o++)
        for (int d = 0; d < 3; d++) {
            opctx c = {0, dims[d], d == 1, NORM_ORDS[o]};
            nt_tensor *x = leaf(3, s, 0.3, 1.5, 800 + o * 3 + d);
            nt_tensor *in[1] = {x};
            grad_ok(f_norm, in, 1, &c);
            nt_release(x);
        }
    for (int g = 0; g < G_COUNT; g++) {
        opctx c = {g, 0, 0, 0};
        nt_tensor *x = leaf(3, s, -1, 1, 900 + g);
        nt_tensor *in[1] = {x};
        grad_ok(f_index, in, 1, &c);
        nt_release(x);
    }
}

static void grad_of(nt_tensor *x, nt_tensor *y, float *out, int64_t n)
{
    nt_zero_grad(x);
    nt_scope *s = nt_scope_begin();
    assert_int_equal(nt_backward(nt_sum(y, NT_DIM_ALL, false)), 0);
    nt_tensor *g = nt_grad(x);
    assert_int_equal(nt_to_host(g, out, (size_t)n * sizeof(float)), 0);
    nt_release(g);
    nt_scope_end(s);
}

/* The subgradients at the kinks, as PyTorch's norm_backward gives them. */
static void test_norm_min_subgradients(void **state)
{
    (void)state;
    float z[4] = {0, 0, 0, 0}, t[4] = {3, -3, 1, 0}, got[4];
    nt_tensor *x0 = nt_from_host(z, NT_F32, 1, (int64_t[]){4});
    nt_tensor *xt = nt_from_host(t, NT_F32, 1, (int64_t[]){4});
    nt_set_requires_grad(x0, true);
    nt_set_requires_grad(xt, true);
    const double ords[] = {2, 1, 3, 1.5, 0.5, 0};
    for (int k = 0; k < 6; k++) { /* a zero vector: 0, not NaN */
        grad_of(x0, nt_norm(x0, ords[k], 0, false), got, 4);
        assert_memory_equal(got, ((float[]){0, 0, 0, 0}), sizeof got);
    }
    /* ord 1: sgn(x), 0 at 0 */
    grad_of(xt, nt_norm(xt, 1, 0, false), got, 4);
    assert_memory_equal(got, ((float[]){1, -1, 1, 0}), sizeof got);
    /* inf: the two elements with |x| = 3 share g evenly, with their signs */
    grad_of(xt, nt_norm(xt, INFINITY, 0, false), got, 4);
    assert_memory_equal(got, ((float[]){0.5f, -0.5f, 0, 0}), sizeof got);
    /* -inf: the zero element; sgn(0) = 0 */
    grad_of(xt, nt_norm(xt, -INFINITY, 0, false), got, 4);
    assert_memory_equal(got, ((float[]){0, 0, 0, 0}), sizeof got);
    /* ord 0.5 with a zero element: 0 there, finite elsewhere */
    grad_of(xt, nt_norm(xt, 0.5, 0, false), got, 4);
    assert_true(got[3] == 0 && isfinite(got[0]) && got[0] > 0 && got[1] < 0);
    /* ord 2: x / |x| */
    grad_of(xt, nt_norm(xt, 2, 0, false), got, 4);
    double n2 = sqrt(19.0);
    assert_true(fabs(got[0] - 3 / n2) < 1e-6 && fabs(got[1] + 3 / n2) < 1e-6 && got[3] == 0);
    /* min with a tie: the first minimum gets g (the element nt_argmin picks) */
    float m[4] = {2, -1, 5, -1};
    nt_tensor *xm = nt_from_host(m, NT_F32, 1, (int64_t[]){4});
    nt_set_requires_grad(xm, true);
    grad_of(xm, nt_min(xm, 0, false), got, 4);
    assert_memory_equal(got, ((float[]){0, 1, 0, 0}), sizeof got);
    /* gather with a repeated index: the grads add up */
    int32_t ix[3] = {2, 2, 0};
    nt_tensor *gi = nt_from_host(ix, NT_I32, 1, (int64_t[]){3});
    grad_of(xm, nt_gather(xm, 0, gi), got, 4);
    assert_memory_equal(got, ((float[]){1, 0, 2, 0}), sizeof got);
    grad_of(xm, nt_index_select(xm, 0, gi), got, 4);
    assert_memory_equal(got, ((float[]){1, 0, 2, 0}), sizeof got);
    grad_of(xm, nt_repeat(xm, (int64_t[]){3, 2}, 2), got, 4);
    assert_memory_equal(got, ((float[]){6, 6, 6, 6}), sizeof got);
    nt_release(x0), nt_release(xt), nt_release(xm), nt_release(gi);
}

/* The new ops' gradients: the same bits in every mode. */
static void new_grads_in_mode(const char *mode, float *out)
{
    nt_config_set("NT_MODE", mode);
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){6, 40}, 3);
    nt_set_requires_grad(x, true);
    int32_t ix[240];
    for (int i = 0; i < 240; i++)
        ix[i] = (i * 7 + i / 40) % 6;
    nt_tensor *idx = nt_from_host(ix, NT_I32, 2, (int64_t[]){6, 40});
    nt_scope *s = nt_scope_begin();
    nt_tensor *y = nt_mul(nt_gather(x, 0, idx), nt_repeat(nt_min(x, 0, true), (int64_t[]){6, 1}, 2));
    nt_tensor *loss = nt_add(nt_sum(nt_norm(y, 3, 1, false), NT_DIM_ALL, false),
                             nt_sum(nt_norm(nt_index_select(x, 1, nt_slice(nt_reshape(idx, 1, (int64_t[]){240}), 0, 0, 9, 1)), 2, NT_DIM_ALL, false), NT_DIM_ALL, false));
    assert_int_equal(nt_backward(loss), 0);
    assert_int_equal(nt_to_host(nt_grad(x), out, 240 * sizeof(float)), 0);
    nt_scope_end(s);
    nt_release(x), nt_release(idx);
    nt_config_set("NT_MODE", "adaptive");
}

static void test_new_ops_grads_bitwise_across_modes(void **state)
{
    (void)state;
    float ref[240], got[240];
    new_grads_in_mode("deterministic", ref);
    const char *modes[] = {"eager", "adaptive", "lazy"};
    for (int m = 0; m < 3; m++) {
        new_grads_in_mode(modes[m], got);
        assert_memory_equal(ref, got, sizeof ref);
    }
}

/* ---------------- hand-checked ---------------- */

/* loss = mean((relu(x W1 + b1) W2 - t)^2), gradients worked out in double. */
static void test_two_layer_mlp_by_hand(void **state)
{
    (void)state;
    enum { N = 3, I = 4, H = 5, O = 2 };
    double x[N][I], w1[I][H], b1[H], w2[H][O], t[N][O];
    float fx[N * I], fw1[I * H], fb1[H], fw2[H * O], ft[N * O];
    unsigned seed = 7;
#define RND() ((double)((seed = seed * 1103515245u + 12345u) >> 16 & 0x7fff) / 32768.0 - 0.5)
    for (int i = 0; i < N; i++)
        for (int j = 0; j < I; j++)
            fx[i * I + j] = (float)(x[i][j] = (double)(float)RND() * 2);
    for (int i = 0; i < I; i++)
        for (int j = 0; j < H; j++)
            fw1[i * H + j] = (float)(w1[i][j] = (double)(float)RND());
    for (int j = 0; j < H; j++)
        fb1[j] = (float)(b1[j] = (double)(float)RND());
    for (int i = 0; i < H; i++)
        for (int j = 0; j < O; j++)
            fw2[i * O + j] = (float)(w2[i][j] = (double)(float)RND());
    for (int i = 0; i < N; i++)
        for (int j = 0; j < O; j++)
            ft[i * O + j] = (float)(t[i][j] = (double)(float)RND());
    /* reference forward/backward */
    double h[N][H], a[N][H], y[N][O], dy[N][O], da[N][H], dz[N][H];
    double gw1[I][H] = {{0}}, gb1[H] = {0}, gw2[H][O] = {{0}};
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            h[n][j] = b1[j];
            for (int i = 0; i < I; i++)
                h[n][j] += x[n][i] * w1[i][j];
            a[n][j] = h[n][j] > 0 ? h[n][j] : 0;
        }
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            y[n][o] = 0;
            for (int j = 0; j < H; j++)
                y[n][o] += a[n][j] * w2[j][o];
            dy[n][o] = 2 * (y[n][o] - t[n][o]) / (N * O);
        }
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            da[n][j] = 0;
            for (int o = 0; o < O; o++) {
                da[n][j] += dy[n][o] * w2[j][o];
                gw2[j][o] += a[n][j] * dy[n][o];
            }
            dz[n][j] = h[n][j] > 0 ? da[n][j] : 0;
            gb1[j] += dz[n][j];
            for (int i = 0; i < I; i++)
                gw1[i][j] += x[n][i] * dz[n][j];
        }
    nt_tensor *X = nt_from_host(fx, NT_F32, 2, (int64_t[]){N, I});
    nt_tensor *W1 = nt_from_host(fw1, NT_F32, 2, (int64_t[]){I, H});
    nt_tensor *B1 = nt_from_host(fb1, NT_F32, 1, (int64_t[]){H});
    nt_tensor *W2 = nt_from_host(fw2, NT_F32, 2, (int64_t[]){H, O});
    nt_tensor *T = nt_from_host(ft, NT_F32, 2, (int64_t[]){N, O});
    nt_set_requires_grad(W1, true);
    nt_set_requires_grad(B1, true);
    nt_set_requires_grad(W2, true);
    nt_scope *s = nt_scope_begin();
    nt_tensor *loss = nt_mse_loss(nt_matmul(nt_relu(nt_add(nt_matmul(X, W1), B1)), W2), T);
    assert_int_equal(nt_backward(loss), 0);
    float g1[I * H], gb[H], g2[H * O];
    assert_int_equal(nt_to_host(nt_grad(W1), g1, sizeof g1), 0);
    assert_int_equal(nt_to_host(nt_grad(B1), gb, sizeof gb), 0);
    assert_int_equal(nt_to_host(nt_grad(W2), g2, sizeof g2), 0);
    /* f32 forward/backward vs a double reference: a few f32 ulps of the
     * largest terms */
    for (int i = 0; i < I; i++)
        for (int j = 0; j < H; j++)
            assert_true(fabs(g1[i * H + j] - gw1[i][j]) < 1e-5);
    for (int j = 0; j < H; j++)
        assert_true(fabs(gb[j] - gb1[j]) < 1e-5);
    for (int j = 0; j < H; j++)
        for (int o = 0; o < O; o++)
            assert_true(fabs(g2[j * O + o] - gw2[j][o]) < 1e-5);
    nt_scope_end(s);
    nt_release(X), nt_release(W1), nt_release(B1), nt_release(W2), nt_release(T);
}

static void test_broadcast_grad_shapes(void **state)
{
    (void)state;
    float av[3] = {1, 2, 3}, bv[4] = {10, 20, 30, 40};
    nt_tensor *a = nt_from_host(av, NT_F32, 2, (int64_t[]){3, 1});
    nt_tensor *b = nt_from_host(bv, NT_F32, 1, (int64_t[]){4});
    nt_set_requires_grad(a, true);
    nt_set_requires_grad(b, true);
    nt_scope *s = nt_scope_begin();
    /* L = sum(a * b) over [3, 4]: dL/da[i] = sum(b) = 100, dL/db[j] = sum(a) = 6 */
    assert_int_equal(nt_backward(nt_sum(nt_mul(a, b), NT_DIM_ALL, false)), 0);
    nt_tensor *ga = nt_grad(a), *gb = nt_grad(b);
    assert_int_equal(nt_ndim(ga), 2);
    assert_int_equal(nt_shape(ga, 1), 1);
    assert_int_equal(nt_ndim(gb), 1);
    float o3[3], o4[4];
    nt_to_host(ga, o3, sizeof o3);
    nt_to_host(gb, o4, sizeof o4);
    for (int i = 0; i < 3; i++)
        assert_true(o3[i] == 100.0f);
    for (int j = 0; j < 4; j++)
        assert_true(o4[j] == 6.0f);
    nt_scope_end(s);
    nt_release(a), nt_release(b);
}

/* The gradients of nt_linear on batched rows x [B, T, C] (PyTorch's order,
 * docs/ops.md section 7b): w's is ONE product over all B*T rows, g^T x with
 * the batch folded into K (K-tiles of 128 ascending across the batch
 * boundaries), b's one canonical sum over the B*T rows; not per-batch
 * products and per-dim sums added afterwards.  T = 100 makes the K-tiles of
 * the folded product straddle batches, so either other order would differ
 * in the bits.  The same in every mode and on both backends. */
static void linear3d_grads(const char *backend, const char *mode, float *gw, float *gb,
                           float *rw, float *rb)
{
    nt_config_set("NT_BACKEND", backend);
    nt_config_set("NT_MODE", mode);
    const int64_t B = 3, T = 100, C = 20, N = 12;
    nt_tensor *x = nt_randn(NT_F32, 3, (int64_t[]){B, T, C}, 21);
    nt_tensor *r = nt_randn(NT_F32, 3, (int64_t[]){B, T, N}, 22);
    nt_tensor *w = nt_randn(NT_F32, 2, (int64_t[]){N, C}, 23);
    nt_tensor *b = nt_randn(NT_F32, 1, (int64_t[]){N}, 24);
    nt_set_requires_grad(w, true);
    nt_set_requires_grad(b, true);
    nt_scope *s = nt_scope_begin();
    /* L = sum(linear(x) * r): dL/dy = r exactly */
    assert_int_equal(nt_backward(nt_sum(nt_mul(nt_linear(x, w, b), r), NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_to_host(nt_grad(w), gw, (size_t)(N * C) * sizeof(float)), 0);
    assert_int_equal(nt_to_host(nt_grad(b), gb, (size_t)N * sizeof(float)), 0);
    /* the definitions, as ops: (r2^T x2) and sum over dim 0 of r2 */
    nt_tensor *x2 = nt_reshape(x, 2, (int64_t[]){B * T, C});
    nt_tensor *r2 = nt_reshape(r, 2, (int64_t[]){B * T, N});
    assert_int_equal(nt_to_host(nt_matmul(nt_transpose(r2, 0, 1), x2), rw,
                                (size_t)(N * C) * sizeof(float)),
                     0);
    assert_int_equal(nt_to_host(nt_sum(r2, 0, false), rb, (size_t)N * sizeof(float)), 0);
    nt_scope_end(s);
    nt_release(x), nt_release(r), nt_release(w), nt_release(b);
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_BACKEND", "sim");
}

static void test_batched_linear_grads_fold_the_batch(void **state)
{
    (void)state;
    float gw[240], gb[12], rw[240], rb[12], gw0[240], gb0[12];
    const char *backends[] = {"cpu", "sim"}, *modes[] = {"deterministic", "eager", "lazy"};
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 3; m++) {
            linear3d_grads(backends[k], modes[m], gw, gb, rw, rb);
            assert_memory_equal(gw, rw, sizeof gw);
            assert_memory_equal(gb, rb, sizeof gb);
            if (k == 0 && m == 0) {
                memcpy(gw0, gw, sizeof gw);
                memcpy(gb0, gb, sizeof gb);
            }
            assert_memory_equal(gw, gw0, sizeof gw);
            assert_memory_equal(gb, gb0, sizeof gb);
        }
}

static void test_accumulation_and_zero_grad(void **state)
{
    (void)state;
    float v[2] = {1, 2};
    nt_tensor *x = nt_from_host(v, NT_F32, 1, (int64_t[]){2});
    nt_set_requires_grad(x, true);
    for (int k = 1; k <= 3; k++) {
        nt_scope *s = nt_scope_begin();
        assert_int_equal(nt_backward(nt_sum(nt_mul(x, x), 0, false)), 0);
        float g[2];
        nt_to_host(nt_grad(x), g, sizeof g);
        assert_true(g[0] == 2.0f * k && g[1] == 4.0f * k); /* accumulates */
        nt_scope_end(s);
    }
    assert_int_equal(nt_zero_grad(x), 0);
    assert_null(nt_grad(x));
    assert_int_equal(nt_last_error(), 0); /* no grad yet is not an error */
    nt_release(x);
}

static void test_retain_graph(void **state)
{
    (void)state;
    float v[2] = {1, 2};
    nt_tensor *x = nt_from_host(v, NT_F32, 1, (int64_t[]){2});
    nt_set_requires_grad(x, true);
    nt_scope *s = nt_scope_begin();
    nt_tensor *l = nt_sum(nt_exp(x), 0, false);
    assert_int_equal(nt_backward_ex(l, true), 0);
    assert_int_equal(nt_backward(l), 0); /* allowed: the graph was kept */
    assert_int_equal(nt_backward(l), NT_ESTATE);
    assert_non_null(strstr(nt_last_error_message(), "already freed"));
    nt_clear_error();
    float g[2];
    nt_to_host(nt_grad(x), g, sizeof g);
    assert_true(fabsf(g[0] - 2 * expf(1)) < 1e-5f);
    nt_scope_end(s);
    nt_release(x);
}

static void test_no_grad_and_detach(void **state)
{
    (void)state;
    float v[2] = {1, 2};
    nt_tensor *x = nt_from_host(v, NT_F32, 1, (int64_t[]){2});
    nt_set_requires_grad(x, true);
    assert_true(nt_grad_enabled());
    nt_no_grad_begin();
    nt_no_grad_begin();
    assert_false(nt_grad_enabled());
    nt_tensor *y = nt_mul(x, x);
    assert_false(nt_requires_grad(y));
    nt_no_grad_end();
    assert_false(nt_grad_enabled()); /* nested */
    nt_no_grad_end();
    assert_true(nt_grad_enabled());
    nt_tensor *z = nt_mul(x, x);
    assert_true(nt_requires_grad(z));
    nt_tensor *d = nt_detach(z);
    assert_false(nt_requires_grad(d));
    /* a detached tensor is a constant: d/dx sum(x + detach(x) * x) = 1 + x */
    nt_scope *s = nt_scope_begin();
    assert_int_equal(nt_backward(nt_sum(nt_add(x, nt_mul(nt_detach(x), x)), 0, false)), 0);
    float g[2];
    nt_to_host(nt_grad(x), g, sizeof g);
    assert_true(g[0] == 2.0f && g[1] == 3.0f);
    nt_scope_end(s);
    nt_release(x), nt_release(y), nt_release(z), nt_release(d);
}

static void test_errors(void **state)
{
    (void)state;
    float v[4] = {1, 2, 3, 4};
    nt_tensor *x = nt_from_host(v, NT_F32, 1, (int64_t[]){4});
    nt_tensor *i = nt_arange(NT_I32, 0, 4, 1);
    /* int leaves cannot require grad */
    assert_int_equal(nt_set_requires_grad(i, true), NT_EDTYPE);
    nt_clear_error();
    nt_set_requires_grad(x, true);
    nt_scope *s = nt_scope_begin();
    nt_tensor *y = nt_mul(x, x);
    /* non-scalar loss */
    assert_int_equal(nt_backward(y), NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "one element"));
    assert_non_null(strstr(nt_last_error_message(), "test_autograd.c:"));
    nt_clear_error();
    /* not a leaf */
    assert_int_equal(nt_set_requires_grad(y, false), NT_ESTATE);
    nt_clear_error();
    /* a loss without a graph */
    nt_tensor *c = nt_sum(nt_ones(NT_F32, 1, (int64_t[]){3}), 0, false);
    assert_int_equal(nt_backward(c), NT_ESTATE);
    nt_clear_error();
    /* in place on a leaf that requires grad */
    assert_int_equal(nt_add_scalar_inplace(x, 1), NT_ESTATE);
    assert_non_null(strstr(nt_last_error_message(), "no_grad"));
    nt_clear_error();
    /* ... fine inside no-grad (how optimizers update) */
    nt_no_grad_begin();
    assert_int_equal(nt_add_scalar_inplace(x, 0), 0);
    nt_no_grad_end();
    /* a saved tensor modified in place before backward */
    nt_tensor *a = nt_mul_scalar(x, 2.0); /* non-leaf */
    nt_tensor *b = nt_mul(a, a);          /* saves a */
    assert_int_equal(nt_add_scalar_inplace(a, 1.0), 0);
    assert_int_equal(nt_backward(nt_sum(b, 0, false)), NT_EVERSION);
    assert_non_null(strstr(nt_last_error_message(), "modified in place"));
    assert_non_null(strstr(nt_last_error_message(), "nt_mul"));
    nt_clear_error();
    /* an in-place op autograd cannot follow */
    nt_tensor *e = nt_mul_scalar(x, 1.0);
    assert_int_equal(nt_mul_inplace(e, e), NT_ENOTSUP);
    nt_clear_error();
    assert_int_equal(nt_backward(NULL), NT_EINVAL);
    nt_clear_error();
    nt_scope_end(s);
    nt_release(x), nt_release(i);
}

static void test_inplace_followed(void **state)
{
    (void)state;
    /* y = 2x; y += x; y *= 3  ->  dL/dx of sum(y) = 9 */
    float v[3] = {1, 2, 3};
    nt_tensor *x = nt_from_host(v, NT_F32, 1, (int64_t[]){3});
    nt_set_requires_grad(x, true);
    nt_scope *s = nt_scope_begin();
    nt_tensor *y = nt_mul_scalar(x, 2.0);
    assert_int_equal(nt_add_inplace(y, x), 0);
    assert_int_equal(nt_mul_scalar_inplace(y, 3.0), 0);
    assert_int_equal(nt_backward(nt_sum(y, 0, false)), 0);
    float g[3];
    nt_to_host(nt_grad(x), g, sizeof g);
    for (int k = 0; k < 3; k++)
        assert_true(g[k] == 9.0f);
    nt_scope_end(s);
    nt_release(x);
}

/* ---------------- user ops ---------------- */

/* softplus(x) = log(1 + exp(x)), backward g * sigmoid(x) */
static nt_tensor *softplus_fwd(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_log(nt_add_scalar(nt_exp(in[0]), 1.0));
}
static int softplus_bwd(nt_tensor *g, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                        void *ctx)
{
    (void)out, (void)ctx;
    gin[0] = nt_mul(g, nt_sigmoid(in[0]));
    return gin[0] ? 0 : nt_last_error();
}
static int bad_bwd(nt_tensor *g, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin, void *ctx)
{
    (void)in, (void)out, (void)ctx;
    gin[0] = nt_sum(g, 0, false); /* wrong shape on purpose */
    return 0;
}

static int softplus_id;
static nt_tensor *f_softplus(nt_tensor *const *x, void *c)
{
    (void)c;
    return nt_op_call(softplus_id, x);
}

static void test_custom_op(void **state)
{
    (void)state;
    nt_op_def def = {"softplus", 1, softplus_fwd, softplus_bwd, NULL};
    softplus_id = nt_op_register(&def);
    assert_true(softplus_id >= 0);
    int64_t s[2] = {3, 4};
    nt_tensor *x = leaf(2, s, -2, 2, 900);
    nt_tensor *in[1] = {x};
    grad_ok(f_softplus, in, 1, NULL);
    /* the value is the ops' value */
    nt_scope *sc = nt_scope_begin();
    float a[12], b[12];
    nt_to_host(nt_op_call(softplus_id, in), a, sizeof a);
    nt_to_host(softplus_fwd(in, NULL), b, sizeof b);
    assert_memory_equal(a, b, sizeof a);
    nt_scope_end(sc);
    /* registration errors */
    assert_int_equal(nt_op_register(&def), NT_EINVAL); /* duplicate name */
    nt_clear_error();
    assert_int_equal(nt_op_register(NULL), NT_EINVAL);
    nt_clear_error();
    nt_op_def bad = {"bad", 0, softplus_fwd, NULL, NULL};
    assert_int_equal(nt_op_register(&bad), NT_EINVAL);
    nt_clear_error();
    bad.nin = 1;
    bad.forward = NULL;
    assert_int_equal(nt_op_register(&bad), NT_EINVAL);
    nt_clear_error();
    assert_null(nt_op_call(12345, in));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    nt_clear_error();
    /* a backward that returns the wrong shape is caught and named */
    nt_op_def wrong = {"wrong_shape", 1, softplus_fwd, bad_bwd, NULL};
    int wid = nt_op_register(&wrong);
    assert_true(wid >= 0);
    sc = nt_scope_begin();
    nt_tensor *y = nt_op_call(wid, in);
    assert_int_equal(nt_backward(nt_sum(y, NT_DIM_ALL, false)), NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "wrong_shape"));
    assert_non_null(strstr(nt_last_error_message(), "[4]"));
    nt_clear_error();
    nt_scope_end(sc);
    nt_release(x);
}

/* ---------------- modes ---------------- */

static void grads_in_mode(const char *mode, float *out)
{
    nt_config_set("NT_MODE", mode);
    int64_t sx[2] = {8, 16}, sw[2] = {16, 10};
    nt_tensor *x = nt_randn(NT_F32, 2, sx, 1);
    nt_tensor *w = nt_randn(NT_F32, 2, sw, 2);
    nt_set_requires_grad(w, true);
    int32_t lab[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    nt_tensor *l = nt_from_host(lab, NT_I32, 1, (int64_t[]){8});
    nt_scope *s = nt_scope_begin();
    nt_tensor *loss = nt_cross_entropy(nt_gelu(nt_layer_norm(nt_matmul(x, w), NULL, NULL, 1e-5)), l);
    assert_int_equal(nt_backward(loss), 0);
    assert_int_equal(nt_to_host(nt_grad(w), out, 160 * sizeof(float)), 0);
    nt_scope_end(s);
    nt_release(x), nt_release(w), nt_release(l);
    nt_config_set("NT_MODE", "adaptive");
}

static void test_grads_bitwise_across_modes(void **state)
{
    (void)state;
    float ref[160], got[160];
    grads_in_mode("deterministic", ref);
    const char *modes[] = {"eager", "adaptive", "lazy"};
    for (int m = 0; m < 3; m++) {
        grads_in_mode(modes[m], got);
        assert_memory_equal(ref, got, sizeof ref);
    }
}

/* ---------------- the first gradient of a leaf: taken or copied ---------------- */

/* Linear's weight gradient reaches its leaf as a view of a matmul product
 * whose released handle only the queued matmul still holds (async modes):
 * it becomes .grad without a copy, so the backward enqueues the same ops
 * in every mode.  passes = 2 runs a second backward (of a second graph, or
 * of the same one kept by retain), which adds in place into the taken
 * storage.  Returns the ops the backward passes enqueued. */
static uint64_t linear_grads_in_mode(const char *mode, int passes, bool retain, float *gw,
                                     float *gb)
{
    nt_config_set("NT_MODE", mode);
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){8, 16}, 11);
    nt_tensor *w = nt_randn(NT_F32, 2, (int64_t[]){12, 16}, 12);
    nt_tensor *b = nt_randn(NT_F32, 1, (int64_t[]){12}, 13);
    nt_set_requires_grad(w, true);
    nt_set_requires_grad(b, true);
    nt_scope *s = nt_scope_begin();
    nt_tensor *loss[2];
    for (int i = 0; i < 2; i++) {
        nt_tensor *y = nt_linear(x, w, b);
        loss[i] = nt_sum(nt_mul(y, y), NT_DIM_ALL, false);
    }
    nt_sync();
    nt_stats st0, st1;
    nt_stats_get(&st0);
    assert_int_equal(nt_backward_ex(loss[0], retain), 0);
    if (passes == 2)
        assert_int_equal(nt_backward(loss[retain ? 0 : 1]), 0);
    nt_stats_get(&st1);
    assert_int_equal(nt_to_host(nt_grad(w), gw, 12 * 16 * sizeof(float)), 0);
    assert_int_equal(nt_to_host(nt_grad(b), gb, 12 * sizeof(float)), 0);
    nt_scope_end(s);
    nt_release(x), nt_release(w), nt_release(b);
    nt_config_set("NT_MODE", "adaptive");
    return st1.ops_enqueued - st0.ops_enqueued;
}

static void test_leaf_grad_taken_without_copy(void **state)
{
    (void)state;
    const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};
    float w1[192], b1[12], w2[192], b2[12], gw[192], gb[12];
    uint64_t ops1 = linear_grads_in_mode("deterministic", 1, false, w1, b1);
    uint64_t ops2 = linear_grads_in_mode("deterministic", 2, false, w2, b2);
    /* the second pass adds the same bits in place: exactly twice the first */
    for (int i = 0; i < 192; i++)
        assert_true(w2[i] == 2 * w1[i]);
    for (int i = 0; i < 12; i++)
        assert_true(b2[i] == 2 * b1[i]);
    for (int m = 0; m < 4; m++) {
        /* no copy in any mode: the deterministic pass's ops, and its bits */
        assert_int_equal(linear_grads_in_mode(modes[m], 1, false, gw, gb), ops1);
        assert_memory_equal(gw, w1, sizeof gw);
        assert_memory_equal(gb, b1, sizeof gb);
        assert_int_equal(linear_grads_in_mode(modes[m], 2, false, gw, gb), ops2);
        assert_memory_equal(gw, w2, sizeof gw);
        assert_memory_equal(gb, b2, sizeof gb);
        /* retain_graph: the same graph twice, the same sums */
        assert_int_equal(linear_grads_in_mode(modes[m], 2, true, gw, gb), ops2);
        assert_memory_equal(gw, w2, sizeof gw);
        assert_memory_equal(gb, b2, sizeof gb);
    }
}

/* A user op x * c whose backward returns its gradient, c, as a view of the
 * user's c itself; ctx points to c. */
static nt_tensor *scale_fwd(nt_tensor *const *in, void *ctx)
{
    return nt_mul(in[0], nt_reshape(*(nt_tensor **)ctx, 2, (int64_t[]){3, 4}));
}
static int scale_bwd(nt_tensor *g, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                     void *ctx)
{
    (void)g, (void)in, (void)out;
    gin[0] = nt_reshape(*(nt_tensor **)ctx, 2, (int64_t[]){3, 4});
    return gin[0] ? 0 : nt_last_error();
}
static nt_tensor *scale_c;

/* Gradients that other handles can see are copied: changing one afterwards
 * changes nothing else. */
static void shared_grads_in_mode(const char *mode, int op)
{
    nt_config_set("NT_MODE", mode);
    float av[12], bv[12], cv[12];
    for (int i = 0; i < 12; i++)
        av[i] = 0.25f * (float)i - 1, bv[i] = 0.5f - 0.125f * (float)i, cv[i] = (float)i + 1;
    nt_tensor *a = nt_from_host(av, NT_F32, 1, (int64_t[]){12});
    nt_tensor *b = nt_from_host(bv, NT_F32, 2, (int64_t[]){3, 4});
    nt_set_requires_grad(a, true);
    nt_set_requires_grad(b, true);
    nt_scope *s = nt_scope_begin();
    /* one gradient tensor reaches both leaves, to a through a view of it */
    nt_tensor *e = nt_exp(nt_add(nt_reshape(a, 2, (int64_t[]){3, 4}), b));
    assert_int_equal(nt_backward(nt_sum(e, NT_DIM_ALL, false)), 0);
    float ev[12], ga[12], gb[12];
    assert_int_equal(nt_to_host(e, ev, sizeof ev), 0);
    assert_int_equal(nt_add_scalar_inplace(nt_grad(a), 1), 0);
    assert_int_equal(nt_to_host(nt_grad(a), ga, sizeof ga), 0);
    assert_int_equal(nt_to_host(nt_grad(b), gb, sizeof gb), 0);
    for (int i = 0; i < 12; i++) {
        assert_true(ga[i] == ev[i] + 1);
        assert_true(gb[i] == ev[i]);
    }
    /* a gradient that is a view of a live user tensor */
    nt_tensor *c = scale_c = nt_from_host(cv, NT_F32, 1, (int64_t[]){12});
    nt_tensor *x = nt_from_host(bv, NT_F32, 2, (int64_t[]){3, 4});
    nt_set_requires_grad(x, true);
    assert_int_equal(nt_backward(nt_sum(nt_op_call(op, (nt_tensor *[]){x}), NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_add_scalar_inplace(c, 5), 0);      /* .grad must not follow */
    assert_int_equal(nt_mul_scalar_inplace(nt_grad(x), 2), 0); /* nor c follow .grad */
    float gx[12], cn[12];
    assert_int_equal(nt_to_host(nt_grad(x), gx, sizeof gx), 0);
    assert_int_equal(nt_to_host(c, cn, sizeof cn), 0);
    for (int i = 0; i < 12; i++) {
        assert_true(gx[i] == 2 * cv[i]);
        assert_true(cn[i] == cv[i] + 5);
    }
    /* a gradient owned by a scope that outlives the pass: the seed of a
     * one-element leaf that is its own loss */
    float one = 3;
    nt_tensor *l = nt_from_host(&one, NT_F32, 0, NULL);
    nt_set_requires_grad(l, true);
    assert_int_equal(nt_backward(l), 0);
    assert_int_equal(nt_backward(l), 0);
    float gl;
    assert_int_equal(nt_to_host(nt_grad(l), &gl, sizeof gl), 0);
    assert_true(gl == 2);
    nt_scope_end(s);
    nt_release(a), nt_release(b), nt_release(c), nt_release(x), nt_release(l);
    nt_config_set("NT_MODE", "adaptive");
}

static void test_leaf_grad_copied_when_shared(void **state)
{
    (void)state;
    nt_op_def def = {"scale_by_view", 1, scale_fwd, scale_bwd, &scale_c};
    int op = nt_op_register(&def);
    assert_true(op >= 0);
    const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};
    for (int m = 0; m < 4; m++)
        shared_grads_in_mode(modes[m], op);
}


/* ---------------- slice gradients into one buffer ---------------- */

/* The slices of x [2, 3, 12] that a case takes: dim, start, end, step. */
typedef struct {
    int n;
    int64_t s[10][4];
} slice_case;

static const slice_case slice_cases[] = {
    {3, {{2, 0, 4, 1}, {2, 4, 8, 1}, {2, 8, 12, 1}}},    /* disjoint, covering: q, k, v */
    {1, {{2, 2, 7, 1}}},                                  /* one: -0 stays -0 */
    {2, {{2, 0, 6, 1}, {2, 4, 12, 1}}},                   /* overlapping: summed */
    {3, {{2, 0, 3, 1}, {2, 6, 9, 1}, {2, 9, 10, 1}}},    /* disjoint with gaps */
    {2, {{2, 0, 12, 2}, {2, 1, 12, 2}}},                  /* interleaved by a step */
    {2, {{2, 0, 6, 1}, {1, 0, 1, 1}}},                    /* different dims */
    {10, {{2, 0, 1, 1}, {2, 1, 2, 1}, {2, 2, 3, 1}, {2, 3, 4, 1}, {2, 4, 5, 1},
          {2, 5, 6, 1}, {2, 6, 7, 1}, {2, 7, 8, 1}, {2, 8, 9, 1}, {2, 9, 11, 1}}}, /* > 8 */
    {2, {{2, 3, 3, 1}, {2, 0, 12, 1}}},                   /* an empty one */
};

/* The gradient of x for the sum over the slices of sum(slice_i(x) * c_i),
 * plus sum(x * c0) made before slice dpos when dpos >= 0 (dpos == n: after
 * the last), as nt_backward gives it (out) and as its definition does: each
 * slice's gradient placed into zeros of x's shape, and the direct use's
 * gradient, summed in the order their backwards run, newest first (ref).
 * The c_i hold -0 and a NaN. */
static void slice_grads(const slice_case *sc, int dpos, bool through_op, bool heads,
                        nt_dtype dt, uint16_t *out, uint16_t *ref, float *out32, float *ref32)
{
    int64_t sh[3] = {2, 3, 12};
    float xv[72];
    for (int i = 0; i < 72; i++)
        xv[i] = 0.25f * (float)(i % 9) - 1;
    nt_scope *s = nt_scope_begin();
    nt_tensor *a = nt_cast(nt_from_host(xv, NT_F32, 3, sh), dt);
    nt_tensor *leafx = nt_detach(a);
    nt_set_requires_grad(leafx, true);
    nt_tensor *x = through_op ? nt_mul_scalar(leafx, 1.0) : leafx;
    nt_tensor *loss = NULL, *contrib[11];
    int nc = 0;
    for (int k = 0; k <= sc->n; k++) {
        if (k == dpos) {
            float cv[72];
            for (int i = 0; i < 72; i++)
                cv[i] = (float)(i % 5) - 2;
            nt_tensor *g0 = nt_cast(nt_from_host(cv, NT_F32, 3, sh), dt);
            nt_tensor *l = nt_sum(nt_mul(x, g0), NT_DIM_ALL, false);
            loss = loss ? nt_add(loss, l) : l;
            contrib[nc++] = g0;
        }
        if (k == sc->n)
            break;
        nt_tensor *y = nt_slice(x, (int)sc->s[k][0], sc->s[k][1], sc->s[k][2], sc->s[k][3]);
        int64_t n = nt_numel(y), ys[3] = {nt_shape(y, 0), nt_shape(y, 1), nt_shape(y, 2)};
        float cv[72];
        for (int i = 0; i < n; i++)
            cv[i] = i % 7 == 3 ? -0.0f : (i % 11 == 5 ? NAN : (float)(k + 1) + 0.5f * (float)i);
        nt_tensor *c = nt_cast(nt_from_host(cv, NT_F32, 3, ys), dt);
        nt_tensor *yv = y, *cv_ = c;
        if (heads) { /* attention's heads: reshape (a view) and permute */
            if (ys[2] % 2 == 0 && ys[2] > 0) {
                int64_t hs[4] = {ys[0], ys[1], ys[2] / 2, 2};
                yv = nt_permute(nt_reshape(y, 4, hs), (int[]){0, 2, 1, 3});
                cv_ = nt_permute(nt_reshape(c, 4, hs), (int[]){0, 2, 1, 3});
            } else {
                yv = nt_transpose(nt_reshape(y, 3, ys), 0, 1);
                cv_ = nt_transpose(c, 0, 1);
            }
        }
        nt_tensor *l = nt_sum(nt_mul(yv, cv_), NT_DIM_ALL, false);
        loss = loss ? nt_add(loss, l) : l;
        /* the definition of the slice's gradient: mul's (ones * c) in zeros */
        nt_tensor *z = nt_zeros(dt, 3, sh);
        assert_int_equal(nt_copy_into(nt_slice(z, (int)sc->s[k][0], sc->s[k][1], sc->s[k][2],
                                               sc->s[k][3]), nt_mul(nt_ones(dt, 3, ys), c)), 0);
        contrib[nc++] = z;
    }
    assert_non_null(loss);
    assert_int_equal(nt_backward(loss), 0);
    nt_tensor *gx = nt_cast(nt_grad(leafx), NT_F32);
    assert_int_equal(nt_to_host(gx, out32, 72 * sizeof(float)), 0);
    nt_tensor *sum = contrib[nc - 1];
    for (int k = nc - 2; k >= 0; k--)
        sum = nt_add(sum, contrib[k]);
    if (through_op)
        sum = nt_mul_scalar(sum, 1.0);
    assert_int_equal(nt_to_host(nt_cast(sum, NT_F32), ref32, 72 * sizeof(float)), 0);
    if (dt == NT_BF16) { /* the bf16 bits themselves */
        assert_int_equal(nt_to_host(nt_grad(leafx), out, 72 * sizeof(uint16_t)), 0);
        assert_int_equal(nt_to_host(sum, ref, 72 * sizeof(uint16_t)), 0);
    }
    nt_scope_end(s);
    nt_release(leafx);
}

/* Slice gradients reaching one tensor go into one buffer (autograd/tape.c,
 * struct scat): the bits of their definition, the sum of one zero-filled
 * buffer per slice (so -0 turns into +0 once two slices came, and stays -0
 * with one), whether the slices are disjoint, overlap, leave gaps, are
 * interleaved by a step, lie along different dims, are more than a buffer
 * tracks or empty; with the tensor also used directly, a leaf or an op's
 * output, f32 or bf16, in every mode, on both backends. */
static void test_slice_grads_one_buffer(void **state)
{
    (void)state;
    const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};
    const char *backends[] = {"cpu", "sim"};
    for (size_t c = 0; c < sizeof slice_cases / sizeof *slice_cases; c++)
        for (int v = 0; v < 32; v++)
            for (int m = 0; m < 4; m++) {
                const slice_case *sc = &slice_cases[c];
                /* the direct use: none, oldest (its gradient comes last),
                 * between the first slices, newest (first) */
                int dpos = (int[]){-1, 0, 1, sc->n}[v & 3];
                bool through_op = v & 4;
                nt_dtype dt = v & 8 ? NT_BF16 : NT_F32;
                nt_config_set("NT_MODE", modes[m]);
                nt_config_set("NT_BACKEND", backends[(c + (size_t)m + (size_t)v) % 2]);
                uint16_t out[72], ref[72];
                float out32[72], ref32[72];
                slice_grads(sc, dpos, through_op, v & 16, dt, out, ref, out32, ref32);
                assert_memory_equal(out32, ref32, sizeof out32);
                if (dt == NT_BF16)
                    assert_memory_equal(out, ref, sizeof out);
                if (c == 0 && dpos < 0) { /* x[0, 0, 3] had -0 from q's slice */
                    assert_true(out32[3] == 0 && !signbit(out32[3]));
                    assert_true(isnan(out32[13]));
                    /* and x[0, 0, 11] from v's, whose backward runs first */
                    assert_true(out32[11] == 0 && !signbit(out32[11]));
                }
                if (c == 1 && dpos < 0) { /* one slice: its -0 kept, zeros around it */
                    assert_true(out32[5] == 0 && signbit(out32[5]));
                    assert_true(out32[0] == 0 && !signbit(out32[0]));
                    assert_true(isnan(out32[14]));
                }
                if (c == 3 && dpos < 0) /* a gap between the slices: +0 */
                    assert_true(out32[4] == 0 && !signbit(out32[4]));
            }
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_BACKEND", "sim");
}

/* The gradient of a reshaped slice goes straight into the slice's place
 * when the slice has no other user (autograd/tape.c, reshape_into_slice);
 * with another user it goes the ordinary way.  Both against the host: the
 * sum of the two users' gradients (commutative: finite values). */
static void test_reshaped_slice_grad(void **state)
{
    (void)state;
    const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};
    for (int m = 0; m < 8; m++) {
        nt_config_set("NT_MODE", modes[m % 4]);
        nt_config_set("NT_BACKEND", m < 4 ? "cpu" : "sim");
        bool second = m & 1; /* the slice also used directly */
        nt_scope *s = nt_scope_begin();
        float xv[72], cv[16], dv[16];
        for (int i = 0; i < 72; i++)
            xv[i] = 0.5f * (float)(i % 7) - 1;
        for (int i = 0; i < 16; i++)
            cv[i] = (float)i - 3.5f, dv[i] = 0.25f * (float)(i % 5);
        nt_tensor *x = nt_from_host(xv, NT_F32, 3, (int64_t[]){2, 2, 18});
        nt_set_requires_grad(x, true);
        nt_tensor *y = nt_slice(x, 2, 5, 9, 1); /* [2, 2, 4] */
        nt_tensor *q = nt_permute(nt_reshape(y, 4, (int64_t[]){2, 2, 2, 2}), (int[]){0, 2, 1, 3});
        nt_tensor *c = nt_from_host(cv, NT_F32, 4, (int64_t[]){2, 2, 2, 2});
        nt_tensor *loss = nt_sum(nt_mul(q, c), NT_DIM_ALL, false);
        nt_tensor *d = nt_from_host(dv, NT_F32, 3, (int64_t[]){2, 2, 4});
        if (second)
            loss = nt_add(loss, nt_sum(nt_mul(y, d), NT_DIM_ALL, false));
        assert_int_equal(nt_backward(loss), 0);
        float g[72];
        assert_int_equal(nt_to_host(nt_grad(x), g, sizeof g), 0);
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < 2; t++)
                for (int j = 0; j < 18; j++) {
                    float want = 0.0f;
                    if (j >= 5 && j < 9) {
                        int e = j - 5, h = e / 2, w = e % 2; /* y[b, t, e] is q[b, h, t, w] */
                        want = cv[((b * 2 + h) * 2 + t) * 2 + w];
                        if (second)
                            want += dv[(b * 2 + t) * 4 + e];
                    }
                    float got = g[(b * 2 + t) * 18 + j];
                    assert_true(memcmp(&got, &want, 4) == 0);
                }
        nt_scope_end(s);
    }
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_BACKEND", "sim");
}

/* In-place writes after ops of the VIEW kind (core/optable.h's VIEW flag):
 * the results of cat and flip are new tensors, so an in-place write to
 * them is followed like any other (the gradient includes it); a write
 * through a real view of a tensor that requires grad (reshape, transpose,
 * permute, slice, expand, diagonal) is refused, and leaves no trace. */
static void test_inplace_after_cat_and_views(void **state)
{
    (void)state;
    nt_scope *s = nt_scope_begin();
    float h[6] = {1, 2, 3, 4, 5, 6}, g[6];
    nt_tensor *x = nt_from_host(h, NT_F32, 2, (int64_t[]){2, 3});
    nt_set_requires_grad(x, true);
    nt_tensor *a = nt_mul_scalar(x, 1.0); /* non-leaf */
    nt_tensor *c = nt_cat((nt_tensor *[]){a, a}, 2, 0), *f = nt_flip(a, 1, (int[]){1});
    assert_int_equal(nt_mul_scalar_inplace(c, 3.0), 0);
    assert_int_equal(nt_mul_scalar_inplace(f, 5.0), 0);
    /* d/dx sum(c) + sum(f) = 3 + 3 + 5 per element */
    assert_int_equal(nt_backward(nt_add(nt_sum(c, NT_DIM_ALL, false), nt_sum(f, NT_DIM_ALL, false))),
                     0);
    assert_int_equal(nt_to_host(nt_grad(x), g, sizeof g), 0);
    for (int i = 0; i < 6; i++)
        assert_true(g[i] == 11.0f);
    nt_tensor *b = nt_mul_scalar(x, 1.0);
    nt_tensor *views[6] = {
        nt_reshape(b, 1, (int64_t[]){6}), nt_transpose(b, 0, 1), nt_permute(b, (int[]){1, 0}),
        nt_slice(b, 1, 0, 2, 1),          nt_diagonal(b, 0, 0, 1),
        nt_expand(nt_slice(b, 0, 0, 1, 1), 2, (int64_t[]){2, 3})};
    for (int k = 0; k < 6; k++) {
        assert_non_null(views[k]);
        int rc = nt_mul_scalar_inplace(views[k], 2.0);
        assert_true(rc == NT_ENOTSUP || (k == 5 && rc == NT_EINVAL)); /* expanded: its own error */
        nt_clear_error();
    }
    float gb[6];
    assert_int_equal(nt_backward(nt_sum(b, NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_to_host(b, gb, sizeof gb), 0);
    assert_memory_equal(gb, h, sizeof h); /* nothing was written */
    nt_scope_end(s);
    nt_release(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_binary_broadcast, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_unary_and_scalar, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_where, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_reductions, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_rows, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_losses, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul_family, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_embedding, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_views, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_ops_gradcheck, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_norm_min_subgradients, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_ops_grads_bitwise_across_modes, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_two_layer_mlp_by_hand, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_broadcast_grad_shapes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_batched_linear_grads_fold_the_batch, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_accumulation_and_zero_grad, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_retain_graph, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_no_grad_and_detach, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_inplace_followed, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_custom_op, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_grads_bitwise_across_modes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_leaf_grad_taken_without_copy, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_leaf_grad_copied_when_shared, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_reshaped_slice_grad, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_slice_grads_one_buffer, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_inplace_after_cat_and_views, nt_test_setup,
                                        nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
