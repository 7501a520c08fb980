/* core/optable.h - the one op table.
 *
 * Every op is one line X(ID, name, nin, kind, flags).  The table expands into
 * the op enum, the names, arities, kinds and flags (core/optable.c), and into
 * each backend's kernel table (cpu/kernels.c, sim/kernels/).  Ops are grouped
 * by kind so a backend can expand one family with one generator (all
 * elementwise unary ops share one generic kernel, for example).  Adding an op
 * is one line here plus its functions; the _Static_asserts in optable.c and
 * the backend tables catch a table that fell out of step.
 *
 * nin is the most inputs the op takes (optional inputs may be NULL).
 * Flags: NT_OPF_DIFF differentiable; NT_OPF_INT accepts integer inputs and
 * keeps their dtype; NT_OPF_F32INT integer inputs give an f32 result. */
#ifndef NT_CORE_OPTABLE_H
#define NT_CORE_OPTABLE_H

enum {
    NT_OPF_DIFF = 1u << 0,
    NT_OPF_INT = 1u << 1,
    NT_OPF_F32INT = 1u << 2,
};

typedef enum nt__opkind {
    NT_KIND_FILL,    /* no inputs: creation */
    NT_KIND_COPY,    /* strided copy with broadcast and cast */
    NT_KIND_UNARY,   /* y = f(a) */
    NT_KIND_SCALAR,  /* y = f(a, p.f[0], p.f[1]) */
    NT_KIND_BINARY,  /* y = f(a, b), broadcasting */
    NT_KIND_CMP,     /* u8 y = a ? b */
    NT_KIND_WHERE,   /* y = c ? a : b */
    NT_KIND_REDUCE,  /* over p.dim (or all), p.flag = keepdim */
    NT_KIND_ROW,     /* softmax family and norms over one dim */
    NT_KIND_LOSS,    /* scalar losses */
    NT_KIND_MATMUL,  /* batched matmul */
    NT_KIND_GATHER,  /* embedding, gather, index_select */
    NT_KIND_VIEW,    /* views and composites: no kernel, autograd only */
    NT_KIND_BWD,     /* backward helpers (autograd) */
    NT_KIND_CUSTOM,  /* user-registered kernels */
} nt__opkind;

#define NT_OPS_FILL(X)                                                      \
    X(FILL, fill, 0, NT_KIND_FILL, NT_OPF_INT)                              \
    X(ARANGE, arange, 0, NT_KIND_FILL, NT_OPF_INT)                          \
    X(RAND, rand, 0, NT_KIND_FILL, 0)                                       \
    X(RANDN, randn, 0, NT_KIND_FILL, 0)

#define NT_OPS_COPY(X)                                                      \
    X(COPY, copy, 1, NT_KIND_COPY, NT_OPF_DIFF | NT_OPF_INT)                \
    X(CAST, cast, 1, NT_KIND_COPY, NT_OPF_DIFF | NT_OPF_INT)

/* X(ID, name, nin, kind, flags) for y = nt__ew_<name>(a) */
#define NT_OPS_UNARY(X)                                                     \
    X(NEG, neg, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_INT)                 \
    X(EXP, exp, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)              \
    X(LOG, log, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)              \
    X(SQRT, sqrt, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)            \
    X(RSQRT, rsqrt, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)          \
    X(ABS, abs, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_INT)                 \
    X(RELU, relu, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_INT)               \
    X(GELU, gelu, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)            \
    X(SIGMOID, sigmoid, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)      \
    X(TANH, tanh, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)            \
    X(SILU, silu, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_F32INT)

/* y = nt__ew_<name>(a, p.f[0], p.f[1]) */
#define NT_OPS_SCALAR(X)                                                    \
    X(ADD_SCALAR, add_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_INT)  \
    X(MUL_SCALAR, mul_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_INT)  \
    X(DIV_SCALAR, div_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_F32INT) \
    X(POW_SCALAR, pow_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_F32INT) \
    X(CLAMP, clamp, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_INT)

/* y = nt__ew_<name>(a, b) with broadcasting */
#define NT_OPS_BINARY(X)                                                    \
    X(ADD, add, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_INT)                \
    X(SUB, sub, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_INT)                \
    X(MUL, mul, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_INT)                \
    X(DIV, div, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_F32INT)             \
    X(MAXIMUM, maximum, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_INT)        \
    X(MINIMUM, minimum, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_INT)

/* Backward helpers of the unary ops: y = nt__ew_<name>(g, x-or-y), binary
 * elementwise like the family above, enqueued only by autograd. */
#define NT_OPS_EW_BWD(X)                                                    \
    X(RELU_BWD, relu_bwd, 2, NT_KIND_BINARY, 0)                             \
    X(GELU_BWD, gelu_bwd, 2, NT_KIND_BINARY, 0)                             \
    X(SILU_BWD, silu_bwd, 2, NT_KIND_BINARY, 0)                             \
    X(SIGMOID_BWD, sigmoid_bwd, 2, NT_KIND_BINARY, 0)                       \
    X(TANH_BWD, tanh_bwd, 2, NT_KIND_BINARY, 0)

