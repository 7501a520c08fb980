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
#include <cpuid.h>
#include <immintrin.h>

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

__attribute__((target(NT_TARGET_AVX512))) static void ld_bf16_avx512(float *dst, const uint16_t *p,
                                                                     int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = nt__bf16_to_f32(p[i]);
}

/* y rounded through bf16 and widened back (the fused evaluator's rounding
 * of every bf16 value): nt__f32_to_bf16's integer steps, written out
 * because out is often y, and an auto-vectorised loop checks for overlap
 * and then runs scalar */
static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) __m512
settle_bf16x16(__m512 f)
{
    __m512i u = _mm512_castps_si512(f);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32((int)NT__QNAN_F32)));
}

__attribute__((target(NT_TARGET_AVX512))) static void settle_bf16_avx512(float *out, const float *y,
                                                                         int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, settle_bf16x16(_mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(out + i, m, settle_bf16x16(_mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* f16 <-> f32 with the hardware's conversions (AVX-512F's 512-bit forms,
 * F16C's 256-bit ones at the AVX2 level), which are exact both ways for
 * every non-NaN value: widening is exact, and vcvtps2ph with the
 * round-to-nearest-even immediate rounds as nt__f32_to_f16 does, f16
 * subnormals and overflow to Inf included (tests/test_dtype.c checks the
 * scalar rule against F16C over all 2^32 patterns).  They differ only on
 * NaNs: vcvtph2ps quiets a signalling NaN, where nt__f16_to_f32 keeps the
 * payload bits as they are, and vcvtps2ph keeps sign and payload, where a
 * narrowing makes every NaN the canonical one.  So lanes with an all-ones
 * exponent take the integer rule's bits.  (f16 is 3x bf16's wall in
 * bench/amp through these conversions, element by element.)  Neither
 * depends on MXCSR: DAZ only zeroes f32 subnormal inputs of vcvtps2ph,
 * which round to a signed zero in f16 either way. */
#define NT_F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) __m512
f16x16_to_f32(__m256i h)
{
    __m512 f = _mm512_cvtph_ps(h);
    __m512i w = _mm512_cvtepu16_epi32(h);
    const __m512i em = _mm512_set1_epi32(0x7c00);
    __mmask16 spec = _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, em), em); /* Inf, NaN */
    __m512i bits = _mm512_or_si512(
        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16),
                        _mm512_set1_epi32(0x7f800000)),
        _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x3ff)), 13));
    return _mm512_mask_mov_ps(f, spec, _mm512_castsi512_ps(bits));
}

static inline __attribute__((always_inline, target(NT_TARGET_AVX512))) __m256i
f32x16_to_f16(__m512 f)
{
    __m256i h = _mm512_cvtps_ph(f, NT_F16_RNE);
    __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    return _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16((short)NT__QNAN_F16));
}

__attribute__((target(NT_TARGET_AVX512))) static void ld_f16_avx512(float *dst, const uint16_t *p,
                                                                    int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, f16x16_to_f32(_mm256_loadu_si256((const __m256i *)(p + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, f16x16_to_f32(_mm256_maskz_loadu_epi16(m, p + i)));
    }
}

__attribute__((target(NT_TARGET_AVX512))) static void st_f16_avx512(uint16_t *p, const float *src,
                                                                    int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(p + i), f32x16_to_f16(_mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm256_mask_storeu_epi16(p + i, m, f32x16_to_f16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

/* y rounded through f16 and widened back, as storing and loading it would */
__attribute__((target(NT_TARGET_AVX512))) static void settle_f16_avx512(float *out, const float *y,
                                                                        int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, f16x16_to_f32(f32x16_to_f16(_mm512_loadu_ps(y + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(out + i, m,
                              f16x16_to_f32(f32x16_to_f16(_mm512_maskz_loadu_ps(m, y + i))));
    }
}

/* The AVX2 level: F16C, 8 lanes, the same NaN fix-up with AVX2 selects;
 * the tail (< 8) takes the scalar rule. */
#define NT_TARGET_F16C "avx2,fma,f16c"

static inline __attribute__((always_inline, target(NT_TARGET_F16C))) __m256
f16x8_to_f32(__m128i h)
{
    __m256 f = _mm256_cvtph_ps(h);
    __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i em = _mm256_set1_epi32(0x7c00);
    __m256i spec = _mm256_cmpeq_epi32(_mm256_and_si256(w, em), em);
    __m256i bits = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                        _mm256_set1_epi32(0x7f800000)),
        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3ff)), 13));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(spec));
}

