/* tests/test_shapeops.c - the indexing and shape ops: scatter,
 * scatter_add, index_add, index_put, one_hot, squeeze, unsqueeze, flatten,
 * unflatten, narrow, chunk, stack, diagonal.
 *
 * - against PyTorch 1.13 (tests/torch_refs/shapeidx.h, made by
 *   scripts/torch_refs/shapeidx.py): values and gradients, bit for bit on
 *   both backends (a NaN matches any NaN), except where a comment says why
 *   a bound is used;
 * - against a double-precision host loop written here (scatter_add and
 *   index_add with repeated indices, in bf16 and f32);
 * - gradcheck of every differentiable one;
 * - views that alias their base; every error path, the index errors found
 *   when the op runs naming the call and its line. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

typedef struct {
    int nd;
    int64_t sh[5];
} si_shape;

typedef struct {
    const char *name;
    int op;
    int64_t p[4];
    double alpha;
    int ix_u8;
    si_shape tsh;
    const uint32_t *t;
    si_shape ish;
    const int32_t *ix;
    int ints_out;
    si_shape ssh;
    const uint32_t *src;
    si_shape osh;
    const void *out;
    const uint32_t *w, *gt, *gs;
} si_case;

#include "torch_refs/shapeidx.h"

static const char *BE[2] = {"cpu", "sim"};

static void backend(const char *be)
{
    assert_int_equal(nt_config_set("NT_BACKEND", be), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(be, "sim") ? "0" : "1"), 0);
}

static int64_t numel(const si_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->nd; i++)
        n *= s->sh[i];
    return n;
}

static nt_tensor *f32_of(const uint32_t *bits, const si_shape *s)
{
    return nt_from_host(bits, NT_F32, s->nd, s->sh);
}

static nt_tensor *ix_of(const si_case *c)
{
    if (!c->ix_u8)
        return nt_from_host(c->ix, NT_I32, c->ish.nd, c->ish.sh);
    int64_t n = numel(&c->ish);
    uint8_t *m = malloc((size_t)n);
    for (int64_t k = 0; k < n; k++)
        m[k] = (uint8_t)c->ix[k];
    nt_tensor *t = nt_from_host(m, NT_U8, c->ish.nd, c->ish.sh);
    free(m);
    return t;
}

/* Equal bits, or both NaN; within tol * (1 + |want|) when tol > 0 */
static void expect_f32(const char *what, const char *be, const char *name, nt_tensor *y,
                       const si_shape *sh, const uint32_t *want, double tol)
{
    assert_non_null(y);
    if (nt_ndim(y) != sh->nd)
        fail_msg("%s %s %s: %d dims, PyTorch %d", be, name, what, nt_ndim(y), sh->nd);
    for (int i = 0; i < sh->nd; i++)
        if (nt_shape(y, i) != sh->sh[i])
            fail_msg("%s %s %s: dim %d is %lld, PyTorch %lld", be, name, what, i,
                     (long long)nt_shape(y, i), (long long)sh->sh[i]);
    int64_t n = numel(sh);
    float *got = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_int_equal(nt_to_host(nt_contiguous(y), got, (size_t)n * sizeof(float)), 0);
    for (int64_t k = 0; k < n; k++) {
        float w;
        memcpy(&w, &want[k], sizeof w);
        uint32_t gb;
        memcpy(&gb, &got[k], sizeof gb);
        bool ok = gb == want[k] || (isnan(w) && isnan(got[k])) ||
                  (tol > 0 && fabs((double)got[k] - (double)w) <= tol * (1.0 + fabs((double)w)));
        if (!ok)
            fail_msg("%s %s %s[%lld] = %a (0x%08x); PyTorch %a (0x%08x)", be, name, what,
                     (long long)k, (double)got[k], gb, (double)w, want[k]);
    }
    free(got);
}

static nt_tensor *run_case(const si_case *c, nt_tensor *t, nt_tensor *ix, nt_tensor *src)
{
    int64_t sizes[2] = {c->p[1], c->p[2]};
    switch (c->op) {
    case SI_SCATTER: return nt_scatter(t, (int)c->p[0], ix, src);
    case SI_SCATTER_ADD: return nt_scatter_add(t, (int)c->p[0], ix, src);
    case SI_INDEX_ADD: return nt_index_add(t, (int)c->p[0], ix, src, c->alpha);
    case SI_INDEX_PUT:
    case SI_INDEX_PUT_MASK: return nt_index_put(t, ix, src, c->p[1] != 0);
    case SI_DIAGONAL: return nt_diagonal(t, c->p[0], (int)c->p[1], (int)c->p[2]);
    case SI_ONE_HOT: return nt_one_hot(ix, c->p[0]);
    case SI_SQUEEZE: return nt_squeeze(t, (int)c->p[0]);
    case SI_UNSQUEEZE: return nt_unsqueeze(t, (int)c->p[0]);
    case SI_FLATTEN: return nt_flatten(t, (int)c->p[0], (int)c->p[1]);
    case SI_UNFLATTEN: return nt_unflatten(t, (int)c->p[0], 2, sizes);
    case SI_NARROW: return nt_narrow(t, (int)c->p[0], c->p[1], c->p[2]);
    case SI_STACK: {
        nt_tensor *ts[3] = {t, nt_mul_scalar(t, 2.0), nt_neg(t)};
        return nt_stack(ts, 3, (int)c->p[0]);
    }
    case SI_CHUNK: { /* p: chunks, dim, PyTorch's count, its last size */
        nt_tensor *parts[8];
        int n = nt_chunk(t, c->p[0], (int)c->p[1], parts, 8);
        assert_int_equal(n, (int)c->p[2]);
        assert_int_equal(nt_chunk(t, c->p[0], (int)c->p[1], NULL, 0), n);
        assert_int_equal(nt_shape(parts[n - 1], (int)c->p[1]), c->p[3]);
        return nt_cat(parts, n, (int)c->p[1]);
    }
    default: fail_msg("case %s: unknown op %d", c->name, c->op);
    }
    return NULL;
}

