/* cpu/sample.c - dropout, topk and multinomial (issue 13): the arithmetic of
 * core/sample.h over a whole tensor.  The simulator's kernels
 * (neuron/sample.c) compute the same elements from the same functions. */
#include "cpu/cpu.h"

#include <stdlib.h>

#include "core/sample.h"
#include "cpu/rows.h"

#define SAMPLE_CHUNK 2048

/* y[i] = x[i] * m(seed, i), i the row-major index; y fresh and contiguous. */
int nt__cpu_dropout(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    nt_dtype dt = (nt_dtype)o->dtype;
    int64_t n = nt__numel(o->ndim, o->shape), es = (int64_t)nt__dtype_size(dt);
    char *y = nt__tensor_data(o);
    uint64_t key = nt__rng_key(r->p.seed);
    double p = r->p.f[0];
    float scale = nt__dropout_scale(p), buf[SAMPLE_CHUNK];
    nt__flat F;
    nt__flat_init(&F, x);
    for (int64_t i0 = 0; i0 < n; i0 += SAMPLE_CHUNK) {
        int64_t m = n - i0 < SAMPLE_CHUNK ? n - i0 : SAMPLE_CHUNK;
        nt__flat_read_f32(&F, buf, m);
        for (int64_t k = 0; k < m; k++)
            buf[k] = buf[k] * nt__dropout_mul(key, (uint64_t)(i0 + k), p, scale);
        nt__st_f32(y + i0 * es, dt, 1, buf, m); /* one rounding */
    }
    return 0;
}

/* ---------------- topk ---------------- */

typedef struct tk_ent {
    double v;
    int64_t i;
} tk_ent;

static int tk_large(const void *a, const void *b)
{
    const tk_ent *x = a, *y = b;
    return nt__topk_before(x->v, x->i, y->v, y->i, true) ? -1 : 1;
}
static int tk_small(const void *a, const void *b)
{
    const tk_ent *x = a, *y = b;
    return nt__topk_before(x->v, x->i, y->v, y->i, false) ? -1 : 1;
}

/* x [O, L, I] (dim d in the middle) -> i32 [O, k, I]: each row (o, i)
 * sorted by nt__topk_before (a strict total order, so qsort's instability
 * cannot show), its first k indices kept. */
int nt__cpu_topk(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    int d = r->p.dim;
    int64_t k = r->p.i[0], L = x->shape[d], O = 1, I = 1, n = nt__numel(x->ndim, x->shape);
    for (int a = 0; a < d; a++)
        O *= x->shape[a];
    for (int a = d + 1; a < x->ndim; a++)
        I *= x->shape[a];
    if (n == 0 || k == 0)
        return 0;
    bool fl = nt__dtype_is_float((nt_dtype)x->dtype);
    double *v = g_try_malloc((size_t)n * sizeof(double));
    tk_ent *row = g_try_malloc((size_t)L * sizeof(tk_ent));
    float *tf = g_try_malloc(SAMPLE_CHUNK * sizeof(float));
    if (!v || !row || !tf) {
        g_free(v), g_free(row), g_free(tf);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for topk over %lld elements",
                        (long long)n);
    }
    nt__flat F;
    nt__flat_init(&F, x);
    for (int64_t i0 = 0; i0 < n; i0 += SAMPLE_CHUNK) {
        int64_t m = n - i0 < SAMPLE_CHUNK ? n - i0 : SAMPLE_CHUNK;
        if (fl) {
            nt__flat_read_f32(&F, tf, m); /* exact: every float dtype widens to f32 */
            for (int64_t j = 0; j < m; j++)
                v[i0 + j] = tf[j];
        } else {
            nt__flat_read_i32(&F, (int32_t *)tf, m);
            for (int64_t j = 0; j < m; j++)
                v[i0 + j] = ((int32_t *)tf)[j];
        }
    }
    int32_t *y = nt__tensor_data(o);
    for (int64_t a = 0; a < O; a++)
        for (int64_t i = 0; i < I; i++) {
            for (int64_t j = 0; j < L; j++)
                row[j] = (tk_ent){v[(a * L + j) * I + i], j};
            qsort(row, (size_t)L, sizeof *row, r->p.flag ? tk_large : tk_small);
            for (int64_t j = 0; j < k; j++)
                y[(a * k + j) * I + i] = (int32_t)row[j].i;
        }
    g_free(v), g_free(row), g_free(tf);
    return 0;
}

/* ---------------- multinomial ---------------- */

/* probs [C] or [N, C] -> i32 [n] or [N, n]; core/sample.h's draw per row. */
int nt__cpu_multinomial(const nt__rec *r)
{
    const nt_tensor *pr = r->in[0], *o = r->out[0];
    int nd = pr->ndim;
    int64_t C = pr->shape[nd - 1], N = nd == 2 ? pr->shape[0] : 1, n = r->p.i[0];
    if (N == 0)
        return 0;
    double *cum = g_try_malloc((size_t)C * sizeof(double));
    float *row = g_try_malloc((size_t)C * sizeof(float));
    if (!cum || !row) {
        g_free(cum), g_free(row);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a %lld-category row", (long long)C);
    }
    uint64_t key = nt__rng_key(r->p.seed);
    int32_t *y = nt__tensor_data(o);
    nt__flat F;
    nt__flat_init(&F, pr);
    int rc = 0;
    for (int64_t a = 0; a < N && !rc; a++) {
        nt__flat_read_f32(&F, row, C); /* exact */
        double s = 0;
        int64_t last = -1;
        for (int64_t c = 0; c < C && !rc; c++) {
            if (nt__multinomial_bad(row[c])) {
                char m[160];
                nt__multinomial_msg(m, sizeof m, nd, a, c, row[c], false);
                rc = nt__kerr(NT_EINVAL, "%s", m);
            }
            s += row[c];
            cum[c] = s;
            if (row[c] > 0)
                last = c;
        }
        if (!rc && s == 0) {
            char m[160];
            nt__multinomial_msg(m, sizeof m, nd, a, 0, 0, true);
            rc = nt__kerr(NT_EINVAL, "%s", m);
        }
        for (int64_t j = 0; j < n && !rc; j++) {
            double t = nt__multinomial_target(key, (uint64_t)(a * n + j), s);
            int64_t lo = 0, hi = C; /* the first c with cum[c] > t */
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (cum[mid] > t)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            y[a * n + j] = (int32_t)(lo < C ? lo : last);
        }
    }
    g_free(cum), g_free(row);
    return rc;
}
