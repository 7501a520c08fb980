/* dispatcher/api_pool.c - 2-d pooling of NCHW tensors (issue 33):
 * max_pool2d (with PyTorch's flat indices), avg_pool2d and
 * adaptive_avg_pool2d, with PyTorch 1.13's arguments and window rules.
 *
 * Each is a composite of existing ops, so every backend, mode and autograd
 * have it through them, and its bits are the composite's (docs/ops.md,
 * "Pooling (NCHW)" gives every step):
 *   1. the windows as [N, C, K, L] (slot k of every window in row k, whole
 *      rows): strided slices of x padded (-inf for max, 0 for avg) stacked
 *      in slot order, or one permuting copy when the windows tile the
 *      plane; adaptive windows of unequal sizes through a host table of
 *      flat positions (nt_index_select, a zero after the plane for the
 *      slots past a window);
 *   2. max: the maximum over K, then the first slot inside the input that
 *      holds it (a chain of nt_where from the last slot down) or, in a
 *      window with a NaN, the last NaN (PyTorch's rule): its value (x's
 *      bits; the gradient goes to it alone) and its flat position;
 *      avg: the sum over K in slot order from +0 (K <= POOL_SEQ_MAX: one
 *      nt_add per slot; larger windows: nt_sum's canonical order, then
 *      + 0), divided by the window's divisor (adaptive: by kh, then by kw).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "dispatcher/dispatch.h"

/* Windows of up to this many slots are summed slot by slot (PyTorch's
 * order, so its bits); larger ones by the canonical reduction. */
#define POOL_SEQ_MAX 25

typedef struct pgeo {
    int64_t N, C, H, W, OH, OW;
    int64_t k[2], s[2], p[2], d[2];
    bool batched;
} pgeo;

typedef struct pctx {
    const nt_site *site;
    const char *fn;
    nt_scope *sc;
} pctx;

/* The input: a float tensor [N, C, H, W] or [C, H, W] with C, H, W >= 1. */
static bool check_input(const pctx *P, nt_tensor *x, pgeo *g)
{
    if (!nt__ensure_init() || !nt__check_arg(P->site, P->fn, "input", x))
        return false;
    if (!nt__dtype_is_float((nt_dtype)x->dtype)) {
        nt__err(P->site, NT_EDTYPE, P->fn, "argument 'input' has dtype %s; expected f32, bf16 or f16",
                nt_dtype_name((nt_dtype)x->dtype));
        return false;
    }
    char sb[128];
    if (x->ndim != 3 && x->ndim != 4) {
        nt__err(P->site, NT_ESHAPE, P->fn,
                "argument 'input' has shape %s; expected 3 dims [C, H, W] or 4 [N, C, H, W]",
                nt__shape_str(x->ndim, x->shape, sb, sizeof sb));
        return false;
    }
    int o = x->ndim - 3;
    g->batched = x->ndim == 4;
    g->N = g->batched ? x->shape[0] : 1;
    g->C = x->shape[o], g->H = x->shape[o + 1], g->W = x->shape[o + 2];
    if (g->C < 1 || g->H < 1 || g->W < 1) {
        nt__err(P->site, NT_ESHAPE, P->fn,
                "argument 'input' has shape %s; expected C, H and W of at least 1",
                nt__shape_str(x->ndim, x->shape, sb, sizeof sb));
        return false;
    }
    return true;
}

/* A pair argument: v (NULL gives dflt, or `from` when dflt < 0), each >= lo. */
static bool pair_arg(const pctx *P, const char *name, const int64_t *v, int64_t dflt,
                     const int64_t *from, int64_t lo, int64_t out[2])
{
    if (!v && dflt == -2) {
        nt__err(P->site, NT_EINVAL, P->fn, "argument '%s' is NULL; expected 2 values", name);
        return false;
    }
    for (int i = 0; i < 2; i++) {
        out[i] = v ? v[i] : dflt >= 0 ? dflt : from[i];
        if (out[i] < lo) {
            nt__err(P->site, NT_EINVAL, P->fn, "argument '%s' is [%lld, %lld]; expected values >= %lld",
                    name, (long long)out[0], (long long)(v ? v[1] : out[0]), (long long)lo);
            return false;
        }
    }
    return true;
}

/* PyTorch's pooling_output_shape. */
static int64_t pool_out(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil_mode)
{
    int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (o - 1) * s >= in + p)
        o--;
    return o;
}

/* The first input row (column) a window starting at `st` reads, or -1. */
static int64_t first_in(int64_t st, int64_t d, int64_t k, int64_t in)
{
    for (int64_t a = 0; a < k; a++)
        if (st + a * d >= 0 && st + a * d < in)
            return st + a * d;
    return -1;
}

