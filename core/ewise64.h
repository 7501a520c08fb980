/* core/ewise64.h - the binary64 definitions of the elementwise ops that take
 * NT_F64 tensors, and which ops those are.
 *
 * An f64 op computes in double: inputs are widened exactly (bf16, f16, f32,
 * i32, u8 all fit), the op below is evaluated in IEEE double (no FMA,
 * -ffp-contract=off), and the result is rounded once into the output's
 * dtype (core/dtype.h nt__store_f64).  Scalars (p.f) are used as the doubles
 * the caller passed, not rounded to f32 first.  The formulas are those of
 * core/ewise.h written in double; the transcendentals are core/nmath.h's
 * binary64 wrappers of the C library.
 *
 * Which ops take f64 (nt__f64_op_ok) is listed here, not implied: an op
 * outside the lists refuses an f64 operand with NT_ENOTSUP naming the
 * function and the argument (dispatcher/dispatch.c), so a new op is never
 * run on f64 data by an f32 kernel.  Adding one: its row in the list of its
 * family and its nt__ew64_ function(s); docs/ops.md "Dtypes". */
#ifndef NT_CORE_EWISE64_H
#define NT_CORE_EWISE64_H

#include <stdbool.h>
#include <stdint.h>

#include "core/nmath.h"
#include "core/optable.h"

/* ---- which ops take f64: X(ID, name) ---- */
#define NT_F64_UNARY(X)                                                                    \
    X(NEG, neg) X(EXP, exp) X(LOG, log) X(SQRT, sqrt) X(RSQRT, rsqrt) X(ABS, abs)          \
    X(RELU, relu) X(GELU, gelu) X(SIGMOID, sigmoid) X(TANH, tanh) X(SILU, silu)            \
    X(SOFTPLUS, softplus) X(MISH, mish) X(SOFTSIGN, softsign) X(RECIPROCAL, reciprocal)    \
    X(GELU_TANH, gelu_tanh) X(SIN, sin) X(COS, cos) X(ERF, erf) X(LOG1P, log1p)            \
    X(EXPM1, expm1) X(SIGN, sign) X(FLOOR, floor) X(CEIL, ceil) X(ROUND, round)            \
    X(TRUNC, trunc)
#define NT_F64_SCALAR(X)                                                                   \
    X(ADD_SCALAR, add_scalar) X(MUL_SCALAR, mul_scalar) X(DIV_SCALAR, div_scalar)          \
    X(POW_SCALAR, pow_scalar) X(CLAMP, clamp) X(LEAKY_RELU, leaky_relu)                    \
    X(HARDTANH, hardtanh)
#define NT_F64_BINARY(X)                                                                   \
    X(ADD, add) X(SUB, sub) X(MUL, mul) X(DIV, div) X(MAXIMUM, maximum)                    \
    X(MINIMUM, minimum) X(POW, pow) X(ATAN2, atan2) X(FMOD, fmod)
#define NT_F64_EW_BWD(X)                                                                   \
    X(RELU_BWD, relu_bwd) X(GELU_BWD, gelu_bwd) X(SILU_BWD, silu_bwd)                      \
    X(SIGMOID_BWD, sigmoid_bwd) X(TANH_BWD, tanh_bwd)
/* ops with their own f64 kernels (cpu/ewise.c, cpu/reduce.c, cpu/matmul.c)
 * or none (views); the compare family is listed whole */
#define NT_F64_OTHER(X)                                                                    \
    X(FILL, fill) X(ARANGE, arange) X(RAND, rand) X(RANDN, randn) X(COPY, copy)            \
    X(CAST, cast) X(UNARY_BWD, unary_bwd) X(BINARY_DX, binary_dx) X(EQ, eq) X(NE, ne)      \
    X(LT, lt) X(LE, le) X(GT, gt) X(GE, ge) X(WHERE, where) X(TRIL, tril) X(TRIU, triu)    \
    X(MASKED_FILL, masked_fill) X(SUM, sum) X(MEAN, mean) X(MAX, max) X(MIN, min)          \
    X(ARGMAX, argmax) X(ARGMIN, argmin) X(AMAX, amax) X(AMIN, amin) X(MATMUL, matmul)      \
    X(RESHAPE, reshape) X(TRANSPOSE, transpose) X(PERMUTE, permute) X(SLICE, slice)        \
    X(EXPAND, expand) X(ALIAS, alias) X(CAT, cat) X(DIAGONAL, diagonal)

