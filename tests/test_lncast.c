/* tests/test_lncast.c - a layer norm's output cast to bf16 or f16 rides on
 * the norm's row kernel (fusion/plan.c, NT_FK_NORM in fusion/ir.h): under
 * autocast each layer norm of a transformer feeds a matmul through a cast
 * to bf16, which ran as a kernel of its own, reading the norm's f32 output
 * back from memory.  Now the norm's kernel rounds its f32 rows and writes
 * the cast's output itself, and the f32 output only when something else
 * still reads it.
 *
 *   - the cast's bits and the norm's f32 bits (when kept) are those of the
 *     two ops run one by one (deterministic mode), in every mode (eager,
 *     adaptive, lazy, lazy without fusion) and captured and replayed, on
 *     both backends, which agree; the deterministic run's f32 output is
 *     checked against a double-precision layer norm computed here and its
 *     bf16 cast against the f32 values rounded here (to nearest even);
 *   - rows of one block (the simulator's short-row program) and rows longer
 *     than its 4096-element chunk (its streaming program), a row with a NaN,
 *     bf16 and f16 casts, the f32 output released or kept;
 *   - lazy mode runs the pair as one kernel: one fewer than NT_FUSION=0
 *     (two before), and a captured program's replay runs one kernel;
 *   - with an op of another shape queued between the two, the cast moves
 *     back next to the norm (fusion/plan.c, pull_one): the same kernels
 *     and bits. */
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

enum { MAXN = 96 * 1024 };

/* One case's inputs and what a run read back. */
typedef struct lcase {
    int64_t rows, d;
    nt_dtype cdt; /* the cast's dtype */
    bool keep;    /* the f32 output is kept (read back too) */
    bool between; /* an op of another shape queued between the norm and the cast */
} lcase;

typedef struct lrun {
    const float *x0, *x1, *w, *b; /* x1: what a replay is bound to */
    uint16_t c[2][MAXN];          /* the cast (of x0; of x1) */
    float y[2][MAXN];             /* the f32 output when kept */
    float z[2][7];                /* the op between (between) */
    uint64_t kernels;             /* lazy and the like: kernels run for the pair */
    int64_t graph_kernels;        /* captured: kernels a replay runs */
} lrun;

static nt_tensor *input(const float *v, const lcase *k)
{
    nt_tensor *t = nt_from_host(v, NT_F32, 2, (int64_t[]){k->rows, k->d});
    assert_non_null(t);
    return t;
}

/* y = layer_norm(x, w, b), c = cast(y); y released unless kept; with
 * `between`, *z = sqrt(w[0..7) * w[0..7)) queued between the two (the
 * planner moves the cast back next to the norm, fusion/plan.c pull_one). */
static nt_tensor *pair(nt_tensor *x, nt_tensor *w, nt_tensor *b, const lcase *k, nt_tensor **y,
                       nt_tensor **z)
{
    nt_tensor *yy = nt_layer_norm(x, w, b, 1e-5);
    assert_non_null(yy);
    *z = NULL;
    if (k->between) {
        nt_tensor *w7 = nt_narrow(w, 0, 0, 7);
        *z = nt_sqrt(nt_mul(w7, w7));
        assert_non_null(*z);
        nt_release(w7);
    }
    nt_tensor *c = nt_cast(yy, k->cdt);
    assert_non_null(c);
    if (k->keep) {
        *y = yy;
    } else {
        nt_release(yy);
        *y = NULL;
    }
    return c;
}

static void read_back(nt_tensor *c, nt_tensor *y, nt_tensor *z, lrun *r, int i,
                      const lcase *k)
{
    size_t n = (size_t)(k->rows * k->d);
    assert_int_equal(nt_to_host(c, r->c[i], n * 2), 0);
    if (y)
        assert_int_equal(nt_to_host(y, r->y[i], n * 4), 0);
    if (z)
        assert_int_equal(nt_to_host(z, r->z[i], sizeof r->z[i]), 0);
}

