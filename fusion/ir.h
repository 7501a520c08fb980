/* fusion/ir.h - the fused-program IR: what the planner (fusion/plan.c)
 * builds and a backend's fused-program executor (core/backend.h) runs.
 *
 * Backends include this header, never the planner's (fusion/fusion.h): it
 * needs only core/.  A program keeps every rounding point of the ops it
 * replaces: each value carries the dtype its op would have stored. */
#ifndef NT_FUSION_IR_H
#define NT_FUSION_IR_H

#include "core/internal.h"

/* NT_FK_NORM: ops[0] is a layer_norm whose operands x, w, b are external
 * inputs and whose value (f32, x's shape, the iteration shape) is the row
 * kernel's output; ops[1] is a cast of that value (NT_OP_CAST, not
 * stochastic) to bf16 or f16 over the same shape, the norm's output
 * rounded element for element as the cast record would: autocast's cast of
 * a layer norm's output for the next matmul, written by the norm's kernel.
 * The norm's value is stored only when something else reads it. */
/* NT_FK_BN: training batch norm and the relu beside it, in one pass over
 * the activations each way (cpu/bn.c); the iteration shape is x's, every
 * operand f32 and contiguous, the norm's w and b given.  An op of kind
 * batch_norm_fwd / _bwd defines two values: its first output (value
 * ops[k].out) and its second (value ops[k].out + 1).
 *   forward   ops[0] batch_norm_fwd(x, w, b) (external inputs): value 0 y,
 *             value 1 the stats [2, C]; ops[1] relu(value 0): value 2.
 *   backward  ops[0] relu_bwd(g, y) (external: the gradient and relu's
 *             output): value 0; ops[1] batch_norm_bwd(value 0, x, stats,
 *             w): value 1 dx, value 2 [dw; db].
 * The forward's y and the backward's relu_bwd value are stored only when
 * something else reads them (the CNN's conv-BN-ReLU: neither). */
typedef enum nt__fkind { NT_FK_EW = 0, NT_FK_ROW, NT_FK_MM, NT_FK_NORM, NT_FK_BN } nt__fkind;

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
    int8_t a[NT__MAX_IN]; /* operands (batch_norm_bwd has four) */
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

/* Side ops riding on a matmul.  In an NT_FK_MM program an op ops[k], k >= 1,
 * that reads the matmul's first operand A (its a[0] is ops[0].a[0]) and
 * whose value leaves the kernel, never read by another op of the program,
 * is a "side op"; the planner puts at most one of each kind in a program:
 *   - NT_OP_SUM, a "side sum": A summed over all its rows -- every dim but
 *     the last, as one sum over the flattened rows in the order of
 *     core/reduce.h, the sum its record computes over dim 0 of A seen as
 *     [rows, K] -- into a value of K elements, each element of A widened
 *     to f32, the f32 sums rounded once to the value's dtype (the sum op's
 *     arithmetic).  The linear layer's bias gradient beside dX = dY . W;
 *     only for an f32, bf16 or f16 A laid out row-major, into f32, bf16 or
 *     f16 (under bf16 autocast dY and its sum are bf16).
 *   - NT_OP_MATMUL, a "side product": W [K, NX] = A^T . X, A seen as
 *     [rows, K] (its record's first operand is that view transposed,
 *     nt__fside_at), X (a[1], an external input) [rows, NX] row-major, in
 *     A's dtype, W in its record's output dtype: the linear layer's weight
 *     gradient beside dX = dY . W.
 * A backend can take both from the tiles of A it loads for the product,
 * reading dY once; run alone, each is its record's kernel. */
static inline bool nt__fop_is_side(const nt__fprog *p, int k)
{
    return p->kind == NT_FK_MM && k > 0 &&
           (p->ops[k].op == NT_OP_SUM || p->ops[k].op == NT_OP_MATMUL);
}

/* The record op o of group g stands for, as its own kernel would see it:
 * o's inputs from the group's external tensors and one output, out (NULL
 * for none).  The head of a matmul or a norm group runs its own kernel on
 * it (cpu/fused.c, neuron/rows.c). */
static inline void nt__fop_rec(nt__rec *r, const nt__fgroup *g, const nt__fop *o, nt_tensor *out)
{
    memset(r, 0, sizeof *r);
    r->op = o->op;
    r->nin = o->nin;
    r->nout = 1;
    r->p = o->p;
    for (int i = 0; i < o->nin; i++)
        r->in[i] = g->ext[NT_F_EXT_IDX(o->a[i])];
    r->out[0] = out;
}

