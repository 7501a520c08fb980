/*
 * ntensor.h - the public header of ntensor, an adaptive eager execution
 * runtime for C training programs.  Include this file only; it includes the
 * parts under include/ntensor/: sim.h (the simulated NeuronCore's
 * instruction set and user tile kernels), and the generated ops.h (the op
 * table's elementwise ops) and site.h (the call-site layer).
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
 * Call sites.  In C and C++, every op and sync point is also a macro that passes the
 *   caller's __FILE__, __LINE__ and __func__ (see "Call-site capture" at the
 *   end) so that errors, the fusion log and traces name the user's line.
 *   Define NT_NO_SITE_MACROS before including this header to get plain
 *   function calls only (then the return address stands in for the site);
 *   NT_HERE and the X_at forms stay available.
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
    X(EHOSTMEM, -16, "out of host memory")                                  \
    X(ETIMEDOUT, -17, "collective timed out waiting for its peers")         \
    X(ECOMM, -18, "communication between processes failed")

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
 *  nt_clear_error().  Thread-local.  At most 4095 bytes: a longer message
 *  (one quoting a very long path) loses the middle of its text, marked
 *  " [...] ", never the function's name or a call site; a call site's file
 *  name longer than about 1000 bytes loses its start ("...dir/f.c:12 in
 *  main"), never the line or the function. */
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
    NT_F64,     /* IEEE binary64: CPU backend only (docs/ops.md "Dtypes") */
    NT_I64,     /* int64: indices, casts, basic arithmetic (CPU backend only) */
    NT_BOOL,    /* bool, one byte 0 or 1: masks (CPU backend only) */
    NT_E4M3,    /* OCP FP8 E4M3 ("fn"): bias 7, max 448, no infinities; a storage
                 * dtype: casts, copies, views and the fp8 matmul only
                 * (docs/ops.md "fp8") */
    NT_E5M2,    /* OCP FP8 E5M2: bias 15, max 57344, IEEE infinities and NaNs;
                 * a storage dtype as NT_E4M3 */
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

#ifndef __cplusplus
/** The caller's site, as a compound literal living for the call: pass it to
 *  an X_at form.  Defined with NT_NO_SITE_MACROS too. */
#define NT_HERE (&(const nt_site){__FILE__, __func__, __LINE__, 0})
#else
/* C++ has no compound literals: a temporary nt_site, which lives to the end
 * of the full expression, that is, through the X_at call it is passed to. */
static inline const nt_site *nt__site_of(const nt_site &s) { return &s; }
#define NT_HERE (nt__site_of(nt_site{__FILE__, __func__, __LINE__, 0}))
#endif

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
 *  owns.  Handles still held by the user become invalid: after the next
 *  nt_init, a tensor, stream, event, scope, optimizer, loss scaler,
 *  communicator, nt_ddp, graph or user op id made before is refused with
 *  NT_ESTATE naming the function and the argument (metadata queries give
 *  their sentinel), as long as its memory has not been reused: handle
 *  memory is kept for the process, and the next runtime reuses it for new
 *  objects of the kind, those the program still held last.  The destroy
 *  functions still free the objects of the ended runtime that the program
 *  owns (events, optimizers, ...).  NT_STATS=1 prints a summary here.  Call
 *  once, from one thread, when no other thread uses the library; nt_init()
 *  may be called again afterwards. */
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
 *  after NT_HANDLE_QUARANTINE (default 4096) other handles the program
 *  could see were released after it (tensors a function returned; not the
 *  temporaries a call makes and drops inside, which never count), and never
 *  with NT_HANDLE_QUARANTINE=all (docs/env.md).  A pointer kept longer than
 *  that may name the new tensor, and a use of it cannot be told from a use
 *  of that tensor: do not keep released handles.  A handle from before the
 *  last nt_shutdown is NT_ESTATE (see nt_shutdown). */
NT_API int nt_release(nt_tensor *t);
/** Opens a scope on the calling thread.  Every tensor returned to this thread
 *  while it is the innermost open scope is released by nt_scope_end.  NULL
 *  (NT_EHOSTMEM) if the host is out of memory; an op whose result the scope
 *  has no memory to record returns NULL with NT_EHOSTMEM too. */
NT_API nt_scope *nt_scope_begin(void);
/** Closes `s` (and any scope opened inside it and not closed), releasing the
 *  tensors it owns.  Must be called on the thread that opened it, under the
 *  runtime that opened it: else NT_ESTATE naming the argument.  (A scope a
 *  thread leaves open across nt_shutdown owns nothing after the next
 *  nt_init: that thread's new tensors are its own.) */
NT_API int nt_scope_end(nt_scope *s);
/** Moves t out of the scope that owns it into the caller's ownership (the
 *  caller must nt_release it).  Returns t. */
NT_API nt_tensor *nt_keep(nt_tensor *t);

/* ------------------------------------------------------------------------ */
/* Elementwise ops.  Binary ops broadcast like NumPy and promote dtypes     */
/* (float beats int, f32 beats bf16/f16, bf16 with f16 gives f32, i32 beats */
/* u8).  Floating math is done in f32 and rounded once to the result dtype. */
/* ------------------------------------------------------------------------ */

/* The op table's unary ops (nt_neg, nt_exp, nt_relu, nt_gelu ...), binary
 * ops (nt_add, nt_sub, nt_mul, nt_div, nt_maximum, nt_minimum) and
 * comparisons (nt_eq, nt_lt ...) are declared in include/ntensor/ops.h,
 * generated from core/optable.h; docs/ops.md (section 3) gives each one's
 * exact arithmetic and dtype rules. */
#include "ntensor/ops.h"

/** cond ? a : b, elementwise, all three broadcast together; cond is any
 *  dtype (nonzero is true); the result has a's and b's promoted dtype. */
NT_API nt_tensor *nt_where(nt_tensor *cond, nt_tensor *a, nt_tensor *b);

/** The lower (tril) or upper (triu) triangle of the last two dims of t,
 *  batched over the leading ones, the rest zero: element (i, j) is kept when
 *  j - i <= diagonal (tril) or j - i >= diagonal (triu), like torch.tril and
 *  torch.triu.  Any dtype and any diagonal; t needs at least 2 dims.  The
 *  gradient passes through the same triangle. */
NT_API nt_tensor *nt_tril(nt_tensor *t, int64_t diagonal);
NT_API nt_tensor *nt_triu(nt_tensor *t, int64_t diagonal);
/** t with `value` where the u8 `mask` (broadcast to t's shape) is nonzero,
 *  like torch.Tensor.masked_fill.  value rounds to t's dtype exactly as
 *  nt_full rounds it (NaN into an integer dtype is accepted and stored as
 *  nt_full stores it).  The gradient is g where mask is 0, 0 elsewhere; the
 *  mask gets none. */
NT_API nt_tensor *nt_masked_fill(nt_tensor *t, nt_tensor *mask, double value);

/** Tensor-scalar ops.  The result keeps t's dtype, except that an integer
 *  tensor with a non-integral scalar gives f32. */
NT_API nt_tensor *nt_add_scalar(nt_tensor *t, double s); /* t + s */
NT_API nt_tensor *nt_mul_scalar(nt_tensor *t, double s); /* t * s */
NT_API nt_tensor *nt_div_scalar(nt_tensor *t, double s); /* t / s */
NT_API nt_tensor *nt_pow_scalar(nt_tensor *t, double s); /* t ^ s (float result) */
NT_API nt_tensor *nt_clamp(nt_tensor *t, double lo, double hi); /* min(max(t, lo), hi) */
/** PyTorch's leaky_relu and hardtanh (floating inputs only; an integer input
 *  is NT_EDTYPE): t > 0 ? t : t * negative_slope, and t clamped to
 *  [min_val, max_val] (min_val > max_val or a NaN bound is NT_EINVAL). */
NT_API nt_tensor *nt_leaky_relu(nt_tensor *t, double negative_slope);
NT_API nt_tensor *nt_hardtanh(nt_tensor *t, double min_val, double max_val);

/** Converts to dtype `dt` (round to nearest even for floats; float to int
 *  truncates toward zero, saturates, and maps NaN to 0; int to u8 wraps).
 *  f64 to f32 rounds once; to bf16/f16 through f32 (PyTorch's); every
 *  dtype to f64 is exact.  Casting to t's own dtype gives a new handle on t's storage. */
NT_API nt_tensor *nt_cast(nt_tensor *t, nt_dtype dt);
/** Casts an f32 tensor to bf16 or f16, or an f32, bf16 or f16 tensor to
 *  NT_E4M3 or NT_E5M2, with stochastic rounding: each element
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
/** fp8 matrix product with per-tensor scales (torch._scaled_mm's
 *  arithmetic): out = round_out_dtype(acc * round_f32(scale_a * scale_b)),
 *  acc = sum_k a[m,k] * b[k,n] in f32 (each product exact), in nt_matmul's
 *  K order (K-tiles of 128, ascending), so the CPU and the simulator give
 *  the same bits.  a, b: both NT_E4M3 or both NT_E5M2, nt_matmul's shapes
 *  (1-D promoted, batch dims broadcast); scale_a, scale_b: one-element
 *  (shape [] or [1]) f32 tensors on a's device, read when the op runs (a
 *  captured graph replays with their new values); a scale of 0, Inf or NaN
 *  is applied as IEEE arithmetic, not checked (docs/ops.md "fp8");
 *  out_dtype NT_F32 or NT_BF16.  Not differentiable: an operand that
 *  requires grad is NT_EINVAL (fp8 autocast differentiates through its
 *  casts).  Other dtypes or shapes: NT_EDTYPE / NT_ESHAPE naming the
 *  argument; operands on different devices as nt_matmul. */
NT_API nt_tensor *nt_matmul_fp8(nt_tensor *a, nt_tensor *b, nt_tensor *scale_a,
                                nt_tensor *scale_b, nt_dtype out_dtype);
/** x[..., in] . w[out, in]^T + b[out]; b may be NULL.  Same as
 *  nt_add(nt_matmul(x, nt_transpose(w, 0, 1)), b), op for op. */
NT_API nt_tensor *nt_linear(nt_tensor *x, nt_tensor *w, nt_tensor *b);
/** torch.einsum (PyTorch 1.13 semantics): the contraction the equation
 *  describes over the n operands, e.g. "bij,bjk->bik", "ii->i", "...ij->...ji"
 *  or, without "->", the implicit output (the '...' dims, then the letters
 *  that occur once, in ASCII order: 'A'..'Z' before 'a'..'z').  Subscripts
 *  are letters [a-zA-Z]; spaces are ignored; a '...' (at most one per
 *  operand and one in the output) stands for an operand's remaining dims,
 *  broadcast right-aligned; a letter repeated in one operand takes that
 *  operand's diagonal; letters not in the output are summed; dims of size 1
 *  broadcast against the letter's size elsewhere.  Operands: one floating
 *  dtype (f32, bf16, f16; PyTorch also takes integers).  Lowered, left to
 *  right over the operands, to nt_diagonal, nt_permute, nt_reshape,
 *  nt_sum_dims, nt_mul and batched nt_matmul (docs/ops.md, "einsum", fixes
 *  which dims are summed first and which form the matmul's K, in which
 *  order): their bits on every backend and mode, their gradients.  Always
 *  a new contiguous tensor.  Errors, nothing queued: NT_EINVAL (equation or
 *  operands NULL, n < 1 or not the equation's operand count, a character
 *  other than those, a misplaced '.', '-', '>' or ',', a second '...' or
 *  '->', an output letter in no operand or repeated), NT_ESHAPE (a
 *  subscript count that does not match an operand's dims, sizes of one
 *  letter that are neither equal nor 1, a diagonal of unequal dims, more
 *  than NT_MAX_DIMS dims in the output or a step), NT_EDTYPE. */
NT_API nt_tensor *nt_einsum(const char *equation, int n, nt_tensor *const *operands);

/* ------------------------------------------------------------------------ */
/* Reductions and row ops.  `dim` may be negative (counts from the end);     */
/* NT_DIM_ALL reduces every dim.  One summation order, fixed by the shape.   */
/* ------------------------------------------------------------------------ */

/** torch.sum over `dim`: floats in the canonical f32 order (f64 in double),
 *  t's dtype out; i32 and u8 sum in i32 (wrapping; PyTorch: i64); i64 and
 *  bool sum in i64 (wrapping), an i64 result, as PyTorch.  max, min, argmax,
 *  argmin, any, nt_amax and nt_amin also take i64 and bool (bool max is
 *  `or`, min `and`), on the CPU backend (docs/ops.md "i64 and bool"). */
NT_API nt_tensor *nt_sum(nt_tensor *t, int dim, bool keepdim);
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
/** torch.all: u8 1 where every element over `dim` (or NT_DIM_ALL) is
 *  nonzero (NaN is nonzero), else 0; an empty dim gives 1.  Every dtype.
 *  Computed as (nt_any(t == 0) == 0): its bits on every backend and mode.
 *  Not differentiable.  Errors as nt_any (NT_EDIM naming nt_all). */
NT_API nt_tensor *nt_all(nt_tensor *t, int dim, bool keepdim);
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
/* Reductions over a list of dims.  `dims` holds `ndims` dims (each may be
 * negative; a repeated or out-of-range dim is NT_EDIM naming 'dims'); ndims
 * 0 reduces every dim (PyTorch 1.13's empty dim list).  The reduced dims'
 * elements are taken in row-major order (as if those dims were moved last,
 * in their order, and flattened) and reduced in the canonical order of
 * every reduction (docs/ops.md, "Reductions over several dims"): the same
 * bits as nt_sum over one dim, or over NT_DIM_ALL, of that flattening. */
/** torch.sum(t, dims, keepdim): ints sum in i32, as nt_sum. */
NT_API nt_tensor *nt_sum_dims(nt_tensor *t, int ndims, const int *dims, bool keepdim);
/** torch.mean(t, dims, keepdim): the sum above / n, floating dtypes only
 *  (NT_EDTYPE). */
NT_API nt_tensor *nt_mean_dims(nt_tensor *t, int ndims, const int *dims, bool keepdim);
/** torch.amax: the maximum over the dims, every dtype, same dtype out; a
 *  NaN propagates; no elements is NT_ESHAPE.  Gradient: g shared evenly
 *  among the elements equal to the maximum (NaN over a row whose maximum
 *  is NaN), as PyTorch 1.13. */
NT_API nt_tensor *nt_amax(nt_tensor *t, int ndims, const int *dims, bool keepdim);
/** torch.amin: nt_amax with the minimum. */
NT_API nt_tensor *nt_amin(nt_tensor *t, int ndims, const int *dims, bool keepdim);
/** torch.var(t, dims, correction=, keepdim): sum((x - mean)^2) / max(n -
 *  correction, 0) over the dims (correction 1: PyTorch's default unbiased
 *  estimate; 0: the biased one).  Floating dtypes only (NT_EDTYPE for
 *  integers, as PyTorch); computed in f32 (f64: in double; mean by
 *  nt_mean_dims, the squares' sum by nt_sum_dims) and rounded once to t's
 *  dtype.  n <=
 *  correction gives Inf or NaN (a division by 0), as PyTorch.  NaN
 *  correction: NT_EINVAL. */
NT_API nt_tensor *nt_var(nt_tensor *t, int ndims, const int *dims, double correction,
                         bool keepdim);
/** torch.std: sqrt of nt_var's f32 value, rounded once to t's dtype. */
NT_API nt_tensor *nt_std(nt_tensor *t, int ndims, const int *dims, double correction,
                         bool keepdim);
/** torch.logsumexp: log(sum(exp(x - m))) + m over the dims, m the maximum
 *  (0 where it is +-Inf, as PyTorch: a row of -Inf gives -Inf, a row with
 *  +Inf gives +Inf); no elements give -Inf.  In f32 (f64: in double),
 *  rounded once to t's dtype (integers give f32, as PyTorch 1.13).  Gradient: softmax(x) g. */
NT_API nt_tensor *nt_logsumexp(nt_tensor *t, int ndims, const int *dims, bool keepdim);
/** torch.prod over `dim` (or NT_DIM_ALL: every element in row-major order):
 *  the product taken sequentially along the dim, x0 * x1 * x2 ...  Floating
 *  dtypes keep theirs (f64 multiplies in double, the others in f32);
 *  i32 and u8 multiply in i32 (wrapping; PyTorch: i64), i64 and bool in
 *  i64 (wrapping), an i64 result as PyTorch's.
 *  No elements give 1.  The gradient has no division: exact with zeros in
 *  the row (the product of the other elements), as PyTorch. */
NT_API nt_tensor *nt_prod(nt_tensor *t, int dim, bool keepdim);
/** torch.cumsum along `dim`: y_i = y_(i-1) + x_i in order, the running value
 *  in f32 (f64: in double) and each y_i rounded once to t's dtype.  i32
 *  and u8 in i32 (PyTorch: i64); i64 and bool in i64.  NT_DIM_ALL is
 *  NT_EDIM. */
NT_API nt_tensor *nt_cumsum(nt_tensor *t, int dim);
/** torch.cumprod along `dim`: y_i = y_(i-1) * x_i in order, integers as
 *  nt_cumsum.  The gradient is exact with zeros along the dim. */
NT_API nt_tensor *nt_cumprod(nt_tensor *t, int dim);
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
 *  logits [N, C] floating, labels [N] i32, i64 or u8 in [0, C) (checked when it runs).
 *  Logits [N, C, d1, ...] with labels [N, d1, ...], as PyTorch: the class
 *  dim moved last and the rows flattened in the order of [N, d1, ...]
 *  (the same bits as the 2-D call on those rows).
 *  N = 0 gives NaN (a mean over no rows), as PyTorch. */
NT_API nt_tensor *nt_cross_entropy(nt_tensor *logits, nt_tensor *labels);
/** nt_cross_entropy with PyTorch's ignore_index (rows whose label equals it
 *  add nothing and do not count in the mean; -100 is PyTorch's default; all
 *  rows ignored, or no rows (N = 0, any C), gives NaN, as there) and
 *  label_smoothing in [0, 1]:
 *  (1 - eps) * nll + eps / C * sum_c(-log_softmax(logits)[i, c]), each part
 *  averaged over the rows not ignored.  Labels out of [0, C) that are not
 *  ignore_index are an error when it runs.  A composite of ntensor ops
 *  (docs/ops.md); nt_cross_entropy(l, y) == nt_cross_entropy_ex(l, y, -100,
 *  0.0) bit for bit. */
NT_API nt_tensor *nt_cross_entropy_ex(nt_tensor *logits, nt_tensor *labels,
                                      int64_t ignore_index, double label_smoothing);
/** mean((a - b)^2) over every element; a and b have the same shape. */
NT_API nt_tensor *nt_mse_loss(nt_tensor *a, nt_tensor *b);

