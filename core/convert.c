/* core/convert.c - block conversions between typed buffers and f32 / i32
 * registers, and the matmul operand packing built on them.  Widening is
 * exact; narrowing rounds once, to nearest even, NaNs made canonical
 * (core/dtype.h has the element rules). */
#include <string.h>

#include "core/dtype.h"
#include "core/gemm.h"

/* The unit-stride narrowing stores at the AVX-512 level (NT_CPU_ISA, the
 * level the matmul and the fused evaluator use): the same integer
 * operations per element as the loops below, 16 lanes wide instead of 8.
 * A bf16 store from L1 ran at 7.5 G elements/s with 256-bit vectors and 14
 * with 512 (Zen 5); they are the stores of every bf16 kernel output.  Same
 * bits on every level (tests/test_dtype.c compares them). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NT_CONVERT_AVX512 1
__attribute__((target(NT_TARGET_AVX512))) static void st_bf16_avx512(uint16_t *p, const float *src,
                                                                     int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = nt__f32_to_bf16(src[i]);
}

__attribute__((target(NT_TARGET_AVX512))) static void st_canon_avx512(float *p, const float *src,
                                                                      int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = nt__canon(src[i]);
}
#endif

void nt__ld_f32(float *dst, const char *src, nt_dtype dt, int64_t st, int64_t n)
{
    switch (dt) {
    case NT_F32: {
        const float *p = (const float *)src;
        if (st == 1)
            memcpy(dst, p, (size_t)n * 4);
        else
            for (int64_t i = 0; i < n; i++)
                dst[i] = p[i * st];
        break;
    }
    case NT_BF16: {
        const uint16_t *p = (const uint16_t *)src;
        if (st == 1) /* the unit-stride loop vectorises */
            for (int64_t i = 0; i < n; i++)
                dst[i] = nt__bf16_to_f32(p[i]);
        else
            for (int64_t i = 0; i < n; i++)
                dst[i] = nt__bf16_to_f32(p[i * st]);
        break;
    }
    case NT_F16: {
        const uint16_t *p = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = nt__f16_to_f32(p[i * st]);
        break;
    }
    case NT_I32: {
        const int32_t *p = (const int32_t *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)p[i * st];
        break;
    }
    case NT_U8: {
        const uint8_t *p = (const uint8_t *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)p[i * st];
        break;
    }
    default: break;
    }
}

void nt__st_f32(char *dst, nt_dtype dt, int64_t st, const float *src, int64_t n)
{
    switch (dt) {
    case NT_F32: {
        float *p = (float *)dst;
#ifdef NT_CONVERT_AVX512
        if (st == 1 && n >= 16 && nt__gemm_isa() == NT_ISA_AVX512)
            st_canon_avx512(p, src, n);
        else
#endif
        if (st == 1)
            for (int64_t i = 0; i < n; i++)
                p[i] = nt__canon(src[i]);
        else
            for (int64_t i = 0; i < n; i++)
                p[i * st] = nt__canon(src[i]);
        break;
    }
    case NT_BF16: {
        uint16_t *p = (uint16_t *)dst;
#ifdef NT_CONVERT_AVX512
        if (st == 1 && n >= 16 && nt__gemm_isa() == NT_ISA_AVX512)
            st_bf16_avx512(p, src, n);
        else
#endif
        if (st == 1)
            for (int64_t i = 0; i < n; i++)
                p[i] = nt__f32_to_bf16(src[i]);
        else
            for (int64_t i = 0; i < n; i++)
                p[i * st] = nt__f32_to_bf16(src[i]);
        break;
    }
    case NT_F16: {
        uint16_t *p = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++)
            p[i * st] = nt__f32_to_f16(src[i]);
        break;
    }
    case NT_I32: {
        int32_t *p = (int32_t *)dst;
        for (int64_t i = 0; i < n; i++)
            p[i * st] = nt__f64_to_i32((double)src[i]);
        break;
    }
    case NT_U8: {
        uint8_t *p = (uint8_t *)dst;
        for (int64_t i = 0; i < n; i++)
            p[i * st] = nt__f64_to_u8((double)src[i]);
        break;
    }
    default: break;
    }
}

void nt__ld_i32(int32_t *dst, const char *src, nt_dtype dt, int64_t st, int64_t n)
{
    if (dt == NT_I32) {
        const int32_t *p = (const int32_t *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = p[i * st];
    } else if (dt == NT_U8) {
        const uint8_t *p = (const uint8_t *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = p[i * st];
    } else {
        for (int64_t i = 0; i < n; i++)
            dst[i] = nt__load_i32(src, dt, i * st);
    }
}

void nt__st_i32(char *dst, nt_dtype dt, int64_t st, const int32_t *src, int64_t n)
{
    if (dt == NT_I32) {
        int32_t *p = (int32_t *)dst;
        for (int64_t i = 0; i < n; i++)
            p[i * st] = src[i];
    } else if (dt == NT_U8) {
        uint8_t *p = (uint8_t *)dst;
        for (int64_t i = 0; i < n; i++)
            p[i * st] = (uint8_t)(uint32_t)src[i]; /* wraps */
    } else {
        /* floats round once from the exact integer */
        for (int64_t i = 0; i < n; i++)
            nt__store_i32(dst, dt, i * st, src[i]);
    }
}

void nt__mm_pack(float *dst, int64_t ldd, const char *src, nt_dtype dt, int64_t es, int64_t K,
                 int64_t M, int64_t ks, int64_t ms)
{
    if (ms == 1 || (ks != 1 && ms < ks)) {
        /* m is the faster source dim: a row of dst is a run of src */
        for (int64_t k = 0; k < K; k++)
            nt__ld_f32(dst + k * ldd, src + k * ks * es, dt, ms, M);
        return;
    }
    float tile[32][33];
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
        int64_t mn = M - m0 < 32 ? M - m0 : 32;
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
            int64_t kn = K - k0 < 32 ? K - k0 : 32;
            for (int64_t m = 0; m < mn; m++)
                nt__ld_f32(tile[m], src + ((m0 + m) * ms + k0 * ks) * es, dt, ks, kn);
            for (int64_t k = 0; k < kn; k++)
                for (int64_t m = 0; m < mn; m++)
                    dst[(k0 + k) * ldd + m0 + m] = tile[m][k];
        }
    }
}
