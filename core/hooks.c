/* core/hooks.c - the tables through which core/ reaches the layers above
 * (core/hooks.h) and the registered backends (core/backend.h); both are
 * filled by init/init.c at the first nt_init.  Only the tables: the
 * standalone simulator library (sim/meson.build) links this file without
 * the runtime's nt_init (core/ready.c). */
#include "core/backend.h"
#include "core/hooks.h"
#include "core/simtls.h"

nt__core_hooks nt__chooks;
const nt__backend_i *nt__backends[NT_BACKEND_COUNT];
void (*nt__group_failed)(struct nt__fgroup *g, int rc, const char *how);

_Thread_local int nt__tl_core;
_Thread_local double nt__tl_sim_after;
_Thread_local double nt__tl_sim_end = -1.0;
