/* tests/test_fp8.c - the fp8 dtypes NT_E4M3 and NT_E5M2 (docs/ops.md
 * "fp8"): decode of all 256 codes of each format against values built here
 * from the fields with ldexp; round-to-nearest-even encode of f32, bf16,
 * f16 and f64 on a sweep around every rounding boundary (each midpoint
 * between consecutive fp8 values, and the f32 values next to it, the fp8
 * values themselves, subnormals, the maximum, overflow, +-0, +-Inf, NaN)
 * against the nearest value found by an exhaustive search over the codes;
 * stochastic rounding's probability property and its bits on the CPU, the
 * simulator and in fused programs; the fp8 matmul against a double
 * reference; the ops that refuse fp8.
 *
 * No PyTorch reference: torch 1.13 (the project's reference version) has
 * no float8 dtypes (torch.float8_e4m3fn / float8_e5m2 arrived in 2.1), so
 * the references are the format definitions (OCP 8-bit floating point
 * specification 1.0) computed here. */
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
#include "ntensor/sim.h"
#include "nt_test.h"
#include "crc32.h"

/* ---------------- the reference formats, from their definitions ---------------- */

typedef struct fmt {
    nt_dtype dt;
    int ebits, mbits, bias;
    bool ieee;     /* E5M2: all-ones exponent is Inf (m = 0) or NaN */
    double max;    /* largest finite */
    uint8_t qnan;  /* the canonical NaN the casts produce */
} fmt;

static const fmt E4M3 = {NT_E4M3, 4, 3, 7, false, 448.0, 0x7f};
static const fmt E5M2 = {NT_E5M2, 5, 2, 15, true, 57344.0, 0x7e};

static bool ref_isnan(const fmt *f, uint8_t c)
{
    int e = (c >> f->mbits) & ((1 << f->ebits) - 1), m = c & ((1 << f->mbits) - 1);
    if (f->ieee)
        return e == (1 << f->ebits) - 1 && m != 0;
    return e == (1 << f->ebits) - 1 && m == (1 << f->mbits) - 1; /* S.1111.111 */
}

/* the value of code c (NaN for a NaN code; +-Inf for E5M2's) */
static double ref_decode(const fmt *f, uint8_t c)
{
    int e = (c >> f->mbits) & ((1 << f->ebits) - 1), m = c & ((1 << f->mbits) - 1);
    double s = (c & 0x80) ? -1.0 : 1.0;
    if (ref_isnan(f, c))
        return NAN;
    if (f->ieee && e == (1 << f->ebits) - 1)
        return s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, 1 - f->bias - f->mbits);
    return s * ldexp((double)((1 << f->mbits) + m), e - f->bias - f->mbits);
}

/* Round-to-nearest-even by exhaustive search over the non-negative codes:
 * the code nearest |x|, a tie to the even code; E4M3 has no infinity, so a
 * finite |x| past 448 is nearest 448 (saturation) and Inf gives NaN; E5M2's
 * Inf takes part as 2^16 (the next binade's first value), so IEEE overflow
 * falls out of the search. */
