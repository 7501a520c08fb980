/* tests/test_padsort.c - nt_pad, nt_roll, nt_sort, nt_argsort and
 * nt_interpolate (issue 33): against PyTorch 1.13 (tests/torch_refs/padsort.h,
 * written by scripts/torch_refs/padsort.py: odd shapes, negative pads,
 * reflect edges, ties, +-0 and NaN for sort, gradients), against the
 * definitions computed again here in double, gradcheck, the same bits on
 * both backends and in every mode (captured too), and every error path.
 *
 * Bounds against PyTorch: values bitwise (NaN: any NaN) -- pad, roll and
 * sort move elements, nearest picks them with PyTorch's f32 index
 * arithmetic, bilinear computes PyTorch's f32 weights and products in its
 * order -- except bilinear's values: PyTorch's CPU kernel is built with FMA
 * contraction (t = fma(x0, w0, x1 * w1) along W, then fma(t0, h0, t1 * h1),
 * found by probing torch 1.13 here), ntensor rounds every product
 * (-ffp-contract=off, docs/exactness.md), so within 2e-6 absolute (|x| <= 4:
 * a few roundings of terms of at most 4).  Gradients bitwise where each input element receives at
 * most two contributions (two f32 additions from +0 commute exactly: pad constant, roll, sort, and
 * the one-dim reflect pads); elsewhere (several contributions added in g's row-major order,
 * PyTorch's own order differing) within 4e-6 absolute, w and g being in [-1, 1] with at most 16
 * contributions per element. */
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
#include "torch_refs/padsort.h"

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t u_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static nt_tensor *from_bits(const uint32_t *u, int nd, const int64_t *sh)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= sh[i];
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = f_of(u[i]);
    nt_tensor *t = nt_from_host(f, NT_F32, nd, sh);
    free(f);
    assert_non_null(t);
    return t;
}

static const int64_t SH3[3] = {3, 5, 7}, SH4[4] = {2, 3, 5, 7};

/* ---------------- the cases ---------------- */

enum { K_PAD, K_ROLL, K_SORT, K_INTERP, NKIND };
static const int NCASE[NKIND] = {
    sizeof PS_PAD / sizeof PS_PAD[0], sizeof PS_ROLL / sizeof PS_ROLL[0],
    sizeof PS_SORT / sizeof PS_SORT[0], sizeof PS_INTERP / sizeof PS_INTERP[0]};
static const char *const KNAME[NKIND] = {"pad", "roll", "sort", "interpolate"};

static nt_tensor *apply(int kind, int ci, nt_tensor *x, nt_tensor **ix)
{
    switch (kind) {
    case K_PAD:
        return nt_pad(x, PS_PAD[ci].npad, PS_PAD[ci].pads, (nt_pad_mode)PS_PAD[ci].mode,
                      PS_PAD[ci].value);
    case K_ROLL:
        return nt_roll(x, PS_ROLL[ci].n, PS_ROLL[ci].shifts, PS_ROLL[ci].dims);
    case K_SORT: {
        nt_tensor *v = NULL;
        if (nt_sort(x, PS_SORT[ci].dim, PS_SORT[ci].descending, true, &v, ix))
            return NULL;
        return v;
    }
    default:
        return nt_interpolate(x, PS_INTERP[ci].oh, PS_INTERP[ci].ow,
                              (nt_interp_mode)PS_INTERP[ci].mode, PS_INTERP[ci].align);
    }
}

static const uint32_t *case_x(int kind, int *nd, const int64_t **sh)
{
    *nd = kind == K_INTERP ? 4 : 3;
    *sh = kind == K_INTERP ? SH4 : SH3;
    return kind == K_INTERP ? ps_ix : kind == K_SORT ? ps_sx : ps_x;
}

static const uint32_t *case_w(int kind, int ci)
{
    return kind == K_PAD ? PS_PAD[ci].w : kind == K_ROLL ? PS_ROLL[ci].w
                                        : kind == K_SORT ? PS_SORT[ci].w : PS_INTERP[ci].w;
}

typedef struct {
    int ndim;
    int64_t shape[4], n, nx;
    float *y, *gx;
    int32_t *ix; /* sort */
} run;

static void run_free(run *r)
{
    free(r->y);
    free(r->gx);
    free(r->ix);
}

