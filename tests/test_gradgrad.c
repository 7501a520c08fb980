/* tests/test_gradgrad.c - double backward of the ops whose backward runs a
 * kernel of its own (the generic elementwise derivatives UNARY_BWD and
 * BINARY_DX, gather / index_select / embedding's index_add, scatter,
 * diagonal, cumprod's linrec, attention), nt_gradgradcheck, and removable
 * tensor hooks.
 *
 * - Second (and third) derivatives of sin, cos, erf, softplus, mish,
 *   softsign, reciprocal, gelu_tanh, log1p, expm1, leaky_relu, hardtanh
 *   against double references computed here; their gradient with respect to
 *   the incoming gradient; the Hessians of pow, atan2 and fmod of two
 *   tensors (their partials from recorded ops, with the kernel's bits).
 * - Hessian-vector products through embedding, gather, index_select and
 *   cumprod (with a zero) against doubles computed here.
 * - A create_graph pass's first gradients have a plain pass's bits, and the
 *   second derivatives the same bits in every backend and mode
 *   (NT_TEST_CFGS); attention's composite first-order gradients (create_graph)
 *   against the fused kernel's within f32 rounding.
 * - nt_gradgradcheck passes on every newly supported op (random and given
 *   grad_output), fails on a user op whose backward is right to first order
 *   only, and every error it raises.
 * - Against PyTorch 1.13 (tests/torch_refs/gradgrad.h from
 *   scripts/torch_refs/gradgrad.py): f' and f'' on edge values, the
 *   Hessian-vector products of pow/atan2/fmod with broadcasting, gather,
 *   index_select, embedding, cumprod (zeros) on odd shapes, attention
 *   (causal, u8 mask).
 * - nt_register_hook_handle / nt_remove_hook: removal, order, removing
 *   twice, unknown handles, a handle that outlives its graph; no leak. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "torch_refs/gradgrad.h"

uint64_t nt__tensor_live_handles(void); /* core/tensor.c */

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static bool near(double got, double want, double rel, double abs_tol)
{
    if (isnan(got) || isnan(want))
        return isnan(got) && isnan(want);
    return fabs(got - want) <= abs_tol + rel * fmax(fabs(got), fabs(want));
}

static nt_tensor *ssum(nt_tensor *t) { return nt_sum(t, NT_DIM_ALL, false); }

/* ---------------- elementwise: f'' against doubles ---------------- */

typedef struct unop {
    const char *name;
    nt_tensor *(*f)(nt_tensor *x);
    double (*d1)(double x); /* f' in double */
} unop;

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
static double d_sin(double x) { return cos(x); }
static double d_cos(double x) { return -sin(x); }
static double d_erf(double x) { return 2.0 / sqrt(M_PI) * exp(-x * x); }
static double d_softplus(double x) { return x > 20 ? 1.0 : sigm(x); }
static double d_mish(double x)
{
    double t = tanh(log1p(exp(x)));
    return t + x * sigm(x) * (1 - t * t);
}
static double d_softsign(double x) { return 1.0 / ((1 + fabs(x)) * (1 + fabs(x))); }
static double d_recip(double x) { return -1.0 / (x * x); }
static double d_gelu_tanh(double x)
{
    double c = sqrt(2.0 / M_PI), u = c * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
}
static double d_log1p(double x) { return 1.0 / (1.0 + x); }
static double d_expm1(double x) { return exp(x); }
static double d_leaky(double x) { return x > 0 ? 1.0 : 0.1; }
static double d_hardtanh(double x) { return x <= -1 || x >= 1.5 ? 0.0 : 1.0; }

static nt_tensor *f_leaky(nt_tensor *x) { return nt_leaky_relu(x, 0.1); }
static nt_tensor *f_hardtanh(nt_tensor *x) { return nt_hardtanh(x, -1.0, 1.5); }

static const unop UNOPS[] = {
    {"sin", nt_sin, d_sin},
    {"cos", nt_cos, d_cos},
    {"erf", nt_erf, d_erf},
    {"softplus", nt_softplus, d_softplus},
    {"mish", nt_mish, d_mish},
    {"softsign", nt_softsign, d_softsign},
    {"reciprocal", nt_reciprocal, d_recip},
    {"gelu_tanh", nt_gelu_tanh, d_gelu_tanh},
    {"log1p", nt_log1p, d_log1p},
    {"expm1", nt_expm1, d_expm1},
    {"leaky_relu", f_leaky, d_leaky},
    {"hardtanh", f_hardtanh, d_hardtanh},
};
enum { NUNOPS = sizeof UNOPS / sizeof UNOPS[0] };

/* x: away from kinks (0 for leaky_relu, -1 / 1.5 for hardtanh) and from
 * log1p's pole; softplus's threshold (20) from both sides */
static const float UX[] = {-2.75f, -1.3f, -0.45f, 0.2f, 0.8f, 1.7f, 2.9f, 19.5f, 20.5f};
enum { NUX = sizeof UX / sizeof UX[0] };

/* f'' by central differences of f' in double: a reference independent of
 * the formulas in autograd/backward.c (error ~1e-9 at h = 1e-4) */
static double d2_ref(const unop *u, double x)
{
    const double h = 1e-4;
    if ((u->d1 == d_softplus) && fabs(x - 20) < 1)
        return x > 20 ? 0.0 : sigm(x) * (1 - sigm(x));
    return (u->d1(x + h) - u->d1(x - h)) / (2 * h);
}

static bool ux_ok(const unop *u, float x)
{
    if (u->d1 == d_log1p)
        return x > -1;
    if (u->d1 == d_expm1 || u->d1 == d_mish || u->d1 == d_gelu_tanh || u->d1 == d_erf)
        return fabs(x) < 10; /* keeps the values O(1) */
    return true;
}

static void test_unary_second(void **state)
{
    (void)state;
    for (int k = 0; k < NUNOPS; k++) {
        const unop *u = &UNOPS[k];
        float xv[NUX];
        int n = 0;
        for (int i = 0; i < NUX; i++)
            if (ux_ok(u, UX[i]))
                xv[n++] = UX[i];
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = nt_test_leaf(xv, 1, SH(n));
        nt_tensor *y = ssum(u->f(x));
        nt_tensor *g0 = nt_test_grad1(y, x, false), *g = nt_test_grad1(y, x, true);
        float *a = nt_test_host(g0), *b = nt_test_host(g);
        /* a create_graph pass's first gradient: the same kernel, the same bits */
        assert_memory_equal(a, b, (size_t)n * sizeof *a);
        for (int i = 0; i < n; i++)
            if (!near(b[i], u->d1(xv[i]), 2e-6, 1e-7))
                fail_msg("%s' at %g: %.9g, double %.9g", u->name, xv[i], b[i], u->d1(xv[i]));
        nt_tensor *h = nt_test_grad1(ssum(g), x, true);
        float *hv = h ? nt_test_host(h) : calloc((size_t)n, sizeof *hv);
        for (int i = 0; i < n; i++)
            if (!near(hv[i], d2_ref(u, xv[i]), 1e-5, 2e-6))
                fail_msg("%s'' at %g: %.9g, double %.9g", u->name, xv[i], hv[i],
                         d2_ref(u, xv[i]));
        free(a), free(b), free(hv);
        nt_scope_end(s);
    }
}

