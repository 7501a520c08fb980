/* dist/moe.c - mixture of experts: the grouped matmul, the router, the
 * all_to_all with counts on the device, and the expert-parallel MoE MLP,
 * defined so that the number of expert-parallel devices does not change
 * the bits (docs/parallel.md, "Mixture of experts").
 *
 * Nothing here reads a value back to the host: the counts, the
 * permutations and the all_to_all's gather index are tensors, and the
 * kernels that need them (grouped_mm, all_to_all_index: cpu/moe.c,
 * neuron/moe.c; nt_grouped_mm is dispatcher/api_moe.c's) read them on the
 * device when they run.  Shapes are fixed
 * at the call: an all_to_all's output has `capacity` rows, those past the
 * rows received zero, and a grouped product's rows past its counts' sum
 * are zero.
 *
 * Why every split gives the same bits: each token's route, expert product
 * and combine are per row; an expert's weight gradient contracts over the
 * rows routed to it, which reach its device in (source rank, token) order
 * -- the global token order, as on one device -- and grouped_mm_wgrad
 * tiles them from the expert's first row; the router's weight gradient and
 * the load statistics sum over tokens in a fixed number of blocks combined
 * in the rank tree's order (as dist/tp.c's blocked sums). */
#include "amp/amp.h"
#include "autograd/autograd.h"
#include "dispatcher/dispatch.h"
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOE_MAXM 64 /* local members a call takes */

/* ------------------------------------------------------------------ */
/* Shared pieces                                                       */
/* ------------------------------------------------------------------ */

static int dt_check(const nt_site *site, const char *fn, const char *arg, const nt_tensor *t,
                    nt_dtype want)
{
    if (t->dtype == (uint8_t)want)
        return 0;
    return nt__err(site, NT_EDTYPE, fn, "%s is %s; expected %s", arg,
                   nt_dtype_name((nt_dtype)t->dtype), nt_dtype_name(want));
}

static bool mm_dtype(nt_dtype d) { return d == NT_F32 || d == NT_BF16; }

/* Rows idx of t along dim 0 (t's values copied bit for bit): nt_embedding
 * of t seen as [rows, rest], a DMA gather of whole rows on the simulator;
 * its gradient adds the rows back in idx's order, in f32 from +0, rounded
 * once, as nt_index_select's does. */
static nt_tensor *rows_of(const nt_site *site, nt_tensor *t, nt_tensor *idx)
{
    if (!t || !idx)
        return NULL;
    int64_t rows = t->shape[0], rest = rows ? nt__numel(t->ndim, t->shape) / rows : 1;
    int64_t sh[NT_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[0] = idx->shape[0];
    nt_tensor *t2 = nt_reshape_at(site, t, 2, (int64_t[]){rows, rest});
    return nt_reshape_at(site, nt_embedding_at(site, t2, idx), t->ndim, sh);
}

/* t + v in i32 (a 0-d i32 operand keeps the dtype). */
static nt_tensor *add_i32(const nt_site *site, nt_tensor *t, int64_t v)
{
    return nt_add_at(site, t, nt_full_at(site, NT_I32, 0, NULL, (double)v));
}

/* ------------------------------------------------------------------ */
/* all_to_all with counts on the device                                */
/* ------------------------------------------------------------------ */

/* all_to_all_index(C [P, P]) of rank j: [cap] i32 (core/optable.h). */
static nt_tensor *a2a_index_issue(const nt_site *site, const char *fn, nt_tensor *C, int64_t j,
                                  int64_t R, int64_t cap)
{
    nt__call c;
    nt_tensor *in[1] = {nt_contiguous_at(site, C)};
    if (!in[0])
        return NULL;
    if (!nt__call_begin(&c, site, fn, NT_OP_A2A_INDEX, 1, in, "counts"))
        return nt__call_fail(&c);
    c.p.i[0] = j;
    c.p.i[1] = R;
    c.no_grad = true;
    c.odt[0] = NT_I32;
    c.ondim[0] = 1;
    c.oshape[0][0] = cap;
    return nt__dispatch(&c);
}

typedef struct a2a_ctx {
    nt_comm *c;
    int n;
    const int *devs;
    int64_t R, cap;
    nt_site site;
    nt__tmeta in; /* member 0's input (every member's shape) */
    nt_tensor *rc[MOE_MAXM]; /* saved: each member's receive counts */
} a2a_ctx;

static void a2a_free(void *p)
{
    a2a_ctx *x = p;
    for (int i = 0; i < x->n; i++)
        if (x->rc[i])
            nt_release(x->rc[i]);
    free(x);
}

/* The exchange with grad off: out[i] [cap, ...], rcnt[i] [P] (NULL: not
 * wanted).  in[i] [R, ...] with its rows sorted by destination rank,
 * scnt[i] [P] i32 the rows for each. */
static int a2a_run(const nt_site *site, const char *fn, nt_comm *c, int n, const int *devs,
                   nt_tensor *const *in, nt_tensor *const *scnt, int64_t cap, nt_tensor **out,
                   nt_tensor **rcnt)
{
    int P = nt_comm_size(c), rc = 0;
    nt_tensor *s2[MOE_MAXM], *C[MOE_MAXM], *X[MOE_MAXM];
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        s2[i] = nt_reshape_at(site, scnt[i], 2, (int64_t[]){1, P});
        nt__dev_leave(&d);
        rc = s2[i] ? 0 : nt_last_error();
    }
    if (!rc)
        rc = nt_all_gather_at(site, c, s2, C);
    if (!rc)
        rc = nt_all_gather_at(site, c, in, X);
    int64_t R = in[0]->shape[0];
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        int64_t j = nt_comm_rank(c, i), zs[NT_MAX_DIMS];
        memcpy(zs, in[i]->shape, sizeof zs);
        zs[0] = 1; /* the zero row the padding reads */
        nt_tensor *parts[2] = {X[i], nt_zeros_at(site, (nt_dtype)in[i]->dtype, in[i]->ndim, zs)};
        nt_tensor *idx = a2a_index_issue(site, fn, C[i], j, R, cap);
        out[i] = idx && parts[1] ? rows_of(site, nt_cat_at(site, parts, 2, 0), idx)
                                 : NULL;
        if (rcnt)
            rcnt[i] = nt_reshape_at(site, nt_contiguous_at(site, nt_slice_at(site, C[i], 1, j,
                                                                               j + 1, 1)),
                                    1, (int64_t[]){P});
        nt__dev_leave(&d);
        rc = out[i] && (!rcnt || rcnt[i]) ? 0 : nt_last_error();
    }
    return rc;
}

