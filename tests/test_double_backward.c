/* tests/test_double_backward.c - double backward (issue 34): nt_backward_full
 * and nt_autograd_grad with create_graph, whose gradients are themselves
 * differentiable.
 *
 * - Second derivatives of elementwise functions (x^3, pow, exp, log, sqrt,
 *   tanh, sigmoid, relu, gelu, silu, 1/x, a quotient) against analytic
 *   doubles computed here, and against PyTorch 1.13 on edge values
 *   (tests/torch_refs/double_backward.h from
 *   scripts/torch_refs/double_backward.py).
 * - A Hessian-vector product of a small MLP's loss against central finite
 *   differences of its gradient computed in double here, and PyTorch's.
 * - gradgradcheck: finite differences of the gradient function against
 *   the second backward, over matmul/linear, broadcasting, softmax,
 *   log_softmax, layer_norm, cross_entropy, mse, views, reductions, ...
 * - Gradient-penalty steps (WGAN-GP: ||dL/dx||^2 added to the loss)
 *   against PyTorch's; a MAML step (the gradient through an inner SGD step)
 *   against doubles.
 * - The same bits on every backend and mode (NT_TEST_CFGS), and a
 *   create_graph pass's first gradients equal to a plain pass's.
 * - Ops whose backward cannot be differentiated: an error naming the op.
 * - Errors of the API; no leak (the recorded graph goes with its tensors). */
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
#include "torch_refs/double_backward.h"

uint64_t nt__tensor_live_handles(void); /* core/tensor.c */

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define PERR(call) ((call) ? 0 : nt_last_error())

/* t's shape into sh; returns its ndim */
static int shp(nt_tensor *t, int64_t *sh)
{
    int nd = nt_ndim(t);
    for (int i = 0; i < nd; i++)
        sh[i] = nt_shape(t, i);
    return nd;
}

/* a leaf from the reference pool */
static nt_tensor *pool_leaf(long off, int nd, const int64_t *sh)
{
    int64_t n = nt_test_numel(nd, sh);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = nt_test_fbits(db_pool[off + i]);
    nt_tensor *t = nt_test_leaf(v, nd, sh);
    free(v);
    return t;
}

static bool near(double got, double want, double rel, double abs_tol)
{
    if (isnan(got) || isnan(want))
        return isnan(got) && isnan(want);
    if (isinf(got) || isinf(want))
        return got == want;
    return fabs(got - want) <= abs_tol + rel * fmax(fabs(got), fabs(want));
}

/* got[0, n) against PyTorch's bits at db_pool[off]: within rel/abs. */
static void vs_torch(const char *what, const float *got, long off, int64_t n, double rel,
                     double abs_tol)
{
    for (int64_t i = 0; i < n; i++) {
        float w = nt_test_fbits(db_pool[off + i]);
        if (!near(got[i], w, rel, abs_tol))
            fail_msg("%s[%lld]: got %.9g (0x%08x), PyTorch %.9g (0x%08x)", what, (long long)i,
                     (double)got[i], nt_test_ubits(got[i]), (double)w, nt_test_ubits(w));
    }
}

static nt_tensor *scalar_sum(nt_tensor *t) { return nt_sum(t, NT_DIM_ALL, false); }

/* ---------------- elementwise second derivatives ---------------- */

typedef struct ewfn {
    const char *name;
    nt_tensor *(*f)(nt_tensor *x);
    double (*d1)(double x);
    double (*d2)(double x);
} ewfn;

static nt_tensor *f_cube(nt_tensor *x) { return nt_mul(nt_mul(x, x), x); }
static nt_tensor *f_pow3(nt_tensor *x) { return nt_pow_scalar(x, 3.0); }
static nt_tensor *f_square(nt_tensor *x) { return nt_mul(x, x); }
static nt_tensor *f_exp(nt_tensor *x) { return nt_exp(x); }
static nt_tensor *f_log(nt_tensor *x) { return nt_log(x); }
static nt_tensor *f_sqrt(nt_tensor *x) { return nt_sqrt(x); }
static nt_tensor *f_tanh(nt_tensor *x) { return nt_tanh(x); }
static nt_tensor *f_sigmoid(nt_tensor *x) { return nt_sigmoid(x); }
static nt_tensor *f_relu(nt_tensor *x) { return nt_relu(x); }
static nt_tensor *f_gelu(nt_tensor *x) { return nt_gelu(x); }
static nt_tensor *f_silu(nt_tensor *x) { return nt_silu(x); }
static nt_tensor *f_recip(nt_tensor *x) { return nt_div(nt_ones(NT_F32, 0, NULL), x); }
static nt_tensor *f_negexp(nt_tensor *x) { return nt_exp(nt_neg(x)); }
static nt_tensor *f_div(nt_tensor *x) { return nt_div(x, nt_add_scalar(nt_mul(x, x), 1.0)); }

static double sg(double x) { return 1.0 / (1.0 + exp(-x)); }
static double phi(double x) { return exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }
static double d1_cube(double x) { return 3 * x * x; }
static double d2_cube(double x) { return 6 * x; }
static double d1_sq(double x) { return 2 * x; }
static double d2_sq(double x) { return (void)x, 2.0; }
static double d_exp(double x) { return exp(x); }
static double d1_log(double x) { return 1 / x; }
static double d2_log(double x) { return -1 / (x * x); }
static double d1_sqrt(double x) { return 0.5 / sqrt(x); }
static double d2_sqrt(double x) { return -0.25 * pow(x, -1.5); }
static double d1_tanh(double x) { return 1 - tanh(x) * tanh(x); }
static double d2_tanh(double x) { return -2 * tanh(x) * (1 - tanh(x) * tanh(x)); }
static double d1_sig(double x) { return sg(x) * (1 - sg(x)); }
static double d2_sig(double x) { return sg(x) * (1 - sg(x)) * (1 - 2 * sg(x)); }
static double d1_relu(double x) { return x > 0; }
static double d2_relu(double x) { return (void)x, 0.0; }
static double d1_gelu(double x) { return 0.5 * (1 + erf(x / sqrt(2.0))) + x * phi(x); }
static double d2_gelu(double x) { return phi(x) * (2 - x * x); }
static double d1_silu(double x) { return sg(x) * (1 + x * (1 - sg(x))); }
static double d2_silu(double x) { return sg(x) * (1 - sg(x)) * (2 + x * (1 - 2 * sg(x))); }
static double d1_recip(double x) { return -1 / (x * x); }
static double d2_recip(double x) { return 2 / (x * x * x); }
static double d1_negexp(double x) { return -exp(-x); }
static double d2_negexp(double x) { return exp(-x); }
static double d1_div(double x) { return (1 - x * x) / ((x * x + 1) * (x * x + 1)); }
static double d2_div(double x) { return (2 * x * x * x - 6 * x) / pow(x * x + 1, 3); }

