/* cpu/sample.c - dropout, topk and multinomial (issue 13): the arithmetic of
 * core/sample.h over a whole tensor.  The simulator's kernels
 * (sim/kernels/sample.c) compute the same elements from the same functions. */
#include "cpu/cpu.h"

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
