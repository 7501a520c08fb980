/* dist/tp.c - tensor parallelism: differentiable collectives (Megatron's f
 * and g operators, gather <-> reduce-scatter, split <-> gather) and the
 * tensor-parallel layers (column- and row-parallel linear, vocabulary-
 * parallel embedding and cross-entropy, attention heads split over the
 * group), defined so that the split does not change the bits
 * (docs/parallel.md).
 *
 * Every call takes one tensor per local member of the communicator (as the
 * collectives do) and gives one per member.  The ops that need every
 * member's gradient at once are group ops (autograd/group.c): one node per
 * member, one backward for all.  A sum that the split would cut (the
 * row-parallel product's K, the column-parallel input gradient's N, the
 * cross-entropy's sum of exponentials) is defined over a fixed number of
 * blocks combined in the rank tree's order: each member adds its own
 * consecutive blocks pairwise, level by level, and nt_all_reduce's rank
 * tree adds the members' sums -- together the tree over all blocks,
 * whatever the group's size (dist/tree.c says why it composes). */
#include "autograd/autograd.h"
#include "dispatcher/dispatch.h"
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TP_MAXM 64 /* local members a call takes */

/* ------------------------------------------------------------------ */
/* Checks                                                              */
/* ------------------------------------------------------------------ */

/* The communicator, the output array (cleared) and the local members. */
static int tp_begin(const nt_site *site, const char *fn, nt_comm *c, nt_tensor **out,
                    const int **devs)
{
    int rc = nt__comm_valid(site, fn, c);
    if (rc)
        return rc;
    int n = nt__comm_local(c, devs);
    if (n > TP_MAXM)
        return nt__err(site, NT_EINVAL, fn, "the communicator has %d local members; at most %d",
                       n, TP_MAXM);
    if (out)
        for (int i = 0; i < n; i++)
            out[i] = NULL;
    if (!out)
        return nt__err(site, NT_EINVAL, fn, "argument 'out' is NULL");
    return 0;
}

/* arr[0..n) live, on their members' devices; floating when asked; with
 * `same`, one shape and dtype.  opt: the array itself may be NULL. */
static int tp_arg(const nt_site *site, const char *fn, const char *arg, nt_tensor *const *arr,
                  int n, const int *devs, bool floating, bool same, bool opt)
{
    if (!arr)
        return opt ? 0
                   : nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL (one tensor per local "
                                                  "member expected)", arg);
    char name[48], a[128], b[128];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s[%d]", arg, i);
        if (!nt__check_arg(site, fn, name, arr[i]))
            return nt_last_error();
        if (arr[i]->dev != devs[i])
            return nt__err(site, NT_EINVAL, fn,
                           "%s is on device %d; expected member %d's device %d (one tensor per "
                           "member, in the communicator's order)", name, arr[i]->dev, i, devs[i]);
        if (floating && !nt__dtype_is_float((nt_dtype)arr[i]->dtype))
            return nt__err(site, NT_EDTYPE, fn, "%s is %s; expected a floating dtype", name,
                           nt_dtype_name((nt_dtype)arr[i]->dtype));
        if (!same || i == 0)
            continue;
        if (arr[i]->dtype != arr[0]->dtype)
            return nt__err(site, NT_EDTYPE, fn, "%s is %s; %s[0] is %s: expected one dtype",
                           name, nt_dtype_name((nt_dtype)arr[i]->dtype), arg,
                           nt_dtype_name((nt_dtype)arr[0]->dtype));
        if (arr[i]->ndim != arr[0]->ndim ||
            memcmp(arr[i]->shape, arr[0]->shape, sizeof(int64_t) * (size_t)arr[0]->ndim))
            return nt__err(site, NT_ESHAPE, fn, "%s has shape %s; %s[0] has %s: expected one "
                           "shape on every member", name,
                           nt__shape_str(arr[i]->ndim, arr[i]->shape, a, sizeof a), arg,
                           nt__shape_str(arr[0]->ndim, arr[0]->shape, b, sizeof b));
    }
    return 0;
}

/* blocks: a multiple of the group's size with a power-of-two quotient,
 * dividing `extent` (the size of the dimension it cuts). */
static int tp_blocks(const nt_site *site, const char *fn, int blocks, int size, int64_t extent,
                     const char *what)
{
    int q = size > 0 ? blocks / size : 0;
    if (blocks < 1 || blocks % size || (q & (q - 1)))
        return nt__err(site, NT_EINVAL, fn,
                       "blocks is %d; expected a multiple of the group's size %d whose quotient "
                       "is a power of two (1, 2, 4, ...)", blocks, size);
    if (extent % blocks)
        return nt__err(site, NT_ESHAPE, fn, "%s is %lld, which %d blocks do not divide", what,
                       (long long)extent, blocks);
    return 0;
}

/* Ends a group call's scope (dist/dist.h); on success out[0..n) go to
 * the caller's scope, else they are NULL and rc is returned. */
int nt__group_end(nt_scope *s, const char *fn, int rc, nt_tensor **out, int n)
{
    for (int i = 0; i < n && !rc; i++)
        if (!out[i])
            rc = nt__err_or(NT_EINVAL);
    if (!rc)
        for (int i = 0; i < n; i++)
            nt_keep(out[i]);
    nt_scope_end(s);
    if (rc) {
        for (int i = 0; i < n; i++)
            out[i] = NULL;
        return rc;
    }
    bool ok = true;
    for (int i = 0; i < n; i++)
        ok &= (out[i] = nt__scope_adopt(out[i], fn)) != NULL;
    return ok ? 0 : nt_last_error();
}

/* Adjacent pairs, level by level, an odd last one carried: the rank
 * tree's order (dist/tree.c) over v[0..n) (dist/dist.h). */
nt_tensor *nt__group_tree_sum(const nt_site *site, nt_tensor **v, int n)
{
    for (int len = n; len > 1; len = (len + 1) / 2)
        for (int i = 0; 2 * i < len; i++)
            v[i] = 2 * i + 1 < len ? nt_add_at(site, v[2 * i], v[2 * i + 1]) : v[2 * i];
    return v[0];
}

/* dist/dist.h */
int nt__group_save_pairs(const nt_site *site, const char *fn, int n, nt_tensor *const *xs,
                         nt_tensor *const *ws, nt_tensor **x, nt_tensor **w)
{
    for (int i = 0; i < n; i++) {
        x[i] = nt__save(xs[i]);
        w[i] = nt__save(ws[i]);
        if (!x[i] || !w[i])
            return nt__err_hostmem(site, fn, "the op's saved tensors");
    }
    return 0;
}

void nt__group_release_pairs(int n, nt_tensor **x, nt_tensor **w)
{
    for (int i = 0; i < n; i++) {
        if (x[i])
            nt_release(x[i]);
        if (w[i])
            nt_release(w[i]);
    }
}

/* The tensor as [rows, last] (a view when it can be). */
static nt_tensor *as_2d(const nt_site *site, nt_tensor *t)
{
    int64_t last = t->ndim ? t->shape[t->ndim - 1] : 1;
    int64_t rows = last ? nt__numel(t->ndim, t->shape) / last : 0;
    return nt_reshape_at(site, t, 2, (int64_t[]){rows, last});
}