static uint8_t ref_encode(const fmt *f, double x)
{
    if (isnan(x))
        return f->qnan;
    if (isinf(x) && !f->ieee)
        return f->qnan;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double ax = fabs(x);
    int best = -1;
    double bd = INFINITY;
    for (int c = 0; c < 0x80; c++) {
        if (ref_isnan(f, (uint8_t)c))
            continue;
        double v = ref_decode(f, (uint8_t)c);
        if (isinf(v))
            v = ldexp(1.0, (1 << f->ebits) - 1 - f->bias); /* 2^16 */
        double d = isinf(ax) ? (v == ldexp(1.0, 16) ? 0 : INFINITY) : fabs(ax - v);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return (uint8_t)(sign | best);
}

/* ---------------- helpers ---------------- */

static nt_tensor *bytes_tensor(const uint8_t *v, nt_dtype dt, int64_t n)
{
    nt_tensor *t = nt_from_host(v, dt, 1, &n);
    assert_non_null(t);
    return t;
}

static void host_bytes(nt_tensor *t, uint8_t *out, int64_t n)
{
    assert_non_null(t);
    assert_int_equal(nt_to_host(t, out, (size_t)n), 0);
}

static void host_f32(nt_tensor *t, float *out, int64_t n)
{
    assert_non_null(t);
    assert_int_equal(nt_dtype_of(t), NT_F32);
    assert_int_equal(nt_to_host(t, out, (size_t)n * 4), 0);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---------------- basics ---------------- */

static void test_basics(void **state)
{
    (void)state;
    /* the existing values keep their numbers; fp8 comes after bool */
    assert_int_equal(NT_BOOL, 7);
    assert_int_equal(NT_E4M3, 8);
    assert_int_equal(NT_E5M2, 9);
    assert_string_equal(nt_dtype_name(NT_E4M3), "e4m3");
    assert_string_equal(nt_dtype_name(NT_E5M2), "e5m2");
    assert_int_equal(nt_dtype_size(NT_E4M3), 1);
    assert_int_equal(nt_dtype_size(NT_E5M2), 1);
    nt_scope *sc = nt_scope_begin();
    int64_t n = 4;
    uint8_t h[4];
    host_bytes(nt_zeros(NT_E4M3, 1, &n), h, 4);
    assert_true(h[0] == 0 && h[3] == 0);
    host_bytes(nt_full(NT_E5M2, 1, &n, -1.5), h, 4);
    assert_true(h[0] == 0xbe && h[3] == 0xbe); /* -1.5: S.01111.10 */
    host_bytes(nt_full(NT_E4M3, 1, &n, 1000.0), h, 4);
    assert_true(h[1] == 0x7e); /* saturates to 448 */
    nt_scope_end(sc);
}

/* ---------------- decode: all 256 codes ---------------- */

static void check_decode(const fmt *f)
{
    uint8_t codes[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *t = bytes_tensor(codes, f->dt, 256);
    float got[256];
    host_f32(nt_cast(t, NT_F32), got, 256);
    double got64[256];
    nt_tensor *t64 = nt_cast(t, NT_F64);
    assert_int_equal(nt_to_host(t64, got64, sizeof got64), 0);
    uint16_t gb[256], gh[256];
    assert_int_equal(nt_to_host(nt_cast(t, NT_BF16), gb, sizeof gb), 0);
    assert_int_equal(nt_to_host(nt_cast(t, NT_F16), gh, sizeof gh), 0);
    for (int c = 0; c < 256; c++) {
        double r = ref_decode(f, (uint8_t)c);
        if (isnan(r)) {
            assert_true(fbits(got[c]) == 0x7fc00000u); /* canonical NaN */
            assert_true(isnan(got64[c]));
            assert_true(gb[c] == 0x7fc0 && gh[c] == 0x7e00);
            continue;
        }
        if ((double)got[c] != r || !signbit(got[c]) != !signbit(r))
            fail_msg("%s code 0x%02x: got %a, want %a", nt_dtype_name(f->dt), c, got[c], r);
        assert_true(got64[c] == r && !signbit(got64[c]) == !signbit(r));
        /* every fp8 value is exact in bf16 and f16 */
        float b = nt_test_fbits((uint32_t)gb[c] << 16);
        assert_true((double)b == r && !signbit(b) == !signbit(r));
        double hv = ldexp((double)(gh[c] & 0x3ff) + ((gh[c] >> 10 & 0x1f) ? 1024 : 0),
                          ((gh[c] >> 10 & 0x1f) ? (gh[c] >> 10 & 0x1f) : 1) - 25);
        if ((gh[c] & 0x7c00) == 0x7c00)
            hv = INFINITY;
        assert_true(((gh[c] & 0x8000) ? -hv : hv) == r);
    }
    nt_scope_end(sc);
}

static void test_decode(void **state)
{
    (void)state;
    check_decode(&E4M3);
    check_decode(&E5M2);
}

/* ---------------- encode: round to nearest even ---------------- */

#define SWEEP_MAX 8192

static float next_up(float x) { return nextafterf(x, INFINITY); }
static float next_dn(float x) { return nextafterf(x, -INFINITY); }

/* The f32 inputs around every rounding boundary of f, both signs. */
static int sweep(const fmt *f, float *x)
{
    int n = 0;
    double vals[130];
    int nv = 0;
    for (int c = 0; c < 0x80; c++)
        if (!ref_isnan(f, (uint8_t)c) && !isinf(ref_decode(f, (uint8_t)c)))
            vals[nv++] = ref_decode(f, (uint8_t)c);
    vals[nv] = 2 * vals[nv - 1] - vals[nv - 2]; /* the step past the max */
    for (int i = 0; i <= nv; i++) {
        float v = (float)vals[i];
        float cand[8] = {v, next_up(v), next_dn(v)};
        int k = 3;
        if (i < nv) {
            float m = (float)((vals[i] + vals[i + 1]) / 2); /* exact */
            cand[k++] = m, cand[k++] = next_up(m), cand[k++] = next_dn(m);
            cand[k++] = (float)(vals[i] + (vals[i + 1] - vals[i]) * 0.25);
        }
        for (int j = 0; j < k; j++) {
            x[n++] = cand[j];
            x[n++] = -cand[j];
        }
    }
    const float extra[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-30f, -0x1p-30f,
                           0x1p-149f, FLT_MAX, -FLT_MAX, 1e6f, 65536.0f, 61440.0f,
                           next_dn(61440.0f), 464.0f, next_dn(464.0f), 480.0f, 1e30f};
    for (size_t j = 0; j < sizeof extra / sizeof extra[0]; j++)
        x[n++] = extra[j];
    uint64_t st = 12345;
    for (int j = 0; j < 1000; j++) { /* random magnitudes over the range */
        float u = nt_test_uniform(&st);
        x[n++] = (float)ldexp(1.0 + u, (int)(nt_test_rand32(&st) % 40) - 22) *
                 ((j & 1) ? -1.0f : 1.0f);
    }
    assert_true(n <= SWEEP_MAX);
    return n;
}

static void check_encode(const fmt *f, nt_dtype src)
{
    static float x[SWEEP_MAX];
    int n = sweep(f, x);
    nt_scope *sc = nt_scope_begin();
    int64_t n64 = n;
    nt_tensor *t = nt_from_host(x, NT_F32, 1, &n64);
    nt_tensor *s = src == NT_F32 ? t : nt_cast(t, src);
    static uint8_t got[SWEEP_MAX];
    host_bytes(nt_cast(s, f->dt), got, n);
    /* the source's values (bf16, f16: x rounded to them first) */
    static float sv[SWEEP_MAX];
    host_f32(nt_cast(s, NT_F32), sv, n);
    for (int i = 0; i < n; i++) {
        uint8_t want = ref_encode(f, (double)sv[i]);
        if (got[i] != want)
            fail_msg("%s -> %s of %a: got 0x%02x, want 0x%02x", nt_dtype_name(src),
                     nt_dtype_name(f->dt), sv[i], got[i], want);
    }
    nt_scope_end(sc);
}

/* f64 -> fp8 rounds once: doubles just off each midpoint (closer than an
 * f32 ulp) must not be double-rounded through f32 */
static void check_encode64(const fmt *f)
{
    static double x[SWEEP_MAX];
    static float xf[SWEEP_MAX];
    int n = sweep(f, xf);
    for (int i = 0; i < n; i++) {
        double d = (double)xf[i];
        x[i] = i % 3 == 0 ? d : i % 3 == 1 ? nextafter(d, INFINITY) : nextafter(d, -INFINITY);
    }
    nt_scope *sc = nt_scope_begin();
    int64_t n64 = n;
    nt_tensor *t = nt_from_host(x, NT_F64, 1, &n64);
    static uint8_t got[SWEEP_MAX];
    host_bytes(nt_cast(t, f->dt), got, n);
    for (int i = 0; i < n; i++)
        if (got[i] != ref_encode(f, x[i]))
            fail_msg("f64 -> %s of %a: got 0x%02x, want 0x%02x", nt_dtype_name(f->dt), x[i],
                     got[i], ref_encode(f, x[i]));
    nt_scope_end(sc);
}

static void test_encode(void **state)
{
    (void)state;
    const fmt *fs[2] = {&E4M3, &E5M2};
    for (int k = 0; k < 2; k++) {
        check_encode(fs[k], NT_F32);
        check_encode(fs[k], NT_BF16);
        check_encode(fs[k], NT_F16);
        check_encode64(fs[k]);
    }
    /* fp8 -> fp8: through the exact f32 value, one rounding */
    uint8_t codes[256], got[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    nt_scope *sc = nt_scope_begin();
    host_bytes(nt_cast(bytes_tensor(codes, NT_E5M2, 256), NT_E4M3), got, 256);
    for (int c = 0; c < 256; c++)
        assert_int_equal(got[c], ref_encode(&E4M3, ref_decode(&E5M2, (uint8_t)c)));
    host_bytes(nt_cast(bytes_tensor(codes, NT_E4M3, 256), NT_E5M2), got, 256);
    for (int c = 0; c < 256; c++)
        assert_int_equal(got[c], ref_encode(&E5M2, ref_decode(&E4M3, (uint8_t)c)));
    nt_scope_end(sc);
}

/* ---------------- stochastic rounding ---------------- */

/* n copies of x cast with nt_cast_sr: the share rounded up is the distance
 * to the lower neighbour over the gap, within 5 standard deviations; every
 * result is one of the two neighbours. */
static void check_sr(const fmt *f, nt_dtype src, double lo, double hi, double x)
{
    enum { N = 40000 };
    static uint8_t got[N];
    nt_scope *sc = nt_scope_begin();
    int64_t n = N;
    nt_tensor *t = nt_full(src, 1, &n, x);
    host_bytes(nt_cast_sr(t, f->dt), got, N);
    uint8_t clo = ref_encode(f, lo), chi = isinf(hi) ? (uint8_t)0x7c : ref_encode(f, hi);
    int up = 0;
    for (int i = 0; i < N; i++) {
        if (got[i] != clo && got[i] != chi)
            fail_msg("%s sr of %a: code 0x%02x, not 0x%02x or 0x%02x", nt_dtype_name(f->dt), x,
                     got[i], clo, chi);
        up += got[i] == chi;
    }
    double p = isinf(hi) ? (x - lo) / 8192.0 : (x - lo) / (hi - lo);
    double sd = sqrt(N * p * (1 - p));
    if (fabs(up - N * p) > 5 * sd + 1)
        fail_msg("%s sr of %a: %d of %d up, expected %.1f", nt_dtype_name(f->dt), x, up, N,
                 N * p);
    nt_scope_end(sc);
}

static void test_sr(void **state)
{
    (void)state;
    check_sr(&E4M3, NT_F32, 1.0, 1.125, 1.0 + 0.3 * 0.125);
    check_sr(&E4M3, NT_F32, 0x1p-9, 0x2p-9, 0x1p-9 * 1.7);     /* subnormal */
    check_sr(&E4M3, NT_F32, 416.0, 448.0, 430.0);              /* below the max */
    check_sr(&E4M3, NT_BF16, -3.25, -3.5, -3.3125);            /* a bf16 source */
    check_sr(&E5M2, NT_F32, 1.0, 1.25, 1.0 + 0.8 * 0.25);
    check_sr(&E5M2, NT_F16, 0x1p-16, 0x2p-16, 0x1p-16 * 1.25); /* subnormal, f16 source */
    check_sr(&E5M2, NT_F32, 57344.0, INFINITY, 60000.0);       /* past the max: Inf */
    /* exact values never move; saturation, NaN, Inf */
    nt_scope *sc = nt_scope_begin();
    const float v[8] = {1.0f, -448.0f, 1024.0f, -INFINITY, NAN, 0.0f, -0.0f, 0x1p-40f};
    int64_t n = 8;
    uint8_t h[8];
    host_bytes(nt_cast_sr(nt_from_host(v, NT_F32, 1, &n), NT_E4M3), h, 8);
    const uint8_t w4[8] = {0x38, 0xfe, 0x7e, 0x7f, 0x7f, 0x00, 0x80, 0x00};
    assert_memory_equal(h, w4, 8);
    host_bytes(nt_cast_sr(nt_from_host(v, NT_F32, 1, &n), NT_E5M2), h, 8);
    const uint8_t w5[8] = {0x3c, 0xdf, 0x64, 0xfc, 0x7e, 0x00, 0x80, 0x00};
    assert_memory_equal(h, w5, 8);
    /* the pairs nt_cast_sr takes */
    nt_tensor *i32 = nt_zeros(NT_I32, 1, &n);
    assert_null(nt_cast_sr(i32, NT_E4M3));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_cast_sr", "i32 to e4m3");
    assert_null(nt_cast_sr(nt_zeros(NT_E4M3, 1, &n), NT_E5M2));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_cast_sr");
    assert_null(nt_cast_sr(nt_zeros(NT_F64, 1, &n), NT_E5M2));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_cast_sr");
    nt_scope_end(sc);
}

/* ---------------- the same bits on every path ---------------- */

enum { PR = 37, PC = 29 };

/* casts to and from fp8 (nearest and stochastic), alone and fused with
 * elementwise ops, views of fp8, and the fp8 matmul */
static void fp8_program(nt_tensor **out)
{
    int64_t sh[2] = {PR, PC}, sh2[2] = {PC, 16};
    nt_tensor *x = nt_mul_scalar(nt_randn(NT_F32, 2, sh, 5), 40.0);
    nt_tensor *w = nt_randn(NT_F32, 2, sh2, 6);
    nt_tensor *a = nt_cast(x, NT_E4M3);
    nt_tensor *b = nt_cast_sr(nt_mul_scalar(x, 1e-3), NT_E5M2);      /* fused SR */
    nt_tensor *c = nt_cast_sr(nt_cast(x, NT_BF16), NT_E4M3);         /* bf16 source */
    nt_tensor *d = nt_mul_scalar(nt_cast(nt_transpose(a, 0, 1), NT_F32), 0.5); /* fused decode */
    nt_tensor *e = nt_cast(nt_add_scalar(nt_cast(b, NT_F32), 1.0), NT_E4M3);
    nt_tensor *wq = nt_cast(w, NT_E4M3);
    nt_tensor *sa = nt_full(NT_F32, 0, NULL, 0.75), *sb = nt_full(NT_F32, 1, (int64_t[]){1}, 3.0);
    out[0] = nt_keep(a);
    out[1] = nt_keep(b);
    out[2] = nt_keep(c);
    out[3] = nt_keep(d);
    out[4] = nt_keep(e);
    out[5] = nt_keep(nt_matmul_fp8(a, wq, sa, sb, NT_F32));
    out[6] = nt_keep(nt_matmul_fp8(a, wq, sa, sb, NT_BF16));
}
#define NPROG 7

static size_t run_program(int cfg, uint8_t **all)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    nt_test_cfg(cfg);
    assert_int_equal(nt_config_set("NT_SR_SEED", "4242"), 0);
    nt_stats_reset();
    nt_scope *sc = nt_scope_begin();
    nt_tensor *o[NPROG];
    fp8_program(o);
    nt_scope_end(sc);
    assert_int_equal(nt_sync(), 0);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    if (!strcmp(NT_TEST_CFGS[cfg][1], "lazy")) /* the casts ran inside fused kernels */
        assert_true(st.fused_ops >= 4);
    size_t n = 0;
    *all = NULL;
    for (int i = 0; i < NPROG; i++) {
        assert_non_null(o[i]);
        size_t k = (size_t)nt_test_tnumel(o[i]) * nt_dtype_size(nt_dtype_of(o[i]));
        *all = realloc(*all, n + k);
        assert_int_equal(nt_to_host(o[i], *all + n, k), 0);
        n += k;
        nt_release(o[i]);
    }
    return n;
}

static void test_paths(void **state)
{
    (void)state;
    uint8_t *ref, *got;
    size_t n0 = run_program(0, &ref);
    for (int k = 1; k < NT_TEST_NCFG; k++) {
        size_t n = run_program(k, &got);
        assert_int_equal(n, n0);
        if (memcmp(got, ref, n) != 0)
            fail_msg("the fp8 program differs on %s/%s/fusion %s", NT_TEST_CFGS[k][0],
                     NT_TEST_CFGS[k][1], NT_TEST_CFGS[k][2]);
        free(got);
    }
    free(ref);
    nt_test_cfg(0);
}

/* ---------------- nt_matmul_fp8 ---------------- */

/* f32 -> bf16, round to nearest even, written here */
static float ref_bf16(float f)
{
    uint32_t u = fbits(f);
    uint32_t lsb = (u >> 16) & 1u;
    u = (u + 0x7fffu + lsb) & 0xffff0000u;
    return nt_test_fbits(u);
}

/* Operands of small integers (exact in e4m3 and e5m2 up to 16 and 8): every
 * partial sum is an integer below 2^24, exact in f32 in any order, so the
 * reference is the double sum, then the scale as the contract says. */
static void check_mm_values(nt_dtype dt, int M, int K, int N)
{
    int lim = dt == NT_E4M3 ? 16 : 8;
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *b = malloc(sizeof(float) * (size_t)(K * N));
    uint64_t st = 99;
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((int)(nt_test_rand32(&st) % (2 * lim + 1)) - lim);
    for (int i = 0; i < K * N; i++)
        b[i] = (float)((int)(nt_test_rand32(&st) % (2 * lim + 1)) - lim);
    if (dt == NT_E5M2) /* e5m2 holds 0..8 and the even integers to 16: keep to those */
        for (int i = 0; i < M * K; i++)
            a[i] = fabsf(a[i]) > 8 ? 8 : a[i];
    nt_scope *sc = nt_scope_begin();
    int64_t sa_[2] = {M, K}, sb_[2] = {K, N};
    nt_tensor *A = nt_cast(nt_from_host(a, NT_F32, 2, sa_), dt);
    nt_tensor *B = nt_cast(nt_from_host(b, NT_F32, 2, sb_), dt);
    const float sa = 0.3f, sb = 1.7e-3f;
    nt_tensor *SA = nt_full(NT_F32, 0, NULL, sa), *SB = nt_full(NT_F32, 1, (int64_t[]){1}, sb);
    float *y = malloc(sizeof(float) * (size_t)(M * N));
    uint16_t *yb = malloc(2 * (size_t)(M * N));
    host_f32(nt_matmul_fp8(A, B, SA, SB, NT_F32), y, M * N);
    nt_tensor *YB = nt_matmul_fp8(A, B, SA, SB, NT_BF16);
    assert_non_null(YB);
    assert_int_equal(nt_dtype_of(YB), NT_BF16);
    assert_int_equal(nt_to_host(YB, yb, 2 * (size_t)(M * N)), 0);
    float s = (float)((double)sa * (double)sb);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += (double)a[m * K + k] * (double)b[k * N + n];
            float want = (float)(acc * (double)s);
            if (fbits(y[m * N + n]) != fbits(want))
                fail_msg("%s matmul [%d,%d]: got %a, want %a", nt_dtype_name(dt), m, n,
                         y[m * N + n], want);
            assert_true(yb[m * N + n] == fbits(ref_bf16(want)) >> 16);
        }
    free(a), free(b), free(y), free(yb);
    nt_scope_end(sc);
}

static void test_matmul_values(void **state)
{
    (void)state;
    check_mm_values(NT_E4M3, 7, 300, 9);
    check_mm_values(NT_E5M2, 130, 129, 5);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    check_mm_values(NT_E4M3, 7, 300, 9);
    check_mm_values(NT_E5M2, 130, 129, 5);
    nt_test_cfg(0);
}

/* The scales are read when the product runs: a replay takes new values. */
static void test_matmul_capture(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    int64_t sh[2] = {4, 4};
    nt_tensor *A = nt_full(NT_E4M3, 2, sh, 2.0), *B = nt_full(NT_E4M3, 2, sh, 3.0);
    nt_tensor *SA = nt_full(NT_F32, 0, NULL, 1.0), *SB = nt_full(NT_F32, 0, NULL, 0.5);
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_graph_input(SA, "sa"), 0);
    nt_tensor *y = nt_keep(nt_matmul_fp8(A, B, SA, SB, NT_F32));
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    float h[16];
    host_f32(y, h, 16);
    assert_true(h[0] == 12.0f && h[15] == 12.0f); /* 4 * 2 * 3 * 0.5 */
    assert_int_equal(nt_graph_bind(g, "sa", nt_full(NT_F32, 0, NULL, 4.0)), 0);
    assert_int_equal(nt_graph_replay(g), 0);
    host_f32(y, h, 16);
    assert_true(h[0] == 48.0f && h[15] == 48.0f);
    nt_graph_destroy(g);
    nt_release(y);
    assert_int_equal(nt_config_set("NT_MODE", "deterministic"), 0);
    /* a scale of 0, Inf or NaN is IEEE arithmetic (documented, not checked) */
    host_f32(nt_matmul_fp8(A, B, nt_full(NT_F32, 0, NULL, 0.0), SB, NT_F32), h, 16);
    assert_true(h[0] == 0.0f);
    host_f32(nt_matmul_fp8(A, B, nt_full(NT_F32, 0, NULL, NAN), SB, NT_F32), h, 16);
    assert_true(isnan(h[0]));
    host_f32(nt_matmul_fp8(A, B, nt_full(NT_F32, 0, NULL, INFINITY), SB, NT_F32), h, 16);
    assert_true(isinf(h[0]) && h[0] > 0);
    nt_scope_end(sc);
}

static void test_matmul_errors(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    int64_t sh[2] = {4, 4}, sh3[2] = {3, 4}, two = 2;
    nt_tensor *A = nt_full(NT_E4M3, 2, sh, 1.0), *B5 = nt_full(NT_E5M2, 2, sh, 1.0);
    nt_tensor *F = nt_ones(NT_F32, 2, sh), *S = nt_full(NT_F32, 0, NULL, 1.0);
    assert_null(nt_matmul_fp8(F, A, S, S, NT_F32));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_matmul_fp8", "'a' is f32");
    assert_null(nt_matmul_fp8(A, B5, S, S, NT_F32));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_matmul_fp8", "'b' is e5m2");
    assert_null(nt_matmul_fp8(A, A, nt_ones(NT_BF16, 0, NULL), S, NT_F32));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_matmul_fp8", "'scale_a' is bf16");
    assert_null(nt_matmul_fp8(A, A, S, nt_ones(NT_F32, 1, &two), NT_F32));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_matmul_fp8", "'scale_b'");
    assert_null(nt_matmul_fp8(A, A, S, S, NT_F16));
    nt_test_expect_err(nt_last_error(), NT_EDTYPE, "nt_matmul_fp8", "'out_dtype' is f16");
    assert_null(nt_matmul_fp8(A, nt_full(NT_E4M3, 2, sh3, 1.0), S, S, NT_F32));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_matmul_fp8", "cannot multiply");
    assert_null(nt_matmul_fp8(NULL, A, S, S, NT_F32));
    assert_true(nt_last_error() != 0 && strstr(nt_last_error_message(), "nt_matmul_fp8"));
    nt_clear_error();
    nt_tensor *SG = nt_full(NT_F32, 0, NULL, 1.0);
    assert_int_equal(nt_set_requires_grad(SG, true), 0);
    assert_null(nt_matmul_fp8(A, A, SG, S, NT_F32));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_matmul_fp8", "'scale_a' requires grad");
    nt_no_grad_begin(); /* fine without grad mode */
    assert_non_null(nt_matmul_fp8(A, A, SG, S, NT_F32));
    nt_no_grad_end();
    nt_scope_end(sc);
}

/* TensorE busy time of an fp8 and of a bf16 256 x 512 x 512 product on the
 * target NT_SIM_TARGET names, and the fp8 product's bits against the CPU's */
static void mm_target(const char *target, double *t_fp8, double *t_bf16)
{
    setenv("NT_SIM_TARGET", target, 1);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    nt_scope *sc = nt_scope_begin();
    int64_t sa[2] = {256, 512}, sb[2] = {512, 512};
    nt_tensor *x = nt_mul_scalar(nt_randn(NT_F32, 2, sa, 3), 8.0);
    nt_tensor *w = nt_mul_scalar(nt_randn(NT_F32, 2, sb, 4), 8.0);
    nt_tensor *S = nt_full(NT_F32, 0, NULL, 0.125);
    nt_tensor *a8 = nt_cast(x, NT_E4M3), *b8 = nt_cast(w, NT_E4M3);
    nt_tensor *ab = nt_cast(x, NT_BF16), *bb = nt_cast(w, NT_BF16);
    static float ref[256 * 512], got[256 * 512];
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    host_f32(nt_matmul_fp8(a8, b8, S, S, NT_F32), ref, 256 * 512);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats st;
    nt_sim_stats_reset();
    host_f32(nt_matmul_fp8(a8, b8, S, S, NT_F32), got, 256 * 512);
    assert_int_equal(nt_sim_stats_get(&st), 0);
    *t_fp8 = st.busy_ns[NT_ENGINE_TENSOR];
    assert_memory_equal(got, ref, sizeof got);
    nt_sim_stats_reset();
    nt_tensor *yb = nt_matmul(ab, bb);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_sim_stats_get(&st), 0);
    *t_bf16 = st.busy_ns[NT_ENGINE_TENSOR];
    nt_release(yb);
    nt_scope_end(sc);
    unsetenv("NT_SIM_TARGET");
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
}

