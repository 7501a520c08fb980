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
#include <pthread.h>
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

uint64_t nt__tensor_live_handles(void); /* core/tensor.c */

#define SH(...) ((const int64_t[]){__VA_ARGS__})

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
        for (int k = 0; k < NT_TEST_NCFG; k++) {
            nt_test_cfg(k);
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
                         (long long)C, NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], a, b, c, (double)a);
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
        for (int k = 0; k < NT_TEST_NCFG; k++) {
            nt_test_cfg(k);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *l = nt_from_host(x, NT_F32, 2, SH(N, C));
            nt_tensor *lab = nt_from_host(y, NT_I32, 1, SH(N));
            assert_int_equal(nt_set_requires_grad(l, true), 0);
            nt_tensor *loss = nt_cross_entropy_ex(l, lab, cs[s].ign, cs[s].eps);
            float v = (float)item(loss);
            if (!(fabs(v - r) <= 1e-5 * fabs(r) + 1e-6))
                fail_msg("case %zu %s/%s: loss %.9g, reference %.9g", s, NT_TEST_CFGS[k][0],
                         NT_TEST_CFGS[k][1], v, r);
            assert_int_equal(nt_backward(loss), 0);
            float *gv = host_f32(nt_grad(l), N * C);
            for (int64_t e = 0; e < N * C; e++) {
                if (!(fabs(gv[e] - g[e]) <= 1e-5 * fabs(g[e]) + 1e-7))
                    fail_msg("case %zu %s/%s: grad[%lld] %.9g, reference %.9g", s,
                             NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], (long long)e, gv[e], g[e]);
                if (k == 0)
                    wantg[e] = bits(gv[e]);
                else if (bits(gv[e]) != wantg[e])
                    fail_msg("case %zu %s/%s: grad[%lld] bits differ from cpu", s,
                             NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], (long long)e);
            }
            if (k == 0)
                want = bits(v);
            else if (bits(v) != want)
                fail_msg("case %zu %s/%s: loss %a, cpu bits %#x", s, NT_TEST_CFGS[k][0],
                         NT_TEST_CFGS[k][1], v, want);
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
    nt_test_cfg(1);
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

/* No rows (N = 0), as PyTorch: the mean over none is NaN (0 / 0), with
 * or without ignore_index and label smoothing, any C; the gradient is
 * the empty [0, C].  nt_cross_entropy too.  Like every op's result, the
 * loss belongs to the open scope (it used to escape it). */
static void test_ce_ex_no_rows(void **state)
{
    (void)state;
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        for (int C = 0; C <= 3; C += 3)
            for (int form = 0; form < 4; form++) {
                nt_scope *sc = nt_scope_begin();
                nt_tensor *l = nt_zeros(NT_F32, 2, SH(0, C));
                nt_tensor *lab = nt_zeros(NT_I32, 1, SH(0));
                assert_int_equal(nt_set_requires_grad(l, true), 0);
                nt_tensor *loss = form == 0   ? nt_cross_entropy(l, lab)
                                  : form == 1 ? nt_cross_entropy_ex(l, lab, -100, 0.0)
                                  : form == 2 ? nt_cross_entropy_ex(l, lab, 1, 0.0)
                                              : nt_cross_entropy_ex(l, lab, -100, 0.25);
                if (!loss)
                    fail_msg("%s/%s C %d form %d: %s", NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], C,
                             form, nt_last_error_message());
                assert_int_equal(nt_ndim(loss), 0);
                assert_true(isnan(item(loss)));
                assert_int_equal(nt_backward(loss), 0);
                nt_tensor *g = nt_grad(l);
                assert_non_null(g);
                assert_int_equal(nt_shape(g, 0), 0);
                assert_int_equal(nt_shape(g, 1), C);
                assert_int_equal(nt_scope_end(sc), 0);
                assert_int_equal(nt_ndim(loss), -1); /* released with the scope */
            }
        /* rows but no classes stays an error */
        nt_tensor *l = nt_zeros(NT_F32, 2, SH(2, 0)), *lab = nt_zeros(NT_I32, 1, SH(2));
        assert_null(nt_cross_entropy_ex(l, lab, -100, 0.0));
        assert_int_equal(nt_last_error(), NT_ESHAPE);
        assert_non_null(strstr(nt_last_error_message(), "N, C >= 1 (or N = 0)"));
        nt_clear_error();
        nt_release(l), nt_release(lab);
    }
}

/* ---------------- nt_dropout ---------------- */

/* The documented generator (core/rng.h, core/sample.h), written out again:
 * h(s, i) = fmix(fmix(s ^ salt) + (i + 1) * golden), u = (h >> 11) 2^-53,
 * element i kept iff u >= p. */
static uint64_t fmix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double u53(uint64_t seed, uint64_t i)
{
    uint64_t key = fmix(seed ^ 0x6e74656e736f7221ull);
    return (double)(fmix(key + (i + 1) * 0x9e3779b97f4a7c15ull) >> 11) * 0x1p-53;
}
static float drop_ref(float x, uint64_t seed, uint64_t i, double p)
{
    return x * (u53(seed, i) >= p ? (float)(1.0 / (1.0 - p)) : 0.0f);
}

/* The same mask and values on every backend and mode, fused into a chain
 * or not, on a strided view, against the host formula bit for bit. */