/* true: op runs on f64 operands (built-in ops only) */
static inline bool nt__f64_op_ok(int op)
{
    switch (op) {
#define NT__F64_CASE(ID, name) case NT_OP_##ID:
        NT_F64_UNARY(NT__F64_CASE)
        NT_F64_SCALAR(NT__F64_CASE)
        NT_F64_BINARY(NT__F64_CASE)
        NT_F64_EW_BWD(NT__F64_CASE)
        NT_F64_OTHER(NT__F64_CASE)
#undef NT__F64_CASE
        return true;
    default: return false;
    }
}

/* the reductions that take i64 and bool (cpu/reduce.c reduce_i64) */
#define NT_INT64_RED_OPS(X)                                                                \
    X(SUM, sum) X(MAX, max) X(MIN, min) X(ARGMAX, argmax) X(ARGMIN, argmin) X(ANY, any)    \
    X(AMAX, amax) X(AMIN, amin)
/* i64 (integer math in int64, wrapping; cpu/ewise.c) and bool (0/1 in the
 * i32 path, stored as v != 0): the ops that take them anywhere */
#define NT_I64_OPS(X)                                                                      \
    X(FILL, fill) X(ARANGE, arange) X(COPY, copy) X(CAST, cast) X(NEG, neg) X(ABS, abs)    \
    X(RELU, relu) X(SIGN, sign) X(FLOOR, floor) X(CEIL, ceil) X(ROUND, round)              \
    X(TRUNC, trunc) X(ADD_SCALAR, add_scalar) X(MUL_SCALAR, mul_scalar) X(CLAMP, clamp)    \
    X(ADD, add) X(SUB, sub) X(MUL, mul) X(DIV, div) X(MAXIMUM, maximum)                    \
    X(MINIMUM, minimum) X(EQ, eq) X(NE, ne) X(LT, lt) X(LE, le) X(GT, gt) X(GE, ge)        \
    X(WHERE, where) X(TRIL, tril) X(TRIU, triu) X(MASKED_FILL, masked_fill)                \
    X(RESHAPE, reshape) X(TRANSPOSE, transpose) X(PERMUTE, permute) X(SLICE, slice)        \
    X(EXPAND, expand) X(ALIAS, alias) X(CAT, cat) X(DIAGONAL, diagonal)                  \
    NT_INT64_RED_OPS(X)
/* ops whose input 1 is an index: i64 there is read with saturation to i32
 * (core/dtype.h nt__i64_to_i32_sat), so a value outside i32 is out of range */
#define NT_I64_INDEX_OPS(X)                                                                \
    X(GATHER, gather) X(INDEX_SELECT, index_select) X(EMBEDDING, embedding)                \
    X(CROSS_ENTROPY, cross_entropy) X(SCATTER, scatter) X(SCATTER_ADD, scatter_add)        \
    X(INDEX_ADD, index_add) X(EMBEDDING_BWD, embedding_bwd)
#define NT_BOOL_OPS(X)                                                                     \
    X(FILL, fill) X(COPY, copy) X(CAST, cast) X(ADD, add) X(MUL, mul) X(MAXIMUM, maximum)  \
    X(MINIMUM, minimum) X(EQ, eq) X(NE, ne) X(WHERE, where) X(TRIL, tril) X(TRIU, triu)    \
    X(MASKED_FILL, masked_fill) X(RESHAPE, reshape) X(TRANSPOSE, transpose)                \
    X(PERMUTE, permute) X(SLICE, slice) X(EXPAND, expand) X(ALIAS, alias) X(CAT, cat)      \
    X(DIAGONAL, diagonal) NT_INT64_RED_OPS(X)

/* fp8 (e4m3, e5m2) is a storage dtype: made (fill), cast and copied
 * (round to nearest even or stochastic rounding, core/dtype.h), viewed,
 * concatenated, and multiplied by nt_matmul_fp8 (a MATMUL record with fp8
 * operands and an f32 result).  Every other op refuses it by name; cast to
 * f32 or bf16 first (docs/ops.md "fp8"). */
