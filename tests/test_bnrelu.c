/* tests/test_bnrelu.c - a training batch norm and the relu after it run as
 * one kernel each way (fusion/plan.c, NT_FK_BN in fusion/ir.h; cpu/bn.c,
 * neuron/bn.c): forward, the norm's kernel writes relu(y) (and y only when
 * something else reads it); backward, relu's backward is taken inside the
 * norm's backward passes instead of a pass of its own.
 *
 *   - relu(batch_norm(x)), the running statistics, and the gradients of x,
 *     w and b (through nt_backward_full with a given output gradient) have
 *     the bits of the ops run one by one (deterministic mode) in every mode
 *     (eager, adaptive, lazy, lazy without fusion), on both backends, which
 *     agree; the deterministic output is checked against a double-precision
 *     batch norm and relu computed here;
 *   - shapes for each of the CPU kernel's paths: whole channels (C >= 4) and
 *     phases over blocks (C < 4, more than one 2048-element block), rows
 *     whose runs start mid-lane-group (S not a multiple of 16) and ones
 *     that do not, [N, C] input; the norm's output y released or kept;
 *     NaN, +-0, huge and subnormal values in x and in the output gradient;
 *     evaluation mode (no fusion there: the same bits);
 *   - lazy mode runs relu(batch_norm(x)) forward and backward in fewer
 *     kernels than with the fusion kept off (nt__fplan_nobn), which gives
 *     the same bits. */
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
#include "fusion/fusion.h"

enum { MAXN = 2 * 3 * 40 * 40, MAXC = 8 };

typedef struct bcase {
    int nd;
    int64_t sh[4];
    bool keep;     /* the norm's output y kept by the caller (read back) */
    bool training;
    bool edges;    /* NaN and edge values in x and the gradient */
} bcase;

typedef struct brun {
    float h[MAXN], y[MAXN], dx[MAXN], dw[MAXC], db[MAXC], rm[MAXC], rv[MAXC];
    uint64_t kernels;
} brun;

static int64_t numel(const bcase *k)
{
    int64_t n = 1;
    for (int i = 0; i < k->nd; i++)
        n *= k->sh[i];
    return n;
}

static float X[MAXN], GY[MAXN], W[MAXC], B[MAXC];

static void make_inputs(const bcase *k)
{
    int64_t n = numel(k), C = k->sh[1];
    uint64_t st = 0xb7e1 + (uint64_t)n;
    nt_test_fill(X, (size_t)n, &st);
    nt_test_fill(GY, (size_t)n, &st);
    nt_test_fill(W, (size_t)C, &st);
    nt_test_fill(B, (size_t)C, &st);
    for (int64_t i = 0; i < n; i++)
        X[i] = 2 * X[i] + 0.25f;
    if (k->edges) {
        static const float ev[] = {0.0f, -0.0f, 3.0e4f, -2.5e-30f, 1.0e-41f, -7.0f};
        for (int64_t i = 0; i < 6 && i * 37 < n; i++)
            X[i * 37] = ev[i], GY[i * 41] = ev[5 - i];
        X[n - 1] = NAN;     /* the last channel's statistics NaN */
        GY[3] = NAN;        /* a NaN gradient, masked where relu's output is 0 */
        GY[n / 2] = -NAN;
        GY[n / 2 + 1] = INFINITY;
    }
}

static nt_tensor *from(const float *v, int nd, const int64_t *sh)
{
    nt_tensor *t = nt_from_host(v, NT_F32, nd, sh);
    assert_non_null(t);
    return t;
}

static void back(nt_tensor *t, float *v)
{
    assert_non_null(t);
    assert_int_equal(nt_to_host(t, v, sizeof(float) * (size_t)nt_numel(t)), 0);
}

static void back_grad(nt_tensor *t, float *v)
{
    nt_tensor *g = nt_grad(t);
    back(g, v);
    nt_release(g);
}

/* relu(batch_norm(x)) and its gradients against GY, in the current
 * configuration; kernels counted. */
static void run(const bcase *k, brun *r)
{
    int64_t C = k->sh[1];
    nt_tensor *x = from(X, k->nd, k->sh), *gy = from(GY, k->nd, k->sh);
    nt_tensor *w = from(W, 1, &C), *b = from(B, 1, &C);
    float one[MAXC], half[MAXC];
    for (int i = 0; i < C; i++)
        one[i] = 1.0f, half[i] = 0.5f + 0.125f * (float)i;
    nt_tensor *rm = from(half, 1, &C), *rv = from(one, 1, &C);
    assert_int_equal(nt_set_requires_grad(x, true), 0);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    assert_int_equal(nt_set_requires_grad(b, true), 0);
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_tensor *y = nt_batch_norm(x, rm, rv, w, b, k->training, 0.1, 1e-5);
    assert_non_null(y);
    nt_tensor *h = nt_relu(y);
    assert_non_null(h);
    if (!k->keep)
        nt_release(y), y = NULL;
    assert_int_equal(nt_backward_full(h, gy, false, false), 0);
    back(h, r->h);
    if (y)
        back(y, r->y);
    back_grad(x, r->dx);
    back_grad(w, r->dw);
    back_grad(b, r->db);
    back(rm, r->rm);
    back(rv, r->rv);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    r->kernels = st.kernels_launched;
    nt_release(h), nt_release(y), nt_release(x), nt_release(gy), nt_release(w), nt_release(b);
    nt_release(rm), nt_release(rv);
}

static void same(const char *what, const char *name, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (nt_test_ubits(a[i]) != nt_test_ubits(b[i])) {
            print_message("# %s: %s[%lld] %.9g (%08x), op by op %.9g (%08x)\n", what, name,
                          (long long)i, (double)a[i], nt_test_ubits(a[i]), (double)b[i],
                          nt_test_ubits(b[i]));
            fail();
        }
}