static inline __attribute__((always_inline, target(NT_TARGET_F16C))) __m128i
f32x8_to_f16(__m256 f)
{
    __m128i h = _mm256_cvtps_ph(f, NT_F16_RNE);
    __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    /* the 32-bit masks packed to 16 (saturation keeps 0 and -1) */
    __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    return _mm_blendv_epi8(h, _mm_set1_epi16((short)NT__QNAN_F16), nan);
}

__attribute__((target(NT_TARGET_F16C))) static int64_t ld_f16_f16c(float *dst, const uint16_t *p,
                                                                   int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, f16x8_to_f32(_mm_loadu_si128((const __m128i *)(p + i))));
    return i;
}

__attribute__((target(NT_TARGET_F16C))) static int64_t st_f16_f16c(uint16_t *p, const float *src,
                                                                   int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(p + i), f32x8_to_f16(_mm256_loadu_ps(src + i)));
    return i;
}

__attribute__((target(NT_TARGET_F16C))) static int64_t settle_f16_f16c(float *out, const float *y,
                                                                       int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, f16x8_to_f32(f32x8_to_f16(_mm256_loadu_ps(y + i))));
    return i;
}

/* The level the f16 conversions use: the matmul's (NT_CPU_ISA), with the
 * AVX2 level only on a CPU that also has F16C (every one known does). */
static int f16_isa(void)
{
    int isa = nt__gemm_isa();
    if (isa == NT_ISA_AVX2) {
        static int f16c = -1; /* racing first calls store the same value */
        int h = __atomic_load_n(&f16c, __ATOMIC_RELAXED);
        if (h < 0) {
            /* CPUID.1:ECX bit 29; __builtin_cpu_supports("f16c") is gcc's
             * only (clang 14, the libFuzzer build's, rejects the name) */
            unsigned a, b, c, d;
            h = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1) ? 1 : 0;
            __atomic_store_n(&f16c, h, __ATOMIC_RELAXED);
        }
        if (!h)
            isa = NT_ISA_SCALAR;
    }
    return isa;
}

/* n unit-stride f16 elements widened into dst at the vector level; returns
 * how many (the rest is the caller's scalar loop) */
static int64_t ld_f16_vec(float *dst, const uint16_t *p, int64_t n)
{
    switch (f16_isa()) {
    case NT_ISA_AVX512: ld_f16_avx512(dst, p, n); return n;
    case NT_ISA_AVX2: return ld_f16_f16c(dst, p, n);
    default: return 0;
    }
}

static int64_t st_f16_vec(uint16_t *p, const float *src, int64_t n)
{
    switch (f16_isa()) {
    case NT_ISA_AVX512: st_f16_avx512(p, src, n); return n;
    case NT_ISA_AVX2: return st_f16_f16c(p, src, n);
    default: return 0;
    }
}

static int64_t settle_f16_vec(float *out, const float *y, int64_t n)
{
    switch (f16_isa()) {
    case NT_ISA_AVX512: settle_f16_avx512(out, y, n); return n;
    case NT_ISA_AVX2: return settle_f16_f16c(out, y, n);
    default: return 0;
    }
}
#else
static int64_t ld_f16_vec(float *dst, const uint16_t *p, int64_t n)
{
    (void)dst, (void)p, (void)n;
    return 0;
}

static int64_t st_f16_vec(uint16_t *p, const float *src, int64_t n)
{
    (void)p, (void)src, (void)n;
    return 0;
}

static int64_t settle_f16_vec(float *out, const float *y, int64_t n)
{
    (void)out, (void)y, (void)n;
    return 0;
}
#endif