/* The gradient: the reverse exchange, each member sending back what it
 * received (its receive counts), into R rows. */
static int a2a_bwd(void *ctxp, nt_tensor *const *gout, nt_tensor **gin)
{
    a2a_ctx *x = ctxp;
    const nt_site *site = &x->site;
    nt_tensor *g[MOE_MAXM];
    int rc = 0;
    for (int i = 0; i < x->n && !rc; i++) {
        g[i] = gout[i];
        if (g[i])
            continue;
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        nt__tmeta m = x->in;
        m.shape[0] = x->cap;
        g[i] = nt_zeros_at(site, (nt_dtype)m.dtype, m.ndim, m.shape);
        nt__dev_leave(&d);
        rc = g[i] ? 0 : nt_last_error();
    }
    nt_tensor *r[MOE_MAXM];
    if (!rc)
        rc = a2a_run(site, "nt_all_to_all", x->c, x->n, x->devs, g, x->rc, x->R, r, NULL);
    for (int i = 0; i < x->n && !rc; i++)
        gin[2 * i] = r[i];
    return rc;
}

/* The communicator and the local members, out cleared. */
static int moe_begin(const nt_site *site, const char *fn, nt_comm *c, nt_tensor **out,
                     const int **devs, int *n)
{
    int rc = nt__comm_valid(site, fn, c);
    if (rc)
        return rc;
    *n = nt__comm_local(c, devs);
    if (*n > MOE_MAXM)
        return nt__err(site, NT_EINVAL, fn, "the communicator has %d local members; at most %d",
                       *n, MOE_MAXM);
    if (!out)
        return nt__err(site, NT_EINVAL, fn, "argument 'out' is NULL");
    for (int i = 0; i < *n; i++)
        out[i] = NULL;
    return 0;
}

