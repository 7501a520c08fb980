/* fusion/graph.h - captured programs: record a step once, replay it with one
 * call (docs/graphs.md).
 *
 * A capture runs the step for real, with the stream held (like lazy mode
 * without a window) so the planner sees the whole step at once, and the
 * executor records every kernel it runs -- each fused group with its
 * program, each single record -- into the capture (nt__capture_rec,
 * nt__capture_group, called on the thread that runs them while
 * nt__tl_recorder is set).  nt_graph_capture_end then compiles the
 * recording: which storages the program made and nothing else keeps (its
 * intermediates: placed once in one block by a static memory plan), which
 * it shares with the rest of the program (parameters, optimizer state,
 * inputs, what the user kept), which scalars must be refreshed at each
 * replay.  A replay is one record on the stream, holding every seq the
 * recorded ops held, whose worker runs the recorded kernels in order: no
 * dispatch, no planning, no allocation.
 *
 * What a layer above tells the capture (host side, the capturing thread):
 *   - nt__capture_pause / resume: ops issued between them run but are not
 *     part of the program (state made on first use: an optimizer's
 *     moments);
 *   - nt__capture_patch_next: the next op this thread issues has a scalar
 *     that must be recomputed at every replay (a learning rate, a bias
 *     correction, a seed);
 *   - nt__capture_on_replay: a function to run at every replay after the
 *     scalars were computed (an optimizer's step count);
 *   - nt__capture_note_leaf: autograd accumulated a leaf's gradient, which
 *     the leaf did or did not have before: a replay checks it is so again.
 *
 * Concurrency: a capture belongs to its thread; the worker of its stream
 * writes the recording only between capture begin and end, which both
 * drain the stream, so the host reads it after the worker's release of
 * done_upto.  Storage deaths are reported from any thread, under the
 * capture's lock.  A graph may be replayed from any thread whose current
 * stream is the captured one; replays serialise on the graph's lock and
 * run in stream order. */
#ifndef NT_FUSION_GRAPH_H
#define NT_FUSION_GRAPH_H

#include "core/internal.h"
#include "fusion/ir.h"

typedef struct nt__capture nt__capture;

/* ---- the executor (any thread running kernels of a captured stream) ---- */

/* r ran (or was skipped for a poisoned input): one step of the program. */
void nt__capture_rec(struct nt__capture *c, const nt__rec *r);
/* g ran as one fused kernel: one step. */
void nt__capture_group(struct nt__capture *c, const nt__fgroup *g);

/* ---- the host (the capturing thread) ---- */

/* The capture the calling thread is recording, or NULL. */
extern _Thread_local struct nt__capture *nt__tl_capture NT_TLS_HOT;
/* True while the calling thread captures a program (one TLS load: the
 * dispatcher asks on every op). */
static inline bool nt__capturing(void) { return nt__tl_capture != NULL; }
/* Before an op of stream s is recorded: 0, or the error (set) when s is
 * being captured by another thread, or the thread captures a program on
 * another stream than s. */
int nt__capture_check_stream(const nt_site *site, const char *fn, const nt__stream *s);
/* After r got its seq (the capturing thread only): applies the pending
 * patch and the pause to it. */
void nt__capture_note(nt__rec *r);
/* A host read (nt_item, nt_to_host, nt_print, nt_sync...) while capturing:
 * the error, naming fn and the capture's start; 0 when not capturing. */
int nt__capture_refuse(const nt_site *site, const char *fn);
void nt__capture_pause(void);
void nt__capture_resume(void);

/* Which scalar of a record a patch rewrites. */
enum { NT__PATCH_F0 = 0, NT__PATCH_F1, NT__PATCH_F2, NT__PATCH_SEED };
/* A patch's value at a replay: the bits of a double (F0..F2) or a seed. */
typedef uint64_t (*nt__patch_fn)(void *ctx, int role);
/* The patch goes to the next record of op `op` this thread issues (ops of
 * other kinds issued first, such as an expression's inner ops, pass). */
void nt__capture_patch_next(nt__patch_fn fn, void *ctx, int role, int field, int op);
/* The capture cannot become a program (its end reports why): a layer above
 * found the step differs from the steps after it (an optimizer's first
 * step that makes its state from the gradient). */
