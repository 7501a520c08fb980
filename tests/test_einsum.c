/* tests/test_einsum.c - nt_einsum (issue 33): against PyTorch 1.13
 * (tests/torch_refs/einsum.h, written by scripts/torch_refs/einsum.py: odd
 * shapes, matmul, bmm, batched trace, outer, transpose, diagonal, ellipsis,
 * attention-like scores, three-operand chains, size-1 broadcasting, edge
 * values), against a generic einsum evaluator in double written here, the
 * documented lowering written out as ops (bit for bit), gradcheck, the same
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
    int64_t ysh[8], ny, nx[3];
    float *y, *g[3];
} run;

static void run_free(run *r)
{
    free(r->y);
    for (int k = 0; k < 3; k++)
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
    float *xs[3] = {0}, *w = malloc((size_t)(R->ny + 1) * sizeof *w);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_torch_all_configs),
    };
    return cmocka_run_group_tests(tests, nt_test_setup, nt_test_teardown);
}
