/* tests/test_dtypes.c - NT_F64: creation, host copies, printing, casts to
 * and from every dtype (against conversions written here), elementwise
 * math, reductions and matmul against double references computed here,
 * the same bits in every mode and on both backends (the simulator runs f64
 * on the CPU backend, or refuses it under NT_REQUIRE_SIM), autograd and
 * nt_gradcheck in double, checkpoints, and every error path. */
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
#include "ntensor/sim.h"
#include "nt_test.h"
#include "crc32.h"
#include "torch_refs/dtypes.h"

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static nt_tensor *f64_from(const double *v, int nd, const int64_t *sh)
{
    nt_tensor *t = nt_from_host(v, NT_F64, nd, sh);
    assert_non_null(t);
    return t;
}

static void to_host64(nt_tensor *t, double *out, int64_t n)
{
    assert_non_null(t);
    assert_int_equal(nt_dtype_of(t), NT_F64);
    assert_int_equal(nt_to_host(t, out, (size_t)n * sizeof(double)), 0);
}

/* ---------------- basics ---------------- */

static void test_basics(void **state)
{
    (void)state;
    assert_string_equal(nt_dtype_name(NT_F64), "f64");
    assert_int_equal(nt_dtype_size(NT_F64), 8);
    /* the existing values keep their numbers */
    assert_int_equal(NT_F32, 0);
    assert_int_equal(NT_U8, 4);
    assert_int_equal(NT_F64, 5);
    nt_scope *sc = nt_scope_begin();
    const double v[3] = {1.0 + 0x1p-52, -0x1p-1074, 1e300};
    double h[3];
    int64_t n3 = 3;
    to_host64(f64_from(v, 1, &n3), h, 3);
    for (int i = 0; i < 3; i++)
        assert_true(dbits(h[i]) == dbits(v[i])); /* no rounding through f32 */
    to_host64(nt_full(NT_F64, 1, &n3, 0.1), h, 3);
    assert_true(h[0] == 0.1 && h[2] == 0.1);
    to_host64(nt_arange(NT_F64, 0, 0.3, 0.1), h, 3);
    assert_true(h[1] == 0.1 && h[2] == 0.2);
    double it = 0;
    assert_int_equal(nt_item(nt_full(NT_F64, 0, NULL, 1.0 / 3.0), &it), 0);
    assert_true(it == 1.0 / 3.0);
    char *s = nt_format(f64_from(v, 1, &n3));
    assert_non_null(s);
    assert_non_null(strstr(s, "dtype=f64"));
    free(s);
    /* f64 rand draws 53 bits: multiples of 2^-53 in [0, 1), off the f32
     * grid (tests/test_close34.c checks the bits) */
    to_host64(nt_rand(NT_F64, 1, &n3, 7), h, 3);
    for (int i = 0; i < 3; i++)
        assert_true(h[i] >= 0 && h[i] < 1 && h[i] * 0x1p53 == floor(h[i] * 0x1p53) &&
                    h[i] * 0x1p24 != floor(h[i] * 0x1p24));
    nt_scope_end(sc);
}

/* ---------------- casts ---------------- */

/* f64 -> f32 rounds once to nearest even; -> bf16 / f16 through f32, as
 * PyTorch: 1 + 2^-8 + 2^-40 becomes the f32 1 + 2^-8, a bf16 tie, to even:
 * 1.0 (a direct rounding would go up).  tests/torch_refs/dtypes.h checks
 * more values against PyTorch. */
