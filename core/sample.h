/* core/sample.h - the arithmetic of the random and selection ops of issue 13
 * (nt_dropout, nt_multinomial, nt_topk), shared by the CPU kernels
 * (cpu/sample.c) and the simulator's (neuron/sample.c) so both give
 * the same bits.
 *
 * The random ops use core/rng.h's counter-based generator: element i of a
 * dropout mask and draw i of a multinomial depend only on (seed, i), never
 * on the backend, tiling or mode. */
#ifndef NT_CORE_SAMPLE_H
#define NT_CORE_SAMPLE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/rng.h"

/* A uniform double in [0, 1) with 53 random bits: (h(s, i) >> 11) * 2^-53. */
static inline double nt__rng_u53(uint64_t key, uint64_t i)
{
    return (double)(nt__rng_bits(key, i) >> 11) * 0x1p-53;
}

/* nt_dropout: element i (row-major) is kept iff u53(seed, i) >= p, so it is
 * kept with probability 1 - p (to 2^-53); y = x * m with m = kept ?
 * (float)(1 / (1 - p)) : 0, in f32, as PyTorch's input * noise (so a
 * dropped NaN or Inf gives NaN, a dropped -x gives -0). */
static inline float nt__dropout_scale(double p) { return (float)(1.0 / (1.0 - p)); }
static inline float nt__dropout_mul(uint64_t key, uint64_t i, double p, float scale)
{
    return nt__rng_u53(key, i) >= p ? scale : 0.0f;
}

/* nt_topk's order: whether (va, ia) comes before (vb, ib), the values
 * widened exactly to double (every dtype's values are exact there).
 * largest: NaN first, then descending; smallest: ascending, NaN last (NaN is
 * above every number, as in PyTorch's sort); equal values (+0 and -0, two
 * NaNs) by index, the lower first.  A strict total order, so the k first
 * elements are one set in one order, whatever algorithm finds them. */
static inline bool nt__topk_before(double va, int64_t ia, double vb, int64_t ib, bool largest)
{
    bool na = va != va, nb = vb != vb;
    if (na || nb) {
        if (na && nb)
            return ia < ib;
        return largest ? na : nb;
    }
    if (va == vb)
        return ia < ib;
    return largest ? va > vb : va < vb;
}

/* nt_multinomial: draw j of row r (flat index r * n + j) picks the first
 * category c whose running sum cum_c = p_0 + ... + p_c (double, added in
 * index order) exceeds t = u53(seed, r * n + j) * total, total = cum_{C-1};
 * if rounding leaves none (t == total), the last category with p_c > 0.
 * A category with p_c = 0 has cum_c = cum_{c-1}, so it is never the first
 * to exceed t. */
static inline double nt__multinomial_target(uint64_t key, uint64_t i, double total)
{
    return nt__rng_u53(key, i) * total;
}

/* The first bad probability's message, or "" (and the row sum checked
 * after the row's elements): the CPU and the simulator report the first
 * bad row's first problem in the same words.  nd: probs' dims (1 or 2). */
static inline bool nt__multinomial_bad(double v) { return !(v >= 0.0) || v == INFINITY; }
static inline void nt__multinomial_msg(char *m, size_t len, int nd, int64_t r, int64_t c, double v,
                                       bool zero_sum)
{
    if (zero_sum && nd == 1)
        snprintf(m, len, "probs sums to 0; expected a positive sum");
    else if (zero_sum)
        snprintf(m, len, "row %lld of probs sums to 0; expected a positive sum", (long long)r);
    else if (nd == 1)
        snprintf(m, len, "probs[%lld] = %g; expected finite probabilities >= 0", (long long)c, v);
    else
        snprintf(m, len, "probs[%lld, %lld] = %g; expected finite probabilities >= 0",
                 (long long)r, (long long)c, v);
}

#endif
