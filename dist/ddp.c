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
#include "autograd/optim.h"
#include "core/handle.h"
#include "dispatcher/dispatch.h"
#include "dist/dist.h"
#include "fusion/graph.h"
#include "streams/stream.h"

#include <glib.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DDP_MAGIC 0x44445031u /* "DDP1" */
#define DDP_MAX_DEV 64     /* local devices (NT_SIM_CORES at most 64) */
#define DDP_BUCKET_BYTES (25.0 * 1024 * 1024) /* PyTorch DDP's default bucket */
#define DDP_MAX_LAYERS 256 /* nt_ddp_layer_done's marks in one round */
#define DDP_LAYER_PARAMS 64 /* parameters of one marked layer (one all-gather) */

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
    nt_comm *join;  /* the local devices alone (nt_ddp_backward_shards' join) */
    bn_layer *bn;   /* nt_ddp_batch_norm's layers (docs/ddp.md) */
    int nbn, bn_cap;
    int *bn_calls;  /* [S] this step's nt_ddp_batch_norm calls of each shard */
    GMutex lock;
    /* ZeRO (docs/sharding.md): stage 0 is plain data parallelism. */
    int zero;                 /* 0..3 */
    int64_t reduces;          /* nt_ddp_reduce calls made */
    int64_t *numel, *len;     /* [n] elements; shard length L = ceil(numel / R) */
    int *pnd;                 /* [n] the parameters' ndim, shape, dtype */
    int64_t (*pshape)[NT_MAX_DIMS];
    nt_dtype *pdt;
    nt_tensor **shard;        /* [nmem * n] member k's shard of parameter j (a leaf) */
    /* [n] stage 3: the version of member 0's shard j when its gathered
     * replica was made.  A replay of a captured step updates the shards
     * without the host's backward releasing the replicas, so a replica
     * gathered before it (an evaluation's) is stale once the version moved. */
    uint64_t *gver;
    uint8_t *view;            /* [nmem * n] that shard is a view of the replica */
    /* nt_ddp_set_overlap: the reduce-scatter of each bucket issued from the
     * backward (gradient hooks on the replicas of each member's last shard). */
    bool overlap;
    int nov;                  /* buckets, in nt_ddp_reduce's order (last first) */
    struct ov_bucket *ov;
    int *ov_of;               /* [n] the bucket of parameter j */
    uint8_t *ov_ready;        /* [nmem * n] member k's block sum of j is in its bucket */
    struct ov_hook *ovh;      /* [nmem * n] the hooks' contexts */
    int ov_err;               /* the first error of a hook this step */
    /* nt_ddp_layer_done (stage 3): the layers marked in the forward of the
     * round whose backward has not run yet, in the forward's order (their
     * marks' generation lay_gen); the all-gather queued for the next layer
     * the backward refills (the prefetch: [pre_lo, pre_hi), none when
     * pre_hi is 0), its outputs a reference each. */
    int nlay;
    int lay_lo[DDP_MAX_LAYERS], lay_hi[DDP_MAX_LAYERS];
    uint64_t lay_gen;
    int pre_lo, pre_hi;
    nt_tensor *pre[DDP_MAX_DEV];
    /* the thread running a backward pass of this nt_ddp (backward_pass,
     * holding the lock): a layer's mark, run inside that pass on that
     * thread, goes on without taking the lock */
    GThread *pass_thread;
};

/* One bucket of the overlapped reduce-scatter: parameters [lo, hi]; each
 * member's packed input once all its block sums are made, the collective's
 * outputs once every member's is. */
typedef struct ov_bucket {
    int lo, hi, packed;
    bool issued;
    nt_tensor *in[DDP_MAX_DEV], *out[DDP_MAX_DEV];
} ov_bucket;

typedef struct ov_hook {
    nt_ddp *d;
    int k, j, idx; /* member, parameter, the shard's slot in the member's block */
    nt_hook_handle h;
} ov_hook;

static void zero_free(nt_ddp *d);
static int zero_reduce(const nt_site *site, nt_ddp *d, nt_tensor **sum);
static int zero_step(const nt_site *site, nt_ddp *d, nt_optim *const *opts);
static int zero_backward_check(const nt_site *site, const char *fn, nt_ddp *d,
                               const member *m);
static void zero_backward_done(nt_ddp *d, int k);
static void ov_clear(nt_ddp *d);
static void ov_free(nt_ddp *d);
static bool ov_last_shard(const nt_ddp *d, const member *m);
static int ov_hooks(const nt_site *site, nt_ddp *d, member *m, int shard, bool on);
static int ov_take(const nt_site *site, nt_ddp *d, int k, int j, int idx, nt_tensor *g);
static void layer_reset(nt_ddp *d);

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

/* The code of the error a failed call left, or dflt when it left none
 * (a NULL from a call that sets no error). */

/* The error of a call that returned NULL. */
static int errc(void) { return nt__err_or(NT_EINVAL); }

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
    ov_clear(d);
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
        layer_reset(d);
        for (int k = 0; k < d->nmem; k++)
            if (d->m[k].rep)
                for (int j = 0; j < d->n; j++)
                    nt_release(d->m[k].rep[j]);
    }
    zero_free(d);
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
    nt_comm_destroy(d->join);
    g_mutex_clear(&d->lock);
    nt__hobj_free(d);
}

/* Replicas: the parameters themselves on their own device, bit copies
 * (new leaves requiring grad) elsewhere.  Each device's copies read the
 * home replica on that device's stream, but a storage remembers only its
 * last reader, which is all an in-place write there (nt_ddp_load's, an
 * optimizer step's) waits for: so every device's copies wait for the
 * previous device's (an event), and the last reader finishes last. */
static int replicate(const nt_site *site, nt_ddp *d, nt_tensor *const *params, int nparams)
{
    int home = (int)params[0]->dev;
    int rc = 0;
    nt_event *prev = NULL; /* recorded after the previous device's copies */
    for (int k = 0; k < d->nmem && !rc; k++) {
        member *m = &d->m[k];
        nt_stream *old = enter(m->dev);
        if (m->dev != home && prev)
            rc = nt_stream_wait_event(NULL, prev);
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
                rc = errc();
                nt_release(c);
                break;
            }
            m->rep[j] = c;
        }
        nt_no_grad_end();
        if (!rc && m->dev != home && !prev && !(prev = nt_event_create()))
            rc = nt__err_or(NT_EHOSTMEM);
        if (!rc && m->dev != home)
            rc = nt_event_record(prev, NULL);
        leave(old);
    }
    nt_event_destroy(prev);
    return rc;
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
    int rc = replicate(site, d, params, nparams);
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

/* Adds up, from slot idx at level 0 of member m's tree, every node of
 * parameters [lo, hi) whose two children now exist (parameter lo's
 * children stand for all of them).  0 or an error. */
static int tree_sum(const nt_site *site, nt_ddp *d, member *m, int idx, int lo, int hi)
{
    int n = d->n, rc = 0;
    for (int l = 0; l < d->levels && !rc; l++, idx >>= 1) {
        nt_tensor **a = &m->tree[l][(idx & ~1) * n], **b = &m->tree[l][(idx | 1) * n];
        if (!a[lo] || !b[lo])
            break;
        for (int j = lo; j < hi && !rc; j++) {
            nt_tensor *s = nt_add_at(site, a[j], b[j]);
            if (!s)
                rc = errc();
            else
                m->tree[l + 1][(idx >> 1) * n + j] = nt_keep(s);
        }
        for (int j = lo; j < hi && !rc; j++) {
            nt_release(a[j]);
            nt_release(b[j]);
            a[j] = b[j] = NULL;
        }
    }
    return rc;
}

/* A gradient g (one reference, consumed; NULL where the loss did not
 * reach) as f32 for the sum whatever the parameter's dtype, zeros of shape
 * nd/shape for a missing one, so every shard has the same terms.  NULL
 * with the error set. */
static nt_tensor *grad_f32(const nt_site *site, nt_tensor *g, int nd, const int64_t *shape)
{
    nt_tensor *x = g;
    if (!x)
        x = nt_zeros_at(site, NT_F32, nd, shape);
    else if (x->dtype != NT_F32)
        x = nt_cast_at(site, x, NT_F32);
    else
        return g;
    if (x)
        nt_keep(x);
    nt_release(g);
    return x;
}

/* Places a shard's gradients (f32, owned) at level 0 of its member's tree
 * and adds up every node whose two children now exist.  Ops go on the
 * member's device (the caller has entered it).  0 or an error. */
static int tree_insert(const nt_site *site, nt_ddp *d, member *m, int idx, nt_tensor **g)
{
    int n = d->n;
    for (int j = 0; j < n; j++)
        m->tree[0][idx * n + j] = g[j];
    return tree_sum(site, d, m, idx, 0, n);
}

/* Shard `shard`'s gradients g[0..n) (the replica's, taken out of .grad; NULL
 * where the loss did not reach) into member m's tree of d: f32, zeros for
 * a missing one, then tree_insert.  Consumes g.  0 or an error. */
static int shard_collect(const nt_site *site, const char *fn, nt_ddp *d, member *m, int shard,
                         nt_tensor **g, bool ov)
{
    int n = d->n, rc = 0;
    nt_stream *old = enter(m->dev);
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        rc = nt__err_hostmem(site, fn, "a scope");
    nt_no_grad_begin();
    bool inserted = false;
    if (ov) { /* the hooks put the gradients in already; the rest (none reached) now */
        rc = rc ? rc : d->ov_err;
        for (int j = n - 1; j >= 0 && !rc; j--)
            if (!d->ov_ready[(m - d->m) * n + j])
                rc = ov_take(site, d, (int)(m - d->m), j, shard % d->block, nt_retain(g[j]));
        for (int j = 0; j < n; j++)
            nt_release(g[j]);
        inserted = true; /* the buckets may be half made */
    } else {
        for (int j = 0; j < n && !rc; j++)
            if (!(g[j] = grad_f32(site, g[j], m->rep[j]->ndim, m->rep[j]->shape)))
                rc = errc();
        if (!rc) {
            inserted = true;
            rc = tree_insert(site, d, m, shard % d->block, g);
        } else {
            for (int j = 0; j < n; j++)
                nt_release(g[j]);
        }
    }
    nt_no_grad_end();
    if (sc)
        nt_scope_end(sc);
    leave(old);
    if (!rc) {
        d->done[shard] = 1;
        zero_backward_done(d, (int)(m - d->m));
    } else if (inserted)
        tree_clear(d); /* a half-made tree cannot be trusted: the step starts again */
    return rc;
}

/* The checks of shard `shard` of ds[i] before its backward: the shard is
 * this process's, not done yet, and (stage 3) gathered.  *m its member.
 * `which`: how a message names d ("" when it is the call's only one). */
static int shard_check(const nt_site *site, const char *fn, nt_ddp *d, const char *which,
                       int shard, member **m)
{
    if (!check_shard(site, d, fn, shard))
        return nt_last_error();
    *m = &d->m[member_of(d, shard)];
    if (d->done[shard])
        return nt__err(site, NT_ESTATE, fn,
                       "shard %d already has its gradients for this step%s; call "
                       "nt_ddp_reduce before the next backward of a shard", shard, which);
    return zero_backward_check(site, fn, d, *m);
}

/* One pass's entries: the backward of ds[i]'s shard shards[i] (member m[i])
 * for i < ne.  Either one loss that reaches every entry's replica (loss,
 * on m[0]'s device: nt_ddp_backward, nt_ddp_backward_group) or one loss
 * per local device of ds[0] (losses[i] on its member i's device), joined
 * (nt_tp_join over `join`'s members, those devices in the communicator's
 * order) into the one the pass starts from: nt_ddp_backward_shards (entry
 * i is device i's), nt_ddp_backward_group_shards (entries i nd .. i nd +
 * nd - 1 are device i's shard in each of the group's nd nt_ddps). */
typedef struct pass {
    nt_ddp *const *ds;
    const int *shards;
    int ne;
    nt_tensor *loss;
    nt_tensor *const *losses;
} pass;

/* The index of the first entry before i with ds[i]'s nt_ddp, or i. */
static int pass_first(const pass *p, int i)
{
    int k = 0;
    while (p->ds[k] != p->ds[i])
        k++;
    return k;
}

/* The loss the pass starts from, on m[0]'s device: p->loss, or the join of
 * p->losses (a new tensor of the open scope).  NULL with the error set. */
static nt_tensor *pass_loss(const nt_site *site, const char *fn, const pass *p)
{
    if (p->loss)
        return p->loss;
    nt_ddp *d = p->ds[0];
    if (d->nmem == 1) /* one loss a local device of ds[0] */
        return p->losses[0];
    if (!d->join) { /* the local devices' communicator, made on first use */
        int devs[DDP_MAX_DEV];
        for (int k = 0; k < d->nmem; k++)
            devs[k] = d->m[k].dev;
        if (!(d->join = nt__comm_create_local(devs, d->nmem))) {
            char why[512];
            int code = errc();
            snprintf(why, sizeof why, "%s", nt_last_error_message());
            nt__err(site, code, fn, "could not make the communicator of the %d local devices "
                    "the losses are joined over: %s", d->nmem, why);
            return NULL;
        }
    }
    return nt_tp_join_at(site, d->join, p->losses);
}

/* nt_ddp_backward of the entries of p: the checks, one nt_backward, and
 * each entry's gradients into its own member's tree. */