static void test_casts(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    const double v[8] = {1.0 + 0x1p-8 + 0x1p-40, -2.5, 70000.5, 1e-50, NAN, -INFINITY,
                         3e9, -0.0};
    int64_t n = 8;
    nt_tensor *x = f64_from(v, 1, &n);
    float f[8];
    assert_int_equal(nt_to_host(nt_cast(x, NT_F32), f, sizeof f), 0);
    for (int i = 0; i < 8; i++) {
        float want = (float)v[i];
        if (isnan(v[i]))
            assert_true(nt_test_ubits(f[i]) == 0x7fc00000u);
        else
            assert_true(nt_test_ubits(f[i]) == nt_test_ubits(want));
    }
    uint16_t b[8], hf[8];
    assert_int_equal(nt_to_host(nt_cast(x, NT_BF16), b, sizeof b), 0);
    assert_int_equal(b[0], 0x3f80); /* the tie after the f32 step: down */
    assert_int_equal(b[1], 0xc020);
    assert_int_equal(b[4], 0x7fc0);
    assert_int_equal(b[5], 0xff80);
    assert_int_equal(b[7], 0x8000);
    assert_int_equal(nt_to_host(nt_cast(x, NT_F16), hf, sizeof hf), 0);
    assert_int_equal(hf[1], 0xc100);
    assert_int_equal(hf[2], 0x7c00); /* > 65504: Inf */
    assert_int_equal(hf[3], 0x0000);
    assert_int_equal(hf[7], 0x8000);
    int32_t iv[8];
    assert_int_equal(nt_to_host(nt_cast(x, NT_I32), iv, sizeof iv), 0);
    /* truncation toward zero; out of range saturates, NaN gives 0 */
    const int32_t iw[8] = {1, -2, 70000, 0, 0, INT32_MIN, INT32_MAX, 0};
    assert_memory_equal(iv, iw, sizeof iv);
    uint8_t u[8];
    assert_int_equal(nt_to_host(nt_cast(x, NT_U8), u, sizeof u), 0);
    const uint8_t uw[8] = {1, 0, 255, 0, 0, 0, 255, 0};
    assert_memory_equal(u, uw, sizeof u);
    /* every dtype to f64 is exact */
    const float fs[4] = {0x1.fffffep+127f, 0x1p-149f, -3.25f, 16777217.0f};
    int64_t n4 = 4;
    double h[4];
    to_host64(nt_cast(nt_from_host(fs, NT_F32, 1, &n4), NT_F64), h, 4);
    for (int i = 0; i < 4; i++)
        assert_true(h[i] == (double)fs[i]);
    const int32_t is[4] = {INT32_MIN, -1, 0, 16777217};
    to_host64(nt_cast(nt_from_host(is, NT_I32, 1, &n4), NT_F64), h, 4);
    for (int i = 0; i < 4; i++)
        assert_true(h[i] == (double)is[i]); /* 2^24 + 1: exact, unlike through f32 */
    const uint16_t bs[4] = {0x3f81, 0x0001, 0xff80, 0x7f7f};
    to_host64(nt_cast(nt_from_host(bs, NT_BF16, 1, &n4), NT_F64), h, 4);
    for (int i = 0; i < 4; i++) {
        uint32_t w = (uint32_t)bs[i] << 16;
        float want;
        memcpy(&want, &w, 4);
        assert_true(h[i] == (double)want);
    }
    const uint16_t hs[4] = {0x0001, 0x7bff, 0xc100, 0x3c01};
    const double hw[4] = {0x1p-24, 65504.0, -2.5, 1.0 + 0x1p-10};
    to_host64(nt_cast(nt_from_host(hs, NT_F16, 1, &n4), NT_F64), h, 4);
    for (int i = 0; i < 4; i++)
        assert_true(h[i] == hw[i]);
    const uint8_t us[4] = {0, 1, 128, 255};
    to_host64(nt_cast(nt_from_host(us, NT_U8, 1, &n4), NT_F64), h, 4);
    for (int i = 0; i < 4; i++)
        assert_true(h[i] == (double)us[i]);
    /* promotion: f64 with anything is f64 */
    nt_tensor *p = nt_add(nt_from_host(fs, NT_F32, 1, &n4), nt_zeros(NT_F64, 1, &n4));
    assert_int_equal(nt_dtype_of(p), NT_F64);
    assert_int_equal(nt_dtype_of(nt_mul(nt_from_host(is, NT_I32, 1, &n4), nt_ones(NT_F64, 0, NULL))),
                     NT_F64);
    nt_scope_end(sc);
}

/* ---------------- against PyTorch 1.13 ---------------- */

#define NREF(a) ((int64_t)(sizeof(a) / sizeof((a)[0])))