/* ------------------------------------------------------------------ */
/* The differentiable collectives                                      */
/* ------------------------------------------------------------------ */

enum { K_COPY, K_REDUCE, K_GATHER, K_SPLIT, K_JOIN };

typedef struct coll_ctx {
    nt_comm *c;
    int kind, dim, n;
    const int *devs;
    nt_site site;
    nt__tmeta in[TP_MAXM]; /* each member's input */
} coll_ctx;

static const char *const coll_api[] = {"nt_tp_copy", "nt_tp_reduce", "nt_tp_gather",
                                       "nt_tp_split", "nt_tp_join"};

/* t with dims 0 and dim swapped, contiguous (dim 0: t). */
static nt_tensor *to_front(const nt_site *site, nt_tensor *t, int dim)
{
    return dim == 0 ? t : nt_contiguous_at(site, nt_transpose_at(site, t, 0, dim));
}
static nt_tensor *from_front(const nt_site *site, nt_tensor *t, int dim)
{
    return dim == 0 ? t : nt_contiguous_at(site, nt_transpose_at(site, t, 0, dim));
}

/* Every member's gradient, zeros where none came (shaped like `like`). */
static int fill_missing(const nt_site *site, const int *devs, int n, nt_tensor *const *gout,
                        const nt__tmeta *like, nt_tensor **g)
{
    for (int i = 0; i < n; i++) {
        g[i] = gout[i];
        if (g[i])
            continue;
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        g[i] = nt_zeros_at(site, (nt_dtype)like->dtype, like->ndim, like->shape);
        nt__dev_leave(&d);
        if (!g[i])
            return nt_last_error();
    }
    return 0;
}

/* A member's slice along dim: the block of its global rank. */
static nt_tensor *rank_slice(const nt_site *site, nt_comm *c, int i, nt_tensor *t, int dim)
{
    int64_t part = t->shape[dim] / nt_comm_size(c);
    int64_t r = nt_comm_rank(c, i);
    return nt_contiguous_at(site, nt_slice_at(site, t, dim, r * part, (r + 1) * part, 1));
}

static int coll_bwd(void *ctxp, nt_tensor *const *gout, nt_tensor **gin)
{
    coll_ctx *x = ctxp;
    const nt_site *site = &x->site;
    int n = x->n, nin = x->kind == K_JOIN ? n : 1;
    nt_tensor *g[TP_MAXM], *r[TP_MAXM];
    if (x->kind == K_JOIN) {
        if (!gout[0])
            return 0;
        for (int i = 0; i < n; i++) {
            gin[i] = nt_to_device_at(site, gout[0], x->devs[i]);
            if (!gin[i])
                return nt_last_error();
        }
        return 0;
    }
    if (x->kind == K_REDUCE) { /* g: identity */
        for (int i = 0; i < n; i++)
            gin[i * nin] = gout[i];
        return 0;
    }
    /* the output's shape: the input's, the gathered dim n times longer, the
     * split dim n times shorter */
    nt__tmeta om = x->in[0];
    if (x->kind == K_GATHER)
        om.shape[x->dim] *= nt_comm_size(x->c);
    if (x->kind == K_SPLIT)
        om.shape[x->dim] /= nt_comm_size(x->c);
    int rc = fill_missing(site, x->devs, n, gout, &om, g);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        g[i] = to_front(site, g[i], x->dim);
        nt__dev_leave(&d);
        rc = g[i] ? 0 : nt_last_error();
    }
    if (rc)
        return rc;
    if (x->kind == K_COPY)
        rc = nt_all_reduce_at(site, x->c, g, r, NT_REDUCE_SUM);
    else if (x->kind == K_GATHER)
        rc = nt_reduce_scatter_at(site, x->c, g, r, NT_REDUCE_SUM);
    else
        rc = nt_all_gather_at(site, x->c, g, r);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        gin[i] = from_front(site, r[i], x->dim);
        nt__dev_leave(&d);
        rc = gin[i] ? 0 : nt_last_error();
    }
    return rc;
}

/* The forward of one differentiable collective, with grad off. */
static int coll_fwd(const nt_site *site, coll_ctx *x, nt_tensor *const *in, nt_tensor **out)
{
    int n = x->n, rc = 0;
    nt_tensor *t[TP_MAXM] = {0}, *gt[TP_MAXM] = {0};
    switch (x->kind) {
    case K_COPY:
    case K_SPLIT:
        for (int i = 0; i < n && !rc; i++) {
            nt__devsw d;
            nt__dev_enter(&d, x->devs[i]);
            out[i] = x->kind == K_COPY
                         ? nt_reshape_at(site, in[i], in[i]->ndim, in[i]->shape)
                         : rank_slice(site, x->c, i, in[i], x->dim);
            nt__dev_leave(&d);
            rc = out[i] ? 0 : nt_last_error();
        }
        return rc;
    case K_REDUCE:
        return nt_all_reduce_at(site, x->c, in, out, NT_REDUCE_SUM);
    case K_GATHER:
        for (int i = 0; i < n && !rc; i++) {
            nt__devsw d;
            nt__dev_enter(&d, x->devs[i]);
            t[i] = to_front(site, in[i], x->dim);
            nt__dev_leave(&d);
            rc = t[i] ? 0 : nt_last_error();
        }
        if (!rc)
            rc = nt_all_gather_at(site, x->c, t, gt);
        for (int i = 0; i < n && !rc; i++) {
            nt__devsw d;
            nt__dev_enter(&d, x->devs[i]);
            out[i] = from_front(site, gt[i], x->dim);
            nt__dev_leave(&d);
            rc = out[i] ? 0 : nt_last_error();
        }
        return rc;
    default: /* K_JOIN */
        out[0] = nt_reshape_at(site, in[0], in[0]->ndim, in[0]->shape);
        return out[0] ? 0 : nt_last_error();
    }
}

static int tp_coll(const nt_site *site, int kind, nt_comm *c, nt_tensor *const *in,
                   nt_tensor **out, int dim)
{
    const char *fn = coll_api[kind];
    const int *devs;
    int rc = tp_begin(site, fn, c, out, &devs);
    if (rc)
        return rc;
    int n = nt__comm_local(c, &devs), size = nt_comm_size(c);
    if ((rc = tp_arg(site, fn, "in", in, n, devs, true, true, false)) != 0)
        return rc;
    int nd = in[0]->ndim;
    if (kind == K_GATHER || kind == K_SPLIT) {
        if (nd == 0)
            return nt__err(site, NT_ESHAPE, fn, "in[0] is 0-d; expected at least one dim");
        if (dim < -nd || dim >= nd)
            return nt__err(site, NT_EINVAL, fn, "dim is %d; expected -%d .. %d", dim, nd, nd - 1);
        dim = dim < 0 ? dim + nd : dim;
        if (kind == K_SPLIT && in[0]->shape[dim] % size)
            return nt__err(site, NT_ESHAPE, fn,
                           "in[0]'s dim %d is %lld, which the group's size %d does not divide",
                           dim, (long long)in[0]->shape[dim], size);
    }
    coll_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return nt__err_hostmem(site, fn, "the op's record");
    *x = (coll_ctx){.c = c, .kind = kind, .dim = dim, .n = n, .devs = devs, .site = *site};
    for (int i = 0; i < n; i++) {
        x->in[i].dtype = in[i]->dtype;
        x->in[i].ndim = (int8_t)in[i]->ndim;
        memcpy(x->in[i].shape, in[i]->shape, sizeof x->in[i].shape);
    }
    nt_scope *s = nt_scope_begin();
    nt_no_grad_begin();
    rc = coll_fwd(site, x, in, out);
    nt_no_grad_end();
    int nout = kind == K_JOIN ? 1 : n;
    if (!rc)
        rc = kind == K_JOIN ? nt__grp_record(site, fn, 1, n, in, out, coll_bwd, free, x)
                            : nt__grp_record(site, fn, n, 1, in, out, coll_bwd, free, x);
    else
        free(x);
    return nt__group_end(s, fn, rc, out, nout);
}