static void test_dropout_values(void **state)
{
    (void)state;
    enum { R = 37, C = 300 };
    static float x[R * C];
    for (int k = 0; k < R * C; k++)
        x[k] = (float)(2.0 * rnd());
    x[5] = NAN, x[6] = INFINITY, x[7] = -0.0f;
    static const double ps[] = {0.1, 0.5, 0.9};
    for (int pi = 0; pi < 3; pi++) {
        double p = ps[pi];
        uint64_t seed = 1234 + (uint64_t)pi;
        for (int k = 0; k < NT_TEST_NCFG; k++) {
            nt_test_cfg(k);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *t = nt_from_host(x, NT_F32, 2, SH(R, C));
            /* plain, in a chain (fused in lazy mode), and of the transpose */
            float *a = host_f32(nt_dropout(t, p, seed), R * C);
            float *b = host_f32(
                nt_mul_scalar(nt_dropout(nt_add_scalar(nt_mul_scalar(t, 1.0), 0.0), p, seed), 2.0),
                R * C);
            float *c = host_f32(nt_dropout(nt_transpose(t, 0, 1), p, seed), R * C);
            for (int64_t i = 0; i < R * C; i++) {
                float ra = drop_ref(x[i], seed, (uint64_t)i, p);
                float rb = drop_ref(x[i] + 0.0f, seed, (uint64_t)i, p) * 2.0f;
                /* transpose: output element i = (j, r) reads x[r, j] */
                int64_t j = i / R, rr = i % R;
                float rc = drop_ref(x[rr * C + j], seed, (uint64_t)i, p);
                bool ok = (bits(a[i]) == bits(ra) || (isnan(a[i]) && isnan(ra))) &&
                          (bits(b[i]) == bits(rb) || (isnan(b[i]) && isnan(rb))) &&
                          (bits(c[i]) == bits(rc) || (isnan(c[i]) && isnan(rc)));
                if (!ok)
                    fail_msg("p %g %s/%s/fusion %s: element %lld: %a %a %a, want %a %a %a", p,
                             NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], NT_TEST_CFGS[k][2],
                             (long long)i, a[i], b[i], c[i], ra, rb, rc);
            }
            free(a), free(b), free(c);
            nt_scope_end(sc);
        }
    }
}

/* The kept fraction over 2^20 elements is 1 - p within 6 standard
 * deviations (fixed seeds: deterministic); kept values are x * scale. */
static void test_dropout_fraction(void **state)
{
    (void)state;
    enum { N = 1 << 20 };
    static const double ps[] = {0.05, 0.2, 0.5, 0.75, 0.999};
    nt_tensor *ones = nt_full(NT_F32, 1, SH(N), 1.0);
    float *y = malloc(N * sizeof(float));
    for (int pi = 0; pi < 5; pi++) {
        double p = ps[pi];
        assert_int_equal(nt_to_host(nt_dropout(ones, p, 99 + (uint64_t)pi), y, N * sizeof(float)),
                         0);
        int64_t kept = 0;
        float sc = (float)(1.0 / (1.0 - p));
        for (int i = 0; i < N; i++) {
            assert_true(y[i] == 0.0f || y[i] == sc);
            kept += y[i] != 0.0f;
        }
        double sd = sqrt(p * (1 - p) / N), f = (double)kept / N;
        if (fabs(f - (1 - p)) > 6 * sd)
            fail_msg("p %g: kept %.6f of %d, expected %.6f +- %.6f", p, f, N, 1 - p, 6 * sd);
    }
    free(y);
    nt_release(ones);
}

static nt_tensor *f_dropout(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_dropout(in[0], 0.4, 5);
}

/* backward = g * m from the seed: bit for bit against the host mask, the
 * same on every backend and mode; and nt_gradcheck. bf16: rounded once. */
static void test_dropout_backward(void **state)
{
    (void)state;
    enum { N = 999 };
    static float x[N], w[N];
    for (int k = 0; k < N; k++)
        x[k] = (float)rnd(), w[k] = (float)rnd();
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *t = nt_from_host(x, NT_F32, 1, SH(N));
        assert_int_equal(nt_set_requires_grad(t, true), 0);
        nt_tensor *l = nt_sum(nt_mul(nt_dropout(t, 0.25, 77), nt_from_host(w, NT_F32, 1, SH(N))),
                              NT_DIM_ALL, false);
        assert_int_equal(nt_backward(l), 0);
        float *g = host_f32(nt_grad(t), N);
        for (int i = 0; i < N; i++)
            if (bits(g[i]) != bits(drop_ref(w[i], 77, (uint64_t)i, 0.25)))
                fail_msg("%s/%s: grad[%d] %a, want %a", NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], i,
                         g[i], drop_ref(w[i], 77, (uint64_t)i, 0.25));
        free(g);
        nt_scope_end(sc);
    }
    nt_test_cfg(0);
    nt_tensor *t = nt_from_host(x, NT_F32, 2, SH(27, 37));
    assert_int_equal(nt_set_requires_grad(t, true), 0);
    assert_int_equal(nt_gradcheck(f_dropout, &t, 1, NULL, 1e-3, 1e-3, 1e-3), 0);
    /* bf16: x * m in f32, rounded once */
    nt_tensor *xb = nt_cast(nt_from_host(x, NT_F32, 1, SH(N)), NT_BF16);
    float *xr = host_f32(nt_cast(xb, NT_F32), N);
    float *yb = host_f32(nt_cast(nt_dropout(xb, 0.3, 3), NT_F32), N);
    for (int i = 0; i < N; i++) {
        float want = drop_ref(xr[i], 3, (uint64_t)i, 0.3);
        uint32_t u = bits(want), rnd_bf = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
        float wb;
        memcpy(&wb, &rnd_bf, 4);
        if (bits(yb[i]) != bits(wb))
            fail_msg("bf16 element %d: %a, want %a", i, yb[i], wb);
    }
    free(xr), free(yb);
}

