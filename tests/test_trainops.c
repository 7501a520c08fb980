/* tests/test_trainops.c - the training ops of issue 13 against independent
 * host references: nt_cross_entropy_ex, nt_dropout (and the training mode),
 * nt_clip_grad_norm, nt_topk, nt_multinomial.
 *
 * Each op's values are checked against a double-precision host computation
 * of PyTorch's semantics, and its bits across the backends (cpu, sim) and
 * modes (deterministic, adaptive, lazy with fusion, eager without): the op
 * table's own drivers (tests/test_conformance.c) cover the new op ids.  The
 * random ops use fixed seeds, so their statistical checks are deterministic;
 * the bounds are wide (many standard deviations). */
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

#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* backend, mode, fusion */
static const char *const CFGS[][3] = {
    {"cpu", "deterministic", "1"}, {"sim", "deterministic", "1"}, {"cpu", "adaptive", "1"},
    {"sim", "adaptive", "1"},      {"cpu", "lazy", "1"},          {"sim", "lazy", "1"},
    {"sim", "eager", "0"},         {"cpu", "eager", "0"},
};
enum { NCFG = sizeof CFGS / sizeof CFGS[0] };

static void cfg(int k)
{
    assert_int_equal(nt_config_set("NT_BACKEND", CFGS[k][0]), 0);
    assert_int_equal(nt_config_set("NT_MODE", CFGS[k][1]), 0);
    assert_int_equal(nt_config_set("NT_FUSION", CFGS[k][2]), 0);
}

/* A fixed pseudo-random sequence in [-1, 1) (xorshift, not the library's). */
static uint64_t rs = 88172645463325252ull;
static double rnd(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 4503599627370496.0 - 1.0;
}

static float *host_f32(nt_tensor *t, int64_t n)
{
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_non_null(t);
    if (n)
        assert_int_equal(nt_to_host(t, v, (size_t)n * sizeof(float)), 0);
    return v;
}

static double item(nt_tensor *t)
{
    double v = 0;
    assert_non_null(t);
    assert_int_equal(nt_item(t, &v), 0);
    return v;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---------------- nt_cross_entropy_ex ---------------- */

/* PyTorch's F.cross_entropy(logits, labels, ignore_index, label_smoothing)
 * in double, and its gradient d loss / d logits into g (may be NULL). */
static double ce_ref(const float *x, const int32_t *y, int64_t N, int64_t C, int64_t ign,
                     double eps, double *g)
{
    double nll = 0, sm = 0, cnt = 0;
    double *p = malloc((size_t)C * sizeof(double));
    for (int64_t i = 0; i < N; i++)
        if (y[i] != ign)
            cnt++;
    for (int64_t i = 0; i < N; i++) {
        const float *r = x + i * C;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < C; c++)
            m = fmax(m, r[c]);
        for (int64_t c = 0; c < C; c++)
            s += exp(r[c] - m);
        double ls = log(s) + m;
        for (int64_t c = 0; c < C; c++)
            p[c] = exp(r[c] - ls);
        bool ok = y[i] != ign;
        if (ok) {
            nll += ls - r[y[i]];
            for (int64_t c = 0; c < C; c++)
                sm += ls - r[c];
        }
        if (g)
            for (int64_t c = 0; c < C; c++)
                g[i * C + c] =
                    ok ? (p[c] - (1 - eps) * (c == y[i]) - eps / (double)C) / cnt : 0.0;
    }
    free(p);
    return (1 - eps) * nll / cnt + eps / (double)C * sm / cnt;
}

static void ce_data(int64_t N, int64_t C, float *x, int32_t *y, int32_t ign, int every)
{
    for (int64_t k = 0; k < N * C; k++)
        x[k] = (float)(3.0 * rnd());
    for (int64_t i = 0; i < N; i++) {
        y[i] = (int32_t)((uint64_t)(rnd() + 1.0) * 1000 % (uint64_t)C);
        y[i] = (int32_t)(((uint64_t)i * 7919u + (uint64_t)y[i]) % (uint64_t)C);
        if (every && i % every == 1)
            y[i] = ign;
    }
}

/* With no row ignored and no smoothing, the bits of nt_cross_entropy, on
 * every backend and mode, also past one reduction block of rows (2048). */
static void test_ce_ex_is_cross_entropy(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {5, 3}, {64, 97}, {3000, 7}};
    for (int s = 0; s < 4; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        float *x = malloc((size_t)(N * C) * sizeof(float));
        int32_t *y = malloc((size_t)N * sizeof(int32_t));
        ce_data(N, C, x, y, -100, 0);
        uint32_t want = 0;
        for (int k = 0; k < NCFG; k++) {
            cfg(k);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *l = nt_from_host(x, NT_F32, 2, SH(N, C));
            nt_tensor *lab = nt_from_host(y, NT_I32, 1, SH(N));
            float a = (float)item(nt_cross_entropy(l, lab));
            float b = (float)item(nt_cross_entropy_ex(l, lab, -100, 0.0));
            float c = (float)item(nt_cross_entropy_ex(l, lab, (int64_t)1 << 40, 0.0));
            if (k == 0)
                want = bits(a);
            if (bits(a) != want || bits(b) != want || bits(c) != want)
                fail_msg("[%lld, %lld] %s/%s: ce %a, ce_ex %a / %a, want %a", (long long)N,
                         (long long)C, CFGS[k][0], CFGS[k][1], a, b, c, (double)a);
            double r = ce_ref(x, y, N, C, -100, 0.0, NULL);
            assert_true(fabs(a - r) <= 1e-5 * fabs(r) + 1e-6);
            nt_scope_end(sc);
        }
        free(x), free(y);
    }
}

