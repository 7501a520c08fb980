/* fusion/exec.c - running one record: backend kernel, poison, errors.
 *
 * Called by stream workers (and inline in deterministic mode).  An op whose
 * input is poisoned is not run: its outputs carry the same error, so the
 * message that finally reaches the user names the op that failed first. */
#include <string.h>

#include "core/backend.h"
#include "core/internal.h"
#include "core/simtls.h"
#include "debug/debug.h"
#include "fusion/fusion.h"
#include "fusion/graph.h"
#include "streams/stream.h"

static void poison_outputs(nt__rec *r, nt__errobj *e)
{
    for (int i = 0; i < NT__MAX_OUT; i++) {
        nt_tensor *o = r->out[i];
        if (!o)
            continue;
        nt__errobj_ref(e);
        if (!AO_compare_and_swap_full(&o->st->poison, 0, (AO_t)e))
            nt__errobj_unref(e); /* already poisoned: keep the first */
    }
}

static nt__kernel_fn pick_kernel(const nt__rec *r)
{
    if (r->op < NT_OP_COUNT)
        return nt__backend_kernel(r->backend, r->op);
    if (r->op < NT_OP_CUSTOM_BASE)
        return NULL;
    /* A user op runs on the backend that has its kernel (a tile kernel has
     * only the simulator's), whichever backend the record names. */
    for (int b = 0; b < NT_BACKEND_COUNT; b++) {
        const nt__backend_i *be = nt__backends[(r->backend + b) % NT_BACKEND_COUNT];
        nt__kernel_fn k = be && be->custom_kernel ? be->custom_kernel(r->op) : NULL;
        if (k)
            return k;
    }
    return NULL;
}

/* Formats "<api> (at <site>): <msg>" into a new error object; an op issued
 * by a backward or by a composite says so: "nt_add (in nt_linear at ...)". */
nt__errobj *nt__rec_error(const nt__rec *r, int code, const char *msg)
{
    char where[NT__SITE_MAX];
    nt__site_format(&r->site, where, sizeof where);
    const char *api = nt__op_api(r->op);
    /* on the stack: an error must be reported with the host out of memory */
    char head[NT__SITE_MAX + 256], full[NT__ERRMSG_MAX];
    if (r->bwd_of)
        snprintf(head, sizeof head, "%s (in the backward of %s at %s): ", api, r->bwd_of, where);
    else if (r->fn && strcmp(r->fn, api) != 0)
        snprintf(head, sizeof head, "%s (in %s at %s): ", api, r->fn, where);
    else
        snprintf(head, sizeof head, "%s (at %s): ", api, where);
    nt__msg_join(full, sizeof full, head, msg, "");
    nt__errobj *e = nt__errobj_new(code, full);
    return e;
}

/* A tensor's block, taken now if deferred; false (kernel error set) if the
 * host is out of memory, or if its storage was released (the callers'
 * code stays NT_EHOSTMEM: the host refuses such a read before it is
 * queued, nt__check_resident, so this is only a guard). */
static bool ready(const nt_tensor *t)
{
    if (!t || __atomic_load_n(&t->st->data, __ATOMIC_ACQUIRE) || nt__storage_materialize(t->st))
        return true;
    if (__atomic_load_n(&t->st->gone, __ATOMIC_ACQUIRE)) /* the host refuses this first */
        return nt__kerr(NT_ESTATE, "the storage of a %s tensor was released (nt__mem_release) "
                        "and not refilled", nt_dtype_name((nt_dtype)t->dtype)), false;
    nt__kerr(NT_EHOSTMEM, "out of host memory for the %zu-byte storage of a %s tensor",
             t->st->nbytes, nt_dtype_name((nt_dtype)t->dtype));
    return false;
}

int nt__rec_materialize(const nt__rec *r)
{
    for (int i = 0; i < r->nin; i++)
        if (!ready(r->in[i]))
            return NT_EHOSTMEM;
    for (int i = 0; i < r->nout; i++)
        if (!ready(r->out[i]))
            return NT_EHOSTMEM;
    return 0;
}

