/* core/rng.h - the counter-based generators of nt_rand and nt_randn.
 *
 * Element i (row-major index) of a random tensor depends only on (seed, i),
 * never on the backend, the thread count, tiling or fusion: every path (the
 * CPU kernel, the simulator's kernel, a fused kernel) calls these functions,
 * so the same seed gives the same bits everywhere.
 *
 * The bits: h(s, i) is output number i of a splitmix64 generator whose state
 * starts at a mix of the seed, i.e. the splitmix64 finaliser applied to
 * key(s) + (i + 1) * golden, with key(s) = finaliser(s ^ NT__RNG_SALT).  The
 * seed is mixed first so that nearby seeds (1, 2, 3 ...) start far apart on
 * the Weyl sequence instead of overlapping with a shift.
 *
 * rand: a dtype with p significand bits (f32 24, bf16 8, f16 11, f64 53)
 *   gets (h >> (64 - p)) * 2^-p, a multiple of 2^-p in [0, 1 - 2^-p]:
 *   exactly representable, so storing it rounds nothing and every value is
 *   equally likely.
 * randn: Box-Muller in double from two draws per element,
 *   u1 = ((h(s, 2i) >> 11) + 1) * 2^-53 in (0, 1]   (never 0: log is finite)
 *   u2 = (h(s, 2i + 1) >> 11) * 2^-53 in [0, 1)
 *   z  = sqrt(-2 log u1) * cos(2 pi u2), rounded once to the dtype.
 *   (The library's double log/cos/sqrt: one implementation on every path;
 *   built with -ffp-contract=off, so no path fuses the products.) */
#ifndef NT_CORE_RNG_H
#define NT_CORE_RNG_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ntensor.h"

#define NT__RNG_GOLDEN UINT64_C(0x9e3779b97f4a7c15)
#define NT__RNG_SALT UINT64_C(0x6e74656e736f7221) /* "ntensor!" */

/* splitmix64's output function (Steele, Lea, Flood 2014). */
static inline uint64_t nt__rng_fmix(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* The stream's starting state for a seed (hoist it out of element loops). */
static inline uint64_t nt__rng_key(uint64_t seed) { return nt__rng_fmix(seed ^ NT__RNG_SALT); }

/* h(s, i) given key = nt__rng_key(s). */
static inline uint64_t nt__rng_bits(uint64_t key, uint64_t i)
{
    return nt__rng_fmix(key + (i + 1) * NT__RNG_GOLDEN);
}

/* Significand bits of a floating dtype (0 for integer dtypes); f64's 53
 * are drawn by nt__rng_uniform64. */
static inline int nt__rng_pbits(nt_dtype dt)
{
    return dt == NT_F32 ? 24 : dt == NT_F64 ? 53 : dt == NT_BF16 ? 8 : dt == NT_F16 ? 11 : 0;
}

/* f64 rand element i: (h >> 11) * 2^-53, a multiple of 2^-53 in [0, 1)
 * (PyTorch's double uniform also takes 53 random bits). */
static inline double nt__rng_uniform64(uint64_t key, uint64_t i)
{
    return (double)(nt__rng_bits(key, i) >> 11) * 0x1p-53;
}

/* rand element i: a multiple of 2^-p in [0, 1), exact in f32 and in the
 * dtype with p significand bits. */
static inline float nt__rng_uniform(uint64_t key, uint64_t i, int p)
{
    uint32_t sb = (uint32_t)(127 - p) << 23; /* the f32 2^-p, built without libm */
    float scale;
    memcpy(&scale, &sb, sizeof scale);
    return (float)(nt__rng_bits(key, i) >> (64 - p)) * scale;
}

/* randn element i, in double (the caller rounds it once to the dtype). */
static inline double nt__rng_normal(uint64_t key, uint64_t i)
{
    double u1 = (double)((nt__rng_bits(key, 2 * i) >> 11) + 1) * 0x1p-53;
    double u2 = (double)(nt__rng_bits(key, 2 * i + 1) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

#endif