#define NT_FP8_OPS(X)                                                                      \
    X(FILL, fill) X(COPY, copy) X(CAST, cast) X(RESHAPE, reshape) X(TRANSPOSE, transpose)  \
    X(PERMUTE, permute) X(SLICE, slice) X(EXPAND, expand) X(ALIAS, alias) X(CAT, cat)      \
    X(DIAGONAL, diagonal)
/* ops whose inputs 0 and 1 may be fp8 (the result is not) */
#define NT_FP8_OPERAND_OPS(X) X(MATMUL, matmul)

/* true: built-in op `op` takes dtype dt at input `pos` (-1: its result).
 * Every op takes every dtype the device has but fp8 (nt__dtype_all_ops):
 * the dispatcher looks here only for an off-device or fp8 operand. */
static inline bool nt__dtype_op_ok(nt_dtype dt, int op, int pos)
{
#define NT__OK_CASE(ID, name) case NT_OP_##ID:
    switch (dt) {
    case NT_F64: return nt__f64_op_ok(op);
    case NT_I64:
        switch (op) {
            NT_I64_OPS(NT__OK_CASE)
            return true;
            NT_I64_INDEX_OPS(NT__OK_CASE)
            return pos == 1;
        default: return false;
        }
    case NT_BOOL:
        switch (op) {
            NT_BOOL_OPS(NT__OK_CASE)
            return true;
        default: return false;
        }
    case NT_E4M3:
    case NT_E5M2:
        switch (op) {
            NT_FP8_OPS(NT__OK_CASE)
            return true;
            NT_FP8_OPERAND_OPS(NT__OK_CASE)
            return pos == 0 || pos == 1;
        default: return false;
        }
    default: return true;
    }
#undef NT__OK_CASE
}

#define NT__SQRT1_2 0.70710678118654752440
#define NT__SQRT2PI_INV 0.39894228040143267794
#define NT__SQRT_2_PI 0.79788456080286535588

/* ---- unary ---- */
static inline double nt__ew64_neg(double a) { return -a; }
static inline double nt__ew64_exp(double a) { return nt__exp64(a); }
static inline double nt__ew64_log(double a) { return nt__log64(a); }
static inline double nt__ew64_sqrt(double a) { return sqrt(a); }
static inline double nt__ew64_rsqrt(double a) { return 1.0 / sqrt(a); }
static inline double nt__ew64_abs(double a) { return fabs(a); }
static inline double nt__ew64_relu(double a) { return (a > 0.0 || a != a) ? a : 0.0; }
static inline double nt__ew64_gelu(double a) { return 0.5 * a * (1.0 + nt__erf64(a * NT__SQRT1_2)); }
static inline double nt__ew64_sigmoid(double a) { return 1.0 / (1.0 + nt__exp64(-a)); }
static inline double nt__ew64_tanh(double a) { return nt__tanh64(a); }
static inline double nt__ew64_silu(double a) { return a * nt__ew64_sigmoid(a); }
/* PyTorch's (beta 1, threshold 20) */
static inline double nt__ew64_softplus(double a) { return a > 20.0 ? a : nt__log1p64(nt__exp64(a)); }
static inline double nt__ew64_mish(double a) { return a * nt__tanh64(nt__ew64_softplus(a)); }
static inline double nt__ew64_softsign(double a) { return a / (1.0 + fabs(a)); }
static inline double nt__ew64_reciprocal(double a) { return 1.0 / a; }
/* core/ewise.h's form: x s(2u) from q = exp(-|2u|) */
static inline double nt__ew64_gelu_tanh_2u(double a)
{
    return 2.0 * (NT__SQRT_2_PI * (a + 0.044715 * (a * (a * a))));
}
static inline double nt__ew64_gelu_tanh(double a)
{
    double t = nt__ew64_gelu_tanh_2u(a), q = nt__exp64(-fabs(t)), d = 1.0 + q;
    return t >= 0.0 ? a / d : a * (q / d);
}
static inline double nt__ew64_sin(double a) { return nt__sin64(a); }
static inline double nt__ew64_cos(double a) { return nt__cos64(a); }
static inline double nt__ew64_erf(double a) { return nt__erf64(a); }
static inline double nt__ew64_log1p(double a) { return nt__log1p64(a); }
static inline double nt__ew64_expm1(double a) { return nt__expm164(a); }
static inline double nt__ew64_sign(double a) { return (double)((a > 0.0) - (a < 0.0)); }
static inline double nt__ew64_floor(double a) { return floor(a); }
static inline double nt__ew64_ceil(double a) { return ceil(a); }
static inline double nt__ew64_trunc(double a) { return trunc(a); }
/* half to even, as torch.round */
static inline double nt__ew64_round(double a)
{
    double m = fabs(a);
    return m < 0x1p52 ? copysign((m + 0x1p52) - 0x1p52, a) : a;
}

