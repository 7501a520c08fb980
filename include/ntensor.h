/*
 * ntensor.h - the one public header of ntensor, an adaptive eager execution
 * runtime for C training programs.
 *
 * Conventions that hold for every function below unless its comment says
 * otherwise:
 *
 * Ownership.  A function that returns `nt_tensor *` returns a NEW reference.
 *   If a scope is open on the calling thread (nt_scope_begin), that reference
 *   belongs to the innermost scope and is released at nt_scope_end unless the
 *   caller moves it out with nt_keep().  Otherwise the caller owns it and
 *   releases it with nt_release().  Tensor arguments are BORROWED: the callee
 *   takes whatever internal references it needs.
 *
 * Errors.  Ops return NULL and set the calling thread's error (code, message
 *   naming the function, the argument and what was expected, and the caller's
 *   file:line).  A NULL tensor argument makes an op return NULL and keep the
 *   first error, so `nt_relu(nt_add(a, b))` needs one check at the end.
 *   int-returning functions return 0 on success or a negative NT_E* code.
 *
 * Shapes.  Sizes are >= 0 and a tensor has at most 2^48 elements (counting
 *   a size-0 dim as 1, so strides and byte counts can never overflow).  A
 *   shape argument outside that is NT_EINVAL naming it; an op whose result
 *   would be (a broadcast, matmul or cat of huge expanded views) is
 *   NT_ESHAPE.  Within the bound, a result that does not fit the device
 *   memory is NT_ENOMEM.
 *   An error raised later, while a queued op executes, poisons that op's
 *   outputs and is returned by the next sync point that touches them; its
 *   message names the op and the file:line that enqueued it.
 *
 * Asynchrony.  Ops validate their arguments, infer the result's shape and
 *   dtype, enqueue the work on the calling thread's current stream and return
 *   at once.  Metadata queries never wait.  Only the sync points nt_to_host,
 *   nt_item, nt_print, nt_format, nt_sync (and stream/event synchronisation)
 *   wait, and only for the work they need.
 *
 * Threads.  Every function is thread-safe.  Several threads may read the same
 *   tensor at once; writing a tensor (the _inplace ops, nt_copy_into) while
 *   another thread's stream reads it needs an event (nt_event_record /
 *   nt_stream_wait_event) to be ordered.  Errors, scopes, no-grad regions,
 *   autocast regions and the current stream are per thread.
 *
 * Call sites.  In C, every op and sync point is also a macro that passes the
 *   caller's __FILE__, __LINE__ and __func__ (see "Call-site capture" at the
 *   end) so that errors, the fusion log and traces name the user's line.
 *   Define NT_NO_SITE_MACROS before including this header to get plain
 *   function calls only (then the return address stands in for the site).
 */
#ifndef NTENSOR_H
#define NTENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(NT_BUILDING_LIBRARY) && defined(__GNUC__)
#define NT_API __attribute__((visibility("default")))
#else
#define NT_API
#endif

#define NT_VERSION_MAJOR 0
#define NT_VERSION_MINOR 1
#define NT_VERSION_PATCH 0

/** Most dimensions a tensor can have. */
#define NT_MAX_DIMS 8

/** Pass as `dim` to a reduction to reduce over every dim (result is 0-d). */
#define NT_DIM_ALL (-1000)

/* ------------------------------------------------------------------------ */
/* Error codes                                                              */
/* ------------------------------------------------------------------------ */

/* X(name, value, description).  Codes are negative; 0 is success.
 * NT_ENOMEM is the device (the simulated HBM) full; NT_EHOSTMEM is the
 * host's memory (malloc) exhausted.  Neither aborts the process: the call
 * fails cleanly, and the runtime works again once memory is available. */
#define NT_ERRNO_MAP(X)                                                     \
    X(EINVAL, -1, "invalid argument")                                       \
    X(ENOMEM, -2, "out of device memory")                                   \
    X(ESHAPE, -3, "shape mismatch")                                         \
    X(EDTYPE, -4, "unsupported dtype")                                      \
    X(EDIM, -5, "dimension out of range")                                   \
    X(ERELEASED, -6, "use of a released tensor")                            \
    X(ENOTSUP, -7, "operation not supported")                               \
    X(EEXEC, -8, "kernel execution failed")                                 \
    X(ESTATE, -9, "invalid state")                                          \
    X(EIO, -10, "input/output error")                                       \
    X(ERANGE, -11, "value out of range")                                    \
    X(ESIM, -12, "simulator constraint violated")                           \
    X(ENAN, -13, "NaN or Inf produced")                                     \
    X(EVERSION, -14, "tensor modified in place after it was saved")         \
    X(EFORMAT, -15, "malformed file")                                      \
    X(EHOSTMEM, -16, "out of host memory")

typedef enum nt_error {
    NT_OK = 0,
#define NT__ERR_ENUM(name, val, desc) NT_##name = (val),
    NT_ERRNO_MAP(NT__ERR_ENUM)
#undef NT__ERR_ENUM
} nt_error;

/** Code of the calling thread's last error (0 if none).  Thread-local. */
NT_API int nt_last_error(void);
/** Message of the calling thread's last error ("" if none).  The string is
 *  owned by the library and valid until the thread's next error or
 *  nt_clear_error().  Thread-local. */
NT_API const char *nt_last_error_message(void);
/** Static description of an error code; never NULL. */
NT_API const char *nt_strerror(int code);
/** Clears the calling thread's error. */
NT_API void nt_clear_error(void);

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum nt_dtype {
    NT_F32 = 0, /* IEEE binary32 */
    NT_BF16,    /* bfloat16: 8-bit exponent, 7-bit mantissa */
    NT_F16,     /* IEEE binary16 */
    NT_I32,     /* int32 */
    NT_U8,      /* uint8; comparisons return it (0 or 1) */
    NT_DTYPE_COUNT
} nt_dtype;

/** Opaque tensor handle.  Refcounted; see Ownership above. */
typedef struct nt_tensor nt_tensor;
/** Opaque scope: tensors created while it is innermost die with it. */
typedef struct nt_scope nt_scope;
/** Opaque stream: an in-order queue of work with its own worker. */
typedef struct nt_stream nt_stream;
/** Opaque event: a point in a stream's work that others can wait for. */
typedef struct nt_event nt_event;

/** Where a user called the library.  Filled by the NT_HERE macro; strings
 *  must be static (string literals).  `ra` is a return address used when
 *  file is NULL. */
typedef struct nt_site {
    const char *file;
    const char *func;
    int line;
    const void *ra;
} nt_site;

/** Name ("f32", "bf16", ...) of a dtype, or "?" if out of range. */
NT_API const char *nt_dtype_name(nt_dtype dt);
/** Size in bytes of one element, or 0 if out of range. */
NT_API size_t nt_dtype_size(nt_dtype dt);

/* ------------------------------------------------------------------------ */
/* Lifecycle and configuration                                              */
/* ------------------------------------------------------------------------ */

/** Initialises the runtime and reads the NT_* environment variables
 *  (docs/env.md).  Idempotent and thread-safe: later calls return 0 at once.
 *  Every other function calls it implicitly if needed. */
NT_API int nt_init(void);

/** Drains every stream, joins the workers and frees everything the runtime
 *  owns.  Handles still held by the user become invalid.  NT_STATS=1 prints
 *  a summary here.  Call once, from one thread, when no other thread uses the
 *  library; nt_init() may be called again afterwards. */
NT_API void nt_shutdown(void);

/** Execution modes (NT_MODE / NT_DETERMINISTIC). */
typedef enum nt_mode {
    NT_MODE_ADAPTIVE = 0, /* async; the worker fuses what queued meanwhile */
    NT_MODE_EAGER,        /* async, one kernel per op */
    NT_MODE_LAZY,         /* hold ops until a sync point or a full window */
    NT_MODE_DETERMINISTIC /* every op synchronous on the calling thread */
} nt_mode;

/** Sets a runtime option by the name of its environment variable, e.g.
 *  nt_config_set("NT_MODE", "lazy").  Waits for all queued work first, so
 *  the change applies to every op issued after it.  Returns NT_EINVAL for an
 *  unknown name or a bad value. */
NT_API int nt_config_set(const char *name, const char *value);
/** Current value of an option as text, or NULL for an unknown name.  The
 *  string is static or owned by the runtime until the next nt_config_set. */
NT_API const char *nt_config_get(const char *name);
/** Current execution mode. */
NT_API nt_mode nt_get_mode(void);

/* ------------------------------------------------------------------------ */
/* Creation                                                                 */
/* ------------------------------------------------------------------------ */

/** Copies numel(shape) elements of dtype `dt` from host memory `src`
 *  (row-major, contiguous) into a new device tensor.  The copy is complete
 *  when the call returns; `src` is not retained.  ndim may be 0 (a scalar;
 *  shape may then be NULL). */
NT_API nt_tensor *nt_from_host(const void *src, nt_dtype dt, int ndim,
                               const int64_t *shape);
/** New tensors filled with 0, 1 or `value` (rounded to dt). */
NT_API nt_tensor *nt_zeros(nt_dtype dt, int ndim, const int64_t *shape);
NT_API nt_tensor *nt_ones(nt_dtype dt, int ndim, const int64_t *shape);
NT_API nt_tensor *nt_full(nt_dtype dt, int ndim, const int64_t *shape,
                          double value);
/** New tensors shaped like `t` (its dtype) filled with 0, 1 or value. */
NT_API nt_tensor *nt_zeros_like(nt_tensor *t);
NT_API nt_tensor *nt_ones_like(nt_tensor *t);
NT_API nt_tensor *nt_full_like(nt_tensor *t, double value);
/** 1-D tensor start, start+step, ... < end (> end for a negative step). */
NT_API nt_tensor *nt_arange(nt_dtype dt, double start, double end,
                            double step);
/** Uniform [0, 1) and standard normal samples.  Element i depends only on
 *  (seed, i): the same seed gives the same tensor in every mode and on every
 *  backend.  Floating dtypes only. */
NT_API nt_tensor *nt_rand(nt_dtype dt, int ndim, const int64_t *shape,
                          uint64_t seed);
NT_API nt_tensor *nt_randn(nt_dtype dt, int ndim, const int64_t *shape,
                           uint64_t seed);

/* ------------------------------------------------------------------------ */
/* Reading values (sync points)                                             */
/* ------------------------------------------------------------------------ */

/** Waits for `t`'s value and copies it, row-major contiguous, in t's dtype,
 *  into `dst`, which must hold nbytes >= numel * dtype size.  Returns 0, or
 *  the error that poisoned t (message naming the failed op and its site). */
NT_API int nt_to_host(nt_tensor *t, void *dst, size_t nbytes);
/** Waits for a one-element tensor and stores its value as a double. */
NT_API int nt_item(nt_tensor *t, double *out);
/** Waits for `t` and prints it to stdout like PyTorch:
 *  tensor([[1.0000, 2.0000], ...], dtype=bf16). */
NT_API int nt_print(nt_tensor *t);
/** Same text as nt_print, returned as a malloc'ed string the caller frees
 *  (NULL on error). */
NT_API char *nt_format(nt_tensor *t);
/** Waits for all work queued so far on every stream.  Returns the first
 *  error raised by that work and not yet reported, or 0. */
NT_API int nt_sync(void);

/* ------------------------------------------------------------------------ */
/* Metadata (never waits)                                                   */
/* ------------------------------------------------------------------------ */

