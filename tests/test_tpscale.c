/* tests/test_tpscale.c - the simulator paths added to make the tensor-
 * parallel block scale (docs/parallel.md, "What it costs"): each gives the
 * bits of the path it replaces and of the CPU backend.
 *
 * - A float reduction over a dim whose one row is the whole contiguous
 *   tensor (a replicated loss: the mean of a 1-D [T*D]) runs as the
 *   all-elements reduction (neuron/reduce.c, red_one_row): against row 0
 *   of a two-row tensor (the row path), the CPU backend and a double sum.
 * - An elementwise input constant along the tile (a scalar gradient
 *   expanded over a mean's input) is loaded as one column and spread on
 *   chip (neuron/ew.c, plan.bcok): against the same op on the expanded
 *   tensor made contiguous first, and the CPU.
 * - A^T x B over four or more N-chunks (a weight gradient over few tokens)
 *   takes the block program instead of the streaming one
 *   (neuron/tp_matmul.c): against the CPU and a double product.
 * - ZeRO-3 gathers every bucket before copying any out (dist/ddp.c,
 *   zero_gather): parameters after SGD steps the same bits as stage 0,
 *   gathering all layers in one call or one call per layer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"

static int setup(void **state) { return nt_test_setup(state); }
static int teardown(void **state) { return nt_test_teardown(state); }

static void bits_of(nt_tensor *t, uint32_t *v, int64_t n)
{
    if (!t)
        fail_msg("no tensor: %s", nt_last_error_message());
    nt_tensor *f = nt_cast(t, NT_F32); /* exact widening */
    if (!f)
        fail_msg("cast: %s", nt_last_error_message());
    assert_int_equal(nt_numel(f), n);
    assert_int_equal(nt_to_host(f, v, (size_t)n * 4), 0);
}

/* n values of mixed magnitudes and signs (order-sensitive sums), some
 * edge values when asked. */
static float *vals(int64_t n, uint64_t seed, bool edges)
{
    float *v = malloc(sizeof *v * (size_t)n);
    assert_non_null(v);
    nt_test_fill(v, (size_t)n, &seed);
    for (int64_t i = 0; i < n; i++)
        v[i] = ldexpf(v[i], (int)(i % 11) - 5);
    if (edges && n > 4100) {
        v[3] = -0.0f, v[2050] = 1e-40f, v[4099] = -3e38f;
    }
    return v;
}

/* ---------------- the one-row reduction ---------------- */

/* op 0 sum, 1 mean, 2 max of x (1-D, n elements) over dim 0 */
static nt_tensor *red(int op, nt_tensor *x, int dim)
{
    return op == 0 ? nt_sum(x, dim, false)
           : op == 1 ? nt_mean(x, dim, false)
                     : nt_amax(x, 1, (int[]){dim}, false);
}

static void one_row_case(int64_t n, nt_dtype dt, int op, bool edges)
{
    float *v = vals(2 * n, 77u + (uint64_t)n, edges);
    uint32_t want = 0;
    /* a double reference of the f32 widened values (sum/mean: within the
     * f32 rounding of n terms; max: exact) */
    double ref = op == 2 ? -INFINITY : 0, mag = 0;
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        nt_tensor *x2 = nt_cast(nt_from_host(v, NT_F32, 2, (int64_t[]){2, n}), dt);
        assert_non_null(x2);
        nt_tensor *x1 = nt_contiguous(nt_reshape(nt_slice(x2, 0, 0, 1, 1), 1, (int64_t[]){n}));
        uint32_t one, row[2];
        bits_of(red(op, x1, 0), &one, 1);
        bits_of(red(op, x2, 1), row, 2); /* two rows: the row path */
        if (one != row[0])
            fail_msg("n %lld %s op %d cfg %d: one row %08x, row path %08x", (long long)n,
                     nt_dtype_name(dt), op, k, one, row[0]);
        if (k == 0) {
            want = one;
            float *w = malloc(sizeof *w * (size_t)n);
            assert_non_null(w);
            assert_int_equal(nt_to_host(nt_cast(x1, NT_F32), w, (size_t)n * 4), 0);
            for (int64_t i = 0; i < n; i++) {
                ref = op == 2 ? fmax(ref, w[i]) : ref + w[i];
                mag += fabs(w[i]);
            }
            free(w);
            if (op == 1)
                ref /= (double)n, mag /= (double)n;
        } else if (one != want) {
            fail_msg("n %lld %s op %d: cfg %d gives %08x, cpu %08x", (long long)n,
                     nt_dtype_name(dt), op, k, one, want);
        }
        nt_release(x2);
        nt_release(x1);
    }
    float got;
    memcpy(&got, &want, 4);
    /* rounded to dt once at the end; each f32 step is one rounding */
    double tol = op == 2 ? 0 : mag * ((double)n * 0x1p-24 + (dt == NT_F32 ? 0x1p-24 : 0x1p-8));
    if (fabs((double)got - ref) > tol + (dt == NT_F32 ? 0 : fabs(ref) * 0x1p-8))
        fail_msg("n %lld %s op %d: %.9g, reference %.9g (tol %.3g)", (long long)n,
                 nt_dtype_name(dt), op, got, ref, tol);
    free(v);
}

