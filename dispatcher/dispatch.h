/* dispatcher/dispatch.h - the one door from the public API to execution.
 *
 * A public op fills an nt__call (op, inputs, parameters), runs its shape
 * rule to fill the output dtype/shape, and calls nt__dispatch, which picks the
 * backend, allocates the outputs, lets autograd record a node, and enqueues
 * one record on the calling thread's current stream (or runs it at once in
 * deterministic mode).  Validation happens before anything is allocated or
 * enqueued, so a rejected call leaves no trace. */
#ifndef NT_DISPATCHER_DISPATCH_H
#define NT_DISPATCHER_DISPATCH_H

#include <stdatomic.h>
#include "core/internal.h"

typedef struct nt__call {
    const nt_site *site;
    const char *fn;  /* public name, for messages: "nt_add" */
    const char *names; /* the inputs' names, "a,b" (nt__call_begin's) */
    int op;
    int nin;
    nt_tensor *in[NT__MAX_IN];
    nt__params p;
    int nout;        /* 1 unless the op says otherwise */
    int offdev;      /* dispatch: the first operand of a dtype the device
                        lacks (an input's index, nin for an output), or -1 */
    nt_dtype odt[NT__MAX_OUT];
    int ondim[NT__MAX_OUT];
    int64_t oshape[NT__MAX_OUT][NT_MAX_DIMS];
    nt_tensor *dst;  /* in-place: out[0] is this existing tensor */
    int out_dev;     /* -1: outputs on the stream's device (every op but a
                        copy between devices, whose dst may be elsewhere) */
    nt_tensor *out[NT__MAX_OUT];
    const char *bwd_of; /* set by autograd for backward ops */
    double flops;    /* estimate, for NT_MIN_SIM_FLOPS */
    bool no_grad;    /* never record a graph node (internal helpers) */
    nt_tensor *tmp[NT__MAX_IN]; /* temporaries (amp casts, alias copies) released
                                   when the call ends */
} nt__call;

/* NT_EINVAL: fn's argument `arg` is on device tdev, its stream on sdev. */
int nt__device_mismatch(const nt_site *site, const char *fn, const char *arg, int tdev,
                        int sdev);
/* Ends a call that failed before nt__dispatch: releases temporaries. */
nt_tensor *nt__call_fail(nt__call *c);
/* Finishes a view: autograd records it, the scope adopts it. */
nt_tensor *nt__dispatch_view(nt__call *c, nt_tensor *v);

/* Starts a call: site, name, op, inputs (checked: NULL keeps the first
 * error, released handles are NT_ERELEASED).  `names` are the argument names
 * for messages ("a,b").  Optional inputs (NULL allowed) are listed with a
 * leading '?' in names ("x,?w,?b").  Returns false on a bad argument. */
bool nt__call_begin(nt__call *c, const nt_site *site, const char *fn, int op, int nin,
                    nt_tensor *const *in, const char *names);

/* Enqueues the call.  Returns out[0] as a new reference (adopted by the open
 * scope), or for in-place calls c->dst without a new reference; NULL with
 * the error set on failure (nothing enqueued). */
nt_tensor *nt__dispatch(nt__call *c);

/* A composite (an API function built of other ops) given fp8 argument t
 * where it has no fp8 path: NT_ENOTSUP naming fn and arg, as the
 * dispatcher refuses a table op's fp8 operand (no silent widening to f32;
 * docs/ops.md "fp8").  Returns true if t is not fp8. */
bool nt__no_fp8(const nt_site *site, const char *fn, const char *arg, const nt_tensor *t);

/* The one way a record joins a stream, for every op (nt__dispatch's, and
 * each member of a collective, dist/comm.c), so ordering, the storages'
 * last reader and writer, the stats and the NT_TRACE event are the same for
 * all.  r holds its inputs r->in[0..nin) (NULL: an absent optional input)
 * and outputs r->out[0..nout), the record's references on them taken; with
 * NT_RECF_INPLACE, r->out[0] is the tensor written in place.  Adds r's
 * waits on other streams (each writer once), marks storages used across
 * streams, draws r's seq on *s (if nt_stream_destroy sealed *s meanwhile,
 * on the default stream, and *s is set to it before r can run), then
 * queues r, or runs it here when `run_here` (deterministic mode) once its
 * waits are over.  Returns r's seq; cannot fail.  r may be recycled once
 * this returns. */