/* y = op(x), then sum(y * w) backward: y, x's gradient, sort's indices */
static run run_case(int kind, int ci)
{
    run R = {0};
    int nd;
    const int64_t *sh;
    const uint32_t *xb = case_x(kind, &nd, &sh);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = from_bits(xb, nd, sh), *ix = NULL;
    nt_set_requires_grad(x, true);
    nt_tensor *y = apply(kind, ci, x, &ix);
    if (!y)
        fail_msg("%s case %d: %s", KNAME[kind], ci, nt_last_error_message());
    R.ndim = nt_ndim(y);
    R.n = nt_numel(y);
    R.nx = nt_numel(x);
    for (int i = 0; i < R.ndim; i++)
        R.shape[i] = nt_shape(y, i);
    nt_tensor *w = from_bits(case_w(kind, ci), R.ndim, R.shape);
    assert_int_equal(nt_backward(nt_sum(nt_mul(y, w), NT_DIM_ALL, false)), 0);
    R.y = malloc((size_t)(R.n ? R.n : 1) * sizeof *R.y);
    R.gx = malloc((size_t)R.nx * sizeof *R.gx);
    assert_int_equal(nt_to_host(y, R.y, (size_t)R.n * sizeof *R.y), 0);
    assert_int_equal(nt_to_host(nt_grad(x), R.gx, (size_t)R.nx * sizeof *R.gx), 0);
    if (ix) {
        assert_int_equal(nt_dtype_of(ix), NT_I32);
        R.ix = malloc((size_t)R.n * sizeof *R.ix);
        assert_int_equal(nt_to_host(ix, R.ix, (size_t)R.n * sizeof *R.ix), 0);
    }
    assert_int_equal(nt_scope_end(sc), 0);
    return R;
}

static bool same(float a, float b) { return (isnan(a) && isnan(b)) || u_of(a) == u_of(b); }

/* reflect/replicate pads of two dims, nearest upsampling and bilinear add
 * several contributions per element (see the top) */
static double grad_tol(int kind, int ci)
{
    if (kind == K_PAD) /* replicate: an edge gets pad + 1 contributions */
        return PS_PAD[ci].mode == NT_PAD_REPLICATE || PS_PAD[ci].mode == NT_PAD_CIRCULAR ||
               (PS_PAD[ci].mode == NT_PAD_REFLECT && PS_PAD[ci].npad > 2) ? 4e-6 : 0;
    return kind == K_INTERP ? 4e-6 : 0;
}

/* every case on every backend and mode: PyTorch's values and gradients,
 * and the bits of the first configuration everywhere */
static void test_vs_torch_all_configs(void **state)
{
    (void)state;
    for (int kind = 0; kind < NKIND; kind++)
        for (int ci = 0; ci < NCASE[kind]; ci++) {
            run ref = {0};
            for (int k = 0; k < NT_TEST_NCFG; k++) {
                nt_test_cfg(k);
                run R = run_case(kind, ci);
                const uint32_t *wy = kind == K_PAD ? PS_PAD[ci].y : kind == K_ROLL ? PS_ROLL[ci].y
                                   : kind == K_SORT ? PS_SORT[ci].v : PS_INTERP[ci].y;
                const uint32_t *wg = kind == K_PAD ? PS_PAD[ci].gx : kind == K_ROLL
                                   ? PS_ROLL[ci].gx : kind == K_SORT ? PS_SORT[ci].gx
                                   : PS_INTERP[ci].gx;
                if (kind == K_PAD)
                    for (int i = 0; i < 3; i++)
                        assert_int_equal(R.shape[i], PS_PAD[ci].shape[i]);
                bool bil = kind == K_INTERP && PS_INTERP[ci].mode == NT_INTERP_BILINEAR;
                for (int64_t i = 0; i < R.n; i++)
                    if (bil ? !(fabs(R.y[i] - f_of(wy[i])) <= 2e-6) : !same(R.y[i], f_of(wy[i])))
                        fail_msg("%s case %d on %s/%s: y[%lld] = %a, PyTorch %a", KNAME[kind], ci,
                                 NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], (long long)i,
                                 (double)R.y[i], (double)f_of(wy[i]));
                double tol = grad_tol(kind, ci);
                for (int64_t i = 0; i < R.nx; i++)
                    if (tol ? !(fabs(R.gx[i] - f_of(wg[i])) <= tol) : !same(R.gx[i], f_of(wg[i])))
                        fail_msg("%s case %d on %s/%s: gx[%lld] = %a, PyTorch %a", KNAME[kind], ci,
                                 NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], (long long)i,
                                 (double)R.gx[i], (double)f_of(wg[i]));
                if (kind == K_SORT)
                    for (int64_t i = 0; i < R.n; i++)
                        if (R.ix[i] != PS_SORT[ci].i[i])
                            fail_msg("sort case %d on %s/%s: index[%lld] = %d, PyTorch %d", ci,
                                     NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], (long long)i, R.ix[i],
                                     PS_SORT[ci].i[i]);
                if (k == 0) {
                    ref = R;
                    continue;
                }
                assert_memory_equal(R.y, ref.y, (size_t)R.n * sizeof *R.y);
                assert_memory_equal(R.gx, ref.gx, (size_t)R.nx * sizeof *R.gx);
                run_free(&R);
            }
            run_free(&ref);
        }
    nt_test_cfg(0);
}

