/* amp/autocast.c - autocast regions and the per-op precision policy.
 *
 * A region is an entry on a per-thread stack; the dispatcher calls
 * nt__amp_on_call (nt__dhooks.amp_on_call) at the end of nt__call_begin (arguments checked, shape
 * rule not yet run) for every op.  Outside a region that is one thread-local
 * load.  Inside one, the policy below may replace inputs by casts: ordinary
 * CAST ops through nt__copy_to, so they are queued, fused and recorded for
 * autograd like any op, and gradients flow back through them to f32 leaves
 * in f32.  The casts are temporaries of the call (c->tmp), released when the
 * call ends; the queued op and autograd hold their own references.
 *
 * The policy is the amp column of core/optable.h, after PyTorch's
 * autocast lists; docs/amp.md names the ops of each policy, and
 * scripts/gen_api.py --check (the api_generated test) holds it to the
 * column, so no list of ops is kept here:
 *   LOW   floating inputs are cast to the region's dtype (matmul, and so
 *         linear, whose bias nt_linear casts before the matmul so the cast
 *         does not split the matmul's epilogue kernel; attention); the
 *         product accumulates in f32 anyway (core/gemm.h) and is rounded
 *         once to the low dtype;
 *   F32   bf16/f16 inputs are cast up to f32 (reductions, norms, softmax,
 *         losses, exp/log and the other ops whose range or accuracy a low
 *         dtype would lose);
 *   KEEP  everything else runs in its inputs' dtype; binary ops, where and
 *         comparisons promote to the widest input as always.
 * Backward ops (issued inside nt_backward) are never autocast: their dtypes
 * follow the forward's, as in PyTorch.
 *
 * Casts of the same leaf are not cached across ops of a region (PyTorch
 * caches them): nt_backward marks every node of the graph it ran as freed,
 * so a cached cast reused after a backward inside the same region would
 * make the next backward fail; and a parameter is read once per forward
 * pass in the usual models.  The casts are cheap elementwise ops that fuse
 * into their neighbours' kernels.  What is cached is the other way round:
 * an optimizer step casts the f32 parameters autocast cast since the last
 * step from the values it writes, in the update's kernel, and the next
 * forward takes that cast (recorded as the same CAST node) while nothing
 * else wrote the parameter (autograd/optim.c has the rules). */
#include "amp/amp.h"

#include "autograd/autograd.h"

#include <string.h>

#define NT_AMP_MAX_DEPTH 64

static _Thread_local int tls_depth NT_TLS_HOT;
static _Thread_local int tls_suspended NT_TLS_HOT;
static _Thread_local uint8_t tls_stack[NT_AMP_MAX_DEPTH];
/* The fp8 recipe of each region (NULL: a bf16/f16 region) and the number
 * of fp8 matmuls it issued so far (amp/fp8.c: the next one's slot). */
static _Thread_local nt_fp8_recipe *tls_fp8[NT_AMP_MAX_DEPTH];
static _Thread_local int tls_fp8_next[NT_AMP_MAX_DEPTH];

/* The amp column of core/optable.h; registered user ops keep their dtypes. */
static nt__amp_policy policy_of(int op)
{
    return op >= 0 && op < NT_OP_COUNT ? nt__ops[op].amp : NT__AMP_KEEP;
}

/* If t is a permutation of a dense block (a transpose, say: every element
 * once, no gaps), sets perm so that permuting t by it gives that block in
 * memory order, and returns true. */
static bool dense_permutation(const nt_tensor *t, int *perm)
{
    int nd = t->ndim;
    for (int i = 0; i < nd; i++)
        perm[i] = i;
    /* dims by decreasing stride (insertion sort: at most 8) */
    for (int i = 1; i < nd; i++)
        for (int j = i; j > 0 && t->stride[perm[j]] > t->stride[perm[j - 1]]; j--) {
            int x = perm[j];
            perm[j] = perm[j - 1];
            perm[j - 1] = x;
        }
    int64_t want = 1;
    for (int i = nd - 1; i >= 0; i--) {
        if (t->shape[perm[i]] != 1 && t->stride[perm[i]] != want)
            return false;
        want *= t->shape[perm[i]];
    }
    return true;
}