/** Number of dims (0 for a scalar), or -1 for a NULL or released tensor. */
NT_API int nt_ndim(nt_tensor *t);
/** Size of dim i (negative i counts from the end), or -1 if invalid. */
NT_API int64_t nt_shape(nt_tensor *t, int i);
/** Number of elements, or -1 for a NULL or released tensor. */
NT_API int64_t nt_numel(nt_tensor *t);
/** Element type, or NT_DTYPE_COUNT for a NULL or released tensor. */
NT_API nt_dtype nt_dtype_of(nt_tensor *t);
/** Stride of dim i in elements (views may be non-contiguous), -1 if bad. */
NT_API int64_t nt_stride(nt_tensor *t, int i);
/** True if the tensor is row-major contiguous. */
NT_API bool nt_is_contiguous(nt_tensor *t);

/* ------------------------------------------------------------------------ */
/* Lifetime                                                                 */
/* ------------------------------------------------------------------------ */

/** Adds a reference; returns t (NULL for a NULL or released tensor). */
NT_API nt_tensor *nt_retain(nt_tensor *t);
/** Drops a reference.  When the last user reference goes, the handle becomes
 *  invalid at once; its storage lives on while queued work or a view still
 *  needs it.  Releasing NULL is a no-op.  Using a released handle (releasing
 *  it again included) sets NT_ERELEASED and returns it, as long as the
 *  handle's memory has not been reused for a new tensor: that happens only
 *  after NT_HANDLE_QUARANTINE (default 4096) other handles were released,
 *  and never with NT_HANDLE_QUARANTINE=all (docs/env.md).  A pointer kept
 *  longer than that may name the new tensor, and a use of it cannot be told
 *  from a use of that tensor: do not keep released handles. */
NT_API int nt_release(nt_tensor *t);
/** Opens a scope on the calling thread.  Every tensor returned to this thread
 *  while it is the innermost open scope is released by nt_scope_end.  NULL
 *  (NT_EHOSTMEM) if the host is out of memory; an op whose result the scope
 *  has no memory to record returns NULL with NT_EHOSTMEM too. */
NT_API nt_scope *nt_scope_begin(void);
/** Closes `s` (and any scope opened inside it and not closed), releasing the
 *  tensors it owns.  Must be called on the thread that opened it. */
NT_API int nt_scope_end(nt_scope *s);
/** Moves t out of the scope that owns it into the caller's ownership (the
 *  caller must nt_release it).  Returns t. */
NT_API nt_tensor *nt_keep(nt_tensor *t);

/* ------------------------------------------------------------------------ */
/* Elementwise ops.  Binary ops broadcast like NumPy and promote dtypes     */
/* (float beats int, f32 beats bf16/f16, bf16 with f16 gives f32, i32 beats */
/* u8).  Floating math is done in f32 and rounded once to the result dtype. */
/* ------------------------------------------------------------------------ */

NT_API nt_tensor *nt_add(nt_tensor *a, nt_tensor *b);     /* a + b */
NT_API nt_tensor *nt_sub(nt_tensor *a, nt_tensor *b);     /* a - b */
NT_API nt_tensor *nt_mul(nt_tensor *a, nt_tensor *b);     /* a * b */
NT_API nt_tensor *nt_div(nt_tensor *a, nt_tensor *b);     /* a / b, true division (ints give f32) */
NT_API nt_tensor *nt_maximum(nt_tensor *a, nt_tensor *b); /* max(a, b), NaN propagates */
NT_API nt_tensor *nt_minimum(nt_tensor *a, nt_tensor *b); /* min(a, b), NaN propagates */
/** Comparisons: u8 tensors of 0/1 (NaN compares false except ne). */
NT_API nt_tensor *nt_eq(nt_tensor *a, nt_tensor *b);
NT_API nt_tensor *nt_ne(nt_tensor *a, nt_tensor *b);
NT_API nt_tensor *nt_lt(nt_tensor *a, nt_tensor *b);
NT_API nt_tensor *nt_le(nt_tensor *a, nt_tensor *b);
NT_API nt_tensor *nt_gt(nt_tensor *a, nt_tensor *b);
NT_API nt_tensor *nt_ge(nt_tensor *a, nt_tensor *b);
/** cond ? a : b, elementwise, all three broadcast together; cond is any
 *  dtype (nonzero is true); the result has a's and b's promoted dtype. */
NT_API nt_tensor *nt_where(nt_tensor *cond, nt_tensor *a, nt_tensor *b);

/** Tensor-scalar ops.  The result keeps t's dtype, except that an integer
 *  tensor with a non-integral scalar gives f32. */
NT_API nt_tensor *nt_add_scalar(nt_tensor *t, double s); /* t + s */
NT_API nt_tensor *nt_mul_scalar(nt_tensor *t, double s); /* t * s */
NT_API nt_tensor *nt_div_scalar(nt_tensor *t, double s); /* t / s */
NT_API nt_tensor *nt_pow_scalar(nt_tensor *t, double s); /* t ^ s (float result) */
NT_API nt_tensor *nt_clamp(nt_tensor *t, double lo, double hi); /* min(max(t, lo), hi) */

/** Unary ops.  Integer inputs give f32, except neg, abs and relu, which keep
 *  the integer dtype.  gelu is the exact erf form, 0.5x(1 + erf(x/sqrt 2)). */
NT_API nt_tensor *nt_neg(nt_tensor *t);
NT_API nt_tensor *nt_exp(nt_tensor *t);
NT_API nt_tensor *nt_log(nt_tensor *t);
NT_API nt_tensor *nt_sqrt(nt_tensor *t);
NT_API nt_tensor *nt_rsqrt(nt_tensor *t); /* 1 / sqrt(t) */
NT_API nt_tensor *nt_abs(nt_tensor *t);
NT_API nt_tensor *nt_relu(nt_tensor *t);
NT_API nt_tensor *nt_gelu(nt_tensor *t);
NT_API nt_tensor *nt_sigmoid(nt_tensor *t);
NT_API nt_tensor *nt_tanh(nt_tensor *t);
NT_API nt_tensor *nt_silu(nt_tensor *t); /* t * sigmoid(t) */

/** Converts to dtype `dt` (round to nearest even for floats; float to int
 *  truncates toward zero, saturates, and maps NaN to 0; int to u8 wraps).
 *  Casting to t's own dtype gives a new handle on t's storage. */
NT_API nt_tensor *nt_cast(nt_tensor *t, nt_dtype dt);
/** Casts an f32 tensor to bf16 or f16 with stochastic rounding: each element
 *  goes to one of its two neighbours in dt, up (in magnitude) with
 *  probability equal to its distance from the lower one over the gap, so the
 *  rounding is unbiased.  The random bits come from NT_SR_SEED, the op's
 *  position in its stream and the element's index: the same program gives
 *  the same bits run to run, in every mode, fused or not (docs/amp.md).
 *  NT_STOCHASTIC_ROUNDING=1 makes every f32 -> bf16/f16 nt_cast (and the
 *  casts autocast inserts) round this way.  Other dtypes: NT_EDTYPE. */
NT_API nt_tensor *nt_cast_sr(nt_tensor *t, nt_dtype dt);

/* ------------------------------------------------------------------------ */
/* Linear algebra                                                           */
/* ------------------------------------------------------------------------ */

/** Matrix product with PyTorch's semantics: 1-D operands are promoted to a
 *  row/column and the added dim removed; leading (batch) dims broadcast.
 *  Floating dtypes; accumulates in f32 in K-tiles of 128, ascending. */
NT_API nt_tensor *nt_matmul(nt_tensor *a, nt_tensor *b);
/** x[..., in] . w[out, in]^T + b[out]; b may be NULL.  Same as
 *  nt_add(nt_matmul(x, nt_transpose(w, 0, 1)), b), op for op. */
NT_API nt_tensor *nt_linear(nt_tensor *x, nt_tensor *w, nt_tensor *b);

/* ------------------------------------------------------------------------ */
/* Reductions and row ops.  `dim` may be negative (counts from the end);     */
/* NT_DIM_ALL reduces every dim.  One summation order, fixed by the shape.   */
/* ------------------------------------------------------------------------ */

NT_API nt_tensor *nt_sum(nt_tensor *t, int dim, bool keepdim);  /* ints sum in i32 */
NT_API nt_tensor *nt_mean(nt_tensor *t, int dim, bool keepdim); /* floating only */
NT_API nt_tensor *nt_max(nt_tensor *t, int dim, bool keepdim);  /* values */
NT_API nt_tensor *nt_argmax(nt_tensor *t, int dim, bool keepdim); /* i32, first max */
/** Minimum over `dim` (or NT_DIM_ALL), like nt_max: every dtype, same dtype
 *  out; a NaN propagates; an empty dim is NT_ESHAPE (no identity).  The
 *  gradient goes to the first minimum (the element nt_argmin picks). */
NT_API nt_tensor *nt_min(nt_tensor *t, int dim, bool keepdim);
/** i32 index of the first minimum over `dim` (a NaN counts as the minimum,
 *  so the first NaN wins, as in PyTorch); with NT_DIM_ALL the index into
 *  the row-major flattening.  Not differentiable. */
NT_API nt_tensor *nt_argmin(nt_tensor *t, int dim, bool keepdim);
/** u8 1 where some element over `dim` is nonzero (NaN is nonzero), else 0;
 *  an empty dim gives 0.  Every dtype.  Not differentiable. */
NT_API nt_tensor *nt_any(nt_tensor *t, int dim, bool keepdim);
/** torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over `dim` (or every
 *  element with NT_DIM_ALL); ord 2 (sqrt of the sum of squares), 1, INFINITY
 *  (max |x|), -INFINITY (min |x|), 0 (count of nonzeros) or any other
 *  number p.  Floating dtypes only; same dtype out, computed in f32 with the
 *  sum in the canonical order of every reduction (docs/exactness.md) and
 *  rounded once.  NaN ord: NT_EINVAL; +-INFINITY over an empty dim:
 *  NT_ESHAPE.  Gradient: PyTorch's conventions (docs/ops.md): 0 where the
 *  norm is 0, for ord 0 everywhere, ord +-inf shares g evenly among the
 *  elements with |x| equal to the norm. */
NT_API nt_tensor *nt_norm(nt_tensor *t, double ord, int dim, bool keepdim);
/** exp(x - max) / sum(exp(x - max)) over `dim`. */
NT_API nt_tensor *nt_softmax(nt_tensor *t, int dim);
/** x - max - log(sum(exp(x - max))) over `dim`. */
NT_API nt_tensor *nt_log_softmax(nt_tensor *t, int dim);
/** Normalises over the last dim: (x - mean) * rsqrt(var + eps) * w + b, with
 *  the biased variance; w and b ([last dim]) may be NULL. */
NT_API nt_tensor *nt_layer_norm(nt_tensor *x, nt_tensor *w, nt_tensor *b,
                                double eps);
/** x * rsqrt(mean(x^2) + eps) * w over the last dim; w may be NULL. */
NT_API nt_tensor *nt_rms_norm(nt_tensor *x, nt_tensor *w, double eps);
/** Mean over the batch of -log_softmax(logits)[i, labels[i]].
 *  logits [N, C] floating, labels [N] i32 in [0, C) (checked when it runs). */
NT_API nt_tensor *nt_cross_entropy(nt_tensor *logits, nt_tensor *labels);
/** mean((a - b)^2) over every element; a and b have the same shape. */
NT_API nt_tensor *nt_mse_loss(nt_tensor *a, nt_tensor *b);
/** Rows of weight [V, D] picked by the i32 indices idx [...]: [..., D].
 *  Indices outside [0, V) are an error when the op runs. */
