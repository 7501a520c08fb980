/* autograd/sched.c - learning-rate schedulers (include/ntensor.h,
 * docs/optimizers.md): step, cosine with linear warm-up, linear and
 * one-cycle.
 *
 * A scheduler holds no position of its own: its position is its
 * optimizer's step count (nt_optim_steps), which nt_save/nt_load keep, so a
 * scheduler made before or after nt_load resumes where the run stopped and
 * has nothing to save.  nt_scheduler_step sets every group's lr to the
 * schedule's value at that position, scaling the group's base lr (its
 * initial_lr, the lr it was made with) as PyTorch's schedulers scale
 * group['initial_lr'].  Calling it twice at one position sets the same lr. */
#include "autograd/optim.h"

#include <math.h>
#include <stdlib.h>

#define SCHED_MAGIC 0x53434844u /* "SCHD" */

typedef enum { SK_STEP, SK_COSINE, SK_LINEAR, SK_ONECYCLE } sched_kind;

struct nt_scheduler {
    NT__HOBJ_HEAD;
    sched_kind kind;
    nt_optim *o; /* its memory kept (nt__optim_retain) */
    int64_t n1, n2;      /* step_size | warmup, total | total_iters | total_steps */
    double a, b, c, d, e; /* gamma | min_lr | start, end | max_lr, pct, div, final_div */
};

static const char *const make_fn[] = {"nt_scheduler_steplr", "nt_scheduler_cosine",
                                      "nt_scheduler_linear", "nt_scheduler_onecycle"};

