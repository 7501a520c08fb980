/* autograd/optim.c - SGD, AdamW, Adam, RMSprop, Adagrad and Lion, with
 * parameter groups.  Checkpoints of parameters and optimizer state are
 * io/checkpoint.c's (format: docs/checkpoint-format.md); the learning-rate
 * schedulers are autograd/sched.c's.
 *
 * One parameter's update is a chain of elementwise ops on that parameter's
 * tensors (param, grad, state) ending in in-place writes, issued inside a
 * scope of its own with graph recording off.  Every intermediate is dead as
 * soon as the chain is queued, so the fusion engine can turn the whole
 * update into one kernel that reads param, grad and state once and writes
 * param and state once.  Scalars that depend on the step count (Adam's bias
 * corrections, Adagrad's decayed lr) are computed on the host in double: a
 * step never syncs.
 *
 * Semantics are PyTorch 1.13's torch.optim.SGD (dampening 0), AdamW, Adam,
 * RMSprop and Adagrad (their single-tensor forms, the default on the CPU)
 * and the Lion paper's update, with the per-parameter step count of
 * PyTorch: a parameter that has no .grad at a step is skipped and its count
 * does not move.  The order of each update's operations is in the comment
 * above its function (and include/ntensor.h, docs/optimizers.md).
 *
 * Concurrency: each optimizer has a mutex; step, zero_grad, set_lr,
 * add_group, set_master_weights, nt_save and nt_load on one optimizer
 * serialise.  The parameters are ordinary tensors: a thread that writes
 * them while another steps the optimizer needs its own ordering (events). */
#include "autograd/optim.h"
#include "debug/debug.h"
#include "fusion/graph.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The tensor an update reads and writes: the master copy if there is one. */
static nt_tensor *working(slot *s) { return s->master ? s->master : s->p; }

/* site: the caller's, for the functions that have an _at form (NULL: the
 * return address stands in). */
static bool opt_ok_at(const nt_site *site, nt_optim *o, const char *fn)
{
    if (!nt__ensure_init())
        return false;
    return nt__hobj_check(o, OPT_MAGIC, site, fn, "opt", "optimizer") == 0;
}

bool nt__optim_ok(nt_optim *o, const char *fn) { return opt_ok_at(NULL, o, fn); }

static bool finite_ge0(double v) { return isfinite(v) && v >= 0; }

/* One parameter of the list both constructors take (nt__check_list has
 * checked it is a live tensor). */
static bool check_param(const char *fn, const char *arg, nt_tensor *const *params, int i)
{
    nt_tensor *t = params[i];
    if (!nt__dtype_is_float((nt_dtype)t->dtype)) {
        nt__err(NULL, NT_EDTYPE, fn, "argument '%s' is %s; parameters must be floating", arg,
                nt_dtype_name((nt_dtype)t->dtype));
        return false;
    }
    if (t->ag && t->ag->grad_fn) {
        nt__err(NULL, NT_EINVAL, fn,
                "argument '%s' was computed by an op that records a graph; only leaf "
                "tensors can be optimized (use nt_detach)", arg);
        return false;
    }
    if (t->expanded) {
        nt__err(NULL, NT_EINVAL, fn,
                "argument '%s' is an expanded view; an optimizer writes its parameters in "
                "place", arg);
        return false;
    }
    for (int j = 0; j < i; j++)
        if (params[j] == t) {
            nt__err(NULL, NT_EINVAL, fn, "argument 'params' lists the same tensor at %d "
                    "and %d", j, i);
            return false;
        }
    return true;
}

static bool check_params(const char *fn, nt_tensor *const *params, int n)
{
    return nt__check_list(fn, params, n, "parameter", check_param);
}

static const char *kind_fn(opt_kind k)
{
    static const char *const names[] = {"", "nt_optim_sgd", "nt_optim_adamw", "nt_optim_adam",
                                        "nt_optim_rmsprop", "nt_optim_adagrad", "nt_optim_lion"};
    return names[k];
}

static void slots_free(slot **slots, int n)
{
    for (int i = 0; slots && i < n; i++)
        free(slots[i]);
    free(slots);
}

/* Appends params as a new group with hyper-parameters *hp (lr, momentum,
 * ... ; first and n are set here).  The caller holds the lock (or owns o). */
static int add_group_locked(nt_optim *o, nt_tensor *const *params, int n, const opt_group *hp,
                            const char *fn)
{
    slot **slots = realloc(o->slots, sizeof *slots * (size_t)(o->n + n));
    if (slots)
        o->slots = slots;
    opt_group *groups = realloc(o->groups, sizeof *groups * (size_t)(o->ngroups + 1));
    if (groups)
        o->groups = groups;
    if (!slots || !groups)
        return nt__err_hostmem(NULL, fn, "the parameter group");
    for (int i = 0; i < n; i++) {
        slot *s = calloc(1, sizeof *s);
        if (!s) {
            for (int j = 0; j < i; j++) {
                nt_release(o->slots[o->n + j]->p);
                free(o->slots[o->n + j]);
            }
            return nt__err_hostmem(NULL, fn, "the parameter group");
        }
        s->p = nt_retain(params[i]);
        if (s->p->ag) /* (a capture makes its casts ahead: ampcap_make) */
            s->p->ag->amp_opt = true;
        s->o = o;
        s->g = o->ngroups;
        o->slots[o->n + i] = s;
    }
    opt_group *g = &o->groups[o->ngroups++];
    *g = *hp;
    g->initial_lr = hp->lr;
    g->first = o->n;
    g->n = n;
    o->n += n;
    return 0;
}

static nt_optim *opt_new(opt_kind kind, nt_tensor *const *params, int n, const opt_group *hp,
                         uint32_t flags)
{
    const char *fn = kind_fn(kind);
    nt_optim *o = nt__hobj_new(sizeof *o, OPT_MAGIC);
    if (!o) {
        nt__err_hostmem(NULL, fn, "the optimizer");
        return NULL;
    }
    o->refs = 1;
    o->kind = kind;
    o->flags = flags;
    if (add_group_locked(o, params, n, hp, fn) != 0) {
        free(o->slots);
        free(o->groups);
        nt__hobj_free(o);
        return NULL;
    }
    g_mutex_init(&o->lock);
    return o;
}

/* Checks value v of argument `arg` of fn: finite and >= lo (lo_open: > lo),
 * and < hi when hi is not NAN (betas), else sets NT_EINVAL naming it. */
static bool arg_ok(const char *fn, const char *arg, double v, double lo, bool lo_open, double hi)
{
    bool ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (isnan(hi) || v < hi);
    if (!ok) {
        if (isnan(hi))
            nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %g; expected a finite value %s %g", arg,
                    v, lo_open ? ">" : ">=", lo);
        else
            nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %g; expected a value in [%g, %g)", arg,
                    v, lo, hi);
    }
    return ok;
}

#define NOHI NAN

static int make_masters(nt_optim *o, int from, const char *fn);

