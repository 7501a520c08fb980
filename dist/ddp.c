/* dist/ddp.c - data-parallel training whose parameters are the same
 * bits at any core count (docs/ddp.md).
 *
 * A global batch is cut into S fixed shards.  Shard s's gradient g_s is the
 * backward of its own loss, taken out of the replica's .grad at once, so
 * no shard ever accumulates into another's.  The gradients are combined in
 * one fixed tree, the shard tree: level by level, adjacent pairs
 * (v[2i] + v[2i+1]) in index order, an odd last one carried up, then the
 * sum times 1/S (one rounding; exact when S is a power of two), in f32.
 *
 * The global ranks (local devices, then processes) each own a contiguous
 * block of S/R shards with S/R a power of two, so the first log2(S/R)
 * levels of the shard tree lie inside one rank: each rank combines its own
 * block (the local tree, ordinary queued nt_add on its device), and the
 * rank tree of nt_all_reduce (PLAN14: the same pairwise order over ranks)
 * makes the levels above.  Both together are the shard tree over all S
 * shards, whatever R is: that is why the bits do not depend on the core or
 * process count.
 *
 * The local tree is built while shards arrive: a node is added as soon as
 * both its children exist, so in order only log2(S/R) partial sums per
 * parameter are alive, and the adds of shard s queue behind its backward
 * (overlapping the next shard's forward).
 *
 * Concurrency: a mutex per nt_ddp; its functions may be called from any
 * thread and serialise.  The ops they issue go on the default stream of the
 * device concerned (the thread's current stream if that is on the device),
 * and the thread's current stream is restored before they return. */
#include "autograd/autograd.h"
#include "core/handle.h"
#include "dispatcher/dispatch.h"

#include <glib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DDP_MAGIC 0x44445031u /* "DDP1" */
#define DDP_MAX_DEV 64     /* local devices (NT_SIM_CORES at most 64) */
#define DDP_BUCKET_BYTES (25.0 * 1024 * 1024) /* PyTorch DDP's default bucket */

typedef struct member {
    int dev;          /* the local device */
    int rank;         /* its global rank */
    nt_tensor **rep;  /* [n] the replica (one user reference each) */
    /* The local tree: node (level l, index i) of parameter j is
     * tree[l][i * n + j] (f32, one user reference), NULL while not made or
     * once used by its parent.  Level 0 holds the shards' gradients. */
    nt_tensor ***tree;
} member;

/* One nt_ddp_batch_norm layer: the k-th call of every shard's forward. */
typedef struct bn_layer {
    int64_t C, M;    /* channels; values per channel in one shard */
    double momentum;
    nt_tensor *rm[DDP_MAX_DEV], *rv[DDP_MAX_DEV]; /* member k's running statistics */
    /* [nmem * block]: the shard's mean and ssd (f32 [C], a user reference
     * each) at slot k * block + (shard % block); NULL until its forward */
    nt_tensor **mean, **ssd;
} bn_layer;

struct nt_ddp {
    NT__HOBJ_HEAD;  /* core/handle.h: its memory outlives it */
    int n;          /* parameters */
    int shards;     /* S */
    int ranks;      /* R: global ranks */
    int block;      /* S / R, a power of two */
    int levels;     /* log2(block) */
    int first_rank; /* global rank of local member 0 */
    int nmem;       /* local devices */
    member *m;
    uint8_t *done;  /* [S] the shard's backward was taken this step */
    nt_comm *comm;  /* the ranks' rank tree; NULL with one rank */
    bn_layer *bn;   /* nt_ddp_batch_norm's layers (docs/ddp.md) */
    int nbn, bn_cap;
    int *bn_calls;  /* [S] this step's nt_ddp_batch_norm calls of each shard */
    GMutex lock;
};

/* ---------------- devices ---------------- */

static int device_count(void) { return nt_device_count(); }
/* The thread's current stream if it is on dev, else dev's default. */
static nt_stream *device_stream(int dev)
{
    nt_stream *cur = nt_stream_current();
    return nt_stream_device(cur) == dev ? cur : nt_stream_default_on(dev);
}

/* Makes a stream of `dev` the thread's current one; returns the old one
 * for leave(). */
static nt_stream *enter(int dev)
{
    nt_stream *old = nt_stream_current();
    nt_stream *s = device_stream(dev);
    if (s != old)
        nt_stream_set_current(s);
    return old;
}
static void leave(nt_stream *old)
{
    if (nt_stream_current() != old)
        nt_stream_set_current(old);
}

/* ---------------- checks ---------------- */

static bool ddp_ok(const nt_site *site, const nt_ddp *d, const char *fn)
{
    if (!nt__ensure_init())
        return false;
    return nt__hobj_check(d, DDP_MAGIC, site, fn, "d", "nt_ddp") == 0;
}

static bool check_param(const nt_site *site, const char *fn, nt_tensor *const *ps, int i)
{
    char arg[32];
    snprintf(arg, sizeof arg, "params[%d]", i);
    if (!nt__check_arg(site, fn, arg, ps[i]))
        return false;
    nt_tensor *t = ps[i];
    if (!nt__dtype_is_float((nt_dtype)t->dtype)) {
        nt__err(site, NT_EDTYPE, fn, "argument '%s' is %s; parameters must be floating", arg,
                nt_dtype_name((nt_dtype)t->dtype));
        return false;
    }
    if (t->ag && t->ag->grad_fn) {
        nt__err(site, NT_EINVAL, fn,
                "argument '%s' was computed by an op that records a graph; only leaf tensors "
                "can be replicated (use nt_detach)", arg);
        return false;
    }
    if (!t->ag || !t->ag->requires_grad) {
        nt__err(site, NT_EINVAL, fn,
                "argument '%s' does not require grad (nt_set_requires_grad it first)", arg);
        return false;
    }
    for (int j = 0; j < i; j++)
        if (ps[j] == t) {
            nt__err(site, NT_EINVAL, fn,
                    "argument 'params' lists the same tensor at %d and %d", j, i);
            return false;
        }
    if (i > 0 && t->dev != ps[0]->dev) {
        nt__err(site, NT_EINVAL, fn,
                "argument '%s' is on device %d but params[0] is on device %d; the parameters "
                "must be on one device", arg, (int)t->dev, (int)ps[0]->dev);
        return false;
    }
    return true;
}

static bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

/* The local member computing global shard s, or -1 (another process). */
static int member_of(const nt_ddp *d, int s)
{
    int r = s / d->block - d->first_rank;
    return r >= 0 && r < d->nmem ? r : -1;
}

static member *member_of_dev(nt_ddp *d, int dev)
{
    for (int i = 0; i < d->nmem; i++)
        if (d->m[i].dev == dev)
            return &d->m[i];
    return NULL;
}

static bool check_shard(const nt_site *site, const nt_ddp *d, const char *fn, int shard)
{
    if (shard < 0 || shard >= d->shards) {
        nt__err(site, NT_EINVAL, fn, "argument 'shard' is %d; expected 0 <= shard < %d", shard,
                d->shards);
        return false;
    }
    if (member_of(d, shard) < 0) {
        nt__err(site, NT_EINVAL, fn,
                "argument 'shard' is %d, which global rank %d computes in another process "
                "(this process has ranks %d..%d)", shard, shard / d->block, d->first_rank,
                d->first_rank + d->nmem - 1);
        return false;
    }
    return true;
}

/* ---------------- create, destroy ---------------- */

/* Drops the shards' batch-norm statistics of this step (all: the layers
 * and their running statistics too). */
static void bn_clear(nt_ddp *d, bool all)
{
    for (int l = 0; l < d->nbn; l++) {
        bn_layer *L = &d->bn[l];
        for (int i = 0; L->mean && i < d->nmem * d->block; i++) {
            nt_release(L->mean[i]), nt_release(L->ssd[i]);
            L->mean[i] = L->ssd[i] = NULL;
        }
        if (!all)
            continue;
        for (int k = 0; k < d->nmem; k++)
            nt_release(L->rm[k]), nt_release(L->rv[k]);
        free(L->mean), free(L->ssd);
    }
    if (d->bn_calls)
        memset(d->bn_calls, 0, sizeof *d->bn_calls * (size_t)d->shards);
    if (all) {
        free(d->bn), free(d->bn_calls);
        d->bn = NULL, d->bn_calls = NULL, d->nbn = d->bn_cap = 0;
    }
}

static void tree_clear(nt_ddp *d)
{
    for (int k = 0; k < d->nmem; k++) {
        member *m = &d->m[k];
        if (!m->tree)
            continue;
        for (int l = 0; l <= d->levels; l++)
            for (int i = 0; i < (d->block >> l) * d->n; i++)
                if (m->tree[l][i]) {
                    nt_release(m->tree[l][i]);
                    m->tree[l][i] = NULL;
                }
    }
    memset(d->done, 0, (size_t)d->shards);
    bn_clear(d, false);
}

static void ddp_free(nt_ddp *d)
{
    if (!d)
        return;
    /* one made before nt_shutdown: its tensors went with that runtime */
    if (d->m && nt__hobj_current(d)) {
        if (d->done)
            tree_clear(d);
        bn_clear(d, true);
        for (int k = 0; k < d->nmem; k++)
            if (d->m[k].rep)
                for (int j = 0; j < d->n; j++)
                    nt_release(d->m[k].rep[j]);
    }
    if (d->m)
        for (int k = 0; k < d->nmem; k++) {
            free(d->m[k].rep);
            if (d->m[k].tree)
                for (int l = 0; l <= d->levels; l++)
                    free(d->m[k].tree[l]);
            free(d->m[k].tree);
        }
    free(d->m);
    free(d->done);
    free(d->bn_calls);
    if (d->bn)
        for (int l = 0; l < d->nbn; l++)
            free(d->bn[l].mean), free(d->bn[l].ssd);
    free(d->bn);
    nt_comm_destroy(d->comm);
    g_mutex_clear(&d->lock);
    nt__hobj_free(d);
}