NT_API nt_tensor *nt_embedding(nt_tensor *weight, nt_tensor *idx);
/** torch.gather: out[i][j][k] = t[index[i][j][k]][j][k] (dim 0; likewise for
 *  other dims).  t has at least 1 dim; index (i32 or u8; PyTorch's is
 *  int64) has t's ndim and index.shape[d] <=
 *  t.shape[d] for d != dim; out has index's shape and t's dtype (any dtype;
 *  values copied bit for bit).  Indices must lie in [0, t.shape[dim]):
 *  negative ones are not wrapped; a bad one is NT_ERANGE when the op runs,
 *  naming its position.  The gradient adds g into t's shape in g's
 *  row-major order (deterministic; repeated indices accumulate). */
NT_API nt_tensor *nt_gather(nt_tensor *t, int dim, nt_tensor *index);
/** torch.index_select: the entries index[0], index[1], ... of t along
 *  `dim` (t at least 1-D); index is 1-D (or 0-d) i32 or u8.  Same index rules and gradient
 *  as nt_gather. */
NT_API nt_tensor *nt_index_select(nt_tensor *t, int dim, nt_tensor *index);

/* ------------------------------------------------------------------------ */
/* Shapes and views.  reshape, transpose, permute, slice and expand return   */
/* views sharing t's storage where the strides allow (reshape copies only    */
/* when it must).  Writes through a view are seen by the base tensor.        */
/* ------------------------------------------------------------------------ */

/** New shape with the same numel; one entry may be -1 (inferred). */
NT_API nt_tensor *nt_reshape(nt_tensor *t, int ndim, const int64_t *shape);
/** Swaps dims d0 and d1. */
NT_API nt_tensor *nt_transpose(nt_tensor *t, int d0, int d1);
/** Reorders dims: result dim i is t's dim perm[i]; perm has ndim entries. */
NT_API nt_tensor *nt_permute(nt_tensor *t, const int *perm);
/** Elements start, start+step, ... < end along dim (Python slice semantics
 *  for negative and out-of-range start/end; step >= 1). */
NT_API nt_tensor *nt_slice(nt_tensor *t, int dim, int64_t start, int64_t end,
                           int64_t step);
/** Broadcast view to `shape` (size-1 dims stretch with stride 0; new dims
 *  are added at the front).  Read-only in spirit: writing it is an error. */
NT_API nt_tensor *nt_expand(nt_tensor *t, int ndim, const int64_t *shape);
/** Concatenates n tensors of equal dtype along dim (other dims equal). */
NT_API nt_tensor *nt_cat(nt_tensor *const *ts, int n, int dim);
/** torch.Tensor.repeat: t tiled repeats[i] times along dim i; n >= t's ndim
 *  (extra leading repeats add dims), every repeats[i] >= 0.  A new
 *  contiguous tensor (an expand of t copied, op for op); the gradient sums
 *  the copies by the canonical order of nt_sum. */
NT_API nt_tensor *nt_repeat(nt_tensor *t, const int64_t *repeats, int n);
/** torch.split with an int: views of t along `dim` of split_size elements
 *  each, the last one smaller if the size does not divide (an empty dim
 *  gives one empty view).  Writes up to max_out new references to out and
 *  returns how many it made; out may be NULL with max_out 0 to ask for the
 *  count only.  split_size <= 0 or too few slots: NT_EINVAL (negative return,
 *  nothing made).  Gradients flow through nt_slice. */
NT_API int nt_split(nt_tensor *t, int64_t split_size, int dim, nt_tensor **out, int max_out);
/** A contiguous tensor with t's values: a new handle on t's storage if t is
 *  already contiguous, else a copy. */
NT_API nt_tensor *nt_contiguous(nt_tensor *t);

/* ------------------------------------------------------------------------ */
/* In place.  These write into `dst` (which must not be an expanded view)   */
/* and return 0 or an error code; the result is cast to dst's dtype.  Each   */
/* write bumps the storage's version; queued reads of the old value happen   */
/* first.  On a tensor that requires grad they are refused outside a no-grad */
/* region.                                                                   */
/* ------------------------------------------------------------------------ */

/** dst <- src (src broadcast to dst's shape and cast to its dtype). */
NT_API int nt_copy_into(nt_tensor *dst, nt_tensor *src);
NT_API int nt_add_inplace(nt_tensor *dst, nt_tensor *src); /* dst += src */
NT_API int nt_sub_inplace(nt_tensor *dst, nt_tensor *src); /* dst -= src */
NT_API int nt_mul_inplace(nt_tensor *dst, nt_tensor *src); /* dst *= src */
NT_API int nt_div_inplace(nt_tensor *dst, nt_tensor *src); /* dst /= src */
NT_API int nt_add_scalar_inplace(nt_tensor *dst, double s);
NT_API int nt_mul_scalar_inplace(nt_tensor *dst, double s);
NT_API int nt_fill_inplace(nt_tensor *dst, double value);
NT_API int nt_relu_inplace(nt_tensor *dst);
NT_API int nt_neg_inplace(nt_tensor *dst);
NT_API int nt_clamp_inplace(nt_tensor *dst, double lo, double hi);

/* ------------------------------------------------------------------------ */
/* Autograd                                                                  */
/* ------------------------------------------------------------------------ */

/** Marks a leaf tensor as needing a gradient (floating dtypes only). */
NT_API int nt_set_requires_grad(nt_tensor *t, bool requires_grad);
/** True if gradients flow to or through t. */
NT_API bool nt_requires_grad(nt_tensor *t);
/** Back-propagates from a one-element loss, accumulating into the .grad of
 *  every leaf that requires grad, then frees the graph.  Backward ops are
 *  queued like any other op.  A second call through the same graph is an
 *  error (NT_ESTATE) unless the first used nt_backward_ex(loss, true). */
NT_API int nt_backward(nt_tensor *loss);
NT_API int nt_backward_ex(nt_tensor *loss, bool retain_graph);
/** The accumulated gradient of t (a new reference), or NULL without setting
 *  an error if there is none yet. */
NT_API nt_tensor *nt_grad(nt_tensor *t);
/** Drops t's accumulated gradient. */
NT_API int nt_zero_grad(nt_tensor *t);
/** A tensor sharing t's storage, cut from the graph. */
NT_API nt_tensor *nt_detach(nt_tensor *t);
/** No-grad regions (nestable, per thread): ops record no graph inside. */
NT_API void nt_no_grad_begin(void);
NT_API void nt_no_grad_end(void);
/** Whether ops on this thread currently record a graph. */
NT_API bool nt_grad_enabled(void);

/** A user op, registered once and then called like a built-in: its forward
 *  is built from ntensor ops and its backward too, exactly as the built-in
 *  ops' backward functions are (see examples/custom_op.c). */
typedef struct nt_op_def {
    const char *name; /* for messages, logs and traces (copied) */
    int nin;          /* tensor inputs: 1..4 */
    /** Computes the output from in[0..nin) with ntensor ops and returns it
     *  (ownership as for any op result).  Runs with graph recording off. */
    nt_tensor *(*forward)(nt_tensor *const *in, void *ctx);
    /** Given the output's gradient `gout`, the inputs and the output, sets
     *  gin[i] to the gradient of input i (a tensor made with ntensor ops,
     *  shaped like in[i]) or leaves it NULL.  Runs inside nt_backward, in a
     *  scope that owns what it makes.  Returns 0 or an error code.  May be
     *  NULL for an op without a gradient. */
    int (*backward)(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                    void *ctx);
    void *ctx;        /* passed to both; must outlive the op */
} nt_op_def;

/** Registers a user op; returns its id (>= 0) for nt_op_call, or a negative
 *  error (NULL def or forward, nin out of range, empty or duplicate name).
 *  Thread-safe. */
NT_API int nt_op_register(const nt_op_def *def);
/** Runs registered op `op` on its def->nin inputs and records it for
 *  autograd like a built-in. */
NT_API nt_tensor *nt_op_call(int op, nt_tensor *const *in);

/** Checks autograd against central finite differences: loss = sum(f(x) * w)
 *  for a fixed pseudo-random w; every element of every input's analytic
 *  gradient must be within atol + rtol * |numeric| of (L(x + eps) - L(x -
 *  eps)) / 2 eps.  Inputs must be floating and require grad; their .grad is
 *  reset.  Returns 0, or NT_ERANGE with a message naming the input, the
 *  element and both values.  Runs f 2 * numel + 1 times: use small inputs. */
NT_API int nt_gradcheck(nt_tensor *(*f)(nt_tensor *const *in, void *ctx), nt_tensor *const *in,
                        int n, void *ctx, double eps, double atol, double rtol);

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */
/* ------------------------------------------------------------------------ */

/** The stream every thread starts on.  Owned by the runtime. */
NT_API nt_stream *nt_stream_default(void);
/** A new stream with its own worker thread.  Destroy with
 *  nt_stream_destroy. */
NT_API nt_stream *nt_stream_create(void);
/** Waits for the stream's work and frees it.  Threads whose current stream it
 *  was go back to the default stream.  The default stream cannot be
 *  destroyed (NT_EINVAL). */
NT_API int nt_stream_destroy(nt_stream *s);
/** The calling thread's current stream (where its ops are queued). */
NT_API nt_stream *nt_stream_current(void);
/** Makes `s` the calling thread's current stream (NULL: the default). */
NT_API int nt_stream_set_current(nt_stream *s);
/** Waits for all work queued on `s` so far; returns its first unreported
 *  error or 0. */
NT_API int nt_stream_synchronize(nt_stream *s);
/** Events: record marks the work queued on `s` so far; a stream that waits on
 *  an event runs nothing queued after the wait until that work is done. */
NT_API nt_event *nt_event_create(void);
NT_API int nt_event_record(nt_event *e, nt_stream *s);
NT_API int nt_stream_wait_event(nt_stream *s, nt_event *e);
/** Waits on the host until the event's work is done. */
NT_API int nt_event_synchronize(nt_event *e);
/** True if the event's work is done (or it was never recorded). */
NT_API bool nt_event_query(nt_event *e);
NT_API void nt_event_destroy(nt_event *e);

/* ------------------------------------------------------------------------ */
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

typedef struct nt_stats {
    uint64_t ops_enqueued;      /* ops recorded by the dispatcher */
    uint64_t ops_executed;      /* ops run (fused or not) */
    uint64_t kernels_launched;  /* kernels run by a backend */
    uint64_t ops_poisoned;      /* ops skipped because an input was poisoned */
    uint64_t syncs;             /* sync points reached */
    uint64_t sync_wait_ns;      /* host time spent waiting in sync points */
    uint64_t bytes_to_host;     /* nt_to_host / item / print */
    uint64_t bytes_from_host;   /* nt_from_host */
    uint64_t device_bytes_in_use; /* live device storage */
    uint64_t device_bytes_peak;
    uint64_t device_capacity;
    uint64_t cpu_fallbacks;     /* ops that ran on the CPU backend */
    uint64_t fusion_groups;     /* fused kernels run (groups of >= 2 ops) */
    uint64_t fused_ops;         /* ops those kernels replaced */
    uint64_t fusion_breaks;     /* places a group ended before the batch did */
    uint64_t kernel_cache_hits; /* fused kernels found compiled */
    uint64_t kernel_cache_misses;
    uint64_t fused_values_stored; /* fused-kernel values written to device memory */
    uint64_t fused_values_elided; /* intermediates that never left the kernel */
    uint64_t fusion_plan_ns;    /* worker time spent planning (kernels excluded) */
    uint64_t sim_kernels;       /* kernels run on the simulated NeuronCore */
    uint64_t sim_time_ns;       /* their simulated time (nt_sim_stats has more) */
    uint64_t sim_hbm_bytes;     /* HBM bytes their DMAs moved */
    uint64_t device_bytes_backed; /* of device_bytes_in_use, storage holding memory: a
                                     big tensor's capacity is reserved when it is made
                                     and its memory taken when first written, so a
                                     fused-away intermediate never takes any */
    uint64_t device_bytes_backed_peak;
    /* Of device_bytes_in_use (reserved), what tensors still reachable from the
     * host hold ("live"); the rest is memory released by the program that
     * queued ops still read ("waiting"), which the stream's later ops may
     * already reuse (docs/architecture.md, section 3). */
    uint64_t device_bytes_live;
    uint64_t device_bytes_live_peak;
    uint64_t device_bytes_waiting;
    uint64_t device_alloc_waits;   /* allocations that waited for queued work to
                                      free memory (full device, NT_MAX_INFLIGHT_BYTES) */
    uint64_t device_alloc_wait_ns; /* host time those waits took */
} nt_stats;