/* trn2 multiplies fp8 in the double-row mode, twice bf16's rate; trn1 at
 * bf16's; the bits are the CPU's on both */
static void test_matmul_rate(void **state)
{
    (void)state;
    double f1, b1, f2, b2;
    mm_target("trn1", &f1, &b1);
    mm_target("trn2", &f2, &b2);
    /* TensorE also transposes row-major A, at the same cost for both
     * formats: the busy time falls to between half and three quarters */
    if (!(f1 > 0.9 * b1 && f1 < 1.1 * b1) || !(f2 < 0.75 * b2 && f2 > 0.45 * b2))
        fail_msg("TensorE busy: trn1 fp8 %.0f ns, bf16 %.0f ns; trn2 fp8 %.0f, bf16 %.0f", f1,
                 b1, f2, b2);
}

/* nt_isa_nc_matmul_dr's rules: fp8 operands [K, 2, M] / [K, 2, N], NeuronCore-v3 */
static int dr_case(int v)
{
    nt_sim_kernel *k = nt_sim_kernel_begin("fp8_dr");
    assert_non_null(k);
    nt_dtype dt = v == 1 ? NT_BF16 : NT_E4M3;
    nt_tile *st = nt_tile_alloc(k, "st", NT_MEM_SBUF, dt, 128, 2 * 64);
    nt_tile *mv = nt_tile_alloc(k, "mv", NT_MEM_SBUF, dt, 128, 2 * 32);
    nt_tile *ps = nt_tile_alloc(k, "ps", NT_MEM_PSUM, NT_F32, 64, 32);
    assert_true(st && mv && ps);
    nt_ap a = nt_tile_slice(st, 0, 128, 0, 64), b = nt_tile_slice(mv, 0, 128, 0, 32);
    nt_ap d = nt_tile_slice(ps, 0, 64, 0, 32);
    if (v != 2) { /* [128, 2, 64] and [128, 2, 32]: the row groups side by side */
        a.ndim = b.ndim = 2;
        a.num[1] = 64, a.step[1] = 1, a.num[0] = 2, a.step[0] = 64;
        b.num[1] = 32, b.step[1] = 1, b.num[0] = 2, b.step[0] = 32;
    }
    int rc = nt_isa_nc_matmul_dr(k, &d, &a, &b, false);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nt_sim_kernel_message(k));
    assert_int_equal(nt_sim_kernel_end(k, NULL), rc);
    if (rc && !strstr(msg, v == 1 ? "e4m3 or e5m2" : v == 2 ? "[K, 2, M]" : "NeuronCore-v3"))
        fail_msg("case %d: %s", v, msg);
    return rc;
}