int nt_tp_copy_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, nt_tensor **out)
{
    return tp_coll(site, K_COPY, c, in, out, 0);
}
int nt_tp_reduce_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, nt_tensor **out)
{
    return tp_coll(site, K_REDUCE, c, in, out, 0);
}
int nt_tp_gather_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, nt_tensor **out,
                    int dim)
{
    return tp_coll(site, K_GATHER, c, in, out, dim);
}
int nt_tp_split_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, nt_tensor **out,
                   int dim)
{
    return tp_coll(site, K_SPLIT, c, in, out, dim);
}
nt_tensor *nt_tp_join_at(const nt_site *site, nt_comm *c, nt_tensor *const *in)
{
    nt_tensor *out[TP_MAXM] = {0};
    return tp_coll(site, K_JOIN, c, in, out, 0) ? NULL : out[0];
}

/* ------------------------------------------------------------------ */
/* Column- and row-parallel linear                                     */
/* ------------------------------------------------------------------ */

typedef struct lin_ctx {
    nt_comm *c;
    bool row;
    int n, blocks;
    int dim; /* sequence-parallel: the split dim of x */
    const int *devs;
    nt_site site;
    /* saved (nt__save handles); sequence-parallel column: x the member's slice */
    nt_tensor *x[TP_MAXM], *w[TP_MAXM];
    bool has_b;
} lin_ctx;

/* The tape node of a group linear: inputs (x, w, b) of each member, its
 * backward and context; on an earlier error (rc) the context is freed. */
static int linear_record(const nt_site *site, const char *fn, int rc, int n,
                         nt_tensor *const *xs, nt_tensor *const *w, nt_tensor *const *b,
                         nt_tensor **y, nt__grp_bwd_fn bwd,
                         void (*fr)(void *), void *x)
{
    nt_tensor *ins[TP_MAXM * 3];
    for (int i = 0; i < n; i++) {
        ins[3 * i] = xs[i];
        ins[3 * i + 1] = w[i];
        ins[3 * i + 2] = b ? b[i] : NULL;
    }
    if (rc) {
        fr(x);
        return rc;
    }
    return nt__grp_record(site, fn, n, 3, ins, y, bwd, fr, x);
}

static void lin_free(void *p)
{
    lin_ctx *x = p;
    nt__group_release_pairs(x->n, x->x, x->w);
    free(x);
}

/* The context of a group linear (plain, or sequence-parallel along dim),
 * each member's x and w saved.  NULL with the error set when there is no
 * host memory for it; a save that fails sets *rc, the context kept for
 * linear_record to free. */
static lin_ctx *lin_ctx_new(const nt_site *site, const char *fn, nt_comm *c, bool row, int n,
                            int blocks, int dim, const int *devs, nt_tensor *const *xs,
                            nt_tensor *const *w, bool has_b, int *rc)
{
    lin_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        *rc = nt__err_hostmem(site, fn, "the op's record");
        return NULL;
    }
    *x = (lin_ctx){.c = c, .row = row, .n = n, .blocks = blocks, .dim = dim, .devs = devs,
                   .site = *site, .has_b = has_b};
    if (!*rc)
        *rc = nt__group_save_pairs(site, fn, n, xs, w, x->x, x->w);
    return x;
}

/* The blocked product of member i: sum over its `lb` blocks of the
 * reduced dim (a's columns, b's rows), each an ordinary matmul rounded
 * to a's dtype and widened to f32, added pairwise in the tree's order. */
static nt_tensor *blocked_mm(const nt_site *site, nt_tensor *a, nt_tensor *b, int lb)
{
    int64_t kb = a->shape[1] / lb;
    nt_tensor *p[TP_MAXM * 8];
    if (lb > (int)(sizeof p / sizeof p[0])) {
        nt__err(site, NT_EINVAL, "nt_tp_row_linear", "too many blocks per member (%d)", lb);
        return NULL;
    }
    for (int j = 0; j < lb; j++) {
        nt_tensor *aj = lb == 1 ? a : nt_slice_at(site, a, 1, j * kb, (j + 1) * kb, 1);
        nt_tensor *bj = lb == 1 ? b : nt_slice_at(site, b, 0, j * kb, (j + 1) * kb, 1);
        p[j] = nt_cast_at(site, nt_matmul_at(site, aj, bj), NT_F32);
    }
    return nt__group_tree_sum(site, p, lb);
}

/* The blocked sums of every member, then the rank tree over the members
 * (all-reduce), in f32. */
static int blocked_sum(const nt_site *site, lin_ctx *x, nt_tensor **a, nt_tensor **b,
                       nt_tensor **p)
{
    int n = x->n, lb = x->blocks / nt_comm_size(x->c), rc = 0;
    nt_tensor *q[TP_MAXM];
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        q[i] = blocked_mm(site, a[i], b[i], lb);
        nt__dev_leave(&d);
        rc = q[i] ? 0 : nt_last_error();
    }
    return rc ? rc : nt_all_reduce_at(site, x->c, q, p, NT_REDUCE_SUM);
}

/* Each member's f32 sum p[i] cast to dt. */
static int cast_members(const nt_site *site, lin_ctx *x, nt_tensor **p, nt_dtype dt,
                        nt_tensor **out)
{
    int rc = 0;
    for (int i = 0; i < x->n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        out[i] = dt == NT_F32 ? p[i] : nt_cast_at(site, p[i], dt);
        nt__dev_leave(&d);
        rc = out[i] ? 0 : nt_last_error();
    }
    return rc;
}

/* blocked_sum, each result cast to dt. */
static int blocked_reduce(const nt_site *site, lin_ctx *x, nt_tensor **a, nt_tensor **b,
                          nt_dtype dt, nt_tensor **out)
{
    nt_tensor *p[TP_MAXM];
    int rc = blocked_sum(site, x, a, b, p);
    return rc ? rc : cast_members(site, x, p, dt, out);
}

/* Member i's weight and bias gradients (and, row-parallel, the input's):
 * plain products, their reduced dim (tokens, or N) is never split.  xin:
 * the input the weight's gradient multiplies (NULL: the saved x); gb: the
 * output gradient the bias's sums (NULL: g2; sequence-parallel row, the
 * member's slice of it). */
