/* tests/test_fp8perf.c - the fused paths of fp8 autocast under delayed
 * scaling (amp/fp8.c, docs/amp.md "fp8 autocast"): one rounding pass per
 * operand that also yields its amax and the backward's rounding, the scale
 * products made once per region, the backward reusing the forward's
 * roundings.  Each is checked bit for bit against the unfused sequence
 * written here with public ops (nt_mul, nt_cast, nt_clamp, nt_matmul_fp8:
 * what autocast issued before), the recorded amaxes against max |x|
 * computed here in double, on both backends and in every mode, op by op
 * and captured. */
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

enum { M = 6, K = 20, N = 7 };

/* a [2, 3, K] (so a is reshaped to [M, K]), b [K, N]: values of many
 * magnitudes; `edge` adds +-0, a subnormal, values past e4m3's max (they
 * saturate), and with `nan` a NaN in a. */
static void make_inputs(float *a, float *b, float *c, int edge, uint64_t seed)
{
    uint64_t st = seed;
    for (int i = 0; i < M * K; i++)
        a[i] = nt_test_uniform(&st) * ldexpf(1.0f, (int)(nt_test_rand32(&st) % 9) - 4);
    for (int i = 0; i < K * N; i++)
        b[i] = nt_test_uniform(&st) * 0.25f;
    /* the output gradient: small integers times 2^-3, exact in bf16 */
    for (int i = 0; i < M * N; i++)
        c[i] = (float)((int)(nt_test_rand32(&st) % 17) - 8) * 0.125f;
    if (edge) {
        a[0] = 0.0f;
        a[1] = -0.0f;
        a[2] = 1e-40f;
        a[3] = 3000.0f;
        a[4] = -1e30f;
        b[5] = 700.0f;
        c[3] = -96.0f;
    }
    if (edge == 2)
        a[7] = NAN;
}

/* max |v[0, n)| in double, NaN if any is NaN */
static float ref_amax(const float *v, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(v[i]))
            return NAN;
        m = fmax(m, fabs((double)v[i]));
    }
    return (float)m;
}

/* The unfused rounding: e(clamp(f32(x * s), +-fmax)) */
static nt_tensor *ref_quant(nt_tensor *x, nt_tensor *s, nt_dtype dt)
{
    double fm = dt == NT_E5M2 ? 57344.0 : 448.0;
    nt_tensor *t = nt_mul(x, s);
    if (nt_dtype_of(t) != NT_F32)
        t = nt_cast(t, NT_F32);
    return nt_cast(nt_clamp(t, -fm, fm), dt);
}

typedef struct run {
    uint32_t y[M * N], da[M * K], db[K * N]; /* bits */
    float amax[2][3];                       /* the step's amaxes of a, b, g per step */
    float scale[3];                         /* the scales after the last update */
} run;

static void bits_of(nt_tensor *t, uint32_t *out, int n)
{
    nt_tensor *f = nt_cast(t, NT_F32);
    assert_non_null(f);
    assert_int_equal(nt_to_host(f, out, (size_t)n * 4), 0);
}

static void state_row3(nt_fp8_recipe *r, int which, float *out)
{
    nt_tensor *s = nt_fp8_recipe_state(r, 0, which);
    assert_non_null(s);
    float v[3];
    assert_int_equal(nt_to_host(nt_narrow(s, 0, 0, 3), v, sizeof v), 0);
    memcpy(out, v, sizeof v);
}

/* One training step of y = a @ b under fp8 autocast: loss = sum(y * c),
 * backward; the step's amaxes read; the update.  Returns y (bf16). */
static nt_tensor *fp8_step(nt_fp8_recipe *r, nt_tensor *a, nt_tensor *b, nt_tensor *c,
                           bool update_before_backward)
{
    assert_int_equal(nt_fp8_autocast_begin(r), 0);
    nt_tensor *y = nt_matmul(a, b);
    assert_non_null(y);
    assert_int_equal(nt_autocast_end(), 0);
    nt_tensor *loss = nt_sum(nt_mul(nt_cast(y, NT_F32), c), NT_DIM_ALL, false);
    if (!loss)
        fail_msg("loss: %s", nt_last_error_message());
    if (update_before_backward)
        assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
    if (nt_backward(loss))
        fail_msg("nt_backward: %s", nt_last_error_message());
    return y;
}