/* in the order of db_ew_rows */
static const ewfn EWF[] = {
    {"cube", f_cube, d1_cube, d2_cube},      {"pow3", f_pow3, d1_cube, d2_cube},
    {"square", f_square, d1_sq, d2_sq},      {"exp", f_exp, d_exp, d_exp},
    {"log", f_log, d1_log, d2_log},          {"sqrt", f_sqrt, d1_sqrt, d2_sqrt},
    {"tanh", f_tanh, d1_tanh, d2_tanh},      {"sigmoid", f_sigmoid, d1_sig, d2_sig},
    {"relu", f_relu, d1_relu, d2_relu},      {"gelu", f_gelu, d1_gelu, d2_gelu},
    {"silu", f_silu, d1_silu, d2_silu},      {"recip", f_recip, d1_recip, d2_recip},
    {"neg_exp", f_negexp, d1_negexp, d2_negexp}, {"div", f_div, d1_div, d2_div},
};
#define NEW ((int)(sizeof EWF / sizeof EWF[0]))

/* g = d/dx sum(f(x)) with create_graph, h = d/dx sum(g), as host arrays */
static void ew_run(const ewfn *e, float *g, float *h)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = pool_leaf(db_edge_x, 1, SH(DB_NEDGE));
    nt_tensor *gt = nt_test_grad1(scalar_sum(e->f(x)), x, true);
    float *v = nt_test_host(gt);
    memcpy(g, v, DB_NEDGE * sizeof *g);
    free(v);
    nt_tensor *ht = NULL;
    nt_tensor *y2 = scalar_sum(gt);
    if (nt_requires_grad(y2)) {
        assert_int_equal(nt_autograd_grad(&y2, 1, &x, 1, NULL, false, false, true, &ht), 0);
    }
    if (ht) {
        v = nt_test_host(ht);
        memcpy(h, v, DB_NEDGE * sizeof *h);
        free(v);
    } else {
        memset(h, 0, DB_NEDGE * sizeof *h);
    }
    nt_scope_end(s);
}

static void test_ew_second_derivatives(void **state)
{
    (void)state;
    assert_int_equal((int)(sizeof db_ew_rows / sizeof db_ew_rows[0]), NEW);
    for (int k = 0; k < NEW; k++) {
        const ewfn *e = &EWF[k];
        assert_string_equal(e->name, db_ew_rows[k].name);
        float g[DB_NEDGE], h[DB_NEDGE];
        ew_run(e, g, h);
        char what[64];
        for (int i = 0; i < DB_NEDGE; i++) {
            double x = nt_test_fbits(db_pool[db_edge_x + i]);
            /* against analytic doubles where x is finite, in the domain,
             * and the derivative is an f32 number; absolute 3e-7: 1 - y^2
             * and y (1 - y) of an f32 y near +-1 or 1 cancel to a few
             * ulp of 1 (tanh''(-9) is 2^-22 in f32, 1.2e-7 in double) */
            double r1 = e->d1(x), r2 = e->d2(x);
            bool dom = isfinite(x) && !((!strcmp(e->name, "log") || !strcmp(e->name, "sqrt") ||
                                        !strcmp(e->name, "recip")) && x <= 1e-19);
            if (dom && isfinite(r1) && fabs(r1) < FLT_MAX && !near(g[i], r1, 2e-5, 3e-7))
                fail_msg("%s' at %g: got %.9g, double %.17g", e->name, x, (double)g[i], r1);
            if (dom && isfinite(r2) && fabs(r2) < FLT_MAX && !near(h[i], r2, 2e-5, 3e-7))
                fail_msg("%s'' at %g: got %.9g, double %.17g", e->name, x, (double)h[i], r2);
        }
        /* against PyTorch at every edge value.  relu at NaN: PyTorch's
         * threshold_backward passes the gradient (NaN <= 0 is false),
         * ntensor's relu backward (y > 0 ? g : 0) does not -- the first
         * derivative's definition, older than double backward */
        if (!strcmp(e->name, "relu"))
            g[DB_NEDGE - 1] = nt_test_fbits(db_pool[db_ew_rows[k].g + DB_NEDGE - 1]);
        /* relative 1e-5: the transcendentals are core/nmath.h's (<= 2 ulp
         * apart from PyTorch's); absolute 3e-7: a 1-ulp difference in
         * tanh(-9) (ours -1 + 2^-24, PyTorch's -1) is 2^-23 in 1 - y^2 */
        snprintf(what, sizeof what, "%s'", e->name);
        vs_torch(what, g, db_ew_rows[k].g, DB_NEDGE, 1e-5, 3e-7);
        snprintf(what, sizeof what, "%s''", e->name);
        vs_torch(what, h, db_ew_rows[k].h, DB_NEDGE, 1e-5, 3e-7);
    }
}

/* ---------------- a Hessian-vector product of an MLP ---------------- */

static const int64_t HV_SH[4][2] = {{4, 3}, {4, 0}, {2, 4}, {2, 0}};
static int hv_nd(int i) { return HV_SH[i][1] ? 2 : 1; }
static int64_t hv_n(int i) { return HV_SH[i][0] * (HV_SH[i][1] ? HV_SH[i][1] : 1); }

/* mse(tanh(X W1^T + b1) W2^T + b2, T) and its gradient, in double */
static void mlp_grad_d(const double *p[4], double *g[4])
{
    double X[5][3], T[5][2], h[5][4], o[5][2];
    for (int i = 0; i < 15; i++)
        X[i / 3][i % 3] = nt_test_fbits(db_pool[db_hvp_X + i]);
    for (int i = 0; i < 10; i++)
        T[i / 2][i % 2] = nt_test_fbits(db_pool[db_hvp_T + i]);
    for (int k = 0; k < 4; k++)
        memset(g[k], 0, (size_t)hv_n(k) * sizeof(double));
    for (int r = 0; r < 5; r++) {
        for (int j = 0; j < 4; j++) {
            double a = p[1][j];
            for (int c = 0; c < 3; c++)
                a += X[r][c] * p[0][j * 3 + c];
            h[r][j] = tanh(a);
        }
        for (int j = 0; j < 2; j++) {
            double a = p[3][j];
            for (int c = 0; c < 4; c++)
                a += h[r][c] * p[2][j * 4 + c];
            o[r][j] = a;
        }
        for (int j = 0; j < 2; j++) {
            double go = 2.0 * (o[r][j] - T[r][j]) / 10.0;
            g[3][j] += go;
            for (int c = 0; c < 4; c++)
                g[2][j * 4 + c] += go * h[r][c];
        }
        for (int c = 0; c < 4; c++) {
            double gh = 0;
            for (int j = 0; j < 2; j++)
                gh += 2.0 * (o[r][j] - T[r][j]) / 10.0 * p[2][j * 4 + c];
            double ga = gh * (1 - h[r][c] * h[r][c]);
            g[1][c] += ga;
            for (int k = 0; k < 3; k++)
                g[0][c * 3 + k] += ga * X[r][k];
        }
    }
}

