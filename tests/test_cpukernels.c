/* tests/test_cpukernels.c - the CPU backend's eager elementwise and
 * reduction kernels at every vector level (NT_CPU_ISA) and host thread count
 * (NT_CPU_THREADS): the same bits everywhere; and GELU and its backward,
 * over a sweep of the whole f32 bit space, equal to core/ewise.h's scalar
 * definition computed here one element at a time.
 *
 * The CPU backend (NT_BACKEND=cpu: the default, the simulator, would run
 * its own tile programs under the suite's NT_SIM_PROGRAM_VALUES=0), eager
 * mode, so each op runs its own (unfused) kernel: cpu/ewise.c picks a
 * vector level per call and cuts calls of 128K elements or more into spans
 * that two threads share; cpu/attention.c runs its query blocks (forward)
 * and batches (backward) on two threads; its products take row-major
 * operands through nt__gemm_ktile_rowa, checked against nt__gemm_ktile. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "core/dtype.h"
#include "core/ewise.h"
#include "core/gemm.h"
#include "core/reduce.h"
#include "cpu/cpu.h"

static const char *const levels[] = {"scalar", "avx2", "avx512"};
#define NLEVELS 3

/* The scalar definitions, called through volatile pointers so this loop is
 * never vectorised: one element at a time, as written. */
static float s_gelu(float x) { return nt__ew_gelu(x); }
static float s_gelu_bwd(float g, float x) { return nt__ew_gelu_bwd(g, x); }
static float (*volatile const ref_gelu)(float) = s_gelu;
static float (*volatile const ref_gelu_bwd)(float, float) = s_gelu_bwd;

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The first index where a and b differ bitwise, or -1. */
static int64_t first_diff(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (fbits(a[i]) != fbits(b[i]))
            return i;
    return -1;
}

/* Every 2048th f32 bit pattern (both signs, every exponent, subnormals,
 * infinities, NaNs), offset so the patterns are not all round. */
#define SWEEP_STEP 2048u
#define SWEEP_N ((int64_t)(UINT64_C(1) << 32) / SWEEP_STEP)

static void test_gelu_sweep_each_level(void **state)
{
    (void)state;
    int64_t n = SWEEP_N;
    float *x = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
    float *ref = malloc((size_t)n * 4), *ref_b = malloc((size_t)n * 4);
    float *got = malloc((size_t)n * 4);
    assert_true(x && g && ref && ref_b && got);
    for (int64_t i = 0; i < n; i++) {
        x[i] = bitsf((uint32_t)i * SWEEP_STEP + 977u);
        g[i] = (float)((i * 7919) % 2001 - 1000) / 64.0f; /* finite upstream grads */
        ref[i] = nt__canon(ref_gelu(x[i]));
        ref_b[i] = nt__canon(ref_gelu_bwd(g[i], x[i]));
    }
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    int64_t sh[1] = {n};
    int ran = 0;
    for (int l = 0; l < NLEVELS; l++) {
        if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
            continue; /* this CPU does not run it */
        ran++;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *tx = nt_from_host(x, NT_F32, 1, sh);
        nt_tensor *tg = nt_from_host(g, NT_F32, 1, sh);
        assert_int_equal(nt_set_requires_grad(tx, true), 0);
        nt_tensor *y = nt_gelu(tx);
        assert_int_equal(nt_to_host(y, got, (size_t)n * 4), 0);
        int64_t d = first_diff(got, ref, n);
        if (d >= 0)
            fail_msg("%s: gelu(%a) = %08x, the scalar definition %08x", levels[l], (double)x[d],
                     fbits(got[d]), fbits(ref[d]));
        /* d(sum(y * g))/dy = g exactly: the backward runs gelu_bwd(g, x) */
        assert_int_equal(nt_backward(nt_sum(nt_mul(y, tg), NT_DIM_ALL, false)), 0);
        assert_int_equal(nt_to_host(nt_grad(tx), got, (size_t)n * 4), 0);
        d = first_diff(got, ref_b, n);
        if (d >= 0)
            fail_msg("%s: gelu_bwd(%a, %a) = %08x, the scalar definition %08x", levels[l],
                     (double)g[d], (double)x[d], fbits(got[d]), fbits(ref_b[d]));
        nt_scope_end(sc);
    }
    assert_true(ran >= 1); /* scalar always runs */
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    free(x), free(g), free(ref), free(ref_b), free(got);
}

/* Values with every kind of lane: NaNs, infinities, zeros of both signs,
 * subnormals, any bit pattern, ordinary numbers. */
