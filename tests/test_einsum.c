/* tests/test_einsum.c - nt_einsum (issue 33): against PyTorch 1.13
 * (tests/torch_refs/einsum.h, written by scripts/torch_refs/einsum.py: odd
 * shapes, matmul, bmm, batched trace, outer, transpose, diagonal, ellipsis,
 * attention-like scores, three-operand chains, size-1 broadcasting, edge
 * values), against a generic einsum evaluator in double written here (on
 * chosen and on 400 random equations), the documented lowering written out
 * as ops (bit for bit; bf16, f16 and autocast too), gradcheck, the same
 * bits on both backends and in every mode (captured too), and every error
 * path.
 *
 * Bounds: where the einsum moves elements or takes one product or a sum of
 * at most two terms per element (the `exact` column of the references),
 * PyTorch's bits exactly (NaN: any NaN).  Elsewhere the summation orders
 * differ (PyTorch's bmm and sums, ntensor's K-tiles and canonical order),
 * so values and gradients are checked against the double evaluator within
 * (terms + 4) * 2^-23 * sum |term| (recursive summation over the terms of
 * an element and one rounding per contraction step), PyTorch's within twice
 * that. */
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
#include "torch_refs/einsum.h"

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

static int64_t numel_of(int nd, const int64_t *sh)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= sh[i];
    return n;
}

static nt_tensor *from_floats(const float *f, int nd, const int64_t *sh)
{
    nt_tensor *t = nt_from_host(f, NT_F32, nd, sh);
    assert_non_null(t);
    return t;
}

static nt_tensor *from_bits(const uint32_t *u, int nd, const int64_t *sh)
{
    int64_t n = numel_of(nd, sh);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = f_of(u[i]);
    nt_tensor *t = from_floats(f, nd, sh);
    free(f);
    return t;
}

static float *to_floats(nt_tensor *t)
{
    int64_t n = nt_numel(t);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    if (nt_to_host(t, f, (size_t)n * sizeof *f))
        fail_msg("to_host: %s", nt_last_error_message());
    return f;
}

/* ---------------- the evaluator in double ---------------- */

/* An equation read again, independently of the library: each operand's
 * dims and the output's as symbols (letters by their ASCII code, the '...'
 * dims as 200 + j, right-aligned), and each symbol's size. */
enum { EV_MAXOP = 8, EV_NSYM = 256 };
typedef struct {
    int n, nd[EV_MAXOP], sym[EV_MAXOP][8], ond, osym[8];
    int64_t sh[EV_MAXOP][8], size[EV_NSYM];
} ev_eq;

static void ev_parse(ev_eq *q, const char *eq, int n, const int *nd, const int64_t (*sh)[8])
{
    memset(q, 0, sizeof *q);
    q->n = n;
    for (int s = 0; s < EV_NSYM; s++)
        q->size[s] = -1;
    const char *arrow = strstr(eq, "->"), *p = eq;
    int ell = 0, cnt[EV_NSYM] = {0}, any = 0;
    char subs[EV_MAXOP][64];
    for (int k = 0; k < n; k++) { /* the operands' strings without spaces */
        int m = 0;
        for (; *p && *p != ',' && p != arrow; p++)
            if (*p != ' ')
                subs[k][m++] = *p;
        subs[k][m] = 0;
        p++;
        int letters = m - (strstr(subs[k], "...") ? 3 : 0);
        if (strstr(subs[k], "...") && nd[k] - letters > ell)
            ell = nd[k] - letters;
        any |= strstr(subs[k], "...") != NULL;
    }
    for (int k = 0; k < n; k++) {
        const char *s = subs[k];
        int letters = (int)strlen(s) - (strstr(s, "...") ? 3 : 0), d = 0;
        for (; *s; s++) {
            if (*s == '.') {
                for (int j = 0; j < nd[k] - letters; j++)
                    q->sym[k][d++] = 200 + ell - (nd[k] - letters) + j;
                s += 2;
            } else {
                q->sym[k][d++] = *s;
            }
        }
        q->nd[k] = d;
        assert_int_equal(d, nd[k]);
        for (d = 0; d < nd[k]; d++) {
            int y = q->sym[k][d];
            q->sh[k][d] = sh[k][d];
            cnt[y]++;
            if (sh[k][d] != 1 || q->size[y] < 0)
                q->size[y] = sh[k][d];
        }
    }
    if (arrow) {
        for (const char *s = arrow + 2; *s; s++)
            if (*s == '.') {
                for (int j = 0; j < ell; j++)
                    q->osym[q->ond++] = 200 + j;
                s += 2;
            } else if (*s != ' ') {
                q->osym[q->ond++] = *s;
            }
    } else {
        for (int j = 0; any && j < ell; j++)
            q->osym[q->ond++] = 200 + j;
        for (int c = 'A'; c <= 'z'; c++)
            if (cnt[c] == 1)
                q->osym[q->ond++] = c;
    }
}

static int64_t ev_index(const ev_eq *q, int k, const int64_t *a)
{
    int64_t i = 0;
    for (int d = 0; d < q->nd[k]; d++)
        i = i * q->sh[k][d] + (q->sh[k][d] == 1 ? 0 : a[q->sym[k][d]]);
    return i;
}

static int64_t ev_out_index(const ev_eq *q, const int64_t *a)
{
    int64_t i = 0;
    for (int d = 0; d < q->ond; d++)
        i = i * q->size[q->osym[d]] + a[q->osym[d]];
    return i;
}

typedef struct {
    double *y, *yabs, *g[EV_MAXOP], *gabs[EV_MAXOP];
    int64_t ny, nx[EV_MAXOP], terms; /* terms: summed per output element */
} ev_res;