/* arr[0..n) live, on their members' devices, one shape and dtype. */
static int moe_arg(const nt_site *site, const char *fn, const char *arg, nt_tensor *const *arr,
                   int n, const int *devs)
{
    if (!arr)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL (one tensor per local "
                       "member expected)", arg);
    char name[48], a[128], b[128];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s[%d]", arg, i);
        if (!nt__check_arg(site, fn, name, arr[i]))
            return nt_last_error();
        if (arr[i]->dev != devs[i])
            return nt__err(site, NT_EINVAL, fn, "%s is on device %d; expected member %d's device "
                           "%d (one tensor per member, in the communicator's order)", name,
                           arr[i]->dev, i, devs[i]);
        if (i == 0)
            continue;
        if (arr[i]->dtype != arr[0]->dtype)
            return nt__err(site, NT_EDTYPE, fn, "%s is %s; %s[0] is %s: expected one dtype", name,
                           nt_dtype_name((nt_dtype)arr[i]->dtype), arg,
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

static int a2a_check(const nt_site *site, const char *fn, nt_comm *c, int n, const int *devs,
                     nt_tensor *const *in, nt_tensor *const *scnt, int64_t capacity)
{
    int rc;
    if ((rc = moe_arg(site, fn, "in", in, n, devs)) ||
        (rc = moe_arg(site, fn, "send_counts", scnt, n, devs)))
        return rc;
    char a[128];
    if (in[0]->ndim < 1)
        return nt__err(site, NT_ESHAPE, fn, "in[0] is 0-d; expected [rows, ...]");
    if ((rc = dt_check(site, fn, "send_counts[0]", scnt[0], NT_I32)))
        return rc;
    int P = nt_comm_size(c);
    if (scnt[0]->ndim != 1 || scnt[0]->shape[0] != P)
        return nt__err(site, NT_ESHAPE, fn, "send_counts[0] has shape %s; expected [%d] (one "
                       "count per rank of the group)",
                       nt__shape_str(scnt[0]->ndim, scnt[0]->shape, a, sizeof a), P);
    if (capacity < 0 || capacity > INT32_MAX)
        return nt__err(site, NT_EINVAL, fn, "capacity is %lld; expected 0 (every rank's rows) "
                       "up to %d", (long long)capacity, INT32_MAX);
    if ((double)P * (double)in[0]->shape[0] >= (double)INT32_MAX)
        return nt__err(site, NT_ESHAPE, fn, "%d ranks of %lld rows: too many for i32 indices", P,
                       (long long)in[0]->shape[0]);
    return 0;
}

int nt_all_to_all_at(const nt_site *site, nt_comm *c, nt_tensor *const *in,
                     nt_tensor *const *send_counts, int64_t capacity, nt_tensor **out,
                     nt_tensor **recv_counts)
{
    const char *fn = "nt_all_to_all";
    const int *devs;
    int n;
    int rc = moe_begin(site, fn, c, out, &devs, &n);
    for (int i = 0; recv_counts && !rc && i < n; i++)
        recv_counts[i] = NULL;
    if (rc || (rc = a2a_check(site, fn, c, n, devs, in, send_counts, capacity)))
        return rc;
    int64_t R = in[0]->shape[0];
    int64_t cap = capacity ? capacity : R * nt_comm_size(c);
    a2a_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return nt__err_hostmem(site, fn, "the op's record");
    *x = (a2a_ctx){.c = c, .n = n, .devs = devs, .R = R, .cap = cap, .site = *site};
    x->in.dtype = in[0]->dtype;
    x->in.ndim = (int8_t)in[0]->ndim;
    memcpy(x->in.shape, in[0]->shape, sizeof x->in.shape);
    nt_scope *s = nt_scope_begin();
    nt_tensor *rcv[MOE_MAXM] = {0};
    nt_no_grad_begin();
    rc = a2a_run(site, fn, c, n, devs, in, send_counts, cap, out, rcv);
    nt_no_grad_end();
    for (int i = 0; i < n && !rc; i++)
        if (!(x->rc[i] = nt__save(rcv[i])))
            rc = nt__err_hostmem(site, fn, "the op's saved counts");
    nt_tensor *ins[MOE_MAXM * 2];
    for (int i = 0; i < n; i++) {
        ins[2 * i] = in[i];
        ins[2 * i + 1] = NULL;
    }
    bool fl = nt__dtype_is_float((nt_dtype)in[0]->dtype);
    if (!rc && fl)
        rc = nt__grp_record(site, fn, n, 2, ins, out, a2a_bwd, a2a_free, x);
    else
        a2a_free(x);
    nt_tensor *all[MOE_MAXM * 2];
    for (int i = 0; i < n; i++) {
        all[i] = out[i];
        all[n + i] = rcv[i];
    }
    int nk = recv_counts ? 2 * n : n;
    rc = nt__group_end(s, fn, rc, all, nk);
    for (int i = 0; i < n; i++) {
        out[i] = rc ? NULL : all[i];
        if (recv_counts)
            recv_counts[i] = rc ? NULL : all[n + i];
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* The router                                                          */
/* ------------------------------------------------------------------ */

typedef struct route_out {
    nt_tensor *probs;   /* [T, E] f32: the gate's scores */
    nt_tensor *weights; /* [T, k] f32: the top k scores (differentiable) */
    nt_tensor *experts; /* [T, k] i32 */
    nt_tensor *counts;  /* [E] i32 */
    nt_tensor *perm;    /* [T k] i32: flat (t k + j) positions, sorted by expert, stable */
} route_out;

/* The route of logits [T, E] (on the current stream's device). */
static int route(const nt_site *site, nt_tensor *logits, int k, nt_moe_score score,
                 route_out *o)
{
    int64_t T = logits->shape[0], E = logits->shape[1];
    nt_tensor *z = nt_cast_at(site, logits, NT_F32);
    o->probs = score == NT_MOE_SIGMOID ? nt_sigmoid_at(site, z) : nt_softmax_at(site, z, 1);
    int rc = o->probs ? nt_topk_at(site, o->probs, k, 1, true, &o->weights, &o->experts)
                      : nt_last_error();
    if (rc)
        return rc;
    nt_tensor *ef = nt_reshape_at(site, o->experts, 1, (int64_t[]){T * k});
    o->perm = nt_argsort_at(site, ef, 0, false, true);
    o->counts = nt_sum_at(site, nt_one_hot_at(site, ef, E), 0, false);
    if (o->counts && o->counts->dtype != NT_I32)
        o->counts = nt_cast_at(site, o->counts, NT_I32);
    return o->perm && o->counts ? 0 : nt_last_error();
}

static int route_check(const nt_site *site, const char *fn, nt_tensor *logits, int k,
                       nt_moe_score score)
{
    if (!nt__check_arg(site, fn, "logits", logits))
        return nt_last_error();
    char a[128];
    if (!nt__dtype_is_float((nt_dtype)logits->dtype))
        return nt__err(site, NT_EDTYPE, fn, "logits is %s; expected a floating dtype",
                       nt_dtype_name((nt_dtype)logits->dtype));
    if (logits->ndim != 2 || logits->shape[1] < 1)
        return nt__err(site, NT_ESHAPE, fn, "logits has shape %s; expected [tokens, experts]",
                       nt__shape_str(logits->ndim, logits->shape, a, sizeof a));
    if (k < 1 || k > logits->shape[1])
        return nt__err(site, NT_EINVAL, fn, "k is %d; expected 1 .. %lld (the experts)", k,
                       (long long)logits->shape[1]);
    if (score != NT_MOE_SOFTMAX && score != NT_MOE_SIGMOID)
        return nt__err(site, NT_EINVAL, fn, "score is %d; expected NT_MOE_SOFTMAX or "
                       "NT_MOE_SIGMOID", (int)score);
    return 0;
}

int nt_moe_route_at(const nt_site *site, nt_tensor *logits, int k, nt_moe_score score,
                    nt_tensor **weights, nt_tensor **experts, nt_tensor **counts,
                    nt_tensor **perm)
{
    const char *fn = "nt_moe_route";
    nt_tensor **outs[4] = {weights, experts, counts, perm};
    static const char *const names[4] = {"weights", "experts", "counts", "perm"};
    for (int i = 0; i < 4; i++)
        if (outs[i])
            *outs[i] = NULL;
    for (int i = 0; i < 4; i++)
        if (!outs[i])
            return nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL", names[i]);
    int rc = route_check(site, fn, logits, k, score);
    if (rc)
        return rc;
    nt_scope *s = nt_scope_begin();
    route_out o = {0};
    nt__devsw d;
    nt__dev_enter(&d, logits->dev);
    rc = route(site, logits, k, score, &o);
    nt__dev_leave(&d);
    nt_tensor *r[4] = {o.weights, o.experts, o.counts, o.perm};
    rc = nt__group_end(s, fn, rc, r, 4);
    for (int i = 0; i < 4; i++)
        *outs[i] = rc ? NULL : r[i];
    return rc;
}

/* ------------------------------------------------------------------ */
/* The gate: logits = x wg^T, wg replicated over the group             */
/* ------------------------------------------------------------------ */

typedef struct gate_ctx {
    nt_comm *c;
    int n, lb; /* members, token blocks per member */
    const int *devs;
    nt_site site;
    nt_tensor *x[MOE_MAXM], *wg[MOE_MAXM]; /* saved */
} gate_ctx;

static void gate_free(void *p)
{
    gate_ctx *x = p;
    nt__group_release_pairs(x->n, x->x, x->wg);
    free(x);
}

/* Member i's part of wg's gradient: g_b^T x_b of each of its lb blocks of
 * tokens (one product each, in f32), added pairwise in the tree's order. */
static nt_tensor *gate_wgrad_part(const nt_site *site, nt_tensor *g, nt_tensor *x, int lb)
{
    int64_t tb = x->shape[0] / lb;
    nt_tensor *p[MOE_MAXM * 8];
    for (int j = 0; j < lb; j++) {
        nt_tensor *gj = lb == 1 ? g : nt_slice_at(site, g, 0, j * tb, (j + 1) * tb, 1);
        nt_tensor *xj = lb == 1 ? x : nt_slice_at(site, x, 0, j * tb, (j + 1) * tb, 1);
        p[j] = nt_cast_at(site, nt_matmul_at(site, nt_transpose_at(site, gj, 0, 1), xj), NT_F32);
    }
    return nt__group_tree_sum(site, p, lb);
}

static int gate_bwd(void *ctxp, nt_tensor *const *gout, nt_tensor **gin)
{
    gate_ctx *x = ctxp;
    const nt_site *site = &x->site;
    int n = x->n, rc = 0;
    nt_tensor *q[MOE_MAXM] = {0}, *p[MOE_MAXM] = {0};
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        nt_tensor *g = gout[i];
        if (!g)
            g = nt_zeros_at(site, (nt_dtype)x->x[i]->dtype, 2,
                            (int64_t[]){x->x[i]->shape[0], x->wg[i]->shape[0]});
        gin[2 * i] = g ? nt_matmul_at(site, g, x->wg[i]) : NULL;
        q[i] = g ? gate_wgrad_part(site, g, x->x[i], x->lb) : NULL;
        nt__dev_leave(&d);
        rc = gin[2 * i] && q[i] ? 0 : nt_last_error();
    }
    if (!rc) /* the rank tree over the members' sums: the tree over all blocks */
        rc = nt_all_reduce_at(site, x->c, q, p, NT_REDUCE_SUM);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, x->devs[i]);
        gin[2 * i + 1] = nt_cast_at(site, p[i], (nt_dtype)x->wg[i]->dtype);
        nt__dev_leave(&d);
        rc = gin[2 * i + 1] ? 0 : nt_last_error();
    }
    return rc;
}

/* logits[i] = x[i] wg[i]^T, recorded as one group op. */
static int gate(const nt_site *site, const char *fn, nt_comm *c, int n, const int *devs,
                nt_tensor *const *xs, nt_tensor *const *wg, int lb, nt_tensor **logits)
{
    gate_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return nt__err_hostmem(site, fn, "the op's record");
    *x = (gate_ctx){.c = c, .n = n, .lb = lb, .devs = devs, .site = *site};
    int rc = nt__group_save_pairs(site, fn, n, xs, wg, x->x, x->wg);
    nt_no_grad_begin();
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        logits[i] = nt_matmul_at(site, xs[i], nt_transpose_at(site, wg[i], 0, 1));
        nt__dev_leave(&d);
        rc = logits[i] ? 0 : nt_last_error();
    }
    nt_no_grad_end();
    nt_tensor *ins[MOE_MAXM * 2];
    for (int i = 0; i < n; i++)
        ins[2 * i] = xs[i], ins[2 * i + 1] = wg[i];
    if (!rc)
        return nt__grp_record(site, fn, n, 2, ins, logits, gate_bwd, gate_free, x);
    gate_free(x);
    return rc;
}

