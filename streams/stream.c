/* streams/stream.c - queues, workers, events, synchronisation.
 * See stream.h for the concurrency contract. */
#include "streams/stream.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/hugecut.h"
#include "core/simtls.h"
#include <string.h>

#define NT_REC_CHUNK 128
/* Seqs done out of order a stream has room for at first (complete_seq). */
#define NT_OOO_MIN 16
/* Past this many chunks (a program that keeps big batches queued), chunks
 * are cut from 2 MiB slabs advised onto huge pages (see rec_chunk_new). */
#define NT_REC_HUGE_AFTER 32
#define NT_SPIN_ITERS 4000
/* Adaptive mode, worker waking from idle: how long it may wait for the rest
 * of a burst (see gather_burst). */
#define NT_GATHER_GAP_NS 10000    /* a host mid-burst enqueues ~10x faster */
#define NT_GATHER_MAX_NS 40000
#define NT_GATHER_ELEMS_PER_NS 32 /* ~3% of what an op over n elements costs */

static struct {
    GMutex lock; /* registry, record chunks */
    volatile AO_t reg[NT__MAX_STREAMS + 1];
    uint32_t next_id;
    nt__ptrvec *chunks;    /* own arrays: growing them may fail cleanly */
    unsigned nchunks;      /* record chunks made since nt_init */
    nt__hugecut huge;      /* record chunks past the first NT_REC_HUGE_AFTER */
    nt__ptrvec *graveyard; /* destroyed streams */
    volatile AO_t epoch; /* bumped by every init: invalidates thread caches */
    nt_stream *dflt;     /* device 0's default stream */
    nt_stream *dflt_dev[NT_MAX_DEVICES]; /* each device's default stream */
    int ndev;
} S;

nt__stream_hooks nt__shooks;

static _Thread_local struct {
    nt__rec *head;
    uint64_t epoch;
} tl_recs NT_TLS_HOT;

static _Thread_local struct {
    nt_stream *s;
    uint32_t id;
    uint8_t dev; /* s's device: where the thread goes back to if s dies */
} tl_cur NT_TLS_HOT;

static void *worker_main(void *arg);

/* Stream workers never wait for memory: the work they would wait for is
 * their own. */
static _Thread_local bool tl_worker;

/* The arena's wait for memory (core/arena.c): every stream's queued work,
 * to its end or about half of it, lazy batches included (the wait asks the
 * worker to flush). */
static bool arena_progress(bool all)
{
    if (tl_worker)
        return false;
    /* another thread may be making a stream (stream_new stores it) */
    uint32_t n = __atomic_load_n(&S.next_id, __ATOMIC_RELAXED);
    for (uint32_t id = 1; id <= n; id++) {
        nt_stream *s = nt__stream_by_id(id);
        if (!s)
            continue;
        uint64_t last = AO_load_full(&s->next_seq), done = AO_load_acquire(&s->done_upto);
        if (last > done)
            nt__wait_packed(NT__PACK(s->id, all ? last : done + (last - done + 1) / 2));
    }
    return true;
}

/* ---------------- registry ---------------- */

nt_stream *nt__stream_by_id(uint32_t id)
{
    if (id == 0 || id > NT__MAX_STREAMS)
        return NULL;
    return (nt_stream *)AO_load_acquire(&S.reg[id]);
}

static nt_stream *stream_new(bool is_default, int dev)
{
    /* 64-byte aligned, for the per-line groups; magic set, but nobody can
     * see it before it is published below */
    nt_stream *s = nt__hobj_new(sizeof *s, NT__STREAM_MAGIC);
    if (!s)
        return NULL;
    /* A first batch of held records (take_queued never grows it past what
     * the host gives). */
    s->held = nt__ptrvec_new(256);
    /* Room for seqs done out of order (complete_seqs), reserved now: the
     * worker never fails for want of it. */
    s->ooo = malloc(NT_OOO_MIN * sizeof *s->ooo);
    s->ooo_cap = NT_OOO_MIN;
    if (!s->held || !s->ooo) {
        nt__ptrvec_free(s->held);
        free(s->ooo);
        nt__hobj_free(s);
        return NULL;
    }
    g_mutex_lock(&S.lock);
    /* Room for the graveyard entry the stream takes when destroyed. */
    if (S.next_id >= NT__MAX_STREAMS || !nt__ptrvec_reserve(S.graveyard, S.next_id + 1)) {
        g_mutex_unlock(&S.lock);
        nt__ptrvec_free(s->held);
        free(s->ooo);
        nt__hobj_free(s);
        return NULL;
    }
    s->id = S.next_id + 1;
    __atomic_store_n(&S.next_id, s->id, __ATOMIC_RELAXED); /* foreach reads it unlocked */
    g_mutex_unlock(&S.lock);
    s->dev = (uint8_t)dev;
    __cds_wfcq_init(&s->head, &s->tail);
    g_mutex_init(&s->lock);
    g_cond_init(&s->work_cond);
    g_cond_init(&s->done_cond);
    if (is_default && dev == 0)
        snprintf(s->name, sizeof s->name, "nt-stream-default");
    else if (is_default)
        snprintf(s->name, sizeof s->name, "nt-stream-default%d", dev);
    else
        snprintf(s->name, sizeof s->name, "nt-stream-%u", s->id);
    /* Deterministic mode runs everything inline; the worker still exists so
     * that switching mode at run time needs no special case.  Started before
     * the stream is published, so a thread the system refuses (no memory
     * for its stack) leaves nothing anyone could have seen.  A pthread, not
     * a GThread: GLib aborts when it has no memory for the thread's
     * bookkeeping or its name. */
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        free(s->ooo);
        nt__ptrvec_free(s->held);
        g_mutex_clear(&s->lock);
        g_cond_clear(&s->work_cond);
        g_cond_clear(&s->done_cond);
        nt__hobj_free(s);
        return NULL;
    }
    AO_store_release(&S.reg[s->id], (AO_t)s);
    return s;
}

static void rec_push_chain(volatile AO_t *stack, nt__rec *first);

