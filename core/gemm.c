/* core/gemm.c - see gemm.h. */
#include "gemm.h"

#include <cblas.h>

void nt__gemm_ktile(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, bool acc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        if (!acc)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++)
                    C[(long)i * ldc + j] = 0.0f;
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, 1.0f, A, lda, B, ldb,
                acc ? 1.0f : 0.0f, C, ldc);
}