NT_API nt_ddp *nt_ddp_create_at(const nt_site *site, nt_tensor *const *params, int nparams,
                                int shards, const int *devices, int ndev)
{
    const char *fn = "nt_ddp_create";
    if (!nt__ensure_init())
        return NULL;
    if (!params || nparams < 1) {
        nt__err(site, NT_EINVAL, fn, "argument '%s' is %s; expected at least one parameter",
                params ? "nparams" : "params", params ? "< 1" : "NULL");
        return NULL;
    }
    for (int i = 0; i < nparams; i++)
        if (!check_param(site, fn, params, i))
            return NULL;
    int count = device_count() < DDP_MAX_DEV ? device_count() : DDP_MAX_DEV;
    if (!devices || ndev < 1 || ndev > count) {
        if (!devices)
            nt__err(site, NT_EINVAL, fn, "argument 'devices' is NULL; expected an array of "
                    "ndev distinct devices");
        else
            nt__err(site, NT_EINVAL, fn,
                    "argument 'ndev' is %d; expected 1..%d distinct devices (nt_device_count)",
                    ndev, count);
        return NULL;
    }
    for (int i = 0; i < ndev; i++) {
        if (devices[i] < 0 || devices[i] >= count) {
            nt__err(site, NT_EINVAL, fn, "argument 'devices[%d]' is %d; expected 0 <= device < %d",
                    i, devices[i], count);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i]) {
                nt__err(site, NT_EINVAL, fn, "argument 'devices' lists device %d at %d and %d",
                        devices[i], j, i);
                return NULL;
            }
    }
    /* The global ranks: this process's devices in order, after those of the
     * processes before it (nt_comm_create is collective over processes). */
    int nproc = nt_process_count() > 1 ? nt_process_count() : 1, first_rank = 0, ranks = ndev;
    nt_comm *comm = NULL;
    if (ndev > 1 || nproc > 1) {
        comm = nt_comm_create(devices, ndev);
        if (!comm)
            return NULL;
        ranks = nt_comm_size(comm);
        first_rank = nt_comm_rank(comm, 0);
    }
    if (shards < 1 || shards % ranks || !is_pow2(shards / ranks)) {
        nt__err(site, NT_EINVAL, fn,
                "argument 'shards' is %d; expected a multiple of the %d global ranks (%d "
                "devices here, %d processes) whose quotient is a power of two (e.g. %d)",
                shards, ranks, ndev, nproc, ranks);
        nt_comm_destroy(comm);
        return NULL;
    }

    nt_ddp *d = nt__hobj_new(sizeof *d, DDP_MAGIC);
    if (!d) {
        nt_comm_destroy(comm);
        nt__err_hostmem(site, fn, "the nt_ddp");
        return NULL;
    }
    g_mutex_init(&d->lock);
    d->comm = comm;
    d->n = nparams;
    d->shards = shards;
    d->ranks = ranks;
    d->block = shards / ranks;
    while ((1 << d->levels) < d->block)
        d->levels++;
    d->first_rank = first_rank;
    d->nmem = ndev;
    d->m = calloc((size_t)ndev, sizeof *d->m);
    d->done = calloc((size_t)shards, 1);
    d->bn_calls = calloc((size_t)shards, sizeof *d->bn_calls);
    bool ok = d->m && d->done && d->bn_calls;
    for (int k = 0; ok && k < ndev; k++) {
        member *m = &d->m[k];
        m->dev = devices[k];
        m->rank = first_rank + k;
        m->rep = calloc((size_t)nparams, sizeof *m->rep);
        m->tree = calloc((size_t)d->levels + 1, sizeof *m->tree);
        ok = m->rep && m->tree;
        for (int l = 0; ok && l <= d->levels; l++)
            ok = (m->tree[l] = calloc((size_t)(d->block >> l) * nparams, sizeof **m->tree)) !=
                 NULL;
    }
    if (!ok) {
        ddp_free(d);
        nt__err_hostmem(site, fn, "the nt_ddp's tables");
        return NULL;
    }
    /* Replicas: the parameters themselves on their own device, bit copies
     * (new leaves requiring grad) elsewhere. */
    int home = (int)params[0]->dev;
    int rc = 0;
    for (int k = 0; k < ndev && !rc; k++) {
        member *m = &d->m[k];
        nt_stream *old = enter(m->dev);
        nt_no_grad_begin();
        for (int j = 0; j < nparams && !rc; j++) {
            if (m->dev == home) {
                m->rep[j] = nt_retain(params[j]);
                continue;
            }
            nt_tensor *c = nt_to_device_at(site, params[j], m->dev);
            if (c)
                c = nt_keep(c);
            if (!c || nt_set_requires_grad(c, true) != 0) {
                rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
                nt_release(c);
                break;
            }
            m->rep[j] = c;
        }
        nt_no_grad_end();
        leave(old);
    }
    if (rc) {
        ddp_free(d);
        return NULL;
    }
    return d;
}

NT_API nt_ddp *nt_ddp_create(nt_tensor *const *params, int nparams, int shards,
                             const int *devices, int ndev)
{
    return nt_ddp_create_at(NT_RA_SITE, params, nparams, shards, devices, ndev);
}

NT_API void nt_ddp_destroy(nt_ddp *d)
{
    if (!d)
        return;
    if (!nt__hobj_live(d, DDP_MAGIC)) { /* the error: destroyed already, ... */
        nt__hobj_check(d, DDP_MAGIC, NULL, "nt_ddp_destroy", "d", "nt_ddp");
        return;
    }
    ddp_free(d);
}

/* ---------------- queries ---------------- */

NT_API nt_tensor **nt_ddp_params(nt_ddp *d, int dev)
{
    const char *fn = "nt_ddp_params";
    if (!ddp_ok(NULL, d, fn))
        return NULL;
    member *m = member_of_dev(d, dev);
    if (!m) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'dev' is %d, which is not one of the nt_ddp's "
                "devices", dev);
        return NULL;
    }
    return m->rep;
}

NT_API int nt_ddp_shards(const nt_ddp *d)
{
    if (!ddp_ok(NULL, d, "nt_ddp_shards"))
        return nt_last_error();
    return d->shards;
}

NT_API int nt_ddp_shard_device(const nt_ddp *d, int shard)
{
    const char *fn = "nt_ddp_shard_device";
    if (!ddp_ok(NULL, d, fn))
        return nt_last_error();
    if (shard < 0 || shard >= d->shards)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'shard' is %d; expected 0 <= shard < %d",
                       shard, d->shards);
    int k = member_of(d, shard);
    return k < 0 ? -1 : d->m[k].dev;
}

/* ---------------- shards of a batch ---------------- */

