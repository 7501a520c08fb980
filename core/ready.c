/* core/ready.c - whether the library is initialised, and the implicit
 * nt_init every entry point goes through (apart from core/hooks.c so that
 * the standalone simulator library can link the tables without nt_init). */
#include "core/hooks.h"

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