/* hv[k] = H v by the f32 double backward; returns the host arrays */
static void hvp_run(float *hv[4], float *g[4])
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *p[4], *gs[4], *hvt[4];
    for (int k = 0; k < 4; k++)
        p[k] = pool_leaf(db_hvp_p[k], hv_nd(k), HV_SH[k]);
    float xv[15], tv[10];
    for (int i = 0; i < 15; i++)
        xv[i] = nt_test_fbits(db_pool[db_hvp_X + i]);
    for (int i = 0; i < 10; i++)
        tv[i] = nt_test_fbits(db_pool[db_hvp_T + i]);
    nt_tensor *Xt = nt_from_host(xv, NT_F32, 2, SH(5, 3)), *Tt = nt_from_host(tv, NT_F32, 2, SH(5, 2));
    nt_tensor *loss = nt_mse_loss(nt_linear(nt_tanh(nt_linear(Xt, p[0], p[1])), p[2], p[3]), Tt);
    assert_int_equal(nt_autograd_grad(&loss, 1, p, 4, NULL, true, true, false, gs), 0);
    nt_tensor *dot = NULL;
    for (int k = 0; k < 4; k++) {
        float *vv = malloc((size_t)hv_n(k) * sizeof *vv);
        for (int64_t i = 0; i < hv_n(k); i++)
            vv[i] = nt_test_fbits(db_pool[db_hvp_v[k] + i]);
        nt_tensor *vt = nt_from_host(vv, NT_F32, hv_nd(k), HV_SH[k]);
        free(vv);
        nt_tensor *d = scalar_sum(nt_mul(gs[k], vt));
        dot = dot ? nt_add(dot, d) : d;
        g[k] = nt_test_host(gs[k]);
    }
    assert_int_equal(nt_autograd_grad(&dot, 1, p, 4, NULL, false, false, false, hvt), 0);
    for (int k = 0; k < 4; k++)
        hv[k] = nt_test_host(hvt[k]);
    nt_scope_end(s);
}

static void test_hvp_mlp(void **state)
{
    (void)state;
    float *hv[4], *g[4];
    hvp_run(hv, g);
    /* finite differences of the double gradient along v */
    double *p[4], *pp[4], *pm[4], *gp[4], *gm[4];
    const double eps = 1e-5;
    for (int k = 0; k < 4; k++) {
        int64_t n = hv_n(k);
        p[k] = malloc((size_t)n * sizeof(double));
        pp[k] = malloc((size_t)n * sizeof(double));
        pm[k] = malloc((size_t)n * sizeof(double));
        gp[k] = malloc((size_t)n * sizeof(double));
        gm[k] = malloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) {
            p[k][i] = nt_test_fbits(db_pool[db_hvp_p[k] + i]);
            double v = nt_test_fbits(db_pool[db_hvp_v[k] + i]);
            pp[k][i] = p[k][i] + eps * v;
            pm[k][i] = p[k][i] - eps * v;
        }
    }
    mlp_grad_d((const double **)p, gp); /* the gradient itself */
    for (int k = 0; k < 4; k++)
        for (int64_t i = 0; i < hv_n(k); i++)
            if (!near(g[k][i], gp[k][i], 1e-5, 1e-6))
                fail_msg("grad %d[%lld]: %.9g vs double %.17g", k, (long long)i, (double)g[k][i],
                         gp[k][i]);
    mlp_grad_d((const double **)pp, gp);
    mlp_grad_d((const double **)pm, gm);
    for (int k = 0; k < 4; k++) {
        char what[32];
        for (int64_t i = 0; i < hv_n(k); i++) {
            double fd = (gp[k][i] - gm[k][i]) / (2 * eps);
            if (!near(hv[k][i], fd, 1e-4, 1e-5))
                fail_msg("Hv %d[%lld]: %.9g vs finite differences %.17g", k, (long long)i,
                         (double)hv[k][i], fd);
        }
        /* PyTorch sums the matmuls in its own order: a few ulp apart */
        snprintf(what, sizeof what, "hv%d", k);
        vs_torch(what, hv[k], db_hvp_hv[k], hv_n(k), 2e-5, 2e-6);
        snprintf(what, sizeof what, "g%d", k);
        vs_torch(what, g[k], db_hvp_g[k], hv_n(k), 2e-5, 2e-7);
        free(p[k]), free(pp[k]), free(pm[k]), free(gp[k]), free(gm[k]);
        free(hv[k]), free(g[k]);
    }
}

/* ---------------- gradgradcheck ---------------- */

typedef nt_tensor *(*ggfn)(nt_tensor *const *in);

/* s(x) = sum_i <d/dx_i sum(f(x) w), u_i>, evaluated (create_graph on
 * when want_graph, returning the tensor) */
static nt_tensor *gg_s(ggfn f, nt_tensor *const *in, int n, uint64_t seed, bool create)
{
    nt_tensor *y = f(in);
    assert_non_null(y);
    uint64_t st = seed;
    int64_t ysh[8];
    int ynd = shp(y, ysh);
    int64_t ny = nt_test_numel(ynd, ysh);
    float *w = malloc((size_t)ny * sizeof *w);
    nt_test_fill(w, (size_t)ny, &st);
    nt_tensor *wt = nt_from_host(w, NT_F32, ynd, ysh);
    free(w);
    nt_tensor *L = scalar_sum(nt_mul(y, wt)), *g[8];
    int rc = nt_autograd_grad(&L, 1, in, n, NULL, true, create, true, g);
    if (rc)
        fail_msg("gradgradcheck: %s", nt_last_error_message());
    nt_tensor *s = NULL;
    for (int i = 0; i < n; i++) {
        if (!g[i])
            continue;
        int64_t gsh[8];
        int gnd = shp(g[i], gsh);
        int64_t m = nt_test_numel(gnd, gsh);
        float *u = malloc((size_t)m * sizeof *u);
        nt_test_fill(u, (size_t)m, &st);
        nt_tensor *ut = nt_from_host(u, NT_F32, gnd, gsh);
        free(u);
        nt_tensor *d = scalar_sum(nt_mul(g[i], ut));
        s = s ? nt_add(s, d) : d;
    }
    return s;
}

static double item(nt_tensor *t)
{
    double v;
    assert_int_equal(nt_item(t, &v), 0);
    return v;
}

/* torch.autograd.gradgradcheck: the gradient of s (by double backward)
 * against central differences of s, element by element. */