/* y = einsum(x), and the gradients of sum(y * w) (w NULL: no gradients) */
static ev_res ev_eval(const ev_eq *q, const float *const *x, const float *w)
{
    ev_res R = {0};
    int syms[EV_NSYM], ns = 0;
    for (int s = 0; s < EV_NSYM; s++)
        if (q->size[s] >= 0)
            syms[ns++] = s;
    R.ny = 1;
    for (int d = 0; d < q->ond; d++)
        R.ny *= q->size[q->osym[d]];
    R.y = calloc((size_t)R.ny + 1, sizeof *R.y);
    R.yabs = calloc((size_t)R.ny + 1, sizeof *R.yabs);
    for (int k = 0; k < q->n; k++) {
        R.nx[k] = 1;
        for (int d = 0; d < q->nd[k]; d++)
            R.nx[k] *= q->sh[k][d];
        R.g[k] = calloc((size_t)R.nx[k] + 1, sizeof **R.g);
        R.gabs[k] = calloc((size_t)R.nx[k] + 1, sizeof **R.gabs);
    }
    int64_t total = 1, a[EV_NSYM] = {0};
    for (int i = 0; i < ns; i++)
        total *= q->size[syms[i]];
    R.terms = R.ny ? total / R.ny : 0;
    for (int64_t f = 0; f < total; f++) {
        int64_t rem = f;
        for (int i = ns - 1; i >= 0; i--) {
            a[syms[i]] = rem % q->size[syms[i]];
            rem /= q->size[syms[i]];
        }
        int64_t o = ev_out_index(q, a), ix[EV_MAXOP];
        double v = 1;
        for (int k = 0; k < q->n; k++) {
            ix[k] = ev_index(q, k, a);
            v *= x[k][ix[k]];
        }
        R.y[o] += v;
        R.yabs[o] += fabs(v);
        for (int k = 0; w && k < q->n; k++) {
            double p = w[o];
            for (int j = 0; j < q->n; j++)
                if (j != k)
                    p *= x[j][ix[j]];
            R.g[k][ix[k]] += p;
            R.gabs[k][ix[k]] += fabs(p);
        }
    }
    return R;
}

static void ev_free(ev_res *R, int n)
{
    free(R->y);
    free(R->yabs);
    for (int k = 0; k < n; k++) {
        free(R->g[k]);
        free(R->gabs[k]);
    }
}

static bool same(float a, float b) { return (isnan(a) && isnan(b)) || u_of(a) == u_of(b); }

/* got within the bound of the exact value want (see the top); infinite or
 * NaN references only by class */
static bool near(double got, double want, double abssum, int64_t terms, double scale)
{
    if (isnan(want) || isinf(want))
        return isnan(want) ? isnan(got) : got == want;
    return fabs(got - want) <= scale * (double)(terms + 4) * 0x1p-23 * abssum + 1e-300;
}

/* ---------------- running a case ---------------- */

typedef struct {
    int ynd;
    int64_t ysh[8], ny, nx[4];
    float *y, *g[4];
} run;

static void run_free(run *r)
{
    free(r->y);
    for (int k = 0; k < 4; k++)
        free(r->g[k]);
}

/* y = einsum(eq, x), then sum(y * w) backward (w of y's shape) */
static run run_eq(const char *eq, int n, nt_tensor *const *x, const uint32_t *wb, const float *wf)
{
    run R = {0};
    nt_scope *sc = nt_scope_begin();
    for (int k = 0; k < n; k++)
        nt_set_requires_grad(x[k], true);
    nt_tensor *y = nt_einsum(eq, n, x);
    if (!y)
        fail_msg("einsum \"%s\": %s", eq, nt_last_error_message());
    R.ynd = nt_ndim(y);
    for (int i = 0; i < R.ynd; i++)
        R.ysh[i] = nt_shape(y, i);
    R.ny = nt_numel(y);
    nt_tensor *w = wb ? from_bits(wb, R.ynd, R.ysh) : from_floats(wf, R.ynd, R.ysh);
    assert_int_equal(nt_backward(nt_sum(nt_mul(y, w), NT_DIM_ALL, false)), 0);
    R.y = to_floats(y);
    for (int k = 0; k < n; k++) {
        R.nx[k] = nt_numel(x[k]);
        R.g[k] = to_floats(nt_grad(x[k]));
    }
    assert_int_equal(nt_scope_end(sc), 0);
    return R;
}

enum { NREF = sizeof EI_REFS / sizeof EI_REFS[0] };

static run run_ref(int ci)
{
    nt_tensor *x[3];
    nt_scope *sc = nt_scope_begin();
    for (int k = 0; k < EI_REFS[ci].n; k++)
        x[k] = nt_keep(from_bits(EI_REFS[ci].x[k], EI_REFS[ci].nd[k], EI_REFS[ci].sh[k]));
    assert_int_equal(nt_scope_end(sc), 0);
    run R = run_eq(EI_REFS[ci].eq, EI_REFS[ci].n, x, EI_REFS[ci].w, NULL);
    for (int k = 0; k < EI_REFS[ci].n; k++)
        nt_release(x[k]);
    return R;
}

/* one reference case's values and gradients against PyTorch's and the
 * evaluator's */