/* Eval mode and p == 0: the identity, with no op queued; per thread,
 * training by default; the gradient passes through unchanged. */
static void *other_thread(void *arg)
{
    *(bool *)arg = nt_is_training();
    return NULL;
}

static void test_dropout_eval(void **state)
{
    (void)state;
    assert_true(nt_is_training());
    nt_set_training(false);
    bool other = false;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &other), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_true(other); /* another thread is still training */
    nt_set_training(true);
    float x[5] = {1, -2, 3.5f, NAN, -0.0f}, y[5];
    nt_tensor *t = nt_from_host(x, NT_F32, 1, SH(5));
    assert_int_equal(nt_set_requires_grad(t, true), 0);
    nt_set_training(false);
    assert_false(nt_is_training());
    nt_tensor *a = nt_dropout(t, 0.9, 1);
    nt_set_training(true);
    nt_tensor *b = nt_dropout(t, 0.0, 1);
    assert_true(nt_is_training());
    assert_int_equal(nt_to_host(a, y, sizeof y), 0);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(nt_to_host(b, y, sizeof y), 0);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(nt_backward(nt_sum(nt_add(a, b), NT_DIM_ALL, false)), 0);
    float g[5];
    assert_int_equal(nt_to_host(nt_grad(t), g, sizeof g), 0);
    for (int i = 0; i < 5; i++)
        assert_true(g[i] == 2.0f);
}

/* ---------------- nt_clip_grad_norm ---------------- */

/* torch.nn.utils.clip_grad_norm_ in double against the device's: the
 * total norm and the clipped gradients (clipping and not), the same bits in
 * every backend and mode, and no sync point inside the call. */
/* The norm nt_clip_grad_norm returns belongs to the open scope like any
 * op's result: a caller who ignores it (as PyTorch users do) leaks
 * nothing, one who releases it early is fine too. */