/** Fills *out with counters since nt_init (or the last nt_stats_reset). */
NT_API int nt_stats_get(nt_stats *out);
NT_API void nt_stats_reset(void);

/* ------------------------------------------------------------------------ */
/* Optimizers and checkpoints                                               */
/* ------------------------------------------------------------------------ */

/** Opaque optimizer: a list of parameters and their state (momentum
 *  buffers, Adam moments, step counts, optional f32 master weights).
 *
 *  Ownership: an optimizer retains each parameter (nt_retain) and releases
 *  it in nt_optim_destroy; its state tensors belong to it and never enter a
 *  scope.  Threads: each optimizer has a lock, so its functions may be called
 *  from any thread, and calls on one optimizer serialise; a step reads each
 *  parameter's .grad and writes the parameter in place, so other threads'
 *  work on those tensors needs events to be ordered against it.
 *
 *  A step issues, for every parameter that has a .grad, a chain of
 *  elementwise ops ending in in-place writes of the parameter and its state,
 *  with graph recording off; it never waits for the device (host-side
 *  scalars such as Adam's bias corrections come from the step count).  A
 *  parameter without a .grad is skipped and its step count does not move,
 *  as in PyTorch.  If a step fails part-way, parameters before the failing
 *  one have been updated. */
typedef struct nt_optim nt_optim;

/** SGD exactly as torch.optim.SGD with dampening 0: g = grad + wd * p;
 *  with momentum, buf = g at a parameter's first update and momentum * buf
 *  + g afterwards, and g = nesterov ? g + momentum * buf : buf; then
 *  p = p - lr * g.  params: n >= 1 distinct floating leaf tensors (not
 *  expanded views), borrowed and retained.  lr, momentum, weight_decay
 *  finite and >= 0; nesterov needs momentum > 0.  Returns NULL with the
 *  thread's error set (NT_EINVAL, NT_EDTYPE, NT_ERELEASED) on a bad
 *  argument.  Destroy with nt_optim_destroy. */
NT_API nt_optim *nt_optim_sgd(nt_tensor *const *params, int n, double lr, double momentum,
                              double weight_decay, bool nesterov);
/** AdamW exactly as torch.optim.AdamW (amsgrad off): with t the parameter's
 *  step count after the increment, p = p * (1 - lr * wd) (decoupled weight
 *  decay, first); m = m + (1 - beta1) (g - m); v = beta2 v + (1 - beta2) g^2;
 *  p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
 *  m and v start at zero.  params as for nt_optim_sgd; lr, eps,
 *  weight_decay finite and >= 0; betas in [0, 1).  NULL with the error set on
 *  a bad argument.  PyTorch's defaults: lr 1e-3, betas 0.9 and 0.999, eps
 *  1e-8, weight_decay 1e-2. */
NT_API nt_optim *nt_optim_adamw(nt_tensor *const *params, int n, double lr, double beta1,
                                double beta2, double eps, double weight_decay);
/** Updates every parameter that has a .grad (see nt_optim above).  The
 *  .grads are left as they are (call nt_optim_zero_grad before the next
 *  backward).  Returns 0 or an error code; errors raised later by the queued
 *  ops poison the parameters and are reported by the next sync on them. */
NT_API int nt_optim_step(nt_optim *opt);
/** The same as nt_optim_step (any optimizer, not only SGD). */
NT_API int nt_sgd_step(nt_optim *opt);
/** Drops the .grad of every parameter (like PyTorch's zero_grad with
 *  set_to_none): the next backward starts them afresh. */
NT_API int nt_optim_zero_grad(nt_optim *opt);
/** Sets the learning rate used by the following steps (finite, >= 0). */
NT_API int nt_optim_set_lr(nt_optim *opt, double lr);
/** The current learning rate, or NaN with the error set for a bad opt. */
NT_API double nt_optim_get_lr(nt_optim *opt);
/** Number of successful nt_optim_step calls (restored by nt_load), or a
 *  negative error code for a bad opt. */
NT_API int64_t nt_optim_steps(nt_optim *opt);
/** Master weights for bf16/f16 parameters: when on, the optimizer keeps an
 *  f32 copy of each such parameter, applies the update to the copy (with the
 *  gradient cast to f32 and f32 state) and writes the copy, rounded, into the
 *  parameter.  Turning it on copies the parameters and casts existing state
 *  to f32; turning it off drops the copies and casts state back.  f32
 *  parameters are unaffected.  Off by default. */
NT_API int nt_optim_set_master_weights(nt_optim *opt, bool on);
/** Releases the parameters and frees the state.  NULL is a no-op.  Not to
 *  be called while another thread uses opt. */
NT_API void nt_optim_destroy(nt_optim *opt);

/** Saves the values of params[0..n) (borrowed; n >= 1) and, if opt is not
 *  NULL, the optimizer's hyper-parameters, step counts and state, to `path`
 *  in the format of docs/checkpoint.md (little-endian, CRC-32 per record and
 *  over the header).  A sync point: waits for the values.  Writes
 *  `path`.tmp and renames it over `path`, so a crash never leaves a partial
 *  file under `path`.  Returns 0, NT_EIO (naming the file and the system's
 *  reason) or the error of a poisoned tensor.  Thread-safe. */
NT_API int nt_save(const char *path, nt_tensor *const *params, int n, nt_optim *opt);
/** Loads a checkpoint written by nt_save into the existing tensors
 *  params[0..n), which must match the saved ones in count, dtype and shape,
 *  and, if opt is not NULL, restores its hyper-parameters (lr included),
 *  step counts, master-weight setting and state (opt must be of the same
 *  kind and have as many parameters of the same shapes).  The whole file is
 *  read and checked before anything is written: a missing or unreadable
 *  file is NT_EIO; a truncated file, bad magic or version, a checksum
 *  mismatch, a nonzero reserved byte or a field no writer could have
 *  produced (lr NaN, beta1 >= 1, a negative step count, an impossible
 *  shape: docs/checkpoint.md) is NT_EFORMAT, naming the field; a count, dtype or shape mismatch is NT_ESHAPE;
 *  an optimizer of another kind, or opt given for a file without optimizer
 *  state, is NT_EINVAL.  On any error the tensors and opt are untouched and
 *  the message names the path and what was wrong.  Values are written as
 *  queued in-place copies (no graph is recorded).  Thread-safe. */
NT_API int nt_load(const char *path, nt_tensor *const *params, int n, nt_optim *opt);

/* Site-capturing forms of the step (see "Call-site capture" below). */
NT_API int nt_optim_step_at(const nt_site *site, nt_optim *opt);
NT_API int nt_sgd_step_at(const nt_site *site, nt_optim *opt);
#if !defined(__cplusplus) && !defined(NT_NO_SITE_MACROS) && !defined(NT_BUILDING_LIBRARY)
#define nt_optim_step(...) nt_optim_step_at(NT_HERE, __VA_ARGS__)
#define nt_sgd_step(...) nt_sgd_step_at(NT_HERE, __VA_ARGS__)
#endif

/* ------------------------------------------------------------------------ */
/* Mixed precision: autocast, loss scaling (docs/amp.md)                     */
/* ------------------------------------------------------------------------ */

/** Opens an autocast region on the calling thread: until the matching
 *  nt_autocast_end, ops called on this thread run at the precision of
 *  docs/amp.md's policy -- matmul and linear in `dt` (their inputs are cast
 *  to dt; the product still accumulates in f32), sums, means, softmax,
 *  log_softmax, the norms, exp, log, rsqrt, pow_scalar and the losses in f32
 *  (low-precision inputs are cast up), everything else in its inputs'
 *  dtype.  The casts are ordinary ops: they fuse, and autograd sends the
 *  gradients back through them, so f32 leaves get f32 gradients.  Backward
 *  ops (inside nt_backward) are never autocast.  dt is NT_BF16 or NT_F16,
 *  else NT_EDTYPE.  Regions nest (the innermost dtype applies) and are per
 *  thread; at most 64 deep (NT_ESTATE beyond). */
NT_API int nt_autocast_begin(nt_dtype dt);
/** Closes the calling thread's innermost autocast region; NT_ESTATE if none
 *  is open. */
NT_API int nt_autocast_end(void);
/** The dtype of the calling thread's innermost autocast region, or
 *  NT_DTYPE_COUNT when none is open. */
NT_API nt_dtype nt_autocast_dtype(void);

/** Opaque dynamic loss scaler (PyTorch's GradScaler): multiplies the loss
 *  by a scale so that small f16 gradients do not flush to zero, divides the
 *  gradients by it before the optimizer step, skips steps whose gradients
 *  overflowed and adapts the scale.  Thread-safe (a lock per scaler); a
 *  scaler is meant for one training loop. */
typedef struct nt_grad_scaler nt_grad_scaler;

/** The scaler's settings (plain data).  PyTorch's defaults: init_scale
 *  65536, growth_factor 2, backoff_factor 0.5, growth_interval 2000. */
typedef struct nt_grad_scaler_opts {
    double init_scale;       /* > 0, finite */
    double growth_factor;    /* > 1 */
    double backoff_factor;   /* in (0, 1) */
    int64_t growth_interval; /* clean steps before the scale grows, >= 1 */
} nt_grad_scaler_opts;

/** A new scaler; opts NULL gives the defaults above.  NULL with NT_EINVAL
 *  set for a bad setting.  Free with nt_grad_scaler_destroy. */
NT_API nt_grad_scaler *nt_grad_scaler_create(const nt_grad_scaler_opts *opts);
/** loss * scale, a new tensor (ownership as for any op; recorded for
 *  autograd, so nt_backward of it gives scaled gradients). */
NT_API nt_tensor *nt_grad_scaler_scale(nt_grad_scaler *s, nt_tensor *loss);
/** Divides the .grad of every parameter of opt by the scale, in place, and
 *  checks them all for Inf/NaN: one fused unscale-and-check kernel per
 *  gradient, one sync for the lot.  Optional before nt_grad_scaler_step
 *  (call it to clip the true gradients); at most once per step.  Returns 1
 *  if some gradient is not finite, 0 if all are, or a negative error. */
NT_API int nt_grad_scaler_unscale(nt_grad_scaler *s, nt_optim *opt);
/** Unscales opt's gradients (unless nt_grad_scaler_unscale did already),
 *  then runs nt_optim_step unless a gradient is Inf or NaN.  Returns 0 if
 *  the optimizer stepped, 1 if the step was skipped (overflow; counted in
 *  nt_grad_scaler_skipped_steps), or a negative error. */
NT_API int nt_grad_scaler_step(nt_grad_scaler *s, nt_optim *opt);
/** Adapts the scale after a step: times backoff_factor if the step
 *  overflowed (and the growth tracker restarts), else the tracker counts
 *  one more clean step and the scale grows by growth_factor when it
 *  reaches growth_interval (the tracker restarts).  NT_ESTATE if no step
 *  or unscale ran since the last update. */
