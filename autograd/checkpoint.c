/* autograd/checkpoint.c - gradient checkpointing (nt_checkpoint).
 *
 * The forward runs the user's block with graph recording off, so none of
 * its activations is saved: each dies as soon as nothing reads it (fusion
 * may never write it at all).  While it runs, every op that records nothing
 * hands its inputs here (nt__ckpt_capture, called by tape.c's hooks and by
 * user ops): the tensors that require grad among them can only come from
 * outside the block -- the explicit inputs and whatever the block reaches
 * through ctx, its parameters -- and each becomes an input edge of ONE node
 * (op NT__OP_CHECKPOINT), which saves the explicit inputs' values.
 *
 * nt_backward, on reaching that node, calls nt__ckpt_recompute: the block
 * runs again with grad on, on handles of the saved inputs whose graph
 * edges are the node's own, under the autocast state of the forward; the
 * recomputed nodes' edges out of the block are therefore the node's edges.
 * tape.c puts those nodes into the running pass where the node was
 * (ckpt_splice), so backward runs what it would have run without the
 * checkpoint, in the same order: gradients are bit-identical, parameters
 * reached through ctx included, and nested checkpoints recompute in turn.
 *
 * Concurrency: like the rest of the tape, a checkpoint belongs to the
 * thread that made it; the capture list is per thread. */
#include "autograd/autograd.h"
#include "fusion/graph.h"

#include <string.h>

_Static_assert(NT_CHECKPOINT_MAX_OUT <= NT__MAX_OUT, "a checkpoint node has NT__MAX_OUT outputs");

struct nt__ckpt {
    nt_checkpoint_fn fn;
    void *ctx;
    int n_in;           /* explicit inputs: the node's edges 0..n_in */
    int nsaved;         /* all its edges: explicit, then captured */
    nt_tensor **saved;  /* [nsaved] handles on their storage (version checks;
                           the explicit ones are the recompute's inputs) */
    uint64_t *ver;      /* [nsaved] storage versions at the forward */
    nt_dtype amp;       /* the autocast dtype of the forward (COUNT: none) */
    /* Any other per-thread state an op reads belongs here too, recorded in
     * nt_checkpoint_at and restored around the recompute (as amp is). */
    bool training;      /* nt_dropout's training mode at the forward */
    /* Deterministic (debug) mode: a checksum of each output's bytes at the
     * forward, compared with the recompute's (a block that is not
     * deterministic gives other values of the same shape). */
    bool summed;
    uint64_t sum[NT_CHECKPOINT_MAX_OUT];
};

/* The tensors a running block read, as the node's edges will be. */
typedef struct cap_list {
    nt__edge *e;
    nt_tensor **saved;
    uint64_t *ver;
    int n, cap;
    bool oom;
} cap_list;

_Thread_local bool nt__ckpt_capturing NT_TLS_HOT;
static _Thread_local cap_list *tls_cap;

static bool requires(const nt_tensor *t)
{
    return t && t->magic == NT__MAGIC_LIVE && t->ag && t->ag->requires_grad;
}

static bool cap_room(cap_list *c)
{
    if (c->n < c->cap)
        return true;
    int cap = c->cap ? c->cap * 2 : 16;
    nt__edge *e = realloc(c->e, (size_t)cap * sizeof *e);
    if (e)
        c->e = e;
    nt_tensor **s = realloc(c->saved, (size_t)cap * sizeof *s);
    if (s)
        c->saved = s;
    uint64_t *v = realloc(c->ver, (size_t)cap * sizeof *v);
    if (v)
        c->ver = v;
    if (!e || !s || !v)
        return false;
    c->cap = cap;
    return true;
}

/* Appends t (with its edge e, referenced here) to the list. */
static bool cap_add(cap_list *c, nt_tensor *t, nt__edge e)
{
    if (!cap_room(c))
        return false;
    nt_tensor *s = nt__save(t);
    if (!s)
        return false;
    if (e.node)
        AO_fetch_and_add1(&e.node->refs);
    c->e[c->n] = e;
    c->saved[c->n] = s;
    c->ver[c->n] = AO_load(&t->st->version);
    c->n++;
    return true;
}