static void mixed_values(float *v, int64_t n, uint64_t seed)
{
    static const uint32_t special[] = {
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000000u,
        0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu, 0x3f800000u,
        0xbf800000u, 0x42b20000u, 0xc2d00000u, 0xc2cf0000u,
    };
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t k = (uint32_t)(s >> 33);
        if (k % 7 == 0)
            v[i] = bitsf(special[(k >> 3) % (sizeof special / sizeof special[0])]);
        else if (k % 7 == 1)
            v[i] = bitsf((uint32_t)(s >> 7));
        else
            v[i] = (float)((double)(k >> 3) / (double)(1u << 28) - 0.5) * 40.0f;
    }
}

/* Rows of 4099 (no multiple of any vector width), 37 of them: 151663
 * elements, three spans of the threaded driver. */
#define R 37
#define C 4099
#define NV (R * C)
#define NOUT 40

/* Every family of cpu/ewise.c and the reductions of cpu/reduce.c, on plain,
 * broadcast and transposed operands; each result widened to f32 into
 * out[k] (NV floats each). */
static void families(nt_tensor *x, nt_tensor *z, nt_tensor *xt, nt_tensor *row, float **out)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *r[NOUT];
    int k = 0;
    nt_tensor *(*const unary[])(nt_tensor *) = {nt_exp, nt_log, nt_sqrt, nt_rsqrt, nt_gelu,
                                                nt_gelu_tanh, nt_sigmoid, nt_tanh, nt_silu,
                                                nt_softplus, nt_mish, nt_softsign,
                                                nt_reciprocal, nt_relu, nt_abs, nt_neg};
    for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++)
        r[k++] = unary[i](x);
    r[k++] = nt_gelu(xt); /* a strided input */
    r[k++] = nt_add_scalar(x, 0.3);
    r[k++] = nt_mul_scalar(z, -1.7);
    r[k++] = nt_pow_scalar(x, 1.5);
    nt_tensor *(*const binary[])(nt_tensor *, nt_tensor *) = {nt_add, nt_sub, nt_mul, nt_div,
                                                              nt_maximum, nt_minimum, nt_pow};
    for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++)
        r[k++] = binary[i](x, z);
    r[k++] = nt_mul(x, row);  /* broadcast */
    r[k++] = nt_add(xt, z);   /* transposed + plain */
    r[k++] = nt_cast(nt_lt(x, z), NT_F32);
    r[k++] = nt_where(nt_gt(x, z), x, row);
    r[k++] = nt_cast(nt_cast(x, NT_BF16), NT_F32);
    r[k++] = nt_cast(nt_cast(z, NT_F16), NT_F32);
    r[k++] = nt_contiguous(xt);
    nt_tensor *f = nt_mul_scalar(x, 1.0); /* a fresh tensor (contiguous(x) is x) */
    assert_int_equal(nt_fill_inplace(f, -2.5), 0);
    r[k++] = f;
    /* reductions over each dim (the column sums run the tile path) */
    r[k++] = nt_sum(x, 0, true);
    r[k++] = nt_sum(z, 1, true);
    r[k++] = nt_sum(xt, 0, true);
    r[k++] = nt_mean(z, 0, true);
    assert_true(k <= NOUT);
    for (int i = 0; i < k; i++) {
        assert_non_null(r[i]);
        int64_t n = nt_numel(r[i]);
        memset(out[i], 0, (size_t)NV * 4);
        assert_int_equal(nt_to_host(r[i], out[i], (size_t)n * 4), 0);
    }
    for (int i = k; i < NOUT; i++)
        memset(out[i], 0, (size_t)NV * 4);
    nt_scope_end(sc);
}

