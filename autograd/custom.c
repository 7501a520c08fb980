/* autograd/custom.c - user ops (nt_op_register / nt_op_register_kernel /
 * nt_op_call).
 *
 * A registered op gets an id past the built-ins; nt_op_call runs its forward
 * (built from ntensor ops, graph recording off) -- or, for a tile-kernel op,
 * runs its shape rule and queues one record that neuron/user.c executes
 * -- and records one node whose backward is the user's, exactly as a
 * built-in op's node is. */
#include "autograd/autograd.h"
#include "core/backend.h"
#include "core/handle.h"

#include <string.h>

#define NT_MAX_CUSTOM 1024
/* An op's id also says which runtime registered it: id = NT_OP_CUSTOM_BASE +
 * slot * NT_MAX_CUSTOM + index, slot = the epoch (core/handle.h) modulo
 * NT_CUSTOM_SLOTS, so an id kept across nt_shutdown is refused (NT_ESTATE)
 * instead of naming whatever op the next runtime registered at its index
 * (until NT_CUSTOM_SLOTS runtimes later).  Ids stay below 65,536: a record
 * keeps its op in 16 bits. */
#define NT_CUSTOM_SLOTS ((65536 - NT_OP_CUSTOM_BASE) / NT_MAX_CUSTOM)
_Static_assert(NT_OP_CUSTOM_BASE + NT_CUSTOM_SLOTS * NT_MAX_CUSTOM <= 65536,
               "user op ids fit a record's 16-bit op");

static int cur_slot(void) { return (int)(nt__epoch() % NT_CUSTOM_SLOTS); }

/* Ops registered under each slot by the last runtime that used it: an id
 * past them was never returned, and is NT_EINVAL, not NT_ESTATE. */
static uint32_t slot_n[NT_CUSTOM_SLOTS];

/* Was op returned by an earlier runtime (not the running one)? */
static bool stale_id(int op)
{
    if (op < NT_OP_CUSTOM_BASE || op >= NT_OP_CUSTOM_BASE + NT_CUSTOM_SLOTS * NT_MAX_CUSTOM)
        return false;
    int k = op - NT_OP_CUSTOM_BASE, slot = k / NT_MAX_CUSTOM;
    return slot != cur_slot() && (uint32_t)(k % NT_MAX_CUSTOM) < slot_n[slot];
}

typedef struct nt__custom_op {
    nt_op_def def;
    nt_kernel_op_def kdef; /* kdef.kernel set: the forward is a tile kernel */
    char *name;
    char *api;
    nt__opinfo info;
} nt__custom_op;

static GMutex reg_lock;
static nt__custom_op *volatile reg[NT_MAX_CUSTOM];
static volatile AO_t nreg;

static const nt__custom_op *lookup(int op)
{
    if (op < NT_OP_CUSTOM_BASE) /* before subtracting: op - base overflows near INT_MIN */
        return NULL;
    int k = op - NT_OP_CUSTOM_BASE;
    if (k / NT_MAX_CUSTOM != cur_slot())
        return NULL; /* another runtime's id (or none) */
    k %= NT_MAX_CUSTOM;
    if ((AO_t)k >= AO_load_acquire(&nreg))
        return NULL;
    return reg[k];
}

const nt__opinfo *nt__custom_opinfo(int op)
{
    const nt__custom_op *c = lookup(op);
    return c ? &c->info : NULL;
}

/* The tile-kernel definition of op, or NULL (neuron/user.c runs it). */
const nt_kernel_op_def *nt__custom_kernel_def(int op)
{
    const nt__custom_op *c = lookup(op);
    return c && c->kdef.kernel ? &c->kdef : NULL;
}

static int register_op(const char *fn, const nt_op_def *def, const nt_kernel_op_def *kdef);

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
    return register_op(fn, def, NULL);
}

NT_API int nt_op_register_kernel(const nt_kernel_op_def *kdef)
{
    const char *fn = "nt_op_register_kernel";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!kdef)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'def' is NULL");
    if (!kdef->name || !*kdef->name)
        return nt__err(NULL, NT_EINVAL, fn, "def->name is empty");
    if (!kdef->shape)
        return nt__err(NULL, NT_EINVAL, fn, "def->shape (the shape rule) is NULL (op '%s')",
                       kdef->name);
    if (!kdef->kernel)
        return nt__err(NULL, NT_EINVAL, fn, "def->kernel is NULL (op '%s')", kdef->name);
    nt_op_def def = {kdef->name, kdef->nin, NULL, kdef->backward, kdef->ctx};
    return register_op(fn, &def, kdef);
}

