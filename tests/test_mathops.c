/* tests/test_mathops.c - the elementwise math ops of issue 34 (sin, cos, erf,
 * log1p, expm1, sign, floor, ceil, round, trunc, atan2, fmod) and nt_flip
 * against PyTorch 1.13: tests/torch_refs/ewmath.h, written by
 * scripts/torch_refs/ewmath.py (edge values, odd shapes, gradients), on the
 * CPU and on the simulator; the integer forms; and every error path.
 *
 * Bounds against PyTorch (both sides round once or nearly):
 *   sign, floor, ceil, round, trunc, fmod, flip and the zero gradients:
 *     bitwise (the same definitions; NaN is any NaN);
 *   sin, cos, log1p, expm1, atan2: <= 2 ulp (ntensor's are within 0.5 ulp
 *     of the exact value, tests/test_nmath.c; PyTorch's libm/SLEEF within 1);
 *   erf: <= 4 ulp (nt__erff <= 2 ulp, PyTorch's <= 1);
 *   the gradients of sin, cos, erf, log1p, expm1: <= 4 ulp (the factor's
 *     error plus a different order: PyTorch's g / (x + 1) is our
 *     g * (1 / (1 + x)));
 *   atan2's and fmod's broadcast gradients: 1e-5 relative (a sum over the
 *     broadcast dim in a different order).
 * Where PyTorch's own f32 kernel is off the exact value (see exact_of), the
 * value is held to double libm instead, and the case is printed. */
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
#include "torch_refs/ewmath.h"
#include "examples/gpt_model.h" /* gpt_sinpos, char_gpt --sinpos */

static const char *const BACKENDS[2] = {"cpu", "sim"};

static void backend(int b)
{
    assert_int_equal(nt_config_set("NT_BACKEND", BACKENDS[b]), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", b ? "1" : "0"), 0);
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t u_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* distance in f32 steps (0: the same value and sign, or both NaN) */
static double ulps(float a, float b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b) ? 0 : INFINITY;
    if (u_of(a) == u_of(b))
        return 0;
    if (!signbit(a) != !signbit(b))
        return a == 0 && b == 0 ? INFINITY : fabs((double)a) + fabs((double)b) > 0 ? 1e9 : 0;
    int64_t ia = u_of(fabsf(a)), ib = u_of(fabsf(b));
    return (double)(ia > ib ? ia - ib : ib - ia);
}

static nt_tensor *from_bits(const uint32_t *u, int nd, const int64_t *sh)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= sh[i];
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = f_of(u[i]);
    nt_tensor *t = nt_from_host(f, NT_F32, nd, sh);
    free(f);
    assert_non_null(t);
    return t;
}

/* Where PyTorch's f32 kernel is itself off (log1p(-2^-149) gives +0, fmod
 * by a subnormal gives NaN: a - trunc(a / b) * b overflows), a value within
 * 1 ulp of the double libm result counts as right; cmp prints how many. */
static const float *exact_of; /* NULL: none */

/* y's n f32 values against want within tol ulps; returns the worst */
static double cmp(const char *what, nt_tensor *y, const uint32_t *want, int64_t n, double tol)
{
    assert_non_null(y);
    assert_int_equal(nt_dtype_of(y), NT_F32);
    assert_int_equal(nt_numel(y), n);
    float *h = malloc((size_t)n * sizeof *h);
    assert_int_equal(nt_to_host(y, h, (size_t)n * sizeof *h), 0);
    double worst = 0;
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        double u = ulps(h[i], f_of(want[i]));
        if (u > tol && exact_of && ulps(h[i], exact_of[i]) <= 1) {
            if (off++ < 2)
                print_message("# %s[%lld]: %a where PyTorch gives %a; double libm %a\n", what,
                              (long long)i, (double)h[i], (double)f_of(want[i]),
                              (double)exact_of[i]);
            continue;
        }
        if (u > worst)
            worst = u;
        if (u > tol)
            fail_msg("%s[%lld] = %a, PyTorch %a (%.0f ulp > %.0f)", what, (long long)i,
                     (double)h[i], (double)f_of(want[i]), u, tol);
    }
    if (off)
        print_message("# %s: %lld values held to double libm where PyTorch is off\n", what,
                      (long long)off);
    free(h);
    return worst;
}

