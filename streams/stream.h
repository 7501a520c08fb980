/* streams/stream.h - per-stream queues, workers, completion and waiting.
 *
 * Concurrency contract:
 *   - Any thread may enqueue on any stream (multi-producer); only the
 *     stream's worker dequeues (single consumer).  Enqueue is wait-free
 *     (liburcu wfcqueue) except for the backpressure wait when a stream has
 *     more than NT_MAX_INFLIGHT ops outstanding.
 *   - Each op gets a sequence number from an atomic counter.  Two threads on
 *     one stream may enqueue in the other order than they drew numbers; the
 *     worker still runs them in seq order (waiting a moment for a gap), so
 *     every wait -- on an earlier seq, or on the writer an input had when
 *     the op was recorded -- points to an op drawn earlier, and waits across
 *     streams can never form a circle.  Completion is `done_upto`: every
 *     seq <= done_upto has run.  Each thread's own ops stay in its program
 *     order.
 *   - A wait for (stream, seq) asks a lazy worker to flush up to seq, then
 *     sleeps on the stream's condition variable until done_upto >= seq.
 *   - Records are recycled through per-stream lock-free stacks (the worker
 *     pushes; producers take the whole stack at once, which is ABA-free) into
 *     a per-thread cache.
 *   - Destroying a stream loses no op, whatever other threads do meanwhile:
 *     nt_stream_destroy marks it closing (nt__stream_current then answers
 *     the default stream), waits until every seq drawn on it has run, and
 *     seals next_seq with NT__SEQ_SEALED in one compare-and-swap that only
 *     succeeds if no seq was drawn since.  A producer that had picked the
 *     stream before and draws after the seal gets the sealed bit back from
 *     its fetch-and-add and draws again on the default stream
 *     (nt__stream_next_seq); a seq drawn before the seal was waited for.
 *     Only then does the worker stop.  The object stays allocated (lock and
 *     conditions too) until nt_shutdown, for threads still inside a wait;
 *     then its memory waits in core/handle.h's quarantine, so a stream kept
 *     across nt_shutdown is reported (NT_ESTATE), not read after free. */
#ifndef NT_STREAMS_STREAM_H
#define NT_STREAMS_STREAM_H

#include <pthread.h>

#include "core/handle.h"
#include "core/internal.h"

/* At most this many matmul positions are noted per batch (nt__batch_mm). */
#define NT__BATCH_MM_MAX 512

/* Fields are grouped by who writes them, a cache line per group: producers
 * write the queue tail and next_seq on every enqueue, the worker writes
 * done_upto after every batch, and neither should drag the other's line
 * across on each op. */
struct nt_stream {
    /* read-mostly */
    NT__HOBJ_HEAD;            /* core/handle.h: its memory outlives it */
    uint32_t id;
    uint8_t dev;              /* the device it runs on (its worker's core) */
    pthread_t worker;
    volatile AO_t closing;    /* nt_stream_destroy has begun: pick no more */
    /* The program capture recording this stream (struct nt__capture *,
     * fusion/graph.c), 0: none.  While set the worker holds what it takes,
     * like lazy mode without a window, until a sync asks: a captured step
     * is planned whole. */
    volatile AO_t capture;
    volatile AO_t sealed_seq; /* the last seq, once next_seq is sealed */
    /* producers: every enqueue */
    _Alignas(64) struct cds_wfcq_tail tail;
    volatile AO_t next_seq;   /* last seq handed out */
    /* the worker: every batch */
    _Alignas(64) struct __cds_wfcq_head head;
    volatile AO_t done_upto;  /* every seq <= this has run */
    volatile AO_t busy;       /* worker is running a batch (for nt-queue) */
    /* rarely written */
    _Alignas(64) volatile AO_t flush_upto; /* lazy mode: run at least up to here */
    volatile AO_t sleeping;   /* worker is (about to be) asleep and no
                                 producer has rung it since (one ring per
                                 sleep: nt__stream_enqueue) */
    volatile AO_t waiters;    /* threads sleeping on done_cond */
    /* Counts for tests (tests/test_streams.c): how often the worker set
     * `sleeping` (under lock) and how often a producer rang it.  One ring
     * per sleep means rings <= arms, whatever the timing. */
    volatile AO_t arms, rings;
    volatile AO_t stop;
    /* the worker pushes, producers take all: both, but once per batch */
    _Alignas(64) volatile AO_t free_recs; /* lock-free stack of recycled records */
    GMutex lock;
    GCond work_cond, done_cond;
    nt__errobj *first_error;  /* under lock: first error not yet reported */
    uint64_t first_error_seq; /* under lock: its op's seq (0: not an op's) */
    uint64_t *ooo;            /* under lock: seqs done out of order, sorted */
    unsigned ooo_len, ooo_cap;
    nt__ptrvec *held;         /* worker: records taken but not yet run */
    bool held_full;           /* worker: the host had no memory to hold more */
    guint scan_i, scan_k;     /* worker: held[0..scan_k) have seq <= scan_f;
                                 held[0..scan_i) were looked at */
    uint64_t scan_f;
    const char *end_reason;   /* worker: why the current batch ends */
    /* worker: where the current batch's matmuls are (nt__batch_mm) */
    uint32_t batch_mm[NT__BATCH_MM_MAX];
    char name[32];
};