static void gradgradcheck(const char *name, ggfn f, int n, const int64_t (*shapes)[4],
                          const int *nds, const float *const *vals, double eps, double tol)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[8];
    for (int i = 0; i < n; i++)
        in[i] = nt_test_leaf(vals[i], nds[i], shapes[i]);
    nt_tensor *s = gg_s(f, in, n, 77, true), *h[8];
    assert_non_null(s);
    assert_true(nt_requires_grad(s)); /* every function here is nonlinear */
    assert_int_equal(nt_autograd_grad(&s, 1, in, n, NULL, false, false, true, h), 0);
    for (int i = 0; i < n; i++) {
        int64_t m = nt_test_numel(nds[i], shapes[i]);
        float *hv = h[i] ? nt_test_host(h[i]) : calloc((size_t)m, sizeof *hv);
        float *x = malloc((size_t)m * sizeof *x);
        memcpy(x, vals[i], (size_t)m * sizeof *x);
        for (int64_t k = 0; k < m; k++) {
            double sv[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                nt_scope *s2 = nt_scope_begin();
                x[k] = vals[i][k] + (float)(sgn ? -eps : eps);
                nt_tensor *in2[8];
                for (int j = 0; j < n; j++)
                    in2[j] = j == i ? nt_test_leaf(x, nds[j], shapes[j]) : nt_test_leaf(vals[j], nds[j], shapes[j]);
                sv[sgn] = item(gg_s(f, in2, n, 77, false));
                nt_scope_end(s2);
            }
            x[k] = vals[i][k];
            double fd = (sv[0] - sv[1]) / (2 * eps);
            if (!near(hv[k], fd, tol, tol))
                fail_msg("gradgradcheck %s: input %d element %lld: double backward %.7g, finite "
                         "differences %.7g", name, i, (long long)k, (double)hv[k], fd);
        }
        free(hv);
        free(x);
    }
    nt_scope_end(sc);
}

static nt_tensor *gf_matmul_tanh(nt_tensor *const *in) { return nt_tanh(nt_matmul(in[0], in[1])); }
static nt_tensor *gf_broadcast(nt_tensor *const *in)
{
    nt_tensor *a = in[0], *b = in[1];
    return nt_sub(nt_mul(a, b), nt_div(a, nt_add_scalar(nt_mul(b, b), 1.0)));
}
static nt_tensor *gf_softmax(nt_tensor *const *in) { return nt_softmax(in[0], 1); }
static nt_tensor *gf_log_softmax(nt_tensor *const *in) { return nt_log_softmax(in[0], -1); }
static nt_tensor *gf_layer_norm(nt_tensor *const *in)
{
    return nt_layer_norm(in[0], in[1], in[2], 1e-5);
}
static nt_tensor *gf_ce(nt_tensor *const *in)
{
    int32_t lab[4] = {2, 0, 4, 1};
    return nt_cross_entropy(in[0], nt_from_host(lab, NT_I32, 1, SH(4)));
}
static nt_tensor *gf_mse(nt_tensor *const *in) { return nt_mse_loss(nt_mul(in[0], in[0]), in[1]); }
static nt_tensor *gf_views(nt_tensor *const *in)
{
    nt_tensor *t = nt_permute(nt_reshape(in[0], 3, SH(2, 3, 4)), (const int[]){2, 0, 1});
    t = nt_slice(t, 0, 1, 4, 2); /* [2, 2, 3], a step */
    t = nt_slice(nt_transpose(t, 1, 2), 2, 1, 2, 1);
    return nt_mean(nt_sigmoid(nt_mul(t, t)), 1, false);
}
static nt_tensor *gf_unary(nt_tensor *const *in)
{
    nt_tensor *x = in[0];
    nt_tensor *a = nt_sqrt(nt_add_scalar(nt_mul(x, x), 1.0));
    nt_tensor *b = nt_log(nt_add_scalar(nt_exp(nt_neg(x)), 2.0));
    nt_tensor *c = nt_pow_scalar(nt_add_scalar(nt_mul(x, x), 0.5), 2.5);
    return nt_add(nt_sub(a, b), nt_mul_scalar(nt_div_scalar(c, 3.0), 0.5));
}
static nt_tensor *gf_acts(nt_tensor *const *in)
{
    nt_tensor *x = in[0];
    return nt_add(nt_add(nt_gelu(x), nt_mul(nt_silu(x), x)), nt_mul(nt_relu(x), nt_tanh(x)));
}
static nt_tensor *gf_reduce(nt_tensor *const *in)
{
    nt_tensor *x = in[0];
    nt_tensor *m = nt_max(nt_mul(x, x), 1, true);
    return nt_where(nt_gt(x, nt_zeros(NT_F32, 0, NULL)), nt_mul(x, m), nt_exp(nt_sum(x, 0, true)));
}
static nt_tensor *gf_linear3d(nt_tensor *const *in)
{
    return nt_sigmoid(nt_linear(in[0], in[1], in[2]));
}

/* the ops the docs list as built from differentiable ones */
static nt_tensor *gf_more(nt_tensor *const *in)
{
    nt_tensor *x = in[0], *y = in[1];
    nt_tensor *a = nt_rms_norm(nt_mul(x, y), NULL, 1e-5);                 /* [3, 5] */
    nt_tensor *b = nt_mul(nt_abs(x), nt_clamp(y, -0.5, 0.6));
    nt_tensor *c = nt_mul(nt_maximum(x, y), nt_rsqrt(nt_add_scalar(nt_mul(y, y), 1.0)));
    nt_tensor *d = nt_cumsum(nt_mul(x, x), 1);
    nt_tensor *e = nt_expand(nt_amax(nt_mul(x, y), 1, (const int[]){1}, true), 2, SH(3, 5));
    nt_tensor *f = nt_flip(nt_mul(y, nt_tril(nt_mul(x, x), 0)), 1, (const int[]){0});
    nt_tensor *nm = nt_expand(nt_norm(nt_add(x, y), 2.0, 1, true), 2, SH(3, 5));
    nt_tensor *parts[2] = {nt_add(nt_add(a, b), nt_add(c, d)), nt_add(nt_add(e, f), nm)};
    nt_tensor *cat = nt_cat(parts, 2, 0);                                /* [6, 5] */
    return nt_mul(cat, nt_add_scalar(nt_cat(parts, 2, 0), 0.25));
}