typedef nt_tensor *(*unary_fn)(nt_tensor *);

static double r_sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }

static const struct {
    const char *name;
    unary_fn f;
    double (*ref)(double);
    const uint32_t *edges, *x, *gx;
    double tol, gtol;
} UN[] = {
    {"sin", nt_sin, sin, ewm_sin_edges, ewm_sin_x, ewm_sin_gx, 2, 4},
    {"cos", nt_cos, cos, ewm_cos_edges, ewm_cos_x, ewm_cos_gx, 2, 4},
    {"erf", nt_erf, erf, ewm_erf_edges, ewm_erf_x, ewm_erf_gx, 4, 4},
    {"log1p", nt_log1p, log1p, ewm_log1p_edges, ewm_log1p_x, ewm_log1p_gx, 2, 4},
    {"expm1", nt_expm1, expm1, ewm_expm1_edges, ewm_expm1_x, ewm_expm1_gx, 2, 4},
    {"sign", nt_sign, r_sign, ewm_sign_edges, ewm_sign_x, ewm_sign_gx, 0, 0},
    {"floor", nt_floor, floor, ewm_floor_edges, ewm_floor_x, ewm_floor_gx, 0, 0},
    {"ceil", nt_ceil, ceil, ewm_ceil_edges, ewm_ceil_x, ewm_ceil_gx, 0, 0},
    {"round", nt_round, nearbyint, ewm_round_edges, ewm_round_x, ewm_round_gx, 0, 0},
    {"trunc", nt_trunc, trunc, ewm_trunc_edges, ewm_trunc_x, ewm_trunc_gx, 0, 0},
};

static const int64_t SH3[3] = {3, 5, 7};

/* every unary op on the edge values and on [3, 5, 7], and the gradient of
 * sum(f(x) * w), on both backends */
static void test_unary_vs_torch(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        backend(b);
        for (size_t k = 0; k < sizeof UN / sizeof UN[0]; k++) {
            nt_scope *sc = nt_scope_begin();
            char what[64];
            nt_tensor *e = from_bits(ewm_edges, 1, (int64_t[]){EWM_NEDGE});
            float ex[EWM_NEDGE];
            for (int i = 0; i < EWM_NEDGE; i++)
                ex[i] = (float)UN[k].ref((double)f_of(ewm_edges[i]));
            snprintf(what, sizeof what, "%s %s(edges)", BACKENDS[b], UN[k].name);
            exact_of = ex;
            double w1 = cmp(what, UN[k].f(e), UN[k].edges, EWM_NEDGE, UN[k].tol);
            exact_of = NULL;
            nt_tensor *x = from_bits(ewm_x, 3, SH3), *w = from_bits(ewm_w, 3, SH3);
            assert_int_equal(nt_set_requires_grad(x, true), 0);
            nt_tensor *y = UN[k].f(x);
            snprintf(what, sizeof what, "%s %s(x)", BACKENDS[b], UN[k].name);
            double w2 = cmp(what, y, UN[k].x, 105, UN[k].tol);
            assert_int_equal(nt_backward(nt_sum(nt_mul(y, w), NT_DIM_ALL, false)), 0);
            snprintf(what, sizeof what, "%s grad %s", BACKENDS[b], UN[k].name);
            double w3 = cmp(what, nt_grad(x), UN[k].gx, 105, UN[k].gtol);
            print_message("# %s %s: %.0f / %.0f ulp from PyTorch, gradient %.0f\n", BACKENDS[b],
                          UN[k].name, w1, w2, w3);
            nt_scope_end(sc);
        }
    }
}