/* The same step by the unfused sequence with scales s[3] (host values
 * read from the recipe) */
static void ref_step(const float *s3, nt_tensor *a, nt_tensor *b, nt_tensor *c, nt_dtype gdt,
                     run *out)
{
    nt_no_grad_begin();
    nt_tensor *sc[3], *iv[3];
    for (int i = 0; i < 3; i++) {
        sc[i] = nt_from_host(&s3[i], NT_F32, 1, (int64_t[]){1});
        iv[i] = nt_reciprocal(sc[i]);
    }
    nt_tensor *a2 = nt_reshape(a, 2, (int64_t[]){M, K});
    nt_tensor *y = nt_matmul_fp8(ref_quant(a2, sc[0], NT_E4M3), ref_quant(b, sc[1], NT_E4M3),
                                 iv[0], iv[1], NT_BF16);
    assert_non_null(y);
    bits_of(y, out->y, M * N);
    /* the gradient reaching the node: c in y's dtype (bf16, exact) */
    nt_tensor *g = nt_reshape(nt_cast(c, NT_BF16), 2, (int64_t[]){M, N});
    nt_tensor *qg = ref_quant(g, sc[2], gdt);
    nt_tensor *da = nt_matmul_fp8(qg, nt_transpose(ref_quant(b, sc[1], gdt), 0, 1), iv[2], iv[1],
                                  NT_F32);
    nt_tensor *db = nt_matmul_fp8(nt_transpose(ref_quant(a2, sc[0], gdt), 0, 1), qg, iv[0], iv[2],
                                  NT_F32);
    assert_non_null(da);
    assert_non_null(db);
    bits_of(da, out->da, M * K);
    bits_of(db, out->db, K * N);
    nt_no_grad_end();
}

/* Two steps (scales 1, then the scales the first step's amaxes give) in
 * configuration cfg, fused (the autocast) and unfused (ref_step); every
 * result compared bit for bit, the amaxes against max |x|. */
/* with b_t, b is the transpose of a leaf w [N, K] (what nt_linear passes:
 * the weight's pass reads w in its own layout) */
static bool b_t;

static void two_steps(int cfg, nt_fp8_format fmt, int edge, bool capture, run *got)
{
    nt_test_cfg(cfg);
    float av[M * K], bv[K * N], cv[M * N];
    make_inputs(av, bv, cv, edge, 7 + (uint64_t)edge);
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, fmt, 4, 0};
    nt_fp8_recipe *r = nt_fp8_recipe_create(&o);
    assert_non_null(r);
    nt_tensor *a = nt_test_leaf(av, 3, (int64_t[]){2, 3, K});
    nt_tensor *w = NULL, *b;
    if (b_t) {
        float wv[N * K];
        for (int i = 0; i < K; i++)
            for (int j = 0; j < N; j++)
                wv[j * K + i] = bv[i * N + j];
        w = nt_test_leaf(wv, 2, (int64_t[]){N, K});
        b = nt_transpose(w, 0, 1);
    } else {
        b = nt_test_leaf(bv, 2, (int64_t[]){K, N});
    }
    nt_tensor *c = nt_from_host(cv, NT_F32, 3, (int64_t[]){2, 3, N});
    nt_dtype gdt = fmt == NT_FP8_HYBRID ? NT_E5M2 : NT_E4M3;
    float want_am[3] = {ref_amax(av, M * K), ref_amax(bv, K * N), ref_amax(cv, M * N)};
    for (int step = 0; step < 2; step++) {
        float s3[3] = {1, 1, 1};
        if (step)
            state_row3(r, 0, s3);
        if (w) /* a fresh view each step: the last one's node went with its backward */
            b = nt_transpose(w, 0, 1);
        nt_zero_grad(a);
        nt_zero_grad(w ? w : b);
        nt_tensor *y;
        if (capture && step == 1) {
            /* the second step recorded, then replayed: the replay's bits */
            assert_int_equal(nt_graph_capture_begin(), 0);
            y = fp8_step(r, a, b, c, false);
            nt_graph *gr = nt_graph_capture_end();
            assert_non_null(gr);
            nt_zero_grad(a);
            nt_zero_grad(w ? w : b);
            assert_int_equal(nt_graph_replay(gr), 0);
            assert_int_equal(nt_sync(), 0);
            nt_graph_destroy(gr);
        } else {
            y = fp8_step(r, a, b, c, false);
        }
        run want;
        ref_step(s3, a, b, c, gdt, &want);
        bits_of(y, got->y, M * N);
        bits_of(nt_grad(a), got->da, M * K);
        bits_of(w ? nt_transpose(nt_grad(w), 0, 1) : nt_grad(b), got->db, K * N);
        assert_memory_equal(got->y, want.y, sizeof want.y);
        assert_memory_equal(got->da, want.da, sizeof want.da);
        assert_memory_equal(got->db, want.db, sizeof want.db);
        state_row3(r, 2, got->amax[step]);
        for (int i = 0; i < 3; i++) {
            float am = want_am[i];
            if (isnan(am))
                assert_true(isnan(got->amax[step][i]));
            else
                assert_int_equal(nt_test_ubits(got->amax[step][i]), nt_test_ubits(am));
        }
        assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
    }
    state_row3(r, 0, got->scale);
    nt_fp8_recipe_destroy(r);
}

