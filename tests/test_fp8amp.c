/* tests/test_fp8amp.c - fp8 autocast with scaling (amp/fp8.c, dist/fp8.c,
 * docs/amp.md "fp8 autocast"): the delayed-scaling update (amax pushed
 * after use, window max, fp8 max / amax / 2^margin, the previous scale kept
 * for an amax of 0, Inf or NaN) against a reference computed here; the
 * step's amaxes against the inputs'; the forward's values against an fp8
 * rounding written here; every error path; and a small model's parameters
 * after AdamW steps bit-identical on 1, 2 and 4 cores (data parallel, the
 * amaxes reduced with MAX over the replicas), in every mode, captured and
 * op by op, on both backends.
 *
 * NT_SIM_CORES is read by nt_init, so the runs are child processes of this
 * test (it re-executes itself with --child and the case's environment),
 * each printing a CRC-32 of its parameters (tests/ddp_harness.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#define BENCH_NAME "tests/test_fp8amp"
#include "ddp_harness.h"

/* ---------------- references ---------------- */

/* v rounded to nearest even on a format with `mbits` mantissa bits, least
 * normal exponent emin, saturated to +-fmax (the casts autocast makes
 * saturate first); NaN stays NaN. */
static double ref_fp8(double v, int mbits, int emin, double fmax)
{
    if (isnan(v))
        return v;
    double a = fabs(v);
    if (a > fmax)
        a = fmax;
    int e = a > 0 ? (int)floor(log2(a)) : emin;
    if (e < emin)
        e = emin;
    double q = ldexp(1.0, e - mbits);
    double k = a / q, f = floor(k), r = k - f;
    if (r > 0.5 || (r == 0.5 && fmod(f, 2.0) != 0.0))
        f += 1.0;
    double out = f * q;
    if (out > fmax)
        out = fmax;
    return v < 0 ? -out : out;
}
static double ref_e4m3(double v) { return ref_fp8(v, 3, -6, 448.0); }

/* The max of a window, NaN if any is NaN. */
static float ref_window_max(const float *h, int n)
{
    float m = h[0];
    for (int i = 0; i < n; i++) {
        if (isnan(h[i]))
            return NAN;
        if (h[i] > m)
            m = h[i];
    }
    return m;
}

/* The delayed scale from a window max m: (fmax / m) / 2^margin computed in
 * double and rounded once to f32 (a quotient of two floats rounded to
 * double then to float is the correctly rounded float quotient), kept from
 * `old` unless positive and finite. */
static float ref_scale(float m, double fmax, int margin, float old)
{
    float sf = (float)(fmax / (double)m * ldexp(1.0, -margin));
    return sf > 0.0f && sf < INFINITY ? sf : old;
}

/* ---------------- the scale update against the reference ---------------- */

enum { UM = 4, UK = 8, UN = 6, UHIST = 3, UMARGIN = 1 };

static float host_amax(const float *v, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(v[i]))
            return NAN;
        if (fabsf(v[i]) > m)
            m = fabsf(v[i]);
    }
    return m;
}

static void read_f32(nt_tensor *t, float *dst, size_t n)
{
    assert_non_null(t);
    assert_int_equal(nt_to_host(t, dst, n * sizeof *dst), 0);
}

/* One training step of y = x w^T under recipe r, loss sum(y * c): the
 * step's amaxes must be those of x, w and c (the output gradient). */
static void update_step(nt_fp8_recipe *r, nt_tensor *w, const float *xv, const float *cv,
                        float *amax_out)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){UM, UK});
    nt_tensor *c = nt_from_host(cv, NT_F32, 2, (int64_t[]){UM, UN});
    assert_int_equal(nt_fp8_autocast_begin(r), 0);
    assert_ptr_equal(nt_fp8_autocast_recipe(), r);
    assert_int_equal(nt_autocast_dtype(), NT_BF16);
    nt_tensor *y = nt_linear(x, w, NULL);
    assert_non_null(y);
    assert_int_equal(nt_dtype_of(y), NT_BF16);
    nt_tensor *loss = nt_sum(nt_mul(y, c), NT_DIM_ALL, false);
    assert_int_equal(nt_autocast_end(), 0);
    assert_null(nt_fp8_autocast_recipe());
    assert_int_equal(nt_backward(loss), 0);
    read_f32(nt_fp8_recipe_state(r, 0, 2), amax_out, 3);
    nt_scope_end(sc);
}