static double from_u64(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* |a - b| in units of the last place of b (0 for equal bits; NaN = NaN) */
static double ulps(double a, double b)
{
    if (isnan(a) && isnan(b))
        return 0;
    if (a == b)
        return 0;
    return fabs(a - b) / (nextafter(fabs(b), INFINITY) - fabs(b));
}

static void test_vs_torch(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    nt_scope *sc = nt_scope_begin();
    int64_t n = NREF(DT_F64_IN);
    nt_tensor *x = nt_from_host(DT_F64_IN, NT_F64, 1, &n);
    /* casts: bitwise (NaN is any NaN) */
    uint32_t f[NREF(DT_F64_IN)];
    uint16_t h[NREF(DT_F64_IN)];
    uint8_t b[NREF(DT_F64_IN)];
    assert_int_equal(nt_to_host(nt_cast(x, NT_F32), f, sizeof f), 0);
    for (int64_t i = 0; i < n; i++)
        if (f[i] != DT_TO_F32[i])
            fail_msg("f64 %a -> f32: %08x, torch %08x", from_u64(DT_F64_IN[i]), f[i], DT_TO_F32[i]);
    assert_int_equal(nt_to_host(nt_cast(x, NT_BF16), h, sizeof h), 0);
    for (int64_t i = 0; i < n; i++) {
        bool nan = (h[i] & 0x7fff) > 0x7f80 && (DT_TO_BF16[i] & 0x7fff) > 0x7f80;
        if (h[i] != DT_TO_BF16[i] && !nan)
            fail_msg("f64 %a -> bf16: %04x, torch %04x", from_u64(DT_F64_IN[i]), h[i], DT_TO_BF16[i]);
    }
    assert_int_equal(nt_to_host(nt_cast(x, NT_F16), h, sizeof h), 0);
    for (int64_t i = 0; i < n; i++) {
        bool nan = (h[i] & 0x7fff) > 0x7c00 && (DT_TO_F16[i] & 0x7fff) > 0x7c00;
        if (h[i] != DT_TO_F16[i] && !nan)
            fail_msg("f64 %a -> f16: %04x, torch %04x", from_u64(DT_F64_IN[i]), h[i], DT_TO_F16[i]);
    }
    assert_int_equal(nt_to_host(nt_cast(x, NT_BOOL), b, sizeof b), 0);
    assert_memory_equal(b, DT_TO_BOOL, sizeof b);
    /* in-range floats to integers */
    int64_t ni = NREF(DT_INTV_IN);
    nt_tensor *xi = nt_from_host(DT_INTV_IN, NT_F64, 1, &ni);
    int32_t i32[NREF(DT_INTV_IN)];
    int64_t i64[NREF(DT_INTV_IN)];
    uint8_t u8[NREF(DT_INTV_IN)];
    assert_int_equal(nt_to_host(nt_cast(xi, NT_I32), i32, sizeof i32), 0);
    assert_memory_equal(i32, DT_INTV_I32, sizeof i32);
    assert_int_equal(nt_to_host(nt_cast(xi, NT_I64), i64, sizeof i64), 0);
    assert_memory_equal(i64, DT_INTV_I64, sizeof i64);
    assert_int_equal(nt_to_host(nt_cast(xi, NT_U8), u8, sizeof u8), 0);
    assert_memory_equal(u8, DT_INTV_U8, sizeof u8);
    /* i64: casts and wrapping arithmetic, bitwise */
    int64_t nl = NREF(DT_I64_IN);
    nt_tensor *l = nt_from_host(DT_I64_IN, NT_I64, 1, &nl);
    uint64_t w[NREF(DT_I64_IN)];
    uint32_t w32[NREF(DT_I64_IN)];
    assert_int_equal(nt_to_host(nt_cast(l, NT_F64), w, sizeof w), 0);
    assert_memory_equal(w, DT_I64_TO_F64, sizeof w);
    assert_int_equal(nt_to_host(nt_cast(l, NT_F32), w32, sizeof w32), 0);
    assert_memory_equal(w32, DT_I64_TO_F32, sizeof w32);
    assert_int_equal(nt_to_host(nt_cast(l, NT_I32), w32, sizeof w32), 0);
    assert_memory_equal(w32, DT_I64_TO_I32, sizeof w32);
    assert_int_equal(nt_to_host(nt_add_scalar(l, 1), w, sizeof w), 0);
    assert_memory_equal(w, DT_I64_ADD1, sizeof w);
    assert_int_equal(nt_to_host(nt_mul(l, l), w, sizeof w), 0);
    assert_memory_equal(w, DT_I64_MUL, sizeof w);
    /* f64 math: PyTorch's double kernels (SLEEF's vector forms, within 1
     * ulp) against the C library's: within 2 ulp */
    int64_t nm = NREF(DT_MA);
    nt_tensor *a = nt_from_host(DT_MA, NT_F64, 1, &nm), *bb = nt_from_host(DT_MB, NT_F64, 1, &nm);
    nt_tensor *outs[9] = {nt_exp(a), nt_log(nt_abs(bb)), nt_tanh(a), nt_sin(a), nt_erf(a),
                          nt_pow(nt_abs(bb), nt_clamp(a, -5, 5)), nt_atan2(a, bb), nt_div(a, bb),
                          nt_sigmoid(a)};
    static const char *const names[9] = {"exp", "log", "tanh", "sin", "erf", "pow", "atan2",
                                         "div", "sigmoid"};
    for (int k = 0; k < 9; k++) {
        double got[NREF(DT_MA)];
        to_host64(outs[k], got, nm);
        for (int64_t i = 0; i < nm; i++) {
            double want = from_u64(DT_MATH[k * nm + i]);
            if (!(ulps(got[i], want) <= 2))
                fail_msg("%s element %lld: %a, torch %a", names[k], (long long)i, got[i], want);
        }
    }
    nt_scope_end(sc);
}

/* ---------------- values against double references ---------------- */

#define R 3
#define C 5
#define K 7

static void make_inputs(double *a, double *b, double *m)
{
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < R * C; i++) {
        a[i] = (double)nt_test_rand32(&st) / 4294967296.0 * 4.0 - 2.0 + 0x1p-40;
        b[i] = (double)nt_test_rand32(&st) / 4294967296.0 * 3.0 + 0.25;
    }
    for (int i = 0; i < C * K; i++)
        m[i] = (double)nt_test_rand32(&st) / 4294967296.0 - 0.5;
}

/* One program over f64 values: outputs [0, R*C) unary/binary math,
 * then R row sums, R row maxima, R*K matmul. */
#define NOUT (6 * R * C + 2 * R + R * K + 1)
static void run_program(double *out)
{
    double a[R * C], b[R * C], m[C * K];
    make_inputs(a, b, m);
    int64_t sh[2] = {R, C}, shm[2] = {C, K};
    nt_scope *sc = nt_scope_begin();
    nt_tensor *A = f64_from(a, 2, sh), *B = f64_from(b, 2, sh), *M = f64_from(m, 2, shm);
    nt_tensor *outs[9] = {
        nt_exp(nt_mul(A, B)),
        nt_tanh(nt_sub(A, nt_div(A, B))),
        nt_log(nt_add_scalar(B, 1.0 / 3.0)),
        nt_sin(nt_mul_scalar(A, 0.1)),
        nt_pow(B, A),
        nt_where(nt_gt(A, B), A, nt_sigmoid(B)),
        nt_sum(A, 1, false),
        nt_max(nt_mul(A, B), 1, false),
        nt_matmul(A, M),
    };
    double *o = out;
    for (int i = 0; i < 9; i++) {
        int64_t ne = nt_numel(outs[i]);
        to_host64(outs[i], o, ne);
        o += ne;
    }
    to_host64(nt_mean(A, NT_DIM_ALL, false), o, 1);
    nt_scope_end(sc);
}