/* Stops s's worker (everything drawn on s has run) and retires s. */
static void stream_free(nt_stream *s)
{
    AO_store(&s->stop, 1);
    g_mutex_lock(&s->lock);
    g_cond_signal(&s->work_cond);
    g_mutex_unlock(&s->lock);
    pthread_join(s->worker, NULL);
    AO_store_release(&S.reg[s->id], 0);
    g_mutex_lock(&s->lock);
    if (s->first_error)
        nt__errobj_unref(s->first_error);
    s->first_error = NULL;
    g_mutex_unlock(&s->lock);
    free(s->ooo);
    nt__ptrvec_free(s->held);
    /* Its recycled records serve the default stream from now on. */
    AO_t recs;
    do {
        recs = AO_load(&s->free_recs);
    } while (recs && !AO_compare_and_swap_full(&s->free_recs, recs, 0));
    if (recs && S.dflt && S.dflt != s) /* (at shutdown they go with S.chunks) */
        rec_push_chain(&S.dflt->free_recs, (nt__rec *)recs);
    /* The lock and conditions stay until nt_shutdown (stream_dispose): a
     * thread may still be inside nt__wait_packed on s, about to see that
     * its seq has run. */
    /* destroyed (stream_ok may look meanwhile) */
    __atomic_store_n(&s->magic, ~NT__STREAM_MAGIC, __ATOMIC_RELAXED);
    /* Kept until nt_shutdown so a stale handle is reported, not dereferenced
     * after free. */
    g_mutex_lock(&S.lock);
    nt__ptrvec_add(S.graveyard, s); /* room was reserved by stream_new */
    g_mutex_unlock(&S.lock);
}

static void stream_dispose(gpointer p)
{
    nt_stream *s = p;
    g_mutex_clear(&s->lock);
    g_cond_clear(&s->work_cond);
    g_cond_clear(&s->done_cond);
    nt__hobj_free(s); /* a stale pointer still finds a dead stream */
}

int nt__streams_init(void)
{
    g_mutex_init(&S.lock);
    S.next_id = 0;
    S.chunks = nt__ptrvec_new(0);
    S.graveyard = nt__ptrvec_new(0);
    AO_fetch_and_add1(&S.epoch);
    /* One default stream (and worker) per device, device 0's first: with
     * one device, exactly the streams there always were. */
    S.ndev = NT__CFG(devices) >= 1 ? NT__CFG(devices) : 1;
    for (int d = 0; d < S.ndev && S.chunks && S.graveyard; d++) {
        S.dflt_dev[d] = stream_new(true, d);
        if (!S.dflt_dev[d])
            break;
    }
    S.dflt = S.dflt_dev[0];
    if (!S.dflt_dev[S.ndev - 1]) { /* no memory: what was made goes */
        nt__streams_shutdown();
        return nt__err(NULL, NT_EHOSTMEM, "nt_init",
                       "out of host memory for the default streams and their workers");
    }
    nt__arena_progress = arena_progress;
    return 0;
}

void nt__streams_foreach(void (*fn)(nt_stream *s, void *arg), void *arg)
{
    uint32_t n = __atomic_load_n(&S.next_id, __ATOMIC_RELAXED);
    for (uint32_t id = 1; id <= n; id++) {
        nt_stream *s = nt__stream_by_id(id);
        if (s)
            fn(s, arg);
    }
}

static void wake_one(nt_stream *s, void *arg)
{
    (void)arg;
    g_mutex_lock(&s->lock);
    g_cond_signal(&s->work_cond);
    g_mutex_unlock(&s->lock);
}

void nt__streams_wake(void) { nt__streams_foreach(wake_one, NULL); }

void nt__streams_shutdown(void)
{
    nt__arena_progress = NULL;
    uint32_t n = S.next_id;
    for (uint32_t id = 1; id <= n; id++) {
        nt_stream *s = nt__stream_by_id(id);
        if (s)
            nt__stream_drain(s);
    }
    for (uint32_t id = 1; id <= n; id++) {
        nt_stream *s = nt__stream_by_id(id);
        if (s)
            stream_free(s);
    }
    S.dflt = NULL;
    memset(S.dflt_dev, 0, sizeof S.dflt_dev);
    S.ndev = 0;
    for (unsigned i = 0; S.chunks && i < S.chunks->len; i++)
        free(S.chunks->pdata[i]);
    nt__ptrvec_free(S.chunks);
    S.chunks = NULL;
    S.nchunks = 0;
    S.huge = (nt__hugecut){0};
    for (unsigned i = 0; S.graveyard && i < S.graveyard->len; i++)
        stream_dispose(S.graveyard->pdata[i]);
    nt__ptrvec_free(S.graveyard);
    S.graveyard = NULL;
    AO_fetch_and_add1(&S.epoch);
    tl_recs.head = NULL;
    tl_cur.s = NULL;
    tl_cur.dev = 0;
    g_mutex_clear(&S.lock);
}

nt_stream *nt__stream_current(void)
{
    nt_stream *s = tl_cur.s;
    /* A stream being destroyed takes no new work (stream.h). */
    if (!s)
        return S.dflt;
    if (nt__stream_by_id(tl_cur.id) == s && !AO_load(&s->closing))
        return s;
    /* a stream destroyed under the thread: its device's default stream
     * (nt_stream_destroy's contract) from now on */
    nt_stream *d = tl_cur.dev < S.ndev ? S.dflt_dev[tl_cur.dev] : NULL;
    tl_cur.s = d;
    if (d)
        tl_cur.id = d->id;
    return d ? d : S.dflt;
}

nt_stream *nt__stream_default_on(int dev) { return S.dflt_dev[dev]; }

/* ---------------- records ---------------- */

static void rec_push(volatile AO_t *stack, nt__rec *r)
{
    AO_t old;
    do {
        old = AO_load(stack);
        r->pool_next = (nt__rec *)old;
    } while (!AO_compare_and_swap_release(stack, old, (AO_t)r));
}

/* Pushes the chain first..(pool_next == NULL) onto a stack. */
static void rec_push_chain(volatile AO_t *stack, nt__rec *first)
{
    nt__rec *last = first;
    while (last->pool_next)
        last = last->pool_next;
    AO_t old;
    do {
        old = AO_load(stack);
        last->pool_next = (nt__rec *)old;
    } while (!AO_compare_and_swap_release(stack, old, (AO_t)first));
}

