/* core/backend.h - the interface every execution backend implements.
 *
 * A backend is one constant table of functions (in the spirit of ggml's
 * ggml_backend_i): the per-op kernel table, the fused-program executor,
 * what it supports, and its life cycle and statistics.  cpu/ defines
 * nt__cpu_backend (the reference: it runs every op), neuron/ defines
 * nt__sim_backend (the simulated NeuronCore).  Backends know nothing of each
 * other or of the layers above: they see core/, this header and the fused-
 * program IR (fusion/ir.h).  The top-level registration (init/init.c) puts
 * them in nt__backends at nt_init; the dispatcher, the executor
 * (fusion/exec.c) and the fusion planner call them only through it.
 *
 * What a backend cannot run (supports() false, or a NULL kernel) goes to
 * the CPU backend -- unless NT_REQUIRE_SIM=1, which makes it a clear
 * NT_ENOTSUP naming the op at the user's call (dispatcher/dispatch.c).
 * docs/architecture.md says how to add a backend. */
#ifndef NT_CORE_BACKEND_H
#define NT_CORE_BACKEND_H

#include "core/internal.h"

struct nt__fgroup; /* a bound fused program: fusion/ir.h */

typedef struct nt__backend_i {
    const char *name; /* "cpu", "sim": messages, NT_BACKEND */
    /* At nt_init, after the arena and before the streams start: 0, or a
     * negative code with the thread's error set (nt_init fails).  May be
     * NULL.  shutdown runs at nt_shutdown after every stream stopped. */
    int (*init)(void);
    void (*shutdown)(void);
    /* Kernel of each op id (NT_OP_COUNT entries); a NULL entry is an op
     * this backend leaves to the CPU.  Read on every executed record: a
     * plain table, no call. */
    const nt__kernel_fn *kernels;
    /* Whether the backend runs built-in op `op` with parameters p (what the
     * record will carry), for the ops marked in `checked` (NT_OP_COUNT
     * entries) only: the dispatcher asks it at dispatch, and every other op
     * is decided by the kernel table alone, so the hot path makes no
     * indirect call for them.  Both NULL: the table decides every op. */
    bool (*supports)(int op, const nt__params *p);
    const bool *checked;
    /* Kernel of a registered user op (op >= NT_OP_CUSTOM_BASE), or NULL if
     * this backend has none.  May be NULL. */
    nt__kernel_fn (*custom_kernel)(int op);
    /* Runs a bound fused program; NT_ENOTSUP for a program it cannot run
     * (the planner then runs the group op by op).  May be NULL (no fusion
     * on this backend: every group runs op by op). */
    int (*run_fused)(const struct nt__fgroup *g);
    /* Foreach kernels (fusion/plan.c, "sharing a kernel"): between
     * kernel_open and kernel_close the EW and ROW programs run_fused runs
     * and the kernels of single elementwise records are one kernel, each
     * issuing what it issues alone (the same bits).  The planner gives it
     * programs that never read what another of them writes, and runs
     * nothing else in between on the thread.  g[0..n): the programs that
     * will run (g->prog NULL: the single record g->recs[0]), for a timing
     * memo; NULL (a replay): not known.  kernel_close returns 0 or the
     * kernel's error (set with nt__kerr).  Both may be NULL: each program
     * is its own kernel, and the planner counts them as one. */
    int (*kernel_open)(const struct nt__fgroup *const *g, int n);
    int (*kernel_close)(void);
    /* Adds the backend's counters to *out (nt_stats_get) / clears them
     * (nt_stats_reset).  May be NULL. */
    void (*stats_fill)(nt_stats *out);
    void (*stats_clear)(void);
} nt__backend_i;

/* The registered backends by nt__backend id, set once by the first nt_init
 * (before any stream worker starts, so workers read them without a lock);
 * NULL: not built in.  NT_BACKEND_CPU is always set. */
extern const nt__backend_i *nt__backends[NT_BACKEND_COUNT];

/* For a backend whose program of group g was reported done and then failed
 * (neuron/ew.c: a shared kernel's held tile whose kernel a later program's
 * failure stopped, with no reference values to give): poisons g's outputs
 * with rc, named after its first op ("failed <how>: ..."), and notes it on
 * its stream.  Set by the fusion engine's nt__fusion_init (fusion/plan.c
 * nt__fusion_group_failed), NULL before; backends sit below the engine and
 * reach it only through this. */
extern void (*nt__group_failed)(struct nt__fgroup *g, int rc, const char *how);

/* The kernel that runs op `op` (< NT_OP_COUNT) on backend b: b's own, or the
 * CPU's when b leaves the op to it. */
static inline nt__kernel_fn nt__backend_kernel(int b, int op)
{
    nt__kernel_fn k = nt__backends[b]->kernels[op];
    return k ? k : nt__backends[NT_BACKEND_CPU]->kernels[op];
}

/* Whether backend be runs op `op` with parameters p: whether its table has
 * the op, and for an op it marks `checked`, its supports() (a user op:
 * whether it has user kernels at all -- which one runs is found when the
 * record runs). */
static inline bool nt__backend_can(const nt__backend_i *be, int op, const nt__params *p)
{
    if (op < NT_OP_COUNT)
        return be->kernels[op] != NULL && !(be->checked && be->checked[op] && !be->supports(op, p));
    return op >= NT_OP_CUSTOM_BASE && be->custom_kernel != NULL;
}

/* A plain view of a tensor for user tile kernels (nt_tensor_view). */
void nt__tensor_view_of(nt_tensor_view *v, const nt_tensor *t);

#endif
