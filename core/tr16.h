/* core/tr16.h - a 16 x 16 block of 32-bit elements transposed in AVX-512
 * registers (v[r] element e becomes v[e] element r), in four shuffle
 * stages: pairs of rows interleaved per 128-bit lane, then pairs of
 * pairs, then the 4 x 4 lanes.  Data movement only, so it serves floats
 * (core/gemm.c's panels from rows) and bf16 pairs (core/gemm_dpbf16.c's)
 * alike.  Include it where <immintrin.h> is and the caller's target has
 * AVX-512F. */
#ifndef NT_CORE_TR16_H
#define NT_CORE_TR16_H

#include <immintrin.h>

__attribute__((target("avx512f"), always_inline)) static inline void nt__tr16(__m512i *v)
{
    __m512i a[16], b[16];
    for (int i = 0; i < 16; i += 2) { /* 32-bit pairs of rows, per 128-bit lane */
        a[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        a[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) { /* b[g + j]: rows g..g+3, element j + 4 * lane */
        b[g] = _mm512_unpacklo_epi64(a[g], a[g + 2]);
        b[g + 1] = _mm512_unpackhi_epi64(a[g], a[g + 2]);
        b[g + 2] = _mm512_unpacklo_epi64(a[g + 1], a[g + 3]);
        b[g + 3] = _mm512_unpackhi_epi64(a[g + 1], a[g + 3]);
    }
    for (int j = 0; j < 4; j++) { /* the 4 x 4 lanes of b[j], b[4 + j], b[8 + j], b[12 + j] */
        __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x44);
        __m512i c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xee);
        __m512i c2 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x44);
        __m512i c3 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xee);
        v[j] = _mm512_shuffle_i32x4(c0, c2, 0x88);
        v[j + 4] = _mm512_shuffle_i32x4(c0, c2, 0xdd);
        v[j + 8] = _mm512_shuffle_i32x4(c1, c3, 0x88);
        v[j + 12] = _mm512_shuffle_i32x4(c1, c3, 0xdd);
    }
}

#endif