/* A zeroed chunk of NT_REC_CHUNK records, kept until nt_shutdown.  The
 * first chunks come from the heap; once there are many (a big batch is
 * queued: a lazy window of 100k ops holds 800 chunks), from 2 MiB slabs
 * advised onto huge pages.  The planner walks a batch's records in order
 * (fusion/plan.c), and on 4 KiB pages the records of a 100k-op batch span
 * 8,000 pages, many times what the TLB holds: each record's walk then
 * started with a page-table walk.  NULL: the host is out of memory. */
static nt__rec *rec_chunk_new(void)
{
    const size_t bytes = NT_REC_CHUNK * sizeof(nt__rec);
    nt__rec *chunk = NULL;
    g_mutex_lock(&S.lock);
    if (!S.chunks) {
        g_mutex_unlock(&S.lock);
        return NULL;
    }
    if (S.nchunks >= NT_REC_HUGE_AFTER) {
        void *block;
        chunk = nt__hugecut_take(&S.huge, bytes, &block);
        if (block && !nt__ptrvec_add(S.chunks, block)) {
            free(block); /* the heap may still have a chunk's worth */
            S.huge = (nt__hugecut){0};
            chunk = NULL;
        }
        S.nchunks += chunk != NULL;
    }
    g_mutex_unlock(&S.lock);
    if (chunk) {
        memset(chunk, 0, bytes);
        return chunk;
    }
    chunk = calloc(NT_REC_CHUNK, sizeof *chunk);
    if (!chunk)
        return NULL;
    g_mutex_lock(&S.lock);
    bool kept = S.chunks && nt__ptrvec_add(S.chunks, chunk);
    S.nchunks += kept;
    g_mutex_unlock(&S.lock);
    if (!kept) {
        free(chunk);
        return NULL;
    }
    return chunk;
}

nt__rec *nt__rec_alloc(nt_stream *s)
{
    uint64_t ep = AO_load(&S.epoch);
    if (tl_recs.epoch != ep) {
        tl_recs.head = NULL; /* records of an earlier nt_init: gone */
        tl_recs.epoch = ep;
    }
    nt__rec *r = tl_recs.head;
    if (!r) {
        /* Take the whole stack in one exchange (no ABA). */
        AO_t all;
        do {
            all = AO_load(&s->free_recs);
        } while (all && !AO_compare_and_swap_full(&s->free_recs, all, 0));
        r = (nt__rec *)all;
    }
    if (!r) {
        nt__rec *chunk = rec_chunk_new();
        if (!chunk)
            return NULL;
        for (int i = 0; i < NT_REC_CHUNK - 1; i++)
            chunk[i].pool_next = &chunk[i + 1];
        r = chunk;
    }
    tl_recs.head = r->pool_next;
    /* records come back cold after a big batch: fetch the next one ahead */
    if (tl_recs.head)
        for (size_t off = 0; off < sizeof(nt__rec); off += 64)
            __builtin_prefetch((const char *)tl_recs.head + off, 1);
    /* the fields a record reads; p and site are written by every producer */
    memset(r->in, 0, sizeof r->in);
    memset(r->out, 0, sizeof r->out);
    r->type = NT_REC_OP;
    r->nin = r->nout = r->ndeps = 0;
    r->flags = 0;
    r->bwd_of = NULL;
    r->host_fn = NULL;
    r->host_arg = NULL;
    r->stream = NULL;
    r->seq = 0;
    r->span = 0;
    return r;
}

void nt__rec_unalloc(nt__rec *r)
{
    r->pool_next = tl_recs.head;
    tl_recs.head = r;
}

void nt__rec_release(nt__rec *r)
{
    for (int i = 0; i < NT__MAX_IN; i++)
        if (r->in[i])
            nt__tensor_iunref(r->in[i]);
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (r->out[i])
            nt__tensor_iunref(r->out[i]);
    nt_stream *s = r->stream;
    rec_push(&s->free_recs, r);
}

/* ---------------- completion ---------------- */

/* Under s->lock (the worker and, after a switch to deterministic mode,
 * threads running ops inline may complete seqs of one stream at once):
 * seq .. seq + span - 1 have run (span 0 counts as 1: a record's own). */
static void complete_seqs(nt_stream *s, uint64_t seq, uint32_t span)
{
    uint64_t done = AO_load(&s->done_upto);
    uint64_t last = seq + (span ? span : 1) - 1;
    if (seq != done + 1) {
        /* Kept sorted.  Past the reserved room, the array grows; a host
         * with no memory for that gets a moment, the lock let go, for the
         * seqs before this one to complete (then it is in order) or for
         * memory to come back. */
        unsigned need = (unsigned)(last - seq + 1);
        while (s->ooo_len + need > s->ooo_cap && seq != AO_load(&s->done_upto) + 1) {
            unsigned cap = s->ooo_cap;
            while (cap < s->ooo_len + need)
                cap *= 2;
            uint64_t *p = realloc(s->ooo, (size_t)cap * sizeof *p);
            if (p) {
                s->ooo = p;
                s->ooo_cap = cap;
                break;
            }
            g_mutex_unlock(&s->lock);
            g_usleep(100);
            g_mutex_lock(&s->lock);
        }
        done = AO_load(&s->done_upto);
        if (seq != done + 1) {
            /* the ranges never overlap: what is above seq is above last */
            unsigned i = s->ooo_len;
            for (; i > 0 && s->ooo[i - 1] > seq; i--)
                s->ooo[i - 1 + need] = s->ooo[i - 1];
            for (unsigned q = 0; q < need; q++)
                s->ooo[i + q] = seq + q;
            s->ooo_len += need;
            return;
        }
    }
    done = last;
    unsigned k = 0;
    while (k < s->ooo_len && s->ooo[k] == done + 1)
        done++, k++;
    if (k) {
        memmove(s->ooo, s->ooo + k, (s->ooo_len - k) * sizeof *s->ooo);
        s->ooo_len -= k;
    }
    AO_store_release(&s->done_upto, done);
}

/* Releases a batch of records that has run and marks it done.  Their
 * tensors' internal references are summed per handle first: a weight read
 * by every op of the batch has its count touched once, not once per op, and
 * that line stops bouncing between the host (which increments it at each
 * enqueue) and the worker.  The references go before done_upto moves, so a
 * host returning from a sync sees the memory of everything it released
 * already given back (device_bytes_* in nt_stats are exact after a sync). */
