/* autograd/optim.c - SGD and AdamW.  Checkpoints of parameters and
 * optimizer state are io/checkpoint.c's (format: docs/checkpoint-format.md).
 *
 * One parameter's update is a chain of elementwise ops on that parameter's
 * tensors (param, grad, state) ending in in-place writes, issued inside a
 * scope of its own with graph recording off.  Every intermediate is dead as
 * soon as the chain is queued, so the fusion engine can turn the whole
 * update into one kernel that reads param, grad and state once and writes
 * param and state once.  Scalars that depend on the step count (Adam's bias
 * corrections) are computed on the host in double: a step never syncs.
 *
 * Semantics are PyTorch's torch.optim.SGD (dampening 0) and
 * torch.optim.AdamW (amsgrad off), with the per-parameter step count of
 * PyTorch: a parameter that has no .grad at a step is skipped and its count
 * does not move.
 *
 * Concurrency: each optimizer has a mutex; step, zero_grad, set_lr,
 * set_master_weights, nt_save and nt_load on one optimizer serialise.  The
 * parameters are ordinary tensors: a thread that writes them while another
 * steps the optimizer needs its own ordering (events). */
#include "autograd/optim.h"
#include "debug/debug.h"
#include "fusion/graph.h"

#include <math.h>
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

static nt_optim *opt_new(opt_kind kind, nt_tensor *const *params, int n)
{
    nt_optim *o = nt__hobj_new(sizeof *o, OPT_MAGIC);
    slot *slots = calloc((size_t)n, sizeof *slots);
    if (!o || !slots) {
        nt__hobj_free(o);
        free(slots);
        nt__err_hostmem(NULL, kind == KIND_SGD ? "nt_optim_sgd" : "nt_optim_adamw",
                        "the optimizer");
        return NULL;
    }
    o->refs = 1;
    o->kind = kind;
    o->n = n;
    o->slots = slots;
    for (int i = 0; i < n; i++) {
        o->slots[i].p = nt_retain(params[i]);
        o->slots[i].o = o;
    }
    g_mutex_init(&o->lock);
    return o;
}

NT_API nt_optim *nt_optim_sgd(nt_tensor *const *params, int n, double lr, double momentum,
                              double weight_decay, bool nesterov)
{
    const char *fn = "nt_optim_sgd";
    if (!nt__ensure_init() || !check_params(fn, params, n))
        return NULL;
    if (!finite_ge0(lr) || !finite_ge0(momentum) || !finite_ge0(weight_decay)) {
        nt__err(NULL, NT_EINVAL, fn,
                "lr, momentum and weight_decay must be finite and >= 0 (got %g, %g, %g)", lr,
                momentum, weight_decay);
        return NULL;
    }
    if (nesterov && momentum <= 0) {
        nt__err(NULL, NT_EINVAL, fn, "nesterov momentum needs momentum > 0 (got %g)", momentum);
        return NULL;
    }
    nt_optim *o = opt_new(KIND_SGD, params, n);
    if (!o)
        return NULL;
    o->lr = lr;
    o->momentum = momentum;
    o->weight_decay = weight_decay;
    o->nesterov = nesterov;
    return o;
}

NT_API nt_optim *nt_optim_adamw(nt_tensor *const *params, int n, double lr, double beta1,
                                double beta2, double eps, double weight_decay)
{
    const char *fn = "nt_optim_adamw";
    if (!nt__ensure_init() || !check_params(fn, params, n))
        return NULL;
    if (!finite_ge0(lr) || !finite_ge0(eps) || !finite_ge0(weight_decay)) {
        nt__err(NULL, NT_EINVAL, fn,
                "lr, eps and weight_decay must be finite and >= 0 (got %g, %g, %g)", lr, eps,
                weight_decay);
        return NULL;
    }
    if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
        nt__err(NULL, NT_EINVAL, fn, "betas must be in [0, 1) (got %g, %g)", beta1, beta2);
        return NULL;
    }
    nt_optim *o = opt_new(KIND_ADAMW, params, n);
    if (!o)
        return NULL;
    o->lr = lr;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = weight_decay;
    return o;
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
enum { ROLE_DECAY, ROLE_BC2, ROLE_STEP, ROLE_LR };