NT_API nt_tensor *nt_ddp_shard_at(const nt_site *site, nt_ddp *d, nt_tensor *batch, int shard)
{
    const char *fn = "nt_ddp_shard";
    if (!ddp_ok(site, d, fn) || !nt__check_arg(site, fn, "batch", batch))
        return NULL;
    g_mutex_lock(&d->lock);
    nt_tensor *r = NULL;
    if (!check_shard(site, d, fn, shard))
        goto out;
    if (batch->ndim < 1 || batch->shape[0] % d->shards) {
        char s1[128];
        nt__err(site, NT_ESHAPE, fn,
                "argument 'batch' has shape %s; expected dim 0 divisible by the %d shards",
                nt__shape_str(batch->ndim, batch->shape, s1, sizeof s1), d->shards);
        goto out;
    }
    int64_t rows = batch->shape[0] / d->shards;
    int dev = d->m[member_of(d, shard)].dev, bdev = (int)batch->dev;
    nt_stream *old = enter(bdev);
    nt_tensor *v = nt_slice_at(site, batch, 0, shard * rows, (shard + 1) * rows, 1);
    if (v)
        r = nt_to_device_at(site, v, dev); /* queued on the batch's device */
    leave(old);
    nt_release(v);
out:
    g_mutex_unlock(&d->lock);
    return r;
}

NT_API nt_tensor *nt_ddp_shard(nt_ddp *d, nt_tensor *batch, int shard)
{
    return nt_ddp_shard_at(NT_RA_SITE, d, batch, shard);
}

NT_API nt_tensor *nt_ddp_shard_from_host_at(const nt_site *site, nt_ddp *d, int shard,
                                            const void *src, nt_dtype dt, int ndim,
                                            const int64_t *shape)
{
    const char *fn = "nt_ddp_shard_from_host";
    if (!ddp_ok(site, d, fn))
        return NULL;
    g_mutex_lock(&d->lock);
    nt_tensor *r = NULL;
    if (!check_shard(site, d, fn, shard))
        goto out;
    if (!src || !shape || ndim < 1 || ndim > NT_MAX_DIMS) {
        nt__err(site, NT_EINVAL, fn, "argument '%s' is %s; expected the global batch's %s",
                !src ? "src" : !shape ? "shape" : "ndim", !src || !shape ? "NULL" : "out of range",
                !src ? "host data" : "shape (1..8 dims, dim 0 the batch)");
        goto out;
    }
    if (shape[0] < 0 || shape[0] % d->shards || (int)dt < 0 || dt >= NT_DTYPE_COUNT) {
        if ((int)dt < 0 || dt >= NT_DTYPE_COUNT)
            nt__err(site, NT_EINVAL, fn, "argument 'dt' is %d; not a dtype", (int)dt);
        else
            nt__err(site, NT_ESHAPE, fn,
                    "argument 'shape' has dim 0 = %lld; expected a multiple of the %d shards",
                    (long long)shape[0], d->shards);
        goto out;
    }
    int64_t sh[NT_MAX_DIMS];
    memcpy(sh, shape, sizeof *sh * (size_t)ndim);
    sh[0] = shape[0] / d->shards;
    int64_t row = 1;
    for (int i = 1; i < ndim; i++)
        row *= shape[i];
    int dev = d->m[member_of(d, shard)].dev;
    nt_stream *old = enter(dev);
    r = nt_from_host_at(site,
                        (const char *)src + (size_t)shard * (size_t)sh[0] * (size_t)row *
                                                nt_dtype_size(dt),
                        dt, ndim, sh);
    leave(old);
out:
    g_mutex_unlock(&d->lock);
    return r;
}

NT_API nt_tensor *nt_ddp_shard_from_host(nt_ddp *d, int shard, const void *src, nt_dtype dt,
                                         int ndim, const int64_t *shape)
{
    return nt_ddp_shard_from_host_at(NT_RA_SITE, d, shard, src, dt, ndim, shape);
}

/* ---------------- backward of one shard ---------------- */

/* Places a shard's gradients (f32, owned) at level 0 of its member's tree
 * and adds up every node whose two children now exist.  Ops go on the
 * member's device (the caller has entered it).  0 or an error. */
static int tree_insert(const nt_site *site, nt_ddp *d, member *m, int idx, nt_tensor **g)
{
    int n = d->n;
    for (int j = 0; j < n; j++)
        m->tree[0][idx * n + j] = g[j];
    int rc = 0;
    for (int l = 0; l < d->levels && !rc; l++, idx >>= 1) {
        nt_tensor **a = &m->tree[l][(idx & ~1) * n], **b = &m->tree[l][(idx | 1) * n];
        if (!a[0] || !b[0])
            break;
        for (int j = 0; j < n && !rc; j++) {
            nt_tensor *s = nt_add_at(site, a[j], b[j]);
            if (!s) {
                rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
                break;
            }
            m->tree[l + 1][(idx >> 1) * n + j] = nt_keep(s);
        }
        if (rc)
            break;
        for (int j = 0; j < n; j++) {
            nt_release(a[j]);
            nt_release(b[j]);
            a[j] = b[j] = NULL;
        }
    }
    return rc;
}