/* u8 y = nt__ew_<name>(a, b) */
#define NT_OPS_CMP(X)                                                       \
    X(EQ, eq, 2, NT_KIND_CMP, NT_OPF_INT)                                   \
    X(NE, ne, 2, NT_KIND_CMP, NT_OPF_INT)                                   \
    X(LT, lt, 2, NT_KIND_CMP, NT_OPF_INT)                                   \
    X(LE, le, 2, NT_KIND_CMP, NT_OPF_INT)                                   \
    X(GT, gt, 2, NT_KIND_CMP, NT_OPF_INT)                                   \
    X(GE, ge, 2, NT_KIND_CMP, NT_OPF_INT)

/* min .. index_select at the end: the reductions and gathers of the
 * Torch-to-NKIPy op registry that ntensor lacked (issue 15). */
#define NT_OPS_MISC(X)                                                      \
    X(WHERE, where, 3, NT_KIND_WHERE, NT_OPF_DIFF | NT_OPF_INT)             \
    X(SUM, sum, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_INT)                \
    X(MEAN, mean, 1, NT_KIND_REDUCE, NT_OPF_DIFF)                           \
    X(MAX, max, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_INT)                \
    X(ARGMAX, argmax, 1, NT_KIND_REDUCE, NT_OPF_INT)                        \
    X(SOFTMAX, softmax, 1, NT_KIND_ROW, NT_OPF_DIFF)                        \
    X(LOG_SOFTMAX, log_softmax, 1, NT_KIND_ROW, NT_OPF_DIFF)                \
    X(LAYER_NORM, layer_norm, 3, NT_KIND_ROW, NT_OPF_DIFF)                  \
    X(RMS_NORM, rms_norm, 2, NT_KIND_ROW, NT_OPF_DIFF)                      \
    X(CROSS_ENTROPY, cross_entropy, 2, NT_KIND_LOSS, NT_OPF_DIFF)           \
    X(MSE_LOSS, mse_loss, 2, NT_KIND_LOSS, NT_OPF_DIFF)                     \
    X(MATMUL, matmul, 2, NT_KIND_MATMUL, NT_OPF_DIFF)                       \
    X(EMBEDDING, embedding, 2, NT_KIND_GATHER, NT_OPF_DIFF)                 \
    X(MIN, min, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_INT)                \
    X(ARGMIN, argmin, 1, NT_KIND_REDUCE, NT_OPF_INT)                        \
    X(ANY, any, 1, NT_KIND_REDUCE, NT_OPF_INT)                              \
    X(NORM, norm, 1, NT_KIND_REDUCE, NT_OPF_DIFF)                           \
    X(GATHER, gather, 2, NT_KIND_GATHER, NT_OPF_DIFF | NT_OPF_INT)          \
    X(INDEX_SELECT, index_select, 2, NT_KIND_GATHER, NT_OPF_DIFF | NT_OPF_INT)

/* Views (no kernel: metadata only) and composites that autograd records as
 * one node.  nin 0 = variadic (cat). */
#define NT_OPS_VIEW(X)                                                      \
    X(RESHAPE, reshape, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_INT)          \
    X(TRANSPOSE, transpose, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_INT)      \
    X(PERMUTE, permute, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_INT)          \
    X(SLICE, slice, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_INT)              \
    X(EXPAND, expand, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_INT)            \
    X(ALIAS, alias, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_INT)              \
    X(CAT, cat, 0, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_INT)

/* Backward helpers with their own kernels (autograd/ enqueues them):
 * embedding_bwd(g [..., D], idx [...]) -> [p.i[0] = V, D], rows added in
 * index order; index_add(g, idx) -> the gathered tensor's shape, g's
 * elements added in g's row-major order (gather, index_select). */
#define NT_OPS_BWD(X)                                                       \
    X(EMBEDDING_BWD, embedding_bwd, 2, NT_KIND_BWD, 0)                      \
    X(INDEX_ADD, index_add, 2, NT_KIND_BWD, 0)

#define NT_OP_TABLE(X)                                                      \
    NT_OPS_FILL(X) NT_OPS_COPY(X) NT_OPS_UNARY(X) NT_OPS_SCALAR(X)          \
    NT_OPS_BINARY(X) NT_OPS_EW_BWD(X) NT_OPS_CMP(X) NT_OPS_MISC(X) NT_OPS_VIEW(X)    \
    NT_OPS_BWD(X)

typedef enum nt__op {
#define NT__OP_ENUM(ID, name, nin, kind, flags) NT_OP_##ID,
    NT_OP_TABLE(NT__OP_ENUM)
#undef NT__OP_ENUM
    NT_OP_COUNT,
    /* user ops registered at run time get ids from here on */
    NT_OP_CUSTOM_BASE = 1024,
} nt__op;

#define NT__COUNT1(...) +1
enum { NT__N_UNARY = 0 NT_OPS_UNARY(NT__COUNT1),
       NT__N_SCALAR = 0 NT_OPS_SCALAR(NT__COUNT1),
       NT__N_BINARY = 0 NT_OPS_BINARY(NT__COUNT1),
       NT__N_CMP = 0 NT_OPS_CMP(NT__COUNT1) };

typedef struct nt__opinfo {
    const char *name; /* "add" */
    const char *api;  /* "nt_add" */
    int nin;
    nt__opkind kind;
    unsigned flags;
} nt__opinfo;

extern const nt__opinfo nt__ops[NT_OP_COUNT];

/* Info for a built-in or registered op id (NULL if unknown). */
const nt__opinfo *nt__opinfo_get(int op);

#endif
