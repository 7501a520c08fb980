/* core/optable.h - the one op table.
 *
 * Every op is one line
 *
 *   X(ID, name, nin, kind, flags, ints, amp, bwd, save, sim)
 *
 *   ID, name  NT_OP_<ID>, "name", the public nt_<name>; an elementwise op's
 *             scalar definition is nt__ew_<name> in core/ewise.h
 *   nin       the most inputs the op takes (optional inputs may be NULL)
 *   kind      the family (nt__opkind): which generic kernel, fusion rule
 *             and conformance driver (tests/test_conformance.c) it gets
 *   flags     0 or NT_OPF_* bits: DIFF (differentiable); NANPROP (a NaN
 *             operand gives a NaN, and otherwise only non-NaN operands are
 *             read: cpu/fused.c leaves NaN payloads uncanonical between such
 *             ops); INPLACE (autograd follows an in-place write of the op:
 *             its backward never reads the old value, autograd/tape.c);
 *             NT_OPF_PRIM(p) (the float and integer definitions are the one
 *             primitive operation p of a and b, or of a and the scalar s0:
 *             cpu/fused.c's register chains and AVX-512 routes and the
 *             simulator's integer sequences run it as that operation);
 *             NT_OPF_RED(rop, pre, fin) (a reduction's recipe, core/reduce.h:
 *             each element mapped by pre, folded by rop, finished by fin;
 *             NT_OPF_RED_ORD: pre and fin follow nt_norm's ord instead);
 *             VIEW (the result is a view of input 0, sharing its storage:
 *             autograd refuses in-place writes through it while it requires
 *             grad, autograd/tape.c).  Of the VIEW kind, ALIAS (the same
 *             value under a new handle: nt_contiguous of a contiguous
 *             tensor, nt_cast to its own dtype, nt_detach; in-place writes
 *             to it are followed), CAT and FLIP (new tensors) have no VIEW
 *             flag; IDXOUT (a differentiable op whose integer outputs are
 *             indices, as max_pool2d_fwd's positions: autograd records the
 *             node for its float outputs and gives the indices no gradient,
 *             autograd/tape.c)
 *   ints      integer inputs: INT (the op has nt__ewi_<name> and keeps the
 *             integer dtype), F32INT (integer inputs give an f32 result),
 *             INTONLY (integers only, nt__ewi_<name>; a float input is an
 *             error), FLOAT (no integer path)
 *   amp       the autocast policy (amp/autocast.c): KEEP the input dtype,
 *             LOW cast floating inputs to the region's dtype, F32 cast
 *             bf16/f16 inputs up to f32
 *   bwd       the backward function bwd_<bwd> of autograd/backward.c;
 *             `dx` is the generic one of an elementwise unary or
 *             tensor-scalar op: g * nt__ew_<name>_dx(v), through the
 *             UNARY_BWD helper, on every backend; `dxy` the generic one of a
 *             binary op: g * nt__ew_<name>_da(a, b) and g * _db(a, b),
 *             through BINARY_DX; `zero` a zero gradient (sign, floor, ...:
 *             PyTorch's zeros, also where g is Inf or NaN);
 *             `helper(H)` g and the saved x or y
 *             (per `save`) through the op's own backward helper H of
 *             NT_OPS_EW_BWD (specialised bits that predate `dx`); `nograd` none
 *   save      what the backward needs saved: 0, I0, I1, I01, O0, I0O0
 *             (input i, output 0).  For `dx` it says what nt__ew_<name>_dx reads:
 *             I0 the input x, O0 the output y
 *   sim       how neuron/ew.c runs it: an NT_ACT_* activation (unary),
 *             an NT_ALU_* step (scalar, binary, compare) -- each a function
 *             or operator of the NKI ISA --, NT__SIM_SEQ (a sequence of
 *             such instructions in neuron/ew.c, for an op the NKI ISA
 *             has no function for), NT__SIM_NONE (an op with its own kernel)
 *
 * The table expands into the op enum and info (core/optable.c), each
 * backend's kernel table (cpu/kernels.c, neuron/runtime.c), the
 * per-op switches of the CPU, fused-CPU and sim evaluators, the public
 * entry points of the unary/binary/compare groups (dispatcher/api_ew.c),
 * the autocast policy and the backward table.  Every switch over ops that
 * is left has a default that fails naming the op.  docs/architecture.md
 * ("Adding an op") lists what a new op needs besides its line here.
 * The tables expanded from it are unsized, so the _Static_asserts in
 * optable.c, autograd/backward.c and the backend tables catch a missing
 * last row; tests/test_conformance.c checks every row is filled and runs
 * every op id. */
#ifndef NT_CORE_OPTABLE_H
#define NT_CORE_OPTABLE_H

#include <stdbool.h>

#include "core/reduce.h" /* NT_RED_*: the words of a reduction's recipe */