static void test_values(void **state)
{
    (void)state;
    double a[R * C], b[R * C], m[C * K], out[NOUT];
    make_inputs(a, b, m);
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    run_program(out);
    const double *o = out;
    /* elementwise: one double evaluation each, the same libm: exact */
    for (int i = 0; i < R * C; i++) {
        assert_true(dbits(o[i]) == dbits(exp(a[i] * b[i])));
        assert_true(dbits(o[R * C + i]) == dbits(tanh(a[i] - a[i] / b[i])));
        assert_true(dbits(o[2 * R * C + i]) == dbits(log(b[i] + 1.0 / 3.0)));
        assert_true(dbits(o[3 * R * C + i]) == dbits(sin(a[i] * 0.1)));
        assert_true(dbits(o[4 * R * C + i]) == dbits(pow(b[i], a[i])));
        double w = a[i] > b[i] ? a[i] : 1.0 / (1.0 + exp(-b[i]));
        assert_true(dbits(o[5 * R * C + i]) == dbits(w));
    }
    o += 6 * R * C;
    /* reductions and matmul: another order than a plain loop, so within
     * a few ulp of the double sum (far below f32's 6e-8) */
    for (int r = 0; r < R; r++) {
        double s = 0, mx = -INFINITY;
        for (int c = 0; c < C; c++)
            s += a[r * C + c], mx = fmax(mx, a[r * C + c] * b[r * C + c]);
        assert_true(fabs(o[r] - s) <= 1e-15 * (1 + fabs(s)));
        assert_true(o[R + r] == mx);
    }
    o += 2 * R;
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            double s = 0;
            for (int c = 0; c < C; c++)
                s += a[r * C + c] * m[c * K + k];
            assert_true(fabs(o[r * K + k] - s) <= 1e-15);
        }
    o += R * K;
    double s = 0;
    for (int i = 0; i < R * C; i++)
        s += a[i];
    assert_true(fabs(o[0] - s / (R * C)) <= 1e-15);
}

/* The same bits in every mode, on both backends (f64 on the simulator
 * runs on the CPU backend, counted as fallbacks), and in a captured graph. */
static void test_modes(void **state)
{
    (void)state;
    double ref[NOUT], got[NOUT];
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    run_program(ref);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        nt_stats_reset();
        run_program(got);
        assert_memory_equal(ref, got, sizeof ref);
        if (!strcmp(NT_TEST_CFGS[k][0], "sim")) {
            nt_stats st;
            assert_int_equal(nt_stats_get(&st), 0);
            assert_true(st.cpu_fallbacks > 0);
        }
    }
    nt_test_cfg(0);
    /* captured and replayed */
    double a[R * C], b[R * C], m[C * K];
    make_inputs(a, b, m);
    int64_t sh[2] = {R, C};
    nt_scope *sc = nt_scope_begin();
    nt_tensor *A = f64_from(a, 2, sh), *B = f64_from(b, 2, sh);
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_graph_input(A, "a"), 0);
    nt_tensor *y = nt_exp(nt_mul(A, B));
    nt_keep(y);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    assert_int_equal(nt_graph_replay(g), 0);
    double h[R * C];
    to_host64(y, h, R * C);
    for (int i = 0; i < R * C; i++)
        assert_true(dbits(h[i]) == dbits(ref[i]));
    nt_graph_destroy(g);
    nt_release(y);
    nt_scope_end(sc);
}

/* ---------------- autograd and gradcheck ---------------- */

static nt_tensor *f_smooth(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    nt_tensor *x = in[0], *w = in[1];
    return nt_sum(nt_mul(nt_tanh(nt_matmul(x, w)), nt_exp(nt_mul_scalar(x, 0.5))), 1, false);
}

/* x + c (x - detach(x)): the value of x, a gradient 1 + c: an analytic
 * gradient off by c times w, which finite differences do not see */
static double g_err = 3e-6;
static nt_tensor *f_wrong(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    nt_tensor *x = in[0];
    nt_tensor *d = nt_sub(x, nt_detach(x));
    return nt_add(nt_sin(x), nt_mul_scalar(d, g_err));
}

static nt_tensor *leaf(nt_dtype dt, int nd, const int64_t *sh, uint64_t seed)
{
    nt_tensor *t = nt_cast(nt_randn(NT_F32, nd, sh, seed), dt);
    assert_non_null(t);
    t = nt_detach(t);
    assert_int_equal(nt_set_requires_grad(t, true), 0);
    return t;
}

static void test_gradcheck(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    int64_t sx[2] = {3, 4}, sw[2] = {4, 4};
    nt_tensor *in[2] = {leaf(NT_F64, 2, sx, 1), leaf(NT_F64, 2, sw, 2)};
    /* PyTorch's double defaults hold, and so does atol 1e-7 alone */
    assert_int_equal(nt_gradcheck(f_smooth, in, 2, NULL, NT_GRADCHECK_F64_EPS,
                                  NT_GRADCHECK_F64_ATOL, NT_GRADCHECK_F64_RTOL), 0);
    assert_int_equal(nt_gradcheck(f_smooth, in, 2, NULL, 1e-6, 1e-7, 0), 0);
    /* the gradient's dtype is the input's */
    assert_int_equal(nt_dtype_of(nt_grad(in[0])), NT_F64);
    /* a 3e-6 error in the gradient: f64 at atol 1e-6 catches it ... */
    int64_t n = 8;
    nt_tensor *x64 = leaf(NT_F64, 1, &n, 3);
    assert_int_equal(nt_gradcheck(f_wrong, &x64, 1, NULL, 1e-6, 1e-6, 0), NT_ERANGE);
    nt_clear_error();
    g_err = 0;
    assert_int_equal(nt_gradcheck(f_wrong, &x64, 1, NULL, 1e-6, 1e-6, 0), 0);
    /* ... f32 cannot: at atol 1e-6 even the right gradient fails (the
     * differences are rounded to f32), and at tolerances f32 passes the
     * wrong one passes too */
    nt_tensor *x32 = leaf(NT_F32, 1, &n, 3);
    assert_int_equal(nt_gradcheck(f_wrong, &x32, 1, NULL, 1e-3, 1e-6, 0), NT_ERANGE);
    nt_clear_error();
    g_err = 3e-6;
    assert_int_equal(nt_gradcheck(f_wrong, &x32, 1, NULL, 1e-2, 1e-3, 1e-2), 0);
    nt_scope_end(sc);
}