static void cap_free(cap_list *c)
{
    for (int i = 0; i < c->n; i++) {
        nt__node_unref(c->e[i].node);
        nt_release(c->saved[i]);
    }
    free(c->e);
    free(c->saved);
    free(c->ver);
    memset(c, 0, sizeof *c);
}

void nt__ckpt_capture(nt_tensor *const *ts, int n)
{
    cap_list *c = tls_cap;
    if (!c)
        return;
    for (int i = 0; i < n; i++) {
        nt_tensor *t = ts[i];
        if (!requires(t))
            continue; /* made inside the block (no graph there), or a constant */
        nt__edge e = nt__edge_of(t);
        if (!e.node) {
            c->oom = true;
            continue;
        }
        bool seen = false;
        for (int k = c->n - 1; k >= 0 && !seen; k--)
            seen = c->e[k].node == e.node && c->e[k].idx == e.idx;
        if (!seen && !cap_add(c, t, e))
            c->oom = true;
    }
}

void nt__ckpt_drop_saved(struct nt__ckpt *ck)
{
    for (int i = 0; i < ck->nsaved; i++)
        if (ck->saved[i]) {
            nt_release(ck->saved[i]);
            ck->saved[i] = NULL;
        }
}

void nt__ckpt_free(struct nt__ckpt *ck)
{
    nt__ckpt_drop_saved(ck);
    free(ck->saved);
    free(ck->ver);
    free(ck);
}

/* Releases what fn left in outputs that the scope s does not own. */
static void drop_outputs(nt_tensor **outputs, int n_out, nt_scope *s)
{
    for (int j = 0; j < n_out; j++) {
        nt_tensor *t = outputs[j];
        if (t && t->magic == NT__MAGIC_LIVE && t->scope != s)
            nt_release(t);
        outputs[j] = NULL;
    }
}

/* After fn: each output a live tensor, owned by the caller (moved out of
 * the block's scope s).  `alias`: one that fn did not make inside s (an
 * input it passed through, say) is replaced by a new handle on the same
 * storage, so the checkpoint's node never rewrites another tensor's graph
 * state and the scope that owns the original keeps it. */
static int take_outputs(const nt_site *site, const char *api, nt_tensor **outputs, int n_out,
                        nt_scope *s, bool alias)
{
    for (int j = 0; j < n_out; j++)
        if (!outputs[j] || outputs[j]->magic != NT__MAGIC_LIVE) {
            int code = nt__err_or(NT_EINVAL);
            if (!nt_last_error())
                nt__err(site, code, api,
                        "the block returned 0 but outputs[%d] is %s; fn must set each of its "
                        "n_out outputs to a new reference", j, outputs[j] ? "released" : "NULL");
            return code;
        }
    for (int j = 0; j < n_out; j++) {
        nt_tensor *t = outputs[j];
        if (t->scope == s) {
            nt_keep(t);
        } else if (alias) {
            nt_tensor *v = nt__save(t);
            if (!v)
                return nt_last_error();
            nt_release(t);
            outputs[j] = v;
        }
    }
    return 0;
}

/* The block must hand back new references: an output that is an input, or
 * a tensor an outer scope owns, with no reference more than before fn ran
 * (refs0: the inputs' counts then) is the caller's own reference, which
 * taking the output would release.  Such outputs are cleared (not
 * released) and the error names them.  refs0 NULL: one reference each (the
 * recompute's fresh input handles). */