static void check_ref(int ci, const run *R)
{
    const char *eq = EI_REFS[ci].eq;
    int n = EI_REFS[ci].n, ex = EI_REFS[ci].exact;
    assert_int_equal(R->ynd, EI_REFS[ci].ynd);
    for (int i = 0; i < R->ynd; i++)
        assert_int_equal(R->ysh[i], EI_REFS[ci].ysh[i]);
    ev_eq q;
    ev_parse(&q, eq, n, EI_REFS[ci].nd, EI_REFS[ci].sh);
    float *xs[3] = {0};
    float *w = calloc((size_t)R->ny + 1, sizeof *w);
    for (int k = 0; k < n; k++) {
        xs[k] = malloc((size_t)(R->nx[k] + 1) * sizeof *xs[k]);
        for (int64_t i = 0; i < R->nx[k]; i++)
            xs[k][i] = f_of(EI_REFS[ci].x[k][i]);
    }
    for (int64_t i = 0; i < R->ny; i++)
        w[i] = f_of(EI_REFS[ci].w[i]);
    ev_res E = ev_eval(&q, (const float *const *)xs, w);
    for (int64_t i = 0; i < R->ny; i++) {
        float t = f_of(EI_REFS[ci].y[i]);
        if ((ex & 1) ? !same(R->y[i], t)
                     : !near(R->y[i], E.y[i], E.yabs[i], E.terms, 1) ||
                           !near(R->y[i], t, E.yabs[i], E.terms, 2))
            fail_msg("\"%s\": y[%lld] = %a, PyTorch %a, in double %a", eq, (long long)i,
                     (double)R->y[i], (double)t, E.y[i]);
    }
    for (int k = 0; k < n; k++)
        for (int64_t i = 0; i < R->nx[k]; i++) {
            float t = f_of(EI_REFS[ci].g[k][i]);
            int64_t gt = R->ny ? E.terms * R->ny / (R->nx[k] ? R->nx[k] : 1) + E.terms : 0;
            if ((ex & 2) ? !same(R->g[k][i], t)
                         : !near(R->g[k][i], E.g[k][i], E.gabs[k][i], gt, 1) ||
                               !near(R->g[k][i], t, E.gabs[k][i], gt, 2))
                fail_msg("\"%s\": operand %d's gradient [%lld] = %a, PyTorch %a, in double %a",
                         eq, k, (long long)i, (double)R->g[k][i], (double)t, E.g[k][i]);
        }
    ev_free(&E, n);
    for (int k = 0; k < n; k++)
        free(xs[k]);
    free(w);
}

/* every reference case on every backend and mode: PyTorch's values and
 * gradients (and the evaluator's) in the first, its bits everywhere */
static void test_vs_torch_all_configs(void **state)
{
    (void)state;
    for (int ci = 0; ci < NREF; ci++) {
        run ref = {0};
        for (int k = 0; k < NT_TEST_NCFG; k++) {
            nt_test_cfg(k);
            run R = run_ref(ci);
            if (k == 0) {
                check_ref(ci, &R);
                ref = R;
                continue;
            }
            for (int64_t i = 0; i < R.ny; i++)
                if (u_of(R.y[i]) != u_of(ref.y[i]))
                    fail_msg("\"%s\" on %s/%s: y[%lld] = %a, on cpu/deterministic %a",
                             EI_REFS[ci].eq, NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1],
                             (long long)i, (double)R.y[i], (double)ref.y[i]);
            for (int j = 0; j < EI_REFS[ci].n; j++)
                if (memcmp(R.g[j], ref.g[j], (size_t)R.nx[j] * sizeof *R.g[j]))
                    fail_msg("\"%s\" on %s/%s: operand %d's gradient differs from "
                             "cpu/deterministic's", EI_REFS[ci].eq, NT_TEST_CFGS[k][0],
                             NT_TEST_CFGS[k][1], j);
            run_free(&R);
        }
        run_free(&ref);
    }
    nt_test_cfg(0);
}

/* ---------------- more equations, against the evaluator ---------------- */

typedef struct {
    const char *eq;
    int n, nd[4];
    int64_t sh[4][8];
} eqcase;

static const eqcase DEF_CASES[] = {
    {"iii->i", 1, {3}, {{3, 3, 3}}},
    {"abc,cd,de,ef->af", 4, {3, 2, 2, 2}, {{2, 3, 4}, {4, 3}, {3, 5}, {5, 2}}},
    {"...ij,...ji->...", 2, {3, 3}, {{2, 3, 4}, {2, 4, 3}}},
    {"i,i,i->i", 3, {1, 1, 1}, {{5}, {5}, {5}}},
    {"ij,kl->ijkl", 2, {2, 2}, {{2, 3}, {3, 2}}},
    {"a...b,b...c->...ac", 2, {3, 3}, {{2, 3, 4}, {4, 3, 5}}},
    {"ij,jk->ik", 2, {2, 2}, {{3, 300}, {300, 2}}}, /* three K-tiles */
    {"AaBb,bB->Aa", 2, {4, 2}, {{2, 3, 4, 5}, {5, 4}}},
    {"i,i", 2, {1, 1}, {{6}, {6}}},
    {"jii,ik->kj", 2, {3, 2}, {{2, 3, 3}, {3, 4}}},
    {"...i,...i->...", 2, {3, 2}, {{3, 1, 4}, {5, 4}}},
    {"ij,jk->ik", 2, {2, 2}, {{2, 0}, {0, 3}}}, /* K = 0: zeros */
    {"ij->j", 1, {2}, {{0, 3}}},
    {"ij,j->i", 2, {2, 1}, {{3, 1}, {4}}}, /* broadcast j, summed from b first */
    {"b i j , b j k -> b k i", 2, {3, 3}, {{2, 3, 4}, {2, 4, 5}}},
    {"ij,ij,ij->", 3, {2, 2, 2}, {{3, 4}, {1, 4}, {3, 1}}},
    {"i->i...", 1, {1}, {{4}}},
    {"...->...", 1, {2}, {{2, 3}}},
};
enum { NDEF = sizeof DEF_CASES / sizeof DEF_CASES[0] };