static void test_gradgradcheck(void **state)
{
    (void)state;
    float v[6][64];
    uint64_t st = 5;
    for (int i = 0; i < 6; i++)
        nt_test_fill(v[i], 64, &st);
    const float *v2[3] = {v[0], v[1], v[2]};
    {
        int64_t sh[2][4] = {{3, 4}, {4, 2}};
        gradgradcheck("matmul_tanh", gf_matmul_tanh, 2, sh, (int[]){2, 2}, v2, 1e-2, 2e-2);
    }
    {
        int64_t sh[2][4] = {{2, 3}, {3}};
        gradgradcheck("broadcast", gf_broadcast, 2, sh, (int[]){2, 1}, v2, 1e-2, 2e-2);
    }
    {
        int64_t sh[1][4] = {{3, 5}};
        gradgradcheck("softmax", gf_softmax, 1, sh, (int[]){2}, v2, 1e-2, 2e-2);
        gradgradcheck("log_softmax", gf_log_softmax, 1, sh, (int[]){2}, v2, 1e-2, 2e-2);
        gradgradcheck("unary", gf_unary, 1, sh, (int[]){2}, v2, 1e-2, 2e-2);
        gradgradcheck("acts", gf_acts, 1, sh, (int[]){2}, v2, 1e-3, 2e-2);
        gradgradcheck("reduce", gf_reduce, 1, sh, (int[]){2}, v2, 1e-3, 2e-2);
    }
    {
        int64_t sh[3][4] = {{3, 5}, {5}, {5}};
        float w[5], bb[5];
        for (int i = 0; i < 5; i++)
            w[i] = 1.0f + 0.3f * v[1][i], bb[i] = v[2][i];
        const float *lv[3] = {v[0], w, bb};
        gradgradcheck("layer_norm", gf_layer_norm, 3, sh, (int[]){2, 1, 1}, lv, 1e-2, 3e-2);
    }
    {
        int64_t sh[1][4] = {{4, 5}};
        gradgradcheck("cross_entropy", gf_ce, 1, sh, (int[]){2}, v2, 1e-2, 2e-2);
    }
    {
        int64_t sh[2][4] = {{2, 3}, {2, 3}};
        gradgradcheck("mse", gf_mse, 2, sh, (int[]){2, 2}, v2, 1e-2, 2e-2);
    }
    {
        int64_t sh[1][4] = {{24}};
        gradgradcheck("views", gf_views, 1, sh, (int[]){1}, v2, 1e-2, 2e-2);
    }
    {
        int64_t sh[2][4] = {{3, 5}, {3, 5}};
        gradgradcheck("more", gf_more, 2, sh, (int[]){2, 2}, v2, 1e-3, 3e-2);
    }
    {
        int64_t sh[3][4] = {{2, 3, 4}, {5, 4}, {5}};
        gradgradcheck("linear3d", gf_linear3d, 3, sh, (int[]){3, 2, 1}, v2, 1e-2, 2e-2);
    }
}

/* ---------------- gradient penalty (WGAN-GP) ---------------- */

typedef struct gp_out {
    float *L, *gx, *pen, *total, *grads[6], *xgrad;
} gp_out;

static int64_t gp_shapes[2][7][2] = {
    {{6, 3}, {5, 3}, {5, 0}, {1, 5}, {1, 0}},
    {{7, 4}, {6, 4}, {6, 0}, {6, 0}, {6, 0}, {3, 6}, {3, 0}},
};
static int gp_np[2] = {4, 6};
static int gp_nd(const int64_t *s) { return s[1] ? 2 : 1; }
static int64_t gp_n(const int64_t *s) { return s[0] * (s[1] ? s[1] : 1); }

static nt_tensor *gp_model(int which, nt_tensor *x, nt_tensor **p)
{
    if (which == 0)
        return nt_mean(nt_linear(nt_gelu(nt_linear(x, p[0], p[1])), p[2], p[3]), NT_DIM_ALL,
                       false);
    nt_tensor *h = nt_sigmoid(nt_layer_norm(nt_linear(x, p[0], p[1]), p[2], p[3], 1e-5));
    return nt_cross_entropy(nt_linear(h, p[4], p[5]),
                            nt_from_host(db_gp_clf_labels, NT_I32, 1, SH(7)));
}

/* one step: L, gx = dL/dx (create_graph), pen = sum(gx^2), total = L + lam
 * pen, nt_backward(total) */
static void gp_run(int which, gp_out *o)
{
    const db_gp *r = which ? &db_gp_clf : &db_gp_critic;
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = pool_leaf(r->X, 2, gp_shapes[which][0]), *p[6];
    for (int k = 0; k < gp_np[which]; k++)
        p[k] = pool_leaf(r->P[k], gp_nd(gp_shapes[which][k + 1]), gp_shapes[which][k + 1]);
    nt_tensor *L = gp_model(which, x, p);
    nt_tensor *gx = nt_test_grad1(L, x, true);
    nt_tensor *pen = scalar_sum(nt_mul(gx, gx));
    nt_tensor *total = nt_add(L, nt_mul_scalar(pen, DB_GP_LAMBDA));
    assert_int_equal(nt_backward(total), 0);
    o->L = nt_test_host(L), o->gx = nt_test_host(gx), o->pen = nt_test_host(pen), o->total = nt_test_host(total);
    for (int k = 0; k < gp_np[which]; k++) {
        nt_tensor *g = nt_grad(p[k]);
        assert_non_null(g);
        o->grads[k] = nt_test_host(g);
    }
    o->xgrad = nt_test_host(nt_grad(x));
    nt_scope_end(s);
}

static void gp_free(int which, gp_out *o)
{
    free(o->L), free(o->gx), free(o->pen), free(o->total), free(o->xgrad);
    for (int k = 0; k < gp_np[which]; k++)
        free(o->grads[k]);
}

static void test_gradient_penalty_torch(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        const db_gp *r = which ? &db_gp_clf : &db_gp_critic;
        gp_out o;
        gp_run(which, &o);
        /* the transcendentals are core/nmath.h's and the sums in the
         * canonical order, not PyTorch's: within a few ulp of each
         * intermediate, so relative 1e-4 with a small absolute floor */
        vs_torch("L", o.L, r->L, 1, 1e-5, 1e-7);
        vs_torch("gx", o.gx, r->gx, gp_n(gp_shapes[which][0]), 1e-4, 1e-6);
        vs_torch("pen", o.pen, r->pen, 1, 1e-4, 1e-7);
        vs_torch("total", o.total, r->total, 1, 1e-4, 1e-6);
        for (int k = 0; k < gp_np[which]; k++) {
            char what[32];
            snprintf(what, sizeof what, "%s param %d .grad", which ? "clf" : "critic", k);
            vs_torch(what, o.grads[k], r->grads[k], gp_n(gp_shapes[which][k + 1]), 2e-4, 2e-5);
        }
        vs_torch("x.grad", o.xgrad, r->xgrad, gp_n(gp_shapes[which][0]), 2e-4, 2e-5);
        gp_free(which, &o);
    }
}

/* ---------------- bits: every setting, and create_graph's first gradients ---------------- */

/* every result of the cases above, as bits */
typedef struct bits {
    uint32_t *v;
    size_t n, cap;
} bits;

static void bits_add(bits *b, const float *v, int64_t n)
{
    if (b->n + (size_t)n > b->cap) {
        b->cap = (b->n + (size_t)n) * 2;
        b->v = realloc(b->v, b->cap * sizeof *b->v);
    }
    for (int64_t i = 0; i < n; i++)
        b->v[b->n++] = nt_test_ubits(v[i]);
}