uint64_t nt__rec_enqueue(nt__rec *r, nt_stream **s, bool run_here);

/* A fresh tensor on device dev that only ops queued after this on the
 * current stream will write (nt_cat's output, nt_backward's slice-gradient
 * buffer): like an op's output, its capacity may be lent by what the
 * stream's queued ops are about to give back (core/arena.c), since its
 * block is taken when the first of those ops runs.  NULL + NT_ENOMEM. */
nt_tensor *nt__empty_for_stream(const nt_site *site, const char *fn, nt_dtype dt, int ndim,
                                const int64_t *shape, int dev);

/* While autograd runs a node's backward: that op's API name, recorded on
 * every op the backward issues (error messages say "in the backward of"). */
extern _Thread_local const char *nt__tls_bwd_of NT_TLS_HOT;

/* The calls the dispatcher makes into the layers above it (autograd, amp),
 * through this table: the top-level registration (init/init.c) fills it at
 * the first nt_init, assigning the real functions, so each entry's type is
 * checked against its prototype.  NULL: that module is not registered. */
typedef struct nt__dispatch_hooks {
    int (*ag_on_dispatch)(nt__call *c); /* autograd: record a node (not for no_grad calls) */
    bool (*ag_grad_mode)(void);         /* autograd: grad enabled? */
    /* autograd: record cat as one node with n inputs */
    int (*ag_on_cat)(const nt_site *site, nt_tensor *const *ts, int n, int dim, nt_tensor *out);
    int (*amp_on_call)(nt__call *c);    /* amp: autocast the inputs */
    nt_dtype (*amp_active)(void);       /* amp: the autocast dtype, or NT_DTYPE_COUNT */
    void (*custom_shutdown)(void);      /* autograd: drop the registered user ops */
    /* amp: makes dt (NT_DTYPE_COUNT: no autocast) the thread's autocast
     * state until the matching amp_leave (nt_checkpoint's recompute runs
     * under the forward's state); 0 or an error */
    int (*amp_enter)(nt_dtype dt);
    void (*amp_leave)(void);
    /* amp: t cast to dt as autocast casts a parameter (a cast an optimizer
     * made ahead, when valid, else a queued CAST); NULL with the error set */
    nt_tensor *(*amp_cast)(const nt_site *site, const char *fn, nt_tensor *t, nt_dtype dt);
    /* amp: under an fp8 autocast region, nt_matmul(a, b) as an fp8 matmul
     * (*handled set); else *handled stays false */
    nt_tensor *(*amp_fp8_matmul)(const nt_site *site, nt_tensor *a, nt_tensor *b, bool *handled);
} nt__dispatch_hooks;
extern nt__dispatch_hooks nt__dhooks;
/* Counts successful nt_init calls (nt_default_generator resets a thread's
 * default generator to (NT_SEED, 0) once per nt_init). */
extern volatile AO_t nt__init_epoch;

/* A random creation op's seed: the next draw of g (NULL: the thread's
 * default generator), h(seed, offset), g held for the caller.  Inside a
 * capture, the next op `op` enqueued is patched to draw at each replay (op
 * < 0, an op computed on the host, is refused there).  NULL with the error
 * set (a dead generator, another thread's call on it).  Then
 * nt__gen_done(g, taken): releases g and, if the draw was used, advances
 * it by one. */
/* A creation op's shape: 0..NT_MAX_DIMS dims, shape non-NULL when ndim >
 * 0, every size >= 0 and the count within nt__shape_ok's bound (NT_EINVAL
 * naming fn and the argument). */
bool nt__check_shape(const nt_site *site, const char *fn, int ndim, const int64_t *shape);

nt_generator *nt__gen_take(const nt_site *site, const char *fn, nt_generator *g, int op,
                           uint64_t *seed);
void nt__gen_done(nt_generator *g, bool taken);

/* nt_init / nt_shutdown (init/init.c) call these: the environment, the
 * arena, the backends, fusion and the streams.  register_modules runs
 * once, under the init lock, before anything else starts. */
int nt__runtime_init(void (*register_modules)(void));
void nt__runtime_shutdown(void);

/* A view of t (same storage) with new metadata; records no op. */
/* Strides st that view t (neither contiguous nor empty) as shape sh, when
 * its strides allow (dispatcher/api_view.c); false: reshaping copies. */
