/* core/ewise.h - the scalar definition of every elementwise op.
 *
 * One function per op of core/optable.h's unary, scalar, binary and compare
 * families.  Floating ops take and return f32 (inputs were widened exactly,
 * the result is rounded once when stored); integer forms (_i) wrap like
 * two's complement.  Every backend and the fusion engine evaluate ops through
 * these, which is what makes fused == unfused bit for bit.  Each is always
 * inlined (NT__MATH_INLINE, core/nmath.h): the evaluators' loops vectorise
 * only when the op's body is in them. */
#ifndef NT_CORE_EWISE_H
#define NT_CORE_EWISE_H

#include <stdint.h>

#include "core/nmath.h"
#include "core/optable.h"

/* ---- unary: float ---- */
NT__MATH_INLINE float nt__ew_neg(float a) { return -a; }
NT__MATH_INLINE float nt__ew_exp(float a) { return nt__expf(a); }
NT__MATH_INLINE float nt__ew_log(float a) { return nt__logf(a); }
NT__MATH_INLINE float nt__ew_sqrt(float a) { return sqrtf(a); }
NT__MATH_INLINE float nt__ew_rsqrt(float a) { return 1.0f / sqrtf(a); }
NT__MATH_INLINE float nt__ew_abs(float a) { return fabsf(a); }
/* NaN propagates; -0 and +0 both give +0 */
NT__MATH_INLINE float nt__ew_relu(float a) { return (a > 0.0f || a != a) ? a : 0.0f; }
NT__MATH_INLINE float nt__ew_gelu(float a)
{
    return 0.5f * a * (1.0f + nt__erff(a * 0.70710678118654752440f));
}
NT__MATH_INLINE float nt__ew_sigmoid(float a) { return 1.0f / (1.0f + nt__expf(-a)); }
NT__MATH_INLINE float nt__ew_tanh(float a) { return nt__tanhf(a); }
NT__MATH_INLINE float nt__ew_silu(float a) { return a * nt__ew_sigmoid(a); }
/* PyTorch's default (beta 1, threshold 20): x > 20 ? x : log1p(exp(x)).
 * log1p(u) = log(1 + u) * u / ((1 + u) - 1), exact-ish where 1 + u rounds
 * (Goldberg's trick), u itself where 1 + u == 1; NaN stays NaN. */
NT__MATH_INLINE float nt__ew_softplus(float a)
{
    float u = nt__expf(a), w = 1.0f + u;
    float l = nt__fsel(w == 1.0f, u, nt__logf(w) * (u / (w - 1.0f)));
    return nt__fsel(a > 20.0f, a, l);
}
NT__MATH_INLINE float nt__ew_mish(float a) { return a * nt__tanhf(nt__ew_softplus(a)); }
NT__MATH_INLINE float nt__ew_reciprocal(float a) { return 1.0f / a; }
/* PyTorch's x / (1 + |x|); NaN stays NaN, +-Inf gives NaN as there */
NT__MATH_INLINE float nt__ew_softsign(float a) { return a / (1.0f + fabsf(a)); }
/* PyTorch's F.gelu(x, approximate='tanh'), 0.5 x (1 + tanh(u)) with
 * u = sqrt(2/pi) (x + 0.044715 x^3), written as the same function x s(2u),
 * s the logistic function, from q = exp(-|2u|) <= 1: x / (1 + q) for u >= 0,
 * x (q / (1 + q)) below.  1 + tanh(u) cancels to 0 below about x = -4
 * (PyTorch's f32 form is off by 30% at x = -5), and exp(-2u) would overflow
 * while the result is still a subnormal; this keeps the tail.  +Inf, -Inf
 * and NaN give what PyTorch gives (Inf, NaN, NaN). */
NT__MATH_INLINE float nt__ew_gelu_tanh_2u(float a)
{
    return 2.0f * (0.79788456080286535588f * (a + 0.044715f * (a * (a * a))));
}
NT__MATH_INLINE float nt__ew_gelu_tanh(float a)
{
    float t = nt__ew_gelu_tanh_2u(a), q = nt__expf(-fabsf(t)), d = 1.0f + q;
    return nt__fsel(t >= 0.0f, a / d, a * (q / d));
}

/* issue 34.  sin, cos, log1p, expm1: core/nmath.h (exact range reduction,
 * <= 1 ulp); erf: nt__erff (<= 2 ulp).  sign: PyTorch's (0 < x) - (x < 0),
 * so NaN and -0 give +0.  floor, ceil, trunc: exact (C's); round: half to
 * even (torch.round), |x| + 2^23 - 2^23 with the sign put back (-0.4 ->
 * -0), |x| >= 2^23, Inf and NaN as they are. */