/* An NT_FK_BN program's batch norm op (*bo) and relu or relu_bwd (*ro);
 * true for the forward form. */
static inline bool nt__fbn_ops(const nt__fprog *p, const nt__fop **bo, const nt__fop **ro)
{
    bool fwd = p->ops[0].op == NT_OP_BN_FWD;
    *bo = &p->ops[fwd ? 0 : 1], *ro = &p->ops[fwd ? 1 : 0];
    return fwd;
}

/* The batch norm record an NT_FK_BN group g stands for, its outputs o0
 * and o1 (NULL: not stored); in the backward form its gradient (in[0]) is
 * the relu_bwd's g, the gradient before the mask. */
static inline void nt__fbn_rec(nt__rec *r, const nt__fgroup *g, nt_tensor *o0, nt_tensor *o1)
{
    const nt__fop *bo, *ro;
    bool fwd = nt__fbn_ops(g->prog, &bo, &ro);
    memset(r, 0, sizeof *r);
    r->op = bo->op;
    r->nin = bo->nin;
    r->nout = 2;
    r->p = bo->p;
    for (int i = 0; i < bo->nin; i++)
        r->in[i] = NT_F_IS_EXT(bo->a[i]) ? g->ext[NT_F_EXT_IDX(bo->a[i])] : NULL;
    if (!fwd)
        r->in[0] = g->ext[NT_F_EXT_IDX(ro->a[0])];
    r->out[0] = o0, r->out[1] = o1;
}

/* A side product's first operand as its record saw it: A (contiguous) seen
 * as [rows, K] and transposed, [K, rows] with strides (1, K), into *at (a
 * view of A's storage: the same storage, offset and dtype). */
static inline void nt__fside_at(const nt_tensor *A, nt_tensor *at)
{
    int64_t K = A->ndim ? A->shape[A->ndim - 1] : 1;
    /* the view fields only: a worker never reads a handle's magic or
     * counts, which the host writes meanwhile */
    memset(at, 0, sizeof *at);
    at->st = A->st;
    at->offset = A->offset;
    at->dtype = A->dtype;
    at->dev = A->dev;
    at->ndim = 2;
    at->shape[0] = K;
    at->shape[1] = K ? nt__numel(A->ndim, A->shape) / K : 0;
    at->stride[0] = 1, at->stride[1] = K;
}

/* Splits g into its product and epilogue (*rest, its program *rp: g's
 * without the side ops, values and output slots renumbered; rest->prog is
 * rp) and the side ops' output tensors (side[0..n), NULL where the value is
 * not stored, and their op indices in g's program, sidek[0..n); n
 * returned, at most `max`; -1 if there are more).  rest shares g's inputs
 * and records. */
static inline int nt__fgroup_split(const nt__fgroup *g, nt__fgroup *rest, nt__fprog *rp,
                                   nt_tensor **side, int *sidek, int max)
{
    const nt__fprog *p = g->prog;
    int8_t vmap[NT_F_MAXVALS];
    int n = 0;
    *rp = *p;
    *rest = *g;
    rest->prog = rp;
    rp->nops = rp->nvals = rp->nout = 0;
    for (int k = 0; k < p->nops; k++) {
        const nt__fop *o = &p->ops[k];
        vmap[o->out] = -1;
        if (nt__fop_is_side(p, k)) {
            if (n == max)
                return -1;
            int sv = p->vals[o->out].store;
            sidek[n] = k;
            side[n++] = sv >= 0 ? g->out[sv] : NULL;
            continue;
        }
        nt__fop q = *o;
        for (int i = 0; i < q.nin; i++)
            if (!NT_F_IS_EXT(q.a[i]))
                q.a[i] = vmap[q.a[i]];
        q.out = (int8_t)rp->nvals;
        vmap[o->out] = q.out;
        rp->vals[rp->nvals++] = p->vals[o->out];
        rp->ops[rp->nops++] = q;
    }
    for (int sv = 0; sv < p->nout; sv++) {
        int v = vmap[p->out_val[sv]];
        if (v < 0)
            continue;
        rp->vals[v].store = (int8_t)rp->nout;
        rp->out_val[rp->nout] = (int8_t)v;
        rest->out[rp->nout++] = g->out[sv];
    }
    return n;
}

#endif