NT_API int nt_ddp_backward_at(const nt_site *site, nt_ddp *d, int shard, nt_tensor *loss)
{
    const char *fn = "nt_ddp_backward";
    if (!ddp_ok(site, d, fn))
        return nt_last_error();
    if (!nt__check_arg(site, fn, "loss", loss))
        return nt_last_error() ? nt_last_error() : NT_EINVAL;
    g_mutex_lock(&d->lock);
    int rc = 0;
    if (!check_shard(site, d, fn, shard)) {
        rc = nt_last_error();
        goto out;
    }
    member *m = &d->m[member_of(d, shard)];
    if (loss->dev != m->dev) {
        rc = nt__err(site, NT_EINVAL, fn,
                     "argument 'loss' is on device %d, but shard %d belongs to device %d "
                     "(compute it with nt_ddp_params(d, %d) after nt_device_set(%d))",
                     (int)loss->dev, shard, m->dev, m->dev, m->dev);
        goto out;
    }
    if (d->done[shard]) {
        rc = nt__err(site, NT_ESTATE, fn,
                     "shard %d already has its gradients for this step; call nt_ddp_reduce "
                     "before the next backward of a shard", shard);
        goto out;
    }
    int n = d->n;
    nt_tensor **keep = calloc((size_t)n * 2, sizeof *keep);
    if (!keep) {
        rc = nt__err_hostmem(site, fn, "the shard's gradient list");
        goto out;
    }
    nt_tensor **g = keep + n;
    /* The replica's own .grads (e.g. of the last nt_ddp_reduce) step
     * aside, so this backward starts from none and its gradients are this
     * shard's alone. */
    for (int j = 0; j < n; j++) {
        struct nt__ag *ag = m->rep[j]->ag;
        keep[j] = ag->grad;
        ag->grad = NULL;
    }
    nt_stream *old = enter(m->dev);
    rc = nt_backward_at(site, loss);
    for (int j = 0; j < n; j++) {
        struct nt__ag *ag = m->rep[j]->ag;
        g[j] = ag->grad;
        ag->grad = keep[j];
    }
    nt_scope *sc = NULL;
    if (!rc && !(sc = nt_scope_begin()))
        rc = nt__err_hostmem(site, fn, "a scope");
    nt_no_grad_begin();
    /* f32 for the sum whatever the parameters' dtype; a parameter the loss
     * does not reach gets zeros, so every shard has the same terms. */
    for (int j = 0; j < n && !rc; j++) {
        nt_tensor *x = g[j];
        if (!x)
            x = nt_zeros_at(site, NT_F32, m->rep[j]->ndim, m->rep[j]->shape);
        else if (x->dtype != NT_F32)
            x = nt_cast_at(site, x, NT_F32);
        else
            continue;
        if (!x) {
            rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
            break;
        }
        nt_keep(x);
        nt_release(g[j]);
        g[j] = x;
    }
    bool inserted = false;
    if (!rc) {
        inserted = true;
        rc = tree_insert(site, d, m, shard % d->block, g);
    } else {
        for (int j = 0; j < n; j++)
            nt_release(g[j]);
    }
    nt_no_grad_end();
    if (sc)
        nt_scope_end(sc);
    leave(old);
    free(keep);
    if (!rc)
        d->done[shard] = 1;
    else if (inserted)
        tree_clear(d); /* a half-made tree cannot be trusted: the step starts again */
out:
    g_mutex_unlock(&d->lock);
    return rc;
}

NT_API int nt_ddp_backward(nt_ddp *d, int shard, nt_tensor *loss)
{
    return nt_ddp_backward_at(NT_RA_SITE, d, shard, loss);
}

/* ---------------- batch norm over shards ---------------- */

/* Layer li of this step's calls for (C, M, momentum): a new one for the
 * first shard that gets there, else checked against it.  NULL + error. */
static bn_layer *bn_layer_at(const nt_site *site, nt_ddp *d, int li, int shard, int64_t C,
                             int64_t M, double momentum)
{
    const char *fn = "nt_ddp_batch_norm";
    if (li < d->nbn) {
        bn_layer *L = &d->bn[li];
        if (L->C != C || L->M != M || L->momentum != momentum) {
            nt__err(site, NT_EINVAL, fn,
                    "argument 'x' (call %d of shard %d) has %lld channels of %lld values, "
                    "momentum %g; expected call %d of every shard alike: %lld channels of %lld "
                    "values, momentum %g", li, shard, (long long)C, (long long)M, momentum, li,
                    (long long)L->C, (long long)L->M, L->momentum);
            return NULL;
        }
        return L;
    }
    if (d->nbn == d->bn_cap) {
        int cap = d->bn_cap ? 2 * d->bn_cap : 8;
        bn_layer *nb = realloc(d->bn, sizeof *nb * (size_t)cap);
        if (!nb) {
            nt__err_hostmem(site, fn, "the batch-norm layers");
            return NULL;
        }
        d->bn = nb, d->bn_cap = cap;
    }
    bn_layer *L = &d->bn[d->nbn];
    memset(L, 0, sizeof *L);
    L->C = C, L->M = M, L->momentum = momentum;
    L->mean = calloc((size_t)(d->nmem * d->block), sizeof *L->mean);
    L->ssd = calloc((size_t)(d->nmem * d->block), sizeof *L->ssd);
    if (!L->mean || !L->ssd) {
        free(L->mean), free(L->ssd);
        nt__err_hostmem(site, fn, "a batch-norm layer");
        return NULL;
    }
    d->nbn++;
    return L;
}