/* Checks kernel/stride/padding/dilation and the output size into g. */
static bool check_window(const pctx *P, pgeo *g, const int64_t *kernel, const int64_t *stride,
                         const int64_t *padding, const int64_t *dilation, bool ceil_mode)
{
    if (!pair_arg(P, "kernel_size", kernel, -2, NULL, 1, g->k) ||
        !pair_arg(P, "stride", stride, -1, g->k, 1, g->s) ||
        !pair_arg(P, "padding", padding, 0, NULL, 0, g->p) ||
        !pair_arg(P, "dilation", dilation, 1, NULL, 1, g->d))
        return false;
    if (g->p[0] > g->k[0] / 2 || g->p[1] > g->k[1] / 2) {
        nt__err(P->site, NT_EINVAL, P->fn,
                "argument 'padding' is [%lld, %lld]; expected at most half of kernel_size [%lld, %lld]",
                (long long)g->p[0], (long long)g->p[1], (long long)g->k[0], (long long)g->k[1]);
        return false;
    }
    int64_t in[2] = {g->H, g->W}, out[2];
    for (int i = 0; i < 2; i++) {
        out[i] = pool_out(in[i], g->k[i], g->p[i], g->s[i], g->d[i], ceil_mode);
        if (out[i] < 1) {
            nt__err(P->site, NT_ESHAPE, P->fn,
                    "argument 'input' of size %lld x %lld gives an output of %lld x %lld (kernel_size, "
                    "padding, dilation); expected at least 1 x 1",
                    (long long)g->H, (long long)g->W,
                    (long long)pool_out(g->H, g->k[0], g->p[0], g->s[0], g->d[0], ceil_mode),
                    (long long)pool_out(g->W, g->k[1], g->p[1], g->s[1], g->d[1], ceil_mode));
            return false;
        }
    }
    g->OH = out[0], g->OW = out[1];
    for (int i = 0; i < 2; i++)
        for (int64_t o = 0; o < out[i]; o++)
            if (first_in(o * g->s[i] - g->p[i], g->d[i], g->k[i], in[i]) < 0) {
                nt__err(P->site, NT_ESHAPE, P->fn,
                        "window %lld along %s lies entirely in the padding (argument 'dilation' "
                        "[%lld, %lld]); expected every window to read the input",
                        (long long)o, i ? "W" : "H", (long long)g->d[0], (long long)g->d[1]);
                return false;
            }
    return true;
}

static bool open_scope(pctx *P)
{
    P->sc = nt_scope_begin();
    if (!P->sc)
        nt__err_hostmem(P->site, P->fn, "a scope");
    return P->sc != NULL;
}

/* g = x's planes read through the table T (K x L slots): [N, C, K, L].
 * pad_zero: append a zero after each plane (slot H*W). */
static nt_tensor *gather_windows(const pctx *P, nt_tensor *x, const pgeo *g, nt_tensor *T,
                                 int64_t K, bool pad_zero)
{
    int64_t HW = g->H * g->W;
    nt_tensor *xf = nt_reshape_at(P->site, x, 3, (int64_t[]){g->N, g->C, HW});
    if (pad_zero && xf) {
        nt_tensor *z = nt_full_at(P->site, (nt_dtype)x->dtype, 3, (int64_t[]){g->N, g->C, 1}, 0.0);
        xf = z ? nt_cat_at(P->site, (nt_tensor *const[]){xf, z}, 2, 2) : NULL;
    }
    nt_tensor *w = xf && T ? nt_index_select_at(P->site, xf, 2, T) : NULL;
    return w ? nt_reshape_at(P->site, w, 4, (int64_t[]){g->N, g->C, K, g->OH * g->OW}) : NULL;
}

/* Non-overlapping windows that tile the (cropped) plane, no padding, no
 * dilation.  The windows are then one permuting copy of the plane seen as
 * [N, C, OH, kh, OW, kw]; and max_pool2d without indices and without a
 * gradient to record is nt_max over dim 5, then dim 3 (the simulator's
 * short-dim reduction: 50.7 us simulated for 2x2 on [16, 64, 28, 28],
 * against about 1 ms for the general path; nt_max's own backward is far
 * slower on the simulator than the general path's, so it is not used for
 * training).  The same values: the window maximum (a NaN: canonical). */
static bool max_tiles(const pgeo *g)
{
    return g->p[0] == 0 && g->p[1] == 0 && g->d[0] == 1 && g->d[1] == 1 && g->s[0] == g->k[0] &&
           g->s[1] == g->k[1] && g->OH * g->k[0] <= g->H && g->OW * g->k[1] <= g->W;
}

/* The (cropped) plane seen as [N, C, OH, k0, OW, k1]. */
static nt_tensor *tiles(const pctx *P, nt_tensor *x, const pgeo *g)
{
    int o = x->ndim - 3;
    nt_tensor *xc = x;
    if (g->OH * g->k[0] < g->H)
        xc = nt_slice_at(P->site, xc, o + 1, 0, g->OH * g->k[0], 1);
    if (xc && g->OW * g->k[1] < g->W)
        xc = nt_slice_at(P->site, xc, o + 2, 0, g->OW * g->k[1], 1);
    return xc ? nt_reshape_at(P->site, xc, 6, (int64_t[]){g->N, g->C, g->OH, g->k[0], g->OW, g->k[1]})
              : NULL;
}

