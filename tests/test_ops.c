/* tests/test_ops.c - every op's values through the public API, against
 * independent references, for each dtype where the op makes sense; views as
 * inputs and as in-place targets; and every error path.
 *
 * References are written here, in double precision, from the documented
 * meaning of each op (include/ntensor.h, docs/ops.md); nothing computes an
 * expectation through the library's internals.  (One test calls
 * nt__gemm_ktile directly, to check the *structure* the simulator relies on:
 * a big call equals the same call cut into 128 x 512 output blocks.)
 *
 * Tolerances, stated next to each check:
 *   exact      bitwise (NaN matches NaN, and the sign of zero counts)
 *              wherever the op is a copy, a cast, or a single correctly
 *              rounded IEEE f32 operation followed by one rounding to the
 *              output dtype.  For f32 the reference is the double result
 *              rounded to f32: for + - * / sqrt of f32 inputs that is the
 *              correctly rounded f32 result (53 >= 2 * 24 + 2, so double
 *              rounding is innocuous).  For bf16/f16 outputs the reference is
 *              that f32 value rounded to the dtype ("math in f32, one
 *              rounding to the result dtype").
 *              Integer-valued inputs make sums and matmuls exact in f32, so
 *              their layout, broadcasting and view handling are checked
 *              exactly too.
 *   ulps       for everything else: |got - ref| <= b * ulp(ref) in f32, and
 *              for bf16/f16 |got - round(ref)| <= b * ulp of the dtype, with
 *              b stated at each check.
 *   absolute   where cancellation makes relative error meaningless (sums of
 *              mixed signs, gelu's tail, log_softmax near 0): a bound from
 *              the summation error analysis, stated at each check. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "ntensor.h"
#include "core/gemm.h" /* the matmul K-tile primitive: only for the blocking test */
#include "core/optable.h" /* the group counts the op lists below are checked against */
#include "nt_test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define U 0x1p-24 /* f32 unit roundoff */

static const nt_dtype FLOATS[] = {NT_F32, NT_BF16, NT_F16};

/* ------------------------------------------------------------------ */
/* Scratch memory, freed after each test                              */
/* ------------------------------------------------------------------ */

static void *scratch_list[8192];
static int scratch_n;

static void *scr(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    assert_true(scratch_n < (int)(sizeof scratch_list / sizeof scratch_list[0]));
    scratch_list[scratch_n++] = p;
    return p;
}
static double *dv(int64_t n) { return scr((size_t)n * sizeof(double)); }

/* ------------------------------------------------------------------ */
/* Test-side dtype codec (independent of core/dtype.h)                */
/* ------------------------------------------------------------------ */

/* v rounded to nearest even at bf16 precision (8 significant bits, exponent
 * range of f32, subnormal quantum 2^-133), by double arithmetic. */
static double q_bf16(double v)
{
    if (isnan(v) || isinf(v) || v == 0)
        return v;
    double a = fabs(v);
    int e;
    frexp(a, &e);
    int qe = e - 8 < -133 ? -133 : e - 8;
    double C = ldexp(1.5, 52 + qe);
    double r = (a + C) - C;
    if (r >= 0x1p128)
        r = INFINITY;
    return copysign(r, v);
}

/* v rounded once to dt (floats: nearest even; ints: toward zero,
 * saturating, NaN -> 0). */
static double rnd(nt_dtype dt, double v)
{
    switch (dt) {
    case NT_F32: return (double)(float)v;
    case NT_BF16: return q_bf16(v);
    case NT_F16: return (double)(_Float16)v;
    case NT_I32: /* (+ 0.0: integers have no -0) */
        if (isnan(v)) return 0;
        if (v >= 2147483647.0) return 2147483647.0;
        if (v <= -2147483648.0) return -2147483648.0;
        return trunc(v) + 0.0;
    case NT_U8:
        if (isnan(v) || v <= 0) return 0;
        if (v >= 255) return 255;
        return trunc(v) + 0.0;
    default: return v;
    }
}

static size_t dsize(nt_dtype dt) { return dt == NT_U8 ? 1 : (dt == NT_F32 || dt == NT_I32) ? 4 : 2; }

/* Stores v (already representable in dt) as element i of buf. */
static void put(nt_dtype dt, void *buf, int64_t i, double v)
{
    switch (dt) {
    case NT_F32: ((float *)buf)[i] = (float)v; break;
    case NT_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)buf)[i] = isnan(v) ? (uint16_t)((u >> 16) | 0x40) : (uint16_t)(u >> 16);
        break;
    }
    case NT_F16: {
        _Float16 h = (_Float16)v;
        memcpy((uint16_t *)buf + i, &h, 2);
        break;
    }
    case NT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case NT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double get(nt_dtype dt, const void *buf, int64_t i)
{
    switch (dt) {
    case NT_F32: return ((const float *)buf)[i];
    case NT_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case NT_F16: {
        _Float16 h;
        memcpy(&h, (const uint16_t *)buf + i, 2);
        return (double)h;
    }
    case NT_I32: return ((const int32_t *)buf)[i];
    case NT_U8: return ((const uint8_t *)buf)[i];
    default: return NAN;
    }
}

/* ------------------------------------------------------------------ */
/* Tensors in and out                                                 */
/* ------------------------------------------------------------------ */

static int64_t numel_of(int nd, const int64_t *sh)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= sh[i];
    return n;
}

/* A tensor of dtype dt holding v, which is rounded to dt in place first (so
 * the caller's reference sees the values the tensor holds). */
static nt_tensor *mk(nt_dtype dt, int nd, const int64_t *sh, double *v)
{
    int64_t n = numel_of(nd, sh);
    void *buf = scr((size_t)n * dsize(dt));
    for (int64_t i = 0; i < n; i++) {
        v[i] = rnd(dt, v[i]);
        put(dt, buf, i, v[i]);
    }
    nt_tensor *t = nt_from_host(buf, dt, nd, sh);
    if (!t)
        fail_msg("nt_from_host: %s", nt_last_error_message());
    return t;
}

/* t's values (synchronises), decoded to double. */
static double *fetch(nt_tensor *t)
{
    assert_non_null(t);
    int64_t n = nt_numel(t);
    nt_dtype dt = nt_dtype_of(t);
    void *buf = scr((size_t)n * dsize(dt));
    int rc = nt_to_host(t, buf, (size_t)n * dsize(dt));
    if (rc)
        fail_msg("nt_to_host: %s", nt_last_error_message());
    double *v = dv(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = get(dt, buf, i);
    return v;
}

/* ------------------------------------------------------------------ */
/* Random values (a fixed xorshift stream per test)                   */
/* ------------------------------------------------------------------ */

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double urand(void) { return (double)(rng_next() >> 11) * 0x1p-53; }
static double *randv(int64_t n, double lo, double hi)
{
    double *v = dv(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (hi - lo) * urand();
    return v;
}
static double *intv(int64_t n, int lo, int hi)
{
    double *v = dv(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
    return v;
}
static double *copyv(const double *v, int64_t n)
{
    double *c = dv(n);
    memcpy(c, v, (size_t)n * sizeof(double));
    return c;
}

/* ------------------------------------------------------------------ */
/* Comparisons                                                        */
/* ------------------------------------------------------------------ */

static bool verbose;

static bool same(double a, double b)
{
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

/* Bitwise: same value, NaN matches NaN, sign of zero counts. */
static void exact(const char *what, const double *got, const double *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!same(got[i], want[i]))
            fail_msg("%s[%lld]: got %.9g (%a), want %.9g (%a)", what, (long long)i, got[i],
                     got[i], want[i], want[i]);
}

static void exact1(const char *what, double got, double want) { exact(what, &got, &want, 1); }

static double ulp_of(nt_dtype dt, double r)
{
    int p = dt == NT_F32 ? 24 : dt == NT_BF16 ? 8 : 11;
    int emin = dt == NT_F16 ? -14 : -126;
    r = fabs(r);
    int e = (r == 0 || isinf(r)) ? emin : ilogb(r);
    return ldexp(1.0, (e < emin ? emin : e) - p + 1);
}

static double err_ulps(nt_dtype dt, double got, double ref)
{
    if (isnan(got) || isnan(ref))
        return isnan(got) && isnan(ref) ? 0 : INFINITY;
    if (isinf(got) || isinf(ref))
        return got == ref ? 0 : INFINITY;
    return fabs(got - ref) / ulp_of(dt, ref);
}

/* A reference past the dtype's overflow threshold is an infinity. */
static double clip(nt_dtype dt, double r)
{
    double lim = dt == NT_F32 ? 0x1.ffffffp127 : dt == NT_BF16 ? 0x1.ffp127 : 65520.0;
    return fabs(r) >= lim ? copysign(INFINITY, r) : r;
}

/* f32: |got - ref| <= bound ulp(ref).  bf16/f16: the reference rounded to
 * the dtype first, then the same in the dtype's ulps. */
static void near(const char *what, nt_dtype dt, const double *got, const double *ref, int64_t n,
                 double bound)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = dt == NT_F32 ? clip(dt, ref[i]) : rnd(dt, ref[i]);
        double e = err_ulps(dt, got[i], r);
        if (!(e <= bound))
            fail_msg("%s (%s)[%lld]: got %.9g, want %.9g: %.2f ulp > %.2f", what,
                     nt_dtype_name(dt), (long long)i, got[i], r, e, bound);
        worst = e > worst ? e : worst;
    }
    if (verbose)
        print_message("# %-28s %-4s max %.3f ulp (bound %.2f)\n", what, nt_dtype_name(dt), worst,
                      bound);
}

/* |got - ref| <= tol[i] (NaN/Inf must match). */
static void within(const char *what, const double *got, const double *ref, const double *tol,
                   int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isinf(ref[i]) || isnan(got[i]) || isinf(got[i])) {
            if (!same(got[i], ref[i]) && !(isnan(got[i]) && isnan(ref[i])))
                fail_msg("%s[%lld]: got %.9g, want %.9g", what, (long long)i, got[i], ref[i]);
            continue;
        }
        double e = fabs(got[i] - ref[i]);
        if (!(e <= tol[i]))
            fail_msg("%s[%lld]: got %.9g, want %.9g: error %.3g > tolerance %.3g", what,
                     (long long)i, got[i], ref[i], e, tol[i]);
        worst = tol[i] > 0 && e / tol[i] > worst ? e / tol[i] : worst;
    }
    if (verbose)
        print_message("# %-28s max %.3f of the tolerance\n", what, worst);
}

static void expect_shape(nt_tensor *t, int nd, const int64_t *sh)
{
    assert_non_null(t);
    assert_int_equal(nt_ndim(t), nd);
    for (int i = 0; i < nd; i++)
        assert_int_equal(nt_shape(t, i), sh[i]);
}


/* ------------------------------------------------------------------ */
/* Fixtures                                                           */
/* ------------------------------------------------------------------ */

static nt_scope *test_scope;

static int group_setup(void **state)
{
    (void)state;
    verbose = getenv("NT_TEST_VERBOSE") != NULL;
    return nt_init();
}
static int group_teardown(void **state)
{
    (void)state;
    nt_shutdown();
    return 0;
}
static int setup(void **state)
{
    (void)state;
    nt_clear_error();
    rng_state = 0x9e3779b97f4a7c15u;
    test_scope = nt_scope_begin();
    return 0;
}
static int teardown(void **state)
{
    (void)state;
    nt_scope_end(test_scope);
    nt_sync();
    nt_clear_error();
    for (int i = 0; i < scratch_n; i++)
        free(scratch_list[i]);
    scratch_n = 0;
    return 0;
}

/* ================================================================== */
/* Elementwise                                                        */
/* ================================================================== */

enum { UN_NEG, UN_EXP, UN_LOG, UN_SQRT, UN_RSQRT, UN_ABS, UN_RELU, UN_GELU, UN_SIGMOID, UN_TANH,
       UN_SILU, UN_COUNT };
static const char *const un_name[UN_COUNT] = {"neg", "exp", "log", "sqrt", "rsqrt", "abs", "relu",
                                              "gelu", "sigmoid", "tanh", "silu"};
/* The unary ops added since (softplus, mish, ...) have their double-
 * precision references in tests/test_conformance.c, which fails for a
 * public elementwise op with none. */

static nt_tensor *un_apply(int op, nt_tensor *t)
{
    switch (op) {
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
    default: return nt_silu(t);
    }
}

static double un_ref(int op, double x)
{
    switch (op) {
    case UN_NEG: return -x;
    case UN_EXP: return exp(x);
    case UN_LOG: return log(x);
    case UN_SQRT: return sqrt(x);
    case UN_RSQRT: return 1.0 / sqrt(x);
    case UN_ABS: return fabs(x);
    case UN_RELU: return isnan(x) ? x : (x > 0 ? x : 0.0); /* -0 gives +0 */
    case UN_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case UN_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case UN_TANH: return tanh(x);
    default: return x / (1.0 + exp(-x));
    }
}

/* f32 ulp bounds per op against the double reference:
 *   neg, abs, relu, sqrt: 0 (exact; sqrt is correctly rounded)
 *   rsqrt = 1 / sqrtf: two roundings (the first seen through 1/x): 1.5 ulp
 *   exp, log: 1 ulp (core/nmath.h's measured bound)
 *   tanh: 2 ulp (core/nmath.h)
 *   sigmoid = 1 / (1 + exp(-x)): exp's 1 ulp plus two roundings: 3 ulp
 *   silu = x * sigmoid(x): 4 ulp, plus |x| 2^-148 absolute: for x < -88,
 *     exp(-x) overflows and sigmoid(x) flushes to 0 although the true value
 *     is a subnormal
 *   gelu: absolute, see gelu_tol. */
static const double un_f32_ulps[UN_COUNT] = {0, 1, 1, 0, 1.5, 0, 0, -1, 3, 2, -1};

/* gelu = 0.5 x (1 + erf(x / sqrt 2)): erf's 2 ulp, the scaled argument and
 * the 1 + erf rounding are each absolute errors of a few 2^-24 in (1 + erf),
 * scaled by 0.5|x|; 1 + erf cancels for x << 0, so the bound is absolute:
 * |err| <= 2^-22 |x| + 2 ulp(result) of the output dtype.  silu: see above. */
static double gelu_tol(nt_dtype dt, double x, double ref)
{
    return 0x1p-22 * fabs(x) + 2 * ulp_of(dt, ref);
}
static double silu_tol(nt_dtype dt, double x, double ref)
{
    return 0x1p-148 * fabs(x) + (dt == NT_F32 ? 4 : 1) * ulp_of(dt, ref);
}

static const double special_x[] = {0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 10.0, -10.0, 88.0,
                                   -103.0, 1e-3, 1e-40, 100.0, INFINITY, -INFINITY, NAN, 2e-5,
                                   0.3, 7.5, -0.75, 0.625, 0.875, 4.0, -6.0, 1e30};
#define N_SPECIAL ((int64_t)(sizeof special_x / sizeof special_x[0]))

/* Every unary op over the special values and nrand random ones in dtype dt,
 * against the double reference: f32 within un_f32_ulps (bitwise where 0);
 * bf16/f16: the f32 result (within the bounds above) rounded once to the
 * dtype is within 1 ulp of the dtype of the double reference rounded to the
 * dtype (0 for the exact ops). */
static void check_unary(nt_dtype dt, int64_t nrand)
{
    int64_t n = N_SPECIAL + nrand;
    double *x = dv(n);
    memcpy(x, special_x, sizeof special_x);
    memcpy(x + N_SPECIAL, randv(nrand, -12, 12), (size_t)nrand * sizeof(double));
    nt_tensor *t = mk(dt, 1, SH(n), x);
    for (int op = 0; op < UN_COUNT; op++) {
        nt_tensor *y = un_apply(op, t);
        assert_int_equal(nt_dtype_of(y), dt);
        double *got = fetch(y), *ref = dv(n);
        for (int64_t i = 0; i < n; i++)
            ref[i] = un_ref(op, x[i]);
        if (op == UN_GELU || op == UN_SILU) {
            double *tol = dv(n);
            for (int64_t i = 0; i < n; i++)
                tol[i] = op == UN_GELU ? gelu_tol(dt, x[i], ref[i]) : silu_tol(dt, x[i], ref[i]);
            within(un_name[op], got, ref, tol, n);
        } else if (un_f32_ulps[op] == 0) {
            for (int64_t i = 0; i < n; i++)
                ref[i] = rnd(dt, (double)(float)ref[i]); /* correctly rounded: bitwise */
            exact(un_name[op], got, ref, n);
        } else {
            near(un_name[op], dt, got, ref, n, dt == NT_F32 ? un_f32_ulps[op] : 1);
        }
    }
}

static void test_unary_f32_values_and_specials(void **state)
{
    (void)state;
    check_unary(NT_F32, 200);
}

static void test_unary_half_values(void **state)
{
    (void)state;
    for (int k = 1; k < 3; k++)
        check_unary(FLOATS[k], 100);
}

static void test_unary_int_inputs(void **state)
{
    (void)state;
    double xi[] = {-2147483648.0, -5, 0, 7, 2147483647.0};
    nt_tensor *t = mk(NT_I32, 1, SH(5), xi);
    /* neg, abs, relu keep i32 and wrap (-INT32_MIN is INT32_MIN) */
    nt_tensor *ng = nt_neg(t), *ab = nt_abs(t), *re = nt_relu(t);
    assert_int_equal(nt_dtype_of(ng), NT_I32);
    exact("neg i32", fetch(ng), (double[]){-2147483648.0, 5, 0, -7, -2147483647.0}, 5);
    exact("abs i32", fetch(ab), (double[]){-2147483648.0, 5, 0, 7, 2147483647.0}, 5);
    exact("relu i32", fetch(re), (double[]){0, 0, 0, 7, 2147483647.0}, 5);
    /* the others give f32 of the f32-widened input */
    double xs[] = {0, 1, 4, 9, 100};
    nt_tensor *s = mk(NT_I32, 1, SH(5), xs);
    nt_tensor *sq = nt_sqrt(s), *ex = nt_exp(s);
    assert_int_equal(nt_dtype_of(sq), NT_F32);
    exact("sqrt i32", fetch(sq), (double[]){0, 1, 2, 3, 10}, 5);
    double ref[5];
    for (int i = 0; i < 5; i++)
        ref[i] = exp(xs[i]);
    near("exp i32", NT_F32, fetch(ex), ref, 5, 1); /* nmath exp: 1 ulp */
    /* u8: neg wraps modulo 256, abs and relu are the identity */
    double xu[] = {0, 1, 200, 255};
    nt_tensor *u = mk(NT_U8, 1, SH(4), xu);
    nt_tensor *un = nt_neg(u);
    assert_int_equal(nt_dtype_of(un), NT_U8);
    exact("neg u8", fetch(un), (double[]){0, 255, 56, 1}, 4);
    exact("abs u8", fetch(nt_abs(u)), xu, 4);
    exact("relu u8", fetch(nt_relu(u)), xu, 4);
    assert_int_equal(nt_dtype_of(nt_sigmoid(u)), NT_F32);
}

/* ---------------- tensor-scalar ---------------- */

static void test_scalar_ops_float_exact(void **state)
{
    (void)state;
    const double scal[] = {0.1, -3.0, 1e-3, 7.0};
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        int64_t n = 64;
        double *x = randv(n, -50, 50);
        x[0] = -0.0, x[1] = INFINITY, x[2] = NAN;
        nt_tensor *t = mk(dt, 1, SH(n), x);
        for (int si = 0; si < 4; si++) {
            double s = scal[si], s32 = (double)(float)s; /* the scalar is rounded to f32 */
            nt_tensor *ya = nt_add_scalar(t, s), *ym = nt_mul_scalar(t, s),
                      *yd = nt_div_scalar(t, s);
            assert_int_equal(nt_dtype_of(ya), dt);
            double *ra = dv(n), *rm = dv(n), *rd = dv(n);
            for (int64_t i = 0; i < n; i++) {
                /* one f32 operation, then one rounding to dt: exact */
                ra[i] = rnd(dt, (double)(float)(x[i] + s32));
                rm[i] = rnd(dt, (double)(float)(x[i] * s32));
                rd[i] = rnd(dt, (double)(float)(x[i] / s32));
            }
            exact("add_scalar", fetch(ya), ra, n);
            exact("mul_scalar", fetch(ym), rm, n);
            exact("div_scalar", fetch(yd), rd, n);
        }
    }
}

