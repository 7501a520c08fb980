/* dispatcher/api_reduce.c - reductions over a list of dims (sum_dims,
 * mean_dims, amax, amin, var, std, logsumexp) and the sequential ones along
 * one dim (prod, cumsum, cumprod).
 *
 * Each is a composite of ops with defined bits (docs/ops.md, "Reductions
 * over several dims"), so it gives the same bits on every backend and in
 * every mode, and autograd differentiates it op by op:
 *   - over several dims, the reduced dims are moved after the kept ones
 *     (their relative order kept), flattened into one row-major dim (a copy
 *     unless they are already adjacent), and reduced by the single-dim op
 *     in core/reduce.h's canonical order; every dim is NT_DIM_ALL, one dim
 *     the op itself: the same order in each case;
 *   - prod, cumsum, cumprod run along the dim sequentially: y = x0; y = y
 *     op x1; ...: floats by the running kernel (ops CUMSUM, CUMPROD; prod
 *     is cumprod's last position), whose backward is exact with zeros in
 *     the row (no division: autograd/backward.c); integers by one
 *     elementwise op per position (exact). */
#include <math.h>
#include <string.h>

#include "dispatcher/dispatch.h"

/* The dims a reduction names: a bitmask over t's dims. */
typedef struct rdims {
    unsigned mask;
    int nred;  /* dims in mask */
    int64_t n; /* elements each result reduces */
} rdims;

/* Checks ndims/dims against t (each dim in range, none repeated; ndims 0
 * reduces every dim, as PyTorch 1.13's empty dim list). */
static bool parse_dims(const nt_site *site, const char *fn, nt_tensor *t, int ndims,
                       const int *dims, rdims *r)
{
    int nd = t->ndim;
    memset(r, 0, sizeof *r);
    if (ndims < 0 || ndims > NT_MAX_DIMS) {
        nt__err(site, NT_EINVAL, fn, "argument 'ndims' is %d; expected 0 to %d", ndims,
                NT_MAX_DIMS);
        return false;
    }
    if (ndims > 0 && !dims) {
        nt__err(site, NT_EINVAL, fn, "argument 'dims' is NULL; expected %d dims", ndims);
        return false;
    }
    for (int i = 0; i < ndims; i++) {
        int d = nt__norm_dim(dims[i], nd ? nd : 1); /* a 0-d tensor takes dim 0 and -1 */
        if (d < 0) {
            nt__err(site, NT_EDIM, fn,
                    "argument 'dims': dim %d is out of range for a tensor with %d dims", dims[i],
                    nd);
            return false;
        }
        if (r->mask & (1u << d)) {
            nt__err(site, NT_EDIM, fn, "argument 'dims': dim %d appears more than once in the list",
                    dims[i]);
            return false;
        }
        r->mask |= 1u << d;
    }
    if (ndims == 0 || nd == 0)
        r->mask = nd ? (1u << nd) - 1 : 0;
    r->n = 1;
    for (int d = 0; d < nd; d++)
        if (r->mask & (1u << d)) {
            r->nred++;
            r->n *= t->shape[d];
        }
    return true;
}

/* t arranged so that op over *dim reduces the dims of r in row-major order:
 * t itself with NT_DIM_ALL or the one dim, else the kept dims then the
 * reduced ones flattened into the last. */
static nt_tensor *flatten_red(const nt_site *site, nt_tensor *t, const rdims *r, int *dim)
{
    int nd = t->ndim;
    if (nd == 0 || r->nred == nd) {
        *dim = NT_DIM_ALL;
        return t;
    }
    if (r->nred == 1) {
        for (int d = 0; d < nd; d++)
            if (r->mask & (1u << d))
                *dim = d;
        return t;
    }
    int perm[NT_MAX_DIMS], k = 0;
    int64_t sh[NT_MAX_DIMS];
    bool ident = true;
    for (int pass = 0; pass < 2; pass++)
        for (int d = 0; d < nd; d++)
            if (!!(r->mask & (1u << d)) == pass) {
                ident &= d == k;
                if (!pass)
                    sh[k] = t->shape[d];
                perm[k++] = d;
            }
    int kept = nd - r->nred;
    sh[kept] = r->n;
    *dim = kept;
    nt_tensor *p = ident ? t : nt_permute_at(site, t, perm);
    return p ? nt_reshape_at(site, p, kept + 1, sh) : NULL;
}