static int borrowed_outputs(const nt_site *site, const char *api, nt_tensor *const *inputs,
                            int n_in, const AO_t *refs0, nt_tensor **outputs, int n_out,
                            nt_scope *s)
{
    int rc = 0;
    bool bad[NT_CHECKPOINT_MAX_OUT] = {false};
    for (int j = 0; j < n_out; j++) {
        nt_tensor *t = outputs[j];
        if (!t || t->magic != NT__MAGIC_LIVE || t->scope == s)
            continue;
        AO_t now = AO_load(&t->refs), uses = 0;
        for (int k = 0; k < n_out; k++)
            uses += outputs[k] == t;
        int in = -1;
        for (int i = 0; i < n_in && in < 0; i++)
            if (inputs[i] == t)
                in = i;
        if (in >= 0 && now < (refs0 ? refs0[in] : 1) + uses) {
            bad[j] = true;
            if (!rc)
                rc = nt__err(site, NT_EINVAL, api,
                             "the block returned inputs[%d] as outputs[%d] without a new "
                             "reference (taking it would release the caller's); set "
                             "outputs[%d] = nt_retain(inputs[%d])", in, j, j, in);
        } else if (in < 0 && t->scope && now < 1 + uses) {
            bad[j] = true;
            if (!rc)
                rc = nt__err(site, NT_EINVAL, api,
                             "the block returned as outputs[%d] a tensor that an enclosing "
                             "scope owns, without a new reference (taking it would release "
                             "it); use nt_retain", j);
        }
    }
    for (int j = 0; j < n_out; j++)
        if (bad[j])
            outputs[j] = NULL; /* the caller's reference: not ours to release */
    return rc;
}

/* FNV-1a over the bytes of t's values (a sync point); false if they cannot
 * be read (a poisoned tensor: its own error comes at the user's sync) or
 * the host has no memory for the copy. */
static bool checksum(nt_tensor *t, uint64_t *out)
{
    size_t n = (size_t)nt__numel(t->ndim, t->shape) * nt_dtype_size((nt_dtype)t->dtype);
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return false;
    bool ok = nt_to_host_at(NULL, t, b, n) == 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; ok && i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    free(b);
    *out = h;
    return ok;
}

/* The forward's checksums, in deterministic mode (where reading the
 * outputs costs no wait: every op has run).  The thread's error is kept as
 * it was: a failed read only means no check. */
static void checksum_outputs(struct nt__ckpt *ck, nt_tensor **outputs, int n_out)
{
    /* a captured program cannot stop to read the device: no check there */
    if (NT__CFG(mode) != NT_MODE_DETERMINISTIC || nt__capturing())
        return;
    int code = nt_last_error();
    char msg[NT__ERRMSG_MAX];
    g_strlcpy(msg, nt_last_error_message(), sizeof msg);
    ck->summed = true;
    for (int j = 0; j < n_out && ck->summed; j++)
        ck->summed = checksum(outputs[j], &ck->sum[j]);
    nt__err_set(code, msg);
}

static bool meta_eq(const nt__tmeta *m, const nt_tensor *t)
{
    if (m->dtype != t->dtype || m->ndim != t->ndim)
        return false;
    for (int i = 0; i < m->ndim; i++)
        if (m->shape[i] != t->shape[i])
            return false;
    return true;
}

/* The node of a checkpoint whose block read the tensors of cap (which it
 * takes over) and made outputs. */
static int record(const nt_site *site, const char *api, cap_list *cap, nt_checkpoint_fn fn,
                  void *ctx, int n_in, nt_dtype amp, nt_tensor **outputs, int n_out)
{
    bool floats = false;
    for (int j = 0; j < n_out; j++)
        floats |= nt__dtype_is_float((nt_dtype)outputs[j]->dtype);
    bool edges = false;
    for (int i = 0; i < cap->n; i++)
        edges |= cap->e[i].node != NULL;
    if (!floats || !edges)
        return 0; /* no gradient can flow through it: a plain call */
    nt__node *n = nt__node_new(NT__OP_CHECKPOINT, cap->n, n_out);
    struct nt__ckpt *ck = n ? calloc(1, sizeof *ck) : NULL;
    if (!ck) {
        nt__node_unref(n);
        return nt__err_hostmem(site, api, "autograd's record of the checkpoint");
    }
    n->ckpt = ck;
    n->site = site ? *site : (nt_site){0};
    *ck = (struct nt__ckpt){fn, ctx, n_in, cap->n, cap->saved, cap->ver, amp, nt_is_training()};
    checksum_outputs(ck, outputs, n_out);
    for (int i = 0; i < cap->n; i++) {
        n->next[i] = cap->e[i]; /* the list's references move to the node */
        nt_tensor *t = cap->saved[i];
        n->in_meta[i].dtype = t->dtype;
        n->in_meta[i].ndim = t->ndim;
        memcpy(n->in_meta[i].shape, t->shape, sizeof t->shape);
    }
    free(cap->e);
    memset(cap, 0, sizeof *cap);
    for (int j = 0; j < n_out; j++) {
        nt_tensor *t = outputs[j];
        n->out_meta[j].dtype = t->dtype;
        n->out_meta[j].ndim = t->ndim;
        memcpy(n->out_meta[j].shape, t->shape, sizeof t->shape);
        if (nt__dtype_is_float((nt_dtype)t->dtype) && !nt__ag_of(t)) {
            nt__node_unref(n);
            return nt__err_hostmem(site, api, "autograd's state of an output");
        }
    }
    for (int j = 0; j < n_out; j++) {
        nt_tensor *t = outputs[j];
        if (!nt__dtype_is_float((nt_dtype)t->dtype))
            continue;
        AO_fetch_and_add1(&n->refs);
        t->ag->grad_fn = n; /* a fresh handle: it had none */
        t->ag->out_idx = j;
        t->ag->requires_grad = true;
    }
    nt__node_unref(n);
    return 0;
}