/* ---------------- checkpoints ---------------- */

static void test_checkpoint(void **state)
{
    (void)state;
    assert_int_equal(nt_test_dir_make("dtypes"), 0);
    char p64[300], p32[300], pv1[300];
    snprintf(p64, sizeof p64, "%s/f64.ckpt", nt_test_dir);
    snprintf(p32, sizeof p32, "%s/f32.ckpt", nt_test_dir);
    snprintf(pv1, sizeof pv1, "%s/v1.ckpt", nt_test_dir);
    nt_scope *sc = nt_scope_begin();
    const double v[3] = {0.1, -0x1p-1074, 1e300};
    int64_t n = 3;
    nt_tensor *t = f64_from(v, 1, &n), *u = nt_zeros(NT_F64, 1, &n);
    nt_tensor *f = nt_ones(NT_F32, 1, &n);
    assert_int_equal(nt_save(p64, &t, 1, NULL), 0);
    assert_int_equal(nt_save(p32, &f, 1, NULL), 0);
    assert_int_equal(nt_load(p64, &u, 1, NULL), 0);
    double h[3];
    to_host64(u, h, 3);
    assert_memory_equal(h, v, sizeof v);
    /* the version: 2 with an f64 record, 1 without */
    uint8_t buf[4096];
    FILE *fp = fopen(p32, "rb");
    assert_non_null(fp);
    assert_true(fread(buf, 1, 12, fp) == 12);
    fclose(fp);
    assert_int_equal(buf[8], 1);
    fp = fopen(p64, "rb");
    assert_non_null(fp);
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    assert_int_equal(buf[8], 2);
    /* a version-1 file with an f64 record (header CRC fixed up) is refused */
    uint32_t count = (uint32_t)buf[12] | (uint32_t)buf[13] << 8;
    size_t hsize = 32 + (size_t)count * 96 + 8;
    buf[8] = 1;
    uint32_t crc = crc32_ieee(buf, hsize - 8);
    for (int i = 0; i < 4; i++)
        buf[hsize - 8 + i] = (uint8_t)(crc >> (8 * i));
    fp = fopen(pv1, "wb");
    assert_non_null(fp);
    assert_true(fwrite(buf, 1, len, fp) == len);
    fclose(fp);
    nt_test_expect_err(nt_load(pv1, &u, 1, NULL), NT_EFORMAT, "nt_load", "v1.ckpt",
                       "dtype f64 in a version-1 file");
    /* i64 and bool round-trip too (version 2) */
    const int64_t iv[3] = {INT64_MIN, 1, ((int64_t)1 << 60) + 3};
    const uint8_t bv[3] = {1, 0, 1};
    nt_tensor *pi[2] = {nt_from_host(iv, NT_I64, 1, &n), nt_from_host(bv, NT_BOOL, 1, &n)};
    nt_tensor *qi[2] = {nt_zeros(NT_I64, 1, &n), nt_zeros(NT_BOOL, 1, &n)};
    assert_int_equal(nt_save(p32, pi, 2, NULL), 0);
    assert_int_equal(nt_load(p32, qi, 2, NULL), 0);
    int64_t ih[3];
    uint8_t bh[3];
    assert_int_equal(nt_to_host(qi[0], ih, sizeof ih), 0);
    assert_int_equal(nt_to_host(qi[1], bh, sizeof bh), 0);
    assert_memory_equal(ih, iv, sizeof iv);
    assert_memory_equal(bh, bv, sizeof bv);
    /* a dtype mismatch names both */
    nt_test_expect_err(nt_load(p64, &f, 1, NULL), NT_ESHAPE, "f64", "f32");
    nt_scope_end(sc);
    assert_int_equal(nt_test_dir_remove(), 0);
}

/* ---------------- errors ---------------- */

static void test_errors(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    int64_t sh[2] = {2, 3};
    nt_tensor *x = nt_zeros(NT_F64, 2, sh), *y32 = nt_zeros(NT_F32, 2, sh);
    /* an op without an f64 kernel: the function, the argument, what it takes */
    assert_null(nt_softmax(x, 1));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_softmax", "is f64", "f32, bf16 or f16");
    /* another op outside the f64 lists */
    assert_null(nt_log_softmax(x, 1));
    printf("# %s\n", nt_last_error_message());
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_log_softmax", "is f64");
    /* composites of f64 ops work: cumsum (adds along the dim) */
    double c6[6];
    to_host64(nt_cumsum(nt_ones(NT_F64, 2, sh), 1), c6, 6);
    assert_true(c6[2] == 3.0 && c6[3] == 1.0);
    /* nothing was changed: x is still usable */
    double h[6];
    to_host64(nt_add_scalar(x, 1), h, 6);
    assert_true(h[5] == 1.0);
    /* the simulator with NT_REQUIRE_SIM: refused, naming the op and f64 */
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    assert_null(nt_exp(x));
    printf("# %s\n", nt_last_error_message());
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_exp", "'exp'", "f64");
    /* f32 still runs there */
    assert_non_null(nt_exp(y32));
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    /* out-of-range dtypes are still refused */
    assert_null(nt_zeros((nt_dtype)NT_DTYPE_COUNT, 2, sh));
    assert_int_not_equal(nt_last_error(), 0);
    nt_clear_error();
    assert_string_equal(nt_dtype_name(NT_DTYPE_COUNT), "?");
    assert_int_equal(nt_dtype_size(NT_DTYPE_COUNT), 0);
    nt_scope_end(sc);
}