static void test_clip_grad_norm_scoped(void **state)
{
    (void)state;
    nt_tensor *w = nt_ones(NT_F32, 1, (int64_t[]){8});
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    nt_scope *s0 = nt_scope_begin();
    assert_int_equal(nt_backward(nt_sum(nt_mul_scalar(w, 3.0), NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_scope_end(s0), 0);
    assert_int_equal(nt_sync(), 0);
    uint64_t before = nt__tensor_live_handles();
    for (int k = 0; k < 3; k++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *tot = nt_clip_grad_norm(&w, 1, 100.0);
        assert_non_null(tot);
        if (k == 1) /* released before the scope ends: the scope lets it go */
            assert_int_equal(nt_release(tot), 0);
        assert_int_equal(nt_scope_end(sc), 0);
        assert_int_equal(nt_sync(), 0);
        assert_true(nt__tensor_live_handles() == before);
    }
    nt_release(w);
}

static void test_clip_grad_norm(void **state)
{
    (void)state;
    static const int64_t sz[3] = {35, 13, 24};
    static float w[3][35];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < sz[i]; k++)
            w[i][k] = (float)(3.0 * rnd());
    double t2 = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < sz[i]; k++)
            t2 += (double)w[i][k] * w[i][k];
    double total = sqrt(t2);
    static const double maxn[] = {1.0, 0.25, 1e3, INFINITY};
    for (int m = 0; m < 4; m++) {
        double coef = fmin(1.0, maxn[m] / (total + 1e-6));
        uint32_t want[3][35], wt = 0;
        for (int k = 0; k < NT_TEST_NCFG; k++) {
            nt_test_cfg(k);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *p[4];
            p[0] = nt_zeros(NT_F32, 2, SH(5, 7));
            p[1] = nt_zeros(NT_F32, 1, SH(13));
            p[2] = nt_zeros(NT_F32, 3, SH(2, 3, 4));
            p[3] = nt_zeros(NT_F32, 1, SH(3)); /* no .grad: skipped */
            nt_tensor *l = NULL;
            for (int i = 0; i < 4; i++)
                assert_int_equal(nt_set_requires_grad(p[i], true), 0);
            for (int i = 0; i < 3; i++) {
                nt_tensor *wi = nt_reshape(nt_from_host(w[i], NT_F32, 1, SH(sz[i])), nt_ndim(p[i]),
                                           (int64_t[]){nt_shape(p[i], 0), nt_shape(p[i], 1),
                                                       nt_shape(p[i], 2)});
                nt_tensor *li = nt_sum(nt_mul(p[i], wi), NT_DIM_ALL, false);
                l = l ? nt_add(l, li) : li;
            }
            assert_int_equal(nt_backward(l), 0); /* .grad = w exactly */
            assert_int_equal(nt_sync(), 0);
            nt_stats s0, s1;
            assert_int_equal(nt_stats_get(&s0), 0);
            nt_tensor *tot = nt_clip_grad_norm(p, 4, maxn[m]);
            assert_int_equal(nt_stats_get(&s1), 0);
            assert_int_equal(s1.syncs, s0.syncs);
            assert_non_null(tot);
            assert_int_equal(nt_ndim(tot), 0);
            assert_int_equal(nt_dtype_of(tot), NT_F32);
            float tv = (float)item(tot);
            if (!(fabs(tv - total) <= 1e-6 * total))
                fail_msg("max_norm %g %s/%s: total %.9g, reference %.9g", maxn[m],
                         NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], tv, total);
            if (k == 0)
                wt = bits(tv);
            assert_int_equal(bits(tv), wt);
            for (int i = 0; i < 3; i++) {
                float *g = host_f32(nt_grad(p[i]), sz[i]);
                for (int e = 0; e < sz[i]; e++) {
                    double r = (double)w[i][e] * coef;
                    if (coef == 1.0 ? bits(g[e]) != bits(w[i][e])
                                    : !(fabs(g[e] - r) <= 2e-7 * fabs(r) + 1e-12))
                        fail_msg("max_norm %g %s/%s: grad %d[%d] %.9g, reference %.9g", maxn[m],
                                 NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], i, e, g[e], r);
                    if (k == 0)
                        want[i][e] = bits(g[e]);
                    else
                        assert_int_equal(bits(g[e]), want[i][e]);
                }
                free(g);
            }
            assert_null(nt_grad(p[3]));
            nt_release(tot);
            nt_scope_end(sc);
        }
    }
    /* no gradients at all: total 0, nothing to clip; n = 0 too */
    nt_tensor *q = nt_zeros(NT_F32, 1, SH(4));
    nt_tensor *z = nt_clip_grad_norm(&q, 1, 1.0);
    assert_true(item(z) == 0.0);
    nt_release(z);
    z = nt_clip_grad_norm(&q, 0, 1.0);
    assert_true(item(z) == 0.0);
    nt_release(z);
    nt_release(q);
    /* a bf16 parameter: its norm from the widened .grad, clipped in bf16 */
    float hb[4] = {3, 4, 0, 0};
    nt_tensor *b = nt_cast(nt_zeros(NT_F32, 1, SH(4)), NT_BF16);
    assert_int_equal(nt_set_requires_grad(b, true), 0);
    nt_tensor *wb = nt_cast(nt_from_host(hb, NT_F32, 1, SH(4)), NT_BF16);
    assert_int_equal(nt_backward(nt_sum(nt_mul(b, wb), NT_DIM_ALL, false)), 0);
    z = nt_clip_grad_norm(&b, 1, 1.0);
    assert_true(fabs(item(z) - 5.0) < 1e-6);
    float gb[4];
    assert_int_equal(nt_to_host(nt_cast(nt_grad(b), NT_F32), gb, sizeof gb), 0);
    assert_true(fabs(gb[0] - 0.6) < 4e-3 && fabs(gb[1] - 0.8) < 4e-3 && gb[2] == 0.0f);
    nt_release(z);
}

/* ---------------- nt_topk ---------------- */