static void test_matmul_dr_rules(void **state)
{
    (void)state;
    setenv("NT_SIM_TARGET", "trn2", 1);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(dr_case(0), 0);
    assert_int_equal(dr_case(1), NT_ESIM);
    assert_int_equal(dr_case(2), NT_ESIM);
    setenv("NT_SIM_TARGET", "trn1", 1);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(dr_case(0), NT_ESIM); /* no double-row mode on v2 */
    unsetenv("NT_SIM_TARGET");
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
}

/* A cast through fp8 is differentiable as every cast: the gradient flows
 * straight through to the f32 input, not rounded to fp8 on the way (the
 * gradient of a cast is the incoming gradient in the input's dtype) */
static void test_cast_grad(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    const float v[4] = {1.0f, -3.3f, 500.0f, 1e-3f};
    int64_t n = 4;
    nt_tensor *x = nt_test_leaf(v, 1, &n);
    nt_tensor *y = nt_sum(nt_mul_scalar(nt_cast(nt_cast(x, NT_E4M3), NT_F32), 0.3), 0, false);
    nt_tensor *g = nt_test_grad1(y, x, false);
    float h[4];
    host_f32(g, h, 4);
    for (int i = 0; i < 4; i++)
        if (h[i] != 0.3f)
            fail_msg("grad %d: %a", i, h[i]);
    nt_scope_end(sc);
}

