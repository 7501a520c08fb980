/* init/init.c - nt_init and nt_shutdown: the one place that knows every
 * module.  It registers them, once, through the explicit tables the lower
 * layers declare, then starts the runtime (dispatcher/config.c):
 *
 *   core/hooks.h          core -> autograd (free a tensor's grad state,
 *                         user ops' info and tile kernels)
 *   core/backend.h        the backends: cpu/ (reference) and neuron/
 *   streams/stream.h      stream workers -> the record executor and the
 *                         fusion planner (fusion/)
 *   dispatcher/dispatch.h the dispatcher -> autograd and amp
 *
 * Every right-hand side below is a function declared in its module's
 * header, so the compiler checks it against the table's prototype.  This
 * file sits above every module (scripts/check_layering.py); nothing else
 * names a module above itself.  The library has no weak symbols and no
 * constructors: nothing runs before nt_init. */
#include "amp/amp.h"
#include "autograd/autograd.h"
#include "core/backend.h"
#include "core/hooks.h"
#include "cpu/cpu.h"
#include "dispatcher/dispatch.h"
#include "dist/dist.h"
#include "fusion/fusion.h"
#include "fusion/graph.h"
#include "neuron/sk.h"
#include "streams/stream.h"

/* Called by nt__runtime_init under its lock, before any worker exists and
 * before `nt__inited` is published: the tables are written once, here, and
 * read without locks afterwards. */
static void register_modules(void)
{
    nt__chooks = (nt__core_hooks){
        .ag_free = nt__ag_free,
        .custom_opinfo = nt__custom_opinfo,
        .custom_kernel_def = nt__custom_kernel_def,
        .storage_dead = nt__graph_storage_dead,
    };
    nt__backends[NT_BACKEND_CPU] = &nt__cpu_backend;
    nt__backends[NT_BACKEND_SIM] = &nt__sim_backend;
    nt__shooks = (nt__stream_hooks){
        .exec = nt__exec_rec,
        .drop_dead = nt__rec_drop_dead,
        .batch = nt__fusion_run,
    };
    nt__dhooks = (nt__dispatch_hooks){
        .ag_on_dispatch = nt__ag_on_dispatch,
        .ag_grad_mode = nt__ag_grad_mode,
        .ag_on_cat = nt__ag_on_cat,
        .amp_on_call = nt__amp_on_call,
        .amp_active = nt__amp_active,
        .custom_shutdown = nt__custom_shutdown,
        .amp_enter = nt__amp_enter,
        .amp_leave = nt__amp_leave,
        .amp_cast = nt__amp_cast,
        .amp_fp8_matmul = nt__amp_fp8_matmul,
    };
    /* Every op with a CPU kernel has a simulator kernel (views have
     * neither): the CPU fallback is for what a backend refuses, not for an
     * entry forgotten in its table. */
    for (int op = 0; op < NT_OP_COUNT; op++)
        g_assert(!nt__cpu_backend.kernels[op] || nt__sim_kernel_exists(op));
}

/* Processes first (MPI, NT_COLLECTIVE_TIMEOUT, the topology): a bad setting
 * fails nt_init before anything starts.  MPI stops after the streams
 * drained, since queued collectives may still exchange data. */
NT_API int nt_init(void)
{
    if (nt__initialized())
        return 0;
    int rc = nt__dist_init();
    if (rc < 0)
        return rc;
    return nt__runtime_init(register_modules);
}

NT_API void nt_shutdown(void)
{
    nt__runtime_shutdown();
    nt__dist_shutdown();
}