static uint64_t scalar_at_replay(void *ctx, int role)
{
    slot *s = ctx;
    nt_optim *o = s->o;
    double t = (double)(s->steps + 1);
    switch (role) {
    case ROLE_DECAY: return nt__patch_f64(1.0 - o->lr * o->weight_decay);
    case ROLE_BC2: return nt__patch_f64(sqrt(1.0 - pow(o->beta2, t)));
    case ROLE_STEP: return nt__patch_f64(o->lr / (1.0 - pow(o->beta1, t)));
    default: return nt__patch_f64(o->lr);
    }
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
    free(o->slots);
    g_mutex_clear(&o->lock);
    nt__hobj_free(o);
}
static void optim_release(void *ctx)
{
    nt_optim *o = ctx;
    if (nt__ref_drop(&o->refs, 1))
        optim_free(o);
}
static void optim_retain_slot(void *ctx) { optim_retain(((slot *)ctx)->o); }
static void optim_release_slot(void *ctx) { optim_release(((slot *)ctx)->o); }

static void patch_next(slot *s, int role, int op)
{
    if (nt__capturing())
        nt__capture_patch_next(scalar_at_replay, s, role, NT__PATCH_F0, op);
}

/* Returns p - lr * d (not yet written), where d is the (weight-decayed,
 * momentum) gradient:
 *   g = grad + wd * p
 *   buf = g at the first update, else momentum * buf + g   (written)
 *   d = nesterov ? g + momentum * buf : (momentum ? buf : g) */
static nt_tensor *sgd_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                             const char *fn)
{
    nt_tensor *w = working(s);
    if (o->weight_decay != 0)
        g = nt__binary(site, fn, NT_OP_ADD, g,
                       nt__scalar(site, fn, NT_OP_MUL_SCALAR, w, o->weight_decay, 0));
    nt_tensor *d = g;
    if (o->momentum != 0) {
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
            buf = nt__binary(site, fn, NT_OP_ADD,
                             nt__scalar(site, fn, NT_OP_MUL_SCALAR, s->s0, o->momentum, 0), g);
            if (!buf || nt_copy_into_at(site, s->s0, buf) != 0)
                return NULL;
        }
        d = o->nesterov ? nt__binary(site, fn, NT_OP_ADD, g,
                                     nt__scalar(site, fn, NT_OP_MUL_SCALAR, buf, o->momentum, 0))
                        : buf;
    }
    patch_next(s, ROLE_LR, NT_OP_MUL_SCALAR);
    return nt__binary(site, fn, NT_OP_SUB, w, nt__scalar(site, fn, NT_OP_MUL_SCALAR, d, o->lr, 0));
}

/* AdamW with step t (this parameter's, after the increment); m and v are
 * written, the new p is returned (cpu/fused.c runs the program these ops
 * fuse into as one loop, recognising them op by op in this order: a change
 * here sends it back to the per-op passes, which test_fused_adamw_route_bitwise
 * notices):
 *   p  = p * (1 - lr * wd)
 *   m  = m + (1 - beta1) * (g - m)            (PyTorch's lerp)
 *   v  = beta2 * v + (1 - beta2) * g * g
 *   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps) */