static int backward_pass(const nt_site *site, const char *fn, const pass *p)
{
    nt_ddp *const *ds = p->ds;
    int ne = p->ne;
    member *m[DDP_MAX_DEV] = {0};
    int rc = 0, locked = 0;
    for (; locked < ne && !rc; locked++) {
        char which[40] = "";
        if (pass_first(p, locked) == locked)
            g_mutex_lock(&ds[locked]->lock);
        if (!p->losses)
            snprintf(which, sizeof which, " (nt_ddp %d)", locked);
        rc = shard_check(site, fn, ds[locked], which, p->shards[locked], &m[locked]);
    }
    if (!rc && p->loss && p->loss->dev != m[0]->dev)
        rc = nt__err(site, NT_EINVAL, fn,
                     "argument 'loss' is on device %d, but shard %d belongs to device %d "
                     "(compute it with nt_ddp_params(d, %d) after nt_device_set(%d))",
                     (int)p->loss->dev, p->shards[0], m[0]->dev, m[0]->dev, m[0]->dev);
    int tot = 0;
    for (int i = 0; i < ne; i++)
        tot += ds[i]->n;
    nt_tensor **keep = rc ? NULL : calloc((size_t)tot * 2, sizeof *keep);
    if (!rc && !keep)
        rc = nt__err_hostmem(site, fn, "the shard's gradient list");
    if (!rc) {
        nt_tensor **g = keep + tot;
        /* The replicas' own .grads (e.g. of the last nt_ddp_reduce) step
         * aside, so this backward starts from none and its gradients are
         * this shard's alone. */
        for (int i = 0, o = 0; i < ne; o += ds[i++]->n)
            for (int j = 0; j < ds[i]->n; j++) {
                struct nt__ag *ag = m[i]->rep[j]->ag;
                keep[o + j] = ag->grad;
                ag->grad = NULL;
            }
        /* nt_ddp_set_overlap: the last shard of a member takes its
         * gradients in hooks, as the backward makes them */
        bool ov[DDP_MAX_DEV] = {0};
        for (int i = 0; i < ne && !rc; i++)
            if ((ov[i] = ov_last_shard(ds[i], m[i])))
                rc = ov_hooks(site, ds[i], m[i], p->shards[i], true);
        for (int i = 0; i < ne; i++)
            g_atomic_pointer_set(&ds[i]->pass_thread, g_thread_self());
        nt_stream *old = enter(m[0]->dev);
        nt_scope *sc = rc ? NULL : nt_scope_begin();
        if (!rc && !sc)
            rc = nt__err_hostmem(site, fn, "a scope");
        nt_tensor *loss = rc ? NULL : pass_loss(site, fn, p);
        if (!rc && !loss)
            rc = errc();
        if (!rc)
            rc = nt_backward_at(site, loss);
        if (sc)
            nt_scope_end(sc);
        leave(old);
        for (int i = 0; i < ne; i++) {
            g_atomic_pointer_set(&ds[i]->pass_thread, NULL);
            layer_reset(ds[i]); /* the round's marks are spent (or their graph failed) */
        }
        for (int i = 0; i < ne; i++)
            if (ov[i])
                ov_hooks(site, ds[i], m[i], p->shards[i], false);
        for (int i = 0, o = 0; i < ne; o += ds[i++]->n)
            for (int j = 0; j < ds[i]->n; j++) {
                struct nt__ag *ag = m[i]->rep[j]->ag;
                g[o + j] = ag->grad;
                ag->grad = keep[o + j];
            }
        for (int i = 0, o = 0; i < ne; o += ds[i++]->n) {
            if (rc) {
                for (int j = 0; j < ds[i]->n; j++)
                    nt_release(g[o + j]);
                if (ov[i])
                    tree_clear(ds[i]); /* buckets half made: the step starts again */
                continue;
            }
            rc = shard_collect(site, fn, ds[i], m[i], p->shards[i], g + o, ov[i]);
        }
    }
    free(keep);
    while (locked > 0) {
        locked--;
        if (pass_first(p, locked) == locked)
            g_mutex_unlock(&ds[locked]->lock);
    }
    return rc;
}

NT_API int nt_ddp_backward_at(const nt_site *site, nt_ddp *d, int shard, nt_tensor *loss)
{
    const char *fn = "nt_ddp_backward";
    if (!ddp_ok(site, d, fn))
        return nt_last_error();
    if (!nt__check_arg(site, fn, "loss", loss))
        return errc();
    return backward_pass(site, fn, &(pass){.ds = &d, .shards = &shard, .ne = 1, .loss = loss});
}

NT_API int nt_ddp_backward(nt_ddp *d, int shard, nt_tensor *loss)
{
    return nt_ddp_backward_at(NT_RA_SITE, d, shard, loss);
}

/* The nt_ddps of a tensor-parallel group (nt_ddp_backward_group,
 * nt_ddp_backward_group_shards): 1..DDP_MAX_DEV live ones, none twice. */
static int group_args(const nt_site *site, const char *fn, nt_ddp *const *ds, int nd)
{
    if (!ds || nd < 1 || nd > DDP_MAX_DEV)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is %s; expected 1..%d nt_ddps",
                       ds ? "nd" : "ds", ds ? "out of range" : "NULL", DDP_MAX_DEV);
    for (int i = 0; i < nd; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "ds[%d]", i);
        if (nt__hobj_check(ds[i], DDP_MAGIC, site, fn, arg, "nt_ddp"))
            return nt_last_error();
        for (int k = 0; k < i; k++)
            if (ds[k] == ds[i])
                return nt__err(site, NT_EINVAL, fn, "argument 'ds' lists the same nt_ddp at "
                               "%d and %d", k, i);
    }
    return 0;
}

NT_API int nt_ddp_backward_group_at(const nt_site *site, nt_ddp *const *ds, int nd, int shard,
                                    nt_tensor *loss)
{
    const char *fn = "nt_ddp_backward_group";
    if (!nt__ensure_init())
        return NT_ESTATE;
    int rc = group_args(site, fn, ds, nd);
    if (rc)
        return rc;
    if (!nt__check_arg(site, fn, "loss", loss))
        return errc();
    int sh[DDP_MAX_DEV];
    for (int i = 0; i < nd; i++)
        sh[i] = shard;
    return backward_pass(site, fn, &(pass){.ds = ds, .shards = sh, .ne = nd, .loss = loss});
}

NT_API int nt_ddp_backward_group(nt_ddp *const *ds, int nd, int shard, nt_tensor *loss)
{
    return nt_ddp_backward_group_at(NT_RA_SITE, ds, nd, shard, loss);
}

/* Whether shards[i] is a shard of d's local device i (nt_ddp_create's
 * devices[i]); `which` names d among several (or ""). */
static int shard_of_device(const nt_site *site, const char *fn, const nt_ddp *d,
                           const char *which, const int *shards, int i)
{
    if (shards[i] < 0 || shards[i] >= d->shards)
        return nt__err(site, NT_EINVAL, fn, "argument 'shards[%d]' is %d; expected 0 <= shard "
                       "< %d%s", i, shards[i], d->shards, which);
    int k = member_of(d, shards[i]);
    if (k != i)
        return nt__err(site, NT_EINVAL, fn, "argument 'shards[%d]' is %d, %s%s; expected a "
                       "shard of local device %d (nt_ddp_create's devices[%d]): shards[i] and "
                       "losses[i] are the i-th local device's", i, shards[i],
                       k < 0 ? "a shard of another process" : "a shard of another device",
                       which, d->m[i].dev, i);
    return 0;
}

/* The arguments of nt_ddp_backward_shards that need no lock: one loss (a
 * floating scalar) and one shard of this process per local device, shard
 * i of local device i, not while capturing. */
static int shards_args(const nt_site *site, const char *fn, nt_ddp *d, const int *shards,
                       nt_tensor *const *losses, int n)
{
    if (!shards || !losses)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL; expected one %s per local "
                       "device of d (%d)", shards ? "losses" : "shards",
                       shards ? "loss" : "shard", d->nmem);
    if (n != d->nmem)
        return nt__err(site, NT_EINVAL, fn, "argument 'n' is %d; expected %d: one loss and one "
                       "shard for each local device of d, in nt_ddp_create's order", n,
                       d->nmem);
    nt_stream *cur = nt_stream_current();
    if (nt__capturing() || (cur && AO_load(&cur->capture)))
        return nt__err(site, NT_ESTATE, fn, "called while capturing a program "
                       "(nt_graph_capture_begin); a captured step takes each shard's "
                       "nt_ddp_backward instead");
    for (int i = 0; i < n; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "losses[%d]", i);
        if (!nt__check_arg(site, fn, arg, losses[i]))
            return errc();
        if (!nt__dtype_is_float((nt_dtype)losses[i]->dtype) || nt_numel(losses[i]) != 1)
            return nt__err(site, NT_EINVAL, fn, "argument '%s' is %s with %lld elements; "
                           "expected a floating loss of one element", arg,
                           nt_dtype_name((nt_dtype)losses[i]->dtype),
                           (long long)nt_numel(losses[i]));
        if (i > 0 && (losses[i]->dtype != losses[0]->dtype || losses[i]->ndim != losses[0]->ndim))
            return nt__err(site, NT_EINVAL, fn, "argument '%s' is %s of %d dims but losses[0] "
                           "%s of %d: the losses are joined, so they must match", arg,
                           nt_dtype_name((nt_dtype)losses[i]->dtype), losses[i]->ndim,
                           nt_dtype_name((nt_dtype)losses[0]->dtype), losses[0]->ndim);
        int rc = shard_of_device(site, fn, d, "", shards, i);
        if (rc)
            return rc;
        if (losses[i]->dev != d->m[i].dev)
            return nt__err(site, NT_EINVAL, fn,
                           "argument 'losses[%d]' is on device %d, but its shard %d belongs to "
                           "device %d (compute it with nt_ddp_params(d, %d) after "
                           "nt_device_set(%d))", i, (int)losses[i]->dev, shards[i], d->m[i].dev,
                           d->m[i].dev, d->m[i].dev);
    }
    return 0;
}

NT_API int nt_ddp_backward_shards_at(const nt_site *site, nt_ddp *d, const int *shards,
                                     nt_tensor *const *losses, int n)
{
    const char *fn = "nt_ddp_backward_shards";
    if (!ddp_ok(site, d, fn))
        return nt_last_error();
    int rc = shards_args(site, fn, d, shards, losses, n);
    if (rc)
        return rc;
    nt_ddp *ds[DDP_MAX_DEV];
    for (int i = 0; i < n; i++)
        ds[i] = d;
    return backward_pass(site, fn, &(pass){.ds = ds, .shards = shards, .ne = n,
                                           .losses = losses});
}

NT_API int nt_ddp_backward_shards(nt_ddp *d, const int *shards, nt_tensor *const *losses, int n)
{
    return nt_ddp_backward_shards_at(NT_RA_SITE, d, shards, losses, n);
}

NT_API int nt_ddp_backward_group_shards_at(const nt_site *site, nt_ddp *const *ds, int nd,
                                           const int *shards, nt_tensor *const *losses, int n)
{
    const char *fn = "nt_ddp_backward_group_shards";
    if (!nt__ensure_init())
        return NT_ESTATE;
    int rc = group_args(site, fn, ds, nd);
    if (!rc)
        rc = shards_args(site, fn, ds[0], shards, losses, n);
    /* the other tensor ranks' nt_ddps: as many local devices, device i of
     * each computing shards[i] (its part of the group's forward) */
    for (int r = 1; r < nd && !rc; r++) {
        char which[40];
        snprintf(which, sizeof which, " for ds[%d]", r);
        if (ds[r]->nmem != n)
            rc = nt__err(site, NT_EINVAL, fn, "argument 'ds[%d]' has %d local devices, ds[0] "
                         "%d (n): a group's nt_ddps must have as many", r, ds[r]->nmem, n);
        for (int i = 0; i < n && !rc; i++)
            rc = shard_of_device(site, fn, ds[r], which, shards, i);
    }
    if (rc)
        return rc;
    if (n * nd > DDP_MAX_DEV)
        return nt__err(site, NT_EINVAL, fn, "arguments 'nd', 'n' are %d, %d; at most %d "
                       "devices in one pass (nd x n)", nd, n, DDP_MAX_DEV);
    /* entry i r: ds[r]'s shard shards[i]; pass_loss joins the n losses */
    nt_ddp *es[DDP_MAX_DEV];
    int sh[DDP_MAX_DEV];
    for (int i = 0; i < n; i++)
        for (int r = 0; r < nd; r++)
            es[i * nd + r] = ds[r], sh[i * nd + r] = shards[i];
    return backward_pass(site, fn, &(pass){.ds = es, .shards = sh, .ne = n * nd,
                                           .losses = losses});
}

