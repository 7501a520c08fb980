/* amp/scaler.c - the dynamic loss scaler (PyTorch's GradScaler).
 *
 * f16 keeps 5 exponent bits: gradients below 2^-24 flush to zero.  The
 * scaler multiplies the loss by `scale` (2^16 at first) so the gradients
 * backward computes are scaled too, then divides them by it before the
 * optimizer uses them.  A step whose gradients overflowed (Inf or NaN) is
 * skipped and the scale halves; after `growth_interval` clean steps in a row
 * it doubles.
 *
 * The check costs one fused kernel per gradient, one small sum and one
 * sync: each gradient, viewed as rows of its last dim, is unscaled in place
 * and, in the same row kernel, summed times zero (g * 0 is +-0 for a finite
 * g and NaN for Inf or NaN, so a row sum is NaN exactly when the row holds
 * one) into its slice of a buffer of all the row flags; one sum of the
 * buffer is read.
 *
 * Concurrency: a mutex per scaler; its functions may be called from any
 * thread.  The gradients are the optimizer's parameters' .grads: the caller
 * orders other threads' work on them, as for nt_optim_step. */
#include "amp/amp.h"

#include <math.h>

#include "autograd/autograd.h"
#include "autograd/optim.h"
#include "core/handle.h"
#include "debug/debug.h"

#define SCALER_MAGIC 0x53434c52u /* "SCLR" */
/* The most skipped steps counted (2^53, as an optimizer's step count): a
 * checkpoint past it is refused, and the count stops there. */
#define SCALER_MAX_COUNT ((int64_t)1 << 53)

struct nt_grad_scaler {
    NT__HOBJ_HEAD; /* core/handle.h: its memory outlives it */
    GMutex lock;
    nt__scaler_state st;
    nt_optim *unscaled; /* gradients of this optimizer are unscaled already */
    bool found_inf;     /* since the last update */
    bool stepped;       /* a step or unscale ran since the last update */
    bool did_step;      /* nt_grad_scaler_step ran since the last update */
    nt_tensor *flagbuf; /* f32 [rows, 1]: every gradient's row flags, reused */
};

bool nt__scaler_ok(nt_grad_scaler *s, const char *fn)
{
    if (!nt__ensure_init())
        return false;
    return nt__hobj_check(s, SCALER_MAGIC, NULL, fn, "scaler", "nt_grad_scaler") == 0;
}

bool nt__scaler_state_valid(const nt__scaler_state *st, char *why, size_t whylen)
{
    if (!(isfinite(st->scale) && st->scale > 0))
        snprintf(why, whylen, "scale %g is not a finite value > 0", st->scale);
    else if (!(isfinite(st->growth_factor) && st->growth_factor > 1))
        snprintf(why, whylen, "growth_factor %g is not a finite value > 1", st->growth_factor);
    else if (!(st->backoff_factor > 0 && st->backoff_factor < 1))
        snprintf(why, whylen, "backoff_factor %g is not in (0, 1)", st->backoff_factor);
    else if (st->growth_interval < 1)
        snprintf(why, whylen, "growth_interval %lld is < 1", (long long)st->growth_interval);
    else if (st->growth_tracker < 0 || st->growth_tracker >= st->growth_interval)
        snprintf(why, whylen, "growth tracker %lld is outside [0, growth_interval)",
                 (long long)st->growth_tracker);
    else if (st->skipped_steps < 0 || st->skipped_steps > SCALER_MAX_COUNT)
        snprintf(why, whylen, "skipped steps %lld is outside [0, 2^53]",
                 (long long)st->skipped_steps);
    else
        return true;
    return false;
}

void nt__scaler_get_state(nt_grad_scaler *s, nt__scaler_state *out)
{
    g_mutex_lock(&s->lock);
    *out = s->st;
    g_mutex_unlock(&s->lock);
}

void nt__scaler_set_state(nt_grad_scaler *s, const nt__scaler_state *st)
{
    g_mutex_lock(&s->lock);
    s->st = *st;
    s->unscaled = NULL;
    s->found_inf = false;
    s->stepped = false;
    s->did_step = false;
    g_mutex_unlock(&s->lock);
}

