/* dist/fp8.c - nt_fp8_recipe_update: the step's fp8 amaxes of every local
 * member of a communicator are reduced with MAX (nt_all_reduce: the rank
 * tree, so the result does not depend on how many cores or processes hold
 * the shards; MAX is exact and propagates NaN) and written back, then the
 * recipe pushes them into its histories and rescales (amp/fp8.c).  Here,
 * not in amp/, because collectives are two layers up. */
#include "dist/dist.h"

#include "amp/amp.h"

NT_API int nt_fp8_recipe_update(nt_fp8_recipe *r, struct nt_comm *comm)
{
    const char *fn = "nt_fp8_recipe_update";
    if (!nt__fp8_recipe_ok(r, fn))
        return nt_last_error();
    if (nt__fp8_collect(r, fn))
        return nt_last_error();
    if (!comm)
        return nt__fp8_apply(r, fn);
    if (nt__comm_valid(NULL, fn, comm))
        return nt_last_error();
    const int *dev;
    int n = nt__comm_local(comm, &dev);
    if (n == 0)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'comm' has no local member");
    nt_tensor **in = g_try_new0(nt_tensor *, 2 * (size_t)n);
    if (!in)
        return nt__err_hostmem(NULL, fn, "the amax list");
    nt_tensor **out = in + n;
    nt_scope *sc = nt_scope_begin();
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        nt_stream *old = nt__fp8_enter(dev[i]);
        in[i] = nt__fp8_pending(r, dev[i], fn);
        nt_stream_set_current(old);
        if (!in[i])
            rc = nt_last_error();
        else if (i && nt_numel(in[i]) != nt_numel(in[0]))
            rc = nt__err(NULL, NT_ESTATE, fn, "device %d has %lld fp8 slots, device %d %lld: "
                         "every replica must run the same matmuls",
                         dev[i], (long long)nt_numel(in[i]) / 3, dev[0],
                         (long long)nt_numel(in[0]) / 3);
    }
    if (!rc)
        rc = nt_all_reduce(comm, in, out, NT_REDUCE_MAX);
    for (int i = 0; i < n && !rc; i++) {
        nt_stream *old = nt__fp8_enter(dev[i]);
        rc = nt_copy_into(in[i], out[i]);
        nt_stream_set_current(old);
    }
    nt_scope_end(sc);
    g_free(in);
    if (rc)
        return rc;
    return nt__fp8_apply(r, fn);
}
