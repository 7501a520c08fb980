/* autograd/tape.c - recording nodes, nt_backward, gradients of leaves,
 * no-grad regions, detach.  See autograd.h. */
#include "autograd/autograd.h"
#include "fusion/graph.h"

#include <stdlib.h>
#include <string.h>

static volatile AO_t node_seq;
static _Thread_local int tls_no_grad NT_TLS_HOT;

bool nt__ag_enabled(void) { return tls_no_grad == 0; }

NT_API void nt_no_grad_begin(void) { tls_no_grad++; }
NT_API void nt_no_grad_end(void)
{
    if (tls_no_grad > 0)
        tls_no_grad--;
}
NT_API bool nt_grad_enabled(void) { return tls_no_grad == 0; }

int nt__ag_set_no_grad(int depth)
{
    int old = tls_no_grad;
    tls_no_grad = depth;
    return old;
}

/* ---------------- nodes ---------------- */

nt__node *nt__node_new(int op, int nin, int nout)
{
    nt__node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->refs = 1;
    n->op = op;
    n->seq = AO_fetch_and_add1(&node_seq) + 1;
    n->nin = nin;
    n->nout = nout;
    if (nin) {
        n->next = calloc((size_t)nin, sizeof *n->next);
        n->in_meta = calloc((size_t)nin, sizeof *n->in_meta);
        if (!n->next || !n->in_meta) {
            free(n->next);
            free(n->in_meta);
            free(n);
            return NULL;
        }
    }
    return n;
}

static void node_ref(nt__node *n)
{
    if (n)
        AO_fetch_and_add1(&n->refs);
}

static void drop_saved(nt__node *n)
{
    if (n->ckpt)
        nt__ckpt_drop_saved(n->ckpt);
    for (int i = 0; i < NT__MAX_IN; i++)
        if (n->saved_in[i]) {
            nt_release(n->saved_in[i]);
            n->saved_in[i] = NULL;
        }
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (n->saved_out[i]) {
            nt_release(n->saved_out[i]);
            n->saved_out[i] = NULL;
        }
}

/* Frees nodes iteratively: a long chain would overflow the stack.  The
 * dead nodes wait in a list linked through the nodes themselves, so freeing
 * never needs memory. */
void nt__node_unref(nt__node *n)
{
    nt__node *dead = NULL;
    if (n && nt__ref_drop(&n->refs, 1)) {
        n->dead_next = NULL;
        dead = n;
    }
    while (dead) {
        n = dead;
        dead = n->dead_next;
        drop_saved(n);
        for (int i = 0; i < n->nin; i++) {
            nt__node *m = n->next[i].node;
            if (m && nt__ref_drop(&m->refs, 1)) {
                m->dead_next = dead;
                dead = m;
            }
        }
        free(n->next);
        free(n->in_meta);
        free(n->sizes);
        if (n->ckpt)
            nt__ckpt_free(n->ckpt);
        if (n->grp)
            nt__grp_unref(n->grp, n->grp_idx);
        nt__hooks_free(n);
        free(n);
    }
}

/* Devices: an op's backward runs on the device of its gradients, the
 * device its forward ran on; a gradient is summed and accumulated on its
 * tensor's device (nt__dev_enter, autograd/autograd.h). */
void nt__dev_enter(nt__devsw *d, int dev)
{
    nt_stream *cur = nt_stream_current();
    d->moved = nt_stream_device(cur) != dev;
    if (d->moved) {
        d->prev = cur;
        nt_stream_set_current(nt_stream_default_on(dev));
    }
}

void nt__dev_leave(nt__devsw *d)
{
    if (d->moved)
        nt_stream_set_current(d->prev);
}

static void meta_of(nt__tmeta *m, const nt_tensor *t)
{
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    m->dev = t->dev;
    for (int i = 0; i < t->ndim; i++)
        m->shape[i] = t->shape[i];
}

struct nt__ag *nt__ag_of(nt_tensor *t)
{
    if (!t->ag) /* NULL if the host is out of memory */
        t->ag = calloc(1, sizeof *t->ag);
    return t->ag;
}

/* Called when a handle is freed (core/tensor.c). */
void nt__ag_free(struct nt__ag *ag)
{
    nt__ag_unretain(ag);
    if (ag->acc)
        ag->acc->leaf = NULL; /* gradients that still arrive are dropped */
    nt__node_unref(ag->grad_fn);
    nt__node_unref(ag->acc);
    if (ag->grad)
        nt_release(ag->grad);
    if (ag->amp_cast)
        nt_release(ag->amp_cast);
    free(ag);
}

static bool requires(const nt_tensor *t) { return t && t->ag && t->ag->requires_grad; }

nt__edge nt__edge_of(nt_tensor *t)
{
    nt__edge e = {NULL, 0};
    if (!requires(t))
        return e;
    struct nt__ag *ag = t->ag;
    if (ag->grad_fn) {
        e.node = ag->grad_fn;
        e.idx = ag->out_idx;
    } else {
        if (!ag->acc) {
            ag->acc = nt__node_new(NT__OP_ACCUMULATE, 0, 1);
            if (!ag->acc)
                return e; /* the host is out of memory: the caller checks */
            ag->acc->seq = 0; /* a sink: made lazily, but always runs last */
            ag->acc->leaf = t;
            meta_of(&ag->acc->out_meta[0], t);
        }
        e.node = ag->acc;
    }
    return e;
}

nt_tensor *nt__save(nt_tensor *t)
{
    nt_tensor *v = nt__make_view(t, t->ndim, t->shape, t->stride, t->offset, &t->site);
    if (v) /* the library's: skips the quarantine unless handed out (core/internal.h) */
        v->tmp = 1;
    return v;
}

/* ---------------- recording ---------------- */

static int record(nt__call *c, nt_tensor *const *ins, int nin)
{
    int op = c->op;
    const nt__bwd_entry *be = op < NT_OP_COUNT ? &nt__bwd_table[op] : NULL;
    if (op < NT_OP_COUNT && !be->fn)
        return nt__err(c->site, NT_ENOTSUP, c->fn,
                       "op '%s' has no backward function; call it inside a no-grad region",
                       nt__op_name(op));
    int nout = c->dst ? 1 : c->nout;
    nt__node *n = nt__node_new(op, nin, nout);
    if (!n)
        return nt__err_hostmem(c->site, c->fn, "an autograd node");
    n->site = c->site ? *c->site : (nt_site){0};
    n->p = c->p;
    for (int i = 0; i < nin; i++) {
        if (!ins[i])
            continue;
        meta_of(&n->in_meta[i], ins[i]);
        n->next[i] = nt__edge_of(ins[i]);
        if (requires(ins[i]) && !n->next[i].node)
            goto oom;
        node_ref(n->next[i].node);
    }
    for (int i = 0; i < nout; i++)
        meta_of(&n->out_meta[i], c->out[i]);
    if (be) {
        for (int i = 0; i < nin && i < NT__MAX_IN; i++)
            if ((be->save_in >> i & 1) && ins[i]) {
                n->saved_in[i] = nt__save(ins[i]);
                if (!n->saved_in[i])
                    goto oom;
                n->saved_in_ver[i] = AO_load(&ins[i]->st->version);
            }
        for (int i = 0; i < nout; i++)
            if (be->save_out >> i & 1) {
                n->saved_out[i] = nt__save(c->out[i]);
                if (!n->saved_out[i])
                    goto oom;
                /* an in-place op's own write is counted already */
                n->saved_out_ver[i] = AO_load(&c->out[i]->st->version);
            }
    }
    /* Every allocation before the first change to an output: a failure
     * leaves the outputs as they were. */
    for (int i = 0; i < nout; i++)
        if (nt__dtype_is_float((nt_dtype)c->out[i]->dtype) && !nt__ag_of(c->out[i]))
            goto oom;
    for (int i = 0; i < nout; i++) {
        if (!nt__dtype_is_float((nt_dtype)c->out[i]->dtype))
            continue; /* an index output (max_pool2d_fwd's) takes no part */
        struct nt__ag *ag = nt__ag_of(c->out[i]);
        nt__node *old = ag->grad_fn;
        node_ref(n);
        ag->grad_fn = n;
        ag->out_idx = i;
        ag->requires_grad = true;
        if (op < NT_OP_COUNT && (nt__ops[op].flags & NT_OPF_VIEW))
            ag->is_view = true;
        nt__node_unref(old); /* in place: the new node took its edge */
    }
    nt__node_unref(n);
    return 0;
oom:
    nt__node_unref(n); /* drops what it saved and its edges */
    return nt__err_hostmem(c->site, c->fn, "autograd's record of the op");
}

/* In-place writes that autograd can follow: the old value is not needed by
 * their backward (the INPLACE flag of core/optable.h). */
static bool inplace_ok(int op)
{
    return op >= 0 && op < NT_OP_COUNT && (nt__ops[op].flags & NT_OPF_INPLACE);
}

/* A call that records no node (c->no_grad: a backward kernel, cat's
 * copies into its result, detach) inside a create_graph backward, on an
 * input that carries the graph: the gradient it makes would silently stop
 * there, so it is refused -- except cat's copies (cat records its own node)
 * and detach (a cut asked for). */