NT__MATH_INLINE float nt__ew_sin(float a) { return nt__sinf(a); }
NT__MATH_INLINE float nt__ew_cos(float a) { return nt__cosf(a); }
NT__MATH_INLINE float nt__ew_erf(float a) { return nt__erff(a); }
NT__MATH_INLINE float nt__ew_log1p(float a) { return nt__log1pf(a); }
NT__MATH_INLINE float nt__ew_expm1(float a) { return nt__expm1f(a); }
NT__MATH_INLINE float nt__ew_sign(float a) { return (float)((a > 0.0f) - (a < 0.0f)); }
NT__MATH_INLINE float nt__ew_floor(float a) { return floorf(a); }
NT__MATH_INLINE float nt__ew_ceil(float a) { return ceilf(a); }
NT__MATH_INLINE float nt__ew_trunc(float a) { return truncf(a); }
NT__MATH_INLINE float nt__ew_round(float a)
{
    float m = fabsf(a);
    return m < 0x1p23f ? copysignf((m + 0x1p23f) - 0x1p23f, a) : a;
}

/* ---- unary: derivatives, d/dx f as a function of x or of y = f(x) (the
 * save column of core/optable.h says which).  The generic backward
 * (UNARY_BWD) multiplies g by them; ops whose bwd column names a
 * specialised backward keep it (its bits predate these) ---- */
NT__MATH_INLINE float nt__ew_neg_dx(float v) { (void)v; return -1.0f; }
NT__MATH_INLINE float nt__ew_exp_dx(float y) { return y; }
NT__MATH_INLINE float nt__ew_log_dx(float x) { return 1.0f / x; }
NT__MATH_INLINE float nt__ew_sqrt_dx(float y) { return 0.5f / y; }
NT__MATH_INLINE float nt__ew_rsqrt_dx(float y) { return -0.5f * (y * (y * y)); }
NT__MATH_INLINE float nt__ew_abs_dx(float x) { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f; }
NT__MATH_INLINE float nt__ew_relu_dx(float y) { return y > 0.0f ? 1.0f : 0.0f; }
NT__MATH_INLINE float nt__ew_gelu_dx(float x)
{
    float cdf = 0.5f * (1.0f + nt__erff(x * 0.70710678118654752440f));
    float pdf = nt__expf(-0.5f * x * x) * 0.39894228040143267794f;
    return cdf + x * pdf;
}
NT__MATH_INLINE float nt__ew_sigmoid_dx(float y) { return y * (1.0f - y); }
NT__MATH_INLINE float nt__ew_tanh_dx(float y) { return 1.0f - y * y; }
NT__MATH_INLINE float nt__ew_silu_dx(float x)
{
    float s = 1.0f / (1.0f + nt__expf(-x));
    return s * (1.0f + x * (1.0f - s));
}
/* PyTorch's: z = exp(x), x > 20 ? 1 : z / (z + 1) */
NT__MATH_INLINE float nt__ew_softplus_dx(float x)
{
    float z = nt__expf(x);
    return nt__fsel(x > 20.0f, 1.0f, z / (z + 1.0f));
}
/* -1/x^2 = -y^2; g * -(y*y) has the bits of PyTorch's -g * (y*y) */
NT__MATH_INLINE float nt__ew_reciprocal_dx(float y) { return -(y * y); }
/* 1 / (1 + |x|)^2, squared after the sum is rounded */
NT__MATH_INLINE float nt__ew_softsign_dx(float x)
{
    float d = 1.0f + fabsf(x);
    return 1.0f / (d * d);
}
/* tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2), sp = softplus(x) */
NT__MATH_INLINE float nt__ew_mish_dx(float x)
{
    float t = nt__tanhf(nt__ew_softplus(x));
    return t + x * nt__ew_sigmoid(x) * (1.0f - t * t);
}
/* d/dx x s(2u) = s + 2 x s (1 - s) u', u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2),
 * s (1 - s) = q / (1 + q)^2 with q as above; PyTorch's 0.5 (1 + t) +
 * 0.5 x (1 - t^2) u' is the same function.  Where q is 0 (|x| > ~9) the
 * derivative is s (PyTorch's gives NaN past |x| ~ 1e19, where x^2 overflows). */