/* third derivatives follow: sin''' = -cos, erf''' = (4x^2 - 2) erf' */
static void test_unary_third(void **state)
{
    (void)state;
    float xv[4] = {-1.5f, -0.25f, 0.6f, 2.2f};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(4));
    nt_tensor *g = nt_test_grad1(ssum(nt_sin(x)), x, true);
    nt_tensor *h = nt_test_grad1(ssum(g), x, true);
    float *t = nt_test_host(nt_test_grad1(ssum(h), x, false));
    for (int i = 0; i < 4; i++)
        assert_true(near(t[i], -cos(xv[i]), 1e-6, 1e-7));
    free(t);
    g = nt_test_grad1(ssum(nt_erf(x)), x, true);
    h = nt_test_grad1(ssum(g), x, true);
    t = nt_test_host(nt_test_grad1(ssum(h), x, false));
    for (int i = 0; i < 4; i++)
        assert_true(near(t[i], (4.0 * xv[i] * xv[i] - 2.0) * d_erf(xv[i]), 1e-5, 1e-6));
    free(t);
    nt_scope_end(s);
}

/* d/dv of G = d<f(x), v>/dx = v f'(x): u f'(x) (UNARY_BWD's gradient with
 * respect to the incoming gradient, the same kernel) */
static void test_grad_of_grad_output(void **state)
{
    (void)state;
    float xv[5] = {-1.1f, -0.3f, 0.4f, 1.2f, 2.5f}, vv[5] = {0.5f, -2, 1.5f, 0.25f, -0.75f};
    float uv[5] = {1, -0.5f, 2, 0.75f, -1.25f};
    for (int k = 0; k < NUNOPS; k++) {
        const unop *u = &UNOPS[k];
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = nt_test_leaf(xv, 1, SH(5)), *v = nt_test_leaf(vv, 1, SH(5));
        nt_tensor *y = u->f(x), *G = NULL, *gv = NULL;
        assert_int_equal(nt_autograd_grad(&y, 1, &x, 1, &v, true, true, false, &G), 0);
        nt_tensor *L = ssum(nt_mul(G, nt_from_host(uv, NT_F32, 1, SH(5))));
        assert_int_equal(nt_autograd_grad(&L, 1, &v, 1, NULL, false, false, false, &gv), 0);
        float *got = nt_test_host(gv);
        for (int i = 0; i < 5; i++)
            if (!near(got[i], uv[i] * u->d1(xv[i]), 2e-6, 1e-7))
                fail_msg("%s: d/dv[%d] %.9g, double %.9g", u->name, i, got[i],
                         uv[i] * u->d1(xv[i]));
        free(got);
        nt_scope_end(s);
    }
}

/* ---------------- pow, atan2, fmod of two tensors ---------------- */

/* the Hessian of f(a, b) in double: [daa, dab, dbb] */
static void hess_ref(int which, double a, double b, double h[3])
{
    if (which == 0) { /* pow */
        double l = log(a);
        h[0] = b * (b - 1) * pow(a, b - 2);
        h[1] = pow(a, b - 1) * (1 + b * l);
        h[2] = pow(a, b) * l * l;
    } else if (which == 1) { /* atan2 */
        double r = a * a + b * b;
        h[0] = -2 * a * b / (r * r);
        h[1] = (a * a - b * b) / (r * r);
        h[2] = 2 * a * b / (r * r);
    } else {
        h[0] = h[1] = h[2] = 0;
    }
}

static nt_tensor *binop(int which, nt_tensor *a, nt_tensor *b)
{
    return which == 0 ? nt_pow(a, b) : which == 1 ? nt_atan2(a, b) : nt_fmod(a, b);
}

static void test_binary_second(void **state)
{
    (void)state;
    const char *names[3] = {"pow", "atan2", "fmod"};
    float av[5] = {0.6f, 1.3f, 2.2f, 0.9f, 3.1f}, bv[5] = {1.7f, -0.8f, 0.45f, 2.6f, -1.9f};
    for (int which = 0; which < 3; which++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *a = nt_test_leaf(av, 1, SH(5)), *b = nt_test_leaf(bv, 1, SH(5)), *ab[2] = {a, b};
        nt_tensor *L = ssum(binop(which, a, b)), *g0[2], *g[2], *h[2][2];
        assert_int_equal(nt_autograd_grad(&L, 1, ab, 2, NULL, true, false, false, g0), 0);
        assert_int_equal(nt_autograd_grad(&L, 1, ab, 2, NULL, true, true, false, g), 0);
        for (int i = 0; i < 2; i++) {
            float *x = nt_test_host(g0[i]), *y = nt_test_host(g[i]);
            assert_memory_equal(x, y, sizeof av); /* the same bits */
            free(x), free(y);
            nt_tensor *si = ssum(g[i]);
            h[i][0] = h[i][1] = NULL; /* fmod's d/da is a constant 1 */
            if (which != 2 || nt_requires_grad(si))
                assert_int_equal(nt_autograd_grad(&si, 1, ab, 2, NULL, true, false, true, h[i]), 0);
        }
        float *hv[2][2];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                hv[i][j] = h[i][j] ? nt_test_host(h[i][j]) : calloc(5, sizeof(float));
        for (int k = 0; k < 5; k++) {
            double r[3];
            hess_ref(which, av[k], bv[k], r);
            double got[3] = {hv[0][0][k], hv[0][1][k], hv[1][1][k]};
            for (int m = 0; m < 3; m++)
                if (!near(got[m], r[m], 1e-5, 1e-6))
                    fail_msg("%s: Hessian entry %d at (%g, %g): %.9g, double %.9g", names[which],
                             m, av[k], bv[k], got[m], r[m]);
            assert_true(near(hv[1][0][k], r[1], 1e-5, 1e-6)); /* symmetric */
        }
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                free(hv[i][j]);
        nt_scope_end(s);
    }
    /* bf16 operands: the partial in f32, rounded once, as the kernel's */
    nt_scope *s = nt_scope_begin();
    nt_tensor *a = nt_cast(nt_from_host(av, NT_F32, 1, SH(5)), NT_BF16);
    nt_tensor *b = nt_cast(nt_from_host(bv, NT_F32, 1, SH(5)), NT_BF16);
    nt_set_requires_grad(a, true), nt_set_requires_grad(b, true);
    nt_tensor *ab[2] = {a, b}, *L = ssum(nt_cast(nt_pow(a, b), NT_F32)), *g0[2], *g[2];
    assert_int_equal(nt_autograd_grad(&L, 1, ab, 2, NULL, true, false, false, g0), 0);
    assert_int_equal(nt_autograd_grad(&L, 1, ab, 2, NULL, true, true, false, g), 0);
    for (int i = 0; i < 2; i++) {
        float *x = nt_test_host(nt_cast(g0[i], NT_F32)), *y = nt_test_host(nt_cast(g[i], NT_F32));
        assert_memory_equal(x, y, sizeof av);
        free(x), free(y);
    }
    nt_scope_end(s);
}

