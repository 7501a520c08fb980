/* debug/nan.c - NT_CHECK_NAN: name the first op that makes a NaN or an Inf.
 *
 * The rule (docs/debugging.md): an op is blamed when one of its floating
 * outputs holds a NaN or an Inf while none of its floating inputs, and none
 * of its scalar arguments, does.  An op that only carries a NaN along (the
 * user's data had one, or nt_full was asked for -inf) is not blamed.  The
 * blamed op fails with NT_ENAN like any failing kernel: its outputs are
 * poisoned, the ops that read them are skipped, and the next sync that
 * touches them (or nt_sync) returns the error with the op's call site.
 *
 * Called on the thread that runs the record (a stream worker, or the user's
 * thread in deterministic mode), after its kernel succeeded.  Fused kernels
 * are checked by fusion/plan.c, which replays a group whose values hold a
 * NaN or Inf op by op through nt__exec_rec, so this check names the op. */
#include <math.h>
#include <string.h>

#include "debug/debug.h"

enum { NF_NONE = 0, NF_NAN, NF_PINF, NF_NINF };

/* Class of one element of a floating dtype, from its bits. */
static int classify(const char *p, nt_dtype dt)
{
    uint32_t u;
    switch (dt) {
    case NT_F32:
        memcpy(&u, p, 4);
        if ((u & 0x7f800000u) != 0x7f800000u)
            return NF_NONE;
        return (u & 0x007fffffu) ? NF_NAN : (u >> 31) ? NF_NINF : NF_PINF;
    case NT_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        if ((h & 0x7f80u) != 0x7f80u)
            return NF_NONE;
        return (h & 0x007fu) ? NF_NAN : (h >> 15) ? NF_NINF : NF_PINF;
    }
    case NT_F16: {
        uint16_t h;
        memcpy(&h, p, 2);
        if ((h & 0x7c00u) != 0x7c00u)
            return NF_NONE;
        return (h & 0x03ffu) ? NF_NAN : (h >> 15) ? NF_NINF : NF_PINF;
    }
    default:
        return NF_NONE;
    }
}

/* A contiguous run of n elements: index of the first non-finite one, or -1.
 * The common case (all finite) is a plain loop over the exponent bits. */
static int64_t scan_run(const char *p, nt_dtype dt, int64_t n)
{
    if (dt == NT_F32) {
        const uint32_t *u = (const uint32_t *)(const void *)p;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u)
                return i;
        return -1;
    }
    const uint16_t *h = (const uint16_t *)(const void *)p;
    uint16_t m = dt == NT_BF16 ? 0x7f80u : 0x7c00u;
    for (int64_t i = 0; i < n; i++)
        if ((h[i] & m) == m)
            return i;
    return -1;
}

/* First non-finite element of t in row-major order: its logical index and
 * class, or false.  Walks the view by its strides (in-place outputs and
 * inputs may be views). */
static bool scan(const nt_tensor *t, int64_t *index, int *kind)
{
    nt_dtype dt = (nt_dtype)t->dtype;
    if (!nt__dtype_is_float(dt))
        return false;
    int64_t n = nt__numel(t->ndim, t->shape);
    if (n <= 0)
        return false;
    size_t es = nt__dtype_size(dt);
    const char *base = (const char *)nt__tensor_data(t);
    if (nt__is_contig(t)) {
        int64_t i = scan_run(base, dt, n);
        if (i < 0)
            return false;
        if (index)
            *index = i;
        if (kind)
            *kind = classify(base + i * (int64_t)es, dt);
        return true;
    }
    int64_t idx[NT_MAX_DIMS] = {0};
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++)
            off += idx[d] * t->stride[d];
        int c = classify(base + off * (int64_t)es, dt);
        if (c != NF_NONE) {
            if (index)
                *index = k;
            if (kind)
                *kind = c;
            return true;
        }
        nt__idx_next(idx, t->ndim, t->shape);
    }
    return false;
}