/* ---------------- printing and checkpoints ---------------- */

static void test_print_checkpoint(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    const uint8_t v[4] = {0x7e, 0x81, 0x7f, 0xb8}; /* 448, -2^-9, NaN, -1 */
    int64_t n = 4;
    nt_tensor *t = bytes_tensor(v, NT_E4M3, 4);
    char *s = nt_format(t);
    assert_non_null(s);
    if (!strstr(s, "4.4800e+02") || !strstr(s, "-1.9531e-03") || !strstr(s, "nan") ||
        !strstr(s, "dtype=e4m3"))
        fail_msg("e4m3 printed as %s", s);
    free(s);
    s = nt_format(bytes_tensor(v, NT_E5M2, 4));
    assert_non_null(strstr(s, "dtype=e5m2"));
    assert_non_null(strstr(s, "inf") || strstr(s, "nan"));
    free(s);
    /* a round trip, bit for bit; the file is version 3 */
    assert_int_equal(nt_test_dir_make("fp8"), 0);
    char p[300], p2[300];
    snprintf(p, sizeof p, "%s/fp8.ckpt", nt_test_dir);
    snprintf(p2, sizeof p2, "%s/v2.ckpt", nt_test_dir);
    nt_tensor *u = nt_zeros(NT_E4M3, 1, &n);
    assert_int_equal(nt_save(p, &t, 1, NULL), 0);
    assert_int_equal(nt_load(p, &u, 1, NULL), 0);
    uint8_t h[4];
    host_bytes(u, h, 4);
    assert_memory_equal(h, v, 4);
    uint8_t buf[4096];
    FILE *fp = fopen(p, "rb");
    assert_non_null(fp);
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    assert_int_equal(buf[8], 3);
    /* the same file marked version 2 (an older reader's newest) is refused;
     * the header checksum (CRC-32 over the header and table) is fixed up */
    uint32_t count = (uint32_t)buf[12] | (uint32_t)buf[13] << 8;
    size_t hsize = 32 + (size_t)count * 96 + 8;
    buf[8] = 2;
    uint32_t crc = crc32_ieee(buf, hsize - 8);
    for (int i = 0; i < 4; i++)
        buf[hsize - 8 + i] = (uint8_t)(crc >> (8 * i));
    fp = fopen(p2, "wb");
    assert_non_null(fp);
    assert_true(fwrite(buf, 1, len, fp) == len);
    fclose(fp);
    nt_test_expect_err(nt_load(p2, &u, 1, NULL), NT_EFORMAT, "nt_load", "dtype e4m3",
                       "version-2 file");
    nt_scope_end(sc);
    nt_test_dir_remove();
}