/* The shape of a result with keepdim: t's with 1 at the reduced dims. */
static nt_tensor *keep_shape(const nt_site *site, nt_tensor *y, nt_tensor *t, const rdims *r)
{
    int64_t sh[NT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        sh[d] = r->mask & (1u << d) ? 1 : t->shape[d];
    return y ? nt_reshape_at(site, y, t->ndim, sh) : NULL;
}

/* Ends a composite: the result kept past the scope and adopted by the
 * caller's, or NULL with the error naming fn. */
static nt_tensor *composite_end(nt_scope *sc, nt_tensor *y, const char *fn)
{
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(sc);
    return y ? nt__scope_adopt(y, fn) : NULL;
}

static nt_scope *composite_begin(const nt_site *site, const char *fn, nt_tensor *t)
{
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t) || !nt__no_fp8(site, fn, "t", t))
        return NULL;
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        nt__err_hostmem(site, fn, "a scope");
    return sc;
}

static bool need_float(const nt_site *site, const char *fn, nt_tensor *t)
{
    if (nt__dtype_is_float((nt_dtype)t->dtype))
        return true;
    nt__err(site, NT_EDTYPE, fn, "argument 't' has dtype %s; expected f32, bf16 or f16",
            nt_dtype_name((nt_dtype)t->dtype));
    return false;
}

/* op (SUM, MEAN, AMAX, AMIN) of t over the dims of r, inside a scope. */
static nt_tensor *red_over(const nt_site *site, const char *fn, int op, nt_tensor *t,
                           const rdims *r, bool keepdim)
{
    int dim = 0;
    nt_tensor *f = flatten_red(site, t, r, &dim);
    nt_tensor *y = f ? nt__reduce(site, fn, op, f, dim, false) : NULL;
    return keepdim ? keep_shape(site, y, t, r) : y;
}

static nt_tensor *reduce_dims(const nt_site *site, const char *fn, int op, nt_tensor *t,
                              int ndims, const int *dims, bool keepdim)
{
    rdims r;
    nt_scope *sc = composite_begin(site, fn, t);
    if (!sc)
        return NULL;
    bool ok = parse_dims(site, fn, t, ndims, dims, &r) &&
              (op != NT_OP_MEAN || need_float(site, fn, t));
    if (ok && r.n == 0 && (op == NT_OP_AMAX || op == NT_OP_AMIN)) {
        nt__err(site, NT_ESHAPE, fn, "cannot take the %s over empty dims (it has no identity)",
                nt__op_name(op));
        ok = false;
    }
    if (!ok) {
        nt_scope_end(sc);
        return NULL;
    }
    return composite_end(sc, red_over(site, fn, op, t, &r, keepdim), fn);
}

