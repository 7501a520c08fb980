/* tests/test_dtype.c - the exact conversions of core/dtype.h.
 *
 * References are independent of the code under test:
 *   f32/f64 -> f16: GCC's _Float16 conversion (F16C's vcvtps2ph where the CPU
 *     has it, which GCC emits for the cast under target("f16c"); else libgcc's
 *     soft-float __truncsfhf2 / __truncdfhf2).
 *   f32/f64 -> bf16: rounding done by double arithmetic: r = (|x| + C) - C
 *     with C = 1.5 * 2^52 * q rounds |x| once, to nearest even, to a
 *     multiple of the bf16 quantum q of its binade (the sum's ulp is q);
 *     r >= 2^128 is an overflow to Inf.
 *   bf16/f16 -> f32: the value decoded from sign, exponent and mantissa
 *     with double arithmetic (and, for f16, _Float16 widening).
 *   NaN: every NaN narrows to the canonical positive quiet NaN (0x7fc0 /
 *     0x7e00), whatever its sign and payload (core/dtype.h: canonical NaN at
 *     every rounding point), so the references are not asked about NaNs.
 * The f32 -> bf16/f16 checks run over all 2^32 bit patterns (about 15 s at
 * -O2).  Under AddressSanitizer (__SANITIZE_ADDRESS__, the suite's
 * sanitizer build) or with NT_TEST_QUICK set, they stride the patterns by a
 * prime (every 997th, several offsets) instead; the named edge cases (ties,
 * subnormals, overflow, NaN, -0) run in every build. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cpuid.h>
#include <cmocka.h>

#include "core/dtype.h"
#include "core/gemm.h"

static uint64_t sweep_step(void)
{
#ifdef __SANITIZE_ADDRESS__
    return 997;
#else
    return getenv("NT_TEST_QUICK") ? 997 : 1;
#endif
}

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t bitsf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static uint64_t bitsd(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* ---------------- references ---------------- */

static int have_f16c;