static void test_pow_and_clamp(void **state)
{
    (void)state;
    int64_t n = 50;
    double *x = randv(n, 0.01, 20);
    nt_tensor *t = mk(NT_F32, 1, SH(n), x);
    const double ex[] = {2.0, 0.5, -1.0, 3.0, 1.7};
    for (int e = 0; e < 5; e++) {
        double *ref = dv(n);
        for (int64_t i = 0; i < n; i++)
            ref[i] = pow(x[i], (double)(float)ex[e]); /* the exponent is rounded to f32 */
        near("pow_scalar", NT_F32, fetch(nt_pow_scalar(t, ex[e])), ref, n, 1); /* powf: 1 ulp */
    }
    /* clamp: exact; NaN propagates; -0 inside the range stays -0 */
    double xc[] = {-5, -0.0, 0.25, 3, 9, NAN, -INFINITY, INFINITY};
    for (int k = 0; k < 3; k++) {
        double xk[8];
        memcpy(xk, xc, sizeof xc);
        nt_tensor *c = mk(FLOATS[k], 1, SH(8), xk);
        exact("clamp", fetch(nt_clamp(c, -1, 4)),
              (double[]){-1, -0.0, 0.25, 3, 4, NAN, -1, 4}, 8);
    }
}

/* clamp is min(max(t, lo), hi) as documented, also when lo > hi: every
 * non-NaN value becomes hi.  Same bits on both backends, unfused (eager)
 * and fused into a chain (lazy), out of place and in place. */
static void test_clamp_lo_above_hi(void **state)
{
    (void)state;
    const char *backends[] = {"cpu", "sim"}, *modes[] = {"eager", "lazy"};
    const nt_dtype all[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 2; m++) {
            assert_int_equal(nt_config_set("NT_BACKEND", backends[b]), 0);
            assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
            for (int k = 0; k < 5; k++) {
                bool fl = k < 3;
                double x[] = {0, 3, 7, fl ? -2.5 : 1, fl ? NAN : 200, fl ? -INFINITY : 9};
                nt_tensor *t = mk(all[k], 1, SH(6), x);
                double want[6];
                for (int i = 0; i < 6; i++)
                    want[i] = fl && isnan(x[i]) ? NAN : 1;
                exact("clamp(t, 5, 1)", fetch(nt_clamp(t, 5, 1)), want, 6);
                /* fused: clamp between two elementwise ops */
                double wf[6];
                for (int i = 0; i < 6; i++)
                    wf[i] = want[i] + 1;
                exact("clamp(t, 5, 1) fused", fetch(nt_add_scalar(nt_clamp(nt_mul_scalar(t, 1),
                                                                           5, 1), 1)),
                      wf, 6);
                nt_tensor *d = nt_mul_scalar(t, 1);
                assert_int_equal(nt_clamp_inplace(d, 5, 1), 0);
                exact("clamp_inplace(d, 5, 1)", fetch(d), want, 6);
                /* lo == hi and ordinary bounds keep working */
                double w3[6];
                for (int i = 0; i < 6; i++)
                    w3[i] = fl && isnan(x[i]) ? NAN : 3;
                exact("clamp(t, 3, 3)", fetch(nt_clamp(t, 3, 3)), w3, 6);
            }
        }
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
}

static void test_scalar_ops_int(void **state)
{
    (void)state;
    double x[] = {2147483647.0, -2147483648.0, 5, -7};
    nt_tensor *t = mk(NT_I32, 1, SH(4), x);
    nt_tensor *a = nt_add_scalar(t, 1);
    assert_int_equal(nt_dtype_of(a), NT_I32);
    exact("add_scalar i32 wraps", fetch(a), (double[]){-2147483648.0, -2147483647.0, 6, -6}, 4);
    exact("mul_scalar i32 wraps", fetch(nt_mul_scalar(t, 2)), (double[]){-2, 0, 10, -14}, 4);
    exact("clamp i32", fetch(nt_clamp(t, -6, 6)), (double[]){6, -6, 5, -6}, 4);
    /* a non-integral scalar gives f32; div and pow always do */
    nt_tensor *h = nt_add_scalar(t, 0.5);
    assert_int_equal(nt_dtype_of(h), NT_F32);
    exact("add_scalar i32 + 0.5", fetch(h),
          (double[]){(float)(2147483647.0f + 0.5f), (float)(-2147483648.0f + 0.5f), 5.5, -6.5}, 4);
    nt_tensor *d = nt_div_scalar(t, 2);
    assert_int_equal(nt_dtype_of(d), NT_F32);
    exact("div_scalar i32", fetch(d), (double[]){1073741824.0, -1073741824.0, 2.5, -3.5}, 4);
    assert_int_equal(nt_dtype_of(nt_pow_scalar(t, 2)), NT_F32);
    /* u8 wraps modulo 256 */
    double xu[] = {250, 3, 128};
    nt_tensor *u = mk(NT_U8, 1, SH(3), xu);
    nt_tensor *ua = nt_add_scalar(u, 10);
    assert_int_equal(nt_dtype_of(ua), NT_U8);
    exact("add_scalar u8 wraps", fetch(ua), (double[]){4, 13, 138}, 3);
    exact("mul_scalar u8 wraps", fetch(nt_mul_scalar(u, 2)), (double[]){244, 6, 0}, 3);
    exact("clamp u8", fetch(nt_clamp(u, 5, 200)), (double[]){200, 5, 128}, 3);
}

/* ---------------- binary ---------------- */

static double bin_ref(int op, double a, double b)
{
    switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    default: return a / b;
    }
}

static void test_binary_float_exact_with_broadcast(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *a = randv(12, -10, 10), *b = randv(4, -10, 10);
        b[3] = 0.0; /* division by zero: inf/nan as IEEE says */
        nt_tensor *ta = mk(dt, 2, SH(3, 4), a), *tb = mk(dt, 1, SH(4), b);
        nt_tensor *y[4] = {nt_add(ta, tb), nt_sub(ta, tb), nt_mul(ta, tb), nt_div(ta, tb)};
        for (int op = 0; op < 4; op++) {
            expect_shape(y[op], 2, SH(3, 4));
            assert_int_equal(nt_dtype_of(y[op]), dt);
            double ref[12];
            for (int i = 0; i < 12; i++) /* one f32 op, one rounding to dt: exact */
                ref[i] = rnd(dt, (double)(float)bin_ref(op, a[i], b[i % 4]));
            exact("binary", fetch(y[op]), ref, 12);
        }
        /* b op a: the broadcast operand first */
        double ref[12];
        for (int i = 0; i < 12; i++)
            ref[i] = rnd(dt, (double)(float)(b[i % 4] - a[i]));
        exact("sub broadcast first", fetch(nt_sub(tb, ta)), ref, 12);
    }
}

static void test_binary_broadcast_shapes(void **state)
{
    (void)state;
    double *a = intv(6, -9, 9), *b = intv(4, -9, 9);
    nt_tensor *ta = mk(NT_F32, 3, SH(2, 1, 3), a), *tb = mk(NT_F32, 2, SH(4, 1), b);
    nt_tensor *y = nt_mul(ta, tb);
    expect_shape(y, 3, SH(2, 4, 3));
    double ref[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 3; k++)
                ref[(i * 4 + j) * 3 + k] = a[i * 3 + k] * b[j];
    exact("mul [2,1,3]x[4,1]", fetch(y), ref, 24);
    /* a 0-d operand */
    double s[] = {2.5};
    nt_tensor *ts = mk(NT_F32, 0, NULL, s);
    double *c = intv(5, -9, 9);
    nt_tensor *tc = mk(NT_F32, 1, SH(5), c);
    nt_tensor *z = nt_add(ts, tc);
    expect_shape(z, 1, SH(5));
    double rz[5];
    for (int i = 0; i < 5; i++)
        rz[i] = 2.5 + c[i];
    exact("0-d + [5]", fetch(z), rz, 5);
    nt_tensor *zz = nt_add(ts, ts);
    expect_shape(zz, 0, NULL);
    exact1("0-d + 0-d", fetch(zz)[0], 5.0);
}

static void test_binary_dtype_promotion(void **state)
{
    (void)state;
    double a[] = {1.5, -2.25, 1000};
    double b[] = {0.5, 4, 3};
    nt_tensor *bf = mk(NT_BF16, 1, SH(3), copyv(a, 3)), *hf = mk(NT_F16, 1, SH(3), copyv(b, 3));
    nt_tensor *y = nt_add(bf, hf);
    assert_int_equal(nt_dtype_of(y), NT_F32); /* bf16 with f16 gives f32 */
    exact("bf16+f16", fetch(y), (double[]){2, 1.75, 1003}, 3);
    double ai[] = {7, -7, 2147483647.0};
    nt_tensor *i32 = mk(NT_I32, 1, SH(3), ai);
    nt_tensor *f = mk(NT_F32, 1, SH(3), copyv(b, 3));
    nt_tensor *fi = nt_add(f, i32);
    assert_int_equal(nt_dtype_of(fi), NT_F32);
    exact("f32+i32", fetch(fi), (double[]){7.5, -3, (float)2147483650.0}, 3);
    assert_int_equal(nt_dtype_of(nt_mul(bf, i32)), NT_BF16); /* float beats int */
    double u1[] = {200, 1, 255}, u2[] = {100, 2, 1};
    nt_tensor *ua = mk(NT_U8, 1, SH(3), u1), *ub = mk(NT_U8, 1, SH(3), u2);
    nt_tensor *uu = nt_add(ua, ub);
    assert_int_equal(nt_dtype_of(uu), NT_U8);
    exact("u8+u8 wraps", fetch(uu), (double[]){44, 3, 0}, 3);
    nt_tensor *iu = nt_add(i32, ua);
    assert_int_equal(nt_dtype_of(iu), NT_I32);
    exact("i32+u8", fetch(iu), (double[]){207, -6, -2147483394.0}, 3);
    nt_tensor *dd = nt_div(i32, i32);
    assert_int_equal(nt_dtype_of(dd), NT_F32); /* true division */
    double two[] = {2, 2, 2};
    exact("i32/i32", fetch(nt_div(i32, mk(NT_I32, 1, SH(3), two))),
          (double[]){3.5, -3.5, 1073741824.0}, 3);
}

static void test_int_add_mul_wraparound(void **state)
{
    (void)state;
    double a[] = {2147483647.0, -2147483648.0, 65536, 46341, -1};
    double b[] = {1, -1, 65536, 46341, 2147483647.0};
    nt_tensor *ta = mk(NT_I32, 1, SH(5), a), *tb = mk(NT_I32, 1, SH(5), b);
    exact("i32 add", fetch(nt_add(ta, tb)),
          (double[]){-2147483648.0, 2147483647.0, 131072, 92682, 2147483646.0}, 5);
    exact("i32 sub", fetch(nt_sub(ta, tb)), (double[]){2147483646.0, -2147483647.0, 0, 0,
                                                       -2147483648.0}, 5);
    /* 46341^2 = 2147488281 wraps to -2147479015 */
    exact("i32 mul", fetch(nt_mul(ta, tb)),
          (double[]){2147483647.0, -2147483648.0, 0, -2147479015.0, -2147483647.0}, 5);
    exact("i32 maximum", fetch(nt_maximum(ta, tb)),
          (double[]){2147483647.0, -1, 65536, 46341, 2147483647.0}, 5);
    exact("i32 minimum", fetch(nt_minimum(ta, tb)),
          (double[]){1, -2147483648.0, 65536, 46341, -1}, 5);
}

static void test_maximum_minimum_nan_inf_zero(void **state)
{
    (void)state;
    double a[] = {NAN, 1, -0.0, 0.0, INFINITY, -INFINITY, 3, 2};
    double b[] = {1, NAN, 0.0, -0.0, 1, 5, NAN, 2};
    for (int k = 0; k < 3; k++) {
        nt_tensor *ta = mk(FLOATS[k], 1, SH(8), copyv(a, 8));
        nt_tensor *tb = mk(FLOATS[k], 1, SH(8), copyv(b, 8));
        /* NaN propagates from either side; on ties (incl. -0 vs +0) the
         * first operand wins */
        exact("maximum", fetch(nt_maximum(ta, tb)),
              (double[]){NAN, NAN, -0.0, 0.0, INFINITY, 5, NAN, 2}, 8);
        exact("minimum", fetch(nt_minimum(ta, tb)),
              (double[]){NAN, NAN, -0.0, 0.0, 1, -INFINITY, NAN, 2}, 8);
        /* relu: NaN stays NaN, -0 becomes +0 */
        exact("relu specials", fetch(nt_relu(ta)),
              (double[]){NAN, 1, 0.0, 0.0, INFINITY, 0.0, 3, 2}, 8);
    }
}

static void test_compare_ops(void **state)
{
    (void)state;
    double a[] = {1, 2, NAN, -0.0, 3, INFINITY};
    double b[] = {2, 2, NAN, 0.0, 1, INFINITY};
    nt_tensor *ta = mk(NT_F32, 1, SH(6), a), *tb = mk(NT_BF16, 1, SH(6), b);
    nt_tensor *r[6] = {nt_eq(ta, tb), nt_ne(ta, tb), nt_lt(ta, tb),
                       nt_le(ta, tb), nt_gt(ta, tb), nt_ge(ta, tb)};
    /* NaN compares false except ne; -0 == +0 */
    const double want[6][6] = {{0, 1, 0, 1, 0, 1}, {1, 0, 1, 0, 1, 0}, {1, 0, 0, 0, 0, 0},
                               {1, 1, 0, 1, 0, 1}, {0, 0, 0, 0, 1, 0}, {0, 1, 0, 1, 1, 1}};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(nt_dtype_of(r[i]), NT_U8);
        exact("compare", fetch(r[i]), want[i], 6);
    }
    /* ints, broadcast: i32 [2,1] against u8 [3]; exact beyond 2^24 */
    double ia[] = {16777217, -1}, ub[] = {0, 1, 255};
    nt_tensor *ti = mk(NT_I32, 2, SH(2, 1), ia), *tu = mk(NT_U8, 1, SH(3), ub);
    nt_tensor *g = nt_gt(ti, tu);
    expect_shape(g, 2, SH(2, 3));
    exact("gt i32/u8", fetch(g), (double[]){1, 1, 1, 0, 0, 0}, 6);
    double big1[] = {16777217}, big2[] = {16777216};
    exact1("ne i32 above 2^24", fetch(nt_ne(mk(NT_I32, 1, SH(1), big1),
                                            mk(NT_I32, 1, SH(1), big2)))[0], 1);
}

static void test_where_values(void **state)
{
    (void)state;
    double c[] = {1, 0, 7};
    nt_tensor *cu = mk(NT_U8, 1, SH(3), c);
    double *a = intv(6, -50, 50);
    double s[] = {-1.5};
    nt_tensor *ta = mk(NT_F32, 2, SH(2, 3), a), *ts = mk(NT_F32, 0, NULL, s);
    nt_tensor *y = nt_where(cu, ta, ts);
    expect_shape(y, 2, SH(2, 3));
    double ref[6];
    for (int i = 0; i < 6; i++)
        ref[i] = c[i % 3] ? a[i] : -1.5;
    exact("where", fetch(y), ref, 6);
    /* a float cond: nonzero is true, NaN too, -0 is false */
    double cf[] = {NAN, -0.0, 0.5};
    double a2[] = {1, 2, 3}, b2[] = {10, 20, 30};
    nt_tensor *w2 = nt_where(mk(NT_F32, 1, SH(3), cf), mk(NT_F32, 1, SH(3), a2),
                             mk(NT_F32, 1, SH(3), b2));
    exact("where float cond", fetch(w2), (double[]){1, 20, 3}, 3);
    /* i32 values stay exact (no trip through f32); i32 with bf16 gives bf16 */
    double ib[] = {16777217, -16777219, 5};
    nt_tensor *ti = mk(NT_I32, 1, SH(3), ib);
    nt_tensor *wi = nt_where(cu, ti, ti);
    assert_int_equal(nt_dtype_of(wi), NT_I32);
    exact("where i32", fetch(wi), ib, 3);
    double hb[] = {0.5, 0.25, 0.125};
    nt_tensor *wb = nt_where(cu, ti, mk(NT_BF16, 1, SH(3), hb));
    assert_int_equal(nt_dtype_of(wb), NT_BF16);
    exact("where i32/bf16", fetch(wb), (double[]){q_bf16(16777217), 0.25, 5}, 3);
}

/* ---------------- casts ---------------- */

static void test_cast_float_rounding(void **state)
{
    (void)state;
    int64_t n = 300;
    double *x = randv(n, -70000, 70000);
    double sp[] = {1.0 + 0x1p-8, 1.0 + 0x1p-11, 65520, -65504, 0x1p-25, 1e-40, -0.0, NAN,
                   INFINITY, 3.0e38};
    memcpy(x, sp, sizeof sp);
    for (int i = 10; i < 60; i++)
        x[i] = ldexp(x[i], -(int)(i - 10)); /* small magnitudes down to subnormals */
    nt_tensor *t = mk(NT_F32, 1, SH(n), x);
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        nt_tensor *c = nt_cast(t, dt);
        assert_int_equal(nt_dtype_of(c), dt);
        double *ref = dv(n);
        for (int64_t i = 0; i < n; i++)
            ref[i] = rnd(dt, x[i]); /* one round-to-nearest-even */
        exact("cast f32->dt", fetch(c), ref, n);
        /* and between the half types: exact widening, one rounding */
        for (int k2 = 1; k2 < 3; k2++) {
            nt_dtype d2 = FLOATS[k2];
            double *r2 = dv(n);
            for (int64_t i = 0; i < n; i++)
                r2[i] = rnd(d2, ref[i]);
            exact("cast dt->half", fetch(nt_cast(c, d2)), r2, n);
        }
    }
}

static void test_cast_float_to_int_saturates(void **state)
{
    (void)state;
    double x[] = {3.9, -3.9, NAN, INFINITY, -INFINITY, 3e9, -3e9, 255.5, 256, -1, -0.5};
    for (int k = 0; k < 3; k++) {
        nt_tensor *t = mk(FLOATS[k], 1, SH(11), copyv(x, 11));
        double xv[11];
        memcpy(xv, x, sizeof x);
        for (int i = 0; i < 11; i++)
            xv[i] = rnd(FLOATS[k], x[i]);
        double ri[11], ru[11];
        for (int i = 0; i < 11; i++)
            ri[i] = rnd(NT_I32, xv[i]), ru[i] = rnd(NT_U8, xv[i]);
        nt_tensor *ci = nt_cast(t, NT_I32), *cu = nt_cast(t, NT_U8);
        assert_int_equal(nt_dtype_of(ci), NT_I32);
        exact("cast ->i32", fetch(ci), ri, 11);
        exact("cast ->u8", fetch(cu), ru, 11);
    }
    /* spelled out for f32 */
    nt_tensor *t = mk(NT_F32, 1, SH(11), copyv(x, 11));
    exact("f32->i32", fetch(nt_cast(t, NT_I32)),
          (double[]){3, -3, 0, 2147483647.0, -2147483648.0, 2147483647.0, -2147483648.0, 255,
                     256, -1, 0}, 11);
    exact("f32->u8", fetch(nt_cast(t, NT_U8)),
          (double[]){3, 0, 0, 255, 0, 255, 0, 255, 255, 0, 0}, 11);
}