static int on_nograd_call(nt__call *c)
{
    if (!nt__dbl_of || c->op == NT_OP_ALIAS || (c->dst && c->op == NT_OP_COPY))
        return 0;
    for (int i = 0; i < c->nin; i++)
        if (requires(c->in[i]))
            return nt__dbl_refuse(c->site, NULL);
    return 0;
}

static int on_dispatch(nt__call *c)
{
    if (c->no_grad)
        return on_nograd_call(c);
    if (tls_no_grad) {
        if (nt__ckpt_capturing)
            nt__ckpt_capture(c->in, c->nin);
        return 0;
    }
    bool any = false;
    for (int i = 0; i < c->nin; i++)
        if (requires(c->in[i]))
            any = true;
    if (nt__dbl_of && (any || requires(c->dst))) {
        /* a create_graph pass runs a backward on tensors that carry the
         * graph: a write in place, or a backward kernel without a backward
         * of its own, would leave a gradient that silently stops there */
        int op = c->op;
        if (c->dst)
            return nt__dbl_refuse(c->site, "its backward writes in place");
        if (op < NT_OP_COUNT && !(nt__ops[op].flags & NT_OPF_DIFF) &&
            (nt__ops[op].kind == NT_KIND_BWD || op == NT_OP_UNARY_BWD || op == NT_OP_BINARY_DX))
            return nt__dbl_refuse(c->site, NULL);
    }
    if (c->dst) {
        nt_tensor *d = c->dst;
        bool dreq = requires(d);
        if (dreq && !d->ag->grad_fn)
            return nt__err(c->site, NT_ESTATE, c->fn,
                           "argument 'dst' is a leaf tensor that requires grad; write to it "
                           "inside nt_no_grad_begin()/nt_no_grad_end()");
        if (!dreq && !any)
            return 0;
        if (d->ag && d->ag->is_view)
            return nt__err(c->site, NT_ENOTSUP, c->fn,
                           "in-place writes through a view of a tensor that requires grad are "
                           "not supported; use the out-of-place op");
        if (!inplace_ok(c->op))
            return nt__err(c->site, NT_ENOTSUP, c->fn,
                           "this in-place op on a tensor that requires grad is not supported "
                           "(its backward needs the value it overwrites); use the out-of-place "
                           "op");
        /* The node's inputs are the call's: for add/sub/neg/scalars in[0] is
         * dst's previous value; copy and fill do not read dst, so dst's old
         * history gets no gradient from here on. */
        return record(c, c->in, c->nin);
    }
    if (!any)
        return 0;
    int op = c->op;
    if (op < NT_OP_COUNT && !(nt__ops[op].flags & NT_OPF_DIFF))
        return 0; /* comparisons, argmax: no gradient flows */
    /* an integer result has no gradient, so no node: unless the table says
     * the op's integer outputs are indices beside float results */
    bool idx = op < NT_OP_COUNT && (nt__ops[op].flags & NT_OPF_IDXOUT);
    for (int i = 0; i < c->nout; i++)
        if (!idx && c->out[i] && !nt__dtype_is_float((nt_dtype)c->out[i]->dtype))
            return 0;
    return record(c, c->in, c->nin);
}

int nt__ag_on_cat(const nt_site *site, nt_tensor *const *ts, int n, int dim, nt_tensor *out)
{
    if (tls_no_grad) {
        if (nt__ckpt_capturing)
            nt__ckpt_capture(ts, n);
        return 0;
    }
    bool any = false;
    for (int i = 0; i < n; i++)
        any |= requires(ts[i]);
    if (!any)
        return 0;
    nt__node *nd = nt__node_new(NT_OP_CAT, n, 1);
    if (!nd)
        return nt__err_hostmem(site, "nt_cat", "an autograd node");
    nd->site = site ? *site : (nt_site){0};
    nd->p.dim = dim;
    nd->sizes = malloc(sizeof *nd->sizes * (size_t)n);
    struct nt__ag *ag = nd->sizes ? nt__ag_of(out) : NULL;
    if (!ag) {
        nt__node_unref(nd);
        return nt__err_hostmem(site, "nt_cat", "an autograd node");
    }
    for (int i = 0; i < n; i++) {
        meta_of(&nd->in_meta[i], ts[i]);
        nd->sizes[i] = ts[i]->shape[dim];
        nd->next[i] = nt__edge_of(ts[i]);
        if (requires(ts[i]) && !nd->next[i].node) {
            nt__node_unref(nd);
            return nt__err_hostmem(site, "nt_cat", "an autograd node");
        }
        node_ref(nd->next[i].node);
    }
    meta_of(&nd->out_meta[0], out);
    ag->grad_fn = nd;
    ag->out_idx = 0;
    ag->requires_grad = true;
    ag->is_view = (nt__ops[NT_OP_CAT].flags & NT_OPF_VIEW) != 0; /* the table says: no */
    return 0;
}

static bool grad_mode(void) { return tls_no_grad == 0; }

/* The dispatcher's hooks (nt__dhooks, registered by init/init.c). */
int nt__ag_on_dispatch(nt__call *c) { return on_dispatch(c); }
bool nt__ag_grad_mode(void) { return grad_mode(); }

/* ---------------- public: leaves, grads ---------------- */

NT_API int nt_set_requires_grad(nt_tensor *t, bool rg)
{
    const char *fn = "nt_set_requires_grad";
    if (!nt__ensure_init() || !nt__check_arg(NULL, fn, "t", t))
        return nt_last_error();
    if (rg && !nt__dtype_is_float((nt_dtype)t->dtype))
        return nt__err(NULL, NT_EDTYPE, fn,
                       "only floating tensors can require grad (this one is %s)",
                       nt_dtype_name((nt_dtype)t->dtype));
    if (t->ag && t->ag->grad_fn)
        return nt__err(NULL, NT_ESTATE, fn,
                       "the tensor was computed by an op that records a graph (it is not a "
                       "leaf); use nt_detach() to get a leaf");
    if (!rg && !t->ag)
        return 0;
    if (!nt__ag_of(t))
        return nt__err_hostmem(NULL, fn, "autograd's state of the tensor");
    nt__ag_of(t)->requires_grad = rg;
    return 0;
}

NT_API bool nt_requires_grad(nt_tensor *t)
{
    return t && t->magic == NT__MAGIC_LIVE && requires(t);
}

NT_API nt_tensor *nt_grad(nt_tensor *t)
{
    if (!nt__ensure_init() || !nt__check_arg(NULL, "nt_grad", "t", t))
        return NULL;
    if (!t->ag || !t->ag->grad)
        return NULL;
    nt_retain(t->ag->grad);
    return nt__scope_adopt(t->ag->grad, "nt_grad");
}

NT_API int nt_zero_grad(nt_tensor *t)
{
    if (!nt__ensure_init() || !nt__check_arg(NULL, "nt_zero_grad", "t", t))
        return nt_last_error();
    if (t->ag && t->ag->grad) {
        nt_release(t->ag->grad);
        t->ag->grad = NULL;
    }
    return 0;
}

/* Adds the gradient *slot into the leaf's .grad (cast to the leaf's
 * dtype).  The first gradient becomes .grad as a contiguous tensor of its
 * own, so later accumulations can be in place: the slot's tensor itself
 * when nothing else can see it (only the slot holds it, no view or saved
 * copy shares its storage; the slot gives its reference up), else a copy.
 * "Shares" counts the handles the host can still use (st->hrefs), not all
 * of them (st->refs): a released handle that only queued records still
 * hold -- in the async modes, the matmul product that linear's weight
 * gradient is a transposed-back view of, until the matmul has run -- can
 * be reached by no later op, and the ops already queued on it run before
 * anything enqueued on .grad after this (stream order), as they would
 * before the copy.  No other thread can make a handle on the storage
 * meanwhile: that needs a live handle, and g is the only one. */
static nt_tensor *leaf_grad_of(const nt_tensor *leaf) { return leaf->ag ? leaf->ag->grad : NULL; }

static void leaf_set_grad(nt_tensor *leaf, nt_tensor *g)
{
    struct nt__ag *ag = nt__ag_of(leaf);
    if (!ag) /* it had one when the step was captured: not reached */
        return;
    if (ag->grad)
        nt_release(ag->grad);
    ag->grad = g ? nt_retain(g) : NULL;
}

static const nt__leaf_access leaf_access = {leaf_grad_of, leaf_set_grad};

static int accumulate_leaf(nt_tensor *leaf, nt_tensor **slot, const nt_site *site)
{
    nt_tensor *g = *slot;
    struct nt__ag *ag = nt__ag_of(leaf);
    /* a captured step starts this .grad, or adds to it: a replay checks
     * that the leaf is in the same state again */
    if (nt__capturing())
        nt__capture_note_leaf(leaf, &leaf_access);
    if (ag->grad) {
        nt_no_grad_begin();
        int rc = nt_add_inplace_at(site, ag->grad, g);
        nt_no_grad_end();
        return rc;
    }
    if (g->dtype == leaf->dtype && !g->scope && AO_load_full(&g->refs) == 1 &&
        AO_load_full(&g->st->hrefs) == 1 && g->offset == 0 && !g->expanded &&
        nt__is_contig(g) && !(g->ag && g->ag->requires_grad)) {
        ag->grad = g; /* the slot's reference, into the leaf */
        *slot = NULL;
        return 0;
    }
    nt_tensor *c = nt__copy_to(site, "nt_backward", g, (nt_dtype)leaf->dtype);
    if (!c)
        return nt_last_error();
    nt_keep(c);
    ag->grad = c;
    return 0;
}

