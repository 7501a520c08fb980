/* core/reduce.h - the one reduction order (docs/exactness.md, rule 3).
 *
 * A reduction of n elements x[0], x[1], ... (a row, a column, or a flattened
 * tensor, always in index order) is computed as:
 *   - blocks of NT_RED_BLOCK consecutive elements, in ascending order, each
 *     reduced to a partial; the partials are combined sequentially:
 *     acc = identity; acc = op(acc, partial_0); acc = op(acc, partial_1); ...
 *   - inside a block, NT_RED_LANES lanes: lane l starts at the identity and
 *     takes elements l, l + 16, l + 32, ... in order; the lanes are then
 *     folded in halves: lane[i] = op(lane[i], lane[i + 8]) for i < 8, then
 *     i + 4, i + 2, i + 1; lane[0] is the block's partial.
 * The order depends only on n, never on threads, tiling or fusion.  A
 * simulator kernel that tiles a row in NT_RED_BLOCK-element tiles and adds
 * the tile partials in order gets the same bits as the CPU.
 * Sums accumulate in f32 (identity +0.0); max uses nt__ew_maximum (identity
 * -Inf, NaN propagates); min uses nt__ew_minimum (identity +Inf, likewise). */
#ifndef NT_CORE_REDUCE_H
#define NT_CORE_REDUCE_H

#include <stdint.h>

#define NT_RED_LANES 16
#define NT_RED_BLOCK 2048

/* Canonical reductions of x[0], x[stride], ..., x[(n-1)*stride]. */
float nt__red_sum_f32(const float *x, int64_t n, int64_t stride);
float nt__red_max_f32(const float *x, int64_t n, int64_t stride);
float nt__red_min_f32(const float *x, int64_t n, int64_t stride);
/* One block's partial (n <= NT_RED_BLOCK): the lane/fold part only. */
float nt__red_block_sum_f32(const float *x, int64_t n, int64_t stride);
float nt__red_block_max_f32(const float *x, int64_t n, int64_t stride);
float nt__red_block_min_f32(const float *x, int64_t n, int64_t stride);
/* Integer sum (wrapping), sequential: exact, so order cannot matter. */
int32_t nt__red_sum_i32(const int32_t *x, int64_t n, int64_t stride);

/* How a reduction op computes (cpu/reduce.c's header says it in words; the
 * simulator's kernel follows the same plan): an optional map of each
 * element widened to f32 (pre), the canonical fold (rop), and an optional
 * finish of the f32 result (fin).  ord is p.f[0] of nt_norm.  Returns 0,
 * or -1 for an op that is not a reduction. */
enum { NT_RED_SUM, NT_RED_MAX, NT_RED_MIN, NT_RED_ARGMAX, NT_RED_ARGMIN };
enum { NT_RED_PRE_NONE, NT_RED_PRE_NZ, NT_RED_PRE_SQ, NT_RED_PRE_ABS, NT_RED_PRE_POW };
enum { NT_RED_FIN_NONE, NT_RED_FIN_MEAN, NT_RED_FIN_SQRT, NT_RED_FIN_POW };
int nt__red_plan(int op, double ord, int *rop, int *pre, int *fin);

#endif
