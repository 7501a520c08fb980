/* cpu/todo.c - kernels not written yet: they fail cleanly when run. */
#include "cpu.h"

#define NT__TODO(ID, name, nin, kind, flags)                                                \
    __attribute__((weak)) int nt__cpu_##name(const nt__rec *r)                               \
    {                                                                                        \
        (void)r;                                                                             \
        return nt__kerr(NT_ENOTSUP, "the CPU kernel for '%s' is not implemented yet", #name); \
    }
NT_OPS_MISC(NT__TODO)
NT__TODO(RAND, rand, 0, 0, 0)
NT__TODO(RANDN, randn, 0, 0, 0)
