/* tests/test_reductions.c - the reductions over dim lists and the running
 * ops: nt_sum_dims, nt_mean_dims, nt_amax, nt_amin, nt_var, nt_std,
 * nt_logsumexp, nt_prod, nt_cumsum, nt_cumprod.
 *
 * Values and gradients against PyTorch 1.13 (tests/torch_refs/reduce.h,
 * made by scripts/torch_refs/reduce.py: odd shapes, NaN, +-Inf, zeros and
 * ties in rows), against double-precision loops written here, and their
 * bits across the backends and modes; the order the docs define (the
 * reduced dims flattened in row-major order, then nt_sum's canonical
 * order); gradcheck; integer dtypes; every error path; and the simulated
 * time of a 2x2 max-pool written as reshape + nt_max against nt_maximum of
 * strided slices (deterministic: simulated, not wall-clock, time). */
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
#include "torch_refs/reduce.h"

uint64_t nt__tensor_live_handles(void); /* core/tensor.c */

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define DIMS(...) ((const int[]){__VA_ARGS__})

static uint64_t rs = 88172645463325252ull;
static double rnd(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 4503599627370496.0 - 1.0;
}

static float *host_f32(nt_tensor *t, int64_t n)
{
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_non_null(t);
    assert_int_equal(nt_numel(t), n);
    if (n)
        assert_int_equal(nt_to_host(t, v, (size_t)n * sizeof(float)), 0);
    return v;
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---------------- against PyTorch ---------------- */

static nt_tensor *run_case(const rr_case *c, nt_tensor *x)
{
    const char *op = c->op;
    bool kd = c->keepdim;
    int d0 = c->ndims < 0 ? NT_DIM_ALL : c->dims[0];
    if (!strcmp(op, "sum_dims"))
        return nt_sum_dims(x, c->ndims, c->dims, kd);
    if (!strcmp(op, "mean_dims"))
        return nt_mean_dims(x, c->ndims, c->dims, kd);
    if (!strcmp(op, "amax"))
        return nt_amax(x, c->ndims, c->dims, kd);
    if (!strcmp(op, "amin"))
        return nt_amin(x, c->ndims, c->dims, kd);
    if (!strcmp(op, "var"))
        return nt_var(x, c->ndims, c->dims, c->corr, kd);
    if (!strcmp(op, "std"))
        return nt_std(x, c->ndims, c->dims, c->corr, kd);
    if (!strcmp(op, "logsumexp"))
        return nt_logsumexp(x, c->ndims, c->dims, kd);
    if (!strcmp(op, "prod"))
        return nt_prod(x, d0, kd);
    if (!strcmp(op, "cumsum"))
        return nt_cumsum(x, d0);
    if (!strcmp(op, "cumprod"))
        return nt_cumprod(x, d0);
    fail_msg("no driver for %s", op);
    return NULL;
}

/* The bound on |ours - PyTorch's| for op: exact where the definitions
 * agree (amax, amin: the same element; their gradients g / count * mask,
 * PyTorch's formula), else a relative bound (other summation orders:
 * PyTorch sums in its own vectorised order, var with Welford's update,
 * logsumexp's gradient as g exp(x - y) where ours is g / s * exp(x - m))
 * on top of an absolute one scaled by the data (|x| <= ~10^4 here). */
static void tol_of(const char *op, bool grad, double *atol, double *rtol)
{
    *atol = 0, *rtol = 0;
    if (!strcmp(op, "amax") || !strcmp(op, "amin"))
        return;
    *atol = 2e-5, *rtol = 4e-6;
    if (!strcmp(op, "var") || !strcmp(op, "std"))
        *atol = 1e-3, *rtol = 2e-5; /* the 1e4-offset case: cancellation in PyTorch's too */
    if (grad)
        *rtol *= 4;
}

static int cmp_vals(const char *what, const rr_case *c, const float *got, int64_t goff,
                    int64_t n, bool grad)
{
    double atol, rtol;
    tol_of(c->op, grad, &atol, &rtol);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float w = f_of(rr_pool[goff + i]), g = got[i];
        bool ok;
        if (isnan(w) || isnan(g))
            ok = isnan(w) && isnan(g);
        else if (isinf(w) || isinf(g) || (atol == 0 && rtol == 0))
            ok = atol == 0 && rtol == 0 ? memcmp(&w, &g, 4) == 0 || (w == 0 && g == 0) : w == g;
        else
            ok = fabs((double)g - w) <= atol + rtol * fabs((double)w);
        if (!ok && bad++ < 4)
            print_error("%s %s dims[0]=%d ndims=%d: element %lld: %.9g, PyTorch %.9g\n", c->op,
                        what, c->dims[0], c->ndims, (long long)i, g, w);
    }
    return bad;
}