/* ignore_index and label_smoothing against PyTorch's semantics in double:
 * the loss and the gradient; the same bits on every backend and mode. */
static void test_ce_ex_values(void **state)
{
    (void)state;
    static const struct { int64_t N, C; int32_t ign; int every; double eps; } cs[] = {
        {6, 4, -100, 3, 0.0}, {6, 4, -100, 3, 0.1}, {50, 33, 2, 4, 0.25}, {9, 5, -1, 0, 0.5},
        {2100, 6, 0, 0, 0.1}, {7, 3, -100, 2, 1.0}, {4, 9, 77, 0, 0.0},
    };
    for (size_t s = 0; s < sizeof cs / sizeof cs[0]; s++) {
        int64_t N = cs[s].N, C = cs[s].C;
        float *x = malloc((size_t)(N * C) * sizeof(float));
        int32_t *y = malloc((size_t)N * sizeof(int32_t));
        double *g = malloc((size_t)(N * C) * sizeof(double));
        ce_data(N, C, x, y, cs[s].ign, cs[s].every);
        double r = ce_ref(x, y, N, C, cs[s].ign, cs[s].eps, g);
        uint32_t want = 0, *wantg = malloc((size_t)(N * C) * 4);
        for (int k = 0; k < NCFG; k++) {
            cfg(k);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *l = nt_from_host(x, NT_F32, 2, SH(N, C));
            nt_tensor *lab = nt_from_host(y, NT_I32, 1, SH(N));
            assert_int_equal(nt_set_requires_grad(l, true), 0);
            nt_tensor *loss = nt_cross_entropy_ex(l, lab, cs[s].ign, cs[s].eps);
            float v = (float)item(loss);
            if (!(fabs(v - r) <= 1e-5 * fabs(r) + 1e-6))
                fail_msg("case %zu %s/%s: loss %.9g, reference %.9g", s, CFGS[k][0],
                         CFGS[k][1], v, r);
            assert_int_equal(nt_backward(loss), 0);
            float *gv = host_f32(nt_grad(l), N * C);
            for (int64_t e = 0; e < N * C; e++) {
                if (!(fabs(gv[e] - g[e]) <= 1e-5 * fabs(g[e]) + 1e-7))
                    fail_msg("case %zu %s/%s: grad[%lld] %.9g, reference %.9g", s, CFGS[k][0],
                             CFGS[k][1], (long long)e, gv[e], g[e]);
                if (k == 0)
                    wantg[e] = bits(gv[e]);
                else if (bits(gv[e]) != wantg[e])
                    fail_msg("case %zu %s/%s: grad[%lld] bits differ from cpu", s, CFGS[k][0],
                             CFGS[k][1], (long long)e);
            }
            if (k == 0)
                want = bits(v);
            else if (bits(v) != want)
                fail_msg("case %zu %s/%s: loss %a, cpu bits %#x", s, CFGS[k][0], CFGS[k][1], v,
                         want);
            free(gv);
            nt_scope_end(sc);
        }
        free(x), free(y), free(g), free(wantg);
    }
}

/* Every row ignored: 0 / 0 = NaN, as PyTorch gives; u8 labels, whose range
 * cannot hold -100 (nothing ignored); bf16 logits: rounded once, like
 * nt_cross_entropy. */
static void test_ce_ex_edges(void **state)
{
    (void)state;
    cfg(1);
    float x[6] = {1, 2, 3, -1, 0.5f, 4};
    int32_t y[2] = {-100, -100};
    uint8_t yu[2] = {2, 0};
    nt_tensor *l = nt_from_host(x, NT_F32, 2, SH(2, 3));
    nt_tensor *lab = nt_from_host(y, NT_I32, 1, SH(2));
    assert_true(isnan(item(nt_cross_entropy_ex(l, lab, -100, 0.0))));
    assert_true(isnan(item(nt_cross_entropy_ex(l, lab, -100, 0.3))));
    nt_tensor *lu = nt_from_host(yu, NT_U8, 1, SH(2));
    int32_t yi[2] = {2, 0};
    double r = ce_ref(x, yi, 2, 3, -100, 0.0, NULL);
    assert_true(fabs(item(nt_cross_entropy_ex(l, lu, -100, 0.0)) - r) < 1e-6);
    r = ce_ref(x, yi, 2, 3, 0, 0.0, NULL); /* u8 label 0 ignored */
    assert_true(fabs(item(nt_cross_entropy_ex(l, lu, 0, 0.0)) - r) < 1e-6);
    nt_tensor *lb = nt_cast(l, NT_BF16);
    nt_tensor *a = nt_cross_entropy(lb, lu), *b = nt_cross_entropy_ex(lb, lu, -100, 0.0);
    assert_int_equal(nt_dtype_of(b), NT_BF16);
    uint16_t ab = 1, bb = 2;
    assert_int_equal(nt_to_host(a, &ab, 2), 0);
    assert_int_equal(nt_to_host(b, &bb, 2), 0);
    assert_int_equal(ab, bb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, nt_test_setup, nt_test_teardown)
        T(test_ce_ex_is_cross_entropy),
        T(test_ce_ex_values),
        T(test_ce_ex_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