NT_API int nt_checkpoint_at(const nt_site *site, nt_checkpoint_fn fn, void *ctx,
                            nt_tensor *const *inputs, int n_in, nt_tensor **outputs, int n_out)
{
    const char *api = "nt_checkpoint";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!outputs)
        return nt__err(site, NT_EINVAL, api,
                       "argument 'outputs' is NULL; expected an array of n_out tensor pointers");
    if (n_out < 1 || n_out > NT_CHECKPOINT_MAX_OUT)
        return nt__err(site, NT_EINVAL, api, "argument 'n_out' is %d; expected 1..%d", n_out,
                       NT_CHECKPOINT_MAX_OUT);
    for (int j = 0; j < n_out; j++)
        outputs[j] = NULL;
    if (!fn)
        return nt__err(site, NT_EINVAL, api,
                       "argument 'fn' is NULL; expected the function that runs the block");
    if (n_in < 0 || n_in > NT_CHECKPOINT_MAX_IN)
        return nt__err(site, NT_EINVAL, api, "argument 'n_in' is %d; expected 0..%d", n_in,
                       NT_CHECKPOINT_MAX_IN);
    if (n_in > 0 && !inputs)
        return nt__err(site, NT_EINVAL, api,
                       "argument 'inputs' is NULL; expected an array of n_in = %d tensors", n_in);
    for (int i = 0; i < n_in; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        if (!nt__check_arg(site, api, arg, inputs[i]))
            return nt__err_or(NT_EINVAL);
    }

    bool graph = nt__ag_enabled();
    cap_list cap = {0};
    for (int i = 0; graph && i < n_in; i++) {
        nt__edge e = requires(inputs[i]) ? nt__edge_of(inputs[i]) : (nt__edge){NULL, 0};
        if ((requires(inputs[i]) && !e.node) || !cap_add(&cap, inputs[i], e)) {
            cap_free(&cap);
            return nt__err_hostmem(site, api, "the checkpoint's inputs");
        }
    }
    nt_scope *s = nt_scope_begin(); /* what the block makes and drops */
    if (!s) {
        cap_free(&cap);
        return nt__err_hostmem(site, api, "the block's scope");
    }
    /* the inputs' reference counts, to tell a passed-through input that fn
     * retained from one it did not (borrowed_outputs) */
    AO_t rbuf[16], *refs0 = n_in <= 16 ? rbuf : malloc((size_t)n_in * sizeof *refs0);
    if (!refs0) {
        cap_free(&cap);
        nt_scope_end(s);
        return nt__err_hostmem(site, api, "the inputs' reference counts");
    }
    for (int i = 0; i < n_in; i++)
        refs0[i] = AO_load(&inputs[i]->refs);
    nt_dtype amp = nt__dhooks.amp_active ? nt__dhooks.amp_active() : NT_DTYPE_COUNT;
    cap_list *prev = tls_cap;
    bool prevc = nt__ckpt_capturing;
    int ng = 0;
    if (graph) {
        ng = nt__ag_set_no_grad(1);
        tls_cap = &cap;
        nt__ckpt_capturing = true;
    }
    nt__user_code_begin();
    int rc = fn(ctx, inputs, n_in, outputs, n_out);
    nt__user_code_end();
    if (graph) {
        nt__ag_set_no_grad(ng);
        tls_cap = prev;
        nt__ckpt_capturing = prevc;
    }
    if (rc && !nt_last_error())
        nt__err(site, rc < 0 && rc >= NT_EHOSTMEM ? rc : NT_EINVAL, api,
                "the block (argument 'fn') returned %d without setting an error", rc);
    if (rc)
        rc = nt__err_within(api); /* the block's own error, as nt_checkpoint's */
    if (!rc)
        rc = borrowed_outputs(site, api, inputs, n_in, refs0, outputs, n_out, s);
    if (refs0 != rbuf)
        free(refs0);
    if (!rc)
        rc = take_outputs(site, api, outputs, n_out, s, true);
    if (!rc && cap.oom)
        rc = nt__err_hostmem(site, api, "the list of tensors the block read");
    if (!rc && graph)
        rc = record(site, api, &cap, fn, ctx, n_in, amp, outputs, n_out);
    cap_free(&cap);
    if (rc) {
        drop_outputs(outputs, n_out, s);
        nt_scope_end(s);
        return rc;
    }
    nt_scope_end(s);
    for (int j = 0; j < n_out; j++)
        if (!nt__scope_adopt(outputs[j], api)) { /* released it: the host is out of memory */
            outputs[j] = NULL;
            rc = nt_last_error();
        }
    if (rc)
        drop_outputs(outputs, n_out, NULL);
    return rc;
}

