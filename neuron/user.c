/* neuron/user.c - user tile kernels (nt_op_register_kernel).
 *
 * A tile-kernel op is queued like any op (autograd/custom.c enqueues one
 * record with its id); when the record runs, this file opens a simulator
 * kernel named after the op, hands the user's kernel plain views of the
 * inputs and the output, and maps a failure to the record's error, which
 * the executor prefixes with "nt_op_call(<name>) (at <file:line>)". */
#include "neuron/sk.h"

#include "core/hooks.h"

static int user_kernel(const nt__rec *r)
{
    const nt_kernel_op_def *d =
        nt__chooks.custom_kernel_def ? nt__chooks.custom_kernel_def(r->op) : NULL;
    if (!d)
        return nt__kerr(NT_ENOTSUP, "op %d has no tile kernel", r->op);
    nt_tensor_view in[NT__MAX_IN], out;
    for (int i = 0; i < d->nin; i++)
        nt__tensor_view_of(&in[i], r->in[i]);
    nt__tensor_view_of(&out, r->out[0]);
    nt_sim_kernel *k = nt_sim_kernel_begin(d->name);
    if (!k)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a simulator kernel");
    int rc = d->kernel(k, in, d->nin, &out, d->ctx);
    nt_sim_report rep;
    int krc = nt_sim_kernel_end(k, &rep);
    if (krc)
        return nt__kerr(krc, "the tile kernel of op '%s' failed: %s", d->name, rep.message);
    if (rc)
        return nt__kerr(rc < 0 ? rc : NT_EEXEC, "the tile kernel of op '%s' returned %d (%s)",
                        d->name, rc, nt_strerror(rc < 0 ? rc : NT_EEXEC));
    return 0;
}

/* The backend's custom_kernel (core/backend.h): a tile-kernel op runs on
 * the simulator whatever the backend (it has no CPU form). */
nt__kernel_fn nt__sk_custom_kernel(int op)
{
    return nt__chooks.custom_kernel_def && nt__chooks.custom_kernel_def(op) ? user_kernel : NULL;
}
