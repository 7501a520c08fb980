/* core/hooks.c - the tables through which core/ reaches the layers above
 * (core/hooks.h) and the registered backends (core/backend.h); both are
 * filled by init/init.c at the first nt_init. */
#include "core/backend.h"
#include "core/hooks.h"

nt__core_hooks nt__chooks;
const nt__backend_i *nt__backends[NT_BACKEND_COUNT];
volatile AO_t nt__inited;

bool nt__initialized(void) { return AO_load_acquire(&nt__inited) != 0; }

/* Every entry point initialises implicitly through the public nt_init, the
 * library's top (init/init.c): core/ names no module above it. */
bool nt__ensure_init(void)
{
    if (AO_load_acquire(&nt__inited))
        return true;
    return nt_init() == 0;
}