static void test_families_each_level_and_thread_count(void **state)
{
    (void)state;
    float *xv = malloc(NV * 4), *zv = malloc(NV * 4), *rv = malloc(C * 4);
    float *ref[NOUT], *got[NOUT];
    for (int i = 0; i < NOUT; i++) {
        ref[i] = malloc(NV * 4);
        got[i] = malloc(NV * 4);
        assert_true(ref[i] && got[i]);
    }
    mixed_values(xv, NV, 11);
    mixed_values(zv, NV, 22);
    mixed_values(rv, C, 33);
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *z = nt_from_host(zv, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *row = nt_from_host(rv, NT_F32, 2, (int64_t[]){1, C});
    /* xt: a transposed view with z's shape */
    nt_tensor *xt = nt_transpose(nt_from_host(xv, NT_F32, 2, (int64_t[]){C, R}), 0, 1);
    /* the reference: portable loops, one thread */
    assert_int_equal(nt_config_set("NT_CPU_ISA", "scalar"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "1"), 0);
    families(x, z, xt, row, ref);
    static const char *const threads[] = {"1", "2"};
    for (int l = 0; l < NLEVELS; l++) {
        if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
            continue;
        for (int t = 0; t < 2; t++) {
            assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
            families(x, z, xt, row, got);
            for (int i = 0; i < NOUT; i++) {
                int64_t d = first_diff(got[i], ref[i], NV);
                if (d >= 0)
                    fail_msg("%s, %s thread(s): result %d element %lld: %08x, scalar %08x",
                             levels[l], threads[t], i, (long long)d, fbits(got[i][d]),
                             fbits(ref[i][d]));
            }
        }
    }
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    nt_release(x), nt_release(z), nt_release(row), nt_release(xt);
    for (int i = 0; i < NOUT; i++)
        free(ref[i]), free(got[i]);
    free(xv), free(zv), free(rv);
}

/* f32 copies of short rows (cpu/ewise.c, copy_rows_f32: the permuted heads
 * of attention) against the element rule (nt__canon of each source
 * element) and the generic driver, for row lengths around the vector width
 * and past the limit, into a fresh tensor and into a strided view, on one
 * and two threads at every level. */
static void test_short_row_copies(void **state)
{
    (void)state;
    static const int64_t hds[] = {1, 5, 16, 31, 32, 33, 128, 129};
    static const char *const threads[] = {"1", "2"};
    const int64_t B = 3, T = 70, H = 4;
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    for (size_t k = 0; k < sizeof hds / sizeof hds[0]; k++) {
        int64_t hd = hds[k], n = B * T * H * hd, W = hd + 3;
        float *xv = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
        float *got = malloc((size_t)n * 4), *gotv = malloc((size_t)(B * H * T * W) * 4);
        mixed_values(xv, n, 40 + (uint64_t)k);
        /* y[b, h, t, e] = canon(x[b, t, h, e]) */
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t e = 0; e < hd; e++)
                        want[((b * H + h) * T + t) * hd + e] =
                            nt__canon(xv[((b * T + t) * H + h) * hd + e]);
        nt_tensor *x = nt_from_host(xv, NT_F32, 4, (int64_t[]){B, T, H, hd});
        for (int l = 0; l < NLEVELS; l++) {
            if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                continue;
            for (int t = 0; t < 2; t++)
                for (int fast = 0; fast < 2; fast++) {
                    assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
                    __atomic_store_n(&nt__cpu_rowcopy, fast, __ATOMIC_RELAXED);
                    nt_tensor *y = nt_contiguous(nt_transpose(x, 1, 2));
                    assert_int_equal(nt_to_host(y, got, (size_t)n * 4), 0);
                    int64_t d = first_diff(got, want, n);
                    if (d >= 0)
                        fail_msg("hd %lld %s %s thread(s) fast %d: element %lld %08x, want %08x",
                                 (long long)hd, levels[l], threads[t], fast, (long long)d,
                                 fbits(got[d]), fbits(want[d]));
                    /* into columns [1, 1 + hd) of a [B, H, T, hd + 3] tensor */
                    nt_tensor *big = nt_zeros(NT_F32, 4, (int64_t[]){B, H, T, W});
                    assert_int_equal(nt_copy_into(nt_slice(big, 3, 1, 1 + hd, 1),
                                                  nt_transpose(x, 1, 2)), 0);
                    assert_int_equal(nt_to_host(big, gotv, (size_t)(B * H * T * W) * 4), 0);
                    for (int64_t i = 0; i < B * H * T; i++)
                        for (int64_t e = 0; e < W; e++) {
                            float w = e >= 1 && e < 1 + hd ? want[i * hd + e - 1] : 0.0f;
                            if (fbits(gotv[i * W + e]) != fbits(w))
                                fail_msg("hd %lld %s into a view: row %lld col %lld", (long long)hd,
                                         levels[l], (long long)i, (long long)e);
                        }
                    nt_release(y);
                    nt_release(big);
                }
        }
        nt_release(x);
        free(xv), free(want), free(got), free(gotv);
    }
    __atomic_store_n(&nt__cpu_rowcopy, 1, __ATOMIC_RELAXED);
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

/* Sums over a leading dim of at most 16 rows (cpu/reduce.c,
 * cols_small_sum_avx512: each row one lane, the folds in registers) against
 * the canonical order written out (core/reduce.h: lane l = +0 + x_l, folded
 * in halves, added to +0), for 1 to 17 rows, column counts around the
 * vector width, at every level and thread count. */
static void test_small_column_sums(void **state)
{
    (void)state;
    static const int64_t cols[] = {1, 15, 16, 17, 64, 70, 1000};
    static const char *const threads[] = {"1", "2"};
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    for (int64_t n = 1; n <= 17; n++)
        for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
            int64_t w = cols[ci];
            float *xv = malloc((size_t)(n * w) * 4), *want = malloc((size_t)w * 4);
            float *got = malloc((size_t)w * 4);
            mixed_values(xv, n * w, 70 + (uint64_t)(n * 13) + ci);
            for (int64_t j = 0; j < w; j++) {
                float lane[NT_RED_LANES];
                for (int l = 0; l < NT_RED_LANES; l++)
                    lane[l] = 0.0f;
                for (int64_t k = 0; k < n; k++)
                    lane[k % NT_RED_LANES] = lane[k % NT_RED_LANES] + xv[k * w + j];
                for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
                    for (int l = 0; l < h; l++)
                        lane[l] = lane[l] + lane[l + h];
                want[j] = nt__canon(0.0f + lane[0]);
            }
            nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){n, w});
            for (int l = 0; l < NLEVELS; l++) {
                if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                    continue;
                for (int t = 0; t < 2; t++) {
                    assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
                    nt_tensor *y = nt_sum(x, 0, false);
                    assert_int_equal(nt_to_host(y, got, (size_t)w * 4), 0);
                    int64_t d = first_diff(got, want, w);
                    if (d >= 0)
                        fail_msg("n %lld w %lld %s %s thread(s): column %lld %08x, want %08x",
                                 (long long)n, (long long)w, levels[l], threads[t], (long long)d,
                                 fbits(got[d]), fbits(want[d]));
                    nt_release(y);
                }
            }
            nt_release(x);
            free(xv), free(want), free(got);
        }
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