/* x [N, C, H, W] padded with v along dim d: `lo` before, `hi` after. */
static nt_tensor *pad_dim(const pctx *P, nt_tensor *x, int d, int64_t lo, int64_t hi, double v)
{
    nt_tensor *parts[3];
    int n = 0;
    int64_t sh[4];
    for (int i = 0; i < 4; i++)
        sh[i] = x->shape[i];
    if (lo > 0)
        sh[d] = lo, parts[n++] = nt_full_at(P->site, (nt_dtype)x->dtype, 4, sh, v);
    parts[n++] = x;
    if (hi > 0)
        sh[d] = hi, parts[n++] = nt_full_at(P->site, (nt_dtype)x->dtype, 4, sh, v);
    for (int i = 0; i < n; i++)
        if (!parts[i])
            return NULL;
    return n == 1 ? x : nt_cat_at(P->site, parts, n, d);
}

/* The windows of a strided pool as [N, C, K, L]: x padded with v (p before,
 * as much as the last window needs after), slot (a, b) the slice starting
 * at (a d0, b d1) with steps (s0, s1), the slots stacked in slot order. */
static nt_tensor *stack_windows(const pctx *P, nt_tensor *x, const pgeo *g, double v)
{
    int64_t K = g->k[0] * g->k[1], L = g->OH * g->OW, in[2] = {g->H, g->W}, ext[2];
    if (max_tiles(g)) { /* tiles: one permuting copy of the plane, the same values */
        nt_tensor *r = tiles(P, x, g);
        r = r ? nt_permute_at(P->site, r, (const int[]){0, 1, 3, 5, 2, 4}) : NULL;
        return r ? nt_reshape_at(P->site, r, 4, (int64_t[]){g->N, g->C, K, L}) : NULL;
    }
    nt_tensor *xp = nt_reshape_at(P->site, x, 4, (int64_t[]){g->N, g->C, g->H, g->W});
    for (int i = 0; i < 2 && xp; i++) {
        ext[i] = (i ? g->OW - 1 : g->OH - 1) * g->s[i] + (g->k[i] - 1) * g->d[i] + 1;
        int64_t hi = ext[i] - in[i] - g->p[i];
        xp = pad_dim(P, xp, 2 + i, g->p[i], hi > 0 ? hi : 0, v);
    }
    nt_tensor **sl = xp ? malloc(sizeof(nt_tensor *) * (size_t)K) : NULL;
    if (xp && !sl)
        nt__err_hostmem(P->site, P->fn, "the window list");
    nt_tensor *w = sl ? xp : NULL;
    for (int64_t a = 0; w && a < g->k[0]; a++)
        for (int64_t b = 0; w && b < g->k[1]; b++) {
            int64_t h0 = a * g->d[0], w0 = b * g->d[1];
            nt_tensor *t = nt_slice_at(P->site, xp, 2, h0, h0 + (g->OH - 1) * g->s[0] + 1, g->s[0]);
            t = t ? nt_slice_at(P->site, t, 3, w0, w0 + (g->OW - 1) * g->s[1] + 1, g->s[1]) : NULL;
            t = t ? nt_reshape_at(P->site, t, 4, (int64_t[]){g->N, g->C, 1, L}) : NULL;
            sl[a * g->k[1] + b] = t;
            w = sl[a * g->k[1] + b];
        }
    w = w ? (K == 1 ? sl[0] : nt_cat_at(P->site, sl, (int)K, 2)) : NULL;
    free(sl);
    return w;
}

/* The tables below (flat positions, masks, divisors) depend on the shapes
 * alone; they are made by device ops, never from host data, so a captured
 * program makes them again on each replay (nt_graph_capture_end refuses
 * host data read by the program).  Integers are f32 (exact below 2^24). */

/* f32 [n]: i * scale + off. */
static nt_tensor *ramp(const pctx *P, int64_t n, double scale, double off)
{
    nt_tensor *t = nt_arange_at(P->site, NT_F32, 0.0, (double)n, 1.0);
    t = t ? nt__scalar(P->site, P->fn, NT_OP_MUL_SCALAR, t, scale, 0) : NULL;
    return t ? nt__scalar(P->site, P->fn, NT_OP_ADD_SCALAR, t, off, 0) : NULL;
}

/* a [n] as a column [n, 1]. */
static nt_tensor *column(const pctx *P, nt_tensor *a)
{
    return a ? nt_reshape_at(P->site, a, 2, (int64_t[]){a->shape[0], 1}) : NULL;
}

/* op(a[i], b[j]) for a [OH], b [OW]: [OH, OW]. */
static nt_tensor *outer(const pctx *P, int op, nt_tensor *a, nt_tensor *b)
{
    a = column(P, a);
    return a && b ? nt__binary(P->site, P->fn, op, a, b) : NULL;
}

/* The 0-d f32 constant v. */
static nt_tensor *cst(const pctx *P, double v) { return nt_full_at(P->site, NT_F32, 0, NULL, v); }

/* u8 [n]: lo <= t[i] < hi. */
static nt_tensor *in_range(const pctx *P, nt_tensor *t, double lo, double hi)
{
    nt_tensor *a = t ? nt__binary(P->site, P->fn, NT_OP_GE, t, cst(P, lo)) : NULL;
    nt_tensor *b = a ? nt__binary(P->site, P->fn, NT_OP_LT, t, cst(P, hi)) : NULL;
    return b ? nt__binary(P->site, P->fn, NT_OP_MUL, a, b) : NULL;
}