/** How a loss reduces its per-element values: PyTorch's reduction= (and
 *  the values of its Reduction enum).  NONE: the per-element losses (the
 *  inputs' broadcast shape; nt_nll_loss: the labels' shape); MEAN: their
 *  sum over (float)numel (NaN over no elements); SUM: their sum; BATCHMEAN
 *  (nt_kl_div only): the sum over input's size 0.  Every sum is the
 *  canonical one over all elements in row-major order (docs/exactness.md). */
typedef enum nt_reduction {
    NT_REDUCTION_NONE = 0,
    NT_REDUCTION_MEAN = 1,
    NT_REDUCTION_SUM = 2,
    NT_REDUCTION_BATCHMEAN = 3
} nt_reduction;
/* The losses below are composites of ntensor ops (their exact arithmetic:
 * docs/ops.md): f32 math (bf16/f16 inputs widened first), the result
 * rounded once to the inputs' promoted dtype (f32 inside an autocast
 * region); differentiable in every floating input.  Errors: a NULL or
 * released tensor (NT_EINVAL), an integer input where a floating one is
 * expected (NT_EDTYPE), shapes as stated (NT_ESHAPE), a reduction not
 * listed (NT_EINVAL), each naming the function and the argument. */
/** torch.nn.functional.binary_cross_entropy: probabilities p, targets y of
 *  p's shape, optional weight broadcasting to p's shape (NULL: none);
 *  l = -w (y max(log p, -100) + (1 - y) max(log(1 - p), -100)).  p outside
 *  [0, 1] gives NaN (PyTorch raises; checking would need a host sync).  At
 *  p exactly 0 or 1 the clamped log's gradient is 0 (the derivative of the
 *  clamped formula; PyTorch's backward divides by max(p (1 - p), 1e-12)). */
NT_API nt_tensor *nt_binary_cross_entropy(nt_tensor *p, nt_tensor *y, nt_tensor *weight,
                                          nt_reduction reduction);
/** torch.nn.functional.binary_cross_entropy_with_logits in PyTorch's stable
 *  form (m = max(-x, 0)): l = (1 - y) x + m + log(exp(-m) + exp(-x - m)),
 *  with pos_weight: (1 - y) x + ((pw - 1) y + 1) (log(exp(-m) + exp(-x - m))
 *  + m); times weight.  y has x's shape; weight and pos_weight (each may be
 *  NULL) broadcast to it. */
NT_API nt_tensor *nt_binary_cross_entropy_with_logits(nt_tensor *x, nt_tensor *y,
                                                      nt_tensor *weight, nt_tensor *pos_weight,
                                                      nt_reduction reduction);
/** torch.nn.functional.nll_loss: logp [N, C, d1, ...] (or [C]) floating,
 *  labels [N, d1, ...] (or 0-d) i32, i64 or u8 in [0, C) (checked when it runs,
 *  NT_ERANGE), weight [C] or NULL; l_i = -w[y_i] logp[i, y_i], 0 where
 *  y_i == ignore_index (-100 is PyTorch's default).  MEAN is sum(l) /
 *  sum(w[y_i]) over the labels not ignored (NaN when all are). */
NT_API nt_tensor *nt_nll_loss(nt_tensor *logp, nt_tensor *labels, nt_tensor *weight,
                              int64_t ignore_index, nt_reduction reduction);
/** torch.nn.functional.cross_entropy with every argument: logits [N, C,
 *  d1, ...] (or [C] with a 0-d label), labels and weight as nt_nll_loss,
 *  label_smoothing eps in [0, 1] (else NT_EINVAL); l_i = (1 - eps) nll_i +
 *  eps / C sum_c(-w[c] log_softmax(logits)[i, c]), 0 where ignored, each
 *  part reduced as PyTorch (MEAN: over the weights of the labels kept).
 *  With weight NULL and MEAN: nt_cross_entropy_ex's bits. */
NT_API nt_tensor *nt_cross_entropy_loss(nt_tensor *logits, nt_tensor *labels, nt_tensor *weight,
                                        int64_t ignore_index, double label_smoothing,
                                        nt_reduction reduction);
/** torch.nn.functional.l1_loss: |a - b| (a and b broadcast). */
NT_API nt_tensor *nt_l1_loss(nt_tensor *a, nt_tensor *b, nt_reduction reduction);
/** torch.nn.functional.smooth_l1_loss: z = |a - b|, z < beta ? 0.5 z z /
 *  beta : z - 0.5 beta; beta == 0 is nt_l1_loss; beta < 0 or NaN:
 *  NT_EINVAL. */
NT_API nt_tensor *nt_smooth_l1_loss(nt_tensor *a, nt_tensor *b, nt_reduction reduction,
                                    double beta);
/** torch.nn.functional.huber_loss: z = |a - b|, z < delta ? 0.5 z z :
 *  delta (z - 0.5 delta); delta <= 0 or NaN: NT_EINVAL. */
NT_API nt_tensor *nt_huber_loss(nt_tensor *a, nt_tensor *b, nt_reduction reduction,
                                double delta);
/** torch.nn.functional.kl_div (input: log-probabilities):
 *  log_target ? exp(t) (t - x) : xlogy(t, t) - t x, with xlogy(0, t) = 0;
 *  reduction may be NT_REDUCTION_BATCHMEAN (the sum over input's size 0,
 *  the sum for a 0-d input), PyTorch's mathematically correct mean. */
NT_API nt_tensor *nt_kl_div(nt_tensor *input, nt_tensor *target, nt_reduction reduction,
                            bool log_target);
/** torch.nn.functional.max_pool2d of x [N, C, H, W] or [C, H, W] (f32, bf16,
 *  f16): out[n, c, oh, ow] = the maximum of the window of kernel[0] x
 *  kernel[1] elements starting at (oh * stride[0] - padding[0], ow *
 *  stride[1] - padding[1]), dilation apart; padding is -inf (never chosen).
 *  stride NULL is kernel (PyTorch's default), padding NULL is 0, dilation
 *  NULL is 1; ceil_mode as PyTorch (a last window must start inside the
 *  input or the left padding).  The maximum is the first in the window's
 *  row-major order, or the window's last NaN (PyTorch 1.13's CPU kernel's
 *  rule).  *indices (if indices is non-NULL)
 *  gets the i32 flat position ih * W + iw of each maximum in its plane
 *  (PyTorch's are int64).  The gradient goes to that element (the
 *  windows' contributions added by autograd).  Errors name the argument: NULL or
 *  non-float x (NT_EDTYPE); x not 3- or 4-D or a C, H or W of 0
 *  (NT_ESHAPE); NULL kernel, kernel/stride/dilation < 1, padding < 0 or
 *  above kernel / 2 (NT_EINVAL); an output size < 1 or a window wholly in
 *  the padding (NT_ESHAPE).  docs/ops.md gives the composite. */
NT_API nt_tensor *nt_max_pool2d(nt_tensor *x, const int64_t *kernel, const int64_t *stride,
                                const int64_t *padding, const int64_t *dilation, bool ceil_mode,
                                nt_tensor **indices);
/** torch.nn.functional.avg_pool2d (no divisor_override): the window sum
 *  (padding counts as 0) divided by the window's size, which counts the
 *  padding inside input + padding when count_include_pad, else only the
 *  input elements.  Arguments and errors as nt_max_pool2d's (no dilation).
 *  Computed in f32, rounded once to x's dtype. */
NT_API nt_tensor *nt_avg_pool2d(nt_tensor *x, const int64_t *kernel, const int64_t *stride,
                                const int64_t *padding, bool ceil_mode, bool count_include_pad);
/** torch.nn.functional.adaptive_avg_pool2d to out_h x out_w: output (i, j)
 *  averages rows [floor(i H / out_h), ceil((i + 1) H / out_h)) and the
 *  columns likewise, as sum / kh / kw in f32, rounded once to x's dtype.
 *  out_h, out_w >= 1 (NT_EINVAL); x as nt_max_pool2d's. */
NT_API nt_tensor *nt_adaptive_avg_pool2d(nt_tensor *x, int64_t out_h, int64_t out_w);
/** torch.nn.functional.batch_norm of x [N, C, *] (also [N, C]; f32, bf16,
 *  f16): per channel c, y = (x - mean_c) / sqrt(var_c + eps) * w_c + b_c.
 *  running_mean, running_var: [C] f32 or both NULL; w, b: [C] floating or
 *  NULL.  training: mean and biased variance of the batch (over N and the
 *  spatial dims), and the running statistics, if given, updated in place:
 *  r = r * (1 - momentum) + stat * momentum, with the batch's unbiased
 *  variance for running_var (as PyTorch).  Otherwise the running statistics
 *  normalise (they must be given).  Statistics in f32; the result rounded
 *  once to x's dtype (f32 under autocast).  The gradient reaches x, w and
 *  b.  docs/ops.md ("Normalisation over channels") gives the arithmetic;
 *  nt_ddp_batch_norm is the data-parallel form.  Errors name the argument:
 *  NULL x (NT_EINVAL), non-float x (NT_EDTYPE), x under 2 dims, training
 *  with one value per channel ("Expected more than 1 value per channel
 *  when training"), a per-channel tensor not [C] (NT_ESHAPE); running
 *  statistics not f32 (NT_EDTYPE), one of them NULL, or NULL in evaluation;
 *  eps <= 0 or not finite, momentum outside [0, 1] or NaN (NT_EINVAL).  A
 *  rejected call changes nothing. */
NT_API nt_tensor *nt_batch_norm(nt_tensor *x, nt_tensor *running_mean, nt_tensor *running_var,
                                nt_tensor *w, nt_tensor *b, bool training, double momentum,
                                double eps);
/** torch.nn.functional.group_norm of x [N, C, *] (f32, bf16, f16): the C
 *  channels cut into num_groups groups of C / num_groups; each (sample,
 *  group) normalised by its mean and biased variance (as nt_layer_norm over
 *  the group's elements), then y * w_c + b_c per channel (w, b [C] or NULL).
 *  Statistics in f32; the result rounded once to x's dtype (f32 under
 *  autocast).  Errors as nt_batch_norm's, and num_groups <= 0 or not
 *  dividing C (NT_EINVAL). */
NT_API nt_tensor *nt_group_norm(nt_tensor *x, int64_t num_groups, nt_tensor *w, nt_tensor *b,
                                double eps);
/** torch.nn.functional.conv2d: x [N, Cin, H, W] (or [Cin, H, W]), w [Cout,
 *  Cin/groups, kh, kw], b [Cout] or NULL; one dtype (f32, bf16, f16; under
 *  autocast: bf16 operands, f32 accumulation, like nt_matmul).
 *  stride/padding/dilation: arrays of 2 (H, W), NULL = PyTorch's default (1,
 *  0, 1).  Output [N, Cout, OH, OW] (or [Cout, OH, OW]), OH = (H + 2p -
 *  d (kh - 1) - 1) / s + 1.  Arithmetic: per group one nt_matmul of w [Cout/g,
 *  K] and the columns [K, (n, oh, ow)], K = (ci, ki, kj) row-major, padding
 *  taps zero products; the bias added after (docs/ops.md, "Convolution").
 *  Differentiable in x, w and b.  Errors (nothing queued): NULL or released
 *  tensors (NT_EINVAL); a non-floating input or mixed dtypes (NT_EDTYPE);
 *  wrong dims, channels not divisible by groups, w's Cin/groups not x's, a
 *  bias not [Cout], a kernel larger than the padded input (NT_ESHAPE);
 *  stride or dilation < 1, padding < 0, groups < 1 (NT_EINVAL). */
NT_API nt_tensor *nt_conv2d(nt_tensor *x, nt_tensor *w, nt_tensor *b, const int64_t *stride,
                            const int64_t *padding, const int64_t *dilation, int64_t groups);
/** torch.nn.functional.conv1d: x [N, Cin, L] (or [Cin, L]), w [Cout,
 *  Cin/groups, k], b [Cout] or NULL: nt_conv2d of the views x [N, Cin, 1, L]
 *  and w [Cout, Cin/groups, 1, k] with stride (1, stride) etc. -- the same
 *  bits.  Output [N, Cout, OL].  Errors as nt_conv2d's. */
NT_API nt_tensor *nt_conv1d(nt_tensor *x, nt_tensor *w, nt_tensor *b, int64_t stride,
                            int64_t padding, int64_t dilation, int64_t groups);
/** torch.nn.functional.conv_transpose2d (PyTorch's argument order): x [N,
 *  Cin, H, W] (or [Cin, H, W]), w [Cin, Cout/groups, kh, kw], b [Cout] or
 *  NULL; stride/padding/output_padding/dilation arrays of 2 or NULL (1, 0,
 *  0, 1).  Output OH = (H - 1) s - 2p + d (kh - 1) + output_padding + 1.
 *  Arithmetic: nt_conv2d's, of x dilated by the stride (zeros between),
 *  padded by d (k - 1) - p, with w rotated 180 degrees and its channel
 *  dims swapped per group, stride 1 -- the formulation of nt_conv2d's input
 *  gradient (docs/ops.md, "Convolution").  Differentiable.  Errors as
 *  nt_conv2d's, and output_padding not smaller than stride or dilation
 *  (NT_EINVAL), an output size below 1 (NT_ESHAPE). */
NT_API nt_tensor *nt_conv_transpose2d(nt_tensor *x, nt_tensor *w, nt_tensor *b,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *output_padding, int64_t groups,
                                      const int64_t *dilation);
/** Training mode, per thread like nt_no_grad_begin; a thread starts in it.
 *  Only nt_dropout reads it (the identity when off, as PyTorch's eval()). */
NT_API void nt_set_training(bool on);
NT_API bool nt_is_training(void);
/** Zeroes each element of floating x with probability p and scales the rest
 *  by 1/(1-p): y = x * m, m = 0 or (float)(1 / (1 - p)) (PyTorch's input *
 *  noise: a dropped NaN or Inf gives NaN).  The keep mask is a pure function
 *  of (seed, element index) (counter-based, core/sample.h): the same seed
 *  gives the same mask in every mode, fused or not, on every backend.  The
 *  backward recomputes it from the seed (g * m); nothing is saved.  When
 *  training mode is off or p == 0: a new reference to x's value (no op).
 *  p in [0, 1), else NT_EINVAL naming nt_dropout and p. */
NT_API nt_tensor *nt_dropout(nt_tensor *x, double p, uint64_t seed);

/** A counter-based source of seeds for random ops whose masks must change
 *  from step to step and stay reproducible.  Its state is a seed s and an
 *  offset o; draw i is h(s, o + i) (core/rng.h: splitmix64 of the mixed
 *  seed).  Ops take a draw by index and never move the offset; the program
 *  moves it, once per step, with nt_generator_advance -- so a recomputation
 *  (nt_checkpoint) draws the same masks, and a captured step (docs/graphs.md)
 *  draws at every replay exactly what the same step run op by op would, and
 *  advances the offset as it did.  Save and set the state to resume a run.
 *  Setting or advancing it from two threads at once is the caller's race.
 *  Destroy with nt_generator_destroy (a captured program that draws from it
 *  keeps its memory until destroyed). */
typedef struct nt_generator nt_generator;
NT_API nt_generator *nt_generator_create(uint64_t seed);
NT_API void nt_generator_destroy(nt_generator *g);
/** The state: seed and offset.  NT_EINVAL for NULLs or a dead generator. */
NT_API int nt_generator_get_state(const nt_generator *g, uint64_t *seed, uint64_t *offset);
NT_API int nt_generator_set_state(nt_generator *g, uint64_t seed, uint64_t offset);
/** offset += n (a step's worth of draws); inside a capture, every replay
 *  does the same. */
NT_API int nt_generator_advance(nt_generator *g, uint64_t n);
/** nt_dropout with the seed of draw `index` of g (at its offset now, plus
 *  what the step being captured, if any, has advanced g by before it). */
NT_API nt_tensor *nt_dropout_gen(nt_tensor *x, double p, nt_generator *g, uint64_t index);
/** The calling thread's default generator, at state (NT_SEED, 0) after each
 *  nt_init (NT_SEED unset: 0), made at the thread's first call and freed when
 *  the thread ends (nt_generator_destroy ignores it).  Every thread has its
 *  own, all starting at the same state: threads that must draw differently
 *  set their own state.  NULL with the error set if there is no memory. */
NT_API nt_generator *nt_default_generator(void);
/** Dropout that needs no seed: nt_dropout_gen(x, p, g, 0), then g advances by
 *  one (nt_generator_advance), so each call draws a fresh mask and a run from
 *  the same state draws the same masks (g NULL: the thread's default
 *  generator, so a program that never seeds is still reproducible under
 *  NT_SEED).  Captured, each replay draws and advances exactly as the step op
 *  by op.  No draw is taken when training mode is off or p == 0.  A
 *  generator is used by one thread at a time: a call while another thread's
 *  call is moving it fails with NT_ESTATE. */
NT_API nt_tensor *nt_dropout_next(nt_tensor *x, double p, nt_generator *g);

/** Random tensors from a generator (torch's `generator=` argument; g NULL:
 *  the thread's default generator).  Each takes g's next draw as its seed
 *  and advances g by one, so each call differs and a run from the same state
 *  repeats (docs/ops.md gives each one's exact steps).  The floating ones
 *  (f32, bf16, f16) are nt_rand / nt_randn in f32, times (float)scale, plus
 *  (float)shift, rounded once to dt (f64: nt_rand / nt_randn of f64, the
 *  scale and shift in double); they can be part of a captured step
 *  (each replay draws anew).  Errors (NT_EINVAL, NT_EDTYPE, NT_ESHAPE) name
 *  the function and the argument. */
/** U[a, b): scale b - a, shift a.  a <= b, both and b - a finite in f32. */
NT_API nt_tensor *nt_uniform(nt_dtype dt, int ndim, const int64_t *shape, double a, double b,
                             nt_generator *g);
/** N(mean, std^2): randn * std + mean.  std >= 0, both finite in f32. */
NT_API nt_tensor *nt_normal(nt_dtype dt, int ndim, const int64_t *shape, double mean,
                            double std, nt_generator *g);
/** i32 integers uniform in [low, high): element i is low + the high 64 bits
 *  of h(seed, i) * (high - low) (exact; bias below (high - low) / 2^64).
 *  low < high within i32.  Drawn on the host and copied: refused inside a
 *  capture (make it before, pass it as a graph input). */
NT_API nt_tensor *nt_randint(int64_t low, int64_t high, int ndim, const int64_t *shape,
                             nt_generator *g);
/** A random permutation of 0 .. n-1 (i32 [n]): Fisher-Yates, step i = n-1
 *  .. 1 swapping element i with the high 64 bits of h(seed, i) * (i + 1).
 *  0 <= n <= 2^31.  On the host, like nt_randint. */
NT_API nt_tensor *nt_randperm(int64_t n, nt_generator *g);

