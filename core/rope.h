/* core/rope.h - the one arithmetic of rotary position embedding (op ROPE,
 * docs/ops.md "Rotary position embedding"), shared by the CPU kernel
 * (cpu/rope.c) and the simulator's (neuron/rope.c, whose GpSimd operator
 * makes the same table), so both give the same bits.
 *
 * For position pos (an integer, 0 <= pos < 2^24, so exact in f32) and pair
 * i (0 <= i < dims / 2):
 *   inv_i = (float)pow(base, -(2i) / dims)     in double, rounded once
 *   p     = (float)pos * (float)scale           f32, rounded
 *   theta = p * inv_i                           f32, rounded
 *   c = nt__cosf(theta), s = nt__sinf(theta)    core/nmath.h: exact
 *                                               argument reduction
 * (s negated for the inverse rotation, the backward), and a pair (x1, x2)
 * becomes y1 = x1*c - x2*s, y2 = x2*c + x1*s: two rounded products and a
 * rounded sum (-ffp-contract=off), in f32, each y rounded once to the
 * output dtype. */
#ifndef NT_CORE_ROPE_H
#define NT_CORE_ROPE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/nmath.h"

/* Positions past this are not exact in f32. */
#define NT__ROPE_MAXPOS ((int64_t)1 << 24)

/* The op's parameters (nt__params): p.i[0] = dims, p.i[1] = the offset when
 * no offset tensor is given, p.f[0] = base, p.f[1] = scale, p.flag bits: */
enum { NT__ROPE_INTERLEAVED = 1, NT__ROPE_INVERSE = 2 };

static inline float nt__rope_inv_freq(int64_t i, int64_t dims, double base)
{
    return (float)pow(base, -(double)(2 * i) / (double)dims);
}

/* Rows t0 .. t0+n-1 of the cos/sin table at positions off + t: row r is
 * [c_0 .. c_(h-1), s_0 .. s_(h-1)] at cs + r * 2h, h = dims / 2. */
static inline void nt__rope_table(float *cs, int64_t off, int64_t t0, int64_t n, int64_t dims,
                                  double base, double scale, bool inverse)
{
    int64_t h = dims / 2;
    float sc = (float)scale;
    for (int64_t r = 0; r < n; r++) {
        float p = (float)(off + t0 + r) * sc;
        float *row = cs + r * 2 * h;
        for (int64_t i = 0; i < h; i++) {
            float th = p * nt__rope_inv_freq(i, dims, base);
            float s = nt__sinf(th);
            row[i] = nt__cosf(th);
            row[h + i] = inverse ? -s : s;
        }
    }
}

/* Whether positions off .. off+T-1 are valid; else a message into msg. */
static inline bool nt__rope_pos_ok(int64_t off, int64_t T, char *msg, size_t n)
{
    if (off >= 0 && off <= NT__ROPE_MAXPOS - T)
        return true;
    snprintf(msg, n,
             "the offset tensor holds %lld; expected 0 <= offset and offset + T "
             "(T = %lld) <= 2^24, the positions exact in f32",
             (long long)off, (long long)T);
    return false;
}

#endif