/* One case in the current configuration: y and x's gradient for the
 * upstream g, compared with PyTorch; their bits into yb / gb. */
static int one_case(const rr_case *c, float *yb, float *gb)
{
    nt_scope *sc = nt_scope_begin();
    float *xv = malloc(sizeof(float) * (size_t)c->n), *gv = malloc(sizeof(float) * (size_t)c->ny);
    memcpy(xv, rr_pool + c->x, sizeof(float) * (size_t)c->n);
    memcpy(gv, rr_pool + c->g, sizeof(float) * (size_t)c->ny);
    nt_tensor *x = nt_from_host(xv, NT_F32, c->ndim, c->shape);
    assert_int_equal(nt_set_requires_grad(x, c->gx >= 0), 0);
    nt_tensor *y = run_case(c, x);
    if (!y)
        fail_msg("%s: %s", c->op, nt_last_error_message());
    assert_int_equal(nt_ndim(y), c->ondim);
    for (int d = 0; d < c->ondim; d++)
        assert_int_equal(nt_shape(y, d), c->oshape[d]);
    float *yv = host_f32(y, c->ny);
    int bad = cmp_vals("value", c, yv, c->y, c->ny, false);
    memcpy(yb, yv, sizeof(float) * (size_t)c->ny);
    if (c->gx >= 0) {
        nt_tensor *g = nt_from_host(gv, NT_F32, c->ondim, c->oshape);
        assert_int_equal(nt_backward(nt_sum(nt_mul(y, g), NT_DIM_ALL, false)), 0);
        float *gx = host_f32(nt_grad(x), c->n);
        bad += cmp_vals("gradient", c, gx, c->gx, c->n, true);
        memcpy(gb, gx, sizeof(float) * (size_t)c->n);
        free(gx);
    }
    free(yv);
    free(xv);
    free(gv);
    nt_scope_end(sc);
    return bad;
}

static void test_torch_refs(void **state)
{
    (void)state;
    size_t nc = sizeof rr_cases / sizeof rr_cases[0];
    int bad = 0;
    for (size_t i = 0; i < nc; i++) {
        const rr_case *c = &rr_cases[i];
        float *y0 = malloc(sizeof(float) * (size_t)c->ny),
              *g0 = malloc(sizeof(float) * (size_t)c->n);
        float *y1 = malloc(sizeof(float) * (size_t)c->ny),
              *g1 = malloc(sizeof(float) * (size_t)c->n);
        for (int k = 0; k < NT_TEST_NCFG; k++) {
            nt_test_cfg(k);
            bad += one_case(c, k ? y1 : y0, k ? g1 : g0);
            /* the same bits in every configuration */
            if (k && memcmp(y0, y1, sizeof(float) * (size_t)c->ny)) {
                print_error("%s (case %zu): values differ on %s %s\n", c->op, i, NT_TEST_CFGS[k][0],
                            NT_TEST_CFGS[k][1]);
                bad++;
            }
            if (k && c->gx >= 0 && memcmp(g0, g1, sizeof(float) * (size_t)c->n)) {
                print_error("%s (case %zu): gradients differ on %s %s\n", c->op, i,
                            NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1]);
                bad++;
            }
        }
        free(y0), free(g0), free(y1), free(g1);
    }
    assert_int_equal(bad, 0);
}

/* ---------------- the order the docs define ---------------- */

/* nt_sum_dims over {2, 0} of [5, 3, 7, 4] is nt_sum over the last dim of
 * the tensor with the reduced dims moved last (in their order 0, 2) and
 * flattened, bit for bit; mean and amax likewise; every dim is NT_DIM_ALL. */