/* Op by op or fused as the mode says, x0 then x1. */
static void run_plain(const lcase *k, lrun *r)
{
    nt_tensor *w = input(r->w, &(lcase){1, k->d}), *b = input(r->b, &(lcase){1, k->d});
    nt_tensor *wv = nt_reshape(w, 1, (int64_t[]){k->d}), *bv = nt_reshape(b, 1, (int64_t[]){k->d});
    r->kernels = 0;
    for (int i = 0; i < 2; i++) {
        nt_tensor *x = input(i ? r->x1 : r->x0, k), *y, *z;
        assert_int_equal(nt_sync(), 0);
        nt_stats_reset();
        nt_tensor *c = pair(x, wv, bv, k, &y, &z);
        read_back(c, y, z, r, i, k);
        nt_stats st;
        assert_int_equal(nt_stats_get(&st), 0);
        r->kernels += st.kernels_launched;
        nt_release(c), nt_release(y), nt_release(z), nt_release(x);
    }
    nt_release(wv), nt_release(bv), nt_release(w), nt_release(b);
}

/* Captured with x0, replayed with x1 bound. */
static void run_captured(const lcase *k, lrun *r)
{
    nt_tensor *w = input(r->w, &(lcase){1, k->d}), *b = input(r->b, &(lcase){1, k->d});
    nt_tensor *wv = nt_reshape(w, 1, (int64_t[]){k->d}), *bv = nt_reshape(b, 1, (int64_t[]){k->d});
    nt_tensor *x = input(r->x0, k), *x1 = input(r->x1, k), *y, *z;
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_graph_input(x, "x"), 0);
    nt_tensor *c = pair(x, wv, bv, k, &y, &z);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    read_back(c, y, z, r, 0, k);
    assert_int_equal(nt_graph_bind(g, "x", x1), 0);
    assert_int_equal(nt_graph_replay(g), 0);
    read_back(c, y, z, r, 1, k);
    nt_graph_info info;
    assert_int_equal(nt_graph_info_get(g, &info), 0);
    r->graph_kernels = info.kernels;
    nt_graph_destroy(g);
    nt_release(c), nt_release(y), nt_release(z), nt_release(x), nt_release(x1);
    nt_release(wv), nt_release(bv), nt_release(w), nt_release(b);
}

static void expect_same(const lrun *a, const lrun *b, const lcase *k, const char *what)
{
    size_t n = (size_t)(k->rows * k->d);
    for (int i = 0; i < 2; i++) {
        if (memcmp(a->c[i], b->c[i], n * 2)) {
            print_message("# %s: the cast of x%d differs\n", what, i);
            fail();
        }
        if (k->keep && memcmp(a->y[i], b->y[i], n * 4)) {
            print_message("# %s: the f32 output of x%d differs\n", what, i);
            fail();
        }
        if (k->between && memcmp(a->z[i], b->z[i], sizeof a->z[i])) {
            print_message("# %s: the op between differs\n", what);
            fail();
        }
    }
}

/* The deterministic run against the host: a double-precision layer norm
 * (NaN rows NaN) and, for bf16, its own f32 values rounded to nearest
 * even. */