static void expect_same(const bcase *k, const brun *a, const brun *b, const char *what)
{
    int64_t n = numel(k), C = k->sh[1];
    same(what, "relu(y)", a->h, b->h, n);
    if (k->keep)
        same(what, "y", a->y, b->y, n);
    same(what, "dx", a->dx, b->dx, n);
    same(what, "dw", a->dw, b->dw, C);
    same(what, "db", a->db, b->db, C);
    same(what, "running_mean", a->rm, b->rm, C);
    same(what, "running_var", a->rv, b->rv, C);
}

/* The op-by-op output against a double-precision batch norm and relu
 * (training: the batch's statistics; evaluation: the running ones), NaN
 * channels NaN; and relu's output against the kept y exactly. */
static void expect_host(const bcase *k, const brun *r)
{
    int64_t N = k->sh[0], C = k->sh[1], S = numel(k) / (N * C);
    for (int64_t c = 0; c < C; c++) {
        double m = 0.5 + 0.125 * (double)c, v = 1.0;
        if (k->training) {
            m = v = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t s = 0; s < S; s++)
                    m += X[(n * C + c) * S + s];
            m /= (double)(N * S);
            for (int64_t n = 0; n < N; n++)
                for (int64_t s = 0; s < S; s++) {
                    double d = X[(n * C + c) * S + s] - m;
                    v += d * d;
                }
            v /= (double)(N * S);
        }
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                double want = (X[i] - m) / sqrt(v + 1e-5) * W[c] + B[c];
                want = want > 0 || isnan(want) ? want : 0.0;
                float got = r->h[i];
                if (isnan(want)) {
                    assert_true(isnan(got));
                } else if (fabs(got - want) > 2e-4 * (1 + fabs(want))) {
                    print_message("# channel %lld element %lld: %g, want %g\n", (long long)c,
                                  (long long)i, (double)got, want);
                    fail();
                }
                if (k->keep) {
                    float y = r->y[i], e = y > 0.0f || isnan(y) ? y : 0.0f;
                    assert_int_equal(nt_test_ubits(got), nt_test_ubits(e));
                }
            }
    }
}

static void run_case(const bcase *k)
{
    assert_true(numel(k) <= MAXN && k->sh[1] <= MAXC);
    make_inputs(k);
    static brun det, other, first, apart;
    const char *const bes[2] = {"cpu", "sim"};
    const char *const modes[][2] = {{"eager", "1"}, {"adaptive", "1"}, {"lazy", "1"},
                                    {"lazy", "0"}};
    for (int be = 0; be < 2; be++) {
        memset(&det, 0, sizeof det);
        nt_test_config(bes[be], "deterministic", "1");
        run(k, &det);
        expect_host(k, &det);
        for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
            memset(&other, 0, sizeof other);
            nt_test_config(bes[be], modes[m][0], modes[m][1]);
            run(k, &other);
            char what[96];
            snprintf(what, sizeof what, "%s, %s, fusion %s", bes[be], modes[m][0], modes[m][1]);
            expect_same(k, &other, &det, what);
            if (!strcmp(modes[m][0], "lazy") && modes[m][1][0] == '1') {
                /* the relu each way rides on the norm's kernel: with them
                 * kept apart, the same bits and (training) a kernel more
                 * (the relu and its backward, next to each other here,
                 * then share one) */
                memset(&apart, 0, sizeof apart);
                AO_store(&nt__fplan_nobn, 1);
                run(k, &apart);
                AO_store(&nt__fplan_nobn, 0);
                expect_same(k, &apart, &det, "lazy, batch norm and relu apart");
                print_message("# %s: lazy, %llu kernels, %llu with batch norm and relu apart\n",
                              bes[be], (unsigned long long)other.kernels,
                              (unsigned long long)apart.kernels);
                if (k->training)
                    assert_true(other.kernels < apart.kernels);
            }
        }
        if (be == 0)
            first = det;
        else
            expect_same(k, &det, &first, "sim against cpu");
    }
}

/* whole channels, runs starting mid-lane-group (S = 63) */
static void test_by_channel(void **state)
{
    (void)state;
    run_case(&(bcase){4, {4, 6, 7, 9}, false, true, false});
    run_case(&(bcase){4, {4, 6, 7, 9}, true, true, false});
}

/* phases over blocks: 3 channels of 3200 (two blocks), S = 1600 */
static void test_phases(void **state)
{
    (void)state;
    run_case(&(bcase){4, {2, 3, 40, 40}, false, true, false});
    run_case(&(bcase){4, {2, 3, 40, 40}, true, true, false});
}

/* [N, C] input, and batch 1 with one spatial dim */
static void test_shapes(void **state)
{
    (void)state;
    run_case(&(bcase){2, {16, 5}, false, true, false});
    run_case(&(bcase){3, {1, 4, 33}, false, true, false});
}

/* NaN, +-0, huge and subnormal values in x and in the gradient */
static void test_edges(void **state)
{
    (void)state;
    run_case(&(bcase){4, {4, 6, 7, 9}, false, true, true});
    run_case(&(bcase){4, {2, 3, 40, 40}, true, true, true});
}

/* evaluation mode: the running statistics normalise (elementwise ops, no
 * batch norm kernel): the same bits everywhere */
static void test_eval(void **state)
{
    (void)state;
    run_case(&(bcase){4, {4, 6, 7, 9}, false, false, false});
    run_case(&(bcase){4, {4, 6, 7, 9}, true, false, true});
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_by_channel, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_phases, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_shapes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_edges, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_eval, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