static bool betas_ok(const char *fn, double beta1, double beta2)
{
    const char *arg = !(beta1 >= 0 && beta1 < 1)   ? "beta1"
                      : !(beta2 >= 0 && beta2 < 1) ? "beta2"
                                                   : NULL;
    if (arg)
        nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %g; betas must be in [0, 1)", arg,
                arg[4] == '1' ? beta1 : beta2);
    return !arg;
}

NT_API nt_optim *nt_optim_sgd(nt_tensor *const *params, int n, double lr, double momentum,
                              double weight_decay, bool nesterov)
{
    const char *fn = "nt_optim_sgd";
    if (!nt__ensure_init() || !check_params(fn, params, n))
        return NULL;
    if (!arg_ok(fn, "lr", lr, 0, false, NOHI) ||
        !arg_ok(fn, "momentum", momentum, 0, false, NOHI) ||
        !arg_ok(fn, "weight_decay", weight_decay, 0, false, NOHI))
        return NULL;
    if (nesterov && momentum <= 0) {
        nt__err(NULL, NT_EINVAL, fn, "nesterov momentum needs momentum > 0 (got %g)", momentum);
        return NULL;
    }
    opt_group hp = {.lr = lr, .momentum = momentum, .weight_decay = weight_decay};
    return opt_new(KIND_SGD, params, n, &hp, nesterov ? OPTF_NESTEROV : 0);
}

/* AdamW and Adam: the same arguments. */
static nt_optim *adam_new(opt_kind kind, nt_tensor *const *params, int n, double lr,
                          double beta1, double beta2, double eps, double weight_decay, int flags)
{
    const char *fn = kind_fn(kind);
    if (!nt__ensure_init() || !check_params(fn, params, n))
        return NULL;
    if (!arg_ok(fn, "lr", lr, 0, false, NOHI) || !betas_ok(fn, beta1, beta2) ||
        !arg_ok(fn, "eps", eps, 0, false, NOHI) ||
        !arg_ok(fn, "weight_decay", weight_decay, 0, false, NOHI))
        return NULL;
    if (flags & ~NT_OPTIM_AMSGRAD) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'flags' is 0x%x; expected 0 or NT_OPTIM_AMSGRAD",
                (unsigned)flags);
        return NULL;
    }
    opt_group hp = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                    .weight_decay = weight_decay};
    return opt_new(kind, params, n, &hp, flags & NT_OPTIM_AMSGRAD ? OPTF_AMSGRAD : 0);
}

NT_API nt_optim *nt_optim_adamw(nt_tensor *const *params, int n, double lr, double beta1,
                                double beta2, double eps, double weight_decay)
{
    return adam_new(KIND_ADAMW, params, n, lr, beta1, beta2, eps, weight_decay, 0);
}

NT_API nt_optim *nt_optim_adamw_ex(nt_tensor *const *params, int n, double lr, double beta1,
                                   double beta2, double eps, double weight_decay, int flags)
{
    return adam_new(KIND_ADAMW, params, n, lr, beta1, beta2, eps, weight_decay, flags);
}

NT_API nt_optim *nt_optim_adam(nt_tensor *const *params, int n, double lr, double beta1,
                               double beta2, double eps, double weight_decay, int flags)
{
    return adam_new(KIND_ADAM, params, n, lr, beta1, beta2, eps, weight_decay, flags);
}

NT_API nt_optim *nt_optim_rmsprop(nt_tensor *const *params, int n, double lr, double alpha,
                                  double eps, double weight_decay, double momentum,
                                  bool centered)
{
    const char *fn = "nt_optim_rmsprop";
    if (!nt__ensure_init() || !check_params(fn, params, n))
        return NULL;
    if (!arg_ok(fn, "lr", lr, 0, false, NOHI) || !arg_ok(fn, "alpha", alpha, 0, false, NOHI) ||
        !arg_ok(fn, "eps", eps, 0, false, NOHI) ||
        !arg_ok(fn, "weight_decay", weight_decay, 0, false, NOHI) ||
        !arg_ok(fn, "momentum", momentum, 0, false, NOHI))
        return NULL;
    opt_group hp = {.lr = lr, .alpha = alpha, .eps = eps, .weight_decay = weight_decay,
                    .momentum = momentum};
    return opt_new(KIND_RMSPROP, params, n, &hp, centered ? OPTF_CENTERED : 0);
}

NT_API nt_optim *nt_optim_adagrad(nt_tensor *const *params, int n, double lr, double lr_decay,
                                  double weight_decay, double initial_accumulator_value,
                                  double eps)
{
    const char *fn = "nt_optim_adagrad";
    if (!nt__ensure_init() || !check_params(fn, params, n))
        return NULL;
    if (!arg_ok(fn, "lr", lr, 0, false, NOHI) ||
        !arg_ok(fn, "lr_decay", lr_decay, 0, false, NOHI) ||
        !arg_ok(fn, "weight_decay", weight_decay, 0, false, NOHI) ||
        !arg_ok(fn, "initial_accumulator_value", initial_accumulator_value, 0, false, NOHI) ||
        !arg_ok(fn, "eps", eps, 0, false, NOHI))
        return NULL;
    opt_group hp = {.lr = lr, .lr_decay = lr_decay, .weight_decay = weight_decay,
                    .init_acc = initial_accumulator_value, .eps = eps};
    return opt_new(KIND_ADAGRAD, params, n, &hp, 0);
}

NT_API nt_optim *nt_optim_lion(nt_tensor *const *params, int n, double lr, double beta1,
                               double beta2, double weight_decay)
{
    const char *fn = "nt_optim_lion";
    if (!nt__ensure_init() || !check_params(fn, params, n))
        return NULL;
    if (!arg_ok(fn, "lr", lr, 0, false, NOHI) || !betas_ok(fn, beta1, beta2) ||
        !arg_ok(fn, "weight_decay", weight_decay, 0, false, NOHI))
        return NULL;
    opt_group hp = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .weight_decay = weight_decay};
    return opt_new(KIND_LION, params, n, &hp, 0);
}

/* add_group_ex's optional hyper-parameters: v (NaN: group 0's) for a kind
 * that uses it; else it must be NaN.  0 or NT_EINVAL naming it. */
static int group_opt(nt_optim *o, const char *fn, const char *arg, double v, bool used,
                     bool beta, double *out)
{
    if (isnan(v))
        return 0;
    if (!used)
        return nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %g; %s has no %s (pass NAN)",
                       arg, v, kind_fn(o->kind) + strlen("nt_optim_"), arg);
    if (beta ? !(v >= 0 && v < 1) : !(isfinite(v) && v >= 0))
        return nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %g; expected %s", arg, v,
                       beta ? "betas in [0, 1)" : "a finite value >= 0");
    *out = v;
    return 0;
}

