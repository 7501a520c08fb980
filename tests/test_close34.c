/* tests/test_close34.c - the last pieces of the dtypes work: reductions of
 * i64 and bool tensors (sum, prod, cumsum, amax, amin, max, min, argmax,
 * argmin, any, all with PyTorch's result dtypes), checked against PyTorch
 * 1.13 (tests/torch_refs/close34.h) in every mode, on the CPU backend and
 * on the simulator (which runs them on the CPU, counted as fallbacks, or
 * refuses them under NT_REQUIRE_SIM); f64 prod and cumsum in double
 * (against products computed here); nt_rand(NT_F64) drawing 53 bits, and
 * nt_uniform / nt_normal of f64 in double; var, std, logsumexp and the
 * losses of f64 in double, with gradchecks at double tolerances;
 * nt_clip_grad_norm with an f64 gradient in double (against PyTorch's
 * clip_grad_norm_); nt_all; i64 indices on the simulator; every error
 * path. */
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
#include "torch_refs/close34.h"

static const int64_t SH[3] = {3, 5, 7}, BSH[3] = {3, 1, 7};

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static nt_tensor *x_i64(void)
{
    return nt_from_host(C34_X, NT_I64, 3, SH);
}

static nt_tensor *b_bool(void)
{
    return nt_from_host(C34_B, NT_BOOL, 3, BSH);
}

/* t has dtype dt and its n elements, widened to int64, are want's. */
static void expect_i64(nt_tensor *t, nt_dtype dt, const uint64_t *want, int64_t n,
                       const char *what)
{
    if (!t)
        fail_msg("%s: %s", what, nt_last_error_message());
    assert_int_equal(nt_dtype_of(t), dt);
    assert_int_equal(nt_numel(t), n);
    nt_tensor *w = nt_cast(t, NT_I64);
    int64_t *h = malloc(sizeof *h * (size_t)n);
    assert_int_equal(nt_to_host(w, h, sizeof *h * (size_t)n), 0);
    for (int64_t i = 0; i < n; i++)
        if ((uint64_t)h[i] != want[i])
            fail_msg("%s[%lld] = %lld; PyTorch: %lld", what, (long long)i, (long long)h[i],
                     (long long)(int64_t)want[i]);
    free(h);
}

static void expect_u8(nt_tensor *t, const uint8_t *want, int64_t n, const char *what)
{
    if (!t)
        fail_msg("%s: %s", what, nt_last_error_message());
    assert_int_equal(nt_dtype_of(t), NT_U8);
    assert_int_equal(nt_numel(t), n);
    uint8_t h[128];
    assert_true(n <= 128);
    assert_int_equal(nt_to_host(t, h, (size_t)n), 0);
    for (int64_t i = 0; i < n; i++)
        if (h[i] != want[i])
            fail_msg("%s[%lld] = %d; PyTorch: %d", what, (long long)i, h[i], want[i]);
}