static void test_order_is_flattened(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_mul_scalar(nt_randn(NT_F32, 4, SH(5, 3, 7, 4), 11), 1e3);
        nt_tensor *f = nt_reshape(nt_contiguous(nt_permute(x, (int[]){1, 3, 0, 2})), 3,
                                  SH(3, 4, 35));
        nt_tensor *pairs[][2] = {
            {nt_sum_dims(x, 2, DIMS(2, 0), false), nt_sum(f, 2, false)},
            {nt_mean_dims(x, 2, DIMS(0, -2), true),
             nt_reshape(nt_mean(f, 2, false), 4, SH(1, 3, 1, 4))},
            {nt_amax(x, 2, DIMS(0, 2), false), nt_max(f, 2, false)},
            {nt_sum_dims(x, 0, NULL, false), nt_sum(x, NT_DIM_ALL, false)},
            {nt_sum_dims(x, 4, DIMS(3, 1, 0, 2), true), nt_sum(x, NT_DIM_ALL, true)},
            {nt_sum_dims(x, 1, DIMS(1), false), nt_sum(x, 1, false)},
        };
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
            int64_t n = nt_numel(pairs[i][1]);
            float *a = host_f32(pairs[i][0], n), *b = host_f32(pairs[i][1], n);
            assert_int_equal(nt_ndim(pairs[i][0]), nt_ndim(pairs[i][1]));
            assert_memory_equal(a, b, sizeof(float) * (size_t)n);
            free(a), free(b);
        }
        nt_scope_end(sc);
    }
}

/* ---------------- double-precision references ---------------- */

/* var, std, logsumexp, prod, cumsum over dim 1 of [4, 9, 3] against loops
 * in double: within a few f32 roundings of the exact value. */
static void test_double_refs(void **state)
{
    (void)state;
    enum { A = 4, B = 9, C = 3 };
    float xv[A * B * C];
    for (int i = 0; i < A * B * C; i++)
        xv[i] = (float)(3 * rnd());
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_from_host(xv, NT_F32, 3, SH(A, B, C));
        float *v = host_f32(nt_var(x, 1, DIMS(1), 1.0, false), A * C);
        float *s = host_f32(nt_std(x, 1, DIMS(1), 0.0, false), A * C);
        float *l = host_f32(nt_logsumexp(x, 1, DIMS(1), false), A * C);
        float *p = host_f32(nt_prod(x, 1, false), A * C);
        float *cs = host_f32(nt_cumsum(x, 1), A * B * C);
        for (int a = 0; a < A; a++)
            for (int c = 0; c < C; c++) {
                double m = 0, q = 0, mx = -INFINITY, e = 0, pr = 1, run = 0;
                for (int b = 0; b < B; b++)
                    m += xv[(a * B + b) * C + c], mx = fmax(mx, xv[(a * B + b) * C + c]);
                m /= B;
                for (int b = 0; b < B; b++) {
                    double x1 = xv[(a * B + b) * C + c];
                    q += (x1 - m) * (x1 - m);
                    e += exp(x1 - mx);
                    pr *= x1;
                    run += x1;
                    assert_true(fabs(cs[(a * B + b) * C + c] - run) <=
                                1e-5 * (1 + fabs(run)) + 4e-6 * b);
                }
                int o = a * C + c;
                assert_true(fabs(v[o] - q / (B - 1)) <= 4e-6 * q / (B - 1));
                assert_true(fabs(s[o] - sqrt(q / B)) <= 4e-6 * sqrt(q / B));
                assert_true(fabs(l[o] - (log(e) + mx)) <= 4e-6 * (1 + fabs(log(e) + mx)));
                assert_true(fabs(p[o] - pr) <= 2e-6 * B * fabs(pr));
            }
        free(v), free(s), free(l), free(p), free(cs);
        nt_scope_end(sc);
    }
}

/* ---------------- gradcheck ---------------- */

static nt_tensor *g_var(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_var(in[0], 2, DIMS(0, 2), 1.0, false);
}
static nt_tensor *g_std(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_std(in[0], 1, DIMS(-1), 0.0, true);
}
static nt_tensor *g_lse(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_logsumexp(in[0], 2, DIMS(1, 2), false);
}
static nt_tensor *g_prod(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_prod(in[0], 1, false);
}
static nt_tensor *g_cumsum(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_cumsum(in[0], 2);
}
static nt_tensor *g_cumprod(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_cumprod(in[0], 1);
}
static nt_tensor *g_mean(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mean_dims(in[0], 2, DIMS(2, 0), true);
}
static nt_tensor *g_amax(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_amax(in[0], 2, DIMS(0, 2), false);
}