/* f32 [OH, OW] -> [1, L] (i32 when ints). */
static nt_tensor *as_row(const pctx *P, nt_tensor *t, const pgeo *g, bool ints)
{
    t = t && ints ? nt_cast_at(P->site, t, NT_I32) : t;
    return t ? nt_reshape_at(P->site, t, 2, (int64_t[]){1, g->OH * g->OW}) : NULL;
}

/* Whether slot i of every window along dim d (0 rows, 1 columns) is inside. */
static bool all_inside(const pgeo *g, int d, int64_t i)
{
    int64_t n = d ? g->OW : g->OH, in = d ? g->W : g->H;
    int64_t lo = i * g->d[d] - g->p[d], hi = (n - 1) * g->s[d] + lo;
    return lo >= 0 && hi < in;
}

/* u8 [K, L]: slot k of window l is inside the input; NULL (no error) when
 * every slot of every window is. */
static nt_tensor *inside_mask(const pctx *P, const pgeo *g, bool *ok)
{
    int64_t K = g->k[0] * g->k[1], L = g->OH * g->OW;
    bool any = false;
    for (int64_t a = 0; a < g->k[0]; a++)
        any |= !all_inside(g, 0, a);
    for (int64_t b = 0; b < g->k[1]; b++)
        any |= !all_inside(g, 1, b);
    *ok = true;
    if (!any)
        return NULL;
    nt_tensor **rows = malloc(sizeof(nt_tensor *) * (size_t)K), *m = NULL;
    *ok = rows != NULL;
    if (!rows)
        nt__err_hostmem(P->site, P->fn, "the mask list");
    for (int64_t a = 0; *ok && a < g->k[0]; a++)
        for (int64_t b = 0; *ok && b < g->k[1]; b++) {
            nt_tensor *r = in_range(P, ramp(P, g->OH, (double)g->s[0], (double)(a * g->d[0] - g->p[0])),
                                    0.0, (double)g->H);
            nt_tensor *c = in_range(P, ramp(P, g->OW, (double)g->s[1], (double)(b * g->d[1] - g->p[1])),
                                    0.0, (double)g->W);
            m = r && c ? outer(P, NT_OP_MUL, r, c) : NULL;
            rows[a * g->k[1] + b] = m = as_row(P, m, g, false);
            *ok = m != NULL;
        }
    m = *ok ? nt_cat_at(P->site, rows, (int)K, 0) : NULL;
    *ok = m != NULL;
    free(rows);
    (void)L;
    return m;
}

/* [N, C, 1, L] -> the caller's layout [N, C, OH, OW] or [C, OH, OW]. */
static nt_tensor *to_out(const pctx *P, nt_tensor *t, const pgeo *g)
{
    if (!t)
        return NULL;
    if (g->batched)
        return nt_reshape_at(P->site, t, 4, (int64_t[]){g->N, g->C, g->OH, g->OW});
    return nt_reshape_at(P->site, t, 3, (int64_t[]){g->C, g->OH, g->OW});
}

/* Ends the composite: keeps *a (and *b), hands them to the caller. */
static int pool_end(pctx *P, nt_tensor **a, nt_tensor **b)
{
    bool ok = *a && (!b || *b);
    if (ok) {
        nt_keep(*a);
        if (b)
            nt_keep(*b);
    } else {
        nt__err_within(P->fn);
    }
    nt_scope_end(P->sc);
    if (!ok) {
        *a = NULL;
        if (b)
            *b = NULL;
        return nt__err_or(NT_EINVAL);
    }
    *a = nt__scope_adopt(*a, P->fn);
    if (b)
        *b = nt__scope_adopt(*b, P->fn);
    return *a && (!b || *b) ? 0 : nt_last_error();
}

/* f32 [K, 1]: 0, 1, ..., K - 1. */
static nt_tensor *slot_numbers(const pctx *P, int64_t K)
{
    return column(P, ramp(P, K, 1.0, 0.0));
}

/* The slot PyTorch's scan (val > maxval || isnan(val)) picks in each
 * window, f32 [N, C, 1, L] (no gradient): the first hit (a where chain
 * from the last slot down) or, where m is NaN, the last NaN (a chain from
 * slot 0 up). */
static nt_tensor *pick_slot(const pctx *P, int64_t K, nt_tensor *hit, nt_tensor *isn, nt_tensor *m)
{
    nt_tensor *s1 = cst(P, (double)(K - 1)), *s2 = cst(P, 0.0);
    for (int64_t k = K - 2; s1 && k >= 0; k--)
        s1 = nt_where_at(P->site, nt_slice_at(P->site, hit, 2, k, k + 1, 1), cst(P, (double)k), s1);
    for (int64_t k = 1; s2 && k < K; k++)
        s2 = nt_where_at(P->site, nt_slice_at(P->site, isn, 2, k, k + 1, 1), cst(P, (double)k), s2);
    nt_tensor *mn = s1 && s2 ? nt__binary(P->site, P->fn, NT_OP_NE, m, m) : NULL;
    return mn ? nt_where_at(P->site, mn, s2, s1) : NULL;
}