/* ---------------- i64 ---------------- */

static void test_i64(void **state)
{
    (void)state;
    assert_int_equal(NT_I64, 6);
    assert_int_equal(NT_BOOL, 7);
    assert_string_equal(nt_dtype_name(NT_I64), "i64");
    assert_int_equal(nt_dtype_size(NT_I64), 8);
    nt_scope *sc = nt_scope_begin();
    const int64_t v[4] = {INT64_MAX, INT64_MIN, ((int64_t)1 << 62) + 1, -7};
    int64_t n = 4, h[4];
    nt_tensor *x = nt_from_host(v, NT_I64, 1, &n);
    assert_int_equal(nt_to_host(x, h, sizeof h), 0);
    assert_memory_equal(h, v, sizeof v);
    /* wrapping arithmetic in int64, exact past 2^53 */
    assert_int_equal(nt_to_host(nt_add_scalar(x, 1), h, sizeof h), 0);
    assert_true(h[0] == INT64_MIN && h[1] == INT64_MIN + 1 && h[2] == ((int64_t)1 << 62) + 2);
    assert_int_equal(nt_to_host(nt_mul(x, x), h, sizeof h), 0);
    assert_true(h[3] == 49 && h[2] == (int64_t)((uint64_t)v[2] * (uint64_t)v[2]));
    assert_int_equal(nt_to_host(nt_neg(x), h, sizeof h), 0);
    assert_true(h[1] == INT64_MIN && h[0] == -INT64_MAX);
    assert_int_equal(nt_to_host(nt_maximum(x, nt_full(NT_I64, 0, NULL, 0)), h, sizeof h), 0);
    assert_true(h[0] == INT64_MAX && h[1] == 0 && h[3] == 0);
    /* compares keep returning u8 */
    nt_tensor *lt = nt_lt(x, nt_from_host((int64_t[]){INT64_MAX, INT64_MIN, ((int64_t)1 << 62) + 2, -8}, NT_I64, 1, &n));
    assert_int_equal(nt_dtype_of(lt), NT_U8);
    uint8_t u[4];
    assert_int_equal(nt_to_host(lt, u, 4), 0);
    assert_true(u[0] == 0 && u[1] == 0 && u[2] == 1 && u[3] == 0); /* 2^62 + 1 < 2^62 + 2 */
    /* promotion: i64 with i32 is i64; with a float, the float */
    const int32_t i3[4] = {1, 2, 3, 4};
    assert_int_equal(nt_dtype_of(nt_add(x, nt_from_host(i3, NT_I32, 1, &n))), NT_I64);
    assert_int_equal(nt_dtype_of(nt_add(x, nt_ones(NT_F32, 0, NULL))), NT_F32);
    /* casts: to i32 wraps (as int to int), from f32 truncates and saturates */
    int32_t w[4];
    assert_int_equal(nt_to_host(nt_cast(x, NT_I32), w, sizeof w), 0);
    assert_true(w[0] == -1 && w[1] == 0 && w[2] == 1 && w[3] == -7);
    const float f[4] = {-2.7f, 1e30f, NAN, 3.5f};
    assert_int_equal(nt_to_host(nt_cast(nt_from_host(f, NT_F32, 1, &n), NT_I64), h, sizeof h), 0);
    assert_true(h[0] == -2 && h[1] == INT64_MAX && h[2] == 0 && h[3] == 3);
    double d[4];
    to_host64(nt_cast(x, NT_F64), d, 4);
    assert_true(d[2] == 0x1p62 && d[3] == -7.0);
    /* printed exactly */
    char *s = nt_format(x);
    assert_non_null(s);
    assert_non_null(strstr(s, "4611686018427387905"));
    assert_non_null(strstr(s, "dtype=i64"));
    free(s);
    nt_scope_end(sc);
}

/* i64 indices give the i32 indices' results; one outside i32 is out of
 * range, never wrapped onto a valid row */