/* src cast to dt: a view of pre, src's cast made ahead by an optimizer
 * step (autograd/optim.c), recorded as the same CAST node the queued cast
 * would have (its backward casts the gradient back to src's dtype), so
 * the graph and every gradient are those of the queued cast; only the
 * kernel is not run again. */
static nt_tensor *cast_made(const nt_site *site, const char *fn, nt_tensor *src, nt_tensor *pre,
                            nt_dtype dt)
{
    nt__call cc;
    if (!nt__call_begin(&cc, site, fn, NT_OP_CAST, 1, &src, "t"))
        return nt__call_fail(&cc);
    cc.odt[0] = dt;
    cc.ondim[0] = src->ndim;
    for (int k = 0; k < src->ndim; k++)
        cc.oshape[0][k] = src->shape[k];
    return nt__dispatch_view(
        &cc, nt__make_view(pre, pre->ndim, pre->shape, pre->stride, pre->offset, site));
}

nt_tensor *nt__amp_cast(const nt_site *site, const char *fn, nt_tensor *src, nt_dtype dt)
{
    nt_tensor *pre = NT__CFG(sr) ? NULL : nt__optim_cast_of_at(site, fn, src, dt);
    return pre ? cast_made(site, fn, src, pre, dt) : nt__copy_to(site, fn, src, dt);
}

/* Replaces input i of c by its cast to dt (a temporary of the call).  A
 * transposed (permuted) input -- linear's w^T -- is cast in its memory
 * order and permuted back: the cast then reads and writes contiguous
 * memory, and the op sees the layout it would have seen in f32. */
static int cast_input(nt__call *c, int i, nt_dtype dt)
{
    nt_tensor *in = c->in[i], *t;
    int perm[NT_MAX_DIMS], inv[NT_MAX_DIMS];
    tls_suspended++; /* the casts are never autocast themselves */
    if (!nt__is_contig(in) && dense_permutation(in, perm)) {
        for (int k = 0; k < in->ndim; k++)
            inv[perm[k]] = k;
        nt_tensor *mem = nt_permute_at(c->site, in, perm);
        nt_tensor *cast = mem ? nt__amp_cast(c->site, c->fn, nt_keep(mem), dt) : NULL;
        t = cast ? nt_permute_at(c->site, nt_keep(cast), inv) : NULL;
        if (mem)
            nt_release(mem);
        if (cast)
            nt_release(cast);
    } else {
        t = nt__amp_cast(c->site, c->fn, in, dt);
    }
    tls_suspended--;
    if (!t)
        return nt_last_error();
    nt_keep(t); /* out of any open scope: the call owns it */
    c->tmp[i] = t;
    c->in[i] = t;
    return 0;
}

static int on_call(nt__call *c)
{
    if (!tls_depth)
        return 0;
    if (tls_suspended || c->bwd_of)
        return 0;
    nt_dtype low = (nt_dtype)tls_stack[tls_depth - 1];
    if (low == NT_DTYPE_COUNT)
        return 0; /* an "autocast off" entry (nt__amp_enter) */
    nt__amp_policy pol = policy_of(c->op);
    /* nt_linear's bias add needs no rule here: nt_linear casts the bias to
     * the region's dtype before its matmul (dispatcher/api_nn.c), so the
     * add sees two low-precision inputs and keeps them. */
    if (pol == NT__AMP_KEEP)
        return 0;
    nt_dtype want = pol == NT__AMP_LOW ? low : NT_F32;
    for (int i = 0; i < c->nin; i++) {
        nt_tensor *t = c->in[i];
        /* f64 inputs are never cast (PyTorch's autocast leaves double alone),
         * nor fp8 ones (nt_matmul_fp8's operands; other ops refuse fp8) */
        if (!t || t->dtype == want || !nt__dtype_is_float((nt_dtype)t->dtype) ||
            t->dtype == NT_F64 || nt__dtype_is_fp8((nt_dtype)t->dtype) || c->tmp[i])
            continue;
        int rc = cast_input(c, i, want);
        if (rc)
            return rc;
    }
    return 0;
}