/* ---------------- the definitions again, in double ---------------- */

/* output coordinate o of dim d (size n, output size m) -> source, or -1 */
static int64_t host_src(int kind, int ci, int d, int64_t o, int64_t n, int64_t m)
{
    if (kind == K_PAD) {
        int p = 2 - d; /* dims counted from the last */
        int64_t l = 2 * p < PS_PAD[ci].npad ? PS_PAD[ci].pads[2 * p] : 0, i = o - l;
        int64_t r = 2 * p < PS_PAD[ci].npad ? PS_PAD[ci].pads[2 * p + 1] : 0;
        if (PS_PAD[ci].mode == NT_PAD_CIRCULAR) { /* the crop [a, b), wrapped */
            int64_t a = l < 0 ? -l : 0, b = r < 0 ? n + r : n, L = l > 0 ? l : 0;
            return a + ((o - L) % (b - a) + (b - a)) % (b - a);
        }
        if (PS_PAD[ci].mode == NT_PAD_CONSTANT)
            return i >= 0 && i < n ? i : -1;
        if (PS_PAD[ci].mode == NT_PAD_REPLICATE)
            return i < 0 ? 0 : i > n - 1 ? n - 1 : i;
        while (i < 0 || i >= n) /* reflect about 0 and n - 1 */
            i = i < 0 ? -i : 2 * (n - 1) - i;
        return i;
    }
    if (kind == K_ROLL) {
        int64_t s = 0;
        for (int k = 0; k < PS_ROLL[ci].n; k++)
            if ((PS_ROLL[ci].dims[k] + 3) % 3 == d)
                s += PS_ROLL[ci].shifts[k];
        return ((o - s) % n + n) % n;
    }
    return o * n / m; /* nearest: floor(o * in / out), exactly */
}

/* the flat source of every output element (pad, roll, nearest), -1 for
 * the constant; a flattened roll directly */
static int64_t *host_map(int kind, int ci, const run *R, int nd, const int64_t *sh)
{
    int64_t *src = malloc((size_t)(R->n ? R->n : 1) * sizeof *src);
    for (int64_t f = 0; f < R->n; f++) {
        if (kind == K_ROLL && !PS_ROLL[ci].dims) {
            int64_t N = R->nx, s = PS_ROLL[ci].shifts[0];
            src[f] = ((f - s) % N + N) % N;
            continue;
        }
        int64_t rem = f, c[4], s = 0;
        for (int d = nd - 1; d >= 0; d--) {
            c[d] = rem % R->shape[d];
            rem /= R->shape[d];
        }
        for (int d = 0; d < nd && s >= 0; d++) {
            int64_t i = host_src(kind, ci, d - (nd - 3), c[d], sh[d], R->shape[d]);
            s = i < 0 ? -1 : s * sh[d] + i;
        }
        src[f] = s;
    }
    return src;
}

/* PyTorch's bilinear weights, in double: output o -> i0, i1, w0, w1 */
static void host_linear(int64_t o, int64_t in, int64_t out, bool al, int64_t *i0, int64_t *i1,
                        double *w0, double *w1)
{
    double r = al ? (out > 1 ? (double)o * (in - 1) / (out - 1) : 0)
                  : ((double)o + 0.5) * in / out - 0.5;
    if (out == in)
        r = (double)o;
    if (r < 0)
        r = 0;
    *i0 = (int64_t)r;
    *i1 = *i0 < in - 1 ? *i0 + 1 : *i0;
    *w1 = r - (double)*i0;
    *w0 = 1 - *w1;
}

static void check_near(const char *what, int kind, int ci, int64_t i, double got, double want,
                       double tol)
{
    if (isnan(want) ? !isnan(got) : !(fabs(got - want) <= tol))
        fail_msg("%s case %d: %s[%lld] = %.9g, the definition in double %.9g", KNAME[kind], ci,
                 what, (long long)i, got, want);
}