static void all_bits(bits *b)
{
    for (int k = 0; k < NEW; k++) {
        float g[DB_NEDGE], h[DB_NEDGE];
        ew_run(&EWF[k], g, h);
        bits_add(b, g, DB_NEDGE);
        bits_add(b, h, DB_NEDGE);
    }
    float *hv[4], *g[4];
    hvp_run(hv, g);
    for (int k = 0; k < 4; k++) {
        bits_add(b, hv[k], hv_n(k));
        bits_add(b, g[k], hv_n(k));
        free(hv[k]), free(g[k]);
    }
    for (int which = 0; which < 2; which++) {
        gp_out o;
        gp_run(which, &o);
        bits_add(b, o.gx, gp_n(gp_shapes[which][0]));
        bits_add(b, o.total, 1);
        for (int k = 0; k < gp_np[which]; k++)
            bits_add(b, o.grads[k], gp_n(gp_shapes[which][k + 1]));
        bits_add(b, o.xgrad, gp_n(gp_shapes[which][0]));
        gp_free(which, &o);
    }
}

static void test_bits_across_configs(void **state)
{
    (void)state;
    bits ref = {0};
    for (int c = 0; c < NT_TEST_NCFG; c++) {
        nt_test_cfg(c);
        bits got = {0};
        all_bits(&got);
        if (c == 0) {
            ref = got;
            continue;
        }
        assert_int_equal(got.n, ref.n);
        for (size_t i = 0; i < ref.n; i++)
            if (got.v[i] != ref.v[i])
                fail_msg("%s/%s/fusion %s: value %zu is 0x%08x, cpu deterministic 0x%08x",
                         NT_TEST_CFGS[c][0], NT_TEST_CFGS[c][1], NT_TEST_CFGS[c][2], i, got.v[i],
                         ref.v[i]);
        free(got.v);
    }
    free(ref.v);
}

/* A create_graph pass's gradients have the bits of a plain pass's: the
 * same ops in the same order (slices by cat instead of a copy into zeros:
 * copies both). */
static void test_first_order_unchanged(void **state)
{
    (void)state;
    for (int c = 0; c < NT_TEST_NCFG; c++) {
        nt_test_cfg(c);
        for (int which = 0; which < 2; which++) {
            const db_gp *r = which ? &db_gp_clf : &db_gp_critic;
            float *got[2][7];
            for (int create = 0; create < 2; create++) {
                nt_scope *s = nt_scope_begin();
                nt_tensor *x = pool_leaf(r->X, 2, gp_shapes[which][0]), *p[6];
                for (int k = 0; k < gp_np[which]; k++)
                    p[k] = pool_leaf(r->P[k], gp_nd(gp_shapes[which][k + 1]),
                                     gp_shapes[which][k + 1]);
                /* slices and a reshape of a slice on the way (the plain
                 * pass writes their gradients into place) */
                nt_tensor *xs = nt_slice(nt_reshape(x, 1, SH(-1)), 0, 1, 17, 2);
                nt_tensor *L = nt_add(gp_model(which, x, p), scalar_sum(nt_mul(xs, xs)));
                assert_int_equal(nt_backward_full(L, NULL, false, create), 0);
                got[create][0] = nt_test_host(nt_grad(x));
                for (int k = 0; k < gp_np[which]; k++)
                    got[create][k + 1] = nt_test_host(nt_grad(p[k]));
                nt_scope_end(s);
            }
            for (int k = 0; k <= gp_np[which]; k++) {
                int64_t n = gp_n(gp_shapes[which][k]);
                assert_memory_equal(got[0][k], got[1][k], (size_t)n * sizeof(float));
                free(got[0][k]), free(got[1][k]);
            }
        }
    }
}

/* ---------------- nt_backward_full, leaves' .grad with a graph ---------------- */

static void test_backward_full(void **state)
{
    (void)state;
    float xv[5] = {0.5f, -1.25f, 2.0f, 0.0f, -3.5f};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(5));
    nt_tensor *y = scalar_sum(nt_mul(nt_mul(x, x), nt_tanh(x))); /* x^2 tanh x */
    assert_int_equal(nt_backward_full(y, NULL, true, true), 0);
    nt_tensor *g = nt_grad(x);
    assert_true(nt_requires_grad(g)); /* .grad carries its graph */
    /* a second create_graph backward adds to .grad out of place: 2 g */
    assert_int_equal(nt_backward_full(y, NULL, true, true), 0);
    nt_tensor *g2 = nt_grad(x);
    float *a = nt_test_host(g), *b2 = nt_test_host(g2);
    for (int i = 0; i < 5; i++) {
        double t = tanh(xv[i]), d1 = 2 * xv[i] * t + xv[i] * xv[i] * (1 - t * t);
        assert_true(near(a[i], d1, 2e-6, 1e-7));
        assert_true(b2[i] == a[i] + a[i]);
    }
    free(a), free(b2);
    /* d/dx sum(.grad) = 2 f''(x) (.grad is 2 f') */
    assert_int_equal(nt_zero_grad(x), 0);
    assert_int_equal(nt_backward(scalar_sum(g2)), 0);
    float *h = nt_test_host(nt_grad(x));
    for (int i = 0; i < 5; i++) {
        double t = tanh(xv[i]), s2 = 1 - t * t;
        double d2 = 2 * t + 4 * xv[i] * s2 - 2 * xv[i] * xv[i] * t * s2;
        if (!near(h[i], 2 * d2, 2e-5, 1e-6))
            fail_msg("x[%d]: %.9g vs %.17g", i, (double)h[i], 2 * d2);
    }
    free(h);
    /* a gradient for a loss of many elements: d/dx <x^3, v> = 3 x^2 v */
    nt_tensor *x2 = nt_test_leaf(xv, 1, SH(5));
    float vv[5] = {1, 2, -1, 0.5f, 3};
    nt_tensor *v = nt_from_host(vv, NT_F32, 1, SH(5));
    assert_int_equal(nt_backward_full(f_cube(x2), v, false, false), 0);
    float *gv = nt_test_host(nt_grad(x2));
    for (int i = 0; i < 5; i++)
        assert_true(near(gv[i], 3.0 * xv[i] * xv[i] * vv[i], 1e-6, 0));
    free(gv);
    nt_scope_end(s);
}

/* ---------------- MAML: differentiating through an inner step ---------------- */

/* theta' = theta - a d/dtheta mse(X theta, y) (create_graph), outer =
 * mse(X2 theta', y2); d outer / d theta = A^T (2/n2) X2^T (X2 theta' - y2)
 * with A = I - a (2/n) X^T X, in double here. */