bool nt__view_strides(const nt_tensor *t, int ndim, const int64_t *sh, int64_t *st);
nt_tensor *nt__make_view(nt_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                         int64_t offset, const nt_site *site);

/* Internal op entry points used by composites and autograd (no site macros). */
nt_tensor *nt__unary(const nt_site *site, const char *fn, int op, nt_tensor *t);
nt_tensor *nt__binary(const nt_site *site, const char *fn, int op, nt_tensor *a, nt_tensor *b);
nt_tensor *nt__scalar(const nt_site *site, const char *fn, int op, nt_tensor *t, double s0,
                      double s1);
nt_tensor *nt__reduce(const nt_site *site, const char *fn, int op, nt_tensor *t, int dim,
                      bool keepdim);
nt_tensor *nt__copy_to(const nt_site *site, const char *fn, nt_tensor *src, nt_dtype dt);
/* nt_matmul_fp8 with the product of its scales made already: s = round_f32(
 * scale_a * scale_b), f32 [1] or [] (amp/fp8.c makes every slot's at once);
 * the same bits as nt_matmul_fp8(a, b, scale_a, scale_b, out_dtype). */
nt_tensor *nt__matmul_fp8_prod(const nt_site *site, nt_tensor *a, nt_tensor *b, nt_tensor *s,
                               nt_dtype out_dtype);
/* linrec(a, b) over dim (dispatcher/api_reduce.c): y_j = a_j * y_(j-1) +
 * b_j from -0, floating a and b of one shape (cumprod's backward). */
nt_tensor *nt__linrec(const nt_site *site, nt_tensor *a, nt_tensor *b, int dim);
/* dst = src + s written into dst (nt_copy_into with the add in the same
 * op: autograd's slice gradients, tape.c); 0 or the error code. */
int nt__add_scalar_into(const nt_site *site, const char *fn, nt_tensor *dst, nt_tensor *src,
                        double s);
/* nt_copy_into that records no autograd node, whatever dst and src carry
 * (nt__mem_refill: a refill restores the bits a node saved, it is not a
 * write the graph should see); 0 or the error code. */
int nt__copy_into_nograd(const nt_site *site, const char *fn, nt_tensor *dst, nt_tensor *src);
/* A big storage's device memory given back while its handles stay, and
 * filled again with the same bits (dispatcher/resident.c; the storage's
 * side is core/internal.h, nt__storage_release_begin).  Errors name fn.
 * nt__mem_release(t): queues the release of t's storage's block on the
 * current stream after every op queued so far that reads or writes it
 * (on any stream); t's bytes leave nt_device_bytes_live at this call.
 * From then on any op, sync or collective that reads a view of that
 * storage is refused (NT_ESTATE naming the call, the argument and the
 * tensor) until the refill.  A small storage (<= 3968 bytes) is refused
 * (NT_ENOTSUP) and stays; so is one made during a capture, and the call is
 * refused while the thread or stream captures.
 * nt__mem_refill(t, src): t, the whole storage as one contiguous view
 * (offset 0, its bytes), is filled from src (same dtype and shape, any
 * storage): the capacity is reserved again here -- NT_ENOMEM naming the
 * bytes leaves t released and nothing queued -- and a copy queued on the
 * current stream writes it, taking a block when it runs.  The storage's
 * version is put back to what it was before the release, so the views
 * autograd saved of it pass their version check.  Neither call records an
 * autograd node.  Thread-safety: as any op on t; the release and the
 * refill of one storage are the caller's to order (one thread, or its own
 * lock). */
int nt__mem_release(const nt_site *site, const char *fn, nt_tensor *t);
int nt__mem_refill(const nt_site *site, const char *fn, nt_tensor *t, nt_tensor *src);
/* The losses' shared pieces (dispatcher/api_nn.c): labels y [M] checked
 * against [0, C) when they run (the returned labels carry the check's
 * error), and [N, C, d1, ...] viewed as [N * d1 * ..., C] rows. */
nt_tensor *nt__labels_checked(const nt_site *site, const char *fn, nt_tensor *y, int64_t C);
nt_tensor *nt__classes_last(const nt_site *site, nt_tensor *t);
/* The DROPOUT op on x (any training mode): nt_dropout's, and its backward's
 * on g with the same p and seed. */
