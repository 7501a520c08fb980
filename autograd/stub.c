/* autograd/stub.c - autograd entry points before the tape lands: each returns
 * NT_ENOTSUP with a clear message (see the autograd issue). */
#include "dispatch.h"

static int unsupported(const nt_site *site, const char *fn)
{
    return nt__err(site, NT_ENOTSUP, fn, "autograd is not available in this build yet");
}

NT_API int nt_set_requires_grad(nt_tensor *t, bool rg)
{
    (void)rg;
    if (!nt__check_arg(NULL, "nt_set_requires_grad", "t", t))
        return nt_last_error();
    return unsupported(NULL, "nt_set_requires_grad");
}
NT_API bool nt_requires_grad(nt_tensor *t) { (void)t; return false; }
NT_API int nt_backward_ex_at(const nt_site *site, nt_tensor *loss, bool retain)
{
    (void)loss, (void)retain;
    return unsupported(site, "nt_backward");
}
NT_API int nt_backward_at(const nt_site *site, nt_tensor *loss)
{
    return nt_backward_ex_at(site, loss, false);
}
NT_API int nt_backward(nt_tensor *loss) { return nt_backward_at(NT_RA_SITE, loss); }
NT_API int nt_backward_ex(nt_tensor *loss, bool retain)
{
    return nt_backward_ex_at(NT_RA_SITE, loss, retain);
}
NT_API nt_tensor *nt_grad(nt_tensor *t)
{
    (void)t;
    unsupported(NULL, "nt_grad");
    return NULL;
}
NT_API int nt_zero_grad(nt_tensor *t) { (void)t; return unsupported(NULL, "nt_zero_grad"); }
NT_API void nt_no_grad_begin(void) {}
NT_API void nt_no_grad_end(void) {}
NT_API bool nt_grad_enabled(void) { return false; }
