/* cpu/matmul.c - batched matmul with PyTorch's shape rules (1-D operands
 * promoted and the added dim dropped; batch dims broadcast), any strides.
 *
 * Arithmetic (DESIGN §3.4, the contract the simulator and fused kernels
 * reproduce): per batch, C [M, N] (f32) accumulates the K-tiles of 128 in
 * ascending order through nt__gemm_ktile,
 *     C = A^T[kt] . B[kt]           for the first tile (kt = 0),
 *     C = C + A^T[kt] . B[kt]       for every later tile,
 * where A^T[kt] is rows kt..kt+127 of a stored transposed (an f32 [Kt, M]
 * buffer) and B[kt] those of b (f32 [Kt, N]), both widened exactly from the
 * input dtype; then C is rounded once to the output dtype.  K = 0 gives
 * zeros.  The whole M x N goes to one nt__gemm_ktile call per K-tile: its
 * per-element order does not depend on M or N (core/gemm.h), so this equals
 * the simulator's 128 x 512 output blocks bit for bit. */
#include "cpu.h"

#include <string.h>

#include "gemm.h"

/* Packs the K x M matrix A^T (A^T[k, m] = a[m, k]) of one batch, widened. */
static void pack_at(float *dst, const char *a, nt_dtype dt, int64_t es, int64_t M, int64_t K,
                    int64_t rs, int64_t cs)
{
    if (rs <= cs) {
        /* a is stored column-major (a transposed view): row k of A^T is
         * contiguous in a. */
        for (int64_t k = 0; k < K; k++)
            nt__ld_f32(dst + k * M, a + k * cs * es, dt, rs, M);
        return;
    }
    /* Row-major a: read each row m in stretches of 64 along k and scatter
     * them down column m of A^T, so both sides stream. */
    float tmp[64];
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        int64_t kn = K - k0 < 64 ? K - k0 : 64;
        for (int64_t m = 0; m < M; m++) {
            nt__ld_f32(tmp, a + (m * rs + k0 * cs) * es, dt, cs, kn);
            for (int64_t k = 0; k < kn; k++)
                dst[(k0 + k) * M + m] = tmp[k];
        }
    }
}

/* Packs the K x N matrix B of one batch, widened. */
static void pack_b(float *dst, const char *b, nt_dtype dt, int64_t es, int64_t K, int64_t N,
                   int64_t rs, int64_t cs)
{
    for (int64_t k = 0; k < K; k++)
        nt__ld_f32(dst + k * N, b + k * rs * es, dt, cs, N);
}

int nt__cpu_matmul(const nt__rec *r)
{
    const nt_tensor *a = r->in[0], *b = r->in[1], *o = r->out[0];
    nt__mminfo mi;
    char why[160];
    if (!nt__matmul_info(a, b, &mi, why, sizeof why))
        return nt__kerr(NT_ESHAPE, "%s", why); /* the dispatcher checked: unreachable */
    int64_t M = mi.M, N = mi.N, K = mi.K;
    int64_t nbatch = nt__numel(mi.nbatch, mi.batch);
    if (M == 0 || N == 0 || nbatch == 0)
        return 0;
    if (M > INT32_MAX || N > INT32_MAX)
        return nt__kerr(NT_ENOTSUP, "matrix dims %lld x %lld exceed the BLAS int range",
                        (long long)M, (long long)N);
    nt_dtype adt = (nt_dtype)a->dtype, bdt = (nt_dtype)b->dtype, odt = (nt_dtype)o->dtype;
    int64_t aes = (int64_t)nt__dtype_size(adt), bes = (int64_t)nt__dtype_size(bdt);
    int64_t oes = (int64_t)nt__dtype_size(odt);
    size_t na = (size_t)(K * M), nb = (size_t)(K * N), nc = (size_t)(M * N);
    float *buf = g_try_malloc((na + nb + nc) * sizeof(float));
    if (!buf)
        return nt__kerr(NT_ENOMEM, "out of host memory for matmul buffers (%zu floats)",
                        na + nb + nc);
    float *At = buf, *B = buf + na, *C = buf + na + nb;
    const char *ad = nt__tensor_data(a), *bd = nt__tensor_data(b);
    char *od = nt__tensor_data(o);
    int64_t idx[NT_MAX_DIMS] = {0};
    int64_t a_prev = -1, b_prev = -1; /* broadcast batches reuse the packing */
    int64_t bi = 0;
    do {
        int64_t aoff = 0, boff = 0;
        for (int i = 0; i < mi.nbatch; i++)
            aoff += idx[i] * mi.a_bstride[i], boff += idx[i] * mi.b_bstride[i];
        if (aoff != a_prev)
            pack_at(At, ad + aoff * aes, adt, aes, M, K, mi.a_rs, mi.a_cs);
        if (boff != b_prev)
            pack_b(B, bd + boff * bes, bdt, bes, K, N, mi.b_rs, mi.b_cs);
        a_prev = aoff, b_prev = boff;
        if (K == 0)
            memset(C, 0, nc * sizeof(float));
        for (int64_t kt = 0; kt < K; kt += NT_GEMM_KTILE) {
            int Kt = (int)(K - kt < NT_GEMM_KTILE ? K - kt : NT_GEMM_KTILE);
            nt__gemm_ktile((int)M, (int)N, Kt, At + kt * M, (int)M, B + kt * N, (int)N, C,
                           (int)N, kt != 0);
        }
        nt__st_f32(od + bi * (int64_t)nc * oes, odt, 1, C, (int64_t)nc);
        bi++;
    } while (nt__idx_next(idx, mi.nbatch, mi.batch));
    g_free(buf);
    return 0;
}
