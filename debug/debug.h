/* debug/debug.h - observability: NaN/Inf hunting, host trace events, the
 * NT_STATS summary.  Not installed.  See docs/debugging.md.
 *
 *   nan.c    NT_CHECK_NAN: nt__nan_pre / nt__nan_check, which the record
 *            executor (fusion/exec.c, above) calls, and the fused-kernel
 *            scan below
 *   trace.c  host-side events of the NT_TRACE file ("host" process):
 *            enqueues, sync waits, kernel spans, fusion decisions
 *   stats.c  nt__debug_stats_print, the NT_STATS=1 summary at nt_shutdown
 *
 * Thread-safety: every function may be called from any thread. */
#ifndef NT_DEBUG_DEBUG_H
#define NT_DEBUG_DEBUG_H

#include "core/internal.h"
#include "sim/trace.h"

/* ---------------- NaN / Inf ---------------- */

/* Under NT_CHECK_NAN, around one record's kernel: nt__nan_pre notes what
 * an in-place op is about to overwrite; nt__nan_check returns NT_ENAN (the
 * kernel error set) if the kernel made a NaN or Inf from finite inputs. */
void nt__nan_pre(nt__rec *r);
int nt__nan_check(nt__rec *r);
/* True if any element of the floating tensors ts[0..n) is a NaN or an Inf
 * (integer tensors and NULL entries are skipped).  Reads the data: the
 * tensors must be computed. */
bool nt__nan_any(nt_tensor *const *ts, int n);
/* nt_from_host under NT_CHECK_NAN: warns (NT_LOG=warn) if the copied data
 * holds a NaN or Inf, since no op is blamed for carrying it along. */
void nt__nan_note_host(const nt_tensor *t, const nt_site *site, const char *fn);

/* ---------------- host trace events ----------------
 * Call these only when nt__trace_enabled(): the caller tests it first, so a
 * run without NT_TRACE pays one relaxed load per event site.  Timestamps
 * are wall-clock microseconds since the trace was opened; each thread gets
 * its own track (tid = the OS thread id) named on first use. */

/* nt__htrace_now, the host trace's clock, is in sim/trace.h. */
/* One op record enqueued (instant on the calling thread's track).  Call
 * before the record is handed to the stream (the worker recycles it). */
void nt__htrace_enqueue(const nt__rec *r, const nt_stream *s);
/* A sync point that started at t0 (nt__htrace_now) and has returned: which
 * sync (fn), where (site), what it waited for (tensor id or 0, packed
 * (stream, seq) or 0). */
void nt__htrace_sync(const char *fn, const nt_site *site, uint64_t tensor_id, uint64_t packed,
                     double t0);
/* One record's kernel ran from t0 to now on this thread (rc < 0: failed). */
void nt__htrace_kernel(const nt__rec *r, double t0, int rc);
/* One fused kernel ran from t0 to now: kind ("elementwise", ...), its
 * records, what it wrote and elided, cache hit, rc. */
void nt__htrace_fused(const char *kind, unsigned long kernel_no, nt__rec *const *recs, int n,
                      int written, int elided, bool hit, double t0, int rc);
/* The fusion planner closed a group before r, for `reason`. */
void nt__htrace_break(const nt__rec *r, const char *reason);
/* A training step ended (nt_optim_step, a skipped nt_grad_scaler_step, an
 * nt_graph_replay; never while capturing: the caller checks): with a trace
 * open, the queues are drained so the step's events are all in the file,
 * the step count moves on (NT_TRACE_STEPS opens or shuts the window), and
 * a step inside the window prints its size on stderr.  No-op without a
 * trace. */
void nt__htrace_step(void);

/* The NT_STATS=1 summary (nt_shutdown). */
void nt__debug_stats_print(FILE *f);

/* "nt_add", "nt_add (in nt_linear)", "nt_mul (backward of nt_log)" into buf. */
const char *nt__rec_label(const nt__rec *r, char *buf, size_t n);

#endif