/* Every configuration gives the unfused sequence's bits, and the same
 * bits as every other configuration. */
static void all_cfgs(nt_fp8_format fmt, int edge, bool capture)
{
    run first, got;
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        assert_int_equal(nt_init(), 0);
        two_steps(k, fmt, edge, capture, &got);
        nt_shutdown();
        if (!k)
            first = got;
        else if (edge != 2 && memcmp(&first, &got, sizeof got)) /* NaN: the payload may differ */
            fail_msg("configuration %s/%s differs from %s/%s", NT_TEST_CFGS[k][0],
                     NT_TEST_CFGS[k][1], NT_TEST_CFGS[0][0], NT_TEST_CFGS[0][1]);
    }
}

static void test_hybrid(void **state)
{
    (void)state;
    all_cfgs(NT_FP8_HYBRID, 0, false);
}

static void test_hybrid_edges(void **state)
{
    (void)state;
    all_cfgs(NT_FP8_HYBRID, 1, false);
}

static void test_hybrid_nan(void **state)
{
    (void)state;
    all_cfgs(NT_FP8_HYBRID, 2, false);
}

static void test_e4m3_all(void **state)
{
    (void)state;
    all_cfgs(NT_FP8_E4M3_ALL, 1, false);
}

static void test_weight_transposed(void **state)
{
    (void)state;
    b_t = true;
    all_cfgs(NT_FP8_HYBRID, 1, false);
    all_cfgs(NT_FP8_E4M3_ALL, 0, false);
    all_cfgs(NT_FP8_HYBRID, 0, true);
    b_t = false;
}

static void test_captured(void **state)
{
    (void)state;
    all_cfgs(NT_FP8_HYBRID, 1, true);
    all_cfgs(NT_FP8_E4M3_ALL, 0, true);
}

/* An update between a forward and its backward: the backward uses the new
 * scales (as the unfused sequence, which rounds again, does), not the
 * forward's roundings. */
static void test_update_between(void **state)
{
    (void)state;
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        assert_int_equal(nt_init(), 0);
        nt_test_cfg(k);
        float av[M * K], bv[K * N], cv[M * N];
        make_inputs(av, bv, cv, 1, 11);
        nt_fp8_recipe *r = nt_fp8_recipe_create(NULL);
        nt_tensor *a = nt_test_leaf(av, 3, (int64_t[]){2, 3, K});
        nt_tensor *b = nt_test_leaf(bv, 2, (int64_t[]){K, N});
        nt_tensor *c = nt_from_host(cv, NT_F32, 3, (int64_t[]){2, 3, N});
        fp8_step(r, a, b, c, false);
        assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
        float s0[3], s1[3];
        state_row3(r, 0, s0);
        nt_zero_grad(a);
        nt_zero_grad(b);
        /* forward with s0; an update (the a and b rows move to their
         * amaxes' scales again, the gradient's from its amax); backward */
        nt_tensor *y = fp8_step(r, a, b, c, true);
        state_row3(r, 0, s1);
        run want, got;
        ref_step(s0, a, b, c, NT_E5M2, &want);
        bits_of(y, got.y, M * N);
        assert_memory_equal(got.y, want.y, sizeof want.y);
        /* the backward's scales: s1 for all three rows */
        ref_step(s1, a, b, c, NT_E5M2, &want);
        bits_of(nt_grad(a), got.da, M * K);
        bits_of(nt_grad(b), got.db, K * N);
        assert_memory_equal(got.da, want.da, sizeof want.da);
        assert_memory_equal(got.db, want.db, sizeof want.db);
        nt_fp8_recipe_destroy(r);
        nt_shutdown();
    }
}