/* ------------------------------------------------------------------ */
/* The expert-parallel MoE MLP                                         */
/* ------------------------------------------------------------------ */

typedef struct moe_m {
    route_out r;
    nt_tensor *xs, *ids, *sc; /* sorted rows [T k, D], their expert + 1, send counts [P] */
    nt_tensor *xr, *idr, *rc; /* received rows [cap, D], expert + 1 (0: padding), counts */
    nt_tensor *yr, *yb;       /* expert outputs, received order; back home [T k, D] */
} moe_m;

/* Member-local dispatch: the route, the rows sorted by expert (so by
 * destination rank) in the experts' dtype de, their expert ids + 1, the
 * rows for each rank. */
static int moe_sort(const nt_site *site, nt_tensor *x, nt_tensor *logits, const nt_moe_opts *o,
                    int P, nt_dtype de, moe_m *m)
{
    int64_t T = x->shape[0], k = o->k, E = logits->shape[1];
    int rc = route(site, logits, o->k, o->score, &m->r);
    if (rc)
        return rc;
    nt_tensor *tok = nt_reshape_at(site, nt_arange_at(site, NT_I32, 0, (double)T, 1), 2,
                                   (int64_t[]){T, 1});
    tok = nt_reshape_at(site, nt_contiguous_at(site, nt_expand_at(site, tok, 2,
                                                                  (int64_t[]){T, k})),
                        1, (int64_t[]){T * k});
    nt_tensor *ef = nt_reshape_at(site, m->r.experts, 1, (int64_t[]){T * k});
    m->xs = rows_of(site, x, nt_index_select_at(site, tok, 0, m->r.perm));
    if (m->xs && m->xs->dtype != (uint8_t)de)
        m->xs = nt_cast_at(site, m->xs, de);
    m->ids = add_i32(site, nt_index_select_at(site, ef, 0, m->r.perm), 1);
    m->sc = nt_sum_at(site, nt_reshape_at(site, m->r.counts, 2, (int64_t[]){P, E / P}), 1, false);
    if (m->sc && m->sc->dtype != NT_I32)
        m->sc = nt_cast_at(site, m->sc, NT_I32);
    return m->xs && m->ids && m->sc ? 0 : nt_last_error();
}