/* ---- unary derivatives, of x or y per the op's save column ---- */
static inline double nt__ew64_neg_dx(double v) { (void)v; return -1.0; }
static inline double nt__ew64_exp_dx(double y) { return y; }
static inline double nt__ew64_log_dx(double x) { return 1.0 / x; }
static inline double nt__ew64_sqrt_dx(double y) { return 0.5 / y; }
static inline double nt__ew64_rsqrt_dx(double y) { return -0.5 * (y * (y * y)); }
static inline double nt__ew64_abs_dx(double x) { return x > 0.0 ? 1.0 : x < 0.0 ? -1.0 : 0.0; }
static inline double nt__ew64_relu_dx(double y) { return y > 0.0 ? 1.0 : 0.0; }
static inline double nt__ew64_gelu_dx(double x)
{
    double cdf = 0.5 * (1.0 + nt__erf64(x * NT__SQRT1_2));
    double pdf = nt__exp64(-0.5 * x * x) * NT__SQRT2PI_INV;
    return cdf + x * pdf;
}
static inline double nt__ew64_sigmoid_dx(double y) { return y * (1.0 - y); }
static inline double nt__ew64_tanh_dx(double y) { return 1.0 - y * y; }
static inline double nt__ew64_silu_dx(double x)
{
    double s = 1.0 / (1.0 + nt__exp64(-x));
    return s * (1.0 + x * (1.0 - s));
}
static inline double nt__ew64_softplus_dx(double x)
{
    double z = nt__exp64(x);
    return x > 20.0 ? 1.0 : z / (z + 1.0);
}
static inline double nt__ew64_reciprocal_dx(double y) { return -(y * y); }
static inline double nt__ew64_softsign_dx(double x)
{
    double d = 1.0 + fabs(x);
    return 1.0 / (d * d);
}
static inline double nt__ew64_mish_dx(double x)
{
    double t = nt__tanh64(nt__ew64_softplus(x));
    return t + x * nt__ew64_sigmoid(x) * (1.0 - t * t);
}
static inline double nt__ew64_gelu_tanh_dx(double x)
{
    double t = nt__ew64_gelu_tanh_2u(x), q = nt__exp64(-fabs(t)), d = 1.0 + q;
    double s = t >= 0.0 ? 1.0 / d : q / d, ss = (q / d) / d;
    double du = NT__SQRT_2_PI * (1.0 + 0.134145 * (x * x));
    return q == 0.0 ? s : s + 2.0 * x * ss * du;
}
static inline double nt__ew64_sin_dx(double x) { return nt__cos64(x); }
static inline double nt__ew64_cos_dx(double x) { return -nt__sin64(x); }
static inline double nt__ew64_erf_dx(double x) { return 1.12837916709551257390 * nt__exp64(-(x * x)); }
static inline double nt__ew64_log1p_dx(double x) { return 1.0 / (1.0 + x); }
static inline double nt__ew64_expm1_dx(double y) { return y + 1.0; }
static inline double nt__ew64_sign_dx(double x) { (void)x; return 0.0; }
static inline double nt__ew64_floor_dx(double x) { (void)x; return 0.0; }
static inline double nt__ew64_ceil_dx(double x) { (void)x; return 0.0; }
static inline double nt__ew64_round_dx(double x) { (void)x; return 0.0; }
static inline double nt__ew64_trunc_dx(double x) { (void)x; return 0.0; }