NT_API int nt_ddp_backward_group_shards(nt_ddp *const *ds, int nd, const int *shards,
                                        nt_tensor *const *losses, int n)
{
    return nt_ddp_backward_group_shards_at(NT_RA_SITE, ds, nd, shards, losses, n);
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
            return errc();
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
            rc = errc();
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
            rc = !mean || !var ? errc()
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
            rc = errc();
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
                rc = errc();
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
    if (d->zero) {
        rc = zero_reduce(site, d, sum);
        free(sum);
        goto reduced;
    }
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
                rc = errc();
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
reduced:
    if (!rc)
        rc = bn_reduce(site, d);
    tree_clear(d);
    d->reduces++;
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
    if (d->zero) {
        rc = zero_step(site, d, opts);
        g_mutex_unlock(&d->lock);
        return rc;
    }
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

/* ---------------- ZeRO: sharded optimizer state, gradients, parameters ----------------
 *
 * Stage z >= 1 cuts parameter j (numel elements, flattened, padded with
 * zeros to R L) into R shards of L = ceil(numel / R) elements; global rank
 * r owns elements [r L, (r + 1) L).  The optimizers update the shards
 * (nt_ddp_zero_shards), never the replicas:
 *   stage 1: the gradients are all-reduced as plain DDP does; each replica
 *            keeps the whole mean, the shard's .grad is its slice;
 *   stage 2: the block sums are reduce-scattered: each rank gets its
 *            shard's sum only;
 *   stage 1, 2: after the step the shards are all-gathered into every
 *            replica (in place);
 *   stage 3: the replicas are gone between steps; nt_ddp_gather all-gathers
 *            them before the forward and the shard's last backward frees them.
 * Why the bits are those of DDP: a reduce-scatter reduces element e of
 * every rank's input in the same rank tree as an all-reduce (dist/tree.c),
 * the mean is the same multiply, and every optimizer is elementwise, so a
 * shard's update is the full update's restricted to its elements. */

/* Elements of parameter j's shard of global rank r that are not padding. */
static int64_t zero_valid(const nt_ddp *d, int j, int r)
{
    int64_t v = d->numel[j] - (int64_t)r * d->len[j];
    return v < 0 ? 0 : v > d->len[j] ? d->len[j] : v;
}

/* t (parameter j's shape, contiguous) as [R, L]: flat, zero-padded. */
static nt_tensor *zero_rows(const nt_site *site, const nt_ddp *d, int j, nt_tensor *t)
{
    nt_tensor *f = nt_reshape_at(site, t, 1, (int64_t[]){d->numel[j]});
    int64_t pad = d->len[j] * d->ranks - d->numel[j];
    if (pad && f) {
        nt_tensor *z = nt_zeros_at(site, (nt_dtype)t->dtype, 1, (int64_t[]){pad});
        f = z ? nt_cat_at(site, (nt_tensor *[]){f, z}, 2, 0) : NULL;
    }
    return f ? nt_reshape_at(site, f, 2, (int64_t[]){d->ranks, d->len[j]}) : NULL;
}

/* Parameter j from its [R, L] rows (a column block of a bucket, maybe not
 * contiguous): a view of a contiguous tensor, in the parameter's shape. */
static nt_tensor *zero_unrows(const nt_site *site, const nt_ddp *d, int j, nt_tensor *rows)
{
    nt_tensor *c = nt_contiguous_at(site, rows);
    c = c ? nt_reshape_at(site, c, 1, (int64_t[]){d->ranks * d->len[j]}) : NULL;
    c = c ? nt_slice_at(site, c, 0, 0, d->numel[j], 1) : NULL;
    return c ? nt_reshape_at(site, c, d->pnd[j], d->pshape[j]) : NULL;
}

/* A new [L] shard of rank r holding elements [r L, r L + valid) of `full`
 * (parameter j's shape), zeros after. */
static nt_tensor *zero_cut(const nt_site *site, const nt_ddp *d, int j, int r, nt_tensor *full)
{
    if (!full)
        return NULL;
    int64_t v = zero_valid(d, j, r), lo = (int64_t)r * d->len[j];
    nt_tensor *s = nt_zeros_at(site, (nt_dtype)full->dtype, 1, (int64_t[]){d->len[j]});
    if (s && v > 0) {
        nt_tensor *f = nt_reshape_at(site, full, 1, (int64_t[]){d->numel[j]});
        nt_tensor *dst = nt_slice_at(site, s, 0, 0, v, 1);
        if (!f || !dst || nt_copy_into(dst, nt_slice_at(site, f, 0, lo, lo + v, 1)))
            return NULL;
    }
    return s;
}

/* The parameters' shape tables (numel, len over `ranks` shards, pnd,
 * pshape, pdt) from member 0's replicas.  false: no host memory (the
 * caller frees what was made with zero_free). */
static bool zero_shape_tables(nt_ddp *d, int ranks)
{
    int n = d->n;
    d->numel = calloc((size_t)n, sizeof *d->numel);
    d->len = calloc((size_t)n, sizeof *d->len);
    d->pnd = calloc((size_t)n, sizeof *d->pnd);
    d->pshape = calloc((size_t)n, sizeof *d->pshape);
    d->pdt = calloc((size_t)n, sizeof *d->pdt);
    if (!d->numel || !d->len || !d->pnd || !d->pshape || !d->pdt)
        return false;
    for (int j = 0; j < n; j++) {
        nt_tensor *p = d->m[0].rep[j];
        d->numel[j] = nt_numel(p);
        d->len[j] = (d->numel[j] + ranks - 1) / ranks;
        d->pnd[j] = p->ndim, d->pdt[j] = (nt_dtype)p->dtype;
        memcpy(d->pshape[j], p->shape, sizeof(int64_t) * (size_t)p->ndim);
    }
    return true;
}

static void zero_free(nt_ddp *d)
{
    ov_free(d);
    if (d->shard && nt__hobj_current(d))
        for (int i = 0; i < d->nmem * d->n; i++)
            nt_release(d->shard[i]);
    free(d->shard), free(d->view), free(d->numel), free(d->len), free(d->pnd);
    free(d->pshape), free(d->pdt), free(d->gver);
    d->shard = NULL, d->view = NULL, d->numel = d->len = NULL, d->pnd = NULL;
    d->pshape = NULL, d->pdt = NULL, d->gver = NULL;
}

/* Member k's shard of parameter j from its replica: a view of the replica
 * when it has no padding (stages 1, 2), else a copy; a leaf requiring grad. */
static int zero_make_shard(const nt_site *site, nt_ddp *d, int k, int j, int stage)
{
    member *m = &d->m[k];
    nt_tensor *p = m->rep[j], *s;
    int64_t lo = (int64_t)m->rank * d->len[j];
    bool view = stage < 3 && zero_valid(d, j, m->rank) == d->len[j];
    if (view)
        s = nt_detach(nt_slice_at(site, nt_reshape_at(site, p, 1, (int64_t[]){d->numel[j]}), 0,
                                  lo, lo + d->len[j], 1));
    else
        s = zero_cut(site, d, j, m->rank, p);
    if (!s || nt_set_requires_grad(s, true))
        return errc();
    d->shard[k * d->n + j] = nt_keep(s);
    d->view[k * d->n + j] = view;
    return 0;
}

NT_API int nt_ddp_set_zero(nt_ddp *d, int stage)
{
    const char *fn = "nt_ddp_set_zero";
    if (!ddp_ok(NULL, d, fn))
        return nt_last_error();
    if (stage < 0 || stage > 3)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'stage' is %d; expected 0, 1, 2 or 3",
                       stage);
    g_mutex_lock(&d->lock);
    int rc = 0, n = d->n;
    for (int s = 0; s < d->shards && !rc; s++)
        if (d->done[s] || d->reduces || d->zero)
            rc = nt__err(NULL, NT_ESTATE, fn, "the nt_ddp has %s; set the ZeRO stage once, "
                         "right after nt_ddp_create", d->zero ? "a ZeRO stage already"
                                                              : "begun training");
    if (rc || !stage)
        goto out;
    zero_free(d); /* shapes an nt_ddp_load at stage 0 noted */
    d->shard = calloc((size_t)n * d->nmem, sizeof *d->shard);
    d->view = calloc((size_t)n * d->nmem, 1);
    d->gver = calloc((size_t)n, sizeof *d->gver);
    if (!zero_shape_tables(d, d->ranks) || !d->shard || !d->view || !d->gver) {
        zero_free(d);
        rc = nt__err_hostmem(NULL, fn, "the shards' tables");
        goto out;
    }
    nt_no_grad_begin();
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        nt_scope *sc = nt_scope_begin();
        for (int j = 0; j < n && !rc; j++)
            rc = zero_make_shard(NULL, d, k, j, stage);
        nt_scope_end(sc);
        leave(old);
    }
    nt_no_grad_end();
    if (rc) {
        zero_free(d);
        goto out;
    }
    d->zero = stage;
    if (stage == 3) /* the shards are the parameters now */
        for (int k = 0; k < d->nmem; k++)
            for (int j = 0; j < n; j++) {
                nt_release(d->m[k].rep[j]);
                d->m[k].rep[j] = NULL;
            }
out:
    g_mutex_unlock(&d->lock);
    return rc;
}

NT_API int nt_ddp_zero_stage(const nt_ddp *d)
{
    if (!ddp_ok(NULL, d, "nt_ddp_zero_stage"))
        return nt_last_error();
    nt_ddp *w = (nt_ddp *)d; /* the lock only */
    g_mutex_lock(&w->lock);
    int z = d->zero;
    g_mutex_unlock(&w->lock);
    return z;
}

NT_API nt_tensor **nt_ddp_zero_shards(nt_ddp *d, int dev)
{
    const char *fn = "nt_ddp_zero_shards";
    if (!ddp_ok(NULL, d, fn))
        return NULL;
    member *m = member_of_dev(d, dev);
    if (!m) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'dev' is %d, which is not one of the nt_ddp's "
                "devices", dev);
        return NULL;
    }
    g_mutex_lock(&d->lock);
    nt_tensor **r = d->zero ? d->shard + (m - d->m) * d->n : NULL;
    g_mutex_unlock(&d->lock);
    if (!r)
        nt__err(NULL, NT_ESTATE, fn, "the nt_ddp has no ZeRO stage (nt_ddp_set_zero)");
    return r;
}

/* Parameters [lo, hi] in one collective: the cost model's rule of
 * nt_ddp_reduce (a bucket grows while the call stays under twice the cost
 * of one of no bytes, never past 25 MiB, nor past 64 parameters), going
 * down from hi. */
static int zero_bucket_lo(const nt_ddp *d, nt_collective kind, int hi)
{
    double fixed = 0, bytes = 4.0 * (double)(d->len[hi] * d->ranks);
    nt_collective_cost(kind, d->ranks, 0, &fixed, NULL);
    int lo = hi;
    while (lo > 0 && d->comm) {
        double more = bytes + 4.0 * (double)(d->len[lo - 1] * d->ranks), t = 0;
        nt_collective_cost(kind, d->ranks, more, &t, NULL);
        if (t >= 2 * fixed || more > DDP_BUCKET_BYTES)
            break;
        bytes = more;
        lo--;
    }
    return hi - lo >= 64 ? hi - 63 : lo;
}

/* Sets t's .grad to g (a new reference is kept). */
static void set_grad(nt_tensor *t, nt_tensor *g)
{
    nt_keep(g);
    if (t->ag->grad)
        nt_release(t->ag->grad);
    t->ag->grad = g;
}

/* Member k's result of the bucket [lo, hi] (out: [R, sum L] for stage 1,
 * [1, sum L] after a reduce-scatter) times 1/S into the shards' .grads
 * (and the replicas' for stage 1). */
static int zero_take_mean(const nt_site *site, nt_ddp *d, int k, nt_tensor *out, int lo, int hi)
{
    member *m = &d->m[k];
    nt_tensor *mean = nt_mul_scalar_at(site, out, 1.0 / d->shards);
    int64_t off = 0;
    for (int j = lo; j <= hi && mean; off += d->len[j], j++) {
        nt_tensor *col = nt_slice_at(site, mean, 1, off, off + d->len[j], 1), *g;
        nt_tensor *sh = d->shard[k * d->n + j];
        if (d->zero == 1) { /* the replica's .grad as DDP's; the shard's a slice */
            g = zero_unrows(site, d, j, col);
            if (g && d->pdt[j] != NT_F32)
                g = nt_cast_at(site, g, d->pdt[j]);
            if (!g)
                return errc();
            set_grad(m->rep[j], g);
            int64_t r0 = (int64_t)m->rank * d->len[j];
            g = d->view[k * d->n + j]
                    ? nt_slice_at(site, nt_reshape_at(site, g, 1, (int64_t[]){d->numel[j]}), 0,
                                  r0, r0 + d->len[j], 1)
                    : zero_cut(site, d, j, m->rank, g);
        } else {
            g = nt_reshape_at(site, col, 1, (int64_t[]){d->len[j]});
            if (g && d->pdt[j] != NT_F32)
                g = nt_cast_at(site, g, d->pdt[j]);
            else if (g && lo != hi) { /* its own storage, not the bucket's */
                nt_tensor *c = nt_zeros_at(site, NT_F32, 1, (int64_t[]){d->len[j]});
                g = c && !nt_copy_into(c, g) ? c : NULL;
            }
        }
        if (!g)
            return errc();
        set_grad(sh, g);
    }
    return mean ? 0 : errc();
}

/* A member's block sums sum[lo .. hi] of a bucket as its collective's
 * input, [R, sum L] (on the device the caller entered).  NULL with the
 * error set. */
static nt_tensor *zero_pack(const nt_site *site, const nt_ddp *d, nt_tensor *const *sum, int lo,
                            int hi)
{
    nt_tensor *parts[64];
    for (int j = lo; j <= hi; j++)
        parts[j - lo] = zero_rows(site, d, j, sum[j]);
    return lo == hi ? parts[0] : nt_cat_at(site, parts, hi - lo + 1, 1);
}