/** torch.nn.init's fans and gains.  A weight is [out, in, k...]: fan in =
 *  in * prod(k), fan out = out * prod(k); fewer than 2 dims or an empty dim
 *  is NT_ESHAPE. */
typedef enum { NT_FAN_IN, NT_FAN_OUT } nt_fan_mode;
typedef enum {
    NT_GAIN_LINEAR,     /* 1 (and the convolutions) */
    NT_GAIN_SIGMOID,    /* 1 */
    NT_GAIN_TANH,       /* 5/3 */
    NT_GAIN_RELU,       /* sqrt(2) */
    NT_GAIN_LEAKY_RELU, /* sqrt(2 / (1 + slope^2)) */
    NT_GAIN_SELU,       /* 3/4 */
} nt_nonlinearity;
/** torch.nn.init.calculate_gain (param: leaky_relu's negative slope);
 *  NaN with NT_EINVAL for an unknown nl. */
NT_API double nt_calculate_gain(nt_nonlinearity nl, double param);
/** Xavier/Glorot: uniform on [-a, a), a = gain * sqrt(6 / (fan_in +
 *  fan_out)) (scale 2a, shift -a); normal with std = gain * sqrt(2 /
 *  (fan_in + fan_out)).  gain finite and >= 0. */
NT_API nt_tensor *nt_xavier_uniform(nt_dtype dt, int ndim, const int64_t *shape, double gain,
                                    nt_generator *g);
NT_API nt_tensor *nt_xavier_normal(nt_dtype dt, int ndim, const int64_t *shape, double gain,
                                   nt_generator *g);
/** Kaiming/He: std = calculate_gain(nl, a) / sqrt(fan) (fan per mode);
 *  uniform on [-sqrt(3) std, sqrt(3) std) or normal(0, std).  PyTorch's
 *  defaults: a 0, NT_FAN_IN, NT_GAIN_LEAKY_RELU. */
NT_API nt_tensor *nt_kaiming_uniform(nt_dtype dt, int ndim, const int64_t *shape, double a,
                                     nt_fan_mode mode, nt_nonlinearity nl, nt_generator *g);
NT_API nt_tensor *nt_kaiming_normal(nt_dtype dt, int ndim, const int64_t *shape, double a,
                                    nt_fan_mode mode, nt_nonlinearity nl, nt_generator *g);
/** n samples, with replacement, from each row of probs [C] or [N, C]
 *  (floating, non-negative, not necessarily normalised): i32 [n] or [N, n].
 *  Draw j of row r is a pure function of (seed, r * n + j) (counter-based,
 *  like nt_rand): the first category whose running sum (double, in index
 *  order) exceeds u * total, u uniform in [0, 1) (docs/ops.md); the same
 *  result on every backend and mode; a zero-probability category is never
 *  drawn.  A negative, NaN or Inf probability or a row that sums to 0 is an
 *  error when it runs (NT_EINVAL naming nt_multinomial and probs); n >= 1. */
NT_API nt_tensor *nt_multinomial(nt_tensor *probs, int64_t n, uint64_t seed);
/** softmax(q k^T * scale + mask) v, flash-attention style (docs/ops.md §7a):
 *  q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] -> [..., Tq, Dv] in q's
 *  dtype (q, k, v floating, one dtype, the same leading dims; 1 <= D, Dv <=
 *  128).  mask: NULL, or u8 (true = may attend, like PyTorch's bool
 *  attn_mask) or floating (added to the scores), broadcastable to [..., Tq,
 *  Tk]; it gets no gradient.  causal: query i attends keys j <= i
 *  (top-left aligned, PyTorch's is_causal).  scale: 0 means 1/sqrt(D).
 *  The scores are computed in key blocks of 128 with an online softmax in
 *  f32 and never stored; the backward recomputes them.  A row that may
 *  attend no key gives 0 (PyTorch: NaN).  Under autocast the inputs run in
 *  the low dtype (the arithmetic stays f32). */
NT_API nt_tensor *nt_scaled_dot_product_attention(nt_tensor *q, nt_tensor *k, nt_tensor *v,
                                                  nt_tensor *mask, bool causal, double scale);
/** Rotary position embedding (RoPE) of x [..., T, D] (f32, bf16 or f16; T
 *  = dim -2 are the positions offset, offset + 1, ...): the first `dims`
 *  features (even, 2 <= dims <= D) are rotated in pairs, the rest passed
 *  through.  Pair i (0 <= i < dims/2) at position pos turns by theta =
 *  (pos * scale) * base^(-2i/dims): (x1, x2) -> (x1 cos - x2 sin,
 *  x2 cos + x1 sin), computed in f32 and rounded once to x's dtype
 *  (docs/ops.md "Rotary position embedding" defines every rounding).
 *  interleaved = false: GPT-NeoX's layout, pairs (i, i + dims/2);
 *  true: GPT-J's (the original paper's), pairs (2i, 2i + 1).  Usual
 *  values: base 10000, scale 1.  One fused kernel on both backends; the
 *  gradient is the rotation by -theta.  Errors (at the call, naming the
 *  argument): x not floating (NT_EDTYPE) or with fewer than 2 dims
 *  (NT_ESHAPE); dims odd, <= 0 or > D, base not finite and > 0, scale not
 *  finite, offset < 0 or offset + T > 2^24 (NT_EINVAL); a nonzero offset
 *  while capturing a program (NT_ESTATE: it would be baked into every
 *  replay; use nt_rope_offset). */
NT_API nt_tensor *nt_rope(nt_tensor *x, int64_t dims, bool interleaved, double base, double scale,
                          int64_t offset);
/** nt_rope with the positions' offset read from `offset`, a one-element i32
 *  tensor, when the op runs: a captured program that names it with
 *  nt_graph_input uses the value bound at each replay (KV-cache decoding).
 *  A wrong dtype or element count is an error at the call; a value < 0 or
 *  past 2^24 - T an error of the op when it runs (NT_EINVAL). */
NT_API nt_tensor *nt_rope_offset(nt_tensor *x, int64_t dims, bool interleaved, double base,
                                 double scale, nt_tensor *offset);
/** Rows of weight [V, D] picked by the indices idx [...] (i32, i64 or u8): [..., D].
 *  Indices outside [0, V) are an error when the op runs. */
NT_API nt_tensor *nt_embedding(nt_tensor *weight, nt_tensor *idx);
/** The k largest (largest = true) or smallest elements of x along dim, in
 *  order (ties: the lower index first; NaN counts as above every number, as
 *  in PyTorch's sort).  *values has x's dtype and shape with dim of size k;
 *  *indices is i32, the same shape.  values is differentiable (gathered
 *  with the indices: its gradient goes back through nt_gather's).  0 <= k
 *  <= the size of dim; a 0-d x (as PyTorch) takes dim 0 or -1 and k 0 or 1,
 *  either giving 0-d outputs: its element and index 0.  Returns 0, or an
 *  error code with both outputs set to NULL. */
NT_API int nt_topk(nt_tensor *x, int64_t k, int dim, bool largest, nt_tensor **values,
                   nt_tensor **indices);
/** torch.gather: out[i][j][k] = t[index[i][j][k]][j][k] (dim 0; likewise for
 *  other dims).  t has at least 1 dim; index (i32, i64 or u8; PyTorch's is
 *  int64) has t's ndim and index.shape[d] <=
 *  t.shape[d] for d != dim; out has index's shape and t's dtype (any dtype;
 *  values copied bit for bit).  Indices must lie in [0, t.shape[dim]):
 *  negative ones are not wrapped; a bad one is NT_ERANGE when the op runs,
 *  naming its position.  The gradient adds g into t's shape in g's
 *  row-major order (deterministic; repeated indices accumulate). */
NT_API nt_tensor *nt_gather(nt_tensor *t, int dim, nt_tensor *index);
/** torch.index_select: the entries index[0], index[1], ... of t along
 *  `dim` (t at least 1-D); index is 1-D (or 0-d) i32, i64 or u8.  Same index rules and gradient
 *  as nt_gather. */
NT_API nt_tensor *nt_index_select(nt_tensor *t, int dim, nt_tensor *index);
/** torch.scatter (out of place): a copy of t with out[index[i][j]][j] =
 *  src[i][j] (dim 0; likewise for other dims), for every position of index
 *  in row-major order, so with repeated indices the last write wins.  t has
 *  at least 1 dim; index (i32, i64 or u8) and src have t's ndim, index.shape[d]
 *  <= src.shape[d] for every d and <= t.shape[d] for d != dim; src has t's
 *  dtype (any dtype; values copied bit for bit).  Indices must lie in [0,
 *  t.shape[dim]): a bad one is NT_ERANGE when the op runs, naming its
 *  position.  Gradients (floating t): t's is g with the written places
 *  zeroed; src's is g gathered at index (zero where index does not reach). */
NT_API nt_tensor *nt_scatter(nt_tensor *t, int dim, nt_tensor *index, nt_tensor *src);
/** torch.scatter_add (out of place): out = t, then out[index[i][j]][j] +=
 *  src[i][j] for every position of index in row-major order (a defined
 *  order: repeated indices give the same bits on every backend), in f32 from
 *  t's value, rounded once to t's dtype (f32: PyTorch's bits); integers add
 *  wrapping (i32 two's complement, u8 modulo 256).  Any dtype; shapes and
 *  index rules as nt_scatter.  Gradients: t's is g; src's is g gathered at
 *  index. */
NT_API nt_tensor *nt_scatter_add(nt_tensor *t, int dim, nt_tensor *index, nt_tensor *src);
/** torch.index_add (out of place): out = t, then the slice index[i] of out
 *  along dim += alpha * the slice i of src, for i = 0, 1, ... (src's
 *  elements in row-major order), accumulated as nt_scatter_add's.  index is
 *  1-D (or 0-d) i32, i64 or u8; src has t's shape except dim, of numel(index);
 *  alpha finite (an integer of magnitude <= 2^24 for an integer t).  Any
 *  dtype.  Gradients: t's is g; src's is alpha * index_select(g, dim,
 *  index). */
NT_API nt_tensor *nt_index_add(nt_tensor *t, int dim, nt_tensor *index, nt_tensor *src,
                               double alpha);
/** torch.index_put with one index (t[index] = values, or += with
 *  accumulate), out of place.  Two forms: index i32, 1-D (or 0-d), the rows
 *  of dim 0 (negative entries count from the end, as in PyTorch; otherwise
 *  outside [0, t.shape[0]) is NT_ERANGE when the op runs): values (t's
 *  dtype) broadcast to [numel(index), t.shape[1:]], written as nt_scatter
 *  (repeated rows: the last wins) or added as nt_index_add; index u8, a mask of t's leading dims (PyTorch's bool mask):
 *  values has one element, put (or added) where the mask is nonzero (values
 *  per selected element would need the mask's count, a host sync: not
 *  supported).  Gradients as scatter / index_add (the mask form: where's). */
NT_API nt_tensor *nt_index_put(nt_tensor *t, nt_tensor *index, nt_tensor *values,
                               bool accumulate);
/** torch.nn.functional.one_hot: labels (i32, i64 or u8, any shape) -> i32 (PyTorch:
 *  int64) of shape [..., num_classes], 1 at each label, 0 elsewhere.
 *  num_classes -1 means the largest label + 1: that reads the labels back
 *  (nt_max, then a sync, like PyTorch's .item()); empty labels are then
 *  NT_EINVAL.  A label outside [0, num_classes) is NT_ERANGE when the op
 *  runs ("index[k] = v is out of range"). */
NT_API nt_tensor *nt_one_hot(nt_tensor *labels, int64_t num_classes);

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
/** torch.flip: a new tensor with t's elements in reverse order along each
 *  of the ndims dims in dims (negative dims count from the end; order does
 *  not matter; ndims 0 is a copy).  Any dtype; values are moved, never
 *  rounded.  One index_select (a gather) per flipped dim of size > 1, with a
 *  descending arange as the index, on either backend; the gradient is g
 *  flipped back.  Errors: NT_EINVAL for NULL dims with ndims > 0, ndims < 0
 *  or a dim named twice; NT_EDIM for a dim out of range. */
NT_API nt_tensor *nt_flip(nt_tensor *t, int ndims, const int *dims);
/** torch.split with an int: views of t along `dim` of split_size elements
 *  each, the last one smaller if the size does not divide (an empty dim
 *  gives one empty view).  Writes up to max_out new references to out and
 *  returns how many it made; out may be NULL with max_out 0 to ask for the
 *  count only.  split_size <= 0 or too few slots: NT_EINVAL (negative return,
 *  nothing made).  Gradients flow through nt_slice. */
NT_API int nt_split(nt_tensor *t, int64_t split_size, int dim, nt_tensor **out, int max_out);
/** torch.squeeze: t without dim `dim` if its size is 1 (else t unchanged),
 *  or with dim NT_DIM_ALL without every size-1 dim.  Always a view (of an
 *  expanded t too); a 0-d t takes dim 0 or -1. */
NT_API nt_tensor *nt_squeeze(nt_tensor *t, int dim);
/** torch.unsqueeze: a size-1 dim inserted at dim (-ndim-1 <= dim <= ndim).
 *  A view, as nt_squeeze. */
NT_API nt_tensor *nt_unsqueeze(nt_tensor *t, int dim);
/** torch.flatten: dims start_dim..end_dim (inclusive, negative counting
 *  from the end) merged into one; a 0-d t gives [1].  A view when the
 *  strides allow, else a copy (nt_reshape). */
NT_API nt_tensor *nt_flatten(nt_tensor *t, int start_dim, int end_dim);
/** torch.unflatten: dim split into the n sizes (one may be -1, inferred);
 *  their product must be dim's size.  A view, as nt_flatten. */
NT_API nt_tensor *nt_unflatten(nt_tensor *t, int dim, int n, const int64_t *sizes);
/** torch.narrow: elements start .. start + length - 1 of dim (start may be
 *  negative, counting from the end; -size <= start <= size, 0 <= length <=
 *  size - start).  A view (nt_slice). */
NT_API nt_tensor *nt_narrow(nt_tensor *t, int dim, int64_t start, int64_t length);
/** torch.chunk: views of ceil(size / chunks) elements along dim, the last
 *  smaller, so there may be fewer than `chunks` (8 in 3 chunks: 3, 3, 2; 5 in
 *  4: 2, 2, 1); an empty dim gives `chunks` empty views.  The calling
 *  convention of nt_split: returns how many it made (out may be NULL with
 *  max_out 0 to ask the count), or an error code (chunks <= 0, too few
 *  slots: NT_EINVAL, nothing made). */
NT_API int nt_chunk(nt_tensor *t, int64_t chunks, int dim, nt_tensor **out, int max_out);
/** torch.stack: n tensors of equal shape and dtype joined along a new dim
 *  (-ndim-1 <= dim <= ndim): nt_unsqueeze then nt_cat (a new tensor). */
NT_API nt_tensor *nt_stack(nt_tensor *const *ts, int n, int dim);
/** torch.diagonal: the elements (i, i + offset) of dims dim1 and dim2
 *  (distinct; t at least 2-D) as a new last dim, the other dims in order.
 *  A strided view: writes through it reach t.  Its gradient is g on the
 *  diagonal of zeros. */
NT_API nt_tensor *nt_diagonal(nt_tensor *t, int64_t offset, int dim1, int dim2);
/** A contiguous tensor with t's values: a new handle on t's storage if t is
 *  already contiguous, else a copy. */
NT_API nt_tensor *nt_contiguous(nt_tensor *t);

/* Padding, rolling, sorting, resizing (issue 33; docs/ops.md "Padding,
 * rolling, sorting, resizing").  Composites of slice, flip, expand, cat,
 * arange, full, index_select, topk, mul and add: the same bits on every
 * backend and mode (captured too), and the gradients of those ops. */
typedef enum nt_pad_mode {
    NT_PAD_CONSTANT = 0, /* torch.nn.functional.pad mode='constant' */
    NT_PAD_REFLECT,      /* mode='reflect' */
    NT_PAD_REPLICATE,    /* mode='replicate' */
    NT_PAD_CIRCULAR      /* mode='circular' */
} nt_pad_mode;
/** torch.nn.functional.pad: pads (npad even, at most 2 per dim) name the
 *  last dim first: pads[0] before and pads[1] after the last dim, pads[2],
 *  pads[3] the one before, ...  Constant: value (rounded to x's dtype)
 *  added around x; a negative pad crops (within the dim, the size stays
 *  >= 0); any dtype.  Reflect (pad < size, the edge not repeated) and
 *  replicate (the edge repeated): x with npad/2 + 1 or + 2 dims, npad 2, 4
 *  or 6 (as PyTorch), value 0.  Circular (the crop of the negative pads,
 *  then wrapped around: pad <= the cropped size): x with npad/2 + 2 dims.
 *  A new tensor; the gradient is g sliced
 *  (constant), with the reflected or replicated parts' gradients added
 *  (flips, expands summed by nt_sum; a fixed order).  Errors: NT_EINVAL (pads
 *  NULL, npad odd or too large, a pad that does not fit, mode, value),
 *  NT_ESHAPE (x's dims for reflect/replicate). */
NT_API nt_tensor *nt_pad(nt_tensor *x, int npad, const int64_t *pads, nt_pad_mode mode,
                         double value);
/** torch.roll: x's elements moved by shifts[i] (any sign, any size) along
 *  dims[i], cyclically, one dim after another (a dim may repeat); dims NULL
 *  with nshifts 1: x flattened, rolled, viewed back.  Any dtype, values
 *  moved bit for bit; the gradient is g rolled back.  Errors: NT_EINVAL
 *  (nshifts < 1, shifts NULL, dims NULL with nshifts != 1), NT_EDIM. */
NT_API nt_tensor *nt_roll(nt_tensor *x, int nshifts, const int64_t *shifts, const int *dims);
/** torch.sort: *values (x's dtype, x's shape) sorted along dim, ascending
 *  or descending, *indices (i32; PyTorch's are int64) their positions.
 *  Always stable (stable is accepted for PyTorch's signature): equal values
 *  (+0 and -0 too) keep their index order; NaN sorts above every number
 *  (last ascending, first descending), as PyTorch.  nt_topk with k the
 *  size of dim: values are nt_gather(x, dim, indices), with its gradient.
 *  A 0-d x takes dim 0 or -1.  Returns 0 or an error code (NT_EINVAL for
 *  NULL outputs, NT_EDIM), both outputs NULL on error. */
NT_API int nt_sort(nt_tensor *x, int dim, bool descending, bool stable, nt_tensor **values,
                   nt_tensor **indices);
