/* dist/dist.h - collectives across simulated NeuronCores and processes
 * (internal; the public API is in include/ntensor.h, the design in
 * docs/collectives.md).
 *
 *   tree.c  the rank-tree reduction: the one order in which every
 *           collective combines its members' values
 *   cost.c  the topologies and the cost model (ring / hierarchical), as a
 *           closed formula and as a schedule of per-step transfers
 *   mpi.c   processes: MPI bootstrap at nt_init, the byte exchange polled
 *           against NT_COLLECTIVE_TIMEOUT (a stub without MPI)
 *   comm.c  communicators and the public collective ops
 *   mesh.c  the device mesh: named dimensions, a communicator per group
 *   ddp.c   data parallelism and ZeRO stages 1-3 (docs/ddp.md,
 *           docs/sharding.md)
 *   tp.c    tensor parallelism: differentiable collectives and the
 *           tensor-parallel layers (docs/parallel.md)
 *   fp8.c   nt_fp8_recipe_update: fp8 amaxes reduced with MAX over a
 *           communicator before the recipe's rescale (amp/fp8.c)
 *   moe.c   mixture of experts: the grouped matmul, the router,
 *           all_to_all with counts on the device, the expert-parallel
 *           MoE MLP (docs/parallel.md) */
#ifndef NT_DIST_DIST_H
#define NT_DIST_DIST_H

#include "core/internal.h"

/* ------------------------------------------------------------------ */
/* The rank tree (tree.c)                                             */
/* ------------------------------------------------------------------ */

/* Combines n contiguous buffers vals[0..n-1] of `count` elements of dt into
 * dst (which may be one of vals) in the rank tree: level by level, adjacent
 * pairs (v[2i] op v[2i+1]) in index order, an odd last one carried up
 * unchanged, until one is left.  Floating dtypes combine in f32 and round
 * once to dt at the end; MEAN is the SUM times (float)(1/n), one rounding.
 * MAX propagates NaN.  Integer dtypes: SUM wraps (two's complement, like
 * nt_add), MAX is exact, MEAN is refused (NT_EDTYPE, the caller checks).
 * Returns 0, or NT_EHOSTMEM when the scratch cannot be allocated (dst is
 * then untouched).  Thread-safe; allocates its own scratch. */
int nt__tree_reduce(void *dst, const void *const *vals, int n, int64_t count, nt_dtype dt,
                    nt_reduce_op op);
/* The name of op ("sum", "mean", "max"), or NULL if op is not one. */
const char *nt__reduce_op_name(int op);

/* ------------------------------------------------------------------ */
/* Topologies and the cost model (cost.c)                             */
/* ------------------------------------------------------------------ */

typedef struct nt__topology {
    char name[32];          /* "trn1.32xlarge" */
    int cores_per_instance; /* ranks one NeuronLink domain joins */
    double link_gbps;       /* NeuronLink: GB/s each way per core-to-core ring hop */
    double link_latency_us; /* per hop and step */
    double efa_gbps;        /* EFA: GB/s each way per instance */
    double efa_latency_us;  /* per message between instances */
    double reduce_gbps;     /* the reduction's own rate (bytes of one operand / s) */
} nt__topology;

/* Reads NT_SIM_TOPOLOGY and the overrides NT_SIM_LINK_GBPS,
 * NT_SIM_LINK_LATENCY_US, NT_SIM_EFA_GBPS, NT_SIM_EFA_LATENCY_US into *t.
 * A bad value: NT_EINVAL naming the variable, the value and what was
 * expected (t then holds the default topology).  Called at nt_init. */
int nt__topology_load(nt__topology *t);
/* Fills *t with the named topology's parameters (no overrides); false if
 * no topology has that name. */
bool nt__topology_named(const char *name, nt__topology *t);
/* The topology nt_init loaded (the default before nt_init). */
const nt__topology *nt__topology_current(void);

typedef enum nt__coll_kind {
    NT__COLL_ALL_REDUCE = 0,
    NT__COLL_ALL_GATHER,
    NT__COLL_REDUCE_SCATTER,
    NT__COLL_BROADCAST,
} nt__coll_kind;

/* The model's closed formula: simulated ns a collective of `kind` over n
 * ranks takes, `bytes` being the size of the full result (all-reduce,
 * broadcast: the tensor; all-gather: the gathered tensor; reduce-scatter:
 * the input), when every rank starts at once.  Ring inside one instance
 * (n <= cores_per_instance); hierarchical across instances.  n = 1: 0. */
double nt__coll_formula_ns(const nt__topology *t, nt__coll_kind kind, int n, double bytes);