NT__MATH_INLINE float nt__ew_gelu_tanh_dx(float x)
{
    float t = nt__ew_gelu_tanh_2u(x), q = nt__expf(-fabsf(t)), d = 1.0f + q;
    float s = nt__fsel(t >= 0.0f, 1.0f / d, q / d), ss = (q / d) / d;
    float du = 0.79788456080286535588f * (1.0f + 0.134145f * (x * x));
    return nt__fsel(q == 0.0f, s, s + 2.0f * x * ss * du);
}

/* issue 34: sin' = cos, cos' = -sin, erf' = 2/sqrt(pi) exp(-x^2),
 * log1p' = 1 / (1 + x), expm1' = y + 1 (PyTorch's g * (y + 1)).  sign,
 * floor, ceil, round, trunc have PyTorch's zero gradient (bwd `zero`: a
 * zero tensor, not g * 0); their _dx are here for the generic tables. */
NT__MATH_INLINE float nt__ew_sin_dx(float x) { return nt__cosf(x); }
NT__MATH_INLINE float nt__ew_cos_dx(float x) { return -nt__sinf(x); }
NT__MATH_INLINE float nt__ew_erf_dx(float x) { return 1.12837916709551257390f * nt__expf(-(x * x)); }
NT__MATH_INLINE float nt__ew_log1p_dx(float x) { return 1.0f / (1.0f + x); }
NT__MATH_INLINE float nt__ew_expm1_dx(float y) { return y + 1.0f; }
NT__MATH_INLINE float nt__ew_sign_dx(float x) { (void)x; return 0.0f; }
NT__MATH_INLINE float nt__ew_floor_dx(float x) { (void)x; return 0.0f; }
NT__MATH_INLINE float nt__ew_ceil_dx(float x) { (void)x; return 0.0f; }
NT__MATH_INLINE float nt__ew_round_dx(float x) { (void)x; return 0.0f; }
NT__MATH_INLINE float nt__ew_trunc_dx(float x) { (void)x; return 0.0f; }

/* ---- unary: int (only ops whose ints column is INT or INTONLY) ---- */
NT__MATH_INLINE int32_t nt__ewi_neg(int32_t a) { return (int32_t)(0u - (uint32_t)a); }
NT__MATH_INLINE int32_t nt__ewi_abs(int32_t a) { return a < 0 ? nt__ewi_neg(a) : a; }
NT__MATH_INLINE int32_t nt__ewi_relu(int32_t a) { return a > 0 ? a : 0; }
/* integers only (ints INTONLY); a u8 result keeps the low 8 bits: 255 - a */
NT__MATH_INLINE int32_t nt__ewi_bitwise_not(int32_t a) { return (int32_t)~(uint32_t)a; }

/* issue 34: integers keep their dtype; sign = clamp(a, -1, 1), the
 * roundings are the identity */
NT__MATH_INLINE int32_t nt__ewi_sign(int32_t a) { return (a > 0) - (a < 0); }
NT__MATH_INLINE int32_t nt__ewi_floor(int32_t a) { return a; }
NT__MATH_INLINE int32_t nt__ewi_ceil(int32_t a) { return a; }
NT__MATH_INLINE int32_t nt__ewi_round(int32_t a) { return a; }
NT__MATH_INLINE int32_t nt__ewi_trunc(int32_t a) { return a; }

/* ---- tensor-scalar: s0 = p.f[0], s1 = p.f[1], already rounded to f32 ---- */
NT__MATH_INLINE float nt__ew_add_scalar(float a, float s0, float s1) { (void)s1; return a + s0; }
NT__MATH_INLINE float nt__ew_mul_scalar(float a, float s0, float s1) { (void)s1; return a * s0; }
NT__MATH_INLINE float nt__ew_div_scalar(float a, float s0, float s1) { (void)s1; return a / s0; }
NT__MATH_INLINE float nt__ew_pow_scalar(float a, float s0, float s1) { (void)s1; return nt__powf(a, s0); }
/* min(max(a, lo), hi) as the header says, also when lo > hi (every value
 * becomes hi); NaN propagates */
NT__MATH_INLINE float nt__ew_clamp(float a, float lo, float hi)
{
    float x = a < lo ? lo : a;
    return x > hi ? hi : x;
}
/* derivatives d/dx of the tensor-scalar ops (the generic backward needs one
 * per op; add/mul/div/pow/clamp keep their specialised backwards) */