/** torch.argsort: the indices of nt_sort (i32); no gradient. */
NT_API nt_tensor *nt_argsort(nt_tensor *x, int dim, bool descending, bool stable);
typedef enum nt_interp_mode {
    NT_INTERP_NEAREST = 0, /* torch.nn.functional.interpolate mode='nearest' */
    NT_INTERP_BILINEAR     /* mode='bilinear' */
} nt_interp_mode;
/** torch.nn.functional.interpolate with size=(out_h, out_w) of x [N, C, H,
 *  W]: nearest (any dtype; align_corners must be false) picks
 *  min(floor(o * (in / out)), in - 1) in f32 as PyTorch; bilinear (f32)
 *  takes PyTorch's source indices and f32 weights (the scale in f32, the
 *  position in double: align_corners false (o + 0.5) * s - 0.5 clamped at
 *  0, true o * s; docs/ops.md) and
 *  y = (x[h0,w0] w0 + x[h0,w1] w1) * h0w + (x[h1,w0] w0 + x[h1,w1] w1) * h1w
 *  (along W first, then H), as PyTorch's CPU kernel but with every product
 *  rounded (PyTorch's uses FMA: a few ulp apart).  The gradient is the
 *  ops' (index_select's adds in g's row-major order).  Errors: NT_EINVAL
 *  (mode, sizes < 1, align_corners with nearest), NT_ESHAPE (x not 4-D,
 *  H or W 0), NT_EDTYPE (bilinear not f32). */
NT_API nt_tensor *nt_interpolate(nt_tensor *x, int64_t out_h, int64_t out_w, nt_interp_mode mode,
                                 bool align_corners);

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
/** torch.Tensor.backward(gradient, retain_graph, create_graph): nt_backward
 *  from `loss` of any shape with its gradient `gradient` (NULL: ones, for a
 *  one-element loss; else loss's shape, floating, cast to loss's dtype).
 *  create_graph records the backward's own ops on the tape, so the .grad
 *  it leaves (a copy of the first gradient, then .grad + g) is itself a
 *  function of the leaves that nt_backward / nt_autograd_grad can
 *  differentiate again: second derivatives, Hessian-vector products,
 *  gradient penalties.  Pass retain_graph = true with it to differentiate
 *  through the first graph again (PyTorch's default then); grad mode is on
 *  inside such a pass, hooks included.  The ops whose backward can be
 *  differentiated (docs/architecture.md, "Double backward", has the full
 *  list): add, sub, mul, div, neg, exp, log, sqrt, rsqrt, abs, tanh,
 *  sigmoid, relu, gelu, silu, pow_scalar, the tensor-scalar ops, clamp,
 *  maximum/minimum, where, broadcasting, sum, mean, max/min, amax/amin,
 *  norm, cumsum, matmul/linear, the views (reshape, permute, transpose,
 *  slice, expand), cat, flip, softmax, log_softmax, layer_norm, rms_norm,
 *  cross_entropy, mse_loss, dropout, sin, cos, erf, softplus, mish,
 *  softsign, reciprocal, gelu_tanh, log1p, expm1, leaky_relu, hardtanh,
 *  gather, index_select, embedding, scatter, diagonal, cumprod, attention
 *  (its create_graph backward is a composite of recorded ops, whose first
 *  gradients round differently from the fused kernel's), pow/atan2/fmod of
 *  two tensors, user ops built from these.  nt_checkpoint's block is an
 *  error (NT_ENOTSUP naming nt_checkpoint and create_graph), as is any
 *  later op whose backward cannot be differentiated ("double backward of
 *  '<op>' is not supported (create_graph)").
 *  The recorded graph is freed with the tensors that hold it (.grad:
 *  nt_zero_grad).  create_graph false: exactly nt_backward_ex.  Errors as
 *  nt_backward's, plus NT_ESHAPE / NT_EDTYPE for a bad gradient. */
NT_API int nt_backward_full(nt_tensor *loss, nt_tensor *gradient, bool retain_graph,
                            bool create_graph);
/** torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph,
 *  create_graph, allow_unused): the gradients of sum_i <outputs[i],
 *  grad_outputs[i]> with respect to inputs[0..n_inputs), put in
 *  grads[0..n_inputs) (new references, owned by the open scope like an
 *  op's result), without touching any .grad.  grad_outputs may be NULL, or
 *  have NULL entries, for one-element outputs (ones); otherwise each has
 *  its output's shape.  Only the part of the graph that leads to the
 *  inputs runs (and, without retain_graph, is freed).  Inputs may be
 *  leaves or results of ops (their gradient after their hooks).  With
 *  create_graph the gradients carry a graph of their own (see
 *  nt_backward_full).  An input no gradient reaches: NULL in grads with
 *  allow_unused, else NT_ESTATE.  Errors: NULL or empty lists, a NULL or
 *  released tensor (NT_EINVAL / NT_ERELEASED, naming it), an output or
 *  input that does not require grad or a freed graph (NT_ESTATE), a bad
 *  grad_outputs[i] (NT_ESHAPE, NT_EDTYPE), an op without double backward
 *  (NT_ENOTSUP); on error every grads[j] is NULL. */
NT_API int nt_autograd_grad(nt_tensor *const *outputs, int n_outputs, nt_tensor *const *inputs,
                            int n_inputs, nt_tensor *const *grad_outputs, bool retain_graph,
                            bool create_graph, bool allow_unused, nt_tensor **grads);
/** The accumulated gradient of t (a new reference), or NULL without setting
 *  an error if there is none yet. */
NT_API nt_tensor *nt_grad(nt_tensor *t);
/** Drops t's accumulated gradient. */
NT_API int nt_zero_grad(nt_tensor *t);
/** torch.Tensor.retain_grad: a non-leaf t (a result of ops that record a
 *  graph) keeps its gradient after nt_backward, readable with nt_grad and
 *  dropped by nt_zero_grad like a leaf's (a second backward adds to it).
 *  It holds the gradient after t's hooks ran.  A leaf: nothing to do (it
 *  keeps its .grad anyway); twice: once.  Errors: t NULL or released
 *  (NT_EINVAL), not floating (NT_EDTYPE), not requiring grad (NT_ESTATE). */
NT_API int nt_retain_grad(nt_tensor *t);
/** A gradient hook: called by nt_backward with t's gradient g (all of it:
 *  every contribution summed); returns NULL (or g) to keep g, or a
 *  replacement: a live floating tensor of g's shape (cast to g's dtype),
 *  made with ops (the pass's scope owns it) or held by the caller. */
typedef nt_tensor *(*nt_grad_hook)(nt_tensor *g, void *ctx);
/** torch.Tensor.register_hook: fn(g, ctx) runs during every later
 *  nt_backward that reaches t, when the pass gets to t (after every use of t
 *  has sent its gradient; for a leaf, before the gradient goes into .grad,
 *  and a leaf with a hook is reached as soon as its last use has sent its
 *  gradient, not at the end of the pass with the other leaves);
 *  t's hooks run in the order they were registered, each on the previous
 *  one's result, then nt_retain_grad's copy is taken.  A hook runs inside
 *  the pass, with grad off (on in a create_graph pass, nt_backward_full), on
 *  the gradient's device: it may read g (e.g.
 *  nt_item, a host sync), run ops and return a new gradient; it must not
 *  call nt_backward or change t or g in place.  A bad replacement is an
 *  error of nt_backward (NT_ESHAPE).  In a captured step the hook runs
 *  once, at the capture; replays rerun the ops it queued, not the hook.
 *  Hooks stay while t's graph node
 *  lives (a leaf: while t lives), or until removed (nt_register_hook_handle,
 *  nt_remove_hook).  Errors: t NULL
 *  or released, fn NULL (NT_EINVAL), t not floating (NT_EDTYPE) or not
 *  requiring grad (NT_ESTATE). */
NT_API int nt_register_hook(nt_tensor *t, nt_grad_hook fn, void *ctx);
/** A removable hook (torch.utils.hooks.RemovableHandle): a number that
 *  nt_register_hook_handle gives out, never 0 and never given out twice
 *  in a process. */
typedef uint64_t nt_hook_handle;
/** nt_register_hook, and *handle (set on success; 0 on an error) removes
 *  the hook with nt_remove_hook.  The handle keeps 16 bytes of bookkeeping
 *  until it is removed, even after t's graph has gone.  Errors: those of
 *  nt_register_hook; handle NULL (NT_EINVAL). */
NT_API int nt_register_hook_handle(nt_tensor *t, nt_grad_hook fn, void *ctx,
                                   nt_hook_handle *handle);
/** RemovableHandle.remove(): the hook no longer runs (later backward
 *  passes skip it; the others keep their order).  After t's graph has gone
 *  (the hook would never run again) removing it succeeds and does nothing
 *  else.  Not while a backward pass that reaches t runs on another thread
 *  (as nt_register_hook).  Errors: handle 0 or never given out (NT_EINVAL,
 *  "unknown"); removed before (NT_ESTATE, "already removed"). */
NT_API int nt_remove_hook(nt_hook_handle handle);
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
 *  Thread-safe.  nt_shutdown drops every registration: an id of an ended
 *  runtime is NT_ESTATE in nt_op_call, never the new runtime's op. */
NT_API int nt_op_register(const nt_op_def *def);
/** Runs registered op `op` on its def->nin inputs and records it for
 *  autograd like a built-in. */
NT_API nt_tensor *nt_op_call(int op, nt_tensor *const *in);

/** Gradient checkpointing (torch.utils.checkpoint): runs
 *  fn(ctx, inputs, n_in, outputs, n_out) without keeping its intermediate
 *  activations on the tape, and in nt_backward re-runs it (with grad on,
 *  under the autocast state of the forward) to get them back.  Gradients
 *  are bit-identical to calling fn directly, in every mode.
 *  - fn builds outputs[0..n_out) from inputs[0..n_in) (and anything ctx
 *    points to) with ntensor ops; each outputs[j] must be a new reference
 *    (an op's result, or nt_retain of a tensor: an input handed back
 *    without one is NT_EINVAL).  It returns 0 or an error code.  fn must be
 *    deterministic: the same inputs give the same ops (dropout inside: a
 *    fixed seed) and it must not write its inputs in place.  A recompute
 *    with other output shapes is an error of nt_backward; other values of
 *    the same shapes are one only in deterministic mode (a checksum), and
 *    give wrong gradients silently otherwise (docs/gradient-checkpointing.md).
 *  - Tensors requiring grad that fn reads without being passed in inputs
 *    (parameters reached through ctx) are found while it runs and get
 *    their gradients too; ctx and what it points to must stay valid until
 *    the backward that recomputes (or until the graph is freed).
 *  - Saved for backward: the inputs (and references to those tensors).
 *  - Outside a graph (no-grad region, nothing requires grad) it is a plain
 *    call of fn.
 *  n_in in 0..NT_CHECKPOINT_MAX_IN (inputs may be NULL when 0), n_out in
 *  1..NT_CHECKPOINT_MAX_OUT.  Returns 0 with each outputs[j] a new
 *  reference (adopted by the open scope, like an op's result), or an
 *  error code with every outputs[j] set to NULL.  An error of fn while it
 *  is recomputed is an error of nt_backward naming nt_checkpoint and its
 *  call site.  docs/gradient-checkpointing.md has the details. */
#define NT_CHECKPOINT_MAX_IN 1024
#define NT_CHECKPOINT_MAX_OUT 2
typedef int (*nt_checkpoint_fn)(void *ctx, nt_tensor *const *inputs, int n_in,
                                nt_tensor **outputs, int n_out);
NT_API int nt_checkpoint(nt_checkpoint_fn fn, void *ctx, nt_tensor *const *inputs, int n_in,
                         nt_tensor **outputs, int n_out);

/** Checks autograd against central finite differences: loss = sum(f(x) * w)
 *  for a fixed pseudo-random w; every element of every input's analytic
 *  gradient must be within atol + rtol * |numeric| of (L(x + eps) - L(x -
 *  eps)) / 2 eps.  Inputs must be floating and require grad; their .grad is
 *  reset.  Returns 0, or NT_ERANGE with a message naming the input, the
 *  element and both values.  Runs f 2 * numel + 1 times: use small inputs.
 *  When an input is NT_F64 the whole check runs in double (w, the loss, the
 *  perturbed copies; f's result is cast to f64), so tight tolerances work:
 *  PyTorch's double defaults are NT_GRADCHECK_F64_EPS, _ATOL and _RTOL.
 *  Otherwise the loss is f32 and the perturbation is rounded to f32. */
#define NT_GRADCHECK_F64_EPS 1e-6
#define NT_GRADCHECK_F64_ATOL 1e-5
#define NT_GRADCHECK_F64_RTOL 1e-3
NT_API int nt_gradcheck(nt_tensor *(*f)(nt_tensor *const *in, void *ctx), nt_tensor *const *in,
                        int n, void *ctx, double eps, double atol, double rtol);
/** torch.autograd.gradgradcheck: checks second derivatives (double backward,
 *  nt_autograd_grad with create_graph) against central finite differences
 *  of the first derivative.  With y = f(in) and v = grad_output (NULL: a
 *  fixed pseudo-random tensor of y's shape), the checked function is the
 *  first-order gradient G_i(in, v) = d<y, v>/d in_i, reduced as nt_gradcheck
 *  reduces f: L = sum_i <G_i, u_i>, u_i fixed pseudo-random.  Every element
 *  of dL/d in_i and of dL/dv (computed by differentiating the recorded G)
 *  must be within atol + rtol * |numeric| of (L(t + eps) - L(t - eps)) /
 *  2 eps, each L a plain first-order backward.  An input f does not use, or
 *  a G linear in it, has second derivative 0 on both sides.  Inputs must be
 *  floating and require grad; their .grad is left alone.  Returns 0, or
 *  NT_ERANGE naming the input (or grad_output), the element and both
 *  values; NT_EINVAL for f NULL, n outside 1..16, eps not finite and > 0,
 *  an input NULL, released or not requiring grad; NT_ESHAPE for a
 *  grad_output not floating or not of y's shape; an op whose backward
 *  cannot be differentiated: its NT_ENOTSUP (docs/architecture.md, "Double
 *  backward").  Runs f about 2 * (numel(in) + numel(y)) + 1 times, each with
 *  a backward: use small inputs.  An f64 input makes the whole check f64
 *  (L, u_i, the host copies, the perturbations), as nt_gradcheck: then
 *  PyTorch's eps 1e-6, atol 1e-5, rtol 1e-3 apply.  In f32, eps around 1e-2
 *  and tolerances around 2e-2 suit O(1) values. */
NT_API int nt_gradgradcheck(nt_tensor *(*f)(nt_tensor *const *in, void *ctx),
                            nt_tensor *const *in, int n, void *ctx, nt_tensor *grad_output,
                            double eps, double atol, double rtol);

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */
/* ------------------------------------------------------------------------ */

/** The stream every thread starts on (device 0's default stream).  Owned
 *  by the runtime. */
NT_API nt_stream *nt_stream_default(void);
/** A new stream with its own worker thread, on the calling thread's current
 *  device.  Destroy with nt_stream_destroy. */
NT_API nt_stream *nt_stream_create(void);
/** Waits for the stream's work and frees it.  Threads whose current stream it
 *  was go back to its device's default stream.  A default stream cannot be
 *  destroyed (NT_EINVAL); nor can a destroyed one (NT_EINVAL), nor one of a
 *  runtime that nt_shutdown ended (NT_ESTATE). */
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
/** Frees e (one made before the last nt_shutdown too).  NULL is a no-op;
 *  an event destroyed already sets NT_EINVAL naming the argument. */
NT_API void nt_event_destroy(nt_event *e);

/* ------------------------------------------------------------------------ */
/* Devices                                                                   */
/* ------------------------------------------------------------------------ */

/* One process drives NT_SIM_CORES devices (default 1): simulated
 * NeuronCores, each with its own simulator state, clock, HBM capacity
 * (NT_HBM_BYTES each) and default stream, whose worker runs its kernels
 * concurrently with the other devices' (on the CPU backend: the same number
 * of logical devices).  A stream belongs to one device; a tensor lives on one
 * device (the one whose HBM holds it).  New tensors -- from the host,
 * factories, op outputs -- go on the device of the calling thread's current
 * stream, and an op whose tensor inputs are not all on its stream's device
 * fails at the call (NT_EINVAL naming the argument and both devices, nothing
 * queued): move data with nt_to_device.  Device d's simulated time is core
 * d's (nt_device_stats_get); the trace has one track group per core. */

/** Most devices (NT_SIM_CORES). */
#define NT_MAX_DEVICES 64

/** The number of devices (NT_SIM_CORES, 1..NT_MAX_DEVICES). */
NT_API int nt_device_count(void);
/** The device of the calling thread's current stream. */
NT_API int nt_device_current(void);
/** Makes device `dev`'s default stream the calling thread's current stream.
 *  NT_EINVAL if dev is not in 0..nt_device_count()-1. */
NT_API int nt_device_set(int dev);
/** Device `dev`'s default stream (NULL + NT_EINVAL for a bad dev). */
NT_API nt_stream *nt_stream_default_on(int dev);
/** A new stream on device `dev` (NULL + NT_EINVAL for a bad dev). */
NT_API nt_stream *nt_stream_create_on(int dev);
/** The device a stream runs on; -1 + NT_EINVAL for a bad stream. */
NT_API int nt_stream_device(const nt_stream *s);
/** The device whose memory holds t; -1 + the error for a bad tensor. */
NT_API int nt_tensor_device(const nt_tensor *t);
/** A copy of t on device `dev` (t may be on any device): queued on the
 *  calling thread's current stream, whose core's DMA moves the bytes, after
 *  whatever writes t; ops on dev's streams that read the copy wait for it.
 *  Differentiable: its backward copies the gradient back to t's device. */
NT_API nt_tensor *nt_to_device(nt_tensor *t, int dev);

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
    /* Captured programs (nt_graph_*, docs/graphs.md). */
    uint64_t graph_replays;        /* nt_graph_replay runs completed */
    uint64_t graph_ops_replayed;   /* ops those replays ran */
    uint64_t graph_kernels_replayed; /* kernels they ran */
    uint64_t graph_plan_bytes;     /* the largest memory plan of the graphs captured */
    uint64_t graph_sim_ns;         /* simulated time of the replays (each one program) */
    uint64_t graph_sim_hbm_bytes;  /* HBM bytes their DMAs moved */
    double graph_sim_ideal_ns;     /* their matmuls at TensorE's peak (MFU = this / sim) */
    double graph_sim_busy_ns[5];   /* busy time of TensorE, VectorE, ScalarE, GpSimd, DMA */
    /* Foreach kernels (NT_FOREACH, docs/fusion.md): kernels that ran several
     * small independent programs or single ops, and how many they ran. */
    uint64_t foreach_kernels;
    uint64_t foreach_programs;
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
 *  scalars such as Adam's bias corrections come from the step count).  Each
 *  chain runs on its parameter's device (the calling thread's current
 *  stream if it is on that device, else the device's default stream), where
 *  the parameter's state lives, so parameters may be spread over devices.  A
 *  parameter without a .grad is skipped and its step count does not move,
 *  as in PyTorch.  If a step fails part-way, parameters before the failing
 *  one have been updated.  Step counts stop at 2^53: a step at that count
 *  is NT_ESTATE and changes nothing. */
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
/** Flag of nt_optim_adamw_ex and nt_optim_adam: AMSGrad (Reddi et al.), as
 *  PyTorch's amsgrad=True -- the denominator uses vmax = max(vmax, v), the
 *  running maximum of v (a third state tensor, starting at zero). */