/* the zero gradient is zeros even where g is Inf or NaN (g * 0 would be NaN) */
static void test_zero_grad_nonfinite_g(void **state)
{
    (void)state;
    unary_fn fs[] = {nt_sign, nt_floor, nt_ceil, nt_round, nt_trunc};
    for (int b = 0; b < 2; b++) {
        backend(b);
        for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
            nt_scope *sc = nt_scope_begin();
            float xv[3] = {1.5f, -2.5f, 0.25f}, gv[3] = {INFINITY, NAN, 1.0f}, g[3];
            nt_tensor *x = nt_from_host(xv, NT_F32, 1, (int64_t[]){3});
            nt_tensor *gw = nt_from_host(gv, NT_F32, 1, (int64_t[]){3});
            assert_int_equal(nt_set_requires_grad(x, true), 0);
            assert_int_equal(nt_backward(nt_sum(nt_mul(fs[k](x), gw), NT_DIM_ALL, false)), 0);
            assert_int_equal(nt_to_host(nt_grad(x), g, sizeof g), 0);
            for (int i = 0; i < 3; i++)
                assert_true(u_of(g[i]) == 0u);
            nt_scope_end(sc);
        }
    }
}

/* integers: sign and the roundings keep i32 (and u8) */
static void test_int_forms(void **state)
{
    (void)state;
    unary_fn fs[] = {nt_sign, nt_floor, nt_ceil, nt_round, nt_trunc};
    const int32_t *want[] = {ewm_sign_int, ewm_floor_int, ewm_ceil_int, ewm_round_int,
                             ewm_trunc_int};
    for (int b = 0; b < 2; b++) {
        backend(b);
        for (int k = 0; k < 5; k++) {
            nt_scope *sc = nt_scope_begin();
            nt_tensor *x = nt_from_host(ewm_int_x, NT_I32, 1, (int64_t[]){EWM_NINT});
            nt_tensor *y = fs[k](x);
            assert_non_null(y);
            assert_int_equal(nt_dtype_of(y), NT_I32);
            int32_t h[EWM_NINT];
            assert_int_equal(nt_to_host(y, h, sizeof h), 0);
            assert_memory_equal(h, want[k], sizeof h);
            uint8_t u[4] = {0, 1, 200, 255}, r[4];
            nt_tensor *yu = fs[k](nt_from_host(u, NT_U8, 1, (int64_t[]){4}));
            assert_non_null(yu);
            assert_int_equal(nt_dtype_of(yu), NT_U8);
            assert_int_equal(nt_to_host(yu, r, sizeof r), 0);
            for (int i = 0; i < 4; i++)
                assert_int_equal(r[i], k == 0 ? (u[i] > 0) : u[i]);
            nt_scope_end(sc);
        }
    }
}

static double rel_cmp(const char *what, nt_tensor *y, const uint32_t *want, int64_t n)
{
    float *h = malloc((size_t)n * sizeof *h);
    assert_non_null(y);
    assert_int_equal(nt_numel(y), n);
    assert_int_equal(nt_to_host(y, h, (size_t)n * sizeof *h), 0);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = (double)f_of(want[i]), d = fabs((double)h[i] - w) / (1.0 + fabs(w));
        if (d > worst)
            worst = d;
        if (!(d <= 1e-5))
            fail_msg("%s[%lld] = %a, PyTorch %a", what, (long long)i, (double)h[i], w);
    }
    free(h);
    return worst;
}

/* atan2 and fmod on every pair of edge values, and broadcast [3, 1, 7] x
 * [5, 1] with both gradients */