/* Every case of the PyTorch table on both backends: the values, then the
 * gradients of sum(out * w). */
static void test_torch_refs(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        backend(BE[b]);
        for (size_t k = 0; k < sizeof si_cases / sizeof si_cases[0]; k++) {
            const si_case *c = &si_cases[k];
            nt_scope *sc = nt_scope_begin();
            nt_tensor *t = c->t ? f32_of(c->t, &c->tsh) : NULL;
            nt_tensor *src = c->src ? f32_of(c->src, &c->ssh) : NULL;
            nt_tensor *ix = c->ix ? ix_of(c) : NULL;
            bool grad = c->w != NULL;
            if (grad) {
                nt_set_requires_grad(t, true);
                if (src)
                    nt_set_requires_grad(src, true);
            }
            nt_tensor *y = run_case(c, t, ix, src);
            if (!y)
                fail_msg("%s %s: %s", BE[b], c->name, nt_last_error_message());
            if (c->ints_out) {
                int64_t n = numel(&c->osh);
                int32_t got[64];
                assert_true(n <= 64);
                assert_int_equal(nt_dtype_of(y), NT_I32);
                assert_int_equal(nt_ndim(y), c->osh.nd);
                assert_int_equal(nt_to_host(y, got, (size_t)n * sizeof got[0]), 0);
                if (memcmp(got, c->out, (size_t)n * sizeof got[0]))
                    fail_msg("%s %s: values differ from PyTorch's", BE[b], c->name);
            } else {
                expect_f32("out", BE[b], c->name, y, &c->osh, c->out, 0);
            }
            if (grad) {
                nt_tensor *w = f32_of(c->w, &c->osh);
                assert_int_equal(nt_backward(nt_sum(nt_mul(y, w), NT_DIM_ALL, false)), 0);
                expect_f32("grad t", BE[b], c->name, nt_grad(t), &c->tsh, c->gt, 0);
                /* index_put's values broadcast: their gradient is a sum over
                 * the broadcast dims, in nt_sum's order (PyTorch's differs) */
                double tol = c->op == SI_INDEX_PUT ? 1e-6 : 0;
                if (c->gs)
                    expect_f32("grad src", BE[b], c->name, nt_grad(src), &c->ssh, c->gs, tol);
            }
            nt_scope_end(sc);
        }
    }
}

/* ---------------- a double-precision host reference ---------------- */

/* scatter_add and index_add on [A, B, C] along each dim with many repeated
 * indices, in f32 and bf16: every element within the bound of a sum of m
 * terms added in f32 (m eps sum|terms|, eps = 2^-24) of the double sum, then
 * rounded once to the dtype; scatter's overwrite exactly the last write of
 * the host loop. */