/* Slot s's value of w: a where chain on s == k from the last slot down
 * (the gradient goes to that element alone). */
static nt_tensor *slot_value(const pctx *P, int64_t K, nt_tensor *w, nt_tensor *s)
{
    nt_tensor *ks = slot_numbers(P, K);
    nt_tensor *one = ks ? nt__binary(P->site, P->fn, NT_OP_EQ, ks, s) : NULL;
    nt_tensor *v = one ? nt_slice_at(P->site, w, 2, K - 1, K, 1) : NULL;
    for (int64_t k = K - 2; v && k >= 0; k--) {
        nt_tensor *c = nt_slice_at(P->site, one, 2, k, k + 1, 1);
        v = c ? nt_where_at(P->site, c, nt_slice_at(P->site, w, 2, k, k + 1, 1), v) : NULL;
    }
    return v;
}

/* Slot s's flat position (oh s0 - p0 + a d0) W + ow s1 - p1 + b d1 with
 * a = floor(s / k1), b = s - a k1: i32 [N, C, 1, L]. */
static nt_tensor *slot_position(const pctx *P, const pgeo *g, nt_tensor *s)
{
    nt_tensor *r = ramp(P, g->OH, (double)(g->s[0] * g->W), (double)(-g->p[0] * g->W));
    nt_tensor *c = r ? ramp(P, g->OW, (double)g->s[1], (double)-g->p[1]) : NULL;
    nt_tensor *base = as_row(P, c ? outer(P, NT_OP_ADD, r, c) : NULL, g, false);
    nt_tensor *a = base ? nt__unary(P->site, P->fn, NT_OP_FLOOR,
                                    nt__scalar(P->site, P->fn, NT_OP_DIV_SCALAR, s, (double)g->k[1], 0))
                        : NULL;
    nt_tensor *b = a ? nt__binary(P->site, P->fn, NT_OP_SUB, s,
                                  nt__scalar(P->site, P->fn, NT_OP_MUL_SCALAR, a, (double)g->k[1], 0))
                     : NULL;
    nt_tensor *t = b ? nt__binary(P->site, P->fn, NT_OP_ADD,
                                  nt__scalar(P->site, P->fn, NT_OP_MUL_SCALAR, a,
                                             (double)(g->d[0] * g->W), 0),
                                  nt__scalar(P->site, P->fn, NT_OP_MUL_SCALAR, b, (double)g->d[1], 0))
                     : NULL;
    t = t ? nt__binary(P->site, P->fn, NT_OP_ADD, t, base) : NULL;
    return t ? nt_cast_at(P->site, t, NT_I32) : NULL;
}

static nt_tensor *max_tiled(const pctx *P, nt_tensor *x, const pgeo *g)
{
    nt_tensor *r = tiles(P, x, g);
    r = r ? nt__reduce(P->site, P->fn, NT_OP_MAX, r, 5, false) : NULL;
    r = r ? nt__reduce(P->site, P->fn, NT_OP_MAX, r, 3, false) : NULL;
    return to_out(P, r, g);
}

/* max_pool2d_fwd: y and its flat positions in one kernel (f32 input; see
 * core/pool.h), the windows' values and positions the composite's. */
atomic_int nt__pool_composed;

static bool max_kernel_fits(const nt_tensor *x, const pgeo *g)
{
    if (atomic_load_explicit(&nt__pool_composed, memory_order_relaxed))
        return false;
    nt__pool2d q = {.P = g->N * g->C, .H = g->H, .W = g->W, .OH = g->OH, .OW = g->OW};
    for (int i = 0; i < 2; i++)
        q.k[i] = g->k[i], q.s[i] = g->s[i], q.p[i] = g->p[i], q.d[i] = g->d[i];
    return x->dtype == NT_F32 && g->H * g->W < (1 << 24) &&
           nt__pool2d_bytes(&q, 1) <= NT_POOL2D_SBUF;
}

static nt_tensor *max_kernel(const pctx *P, nt_tensor *x, const pgeo *g, nt_tensor **idx)
{
    nt__call c;
    nt_tensor *in[1] = {nt_contiguous_at(P->site, x)};
    if (!in[0])
        return NULL;
    if (!nt__call_begin(&c, P->site, P->fn, NT_OP_MAX_POOL2D, 1, in, "input"))
        return nt__call_fail(&c);
    for (int i = 0; i < 2; i++)
        c.p.i[i] = g->k[i], c.p.i[2 + i] = g->s[i], c.p.i[4 + i] = g->p[i], c.p.i[6 + i] = g->d[i];
    c.nout = 2;
    c.odt[0] = NT_F32, c.odt[1] = NT_I32;
    for (int o = 0; o < 2; o++) {
        c.ondim[o] = x->ndim;
        memcpy(c.oshape[o], x->shape, (size_t)x->ndim * sizeof(int64_t));
        c.oshape[o][x->ndim - 2] = g->OH, c.oshape[o][x->ndim - 1] = g->OW;
    }
    c.flops = (double)(g->N * g->C * g->OH * g->OW * g->k[0] * g->k[1]);
    nt_tensor *y = nt__dispatch(&c);
    *idx = y ? c.out[1] : NULL;
    return y;
}