/* The shard's own checks: its device, its step, its replica's statistics. */
static bool bn_shard_ok(const nt_site *site, nt_ddp *d, int shard, nt_tensor *x, nt_tensor *rm,
                        member *m)
{
    const char *fn = "nt_ddp_batch_norm";
    if (!rm)
        return nt__err(site, NT_EINVAL, fn, "argument 'running_mean' is NULL; expected the "
                       "running statistics of device %d's replica (nt_batch_norm normalises "
                       "without them)", m->dev), false;
    if ((int)x->dev != m->dev || (int)rm->dev != m->dev)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is on device %d, but shard %d "
                       "belongs to device %d", (int)x->dev != m->dev ? "x" : "running_mean",
                       (int)((int)x->dev != m->dev ? x->dev : rm->dev), shard, m->dev), false;
    if (nt_numel(x) == 0)
        return nt__err(site, NT_ESHAPE, fn, "argument 'x' has no elements; expected at least "
                       "one value per channel"), false;
    if (d->done[shard])
        return nt__err(site, NT_ESTATE, fn, "shard %d already had its nt_ddp_backward this "
                       "step; call nt_ddp_reduce first", shard), false;
    return true;
}

NT_API nt_tensor *nt_ddp_batch_norm_at(const nt_site *site, nt_ddp *d, int shard, nt_tensor *x,
                                       nt_tensor *running_mean, nt_tensor *running_var,
                                       nt_tensor *w, nt_tensor *b, double momentum, double eps)
{
    const char *fn = "nt_ddp_batch_norm";
    if (!ddp_ok(site, d, fn))
        return NULL;
    g_mutex_lock(&d->lock);
    nt_tensor *y = NULL;
    if (!check_shard(site, d, fn, shard) ||
        !nt__bn_check(site, fn, x, running_mean, running_var, w, b, true, momentum, eps))
        goto out;
    int k = member_of(d, shard);
    member *m = &d->m[k];
    if (!bn_shard_ok(site, d, shard, x, running_mean, m))
        goto out;
    int64_t C = x->shape[1], M = nt_numel(x) / C;
    bn_layer *L = bn_layer_at(site, d, d->bn_calls[shard], shard, C, M, momentum);
    if (!L)
        goto out;
    if (L->rm[k] && (L->rm[k] != running_mean || L->rv[k] != running_var)) {
        nt__err(site, NT_EINVAL, fn, "argument 'running_mean' or 'running_var' is not the "
                "tensor an earlier shard of device %d gave to call %d", m->dev,
                d->bn_calls[shard]);
        goto out;
    }
    nt_tensor *mean, *ssd;
    nt_stream *old = enter(m->dev);
    y = nt__bn_shard(site, fn, x, w, b, eps, &mean, &ssd);
    leave(old);
    if (!y)
        goto out;
    int slot = k * d->block + shard % d->block;
    L->mean[slot] = nt_keep(mean), L->ssd[slot] = nt_keep(ssd);
    if (!L->rm[k])
        L->rm[k] = nt_retain(running_mean), L->rv[k] = nt_retain(running_var);
    d->bn_calls[shard]++;
out:
    g_mutex_unlock(&d->lock);
    return y;
}

NT_API nt_tensor *nt_ddp_batch_norm(nt_ddp *d, int shard, nt_tensor *x, nt_tensor *running_mean,
                                    nt_tensor *running_var, nt_tensor *w, nt_tensor *b,
                                    double momentum, double eps)
{
    return nt_ddp_batch_norm_at(NT_RA_SITE, d, shard, x, running_mean, running_var, w, b,
                                momentum, eps);
}

/* v[0..n) (n a power of two) summed as the shard tree's levels inside a
 * block: adjacent pairs, level by level. */
static nt_tensor *local_tree(const nt_site *site, nt_tensor **v, int n)
{
    for (int w = n; w > 1 && v[0]; w /= 2)
        for (int i = 0; i < w / 2; i++)
            v[i] = v[2 * i] && v[2 * i + 1] ? nt_add_at(site, v[2 * i], v[2 * i + 1]) : NULL;
    return v[0];
}

/* Member k's block sums of every layer's per-shard value, one flat [T]:
 * val(L, slot) is the shard's mean (mg NULL) or its ssd + (mean - mg)^2 M
 * (mg: the global means, [T] on member k's device). */
static nt_tensor *bn_block(const nt_site *site, nt_ddp *d, int k, nt_tensor *mg)
{
    nt_tensor *parts[64], **v = calloc((size_t)d->block, sizeof *v);
    if (!v) {
        nt__err_hostmem(site, "nt_ddp_reduce", "a batch-norm tree");
        return NULL;
    }
    int64_t off = 0;
    for (int l = 0; l < d->nbn; l++) {
        bn_layer *L = &d->bn[l];
        nt_tensor *g = mg ? nt_slice_at(site, mg, 0, off, off + L->C, 1) : NULL;
        for (int i = 0; i < d->block; i++) {
            nt_tensor *mu = L->mean[k * d->block + i];
            if (!mg) {
                v[i] = mu;
                continue;
            }
            nt_tensor *e = g ? nt_sub_at(site, mu, g) : NULL;
            e = e ? nt_mul_scalar_at(site, nt_mul_at(site, e, e), (double)L->M) : NULL;
            v[i] = e ? nt_add_at(site, L->ssd[k * d->block + i], e) : NULL;
        }
        parts[l] = local_tree(site, v, d->block);
        off += L->C;
        if (!parts[l]) {
            free(v);
            return NULL;
        }
    }
    free(v);
    return d->nbn == 1 ? parts[0] : nt_cat_at(site, parts, d->nbn, 0);
}

/* Sums every member's block sums over the ranks (the rank tree of the
 * collective) into out[k]. */