static void test_double_reference(void **state)
{
    (void)state;
    enum { A = 3, B = 5, C = 7, N = A * B * C };
    const int64_t shp[3] = {A, B, C};
    uint64_t rs = 34;
    float tv[N], sv[(A + 4) * (B + 4) * (C + 4)]; /* index_add's src is longer */
    nt_test_fill(tv, N, &rs);
    nt_test_fill(sv, sizeof sv / sizeof sv[0], &rs);
    int32_t ix[N];
    for (int b = 0; b < 2; b++) {
        backend(BE[b]);
        for (int dim = 0; dim < 3; dim++)
            for (int kind = 0; kind < 3; kind++)
                for (int dti = 0; dti < 2; dti++) {
                    nt_dtype dt = dti ? NT_BF16 : NT_F32;
                    if (kind == 2 && dt != NT_F32)
                        continue;
                    int64_t V = shp[dim];
                    for (int k = 0; k < N; k++)
                        ix[k] = (int32_t)((k * 7 + k / 3) % (V > 2 ? 2 : V)); /* 0, 1: repeats */
                    nt_scope *sc = nt_scope_begin();
                    nt_tensor *t = nt_cast(nt_from_host(tv, NT_F32, 3, shp), dt);
                    nt_tensor *s = nt_cast(nt_from_host(sv, NT_F32, 3, shp), dt);
                    float th[N], shh[sizeof sv / sizeof sv[0]], got[N];
                    nt_to_host(nt_cast(t, NT_F32), th, sizeof th);
                    nt_to_host(nt_cast(s, NT_F32), shh, sizeof shh);
                    nt_tensor *y;
                    if (kind == 1) { /* index_add: a 1-D index of V + 4 entries, alpha 0.75 */
                        int64_t ssh[3] = {A, B, C};
                        ssh[dim] = V + 4;
                        int64_t ns = ssh[0] * ssh[1] * ssh[2];
                        nt_tensor *s2 = nt_cast(nt_from_host(sv, NT_F32, 3, ssh), dt);
                        nt_to_host(nt_cast(s2, NT_F32), shh, (size_t)ns * sizeof(float));
                        y = nt_index_add(t, dim, nt_from_host(ix, NT_I32, 1, SH(V + 4)), s2, 0.75);
                        double ref[N], mag[N];
                        int cnt[N];
                        for (int e = 0; e < N; e++)
                            ref[e] = th[e], mag[e] = fabs(th[e]), cnt[e] = 0;
                        int64_t c[3];
                        for (int64_t p = 0; p < ns; p++) {
                            c[0] = p / (ssh[1] * ssh[2]), c[1] = p / ssh[2] % ssh[1], c[2] = p % ssh[2];
                            c[dim] = ix[c[dim]];
                            int64_t e = (c[0] * B + c[1]) * C + c[2];
                            double term = (double)(float)(0.75f * shh[p]);
                            ref[e] += term, mag[e] += fabs(term), cnt[e]++;
                        }
                        nt_to_host(nt_cast(y, NT_F32), got, sizeof got);
                        for (int e = 0; e < N; e++) {
                            double bound = (cnt[e] + 1) * 0x1p-24 * mag[e] +
                                           (dt == NT_BF16 ? 0x1p-8 * fabs(ref[e]) : 0) + 1e-30;
                            if (fabs(got[e] - ref[e]) > bound)
                                fail_msg("%s index_add dim %d %s [%d]: %g, double %g", BE[b], dim,
                                         nt_dtype_name(dt), e, (double)got[e], ref[e]);
                        }
                    } else {
                        nt_tensor *it = nt_from_host(ix, NT_I32, 3, shp);
                        y = kind == 0 ? nt_scatter_add(t, dim, it, s) : nt_scatter(t, dim, it, s);
                        double ref[N], mag[N];
                        int cnt[N];
                        for (int e = 0; e < N; e++)
                            ref[e] = th[e], mag[e] = fabs(th[e]), cnt[e] = 0;
                        for (int p = 0; p < N; p++) {
                            int64_t c[3] = {p / (B * C), p / C % B, p % C};
                            c[dim] = ix[p];
                            int64_t e = (c[0] * B + c[1]) * C + c[2];
                            if (kind == 2)
                                ref[e] = shh[p];
                            else
                                ref[e] += shh[p], mag[e] += fabs(shh[p]), cnt[e]++;
                        }
                        nt_to_host(nt_cast(y, NT_F32), got, sizeof got);
                        for (int e = 0; e < N; e++) {
                            double bound = kind == 2 ? 0
                                                     : (cnt[e] + 1) * 0x1p-24 * mag[e] +
                                                           (dt == NT_BF16 ? 0x1p-8 * fabs(ref[e]) : 0);
                            if (fabs(got[e] - ref[e]) > bound)
                                fail_msg("%s %s dim %d %s [%d]: %g, double %g", BE[b],
                                         kind ? "scatter" : "scatter_add", dim, nt_dtype_name(dt),
                                         e, (double)got[e], ref[e]);
                        }
                    }
                    nt_scope_end(sc);
                }
    }
}

/* cpu and sim give the same bits for scatter_add in bf16 and f16 (f32
 * accumulator, one rounding), scatter of i32 and u8, and scatter_add of i32
 * and u8 (wrapping adds) */
static void test_backends_agree(void **state)
{
    (void)state;
    enum { N = 4 * 9 * 6 };
    uint64_t rs = 7;
    float a[N], s[N];
    int32_t ix[N];
    nt_test_fill(a, N, &rs);
    nt_test_fill(s, N, &rs);
    for (int k = 0; k < N; k++)
        ix[k] = (int32_t)(nt_test_rand32(&rs) % 9);
    unsigned char out[2][N * 4];
    static const nt_dtype dts[] = {NT_BF16, NT_F16, NT_I32, NT_U8, NT_I32, NT_U8};
    for (int d = 0; d < 6; d++) {
        for (int b = 0; b < 2; b++) {
            backend(BE[b]);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *t = nt_cast(nt_mul_scalar(nt_from_host(a, NT_F32, 3, SH(4, 9, 6)), 40.0), dts[d]);
            nt_tensor *src = nt_cast(nt_mul_scalar(nt_from_host(s, NT_F32, 3, SH(4, 9, 6)), 40.0), dts[d]);
            nt_tensor *it = nt_from_host(ix, NT_I32, 3, SH(4, 9, 6));
            nt_tensor *y = d < 2 || d > 3 ? nt_scatter_add(t, -2, it, src) : nt_scatter(t, 1, it, src);
            assert_non_null(y);
            size_t nb = (size_t)N * nt_dtype_size(dts[d]);
            assert_int_equal(nt_to_host(y, out[b], nb), 0);
            if (b == 1 && memcmp(out[0], out[1], nb))
                fail_msg("%s: sim and cpu differ", nt_dtype_name(dts[d]));
            nt_scope_end(sc);
        }
    }
}

/* Large and strided: t [700, 800] (more than one SBUF block of the
 * simulator's accumulator), a transposed t, a strided src; cpu == sim */
