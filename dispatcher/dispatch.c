/* dispatcher/dispatch.c - validate, allocate, record, enqueue.  The hot path. */
#include "dispatcher/dispatch.h"
#include "fusion/graph.h"

#include <string.h>

#include "core/backend.h"
#include "core/ewise64.h"
#include "debug/debug.h"
#include "streams/stream.h"

nt__dispatch_hooks nt__dhooks;
_Thread_local const char *nt__tls_bwd_of NT_TLS_HOT;

/* Argument i's name from a names list ("x,?w,?b") into buf. */
static const char *arg_name(const char *names, int i, char *buf, size_t n)
{
    const char *p = names;
    for (int k = 0; k < i && *p; k++) {
        while (*p && *p != ',')
            p++;
        if (*p == ',')
            p++;
    }
    if (*p == '?')
        p++;
    size_t k = 0;
    while (*p && *p != ',' && k < n - 1)
        buf[k++] = *p++;
    buf[k] = '\0';
    return buf;
}

int nt__device_mismatch(const nt_site *site, const char *fn, const char *arg, int tdev,
                        int sdev)
{
    return nt__err(site, NT_EINVAL, fn,
                   "argument '%s' is on device %d but the current stream is on device %d "
                   "(an op's tensors must be on its stream's device: copy with nt_to_device, "
                   "or pick the stream with nt_device_set)",
                   arg, tdev, sdev);
}

bool nt__call_begin(nt__call *c, const nt_site *site, const char *fn, int op, int nin,
                    nt_tensor *const *in, const char *names)
{
    /* Not a whole memset: the output shape arrays (the bulk of the struct)
     * are written by each op's shape rule before anything reads them. */
    _Static_assert(sizeof c->p % 8 == 0, "nt__zero clears whole words");
    nt__zero(&c->p, sizeof c->p);
    nt__zero(c->in, sizeof c->in);
    nt__zero(c->out, sizeof c->out);
    nt__zero(c->tmp, sizeof c->tmp);
    c->dst = NULL;
    c->out_dev = -1;
    c->flops = 0;
    c->no_grad = false;
    c->site = site;
    c->fn = fn;
    c->op = op;
    c->nin = nin;
    c->names = names;
    c->nout = 1;
    c->bwd_of = nt__tls_bwd_of;
    if (!nt__ensure_init())
        return false;
    /* Every input live (a handle of an ended runtime reads NT__MAGIC_OLD:
     * this compare is its epoch check too) and on the device of the
     * stream the op goes to: both on the handle's first line. A released
     * storage (nt__mem_release) fails it too, looked at only while some
     * storage is released. */
    uint8_t dev = nt__stream_current()->dev;
    bool bad = false, other = false, any_rel = nt__any_released();
    for (int i = 0; i < nin; i++) {
        nt_tensor *t = in[i];
        c->in[i] = t;
        bad |= !t || t->magic != NT__MAGIC_LIVE || (any_rel && nt__storage_released(t->st));
        other |= t && t->dev != dev;
    }
    if (bad) {
        /* only now spell out the argument names, for the message */
        const char *p = names;
        for (int i = 0; i < nin; i++) {
            char name[32];
            bool optional = false;
            size_t k = 0;
            if (*p == '?')
                optional = true, p++;
            while (*p && *p != ',' && k < sizeof name - 1)
                name[k++] = *p++;
            name[k] = '\0';
            if (*p == ',')
                p++;
            if (optional && !in[i])
                continue;
            if (!nt__check_arg(site, fn, name, in[i]) ||
                !nt__check_resident(site, fn, name, in[i]))
                return false;
        }
    }
    if (other) {
        for (int i = 0; i < nin; i++)
            if (in[i] && in[i]->dev != dev) {
                char name[32];
                nt__device_mismatch(site, fn, arg_name(names, i, name, sizeof name),
                                    in[i]->dev, dev);
                return false;
            }
    }
    if (nt__dhooks.amp_on_call && nt__dhooks.amp_on_call(c) < 0)
        return false;
    return true;
}

static bool logged_fallback[NT_OP_COUNT], logged_f64[NT_OP_COUNT];

/* -1: every operand of a dtype the simulator's engines have; else the
 * index of the first other input, or nin for such an output */