/* The experts of rank j on the rows it received: sorted by local expert
 * (stable: source rank, then the source's order -- the global token
 * order), the two grouped products with GELU between, back in received
 * order. */
static int moe_experts(const nt_site *site, moe_m *m, nt_tensor *w1, nt_tensor *w2, int64_t j)
{
    int64_t El = w1->shape[0];
    nt_tensor *zero = nt_zeros_at(site, NT_I32, 0, NULL);
    nt_tensor *loc = add_i32(site, m->idr, -(1 + j * El));
    nt_tensor *key = nt_where_at(site, nt_gt_at(site, m->idr, zero), loc,
                                 nt_full_at(site, NT_I32, 0, NULL, (double)El));
    nt_tensor *perm = nt_argsort_at(site, key, 0, false, true);
    nt_tensor *cnt = nt_sum_at(site, nt_one_hot_at(site, key, El + 1), 0, false);
    if (cnt && cnt->dtype != NT_I32)
        cnt = nt_cast_at(site, cnt, NT_I32);
    cnt = nt_contiguous_at(site, nt_slice_at(site, cnt, 0, 0, El, 1));
    nt_tensor *xe = rows_of(site, m->xr, perm);
    nt_tensor *h = nt_gelu_at(site, nt_grouped_mm_at(site, xe, w1, cnt));
    nt_tensor *ye = nt_grouped_mm_at(site, h, w2, cnt);
    m->yr = rows_of(site, ye, nt_argsort_at(site, perm, 0, false, true));
    return m->yr ? 0 : nt_last_error();
}