/* An evaluation forward (no grad) between a training forward and its
 * backward, and two training forwards before one backward: each node's
 * backward gets its own forward's roundings. */
static void test_interleaved(void **state)
{
    (void)state;
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        assert_int_equal(nt_init(), 0);
        nt_test_cfg(k);
        float av[M * K], bv[K * N], cv[M * N], av2[M * K], bv2[K * N], cv2[M * N];
        make_inputs(av, bv, cv, 0, 3);
        make_inputs(av2, bv2, cv2, 1, 5);
        nt_fp8_recipe *r = nt_fp8_recipe_create(NULL);
        nt_tensor *a = nt_test_leaf(av, 3, (int64_t[]){2, 3, K});
        nt_tensor *a2 = nt_test_leaf(av2, 3, (int64_t[]){2, 3, K});
        nt_tensor *b = nt_test_leaf(bv, 2, (int64_t[]){K, N});
        nt_tensor *c = nt_from_host(cv, NT_F32, 3, (int64_t[]){2, 3, N});
        fp8_step(r, a, b, c, false); /* scales past 1 */
        assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
        float s[3];
        state_row3(r, 0, s);
        nt_zero_grad(a);
        nt_zero_grad(a2);
        nt_zero_grad(b);
        assert_int_equal(nt_fp8_autocast_begin(r), 0);
        nt_tensor *y1 = nt_matmul(a, b);
        assert_int_equal(nt_autocast_end(), 0);
        assert_int_equal(nt_fp8_autocast_begin(r), 0);
        nt_tensor *y2 = nt_matmul(a2, b); /* slot 0 again: another node */
        assert_int_equal(nt_autocast_end(), 0);
        nt_no_grad_begin();
        assert_int_equal(nt_fp8_autocast_begin(r), 0);
        assert_non_null(nt_matmul(a2, b));
        assert_int_equal(nt_autocast_end(), 0);
        nt_no_grad_end();
        nt_tensor *l1 = nt_sum(nt_mul(nt_cast(y1, NT_F32), c), NT_DIM_ALL, false);
        nt_tensor *l2 = nt_sum(nt_mul(nt_cast(y2, NT_F32), c), NT_DIM_ALL, false);
        assert_int_equal(nt_backward(l2), 0);
        assert_int_equal(nt_backward(l1), 0);
        run want, got;
        ref_step(s, a, b, c, NT_E5M2, &want);
        bits_of(nt_grad(a), got.da, M * K);
        assert_memory_equal(got.da, want.da, sizeof want.da);
        uint32_t db1[K * N];
        memcpy(db1, want.db, sizeof db1);
        ref_step(s, a2, b, c, NT_E5M2, &want);
        bits_of(nt_grad(a2), got.da, M * K);
        assert_memory_equal(got.da, want.da, sizeof want.da);
        /* b's gradient: the sum of the two nodes' */
        nt_tensor *w1 = nt_from_host(db1, NT_F32, 2, (int64_t[]){K, N});
        nt_tensor *w2 = nt_from_host(want.db, NT_F32, 2, (int64_t[]){K, N});
        uint32_t wsum[K * N], gsum[K * N];
        bits_of(nt_add(w2, w1), wsum, K * N);
        bits_of(nt_grad(b), gsum, K * N);
        assert_memory_equal(gsum, wsum, sizeof wsum);
        nt_fp8_recipe_destroy(r);
        nt_shutdown();
    }
}

/* What the fusion buys on the simulator (lazy mode): a training step
 * of the autocast matmul (forward, backward, the step's amaxes) runs fewer
 * kernels than the unfused sequence (three
 * infinity norms, the five roundings, the three fp8 products with their
 * scale products), which gives the same bits (test_hybrid). */