static void test_scale_update_reference(void **state)
{
    (void)state;
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, UHIST, UMARGIN};
    nt_fp8_recipe *r = nt_fp8_recipe_create(&o);
    assert_non_null(r);
    float wv[UN * UK], cv[UM * UN], xv[UM * UK];
    uint64_t seed = 7;
    for (int i = 0; i < UN * UK; i++)
        wv[i] = nt_test_uniform(&seed) * 0.5f;
    for (int i = 0; i < UM * UN; i++)
        cv[i] = (float)((i % 5) - 2); /* amax 2, exact in bf16 */
    nt_tensor *w = nt_test_leaf(wv, 2, (int64_t[]){UN, UK});
    float wmax = host_amax(wv, UN * UK);
    /* x's amax per step: ordinary, larger, 0, Inf, NaN, then ordinary again
     * until the Inf and NaN have left the window of 3 */
    const float xmax[] = {3.0f, 100.0f, 0.0f, INFINITY, NAN, 5.0f, 7.0f, 2.0f, 0.25f};
    const int nsteps = (int)(sizeof xmax / sizeof xmax[0]);
    float hist[3][UHIST] = {{0}}, scale[3] = {1, 1, 1};
    const double fmax[3] = {448.0, 448.0, 57344.0};
    for (int s = 0; s < nsteps; s++) {
        for (int i = 0; i < UM * UK; i++)
            xv[i] = xmax[s] * (float)((i * 7 % 9) - 4) / 4.0f; /* max |.| = xmax */
        if (isinf(xmax[s]) || isnan(xmax[s]))
            for (int i = 0; i < UM * UK; i++)
                xv[i] = (float)((i % 3) - 1); /* one non-finite element below */
        if (isinf(xmax[s]))
            xv[5] = -INFINITY;
        if (isnan(xmax[s]))
            xv[5] = NAN;
        float am[3];
        update_step(r, w, xv, cv, am);
        float want[3] = {host_amax(xv, UM * UK), wmax, 2.0f};
        for (int i = 0; i < 3; i++)
            if (!(am[i] == want[i] || (isnan(am[i]) && isnan(want[i]))))
                fail_msg("step %d row %d: the step's amax is %g, want %g", s, i, am[i], want[i]);
        assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
        /* the reference: push, window max, rescale */
        for (int i = 0; i < 3; i++) {
            memmove(&hist[i][1], &hist[i][0], (UHIST - 1) * sizeof(float));
            hist[i][0] = want[i];
            scale[i] = ref_scale(ref_window_max(hist[i], UHIST), fmax[i], UMARGIN, scale[i]);
        }
        float got_s[3], got_h[3 * UHIST], got_p[3];
        read_f32(nt_fp8_recipe_state(r, 0, 0), got_s, 3);
        read_f32(nt_fp8_recipe_state(r, 0, 1), got_h, 3 * UHIST);
        read_f32(nt_fp8_recipe_state(r, 0, 2), got_p, 3);
        for (int i = 0; i < 3; i++) {
            if (nt_test_ubits(got_s[i]) != nt_test_ubits(scale[i]))
                fail_msg("step %d row %d: scale %a, reference %a", s, i, got_s[i], scale[i]);
            assert_true(got_p[i] == 0.0f); /* cleared for the next step */
            for (int j = 0; j < UHIST; j++) {
                float g = got_h[i * UHIST + j], e = hist[i][j];
                if (!(g == e || (isnan(g) && isnan(e))))
                    fail_msg("step %d row %d: history[%d] %g, reference %g", s, i, j, g, e);
            }
        }
        /* a non-finite or zero window max keeps the scale: it never becomes
         * 0, Inf or NaN */
        for (int i = 0; i < 3; i++)
            assert_true(scale[i] > 0.0f && scale[i] < INFINITY);
    }
    assert_int_equal(nt_fp8_recipe_slots(r, 0), 1);
    nt_release(w);
    nt_fp8_recipe_destroy(r);
}

