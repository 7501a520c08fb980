/* core/rows.h - the geometry of a strided view read as rows along one dim:
 * for every index b over the other dims (the batch, in row-major order) the
 * sequence x[b, 0 .. n-1], the order the canonical reductions (core/reduce.h)
 * consume.  The CPU's row kernels (cpu/rows.h) and the simulator's
 * (neuron/) walk the same rows, so both backends share this. */
#ifndef NT_CORE_ROWS_H
#define NT_CORE_ROWS_H

#include "core/internal.h"

typedef struct nt__rows {
    const char *x;        /* input data at the view's offset */
    nt_dtype dt;
    int64_t es;           /* input element size */
    int64_t n, sn, on;    /* row length; input and output strides along it */
    int64_t C, sc, oc;    /* the batch's innermost dim: size, input/output stride */
    int nouter;           /* the other batch dims */
    int64_t oshape[NT_MAX_DIMS], osi[NT_MAX_DIMS], oso[NT_MAX_DIMS];
    bool tile;            /* read adjacent rows as [m, w] tiles */
} nt__rows;

/* The geometry alone (n, strides, batch dims; no data pointer, dtype or
 * tiling) of t's rows along dim d: what the simulator's row kernels walk
 * with DMAs, and what nt__rows_init (cpu/rows.h) starts from. */
void nt__rows_shape(nt__rows *R, const nt_tensor *t, int d, bool same_shape);

#endif