/* ---------------- index ops and cumprod: Hessian-vector products ---------------- */

/* L = sum(e^2 k), e = embedding(W [4, 3], idx): (H u)_r = 2 u_r sum_{k:
 * idx_k = r} k_k (per column) */
static void test_embedding_hvp(void **state)
{
    (void)state;
    float wv[12], uv[12], kv[15];
    for (int i = 0; i < 12; i++)
        wv[i] = 0.25f * (float)i - 1.0f, uv[i] = (float)((i * 7) % 5) - 2.0f;
    for (int i = 0; i < 15; i++)
        kv[i] = 0.5f + 0.125f * (float)i;
    int32_t idx[5] = {2, 0, 2, 3, 2};
    nt_scope *s = nt_scope_begin();
    nt_tensor *W = nt_test_leaf(wv, 2, SH(4, 3));
    nt_tensor *e = nt_embedding(W, nt_from_host(idx, NT_I32, 1, SH(5)));
    nt_tensor *L = ssum(nt_mul(nt_mul(e, e), nt_from_host(kv, NT_F32, 2, SH(5, 3))));
    nt_tensor *g = nt_test_grad1(L, W, true);
    float *g0 = nt_test_host(nt_test_grad1(L, W, false)), *g1 = nt_test_host(g);
    assert_memory_equal(g0, g1, sizeof wv);
    nt_tensor *hu = nt_test_grad1(ssum(nt_mul(g, nt_from_host(uv, NT_F32, 2, SH(4, 3)))), W, false);
    float *h = nt_test_host(hu);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++) {
            double want = 0;
            for (int k = 0; k < 5; k++)
                if (idx[k] == r)
                    want += 2.0 * kv[k * 3 + c] * uv[r * 3 + c];
            assert_true(near(h[r * 3 + c], want, 1e-6, 1e-7));
        }
    free(g0), free(g1), free(h);
    nt_scope_end(s);
}

/* L = sum(s^2 k), s = gather(x [3, 4], 1, idx) or index_select(x, 1, idx):
 * (H u)_{ij} = 2 u_ij sum over the picks of x_ij of their k */
static void test_gather_hvp(void **state)
{
    (void)state;
    float xv[12], uv[12], kv[9];
    for (int i = 0; i < 12; i++)
        xv[i] = 0.3f * (float)i - 1.5f, uv[i] = (float)((i * 5) % 7) - 3.0f;
    for (int i = 0; i < 9; i++)
        kv[i] = 1.0f + 0.25f * (float)i;
    int32_t gi[9] = {1, 1, 3, 0, 2, 0, 3, 3, 3}, si[3] = {2, 0, 2};
    for (int which = 0; which < 2; which++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = nt_test_leaf(xv, 2, SH(3, 4));
        nt_tensor *p = which ? nt_index_select(x, 1, nt_from_host(si, NT_I32, 1, SH(3)))
                             : nt_gather(x, 1, nt_from_host(gi, NT_I32, 2, SH(3, 3)));
        nt_tensor *L = ssum(nt_mul(nt_mul(p, p), nt_from_host(kv, NT_F32, 2, SH(3, 3))));
        nt_tensor *g = nt_test_grad1(L, x, true);
        float *g0 = nt_test_host(nt_test_grad1(L, x, false)), *g1 = nt_test_host(g);
        assert_memory_equal(g0, g1, sizeof xv);
        float *h = nt_test_host(nt_test_grad1(ssum(nt_mul(g, nt_from_host(uv, NT_F32, 2, SH(3, 4)))), x, false));
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) {
                double want = 0;
                for (int c = 0; c < 3; c++)
                    if ((which ? si[c] : gi[i * 3 + c]) == j)
                        want += 2.0 * kv[i * 3 + c] * uv[i * 4 + j];
                assert_true(near(h[i * 4 + j], want, 1e-6, 1e-7));
            }
        free(g0), free(g1), free(h);
        nt_scope_end(s);
    }
}

/* L = sum(w * cumprod(x, 1)) over rows of 5 (one with a zero):
 * d2L/dx_i dx_l = sum_{j >= max(i, l)} w_j prod_{m <= j, m != i, l} x_m
 * (i != l), 0 (i == l) */
static void test_cumprod_hvp(void **state)
{
    (void)state;
    enum { R = 2, N = 5 };
    float xv[R * N] = {0.9f, -1.2f, 1.1f, 0.7f, -0.8f, 1.3f, 0.0f, -0.6f, 1.4f, 0.5f};
    float wv[R * N], uv[R * N];
    for (int i = 0; i < R * N; i++)
        wv[i] = 0.5f + 0.1f * (float)i, uv[i] = (float)((i * 3) % 5) - 2.0f;
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 2, SH(R, N));
    nt_tensor *L = ssum(nt_mul(nt_cumprod(x, 1), nt_from_host(wv, NT_F32, 2, SH(R, N))));
    nt_tensor *g = nt_test_grad1(L, x, true);
    float *g0 = nt_test_host(nt_test_grad1(L, x, false)), *g1 = nt_test_host(g);
    assert_memory_equal(g0, g1, sizeof xv);
    float *h = nt_test_host(nt_test_grad1(ssum(nt_mul(g, nt_from_host(uv, NT_F32, 2, SH(R, N)))), x, false));
    for (int r = 0; r < R; r++) {
        const float *X = xv + r * N, *W = wv + r * N, *U = uv + r * N;
        for (int i = 0; i < N; i++) {
            double want = 0;
            for (int l = 0; l < N; l++) {
                if (l == i)
                    continue;
                double hil = 0;
                for (int j = i > l ? i : l; j < N; j++) {
                    double pr = W[j];
                    for (int m = 0; m <= j; m++)
                        if (m != i && m != l)
                            pr *= X[m];
                    hil += pr;
                }
                want += hil * U[l];
            }
            if (!near(h[r * N + i], want, 1e-5, 1e-6))
                fail_msg("cumprod Hu[%d][%d]: %.9g, double %.9g", r, i, h[r * N + i], want);
        }
    }
    free(g0), free(g1), free(h);
    nt_scope_end(s);
}

/* ---------------- against PyTorch 1.13 ---------------- */

static nt_tensor *pool_t(long off, int nd, const int64_t *sh, bool req)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= sh[i];
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = nt_test_fbits(gg_pool[off + i]);
    nt_tensor *t = req ? nt_test_leaf(v, nd, sh) : nt_from_host(v, NT_F32, nd, sh);
    free(v);
    return t;
}

/* t (NULL: zeros) against PyTorch's n values at gg_pool[off] */
static void vs_torch(const char *what, nt_tensor *t, long off, int64_t n, double rel, double abs_tol)
{
    float *got = t ? nt_test_host(t) : calloc((size_t)n, sizeof *got);
    for (int64_t i = 0; i < n; i++) {
        float w = nt_test_fbits(gg_pool[off + i]);
        bool ok = isinf(w) || isinf(got[i]) ? got[i] == w : near(got[i], w, rel, abs_tol);
        if (!ok)
            fail_msg("%s[%lld]: got %.9g (0x%08x), PyTorch %.9g (0x%08x)", what, (long long)i,
                     (double)got[i], nt_test_ubits(got[i]), (double)w, nt_test_ubits(w));
    }
    free(got);
}