enum {
    NT_OPF_DIFF = 1u << 0,
    NT_OPF_INT = 1u << 1,
    NT_OPF_F32INT = 1u << 2,
    NT_OPF_INTONLY = 1u << 3,
    NT_OPF_NANPROP = 1u << 4,
    NT_OPF_INPLACE = 1u << 5,
    NT_OPF_REDUCTION = 1u << 6, /* set by NT_OPF_RED */
    NT_OPF_RED_ORD = 1u << 7,
    NT_OPF_VIEW = 1u << 24, /* bits 8-23: NT_OPF_PRIM and NT_OPF_RED */
    NT_OPF_IDXOUT = 1u << 25,
};

/* NT_OPF_PRIM(p): the primitive operation an op is (the flags column) */
typedef enum nt__prim {
    NT__PRIM_NONE = 0,
    NT__PRIM_ADD, /* a + b */
    NT__PRIM_SUB, /* a - b */
    NT__PRIM_MUL, /* a * b */
    NT__PRIM_DIV, /* a / b */
    NT__PRIM_MAX, /* nt__ew_maximum(a, b): a NaN propagates */
    NT__PRIM_MIN, /* nt__ew_minimum(a, b) */
    NT__PRIM_NEG, /* -a (integers wrap) */
    NT__PRIM_RELU, /* a > 0 ? a : 0, a NaN kept */
    NT__PRIM_ABS, /* |a| (integers: max(a, -a), wrapping) */
    NT__PRIM_NOT, /* ~a (integers only) */
} nt__prim;
#define NT__PRIM_SHIFT 8
#define NT_OPF_PRIM(p) ((unsigned)NT__PRIM_##p << NT__PRIM_SHIFT)