static void release_batch(nt_stream *s, nt__rec **recs, guint k)
{
    enum { SLOTS = 256 };
    nt_tensor *key[SLOTS];
    AO_t cnt[SLOTS];
    memset(key, 0, sizeof key);
    int used = 0;
    for (guint j = 0; j < k; j++) {
        nt__rec *r = recs[j];
        nt_tensor *ts[NT__MAX_IN + NT__MAX_OUT];
        int nt = 0;
        for (int i = 0; i < NT__MAX_IN; i++)
            if (r->in[i])
                ts[nt++] = r->in[i];
        for (int i = 0; i < NT__MAX_OUT; i++)
            if (r->out[i])
                ts[nt++] = r->out[i];
        for (int q = 0; q < nt; q++) {
            nt_tensor *t = ts[q];
            unsigned h = (unsigned)(((uintptr_t)t >> 6) * 2654435761u) % SLOTS;
            int probes = 0;
            while (key[h] && key[h] != t && probes < 8)
                h = (h + 1) % SLOTS, probes++;
            if (key[h] == t) {
                cnt[h]++;
            } else if (!key[h] && used < SLOTS / 2) {
                key[h] = t;
                cnt[h] = 1;
                used++;
            } else {
                nt__tensor_iunref(t); /* table busy: the plain way */
            }
        }
        r->nin = r->nout = 0;
        memset(r->in, 0, sizeof r->in);
        memset(r->out, 0, sizeof r->out);
    }
    for (int h = 0; h < SLOTS; h++)
        if (key[h])
            nt__tensor_iunref_n(key[h], cnt[h]);
    g_mutex_lock(&s->lock);
    for (guint j = 0; j < k; j++)
        complete_seqs(s, recs[j]->seq, recs[j]->span);
    g_mutex_unlock(&s->lock);
    for (guint j = 0; j < k; j++)
        rec_push(&s->free_recs, recs[j]); /* the host may reuse it at once */
}

static void notify_done(nt_stream *s)
{
    if (AO_load_full(&s->waiters)) {
        g_mutex_lock(&s->lock);
        g_cond_broadcast(&s->done_cond);
        g_mutex_unlock(&s->lock);
    }
}

/* flush_upto = max(flush_upto, seq): a lazy worker runs at least this far. */
static void raise_flush(nt_stream *s, uint64_t seq)
{
    AO_t f;
    do {
        f = AO_load(&s->flush_upto);
    } while (f < seq && !AO_compare_and_swap_full(&s->flush_upto, f, seq));
}

void nt__stream_request_flush(nt_stream *s, uint64_t seq)
{
    raise_flush(s, seq);
    g_mutex_lock(&s->lock);
    g_cond_signal(&s->work_cond);
    g_mutex_unlock(&s->lock);
}

bool nt__packed_done(uint64_t packed)
{
    nt_stream *s = nt__stream_by_id(NT__PACK_SID(packed));
    return !s || AO_load_acquire(&s->done_upto) >= NT__PACK_SEQ(packed);
}

void nt__wait_packed(uint64_t packed)
{
    nt_stream *s = nt__stream_by_id(NT__PACK_SID(packed));
    uint64_t seq = NT__PACK_SEQ(packed);
    if (!s || AO_load_acquire(&s->done_upto) >= seq)
        return;
    uint64_t t0 = nt__now_ns();
    /* Ask a lazy worker to run at least this far. */
    raise_flush(s, seq);
    g_mutex_lock(&s->lock);
    g_cond_signal(&s->work_cond);
    AO_fetch_and_add1_full(&s->waiters);
    while (AO_load_acquire(&s->done_upto) < seq) {
        gint64 until = g_get_monotonic_time() + 2000; /* re-check: robust to missed wakeups */
        g_cond_wait_until(&s->done_cond, &s->lock, until);
    }
    AO_fetch_and_sub1_full(&s->waiters);
    g_mutex_unlock(&s->lock);
    NT__COUNT(sync_wait_ns, nt__now_ns() - t0);
}

uint64_t nt__stream_next_seq(nt_stream **sp) { return nt__stream_next_seqs(sp, 1); }

uint64_t nt__stream_next_seqs(nt_stream **sp, uint32_t n)
{
    for (;;) {
        AO_t q = AO_fetch_and_add_full(&(*sp)->next_seq, (AO_t)n);
        if (!(q & NT__SEQ_SEALED))
            return q + 1;
        /* Sealed by nt_stream_destroy after this thread picked it: all of
         * its work has run, and this op goes where the header says a
         * destroyed stream's work goes: its device's default stream, so
         * the op's tensors stay on the op's device.  (The increment hit
         * only the sealed value, which no reader uses.) */
        *sp = S.dflt_dev[(*sp)->dev];
    }
}

void nt__rec_drop_deps_on(nt__rec *r, const nt_stream *s)
{
    int k = 0;
    for (int d = 0; d < r->ndeps; d++)
        if (NT__PACK_SID(r->deps[d]) != s->id)
            r->deps[k++] = r->deps[d];
    r->ndeps = (uint8_t)k;
}

uint64_t nt__stream_last_seq(nt_stream *s)
{
    AO_t n = AO_load_full(&s->next_seq);
    return n & NT__SEQ_SEALED ? AO_load_acquire(&s->sealed_seq) : n;
}

void nt__stream_drain(nt_stream *s)
{
    uint64_t last = nt__stream_last_seq(s);
    if (last)
        nt__wait_packed(NT__PACK(s->id, last));
}

void nt__stream_note_error(nt_stream *s, nt__errobj *err, uint64_t seq)
{
    g_mutex_lock(&s->lock);
    /* keep the first error until a sync reports it -- a sync on the
     * poisoned tensor may have done so already: then this one is next */
    if (!s->first_error || AO_load(&s->first_error->reported) ||
        (seq && s->first_error_seq && seq < s->first_error_seq)) {
        nt__errobj_ref(err);
        if (s->first_error)
            nt__errobj_unref(s->first_error);
        s->first_error = err;
        s->first_error_seq = seq;
    }
    g_mutex_unlock(&s->lock);
}

nt__errobj *nt__stream_take_error(nt_stream *s)
{
    g_mutex_lock(&s->lock);
    nt__errobj *e = s->first_error;
    s->first_error = NULL;
    g_mutex_unlock(&s->lock);
    return e;
}

/* ---------------- enqueue ---------------- */