static const unop *unop_named(const char *name)
{
    for (int k = 0; k < NUNOPS; k++)
        if (!strcmp(UNOPS[k].name, name))
            return &UNOPS[k];
    fail_msg("no op %s", name);
    return NULL;
}

static bool agree(float got, float w, double rel, double abs_tol)
{
    return isinf(w) || isinf(got) ? got == w : near(got, w, rel, abs_tol);
}

/* f'' on edge values within 3e-5 relative (it composes other f32 ops than
 * PyTorch's kernels: gelu_tanh'' at 3 is 7e-6 from the double value,
 * PyTorch's f32 one 3e-6 on the other side), NaN where PyTorch has NaN, the same infinities.  f'
 * is the ops' own (checked against PyTorch by their tests, to their
 * definitions: softsign' is 0 at +-Inf where PyTorch's x / (1 + |x|)
 * gives NaN, ...): where it differs from PyTorch's by definition (not
 * within 1e-5) the second derivative is not compared either, at most at
 * the three non-finite points. */
static void test_torch_ew(void **state)
{
    (void)state;
    for (size_t r = 0; r < sizeof gg_ew / sizeof gg_ew[0]; r++) {
        const unop *u = unop_named(gg_ew[r].name);
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = pool_t(gg_ew_x, 1, SH(GG_NEDGE), true);
        nt_tensor *g = nt_test_grad1(ssum(u->f(x)), x, true);
        nt_tensor *h = nt_requires_grad(g) ? nt_test_grad1(ssum(g), x, false) : NULL;
        float *gv = nt_test_host(g), *hv = h ? nt_test_host(h) : calloc(GG_NEDGE, sizeof *hv);
        int skipped = 0;
        for (int i = 0; i < GG_NEDGE; i++) {
            float xi = nt_test_fbits(gg_pool[gg_ew_x + i]);
            float wg = nt_test_fbits(gg_pool[gg_ew[r].g + i]);
            float wh = nt_test_fbits(gg_pool[gg_ew[r].h + i]);
            if (!agree(gv[i], wg, 1e-5, 1e-9)) {
                if (isfinite(xi))
                    fail_msg("%s' at %g: %.9g, PyTorch %.9g", u->name, xi, gv[i], wg);
                skipped++;
                continue;
            }
            if (!agree(hv[i], wh, 3e-5, 1e-9)) /* (1 - tanh^2 rounds to 0 past |x| ~ 4.5) */
                fail_msg("%s'' at %g: got %.9g (0x%08x), PyTorch %.9g (0x%08x)", u->name, xi,
                         hv[i], nt_test_ubits(hv[i]), wh, nt_test_ubits(wh));
        }
        assert_true(skipped <= 3);
        free(gv), free(hv);
        nt_scope_end(s);
    }
}

static void test_torch_binary(void **state)
{
    (void)state;
    for (int which = 0; which < 3; which++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *a = pool_t(gg_bin_a, 2, SH(3, 5), true), *b = pool_t(gg_bin_b, 1, SH(5), true);
        nt_tensor *ab[2] = {a, b}, *g[2], *h[2] = {NULL, NULL};
        nt_tensor *L = ssum(binop(which, a, b));
        assert_int_equal(nt_autograd_grad(&L, 1, ab, 2, NULL, true, true, false, g), 0);
        nt_tensor *dot = nt_add(ssum(nt_mul(g[0], pool_t(gg_bin_u, 2, SH(3, 5), false))),
                                ssum(nt_mul(g[1], pool_t(gg_bin_w, 1, SH(5), false))));
        if (nt_requires_grad(dot))
            assert_int_equal(nt_autograd_grad(&dot, 1, ab, 2, NULL, false, false, true, h), 0);
        const gg_bin_row *r = &gg_bin[which];
        char what[64];
        snprintf(what, sizeof what, "%s ga", r->name);
        vs_torch(what, g[0], r->ga, 15, 4e-7, 1e-30);
        snprintf(what, sizeof what, "%s gb", r->name);
        vs_torch(what, g[1], r->gb, 5, 2e-6, 1e-30); /* a sum over 3 rows */
        snprintf(what, sizeof what, "%s Hu (a)", r->name);
        vs_torch(what, h[0], r->ha, 15, 1e-5, 1e-6);
        snprintf(what, sizeof what, "%s Hu (b)", r->name);
        vs_torch(what, h[1], r->hb, 5, 1e-5, 1e-6);
        nt_scope_end(s);
    }
}

static nt_tensor *idx_t(const int32_t *v, int nd, const int64_t *sh)
{
    return nt_from_host(v, NT_I32, nd, sh);
}

static void test_torch_hvp(void **state)
{
    (void)state;
    for (int c = 0; c < 4; c++) {
        const gg_hv_row *r = &gg_hv[c];
        nt_scope *s = nt_scope_begin();
        const int64_t *xs = c == 2 ? SH(6, 5) : c == 3 ? SH(3, 1, 7) : SH(3, 5, 7);
        int xnd = c == 2 ? 2 : 3;
        int64_t xn = c == 2 ? 30 : c == 3 ? 21 : 105;
        nt_tensor *x = pool_t(r->x, xnd, xs, true), *y;
        switch (c) {
        case 0: y = nt_gather(x, 1, idx_t(gg_gather_idx, 3, SH(3, 4, 7))); break;
        case 1: y = nt_index_select(x, 1, idx_t(gg_select_idx, 1, SH(6))); break;
        case 2: y = nt_embedding(x, idx_t(gg_embed_idx, 2, SH(2, 3))); break;
        default: y = nt_cumprod(x, 2); break;
        }
        if (c < 3)
            y = nt_mul(y, y);
        int64_t ysh[3];
        for (int i = 0; i < nt_ndim(y); i++)
            ysh[i] = nt_shape(y, i);
        nt_tensor *g = nt_test_grad1(ssum(nt_mul(y, pool_t(r->k, nt_ndim(y), ysh, false))), x, true);
        nt_tensor *hu = nt_test_grad1(ssum(nt_mul(g, pool_t(r->u, xnd, xs, false))), x, false);
        char what[64];
        snprintf(what, sizeof what, "%s g", r->name);
        vs_torch(what, g, r->g, xn, 1e-6, 1e-7);
        snprintf(what, sizeof what, "%s Hu", r->name);
        vs_torch(what, hu, r->hu, xn, 1e-5, 1e-6);
        nt_scope_end(s);
    }
}