/* ---------------- backward ---------------- */

static int cmp_seq_desc(const void *a, const void *b)
{
    const nt__node *x = *(nt__node *const *)a, *y = *(nt__node *const *)b;
    return x->seq < y->seq ? 1 : (x->seq > y->seq ? -1 : 0);
}

static bool shape_eq(const nt__tmeta *m, const nt_tensor *t)
{
    if (m->ndim != t->ndim)
        return false;
    for (int i = 0; i < m->ndim; i++)
        if (m->shape[i] != t->shape[i])
            return false;
    return true;
}

static int check_versions(nt__node *n, const char *api)
{
    for (int i = 0; i < NT__MAX_IN; i++)
        if (n->saved_in[i] && AO_load(&n->saved_in[i]->st->version) != n->saved_in_ver[i])
            goto bad;
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (n->saved_out[i] && AO_load(&n->saved_out[i]->st->version) != n->saved_out_ver[i])
            goto bad;
    return 0;
bad:
    return nt__err(&n->site, NT_EVERSION, "nt_backward",
                   "a tensor that %s saved for its backward was modified in place after it "
                   "was saved", api);
}

/* The nodes of one backward pass, in the order they run, each with its
 * gradient slots; a node's position comes from an open-addressing map.  Own
 * containers, not GLib's: running out of host memory is an error here, not
 * an abort. */
typedef struct {
    nt__node **order; /* reachable nodes, newest first */
    size_t n, cap;
    nt__node **key;   /* map: node -> position in order */
    size_t *pos;
    size_t mcap;      /* a power of two, at least twice n */
    nt_tensor **slots; /* [n][NT__MAX_OUT]: each holds a reference */
    nt__node **held;   /* references on the nodes recomputed by checkpoints */
    size_t nheld, heldcap;
    struct scat *scat; /* slots being filled by slice gradients (see slice_into) */
    nt_tensor *placed[8]; /* the latest buffers backwards wrote in place
                             (nt__bctx.placed; references), oldest first */
    int nplaced;
    size_t nscat, scatcap;
    uint32_t *uses;    /* [n][NT__MAX_OUT]: edges into each output from the pass's nodes */
    bool ckpt;         /* a checkpoint in the pass: its splice adds edges (uses is stale) */
    uint64_t serial;   /* this pass among all (group ops' results belong to one) */
} gradmap;

/* A slot whose gradient is a buffer the backwards of slices of one dim
 * write into.  The definition is the sum, in the order the slices'
 * backwards run, of one buffer of zeros of the input's shape per slice with
 * the slice's gradient copied into its place.  Where the slices do not
 * overlap, that sum is, at each element, either 0 + 0 + ... (+0: no slice
 * covers it) or, when two or more slices came, g + 0 + ... = g + 0 for the
 * one gradient g that covers it (IEEE: +0 + g == g + +0 bit for bit, a NaN
 * included, and (g + 0) + 0 == g + 0); with one slice, g itself.  So the
 * buffer is made once (not filled), each slice's gradient goes into its
 * place as g + 0 once two or more came (one op: dst = g + 0, turning -0
 * into +0 as the sum does) or as g itself when it stays the only one, and
 * before anything reads it the places no slice wrote are filled with +0:
 * the sum's bits at a fraction of its memory traffic.  The first slice's
 * write waits (pend) until a second one comes or the buffer is finished,
 * which says which of the two it is.  Attention's q, k, v slices of one
 * [B, T, 3D] projection were three zero-filled [B, T, 3D] buffers and two
 * adds; then one buffer, three copies and a + 0 over all of it; now three
 * writes. */
#define SCAT_MAX 8
struct scat {
    nt_tensor *buf; /* the slot's tensor (the slot holds the reference) */
    int dim, n;
    int64_t lo[SCAT_MAX], hi[SCAT_MAX]; /* the slices' [start, end) along dim */
    bool inplace; /* buf is a buffer a backward wrote in place (placed_into) */
    nt_tensor *pend_v, *pend_g; /* the first slice's place and gradient, not yet
                                   written (references), or NULL */
    nt_site pend_site;
};

static size_t map_find(const gradmap *gm, const nt__node *n)
{
    size_t h = ((uintptr_t)n >> 4) * UINT64_C(0x9e3779b97f4a7c15) & (gm->mcap - 1);
    while (gm->key[h] && gm->key[h] != n)
        h = (h + 1) & (gm->mcap - 1);
    return h;
}

/* Grows *v (of *cap pointers) to hold one more than n; false: out of
 * memory. */
static bool room_for(nt__node ***v, size_t *cap, size_t n)
{
    if (n < *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 64;
    nt__node **nv = realloc(*v, c * sizeof *nv);
    if (!nv)
        return false;
    *v = nv;
    *cap = c;
    return true;
}

/* Puts n (not yet present) in the map; false: out of memory. */
static bool gm_mark(gradmap *gm, nt__node *n, size_t *nmarked)
{
    if (2 * (*nmarked + 1) > gm->mcap) {
        size_t mcap = gm->mcap ? gm->mcap * 2 : 128;
        nt__node **key = calloc(mcap, sizeof *key);
        size_t *pos = calloc(mcap, sizeof *pos);
        if (!key || !pos) {
            free(key);
            free(pos);
            return false;
        }
        gradmap old = *gm;
        gm->key = key;
        gm->pos = pos;
        gm->mcap = mcap;
        for (size_t i = 0; i < old.mcap; i++)
            if (old.key[i])
                gm->key[map_find(gm, old.key[i])] = old.key[i];
        free(old.key);
        free(old.pos);
    }
    gm->key[map_find(gm, n)] = n;
    (*nmarked)++;
    return true;
}

static bool gm_has(const gradmap *gm, const nt__node *n)
{
    return gm->mcap && gm->key[map_find(gm, n)] == n;
}

static void gm_free(gradmap *gm)
{
    for (size_t i = 0; i < gm->nheld; i++)
        nt__node_unref(gm->held[i]);
    free(gm->held);
    for (size_t i = 0; gm->slots && i < gm->n * NT__MAX_OUT; i++)
        if (gm->slots[i])
            nt_release(gm->slots[i]);
    free(gm->order);
    free(gm->key);
    free(gm->pos);
    free(gm->slots);
    for (int i = 0; i < gm->nplaced; i++)
        nt_release(gm->placed[i]);
    for (size_t i = 0; i < gm->nscat; i++) {
        nt_release(gm->scat[i].pend_v);
        nt_release(gm->scat[i].pend_g);
    }
    free(gm->scat);
    free(gm->uses);
}

/* A reachable node's gradient slots. */
static nt_tensor **slots_of(gradmap *gm, nt__node *n)
{
    return gm->slots + gm->pos[map_find(gm, n)] * NT__MAX_OUT;
}

static struct scat *scat_find(gradmap *gm, const nt_tensor *t)
{
    for (size_t i = 0; t && i < gm->nscat; i++)
        if (gm->scat[i].buf == t)
            return &gm->scat[i];
    return NULL;
}

/* Writes the pending first slice of e: g itself (plus0 false: it is the
 * only one) or g + 0 (a second came). */
static int scat_flush(struct scat *e, bool plus0)
{
    if (!e->pend_v)
        return 0;
    nt_tensor *v = e->pend_v, *g = e->pend_g;
    e->pend_v = e->pend_g = NULL;
    nt__devsw d;
    nt__dev_enter(&d, g->dev);
    int rc = plus0 ? nt__add_scalar_into(&e->pend_site, "nt_backward", v, g, 0.0)
                   : nt_copy_into_at(&e->pend_site, v, g);
    nt__dev_leave(&d);
    nt_release(v);
    nt_release(g);
    return rc;
}

/* Whether e's slices leave a gap in [0, len) along its dim. */
static bool scat_has_gap(const struct scat *e, int64_t len)
{
    int64_t covered = 0; /* the slices never overlap (scat_overlaps) */
    for (int i = 0; i < e->n; i++)
        covered += e->hi[i] - e->lo[i];
    return covered < len;
}

/* Ends the slice-gradient buffer *tp (if it is one; the slot's tensor)
 * before anything reads it: a first slice that stayed the only one written
 * as it is, +0 where no slice wrote.  A buffer a backward wrote in place
 * (placed_into) with gaps is not written: its gaps may be other slots'
 * slices (q, k and v each through a reshape of its own of the projection,
 * as examples/gpt_mesh.h's heads: three slots, each a third of one
 * buffer), so the slices go to a new buffer, the slot's now, and the +0
 * there. */
static int scat_finish(gradmap *gm, nt_tensor **tp, const nt_site *site)
{
    nt_tensor *t = *tp;
    struct scat *e = scat_find(gm, t);
    if (!e)
        return 0;
    struct scat x = *e;
    *e = gm->scat[--gm->nscat];
    int rc = scat_flush(&x, false);
    nt__devsw d;
    nt__dev_enter(&d, t->dev);
    if (!rc && x.inplace && scat_has_gap(&x, t->shape[x.dim])) {
        nt_tensor *nb = nt__empty_for_stream(site, "nt_backward", (nt_dtype)t->dtype, t->ndim,
                                             t->shape, t->dev);
        rc = nb ? 0 : nt_last_error();
        for (int i = 0; i < x.n && !rc; i++) {
            nt_tensor *dst = nt_slice_at(site, nb, x.dim, x.lo[i], x.hi[i], 1);
            nt_tensor *src = dst ? nt_slice_at(site, t, x.dim, x.lo[i], x.hi[i], 1) : NULL;
            rc = src ? nt_copy_into_at(site, dst, src) : nt_last_error();
        }
        if (rc) {
            nt_release(nb);
        } else {
            nt_release(t); /* the slot's reference moves to the new buffer */
            *tp = t = nb;
        }
    }
    /* the gaps between the slices' ranges, in ascending order */
    for (int64_t at = 0; at < t->shape[x.dim] && !rc;) {
        int64_t next = t->shape[x.dim], skip = -1;
        for (int i = 0; i < x.n; i++) {
            if (x.lo[i] <= at && at < x.hi[i])
                skip = x.hi[i];
            else if (x.lo[i] > at && x.lo[i] < next)
                next = x.lo[i];
        }
        if (skip >= 0) {
            at = skip;
            continue;
        }
        nt_tensor *v = nt_slice_at(site, t, x.dim, at, next, 1);
        rc = v ? nt_fill_inplace_at(site, v, 0.0) : nt_last_error();
        at = next;
    }
    nt__dev_leave(&d);
    return rc;
}

/* Room for one more slice-gradient slot (false: out of host memory, the
 * caller takes the ordinary backward). */
static bool scat_room(gradmap *gm)
{
    if (gm->nscat < gm->scatcap)
        return true;
    size_t cap = gm->scatcap ? 2 * gm->scatcap : 8;
    struct scat *p = realloc(gm->scat, cap * sizeof *p);
    if (!p)
        return false;
    gm->scat = p;
    gm->scatcap = cap;
    return true;
}

/* Whether [lo, hi) meets a slice e holds already. */
static bool scat_overlaps(const struct scat *e, int64_t lo, int64_t hi)
{
    for (int i = 0; i < e->n; i++)
        if (lo < e->hi[i] && e->lo[i] < hi)
            return true;
    return false;
}

/* Keeps the buffer a backward wrote in place (nt__bctx.placed), the
 * latest 8 (a buffer's slices come soon after its backward). */
static void placed_keep(gradmap *gm, nt_tensor *t)
{
    if (gm->nplaced == 8) {
        nt_release(gm->placed[0]);
        memmove(gm->placed, gm->placed + 1, 7 * sizeof *gm->placed);
        gm->nplaced--;
    }
    gm->placed[gm->nplaced++] = nt_retain(t);
}

/* Whether views a and b are the same elements in the same order. */
static bool same_place(const nt_tensor *a, const nt_tensor *b)
{
    if (a->st != b->st || a->offset != b->offset || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->stride[i] != b->stride[i]))
            return false;
    return true;
}