/* Attention forward and backward (causal; with an additive mask; Tq, Tk
 * cutting the 128-key blocks; strided q, k, v): the one-thread scalar bits
 * at every level and thread count. */
static void attention_run(int variant, float *out, int64_t *n_out)
{
    const int64_t B = 3, H = 2, T = variant ? 200 : 130, D = 24;
    nt_tensor *qkv = nt_randn(NT_F32, 3, (int64_t[]){B, T, 3 * H * D}, 9);
    assert_int_equal(nt_set_requires_grad(qkv, true), 0);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *hd[3];
    for (int i = 0; i < 3; i++)
        hd[i] = nt_transpose(nt_reshape(nt_slice(qkv, 2, i * H * D, (i + 1) * H * D, 1), 4,
                                        (int64_t[]){B, T, H, D}),
                             1, 2);
    nt_tensor *mask = NULL;
    if (variant) { /* additive: finite values, and -Inf where r > 1.5 */
        nt_tensor *r = nt_randn(NT_F32, 2, (int64_t[]){T, T}, 4);
        mask = nt_where(nt_gt(r, nt_full(NT_F32, 0, NULL, 1.5)),
                        nt_full(NT_F32, 0, NULL, -INFINITY), nt_mul_scalar(r, 0.5));
    }
    nt_tensor *o = nt_scaled_dot_product_attention(hd[0], hd[1], hd[2], mask, !variant, 0.0);
    assert_non_null(o);
    nt_tensor *w = nt_randn(NT_F32, 4, (int64_t[]){B, H, T, D}, 5);
    assert_int_equal(nt_backward(nt_sum(nt_mul(o, w), NT_DIM_ALL, false)), 0);
    int64_t no = nt_numel(o), ng = nt_numel(qkv);
    assert_int_equal(nt_to_host(o, out, (size_t)no * 4), 0);
    assert_int_equal(nt_to_host(nt_grad(qkv), out + no, (size_t)ng * 4), 0);
    *n_out = no + ng;
    nt_scope_end(sc);
    nt_release(qkv);
}

static void test_attention_each_level_and_thread_count(void **state)
{
    (void)state;
    size_t cap = (size_t)4 * 3 * 200 * 2 * 2 * 24 * 4;
    float *ref = malloc(cap * 4), *got = malloc(cap * 4);
    assert_true(ref && got);
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    static const char *const threads[] = {"1", "2"};
    for (int variant = 0; variant < 2; variant++) {
        int64_t nref, ngot;
        assert_int_equal(nt_config_set("NT_CPU_ISA", "scalar"), 0);
        assert_int_equal(nt_config_set("NT_CPU_THREADS", "1"), 0);
        attention_run(variant, ref, &nref);
        assert_true((size_t)nref <= cap);
        for (int l = 0; l < NLEVELS; l++) {
            if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                continue;
            for (int t = 0; t < 2; t++) {
                assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
                attention_run(variant, got, &ngot);
                assert_int_equal(ngot, nref);
                int64_t d = first_diff(got, ref, nref);
                if (d >= 0)
                    fail_msg("attention %d, %s, %s thread(s): element %lld: %08x, scalar %08x",
                             variant, levels[l], threads[t], (long long)d, fbits(got[d]),
                             fbits(ref[d]));
            }
        }
    }
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    free(ref), free(got);
}

/* nt_fill on f32 and i32 (cpu/ewise.c: zeros by memset, other values by a
 * vector loop of the element's bytes): every element the value's bits,
 * +0 and -0 told apart, a NaN canonical; a span of 151663 elements split
 * over one and two threads. */