NT_API int nt_checkpoint(nt_checkpoint_fn fn, void *ctx, nt_tensor *const *inputs, int n_in,
                         nt_tensor **outputs, int n_out)
{
    return nt_checkpoint_at(NT_RA_SITE, fn, ctx, inputs, n_in, outputs, n_out);
}

/* The error of a failed recompute: nt_backward's, naming the checkpoint's
 * call site, with the block's own message inside. */
static int recompute_err(nt__node *n, int code, const char *fmt, const char *detail)
{
    char inner[512];
    g_strlcpy(inner, detail, sizeof inner);
    return nt__err(&n->site, code, "nt_backward", fmt, inner);
}

int nt__ckpt_recompute(nt__node *n, nt_tensor **outs)
{
    struct nt__ckpt *ck = n->ckpt;
    for (int i = 0; i < ck->nsaved; i++) {
        nt_tensor *t = ck->saved[i];
        if (!t)
            return nt__err(&n->site, NT_ESTATE, "nt_backward",
                           "the graph of nt_checkpoint was freed by an earlier nt_backward; "
                           "pass retain_graph = true the first time");
        if (AO_load(&t->st->version) != ck->ver[i]) {
            char what[64];
            if (i < ck->n_in)
                snprintf(what, sizeof what, "inputs[%d]", i);
            else
                snprintf(what, sizeof what, "a tensor that the block reads through ctx");
            return nt__err(&n->site, NT_EVERSION, "nt_backward",
                           "%s of nt_checkpoint was modified in place after the forward pass; "
                           "recomputing the block would not give its activations", what);
        }
    }
    nt_tensor *hbuf[16] = {0};
    nt_tensor **h = ck->n_in <= 16 ? hbuf : calloc((size_t)ck->n_in, sizeof *h);
    if (!h)
        return nt__err_hostmem(&n->site, "nt_backward", "the inputs of a recompute");
    int rc = 0;
    /* The recompute's inputs: the saved values, with the node's edges. */
    for (int i = 0; i < ck->n_in && !rc; i++) {
        h[i] = nt__save(ck->saved[i]);
        if (!h[i] || (n->next[i].node && !nt__ag_of(h[i]))) {
            rc = nt__err_hostmem(&n->site, "nt_backward", "the inputs of a recompute");
            break;
        }
        if (n->next[i].node) {
            AO_fetch_and_add1(&n->next[i].node->refs);
            h[i]->ag->grad_fn = n->next[i].node;
            h[i]->ag->out_idx = n->next[i].idx;
            h[i]->ag->requires_grad = true;
        }
    }
    nt_scope *s = rc ? NULL : nt_scope_begin();
    if (!rc && !s)
        rc = nt__err_hostmem(&n->site, "nt_backward", "the scope of a recompute");
    if (!rc && nt__dhooks.amp_enter)
        rc = nt__dhooks.amp_enter(ck->amp);
    if (!rc) {
        /* The block runs as a forward: grad on, not tagged as a backward
         * (which would turn autocast off), no outer capture. */
        int ng = nt__ag_set_no_grad(0);
        const char *bwd = nt__tls_bwd_of;
        bool capc = nt__ckpt_capturing, train = nt_is_training();
        nt__tls_bwd_of = NULL;
        nt__ckpt_capturing = false;
        nt_set_training(ck->training); /* dropout masks as in the forward */
        nt__user_code_begin();
        int frc = ck->fn(ck->ctx, h, ck->n_in, outs, n->nout);
        nt__user_code_end();
        nt_set_training(train);
        nt__ckpt_capturing = capc;
        nt__tls_bwd_of = bwd;
        nt__ag_set_no_grad(ng);
        if (nt__dhooks.amp_leave)
            nt__dhooks.amp_leave();
        rc = frc ? frc
                 : borrowed_outputs(&n->site, "nt_backward", h, ck->n_in, NULL, outs, n->nout, s);
        if (!rc)
            rc = take_outputs(&n->site, "nt_backward", outs, n->nout, s, false);
        if (rc) {
            char code[48];
            snprintf(code, sizeof code, "the block returned %d", frc);
            rc = recompute_err(n, nt__err_or(NT_EINVAL),
                               "recomputing the block of nt_checkpoint failed: %s",
                               nt_last_error() ? nt_last_error_message() : code);
            drop_outputs(outs, n->nout, s);
        }
    }
    if (s)
        nt_scope_end(s);
    for (int i = 0; i < ck->n_in; i++)
        if (h[i])
            nt_release(h[i]);
    if (h != hbuf)
        free(h);
    for (int j = 0; j < n->nout && !rc; j++)
        if (!meta_eq(&n->out_meta[j], outs[j])) {
            char a[128], b[128];
            rc = nt__err(&n->site, NT_ESTATE, "nt_backward",
                         "recomputing the block of nt_checkpoint gave outputs[%d] of %s %s, but "
                         "the forward pass gave %s %s; the block must be deterministic", j,
                         nt_dtype_name((nt_dtype)outs[j]->dtype),
                         nt__shape_str(outs[j]->ndim, outs[j]->shape, a, sizeof a),
                         nt_dtype_name((nt_dtype)n->out_meta[j].dtype),
                         nt__shape_str(n->out_meta[j].ndim, n->out_meta[j].shape, b, sizeof b));
            drop_outputs(outs, n->nout, NULL);
        }
    /* the same shapes; in deterministic mode the same values too */
    for (int j = 0; j < n->nout && !rc && ck->summed && !nt__capturing(); j++) {
        uint64_t now;
        if (!checksum(outs[j], &now)) {
            rc = nt_last_error() ? recompute_err(n, nt_last_error(),
                                                 "recomputing the block of nt_checkpoint "
                                                 "failed: %s", nt_last_error_message())
                                 : nt__err_hostmem(&n->site, "nt_backward",
                                                   "a copy of a recomputed output");
        } else if (now != ck->sum[j]) {
            rc = nt__err(&n->site, NT_ESTATE, "nt_backward",
                         "recomputing the block of nt_checkpoint gave outputs[%d] other values "
                         "than the forward pass did (NT_DETERMINISTIC=1 compares a checksum of "
                         "each output); the block must be deterministic", j);
        }
        if (rc)
            drop_outputs(outs, n->nout, NULL);
    }
    return rc;
}