/* The slice [lo, hi) of n's input when g, its gradient (reshaped: in the
 * shape of the reshape of the slice), already lies in its place in a
 * buffer a backward wrote in place (nt__bctx.placed: attention's dq, dk, dv
 * as q, k, v lie in their projection): the buffer becomes the input's
 * gradient slot, or is it already, and nothing is written.  Its values
 * hold no -0, so g == g + 0 bit for bit: a slice-gradient buffer's
 * definition (struct scat) whether one slice comes or several; the places
 * no slice claims get +0 at scat_finish, in a new buffer (scat_finish: the
 * buffer itself is never written).  1: not taken. */
static int placed_into(gradmap *gm, nt__node *n, nt_tensor *g, bool reshaped, nt_tensor **slot,
                       int64_t lo, int64_t hi)
{
    const nt__tmeta *m = &n->in_meta[0];
    nt_tensor *P = NULL;
    for (int i = 0; i < gm->nplaced && !P; i++)
        if (gm->placed[i]->st == g->st)
            P = gm->placed[i];
    if (!P || P->dtype != m->dtype || P->dev != g->dev || !nt__is_contig(P) ||
        nt__numel(P->ndim, P->shape) != nt__numel(m->ndim, m->shape))
        return 1;
    struct scat *e = NULL;
    if (*slot) {
        e = scat_find(gm, *slot);
        if (!e || !e->inplace || e->buf->st != P->st || e->dim != n->p.dim ||
            e->n == SCAT_MAX || scat_overlaps(e, lo, hi))
            return 1;
    } else if (!scat_room(gm)) {
        return 1;
    }
    nt_tensor *buf = *slot ? *slot : nt_reshape_at(&n->site, P, m->ndim, m->shape);
    nt_tensor *v = buf ? nt_slice_at(&n->site, buf, n->p.dim, lo, hi, 1) : NULL;
    if (v && reshaped)
        v = nt_reshape_at(&n->site, v, g->ndim, g->shape);
    if (!v)
        return nt_last_error();
    if (!same_place(v, g) || buf->st != P->st)
        return 1;
    if (!*slot) {
        *slot = nt_retain(buf); /* the slot's reference */
        e = &gm->scat[gm->nscat++];
        *e = (struct scat){.buf = buf, .dim = n->p.dim, .inplace = true};
    }
    e->lo[e->n] = lo;
    e->hi[e->n++] = hi;
    return 0;
}

/* The backward of slice node n with output gradient g, written straight
 * into its input's slot (see struct scat): into a new buffer when the slot
 * is empty, into the slot's buffer when that is a slice-gradient buffer of
 * the same dim that no earlier slice in it overlaps.  Same dtype and device
 * as the input's only.  1: not taken (the ordinary backward runs), 0: done,
 * < 0: an error. */
static int slice_into_as(gradmap *gm, nt__node *n, nt_tensor *g, bool reshaped);
static int slice_into(gradmap *gm, nt__node *n, nt_tensor *g)
{
    return slice_into_as(gm, n, g, false);
}

/* reshaped: g has the shape of a reshape of the slice's output (its one
 * user), and is copied into the slice's place through a reshaped view of
 * it; 1 (not taken) when that is no view.  Otherwise slice_into. */
static int slice_into_as(gradmap *gm, nt__node *n, nt_tensor *g, bool reshaped)
{
    nt_tensor **slot = &slots_of(gm, n->next[0].node)[n->next[0].idx];
    const nt__tmeta *m = &n->in_meta[0];
    int64_t lo = n->p.i[0], hi = n->p.i[1];
    if (n->p.i[2] != 1 && hi - lo > 1)
        return 1; /* a step leaves holes in [lo, hi): the ordinary backward */
    if (hi <= lo || g->dtype != m->dtype || (!reshaped && g->ndim != m->ndim))
        return 1;
    if (reshaped) {
        /* the slice of a contiguous buffer of the input's shape (the
         * buffer slice_into makes), viewed as g's shape */
        nt_tensor v;
        int64_t st[NT_MAX_DIMS];
        memset(&v, 0, sizeof v);
        v.ndim = (int8_t)m->ndim;
        memcpy(v.shape, m->shape, sizeof(int64_t) * (size_t)m->ndim);
        nt__contig_strides(m->ndim, m->shape, v.stride);
        v.shape[n->p.dim] = hi - lo;
        if (nt__is_contig(&v) || !nt__view_strides(&v, g->ndim, g->shape, st))
            return 1;
    }
    int prc = placed_into(gm, n, g, reshaped, slot, lo, hi);
    if (prc <= 0)
        return prc;
    struct scat *e = NULL;
    if (*slot) {
        e = scat_find(gm, *slot);
        if (!e || e->dim != n->p.dim || e->n == SCAT_MAX || g->dev != (*slot)->dev ||
            scat_overlaps(e, lo, hi))
            return 1;
    } else {
        if (!scat_room(gm))
            return 1; /* the ordinary backward then */
        /* written only by the copies queued below */
        nt_tensor *buf = nt__empty_for_stream(&n->site, "nt_backward", (nt_dtype)m->dtype,
                                              m->ndim, m->shape, g->dev);
        if (!buf)
            return nt_last_error();
        *slot = buf; /* the slot's reference */
        e = &gm->scat[gm->nscat++];
        *e = (struct scat){.buf = buf, .dim = n->p.dim};
    }
    nt_tensor *v = nt_slice_at(&n->site, *slot, n->p.dim, lo, hi, 1);
    if (v && reshaped) {
        v = nt_reshape_at(&n->site, v, g->ndim, g->shape);
        if (v && v->st != (*slot)->st) /* checked above: cannot happen */
            return nt__err(&n->site, NT_ESTATE, "nt_backward",
                           "a slice gradient's reshaped view is a copy");
    }
    if (!v)
        return nt_last_error();
    if (e->n == 0) { /* the first: written once it is known whether it stays alone */
        e->pend_v = nt_retain(v);
        e->pend_g = nt_retain(g);
        e->pend_site = n->site;
    } else if (scat_flush(e, true) || nt__add_scalar_into(&n->site, "nt_backward", v, g, 0.0)) {
        return nt_last_error();
    }
    e->lo[e->n] = lo;
    e->hi[e->n++] = hi;
    return 0;
}