/* Every i64 reduction against PyTorch, in the current configuration. */
static void i64_reductions(void)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = x_i64();
    expect_i64(nt_sum(x, 0, false), NT_I64, C34_SUM_D0, 35, "sum dim 0");
    expect_i64(nt_sum(x, 1, false), NT_I64, C34_SUM_D1, 21, "sum dim 1");
    expect_i64(nt_sum(x, -1, false), NT_I64, C34_SUM_D2, 15, "sum dim 2 (wraps)");
    expect_i64(nt_sum(x, NT_DIM_ALL, false), NT_I64, C34_SUM_ALL, 1, "sum all");
    expect_i64(nt_sum_dims(x, 0, NULL, false), NT_I64, C34_SUM_ALL, 1, "sum_dims ()");
    expect_i64(nt_prod(x, 1, false), NT_I64, C34_PROD_D1, 21, "prod dim 1 (wraps)");
    expect_i64(nt_cumsum(x, 2), NT_I64, C34_CUMSUM_D2, 105, "cumsum dim 2");
    expect_i64(nt_amax(x, 2, (const int[]){0, 2}, false), NT_I64, C34_AMAX_02, 5, "amax (0, 2)");
    expect_i64(nt_amin(x, 2, (const int[]){2, 0}, false), NT_I64, C34_AMIN_02, 5, "amin (2, 0)");
    expect_i64(nt_max(x, 2, false), NT_I64, C34_MAX_D2, 15, "max dim 2");
    expect_i64(nt_min(x, 0, false), NT_I64, C34_MIN_D0, 35, "min dim 0");
    expect_i64(nt_argmax(x, 1, false), NT_I32, C34_ARGMAX_D1, 21, "argmax dim 1 (ties: first)");
    expect_i64(nt_argmin(x, 1, false), NT_I32, C34_ARGMIN_D1, 21, "argmin dim 1");
    nt_tensor *z = nt_zeros(NT_I64, 0, NULL);
    expect_u8(nt_any(nt_eq(x, z), 2, false), C34_ANY_D2, 15, "any(x == 0) dim 2");
    expect_u8(nt_all(x, 2, false), C34_ALL_D2, 15, "all dim 2");
    nt_tensor *k = nt_sum(x, 1, true); /* keepdim: [3, 1, 7] */
    assert_non_null(k);
    assert_int_equal(nt_shape(k, 1), 1);
    expect_i64(k, NT_I64, C34_SUM_D1, 21, "sum dim 1 keepdim");
    nt_scope_end(sc);
}

static void bool_reductions(void)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *b = b_bool();
    expect_i64(nt_sum(b, 2, false), NT_I64, C34_BSUM_D2, 3, "bool sum dim 2");
    expect_i64(nt_sum(b, NT_DIM_ALL, false), NT_I64, C34_BSUM_ALL, 1, "bool sum all");
    expect_i64(nt_prod(b, 2, false), NT_I64, C34_BPROD_D2, 3, "bool prod dim 2");
    expect_i64(nt_cumsum(b, 2), NT_I64, C34_BCUMSUM_D2, 21, "bool cumsum dim 2");
    nt_tensor *a = nt_amax(b, 2, (const int[]){1, 2}, false);
    assert_non_null(a);
    assert_int_equal(nt_dtype_of(a), NT_BOOL);
    expect_u8(nt_cast(a, NT_U8), C34_BAMAX_12, 3, "bool amax (1, 2)");
    a = nt_amin(b, 2, (const int[]){1, 2}, false);
    assert_non_null(a);
    assert_int_equal(nt_dtype_of(a), NT_BOOL);
    expect_u8(nt_cast(a, NT_U8), C34_BAMIN_12, 3, "bool amin (1, 2)");
    expect_i64(nt_argmax(b, 2, false), NT_I32, C34_BARGMAX_D2, 3, "bool argmax dim 2");
    expect_u8(nt_any(b, 0, false), C34_BANY_D0, 7, "bool any dim 0");
    expect_u8(nt_all(b, 2, false), C34_BALL_D2, 3, "bool all dim 2");
    nt_scope_end(sc);
}

/* PyTorch's result dtypes and values on every backend and mode: the
 * simulator's NT_REQUIRE_SIM refuses them (tested below), so it runs
 * without it here, each op counted as a CPU fallback. */
static void test_int_reductions_vs_torch(void **state)
{
    (void)state;
    assert_true(C34_BOOL_SUM_DTYPE_I64 && C34_I64_PROD_DTYPE_I64);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        bool sim = !strcmp(NT_TEST_CFGS[k][0], "sim");
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        nt_stats st0, st1;
        assert_int_equal(nt_stats_get(&st0), 0);
        i64_reductions();
        bool_reductions();
        assert_int_equal(nt_stats_get(&st1), 0);
        if (sim) /* the NeuronCore has no 64-bit integer ALU: counted */
            assert_true(st1.cpu_fallbacks > st0.cpu_fallbacks);
    }
    nt_test_cfg(0);
}