/* the cases' operands, seeded values in [-1, 1) */
static void def_inputs(int ci, nt_tensor **x, float **xs)
{
    uint64_t st = 0x9e3779b97f4a7c15ull + (uint64_t)ci;
    const eqcase *e = &DEF_CASES[ci];
    for (int k = 0; k < e->n; k++) {
        int64_t m = numel_of(e->nd[k], e->sh[k]);
        xs[k] = malloc((size_t)(m + 1) * sizeof *xs[k]);
        nt_test_fill(xs[k], (size_t)m, &st);
        if (x)
            x[k] = from_floats(xs[k], e->nd[k], e->sh[k]);
    }
}

static void test_vs_definition(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) { /* cpu and sim */
        nt_test_cfg(b);
        for (int ci = 0; ci < NDEF; ci++) {
            const eqcase *e = &DEF_CASES[ci];
            nt_tensor *x[4];
            float *xs[4];
            nt_scope *sc = nt_scope_begin();
            def_inputs(ci, x, xs);
            ev_eq q;
            ev_parse(&q, e->eq, e->n, e->nd, e->sh);
            int64_t ny = 1;
            for (int d = 0; d < q.ond; d++)
                ny *= q.size[q.osym[d]];
            float *w = malloc((size_t)(ny + 1) * sizeof *w);
            uint64_t st = 77;
            nt_test_fill(w, (size_t)ny, &st);
            run R = run_eq(e->eq, e->n, x, NULL, w);
            ev_res E = ev_eval(&q, (const float *const *)xs, w);
            assert_int_equal(R.ynd, q.ond);
            for (int d = 0; d < q.ond; d++)
                assert_int_equal(R.ysh[d], q.size[q.osym[d]]);
            assert_int_equal(R.ny, ny);
            for (int64_t i = 0; i < ny; i++)
                if (!near(R.y[i], E.y[i], E.yabs[i], E.terms, 1))
                    fail_msg("\"%s\" on %s: y[%lld] = %a, in double %a", e->eq,
                             NT_TEST_CFGS[b][0], (long long)i, (double)R.y[i], E.y[i]);
            for (int k = 0; k < e->n; k++)
                for (int64_t i = 0; i < R.nx[k]; i++) {
                    int64_t gt = R.nx[k] ? E.terms * ny / R.nx[k] + E.terms + 4 : 0;
                    if (!near(R.g[k][i], E.g[k][i], E.gabs[k][i], gt, 1))
                        fail_msg("\"%s\" on %s: operand %d's gradient [%lld] = %a, in double %a",
                                 e->eq, NT_TEST_CFGS[b][0], k, (long long)i, (double)R.g[k][i],
                                 E.g[k][i]);
                }
            ev_free(&E, e->n);
            run_free(&R);
            for (int k = 0; k < e->n; k++)
                free(xs[k]);
            free(w);
            assert_int_equal(nt_scope_end(sc), 0);
        }
    }
    nt_test_cfg(0);
}

/* ---------------- random equations ---------------- */

/* One random equation over letters of random sizes: 1-3 operands, repeated
 * letters (diagonals), size-1 dims (broadcasting), '...' dims, implicit or
 * explicit outputs (a '...' left out of one is summed). */