/* The backward of reshape node n with output gradient g, when its input is
 * a slice's output that nothing else in the pass reads and g is not
 * contiguous (heads of a slice of attention's qkv, their gradient a
 * permuted view): g goes straight into the slice's place in the slice's
 * input slot (slice_into), through a view of that place in g's shape --
 * one copy instead of the reshape's copy to contiguous and the slice's copy
 * of that.  The slice's output gradient would have been the reshape's
 * alone (its one user), with these values, and copies are exact.  1: not
 * taken (the ordinary backward runs), 0: done, < 0: an error. */
static int reshape_into_slice(gradmap *gm, nt__node *n, nt_tensor *g)
{
    nt__node *s = n->next[0].node;
    if (gm->ckpt || !s || s->op != NT_OP_SLICE || s->custom || s->ckpt || !s->next[0].node ||
        nt__is_contig(g) || g->expanded)
        return 1;
    size_t ps = gm->pos[map_find(gm, s)];
    if (gm->uses[ps * NT__MAX_OUT + (size_t)n->next[0].idx] != 1 ||
        gm->slots[ps * NT__MAX_OUT + (size_t)n->next[0].idx] || s->freed)
        return 1; /* (a slice saves nothing: no versions to check) */
    nt__tls_bwd_of = nt__op_api(s->op);
    int rc = slice_into_as(gm, s, g, true); /* the slice's slot stays empty: it is skipped */
    nt__tls_bwd_of = nt__op_api(n->op);
    return rc;
}

static int add_grad(gradmap *gm, nt__edge e, nt_tensor *g, const nt_site *site)
{
    nt_tensor **s = slots_of(gm, e.node);
    int rc = scat_finish(gm, &s[e.idx], site);
    if (rc)
        return rc;
    if (!s[e.idx]) {
        s[e.idx] = nt_retain(g);
        return 0;
    }
    nt__devsw d;
    nt__dev_enter(&d, g->dev);
    nt_tensor *sum = nt__binary(site, "nt_backward", NT_OP_ADD, s[e.idx], g);
    nt__dev_leave(&d);
    if (!sum)
        return nt_last_error();
    nt_release(s[e.idx]);
    s[e.idx] = nt_retain(sum);
    return 0;
}

/* True if accumulator n has a gradient hook with a function (not removed). */
static bool acc_hooked(const nt__node *n)
{
    for (const nt__ghook *h = n->hooks; h; h = h->next)
        if (h->fn && !h->removed)
            return true;
    return false;
}

/* An accumulator with a gradient hook (nt_register_hook on a leaf) runs
 * right after the last node that sends it a gradient, not at the end of
 * the pass: its hook sees the gradient as soon as it is complete, as
 * torch's does (nt_ddp_set_overlap issues a bucket's collective there).
 * The gradient is the same sum either way (its contributions arrive in
 * the same order); only when the hook and the .grad write are queued
 * moves.  order[0..k) are the other nodes, newest first, then the
 * accumulators.  false: out of host memory. */
static bool early_hooked_leaves(gradmap *gm, size_t k)
{
    size_t nh = 0;
    for (size_t i = k; i < gm->n; i++)
        nh += acc_hooked(gm->order[i]);
    if (!nh)
        return true;
    /* last[i - k]: the position of accumulator i's last sender (0: none) */
    size_t *last = calloc(gm->n - k, sizeof *last);
    nt__node **out = malloc(gm->n * sizeof *out);
    if (!last || !out) {
        free(last), free(out);
        return false;
    }
    for (size_t i = 0; i < k; i++) {
        const nt__node *n = gm->order[i];
        for (int e = 0; e < n->nin; e++)
            for (size_t a = k; a < gm->n; a++)
                if (n->next[e].node == gm->order[a] && acc_hooked(gm->order[a]))
                    last[a - k] = i + 1;
    }
    size_t o = 0;
    for (size_t i = 0; i < k; i++) {
        out[o++] = gm->order[i];
        for (size_t a = k; a < gm->n; a++)
            if (last[a - k] == i + 1)
                out[o++] = gm->order[a];
    }
    for (size_t a = k; a < gm->n; a++)
        if (!last[a - k])
            out[o++] = gm->order[a];
    memcpy(gm->order, out, gm->n * sizeof *out);
    free(last), free(out);
    return true;
}

/* Collects every node reachable from the roots, once, newest first (depth
 * first; leaf accumulators, all of seq 0, last in the order found); false:
 * out of host memory. */
static bool reachable(gradmap *gm, const nt__edge *roots, int nroots)
{
    static volatile AO_t pass_serial;
    gm->serial = AO_fetch_and_add1(&pass_serial) + 1;
    nt__node **stack = NULL;
    size_t nstack = 0, stackcap = 0, nmarked = 0;
    bool ok = true;
    for (int r = 0; r < nroots && ok; r++)
        if (!gm_has(gm, roots[r].node)) {
            ok = room_for(&stack, &stackcap, nstack) && gm_mark(gm, roots[r].node, &nmarked);
            if (ok)
                stack[nstack++] = roots[r].node;
        }
    while (ok && nstack) {
        nt__node *n = stack[--nstack];
        if (!(ok = room_for(&gm->order, &gm->cap, gm->n)))
            break;
        gm->order[gm->n++] = n;
        for (int i = 0; i < n->nin && ok; i++) {
            nt__node *m = n->next[i].node;
            if (m && !gm_has(gm, m)) {
                ok = room_for(&stack, &stackcap, nstack) && gm_mark(gm, m, &nmarked);
                if (ok)
                    stack[nstack++] = m;
            }
        }
    }
    free(stack);
    if (!ok)
        return false;
    /* Sorted newest first, as a stable sort would: the accumulators (all
     * of seq 0) go last in the order found, the rest have distinct seqs. */
    nt__node **acc = malloc((gm->n ? gm->n : 1) * sizeof *acc);
    if (!acc)
        return false;
    size_t k = 0, nacc = 0;
    for (size_t i = 0; i < gm->n; i++)
        if (gm->order[i]->seq != 0)
            gm->order[k++] = gm->order[i];
        else
            acc[nacc++] = gm->order[i];
    qsort(gm->order, k, sizeof *gm->order, cmp_seq_desc);
    memcpy(gm->order + k, acc, nacc * sizeof *acc);
    free(acc);
    if (!early_hooked_leaves(gm, k))
        return false;
    for (size_t i = 0; i < gm->n; i++)
        gm->pos[map_find(gm, gm->order[i])] = i;
    gm->slots = calloc(gm->n * NT__MAX_OUT, sizeof *gm->slots);
    gm->uses = calloc(gm->n * NT__MAX_OUT, sizeof *gm->uses);
    if (!gm->slots || !gm->uses)
        return false;
    for (size_t i = 0; i < gm->n; i++) {
        const nt__node *n = gm->order[i];
        gm->ckpt |= n->ckpt != NULL;
        for (int j = 0; j < n->nin; j++)
            if (n->next[j].node)
                gm->uses[gm->pos[map_find(gm, n->next[j].node)] * NT__MAX_OUT +
                         (size_t)n->next[j].idx]++;
    }
    return true;
}

/* nt_checkpoint's node n, at position k of the pass: its block is run
 * again with grad on (autograd/checkpoint.c), and the nodes that recompute
 * made go into the pass right after n, newest first.  They were all made
 * after n, and their edges out of the block are n's own (its inputs and
 * the tensors the block captured), which are already in the pass and not
 * yet run; so the pass runs them exactly where it would have run the
 * block's nodes had there been no checkpoint, adds the same gradients in
 * the same order, and the gradients have the same bits.  The pass holds a
 * reference on each until it ends; a node's saved tensors go as it runs. */
