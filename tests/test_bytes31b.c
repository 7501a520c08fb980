/* tests/test_bytes31b.c - in-place writes into disjoint views of one
 * storage share an elementwise kernel (fusion/plan.c, check_operands and
 * views_disjoint): the backward's writes of dq, dk and dv (+ 0) into
 * their places in the [B, T, 3C] gradient of a qkv projection were three
 * kernels, each closing the group before the next ("in-place write to
 * another view of a kernel value"); they are one now.
 *
 *   - writes into column blocks of one buffer that share no element (and
 *     into row blocks, and heads of q, k, v) fuse into one kernel, and the
 *     buffer holds the host's reference bits (g + 0 where written, the old
 *     values elsewhere), the same as the op-by-op run, on both backends;
 *   - writes into views that share elements, or whose sharing the rule
 *     cannot rule out (a transposed view), still close the group, with the
 *     op-by-op bits;
 *   - the qkv projection's gradient through attention: the three writes in
 *     one kernel in lazy mode, the same bits as the deterministic run on
 *     both backends, and fewer simulated kernels than op by op without the
 *     rule (NT_FUSION=0 is the old path for each write);
 *   - layer norm's backward (autograd/backward.c): the recomputed
 *     statistics, gx and g xhat are one row kernel, with the deterministic
 *     run's bits and the host's values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"

static const char *const backends[2] = {"cpu", "sim"};

/* ---------------- in-place writes into views of one buffer ---------------- */

enum { R = 6, P = 12 }; /* the buffer: [R, P] f32 */

/* A case: k copies of src_i (of the view's shape) into buf[view_i]. */
typedef struct wcase {
    const char *name;
    int k;
    int kind[3];      /* 0: columns [a, b); 1: rows [a, b); 2: columns [a, b) transposed */
    int a[3], b[3];
    bool fuse;        /* one kernel for the k writes */
} wcase;

static const wcase cases[] = {
    {"three column blocks", 3, {0, 0, 0}, {0, 4, 8}, {4, 8, 12}, true},
    {"two column blocks with a gap", 2, {0, 0}, {1, 7}, {5, 11}, true},
    {"two row blocks", 2, {1, 1}, {0, 3}, {3, 6}, true},
    {"overlapping column blocks", 2, {0, 0}, {0, 3}, {5, 8}, false},
    {"overlapping row blocks", 2, {1, 1}, {0, 2}, {4, 6}, false},
    {"a transposed block beside a column block", 2, {2, 0}, {0, 6}, {6, 12}, false},
};

static nt_tensor *wview(nt_tensor *buf, int kind, int a, int b)
{
    if (kind == 1)
        return nt_slice(buf, 0, a, b, 1);
    nt_tensor *v = nt_slice(buf, 1, a, b, 1);
    return kind == 2 ? nt_transpose(v, 0, 1) : v;
}

static void wshape(int kind, int a, int b, int64_t *sh)
{
    sh[0] = kind == 1 ? b - a : kind == 2 ? b - a : R;
    sh[1] = kind == 1 ? P : kind == 2 ? R : b - a;
}

typedef struct wrun {
    const wcase *c;
    const float *init, *src[3];
    float out[R * P];
} wrun;

static void write_body(void *arg)
{
    wrun *w = arg;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *buf = nt_from_host(w->init, NT_F32, 2, (int64_t[]){R, P});
    nt_tensor *src[3];
    for (int i = 0; i < w->c->k; i++) {
        int64_t sh[2];
        wshape(w->c->kind[i], w->c->a[i], w->c->b[i], sh);
        src[i] = nt_from_host(w->src[i], NT_F32, 2, sh);
        assert_non_null(src[i]);
    }
    nt_sync();
    for (int i = 0; i < w->c->k; i++)
        assert_int_equal(
            nt_copy_into(wview(buf, w->c->kind[i], w->c->a[i], w->c->b[i]), src[i]), 0);
    assert_int_equal(nt_to_host(buf, w->out, sizeof w->out), 0);
    nt_scope_end(sc);
}

/* The host's bits: the last src written where a view covers e, buf's
 * elsewhere. */