static void test_cast_int_conversions(void **state)
{
    (void)state;
    double x[] = {300, -1, 256, 16777217, -2147483648.0};
    nt_tensor *t = mk(NT_I32, 1, SH(5), x);
    exact("i32->u8 wraps", fetch(nt_cast(t, NT_U8)), (double[]){44, 255, 0, 1, 0}, 5);
    exact("i32->f32 rounds once", fetch(nt_cast(t, NT_F32)),
          (double[]){300, -1, 256, 16777216, -2147483648.0}, 5);
    double rb[5], rh[5];
    for (int i = 0; i < 5; i++)
        rb[i] = q_bf16(x[i]), rh[i] = (double)(_Float16)x[i];
    exact("i32->bf16", fetch(nt_cast(t, NT_BF16)), rb, 5);
    exact("i32->f16", fetch(nt_cast(t, NT_F16)), rh, 5);
    double u[] = {0, 128, 255};
    exact("u8->i32", fetch(nt_cast(mk(NT_U8, 1, SH(3), u), NT_I32)), u, 3);
    exact("u8->bf16", fetch(nt_cast(mk(NT_U8, 1, SH(3), copyv(u, 3)), NT_BF16)), u, 3);
}

static void test_cast_same_dtype_shares_storage(void **state)
{
    (void)state;
    double x[] = {1, 2, 3, 4};
    nt_tensor *t = mk(NT_F32, 1, SH(4), x);
    nt_tensor *c = nt_cast(t, NT_F32);
    assert_non_null(c);
    assert_int_equal(nt_fill_inplace(t, 9), 0);
    exact("alias sees the write", fetch(c), (double[]){9, 9, 9, 9}, 4);
    /* a different dtype is a copy: later writes do not reach it */
    nt_tensor *d = nt_cast(t, NT_BF16);
    assert_int_equal(nt_fill_inplace(t, 1), 0);
    exact("copy keeps its value", fetch(d), (double[]){9, 9, 9, 9}, 4);
}

/* ---------------- fills, arange ---------------- */

static void test_fills_each_dtype(void **state)
{
    (void)state;
    const nt_dtype all[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    for (int k = 0; k < 5; k++) {
        nt_dtype dt = all[k];
        nt_tensor *z = nt_zeros(dt, 2, SH(2, 3)), *o = nt_ones(dt, 2, SH(2, 3));
        nt_tensor *f = nt_full(dt, 1, SH(4), 1.0 / 3.0);
        expect_shape(z, 2, SH(2, 3));
        assert_int_equal(nt_dtype_of(z), dt);
        double z6[6] = {0}, o6[6] = {1, 1, 1, 1, 1, 1};
        exact("zeros", fetch(z), z6, 6);
        exact("ones", fetch(o), o6, 6);
        double r = rnd(dt, 1.0 / 3.0); /* one rounding from the double */
        exact("full 1/3", fetch(f), (double[]){r, r, r, r}, 4);
        nt_tensor *fl = nt_full_like(o, -7.75);
        expect_shape(fl, 2, SH(2, 3));
        assert_int_equal(nt_dtype_of(fl), dt);
        double m = rnd(dt, -7.75);
        exact("full_like", fetch(fl), (double[]){m, m, m, m, m, m}, 6);
        exact("zeros_like", fetch(nt_zeros_like(o)), z6, 6);
        exact("ones_like", fetch(nt_ones_like(z)), o6, 6);
    }
    exact1("full i32 3.7", fetch(nt_full(NT_I32, 1, SH(1), 3.7))[0], 3);
    exact1("full i32 -3.7", fetch(nt_full(NT_I32, 1, SH(1), -3.7))[0], -3);
    exact1("full u8 300 saturates", fetch(nt_full(NT_U8, 1, SH(1), 300))[0], 255);
    exact1("full u8 -5", fetch(nt_full(NT_U8, 1, SH(1), -5))[0], 0);
    exact1("full f16 1e6", fetch(nt_full(NT_F16, 1, SH(1), 1e6))[0], INFINITY);
    exact1("full 0-d", fetch(nt_full(NT_F32, 0, NULL, 2.5))[0], 2.5);
    exact1("full -0", fetch(nt_full(NT_BF16, 1, SH(1), -0.0))[0], -0.0);
    nt_tensor *e = nt_zeros(NT_F32, 2, SH(3, 0));
    assert_int_equal(nt_numel(e), 0);
}

static void test_arange_values(void **state)
{
    (void)state;
    nt_tensor *a = nt_arange(NT_F32, 0, 5, 1);
    expect_shape(a, 1, SH(5));
    exact("arange 0..5", fetch(a), (double[]){0, 1, 2, 3, 4}, 5);
    nt_tensor *b = nt_arange(NT_F32, 0, 1, 0.1);
    expect_shape(b, 1, SH(10));
    double rb[10];
    for (int i = 0; i < 10; i++)
        rb[i] = (double)(float)(0 + i * 0.1); /* start + i*step in double, one rounding */
    exact("arange 0.1", fetch(b), rb, 10);
    exact("arange i32 down", fetch(nt_arange(NT_I32, 5, 0, -2)), (double[]){5, 3, 1}, 3);
    nt_tensor *c = nt_arange(NT_BF16, 250, 262, 1);
    double rc[12];
    for (int i = 0; i < 12; i++)
        rc[i] = q_bf16(250 + i);
    exact("arange bf16 rounds", fetch(c), rc, 12);
    exact("arange f16", fetch(nt_arange(NT_F16, -1, 1, 0.5)), (double[]){-1, -0.5, 0, 0.5}, 4);
    assert_int_equal(nt_numel(nt_arange(NT_F32, 3, 3, 1)), 0);
    assert_null(nt_arange(NT_F32, 0, 5, 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_arange", "test_ops.c:");
    assert_null(nt_arange(NT_F32, 0, 5, -1));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_arange", "test_ops.c:");
}

/* ---------------- rand, randn ---------------- */

/* The documented generator (core/rng.h, docs/ops.md), re-implemented here
 * from its description: element i of seed s uses h(s, i) = fmix(key(s) +
 * (i + 1) * golden), key(s) = fmix(s ^ "ntensor!"), fmix = splitmix64's
 * output function. */
static uint64_t doc_fmix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}
static uint64_t doc_h(uint64_t s, uint64_t i)
{
    uint64_t key = doc_fmix(s ^ 0x6e74656e736f7221u);
    return doc_fmix(key + (i + 1) * 0x9e3779b97f4a7c15u);
}

static void test_rand_matches_documented_generator(void **state)
{
    (void)state;
    const int pbits[3] = {24, 8, 11};
    for (int k = 0; k < 3; k++) {
        nt_tensor *t = nt_rand(FLOATS[k], 2, SH(7, 9), 42);
        double *v = fetch(t), ref[63];
        for (int i = 0; i < 63; i++)
            ref[i] = ldexp((double)(doc_h(42, (uint64_t)i) >> (64 - pbits[k])), -pbits[k]);
        exact("rand = documented bits", v, ref, 63); /* exact: no rounding at all */
    }
    nt_tensor *n = nt_randn(NT_F32, 1, SH(50), 7);
    double *v = fetch(n), ref[50];
    for (int i = 0; i < 50; i++) {
        double u1 = (double)((doc_h(7, 2 * (uint64_t)i) >> 11) + 1) * 0x1p-53;
        double u2 = (double)(doc_h(7, 2 * (uint64_t)i + 1) >> 11) * 0x1p-53;
        ref[i] = (double)(float)(sqrt(-2.0 * log(u1)) * cos(2 * M_PI * u2));
    }
    /* the same double formula, rounded once to f32: bitwise */
    exact("randn = Box-Muller of the documented bits", v, ref, 50);
}

static void test_rand_range_grid_and_moments(void **state)
{
    (void)state;
    const int pbits[3] = {24, 8, 11};
    int64_t n = 100000;
    for (int k = 0; k < 3; k++) {
        double *v = fetch(nt_rand(FLOATS[k], 1, SH(n), 1234 + (uint64_t)k));
        double s = 0, s2 = 0;
        int64_t hist[16] = {0};
        for (int64_t i = 0; i < n; i++) {
            assert_true(v[i] >= 0 && v[i] < 1);
            double g = ldexp(v[i], pbits[k]);
            assert_true(g == floor(g)); /* a multiple of 2^-p */
            s += v[i];
            s2 += v[i] * v[i];
            hist[(int)(v[i] * 16)]++;
        }
        double q = ldexp(1, -pbits[k]);
        double mean = s / n, var = s2 / n - mean * mean;
        /* the grid's exact moments: mean (1 - q)/2, variance (1 - q^2)/12;
         * 5 sigma of the sample statistics (sigma_mean = 0.29/sqrt n,
         * sigma_var = sqrt((1/80 - 1/144)/n)) */
        assert_true(fabs(mean - (1 - q) / 2) < 5 * 0.2887 / sqrt((double)n));
        assert_true(fabs(var - (1 - q * q) / 12) < 5 * sqrt((1.0 / 80 - 1.0 / 144) / n));
        double chi2 = 0, e = n / 16.0;
        for (int b = 0; b < 16; b++)
            chi2 += (hist[b] - e) * (hist[b] - e) / e;
        assert_true(chi2 < 50); /* 15 dof: P(chi2 > 50) ~ 1e-5 */
    }
}

static void test_rand_determinism_per_seed_and_shape(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *a = fetch(nt_rand(dt, 1, SH(1000), 5));
        double *b = fetch(nt_rand(dt, 2, SH(10, 100), 5)); /* element i depends on (seed, i) */
        double *c = fetch(nt_rand(dt, 1, SH(10), 5));
        double *d = fetch(nt_rand(dt, 1, SH(1000), 6));
        exact("same seed, other shape", a, b, 1000);
        exact("prefix", a, c, 10);
        int eq = 0;
        for (int i = 0; i < 1000; i++)
            eq += a[i] == d[i];
        assert_true(eq < (dt == NT_BF16 ? 30 : 10)); /* bf16 has only 256 values */
        double *na = fetch(nt_randn(dt, 1, SH(300), 9));
        double *nb = fetch(nt_randn(dt, 3, SH(3, 10, 10), 9));
        exact("randn same seed", na, nb, 300);
    }
}

static void test_randn_moments(void **state)
{
    (void)state;
    int64_t n = 200000;
    for (int k = 0; k < 3; k++) {
        double *v = fetch(nt_randn(FLOATS[k], 1, SH(n), 99));
        double s = 0, s2 = 0;
        int64_t in1 = 0, in2 = 0;
        for (int64_t i = 0; i < n; i++) {
            assert_true(isfinite(v[i]));
            s += v[i];
            s2 += v[i] * v[i];
            in1 += fabs(v[i]) < 1;
            in2 += fabs(v[i]) < 2;
        }
        double mean = s / n, var = s2 / n - mean * mean;
        /* 5 sigma of each statistic; bf16 rounding (2^-9 relative) moves
         * the variance by far less than that */
        assert_true(fabs(mean) < 5 / sqrt((double)n));
        assert_true(fabs(var - 1) < 5 * sqrt(2.0 / n));
        assert_true(fabs((double)in1 / n - 0.682689) < 5 * sqrt(0.2166 / n) + 0.002);
        assert_true(fabs((double)in2 / n - 0.954500) < 5 * sqrt(0.0434 / n) + 0.002);
    }
}

static void test_rand_same_in_deterministic_mode(void **state)
{
    (void)state;
    double *a = fetch(nt_rand(NT_F32, 1, SH(500), 77));
    double *an = fetch(nt_randn(NT_BF16, 1, SH(500), 77));
    char mode[32];
    snprintf(mode, sizeof mode, "%s", nt_config_get("NT_MODE"));
    assert_int_equal(nt_config_set("NT_DETERMINISTIC", "1"), 0);
    assert_int_equal(nt_get_mode(), NT_MODE_DETERMINISTIC);
    double *b = fetch(nt_rand(NT_F32, 1, SH(500), 77));
    double *bn = fetch(nt_randn(NT_BF16, 1, SH(500), 77));
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    exact("rand: default vs deterministic", a, b, 500);
    exact("randn: default vs deterministic", an, bn, 500);
}

/* ================================================================== */
/* Reductions                                                         */
/* ================================================================== */

enum { R_SUM, R_MEAN, R_MAX, R_ARGMAX, R_MIN, R_ARGMIN, R_ANY, R_COUNT };

/* Reference over dim (or NT_DIM_ALL) of row-major x: max and min propagate
 * NaN; argmax/argmin are the first maximum/minimum, a NaN counting as it;
 * any is 1 if some element is nonzero (NaN is). */
static void ref_reduce(int op, const double *x, int nd, const int64_t *sh, int dim, double *out)
{
    int64_t outer = 1, n = 1, inner = 1;
    if (dim == NT_DIM_ALL) {
        n = numel_of(nd, sh);
    } else if (nd > 0) {
        int d = dim < 0 ? dim + nd : dim;
        if (d < 0 || d >= nd) {
            fail_msg("ref_reduce: dim %d", dim);
            return;
        }
        for (int i = 0; i < d; i++)
            outer *= sh[i];
        n = sh[d];
        for (int i = d + 1; i < nd; i++)
            inner *= sh[i];
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double acc = op == R_MAX ? -INFINITY : op == R_MIN ? INFINITY : 0, best = 0;
            int64_t bi = -1;
            for (int64_t k = 0; k < n; k++) {
                double v = x[(o * n + k) * inner + i];
                if (op == R_MAX)
                    acc = (isnan(v) || isnan(acc)) ? NAN : (v > acc ? v : acc);
                else if (op == R_MIN)
                    acc = (isnan(v) || isnan(acc)) ? NAN : (v < acc ? v : acc);
                else if (op == R_ANY)
                    acc = (acc != 0 || v != 0) ? 1 : 0;
                else if (op == R_ARGMAX || op == R_ARGMIN) {
                    bool better = op == R_ARGMAX ? v > best : v < best;
                    if (bi < 0 || (!isnan(best) && (better || isnan(v))))
                        best = v, bi = k;
                } else
                    acc += v;
            }
            out[o * inner + i] = op == R_MEAN                      ? acc / (double)n
                                 : op == R_ARGMAX || op == R_ARGMIN ? (double)bi
                                                                    : acc;
        }
}

static nt_tensor *red_apply(int op, nt_tensor *t, int dim, bool keep)
{
    switch (op) {
    case R_SUM: return nt_sum(t, dim, keep);
    case R_MEAN: return nt_mean(t, dim, keep);
    case R_MAX: return nt_max(t, dim, keep);
    case R_MIN: return nt_min(t, dim, keep);
    case R_ARGMIN: return nt_argmin(t, dim, keep);
    case R_ANY: return nt_any(t, dim, keep);
    default: return nt_argmax(t, dim, keep);
    }
}

/* Output shape of a reduction of (nd, sh) over dim. */
static int red_shape(int nd, const int64_t *sh, int dim, bool keep, int64_t *out)
{
    int o = 0, d = dim == NT_DIM_ALL ? -1 : (dim < 0 ? dim + nd : dim);
    for (int i = 0; i < nd; i++) {
        if (dim == NT_DIM_ALL || i == d) {
            if (keep)
                out[o++] = 1;
        } else {
            out[o++] = sh[i];
        }
    }
    return o;
}

/* Checks sum/mean/max/argmax of t (values x, shape nd/sh, dtype dt) over
 * every dim and NT_DIM_ALL, keepdim both ways.  Inputs are integer-valued
 * and small, so the f32 sums are exact and every result is exact: sums are
 * rounded once to dt; mean is the f32 division of the exact sum by n
 * (correctly rounded), then rounded once to dt. */
static void check_reductions_exact(const char *what, nt_tensor *t, nt_dtype dt, const double *x,
                                   int nd, const int64_t *sh)
{
    bool isf = dt == NT_F32 || dt == NT_BF16 || dt == NT_F16;
    int dims[NT_MAX_DIMS * 2 + 1], nd2 = 0;
    for (int d = 0; d < nd; d++)
        dims[nd2++] = d;
    dims[nd2++] = -1;
    dims[nd2++] = -nd;
    dims[nd2++] = NT_DIM_ALL;
    for (int di = 0; di < nd2; di++)
        for (int keep = 0; keep < 2; keep++)
            for (int op = 0; op < R_COUNT; op++) {
                if (op == R_MEAN && !isf)
                    continue;
                int dim = dims[di];
                nt_tensor *y = red_apply(op, t, dim, keep);
                if (!y)
                    fail_msg("%s: op %d dim %d: %s", what, op, dim, nt_last_error_message());
                int64_t osh[NT_MAX_DIMS];
                int ond = red_shape(nd, sh, dim, keep, osh);
                expect_shape(y, ond, osh);
                nt_dtype want_dt = op == R_ARGMAX || op == R_ARGMIN ? NT_I32
                                   : op == R_ANY                  ? NT_U8
                                   : (op == R_SUM && !isf) ? NT_I32
                                                           : dt;
                assert_int_equal(nt_dtype_of(y), want_dt);
                int64_t m = numel_of(ond, osh);
                double *ref = dv(m);
                ref_reduce(op, x, nd, sh, dim, ref);
                for (int64_t i = 0; i < m; i++) {
                    if (op == R_MEAN)
                        ref[i] = rnd(dt, (double)(float)ref[i]);
                    else if (op == R_SUM)
                        ref[i] = rnd(want_dt, ref[i]);
                }
                char name[96];
                snprintf(name, sizeof name, "%s %s op%d dim%d keep%d", what, nt_dtype_name(dt),
                         op, dim, keep);
                exact(name, fetch(y), ref, m);
            }
}

static void test_reductions_each_dim_and_dtype_exact(void **state)
{
    (void)state;
    const nt_dtype all[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    for (int k = 0; k < 5; k++) {
        nt_dtype dt = all[k];
        double *x = dt == NT_U8 ? intv(60, 0, 40) : intv(60, -20, 20);
        nt_tensor *t = mk(dt, 3, SH(3, 4, 5), x);
        check_reductions_exact("contiguous", t, dt, x, 3, SH(3, 4, 5));
    }
    /* 1-D, and a 0-d tensor: dim 0 / -1 reduce its one element */
    double *x1 = intv(9, -5, 5);
    check_reductions_exact("1-D", mk(NT_F32, 1, SH(9), x1), NT_F32, x1, 1, SH(9));
    double s[] = {-3};
    nt_tensor *t0 = mk(NT_F32, 0, NULL, s);
    for (int op = 0; op < R_COUNT; op++) {
        nt_tensor *y = red_apply(op, t0, 0, false);
        expect_shape(y, 0, NULL);
        exact1("0-d", fetch(y)[0], op == R_ARGMAX || op == R_ARGMIN ? 0 : op == R_ANY ? 1 : -3);
        expect_shape(red_apply(op, t0, NT_DIM_ALL, true), 0, NULL);
    }
}

static void test_reductions_over_views(void **state)
{
    (void)state;
    double *b = intv(120, -30, 30);
    for (int k = 0; k < 2; k++) {
        nt_dtype dt = FLOATS[k];
        nt_tensor *base = mk(dt, 3, SH(4, 6, 5), copyv(b, 120));
        /* permute: v[i][j][k] = base[j][k][i], shape [5, 4, 6] */
        nt_tensor *p = nt_permute(base, (const int[]){2, 0, 1});
        double *pv = dv(120);
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 6; l++)
                    pv[(i * 4 + j) * 6 + l] = b[(j * 6 + l) * 5 + i];
        check_reductions_exact("permute", p, dt, pv, 3, SH(5, 4, 6));
        /* slice with a step: v[i][j][k] = base[i][1 + 2j][k], shape [4, 3, 5] */
        nt_tensor *s = nt_slice(base, 1, 1, 6, 2);
        double *sv = dv(60);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++)
                for (int l = 0; l < 5; l++)
                    sv[(i * 3 + j) * 5 + l] = b[(i * 6 + 1 + 2 * j) * 5 + l];
        check_reductions_exact("slice", s, dt, sv, 3, SH(4, 3, 5));
        /* expand: [1, 5] row stretched to [3, 5] (stride 0) */
        nt_tensor *row = nt_slice(nt_reshape(base, 2, SH(24, 5)), 0, 2, 3, 1);
        nt_tensor *e = nt_expand(row, 2, SH(3, 5));
        double ev[15];
        for (int i = 0; i < 15; i++)
            ev[i] = b[2 * 5 + i % 5];
        check_reductions_exact("expand", e, dt, ev, 2, SH(3, 5));
    }
}