/* One bucket: every member's block sums of parameters [lo, hi] as [R, sum
 * L], all-reduced (stage 1) or reduce-scattered (2, 3) in the rank tree. */
static int zero_bucket(const nt_site *site, nt_ddp *d, nt_tensor **sum, int lo, int hi)
{
    int n = d->n, rc = 0;
    nt_tensor *in[DDP_MAX_DEV] = {0}, *out[DDP_MAX_DEV] = {0};
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, "nt_ddp_reduce", "a scope");
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        in[k] = zero_pack(site, d, sum + k * n, lo, hi);
        leave(old);
        rc = in[k] ? 0 : errc();
    }
    if (!rc && d->comm)
        rc = d->zero == 1 ? nt_all_reduce_at(site, d->comm, in, out, NT_REDUCE_SUM)
                          : nt_reduce_scatter_at(site, d->comm, in, out, NT_REDUCE_SUM);
    else if (!rc)
        out[0] = in[0];
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        rc = zero_take_mean(site, d, k, out[k], lo, hi);
        leave(old);
    }
    nt_scope_end(sc);
    return rc;
}

static int ov_take_mean(const nt_site *site, nt_ddp *d, const ov_bucket *b);

static int zero_reduce(const nt_site *site, nt_ddp *d, nt_tensor **sum)
{
    nt_collective kind = d->zero == 1 ? NT_COLL_ALL_REDUCE : NT_COLL_REDUCE_SCATTER;
    int rc = 0;
    nt_no_grad_begin();
    for (int hi = d->n - 1, b = 0; hi >= 0 && !rc; b++) {
        int lo = zero_bucket_lo(d, kind, hi);
        if (d->overlap && d->ov && d->ov[b].issued) /* reduce-scattered in the backward */
            rc = ov_take_mean(site, d, &d->ov[b]);
        else
            rc = zero_bucket(site, d, sum, lo, hi);
        hi = lo - 1;
    }
    nt_no_grad_end();
    return rc;
}

/* ---------------- ZeRO: the reduce-scatter overlapped with the backward ----------------
 *
 * nt_ddp_set_overlap (stages 2, 3): the backward of each member's last
 * shard of the step runs with a gradient hook on each of the member's
 * replicas.  The hook of parameter j puts the gradient in the member's
 * tree at once (the same adds as after the backward, in the same order),
 * so its block sum is complete there and then; when every block sum of a
 * bucket is (nt_ddp_reduce's buckets, the last parameters first), the
 * member packs the bucket's [R, sum L] input and drops its block sums; when
 * every local member has packed it, the reduce-scatter is issued, while the
 * last member's backward still has the earlier layers to do.  nt_ddp_reduce
 * then only takes the means out of the results.  The collective's inputs
 * are the same tensors as without overlap, so the bits are the same; the
 * means are not taken in the hook, since a core runs its kernels in order
 * and a kernel reading the collective's result would hold the rest of that
 * core's backward back. */

static void ov_clear(nt_ddp *d)
{
    for (int b = 0; b < d->nov && d->ov; b++) {
        ov_bucket *B = &d->ov[b];
        for (int k = 0; k < d->nmem; k++) {
            nt_release(B->in[k]), nt_release(B->out[k]);
            B->in[k] = B->out[k] = NULL;
        }
        B->packed = 0, B->issued = false;
    }
    if (d->ov_ready)
        memset(d->ov_ready, 0, (size_t)d->nmem * d->n);
    d->ov_err = 0;
}

static void ov_free(nt_ddp *d)
{
    if (d->ov && nt__hobj_current(d))
        ov_clear(d);
    free(d->ov), free(d->ov_of), free(d->ov_ready), free(d->ovh);
    d->ov = NULL, d->ov_of = NULL, d->ov_ready = NULL, d->ovh = NULL;
    d->nov = 0, d->overlap = false;
}

/* The buckets of zero_reduce (stages 2, 3), made once (at most one a
 * parameter).  0 or NT_ENOMEM. */
static int ov_layout(nt_ddp *d)
{
    int nb = 0, n = d->n;
    d->ov = calloc((size_t)n, sizeof *d->ov);
    d->ov_of = calloc((size_t)n, sizeof *d->ov_of);
    d->ov_ready = calloc((size_t)n * d->nmem, 1);
    d->ovh = calloc((size_t)n * d->nmem, sizeof *d->ovh);
    if (!d->ov || !d->ov_of || !d->ov_ready || !d->ovh) {
        ov_free(d);
        return NT_ENOMEM;
    }
    for (int hi = n - 1; hi >= 0; nb++) {
        int lo = zero_bucket_lo(d, NT_COLL_REDUCE_SCATTER, hi);
        d->ov[nb].lo = lo, d->ov[nb].hi = hi;
        for (int j = lo; j <= hi; j++)
            d->ov_of[j] = nb;
        hi = lo - 1;
    }
    d->nov = nb;
    return 0;
}

/* Is the shard about to run (not done) the last of member m's block this
 * step? */
static bool ov_last_shard(const nt_ddp *d, const member *m)
{
    if (!d->overlap || !d->ov)
        return false;
    int s0 = (d->first_rank + (int)(m - d->m)) * d->block, left = 0;
    for (int s = s0; s < s0 + d->block; s++)
        left += !d->done[s];
    return left == 1;
}

/* Bucket b of member k once all its block sums are made: the packed input;
 * once every member's is: the reduce-scatter. */
static int ov_pack(const nt_site *site, nt_ddp *d, int k, int b)
{
    ov_bucket *B = &d->ov[b];
    int n = d->n, rc = 0;
    member *m = &d->m[k];
    for (int j = B->lo; j <= B->hi; j++)
        if (!d->ov_ready[k * n + j])
            return 0;
    nt_tensor *in = zero_pack(site, d, m->tree[d->levels], B->lo, B->hi);
    if (!in)
        return errc();
    B->in[k] = nt_retain(in);
    for (int j = B->lo; j <= B->hi; j++) { /* the bucket holds them now */
        nt_release(m->tree[d->levels][j]);
        m->tree[d->levels][j] = NULL;
    }
    if (++B->packed < d->nmem)
        return 0;
    nt_tensor *out[DDP_MAX_DEV] = {0};
    if (d->comm)
        rc = nt_reduce_scatter_at(site, d->comm, B->in, out, NT_REDUCE_SUM);
    else
        out[0] = B->in[0];
    for (int i = 0; i < d->nmem && !rc; i++)
        B->out[i] = nt_retain(out[i]);
    for (int i = 0; i < d->nmem && !rc; i++) {
        nt_release(B->in[i]);
        B->in[i] = NULL;
    }
    B->issued = !rc;
    return rc;
}

/* Member k's gradient g of parameter j (one reference, consumed; NULL: the
 * loss did not reach it) from its block's shard slot idx: f32 into the
 * tree, up to the block sum, then the bucket.  The caller has a scope. */
static int ov_take(const nt_site *site, nt_ddp *d, int k, int j, int idx, nt_tensor *g)
{
    member *m = &d->m[k];
    int n = d->n, rc = 0;
    nt_stream *old = enter(m->dev);
    nt_tensor *x = grad_f32(site, g, d->pnd[j], d->pshape[j]);
    if (!x)
        rc = errc();
    else
        m->tree[0][idx * n + j] = x;
    if (!rc)
        rc = tree_sum(site, d, m, idx, j, j + 1);
    if (!rc && !m->tree[d->levels][j])
        rc = nt__err(site, NT_ESTATE, "nt_ddp_backward", "parameter %d of device %d: the "
                     "block sum is not complete after the member's last shard", j, m->dev);
    if (!rc) {
        d->ov_ready[k * n + j] = 1;
        rc = ov_pack(site, d, k, d->ov_of[j]);
    }
    if (rc == NT_ENOMEM) {
        const ov_bucket *B = &d->ov[d->ov_of[j]];
        char why[512];
        snprintf(why, sizeof why, "%s", nt_last_error_message());
        rc = nt__err(site, NT_ENOMEM, "nt_ddp_backward", "out of device memory on device %d "
                     "taking the gradient of parameter %d into the reduce-scatter bucket of "
                     "parameters [%d, %d] (nt_ddp_set_overlap); the step's gradients are "
                     "dropped, the shards unchanged: %s", m->dev, j, B->lo, B->hi, why);
    }
    leave(old);
    return rc;
}

static nt_tensor *ov_hook_fn(nt_tensor *g, void *ctx)
{
    ov_hook *h = ctx;
    nt_ddp *d = h->d;
    if (d->ov_err)
        return NULL;
    nt_scope *sc = nt_scope_begin();
    int rc = sc ? ov_take(NULL, d, h->k, h->j, h->idx, nt_retain(g))
                : nt__err_hostmem(NULL, "nt_ddp_backward", "a scope");
    if (sc)
        nt_scope_end(sc);
    d->ov_err = rc;
    return NULL;
}

/* Registers (on) or removes (off) the hooks on member m's replicas for the
 * backward of `shard`. */
static int ov_hooks(const nt_site *site, nt_ddp *d, member *m, int shard, bool on)
{
    int k = (int)(m - d->m), n = d->n, rc = 0;
    for (int j = 0; j < n; j++) {
        ov_hook *h = &d->ovh[k * n + j];
        if (on && !rc) {
            h->d = d, h->k = k, h->j = j, h->idx = shard % d->block, h->h = 0;
            if (nt_register_hook_handle(m->rep[j], ov_hook_fn, h, &h->h))
                rc = errc();
        } else if (h->h) {
            nt_remove_hook(h->h);
            h->h = 0;
        }
    }
    if (rc)
        ov_hooks(site, d, m, shard, false);
    return rc;
}

/* nt_ddp_reduce of a bucket reduce-scattered in the backward: the means. */
static int ov_take_mean(const nt_site *site, nt_ddp *d, const ov_bucket *b)
{
    int rc = 0;
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, "nt_ddp_reduce", "a scope");
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        rc = zero_take_mean(site, d, k, b->out[k], b->lo, b->hi);
        leave(old);
    }
    nt_scope_end(sc);
    return rc;
}

NT_API int nt_ddp_set_overlap(nt_ddp *d, bool on)
{
    const char *fn = "nt_ddp_set_overlap";
    if (!ddp_ok(NULL, d, fn))
        return nt_last_error();
    g_mutex_lock(&d->lock);
    int rc = 0;
    if (d->zero < 2)
        rc = nt__err(NULL, NT_ESTATE, fn, "the nt_ddp is at ZeRO stage %d; the reduce-scatter "
                     "overlapped with the backward is for stages 2 and 3 (nt_ddp_set_zero "
                     "first)", d->zero);
    for (int s = 0; s < d->shards && !rc; s++)
        if (d->done[s])
            rc = nt__err(NULL, NT_ESTATE, fn, "shard %d already has its gradients for this "
                         "step; change the overlap between steps (after nt_ddp_reduce)", s);
    if (!rc && on && !d->ov && ov_layout(d))
        rc = nt__err_hostmem(NULL, fn, "the buckets' tables");
    if (!rc)
        d->overlap = on;
    g_mutex_unlock(&d->lock);
    return rc;
}

/* Issues the all-gather of the shards of parameters [lo, hi] (each
 * member's shards side by side, then the collective) into out[]. */
static int zero_gather_issue(const nt_site *site, nt_ddp *d, int lo, int hi, nt_tensor **out)
{
    int n = d->n, rc = 0;
    nt_tensor *in[DDP_MAX_DEV] = {0}, *parts[64];
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        for (int j = lo; j <= hi; j++)
            parts[j - lo] = nt_reshape_at(site, d->shard[k * n + j], 2,
                                          (int64_t[]){1, d->len[j]});
        in[k] = lo == hi ? parts[0] : nt_cat_at(site, parts, hi - lo + 1, 1);
        leave(old);
        rc = in[k] ? 0 : errc();
    }
    if (!rc && d->comm)
        rc = nt_all_gather_at(site, d->comm, in, out);
    else if (!rc)
        out[0] = in[0];
    return rc;
}

/* Puts the gathered out[] of parameters [lo, hi] into every member's
 * replica: in place (stages 1, 2), or as new leaves (stage 3). */
static int zero_gather_finish(const nt_site *site, nt_ddp *d, int lo, int hi, nt_tensor **out)
{
    int rc = 0;
    nt_tensor *made[DDP_MAX_DEV * 64]; /* stage 3's new leaves */
    for (int k = 0; k < d->nmem && !rc; k++) {
        member *m = &d->m[k];
        nt_stream *old = enter(m->dev);
        int64_t off = 0;
        for (int j = lo; j <= hi && !rc; off += d->len[j], j++) {
            nt_tensor *full = zero_unrows(site, d, j, nt_slice_at(site, out[k], 1, off,
                                                                  off + d->len[j], 1));
            if (!full) {
                rc = errc();
            } else if (d->zero < 3) {
                rc = nt_copy_into(m->rep[j], full);
            } else { /* kept below once every member's are made (else none is) */
                /* full is a fresh contiguous tensor (zero_unrows' copy, its
                 * padding cut off): the leaf itself, not copied again */
                nt_tensor *p = nt_detach_at(site, full);
                rc = !p || nt_set_requires_grad(p, true) ? errc() : 0;
                made[k * (hi - lo + 1) + j - lo] = p;
            }
        }
        leave(old);
    }
    for (int k = 0; k < d->nmem && !rc && d->zero == 3; k++)
        for (int j = lo; j <= hi; j++)
            d->m[k].rep[j] = nt_keep(made[k * (hi - lo + 1) + j - lo]);
    for (int j = lo; j <= hi && !rc && d->zero == 3; j++)
        d->gver[j] = AO_load(&d->shard[j]->st->version);
    return rc;
}