static int add_group_impl(const char *fn, nt_optim *o, nt_tensor *const *params, int n,
                          double lr, double weight_decay, double beta1, double beta2,
                          double momentum)
{
    if (!nt__optim_ok(o, fn))
        return nt_last_error();
    if (!check_params(fn, params, n))
        return nt_last_error();
    if (!arg_ok(fn, "lr", lr, 0, false, NOHI) ||
        !arg_ok(fn, "weight_decay", weight_decay, 0, false, NOHI))
        return nt_last_error();
    g_mutex_lock(&o->lock);
    /* the other hyper-parameters are the first group's */
    opt_group hp = o->groups[0];
    hp.lr = lr;
    hp.weight_decay = weight_decay;
    bool betas = o->kind == KIND_ADAMW || o->kind == KIND_ADAM || o->kind == KIND_LION;
    bool mom = o->kind == KIND_SGD || o->kind == KIND_RMSPROP;
    int rc = group_opt(o, fn, "beta1", beta1, betas, true, &hp.beta1);
    if (!rc)
        rc = group_opt(o, fn, "beta2", beta2, betas, true, &hp.beta2);
    if (!rc)
        rc = group_opt(o, fn, "momentum", momentum, mom, false, &hp.momentum);
    if (!rc && (o->flags & OPTF_NESTEROV) && !(hp.momentum > 0))
        rc = nt__err(NULL, NT_EINVAL, fn, "argument 'momentum' is 0; nesterov momentum needs "
                     "momentum > 0");
    for (int i = 0; i < n && !rc; i++)
        for (int j = 0; j < o->n; j++)
            if (o->slots[j]->p == params[i]) {
                rc = nt__err(NULL, NT_EINVAL, fn,
                             "argument 'params[%d]' is already in group %d of the optimizer "
                             "(its parameter %d); groups may not overlap", i, o->slots[j]->g, j);
                break;
            }
    if (!rc && o->ngroups >= (1 << 20))
        rc = nt__err(NULL, NT_EINVAL, fn, "the optimizer has %d groups, the most it may have",
                     o->ngroups);
    if (!rc) {
        rc = add_group_locked(o, params, n, &hp, fn);
        if (!rc && o->master) /* the new group's masters, as for the others */
            rc = make_masters(o, o->n - n, fn);
    }
    int g = o->ngroups - 1;
    g_mutex_unlock(&o->lock);
    return rc ? rc : g;
}

NT_API int nt_optim_add_group_ex(nt_optim *o, nt_tensor *const *params, int n, double lr,
                                 double weight_decay, double beta1, double beta2,
                                 double momentum)
{
    return add_group_impl("nt_optim_add_group_ex", o, params, n, lr, weight_decay, beta1, beta2,
                          momentum);
}

NT_API int nt_optim_add_group(nt_optim *o, nt_tensor *const *params, int n, double lr,
                              double weight_decay)
{
    return add_group_impl("nt_optim_add_group", o, params, n, lr, weight_decay, NAN, NAN, NAN);
}

NT_API int nt_optim_ngroups(nt_optim *o)
{
    if (!nt__optim_ok(o, "nt_optim_ngroups"))
        return nt_last_error();
    g_mutex_lock(&o->lock);
    int g = o->ngroups;
    g_mutex_unlock(&o->lock);
    return g;
}

static bool group_ok(nt_optim *o, int g, const char *fn)
{
    if (g < 0 || g >= o->ngroups) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'group' is %d; the optimizer has groups 0..%d", g,
                o->ngroups - 1);
        return false;
    }
    return true;
}

NT_API int nt_optim_set_group_lr(nt_optim *o, int group, double lr)
{
    const char *fn = "nt_optim_set_group_lr";
    if (!nt__optim_ok(o, fn))
        return nt_last_error();
    if (!arg_ok(fn, "lr", lr, 0, false, NOHI))
        return nt_last_error();
    g_mutex_lock(&o->lock);
    int rc = group_ok(o, group, fn) ? 0 : nt_last_error();
    if (!rc)
        o->groups[group].lr = lr;
    g_mutex_unlock(&o->lock);
    return rc;
}

/* field: offsetof(opt_group, ...) of a double */
static double group_get(nt_optim *o, int group, size_t field, const char *fn)
{
    if (!nt__optim_ok(o, fn))
        return NAN;
    g_mutex_lock(&o->lock);
    double v = NAN;
    if (group_ok(o, group, fn))
        memcpy(&v, (const char *)&o->groups[group] + field, sizeof v);
    g_mutex_unlock(&o->lock);
    return v;
}

NT_API double nt_optim_get_group_lr(nt_optim *o, int group)
{
    return group_get(o, group, offsetof(opt_group, lr), "nt_optim_get_group_lr");
}

NT_API double nt_optim_get_group_initial_lr(nt_optim *o, int group)
{
    return group_get(o, group, offsetof(opt_group, initial_lr),
                     "nt_optim_get_group_initial_lr");
}

NT_API double nt_optim_get_group_beta1(nt_optim *o, int group)
{
    return group_get(o, group, offsetof(opt_group, beta1), "nt_optim_get_group_beta1");
}

NT_API double nt_optim_get_group_momentum(nt_optim *o, int group)
{
    return group_get(o, group, offsetof(opt_group, momentum), "nt_optim_get_group_momentum");
}

NT_API double nt_optim_get_group_weight_decay(nt_optim *o, int group)
{
    return group_get(o, group, offsetof(opt_group, weight_decay),
                     "nt_optim_get_group_weight_decay");
}

/* Moves a fresh op result out of the per-parameter scope into the
 * optimizer's ownership. */
static nt_tensor *own(nt_tensor *t) { return t ? nt_keep(t) : NULL; }

/* A new tensor with src's values (an op, never a view on src's storage). */
static nt_tensor *clone_as(const nt_site *site, const char *fn, nt_tensor *src, nt_dtype dt)
{
    return nt__copy_to(site, fn, src, src->dtype == dt ? (nt_dtype)-1 : dt);
}

/* ---------------- captured steps (fusion/graph.h) ----------------
 *
 * A captured step's scalars that change from step to step -- those that
 * depend on the learning rate or on the parameter's step count -- are
 * recomputed at every replay from the optimizer as it is then, by the same
 * expressions as below; a replay then advances the step counts as
 * nt_optim_step does. */
enum { ROLE_DECAY, ROLE_BC2, ROLE_STEP, ROLE_LR, ROLE_CLR };

static opt_group *group_of(slot *s) { return &s->o->groups[s->g]; }

/* The scalars of a parameter's update at step t (its count after the
 * increment): the same expressions at a step and at a replay. */
static double role_value(slot *s, int role, double t)
{
    opt_group *g = group_of(s);
    switch (role) {
    case ROLE_DECAY: return 1.0 - g->lr * g->weight_decay;
    case ROLE_BC2: return sqrt(1.0 - pow(g->beta2, t));
    case ROLE_STEP: return g->lr / (1.0 - pow(g->beta1, t));
    case ROLE_CLR: return g->lr / (1.0 + (t - 1.0) * g->lr_decay);
    default: return g->lr;
    }
}

