/* autograd/grad_hooks.c - tensor hooks and retained gradients (issue 34):
 * nt_register_hook (torch.Tensor.register_hook) and nt_retain_grad
 * (torch.Tensor.retain_grad).
 *
 * Both hang an entry on the node whose output the tensor is (a leaf: on its
 * gradient accumulator), at that output's index.  nt_backward, when it
 * reaches that node -- every contribution to the tensor's gradient summed
 * by then, since the nodes run in reverse creation order --, calls
 * nt__run_hooks on the output's gradient before the node's backward (a
 * leaf: before the gradient goes into .grad): the hooks in the order they
 * were registered, each seeing the one before's result, then the retained
 * .grad, which gets the final gradient (added to the one it already has,
 * as a leaf's .grad is).
 *
 * nt_register_hook_handle also gives a handle (torch's RemovableHandle):
 * nt_remove_hook marks the entry removed (passes skip it; it is freed with
 * its node, so a pass never sees the list change), and the handle table
 * below says which handles are live, so a second removal or a made-up
 * handle is an error rather than a write to freed memory. */
#include "autograd/autograd.h"

#include <pthread.h>
#include <string.h>

/* Handles (nt_register_hook_handle): every handle given out and not yet
 * removed, in the order given (so sorted), with its hook, or NULL once the
 * hook's node has gone.  One lock for all threads. */
typedef struct {
    nt_hook_handle id;
    nt__ghook *h;
} handle_ent;
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static handle_ent *handles;
static size_t n_handles, cap_handles;
static nt_hook_handle last_handle;

/* The entry of id (the lock held), or NULL. */
static handle_ent *handle_find(nt_hook_handle id)
{
    size_t lo = 0, hi = n_handles;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (handles[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n_handles && handles[lo].id == id ? &handles[lo] : NULL;
}

/* A new handle for h; 0: out of host memory. */
static nt_hook_handle handle_new(nt__ghook *h)
{
    nt_hook_handle id = 0;
    pthread_mutex_lock(&handles_lock);
    if (n_handles == cap_handles) {
        size_t nc = cap_handles ? 2 * cap_handles : 16;
        handle_ent *nh = realloc(handles, nc * sizeof *nh);
        if (!nh)
            goto out;
        handles = nh, cap_handles = nc;
    }
    id = ++last_handle;
    handles[n_handles++] = (handle_ent){id, h};
    h->id = id;
out:
    pthread_mutex_unlock(&handles_lock);
    return id;
}

/* The node and output index that carry t's gradient; NULL: out of memory. */
static nt__node *hook_node(nt_tensor *t, int *idx)
{
    nt__edge e = nt__edge_of(t);
    *idx = e.idx;
    return e.node;
}

static nt__ghook *hook_add(nt__node *n, int idx)
{
    nt__ghook *h = calloc(1, sizeof *h), **at = &n->hooks;
    if (!h)
        return NULL;
    h->idx = idx;
    while (*at)
        at = &(*at)->next;
    *at = h;
    return h;
}

/* The checks both share: a live floating tensor that requires grad. */
static bool hook_target(const nt_site *site, const char *fn, nt_tensor *t)
{
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t))
        return false;
    if (!nt__dtype_is_float((nt_dtype)t->dtype)) {
        nt__err(site, NT_EDTYPE, fn, "argument 't' has dtype %s; only floating tensors have "
                "gradients", nt_dtype_name((nt_dtype)t->dtype));
        return false;
    }
    if (!t->ag || !t->ag->requires_grad) {
        nt__err(site, NT_ESTATE, fn, "argument 't' does not require grad (no gradient will reach "
                "it): call nt_set_requires_grad on a leaf, or use a result of ops on one");
        return false;
    }
    return true;
}

static int register_hook(const nt_site *site, const char *api, nt_tensor *t, nt_grad_hook fn,
                         void *ctx, nt_hook_handle *handle)
{
    if (!hook_target(site, api, t))
        return nt_last_error();
    if (!fn)
        return nt__err(site, NT_EINVAL, api, "argument 'fn' is NULL; expected a function");
    int idx;
    nt__node *n = hook_node(t, &idx);
    nt__ghook *h = n ? hook_add(n, idx) : NULL;
    if (!h)
        return nt__err_hostmem(site, api, "a hook");
    h->fn = fn, h->ctx = ctx;
    if (handle && !(*handle = handle_new(h))) {
        h->removed = true; /* stays on the list, inert */
        return nt__err_hostmem(site, api, "a hook's handle");
    }
    return 0;
}
NT_API int nt_register_hook_at(const nt_site *site, nt_tensor *t, nt_grad_hook fn, void *ctx)
{
    return register_hook(site, "nt_register_hook", t, fn, ctx, NULL);
}
NT_API int nt_register_hook(nt_tensor *t, nt_grad_hook fn, void *ctx)
{
    return nt_register_hook_at(NT_RA_SITE, t, fn, ctx);
}
NT_API int nt_register_hook_handle_at(const nt_site *site, nt_tensor *t, nt_grad_hook fn,
                                      void *ctx, nt_hook_handle *handle)
{
    const char *api = "nt_register_hook_handle";
    if (!handle) {
        if (!nt__ensure_init())
            return nt_last_error();
        return nt__err(site, NT_EINVAL, api, "argument 'handle' is NULL; expected where to put "
                       "the hook's handle");
    }
    *handle = 0;
    return register_hook(site, api, t, fn, ctx, handle);
}
NT_API int nt_register_hook_handle(nt_tensor *t, nt_grad_hook fn, void *ctx,
                                   nt_hook_handle *handle)
{
    return nt_register_hook_handle_at(NT_RA_SITE, t, fn, ctx, handle);
}