static void write_ref(const wcase *c, const float *init, const float *const *src, float *out)
{
    memcpy(out, init, sizeof(float) * R * P);
    for (int i = 0; i < c->k; i++) {
        int64_t sh[2];
        wshape(c->kind[i], c->a[i], c->b[i], sh);
        for (int64_t r = 0; r < sh[0]; r++)
            for (int64_t q = 0; q < sh[1]; q++) {
                int64_t row = c->kind[i] == 1 ? c->a[i] + r : c->kind[i] == 2 ? q : r;
                int64_t col = c->kind[i] == 1 ? q : c->kind[i] == 2 ? c->a[i] + r : c->a[i] + q;
                float *d = out + row * P + col;
                *d = src[i][r * sh[1] + q];
            }
    }
}

/* Each case on both backends: lazy mode's bits are the host's and the
 * op-by-op run's; disjoint views fuse into one kernel, the others close
 * the group with the reason. */
static void test_disjoint_views_share_a_kernel(void **state)
{
    (void)state;
    float init[R * P], src[3][R * P];
    uint64_t st = 31;
    nt_test_fill(init, R * P, &st);
    for (int i = 0; i < 3; i++)
        nt_test_fill(src[i], R * P, &st);
    /* signed zeros, a NaN, infinities: copied as they are */
    init[0] = 0.0f, src[0][0] = -0.0f;
    init[1] = -0.0f, src[1][0] = -0.0f;
    src[1][1] = nt_test_fbits(0x7fc00000u);
    src[2][0] = INFINITY, src[2][1] = -INFINITY;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const wcase *c = &cases[ci];
        const float *sp[3] = {src[0], src[1], src[2]};
        float ref[R * P];
        write_ref(c, init, sp, ref);
        for (int be = 0; be < 2; be++) {
            wrun lazy = {.c = c, .init = init, .src = {src[0], src[1], src[2]}};
            wrun eager = lazy;
            nt_test_config(backends[be], "lazy", "1");
            char *log = nt_test_fusion_log(write_body, &lazy);
            int fused = nt_test_count(log, "elementwise, ");
            bool broke = strstr(log, "in-place write to another view") != NULL;
            if (c->fuse ? fused != 1 || broke : !broke)
                fail_msg("%s (%s): expected %s; the log:\n%s", c->name, backends[be],
                         c->fuse ? "one kernel" : "a break", log);
            if (c->fuse)
                assert_non_null(strstr(log, c->k == 3 ? "3 ops [copy" : "2 ops [copy"));
            free(log);
            nt_test_config(backends[be], "eager", "0");
            write_body(&eager);
            for (int e = 0; e < R * P; e++)
                if (memcmp(&lazy.out[e], &ref[e], 4) || memcmp(&eager.out[e], &ref[e], 4))
                    fail_msg("%s (%s): element %d is %08x (lazy), %08x (op by op); the host's "
                             "%08x", c->name, backends[be], e, nt_test_ubits(lazy.out[e]),
                             nt_test_ubits(eager.out[e]), nt_test_ubits(ref[e]));
        }
    }
    nt_test_config("cpu", "adaptive", "1");
}

/* ---------------- the qkv projection's gradient through attention ---------------- */

enum { B = 2, T = 130, H = 2, D = 8, C = H * D };

static nt_tensor *heads(nt_tensor *qkv, int blk)
{
    nt_tensor *t = nt_slice(qkv, 2, blk * C, (blk + 1) * C, 1);
    return nt_permute(nt_reshape(t, 4, (int64_t[]){B, T, H, D}), (int[]){0, 2, 1, 3});
}

typedef struct grun {
    const float *x, *w;
    float g[B * T * 3 * C];
    uint64_t kernels;
} grun;

static void grad_body(void *arg)
{
    grun *r = arg;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *qkv = nt_from_host(r->x, NT_F32, 3, (int64_t[]){B, T, 3 * C});
    assert_non_null(qkv);
    assert_int_equal(nt_set_requires_grad(qkv, true), 0);
    nt_tensor *W = nt_from_host(r->w, NT_F32, 4, (int64_t[]){B, H, T, D});
    nt_sync();
    nt_stats_reset();
    nt_tensor *y = nt_scaled_dot_product_attention(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2),
                                                   NULL, true, 0.0);
    nt_tensor *l = nt_sum(nt_mul(y, W), NT_DIM_ALL, false);
    assert_non_null(l);
    assert_int_equal(nt_backward(l), 0);
    assert_int_equal(nt_to_host(nt_grad(qkv), r->g, sizeof r->g), 0);
    nt_stats s;
    assert_int_equal(nt_stats_get(&s), 0);
    r->kernels = s.sim_kernels;
    nt_scope_end(sc);
}