static void test_one_row_reduce(void **state)
{
    (void)state;
    static const int64_t ns[] = {2049, 3 * 2048 + 5, 128 * 2048 + 7, 300000};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int op = 0; op < 3; op++) {
            one_row_case(ns[i], NT_F32, op, i == 1);
            one_row_case(ns[i], NT_BF16, op, i == 1);
        }
    nt_test_cfg(0);
}

/* ---------------- the spread column ---------------- */

/* f(expand(s)) with f a scalar op, a unary op or a binary op with a full
 * tensor, against f(contiguous(expand(s))) and the CPU. */
static void spread_case(nt_dtype dt, float sv, int f)
{
    const int64_t R = 300, C = 1031, n = R * C;
    float *w = vals(n, 5u, false);
    uint32_t *a = malloc(4 * (size_t)n), *b = malloc(4 * (size_t)n), *c0 = malloc(4 * (size_t)n);
    assert_true(a && b && c0);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        nt_tensor *s = nt_cast(nt_from_host(&sv, NT_F32, 2, (int64_t[]){1, 1}), dt);
        nt_tensor *e = nt_expand(s, 2, (int64_t[]){R, C});
        nt_tensor *ec = nt_contiguous(e);
        nt_tensor *full = nt_cast(nt_from_host(w, NT_F32, 2, (int64_t[]){R, C}), dt);
        assert_true(s && e && ec && full);
        nt_tensor *y1 = f == 0 ? nt_div_scalar(e, 2048.0) : f == 1 ? nt_exp(e) : nt_mul(full, e);
        nt_tensor *y2 = f == 0 ? nt_div_scalar(ec, 2048.0) : f == 1 ? nt_exp(ec) : nt_mul(full, ec);
        bits_of(y1, a, n);
        bits_of(y2, b, n);
        for (int64_t i = 0; i < n; i++)
            if (a[i] != b[i])
                fail_msg("%s f %d cfg %d: element %lld %08x expanded, %08x contiguous",
                         nt_dtype_name(dt), f, k, (long long)i, a[i], b[i]);
        if (k == 0)
            memcpy(c0, a, 4 * (size_t)n);
        else if (memcmp(c0, a, 4 * (size_t)n))
            fail_msg("%s f %d: cfg %d differs from the CPU", nt_dtype_name(dt), f, k);
        nt_tensor *ts[] = {s, e, ec, full, y1, y2};
        for (int j = 0; j < 6; j++)
            nt_release(ts[j]);
    }
    /* the value: f32 arithmetic on the scalar, rounded to dt */
    float x;
    memcpy(&x, &c0[n / 2], 4);
    float sd;
    uint32_t sb;
    bits_of(nt_cast(nt_from_host(&sv, NT_F32, 0, NULL), dt), &sb, 1);
    memcpy(&sd, &sb, 4);
    if (f == 0 && !isnan(sv))
        assert_true(x == sd / 2048.0f || dt != NT_F32);
    if (isnan(sv))
        assert_true(c0[0] == 0x7fc00000u); /* canonical */
    free(a), free(b), free(c0), free(w);
}

static void test_spread_column(void **state)
{
    (void)state;
    static const float sv[] = {0.75f, -1.0f / 3.0f, -0.0f, 1e-41f, INFINITY};
    for (int f = 0; f < 3; f++)
        for (size_t i = 0; i < sizeof sv / sizeof sv[0]; i++) {
            spread_case(NT_F32, sv[i], f);
            spread_case(NT_BF16, sv[i], f);
        }
    spread_case(NT_F32, NAN, 0);
    nt_test_cfg(0);
}

/* The replicated loss of bench/tp: mean over a 1-D view of [T, D] and its
 * backward, the same bits on every backend and mode. */
