/* tests/test_cnn2.c - the CNN step's pooling kernel: max_pool2d_fwd
 * (cpu/pool.c, neuron/pool.c) behind nt_max_pool2d for f32 inputs.
 *
 * - values (x's, a NaN canonical) and indices against a double-precision scan of the windows
 *   written here (PyTorch's rule: the first maximum, a NaN: the last NaN),
 *   on odd shapes, padding, dilation, ceil_mode, a 1 x 1 kernel, more than
 *   128 planes (the simulator's planes-per-partition groups and their
 *   remainders), with +-0, +-Inf, NaN, ties and subnormals among the values;
 * - the same bits as the composite of ops it replaces (run also with
 *   NT_CPU_ISA=avx2 for the CPU's scalar 2 x 2 loop) (dispatcher's
 *   nt__pool_composed), forward and gradient, on every backend and mode;
 * - the gradient against a double sum over the windows, the backward
 *   kernel against a create_graph pass (scatter_add), and nt_gradcheck;
 * - bad input: each error names nt_max_pool2d and the argument. */
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
#include "dispatcher/dispatch.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

typedef struct pcase {
    int64_t n, c, h, w;
    int64_t k[2], s[2], p[2], d[2];
    bool ceil;
} pcase;

static const pcase cases[] = {
    {2, 3, 8, 8, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},    /* the CNN's downsampling */
    {1, 2, 7, 9, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},    /* odd: last row and column cut */
    {2, 3, 7, 5, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},    /* overlapping, padded */
    {1, 4, 9, 11, {3, 2}, {2, 1}, {1, 1}, {2, 2}, true},    /* dilation, ceil_mode */
    {1, 3, 5, 7, {2, 3}, {3, 2}, {1, 0}, {1, 1}, true},     /* a window past the input */
    {2, 2, 3, 4, {1, 1}, {1, 2}, {0, 0}, {1, 1}, false},    /* 1 x 1 */
    {1, 1, 1, 6, {1, 4}, {1, 1}, {0, 2}, {1, 1}, false},    /* H = 1 */
    {3, 100, 6, 6, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},  /* 300 planes: q > 1, remainders */
    {1, 131, 5, 5, {3, 3}, {1, 1}, {1, 1}, {1, 1}, false},  /* 131 planes, padded */
    {2, 3, 6, 41, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},   /* 20 windows a row: 16 + 4 */
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int64_t out_len(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil)
{
    int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
    int64_t o = num / s + 1;
    if (ceil && (o - 1) * s >= in + p)
        o--;
    return o;
}

/* Values with edge cases: seeded noise rounded to a few levels (ties), with
 * +-0, +-Inf, NaNs (two payloads) and subnormals sprinkled in. */
static float *make_x(int64_t n, uint64_t seed)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    uint64_t st = seed;
    for (int64_t i = 0; i < n; i++) {
        uint32_t r = nt_test_rand32(&st) % 64;
        x[i] = (float)((int)(nt_test_rand32(&st) % 9) - 4) * 0.5f;
        if (r == 0)
            x[i] = NAN;
        else if (r == 1)
            x[i] = nt_test_fbits(0x7fc01234u);
        else if (r == 2)
            x[i] = INFINITY;
        else if (r == 3)
            x[i] = -INFINITY;
        else if (r == 4)
            x[i] = -0.0f;
        else if (r == 5)
            x[i] = nt_test_fbits(0x00000003u);
    }
    return x;
}

/* x's bits, a NaN canonical (every f32 result's). */
static uint32_t canon(float v) { return isnan(v) ? 0x7fc00000u : nt_test_ubits(v); }

/* The double reference: for window (oh, ow) of each plane, the inside slot
 * the scan keeps (first maximum; the last NaN) and its position. */
static void ref_pool(const pcase *c, const float *x, int64_t OH, int64_t OW, int64_t *pos)
{
    int64_t HW = c->h * c->w;
    for (int64_t pl = 0; pl < c->n * c->c; pl++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t best = -1, nan = -1;
                double m = 0;
                for (int64_t a = 0; a < c->k[0]; a++)
                    for (int64_t b = 0; b < c->k[1]; b++) {
                        int64_t h = oh * c->s[0] - c->p[0] + a * c->d[0];
                        int64_t w = ow * c->s[1] - c->p[1] + b * c->d[1];
                        if (h < 0 || h >= c->h || w < 0 || w >= c->w)
                            continue;
                        double v = x[pl * HW + h * c->w + w];
                        if (isnan(v))
                            nan = h * c->w + w;
                        else if (best < 0 || v > m)
                            best = h * c->w + w, m = v;
                    }
                pos[(pl * OH + oh) * OW + ow] = nan >= 0 ? nan : best;
            }
}