static void test_torch_sdpa(void **state)
{
    (void)state;
    for (int c = 0; c < 2; c++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *in[3] = {pool_t(gg_at_q, 3, SH(2, 5, 3), true),
                            pool_t(gg_at_k, 3, SH(2, 5, 3), true),
                            pool_t(gg_at_v, 3, SH(2, 5, 3), true)};
        nt_tensor *m = c ? nt_from_host(gg_at_mask, NT_U8, 2, SH(5, 5)) : NULL;
        nt_tensor *y = nt_scaled_dot_product_attention(in[0], in[1], in[2], m, c == 0, 0.6);
        nt_tensor *L = ssum(nt_mul(y, pool_t(gg_at_go, 3, SH(2, 5, 3), false))), *g[3], *h[3];
        assert_int_equal(nt_autograd_grad(&L, 1, in, 3, NULL, true, true, false, g), 0);
        nt_tensor *dot = NULL;
        for (int i = 0; i < 3; i++) {
            nt_tensor *d = ssum(nt_mul(g[i], pool_t(gg_at_u[i], 3, SH(2, 5, 3), false)));
            dot = dot ? nt_add(dot, d) : d;
        }
        assert_int_equal(nt_autograd_grad(&dot, 1, in, 3, NULL, false, false, false, h), 0);
        for (int i = 0; i < 3; i++) {
            char what[64];
            snprintf(what, sizeof what, "sdpa %s d/d%c", gg_at[c].variant, "qkv"[i]);
            vs_torch(what, g[i], gg_at[c].g[i], 30, 1e-5, 1e-6);
            snprintf(what, sizeof what, "sdpa %s Hu d/d%c", gg_at[c].variant, "qkv"[i]);
            vs_torch(what, h[i], gg_at[c].h[i], 30, 1e-4, 1e-5);
        }
        nt_scope_end(s);
    }
}

/* ---------------- bits across backends and modes ---------------- */

typedef struct {
    float *v;
    size_t n;
} bits_t;

static void push(bits_t *b, nt_tensor *t)
{
    float *h = nt_test_host(t);
    int64_t n = nt_test_tnumel(t);
    b->v = realloc(b->v, (b->n + (size_t)n) * sizeof *b->v);
    memcpy(b->v + b->n, h, (size_t)n * sizeof *h);
    b->n += (size_t)n;
    free(h);
}

/* first and second derivatives of the new ops in one setting */
static void all_bits(bits_t *b)
{
    float xv[12];
    for (int i = 0; i < 12; i++)
        xv[i] = 0.37f * (float)i - 2.1f;
    int32_t idx[4] = {1, 3, 1, 0};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 2, SH(3, 4));
    nt_tensor *ys[6] = {
        ssum(nt_atan2(nt_pow(nt_add_scalar(nt_abs(x), 0.5), nt_cos(x)), nt_add_scalar(x, 0.3))),
        ssum(nt_mul(nt_sin(x), nt_erf(x))),
        ssum(nt_mul(nt_softplus(x), nt_cos(x))),
        ssum(nt_cumprod(nt_mul_scalar(x, 0.5), 1)),
        ssum(nt_pow_scalar(nt_index_select(x, 1, nt_from_host(idx, NT_I32, 1, SH(4))), 3.0)),
        ssum(nt_mul(nt_scaled_dot_product_attention(nt_reshape(x, 3, SH(1, 3, 4)),
                                                    nt_reshape(nt_sin(x), 3, SH(1, 3, 4)),
                                                    nt_reshape(x, 3, SH(1, 3, 4)), NULL, true, 0),
                    nt_reshape(x, 3, SH(1, 3, 4)))),
    };
    for (int k = 0; k < 6; k++) {
        nt_tensor *g = nt_test_grad1(ys[k], x, true);
        push(b, g);
        push(b, nt_test_grad1(ssum(nt_mul(g, g)), x, false));
    }
    nt_scope_end(s);
}

static void test_bits_across_configs(void **state)
{
    (void)state;
    bits_t ref = {0};
    for (int c = 0; c < NT_TEST_NCFG; c++) {
        nt_test_cfg(c);
        bits_t got = {0};
        all_bits(&got);
        if (c == 0) {
            ref = got;
            continue;
        }
        assert_int_equal(got.n, ref.n);
        for (size_t i = 0; i < ref.n; i++)
            if (memcmp(&got.v[i], &ref.v[i], sizeof(float)))
                fail_msg("%s/%s/fusion %s: value %zu is %.9g, cpu deterministic %.9g",
                         NT_TEST_CFGS[c][0], NT_TEST_CFGS[c][1], NT_TEST_CFGS[c][2], i,
                         (double)got.v[i], (double)ref.v[i]);
        free(got.v);
    }
    free(ref.v);
}

/* ---------------- attention ---------------- */

/* The composite backward of a create_graph pass against the fused kernel's
 * (another order of the same f32 sums): close, not equal; a row with no
 * key left gets 0 either way. */
static void test_sdpa_first_order(void **state)
{
    (void)state;
    enum { T = 5, D = 4 };
    float qv[2 * T * D], kv[2 * T * D], vv[2 * T * D];
    for (int i = 0; i < 2 * T * D; i++) {
        qv[i] = sinf(0.7f * (float)i);
        kv[i] = cosf(0.3f * (float)i + 1);
        vv[i] = 0.1f * (float)(i % 9) - 0.4f;
    }
    uint8_t mv[T * T];
    for (int i = 0; i < T * T; i++)
        mv[i] = (uint8_t)((i * 7) % 3 != 0 && i / T != 2); /* row 2 attends nothing */
    for (int variant = 0; variant < 3; variant++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *q = nt_test_leaf(qv, 3, SH(2, T, D)), *k = nt_test_leaf(kv, 3, SH(2, T, D));
        nt_tensor *v = nt_test_leaf(vv, 3, SH(2, T, D));
        nt_tensor *m = variant == 2 ? nt_from_host(mv, NT_U8, 2, SH(T, T)) : NULL;
        nt_tensor *y = nt_scaled_dot_product_attention(q, k, v, m, variant == 1, 0);
        nt_tensor *L = ssum(nt_mul(y, nt_sin(y)));
        nt_tensor *in[3] = {q, k, v}, *ga[3], *gb[3];
        assert_int_equal(nt_autograd_grad(&L, 1, in, 3, NULL, true, false, false, ga), 0);
        assert_int_equal(nt_autograd_grad(&L, 1, in, 3, NULL, true, true, false, gb), 0);
        for (int j = 0; j < 3; j++) {
            assert_true(nt_requires_grad(gb[j]));
            float *a = nt_test_host(ga[j]), *b = nt_test_host(gb[j]);
            for (int i = 0; i < 2 * T * D; i++)
                if (!near(b[i], a[i], 1e-5, 1e-6))
                    fail_msg("sdpa variant %d d/d%c[%d]: create_graph %.9g, fused %.9g", variant,
                             "qkv"[j], i, b[i], a[i]);
            free(a), free(b);
        }
        nt_scope_end(s);
    }
}

/* ---------------- nt_gradgradcheck ---------------- */

static nt_tensor *gg_unary(nt_tensor *const *in, void *ctx)
{
    const unop *u = ctx;
    return nt_mul(u->f(in[0]), in[1]);
}