/* All-gathers the shards of parameters [lo, hi] into every member's
 * replica (stages 1, 2: nt_ddp_step's gather, bucket by bucket). */
static int zero_gather_bucket(const nt_site *site, nt_ddp *d, int lo, int hi)
{
    nt_tensor *out[DDP_MAX_DEV] = {0};
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, "nt_ddp_gather", "a scope");
    int rc = zero_gather_issue(site, d, lo, hi, out);
    if (!rc)
        rc = zero_gather_finish(site, d, lo, hi, out);
    nt_scope_end(sc);
    return rc;
}

/* ---------------- stage 3: a layer's memory released and refilled ---------------- */

/* Whether member k's gathered parameter j can give its memory back: a big
 * storage of its own (nt__mem_release keeps small ones), not released, and
 * not its shard's: with one rank, a bucket of one parameter gathers into a
 * view of the shard itself (no copy), whose memory must stay. */
static bool layer_releasable(const nt_ddp *d, int k, int j)
{
    const nt_tensor *t = d->m[k].rep[j];
    return t && t->st->deferred && !t->st->borrowed && !t->st->cap &&
           t->st != d->shard[k * d->n + j]->st && !nt__storage_released(t->st);
}

static bool layer_released(const nt_ddp *d, int k, int j)
{
    const nt_tensor *t = d->m[k].rep[j];
    return t && nt__storage_released(t->st);
}

/* Every member's gathered parameters [lo, hi) give their memory back, each
 * after the ops queued so far that read it (nt__mem_release). */
static int layer_release(const nt_site *site, const char *fn, nt_ddp *d, int lo, int hi)
{
    int rc = 0;
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        for (int j = lo; j < hi && !rc; j++)
            if (layer_releasable(d, k, j))
                rc = nt__mem_release(site, fn, d->m[k].rep[j]);
        leave(old);
    }
    return rc;
}

/* Drops the prefetched all-gather. */
static void layer_drop_pre(nt_ddp *d)
{
    for (int k = 0; k < d->nmem; k++) {
        nt_release(d->pre[k]);
        d->pre[k] = NULL;
    }
    d->pre_lo = d->pre_hi = 0;
}

/* The round's marks are spent: a graph still holding one refuses it. */
static void layer_reset(nt_ddp *d)
{
    layer_drop_pre(d);
    d->nlay = 0;
    d->lay_gen++;
}

/* Queues the all-gather of parameters [lo, hi) (at most DDP_LAYER_PARAMS)
 * into d->pre: the prefetch of the layer the backward refills next. */
static int layer_prefetch(const nt_site *site, nt_ddp *d, int lo, int hi)
{
    layer_drop_pre(d);
    nt_tensor *out[DDP_MAX_DEV] = {0};
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, "nt_ddp_layer_done", "a scope");
    nt_no_grad_begin();
    int rc = zero_gather_issue(site, d, lo, hi - 1, out);
    nt_no_grad_end();
    for (int k = 0; k < d->nmem && !rc; k++)
        d->pre[k] = nt_retain(out[k]);
    if (!rc)
        d->pre_lo = lo, d->pre_hi = hi;
    nt_scope_end(sc);
    return rc;
}

/* Fills every member's released parameters of [lo, hi) (at most
 * DDP_LAYER_PARAMS) again with their gathered bits, in the same storages
 * (so the graph's saved views read them): from the prefetched all-gather
 * when it is of [lo, hi), else from one queued now. */
static int layer_refill(const nt_site *site, const char *fn, nt_ddp *d, int lo, int hi)
{
    bool any = false;
    for (int k = 0; k < d->nmem && !any; k++)
        for (int j = lo; j < hi && !any; j++)
            any = layer_released(d, k, j);
    if (!any)
        return 0;
    nt_tensor *out[DDP_MAX_DEV] = {0};
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(site, fn, "a scope");
    nt_no_grad_begin();
    int rc = 0;
    if (d->pre_hi == hi && d->pre_lo == lo) {
        for (int k = 0; k < d->nmem; k++)
            out[k] = nt__scope_adopt(d->pre[k], fn), d->pre[k] = NULL;
        d->pre_lo = d->pre_hi = 0;
    } else {
        rc = zero_gather_issue(site, d, lo, hi - 1, out);
    }
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        int64_t off = 0;
        for (int j = lo; j < hi && !rc; off += d->len[j], j++) {
            if (!layer_released(d, k, j))
                continue;
            nt_tensor *full = zero_unrows(site, d, j, nt_slice_at(site, out[k], 1, off,
                                                                  off + d->len[j], 1));
            rc = full ? nt__mem_refill(site, fn, d->m[k].rep[j], full) : errc();
        }
        leave(old);
    }
    nt_no_grad_end();
    nt_scope_end(sc);
    return rc;
}

/* Gathers parameters [lo, hi) in buckets (stage 3: those not gathered).
 * Stage 3 issues every bucket's all-gather, first parameters first, before
 * any bucket's copies into the leaves: a core runs its kernels in order,
 * so a bucket's copies (which wait for its gather) placed before the next
 * bucket's packing held that gather back; now the gathers run back to
 * back and each bucket's copies overlap the next one's gather. */
static int zero_gather(const nt_site *site, nt_ddp *d, int lo, int hi)
{
    int rc = 0, nb = 0, blo[64], bhi[64];
    /* stage 3: which parameters this call gathers (undone on an error) */
    uint8_t *had = d->zero == 3 ? calloc((size_t)d->n, 1) : NULL;
    if (d->zero == 3 && !had)
        return nt__err_hostmem(site, "nt_ddp_gather", "a table");
    /* a replica gathered before the shards were written since (a replay
     * between them) goes, and is gathered again */
    for (int j = lo; j < hi && had; j++)
        if (d->m[0].rep[j] && AO_load(&d->shard[j]->st->version) != d->gver[j])
            for (int k = 0; k < d->nmem; k++) {
                nt_release(d->m[k].rep[j]);
                d->m[k].rep[j] = NULL;
            }
    /* released by nt_ddp_layer_done (an earlier round's forward): filled
     * again, run by run of released parameters */
    for (int j = lo; j < hi && had && !rc;) {
        int e = j;
        while (e < hi && e - j < DDP_LAYER_PARAMS && layer_released(d, 0, e))
            e++;
        rc = e > j ? layer_refill(site, "nt_ddp_gather", d, j, e) : 0;
        j = e > j ? e : j + 1;
    }
    if (rc) {
        free(had);
        return rc;
    }
    for (int j = 0; j < d->n && had; j++)
        had[j] = d->m[0].rep[j] != NULL;
    nt_no_grad_begin();
    for (int j = hi - 1; j >= lo && !rc;) {
        if (d->zero == 3 && d->m[0].rep[j]) {
            j--;
            continue;
        }
        int b = zero_bucket_lo(d, NT_COLL_ALL_GATHER, j);
        b = b < lo ? lo : b;
        for (int i = b; i < j && d->zero == 3; i++)
            if (d->m[0].rep[i])
                b = i + 1;
        if (d->zero < 3 || nb == 64)
            rc = zero_gather_bucket(site, d, b, j);
        else
            blo[nb] = b, bhi[nb++] = j;
        j = b - 1;
    }
    nt_scope *sc = nb ? nt_scope_begin() : NULL;
    nt_tensor *out[64][DDP_MAX_DEV];
    for (int i = nb - 1; i >= 0 && !rc; i--)
        rc = zero_gather_issue(site, d, blo[i], bhi[i], out[i]);
    for (int i = nb - 1; i >= 0 && !rc; i--)
        rc = zero_gather_finish(site, d, blo[i], bhi[i], out[i]);
    if (sc)
        nt_scope_end(sc);
    nt_no_grad_end();
    if (rc && had) { /* nothing half-gathered: this call's leaves go again */
        for (int k = 0; k < d->nmem; k++)
            for (int j = lo; j < hi; j++)
                if (!had[j] && d->m[k].rep[j]) {
                    nt_release(d->m[k].rep[j]);
                    d->m[k].rep[j] = NULL;
                }
        if (rc == NT_ENOMEM) {
            int64_t el = 0;
            for (int j = lo; j < hi; j++)
                el += had[j] ? 0 : d->len[j] * d->ranks * (int64_t)nt_dtype_size(d->pdt[j]);
            char why[512];
            snprintf(why, sizeof why, "%s", nt_last_error_message());
            rc = nt__err(site, NT_ENOMEM, "nt_ddp_gather", "out of device memory gathering "
                         "parameters [%d, %d) (%lld bytes on each of %d devices, and as much "
                         "again for the collective's buffers); nothing was gathered: %s", lo,
                         hi, (long long)el, d->nmem, why);
        }
    }
    free(had);
    return rc;
}

NT_API int nt_ddp_gather(nt_ddp *d, int lo, int hi)
{
    const char *fn = "nt_ddp_gather";
    if (!ddp_ok(NULL, d, fn))
        return nt_last_error();
    if (lo < 0 || hi > d->n || lo >= hi)
        return nt__err(NULL, NT_EINVAL, fn, "arguments 'lo', 'hi' are %d, %d; expected 0 <= lo "
                       "< hi <= %d (the parameters)", lo, hi, d->n);
    g_mutex_lock(&d->lock);
    int rc = d->zero == 3 ? zero_gather(NULL, d, lo, hi)
                          : nt__err(NULL, NT_ESTATE, fn, "the nt_ddp is at ZeRO stage %d; only "
                                    "stage 3 gathers its parameters (the others keep them "
                                    "whole)", d->zero);
    g_mutex_unlock(&d->lock);
    return rc;
}

/* One mark of nt_ddp_layer_done: the layer's index in the round's list. */
typedef struct layer_mark {
    nt_ddp *d;
    int idx;
    uint64_t gen;
} layer_mark;

/* The mark's backward: each member's gradient passes unchanged; the layer
 * after this one (its backward done) gives its memory back, this one is
 * filled again, the one before is prefetched.  Runs inside
 * nt_ddp_backward_shards' pass, on its thread, which holds d's lock. */
static int layer_bwd(void *ctxp, nt_tensor *const *gout, nt_tensor **gin)
{
    layer_mark *x = ctxp;
    nt_ddp *d = x->d;
    const char *fn = "nt_ddp_layer_done";
    if (nt__hobj_check(d, DDP_MAGIC, NULL, fn, "d", "nt_ddp"))
        return nt_last_error();
    if (g_atomic_pointer_get(&d->pass_thread) != g_thread_self() || x->gen != d->lay_gen ||
        x->idx >= d->nlay)
        return nt__err(NULL, NT_ESTATE, fn, "a layer it marked is differentiated outside "
                       "the backward of its round: run that backward with "
                       "nt_ddp_backward_shards or nt_ddp_backward_group_shards (once)");
    for (int k = 0; k < d->nmem; k++)
        gin[k] = gout[k];
    int i = x->idx, rc = 0;
    if (i + 1 < d->nlay)
        rc = layer_release(NULL, fn, d, d->lay_lo[i + 1], d->lay_hi[i + 1]);
    if (!rc)
        rc = layer_refill(NULL, fn, d, d->lay_lo[i], d->lay_hi[i]);
    if (!rc && i > 0)
        rc = layer_prefetch(NULL, d, d->lay_lo[i - 1], d->lay_hi[i - 1]);
    return rc;
}

/* The checks of nt_ddp_layer_done that need d's lock: stage 3, room for
 * the mark, the layer gathered (and not released) on every member. */
static int layer_done_check(const nt_site *site, const char *fn, nt_ddp *d, int lo, int hi)
{
    if (d->zero != 3)
        return nt__err(site, NT_ESTATE, fn, "the nt_ddp is at ZeRO stage %d; only stage 3 "
                       "releases its gathered parameters", d->zero);
    if (d->nlay == DDP_MAX_LAYERS)
        return nt__err(site, NT_ESTATE, fn, "%d layers are marked in this round already; at "
                       "most %d", d->nlay, DDP_MAX_LAYERS);
    for (int k = 0; k < d->nmem; k++)
        for (int j = lo; j < hi; j++)
            if (!d->m[k].rep[j] || layer_released(d, k, j))
                return nt__err(site, NT_ESTATE, fn, "parameter %d of device %d is not "
                               "gathered%s: call nt_ddp_gather(d, %d, %d) before the layer's "
                               "forward", j, d->m[k].dev,
                               d->m[k].rep[j] ? " (its memory was released)" : "", lo, hi);
    return 0;
}