static uint64_t scalar_at_replay(void *ctx, int role)
{
    slot *s = ctx;
    return nt__patch_f64(role_value(s, role, (double)(s->steps + 1)));
}

static void slot_stepped(void *ctx, int64_t arg)
{
    (void)arg;
    ((slot *)ctx)->steps++;
}
static void optim_stepped(void *ctx, int64_t arg)
{
    (void)arg;
    ((nt_optim *)ctx)->steps++;
}
/* A graph that refreshes an optimizer's scalars keeps its memory alive (the
 * patches read its slots); nt_optim_destroy frees it when the last goes. */
static void optim_retain(void *ctx) { AO_fetch_and_add1(&((nt_optim *)ctx)->refs); }
static void optim_free(nt_optim *o)
{
    slots_free(o->slots, o->n);
    free(o->groups);
    g_mutex_clear(&o->lock);
    nt__hobj_free(o);
}
static void optim_release(void *ctx)
{
    nt_optim *o = ctx;
    if (nt__ref_drop(&o->refs, 1))
        optim_free(o);
}
void nt__optim_retain(nt_optim *o) { optim_retain(o); }
void nt__optim_release(nt_optim *o) { optim_release(o); }
static void optim_retain_slot(void *ctx) { optim_retain(((slot *)ctx)->o); }
static void optim_release_slot(void *ctx) { optim_release(((slot *)ctx)->o); }

static void patch_next(slot *s, int role, int op)
{
    if (nt__capturing())
        nt__capture_patch_next(scalar_at_replay, s, role, NT__PATCH_F0, op);
}

/* The update's ops, in the parameter's scope (site and fn in scope). */
#define MULS(t, v) nt__scalar(site, fn, NT_OP_MUL_SCALAR, (t), (v), 0)
#define ADDS(t, v) nt__scalar(site, fn, NT_OP_ADD_SCALAR, (t), (v), 0)
#define DIVS(t, v) nt__scalar(site, fn, NT_OP_DIV_SCALAR, (t), (v), 0)
#define BIN(op, a, b) nt__binary(site, fn, NT_OP_##op, (a), (b))

/* A state tensor made once, filled with v: not part of a captured step (a
 * replay must not fill it again).  0 or the error. */
static int make_state(nt_tensor **st, nt_tensor *like, double v, const nt_site *site)
{
    nt__capture_pause();
    *st = own(v == 0 ? nt_zeros_like_at(site, like) : nt_full_at(site, (nt_dtype)like->dtype,
                                                                  like->ndim, like->shape, v));
    nt__capture_resume();
    return *st ? 0 : (nt__err_or(NT_EINVAL));
}

/* Makes the state tensors want (bits 0..2: s0..s2) at a parameter's first
 * update, all or none. */
static int make_states(slot *s, unsigned want, double v0, const nt_site *site)
{
    nt_tensor *w = working(s);
    nt_tensor **st[3] = {&s->s0, &s->s1, &s->s2};
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++)
        if ((want >> k & 1) && !*st[k])
            rc = make_state(st[k], w, k == 0 ? v0 : 0, site);
    if (rc)
        for (int k = 0; k < 3; k++)
            nt__optim_drop(st[k]);
    return rc;
}

/* g + wd * w (PyTorch's grad.add(param, alpha=wd)), or g when wd is 0 */
static nt_tensor *l2_decay(nt_tensor *g, nt_tensor *w, double wd, const nt_site *site,
                           const char *fn)
{
    return wd != 0 ? BIN(ADD, g, MULS(w, wd)) : g;
}

/* Returns p - lr * d (not yet written), where d is the (weight-decayed,
 * momentum) gradient:
 *   g = grad + wd * p
 *   buf = g at the first update, else momentum * buf + g   (written)
 *   d = nesterov ? g + momentum * buf : (momentum ? buf : g) */
static nt_tensor *sgd_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                             const char *fn)
{
    opt_group *h = group_of(s);
    nt_tensor *w = working(s);
    g = l2_decay(g, w, h->weight_decay, site, fn);
    nt_tensor *d = g;
    if (h->momentum != 0) {
        nt_tensor *buf;
        if (!s->s0) {
            if (nt__capturing())
                nt__capture_fail(NT_ESTATE, "nt_optim_step: SGD's first step makes its momentum "
                                            "buffer from the gradient, unlike the steps after "
                                            "it; run one step before capturing");
            buf = g;
            if (!g || !(s->s0 = own(clone_as(site, fn, g, (nt_dtype)w->dtype))))
                return NULL;
        } else {
            buf = BIN(ADD, MULS(s->s0, h->momentum), g);
            if (!buf || nt_copy_into_at(site, s->s0, buf) != 0)
                return NULL;
        }
        d = (o->flags & OPTF_NESTEROV) ? BIN(ADD, g, MULS(buf, h->momentum)) : buf;
    }
    patch_next(s, ROLE_LR, NT_OP_MUL_SCALAR);
    return BIN(SUB, w, MULS(d, h->lr));
}

/* AdamW with step t (this parameter's, after the increment); m and v are
 * written, the new p is returned (cpu/fused.c runs the program these ops
 * fuse into as one loop, recognising them op by op in this order: a change
 * here sends it back to the per-op passes, which test_fused_adamw_route_bitwise
 * notices):
 *   p  = p * (1 - lr * wd)
 *   m  = m + (1 - beta1) * (g - m)            (PyTorch's lerp)
 *   v  = beta2 * v + (1 - beta2) * g * g
 *   vmax = max(vmax, v)                       (amsgrad; the denominator's v)
 *   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps) */
static nt_tensor *adamw_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                               const char *fn)
{
    opt_group *h = group_of(s);
    bool ams = o->flags & OPTF_AMSGRAD;
    nt_tensor *w = working(s);
    if (make_states(s, ams ? 7u : 3u, 0, site) != 0)
        return NULL;
    double t = (double)(s->steps + 1);
    double bc2_sqrt = role_value(s, ROLE_BC2, t);
    double step_size = role_value(s, ROLE_STEP, t);

    if (h->weight_decay != 0)
        patch_next(s, ROLE_DECAY, NT_OP_MUL_SCALAR);
    nt_tensor *w1 = h->weight_decay != 0 ? MULS(w, role_value(s, ROLE_DECAY, t)) : w;
    nt_tensor *m = BIN(ADD, s->s0, MULS(BIN(SUB, g, s->s0), 1.0 - h->beta1));
    nt_tensor *v = BIN(ADD, MULS(s->s1, h->beta2), MULS(BIN(MUL, g, g), 1.0 - h->beta2));
    nt_tensor *vd = ams ? BIN(MAXIMUM, s->s2, v) : v;
    patch_next(s, ROLE_BC2, NT_OP_DIV_SCALAR);
    nt_tensor *denom = ADDS(DIVS(nt__unary(site, fn, NT_OP_SQRT, vd), bc2_sqrt), h->eps);
    patch_next(s, ROLE_STEP, NT_OP_MUL_SCALAR);
    nt_tensor *w_new = BIN(SUB, w1, MULS(BIN(DIV, m, denom), step_size));
    if (!w_new || nt_copy_into_at(site, s->s0, m) != 0 || nt_copy_into_at(site, s->s1, v) != 0 ||
        (ams && nt_copy_into_at(site, s->s2, vd) != 0))
        return NULL;
    return w_new;
}

