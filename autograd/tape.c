/* autograd/tape.c - recording nodes, nt_backward, gradients of leaves,
 * no-grad regions, detach.  See autograd.h. */
#include "autograd.h"

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

/* ---------------- nodes ---------------- */

nt__node *nt__node_new(int op, int nin, int nout)
{
    nt__node *n = g_new0(nt__node, 1);
    n->refs = 1;
    n->op = op;
    n->seq = AO_fetch_and_add1(&node_seq) + 1;
    n->nin = nin;
    n->nout = nout;
    if (nin) {
        n->next = g_new0(nt__edge, nin);
        n->in_meta = g_new0(nt__tmeta, nin);
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

/* Frees nodes iteratively: a long chain would overflow the stack. */
void nt__node_unref(nt__node *n)
{
    GPtrArray *todo = NULL;
    while (n) {
        if (nt__ref_drop(&n->refs, 1)) {
            drop_saved(n);
            for (int i = 0; i < n->nin; i++)
                if (n->next[i].node) {
                    if (!todo)
                        todo = g_ptr_array_new();
                    g_ptr_array_add(todo, n->next[i].node);
                }
            g_free(n->next);
            g_free(n->in_meta);
            g_free(n->sizes);
            g_free(n);
        }
        n = (todo && todo->len) ? g_ptr_array_steal_index_fast(todo, todo->len - 1) : NULL;
    }
    if (todo)
        g_ptr_array_unref(todo);
}

static void meta_of(nt__tmeta *m, const nt_tensor *t)
{
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        m->shape[i] = t->shape[i];
}

struct nt__ag *nt__ag_of(nt_tensor *t)
{
    if (!t->ag)
        t->ag = g_new0(struct nt__ag, 1);
    return t->ag;
}

/* Called when a handle is freed (core/tensor.c). */
void nt__ag_free(struct nt__ag *ag)
{
    if (ag->acc)
        ag->acc->leaf = NULL; /* gradients that still arrive are dropped */
    nt__node_unref(ag->grad_fn);
    nt__node_unref(ag->acc);
    if (ag->grad)
        nt_release(ag->grad);
    g_free(ag);
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
    return nt__make_view(t, t->ndim, t->shape, t->stride, t->offset, &t->site);
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
    n->site = c->site ? *c->site : (nt_site){0};
    n->p = c->p;
    for (int i = 0; i < nin; i++) {
        if (!ins[i])
            continue;
        meta_of(&n->in_meta[i], ins[i]);
        n->next[i] = nt__edge_of(ins[i]);
        node_ref(n->next[i].node);
    }
    for (int i = 0; i < nout; i++)
        meta_of(&n->out_meta[i], c->out[i]);
    if (be) {
        for (int i = 0; i < nin && i < NT__MAX_IN; i++)
            if ((be->save_in >> i & 1) && ins[i]) {
                n->saved_in[i] = nt__save(ins[i]);
                n->saved_in_ver[i] = AO_load(&ins[i]->st->version);
            }
        for (int i = 0; i < nout; i++)
            if (be->save_out >> i & 1) {
                n->saved_out[i] = nt__save(c->out[i]);
                /* an in-place op's own write is counted already */
                n->saved_out_ver[i] = AO_load(&c->out[i]->st->version);
            }
    }
    for (int i = 0; i < nout; i++) {
        struct nt__ag *ag = nt__ag_of(c->out[i]);
        nt__node *old = ag->grad_fn;
        node_ref(n);
        ag->grad_fn = n;
        ag->out_idx = i;
        ag->requires_grad = true;
        if (nt__ops[op < NT_OP_COUNT ? op : 0].kind == NT_KIND_VIEW && op < NT_OP_COUNT &&
            op != NT_OP_ALIAS)
            ag->is_view = true;
        nt__node_unref(old); /* in place: the new node took its edge */
    }
    nt__node_unref(n);
    return 0;
}

/* In-place writes that autograd can follow: the old value is not needed by
 * their backward. */
static bool inplace_ok(int op)
{
    return op == NT_OP_ADD || op == NT_OP_SUB || op == NT_OP_ADD_SCALAR ||
           op == NT_OP_MUL_SCALAR || op == NT_OP_NEG || op == NT_OP_COPY || op == NT_OP_FILL;
}

static int on_dispatch(nt__call *c)
{
    if (tls_no_grad)
        return 0;
    bool any = false;
    for (int i = 0; i < c->nin; i++)
        if (requires(c->in[i]))
            any = true;
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
    for (int i = 0; i < c->nout; i++)
        if (c->out[i] && !nt__dtype_is_float((nt_dtype)c->out[i]->dtype))
            return 0;
    return record(c, c->in, c->nin);
}

int nt__ag_on_cat(const nt_site *site, nt_tensor *const *ts, int n, int dim, nt_tensor *out)
{
    if (tls_no_grad)
        return 0;
    bool any = false;
    for (int i = 0; i < n; i++)
        any |= requires(ts[i]);
    if (!any)
        return 0;
    nt__node *nd = nt__node_new(NT_OP_CAT, n, 1);
    nd->site = site ? *site : (nt_site){0};
    nd->p.dim = dim;
    nd->sizes = g_new(int64_t, n);
    for (int i = 0; i < n; i++) {
        meta_of(&nd->in_meta[i], ts[i]);
        nd->sizes[i] = ts[i]->shape[dim];
        nd->next[i] = nt__edge_of(ts[i]);
        node_ref(nd->next[i].node);
    }
    meta_of(&nd->out_meta[0], out);
    struct nt__ag *ag = nt__ag_of(out);
    ag->grad_fn = nd;
    ag->out_idx = 0;
    ag->requires_grad = true;
    return 0;
}

static bool grad_mode(void) { return tls_no_grad == 0; }

__attribute__((constructor)) static void install_hooks(void)
{
    nt__ag_on_dispatch = on_dispatch;
    nt__ag_grad_mode = grad_mode;
}

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
    return nt__scope_adopt(t->ag->grad);
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

/* Adds g into the leaf's .grad (cast to the leaf's dtype).  The first
 * gradient becomes .grad as a contiguous tensor of its own, so later
 * accumulations can be in place: g itself when nothing else can see it
 * (only this pass's scope holds it, no view or saved copy shares its
 * storage), else a copy. */
static int accumulate_leaf(nt_tensor *leaf, nt_tensor *g, const nt_site *site)
{
    struct nt__ag *ag = nt__ag_of(leaf);
    if (ag->grad) {
        nt_no_grad_begin();
        int rc = nt_add_inplace_at(site, ag->grad, g);
        nt_no_grad_end();
        return rc;
    }
    if (g->dtype == leaf->dtype && g->scope && AO_load_full(&g->refs) == 1 &&
        AO_load_full(&g->st->refs) == 1 && g->offset == 0 && !g->expanded &&
        nt__is_contig(g) && !(g->ag && g->ag->requires_grad)) {
        ag->grad = nt_keep(g); /* out of the pass's scope, into the leaf */
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

typedef struct {
    GHashTable *slots; /* node -> nt_tensor *[nout] */
} gradmap;

static nt_tensor **slots_of(gradmap *gm, nt__node *n)
{
    nt_tensor **s = g_hash_table_lookup(gm->slots, n);
    if (!s) {
        s = g_new0(nt_tensor *, NT__MAX_OUT);
        g_hash_table_insert(gm->slots, n, s);
    }
    return s;
}

static int add_grad(gradmap *gm, nt__edge e, nt_tensor *g, const nt_site *site)
{
    nt_tensor **s = slots_of(gm, e.node);
    if (!s[e.idx]) {
        s[e.idx] = g;
        return 0;
    }
    nt_tensor *sum = nt__binary(site, "nt_backward", NT_OP_ADD, s[e.idx], g);
    if (!sum)
        return nt_last_error();
    s[e.idx] = sum;
    return 0;
}

/* Collects every node reachable from root, once. */
static GPtrArray *reachable(nt__node *root)
{
    GPtrArray *out = g_ptr_array_new();
    GHashTable *seen = g_hash_table_new(g_direct_hash, g_direct_equal);
    GPtrArray *stack = g_ptr_array_new();
    g_ptr_array_add(stack, root);
    g_hash_table_add(seen, root);
    while (stack->len) {
        nt__node *n = g_ptr_array_steal_index_fast(stack, stack->len - 1);
        g_ptr_array_add(out, n);
        for (int i = 0; i < n->nin; i++) {
            nt__node *m = n->next[i].node;
            if (m && !g_hash_table_contains(seen, m)) {
                g_hash_table_add(seen, m);
                g_ptr_array_add(stack, m);
            }
        }
    }
    g_ptr_array_unref(stack);
    g_hash_table_destroy(seen);
    g_ptr_array_sort(out, cmp_seq_desc);
    return out;
}

NT_API int nt_backward_ex_at(const nt_site *site, nt_tensor *loss, bool retain)
{
    const char *fn = "nt_backward";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "loss", loss))
        return nt_last_error() ? nt_last_error() : NT_EINVAL;
    if (nt__numel(loss->ndim, loss->shape) != 1) {
        char s1[128];
        return nt__err(site, NT_ESHAPE, fn,
                       "argument 'loss' has shape %s; expected one element (reduce it first, "
                       "e.g. with nt_mean)", nt__shape_str(loss->ndim, loss->shape, s1, sizeof s1));
    }
    if (!requires(loss))
        return nt__err(site, NT_ESTATE, fn,
                       "argument 'loss' does not require grad: no input of the ops that made it "
                       "requires grad (or they ran in a no-grad region)");
    nt__edge root = nt__edge_of(loss);
    if (root.node->freed)
        return nt__err(site, NT_ESTATE, fn,
                       "the graph behind 'loss' was already freed by an earlier nt_backward; "
                       "pass retain_graph = true to nt_backward_ex the first time");

    nt_scope *scope = nt_scope_begin(); /* every temporary of the pass */
    int rc = 0;
    gradmap gm = {g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free)};
    GPtrArray *order = reachable(root.node);
    nt_tensor *seed = nt_ones_like_at(site, loss);
    if (!seed) {
        rc = nt_last_error();
        goto out;
    }
    slots_of(&gm, root.node)[root.idx] = seed;
    nt_no_grad_begin();
    for (guint k = 0; k < order->len && !rc; k++) {
        nt__node *n = order->pdata[k];
        nt_tensor **gout = g_hash_table_lookup(gm.slots, n);
        if (!gout)
            continue; /* no gradient reaches it */
        if (n->op == NT__OP_ACCUMULATE) {
            if (n->leaf && n->leaf->st && gout[0])
                rc = accumulate_leaf(n->leaf, gout[0], site);
            continue;
        }
        const char *api = nt__op_api(n->op);
        if (n->freed) {
            rc = nt__err(site, NT_ESTATE, fn,
                         "part of the graph (%s) was freed by an earlier nt_backward; pass "
                         "retain_graph = true the first time", api);
            break;
        }
        if ((rc = check_versions(n, api)) != 0)
            break;
        nt_tensor *gin[64] = {0};
        nt_tensor **gp = n->nin <= 64 ? gin : g_new0(nt_tensor *, n->nin);
        nt__bctx b = {.n = n, .gin = gp, .site = &n->site};
        for (int i = 0; i < n->nout; i++)
            b.gout[i] = gout[i];
        /* Ops issued by the backward carry the forward's site and say whose
         * backward they belong to. */
        nt__tls_bwd_of = api;
        if (n->custom)
            rc = nt__custom_backward(&b);
        else
            rc = n->op < NT_OP_COUNT && nt__bwd_table[n->op].fn ? nt__bwd_table[n->op].fn(&b)
                                                               : NT_ENOTSUP;
        nt__tls_bwd_of = NULL;
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
                g = nt__copy_to(&n->site, fn, g, (nt_dtype)n->in_meta[i].dtype);
                if (!g) {
                    rc = nt_last_error();
                    break;
                }
            }
            rc = add_grad(&gm, n->next[i], g, &n->site);
        }
        if (gp != gin)
            g_free(gp);
        if (!retain) {
            drop_saved(n);
            n->freed = true;
        }
    }
    nt_no_grad_end();
out:
    g_ptr_array_unref(order);
    g_hash_table_destroy(gm.slots);
    nt_scope_end(scope);
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