/* ---- tensor-scalar ---- */
static inline double nt__ew64_add_scalar(double a, double s0, double s1) { (void)s1; return a + s0; }
static inline double nt__ew64_mul_scalar(double a, double s0, double s1) { (void)s1; return a * s0; }
static inline double nt__ew64_div_scalar(double a, double s0, double s1) { (void)s1; return a / s0; }
static inline double nt__ew64_pow_scalar(double a, double s0, double s1) { (void)s1; return nt__pow64(a, s0); }
static inline double nt__ew64_clamp(double a, double lo, double hi)
{
    double x = a < lo ? lo : a;
    return x > hi ? hi : x;
}
static inline double nt__ew64_leaky_relu(double a, double s, double s1) { (void)s1; return a > 0.0 ? a : a * s; }
static inline double nt__ew64_hardtanh(double a, double lo, double hi) { return nt__ew64_clamp(a, lo, hi); }
static inline double nt__ew64_add_scalar_dx(double x, double s0, double s1) { (void)x, (void)s0, (void)s1; return 1.0; }
static inline double nt__ew64_mul_scalar_dx(double x, double s0, double s1) { (void)x, (void)s1; return s0; }
static inline double nt__ew64_div_scalar_dx(double x, double s0, double s1) { (void)x, (void)s1; return 1.0 / s0; }
static inline double nt__ew64_pow_scalar_dx(double x, double s0, double s1)
{
    (void)s1;
    return s0 * nt__pow64(x, s0 - 1.0);
}
static inline double nt__ew64_clamp_dx(double x, double lo, double hi) { return x >= lo && x <= hi ? 1.0 : 0.0; }
static inline double nt__ew64_leaky_relu_dx(double x, double s, double s1) { (void)s1; return x > 0.0 ? 1.0 : s; }
static inline double nt__ew64_hardtanh_dx(double x, double lo, double hi) { return x <= lo || x >= hi ? 0.0 : 1.0; }

/* ---- binary ---- */
static inline double nt__ew64_add(double a, double b) { return a + b; }
static inline double nt__ew64_sub(double a, double b) { return a - b; }
static inline double nt__ew64_mul(double a, double b) { return a * b; }
static inline double nt__ew64_div(double a, double b) { return a / b; }
static inline double nt__ew64_maximum(double a, double b) { return (a != a || b != b) ? a + b : (b > a ? b : a); }
static inline double nt__ew64_minimum(double a, double b) { return (a != a || b != b) ? a + b : (b < a ? b : a); }
static inline double nt__ew64_pow(double a, double b) { return nt__pow64(a, b); }
static inline double nt__ew64_atan2(double a, double b) { return nt__atan264(a, b); }
static inline double nt__ew64_fmod(double a, double b) { return fmod(a, b); }
static inline double nt__ew64_add_da(double a, double b) { (void)a, (void)b; return 1.0; }
static inline double nt__ew64_add_db(double a, double b) { (void)a, (void)b; return 1.0; }
static inline double nt__ew64_sub_da(double a, double b) { (void)a, (void)b; return 1.0; }
static inline double nt__ew64_sub_db(double a, double b) { (void)a, (void)b; return -1.0; }
static inline double nt__ew64_mul_da(double a, double b) { (void)a; return b; }
static inline double nt__ew64_mul_db(double a, double b) { (void)b; return a; }
static inline double nt__ew64_div_da(double a, double b) { (void)a; return 1.0 / b; }
static inline double nt__ew64_div_db(double a, double b) { return -(a / b) / b; }
static inline double nt__ew64_maximum_da(double a, double b) { return a >= b ? 1.0 : 0.0; }
static inline double nt__ew64_maximum_db(double a, double b) { return a >= b ? 0.0 : 1.0; }
static inline double nt__ew64_minimum_da(double a, double b) { return a <= b ? 1.0 : 0.0; }
static inline double nt__ew64_minimum_db(double a, double b) { return a <= b ? 0.0 : 1.0; }
static inline double nt__ew64_pow_da(double a, double b) { return b == 0.0 ? 0.0 : b * nt__pow64(a, b - 1.0); }
static inline double nt__ew64_pow_db(double a, double b)
{
    return a == 0.0 && b >= 0.0 ? 0.0 : nt__pow64(a, b) * nt__log64(a);
}
static inline double nt__ew64_atan2_da(double a, double b) { return b * (1.0 / (a * a + b * b)); }
static inline double nt__ew64_atan2_db(double a, double b) { return -a * (1.0 / (a * a + b * b)); }
static inline double nt__ew64_fmod_da(double a, double b) { (void)a, (void)b; return 1.0; }
static inline double nt__ew64_fmod_db(double a, double b) { return -trunc(a / b); }