/* Adam (torch.optim.Adam 1.13, L2 weight decay), step t:
 *   g  = g + wd * p
 *   m  = m * beta1 + (1 - beta1) * g
 *   v  = v * beta2 + ((1 - beta2) * g) * g
 *   vmax = max(vmax, v)                       (amsgrad; the denominator's v)
 *   p  = p - ((lr / (1 - beta1^t)) * m) / (sqrt(v) / sqrt(1 - beta2^t) + eps) */
static nt_tensor *adam_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                              const char *fn)
{
    opt_group *h = group_of(s);
    bool ams = o->flags & OPTF_AMSGRAD;
    nt_tensor *w = working(s);
    if (make_states(s, ams ? 7u : 3u, 0, site) != 0)
        return NULL;
    double t = (double)(s->steps + 1);
    g = l2_decay(g, w, h->weight_decay, site, fn);
    nt_tensor *m = BIN(ADD, MULS(s->s0, h->beta1), MULS(g, 1.0 - h->beta1));
    nt_tensor *v = BIN(ADD, MULS(s->s1, h->beta2), BIN(MUL, MULS(g, 1.0 - h->beta2), g));
    nt_tensor *vd = ams ? BIN(MAXIMUM, s->s2, v) : v;
    patch_next(s, ROLE_BC2, NT_OP_DIV_SCALAR);
    nt_tensor *denom =
        ADDS(DIVS(nt__unary(site, fn, NT_OP_SQRT, vd), role_value(s, ROLE_BC2, t)), h->eps);
    patch_next(s, ROLE_STEP, NT_OP_MUL_SCALAR);
    nt_tensor *upd = MULS(m, role_value(s, ROLE_STEP, t));
    nt_tensor *w_new = BIN(SUB, w, BIN(DIV, upd, denom));
    if (!w_new || nt_copy_into_at(site, s->s0, m) != 0 || nt_copy_into_at(site, s->s1, v) != 0 ||
        (ams && nt_copy_into_at(site, s->s2, vd) != 0))
        return NULL;
    return w_new;
}

/* RMSprop (torch.optim.RMSprop 1.13):
 *   g   = g + wd * p
 *   sq  = sq * alpha + ((1 - alpha) * g) * g
 *   centered: ga = ga * alpha + (1 - alpha) * g;  avg = sqrt(sq - ga * ga) + eps
 *   else:     avg = sqrt(sq) + eps
 *   momentum > 0: buf = buf * momentum + g / avg;  p = p - lr * buf
 *   else:         p = p - (lr * g) / avg */
static nt_tensor *rmsprop_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                                 const char *fn)
{
    opt_group *h = group_of(s);
    bool centered = o->flags & OPTF_CENTERED, mom = h->momentum > 0;
    nt_tensor *w = working(s);
    if (make_states(s, 1u | (mom ? 2u : 0u) | (centered ? 4u : 0u), 0, site) != 0)
        return NULL;
    g = l2_decay(g, w, h->weight_decay, site, fn);
    nt_tensor *sq = BIN(ADD, MULS(s->s0, h->alpha), BIN(MUL, MULS(g, 1.0 - h->alpha), g));
    nt_tensor *ga = NULL, *var = sq;
    if (centered) {
        ga = BIN(ADD, MULS(s->s2, h->alpha), MULS(g, 1.0 - h->alpha));
        var = BIN(SUB, sq, BIN(MUL, ga, ga));
    }
    nt_tensor *avg = ADDS(nt__unary(site, fn, NT_OP_SQRT, var), h->eps);
    nt_tensor *buf = NULL, *w_new;
    if (mom) {
        buf = BIN(ADD, MULS(s->s1, h->momentum), BIN(DIV, g, avg));
        patch_next(s, ROLE_LR, NT_OP_MUL_SCALAR);
        w_new = BIN(SUB, w, MULS(buf, h->lr));
    } else {
        patch_next(s, ROLE_LR, NT_OP_MUL_SCALAR);
        nt_tensor *num = MULS(g, h->lr);
        w_new = BIN(SUB, w, BIN(DIV, num, avg));
    }
    if (!w_new || nt_copy_into_at(site, s->s0, sq) != 0 ||
        (mom && nt_copy_into_at(site, s->s1, buf) != 0) ||
        (centered && nt_copy_into_at(site, s->s2, ga) != 0))
        return NULL;
    return w_new;
}

/* Adagrad (torch.optim.Adagrad 1.13), step t; sum starts at
 * initial_accumulator_value:
 *   g   = g + wd * p
 *   sum = sum + g * g
 *   p   = p - ((lr / (1 + (t - 1) * lr_decay)) * g) / (sqrt(sum) + eps) */
static nt_tensor *adagrad_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                                 const char *fn)
{
    (void)o;
    opt_group *h = group_of(s);
    nt_tensor *w = working(s);
    if (make_states(s, 1u, h->init_acc, site) != 0)
        return NULL;
    double t = (double)(s->steps + 1);
    g = l2_decay(g, w, h->weight_decay, site, fn);
    nt_tensor *sum = BIN(ADD, s->s0, BIN(MUL, g, g));
    nt_tensor *std = ADDS(nt__unary(site, fn, NT_OP_SQRT, sum), h->eps);
    patch_next(s, ROLE_CLR, NT_OP_MUL_SCALAR);
    nt_tensor *num = MULS(g, role_value(s, ROLE_CLR, t));
    nt_tensor *w_new = BIN(SUB, w, BIN(DIV, num, std));
    if (!w_new || nt_copy_into_at(site, s->s0, sum) != 0)
        return NULL;
    return w_new;
}

/* sign(c) as torch.sign: 1, -1 or 0 (for +-0), NaN for NaN. */
static nt_tensor *sign_of(nt_tensor *c, const nt_site *site, const char *fn)
{
    if (!c)
        return NULL;
    nt_tensor *zero = c ? nt_zeros_like_at(site, c) : NULL;
    nt_tensor *pos = nt__copy_to(site, fn, BIN(GT, c, zero), (nt_dtype)c->dtype);
    nt_tensor *neg = nt__copy_to(site, fn, BIN(LT, c, zero), (nt_dtype)c->dtype);
    nt_tensor *sg = BIN(SUB, pos, neg);
    return nt_where_at(site, BIN(NE, c, c), c, sg); /* NaN stays NaN */
}

/* Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
 *   p = p * (1 - lr * wd)
 *   c = m * beta1 + (1 - beta1) * g
 *   p = p - lr * sign(c)
 *   m = m * beta2 + (1 - beta2) * g */