static int ckpt_splice(gradmap *gm, size_t k, nt__node *n, nt_tensor *const *gout,
                       const nt_site *site)
{
    const char *fn = "nt_backward";
    nt_tensor *outs[NT__MAX_OUT] = {0};
    int rc = nt__ckpt_recompute(n, outs);
    if (rc)
        return rc;
    nt__edge e[NT__MAX_OUT] = {{0}};
    nt__node **stack = NULL, **fresh = NULL;
    size_t nstack = 0, stackcap = 0, nfresh = 0, freshcap = 0, nmarked = gm->n;
    for (int j = 0; j < n->nout && !rc; j++) {
        if (!gout[j] || !requires(outs[j]))
            continue; /* no gradient reaches it, or none flows back */
        e[j] = nt__edge_of(outs[j]);
        nt__node *m = e[j].node;
        if (!m)
            rc = nt__err_hostmem(site, fn, "a gradient accumulator");
        else if (!gm_has(gm, m) && m->seq > n->seq) {
            if (!room_for(&stack, &stackcap, nstack) || !gm_mark(gm, m, &nmarked))
                rc = nt__err_hostmem(site, fn, "the list of the graph's nodes");
            else
                stack[nstack++] = m;
        } else if (!gm_has(gm, m)) {
            goto nondet;
        }
    }
    while (!rc && nstack) {
        nt__node *m = stack[--nstack];
        if (!room_for(&fresh, &freshcap, nfresh)) {
            rc = nt__err_hostmem(site, fn, "the list of the graph's nodes");
            break;
        }
        fresh[nfresh++] = m;
        for (int i = 0; i < m->nin && !rc; i++) {
            nt__node *x = m->next[i].node;
            if (!x || gm_has(gm, x))
                continue;
            if (x->seq <= n->seq)
                goto nondet; /* an edge out of the block that n does not have */
            if (!room_for(&stack, &stackcap, nstack) || !gm_mark(gm, x, &nmarked))
                rc = nt__err_hostmem(site, fn, "the list of the graph's nodes");
            else
                stack[nstack++] = x;
        }
    }
    /* Room first, then changes: a failure leaves the pass as it was. */
    size_t total = gm->n + nfresh;
    nt_tensor **slots = NULL;
    if (!rc && nfresh) {
        slots = calloc(total * NT__MAX_OUT, sizeof *slots);
        nt__node **held = gm->nheld + nfresh > gm->heldcap
                              ? realloc(gm->held, (gm->nheld + nfresh) * sizeof *held)
                              : gm->held;
        if (held && held != gm->held) {
            gm->held = held;
            gm->heldcap = gm->nheld + nfresh;
        }
        nt__node **order = total > gm->cap ? realloc(gm->order, total * sizeof *order) : gm->order;
        if (order && order != gm->order) {
            gm->order = order;
            gm->cap = total;
        }
        if (!slots || !held || !order) {
            free(slots);
            rc = nt__err_hostmem(site, fn, "the list of the graph's nodes");
        }
    }
    if (!rc && nfresh) {
        qsort(fresh, nfresh, sizeof *fresh, cmp_seq_desc);
        for (size_t i = 0; i < nfresh; i++) {
            node_ref(fresh[i]);
            gm->held[gm->nheld++] = fresh[i];
        }
        size_t tail = gm->n - (k + 1);
        memcpy(slots, gm->slots, (k + 1) * NT__MAX_OUT * sizeof *slots);
        memcpy(slots + (k + 1 + nfresh) * NT__MAX_OUT, gm->slots + (k + 1) * NT__MAX_OUT,
               tail * NT__MAX_OUT * sizeof *slots);
        free(gm->slots);
        gm->slots = slots;
        memmove(gm->order + k + 1 + nfresh, gm->order + k + 1, tail * sizeof *gm->order);
        memcpy(gm->order + k + 1, fresh, nfresh * sizeof *fresh);
        gm->n = total;
        /* gm_mark may have rehashed the map without the positions */
        for (size_t i = 0; i < gm->n; i++)
            gm->pos[map_find(gm, gm->order[i])] = i;
    }
    for (int j = 0; j < n->nout && !rc; j++)
        if (e[j].node)
            rc = add_grad(gm, e[j], gout[j], site);
    goto out;
nondet:
    rc = nt__err(&n->site, NT_ESTATE, fn,
                 "recomputing the block of nt_checkpoint reached a tensor that requires grad "
                 "which the block did not read in the forward pass; the block must be "
                 "deterministic (the same ops on the same tensors each time it runs)");
out:
    for (int j = 0; j < n->nout; j++)
        if (outs[j])
            nt_release(outs[j]);
    free(stack);
    free(fresh);
    return rc;
}

/* One backward pass: nt_backward's (accumulate into the leaves' .grad) or
 * nt_autograd_grad's (capture the gradients of `cap`'s edges, run only the
 * nodes that lead to them, leave .grad alone). */
typedef struct {
    const char *fn;      /* the API the user called */
    bool retain, create;
    int ncap;            /* nt_autograd_grad: its inputs' edges */
    const nt__edge *cap;
    nt_tensor **grads;   /* [ncap]: the gradients captured (references) */
    uint8_t *want;       /* [gm.n] with cap: bit 0 an input's node, bit 1 runs */
} pass_t;

/* The pass's API name, for errors raised inside it (nt__dbl_refuse). */
static _Thread_local const char *tls_pass_fn;
_Thread_local const char *nt__dbl_of NT_TLS_HOT;

int nt__dbl_refuse(const nt_site *site, const char *why)
{
    return nt__err(site, NT_ENOTSUP, tls_pass_fn ? tls_pass_fn : "nt_backward",
                   "double backward of '%s' is not supported (create_graph)%s%s; see the list "
                   "in docs/architecture.md, \"Double backward\"",
                   nt__dbl_of ? nt__dbl_of : "?", why ? ": " : "", why ? why : "");
}

nt_tensor *nt__unpack(nt_tensor *t, nt__edge e)
{
    if (!e.node)
        return t;
    nt_tensor *v = nt__make_view(t, t->ndim, t->shape, t->stride, t->offset, &t->site);
    struct nt__ag *ag = v ? nt__ag_of(v) : NULL;
    if (!ag) {
        if (v)
            nt_release(v);
        nt__err_hostmem(NULL, "nt_backward", "a saved tensor of the graph");
        return NULL;
    }
    node_ref(e.node);
    ag->grad_fn = e.node;
    ag->out_idx = e.idx;
    ag->requires_grad = true;
    return nt__scope_adopt(v, "nt_backward");
}

/* nt_autograd_grad: which nodes lead to an input's edge (bit 1; an input's
 * own node has bit 0).  Edges lead to older nodes, later in the order, so
 * one sweep from the oldest decides.  NULL: out of host memory. */
static uint8_t *prune(gradmap *gm, const pass_t *P)
{
    uint8_t *w = calloc(gm->n ? gm->n : 1, 1);
    if (!w)
        return NULL;
    for (int j = 0; j < P->ncap; j++)
        if (P->cap[j].node && gm_has(gm, P->cap[j].node))
            w[gm->pos[map_find(gm, P->cap[j].node)]] |= 1;
    for (size_t k = gm->n; k-- > 0;) {
        const nt__node *n = gm->order[k];
        for (int i = 0; i < n->nin; i++) {
            const nt__node *m = n->next[i].node;
            if (m && w[gm->pos[map_find(gm, m)]]) {
                w[k] |= 2;
                break;
            }
        }
    }
    return w;
}

/* A leaf's gradient in a create_graph pass: .grad becomes a function of the
 * graph (PyTorch's AccumulateGrad with grad mode on): a copy of the first
 * gradient, then .grad + g out of place, both recorded. */
static int accumulate_leaf_graph(nt_tensor *leaf, nt_tensor *g, const nt_site *site)
{
    struct nt__ag *ag = nt__ag_of(leaf);
    if (nt__capturing())
        return nt__err(site, NT_ENOTSUP, tls_pass_fn,
                       "create_graph is not supported while a step is being captured");
    nt_tensor *ng = ag->grad ? nt_add_at(site, ag->grad, g)
                             : nt__copy_to(site, tls_pass_fn, g, (nt_dtype)leaf->dtype);
    if (!ng)
        return nt_last_error();
    nt_keep(ng);
    if (ag->grad)
        nt_release(ag->grad);
    ag->grad = ng;
    return 0;
}

static int run_node(gradmap *gm, size_t k, const pass_t *P, const nt_site *site);

/* What the node's backward makes lives in a scope of its own, and the
 * slots hold references on what flows on: each temporary goes as soon as
 * its node is done, each gradient once its node has used it, not at the
 * end of the pass (a checkpoint's recompute would save little otherwise). */
static int run_node_scoped(gradmap *gm, size_t k, const pass_t *P, const nt_site *site)
{
    nt_scope *ns = nt_scope_begin();
    if (!ns)
        return nt__err_hostmem(site, P->fn, "the scope of an op's backward");
    int rc = run_node(gm, k, P, site);
    nt_scope_end(ns);
    return rc;
}

/* Runs a pass from the gradients seeds[r] of roots[r] (each seed is
 * referenced by the pass while it runs).  Grad mode is off inside, on for
 * a create_graph pass (PyTorch: grad mode = create_graph). */
static int run_pass(const nt_site *site, pass_t *P, const nt__edge *roots,
                    nt_tensor *const *seeds, int nroots)
{
    const char *fn = P->fn;
    int rc = 0;
    gradmap gm = {0};
    if (!reachable(&gm, roots, nroots) || (P->ncap && !(P->want = prune(&gm, P)))) {
        gm_free(&gm);
        return nt__err_hostmem(site, fn, "the list of the graph's nodes");
    }
    const char *prev_fn = tls_pass_fn;
    tls_pass_fn = fn;
    int ng = nt__ag_set_no_grad(P->create ? 0 : 1);
    for (int r = 0; r < nroots && !rc; r++)
        rc = add_grad(&gm, roots[r], seeds[r], site);
    for (size_t k = 0; k < gm.n && !rc; k++) {
        nt_tensor **gout = gm.slots + k * NT__MAX_OUT;
        bool any = false;
        for (int i = 0; i < NT__MAX_OUT; i++)
            any |= gout[i] != NULL;
        if (any && (!P->want || P->want[k])) /* a gradient reaches it, and it leads to an input */
            rc = run_node_scoped(&gm, k, P, site);
        gout = gm.slots + k * NT__MAX_OUT; /* a checkpoint's splice moves them */
        for (int i = 0; i < NT__MAX_OUT; i++)
            if (gout[i]) {
                nt_release(gout[i]);
                gout[i] = NULL;
            }
    }
    nt__ag_set_no_grad(ng);
    tls_pass_fn = prev_fn;
    free(P->want);
    P->want = NULL;
    gm_free(&gm);
    return rc;
}

/* The checks of a root: one that requires grad, of a graph not freed.
 * Returns its edge (node NULL: the error is set). */
