/* dist/tree.c - the rank tree: the one order every collective combines in.
 *
 * Values of ranks 0..n-1 are combined level by level: adjacent pairs
 * (v[2i] op v[2i+1]) in index order, an odd last one carried up unchanged.
 * The order depends on n alone -- never on arrival order, threads or
 * timing -- and it composes: when every rank holds a block of 2^k
 * consecutive shards, the tree over the ranks' own shard trees is the tree
 * over all shards (the first k levels of the big tree are exactly the
 * ranks' trees), which is what keeps data-parallel training bit-identical
 * at any core count (docs/collectives.md). */
#include "dist/dist.h"

#include <math.h>

/* Elements per pass: the n rows of scratch stay in cache. */
#define TREE_CHUNK 512

const char *nt__reduce_op_name(int op)
{
    switch (op) {
    case NT_REDUCE_SUM: return "sum";
    case NT_REDUCE_MEAN: return "mean";
    case NT_REDUCE_MAX: return "max";
    default: return NULL;
    }
}

/* NaN wins, so a NaN on any rank reaches every rank's result. */
static inline float max_f32(float a, float b)
{
    if (isnan(a))
        return a;
    if (isnan(b))
        return b;
    return b > a ? b : a;
}

static void tree_f32(float *w, int n, int m, nt_reduce_op op)
{
    /* w holds n rows of m values; each level writes row i from rows 2i and
     * 2i+1 (i < 2i for i > 0, so no row is overwritten before it is read). */
    for (int len = n; len > 1; len = (len + 1) / 2) {
        for (int i = 0; 2 * i < len; i++) {
            float *d = w + (size_t)i * m;
            const float *a = w + (size_t)(2 * i) * m;
            if (2 * i + 1 == len) { /* the odd last one: carried up */
                if (i != 2 * i)
                    memcpy(d, a, (size_t)m * sizeof *d);
                continue;
            }
            const float *b = a + m;
            if (op == NT_REDUCE_MAX)
                for (int k = 0; k < m; k++)
                    d[k] = max_f32(a[k], b[k]);
            else
                for (int k = 0; k < m; k++)
                    d[k] = a[k] + b[k];
        }
    }
}

static void tree_i32(int32_t *w, int n, int m, nt_reduce_op op)
{
    for (int len = n; len > 1; len = (len + 1) / 2) {
        for (int i = 0; 2 * i < len; i++) {
            int32_t *d = w + (size_t)i * m;
            const int32_t *a = w + (size_t)(2 * i) * m;
            if (2 * i + 1 == len) {
                if (i != 2 * i)
                    memcpy(d, a, (size_t)m * sizeof *d);
                continue;
            }
            const int32_t *b = a + m;
            if (op == NT_REDUCE_MAX)
                for (int k = 0; k < m; k++)
                    d[k] = b[k] > a[k] ? b[k] : a[k];
            else /* wraps like nt_add on integers (core/ewise.h) */
                for (int k = 0; k < m; k++)
                    d[k] = (int32_t)((uint32_t)a[k] + (uint32_t)b[k]);
        }
    }
}

int nt__tree_reduce(void *dst, const void *const *vals, int n, int64_t count, nt_dtype dt,
                    nt_reduce_op op)
{
    if (n <= 0 || count < 0)
        return NT_EINVAL;
    bool fl = nt__dtype_is_float(dt);
    if (!fl && op == NT_REDUCE_MEAN)
        return NT_EDTYPE;
    size_t es = nt__dtype_size(dt);
    if (count == 0)
        return 0;
    int m0 = count < TREE_CHUNK ? (int)count : TREE_CHUNK;
    void *w = malloc((size_t)n * (size_t)m0 * 4);
    if (!w)
        return NT_EHOSTMEM;
    /* (float)(1/n): one rounding of the factor, then one of the product;
     * both exact when n is a power of two. */
    float inv = (float)(1.0 / (double)n);
    for (int64_t base = 0; base < count; base += m0) {
        int m = count - base < m0 ? (int)(count - base) : m0;
        if (fl) {
            float *wf = w;
            for (int r = 0; r < n; r++)
                nt__ld_f32(wf + (size_t)r * m, (const char *)vals[r] + base * (int64_t)es, dt, 1,
                           m);
            tree_f32(wf, n, m, op);
            if (op == NT_REDUCE_MEAN)
                for (int k = 0; k < m; k++)
                    wf[k] = wf[k] * inv;
            nt__st_f32((char *)dst + base * (int64_t)es, dt, 1, wf, m);
        } else {
            int32_t *wi = w;
            for (int r = 0; r < n; r++)
                nt__ld_i32(wi + (size_t)r * m, (const char *)vals[r] + base * (int64_t)es, dt, 1,
                           m);
            tree_i32(wi, n, m, op);
            nt__st_i32((char *)dst + base * (int64_t)es, dt, 1, wi, m);
        }
    }
    free(w);
    return 0;
}