NT_API int nt_ddp_layer_done(nt_ddp *d, int lo, int hi, nt_tensor *const *in, nt_tensor **out)
{
    const char *fn = "nt_ddp_layer_done";
    const nt_site *site = NULL;
    if (!ddp_ok(site, d, fn))
        return nt_last_error();
    if (!in || !out)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL; expected one tensor per "
                       "local device of d (%d)", in ? "out" : "in", d->nmem);
    nt_tensor *xin[DDP_MAX_DEV]; /* out may be in */
    memcpy(xin, in, sizeof *xin * (size_t)d->nmem);
    in = xin;
    for (int k = 0; k < d->nmem; k++)
        out[k] = NULL;
    if (lo < 0 || hi > d->n || lo >= hi || hi - lo > DDP_LAYER_PARAMS)
        return nt__err(site, NT_EINVAL, fn, "arguments 'lo', 'hi' are %d, %d; expected 0 <= lo "
                       "< hi <= %d (the parameters), at most %d in a layer", lo, hi, d->n,
                       DDP_LAYER_PARAMS);
    nt_stream *cur = nt_stream_current();
    if (nt__capturing() || (cur && AO_load(&cur->capture)))
        return nt__err(site, NT_ESTATE, fn, "called while capturing a program "
                       "(nt_graph_capture_begin): a replay would not release the memory");
    for (int k = 0; k < d->nmem; k++) {
        char arg[32];
        snprintf(arg, sizeof arg, "in[%d]", k);
        if (!nt__check_arg(site, fn, arg, in[k]))
            return errc();
        if (in[k]->dev != d->m[k].dev)
            return nt__err(site, NT_EINVAL, fn, "argument '%s' is on device %d; expected local "
                           "device %d's (nt_ddp_create's devices[%d])", arg, (int)in[k]->dev,
                           d->m[k].dev, k);
        if (!nt__dtype_is_float((nt_dtype)in[k]->dtype))
            return nt__err(site, NT_EDTYPE, fn, "argument '%s' is %s; expected a floating "
                           "dtype", arg, nt_dtype_name((nt_dtype)in[k]->dtype));
    }
    g_mutex_lock(&d->lock);
    int rc = layer_done_check(site, fn, d, lo, hi);
    layer_mark *x = rc ? NULL : calloc(1, sizeof *x);
    if (!rc && !x)
        rc = nt__err_hostmem(site, fn, "the layer's mark");
    if (!rc) {
        *x = (layer_mark){.d = d, .idx = d->nlay, .gen = d->lay_gen};
        nt_scope *sc = nt_scope_begin();
        nt_no_grad_begin();
        for (int k = 0; k < d->nmem && !rc; k++) {
            nt_stream *old = enter(d->m[k].dev);
            out[k] = nt_reshape_at(site, in[k], in[k]->ndim, in[k]->shape);
            leave(old);
            rc = out[k] ? 0 : errc();
        }
        nt_no_grad_end();
        if (!rc)
            rc = nt__grp_record(site, fn, d->nmem, 1, in, out, layer_bwd, free, x);
        else
            free(x);
        rc = nt__group_end(sc, fn, rc, out, d->nmem);
    }
    if (!rc) {
        d->lay_lo[d->nlay] = lo;
        d->lay_hi[d->nlay++] = hi;
        rc = layer_release(site, fn, d, lo, hi);
    }
    g_mutex_unlock(&d->lock);
    return rc;
}

static int zero_backward_check(const nt_site *site, const char *fn, nt_ddp *d,
                               const member *m)
{
    if (d->zero != 3)
        return 0;
    for (int j = 0; j < d->n; j++)
        if (!m->rep[j])
            return nt__err(site, NT_ESTATE, fn, "parameter %d of device %d is "
                           "not gathered (ZeRO stage 3): call nt_ddp_gather before the "
                           "forward", j, m->dev);
    return 0;
}

/* Stage 3: once every shard of member k had its backward, its gathered
 * parameters go (the graph that used them is gone). */
static void zero_backward_done(nt_ddp *d, int k)
{
    if (d->zero != 3)
        return;
    int s0 = (d->first_rank + k) * d->block;
    for (int s = s0; s < s0 + d->block; s++)
        if (!d->done[s])
            return;
    for (int j = 0; j < d->n; j++) {
        nt_release(d->m[k].rep[j]);
        d->m[k].rep[j] = NULL;
    }
}

static int zero_step(const nt_site *site, nt_ddp *d, nt_optim *const *opts)
{
    const char *fn = "nt_ddp_step";
    int rc = 0, n = d->n;
    for (int k = 0; k < d->nmem && !rc; k++) {
        int np = nt__optim_nparams(opts[k]);
        bool same = np == n;
        for (int j = 0; same && j < np; j++)
            same = nt__optim_param(opts[k], j) == d->shard[k * n + j];
        if (np < 0)
            rc = nt__err(site, NT_EINVAL, fn, "argument 'opts[%d]' is not a live optimizer", k);
        else if (!same)
            rc = nt__err(site, NT_EINVAL, fn, "argument 'opts[%d]' does not optimize "
                         "nt_ddp_zero_shards(d, %d) (ZeRO stage %d: the %d shards, in order)",
                         k, d->m[k].dev, d->zero, n);
    }
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        rc = nt_optim_step_at(site, opts[k]);
        if (!rc)
            rc = nt_optim_zero_grad(opts[k]);
        for (int j = 0; j < n && !rc && d->zero == 1; j++)
            if (d->m[k].rep[j]->ag->grad) {
                nt_release(d->m[k].rep[j]->ag->grad);
                d->m[k].rep[j]->ag->grad = NULL;
            }
        leave(old);
    }
    if (!rc && d->zero < 3)
        rc = zero_gather(site, d, 0, n);
    return rc;
}

/* Stage 2, 3: member k's whole mean gradients, all-gathered from the
 * shards (new tensors in the parameters' shapes) into full[k * n + j]. */
static int zero_full_grads(const nt_site *site, nt_ddp *d, nt_tensor **full)
{
    int n = d->n, rc = 0;
    for (int j = 0; j < n && !rc; j++) {
        nt_tensor *in[DDP_MAX_DEV] = {0}, *out[DDP_MAX_DEV] = {0};
        for (int k = 0; k < d->nmem && !rc; k++) {
            nt_tensor *g = d->shard[k * n + j]->ag->grad;
            nt_stream *old = enter(d->m[k].dev);
            in[k] = g ? nt_reshape_at(site, g, 2, (int64_t[]){1, d->len[j]}) : NULL;
            leave(old);
            if (!in[k])
                rc = g ? errc() : nt__err(site, NT_ESTATE, "nt_ddp_clip_grad_norm", "shard %d "
                                          "of device %d has no gradient; call nt_ddp_reduce "
                                          "first", j, d->m[k].dev);
        }
        if (!rc && d->comm)
            rc = nt_all_gather_at(site, d->comm, in, out);
        else if (!rc)
            out[0] = in[0];
        for (int k = 0; k < d->nmem && !rc; k++) {
            nt_stream *old = enter(d->m[k].dev);
            full[k * n + j] = zero_unrows(site, d, j, out[k]);
            leave(old);
            rc = full[k * n + j] ? 0 : errc();
        }
    }
    return rc;
}

NT_API nt_tensor *nt_ddp_clip_grad_norm(nt_ddp *d, double max_norm)
{
    const char *fn = "nt_ddp_clip_grad_norm";
    if (!ddp_ok(NULL, d, fn))
        return NULL;
    g_mutex_lock(&d->lock);
    int n = d->n, rc = 0, here = nt_device_current();
    nt_tensor *total = NULL, **full = calloc((size_t)n * d->nmem * 2, sizeof *full);
    nt_tensor **dummy = full ? full + (size_t)n * d->nmem : NULL;
    if (!full) {
        nt__err_hostmem(NULL, fn, "the gradient lists");
        goto out;
    }
    nt_scope *sc = nt_scope_begin();
    nt_no_grad_begin();
    if (d->zero >= 2)
        rc = zero_full_grads(NULL, d, full);
    /* the replicas hold them whole (stages 0, 1); else leaves of no
     * elements that carry them, so nt_clip_grad_norm does the arithmetic */
    for (int k = 0; k < d->nmem && !rc; k++)
        for (int j = 0; j < n && !rc; j++) {
            if (d->zero < 2) {
                dummy[k * n + j] = d->m[k].rep[j];
                continue;
            }
            nt_stream *old = enter(d->m[k].dev);
            nt_tensor *t = nt_zeros_at(NULL, NT_F32, 1, (int64_t[]){0});
            leave(old);
            if (!t || nt_set_requires_grad(t, true)) {
                rc = errc();
                break;
            }
            t->ag->grad = nt_retain(full[k * n + j]);
            dummy[k * n + j] = t;
        }
    for (int k = 0; k < d->nmem && !rc; k++) {
        member *m = &d->m[k];
        nt_stream *old = enter(m->dev);
        nt_tensor *t = nt_clip_grad_norm(dummy + (size_t)k * n, n, max_norm);
        if (t && (d->m[k].dev == here || (!total && k == d->nmem - 1)))
            total = nt_keep(nt_to_device(t, here));
        /* the shards' .grads again from the clipped whole ones (a view of
         * the replica's .grad was clipped with it) */
        for (int j = 0; j < n && t && !rc && d->zero; j++) {
            if (d->view[k * n + j] && d->zero == 1)
                continue;
            nt_tensor *g = d->zero == 1 ? m->rep[j]->ag->grad : full[k * n + j];
            nt_tensor *c = zero_cut(NULL, d, j, m->rank, g);
            rc = c ? 0 : errc();
            if (!rc)
                set_grad(d->shard[k * n + j], c);
        }
        leave(old);
        if (!t)
            rc = errc();
    }
    for (int i = 0; i < n * d->nmem && d->zero >= 2; i++)
        if (dummy[i])
            nt_release(dummy[i]);
    nt_no_grad_end();
    nt_scope_end(sc);
out:
    free(full);
    g_mutex_unlock(&d->lock);
    if (rc && total) {
        nt_release(total);
        total = NULL;
    }
    return total;
}

/* The most tensor ranks nt_ddp_load_split reads. */
#define SPLIT_MAX 64

/* ---------------- sharded checkpoints ----------------
 *
 * Global rank r of R writes "<path>.zero<r>of<R>": its shards "p<j>" ([L],
 * or the parameter itself at stage 0, where only rank 0 writes, as R = 1),
 * its optimizer's state (the checkpoint's optimizer records) and
 * "zero.layout" (i32: R, stage, n, numel of each parameter). */

#define ZNAME 24

static void zero_path(char *buf, size_t cap, const char *path, int r, int R)
{
    snprintf(buf, cap, "%s.zero%dof%d", path, r, R);
}

/* The spec of member k's file: its shards (or replica), their names and
 * the layout tensor (made on the member's device, in the open scope). */
static int zero_spec(const nt_site *site, nt_ddp *d, int k, nt_optim *opt, char (*names)[ZNAME],
                     const char **np, nt_tensor **ts, nt_checkpoint_spec *spec, int R)
{
    int n = d->n;
    int32_t *lay = calloc((size_t)n + 3, sizeof *lay);
    if (!lay)
        return nt__err_hostmem(site, "nt_ddp_save", "the layout");
    lay[0] = R, lay[1] = d->zero, lay[2] = n;
    for (int j = 0; j < n; j++) {
        lay[3 + j] = (int32_t)(d->zero ? d->numel[j] : nt_numel(d->m[k].rep[j]));
        ts[j] = d->zero ? d->shard[k * n + j] : d->m[k].rep[j];
        snprintf(names[j], ZNAME, "p%d", j);
        np[j] = names[j];
    }
    nt_stream *old = enter(d->m[k].dev);
    ts[n] = nt_from_host(lay, NT_I32, 1, (int64_t[]){n + 3});
    leave(old);
    free(lay);
    np[n] = "zero.layout";
    *spec = (nt_checkpoint_spec){.tensors = ts, .names = np, .n = n + 1, .opt = opt};
    return ts[n] ? 0 : errc();
}

static int zero_opts_ok(const nt_site *site, nt_ddp *d, const char *fn, nt_optim *const *opts,
                        int nopts)
{
    if (opts && nopts != d->nmem)
        return nt__err(site, NT_EINVAL, fn, "argument 'nopts' is %d; expected one optimizer "
                       "per local device (%d), or opts NULL", nopts, d->nmem);
    for (int k = 0; opts && k < d->nmem; k++) {
        int np = nt__optim_nparams(opts[k]);
        bool same = np == d->n;
        for (int j = 0; same && j < np; j++)
            same = nt__optim_param(opts[k], j) == (d->zero ? d->shard[k * d->n + j]
                                                           : d->m[k].rep[j]);
        if (!same)
            return nt__err(site, NT_EINVAL, fn, "argument 'opts[%d]' does not optimize the "
                           "%s of device %d", k, d->zero ? "shards" : "replica", d->m[k].dev);
    }
    return 0;
}

NT_API int nt_ddp_save(nt_ddp *d, const char *path, nt_optim *const *opts, int nopts)
{
    const char *fn = "nt_ddp_save";
    if (!ddp_ok(NULL, d, fn))
        return nt_last_error();
    if (!path)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'path' is NULL");
    g_mutex_lock(&d->lock);
    int rc = zero_opts_ok(NULL, d, fn, opts, nopts), n = d->n;
    char (*names)[ZNAME] = calloc((size_t)n, ZNAME);
    const char **np = calloc((size_t)n + 1, sizeof *np);
    nt_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    if (!rc && (!names || !np || !ts))
        rc = nt__err_hostmem(NULL, fn, "the names");
    for (int k = 0; k < d->nmem && !rc; k++) {
        int R = d->zero ? d->ranks : 1;
        if (!d->zero && d->m[k].rank != 0)
            continue;
        char file[4096];
        zero_path(file, sizeof file, path, d->m[k].rank, R);
        nt_checkpoint_spec spec;
        nt_scope *sc = nt_scope_begin();
        rc = zero_spec(NULL, d, k, opts ? opts[k] : NULL, names, np, ts, &spec, R);
        if (!rc)
            rc = nt_checkpoint_write(file, &spec);
        nt_scope_end(sc);
    }
    free(names), free(np), free(ts);
    g_mutex_unlock(&d->lock);
    return rc;
}