static void test_fewer_kernels(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_test_cfg(5); /* sim, lazy, fusion on: adaptive batches depend on timing */
    float av[M * K], bv[K * N], cv[M * N];
    make_inputs(av, bv, cv, 0, 9);
    nt_fp8_recipe *r = nt_fp8_recipe_create(NULL);
    nt_tensor *a = nt_test_leaf(av, 3, (int64_t[]){2, 3, K});
    nt_tensor *b = nt_test_leaf(bv, 2, (int64_t[]){K, N});
    nt_tensor *c = nt_from_host(cv, NT_F32, 3, (int64_t[]){2, 3, N});
    fp8_step(r, a, b, c, false); /* the slot, its state, the kernels compiled */
    assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
    float s3[3];
    state_row3(r, 0, s3);
    run want;
    ref_step(s3, a, b, c, NT_E5M2, &want); /* compiled too */
    nt_stats st0, st1, st2;
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_stats_get(&st0), 0);
    run got; /* read back as ref_step reads its results */
    bits_of(fp8_step(r, a, b, c, false), got.y, M * N);
    bits_of(nt_grad(a), got.da, M * K);
    bits_of(nt_grad(b), got.db, K * N);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_stats_get(&st1), 0);
    nt_no_grad_begin();
    nt_tensor *am[3] = {nt_norm(a, INFINITY, NT_DIM_ALL, false),
                        nt_norm(b, INFINITY, NT_DIM_ALL, false),
                        nt_norm(c, INFINITY, NT_DIM_ALL, false)};
    nt_no_grad_end();
    for (int i = 0; i < 3; i++)
        assert_non_null(am[i]);
    ref_step(s3, a, b, c, NT_E5M2, &want);
    /* the loss and its backward up to the node, as fp8_step has them */
    nt_tensor *y = nt_cast(nt_from_host(want.y, NT_F32, 3, (int64_t[]){2, 3, N}), NT_BF16);
    nt_set_requires_grad(y, true);
    assert_int_equal(nt_backward(nt_sum(nt_mul(nt_cast(y, NT_F32), c), NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_stats_get(&st2), 0);
    uint64_t kf = st1.sim_kernels - st0.sim_kernels, ku = st2.sim_kernels - st1.sim_kernels;
    uint64_t bf = st1.sim_hbm_bytes - st0.sim_hbm_bytes, bu = st2.sim_hbm_bytes - st1.sim_hbm_bytes;
    print_message("# fused step: %llu kernels, %llu HBM bytes; unfused: %llu kernels, %llu bytes\n",
                  (unsigned long long)kf, (unsigned long long)bf, (unsigned long long)ku,
                  (unsigned long long)bu);
    assert_true(kf < ku); /* (the bytes are printed: on shapes this small the fixed
                             costs make their difference too thin to assert) */
    nt_fp8_recipe_destroy(r);
    nt_shutdown();
}

/* Kernels of one training forward (with `bwd`, also its backward) of
 * nt_linear(a, w, bias) under fp8 autocast (bias NULL: none), after a step
 * that made the slot and compiled the kernels; y's bits in *yb. */
static uint64_t linear_kernels(nt_fp8_recipe *r, nt_tensor *a, nt_tensor *w, nt_tensor *bias,
                               nt_tensor *c, bool bwd, uint32_t *yb)
{
    nt_stats s0, s1;
    for (int it = 0; it < 2; it++) {
        nt_zero_grad(a);
        nt_zero_grad(w);
        assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_stats_get(&s0), 0);
        assert_int_equal(nt_fp8_autocast_begin(r), 0);
        nt_tensor *y = nt_linear(a, w, bias);
        assert_non_null(y);
        assert_int_equal(nt_autocast_end(), 0);
        if (bwd)
            assert_int_equal(nt_backward(nt_sum(nt_mul(nt_cast(y, NT_F32), c), NT_DIM_ALL,
                                                false)), 0);
        assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_stats_get(&s1), 0);
        if (yb)
            bits_of(y, yb, M * N);
    }
    return s1.sim_kernels - s0.sim_kernels;
}

/* nt_linear under fp8 autocast on the simulator (lazy mode): the
 * product keeps a's leading dims, so the bias add joins the matmul's
 * epilogue (the forward runs no more kernels than without a bias) with the
 * bits of the unfused sequence (the fp8 product, then the bf16 add); the
 * weight's gradient is made in w's own layout (the backward of x . w^T runs
 * as many kernels as that of x . b with b a [K, N] leaf: no transposing
 * copy), with the reference's bits (test_weight_transposed checks those in
 * every configuration). */