static void test_reductions_tile_and_row_paths_agree(void **state)
{
    (void)state;
    /* Reducing dim 0 of a row-major [n, C] tensor reads columns in tiles;
     * reducing the last dim of its transposed copy reads rows.  Both must
     * consume each sequence in the one canonical order: bitwise equal. */
    const int64_t shapes[3][2] = {{300, 37}, {2100, 5}, {5000, 3}};
    for (int si = 0; si < 3; si++) {
        for (int k = 0; k < 2; k++) {
            int64_t R = shapes[si][0], C = shapes[si][1];
            double *x = randv(R * C, -1, 1);
            nt_tensor *t = mk(FLOATS[k], 2, SH(R, C), x);
            nt_tensor *tt = nt_contiguous(nt_transpose(t, 0, 1));
            for (int op = 0; op < R_COUNT; op++) {
                double *a = fetch(red_apply(op, t, 0, false));
                double *b = fetch(red_apply(op, tt, 1, false));
                exact("dim 0 (tiles) vs last dim (rows)", a, b, C);
            }
            /* the whole tensor through a strided view vs its copy */
            exact1("all: view vs copy", fetch(nt_sum(nt_transpose(tt, 0, 1), NT_DIM_ALL, 0))[0],
                   fetch(nt_sum(t, NT_DIM_ALL, 0))[0]);
        }
    }
}

/* Sums of random reals: a sequence of n elements summed in the canonical
 * order (16 lanes of ceil(n/16) sequential adds, a 4-level fold, one add
 * per 2048-block) is within (n/16 + 8) u sum|x| of the exact sum (the
 * recursive-summation bound for the longest chain); plus 1 ulp of the
 * output dtype for the final rounding. */
static void test_reductions_long_rows_random(void **state)
{
    (void)state;
    const int64_t shapes[3][2] = {{3, 5000}, {5000, 3}, {70, 90}};
    const int dims[3] = {1, 0, NT_DIM_ALL};
    for (int si = 0; si < 3; si++)
        for (int k = 0; k < 3; k++) {
            nt_dtype dt = FLOATS[k];
            int64_t R = shapes[si][0], C = shapes[si][1];
            double *x = randv(R * C, -1, 1);
            nt_tensor *t = mk(dt, 2, SH(R, C), x);
            int dim = dims[si];
            int64_t n = dim == NT_DIM_ALL ? R * C : shapes[si][dim];
            int64_t m = dim == NT_DIM_ALL ? 1 : (dim == 0 ? C : R);
            double *ref = dv(m), *refm = dv(m), *tol = dv(m), *tolm = dv(m), *abssum = dv(m);
            double *ax = dv(R * C);
            for (int64_t i = 0; i < R * C; i++)
                ax[i] = fabs(x[i]);
            ref_reduce(R_SUM, x, 2, SH(R, C), dim, ref);
            ref_reduce(R_MEAN, x, 2, SH(R, C), dim, refm);
            ref_reduce(R_SUM, ax, 2, SH(R, C), dim, abssum);
            for (int64_t i = 0; i < m; i++) {
                tol[i] = (n / 16.0 + 8) * U * abssum[i] + ulp_of(dt, ref[i]);
                tolm[i] = (n / 16.0 + 9) * U * abssum[i] / n + ulp_of(dt, refm[i]);
            }
            within("long sum", fetch(nt_sum(t, dim, 0)), ref, tol, m);
            within("long mean", fetch(nt_mean(t, dim, 0)), refm, tolm, m);
            /* max and argmax are exact whatever the length */
            double *rmax = dv(m), *rarg = dv(m);
            ref_reduce(R_MAX, x, 2, SH(R, C), dim, rmax);
            ref_reduce(R_ARGMAX, x, 2, SH(R, C), dim, rarg);
            exact("long max", fetch(nt_max(t, dim, 0)), rmax, m);
            exact("long argmax", fetch(nt_argmax(t, dim, 0)), rarg, m);
        }
}

static void test_max_argmax_nan_inf_zero(void **state)
{
    (void)state;
    double x[20] = {1, NAN, 3, 2,
                    NAN, NAN, 1, 0,
                    -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                    -0.0, 0.0, -1, -2,
                    3, 7, 7, 1};
    for (int k = 0; k < 3; k++) {
        nt_tensor *t = mk(FLOATS[k], 2, SH(5, 4), copyv(x, 20));
        /* over rows: NaN wins (argmax: the first NaN), -inf rows give -inf
         * and index 0, ties give the first index */
        double *mx = fetch(nt_max(t, 1, false)), *am = fetch(nt_argmax(t, 1, false));
        exact("max rows", mx, (double[]){NAN, NAN, -INFINITY, mx[3], 7}, 5);
        assert_true(mx[3] == 0);
        exact("argmax rows", am, (double[]){1, 0, 0, 0, 1}, 5);
        /* over columns (the tile path) */
        exact("max cols", fetch(nt_max(t, 0, false)), (double[]){NAN, NAN, 7, 2}, 4);
        exact("argmax cols", fetch(nt_argmax(t, 0, false)), (double[]){1, 0, 4, 0}, 4);
        exact1("max all", fetch(nt_max(t, NT_DIM_ALL, false))[0], NAN);
        exact1("argmax all", fetch(nt_argmax(t, NT_DIM_ALL, false))[0], 1);
        /* Inf sums and NaN sums */
        exact("sum rows", fetch(nt_sum(t, 1, false)), (double[]){NAN, NAN, -INFINITY, -3, 18}, 5);
    }
}

static void test_int_reductions_wrap_and_u8(void **state)
{
    (void)state;
    double x[] = {2147483647.0, 1, -5, 3};
    nt_tensor *t = mk(NT_I32, 2, SH(2, 2), x);
    nt_tensor *s = nt_sum(t, 1, false);
    assert_int_equal(nt_dtype_of(s), NT_I32);
    exact("i32 sum wraps", fetch(s), (double[]){-2147483648.0, -2}, 2);
    exact1("i32 sum all", fetch(nt_sum(t, NT_DIM_ALL, false))[0], 2147483646.0); /* wraps twice */
    exact("i32 max", fetch(nt_max(t, 0, false)), (double[]){2147483647.0, 3}, 2);
    double u[] = {200, 100, 7, 255};
    nt_tensor *tu = mk(NT_U8, 1, SH(4), u);
    nt_tensor *su = nt_sum(tu, 0, false), *mu = nt_max(tu, 0, false);
    assert_int_equal(nt_dtype_of(su), NT_I32); /* ints sum in i32 */
    assert_int_equal(nt_dtype_of(mu), NT_U8);
    exact1("u8 sum", fetch(su)[0], 562);
    exact1("u8 max", fetch(mu)[0], 255);
    exact1("u8 argmax", fetch(nt_argmax(tu, 0, false))[0], 3);
    assert_null(nt_mean(tu, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_mean", "'t'", "test_ops.c:");
}

static void test_reductions_empty_dims(void **state)
{
    (void)state;
    nt_tensor *e = nt_zeros(NT_F32, 2, SH(3, 0));
    nt_tensor *s1 = nt_sum(e, 1, false);
    expect_shape(s1, 1, SH(3));
    exact("sum of nothing", fetch(s1), (double[]){0, 0, 0}, 3);
    exact("mean of nothing", fetch(nt_mean(e, 1, true)), (double[]){NAN, NAN, NAN}, 3);
    expect_shape(nt_sum(e, 0, false), 1, SH(0));
    exact1("sum all of nothing", fetch(nt_sum(e, NT_DIM_ALL, false))[0], 0);
    assert_null(nt_max(e, 1, false));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_max", "test_ops.c:");
    assert_null(nt_argmax(e, NT_DIM_ALL, false));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_argmax", "test_ops.c:");
    /* a dim of size 0 elsewhere: an empty result, no error */
    expect_shape(nt_max(e, 0, false), 1, SH(0));
}

static void test_min_argmin_any_nan_inf_zero(void **state)
{
    (void)state;
    double x[20] = {1, NAN, -3, -3,
                    NAN, NAN, 1, 0,
                    INFINITY, INFINITY, INFINITY, INFINITY,
                    0.0, -0.0, 1, 2,
                    -7, 3, -7, 1};
    for (int k = 0; k < 3; k++) {
        nt_tensor *t = mk(FLOATS[k], 2, SH(5, 4), copyv(x, 20));
        /* NaN wins (argmin: the first NaN), +inf rows give +inf and index 0,
         * ties give the first index; min(+0, -0) keeps the first (+0) */
        double *mn = fetch(nt_min(t, 1, false));
        exact("min rows", mn, (double[]){NAN, NAN, INFINITY, 0.0, -7}, 5);
        exact("argmin rows", fetch(nt_argmin(t, 1, false)), (double[]){1, 0, 0, 0, 0}, 5);
        exact("min cols", fetch(nt_min(t, 0, false)), (double[]){NAN, NAN, -7, -3}, 4);
        exact("argmin cols", fetch(nt_argmin(t, 0, false)), (double[]){1, 0, 4, 0}, 4);
        exact1("min all", fetch(nt_min(t, NT_DIM_ALL, false))[0], NAN);
        exact1("argmin all", fetch(nt_argmin(t, NT_DIM_ALL, false))[0], 1);
        nt_tensor *a = nt_any(t, 1, true);
        assert_int_equal(nt_dtype_of(a), NT_U8);
        expect_shape(a, 2, SH(5, 1));
        exact("any rows", fetch(a), (double[]){1, 1, 1, 1, 1}, 5);
        /* -0 is zero; NaN is nonzero */
        nt_tensor *z = mk(FLOATS[k], 2, SH(2, 3), (double[]){0.0, -0.0, 0.0, 0.0, NAN, -0.0});
        exact("any zeros", fetch(nt_any(z, 1, false)), (double[]){0, 1}, 2);
        exact1("any all", fetch(nt_any(z, NT_DIM_ALL, false))[0], 1);
    }
    /* integers: min in the same dtype, i32 extremes, u8 */
    nt_tensor *ti = mk(NT_I32, 2, SH(2, 3), (double[]){2147483647.0, -2147483648.0, 5, 0, 0, 0});
    nt_tensor *mi = nt_min(ti, 1, false);
    assert_int_equal(nt_dtype_of(mi), NT_I32);
    exact("i32 min", fetch(mi), (double[]){-2147483648.0, 0}, 2);
    exact("i32 argmin", fetch(nt_argmin(ti, 1, false)), (double[]){1, 0}, 2);
    exact("i32 any", fetch(nt_any(ti, 1, false)), (double[]){1, 0}, 2);
    nt_tensor *tu = mk(NT_U8, 1, SH(4), (double[]){200, 7, 255, 7});
    assert_int_equal(nt_dtype_of(nt_min(tu, 0, false)), NT_U8);
    exact1("u8 min", fetch(nt_min(tu, 0, false))[0], 7);
    exact1("u8 argmin", fetch(nt_argmin(tu, 0, false))[0], 1);
    /* empty: any of nothing is false; min has no identity */
    nt_tensor *e = nt_zeros(NT_F32, 2, SH(3, 0));
    exact("any of nothing", fetch(nt_any(e, 1, false)), (double[]){0, 0, 0}, 3);
    assert_null(nt_min(e, 1, false));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_min", "test_ops.c:");
    assert_null(nt_argmin(e, NT_DIM_ALL, false));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_argmin", "test_ops.c:");
    expect_shape(nt_min(e, 0, false), 1, SH(0));
}

/* Reference vector norm of n values at stride st, in double. */
static double ref_norm(const double *x, int64_t n, int64_t st, double ord)
{
    double acc = ord == -INFINITY ? INFINITY : 0;
    for (int64_t k = 0; k < n; k++) {
        double a = fabs(x[k * st]);
        if (isnan(a))
            return NAN;
        if (ord == INFINITY)
            acc = a > acc ? a : acc;
        else if (ord == -INFINITY)
            acc = a < acc ? a : acc;
        else if (ord == 0)
            acc += a != 0;
        else
            acc += pow(a, ord);
    }
    return (isinf(ord) || ord == 0 || ord == 1) ? acc : pow(acc, 1.0 / ord);
}

static void test_norm_values(void **state)
{
    (void)state;
    const double ords[] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5, -1.5};
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        /* small integers: every sum is exact in f32, so ord 1, 0, +-inf are
         * exact and ord 2 is sqrtf of the exact sum, rounded to dt */
        double *xi = intv(60, -9, 9);
        nt_tensor *ti = mk(dt, 2, SH(6, 10), xi);
        for (int o = 0; o < 5; o++) {
            nt_tensor *y = nt_norm(ti, ords[o], 1, false);
            assert_int_equal(nt_dtype_of(y), dt);
            expect_shape(y, 1, SH(6));
            double ref[6];
            for (int r = 0; r < 6; r++) {
                double v = ref_norm(xi + r * 10, 10, 1, ords[o]);
                ref[r] = rnd(dt, o == 0 ? (double)sqrtf((float)(v * v)) : v);
            }
            exact("norm of integers", fetch(y), ref, 6);
            double col[10];
            for (int c = 0; c < 10; c++) {
                double v = ref_norm(xi + c, 6, 10, ords[o]);
                col[c] = rnd(dt, o == 0 ? (double)sqrtf((float)(v * v)) : v);
            }
            exact("norm over dim 0", fetch(nt_norm(ti, ords[o], 0, true)), col, 10);
        }
        /* random reals: within the summation bound, the root's and pow's
         * error, and 1 ulp of dt; max, min and count are exact */
        double *x = randv(3 * 3000, -2, 2);
        nt_tensor *t = mk(dt, 2, SH(3, 3000), x);
        for (int o = 0; o < 8; o++) {
            double ref[3], tol[3];
            for (int r = 0; r < 3; r++) {
                ref[r] = ref_norm(x + r * 3000, 3000, 1, ords[o]);
                double p = fabs(ords[o]);
                /* relative error of the sum, scaled by 1/p through the
                 * root, plus a few u for the pow of each element and the
                 * root */
                double rs = (3000 / 16.0 + 8) * U + 4 * U;
                tol[r] = (rs / p + 4 * U) * fabs(ref[r]) + ulp_of(dt, ref[r]);
                /* max, min, count: exact in f32, rounded to dt; and a norm
                 * past dt's range (ord 0.5 in f16) is +Inf */
                if (isinf(ords[o]) || ords[o] == 0 || isinf(rnd(dt, ref[r])))
                    tol[r] = 0, ref[r] = rnd(dt, ref[r]);
            }
            within("norm of reals", fetch(nt_norm(t, ords[o], -1, false)), ref, tol, 3);
        }
        exact1("2-norm all", fetch(nt_norm(ti, 2, NT_DIM_ALL, false))[0],
               rnd(dt, (double)sqrtf((float)pow(ref_norm(xi, 60, 1, 2), 2))));
        /* NaN propagates; Inf gives Inf; zeros give 0, and for ord -1.5
         * (|0|^-1.5 = Inf, Inf^(1/-1.5) = 0) */
        nt_tensor *sp = mk(dt, 2, SH(3, 2), (double[]){NAN, 1, INFINITY, 1, 0, -0.0});
        exact("norm NaN Inf 0", fetch(nt_norm(sp, 2, 1, false)), (double[]){NAN, INFINITY, 0}, 3);
        exact("norm -1.5", fetch(nt_norm(sp, -1.5, 1, false)), (double[]){NAN, 1, 0}, 3);
        /* an empty dim: 0 for the sums */
        nt_tensor *e = nt_zeros(dt, 2, SH(2, 0));
        exact("norm of nothing", fetch(nt_norm(e, 2, 1, false)), (double[]){0, 0}, 2);
    }
    double iv[2] = {3, 4};
    nt_tensor *ti = mk(NT_I32, 1, SH(2), iv);
    assert_null(nt_norm(ti, 2, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_norm", "'t'", "test_ops.c:");
}

static void test_gather_index_select_values(void **state)
{
    (void)state;
    const nt_dtype all[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    for (int k = 0; k < 5; k++) {
        nt_dtype dt = all[k];
        double *x = dt == NT_U8 ? intv(60, 0, 255) : intv(60, -100, 100);
        if (k < 3)
            x[7] = NAN, x[8] = -0.0;
        nt_tensor *t = mk(dt, 3, SH(3, 4, 5), x);
        for (int dim = 0; dim < 3; dim++) {
            /* gather: index [2, 3, 4] (each dim no larger than t's) */
            int64_t ish[3] = {2, 3, 4}, tsh[3] = {3, 4, 5};
            double *iv = dv(24);
            for (int i = 0; i < 24; i++)
                iv[i] = (double)(rng_next() % (uint64_t)tsh[dim]);
            nt_tensor *ix = mk(k % 2 ? NT_U8 : NT_I32, 3, ish, iv);
            nt_tensor *g = nt_gather(t, dim - 3, ix);
            assert_int_equal(nt_dtype_of(g), dt);
            expect_shape(g, 3, ish);
            double ref[24];
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++)
                    for (int c = 0; c < 4; c++) {
                        int64_t q[3] = {a, b, c};
                        q[dim] = (int64_t)iv[(a * 3 + b) * 4 + c];
                        ref[(a * 3 + b) * 4 + c] = x[(q[0] * 4 + q[1]) * 5 + q[2]];
                    }
            exact("gather", fetch(g), ref, 24);
            /* index_select: 7 entries, repeats included */
            double sv[7];
            for (int i = 0; i < 7; i++)
                sv[i] = (double)(rng_next() % (uint64_t)tsh[dim]);
            nt_tensor *si = mk(NT_I32, 1, SH(7), sv);
            nt_tensor *s = nt_index_select(t, dim, si);
            int64_t osh[3] = {3, 4, 5};
            osh[dim] = 7;
            expect_shape(s, 3, osh);
            double *sref = dv(numel_of(3, osh));
            for (int a = 0; a < osh[0]; a++)
                for (int b = 0; b < osh[1]; b++)
                    for (int c = 0; c < osh[2]; c++) {
                        int64_t q[3] = {a, b, c};
                        q[dim] = (int64_t)sv[q[dim]];
                        sref[(a * osh[1] + b) * osh[2] + c] = x[(q[0] * 4 + q[1]) * 5 + q[2]];
                    }
            exact("index_select", fetch(s), sref, numel_of(3, osh));
        }
        /* through views: a transposed t and a transposed index */
        nt_tensor *tt = nt_transpose(nt_reshape(t, 2, SH(12, 5)), 0, 1); /* [5, 12] */
        double ivs[10] = {11, 0, 3, 3, 7, 1, 2, 10, 11, 0};
        nt_tensor *ix = mk(NT_I32, 2, SH(2, 5), copyv(ivs, 10));
        nt_tensor *g = nt_gather(tt, 1, nt_transpose(ix, 0, 1)); /* index [5, 2] */
        double ref[10];
        for (int r = 0; r < 5; r++)
            for (int c = 0; c < 2; c++)
                ref[r * 2 + c] = x[(int)ivs[c * 5 + r] * 5 + r];
        exact("gather of views", fetch(g), ref, 10);
        /* a 0-d index selects one slice */
        double two = 2;
        nt_tensor *s0 = nt_index_select(t, 1, mk(NT_I32, 0, NULL, &two));
        expect_shape(s0, 3, SH(3, 1, 5));
        exact1("index_select 0-d", fetch(s0)[5], x[(1 * 4 + 2) * 5 + 0]);
    }
    /* a bit-for-bit copy: a NaN payload survives */
    uint32_t nb = 0x7fa12345u;
    nt_tensor *tn = nt_from_host(&nb, NT_F32, 1, SH(1));
    double zero = 0;
    uint32_t got = 0;
    assert_int_equal(nt_to_host(nt_gather(tn, 0, mk(NT_I32, 1, SH(1), &zero)), &got, 4), 0);
    assert_int_equal(got, nb);
}

static void test_repeat_and_split_values(void **state)
{
    (void)state;
    const nt_dtype all[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    for (int k = 0; k < 5; k++) {
        nt_dtype dt = all[k];
        double *x = dt == NT_U8 ? intv(6, 0, 255) : intv(6, -50, 50);
        nt_tensor *t = mk(dt, 2, SH(2, 3), x);
        /* [2, 3] repeated (2, 1, 3) -> [2, 2, 9]: y[a][b][c] = x[b][c % 3] */
        nt_tensor *r = nt_repeat(t, SH(2, 1, 3), 3);
        expect_shape(r, 3, SH(2, 2, 9));
        assert_int_equal(nt_dtype_of(r), dt);
        double ref[36];
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                for (int c = 0; c < 9; c++)
                    ref[(a * 2 + b) * 9 + c] = x[b * 3 + c % 3];
        exact("repeat", fetch(r), ref, 36);
        /* of a transposed view: [3, 2] repeated (2, 2) */
        nt_tensor *rt = nt_repeat(nt_transpose(t, 0, 1), SH(2, 2), 2);
        expect_shape(rt, 2, SH(6, 4));
        double reft[24];
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++)
                reft[i * 4 + j] = x[(j % 2) * 3 + i % 3];
        exact("repeat of a view", fetch(rt), reft, 24);
        /* all ones: a new tensor with the same values; a zero: empty */
        nt_tensor *r1 = nt_repeat(t, SH(1, 1), 2);
        exact("repeat ones", fetch(r1), x, 6);
        expect_shape(nt_repeat(t, SH(2, 0), 2), 2, SH(4, 0));
        /* split: 3 of dim 1 in 2s -> [2, 2] and [2, 1], views of t */
        nt_tensor *p[4];
        assert_int_equal(nt_split(t, 2, -1, NULL, 0), 2);
        assert_int_equal(nt_split(t, 2, -1, p, 4), 2);
        expect_shape(p[0], 2, SH(2, 2));
        expect_shape(p[1], 2, SH(2, 1));
        exact("split 0", fetch(p[0]), (double[]){x[0], x[1], x[3], x[4]}, 4);
        exact("split 1", fetch(p[1]), (double[]){x[2], x[5]}, 2);
        if (k == 0) { /* views: a write through one is seen by t */
            assert_int_equal(nt_fill_inplace(p[1], 42), 0);
            exact1("split is a view", fetch(t)[5], 42);
        }
        /* split_size larger than the dim: one view of all of it */
        assert_int_equal(nt_split(t, 5, 0, p, 1), 1);
        expect_shape(p[0], 2, SH(2, 3));
    }
    /* an empty dim gives one empty view, as torch.split does */
    nt_tensor *e = nt_zeros(NT_F32, 2, SH(0, 3)), *p[2];
    assert_int_equal(nt_split(e, 2, 0, p, 2), 1);
    expect_shape(p[0], 2, SH(0, 3));
}

/* ================================================================== */
/* Softmax family                                                     */
/* ================================================================== */

/* Double references over dim of row-major x, plus per-element tolerances
 * from the error analysis of the f32 contract:
 *   softmax: d = x - m rounds (relative |d| u in exp), exp 1 ulp, the sum
 *     of n positives (n/16 + 6) u, the division 0.5 ulp:
 *     tol = (4 + |d| + n/16 + 6) ulp_f32(y)
 *   log_softmax: y = d - log(s): absolute |d| u + 2|log s| u (log's ulp) +
 *     (n/16 + 6) u (the sum, through log) + |y| u (the subtraction):
 *     tol = 2 u (|d| + 2|log s| + n/16 + 6 + |y|)
 * and for bf16/f16 outputs the f32 tolerance plus 1 ulp of the dtype. */
static void ref_softmax(bool logsm, const double *x, int nd, const int64_t *sh, int dim,
                        nt_dtype dt, double *y, double *tol)
{
    int d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd) {
        fail_msg("ref_softmax: dim %d", dim);
        return;
    }
    int64_t outer = 1, n = sh[d], inner = 1;
    for (int i = 0; i < d; i++)
        outer *= sh[i];
    for (int i = d + 1; i < nd; i++)
        inner *= sh[i];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double m = -INFINITY, s = 0;
            for (int64_t k = 0; k < n; k++)
                m = fmax(m, x[(o * n + k) * inner + i]);
            for (int64_t k = 0; k < n; k++)
                s += exp(x[(o * n + k) * inner + i] - m);
            for (int64_t k = 0; k < n; k++) {
                int64_t j = (o * n + k) * inner + i;
                double dd = x[j] - m;
                if (logsm) {
                    y[j] = dd - log(s);
                    tol[j] = 2 * U * (fabs(dd) + 2 * fabs(log(s)) + n / 16.0 + 6 + fabs(y[j]));
                } else {
                    y[j] = exp(dd) / s;
                    tol[j] = (4 + fabs(dd) + n / 16.0 + 6) * ulp_of(NT_F32, y[j]);
                }
                if (dt != NT_F32)
                    tol[j] += ulp_of(dt, y[j]);
            }
        }
}