nt_tensor *nt__dropout(const nt_site *site, const char *fn, nt_tensor *x, double p, uint64_t seed);
/* The ROPE op (dispatcher/api_rope.c) on x made contiguous, arguments
 * already checked: flags NT__ROPE_* (core/rope.h), the offset tensor ot or,
 * if NULL, off; nt_rope's, and its backward's with NT__ROPE_INVERSE
 * toggled. */
nt_tensor *nt__rope(const nt_site *site, const char *fn, nt_tensor *x, int64_t dims,
                    int flags, double base, double scale, int64_t off, nt_tensor *ot);

/* batch_norm's pieces (dispatcher/api_norm.c), shared with nt_ddp_batch_norm:
 * the argument checks of nt_batch_norm (false with the error set, naming
 * fn); the running update
 * r = r * (1 - momentum) + stat * momentum in place (0 or the error); and
 * training batch norm of x without running statistics, its mean and ssd
 * returned in *mean, *ssd (the caller's scope holds them). */
bool nt__bn_check(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *rm,
                  nt_tensor *rv, nt_tensor *w, nt_tensor *b, bool training, double momentum,
                  double eps);
int nt__bn_update(const nt_site *site, const char *fn, nt_tensor *r, nt_tensor *stat,
                  double momentum);
/* The grouped matmul of mixture-of-experts layers (dispatcher/api_moe.c,
 * core/optable.h): grouped_mm(x, w, counts) (tr: w[e] read transposed) and
 * grouped_mm_wgrad(x, gy, counts) -> [E, x's cols, gy's cols]; autograd
 * records a node unless no_grad. */
nt_tensor *nt__grouped_mm(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                          nt_tensor *counts, bool tr, bool no_grad);
nt_tensor *nt__grouped_mm_wgrad(const nt_site *site, const char *fn, nt_tensor *x,
                                nt_tensor *gy, nt_tensor *counts, bool no_grad);
/* Convolutions (dispatcher/api_conv.c, core/conv.h): the kernel ops
 * conv_gemm and conv_wgrad, and the gradients of conv2d / conv_transpose2d
 * (op) for autograd: gin[i] set for each live input (x, w, b) from g, the
 * saved x and w and the node's parameters.  0 or an error code. */
nt_tensor *nt__conv_gemm(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                         bool flip, const int64_t s[2], const int64_t lo[2], const int64_t d[2],
                         const int64_t u[2], int64_t G, int64_t OH, int64_t OW);
nt_tensor *nt__conv_wgrad(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *gy,
                          const int64_t s[2], const int64_t lo[2], const int64_t d[2], int64_t G,
                          int64_t kh, int64_t kw);
int nt__conv_grads(const nt_site *site, int op, const nt__params *p, nt_tensor *g, nt_tensor *x,
                   nt_tensor *w, const bool live[3], nt_tensor **gin);
nt_tensor *nt__bn_shard(const nt_site *site, const char *fn, nt_tensor *x, nt_tensor *w,
                        nt_tensor *b, double eps, nt_tensor **mean, nt_tensor **ssd);
/* The gradients of batch_norm_fwd for autograd: one batch_norm_bwd of g,
 * the saved x and w and the forward's stats [2, C]; gin[i] set for each
 * live input (x, w, b).  0 or an error code. */
int nt__bn_grads(const nt_site *site, double eps, nt_tensor *g, nt_tensor *x, nt_tensor *w,
                 nt_tensor *stats, const bool live[3], nt_tensor **gin);
/* Gradient clipping's norms (autograd/clip.c): one grad_norms of the k
 * (1..4) f32 tensors g[0..k) on the current device -> [k] f32, y[j] the
 * bits of nt_norm(g[j], 2) over all of g[j].  NULL with the error set. */
nt_tensor *nt__grad_norms(const nt_site *site, const char *fn, nt_tensor *const *g, int k);
/* max_pool2d_fwd's gradient: one max_pool2d_bwd of g (made contiguous
 * f32) and the saved positions idx, p the forward's parameters, dx of x's
 * shape (ndim, xshape).  NULL with the error set. */
nt_tensor *nt__max_pool2d_grad(const nt_site *site, nt_tensor *g, nt_tensor *idx,
                               const nt__params *p, int ndim, const int64_t *xshape);
/* Tests: nonzero makes nt_max_pool2d take its composite of ops instead of
 * the max_pool2d_fwd kernel (dispatcher/api_pool.c), to compare the two. */
extern atomic_int nt__pool_composed;

#endif