static void test_large_strided(void **state)
{
    (void)state;
    enum { R = 700, C = 800, IR = 300 };
    float *a = malloc(sizeof(float) * R * C);
    int32_t *ix = malloc(sizeof(int32_t) * IR * C);
    uint64_t rs = 11;
    nt_test_fill(a, (size_t)R * C, &rs);
    for (int k = 0; k < IR * C; k++)
        ix[k] = (int32_t)(nt_test_rand32(&rs) % 640);
    float *out[2][3];
    for (int b = 0; b < 2; b++) {
        backend(BE[b]);
        /* counted from before the ops: an adaptive worker may run some of
         * them before the first read (the last backend's ops all ran) */
        assert_int_equal(nt_sync(), 0);
        nt_stats_reset();
        nt_scope *sc = nt_scope_begin();
        nt_tensor *t = nt_from_host(a, NT_F32, 2, SH(R, C));
        nt_tensor *it = nt_from_host(ix, NT_I32, 2, SH(IR, C));
        nt_tensor *src = nt_slice(nt_mul_scalar(t, -0.5), 0, 1, R, 2); /* [350, 800], strided */
        nt_tensor *tt = nt_transpose(nt_reshape(t, 2, SH(C, R)), 0, 1); /* [700, 800] view */
        nt_tensor *y[3] = {nt_scatter_add(t, 0, it, src), nt_scatter(tt, 0, it, src),
                           nt_index_add(tt, 1, nt_slice(nt_reshape(it, 1, SH(IR * C)), 0, 0, 8, 1),
                                        nt_slice(nt_neg(t), 1, 3, C, 100), 0.5)};
        for (int k = 0; k < 3; k++) {
            assert_non_null(y[k]);
            out[b][k] = malloc(sizeof(float) * R * C);
            assert_int_equal(nt_to_host(y[k], out[b][k], sizeof(float) * R * C), 0);
        }
        nt_stats st;
        assert_int_equal(nt_stats_get(&st), 0);
        if (b == 1) /* the three ran on the simulator, no fallback */
            assert_true(st.sim_kernels >= 3 && st.cpu_fallbacks == 0);
        nt_scope_end(sc);
    }
    for (int k = 0; k < 3; k++) {
        if (memcmp(out[0][k], out[1][k], sizeof(float) * R * C))
            fail_msg("case %d: sim and cpu differ", k);
        free(out[0][k]), free(out[1][k]);
    }
    free(a), free(ix);
}

/* The composites give the same bits in every mode and on both backends:
 * index_put (both forms, and its gradient), one_hot, stack, chunk. */
static void modes_run(float *out, int64_t n)
{
    nt_scope *sc = nt_scope_begin();
    float a[60];
    for (int k = 0; k < 60; k++)
        a[k] = (float)k * 0.37f - 9.0f;
    nt_tensor *t = nt_from_host(a, NT_F32, 2, SH(6, 10));
    nt_set_requires_grad(t, true);
    nt_tensor *v = nt_narrow(t, 0, 2, 3);
    nt_tensor *p1 = nt_index_put(t, nt_from_host((int32_t[]){-1, 0, 5}, NT_I32, 1, SH(3)), v, true);
    nt_tensor *p2 = nt_index_put(p1, nt_from_host((uint8_t[]){1, 0, 0, 1, 1, 0}, NT_U8, 1, SH(6)),
                                 nt_full(NT_F32, 0, NULL, -2.0), false);
    nt_tensor *parts[4];
    int np = nt_chunk(p2, 4, 1, parts, 4);
    assert_int_equal(np, 4);
    nt_tensor *st = nt_stack(parts, 3, 0); /* [3, 6, 3] */
    nt_tensor *oh = nt_cast(nt_one_hot(nt_from_host((int32_t[]){2, 0, 2}, NT_I32, 1, SH(3)), 3), NT_F32);
    /* loss: sum over st's last dim, weighted by the one-hot's first column */
    nt_tensor *l = nt_sum(nt_mul(nt_sum(st, 2, false), nt_slice(oh, 1, 0, 1, 1)), NT_DIM_ALL,
                          false);
    assert_int_equal(nt_backward(l), 0);
    assert_int_equal(nt_to_host(nt_grad(t), out, 60 * sizeof(float)), 0);
    assert_int_equal(nt_to_host(p2, out + 60, 60 * sizeof(float)), 0);
    assert_int_equal(nt_to_host(st, out + 120, (size_t)(n - 120) * sizeof(float)), 0);
    nt_scope_end(sc);
}

static void test_modes(void **state)
{
    (void)state;
    enum { N = 120 + 54 };
    float ref[N], got[N];
    static const char *modes[4] = {"deterministic", "eager", "adaptive", "lazy"};
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 4; m++) {
            backend(BE[b]);
            assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
            modes_run(b + m ? got : ref, N);
            if ((b || m) && memcmp(ref, got, sizeof ref))
                fail_msg("%s %s differs from cpu deterministic", BE[b], modes[m]);
        }
    assert_int_equal(nt_config_set("NT_MODE", "deterministic"), 0);
}

/* Integer scatter_add and index_add wrap like PyTorch's integer adds
 * (i32 two's complement; u8 modulo 256), alpha multiplying each element;
 * index_put accumulates integers the same way. */