static void check_bilinear(int ci, const run *R, const float *x, const float *w)
{
    int64_t OH = R->shape[2], OW = R->shape[3], H = 5, W = 7;
    double *gx = calloc((size_t)R->nx, sizeof *gx);
    bool al = PS_INTERP[ci].align;
    for (int64_t f = 0; f < R->n; f++) {
        int64_t ow = f % OW, oh = f / OW % OH, nc = f / (OW * OH), h[2], v[2];
        double wh[2], wv[2], y = 0;
        host_linear(oh, H, OH, al, &h[0], &h[1], &wh[0], &wh[1]);
        host_linear(ow, W, OW, al, &v[0], &v[1], &wv[0], &wv[1]);
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                int64_t s = (nc * H + h[a]) * W + v[b];
                y += wh[a] * wv[b] * x[s];
                gx[s] += wh[a] * wv[b] * w[f];
            }
        check_near("y", K_INTERP, ci, f, R->y[f], y, 2e-5); /* f32 weights: |x| <= 4 */
    }
    for (int64_t i = 0; i < R->nx; i++)
        check_near("gx", K_INTERP, ci, i, R->gx[i], gx[i], 2e-5);
    free(gx);
}

/* stable order of core/sample.h's nt__topk_before, written again */
static bool host_before(double a, int64_t ia, double b, int64_t ib, bool desc)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b) ? ia < ib : desc ? isnan(a) : isnan(b);
    return a == b ? ia < ib : desc ? a > b : a < b;
}

static void check_sort(int ci, const run *R, const float *x, const float *w)
{
    int d = (PS_SORT[ci].dim + 3) % 3;
    int64_t n = SH3[d], st = d == 2 ? 1 : d == 1 ? 7 : 35;
    double *gx = calloc((size_t)R->nx, sizeof *gx);
    for (int64_t base = 0; base < R->nx; base++) {
        if (base / st % n) /* the first element of each line */
            continue;
        int64_t ord[8];
        for (int64_t j = 0; j < n; j++) { /* insertion sort: stable */
            int64_t k = j;
            while (k > 0 && host_before(x[base + j * st], j, x[base + ord[k - 1] * st], ord[k - 1],
                                        PS_SORT[ci].descending)) {
                ord[k] = ord[k - 1];
                k--;
            }
            ord[k] = j;
        }
        for (int64_t j = 0; j < n; j++) {
            int64_t o = base + j * st;
            if (R->ix[o] != ord[j] || !same(R->y[o], x[base + ord[j] * st]))
                fail_msg("sort case %d: element %lld is x[%d] = %a, the definition x[%lld]", ci,
                         (long long)o, R->ix[o], (double)R->y[o], (long long)ord[j]);
            gx[base + ord[j] * st] += w[o];
        }
    }
    for (int64_t i = 0; i < R->nx; i++)
        check_near("gx", K_SORT, ci, i, R->gx[i], gx[i], 0);
    free(gx);
}

static void check_gather(int kind, int ci, const run *R, const float *x, const float *w)
{
    int nd;
    const int64_t *sh;
    case_x(kind, &nd, &sh);
    int64_t *src = host_map(kind, ci, R, nd, sh);
    double *gx = calloc((size_t)R->nx, sizeof *gx);
    for (int64_t f = 0; f < R->n; f++) {
        double want = src[f] < 0 ? PS_PAD[ci].value : x[src[f]];
        if (!same(R->y[f], (float)want))
            fail_msg("%s case %d: y[%lld] = %a, the definition %a", KNAME[kind], ci,
                     (long long)f, (double)R->y[f], want);
        if (src[f] >= 0)
            gx[src[f]] += w[f];
    }
    for (int64_t i = 0; i < R->nx; i++)
        check_near("gx", kind, ci, i, R->gx[i], gx[i],
                   kind == K_INTERP || (kind == K_PAD && PS_PAD[ci].mode) ? 1e-6 : 0);
    free(src);
    free(gx);
}

/* every case against the definitions in double (on the CPU: the bits are
 * the same everywhere, test_vs_torch_all_configs) */
static void test_vs_definition(void **state)
{
    (void)state;
    nt_test_cfg(0);
    for (int kind = 0; kind < NKIND; kind++)
        for (int ci = 0; ci < NCASE[kind]; ci++) {
            int nd;
            const int64_t *sh;
            const uint32_t *xb = case_x(kind, &nd, &sh), *wb = case_w(kind, ci);
            run R = run_case(kind, ci);
            float *x = malloc((size_t)R.nx * sizeof *x), *w = malloc((size_t)(R.n + 1) * sizeof *w);
            for (int64_t i = 0; i < R.nx; i++)
                x[i] = f_of(xb[i]);
            for (int64_t i = 0; i < R.n; i++)
                w[i] = f_of(wb[i]);
            if (kind == K_SORT)
                check_sort(ci, &R, x, w);
            else if (kind == K_INTERP && PS_INTERP[ci].mode == NT_INTERP_BILINEAR)
                check_bilinear(ci, &R, x, w);
            else
                check_gather(kind, ci, &R, x, w);
            free(x);
            free(w);
            run_free(&R);
        }
}

/* ---------------- gradcheck ---------------- */