static void test_loss_backward(void **state)
{
    (void)state;
    const int64_t T = 64, D = 1024;
    float *v = vals(T * D, 9u, false);
    uint32_t *g = malloc(4 * (size_t)(T * D)), *g0 = malloc(4 * (size_t)(T * D)), l0 = 0;
    assert_true(g && g0);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        nt_tensor *x = nt_cast(nt_from_host(v, NT_F32, 2, (int64_t[]){T, D}), NT_BF16);
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        nt_tensor *l = nt_mean(nt_reshape(nt_mul_scalar(x, 3.0), 1, (int64_t[]){-1}), 0, false);
        uint32_t lb;
        bits_of(l, &lb, 1);
        assert_int_equal(nt_backward(l), 0);
        bits_of(nt_grad(x), g, T * D);
        if (k == 0) {
            l0 = lb;
            memcpy(g0, g, 4 * (size_t)(T * D));
        } else {
            assert_int_equal(lb, l0);
            assert_memory_equal(g, g0, 4 * (size_t)(T * D));
        }
        nt_release(x);
    }
    float gv;
    memcpy(&gv, &g0[5], 4);
    /* 3 * (1 / 65536) rounded to bf16 twice: exact */
    assert_true(gv == 3.0f / 65536.0f);
    free(v), free(g), free(g0);
    nt_test_cfg(0);
}

/* ---------------- A^T x B, the block program ---------------- */

static void at_b_case(int64_t T, int64_t M, int64_t N)
{
    float *g = vals(T * M, 3u, false), *h = vals(T * N, 4u, false);
    uint32_t *c = malloc(4 * (size_t)(M * N)), *c0 = malloc(4 * (size_t)(M * N));
    assert_true(c && c0);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        nt_tensor *a = nt_cast(nt_from_host(g, NT_F32, 2, (int64_t[]){T, M}), NT_BF16);
        nt_tensor *b = nt_cast(nt_from_host(h, NT_F32, 2, (int64_t[]){T, N}), NT_BF16);
        nt_tensor *y = nt_matmul(nt_transpose(a, 0, 1), b);
        bits_of(y, c, M * N);
        if (k == 0)
            memcpy(c0, c, 4 * (size_t)(M * N));
        else if (memcmp(c, c0, 4 * (size_t)(M * N)))
            fail_msg("[%lld, %lld]^T x [%lld, %lld]: cfg %d differs from the CPU", (long long)T,
                     (long long)M, (long long)T, (long long)N, k);
        nt_release(a), nt_release(b), nt_release(y);
    }
    /* a few elements against a double product of the bf16 operands: f32
     * accumulation of T terms, then one bf16 rounding */
    for (int64_t e = 0; e < M * N; e += M * N / 7 + 1) {
        int64_t i = e / N, j = e % N;
        double ref = 0, mag = 0;
        for (int64_t t = 0; t < T; t++) {
            uint32_t ua, ub;
            memcpy(&ua, &g[t * M + i], 4), memcpy(&ub, &h[t * N + j], 4);
            ua = (ua + 0x7fffu + ((ua >> 16) & 1u)) & 0xffff0000u; /* to bf16, nearest even */
            ub = (ub + 0x7fffu + ((ub >> 16) & 1u)) & 0xffff0000u;
            float fa, fb;
            memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
            ref += (double)fa * fb, mag += fabs((double)fa * fb);
        }
        float got;
        memcpy(&got, &c0[e], 4);
        assert_true(fabs(got - ref) <= fabs(ref) * 0x1p-8 + mag * (double)T * 0x1p-24);
    }
    free(g), free(h), free(c), free(c0);
}

static void test_at_b_block(void **state)
{
    (void)state;
    at_b_case(512, 1024, 2048); /* 4 N-chunks: the block program */
    at_b_case(200, 384, 2560);  /* partial K- and N-tiles */
    at_b_case(64, 1024, 512);   /* one N-chunk: still streamed */
    nt_test_cfg(0);
}

/* ---------------- ZeRO-3: every gather before the copies ---------------- */

enum { ZIN = 24, ZHID = 40, ZOUT = 6, ZB = 16, ZSH = 4 };

/* CRC-like hash of the parameters after 2 SGD steps of a 3-layer MLP on
 * 4 cores at stage `stage`; stage 3 gathers in one call (`one`) or per
 * layer. */