static nt_tensor *lion_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                              const char *fn)
{
    (void)o;
    opt_group *h = group_of(s);
    nt_tensor *w = working(s);
    if (make_states(s, 1u, 0, site) != 0)
        return NULL;
    double t = (double)(s->steps + 1);
    if (h->weight_decay != 0)
        patch_next(s, ROLE_DECAY, NT_OP_MUL_SCALAR);
    nt_tensor *w1 = h->weight_decay != 0 ? MULS(w, role_value(s, ROLE_DECAY, t)) : w;
    nt_tensor *c = BIN(ADD, MULS(s->s0, h->beta1), MULS(g, 1.0 - h->beta1));
    nt_tensor *sg = sign_of(c, site, fn);
    patch_next(s, ROLE_LR, NT_OP_MUL_SCALAR);
    nt_tensor *w_new = BIN(SUB, w1, MULS(sg, h->lr));
    nt_tensor *m = BIN(ADD, MULS(s->s0, h->beta2), MULS(g, 1.0 - h->beta2));
    if (!w_new || !m || nt_copy_into_at(site, s->s0, m) != 0)
        return NULL;
    return w_new;
}

static nt_tensor *update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                         const char *fn)
{
    switch (o->kind) {
    case KIND_SGD: return sgd_update(o, s, g, site, fn);
    case KIND_ADAMW: return adamw_update(o, s, g, site, fn);
    case KIND_ADAM: return adam_update(o, s, g, site, fn);
    case KIND_RMSPROP: return rmsprop_update(o, s, g, site, fn);
    case KIND_ADAGRAD: return adagrad_update(o, s, g, site, fn);
    default: return lion_update(o, s, g, site, fn);
    }
}

/* ---------------- casts made ahead for autocast ----------------
 *
 * Under autocast every forward casts each f32 parameter to bf16/f16: a
 * kernel that reads the whole parameter again right after the optimizer
 * wrote it.  Instead the update's chain casts its own result: cast(w_new)
 * is one more output of the update's kernel, and has the bits of casting
 * the parameter once it holds w_new (an f32 stored into f32 keeps every
 * bit but a NaN's payload, and a cast makes every NaN canonical).  The
 * next forward's autocast takes it (amp/autocast.c) while the parameter's
 * storage version is still the one after this write: any other write
 * (nt_copy_into, an in-place op, nt_load, another step) bumps the version
 * and autocast casts as before.  Made only for a parameter that autocast
 * cast since the last step (amp_want), to the dtype it asked for. */

/* The leaf that requires grad and that src is the same view of: src
 * itself, or the leaf its chain of view nodes leads to (linear's w^T cast in
 * memory order is permute(transpose(w))); NULL if none. */
static nt_tensor *leaf_of(nt_tensor *src)
{
    if (!src->ag || !src->ag->requires_grad)
        return NULL;
    nt_tensor *l = NULL;
    if (!src->ag->grad_fn) {
        l = src;
    } else {
        nt__node *n = src->ag->grad_fn;
        for (int d = 0; d < 8 && n; d++) { /* a bound: views rarely nest deeper */
            if (n->op == NT__OP_ACCUMULATE) {
                l = n->leaf; /* weak: NULL once the leaf died */
                break;
            }
            if (n->op >= NT_OP_COUNT || nt__ops[n->op].kind != NT_KIND_VIEW || n->nin != 1)
                break;
            n = n->next[0].node;
        }
    }
    /* the walk only finds a candidate; this makes it exact */
    return l && l->ag && nt__same_view(l, src) ? l : NULL;
}

/* ---- casts made ahead in a captured step ----
 *
 * A captured forward reads the cast the step before it made ahead, as a
 * step op by op does: the program reads that cast's storage.  The
 * optimizer step of the same capture then writes its cast of w_new into
 * that very storage (one more output of the update's kernel), so each
 * replay's forward reads what the replay before it wrote: the bits of
 * casting the parameter, with no cast kernel at the top of the program.
 * Each such cast is checked at every replay (ampcap_check): when the
 * parameter was written since the storage got its cast (a step op by op,
 * nt_load, nt_copy_into), the replay casts it into the storage first. */
typedef struct ampcap {
    nt_tensor *leaf; /* the parameter (a reference) */
    nt_tensor *cast; /* the cast the program reads (a reference) */
    uint64_t serial; /* the capture that read it (nt__capture_serial) */
    uint64_t ver_ok; /* the leaf's storage version the cast is of */
    bool writes;     /* the program's optimizer step rewrites it */
    AO_t refs;
} ampcap;

static void ampcap_retain(void *ctx) { AO_fetch_and_add1(&((ampcap *)ctx)->refs); }
static void ampcap_release(void *ctx)
{
    ampcap *a = ctx;
    if (!nt__ref_drop(&a->refs, 1))
        return;
    if (a->leaf->ag && a->leaf->ag->amp_cap == a)
        a->leaf->ag->amp_cap = NULL;
    nt_release(a->cast);
    nt_release(a->leaf);
    free(a);
}

static int ampcap_check(void *ctx, const nt_site *site)
{
    ampcap *a = ctx;
    struct nt__ag *ag = a->leaf->ag;
    uint64_t v = AO_load_full(&a->leaf->st->version);
    if (v != a->ver_ok) {
        nt_no_grad_begin();
        int rc = nt_copy_into_at(site, a->cast, a->leaf);
        nt_no_grad_end();
        if (rc)
            return rc;
    }
    /* a replay that writes the parameter moves its version by one */
    a->ver_ok = v + (a->writes ? 1 : 0);
    if (a->writes && ag) {
        if (ag->amp_cast != a->cast) {
            nt__optim_drop(&ag->amp_cast);
            ag->amp_cast = nt_retain(a->cast);
        }
        ag->amp_ver = a->ver_ok;
    }
    return 0;
}

/* The capturing forward reads c, leaf l's cast made ahead: noted once per
 * capture; false (cast as usual) when the note cannot be made. */
static bool ampcap_note(nt_tensor *l, nt_tensor *c)
{
    uint64_t serial = nt__capture_serial();
    ampcap *a = l->ag->amp_cap;
    if (a && a->serial == serial && a->cast == c)
        return true;
    if (!(a = calloc(1, sizeof *a)))
        return false;
    a->leaf = nt_retain(l);
    a->cast = nt_retain(c);
    a->serial = serial;
    a->ver_ok = l->ag->amp_ver;
    a->refs = 1;
    nt__capture_on_check(ampcap_check, a, ampcap_retain, ampcap_release);
    l->ag->amp_cap = a; /* the capture holds it (or failed: then so does the capture) */
    ampcap_release(a);
    return l->ag->amp_cap == a;
}

/* In a captured optimizer step: w_new's cast goes into the storage the
 * program's forward read (*wrote), if it read one.  0 or the error. */