static nt__edge root_of(const nt_site *site, const char *fn, const char *arg, nt_tensor *t)
{
    nt__edge none = {NULL, 0};
    if (!requires(t)) {
        nt__err(site, NT_ESTATE, fn,
                "argument '%s' does not require grad: no input of the ops that made it "
                "requires grad (or they ran in a no-grad region)", arg);
        return none;
    }
    nt__edge root = nt__edge_of(t);
    if (!root.node) {
        nt__err_hostmem(site, fn, "a gradient accumulator");
        return none;
    }
    if (root.node->freed) {
        nt__err(site, NT_ESTATE, fn,
                "the graph behind '%s' was already freed by an earlier nt_backward; "
                "pass retain_graph = true to nt_backward_ex the first time", arg);
        return none;
    }
    return root;
}

/* The gradient that starts a pass at output t: `given` (checked: t's shape,
 * floating; cast to t's dtype), or ones for a one-element t.  Owned by the
 * open scope.  NULL: the error is set. */
static nt_tensor *seed_of(const nt_site *site, const char *fn, const char *arg, nt_tensor *t,
                          nt_tensor *given, const char *garg)
{
    char s1[128], s2[128];
    if (!given) {
        if (nt__numel(t->ndim, t->shape) != 1) {
            nt__err(site, NT_ESHAPE, fn,
                    "argument '%s' has shape %s; expected one element (reduce it first, e.g. "
                    "with nt_mean), or pass its gradient as '%s'", arg,
                    nt__shape_str(t->ndim, t->shape, s1, sizeof s1), garg);
            return NULL;
        }
        nt__devsw d;
        nt__dev_enter(&d, t->dev); /* the seed goes where the output is */
        nt_tensor *seed = nt_ones_like_at(site, t);
        nt__dev_leave(&d);
        return seed;
    }
    if (!nt__check_arg(site, fn, garg, given))
        return NULL;
    if (given->ndim != t->ndim ||
        memcmp(given->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0) {
        nt__err(site, NT_ESHAPE, fn, "argument '%s' has shape %s; expected %s, the shape of '%s'",
                garg, nt__shape_str(given->ndim, given->shape, s1, sizeof s1),
                nt__shape_str(t->ndim, t->shape, s2, sizeof s2), arg);
        return NULL;
    }
    if (!nt__dtype_is_float((nt_dtype)given->dtype)) {
        nt__err(site, NT_EDTYPE, fn, "argument '%s' has dtype %s; expected a floating dtype",
                garg, nt_dtype_name((nt_dtype)given->dtype));
        return NULL;
    }
    if (given->dtype != t->dtype)
        return nt__copy_to(site, fn, given, (nt_dtype)t->dtype);
    return given;
}

static int backward_impl(const nt_site *site, const char *fn, nt_tensor *loss,
                         nt_tensor *gradient, bool retain, bool create)
{
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "loss", loss))
        return nt__err_or(NT_EINVAL);
    if (!gradient && nt__numel(loss->ndim, loss->shape) != 1) {
        char s1[128];
        return nt__err(site, NT_ESHAPE, fn,
                       "argument 'loss' has shape %s; expected one element (reduce it first, "
                       "e.g. with nt_mean)", nt__shape_str(loss->ndim, loss->shape, s1, sizeof s1));
    }
    nt__edge root = root_of(site, fn, "loss", loss);
    if (!root.node)
        return nt_last_error();
    nt_scope *scope = nt_scope_begin(); /* every temporary of the pass */
    if (!scope)
        return nt__err_hostmem(site, fn, "the scope of the pass");
    int rc;
    nt_tensor *seed = seed_of(site, fn, "loss", loss, gradient, "gradient");
    pass_t P = {.fn = fn, .retain = retain, .create = create};
    rc = seed ? run_pass(site, &P, &root, &seed, 1) : nt_last_error();
    nt_scope_end(scope);
    return rc;
}

NT_API int nt_backward_ex_at(const nt_site *site, nt_tensor *loss, bool retain)
{
    return backward_impl(site, "nt_backward", loss, NULL, retain, false);
}

NT_API int nt_backward_full_at(const nt_site *site, nt_tensor *loss, nt_tensor *gradient,
                               bool retain_graph, bool create_graph)
{
    return backward_impl(site, "nt_backward_full", loss, gradient, retain_graph, create_graph);
}
NT_API int nt_backward_full(nt_tensor *loss, nt_tensor *gradient, bool retain_graph,
                            bool create_graph)
{
    return nt_backward_full_at(NT_RA_SITE, loss, gradient, retain_graph, create_graph);
}

/* nt_autograd_grad's arguments, each checked; roots[] and cap[] filled. */
static int grad_args(const nt_site *site, const char *fn, nt_tensor *const *outputs, int nout,
                     nt_tensor *const *inputs, int nin, nt_tensor **grads, nt__edge *roots,
                     nt__edge *cap)
{
    if (!outputs || nout < 1)
        return nt__err(site, NT_EINVAL, fn, "argument 'outputs' is %s; expected at least one "
                       "tensor", outputs ? "empty" : "NULL");
    if (!inputs || nin < 1)
        return nt__err(site, NT_EINVAL, fn, "argument 'inputs' is %s; expected at least one "
                       "tensor", inputs ? "empty" : "NULL");
    if (!grads)
        return nt__err(site, NT_EINVAL, fn, "argument 'grads' is NULL; expected room for %d "
                       "gradients", nin);
    char arg[48];
    for (int i = 0; i < nout; i++) {
        snprintf(arg, sizeof arg, "outputs[%d]", i);
        if (!nt__check_arg(site, fn, arg, outputs[i]))
            return nt_last_error();
        roots[i] = root_of(site, fn, arg, outputs[i]);
        if (!roots[i].node)
            return nt_last_error();
    }
    for (int j = 0; j < nin; j++) {
        snprintf(arg, sizeof arg, "inputs[%d]", j);
        if (!nt__check_arg(site, fn, arg, inputs[j]))
            return nt_last_error();
        if (!requires(inputs[j]))
            return nt__err(site, NT_ESTATE, fn, "argument '%s' does not require grad: it has "
                           "no gradient to compute", arg);
        cap[j] = nt__edge_of(inputs[j]);
        if (!cap[j].node)
            return nt__err_hostmem(site, fn, "a gradient accumulator");
    }
    return 0;
}

NT_API int nt_autograd_grad_at(const nt_site *site, nt_tensor *const *outputs, int n_outputs,
                               nt_tensor *const *inputs, int n_inputs,
                               nt_tensor *const *grad_outputs, bool retain_graph,
                               bool create_graph, bool allow_unused, nt_tensor **grads)
{
    const char *fn = "nt_autograd_grad";
    if (!nt__ensure_init())
        return nt_last_error();
    for (int j = 0; grads && j < n_inputs; j++)
        grads[j] = NULL;
    nt__edge *roots = calloc((size_t)(n_outputs > 0 ? n_outputs : 1), sizeof *roots);
    nt__edge *cap = calloc((size_t)(n_inputs > 0 ? n_inputs : 1), sizeof *cap);
    nt_tensor **seeds = calloc((size_t)(n_outputs > 0 ? n_outputs : 1), sizeof *seeds);
    nt_tensor **got = calloc((size_t)(n_inputs > 0 ? n_inputs : 1), sizeof *got);
    int rc = roots && cap && seeds && got ? 0 : nt__err_hostmem(site, fn, "its argument lists");
    if (!rc)
        rc = grad_args(site, fn, outputs, n_outputs, inputs, n_inputs, grads, roots, cap);
    nt_scope *scope = rc ? NULL : nt_scope_begin();
    if (!rc && !scope)
        rc = nt__err_hostmem(site, fn, "the scope of the pass");
    char arg[48], garg[48];
    for (int i = 0; i < n_outputs && !rc; i++) {
        snprintf(arg, sizeof arg, "outputs[%d]", i);
        snprintf(garg, sizeof garg, "grad_outputs[%d]", i);
        seeds[i] = seed_of(site, fn, arg, outputs[i], grad_outputs ? grad_outputs[i] : NULL, garg);
        if (!seeds[i])
            rc = nt_last_error();
    }
    if (!rc) {
        pass_t P = {.fn = fn, .retain = retain_graph, .create = create_graph,
                    .ncap = n_inputs, .cap = cap, .grads = got};
        rc = run_pass(site, &P, roots, seeds, n_outputs);
    }
    if (scope)
        nt_scope_end(scope);
    for (int j = 0; j < n_inputs && !rc && !allow_unused; j++)
        if (!got[j])
            rc = nt__err(site, NT_ESTATE, fn,
                         "argument 'inputs[%d]' was not used to compute the outputs (no gradient "
                         "reaches it); pass allow_unused = true to get NULL for it", j);
    for (int j = 0; got && j < n_inputs; j++)
        if (got[j] && rc)
            nt_release(got[j]);
        else if (got[j] && !(grads[j] = nt__scope_adopt(got[j], fn)))
            rc = nt_last_error();
    if (rc)
        for (int j = 0; grads && j < n_inputs; j++)
            grads[j] = NULL; /* (a scope already owns what was adopted) */
    free(roots);
    free(cap);
    free(seeds);
    free(got);
    return rc;
}
NT_API int nt_autograd_grad(nt_tensor *const *outputs, int n_outputs, nt_tensor *const *inputs,
                            int n_inputs, nt_tensor *const *grad_outputs, bool retain_graph,
                            bool create_graph, bool allow_unused, nt_tensor **grads)
{
    return nt_autograd_grad_at(NT_RA_SITE, outputs, n_outputs, inputs, n_inputs, grad_outputs,
                               retain_graph, create_graph, allow_unused, grads);
}