static void test_softmax_and_log_softmax_each_dim(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *x = randv(60, -3, 3);
        nt_tensor *t = mk(dt, 3, SH(3, 4, 5), x);
        const int dims[] = {0, 1, 2, -1};
        for (int di = 0; di < 4; di++)
            for (int lg = 0; lg < 2; lg++) {
                nt_tensor *y = lg ? nt_log_softmax(t, dims[di]) : nt_softmax(t, dims[di]);
                expect_shape(y, 3, SH(3, 4, 5));
                assert_int_equal(nt_dtype_of(y), dt);
                double ref[60], tol[60];
                ref_softmax(lg, x, 3, SH(3, 4, 5), dims[di], dt, ref, tol);
                within(lg ? "log_softmax" : "softmax", fetch(y), ref, tol, 60);
            }
    }
}

static void test_softmax_long_rows_and_views(void **state)
{
    (void)state;
    /* rows longer than a reduction block, over the last dim and over dim 0 */
    double *x = randv(2 * 3000, -4, 4);
    nt_tensor *t = mk(NT_F32, 2, SH(2, 3000), x);
    double *ref = dv(6000), *tol = dv(6000);
    ref_softmax(false, x, 2, SH(2, 3000), 1, NT_F32, ref, tol);
    within("softmax long rows", fetch(nt_softmax(t, 1)), ref, tol, 6000);
    /* dim 0 of the transposed view: same values transposed, bitwise equal
     * to the softmax over the last dim of the contiguous original */
    nt_tensor *tt = nt_transpose(t, 0, 1);
    double *a = fetch(nt_softmax(tt, 0));
    double *b = fetch(nt_softmax(t, 1));
    double *bt = dv(6000);
    for (int i = 0; i < 3000; i++)
        for (int j = 0; j < 2; j++)
            bt[i * 2 + j] = b[j * 3000 + i];
    exact("softmax of a view (tiles) vs rows", a, bt, 6000);
    double *la = fetch(nt_log_softmax(nt_contiguous(tt), 0));
    double *lb = fetch(nt_log_softmax(t, 1));
    for (int i = 0; i < 3000; i++)
        for (int j = 0; j < 2; j++)
            bt[i * 2 + j] = lb[j * 3000 + i];
    exact("log_softmax dim 0 (tiles) vs rows", la, bt, 6000);
}

static void test_softmax_masked_large_and_degenerate(void **state)
{
    (void)state;
    const double x[] = {0, -INFINITY, 1, -INFINITY,
                        1000, 1001, 999, 1000,
                        -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        double *xr = copyv(x, 12); /* rounded to the dtype by mk */
        nt_tensor *t = mk(FLOATS[k], 2, SH(3, 4), xr);
        double *y = fetch(nt_softmax(t, 1)), *ly = fetch(nt_log_softmax(t, 1));
        /* masked entries give exactly 0 (log: -inf); no overflow at 1000;
         * a fully masked row is NaN (-inf - -inf), as in PyTorch */
        assert_true(y[1] == 0 && y[3] == 0);
        assert_true(ly[1] == -INFINITY && ly[3] == -INFINITY);
        for (int i = 8; i < 12; i++)
            assert_true(isnan(y[i]) && isnan(ly[i]));
        double ref[12], tol[12];
        ref_softmax(false, xr, 2, SH(3, 4), 1, FLOATS[k], ref, tol);
        within("softmax masked/large", y, ref, tol, 12);
        ref_softmax(true, xr, 2, SH(3, 4), 1, FLOATS[k], ref, tol);
        within("log_softmax masked/large", ly, ref, tol, 12);
    }
}

/* ================================================================== */
/* Norms                                                              */
/* ================================================================== */

/* layer_norm reference and tolerance.  Error analysis of the f32 contract
 * (u = 2^-24): the mean's sum errs by (D/16 + 6) u sum|x|, so every d_i by
 * about that over D plus |d_i| u; var = sum(d^2)/D by (D/16 + 8) u
 * relative, so r = rsqrt(var + eps) by (D/32 + 6) u; then three roundings
 * (d * r, * w, + b).  With K = D/16 + 16:
 *   tol_i = K u (r (|d_i| + mean|x|) |w_i| + |b_i| + |y_i|)
 * and for bf16/f16 outputs plus 1 ulp of the dtype. */
static void ref_layer_norm(const double *x, int64_t rows, int64_t D, const double *w,
                           const double *b, double eps, nt_dtype dt, double *y, double *tol)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * D;
        double mean = 0, var = 0, ma = 0;
        for (int64_t i = 0; i < D; i++)
            mean += xr[i], ma += fabs(xr[i]);
        mean /= D, ma /= D;
        for (int64_t i = 0; i < D; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        var /= D;
        double rs = 1 / sqrt(var + eps), K = D / 16.0 + 16;
        for (int64_t i = 0; i < D; i++) {
            double wi = w ? w[i] : 1, bi = b ? b[i] : 0;
            y[r * D + i] = (xr[i] - mean) * rs * wi + bi;
            tol[r * D + i] = K * U * (rs * (fabs(xr[i] - mean) + ma) * fabs(wi) + fabs(bi) +
                                      fabs(y[r * D + i]));
            if (dt != NT_F32)
                tol[r * D + i] += ulp_of(dt, y[r * D + i]);
        }
    }
}

static void test_layer_norm_with_and_without_affine(void **state)
{
    (void)state;
    const int64_t rows = 6, D = 33;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *x = randv(rows * D, -2, 2), *w = randv(D, -1.5, 1.5), *b = randv(D, -1, 1);
        for (int i = 0; i < D; i++)
            x[i] = x[i] * 0.01 + 5; /* a row with a large mean and small spread */
        nt_tensor *tx = mk(dt, 2, SH(rows, D), x);
        nt_tensor *tw = mk(dt, 1, SH(D), w), *tb = mk(NT_F32, 1, SH(D), b); /* mixed dtypes */
        for (int v = 0; v < 4; v++) {
            nt_tensor *wv = (v & 1) ? tw : NULL, *bv = (v & 2) ? tb : NULL;
            nt_tensor *y = nt_layer_norm(tx, wv, bv, 1e-5);
            expect_shape(y, 2, SH(rows, D));
            assert_int_equal(nt_dtype_of(y), dt);
            double *ref = dv(rows * D), *tol = dv(rows * D);
            ref_layer_norm(x, rows, D, wv ? w : NULL, bv ? b : NULL, (double)(float)1e-5, dt, ref,
                           tol);
            within("layer_norm", fetch(y), ref, tol, rows * D);
        }
    }
}

/* rms_norm: no cancellation, so a relative bound: ms = sum(x^2)/D errs by
 * (D/16 + 8) u relative, r by half of that plus 2 u, y = x * r * w by two
 * more roundings: (D/16 + 8) ulp in f32; bf16/f16: 1 ulp of the dtype. */
static void test_rms_norm_with_and_without_weight(void **state)
{
    (void)state;
    const int64_t rows = 5, D = 40;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *x = randv(rows * D, -3, 3), *w = randv(D, -2, 2);
        nt_tensor *tx = mk(dt, 2, SH(rows, D), x), *tw = mk(dt, 1, SH(D), w);
        for (int v = 0; v < 2; v++) {
            nt_tensor *y = nt_rms_norm(tx, v ? tw : NULL, 1e-6);
            expect_shape(y, 2, SH(rows, D));
            double *ref = dv(rows * D);
            for (int64_t r = 0; r < rows; r++) {
                double ms = 0;
                for (int64_t i = 0; i < D; i++)
                    ms += x[r * D + i] * x[r * D + i];
                double rs = 1 / sqrt(ms / D + (double)(float)1e-6);
                for (int64_t i = 0; i < D; i++)
                    ref[r * D + i] = x[r * D + i] * rs * (v ? w[i] : 1);
            }
            near("rms_norm", dt, fetch(y), ref, rows * D, dt == NT_F32 ? D / 16.0 + 8 : 1);
        }
    }
}

static void test_norms_on_views_and_3d(void **state)
{
    (void)state;
    /* x [2, 3, 16] given as a permuted view of a [16, 2, 3] tensor: the
     * norm runs over the (strided) last dim; bitwise equal to the norm of
     * the contiguous copy, and close to the reference */
    double *b = randv(96, -2, 2);
    nt_tensor *base = mk(NT_F32, 3, SH(16, 2, 3), b);
    nt_tensor *x = nt_permute(base, (const int[]){1, 2, 0});
    nt_tensor *xc = nt_contiguous(x);
    double *w = randv(16, 0.5, 1.5);
    nt_tensor *tw = mk(NT_F32, 1, SH(16), w);
    exact("layer_norm view vs copy", fetch(nt_layer_norm(x, tw, NULL, 1e-5)),
          fetch(nt_layer_norm(xc, tw, NULL, 1e-5)), 96);
    exact("rms_norm view vs copy", fetch(nt_rms_norm(x, tw, 1e-5)),
          fetch(nt_rms_norm(xc, tw, 1e-5)), 96);
    double *xv = fetch(xc), *ref = dv(96), *tol = dv(96);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int l = 0; l < 16; l++)
                assert_true(xv[(i * 3 + j) * 16 + l] == b[(l * 2 + i) * 3 + j]);
    ref_layer_norm(xv, 6, 16, w, NULL, (double)(float)1e-5, NT_F32, ref, tol);
    within("layer_norm 3-d view", fetch(nt_layer_norm(x, tw, NULL, 1e-5)), ref, tol, 96);
}

/* ================================================================== */
/* Losses                                                             */
/* ================================================================== */

/* cross_entropy reference: mean_i (log sum_j exp(x_ij) - x_i,label_i).
 * Per row the f32 contract errs like log_softmax at the label:
 * 2 u (|d| + 2|ls| + C/16 + 6 + nll); the mean of N such non-negative
 * terms adds (N/16 + 8) u relative: tol = mean_i(row tol) + (N/16 + 8) u
 * loss, plus 1 ulp of a bf16/f16 output. */
static double ref_xent(const double *x, const int *lab, int64_t N, int64_t C, nt_dtype dt,
                       double *tol)
{
    double loss = 0, rt = 0;
    for (int64_t i = 0; i < N; i++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++)
            m = fmax(m, x[i * C + j]);
        for (int64_t j = 0; j < C; j++)
            s += exp(x[i * C + j] - m);
        double d = x[i * C + lab[i]] - m, nll = log(s) - d;
        loss += nll;
        rt += 2 * U * (fabs(d) + 2 * fabs(log(s)) + C / 16.0 + 6 + nll);
    }
    loss /= N;
    *tol = rt / N + (N / 16.0 + 8) * U * loss + (dt == NT_F32 ? 0 : ulp_of(dt, loss));
    return loss;
}

static void test_cross_entropy_values(void **state)
{
    (void)state;
    const int64_t N = 6, C = 10;
    int lab[6] = {0, 9, 3, 3, 7, 1};
    double labd[6];
    for (int i = 0; i < 6; i++)
        labd[i] = lab[i];
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *x = randv(N * C, -5, 5);
        nt_tensor *tx = mk(dt, 2, SH(N, C), x);
        double tol;
        double ref = ref_xent(x, lab, N, C, dt, &tol);
        for (int lt = 0; lt < 2; lt++) { /* i32 and u8 labels */
            nt_tensor *tl = mk(lt ? NT_U8 : NT_I32, 1, SH(N), copyv(labd, 6));
            nt_tensor *l = nt_cross_entropy(tx, tl);
            expect_shape(l, 0, NULL);
            assert_int_equal(nt_dtype_of(l), dt);
            double got;
            assert_int_equal(nt_item(l, &got), 0);
            within("cross_entropy", &got, &ref, &tol, 1);
        }
    }
}

static void test_cross_entropy_strided_logits(void **state)
{
    (void)state;
    /* logits [N, C] as the transpose of a [C, N] tensor, and labels as a
     * strided slice: bitwise equal to the contiguous computation */
    double *x = randv(8 * 300, -3, 3);
    nt_tensor *base = mk(NT_F32, 2, SH(8, 300), x);
    nt_tensor *lg = nt_transpose(base, 0, 1); /* [300, 8] */
    double *labs = intv(600, 0, 7);
    nt_tensor *lfull = mk(NT_I32, 1, SH(600), labs);
    nt_tensor *lab = nt_slice(lfull, 0, 0, 600, 2);
    double a, b;
    assert_int_equal(nt_item(nt_cross_entropy(lg, lab), &a), 0);
    assert_int_equal(nt_item(nt_cross_entropy(nt_contiguous(lg), nt_contiguous(lab)), &b), 0);
    exact1("cross_entropy view vs copy", a, b);
    double *xc = dv(2400);
    int li[300];
    for (int i = 0; i < 300; i++) {
        li[i] = (int)labs[2 * i];
        for (int j = 0; j < 8; j++)
            xc[i * 8 + j] = x[j * 300 + i];
    }
    double tol, ref = ref_xent(xc, li, 300, 8, NT_F32, &tol);
    within("cross_entropy strided", &a, &ref, &tol, 1);
}

/* mse_loss: each (a - b)^2 errs by 3 u relative, the sum of n
 * non-negative terms by (n/16 + 6) u, the division by one rounding:
 * (n/16 + 10) ulp in f32; plus 1 ulp of a bf16/f16 output. */
static void test_mse_loss_values(void **state)
{
    (void)state;
    const int64_t R = 7, C = 300, n = R * C;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *a = randv(n, -2, 2), *b = randv(n, -2, 2);
        nt_tensor *ta = mk(dt, 2, SH(R, C), a), *tb = mk(NT_F32, 2, SH(R, C), b);
        nt_tensor *l = nt_mse_loss(ta, tb);
        expect_shape(l, 0, NULL);
        assert_int_equal(nt_dtype_of(l), NT_F32); /* promoted */
        double ref = 0;
        for (int64_t i = 0; i < n; i++)
            ref += (a[i] - b[i]) * (a[i] - b[i]);
        ref /= n;
        double got = fetch(l)[0];
        near("mse_loss", NT_F32, &got, &ref, 1, n / 16.0 + 10);
        nt_tensor *l2 = nt_mse_loss(ta, ta);
        exact1("mse of equal tensors", fetch(l2)[0], 0);
        assert_int_equal(nt_dtype_of(l2), dt);
    }
    /* integer-valued: every square and the sum are exact; the mean is one
     * f32 division */
    double *a = intv(50, -9, 9), *b = intv(50, -9, 9);
    double s = 0;
    for (int i = 0; i < 50; i++)
        s += (a[i] - b[i]) * (a[i] - b[i]);
    nt_tensor *ta = mk(NT_BF16, 2, SH(5, 10), a), *tb = mk(NT_BF16, 2, SH(5, 10), b);
    exact1("mse exact", fetch(nt_mse_loss(nt_transpose(ta, 0, 1), nt_transpose(tb, 0, 1)))[0],
           q_bf16((double)(float)(s / 50)));
    /* an empty tensor: 0 / 0 */
    nt_tensor *e = nt_zeros(NT_F32, 1, SH(0));
    exact1("mse of nothing", fetch(nt_mse_loss(e, e))[0], NAN);
}