#define NT_OPTIM_AMSGRAD 1
/** nt_optim_adamw with flags: 0 or NT_OPTIM_AMSGRAD (anything else is
 *  NT_EINVAL naming 'flags').  With amsgrad, vmax = max(vmax, v) is taken
 *  after v's update and replaces v in the denominator, as PyTorch 1.13. */
NT_API nt_optim *nt_optim_adamw_ex(nt_tensor *const *params, int n, double lr, double beta1,
                                   double beta2, double eps, double weight_decay, int flags);
/** Adam exactly as torch.optim.Adam 1.13 (L2 weight decay, added to the
 *  gradient): with t the parameter's step count after the increment and in
 *  this order, g = grad + wd * p; m = m * beta1 + (1 - beta1) * g;
 *  v = v * beta2 + ((1 - beta2) * g) * g; with NT_OPTIM_AMSGRAD in flags
 *  vmax = max(vmax, v), which the denominator then uses for v;
 *  p = p - ((lr / (1 - beta1^t)) * m) / (sqrt(v) / sqrt(1 - beta2^t) + eps).
 *  m, v (and vmax) start at zero.  Arguments as nt_optim_adamw (each bad one
 *  is NT_EINVAL naming it); PyTorch's defaults: lr 1e-3, betas 0.9 and
 *  0.999, eps 1e-8, weight_decay 0. */
NT_API nt_optim *nt_optim_adam(nt_tensor *const *params, int n, double lr, double beta1,
                               double beta2, double eps, double weight_decay, int flags);
/** RMSprop exactly as torch.optim.RMSprop 1.13, in this order:
 *  g = grad + wd * p; sq = sq * alpha + ((1 - alpha) * g) * g; if centered,
 *  ga = ga * alpha + (1 - alpha) * g and avg = sqrt(sq - ga * ga) + eps, else
 *  avg = sqrt(sq) + eps; with momentum > 0, buf = buf * momentum + g / avg
 *  and p = p - lr * buf, else p = p - (lr * g) / avg.  sq, ga and buf start
 *  at zero.  lr, alpha, eps, weight_decay, momentum finite and >= 0 (else
 *  NT_EINVAL naming the argument).  PyTorch's defaults: lr 1e-2, alpha
 *  0.99, eps 1e-8, weight_decay 0, momentum 0, centered false. */
NT_API nt_optim *nt_optim_rmsprop(nt_tensor *const *params, int n, double lr, double alpha,
                                  double eps, double weight_decay, double momentum,
                                  bool centered);
/** Adagrad exactly as torch.optim.Adagrad 1.13 (dense gradients), with t
 *  the parameter's step count after the increment, in this order:
 *  g = grad + wd * p; sum = sum + g * g; p = p - ((lr / (1 + (t - 1) *
 *  lr_decay)) * g) / (sqrt(sum) + eps), sum starting at
 *  initial_accumulator_value.  All arguments finite and >= 0 (else
 *  NT_EINVAL naming it).  PyTorch's defaults: lr 1e-2, lr_decay 0,
 *  weight_decay 0, initial_accumulator_value 0, eps 1e-10. */
NT_API nt_optim *nt_optim_adagrad(nt_tensor *const *params, int n, double lr, double lr_decay,
                                  double weight_decay, double initial_accumulator_value,
                                  double eps);
/** Lion (Chen et al. 2023, "Symbolic Discovery of Optimization
 *  Algorithms"), in this order: p = p * (1 - lr * wd) (decoupled decay);
 *  c = m * beta1 + (1 - beta1) * g; p = p - lr * sign(c) (sign as
 *  torch.sign: 0 for +-0, NaN for NaN); m = m * beta2 + (1 - beta2) * g.
 *  m starts at zero.  lr, weight_decay finite and >= 0, betas in [0, 1)
 *  (else NT_EINVAL naming it).  The paper's defaults: lr 1e-4, betas 0.9
 *  and 0.99, weight_decay 0 (use a 3-10x smaller lr and a 3-10x larger
 *  weight decay than AdamW's). */
NT_API nt_optim *nt_optim_lion(nt_tensor *const *params, int n, double lr, double beta1,
                               double beta2, double weight_decay);
/** Parameter groups (PyTorch's add_param_group): appends params (n >= 1
 *  distinct floating leaf tensors, none already in the optimizer -- groups
 *  may not overlap, NT_EINVAL naming the parameter and its group) as a new
 *  group with its own lr and weight_decay (finite, >= 0); its other
 *  hyper-parameters (betas, momentum, eps, alpha, lr_decay, the initial
 *  accumulator value) are the first group's, that is the constructor's.
 *  The constructor's parameters are group 0.  With master weights on, the
 *  group's bf16/f16 parameters get their f32 masters.  Returns the new
 *  group's index
 *  or a negative error.  Not to be called while another thread steps opt
 *  with nt_grad_scaler or nt_clip_grad_norm on it. */
NT_API int nt_optim_add_group(nt_optim *opt, nt_tensor *const *params, int n, double lr,
                              double weight_decay);
/** nt_optim_add_group with the group's own betas (Adam, AdamW, Lion: in
 *  [0, 1)) and momentum (SGD, RMSprop: finite, >= 0; with nesterov, > 0).
 *  NAN for any of them takes the first group's; a value for one the
 *  optimizer does not use (momentum for Adam, betas for SGD ...) is
 *  NT_EINVAL naming it.  Fixed once the group is made (a captured step uses
 *  them as constants). */
NT_API int nt_optim_add_group_ex(nt_optim *opt, nt_tensor *const *params, int n, double lr,
                                 double weight_decay, double beta1, double beta2,
                                 double momentum);
/** Number of parameter groups (>= 1), or a negative error. */
NT_API int nt_optim_ngroups(nt_optim *opt);
/** Sets group `group`'s learning rate (finite, >= 0; a bad group or lr is
 *  NT_EINVAL naming it).  A captured step reads it at each replay. */
NT_API int nt_optim_set_group_lr(nt_optim *opt, int group, double lr);
/** Group `group`'s learning rate (NaN with the error set for a bad group). */
NT_API double nt_optim_get_group_lr(nt_optim *opt, int group);
/** The lr group `group` was made with: the base lr schedulers scale (like
 *  PyTorch's group['initial_lr']; saved in checkpoints). */
NT_API double nt_optim_get_group_initial_lr(nt_optim *opt, int group);
/** Group `group`'s beta1 (0 for an optimizer without betas). */
NT_API double nt_optim_get_group_beta1(nt_optim *opt, int group);
/** Group `group`'s momentum (0 for an optimizer without momentum). */
NT_API double nt_optim_get_group_momentum(nt_optim *opt, int group);
/** Group `group`'s weight decay. */
NT_API double nt_optim_get_group_weight_decay(nt_optim *opt, int group);
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
/** Sets the learning rate of every parameter group, used by the following
 *  steps (finite, >= 0). */
NT_API int nt_optim_set_lr(nt_optim *opt, double lr);
/** The current learning rate of group 0, or NaN with the error set for a
 *  bad opt. */
NT_API double nt_optim_get_lr(nt_optim *opt);
/** Number of successful nt_optim_step calls (restored by nt_load), or a
 *  negative error code for a bad opt. */
NT_API int64_t nt_optim_steps(nt_optim *opt);
/** Opaque learning-rate scheduler.  Its position is its optimizer's step
 *  count (nt_optim_steps, saved by nt_save and restored by nt_load), so it
 *  has no state of its own to checkpoint: a scheduler made after nt_load, or
 *  one made before it, continues the schedule where the saved run stopped.
 *  Creating one sets every group's lr to the schedule's value at the
 *  current position; nt_scheduler_step (called after nt_optim_step, as in
 *  PyTorch, or before each step: at one position it sets the same lr) sets
 *  them again for the new position.  Each group's lr scales its base lr,
 *  the lr the group was made with (nt_optim_get_group_initial_lr), as
 *  PyTorch's schedulers scale group['initial_lr'].  A step the grad scaler
 *  skips does not advance the optimizer's count, so it does not advance the
 *  schedule either (PyTorch's scheduler would still step).  In a captured
 *  step the lr is read at each replay (docs/graphs.md): step the scheduler
 *  on the host between replays.  The scheduler keeps the optimizer's memory
 *  (not its life): after nt_optim_destroy its calls are NT_ESTATE.  The
 *  schedule's values are doubles computed on the host. */
typedef struct nt_scheduler nt_scheduler;
/** torch.optim.lr_scheduler.StepLR: at position k, lr = base * gamma^(k /
 *  step_size) (integer division), the powers taken by repeated
 *  multiplication as PyTorch does (by pow() past 4096 decays).  step_size
 *  >= 1, gamma finite >= 0, else NT_EINVAL naming it. */
NT_API nt_scheduler *nt_scheduler_steplr(nt_optim *opt, int64_t step_size, double gamma);
/** Linear warm-up then cosine decay (nanoGPT's get_lr): at position k,
 *  lr = base * (k + 1) / warmup_steps while k < warmup_steps; then with
 *  prog = min(1, (k - warmup_steps) / (total_steps - warmup_steps - 1)),
 *  lr = min_lr + 0.5 * (base - min_lr) * (1 + cos(pi * prog)), so the last
 *  step (total_steps - 1) and every later one use min_lr (also when
 *  total_steps <= warmup_steps + 1).  min_lr is absolute (PyTorch's
 *  eta_min), the same for every group.  warmup_steps >= 0, total_steps >= 1
 *  and >= warmup_steps, min_lr finite >= 0, else NT_EINVAL naming it. */
NT_API nt_scheduler *nt_scheduler_cosine(nt_optim *opt, int64_t warmup_steps,
                                         int64_t total_steps, double min_lr);
/** torch.optim.lr_scheduler.LinearLR in its closed form: lr = base *
 *  (start_factor + (end_factor - start_factor) * min(k, total_iters) /
 *  total_iters) (PyTorch's step() reaches the same values by a product of
 *  ratios, within a few double ulps).  start_factor in (0, 1], end_factor in
 *  [0, 1], total_iters >= 1, else NT_EINVAL naming it. */
NT_API nt_scheduler *nt_scheduler_linear(nt_optim *opt, double start_factor, double end_factor,
                                         int64_t total_iters);
/** torch.optim.lr_scheduler.OneCycleLR with cosine annealing, two phases
 *  and no momentum cycling (cycle_momentum=False): initial = max_lr /
 *  div_factor (which becomes every group's base lr, as PyTorch writes it
 *  into initial_lr), min = initial / final_div_factor, e1 = pct_start *
 *  total_steps - 1, e2 = total_steps - 1; at position k <= e1 lr =
 *  cos_anneal(initial, max_lr, k / e1), else cos_anneal(max_lr, min,
 *  (k - e1) / (e2 - e1)), with cos_anneal(a, b, p) = b + (a - b) / 2 *
 *  (cos(pi p) + 1).  A position past total_steps is NT_ESTATE naming the
 *  call ("tried to step N times", like PyTorch's ValueError), at creation or
 *  at nt_scheduler_step.  max_lr finite > 0, total_steps >= 1, pct_start in
 *  [0, 1], div_factor and final_div_factor finite > 0, else NT_EINVAL naming
 *  it.  PyTorch's defaults: pct_start 0.3, div_factor 25, final_div_factor
 *  1e4. */
NT_API nt_scheduler *nt_scheduler_onecycle(nt_optim *opt, double max_lr, int64_t total_steps,
                                           double pct_start, double div_factor,
                                           double final_div_factor);
/** Sets every group's lr for the optimizer's current step count (see
 *  nt_scheduler).  0, or NT_ESTATE (past a one-cycle schedule's end, or its
 *  optimizer destroyed), NT_EINVAL for a bad s. */
NT_API int nt_scheduler_step(nt_scheduler *s);
/** Group `group`'s lr as the schedule last set it (NaN with the error set
 *  for a bad s or group). */
NT_API double nt_scheduler_get_lr(nt_scheduler *s, int group);
/** Frees s (NULL: a no-op; one destroyed already sets NT_EINVAL).  The
 *  optimizer keeps the lrs s set. */
NT_API void nt_scheduler_destroy(nt_scheduler *s);
/** torch.nn.utils.clip_grad_norm_ (L2): total = the L2 norm of all the
 *  params' .grads as one vector (the norm of their norms); each .grad is
 *  multiplied in place by min(1, max_norm / (total + 1e-6)), on the device,
 *  no host sync.  Returns total as a 0-dim f32 tensor on the calling
 *  thread's device (f64 when some .grad is f64: that gradient's norm, the
 *  total and the factor are then computed in double, as PyTorch's), owned like any op's result (by the open scope; with
 *  none, the caller releases it), NULL on bad input (params
 *  NULL, n < 0, max_norm <= 0 or NaN, a non-floating or repeated
 *  parameter).  Params without a .grad are skipped; with none, total is 0.
 *  Gradients may be on several devices: each one's norm is taken on its
 *  device and each is scaled there (the same bits as on one device). */
NT_API nt_tensor *nt_clip_grad_norm(nt_tensor *const *params, int n, double max_norm);
/** torch.nn.utils.clip_grad_value_: clamps every element of each param's
 *  .grad to [-clip, clip], in place on its device (a NaN stays NaN);
 *  params without a .grad are skipped.  Errors (nothing changed): params
 *  NULL or n < 0, clip < 0 or NaN (NT_EINVAL), a NULL, released,
 *  non-floating or repeated parameter. */
NT_API int nt_clip_grad_value(nt_tensor *const *params, int n, double clip);
/** Master weights for bf16/f16 parameters: when on, the optimizer keeps an
 *  f32 copy of each such parameter, applies the update to the copy (with the
 *  gradient cast to f32 and f32 state) and writes the copy, rounded, into the
 *  parameter.  Turning it on copies the parameters and casts existing state
 *  to f32; turning it off drops the copies and casts state back.  f32
 *  parameters are unaffected.  Off by default. */
NT_API int nt_optim_set_master_weights(nt_optim *opt, bool on);
/** Releases the parameters and frees the state.  NULL is a no-op; an
 *  optimizer destroyed already sets NT_EINVAL naming the argument; one made
 *  before the last nt_shutdown is freed (its tensors went with that
 *  runtime).  Not to be called while another thread uses opt. */
NT_API void nt_optim_destroy(nt_optim *opt);

/** Saves the values of params[0..n) (borrowed; n >= 1) and, if opt is not
 *  NULL, the optimizer's hyper-parameters, step counts and state, to `path`
 *  in the format of docs/checkpoint-format.md (little-endian, CRC-32 per
 *  record and over the header).  A sync point: waits for the values.  Writes
 *  `path`.tmp and renames it over `path`, so a crash never leaves a partial
 *  file under `path`.  Returns 0, NT_EIO (naming the file and the system's
 *  reason) or the error of a poisoned tensor.  Thread-safe. */
NT_API int nt_save(const char *path, nt_tensor *const *params, int n, nt_optim *opt);
/** Loads a checkpoint written by nt_save into the existing tensors
 *  params[0..n), which must match the saved ones in count, dtype and shape,
 *  and, if opt is not NULL, restores its hyper-parameters (every group's,
 *  lr included), step counts, master-weight setting and state (opt must be
 *  of the same kind and have as many parameters of the same shapes, in as
 *  many groups of the same sizes: else NT_ESHAPE).  A file written before
 *  parameter groups loads into a one-group SGD or AdamW optimizer.  The whole file is
 *  read and checked before anything is written: a missing or unreadable
 *  file is NT_EIO; a truncated file, bad magic or version, a checksum
 *  mismatch, a nonzero reserved byte or a field no writer could have
 *  produced (lr NaN, beta1 >= 1, a step count below 0 or above 2^53, an impossible
 *  shape: docs/checkpoint-format.md) is NT_EFORMAT, naming the field; a count, dtype or shape mismatch is NT_ESHAPE;
 *  an optimizer of another kind, or opt given for a file without optimizer
 *  state, is NT_EINVAL.  On any error the tensors and opt are untouched and
 *  the message names the path and what was wrong.  Values are written as
 *  queued in-place copies (no graph is recorded), each on the device of the
 *  tensor it replaces; the optimizer's state goes to its parameter's
 *  device.  Thread-safe. */
NT_API int nt_load(const char *path, nt_tensor *const *params, int n, nt_optim *opt);

/* ------------------------------------------------------------------------ */
/* Mixed precision: autocast, loss scaling (docs/amp.md)                     */
/* ------------------------------------------------------------------------ */

/** Opens an autocast region on the calling thread: until the matching
 *  nt_autocast_end, ops called on this thread run at the precision of
 *  docs/amp.md's policy -- matmul, linear and attention in `dt` (their
 *  inputs are cast to dt; the products still accumulate in f32), sums,
 *  means, softmax, log_softmax, the norms, exp, log, rsqrt, reciprocal,
 *  softplus, pow, pow_scalar and the losses in f32 (low-precision inputs are
 *  cast up), everything else in its inputs' dtype.  The casts are ordinary
 *  ops: they fuse, and autograd sends the gradients back through them, so
 *  f32 leaves get f32 gradients.  Backward
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
 *  gradient (on its device: gradients may be spread over devices), one
 *  sync for the lot.  Optional before nt_grad_scaler_step
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
/** Frees s.  NULL is a no-op; a scaler destroyed already sets NT_EINVAL
 *  naming the argument. */
NT_API void nt_grad_scaler_destroy(nt_grad_scaler *s);

/** fp8 autocast (docs/amp.md, "fp8 autocast"): matmuls run on fp8 operands
 *  with per-tensor scales, after Transformer Engine's recipes.  A recipe
 *  holds, per device and per matmul of a region (its "slot": the k-th
 *  matmul a region issues on that device is slot k, so a model that issues
 *  the same matmuls every step keeps its slots), three scaled tensors --
 *  the matmul's a (activations), its b (weights) and its output gradient --
 *  each with a scale and, for delayed scaling, an amax history.  Scales,
 *  histories and amaxes are f32 device tensors updated by device ops: no
 *  host sync, so a captured step replays them (docs/graphs.md). */
typedef enum nt_fp8_scaling {
    /** scale from the max of the last amax_history_len steps' amaxes
     *  (the current step's amax is pushed after use, by
     *  nt_fp8_recipe_update) */
    NT_FP8_DELAYED = 0,
    /** scale from the amax of the tensor being cast, just in time */
    NT_FP8_CURRENT = 1,
} nt_fp8_scaling;
typedef enum nt_fp8_format {
    /** e4m3 for a and b, e5m2 for gradients (Transformer Engine's HYBRID) */
    NT_FP8_HYBRID = 0,
    /** e4m3 for all three */
    NT_FP8_E4M3_ALL = 1,
} nt_fp8_format;
/** A recipe's settings (plain data; zero-initialised is invalid: set
 *  amax_history_len).  Defaults (opts NULL): delayed, hybrid, history 16,
 *  margin 0. */