static int lin_local_grads(const nt_site *site, lin_ctx *x, int i, nt_tensor *g2,
                           nt_tensor *xin, nt_tensor *gb, nt_tensor **gin)
{
    nt_tensor *x2 = as_2d(site, xin ? xin : x->x[i]);
    nt_tensor *gw = nt_matmul_at(site, nt_transpose_at(site, g2, 0, 1), x2);
    gin[1] = gw;
    if (x->has_b)
        gin[2] = nt_sum_at(site, gb ? as_2d(site, gb) : g2, 0, false);
    if (x->row) {
        nt_tensor *gx = nt_matmul_at(site, g2, x->w[i]);
        gin[0] = gx ? nt_reshape_at(site, gx, x->x[i]->ndim, x->x[i]->shape) : NULL;
    }
    return gw && (!x->has_b || gin[2]) && (!x->row || gin[0]) ? 0 : nt_last_error();
}

/* The backward.  Column-parallel, the input's gradient sums over N, which
 * the split cuts: the blocked tree over N.  Its products and all-reduce
 * are issued first, so that the all-reduce runs while the cores compute
 * the weight and bias gradients; its cast (which waits for it) last. */
static int lin_bwd(void *ctxp, nt_tensor *const *gout, nt_tensor **gin)
{
    lin_ctx *x = ctxp;
    const nt_site *site = &x->site;
    int n = x->n, rc = 0;
    nt_tensor *g2[TP_MAXM], *dx32[TP_MAXM];
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        if (gout[i])
            g2[i] = as_2d(site, gout[i]);
        else { /* no gradient reached this member's output: zeros */
            int64_t rows = nt__numel(x->x[i]->ndim, x->x[i]->shape) /
                           x->x[i]->shape[x->x[i]->ndim - 1];
            int64_t cols = x->row ? x->w[i]->shape[0] : x->w[i]->shape[0];
            g2[i] = nt_zeros_at(site, (nt_dtype)x->x[i]->dtype, 2, (int64_t[]){rows, cols});
        }
        nt__dev_leave(&d);
        rc = g2[i] ? 0 : nt_last_error();
    }
    if (!rc && !x->row)
        rc = blocked_sum(site, x, g2, x->w, dx32);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        rc = lin_local_grads(site, x, i, g2[i], NULL, NULL, gin + 3 * i);
        nt__dev_leave(&d);
    }
    if (rc || x->row)
        return rc;
    nt_tensor *dx[TP_MAXM];
    rc = cast_members(site, x, dx32, (nt_dtype)x->x[0]->dtype, dx);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        gin[3 * i] = nt_reshape_at(site, dx[i], x->x[i]->ndim, x->x[i]->shape);
        nt__dev_leave(&d);
        rc = gin[3 * i] ? 0 : nt_last_error();
    }
    return rc;
}

/* The shapes: x [..., K] (row: [..., K/size]), w [N/size, K] (row: [N,
 * K/size]), b [N/size] (row: [N]), one shape on every member. */
static int lin_check(const nt_site *site, const char *fn, bool row, nt_comm *c,
                     nt_tensor *const *xs, nt_tensor *const *w, nt_tensor *const *b, int blocks,
                     int n, const int *devs)
{
    int rc;
    if ((rc = tp_arg(site, fn, "x", xs, n, devs, true, true, false)) ||
        (rc = tp_arg(site, fn, "w", w, n, devs, true, true, false)) ||
        (rc = tp_arg(site, fn, "b", b, n, devs, true, true, true)))
        return rc;
    char a[128], bb[128];
    const nt_tensor *x0 = xs[0], *w0 = w[0];
    if (x0->ndim < 1 || w0->ndim != 2 || x0->shape[x0->ndim - 1] != w0->shape[1])
        return nt__err(site, NT_ESHAPE, fn, "x has shape %s and w %s; expected x [..., K] and "
                       "w [%s, K]", nt__shape_str(x0->ndim, x0->shape, a, sizeof a),
                       nt__shape_str(w0->ndim, w0->shape, bb, sizeof bb),
                       row ? "N" : "N / size");
    if (x0->dtype != w0->dtype)
        return nt__err(site, NT_EDTYPE, fn, "x is %s and w %s; expected one dtype",
                       nt_dtype_name((nt_dtype)x0->dtype), nt_dtype_name((nt_dtype)w0->dtype));
    if (b && (b[0]->ndim != 1 || b[0]->shape[0] != w0->shape[0] || b[0]->dtype != w0->dtype))
        return nt__err(site, NT_ESHAPE, fn, "b has shape %s (%s); expected [%lld] (%s)",
                       nt__shape_str(b[0]->ndim, b[0]->shape, a, sizeof a),
                       nt_dtype_name((nt_dtype)b[0]->dtype), (long long)w0->shape[0],
                       nt_dtype_name((nt_dtype)w0->dtype));
    int size = nt_comm_size(c);
    return row ? tp_blocks(site, fn, blocks, size, w0->shape[1] * size, "K (the input's "
                           "last dim times the group's size)")
               : tp_blocks(site, fn, blocks, size, w0->shape[0] * size, "N (w's rows times "
                           "the group's size)");
}

static int tp_linear(const nt_site *site, const char *fn, bool row, nt_comm *c,
                     nt_tensor *const *xs, nt_tensor *const *w, nt_tensor *const *b, int blocks,
                     nt_tensor **y)
{
    const int *devs;
    int rc = tp_begin(site, fn, c, y, &devs);
    if (rc)
        return rc;
    int n = nt__comm_local(c, &devs);
    if ((rc = lin_check(site, fn, row, c, xs, w, b, blocks, n, devs)) != 0)
        return rc;
    lin_ctx *x = lin_ctx_new(site, fn, c, row, n, blocks, 0, devs, xs, w, b != NULL, &rc);
    if (!x)
        return rc;
    nt_scope *s = nt_scope_begin();
    nt_no_grad_begin();
    nt_tensor *a[TP_MAXM], *wt[TP_MAXM], *r[TP_MAXM];
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        a[i] = as_2d(site, xs[i]);
        wt[i] = nt_transpose_at(site, w[i], 0, 1);
        if (!row)
            r[i] = nt_matmul_at(site, a[i], wt[i]);
        nt__dev_leave(&d);
        rc = a[i] && wt[i] && (row || r[i]) ? 0 : nt_last_error();
    }
    if (!rc && row)
        rc = blocked_reduce(site, x, a, wt, (nt_dtype)xs[0]->dtype, r);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        nt_tensor *v = b ? nt_add_at(site, r[i], b[i]) : r[i];
        int64_t shape[NT_MAX_DIMS];
        memcpy(shape, xs[i]->shape, sizeof shape);
        shape[xs[i]->ndim - 1] = w[i]->shape[0];
        y[i] = v ? nt_reshape_at(site, v, xs[i]->ndim, shape) : NULL;
        nt__dev_leave(&d);
        rc = y[i] ? 0 : nt_last_error();
    }
    nt_no_grad_end();
    rc = linear_record(site, fn, rc, n, xs, w, b, y, lin_bwd, lin_free, x);
    return nt__group_end(s, fn, rc, y, n);
}