void nt__stream_enqueue(nt_stream *s, nt__rec *r)
{
    /* Once enqueued, r belongs to the worker, which may run and recycle it
     * before the enqueue returns here: read nothing of r after. */
    uint64_t seq = r->seq;
    r->stream = s;
    cds_wfcq_node_init(&r->node);
    /* liburcu (not instrumented) hands r over: tell TSan (take_queued). */
    NT__TSAN_RELEASE(r);
    cds_wfcq_enqueue(&s->head, &s->tail, &r->node);
    /* Ring the worker if it sleeps -- in lazy mode only once a window's
     * worth of ops is waiting.  A plain load suffices: the enqueue's
     * uatomic_xchg is a full barrier (liburcu guarantees one before and
     * after it), so this load cannot pass the store that published r, and
     * the worker sets `sleeping` with a full barrier before it looks at
     * the queue again (worker_sleep).  One ring per sleep: the producer
     * that turns `sleeping` from 1 to 0 rings, the others see 0 and go on.
     * Before, every enqueue rang (a mutex, a futex syscall and a contended
     * line each) until the woken worker got a processor and cleared the
     * flag itself; on a loaded 2-vCPU host that was most ops of a burst.
     * The compare-and-swap needs no ordering of its own: it only elects
     * the ringer, and the signal is ordered by the mutex, which the
     * sleeping worker holds from setting the flag until it waits. */
    if (AO_load(&s->sleeping) && !AO_load(&s->capture) &&
        (NT__CFG(mode) != NT_MODE_LAZY ||
         seq - AO_load(&s->done_upto) >= (uint64_t)NT__CFG(lazy_window)) &&
        AO_compare_and_swap(&s->sleeping, 1, 0)) {
        AO_fetch_and_add1(&s->rings); /* once per sleep: off the hot path */
        g_mutex_lock(&s->lock);
        g_cond_signal(&s->work_cond);
        g_mutex_unlock(&s->lock);
    }
    /* Backpressure: a host far ahead of its worker waits (and, in lazy mode,
     * makes the worker run) rather than queueing without bound.  Checked
     * every 64 ops: done_upto is the worker's line. */
    if ((seq & 63) == 0) {
        uint64_t done = AO_load(&s->done_upto);
        uint64_t inflight = (uint64_t)NT__CFG(max_inflight);
        if (seq > done + inflight)
            nt__wait_packed(NT__PACK(s->id, seq - inflight / 2));
    }
}

_Thread_local const char *nt__batch_end_reason NT_TLS_HOT;
_Thread_local const uint32_t *nt__batch_mm NT_TLS_HOT;
_Thread_local int nt__batch_nmm NT_TLS_HOT = -1;