static int ampcap_write(struct nt__ag *ag, nt_tensor *p, nt_tensor *w_new, uint8_t want,
                        const nt_site *site, bool *wrote)
{
    ampcap *a = ag->amp_cap;
    *wrote = false;
    if (!a || a->serial != nt__capture_serial() || ag->amp_cast != a->cast ||
        want != (uint8_t)(a->cast->dtype + 1) || w_new->dtype != NT_F32)
        return 0;
    int rc = nt_copy_into_at(site, a->cast, w_new);
    if (rc)
        return rc;
    a->writes = *wrote = true;
    a->ver_ok = ag->amp_ver = AO_load_full(&p->st->version);
    return 0;
}

/* A capturing forward that finds no valid cast made ahead of leaf l: the
 * cast made now, outside the program (as an optimizer's first-use state
 * is), so that the program reads it like one made ahead and its optimizer
 * step can rewrite it (ampcap); NULL to cast in the program as usual. */
static nt_tensor *ampcap_make(const nt_site *site, const char *fn, nt_tensor *l, nt_dtype dt)
{
    struct nt__ag *ag = l->ag;
    /* an optimizer's parameters only: a leaf the user rewrites otherwise (a
     * graph input bound at each replay) is cast in the program */
    if (!ag->amp_opt || l->dtype != NT_F32 || (dt != NT_BF16 && dt != NT_F16) ||
        NT__CFG(sr) || !nt__is_contig(l))
        return NULL;
    nt__capture_pause();
    nt_no_grad_begin();
    nt_tensor *c = own(nt__copy_to(site, fn, l, dt));
    nt_no_grad_end();
    nt__capture_resume();
    if (!c) {
        nt_clear_error();
        return NULL;
    }
    nt__optim_drop(&ag->amp_cast);
    ag->amp_cast = c;
    ag->amp_ver = AO_load_full(&l->st->version);
    return ampcap_note(l, c) ? c : NULL;
}

nt_tensor *nt__optim_cast_of(nt_tensor *src, nt_dtype dt)
{
    return nt__optim_cast_of_at(NULL, "autocast", src, dt);
}

nt_tensor *nt__optim_cast_of_at(const nt_site *site, const char *fn, nt_tensor *src, nt_dtype dt)
{
    nt_tensor *l = leaf_of(src);
    if (!l)
        return NULL;
    struct nt__ag *ag = l->ag;
    /* threads may run forwards on shared parameters: a store only when it
     * changes, and atomic */
    uint8_t want = (uint8_t)(dt + 1);
    if (__atomic_load_n(&ag->amp_want, __ATOMIC_RELAXED) != want)
        __atomic_store_n(&ag->amp_want, want, __ATOMIC_RELAXED);
    nt_tensor *c = ag->amp_cast;
    if (c && c->dtype == dt && c->dev == src->dev && c->ndim == src->ndim &&
        AO_load_full(&l->st->version) == ag->amp_ver)
        return !nt__capturing() || ampcap_note(l, c) ? c : NULL;
    return nt__capturing() && site ? ampcap_make(site, fn, l, dt) : NULL;
}

/* After the update wrote w_new into the parameter: its cast for the next
 * forward, when autocast asked for one (see above). */
static int cast_ahead(slot *s, nt_tensor *w_new, const nt_site *site, const char *fn)
{
    struct nt__ag *ag = s->p->ag;
    if (!ag)
        return 0;
    if (nt__capturing()) { /* see ampcap */
        uint8_t want = __atomic_exchange_n(&ag->amp_want, 0, __ATOMIC_RELAXED);
        bool wrote = false;
        int rc = NT__CFG(sr) || !nt__is_contig(s->p) || s->p->dtype != NT_F32
                     ? 0
                     : ampcap_write(ag, s->p, w_new, want, site, &wrote);
        if (!wrote)
            nt__optim_drop(&ag->amp_cast);
        return rc;
    }
    nt__optim_drop(&ag->amp_cast); /* stale from here on */
    uint8_t want = __atomic_exchange_n(&ag->amp_want, 0, __ATOMIC_RELAXED);
    if (!want)
        return 0;
    nt_dtype dt = (nt_dtype)(want - 1);
    /* f32 -> bf16/f16 rounds to nearest even; stochastic rounding draws
     * from the cast's own seed and place, so is left to the forward */
    if (s->p->dtype != NT_F32 || (dt != NT_BF16 && dt != NT_F16) || NT__CFG(sr) ||
        !nt__is_contig(s->p) || w_new->dtype != NT_F32)
        return 0;
    nt_tensor *c = own(nt__copy_to(site, fn, w_new, dt));
    if (!c)
        return nt_last_error();
    ag->amp_cast = c;
    ag->amp_ver = AO_load_full(&s->p->st->version);
    return 0;
}

/* fn: the function the user called (nt_optim_step, nt_sgd_step). */
static int step_locked(nt_optim *o, const nt_site *site, const char *fn)
{
    /* the counts never overflow (nor, below 2^53, lose a step in the bias
     * corrections' double): a step past the bound is refused, as nt_load
     * refuses a count past it */
    if (o->steps >= NT__OPTIM_MAX_STEPS)
        return nt__err(site, NT_ESTATE, fn,
                       "the optimizer's step count is %lld, the most it may reach (2^53, "
                       "the counts a double holds exactly)", (long long)o->steps);
    int rc = 0;
    nt_no_grad_begin();
    for (int i = 0; i < o->n && !rc; i++) {
        slot *s = o->slots[i];
        nt_tensor *p = s->p;
        if (!p->ag || !p->ag->grad)
            continue; /* no gradient reached it: skipped, like PyTorch */
        /* Each parameter is updated on its device (its state is made
         * there), whatever the calling thread's device. */
        nt__devsw dv;
        nt__dev_enter(&dv, p->dev);
        /* One scope per parameter: its intermediates die as soon as its
         * chain is queued, which is what lets the chain fuse. */
        nt_scope *sc = nt_scope_begin();
        if (!sc) {
            rc = nt__err_hostmem(site, fn, "a scope");
            nt__dev_leave(&dv);
            break;
        }
        nt_tensor *g = p->ag->grad;
        nt_tensor *w = working(s);
        if (g->dtype != w->dtype)
            g = nt__copy_to(site, fn, g, (nt_dtype)w->dtype);
        nt_tensor *w_new = !g ? NULL : update(o, s, g, site, fn);
        if (!w_new)
            rc = nt__err_or(NT_EINVAL);
        else
            rc = nt_copy_into_at(site, w, w_new);
        /* masters: the parameter gets the new master value, rounded (from
         * the chain's value, not by re-reading the master) */
        if (!rc && s->master)
            rc = nt_copy_into_at(site, p, w_new);
        else if (!rc)
            rc = cast_ahead(s, w_new, site, fn);
        if (!rc) {
            s->steps++;
            if (nt__capturing())
                nt__capture_on_replay(slot_stepped, s, 0, optim_retain_slot, optim_release_slot);
        }
        nt_scope_end(sc);
        nt__dev_leave(&dv);
    }
    nt_no_grad_end();
    if (!rc) {
        o->steps++;
        if (nt__capturing())
            nt__capture_on_replay(optim_stepped, o, 0, optim_retain, optim_release);
    } else {
        nt__err_within(fn); /* an inner op's error: say whose step it was */
    }
    return rc;
}