/* nt_autograd_grad: node k is an input's; its gradient (after its hooks) is
 * taken for each input whose edge it is. */
static int capture(const pass_t *P, nt__node *n, nt_tensor *const *gout)
{
    for (int j = 0; j < P->ncap; j++)
        if (P->cap[j].node == n && gout[P->cap[j].idx] && !P->grads[j])
            P->grads[j] = nt_retain(gout[P->cap[j].idx]);
    return 0;
}

/* A group op's member node n (autograd/group.c): at the first member the
 * pass reaches, every member's output gradient is final (their consumers
 * were all made after the group), so the group's backward runs once, for
 * all; each member then hands on its own input gradients (gp[0..nin)). */
static int grp_backward(gradmap *gm, nt__node *n, const pass_t *P, nt_tensor **gp)
{
    nt__grp *g = n->grp;
    if (P->create || P->ncap)
        return nt__err(&n->site, NT_ENOTSUP, P->fn, "%s cannot be differentiated by %s",
                       g->api, P->create ? "a pass with create_graph" : "nt_autograd_grad");
    int rc = 0;
    if (g->pass != gm->serial)
        nt__grp_drop_results(g); /* what an earlier (failed) pass left is not ours */
    if (g->pending == 0) {
        g->pass = gm->serial;
        nt_tensor **go = calloc((size_t)g->nmem, sizeof *go);
        if (!go)
            return nt__err_hostmem(&n->site, "nt_backward", "a group op's gradients");
        int count = 0;
        for (int m = 0; m < g->nmem && !rc; m++) {
            nt__node *mm = g->mem[m];
            if (!mm || !gm_has(gm, mm))
                continue;
            nt_tensor **slot = gm->slots + gm->pos[map_find(gm, mm)] * NT__MAX_OUT;
            rc = scat_finish(gm, &slot[0], &mm->site);
            go[m] = slot[0];
            count++;
        }
        if (!rc) {
            const char *prev = nt__tls_bwd_of;
            nt__tls_bwd_of = g->api;
            rc = g->bwd(g->ctx, go, g->gin);
            nt__tls_bwd_of = prev;
        }
        free(go);
        /* the results outlive this node's scope until their member runs */
        size_t total = (size_t)g->nmem * (size_t)g->nin;
        for (size_t i = 0; i < total; i++)
            if (g->gin[i])
                g->gin[i] = rc ? NULL : nt_retain(g->gin[i]);
        if (rc)
            return rc;
        g->pending = count;
    }
    for (int i = 0; i < g->nin && !rc; i++) {
        nt_tensor **r = &g->gin[(size_t)n->grp_idx * g->nin + i];
        if (*r && !(gp[i] = nt__scope_adopt(*r, "nt_backward")))
            rc = nt_last_error();
        *r = NULL;
    }
    if (--g->pending <= 0)
        nt__grp_drop_results(g);
    return rc;
}

/* Runs the backward of node k of the pass (which some gradient reaches):
 * adds its input gradients into the slots of the nodes its edges lead to. */
static int run_node(gradmap *gm, size_t k, const pass_t *P, const nt_site *site)
{
    const char *fn = "nt_backward";
    bool retain = P->retain;
    nt__node *n = gm->order[k];
    nt_tensor **gout = gm->slots + k * NT__MAX_OUT;
    int rc = 0;
    for (int i = 0; i < NT__MAX_OUT; i++)
        if ((rc = scat_finish(gm, &gout[i], &n->site)) != 0)
            return rc;
    if (n->hooks && (rc = nt__run_hooks(n, gout, site)) != 0)
        return rc;
    if (P->ncap && ((rc = capture(P, n, gout)) != 0 || !(P->want[k] & 2)))
        return rc; /* an input's node that leads to no other input: not run */
    if (n->op == NT__OP_ACCUMULATE) {
        if (n->leaf && n->leaf->st && gout[0]) {
            nt__devsw d;
            nt__dev_enter(&d, n->leaf->dev);
            rc = P->create ? accumulate_leaf_graph(n->leaf, gout[0], site)
                           : accumulate_leaf(n->leaf, &gout[0], site);
            nt__dev_leave(&d);
        }
        return rc;
    }
    const char *api = n->ckpt ? "nt_checkpoint" : n->grp ? n->grp->api : nt__op_api(n->op);
    if (n->freed)
        return nt__err(site, NT_ESTATE, fn,
                       "part of the graph (%s) was freed by an earlier nt_backward; pass "
                       "retain_graph = true the first time", api);
    if (n->ckpt && (P->create || P->ncap))
        return nt__err(&n->site, NT_ENOTSUP, P->fn,
                       "nt_checkpoint's block cannot be differentiated by %s (as PyTorch's "
                       "reentrant checkpoint); call the block without nt_checkpoint",
                       P->create ? "a pass with create_graph" : "nt_autograd_grad");
    if (n->ckpt) {
        nt_tensor *g[NT__MAX_OUT];
        memcpy(g, gout, sizeof g); /* the splice moves the slots */
        rc = ckpt_splice(gm, k, n, g, site);
        if (!retain) {
            drop_saved(n);
            n->freed = true;
        }
        return rc;
    }
    if ((rc = check_versions(n, api)) != 0)
        return rc;
    {
        nt_tensor *gin[64] = {0};
        nt_tensor **gp = n->nin <= 64 ? gin : calloc((size_t)n->nin, sizeof *gp);
        if (!gp)
            return nt__err_hostmem(site, fn, "an op's input gradients");
        nt__bctx b = {.n = n, .gin = gp, .site = &n->site, .create = P->create};
        int dev = -1;
        for (int i = 0; i < n->nout; i++) {
            b.gout[i] = gout[i];
            if (gout[i] && dev < 0)
                dev = gout[i]->dev;
        }
        nt__devsw d;
        nt__dev_enter(&d, dev >= 0 ? dev : n->out_meta[0].dev);
        /* Ops issued by the backward carry the forward's site and say whose
         * backward they belong to. */
        nt__tls_bwd_of = api;
        /* create_graph: the backward's ops record; one that cannot names n
         * (a pass that a user op's backward runs inside it keeps its own) */
        const char *dbl_prev = nt__dbl_of;
        nt__dbl_of = P->create ? (n->custom ? api : nt__op_name(n->op)) : NULL;
        if (n->op == NT_OP_SLICE && !n->custom && gout[0] && n->next[0].node && !P->create &&
            (rc = slice_into(gm, n, gout[0])) <= 0)
            ; /* done (or failed) in its input's slot: no input gradient */
        else if (n->op == NT_OP_RESHAPE && !n->custom && gout[0] && !P->create &&
                 (rc = reshape_into_slice(gm, n, gout[0])) <= 0)
            ; /* done in the slice's input slot */
        else if (n->grp)
            rc = grp_backward(gm, n, P, gp);
        else if (n->custom)
            rc = nt__custom_backward(&b);
        else
            rc = n->op < NT_OP_COUNT && nt__bwd_table[n->op].fn ? nt__bwd_table[n->op].fn(&b)
                                                               : NT_ENOTSUP;
        if (!rc && b.placed)
            placed_keep(gm, b.placed);
        nt__tls_bwd_of = NULL;
        nt__dbl_of = dbl_prev;
        for (int i = 0; i < n->nin && !rc; i++) {
            nt_tensor *g = gp[i];
            if (!g || !n->next[i].node)
                continue;
            if (!shape_eq(&n->in_meta[i], g)) {
                char s1[128], s2[128];
                rc = nt__err(&n->site, NT_ESHAPE, fn,
                             "the backward of %s returned a gradient of shape %s for input %d, "
                             "whose shape is %s", api, nt__shape_str(g->ndim, g->shape, s1, sizeof s1),
                             i, nt__shape_str(n->in_meta[i].ndim, n->in_meta[i].shape, s2,
                                              sizeof s2));
                break;
            }
            if (g->dtype != n->in_meta[i].dtype) {
                nt__devsw dg;
                nt__dev_enter(&dg, g->dev);
                g = nt__copy_to(&n->site, fn, g, (nt_dtype)n->in_meta[i].dtype);
                nt__dev_leave(&dg);
                if (!g) {
                    rc = nt_last_error();
                    break;
                }
            }
            rc = add_grad(gm, n->next[i], g, &n->site);
        }
        nt__dev_leave(&d);
        if (gp != gin)
            free(gp);
        if (!retain) {
            drop_saved(n);
            n->freed = true;
        }
    }
    return rc;
}

NT_API int nt_backward_at(const nt_site *site, nt_tensor *loss)
{
    return nt_backward_ex_at(site, loss, false);
}
NT_API int nt_backward(nt_tensor *loss) { return nt_backward_ex_at(NT_RA_SITE, loss, false); }
NT_API int nt_backward_ex(nt_tensor *loss, bool retain)
{
    return nt_backward_ex_at(NT_RA_SITE, loss, retain);
}