static void test_gradcheck(void **state)
{
    (void)state;
    nt_tensor *(*fs[])(nt_tensor *const *, void *) = {g_var,     g_std,      g_lse, g_prod,
                                                       g_cumsum, g_cumprod, g_mean, g_amax};
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
            nt_scope *sc = nt_scope_begin();
            /* magnitudes 0.5 + j/60 in a shuffled order with random signs:
             * any two values differ by more than the step 1e-2, so a step
             * never changes amax's element; products of moderate size */
            float xv[3 * 4 * 5];
            for (int j = 0; j < 60; j++)
                xv[j] = (float)((0.5 + (double)((j * 37) % 60) / 60.0) * (rnd() < 0 ? -1 : 1));
            nt_tensor *x = nt_from_host(xv, NT_F32, 3, SH(3, 4, 5));
            assert_int_equal(nt_set_requires_grad(x, true), 0);
            int rc = nt_gradcheck(fs[i], &x, 1, NULL, 1e-2, 2e-2, 2e-2);
            if (rc)
                fail_msg("gradcheck %zu on %s: %s", i, NT_TEST_CFGS[k][0], nt_last_error_message());
            nt_scope_end(sc);
        }
    }
}

/* prod and cumprod with zeros in the row: PyTorch's gradient (the product
 * of the other elements), exactly here: small integers. */
static void test_prod_zero_grad(void **state)
{
    (void)state;
    float xv[2][4] = {{2, 0, 3, 5}, {0, 4, 0, 2}};
    float want_p[2][4] = {{0, 30, 0, 0}, {0, 0, 0, 0}};
    /* cumprod: d/dx_j sum_i y_i */
    float want_c[2][4] = {{1, 2 + 6 + 30, 0, 0}, {1 + 4, 0, 0, 0}};
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_from_host(xv, NT_F32, 2, SH(2, 4));
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        assert_int_equal(nt_backward(nt_sum(nt_prod(x, 1, false), NT_DIM_ALL, false)), 0);
        float *g = host_f32(nt_grad(x), 8);
        assert_memory_equal(g, want_p, sizeof want_p);
        free(g);
        nt_tensor *x2 = nt_from_host(xv, NT_F32, 2, SH(2, 4));
        assert_int_equal(nt_set_requires_grad(x2, true), 0);
        assert_int_equal(nt_backward(nt_sum(nt_cumprod(x2, 1), NT_DIM_ALL, false)), 0);
        g = host_f32(nt_grad(x2), 8);
        assert_memory_equal(g, want_c, sizeof want_c);
        free(g);
        nt_scope_end(sc);
    }
}

/* Rows longer than the simulator's 2048-element chunks (the running value
 * carried from chunk to chunk), rows at a stride (dim 0), and bf16: bit for
 * bit the f32 recurrence of the docs, computed here, on both backends. */
static void test_running_long(void **state)
{
    (void)state;
    enum { N = 5000, W = 3 };
    float *xv = malloc(sizeof(float) * N * W), *want = malloc(sizeof(float) * N * W);
    for (int i = 0; i < N * W; i++)
        xv[i] = (float)(1.0 + 1e-3 * rnd());
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        for (int c = 0; c < 4;
             c++) { /* cumsum, cumprod over dim 1 of [W, N]; over dim 0 of [N, W] */
            bool prod = c & 1, col = c >= 2;
            nt_scope *sc = nt_scope_begin();
            nt_tensor *x = nt_from_host(xv, NT_F32, 2, col ? SH(N, W) : SH(W, N));
            nt_tensor *y = prod ? nt_cumprod(x, col ? 0 : 1) : nt_cumsum(x, col ? 0 : 1);
            float *got = host_f32(y, N * W);
            for (int r = 0; r < W; r++) {
                float acc = prod ? 1.0f : -0.0f;
                for (int j = 0; j < N; j++) {
                    int64_t at = col ? (int64_t)j * W + r : (int64_t)r * N + j;
                    acc = prod ? xv[at] * acc : acc + xv[at];
                    want[at] = acc;
                }
            }
            assert_memory_equal(got, want, sizeof(float) * N * W);
            free(got);
            nt_scope_end(sc);
        }
        /* bf16: the f32 running value, each output rounded once */
        nt_scope *sc = nt_scope_begin();
        nt_tensor *xb = nt_cast(nt_from_host(xv, NT_F32, 2, SH(W, N)), NT_BF16);
        nt_tensor *y = nt_cast(nt_cumsum(xb, 1), NT_F32);
        nt_tensor *ref = nt_cast(nt_cumsum(nt_cast(xb, NT_F32), 1), NT_BF16);
        float *a = host_f32(y, N * W), *b = host_f32(nt_cast(ref, NT_F32), N * W);
        assert_memory_equal(a, b, sizeof(float) * N * W);
        free(a), free(b);
        nt_scope_end(sc);
    }
    free(xv), free(want);
}