static int rand_eq(uint64_t *st, char *eq, int *nd, int64_t (*sh)[8])
{
    static const char L[] = "abcdAB";
    int64_t lsz[6], esh[2] = {1 + nt_test_rand32(st) % 3, 1 + nt_test_rand32(st) % 3};
    for (int i = 0; i < 6; i++)
        lsz[i] = 1 + nt_test_rand32(st) % 4;
    int n = 1 + (int)(nt_test_rand32(st) % 3), used[6] = {0}, p = 0;
    bool any_ell = false;
    for (int k = 0; k < n; k++) {
        int nl = (int)(nt_test_rand32(st) % 4), ne = nt_test_rand32(st) % 3 == 0 ? 0 : -1, d = 0;
        if (ne == 0)
            ne = (int)(nt_test_rand32(st) % 3);
        int64_t one = nt_test_rand32(st) % 5 == 0; /* this operand's letters of size 1 */
        int ep = ne >= 0 ? (int)(nt_test_rand32(st) % (unsigned)(nl + 1)) : -1;
        if (k)
            eq[p++] = ',';
        for (int j = 0; j <= nl; j++) {
            if (j == ep) {
                memcpy(eq + p, "...", 3);
                p += 3;
                any_ell = true;
                for (int q = 0; q < ne; q++)
                    sh[k][d++] = nt_test_rand32(st) % 4 == 0 ? 1 : esh[2 - ne + q];
            }
            if (j == nl)
                break;
            int li = (int)(nt_test_rand32(st) % 6);
            used[li] = 1;
            eq[p++] = L[li];
            sh[k][d++] = one && li % 2 ? 1 : lsz[li];
        }
        nd[k] = d;
    }
    if (nt_test_rand32(st) % 2) {
        memcpy(eq + p, "->", 2);
        p += 2;
        if (any_ell && nt_test_rand32(st) % 3) {
            memcpy(eq + p, "...", 3);
            p += 3;
        }
        int perm[6] = {0, 1, 2, 3, 4, 5}; /* the output's letters in a random order */
        for (int i = 5; i > 0; i--) {
            int j = (int)(nt_test_rand32(st) % (unsigned)(i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int i = 0; i < 6; i++)
            if (used[perm[i]] && nt_test_rand32(st) % 2)
                eq[p++] = L[perm[i]];
    }
    eq[p] = 0;
    return n;
}

/* Many random equations against the evaluator in double: values and
 * gradients, each well within the bound (on the CPU; the bits are the
 * same everywhere) */
static void test_random_equations(void **state)
{
    (void)state;
    nt_test_cfg(0);
    uint64_t st = 0x5eed0033u;
    int ran = 0;
    for (int it = 0; it < 400; it++) {
        char eq[64];
        int nd[3];
        int64_t sh[3][8];
        int n = rand_eq(&st, eq, nd, sh);
        ev_eq q;
        ev_parse(&q, eq, n, nd, (const int64_t(*)[8])sh);
        bool ok = q.ond <= 8;
        for (int k = 0; k < n; k++) /* a repeated letter takes equal sizes */
            for (int a = 0; a < nd[k]; a++)
                for (int b = 0; b < a; b++)
                    ok &= q.sym[k][a] != q.sym[k][b] || sh[k][a] == sh[k][b];
        if (!ok)
            continue;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x[3];
        float *xs[3], w[4096];
        for (int k = 0; k < n; k++) {
            int64_t m = numel_of(nd[k], sh[k]);
            xs[k] = malloc((size_t)(m + 1) * sizeof *xs[k]);
            nt_test_fill(xs[k], (size_t)m, &st);
            x[k] = from_floats(xs[k], nd[k], sh[k]);
        }
        int64_t ny = 1;
        for (int d = 0; d < q.ond; d++)
            ny *= q.size[q.osym[d]];
        assert_true(ny <= 4096);
        nt_test_fill(w, (size_t)ny, &st);
        run R = run_eq(eq, n, x, NULL, w);
        ev_res E = ev_eval(&q, (const float *const *)xs, w);
        assert_int_equal(R.ny, ny);
        assert_int_equal(R.ynd, q.ond);
        for (int64_t i = 0; i < ny; i++)
            if (!near(R.y[i], E.y[i], E.yabs[i], E.terms, 1))
                fail_msg("\"%s\": y[%lld] = %a, in double %a", eq, (long long)i, (double)R.y[i],
                         E.y[i]);
        for (int k = 0; k < n; k++)
            for (int64_t i = 0; i < R.nx[k]; i++)
                if (!near(R.g[k][i], E.g[k][i], E.gabs[k][i], E.terms * ny + 4, 1))
                    fail_msg("\"%s\": operand %d's gradient [%lld] = %a, in double %a", eq, k,
                             (long long)i, (double)R.g[k][i], E.g[k][i]);
        ev_free(&E, n);
        run_free(&R);
        for (int k = 0; k < n; k++)
            free(xs[k]);
        assert_int_equal(nt_scope_end(sc), 0);
        ran++;
    }
    assert_true(ran > 300);
}

/* ---------------- the lowering of docs/ops.md, as ops ---------------- */

static void expect_bits(const char *what, nt_tensor *got, nt_tensor *want)
{
    assert_non_null(got);
    assert_non_null(want);
    assert_int_equal(nt_ndim(got), nt_ndim(want));
    for (int d = 0; d < nt_ndim(got); d++)
        assert_int_equal(nt_shape(got, d), nt_shape(want, d));
    float *a = to_floats(got), *b = to_floats(want);
    if (memcmp(a, b, (size_t)nt_numel(got) * sizeof *a))
        fail_msg("%s: nt_einsum's bits are not the documented lowering's", what);
    free(a);
    free(b);
}

static nt_tensor *rnd(int nd, const int64_t *sh, uint64_t seed)
{
    int64_t m = numel_of(nd, sh);
    float *f = malloc((size_t)(m + 1) * sizeof *f);
    nt_test_fill(f, (size_t)m, &seed);
    for (int64_t i = 0; i < m; i++) /* many magnitudes: the order shows */
        f[i] = ldexpf(f[i], (int)(i * 7 % 23) - 11);
    nt_tensor *t = from_floats(f, nd, sh);
    free(f);
    return t;
}

#define SH(...) (const int64_t[]){__VA_ARGS__}

static void test_lowering_bits(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        nt_test_cfg(b);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *A = rnd(3, SH(3, 4, 5), 1), *B = rnd(3, SH(3, 5, 2), 2);
        /* "ijk,ikl->jl": global order j, l, i, k; K = (i, k), i outer */
        nt_tensor *a3 = nt_reshape(nt_permute(A, (const int[]){1, 0, 2}), 3, SH(1, 4, 15));
        nt_tensor *want = nt_reshape(nt_matmul(a3, nt_reshape(B, 3, SH(1, 15, 2))), 2, SH(4, 2));
        expect_bits("ijk,ikl->jl", nt_einsum("ijk,ikl->jl", 2, (nt_tensor *[]){A, B}), want);
        /* "kji,ilk->jl" is the same contraction with K = (i, k) still i outer */
        nt_tensor *At = nt_permute(A, (const int[]){2, 1, 0}), *Bt = nt_permute(B, (const int[]){0, 2, 1});
        expect_bits("kji,ilk->jl", nt_einsum("kji,ilk->jl", 2, (nt_tensor *[]){At, Bt}), want);
        /* "ij,jk->i": k summed from the second operand first, then [1, i, j] . [1, j, 1] */
        nt_tensor *P = rnd(2, SH(3, 4), 3), *Q = rnd(2, SH(4, 6), 4);
        want = nt_reshape(nt_matmul(nt_reshape(P, 3, SH(1, 3, 4)),
                                    nt_reshape(nt_sum(Q, 1, false), 3, SH(1, 4, 1))), 1, SH(3));
        expect_bits("ij,jk->i", nt_einsum("ij,jk->i", 2, (nt_tensor *[]){P, Q}), want);
        /* one operand: nt_sum_dims over the summed dims in the global order */
        want = nt_sum_dims(nt_permute(A, (const int[]){1, 0, 2}), 2, (const int[]){1, 2}, false);
        expect_bits("ijk->j", nt_einsum("ijk->j", 1, &A), want);
        /* three operands, left to right */
        nt_tensor *C = rnd(2, SH(6, 2), 5);
        want = nt_reshape(nt_matmul(nt_reshape(nt_matmul(nt_reshape(P, 3, SH(1, 3, 4)),
                                                         nt_reshape(Q, 3, SH(1, 4, 6))),
                                               3, SH(1, 3, 6)),
                                    nt_reshape(C, 3, SH(1, 6, 2))), 2, SH(3, 2));
        expect_bits("ij,jk,kl->il", nt_einsum("ij,jk,kl->il", 3, (nt_tensor *[]){P, Q, C}), want);
        /* no K: one product per element */
        nt_tensor *u = rnd(1, SH(5), 6), *v = rnd(1, SH(3), 7);
        want = nt_mul(nt_reshape(u, 2, SH(5, 1)), nt_reshape(v, 2, SH(1, 3)));
        expect_bits("i,j->ij", nt_einsum("i,j->ij", 2, (nt_tensor *[]){u, v}), want);
        /* a size-1 j broadcasts: removed from the first operand, summed from the second */
        nt_tensor *S = rnd(2, SH(3, 1), 8);
        want = nt_mul(S, nt_reshape(nt_sum(Q, 0, false), 2, SH(1, 6)));
        expect_bits("ij,jk->ik (j of size 1)", nt_einsum("ij,jk->ik", 2, (nt_tensor *[]){S, Q}),
                    want);
        /* attention scores: [b*h, q, d] . [b*h, d, k] */
        nt_tensor *Qh = rnd(4, SH(2, 3, 5, 7), 9), *Kh = rnd(4, SH(2, 3, 4, 7), 10);
        want = nt_matmul(Qh, nt_transpose(Kh, 2, 3));
        expect_bits("bhqd,bhkd->bhqk", nt_einsum("bhqd,bhkd->bhqk", 2, (nt_tensor *[]){Qh, Kh}),
                    want);
        /* the result is a new tensor, also when nothing is computed */
        nt_tensor *y = nt_einsum("ijk", 1, &A);
        assert_true(y != A);
        expect_bits("ijk", y, A);
        assert_int_equal(nt_scope_end(sc), 0);
    }
    nt_test_cfg(0);
}

/* ---------------- gradcheck ---------------- */

static nt_tensor *gc_fn(nt_tensor *const *in, void *ctx)
{
    const eqcase *e = ctx;
    return nt_einsum(e->eq, e->n, in);
}

static const eqcase GC_CASES[] = {
    {"ij,jk->ik", 2, {2, 2}, {{2, 3}, {3, 4}}},
    {"bii->b", 1, {3}, {{2, 3, 3}}},
    {"...ij,...jk->...ik", 2, {4, 3}, {{2, 1, 2, 3}, {2, 3, 2}}},
    {"ij,jk,kl->il", 3, {2, 2, 2}, {{2, 3}, {3, 2}, {2, 3}}},
    {"ij,jk->ik", 2, {2, 2}, {{3, 1}, {2, 2}}},
    {"iij,k->jk", 2, {3, 1}, {{2, 2, 3}, {2}}},
    {"bhqd,bhkd->bhqk", 2, {4, 4}, {{1, 2, 3, 2}, {1, 2, 2, 2}}},
};

/* einsum is multilinear: the central differences are exact but for f32
 * rounding */
static void test_gradcheck(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        nt_test_cfg(b);
        for (size_t ci = 0; ci < sizeof GC_CASES / sizeof GC_CASES[0]; ci++) {
            const eqcase *e = &GC_CASES[ci];
            nt_scope *sc = nt_scope_begin();
            nt_tensor *x[4];
            for (int k = 0; k < e->n; k++) {
                x[k] = rnd(e->nd[k], e->sh[k], 100 + ci * 4 + (size_t)k);
                x[k] = nt_mul_scalar(x[k], 1.0); /* plain values */
                float h[64];
                int64_t m = numel_of(e->nd[k], e->sh[k]);
                for (int64_t i = 0; i < m; i++)
                    h[i] = (float)((i * 7 + k * 3) % 11) * 0.2f - 1.0f;
                x[k] = from_floats(h, e->nd[k], e->sh[k]);
                nt_set_requires_grad(x[k], true);
            }
            int rc = nt_gradcheck(gc_fn, x, e->n, (void *)e, 1e-2, 1e-3, 1e-3);
            if (rc)
                fail_msg("gradcheck \"%s\" on %s: %s", e->eq, NT_TEST_CFGS[b][0],
                         nt_last_error_message());
            assert_int_equal(nt_scope_end(sc), 0);
        }
    }
    nt_test_cfg(0);
}