typedef struct {
    double v;
    int64_t j;
} ent;
/* rank classes: NaN above every number */
static int cmp_desc(const void *a, const void *b)
{
    const ent *x = a, *y = b;
    int nx = isnan(x->v), ny = isnan(y->v);
    if (nx != ny)
        return nx ? -1 : 1;
    if (!nx && x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->j < y->j ? -1 : 1;
}
static int cmp_asc(const void *a, const void *b)
{
    const ent *x = a, *y = b;
    int nx = isnan(x->v), ny = isnan(y->v);
    if (nx != ny)
        return nx ? 1 : -1;
    if (!nx && x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return x->j < y->j ? -1 : 1;
}

/* One case: x [sh] of dtype dt (values from hv, as doubles exact in dt),
 * along dim d, against a sort on the host; values and indices on every
 * backend and mode; and transposed input when asked. */
static void topk_case(nt_dtype dt, int nd, const int64_t *sh, int d, int64_t k, bool largest,
                      const double *hv)
{
    int64_t n = 1, O = 1, I = 1, L = sh[d];
    for (int a = 0; a < nd; a++)
        n *= sh[a];
    for (int a = 0; a < d; a++)
        O *= sh[a];
    for (int a = d + 1; a < nd; a++)
        I *= sh[a];
    int64_t nk = O * k * I;
    int32_t *wi = malloc((size_t)(nk ? nk : 1) * 4);
    double *wv = malloc((size_t)(nk ? nk : 1) * 8);
    ent *row = malloc((size_t)L * sizeof(ent));
    for (int64_t a = 0; a < O; a++)
        for (int64_t i = 0; i < I; i++) {
            for (int64_t j = 0; j < L; j++)
                row[j] = (ent){hv[(a * L + j) * I + i], j};
            qsort(row, (size_t)L, sizeof(ent), largest ? cmp_desc : cmp_asc);
            for (int64_t j = 0; j < k; j++) {
                wi[(a * k + j) * I + i] = (int32_t)row[j].j;
                wv[(a * k + j) * I + i] = row[j].v;
            }
        }
    float *hf = malloc((size_t)n * 4);
    int32_t *hi = malloc((size_t)n * 4);
    for (int64_t e = 0; e < n; e++)
        hf[e] = (float)hv[e], hi[e] = (int32_t)hv[e];
    int32_t *gi = malloc((size_t)(nk ? nk : 1) * 4);
    for (int kc = 0; kc < NT_TEST_NCFG; kc++) {
        nt_test_cfg(kc);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = (dt == NT_F32 || dt == NT_BF16 || dt == NT_F16)
                           ? nt_cast(nt_from_host(hf, NT_F32, nd, sh), dt)
                           : nt_from_host(hi, NT_I32, nd, sh);
        nt_tensor *v = NULL, *ix = NULL;
        assert_int_equal(nt_topk(x, k, d, largest, &v, &ix), 0);
        assert_int_equal(nt_dtype_of(ix), NT_I32);
        assert_int_equal(nt_dtype_of(v), dt);
        for (int a = 0; a < nd; a++)
            assert_int_equal(nt_shape(ix, a), a == d ? k : sh[a]);
        if (nk) {
            assert_int_equal(nt_to_host(ix, gi, (size_t)nk * 4), 0);
            double *gv = malloc((size_t)nk * 8);
            if ((dt == NT_F32 || dt == NT_BF16 || dt == NT_F16)) {
                float *f = host_f32(nt_cast(v, NT_F32), nk);
                for (int64_t e = 0; e < nk; e++)
                    gv[e] = f[e];
                free(f);
            } else {
                int32_t *f = malloc((size_t)nk * 4);
                assert_int_equal(nt_to_host(v, f, (size_t)nk * 4), 0);
                for (int64_t e = 0; e < nk; e++)
                    gv[e] = f[e];
                free(f);
            }
            for (int64_t e = 0; e < nk; e++)
                if (gi[e] != wi[e] || !(gv[e] == wv[e] || (isnan(gv[e]) && isnan(wv[e]))))
                    fail_msg("%s topk k %lld dim %d %s, %s/%s: element %lld: index %d value %g, "
                             "want %d %g",
                             nt_dtype_name(dt), (long long)k, d, largest ? "largest" : "smallest",
                             NT_TEST_CFGS[kc][0], NT_TEST_CFGS[kc][1], (long long)e, gi[e], gv[e],
                             wi[e], wv[e]);
            free(gv);
        }
        nt_scope_end(sc);
    }
    free(wi), free(wv), free(row), free(hf), free(hi), free(gi);
}

static void test_topk_values(void **state)
{
    (void)state;
    enum { NMAX = 2 * 300 * 150 };
    double *hv = malloc(NMAX * sizeof(double));
    /* few distinct values (ties everywhere), with NaN, +-0 and +-Inf */
    for (int e = 0; e < NMAX; e++) {
        hv[e] = floor(4.0 * rnd()) * 0.5;
        if (e % 17 == 3)
            hv[e] = NAN;
        if (e % 23 == 5)
            hv[e] = e % 2 ? -0.0 : 0.0;
        if (e % 41 == 7)
            hv[e] = e % 2 ? INFINITY : -INFINITY;
    }
    for (int lg = 0; lg < 2; lg++) {
        topk_case(NT_F32, 2, SH(7, 50), 1, 5, lg, hv);
        topk_case(NT_F32, 2, SH(7, 50), 0, 7, lg, hv);
        topk_case(NT_BF16, 2, SH(300, 20), 1, 20, lg, hv);  /* > 128 rows, k = L */
        topk_case(NT_F32, 3, SH(2, 300, 150), 1, 3, lg, hv); /* I = 150 > 128 */
        topk_case(NT_F32, 3, SH(3, 5000, 2), 1, 2500, lg, hv); /* chunks, pieces */
        topk_case(NT_F32, 2, SH(4, 9), 1, 0, lg, hv);
        topk_case(NT_F32, 1, SH(1), 0, 1, lg, hv);
    }
    /* i32 above 2^24: compared exactly */
    for (int e = 0; e < 200; e++)
        hv[e] = (double)((int32_t)(rnd() * 2e9)) + (e % 3);
    hv[10] = hv[11] = 16777217.0, hv[12] = 16777216.0;
    topk_case(NT_I32, 2, SH(4, 50), 1, 10, true, hv);
    topk_case(NT_I32, 2, SH(4, 50), 0, 4, false, hv);
    free(hv);
}

/* A 0-d x, as PyTorch: dim 0 or -1, k 0 or 1 (both give the element),
 * 0-d values and a 0-d i32 index 0; the gradient passes through. */
static void test_topk_0d(void **state)
{
    (void)state;
    for (int c = 0; c < NT_TEST_NCFG; c++) {
        nt_test_cfg(c);
        nt_scope *sc = nt_scope_begin();
        float v = -2.5f;
        nt_tensor *x = nt_from_host(&v, NT_F32, 0, NULL);
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        for (int k = 0; k <= 1; k++)
            for (int dim = -1; dim <= 0; dim++)
                for (int lg = 0; lg < 2; lg++) {
                    nt_tensor *val = NULL, *ix = NULL;
                    if (nt_topk(x, k, dim, lg, &val, &ix) != 0)
                        fail_msg("%s/%s k %d dim %d: %s", NT_TEST_CFGS[c][0], NT_TEST_CFGS[c][1], k,
                                 dim, nt_last_error_message());
                    assert_int_equal(nt_ndim(val), 0);
                    assert_int_equal(nt_ndim(ix), 0);
                    assert_int_equal(nt_dtype_of(ix), NT_I32);
                    assert_true(item(val) == -2.5);
                    assert_true(item(ix) == 0);
                    assert_int_equal(nt_backward(nt_mul_scalar(val, 3.0)), 0);
                    assert_true(item(nt_grad(x)) == 3.0);
                    assert_int_equal(nt_zero_grad(x), 0);
                }
        nt_tensor *val = (nt_tensor *)1, *ix = (nt_tensor *)1;
        assert_int_equal(nt_topk(x, 2, 0, true, &val, &ix), NT_EINVAL);
        assert_true(val == NULL && ix == NULL);
        assert_non_null(strstr(nt_last_error_message(), "expected 0 or 1 for a 0-d tensor"));
        nt_clear_error();
        assert_int_equal(nt_topk(x, 1, 1, true, &val, &ix), NT_EDIM);
        assert_non_null(strstr(nt_last_error_message(), "dim 1 is out of range for a 0-d"));
        nt_clear_error();
        assert_int_equal(nt_scope_end(sc), 0);
    }
}

/* values' gradient: w scattered back to where the values came from (x's
 * shape, zeros elsewhere), on a transposed (strided) x. */
static void test_topk_backward(void **state)
{
    (void)state;
    enum { R = 6, C = 11, K = 4 };
    float hx[R * C], hw[C * K];
    for (int e = 0; e < R * C; e++)
        hx[e] = (float)rnd();
    for (int e = 0; e < C * K; e++)
        hw[e] = (float)(e + 1);
    for (int kc = 0; kc < NT_TEST_NCFG; kc++) {
        nt_test_cfg(kc);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_from_host(hx, NT_F32, 2, SH(R, C));
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        nt_tensor *v, *ix;
        /* x^T [C, R], top K along dim 1 (the rows of x^T) */
        assert_int_equal(nt_topk(nt_transpose(x, 0, 1), K, -1, false, &v, &ix), 0);
        assert_int_equal(nt_backward(nt_sum(nt_mul(v, nt_from_host(hw, NT_F32, 2, SH(C, K))),
                                            NT_DIM_ALL, false)), 0);
        int32_t gi[C * K];
        float g[R * C], want[R * C] = {0};
        assert_int_equal(nt_to_host(ix, gi, sizeof gi), 0);
        for (int c = 0; c < C; c++)
            for (int j = 0; j < K; j++)
                want[gi[c * K + j] * C + c] += hw[c * K + j];
        assert_int_equal(nt_to_host(nt_grad(x), g, sizeof g), 0);
        assert_memory_equal(g, want, sizeof g);
        nt_scope_end(sc);
    }
}

/* ---------------- nt_multinomial ---------------- */

/* The documented draw, on the host: the first category whose running sum
 * (double, index order) exceeds u * total; the last positive one if none. */
static void mn_ref(const float *p, int64_t N, int64_t C, int64_t n, uint64_t seed, int32_t *out)
{
    for (int64_t r = 0; r < N; r++) {
        const float *row = p + r * C;
        double total = 0;
        int64_t last = -1;
        for (int64_t c = 0; c < C; c++) {
            total += row[c];
            if (row[c] > 0)
                last = c;
        }
        for (int64_t j = 0; j < n; j++) {
            double t = u53(seed, (uint64_t)(r * n + j)) * total, cum = 0;
            int64_t pick = last;
            for (int64_t c = 0; c < C; c++) {
                cum += row[c];
                if (cum > t) {
                    pick = c;
                    break;
                }
            }
            out[r * n + j] = (int32_t)pick;
        }
    }
}

static void mn_case(nt_dtype dt, int64_t N, int64_t C, int64_t n, bool one_d, bool transposed)
{
    float *p = malloc((size_t)(N * C) * sizeof(float));
    for (int64_t e = 0; e < N * C; e++) {
        double u = rnd();
        p[e] = e % 7 == 2 ? 0.0f : (float)(u * u * 10.0);
    }
    if (dt == NT_BF16) /* the values the op sees */
        for (int64_t e = 0; e < N * C; e++) {
            uint32_t b = bits(p[e]);
            b = ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16) << 16;
            memcpy(&p[e], &b, 4);
        }
    int32_t *want = malloc((size_t)(N * n) * 4), *got = malloc((size_t)(N * n) * 4);
    mn_ref(p, N, C, n, 42, want);
    for (int64_t e = 0; e < N * n; e++)
        assert_true(want[e] >= 0 && p[(e / n) * C + want[e]] > 0);
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *t;
        if (transposed) /* a [C, N] buffer viewed as [N, C] */ {
            float *pt = malloc((size_t)(N * C) * sizeof(float));
            for (int64_t r = 0; r < N; r++)
                for (int64_t c = 0; c < C; c++)
                    pt[c * N + r] = p[r * C + c];
            t = nt_transpose(nt_from_host(pt, NT_F32, 2, SH(C, N)), 0, 1);
            free(pt);
        } else {
            t = one_d ? nt_from_host(p, NT_F32, 1, SH(C)) : nt_from_host(p, NT_F32, 2, SH(N, C));
        }
        if (dt != NT_F32)
            t = nt_cast(t, dt);
        nt_tensor *y = nt_multinomial(t, n, 42);
        assert_non_null(y);
        assert_int_equal(nt_dtype_of(y), NT_I32);
        assert_int_equal(nt_ndim(y), one_d ? 1 : 2);
        assert_int_equal(nt_shape(y, one_d ? 0 : 1), n);
        assert_int_equal(nt_to_host(y, got, (size_t)(N * n) * 4), 0);
        for (int64_t e = 0; e < N * n; e++)
            if (got[e] != want[e])
                fail_msg("multinomial [%lld, %lld] n %lld %s/%s: draw %lld = %d, want %d",
                         (long long)N, (long long)C, (long long)n, NT_TEST_CFGS[k][0],
                         NT_TEST_CFGS[k][1], (long long)e, got[e], want[e]);
        nt_scope_end(sc);
    }
    free(p), free(want), free(got);
}