static int offdev_operand(const nt__call *c)
{
    for (int i = 0; i < c->nin; i++)
        if (c->in[i] && !nt__dtype_on_device((nt_dtype)c->in[i]->dtype))
            return i;
    for (int i = 0; i < c->nout; i++)
        if (!nt__dtype_on_device(c->odt[i]))
            return c->nin;
    return -1;
}

/* -1: every operand of a dtype every op takes (nt__dtype_all_ops); else
 * the index of the first other input, or nin for such an output */
static int restricted_operand(const nt__call *c)
{
    for (int i = 0; i < c->nin; i++)
        if (c->in[i] && !nt__dtype_all_ops((nt_dtype)c->in[i]->dtype))
            return i;
    for (int i = 0; i < c->nout; i++)
        if (!nt__dtype_all_ops(c->odt[i]))
            return c->nin;
    return -1;
}

/* The one refusal of an fp8 operand (check_dtypes, nt__no_fp8): "`what` is
 * e4m3, which `by` does not take`where` (fp8 is a storage dtype: `takes`cast
 * with nt_cast first, ...)"; NT_ENOTSUP. */
static int fp8_refused(const nt_site *site, const char *fn, const char *what, nt_dtype dt,
                       const char *by, const char *where, const char *takes)
{
    return nt__err(site, NT_ENOTSUP, fn,
                   "%s is %s, which %s does not take%s (fp8 is a storage dtype: %scast with "
                   "nt_cast first, multiply with nt_matmul_fp8; docs/ops.md, \"fp8\")",
                   what, nt_dtype_name(dt), by, where, takes);
}

/* An f64, i64, bool or fp8 operand of an op that does not take it there
 * (core/ewise64.h's lists): NT_ENOTSUP naming the function, the argument
 * and the dtypes the op takes, before anything is allocated (no kernel ever
 * reads data of a dtype it does not know).  User ops (custom kernels) see
 * every dtype.  One scan in the common case: every op takes every dtype
 * the device has but fp8 (nt__dtype_op_ok), so only an off-device or fp8
 * operand is looked at further; c->offdev keeps the off-device scan's
 * answer for choose_backend. */
static int check_dtypes(nt__call *c)
{
    int r = restricted_operand(c);
    c->offdev = r < 0 ? -1 : offdev_operand(c);
    if (r < 0 || c->op >= NT_OP_COUNT)
        return 0;
    int k = -1;
    nt_dtype dt = NT_F32;
    for (int i = 0; i < c->nin && k < 0; i++)
        if (c->in[i] && !nt__dtype_op_ok((nt_dtype)c->in[i]->dtype, c->op, i))
            k = i, dt = (nt_dtype)c->in[i]->dtype;
    for (int i = 0; i < c->nout && k < 0; i++)
        if (!nt__dtype_op_ok(c->odt[i], c->op, -1))
            k = c->nin, dt = c->odt[i];
    if (k < 0)
        return 0;
    char name[32];
    if (k < c->nin && c->names)
        arg_name(c->names, k, name, sizeof name);
    else
        snprintf(name, sizeof name, "%s", k < c->nin ? "input" : "the result");
    const char *takes = (nt__ops[c->op].flags & NT_OPF_INT) ? "f32, bf16, f16, i32 or u8"
                                                            : "f32, bf16 or f16";
    if (nt__dtype_is_fp8(dt)) {
        char op[64], tk[64];
        snprintf(op, sizeof op, "op '%s'", nt__op_name(c->op));
        snprintf(tk, sizeof tk, "it takes %s; ", takes);
        return fp8_refused(c->site, c->fn, name, dt, op, " there", tk);
    }
    return nt__err(c->site, NT_ENOTSUP, c->fn,
                   "%s is %s, which op '%s' does not take there (it takes %s; the ops that "
                   "take f64, i64 and bool are listed in docs/ops.md, section 14)",
                   name, nt_dtype_name(dt), nt__op_name(c->op), takes);
}

bool nt__no_fp8(const nt_site *site, const char *fn, const char *arg, const nt_tensor *t)
{
    if (!nt__dtype_is_fp8((nt_dtype)t->dtype))
        return true;
    char what[64];
    snprintf(what, sizeof what, "argument '%s'", arg);
    fp8_refused(site, fn, what, (nt_dtype)t->dtype, fn, "", "");
    return false;
}