NT_API nt_grad_scaler *nt_grad_scaler_create(const nt_grad_scaler_opts *opts)
{
    const char *fn = "nt_grad_scaler_create";
    if (!nt__ensure_init())
        return NULL;
    nt_grad_scaler_opts o = {65536.0, 2.0, 0.5, 2000};
    if (opts)
        o = *opts;
    nt__scaler_state st = {o.init_scale, o.growth_factor, o.backoff_factor, o.growth_interval,
                           0, 0};
    char why[160];
    if (!nt__scaler_state_valid(&st, why, sizeof why)) {
        nt__err(NULL, NT_EINVAL, fn, "bad option: %s", why);
        return NULL;
    }
    nt_grad_scaler *s = nt__hobj_new(sizeof *s, SCALER_MAGIC);
    if (!s) {
        nt__err_hostmem(NULL, fn, "the scaler");
        return NULL;
    }
    g_mutex_init(&s->lock);
    s->st = st;
    return s;
}

NT_API void nt_grad_scaler_destroy(nt_grad_scaler *s)
{
    if (!s)
        return;
    if (!nt__hobj_live(s, SCALER_MAGIC)) { /* the error: destroyed already, ... */
        nt__hobj_check(s, SCALER_MAGIC, NULL, "nt_grad_scaler_destroy", "s", "nt_grad_scaler");
        return;
    }
    if (s->flagbuf && nt__hobj_current(s)) /* else it went with nt_shutdown */
        nt_release(s->flagbuf);
    g_mutex_clear(&s->lock);
    nt__hobj_free(s);
}

NT_API nt_tensor *nt_grad_scaler_scale(nt_grad_scaler *s, nt_tensor *loss)
{
    const char *fn = "nt_grad_scaler_scale";
    if (!nt__scaler_ok(s, fn))
        return NULL;
    g_mutex_lock(&s->lock);
    double scale = s->st.scale;
    g_mutex_unlock(&s->lock);
    const nt_site *site = NT_RA_SITE;
    if (!nt__check_arg(site, fn, "loss", loss))
        return NULL;
    /* A bf16/f16 loss is scaled in f32 (2^16 times an f16 loss would
     * overflow), as PyTorch's f32 scale promotes it. */
    nt_scope *sc = nt_scope_begin();
    if (!sc) {
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt__amp_suspend();
    nt_tensor *l = nt__dtype_is_float((nt_dtype)loss->dtype) && loss->dtype != NT_F32
                       ? nt__copy_to(site, fn, loss, NT_F32)
                       : loss;
    nt_tensor *y = l ? nt__scalar(site, fn, NT_OP_MUL_SCALAR, l, scale, 0) : NULL;
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(sc);
    nt__amp_resume();
    return y ? nt__scope_adopt(y, fn) : NULL;
}

/* Rows of the [rows, cols] view the check uses for gradient g. */
static int64_t flag_rows(const nt_tensor *g)
{
    int64_t n = nt__numel(g->ndim, g->shape);
    int64_t cols = g->ndim ? g->shape[g->ndim - 1] : 1;
    if (n == 0)
        return 0;
    return nt__is_contig(g) ? n / cols : 1;
}

/* Queues the unscale-and-check of one gradient: g /= scale in place, and
 * into `dst` ([flag_rows(g), 1] f32) the sums of g * 0 over its rows -- one
 * row kernel, the intermediates never leave the chip.  The kernel runs on
 * g's device; flags made there are copied to dst's (the calling thread's)
 * when the gradients are spread over devices.  Returns 0 or an error. */
static int unscale_one(const nt_site *site, const char *fn, nt_tensor *g, double inv,
                       nt_tensor *dst)
{
    int64_t n = nt__numel(g->ndim, g->shape);
    int64_t cols = g->ndim ? g->shape[g->ndim - 1] : 1;
    if (n == 0)
        return 0;
    /* the intermediates die as soon as their consumers are queued: the
     * fusion engine then keeps them on chip */
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, fn, "a scope");
    nt__devsw dv;
    nt__dev_enter(&dv, g->dev);
    nt_tensor *flags;
    if (nt__is_contig(g)) {
        /* the view of a contiguous .grad as rows of its last dim is free */
        nt_tensor *rows = nt_reshape_at(site, g, 2, (int64_t[]){n / cols, cols});
        flags = rows && nt_mul_scalar_inplace_at(site, rows, inv) == 0
                    ? nt__reduce(site, fn, NT_OP_SUM,
                                 nt__scalar(site, fn, NT_OP_MUL_SCALAR, rows, 0.0, 0), 1, true)
                    : NULL;
    } else {
        flags = nt_mul_scalar_inplace_at(site, g, inv) == 0
                    ? nt__reduce(site, fn, NT_OP_SUM,
                                 nt__scalar(site, fn, NT_OP_MUL_SCALAR, g, 0.0, 0), NT_DIM_ALL,
                                 true)
                    : NULL;
        flags = flags ? nt_reshape_at(site, flags, 2, (int64_t[]){1, 1}) : NULL;
    }
    if (flags && flags->dev != dst->dev)
        flags = nt_to_device_at(site, flags, dst->dev);
    nt__dev_leave(&dv);
    int rc = flags ? nt_copy_into_at(site, dst, flags) : nt_last_error();
    nt_scope_end(sc);
    return rc;
}