static int register_op(const char *fn, const nt_op_def *def, const nt_kernel_op_def *kdef)
{
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
    nt__custom_op *c = calloc(1, sizeof *c);
    size_t alen = strlen(def->name) + sizeof "nt_op_call()";
    if (c) {
        c->name = strdup(def->name);
        c->api = malloc(alen);
    }
    if (!c || !c->name || !c->api) {
        if (c) {
            free(c->name);
            free(c->api);
        }
        free(c);
        g_mutex_unlock(&reg_lock);
        return nt__err_hostmem(NULL, fn, "a user op");
    }
    snprintf(c->api, alen, "nt_op_call(%s)", def->name);
    c->def = *def;
    if (kdef)
        c->kdef = *kdef;
    c->def.name = c->name;
    c->kdef.name = c->name;
    c->info = (nt__opinfo){c->name, c->api, def->nin, NT_KIND_CUSTOM, NT_OPF_DIFF};
    reg[n] = c;
    slot_n[cur_slot()] = (uint32_t)n + 1;
    AO_store_release(&nreg, n + 1);
    g_mutex_unlock(&reg_lock);
    return NT_OP_CUSTOM_BASE + cur_slot() * NT_MAX_CUSTOM + (int)n;
}

static int record_node(const nt_site *site, const nt__custom_op *c, int op,
                       nt_tensor *const *in, nt_tensor *out, bool grad);

/* A tile-kernel op: the shape rule, then one queued record like any op. */
static nt_tensor *call_kernel_op(const nt_site *site, const nt__custom_op *c, int op,
                                 nt_tensor *const *in)
{
    nt_tensor_view iv[NT__MAX_IN], ov;
    for (int i = 0; i < c->def.nin; i++)
        nt__tensor_view_of(&iv[i], in[i]);
    memset(&ov, 0, sizeof ov);
    ov.dtype = NT_DTYPE_COUNT;
    char why[256] = "";
    int rc = c->kdef.shape(iv, c->def.nin, &ov, why, sizeof why, c->kdef.ctx);
    if (rc) {
        /* only an NT_E* code passes through; anything else is NT_EINVAL */
        nt__err(site, rc < 0 && rc >= NT_EFORMAT ? rc : NT_EINVAL, c->api,
                "the shape rule of op '%s' rejected the "
                "inputs: %s", c->name, why[0] ? why : "(no reason given)");
        return NULL;
    }
    bool bad = (unsigned)ov.dtype >= NT_DTYPE_COUNT || ov.ndim < 0 || ov.ndim > NT_MAX_DIMS;
    for (int i = 0; !bad && i < ov.ndim; i++)
        bad = ov.shape[i] < 0;
    if (bad) {
        nt__err(site, NT_EINVAL, c->api,
                "the shape rule of op '%s' returned a bad output (dtype %d, %d dims)", c->name,
                (int)ov.dtype, ov.ndim);
        return NULL;
    }
    nt__call call;
    if (!nt__call_begin(&call, site, c->api, op, c->def.nin, in, "in0,in1,in2,in3"))
        return nt__call_fail(&call);
    call.no_grad = true; /* the node is recorded by nt_op_call, as for every user op */
    call.odt[0] = ov.dtype;
    call.ondim[0] = ov.ndim;
    memcpy(call.oshape[0], ov.shape, sizeof call.oshape[0]);
    call.flops = (double)nt__numel(ov.ndim, ov.shape);
    return nt__dispatch(&call);
}