static nt_tensor *gg_index(nt_tensor *const *in, void *ctx)
{
    int which = *(int *)ctx;
    int32_t gi[6] = {2, 0, 2, 1, 1, 0}, si[4] = {1, 0, 1, 2}, ei[4] = {2, 0, 2, 1};
    int32_t sc[3] = {2, 0, 1};
    nt_tensor *x = in[0], *p;
    switch (which) {
    case 0: p = nt_gather(x, 1, nt_from_host(gi, NT_I32, 2, SH(2, 3))); break;
    case 1: p = nt_index_select(x, 1, nt_from_host(si, NT_I32, 1, SH(4))); break;
    case 2: p = nt_embedding(nt_reshape(x, 2, SH(3, 2)), nt_from_host(ei, NT_I32, 1, SH(4))); break;
    case 3: p = nt_scatter(x, 1, nt_from_host(sc, NT_I32, 2, SH(1, 3)), nt_mul(in[1], in[1])); break;
    default: p = nt_diagonal(nt_reshape(x, 2, SH(2, 3)), 1, 0, 1); break;
    }
    return nt_mul(p, nt_tanh(p));
}

static nt_tensor *gg_binop(nt_tensor *const *in, void *ctx)
{
    return binop(*(int *)ctx, in[0], in[1]);
}

static nt_tensor *gg_cumprod(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_cumprod(in[0], 1);
}

static nt_tensor *gg_sdpa(nt_tensor *const *in, void *ctx)
{
    int variant = *(int *)ctx;
    uint8_t mv[9] = {1, 0, 1, 1, 1, 0, 0, 1, 1};
    float fm[9] = {0, -1, 0.5f, 0.25f, 0, -2, 1, 0, -0.5f};
    nt_tensor *m = variant == 2   ? nt_from_host(mv, NT_U8, 2, SH(3, 3))
                   : variant == 3 ? nt_from_host(fm, NT_F32, 2, SH(3, 3))
                                  : NULL;
    return nt_scaled_dot_product_attention(in[0], in[1], in[2], m, variant == 1, 0.7);
}

static void test_gradgradcheck_ops(void **state)
{
    (void)state;
    /* (above log1p's pole at -1) */
    float xv[6] = {-0.85f, -0.4f, 0.3f, 0.9f, 1.6f, 2.4f}, wv[6] = {0.5f, -1, 1.5f, 0.75f, -0.25f, 1};
    for (int k = 0; k < NUNOPS; k++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *in[2] = {nt_test_leaf(xv, 1, SH(6)), nt_test_leaf(wv, 1, SH(6))};
        int rc = nt_gradgradcheck(gg_unary, in, 2, (void *)&UNOPS[k], NULL, 1e-2, 2e-2, 2e-2);
        if (rc)
            fail_msg("%s: %s", UNOPS[k].name, nt_last_error_message());
        nt_scope_end(s);
    }
    float iv[6] = {0.4f, -0.9f, 1.2f, 0.6f, -0.3f, 0.8f}, sv[3] = {0.7f, -1.1f, 0.5f};
    for (int which = 0; which < 5; which++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *in[2] = {nt_test_leaf(iv, 2, SH(2, 3)), nt_test_leaf(sv, 2, SH(1, 3))};
        int n = which == 3 ? 2 : 1;
        if (nt_gradgradcheck(gg_index, in, n, &which, NULL, 1e-2, 2e-2, 2e-2))
            fail_msg("index op %d: %s", which, nt_last_error_message());
        nt_scope_end(s);
    }
    {
        float cv[10] = {0.9f, -1.2f, 0.0f, 0.7f, -0.8f, 1.3f, 0.6f, -0.6f, 1.4f, 0.5f};
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = nt_test_leaf(cv, 2, SH(2, 5));
        if (nt_gradgradcheck(gg_cumprod, &x, 1, NULL, NULL, 1e-2, 2e-2, 2e-2))
            fail_msg("cumprod: %s", nt_last_error_message());
        nt_scope_end(s);
    }
    float q[12], kk[12], v[6];
    for (int i = 0; i < 12; i++)
        q[i] = 0.3f * sinf((float)i), kk[i] = 0.4f * cosf(1.3f * (float)i);
    for (int i = 0; i < 6; i++)
        v[i] = 0.2f * (float)i - 0.5f;
    for (int variant = 0; variant < 4; variant++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *in[3] = {nt_test_leaf(q, 3, SH(1, 3, 4)), nt_test_leaf(kk, 3, SH(1, 3, 4)),
                            nt_test_leaf(v, 3, SH(1, 3, 2))};
        if (nt_gradgradcheck(gg_sdpa, in, 3, &variant, NULL, 1e-2, 2e-2, 2e-2))
            fail_msg("sdpa variant %d: %s", variant, nt_last_error_message());
        nt_scope_end(s);
    }
    /* pow (a > 0), atan2, fmod of two tensors, b broadcast along rows
     * (a / b away from fmod's jumps by more than eps) */
    float pa[6] = {0.6f, 1.3f, 2.2f, 0.9f, 1.7f, 1.1f}, pb[3] = {1.7f, -0.8f, 0.7f};
    for (int which = 0; which < 3; which++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *in[2] = {nt_test_leaf(pa, 2, SH(2, 3)), nt_test_leaf(pb, 1, SH(3))};
        if (nt_gradgradcheck(gg_binop, in, 2, &which, NULL, 1e-2, 2e-2, 2e-2))
            fail_msg("binary op %d: %s", which, nt_last_error_message());
        nt_scope_end(s);
    }
    /* a given grad_output */
    {
        float go[6] = {1, -2, 0.5f, 0.25f, -1, 3};
        nt_scope *s = nt_scope_begin();
        nt_tensor *in[2] = {nt_test_leaf(xv, 1, SH(6)), nt_test_leaf(wv, 1, SH(6))};
        assert_int_equal(nt_gradgradcheck(gg_unary, in, 2, (void *)&UNOPS[0],
                                          nt_from_host(go, NT_F32, 1, SH(6)), 1e-2, 2e-2, 2e-2),
                         0);
        nt_scope_end(s);
    }
}

/* A user op whose backward is right to first order but cut from the graph
 * (x detached): nt_gradcheck passes, nt_gradgradcheck finds the second
 * derivative 0 where it is 6 x. */
static nt_tensor *cube_fwd(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mul(nt_mul(in[0], in[0]), in[0]);
}
static int cube_bad_bwd(nt_tensor *g, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                        void *ctx)
{
    (void)out, (void)ctx;
    nt_tensor *x = nt_detach(in[0]);
    gin[0] = nt_mul(g, nt_mul_scalar(nt_mul(x, x), 3.0));
    return gin[0] ? 0 : nt_last_error();
}
static nt_tensor *gg_custom(nt_tensor *const *in, void *ctx) { return nt_op_call(*(int *)ctx, in); }

static void test_gradgradcheck_catches_wrong(void **state)
{
    (void)state;
    nt_op_def def = {"gg_bad_cube", 1, cube_fwd, cube_bad_bwd, NULL};
    int op = nt_op_register(&def);
    assert_true(op >= 0);
    float xv[3] = {0.5f, -1.5f, 1.25f};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(3));
    assert_int_equal(nt_gradcheck(gg_custom, &x, 1, &op, 1e-2, 2e-2, 2e-2), 0);
    nt_test_expect_err(nt_gradgradcheck(gg_custom, &x, 1, &op, NULL, 1e-2, 2e-2, 2e-2), NT_ERANGE,
                       "nt_gradgradcheck", "input 0 element 0", "analytic second derivative 0",
                       "numeric");
    nt_scope_end(s);
}