static void test_binary_vs_torch(void **state)
{
    (void)state;
    nt_tensor *(*fs[2])(nt_tensor *, nt_tensor *) = {nt_atan2, nt_fmod};
    const char *nm[2] = {"atan2", "fmod"};
    const uint32_t *pairs[2] = {ewm_atan2_pairs, ewm_fmod_pairs}, *ys[2] = {ewm_atan2_y, ewm_fmod_y};
    const uint32_t *gas[2] = {ewm_atan2_ga, ewm_fmod_ga}, *gbs[2] = {ewm_atan2_gb, ewm_fmod_gb};
    for (int b = 0; b < 2; b++) {
        backend(b);
        for (int k = 0; k < 2; k++) {
            nt_scope *sc = nt_scope_begin();
            char what[64];
            nt_tensor *pa = from_bits(ewm_pa, 1, (int64_t[]){EWM_NPAIR});
            nt_tensor *pb = from_bits(ewm_pb, 1, (int64_t[]){EWM_NPAIR});
            float ex[EWM_NPAIR];
            for (int i = 0; i < EWM_NPAIR; i++) {
                double u = f_of(ewm_pa[i]), v = f_of(ewm_pb[i]);
                ex[i] = (float)(k ? fmod(u, v) : atan2(u, v));
            }
            snprintf(what, sizeof what, "%s %s(pairs)", BACKENDS[b], nm[k]);
            exact_of = ex;
            double w1 = cmp(what, fs[k](pa, pb), pairs[k], EWM_NPAIR, k ? 0 : 2);
            exact_of = NULL;
            nt_tensor *a = from_bits(ewm_ba, 3, (int64_t[]){3, 1, 7});
            nt_tensor *bb = from_bits(ewm_bb, 2, (int64_t[]){5, 1});
            nt_tensor *w = from_bits(ewm_bw, 3, SH3);
            assert_int_equal(nt_set_requires_grad(a, true), 0);
            assert_int_equal(nt_set_requires_grad(bb, true), 0);
            nt_tensor *y = fs[k](a, bb);
            snprintf(what, sizeof what, "%s %s(a, b)", BACKENDS[b], nm[k]);
            double w2 = cmp(what, y, ys[k], 105, k ? 0 : 2);
            assert_int_equal(nt_backward(nt_sum(nt_mul(y, w), NT_DIM_ALL, false)), 0);
            snprintf(what, sizeof what, "%s %s grad a", BACKENDS[b], nm[k]);
            double g1 = rel_cmp(what, nt_grad(a), gas[k], 21);
            snprintf(what, sizeof what, "%s %s grad b", BACKENDS[b], nm[k]);
            double g2 = rel_cmp(what, nt_grad(bb), gbs[k], 5);
            print_message("# %s %s: %.0f / %.0f ulp from PyTorch, gradients %.1e %.1e\n",
                          BACKENDS[b], nm[k], w1, w2, g1, g2);
            nt_scope_end(sc);
        }
    }
}

/* integer fmod: C's %, the sign of a; a divisor of 0 gives 0 and INT32_MIN
 * % -1 gives 0 (documented: PyTorch raises for 0); broadcasting; u8 */
static void test_int_fmod(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        backend(b);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *a = nt_from_host(ewm_fmod_ia, NT_I32, 1, (int64_t[]){10});
        nt_tensor *d = nt_from_host(ewm_fmod_ib, NT_I32, 1, (int64_t[]){10});
        nt_tensor *y = nt_fmod(a, d);
        assert_non_null(y);
        assert_int_equal(nt_dtype_of(y), NT_I32);
        int32_t h[10];
        assert_int_equal(nt_to_host(y, h, sizeof h), 0);
        assert_memory_equal(h, ewm_fmod_int, sizeof h);
        int32_t xa[4] = {7, -7, INT32_MIN, INT32_MIN}, xb[4] = {0, 0, -1, 0}, r[4];
        y = nt_fmod(nt_from_host(xa, NT_I32, 1, (int64_t[]){4}),
                    nt_from_host(xb, NT_I32, 1, (int64_t[]){4}));
        assert_int_equal(nt_to_host(y, r, sizeof r), 0);
        for (int i = 0; i < 4; i++)
            assert_int_equal(r[i], 0);
        uint8_t ua[3] = {200, 7, 255}, ub[1] = {9}, ur[3];
        y = nt_fmod(nt_from_host(ua, NT_U8, 1, (int64_t[]){3}),
                    nt_from_host(ub, NT_U8, 1, (int64_t[]){1}));
        assert_int_equal(nt_dtype_of(y), NT_U8);
        assert_int_equal(nt_to_host(y, ur, sizeof ur), 0);
        assert_int_equal(ur[0], 200 % 9);
        assert_int_equal(ur[1], 7);
        assert_int_equal(ur[2], 255 % 9);
        nt_scope_end(sc);
    }
}