static void test_fill_values(void **state)
{
    (void)state;
    static const double vals[] = {0.0, -0.0, -2.5, 1e30, NAN};
    static const char *const threads[] = {"1", "2"};
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    uint32_t *buf = malloc(NV * 4);
    assert_non_null(buf);
    for (int t = 0; t < 2; t++) {
        assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
            nt_tensor *f = nt_zeros(NT_F32, 2, (int64_t[]){R, C});
            nt_tensor *n = nt_zeros(NT_I32, 2, (int64_t[]){R, C});
            assert_non_null(f);
            assert_non_null(n);
            memset(buf, 0xA5, NV * 4);
            assert_int_equal(nt_fill_inplace(f, vals[i]), 0);
            assert_int_equal(nt_to_host(f, buf, NV * 4), 0);
            uint32_t want = isnan(vals[i]) ? 0x7fc00000u : fbits((float)vals[i]);
            for (int64_t e = 0; e < NV; e++)
                if (buf[e] != want)
                    fail_msg("fill f32 %g, %s thread(s): element %lld is %08x, expected %08x",
                             vals[i], threads[t], (long long)e, buf[e], want);
            if (!isnan(vals[i]) && fabs(vals[i]) < 1e9) {
                memset(buf, 0xA5, NV * 4);
                assert_int_equal(nt_fill_inplace(n, vals[i]), 0);
                assert_int_equal(nt_to_host(n, buf, NV * 4), 0);
                uint32_t wi = (uint32_t)(int32_t)vals[i];
                for (int64_t e = 0; e < NV; e++)
                    if (buf[e] != wi)
                        fail_msg("fill i32 %g: element %lld is %08x, expected %08x", vals[i],
                                 (long long)e, buf[e], wi);
            }
            nt_release(f), nt_release(n);
        }
    }
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    free(buf);
}

/* nt__gemm_ktile_rowa (A row-major, as cpu/attention.c passes P, dS, Q and
 * dO) against nt__gemm_ktile on the transposed A: the same bits at every
 * level and thread count, over sizes that leave partial register panels
 * (M, N not multiples of the tile, K not of 4), with A's rows further
 * apart than K, accumulating and not. */
static void test_ktile_rowa_each_level_and_thread_count(void **state)
{
    (void)state;
    static const int shapes[][3] = {{128, 128, 32}, {37, 29, 13}, {1, 1, 1}, {128, 32, 128},
                                    {96, 200, 7}, {5, 64, 128}};
    static const char *const threads[] = {"1", "2"};
    uint32_t seed = 12345;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], lda = K + 3;
        float *A = malloc(sizeof(float) * (size_t)M * lda);
        float *At = malloc(sizeof(float) * (size_t)K * M);
        float *B = malloc(sizeof(float) * (size_t)K * N);
        float *C0 = malloc(sizeof(float) * (size_t)M * N);
        float *ref = malloc(sizeof(float) * (size_t)M * N);
        float *got = malloc(sizeof(float) * (size_t)M * N);
        assert_true(A && At && B && C0 && ref && got);
        for (int64_t i = 0; i < (int64_t)M * lda; i++) {
            seed = seed * 1664525u + 1013904223u;
            A[i] = (float)((int32_t)seed >> 8) * 0x1p-20f;
        }
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++)
                At[(int64_t)k * M + i] = A[(int64_t)i * lda + k];
        for (int64_t i = 0; i < (int64_t)K * N; i++) {
            seed = seed * 1664525u + 1013904223u;
            B[i] = (float)((int32_t)seed >> 8) * 0x1p-21f;
        }
        for (int64_t i = 0; i < (int64_t)M * N; i++) {
            seed = seed * 1664525u + 1013904223u;
            C0[i] = (float)((int32_t)seed >> 8) * 0x1p-19f;
        }
        for (int acc = 0; acc < 2; acc++)
            for (int l = 0; l < NLEVELS; l++) {
                if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                    continue;
                for (int t = 0; t < 2; t++) {
                    assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
                    memcpy(ref, C0, sizeof(float) * (size_t)M * N);
                    memcpy(got, C0, sizeof(float) * (size_t)M * N);
                    nt__gemm_ktile(M, N, K, At, M, B, N, ref, N, acc);
                    nt__gemm_ktile_rowa(M, N, K, A, lda, B, N, got, N, acc);
                    int64_t d = first_diff(got, ref, (int64_t)M * N);
                    if (d >= 0)
                        fail_msg("ktile_rowa %dx%dx%d acc %d, %s, %s thread(s): element "
                                 "%lld: %08x, ktile %08x",
                                 M, N, K, acc, levels[l], threads[t], (long long)d,
                                 fbits(got[d]), fbits(ref[d]));
                }
            }
        /* and the value itself: element (0, 0) summed in double is close */
        double e = 0.0;
        for (int k = 0; k < K; k++)
            e += (double)A[k] * (double)B[(int64_t)k * N];
        nt__gemm_ktile_rowa(M, N, K, A, lda, B, N, got, N, false);
        assert_true(fabs((double)got[0] - e) <= 1e-4 * (1.0 + fabs(e)));
        free(A), free(At), free(B), free(C0), free(ref), free(got);
    }
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
}