static uint32_t zero_run(int stage, bool one)
{
    int devs[ZSH] = {0, 1, 2, 3};
    int64_t sh[6][2] = {{ZHID, ZIN}, {ZHID, 0}, {ZHID, ZHID}, {ZHID, 0}, {ZOUT, ZHID}, {ZOUT, 0}};
    nt_tensor *p[6];
    for (int j = 0; j < 6; j++) {
        float *v = vals(sh[j][0] * (sh[j][1] ? sh[j][1] : 1), 50u + (uint64_t)j, false);
        p[j] = nt_from_host(v, NT_F32, sh[j][1] ? 2 : 1, sh[j]);
        assert_non_null(p[j]);
        assert_int_equal(nt_set_requires_grad(p[j], true), 0);
        free(v);
    }
    nt_ddp *d = nt_ddp_create(p, 6, ZSH, devs, ZSH);
    assert_non_null(d);
    assert_int_equal(nt_ddp_set_zero(d, stage), 0);
    for (int j = 0; j < 6; j++)
        nt_release(p[j]);
    nt_optim *o[ZSH];
    for (int i = 0; i < ZSH; i++) {
        assert_int_equal(nt_device_set(i), 0);
        o[i] = nt_optim_sgd(stage ? nt_ddp_zero_shards(d, i) : nt_ddp_params(d, i), 6, 0.1, 0.0,
                            0.0, false);
        assert_non_null(o[i]);
    }
    float *x = vals(ZB * ZSH * ZIN, 7u, false);
    int32_t y[ZB * ZSH];
    for (int i = 0; i < ZB * ZSH; i++)
        y[i] = (i * 7) % ZOUT;
    for (int step = 0; step < 2; step++) {
        if (stage == 3 && one)
            assert_int_equal(nt_ddp_gather(d, 0, 6), 0);
        for (int l = 0; l < 3 && stage == 3 && !one; l++)
            assert_int_equal(nt_ddp_gather(d, 2 * l, 2 * l + 2), 0);
        for (int s = 0; s < ZSH; s++) {
            int dev = nt_ddp_shard_device(d, s);
            assert_int_equal(nt_device_set(dev), 0);
            nt_scope *sc = nt_scope_begin();
            nt_tensor **q = nt_ddp_params(d, dev);
            nt_tensor *xs = nt_ddp_shard_from_host(d, s, x, NT_F32, 2,
                                                   (int64_t[]){ZB * ZSH, ZIN});
            nt_tensor *ys = nt_ddp_shard_from_host(d, s, y, NT_I32, 1, (int64_t[]){ZB * ZSH});
            nt_tensor *h = nt_relu(nt_linear(xs, q[0], q[1]));
            h = nt_relu(nt_linear(h, q[2], q[3]));
            nt_tensor *loss = nt_cross_entropy(nt_linear(h, q[4], q[5]), ys);
            assert_int_equal(nt_ddp_backward(d, s, loss), 0);
            nt_scope_end(sc);
        }
        assert_int_equal(nt_ddp_reduce(d), 0);
        assert_int_equal(nt_ddp_step(d, o, ZSH), 0);
    }
    if (stage == 3)
        assert_int_equal(nt_ddp_gather(d, 0, 6), 0);
    uint32_t hsh = 2166136261u;
    assert_int_equal(nt_device_set(0), 0);
    nt_tensor **q = nt_ddp_params(d, 0);
    for (int j = 0; j < 6; j++) {
        int64_t n = nt_numel(q[j]);
        uint32_t *b = malloc(4 * (size_t)n);
        assert_non_null(b);
        bits_of(q[j], b, n);
        for (int64_t i = 0; i < n; i++)
            hsh = (hsh ^ b[i]) * 16777619u;
        free(b);
    }
    for (int i = 0; i < ZSH; i++)
        nt_optim_destroy(o[i]);
    nt_ddp_destroy(d);
    free(x);
    assert_int_equal(nt_device_set(0), 0);
    return hsh;
}

static void test_zero3_gather(void **state)
{
    (void)state;
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        uint32_t h0 = zero_run(0, false), h1 = zero_run(3, true), h2 = zero_run(3, false);
        if (h1 != h0 || h2 != h0)
            fail_msg("cfg %d: stage 0 %08x, stage 3 one gather %08x, per layer %08x", k, h0, h1,
                     h2);
    }
    nt_test_cfg(0);
}

static int setup4(void **state)
{
    setenv("NT_SIM_CORES", "4", 1);
    return nt_test_setup(state);
}
static int teardown4(void **state)
{
    int rc = nt_test_teardown(state);
    unsetenv("NT_SIM_CORES");
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_row_reduce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spread_column, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_backward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_at_b_block, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero3_gather, setup4, teardown4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