static nt_tensor *pool(const pcase *c, nt_tensor *x, nt_tensor **idx)
{
    return nt_max_pool2d(x, c->k, c->s, c->p, c->d, c->ceil, idx);
}

typedef struct res {
    float *y, *dx;
    int32_t *idx;
    int64_t ny, nx;
} res;

/* y, idx and x's gradient of sum(y * gw) (gw: small multiples of 1/4, no
 * -0, so any order of adding a position's few terms is exact). */
static res run(const pcase *c, const float *xv, bool composed)
{
    atomic_store(&nt__pool_composed, composed ? 1 : 0);
    res r = {0};
    nt_scope *sc = nt_scope_begin();
    int64_t sh[4] = {c->n, c->c, c->h, c->w};
    nt_tensor *x = nt_test_leaf(xv, 4, sh), *idx = NULL;
    nt_tensor *y = pool(c, x, &idx);
    if (!y || !idx)
        fail_msg("pool: %s", nt_last_error_message());
    assert_true(nt_requires_grad(y));
    assert_false(nt_requires_grad(idx)); /* positions: no gradient */
    r.ny = nt_numel(y), r.nx = nt_numel(x);
    float *gv = malloc(sizeof(float) * (size_t)r.ny);
    for (int64_t i = 0; i < r.ny; i++)
        gv[i] = (float)(i % 7 + 1) * 0.25f;
    nt_tensor *gw = nt_from_host(gv, NT_F32, 4, (int64_t[]){c->n, c->c, nt_shape(y, 2), nt_shape(y, 3)});
    nt_tensor *l = nt_sum(nt_mul(nt_where(nt_ne(y, y), nt_zeros(NT_F32, 0, NULL), y), gw),
                          NT_DIM_ALL, false);
    if (!l || nt_backward(l))
        fail_msg("backward: %s", nt_last_error_message());
    r.y = nt_test_host(y);
    r.dx = nt_test_host(nt_grad(x));
    r.idx = malloc(sizeof(int32_t) * (size_t)r.ny);
    assert_int_equal(nt_to_host(idx, r.idx, sizeof(int32_t) * (size_t)r.ny), 0);
    free(gv);
    assert_int_equal(nt_scope_end(sc), 0);
    nt_release(x);
    atomic_store(&nt__pool_composed, 0);
    return r;
}

static void res_free(res *r) { free(r->y), free(r->dx), free(r->idx); }

/* The kernel against the double scan, the composite and configuration 0,
 * value, index and gradient bits, in every configuration. */
static void test_kernel(void **state)
{
    (void)state;
    for (int ci = 0; ci < NCASES; ci++) {
        const pcase *c = &cases[ci];
        int64_t OH = out_len(c->h, c->k[0], c->p[0], c->s[0], c->d[0], c->ceil);
        int64_t OW = out_len(c->w, c->k[1], c->p[1], c->s[1], c->d[1], c->ceil);
        int64_t nx = c->n * c->c * c->h * c->w, L = c->n * c->c * OH * OW, HW = c->h * c->w;
        float *x = make_x(nx, 77 + (uint64_t)ci);
        int64_t *pos = malloc(sizeof(int64_t) * (size_t)L);
        double *dref = calloc((size_t)nx, sizeof(double));
        ref_pool(c, x, OH, OW, pos);
        for (int64_t i = 0; i < L; i++) /* the loss's weights where y is not NaN */
            if (!isnan(x[i / (OH * OW) * HW + pos[i]]))
                dref[i / (OH * OW) * HW + pos[i]] += (double)(i % 7 + 1) * 0.25;
        res r0 = {0};
        for (int k = 0; k < NT_TEST_NCFG; k++) {
            nt_test_cfg(k);
            res r = run(c, x, false), rc = run(c, x, true);
            assert_int_equal(r.ny, L);
            for (int64_t i = 0; i < L; i++) {
                int64_t pl = i / (OH * OW);
                if (r.idx[i] != pos[i])
                    fail_msg("case %d cfg %d: index %lld is %d, expected %lld", ci, k, (long long)i,
                             r.idx[i], (long long)pos[i]);
                if (nt_test_ubits(r.y[i]) != canon(x[pl * HW + pos[i]]))
                    fail_msg("case %d cfg %d: y[%lld] %08x, expected x's %08x", ci, k,
                             (long long)i, nt_test_ubits(r.y[i]), canon(x[pl * HW + pos[i]]));
            }
            for (int64_t i = 0; i < nx; i++)
                if ((double)r.dx[i] != dref[i])
                    fail_msg("case %d cfg %d: dx[%lld] %.9g, expected %.9g", ci, k, (long long)i,
                             (double)r.dx[i], dref[i]);
            /* the composite: the same bits */
            assert_memory_equal(r.y, rc.y, sizeof(float) * (size_t)L);
            assert_memory_equal(r.idx, rc.idx, sizeof(int32_t) * (size_t)L);
            assert_memory_equal(r.dx, rc.dx, sizeof(float) * (size_t)nx);
            if (k == 0) {
                r0 = r;
            } else {
                assert_memory_equal(r.y, r0.y, sizeof(float) * (size_t)L);
                assert_memory_equal(r.dx, r0.dx, sizeof(float) * (size_t)nx);
                res_free(&r);
            }
            res_free(&rc);
        }
        res_free(&r0);
        free(x), free(pos), free(dref);
    }
    nt_test_cfg(0);
}