/* Unscales every .grad of opt and reads the combined flag with one sync:
 * each gradient's row flags go into its slice of one buffer, which one sum
 * reduces.  Called with s->lock held.  Returns 1 (overflow), 0 or an
 * error. */
static int unscale_locked(nt_grad_scaler *s, nt_optim *opt, const nt_site *site,
                          const char *fn)
{
    if (s->unscaled == opt)
        return nt__err(NULL, NT_ESTATE, fn,
                       "the gradients of this optimizer were unscaled already since the last "
                       "nt_grad_scaler_update");
    double inv = 1.0 / s->st.scale;
    int np = nt__optim_nparams(opt);
    int64_t total = 0;
    for (int i = 0; i < np; i++) {
        nt_tensor *p = nt__optim_param(opt, i);
        if (p->ag && p->ag->grad)
            total += flag_rows(p->ag->grad);
    }
    int rc = 0;
    double v = 0;
    nt__amp_suspend();
    nt_no_grad_begin();
    if (total > 0 && (!s->flagbuf || s->flagbuf->shape[0] != total)) {
        if (s->flagbuf)
            nt_release(s->flagbuf);
        s->flagbuf = nt_zeros_at(site, NT_F32, 2, (int64_t[]){total, 1});
        if (s->flagbuf)
            nt_keep(s->flagbuf);
        else
            rc = nt_last_error();
    }
    nt_scope *sc = rc ? NULL : nt_scope_begin();
    if (!rc && !sc)
        rc = nt__err_hostmem(site, fn, "a scope");
    int64_t off = 0;
    for (int i = 0; i < np && !rc && total > 0; i++) {
        nt_tensor *p = nt__optim_param(opt, i);
        if (!p->ag || !p->ag->grad)
            continue;
        int64_t r = flag_rows(p->ag->grad);
        if (r == 0)
            continue;
        nt_tensor *dst = nt_slice_at(site, s->flagbuf, 0, off, off + r, 1);
        rc = dst ? unscale_one(site, fn, p->ag->grad, inv, dst) : nt_last_error();
        off += r;
    }
    if (!rc && total > 0) {
        nt_tensor *sum = nt__reduce(site, fn, NT_OP_SUM, s->flagbuf, NT_DIM_ALL, false);
        rc = sum ? nt_item_at(site, sum, &v) : nt_last_error();
    }
    if (sc)
        nt_scope_end(sc);
    nt_no_grad_end();
    nt__amp_resume();
    if (rc)
        return nt__err_within(fn); /* an inner op's error: say whose */
    s->unscaled = opt;
    s->stepped = true;
    bool inf = !isfinite(v);
    s->found_inf |= inf;
    return inf ? 1 : 0;
}

static bool opt_arg(nt_optim *opt, const char *fn)
{
    return nt__optim_ok(opt, fn);
}