NT__MATH_INLINE float nt__ew_add_scalar_dx(float x, float s0, float s1) { (void)x, (void)s0, (void)s1; return 1.0f; }
NT__MATH_INLINE float nt__ew_mul_scalar_dx(float x, float s0, float s1) { (void)x, (void)s1; return s0; }
NT__MATH_INLINE float nt__ew_div_scalar_dx(float x, float s0, float s1) { (void)x, (void)s1; return 1.0f / s0; }
NT__MATH_INLINE float nt__ew_pow_scalar_dx(float x, float s0, float s1)
{
    (void)s1;
    return s0 * nt__powf(x, s0 - 1.0f);
}
NT__MATH_INLINE float nt__ew_clamp_dx(float x, float lo, float hi) { return x >= lo && x <= hi ? 1.0f : 0.0f; }
/* PyTorch's: x > 0 ? x : x * negative_slope (NaN stays NaN, -0 * s keeps
 * its sign); gradient x > 0 ? g : g * s */
NT__MATH_INLINE float nt__ew_leaky_relu(float a, float s, float s1) { (void)s1; return a > 0.0f ? a : a * s; }
NT__MATH_INLINE float nt__ew_leaky_relu_dx(float x, float s, float s1) { (void)s1; return x > 0.0f ? 1.0f : s; }
/* PyTorch's: clamp to [lo, hi]; gradient 0 where x <= lo or x >= hi (NaN
 * passes g through, as PyTorch's mask does) */
NT__MATH_INLINE float nt__ew_hardtanh(float a, float lo, float hi) { return nt__ew_clamp(a, lo, hi); }
NT__MATH_INLINE float nt__ew_hardtanh_dx(float x, float lo, float hi) { return x <= lo || x >= hi ? 0.0f : 1.0f; }
NT__MATH_INLINE int32_t nt__ewi_add_scalar(int32_t a, int32_t s0, int32_t s1)
{
    (void)s1;
    return (int32_t)((uint32_t)a + (uint32_t)s0);
}
NT__MATH_INLINE int32_t nt__ewi_mul_scalar(int32_t a, int32_t s0, int32_t s1)
{
    (void)s1;
    return (int32_t)((uint32_t)a * (uint32_t)s0);
}
NT__MATH_INLINE int32_t nt__ewi_clamp(int32_t a, int32_t lo, int32_t hi)
{
    int32_t x = a < lo ? lo : a;
    return x > hi ? hi : x;
}

/* ---- binary: float ---- */
NT__MATH_INLINE float nt__ew_add(float a, float b) { return a + b; }
NT__MATH_INLINE float nt__ew_sub(float a, float b) { return a - b; }
NT__MATH_INLINE float nt__ew_mul(float a, float b) { return a * b; }
NT__MATH_INLINE float nt__ew_div(float a, float b) { return a / b; }
/* NaN propagates; on ties the first operand wins */
NT__MATH_INLINE float nt__ew_maximum(float a, float b)
{
    return (a != a || b != b) ? a + b : (b > a ? b : a);
}
NT__MATH_INLINE float nt__ew_minimum(float a, float b)
{
    return (a != a || b != b) ? a + b : (b < a ? b : a);
}

/* ---- backward helpers: (g, x) or (g, y) -> dL/dx ---- */
NT__MATH_INLINE float nt__ew_relu_bwd(float g, float y) { return y > 0.0f ? g : 0.0f; }
NT__MATH_INLINE float nt__ew_sigmoid_bwd(float g, float y) { return g * (y * (1.0f - y)); }
NT__MATH_INLINE float nt__ew_tanh_bwd(float g, float y) { return g * (1.0f - y * y); }
/* d/dx 0.5x(1 + erf(x/sqrt2)) = Phi(x) + x phi(x) */
NT__MATH_INLINE float nt__ew_gelu_bwd(float g, float x)
{
    float cdf = 0.5f * (1.0f + nt__erff(x * 0.70710678118654752440f));
    float pdf = nt__expf(-0.5f * x * x) * 0.39894228040143267794f;
    return g * (cdf + x * pdf);
}
/* d/dx x s(x) = s (1 + x (1 - s)) */
NT__MATH_INLINE float nt__ew_silu_bwd(float g, float x)
{
    float s = 1.0f / (1.0f + nt__expf(-x));
    return g * (s * (1.0f + x * (1.0f - s)));
}
/* a^b, the libm powf every path shares (nt__powf) */
NT__MATH_INLINE float nt__ew_pow(float a, float b) { return nt__powf(a, b); }