/* Every draw against the host formula, on every backend and mode: long
 * rows (chunks), more than 128 rows, more draws than one block, bf16 and
 * strided probabilities, zero-probability categories (never drawn). */
static void test_multinomial_values(void **state)
{
    (void)state;
    mn_case(NT_F32, 1, 5, 1000, true, false);
    mn_case(NT_F32, 130, 9000, 3, false, false);
    mn_case(NT_F32, 3, 7, 5000, false, false);
    mn_case(NT_BF16, 4, 33, 17, false, false);
    mn_case(NT_F32, 6, 10, 9, false, true);
}

/* Frequencies over 2^18 draws are the probabilities within 6 standard
 * deviations (fixed seed: deterministic); zero categories never come up. */
static void test_multinomial_frequencies(void **state)
{
    (void)state;
    enum { N = 1 << 18 };
    static const float p[6] = {0.3f, 0.0f, 0.6f, 0.9f, 1.2f, 0.0f}; /* sums to 3 */
    nt_tensor *t = nt_from_host(p, NT_F32, 1, SH(6));
    int32_t *y = malloc(N * 4);
    assert_int_equal(nt_to_host(nt_multinomial(t, N, 2026), y, N * 4), 0);
    int64_t cnt[6] = {0};
    for (int i = 0; i < N; i++) {
        assert_true(y[i] >= 0 && y[i] < 6);
        cnt[y[i]]++;
    }
    assert_int_equal(cnt[1], 0);
    assert_int_equal(cnt[5], 0);
    for (int c = 0; c < 6; c++) {
        double q = p[c] / 3.0, f = (double)cnt[c] / N, sd = sqrt(q * (1 - q) / N);
        if (fabs(f - q) > 6 * sd + 1e-12)
            fail_msg("category %d: frequency %.5f, probability %.5f +- %.5f", c, f, q, 6 * sd);
    }
    free(y);
    nt_release(t);
}

