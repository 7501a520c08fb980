/* dispatcher/resident.c - a big storage's device memory given back while
 * its handles stay, and filled again with the same bits (dispatch.h,
 * nt__mem_release / nt__mem_refill): what ZeRO-3 needs to free a layer's
 * gathered parameters after its forward while the graph keeps views of
 * them, and to gather them again for its backward (docs/sharding.md).
 *
 * Both queue host records (NT_REC_HOST) on the current stream, alone in
 * their batch (NT_RECF_ALONE), marked as writes of the storage
 * (NT_RECF_INPLACE) so the dispatcher's one enqueue path orders them after
 * the storage's last reader and writer on other streams as it does an
 * in-place op; the version bump that marking makes is taken back, since
 * neither changes a value a saved view could see.  The storage's state and
 * its accounting are core/tensor.c's (nt__storage_release_begin ...). */
#include "dispatcher/dispatch.h"
#include "fusion/graph.h"
#include "streams/stream.h"

#include <stdio.h>
#include <string.h>

/* Refuses while the thread or the stream captures: a replay would neither
 * give the block back nor take it again. */
static int capture_check(const nt_site *site, const char *fn, const nt_stream *s)
{
    if (nt__capturing() || AO_load(&s->capture))
        return nt__err(site, NT_ESTATE, fn,
                       "cannot release or refill a storage's memory while capturing a program "
                       "(nt_graph_capture_begin); do it before the capture or after its end");
    return 0;
}

static void drain_one(nt_stream *s, void *arg)
{
    (void)arg;
    nt__stream_drain(s);
}

/* Queues host_fn(r) on s after everything queued so far that touches t. */
static void enqueue_host(const nt_site *site, const char *fn, nt_stream *s, nt__rec *r,
                         nt_tensor *t, void (*host_fn)(void *))
{
    nt__storage *st = t->st;
    r->type = NT_REC_HOST;
    r->flags = NT_RECF_ALONE | NT_RECF_INPLACE;
    r->host_fn = host_fn;
    r->host_arg = r; /* host_fn reads its tensor and pool from the record */
    r->site = site ? *site : (nt_site){0};
    r->fn = fn;
    nt__tensor_iref(t); /* the record's: keeps st until it has run */
    r->out[0] = t;
    r->nout = 1;
    AO_t v = AO_load(&st->version);
    nt__rec_enqueue(r, &s, NT__CFG(mode) == NT_MODE_DETERMINISTIC);
    AO_store(&st->version, v);
}

/* The stream pool a storage on device dev may credit or draw from for an
 * op of s (a pool lends only its own device's bytes). */
static uint32_t pool_of(const nt_stream *s, int dev) { return s->dev == dev ? s->id : 0; }

int nt__mem_release(const nt_site *site, const char *fn, nt_tensor *t)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (!nt__check_arg(site, fn, "t", t))
        return nt__err_or(NT_EINVAL);
    nt_stream *s = nt__stream_current();
    int rc = capture_check(site, fn, s);
    if (rc)
        return rc;
    nt__rec *r = nt__rec_alloc(s);
    if (!r)
        return nt__err_hostmem(site, fn, "an op record");
    /* Read on more than one stream: the dependency on its last reader does
     * not cover the others, so every queued op runs first (rare: a stream's
     * gathered parameters are read on that stream). */
    if (__atomic_load_n(&t->st->xstream, __ATOMIC_RELAXED))
        nt__streams_foreach(drain_one, NULL);
    uint32_t pool = 0;
    rc = nt__storage_release_begin(site, fn, t, pool_of(s, t->st->dev), &pool);
    if (rc) {
        nt__rec_unalloc(r);
        return rc;
    }
    r->p.i[0] = pool;
    enqueue_host(site, fn, s, r, t, nt__storage_release_run);
    return 0;
}

int nt__mem_refill(const nt_site *site, const char *fn, nt_tensor *t, nt_tensor *src)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (!nt__check_arg(site, fn, "t", t) || !nt__check_arg(site, fn, "src", src) ||
        !nt__check_resident(site, fn, "src", src))
        return nt__err_or(NT_EINVAL);
    nt__storage *st = t->st;
    size_t es = nt__dtype_size((nt_dtype)t->dtype);
    if (t->offset != 0 || !nt__is_contig(t) ||
        (size_t)nt__numel(t->ndim, t->shape) * es != st->nbytes)
        return nt__err(site, NT_EINVAL, fn,
                       "argument 't' is not its whole storage as one contiguous view (offset "
                       "%lld, %lld of %zu bytes); refill through the tensor the storage was made "
                       "with", (long long)t->offset,
                       (long long)(nt__numel(t->ndim, t->shape) * (int64_t)es), st->nbytes);
    if (src->dtype != t->dtype)
        return nt__err(site, NT_EDTYPE, fn, "argument 'src' is %s; expected %s, the dtype of 't'",
                       nt_dtype_name((nt_dtype)src->dtype), nt_dtype_name((nt_dtype)t->dtype));
    if (src->ndim != t->ndim || memcmp(src->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim)) {
        char a[128], b[128];
        return nt__err(site, NT_ESHAPE, fn, "argument 'src' has shape %s; expected %s, the shape "
                       "of 't'", nt__shape_str(src->ndim, src->shape, a, sizeof a),
                       nt__shape_str(t->ndim, t->shape, b, sizeof b));
    }
    nt_stream *s = nt__stream_current();
    int rc = capture_check(site, fn, s);
    if (rc)
        return rc;
    if (t->dev != s->dev) /* the copy runs on s */
        return nt__device_mismatch(site, fn, "t", t->dev, s->dev);
    nt__rec *r = nt__rec_alloc(s);
    if (!r)
        return nt__err_hostmem(site, fn, "an op record");
    rc = nt__storage_refill_begin(site, fn, t, pool_of(s, st->dev));
    if (rc) {
        nt__rec_unalloc(r);
        return rc;
    }
    uint64_t v = st->rel_version;
    enqueue_host(site, fn, s, r, t, nt__storage_refill_run);
    rc = nt__copy_into_nograd(site, fn, t, src);
    if (rc) {
        /* nothing wrote it: back to released (its bytes given back again) */
        char msg[NT__ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", nt_last_error_message());
        nt__mem_release(site, fn, t);
        nt__err_set(rc, msg);
        return rc;
    }
    AO_store(&st->version, v);
    return 0;
}