static void test_integer_adds(void **state)
{
    (void)state;
    int32_t tv[8] = {2147483647, -5, 0, 7, 250, 1, 2, 3};
    int32_t sv[12] = {1, 3, 9, -2, 100, 200, 5, 6, 7, 8, 9, 10};
    int32_t ix[12] = {0, 4, 0, 0, 4, 4, 1, 1, 7, 7, 7, 3};
    for (int b = 0; b < 2; b++) {
        backend(BE[b]);
        for (int u8 = 0; u8 < 2; u8++) {
            nt_scope *sc = nt_scope_begin();
            nt_dtype dt = u8 ? NT_U8 : NT_I32;
            nt_tensor *t = nt_cast(nt_from_host(tv, NT_I32, 1, SH(8)), dt);
            nt_tensor *s = nt_cast(nt_from_host(sv, NT_I32, 1, SH(12)), dt);
            nt_tensor *it = nt_from_host(ix, NT_I32, 1, SH(12));
            int32_t th[8], sh[12];
            nt_to_host(nt_cast(t, NT_I32), th, sizeof th);
            nt_to_host(nt_cast(s, NT_I32), sh, sizeof sh);
            nt_tensor *y[3] = {nt_scatter_add(t, 0, it, s), nt_index_add(t, 0, it, s, -3.0),
                               nt_index_put(t, it, s, true)};
            for (int k = 0; k < 3; k++) {
                uint32_t want[8];
                for (int e = 0; e < 8; e++)
                    want[e] = (uint32_t)th[e];
                for (int p = 0; p < 12; p++)
                    want[ix[p]] += (uint32_t)sh[p] * (uint32_t)(k == 1 ? -3 : 1);
                int32_t got[8];
                assert_non_null(y[k]);
                assert_int_equal(nt_dtype_of(y[k]), dt);
                assert_int_equal(nt_to_host(nt_cast(y[k], NT_I32), got, sizeof got), 0);
                for (int e = 0; e < 8; e++) {
                    int32_t w = u8 ? (int32_t)(uint8_t)want[e] : (int32_t)want[e];
                    if (got[e] != w)
                        fail_msg("%s %s case %d [%d]: %d, expected %d", BE[b], nt_dtype_name(dt), k,
                                 e, got[e], w);
                }
            }
            nt_scope_end(sc);
        }
    }
}

/* ---------------- gradcheck ---------------- */

static const int32_t GIX[12] = {2, 0, 2, 1, 0, 0, 1, 2, 2, 1, 0, 1};

static nt_tensor *gf(nt_tensor *const *in, void *ctx)
{
    int which = *(int *)ctx;
    nt_tensor *i34 = nt_from_host(GIX, NT_I32, 2, SH(3, 4));
    nt_tensor *i1 = nt_from_host(GIX, NT_I32, 1, SH(5));
    int32_t perm[12] = {3, 0, 2, 1, 2, 3, 0, 1, 1, 0, 3, 2}; /* distinct per row */
    switch (which) {
    case 0: return nt_scatter(in[0], 1, nt_from_host(perm, NT_I32, 2, SH(3, 4)), in[1]);
    case 1: return nt_scatter_add(in[0], 0, i34, in[1]);
    case 2: return nt_index_add(in[0], 0, i1, nt_reshape(in[1], 2, SH(5, 4)), -1.5);
    case 3: return nt_index_put(in[0], nt_from_host((int32_t[]){1, -1}, NT_I32, 1, SH(2)),
                                nt_narrow(in[1], 0, 0, 1), true);
    case 4: return nt_diagonal(in[0], -1, 1, 0);
    case 5: {
        nt_tensor *ts[2] = {in[0], nt_narrow(in[1], 0, 1, 3)};
        return nt_flatten(nt_stack(ts, 2, -1), 0, 1);
    }
    case 6: return nt_index_put(in[0], nt_from_host((uint8_t[]){1, 0, 1}, NT_U8, 1, SH(3)),
                                nt_sum(in[1], NT_DIM_ALL, false), which == 6);
    default: return nt_unsqueeze(nt_squeeze(nt_unflatten(in[0], 1, 2, SH(2, 2)), 0), -1);
    }
}

static void test_gradcheck(void **state)
{
    (void)state;
    uint64_t rs = 5;
    for (int b = 0; b < 2; b++) {
        backend(BE[b]);
        for (int which = 0; which < 8; which++) {
            nt_scope *sc = nt_scope_begin();
            float a[20], s[20];
            nt_test_fill(a, 20, &rs);
            nt_test_fill(s, 20, &rs);
            nt_tensor *in[2] = {nt_from_host(a, NT_F32, 2, SH(3, 4)),
                                nt_from_host(s, NT_F32, 2, which == 2 ? SH(4, 5) : SH(4, 4))};
            if (which == 7)
                in[0] = nt_from_host(a, NT_F32, 2, SH(1, 4));
            nt_set_requires_grad(in[0], true);
            nt_set_requires_grad(in[1], true);
            int w = which;
            int rc = nt_gradcheck(gf, in, which == 7 ? 1 : 2, &w, 1e-2, 1e-3, 1e-3);
            if (rc)
                fail_msg("%s gradcheck %d: %s", BE[b], which, nt_last_error_message());
            nt_scope_end(sc);
        }
    }
}

/* ---------------- views ---------------- */