/* A bad row reported when the op runs: the first bad row's first problem,
 * in the same words on the CPU and the simulator (which checks 128 rows at
 * a time); the runtime keeps working. */
static void test_multinomial_errors(void **state)
{
    (void)state;
    enum { N = 300, C = 5 };
    static float p[N * C];
    for (int e = 0; e < N * C; e++)
        p[e] = 1.0f;
    for (int c = 0; c < C; c++)
        p[140 * C + c] = 0.0f; /* row 140 sums to 0 ... */
    p[150 * C + 3] = -1.0f;   /* ... before row 150's two bad values */
    p[150 * C + 1] = NAN;
    p[20 * C + 4] = 0.0f; /* a zero category, fine */
    char msg[2][400];
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        nt_tensor *t = nt_from_host(p, NT_F32, 2, SH(N, C));
        nt_tensor *y = nt_multinomial(t, 3, 1);
        assert_non_null(y);
        static int32_t out[N * 3];
        assert_int_equal(nt_to_host(y, out, sizeof out), NT_EINVAL);
        const char *m = nt_last_error_message();
        assert_non_null(strstr(m, "nt_multinomial"));
        assert_non_null(strstr(m, "row 140 of probs sums to 0"));
        /* the part before "[reported by": the op's own message */
        snprintf(msg[k], sizeof msg[k], "%.*s", (int)(strstr(m, " [reported") - m), m);
        nt_release(y);
        p[140 * C] = 1.0f;
        nt_release(t);
        t = nt_from_host(p, NT_F32, 2, SH(N, C));
        y = nt_multinomial(t, 3, 1);
        assert_int_equal(nt_to_host(y, out, sizeof out), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), "probs[150, 1] = nan"));
        p[140 * C] = 0.0f;
        nt_release(y);
        nt_release(t);
        nt_clear_error();
        assert_int_equal(nt_sync(), 0);
        /* still working */
        float q[2] = {0, 1};
        int32_t o[4];
        nt_tensor *t2 = nt_from_host(q, NT_F32, 1, SH(2));
        assert_int_equal(nt_to_host(nt_multinomial(t2, 4, 5), o, sizeof o), 0);
        for (int i = 0; i < 4; i++)
            assert_int_equal(o[i], 1);
        nt_release(t2);
    }
    assert_string_equal(msg[0], msg[1]);
}