typedef struct nt_fp8_recipe_opts {
    nt_fp8_scaling scaling;
    nt_fp8_format format;
    int amax_history_len; /* 1..4096 (used by delayed scaling; checked always) */
    int margin;           /* 0..32: scale = (fp8 max / amax) / 2^margin */
} nt_fp8_recipe_opts;
typedef struct nt_fp8_recipe nt_fp8_recipe;
struct nt_comm; /* the communicator (below) */
/** A new recipe; opts NULL gives the defaults.  NULL with NT_EINVAL naming
 *  the bad field (history outside 1..4096, margin outside 0..32, an unknown
 *  scaling or format).  Scales start at 1, histories at 0.  Belongs to the
 *  nt_init that made it; free with nt_fp8_recipe_destroy. */
NT_API nt_fp8_recipe *nt_fp8_recipe_create(const nt_fp8_recipe_opts *opts);
/** Frees r and its device state.  NULL is a no-op; a recipe destroyed
 *  already sets NT_EINVAL naming the argument. */
NT_API void nt_fp8_recipe_destroy(nt_fp8_recipe *r);
/** Opens an fp8 autocast region on the calling thread, closed by
 *  nt_autocast_end.  Inside it every op follows the bf16 autocast policy
 *  (nt_autocast_dtype() is NT_BF16), except nt_matmul (and so nt_linear)
 *  with a floating 2-D b and an a of 2 or more dims: its operands are
 *  scaled, saturated to the format's max and rounded to e4m3, the product
 *  runs on the fp8 matmul (f32 accumulation, bf16 result), and its backward
 *  casts the output gradient to e5m2 (hybrid) for the two gradient
 *  matmuls.  Other matmuls (batched b) and attention and convolution run in
 *  bf16 (documented upcast).  Errors: r not a live recipe (NT_EINVAL),
 *  regions nested 64 deep (NT_ESTATE); a region may issue at most 256 fp8
 *  matmuls per device (the 257th is NT_ESTATE naming nt_matmul). */
NT_API int nt_fp8_autocast_begin(nt_fp8_recipe *r);
/** The recipe of the calling thread's innermost autocast region, or NULL
 *  (no region, or a bf16/f16 one). */
NT_API nt_fp8_recipe *nt_fp8_autocast_recipe(void);
/** Delayed scaling: after a step's forward and backward, pushes each
 *  slot's amax of the step (the max over every fp8 matmul that used the
 *  slot since the last update, NaN if any was NaN) into its history and
 *  sets scale = (fp8 max / max(history)) / 2^margin, keeping the previous
 *  scale where that is not a positive finite f32 (history max 0, Inf or
 *  NaN, or a scale that overflows); then clears the step's amaxes.  With
 *  comm (may be NULL), the step's amaxes are first reduced with MAX over
 *  the communicator (nt_all_reduce, the rank tree), one vector per local
 *  member's device, so every replica gets the same scales whatever the
 *  core or process count.  Current scaling: nothing to do (returns 0).
 *  Queued device ops only.  Errors: r not live (NT_EINVAL); a comm member's
 *  device that ran no fp8 matmul of r, or devices with different slot
 *  counts (NT_ESTATE); nt_all_reduce's errors. */
NT_API int nt_fp8_recipe_update(nt_fp8_recipe *r, struct nt_comm *comm);
/** The number of slots r has on device dev (0 if none), or -1 with
 *  NT_EINVAL (r not live, dev out of range). */
NT_API int nt_fp8_recipe_slots(nt_fp8_recipe *r, int dev);
/** Views of r's state on device dev (new references, f32): which 0 gives
 *  the scales [3 * slots] (slot k: a at 3k, b at 3k + 1, the gradient at
 *  3k + 2), 1 the amax histories [3 * slots, amax_history_len] (newest
 *  first), 2 the amaxes of the current step [3 * slots].  NULL with
 *  NT_EINVAL (r not live, dev out of range, which not 0..2) or NT_ESTATE
 *  (no slot on dev yet). */
NT_API nt_tensor *nt_fp8_recipe_state(nt_fp8_recipe *r, int dev, int which);

/** nt_save plus, if scaler is not NULL, the loss scaler's state (scale,
 *  settings, growth tracker, skipped steps: record kind 4 of
 *  docs/checkpoint-format.md).  opt may be NULL.  Same guarantees as nt_save. */
NT_API int nt_checkpoint_save(const char *path, nt_tensor *const *params, int n,
                              nt_optim *opt, nt_grad_scaler *scaler);
/** nt_load plus, if scaler is not NULL, the loss scaler's state, checked
 *  before anything is written like the rest (a file without scaler state
 *  is NT_EINVAL when a scaler is given).  nt_load ignores scaler records. */
NT_API int nt_checkpoint_load(const char *path, nt_tensor *const *params, int n,
                              nt_optim *opt, nt_grad_scaler *scaler);

/** Everything a checkpoint can hold (zero it, then fill what you use):
 *  n tensors, each with a name (names NULL: by position, as nt_save), an
 *  optimizer, a loss scaler, ngens generators (their seed and offset, by
 *  position) and an fp8 recipe's state (its settings, scales, amax
 *  histories and the step's amaxes: record kind 7 of
 *  docs/checkpoint-format.md, so a resumed fp8 run continues with the bits
 *  of an uninterrupted one).  A name is 1 to 255 bytes, the n names
 *  distinct.  With fp8 set, n may be 0 (tensors NULL): a file of the
 *  recipe alone, e.g. beside nt_ddp_save's. */
typedef struct nt_checkpoint_spec {
    nt_tensor *const *tensors;
    const char *const *names;
    int n;
    nt_optim *opt;            /* or NULL */
    nt_grad_scaler *scaler;   /* or NULL */
    nt_generator *const *gens;
    int ngens;
    nt_fp8_recipe *fp8;       /* or NULL */
} nt_checkpoint_spec;
/** What a named nt_checkpoint_read did: the tensors loaded, the names asked
 *  for that the file lacks, the file's names nobody asked for (PyTorch's
 *  load_state_dict report).  The lists belong to the report: free them with
 *  nt_load_report_clear. */
typedef struct nt_load_report {
    int loaded, n_missing, n_unexpected;
    char **missing, **unexpected;
} nt_load_report;
/** Writes spec's contents like nt_checkpoint_save (atomic, checksummed),
 *  with the names (an optional record: older readers load the file by
 *  position), the generators' states and the fp8 recipe's state (a reader
 *  built before fp8 recipes refuses the file: "kind 7, unknown to this
 *  build").  Errors as nt_save; bad names or generators are NT_EINVAL
 *  naming spec's field; spec->fp8 not a live recipe NT_EINVAL; a recipe
 *  whose devices hold different state (amaxes not reduced over the
 *  replicas: nt_fp8_recipe_update with a communicator) NT_ESTATE naming the
 *  devices. */
NT_API int nt_checkpoint_write(const char *path, const nt_checkpoint_spec *spec);
/** Loads into spec's tensors (and optimizer, scaler, generators), checked
 *  completely before anything changes, as nt_checkpoint_load.  With names,
 *  tensors are matched by name, in any order (a file without names calls
 *  its tensors "0", "1", ...): a matched name whose dtype or shape differs
 *  is NT_ESHAPE naming the tensor and both shapes; strict makes a name
 *  missing on either side NT_EINVAL listing them, else the matching ones
 *  load and `report` (may be NULL) lists the others.  An optimizer's state
 *  is restored slot by slot as nt_load does (the optimizer over the same
 *  parameters in the same order as when saved), and only when every name
 *  matches.  Generators: the file must hold exactly ngens states.  fp8:
 *  the file's recipe state replaces spec->fp8's on every device (and seeds
 *  devices that run their first fp8 matmul later); a file without one is
 *  NT_EINVAL, a recipe of other settings (scaling, format,
 *  amax_history_len, margin) NT_EINVAL naming the setting and both values,
 *  a record no writer makes NT_EFORMAT.  Without spec->fp8 the record is
 *  checked but not restored. */
NT_API int nt_checkpoint_read(const char *path, const nt_checkpoint_spec *spec, bool strict,
                              nt_load_report *report);
NT_API void nt_load_report_clear(nt_load_report *r);
/** A checkpoint's tensors, as state_dict's keys: name ("0", "1", ... in a
 *  file without names), dtype and shape, in the file's order.  *entries is
 *  freed with nt_checkpoint_list_free.  The file is checked as a load does. */
typedef struct nt_checkpoint_entry {
    char *name;
    nt_dtype dtype;
    int ndim;
    int64_t shape[NT_MAX_DIMS];
} nt_checkpoint_entry;
NT_API int nt_checkpoint_list(const char *path, nt_checkpoint_entry **entries, int *n);
NT_API void nt_checkpoint_list_free(nt_checkpoint_entry *entries, int n);

/* ------------------------------------------------------------------------ */
/* Collectives (docs/collectives.md)                                         */
/* ------------------------------------------------------------------------ */

/** A communicator: simulated NeuronCores (devices) of this process and, under
 *  MPI, of every process that created it.  Opaque. */
typedef struct nt_comm nt_comm;

/** How all-reduce and reduce-scatter combine.  Every reduction follows the
 *  rank tree: adjacent pairs (v[2i] op v[2i+1]) level by level in rank
 *  order, an odd last one carried up, in f32 (integers: exact, SUM wraps),
 *  rounded once to the dtype.  MEAN = that SUM times (float)(1/n), one
 *  rounding (floating dtypes only).  MAX propagates NaN.  The order never
 *  depends on arrival order, threads, timing or the number of processes. */
typedef enum nt_reduce_op { NT_REDUCE_SUM = 0, NT_REDUCE_MEAN, NT_REDUCE_MAX } nt_reduce_op;

/** A communicator of this process's devices devices[0..n-1] (distinct, in
 *  local rank order).  Under MPI every process must call it (collective
 *  over processes, in the same order as its other nt_comm_create calls);
 *  global ranks are ordered by process, then local index.  NULL with the
 *  thread's error set on bad input (NT_EINVAL), or when another process
 *  does not answer within NT_COLLECTIVE_TIMEOUT (NT_ETIMEDOUT).  The caller
 *  owns it: nt_comm_destroy.  Valid until nt_shutdown. */
NT_API nt_comm *nt_comm_create(const int *devices, int n);
/** Frees c (NULL: no-op).  Call after the collectives on it were issued;
 *  queued ones keep what they need. */
NT_API void nt_comm_destroy(nt_comm *c);
/** Number of global ranks (every process's members); -1 if c is NULL. */
NT_API int nt_comm_size(const nt_comm *c);
/** Global rank of local member i; -1 if c is NULL or i out of range. */
NT_API int nt_comm_rank(const nt_comm *c, int i);

/** Collectives are queued, asynchronous ops with call sites, like any op:
 *  in[i] is local member i's input (on that member's device), out[i] gets a
 *  new tensor on that device.  They return 0, or an error code at the call
 *  (nothing queued, every out[i] NULL): NULL comm or arrays, a released or
 *  NULL tensor, shapes or dtypes that differ across members, a tensor on
 *  the wrong device, a bad op or root, a communicator of an earlier
 *  nt_init.  An error while they run (a peer that does not arrive within
 *  NT_COLLECTIVE_TIMEOUT, a dead MPI process, a poisoned input, shapes that
 *  differ across processes) poisons the outputs with a message naming the
 *  collective and the call site; the next sync on an output reports it.
 *  Simulated time: the collective starts on each core when every member's
 *  input is ready and its outputs are ready when the modelled transfer
 *  ends (docs/collectives.md); compute of other work overlaps it.
 *
 *  nt_all_reduce: out[i] = the rank-tree reduction of every rank's input. */
NT_API int nt_all_reduce(nt_comm *c, nt_tensor *const *in, nt_tensor **out, nt_reduce_op op);
/** out[i] = every rank's input concatenated along dim 0 in rank order (the
 *  inputs have the same shape, ndim >= 1). */
NT_API int nt_all_gather(nt_comm *c, nt_tensor *const *in, nt_tensor **out);
/** out[i] = block r (r = member i's global rank) of the reduction along dim
 *  0, which the comm size must divide. */
NT_API int nt_reduce_scatter(nt_comm *c, nt_tensor *const *in, nt_tensor **out,
                             nt_reduce_op op);
/** out[i] = a copy of the input of global rank root.  in[i] may be NULL for
 *  members other than root, except when root is in another process: then
 *  every member gives a tensor of the root's shape and dtype (its values
 *  are not read), since the shape must be known at the call. */
NT_API int nt_broadcast(nt_comm *c, nt_tensor *const *in, nt_tensor **out, int root);

/** The collectives the cost model knows (nt_collective_cost). */
typedef enum nt_collective {
    NT_COLL_ALL_REDUCE = 0,
    NT_COLL_ALL_GATHER,
    NT_COLL_REDUCE_SCATTER,
    NT_COLL_BROADCAST,
} nt_collective;

/** The cost model of the current topology (NT_SIM_TOPOLOGY and its
 *  overrides, read at nt_init; docs/collectives.md) for a collective over
 *  `ranks` cores moving a result of `bytes` bytes (reduce-scatter: the
 *  input's): *formula_ns gets the closed formula (e.g. ring all-reduce:
 *  2(N-1)/N x bytes / bandwidth + 2(N-1) x latency + the reductions), and
 *  *schedule_ns the end of the step-by-step schedule the collective ops
 *  book on the cores' timelines, every rank starting at 0.  Either pointer
 *  may be NULL.  NT_EINVAL for a bad kind, ranks < 1 or bytes < 0. */
NT_API int nt_collective_cost(nt_collective kind, int ranks, double bytes, double *formula_ns,
                              double *schedule_ns);

/** This process's rank among the MPI processes (0 without MPI). */
NT_API int nt_process_rank(void);
/** Number of MPI processes (1 without MPI or when not launched by mpirun). */
NT_API int nt_process_count(void);
/* Data-parallel training (docs/ddp.md)                                     */
/* ------------------------------------------------------------------------ */

/** Opaque data-parallel trainer: one replica of the parameters per device,
 *  a global batch cut into S fixed shards, and the shards' gradients
 *  combined in one fixed order (the shard tree: adjacent pairs level by
 *  level, in shard order, then times 1/S, in f32), so the parameters after
 *  any number of steps are the same bits on 1, 2, 4 or 8 devices and 1 or 2
 *  processes.  Thread-safe: a lock per nt_ddp; the ops its functions issue
 *  go on the device concerned (its default stream, or the thread's current
 *  stream when that is on the device), and the thread's current stream is
 *  the same again when they return.
 *
 *  A step:
 *    for (int s = 0; s < nt_ddp_shards(d); s++) {
 *        int dev = nt_ddp_shard_device(d, s);
 *        if (dev < 0) continue;                     (another process's shard)
 *        nt_device_set(dev);
 *        nt_tensor *x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, shape);
 *        loss = model(nt_ddp_params(d, dev), x, ...);
 *        nt_ddp_backward(d, s, loss);
 *    }
 *    nt_ddp_reduce(d);                              (each replica's .grad = mean)
 *    nt_ddp_step(d, opts, ndev);                    (one optimizer per replica)
 */
typedef struct nt_ddp nt_ddp;

/** Replicates params[0..nparams) (distinct floating leaves requiring grad,
 *  all on one device; borrowed) onto devices[0..ndev) (distinct local
 *  devices): on the parameters' own device the replica is the parameters
 *  themselves (retained), elsewhere a bit copy that requires grad.  shards
 *  (S) must be a multiple of the global rank count R (ndev, times the
 *  processes) with S/R a power of two; global rank r computes shards
 *  [r S/R, (r+1) S/R).  NULL with NT_EINVAL (naming the argument) on bad
 *  input.  Free with nt_ddp_destroy. */
NT_API nt_ddp *nt_ddp_create(nt_tensor *const *params, int nparams, int shards,
                             const int *devices, int ndev);
/** Releases the replicas and any gradients held.  NULL is a no-op; an
 *  nt_ddp destroyed already sets NT_EINVAL naming the argument. */
NT_API void nt_ddp_destroy(nt_ddp *d);
/** The replica on local device `dev` (an array of nparams tensors owned by
 *  d, valid until nt_ddp_destroy), or NULL with NT_EINVAL. */
NT_API nt_tensor **nt_ddp_params(nt_ddp *d, int dev);
/** S, or a negative error. */
NT_API int nt_ddp_shards(const nt_ddp *d);
/** The local device computing global shard `shard`, -1 if another process
 *  does, or a negative error for a shard out of range. */
NT_API int nt_ddp_shard_device(const nt_ddp *d, int shard);
/** Rows [shard B/S, (shard+1) B/S) of a global batch (dim 0 = B, divisible
 *  by S): of a tensor, copied onto the shard's device (from another device
 *  through the host: nt_ddp_shard waits for the batch's value then); of
 *  host data `src` with the global shape, copied from the host onto it.  A new
 *  tensor (ownership as for any op); NULL with the error set for a shard
 *  out of range or of another process, or a B that S does not divide. */
NT_API nt_tensor *nt_ddp_shard(nt_ddp *d, nt_tensor *batch, int shard);
NT_API nt_tensor *nt_ddp_shard_from_host(nt_ddp *d, int shard, const void *src, nt_dtype dt,
                                         int ndim, const int64_t *shape);
/** nt_backward of shard `shard`'s loss (computed from the replica on the
 *  shard's device; `loss` must be on that device), keeping that shard's
 *  gradients apart: the replica's .grads are as before when it returns, and
 *  the gradients go into the shard tree (a parameter the loss does not
 *  reach counts as zeros).  Once per shard per step (NT_ESTATE for a
 *  second).  On an error inside the backward the step's gradients so far
 *  are dropped. */
NT_API int nt_ddp_backward(nt_ddp *d, int shard, nt_tensor *loss);
/** nt_ddp_backward of one loss that reaches the replicas of several nt_ddps
 *  (ds[0..nd), distinct): the nt_ddps of a tensor-parallel group, one per
 *  tensor rank, each data-parallel over its own devices, whose members'
 *  losses were joined (nt_tp_join).  One nt_backward; each nt_ddp gets its
 *  own replica's gradients of shard `shard` in its shard tree, as
 *  nt_ddp_backward does.  `loss` must be on ds[0]'s device of the shard.
 *  Errors as nt_ddp_backward's (naming ds[i]), and NT_EINVAL for NULL ds,
 *  nd < 1 or the same nt_ddp twice. */