/* ---- backward helpers (g, x-or-y) ---- */
static inline double nt__ew64_relu_bwd(double g, double y) { return y > 0.0 ? g : 0.0; }
static inline double nt__ew64_sigmoid_bwd(double g, double y) { return g * (y * (1.0 - y)); }
static inline double nt__ew64_tanh_bwd(double g, double y) { return g * (1.0 - y * y); }
static inline double nt__ew64_gelu_bwd(double g, double x) { return g * nt__ew64_gelu_dx(x); }
static inline double nt__ew64_silu_bwd(double g, double x) { return g * nt__ew64_silu_dx(x); }

/* ---- by op id (an op outside the lists stops with its name) ---- */
static inline double nt__ew64_unary(int op, double a)
{
    switch (op) {
#define NT__E64U(ID, name) case NT_OP_##ID: return nt__ew64_##name(a);
        NT_F64_UNARY(NT__E64U)
#undef NT__E64U
    default: nt__op_unhandled("nt__ew64_unary", op);
    }
}

static inline double nt__ew64_scalar(int op, double a, double s0, double s1)
{
    switch (op) {
#define NT__E64S(ID, name) case NT_OP_##ID: return nt__ew64_##name(a, s0, s1);
        NT_F64_SCALAR(NT__E64S)
#undef NT__E64S
    default: nt__op_unhandled("nt__ew64_scalar", op);
    }
}

/* f'(v) of a unary or tensor-scalar op (UNARY_BWD multiplies g by it) */
static inline double nt__ew64_table_dx(int op, double v, double s0, double s1)
{
    switch (op) {
#define NT__E64D(ID, name) case NT_OP_##ID: return nt__ew64_##name##_dx(v);
        NT_F64_UNARY(NT__E64D)
#undef NT__E64D
#define NT__E64SD(ID, name) case NT_OP_##ID: return nt__ew64_##name##_dx(v, s0, s1);
        NT_F64_SCALAR(NT__E64SD)
#undef NT__E64SD
    default: nt__op_unhandled("nt__ew64_table_dx", op);
    }
}

static inline double nt__ew64_binary_dx(int op, int which, double a, double b)
{
    switch (op) {
#define NT__E64BD(ID, name)                                                                \
    case NT_OP_##ID: return which ? nt__ew64_##name##_db(a, b) : nt__ew64_##name##_da(a, b);
        NT_F64_BINARY(NT__E64BD)
#undef NT__E64BD
    default: nt__op_unhandled("nt__ew64_binary_dx", op);
    }
}

/* binary, backward helpers, UNARY_BWD and BINARY_DX (p: the record's
 * forward op and scalars) */
static inline double nt__ew64_binary(int op, double a, double b, const int64_t *pi,
                                     const double *pf)
{
    switch (op) {
#define NT__E64B(ID, name) case NT_OP_##ID: return nt__ew64_##name(a, b);
        NT_F64_BINARY(NT__E64B)
        NT_F64_EW_BWD(NT__E64B)
#undef NT__E64B
    case NT_OP_UNARY_BWD: return a * nt__ew64_table_dx((int)pi[0], b, pf[0], pf[1]);
    case NT_OP_BINARY_DX: return nt__ew64_binary_dx((int)pi[0], (int)pi[1], a, b);
    default: nt__op_unhandled("nt__ew64_binary", op);
    }
}

static inline int nt__ew64_cmp(int op, double a, double b)
{
    switch (op) {
    case NT_OP_EQ: return a == b;
    case NT_OP_NE: return a != b;
    case NT_OP_LT: return a < b;
    case NT_OP_LE: return a <= b;
    case NT_OP_GT: return a > b;
    case NT_OP_GE: return a >= b;
    default: nt__op_unhandled("nt__ew64_cmp", op);
    }
}

#endif