static int step_at(const nt_site *site, nt_optim *o, const char *fn)
{
    if (!opt_ok_at(site, o, fn))
        return nt_last_error();
    g_mutex_lock(&o->lock);
    int rc = step_locked(o, site, fn);
    g_mutex_unlock(&o->lock);
    if (!rc && !nt__capturing())
        nt__htrace_step(); /* NT_TRACE_STEPS counts optimizer steps */
    return rc;
}

NT_API int nt_optim_step_at(const nt_site *site, nt_optim *o)
{
    return step_at(site, o, "nt_optim_step");
}
NT_API int nt_optim_step(nt_optim *o) { return nt_optim_step_at(NT_RA_SITE, o); }
NT_API int nt_sgd_step_at(const nt_site *site, nt_optim *o)
{
    return step_at(site, o, "nt_sgd_step"); /* errors name the function the user called */
}
NT_API int nt_sgd_step(nt_optim *o) { return nt_sgd_step_at(NT_RA_SITE, o); }

NT_API int nt_optim_zero_grad(nt_optim *o)
{
    if (!nt__optim_ok(o, "nt_optim_zero_grad"))
        return nt_last_error();
    int rc = 0;
    g_mutex_lock(&o->lock);
    for (int i = 0; i < o->n && !rc; i++)
        rc = nt_zero_grad(o->slots[i]->p);
    g_mutex_unlock(&o->lock);
    return rc;
}

NT_API int nt_optim_set_lr(nt_optim *o, double lr)
{
    if (!nt__optim_ok(o, "nt_optim_set_lr"))
        return nt_last_error();
    if (!finite_ge0(lr))
        return nt__err(NULL, NT_EINVAL, "nt_optim_set_lr",
                       "argument 'lr' is %g; expected a finite value >= 0", lr);
    g_mutex_lock(&o->lock);
    for (int g = 0; g < o->ngroups; g++) /* every group, as PyTorch users write it */
        o->groups[g].lr = lr;
    g_mutex_unlock(&o->lock);
    return 0;
}

NT_API double nt_optim_get_lr(nt_optim *o)
{
    if (!nt__optim_ok(o, "nt_optim_get_lr"))
        return NAN;
    g_mutex_lock(&o->lock);
    double lr = o->groups[0].lr;
    g_mutex_unlock(&o->lock);
    return lr;
}

NT_API int64_t nt_optim_steps(nt_optim *o)
{
    if (!nt__optim_ok(o, "nt_optim_steps"))
        return nt_last_error();
    g_mutex_lock(&o->lock);
    int64_t n = o->steps;
    g_mutex_unlock(&o->lock);
    return n;
}

/* Re-expresses existing state in dtype dt (masters switched on or off). */
static int recast_state(slot *s, nt_dtype dt, const char *fn)
{
    nt_tensor **st[3] = {&s->s0, &s->s1, &s->s2};
    for (int k = 0; k < 3; k++) {
        nt_tensor *t = *st[k];
        if (!t || t->dtype == dt)
            continue;
        nt_tensor *c = own(nt__copy_to(NULL, fn, t, dt));
        if (!c)
            return nt_last_error();
        nt_release(t);
        *st[k] = c;
    }
    return 0;
}

/* f32 masters for the low-precision parameters from slot `from` on that
 * have none (master weights on, a group added after). */
static int make_masters(nt_optim *o, int from, const char *fn)
{
    int rc = 0;
    nt_no_grad_begin();
    for (int i = from; i < o->n && !rc; i++) {
        slot *s = o->slots[i];
        if (!nt__optim_low_precision(s->p) || s->master)
            continue;
        nt__devsw dv;
        nt__dev_enter(&dv, s->p->dev);
        s->master = own(nt__copy_to(NULL, fn, s->p, NT_F32));
        rc = s->master ? 0 : nt_last_error();
        nt__dev_leave(&dv);
    }
    nt_no_grad_end();
    return rc;
}

NT_API int nt_optim_set_master_weights(nt_optim *o, bool on)
{
    const char *fn = "nt_optim_set_master_weights";
    if (!nt__optim_ok(o, fn))
        return nt_last_error();
    g_mutex_lock(&o->lock);
    int rc = 0;
    nt_no_grad_begin();
    for (int i = 0; i < o->n && !rc; i++) {
        slot *s = o->slots[i];
        if (!nt__optim_low_precision(s->p))
            continue;
        nt__devsw dv; /* the copies live on the parameter's device */
        nt__dev_enter(&dv, s->p->dev);
        if (on && !s->master) {
            s->master = own(nt__copy_to(NULL, fn, s->p, NT_F32));
            rc = s->master ? recast_state(s, NT_F32, fn) : nt_last_error();
        } else if (!on && s->master) {
            nt__optim_drop(&s->master);
            rc = recast_state(s, (nt_dtype)s->p->dtype, fn);
        }
        nt__dev_leave(&dv);
    }
    nt_no_grad_end();
    if (!rc)
        o->master = on;
    g_mutex_unlock(&o->lock);
    return rc;
}

NT_API void nt_optim_destroy(nt_optim *o)
{
    if (!o)
        return;
    if (!nt__hobj_live(o, OPT_MAGIC)) {
        /* the error: destroyed already, ... */
        nt__hobj_check(o, OPT_MAGIC, NULL, "nt_optim_destroy", "opt", "optimizer");
        return;
    }
    /* one made before nt_shutdown: its tensors went with that runtime */
    for (int i = 0; nt__hobj_current(o) && i < o->n; i++) {
        slot *s = o->slots[i];
        nt__optim_drop(&s->s0);
        nt__optim_drop(&s->s1);
        nt__optim_drop(&s->s2);
        nt__optim_drop(&s->master);
        if (s->p->ag) /* the casts it made ahead go with it */
            nt__optim_drop(&s->p->ag->amp_cast);
        nt__optim_drop(&s->p);
    }
    /* destroyed now (a second destroy says so); its memory goes when the
     * captured programs that refresh its scalars let it go */
    __atomic_store_n(&o->magic, ~(uint32_t)OPT_MAGIC, __ATOMIC_RELAXED);
    optim_release(o);
}

int nt__optim_nparams(nt_optim *o)
{
    return nt__hobj_live(o, OPT_MAGIC) && nt__hobj_current(o) ? o->n : NT_EINVAL;
}

nt_tensor *nt__optim_param(nt_optim *o, int i)
{
    return o->slots[i]->p; /* fixed once added: no lock needed */
}

void nt__first_use_begin(void) { nt__capture_pause(); }
void nt__first_use_end(void) { nt__capture_resume(); }