static int bn_round(const nt_site *site, nt_ddp *d, nt_tensor *const *mg, nt_tensor **out)
{
    nt_tensor *in[DDP_MAX_DEV] = {0};
    for (int k = 0; k < d->nmem; k++) {
        nt_stream *old = enter(d->m[k].dev);
        in[k] = bn_block(site, d, k, mg ? mg[k] : NULL);
        leave(old);
        if (!in[k])
            return nt_last_error() ? nt_last_error() : NT_EINVAL;
    }
    if (!d->comm) {
        out[0] = in[0];
        return 0;
    }
    return nt_all_reduce_at(site, d->comm, in, out, NT_REDUCE_SUM);
}

/* The running statistics of every layer from the shards' statistics over
 * the shard tree (docs/ddp.md): mean = tree(mean_s) / S, ssd = tree(ssd_s +
 * (mean_s - mean)^2 M), var = ssd / (S M - 1); then on every replica rm =
 * rm (1 - m) + mean m, rv likewise. */
static int bn_reduce(const nt_site *site, nt_ddp *d)
{
    if (!d->nbn)
        return 0;
    if (d->nbn > 64)
        return nt__err(site, NT_EINVAL, "nt_ddp_reduce", "%d nt_ddp_batch_norm calls per "
                       "shard; at most 64", d->nbn);
    nt_tensor *mg[DDP_MAX_DEV] = {0}, *tot[DDP_MAX_DEV] = {0};
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, "nt_ddp_reduce", "a scope");
    nt_no_grad_begin();
    int rc = bn_round(site, d, NULL, mg);
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        if (!(mg[k] = nt_mul_scalar_at(site, mg[k], 1.0 / d->shards)))
            rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
        leave(old);
    }
    if (!rc)
        rc = bn_round(site, d, mg, tot);
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        int64_t off = 0;
        for (int l = 0; l < d->nbn && !rc; l++) {
            bn_layer *L = &d->bn[l];
            nt_tensor *mean = nt_slice_at(site, mg[k], 0, off, off + L->C, 1);
            nt_tensor *ssd = nt_slice_at(site, tot[k], 0, off, off + L->C, 1);
            nt_tensor *var = ssd ? nt_div_scalar_at(site, ssd, (double)(d->shards * L->M - 1))
                                 : NULL;
            rc = !mean || !var ? (nt_last_error() ? nt_last_error() : NT_EINVAL)
                               : nt__bn_update(site, "nt_ddp_reduce", L->rm[k], mean, L->momentum);
            if (!rc)
                rc = nt__bn_update(site, "nt_ddp_reduce", L->rv[k], var, L->momentum);
            off += L->C;
        }
        leave(old);
    }
    nt_no_grad_end();
    nt_scope_end(sc);
    return rc;
}

/* ---------------- reduce ---------------- */

/* All-reduces (SUM) the block sums of parameters lo..hi (one flat f32
 * tensor per member when there are several) and puts the results in place
 * of the sums: sum[k * n + j] and member k's tree root.  0 or an error. */
static int bucket_all_reduce(const nt_site *site, nt_ddp *d, nt_tensor **sum, int lo, int hi)
{
    int n = d->n, rc = 0;
    nt_tensor *in[DDP_MAX_DEV] = {0}, *out[DDP_MAX_DEV] = {0};
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, "nt_ddp_reduce", "a scope");
    nt_no_grad_begin();
    for (int k = 0; k < d->nmem && !rc; k++) {
        if (lo == hi) {
            in[k] = sum[k * n + lo];
            continue;
        }
        nt_tensor *flat[64];
        nt_tensor **parts = hi - lo + 1 <= 64 ? flat : calloc((size_t)(hi - lo + 1), sizeof *parts);
        if (!parts) {
            rc = nt__err_hostmem(site, "nt_ddp_reduce", "a bucket");
            break;
        }
        nt_stream *old = enter(d->m[k].dev);
        for (int j = lo; j <= hi; j++)
            parts[j - lo] = nt_reshape_at(site, sum[k * n + j], 1,
                                          (int64_t[]){nt_numel(sum[k * n + j])});
        in[k] = nt_cat_at(site, parts, hi - lo + 1, 0);
        leave(old);
        if (parts != flat)
            free(parts);
        if (!in[k])
            rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
    }
    if (!rc)
        rc = nt_all_reduce_at(site, d->comm, in, out, NT_REDUCE_SUM);
    for (int k = 0; k < d->nmem && !rc; k++) {
        int64_t off = 0;
        nt_stream *old = enter(d->m[k].dev);
        for (int j = lo; j <= hi && !rc; j++) {
            nt_tensor *t = sum[k * n + j], *r = out[k];
            int64_t len = nt_numel(t);
            if (lo != hi)
                r = nt_reshape_at(site, nt_slice_at(site, out[k], 0, off, off + len, 1), t->ndim,
                                  t->shape);
            off += len;
            if (!r) {
                rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
                break;
            }
            if (r == out[k])
                nt_retain(r); /* the scope keeps its own reference */
            else
                nt_keep(r);
            nt_release(d->m[k].tree[d->levels][j]);
            d->m[k].tree[d->levels][j] = sum[k * n + j] = r;
        }
        leave(old);
    }
    nt_no_grad_end();
    nt_scope_end(sc);
    return rc;
}

