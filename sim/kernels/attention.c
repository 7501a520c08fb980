#include "sim/kernels/sk.h"
int nt__sk_sdpa(const nt__rec *r) { (void)r; return nt__kerr(NT_ENOTSUP, "todo"); }
int nt__sk_sdpa_bwd(const nt__rec *r) { (void)r; return nt__kerr(NT_ENOTSUP, "todo"); }
