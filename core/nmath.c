/* core/nmath.c - out-of-line parts of core/nmath.h: powf and the array forms.
 *
 * The array forms work through a 64-float block on the stack: a loop with a
 * fixed count of 64 over a local array has no aliasing question (y == x is
 * fine) and no epilogue, so GCC vectorises it even with its -O2 cost model.
 * The tail of a call is padded with zeros and goes through the same loop, so
 * every element is computed by the same vector code, and that code performs
 * the same IEEE operations as the scalar inline function: bit-identical. */
#include "core/nmath.h"

float nt__powf(float x, float y) { return powf(x, y); }

#define NT__BLOCK 64

/* The binary targets generic x86-64 (SSE2), where the array forms run at
 * ~1.3 ns/element.  On CPUs with AVX2 / AVX-512 the loader picks a clone of
 * the same C compiled for those (ifunc): 2-4x faster.  The clones perform
 * the same IEEE operations (no FMA: -ffp-contract=off, and neither target
 * enables it) so every clone gives the same bits as the scalar functions. */
/* Not under ThreadSanitizer: ifunc resolvers run during relocation, before
 * TSan's runtime is up, and an instrumented resolver crashes there. */
#if defined(__x86_64__) && defined(__has_attribute) && !defined(NT_NMATH_NO_CLONES) && \
    !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define NT__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef NT__CLONES
#define NT__CLONES
#endif

#define NT__ARRAY_FORM(name, fn)                                              \
    NT__CLONES void name(float *y, const float *x, long n)                    \
    {                                                                         \
        float t[NT__BLOCK];                                                   \
        for (; n >= NT__BLOCK; n -= NT__BLOCK, x += NT__BLOCK, y += NT__BLOCK) { \
            for (int i = 0; i < NT__BLOCK; i++)                               \
                t[i] = fn(x[i]);                                              \
            memcpy(y, t, sizeof t);                                           \
        }                                                                     \
        if (n > 0) {                                                          \
            memcpy(t, x, (size_t)n * sizeof *t);                              \
            memset(t + n, 0, (size_t)(NT__BLOCK - n) * sizeof *t);            \
            for (int i = 0; i < NT__BLOCK; i++)                               \
                t[i] = fn(t[i]);                                              \
            memcpy(y, t, (size_t)n * sizeof *t);                              \
        }                                                                     \
    }

NT__ARRAY_FORM(nt__expf_n, nt__expf)
NT__ARRAY_FORM(nt__logf_n, nt__logf)
NT__ARRAY_FORM(nt__tanhf_n, nt__tanhf)
NT__ARRAY_FORM(nt__erff_n, nt__erff)