static void expect_host(const lcase *k, const lrun *det, const float *x, int i)
{
    float *y = malloc((size_t)k->d * sizeof *y);
    assert_non_null(y);
    bool keep = k->keep;
    for (int64_t row = 0; row < k->rows; row++) {
        const float *xr = x + row * k->d;
        double m = 0, v = 0;
        for (int64_t j = 0; j < k->d; j++)
            m += xr[j];
        m /= (double)k->d;
        for (int64_t j = 0; j < k->d; j++)
            v += (xr[j] - m) * (xr[j] - m);
        v /= (double)k->d;
        for (int64_t j = 0; j < k->d; j++) {
            double want = (xr[j] - m) / sqrt(v + 1e-5) * det->w[j] + det->b[j];
            float got = keep ? det->y[i][row * k->d + j] : 0;
            if (keep) {
                if (isnan(want)) {
                    assert_true(isnan(got));
                } else if (fabs(got - want) > 1e-4 * (1 + fabs(want))) {
                    print_message("# row %lld col %lld: %g, want %g\n", (long long)row,
                                  (long long)j, got, want);
                    fail();
                }
            }
            uint16_t c = det->c[i][row * k->d + j];
            if (keep && k->cdt == NT_BF16) {
                uint32_t u = nt_test_ubits(got);
                if (isnan(got)) {
                    assert_true((c & 0x7f80u) == 0x7f80u && (c & 0x7fu));
                } else {
                    assert_int_equal(c, (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
                }
            } else if (k->cdt == NT_BF16) { /* the cast of the double value, near */
                float cf = nt_test_fbits((uint32_t)c << 16);
                if (isnan(want))
                    assert_true(isnan(cf));
                else
                    assert_true(fabs(cf - want) <= 0x1p-8 * fabs(want) + 1e-4);
            }
        }
    }
    free(y);
}

static void run_case(const lcase *k)
{
    size_t n = (size_t)(k->rows * k->d);
    assert_true(n <= MAXN);
    static float x0[MAXN], x1[MAXN], w[MAXN], b[MAXN];
    uint64_t st = 0x1ac0 + (uint64_t)k->d;
    nt_test_fill(x0, n, &st);
    nt_test_fill(x1, n, &st);
    nt_test_fill(w, (size_t)k->d, &st);
    nt_test_fill(b, (size_t)k->d, &st);
    for (size_t i = 0; i < n; i++)
        x0[i] = 3 * x0[i] + 1, x1[i] = 0.5f * x1[i] - 2;
    x1[(k->rows - 1) * k->d + k->d / 2] = NAN; /* the last row of x1 is NaN */
    static lrun det, other, first;
    const char *const bes[2] = {"cpu", "sim"};
    /* the op between would share a kernel with a lone cast (foreach
     * kernels, docs/fusion.md): off, so that the counts tell the cast's
     * kernel */
    assert_int_equal(nt_config_set("NT_FOREACH", k->between ? "0" : "1"), 0);
    const char *const modes[][2] = {{"eager", "1"}, {"adaptive", "1"}, {"lazy", "1"},
                                    {"lazy", "0"}};
    for (int be = 0; be < 2; be++) {
        det = (lrun){.x0 = x0, .x1 = x1, .w = w, .b = b};
        nt_test_config(bes[be], "deterministic", "1");
        run_plain(k, &det);
        expect_host(k, &det, x0, 0);
        expect_host(k, &det, x1, 1);
        uint64_t lazy = 0, unfused = 0;
        for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
            other = (lrun){.x0 = x0, .x1 = x1, .w = w, .b = b};
            nt_test_config(bes[be], modes[m][0], modes[m][1]);
            run_plain(k, &other);
            char what[64];
            snprintf(what, sizeof what, "%s, %s, fusion %s", bes[be], modes[m][0], modes[m][1]);
            expect_same(&other, &det, k, what);
            if (!strcmp(modes[m][0], "lazy"))
                *(modes[m][1][0] == '1' ? &lazy : &unfused) = other.kernels;
        }
        /* lazy mode: each pair one kernel (x0's, x1's), op by op two each
         * (and the op between: one kernel, two ops) */
        print_message("# %s %lldx%lld: lazy %llu kernels, unfused %llu\n", bes[be],
                      (long long)k->rows, (long long)k->d, (unsigned long long)lazy,
                      (unsigned long long)unfused);
        assert_true(2 * lazy <= unfused);
        other = (lrun){.x0 = x0, .x1 = x1, .w = w, .b = b};
        nt_test_config(bes[be], "adaptive", "1");
        run_captured(k, &other);
        expect_same(&other, &det, k, "captured");
        assert_true(other.graph_kernels <= 1 + k->between);
        if (k->between) /* sqrt(w * w) = |w| */
            for (int i = 0; i < 7; i++)
                assert_true(det.z[0][i] == fabsf(w[i]) && det.z[1][i] == fabsf(w[i]));
        if (be == 0)
            first = det;
        else
            expect_same(&det, &first, k, "sim against cpu");
    }
    assert_int_equal(nt_config_set("NT_FOREACH", "1"), 0);
}

static void test_bf16_dead_f32(void **state)
{
    (void)state;
    run_case(&(lcase){256, 96, NT_BF16, false});
}

static void test_bf16_kept_f32(void **state)
{
    (void)state;
    run_case(&(lcase){256, 96, NT_BF16, true});
}

static void test_f16(void **state)
{
    (void)state;
    run_case(&(lcase){130, 64, NT_F16, true});
    run_case(&(lcase){130, 64, NT_F16, false});
}

/* rows longer than the simulator's chunk (its streaming row program) */
static void test_long_rows(void **state)
{
    (void)state;
    run_case(&(lcase){3, 5000, NT_BF16, true});
    run_case(&(lcase){3, 5000, NT_BF16, false});
}

/* an op of another shape between the norm and the cast (while a step is
 * captured, autocast's weight casts made ahead sit there): the cast moves
 * back to the norm and shares its kernel */
static void test_op_between(void **state)
{
    (void)state;
    run_case(&(lcase){256, 96, NT_BF16, false, true});
    run_case(&(lcase){256, 96, NT_BF16, true, true});
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bf16_dead_f32, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_kept_f32, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_f16, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_long_rows, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_op_between, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