static void run_batch(nt__rec **recs, int n)
{
    if (nt__shooks.batch && NT__CFG(fusion) && NT__CFG(mode) != NT_MODE_EAGER &&
        NT__CFG(mode) != NT_MODE_DETERMINISTIC) {
        nt__shooks.batch(recs, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        nt__shooks.exec(recs[i]);
        nt__shooks.drop_dead(recs[i]);
    }
}

void nt__stream_run_inline(nt_stream *s, nt__rec *r)
{
    /* Ops queued on s before a switch to deterministic mode may not have
     * run yet (nt_config_set drains only what was queued when it began):
     * they come first, as in any mode. */
    if (r->seq > 1)
        nt__wait_packed(NT__PACK(s->id, r->seq - 1));
    r->stream = s;
    /* this thread runs s's kernels now: on s's device's core */
    int core = nt__tl_core;
    nt__tl_core = s->dev;
    struct nt__capture *rec = nt__tl_recorder;
    nt__tl_recorder = (struct nt__capture *)AO_load_acquire(&s->capture);
    nt__shooks.exec(r);
    nt__tl_recorder = rec;
    nt__tl_core = core;
    g_mutex_lock(&s->lock);
    complete_seqs(s, r->seq, r->span);
    g_cond_broadcast(&s->done_cond);
    g_mutex_unlock(&s->lock);
    nt__rec_release(r);
}

/* ---------------- worker ---------------- */

static int take_queued(nt_stream *s)
{
    int got = 0;
    struct cds_wfcq_node *node;
    s->held_full = false;
    /* Room first: a record taken from the queue must not be dropped.  If
     * the host has none, the worker runs what it holds and comes back. */
    while ((s->held_full = !nt__ptrvec_reserve(s->held, s->held->len + 1)) == false &&
           (node = __cds_wfcq_dequeue_nonblocking(&s->head, &s->tail)) != NULL &&
           node != CDS_WFCQ_WOULDBLOCK) {
        nt__rec *r = caa_container_of(node, nt__rec, node);
        NT__TSAN_ACQUIRE(r);
        /* Held in seq order: threads sharing s may enqueue in another order
         * than they drew (rarely; then a short move, and a fresh scan). */
        s->held->pdata[s->held->len++] = r; /* room was reserved above */
        guint i = s->held->len - 1;
        while (i > 0 && ((nt__rec *)s->held->pdata[i - 1])->seq > r->seq) {
            s->held->pdata[i] = s->held->pdata[i - 1];
            i--;
        }
        if (i != s->held->len - 1) {
            s->held->pdata[i] = r;
            s->scan_i = s->scan_k = 0;
        }
        got++;
    }
    return got;
}

/* How many held records to run now (0: keep holding).  In lazy mode that is
 * up to the last held record a sync asked for (seq <= flush_upto).  Held
 * records are only appended (and taken from the front), and flush_upto only
 * grows, so the scan resumes where it stopped: O(new records) per call. */
static guint runnable_prefix(nt_stream *s)
{
    guint n = s->held->len;
    if (!n)
        return 0;
    if (AO_load(&s->stop))
        return n;
    /* a stream being captured holds like lazy mode, with no window */
    bool cap = AO_load_acquire(&s->capture) != 0;
    bool lazy = NT__CFG(mode) == NT_MODE_LAZY || cap;
    if (lazy && ((!cap && n >= (guint)NT__CFG(lazy_window)) || s->held_full)) {
        s->end_reason = s->held_full ? "the host has no memory to hold more" : "lazy window full";
        return n;
    }
    uint64_t f = AO_load_acquire(&s->flush_upto);
    if (!lazy) {
        /* A host waiting in a sync for an op of this batch: end the batch at
         * that op, so the value it asked for is ready first. */
        if (f <= AO_load(&s->done_upto)) {
            s->end_reason = "end of the queued work";
            return n;
        }
    }
    if (f != s->scan_f) {
        s->scan_f = f;
        s->scan_i = s->scan_k; /* records past scan_k may now qualify */
    }
    for (guint i = s->scan_i; i < n; i++) {
        nt__rec *r = s->held->pdata[i];
        if (r->seq <= f)
            s->scan_k = i + 1;
    }
    s->scan_i = n;
    if (!lazy && s->scan_k == 0) {
        s->end_reason = "end of the queued work";
        return n;
    }
    s->end_reason = s->scan_k < n ? "sync point (the value asked for is ready)"
                                  : "sync point";
    return s->scan_k;
}

/* The first k held records left the array. */
static void held_consumed(nt_stream *s, guint k)
{
    nt__ptrvec_remove_front(s->held, k);
    s->scan_i = s->scan_i > k ? s->scan_i - k : 0;
    s->scan_k = s->scan_k > k ? s->scan_k - k : 0;
}

/* Lazy mode: is there a reason to run held work? */
static bool lazy_should_run(nt_stream *s)
{
    uint64_t done = AO_load_acquire(&s->done_upto);
    if (AO_load_acquire(&s->capture))
        return AO_load(&s->flush_upto) > done;
    if (NT__CFG(mode) != NT_MODE_LAZY)
        return true; /* nt_config_set left lazy mode: stop holding */
    return nt__stream_last_seq(s) - done >= (uint64_t)NT__CFG(lazy_window) ||
           AO_load(&s->flush_upto) > done;
}

/* Of held[0..k), the records whose seqs follow done_upto without a gap. */
static guint in_order_prefix(nt_stream *s, guint k)
{
    uint64_t next = AO_load_acquire(&s->done_upto) + 1;
    guint c = 0;
    while (c < k) {
        const nt__rec *r = s->held->pdata[c];
        if (r->seq != next)
            break;
        next += r->span ? r->span : 1;
        c++;
    }
    return c;
}

static bool deps_met(const nt__rec *r)
{
    for (int d = 0; d < r->ndeps; d++)
        if (!nt__packed_done(r->deps[d]))
            return false;
    return true;
}

/* Elements written by held records [from, n). */
static uint64_t held_elems(nt_stream *s, guint from)
{
    uint64_t e = 0;
    for (guint i = from; i < s->held->len; i++) {
        const nt__rec *r = s->held->pdata[i];
        for (int k = 0; k < r->nout; k++)
            if (r->out[k])
                e += (uint64_t)nt__numel(r->out[k]->ndim, r->out[k]->shape);
    }
    return e;
}

/* The worker was idle and work arrived.  A host that is running ahead is
 * mid-burst (an enqueue costs well under a microsecond), so the rest of the
 * burst is worth a short wait: the batch then fuses whole instead of as one
 * lone op followed by the rest.  The wait is bounded by a small fraction of
 * what the held work will take to run anyway (so a lone small op is not
 * delayed at all, and a slow host's op by at most ~3%), ends when the host
 * stops enqueueing for NT_GATHER_GAP_NS, and ends at once when a sync (or a
 * host blocked on back-pressure) waits -- taking what was queued before the
 * sync first, so the op it asks for is in the batch. */
volatile AO_t nt__gather_scale = 1; /* stream.h */

static void gather_burst(nt_stream *s)
{
    uint64_t t0 = nt__now_ns(), last = t0, k = AO_load(&nt__gather_scale);
    uint64_t budget = held_elems(s, 0) / NT_GATHER_ELEMS_PER_NS * k;
    for (;;) {
        if (budget > NT_GATHER_MAX_NS * k)
            budget = NT_GATHER_MAX_NS * k;
        if (AO_load(&s->stop) || s->held->len >= (guint)NT__CFG(max_inflight) / 2)
            return;
        if (AO_load_acquire(&s->flush_upto) > AO_load(&s->done_upto)) {
            take_queued(s); /* enqueued before the request: all visible now */
            return;
        }
        uint64_t t = nt__now_ns();
        if (k && t - t0 >= budget) /* k == 0 (tests): no time bound */
            return;
        guint had = s->held->len;
        if (take_queued(s)) {
            last = t;
            budget += held_elems(s, had) / NT_GATHER_ELEMS_PER_NS * k;
        } else if (k && t - last > NT_GATHER_GAP_NS * k) {
            return;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* The worker sleeps on work_cond until there is work: in lazy mode (or
 * while captured, `holding`) until lazy_should_run, else until the queue
 * has a record (or the mode became lazy).  `sleeping` is set again, with a
 * full barrier, before each look at the condition: a producer that saw it
 * set rang once and cleared it (nt__stream_enqueue), so a worker going back
 * to sleep after any wake-up (a timeout, a flush request, a ring whose work
 * it already took) must arm it again, or the next enqueue would not ring.
 * The 100 ms bound makes a missed wake-up a delay, never a hang. */
static void worker_sleep(nt_stream *s, bool holding)
{
    g_mutex_lock(&s->lock);
    for (;;) {
        AO_store(&s->arms, AO_load(&s->arms) + 1); /* only the worker, under lock */
        AO_store_full(&s->sleeping, 1);
        if (AO_load(&s->stop))
            break;
        if (holding ? lazy_should_run(s)
                    : !cds_wfcq_empty(&s->head, &s->tail) || NT__CFG(mode) == NT_MODE_LAZY)
            break;
        gint64 until = g_get_monotonic_time() + 100000;
        g_cond_wait_until(&s->work_cond, &s->lock, until);
    }
    AO_store_full(&s->sleeping, 0);
    g_mutex_unlock(&s->lock);
}

static void *worker_main(void *arg)
{
    nt_stream *s = arg;
    bool idle = false;
    /* its name in gdb and top (at most 15 characters) */
    char name[16];
    snprintf(name, sizeof name, "%.15s", s->name);
    (void)pthread_setname_np(pthread_self(), name);
    tl_worker = true;
    nt__tl_core = s->dev; /* its kernels run on its device's simulated core */
    for (;;) {
        if (take_queued(s) && idle && NT__CFG(mode) == NT_MODE_ADAPTIVE && NT__CFG(fusion))
            gather_burst(s);
        idle = false;
        guint k = runnable_prefix(s);
        if (k) {
            /* Strictly in seq order.  An op waits only for ops drawn before
             * it (its own stream's earlier seqs, and the writers its inputs
             * had when it was recorded), so if every stream runs in draw
             * order no wait can close a circle; running in arrival order
             * could (an op at the front waiting on another stream that
             * waits on an op of this one still behind it).  A gap is the
             * op of a producer between drawing its seq and enqueueing it,
             * or one a thread runs inline: a moment. */
            guint c = in_order_prefix(s, k);
            if (!c) {
                g_thread_yield();
                continue;
            }
            if (c < k) {
                k = c;
                s->end_reason = "the next op is still being enqueued";
            }
            nt__rec **recs = (nt__rec **)s->held->pdata;
            /* An op waiting on another stream: run what precedes it first.
             * A collective member runs in a batch of its own (NT_RECF_ALONE):
             * the batch ends before one, and right after one that leads. */
            bool alone = recs[0]->flags & NT_RECF_ALONE;
            guint i = 0;
            int nmm = 0;
            while (i < k && deps_met(recs[i]) &&
                   !(i && (alone || (recs[i]->flags & NT_RECF_ALONE)))) {
                /* the line is in: note the matmuls for the planner */
                if (recs[i]->op == NT_OP_MATMUL && recs[i]->type == NT_REC_OP && nmm >= 0)
                    nmm = nmm < NT__BATCH_MM_MAX ? (s->batch_mm[nmm] = i, nmm + 1) : -1;
                i++;
            }
            if (i == 0) {
                for (int d = 0; d < recs[0]->ndeps; d++)
                    nt__wait_packed(recs[0]->deps[d]);
                recs[0]->ndeps = 0;
                continue;
            }
            if (i < k)
                s->end_reason = ((recs[0]->flags | recs[i]->flags) & NT_RECF_ALONE)
                                    ? "a collective runs alone"
                                    : "an op waits for another stream";
            k = i;
            AO_store(&s->busy, 1);
            nt__batch_end_reason = s->end_reason;
            nt__batch_mm = s->batch_mm;
            nt__batch_nmm = nmm;
            /* set while the host is between capture begin and end, which
             * both drain the stream: every record of the batch is the
             * capture's */
            nt__tl_recorder = (struct nt__capture *)AO_load_acquire(&s->capture);
            run_batch(recs, (int)k);
            nt__tl_recorder = NULL;
            nt__batch_nmm = -1;
            release_batch(s, recs, k);
            held_consumed(s, k);
            AO_store(&s->busy, 0);
            notify_done(s);
            continue;
        }
        if (AO_load(&s->stop) && !s->held->len &&
            cds_wfcq_empty(&s->head, &s->tail))
            break;
        if (NT__CFG(mode) == NT_MODE_LAZY || AO_load_acquire(&s->capture)) {
            /* Holding: sleep until the window fills, a sync asks for a held
             * op, or the stream stops.  No spinning: producers ring only
             * when the window is full. */
            worker_sleep(s, true);
            continue;
        }
        idle = true;
        /* Nothing queued: spin briefly (cheap for a host that is about to
         * enqueue again, and it spares the host a wake-up syscall), then
         * sleep until an enqueue or a flush request. */
        bool more = false;
        for (int i = 0; i < NT_SPIN_ITERS && !more; i++) {
            if (!cds_wfcq_empty(&s->head, &s->tail) || AO_load(&s->stop))
                more = true;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        if (more)
            continue;
        worker_sleep(s, false);
    }
    return NULL;
}

/* ---------------- public API: streams ---------------- */

/* s is a live stream of this runtime; else the error naming fn's 's'
 * (NT_ESTATE for one from before the last nt_shutdown). */
static bool stream_ok(nt_stream *s, const char *fn)
{
    return nt__hobj_check(s, NT__STREAM_MAGIC, NULL, fn, "s", "stream") == 0;
}

NT_API nt_stream *nt_stream_default(void)
{
    if (!nt__ensure_init())
        return NULL;
    return S.dflt;
}

static nt_stream *create_on(int dev, const char *fn)
{
    nt_stream *s = stream_new(false, dev);
    if (!s && __atomic_load_n(&S.next_id, __ATOMIC_RELAXED) < NT__MAX_STREAMS)
        nt__err_hostmem(NULL, fn, "a stream");
    else if (!s)
        nt__err(NULL, NT_ENOMEM, fn, "too many streams (at most %d per process)",
                NT__MAX_STREAMS);
    return s;
}

NT_API nt_stream *nt_stream_create(void)
{
    if (!nt__ensure_init())
        return NULL;
    return create_on(nt__stream_current()->dev, "nt_stream_create");
}

/* ---------------- public API: devices ---------------- */

/* dev names a device; else NT_EINVAL naming fn's argument 'dev'. */
static bool dev_ok(int dev, const char *fn)
{
    if (dev >= 0 && dev < S.ndev)
        return true;
    nt__err(NULL, NT_EINVAL, fn, "argument 'dev' is %d; expected a device from 0 to %d "
            "(NT_SIM_CORES=%d)", dev, S.ndev - 1, S.ndev);
    return false;
}

NT_API int nt_device_count(void)
{
    if (!nt__ensure_init())
        return 0;
    return S.ndev;
}

NT_API int nt_device_current(void)
{
    if (!nt__ensure_init())
        return 0;
    return nt__stream_current()->dev;
}

NT_API int nt_device_set(int dev)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (!dev_ok(dev, "nt_device_set"))
        return NT_EINVAL;
    nt_stream *s = S.dflt_dev[dev];
    tl_cur.s = s;
    tl_cur.id = s->id;
    tl_cur.dev = s->dev;
    return 0;
}

NT_API nt_stream *nt_stream_default_on(int dev)
{
    if (!nt__ensure_init() || !dev_ok(dev, "nt_stream_default_on"))
        return NULL;
    return S.dflt_dev[dev];
}

NT_API nt_stream *nt_stream_create_on(int dev)
{
    if (!nt__ensure_init() || !dev_ok(dev, "nt_stream_create_on"))
        return NULL;
    return create_on(dev, "nt_stream_create_on");
}

NT_API int nt_stream_device(const nt_stream *s)
{
    if (!stream_ok((nt_stream *)s, "nt_stream_device"))
        return -1;
    return s->dev;
}

NT_API int nt_tensor_device(const nt_tensor *t)
{
    if (!nt__check_arg(NULL, "nt_tensor_device", "t", (nt_tensor *)t))
        return -1;
    return t->dev;
}

NT_API int nt_stream_destroy(nt_stream *s)
{
    if (!stream_ok(s, "nt_stream_destroy"))
        return nt_last_error();
    if (s == S.dflt_dev[s->dev]) {
        if (s->dev == 0)
            return nt__err(NULL, NT_EINVAL, "nt_stream_destroy",
                           "the default stream cannot be destroyed");
        return nt__err(NULL, NT_EINVAL, "nt_stream_destroy",
                       "device %d's default stream cannot be destroyed", s->dev);
    }
    if (!AO_compare_and_swap_full(&s->closing, 0, 1))
        return nt__err(NULL, NT_EINVAL, "nt_stream_destroy",
                       "argument 's' is already being destroyed by another thread");
    if (tl_cur.s == s) { /* back to its device's default stream */
        tl_cur.s = S.dflt_dev[s->dev];
        tl_cur.id = tl_cur.s->id;
    }
    /* No thread picks s any more; wait out the ops of those that had, then
     * seal: the CAS fails if one more seq was drawn meanwhile (stream.h). */
    for (;;) {
        AO_t n = AO_load_full(&s->next_seq);
        if (n)
            nt__wait_packed(NT__PACK(s->id, n));
        AO_store(&s->sealed_seq, n);
        if (AO_compare_and_swap_full(&s->next_seq, n, n | NT__SEQ_SEALED))
            break;
    }
    stream_free(s);
    return 0;
}

NT_API nt_stream *nt_stream_current(void)
{
    if (!nt__ensure_init())
        return NULL;
    return nt__stream_current();
}

NT_API int nt_stream_set_current(nt_stream *s)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (!s) {
        tl_cur.s = NULL;
        tl_cur.dev = 0;
        return 0;
    }
    if (!stream_ok(s, "nt_stream_set_current"))
        return nt_last_error();
    tl_cur.s = s;
    tl_cur.id = s->id;
    tl_cur.dev = s->dev;
    return 0;
}

static int report(nt__errobj *e)
{
    if (!e)
        return 0;
    if (AO_load(&e->reported)) { /* a sync on the tensor already returned it */
        nt__errobj_unref(e);
        return 0;
    }
    AO_store(&e->reported, 1);
    int code = e->code;
    nt__err_set(code, e->msg);
    nt__errobj_unref(e);
    return code;
}

NT_API int nt_stream_synchronize(nt_stream *s)
{
    if (!stream_ok(s, "nt_stream_synchronize"))
        return nt_last_error();
    if (AO_load_acquire(&s->capture))
        return nt__err(NULL, NT_ESTATE, "nt_stream_synchronize",
                       "stream '%s' is being captured (nt_graph_capture_begin): its ops run "
                       "at nt_graph_capture_end", s->name);
    NT__COUNT(syncs, 1);
    nt__stream_drain(s);
    return report(nt__stream_take_error(s));
}

/* ---------------- public API: events ---------------- */

/* Its memory is core/handle.h's: destroying it twice, or using it after
 * nt_shutdown (its (stream, seq) names a stream of the ended runtime), is
 * an error, not a use after free. */
struct nt_event {
    NT__HOBJ_HEAD;
    volatile AO_t packed; /* (stream, seq) recorded; 0 = never recorded */
};
#define NT__EVENT_MAGIC 0xe7e7e7e7u

static bool event_ok(nt_event *e, const char *fn)
{
    return nt__hobj_check(e, NT__EVENT_MAGIC, NULL, fn, "e", "event") == 0;
}

NT_API nt_event *nt_event_create(void)
{
    if (!nt__ensure_init())
        return NULL;
    nt_event *e = nt__hobj_new(sizeof *e, NT__EVENT_MAGIC);
    if (!e)
        nt__err_hostmem(NULL, "nt_event_create", "an event");
    return e;
}

NT_API void nt_event_destroy(nt_event *e)
{
    if (!e)
        return;
    /* one made before nt_shutdown is freed like any other */
    if (!nt__hobj_live(e, NT__EVENT_MAGIC)) {
        event_ok(e, "nt_event_destroy"); /* the error: destroyed already, ... */
        return;
    }
    nt__hobj_free(e);
}

NT_API int nt_event_record(nt_event *e, nt_stream *s)
{
    if (!event_ok(e, "nt_event_record"))
        return nt_last_error();
    if (!s)
        s = nt__stream_current();
    if (!stream_ok(s, "nt_event_record"))
        return nt_last_error();
    AO_store_full(&e->packed, NT__PACK(s->id, nt__stream_last_seq(s)));
    return 0;
}

NT_API int nt_stream_wait_event(nt_stream *s, nt_event *e)
{
    if (!event_ok(e, "nt_stream_wait_event"))
        return nt_last_error();
    if (!s)
        s = nt__stream_current();
    if (!stream_ok(s, "nt_stream_wait_event"))
        return nt_last_error();
    uint64_t p = AO_load_full(&e->packed);
    if (!p || NT__PACK_SID(p) == s->id || nt__packed_done(p))
        return 0; /* same stream: already ordered */
    nt__rec *r = nt__rec_alloc(s);
    if (!r)
        return nt__err_hostmem(NULL, "nt_stream_wait_event", "an op record");
    r->type = NT_REC_WAIT;
    r->deps[0] = p;
    r->ndeps = 1;
    nt_stream *picked = s;
    r->seq = nt__stream_next_seq(&s);
    r->sid = s->id;
    if (s != picked)
        nt__rec_drop_deps_on(r, s);
    if (NT__CFG(mode) == NT_MODE_DETERMINISTIC) {
        nt__wait_packed(p);
        nt__stream_run_inline(s, r);
    } else {
        nt__stream_enqueue(s, r);
    }
    return 0;
}

NT_API int nt_event_synchronize(nt_event *e)
{
    if (!event_ok(e, "nt_event_synchronize"))
        return nt_last_error();
    uint64_t p = AO_load_full(&e->packed);
    if (p)
        nt__wait_packed(p);
    return 0;
}

NT_API bool nt_event_query(nt_event *e)
{
    if (!event_ok(e, "nt_event_query"))
        return false;
    uint64_t p = AO_load_full(&e->packed);
    return !p || nt__packed_done(p);
}