static void test_views_alias(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *t = nt_zeros(NT_F32, 3, SH(2, 3, 4));
    /* a write through the diagonal (offset 1 of dims 1, 2) reaches t */
    nt_tensor *d = nt_diagonal(t, 1, 1, 2);
    assert_int_equal(nt_ndim(d), 2);
    assert_int_equal(nt_shape(d, 1), 3);
    assert_int_equal(nt_copy_into(d, nt_full(NT_F32, 0, NULL, 5.0)), 0);
    float h[24];
    assert_int_equal(nt_to_host(t, h, sizeof h), 0);
    for (int k = 0; k < 24; k++) {
        int i = k / 4 % 3, j = k % 4;
        assert_true(h[k] == (j == i + 1 ? 5.0f : 0.0f));
    }
    /* squeeze / unsqueeze / narrow / chunk views write through too */
    nt_tensor *u = nt_unsqueeze(nt_squeeze(nt_narrow(t, 2, -1, 1), -1), 0);
    assert_int_equal(nt_ndim(u), 3);
    assert_int_equal(nt_fill_inplace(u, 7.0), 0);
    nt_tensor *parts[3];
    assert_int_equal(nt_chunk(t, 3, 1, parts, 3), 3);
    assert_int_equal(nt_fill_inplace(parts[0], 1.0), 0);
    assert_int_equal(nt_to_host(t, h, sizeof h), 0);
    for (int k = 0; k < 24; k++) {
        int i = k / 4 % 3, j = k % 4;
        float want = i == 0 ? 1.0f : j == 3 ? 7.0f : j == i + 1 ? 5.0f : 0.0f;
        assert_true(h[k] == want);
    }
    /* squeeze / unsqueeze of an expanded tensor are views too (no copy) */
    nt_tensor *ex = nt_expand(nt_reshape(nt_arange(NT_F32, 0, 4, 1), 3, SH(4, 1, 1)), 3, SH(4, 1, 6));
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_tensor *sq = nt_unsqueeze(nt_squeeze(ex, NT_DIM_ALL), 1);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    assert_int_equal(st.ops_enqueued, 0);
    assert_int_equal(nt_ndim(sq), 3);
    assert_int_equal(nt_shape(sq, 2), 6);
    float e24[24];
    assert_int_equal(nt_to_host(nt_contiguous(sq), e24, sizeof e24), 0);
    for (int k = 0; k < 24; k++)
        assert_true(e24[k] == (float)(k / 6));
    /* empty dims: a chunk of an empty dim makes `chunks` empty views */
    nt_tensor *e = nt_zeros(NT_F32, 2, SH(0, 3));
    assert_int_equal(nt_chunk(e, 4, 0, NULL, 0), 4);
    assert_int_equal(nt_chunk(e, 4, 0, parts, 3), NT_EINVAL);
    nt_clear_error();
    /* a 0-d tensor: squeeze(0) keeps it, flatten gives [1], unsqueeze [1] */
    nt_tensor *z = nt_full(NT_F32, 0, NULL, 3.0);
    assert_int_equal(nt_ndim(nt_squeeze(z, 0)), 0);
    assert_int_equal(nt_ndim(nt_flatten(z, 0, -1)), 1);
    assert_int_equal(nt_ndim(nt_unsqueeze(z, -1)), 1);
    nt_scope_end(sc);
}

/* one_hot's num_classes -1 reads the labels (a sync); u8 labels work */
static void test_one_hot_forms(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        backend(BE[b]);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *l = nt_from_host((uint8_t[]){2, 0, 6}, NT_U8, 1, SH(3));
        nt_tensor *y = nt_one_hot(l, -1);
        assert_non_null(y);
        assert_int_equal(nt_shape(y, 1), 7);
        int32_t h[21];
        assert_int_equal(nt_to_host(y, h, sizeof h), 0);
        for (int k = 0; k < 21; k++)
            assert_int_equal(h[k], (k == 2 || k == 7 || k == 20) ? 1 : 0);
        nt_tensor *z = nt_one_hot(nt_zeros(NT_I32, 1, SH(0)), 4);
        assert_int_equal(nt_shape(z, 0), 0);
        assert_int_equal(nt_shape(z, 1), 4);
        nt_scope_end(sc);
    }
}

/* ---------------- errors ---------------- */

#define EXPECT_NULL(call, code, ...)                                                        \
    do {                                                                                    \
        assert_null(call);                                                                  \
        nt_test_expect_err(nt_last_error(), code, __VA_ARGS__);                             \
    } while (0)