/* ---------------- integers, bf16 ---------------- */

static void test_int_dtypes(void **state)
{
    (void)state;
    int32_t iv[2][3] = {{1, -2, 3}, {40000, 50000, -7}};
    uint8_t uv[2][3] = {{200, 100, 3}, {2, 5, 7}};
    nt_scope *sc = nt_scope_begin();
    nt_tensor *xi = nt_from_host(iv, NT_I32, 2, SH(2, 3));
    nt_tensor *xu = nt_from_host(uv, NT_U8, 2, SH(2, 3));
    int32_t out[6];
    nt_tensor *s = nt_sum_dims(xu, 2, DIMS(0, 1), false);
    assert_int_equal(nt_dtype_of(s), NT_I32);
    assert_int_equal(nt_to_host(s, out, 4), 0);
    assert_int_equal(out[0], 317);
    nt_tensor *p = nt_prod(xu, 1, false);
    assert_int_equal(nt_dtype_of(p), NT_I32);
    assert_int_equal(nt_to_host(p, out, 8), 0);
    assert_int_equal(out[0], 60000);
    assert_int_equal(out[1], 70);
    p = nt_prod(xi, 1, false); /* wraps in i32 */
    assert_int_equal(nt_to_host(p, out, 8), 0);
    assert_int_equal(out[0], -6);
    assert_int_equal(out[1], (int32_t)(uint32_t)((uint64_t)40000 * 50000 * (uint64_t)(uint32_t)-7));
    nt_tensor *c = nt_cumsum(xi, 0);
    assert_int_equal(nt_dtype_of(c), NT_I32);
    assert_int_equal(nt_to_host(c, out, 24), 0);
    assert_int_equal(out[3], 40001);
    assert_int_equal(out[5], -4);
    nt_tensor *m = nt_amax(xu, 1, DIMS(1), false);
    assert_int_equal(nt_dtype_of(m), NT_U8);
    uint8_t mu[2];
    assert_int_equal(nt_to_host(m, mu, 2), 0);
    assert_int_equal(mu[0], 200);
    assert_int_equal(mu[1], 7);
    nt_tensor *l = nt_logsumexp(xi, 1, DIMS(0), false);
    assert_int_equal(nt_dtype_of(l), NT_F32);
    /* bf16 in, bf16 out (computed in f32) */
    nt_tensor *b = nt_cast(nt_randn(NT_F32, 2, SH(3, 8), 4), NT_BF16);
    assert_int_equal(nt_dtype_of(nt_var(b, 1, DIMS(1), 1.0, false)), NT_BF16);
    assert_int_equal(nt_dtype_of(nt_logsumexp(b, 1, DIMS(1), false)), NT_BF16);
    nt_scope_end(sc);
}

/* ---------------- bad input ---------------- */