typedef struct {
    int kind, ci;
} gc_ctx;

static nt_tensor *gc_fn(nt_tensor *const *in, void *ctx)
{
    const gc_ctx *c = ctx;
    static const int64_t p1[4] = {2, 1, -1, 2}, p2[4] = {1, 3, 2, 0}, p3[2] = {3, -2};
    static const int64_t sh[3] = {2, -3, 1};
    static const int dims[3] = {0, 2, 1};
    nt_tensor *ix = NULL;
    switch (c->kind * 10 + c->ci) {
    case 0: return nt_pad(in[0], 4, p1, NT_PAD_CONSTANT, 0.25);
    case 1: return nt_pad(in[0], 4, p2, NT_PAD_REFLECT, 0);
    case 2: return nt_pad(in[0], 2, p3, NT_PAD_REPLICATE, 0);
    case 10: return nt_roll(in[0], 3, sh, dims);
    case 11: return nt_roll(in[0], 1, sh + 1, NULL);
    case 20: {
        nt_tensor *v = NULL;
        return nt_sort(in[0], 1, false, true, &v, &ix) ? NULL : v;
    }
    case 21: {
        nt_tensor *v = NULL;
        return nt_sort(in[0], -1, true, false, &v, &ix) ? NULL : v;
    }
    case 30: return nt_interpolate(in[0], 5, 7, NT_INTERP_NEAREST, false);
    case 31: return nt_interpolate(in[0], 7, 3, NT_INTERP_BILINEAR, false);
    default: return nt_interpolate(in[0], 2, 9, NT_INTERP_BILINEAR, true);
    }
}

/* The gradients against central differences: every op here is piecewise
 * linear, so they agree to f32 rounding (sort: distinct values, 0.1
 * apart, so eps = 1e-2 crosses no tie). */
static void test_gradcheck(void **state)
{
    (void)state;
    static const int cases[][2] = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {2, 0},
                                   {2, 1}, {3, 0}, {3, 1}, {3, 2}};
    for (int b = 0; b < 2; b++) {
        nt_test_cfg(b);
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            gc_ctx c = {cases[k][0], cases[k][1]};
            nt_scope *sc = nt_scope_begin();
            int64_t sh4[4] = {1, 2, 3, 4};
            float h[24];
            for (int i = 0; i < 24; i++)
                h[i] = (float)((i * 7) % 24) * 0.1f - 1.0f; /* distinct */
            nt_tensor *x = nt_from_host(h, NT_F32, c.kind == 3 ? 4 : 3,
                                        c.kind == 3 ? sh4 : sh4 + 1);
            nt_set_requires_grad(x, true);
            int rc = nt_gradcheck(gc_fn, &x, 1, &c, 1e-2, 1e-3, 1e-3);
            if (rc)
                fail_msg("%s gradcheck %d on %s: %s", KNAME[c.kind], c.ci, NT_TEST_CFGS[b][0],
                         nt_last_error_message());
            assert_int_equal(nt_scope_end(sc), 0);
        }
    }
    nt_test_cfg(0);
}

/* ---------------- captured ---------------- */

/* a captured forward (pad, roll, sort, interpolate) replayed on other
 * inputs gives the eager bits */
static void test_captured(void **state)
{
    (void)state;
    for (int k = 4; k <= 5; k++) { /* cpu and sim, lazy */
        nt_test_cfg(k);
        for (int kind = 0; kind < NKIND; kind++)
            for (int ci = 0; ci < NCASE[kind]; ci++) {
                int nd;
                const int64_t *sh;
                const uint32_t *xb = case_x(kind, &nd, &sh);
                nt_scope *sc = nt_scope_begin();
                nt_tensor *x2 = from_bits(xb, nd, sh), *ix = NULL, *ix2 = NULL;
                nt_tensor *want = apply(kind, ci, x2, &ix);
                assert_non_null(want);
                nt_tensor *x = nt_zeros_like(x2);
                assert_int_equal(nt_sync(), 0);
                assert_int_equal(nt_graph_capture_begin(), 0);
                assert_int_equal(nt_graph_input(x, "x"), 0);
                nt_tensor *y = apply(kind, ci, x, &ix2);
                nt_graph *g = nt_graph_capture_end();
                if (!g || !y)
                    fail_msg("%s case %d: %s", KNAME[kind], ci, nt_last_error_message());
                assert_int_equal(nt_graph_bind(g, "x", x2), 0);
                assert_int_equal(nt_graph_replay(g), 0);
                int64_t n = nt_numel(y);
                float *a = malloc((size_t)(n + 1) * sizeof *a),
                      *b = malloc((size_t)(n + 1) * sizeof *b);
                assert_int_equal(nt_to_host(y, a, (size_t)n * sizeof *a), 0);
                assert_int_equal(nt_to_host(want, b, (size_t)n * sizeof *b), 0);
                assert_memory_equal(a, b, (size_t)n * sizeof *a);
                if (ix) {
                    assert_int_equal(nt_to_host(ix2, a, (size_t)n * 4), 0);
                    assert_int_equal(nt_to_host(ix, b, (size_t)n * 4), 0);
                    assert_memory_equal(a, b, (size_t)n * 4);
                }
                free(a);
                free(b);
                nt_graph_destroy(g);
                assert_int_equal(nt_scope_end(sc), 0);
            }
    }
    nt_test_cfg(0);
}