NT_API nt_tensor *nt_op_call_at(const nt_site *site, int op, nt_tensor *const *in)
{
    const char *fn = "nt_op_call";
    if (!nt__ensure_init())
        return NULL;
    const nt__custom_op *c = lookup(op);
    if (!c && stale_id(op)) {
        nt__err(site, NT_ESTATE, fn, "argument 'op' (%d) was registered before the last "
                "nt_shutdown; register the op again after nt_init", op);
        return NULL;
    }
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
    nt_tensor *out;
    if (c->kdef.kernel) {
        out = call_kernel_op(site, c, op, in);
        if (!out)
            return NULL;
        if (record_node(site, c, op, in, out, grad) < 0) {
            nt_release(out); /* still in the scope's list, which skips it once released */
            return NULL;
        }
        return out; /* nt__dispatch adopted it into the open scope */
    }
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, c->api, "a scope");
        return NULL;
    }
    nt_no_grad_begin();
    nt__user_code_begin();
    out = c->def.forward(in, c->def.ctx);
    nt__user_code_end();
    nt_no_grad_end();
    if (out && out->magic == NT__MAGIC_LIVE)
        nt_keep(out);
    else if (!out && !nt_last_error())
        nt__err(site, NT_EEXEC, c->api, "the forward of op '%s' returned NULL", c->name);
    else if (!out)
        nt__err_within(c->api); /* an op of the forward failed: say in which call */
    nt_scope_end(s);
    if (!out)
        return NULL;
    if (record_node(site, c, op, in, out, grad) < 0) {
        nt_release(out);
        return NULL;
    }
    return nt__scope_adopt(out, c->api);
}

/* The autograd node of a user op's call, as a built-in op gets. */
static int record_node(const nt_site *site, const nt__custom_op *c, int op,
                       nt_tensor *const *in, nt_tensor *out, bool grad)
{
    if (!grad && nt__ckpt_capturing)
        nt__ckpt_capture(in, c->def.nin); /* a kernel op's inputs reach no other hook */
    bool any = false;
    for (int i = 0; i < c->def.nin; i++)
        any |= nt_requires_grad(in[i]);
    if (grad && any && nt__dtype_is_float((nt_dtype)out->dtype)) {
        nt__node *n = nt__node_new(op, c->def.nin, 1);
        if (!n)
            return nt__err_hostmem(site, c->api, "an autograd node");
        n->site = site ? *site : (nt_site){0};
        n->custom = c;
        for (int i = 0; i < c->def.nin; i++) {
            n->in_meta[i].dtype = in[i]->dtype;
            n->in_meta[i].ndim = in[i]->ndim;
            memcpy(n->in_meta[i].shape, in[i]->shape, sizeof in[i]->shape);
            n->next[i] = nt__edge_of(in[i]);
            if (n->next[i].node)
                AO_fetch_and_add1(&n->next[i].node->refs);
            else if (nt_requires_grad(in[i]))
                goto oom;
            n->saved_in[i] = nt__save(in[i]);
            if (!n->saved_in[i])
                goto oom;
            n->saved_in_ver[i] = AO_load(&in[i]->st->version);
        }
        n->saved_out[0] = nt__save(out);
        n->saved_out_ver[0] = AO_load(&out->st->version);
        struct nt__ag *ag = n->saved_out[0] ? nt__ag_of(out) : NULL;
        if (!ag) {
        oom:
            nt__node_unref(n);
            return nt__err_hostmem(site, c->api, "autograd's record of the op");
        }
        nt__node_unref(ag->grad_fn);
        ag->grad_fn = n;
        ag->out_idx = 0;
        ag->requires_grad = true;
    }
    return 0;
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
    /* (in a create_graph pass, with their places in the graph: a backward
     * made of ntensor ops records, and differentiates again) */
    for (int i = 0; i < c->def.nin; i++)
        in[i] = nt__saved_in(b, i);
    nt__user_code_begin();
    int rc = c->def.backward(b->gout[0], in, nt__saved_out(b, 0), b->gin, c->def.ctx);
    nt__user_code_end();
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
    /* (nt_shutdown has moved the epoch on: this is the next runtime's slot,
     * last used NT_CUSTOM_SLOTS runtimes ago) */
    slot_n[cur_slot()] = 0;
    AO_t n = nreg;
    AO_store_release(&nreg, 0);
    for (AO_t i = 0; i < n; i++) {
        free(reg[i]->name);
        free(reg[i]->api);
        free(reg[i]);
        reg[i] = NULL;
    }
    g_mutex_unlock(&reg_lock);
}