/* y [T, D] = sum over j = 0, 1, ... k-1 (in that order) of weights[:, j]
 * times the token's j-th expert output, in f32, rounded once to dt. */
static nt_tensor *moe_combine(const nt_site *site, moe_m *m, int64_t T, int64_t k, nt_dtype dt)
{
    nt_tensor *inv = nt_argsort_at(site, m->r.perm, 0, false, true);
    nt_tensor *yt = rows_of(site, m->yb, inv);
    if (!yt)
        return NULL;
    int64_t D = yt->shape[1];
    yt = nt_cast_at(site, nt_reshape_at(site, yt, 3, (int64_t[]){T, k, D}), NT_F32);
    nt_tensor *acc = NULL;
    for (int64_t j = 0; j < k; j++) {
        nt_tensor *wj = nt_slice_at(site, m->r.weights, 1, j, j + 1, 1);
        nt_tensor *yj = nt_reshape_at(site, nt_slice_at(site, yt, 1, j, j + 1, 1), 2,
                                      (int64_t[]){T, D});
        nt_tensor *t = nt_mul_at(site, wj, yj);
        acc = j == 0 ? t : nt_add_at(site, acc, t);
    }
    return dt == NT_F32 ? acc : nt_cast_at(site, acc, dt);
}

/* The load statistics: counts[i] = tokens per expert over the group (i32),
 * aux[i] = E sum_e f_e P_e (Switch): f_e = counts_e / (T k), P_e = the
 * blocked sum of the scores over the tokens / T (T: the group's tokens). */
static int moe_stats(const nt_site *site, nt_comm *c, int n, const int *devs, moe_m *m,
                     int lb, int64_t Tg, int k, nt_tensor **aux, nt_tensor **counts)
{
    nt_tensor *lc[MOE_MAXM], *gc[MOE_MAXM], *q[MOE_MAXM], *S[MOE_MAXM];
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        lc[i] = m[i].r.counts;
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        int64_t tb = m[i].r.probs->shape[0] / lb;
        nt_tensor *p[MOE_MAXM * 8];
        for (int b = 0; b < lb; b++)
            p[b] = nt_sum_at(site, nt_slice_at(site, m[i].r.probs, 0, b * tb, (b + 1) * tb, 1), 0,
                             false);
        q[i] = nt__group_tree_sum(site, p, lb);
        nt__dev_leave(&d);
        rc = q[i] ? 0 : nt_last_error();
    }
    if (!rc)
        rc = nt_all_reduce_at(site, c, lc, gc, NT_REDUCE_SUM);
    if (!rc)
        rc = nt_tp_reduce_at(site, c, q, S);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        int64_t E = gc[i]->shape[0];
        nt_tensor *f = nt_mul_scalar_at(site, nt_cast_at(site, gc[i], NT_F32),
                                        1.0 / ((double)Tg * (double)k));
        nt_tensor *pm = nt_mul_scalar_at(site, S[i], 1.0 / (double)Tg);
        if (aux)
            aux[i] = nt_mul_scalar_at(site, nt_sum_at(site, nt_mul_at(site, f, pm), 0, false),
                                      (double)E);
        if (counts)
            counts[i] = gc[i];
        nt__dev_leave(&d);
        rc = (!aux || aux[i]) && (!counts || counts[i]) ? 0 : nt_last_error();
    }
    return rc;
}