/* ---------------- captured ---------------- */

/* a captured einsum replayed on other inputs gives the eager bits */
static void test_captured(void **state)
{
    (void)state;
    for (int k = 4; k <= 5; k++) { /* cpu and sim, lazy */
        nt_test_cfg(k);
        for (int ci = 0; ci < NREF; ci++) {
            int n = EI_REFS[ci].n;
            nt_scope *sc = nt_scope_begin();
            nt_tensor *x2[3], *x[3];
            for (int j = 0; j < n; j++) {
                x2[j] = from_bits(EI_REFS[ci].x[j], EI_REFS[ci].nd[j], EI_REFS[ci].sh[j]);
                x[j] = nt_zeros_like(x2[j]);
            }
            nt_tensor *want = nt_einsum(EI_REFS[ci].eq, n, x2);
            assert_non_null(want);
            assert_int_equal(nt_sync(), 0);
            assert_int_equal(nt_graph_capture_begin(), 0);
            static const char *const names[3] = {"x0", "x1", "x2"};
            for (int j = 0; j < n; j++)
                assert_int_equal(nt_graph_input(x[j], names[j]), 0);
            nt_tensor *y = nt_einsum(EI_REFS[ci].eq, n, x);
            nt_graph *g = nt_graph_capture_end();
            if (!g || !y)
                fail_msg("\"%s\": %s", EI_REFS[ci].eq, nt_last_error_message());
            for (int j = 0; j < n; j++)
                assert_int_equal(nt_graph_bind(g, names[j], x2[j]), 0);
            assert_int_equal(nt_graph_replay(g), 0);
            float *a = to_floats(y), *b = to_floats(want);
            assert_memory_equal(a, b, (size_t)nt_numel(y) * sizeof *a);
            free(a);
            free(b);
            nt_graph_destroy(g);
            assert_int_equal(nt_scope_end(sc), 0);
        }
    }
    nt_test_cfg(0);
}