/* ================================================================== */
/* Matmul, linear                                                     */
/* ================================================================== */

/* PyTorch's matmul in double: 1-D a is a row [1, K] and 1-D b a column
 * [K, 1], the added dim dropped from the result; batch dims broadcast.
 * Also returns sum_k |a_ik||b_kj| per output (for error bounds). */
static int ref_matmul(const double *a, int na, const int64_t *sa, const double *b, int nb,
                      const int64_t *sb, double *out, double *absout, int64_t *osh)
{
    int64_t M = na == 1 ? 1 : sa[na - 2], K = sa[na - 1], N = nb == 1 ? 1 : sb[nb - 1];
    int ba = na >= 2 ? na - 2 : 0, bb = nb >= 2 ? nb - 2 : 0;
    int nbt = ba > bb ? ba : bb;
    int64_t bsh[8];
    for (int i = 0; i < nbt; i++) {
        int ia = i - (nbt - ba), ib = i - (nbt - bb);
        int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
        bsh[i] = da == 1 ? db : da;
    }
    int o = 0;
    for (int i = 0; i < nbt; i++)
        osh[o++] = bsh[i];
    if (na > 1)
        osh[o++] = M;
    if (nb > 1)
        osh[o++] = N;
    int64_t nbatch = numel_of(nbt, bsh);
    for (int64_t bi = 0; bi < nbatch; bi++) {
        /* batch index -> offsets in a and b (size-1 dims broadcast) */
        int64_t rem = bi, aoff = 0, boff = 0, astr = M * K, bstr = K * N;
        for (int i = nbt - 1; i >= 0; i--) {
            int64_t idx = rem % bsh[i];
            rem /= bsh[i];
            int ia = i - (nbt - ba), ib = i - (nbt - bb);
            if (ia >= 0) {
                aoff += (sa[ia] == 1 ? 0 : idx) * astr;
                astr *= sa[ia];
            }
            if (ib >= 0) {
                boff += (sb[ib] == 1 ? 0 : idx) * bstr;
                bstr *= sb[ib];
            }
        }
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0, sa_ = 0;
                for (int64_t k = 0; k < K; k++) {
                    double p = a[aoff + i * K + k] * b[boff + k * N + j];
                    s += p;
                    sa_ += fabs(p);
                }
                out[(bi * M + i) * N + j] = s;
                if (absout)
                    absout[(bi * M + i) * N + j] = sa_;
            }
    }
    return o;
}

typedef struct {
    int na;
    int64_t sa[4];
    int nb;
    int64_t sb[4];
} mm_case;

static const mm_case mm_cases[] = {
    {1, {7}, 1, {7}},
    {1, {7}, 2, {7, 3}},
    {2, {4, 7}, 1, {7}},
    {2, {4, 7}, 2, {7, 3}},
    {4, {2, 3, 4, 5}, 2, {5, 6}},
    {4, {2, 1, 4, 5}, 3, {3, 5, 6}},
    {1, {5}, 3, {2, 5, 3}},
    {3, {2, 4, 5}, 1, {5}},
    {2, {1, 1}, 2, {1, 1}},
    {2, {7, 129}, 2, {129, 5}},
    {2, {130, 257}, 2, {257, 513}},
};

/* Integer-valued inputs in [-2, 2]: every product and partial sum is an
 * integer below 2^11, exact in f32 whatever the order, so the result is
 * the exact product rounded once to the dtype: bitwise. */
static void test_matmul_shapes_and_sizes_exact(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof mm_cases / sizeof mm_cases[0]; c++) {
        const mm_case *mc = &mm_cases[c];
        int64_t na = numel_of(mc->na, mc->sa), nb = numel_of(mc->nb, mc->sb);
        for (int k = 0; k < 3; k++) {
            nt_dtype dt = FLOATS[k];
            if (na > 10000 && dt == NT_F16)
                continue; /* the big case once per 16-bit format is enough */
            double *a = intv(na, -2, 2), *b = intv(nb, -2, 2);
            nt_tensor *ta = mk(dt, mc->na, mc->sa, a), *tb = mk(dt, mc->nb, mc->sb, b);
            nt_tensor *y = nt_matmul(ta, tb);
            if (!y)
                fail_msg("case %zu: %s", c, nt_last_error_message());
            int64_t osh[8];
            double *ref = dv(200000);
            int ond = ref_matmul(a, mc->na, mc->sa, b, mc->nb, mc->sb, ref, NULL, osh);
            expect_shape(y, ond, osh);
            assert_int_equal(nt_dtype_of(y), dt);
            int64_t m = numel_of(ond, osh);
            for (int64_t i = 0; i < m; i++)
                ref[i] = rnd(dt, ref[i]);
            exact("matmul", fetch(y), ref, m);
        }
    }
}

/* Random reals: each output is a sum of K products accumulated in f32 in
 * K-tiles; any order of K additions errs by at most (K + 2) u sum|a b|
 * (products round too); plus 1 ulp of a bf16/f16 output. */
static void test_matmul_random_within_bound(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        const int64_t M = 130, K = 257, N = 75;
        double *a = randv(M * K, -1, 1), *b = randv(K * N, -1, 1);
        nt_tensor *y = nt_matmul(mk(dt, 2, SH(M, K), a), mk(dt, 2, SH(K, N), b));
        double *ref = dv(M * N), *abs_ = dv(M * N), *tol = dv(M * N);
        int64_t osh[8];
        ref_matmul(a, 2, SH(M, K), b, 2, SH(K, N), ref, abs_, osh);
        for (int64_t i = 0; i < M * N; i++)
            tol[i] = (K + 2) * U * abs_[i] + (dt == NT_F32 ? 0 : ulp_of(dt, ref[i]));
        within("matmul random", fetch(y), ref, tol, M * N);
    }
}

static void test_matmul_strided_inputs(void **state)
{
    (void)state;
    /* a = base_a^T (column-major), b = every other column of a wider
     * tensor, transposed twice; exact values and bitwise equal to the
     * product of the contiguous copies */
    const int64_t M = 9, K = 140, N = 11;
    double *ab = intv(K * M, -3, 3), *bb = intv(K * 2 * N, -3, 3);
    for (int k = 0; k < 2; k++) {
        nt_dtype dt = FLOATS[k];
        nt_tensor *ta = nt_transpose(mk(dt, 2, SH(K, M), ab), 0, 1);   /* [M, K] */
        nt_tensor *tb = nt_slice(mk(dt, 2, SH(K, 2 * N), bb), 1, 1, 2 * N, 2); /* [K, N] */
        double *a = dv(M * K), *b = dv(K * N);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < K; j++)
                a[i * K + j] = ab[j * M + i];
        for (int64_t i = 0; i < K; i++)
            for (int64_t j = 0; j < N; j++)
                b[i * N + j] = bb[i * 2 * N + 1 + 2 * j];
        double *ref = dv(M * N);
        int64_t osh[8];
        ref_matmul(a, 2, SH(M, K), b, 2, SH(K, N), ref, NULL, osh);
        for (int64_t i = 0; i < M * N; i++)
            ref[i] = rnd(dt, ref[i]);
        double *got = fetch(nt_matmul(ta, tb));
        exact("matmul of views", got, ref, M * N);
        exact("views vs copies", got, fetch(nt_matmul(nt_contiguous(ta), nt_contiguous(tb))),
              M * N);
        /* a broadcast (expanded) batch operand */
        nt_tensor *be = nt_expand(tb, 3, SH(3, K, N));
        nt_tensor *yb = nt_matmul(ta, be);
        expect_shape(yb, 3, SH(3, M, N));
        double *gb = fetch(yb);
        for (int r = 0; r < 3; r++)
            exact("expanded batch", gb + r * M * N, ref, M * N);
    }
}

static void test_matmul_empty_dims(void **state)
{
    (void)state;
    nt_tensor *a = nt_zeros(NT_F32, 2, SH(3, 0)), *b = nt_zeros(NT_F32, 2, SH(0, 4));
    nt_tensor *y = nt_matmul(a, b);
    expect_shape(y, 2, SH(3, 4));
    double z[12] = {0};
    exact("K = 0 gives zeros", fetch(y), z, 12);
    nt_tensor *e = nt_matmul(nt_zeros(NT_BF16, 3, SH(0, 3, 4)), nt_ones(NT_BF16, 2, SH(4, 5)));
    expect_shape(e, 3, SH(0, 3, 5));
}

/* A K x M "stationary" / K x N "moving" product in 128 x 512 output blocks,
 * K-tiles of 128 ascending, as the simulator's tile program does it. */
/* bf16: both operands bf16, whose products have their own definition
 * (core/gemm.h): the blocks through nt__gemm_bf16, K-tile by K-tile. */
static void blocked_matmul(const float *A, const float *B, int M, int K, int N, float *C,
                           bool bf16)
{
    float *At = malloc(sizeof(float) * 128 * 128), *Bt = malloc(sizeof(float) * 128 * 512);
    float *Cb = malloc(sizeof(float) * 128 * 512);
    for (int m0 = 0; m0 < M; m0 += 128)
        for (int n0 = 0; n0 < N; n0 += 512) {
            int mb = M - m0 < 128 ? M - m0 : 128, nb = N - n0 < 512 ? N - n0 : 512;
            for (int k0 = 0; k0 < K; k0 += NT_GEMM_KTILE) {
                int kb = K - k0 < NT_GEMM_KTILE ? K - k0 : NT_GEMM_KTILE;
                for (int k = 0; k < kb; k++) {
                    for (int i = 0; i < mb; i++)
                        At[k * mb + i] = A[(m0 + i) * K + k0 + k];
                    for (int j = 0; j < nb; j++)
                        Bt[k * nb + j] = B[(k0 + k) * N + n0 + j];
                }
                if (bf16)
                    nt__gemm_bf16(mb, nb, kb, At, mb, false, NT_F32, Bt, nb, false, NT_F32, Cb,
                                  nb, k0 != 0, false, NULL, NT_F32);
                else
                    nt__gemm_ktile(mb, nb, kb, At, mb, Bt, nb, Cb, nb, k0 != 0);
            }
            for (int i = 0; i < mb; i++)
                memcpy(C + (m0 + i) * N + n0, Cb + i * nb, sizeof(float) * nb);
        }
    free(At);
    free(Bt);
    free(Cb);
}

static void test_gemm_ktile_big_call_equals_blocks(void **state)
{
    (void)state;
    /* core/gemm.h: the per-element order does not depend on M, N or the
     * leading dims, so one call over 300 x 1100 equals the same call cut
     * into 128 x 512 blocks, bit for bit (two K-tiles, the second one
     * accumulating). */
    const int M = 300, N = 1100, K1 = 128, K2 = 100;
    float *A = malloc(sizeof(float) * (K1 + K2) * M), *B = malloc(sizeof(float) * (K1 + K2) * N);
    float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
    for (int i = 0; i < (K1 + K2) * M; i++)
        A[i] = (float)(urand() * 2 - 1);
    for (int i = 0; i < (K1 + K2) * N; i++)
        B[i] = (float)(urand() * 2 - 1);
    nt__gemm_ktile(M, N, K1, A, M, B, N, C1, N, false);
    nt__gemm_ktile(M, N, K2, A + K1 * M, M, B + K1 * N, N, C1, N, true);
    for (int m0 = 0; m0 < M; m0 += 128)
        for (int n0 = 0; n0 < N; n0 += 512) {
            int mb = M - m0 < 128 ? M - m0 : 128, nb = N - n0 < 512 ? N - n0 : 512;
            nt__gemm_ktile(mb, nb, K1, A + m0, M, B + n0, N, C2 + m0 * N + n0, N, false);
            nt__gemm_ktile(mb, nb, K2, A + K1 * M + m0, M, B + K1 * N + n0, N,
                           C2 + m0 * N + n0, N, true);
        }
    int bad = 0;
    for (int i = 0; i < M * N; i++)
        bad += memcmp(&C1[i], &C2[i], 4) != 0;
    free(A), free(B), free(C1), free(C2);
    assert_int_equal(bad, 0);
}

static void test_gemm_whole_equals_ktile_calls(void **state)
{
    (void)state;
    /* nt__gemm packs everything once and runs C in cache-sized blocks, each
     * through all its K-tiles: bit for bit what successive nt__gemm_ktile
     * calls give.  Shapes around every blocking edge (micro-kernel 6 x 16,
     * C blocks 96 x 256, K-tiles of 128), leading dims wider than the
     * matrices, special values among the inputs, and K = 0. */
    const int shapes[][3] = {{1, 1, 1},     {5, 15, 127},  {6, 16, 128},   {7, 17, 129},
                             {96, 256, 256}, {97, 257, 300}, {191, 513, 385}, {300, 1100, 228},
                             {13, 1, 1000},  {1, 700, 64},   {40, 40, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = M + 3, ldb = N + 5, ldc = N + 2;
        float *A = malloc(sizeof(float) * ((size_t)K * lda + 1));
        float *B = malloc(sizeof(float) * ((size_t)K * ldb + 1));
        float *C1 = malloc(sizeof(float) * (size_t)M * ldc), *C2 = malloc(sizeof(float) * (size_t)M * ldc);
        for (int i = 0; i < K * lda; i++)
            A[i] = i % 997 == 5 ? INFINITY : (float)(urand() * 2 - 1);
        for (int i = 0; i < K * ldb; i++)
            B[i] = i % 1009 == 7 ? NAN : (float)(urand() * 2 - 1);
        for (int i = 0; i < M * ldc; i++)
            C1[i] = C2[i] = 42.0f; /* the padding columns must survive */
        nt__gemm(M, N, K, A, lda, B, ldb, C1, ldc);
        if (K == 0)
            nt__gemm_ktile(M, N, 0, A, lda, B, ldb, C2, ldc, false);
        for (int k0 = 0; k0 < K; k0 += NT_GEMM_KTILE) {
            int kw = K - k0 < NT_GEMM_KTILE ? K - k0 : NT_GEMM_KTILE;
            nt__gemm_ktile(M, N, kw, A + k0 * lda, lda, B + k0 * ldb, ldb, C2, ldc, k0 > 0);
        }
        int bad = 0;
        for (int i = 0; i < M * ldc; i++)
            bad += memcmp(&C1[i], &C2[i], 4) != 0;
        if (bad)
            print_message("# nt__gemm %dx%dx%d: %d elements differ\n", M, N, K, bad);
        free(A), free(B), free(C1), free(C2);
        assert_int_equal(bad, 0);
    }
}

static void test_matmul_equals_128x512_block_emulation(void **state)
{
    (void)state;
    const int M = 300, K = 300, N = 1100;
    for (int k = 0; k < 2; k++) {
        nt_dtype dt = FLOATS[k];
        double *a = randv((int64_t)M * K, -1, 1), *b = randv((int64_t)K * N, -1, 1);
        nt_tensor *y = nt_matmul(mk(dt, 2, SH(M, K), a), mk(dt, 2, SH(K, N), b));
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
        float *C = malloc(sizeof(float) * M * N);
        for (int i = 0; i < M * K; i++)
            A[i] = (float)a[i]; /* exact: a holds dtype values */
        for (int i = 0; i < K * N; i++)
            B[i] = (float)b[i];
        blocked_matmul(A, B, M, K, N, C, dt == NT_BF16);
        double *got = fetch(y), *want = dv((int64_t)M * N);
        for (int i = 0; i < M * N; i++)
            want[i] = rnd(dt, C[i]);
        free(A), free(B), free(C);
        exact("matmul == 128x512 blocks", got, want, (int64_t)M * N);
    }
}

static void test_linear_with_and_without_bias(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        nt_dtype dt = FLOATS[k];
        double *x = intv(2 * 5 * 7, -3, 3), *w = intv(3 * 7, -3, 3), *b = intv(3, -9, 9);
        nt_tensor *tx = mk(dt, 3, SH(2, 5, 7), x), *tw = mk(dt, 2, SH(3, 7), w);
        nt_tensor *tb = mk(dt, 1, SH(3), b);
        nt_tensor *y0 = nt_linear(tx, tw, NULL), *y1 = nt_linear(tx, tw, tb);
        expect_shape(y0, 3, SH(2, 5, 3));
        expect_shape(y1, 3, SH(2, 5, 3));
        double r0[30], r1[30];
        for (int i = 0; i < 10; i++)
            for (int o = 0; o < 3; o++) {
                double s = 0;
                for (int j = 0; j < 7; j++)
                    s += x[i * 7 + j] * w[o * 7 + j];
                r0[i * 3 + o] = rnd(dt, s); /* exact integers, one rounding */
                r1[i * 3 + o] = rnd(dt, rnd(dt, s) + b[o]);
            }
        exact("linear", fetch(y0), r0, 30);
        exact("linear + bias", fetch(y1), r1, 30);
    }
    /* op for op the same as add(matmul(x, w^T), b): bitwise */
    double *x = randv(4 * 50, -1, 1), *w = randv(6 * 50, -1, 1), *b = randv(6, -1, 1);
    nt_tensor *tx = mk(NT_BF16, 2, SH(4, 50), x), *tw = mk(NT_BF16, 2, SH(6, 50), w);
    nt_tensor *tb = mk(NT_BF16, 1, SH(6), b);
    exact("linear == matmul + add", fetch(nt_linear(tx, tw, tb)),
          fetch(nt_add(nt_matmul(tx, nt_transpose(tw, 0, 1)), tb)), 24);
}

/* ================================================================== */
/* Embedding                                                          */
/* ================================================================== */

static void test_embedding_copies_rows_bitwise(void **state)
{
    (void)state;
    /* f32 weights with a NaN payload and -0: copied bit for bit */
    uint32_t wbits[15];
    for (int i = 0; i < 15; i++) {
        float f = (float)(i * 1.25 - 3);
        memcpy(&wbits[i], &f, 4);
    }
    wbits[4] = 0x7fc01234u;
    wbits[7] = 0x80000000u;
    nt_tensor *w = nt_from_host(wbits, NT_F32, 2, SH(5, 3));
    double idx[] = {4, 0, 2, 2, 1, 4};
    nt_tensor *ti = mk(NT_I32, 2, SH(2, 3), idx);
    nt_tensor *e = nt_embedding(w, ti);
    expect_shape(e, 3, SH(2, 3, 3));
    assert_int_equal(nt_dtype_of(e), NT_F32);
    uint32_t out[18];
    assert_int_equal(nt_to_host(e, out, sizeof out), 0);
    for (int p = 0; p < 6; p++)
        assert_memory_equal(out + p * 3, wbits + (int)idx[p] * 3, 12);
    /* u8 indices, bf16 and i32 weights */
    double iu[] = {1, 0, 1};
    nt_tensor *tu = mk(NT_U8, 1, SH(3), iu);
    double *wb = randv(8, -4, 4);
    nt_tensor *eb = nt_embedding(mk(NT_BF16, 2, SH(2, 4), wb), tu);
    double rb[12];
    for (int p = 0; p < 3; p++)
        for (int j = 0; j < 4; j++)
            rb[p * 4 + j] = wb[(int)iu[p] * 4 + j];
    exact("embedding bf16", fetch(eb), rb, 12);
    double wi[] = {16777217, -1, 5, 2147483647.0};
    nt_tensor *ei = nt_embedding(mk(NT_I32, 2, SH(2, 2), wi), tu);
    assert_int_equal(nt_dtype_of(ei), NT_I32);
    exact("embedding i32", fetch(ei), (double[]){5, 2147483647.0, 16777217, -1, 5, 2147483647.0},
          6);
}