nt_tensor *nt__max_pool2d_grad(const nt_site *site, nt_tensor *g, nt_tensor *idx,
                               const nt__params *p, int ndim, const int64_t *xshape)
{
    nt__call c;
    nt_tensor *gc = g->dtype == NT_F32 ? g : nt_cast_at(site, g, NT_F32);
    nt_tensor *in[2] = {gc ? nt_contiguous_at(site, gc) : NULL, idx};
    if (!in[0])
        return NULL;
    if (!nt__call_begin(&c, site, "nt_max_pool2d", NT_OP_MAX_POOL2D_BWD, 2, in, "grad,indices"))
        return nt__call_fail(&c);
    c.no_grad = true;
    c.p = *p;
    c.nout = 1;
    c.odt[0] = NT_F32;
    c.ondim[0] = ndim;
    memcpy(c.oshape[0], xshape, (size_t)ndim * sizeof(int64_t));
    c.flops = (double)nt__numel(ndim, xshape);
    return nt__dispatch(&c);
}

NT_API nt_tensor *nt_max_pool2d_at(const nt_site *site, nt_tensor *x, const int64_t *kernel,
                                   const int64_t *stride, const int64_t *padding,
                                   const int64_t *dilation, bool ceil_mode, nt_tensor **indices)
{
    pctx P = {site, "nt_max_pool2d", NULL};
    pgeo g;
    if (indices)
        *indices = NULL;
    if (!check_input(&P, x, &g) ||
        !check_window(&P, &g, kernel, stride, padding, dilation, ceil_mode) || !open_scope(&P))
        return NULL;
    if (max_kernel_fits(x, &g)) {
        nt_tensor *idx = NULL, *y = max_kernel(&P, x, &g, &idx);
        if (pool_end(&P, &y, indices && y ? (*indices = idx, indices) : NULL))
            return NULL;
        return y;
    }
    if (!indices && max_tiles(&g) && !(nt_grad_enabled() && nt_requires_grad(x))) {
        nt_tensor *y = max_tiled(&P, x, &g);
        return pool_end(&P, &y, NULL) ? NULL : y;
    }
    bool ok;
    nt_tensor *V = inside_mask(&P, &g, &ok);
    /* the windows, -inf in the padding; m their maxima (no gradient) */
    nt_tensor *w = ok ? stack_windows(&P, x, &g, -INFINITY) : NULL;
    nt_tensor *wd = w ? nt_detach(w) : NULL;
    nt_tensor *m = wd ? nt__reduce(site, P.fn, NT_OP_MAX, wd, 2, true) : NULL;
    /* hit: a slot inside the input holding the maximum; isn: a NaN */
    nt_tensor *hit = m ? nt__binary(site, P.fn, NT_OP_EQ, wd, m) : NULL;
    hit = hit && V ? nt__binary(site, P.fn, NT_OP_MUL, hit, V) : hit;
    nt_tensor *isn = hit ? nt__binary(site, P.fn, NT_OP_NE, wd, wd) : NULL;
    int64_t K = g.k[0] * g.k[1];
    nt_tensor *sl = isn ? pick_slot(&P, K, hit, isn, m) : NULL;
    nt_tensor *v = sl ? to_out(&P, slot_value(&P, K, w, sl), &g) : NULL;
    nt_tensor *idx = v && indices ? slot_position(&P, &g, sl) : NULL;
    idx = v && indices ? to_out(&P, nt_contiguous_at(site, idx), &g) : NULL;
    if (pool_end(&P, &v, indices ? (*indices = idx, indices) : NULL))
        return NULL;
    return v;
}
NT_API nt_tensor *nt_max_pool2d(nt_tensor *x, const int64_t *kernel, const int64_t *stride,
                                const int64_t *padding, const int64_t *dilation, bool ceil_mode,
                                nt_tensor **indices)
{
    return nt_max_pool2d_at(NT_RA_SITE, x, kernel, stride, padding, dilation, ceil_mode, indices);
}

/* The sum over K of w [N, C, K, L] -> [N, C, 1, L] in f32 (see the header). */
static nt_tensor *window_sum(const pctx *P, nt_tensor *w, int64_t K)
{
    nt_tensor *zero = nt_full_at(P->site, NT_F32, 0, NULL, 0.0);
    if (!zero || !w)
        return NULL;
    if (K > POOL_SEQ_MAX)
        return nt__binary(P->site, P->fn, NT_OP_ADD, nt__reduce(P->site, P->fn, NT_OP_SUM, w, 2, true),
                          zero);
    nt_tensor *acc = zero;
    for (int64_t k = 0; acc && k < K; k++)
        acc = nt__binary(P->site, P->fn, NT_OP_ADD, acc, nt_slice_at(P->site, w, 2, k, k + 1, 1));
    return acc;
}

/* avg_pool2d's divisors [OH, OW], PyTorch's: the window clipped to input
 * + padding (count_include_pad), else to the input; rows times columns. */