/* nt_flip against torch.flip, values and gradients bit for bit */
static void test_flip_vs_torch(void **state)
{
    (void)state;
    static const struct {
        int n, dims[3];
        const uint32_t *y, *gx;
    } F[] = {
        {1, {0}, ewm_flip0_y, ewm_flip0_gx},
        {2, {1, 2}, ewm_flip1_y, ewm_flip1_gx},
        {2, {-1, 0}, ewm_flip2_y, ewm_flip2_gx},
        {3, {0, 1, 2}, ewm_flip3_y, ewm_flip3_gx},
        {1, {2}, ewm_flip4_y, ewm_flip4_gx},
    };
    for (int b = 0; b < 2; b++) {
        backend(b);
        for (size_t k = 0; k < sizeof F / sizeof F[0]; k++) {
            nt_scope *sc = nt_scope_begin();
            char what[64];
            nt_tensor *x = from_bits(ewm_x, 3, SH3), *w = from_bits(ewm_w, 3, SH3);
            assert_int_equal(nt_set_requires_grad(x, true), 0);
            nt_tensor *y = nt_flip(x, F[k].n, F[k].dims);
            snprintf(what, sizeof what, "%s flip #%zu", BACKENDS[b], k);
            cmp(what, y, F[k].y, 105, 0);
            assert_int_equal(nt_backward(nt_sum(nt_mul(y, w), NT_DIM_ALL, false)), 0);
            snprintf(what, sizeof what, "%s flip #%zu grad", BACKENDS[b], k);
            cmp(what, nt_grad(x), F[k].gx, 105, 0);
            nt_scope_end(sc);
        }
        nt_scope *sc = nt_scope_begin();
        /* integers, a size-1 dim */
        nt_tensor *xi = nt_from_host(ewm_flip_int_x, NT_I32, 3, (int64_t[]){3, 1, 4});
        nt_tensor *yi = nt_flip(xi, 2, (int[]){1, 2});
        int32_t hi[12];
        assert_int_equal(nt_dtype_of(yi), NT_I32);
        assert_int_equal(nt_to_host(yi, hi, sizeof hi), 0);
        assert_memory_equal(hi, ewm_flip_int_y, sizeof hi);
        /* bf16 values move unrounded; no dims is a copy (a new tensor) */
        nt_tensor *xb = nt_cast(from_bits(ewm_x, 3, SH3), NT_BF16);
        uint16_t hb[105], fb[105];
        assert_int_equal(nt_to_host(xb, hb, sizeof hb), 0);
        nt_tensor *yb = nt_flip(xb, 1, (int[]){0});
        assert_int_equal(nt_dtype_of(yb), NT_BF16);
        assert_int_equal(nt_to_host(yb, fb, sizeof fb), 0);
        for (int i = 0; i < 3; i++)
            assert_memory_equal(fb + i * 35, hb + (2 - i) * 35, 35 * sizeof *hb);
        nt_tensor *c = nt_flip(xb, 0, NULL);
        assert_non_null(c);
        assert_true(c != xb);
        assert_int_equal(nt_to_host(c, fb, sizeof fb), 0);
        assert_memory_equal(fb, hb, sizeof hb);
        /* 0-d and empty tensors */
        assert_non_null(nt_flip(nt_full(NT_F32, 0, NULL, 2.0), 0, NULL));
        nt_tensor *em = nt_flip(nt_zeros(NT_F32, 2, (int64_t[]){0, 3}), 2, (int[]){0, 1});
        assert_non_null(em);
        assert_int_equal(nt_numel(em), 0);
        nt_scope_end(sc);
    }
}

/* a clear error naming the function and the argument; nothing else changes */
static void expect_err(nt_tensor *r, int code, const char *fn, const char *part)
{
    assert_null(r);
    assert_int_equal(nt_last_error(), code);
    const char *m = nt_last_error_message();
    if (!strstr(m, fn) || (part && !strstr(m, part)))
        fail_msg("message '%s' should name %s and '%s'", m, fn, part ? part : "");
    nt_clear_error();
}