NT_API int nt_grad_scaler_update(nt_grad_scaler *s);
/** Current scale (NaN with the error set for a bad s). */
NT_API double nt_grad_scaler_get_scale(nt_grad_scaler *s);
/** Steps skipped because of an overflow, since creation (or as loaded). */
NT_API int64_t nt_grad_scaler_skipped_steps(nt_grad_scaler *s);
/** Clean steps since the scale last changed. */
NT_API int64_t nt_grad_scaler_growth_tracker(nt_grad_scaler *s);
/** Frees s.  NULL is a no-op. */
NT_API void nt_grad_scaler_destroy(nt_grad_scaler *s);

/** nt_save plus, if scaler is not NULL, the loss scaler's state (scale,
 *  settings, growth tracker, skipped steps: record kind 4 of
 *  docs/checkpoint.md).  opt may be NULL.  Same guarantees as nt_save. */
NT_API int nt_checkpoint_save(const char *path, nt_tensor *const *params, int n,
                              nt_optim *opt, nt_grad_scaler *scaler);
/** nt_load plus, if scaler is not NULL, the loss scaler's state, checked
 *  before anything is written like the rest (a file without scaler state
 *  is NT_EINVAL when a scaler is given).  nt_load ignores scaler records. */
NT_API int nt_checkpoint_load(const char *path, nt_tensor *const *params, int n,
                              nt_optim *opt, nt_grad_scaler *scaler);

/* ------------------------------------------------------------------------ */
/* NeuronCore simulator and user tile kernels                                */
/* ------------------------------------------------------------------------ */
/*
 * ntensor's default device is a simulated AWS Trainium NeuronCore-v2 (trn1;
 * NT_SIM_TARGET=trn2 models v3).  Every op runs as a tile kernel on it: a
 * straight-line program of NKI-like instructions issued from C.  The same
 * instruction set is public, so a user can write a kernel and register it
 * as an op (nt_op_register_kernel).  docs/sim.md explains the model.
 *
 *   nt_sim_kernel *k = nt_sim_kernel_begin("scale");     // takes the core
 *   nt_tile *x = nt_tile_alloc(k, "x", NT_MEM_SBUF, NT_F32, 128, 512);
 *   nt_ap hx = nt_hbm_ap(src, NT_F32, 0, 128, 512, 512);  // [128, 512] rows
 *   nt_ap sx = nt_tile_ap(x);
 *   nt_isa_dma_copy(k, &sx, &hx, NT_DMA_QUEUE_AUTO);
 *   nt_isa_tensor_scalar(k, &sx, &sx, &(nt_isa_alu){NT_ALU_MUL, {NULL, 2.0f}, false},
 *                        NULL, NT_ENGINE_DEFAULT);
 *   ...
 *   int rc = nt_sim_kernel_end(k, &report);              // releases the core
 *
 * Every instruction is checked against the hardware's rules and placed on
 * its engine's simulated timeline after the instructions it depends on; its
 * exact result is computed (unless timing-only mode is on) and visible in
 * HBM at the latest when the kernel ends or nt_sim_kernel_sync returns.  An
 * instruction that breaks a rule returns NT_ESIM, records a message naming
 * the kernel, the instruction and the rule (nt_sim_kernel_message), and the
 * kernel then ignores every later instruction and returns the same error.
 *
 * Memories.  HBM is the runtime's device memory: an HBM access pattern holds
 * a plain pointer (a tensor's storage pointer is its HBM address).  SBUF
 * (128 partitions x 192 KiB on trn1) and PSUM (128 x 16 KiB = 8 banks of
 * 2 KiB per partition) are allocated explicitly, per kernel, with
 * nt_tile_alloc.
 *
 * Exactness.  Floating math is done in f32 and rounded once when written,
 * through the same definitions as the CPU backend (NaN canonical on every
 * store), so a kernel built from these instructions can reproduce the CPU's
 * bits: the library's own kernels all do.
 *
 * Threads.  One simulated core runs one kernel at a time: nt_sim_kernel_begin
 * blocks while another thread's kernel is open.  A kernel handle and its
 * tiles belong to the thread that began it until nt_sim_kernel_end.  The
 * nt_sim_* configuration and statistics functions are thread-safe.
 */

#define NT_SIM_PARTITIONS 128        /* partitions of SBUF and PSUM */
#define NT_SIM_DMA_QUEUES 16         /* DMA queues per core */
#define NT_SIM_PSUM_BANKS 8          /* PSUM banks per partition */
#define NT_SIM_PSUM_BANK_BYTES 2048  /* one bank = 512 f32 per partition */
#define NT_SIM_MATMUL_MAX_K 128      /* contraction (partitions) per nc_matmul */
#define NT_SIM_MATMUL_MAX_M 128      /* stationary free size */
#define NT_SIM_MATMUL_MAX_N 512      /* moving free size */
#define NT_SIM_SBUF_MAX_FREE 65536   /* elements per partition in one SBUF access */
#define NT_AP_MAX_DIMS 4             /* free-axis dims of an access pattern */
#define NT_DMA_QUEUE_AUTO (-1)       /* dma_copy: pick queues round robin */

typedef enum nt_sim_target {
    NT_SIM_TRN1 = 0, /* NeuronCore-v2 (default) */
    NT_SIM_TRN2 = 1, /* NeuronCore-v3 */
} nt_sim_target;

typedef enum nt_mem {
    NT_MEM_HBM = 0, /* device memory = host pointers */
    NT_MEM_SBUF,    /* state buffer, 128 partitions */
    NT_MEM_PSUM,    /* matmul accumulators, 8 banks of 2 KiB per partition */
} nt_mem;

/* The engines.  NT_ENGINE_DMA stands for the 16 DMA queues in statistics;
 * NT_ENGINE_DEFAULT lets an instruction use its usual engine. */
typedef enum nt_engine {
    NT_ENGINE_DEFAULT = -1,
    NT_ENGINE_TENSOR = 0, /* TensorE: nc_matmul, nc_transpose */
    NT_ENGINE_VECTOR,     /* VectorE */
    NT_ENGINE_SCALAR,     /* ScalarE (activation) */
    NT_ENGINE_GPSIMD,     /* GpSimd (iota, affine_select, custom code); no PSUM access */
    NT_ENGINE_DMA,
    NT_ENGINE_COUNT
} nt_engine;

/* ALU operators of tensor_tensor / tensor_scalar / tensor_reduce / scans.
 * Floating forms evaluate through the CPU backend's definitions (add,
 * maximum with NaN propagating, ...).  Comparisons give 1.0 or 0.0. */
#define NT_ALU_OP_MAP(X) \
    X(BYPASS, bypass)    \
    X(ADD, add)          \
    X(SUB, subtract)     \
    X(MUL, multiply)     \
    X(DIV, divide)       \
    X(MAX, maximum)      \
    X(MIN, minimum)      \
    X(POW, power)        \
    X(EQ, equal)         \
    X(NE, not_equal)     \
    X(LT, less)          \
    X(LE, less_equal)    \
    X(GT, greater)       \
    X(GE, greater_equal)

typedef enum nt_alu_op {
#define NT__ALU_ENUM(id, name) NT_ALU_##id,
    NT_ALU_OP_MAP(NT__ALU_ENUM)
#undef NT__ALU_ENUM
    NT_ALU_COUNT
} nt_alu_op;

/* Activation functions of ScalarE, evaluated through the CPU backend's
 * definitions.  GELU_DX and SILU_DX are the derivatives d/dx gelu(x) and
 * d/dx silu(x) exactly as the backward ops compute them. */
#define NT_ACT_FUNC_MAP(X) \
    X(IDENTITY, identity)  \
    X(EXP, exp)            \
    X(LOG, log)            \
    X(SQRT, sqrt)          \
    X(RSQRT, rsqrt)        \
    X(TANH, tanh)          \
    X(SIGMOID, sigmoid)    \
    X(GELU, gelu)          \
    X(SILU, silu)          \
    X(RELU, relu)          \
    X(ABS, abs)            \
    X(NEG, negative)       \
    X(SQUARE, square)      \
    X(GELU_DX, gelu_dx)    \
    X(SILU_DX, silu_dx)

typedef enum nt_act_func {
#define NT__ACT_ENUM(id, name) NT_ACT_##id,
    NT_ACT_FUNC_MAP(NT__ACT_ENUM)
#undef NT__ACT_ENUM
    NT_ACT_COUNT
} nt_act_func;

/** Static names ("TensorE", "add", "exp", "SBUF", ...); "?" if out of range. */
NT_API const char *nt_engine_name(nt_engine e);
NT_API const char *nt_alu_op_name(nt_alu_op op);
NT_API const char *nt_act_func_name(nt_act_func f);
NT_API const char *nt_mem_name(nt_mem m);

/** The numbers of the simulated core (docs/sim.md cites each one). */
typedef struct nt_sim_config {
    nt_sim_target target;
    const char *name;                 /* "trn1 (NeuronCore-v2)" */
    int partitions;                   /* 128 */
    int64_t sbuf_partition_bytes;     /* 196608 (trn2: 229376) */
    int64_t psum_partition_bytes;     /* 16384 */
    double clock_ghz[NT_ENGINE_COUNT];/* per engine; 0 for DMA */
    int dma_queues;                   /* 16 */
    int dma_engines;                  /* 16, shared by all queues */
    double dma_fixed_ns;              /* fixed cost of one dma_copy */
    double dma_engine_bytes_per_ns;   /* sustained rate of one DMA engine */
    int64_t dma_min_descriptor_bytes; /* a shorter contiguous run costs this much */
    double hbm_bytes_per_ns;          /* this core's share of HBM bandwidth */
    int min_instr_cycles;             /* minimum issue interval of an engine */
    int access_latency_cycles;        /* a result reaches SBUF/PSUM this late */
    double act_table_switch_ns;       /* ScalarE loads another function table */
    bool vector_gpsimd_share_sbuf;    /* v2: VectorE and GpSimd exclude each other on SBUF */
    bool vector_scalar_share_psum;    /* v2: VectorE and ScalarE exclude each other on PSUM */
    double tensor_peak_flops_bf16;    /* 128*128*2*clock */
    double tensor_peak_flops_f32;     /* a quarter of that */
} nt_sim_config;

/** Initialises the simulator (idempotent, thread-safe; nt_init and every
 *  other nt_sim_* call do it implicitly).  Reads NT_SIM_TARGET=trn1|trn2,
 *  NT_SIM_FUNCTIONAL=0|1 and NT_TRACE=file.json (opens the trace unless one
 *  is open already).  Returns 0, NT_EINVAL for a bad NT_SIM_* value
 *  (docs/env.md; the message names the variable) or NT_ENOMEM. */
NT_API int nt_sim_init(void);
/** Frees the simulated memories and closes a trace opened by nt_sim_init.
 *  No kernel may be open.  nt_sim_init may be called again afterwards. */
NT_API void nt_sim_shutdown(void);
/** Copies the active configuration into *out.  Thread-safe. */
NT_API int nt_sim_config_get(nt_sim_config *out);
/** Switches the modelled core (waits until no kernel runs).  Thread-safe. */
NT_API int nt_sim_set_target(nt_sim_target target);
/** Timing-only mode when `on` is false: instructions are checked and timed
 *  but no data is read or written (no DMA copy, no GEMM), so huge shapes
 *  can be modelled quickly.  Applies to kernels begun afterwards.  (The
 *  runtime's ops need the data: leave it on while ops run.) */
NT_API void nt_sim_set_functional(bool on);
NT_API bool nt_sim_get_functional(void);

/** Opaque kernel being issued; owned by the library, valid from begin to end. */
typedef struct nt_sim_kernel nt_sim_kernel;
/** Opaque SBUF/PSUM tile; owned by its kernel, freed at the latest by
 *  nt_sim_kernel_end. */