/* dq, dk, dv (f32) are written where q, k, v lie, into the buffer that
 * becomes qkv's gradient (autograd/tape.c, placed_into): no + 0 writes
 * into it at all (they were one fused kernel); the gradient's bits are
 * the deterministic run's on both backends (which agree), with a -0 in
 * the gradient's places, fused or not (NT_FUSION=0). */
static void test_qkv_gradient_written_in_place(void **state)
{
    (void)state;
    static float x[B * T * 3 * C], w[B * H * T * D];
    uint64_t st = 0x31b;
    nt_test_fill(x, sizeof x / sizeof x[0], &st);
    nt_test_fill(w, sizeof w / sizeof w[0], &st);
    /* v's rows the last query alone attends, weights -0 there: dv's
     * last row is -0 * p summed, the place where + 0 matters */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++)
                w[((b * H + h) * T + T - 1) * D + d] = -0.0f;
    float first[B * T * 3 * C];
    for (int be = 0; be < 2; be++) {
        grun det = {.x = x, .w = w}, lazy = det, unfused = det;
        nt_test_config(backends[be], "deterministic", "1");
        grad_body(&det);
        nt_test_config(backends[be], "lazy", "1");
        char *log = nt_test_fusion_log(grad_body, &lazy);
        assert_int_equal(nt_test_count(log, "in-place write to another view"), 0);
        assert_null(strstr(log, "add_scalar"));
        free(log);
        nt_test_config(backends[be], "lazy", "0");
        grad_body(&unfused);
        assert_memory_equal(lazy.g, det.g, sizeof det.g);
        assert_memory_equal(unfused.g, det.g, sizeof det.g);
        if (be == 0)
            memcpy(first, det.g, sizeof first);
        else
            assert_memory_equal(det.g, first, sizeof first);
        if (be == 1)
            assert_true(lazy.kernels <= unfused.kernels);
    }
    /* a +0 was made from a -0 somewhere (else the test shows nothing) */
    bool pz = false;
    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
        pz |= first[i] == 0.0f && !signbit(first[i]);
    assert_true(pz);
    nt_test_config("cpu", "adaptive", "1");
}

/* ---------------- layer norm's backward as one row kernel ---------------- */

enum { LR = 256, LC = 64 };

typedef struct lnrun {
    const float *x, *w, *c;
    float gx[LR * LC], gw[LC], gb[LC];
    uint64_t kernels, fp; /* kernels run; programs run in shared kernels */
} lnrun;

static void ln_body(void *arg)
{
    lnrun *r = arg;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_from_host(r->x, NT_F32, 2, (int64_t[]){LR, LC});
    nt_tensor *w = nt_from_host(r->w, NT_F32, 1, (int64_t[]){LC});
    nt_tensor *b = nt_full(NT_F32, 1, (int64_t[]){LC}, 0.25);
    nt_tensor *c = nt_from_host(r->c, NT_F32, 2, (int64_t[]){LR, LC});
    assert_int_equal(nt_set_requires_grad(x, true), 0);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    assert_int_equal(nt_set_requires_grad(b, true), 0);
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_tensor *l = nt_sum(nt_mul(nt_layer_norm(x, w, b, 1e-5), c), NT_DIM_ALL, false);
    assert_non_null(l);
    assert_int_equal(nt_backward(l), 0);
    assert_int_equal(nt_to_host(nt_grad(x), r->gx, sizeof r->gx), 0);
    assert_int_equal(nt_to_host(nt_grad(w), r->gw, sizeof r->gw), 0);
    assert_int_equal(nt_to_host(nt_grad(b), r->gb, sizeof r->gb), 0);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    r->kernels = st.kernels_launched, r->fp = st.foreach_programs;
    nt_scope_end(sc);
}