NT_API int nt_ddp_reduce_at(const nt_site *site, nt_ddp *d)
{
    const char *fn = "nt_ddp_reduce";
    if (!ddp_ok(site, d, fn))
        return nt_last_error();
    g_mutex_lock(&d->lock);
    int rc = 0, n = d->n;
    int lo = d->first_rank * d->block, hi = lo + d->nmem * d->block;
    for (int s = lo; s < hi; s++)
        if (!d->done[s]) {
            rc = nt__err(site, NT_ESTATE, fn,
                         "shard %d of %d has no gradients yet; call nt_ddp_backward for every "
                         "shard of this process (%d..%d) first", s, d->shards, lo, hi - 1);
            goto out;
        }
    for (int s = lo; s < hi; s++)
        if (d->bn_calls[s] != d->nbn) {
            rc = nt__err(site, NT_ESTATE, fn,
                         "shard %d made %d nt_ddp_batch_norm calls this step and another "
                         "shard %d; every shard must make the same calls", s, d->bn_calls[s],
                         d->nbn);
            goto out;
        }
    /* Each member's block sum is the root of its tree; over the ranks, the
     * rank tree of the collective; then the mean, rounded once. */
    nt_tensor **sum = calloc((size_t)d->nmem * n, sizeof *sum);
    if (!sum) {
        rc = nt__err_hostmem(site, fn, "the list of sums");
        goto out;
    }
    for (int k = 0; k < d->nmem; k++)
        for (int j = 0; j < n; j++)
            sum[k * n + j] = d->m[k].tree[d->levels][j];
    /* Above the blocks: the rank tree of the collective, in buckets, the
     * last parameters first (their gradients are ready first).  A call
     * costs a fixed part (2(N-1) latency steps of a ring: 4 us on 2 cores,
     * 124 us on 32 of trn1.32xlarge) plus the bytes: a bucket takes more
     * parameters while the fixed part still dominates (the cost model's
     * time of the merged bucket under twice its time for no bytes), so
     * few ranks get one call
     * per big gradient (each can start as soon as it is ready) and many
     * ranks one call for all of them.  Never above DDP_BUCKET_BYTES. */
    double fixed = 0;
    if (d->comm)
        nt_collective_cost(NT_COLL_ALL_REDUCE, d->ranks, 0, &fixed, NULL);
    for (int hi_j = n - 1; hi_j >= 0 && d->comm && !rc;) {
        int lo_j = hi_j;
        double bytes = 4.0 * (double)nt_numel(sum[hi_j]);
        while (lo_j > 0) {
            double more = bytes + 4.0 * (double)nt_numel(sum[lo_j - 1]), t = 0;
            nt_collective_cost(NT_COLL_ALL_REDUCE, d->ranks, more, &t, NULL);
            if (t >= 2 * fixed || more > DDP_BUCKET_BYTES)
                break;
            bytes = more;
            lo_j--;
        }
        rc = bucket_all_reduce(site, d, sum, lo_j, hi_j);
        hi_j = lo_j - 1;
    }
    const double inv = 1.0 / d->shards;
    for (int k = 0; k < d->nmem && !rc; k++) {
        member *m = &d->m[k];
        nt_stream *old = enter(m->dev);
        nt_scope *sc = nt_scope_begin();
        if (!sc)
            rc = nt__err_hostmem(site, fn, "a scope");
        nt_no_grad_begin();
        for (int j = n - 1; j >= 0 && !rc; j--) { /* in the order the buckets arrive */
            nt_tensor *p = m->rep[j];
            nt_tensor *g = nt_mul_scalar_at(site, sum[k * n + j], inv);
            if (g && p->dtype != NT_F32)
                g = nt_cast_at(site, g, (nt_dtype)p->dtype);
            if (!g) {
                rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
                break;
            }
            nt_keep(g);
            if (p->ag->grad)
                nt_release(p->ag->grad);
            p->ag->grad = g;
        }
        nt_no_grad_end();
        if (sc)
            nt_scope_end(sc);
        leave(old);
    }
    free(sum);
    if (!rc)
        rc = bn_reduce(site, d);
    tree_clear(d);
out:
    g_mutex_unlock(&d->lock);
    return rc;
}

NT_API int nt_ddp_reduce(nt_ddp *d) { return nt_ddp_reduce_at(NT_RA_SITE, d); }

/* ---------------- one optimizer per replica ---------------- */

NT_API int nt_ddp_step_at(const nt_site *site, nt_ddp *d, nt_optim *const *opts, int nopts)
{
    const char *fn = "nt_ddp_step";
    if (!ddp_ok(site, d, fn))
        return nt_last_error();
    if (!opts || nopts != d->nmem)
        return nt__err(site, NT_EINVAL, fn,
                       "argument '%s' is %s; expected one optimizer per local device (%d), "
                       "opts[i] over nt_ddp_params of the i-th device", opts ? "nopts" : "opts",
                       opts ? "wrong" : "NULL", d->nmem);
    g_mutex_lock(&d->lock);
    int rc = 0;
    for (int k = 0; k < d->nmem && !rc; k++) {
        int np = nt__optim_nparams(opts[k]);
        if (np < 0) {
            rc = nt__err(site, NT_EINVAL, fn, "argument 'opts[%d]' is not a live optimizer", k);
            break;
        }
        bool same = np == d->n;
        for (int j = 0; same && j < np; j++)
            same = nt__optim_param(opts[k], j) == d->m[k].rep[j];
        if (!same)
            rc = nt__err(site, NT_EINVAL, fn,
                         "argument 'opts[%d]' does not optimize nt_ddp_params(d, %d) (the same "
                         "%d tensors in the same order)", k, d->m[k].dev, d->n);
    }
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        rc = nt_optim_step_at(site, opts[k]);
        if (!rc)
            rc = nt_optim_zero_grad(opts[k]);
        leave(old);
    }
    g_mutex_unlock(&d->lock);
    return rc;
}

NT_API int nt_ddp_step(nt_ddp *d, nt_optim *const *opts, int nopts)
{
    return nt_ddp_step_at(NT_RA_SITE, d, opts, nopts);
}