static void test_maml(void **state)
{
    (void)state;
    float X[12], y[4], X2[15], y2[5], th[3];
    uint64_t st = 11;
    nt_test_fill(X, 12, &st), nt_test_fill(y, 4, &st), nt_test_fill(X2, 15, &st);
    nt_test_fill(y2, 5, &st), nt_test_fill(th, 3, &st);
    const double a = 0.3;
    nt_scope *s = nt_scope_begin();
    nt_tensor *t = nt_test_leaf(th, 2, SH(3, 1));
    nt_tensor *Xt = nt_from_host(X, NT_F32, 2, SH(4, 3)), *yt = nt_from_host(y, NT_F32, 2, SH(4, 1));
    nt_tensor *X2t = nt_from_host(X2, NT_F32, 2, SH(5, 3));
    nt_tensor *y2t = nt_from_host(y2, NT_F32, 2, SH(5, 1));
    nt_tensor *inner = nt_mse_loss(nt_matmul(Xt, t), yt);
    nt_tensor *g = nt_test_grad1(inner, t, true);
    nt_tensor *t1 = nt_sub(t, nt_mul_scalar(g, a));
    nt_tensor *outer = nt_mse_loss(nt_matmul(X2t, t1), y2t);
    assert_int_equal(nt_backward(outer), 0);
    float *got = nt_test_host(nt_grad(t));
    double r[4], tp[3], A[3][3], go[3];
    for (int i = 0; i < 4; i++) {
        r[i] = -y[i];
        for (int k = 0; k < 3; k++)
            r[i] += (double)X[i * 3 + k] * th[k];
    }
    for (int k = 0; k < 3; k++) {
        double gk = 0;
        for (int i = 0; i < 4; i++)
            gk += 2.0 / 4 * X[i * 3 + k] * r[i];
        tp[k] = th[k] - a * gk;
        for (int j = 0; j < 3; j++) {
            double xx = 0;
            for (int i = 0; i < 4; i++)
                xx += (double)X[i * 3 + k] * X[i * 3 + j];
            A[k][j] = (k == j) - a * 2.0 / 4 * xx;
        }
    }
    for (int k = 0; k < 3; k++) {
        go[k] = 0;
        for (int i = 0; i < 5; i++) {
            double r2 = -y2[i];
            for (int j = 0; j < 3; j++)
                r2 += (double)X2[i * 3 + j] * tp[j];
            go[k] += 2.0 / 5 * X2[i * 3 + k] * r2;
        }
    }
    for (int j = 0; j < 3; j++) {
        double want = 0;
        for (int k = 0; k < 3; k++)
            want += A[k][j] * go[k]; /* A is symmetric: A^T go */
        if (!near(got[j], want, 1e-5, 1e-6))
            fail_msg("MAML d outer / d theta[%d]: %.9g, double %.17g", j, (double)got[j], want);
    }
    free(got);
    nt_scope_end(s);
}

/* ---------------- nt_autograd_grad specifics ---------------- */

static void test_autograd_grad(void **state)
{
    (void)state;
    float av[4] = {0.5f, -1, 2, 1.5f}, bv[3] = {0.25f, 1, -2};
    nt_scope *s = nt_scope_begin();
    nt_tensor *a = nt_test_leaf(av, 1, SH(4)), *b = nt_test_leaf(bv, 1, SH(3));
    /* a non-leaf input: d/dh of sum(h^2) at h = exp(a) is 2 h */
    nt_tensor *h = nt_exp(a);
    nt_tensor *y = nt_add(scalar_sum(nt_mul(h, h)), scalar_sum(nt_sin(b)));
    nt_tensor *g[2];
    /* only the part that leads to the inputs runs: sin's backward (which
     * cannot be differentiated) is never reached */
    assert_int_equal(nt_autograd_grad(&y, 1, &h, 1, NULL, true, true, false, g), 0);
    float *gh = nt_test_host(g[0]);
    for (int i = 0; i < 4; i++)
        assert_true(near(gh[i], 2 * exp(av[i]), 1e-6, 0));
    free(gh);
    assert_null(nt_grad(a)); /* no .grad touched */
    assert_null(nt_grad(b));
    /* two outputs with their grad_outputs, two inputs */
    nt_tensor *o1 = nt_mul(a, a), *o2 = scalar_sum(nt_mul(b, b));
    float wv[4] = {1, -1, 2, 0.5f};
    nt_tensor *outs[2] = {o1, o2}, *gos[2] = {nt_from_host(wv, NT_F32, 1, SH(4)), NULL};
    nt_tensor *ins[2] = {a, b};
    assert_int_equal(nt_autograd_grad(outs, 2, ins, 2, gos, true, true, false, g), 0);
    float *ga = nt_test_host(g[0]), *gb = nt_test_host(g[1]);
    for (int i = 0; i < 4; i++)
        assert_true(ga[i] == 2 * av[i] * wv[i]);
    for (int i = 0; i < 3; i++)
        assert_true(gb[i] == 2 * bv[i]);
    free(ga), free(gb);
    /* and again through those gradients: d/da sum(ga) = 2 w */
    nt_tensor *ga2;
    nt_tensor *sa = scalar_sum(g[0]);
    assert_int_equal(nt_autograd_grad(&sa, 1, &a, 1, NULL, false, false, false, &ga2), 0);
    ga = nt_test_host(ga2);
    for (int i = 0; i < 4; i++)
        assert_true(ga[i] == 2 * wv[i]);
    free(ga);
    /* allow_unused: an input no gradient reaches */
    nt_tensor *c = nt_test_leaf(av, 1, SH(4));
    nt_tensor *ins2[2] = {a, c};
    nt_tensor *y2 = scalar_sum(nt_mul(a, a));
    assert_int_equal(nt_autograd_grad(&y2, 1, ins2, 2, NULL, true, false, true, g), 0);
    assert_non_null(g[0]);
    assert_null(g[1]);
    nt_test_expect_err(nt_autograd_grad(&y2, 1, ins2, 2, NULL, true, false, false, g), NT_ESTATE,
                       "nt_autograd_grad", "'inputs[1]' was not used", "allow_unused");
    assert_null(g[0]);
    assert_null(g[1]);
    nt_scope_end(s);
}

/* ---------------- a user op's backward differentiates again ---------------- */

static nt_tensor *cube_fwd(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mul(nt_mul(in[0], in[0]), in[0]);
}
static int cube_bwd(nt_tensor *g, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                    void *ctx)
{
    (void)out, (void)ctx;
    gin[0] = nt_mul(g, nt_mul_scalar(nt_mul(in[0], in[0]), 3.0));
    return gin[0] ? 0 : nt_last_error();
}