static void test_embedding_strided_weight_and_idx(void **state)
{
    (void)state;
    /* weight [V=4, D=3] as the transpose of [3, 4]; idx as a strided slice */
    double *wt = randv(12, -2, 2);
    nt_tensor *w = nt_transpose(mk(NT_F32, 2, SH(3, 4), wt), 0, 1);
    double idx[] = {3, 9, 0, 9, 2, 9};
    nt_tensor *ti = nt_slice(mk(NT_I32, 1, SH(6), idx), 0, 0, 6, 2); /* {3, 0, 2} */
    nt_tensor *e = nt_embedding(w, ti);
    expect_shape(e, 2, SH(3, 3));
    double ref[9];
    const int pick[3] = {3, 0, 2};
    for (int p = 0; p < 3; p++)
        for (int j = 0; j < 3; j++)
            ref[p * 3 + j] = wt[j * 4 + pick[p]];
    exact("embedding of views", fetch(e), ref, 9);
    /* a 0-d index gives one row [D] */
    double one[] = {1};
    nt_tensor *e0 = nt_embedding(w, mk(NT_I32, 0, NULL, one));
    expect_shape(e0, 1, SH(3));
    exact("embedding 0-d idx", fetch(e0), (double[]){wt[1], wt[5], wt[9]}, 3);
}

/* ================================================================== */
/* Views as inputs, in place through views, cat, contiguous           */
/* ================================================================== */

static void test_reshape_and_infer(void **state)
{
    (void)state;
    nt_tensor *a = nt_arange(NT_F32, 0, 24, 1);
    nt_tensor *r = nt_reshape(a, 3, SH(2, 3, 4));
    expect_shape(r, 3, SH(2, 3, 4));
    assert_true(nt_is_contiguous(r));
    nt_tensor *r2 = nt_reshape(r, 2, SH(4, -1));
    expect_shape(r2, 2, SH(4, 6));
    double seq[24];
    for (int i = 0; i < 24; i++)
        seq[i] = i;
    exact("reshape keeps row-major order", fetch(r2), seq, 24);
    /* a view that cannot be reshaped in place is copied: values in the
     * transposed order */
    nt_tensor *t = nt_transpose(r2, 0, 1); /* [6, 4] */
    nt_tensor *rt = nt_reshape(t, 1, SH(-1));
    expect_shape(rt, 1, SH(24));
    double ref[24];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++)
            ref[i * 4 + j] = j * 6 + i;
    exact("reshape of a transpose", fetch(rt), ref, 24);
    expect_shape(nt_reshape(nt_full(NT_F32, 1, SH(1), 3), 0, NULL), 0, NULL);
    /* writes through a reshape view reach the base */
    assert_int_equal(nt_fill_inplace(nt_reshape(r, 1, SH(24)), 2), 0);
    double twos[24];
    for (int i = 0; i < 24; i++)
        twos[i] = 2;
    exact("write through reshape", fetch(a), twos, 24);
}

/* A reshape that only splits or merges dims within runs of t's dims that
 * are contiguous with one another is a view, even when t itself is not
 * contiguous (the heads of a slice of attention's qkv projection); one
 * that cannot is a copy.  Values against the row-major walk of the source. */
static void test_reshape_strided_views(void **state)
{
    (void)state;
    nt_tensor *base = nt_arange(NT_F32, 0, 72, 1);
    nt_tensor *b3 = nt_reshape(base, 3, SH(2, 3, 12));
    nt_tensor *s = nt_slice(b3, 2, 4, 10, 1); /* [2, 3, 6], strides 36, 12, 1 */
    nt_tensor *tr = nt_transpose(nt_reshape(nt_arange(NT_F32, 0, 24, 1), 2, SH(4, 6)), 0, 1);
    struct {
        nt_tensor *src;
        int nd;
        const int64_t *sh;
        bool view;
    } cases[] = {
        {s, 4, SH(2, 3, 2, 3), true},       /* split the sliced dim */
        {s, 2, SH(6, 6), true},             /* merge the two outer dims */
        {s, 5, SH(1, 2, 3, 1, 6), true},    /* dims of 1 anywhere */
        {s, 3, SH(2, 3, 6), true},          /* the same shape */
        {s, 1, SH(36), false},              /* merges across the slice: copy */
        {s, 2, SH(4, 9), false},
        {tr, 3, SH(3, 2, 4), true},         /* split the strided outer dim of a transpose */
        {tr, 3, SH(6, 2, 2), true},         /* split its inner (stride 6) dim */
        {tr, 1, SH(24), false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        nt_tensor *src = cases[k].src;
        int64_t n = nt_numel(src);
        double *want = fetch(src);
        nt_tensor *r = nt_reshape(src, cases[k].nd, cases[k].sh);
        expect_shape(r, cases[k].nd, cases[k].sh);
        exact("strided reshape keeps row-major order", fetch(r), want, n);
        /* a view: a write through it is seen by the source; a copy: not */
        assert_int_equal(nt_fill_inplace(r, -1), 0);
        double *after = fetch(src);
        for (int64_t i = 0; i < n; i++)
            assert_true(after[i] == (cases[k].view ? -1.0 : want[i]));
        /* the sources back as they were, for the next case */
        assert_int_equal(nt_copy_into(b3, nt_reshape(nt_arange(NT_F32, 0, 72, 1), 3,
                                                     SH(2, 3, 12))), 0);
        assert_int_equal(nt_copy_into(tr, nt_transpose(nt_reshape(nt_arange(NT_F32, 0, 24, 1),
                                                                  2, SH(4, 6)), 0, 1)), 0);
    }
}

static void test_views_as_op_inputs(void **state)
{
    (void)state;
    double *x = intv(12, -9, 9), *c = intv(12, -9, 9);
    nt_tensor *tx = mk(NT_F32, 2, SH(3, 4), x), *tc = mk(NT_F32, 2, SH(4, 3), c);
    /* transpose + contiguous operand */
    nt_tensor *y = nt_add(nt_transpose(tx, 0, 1), tc);
    double ref[12];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            ref[i * 3 + j] = x[j * 4 + i] + c[i * 3 + j];
    exact("transpose + c", fetch(y), ref, 12);
    /* permute of a 3-D tensor, times a broadcast slice */
    double *p = intv(24, -5, 5);
    nt_tensor *tp = mk(NT_F32, 3, SH(2, 3, 4), p);
    nt_tensor *pp = nt_permute(tp, (const int[]){2, 0, -2}); /* [4, 2, 3] */
    nt_tensor *col = nt_slice(tx, 1, 1, 2, 1);                 /* x[:, 1:2] : [3, 1] */
    nt_tensor *z = nt_mul(pp, nt_reshape(col, 1, SH(3)));
    expect_shape(z, 3, SH(4, 2, 3));
    double rz[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++)
                rz[(i * 2 + j) * 3 + k] = p[(j * 3 + k) * 4 + i] * x[k * 4 + 1];
    exact("permute * slice", fetch(z), rz, 24);
    /* slices: steps, negative and out-of-range bounds (Python semantics) */
    nt_tensor *v = nt_arange(NT_F32, 0, 10, 1);
    exact("slice -3:", fetch(nt_slice(v, 0, -3, 100, 1)), (double[]){7, 8, 9}, 3);
    exact("slice 1:-1:3", fetch(nt_slice(v, 0, 1, -1, 3)), (double[]){1, 4, 7}, 3);
    exact("slice -100:2", fetch(nt_slice(v, 0, -100, 2, 1)), (double[]){0, 1}, 2);
    assert_int_equal(nt_numel(nt_slice(v, 0, 6, 2, 1)), 0);
    exact("relu of a stepped slice", fetch(nt_relu(nt_add_scalar(nt_slice(v, 0, 0, 10, 4), -3))),
          (double[]){0, 1, 5}, 3);
    /* expand as an input */
    nt_tensor *e = nt_expand(nt_reshape(nt_slice(v, 0, 0, 3, 1), 2, SH(3, 1)), 3, SH(2, 3, 4));
    expect_shape(e, 3, SH(2, 3, 4));
    double re[24];
    for (int i = 0; i < 24; i++)
        re[i] = (i / 4) % 3;
    exact("expand", fetch(nt_contiguous(e)), re, 24);
    exact1("sum of expand", fetch(nt_sum(e, NT_DIM_ALL, false))[0], 24);
    /* nt_to_host of a non-contiguous view */
    double rs[6] = {x[1], x[3], x[5], x[7], x[9], x[11]};
    exact("to_host of a view", fetch(nt_slice(tx, 1, 1, 4, 2)), rs, 6);
}

static void test_inplace_through_views(void **state)
{
    (void)state;
    nt_tensor *base = nt_zeros(NT_F32, 2, SH(3, 4));
    /* writing a transposed view updates the base */
    assert_int_equal(nt_add_scalar_inplace(nt_transpose(base, 0, 1), 1), 0);
    /* a stepped column slice: columns 0 and 2 */
    assert_int_equal(nt_fill_inplace(nt_slice(base, 1, 0, 4, 2), 7), 0);
    /* one row, from a broadcast source */
    double src[] = {10, 20, 30, 40};
    assert_int_equal(nt_copy_into(nt_slice(base, 0, 2, 3, 1), mk(NT_F32, 1, SH(4), src)), 0);
    /* += a [3, 1] column through a transposed view: [4, 3] += [1, 3] */
    double colv[] = {100, 200, 300};
    assert_int_equal(nt_add_inplace(nt_transpose(base, 0, 1), mk(NT_F32, 2, SH(1, 3), colv)), 0);
    exact("base after writes", fetch(base),
          (double[]){107, 101, 107, 101, 207, 201, 207, 201, 310, 320, 330, 340}, 12);
    /* the other in-place ops, on a slice, with a dtype cast into bf16 */
    double *xv = randv(6, -5, 5);
    nt_tensor *hb = mk(NT_BF16, 2, SH(2, 3), xv);
    nt_tensor *sl = nt_slice(hb, 1, 1, 3, 1); /* [2, 2] */
    double m[] = {1.0 / 3, -2.5};
    assert_int_equal(nt_mul_inplace(sl, mk(NT_F32, 1, SH(2), m)), 0);
    double want[6];
    for (int i = 0; i < 2; i++) {
        want[i * 3] = xv[i * 3];
        for (int j = 1; j < 3; j++) { /* the f32 product, rounded once to bf16 */
            double mj = j == 1 ? (double)(float)(1.0 / 3) : -2.5;
            want[i * 3 + j] = q_bf16((double)(float)(xv[i * 3 + j] * mj));
        }
    }
    exact("mul_inplace into bf16 slice", fetch(hb), want, 6);
    assert_int_equal(nt_neg_inplace(sl), 0);
    assert_int_equal(nt_relu_inplace(sl), 0);
    assert_int_equal(nt_clamp_inplace(sl, 0, 1), 0);
    double *after = fetch(hb);
    for (int i = 0; i < 2; i++) {
        assert_true(same(after[i * 3], xv[i * 3]));
        for (int j = 1; j < 3; j++) {
            double v = -want[i * 3 + j];
            v = v > 0 ? v : 0;
            exact1("neg/relu/clamp inplace", after[i * 3 + j], v < 1 ? v : 1);
        }
    }
    assert_int_equal(nt_sub_inplace(sl, sl), 0);
    assert_int_equal(nt_div_inplace(base, nt_full(NT_F32, 0, NULL, 2)), 0);
    assert_int_equal(nt_mul_scalar_inplace(base, 4), 0);
    exact1("div/mul inplace", fetch(base)[0], 214);
    /* i32 in place wraps */
    double iv[] = {2147483647.0};
    nt_tensor *ti = mk(NT_I32, 1, SH(1), iv);
    assert_int_equal(nt_add_scalar_inplace(ti, 1), 0);
    exact1("i32 inplace wraps", fetch(ti)[0], -2147483648.0);
    /* an expanded view cannot be written */
    assert_int_equal(nt_fill_inplace(nt_expand(ti, 2, SH(3, 1)), 0), NT_EINVAL);
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_fill_inplace", "'dst'", "test_ops.c:");
}

static void test_inplace_source_aliasing_destination(void **state)
{
    (void)state;
    /* base += base^T reads the old values, not half-updated ones */
    double *x = intv(16, -9, 9);
    nt_tensor *b = mk(NT_F32, 2, SH(4, 4), x);
    assert_int_equal(nt_add_inplace(b, nt_transpose(b, 0, 1)), 0);
    double ref[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            ref[i * 4 + j] = x[i * 4 + j] + x[j * 4 + i];
    exact("a += a^T", fetch(b), ref, 16);
    /* copy a shifted window of a tensor onto itself */
    nt_tensor *v = nt_arange(NT_I32, 0, 8, 1);
    assert_int_equal(nt_copy_into(nt_slice(v, 0, 1, 8, 1), nt_slice(v, 0, 0, 7, 1)), 0);
    exact("overlapping copy", fetch(v), (double[]){0, 0, 1, 2, 3, 4, 5, 6}, 8);
}

static void test_cat_each_dim(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        nt_dtype dt = k ? NT_I32 : NT_BF16;
        double *a = intv(24, -50, 50), *b = intv(8, -50, 50);
        nt_tensor *ta = mk(dt, 3, SH(2, 3, 4), a), *tb = mk(dt, 3, SH(2, 1, 4), b);
        nt_tensor *c1 = nt_cat((nt_tensor *[]){ta, tb, ta}, 3, 1);
        expect_shape(c1, 3, SH(2, 7, 4));
        double r1[56];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 7; j++)
                for (int l = 0; l < 4; l++)
                    r1[(i * 7 + j) * 4 + l] = j < 3   ? a[(i * 3 + j) * 4 + l]
                                              : j < 4 ? b[i * 4 + l]
                                                      : a[(i * 3 + j - 4) * 4 + l];
        exact("cat dim 1", fetch(c1), r1, 56);
        nt_tensor *c0 = nt_cat((nt_tensor *[]){ta, ta}, 2, 0);
        expect_shape(c0, 3, SH(4, 3, 4));
        double r0[48];
        memcpy(r0, a, sizeof(double) * 24);
        memcpy(r0 + 24, a, sizeof(double) * 24);
        exact("cat dim 0", fetch(c0), r0, 48);
        /* dim -1 with a transposed (non-contiguous) input */
        nt_tensor *tt = nt_transpose(mk(dt, 3, SH(2, 4, 3), copyv(a, 24)), 1, 2); /* [2, 3, 4] */
        nt_tensor *c2 = nt_cat((nt_tensor *[]){ta, tt}, 2, -1);
        expect_shape(c2, 3, SH(2, 3, 8));
        double r2[48];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                for (int l = 0; l < 8; l++)
                    r2[(i * 3 + j) * 8 + l] = l < 4 ? a[(i * 3 + j) * 4 + l]
                                                    : a[(i * 4 + (l - 4)) * 3 + j];
        exact("cat dim -1 of a view", fetch(c2), r2, 48);
        exact("cat of one", fetch(nt_cat((nt_tensor *[]){tb}, 1, 0)), b, 8);
    }
}

static void test_contiguous_and_copy(void **state)
{
    (void)state;
    double *x = intv(12, -9, 9);
    nt_tensor *t = mk(NT_F16, 2, SH(3, 4), x);
    nt_tensor *tt = nt_transpose(t, 0, 1);
    assert_false(nt_is_contiguous(tt));
    nt_tensor *c = nt_contiguous(tt);
    assert_true(nt_is_contiguous(c));
    assert_int_equal(nt_stride(c, 0), 3);
    double ref[12];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            ref[i * 3 + j] = x[j * 4 + i];
    exact("contiguous", fetch(c), ref, 12);
    /* contiguous of a contiguous tensor shares its storage */
    nt_tensor *same_t = nt_contiguous(t);
    assert_int_equal(nt_fill_inplace(t, 1), 0);
    exact1("shared", fetch(same_t)[5], 1);
    /* the copy did not change */
    exact("copy unchanged", fetch(c), ref, 12);
}

static void test_deterministic_mode_same_values(void **state)
{
    (void)state;
    double *x = randv(8 * 40, -2, 2), *w = randv(40 * 16, -1, 1);
    double results[2][8 * 16 + 8 + 1];
    char mode[32];
    snprintf(mode, sizeof mode, "%s", nt_config_get("NT_MODE"));
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            assert_int_equal(nt_config_set("NT_DETERMINISTIC", "1"), 0);
        nt_tensor *tx = mk(NT_F32, 2, SH(8, 40), copyv(x, 320));
        nt_tensor *tw = mk(NT_BF16, 2, SH(40, 16), copyv(w, 640));
        nt_tensor *h = nt_layer_norm(nt_matmul(tx, nt_cast(tw, NT_F32)), NULL, NULL, 1e-5);
        nt_tensor *s = nt_softmax(nt_gelu(h), 1);
        nt_tensor *r = nt_sum(nt_mul(s, nt_rand(NT_F32, 2, SH(8, 16), 3)), 1, false);
        double *sv = fetch(s), *rv = fetch(r);
        memcpy(results[pass], sv, sizeof(double) * 128);
        memcpy(results[pass] + 128, rv, sizeof(double) * 8);
        results[pass][136] = fetch(nt_mse_loss(s, nt_full(NT_F32, 2, SH(8, 16), 0.0625)))[0];
    }
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    exact("default vs deterministic", results[0], results[1], 137);
}

/* ================================================================== */
/* Errors                                                             */
/* ================================================================== */

