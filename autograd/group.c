/* autograd/group.c - group ops: one op over the members of a communicator
 * whose backward needs every member's output gradient at once (the
 * differentiable collectives and tensor-parallel layers of dist/tp.c).
 * The pass's side (running the group's backward once, at the first member
 * it reaches) is grp_backward in autograd/tape.c; autograd/autograd.h says
 * why every member's gradient is final then. */
#include "autograd/autograd.h"

void nt__grp_drop_results(nt__grp *g)
{
    size_t total = (size_t)g->nmem * (size_t)g->nin;
    for (size_t i = 0; i < total; i++)
        if (g->gin[i]) {
            nt_release(g->gin[i]);
            g->gin[i] = NULL;
        }
    g->pending = 0;
}

static void grp_free(nt__grp *g)
{
    nt__grp_drop_results(g);
    if (g->free_ctx)
        g->free_ctx(g->ctx);
    free(g->mem);
    free(g->gin);
    free(g);
}

void nt__grp_unref(nt__grp *g, int member)
{
    if (!g)
        return;
    if (member >= 0 && member < g->nmem)
        g->mem[member] = NULL;
    if (nt__ref_drop(&g->refs, 1))
        grp_free(g);
}

static void meta_of(nt__tmeta *m, const nt_tensor *t)
{
    m->dtype = t->dtype;
    m->ndim = (int8_t)t->ndim;
    m->dev = (uint8_t)t->dev;
    memcpy(m->shape, t->shape, sizeof m->shape);
}

/* Member m's node: edges to its inputs, its output's place in the graph. */
static int member_node(nt__grp *g, int m, const nt_site *site, nt_tensor *const *in,
                       nt_tensor *out)
{
    nt__node *n = nt__node_new(NT__OP_GROUP, g->nin, 1);
    if (!n) {
        nt__grp_unref(g, -1); /* the member's reference (a node's goes with it) */
        return NT_EHOSTMEM;
    }
    n->site = site ? *site : (nt_site){0};
    n->grp = g;
    n->grp_idx = m;
    g->mem[m] = n;
    for (int i = 0; i < g->nin; i++) {
        nt_tensor *x = in[i];
        if (!x)
            continue;
        meta_of(&n->in_meta[i], x);
        if (!nt_requires_grad(x))
            continue;
        n->next[i] = nt__edge_of(x);
        if (!n->next[i].node) {
            nt__node_unref(n);
            return NT_EHOSTMEM;
        }
        AO_fetch_and_add1(&n->next[i].node->refs);
    }
    meta_of(&n->out_meta[0], out);
    struct nt__ag *ag = nt__ag_of(out);
    if (!ag) {
        nt__node_unref(n);
        return NT_EHOSTMEM;
    }
    nt__node_unref(ag->grad_fn);
    ag->grad_fn = n;
    ag->out_idx = 0;
    ag->requires_grad = true;
    return 0;
}

int nt__grp_record(const nt_site *site, const char *api, int nmem, int nin,
                   nt_tensor *const *in, nt_tensor *const *out, nt__grp_bwd_fn bwd,
                   void (*free_ctx)(void *), void *ctx)
{
    bool any = false;
    for (int i = 0; i < nmem * nin; i++)
        any |= in[i] && nt_requires_grad(in[i]);
    if (!nt__ag_enabled() || !any) {
        if (free_ctx)
            free_ctx(ctx);
        return 0;
    }
    nt__grp *g = calloc(1, sizeof *g);
    nt__node **mem = calloc((size_t)nmem, sizeof *mem);
    nt_tensor **gin = calloc((size_t)nmem * (size_t)nin + 1, sizeof *gin);
    if (!g || !mem || !gin) {
        free(g);
        free(mem);
        free(gin);
        if (free_ctx)
            free_ctx(ctx);
        return nt__err_hostmem(site, api, "a group op's autograd record");
    }
    *g = (nt__grp){.refs = (AO_t)nmem, .nmem = nmem, .nin = nin, .api = api, .bwd = bwd,
                   .free_ctx = free_ctx, .ctx = ctx, .mem = mem, .gin = gin};
    int rc = 0, m = 0;
    for (; m < nmem; m++)
        if ((rc = member_node(g, m, site, in + (size_t)m * nin, out[m])) != 0)
            break;
    if (!rc)
        return 0;
    /* Undo: member m dropped its reference; the earlier members' outputs
     * forget their nodes (each drops one), the later members' go here. */
    for (int k = 0; k < m; k++) {
        struct nt__ag *ag = out[k]->ag;
        if (ag && ag->grad_fn == g->mem[k]) {
            nt__node *n = ag->grad_fn;
            ag->grad_fn = NULL;
            ag->requires_grad = false;
            nt__node_unref(n);
        }
    }
    for (int k = m + 1; k < nmem; k++)
        nt__grp_unref(g, -1);
    return nt__err_hostmem(site, api, "a group op's autograd record");
}