static void test_errors(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *t = nt_zeros(NT_F32, 2, SH(3, 4));
    nt_tensor *ti = nt_zeros(NT_I32, 2, SH(3, 4));
    nt_tensor *ix = nt_zeros(NT_I32, 2, SH(3, 4));
    nt_tensor *fix = nt_zeros(NT_F32, 2, SH(3, 4));
    nt_tensor *i1 = nt_zeros(NT_I32, 1, SH(4));
    nt_tensor *src = nt_ones(NT_F32, 2, SH(3, 4));
    nt_tensor *sbf = nt_ones(NT_BF16, 2, SH(3, 4));
    nt_tensor *s0 = nt_full(NT_F32, 0, NULL, 1.0);
    EXPECT_NULL(nt_scatter(NULL, 0, ix, src), NT_EINVAL, "nt_scatter", "'t'");
    EXPECT_NULL(nt_scatter(t, 0, NULL, src), NT_EINVAL, "nt_scatter", "'index'");
    EXPECT_NULL(nt_scatter(t, 0, ix, NULL), NT_EINVAL, "nt_scatter", "'src'");
    EXPECT_NULL(nt_scatter(t, 0, fix, src), NT_EDTYPE, "nt_scatter", "'index' has dtype f32");
    EXPECT_NULL(nt_scatter(t, 2, ix, src), NT_EDIM, "nt_scatter", "dim 2");
    EXPECT_NULL(nt_scatter(t, -3, ix, src), NT_EDIM, "nt_scatter", "dim -3");
    EXPECT_NULL(nt_scatter(t, 0, ix, sbf), NT_EDTYPE, "nt_scatter", "'src' has dtype bf16");
    EXPECT_NULL(nt_scatter(t, 0, i1, src), NT_ESHAPE, "nt_scatter", "'index' has shape [4]");
    EXPECT_NULL(nt_scatter(t, 0, nt_zeros(NT_I32, 2, SH(3, 5)), src), NT_ESHAPE, "nt_scatter",
                "[3, 5]");
    EXPECT_NULL(nt_scatter(s0, 0, ix, src), NT_ESHAPE, "nt_scatter", "0-d");
    EXPECT_NULL(nt_scatter_add(t, 0, fix, src), NT_EDTYPE, "nt_scatter_add", "'index'");
    EXPECT_NULL(nt_index_add(t, 0, ix, src, 1.0), NT_ESHAPE, "nt_index_add", "1-D");
    EXPECT_NULL(nt_index_add(t, 0, i1, src, 1.0), NT_ESHAPE, "nt_index_add", "'src' has shape");
    EXPECT_NULL(nt_index_add(t, 1, i1, src, NAN), NT_EINVAL, "nt_index_add", "'alpha'");
    EXPECT_NULL(nt_index_add(t, 1, nt_zeros(NT_F32, 1, SH(4)), src, 1.0), NT_EDTYPE,
                "nt_index_add", "'index' has dtype f32");
    EXPECT_NULL(nt_index_add(ti, 1, i1, ti, 1.5), NT_EINVAL, "nt_index_add", "'alpha' is 1.5");
    EXPECT_NULL(nt_index_add(ti, 1, i1, ti, 1e9), NT_EINVAL, "nt_index_add", "2^24");
    EXPECT_NULL(nt_index_put(t, fix, s0, false), NT_EDTYPE, "nt_index_put", "'index'");
    EXPECT_NULL(nt_index_put(t, ix, s0, false), NT_ESHAPE, "nt_index_put", "1-D");
    EXPECT_NULL(nt_index_put(t, i1, nt_ones(NT_F32, 1, SH(3)), false), NT_ESHAPE, "nt_index_put",
                "broadcasts to [4, 4]");
    EXPECT_NULL(nt_index_put(t, i1, nt_ones(NT_BF16, 0, NULL), false), NT_EDTYPE, "nt_index_put",
                "'values'");
    EXPECT_NULL(nt_index_put(t, nt_zeros(NT_U8, 1, SH(4)), s0, false), NT_ESHAPE, "nt_index_put",
                "mask");
    EXPECT_NULL(nt_index_put(t, nt_zeros(NT_U8, 1, SH(3)), src, false), NT_ESHAPE, "nt_index_put",
                "one element");
    EXPECT_NULL(nt_index_put(s0, i1, s0, false), NT_ESHAPE, "nt_index_put", "0-d");
    EXPECT_NULL(nt_one_hot(fix, 3), NT_EDTYPE, "nt_one_hot", "'labels'");
    EXPECT_NULL(nt_one_hot(ix, -2), NT_EINVAL, "nt_one_hot", "'num_classes' is -2");
    EXPECT_NULL(nt_one_hot(nt_zeros(NT_I32, 1, SH(0)), -1), NT_EINVAL, "nt_one_hot", "empty");
    EXPECT_NULL(nt_one_hot(nt_full(NT_I32, 1, SH(2), -3), -1), NT_ERANGE, "nt_one_hot",
                "non-negative");
    EXPECT_NULL(nt_squeeze(t, 2), NT_EDIM, "nt_squeeze", "dim 2");
    EXPECT_NULL(nt_squeeze(NULL, 0), NT_EINVAL, "nt_squeeze");
    EXPECT_NULL(nt_unsqueeze(t, 3), NT_EDIM, "nt_unsqueeze", "dim 3");
    EXPECT_NULL(nt_unsqueeze(t, -4), NT_EDIM, "nt_unsqueeze", "dim -4");
    EXPECT_NULL(nt_unsqueeze(nt_zeros(NT_F32, 8, SH(1, 1, 1, 1, 1, 1, 1, 1)), 0), NT_EINVAL,
                "nt_unsqueeze", "8 dims");
    EXPECT_NULL(nt_flatten(t, 1, 0), NT_EINVAL, "nt_flatten", "start_dim 1 comes after");
    EXPECT_NULL(nt_flatten(t, 0, 2), NT_EDIM, "nt_flatten", "end_dim 2");
    EXPECT_NULL(nt_unflatten(t, 1, 2, SH(3, 2)), NT_ESHAPE, "nt_unflatten", "multiply to 6");
    EXPECT_NULL(nt_unflatten(t, 1, 2, SH(-1, -1)), NT_EINVAL, "nt_unflatten", "sizes[1]");
    EXPECT_NULL(nt_unflatten(t, 1, 2, SH(3, -1)), NT_ESHAPE, "nt_unflatten", "-1");
    EXPECT_NULL(nt_unflatten(t, 1, 0, SH(4)), NT_EINVAL, "nt_unflatten", "'n' is 0");
    EXPECT_NULL(nt_unflatten(t, 2, 1, SH(4)), NT_EDIM, "nt_unflatten", "dim 2");
    EXPECT_NULL(nt_narrow(t, 1, 5, 0), NT_EINVAL, "nt_narrow", "start 5");
    EXPECT_NULL(nt_narrow(t, 1, -5, 1), NT_EINVAL, "nt_narrow", "start -5");
    EXPECT_NULL(nt_narrow(t, 1, 2, 3), NT_EINVAL, "nt_narrow", "length 3");
    EXPECT_NULL(nt_narrow(t, 1, 0, -1), NT_EINVAL, "nt_narrow", "length -1");
    EXPECT_NULL(nt_narrow(s0, 0, 0, 0), NT_EDIM, "nt_narrow", "0-d");
    nt_tensor *parts[4];
    nt_test_expect_err(nt_chunk(t, 0, 0, parts, 4), NT_EINVAL, "nt_chunk", "'chunks' is 0");
    nt_test_expect_err(nt_chunk(t, 2, 2, parts, 4), NT_EDIM, "nt_chunk", "dim 2");
    nt_test_expect_err(nt_chunk(t, 4, 1, parts, 3), NT_EINVAL, "nt_chunk", "'max_out' is 3");
    nt_test_expect_err(nt_chunk(s0, 1, 0, parts, 3), NT_EDIM, "nt_chunk", "0-d");
    nt_test_expect_err(nt_chunk(NULL, 1, 0, parts, 3), NT_EINVAL, "nt_chunk");
    nt_tensor *two[2] = {t, src}, *bad[2] = {t, nt_zeros(NT_F32, 2, SH(4, 3))};
    EXPECT_NULL(nt_stack(bad, 2, 0), NT_ESHAPE, "nt_stack", "ts[1]");
    EXPECT_NULL(nt_stack(two, 0, 0), NT_EINVAL, "nt_stack", "n = 0");
    EXPECT_NULL(nt_stack(two, 2, 3), NT_EDIM, "nt_stack", "dim 3");
    nt_tensor *withnull[2] = {t, NULL};
    EXPECT_NULL(nt_stack(withnull, 2, 0), NT_EINVAL, "nt_stack", "ts[1]");
    EXPECT_NULL(nt_diagonal(t, 0, 1, -1), NT_EDIM, "nt_diagonal", "the same dim");
    EXPECT_NULL(nt_diagonal(t, 0, 0, 2), NT_EDIM, "nt_diagonal", "out of range");
    EXPECT_NULL(nt_diagonal(i1, 0, 0, 1), NT_EDIM, "nt_diagonal", "at least 2");
    nt_scope_end(sc);
}