/* An f64 input makes nt_gradgradcheck run in double: PyTorch's tolerances
 * (eps 1e-6, atol 1e-5, rtol 1e-3) hold for products and the transcendental
 * ops, where the same check in f32 cannot resolve the perturbation. */
static nt_tensor *gg_f64(nt_tensor *const *in, void *ctx)
{
    switch (*(int *)ctx) {
    case 0: return nt_mul(nt_mul(in[0], in[0]), nt_mul(in[0], in[1]));
    case 1: return nt_mul(nt_tanh(in[0]), in[1]);
    case 2: return nt_mul(nt_exp(in[0]), in[1]);
    default: return nt_mul(nt_sin(in[0]), in[1]);
    }
}

static void test_gradgradcheck_f64(void **state)
{
    (void)state;
    double xv[5] = {-0.85, -0.4, 0.3, 0.9, 1.6}, wv[5] = {0.5, -1, 1.5, 0.75, -0.25};
    for (int which = 0; which < 4; which++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = nt_from_host(xv, NT_F64, 1, SH(5)), *w = nt_from_host(wv, NT_F64, 1, SH(5));
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        assert_int_equal(nt_set_requires_grad(w, true), 0);
        nt_tensor *in[2] = {x, w};
        if (nt_gradgradcheck(gg_f64, in, 2, &which, NULL, 1e-6, 1e-5, 1e-3))
            fail_msg("f64 case %d: %s", which, nt_last_error_message());
        /* the same in f32 at these tolerances: eps is below f32's spacing */
        nt_tensor *xf = nt_detach(nt_cast(x, NT_F32)), *wf = nt_detach(nt_cast(w, NT_F32));
        assert_int_equal(nt_set_requires_grad(xf, true), 0);
        assert_int_equal(nt_set_requires_grad(wf, true), 0);
        nt_tensor *inf[2] = {xf, wf};
        assert_int_equal(nt_gradgradcheck(gg_f64, inf, 2, &which, NULL, 1e-6, 1e-5, 1e-3),
                         NT_ERANGE);
        nt_scope_end(s);
    }
}

static nt_tensor *gg_null(nt_tensor *const *in, void *ctx)
{
    (void)in, (void)ctx;
    return NULL;
}
static int ckpt_block(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = nt_mul(in[0], in[0]);
    return out[0] ? 0 : nt_last_error();
}
static nt_tensor *gg_ckpt(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    nt_tensor *y = NULL;
    return nt_checkpoint(ckpt_block, NULL, in, 1, &y, 1) ? NULL : y;
}
static nt_tensor *gg_const(nt_tensor *const *in, void *ctx)
{
    (void)in, (void)ctx;
    return nt_ones(NT_F32, 1, SH(2));
}
static nt_tensor *gg_sq(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mul(in[0], in[0]);
}
static nt_tensor *gg_linear(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mul_scalar(in[0], 3.0);
}

static void test_gradgradcheck_errors(void **state)
{
    (void)state;
    float xv[3] = {0.5f, 1.5f, 2};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(3)), *c = nt_from_host(xv, NT_F32, 1, SH(3));
    nt_tensor *in2[2] = {x, NULL};
    const unop *u = &UNOPS[0];
    nt_test_expect_err(nt_gradgradcheck(NULL, &x, 1, NULL, NULL, 1e-2, 1e-2, 1e-2), NT_EINVAL,
                       "nt_gradgradcheck", "'f' is NULL");
    nt_test_expect_err(nt_gradgradcheck(gg_sq, NULL, 1, NULL, NULL, 1e-2, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "'n'", "NULL");
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &x, 0, NULL, NULL, 1e-2, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "'n' is 0", "1..16");
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &x, 17, NULL, NULL, 1e-2, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "'n' is 17");
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &x, 1, NULL, NULL, 0, 1e-2, 1e-2), NT_EINVAL,
                       "nt_gradgradcheck", "'eps' is 0");
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &x, 1, NULL, NULL, NAN, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "'eps'");
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &x, 1, NULL, NULL, INFINITY, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "'eps'");
    nt_test_expect_err(nt_gradgradcheck(gg_unary, in2, 2, (void *)u, NULL, 1e-2, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "in[1]");
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &c, 1, NULL, NULL, 1e-2, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "'in[0]' does not require grad");
    nt_tensor *bad = nt_ones(NT_F32, 1, SH(4));
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &x, 1, NULL,
                                        nt_reshape(nt_ones(NT_F32, 1, SH(3)), 2, SH(1, 3)), 1e-2,
                                        1e-2, 1e-2),
                       NT_ESHAPE, "nt_gradgradcheck", "'grad_output'", "[1, 3]", "[3]");
    (void)bad;
    int32_t iv[3] = {1, 2, 3};
    nt_test_expect_err(nt_gradgradcheck(gg_sq, &x, 1, NULL,
                                        nt_from_host(iv, NT_I32, 1, SH(3)), 1e-2, 1e-2, 1e-2),
                       NT_ESHAPE, "nt_gradgradcheck", "'grad_output'", "i32");
    nt_test_expect_err(nt_gradgradcheck(gg_null, &x, 1, NULL, NULL, 1e-2, 1e-2, 1e-2),
                       NT_EINVAL, "nt_gradgradcheck", "f returned NULL");
    /* f's own error, said to be within the check */
    nt_test_expect_err(nt_gradgradcheck(gg_cumprod, &x, 1, NULL, NULL, 1e-2, 1e-2, 1e-2),
                       NT_EDIM, "nt_gradgradcheck", "nt_cumprod", "'dim'");
    /* nt_checkpoint's block cannot be differentiated twice: its refusal */
    nt_test_expect_err(nt_gradgradcheck(gg_ckpt, &x, 1, NULL, NULL, 1e-2, 1e-2, 1e-2),
                       NT_ENOTSUP, "nt_gradgradcheck", "nt_checkpoint", "create_graph");
    /* functions with no second derivative: 0 on both sides passes */
    assert_int_equal(nt_gradgradcheck(gg_const, &x, 1, NULL, NULL, 1e-2, 1e-2, 1e-2), 0);
    assert_int_equal(nt_gradgradcheck(gg_linear, &x, 1, NULL, NULL, 1e-2, 1e-2, 1e-2), 0);
    assert_int_equal(nt_last_error(), 0);
    /* .grad is left alone */
    assert_null(nt_grad(x));
    nt_scope_end(s);
}

/* ---------------- removable hooks ---------------- */

typedef struct {
    int calls[3];
    double scale[3];
} hook_log;

static hook_log HL;

static nt_tensor *hook_a(nt_tensor *g, void *ctx)
{
    (void)ctx;
    HL.calls[0]++;
    return nt_mul_scalar(g, HL.scale[0]);
}
static nt_tensor *hook_b(nt_tensor *g, void *ctx)
{
    (void)ctx;
    HL.calls[1]++;
    return nt_mul_scalar(g, HL.scale[1]);
}
static nt_tensor *hook_c(nt_tensor *g, void *ctx)
{
    (void)ctx;
    HL.calls[2]++;
    return nt_add_scalar(g, HL.scale[2]);
}