/* Under NT_REQUIRE_SIM an i64 reduction is NT_ENOTSUP naming the call and
 * the dtype, and nothing runs. */
static void test_int_reductions_require_sim(void **state)
{
    (void)state;
    nt_test_cfg(1); /* sim, NT_REQUIRE_SIM=1 */
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = x_i64();
    assert_null(nt_sum(x, 0, false));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_sum", "i64");
    assert_null(nt_any(b_bool(), 0, false));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_any", "bool");
    nt_scope_end(sc);
    nt_test_cfg(0);
}

/* i64 indices on the simulator: the op runs on the CPU backend (counted)
 * with the i32 index's result; under NT_REQUIRE_SIM it is NT_ENOTSUP
 * naming the op and i64 (docs/ops.md "i64 and bool"). */
static void test_i64_index_on_sim(void **state)
{
    (void)state;
    nt_test_cfg(1);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
    nt_scope *sc = nt_scope_begin();
    float w[12];
    for (int i = 0; i < 12; i++)
        w[i] = (float)i * 0.5f - 1.0f;
    nt_tensor *t = nt_from_host(w, NT_F32, 2, (const int64_t[]){4, 3});
    const int64_t i64[3] = {3, 0, 2};
    const int32_t i32[3] = {3, 0, 2};
    nt_stats s0, s1;
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_stats_get(&s0), 0);
    nt_tensor *a = nt_index_select(t, 0, nt_from_host(i64, NT_I64, 1, (const int64_t[]){3}));
    nt_tensor *b = nt_index_select(t, 0, nt_from_host(i32, NT_I32, 1, (const int64_t[]){3}));
    assert_non_null(a);
    assert_non_null(b);
    float ha[9], hb[9];
    assert_int_equal(nt_to_host(a, ha, sizeof ha), 0);
    assert_int_equal(nt_to_host(b, hb, sizeof hb), 0);
    assert_int_equal(nt_stats_get(&s1), 0);
    assert_memory_equal(ha, hb, sizeof ha);
    assert_true(s1.cpu_fallbacks >= s0.cpu_fallbacks + 1); /* the i64 one, counted */
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    assert_null(nt_index_select(t, 0, nt_from_host(i64, NT_I64, 1, (const int64_t[]){3})));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_index_select", "i64");
    nt_scope_end(sc);
    nt_test_cfg(0);
}

/* f64 prod and cumsum multiply and add in double, sequentially (an f32
 * path would lose 1 + 2^-40): against the products computed here; the
 * gradient of a prod with a zero in it is exact. */
static void test_f64_prod_cumsum(void **state)
{
    (void)state;
    const double v[6] = {1.0 + 0x1p-40, 3.0, 1.0 / 3.0, -2.5e-300, 7.0 + 0x1p-45, 1e300};
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_from_host(v, NT_F64, 2, (const int64_t[]){2, 3});
        double p[2], c[6];
        nt_tensor *pr = nt_prod(x, 1, false), *cs = nt_cumsum(x, 1);
        assert_non_null(pr);
        assert_non_null(cs);
        assert_int_equal(nt_dtype_of(pr), NT_F64);
        assert_int_equal(nt_to_host(pr, p, sizeof p), 0);
        assert_int_equal(nt_to_host(cs, c, sizeof c), 0);
        for (int r = 0; r < 2; r++) {
            double acc = v[3 * r], sum = v[3 * r];
            assert_true(dbits(c[3 * r]) == dbits(sum));
            for (int j = 1; j < 3; j++) {
                acc = acc * v[3 * r + j];
                sum = sum + v[3 * r + j];
                assert_true(dbits(c[3 * r + j]) == dbits(sum));
            }
            assert_true(dbits(p[r]) == dbits(acc));
        }
        nt_scope_end(sc);
    }
    nt_test_cfg(0);
    nt_scope *sc = nt_scope_begin();
    const double z[4] = {2.0, 0.0, 3.0, 5.0};
    nt_tensor *x = nt_from_host(z, NT_F64, 1, (const int64_t[]){4});
    nt_set_requires_grad(x, true);
    assert_int_equal(nt_backward(nt_prod(x, 0, false)), 0);
    double g[4];
    assert_int_equal(nt_to_host(nt_grad(x), g, sizeof g), 0);
    assert_true(g[0] == 0.0 && g[1] == 30.0 && g[2] == 0.0 && g[3] == 0.0);
    nt_scope_end(sc);
}

