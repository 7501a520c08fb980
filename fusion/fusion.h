/* fusion/fusion.h - the adaptive fusion engine.
 *
 * When a stream worker takes a batch of queued records, the planner walks it
 * in order and grows groups of consecutive records that one kernel can run:
 *
 *   EW   elementwise ops (unary, scalar, binary, compare, where, copy, cast,
 *        fill, backward helpers) over one iteration shape;
 *   ROW  the same plus sum/max/mean over the last dim (keepdim), evaluated a
 *        row at a time: softmax, log_softmax, layer_norm, rms_norm written
 *        as primitive ops become one row kernel;
 *   MM   a matmul followed by elementwise ops over its output (bias,
 *        activation, cast), applied as the accumulator is evacuated.
 *
 * A group compiles once into a program (nt__fprog), cached by a signature
 * of its ops, shapes, dtypes, broadcast pattern and which values it stores.
 * Programs keep every rounding point of the ops they replace: each value
 * carries the dtype its op would have stored, and is rounded to it.  So a
 * fused run gives the same bits as the records one by one (docs/exactness.md, rule 1).
 *
 * A value is stored (written to device memory) only if something outside
 * the group can read it: a live user handle, another handle on its storage
 * (views, tensors saved for backward), or a record outside the group.  Dead
 * intermediates never reach HBM. */
#ifndef NT_FUSION_FUSION_H
#define NT_FUSION_FUSION_H

#include "core/internal.h"

typedef enum nt__fkind { NT_FK_EW = 0, NT_FK_ROW, NT_FK_MM } nt__fkind;

#define NT_F_MAXOPS 64
#define NT_F_MAXVALS 64
#define NT_F_MAXEXT 24
#define NT_F_MAXOUT NT_F_MAXVALS /* every value may be live */

/* An operand: a value of the program (>= 0) or an external input (~k < 0). */
#define NT_F_EXT(k) (-(k)-1)
#define NT_F_IS_EXT(a) ((a) < 0)
#define NT_F_EXT_IDX(a) (-(a)-1)

typedef struct nt__fop {
    uint16_t op;      /* op id from core/optable.h */
    uint8_t nin;
    int8_t a[3];      /* operands */
    int8_t out;       /* the value it defines */
    nt__params p;     /* scalars, dim */
} nt__fop;

typedef struct nt__fval {
    uint8_t dtype;    /* the rounding point: what the op would have stored */
    uint8_t red;      /* ROW: one value per row */
    int8_t store;     /* >= 0: written to output slot `store` */
} nt__fval;

typedef struct nt__fext {
    uint8_t dtype;
    uint8_t red;      /* ROW: an input with one value per row */
    uint16_t bcast;   /* bit i: stretched along iteration dim i */
} nt__fext;

typedef struct nt__fprog {
    nt__fkind kind;
    int nops, nvals, next, nout;
    nt__fop ops[NT_F_MAXOPS];
    nt__fval vals[NT_F_MAXVALS];
    nt__fext ext[NT_F_MAXEXT];
    int8_t out_val[NT_F_MAXOUT]; /* output slot -> value */
    int ndim;                    /* iteration shape (ROW: the full shape) */
    int64_t shape[NT_MAX_DIMS];
    uint8_t *key;                /* the signature: program bytes, below */
    size_t keylen;
    uint64_t hash;
    volatile AO_t runs;
    volatile AO_t refs;          /* the cache's, plus one per running group */
    struct nt__fprog *lru_prev, *lru_next; /* the cache's recency list */
    struct nt__fprog *hnext;     /* the cache's hash chain */
} nt__fprog;

/* A program bound to this batch's tensors. */
typedef struct nt__fgroup {
    nt__fprog *prog;
    nt_tensor *ext[NT_F_MAXEXT];
    nt_tensor *out[NT_F_MAXOUT];
    nt__rec **recs; /* the records it replaces, in order */
    int nrecs;
    uint8_t backend;
} nt__fgroup;

/* Runs a bound group on the CPU (fusion/exec_cpu.c). */
int nt__fused_cpu(const nt__fgroup *g);
/* The simulator's executor of programs (sim/), when present; returns
 * NT_ENOTSUP for a program it cannot run, so the planner falls back. */
extern int (*nt__fused_sim)(const nt__fgroup *g);

/* Set by the stream worker: why the batch it hands over ends here. */
extern _Thread_local const char *nt__batch_end_reason NT_TLS_HOT;

/* The batch entry point, installed as nt__fusion_batch. */
void nt__fusion_run(nt__rec **recs, int n);

/* Counters (also in nt_stats). */
typedef struct nt__fstats {
    volatile AO_t groups, fused_ops, hits, misses, breaks, stored, elided;
    volatile AO_t plan_ns; /* time spent deciding, not running kernels */
} nt__fstats;
extern nt__fstats nt__fst;

/* Whether op `op` can be evaluated inside an EW/ROW program. */
bool nt__fusable_ew(int op);

#endif