/* The schedule: the same algorithm as a sequence of per-step transfers and
 * reductions, each booked on its rank's timeline: a step of rank r starts
 * when r finished its previous step and the data it receives has arrived.
 * start[r] is when rank r's input is ready (simulated ns); end[r] gets
 * when rank r's output is (n = 1: end = start).  Returns the number of
 * steps booked per rank.  Thread-safe. */
int nt__coll_schedule(const nt__topology *t, nt__coll_kind kind, int n, double bytes,
                      const double *start, double *end);

/* Every core's collective engine free again (comm.c; nt_init). */
void nt__coll_reset_clocks(void);

/* ------------------------------------------------------------------ */
/* Processes (mpi.c)                                                  */
/* ------------------------------------------------------------------ */

/* At nt_init (after the runtime started): MPI_Init_thread when the process
 * was launched by mpirun (OMPI_COMM_WORLD_SIZE / PMI_SIZE set) and MPI is
 * built in; reads NT_COLLECTIVE_TIMEOUT and the topology.  Idempotent. */
int nt__dist_init(void);
/* At nt_shutdown (after the streams drained): MPI_Finalize. */
void nt__dist_shutdown(void);
/* NT_COLLECTIVE_TIMEOUT in seconds (default 60). */
double nt__coll_timeout_s(void);
/* True when built with MPI and running under it. */
bool nt__mpi_active(void);
/* Bumped by every nt_shutdown: communicators of an earlier session are
 * refused. */
uint64_t nt__dist_generation(void);

/* A process-level communicator (a duplicate of MPI_COMM_WORLD), or NULL
 * without MPI. */
typedef struct nt__pcomm nt__pcomm;
/* Collective over every process: makes *out (NULL when there is one
 * process) and fills counts[p] with each process's `mine` (counts has
 * nt_process_count() entries).  Polled against the timeout: a silent peer
 * is NT_ETIMEDOUT with errbuf filled, never a hang. */
int nt__pcomm_create(int mine, int *counts, nt__pcomm **out, char *errbuf, size_t errlen);
void nt__pcomm_destroy(nt__pcomm *pc);
/* All-gather of byte blocks: every process contributes `len[me]` bytes at
 * send, and recv gets process p's block at recv + off[p] (len[p] bytes).
 * Nonblocking sends and receives polled against NT_COLLECTIVE_TIMEOUT; a
 * dead or silent peer: NT_ETIMEDOUT or NT_ECOMM with errbuf saying which
 * process and `what` was being done ("exchanging the inputs").  Thread-safe (calls are serialised). */
int nt__pcomm_allgather(nt__pcomm *pc, const void *send, void *recv, const size_t *len,
                        const size_t *off, const char *what, char *errbuf, size_t errlen);

/* A communicator of this process's devices[0..n) alone, even under MPI
 * (global ranks 0..n-1, no exchange with other processes): a mesh's
 * sub-group that lies inside one process (mesh.c).  Errors as
 * nt_comm_create. */
nt_comm *nt__comm_create_local(const int *devices, int n);
/* ------------------------------------------------------------------ */
/* Communicators, for dist/tp.c and dist/fp8.c (comm.c)             */
/* ------------------------------------------------------------------ */

/* 0 when cm is a live communicator of this session, else the error
 * (naming fn and argument 'c'). */
int nt__comm_valid(const nt_site *site, const char *fn, const nt_comm *cm);
/* The number of local members; *devs their devices (local rank order). */
int nt__comm_local(const nt_comm *cm, const int **devs);

/* The group calls' common pieces (dist/tp.c; used by dist/tp.c and
 * dist/moe.c).  nt__group_end ends the call's scope s: with rc 0 and every
 * out[0..n) non-NULL they move to the caller's scope, else out[0..n) are
 * NULL and the error is returned.  nt__group_tree_sum sums v[0..n) in the
 * rank tree's order (adjacent pairs level by level, an odd last one
 * carried; dist/tree.c), overwriting v. */
int nt__group_end(nt_scope *s, const char *fn, int rc, nt_tensor **out, int n);
nt_tensor *nt__group_tree_sum(const nt_site *site, nt_tensor **v, int n);
/* A group op's saved inputs, each member's x and w (a linear's, the MoE
 * gate's): nt__group_save_pairs saves xs[i] and ws[i] (nt__save) into x[i]
 * and w[i] for i < n, 0 or NT_EHOSTMEM naming fn (what it saved stays for
 * the release); nt__group_release_pairs releases those that are set. */
int nt__group_save_pairs(const nt_site *site, const char *fn, int n, nt_tensor *const *xs,
                         nt_tensor *const *ws, nt_tensor **x, nt_tensor **w);
void nt__group_release_pairs(int n, nt_tensor **x, nt_tensor **w);

#endif