int nt_tp_column_linear_at(const nt_site *site, nt_comm *c, nt_tensor *const *x,
                           nt_tensor *const *w, nt_tensor *const *b, int blocks, nt_tensor **y)
{
    return tp_linear(site, "nt_tp_column_linear", false, c, x, w, b, blocks, y);
}
int nt_tp_row_linear_at(const nt_site *site, nt_comm *c, nt_tensor *const *x,
                        nt_tensor *const *w, nt_tensor *const *b, int blocks, nt_tensor **y)
{
    return tp_linear(site, "nt_tp_row_linear", true, c, x, w, b, blocks, y);
}

/* ------------------------------------------------------------------ */
/* Replicated parameters of sequence-parallel regions                  */
/* ------------------------------------------------------------------ */

/* nt_tp_copy_blocks: out[i] = nb copies of in[i] stacked on a new dim 0;
 * backward: member i's nb gradient rows (each + 0, so -0 is +0 however
 * many rows a member has) added pairwise in the tree's order, then the
 * all-reduce (sum, rank tree): the tree over all nb * size blocks. */
typedef struct copyb_ctx {
    nt_comm *c;
    int n, nb;
    const int *devs;
    nt_site site;
    nt__tmeta in;
} copyb_ctx;

static int copyb_bwd(void *ctxp, nt_tensor *const *gout, nt_tensor **gin)
{
    copyb_ctx *x = ctxp;
    const nt_site *site = &x->site;
    int n = x->n, rc = 0;
    nt__tmeta om = x->in;
    memmove(om.shape + 1, om.shape, sizeof om.shape[0] * (size_t)om.ndim);
    om.shape[0] = x->nb;
    om.ndim++;
    nt_tensor *g[TP_MAXM] = {0}, *p[TP_MAXM] = {0};
    rc = fill_missing(site, x->devs, n, gout, &om, g);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        nt_tensor *v[TP_MAXM * 8];
        nt_tensor *f = nt_add_scalar_at(site, nt_cast_at(site, g[i], NT_F32), 0.0);
        for (int j = 0; j < x->nb && f; j++)
            v[j] = nt_reshape_at(site, nt_slice_at(site, f, 0, j, j + 1, 1), x->in.ndim,
                                 x->in.shape);
        p[i] = f ? nt__group_tree_sum(site, v, x->nb) : NULL;
        nt__dev_leave(&d);
        rc = p[i] ? 0 : nt_last_error();
    }
    nt_tensor *r[TP_MAXM];
    if (!rc)
        rc = nt_all_reduce_at(site, x->c, p, r, NT_REDUCE_SUM);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        gin[i] = x->in.dtype == NT_F32 ? r[i] : nt_cast_at(site, r[i], (nt_dtype)x->in.dtype);
        nt__dev_leave(&d);
        rc = gin[i] ? 0 : nt_last_error();
    }
    return rc;
}

int nt_tp_copy_blocks_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, int nb,
                         nt_tensor **out)
{
    const char *fn = "nt_tp_copy_blocks";
    const int *devs;
    int rc = tp_begin(site, fn, c, out, &devs);
    if (rc)
        return rc;
    int n = nt__comm_local(c, &devs);
    if ((rc = tp_arg(site, fn, "in", in, n, devs, true, true, false)) != 0)
        return rc;
    if (nb < 1 || nb > TP_MAXM * 8 || (nb & (nb - 1)))
        return nt__err(site, NT_EINVAL, fn, "nb is %d; expected a power of two in 1 .. %d", nb,
                       TP_MAXM * 8);
    if (in[0]->ndim >= NT_MAX_DIMS)
        return nt__err(site, NT_ESHAPE, fn, "in[0] has %d dims; at most %d", in[0]->ndim,
                       NT_MAX_DIMS - 1);
    copyb_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return nt__err_hostmem(site, fn, "the op's record");
    *x = (copyb_ctx){.c = c, .n = n, .nb = nb, .devs = devs, .site = *site};
    x->in.dtype = in[0]->dtype;
    x->in.ndim = (int8_t)in[0]->ndim;
    memcpy(x->in.shape, in[0]->shape, sizeof x->in.shape);
    nt_scope *s = nt_scope_begin();
    nt_no_grad_begin();
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        int64_t shape[NT_MAX_DIMS];
        shape[0] = nb;
        memcpy(shape + 1, in[i]->shape, sizeof shape[0] * (size_t)in[i]->ndim);
        out[i] = nt_contiguous_at(site, nt_expand_at(site, nt_unsqueeze_at(site, in[i], 0),
                                                     in[i]->ndim + 1, shape));
        nt__dev_leave(&d);
        rc = out[i] ? 0 : nt_last_error();
    }
    nt_no_grad_end();
    if (!rc)
        rc = nt__grp_record(site, fn, n, 1, in, out, copyb_bwd, free, x);
    else
        free(x);
    return nt__group_end(s, fn, rc, out, n);
}

/* ------------------------------------------------------------------ */
/* Sequence-parallel linear layers                                     */
/* ------------------------------------------------------------------ */

/* Korthikanti et al.'s sequence parallelism: around a tensor-parallel
 * block the activations are split along the sequence dim `dim` (each
 * member its slice); the column-parallel layer all-gathers its input
 * along dim (backward: the input gradient's member partial, the blocked
 * tree over N, reduce-scattered along dim instead of all-reduced), the
 * row-parallel layer reduce-scatters its output's blocked K-sum along dim
 * instead of all-reducing it (backward: the output gradient all-gathered).
 * nt_reduce_scatter sums in the all-reduce's rank tree, so every element
 * is the bits of the layers above. */

/* t along dim gathered (all-gather) or its rank block of the sum
 * (reduce-scatter, f32 in, f32 out): dim moved to the front and back. */
static int sp_coll(const nt_site *site, nt_comm *c, int n, const int *devs, nt_tensor *const *t,
                   int dim, bool gather, nt_tensor **out)
{
    int rc = 0;
    nt_tensor *f[TP_MAXM], *r[TP_MAXM];
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        f[i] = dim == 0 ? nt_contiguous_at(site, t[i]) : to_front(site, t[i], dim);
        nt__dev_leave(&d);
        rc = f[i] ? 0 : nt_last_error();
    }
    if (!rc)
        rc = gather ? nt_all_gather_at(site, c, f, r)
                    : nt_reduce_scatter_at(site, c, f, r, NT_REDUCE_SUM);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        out[i] = from_front(site, r[i], dim);
        nt__dev_leave(&d);
        rc = out[i] ? 0 : nt_last_error();
    }
    return rc;
}

/* Every member's output gradient (zeros where none came), shaped `like`
 * with the last dim `last`. */
static int sp_gout(const nt_site *site, lin_ctx *x, nt_tensor *const *gout, const nt_tensor *like,
                   int64_t last, nt_tensor **g)
{
    nt__tmeta m = {.dtype = like->dtype, .ndim = (int8_t)like->ndim};
    memcpy(m.shape, like->shape, sizeof m.shape);
    m.shape[like->ndim - 1] = last;
    return fill_missing(site, x->devs, x->n, gout, &m, g);
}