/* issue 34: atan2(a = y, b = x), core/nmath.h (<= 1 ulp, Annex F's signed
 * zeros and infinities); fmod: C's fmodf, exact (the sign of a, NaN for b
 * == 0 or an infinite a) */
NT__MATH_INLINE float nt__ew_atan2(float a, float b) { return nt__atan2f(a, b); }
NT__MATH_INLINE float nt__ew_fmod(float a, float b) { return fmodf(a, b); }

/* ---- binary: partial derivatives d/da, d/db (the generic backward needs
 * them for every binary op; the ops above keep their specialised
 * backwards) ---- */
NT__MATH_INLINE float nt__ew_add_da(float a, float b) { (void)a, (void)b; return 1.0f; }
NT__MATH_INLINE float nt__ew_add_db(float a, float b) { (void)a, (void)b; return 1.0f; }
NT__MATH_INLINE float nt__ew_sub_da(float a, float b) { (void)a, (void)b; return 1.0f; }
NT__MATH_INLINE float nt__ew_sub_db(float a, float b) { (void)a, (void)b; return -1.0f; }
NT__MATH_INLINE float nt__ew_mul_da(float a, float b) { (void)a; return b; }
NT__MATH_INLINE float nt__ew_mul_db(float a, float b) { (void)b; return a; }
NT__MATH_INLINE float nt__ew_div_da(float a, float b) { (void)a; return 1.0f / b; }
NT__MATH_INLINE float nt__ew_div_db(float a, float b) { return -(a / b) / b; }
/* ties go to the first operand, as the forward picks it */
NT__MATH_INLINE float nt__ew_maximum_da(float a, float b) { return a >= b ? 1.0f : 0.0f; }
NT__MATH_INLINE float nt__ew_maximum_db(float a, float b) { return a >= b ? 0.0f : 1.0f; }
NT__MATH_INLINE float nt__ew_minimum_da(float a, float b) { return a <= b ? 1.0f : 0.0f; }
NT__MATH_INLINE float nt__ew_minimum_db(float a, float b) { return a <= b ? 0.0f : 1.0f; }
/* PyTorch's: b a^(b-1), 0 where b == 0; a^b log(a), 0 where a == 0 and
 * b >= 0 */
NT__MATH_INLINE float nt__ew_pow_da(float a, float b) { return b == 0.0f ? 0.0f : b * nt__powf(a, b - 1.0f); }
NT__MATH_INLINE float nt__ew_pow_db(float a, float b)
{
    return a == 0.0f && b >= 0.0f ? 0.0f : nt__powf(a, b) * nt__logf(a);
}

/* d/da atan2(a, b) = b / (a^2 + b^2), d/db = -a / (a^2 + b^2), each as
 * (+-operand) * (1 / (a^2 + b^2)) like PyTorch's grad * other * recip;
 * fmod: d/da = 1, d/db = -trunc(a / b) (PyTorch's) */
NT__MATH_INLINE float nt__ew_atan2_da(float a, float b) { return b * (1.0f / (a * a + b * b)); }
NT__MATH_INLINE float nt__ew_atan2_db(float a, float b) { return -a * (1.0f / (a * a + b * b)); }
NT__MATH_INLINE float nt__ew_fmod_da(float a, float b) { (void)a, (void)b; return 1.0f; }
NT__MATH_INLINE float nt__ew_fmod_db(float a, float b) { return -truncf(a / b); }