/* The row kernels split into blocks of whole rows that two threads share
 * (cpu/reduce.c, cpu/nn.c: nt__rows_range): sums over each dim, max over
 * dim 1, softmax over each dim (dim 0: the tiled path), layer_norm and
 * cross-entropy against their definitions computed here row by row with the
 * canonical reductions of core/reduce.h, at one and two threads.  Ordinary
 * values with a few specials in chosen rows and columns: a NaN (row 3,
 * column 5), +Inf (row 8), a column and a row of -0 (the sums of -0 are
 * +0: the canonical sum starts from +0); NaNs compare as stored
 * (canonical). */
#define RR 300
#define RC 517
static float *col_of(const float *x, int64_t j, float *tmp)
{
    for (int64_t i = 0; i < RR; i++)
        tmp[i] = x[i * RC + j];
    return tmp;
}

static void test_row_kernels_split_match_definitions(void **state)
{
    (void)state;
    const int64_t n = RR * RC;
    float *x = malloc((size_t)n * 4), *w = malloc(RC * 4), *b = malloc(RC * 4);
    float *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4), *tmp = malloc(RR * 4);
    float *u = malloc((size_t)RC * 4);
    int32_t *lab = malloc(RR * 4);
    assert_true(x && w && b && ref && got && tmp && u && lab);
    uint64_t st = 77;
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 40) / (double)(1u << 24) - 0.5) * 12.0f;
    }
    for (int64_t i = 0; i < RR; i++) {
        x[i * RC + 9] = -0.0f; /* a column of -0 */
        lab[i] = (int32_t)((i * 37) % RC);
    }
    for (int64_t j = 0; j < RC; j++) {
        x[11 * RC + j] = -0.0f; /* a row of -0 */
        w[j] = 0.5f + (float)j / 300.0f;
        b[j] = (float)(j % 7) - 3.0f;
    }
    x[3 * RC + 5] = NAN;
    x[8 * RC + 100] = INFINITY;
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    static const char *const threads[] = {"1", "2"};
    for (int t = 0; t < 2; t++) {
        assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *tx = nt_from_host(x, NT_F32, 2, (int64_t[]){RR, RC});
        nt_tensor *tw = nt_from_host(w, NT_F32, 1, (int64_t[]){RC});
        nt_tensor *tb = nt_from_host(b, NT_F32, 1, (int64_t[]){RC});
        nt_tensor *tl = nt_from_host(lab, NT_I32, 1, (int64_t[]){RR});
        for (int k = 0; k < 7; k++) {
            nt_tensor *y = NULL;
            int64_t m = 0;
            switch (k) {
            case 0: /* sum over dim 0: the direct column path */
                y = nt_sum(tx, 0, false), m = RC;
                for (int64_t j = 0; j < RC; j++)
                    ref[j] = nt__red_sum_f32(x + j, RR, RC);
                break;
            case 1:
                y = nt_sum(tx, 1, false), m = RR;
                for (int64_t i = 0; i < RR; i++)
                    ref[i] = nt__red_sum_f32(x + i * RC, RC, 1);
                break;
            case 2: /* max over dim 0: the tiled path */
                y = nt_max(tx, 0, false), m = RC;
                for (int64_t j = 0; j < RC; j++)
                    ref[j] = nt__red_max_f32(col_of(x, j, tmp), RR, 1);
                break;
            case 3:
            case 4: { /* softmax over dim 1, then dim 0 (tiled) */
                int d = k == 3 ? 1 : 0;
                y = nt_softmax(tx, d), m = n;
                int64_t rows = d ? RR : RC, len = d ? RC : RR;
                for (int64_t r = 0; r < rows; r++) {
                    for (int64_t e = 0; e < len; e++)
                        u[e] = d ? x[r * RC + e] : x[e * RC + r];
                    float mx = nt__red_max_f32(u, len, 1);
                    for (int64_t e = 0; e < len; e++)
                        u[e] = nt__ew_exp(nt__ew_sub(u[e], mx));
                    float sm = nt__red_sum_f32(u, len, 1);
                    for (int64_t e = 0; e < len; e++)
                        ref[d ? r * RC + e : e * RC + r] = nt__ew_div(u[e], sm);
                }
                break;
            }
            case 5:
                y = nt_layer_norm(tx, tw, tb, 1e-5), m = n;
                for (int64_t i = 0; i < RR; i++) {
                    const float *xr = x + i * RC;
                    float mean = nt__red_sum_f32(xr, RC, 1) / (float)RC;
                    for (int64_t j = 0; j < RC; j++)
                        u[j] = xr[j] - mean;
                    float *sq = ref + i * RC; /* d * d, then the output */
                    for (int64_t j = 0; j < RC; j++)
                        sq[j] = u[j] * u[j];
                    float r = nt__ew_rsqrt(nt__red_sum_f32(sq, RC, 1) / (float)RC + 1e-5f);
                    for (int64_t j = 0; j < RC; j++)
                        sq[j] = u[j] * r * w[j] + b[j];
                }
                break;
            case 6: { /* mean nll over rows: row 3's NaN makes it NaN, so rows 12.. */
                nt_tensor *xs = nt_slice(tx, 0, 12, RR, 1), *ls = nt_slice(tl, 0, 12, RR, 1);
                y = nt_cross_entropy(xs, ls), m = 1;
                for (int64_t i = 12; i < RR; i++) {
                    const float *xr = x + i * RC;
                    float mx = nt__red_max_f32(xr, RC, 1);
                    for (int64_t j = 0; j < RC; j++)
                        u[j] = nt__ew_exp(xr[j] - mx);
                    float lse = nt__ew_log(nt__red_sum_f32(u, RC, 1));
                    tmp[i - 12] = -((xr[lab[i]] - mx) - lse);
                }
                ref[0] = nt__red_sum_f32(tmp, RR - 12, 1) / (float)(RR - 12);
                break;
            }
            }
            assert_non_null(y);
            assert_int_equal(nt_to_host(y, got, (size_t)m * 4), 0);
            for (int64_t i = 0; i < m; i++)
                ref[i] = nt__canon(ref[i]); /* stored NaNs are canonical */
            int64_t d = first_diff(got, ref, m);
            if (d >= 0)
                fail_msg("row kernel %d, %s thread(s): element %lld: %08x, definition %08x", k,
                         threads[t], (long long)d, fbits(got[d]), fbits(ref[d]));
        }
        if (t == 0) { /* the specials did what the header says */
            nt_tensor *s0 = nt_sum(tx, 0, false), *s1 = nt_sum(tx, 1, false);
            float v0[RC], v1[RR];
            assert_int_equal(nt_to_host(s0, v0, sizeof v0), 0);
            assert_int_equal(nt_to_host(s1, v1, sizeof v1), 0);
            assert_int_equal(fbits(v1[11]), 0u); /* -0s sum to +0 */
            assert_true(isnan(v0[5]) && isnan(v1[3]) && isinf(v1[8]));
        }
        nt_scope_end(sc);
    }
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    free(x), free(w), free(b), free(ref), free(got), free(tmp), free(u), free(lab);
}