static void test_errors_null_arguments(void **state)
{
    (void)state;
    double v[] = {1, 2, 3, 4, 5, 6};
    nt_tensor *a = mk(NT_F32, 2, SH(2, 3), v);
    double l[] = {0, 1};
    nt_tensor *lab = mk(NT_I32, 1, SH(2), l);
    assert_null(nt_add(NULL, a));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_add", "'a'", "test_ops.c:");
    assert_null(nt_add(a, NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_add", "'b'", "test_ops.c:");
    assert_null(nt_relu(NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_relu", "'t'", "test_ops.c:");
    assert_null(nt_mul_scalar(NULL, 2));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mul_scalar", "'t'", "test_ops.c:");
    assert_null(nt_lt(a, NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_lt", "'b'", "test_ops.c:");
    assert_null(nt_where(NULL, a, a));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_where", "'cond'", "test_ops.c:");
    assert_null(nt_cast(NULL, NT_BF16));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_cast", "'t'", "test_ops.c:");
    assert_null(nt_sum(NULL, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_sum", "'t'", "test_ops.c:");
    assert_null(nt_argmax(NULL, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_argmax", "'t'", "test_ops.c:");
    assert_null(nt_softmax(NULL, 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_softmax", "'t'", "test_ops.c:");
    assert_null(nt_layer_norm(NULL, NULL, NULL, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_layer_norm", "'x'", "test_ops.c:");
    assert_null(nt_rms_norm(NULL, a, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_rms_norm", "'x'", "test_ops.c:");
    assert_null(nt_cross_entropy(a, NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_cross_entropy", "'labels'", "test_ops.c:");
    assert_null(nt_mse_loss(NULL, a));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mse_loss", "'a'", "test_ops.c:");
    assert_null(nt_matmul(a, NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_matmul", "'b'", "test_ops.c:");
    assert_null(nt_linear(a, NULL, NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_linear", "'w'", "test_ops.c:");
    assert_null(nt_embedding(NULL, lab));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_embedding", "'weight'", "test_ops.c:");
    assert_null(nt_reshape(NULL, 1, SH(6)));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_reshape", "'t'", "test_ops.c:");
    assert_null(nt_transpose(NULL, 0, 1));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_transpose", "'t'", "test_ops.c:");
    assert_null(nt_slice(NULL, 0, 0, 1, 1));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_slice", "'t'", "test_ops.c:");
    assert_null(nt_cat((nt_tensor *[]){a, NULL}, 2, 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_cat", "'ts[1]'", "test_ops.c:");
    assert_null(nt_contiguous(NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_contiguous", "'t'", "test_ops.c:");
    assert_null(nt_zeros_like(NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_zeros_like", "'t'", "test_ops.c:");
    assert_int_equal(nt_copy_into(a, NULL), NT_EINVAL);
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_copy_into", "'src'", "test_ops.c:");
    assert_int_equal(nt_add_inplace(NULL, a), NT_EINVAL);
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_add_inplace", "'dst'", "test_ops.c:");
    double out[6];
    assert_int_equal(nt_to_host(NULL, out, sizeof out), NT_EINVAL);
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_to_host", "'t'", "test_ops.c:");
    assert_int_equal(nt_item(a, NULL), NT_EINVAL);
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_item", "'out'", "test_ops.c:");
}

static void test_errors_null_keeps_first_error(void **state)
{
    (void)state;
    double v[] = {1, 2, 3, 4, 5, 6};
    nt_tensor *a = mk(NT_F32, 2, SH(2, 3), v), *b = mk(NT_F32, 1, SH(4), v);
    /* nt_relu(nt_add(a, b)): the shape error of nt_add survives the NULL */
    nt_tensor *y = nt_sum(nt_relu(nt_add(a, b)), 0, false);
    assert_null(y);
    char first[1024];
    snprintf(first, sizeof first, "%s", nt_last_error_message());
    assert_int_equal(nt_last_error(), NT_ESHAPE);
    assert_non_null(strstr(first, "nt_add"));
    assert_null(nt_matmul(NULL, a));
    assert_null(nt_softmax(NULL, 0));
    assert_null(nt_embedding(a, NULL));
    assert_int_equal(nt_last_error(), NT_ESHAPE);
    assert_string_equal(nt_last_error_message(), first);
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_add", "'a'", "test_ops.c:");
}

static void test_errors_released_tensor(void **state)
{
    (void)state;
    double v[] = {1, 2, 3, 4};
    nt_tensor *a = mk(NT_F32, 1, SH(4), v), *b = mk(NT_F32, 1, SH(4), v);
    nt_retain(a); /* out of the scope's hands: we release it below */
    nt_release(a);
    nt_release(a);
    assert_null(nt_add(b, a));
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_add", "'b'", "test_ops.c:");
    assert_null(nt_exp(a));
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_exp", "'t'", "test_ops.c:");
    assert_null(nt_mean(a, 0, true));
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_mean", "'t'", "test_ops.c:");
    assert_null(nt_log_softmax(a, 0));
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_log_softmax", "'t'", "test_ops.c:");
    assert_null(nt_matmul(a, b));
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_matmul", "'a'", "test_ops.c:");
    assert_null(nt_mse_loss(b, a));
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_mse_loss", "'b'", "test_ops.c:");
    assert_null(nt_permute(a, (const int[]){0}));
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_permute", "'t'", "test_ops.c:");
    assert_int_equal(nt_fill_inplace(a, 1), NT_ERELEASED);
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_fill_inplace", "'dst'", "test_ops.c:");
    double out[4];
    assert_int_equal(nt_to_host(a, out, sizeof out), NT_ERELEASED);
    nt_test_expect_err(nt_last_error(), NT_ERELEASED, "nt_to_host", "'t'", "test_ops.c:");
    assert_int_equal(nt_ndim(a), -1);
    assert_int_equal(nt_release(a), NT_ERELEASED);
    nt_clear_error();
}

static void test_errors_wrong_dtype(void **state)
{
    (void)state;
    double v[] = {0, 1, 2, 3, 4, 5};
    nt_tensor *fi = mk(NT_F32, 2, SH(2, 3), copyv(v, 6));
    nt_tensor *ii = mk(NT_I32, 2, SH(2, 3), copyv(v, 6));
    nt_tensor *uu = mk(NT_U8, 2, SH(2, 3), copyv(v, 6));
    nt_tensor *bf = mk(NT_BF16, 2, SH(3, 2), copyv(v, 6));
    nt_tensor *lab = mk(NT_F32, 1, SH(2), copyv(v, 2));
    nt_tensor *ilab = mk(NT_I32, 1, SH(2), copyv(v, 2));
    assert_null(nt_mean(ii, 0, false));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_mean", "'t'", "test_ops.c:");
    assert_null(nt_softmax(uu, 1));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_softmax", "'t'", "test_ops.c:");
    assert_null(nt_log_softmax(ii, 1));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_log_softmax", "'t'", "test_ops.c:");
    assert_null(nt_layer_norm(ii, NULL, NULL, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_layer_norm", "'x'", "test_ops.c:");
    assert_null(nt_layer_norm(fi, mk(NT_I32, 1, SH(3), copyv(v, 3)), NULL, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_layer_norm", "'w'", "test_ops.c:");
    assert_null(nt_rms_norm(uu, NULL, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_rms_norm", "'x'", "test_ops.c:");
    assert_null(nt_matmul(ii, mk(NT_I32, 2, SH(3, 2), copyv(v, 6))));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_matmul", "'a'", "test_ops.c:");
    assert_null(nt_matmul(fi, bf));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_matmul", "'b'", "test_ops.c:");
    assert_null(nt_cross_entropy(ii, ilab));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_cross_entropy", "'logits'", "test_ops.c:");
    assert_null(nt_cross_entropy(fi, lab));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_cross_entropy", "'labels'", "test_ops.c:");
    assert_null(nt_mse_loss(fi, ii));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_mse_loss", "'b'", "test_ops.c:");
    assert_null(nt_embedding(fi, lab));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_embedding", "'idx'", "test_ops.c:");
    assert_null(nt_rand(NT_I32, 1, SH(3), 1));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_rand", "'dt'", "test_ops.c:");
    assert_null(nt_randn(NT_U8, 1, SH(3), 1));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_randn", "'dt'", "test_ops.c:");
    assert_null(nt_cast(fi, (nt_dtype)42));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_cast", "'dt'", "test_ops.c:");
    assert_null(nt_zeros((nt_dtype)-3, 1, SH(2)));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_zeros", "'dt'", "test_ops.c:");
    assert_null(nt_cat((nt_tensor *[]){fi, ii}, 2, 0));
    assert_non_null(strstr(nt_last_error_message(), "ts[1] (i32"));
    /* cat reports dtype and shape together */
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_cat", "test_ops.c:");
}

static void test_errors_wrong_shape(void **state)
{
    (void)state;
    double *v = intv(64, 0, 3);
    nt_tensor *a23 = mk(NT_F32, 2, SH(2, 3), copyv(v, 6));
    nt_tensor *a4 = mk(NT_F32, 1, SH(4), copyv(v, 4));
    nt_tensor *a32 = mk(NT_F32, 2, SH(3, 2), copyv(v, 6));
    nt_tensor *a45 = mk(NT_F32, 2, SH(4, 5), copyv(v, 20));
    nt_tensor *s0 = mk(NT_F32, 0, NULL, copyv(v, 1));
    nt_tensor *l3 = mk(NT_I32, 1, SH(3), copyv(v, 3));
    assert_null(nt_add(a23, a4));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_add", "'a'", "test_ops.c:");
    assert_null(nt_where(a4, a23, a23));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_where", "'cond'", "test_ops.c:");
    assert_null(nt_matmul(a23, a45));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_matmul", "'a'", "test_ops.c:");
    assert_null(nt_matmul(s0, a23));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_matmul", "test_ops.c:");
    assert_null(nt_matmul(mk(NT_F32, 3, SH(2, 2, 3), copyv(v, 12)),
                          mk(NT_F32, 3, SH(3, 3, 2), copyv(v, 18))));
    /* batch dims 2 vs 3 */
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_matmul", "test_ops.c:");
    assert_null(nt_linear(a23, a45, NULL));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_linear", "'w'", "test_ops.c:");
    assert_null(nt_linear(a23, a23, a4));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_linear", "'b'", "test_ops.c:");
    assert_null(nt_mse_loss(a23, a32));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_mse_loss", "'a'", "test_ops.c:");
    assert_null(nt_cross_entropy(a4, l3));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_cross_entropy", "'logits'", "test_ops.c:");
    assert_null(nt_cross_entropy(a23, l3));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_cross_entropy", "'labels'", "test_ops.c:");
    assert_null(nt_layer_norm(a23, a4, NULL, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_layer_norm", "'w'", "test_ops.c:");
    assert_null(nt_layer_norm(a23, NULL, a4, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_layer_norm", "'b'", "test_ops.c:");
    assert_null(nt_rms_norm(s0, NULL, 1e-5));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_rms_norm", "'x'", "test_ops.c:");
    assert_null(nt_layer_norm(a23, NULL, NULL, -1));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_layer_norm", "'eps'", "test_ops.c:");
    assert_null(nt_embedding(a4, l3));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_embedding", "'weight'", "test_ops.c:");
    assert_null(nt_reshape(a23, 2, SH(4, 2)));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_reshape", "test_ops.c:");
    assert_null(nt_reshape(a23, 2, SH(-1, 4)));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_reshape", "test_ops.c:");
    assert_null(nt_expand(a23, 2, SH(4, 3)));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_expand", "test_ops.c:");
    assert_null(nt_cat((nt_tensor *[]){a23, a32}, 2, 0));
    assert_non_null(strstr(nt_last_error_message(), "ts[1]"));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_cat", "test_ops.c:");
    assert_int_equal(nt_copy_into(a23, a4), NT_ESHAPE);
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_copy_into", "'src'", "test_ops.c:");
    nt_tensor *a3 = mk(NT_F32, 1, SH(3), copyv(v, 3));
    assert_int_equal(nt_add_inplace(a3, a23), NT_ESHAPE); /* would need dst to grow */
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_add_inplace", "'src'", "test_ops.c:");
    double d[6];
    assert_int_equal(nt_to_host(a23, d, 8), NT_EINVAL);
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_to_host", "'nbytes'", "test_ops.c:");
    double it;
    assert_int_equal(nt_item(a23, &it), NT_ESHAPE);
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_item", "test_ops.c:");
}

static void test_errors_bad_dim(void **state)
{
    (void)state;
    double *v = intv(24, 0, 3);
    nt_tensor *t = mk(NT_F32, 3, SH(2, 3, 4), v);
    assert_null(nt_sum(t, 3, false));
    assert_non_null(strstr(nt_last_error_message(), "dim 3"));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_sum", "test_ops.c:");
    assert_null(nt_mean(t, -4, true));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_mean", "test_ops.c:");
    assert_null(nt_max(t, 7, false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_max", "test_ops.c:");
    assert_null(nt_argmax(t, -5, false));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_argmax", "test_ops.c:");
    assert_null(nt_softmax(t, 3));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_softmax", "test_ops.c:");
    assert_null(nt_log_softmax(t, -4));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_log_softmax", "test_ops.c:");
    assert_null(nt_transpose(t, 0, 3));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_transpose", "test_ops.c:");
    assert_null(nt_permute(t, (const int[]){0, 0, 1}));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_permute", "test_ops.c:");
    assert_null(nt_permute(t, (const int[]){0, 1, 5}));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_permute", "test_ops.c:");
    assert_null(nt_slice(t, 3, 0, 1, 1));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_slice", "test_ops.c:");
    assert_null(nt_slice(t, 0, 0, 1, 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_slice", "'step'", "test_ops.c:");
    assert_null(nt_cat((nt_tensor *[]){t, t}, 2, 3));
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_cat", "test_ops.c:");
    nt_tensor *s = nt_full(NT_F32, 0, NULL, 1);
    assert_null(nt_sum(s, 1, false)); /* a 0-d tensor accepts only 0 and -1 */
    nt_test_expect_err(nt_last_error(), NT_EDIM, "nt_sum", "test_ops.c:");
}

static void test_error_message_names_the_call_site(void **state)
{
    (void)state;
    double v[] = {1, 2};
    nt_tensor *a = mk(NT_F32, 1, SH(2), v);
    nt_tensor *y = nt_sum(a, 2, false); int line = __LINE__;
    assert_null(y);
    char want[128];
    snprintf(want, sizeof want, "test_ops.c:%d in test_error_message_names_the_call_site", line);
    const char *m = nt_last_error_message();
    if (!strstr(m, want))
        fail_msg("message '%s' lacks '%s'", m, want);
    assert_true(strncmp(m, "nt_sum: ", 8) == 0);
    nt_clear_error();
    assert_int_equal(nt_last_error(), 0);
    assert_string_equal(nt_last_error_message(), "");
}

/* Data errors found when the op runs: the op returns a handle; the error
 * comes back from the sync point on its result and on any consumer
 * (poison propagates), naming the op and the line that called it. */
static void expect_async(int rc, const char *fn, int line, const char *detail)
{
    char site[64];
    snprintf(site, sizeof site, "test_ops.c:%d", line);
    const char *m = nt_last_error_message();
    if (rc != NT_ERANGE || nt_last_error() != NT_ERANGE)
        fail_msg("expected NT_ERANGE, got %d: %s", rc, m);
    if (!strstr(m, fn) || !strstr(m, site) || !strstr(m, detail))
        fail_msg("message '%s' should name %s, %s and '%s'", m, fn, site, detail);
    nt_clear_error();
}

static void test_async_embedding_index_error(void **state)
{
    (void)state;
    double *w = randv(15, -1, 1);
    nt_tensor *tw = mk(NT_F32, 2, SH(5, 3), w);
    double idx[] = {0, 1, 2, 7, 4};
    nt_tensor *ti = mk(NT_I32, 1, SH(5), idx);
    nt_tensor *e = nt_embedding(tw, ti); int line = __LINE__;
    assert_non_null(e); /* queued: the index is checked when the op runs */
    nt_tensor *r = nt_relu(e);
    nt_tensor *s = nt_sum(r, NT_DIM_ALL, false);
    assert_non_null(s);
    float out[15];
    expect_async(nt_to_host(e, out, sizeof out), "nt_embedding", line,
                 "idx[3] = 7 is out of range [0, 5)");
    expect_async(nt_to_host(r, out, sizeof out), "nt_embedding", line, "idx[3]");
    double d;
    expect_async(nt_item(s, &d), "nt_embedding", line, "idx[3]");
    /* a negative index, and u8 indices past V */
    double neg[] = {-1};
    nt_tensor *e2 = nt_embedding(tw, mk(NT_I32, 1, SH(1), neg)); int line2 = __LINE__;
    expect_async(nt_to_host(e2, out, sizeof out), "nt_embedding", line2,
                 "idx[0] = -1 is out of range [0, 5)");
    double big[] = {0, 200};
    nt_tensor *e3 = nt_embedding(tw, mk(NT_U8, 2, SH(1, 2), big)); int line3 = __LINE__;
    expect_async(nt_to_host(e3, out, sizeof out), "nt_embedding", line3, "idx[1] = 200");
    /* the stream keeps working */
    double four[] = {4};
    exact("after the error", fetch(nt_embedding(tw, mk(NT_I32, 1, SH(1), four))),
          (double[]){w[12], w[13], w[14]}, 3);
}

static void test_async_cross_entropy_label_error(void **state)
{
    (void)state;
    double *x = randv(9, -1, 1);
    nt_tensor *tx = mk(NT_F32, 2, SH(3, 3), x);
    double lab[] = {0, 3, 1};
    nt_tensor *tl = mk(NT_I32, 1, SH(3), lab);
    nt_tensor *l = nt_cross_entropy(tx, tl); int line = __LINE__;
    assert_non_null(l);
    nt_tensor *l2 = nt_mul_scalar(l, 2);
    double d;
    expect_async(nt_item(l, &d), "nt_cross_entropy", line, "labels[1] = 3 is out of range [0, 3)");
    expect_async(nt_item(l2, &d), "nt_cross_entropy", line, "labels[1] = 3");
    double neg[] = {2, 1, -4};
    nt_tensor *l3 = nt_cross_entropy(tx, mk(NT_I32, 1, SH(3), neg)); int line3 = __LINE__;
    expect_async(nt_item(l3, &d), "nt_cross_entropy", line3, "labels[2] = -4");
    /* valid labels still work afterwards */
    double ok[] = {2, 1, 0};
    assert_int_equal(nt_item(nt_cross_entropy(tx, mk(NT_I32, 1, SH(3), ok)), &d), 0);
    assert_true(isfinite(d) && d > 0);
}

/* ================================================================== */

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_unary_f32_values_and_specials),
        T(test_unary_half_values),
        T(test_unary_int_inputs),
        T(test_scalar_ops_float_exact),
        T(test_pow_and_clamp),
        T(test_clamp_lo_above_hi),
        T(test_scalar_ops_int),
        T(test_binary_float_exact_with_broadcast),
        T(test_binary_broadcast_shapes),
        T(test_binary_dtype_promotion),
        T(test_int_add_mul_wraparound),
        T(test_maximum_minimum_nan_inf_zero),
        T(test_compare_ops),
        T(test_where_values),
        T(test_cast_float_rounding),
        T(test_cast_float_to_int_saturates),
        T(test_cast_int_conversions),
        T(test_cast_same_dtype_shares_storage),
        T(test_fills_each_dtype),
        T(test_arange_values),
        T(test_rand_matches_documented_generator),
        T(test_rand_range_grid_and_moments),
        T(test_rand_determinism_per_seed_and_shape),
        T(test_randn_moments),
        T(test_rand_same_in_deterministic_mode),
        T(test_reductions_each_dim_and_dtype_exact),
        T(test_reductions_over_views),
        T(test_reductions_tile_and_row_paths_agree),
        T(test_reductions_long_rows_random),
        T(test_max_argmax_nan_inf_zero),
        T(test_int_reductions_wrap_and_u8),
        T(test_reductions_empty_dims),
        T(test_min_argmin_any_nan_inf_zero),
        T(test_norm_values),
        T(test_gather_index_select_values),
        T(test_repeat_and_split_values),
        T(test_softmax_and_log_softmax_each_dim),
        T(test_softmax_long_rows_and_views),
        T(test_softmax_masked_large_and_degenerate),
        T(test_layer_norm_with_and_without_affine),
        T(test_rms_norm_with_and_without_weight),
        T(test_norms_on_views_and_3d),
        T(test_cross_entropy_values),
        T(test_cross_entropy_strided_logits),
        T(test_mse_loss_values),
        T(test_matmul_shapes_and_sizes_exact),
        T(test_matmul_random_within_bound),
        T(test_matmul_strided_inputs),
        T(test_matmul_empty_dims),
        T(test_gemm_ktile_big_call_equals_blocks),
        T(test_gemm_whole_equals_ktile_calls),
        T(test_matmul_equals_128x512_block_emulation),
        T(test_linear_with_and_without_bias),
        T(test_embedding_copies_rows_bitwise),
        T(test_embedding_strided_weight_and_idx),
        T(test_reshape_and_infer),
        T(test_reshape_strided_views),
        T(test_views_as_op_inputs),
        T(test_inplace_through_views),
        T(test_inplace_source_aliasing_destination),
        T(test_cat_each_dim),
        T(test_contiguous_and_copy),
        T(test_deterministic_mode_same_values),
        T(test_errors_null_arguments),
        T(test_errors_null_keeps_first_error),
        T(test_errors_released_tensor),
        T(test_errors_wrong_dtype),
        T(test_errors_wrong_shape),
        T(test_errors_bad_dim),
        T(test_error_message_names_the_call_site),
        T(test_async_embedding_index_error),
        T(test_async_cross_entropy_label_error),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