/* ---------------- other dtypes, 0-d, empty, argsort ---------------- */

static void test_dtypes_and_edges(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        nt_test_cfg(b);
        nt_scope *sc = nt_scope_begin();
        int32_t xi[6] = {5, -1, 7, 7, 0, -3}, got[40];
        int64_t sh[2] = {2, 3};
        nt_tensor *x = nt_from_host(xi, NT_I32, 2, sh);
        /* constant pad of an i32 with 9.7 -> 9 (rounded as nt_full), crop a row */
        int64_t p[4] = {1, 0, -1, 1};
        nt_tensor *y = nt_pad(x, 4, p, NT_PAD_CONSTANT, 9.7);
        assert_non_null(y);
        assert_int_equal(nt_dtype_of(y), NT_I32);
        assert_int_equal(nt_shape(y, 0), 2);
        assert_int_equal(nt_shape(y, 1), 4);
        assert_int_equal(nt_to_host(y, got, 8 * 4), 0);
        int32_t want[8] = {9, 7, 0, -3, 9, 9, 9, 9};
        assert_memory_equal(got, want, sizeof want);
        /* roll of an i32, flattened */
        int64_t s = -2;
        y = nt_roll(x, 1, &s, NULL);
        assert_int_equal(nt_to_host(y, got, 6 * 4), 0);
        int32_t wr[6] = {7, 7, 0, -3, 5, -1};
        assert_memory_equal(got, wr, sizeof wr);
        /* sort of an i32 (descending, ties by index), argsort the same */
        nt_tensor *v, *ix;
        assert_int_equal(nt_sort(x, 1, true, true, &v, &ix), 0);
        assert_int_equal(nt_to_host(v, got, 6 * 4), 0);
        int32_t ws[6] = {7, 5, -1, 7, 0, -3}, wi[6] = {2, 0, 1, 0, 1, 2};
        assert_memory_equal(got, ws, sizeof ws);
        assert_int_equal(nt_to_host(ix, got, 6 * 4), 0);
        assert_memory_equal(got, wi, sizeof wi);
        nt_tensor *a = nt_argsort(x, -1, true, false);
        assert_non_null(a);
        assert_int_equal(nt_to_host(a, got, 6 * 4), 0);
        assert_memory_equal(got, wi, sizeof wi);
        /* nearest of an i32 [1, 1, 2, 3] -> [1, 1, 4, 2] */
        int64_t sh4[4] = {1, 1, 2, 3};
        y = nt_interpolate(nt_reshape(x, 4, sh4), 4, 2, NT_INTERP_NEAREST, false);
        assert_int_equal(nt_to_host(y, got, 8 * 4), 0);
        int32_t wn[8] = {5, -1, 5, -1, 7, 0, 7, 0};
        assert_memory_equal(got, wn, sizeof wn);
        /* 0-d: roll with dims omitted, sort along 0 or -1 */
        float f = 2.5f, g;
        nt_tensor *z = nt_from_host(&f, NT_F32, 0, NULL);
        y = nt_roll(z, 1, &s, NULL);
        assert_non_null(y);
        assert_int_equal(nt_ndim(y), 0);
        assert_int_equal(nt_to_host(y, &g, 4), 0);
        assert_true(g == 2.5f);
        assert_int_equal(nt_sort(z, -1, false, true, &v, &ix), 0);
        assert_int_equal(nt_ndim(v), 0);
        assert_int_equal(nt_ndim(ix), 0);
        /* empty: a sort along an empty dim, a roll of nothing, a crop to 0 */
        int64_t she[2] = {0, 3};
        nt_tensor *e = nt_zeros(NT_F32, 2, she);
        assert_int_equal(nt_sort(e, 0, false, true, &v, &ix), 0);
        assert_int_equal(nt_numel(v), 0);
        y = nt_roll(e, 1, &s, (int[]){0});
        assert_non_null(y);
        assert_int_equal(nt_numel(y), 0);
        int64_t pc[2] = {-3, 0};
        y = nt_pad(x, 2, pc, NT_PAD_CONSTANT, 0);
        assert_non_null(y);
        assert_int_equal(nt_shape(y, 1), 0);
        /* an empty dim padded: only the value (PyTorch: F.pad(zeros(2, 0), (1, 2), value=3)) */
        int64_t pe[2] = {1, 2};
        y = nt_pad(e, 2, pe, NT_PAD_CONSTANT, 3);
        assert_non_null(y);
        assert_int_equal(nt_shape(y, 0), 0);
        assert_int_equal(nt_shape(y, 1), 6);
        nt_tensor *e2 = nt_zeros(NT_F32, 2, (int64_t[]){2, 0});
        y = nt_pad(e2, 2, pe, NT_PAD_CONSTANT, 3);
        float fg[6];
        assert_int_equal(nt_to_host(y, fg, sizeof fg), 0);
        for (int i = 0; i < 6; i++)
            assert_true(fg[i] == 3.0f);
        /* nothing to do: still a new tensor with x's values */
        y = nt_pad(x, 0, NULL, NT_PAD_CONSTANT, 0);
        assert_non_null(y);
        assert_true(y != x);
        assert_int_equal(nt_to_host(y, got, 6 * 4), 0);
        assert_memory_equal(got, xi, sizeof xi);
        assert_int_equal(nt_scope_end(sc), 0);
    }
    nt_test_cfg(0);
}