NT_API int nt_grad_scaler_unscale(nt_grad_scaler *s, nt_optim *opt)
{
    const char *fn = "nt_grad_scaler_unscale";
    if (!nt__scaler_ok(s, fn) || !opt_arg(opt, fn))
        return nt_last_error();
    g_mutex_lock(&s->lock);
    int rc = unscale_locked(s, opt, NT_RA_SITE, fn);
    g_mutex_unlock(&s->lock);
    return rc;
}

NT_API int nt_grad_scaler_step(nt_grad_scaler *s, nt_optim *opt)
{
    const char *fn = "nt_grad_scaler_step";
    if (!nt__scaler_ok(s, fn) || !opt_arg(opt, fn))
        return nt_last_error();
    const nt_site *site = NT_RA_SITE;
    g_mutex_lock(&s->lock);
    int rc = 0;
    bool inf = false;
    if (s->did_step)
        rc = nt__err(NULL, NT_ESTATE, fn,
                     "nt_grad_scaler_step ran already since the last nt_grad_scaler_update");
    else if (s->unscaled == opt)
        inf = s->found_inf;
    else if ((rc = unscale_locked(s, opt, site, fn)) == 1)
        inf = true, rc = 0;
    if (!rc) {
        s->did_step = true;
        if (inf) {
            if (s->st.skipped_steps < SCALER_MAX_COUNT) /* a count, never an overflow */
                s->st.skipped_steps++;
            rc = 1;
        }
    }
    g_mutex_unlock(&s->lock);
    if (rc == 1)
        nt__htrace_step(); /* a skipped step is a step of NT_TRACE_STEPS too */
    if (rc != 0)
        return rc;
    nt__amp_suspend();
    rc = nt_optim_step_at(site, opt);
    nt__amp_resume();
    return rc < 0 ? nt__err_within(fn) : rc;
}

NT_API int nt_grad_scaler_update(nt_grad_scaler *s)
{
    const char *fn = "nt_grad_scaler_update";
    if (!nt__scaler_ok(s, fn))
        return nt_last_error();
    g_mutex_lock(&s->lock);
    int rc = 0;
    if (!s->stepped) {
        rc = nt__err(NULL, NT_ESTATE, fn,
                     "no nt_grad_scaler_step or nt_grad_scaler_unscale ran since the last "
                     "update: nothing to adapt the scale to");
    } else if (s->found_inf) {
        s->st.scale *= s->st.backoff_factor;
        s->st.growth_tracker = 0;
    } else if (++s->st.growth_tracker >= s->st.growth_interval) {
        double grown = s->st.scale * s->st.growth_factor;
        if (isfinite(grown)) /* never grow past the doubles (PyTorch's f32 scale would) */
            s->st.scale = grown;
        s->st.growth_tracker = 0;
    }
    s->found_inf = false;
    s->stepped = false;
    s->did_step = false;
    s->unscaled = NULL;
    g_mutex_unlock(&s->lock);
    return rc;
}

NT_API double nt_grad_scaler_get_scale(nt_grad_scaler *s)
{
    if (!nt__scaler_ok(s, "nt_grad_scaler_get_scale"))
        return NAN;
    g_mutex_lock(&s->lock);
    double v = s->st.scale;
    g_mutex_unlock(&s->lock);
    return v;
}

NT_API int64_t nt_grad_scaler_skipped_steps(nt_grad_scaler *s)
{
    if (!nt__scaler_ok(s, "nt_grad_scaler_skipped_steps"))
        return nt_last_error();
    g_mutex_lock(&s->lock);
    int64_t v = s->st.skipped_steps;
    g_mutex_unlock(&s->lock);
    return v;
}

NT_API int64_t nt_grad_scaler_growth_tracker(nt_grad_scaler *s)
{
    if (!nt__scaler_ok(s, "nt_grad_scaler_growth_tracker"))
        return nt_last_error();
    g_mutex_lock(&s->lock);
    int64_t v = s->st.growth_tracker;
    g_mutex_unlock(&s->lock);
    return v;
}