#define NT__STREAM_MAGIC 0x57524d53u
/* Set in next_seq when the stream is sealed (seqs stay below 2^48). */
#define NT__SEQ_SEALED ((AO_t)1 << 62)
#define NT__MAX_STREAMS 65535

/* nt_init: each device's default stream and its worker.  0, or
 * NT_EHOSTMEM (the error set, nothing left made) if the host has no memory
 * for them. */
int nt__streams_init(void);
void nt__streams_shutdown(void);

nt_stream *nt__stream_current(void);
/* Device dev's default stream (dev < nt__cfg.devices). */
nt_stream *nt__stream_default_on(int dev);
nt_stream *nt__stream_by_id(uint32_t id);

/* Records: allocate on the producer side, fill, then enqueue (or execute
 * inline in deterministic mode with nt__stream_run_inline). */
nt__rec *nt__rec_alloc(nt_stream *s);
/* Gives back a record just taken with nt__rec_alloc and never enqueued (the
 * call that wanted it failed). */
void nt__rec_unalloc(nt__rec *r);
/* Draws the next seq on *s; if *s was sealed by nt_stream_destroy meanwhile,
 * on the default stream instead, and *s becomes the default stream. */
uint64_t nt__stream_next_seq(nt_stream **s);
/* The same for n consecutive seqs (a replayed program's record holds them
 * all: nt__rec.span); returns the first. */
uint64_t nt__stream_next_seqs(nt_stream **s, uint32_t n);
/* After nt__stream_next_seq moved r to s: drops r's waits on s itself (the
 * worker must never wait for its own stream). */
void nt__rec_drop_deps_on(nt__rec *r, const nt_stream *s);
/* The last seq drawn on s (sealed or not). */
uint64_t nt__stream_last_seq(nt_stream *s);
void nt__stream_enqueue(nt_stream *s, nt__rec *r);
void nt__stream_run_inline(nt_stream *s, nt__rec *r);

/* True if (stream, seq) has run (or names no live stream). */
bool nt__packed_done(uint64_t packed);
/* Waits until (stream, seq) has run; counts the wait in the stats. */
void nt__wait_packed(uint64_t packed);
/* Asks s's worker to run at least up to seq (a lazy window stops holding
 * it), without waiting. */
void nt__stream_request_flush(nt_stream *s, uint64_t seq);
/* Waits for everything queued on s so far. */
void nt__stream_drain(nt_stream *s);
/* Records err as s's first unreported error (if it has none). */
/* Keeps err as the stream's error to report unless an unreported one is
 * kept already; seq is the failed op's (0 if none).  The planner may run a
 * batch's records out of queue order, so of two op errors the one earlier
 * in queue order is kept: the same one an unfused run reports. */
void nt__stream_note_error(nt_stream *s, nt__errobj *err, uint64_t seq);
/* Takes s's first unreported error (may be NULL); caller unrefs. */
nt__errobj *nt__stream_take_error(nt_stream *s);

/* Called for every record after it ran: drops its references. */
void nt__rec_release(nt__rec *r);

/* What a worker calls to run records.  These live above streams/ (the
 * executor and the planner, fusion/), so streams calls them through this
 * table, which the top-level registration (init/init.c) fills at the first
 * nt_init, before any worker starts. */
typedef void (*nt__batch_fn)(nt__rec **recs, int n);
typedef struct nt__stream_hooks {
    void (*exec)(nt__rec *r);      /* runs one record's kernel (nt__exec_rec) */
    void (*drop_dead)(nt__rec *r); /* after it ran (nt__rec_drop_dead) */
    nt__batch_fn batch;            /* the fusion engine; NULL = off (op by op) */
} nt__stream_hooks;
extern nt__stream_hooks nt__shooks;
/* Why the batch being run ends where it does (for the fusion log). */
extern _Thread_local const char *nt__batch_end_reason NT_TLS_HOT;
/* The positions of the batch's matmul records, in ascending order, which the
 * worker notes while it reads each record's first line for its waits: the
 * planner's matmul pass (fusion/plan.c) then visits only these instead of
 * walking the whole batch.  nt__batch_nmm < 0: not known (more than
 * NT__BATCH_MM_MAX), walk the batch. */
extern _Thread_local const uint32_t *nt__batch_mm NT_TLS_HOT;
extern _Thread_local int nt__batch_nmm NT_TLS_HOT;

/* Multiplies every bound of adaptive mode's wait for the rest of a host
 * burst (1).  0 lifts the time bounds: the wait then ends only when a sync
 * asks (tests, so that no timing decides what fuses). */
extern volatile AO_t nt__gather_scale;

/* For every live stream (debugger, nt_sync): calls fn(s, arg). */
void nt__streams_foreach(void (*fn)(nt_stream *s, void *arg), void *arg);
/* Wakes every sleeping worker to re-read the configuration (nt_config_set). */
void nt__streams_wake(void);

#endif