static int choose_backend(nt__call *c, uint8_t *backend)
{
    *backend = NT_BACKEND_CPU;
    uint8_t want = (uint8_t)NT__CFG(backend);
    if (want == NT_BACKEND_CPU)
        return 0;
    /* What the backend cannot run goes to the CPU backend (the reference
     * runs every op), or is refused under NT_REQUIRE_SIM (core/backend.h). */
    const nt__backend_i *be = nt__backends[want];
    bool ok = be && nt__backend_can(be, c->op, &c->p);
    int k = ok && want == NT_BACKEND_SIM ? c->offdev : -1;
    if (k >= 0) {
        /* The NeuronCore has no f64 or i64 datapath, and the simulator's
         * kernels know u8 masks, not bool (docs/sim.md): such ops run on
         * the CPU backend, counted as fallbacks, or are refused. */
        const char *dn = nt_dtype_name(k < c->nin ? (nt_dtype)c->in[k]->dtype : c->odt[0]);
        for (int i = 0; i < c->nout && k >= c->nin; i++)
            if (!nt__dtype_on_device(c->odt[i]))
                dn = nt_dtype_name(c->odt[i]);
        if (NT__CFG(require_sim))
            return nt__err(c->site, NT_ENOTSUP, c->fn,
                           "op '%s' on %s tensors: the simulated NeuronCore has no %s "
                           "datapath and NT_REQUIRE_SIM=1 forbids the CPU fallback",
                           nt__op_name(c->op), dn, dn);
        if (c->op < NT_OP_COUNT &&
            !__atomic_exchange_n(&logged_f64[c->op], true, __ATOMIC_RELAXED))
            nt__log(NT__LOG_WARN, "op '%s' on %s tensors runs on the CPU backend (the "
                    "simulated NeuronCore has no %s datapath)", nt__op_name(c->op), dn, dn);
        NT__COUNT(cpu_fallbacks, 1);
        return 0;
    }
    if (!ok) {
        const char *name = want == NT_BACKEND_SIM ? "simulator" : be ? be->name : "?";
        if (NT__CFG(require_sim))
            return nt__err(c->site, NT_ENOTSUP, c->fn,
                           "op '%s' has no %s kernel (for these sizes or parameters) and "
                           "NT_REQUIRE_SIM=1 forbids the CPU fallback",
                           nt__op_name(c->op), name);
        if (c->op < NT_OP_COUNT &&
            !__atomic_exchange_n(&logged_fallback[c->op], true, __ATOMIC_RELAXED)) {
            nt__log(NT__LOG_WARN, "op '%s' has no %s kernel (for these sizes or parameters); "
                    "it runs on the CPU backend", nt__op_name(c->op), name);
        }
        NT__COUNT(cpu_fallbacks, 1);
        return 0;
    }
    if (c->flops < NT__CFG(min_sim_flops)) {
        NT__COUNT(cpu_fallbacks, 1);
        return 0;
    }
    *backend = want;
    return 0;
}

static nt_tensor *dispatch_inner(nt__call *c);

/* Adds r's wait for (stream, seq) `packed`, if on another stream and not
 * yet run, once per writer: an op that reads one tensor twice, or two
 * tensors of one producer, waits once. */
static void add_dep(nt__rec *r, nt_stream *s, uint64_t packed)
{
    if (!packed || NT__PACK_SID(packed) == s->id || nt__packed_done(packed))
        return;
    for (int i = 0; i < r->ndeps; i++)
        if (r->deps[i] == packed)
            return;
    if (r->ndeps < (int)G_N_ELEMENTS(r->deps))
        r->deps[r->ndeps++] = packed;
    else
        nt__wait_packed(packed); /* more than fit: wait here, rare */
}

/* Was (stream, seq) `packed` on a stream other than s? */
static inline bool other_stream(uint64_t packed, const nt_stream *s)
{
    return packed && NT__PACK_SID(packed) != s->id;
}

/* nt__rec_enqueue, inlined into the dispatcher's hot path (a call there
 * is a few ns of every op). */