static void test_custom_op(void **state)
{
    (void)state;
    nt_op_def def = {"dbl_cube", 1, cube_fwd, cube_bwd, NULL};
    int op = nt_op_register(&def);
    assert_true(op >= 0);
    float xv[3] = {0.5f, -2, 3};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(3));
    nt_tensor *g = nt_test_grad1(scalar_sum(nt_op_call(op, &x)), x, true);
    nt_tensor *h = nt_test_grad1(scalar_sum(g), x, false);
    float *hv = nt_test_host(h);
    for (int i = 0; i < 3; i++)
        assert_true(near(hv[i], 6.0 * xv[i], 1e-6, 0));
    free(hv);
    nt_scope_end(s);
}

/* ---------------- refused: backwards that cannot be differentiated ---------------- */

typedef struct refusal {
    const char *op;
    nt_tensor *(*f)(nt_tensor *x);
} refusal;

static int ckpt_block(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = nt_mul(in[0], in[0]);
    return out[0] ? 0 : nt_last_error();
}
static nt_tensor *r_checkpoint(nt_tensor *x)
{
    nt_tensor *y = NULL;
    assert_int_equal(nt_checkpoint(ckpt_block, NULL, &x, 1, &y, 1), 0);
    return y;
}

static void test_refusals(void **state)
{
    (void)state;
    const refusal R[] = {
        {"nt_checkpoint", r_checkpoint},
    };
    float xv[6] = {0.5f, -1.25f, 2, 0.75f, -0.5f, 1.5f};
    for (size_t k = 0; k < sizeof R / sizeof R[0]; k++) {
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = nt_test_leaf(xv, 2, SH(2, 3));
        nt_tensor *y = scalar_sum(R[k].f(x)), *g = (nt_tensor *)1;
        int rc = nt_autograd_grad(&y, 1, &x, 1, NULL, true, true, false, &g);
        if (k + 1 < sizeof R / sizeof R[0])
            nt_test_expect_err(rc, NT_ENOTSUP, "nt_autograd_grad", "double backward of",
                               R[k].op, "create_graph");
        else
            nt_test_expect_err(rc, NT_ENOTSUP, "nt_autograd_grad", R[k].op, "create_graph");
        assert_null(g);
        /* nt_backward_full names itself; the graph is intact: a plain
         * backward still works */
        nt_test_expect_err(nt_backward_full(y, NULL, true, true), NT_ENOTSUP, "nt_backward_full",
                           R[k].op);
        assert_int_equal(nt_zero_grad(x), 0);
        assert_int_equal(nt_backward(y), 0);
        assert_non_null(nt_grad(x));
        nt_scope_end(s);
    }
}

/* ---------------- errors of the API ---------------- */

static void test_errors(void **state)
{
    (void)state;
    float xv[4] = {1, 2, 3, 4};
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_test_leaf(xv, 1, SH(4)), *c = nt_from_host(xv, NT_F32, 1, SH(4));
    nt_tensor *y = scalar_sum(nt_mul(x, x)), *v = nt_mul(x, x), *g[2];
    nt_test_expect_err(nt_autograd_grad(NULL, 1, &x, 1, NULL, true, false, false, g), NT_EINVAL,
                       "nt_autograd_grad", "'outputs' is NULL");
    nt_test_expect_err(nt_autograd_grad(&y, 0, &x, 1, NULL, true, false, false, g), NT_EINVAL,
                       "'outputs' is empty");
    nt_test_expect_err(nt_autograd_grad(&y, 1, NULL, 1, NULL, true, false, false, g), NT_EINVAL,
                       "'inputs' is NULL");
    nt_test_expect_err(nt_autograd_grad(&y, 1, &x, 1, NULL, true, false, false, NULL), NT_EINVAL,
                       "'grads' is NULL");
    nt_tensor *nul = NULL;
    nt_test_expect_err(nt_autograd_grad(&y, 1, &nul, 1, NULL, true, false, false, g), NT_EINVAL,
                       "inputs[0]");
    nt_test_expect_err(nt_autograd_grad(&y, 1, &c, 1, NULL, true, false, false, g), NT_ESTATE,
                       "'inputs[0]' does not require grad");
    nt_test_expect_err(nt_autograd_grad(&c, 1, &x, 1, NULL, true, false, false, g), NT_ESTATE,
                       "'outputs[0]' does not require grad");
    nt_test_expect_err(nt_autograd_grad(&v, 1, &x, 1, NULL, true, false, false, g), NT_ESHAPE,
                       "'outputs[0]' has shape [4]", "grad_outputs[0]");
    nt_tensor *bad = nt_ones(NT_F32, 1, SH(3)), *ibad = nt_ones(NT_I32, 1, SH(4));
    nt_test_expect_err(nt_autograd_grad(&v, 1, &x, 1, &bad, true, false, false, g), NT_ESHAPE,
                       "'grad_outputs[0]' has shape [3]", "expected [4]");
    nt_test_expect_err(nt_autograd_grad(&v, 1, &x, 1, &ibad, true, false, false, g), NT_EDTYPE,
                       "'grad_outputs[0]' has dtype i32");
    nt_test_expect_err(nt_backward_full(v, NULL, false, false), NT_ESHAPE, "nt_backward_full",
                       "'loss' has shape [4]");
    nt_test_expect_err(nt_backward_full(v, bad, false, false), NT_ESHAPE, "nt_backward_full",
                       "'gradient' has shape [3]");
    nt_test_expect_err(nt_backward_full(NULL, NULL, false, true), NT_EINVAL, "nt_backward_full");
    /* a freed graph */
    assert_int_equal(nt_autograd_grad(&y, 1, &x, 1, NULL, false, false, false, g), 0);
    nt_test_expect_err(nt_autograd_grad(&y, 1, &x, 1, NULL, false, false, false, g), NT_ESTATE,
                       "already freed");
    nt_scope_end(s);
}

/* ---------------- memory ---------------- */

static void test_no_leak(void **state)
{
    (void)state;
    uint64_t live = nt__tensor_live_handles();
    for (int which = 0; which < 2; which++) {
        gp_out o;
        gp_run(which, &o);
        gp_free(which, &o);
    }
    float *hv[4], *g[4];
    hvp_run(hv, g);
    for (int k = 0; k < 4; k++)
        free(hv[k]), free(g[k]);
    /* a .grad that carries a graph, dropped by nt_zero_grad */
    float xv[3] = {1, 2, 3};
    nt_tensor *x = nt_from_host(xv, NT_F32, 1, SH(3));
    nt_set_requires_grad(x, true);
    nt_scope *s = nt_scope_begin();
    assert_int_equal(nt_backward_full(scalar_sum(nt_exp(nt_mul(x, x))), NULL, true, true), 0);
    nt_scope_end(s);
    nt_zero_grad(x);
    nt_release(x);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt__tensor_live_handles(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ew_second_derivatives, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_hvp_mlp, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradgradcheck, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradient_penalty_torch, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bits_across_configs, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_first_order_unchanged, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_backward_full, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_maml, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_autograd_grad, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_custom_op, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_refusals, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_no_leak, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