/* Strided f16 goes through a small unit-stride buffer: gathering the 16-bit
 * patterns costs a move each, the per-element decode it saves much more. */
enum { F16_CHUNK = 256 };

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
#ifdef NT_CONVERT_AVX512
        if (st == 1 && n >= 16 && nt__gemm_isa() == NT_ISA_AVX512)
            ld_bf16_avx512(dst, p, n);
        else
#endif
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
        int64_t i = 0;
        if (st == 1) {
            i = ld_f16_vec(dst, p, n);
        } else if (n >= 8) {
            uint16_t buf[F16_CHUNK];
            for (int64_t c; i < n; i += c) {
                c = n - i < F16_CHUNK ? n - i : F16_CHUNK;
                for (int64_t j = 0; j < c; j++)
                    buf[j] = p[(i + j) * st];
                for (int64_t j = ld_f16_vec(dst + i, buf, c); j < c; j++)
                    dst[i + j] = nt__f16_to_f32(buf[j]);
            }
        }
        for (; i < n; i++)
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
    case NT_F64: { /* rounds to nearest even (an f64 op never takes this path: it
                    * computes in double, cpu/ewise.c) */
        const double *p = (const double *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)p[i * st];
        break;
    }
    case NT_I64:
    case NT_BOOL:
    case NT_E4M3:
    case NT_E5M2:
        for (int64_t i = 0; i < n; i++)
            dst[i] = nt__load_f32(src, dt, i * st);
        break;
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
        int64_t i = 0;
        if (st == 1) {
            i = st_f16_vec(p, src, n);
        } else if (n >= 8) {
            uint16_t buf[F16_CHUNK];
            for (int64_t c; i < n; i += c) {
                c = n - i < F16_CHUNK ? n - i : F16_CHUNK;
                for (int64_t j = st_f16_vec(buf, src + i, c); j < c; j++)
                    buf[j] = nt__f32_to_f16(src[i + j]);
                for (int64_t j = 0; j < c; j++)
                    p[(i + j) * st] = buf[j];
            }
        }
        for (; i < n; i++)
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
    case NT_F64: {
        double *p = (double *)dst;
        for (int64_t i = 0; i < n; i++)
            p[i * st] = nt__canon64((double)src[i]);
        break;
    }
    case NT_I64:
    case NT_BOOL:
    case NT_E4M3:
    case NT_E5M2:
        for (int64_t i = 0; i < n; i++)
            nt__store_f32(dst, dt, i * st, src[i]);
        break;
    default: break;
    }
}

void nt__settle_f32(float *out, nt_dtype dt, const float *y, int64_t n)
{
    switch (dt) {
    case NT_F32:
#ifdef NT_CONVERT_AVX512
        if (n >= 16 && nt__gemm_isa() == NT_ISA_AVX512) {
            st_canon_avx512(out, y, n);
            break;
        }
#endif
        for (int64_t i = 0; i < n; i++)
            out[i] = nt__canon(y[i]);
        break;
    case NT_BF16:
#ifdef NT_CONVERT_AVX512
        if (n >= 16 && nt__gemm_isa() == NT_ISA_AVX512) {
            settle_bf16_avx512(out, y, n);
            break;
        }
#endif
        for (int64_t i = 0; i < n; i++)
            out[i] = nt__bf16_to_f32(nt__f32_to_bf16(y[i]));
        break;
    case NT_F16:
        for (int64_t i = settle_f16_vec(out, y, n); i < n; i++)
            out[i] = nt__f16_to_f32(nt__f32_to_f16(y[i]));
        break;
    case NT_F64: /* exact: only the NaN is made canonical */
        for (int64_t i = 0; i < n; i++)
            out[i] = nt__canon(y[i]);
        break;
    case NT_E4M3:
        for (int64_t i = 0; i < n; i++)
            out[i] = nt__e4m3_to_f32(nt__f32_to_e4m3(y[i]));
        break;
    case NT_E5M2:
        for (int64_t i = 0; i < n; i++)
            out[i] = nt__canon(nt__e5m2_to_f32(nt__f32_to_e5m2(y[i])));
        break;
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