/* ---------------- ops that refuse fp8 ---------------- */

static void test_refused(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    int64_t n = 4;
    nt_tensor *a = nt_zeros(NT_E4M3, 1, &n);
    nt_tensor *f = nt_ones(NT_F32, 1, &n);
    assert_null(nt_add(a, a));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_add", "e4m3", "storage dtype");
    assert_null(nt_exp(a));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_exp", "e4m3");
    assert_null(nt_mul(f, nt_zeros(NT_E5M2, 1, &n)));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_mul", "e5m2");
    assert_null(nt_sum(a, 0, false));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_sum", "e4m3");
    int64_t sh2[2] = {2, 2};
    nt_tensor *m = nt_zeros(NT_E4M3, 2, sh2);
    assert_null(nt_matmul(m, m));
    nt_test_expect_err(nt_last_error(), NT_ENOTSUP, "nt_matmul", "nt_matmul_fp8");
    /* a reducing collective refuses it (gathers move its bytes) */
    int dev0 = 0;
    nt_comm *cm = nt_comm_create(&dev0, 1);
    assert_non_null(cm);
    nt_tensor *ro = NULL;
    nt_test_expect_err(nt_all_reduce(cm, &a, &ro, NT_REDUCE_SUM), NT_EDTYPE, "nt_all_reduce",
                       "e4m3", "reducing collective");
    nt_comm_destroy(cm);
    /* views, copies and cats take it */
    uint8_t h[8];
    host_bytes(nt_reshape(nt_transpose(m, 0, 1), 1, &n), h, 4);
    nt_tensor *two[2] = {a, a};
    host_bytes(nt_cat(two, 2, 0), h, 8);
    nt_scope_end(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_sr),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_matmul_values),
        cmocka_unit_test(test_matmul_capture),
        cmocka_unit_test(test_matmul_errors),
        cmocka_unit_test(test_print_checkpoint),
        cmocka_unit_test(test_matmul_rate),
        cmocka_unit_test(test_matmul_dr_rules),
        cmocka_unit_test(test_cast_grad),
    };
    return cmocka_run_group_tests(tests, nt_test_setup, nt_test_teardown);
}