static void test_i64_indices(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    float wv[12];
    for (int i = 0; i < 12; i++)
        wv[i] = (float)i * 0.5f - 2.0f;
    int64_t sw[2] = {4, 3}, ni = 5;
    nt_tensor *w = nt_from_host(wv, NT_F32, 2, sw);
    const int64_t i64[5] = {3, 0, 2, 2, 1};
    const int32_t i32[5] = {3, 0, 2, 2, 1};
    nt_tensor *x64 = nt_from_host(i64, NT_I64, 1, &ni), *x32 = nt_from_host(i32, NT_I32, 1, &ni);
    float a[15], b[15];
    assert_int_equal(nt_to_host(nt_embedding(w, x64), a, sizeof a), 0);
    assert_int_equal(nt_to_host(nt_embedding(w, x32), b, sizeof b), 0);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(nt_to_host(nt_index_select(w, 0, x64), a, sizeof a), 0);
    assert_memory_equal(a, b, sizeof a);
    /* cross entropy with i64 labels, and its gradient */
    nt_tensor *lg = nt_detach(nt_randn(NT_F32, 2, (int64_t[]){5, 4}, 9));
    assert_int_equal(nt_set_requires_grad(lg, true), 0);
    float l64, l32;
    assert_int_equal(nt_to_host(nt_cross_entropy(lg, x64), &l64, 4), 0);
    assert_int_equal(nt_to_host(nt_cross_entropy(lg, x32), &l32, 4), 0);
    assert_true(nt_test_ubits(l64) == nt_test_ubits(l32));
    assert_int_equal(nt_backward(nt_cross_entropy(lg, x64)), 0);
    /* gather along dim 1 */
    int64_t sg[2] = {4, 1};
    const int64_t g64[4] = {2, 0, 1, 2};
    assert_int_equal(nt_to_host(nt_gather(w, 1, nt_from_host(g64, NT_I64, 2, sg)), a, 16), 0);
    for (int r = 0; r < 4; r++)
        assert_true(a[r] == wv[r * 3 + g64[r]]);
    /* scatter and scatter_add with i64 indices equal the i32 ones */
    const int64_t s64[4] = {2, 0, 1, 2};
    const int32_t s32[4] = {2, 0, 1, 2};
    nt_tensor *src = nt_ones(NT_F32, 2, sg);
    float c64[12], c32[12];
    assert_int_equal(nt_to_host(nt_scatter_add(w, 1, nt_from_host(s64, NT_I64, 2, sg), src), c64,
                                sizeof c64), 0);
    assert_int_equal(nt_to_host(nt_scatter_add(w, 1, nt_from_host(s32, NT_I32, 2, sg), src), c32,
                                sizeof c32), 0);
    assert_memory_equal(c64, c32, sizeof c64);
    assert_int_equal(nt_to_host(nt_scatter(w, 1, nt_from_host(s64, NT_I64, 2, sg), src), c64,
                                sizeof c64), 0);
    assert_int_equal(nt_to_host(nt_scatter(w, 1, nt_from_host(s32, NT_I32, 2, sg), src), c32,
                                sizeof c32), 0);
    assert_memory_equal(c64, c32, sizeof c64);
    /* index_put (rows, negative from the end) and one_hot */
    const int64_t r64[2] = {-1, 1};
    const int32_t r32[2] = {-1, 1};
    int64_t two = 2;
    nt_tensor *vals = nt_full(NT_F32, 1, (int64_t[]){3}, 9.0);
    assert_int_equal(nt_to_host(nt_index_put(w, nt_from_host(r64, NT_I64, 1, &two), vals, true),
                                c64, sizeof c64), 0);
    assert_int_equal(nt_to_host(nt_index_put(w, nt_from_host(r32, NT_I32, 1, &two), vals, true),
                                c32, sizeof c32), 0);
    assert_memory_equal(c64, c32, sizeof c64);
    int32_t oh[8];
    assert_int_equal(nt_to_host(nt_one_hot(nt_from_host(s64, NT_I64, 1, &two), 4), oh, sizeof oh), 0);
    assert_true(oh[2] == 1 && oh[4] == 1 && oh[0] == 0 && oh[5] == 0);
    /* 2^32 + 1 would wrap to row 1: it is out of range */
    const int64_t big[1] = {((int64_t)1 << 32) + 1};
    int64_t one = 1;
    nt_tensor *e = nt_embedding(w, nt_from_host(big, NT_I64, 1, &one));
    int rc = e ? nt_to_host(e, a, 12) : nt_last_error();
    assert_int_not_equal(rc, 0);
    nt_clear_error();
    nt_scope_end(sc);
}

/* ---------------- bool ---------------- */

static void test_bool(void **state)
{
    (void)state;
    assert_string_equal(nt_dtype_name(NT_BOOL), "bool");
    assert_int_equal(nt_dtype_size(NT_BOOL), 1);
    nt_scope *sc = nt_scope_begin();
    const float f[4] = {NAN, -0.0f, 0.25f, 0.0f};
    int64_t n = 4;
    nt_tensor *m = nt_cast(nt_from_host(f, NT_F32, 1, &n), NT_BOOL);
    assert_int_equal(nt_dtype_of(m), NT_BOOL);
    uint8_t u[4];
    assert_int_equal(nt_to_host(m, u, 4), 0);
    assert_true(u[0] == 1 && u[1] == 0 && u[2] == 1 && u[3] == 0); /* PyTorch: NaN is True */
    /* a bool mask selects */
    const float a[4] = {1, 2, 3, 4};
    float y[4];
    nt_tensor *t = nt_from_host(a, NT_F32, 1, &n);
    assert_int_equal(nt_to_host(nt_where(m, t, nt_zeros(NT_F32, 0, NULL)), y, sizeof y), 0);
    assert_true(y[0] == 1 && y[1] == 0 && y[2] == 3 && y[3] == 0);
    assert_int_equal(nt_to_host(nt_masked_fill(t, m, -1.0), y, sizeof y), 0); /* a bool mask */
    assert_true(y[0] == -1 && y[1] == 2 && y[2] == -1 && y[3] == 4);
    /* logical or / and as add / mul, result bool; compares give u8 */
    const uint8_t bv[4] = {1, 1, 0, 0};
    nt_tensor *b = nt_from_host(bv, NT_BOOL, 1, &n);
    nt_tensor *o = nt_add(m, b);
    assert_int_equal(nt_dtype_of(o), NT_BOOL);
    assert_int_equal(nt_to_host(o, u, 4), 0);
    assert_true(u[0] == 1 && u[1] == 1 && u[2] == 1 && u[3] == 0);
    assert_int_equal(nt_to_host(nt_mul(m, b), u, 4), 0);
    assert_true(u[0] == 1 && u[1] == 0 && u[2] == 0 && u[3] == 0);
    assert_int_equal(nt_dtype_of(nt_eq(m, b)), NT_U8);
    /* bool with u8 is u8; casts out give 0 / 1 */
    assert_int_equal(nt_dtype_of(nt_add(b, nt_ones(NT_U8, 0, NULL))), NT_U8);
    assert_int_equal(nt_to_host(nt_cast(m, NT_F32), y, sizeof y), 0);
    assert_true(y[0] == 1 && y[1] == 0);
    char *s = nt_format(m);
    assert_non_null(s);
    assert_non_null(strstr(s, "True"));
    assert_non_null(strstr(s, "False"));
    assert_non_null(strstr(s, "dtype=bool"));
    free(s);
    nt_scope_end(sc);
}