static void test_bad_input(void **state)
{
    (void)state;
    backend(0);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_ones(NT_F32, 2, (int64_t[]){3, 4});
    nt_tensor *y = nt_ones(NT_F32, 1, (int64_t[]){5});
    unary_fn fs[] = {nt_sin, nt_cos, nt_erf, nt_log1p, nt_expm1,
                     nt_sign, nt_floor, nt_ceil, nt_round, nt_trunc};
    const char *nm[] = {"nt_sin", "nt_cos", "nt_erf", "nt_log1p", "nt_expm1",
                        "nt_sign", "nt_floor", "nt_ceil", "nt_round", "nt_trunc"};
    for (int k = 0; k < 10; k++)
        expect_err(fs[k](NULL), NT_EINVAL, nm[k], "'t'");
    expect_err(nt_atan2(NULL, x), NT_EINVAL, "nt_atan2", "'a'");
    expect_err(nt_fmod(x, NULL), NT_EINVAL, "nt_fmod", "'b'");
    expect_err(nt_atan2(x, y), NT_ESHAPE, "nt_atan2", NULL);
    expect_err(nt_fmod(x, y), NT_ESHAPE, "nt_fmod", NULL);
    expect_err(nt_flip(NULL, 1, (int[]){0}), NT_EINVAL, "nt_flip", "'t'");
    expect_err(nt_flip(x, 1, (int[]){2}), NT_EDIM, "nt_flip", "dims[0] = 2");
    expect_err(nt_flip(x, 2, (int[]){0, -3}), NT_EDIM, "nt_flip", "dims[1] = -3");
    expect_err(nt_flip(x, 2, (int[]){1, -1}), NT_EINVAL, "nt_flip", "dims[1] = -1");
    expect_err(nt_flip(x, -1, (int[]){0}), NT_EINVAL, "nt_flip", "'dims'");
    expect_err(nt_flip(x, 1, NULL), NT_EINVAL, "nt_flip", "'dims'");
    /* x is unchanged and usable */
    float h[12];
    assert_int_equal(nt_to_host(nt_flip(x, 1, (int[]){1}), h, sizeof h), 0);
    for (int i = 0; i < 12; i++)
        assert_true(h[i] == 1.0f);
    nt_scope_end(sc);
}

/* char_gpt --sinpos: gpt_sinpos [T, D] made with nt_sin/nt_cos on the
 * device, the same bits on both backends, against the formula in double
 * (its f32 steps, exp and t * w, move the angle by < 1e-6 here) */
static void test_sinpos(void **state)
{
    (void)state;
    enum { T = 9, D = 12 };
    float h[2][T * D];
    for (int b = 0; b < 2; b++) {
        backend(b);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *pe = gpt_sinpos(T, D);
        assert_non_null(pe);
        assert_int_equal(nt_shape(pe, 0), T);
        assert_int_equal(nt_shape(pe, 1), D);
        assert_int_equal(nt_to_host(pe, h[b], sizeof h[b]), 0);
        nt_scope_end(sc);
    }
    assert_memory_equal(h[0], h[1], sizeof h[0]);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) {
            double a = t * pow(10000.0, -(double)(i & ~1) / D);
            double want = i & 1 ? cos(a) : sin(a);
            if (!(fabs(h[0][t * D + i] - want) <= 1e-5))
                fail_msg("pe[%d, %d] = %.9g, want %.9g", t, i, (double)h[0][t * D + i], want);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_vs_torch),
        cmocka_unit_test(test_zero_grad_nonfinite_g),
        cmocka_unit_test(test_int_forms),
        cmocka_unit_test(test_binary_vs_torch),
        cmocka_unit_test(test_int_fmod),
        cmocka_unit_test(test_flip_vs_torch),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_sinpos),
    };
    return cmocka_run_group_tests(tests, nt_test_setup, nt_test_teardown);
}