#define NT_DEF_REDUCE_DIMS(name, ID)                                                          \
    NT_API nt_tensor *nt_##name##_at(const nt_site *site, nt_tensor *t, int ndims,             \
                                     const int *dims, bool keepdim)                            \
    {                                                                                          \
        return reduce_dims(site, "nt_" #name, NT_OP_##ID, t, ndims, dims, keepdim);            \
    }                                                                                          \
    NT_API nt_tensor *nt_##name(nt_tensor *t, int ndims, const int *dims, bool keepdim)        \
    {                                                                                          \
        return nt_##name##_at(NT_RA_SITE, t, ndims, dims, keepdim);                           \
    }
NT_DEF_REDUCE_DIMS(sum_dims, SUM)
NT_DEF_REDUCE_DIMS(mean_dims, MEAN)
NT_DEF_REDUCE_DIMS(amax, AMAX)
NT_DEF_REDUCE_DIMS(amin, AMIN)

/* ---------------- var, std, logsumexp ---------------- */

/* var over the dims of r, in f32: mu = mean (keepdim), d = x - mu,
 * sum(d * d) / max(n - correction, 0); std its sqrt.  Rounded once to t's
 * dtype at the end. */
static nt_tensor *var_std(const nt_site *site, const char *fn, nt_tensor *t, int ndims,
                          const int *dims, double correction, bool keepdim, bool sd)
{
    rdims r;
    nt_scope *sc = composite_begin(site, fn, t);
    if (!sc)
        return NULL;
    if (!parse_dims(site, fn, t, ndims, dims, &r) || !need_float(site, fn, t)) {
        nt_scope_end(sc);
        return NULL;
    }
    if (isnan(correction)) {
        nt__err(site, NT_EINVAL, fn, "argument 'correction' is NaN; expected a number");
        nt_scope_end(sc);
        return NULL;
    }
    nt_dtype dt = (nt_dtype)t->dtype, cd = dt == NT_F64 ? NT_F64 : NT_F32; /* f64: double */
    nt_tensor *x = dt == cd ? t : nt__copy_to(site, fn, t, cd);
    nt_tensor *mu = x ? red_over(site, fn, NT_OP_MEAN, x, &r, true) : NULL;
    nt_tensor *d = mu ? nt__binary(site, fn, NT_OP_SUB, x, mu) : NULL;
    nt_tensor *s = d ? red_over(site, fn, NT_OP_SUM, nt__binary(site, fn, NT_OP_MUL, d, d), &r,
                                keepdim)
                     : NULL;
    double den = (double)r.n - correction;
    nt_tensor *y = s ? nt__scalar(site, fn, NT_OP_DIV_SCALAR, s, den > 0 ? den : 0.0, 0) : NULL;
    if (y && sd)
        y = nt__unary(site, fn, NT_OP_SQRT, y);
    if (y && dt != cd)
        y = nt__copy_to(site, fn, y, dt);
    return composite_end(sc, y, fn);
}

NT_API nt_tensor *nt_var_at(const nt_site *site, nt_tensor *t, int ndims, const int *dims,
                            double correction, bool keepdim)
{
    return var_std(site, "nt_var", t, ndims, dims, correction, keepdim, false);
}
NT_API nt_tensor *nt_var(nt_tensor *t, int ndims, const int *dims, double correction,
                         bool keepdim)
{
    return nt_var_at(NT_RA_SITE, t, ndims, dims, correction, keepdim);
}
NT_API nt_tensor *nt_std_at(const nt_site *site, nt_tensor *t, int ndims, const int *dims,
                            double correction, bool keepdim)
{
    return var_std(site, "nt_std", t, ndims, dims, correction, keepdim, true);
}
NT_API nt_tensor *nt_std(nt_tensor *t, int ndims, const int *dims, double correction,
                         bool keepdim)
{
    return nt_std_at(NT_RA_SITE, t, ndims, dims, correction, keepdim);
}

/* log(sum(exp(x - m))) + m over the dims of r in x's dtype (f32 or f64), m the amax (keepdim,
 * no gradient) with +-Inf replaced by 0 (PyTorch's logsumexp): a row of
 * -Inf gives -Inf, a row with +Inf gives +Inf, NaN propagates; no elements
 * give -Inf. */
static nt_tensor *lse(const nt_site *site, const char *fn, nt_tensor *x, const rdims *r,
                      bool keepdim)
{
    nt_tensor *m = NULL, *z = nt_zeros_at(site, (nt_dtype)x->dtype, 0, NULL);
    if (r->n > 0) {
        nt_tensor *a = red_over(site, fn, NT_OP_AMAX, nt_detach_at(site, x), r, true);
        nt_tensor *inf = nt_full_at(site, (nt_dtype)x->dtype, 0, NULL, INFINITY);
        nt_tensor *isinf = a ? nt__binary(site, fn, NT_OP_EQ, nt__unary(site, fn, NT_OP_ABS, a), inf)
                             : NULL;
        m = isinf ? nt_where_at(site, isinf, z, a) : NULL;
        if (!m)
            return NULL;
        x = nt__binary(site, fn, NT_OP_SUB, x, m);
    }
    nt_tensor *s = red_over(site, fn, NT_OP_SUM, nt__unary(site, fn, NT_OP_EXP, x), r, true);
    nt_tensor *y = s ? nt__unary(site, fn, NT_OP_LOG, s) : NULL;
    if (y && m)
        y = nt__binary(site, fn, NT_OP_ADD, y, m);
    if (y && !keepdim) {
        int64_t sh[NT_MAX_DIMS];
        int k = 0;
        for (int d = 0; d < y->ndim; d++)
            if (!(r->mask & (1u << d)))
                sh[k++] = y->shape[d];
        y = nt_reshape_at(site, y, k, sh);
    }
    return y;
}

NT_API nt_tensor *nt_logsumexp_at(const nt_site *site, nt_tensor *t, int ndims, const int *dims,
                                  bool keepdim)
{
    const char *fn = "nt_logsumexp";
    rdims r;
    nt_scope *sc = composite_begin(site, fn, t);
    if (!sc)
        return NULL;
    if (!parse_dims(site, fn, t, ndims, dims, &r)) {
        nt_scope_end(sc);
        return NULL;
    }
    nt_dtype dt = (nt_dtype)t->dtype;
    if (!nt__dtype_is_float(dt))
        dt = NT_F32; /* integers give f32, as PyTorch 1.13 */
    nt_dtype cd = dt == NT_F64 ? NT_F64 : NT_F32; /* f64: in double */
    nt_tensor *x = t->dtype == cd ? t : nt__copy_to(site, fn, t, cd);
    nt_tensor *y = x ? lse(site, fn, x, &r, keepdim) : NULL;
    if (y && dt != cd)
        y = nt__copy_to(site, fn, y, dt);
    return composite_end(sc, y, fn);
}
NT_API nt_tensor *nt_logsumexp(nt_tensor *t, int ndims, const int *dims, bool keepdim)
{
    return nt_logsumexp_at(NT_RA_SITE, t, ndims, dims, keepdim);
}

/* ---------------- prod, cumsum, cumprod: sequential along a dim ---------------- */

/* The dtype prod, cumsum and cumprod run in: f32, f64, i64 keep theirs;
 * bool goes to i64 (PyTorch's long), other ints to i32 (as nt_sum), bf16
 * and f16 to f32. */
static nt_dtype seq_dtype(nt_dtype dt)
{
    if (dt == NT_F32 || dt == NT_F64 || dt == NT_I64 || dt == NT_I32)
        return dt;
    if (dt == NT_BOOL)
        return NT_I64;
    return nt__dtype_is_float(dt) ? NT_F32 : NT_I32;
}

/* t in seq_dtype and its dim d: t itself, or its row-major flattening for
 * NT_DIM_ALL (and a 0-d t). */
static nt_tensor *seq_input(const nt_site *site, const char *fn, nt_tensor *t, int dim, int *d)
{
    if (seq_dtype((nt_dtype)t->dtype) != t->dtype)
        t = nt__copy_to(site, fn, t, seq_dtype((nt_dtype)t->dtype));
    if (!t)
        return NULL;
    if (dim == NT_DIM_ALL || t->ndim == 0) {
        if (dim != NT_DIM_ALL && nt__norm_dim(dim, 1) < 0)
            goto bad;
        int64_t n = nt__numel(t->ndim, t->shape);
        *d = 0;
        return nt_reshape_at(site, t, 1, &n);
    }
    *d = nt__norm_dim(dim, t->ndim);
    if (*d >= 0)
        return t;
bad:
    nt__err(site, NT_EDIM, fn, "argument 'dim': dim %d is out of range for a tensor with %d dims",
            dim, t->ndim);
    return NULL;
}

/* The running op (ADD, MUL) along dim d of x: each position's slice
 * combined with the running result in order; cum: all of them, cat along
 * d, else the last one (keepdim shape). */
static nt_tensor *seq_run(const nt_site *site, const char *fn, int op, nt_tensor *x, int d,
                          bool cum)
{
    int64_t n = x->shape[d];
    if (n == 0)
        return x; /* cum only (a prod of nothing is its caller's 1) */
    nt_tensor **parts = cum ? malloc(sizeof *parts * (size_t)n) : NULL;
    if (cum && !parts) {
        nt__err_hostmem(site, fn, "the slices of a running op");
        return NULL;
    }
    nt_tensor *y = NULL;
    for (int64_t i = 0; i < n; i++) {
        nt_tensor *s = nt_slice_at(site, x, d, i, i + 1, 1);
        y = i == 0 ? s : nt__binary(site, fn, op, y, s);
        if (!y)
            break;
        if (cum)
            parts[i] = y;
    }
    if (cum && y)
        y = n == 1 ? y : nt_cat_at(site, parts, (int)n, d);
    free(parts);
    return y;
}

/* The running op (CUMSUM, CUMPROD: in a; LINREC: in a and b) over dim d of
 * contiguous copies of its floating inputs: the output has a's shape and
 * dtype. */
static nt_tensor *scan_op(const nt_site *site, const char *fn, int op, nt_tensor *a,
                          nt_tensor *b, int d)
{
    nt__call c;
    nt_tensor *in[2] = {a ? nt_contiguous_at(site, a) : NULL, b ? nt_contiguous_at(site, b) : NULL};
    int nin = op == NT_OP_LINREC ? 2 : 1;
    if (!in[0] || (nin == 2 && !in[1]))
        return NULL;
    if (!nt__call_begin(&c, site, fn, op, nin, in, nin == 2 ? "a,b" : "t"))
        return nt__call_fail(&c);
    nt_tensor *x = c.in[0];
    c.p.dim = d;
    c.ondim[0] = x->ndim;
    for (int i = 0; i < x->ndim; i++)
        c.oshape[0][i] = x->shape[i];
    c.odt[0] = (nt_dtype)x->dtype;
    c.flops = 2.0 * (double)nt__numel(x->ndim, x->shape);
    return nt__dispatch(&c);
}

nt_tensor *nt__linrec(const nt_site *site, nt_tensor *a, nt_tensor *b, int dim)
{
    return scan_op(site, "nt_cumprod", NT_OP_LINREC, a, b, dim);
}

static nt_tensor *prod_cum(const nt_site *site, const char *fn, int op, nt_tensor *t, int dim,
                           bool keepdim, bool cum)
{
    nt_scope *sc = composite_begin(site, fn, t);
    if (!sc)
        return NULL;
    int d = 0;
    nt_tensor *x = NULL, *y = NULL;
    if (cum && dim == NT_DIM_ALL)
        nt__err(site, NT_EDIM, fn, "argument 'dim' is NT_DIM_ALL; expected one dim");
    else
        x = seq_input(site, fn, t, dim, &d);
    if (!x) {
        nt_scope_end(sc);
        return NULL;
    }
    if (!cum && x->shape[d] == 0) { /* the product of nothing: 1 */
        int64_t sh[NT_MAX_DIMS];
        memcpy(sh, x->shape, sizeof sh);
        sh[d] = 1;
        y = nt_ones_at(site, (nt_dtype)x->dtype, x->ndim, sh);
    } else if (x->dtype == NT_F32) { /* the running kernel */
        y = scan_op(site, fn, op == NT_OP_ADD ? NT_OP_CUMSUM : NT_OP_CUMPROD, x, NULL, d);
        if (y && !cum)
            y = nt_slice_at(site, y, d, x->shape[d] - 1, x->shape[d], 1);
    } else { /* integers (exact, any order) and f64: one op per position */
        y = seq_run(site, fn, op, x, d, cum);
    }
    int64_t sh[NT_MAX_DIMS];
    int k = 0;
    if (cum) {
        k = t->ndim;
        memcpy(sh, t->shape, sizeof sh);
    } else {
        for (int i = 0; i < t->ndim; i++)
            if (dim == NT_DIM_ALL || i == d)
                sh[k++] = 1;
            else
                sh[k++] = t->shape[i];
        if (!keepdim) {
            k = 0;
            for (int i = 0; i < t->ndim; i++)
                if (dim != NT_DIM_ALL && i != d)
                    sh[k++] = t->shape[i];
        }
    }
    if (y)
        y = nt_reshape_at(site, y, k, sh);
    if (y && nt__dtype_is_float((nt_dtype)t->dtype) && t->dtype != y->dtype)
        y = nt__copy_to(site, fn, y, (nt_dtype)t->dtype); /* rounded once */
    return composite_end(sc, y, fn);
}

NT_API nt_tensor *nt_prod_at(const nt_site *site, nt_tensor *t, int dim, bool keepdim)
{
    return prod_cum(site, "nt_prod", NT_OP_MUL, t, dim, keepdim, false);
}
NT_API nt_tensor *nt_prod(nt_tensor *t, int dim, bool keepdim)
{
    return nt_prod_at(NT_RA_SITE, t, dim, keepdim);
}
NT_API nt_tensor *nt_cumsum_at(const nt_site *site, nt_tensor *t, int dim)
{
    return prod_cum(site, "nt_cumsum", NT_OP_ADD, t, dim, false, true);
}
NT_API nt_tensor *nt_cumsum(nt_tensor *t, int dim) { return nt_cumsum_at(NT_RA_SITE, t, dim); }
NT_API nt_tensor *nt_cumprod_at(const nt_site *site, nt_tensor *t, int dim)
{
    return prod_cum(site, "nt_cumprod", NT_OP_MUL, t, dim, false, true);
}
NT_API nt_tensor *nt_cumprod(nt_tensor *t, int dim) { return nt_cumprod_at(NT_RA_SITE, t, dim); }

/* ---------------- all ---------------- */

/* torch.all: (any(t == 0) == 0), so an empty dim gives 1 and a NaN counts
 * as nonzero, with nt_any's dims and errors. */
NT_API nt_tensor *nt_all_at(const nt_site *site, nt_tensor *t, int dim, bool keepdim)
{
    const char *fn = "nt_all";
    nt_scope *sc = composite_begin(site, fn, t);
    if (!sc)
        return NULL;
    nt_tensor *z = nt_zeros_at(site, (nt_dtype)t->dtype, 0, NULL);
    nt_tensor *e = z ? nt__binary(site, fn, NT_OP_EQ, t, z) : NULL;
    nt_tensor *a = e ? nt__reduce(site, fn, NT_OP_ANY, e, dim, keepdim) : NULL;
    nt_tensor *z8 = a ? nt_zeros_at(site, NT_U8, 0, NULL) : NULL;
    return composite_end(sc, z8 ? nt__binary(site, fn, NT_OP_EQ, a, z8) : NULL, fn);
}
NT_API nt_tensor *nt_all(nt_tensor *t, int dim, bool keepdim)
{
    return nt_all_at(NT_RA_SITE, t, dim, keepdim);
}