/* ---------------- other dtypes ---------------- */

/* bf16 and f16 operands: the same lowering in their dtype (the matmul's
 * bf16 order, docs/ops.md section 7), against the ops written out; and f32
 * operands under autocast */
static void test_half_dtypes(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        nt_test_cfg(b);
        for (int h = 0; h < 2; h++) {
            nt_dtype dt = h ? NT_F16 : NT_BF16;
            nt_scope *sc = nt_scope_begin();
            nt_tensor *A = nt_cast(rnd(3, SH(2, 3, 20), 11), dt);
            nt_tensor *B = nt_cast(rnd(3, SH(2, 20, 4), 12), dt);
            nt_tensor *y = nt_einsum("bij,bjk->bik", 2, (nt_tensor *[]){A, B});
            assert_non_null(y);
            assert_int_equal(nt_dtype_of(y), dt);
            nt_tensor *want = nt_matmul(A, B);
            expect_bits("bij,bjk->bik", nt_cast(y, NT_F32), nt_cast(want, NT_F32));
            y = nt_einsum("bij->i", 1, &A);
            want = nt_sum_dims(nt_permute(A, (const int[]){1, 0, 2}), 2, (const int[]){1, 2},
                               false);
            assert_int_equal(nt_dtype_of(y), dt);
            expect_bits("bij->i", nt_cast(y, NT_F32), nt_cast(want, NT_F32));
            assert_int_equal(nt_scope_end(sc), 0);
        }
        /* under autocast: the lowering's matmuls are autocast's (bf16) */
        nt_scope *sc = nt_scope_begin();
        nt_tensor *P = rnd(2, SH(3, 4), 13), *Q = rnd(2, SH(4, 6), 14), *C = rnd(2, SH(6, 2), 15);
        assert_int_equal(nt_autocast_begin(NT_BF16), 0);
        nt_tensor *y = nt_einsum("ij,jk,kl->il", 3, (nt_tensor *[]){P, Q, C});
        nt_tensor *want = nt_reshape(
            nt_matmul(nt_reshape(nt_matmul(nt_reshape(P, 3, SH(1, 3, 4)), nt_reshape(Q, 3, SH(1, 4, 6))),
                                 3, SH(1, 3, 6)),
                      nt_reshape(C, 3, SH(1, 6, 2))),
            2, SH(3, 2));
        assert_int_equal(nt_autocast_end(), 0);
        assert_non_null(y);
        assert_int_equal(nt_dtype_of(y), NT_BF16);
        expect_bits("ij,jk,kl->il under autocast", nt_cast(y, NT_F32), nt_cast(want, NT_F32));
        assert_int_equal(nt_scope_end(sc), 0);
    }
    nt_test_cfg(0);
}

/* ---------------- bad input ---------------- */

#define EXPECT_BAD(call, code, ...) \
    nt_test_expect_err((call) ? 0 : nt_last_error(), code, "nt_einsum", __VA_ARGS__)