/* PyTorch's OneCycleLR _annealing_cos */
static double anneal_cos(double start, double end, double pct)
{
    double cos_out = cos(M_PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
}

/* The schedule's lr for a group whose base lr is base, at position k. */
static double sched_lr(const nt_scheduler *s, double base, int64_t k)
{
    switch (s->kind) {
    case SK_STEP: {
        int64_t n = k / s->n1;
        if (n > 4096) /* past any useful decay: no loop of 2^53 */
            return base * pow(s->a, (double)n);
        double v = base; /* PyTorch multiplies the lr by gamma at each boundary */
        for (int64_t i = 0; i < n; i++)
            v *= s->a;
        return v;
    }
    case SK_COSINE: {
        int64_t warm = s->n1, total = s->n2;
        if (k < warm)
            return base * (double)(k + 1) / (double)warm;
        if (total <= warm + 1)
            return s->a;
        double prog = (double)(k - warm) / (double)(total - warm - 1);
        if (prog > 1)
            prog = 1;
        return s->a + 0.5 * (base - s->a) * (1 + cos(M_PI * prog));
    }
    case SK_LINEAR: {
        int64_t t = k < s->n1 ? k : s->n1;
        return base * (s->a + (s->b - s->a) * (double)t / (double)s->n1);
    }
    default: {
        double initial = s->a / s->d, min_lr = initial / s->e;
        double end1 = s->b * (double)s->n2 - 1, end2 = (double)s->n2 - 1;
        double step = (double)k;
        /* PyTorch's two phases, pct unclamped (a 0/0 that Python would
         * raise on is 0 here) */
        if (step <= end1)
            return anneal_cos(initial, s->a, end1 != 0 ? step / end1 : 0);
        if (end2 == end1)
            return anneal_cos(s->a, min_lr, 0);
        return anneal_cos(s->a, min_lr, (step - end1) / (end2 - end1));
    }
    }
}

/* Sets every group's lr for the optimizer's position (the lock held). */
static int apply_locked(nt_scheduler *s, const char *fn)
{
    nt_optim *o = s->o;
    int64_t k = o->steps;
    if (s->kind == SK_ONECYCLE && k > s->n2)
        return nt__err(NULL, NT_ESTATE, fn,
                       "tried to step %lld times; the one-cycle schedule's total_steps is %lld "
                       "(the optimizer's step count is the schedule's position)",
                       (long long)k, (long long)s->n2);
    for (int g = 0; g < o->ngroups; g++) {
        double base = o->groups[g].initial_lr;
        o->groups[g].lr = sched_lr(s, base, k);
    }
    return 0;
}

static int sched_apply(nt_scheduler *s, const char *fn)
{
    g_mutex_lock(&s->o->lock);
    int rc = apply_locked(s, fn);
    g_mutex_unlock(&s->o->lock);
    return rc;
}

static nt_scheduler *sched_new(sched_kind kind, nt_optim *o, int64_t n1, int64_t n2,
                               const double v[5])
{
    const char *fn = make_fn[kind];
    nt_scheduler *s = nt__hobj_new(sizeof *s, SCHED_MAGIC);
    if (!s) {
        nt__err_hostmem(NULL, fn, "the scheduler");
        return NULL;
    }
    s->kind = kind;
    s->o = o;
    s->n1 = n1;
    s->n2 = n2;
    s->a = v[0], s->b = v[1], s->c = v[2], s->d = v[3], s->e = v[4];
    g_mutex_lock(&o->lock);
    /* PyTorch sets initial_lr = max_lr / div_factor (not when the position
     * is past the end: an error changes nothing) */
    if (kind == SK_ONECYCLE && o->steps <= n2)
        for (int g = 0; g < o->ngroups; g++)
            o->groups[g].initial_lr = v[0] / v[3];
    int rc = apply_locked(s, fn);
    g_mutex_unlock(&o->lock);
    if (rc != 0) {
        nt__hobj_free(s);
        return NULL;
    }
    nt__optim_retain(o);
    return s;
}

static bool bad(const char *fn, const char *arg, bool cond, const char *expect, double v)
{
    if (cond)
        nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %g; expected %s", arg, v, expect);
    return cond;
}

NT_API nt_scheduler *nt_scheduler_steplr(nt_optim *opt, int64_t step_size, double gamma)
{
    const char *fn = make_fn[SK_STEP];
    if (!nt__optim_ok(opt, fn) ||
        bad(fn, "step_size", step_size < 1, "an integer >= 1", (double)step_size) ||
        bad(fn, "gamma", !(isfinite(gamma) && gamma >= 0), "a finite value >= 0", gamma))
        return NULL;
    return sched_new(SK_STEP, opt, step_size, 0, (double[5]){gamma});
}

NT_API nt_scheduler *nt_scheduler_cosine(nt_optim *opt, int64_t warmup_steps,
                                         int64_t total_steps, double min_lr)
{
    const char *fn = make_fn[SK_COSINE];
    if (!nt__optim_ok(opt, fn) ||
        bad(fn, "warmup_steps", warmup_steps < 0, "an integer >= 0", (double)warmup_steps) ||
        bad(fn, "total_steps", total_steps < 1 || total_steps < warmup_steps,
            "an integer >= 1 and >= warmup_steps", (double)total_steps) ||
        bad(fn, "min_lr", !(isfinite(min_lr) && min_lr >= 0), "a finite value >= 0", min_lr))
        return NULL;
    return sched_new(SK_COSINE, opt, warmup_steps, total_steps, (double[5]){min_lr});
}

NT_API nt_scheduler *nt_scheduler_linear(nt_optim *opt, double start_factor, double end_factor,
                                         int64_t total_iters)
{
    const char *fn = make_fn[SK_LINEAR];
    if (!nt__optim_ok(opt, fn) ||
        bad(fn, "start_factor", !(start_factor > 0 && start_factor <= 1), "a value in (0, 1]",
            start_factor) ||
        bad(fn, "end_factor", !(end_factor >= 0 && end_factor <= 1), "a value in [0, 1]",
            end_factor) ||
        bad(fn, "total_iters", total_iters < 1, "an integer >= 1", (double)total_iters))
        return NULL;
    return sched_new(SK_LINEAR, opt, total_iters, 0, (double[5]){start_factor, end_factor});
}

NT_API nt_scheduler *nt_scheduler_onecycle(nt_optim *opt, double max_lr, int64_t total_steps,
                                           double pct_start, double div_factor,
                                           double final_div_factor)
{
    const char *fn = make_fn[SK_ONECYCLE];
    if (!nt__optim_ok(opt, fn) ||
        bad(fn, "max_lr", !(isfinite(max_lr) && max_lr > 0), "a finite value > 0", max_lr) ||
        bad(fn, "total_steps", total_steps < 1, "an integer >= 1", (double)total_steps) ||
        bad(fn, "pct_start", !(pct_start >= 0 && pct_start <= 1), "a value in [0, 1]",
            pct_start) ||
        bad(fn, "div_factor", !(isfinite(div_factor) && div_factor > 0), "a finite value > 0",
            div_factor) ||
        bad(fn, "final_div_factor", !(isfinite(final_div_factor) && final_div_factor > 0),
            "a finite value > 0", final_div_factor))
        return NULL;
    return sched_new(SK_ONECYCLE, opt, 0, total_steps,
                     (double[5]){max_lr, pct_start, 0, div_factor, final_div_factor});
}

static bool sched_ok(nt_scheduler *s, const char *fn)
{
    if (!nt__ensure_init())
        return false;
    if (nt__hobj_check(s, SCHED_MAGIC, NULL, fn, "sched", "scheduler") != 0)
        return false;
    if (!nt__optim_ok(s->o, fn)) {
        nt__err(NULL, NT_ESTATE, fn, "the scheduler's optimizer was destroyed");
        return false;
    }
    return true;
}

NT_API int nt_scheduler_step(nt_scheduler *s)
{
    const char *fn = "nt_scheduler_step";
    if (!sched_ok(s, fn))
        return nt_last_error();
    return sched_apply(s, fn);
}

NT_API double nt_scheduler_get_lr(nt_scheduler *s, int group)
{
    const char *fn = "nt_scheduler_get_lr";
    if (!sched_ok(s, fn))
        return NAN;
    return nt_optim_get_group_lr(s->o, group);
}

NT_API void nt_scheduler_destroy(nt_scheduler *s)
{
    if (!s)
        return;
    if (!nt__hobj_live(s, SCHED_MAGIC)) {
        nt__hobj_check(s, SCHED_MAGIC, NULL, "nt_scheduler_destroy", "sched", "scheduler");
        return;
    }
    nt_optim *o = s->o;
    nt__hobj_free(s);
    nt__optim_release(o);
}