/* nt_rand(NT_F64): 53 random bits an element: multiples of 2^-53 in
 * [0, 1), most off the f32 grid, the lowest bit set about half the time,
 * mean and variance those of U[0, 1); the same bits on both backends and
 * every mode. */
static void test_f64_rand_53_bits(void **state)
{
    (void)state;
    enum { N = 1 << 16 };
    double *h = malloc(sizeof *h * N), *h0 = malloc(sizeof *h0 * N);
    assert_non_null(h);
    assert_non_null(h0);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        nt_scope *sc = nt_scope_begin();
        int64_t n = N;
        assert_int_equal(nt_to_host(nt_rand(NT_F64, 1, &n, 2024), k ? h : h0, sizeof *h * N), 0);
        nt_scope_end(sc);
        if (k)
            assert_memory_equal(h, h0, sizeof *h * N);
    }
    nt_test_cfg(0);
    int64_t off_grid = 0, low = 0;
    double m = 0, m2 = 0;
    for (int i = 0; i < N; i++) {
        double u = h0[i], s = u * 0x1p53;
        assert_true(u >= 0 && u < 1 && s == floor(s));
        off_grid += u * 0x1p24 != floor(u * 0x1p24);
        low += ((uint64_t)s & 1) != 0;
        m += u;
        m2 += u * u;
    }
    m /= N;
    double var = m2 / N - m * m;
    assert_true(off_grid > N - 4);               /* P(on the f32 grid) = 2^-29 */
    assert_true(labs((long)low - N / 2) < 1000); /* about 4 sigma */
    assert_true(fabs(m - 0.5) < 0.005 && fabs(var - 1.0 / 12.0) < 0.002);
    free(h);
    free(h0);
}

/* nt_uniform and nt_normal of f64 draw and scale in double (they went
 * through f32): values off the f32 grid, in [a, b), with U[a, b)'s mean;
 * the same generator state gives the same bits on both backends. */
static void test_f64_uniform_normal(void **state)
{
    (void)state;
    enum { N = 4096 };
    double *u = malloc(sizeof *u * N), *z = malloc(sizeof *z * N), *u0 = malloc(sizeof *u0 * N);
    assert_true(u && z && u0);
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        nt_scope *sc = nt_scope_begin();
        nt_generator *g = nt_generator_create(77);
        int64_t n = N;
        nt_tensor *tu = nt_uniform(NT_F64, 1, &n, -2.0, 3.0, g);
        nt_tensor *tz = nt_normal(NT_F64, 1, &n, 1.0, 0.1, g);
        assert_non_null(tu);
        assert_non_null(tz);
        assert_int_equal(nt_dtype_of(tu), NT_F64);
        assert_int_equal(nt_to_host(tu, k ? u : u0, sizeof *u * N), 0);
        assert_int_equal(nt_to_host(tz, z, sizeof *z * N), 0);
        nt_generator_destroy(g);
        nt_scope_end(sc);
    }
    nt_test_cfg(0);
    assert_memory_equal(u, u0, sizeof *u * N);
    int off_u = 0, off_z = 0;
    double m = 0;
    for (int i = 0; i < N; i++) {
        assert_true(u[i] >= -2.0 && u[i] < 3.0);
        off_u += (double)(float)u[i] != u[i];
        off_z += (double)(float)z[i] != z[i];
        m += u[i];
    }
    assert_true(off_u > N - 4 && off_z > N - 4);
    assert_true(fabs(m / N - 0.5) < 0.1); /* 1.44 / sqrt(N) = 0.023: 4 sigma */
    free(u);
    free(z);
    free(u0);
}