NT_API int nt_remove_hook_at(const nt_site *site, nt_hook_handle handle)
{
    const char *api = "nt_remove_hook";
    if (!nt__ensure_init())
        return nt_last_error();
    pthread_mutex_lock(&handles_lock);
    handle_ent *e = handle_find(handle);
    nt_hook_handle last = last_handle;
    if (e) {
        if (e->h)
            e->h->removed = true;
        size_t k = (size_t)(e - handles);
        memmove(e, e + 1, (n_handles - k - 1) * sizeof *e);
        n_handles--;
    }
    pthread_mutex_unlock(&handles_lock);
    if (e)
        return 0;
    if (handle == 0 || handle > last)
        return nt__err(site, NT_EINVAL, api, "argument 'handle' is %llu, unknown: not a handle "
                       "nt_register_hook_handle gave out", (unsigned long long)handle);
    return nt__err(site, NT_ESTATE, api, "argument 'handle' (%llu): the hook was already removed",
                   (unsigned long long)handle);
}
NT_API int nt_remove_hook(nt_hook_handle handle) { return nt_remove_hook_at(NT_RA_SITE, handle); }

NT_API int nt_retain_grad_at(const nt_site *site, nt_tensor *t)
{
    const char *api = "nt_retain_grad";
    if (!hook_target(site, api, t))
        return nt_last_error();
    struct nt__ag *ag = t->ag;
    if (!ag->grad_fn || ag->retain_node == ag->grad_fn)
        return 0; /* a leaf keeps its .grad anyway; asked before: once is enough */
    int idx;
    nt__node *n = hook_node(t, &idx);
    nt__ghook *h = n ? hook_add(n, idx) : NULL;
    if (!h)
        return nt__err_hostmem(site, api, "a retained gradient");
    if (ag->retain_node) /* an in-place op since moved t to a new node */
        nt__ag_unretain(ag);
    h->ag = ag;
    AO_fetch_and_add1(&n->refs);
    ag->retain_node = n;
    return 0;
}
NT_API int nt_retain_grad(nt_tensor *t) { return nt_retain_grad_at(NT_RA_SITE, t); }

/* t's autograd state is going: its entry stops retaining. */
void nt__ag_unretain(struct nt__ag *ag)
{
    nt__node *n = ag->retain_node;
    if (!n)
        return;
    for (nt__ghook *h = n->hooks; h; h = h->next)
        if (h->ag == ag)
            h->ag = NULL;
    ag->retain_node = NULL;
    nt__node_unref(n);
}

void nt__hooks_free(nt__node *n)
{
    for (nt__ghook *h = n->hooks, *nx; h; h = nx) {
        nx = h->next;
        if (h->id) { /* the handle outlives the hook (removed: no entry left) */
            pthread_mutex_lock(&handles_lock);
            handle_ent *e = handle_find(h->id);
            if (e)
                e->h = NULL;
            pthread_mutex_unlock(&handles_lock);
        }
        free(h);
    }
    n->hooks = NULL;
}

/* g into ag->grad: a copy the first time, then out-of-place sums (the
 * slot's tensor may flow on and be written in place). */
static int retain_into(struct nt__ag *ag, nt_tensor *g, const nt_site *site)
{
    nt_tensor *s = ag->grad ? nt__binary(site, "nt_backward", NT_OP_ADD, ag->grad, g)
                            : nt__copy_to(site, "nt_backward", g, (nt_dtype)g->dtype);
    if (!s)
        return nt_last_error();
    nt_keep(s);
    if (ag->grad)
        nt_release(ag->grad);
    ag->grad = s;
    return 0;
}

/* Runs n's hooks on its output gradients gout (NULL: none reached that
 * output; its hooks do not run), replacing a slot with what a hook returns. */
int nt__run_hooks(nt__node *n, nt_tensor **gout, const nt_site *site)
{
    for (nt__ghook *h = n->hooks; h; h = h->next) {
        nt_tensor *g = gout[h->idx];
        if (!g || h->removed)
            continue;
        if (!h->fn) {
            int rc = h->ag ? retain_into(h->ag, g, site) : 0;
            if (rc)
                return rc;
            continue;
        }
        nt__devsw d;
        nt__dev_enter(&d, g->dev); /* the hook's ops go where the gradient is */
        nt_tensor *r = h->fn(g, h->ctx);
        nt__dev_leave(&d);
        if (!r || r == g)
            continue;
        if (r->magic != NT__MAGIC_LIVE || !nt__dtype_is_float((nt_dtype)r->dtype) ||
            r->ndim != g->ndim || memcmp(r->shape, g->shape, (size_t)g->ndim * sizeof *g->shape)) {
            char s1[128], s2[128];
            bool live = r->magic == NT__MAGIC_LIVE;
            return nt__err(site, NT_ESHAPE, "nt_backward",
                           "a hook (nt_register_hook) returned %s %s for a gradient %s %s; "
                           "expected a live floating tensor of the gradient's shape",
                           live ? nt_dtype_name((nt_dtype)r->dtype) : "a released tensor",
                           live ? nt__shape_str(r->ndim, r->shape, s1, sizeof s1) : "",
                           nt_dtype_name((nt_dtype)g->dtype),
                           nt__shape_str(g->ndim, g->shape, s2, sizeof s2));
        }
        if (r->dtype != g->dtype && !(r = nt__copy_to(site, "nt_backward", r, (nt_dtype)g->dtype)))
            return nt_last_error();
        nt_retain(r);
        nt_release(g);
        gout[h->idx] = r;
    }
    return 0;
}
