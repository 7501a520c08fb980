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

typedef enum {
    KIND_SGD = 1,
    KIND_ADAMW = 2,
    KIND_ADAM = 3,
    KIND_RMSPROP = 4,
    KIND_ADAGRAD = 5,
    KIND_LION = 6,
} opt_kind;
#define NT__OPTIM_KIND_MAX 6

/* Optimizer-wide flags (the checkpoint's optimizer record keeps them in
 * bits 0, 2 and 3; bit 1 is the master-weight setting). */
enum { OPTF_NESTEROV = 1, OPTF_AMSGRAD = 4, OPTF_CENTERED = 8 };

/* The most steps an optimizer counts (2^53: every count up to it is exact
 * as the double the bias corrections use).  A step at the bound is
 * NT_ESTATE, and nt_load refuses a checkpoint whose count is past it, so
 * the counts never overflow. */
#define NT__OPTIM_MAX_STEPS ((int64_t)1 << 53)

/* The state tensors of a parameter (each made at its first update, like
 * PyTorch's lazily created state, in the working dtype):
 *   SGD      s0 momentum_buffer
 *   AdamW    s0 exp_avg, s1 exp_avg_sq, s2 max_exp_avg_sq (amsgrad)
 *   Adam     the same
 *   RMSprop  s0 square_avg, s1 momentum_buffer (momentum > 0),
 *            s2 grad_avg (centered)
 *   Adagrad  s0 sum
 *   Lion     s0 exp_avg */
typedef struct {
    nt_tensor *p;      /* the parameter (a reference of ours) */
    nt_tensor *s0, *s1, *s2;
    nt_tensor *master; /* f32 copy of a bf16/f16 parameter, or NULL */
    int64_t steps;     /* updates this parameter received */
    int g;             /* its parameter group */
    struct nt_optim *o; /* its optimizer (a captured step's scalars ask it) */
} slot;

/* A parameter group: the hyper-parameters of the parameters
 * slots[first .. first + n) (groups are contiguous, in the order they were
 * added).  initial_lr is the lr the group was made with (the base lr the
 * schedulers scale, PyTorch's group['initial_lr']). */
typedef struct {
    double lr, initial_lr, momentum, weight_decay, beta1, beta2, eps;
    double alpha, lr_decay, init_acc; /* RMSprop's alpha; Adagrad's */
    int first, n;
} opt_group;

struct nt_optim {
    NT__HOBJ_HEAD; /* core/handle.h: its memory outlives it */
    opt_kind kind;
    int n;
    slot **slots;      /* each its own allocation: captured programs point at them */
    int ngroups;
    opt_group *groups;
    uint32_t flags;    /* OPTF_* */
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

/* Keep o's memory (not its life) until the matching release: the
 * schedulers hold it, so a destroyed optimizer they point at is reported,
 * never reused. */
void nt__optim_retain(nt_optim *o);
void nt__optim_release(nt_optim *o);

#endif