/* History 1, margin 0: an amax whose scale overflows (fmax / 1e-39 > f32
 * max) keeps the previous scale; so does 0. */
static void test_scale_overflow_keeps(void **state)
{
    (void)state;
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_E4M3_ALL, 1, 0};
    nt_fp8_recipe *r = nt_fp8_recipe_create(&o);
    float wv[UN * UK], cv[UM * UN], xv[UM * UK];
    for (int i = 0; i < UN * UK; i++)
        wv[i] = (float)((i % 7) - 3) / 8.0f;
    for (int i = 0; i < UM * UN; i++)
        cv[i] = 1.0f;
    nt_tensor *w = nt_test_leaf(wv, 2, (int64_t[]){UN, UK});
    const float xmax[] = {2.0f, 1e-39f, 0.0f, 4.0f};
    float scale = 1.0f;
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < UM * UK; i++)
            xv[i] = i == 3 ? xmax[s] : 0.0f;
        float am[3];
        update_step(r, w, xv, cv, am);
        assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
        scale = ref_scale(xmax[s], 448.0, 0, scale);
        float got[3];
        read_f32(nt_fp8_recipe_state(r, 0, 0), got, 3);
        if (nt_test_ubits(got[0]) != nt_test_ubits(scale))
            fail_msg("step %d: scale %a, reference %a", s, got[0], scale);
        /* the gradient row of an e4m3-only recipe uses 448 too */
        assert_true(got[2] == ref_scale(1.0f, 448.0, 0, 1.0f));
    }
    assert_true(scale == 112.0f); /* 448 / 4 */
    nt_release(w);
    nt_fp8_recipe_destroy(r);
}

/* The first step (scales 1) of y = x w^T with operands that e4m3 holds
 * exactly and sums that f32 holds exactly: y must be the exact product
 * rounded to bf16; with values e4m3 does not hold, x and w are rounded to
 * e4m3 first (the reference rounds them here). */
static void test_forward_values(void **state)
{
    (void)state;
    enum { M = 5, K = 16, N = 3 };
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        nt_fp8_recipe *r = nt_fp8_recipe_create(NULL);
        float xv[M * K], wv[N * K];
        uint64_t seed = 99;
        for (int i = 0; i < M * K; i++)
            xv[i] = nt_test_uniform(&seed) * 3.0f;
        for (int i = 0; i < N * K; i++)
            wv[i] = nt_test_uniform(&seed) * 0.75f;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){M, K});
        nt_tensor *w = nt_from_host(wv, NT_F32, 2, (int64_t[]){N, K});
        assert_int_equal(nt_fp8_autocast_begin(r), 0);
        nt_tensor *y = nt_linear(x, w, NULL);
        assert_int_equal(nt_autocast_end(), 0);
        nt_tensor *y32 = nt_cast(y, NT_F32);
        float yv[M * N];
        read_f32(y32, yv, M * N);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int t = 0; t < K; t++)
                    s += ref_e4m3(xv[i * K + t]) * ref_e4m3(wv[j * K + t]);
                /* e4m3 products are exact in f32 and the sum of 16 of them
                 * with these magnitudes is within 2^-10 relative of the
                 * exact one; bf16 rounding dominates */
                double tol = fabs(s) * 0x1p-8 + 1e-6;
                if (fabs(yv[i * N + j] - s) > tol)
                    fail_msg("cfg %d y[%d,%d] = %.9g, reference %.9g", k, i, j, yv[i * N + j],
                             s);
            }
        nt_scope_end(sc);
        nt_fp8_recipe_destroy(r);
    }
}

/* ---------------- errors ---------------- */