/* The saved parameters' shapes (d's own, or those of another tensor
 * rank's parts: nt_ddp_load_split) and the call that reads them (its
 * errors name it). */
typedef struct zshape {
    const int64_t *numel;
    const int64_t (*shape)[NT_MAX_DIMS];
    const char *fn;
} zshape;

/* The layout a checkpoint was saved under: *R (files), *stage, and the
 * parameters' numel (lay[3 ..]).  0 or an error naming the path. */
static int zero_saved_layout(nt_ddp *d, const zshape *zs, const char *path, int *R,
                             int *stage, int32_t **lay)
{
    const char *fn = zs->fn;
    char file[4096];
    *R = 0;
    /* the newest layout saved at path, if several were */
    double newest = -1;
    for (int r = 1; r <= 4096; r++) {
        struct stat sb;
        zero_path(file, sizeof file, path, 0, r);
        if (stat(file, &sb) || access(file, R_OK))
            continue;
        double t = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
        if (t > newest)
            newest = t, *R = r;
    }
    if (!*R)
        return nt__err(NULL, NT_EIO, fn, "no sharded checkpoint at '%s' (no file "
                       "'%s.zero0of<R>' can be read)", path, path);
    zero_path(file, sizeof file, path, 0, *R);
    int n = d->n;
    *lay = calloc((size_t)n + 3, sizeof **lay);
    if (!*lay)
        return nt__err_hostmem(NULL, fn, "the layout");
    nt_scope *sc = nt_scope_begin();
    nt_tensor *t = nt_zeros(NT_I32, 1, (int64_t[]){n + 3});
    const char *nm = "zero.layout";
    nt_checkpoint_spec spec = {.tensors = &t, .names = &nm, .n = 1};
    nt_load_report rep = {0};
    int rc = t ? nt_checkpoint_read(file, &spec, false, &rep) : errc();
    if (!rc && rep.loaded != 1)
        rc = nt__err(NULL, NT_EINVAL, fn, "'%s' has no tensor 'zero.layout'; not written by "
                     "nt_ddp_save", file);
    nt_load_report_clear(&rep);
    if (!rc)
        rc = nt_to_host(t, *lay, sizeof **lay * ((size_t)n + 3));
    nt_scope_end(sc);
    if (rc)
        return rc;
    *stage = (*lay)[1];
    if ((*lay)[0] != *R || (*lay)[2] != n)
        return nt__err(NULL, NT_ESHAPE, fn, "'%s' holds %d parameters over %d ranks; the "
                       "nt_ddp has %d parameters", file, (*lay)[2], (*lay)[0], n);
    for (int j = 0; j < n; j++) {
        int64_t want = zs->numel[j];
        if ((*lay)[3 + j] != want)
            return nt__err(NULL, NT_ESHAPE, fn, "'%s': parameter %d has %d elements; the "
                           "nt_ddp's has %lld", file, j, (*lay)[3 + j], (long long)want);
    }
    return 0;
}

/* An optimizer of o's kind, flags and groups (each over the same slots
 * as o's) over ps. */
static nt_optim *zero_opt_like(const char *fn, nt_optim *o, nt_tensor **ps, int n)
{
    if (o->master || o->groups[0].first != 0 || o->n != n)
        return nt__err(NULL, NT_ENOTSUP, fn, "resharding an optimizer with master weights "
                       "or over other parameters than the nt_ddp's; one without master "
                       "weights over them is supported"), NULL;
    opt_group *g = &o->groups[0];
    int ams = o->flags & OPTF_AMSGRAD ? NT_OPTIM_AMSGRAD : 0;
    nt_optim *t;
    switch (o->kind) {
    case KIND_SGD:
        t = nt_optim_sgd(ps, g->n, g->lr, g->momentum, g->weight_decay,
                         (o->flags & OPTF_NESTEROV) != 0);
        break;
    case KIND_ADAMW:
        t = nt_optim_adamw_ex(ps, g->n, g->lr, g->beta1, g->beta2, g->eps, g->weight_decay, ams);
        break;
    case KIND_ADAM:
        t = nt_optim_adam(ps, g->n, g->lr, g->beta1, g->beta2, g->eps, g->weight_decay, ams);
        break;
    default:
        return nt__err(NULL, NT_ENOTSUP, fn, "resharding the state of this optimizer; SGD, "
                       "Adam and AdamW are supported"), NULL;
    }
    for (int k = 1; k < o->ngroups && t; k++) {
        opt_group *h = &o->groups[k];
        bool sgd = o->kind == KIND_SGD; /* a value it does not use is NAN */
        if (nt_optim_add_group_ex(t, ps + h->first, h->n, h->lr, h->weight_decay,
                                  sgd ? NAN : h->beta1, sgd ? NAN : h->beta2,
                                  sgd ? h->momentum : NAN) < 0) {
            nt_optim_destroy(t);
            t = NULL;
        }
    }
    return t;
}

/* What resharding reads: every saved rank's pieces of each parameter and
 * state slot, put together (flat [numel], on member 0's device). */
typedef struct zfull {
    nt_tensor **v;    /* [n * 4]: parameter, s0, s1, s2 (NULL: no such state) */
    int64_t *steps;   /* [n] the slots' update counts */
    int64_t osteps;   /* the optimizer's */
    int ngroups;
    double *lr, *initial_lr; /* [ngroups] */
} zfull;

/* Saved rank r's file into tmp tensors (and a temporary optimizer like
 * opt); appends its pieces to parts[(j * 4 + x) * R + r]. */
static int zero_read_rank(nt_ddp *d, const zshape *zs, const char *path, int r, int R,
                          int stage, nt_optim *opt, nt_tensor **parts, zfull *z)
{
    int n = d->n, rc = 0;
    char file[4096], (*names)[ZNAME] = calloc((size_t)n, ZNAME);
    const char **np = calloc((size_t)n + 1, sizeof *np);
    nt_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    if (!names || !np || !ts)
        rc = nt__err_hostmem(NULL, zs->fn, "the names");
    for (int j = 0; j < n && !rc; j++) {
        int64_t L = (zs->numel[j] + R - 1) / R;
        ts[j] = stage ? nt_zeros(d->pdt[j], 1, (int64_t[]){L})
                      : nt_zeros(d->pdt[j], d->pnd[j], zs->shape[j]);
        rc = ts[j] && !nt_set_requires_grad(ts[j], true) ? 0 : errc();
        snprintf(names[j], ZNAME, "p%d", j);
        np[j] = names[j];
    }
    ts[n] = rc ? NULL : nt_zeros(NT_I32, 1, (int64_t[]){n + 3});
    np[n] = "zero.layout";
    nt_optim *tmp = !ts[n] || !opt ? NULL : zero_opt_like(zs->fn, opt, ts, n);
    if (!rc && (!ts[n] || (opt && !tmp)))
        rc = errc();
    zero_path(file, sizeof file, path, r, R);
    nt_checkpoint_spec spec = {.tensors = ts, .names = np, .n = n + 1, .opt = tmp};
    if (!rc)
        rc = nt_checkpoint_read(file, &spec, true, NULL);
    for (int j = 0; j < n && !rc; j++) {
        slot *s = tmp ? tmp->slots[j] : NULL;
        nt_tensor *v[4] = {ts[j], s ? s->s0 : NULL, s ? s->s1 : NULL, s ? s->s2 : NULL};
        for (int x = 0; x < 4; x++)
            parts[(j * 4 + x) * R + r] =
                v[x] ? nt_reshape(v[x], 1, (int64_t[]){nt_numel(v[x])}) : NULL;
        z->steps[j] = s ? s->steps : 0;
    }
    if (!rc && tmp) {
        z->osteps = tmp->steps;
        for (int g = 0; g < z->ngroups && g < tmp->ngroups; g++)
            z->lr[g] = tmp->groups[g].lr, z->initial_lr[g] = tmp->groups[g].initial_lr;
    }
    nt_optim_destroy(tmp);
    free(names), free(np), free(ts);
    return rc;
}

/* Member k's value of a whole flat tensor: its shard (stage >= 1) or the
 * parameter's shape, on its device. */
static nt_tensor *zero_member_value(nt_ddp *d, int k, int j, nt_tensor *full)
{
    nt_stream *old = enter((int)full->dev); /* cut where the whole one is */
    nt_tensor *f = nt_reshape(full, d->pnd[j], d->pshape[j]);
    nt_tensor *v = d->zero && f ? zero_cut(NULL, d, j, d->m[k].rank, f) : f;
    if (v && d->m[k].dev != (int)v->dev)
        v = nt_to_device(v, d->m[k].dev);
    leave(old);
    return v;
}

/* Puts the whole tensors into every member's shards or replica and its
 * optimizer's slots. */
static int zero_put(nt_ddp *d, nt_optim *const *opts, const zfull *z)
{
    int n = d->n, rc = 0;
    for (int k = 0; k < d->nmem && !rc; k++) {
        nt_stream *old = enter(d->m[k].dev);
        for (int j = 0; j < n && !rc; j++) {
            nt_tensor *dst = d->zero ? d->shard[k * n + j] : d->m[k].rep[j];
            nt_tensor *v = zero_member_value(d, k, j, z->v[j * 4]);
            rc = v ? nt_copy_into(dst, v) : errc();
            slot *s = opts ? opts[k]->slots[j] : NULL;
            nt_tensor **st[3] = {s ? &s->s0 : NULL, s ? &s->s1 : NULL, s ? &s->s2 : NULL};
            for (int x = 0; x < 3 && s && !rc; x++) {
                if (!z->v[j * 4 + 1 + x])
                    continue;
                v = zero_member_value(d, k, j, z->v[j * 4 + 1 + x]);
                if (!v)
                    rc = errc();
                else if (*st[x])
                    rc = nt_copy_into(*st[x], v);
                else
                    *st[x] = nt_keep(nt_contiguous(v));
            }
            if (s)
                s->steps = z->steps[j];
        }
        if (opts && !rc) {
            opts[k]->steps = z->osteps;
            for (int g = 0; g < z->ngroups && g < opts[k]->ngroups; g++)
                opts[k]->groups[g].lr = z->lr[g], opts[k]->groups[g].initial_lr = z->initial_lr[g];
        }
        leave(old);
    }
    return rc;
}

/* Entry x of a saved parameter (zfull's v: the parameter, then its
 * optimizer state slots 0, 1 and 3 of docs/checkpoint-format.md). */
static const char *const zentry[4] = {
    "value", "optimizer state slot 0 (momentum or first moment)",
    "optimizer state slot 1 (second moment)",
    "optimizer state slot 3 (AMSGrad's largest second moment)"};

/* fn's error for saved file `lacks` holding no entry x of parameter j
 * that file `has` holds (an optimizer that never updated the parameter on
 * one rank has no state for it): nothing is put together from them. */
static int zero_missing(const char *fn, const char *lacks, const char *has, int j, int x)
{
    return nt__err(NULL, NT_EINVAL, fn, "'%s' holds no %s of parameter %d (\"p%d\"); '%s' "
                   "does: the ranks' optimizers were saved in different states, so the "
                   "parameter's state cannot be put together", lacks, zentry[x], j, j, has);
}

/* Every saved rank's file put together into z (flat whole tensors of zs's
 * sizes, on member 0's device, in the open scope). */
static int zero_read_all(nt_ddp *d, const zshape *zs, const char *path, nt_optim *opt, int R,
                         int stage, zfull *z)
{
    int n = d->n, rc = 0;
    nt_tensor **parts = calloc((size_t)n * 4 * R, sizeof *parts);
    if (!parts)
        return nt__err_hostmem(NULL, zs->fn, "the pieces");
    nt_stream *old = enter(d->m[0].dev);
    for (int r = 0; r < R && !rc; r++)
        rc = zero_read_rank(d, zs, path, r, R, stage, opt, parts, z);
    for (int i = 0; i < n * 4 && !rc; i++) /* every rank has each entry, or none */
        for (int r = 1; r < R && !rc; r++)
            if (!parts[i * R] != !parts[i * R + r]) {
                char lacks[4096], has[4096];
                zero_path(lacks, sizeof lacks, path, parts[i * R] ? r : 0, R);
                zero_path(has, sizeof has, path, parts[i * R] ? 0 : r, R);
                rc = zero_missing(zs->fn, lacks, has, i / 4, i % 4);
            }
    for (int i = 0; i < n * 4 && !rc; i++) {
        if (!parts[i * R])
            continue;
        int64_t numel = zs->numel[i / 4];
        nt_tensor *c = R == 1 ? parts[i * R] : nt_cat(parts + (size_t)i * R, R, 0);
        z->v[i] = c ? nt_slice(c, 0, 0, numel, 1) : NULL;
        rc = z->v[i] ? 0 : errc();
    }
    leave(old);
    free(parts);
    return rc;
}