static nt_tensor *avg_divisors(const pctx *P, const pgeo *g, bool count_include_pad)
{
    nt_tensor *sz[2] = {NULL, NULL};
    int64_t in[2] = {g->H, g->W}, out[2] = {g->OH, g->OW};
    for (int i = 0; i < 2; i++) {
        nt_tensor *hs = ramp(P, out[i], (double)g->s[i], (double)-g->p[i]);
        nt_tensor *he = hs ? nt_clamp_at(P->site, nt__scalar(P->site, P->fn, NT_OP_ADD_SCALAR, hs,
                                                             (double)g->k[i], 0),
                                         -INFINITY, (double)(in[i] + g->p[i]))
                           : NULL;
        if (he && !count_include_pad)
            hs = nt_clamp_at(P->site, hs, 0.0, INFINITY),
            he = nt_clamp_at(P->site, he, -INFINITY, (double)in[i]);
        sz[i] = he && hs ? nt__binary(P->site, P->fn, NT_OP_SUB, he, hs) : NULL;
        if (!sz[i])
            return NULL;
    }
    return outer(P, NT_OP_MUL, sz[0], sz[1]);
}

/* The window sums [N, C, 1, L] of the f32 x: through the table T (the
 * adaptive pool's irregular windows), over the reshaped plane (tiles of
 * more than POOL_SEQ_MAX slots: nt_sum_dims, the flattened row's canonical
 * sum, the same bits as nt_sum over the stacked slots), or over the
 * stacked strided windows. */
static nt_tensor *avg_sum(const pctx *P, nt_tensor *x, const pgeo *g, nt_tensor *T, int64_t K)
{
    if (T)
        return window_sum(P, gather_windows(P, x, g, T, K, true), K);
    if (K <= POOL_SEQ_MAX || !max_tiles(g))
        return window_sum(P, stack_windows(P, x, g, 0.0), K);
    nt_tensor *r = tiles(P, x, g);
    if (r && g->OW == 1) /* a window's slots are adjacent: one dim (the same row, so bits) */
        r = nt__reduce(P->site, P->fn, NT_OP_SUM,
                       nt_reshape_at(P->site, r, 4, (int64_t[]){g->N, g->C, g->OH, K}), 3, false);
    else
        r = r ? nt_sum_dims_at(P->site, r, 2, (const int[]){3, 5}, false) : NULL;
    nt_tensor *zero = r ? nt_full_at(P->site, NT_F32, 0, NULL, 0.0) : NULL;
    r = zero ? nt__binary(P->site, P->fn, NT_OP_ADD, r, zero) : NULL;
    return r ? nt_reshape_at(P->site, r, 4, (int64_t[]){g->N, g->C, 1, g->OH * g->OW}) : NULL;
}

/* Widened input, windows summed, divided by d1 (and d2; each broadcast
 * against [OH, OW]), rounded back. */
static nt_tensor *avg_finish(const pctx *P, nt_tensor *x, const pgeo *g, nt_tensor *T, int64_t K,
                             nt_tensor *d1, nt_tensor *d2)
{
    nt_tensor *xf = x->dtype == NT_F32 ? x : nt__copy_to(P->site, P->fn, x, NT_F32);
    nt_tensor *s = xf && d1 ? avg_sum(P, xf, g, T, K) : NULL;
    s = s ? nt_reshape_at(P->site, s, 4, (int64_t[]){g->N, g->C, g->OH, g->OW}) : NULL;
    s = s ? nt__binary(P->site, P->fn, NT_OP_DIV, s, d1) : NULL;
    if (s && d2)
        s = nt__binary(P->site, P->fn, NT_OP_DIV, s, d2);
    s = to_out(P, s, g);
    if (s && s->dtype != x->dtype)
        s = nt__copy_to(P->site, P->fn, s, (nt_dtype)x->dtype);
    return s;
}

NT_API nt_tensor *nt_avg_pool2d_at(const nt_site *site, nt_tensor *x, const int64_t *kernel,
                                   const int64_t *stride, const int64_t *padding, bool ceil_mode,
                                   bool count_include_pad)
{
    pctx P = {site, "nt_avg_pool2d", NULL};
    pgeo g;
    if (!check_input(&P, x, &g) || !check_window(&P, &g, kernel, stride, padding, NULL, ceil_mode) ||
        !open_scope(&P))
        return NULL;
    nt_tensor *D = avg_divisors(&P, &g, count_include_pad);
    nt_tensor *y = avg_finish(&P, x, &g, NULL, g.k[0] * g.k[1], D, NULL);
    return pool_end(&P, &y, NULL) ? NULL : y;
}
NT_API nt_tensor *nt_avg_pool2d(nt_tensor *x, const int64_t *kernel, const int64_t *stride,
                                const int64_t *padding, bool ceil_mode, bool count_include_pad)
{
    return nt_avg_pool2d_at(NT_RA_SITE, x, kernel, stride, padding, ceil_mode, count_include_pad);
}

/* PyTorch's adaptive window [start, end) of output i of n over in. */
static int64_t ad_start(int64_t i, int64_t n, int64_t in) { return (i * in) / n; }
static int64_t ad_end(int64_t i, int64_t n, int64_t in) { return ((i + 1) * in + n - 1) / n; }

/* The largest adaptive window along a dim. */
static int64_t ad_max(int64_t n, int64_t in)
{
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (ad_end(i, n, in) - ad_start(i, n, in) > m)
            m = ad_end(i, n, in) - ad_start(i, n, in);
    return m;
}