/* nt_clip_grad_norm with an f64 gradient next to an f32 one: the total in
 * double (an f64 result, PyTorch's), the factor in double, each gradient
 * scaled in its dtype; against torch.nn.utils.clip_grad_norm_. */
static void test_clip_grad_norm_f64(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *p64 = nt_zeros(NT_F64, 1, (const int64_t[]){15});
        nt_tensor *p32 = nt_zeros(NT_F32, 1, (const int64_t[]){6});
        nt_set_requires_grad(p64, true);
        nt_set_requires_grad(p32, true);
        nt_tensor *g64 = nt_from_host(C34_G64, NT_F64, 1, (const int64_t[]){15});
        nt_tensor *g32 = nt_from_host(C34_G32, NT_F32, 1, (const int64_t[]){6});
        /* d/dp sum(p * g) = g, exactly */
        nt_tensor *l = nt_add(nt_sum(nt_mul(p64, g64), NT_DIM_ALL, false),
                              nt_cast(nt_sum(nt_mul(p32, g32), NT_DIM_ALL, false), NT_F64));
        assert_int_equal(nt_backward(l), 0);
        nt_tensor *ps[2] = {p64, p32};
        nt_tensor *total = nt_clip_grad_norm(ps, 2, 1.0);
        assert_non_null(total);
        assert_int_equal(nt_dtype_of(total), NT_F64);
        assert_int_equal(C34_CLIP_TOTAL_IS_F64, 1);
        double t = 0, want = bitsd(C34_CLIP_TOTAL[0]);
        assert_int_equal(nt_item(total, &t), 0);
        /* the sums' orders differ (ours canonical, PyTorch's vectorised):
         * a few ulp of double, not f32's 1e-7 */
        assert_true(fabs(t - want) <= 4e-16 * want);
        double h64[15];
        float h32[6];
        assert_int_equal(nt_to_host(nt_grad(p64), h64, sizeof h64), 0);
        assert_int_equal(nt_to_host(nt_grad(p32), h32, sizeof h32), 0);
        for (int i = 0; i < 15; i++) {
            double w = bitsd(C34_CLIP_G64[i]);
            assert_true(fabs(h64[i] - w) <= 8e-16 * fabs(w));
        }
        for (int i = 0; i < 6; i++) /* f32 grad * (float)coef: the same bits */
            assert_int_equal(nt_test_ubits(h32[i]), C34_CLIP_G32[i]);
        nt_scope_end(sc);
    }
    nt_test_cfg(0);
}

/* nt_all: an empty dim gives 1, NaN counts as nonzero, -0 as zero, keepdim,
 * NT_DIM_ALL; every dtype. */
static void test_all(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    const float v[6] = {1.0f, NAN, -2.0f, 0.5f, -0.0f, 3.0f};
    nt_tensor *x = nt_from_host(v, NT_F32, 2, (const int64_t[]){2, 3});
    uint8_t h[3];
    nt_tensor *a = nt_all(x, 1, false);
    assert_non_null(a);
    assert_int_equal(nt_to_host(a, h, 2), 0);
    assert_true(h[0] == 1 && h[1] == 0);
    a = nt_all(x, 0, true);
    assert_int_equal(nt_ndim(a), 2);
    assert_int_equal(nt_to_host(a, h, 3), 0);
    assert_true(h[0] == 1 && h[1] == 0 && h[2] == 1);
    assert_int_equal(nt_to_host(nt_all(x, NT_DIM_ALL, false), h, 1), 0);
    assert_int_equal(h[0], 0);
    nt_tensor *e = nt_zeros(NT_I32, 2, (const int64_t[]){2, 0});
    assert_int_equal(nt_to_host(nt_all(e, 1, false), h, 2), 0);
    assert_true(h[0] == 1 && h[1] == 1);
    assert_int_equal(nt_to_host(nt_any(e, 1, false), h, 2), 0);
    assert_true(h[0] == 0 && h[1] == 0);
    const double d[2] = {1e-300, 0.0};
    assert_int_equal(
        nt_to_host(nt_all(nt_from_host(d, NT_F64, 1, (const int64_t[]){2}), 0, false), h, 1), 0);
    assert_int_equal(h[0], 0);
    nt_scope_end(sc);
}