/* Unbatched [C, H, W] input and a plane too large for the kernel's on-chip
 * budget (the composite then): the double scan's values. */
static void test_unbatched_and_large(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        const pcase c3 = {1, 3, 5, 6, {2, 2}, {1, 2}, {1, 0}, {1, 1}, true};
        const pcase cl = {1, 1, 200, 200, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false};
        const pcase *cs[2] = {&c3, &cl};
        for (int j = 0; j < 2; j++) {
            const pcase *c = cs[j];
            nt_scope *sc = nt_scope_begin();
            int64_t OH = out_len(c->h, c->k[0], c->p[0], c->s[0], c->d[0], c->ceil);
            int64_t OW = out_len(c->w, c->k[1], c->p[1], c->s[1], c->d[1], c->ceil);
            int64_t nx = c->c * c->h * c->w, L = c->c * OH * OW, HW = c->h * c->w;
            float *x = make_x(nx, 5 + (uint64_t)j);
            int64_t *pos = malloc(sizeof(int64_t) * (size_t)L);
            ref_pool(c, x, OH, OW, pos);
            nt_tensor *xt = nt_from_host(x, NT_F32, 3, SH(c->c, c->h, c->w)), *idx = NULL;
            nt_tensor *y = pool(c, xt, &idx);
            assert_non_null(y);
            assert_int_equal(nt_ndim(y), 3);
            float *yv = nt_test_host(y);
            int32_t *iv = malloc(sizeof(int32_t) * (size_t)L);
            assert_int_equal(nt_to_host(idx, iv, sizeof(int32_t) * (size_t)L), 0);
            for (int64_t i = 0; i < L; i++) {
                assert_int_equal(iv[i], pos[i]);
                assert_int_equal(nt_test_ubits(yv[i]), canon(x[i / (OH * OW) * HW + pos[i]]));
            }
            free(x), free(pos), free(yv), free(iv);
            assert_int_equal(nt_scope_end(sc), 0);
        }
    }
    nt_test_cfg(0);
}

/* The backward kernel (max_pool2d_bwd) and a create_graph pass (the same
 * sums by scatter_add, recorded): the same bits; the latter's gradient
 * differentiates again (with respect to the loss's weights). */
static void test_create_graph(void **state)
{
    (void)state;
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        for (int ci = 2; ci <= 4; ci++) {
            const pcase *c = &cases[ci];
            nt_scope *sc = nt_scope_begin();
            int64_t n = c->n * c->c * c->h * c->w;
            float *a = make_x(n, 300 + (uint64_t)ci);
            for (int64_t i = 0; i < n; i++) /* finite values: the loss stays finite */
                if (!isfinite(a[i]))
                    a[i] = (float)(i % 5) - 2.0f;
            nt_tensor *x = nt_test_leaf(a, 4, SH(c->n, c->c, c->h, c->w));
            nt_tensor *y = pool(c, x, NULL);
            nt_tensor *w = nt_arange(NT_F32, 1.0, 1.0 + (double)nt_numel(y) * 0.375, 0.375);
            w = nt_detach(nt_reshape(w, 4, (int64_t[]){c->n, c->c, nt_shape(y, 2), nt_shape(y, 3)}));
            assert_int_equal(nt_set_requires_grad(w, true), 0);
            nt_tensor *l = nt_sum(nt_mul(y, w), NT_DIM_ALL, false);
            nt_tensor *g0 = nt_test_grad1(l, x, false), *g1 = nt_test_grad1(l, x, true);
            float *v0 = nt_test_host(g0), *v1 = nt_test_host(g1);
            assert_memory_equal(v0, v1, sizeof(float) * (size_t)n);
            /* each window's weight lands in dx once: d sum(dx) / dw = 1 */
            nt_tensor *gg = nt_test_grad1(nt_sum(g1, NT_DIM_ALL, false), w, false);
            float *vg = nt_test_host(gg);
            for (int64_t i = 0; i < nt_numel(w); i++)
                assert_true(vg[i] == 1.0f);
            free(a), free(v0), free(v1), free(vg);
            nt_release(x), nt_release(w);
            assert_int_equal(nt_scope_end(sc), 0);
        }
    }
    nt_test_cfg(0);
}

