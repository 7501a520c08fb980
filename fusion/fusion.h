/* fusion/fusion.h - the adaptive fusion engine.
 *
 * When a stream worker takes a batch of queued records, the planner walks it
 * in order and grows groups of consecutive records that one kernel can run:
 *
 *   EW   elementwise ops (unary, scalar, binary, compare, where, copy, cast,
 *        fill, backward helpers) over one iteration shape;
 *   ROW  the same plus sum/max/mean over the last dim (keepdim), evaluated a
 *        row at a time: softmax, log_softmax, layer_norm, rms_norm written
 *        as primitive ops become one row kernel;
 *   MM   a matmul followed by elementwise ops over its output (bias,
 *        activation, cast), applied as the accumulator is evacuated.
 *   NORM a layer norm followed by one cast of its output to bf16 or f16,
 *        rounded and stored by the norm's row kernel (fusion/ir.h).
 *
 * A group compiles once into a program (nt__fprog), cached by a signature
 * of its ops, shapes, dtypes, broadcast pattern and which values it stores.
 * Programs keep every rounding point of the ops they replace: each value
 * carries the dtype its op would have stored, and is rounded to it.  So a
 * fused run gives the same bits as the records one by one (docs/exactness.md, rule 1).
 *
 * A value is stored (written to device memory) only if something outside
 * the group can read it: a live user handle, another handle on its storage
 * (views, tensors saved for backward), or a record outside the group.  Dead
 * intermediates never reach HBM. */
#ifndef NT_FUSION_FUSION_H
#define NT_FUSION_FUSION_H

#include "core/internal.h"
#include "fusion/ir.h"

/* ---------------- running records (fusion/exec.c) ---------------- */

/* Runs one op record's kernel (no queue) on the backend the record names,
 * through core/backend.h: used by workers (through nt__shooks), by
 * deterministic mode and by the planner for what it does not fuse.  Handles
 * poisoned inputs, errors, stats, NaN checks. */
void nt__exec_rec(nt__rec *r);
/* Takes the blocks of every deferred storage a record (or a list of
 * tensors, NULLs skipped) touches, before a kernel runs: 0, or NT_ENOMEM
 * with the kernel error message set when the host is out of memory. */
int nt__rec_materialize(const nt__rec *r);
/* "<api> (at <site>): <msg>" (saying whose backward or composite issued r)
 * as a new error object. */
nt__errobj *nt__rec_error(const nt__rec *r, int code, const char *msg);
/* Group g failed (rc) where its outputs can only carry the error: they are
 * poisoned with it, named after g's first op ("the fused kernel of N ops
 * this op begins failed <how>: <the kernel's message>"), and its stream
 * notes it for nt_sync. */
void nt__fusion_group_failed(nt__fgroup *g, int rc, const char *how);
int nt__tensors_materialize(nt_tensor *const *t, int n);
/* Simulated readiness (sim/sim.h): before a kernel that reads in[0..nin)
 * and writes out[0..nout), nt__sim_ready_begin tells the thread's next
 * simulator kernel to start no earlier than the latest ready time of them
 * all (an in-place write waits for the previous writer too);
 * nt__sim_ready_end then stamps the outputs with the kernel's end (or, if
 * no simulator kernel ran -- the CPU backend, a fallback -- with that same
 * start bound, so readiness carries through). */
void nt__sim_ready_begin(nt_tensor *const *in, int nin, nt_tensor *const *out, int nout);
void nt__sim_ready_end(nt_tensor *const *out, int nout);
/* After r ran (worker): drops its references to big tensors no handle of the
 * host can reach any more, so their blocks go back now rather than at the
 * end of the batch (core/arena.c, stream-ordered reuse). */
void nt__rec_drop_dead(nt__rec *r);

/* ---------------- the planner (fusion/plan.c) ---------------- */

/* At nt_init / nt_shutdown (dispatcher/config.c); counters for nt_stats. */
int nt__fusion_init(void);
void nt__fusion_shutdown(void);
void nt__fusion_stats(nt_stats *out);
void nt__fusion_stats_reset(void);

/* Set by the stream worker: why the batch it hands over ends here. */
extern _Thread_local const char *nt__batch_end_reason NT_TLS_HOT;

/* The batch entry point, registered as nt__shooks.batch (init/init.c). */
void nt__fusion_run(nt__rec **recs, int n);

/* Tests: when nt__fplan_check is set, every batch's order is also computed
 * the way the planner did before its reorder passes were merged with
 * grouping (each pass over the whole batch before any kernel runs, the
 * matmul pass visiting every record); nt__fplan_mismatch counts records
 * planned in another place, nt__fplan_moved the records that reference
 * order moved (so a test can tell that it exercised the moves). */
extern bool nt__fplan_check;
extern volatile AO_t nt__fplan_mismatch, nt__fplan_moved;
/* Tests: nonzero keeps every bias-gradient sum out of the matmul kernels
 * (side sums, fusion/ir.h), to compare the kernels and bytes with and
 * without them; read by the workers, set while none plans. */
extern volatile AO_t nt__fplan_noside;
/* Tests: nonzero keeps every weight-gradient matmul out of its input
 * gradient's matmul kernel (side products, fusion/ir.h); as above. */
extern volatile AO_t nt__fplan_nopair;
/* Tests: nonzero keeps every relu out of its batch norm's kernel, forward
 * and backward (NT_FK_BN, fusion/ir.h); as above. */
extern volatile AO_t nt__fplan_nobn;

/* Counters (also in nt_stats). */
typedef struct nt__fstats {
    volatile AO_t groups, fused_ops, hits, misses, breaks, stored, elided;
    volatile AO_t foreach_kernels, foreach_programs; /* shared kernels, what they ran */
    volatile AO_t plan_ns; /* time spent deciding, not running kernels */
} nt__fstats;
extern nt__fstats nt__fst;

/* Whether op `op` can be evaluated inside an EW/ROW program. */
bool nt__fusable_ew(int op);

#endif