static void test_linear_epilogue(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_test_cfg(5); /* sim, lazy, fusion on: adaptive batches depend on timing */
    float av[M * K], bv[K * N], cv[M * N], wv[N * K], biasv[N];
    make_inputs(av, bv, cv, 0, 13);
    for (int i = 0; i < K; i++)
        for (int j = 0; j < N; j++)
            wv[j * K + i] = bv[i * N + j];
    for (int j = 0; j < N; j++)
        biasv[j] = (float)(j - 3) * 0.375f;
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, 4, 0};
    nt_fp8_recipe *r = nt_fp8_recipe_create(&o);
    nt_tensor *a = nt_test_leaf(av, 3, (int64_t[]){2, 3, K});
    nt_tensor *w = nt_test_leaf(wv, 2, (int64_t[]){N, K});
    nt_tensor *b = nt_test_leaf(bv, 2, (int64_t[]){K, N});
    /* in bf16 already: autocast casts an f32 bias first, one more kernel */
    nt_tensor *bias = nt_cast(nt_from_host(biasv, NT_F32, 1, (int64_t[]){N}), NT_BF16);
    nt_tensor *c = nt_from_host(cv, NT_F32, 3, (int64_t[]){2, 3, N});
    /* scales past 1 first (the same every step after: no update below) */
    nt_tensor *y0 = fp8_step(r, a, nt_transpose(w, 0, 1), c, false);
    assert_non_null(y0);
    assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
    float s3[3];
    state_row3(r, 0, s3);
    uint32_t yb[M * N], yn[M * N];
    uint64_t kb = linear_kernels(r, a, w, bias, c, false, yb);
    uint64_t kn = linear_kernels(r, a, w, NULL, c, false, yn);
    print_message("# fp8 nt_linear forward: %llu kernels with a bias, %llu without\n",
                  (unsigned long long)kb, (unsigned long long)kn);
    /* the scale products of the region, the two rounding passes (one
     * foreach kernel), their amaxes joined to the step's (one), the product
     * with its epilogue (and the bias add) */
    assert_int_equal(kn, 4);
    assert_int_equal(kb, kn);
    /* the bits: the unfused product (ref_step), then the bias added in bf16 */
    run want;
    ref_step(s3, a, b, c, NT_E5M2, &want);
    assert_memory_equal(yn, want.y, sizeof yn);
    nt_no_grad_begin();
    nt_tensor *yr = nt_add(nt_cast(nt_from_host(want.y, NT_F32, 2, (int64_t[]){M, N}), NT_BF16),
                           bias);
    nt_no_grad_end();
    uint32_t ywant[M * N];
    bits_of(yr, ywant, M * N);
    assert_memory_equal(yb, ywant, sizeof yb);
    /* the backward: x . w^T against x . b, b a [K, N] leaf (each with its
     * forward, run the same way) */
    uint64_t kt = linear_kernels(r, a, w, NULL, c, true, NULL);
    nt_stats s0, s1;
    uint64_t kl = 0;
    for (int it = 0; it < 2; it++) {
        nt_zero_grad(a);
        nt_zero_grad(b);
        assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_stats_get(&s0), 0);
        assert_int_equal(nt_fp8_autocast_begin(r), 0);
        nt_tensor *y = nt_matmul(a, b);
        assert_int_equal(nt_autocast_end(), 0);
        assert_int_equal(nt_backward(nt_sum(nt_mul(nt_cast(y, NT_F32), c), NT_DIM_ALL, false)),
                         0);
        assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_stats_get(&s1), 0);
        kl = s1.sim_kernels - s0.sim_kernels;
    }
    print_message("# fp8 step of x . w^T: %llu kernels; of x . b (a [K, N] leaf): %llu\n",
                  (unsigned long long)kt, (unsigned long long)kl);
    assert_true(kt > 0);
    assert_true(kt <= kl);
    uint32_t db[K * N];
    bits_of(nt_transpose(nt_grad(w), 0, 1), db, K * N);
    assert_memory_equal(db, want.db, sizeof db);
    nt_fp8_recipe_destroy(r);
    nt_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid),         cmocka_unit_test(test_hybrid_edges),
        cmocka_unit_test(test_hybrid_nan),     cmocka_unit_test(test_e4m3_all),
        cmocka_unit_test(test_captured),       cmocka_unit_test(test_weight_transposed),
        cmocka_unit_test(test_update_between),
        cmocka_unit_test(test_interleaved),    cmocka_unit_test(test_fewer_kernels),
        cmocka_unit_test(test_linear_epilogue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