/* f32 [n]: the windows' starts floor(i in / n) and sizes ceil((i + 1) in /
 * n) - start (the f32 quotient's floor and ceiling are exact below 2^24). */
static nt_tensor *ad_starts(const pctx *P, int64_t n, int64_t in, nt_tensor **size)
{
    nt_tensor *a = ramp(P, n, (double)in, 0.0), *e = ramp(P, n, (double)in, (double)in);
    a = a ? nt__scalar(P->site, P->fn, NT_OP_DIV_SCALAR, a, (double)n, 0) : NULL;
    e = e ? nt__scalar(P->site, P->fn, NT_OP_DIV_SCALAR, e, (double)n, 0) : NULL;
    a = a ? nt__unary(P->site, P->fn, NT_OP_FLOOR, a) : NULL;
    e = e ? nt__unary(P->site, P->fn, NT_OP_CEIL, e) : NULL;
    *size = a && e ? nt__binary(P->site, P->fn, NT_OP_SUB, e, a) : NULL;
    return *size ? a : NULL;
}

/* The table of unequal windows, i32 [K L]: slot (a, b) of window l reads
 * (sh + a) W + sw + b when a < kh and b < kw, else the zero at H W. */
static nt_tensor *adaptive_table(const pctx *P, const pgeo *g, int64_t mh, int64_t mw,
                                 nt_tensor *sh, nt_tensor *kh, nt_tensor *sw, nt_tensor *kw)
{
    int64_t K = mh * mw;
    nt_tensor **rows = malloc(sizeof(nt_tensor *) * (size_t)K), *t = rows ? sh : NULL;
    if (!rows)
        nt__err_hostmem(P->site, P->fn, "the table list");
    for (int64_t a = 0; t && a < mh; a++)
        for (int64_t b = 0; t && b < mw; b++) {
            nt_tensor *r = nt__scalar(P->site, P->fn, NT_OP_MUL_SCALAR,
                                      nt__scalar(P->site, P->fn, NT_OP_ADD_SCALAR, sh, (double)a, 0),
                                      (double)g->W, 0);
            nt_tensor *c = nt__scalar(P->site, P->fn, NT_OP_ADD_SCALAR, sw, (double)b, 0);
            nt_tensor *m = outer(P, NT_OP_MUL,
                                 nt__binary(P->site, P->fn, NT_OP_GT, kh, cst(P, (double)a)),
                                 nt__binary(P->site, P->fn, NT_OP_GT, kw, cst(P, (double)b)));
            t = r && c && m ? nt_where_at(P->site, m, outer(P, NT_OP_ADD, r, c),
                                          cst(P, (double)(g->H * g->W)))
                            : NULL;
            rows[a * mw + b] = t = as_row(P, t, g, true);
        }
    t = t ? nt_cat_at(P->site, rows, (int)K, 0) : NULL;
    free(rows);
    return t ? nt_reshape_at(P->site, t, 1, (int64_t[]){K * g->OH * g->OW}) : NULL;
}

NT_API nt_tensor *nt_adaptive_avg_pool2d_at(const nt_site *site, nt_tensor *x, int64_t out_h,
                                            int64_t out_w)
{
    pctx P = {site, "nt_adaptive_avg_pool2d", NULL};
    pgeo g;
    if (!check_input(&P, x, &g))
        return NULL;
    if (out_h < 1 || out_w < 1) {
        nt__err(site, NT_EINVAL, P.fn, "argument 'output_size' is [%lld, %lld]; expected values >= 1",
                (long long)out_h, (long long)out_w);
        return NULL;
    }
    if (!open_scope(&P))
        return NULL;
    g.OH = out_h, g.OW = out_w;
    int64_t mh = ad_max(out_h, g.H), mw = ad_max(out_w, g.W);
    nt_tensor *kh = NULL, *kw = NULL, *sh = ad_starts(&P, out_h, g.H, &kh);
    nt_tensor *sw = sh ? ad_starts(&P, out_w, g.W, &kw) : NULL;
    nt_tensor *T = NULL, *D1 = sw ? column(&P, kh) : NULL, *D2 = sw ? kw : NULL;
    if (g.H % out_h == 0 && g.W % out_w == 0) {
        /* equal windows that tile the plane: avg_pool2d's strided path */
        g.k[0] = g.s[0] = g.H / out_h, g.k[1] = g.s[1] = g.W / out_w;
        g.p[0] = g.p[1] = 0, g.d[0] = g.d[1] = 1;
    } else if (D1) {
        T = adaptive_table(&P, &g, mh, mw, sh, kh, sw, kw);
        D1 = T ? D1 : NULL;
    }
    int64_t K = mh * mw;
    nt_tensor *y = avg_finish(&P, x, &g, T, K, D1, D2);
    return pool_end(&P, &y, NULL) ? NULL : y;
}
NT_API nt_tensor *nt_adaptive_avg_pool2d(nt_tensor *x, int64_t out_h, int64_t out_w)
{
    return nt_adaptive_avg_pool2d_at(NT_RA_SITE, x, out_h, out_w);
}