/* An index out of range is found when the op runs: NT_ERANGE naming the
 * call and its line, on both backends, nothing written; the stream keeps
 * working. */
static void expect_async(int rc, const char *fn, int line, const char *detail)
{
    char site[64];
    snprintf(site, sizeof site, "test_shapeops.c:%d", line);
    const char *m = nt_last_error_message();
    if (rc != NT_ERANGE || nt_last_error() != NT_ERANGE)
        fail_msg("expected NT_ERANGE, got %d: %s", rc, m);
    if (!strstr(m, fn) || !strstr(m, site) || !strstr(m, detail))
        fail_msg("message '%s' should name %s, %s and '%s'", m, fn, site, detail);
    nt_clear_error();
}

static void test_async_index_errors(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        backend(BE[b]);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *t = nt_zeros(NT_F32, 2, SH(2, 3));
        nt_tensor *src = nt_ones(NT_F32, 2, SH(2, 3));
        nt_tensor *bad = nt_from_host((int32_t[]){0, 1, 2, 0, 5, 1}, NT_I32, 2, SH(2, 3));
        nt_tensor *neg = nt_from_host((int32_t[]){0, -1}, NT_I32, 1, SH(2));
        float h[6];
        nt_tensor *y = nt_scatter(t, 0, bad, src); int l1 = __LINE__;
        assert_non_null(y);
        expect_async(nt_to_host(y, h, sizeof h), "nt_scatter", l1, "index[2] = 2 is out of range [0, 2)");
        y = nt_scatter_add(t, 1, bad, src); int l2 = __LINE__;
        expect_async(nt_to_host(y, h, sizeof h), "nt_scatter_add", l2, "index[4] = 5 is out of range [0, 3)");
        y = nt_index_add(t, 0, neg, src, 1.0); int l3 = __LINE__;
        expect_async(nt_to_host(y, h, sizeof h), "nt_index_add", l3, "index[1] = -1");
        nt_tensor *two = nt_from_host((int32_t[]){2}, NT_I32, 1, SH(1)), *one = nt_ones(NT_F32, 0, NULL);
        y = nt_index_put(t, two, one, false); int l4 = __LINE__;
        expect_async(nt_to_host(y, h, sizeof h), "nt_index_put", l4, "index[0] = 2");
        y = nt_one_hot(nt_from_host((int32_t[]){1, 4}, NT_I32, 1, SH(2)), 3); int l5 = __LINE__;
        int32_t hi[6];
        expect_async(nt_to_host(y, hi, sizeof hi), "nt_one_hot", l5, "index[1] = 4 is out of range [0, 3)");
        /* still working, t untouched */
        assert_int_equal(nt_to_host(nt_add(t, src), h, sizeof h), 0);
        for (int k = 0; k < 6; k++)
            assert_true(h[k] == 1.0f);
        nt_scope_end(sc);
    }
}

static int setup(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_refs),       cmocka_unit_test(test_double_reference),
        cmocka_unit_test(test_backends_agree),   cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_views_alias),      cmocka_unit_test(test_one_hot_forms),
        cmocka_unit_test(test_errors),           cmocka_unit_test(test_async_index_errors),
        cmocka_unit_test(test_large_strided),    cmocka_unit_test(test_modes),
        cmocka_unit_test(test_integer_adds),
    };
    return cmocka_run_group_tests_name("shapeops", tests, setup, nt_test_teardown);
}