/* ---------------- the default generator ---------------- */

/* n dropout masks of a [64] tensor of ones from nt_dropout_next(g), as
 * bits: mask k bit i set if element i was kept. */
static void next_masks(nt_generator *g, int n, uint64_t *masks)
{
    nt_tensor *x = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){64}));
    for (int k = 0; k < n; k++) {
        float v[64];
        nt_scope *sc = nt_scope_begin();
        nt_tensor *y = nt_dropout_next(x, 0.5, g);
        assert_non_null(y);
        assert_int_equal(nt_to_host(y, v, sizeof v), 0);
        nt_scope_end(sc);
        masks[k] = 0;
        for (int i = 0; i < 64; i++) {
            assert_true(v[i] == 0.0f || v[i] == 2.0f);
            masks[k] |= (uint64_t)(v[i] != 0.0f) << i;
        }
    }
    nt_release(x);
}

/* Without a seed: a fresh mask each call, the same sequence after each
 * nt_init, another one under another NT_SEED; each call moves the
 * generator by one; eval mode takes no draw; an explicit generator at the
 * same state draws the same masks as the default. */
static void test_default_generator(void **state)
{
    (void)state;
    uint64_t a[4], b[4], c[4], d[4], seed, off;
    nt_generator *g = nt_default_generator();
    assert_non_null(g);
    assert_int_equal(nt_generator_get_state(g, &seed, &off), 0);
    assert_int_equal(seed, 0);
    assert_int_equal(off, 0);
    next_masks(NULL, 4, a);
    for (int k = 1; k < 4; k++)
        assert_true(a[k] != a[k - 1]);
    assert_int_equal(nt_generator_get_state(g, &seed, &off), 0);
    assert_int_equal(off, 4);
    nt_set_training(false);
    nt_tensor *x = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){8}));
    nt_release(nt_dropout_next(x, 0.5, NULL));
    nt_set_training(true);
    assert_int_equal(nt_generator_get_state(g, &seed, &off), 0);
    assert_int_equal(off, 4);
    nt_generator_destroy(g); /* ignored: the thread's own */
    assert_int_equal(nt_generator_get_state(g, &seed, &off), 0);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    next_masks(NULL, 4, b);
    assert_memory_equal(a, b, sizeof a);
    nt_shutdown();
    setenv("NT_SEED", "5", 1);
    assert_int_equal(nt_init(), 0);
    unsetenv("NT_SEED");
    next_masks(NULL, 4, c);
    assert_memory_not_equal(a, c, sizeof a);
    nt_generator *mine = nt_generator_create(5);
    next_masks(mine, 4, d);
    assert_memory_equal(c, d, sizeof c);
    nt_generator_destroy(mine);
    nt_release(x);
    nt_shutdown();
    setenv("NT_SEED", "-1", 1);
    assert_int_equal(nt_init(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "NT_SEED"));
    unsetenv("NT_SEED");
    assert_int_equal(nt_init(), 0);
}

typedef struct {
    nt_generator *g;
    int ok;
    nt_generator *own;
    uint64_t own_seed, own_off;
} gen_thread;

static void *gen_hammer(void *arg)
{
    gen_thread *t = arg;
    for (int k = 0; k < 20000; k++) {
        if (nt_generator_advance(t->g, 1) == 0)
            t->ok++;
        else
            assert_int_equal(nt_last_error(), NT_ESTATE);
    }
    t->own = nt_default_generator();
    nt_generator_get_state(t->own, &t->own_seed, &t->own_off);
    return NULL;
}

/* Two threads on one generator: every call either moves it or is refused
 * whole (the offset counts exactly the calls that succeeded); each thread
 * has a default generator of its own, at (NT_SEED, 0). */
static void test_generator_two_threads(void **state)
{
    (void)state;
    nt_generator *g = nt_generator_create(3);
    gen_thread t[2] = {{g, 0, NULL, 0, 0}, {g, 0, NULL, 0, 0}};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, gen_hammer, &t[1]), 0);
    gen_hammer(&t[0]);
    pthread_join(th, NULL);
    uint64_t seed, off;
    assert_int_equal(nt_generator_get_state(g, &seed, &off), 0);
    assert_int_equal(off, (uint64_t)(t[0].ok + t[1].ok));
    assert_true(t[0].own != t[1].own);
    assert_int_equal(t[1].own_seed, 0);
    assert_int_equal(t[1].own_off, 0);
    nt_generator_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, nt_test_setup, nt_test_teardown)
        T(test_ce_ex_is_cross_entropy),
        T(test_ce_ex_values),
        T(test_ce_ex_edges),
        T(test_ce_ex_no_rows),
        T(test_dropout_values),
        T(test_dropout_fraction),
        T(test_dropout_backward),
        T(test_dropout_eval),
        T(test_clip_grad_norm),
        T(test_clip_grad_norm_scoped),
        T(test_topk_values),
        T(test_topk_backward),
        T(test_topk_0d),
        T(test_multinomial_values),
        T(test_multinomial_frequencies),
        T(test_multinomial_errors),
        T(test_default_generator),
        T(test_generator_two_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