bool nt__nan_any(nt_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        if (ts[i] && scan(ts[i], NULL, NULL))
            return true;
    return false;
}

/* An in-place op overwrites an input: whether that input was finite has to
 * be seen before the kernel runs.  One record at a time per thread. */
static _Thread_local struct {
    const nt__rec *r;
    bool bad;
} tl_pre;

static bool aliases_out(const nt__rec *r, const nt_tensor *t)
{
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (r->out[i] && r->out[i]->st == t->st)
            return true;
    return false;
}

void nt__nan_pre(nt__rec *r)
{
    tl_pre.r = NULL;
    if (r->type != NT_REC_OP || !(r->flags & NT_RECF_INPLACE))
        return;
    bool bad = false;
    for (int i = 0; i < NT__MAX_IN && !bad; i++)
        if (r->in[i] && aliases_out(r, r->in[i]))
            bad = scan(r->in[i], NULL, NULL);
    tl_pre.r = r;
    tl_pre.bad = bad;
}

static bool inputs_finite(const nt__rec *r)
{
    for (int i = 0; i < NT__MAX_IN; i++) {
        const nt_tensor *t = r->in[i];
        if (!t)
            continue;
        if ((r->flags & NT_RECF_INPLACE) && aliases_out(r, t)) {
            if (tl_pre.r == r && tl_pre.bad)
                return false;
            continue; /* overwritten: judged before the kernel */
        }
        if (scan(t, NULL, NULL))
            return false;
    }
    for (int i = 0; i < 3; i++)
        if (!isfinite(r->p.f[i]))
            return false;
    return true;
}

int nt__nan_check(nt__rec *r)
{
    if (r->type != NT_REC_OP)
        return 0;
    int which = -1, kind = NF_NONE;
    int64_t index = 0;
    for (int i = 0; i < NT__MAX_OUT && which < 0; i++)
        if (r->out[i] && scan(r->out[i], &index, &kind))
            which = i;
    bool blame = which >= 0 && inputs_finite(r);
    tl_pre.r = NULL;
    if (!blame)
        return 0;
    const nt_tensor *o = r->out[which];
    char shape[160], at[200] = "";
    nt__shape_str(o->ndim, o->shape, shape, sizeof shape);
    if (o->ndim >= 2) {
        /* the element's index too, row-major */
        int64_t rem = index, ix[NT_MAX_DIMS];
        for (int d = o->ndim - 1; d >= 0; d--) {
            ix[d] = o->shape[d] ? rem % o->shape[d] : 0;
            rem = o->shape[d] ? rem / o->shape[d] : 0;
        }
        char ib[160];
        snprintf(at, sizeof at, " (index %s)", nt__shape_str(o->ndim, ix, ib, sizeof ib));
    }
    static const char *const names[] = {"", "NaN", "Inf", "-Inf"};
    int nout = 0;
    for (int i = 0; i < NT__MAX_OUT; i++)
        nout += r->out[i] != NULL;
    return nt__kerr(NT_ENAN, "produced %s at element %lld%s of its %s%s %s output", names[kind],
                    (long long)index, at, nout > 1 ? (which ? "second " : "first ") : "", shape,
                    nt_dtype_name((nt_dtype)o->dtype));
}

/* nt_from_host in anomaly mode: data that already holds a NaN or Inf is
 * worth a warning, since no op will be blamed for carrying it along. */
void nt__nan_note_host(const nt_tensor *t, const nt_site *site, const char *fn)
{
    int64_t index;
    int kind;
    if (!scan(t, &index, &kind))
        return;
    char where[256];
    nt__site_format(site, where, sizeof where);
    nt__log(NT__LOG_WARN,
            "%s (at %s): the host data holds %s at element %lld; NT_CHECK_NAN blames no op "
            "for carrying it along",
            fn, where, kind == NF_NAN ? "NaN" : kind == NF_PINF ? "Inf" : "-Inf",
            (long long)index);
}