typedef struct gctx {
    const pcase *c;
} gctx;

static nt_tensor *gc_fn(nt_tensor *const *in, void *ctx)
{
    const gctx *g = ctx;
    return pool(g->c, in[0], NULL);
}

/* nt_gradcheck through the kernel, both backends (distinct values, so no
 * tie moves under the perturbation). */
static void test_gradcheck(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        nt_test_cfg(k);
        for (int ci = 2; ci <= 4; ci++) {
            const pcase *c = &cases[ci];
            nt_scope *sc = nt_scope_begin();
            int64_t n = c->n * c->c * c->h * c->w;
            float *a = malloc(sizeof(float) * (size_t)n);
            for (int64_t i = 0; i < n; i++)
                a[i] = (float)((i * 37) % n) * 0.1f - 2.0f;
            nt_tensor *x = nt_test_leaf(a, 4, SH(c->n, c->c, c->h, c->w));
            gctx g = {c};
            if (nt_gradcheck(gc_fn, &x, 1, &g, 1e-2, 2e-3, 2e-2))
                fail_msg("case %d: %s", ci, nt_last_error_message());
            free(a);
            assert_int_equal(nt_scope_end(sc), 0);
        }
    }
    nt_test_cfg(0);
}

#define PERR(call) ((call) ? 0 : nt_last_error())

/* Bad input, with the kernel in place: each error names the function and
 * the argument, and no indices are handed out. */
static void test_errors(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_zeros(NT_F32, 4, SH(1, 2, 5, 5)), *idx = (nt_tensor *)1;
    nt_test_expect_err(PERR(nt_max_pool2d(x, SH(2, 2), SH(0, 1), NULL, NULL, false, &idx)),
                       NT_EINVAL, "nt_max_pool2d", "'stride'");
    assert_null(idx);
    nt_test_expect_err(PERR(nt_max_pool2d(x, SH(2, 2), SH(2, -1), NULL, NULL, false, NULL)),
                       NT_EINVAL, "nt_max_pool2d", "'stride'");
    nt_test_expect_err(PERR(nt_max_pool2d(x, SH(-2, 2), NULL, NULL, NULL, false, NULL)),
                       NT_EINVAL, "nt_max_pool2d", "'kernel_size'");
    nt_test_expect_err(PERR(nt_max_pool2d(x, SH(2, 2), NULL, SH(2, 0), NULL, false, NULL)),
                       NT_EINVAL, "nt_max_pool2d", "'padding'", "half");
    nt_test_expect_err(PERR(nt_max_pool2d(x, SH(7, 2), NULL, NULL, NULL, false, NULL)),
                       NT_ESHAPE, "nt_max_pool2d", "'input'", "output");
    nt_test_expect_err(PERR(nt_max_pool2d(x, SH(3, 3), NULL, SH(1, 1), SH(4, 1), false, NULL)),
                       NT_ESHAPE, "nt_max_pool2d", "'input'");
    nt_test_expect_err(PERR(nt_max_pool2d(x, SH(2, 2), NULL, NULL, SH(1, -1), false, NULL)),
                       NT_EINVAL, "nt_max_pool2d", "'dilation'");
    nt_test_expect_err(PERR(nt_max_pool2d(nt_zeros(NT_F32, 2, SH(5, 5)), SH(2, 2), NULL, NULL,
                                          NULL, false, NULL)),
                       NT_ESHAPE, "nt_max_pool2d", "'input'");
    nt_test_expect_err(PERR(nt_max_pool2d(nt_zeros(NT_I32, 4, SH(1, 2, 5, 5)), SH(2, 2), NULL,
                                          NULL, NULL, false, NULL)),
                       NT_EDTYPE, "nt_max_pool2d", "'input'");
    nt_test_expect_err(PERR(nt_max_pool2d(NULL, SH(2, 2), NULL, NULL, NULL, false, NULL)),
                       NT_EINVAL, "nt_max_pool2d", "'input'");
    assert_int_equal(nt_scope_end(sc), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kernel, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_unbatched_and_large, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_create_graph, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_errors, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
