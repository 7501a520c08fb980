/* cpu/rows.h - reading a strided view as rows along one dim, or as one
 * row-major sequence.  Shared by the reductions (cpu/reduce.c, which also
 * defines these functions) and the row ops and losses (cpu/nn.c).
 *
 * A kernel that reduces along dim d of x [..., n, ...] sees "rows": for every
 * index b over the other dims (the batch, in row-major order) the sequence
 * x[b, 0], x[b, 1], ..., x[b, n-1] in index order, which is the order the
 * canonical reductions (core/reduce.h) consume.  How memory is walked is a
 * separate choice: when the batch's innermost dim is more contiguous than
 * dim d (a reduction over dim 0 of a row-major [n, C] tensor, say), w
 * adjacent rows are read together as an f32 [m, w] tile, one contiguous
 * stretch per element position k, and the kernel then reduces each tile
 * column (stride w) in canonical order.  The per-row order, and so the bits,
 * are the same either way. */
#ifndef NT_CPU_ROWS_H
#define NT_CPU_ROWS_H

#include "core/rows.h"
#include "cpu/cpu.h"

/* Rows of t along dim d (the type: core/rows.h).  Output offsets (in
 * elements) are those of a fresh contiguous output shaped like t when same_shape (softmax, norms), else of
 * one shaped like the batch (a reduction: keepdim does not change offsets).
 * A 0-d t is one row of one element. */
void nt__rows_init(nt__rows *R, const nt_tensor *t, int d, bool same_shape);

/* Called per group of w adjacent rows (w = 1 unless R->tile): x points at
 * element 0 of the group's first row; row j of the group starts at
 * x + j * sc elements, and its output offset is oo + j * oc. */
typedef void (*nt__rows_fn)(const nt__rows *R, void *ctx, const char *x, int64_t oo, int64_t w);

/* Calls fn for every group, in batch row-major order, groups of at most
 * wmax rows.  Does nothing when the batch is empty. */
void nt__rows_each(const nt__rows *R, int64_t wmax, nt__rows_fn fn, void *ctx);
/* The groups nt__rows_each walks, numbered in its order: how many, and fn
 * for groups [g0, g1) only.  Groups are independent (each writes its own
 * outputs), so kernels split them into blocks that the calling thread and
 * the pool's helper run (nt__par_blocks): which thread runs a group never
 * changes its bits. */
int64_t nt__rows_groups(const nt__rows *R, int64_t wmax);
void nt__rows_range(const nt__rows *R, int64_t wmax, int64_t g0, int64_t g1, nt__rows_fn fn,
                    void *ctx);
/* Blocks of about NT_ROWS_BLOCK_ELEMS elements (at most NT_ROWS_MAX_BLOCKS,
 * whole groups): returns how many (0 for no groups; 1: not worth a second
 * thread) and sets *per_block, the groups in each (the last may have
 * fewer). */
#define NT_ROWS_BLOCK_ELEMS (32 * 1024)
#define NT_ROWS_MAX_BLOCKS 16
int nt__rows_blocks(const nt__rows *R, int64_t wmax, int64_t *per_block);

/* Elements k0 .. k0+m-1 of the group's w rows into T[k * w + j] (f32,
 * exact widening) or i32. */
void nt__rows_load_f32(const nt__rows *R, const char *x, int64_t k0, int64_t m, int64_t w,
                       float *T);
void nt__rows_load_i32(const nt__rows *R, const char *x, int64_t k0, int64_t m, int64_t w,
                       int32_t *T);

/* Group width for a kernel that holds m rows x w columns: as many columns as
 * fit `budget` floats, at least 1, at most C. */
static inline int64_t nt__rows_width(const nt__rows *R, int64_t m, int64_t budget)
{
    if (!R->tile)
        return 1;
    int64_t w = budget / (m > 0 ? m : 1);
    w = w < 1 ? 1 : w;
    return w < R->C ? w : R->C;
}

/* Row-major reader of a whole view (dims merged where contiguous). */
typedef struct nt__flat {
    nt__kv v;
    int64_t idx[NT_MAX_DIMS];
    int64_t es;
} nt__flat;

void nt__flat_init(nt__flat *F, const nt_tensor *t);
/* The next m elements in row-major order. */
void nt__flat_read_f32(nt__flat *F, float *dst, int64_t m);
void nt__flat_read_i32(nt__flat *F, int32_t *dst, int64_t m);

#endif