/* i64 and bool: the same bits in every mode and on both backends */
static void run_int_program(int64_t *out64, uint8_t *outb)
{
    const int64_t v[6] = {5, -3, ((int64_t)1 << 40) + 3, 0, 7, -1};
    int64_t sh[2] = {2, 3};
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_from_host(v, NT_I64, 2, sh);
    nt_tensor *y = nt_add(nt_mul(x, x), nt_clamp(x, -2, 6));
    nt_tensor *m = nt_cast(nt_gt(y, nt_full(NT_I64, 0, NULL, 10)), NT_BOOL);
    assert_int_equal(nt_to_host(nt_where(m, y, nt_neg(x)), out64, 48), 0);
    assert_int_equal(nt_to_host(nt_add(m, nt_cast(x, NT_BOOL)), outb, 6), 0);
    nt_scope_end(sc);
}

static void test_int_modes(void **state)
{
    (void)state;
    int64_t r64[6], g64[6];
    uint8_t rb[6], gb[6];
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    run_int_program(r64, rb);
    assert_true(r64[2] == (int64_t)((uint64_t)(((int64_t)1 << 40) + 3) * (uint64_t)(((int64_t)1 << 40) + 3)) + 6);
    assert_true(r64[0] == 30 && r64[1] == 3 && r64[3] == 0);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
        run_int_program(g64, gb);
        assert_memory_equal(r64, g64, sizeof r64);
        assert_memory_equal(rb, gb, sizeof rb);
    }
    nt_test_cfg(0);
}

static void test_int_errors(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    int64_t sh[2] = {2, 3};
    nt_tensor *x = nt_zeros(NT_I64, 2, sh), *m = nt_zeros(NT_BOOL, 2, sh);
    nt_tensor *w = nt_zeros(NT_F32, 2, sh);
    assert_null(nt_softmax(x, 1)); /* its own check: floats only */
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_softmax", "'t'", "i64");
    assert_null(nt_sqrt(x)); /* (sums take i64: tests/test_close34.c) */
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_sqrt", "is i64");
    assert_null(nt_exp(m));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_exp", "is bool");
    /* i64 as an index is fine, as the gathered data it is not */
    int64_t one = 1;
    nt_tensor *ix = nt_zeros(NT_I64, 1, &one);
    assert_non_null(nt_index_select(w, 0, ix));
    assert_null(nt_index_select(x, 0, ix));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_index_select", "is i64");
    /* a float index is still refused, naming the dtypes taken */
    assert_null(nt_index_select(w, 0, nt_zeros(NT_F32, 1, &one)));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_index_select", "i32, i64 or u8");
    /* the simulator under NT_REQUIRE_SIM */
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    assert_null(nt_add(x, x));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_add", "i64");
    assert_null(nt_where(m, w, w));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_where", "bool");
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    nt_scope_end(sc);
}

/* the simulator's instruction level refuses tiles of the dtypes its engines
 * lack, naming the tile and the dtype */
static void test_sim_tiles(void **state)
{
    (void)state;
    const nt_dtype bad[3] = {NT_F64, NT_I64, NT_BOOL};
    for (int i = 0; i < 3; i++) {
        nt_sim_kernel *k = nt_sim_kernel_begin("dtypes");
        assert_non_null(k);
        assert_null(nt_tile_alloc(k, "t64", NT_MEM_SBUF, bad[i], 4, 8));
        assert_int_equal(nt_sim_kernel_error(k), NT_ESIM);
        const char *m = nt_sim_kernel_message(k);
        assert_non_null(strstr(m, "t64"));
        assert_non_null(strstr(m, nt_dtype_name(bad[i])));
        nt_sim_kernel_end(k, NULL);
        nt_clear_error();
    }
    nt_sim_kernel *k = nt_sim_kernel_begin("dtypes");
    assert_non_null(nt_tile_alloc(k, "ok", NT_MEM_SBUF, NT_F32, 4, 8));
    assert_int_equal(nt_sim_kernel_end(k, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_vs_torch),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_i64),
        cmocka_unit_test(test_i64_indices),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_int_modes),
        cmocka_unit_test(test_int_errors),
        cmocka_unit_test(test_sim_tiles),
    };
    return cmocka_run_group_tests(tests, nt_test_setup, nt_test_teardown);
}