NT_API int nt_ddp_backward_group(nt_ddp *const *ds, int nd, int shard, nt_tensor *loss);
/** nt_ddp_backward of one shard of each local device from one backward
 *  pass: losses[i] is shard shards[i]'s loss, computed on local device i
 *  (nt_ddp_create's devices[i], this process's; shards[i] one of its
 *  shards), n the local device count.  The shards' forwards may run layer
 *  by layer together (every device's layer l, then l + 1); the losses are
 *  joined (as nt_tp_join) and one nt_backward runs every device's backward,
 *  layer by layer.  Each shard gets its own gradients in its device's
 *  shard tree: the same bits as n nt_ddp_backward calls, and their rules
 *  (once a shard a step; stage 3: gathered).  With more shards than
 *  devices, one call per round.  NT_EINVAL naming the argument for NULL
 *  arrays, another n, a shard out of range, of another process or of
 *  another device than i, a loss on another device or not a floating
 *  scalar; NT_ESTATE while capturing (a captured step takes
 *  nt_ddp_backward per shard); nothing changed then. */
NT_API int nt_ddp_backward_shards(nt_ddp *d, const int *shards, nt_tensor *const *losses, int n);
/** nt_ddp_backward_shards over a tensor-parallel group: the nt_ddps
 *  ds[0..nd) (distinct; one per tensor or expert rank, each data-parallel
 *  over its own devices, as for nt_ddp_backward_group), each with n local
 *  devices, local device i of every one of them computing shard shards[i]
 *  (its part of the group's forward of that shard).  losses[i] is the
 *  group's loss of shard shards[i] (the members' losses joined, nt_tp_join),
 *  on ds[0]'s local device i.  The group forwards of the n shards may run
 *  layer by layer together, with nt_ddp_layer_done marks of every ds[r];
 *  the n losses are joined and one nt_backward runs them all.  Each ds[r]
 *  gets its own replica's gradients of each shard in its shard tree: the
 *  same bits as n nt_ddp_backward_group calls, and their rules.  Errors as
 *  nt_ddp_backward_group's and nt_ddp_backward_shards' (for ds[0]), and
 *  NT_EINVAL naming the argument for a ds[r] with another local device
 *  count than n or whose local device i does not compute shards[i];
 *  nothing changed then. */
NT_API int nt_ddp_backward_group_shards(nt_ddp *const *ds, int nd, const int *shards,
                                        nt_tensor *const *losses, int n);
/** Combines the step's shard gradients (every shard of this process must
 *  have had its nt_ddp_backward, else NT_ESTATE naming the first missing
 *  one): the shard tree, the collective over processes and devices, times
 *  1/S; each replica's .grad is set to the result (in its dtype), replacing
 *  the one it had.  Every replica gets the same bits.  Under MPI, every
 *  process calls it. */
NT_API int nt_ddp_reduce(nt_ddp *d);
/** nt_optim_step then nt_optim_zero_grad of opts[i] on the i-th device
 *  of d (nopts = ndev), each of which must optimise that device's replica
 *  (nt_ddp_params, the same tensors in the same order). */
NT_API int nt_ddp_step(nt_ddp *d, nt_optim *const *opts, int nopts);
/** Batch norm under data parallelism (docs/ddp.md, "Batch norm over
 *  shards"): training-mode nt_batch_norm of shard `shard`'s x, normalised
 *  with the shard's own batch statistics (the shards are fixed by the
 *  program, so they and the output are the same bits on any core or
 *  process count).  The running statistics are not touched here:
 *  running_mean, running_var ([C] f32, on the shard's device: that device's
 *  replica of them, equal on every device at the start) are updated by
 *  nt_ddp_reduce, on every replica alike, from the global batch's mean and
 *  unbiased variance, combined from the shards' statistics through the
 *  shard tree of the gradients.  Layers are the calls in order: every
 *  shard makes the same calls (same C, values per channel and momentum),
 *  each device passes the same running statistics to a call each step.
 *  Errors as nt_batch_norm's, and: a shard out of range or of another
 *  process, x or the running statistics not on the shard's device, NULL
 *  running statistics, a call unlike the other shards' (NT_EINVAL), a
 *  shard whose backward was taken this step (NT_ESTATE). */
NT_API nt_tensor *nt_ddp_batch_norm(nt_ddp *d, int shard, nt_tensor *x, nt_tensor *running_mean,
                                    nt_tensor *running_var, nt_tensor *w, nt_tensor *b,
                                    double momentum, double eps);

/* ZeRO (docs/sharding.md): the optimizer state (stage 1), the gradients
 * (stage 2) and the parameters (stage 3) sharded over the nt_ddp's ranks,
 * with the parameters after every step the same bits as plain nt_ddp's
 * (and a one-core run's), whatever the stage and the rank count.  A step:
 *     nt_ddp_set_zero(d, 2);                          (once, after create)
 *     opts[i] = nt_optim_adamw(nt_ddp_zero_shards(d, dev_i), n, ...);
 *     loop: [stage 3: nt_ddp_gather(d, lo, hi) per layer before the forward]
 *           nt_ddp_backward per shard; nt_ddp_reduce(d); nt_ddp_step(d, opts, ndev);
 */
/** Sets the ZeRO stage (0..3) of d, once, before its first nt_ddp_backward
 *  (NT_ESTATE otherwise).  Parameter j (numel elements, flattened, padded
 *  with zeros to a multiple of the global rank count R) is cut into R
 *  shards of L = ceil(numel / R) elements; rank r owns [r L, (r + 1) L).
 *  Stage 1: nt_ddp_reduce all-reduces as stage 0 (the replicas keep the
 *  whole mean .grad) and each shard's .grad is its slice.  Stage 2: it
 *  reduce-scatters, only the shards get a .grad.  Stages 1, 2: nt_ddp_step
 *  steps the shards' optimizers and all-gathers the shards into every
 *  replica, in place.  Stage 3: the replicas are released now (release your
 *  own references to the parameters too, to free their memory); before a
 *  forward, nt_ddp_gather makes them again, and each device's gathered
 *  parameters are released after its last shard's nt_ddp_backward of the
 *  step.  NT_EINVAL for a stage out of range. */
NT_API int nt_ddp_set_zero(nt_ddp *d, int stage);
/** d's ZeRO stage (0 without nt_ddp_set_zero), or a negative error. */
NT_API int nt_ddp_zero_stage(const nt_ddp *d);
/** Device dev's shards (an array of nparams 1-D tensors of L elements,
 *  leaves requiring grad, owned by d): what that device's optimizer must
 *  optimize under ZeRO (nt_ddp_step checks it).  NULL with NT_ESTATE at
 *  stage 0, NT_EINVAL for a device not of d. */
NT_API nt_tensor **nt_ddp_zero_shards(nt_ddp *d, int dev);
/** Stage 3: all-gathers parameters [lo, hi) (those not gathered yet) into
 *  every local replica (nt_ddp_params), queued like any collective, so a
 *  call for the next layer issued before this layer's compute overlaps it
 *  (a prefetch).  NT_EINVAL for a bad range, NT_ESTATE at another stage. */
NT_API int nt_ddp_gather(nt_ddp *d, int lo, int hi);
/** Stage 3, within a round of nt_ddp_backward_shards: marks the end of a
 *  layer whose parameters are [lo, hi) (at most 64), after every local
 *  device's forward of it (in[i] local device i's output of the layer;
 *  out[i] = in[i], a view to go on with), one call a layer, in the
 *  forward's order.  The layer's gathered parameters then give their
 *  device memory back (nt_ddp_params' handles and the views the graph
 *  saved stay; parameters of at most 3968 bytes are kept).  In the round's
 *  backward, just before the layer's own backward, its parameters are
 *  gathered again into the same storages (the same bits), the next layer's
 *  (whose backward is done) give their memory back, and the previous
 *  layer's all-gather is queued (the prefetch).  nt_ddp_gather fills a
 *  layer released by an earlier round again.  NT_EINVAL naming the
 *  argument (NULL arrays, a bad range, an input not on local device i or
 *  not floating); NT_ESTATE at another stage, for a layer not gathered,
 *  while capturing, or when a marked layer is differentiated outside its
 *  round's nt_ddp_backward_shards.  A tensor-parallel group marks each
 *  layer in each of its nt_ddps (after every member's forward of it) and
 *  runs the round's backward with nt_ddp_backward_group_shards. */
NT_API int nt_ddp_layer_done(nt_ddp *d, int lo, int hi, nt_tensor *const *in, nt_tensor **out);
/** Stages 2, 3: on (true), each bucket of nt_ddp_reduce's reduce-scatter
 *  is issued during the backward, as soon as every local device's
 *  gradients of its parameters are made (gradient hooks on the replicas
 *  during each device's last shard's nt_ddp_backward of the step), so the
 *  collective overlaps the rest of the backward and each block sum is
 *  freed once packed; nt_ddp_reduce then takes the means.  The same bits
 *  as without.  Off by default; set between steps.  NT_ESTATE at stage 0
 *  or 1 or after a shard's backward of this step. */
NT_API int nt_ddp_set_overlap(nt_ddp *d, bool on);
/** nt_clip_grad_norm over the parameters' whole mean gradients, after
 *  nt_ddp_reduce: the same bits as nt_clip_grad_norm on a stage-0 replica.
 *  Stages 2, 3 all-gather the gradient shards first (the norms need the
 *  whole gradients: Psi more elements moved) and scale their shards.
 *  Returns the total norm (0-dim f32 on the calling thread's device, or on
 *  d's last device when the thread's is not one of d's; the caller releases
 *  it, even inside a scope) or NULL with the error (NT_ESTATE before a
 *  reduce, errors of nt_clip_grad_norm). */
NT_API nt_tensor *nt_ddp_clip_grad_norm(nt_ddp *d, double max_norm);
/** Sharded checkpoint: each global rank writes its shards and their
 *  optimizer state to "<path>.zero<r>of<R>" (the format of
 *  docs/checkpoint-format.md, named records; stage 0 writes rank 0's
 *  replica as "<path>.zero0of1").  opts as for nt_ddp_step (NULL: no
 *  optimizer state).  Every process calls it. */
NT_API int nt_ddp_save(nt_ddp *d, const char *path, nt_optim *const *opts, int nopts);
/** Loads what nt_ddp_save wrote at path (the newest layout there) into d:
 *  its shards and opts' state (stages 1, 2 then all-gather the replicas),
 *  or its replicas at stage 0.  A checkpoint saved under another stage or
 *  rank count (a stage-0 save loads into any stage-0 nt_ddp) is NT_EINVAL
 *  naming both layouts unless reshard is true: then the parameters and the
 *  optimizer state (SGD, Adam, AdamW, any parameter groups; else NT_ENOTSUP) are
 *  put together from every saved rank's file and cut again.  No file:
 *  NT_EIO; another parameter count or size: NT_ESHAPE naming it; errors of
 *  nt_checkpoint_read otherwise. */
NT_API int nt_ddp_load(nt_ddp *d, const char *path, nt_optim *const *opts, int nopts,
                       bool reshard);
/** Tensor-parallel sharded checkpoint: d holds tensor rank `rank` of
 *  `ranks`' parts of a model's parameters (e.g. one nt_ddp per member of a
 *  mesh's "tensor" group); writes nt_ddp_save's files at
 *  "<path>.tp<rank>of<ranks>".  Every member of every process calls it.
 *  NT_EINVAL for a NULL path or rank outside 0..ranks-1; else as
 *  nt_ddp_save. */
NT_API int nt_ddp_save_split(nt_ddp *d, const char *path, int rank, int ranks,
                             nt_optim *const *opts, int nopts);
/** Loads what nt_ddp_save_split wrote at path (the newest tensor rank count
 *  there) into d, tensor rank `rank` of `ranks`, whose parameter j is split
 *  evenly along dims[j] over the tensor ranks (-1: replicated, the same on
 *  every rank).  Saved over `ranks` tensor ranks: nt_ddp_load of rank's
 *  files (reshard as there).  Saved over another count: NT_EINVAL naming
 *  both counts unless reshard is true; then every saved tensor rank's
 *  files are read (each put together over its ZeRO ranks), each split
 *  parameter and its optimizer state (as nt_ddp_load's reshard: SGD, Adam,
 *  AdamW, any parameter groups) joined along dims[j] and this rank's part
 *  cut again; a replicated one is saved rank 0's.  No file: NT_EIO; dims
 *  NULL or out of range, rank outside 0..ranks-1: NT_EINVAL; a split dim
 *  the saved count does not divide: NT_ESHAPE. */
NT_API int nt_ddp_load_split(nt_ddp *d, const char *path, int rank, int ranks, const int *dims,
                             nt_optim *const *opts, int nopts, bool reshard);

/* ------------------------------------------------------------------------ */
/* Device mesh (docs/sharding.md)                                           */
/* ------------------------------------------------------------------------ */

/** Opaque device mesh: the global ranks (every device of every process,
 *  process by process) laid out row-major (the last dimension fastest) over
 *  named dimensions, with a communicator for each group of ranks that
 *  differ along one dimension only. */
typedef struct nt_mesh nt_mesh;
/** A mesh of dims[0] x ... x dims[ndims-1] ranks (ndims 1..3), names[a]
 *  one of "data", "tensor", "expert" (distinct).  The product must be the
 *  device count over every process; under MPI every process calls it with
 *  the same dims and names (collective: a mismatch is NT_EINVAL naming both
 *  processes' layouts).  A group spanning some processes but not all is
 *  NT_ENOTSUP.  NULL with the error (NT_EINVAL naming the argument, the
 *  layout and the sizes).  Free with nt_mesh_destroy. */
NT_API nt_mesh *nt_mesh_create(const int *dims, const char *const *names, int ndims);
/** Frees the mesh and its communicators (NULL: no-op). */
NT_API void nt_mesh_destroy(nt_mesh *m);
/** The communicator of the group along dimension `name` holding local
 *  device dev's rank (borrowed, valid until nt_mesh_destroy; its rank i is
 *  coordinate i along the dimension).  NULL with NT_EINVAL for an unknown
 *  name or a bad device. */
NT_API nt_comm *nt_mesh_comm(nt_mesh *m, const char *name, int dev);
/** The local devices of that group, in the communicator's member order
 *  (in[i] of a collective on it is devs[i]'s): fills devs[0..n) (cap
 *  entries at most) and returns n, or a negative error. */
NT_API int nt_mesh_group(const nt_mesh *m, const char *name, int dev, int *devs, int cap);
/** The size of dimension `name` (NULL: the mesh's rank count), or a
 *  negative error. */
NT_API int nt_mesh_size(const nt_mesh *m, const char *name);
/** Local device dev's coordinate along dimension `name`, or an error. */
NT_API int nt_mesh_coord(const nt_mesh *m, const char *name, int dev);
/** Local device dev's global rank, or an error. */
NT_API int nt_mesh_rank(const nt_mesh *m, int dev);
/** Bytes of device dev's memory that live tensors hold (the allocator's
 *  count, nt_stats' device_bytes_live for one device), or a negative error
 *  (NT_EINVAL for a bad device). */
NT_API int64_t nt_device_bytes_live(int dev);
/** The highest nt_device_bytes_live(dev) reached since nt_init or the last
 *  nt_stats_reset (nt_stats' device_bytes_live_peak for one device), or a
 *  negative error (NT_EINVAL for a bad device). */
NT_API int64_t nt_device_bytes_live_peak(int dev);

/* ------------------------------------------------------------------------ */
/* Tensor parallelism (docs/parallel.md): differentiable collectives and    */
/* tensor-parallel layers over a communicator (the tensor-parallel group),  */
/* the same bits for every group size.                                      */
/* ------------------------------------------------------------------------ */

/* Conventions: every array has one tensor per local member of c, in[i] on
 * member i's device (as the collectives'); out[i] gets a new tensor there,
 * owned by the caller (adopted by the open scope).  "size" is the group's
 * global size, "rank" member i's global rank.  A member's slice of a split
 * dim is the rank-th of size equal blocks.  The ops are differentiable:
 * one backward pass from nt_tp_join of the members' losses runs every
 * member's backward, the collectives of the backward included.  c must
 * live until that backward.  Errors at the call name the function, the
 * argument and the sizes (NT_EINVAL, NT_ESHAPE, NT_EDTYPE, as
 * nt_all_reduce's), and leave every out[i] NULL. */

/** Megatron's f: out[i] = in[i] (a view); backward: the gradients'
 *  all-reduce (sum, rank tree).  Floating inputs, one shape. */
NT_API int nt_tp_copy(nt_comm *c, nt_tensor *const *in, nt_tensor **out);
/** Megatron's g: out[i] = the all-reduce (sum, rank tree) of the inputs;
 *  backward: identity (each member's own gradient). */
NT_API int nt_tp_reduce(nt_comm *c, nt_tensor *const *in, nt_tensor **out);
/** out[i] = the inputs concatenated along dim in rank order; backward: the
 *  reduce-scatter (sum) of the gradients along dim. */
NT_API int nt_tp_gather(nt_comm *c, nt_tensor *const *in, nt_tensor **out, int dim);
/** out[i] = member i's slice of in[i] along dim (size must divide it);
 *  backward: the all-gather of the gradients along dim. */
NT_API int nt_tp_split(nt_comm *c, nt_tensor *const *in, nt_tensor **out, int dim);
/** The members' replicated values (a loss each member computed alike) as
 *  one tensor on local member 0's device, equal to in[0]; backward: the
 *  gradient to every member (nt_backward of it seeds every member's loss,
 *  as each rank's own backward does in Megatron).  NULL on error. */
NT_API nt_tensor *nt_tp_join(nt_comm *c, nt_tensor *const *in);
/** Column-parallel linear: y[i] = x[i] w[i]^T + b[i], x [..., K]
 *  replicated, w[i] [N / size, K] (rows rank * N/size ...), b NULL or
 *  b[i] [N / size]; y[i] [..., N / size].  Backward: x's gradient sums
 *  over N, which the split cuts: it is defined as `blocks` blocks of N,
 *  each an ordinary matmul rounded to x's dtype and widened to f32, added
 *  in the rank tree's order (each member's blocks, then the all-reduce),
 *  so it is the same bits for every size.  blocks: a multiple of size with
 *  a power-of-two quotient, dividing N. */
NT_API int nt_tp_column_linear(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                               nt_tensor *const *b, int blocks, nt_tensor **y);
/** Row-parallel linear: y[i] = the sum over size of x[i] w[i]^T, plus
 *  b[i]; x[i] [..., K / size] (member i's slice), w[i] [N, K / size], b
 *  NULL or b[i] [N] (replicated); y[i] [..., N] replicated.  The K-sum is
 *  `blocks` blocks of K (each an ordinary matmul, widened to f32) in the
 *  rank tree's order, then rounded to x's dtype: the same bits for every
 *  size (docs/parallel.md has its cost).  blocks as nt_tp_column_linear's,
 *  dividing K. */