/* ---- binary: int ---- */
NT__MATH_INLINE int32_t nt__ewi_add(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
NT__MATH_INLINE int32_t nt__ewi_sub(int32_t a, int32_t b) { return (int32_t)((uint32_t)a - (uint32_t)b); }
NT__MATH_INLINE int32_t nt__ewi_mul(int32_t a, int32_t b) { return (int32_t)((uint32_t)a * (uint32_t)b); }
NT__MATH_INLINE int32_t nt__ewi_maximum(int32_t a, int32_t b) { return b > a ? b : a; }
NT__MATH_INLINE int32_t nt__ewi_minimum(int32_t a, int32_t b) { return b < a ? b : a; }
/* C's %: the sign of a.  A divisor of 0 gives 0 (PyTorch raises
 * ZeroDivisionError on the CPU; a data-dependent error would need a sync
 * here), and INT_MIN % -1 gives 0 */
NT__MATH_INLINE int32_t nt__ewi_fmod(int32_t a, int32_t b) { return b == 0 || b == -1 ? 0 : a % b; }

/* ---- compare (result 0/1) ---- */
NT__MATH_INLINE int nt__ew_eq(float a, float b) { return a == b; }
NT__MATH_INLINE int nt__ew_ne(float a, float b) { return a != b; }
NT__MATH_INLINE int nt__ew_lt(float a, float b) { return a < b; }
NT__MATH_INLINE int nt__ew_le(float a, float b) { return a <= b; }
NT__MATH_INLINE int nt__ew_gt(float a, float b) { return a > b; }
NT__MATH_INLINE int nt__ew_ge(float a, float b) { return a >= b; }
NT__MATH_INLINE int nt__ewi_eq(int32_t a, int32_t b) { return a == b; }
NT__MATH_INLINE int nt__ewi_ne(int32_t a, int32_t b) { return a != b; }
NT__MATH_INLINE int nt__ewi_lt(int32_t a, int32_t b) { return a < b; }
NT__MATH_INLINE int nt__ewi_le(int32_t a, int32_t b) { return a <= b; }
NT__MATH_INLINE int nt__ewi_gt(int32_t a, int32_t b) { return a > b; }
NT__MATH_INLINE int nt__ewi_ge(int32_t a, int32_t b) { return a >= b; }

/* ---- the families by op id, expanded from core/optable.h.  Evaluators
 * that run an op through one entry point (the CPU's generic backward and
 * fused executor) use these; an op id outside the family stops with its
 * name (nt__op_unhandled), never computes something else.  The simulator
 * has no such entry point: its kernels lower each op to instructions of
 * the NKI ISA (neuron/ew.c). ---- */
/* A float unary or tensor-scalar op's derivative by id: f'(v) (v = x or y,
 * per the op's save column) */
NT__MATH_INLINE float nt__ew_table_dx(int op, float v, float s0, float s1)
{
    (void)s0, (void)s1;
    switch (op) {
#define NT__EWD(ID, name, nin, kind, flags, ints, ...)                                      \
    NT__IF_FLOAT(ints, case NT_OP_##ID: return nt__ew_##name##_dx(v);)
        NT_OPS_UNARY(NT__EWD)
#undef NT__EWD
#define NT__EWSD(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_FLOAT(ints, case NT_OP_##ID: return nt__ew_##name##_dx(v, s0, s1);)
        NT_OPS_SCALAR(NT__EWSD)
#undef NT__EWSD
    default: nt__op_unhandled("nt__ew_table_dx", op);
    }
}

/* UNARY_BWD: g * f'(v) for the forward op f (p.i[0]) with its scalars
 * (p.f[0], p.f[1]) */
NT__MATH_INLINE float nt__ew_unary_bwd(int op, float g, float v, float s0, float s1)
{
    return g * nt__ew_table_dx(op, v, s0, s1);
}

/* A float binary op's partial derivative by id (which 0: d/da, 1: d/db) */
NT__MATH_INLINE float nt__ew_binary_dx(int op, int which, float a, float b)
{
    switch (op) {
#define NT__EWBD(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_FLOAT(ints, case NT_OP_##ID: return which ? nt__ew_##name##_db(a, b)            \
                                                     : nt__ew_##name##_da(a, b);)
        NT_OPS_BINARY(NT__EWBD)
#undef NT__EWBD
    default: nt__op_unhandled("nt__ew_binary_dx", op);
    }
}

NT__MATH_INLINE int32_t nt__ewi_unary(int op, int32_t a)
{
    switch (op) {
#define NT__EWIU(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_INT(ints, case NT_OP_##ID: return nt__ewi_##name(a);)
        NT_OPS_UNARY(NT__EWIU)
#undef NT__EWIU
    default: nt__op_unhandled("nt__ewi_unary", op);
    }
}

NT__MATH_INLINE int32_t nt__ewi_scalar(int op, int32_t a, int32_t s0, int32_t s1)
{
    switch (op) {
#define NT__EWIS(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_INT(ints, case NT_OP_##ID: return nt__ewi_##name(a, s0, s1);)
        NT_OPS_SCALAR(NT__EWIS)
#undef NT__EWIS
    default: nt__op_unhandled("nt__ewi_scalar", op);
    }
}

NT__MATH_INLINE int32_t nt__ewi_binary(int op, int32_t a, int32_t b)
{
    switch (op) {
#define NT__EWIB(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_INT(ints, case NT_OP_##ID: return nt__ewi_##name(a, b);)
        NT_OPS_BINARY(NT__EWIB)
#undef NT__EWIB
    default: nt__op_unhandled("nt__ewi_binary", op);
    }
}

#endif