static inline __attribute__((always_inline)) uint64_t rec_enqueue(nt__rec *r, nt_stream **sp,
                                                                  bool run_here)
{
    nt_stream *s = *sp;
    for (int i = 0; i < r->nin; i++) {
        nt_tensor *t = r->in[i];
        if (!t)
            continue;
        uint64_t lw = AO_load(&t->st->last_write);
        add_dep(r, s, lw);
        if (other_stream(lw, s) || other_stream(AO_load(&t->st->last_read), s))
            __atomic_store_n(&t->st->xstream, 1, __ATOMIC_RELAXED); /* not one stream's to lend */
    }
    if (r->flags & NT_RECF_INPLACE) {
        /* Write after read/write on other streams. */
        nt__storage *st = r->out[0]->st;
        uint64_t lw = AO_load(&st->last_write), lr = AO_load(&st->last_read);
        add_dep(r, s, lw);
        add_dep(r, s, lr);
        if (other_stream(lw, s) || other_stream(lr, s))
            __atomic_store_n(&st->xstream, 1, __ATOMIC_RELAXED);
        AO_fetch_and_add1(&st->version);
    }

    /* May move the op to the default stream if s was destroyed meanwhile
     * (stream.h); the deps skipped above as s's own have all run then. */
    uint64_t seq = nt__stream_next_seq(sp);
    if (*sp != s) {
        s = *sp;
        nt__rec_drop_deps_on(r, s);
    }
    r->seq = seq;
    r->sid = s->id;
    if (nt__capturing())
        nt__capture_note(r);
    uint64_t packed = NT__PACK(s->id, seq);
    for (int i = 0; i < r->nin; i++)
        if (r->in[i])
            AO_store(&r->in[i]->st->last_read, packed);
    for (int i = 0; i < r->nout; i++)
        AO_store_release(&r->out[i]->st->last_write, packed);
    NT__COUNT(ops_enqueued, 1);
    if (nt__trace_enabled())
        nt__htrace_enqueue(r, s); /* before the worker may recycle r */

    if (run_here) {
        for (int d = 0; d < r->ndeps; d++)
            nt__wait_packed(r->deps[d]);
        nt__stream_run_inline(s, r);
    } else {
        nt__stream_enqueue(s, r);
    }
    return seq;
}

uint64_t nt__rec_enqueue(nt__rec *r, nt_stream **sp, bool run_here)
{
    return rec_enqueue(r, sp, run_here);
}

static void release_tmp(nt__call *c)
{
    if (!((uintptr_t)c->tmp[0] | (uintptr_t)c->tmp[1] | (uintptr_t)c->tmp[2] |
          (uintptr_t)c->tmp[3]))
        return; /* the usual case: no cast was made */
    _Static_assert(NT__MAX_IN == 4, "the test above reads every slot");
    for (int i = 0; i < NT__MAX_IN; i++)
        if (c->tmp[i]) {
            nt_release(c->tmp[i]);
            c->tmp[i] = NULL;
        }
}

nt_tensor *nt__call_fail(nt__call *c)
{
    release_tmp(c);
    return NULL;
}

nt_tensor *nt__dispatch_view(nt__call *c, nt_tensor *v)
{
    if (!v)
        return nt__call_fail(c);
    c->out[0] = v;
    /* (a no_grad call records nothing; autograd sees it to refuse one that a
     * create_graph backward would need to differentiate) */
    if (nt__dhooks.ag_on_dispatch && nt__dhooks.ag_on_dispatch(c) < 0) {
        nt_release(v);
        return nt__call_fail(c);
    }
    release_tmp(c);
    return nt__scope_adopt(v, c->fn);
}

nt_tensor *nt__empty_for_stream(const nt_site *site, const char *fn, nt_dtype dt, int ndim,
                                const int64_t *shape, int dev)
{
    nt_stream *s = nt__stream_current();
    /* a stream lends only its own device's bytes */
    nt__alloc_sid = s->dev == dev ? s->id : 0;
    nt__alloc_dev = (uint8_t)dev;
    nt_tensor *t = nt__tensor_empty(dt, ndim, shape, site, fn);
    nt__alloc_sid = 0;
    nt__alloc_dev = 0;
    return t;
}

nt_tensor *nt__dispatch(nt__call *c)
{
    nt_tensor *r = dispatch_inner(c);
    release_tmp(c);
    return r;
}