static float grad0_after(nt_tensor *x, nt_tensor *y)
{
    assert_int_equal(nt_zero_grad(x), 0);
    assert_int_equal(nt_backward_ex(y, true), 0);
    float *g = nt_test_host(nt_grad(x));
    float v = g[0];
    free(g);
    return v;
}

static void test_hooks_removable(void **state)
{
    (void)state;
    memset(&HL, 0, sizeof HL);
    HL.scale[0] = 2, HL.scale[1] = 3, HL.scale[2] = 1;
    float xv[2] = {1.5f, -0.5f};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(2));
    nt_tensor *h = nt_mul_scalar(x, 1.0);
    nt_tensor *y = ssum(nt_mul(h, h)); /* dy/dh = 2 h = 3 at element 0 */
    nt_hook_handle ha = 0, hb = 0, hc = 0;
    assert_int_equal(nt_register_hook_handle(h, hook_a, NULL, &ha), 0);
    assert_int_equal(nt_register_hook_handle(h, hook_b, NULL, &hb), 0);
    assert_int_equal(nt_register_hook_handle(h, hook_c, NULL, &hc), 0);
    assert_true(ha != 0 && hb > ha && hc > hb);
    /* in order: (3 * 2) * 3 + 1 */
    assert_true(grad0_after(x, y) == 19.0f);
    /* the middle one removed: the others keep their order, 3 * 2 + 1 */
    assert_int_equal(nt_remove_hook(hb), 0);
    assert_true(grad0_after(x, y) == 7.0f);
    assert_int_equal(HL.calls[1], 1);
    /* removing twice; unknown handles */
    nt_test_expect_err(nt_remove_hook(hb), NT_ESTATE, "nt_remove_hook", "already removed",
                       "test_gradgrad.c:");
    nt_test_expect_err(nt_remove_hook(0), NT_EINVAL, "nt_remove_hook", "unknown");
    nt_test_expect_err(nt_remove_hook(hc + 1000000), NT_EINVAL, "nt_remove_hook", "unknown");
    assert_int_equal(nt_remove_hook(ha), 0);
    assert_int_equal(nt_remove_hook(hc), 0);
    assert_true(grad0_after(x, y) == 3.0f);
    assert_int_equal(HL.calls[0], 2);
    assert_int_equal(HL.calls[2], 2);
    /* a leaf's hook; nt_register_hook's hooks stay */
    nt_hook_handle hl = 0;
    assert_int_equal(nt_register_hook_handle(x, hook_a, NULL, &hl), 0);
    assert_int_equal(nt_register_hook(x, hook_c, NULL), 0);
    assert_true(grad0_after(x, y) == 7.0f);
    assert_int_equal(nt_remove_hook(hl), 0);
    assert_true(grad0_after(x, y) == 4.0f);
    /* errors of registration: nothing given out */
    nt_hook_handle hz = 77;
    nt_test_expect_err(nt_register_hook_handle(x, NULL, NULL, &hz), NT_EINVAL,
                       "nt_register_hook_handle", "'fn'");
    assert_true(hz == 0);
    nt_test_expect_err(nt_register_hook_handle(x, hook_a, NULL, NULL), NT_EINVAL,
                       "nt_register_hook_handle", "'handle' is NULL");
    nt_tensor *c = nt_from_host(xv, NT_F32, 1, SH(2));
    nt_test_expect_err(nt_register_hook_handle(c, hook_a, NULL, &hz), NT_ESTATE,
                       "nt_register_hook_handle", "does not require grad");
    nt_test_expect_err(nt_register_hook_handle(NULL, hook_a, NULL, &hz), NT_EINVAL,
                       "nt_register_hook_handle", "'t'");
    nt_scope_end(s);
    /* a handle that outlives its graph: removing succeeds once */
    nt_hook_handle ho = 0;
    s = nt_scope_begin();
    nt_tensor *x2 = nt_test_leaf(xv, 1, SH(2));
    nt_tensor *h2 = nt_exp(x2);
    assert_int_equal(nt_register_hook_handle(h2, hook_b, NULL, &ho), 0);
    nt_scope_end(s); /* x2, h2 and the graph go */
    assert_int_equal(nt_remove_hook(ho), 0);
    nt_test_expect_err(nt_remove_hook(ho), NT_ESTATE, "nt_remove_hook", "already removed");
}

/* a removed hook does not run in a create_graph pass either */
static void test_hooks_create_graph(void **state)
{
    (void)state;
    memset(&HL, 0, sizeof HL);
    HL.scale[0] = 10;
    float xv[2] = {0.5f, 1};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(2));
    nt_tensor *h = nt_sin(x);
    nt_hook_handle ha;
    assert_int_equal(nt_register_hook_handle(h, hook_a, NULL, &ha), 0);
    nt_tensor *y = ssum(nt_mul(h, h));
    float *g1 = nt_test_host(nt_test_grad1(y, x, true));
    assert_int_equal(nt_remove_hook(ha), 0);
    float *g2 = nt_test_host(nt_test_grad1(y, x, true));
    for (int i = 0; i < 2; i++)
        assert_true(near(g1[i], 10.0 * g2[i], 1e-6, 0));
    assert_int_equal(HL.calls[0], 1);
    free(g1), free(g2);
    nt_scope_end(s);
}

/* ---------------- no leak ---------------- */

static void test_no_leak(void **state)
{
    (void)state;
    uint64_t live = nt__tensor_live_handles();
    float xv[6] = {-1.3f, -0.4f, 0.3f, 0.9f, 1.6f, 2.4f}, wv[6] = {0.5f, -1, 1.5f, 0.75f, -0.25f, 1};
    nt_tensor *in[2] = {nt_from_host(xv, NT_F32, 1, SH(6)), nt_from_host(wv, NT_F32, 1, SH(6))};
    for (int i = 0; i < 2; i++)
        nt_set_requires_grad(in[i], true);
    nt_scope *s = nt_scope_begin();
    assert_int_equal(nt_gradgradcheck(gg_unary, in, 2, (void *)&UNOPS[2], NULL, 1e-2, 2e-2, 2e-2), 0);
    nt_hook_handle hk;
    nt_tensor *h = nt_sin(in[0]);
    assert_int_equal(nt_register_hook_handle(h, hook_a, NULL, &hk), 0);
    nt_scope_end(s);
    assert_int_equal(nt_remove_hook(hk), 0);
    nt_release(in[0]);
    nt_release(in[1]);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt__tensor_live_handles(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary_second, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_unary_third, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_grad_of_grad_output, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_binary_second, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_embedding_hvp, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gather_hvp, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_cumprod_hvp, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_torch_ew, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_torch_binary, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_torch_hvp, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_torch_sdpa, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bits_across_configs, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sdpa_first_order, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradgradcheck_ops, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradgradcheck_catches_wrong, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradgradcheck_errors, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradgradcheck_f64, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_hooks_removable, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_hooks_create_graph, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_no_leak, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