/* The composites that take f64 compute in double (they went through f32):
 * var, std, logsumexp and the losses, against double formulas here; a
 * normalisation whose statistics are f32 kernels refuses f64. */
static double v64(int i) { return 0.3 + 0.37 * (i % 7) - 0.11 * i + 1e-12 * i * i; }

static double item64(nt_tensor *t)
{
    double v = NAN;
    if (!t)
        fail_msg("%s", nt_last_error_message());
    assert_int_equal(nt_dtype_of(t), NT_F64);
    assert_int_equal(nt_item(t, &v), 0);
    return v;
}

static void near(double got, double want, double rel, const char *what)
{
    if (!(fabs(got - want) <= rel * fabs(want)))
        fail_msg("%s: %.17g, the double reference %.17g", what, got, want);
}

static nt_tensor *f_var(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_var(in[0], 0, NULL, 1.0, false);
}
static nt_tensor *f_lse(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_logsumexp(in[0], 0, NULL, false);
}
static nt_tensor *f_bcel(nt_tensor *const *in, void *ctx)
{
    return nt_binary_cross_entropy_with_logits(in[0], ctx, NULL, NULL, NT_REDUCTION_MEAN);
}
static nt_tensor *f_huber(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_huber_loss(in[0], in[1], NT_REDUCTION_SUM, 0.7);
}

