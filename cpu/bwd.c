/* cpu/bwd.c - kernels of the backward-only ops (autograd enqueues them). */
#include "cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

/* embedding_bwd: gw[V, D] = sum over positions p (row-major order of idx) of
 * g[p, :] added into row idx[p].  f32 accumulation in index order, so the
 * result never depends on threads or tiling; rounded once to gw's dtype. */
int nt__cpu_embedding_bwd(const nt__rec *r)
{
    const nt_tensor *g = r->in[0], *idx = r->in[1], *o = r->out[0];
    int64_t V = o->shape[0], D = o->shape[1];
    int64_t P = nt__numel(idx->ndim, idx->shape);
    float *acc = calloc((size_t)(V * D > 0 ? V * D : 1), sizeof(float));
    float *gf = malloc((size_t)(P * D > 0 ? P * D : 1) * sizeof(float));
    int32_t *ix = malloc((size_t)(P > 0 ? P : 1) * sizeof(int32_t));
    if (!acc || !gf || !ix) {
        free(acc), free(gf), free(ix);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a %lld x %lld gradient",
                        (long long)V, (long long)D);
    }
    nt__gather_f32(gf, g);
    {
        nt__kv v;
        nt__kv_of(&v, idx, 0, NULL);
        int64_t k = 0, id[NT_MAX_DIMS] = {0};
        if (P > 0)
            do
                ix[k++] = nt__load_i32(v.data, v.dt, nt__kv_off(&v, id));
            while (nt__idx_next(id, v.ndim, v.shape));
    }
    int rc = 0;
    for (int64_t p = 0; p < P; p++) {
        if (ix[p] < 0 || ix[p] >= V) {
            rc = nt__kerr(NT_ERANGE, "idx[%lld] = %d is out of range [0, %lld)", (long long)p,
                          ix[p], (long long)V);
            break;
        }
        float *dst = acc + (int64_t)ix[p] * D;
        const float *src = gf + p * D;
        for (int64_t d = 0; d < D; d++)
            dst[d] += src[d];
    }
    if (!rc)
        nt__st_f32(nt__tensor_data(o), (nt_dtype)o->dtype, 1, acc, V * D);
    free(acc), free(gf), free(ix);
    return rc;
}
