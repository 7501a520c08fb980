/* cpu/gather.c - embedding: out[..., :] = weight[idx[...], :].
 *
 * weight [V, D] (any dtype, any strides), idx [...] (i32 or u8, any
 * strides), out [..., D] fresh and contiguous with weight's dtype.  Rows are
 * copied bit for bit (no conversion, so NaN payloads and -0 survive).  An
 * index outside [0, V) is a data error found when the op runs: NT_ERANGE
 * naming the flat (row-major) position in idx and the value. */
#include "cpu/rows.h"

#include <string.h>

#define NT_IDX_CHUNK 512

int nt__cpu_embedding(const nt__rec *r)
{
    const nt_tensor *w = r->in[0], *ix = r->in[1], *o = r->out[0];
    int64_t V = w->shape[0], D = w->shape[1];
    int64_t n = nt__numel(ix->ndim, ix->shape);
    int64_t es = (int64_t)nt__dtype_size((nt_dtype)w->dtype);
    int64_t ws0 = w->stride[0], ws1 = w->stride[1];
    const char *wd = nt__tensor_data(w);
    char *y = nt__tensor_data(o);
    int32_t idx[NT_IDX_CHUNK];
    nt__flat F;
    nt__flat_init(&F, ix);
    for (int64_t p0 = 0; p0 < n; p0 += NT_IDX_CHUNK) {
        int64_t m = n - p0 < NT_IDX_CHUNK ? n - p0 : NT_IDX_CHUNK;
        nt__flat_read_i32(&F, idx, m);
        for (int64_t k = 0; k < m; k++) {
            int32_t v = idx[k];
            if (v < 0 || v >= V)
                return nt__kerr(NT_ERANGE, "idx[%lld] = %d is out of range [0, %lld)",
                                (long long)(p0 + k), v, (long long)V);
            const char *src = wd + (int64_t)v * ws0 * es;
            char *dst = y + (p0 + k) * D * es;
            if (ws1 == 1) {
                memcpy(dst, src, (size_t)(D * es));
            } else {
                for (int64_t j = 0; j < D; j++)
                    memcpy(dst + j * es, src + j * ws1 * es, (size_t)es);
            }
        }
    }
    return 0;
}