static nt_tensor *dispatch_inner(nt__call *c)
{
    uint8_t backend;
    if (check_dtypes(c) < 0 || choose_backend(c, &backend) < 0)
        return NULL;

    /* The record's references on its inputs, taken first: a locked
     * increment waits for every earlier store to leave the store buffer,
     * and here, before the new handle and record are written, there are
     * none to wait for. */
    for (int i = 0; i < c->nin; i++)
        if (c->in[i])
            nt__tensor_iref(c->in[i]);

    /* Outputs, for an op of stream s: they may take memory that s's queued
     * ops are about to give back (core/arena.c); on s's device, or the one
     * the call asks for (nt_to_device). */
    nt_stream *s = nt__stream_current();
    if ((AO_load(&s->capture) || nt__capturing()) &&
        nt__capture_check_stream(c->site, c->fn, s) < 0) {
        for (int i = 0; i < c->nin; i++)
            if (c->in[i])
                nt__tensor_iunref(c->in[i]);
        return NULL;
    }
    if (c->dst && c->dst->dev != s->dev && c->out_dev < 0) {
        nt__device_mismatch(c->site, c->fn, "out", c->dst->dev, s->dev);
        for (int i = 0; i < c->nin; i++)
            if (c->in[i])
                nt__tensor_iunref(c->in[i]);
        return NULL;
    }
    int nout = c->dst ? 1 : c->nout;
    nt__alloc_sid = s->id;
    nt__alloc_dev = c->out_dev >= 0 ? (uint8_t)c->out_dev : s->dev;
    for (int i = 0; i < nout; i++) {
        if (c->dst) {
            c->out[0] = c->dst;
            break;
        }
        c->out[i] = nt__tensor_empty(c->odt[i], c->ondim[i], c->oshape[i], c->site, c->fn);
        if (!c->out[i]) {
            nout = i; /* the ones made so far */
            nt__alloc_sid = 0;
            nt__alloc_dev = 0;
            goto fail_out;
        }
    }
    nt__alloc_sid = 0;
    nt__alloc_dev = 0;

    /* The record before autograd: once autograd has recorded the node (an
     * in-place op's replaces dst's history) nothing may fail. */
    nt__rec *r = nt__rec_alloc(s);
    if (!r) {
        nt__err_hostmem(c->site, c->fn, "an op record");
        goto fail_out;
    }

    /* Autograd records the node (and refuses bad in-place writes). */
    /* (a no_grad call records nothing; autograd sees it to refuse one that a
     * create_graph backward would need to differentiate) */
    if (nt__dhooks.ag_on_dispatch && nt__dhooks.ag_on_dispatch(c) < 0) {
        nt__rec_unalloc(r);
        goto fail_out;
    }
    r->type = NT_REC_OP;
    r->op = (uint16_t)c->op;
    r->nin = (uint8_t)c->nin;
    r->nout = (uint8_t)nout;
    r->backend = backend;
    r->p = c->p;
    r->site = c->site ? *c->site : (nt_site){0};
    r->bwd_of = c->bwd_of;
    r->fn = c->fn;
    if (c->dst)
        r->flags |= NT_RECF_INPLACE;
    for (int i = 0; i < c->nin; i++)
        r->in[i] = c->in[i]; /* their references were taken above */
    for (int i = 0; i < nout; i++) {
        if (c->dst)
            nt__tensor_iref(c->out[i]);
        else
            c->out[i]->irefs++; /* a fresh handle no other thread knows yet */
        r->out[i] = c->out[i];
    }
    rec_enqueue(r, &s, NT__CFG(mode) == NT_MODE_DETERMINISTIC);

    if (c->dst)
        return c->dst;
    /* The op is queued whatever happens now; an output the scope has no
     * room for is released (its value is never read) and the call fails. */
    bool adopted = true;
    for (int i = 0; i < nout; i++)
        adopted &= nt__scope_adopt(c->out[i], c->fn) != NULL;
    return adopted ? c->out[0] : NULL;

fail_out:
    if (!c->dst)
        for (int i = 0; i < nout; i++)
            nt_release(c->out[i]);
    for (int i = 0; i < c->nin; i++)
        if (c->in[i])
            nt__tensor_iunref(c->in[i]);
    return NULL;
}

nt_tensor *nt__make_view(nt_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                         int64_t offset, const nt_site *site)
{
    nt_tensor *v = nt__tensor_new(t->st, (nt_dtype)t->dtype, ndim, shape, stride, offset, site);
    if (!v)
        nt__err_hostmem(site, "nt_view", "a tensor handle");
    return v;
}