/* NT_OPF_RED(rop, pre, fin): a reduction's recipe in the flags column */
#define NT__RED_SHIFT 12
#define NT_OPF_RED(rop, pre, fin)                                                          \
    (NT_OPF_REDUCTION | ((unsigned)NT_RED_##rop << NT__RED_SHIFT) |                        \
     ((unsigned)NT_RED_PRE_##pre << (NT__RED_SHIFT + 4)) |                                 \
     ((unsigned)NT_RED_FIN_##fin << (NT__RED_SHIFT + 8)))

/* the ints column as flag bits */
#define NT__INTS_INT NT_OPF_INT
#define NT__INTS_F32INT NT_OPF_F32INT
#define NT__INTS_INTONLY (NT_OPF_INT | NT_OPF_INTONLY)
#define NT__INTS_FLOAT 0u
/* NT__IF_INT(ints, code...): code if the op has an integer form
 * nt__ewi_<name>; NT__IF_FLOAT: code if it has a float form nt__ew_<name> */
#define NT__IF_INT(ints, ...) NT__IFI_##ints(__VA_ARGS__)
#define NT__IFI_INT(...) __VA_ARGS__
#define NT__IFI_INTONLY(...) __VA_ARGS__
#define NT__IFI_F32INT(...)
#define NT__IFI_FLOAT(...)
#define NT__IF_FLOAT(ints, ...) NT__IFF_##ints(__VA_ARGS__)
#define NT__IFF_INT(...) __VA_ARGS__
#define NT__IFF_INTONLY(...)
#define NT__IFF_F32INT(...) __VA_ARGS__
#define NT__IFF_FLOAT(...) __VA_ARGS__

/* the amp column */
typedef enum { NT__AMP_KEEP = 0, NT__AMP_LOW, NT__AMP_F32 } nt__amp_policy;

/* the save column: (saved inputs mask, saved outputs mask) */
#define NT__SAVE_0 0u, 0u
#define NT__SAVE_I0 1u, 0u
#define NT__SAVE_I1 2u, 0u
#define NT__SAVE_I01 3u, 0u
#define NT__SAVE_I012 7u, 0u
#define NT__SAVE_O0 0u, 1u
#define NT__SAVE_I0O0 1u, 1u
#define NT__SAVE_I0123O01 15u, 3u
#define NT__SAVE_I01O1 3u, 2u
#define NT__SAVE_O1 0u, 2u

/* the sim column's non-instruction values */
enum { NT__SIM_NONE = -1, NT__SIM_SEQ = -3 };

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
    NT_KIND_ATTN,    /* scaled dot-product attention (cpu/attention.c) */
    NT_KIND_CUSTOM,  /* user-registered kernels */
    NT_KIND_COUNT
} nt__opkind;

#define NT_OPS_FILL(X)                                                      \
    X(FILL, fill, 0, NT_KIND_FILL, NT_OPF_INPLACE, INT, KEEP, none, 0, NT__SIM_NONE)                       \
    X(ARANGE, arange, 0, NT_KIND_FILL, 0, INT, KEEP, nograd, 0, NT__SIM_NONE)                       \
    X(RAND, rand, 0, NT_KIND_FILL, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE)                         \
    X(RANDN, randn, 0, NT_KIND_FILL, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE)

#define NT_OPS_COPY(X)                                                      \
    X(COPY, copy, 1, NT_KIND_COPY, NT_OPF_DIFF | NT_OPF_INPLACE, INT, KEEP, identity, 0, NT__SIM_NONE)     \
    X(CAST, cast, 1, NT_KIND_COPY, NT_OPF_DIFF, INT, KEEP, identity, 0, NT__SIM_NONE)

/* y = nt__ew_<name>(a); gradient nt__ew_<name>_dx (x or y, per `save`) */
#define NT_OPS_UNARY(X)                                                     \
    X(NEG, neg, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_INPLACE | NT_OPF_PRIM(NEG),        \
      INT, KEEP, neg, 0, NT__SIM_SEQ)                                                                       \
    X(EXP, exp, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, F32INT, F32, exp, O0, NT_ACT_EXP)          \
    X(LOG, log, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, F32, log, I0, NT_ACT_LOG)                    \
    X(SQRT, sqrt, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, KEEP, sqrt, O0, NT_ACT_SQRT)               \
    X(RSQRT, rsqrt, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, F32, rsqrt, O0, NT_ACT_RSQRT)            \
    X(ABS, abs, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_PRIM(ABS), INT, KEEP, abs, I0, NT_ACT_ABS)          \
    X(RELU, relu, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_PRIM(RELU),                      \
      INT, KEEP, helper(RELU_BWD), O0, NT_ACT_RELU)                                                        \
    X(GELU, gelu, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, KEEP, helper(GELU_BWD), I0, NT_ACT_GELU)          \
    X(SIGMOID, sigmoid, 1, NT_KIND_UNARY, NT_OPF_DIFF,                                                     \
      F32INT, KEEP, helper(SIGMOID_BWD), O0, NT_ACT_SIGMOID)                                               \
    X(TANH, tanh, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, KEEP, helper(TANH_BWD), O0, NT_ACT_TANH)          \
    X(SILU, silu, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, KEEP, helper(SILU_BWD), I0, NT_ACT_SILU)          \
    X(SOFTPLUS, softplus, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, F32, dx, I0, NT_ACT_SOFTPLUS)      \
    X(MISH, mish, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, KEEP, dx, I0, NT_ACT_MISH)                \
    X(SOFTSIGN, softsign, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, KEEP, dx, I0, NT__SIM_SEQ)        \
    X(RECIPROCAL, reciprocal, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, F32, dx, O0, NT_ACT_RECIPROCAL) \
    X(BITWISE_NOT, bitwise_not, 1, NT_KIND_UNARY, NT_OPF_PRIM(NOT), INTONLY, KEEP, nograd, 0, NT__SIM_SEQ) \
    X(GELU_TANH, gelu_tanh, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, KEEP, dx, I0, NT_ACT_GELU_APPRX_TANH) \
    X(SIN, sin, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, F32INT, KEEP, dx, I0, NT__SIM_SEQ) \
    X(COS, cos, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, F32INT, KEEP, dx, I0, NT__SIM_SEQ) \
    X(ERF, erf, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, F32INT, KEEP, dx, I0, NT_ACT_ERF) \
    X(LOG1P, log1p, 1, NT_KIND_UNARY, NT_OPF_DIFF, F32INT, F32, dx, I0, NT__SIM_SEQ)      \
    X(EXPM1, expm1, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, F32INT, F32, dx, O0, NT__SIM_SEQ) \
    X(SIGN, sign, 1, NT_KIND_UNARY, NT_OPF_DIFF, INT, KEEP, zero, 0, NT_ACT_SIGN)         \
    X(FLOOR, floor, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, INT, KEEP, zero, 0, NT__SIM_SEQ) \
    X(CEIL, ceil, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, INT, KEEP, zero, 0, NT__SIM_SEQ) \
    X(ROUND, round, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, INT, KEEP, zero, 0, NT__SIM_SEQ) \
    X(TRUNC, trunc, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_NANPROP, INT, KEEP, zero, 0, NT__SIM_SEQ)

/* y = nt__ew_<name>(a, p.f[0], p.f[1]) */
#define NT_OPS_SCALAR(X)                                                    \
    X(ADD_SCALAR, add_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_INPLACE | NT_OPF_PRIM(ADD), \
      INT, KEEP, add_scalar, 0, NT_ALU_ADD)                                                                \
    X(MUL_SCALAR, mul_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_INPLACE | NT_OPF_PRIM(MUL), \
      INT, KEEP, mul_scalar, 0, NT_ALU_MUL)                                                                \
    X(DIV_SCALAR, div_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF | NT_OPF_PRIM(DIV),                           \
      F32INT, KEEP, div_scalar, 0, NT_ALU_DIV)                                                             \
    X(POW_SCALAR, pow_scalar, 1, NT_KIND_SCALAR, NT_OPF_DIFF, F32INT, F32, pow_scalar, I0, NT_ALU_POW) \
    X(CLAMP, clamp, 1, NT_KIND_SCALAR, NT_OPF_DIFF, INT, KEEP, clamp, I0, NT__SIM_SEQ)              \
    X(LEAKY_RELU, leaky_relu, 1, NT_KIND_SCALAR, NT_OPF_DIFF, FLOAT, KEEP, dx, I0, NT__SIM_SEQ)     \
    X(HARDTANH, hardtanh, 1, NT_KIND_SCALAR, NT_OPF_DIFF, FLOAT, KEEP, dx, I0, NT__SIM_SEQ)

/* y = nt__ew_<name>(a, b) with broadcasting */
#define NT_OPS_BINARY(X)                                                    \
    X(ADD, add, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_INPLACE | NT_OPF_PRIM(ADD),       \
      INT, KEEP, add, 0, NT_ALU_ADD)                                                                       \
    X(SUB, sub, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_INPLACE | NT_OPF_PRIM(SUB),       \
      INT, KEEP, sub, 0, NT_ALU_SUB)                                                                       \
    X(MUL, mul, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_PRIM(MUL),                        \
      INT, KEEP, mul, I01, NT_ALU_MUL)                                                                     \
    X(DIV, div, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_NANPROP | NT_OPF_PRIM(DIV),                        \
      F32INT, KEEP, div, I01, NT_ALU_DIV)                                                                  \
    X(MAXIMUM, maximum, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_PRIM(MAX),                                 \
      INT, KEEP, maximum, I01, NT_ALU_MAX)                                                                 \
    X(MINIMUM, minimum, 2, NT_KIND_BINARY, NT_OPF_DIFF | NT_OPF_PRIM(MIN),                                 \
      INT, KEEP, minimum, I01, NT_ALU_MIN)                                                                 \
    X(POW, pow, 2, NT_KIND_BINARY, NT_OPF_DIFF, F32INT, F32, dxy, I01, NT_ALU_POW)            \
    X(ATAN2, atan2, 2, NT_KIND_BINARY, NT_OPF_DIFF, F32INT, KEEP, dxy, I01, NT__SIM_SEQ)    \
    X(FMOD, fmod, 2, NT_KIND_BINARY, NT_OPF_DIFF, INT, KEEP, dxy, I01, NT__SIM_SEQ)

/* Backward helpers of the unary ops: y = nt__ew_<name>(g, x-or-y), binary
 * elementwise like the family above, enqueued only by autograd. */
#define NT_OPS_EW_BWD(X)                                                    \
    X(RELU_BWD, relu_bwd, 2, NT_KIND_BINARY, NT_OPF_DIFF, FLOAT, KEEP, relu_bwd, I1, NT__SIM_SEQ)                \
    X(GELU_BWD, gelu_bwd, 2, NT_KIND_BINARY, NT_OPF_DIFF, FLOAT, KEEP, gelu_bwd, I01, NT__SIM_SEQ)                \
    X(SILU_BWD, silu_bwd, 2, NT_KIND_BINARY, NT_OPF_DIFF, FLOAT, KEEP, silu_bwd, I01, NT__SIM_SEQ)                \
    X(SIGMOID_BWD, sigmoid_bwd, 2, NT_KIND_BINARY, NT_OPF_DIFF, FLOAT, KEEP, sigmoid_bwd, I01, NT__SIM_SEQ)          \
    X(TANH_BWD, tanh_bwd, 2, NT_KIND_BINARY, NT_OPF_DIFF, FLOAT, KEEP, tanh_bwd, I01, NT__SIM_SEQ)

/* The generic backwards, enqueued only by autograd: UNARY_BWD(g, v) = g *
 * nt__ew_<f>_dx(v) for the unary or tensor-scalar op f = p.i[0] with bwd
 * `dx` (v = x or y, per f's save column; f's scalars in p.f); BINARY_DX(a,
 * b) = nt__ew_<f>_da(a, b) (p.i[1] = 0) or nt__ew_<f>_db (p.i[1] = 1) for
 * the binary op f = p.i[0] with bwd `dxy`, which autograd multiplies by g.
 * UNARY_BWD records (and differentiates again) only in a create_graph
 * pass; a plain backward enqueues it without a node. */
#define NT_OPS_GRAD(X)                                                                             \
    X(UNARY_BWD, unary_bwd, 2, NT_KIND_BINARY, NT_OPF_DIFF, FLOAT, KEEP, unary_bwd, I01, NT__SIM_SEQ) \
    X(BINARY_DX, binary_dx, 2, NT_KIND_BINARY, 0, FLOAT, KEEP, nograd, 0, NT__SIM_SEQ)

/* u8 y = nt__ew_<name>(a, b) */
#define NT_OPS_CMP(X)                                                       \
    X(EQ, eq, 2, NT_KIND_CMP, 0, INT, KEEP, nograd, 0, NT_ALU_EQ)                                   \
    X(NE, ne, 2, NT_KIND_CMP, 0, INT, KEEP, nograd, 0, NT_ALU_NE)                                   \
    X(LT, lt, 2, NT_KIND_CMP, 0, INT, KEEP, nograd, 0, NT_ALU_LT)                                   \
    X(LE, le, 2, NT_KIND_CMP, 0, INT, KEEP, nograd, 0, NT_ALU_LE)                                   \
    X(GT, gt, 2, NT_KIND_CMP, 0, INT, KEEP, nograd, 0, NT_ALU_GT)                                   \
    X(GE, ge, 2, NT_KIND_CMP, 0, INT, KEEP, nograd, 0, NT_ALU_GE)

/* rope(x, offset) (issue 33): rotary position embedding of contiguous x
 * [..., T, D] in one kernel (cpu/rope.c, neuron/rope.c; the arithmetic in
 * core/rope.h), in[1] NULL or a one-element i32 offset read when the kernel
 * runs; p.i[0] = dims, p.i[1] = offset, p.f[0] = base, p.f[1] = scale,
 * p.flag = NT__ROPE_* bits (interleaved; inverse: the rotation by -theta,
 * which is its backward). */
#define NT_OPS_ROPE(X)                                                      \
    X(ROPE, rope, 2, NT_KIND_ROW, NT_OPF_DIFF, FLOAT, KEEP, rope, I1, NT__SIM_NONE)

/* min .. index_select at the end: the reductions and gathers of the
 * Torch-to-NKIPy op registry that ntensor lacked (issue 15).  tril, triu
 * and masked_fill (issue 13) are selects, kind WHERE, so every backend runs
 * them and the planner fuses them like nt_where: the dispatcher makes the
 * condition and the fill (tril/triu: inputs mask, t, 0 with the u8 mask
 * built on the device from two aranges; masked_fill: mask, value, t with
 * the value a 0-d tensor of t's dtype), and the backward is where's.
 * dropout, topk and multinomial (issue 13) have their own kernels
 * (cpu/sample.c, neuron/sample.c; arithmetic in core/sample.h):
 * dropout(x) with p.f[0] = p, p.seed = seed (its backward is dropout of g
 * with the same seed: the mask is recomputed, not saved); topk(x) -> the
 * i32 indices along p.dim, p.i[0] = k, p.flag = largest (nt_topk gathers
 * the values, so their gradient is gather's); multinomial(probs) -> i32
 * [.., n] draws, p.i[0] = n, p.seed = seed.
 * scaled_dot_product_attention (issue 13, kind ATTN): in q, k, v, mask
 * (NULL, u8 or floating), p.f[0] = scale, p.flag = causal; out o and the
 * f32 log-sum-exp its backward reads (docs/ops.md §7a).
 * amax and amin: max and min's kernels (the same recipe, the
 * same bits) with torch.amax's backward: g shared evenly among the elements
 * equal to the result; dispatcher/api_reduce.c runs them over a dim list.
 * cumsum, cumprod and linrec are one running kernel (cpu/scan.c,
 * neuron/scan.c) over p.dim of contiguous floating inputs, the output x's
 * shape: r = init; r = a[j] * r + b[j] in f32 along the dim, each r
 * rounded once into y[j]; cumsum: a = 1, b = x, init -0; cumprod: a = x,
 * b = -0, init 1; linrec(a, b) (cumprod's backward): init -0.  Integer
 * cumsum/cumprod are the dispatcher's composites of add/mul. */
#define NT_OPS_MISC(X)                                                      \
    X(WHERE, where, 3, NT_KIND_WHERE, NT_OPF_DIFF, INT, KEEP, where, I0, NT__SIM_NONE)              \
    X(SUM, sum, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_RED(SUM, NONE, NONE),                              \
      INT, F32, sum, 0, NT__SIM_NONE)                                                                      \
    X(MEAN, mean, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_RED(SUM, NONE, MEAN),                            \
      FLOAT, F32, mean, 0, NT__SIM_NONE)                                                                   \
    X(MAX, max, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_RED(MAX, NONE, NONE),                              \
      INT, KEEP, max, I0, NT__SIM_NONE)                                                                    \
    X(ARGMAX, argmax, 1, NT_KIND_REDUCE, NT_OPF_RED(ARGMAX, NONE, NONE),                                   \
      INT, KEEP, nograd, 0, NT__SIM_NONE)                                                                  \
    X(SOFTMAX, softmax, 1, NT_KIND_ROW, NT_OPF_DIFF, FLOAT, F32, softmax, O0, NT__SIM_NONE)         \
    X(LOG_SOFTMAX, log_softmax, 1, NT_KIND_ROW, NT_OPF_DIFF, FLOAT, F32, log_softmax, O0, NT__SIM_NONE) \
    X(LAYER_NORM, layer_norm, 3, NT_KIND_ROW, NT_OPF_DIFF, FLOAT, F32, layer_norm, I01, NT__SIM_NONE) \
    X(RMS_NORM, rms_norm, 2, NT_KIND_ROW, NT_OPF_DIFF, FLOAT, F32, rms_norm, I01, NT__SIM_NONE)     \
    X(CROSS_ENTROPY, cross_entropy, 2, NT_KIND_LOSS, NT_OPF_DIFF, FLOAT, F32, cross_entropy, I01, NT__SIM_NONE) \
    X(MSE_LOSS, mse_loss, 2, NT_KIND_LOSS, NT_OPF_DIFF, FLOAT, F32, mse_loss, I01, NT__SIM_NONE)    \
    X(MATMUL, matmul, 2, NT_KIND_MATMUL, NT_OPF_DIFF, FLOAT, LOW, matmul, I01, NT__SIM_NONE)        \
    X(EMBEDDING, embedding, 2, NT_KIND_GATHER, NT_OPF_DIFF, INT, KEEP, embedding, I1, NT__SIM_NONE) \
    X(MIN, min, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_RED(MIN, NONE, NONE),                              \
      INT, KEEP, min, I0, NT__SIM_NONE)                                                                    \
    X(ARGMIN, argmin, 1, NT_KIND_REDUCE, NT_OPF_RED(ARGMIN, NONE, NONE),                                   \
      INT, KEEP, nograd, 0, NT__SIM_NONE)                                                                  \
    X(ANY, any, 1, NT_KIND_REDUCE, NT_OPF_RED(MAX, NZ, NONE), INT, KEEP, nograd, 0, NT__SIM_NONE)          \
    X(NORM, norm, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_RED(SUM, NONE, NONE) | NT_OPF_RED_ORD,           \
      FLOAT, F32, norm, I0O0, NT__SIM_NONE)                                                                \
    X(GATHER, gather, 2, NT_KIND_GATHER, NT_OPF_DIFF, INT, KEEP, gather, I1, NT__SIM_NONE)          \
    X(INDEX_SELECT, index_select, 2, NT_KIND_GATHER, NT_OPF_DIFF, INT, KEEP, gather, I1, NT__SIM_NONE) \
    X(TRIL, tril, 3, NT_KIND_WHERE, NT_OPF_DIFF, INT, KEEP, where, I0, NT__SIM_NONE)                \
    X(TRIU, triu, 3, NT_KIND_WHERE, NT_OPF_DIFF, INT, KEEP, where, I0, NT__SIM_NONE)                \
    X(MASKED_FILL, masked_fill, 3, NT_KIND_WHERE, NT_OPF_DIFF, INT, KEEP, where, I0, NT__SIM_NONE)     \
    X(DROPOUT, dropout, 1, NT_KIND_ROW, NT_OPF_DIFF, FLOAT, KEEP, dropout, 0, NT__SIM_NONE)          \
    X(TOPK, topk, 1, NT_KIND_REDUCE, 0, INT, KEEP, nograd, 0, NT__SIM_NONE)                         \
    X(MULTINOMIAL, multinomial, 1, NT_KIND_REDUCE, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE)         \
    X(SDPA, scaled_dot_product_attention, 4, NT_KIND_ATTN, NT_OPF_DIFF, FLOAT, LOW, sdpa, I0123O01, NT__SIM_NONE) \
    X(AMAX, amax, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_RED(MAX, NONE, NONE),                            \
      INT, KEEP, amax, I0O0, NT__SIM_NONE)                                                                 \
    X(AMIN, amin, 1, NT_KIND_REDUCE, NT_OPF_DIFF | NT_OPF_RED(MIN, NONE, NONE),                            \
      INT, KEEP, amax, I0O0, NT__SIM_NONE)                                                                 \
    X(CUMSUM, cumsum, 1, NT_KIND_ROW, NT_OPF_DIFF, INT, KEEP, cumsum, 0, NT__SIM_NONE)                    \
    X(CUMPROD, cumprod, 1, NT_KIND_ROW, NT_OPF_DIFF, INT, KEEP, cumprod, I0O0, NT__SIM_NONE)              \
    X(LINREC, linrec, 2, NT_KIND_BWD, NT_OPF_DIFF, FLOAT, KEEP, linrec, I0O0, NT__SIM_NONE)                    \
    X(SCATTER, scatter, 3, NT_KIND_GATHER, NT_OPF_DIFF, INT, KEEP, scatter, I1, NT__SIM_NONE)       \
    X(SCATTER_ADD, scatter_add, 3, NT_KIND_GATHER, NT_OPF_DIFF, INT, KEEP, scatter_add, I1, NT__SIM_NONE) \
    NT_OPS_ROPE(X)

/* Views (no kernel: metadata only) and composites that autograd records as
 * one node.  nin 0 = variadic (cat).  flip: an index_select per
 * flipped dim with a descending arange (a gather on either backend), p.i[0]
 * = the flipped dims as a bit mask; its backward flips g the same way.
 * conv2d, conv_transpose2d: composites of conv_gemm (and a bias
 * add) recorded as one node with inputs x, w, b; p.i[0..1] stride, [2..3]
 * padding, [4..5] dilation, [6..7] output_padding, p.flag groups
 * (dispatcher/api_conv.c, docs/ops.md "Convolution"). */
#define NT_OPS_VIEW(X)                                                      \
    X(RESHAPE, reshape, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_VIEW, INT, KEEP, reshape, 0, NT__SIM_NONE)          \
    X(TRANSPOSE, transpose, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_VIEW, INT, KEEP, transpose, 0, NT__SIM_NONE)    \
    X(PERMUTE, permute, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_VIEW, INT, KEEP, permute, 0, NT__SIM_NONE)          \
    X(SLICE, slice, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_VIEW, INT, KEEP, slice, 0, NT__SIM_NONE)                \
    X(EXPAND, expand, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_VIEW, INT, KEEP, expand, 0, NT__SIM_NONE)             \
    X(ALIAS, alias, 1, NT_KIND_VIEW, NT_OPF_DIFF, INT, KEEP, identity, 0, NT__SIM_NONE)             \
    X(CAT, cat, 0, NT_KIND_VIEW, NT_OPF_DIFF, INT, KEEP, cat, 0, NT__SIM_NONE)             \
    X(FLIP, flip, 1, NT_KIND_VIEW, NT_OPF_DIFF, INT, KEEP, flip, 0, NT__SIM_NONE)            \
    X(DIAGONAL, diagonal, 1, NT_KIND_VIEW, NT_OPF_DIFF | NT_OPF_VIEW, INT, KEEP, diagonal, 0, NT__SIM_NONE) \
    X(CONV2D, conv2d, 3, NT_KIND_VIEW, NT_OPF_DIFF, FLOAT, LOW, conv2d, I01, NT__SIM_NONE)          \
    X(CONV_TRANSPOSE2D, conv_transpose2d, 3, NT_KIND_VIEW, NT_OPF_DIFF, FLOAT, LOW, conv_transpose2d, I01, NT__SIM_NONE)

/* Backward helpers with their own kernels (autograd/ enqueues them):
 * embedding_bwd(g [..., D], idx [...]) -> [p.i[0] = V, D], rows added in
 * index order; index_add(g, idx) -> the gathered tensor's shape, g's
 * elements added in g's row-major order (gather, index_select; its kernels
 * also run the public scatter and scatter_add);
 * sdpa_bwd(qx, kv, lse, mask) -> dq, dkv: attention's gradient with the
 * scores recomputed (cpu/attention.c says how qx and kv are packed).;
 * conv_gemm(x, w) -> y and conv_wgrad(x, gy) -> dw: the convolutions'
 * products (core/conv.h has their geometry and parameters);
 * batch_norm_fwd(x [N, C, *], w, b) -> y, stats [2, C] (the per-channel
 * mean and sum of squared deviations; p.f[0] = eps) and batch_norm_bwd(g,
 * x, stats, w) -> dx, dwb [2, C] (dw, db): training batch norm in one
 * kernel each (dispatcher/api_norm.c, cpu/bn.c, neuron/bn.c);
 * grad_norms(g0, ?g1, ?g2, ?g3) -> [k] f32: the 2-norm of every f32 input
 * over all its elements, each exactly nt_norm(gi, 2) (gradient clipping's
 * per-parameter norms, k at a time, autograd/clip.c);
 * grouped_mm(x [M, K], w [E, K, N], counts [E] i32) -> [M, N]: rows of
 * expert e (the counts' consecutive runs) times w[e], each nt_matmul's
 * recurrence, rows past the counts' sum zero (p.dim 1: x [M, N] times
 * w[e]^T -> [M, K], the input gradient); grouped_mm_wgrad(x [M, K], gy [M, N],
 * counts) -> [E, K, N]: x_e^T . gy_e per expert, K-tiles of 128 rows from
 * the expert's first row; all_to_all_index(C [P, P] i32) -> [cap] i32:
 * the rows rank p.i[0] gathers from every rank's R = p.i[1] rows (C[i][j]:
 * rows rank i sends rank j), i * R + the row, P * R past the received
 * ones, counts checked (dist/moe.c, docs/parallel.md);
 * max_pool2d_fwd(x [..., H, W] f32) -> y [..., OH, OW], idx (i32, the flat
 * position h W + w of each maximum): nt_max_pool2d in one kernel (p.i[0..1]
 * kernel, [2..3] stride, [4..5] padding, [6..7] dilation; core/pool.h,
 * cpu/pool.c, neuron/pool.c); max_pool2d_bwd(g, idx) -> dx (x's shape,
 * the same p.i): g added at idx into zeros, windows in row-major order (a
 * create_graph pass: the same sums by scatter_add). */
#define NT_OPS_BWD(X)                                                       \
    X(EMBEDDING_BWD, embedding_bwd, 2, NT_KIND_BWD, NT_OPF_DIFF, FLOAT, KEEP, embedding_bwd, I1, NT__SIM_NONE)                                             \
    X(INDEX_ADD, index_add, 2, NT_KIND_BWD, NT_OPF_DIFF, FLOAT, KEEP, index_add, I1, NT__SIM_NONE)                \
    X(SDPA_BWD, sdpa_bwd, 4, NT_KIND_BWD, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE)                  \
    X(CONV_GEMM, conv_gemm, 2, NT_KIND_BWD, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE)                \
    X(CONV_WGRAD, conv_wgrad, 2, NT_KIND_BWD, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE) \
    X(BN_FWD, batch_norm_fwd, 3, NT_KIND_BWD, NT_OPF_DIFF, FLOAT, KEEP, bn_fwd, I01O1, NT__SIM_NONE) \
    X(BN_BWD, batch_norm_bwd, 4, NT_KIND_BWD, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE) \
    X(GRAD_NORMS, grad_norms, 4, NT_KIND_BWD, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE) \
    X(GMM, grouped_mm, 3, NT_KIND_BWD, NT_OPF_DIFF, FLOAT, KEEP, grouped_mm, I012, NT__SIM_NONE) \
    X(GMM_WGRAD, grouped_mm_wgrad, 3, NT_KIND_BWD, NT_OPF_DIFF, FLOAT, KEEP, grouped_mm_wgrad, I012, NT__SIM_NONE) \
    X(A2A_INDEX, all_to_all_index, 1, NT_KIND_BWD, 0, INT, KEEP, nograd, 0, NT__SIM_NONE) \
    X(MAX_POOL2D, max_pool2d_fwd, 1, NT_KIND_BWD, NT_OPF_DIFF | NT_OPF_IDXOUT, FLOAT, KEEP, max_pool2d, O1, NT__SIM_NONE) \
    X(MAX_POOL2D_BWD, max_pool2d_bwd, 2, NT_KIND_BWD, 0, FLOAT, KEEP, nograd, 0, NT__SIM_NONE)

#define NT_OP_TABLE(X)                                                      \
    NT_OPS_FILL(X) NT_OPS_COPY(X) NT_OPS_UNARY(X) NT_OPS_SCALAR(X)          \
    NT_OPS_BINARY(X) NT_OPS_EW_BWD(X) NT_OPS_GRAD(X) NT_OPS_CMP(X) NT_OPS_MISC(X) NT_OPS_VIEW(X)    \
    NT_OPS_BWD(X)

typedef enum nt__op {
#define NT__OP_ENUM(ID, ...) NT_OP_##ID,
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
    unsigned flags;   /* flags | the ints column's bits */
    nt__amp_policy amp;
} nt__opinfo;

/* Unsized, so that its _Static_assert (core/optable.c) sees a missing
 * last row; tests/test_conformance.c checks every row is filled. */
extern const nt__opinfo nt__ops[];

/* The NT_OPF_PRIM field of built-in op `op` (NT__PRIM_NONE: none) */
static inline nt__prim nt__op_prim(int op)
{
    return (nt__prim)((nt__ops[op].flags >> NT__PRIM_SHIFT) & 15u);
}

/* The NT_OPF_RED recipe of built-in op `op`: false if it has none (and for
 * NT_OPF_RED_ORD, whose recipe nt__red_plan makes from the order). */
static inline bool nt__op_red(int op, int *rop, int *pre, int *fin)
{
    unsigned f = nt__ops[op].flags, r = f >> NT__RED_SHIFT;
    *rop = (int)(r & 15u), *pre = (int)((r >> 4) & 15u), *fin = (int)((r >> 8) & 15u);
    return (f & NT_OPF_REDUCTION) && !(f & NT_OPF_RED_ORD);
}

/* Info for a built-in or registered op id (NULL if unknown). */
const nt__opinfo *nt__opinfo_get(int op);

/* For a switch over ops that met an op it has no case for: fails loudly,
 * naming the op and the place, instead of computing something else. */
_Noreturn void nt__op_unhandled(const char *where, int op);

#endif