__attribute__((target("f16c"))) static uint16_t f16_hw(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static uint16_t f16_soft(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static uint16_t ref_f16_from_f32(float f) { return have_f16c ? f16_hw(f) : f16_soft(f); }
static uint16_t ref_f16_from_f64(double d)
{
    _Float16 h = (_Float16)d; /* libgcc __truncdfhf2: one rounding from double */
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* |x| rounded to nearest even at quantum 2^qe, in double arithmetic. */
static double round_to_quantum(double a, int qe)
{
    double C = ldexp(1.5, 52 + qe);
    return (a + C) - C;
}

/* bf16 bits of a non-NaN double, rounded once. */
static uint16_t ref_bf16_from_f64(double d)
{
    uint16_t sign = signbit(d) ? 0x8000u : 0;
    double a = fabs(d);
    if (isinf(a))
        return sign | 0x7f80u;
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e): 8 significant bits give quantum 2^(e-8) */
    int qe = e - 8 < -133 ? -133 : e - 8; /* subnormals: fixed quantum 2^-133 */
    double r = round_to_quantum(a, qe);
    if (r >= 0x1p128)
        return sign | 0x7f80u;
    uint32_t u = bitsf((float)r); /* exact: r has at most 8 significant bits */
    assert_int_equal(u & 0xffffu, 0);
    return sign | (uint16_t)(u >> 16);
}

/* The same for an f32 input, with the binade read off the float's exponent
 * field (faster than frexp for the 2^32 sweep; the rounding is still the
 * double addition). */
static inline uint16_t ref_bf16_from_f32_fast(uint32_t u)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t be = (u >> 23) & 0xffu;
    if (be == 0xff)
        return sign | 0x7f80u; /* Inf (NaN handled by the caller) */
    double a = fabs((double)fbits(u));
    int qe = (int)(be ? be : 1) - 127 - 7;
    double C = 1.5 * 0x1p52;
    uint64_t cb = bitsd(C) + ((uint64_t)(int64_t)qe << 52); /* C * 2^qe */
    memcpy(&C, &cb, 8);
    double r = (a + C) - C;
    if (r >= 0x1p128)
        return sign | 0x7f80u;
    return sign | (uint16_t)(bitsf((float)r) >> 16);
}

/* ---------------- f32 -> bf16 / f16, every bit pattern ---------------- */

static void report(const char *what, uint64_t mism, uint32_t first, unsigned got, unsigned want)
{
    if (mism)
        print_error("%s: %llu mismatches; first at f32 0x%08x: got 0x%04x, want 0x%04x\n",
                    what, (unsigned long long)mism, first, got, want);
    assert_int_equal(mism, 0);
}

static void test_f32_to_bf16_every_pattern(void **state)
{
    (void)state;
    uint64_t step = sweep_step(), mism = 0, nans = 0;
    uint32_t first = 0;
    unsigned fg = 0, fw = 0;
    for (uint64_t off = 0; off < (step > 1 ? 3 : 1); off++)
        for (uint64_t v = off * 331; v < (UINT64_C(1) << 32); v += step) {
            uint32_t u = (uint32_t)v;
            uint16_t got = nt__f32_to_bf16(fbits(u));
            uint16_t want;
            if ((u & 0x7fffffffu) > 0x7f800000u) {
                nans++;
                want = 0x7fc0u; /* every NaN becomes the canonical quiet NaN */
            } else {
                want = ref_bf16_from_f32_fast(u);
            }
            if (got != want && mism++ == 0)
                first = u, fg = got, fw = want;
        }
    report("f32->bf16", mism, first, fg, fw);
    assert_true(nans > 0);
}

static void test_f32_to_f16_every_pattern(void **state)
{
    (void)state;
    uint64_t step = sweep_step(), mism = 0;
    uint32_t first = 0;
    unsigned fg = 0, fw = 0;
    for (uint64_t off = 0; off < (step > 1 ? 3 : 1); off++)
        for (uint64_t v = off * 331; v < (UINT64_C(1) << 32); v += step) {
            uint32_t u = (uint32_t)v;
            uint16_t got = nt__f32_to_f16(fbits(u));
            /* NaN: the canonical quiet NaN (not the hardware's payload) */
            uint16_t want = (u & 0x7fffffffu) > 0x7f800000u ? 0x7e00u : ref_f16_from_f32(fbits(u));
            if (got != want && mism++ == 0)
                first = u, fg = got, fw = want;
        }
    report("f32->f16", mism, first, fg, fw);
}

/* ---------------- bf16 / f16 -> f32, all 65536 patterns ---------------- */

static void test_bf16_to_f32_all(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = nt__bf16_to_f32((uint16_t)h);
        int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
        if (e == 0xff) {
            if (m == 0)
                assert_true(isinf(got) && (signbit(got) != 0) == s);
            else
                assert_true(isnan(got) && (signbit(got) != 0) == s);
            continue;
        }
        double v = e ? ldexp(128.0 + m, e - 127 - 7) : ldexp((double)m, -126 - 7);
        v = s ? -v : v;
        assert_true((double)got == v);
        assert_int_equal(signbit(got) != 0, s);
        /* widening then narrowing is the identity */
        assert_int_equal(nt__f32_to_bf16(got), h);
    }
}

static void test_f16_to_f32_all(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t hb = (uint16_t)h;
        float got = nt__f16_to_f32(hb);
        _Float16 hf;
        memcpy(&hf, &hb, 2);
        int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
        if (e == 0x1f) {
            if (m == 0) {
                assert_true(isinf(got) && (signbit(got) != 0) == s);
            } else {
                assert_true(isnan(got) && (signbit(got) != 0) == s);
                /* payload kept in the top mantissa bits */
                assert_int_equal((bitsf(got) >> 13) & 0x3ffu, (uint32_t)m);
            }
            continue;
        }
        double v = e ? ldexp(1024.0 + m, e - 15 - 10) : ldexp((double)m, -14 - 10);
        v = s ? -v : v;
        assert_true((double)got == v);
        assert_true((double)got == (double)(float)hf); /* GCC's widening agrees */
        assert_int_equal(signbit(got) != 0, s);
        assert_int_equal(nt__f32_to_f16(got), h);
    }
}

/* ---------------- named edge cases ---------------- */

