/* core/moe.h - the all_to_all gather index of mixture-of-experts dispatch
 * (core/optable.h: all_to_all_index; docs/parallel.md), shared by the
 * backends. */
#ifndef NT_CORE_MOE_H
#define NT_CORE_MOE_H

#include <stdint.h>
#include <stdio.h>

#include "ntensor.h"

/* The all_to_all gather index of rank j = p.i[0] (core/optable.h): for
 * every source i in rank order, C[i][j] rows from i's block for j, which
 * starts at the sum of C[i][0..j); then P * R (the zero row) up to cap.
 * The CPU kernel (cpu/moe.c) and the simulator's GpSimd code
 * (neuron/moe.c) both run this; NT_ERANGE and *why on bad counts. */
static inline int nt__a2a_index(const int32_t *C, int64_t P, int64_t j, int64_t R, int32_t *idx, int64_t cap,
                  char *why, size_t nwhy)
{
    int64_t n = 0;
    for (int64_t i = 0; i < P; i++) {
        int64_t off = 0, sum = 0;
        for (int64_t d = 0; d < P; d++) {
            if (C[i * P + d] < 0) {
                snprintf(why, nwhy, "rank %lld's send count to rank %lld is %d (negative)",
                         (long long)i, (long long)d, C[i * P + d]);
                return NT_ERANGE;
            }
            off += d < j ? C[i * P + d] : 0;
            sum += C[i * P + d];
        }
        if (sum > R) {
            snprintf(why, nwhy, "rank %lld's send counts add up to %lld rows; its input has %lld",
                     (long long)i, (long long)sum, (long long)R);
            return NT_ERANGE;
        }
        if (n + C[i * P + j] > cap) {
            int64_t all = n;
            for (int64_t s = i; s < P; s++)
                all += C[s * P + j];
            snprintf(why, nwhy, "rank %lld receives %lld rows; the capacity is %lld", (long long)j,
                     (long long)all, (long long)cap);
            return NT_ERANGE;
        }
        for (int64_t r = 0; r < C[i * P + j]; r++)
            idx[n++] = (int32_t)(i * R + off + r);
    }
    while (n < cap)
        idx[n++] = (int32_t)(P * R);
    return 0;
}

#endif