static int sp_bwd(void *ctxp, nt_tensor *const *gout, nt_tensor **gin)
{
    lin_ctx *x = ctxp;
    const nt_site *site = &x->site;
    int n = x->n, size = nt_comm_size(x->c), lb = x->blocks / size, rc = 0;
    nt_tensor *g[TP_MAXM] = {0}, *xf[TP_MAXM] = {0}, *gf[TP_MAXM] = {0};
    if (x->row) {
        /* g: the member's slice of [..., N] -> gathered; x: saved whole */
        int64_t shape[NT_MAX_DIMS];
        nt__tmeta m = {.dtype = x->x[0]->dtype, .ndim = (int8_t)x->x[0]->ndim};
        memcpy(shape, x->x[0]->shape, sizeof shape);
        shape[x->dim] /= size;
        shape[m.ndim - 1] = x->w[0]->shape[0];
        memcpy(m.shape, shape, sizeof m.shape);
        rc = fill_missing(site, x->devs, n, gout, &m, g);
        if (!rc)
            rc = sp_coll(site, x->c, n, x->devs, g, x->dim, true, gf);
        for (int i = 0; i < n && !rc; i++) {
            nt__devsw d;
            nt__dev_enter(&d, x->devs[i]);
            rc = lin_local_grads(site, x, i, as_2d(site, gf[i]), NULL, g[i], gin + 3 * i);
            nt__dev_leave(&d);
        }
        return rc;
    }
    /* column: x re-gathered (the slice was saved, not the whole); the
     * input gradient's member partial (f32) reduce-scattered, then cast */
    nt_tensor *p[TP_MAXM] = {0}, *ps[TP_MAXM] = {0}, *dx[TP_MAXM];
    rc = sp_coll(site, x->c, n, x->devs, x->x, x->dim, true, xf);
    if (!rc)
        rc = sp_gout(site, x, gout, xf[0], x->w[0]->shape[0], g);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        nt_tensor *g2 = as_2d(site, g[i]);
        nt_tensor *q = g2 ? blocked_mm(site, g2, x->w[i], lb) : NULL;
        p[i] = q ? nt_reshape_at(site, q, xf[i]->ndim, xf[i]->shape) : NULL;
        nt__dev_leave(&d);
        rc = p[i] ? 0 : nt_last_error();
    }
    if (!rc)
        rc = sp_coll(site, x->c, n, x->devs, p, x->dim, false, ps);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        rc = lin_local_grads(site, x, i, as_2d(site, g[i]), xf[i], NULL, gin + 3 * i);
        nt__dev_leave(&d);
    }
    if (!rc)
        rc = cast_members(site, x, ps, (nt_dtype)x->x[0]->dtype, dx);
    for (int i = 0; i < n && !rc; i++)
        gin[3 * i] = dx[i];
    return rc;
}

static int tp_linear_sp(const nt_site *site, const char *fn, bool row, nt_comm *c,
                        nt_tensor *const *xs, nt_tensor *const *w, nt_tensor *const *b,
                        int blocks, int dim, nt_tensor **y)
{
    const int *devs;
    int rc = tp_begin(site, fn, c, y, &devs);
    if (rc)
        return rc;
    int n = nt__comm_local(c, &devs), size = nt_comm_size(c);
    if ((rc = lin_check(site, fn, row, c, xs, w, b, blocks, n, devs)) != 0)
        return rc;
    int nd = xs[0]->ndim;
    if (nd < 2 || dim < -nd || dim >= nd - 1 || (dim < 0 && dim + nd >= nd - 1))
        return nt__err(site, NT_EINVAL, fn, "dim is %d; expected a dim of x other than its last "
                       "(x has %d dims)", dim, nd);
    dim = dim < 0 ? dim + nd : dim;
    if (row && xs[0]->shape[dim] % size)
        return nt__err(site, NT_ESHAPE, fn, "x[0]'s dim %d (the sequence) is %lld, which the "
                       "group's size %d does not divide", dim, (long long)xs[0]->shape[dim],
                       size);
    lin_ctx *x = lin_ctx_new(site, fn, c, row, n, blocks, dim, devs, xs, w, b != NULL, &rc);
    if (!x)
        return rc;
    nt_scope *s = nt_scope_begin();
    nt_no_grad_begin();
    nt_tensor *xf[TP_MAXM], *r[TP_MAXM], *q[TP_MAXM];
    if (!rc && !row)
        rc = sp_coll(site, c, n, devs, xs, dim, true, xf);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        nt_tensor *src = row ? xs[i] : xf[i];
        nt_tensor *a = as_2d(site, src), *wt = nt_transpose_at(site, w[i], 0, 1);
        int64_t shape[NT_MAX_DIMS];
        memcpy(shape, src->shape, sizeof shape);
        shape[nd - 1] = w[i]->shape[0];
        nt_tensor *v = row ? blocked_mm(site, a, wt, blocks / size) : nt_matmul_at(site, a, wt);
        q[i] = v ? nt_reshape_at(site, v, nd, shape) : NULL;
        nt__dev_leave(&d);
        rc = q[i] ? 0 : nt_last_error();
    }
    if (!rc && row)
        rc = sp_coll(site, c, n, devs, q, dim, false, r);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        nt_tensor *v = q[i];
        if (row)
            v = xs[i]->dtype == NT_F32 ? r[i] : nt_cast_at(site, r[i], (nt_dtype)xs[i]->dtype);
        y[i] = b && v ? nt_add_at(site, v, b[i]) : v;
        nt__dev_leave(&d);
        rc = y[i] ? 0 : nt_last_error();
    }
    nt_no_grad_end();
    rc = linear_record(site, fn, rc, n, xs, w, b, y, sp_bwd, lin_free, x);
    return nt__group_end(s, fn, rc, y, n);
}

int nt_tp_column_linear_sp_at(const nt_site *site, nt_comm *c, nt_tensor *const *x,
                              nt_tensor *const *w, nt_tensor *const *b, int blocks, int dim,
                              nt_tensor **y)
{
    return tp_linear_sp(site, "nt_tp_column_linear_sp", false, c, x, w, b, blocks, dim, y);
}
int nt_tp_row_linear_sp_at(const nt_site *site, nt_comm *c, nt_tensor *const *x,
                           nt_tensor *const *w, nt_tensor *const *b, int blocks, int dim,
                           nt_tensor **y)
{
    return tp_linear_sp(site, "nt_tp_row_linear_sp", true, c, x, w, b, blocks, dim, y);
}

/* ------------------------------------------------------------------ */
/* Vocabulary-parallel embedding and cross-entropy                     */
/* ------------------------------------------------------------------ */

/* Member i's view of global indices idx into its block of `rows` rows:
 * *safe the local index (0 outside the block), *mask (u8) whether inside. */
static int local_index(const nt_site *site, nt_comm *c, int i, nt_tensor *idx, int64_t rows,
                       nt_tensor **safe, nt_tensor **mask)
{
    double lo = (double)nt_comm_rank(c, i) * (double)rows;
    nt_tensor *f = nt_add_scalar_at(site, nt_cast_at(site, idx, NT_F32), -lo);
    nt_tensor *cl = nt_clamp_at(site, f, 0.0, (double)(rows - 1));
    *mask = nt_eq_at(site, cl, f);
    *safe = nt_cast_at(site, cl, NT_I32);
    return *mask && *safe ? 0 : nt_last_error();
}

/* The sum over members of values that are nonzero on one member only
 * (x + 0 = x): with one member, the + 0 that the tree's adds give, so
 * that -0 becomes +0 on every split alike. */