static void test_f32_to_bf16_edges(void **state)
{
    (void)state;
    /* exact ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
    assert_int_equal(nt__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(nt__f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82); /* odd -> up */
    assert_int_equal(nt__f32_to_bf16(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81); /* above the tie */
    assert_int_equal(nt__f32_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
    /* -0 and +0 */
    assert_int_equal(nt__f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(nt__f32_to_bf16(0.0f), 0x0000);
    /* subnormals: the smallest f32 subnormal rounds to 0; 2^-133 is bf16's smallest */
    assert_int_equal(nt__f32_to_bf16(0x1p-149f), 0x0000);
    assert_int_equal(nt__f32_to_bf16(0x1p-133f), 0x0001);
    assert_int_equal(nt__f32_to_bf16(0x1p-134f), 0x0000);             /* tie -> even 0 */
    assert_int_equal(nt__f32_to_bf16(0x1p-134f + 0x1p-149f), 0x0001); /* above the tie */
    assert_int_equal(nt__f32_to_bf16(0x1.fcp-127f), 0x007f);          /* largest subnormal */
    assert_int_equal(nt__f32_to_bf16(0x1.fep-127f), 0x0080); /* tie -> even: the smallest normal */
    /* overflow: the largest f32 rounds to Inf, the largest bf16 stays */
    assert_int_equal(nt__f32_to_bf16(0x1.fep127f), 0x7f7f);
    assert_int_equal(nt__f32_to_bf16(0x1.ff0000p127f), 0x7f80); /* tie above max -> Inf */
    assert_int_equal(nt__f32_to_bf16(0x1.fefffep127f), 0x7f7f);
    assert_int_equal(nt__f32_to_bf16(-INFINITY), 0xff80);
    /* NaN: canonical (positive, quiet), whatever the sign and payload */
    assert_int_equal(nt__f32_to_bf16(fbits(0xff800001u)), 0x7fc0); /* signalling, negative */
    assert_int_equal(nt__f32_to_bf16(NAN), 0x7fc0);
    assert_int_equal(nt__f32_to_bf16(-NAN), 0x7fc0);
}

static void test_f32_to_f16_edges(void **state)
{
    (void)state;
    assert_int_equal(nt__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);             /* tie -> even */
    assert_int_equal(nt__f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02);  /* tie -> even (up) */
    assert_int_equal(nt__f32_to_f16(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
    assert_int_equal(nt__f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(nt__f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(nt__f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(nt__f32_to_f16(65520.0f), 0x7c00); /* the tie above max -> Inf */
    assert_int_equal(nt__f32_to_f16(-1e6f), 0xfc00);
    assert_int_equal(nt__f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
    assert_int_equal(nt__f32_to_f16(0x1p-25f), 0x0000); /* tie -> even 0 */
    assert_int_equal(nt__f32_to_f16(0x1.000002p-25f), 0x0001);
    assert_int_equal(nt__f32_to_f16(0x3p-25f), 0x0002); /* 1.5 * 2^-24: tie -> even 2 */
    assert_int_equal(nt__f32_to_f16(0x1.ff8p-15f), 0x03ff); /* largest subnormal */
    assert_int_equal(nt__f32_to_f16(0x1.ffcp-15f), 0x0400); /* tie -> even: the smallest normal */
    assert_int_equal(nt__f32_to_f16(-0x1p-30f), 0x8000);    /* underflow keeps the sign */
    assert_int_equal(nt__f32_to_f16(fbits(0x7f800001u)), 0x7e00); /* canonical NaN */
    assert_int_equal(nt__f32_to_f16(-NAN), 0x7e00);
    assert_int_equal(nt__f32_to_f16(fbits(0xffffffffu)), 0x7e00);
}

/* ---------------- double -> bf16 / f16: one rounding ---------------- */

static void test_f64_to_bf16_single_rounding(void **state)
{
    (void)state;
    /* Just above a bf16 tie, by less than f32 can hold: rounding to f32
     * first lands exactly on the tie and then goes to even (wrong). */
    double d = 1.0 + 0x1p-8 + 0x1p-30;
    assert_int_equal((uint16_t)nt__f32_to_bf16((float)d), 0x3f80); /* the double-rounding trap */
    assert_int_equal(nt__f64_to_bf16(d), 0x3f81);
    assert_int_equal(nt__f64_to_bf16(-d), 0xbf81);
    assert_int_equal(nt__f64_to_bf16(1.0 + 0x1p-8 - 0x1p-30), 0x3f80);
    assert_int_equal(nt__f64_to_bf16(1.0 + 0x1p-8), 0x3f80);                 /* a true tie */
    assert_int_equal(nt__f64_to_bf16(0x1p-134 + 0x1p-170), 0x0001);          /* subnormal */
    assert_int_equal(nt__f64_to_bf16(0x1p-134), 0x0000);
    assert_int_equal(nt__f64_to_bf16(1e300), 0x7f80);
    assert_int_equal(nt__f64_to_bf16(-1e-300), 0x8000);
    assert_int_equal(nt__f64_to_bf16(0x1.ffp127 - 0x1p90), 0x7f7f);          /* just below the tie */
    assert_int_equal(nt__f64_to_bf16(NAN), 0x7fc0);
    assert_int_equal(nt__f64_to_bf16(-NAN), 0x7fc0);
    /* a sweep of random doubles over bf16's range and past it */
    uint64_t x = 0x243f6a8885a308d3u, mism = 0;
    for (int i = 0; i < 2000000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int e = (int)(x % 290) - 150;          /* 2^-150 .. 2^139 */
        double m = 1.0 + (double)(x >> 12) * 0x1p-52;
        double v = ldexp((x & 1) ? -m : m, e);
        if (nt__f64_to_bf16(v) != ref_bf16_from_f64(v) && mism++ < 3)
            print_error("f64->bf16 %a: got 0x%04x want 0x%04x\n", v, nt__f64_to_bf16(v),
                        ref_bf16_from_f64(v));
    }
    assert_int_equal(mism, 0);
}

static void test_f64_to_f16_single_rounding(void **state)
{
    (void)state;
    double d = 1.0 + 0x1p-11 + 0x1p-40;
    assert_int_equal((uint16_t)nt__f32_to_f16((float)d), 0x3c00); /* the double-rounding trap */
    assert_int_equal(nt__f64_to_f16(d), 0x3c01);
    assert_int_equal(nt__f64_to_f16(0x1p-25 + 0x1p-50), 0x0001); /* subnormal: trap at 2^-25 */
    assert_int_equal(nt__f64_to_f16(0x1p-25), 0x0000);
    assert_int_equal(nt__f64_to_f16(65519.99), 0x7bff);
    assert_int_equal(nt__f64_to_f16(65520.0), 0x7c00);
    assert_int_equal(nt__f64_to_f16(-0.0), 0x8000);
    assert_int_equal(nt__f64_to_f16(-NAN), 0x7e00);
    uint64_t x = 0x13198a2e03707344u, mism = 0;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int e = (int)(x % 50) - 30;            /* 2^-30 .. 2^19 */
        double m = 1.0 + (double)(x >> 12) * 0x1p-52;
        double v = ldexp((x & 1) ? -m : m, e);
        if (nt__f64_to_f16(v) != ref_f16_from_f64(v) && mism++ < 3)
            print_error("f64->f16 %a: got 0x%04x want 0x%04x\n", v, nt__f64_to_f16(v),
                        ref_f16_from_f64(v));
    }
    assert_int_equal(mism, 0);
}

/* ---------------- float -> int ---------------- */

static void test_float_to_int_saturates(void **state)
{
    (void)state;
    assert_int_equal(nt__f64_to_i32(3.9), 3);
    assert_int_equal(nt__f64_to_i32(-3.9), -3); /* toward zero */
    assert_int_equal(nt__f64_to_i32(-0.5), 0);
    assert_int_equal(nt__f64_to_i32(NAN), 0);
    assert_int_equal(nt__f64_to_i32(INFINITY), INT32_MAX);
    assert_int_equal(nt__f64_to_i32(-INFINITY), INT32_MIN);
    assert_int_equal(nt__f64_to_i32(2147483647.9), INT32_MAX);
    assert_int_equal(nt__f64_to_i32(2147483648.0), INT32_MAX);
    assert_int_equal(nt__f64_to_i32(-2147483648.9), INT32_MIN);
    assert_int_equal(nt__f64_to_i32(-2147483647.9), -2147483647);
    assert_int_equal(nt__f64_to_i32(1e300), INT32_MAX);
    assert_int_equal(nt__f64_to_u8(255.9), 255);
    assert_int_equal(nt__f64_to_u8(256.0), 255);
    assert_int_equal(nt__f64_to_u8(3.7), 3);
    assert_int_equal(nt__f64_to_u8(-1.0), 0);
    assert_int_equal(nt__f64_to_u8(-0.9), 0);
    assert_int_equal(nt__f64_to_u8(NAN), 0);
    assert_int_equal(nt__f64_to_u8(INFINITY), 255);
    /* through the typed store/load helpers */
    int32_t i;
    uint8_t b;
    nt__store_f32(&i, NT_I32, 0, 3e9f);
    assert_int_equal(i, INT32_MAX);
    nt__store_f32(&i, NT_I32, 0, -NAN);
    assert_int_equal(i, 0);
    nt__store_f32(&b, NT_U8, 0, 1000.0f);
    assert_int_equal(b, 255);
    float f = 1e10f;
    assert_int_equal(nt__load_i32(&f, NT_F32, 0), INT32_MAX);
}

static void test_int_stores_wrap_and_round(void **state)
{
    (void)state;
    uint8_t b;
    nt__store_i32(&b, NT_U8, 0, 300);
    assert_int_equal(b, 44); /* ints wrap */
    nt__store_i32(&b, NT_U8, 0, -1);
    assert_int_equal(b, 255);
    float f;
    nt__store_i32(&f, NT_F32, 0, 16777217);
    assert_true(f == 16777216.0f); /* one rounding, ties to even */
    nt__store_i32(&f, NT_F32, 0, 16777219);
    assert_true(f == 16777220.0f);
    uint16_t h;
    nt__store_i32(&h, NT_BF16, 0, 257);
    assert_int_equal(h, nt__f32_to_bf16(256.0f)); /* tie -> even */
    nt__store_i32(&h, NT_BF16, 0, 259);
    assert_int_equal(h, nt__f32_to_bf16(260.0f));
    nt__store_i32(&h, NT_F16, 0, 70000);
    assert_int_equal(h, 0x7c00); /* overflow -> Inf */
    /* (int)2^31-1 to bf16 must round once from the exact integer */
    nt__store_i32(&h, NT_BF16, 0, 0x40ffffff);
    assert_int_equal(h, ref_bf16_from_f64((double)0x40ffffff));
}

static void test_promote_table(void **state)
{
    (void)state;
    assert_int_equal(nt__promote(NT_BF16, NT_F16), NT_F32);
    assert_int_equal(nt__promote(NT_F16, NT_BF16), NT_F32);
    assert_int_equal(nt__promote(NT_F32, NT_BF16), NT_F32);
    assert_int_equal(nt__promote(NT_BF16, NT_I32), NT_BF16);
    assert_int_equal(nt__promote(NT_U8, NT_F16), NT_F16);
    assert_int_equal(nt__promote(NT_I32, NT_U8), NT_I32);
    assert_int_equal(nt__promote(NT_U8, NT_U8), NT_U8);
    for (int d = 0; d < NT_DTYPE_COUNT; d++)
        assert_int_equal(nt__promote((nt_dtype)d, (nt_dtype)d), d);
    assert_int_equal(nt__dtype_size(NT_BF16), 2);
    assert_int_equal(nt__dtype_size(NT_U8), 1);
    assert_int_equal(nt__dtype_size(NT_DTYPE_COUNT), 0);
}

static void test_load_store_each_dtype(void **state)
{
    (void)state;
    unsigned char buf[16];
    const nt_dtype dts[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    for (int k = 0; k < 5; k++) {
        nt__store_f64(buf, dts[k], 1, 42.0);
        assert_true(nt__load_f64(buf, dts[k], 1) == 42.0);
        assert_true(nt__load_f32(buf, dts[k], 1) == 42.0f);
        assert_int_equal(nt__load_i32(buf, dts[k], 1), 42);
    }
    /* store_f64 rounds once: 1/3 to bf16 equals the reference */
    nt__store_f64(buf, NT_BF16, 0, 1.0 / 3.0);
    uint16_t h;
    memcpy(&h, buf, 2);
    assert_int_equal(h, ref_bf16_from_f64(1.0 / 3.0));
}

/* The block stores (core/convert.c) on every ISA level this CPU runs give
 * the element conversion's bits: a sweep of 2^24 patterns spread over all
 * 2^32 (an odd multiplier), every NaN class, subnormals and ties, at every
 * length 1..40 and offset 0..3 (vector bodies and tails), unit stride. */
static void test_block_stores_every_isa(void **state)
{
    (void)state;
    enum { N = 1 << 16, EDGES = 16 };
    float *src = malloc(sizeof(float) * (N + 64));
    uint16_t *h = malloc(2 * (N + 64));
    float *f = malloc(sizeof(float) * (N + 64));
    assert_non_null(src);
    assert_non_null(h);
    assert_non_null(f);
    const uint32_t edges[EDGES] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff812345u,
                                   0x7f800000u, 0xff800000u, 0x00000001u, 0x807fffffu,
                                   0x00008000u, 0x00018000u, 0x3f808000u, 0x3f818000u,
                                   0x7f7fffffu, 0x7f7f8000u, 0x80000000u, 0x00000000u};
    int old = nt__gemm_isa();
    for (int isa = 0; isa < NT_ISA_COUNT; isa++) {
        if (nt__gemm_set_isa(isa) < 0)
            continue; /* this CPU does not run it */
        for (uint64_t base = 0; base < (UINT64_C(1) << 24); base += N) {
            for (int i = 0; i < N; i++)
                src[i] = fbits((uint32_t)((base + (uint64_t)i) * 0x9e3779b1u));
            for (int i = 0; i < EDGES; i++)
                src[i * 97] = fbits(edges[i]);
            nt__st_f32((char *)h, NT_BF16, 1, src, N);
            nt__st_f32((char *)f, NT_F32, 1, src, N);
            for (int i = 0; i < N; i++) {
                if (h[i] != nt__f32_to_bf16(src[i]))
                    fail_msg("%s: bf16 store of 0x%08x gives 0x%04x, expected 0x%04x",
                             nt__gemm_isa_label(isa), bitsf(src[i]), h[i],
                             nt__f32_to_bf16(src[i]));
                if (bitsf(f[i]) != bitsf(nt__canon(src[i])))
                    fail_msg("%s: f32 store of 0x%08x gives 0x%08x", nt__gemm_isa_label(isa),
                             bitsf(src[i]), bitsf(f[i]));
            }
        }
        /* lengths and offsets: the tails, and nothing written past n */
        for (int n = 1; n <= 40; n++)
            for (int off = 0; off < 4; off++) {
                for (int i = 0; i < 64; i++)
                    src[i] = fbits(edges[i % EDGES] ^ (uint32_t)(i * 0x01000193u & 0x7fffu));
                memset(h, 0xab, 2 * 64);
                memset(f, 0xab, 4 * 64);
                nt__st_f32((char *)(h + off), NT_BF16, 1, src, n);
                nt__st_f32((char *)(f + off), NT_F32, 1, src, n);
                for (int i = 0; i < 64; i++) {
                    bool in = i >= off && i < off + n;
                    uint16_t wh = in ? nt__f32_to_bf16(src[i - off]) : 0xababu;
                    uint32_t wf = in ? bitsf(nt__canon(src[i - off])) : 0xababababu;
                    if (h[i] != wh || bitsf(f[i]) != wf)
                        fail_msg("%s: store of %d at offset %d, element %d differs",
                                 nt__gemm_isa_label(isa), n, off, i);
                }
            }
    }
    nt__gemm_set_isa(old);
    free(src);
    free(h);
    free(f);
}

/* The f16 block conversions (core/convert.c: AVX-512F / F16C forms with a
 * NaN fix-up) and the bf16 loads and the settle (round through a dtype) on
 * every ISA level this CPU runs give the element rules' bits: every f16
 * pattern widened (signalling NaNs keep their payload), the 2^24-pattern
 * sweep narrowed (every NaN the canonical 0x7e00, f16 subnormals, ties,
 * overflow), unit stride and strided (through the chunk buffer), every
 * length 1..40 at offsets 0..3, nothing touched past n. */
static void test_block_f16_every_isa(void **state)
{
    (void)state;
    enum { N = 1 << 16, EDGES = 16, ST = 3 };
    float *src = malloc(sizeof(float) * (N + 64));
    float *f = malloc(sizeof(float) * (N + 64) * ST);
    uint16_t *h = malloc(2 * (N + 64) * ST);
    uint16_t *hs = malloc(2 * (N + 64));
    assert_non_null(src);
    assert_non_null(f);
    assert_non_null(h);
    assert_non_null(hs);
    const uint32_t edges[EDGES] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff812345u,
                                   0x7f800000u, 0xff800000u, 0x33800000u, 0xb3800001u,
                                   0x33000000u, 0x33000001u, 0x477fefffu, 0x477ff000u,
                                   0x38800000u, 0x387fe000u, 0x80000000u, 0x00000000u};
    int old = nt__gemm_isa();
    int tested = 0;
    for (int isa = 0; isa < NT_ISA_COUNT; isa++) {
        if (nt__gemm_set_isa(isa) < 0)
            continue;
        tested++;
        const char *lab = nt__gemm_isa_label(isa);
        /* widening: all 65536 patterns, unit stride and stride ST */
        for (int i = 0; i < N; i++)
            hs[i] = (uint16_t)i;
        for (int i = 0; i < N; i++)
            h[i * ST] = (uint16_t)i;
        for (int strided = 0; strided < 2; strided++) {
            memset(f, 0xab, sizeof(float) * N);
            nt__ld_f32(f, (const char *)(strided ? h : hs), NT_F16, strided ? ST : 1, N);
            for (int i = 0; i < N; i++)
                if (bitsf(f[i]) != bitsf(nt__f16_to_f32((uint16_t)i)))
                    fail_msg("%s: f16 load (stride %d) of 0x%04x gives 0x%08x, expected 0x%08x",
                             lab, strided ? ST : 1, i, bitsf(f[i]),
                             bitsf(nt__f16_to_f32((uint16_t)i)));
        }
        /* bf16 widening, all patterns */
        nt__ld_f32(f, (const char *)hs, NT_BF16, 1, N);
        for (int i = 0; i < N; i++)
            if (bitsf(f[i]) != bitsf(nt__bf16_to_f32((uint16_t)i)))
                fail_msg("%s: bf16 load of 0x%04x gives 0x%08x", lab, i, bitsf(f[i]));
        /* narrowing and settling: the sweep */
        for (uint64_t base = 0; base < (UINT64_C(1) << 24); base += N) {
            for (int i = 0; i < N; i++)
                src[i] = fbits((uint32_t)((base + (uint64_t)i) * 0x9e3779b1u));
            for (int i = 0; i < EDGES; i++)
                src[i * 97] = fbits(edges[i]);
            nt__st_f32((char *)hs, NT_F16, 1, src, N);
            nt__st_f32((char *)h, NT_F16, ST, src, N);
            for (int i = 0; i < N; i++) {
                uint16_t want = nt__f32_to_f16(src[i]);
                if (hs[i] != want || h[i * ST] != want)
                    fail_msg("%s: f16 store of 0x%08x gives 0x%04x (stride %d: 0x%04x), "
                             "expected 0x%04x",
                             lab, bitsf(src[i]), hs[i], ST, h[i * ST], want);
            }
            const nt_dtype sdt[3] = {NT_F32, NT_BF16, NT_F16};
            for (int d = 0; d < 3; d++) {
                nt__settle_f32(f, sdt[d], src, N);
                for (int i = 0; i < N; i++) {
                    float want = sdt[d] == NT_F32    ? nt__canon(src[i])
                                 : sdt[d] == NT_BF16 ? nt__bf16_to_f32(nt__f32_to_bf16(src[i]))
                                                     : nt__f16_to_f32(nt__f32_to_f16(src[i]));
                    if (bitsf(f[i]) != bitsf(want))
                        fail_msg("%s: settle to %s of 0x%08x gives 0x%08x, expected 0x%08x", lab,
                                 nt_dtype_name(sdt[d]), bitsf(src[i]), bitsf(f[i]), bitsf(want));
                }
            }
            /* in place */
            memcpy(f, src, sizeof(float) * N);
            nt__settle_f32(f, NT_F16, f, N);
            for (int i = 0; i < N; i++)
                assert_int_equal(bitsf(f[i]), bitsf(nt__f16_to_f32(nt__f32_to_f16(src[i]))));
            memcpy(f, src, sizeof(float) * N);
            nt__settle_f32(f, NT_BF16, f, N);
            for (int i = 0; i < N; i++)
                assert_int_equal(bitsf(f[i]), bitsf(nt__bf16_to_f32(nt__f32_to_bf16(src[i]))));
        }
        /* lengths and offsets: the tails, and nothing written past n */
        for (int n = 1; n <= 40; n++)
            for (int off = 0; off < 4; off++) {
                for (int i = 0; i < 64; i++)
                    src[i] = fbits(edges[i % EDGES] ^ (uint32_t)(i * 0x01000193u & 0x7fffu));
                memset(hs, 0xab, 2 * 64);
                memset(h, 0xab, 2 * 64 * ST);
                nt__st_f32((char *)(hs + off), NT_F16, 1, src, n);
                nt__st_f32((char *)(h + off), NT_F16, ST, src, n);
                for (int i = 0; i < 64; i++) {
                    bool in = i >= off && i < off + n;
                    uint16_t w = in ? nt__f32_to_f16(src[i - off]) : 0xababu;
                    if (hs[i] != w)
                        fail_msg("%s: f16 store of %d at offset %d, element %d differs", lab, n,
                                 off, i);
                }
                for (int i = 0; i < 64 * ST; i++) {
                    bool in = i >= off && i < off + n * ST && (i - off) % ST == 0;
                    uint16_t w = in ? nt__f32_to_f16(src[(i - off) / ST]) : 0xababu;
                    if (h[i] != w)
                        fail_msg("%s: strided f16 store of %d at offset %d, element %d differs",
                                 lab, n, off, i);
                }
                for (int i = 0; i < 64; i++)
                    hs[i] = (uint16_t)(0x7c01u + (unsigned)i * 0x0411u); /* NaNs, Inf, all */
                memset(f, 0xab, 4 * 64);
                nt__ld_f32(f + off, (const char *)hs, NT_F16, 1, n);
                for (int i = 0; i < 64; i++) {
                    bool in = i >= off && i < off + n;
                    uint32_t w = in ? bitsf(nt__f16_to_f32(hs[i - off])) : 0xababababu;
                    if (bitsf(f[i]) != w)
                        fail_msg("%s: f16 load of %d at offset %d, element %d differs", lab, n,
                                 off, i);
                }
                for (int bf = 0; bf < 2; bf++) {
                    memset(f, 0xab, 4 * 64);
                    nt__settle_f32(f + off, bf ? NT_BF16 : NT_F16, src, n);
                    for (int i = 0; i < 64; i++) {
                        bool in = i >= off && i < off + n;
                        float r = !in ? 0.0f
                                  : bf ? nt__bf16_to_f32(nt__f32_to_bf16(src[i - off]))
                                       : nt__f16_to_f32(nt__f32_to_f16(src[i - off]));
                        uint32_t w = in ? bitsf(r) : 0xababababu;
                        if (bitsf(f[i]) != w)
                            fail_msg("%s: %s settle of %d at offset %d, element %d differs", lab,
                                     bf ? "bf16" : "f16", n, off, i);
                    }
                }
            }
    }
    assert_true(tested >= 1);
    nt__gemm_set_isa(old);
    free(src);
    free(f);
    free(h);
    free(hs);
}

int main(void)
{
    unsigned a, b, c, d; /* F16C: CPUID.1:ECX bit 29 (clang has no "f16c" cpu_supports name) */
    have_f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_to_bf16_edges),
        cmocka_unit_test(test_f32_to_f16_edges),
        cmocka_unit_test(test_bf16_to_f32_all),
        cmocka_unit_test(test_f16_to_f32_all),
        cmocka_unit_test(test_f64_to_bf16_single_rounding),
        cmocka_unit_test(test_f64_to_f16_single_rounding),
        cmocka_unit_test(test_float_to_int_saturates),
        cmocka_unit_test(test_int_stores_wrap_and_round),
        cmocka_unit_test(test_promote_table),
        cmocka_unit_test(test_load_store_each_dtype),
        cmocka_unit_test(test_block_stores_every_isa),
        cmocka_unit_test(test_block_f16_every_isa),
        cmocka_unit_test(test_f32_to_bf16_every_pattern),
        cmocka_unit_test(test_f32_to_f16_every_pattern),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