static void test_bad_input(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *a = nt_zeros(NT_F32, 2, SH(2, 3)), *b = nt_zeros(NT_F32, 2, SH(3, 4));
    nt_tensor *c = nt_zeros(NT_F32, 2, SH(4, 5)), *sq = nt_zeros(NT_F32, 2, SH(3, 4));
    nt_tensor *ab[2] = {a, b}, *ac[2] = {a, c}, *five[7];
    nt_tensor *xi = nt_zeros(NT_I32, 2, SH(2, 3)), *xh = nt_zeros(NT_BF16, 2, SH(3, 4));
    /* NULLs, counts */
    EXPECT_BAD(nt_einsum(NULL, 2, ab), NT_EINVAL, "'equation' is NULL", "test_einsum.c:");
    EXPECT_BAD(nt_einsum("ij,jk->ik", 2, NULL), NT_EINVAL, "'operands' is NULL");
    EXPECT_BAD(nt_einsum("ij,jk->ik", 0, ab), NT_EINVAL, "'operands'", "n = 0");
    EXPECT_BAD(nt_einsum("ij,jk->ik", 2, (nt_tensor *[]){a, NULL}), NT_EINVAL,
               "'operands[1]' is NULL");
    EXPECT_BAD(nt_einsum("ij,jk->ik", 1, ab), NT_EINVAL, "'n' is 1", "names 2 operands");
    EXPECT_BAD(nt_einsum("ij->ij", 2, ab), NT_EINVAL, "'n' is 2", "names 1 operand;");
    /* characters */
    EXPECT_BAD(nt_einsum("ij,j1->i", 2, ab), NT_EINVAL, "'equation'", "('1') at index 4",
               "[a-zA-Z]");
    EXPECT_BAD(nt_einsum("ij,jk->ik\t", 2, ab), NT_EINVAL, "0x09", "index 9");
    /* misplaced '...', '->' */
    EXPECT_BAD(nt_einsum("i.j", 1, &a), NT_EINVAL, "'.' at index 1", "ellipsis '...'");
    EXPECT_BAD(nt_einsum("....j", 1, &a), NT_EINVAL, "'.' at index 3");
    EXPECT_BAD(nt_einsum("...i...", 1, &a), NT_EINVAL, "second '...' at index 4",
               "an operand");
    EXPECT_BAD(nt_einsum("...ij->......", 1, &a), NT_EINVAL, "second '...' at index 10",
               "the output");
    EXPECT_BAD(nt_einsum("ij->j->i", 1, &a), NT_EINVAL, "second '->' at index 5");
    EXPECT_BAD(nt_einsum("i-j", 1, &a), NT_EINVAL, "'-' at index 1", "arrow '->'");
    EXPECT_BAD(nt_einsum("ij>j", 1, &a), NT_EINVAL, "'>' at index 2", "arrow '->'");
    EXPECT_BAD(nt_einsum("ij,jk->i,k", 2, ab), NT_EINVAL, "',' at index 8", "in the output");
    /* the output */
    EXPECT_BAD(nt_einsum("ij,jk->iz", 2, ab), NT_EINVAL, "output subscript 'z' appears in no "
               "operand");
    EXPECT_BAD(nt_einsum("ij,jk->kik", 2, ab), NT_EINVAL, "output subscript 'k' appears more "
               "than once");
    /* subscripts against dims, sizes */
    EXPECT_BAD(nt_einsum("ijk->i", 1, &a), NT_ESHAPE, "operands[0] has 2 dims",
               "3 subscripts and no '...'");
    EXPECT_BAD(nt_einsum("ij,j->i", 2, ab), NT_ESHAPE, "operands[1] has 2 dims",
               "1 subscripts");
    EXPECT_BAD(nt_einsum("ijk...->i", 1, &a), NT_ESHAPE, "3 subscripts and a '...'",
               "at most 2");
    EXPECT_BAD(nt_einsum("ij,jk->ik", 2, ac), NT_ESHAPE, "subscript 'j' has size 4",
               "operands[1] but 3 in operands[0]", "equal sizes or 1");
    EXPECT_BAD(nt_einsum("ij,kj->ik", 2, ac), NT_ESHAPE, "subscript 'j' has size 5 in dim 1");
    nt_tensor *e1 = nt_zeros(NT_F32, 3, SH(2, 7, 3)), *e2 = nt_zeros(NT_F32, 2, SH(4, 3));
    EXPECT_BAD(nt_einsum("...j,...j->...", 2, (nt_tensor *[]){e1, e2}), NT_ESHAPE,
               "of '...' has size 4 in dim 0 of operands[1] but 7 in operands[0]");
    EXPECT_BAD(nt_einsum("ii->i", 1, &sq), NT_ESHAPE, "subscript 'i' is repeated in "
               "operands[0]", "sizes 3 and 4");
    /* dtypes */
    EXPECT_BAD(nt_einsum("ij->ji", 1, &xi), NT_EDTYPE, "operands[0] is i32", "floating");
    EXPECT_BAD(nt_einsum("ij,jk->ik", 2, (nt_tensor *[]){a, xh}), NT_EDTYPE,
               "operands[1] is bf16 but operands[0] is f32", "one dtype");
    /* too many dims: in the output, in a step */
    nt_tensor *v1 = nt_zeros(NT_F32, 1, SH(2));
    nt_tensor *nine[9] = {v1, v1, v1, v1, v1, v1, v1, v1, v1};
    EXPECT_BAD(nt_einsum("a,b,c,d,e,f,g,h,i", 9, nine), NT_ESHAPE, "output would have 9 dims",
               "NT_MAX_DIMS");
    nt_tensor *m2 = nt_zeros(NT_F32, 2, SH(2, 2)), *m5 = nt_zeros(NT_F32, 5, SH(2, 2, 2, 2, 2));
    for (int i = 0; i < 5; i++)
        five[i] = m2;
    five[5] = five[6] = m5;
    EXPECT_BAD(nt_einsum("ab,cd,ef,gh,ij,abcde,fghij->", 7, five), NT_ESHAPE,
               "contracting operands[0..4] would hold 10 dims", "NT_MAX_DIMS");
    /* a released operand */
    nt_tensor *r = nt_zeros(NT_F32, 2, SH(2, 3));
    nt_release(r);
    nt_test_expect_err(nt_einsum("ij", 1, &r) ? 0 : nt_last_error(), NT_ERELEASED, "nt_einsum");
    /* nothing was queued by any of these, and a good call still works */
    nt_tensor *y = nt_einsum("ij,jk->ik", 2, ab);
    assert_non_null(y);
    assert_int_equal(nt_shape(y, 0), 2);
    assert_int_equal(nt_shape(y, 1), 4);
    assert_int_equal(nt_scope_end(sc), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_torch_all_configs),
        cmocka_unit_test(test_vs_definition),
        cmocka_unit_test(test_random_equations),
        cmocka_unit_test(test_lowering_bits),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_captured),
        cmocka_unit_test(test_half_dtypes),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, nt_test_setup, nt_test_teardown);
}