void nt__capture_fail(int code, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* fn(ctx, arg) at every replay, after every patch was computed; one per
 * (fn, ctx): a later call with the same pair sets its arg.  The graph keeps
 * ctx alive: the first call for a ctx calls retain(ctx) (if not NULL), and
 * the graph calls release(ctx) when it is destroyed or the capture fails. */
void nt__capture_on_replay(void (*fn)(void *ctx, int64_t arg), void *ctx, int64_t arg,
                           void (*retain)(void *ctx), void (*release)(void *ctx));
/* check(ctx, site) at every replay, before anything of it is queued (after
 * the graph's own checks): 0, or an error (set) that fails the replay.  It
 * may queue ops on the graph's stream (they run before the program).  One
 * per (check, ctx); retain and release as for nt__capture_on_replay. */
void nt__capture_on_check(int (*check)(void *ctx, const nt_site *site), void *ctx,
                          void (*retain)(void *ctx), void (*release)(void *ctx));
/* A number naming the calling thread's capture (unique per capture of the
 * process), or 0 when it captures none. */
uint64_t nt__capture_serial(void);
/* How a captured program asks autograd (a layer above) for a leaf's .grad
 * and gives it one. */
typedef struct nt__leaf_access {
    nt_tensor *(*grad_of)(const nt_tensor *leaf);   /* borrowed, or NULL */
    void (*set_grad)(nt_tensor *leaf, nt_tensor *g); /* takes a reference of its own */
} nt__leaf_access;
/* Autograd is about to start (grad NULL) or add to the leaf's .grad: the
 * first time per capture, the capture notes which .grad it found; at its end
 * which one the step left.  A replay checks the leaf holds the same .grad
 * as at the capture's start (none, or that very tensor), and then gives it
 * the one the step left, which the program rewrites. */
void nt__capture_note_leaf(nt_tensor *leaf, const nt__leaf_access *acc);
/* The bits of a double, for patch functions. */
static inline uint64_t nt__patch_f64(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

/* ---- collectives in a capture of several streams (dist/comm.c) ----
 *
 * nt_graph_capture_begin_multi records every stream the thread issues to:
 * a program per stretch of one stream's ops (a *segment*), and the
 * collectives between them as steps of their own, replayed in the recorded
 * order.  A collective's issuing call asks nt__capture_coll_begin first:
 * inside such a capture it ends the segment in progress (so the collective
 * is not recorded by a stream's worker) and the call issues the collective
 * as usual; then nt__capture_coll_end hands the capture what a replay needs
 * to issue it again (rec, with ops) and opens the next segment.  Outside
 * one (a single-stream capture, or none) nothing changes. */
typedef struct nt__capture_coll_ops {
    /* Everything one replay of rec needs that can fail (host memory),
     * taken before anything of the replay is queued: the prepared replay,
     * or NULL with the error set. */
    void *(*prepare)(void *rec, const nt_site *site);
    /* Queues the prepared replay on the captured members' streams (cannot
     * fail; consumes prep). */
    void (*issue)(void *rec, void *prep);
    /* A prepared replay that will not be issued. */
    void (*discard)(void *prep);
    /* The graph drops rec. */
    void (*release)(void *rec);
} nt__capture_coll_ops;
/* Before issuing collective fn: 0 to go on (*grouped: a capture of several
 * streams records it; call nt__capture_coll_end after), or the error (set:
 * a communicator spanning processes cannot be captured; the capture fails
 * too). */
int nt__capture_coll_begin(const nt_site *site, const char *fn, int processes, bool *grouped);
/* After a *grouped collective: rec (NULL when the call failed: nothing is
 * recorded; n < 0: it was issued but could not be recorded, which fails the
 * capture), its inputs (in[0..n), NULL for a member without one) and the
 * outputs the replays rewrite (out[0..n)). */
void nt__capture_coll_end(void *rec, const nt__capture_coll_ops *ops, nt_tensor *const *in,
                          nt_tensor *const *out, int n);

/* ---- the planner (fusion/plan.c) ---- */

/* > 0 while the executor runs the second and later programs of a shared
 * (foreach) kernel: the step it records shares the previous step's kernel
 * (the executing thread's). */
extern _Thread_local int nt__fjoined;
/* A replay's shared kernels: open before the first program of one; close
 * (open false) after its n programs ran. */
void nt__fusion_join(int backend, bool open, int n);

/* Runs a recorded group again: its program on its tensors, as the planner
 * ran it, with errors poisoning its outputs (named after its first op). */
void nt__fusion_replay_group(nt__fgroup *g);

/* Tests: 0 if no two planned storages that are alive at once share a
 * byte, every one lies inside the block, and the block is at most the sum
 * of their sizes; else -1 with why[] saying which. */
int nt__graph_check_plan(const nt_graph *g, char *why, size_t n);

/* The graph counters of nt_stats (nt__fusion_stats calls it). */
void nt__graph_stats(nt_stats *out);
void nt__graph_stats_reset(void);

/* nt_init / nt_shutdown (fusion/plan.c's init and shutdown call these). */
void nt__graph_init(void);
void nt__graph_shutdown(void);
/* core's hook (nt__chooks.storage_dead). */
void nt__graph_storage_dead(const nt__storage *st);

#endif