static int one_hot_reduce(const nt_site *site, nt_comm *c, nt_tensor **v, nt_tensor **out,
                          int n, const int *devs)
{
    int rc = nt_tp_reduce_at(site, c, v, out);
    if (rc || nt_comm_size(c) > 1)
        return rc;
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        out[i] = nt_add_scalar_at(site, out[i], 0.0);
        nt__dev_leave(&d);
        rc = out[i] ? 0 : nt_last_error();
    }
    return rc;
}

int nt_tp_embedding_at(const nt_site *site, nt_comm *c, nt_tensor *const *w,
                       nt_tensor *const *idx, nt_tensor **out)
{
    const char *fn = "nt_tp_embedding";
    const int *devs;
    int rc = tp_begin(site, fn, c, out, &devs);
    if (rc)
        return rc;
    int n = nt__comm_local(c, &devs);
    if ((rc = tp_arg(site, fn, "w", w, n, devs, true, true, false)) ||
        (rc = tp_arg(site, fn, "idx", idx, n, devs, false, true, false)))
        return rc;
    if (w[0]->ndim != 2)
        return nt__err(site, NT_ESHAPE, fn, "w[0] has %d dims; expected [V / size, D]",
                       w[0]->ndim);
    if (nt__dtype_is_float((nt_dtype)idx[0]->dtype))
        return nt__err(site, NT_EDTYPE, fn, "idx[0] is %s; expected an integer dtype",
                       nt_dtype_name((nt_dtype)idx[0]->dtype));
    nt_scope *s = nt_scope_begin();
    nt_tensor *e[TP_MAXM];
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        nt_tensor *safe, *mask;
        rc = local_index(site, c, i, idx[i], w[i]->shape[0], &safe, &mask);
        if (!rc) {
            nt_tensor *v = nt_embedding_at(site, w[i], safe);
            nt_tensor *z = nt_zeros_at(site, (nt_dtype)w[i]->dtype, 0, NULL);
            e[i] = nt_where_at(site, nt_unsqueeze_at(site, mask, mask->ndim), v, z);
            rc = e[i] ? 0 : nt_last_error();
        }
        nt__dev_leave(&d);
    }
    if (!rc)
        rc = one_hot_reduce(site, c, e, out, n, devs);
    return nt__group_end(s, fn, rc, out, n);
}

/* Member i's part of the sum of exponentials: its blocks' row sums of
 * exp(z), added pairwise. */
static nt_tensor *sumexp_part(const nt_site *site, nt_tensor *z, int lb)
{
    nt_tensor *ez = nt_exp_at(site, z), *p[TP_MAXM * 8];
    if (!ez)
        return NULL;
    int64_t vb = z->shape[1] / lb;
    for (int j = 0; j < lb; j++)
        p[j] = nt_sum_at(site, lb == 1 ? ez : nt_slice_at(site, ez, 1, j * vb, (j + 1) * vb, 1),
                         1, false);
    return nt__group_tree_sum(site, p, lb);
}

static int ce_check(const nt_site *site, const char *fn, nt_comm *c, nt_tensor *const *logits,
                    nt_tensor *const *target, int blocks, int n, const int *devs)
{
    int rc;
    if ((rc = tp_arg(site, fn, "logits", logits, n, devs, true, true, false)) ||
        (rc = tp_arg(site, fn, "target", target, n, devs, false, true, false)))
        return rc;
    char a[128], b[128];
    if (logits[0]->ndim != 2 || target[0]->ndim != 1 ||
        target[0]->shape[0] != logits[0]->shape[0])
        return nt__err(site, NT_ESHAPE, fn, "logits[0] has shape %s and target[0] %s; expected "
                       "[M, V / size] and [M]",
                       nt__shape_str(logits[0]->ndim, logits[0]->shape, a, sizeof a),
                       nt__shape_str(target[0]->ndim, target[0]->shape, b, sizeof b));
    if (nt__dtype_is_float((nt_dtype)target[0]->dtype))
        return nt__err(site, NT_EDTYPE, fn, "target[0] is %s; expected an integer dtype",
                       nt_dtype_name((nt_dtype)target[0]->dtype));
    int size = nt_comm_size(c);
    return tp_blocks(site, fn, blocks, size, logits[0]->shape[1] * size,
                     "V (the logits' last dim times the group's size)");
}

/* Member i's shifted logits z = logits - max over the group (the max held
 * constant: it cancels in the loss), in f32. */
static int ce_shift(const nt_site *site, nt_comm *c, nt_tensor *const *logits, int n,
                    const int *devs, nt_tensor **z)
{
    nt_tensor *m[TP_MAXM], *gm[TP_MAXM];
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        z[i] = nt_cast_at(site, logits[i], NT_F32);
        m[i] = z[i] ? nt_amax_at(site, nt_detach_at(site, z[i]), 1, (int[]){1}, false) : NULL;
        nt__dev_leave(&d);
        rc = m[i] ? 0 : nt_last_error();
    }
    if (!rc)
        rc = nt_all_reduce_at(site, c, m, gm, NT_REDUCE_MAX);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        z[i] = nt_sub_at(site, z[i], nt_unsqueeze_at(site, gm[i], 1));
        nt__dev_leave(&d);
        rc = z[i] ? 0 : nt_last_error();
    }
    return rc;
}

int nt_tp_cross_entropy_at(const nt_site *site, nt_comm *c, nt_tensor *const *logits,
                           nt_tensor *const *target, int blocks, nt_tensor **loss)
{
    const char *fn = "nt_tp_cross_entropy";
    const int *devs;
    int rc = tp_begin(site, fn, c, loss, &devs);
    if (rc)
        return rc;
    int n = nt__comm_local(c, &devs), lb = 0;
    if ((rc = ce_check(site, fn, c, logits, target, blocks, n, devs)) != 0)
        return rc;
    lb = blocks / nt_comm_size(c);
    nt_scope *s = nt_scope_begin();
    nt_tensor *z[TP_MAXM], *se[TP_MAXM], *tz[TP_MAXM], *S[TP_MAXM], *TZ[TP_MAXM];
    rc = ce_shift(site, c, logits, n, devs, z);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        se[i] = sumexp_part(site, z[i], lb);
        nt_tensor *safe, *mask;
        rc = se[i] ? local_index(site, c, i, target[i], z[i]->shape[1], &safe, &mask)
                   : nt_last_error();
        if (!rc) {
            nt_tensor *g = nt_gather_at(site, z[i], 1, nt_unsqueeze_at(site, safe, 1));
            g = nt_reshape_at(site, g, 1, target[i]->shape);
            nt_tensor *zero = nt_zeros_at(site, NT_F32, 0, NULL);
            tz[i] = nt_where_at(site, mask, g, zero);
            rc = tz[i] ? 0 : nt_last_error();
        }
        nt__dev_leave(&d);
    }
    if (!rc)
        rc = nt_tp_reduce_at(site, c, se, S);
    if (!rc)
        rc = one_hot_reduce(site, c, tz, TZ, n, devs);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        nt_tensor *l = nt_sub_at(site, nt_log_at(site, S[i]), TZ[i]);
        loss[i] = nt_mean_at(site, l, 0, false);
        nt__dev_leave(&d);
        rc = loss[i] ? 0 : nt_last_error();
    }
    return nt__group_end(s, fn, rc, loss, n);
}