/* Pooling's kernels (issue 33): the window copy of a 2x2 pool (rows of OW
 * gathered with stride 2) and its gradient's copy back (rows of 2 walked
 * as rows of OW, scattered), by copy_rows_f32 and by the driver, against
 * nt__canon of each source element; and nt_max / nt_min over a short
 * middle dim (cpu/reduce.c's column-wise lanes) against the canonical
 * strided reduction of each column, and nt_where / compares on a u8
 * condition with contiguous or broadcast values, with NaN, +-Inf and -0
 * among the values, on one and two threads. */
static void test_pool_copies_and_short_dim_max(void **state)
{
    (void)state;
    static const int64_t ows[] = {3, 14, 17, 40};
    static const char *const threads[] = {"1", "2"};
    const int64_t N = 3, NC = 5, OH = 7;
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    for (size_t q = 0; q < sizeof ows / sizeof ows[0]; q++) {
        int64_t OW = ows[q], n = N * NC * OH * 2 * OW * 2, L = OH * OW;
        float *xv = malloc((size_t)n * 4), *want = malloc((size_t)n * 4), *back = malloc((size_t)n * 4);
        float *got = malloc((size_t)n * 4), *wmx = malloc((size_t)(N * NC * L) * 4);
        float *wmn = malloc((size_t)(N * NC * L) * 4);
        mixed_values(xv, n, 70 + (uint64_t)q);
        /* want [N, NC, a, b, oh, ow] = x [N, NC, oh, a, ow, b]; back the inverse of want */
        for (int64_t nc = 0; nc < N * NC; nc++)
            for (int64_t a = 0; a < 2; a++)
                for (int64_t b = 0; b < 2; b++)
                    for (int64_t i = 0; i < L; i++) {
                        int64_t oh = i / OW, ow = i % OW;
                        int64_t src = ((nc * OH + oh) * 2 + a) * OW * 2 + ow * 2 + b;
                        int64_t dst = (nc * 4 + a * 2 + b) * L + i;
                        want[dst] = nt__canon(xv[src]);
                        back[src] = nt__canon(xv[dst]);
                    }
        for (int64_t j = 0; j < N * NC * L; j++) {
            int64_t nc = j / L, i = j % L;
            wmx[j] = nt__red_max_f32(want + nc * 4 * L + i, 4, L);
            wmn[j] = nt__red_min_f32(want + nc * 4 * L + i, 4, L);
        }
        nt_tensor *x = nt_from_host(xv, NT_F32, 6, (int64_t[]){N, NC, OH, 2, OW, 2});
        nt_tensor *xb = nt_from_host(xv, NT_F32, 6, (int64_t[]){N, NC, 2, 2, OH, OW});
        for (int t = 0; t < 2 * NLEVELS; t++)
            for (int fast = 0; fast < 2; fast++) {
                if (nt_config_set("NT_CPU_ISA", levels[t / 2]) != 0)
                    continue;
                nt_scope *sc = nt_scope_begin();
                assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t % 2]), 0);
                __atomic_store_n(&nt__cpu_rowcopy, fast, __ATOMIC_RELAXED);
                nt_tensor *y = nt_contiguous(nt_permute(x, (const int[]){0, 1, 3, 5, 2, 4}));
                assert_int_equal(nt_to_host(y, got, (size_t)n * 4), 0);
                int64_t d = first_diff(got, want, n);
                if (d >= 0)
                    fail_msg("OW %lld fast %d: window copy element %lld", (long long)OW, fast, (long long)d);
                nt_tensor *z = nt_contiguous(nt_permute(xb, (const int[]){0, 1, 4, 2, 5, 3}));
                assert_int_equal(nt_to_host(z, got, (size_t)n * 4), 0);
                if ((d = first_diff(got, back, n)) >= 0)
                    fail_msg("OW %lld fast %d: copy back element %lld", (long long)OW, fast, (long long)d);
                nt_tensor *w = nt_reshape(y, 4, (int64_t[]){N, NC, 4, L});
                assert_int_equal(nt_to_host(nt_max(w, 2, false), got, (size_t)(N * NC * L) * 4), 0);
                if ((d = first_diff(got, wmx, N * NC * L)) >= 0)
                    fail_msg("OW %lld: max over the slots, element %lld", (long long)OW, (long long)d);
                assert_int_equal(nt_to_host(nt_min(w, 2, false), got, (size_t)(N * NC * L) * 4), 0);
                if ((d = first_diff(got, wmn, N * NC * L)) >= 0)
                    fail_msg("OW %lld: min over the slots, element %lld", (long long)OW, (long long)d);
                /* where on a u8 condition (cpu/ewise.c, where_u8_f32): values
                 * contiguous or one broadcast element, either side */
                nt_tensor *cond = nt_gt(y, xb), *k2 = nt_full(NT_F32, 0, NULL, 2.5);
                nt_tensor *sel[3] = {nt_where(cond, y, xb), nt_where(cond, y, k2), nt_where(cond, k2, xb)};
                /* compares into u8 (cmp_f32_u8): contiguous, broadcast either side */
                nt_tensor *cm[3] = {nt_ne(xb, xb), nt_eq(y, k2), nt_lt(k2, y)};
                uint8_t *cb = malloc((size_t)n);
                for (int e = 0; e < 3; e++) {
                    assert_int_equal(nt_to_host(cm[e], cb, (size_t)n), 0);
                    for (int64_t i = 0; i < n; i++) {
                        int r = e == 0 ? xv[i] != xv[i] : e == 1 ? want[i] == 2.5f : 2.5f < want[i];
                        if (cb[i] != r)
                            fail_msg("OW %lld: compare %d element %lld", (long long)OW, e, (long long)i);
                    }
                }
                free(cb);
                for (int e = 0; e < 3; e++) {
                    assert_int_equal(nt_to_host(sel[e], got, (size_t)n * 4), 0);
                    for (int64_t i = 0; i < n; i++) {
                        float a = e == 2 ? 2.5f : want[i], b = e == 1 ? 2.5f : xv[i];
                        float r = nt__canon(want[i] > xv[i] ? a : b);
                        if (fbits(got[i]) != fbits(r))
                            fail_msg("OW %lld: where %d element %lld", (long long)OW, e, (long long)i);
                    }
                }
                nt_scope_end(sc);
            }
        nt_release(x), nt_release(xb);
        free(xv), free(want), free(back), free(got), free(wmx), free(wmn);
    }
    __atomic_store_n(&nt__cpu_rowcopy, 1, __ATOMIC_RELAXED);
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gelu_sweep_each_level, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_families_each_level_and_thread_count,
                                        nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_attention_each_level_and_thread_count,
                                        nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_ktile_rowa_each_level_and_thread_count,
                                        nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fill_values, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_short_row_copies, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_pool_copies_and_short_dim_max, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_small_column_sums, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_row_kernels_split_match_definitions, nt_test_setup,
                                        nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
