/* fusion/ir.h - the fused-program IR: what the planner (fusion/plan.c)
 * builds and a backend's fused-program executor (core/backend.h) runs.
 *
 * Backends include this header, never the planner's (fusion/fusion.h): it
 * needs only core/.  A program keeps every rounding point of the ops it
 * replaces: each value carries the dtype its op would have stored. */
#ifndef NT_FUSION_IR_H
#define NT_FUSION_IR_H

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

#endif