/* autograd/backward.c orders layer norm's backward so that the recomputed
 * statistics, gx and g xhat are one row kernel (the sums over the rows for
 * the weight's and bias's gradients, which end a group, before and after
 * it; between the statistics and gx they split it in two, r and xhat
 * written out and read back).  Lazy mode: one row kernel, which the bias
 * gradient's sum shares (a sum waits in the foreach queue, fusion/plan.c:
 * one kernel fewer than with NT_FOREACH=0); the gradients are the
 * deterministic run's bits on both backends (which agree) and the host's
 * formula's values. */
static void test_layer_norm_backward_one_row_kernel(void **state)
{
    (void)state;
    static float x[LR * LC], w[LC], c[LR * LC];
    uint64_t st = 0x1a4;
    nt_test_fill(x, LR * LC, &st);
    nt_test_fill(w, LC, &st);
    nt_test_fill(c, LR * LC, &st);
    static lnrun det, lazy, alone, first;
    for (int be = 0; be < 2; be++) {
        det = (lnrun){.x = x, .w = w, .c = c};
        lazy = det, alone = det;
        nt_test_config(backends[be], "deterministic", "1");
        ln_body(&det);
        nt_test_config(backends[be], "lazy", "1");
        char *log = nt_test_fusion_log(ln_body, &lazy);
        assert_int_equal(nt_test_count(log, " row, "), 1);
        assert_non_null(strstr(log, "backward:rsqrt"));
        assert_non_null(strstr(log, "foreach kernel of 2 programs"));
        free(log);
        assert_int_equal(nt_config_set("NT_FOREACH", "0"), 0);
        ln_body(&alone);
        assert_int_equal(nt_config_set("NT_FOREACH", "1"), 0);
        assert_true(lazy.fp >= 2);
        assert_int_equal(alone.fp, 0);
        assert_true(lazy.kernels + 1 <= alone.kernels);
        assert_memory_equal(alone.gx, det.gx, sizeof det.gx);
        assert_memory_equal(alone.gw, det.gw, sizeof det.gw);
        assert_memory_equal(alone.gb, det.gb, sizeof det.gb);
        assert_memory_equal(lazy.gx, det.gx, sizeof det.gx);
        assert_memory_equal(lazy.gw, det.gw, sizeof det.gw);
        assert_memory_equal(lazy.gb, det.gb, sizeof det.gb);
        if (be == 0)
            first = det;
        else
            assert_memory_equal(det.gx, first.gx, sizeof first.gx);
    }
    /* the host's layer norm backward in double */
    double gw[LC] = {0}, gb[LC] = {0};
    for (int i = 0; i < LR; i++) {
        const float *xi = x + i * LC, *ci = c + i * LC;
        double mu = 0, var = 0, m1 = 0, m2 = 0, xh[LC];
        for (int j = 0; j < LC; j++)
            mu += xi[j];
        mu /= LC;
        for (int j = 0; j < LC; j++)
            var += (xi[j] - mu) * (xi[j] - mu);
        double r = 1.0 / sqrt(var / LC + 1e-5);
        for (int j = 0; j < LC; j++) {
            xh[j] = (xi[j] - mu) * r;
            m1 += ci[j] * w[j] / LC;
            m2 += ci[j] * w[j] * xh[j] / LC;
            gw[j] += ci[j] * xh[j];
            gb[j] += ci[j];
        }
        for (int j = 0; j < LC; j++) {
            double want = r * (ci[j] * w[j] - m1 - xh[j] * m2);
            if (fabs(first.gx[i * LC + j] - want) > 1e-4 * (1 + fabs(want)))
                fail_msg("gx[%d, %d] = %g, the host's %g", i, j, first.gx[i * LC + j], want);
        }
    }
    for (int j = 0; j < LC; j++) {
        assert_true(fabs(first.gw[j] - gw[j]) <= 1e-4 * (1 + fabs(gw[j])));
        assert_true(fabs(first.gb[j] - gb[j]) <= 1e-4 * (1 + fabs(gb[j])));
    }
    nt_test_config("cpu", "adaptive", "1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_disjoint_views_share_a_kernel, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_qkv_gradient_written_in_place, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_layer_norm_backward_one_row_kernel, nt_test_setup,
                                        nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