/* ---------------- bad input ---------------- */

static void test_bad_input(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    int64_t sh[3] = {2, 3, 4}, p2[2] = {1, 1}, p4[4] = {1, 1, 1, 1}, big[2] = {4, 0};
    int64_t crop[2] = {-5, 1}, p8[8] = {0};
    nt_tensor *x = nt_zeros(NT_F32, 3, sh), *v, *ix;
    nt_tensor *xi = nt_zeros(NT_I32, 4, (int64_t[]){1, 1, 2, 2});
    nt_tensor *x2 = nt_zeros(NT_F32, 2, (int64_t[]){3, 4});
    nt_tensor *x4 = nt_zeros(NT_F32, 4, (int64_t[]){1, 1, 0, 2});
    /* pad */
    nt_test_expect_err(nt_pad(NULL, 2, p2, NT_PAD_CONSTANT, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad");
    nt_test_expect_err(nt_pad(x, 2, p2, (nt_pad_mode)7, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "'mode' is 7");
    nt_test_expect_err(nt_pad(x, 2, NULL, NT_PAD_CONSTANT, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "'pads' is NULL");
    nt_test_expect_err(nt_pad(x, -2, p2, NT_PAD_CONSTANT, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "'pads'");
    nt_test_expect_err(nt_pad(x, 3, p4, NT_PAD_CONSTANT, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "'npad' is 3", "even");
    nt_test_expect_err(nt_pad(x, 8, p8, NT_PAD_CONSTANT, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "'npad' is 8", "at most 6");
    nt_test_expect_err(nt_pad(x, 2, p2, NT_PAD_REFLECT, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "'value' is 1", "reflect");
    nt_test_expect_err(nt_pad(x2, 4, p4, NT_PAD_REFLECT, 0) ? 0 : nt_last_error(), NT_ESHAPE,
                       "nt_pad", "x has 2 dims", "3 or 4");
    nt_test_expect_err(nt_pad(x, 2, big, NT_PAD_REFLECT, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "pads[0] = 4", "size 4", "reflect");
    nt_test_expect_err(nt_pad(x, 2, crop, NT_PAD_CONSTANT, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "pads[0] = -5", "constant");
    nt_tensor *xe = nt_zeros(NT_F32, 2, (int64_t[]){2, 0});
    nt_test_expect_err(nt_pad(xe, 2, p2, NT_PAD_REPLICATE, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "size 0", "replicate");
    int64_t wrap[2] = {-2, 3};
    nt_test_expect_err(nt_pad(x, 2, wrap, NT_PAD_CIRCULAR, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_pad", "pads[1] = 3", "circular");
    nt_test_expect_err(nt_pad(x2, 2, p2, NT_PAD_CIRCULAR, 0) ? 0 : nt_last_error(), NT_ESHAPE,
                       "nt_pad", "x has 2 dims", "circular");
    /* roll */
    int64_t s2[2] = {1, 2};
    nt_test_expect_err(nt_roll(NULL, 1, s2, NULL) ? 0 : nt_last_error(), NT_EINVAL, "nt_roll");
    nt_test_expect_err(nt_roll(x, 0, s2, NULL) ? 0 : nt_last_error(), NT_EINVAL, "nt_roll",
                       "'shifts'");
    nt_test_expect_err(nt_roll(x, 1, NULL, NULL) ? 0 : nt_last_error(), NT_EINVAL, "nt_roll",
                       "'shifts' is NULL");
    nt_test_expect_err(nt_roll(x, 2, s2, NULL) ? 0 : nt_last_error(), NT_EINVAL, "nt_roll",
                       "'dims' is NULL with nshifts = 2");
    nt_test_expect_err(nt_roll(x, 2, s2, (int[]){0, 3}) ? 0 : nt_last_error(), NT_EDIM,
                       "nt_roll", "dims[1] = 3");
    nt_tensor *z = nt_zeros(NT_F32, 0, NULL);
    nt_test_expect_err(nt_roll(z, 1, s2, (int[]){0}) ? 0 : nt_last_error(), NT_EDIM, "nt_roll",
                       "dims[0] = 0");
    /* sort, argsort */
    nt_test_expect_err(nt_sort(x, 0, false, true, NULL, &ix), NT_EINVAL, "nt_sort",
                       "'values' is NULL");
    nt_test_expect_err(nt_sort(x, 0, false, true, &v, NULL), NT_EINVAL, "nt_sort",
                       "'indices' is NULL");
    nt_test_expect_err(nt_sort(NULL, 0, false, true, &v, &ix), NT_EINVAL, "nt_sort");
    assert_null(v);
    assert_null(ix);
    nt_test_expect_err(nt_sort(x, 3, false, true, &v, &ix), NT_EDIM, "nt_sort", "dim 3");
    nt_test_expect_err(nt_sort(x, -4, false, true, &v, &ix), NT_EDIM, "nt_sort", "dim -4");
    nt_test_expect_err(nt_sort(z, 1, false, true, &v, &ix), NT_EDIM, "nt_sort", "0-d");
    nt_test_expect_err(nt_argsort(x, 5, false, true) ? 0 : nt_last_error(), NT_EDIM,
                       "nt_argsort", "dim 5");
    /* interpolate */
    nt_test_expect_err(nt_interpolate(NULL, 2, 2, NT_INTERP_NEAREST, false) ? 0 : nt_last_error(),
                       NT_EINVAL, "nt_interpolate");
    nt_test_expect_err(nt_interpolate(xi, 2, 2, (nt_interp_mode)5, false) ? 0 : nt_last_error(),
                       NT_EINVAL, "nt_interpolate", "'mode' is 5");
    nt_test_expect_err(nt_interpolate(xi, 2, 2, NT_INTERP_NEAREST, true) ? 0 : nt_last_error(),
                       NT_EINVAL, "nt_interpolate", "'align_corners'");
    nt_test_expect_err(nt_interpolate(x, 2, 2, NT_INTERP_NEAREST, false) ? 0 : nt_last_error(),
                       NT_ESHAPE, "nt_interpolate", "[2, 3, 4]", "4 dims");
    nt_test_expect_err(nt_interpolate(xi, 2, 2, NT_INTERP_BILINEAR, false) ? 0 : nt_last_error(),
                       NT_EDTYPE, "nt_interpolate", "i32", "f32");
    nt_test_expect_err(nt_interpolate(xi, 0, 2, NT_INTERP_NEAREST, false) ? 0 : nt_last_error(),
                       NT_EINVAL, "nt_interpolate", "0 x 2");
    nt_test_expect_err(nt_interpolate(xi, 2, -1, NT_INTERP_BILINEAR, false) ? 0 : nt_last_error(),
                       NT_EDTYPE, "nt_interpolate"); /* the dtype is checked first */
    nt_test_expect_err(nt_interpolate(x4, 2, 2, NT_INTERP_BILINEAR, true) ? 0 : nt_last_error(),
                       NT_ESHAPE, "nt_interpolate", "H = 0");
    /* a released x */
    nt_tensor *r = nt_zeros(NT_F32, 3, sh);
    nt_release(r);
    nt_test_expect_err(nt_pad(r, 2, p2, NT_PAD_CONSTANT, 0) ? 0 : nt_last_error(), NT_ERELEASED,
                       "nt_pad");
    nt_test_expect_err(nt_roll(r, 1, s2, NULL) ? 0 : nt_last_error(), NT_ERELEASED, "nt_roll");
    nt_test_expect_err(nt_sort(r, 0, 0, 1, &v, &ix), NT_ERELEASED, "nt_sort");
    nt_test_expect_err(nt_interpolate(r, 2, 2, 0, 0) ? 0 : nt_last_error(), NT_ERELEASED,
                       "nt_interpolate");
    assert_int_equal(nt_scope_end(sc), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_torch_all_configs),
        cmocka_unit_test(test_vs_definition),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_captured),
        cmocka_unit_test(test_dtypes_and_edges),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, nt_test_setup, nt_test_teardown);
}