static nt_tensor *adamw_update(nt_optim *o, slot *s, nt_tensor *g, const nt_site *site,
                               const char *fn)
{
    nt_tensor *w = working(s);
    if (!s->s0) {
        /* state made once: not part of a captured step (a replay must not
         * zero it again) */
        nt__capture_pause();
        s->s0 = own(nt_zeros_like_at(site, w));
        s->s1 = own(nt_zeros_like_at(site, w));
        nt__capture_resume();
        if (!s->s0 || !s->s1) {
            nt__optim_drop(&s->s0);
            nt__optim_drop(&s->s1);
            return NULL;
        }
    }
    double t = (double)(s->steps + 1);
    double bc1 = 1.0 - pow(o->beta1, t);
    double bc2_sqrt = sqrt(1.0 - pow(o->beta2, t));
    double step_size = o->lr / bc1;

    if (o->weight_decay != 0)
        patch_next(s, ROLE_DECAY, NT_OP_MUL_SCALAR);
    nt_tensor *w1 = o->weight_decay != 0
                        ? nt__scalar(site, fn, NT_OP_MUL_SCALAR, w, 1.0 - o->lr * o->weight_decay, 0)
                        : w;
    nt_tensor *m = nt__binary(
        site, fn, NT_OP_ADD, s->s0,
        nt__scalar(site, fn, NT_OP_MUL_SCALAR, nt__binary(site, fn, NT_OP_SUB, g, s->s0),
                   1.0 - o->beta1, 0));
    nt_tensor *v = nt__binary(
        site, fn, NT_OP_ADD, nt__scalar(site, fn, NT_OP_MUL_SCALAR, s->s1, o->beta2, 0),
        nt__scalar(site, fn, NT_OP_MUL_SCALAR, nt__binary(site, fn, NT_OP_MUL, g, g),
                   1.0 - o->beta2, 0));
    patch_next(s, ROLE_BC2, NT_OP_DIV_SCALAR);
    nt_tensor *denom = nt__scalar(
        site, fn, NT_OP_ADD_SCALAR,
        nt__scalar(site, fn, NT_OP_DIV_SCALAR, nt__unary(site, fn, NT_OP_SQRT, v), bc2_sqrt, 0),
        o->eps, 0);
    patch_next(s, ROLE_STEP, NT_OP_MUL_SCALAR);
    nt_tensor *w_new = nt__binary(
        site, fn, NT_OP_SUB, w1,
        nt__scalar(site, fn, NT_OP_MUL_SCALAR, nt__binary(site, fn, NT_OP_DIV, m, denom),
                   step_size, 0));
    if (!w_new || nt_copy_into_at(site, s->s0, m) != 0 || nt_copy_into_at(site, s->s1, v) != 0)
        return NULL;
    return w_new;
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

nt_tensor *nt__optim_cast_of(nt_tensor *src, nt_dtype dt)
{
    /* A captured step casts its parameters itself: a cast made ahead by
     * the previous step is not in the program, and the program's own would
     * reach only the next replay's forward through a storage it rewrites. */
    if (nt__capturing())
        return NULL;
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
        return c;
    return NULL;
}

/* After the update wrote w_new into the parameter: its cast for the next
 * forward, when autocast asked for one (see above). */
static int cast_ahead(slot *s, nt_tensor *w_new, const nt_site *site, const char *fn)
{
    struct nt__ag *ag = s->p->ag;
    if (!ag)
        return 0;
    if (nt__capturing()) { /* see nt__optim_cast_of */
        nt__optim_drop(&ag->amp_cast);
        __atomic_store_n(&ag->amp_want, 0, __ATOMIC_RELAXED);
        return 0;
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
        slot *s = &o->slots[i];
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
        nt_tensor *w_new = !g ? NULL
                           : o->kind == KIND_SGD ? sgd_update(o, s, g, site, fn)
                                                 : adamw_update(o, s, g, site, fn);
        if (!w_new)
            rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
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
        rc = nt_zero_grad(o->slots[i].p);
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
    o->lr = lr;
    g_mutex_unlock(&o->lock);
    return 0;
}

NT_API double nt_optim_get_lr(nt_optim *o)
{
    if (!nt__optim_ok(o, "nt_optim_get_lr"))
        return NAN;
    g_mutex_lock(&o->lock);
    double lr = o->lr;
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
    nt_tensor **st[2] = {&s->s0, &s->s1};
    for (int k = 0; k < 2; k++) {
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

NT_API int nt_optim_set_master_weights(nt_optim *o, bool on)
{
    const char *fn = "nt_optim_set_master_weights";
    if (!nt__optim_ok(o, fn))
        return nt_last_error();
    g_mutex_lock(&o->lock);
    int rc = 0;
    nt_no_grad_begin();
    for (int i = 0; i < o->n && !rc; i++) {
        slot *s = &o->slots[i];
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
        slot *s = &o->slots[i];
        nt__optim_drop(&s->s0);
        nt__optim_drop(&s->s1);
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
    return o->slots[i].p; /* fixed at creation: no lock needed */
}