static void test_errors(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_randn(NT_F32, 3, SH(2, 3, 4), 1);
    nt_tensor *xi = nt_zeros(NT_I32, 2, SH(2, 3));
    nt_tensor *e = nt_zeros(NT_F32, 2, SH(0, 3));
    assert_int_equal(nt_sync(), 0);
    uint64_t live = nt__tensor_live_handles();
    assert_null(nt_sum_dims(x, 2, DIMS(1, 1), false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_sum_dims", "'dims'", "more than once");
    assert_null(nt_amax(x, 2, DIMS(1, -2), false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_amax", "'dims'", "more than once");
    assert_null(nt_mean_dims(x, 1, DIMS(3), false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_mean_dims", "'dims'", "out of range");
    assert_null(nt_amin(x, 1, DIMS(-4), false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_amin", "'dims'", "out of range");
    assert_null(nt_var(x, 2, NULL, 1.0, false));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_var", "'dims'");
    assert_null(nt_std(x, -1, NULL, 1.0, false));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_std", "'ndims'");
    assert_null(nt_var(xi, 1, DIMS(0), 1.0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_var", "'t'", "i32");
    assert_null(nt_std(xi, 0, NULL, 1.0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_std", "'t'");
    assert_null(nt_var(x, 1, DIMS(0), NAN, false));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_var", "'correction'");
    assert_null(nt_mean_dims(xi, 1, DIMS(0), false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_mean_dims", "'t'");
    assert_null(nt_amax(e, 1, DIMS(0), false));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_amax", "empty");
    assert_null(nt_logsumexp(x, 3, DIMS(0, 1, 0), false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_logsumexp", "'dims'");
    assert_null(nt_prod(x, 3, false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_prod", "'dim'");
    assert_null(nt_cumsum(x, -4));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_cumsum", "'dim'");
    assert_null(nt_cumprod(x, NT_DIM_ALL));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_cumprod", "'dim'");
    assert_null(nt_sum_dims(NULL, 0, NULL, false));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_sum_dims", "'t'");
    assert_null(nt_cumsum(NULL, 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_cumsum", "'t'");
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt__tensor_live_handles(), live); /* nothing left behind */
    nt_scope_end(sc);
}

/* Empty rows and 0-d tensors: prod of nothing 1, logsumexp -Inf, var NaN,
 * cumsum of an empty dim empty; a 0-d tensor reduces to itself. */
static void test_edges(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *e = nt_zeros(NT_F32, 2, SH(3, 0));
        float v[3];
        assert_int_equal(nt_to_host(nt_prod(e, 1, false), v, sizeof v), 0);
        assert_true(v[0] == 1 && v[2] == 1);
        assert_int_equal(nt_to_host(nt_logsumexp(e, 1, DIMS(1), false), v, sizeof v), 0);
        assert_true(isinf(v[0]) && v[0] < 0);
        assert_int_equal(nt_to_host(nt_var(e, 1, DIMS(1), 1.0, false), v, sizeof v), 0);
        assert_true(isnan(v[1]));
        assert_int_equal(nt_numel(nt_cumsum(e, 1)), 0);
        nt_tensor *s = nt_full(NT_F32, 0, NULL, -2.5);
        double d;
        assert_int_equal(nt_item(nt_amax(s, 1, DIMS(0), false), &d), 0);
        assert_true(d == -2.5);
        assert_int_equal(nt_item(nt_cumprod(s, -1), &d), 0);
        assert_true(d == -2.5);
        assert_int_equal(nt_item(nt_prod(s, NT_DIM_ALL, true), &d), 0);
        assert_true(d == -2.5);
        assert_int_equal(nt_item(nt_logsumexp(s, 0, NULL, false), &d), 0);
        assert_true(d == -2.5);
        nt_scope_end(sc);
    }
}

/* ---------------- simulated time of a pooling reduction ---------------- */

static double sim_ns_of(nt_tensor *(*f)(nt_tensor *), nt_tensor *x)
{
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_tensor *y = f(x);
    assert_non_null(y);
    assert_int_equal(nt_sync(), 0);
    nt_stats st;
    nt_stats_get(&st);
    return (double)st.sim_time_ns;
}

static nt_tensor *pool_reduce(nt_tensor *x)
{
    nt_tensor *r = nt_reshape(x, 6, SH(4, 16, 14, 2, 14, 2));
    return nt_max(nt_max(r, 5, false), 3, false);
}

static nt_tensor *pool_strided(nt_tensor *x)
{
    nt_tensor *w = nt_maximum(nt_slice(x, 3, 0, 28, 2), nt_slice(x, 3, 1, 28, 2));
    return nt_maximum(nt_slice(w, 2, 0, 28, 2), nt_slice(w, 2, 1, 28, 2));
}

/* A 2x2 max-pool written as reshape + nt_max over the two size-2 dims
 * takes at most 1.5x the simulated time of nt_maximum over strided slices
 * (bench/reduce prints the figures for a larger batch). */
static void test_pool_sim_time(void **state)
{
    (void)state;
    nt_test_cfg(1);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_randn(NT_F32, 4, SH(4, 16, 28, 28), 5);
    sim_ns_of(pool_reduce, x); /* warm */
    sim_ns_of(pool_strided, x);
    double r = sim_ns_of(pool_reduce, x), s = sim_ns_of(pool_strided, x);
    print_message("# pool: reduce %.1f us, strided %.1f us simulated: %.2fx\n", r / 1e3, s / 1e3,
                  r / s);
    assert_true(r > 0 && s > 0);
    assert_true(r <= 1.5 * s);
    nt_scope_end(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, nt_test_setup, nt_test_teardown)
        T(test_torch_refs),
        T(test_order_is_flattened),
        T(test_double_refs),
        T(test_gradcheck),
        T(test_prod_zero_grad),
        T(test_running_long),
        T(test_int_dtypes),
        T(test_errors),
        T(test_edges),
        T(test_pool_sim_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
