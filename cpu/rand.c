/* cpu/rand.c - nt_rand and nt_randn: element i of out[0] (fresh, contiguous,
 * floating) from the counter-based generators of core/rng.h, so the value
 * depends only on (p.seed, i). */
#include "cpu/cpu.h"

#include "core/rng.h"

#define NT_RAND_CHUNK 512

int nt__cpu_rand(const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    nt_dtype dt = (nt_dtype)o->dtype;
    int64_t n = nt__numel(o->ndim, o->shape);
    char *y = nt__tensor_data(o);
    size_t es = nt__dtype_size(dt);
    uint64_t key = nt__rng_key(r->p.seed);
    if (dt == NT_F64) { /* 53 random bits an element */
        for (int64_t i = 0; i < n; i++)
            ((double *)(void *)y)[i] = nt__rng_uniform64(key, (uint64_t)i);
        return 0;
    }
    int p = nt__rng_pbits(dt);
    float buf[NT_RAND_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += NT_RAND_CHUNK) {
        int64_t m = n - i0 < NT_RAND_CHUNK ? n - i0 : NT_RAND_CHUNK;
        for (int64_t k = 0; k < m; k++)
            buf[k] = nt__rng_uniform(key, (uint64_t)(i0 + k), p);
        nt__st_f32(y + i0 * (int64_t)es, dt, 1, buf, m); /* exact: no rounding */
    }
    return 0;
}

int nt__cpu_randn(const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    nt_dtype dt = (nt_dtype)o->dtype;
    int64_t n = nt__numel(o->ndim, o->shape);
    char *y = nt__tensor_data(o);
    uint64_t key = nt__rng_key(r->p.seed);
    for (int64_t i = 0; i < n; i++)
        nt__store_f64(y, dt, i, nt__rng_normal(key, (uint64_t)i)); /* one rounding */
    return 0;
}