static int mlp_check(const nt_site *site, const char *fn, nt_comm *c, int n, const int *devs,
                     nt_tensor *const *x, nt_tensor *const *wg, nt_tensor *const *w1,
                     nt_tensor *const *w2, const nt_moe_opts *o)
{
    int rc;
    if ((rc = moe_arg(site, fn, "x", x, n, devs)) || (rc = moe_arg(site, fn, "wg", wg, n, devs)) ||
        (rc = moe_arg(site, fn, "w1", w1, n, devs)) || (rc = moe_arg(site, fn, "w2", w2, n, devs)))
        return rc;
    if (!o)
        return nt__err(site, NT_EINVAL, fn, "argument 'opts' is NULL");
    nt_dtype dt = (nt_dtype)x[0]->dtype;
    if (!mm_dtype(dt))
        return nt__err(site, NT_EDTYPE, fn, "x[0] is %s; expected f32 or bf16", nt_dtype_name(dt));
    /* the router in x's dtype, the experts in theirs (f32 or bf16 each) */
    nt_dtype de = (nt_dtype)w1[0]->dtype;
    if (!mm_dtype(de))
        return nt__err(site, NT_EDTYPE, fn, "w1[0] is %s; expected f32 or bf16 (the experts' "
                       "dtype)", nt_dtype_name(de));
    if ((rc = dt_check(site, fn, "wg[0]", wg[0], dt)) || (rc = dt_check(site, fn, "w2[0]", w2[0], de)))
        return rc;
    char a[128], b[128], e[128];
    const nt_tensor *x0 = x[0], *g0 = wg[0], *a0 = w1[0], *b0 = w2[0];
    int P = nt_comm_size(c);
    if (x0->ndim != 2 || g0->ndim != 2 || g0->shape[1] != x0->shape[1] || g0->shape[0] < 1)
        return nt__err(site, NT_ESHAPE, fn, "x[0] has shape %s and wg[0] %s; expected [T, D] and "
                       "[E, D]", nt__shape_str(x0->ndim, x0->shape, a, sizeof a),
                       nt__shape_str(g0->ndim, g0->shape, b, sizeof b));
    int64_t E = g0->shape[0], D = x0->shape[1];
    if (E % P)
        return nt__err(site, NT_EINVAL, fn, "wg[0] has %lld experts, which the group's size %d "
                       "does not divide", (long long)E, P);
    if (a0->ndim != 3 || b0->ndim != 3 || a0->shape[0] != E / P || b0->shape[0] != E / P ||
        a0->shape[1] != D || b0->shape[1] != a0->shape[2] || b0->shape[2] != D)
        return nt__err(site, NT_ESHAPE, fn, "w1[0] has shape %s and w2[0] %s; expected [%lld, "
                       "%lld, H] and [%lld, H, %lld] (E / size experts per member)",
                       nt__shape_str(a0->ndim, a0->shape, a, sizeof a),
                       nt__shape_str(b0->ndim, b0->shape, e, sizeof e), (long long)(E / P),
                       (long long)D, (long long)(E / P), (long long)D);
    if (o->k < 1 || o->k > E)
        return nt__err(site, NT_EINVAL, fn, "opts->k is %d; expected 1 .. %lld (the experts)",
                       o->k, (long long)E);
    if (o->score != NT_MOE_SOFTMAX && o->score != NT_MOE_SIGMOID)
        return nt__err(site, NT_EINVAL, fn, "opts->score is %d; expected NT_MOE_SOFTMAX or "
                       "NT_MOE_SIGMOID", (int)o->score);
    int q = o->blocks / P;
    if (o->blocks < 1 || o->blocks % P || (q & (q - 1)) || q > MOE_MAXM * 8)
        return nt__err(site, NT_EINVAL, fn, "opts->blocks is %d; expected a multiple of the "
                       "group's size %d whose quotient is a power of two (1, 2, 4, ... %d)",
                       o->blocks, P, MOE_MAXM * 8);
    if (x0->shape[0] % q)
        return nt__err(site, NT_ESHAPE, fn, "x[0] has %lld tokens, which its %d blocks "
                       "(opts->blocks / the group's size) do not divide",
                       (long long)x0->shape[0], q);
    int64_t cap = o->capacity ? o->capacity : x0->shape[0] * o->k * P;
    if (o->capacity < 0 || cap > INT32_MAX)
        return nt__err(site, NT_EINVAL, fn, "opts->capacity is %lld; expected 0 (every rank's "
                       "T k rows) up to %d", (long long)o->capacity, INT32_MAX);
    return 0;
}

