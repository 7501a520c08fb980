/* cpu/moe.c - the grouped matmul of mixture-of-experts layers (core/optable.h:
 * grouped_mm, grouped_mm_wgrad; docs/parallel.md, "Mixture of experts").
 *
 * The rows of x come in consecutive runs, one per expert, of the lengths
 * counts[e] (read here, on the device: no host sync issues the op).  Each
 * expert's product is one call of core/gemm.h's primitive on its row slice,
 * exactly what nt_matmul computes on that slice (docs/exactness.md, rule
 * 4): every element is one recurrence over K-tiles of 128 in ascending
 * order, which does not depend on where the slice starts or how many rows
 * it has.  The weight gradient of expert e contracts over its own rows,
 * K-tiles of 128 from the expert's first row, as nt_matmul(x_e^T, gy_e). */
#include "cpu/cpu.h"

#include <glib.h>
#include <string.h>

#include "core/gemm.h"
#include "core/moe.h"

/* counts[0..E) as int64, checked: each >= 0, their sum <= M.  NULL (after
 * nt__kerr) on bad counts. */
static int read_counts(const nt_tensor *ct, int64_t E, int64_t M, int64_t *cnt)
{
    const int32_t *cd = (const int32_t *)nt__tensor_data(ct);
    int64_t st = ct->stride[0], sum = 0;
    for (int64_t e = 0; e < E; e++) {
        cnt[e] = cd[e * st];
        if (cnt[e] < 0)
            return nt__kerr(NT_ERANGE, "counts[%lld] = %lld is negative", (long long)e,
                            (long long)cnt[e]);
        sum += cnt[e];
    }
    if (sum > M)
        return nt__kerr(NT_ERANGE, "counts add up to %lld rows; x has %lld", (long long)sum,
                        (long long)M);
    return 0;
}

/* C [m, n] (odt, row stride n) = A . B with A row-major [m, k] (arow) or
 * given as A^T [k, m], B [k, n] or given as B^T [n, k] (bcol): nt_matmul's
 * arithmetic, rounded once to odt. */
static int one_product(int m, int n, int k, const void *A, int lda, bool arow, const void *B,
                       int ldb, bool bcol, nt_dtype dt, void *out)
{
    if (m == 0 || n == 0)
        return 0;
    float *C = dt == NT_F32 ? out : g_try_malloc((size_t)m * (size_t)n * sizeof(float));
    if (!C)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a grouped_mm block (%d x %d)", m, n);
    int rc = 0;
    if (nt__gemm_typed(m, n, k, A, lda, arow, dt, B, ldb, bcol, dt, C, n, out, dt) != 0) {
        if (dt == NT_F32)
            nt__gemm_ex_canon(m, n, k, A, lda, arow, B, ldb, bcol, C, n);
        else
            rc = nt__kerr(NT_EHOSTMEM, "out of host memory for grouped_mm panels");
    }
    if (C != out)
        g_free(C);
    return rc;
}

int nt__cpu_grouped_mm(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *w = r->in[1], *o = r->out[0];
    int64_t M = x->shape[0], E = w->shape[0], N = o->shape[1];
    bool tr = r->p.dim == 1; /* y = x . w[e]^T */
    int64_t K = x->shape[1];
    nt_dtype dt = (nt_dtype)x->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt);
    int64_t *cnt = g_try_malloc0((size_t)(E + 1) * sizeof *cnt);
    if (!cnt)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for grouped_mm's counts");
    int rc = read_counts(r->in[2], E, M, cnt);
    const char *xd = nt__tensor_data(x), *wd = nt__tensor_data(w);
    char *od = nt__tensor_data(o);
    int64_t row = 0;
    for (int64_t e = 0; e < E && !rc; e++) {
        rc = one_product((int)cnt[e], (int)N, (int)K, xd + row * K * es, (int)K, true,
                         wd + e * K * N * es, (int)(tr ? K : N), tr, dt, od + row * N * es);
        row += cnt[e];
    }
    if (!rc && row < M) /* rows past the counts' sum: zeros */
        memset(od + row * N * es, 0, (size_t)((M - row) * N * es));
    g_free(cnt);
    return rc;
}

int nt__cpu_grouped_mm_wgrad(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *gy = r->in[1], *o = r->out[0];
    int64_t M = x->shape[0], K = x->shape[1], N = gy->shape[1], E = o->shape[0];
    nt_dtype dt = (nt_dtype)x->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt);
    int64_t *cnt = g_try_malloc0((size_t)(E + 1) * sizeof *cnt);
    if (!cnt)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for grouped_mm's counts");
    int rc = read_counts(r->in[2], E, M, cnt);
    const char *xd = nt__tensor_data(x), *gd = nt__tensor_data(gy);
    char *od = nt__tensor_data(o);
    int64_t row = 0;
    for (int64_t e = 0; e < E && !rc; e++) {
        char *dst = od + e * K * N * es;
        if (cnt[e] == 0) /* no rows: the empty sum */
            memset(dst, 0, (size_t)(K * N * es));
        else
            rc = one_product((int)K, (int)N, (int)cnt[e], xd + row * K * es, (int)K, false,
                             gd + row * N * es, (int)N, false, dt, dst);
        row += cnt[e];
    }
    g_free(cnt);
    return rc;
}

int nt__cpu_all_to_all_index(const nt__rec *r)
{
    const nt_tensor *c = r->in[0];
    int64_t P = c->shape[0];
    char why[200];
    int rc = nt__a2a_index((const int32_t *)nt__tensor_data(c), P, r->p.i[0], r->p.i[1],
                           (int32_t *)nt__tensor_data(r->out[0]), r->out[0]->shape[0], why,
                           sizeof why);
    return rc ? nt__kerr(rc, "%s", why) : 0;
}