int nt__tensors_materialize(nt_tensor *const *t, int n)
{
    for (int i = 0; i < n; i++)
        if (!ready(t[i]))
            return NT_EHOSTMEM;
    return 0;
}

/* A slot's reference, dropped if its storage is big and hostdead: then the
 * host never touches the handle again, so dropping it here costs no cache
 * line the host is writing, and the block goes back before the next op. */
static inline void drop_if_dead(nt_tensor **slot)
{
    nt_tensor *t = *slot;
    if (t && t->st->deferred && __atomic_load_n(&t->st->hostdead, __ATOMIC_ACQUIRE)) {
        *slot = NULL;
        nt__tensor_iunref(t);
    }
}

void nt__rec_drop_dead(nt__rec *r)
{
    if (r->type != NT_REC_OP)
        return;
    for (int i = 0; i < NT__MAX_IN; i++)
        drop_if_dead(&r->in[i]);
    for (int i = 0; i < NT__MAX_OUT; i++)
        drop_if_dead(&r->out[i]);
}

static double ready_max(nt_tensor *const *t, int n, double m)
{
    for (int i = 0; i < n; i++)
        if (t[i]) {
            double x = nt__storage_ready_get(t[i]->st);
            if (x > m)
                m = x;
        }
    return m;
}

void nt__sim_ready_begin(nt_tensor *const *in, int nin, nt_tensor *const *out, int nout)
{
    nt__tl_sim_after = ready_max(out, nout, ready_max(in, nin, 0.0));
    nt__tl_sim_end = -1.0;
}

void nt__sim_ready_end(nt_tensor *const *out, int nout)
{
    /* a kernel that ran consumed "after"; one that did not left it */
    double t = nt__tl_sim_end >= 0 ? nt__tl_sim_end : nt__tl_sim_after;
    nt__tl_sim_after = 0.0;
    for (int i = 0; i < nout; i++)
        if (out[i] && t > 0)
            nt__storage_ready_set(out[i]->st, t);
}

static void exec_rec(nt__rec *r);

void nt__exec_rec(nt__rec *r)
{
    exec_rec(r);
    if (nt__tl_recorder && !(r->flags & NT_RECF_NOCAPTURE))
        nt__capture_rec(nt__tl_recorder, r);
}

static void exec_rec(nt__rec *r)
{
    if (r->type == NT_REC_WAIT)
        return;
    if (r->type == NT_REC_HOST) {
        r->host_fn(r->host_arg);
        return;
    }
    for (int i = 0; i < r->nin; i++) {
        nt_tensor *t = r->in[i];
        nt__errobj *pe = t ? (nt__errobj *)AO_load_acquire(&t->st->poison) : NULL;
        if (pe) {
            poison_outputs(r, pe);
            NT__COUNT(ops_poisoned, 1);
            return;
        }
    }
    nt__kernel_fn k = pick_kernel(r);
    if (nt__rec_materialize(r) < 0) {
        nt__errobj *e = nt__rec_error(r, NT_EHOSTMEM, nt__kerr_msg());
        poison_outputs(r, e);
        if (r->stream)
            nt__stream_note_error(r->stream, e, r->seq);
        nt__errobj_unref(e);
        return;
    }
    if (NT__CFG(check_nan))
        nt__nan_pre(r);
    bool traced = nt__trace_enabled();
    double t0 = traced ? nt__htrace_now() : 0;
    nt__sim_ready_begin(r->in, r->nin, r->out, r->nout);
    int rc = k ? k(r)
               : nt__kerr(NT_ENOTSUP, "no kernel for op '%s' on the %s backend", nt__op_name(r->op),
                          nt__backends[r->backend]->name);
    nt__sim_ready_end(r->out, r->nout);
    NT__COUNT(ops_executed, 1);
    NT__COUNT(kernels, 1);
    if (rc >= 0 && NT__CFG(check_nan))
        rc = nt__nan_check(r);
    if (traced)
        nt__htrace_kernel(r, t0, rc);
    if (rc < 0) {
        nt__errobj *e = nt__rec_error(r, rc, nt__kerr_msg());
        poison_outputs(r, e);
        if (r->stream)
            nt__stream_note_error(r->stream, e, r->seq);
        nt__errobj_unref(e);
    }
}