static void test_bad_input(void **state)
{
    (void)state;
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, 0, 0};
    assert_null(nt_fp8_recipe_create(&o));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_fp8_recipe_create", "amax_history_len");
    o.amax_history_len = 4097;
    assert_null(nt_fp8_recipe_create(&o));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "amax_history_len", "1..4096");
    o.amax_history_len = 4;
    o.margin = -1;
    assert_null(nt_fp8_recipe_create(&o));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_fp8_recipe_create", "margin");
    o.margin = 33;
    assert_null(nt_fp8_recipe_create(&o));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "margin");
    o.margin = 0;
    o.scaling = (nt_fp8_scaling)7;
    assert_null(nt_fp8_recipe_create(&o));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "scaling");
    o.scaling = NT_FP8_DELAYED;
    o.format = (nt_fp8_format)-1;
    assert_null(nt_fp8_recipe_create(&o));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "format");

    /* NULL and destroyed recipes */
    nt_test_expect_err(nt_fp8_autocast_begin(NULL), NT_EINVAL, "nt_fp8_autocast_begin", "'r'");
    nt_test_expect_err(nt_fp8_recipe_update(NULL, NULL), NT_EINVAL, "nt_fp8_recipe_update");
    assert_int_equal(nt_fp8_recipe_slots(NULL, 0), -1);
    nt_test_expect_err(NT_EINVAL, NT_EINVAL, "nt_fp8_recipe_slots");
    nt_fp8_recipe *dead = nt_fp8_recipe_create(NULL);
    nt_fp8_recipe_destroy(dead);
    nt_test_expect_err(nt_fp8_autocast_begin(dead), NT_EINVAL, "nt_fp8_autocast_begin");
    nt_fp8_recipe_destroy(dead);
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_fp8_recipe_destroy");
    nt_fp8_recipe_destroy(NULL); /* no-op */
    assert_int_equal(nt_last_error(), 0);

    nt_fp8_recipe *r = nt_fp8_recipe_create(NULL);
    assert_non_null(r);
    /* state before any fp8 matmul, bad device, bad which */
    assert_null(nt_fp8_recipe_state(r, 0, 0));
    nt_test_expect_err(nt_last_error(), NT_ESTATE, "nt_fp8_recipe_state", "no fp8 matmul");
    assert_null(nt_fp8_recipe_state(r, 99, 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_fp8_recipe_state", "'dev'");
    assert_null(nt_fp8_recipe_state(r, 0, 3));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_fp8_recipe_state", "'which'");
    assert_int_equal(nt_fp8_recipe_slots(r, -1), -1);
    nt_test_expect_err(NT_EINVAL, NT_EINVAL, "nt_fp8_recipe_slots", "'dev'");
    assert_int_equal(nt_fp8_recipe_slots(r, 0), 0);
    /* an update before any matmul is a no-op; with a communicator whose
     * device ran none, an error */
    assert_int_equal(nt_fp8_recipe_update(r, NULL), 0);
    nt_comm *comm = nt_comm_create((int[]){0}, 1);
    assert_non_null(comm);
    nt_test_expect_err(nt_fp8_recipe_update(r, comm), NT_ESTATE, "nt_fp8_recipe_update",
                       "device 0 ran no fp8 matmul");

    nt_scope *sc = nt_scope_begin();
    float v[64];
    for (int i = 0; i < 64; i++)
        v[i] = (float)(i % 9) / 8.0f - 0.5f;
    nt_tensor *x = nt_from_host(v, NT_F32, 2, (int64_t[]){4, 8});
    nt_tensor *w = nt_from_host(v, NT_F32, 2, (int64_t[]){8, 8});
    nt_tensor *q = nt_from_host(v, NT_F32, 3, (int64_t[]){2, 4, 8});
    assert_int_equal(nt_fp8_autocast_begin(r), 0);
    /* a batched product has no fp8 kernel here: it runs in bf16 (the
     * documented upcast), as under nt_autocast_begin(NT_BF16) */
    nt_tensor *att = nt_matmul(q, nt_transpose(q, 1, 2));
    assert_non_null(att);
    assert_int_equal(nt_dtype_of(att), NT_BF16);
    assert_int_equal(nt_fp8_recipe_slots(r, 0), 0);
    /* a bad operand is nt_matmul's error, as outside the region */
    assert_null(nt_matmul(x, NULL));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_matmul", "'b'");
    nt_tensor *bad = nt_from_host(v, NT_F32, 2, (int64_t[]){5, 8});
    assert_null(nt_matmul(x, bad));
    nt_test_expect_err(nt_last_error(), NT_ESHAPE, "nt_matmul");
    /* too many fp8 matmuls in one region */
    nt_tensor *wt = nt_transpose(w, 0, 1);
    for (int i = 0; i < 256; i++) {
        nt_scope *s2 = nt_scope_begin();
        assert_non_null(nt_matmul(x, wt));
        nt_scope_end(s2);
    }
    assert_null(nt_matmul(x, wt));
    nt_test_expect_err(nt_last_error(), NT_ESTATE, "nt_matmul", "at most 256");
    assert_int_equal(nt_autocast_end(), 0);
    assert_int_equal(nt_fp8_recipe_slots(r, 0), 256);
    /* a new region starts at slot 0 again */
    assert_int_equal(nt_fp8_autocast_begin(r), 0);
    assert_non_null(nt_matmul(x, wt));
    assert_int_equal(nt_autocast_end(), 0);
    assert_int_equal(nt_fp8_recipe_update(r, comm), 0);
    assert_int_equal(nt_sync(), 0);
    /* nesting: a bf16 region inside an fp8 one is bf16 */
    assert_int_equal(nt_fp8_autocast_begin(r), 0);
    assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    assert_null(nt_fp8_autocast_recipe());
    assert_int_equal(nt_autocast_end(), 0);
    assert_ptr_equal(nt_fp8_autocast_recipe(), r);
    assert_int_equal(nt_autocast_end(), 0);
    nt_test_expect_err(nt_autocast_end(), NT_ESTATE, "nt_autocast_end");
    nt_scope_end(sc);
    nt_comm_destroy(comm);
    nt_fp8_recipe_destroy(r);
}

/* ---------------- bit-identical at any core count, mode, backend ---------------- */
/* (NT_TEST_QUICK=1 cuts the tables to sim adaptive, delayed scaling: for
 * the sanitizer builds, where each child takes tens of seconds) */

enum { F = 12, H = 24, C = DDP_H_CLASSES, NP = DDP_H_NP };
enum { TRAIN_STEPS = 10, TRAIN_SHARDS = 8, TRAIN_B = 32 };

/* inputs in [-2, 2) */
static void make_data(float *x, int32_t *y, int rows, uint32_t seed)
{
    ddp_h_data(x, y, rows, F, 4.0f, seed);
}

static int make_params(nt_tensor **p, uint64_t seed)
{
    return ddp_h_params(p, NT_F32, H, F, seed);
}

/* The loss of the MLP under fp8 autocast of r. */
static nt_tensor *model_loss(nt_fp8_recipe *r, nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    if (nt_fp8_autocast_begin(r))
        return NULL;
    nt_tensor *h = nt_relu(nt_linear(x, p[0], p[1]));
    nt_tensor *logits = nt_linear(h, p[2], p[3]);
    nt_tensor *loss = nt_cross_entropy(logits, y);
    nt_autocast_end();
    return loss;
}

static uint32_t params_crc(nt_tensor **p) { return ddp_h_crc(p, NP); }

#define CHILD_FAIL(code)                                                                   \
    do {                                                                                   \
        fprintf(stderr, "child: %s\n", nt_last_error_message());                           \
        return (code);                                                                     \
    } while (0)

/* The harness's hooks: the loss under fp8 autocast of the recipe ctx, the
 * amaxes reduced with MAX over every core after the reduce. */
typedef struct {
    nt_fp8_recipe *r;
    nt_comm *comm;
} fp8_ctx;

static nt_tensor *fp8_loss(void *ctx, nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    return model_loss(((fp8_ctx *)ctx)->r, p, x, y);
}

static int fp8_update(void *ctx, nt_ddp *d)
{
    (void)d;
    fp8_ctx *c = ctx;
    return nt_fp8_recipe_update(c->r, c->comm);
}

/* Data parallel: every core NT_SIM_CORES gave, 8 shards, the amaxes
 * reduced with MAX over a communicator of every core. */
static int child_ddp(nt_fp8_recipe *r)
{
    int devs[DDP_H_MAXDEV], ndev = ddp_h_devices(devs);
    nt_tensor *p[NP];
    if (make_params(p, 11))
        CHILD_FAIL(4);
    nt_ddp *d = nt_ddp_create(p, NP, TRAIN_SHARDS, devs, ndev);
    nt_comm *comm = nt_comm_create(devs, ndev);
    if (!d || !comm)
        CHILD_FAIL(4);
    nt_optim *opts[DDP_H_MAXDEV];
    for (int i = 0; i < ndev; i++) {
        nt_device_set(devs[i]);
        opts[i] = nt_optim_adamw(nt_ddp_params(d, devs[i]), NP, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    }
    fp8_ctx c = {r, comm};
    ddp_h_cfg cfg = {.shards = TRAIN_SHARDS, .rows = TRAIN_B, .cols = F, .range = 4.0f,
                     .loss = fp8_loss, .after_reduce = fp8_update, .ctx = &c};
    for (int step = 0; step < TRAIN_STEPS; step++)
        if (ddp_h_step(d, &cfg, opts, ndev, step))
            CHILD_FAIL(6);
    if (ddp_h_report(d, devs, ndev, NP))
        CHILD_FAIL(7);
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_comm_destroy(comm);
    nt_ddp_destroy(d);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
    return 0;
}

/* One device, the whole batch: op by op, or the first step captured and
 * replayed for the others. */
static int child_plain(nt_fp8_recipe *r, bool capture)
{
    nt_tensor *p[NP];
    if (make_params(p, 11))
        CHILD_FAIL(4);
    nt_optim *opt = nt_optim_adamw(p, NP, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    static float xb[TRAIN_B * F];
    static int32_t yb[TRAIN_B];
    nt_graph *g = NULL;
    for (int step = 0; step < TRAIN_STEPS; step++) {
        make_data(xb, yb, TRAIN_B, 100 + (uint32_t)step);
        nt_tensor *x = nt_from_host(xb, NT_F32, 2, (int64_t[]){TRAIN_B, F});
        nt_tensor *y = nt_from_host(yb, NT_I32, 1, (int64_t[]){TRAIN_B});
        if (g) {
            if (nt_graph_bind(g, "x", x) || nt_graph_bind(g, "y", y) || nt_graph_replay(g))
                CHILD_FAIL(8);
        } else {
            if (capture && (nt_graph_capture_begin() || nt_graph_input(x, "x") ||
                            nt_graph_input(y, "y")))
                CHILD_FAIL(8);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *loss = model_loss(r, p, x, y);
            if (!loss || nt_backward(loss) || nt_fp8_recipe_update(r, NULL) ||
                nt_optim_step(opt) || nt_optim_zero_grad(opt))
                CHILD_FAIL(5);
            nt_scope_end(sc);
            if (capture && !(g = nt_graph_capture_end()))
                CHILD_FAIL(9);
        }
        nt_release(x);
        nt_release(y);
    }
    uint32_t crc = params_crc(p);
    if (nt_sync())
        CHILD_FAIL(7);
    printf("crc %08x cores 1 procs 1 replicas same\n", crc);
    if (g)
        nt_graph_destroy(g);
    nt_optim_destroy(opt);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
    return 0;
}

static int child_main(const char *kind)
{
    if (nt_init() != 0)
        return 3;
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, 4, 0};
    if (!strncmp(kind, "current", 7))
        o.scaling = NT_FP8_CURRENT;
    nt_fp8_recipe *r = nt_fp8_recipe_create(&o);
    if (!r)
        CHILD_FAIL(3);
    const char *k = strchr(kind, '-') ? strchr(kind, '-') + 1 : kind;
    int rc = !strcmp(k, "ddp") ? child_ddp(r) : child_plain(r, !strcmp(k, "capture"));
    nt_fp8_recipe_destroy(r);
    nt_shutdown();
    return rc;
}

static unsigned run_child(const char *const *env, const char *kind, int want_cores)
{
    return ddp_h_child_crc(env, kind, NULL, want_cores);
}

static void bitwise_case(const char *scaling)
{
    static const char *const backends[] = {"NT_BACKEND=sim", "NT_BACKEND=cpu"};
    static const char *const modes[][2] = {{"NT_MODE=adaptive", "NT_DETERMINISTIC=0"},
                                           {"NT_MODE=adaptive", "NT_DETERMINISTIC=1"},
                                           {"NT_MODE=eager", "NT_DETERMINISTIC=0"},
                                           {"NT_MODE=lazy", "NT_DETERMINISTIC=0"}};
    static const char *const cores[] = {"NT_SIM_CORES=1", "NT_SIM_CORES=2", "NT_SIM_CORES=4"};
    char kind_ddp[32], kind_plain[32], kind_cap[32];
    snprintf(kind_ddp, sizeof kind_ddp, "%s-ddp", scaling);
    snprintf(kind_plain, sizeof kind_plain, "%s-plain", scaling);
    snprintf(kind_cap, sizeof kind_cap, "%s-capture", scaling);
    printf("# fp8 (%s scaling): parameters after %d AdamW steps (crc32)\n", scaling,
           TRAIN_STEPS);
    printf("# backend  mode           ddp: 1 core   2 cores   4 cores | 1 device: op by op  "
           "captured\n");
    unsigned first_ddp = 0, first_plain = 0;
    /* NT_TEST_QUICK (the sanitizer runs): sim adaptive only, delayed
     * scaling only */
    bool quick = getenv("NT_TEST_QUICK") != NULL;
    if (quick && strcmp(scaling, "delayed"))
        return;
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 4; m++) {
            if (quick && (b || m))
                continue;
            unsigned crc[3];
            for (int c = 0; c < 3; c++) {
                const char *env[] = {backends[b], modes[m][0], modes[m][1], cores[c], NULL};
                crc[c] = run_child(env, kind_ddp, 1 << c);
            }
            const char *env1[] = {backends[b], modes[m][0], modes[m][1], cores[0], NULL};
            unsigned plain = run_child(env1, kind_plain, 1);
            unsigned cap = run_child(env1, kind_cap, 1);
            printf("# %-8s %-8s %-5s %08x  %08x  %08x | %08x  %08x\n", backends[b] + 11,
                   modes[m][0] + 8, m == 1 ? "det" : "", crc[0], crc[1], crc[2], plain, cap);
            for (int c = 1; c < 3; c++)
                if (crc[c] != crc[0])
                    fail_msg("%s %s %s: %d cores give %08x, 1 core %08x", backends[b],
                             modes[m][0], modes[m][1], 1 << c, crc[c], crc[0]);
            if (cap != plain)
                fail_msg("%s %s %s: captured %08x, op by op %08x", backends[b], modes[m][0],
                         modes[m][1], cap, plain);
            if (b == 0 && m == 0) {
                first_ddp = crc[0];
                first_plain = plain;
            } else if (crc[0] != first_ddp || plain != first_plain) {
                fail_msg("%s %s %s: %08x / %08x, but sim adaptive gives %08x / %08x",
                         backends[b], modes[m][0], modes[m][1], crc[0], plain, first_ddp,
                         first_plain);
            }
        }
}

static void test_bitwise_delayed(void **state)
{
    (void)state;
    bitwise_case("delayed");
}

static void test_bitwise_current(void **state)
{
    (void)state;
    bitwise_case("current");
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child"))
        return child_main(argv[2]);
    if (ddp_h_self())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scale_update_reference, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_scale_overflow_keeps, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_forward_values, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, nt_test_setup, nt_test_teardown),
        cmocka_unit_test(test_bitwise_delayed),
        cmocka_unit_test(test_bitwise_current),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