NT_API int nt_tp_row_linear(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                            nt_tensor *const *b, int blocks, nt_tensor **y);
/** Sequence parallelism (Korthikanti et al. 2022): the column-parallel
 *  linear of nt_tp_column_linear whose input x[i] is member i's slice of
 *  the sequence dim `dim` (not the last): x is all-gathered along dim
 *  first (y[i] as nt_tp_column_linear's of the whole x); backward: x's
 *  gradient, the same blocked tree over N, is reduce-scattered along dim
 *  (nt_reduce_scatter sums in nt_all_reduce's rank tree, so each element
 *  is nt_tp_column_linear's bits) and w's from x gathered again (only the
 *  slice is kept for the backward). */
NT_API int nt_tp_column_linear_sp(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                                  nt_tensor *const *b, int blocks, int dim, nt_tensor **y);
/** Sequence parallelism: nt_tp_row_linear whose output is reduce-scattered
 *  along the sequence dim `dim` (not the last; size must divide it)
 *  instead of all-reduced: y[i] is member i's slice of nt_tp_row_linear's
 *  result, the same bits.  Backward: y's gradient all-gathered along dim.
 *  b (NULL or [N] replicated) is added to the slice; its gradient sums
 *  the member's rows only (pass b through nt_tp_copy, or nt_tp_copy_blocks,
 *  to sum it over the group). */
NT_API int nt_tp_row_linear_sp(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                               nt_tensor *const *b, int blocks, int dim, nt_tensor **y);
/** A replicated parameter used by nb token blocks on each member (a layer
 *  norm or bias in a sequence-parallel region): out[i] [nb, ...] is nb
 *  copies of in[i]; backward: member i's nb gradient rows (each + 0, so -0
 *  is +0 at every split) added pairwise in the rank tree's order in f32,
 *  then all-reduced (sum): the tree over nb x size blocks, the same bits
 *  for every size when nb x size is fixed.  nb a power of two. */
NT_API int nt_tp_copy_blocks(nt_comm *c, nt_tensor *const *in, int nb, nt_tensor **out);
/** Vocabulary-parallel embedding: w[i] [V / size, D] (rows rank * V/size
 *  ...), idx[i] integer [...] replicated; out[i] [..., D] replicated: each
 *  member's rows for the indices in its block, zeros elsewhere, summed
 *  over the group (x + 0: the row's bits, -0 as +0 on every size). */
NT_API int nt_tp_embedding(nt_comm *c, nt_tensor *const *w, nt_tensor *const *idx,
                           nt_tensor **out);
/** Vocabulary-parallel cross-entropy (mean over M): logits[i] [M, V / size]
 *  (floating; computed in f32), target[i] [M] integer in [0, V)
 *  replicated; loss[i] a 0-d f32, replicated.  The max over V is an
 *  all-reduce (max, exact); the sum of exponentials is `blocks` blocks of
 *  V summed in the rank tree's order, as the linear layers' K; blocks as
 *  theirs, dividing V. */
NT_API int nt_tp_cross_entropy(nt_comm *c, nt_tensor *const *logits, nt_tensor *const *target,
                               int blocks, nt_tensor **loss);
/** Causal self-attention with `heads` heads split over the group: x[i]
 *  [B, T, D] replicated; wq, wk, wv [i] [D / size, D] (member i's heads'
 *  rows, column-parallel, no bias), wo[i] [D, D / size] (row-parallel,
 *  no bias); y[i] [B, T, D] replicated.  heads a multiple of size;
 *  head dim D / heads <= 128; blocks as the linear layers'. */
NT_API int nt_tp_attention(nt_comm *c, nt_tensor *const *x, nt_tensor *const *wq,
                           nt_tensor *const *wk, nt_tensor *const *wv, nt_tensor *const *wo,
                           int heads, int blocks, nt_tensor **y);

/* ------------------------------------------------------------------------ */
/* Mixture of experts (docs/parallel.md, "Mixture of experts"): a router,   */
/* the grouped matmul, all_to_all with counts on the device and the         */
/* expert-parallel MoE MLP, the same bits for every expert-parallel size.   */
/* Nothing here reads a tensor back to the host.                            */
/* ------------------------------------------------------------------------ */

/** The router's score function (computed in f32). */
typedef enum nt_moe_score {
    NT_MOE_SOFTMAX = 0, /* softmax over the experts (Switch, GShard, Mixtral) */
    NT_MOE_SIGMOID = 1, /* sigmoid of each logit (DeepSeek-V3) */
} nt_moe_score;

/** torch._grouped_mm with counts: x [M, K] holds consecutive runs of rows,
 *  counts[e] (i32 [E], on the device) rows for expert e in order; w [E, K,
 *  N].  Row r of run e is x[r] . w[e]: each run exactly nt_matmul(run,
 *  w[e]) (f32 accumulation over K-tiles of 128 in ascending order, one
 *  rounding), so the result equals a loop of nt_matmul over the row slices
 *  bit for bit; rows past the counts' sum are zero.  x and w: f32 or bf16,
 *  one dtype; the result [M, N] has it.  One kernel for every expert, which
 *  reads the counts on the device.  Gradients: x's is grouped_mm(g, w[e]^T)
 *  per run; w[e]'s is x_e^T . g_e, contracting over the run's rows in
 *  K-tiles of 128 from its first row (zero for an empty run).  Errors at the
 *  call: NULL or released arguments, dtypes (NT_EDTYPE), shapes (NT_ESHAPE);
 *  when the kernel runs: a negative count or counts that add up to more
 *  than M (NT_ERANGE, "counts add up to S rows; x has M").  Each gradient
 *  is itself a grouped product, so double backward works. */
NT_API nt_tensor *nt_grouped_mm(nt_tensor *x, nt_tensor *w, nt_tensor *counts);

/** all_to_all with per-destination counts held on the device, over c (the
 *  expert dimension of a mesh): in[i] [R, ...] (one shape and dtype on every
 *  member) holds its rows sorted by destination rank, send_counts[i] (i32
 *  [P], P = nt_comm_size(c)) the rows for each rank.  out[i] [cap, ...] gets
 *  the rows every rank sent it, source rank by source rank, each source's in
 *  their order; rows past those zero.  cap = capacity, or P * R when
 *  capacity is 0 (what any split can send).  recv_counts (may be NULL) gets
 *  i32 [P]: the rows from each source.  Floating in is differentiable: the
 *  gradient is the reverse all_to_all (each member sends back what it
 *  received).  No host sync: the counts are exchanged with nt_all_gather
 *  and the gather index made on the device.  Errors at the call as the
 *  collectives' (NULL, devices, shapes, dtypes; send_counts not i32 [P];
 *  capacity < 0); when it runs (NT_ERANGE, poisoning the outputs): a
 *  negative count, a member's counts adding up to more than R ("rank i's
 *  send counts add up to S rows; its input has R"), more than cap rows for
 *  one rank. */
NT_API int nt_all_to_all(nt_comm *c, nt_tensor *const *in, nt_tensor *const *send_counts,
                         int64_t capacity, nt_tensor **out, nt_tensor **recv_counts);

/** The router: logits [T, E] (floating) scored in f32 (softmax over the
 *  experts, or sigmoid), the k best experts per token: *weights [T, k] f32
 *  (their scores, largest first, differentiable; not renormalized),
 *  *experts [T, k] i32 (ties: the lower expert index first, nt_topk's
 *  rule), *counts [E] i32 the assignments per expert, *perm [T k] i32 the
 *  stable permutation of the flat assignments t k + j sorted by expert
 *  (each expert's in token order).  1 <= k <= E.  Returns 0 or an error
 *  naming the argument (every output NULL). */
NT_API int nt_moe_route(nt_tensor *logits, int k, nt_moe_score score, nt_tensor **weights,
                        nt_tensor **experts, nt_tensor **counts, nt_tensor **perm);

/** Options of nt_moe_mlp. */
typedef struct nt_moe_opts {
    int k;              /* experts per token, 1 .. E */
    nt_moe_score score; /* the router's score function */
    int blocks;         /* token blocks over the group for the router's weight
                           gradient and the load statistics: a multiple of
                           the group's size with a power-of-two quotient
                           dividing each member's T; keep it fixed to get the
                           same bits at every size (e.g. 8 for sizes 1..8) */
    int64_t capacity;   /* rows a member's experts can receive; 0: T k P */
} nt_moe_opts;

/** An expert-parallel MoE MLP (docs/parallel.md) over c (the expert
 *  dimension): member i holds its tokens x[i] [T, D], the router's weight
 *  wg[i] [E, D] (the same on every member), and its E / P experts' weights
 *  w1[i] [E/P, D, H] and w2[i] [E/P, H, D] (member of rank r owns experts r
 *  E/P ..).  x and wg one dtype (the router's), w1 and w2 one dtype (the
 *  experts'), each f32 or bf16: the rows are cast to the experts' dtype
 *  when dispatched, and y is x's dtype (bf16 experts under an f32 router:
 *  mixed precision).  Autocast does not apply inside (the caller's dtypes
 *  are kept).  Per token: logits = x wg^T, the route
 *  of nt_moe_route, its rows dispatched (sorted by expert, nt_all_to_all),
 *  each expert's gelu(x_e w1[e]) w2[e] by nt_grouped_mm over the rows it
 *  received sorted by expert (in global token order), sent back, and
 *  combined y = sum over j = 0 .. k-1, in that order, of weights[:, j] times
 *  the j-th expert's output (f32, rounded once to x's dtype).  y[i] [T, D].
 *  aux[i] (may be NULL): f32 0-d, the load-balancing loss E sum_e f_e P_e
 *  (f_e the fraction of the group's T P k assignments to e, P_e the mean
 *  score of e), differentiable; counts[i] (may be NULL): i32 [E], tokens per
 *  expert over the group.  wg's gradient and P_e sum over the tokens in
 *  opts->blocks blocks combined in the rank tree's order, so every output,
 *  gradient and optimizer step is the same for every group size (and
 *  equals the dense loop over experts on one device).  Errors (naming the
 *  argument and sizes, nothing queued): E not divisible by the group's
 *  size, k outside 1 .. E, bad blocks, capacity, dtypes or shapes. */
NT_API int nt_moe_mlp(nt_comm *c, nt_tensor *const *x, nt_tensor *const *wg,
                      nt_tensor *const *w1, nt_tensor *const *w2, const nt_moe_opts *opts,
                      nt_tensor **y, nt_tensor **aux, nt_tensor **counts);

/* ------------------------------------------------------------------------ */
/* Captured programs (docs/graphs.md): run a training step once while the   */
/* runtime records it, then replay it with one call -- no dispatch, no      */
/* planning, no allocation per op -- with the same bits as running the step */
/* again op by op.                                                          */
/* ------------------------------------------------------------------------ */

/** A captured program: the kernels one run of a step ran, the memory plan
 *  of its intermediates, and what a replay must refresh or check. */
typedef struct nt_graph nt_graph;

/** Starts recording, on the calling thread's current stream, everything the
 *  thread enqueues until nt_graph_capture_end.  The ops run as usual (the
 *  capture is a real step; its results are the step's), but the stream
 *  holds them until the end, so the step is planned whole.  A sync point:
 *  waits for the stream's queued work first.  While capturing, a host read
 *  (nt_item, nt_to_host, nt_print, nt_sync, nt_stream_sync) is refused with
 *  NT_ESTATE naming the call, and so are ops on another stream, ops from
 *  another thread on this one, collectives and event waits: the capture
 *  then fails at its end.  NT_ESTATE if the thread is capturing already (no
 *  nesting).  What a replay refreshes and what it bakes in: docs/graphs.md.
 *  Thread-safe; the capture belongs to the calling thread. */
NT_API int nt_graph_capture_begin(void);
/** Like nt_graph_capture_begin, but records every stream the calling thread
 *  issues to, and the collectives between them: a data-parallel step over
 *  this process's devices (nt_ddp's shards, nt_ddp_reduce's collectives,
 *  clipping, the optimizers).  Each stretch of one stream's ops becomes a
 *  program of its own, each collective a step between them; nt_graph_replay
 *  (from any thread; the current stream does not matter) queues them again
 *  in the recorded order, each on the stream it was captured on, with the
 *  same bits as the step run op by op.  nt_graph_input, nt_graph_bind,
 *  nt_graph_capture_end, nt_graph_info_get (summed over the programs) and
 *  nt_graph_destroy work as for one stream.  A collective whose communicator
 *  spans processes is refused at its call (NT_ESTATE, naming it), and so are
 *  event waits; every refusal of nt_graph_capture_begin holds too.  See
 *  docs/graphs.md, "Several devices". */
NT_API int nt_graph_capture_begin_multi(void);
/** Names t an input of the capture in progress: a replay reads the tensor
 *  bound to `name` (nt_graph_bind; t itself until then), of t's dtype, shape
 *  and strides (an input the step never reads is allowed: binding it
 *  changes nothing).  name: 1..63 chars,
 *  unique in the capture.  NT_ESTATE if not capturing. */
NT_API int nt_graph_input(nt_tensor *t, const char *name);
/** Ends the capture: waits for the step to run, then compiles it: the
 *  program, its static memory plan (every intermediate's offset in one
 *  block, its size known now: nt_graph_info_get), the scalars refreshed at
 *  each replay.  Returns the graph (destroy with nt_graph_destroy), or NULL
 *  with the error set -- the first error of the step, or why it cannot be
 *  replayed (a host read, data from the host baked in, a collective...) --
 *  and no capture in progress either way. */
NT_API nt_graph *nt_graph_capture_end(void);
/** Binds t to input `name` for the following replays: before each, t's
 *  values are copied into the captured input (a static buffer: the program,
 *  and every view of the captured input, reads that), as one op of the
 *  replay.  Same dtype, shape, strides and device as the captured input (its
 *  storage offset may differ).  Binding the captured input itself stops the
 *  copies (it keeps the values last copied in).  The graph keeps a reference
 *  until another bind or its destruction.  NT_EINVAL (unknown name, NULL),
 *  NT_ESHAPE / NT_EDTYPE (a mismatch, naming both). */
NT_API int nt_graph_bind(nt_graph *g, const char *name, nt_tensor *t);
/** Runs the program again, queued on the calling thread's current stream,
 *  which must be the captured one.  Returns at once (like any op); errors
 *  raised by its kernels poison their outputs and are reported by the next
 *  sync.  Before queueing, it checks what the capture assumed: every tensor
 *  the program reads that the user owns is still alive, every bound input
 *  too, every parameter whose gradient the step accumulated has again no
 *  gradient (or again one), the optimizer state exists -- a mismatch is an
 *  error naming the tensor, with nothing queued.  It refreshes the
 *  optimizers' learning rates, step counts and bias corrections and the
 *  random seeds drawn from generators, as the same step run op by op would
 *  have them.  Replays of one graph from several threads serialise.
 *  Outputs (the tensors the step returned and the user kept) are rewritten
 *  by every replay: read them after each. */
NT_API int nt_graph_replay(nt_graph *g);
/** What a graph holds. */
typedef struct nt_graph_info {
    int64_t ops;           /* ops recorded (a replay runs every one of them) */
    int64_t kernels;       /* kernels a replay runs: fused groups and single ops */
    int64_t fused_ops;     /* of the ops, those inside fused groups */
    uint64_t plan_bytes;   /* the memory plan's block: its peak, known before any replay */
    uint64_t naive_bytes;  /* the planned intermediates' sizes summed (no reuse) */
    int64_t planned;       /* intermediates placed in the plan */
    int64_t external;      /* storages the program shares with the user's program */
    int64_t inputs;        /* named inputs */
    int64_t patches;       /* scalars recomputed at each replay */
    int64_t replays;       /* replays so far */
} nt_graph_info;
NT_API int nt_graph_info_get(nt_graph *g, nt_graph_info *out);
/** Waits for the graph's queued replays, then frees it (and its plan's
 *  memory).  NULL is ignored; a graph destroyed already sets NT_EINVAL
 *  naming the argument. */
NT_API void nt_graph_destroy(nt_graph *g);

/** A step as a function: reads inputs[0..nin), returns its results in
 *  outputs[0..nout) (tensors the caller will own), 0 or an error code. */
typedef int (*nt_graph_fn)(void *ctx, nt_tensor *const *inputs, int nin, nt_tensor **outputs,
                           int nout);
/** A bounded cache of captures of one step function, keyed on its inputs'
 *  dtypes, shapes, strides and device (and the calling thread's stream):
 *  nt_graph_cache_run replays the graph captured for those, or captures one
 *  (running the step for real) when there is none, evicting the least
 *  recently used beyond max_graphs (1..64) -- so a last, smaller batch of an
 *  epoch gets its own graph, and a program whose shapes never repeat
 *  recaptures at most max_graphs at a time, never without bound.  The
 *  inputs are the graphs' inputs "0".."nin-1".  NULL with the error set on
 *  bad arguments. */
typedef struct nt_graph_cache nt_graph_cache;
NT_API nt_graph_cache *nt_graph_cache_create(nt_graph_fn fn, void *ctx, int nin, int nout,
                                             int max_graphs);
/** Runs the step on inputs: a replay, or a capture.  outputs[i] get new
 *  references (the caller releases them) to the graph's outputs, which the
 *  next run with the same shapes rewrites.  0 or an error code (a capture
 *  that fails caches nothing; the step ran once, as it would eagerly). */
NT_API int nt_graph_cache_run(nt_graph_cache *c, nt_tensor *const *inputs, nt_tensor **outputs);
typedef struct nt_graph_cache_stats {
    int64_t captures, replays, evictions, graphs;
} nt_graph_cache_stats;
NT_API int nt_graph_cache_stats_get(nt_graph_cache *c, nt_graph_cache_stats *out);
/** Destroys every graph it holds (waiting for their replays).  NULL ignored. */
NT_API void nt_graph_cache_destroy(nt_graph_cache *c);

/* ------------------------------------------------------------------------ */
/* Call-site capture.  Each function X listed in include/ntensor/site.list  */
/* (every op, sync point and step) also exists as X_at taking the caller's   */
/* site first; in C, the macro X(...) calls X_at(NT_HERE, ...).  The X_at    */
/* declarations and the macros are generated into include/ntensor/site.h    */
/* (docs/architecture.md, section 1, says how to add a function).            */
/* ------------------------------------------------------------------------ */

/** Declares name##_at taking a site first: NT_DECL_AT(int, my_fn, int)
 *  gives `int my_fn_at(const nt_site *site, int)`. */
#define NT_DECL_AT(ret, name, ...) NT_API ret name##_at(const nt_site *site, __VA_ARGS__)

/* After every prototype of a listed function: the macros would rewrite one
 * that came after them (sim.h, below, declares none). */
#include "ntensor/site.h"

#ifdef __cplusplus
}
#endif

/* The simulated NeuronCore's instruction set and user tile kernels. */
#include "ntensor/sim.h"

#endif /* NTENSOR_H */