int nt__amp_on_call(nt__call *c) { return on_call(c); }

nt_dtype nt__amp_active(void)
{
    if (!tls_depth || tls_suspended || nt__tls_bwd_of)
        return NT_DTYPE_COUNT;
    return (nt_dtype)tls_stack[tls_depth - 1];
}

void nt__amp_suspend(void) { tls_suspended++; }
void nt__amp_resume(void)
{
    if (tls_suspended > 0)
        tls_suspended--;
}

NT_API int nt_autocast_begin(nt_dtype dt)
{
    const char *fn = "nt_autocast_begin";
    if (!nt__ensure_init())
        return nt_last_error();
    if (dt != NT_BF16 && dt != NT_F16)
        return nt__err(NULL, NT_EDTYPE, fn,
                       "argument 'dt' is %s; autocast runs in bf16 or f16 (NT_BF16, NT_F16)",
                       (unsigned)dt < NT_DTYPE_COUNT ? nt_dtype_name(dt) : "not an nt_dtype");
    if (tls_depth >= NT_AMP_MAX_DEPTH)
        return nt__err(NULL, NT_ESTATE, fn,
                       "autocast regions are nested %d deep on this thread (the limit); is an "
                       "nt_autocast_end missing?", tls_depth);
    tls_fp8[tls_depth] = NULL;
    tls_stack[tls_depth++] = (uint8_t)dt;
    return 0;
}

int nt__amp_push_fp8(nt_fp8_recipe *r)
{
    if (tls_depth >= NT_AMP_MAX_DEPTH)
        return nt__err(NULL, NT_ESTATE, "nt_fp8_autocast_begin",
                       "autocast regions are nested %d deep on this thread (the limit); is an "
                       "nt_autocast_end missing?", tls_depth);
    tls_fp8[tls_depth] = r;
    tls_fp8_next[tls_depth] = 0;
    tls_stack[tls_depth++] = (uint8_t)NT_BF16;
    return 0;
}

nt_fp8_recipe *nt__amp_fp8_region(int **next)
{
    if (!tls_depth || tls_suspended || nt__tls_bwd_of || !tls_fp8[tls_depth - 1])
        return NULL;
    *next = &tls_fp8_next[tls_depth - 1];
    return tls_fp8[tls_depth - 1];
}

nt_fp8_recipe *nt__amp_fp8_top(void) { return tls_depth ? tls_fp8[tls_depth - 1] : NULL; }

int nt__amp_enter(nt_dtype dt)
{
    if (tls_depth >= NT_AMP_MAX_DEPTH)
        return nt__err(NULL, NT_ESTATE, "nt_checkpoint",
                       "autocast regions are nested %d deep on this thread (the limit)",
                       tls_depth);
    tls_fp8[tls_depth] = NULL;
    tls_stack[tls_depth++] = (uint8_t)dt; /* NT_DTYPE_COUNT: off */
    return 0;
}

void nt__amp_leave(void)
{
    if (tls_depth > 0)
        tls_depth--;
}

NT_API int nt_autocast_end(void)
{
    if (tls_depth == 0)
        return nt__err(NULL, NT_ESTATE, "nt_autocast_end",
                       "no autocast region is open on this thread");
    tls_depth--;
    return 0;
}

NT_API nt_dtype nt_autocast_dtype(void)
{
    return tls_depth ? (nt_dtype)tls_stack[tls_depth - 1] : NT_DTYPE_COUNT;
}