typedef struct nt_tile nt_tile;

/** What one kernel did (plain data). */
typedef struct nt_sim_report {
    char name[64];
    int error;                  /* 0 or the kernel's first NT_E* code */
    char message[320];          /* "" or the error message */
    double start_ns, end_ns;    /* on the core's simulated clock */
    double duration_ns;         /* end - start */
    double busy_ns[NT_ENGINE_COUNT];              /* DMA: time any queue was active */
    double dma_queue_busy_ns[NT_SIM_DMA_QUEUES];
    uint64_t instructions;
    double flops;               /* matmul FLOPs, 2*M*N*K */
    double tensor_ideal_ns;     /* time TensorE needs for them at peak */
    uint64_t hbm_read_bytes, hbm_write_bytes;
    int64_t sbuf_peak_bytes;    /* per partition */
    int64_t psum_peak_bytes;
} nt_sim_report;

/** Timing of the most recent instruction (plain data). */
typedef struct nt_sim_instr_info {
    const char *name;     /* "nc_matmul" (static) */
    nt_engine engine;     /* NT_ENGINE_DMA for dma_copy */
    int queue;            /* DMA queue, else -1 */
    double cycles;        /* engine cycles (0 for DMA) */
    double start_ns, end_ns;
} nt_sim_instr_info;

/** Opens a kernel named `name` (copied; for messages and the trace).
 *  Blocks until the simulated core is free, then owns it until
 *  nt_sim_kernel_end: never begin a second kernel on the same thread before
 *  ending the first.  The kernel starts when the previous one ended on the
 *  simulated clock.  Returns NULL only if memory runs out. */
NT_API nt_sim_kernel *nt_sim_kernel_begin(const char *name);
/** Closes k: completes its functional work, frees its tiles, adds its times
 *  to the global statistics, writes its trace events and releases the core.
 *  Fills *report if non-NULL.  Returns 0 or the kernel's first error.  k is
 *  invalid afterwards. */
NT_API int nt_sim_kernel_end(nt_sim_kernel *k, nt_sim_report *report);
/** Completes the functional work of the instructions issued so far, so
 *  their results are in HBM for the host to read.  Returns the kernel's
 *  error (0 if none).  Kernels that only read results after
 *  nt_sim_kernel_end never need it. */
NT_API int nt_sim_kernel_sync(nt_sim_kernel *k);
/** The kernel's first error code (0 if none) and its message ("" if none);
 *  the string is owned by k and valid until nt_sim_kernel_end. */
NT_API int nt_sim_kernel_error(const nt_sim_kernel *k);
NT_API const char *nt_sim_kernel_message(const nt_sim_kernel *k);
/** Timing of the last instruction issued in k; NT_ESTATE if none. */
NT_API int nt_sim_kernel_last(const nt_sim_kernel *k, nt_sim_instr_info *out);

/** Allocates a tile of `partitions` x `free_elems` elements of `dt` in SBUF
 *  or PSUM.  It occupies the same bytes in every partition.  A PSUM tile is
 *  at most one bank (2 KiB per partition) and never crosses a bank.  Returns
 *  NULL and sets the kernel's error (NT_ESIM, naming the kernel and the tile)
 *  if it does not fit.  `name` is copied. */
NT_API nt_tile *nt_tile_alloc(nt_sim_kernel *k, const char *name, nt_mem mem,
                              nt_dtype dt, int partitions, int64_t free_elems);
/** Returns t's space to k's allocator; later instructions that reuse the space
 *  wait for t's pending readers and writers.  Using t afterwards is an error. */
NT_API int nt_tile_release(nt_sim_kernel *k, nt_tile *t);
/** Largest tile (bytes per partition) that nt_tile_alloc could place now. */
NT_API int64_t nt_tile_free_bytes(const nt_sim_kernel *k, nt_mem mem);
/** A tile's dtype, partition count and free size (elements per partition);
 *  NT_DTYPE_COUNT / 0 for NULL. */
NT_API nt_dtype nt_tile_dtype(const nt_tile *t);
NT_API int nt_tile_partitions(const nt_tile *t);
NT_API int64_t nt_tile_size(const nt_tile *t); /* free elements per partition */

/** A view of memory as [np partitions] x [num[0] x ... x num[ndim-1]] with
 *  steps in elements (row-major: the last dim varies fastest; a step of 0
 *  repeats an element).  On-chip: the partitions p0 .. p0+np-1 of `tile`,
 *  element `offset` of each partition.  HBM (tile == NULL): row p starts at
 *  element offset + p*pstep of `hbm`.  Plain data: build it with the helpers
 *  below and edit num/step for 2-4-D views.  The simulator writes only
 *  through destination patterns. */
typedef struct nt_ap {
    nt_tile *tile;   /* SBUF/PSUM tile, or NULL for HBM */
    void *hbm;       /* HBM base pointer when tile == NULL */
    nt_dtype dtype;  /* must equal the tile's dtype on chip */
    int32_t p0, np;  /* partition start (relative to the tile) and count */
    int64_t pstep;   /* HBM only: elements between partition rows */
    int64_t offset;  /* elements */
    int32_t ndim;    /* 1 .. NT_AP_MAX_DIMS free dims */
    int64_t num[NT_AP_MAX_DIMS];
    int64_t step[NT_AP_MAX_DIMS];
} nt_ap;

/** The whole tile as [partitions, size]. */
NT_API nt_ap nt_tile_ap(const nt_tile *t);
/** Partitions [p0, p0+np) and free elements [f0, f0+nf) of t. */
NT_API nt_ap nt_tile_slice(const nt_tile *t, int p0, int np, int64_t f0, int64_t nf);
/** A 2-D HBM view: `rows` rows of `cols` contiguous elements of `dt`,
 *  row r at element offset + r*row_stride of base.  rows outside
 *  0..INT32_MAX gives np = -1, which every instruction refuses. */
NT_API nt_ap nt_hbm_ap(const void *base, nt_dtype dt, int64_t offset, int64_t rows,
                       int64_t row_stride, int64_t cols);

/* Instructions.  Each returns 0 or a negative NT_E* code (NT_ESIM for a
 * broken rule) and is a no-op returning the kernel's error once it failed.
 * Floating math is done in f32 and rounded once when written.  Lanes are
 * partitions: an elementwise instruction reads partition p0_in + i and
 * writes p0_out + i. */

/** A scalar operand: the per-partition value of a [np, 1] pattern `ap`
 *  (SBUF or PSUM, same partition count as the data) or, if ap is NULL, the
 *  immediate `imm`. */
typedef struct nt_isa_scalar {
    const nt_ap *ap;
    float imm;
} nt_isa_scalar;

/** One ALU step of tensor_scalar: x <op> operand, or operand <op> x when
 *  `reverse` is set. */
typedef struct nt_isa_alu {
    nt_alu_op op;
    nt_isa_scalar operand;
    bool reverse;
} nt_isa_alu;

/** An affine function of the position, for iota and affine_select:
 *  value = offset + channel_multiplier * p + sum_i step[i] * idx[i], with p
 *  the partition index within the destination pattern and idx[i] the index
 *  along its free dim i.  Computed in 32-bit integers. */
typedef struct nt_isa_affine {
    int32_t offset;
    int32_t channel_multiplier;
    int32_t step[NT_AP_MAX_DIMS];
} nt_isa_affine;

/** dst <- src on a DMA queue (0..15, or NT_DMA_QUEUE_AUTO).  HBM<->SBUF,
 *  SBUF<->SBUF or HBM<->HBM (never PSUM); same dtype (no conversion), same
 *  partition count, same number of free elements (shapes may differ: both
 *  are walked in row-major order).  HBM bytes moved are counted. */
NT_API int nt_isa_dma_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, int queue);

/** Indirect DMA (an embedding gather): partition i of dst (SBUF) receives
 *  row idx[i] of src, an HBM pattern whose row r starts at element
 *  offset + r * pstep and has src's free dims; src->np is the number of rows
 *  (the bound).  idx is an SBUF [dst->np, 1] pattern of i32 or u8 on dst's
 *  partitions.  An index outside [0, src->np) is a broken rule (NT_ESIM).
 *  src is not dependency-tracked: do not write it earlier in the kernel. */
NT_API int nt_isa_dma_gather(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                             const nt_ap *idx, int queue);

/** TensorE: dst[M, N] (+)= stationary[K, M]^T . moving[K, N].
 *  stationary and moving in SBUF, same dtype (f32, bf16 or f16), K <= 128
 *  partitions, M <= 128, N <= 512; dst an f32 PSUM pattern of M partitions
 *  and N contiguous elements inside one bank.  accumulate=false overwrites.
 *  Products accumulate in f32 exactly as the CPU backend's K-tile. */
NT_API int nt_isa_nc_matmul(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *stationary,
                            const nt_ap *moving, bool accumulate);

/** TensorE: dst[F, P] = src[P, F]^T with P, F <= 128; src in SBUF, dst in
 *  one PSUM bank with src's dtype or f32. */
NT_API int nt_isa_nc_transpose(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src);

/** dst = a <op> b elementwise (VectorE or GpSimd).  a and b may not both be
 *  in PSUM.  All-integer operands compute exactly in int32. */
NT_API int nt_isa_tensor_tensor(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *a,
                                const nt_ap *b, nt_alu_op op, nt_engine engine);

/** dst = (src <op0> operand0) <op1> operand1 (op1 may be NULL) on VectorE,
 *  ScalarE or GpSimd.  Operands are immediates or per-partition [np, 1]
 *  patterns.  All-integer operands compute exactly in int32. */
NT_API int nt_isa_tensor_scalar(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                const nt_isa_alu *op0, const nt_isa_alu *op1,
                                nt_engine engine);

/** ScalarE: dst = func(src * scale + bias).  scale and bias are optional
 *  (NULL): an absent one is not applied at all, so -0 stays -0.  If
 *  reduce_dst ([np, 1]) is given, the f32 results of each partition are also
 *  summed there in the canonical order of the CPU's sums. */
NT_API int nt_isa_activation(nt_sim_kernel *k, const nt_ap *dst, nt_act_func func,
                             const nt_ap *src, const nt_isa_scalar *scale,
                             const nt_isa_scalar *bias, const nt_ap *reduce_dst);

/** VectorE: reduces (NT_ALU_ADD, NT_ALU_MAX or NT_ALU_MIN) the innermost `naxes` free
 *  dims of src (0 = all of them); dst has the remaining elements per
 *  partition.  Each run is reduced exactly like the CPU's sum / max of that
 *  many elements: acc = +0 (or -Inf, +Inf); acc = op(acc, partial) over blocks of
 *  2048 in order, each block in a fixed 16-lane order. */
NT_API int nt_isa_tensor_reduce(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                nt_alu_op op, int naxes);

/** dst = src with dtype conversion (VectorE, ScalarE or GpSimd). */
NT_API int nt_isa_tensor_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                              nt_engine engine);

/** A 64-bit affine element index, for tensor_copy_sr: index = offset +
 *  channel_multiplier * p + sum_i step[i] * idx[i] over dst's partitions p
 *  and free dims i. */
typedef struct nt_isa_index {
    int64_t offset;
    int64_t channel_multiplier;
    int64_t step[NT_AP_MAX_DIMS];
} nt_isa_index;

/** dst = src with stochastic rounding (VectorE, ScalarE or GpSimd): an f32
 *  value going to a bf16 or f16 dst rounds to one of its two neighbours
 *  with the random bits of (key, its element index), exactly as the CPU
 *  backend's NT_STOCHASTIC_ROUNDING casts do (core/dtype.h); any other
 *  pair of dtypes converts as tensor_copy does. */