static int zfull_alloc(const char *fn, const nt_ddp *d, nt_optim *const *opts, zfull *z)
{
    int ng = opts ? opts[0]->ngroups : 1;
    *z = (zfull){.v = calloc((size_t)d->n * 4, sizeof *z->v),
                 .steps = calloc((size_t)d->n, sizeof *z->steps), .ngroups = ng,
                 .lr = calloc((size_t)ng, sizeof *z->lr),
                 .initial_lr = calloc((size_t)ng, sizeof *z->initial_lr)};
    if (!z->v || !z->steps || !z->lr || !z->initial_lr)
        return nt__err_hostmem(NULL, fn, "the pieces");
    return 0;
}

static void zfull_free(zfull *z)
{
    free(z->v), free(z->steps), free(z->lr), free(z->initial_lr);
}

static int zero_reshard(nt_ddp *d, const char *path, nt_optim *const *opts, int R, int stage)
{
    zfull z;
    zshape zs = {d->numel, (const int64_t(*)[NT_MAX_DIMS])d->pshape, "nt_ddp_load"};
    int rc = zfull_alloc(zs.fn, d, opts, &z);
    if (!rc)
        rc = zero_read_all(d, &zs, path, opts ? opts[0] : NULL, R, stage, &z);
    if (!rc)
        rc = zero_put(d, opts, &z);
    zfull_free(&z);
    return rc;
}

/* Stage 0 keeps no shapes: take the replica's.  0 or the error. */
static int zero_shapes(nt_ddp *d, const char *fn)
{
    if (d->zero || d->numel)
        return 0;
    if (zero_shape_tables(d, 1))
        return 0;
    zero_free(d); /* none half made */
    return nt__err_hostmem(NULL, fn, "the shapes");
}

NT_API int nt_ddp_load(nt_ddp *d, const char *path, nt_optim *const *opts, int nopts,
                       bool reshard)
{
    const char *fn = "nt_ddp_load";
    if (!ddp_ok(NULL, d, fn))
        return nt_last_error();
    if (!path)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'path' is NULL");
    g_mutex_lock(&d->lock);
    int R = 0, stage = 0, rc = zero_opts_ok(NULL, d, fn, opts, nopts);
    int32_t *lay = NULL;
    if (!rc)
        rc = zero_shapes(d, fn);
    zshape zs = {d->numel, (const int64_t(*)[NT_MAX_DIMS])d->pshape, fn};
    if (!rc)
        rc = zero_saved_layout(d, &zs, path, &R, &stage, &lay);
    bool same = !rc && ((stage == 0 && d->zero == 0) || (stage == d->zero && R == d->ranks));
    if (!rc && !same && !reshard)
        rc = nt__err(NULL, NT_EINVAL, fn, "'%s' was saved under ZeRO stage %d over %d ranks; "
                     "this nt_ddp is stage %d over %d ranks: pass reshard = true to cut the "
                     "parameters and the optimizer state again", path, stage, R, d->zero,
                     d->ranks);
    nt_scope *sc = nt_scope_begin();
    nt_no_grad_begin();
    if (!rc && !same)
        rc = zero_reshard(d, path, opts, R, stage);
    char (*names)[ZNAME] = same && !rc ? calloc((size_t)d->n, ZNAME) : NULL;
    const char **np = names ? calloc((size_t)d->n + 1, sizeof *np) : NULL;
    nt_tensor **ts = np ? calloc((size_t)d->n + 1, sizeof *ts) : NULL;
    if (same && !rc && !ts)
        rc = nt__err_hostmem(NULL, fn, "the names");
    for (int k = 0; k < d->nmem && same && !rc; k++) {
        char file[4096];
        zero_path(file, sizeof file, path, stage ? d->m[k].rank : 0, stage ? R : 1);
        nt_checkpoint_spec spec;
        rc = zero_spec(NULL, d, k, opts ? opts[k] : NULL, names, np, ts, &spec, R);
        if (!rc)
            rc = nt_checkpoint_read(file, &spec, true, NULL);
    }
    if (!rc && (d->zero == 1 || d->zero == 2)) /* the replicas from the shards */
        rc = zero_gather(NULL, d, 0, d->n);
    nt_no_grad_end();
    nt_scope_end(sc);
    free(names), free(np), free(ts), free(lay);
    g_mutex_unlock(&d->lock);
    return rc;
}

/* ---------------- tensor-parallel sharded checkpoints ----------------
 *
 * Tensor rank t of T saves with nt_ddp_save at "<path>.tp<t>of<T>"; a load
 * under another T reads every saved tensor rank's files (each put together
 * over its ZeRO ranks as a reshard does), joins each split parameter's
 * parts along its dim and cuts this rank's part again. */

static void split_path(char *buf, size_t cap, const char *path, int t, int T)
{
    snprintf(buf, cap, "%s.tp%dof%d", path, t, T);
}

/* The arguments both split calls take.  0 or the error. */
static int split_args(const char *fn, nt_ddp *d, const char *path, int rank, int ranks)
{
    if (!ddp_ok(NULL, d, fn))
        return nt_last_error();
    if (!path)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'path' is NULL");
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'rank' is %d of 'ranks' %d; expected "
                       "0 <= rank < ranks", rank, ranks);
    return 0;
}

NT_API int nt_ddp_save_split(nt_ddp *d, const char *path, int rank, int ranks,
                             nt_optim *const *opts, int nopts)
{
    int rc = split_args("nt_ddp_save_split", d, path, rank, ranks);
    if (rc)
        return rc;
    char file[4096];
    split_path(file, sizeof file, path, rank, ranks);
    return nt_ddp_save(d, file, opts, nopts);
}

/* The tensor rank count of the newest split checkpoint at path, or 0:
 * the names "<path>.tp0of<T>.zero0of<R>" among the entries of path's
 * folder, path's characters taken as they are (glob() would read '[', '*'
 * and '?' in it as a pattern and miss the files). */
static int split_saved_ranks(const char *path)
{
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    char folder[4096];
    snprintf(folder, sizeof folder, "%.*s", !slash ? 1 : slash == path ? 1 : (int)(slash - path),
             !slash ? "." : path);
    DIR *dir = opendir(folder);
    if (!dir)
        return 0;
    size_t blen = strlen(base);
    double newest = -1;
    int T = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        int t, R;
        char end, file[4200];
        struct stat sb;
        if (strncmp(e->d_name, base, blen) ||
            sscanf(e->d_name + blen, ".tp0of%d.zero0of%d%c", &t, &R, &end) != 2 || t < 1)
            continue;
        snprintf(file, sizeof file, "%s%s", path, e->d_name + blen);
        if (stat(file, &sb))
            continue;
        double m = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
        if (m > newest)
            newest = m, T = t;
    }
    closedir(dir);
    return T;
}

/* Saved tensor rank t's whole parts (flat, zs's sizes) into z; *R its
 * ZeRO rank count. */
static int split_read(nt_ddp *d, const zshape *zs, const char *path, int t, int T,
                      nt_optim *opt, zfull *z, int *R)
{
    char file[4096];
    split_path(file, sizeof file, path, t, T);
    int stage = 0;
    int32_t *lay = NULL;
    int rc = zero_saved_layout(d, zs, file, R, &stage, &lay);
    free(lay);
    return rc ? rc : zero_read_all(d, zs, file, opt, *R, stage, z);
}

/* zero_missing for tensor rank `lacks`'s first file against rank `has`'s
 * (Rs: each tensor rank's ZeRO rank count). */
static int split_missing(const char *fn, const char *path, int lacks, int has, int T,
                         const int *Rs, int j, int x)
{
    char a[4096], b[4096], fa[4200], fb[4200];
    split_path(a, sizeof a, path, lacks, T);
    split_path(b, sizeof b, path, has, T);
    zero_path(fa, sizeof fa, a, 0, Rs[lacks]);
    zero_path(fb, sizeof fb, b, 0, Rs[has]);
    return zero_missing(fn, fa, fb, j, x);
}

/* Joins saved parts v[0..T) of parameter j (flat, saved shape sh) along
 * dim and cuts rank's part (flat, d's numel). */
static nt_tensor *split_recut(nt_ddp *d, int j, int dim, int rank, nt_tensor **v, int T,
                              const int64_t *sh)
{
    nt_tensor *p[SPLIT_MAX];
    for (int t = 0; t < T; t++)
        if (!v[t] || !(p[t] = nt_reshape(v[t], d->pnd[j], sh)))
            return NULL;
    nt_tensor *whole = T == 1 ? p[0] : nt_cat(p, T, dim);
    int64_t len = d->pshape[j][dim];
    nt_tensor *part = whole ? nt_contiguous(nt_slice(whole, dim, rank * len, (rank + 1) * len, 1))
                            : NULL;
    return part ? nt_reshape(part, 1, (int64_t[]){d->numel[j]}) : NULL;
}

NT_API int nt_ddp_load_split(nt_ddp *d, const char *path, int rank, int ranks, const int *dims,
                             nt_optim *const *opts, int nopts, bool reshard)
{
    const char *fn = "nt_ddp_load_split";
    int rc0 = split_args(fn, d, path, rank, ranks);
    if (rc0)
        return rc0;
    if (!dims)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'dims' is NULL");
    int T = split_saved_ranks(path);
    if (!T)
        return nt__err(NULL, NT_EIO, fn, "no tensor-parallel checkpoint at '%s' (no file "
                       "'%s.tp0of<T>.zero0of<R>' can be read)", path, path);
    if (T > SPLIT_MAX)
        return nt__err(NULL, NT_ENOTSUP, fn, "'%s' was saved over %d tensor ranks; at most %d "
                       "are read", path, T, SPLIT_MAX);
    char file[4096];
    if (T == ranks) {
        split_path(file, sizeof file, path, rank, ranks);
        return nt_ddp_load(d, file, opts, nopts, reshard);
    }
    if (!reshard)
        return nt__err(NULL, NT_EINVAL, fn, "'%s' was saved over %d tensor ranks; this nt_ddp "
                       "is tensor rank %d of %d: pass reshard = true to put the parts "
                       "together and cut them again", path, T, rank, ranks);
    g_mutex_lock(&d->lock);
    int n = d->n, rc = zero_opts_ok(NULL, d, fn, opts, nopts);
    if (!rc)
        rc = zero_shapes(d, fn);
    int64_t(*sh)[NT_MAX_DIMS] = calloc((size_t)n, sizeof *sh);
    int64_t *snumel = calloc((size_t)n, sizeof *snumel);
    zfull zt[SPLIT_MAX] = {0};
    int Rs[SPLIT_MAX] = {0};
    if (!rc && (!sh || !snumel))
        rc = nt__err_hostmem(NULL, fn, "the shapes");
    for (int j = 0; j < n && !rc; j++) {
        int dim = dims[j];
        if (dim < -1 || dim >= d->pnd[j])
            rc = nt__err(NULL, NT_EINVAL, fn, "argument 'dims[%d]' is %d; parameter %d has %d "
                         "dims (-1: replicated)", j, dim, j, d->pnd[j]);
        memcpy(sh[j], d->pshape[j], sizeof sh[j]);
        if (!rc && dim >= 0) {
            int64_t whole = d->pshape[j][dim] * ranks;
            if (whole % T)
                rc = nt__err(NULL, NT_ESHAPE, fn, "parameter %d: its dim %d (%lld whole) does "
                             "not split into the saved %d tensor ranks", j, dim,
                             (long long)whole, T);
            sh[j][dim] = whole / T;
        }
        snumel[j] = 1;
        for (int a = 0; a < d->pnd[j]; a++)
            snumel[j] *= sh[j][a];
    }
    zshape zs = {snumel, (const int64_t(*)[NT_MAX_DIMS])sh, fn};
    nt_scope *sc = nt_scope_begin();
    nt_no_grad_begin();
    for (int t = 0; t < T && !rc; t++) {
        rc = zfull_alloc(fn, d, opts, &zt[t]);
        if (!rc)
            rc = split_read(d, &zs, path, t, T, opts ? opts[0] : NULL, &zt[t], &Rs[t]);
    }
    /* this rank's parts go in tensor rank 0's place: a replicated one is
     * its whole, the counts and rates are its own */
    nt_stream *old = enter(d->m[0].dev);
    for (int i = 0; i < n * 4 && !rc; i++) {
        int j = i / 4;
        for (int t = 1; t < T && dims[j] >= 0 && !rc; t++) /* a split one's parts: all or none */
            if (!zt[0].v[i] != !zt[t].v[i])
                rc = split_missing(fn, path, zt[0].v[i] ? t : 0, zt[0].v[i] ? 0 : t, T, Rs, j,
                                   i % 4);
        if (rc || !zt[0].v[i] || dims[j] < 0)
            continue;
        nt_tensor *v[SPLIT_MAX];
        for (int t = 0; t < T; t++)
            v[t] = zt[t].v[i];
        zt[0].v[i] = split_recut(d, j, dims[j], rank, v, T, sh[j]);
        rc = zt[0].v[i] ? 0 : errc();
    }
    leave(old);
    if (!rc)
        rc = zero_put(d, opts, &zt[0]);
    if (!rc && (d->zero == 1 || d->zero == 2))
        rc = zero_gather(NULL, d, 0, d->n);
    nt_no_grad_end();
    nt_scope_end(sc);
    for (int t = 0; t < T; t++)
        zfull_free(&zt[t]);
    free(sh), free(snumel);
    g_mutex_unlock(&d->lock);
    return rc;
}
