/* autograd/optim.h - the optimizer object, for the optimizers
 * (autograd/optim.c) and the checkpoints that save and restore its state
 * (io/checkpoint.c).  Not installed.
 *
 * Concurrency: each optimizer has a mutex; step, zero_grad, set_lr,
 * set_master_weights, nt_save and nt_load on one optimizer take it. */
#ifndef NT_AUTOGRAD_OPTIM_H
#define NT_AUTOGRAD_OPTIM_H

#include "autograd/autograd.h"
#include "core/handle.h"

#define OPT_MAGIC 0x4f50544du /* "OPTM" */

typedef enum { KIND_SGD = 1, KIND_ADAMW = 2 } opt_kind;

/* The most steps an optimizer counts (2^53: every count up to it is exact
 * as the double the bias corrections use).  A step at the bound is
 * NT_ESTATE, and nt_load refuses a checkpoint whose count is past it, so
 * the counts never overflow. */
#define NT__OPTIM_MAX_STEPS ((int64_t)1 << 53)

/* Per parameter.  `s0` is SGD's momentum buffer or Adam's exp_avg, `s1`
 * Adam's exp_avg_sq; both are made at the parameter's first update, like
 * PyTorch's lazily created state, in the working dtype (the parameter's, or
 * f32 with master weights). */
typedef struct {
    nt_tensor *p;      /* the parameter (a reference of ours) */
    nt_tensor *s0, *s1;
    nt_tensor *master; /* f32 copy of a bf16/f16 parameter, or NULL */
    int64_t steps;     /* updates this parameter received */
    struct nt_optim *o; /* its optimizer (a captured step's scalars ask it) */
} slot;

struct nt_optim {
    NT__HOBJ_HEAD; /* core/handle.h: its memory outlives it */
    opt_kind kind;
    int n;
    slot *slots;
    double lr, momentum, weight_decay, beta1, beta2, eps;
    bool nesterov;
    bool master;       /* keep f32 masters for low-precision params */
    int64_t steps;     /* nt_optim_step calls that succeeded */
    GMutex lock;
    volatile AO_t refs; /* its own and captured programs' (fusion/graph.h) */
};

static inline bool nt__optim_low_precision(nt_tensor *t)
{
    return t->dtype == NT_BF16 || t->dtype == NT_F16;
}

/* Releases *t (if any) and clears it. */
static inline void nt__optim_drop(nt_tensor **t)
{
    if (*t) {
        nt_release(*t);
        *t = NULL;
    }
}

/* True if o is a live optimizer (and the runtime is up); else false with
 * NT_EINVAL set, naming fn. */
bool nt__optim_ok(nt_optim *o, const char *fn);

#endif