NT_API int nt_isa_tensor_copy_sr(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                 uint64_t key, const nt_isa_index *index, nt_engine engine);

/** dst = value (VectorE or GpSimd): (float)value rounded to dst's dtype;
 *  integer tiles get value truncated (saturated to int32). */
NT_API int nt_isa_memset(nt_sim_kernel *k, const nt_ap *dst, double value, nt_engine engine);

/** GpSimd: dst = the affine function of each position (SBUF only). */
NT_API int nt_isa_iota(nt_sim_kernel *k, const nt_ap *dst, const nt_isa_affine *expr);

/** GpSimd: dst = cmp(affine value, 0) ? on_true : on_false, where cmp is one
 *  of the comparison ALU ops (SBUF only). */
NT_API int nt_isa_affine_select(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *on_true,
                                const nt_isa_affine *pred, nt_alu_op cmp, float on_false);

/** dst = pred != 0 ? on_true : on_false elementwise (VectorE or GpSimd),
 *  like nl.where: pred is read as f32 (any dtype); the chosen value is
 *  rounded to dst (all-integer values are copied exactly).  Use a step-0
 *  pattern of a [np, 1] tile for a constant. */
NT_API int nt_isa_select(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *pred,
                         const nt_ap *on_true, const nt_ap *on_false, nt_engine engine);

/** VectorE: a scan along the free elements of each partition (row-major
 *  order), like NKI's tensor_tensor_scan: r = initial; for each j:
 *  r = (data0[j] <op0> r) <op1> data1[j]; dst[j] = r.  r stays f32 between
 *  steps; each dst[j] is rounded once.  initial: immediate or [np, 1]. */
NT_API int nt_isa_tensor_tensor_scan(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *data0,
                                     const nt_ap *data1, const nt_isa_scalar *initial,
                                     nt_alu_op op0, nt_alu_op op1);

/** One operand of a custom GpSimd operator, as its code sees it: partition
 *  p's n elements start at (char *)data + p * pstride. */
typedef struct nt_gpsimd_operand {
    void *data;
    int64_t pstride; /* bytes between partitions */
    nt_dtype dtype;
    int np;          /* partitions */
    int64_t n;       /* elements per partition, contiguous */
} nt_gpsimd_operand;

/** A custom GpSimd operator (like a Neuron custom C++ operator): reads src
 *  and writes dst (NULL for a check that writes nothing) on the host.  It
 *  may move data across partitions.  Returns 0, or a negative NT_E* code
 *  after writing a message into msg (msglen bytes): the instruction then
 *  fails with that code and message. */
typedef int (*nt_gpsimd_fn)(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src,
                            int nsrc, void *ctx, char *msg, size_t msglen);

/** GpSimd: runs fn over dst and src[0..nsrc) (nsrc <= 4; contiguous [np, n]
 *  SBUF patterns).  Costs 150 + cycles_per_elem * n cycles (n = free
 *  elements per partition of dst, or of src[0]).  `name` is for messages.
 *  fn is not called in timing-only mode. */
NT_API int nt_isa_gpsimd_custom(nt_sim_kernel *k, const char *name, const nt_ap *dst,
                                const nt_ap *const *src, int nsrc, double cycles_per_elem,
                                nt_gpsimd_fn fn, void *ctx);

/** Called by nt_tile_matmul for every finished accumulator block instead of
 *  its own store: acc is an f32 PSUM pattern [mw, nw] holding
 *  C[m0 .. m0+mw, n0 .. n0+nw]; the epilogue must read it (evacuate it)
 *  before returning, with any instructions.  Returns 0 or an error. */
typedef int (*nt_tile_matmul_epilogue)(nt_sim_kernel *k, const nt_ap *acc, int64_t m0,
                                       int64_t n0, void *ctx);

/** C[M, N] = A[M, K] . B[K, N] from HBM to HBM. */
typedef struct nt_tile_matmul_args {
    int64_t M, N, K;
    const void *a;        /* A [M, K] (row stride lda), or A^T [K, M] if a_trans */
    int64_t lda;
    bool a_trans;
    const void *b;        /* B [K, N], row stride ldb */
    int64_t ldb;
    nt_dtype in_dtype;    /* of A and B: f32, bf16 or f16 */
    void *c;              /* C [M, N], row stride ldc (unused with an epilogue) */
    int64_t ldc;
    nt_dtype out_dtype;   /* f32, bf16 or f16 */
    nt_tile_matmul_epilogue epilogue; /* NULL: round to out_dtype and store C */
    void *epilogue_ctx;
} nt_tile_matmul_args;

/** Issues into k a matmul program: PSUM accumulation over K-tiles of 128 in
 *  ascending order (bitwise equal to the CPU backend's matmul), one
 *  rounding to out_dtype, stationary panels reused across N, DMA spread over
 *  queues with multi-buffering.  Uses (and frees again) SBUF and PSUM left
 *  free in k.  Any M, N, K >= 0 and row strides. */
NT_API int nt_tile_matmul(nt_sim_kernel *k, const nt_tile_matmul_args *args);

/** Totals over all kernels since the start or the last reset (plain data). */
typedef struct nt_sim_stats {
    uint64_t kernels, instructions, errors;
    double sim_ns;                          /* sum of kernel durations */
    double clock_ns;                        /* the core's clock: end of the last kernel */
    double busy_ns[NT_ENGINE_COUNT];
    double utilization[NT_ENGINE_COUNT];    /* busy / sim_ns */
    double dma_queue_busy_ns[NT_SIM_DMA_QUEUES];
    uint64_t hbm_read_bytes, hbm_write_bytes;
    double hbm_bytes_per_ns;                /* peak used for the utilisation */
    double hbm_bw_utilization;              /* bytes / (sim_ns * peak) */
    double flops;                           /* matmul FLOPs */
    double tensor_ideal_ns;                 /* at TensorE peak for the dtypes used */
    double mfu;                             /* tensor_ideal_ns / sim_ns */
    double host_ns;                         /* wall time the host spent inside kernels */
    double host_gemm_ns;                    /* of which in nc_matmul's functional GEMM */
} nt_sim_stats;

/** Fills *out with the totals.  Thread-safe; after nt_init it covers every
 *  op the runtime ran on the simulator. */
NT_API int nt_sim_stats_get(nt_sim_stats *out);
/** Zeroes the totals (not the clock, which only moves forward).  Thread-safe. */
NT_API void nt_sim_stats_reset(void);

/** A device tensor as a tile kernel sees it (plain data): element
 *  [i0, i1, ...] is at data + (i0 * stride[0] + i1 * stride[1] + ...) *
 *  nt_dtype_size(dtype), an HBM address to use in nt_ap patterns. */
typedef struct nt_tensor_view {
    void *data;
    nt_dtype dtype;
    int ndim;
    int64_t shape[NT_MAX_DIMS];
    int64_t stride[NT_MAX_DIMS]; /* in elements */
} nt_tensor_view;

/** A user op whose forward is a tile kernel on the simulator.  Called with
 *  nt_op_call like an nt_op_register op; it is queued, ordered and
 *  reported like a built-in op. */
typedef struct nt_kernel_op_def {
    const char *name; /* for messages, the trace and kernel names (copied) */
    int nin;          /* tensor inputs: 1..4 */
    /** The shape rule, run by nt_op_call before anything is queued: given
     *  the inputs' dtypes and shapes (data and strides are filled but the
     *  data may not be computed yet: do not read it), set out->dtype,
     *  out->ndim (0..NT_MAX_DIMS) and out->shape.  Return 0, or a negative
     *  NT_E* code after writing the reason into why (whylen bytes):
     *  nt_op_call then fails with that code, naming the op. */
    int (*shape)(const nt_tensor_view *in, int nin, nt_tensor_view *out, char *why,
                 size_t whylen, void *ctx);
    /** The kernel: issue instructions into k (opened and closed by the
     *  runtime, named after the op) that read in[0..nin) and write out (a
     *  fresh contiguous tensor).  Return 0 or a negative code; an error (or
     *  a broken rule) poisons the output, and the next sync on it reports
     *  it with the op's name and the nt_op_call site. */
    int (*kernel)(nt_sim_kernel *k, const nt_tensor_view *in, int nin,
                  const nt_tensor_view *out, void *ctx);
    /** Optional: as nt_op_def.backward (ntensor ops, gin[i] shaped like
     *  in[i]); NULL for an op without a gradient. */
    int (*backward)(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                    void *ctx);
    void *ctx;        /* passed to all three; must outlive the op */
} nt_kernel_op_def;

/** Registers a tile-kernel op; returns its id for nt_op_call, or a negative
 *  error (NULL def, shape or kernel, nin out of range, empty or duplicate
 *  name).  The kernel always runs on the simulator (NT_BACKEND=cpu does not
 *  apply: it has no CPU form).  Thread-safe. */
NT_API int nt_op_register_kernel(const nt_kernel_op_def *def);

/* ------------------------------------------------------------------------ */
/* Call-site capture.  Each entry point X also exists as X_at taking the     */
/* caller's site first; in C the macros below route X(...) to X_at.          */
/* ------------------------------------------------------------------------ */