static void test_f64_composites(void **state)
{
    (void)state;
    enum { N = 24 };
    double a[N], b[N], y[N];
    for (int i = 0; i < N; i++) {
        a[i] = v64(i);
        b[i] = v64(i + 5) * 0.5;
        y[i] = (double)(i % 3) / 2.0;
    }
    double mu = 0, ss = 0, m = -INFINITY, se = 0, l1 = 0, hub = 0, bce = 0;
    for (int i = 0; i < N; i++)
        mu += a[i], m = fmax(m, a[i]);
    mu /= N;
    for (int i = 0; i < N; i++) {
        double d = a[i] - b[i], ad = fabs(d);
        ss += (a[i] - mu) * (a[i] - mu);
        se += exp(a[i] - m);
        l1 += ad;
        hub += ad < 0.7 ? 0.5 * d * d : 0.7 * (ad - 0.35);
        bce += (1 - y[i]) * a[i] + log1p(exp(-a[i])); /* -y log s(a) - (1 - y) log(1 - s(a)) */
    }
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        nt_scope *sc = nt_scope_begin();
        const int64_t sh[2] = {4, 6};
        nt_tensor *ta = nt_from_host(a, NT_F64, 2, sh), *tb = nt_from_host(b, NT_F64, 2, sh);
        nt_tensor *ty = nt_from_host(y, NT_F64, 2, sh);
        /* an f32 path is 1e-7 off: these bounds are a few ulp of double
         * (the sums' orders differ from the loops above) */
        near(item64(nt_var(ta, 0, NULL, 1.0, false)), ss / (N - 1), 1e-14, "var");
        near(item64(nt_std(ta, 0, NULL, 0.0, false)), sqrt(ss / N), 1e-14, "std");
        near(item64(nt_logsumexp(ta, 0, NULL, false)), log(se) + m, 1e-14, "logsumexp");
        near(item64(nt_l1_loss(ta, tb, NT_REDUCTION_MEAN)), l1 / N, 1e-14, "l1_loss");
        near(item64(nt_huber_loss(ta, tb, NT_REDUCTION_SUM, 0.7)), hub, 1e-14, "huber_loss");
        near(item64(nt_binary_cross_entropy_with_logits(ta, ty, NULL, NULL, NT_REDUCTION_MEAN)),
             bce / N, 1e-13, "binary_cross_entropy_with_logits");
        nt_scope_end(sc);
    }
    nt_test_cfg(0);
    /* their gradients, checked in double at PyTorch's double tolerances */
    nt_scope *sc = nt_scope_begin();
    const int64_t sh[2] = {4, 6};
    nt_tensor *in[2] = {nt_from_host(a, NT_F64, 2, sh), nt_from_host(b, NT_F64, 2, sh)};
    nt_tensor *iy[2] = {in[0], nt_from_host(y, NT_F64, 2, sh)};
    nt_set_requires_grad(in[0], true);
    nt_set_requires_grad(in[1], true);
    const double E = NT_GRADCHECK_F64_EPS, A = NT_GRADCHECK_F64_ATOL, R = NT_GRADCHECK_F64_RTOL;
    assert_int_equal(nt_gradcheck(f_var, in, 1, NULL, E, A, R), 0);
    assert_int_equal(nt_gradcheck(f_lse, in, 1, NULL, E, A, R), 0);
    assert_int_equal(nt_gradcheck(f_huber, in, 2, NULL, E, A, R), 0);
    if (nt_gradcheck(f_bcel, iy, 1, iy[1], E, A, R)) /* the targets: ctx */
        fail_msg("%s", nt_last_error_message());
    /* batch and group norm's statistics are f32 kernels: f64 is
     * refused, not narrowed */
    nt_tensor *x4 = nt_reshape(nt_detach(in[0]), 4, (const int64_t[]){2, 2, 3, 2});
    assert_null(nt_batch_norm(x4, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_batch_norm", "'x' is f64");
    assert_null(nt_group_norm(x4, 1, NULL, NULL, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_group_norm", "'x' is f64");
    nt_scope_end(sc);
}

/* Bad input: each a clear error naming the call, nothing else changed. */
static void test_bad_input(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = x_i64();
    assert_null(nt_mean(x, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_mean", "i64");
    assert_null(nt_mean_dims(x, 1, (const int[]){0}, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_mean_dims");
    assert_null(nt_norm(x, 2.0, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_norm");
    assert_null(nt_var(x, 0, NULL, 1.0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_var");
    assert_null(nt_sum_dims(x, 2, (const int[]){1, -2}, false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_sum_dims", "'dims'", "more than once");
    assert_null(nt_amax(x, 2, (const int[]){2, 2}, false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_amax", "more than once");
    nt_tensor *e = nt_zeros(NT_I64, 2, (const int64_t[]){3, 0});
    assert_null(nt_amax(e, 1, (const int[]){1}, false));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_amax", "no identity");
    assert_null(nt_max(nt_zeros(NT_BOOL, 1, (const int64_t[]){0}), 0, false));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_max", "no identity");
    assert_null(nt_sum(x, 3, false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_sum", "dim 3");
    assert_null(nt_all(x, -4, false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_all", "dim -4");
    assert_null(nt_all(NULL, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_all", "'t'");
    assert_null(nt_cumsum(x, NT_DIM_ALL));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_cumsum", "'dim'");
    /* the inputs are unchanged */
    expect_i64(x, NT_I64, C34_X, 105, "x after the errors");
    nt_scope_end(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_int_reductions_vs_torch, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_int_reductions_require_sim, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_i64_index_on_sim, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_f64_prod_cumsum, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_f64_rand_53_bits, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_f64_uniform_normal, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_clip_grad_norm_f64, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_f64_composites, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_all, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests_name("close34", tests, NULL, NULL);
}
