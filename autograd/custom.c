/* autograd/custom.c - user ops (nt_op_register / nt_op_call).
 *
 * A registered op gets an id past the built-ins; nt_op_call runs its forward
 * (built from ntensor ops, graph recording off) and records one node whose
 * backward is the user's, exactly as a built-in op's node is. */
#include "autograd.h"

#include <string.h>

#define NT_MAX_CUSTOM 1024

typedef struct nt__custom_op {
    nt_op_def def;
    char *name;
    char *api;
    nt__opinfo info;
} nt__custom_op;

static GMutex reg_lock;
static nt__custom_op *volatile reg[NT_MAX_CUSTOM];
static volatile AO_t nreg;

static const nt__custom_op *lookup(int op)
{
    int k = op - NT_OP_CUSTOM_BASE;
    if (k < 0 || (AO_t)k >= AO_load_acquire(&nreg))
        return NULL;
    return reg[k];
}

const nt__opinfo *nt__custom_opinfo(int op)
{
    const nt__custom_op *c = lookup(op);
    return c ? &c->info : NULL;
}

NT_API int nt_op_register(const nt_op_def *def)
{
    const char *fn = "nt_op_register";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!def)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'def' is NULL");
    if (!def->name || !*def->name)
        return nt__err(NULL, NT_EINVAL, fn, "def->name is empty");
    if (!def->forward)
        return nt__err(NULL, NT_EINVAL, fn, "def->forward is NULL (op '%s')", def->name);
    if (def->nin < 1 || def->nin > NT__MAX_IN)
        return nt__err(NULL, NT_EINVAL, fn, "def->nin is %d; expected 1..%d (op '%s')", def->nin,
                       NT__MAX_IN, def->name);
    g_mutex_lock(&reg_lock);
    AO_t n = nreg;
    for (AO_t i = 0; i < n; i++)
        if (!strcmp(reg[i]->name, def->name)) {
            g_mutex_unlock(&reg_lock);
            return nt__err(NULL, NT_EINVAL, fn, "an op named '%s' is already registered",
                           def->name);
        }
    if (n >= NT_MAX_CUSTOM) {
        g_mutex_unlock(&reg_lock);
        return nt__err(NULL, NT_ENOMEM, fn, "too many user ops (at most %d)", NT_MAX_CUSTOM);
    }
    nt__custom_op *c = g_new0(nt__custom_op, 1);
    c->def = *def;
    c->name = g_strdup(def->name);
    c->api = g_strdup_printf("nt_op_call(%s)", def->name);
    c->def.name = c->name;
    c->info = (nt__opinfo){c->name, c->api, def->nin, NT_KIND_CUSTOM, NT_OPF_DIFF};
    reg[n] = c;
    AO_store_release(&nreg, n + 1);
    g_mutex_unlock(&reg_lock);
    return NT_OP_CUSTOM_BASE + (int)n;
}

NT_API nt_tensor *nt_op_call_at(const nt_site *site, int op, nt_tensor *const *in)
{
    const char *fn = "nt_op_call";
    if (!nt__ensure_init())
        return NULL;
    const nt__custom_op *c = lookup(op);
    if (!c) {
        nt__err(site, NT_EINVAL, fn, "op %d is not a registered user op", op);
        return NULL;
    }
    if (!in) {
        nt__err(site, NT_EINVAL, fn, "argument 'in' is NULL (op '%s' takes %d inputs)", c->name,
                c->def.nin);
        return NULL;
    }
    for (int i = 0; i < c->def.nin; i++) {
        char name[16];
        snprintf(name, sizeof name, "in[%d]", i);
        if (!nt__check_arg(site, c->api, name, in[i]))
            return NULL;
    }
    bool grad = nt__ag_enabled();
    nt_scope *s = nt_scope_begin();
    nt_no_grad_begin();
    nt_tensor *out = c->def.forward(in, c->def.ctx);
    nt_no_grad_end();
    if (out && out->magic == NT__MAGIC_LIVE)
        nt_keep(out);
    else if (!out && !nt_last_error())
        nt__err(site, NT_EEXEC, c->api, "the forward of op '%s' returned NULL", c->name);
    nt_scope_end(s);
    if (!out)
        return NULL;
    bool any = false;
    for (int i = 0; i < c->def.nin; i++)
        any |= nt_requires_grad(in[i]);
    if (grad && any && nt__dtype_is_float((nt_dtype)out->dtype)) {
        nt__node *n = nt__node_new(op, c->def.nin, 1);
        n->site = site ? *site : (nt_site){0};
        n->custom = c;
        for (int i = 0; i < c->def.nin; i++) {
            n->in_meta[i].dtype = in[i]->dtype;
            n->in_meta[i].ndim = in[i]->ndim;
            memcpy(n->in_meta[i].shape, in[i]->shape, sizeof in[i]->shape);
            n->next[i] = nt__edge_of(in[i]);
            if (n->next[i].node)
                AO_fetch_and_add1(&n->next[i].node->refs);
            n->saved_in[i] = nt__save(in[i]);
            n->saved_in_ver[i] = AO_load(&in[i]->st->version);
        }
        n->saved_out[0] = nt__save(out);
        n->saved_out_ver[0] = AO_load(&out->st->version);
        struct nt__ag *ag = nt__ag_of(out);
        nt__node_unref(ag->grad_fn);
        ag->grad_fn = n;
        ag->out_idx = 0;
        ag->requires_grad = true;
    }
    return nt__scope_adopt(out);
}

NT_API nt_tensor *nt_op_call(int op, nt_tensor *const *in) { return nt_op_call_at(NT_RA_SITE, op, in); }

int nt__custom_backward(nt__bctx *b)
{
    const nt__custom_op *c = b->n->custom;
    if (!c->def.backward)
        return 0; /* no gradient flows through this op */
    if (!b->gout[0])
        return 0;
    nt_tensor *in[NT__MAX_IN] = {0};
    for (int i = 0; i < c->def.nin; i++)
        in[i] = b->n->saved_in[i];
    int rc = c->def.backward(b->gout[0], in, b->n->saved_out[0], b->gin, c->def.ctx);
    if (rc)
        return nt_last_error() ? nt_last_error()
                               : nt__err(b->site, rc, c->api, "the backward of op '%s' failed "
                                         "with code %d", c->name, rc);
    for (int i = 0; i < c->def.nin; i++)
        if (b->gin[i] && b->gin[i]->magic != NT__MAGIC_LIVE)
            return nt__err(b->site, NT_ERELEASED, c->api,
                           "the backward of op '%s' returned a released tensor for input %d",
                           c->name, i);
    return 0;
}

void nt__custom_shutdown(void)
{
    g_mutex_lock(&reg_lock);
    AO_t n = nreg;
    AO_store_release(&nreg, 0);
    for (AO_t i = 0; i < n; i++) {
        g_free(reg[i]->name);
        g_free(reg[i]->api);
        g_free(reg[i]);
        reg[i] = NULL;
    }
    g_mutex_unlock(&reg_lock);
}