#define NT_DECL_AT(ret, name, ...) NT_API ret name##_at(const nt_site *site, __VA_ARGS__)
NT_DECL_AT(nt_tensor *, nt_from_host, const void *, nt_dtype, int, const int64_t *);
NT_DECL_AT(nt_tensor *, nt_zeros, nt_dtype, int, const int64_t *);
NT_DECL_AT(nt_tensor *, nt_ones, nt_dtype, int, const int64_t *);
NT_DECL_AT(nt_tensor *, nt_full, nt_dtype, int, const int64_t *, double);
NT_DECL_AT(nt_tensor *, nt_zeros_like, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_ones_like, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_full_like, nt_tensor *, double);
NT_DECL_AT(nt_tensor *, nt_arange, nt_dtype, double, double, double);
NT_DECL_AT(nt_tensor *, nt_rand, nt_dtype, int, const int64_t *, uint64_t);
NT_DECL_AT(nt_tensor *, nt_randn, nt_dtype, int, const int64_t *, uint64_t);
NT_DECL_AT(int, nt_to_host, nt_tensor *, void *, size_t);
NT_DECL_AT(int, nt_item, nt_tensor *, double *);
NT_DECL_AT(int, nt_print, nt_tensor *);
NT_DECL_AT(char *, nt_format, nt_tensor *);
NT_API int nt_sync_at(const nt_site *site);
NT_DECL_AT(nt_tensor *, nt_add, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_sub, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_mul, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_div, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_maximum, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_minimum, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_eq, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_ne, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_lt, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_le, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_gt, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_ge, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_where, nt_tensor *, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_add_scalar, nt_tensor *, double);
NT_DECL_AT(nt_tensor *, nt_mul_scalar, nt_tensor *, double);
NT_DECL_AT(nt_tensor *, nt_div_scalar, nt_tensor *, double);
NT_DECL_AT(nt_tensor *, nt_pow_scalar, nt_tensor *, double);
NT_DECL_AT(nt_tensor *, nt_clamp, nt_tensor *, double, double);
NT_DECL_AT(nt_tensor *, nt_neg, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_exp, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_log, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_sqrt, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_rsqrt, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_abs, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_relu, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_gelu, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_sigmoid, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_tanh, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_silu, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_cast, nt_tensor *, nt_dtype);
NT_DECL_AT(nt_tensor *, nt_cast_sr, nt_tensor *, nt_dtype);
NT_DECL_AT(nt_tensor *, nt_matmul, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_linear, nt_tensor *, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_sum, nt_tensor *, int, bool);
NT_DECL_AT(nt_tensor *, nt_mean, nt_tensor *, int, bool);
NT_DECL_AT(nt_tensor *, nt_max, nt_tensor *, int, bool);
NT_DECL_AT(nt_tensor *, nt_argmax, nt_tensor *, int, bool);
NT_DECL_AT(nt_tensor *, nt_min, nt_tensor *, int, bool);
NT_DECL_AT(nt_tensor *, nt_argmin, nt_tensor *, int, bool);
NT_DECL_AT(nt_tensor *, nt_any, nt_tensor *, int, bool);
NT_DECL_AT(nt_tensor *, nt_norm, nt_tensor *, double, int, bool);
NT_DECL_AT(nt_tensor *, nt_gather, nt_tensor *, int, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_index_select, nt_tensor *, int, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_repeat, nt_tensor *, const int64_t *, int);
NT_DECL_AT(int, nt_split, nt_tensor *, int64_t, int, nt_tensor **, int);
NT_DECL_AT(nt_tensor *, nt_softmax, nt_tensor *, int);
NT_DECL_AT(nt_tensor *, nt_log_softmax, nt_tensor *, int);
NT_DECL_AT(nt_tensor *, nt_layer_norm, nt_tensor *, nt_tensor *, nt_tensor *, double);
NT_DECL_AT(nt_tensor *, nt_rms_norm, nt_tensor *, nt_tensor *, double);
NT_DECL_AT(nt_tensor *, nt_cross_entropy, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_mse_loss, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_embedding, nt_tensor *, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_reshape, nt_tensor *, int, const int64_t *);
NT_DECL_AT(nt_tensor *, nt_transpose, nt_tensor *, int, int);
NT_DECL_AT(nt_tensor *, nt_permute, nt_tensor *, const int *);
NT_DECL_AT(nt_tensor *, nt_slice, nt_tensor *, int, int64_t, int64_t, int64_t);
NT_DECL_AT(nt_tensor *, nt_expand, nt_tensor *, int, const int64_t *);
NT_DECL_AT(nt_tensor *, nt_cat, nt_tensor *const *, int, int);
NT_DECL_AT(nt_tensor *, nt_contiguous, nt_tensor *);
NT_DECL_AT(int, nt_copy_into, nt_tensor *, nt_tensor *);
NT_DECL_AT(int, nt_add_inplace, nt_tensor *, nt_tensor *);
NT_DECL_AT(int, nt_sub_inplace, nt_tensor *, nt_tensor *);
NT_DECL_AT(int, nt_mul_inplace, nt_tensor *, nt_tensor *);
NT_DECL_AT(int, nt_div_inplace, nt_tensor *, nt_tensor *);
NT_DECL_AT(int, nt_add_scalar_inplace, nt_tensor *, double);
NT_DECL_AT(int, nt_mul_scalar_inplace, nt_tensor *, double);
NT_DECL_AT(int, nt_fill_inplace, nt_tensor *, double);
NT_DECL_AT(int, nt_relu_inplace, nt_tensor *);
NT_DECL_AT(int, nt_neg_inplace, nt_tensor *);
NT_DECL_AT(int, nt_clamp_inplace, nt_tensor *, double, double);
NT_DECL_AT(int, nt_backward, nt_tensor *);
NT_DECL_AT(int, nt_backward_ex, nt_tensor *, bool);
NT_DECL_AT(nt_tensor *, nt_detach, nt_tensor *);
NT_DECL_AT(nt_tensor *, nt_op_call, int, nt_tensor *const *);

#if !defined(__cplusplus) && !defined(NT_NO_SITE_MACROS) && !defined(NT_BUILDING_LIBRARY)
/** The caller's site, as a compound literal living for the call. */
#define NT_HERE (&(const nt_site){__FILE__, __func__, __LINE__, 0})
#define nt_from_host(...) nt_from_host_at(NT_HERE, __VA_ARGS__)
#define nt_zeros(...) nt_zeros_at(NT_HERE, __VA_ARGS__)
#define nt_ones(...) nt_ones_at(NT_HERE, __VA_ARGS__)
#define nt_full(...) nt_full_at(NT_HERE, __VA_ARGS__)
#define nt_zeros_like(...) nt_zeros_like_at(NT_HERE, __VA_ARGS__)
#define nt_ones_like(...) nt_ones_like_at(NT_HERE, __VA_ARGS__)
#define nt_full_like(...) nt_full_like_at(NT_HERE, __VA_ARGS__)
#define nt_arange(...) nt_arange_at(NT_HERE, __VA_ARGS__)
#define nt_rand(...) nt_rand_at(NT_HERE, __VA_ARGS__)
#define nt_randn(...) nt_randn_at(NT_HERE, __VA_ARGS__)
#define nt_to_host(...) nt_to_host_at(NT_HERE, __VA_ARGS__)
#define nt_item(...) nt_item_at(NT_HERE, __VA_ARGS__)
#define nt_print(...) nt_print_at(NT_HERE, __VA_ARGS__)
#define nt_format(...) nt_format_at(NT_HERE, __VA_ARGS__)
#define nt_sync() nt_sync_at(NT_HERE)
#define nt_add(...) nt_add_at(NT_HERE, __VA_ARGS__)
#define nt_sub(...) nt_sub_at(NT_HERE, __VA_ARGS__)
#define nt_mul(...) nt_mul_at(NT_HERE, __VA_ARGS__)
#define nt_div(...) nt_div_at(NT_HERE, __VA_ARGS__)
#define nt_maximum(...) nt_maximum_at(NT_HERE, __VA_ARGS__)
#define nt_minimum(...) nt_minimum_at(NT_HERE, __VA_ARGS__)
#define nt_eq(...) nt_eq_at(NT_HERE, __VA_ARGS__)
#define nt_ne(...) nt_ne_at(NT_HERE, __VA_ARGS__)
#define nt_lt(...) nt_lt_at(NT_HERE, __VA_ARGS__)
#define nt_le(...) nt_le_at(NT_HERE, __VA_ARGS__)
#define nt_gt(...) nt_gt_at(NT_HERE, __VA_ARGS__)
#define nt_ge(...) nt_ge_at(NT_HERE, __VA_ARGS__)
#define nt_where(...) nt_where_at(NT_HERE, __VA_ARGS__)
#define nt_add_scalar(...) nt_add_scalar_at(NT_HERE, __VA_ARGS__)
#define nt_mul_scalar(...) nt_mul_scalar_at(NT_HERE, __VA_ARGS__)
#define nt_div_scalar(...) nt_div_scalar_at(NT_HERE, __VA_ARGS__)
#define nt_pow_scalar(...) nt_pow_scalar_at(NT_HERE, __VA_ARGS__)
#define nt_clamp(...) nt_clamp_at(NT_HERE, __VA_ARGS__)
#define nt_neg(...) nt_neg_at(NT_HERE, __VA_ARGS__)
#define nt_exp(...) nt_exp_at(NT_HERE, __VA_ARGS__)
#define nt_log(...) nt_log_at(NT_HERE, __VA_ARGS__)
#define nt_sqrt(...) nt_sqrt_at(NT_HERE, __VA_ARGS__)
#define nt_rsqrt(...) nt_rsqrt_at(NT_HERE, __VA_ARGS__)
#define nt_abs(...) nt_abs_at(NT_HERE, __VA_ARGS__)
#define nt_relu(...) nt_relu_at(NT_HERE, __VA_ARGS__)
#define nt_gelu(...) nt_gelu_at(NT_HERE, __VA_ARGS__)
#define nt_sigmoid(...) nt_sigmoid_at(NT_HERE, __VA_ARGS__)
#define nt_tanh(...) nt_tanh_at(NT_HERE, __VA_ARGS__)
#define nt_silu(...) nt_silu_at(NT_HERE, __VA_ARGS__)
#define nt_cast(...) nt_cast_at(NT_HERE, __VA_ARGS__)
#define nt_cast_sr(...) nt_cast_sr_at(NT_HERE, __VA_ARGS__)
#define nt_matmul(...) nt_matmul_at(NT_HERE, __VA_ARGS__)
#define nt_linear(...) nt_linear_at(NT_HERE, __VA_ARGS__)
#define nt_sum(...) nt_sum_at(NT_HERE, __VA_ARGS__)
#define nt_mean(...) nt_mean_at(NT_HERE, __VA_ARGS__)
#define nt_max(...) nt_max_at(NT_HERE, __VA_ARGS__)
#define nt_argmax(...) nt_argmax_at(NT_HERE, __VA_ARGS__)
#define nt_min(...) nt_min_at(NT_HERE, __VA_ARGS__)
#define nt_argmin(...) nt_argmin_at(NT_HERE, __VA_ARGS__)
#define nt_any(...) nt_any_at(NT_HERE, __VA_ARGS__)
#define nt_norm(...) nt_norm_at(NT_HERE, __VA_ARGS__)
#define nt_gather(...) nt_gather_at(NT_HERE, __VA_ARGS__)
#define nt_index_select(...) nt_index_select_at(NT_HERE, __VA_ARGS__)
#define nt_repeat(...) nt_repeat_at(NT_HERE, __VA_ARGS__)
#define nt_split(...) nt_split_at(NT_HERE, __VA_ARGS__)
#define nt_softmax(...) nt_softmax_at(NT_HERE, __VA_ARGS__)
#define nt_log_softmax(...) nt_log_softmax_at(NT_HERE, __VA_ARGS__)
#define nt_layer_norm(...) nt_layer_norm_at(NT_HERE, __VA_ARGS__)
#define nt_rms_norm(...) nt_rms_norm_at(NT_HERE, __VA_ARGS__)
#define nt_cross_entropy(...) nt_cross_entropy_at(NT_HERE, __VA_ARGS__)
#define nt_mse_loss(...) nt_mse_loss_at(NT_HERE, __VA_ARGS__)
#define nt_embedding(...) nt_embedding_at(NT_HERE, __VA_ARGS__)
#define nt_reshape(...) nt_reshape_at(NT_HERE, __VA_ARGS__)
#define nt_transpose(...) nt_transpose_at(NT_HERE, __VA_ARGS__)
#define nt_permute(...) nt_permute_at(NT_HERE, __VA_ARGS__)
#define nt_slice(...) nt_slice_at(NT_HERE, __VA_ARGS__)
#define nt_expand(...) nt_expand_at(NT_HERE, __VA_ARGS__)
#define nt_cat(...) nt_cat_at(NT_HERE, __VA_ARGS__)
#define nt_contiguous(...) nt_contiguous_at(NT_HERE, __VA_ARGS__)
#define nt_copy_into(...) nt_copy_into_at(NT_HERE, __VA_ARGS__)
#define nt_add_inplace(...) nt_add_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_sub_inplace(...) nt_sub_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_mul_inplace(...) nt_mul_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_div_inplace(...) nt_div_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_add_scalar_inplace(...) nt_add_scalar_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_mul_scalar_inplace(...) nt_mul_scalar_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_fill_inplace(...) nt_fill_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_relu_inplace(...) nt_relu_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_neg_inplace(...) nt_neg_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_clamp_inplace(...) nt_clamp_inplace_at(NT_HERE, __VA_ARGS__)
#define nt_backward(...) nt_backward_at(NT_HERE, __VA_ARGS__)
#define nt_backward_ex(...) nt_backward_ex_at(NT_HERE, __VA_ARGS__)
#define nt_detach(...) nt_detach_at(NT_HERE, __VA_ARGS__)
#define nt_op_call(...) nt_op_call_at(NT_HERE, __VA_ARGS__)
#endif

#ifdef __cplusplus
}
#endif
#endif /* NTENSOR_H */