/* The steps after the checks, inside the call's scope. */
static int mlp_run(const nt_site *site, const char *fn, nt_comm *c, int n, const int *devs,
                   nt_tensor *const *x, nt_tensor *const *wg, nt_tensor *const *w1,
                   nt_tensor *const *w2, const nt_moe_opts *o, moe_m *m, nt_tensor **y,
                   nt_tensor **aux, nt_tensor **counts)
{
    int P = nt_comm_size(c), lb = o->blocks / P;
    int64_t T = x[0]->shape[0], k = o->k;
    int64_t cap = o->capacity ? o->capacity : T * k * P;
    nt_tensor *lg[MOE_MAXM], *a[8][MOE_MAXM];
    int rc = gate(site, fn, c, n, devs, x, wg, lb, lg);
    for (int i = 0; i < n && !rc; i++) {
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        rc = moe_sort(site, x[i], lg[i], o, P, (nt_dtype)w1[i]->dtype, &m[i]);
        nt__dev_leave(&d);
        a[0][i] = m[i].xs, a[1][i] = m[i].sc, a[2][i] = m[i].ids;
    }
    if (!rc)
        rc = nt_all_to_all_at(site, c, a[0], a[1], cap, a[3], a[4]);
    if (!rc)
        rc = nt_all_to_all_at(site, c, a[2], a[1], cap, a[5], NULL);
    for (int i = 0; i < n && !rc; i++) {
        m[i].xr = a[3][i], m[i].rc = a[4][i], m[i].idr = a[5][i];
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        rc = moe_experts(site, &m[i], w1[i], w2[i], nt_comm_rank(c, i));
        nt__dev_leave(&d);
        a[6][i] = m[i].yr;
    }
    if (!rc) /* the reverse exchange: each token's rows home */
        rc = nt_all_to_all_at(site, c, a[6], a[4], T * k, a[7], NULL);
    for (int i = 0; i < n && !rc; i++) {
        m[i].yb = a[7][i];
        nt__devsw d;
        nt__dev_enter(&d, devs[i]);
        y[i] = moe_combine(site, &m[i], T, k, (nt_dtype)x[i]->dtype);
        nt__dev_leave(&d);
        rc = y[i] ? 0 : nt_last_error();
    }
    if (!rc && (aux || counts))
        rc = moe_stats(site, c, n, devs, m, lb, T * P, o->k, aux, counts);
    return rc;
}

int nt_moe_mlp_at(const nt_site *site, nt_comm *c, nt_tensor *const *x, nt_tensor *const *wg,
                  nt_tensor *const *w1, nt_tensor *const *w2, const nt_moe_opts *opts,
                  nt_tensor **y, nt_tensor **aux, nt_tensor **counts)
{
    const char *fn = "nt_moe_mlp";
    const int *devs;
    int n;
    int rc = moe_begin(site, fn, c, y, &devs, &n);
    for (int i = 0; !rc && i < n; i++) {
        if (aux)
            aux[i] = NULL;
        if (counts)
            counts[i] = NULL;
    }
    if (rc || (rc = mlp_check(site, fn, c, n, devs, x, wg, w1, w2, opts)))
        return rc;
    moe_m *m = calloc((size_t)n, sizeof *m);
    if (!m)
        return nt__err_hostmem(site, fn, "the members' state");
    nt_scope *s = nt_scope_begin();
    nt_tensor *all[MOE_MAXM * 3] = {0}, *ya[MOE_MAXM], *aa[MOE_MAXM], *ca[MOE_MAXM];
    /* the dtypes are the caller's: autocast would cast the router's matmul
     * (and the gate's backward would then see mixed dtypes) */
    nt__amp_suspend();
    rc = mlp_run(site, fn, c, n, devs, x, wg, w1, w2, opts, m, ya, aux ? aa : NULL,
                 counts ? ca : NULL);
    nt__amp_resume();
    free(m);
    int nk = 0;
    for (int i = 0; i < n && !rc; i++) {
        all[nk++] = ya[i];
        if (aux)
            all[nk++] = aa[i];
        if (counts)
            all[nk++] = ca[i];
    }
    rc = nt__group_end(s, fn, rc, all, nk);
    for (int i = 0, t = 0; i < n && !rc; i++) {
        y[i] = all[t++];
        if (aux)
            aux[i] = all[t++];
        if (counts)
            counts[i] = all[t++];
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* The plain entry points                                              */
/* ------------------------------------------------------------------ */

#undef nt_all_to_all
#undef nt_moe_route
#undef nt_moe_mlp
NT_API int nt_all_to_all(nt_comm *c, nt_tensor *const *in, nt_tensor *const *send_counts,
                         int64_t capacity, nt_tensor **out, nt_tensor **recv_counts)
{
    return nt_all_to_all_at(NT_RA_SITE, c, in, send_counts, capacity, out, recv_counts);
}
NT_API int nt_moe_route(nt_tensor *logits, int k, nt_moe_score score, nt_tensor **weights,
                        nt_tensor **experts, nt_tensor **counts, nt_tensor **perm)
{
    return nt_moe_route_at(NT_RA_SITE, logits, k, score, weights, experts, counts, perm);
}
NT_API int nt_moe_mlp(nt_comm *c, nt_tensor *const *x, nt_tensor *const *wg,
                      nt_tensor *const *w1, nt_tensor *const *w2, const nt_moe_opts *opts,
                      nt_tensor **y, nt_tensor **aux, nt_tensor **counts)
{
    return nt_moe_mlp_at(NT_RA_SITE, c, x, wg, w1, w2, opts, y, aux, counts);
}