/* ------------------------------------------------------------------ */
/* Attention, heads split over the group                               */
/* ------------------------------------------------------------------ */

/* [B, T, H*hd] -> [B, H, T, hd] and back. */
static nt_tensor *heads_out(const nt_site *site, nt_tensor *t, int64_t h)
{
    int64_t B = t->shape[0], T = t->shape[1], hd = t->shape[2] / h;
    return nt_transpose_at(site, nt_reshape_at(site, t, 4, (int64_t[]){B, T, h, hd}), 1, 2);
}
static nt_tensor *heads_in(const nt_site *site, nt_tensor *t)
{
    int64_t B = t->shape[0], h = t->shape[1], T = t->shape[2], hd = t->shape[3];
    return nt_reshape_at(site, nt_contiguous_at(site, nt_transpose_at(site, t, 1, 2)), 3,
                         (int64_t[]){B, T, h * hd});
}

int nt_tp_attention_at(const nt_site *site, nt_comm *c, nt_tensor *const *x,
                       nt_tensor *const *wq, nt_tensor *const *wk, nt_tensor *const *wv,
                       nt_tensor *const *wo, int heads, int blocks, nt_tensor **y)
{
    const char *fn = "nt_tp_attention";
    const int *devs;
    int rc = tp_begin(site, fn, c, y, &devs);
    if (rc)
        return rc;
    int n = nt__comm_local(c, &devs), size = nt_comm_size(c);
    if ((rc = tp_arg(site, fn, "x", x, n, devs, true, true, false)) != 0)
        return rc;
    if (x[0]->ndim != 3)
        return nt__err(site, NT_ESHAPE, fn, "x[0] has %d dims; expected [B, T, D]", x[0]->ndim);
    if (heads < 1 || heads % size)
        return nt__err(site, NT_EINVAL, fn, "heads is %d; expected a positive multiple of the "
                       "group's size %d", heads, size);
    if ((rc = tp_arg(site, fn, "wq", wq, n, devs, true, true, false)) != 0)
        return rc;
    if (wq[0]->ndim != 2 || (wq[0]->shape[0] * size) % heads)
        return nt__err(site, NT_ESHAPE, fn, "wq[0]'s rows (%lld) times the group's size %d is "
                       "not a multiple of heads %d", (long long)wq[0]->shape[0], size, heads);
    nt_scope *s = nt_scope_begin();
    nt_tensor *q[TP_MAXM], *k[TP_MAXM], *v[TP_MAXM], *a[TP_MAXM];
    if ((rc = nt_tp_column_linear_at(site, c, x, wq, NULL, blocks, q)) ||
        (rc = nt_tp_column_linear_at(site, c, x, wk, NULL, blocks, k)) ||
        (rc = nt_tp_column_linear_at(site, c, x, wv, NULL, blocks, v))) {
        nt_scope_end(s);
        return rc;
    }
    int64_t hl = heads / size;
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        nt_tensor *o = nt_scaled_dot_product_attention_at(
            site, heads_out(site, q[i], hl), heads_out(site, k[i], hl),
            heads_out(site, v[i], hl), NULL, true, 0.0);
        a[i] = o ? heads_in(site, o) : NULL;
        nt__dev_leave(&d);
        rc = a[i] ? 0 : nt_last_error();
    }
    if (!rc)
        rc = nt_tp_row_linear_at(site, c, a, wo, NULL, blocks, y);
    return nt__group_end(s, fn, rc, y, n);
}

/* ------------------------------------------------------------------ */
/* The plain entry points                                              */
/* ------------------------------------------------------------------ */

#undef nt_tp_copy
#undef nt_tp_reduce
#undef nt_tp_gather
#undef nt_tp_split
#undef nt_tp_join
#undef nt_tp_column_linear
#undef nt_tp_row_linear
#undef nt_tp_embedding
#undef nt_tp_cross_entropy
#undef nt_tp_attention
#undef nt_tp_copy_blocks
#undef nt_tp_column_linear_sp
#undef nt_tp_row_linear_sp
NT_API int nt_tp_copy(nt_comm *c, nt_tensor *const *in, nt_tensor **out)
{
    return nt_tp_copy_at(NT_RA_SITE, c, in, out);
}
NT_API int nt_tp_reduce(nt_comm *c, nt_tensor *const *in, nt_tensor **out)
{
    return nt_tp_reduce_at(NT_RA_SITE, c, in, out);
}
NT_API int nt_tp_gather(nt_comm *c, nt_tensor *const *in, nt_tensor **out, int dim)
{
    return nt_tp_gather_at(NT_RA_SITE, c, in, out, dim);
}
NT_API int nt_tp_split(nt_comm *c, nt_tensor *const *in, nt_tensor **out, int dim)
{
    return nt_tp_split_at(NT_RA_SITE, c, in, out, dim);
}
NT_API nt_tensor *nt_tp_join(nt_comm *c, nt_tensor *const *in)
{
    return nt_tp_join_at(NT_RA_SITE, c, in);
}
NT_API int nt_tp_column_linear(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                               nt_tensor *const *b, int blocks, nt_tensor **y)
{
    return nt_tp_column_linear_at(NT_RA_SITE, c, x, w, b, blocks, y);
}
NT_API int nt_tp_row_linear(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                            nt_tensor *const *b, int blocks, nt_tensor **y)
{
    return nt_tp_row_linear_at(NT_RA_SITE, c, x, w, b, blocks, y);
}
NT_API int nt_tp_embedding(nt_comm *c, nt_tensor *const *w, nt_tensor *const *idx,
                           nt_tensor **out)
{
    return nt_tp_embedding_at(NT_RA_SITE, c, w, idx, out);
}
NT_API int nt_tp_cross_entropy(nt_comm *c, nt_tensor *const *logits, nt_tensor *const *target,
                               int blocks, nt_tensor **loss)
{
    return nt_tp_cross_entropy_at(NT_RA_SITE, c, logits, target, blocks, loss);
}
NT_API int nt_tp_attention(nt_comm *c, nt_tensor *const *x, nt_tensor *const *wq,
                           nt_tensor *const *wk, nt_tensor *const *wv, nt_tensor *const *wo,
                           int heads, int blocks, nt_tensor **y)
{
    return nt_tp_attention_at(NT_RA_SITE, c, x, wq, wk, wv, wo, heads, blocks, y);
}
NT_API int nt_tp_copy_blocks(nt_comm *c, nt_tensor *const *in, int nb, nt_tensor **out)
{
    return nt_tp_copy_blocks_at(NT_RA_SITE, c, in, nb, out);
}
NT_API int nt_tp_column_linear_sp(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                                  nt_tensor *const *b, int blocks, int dim, nt_tensor **y)
{
    return nt_tp_column_linear_sp_at(NT_RA_SITE, c, x, w, b, blocks, dim, y);
}
NT_API int nt_tp_row_linear_sp(nt_comm *c, nt_tensor *const *x, nt_tensor *const *w,
                               nt_tensor *const *b, int blocks, int dim, nt_tensor **y)
{
    return nt_tp_row_linear_sp_at(NT_RA_SITE, c, x, w, b, blocks, dim, y);
}
