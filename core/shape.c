/* core/shape.c - shapes, strides and NumPy broadcasting. */
#include "core/internal.h"
#include "core/rows.h"

int64_t nt__numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return INT64_MAX;
    return n;
}

bool nt__shape_ok(int ndim, const int64_t *shape, char *why, size_t whylen)
{
    int64_t span = 1; /* product of the sizes, 0 counted as 1: bounds the strides too */
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            snprintf(why, whylen, "shape[%d] is %lld; expected a size >= 0", i,
                     (long long)shape[i]);
            return false;
        }
        if (__builtin_mul_overflow(span, shape[i] ? shape[i] : 1, &span) ||
            span > NT__MAX_NUMEL) {
            char s[160];
            snprintf(why, whylen, "shape %s has more than 2^48 elements (the most a tensor may "
                     "have)", nt__shape_str(ndim, shape, s, sizeof s));
            return false;
        }
    }
    return true;
}

void nt__contig_strides(int ndim, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

bool nt__is_contig(const nt_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s)
            /* An empty tensor has nothing to lay out: contiguous whatever its
             * strides (a fresh [2, 0, 3] has strides [3, 3, 1], which the
             * running product 0 would reject, and nt_reshape, copying to get
             * a contiguous tensor, recursed until the stack overflowed). */
            return nt__numel(t->ndim, t->shape) == 0;
        s *= t->shape[i];
    }
    return true;
}

bool nt__broadcast(int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out)
{
    if (na == nb) { /* most calls: the same rank, often the same shape */
        for (int i = 0; i < na; i++) {
            int64_t da = a[i], db = b[i];
            if (da != db && db != 1 && da != 1)
                return false;
            out[i] = da == 1 ? db : da;
        }
        *nout = na;
        return true;
    }
    int n = na > nb ? na : nb;
    int64_t tmp[NT_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da == db || db == 1)
            tmp[i] = da;
        else if (da == 1)
            tmp[i] = db;
        else
            return false;
    }
    *nout = n;
    for (int i = 0; i < n; i++)
        out[i] = tmp[i];
    return true;
}

void nt__bcast_strides(const nt_tensor *t, int ndim, const int64_t *shape, int64_t *stride)
{
    int off = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - off;
        if (j < 0 || (t->shape[j] == 1 && shape[i] != 1))
            stride[i] = 0;
        else
            stride[i] = t->shape[j] == 1 ? 0 : t->stride[j];
    }
}

int nt__norm_dim(int dim, int ndim)
{
    int d = dim < 0 ? dim + ndim : dim;
    return (d < 0 || d >= ndim) ? -1 : d;
}

const char *nt__shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t len = 0;
    len += (size_t)snprintf(buf + len, n - len, "[");
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
    return buf;
}

bool nt__matmul_info(const nt_tensor *a, const nt_tensor *b, nt__mminfo *mi, char *why,
                     size_t whylen)
{
    if (a->ndim == 0 || b->ndim == 0) {
        snprintf(why, whylen, "both arguments need at least 1 dim (got %d and %d)", a->ndim,
                 b->ndim);
        return false;
    }
    bool av = a->ndim == 1, bv = b->ndim == 1;
    int an = a->ndim, bn = b->ndim;
    mi->M = av ? 1 : a->shape[an - 2];
    mi->K = a->shape[an - 1];
    int64_t kb = bv ? b->shape[0] : b->shape[bn - 2];
    mi->N = bv ? 1 : b->shape[bn - 1];
    mi->a_cs = a->stride[an - 1];
    mi->a_rs = av ? 0 : a->stride[an - 2];
    mi->b_rs = bv ? b->stride[0] : b->stride[bn - 2];
    mi->b_cs = bv ? 0 : b->stride[bn - 1];
    if (kb != mi->K) {
        snprintf(why, whylen, "inner dims differ: a has %lld columns, b has %lld rows",
                 (long long)mi->K, (long long)kb);
        return false;
    }
    int nab = av ? 0 : an - 2, nbb = bv ? 0 : bn - 2;
    int nb;
    if (!nt__broadcast(nab, a->shape, nbb, b->shape, &nb, mi->batch)) {
        snprintf(why, whylen, "batch dims cannot be broadcast together");
        return false;
    }
    mi->nbatch = nb;
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - nab), ib = i - (nb - nbb);
        mi->a_bstride[i] = (ia >= 0 && a->shape[ia] != 1) ? a->stride[ia] : 0;
        mi->b_bstride[i] = (ib >= 0 && b->shape[ib] != 1) ? b->stride[ib] : 0;
    }
    int o = 0;
    for (int i = 0; i < nb; i++)
        mi->oshape[o++] = mi->batch[i];
    if (!av)
        mi->oshape[o++] = mi->M;
    if (!bv)
        mi->oshape[o++] = mi->N;
    mi->ondim = o;
    return true;
}

/* core/rows.h */
void nt__rows_shape(nt__rows *R, const nt_tensor *t, int d, bool same_shape)
{
    memset(R, 0, sizeof *R);
    R->C = 1;
    if (t->ndim == 0) {
        R->n = 1;
        return;
    }
    int64_t cs[NT_MAX_DIMS] = {0}; /* set by nt__contig_strides (GCC cannot tell) */
    nt__contig_strides(t->ndim, t->shape, cs);
    R->n = t->shape[d];
    R->sn = t->stride[d];
    R->on = same_shape ? cs[d] : 0;
    int64_t bs[NT_MAX_DIMS], bsi[NT_MAX_DIMS], bso[NT_MAX_DIMS];
    int nb = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d)
            continue;
        bs[nb] = t->shape[i];
        bsi[nb] = t->stride[i];
        bso[nb] = cs[i];
        nb++;
    }
    if (!same_shape)
        nt__contig_strides(nb, bs, bso);
    if (nb == 0)
        return;
    R->C = bs[nb - 1];
    R->sc = bsi[nb - 1];
    R->oc = bso[nb - 1];
    R->nouter = nb - 1;
    for (int i = 0; i < nb - 1; i++)
        R->oshape[i] = bs[i], R->osi[i] = bsi[i], R->oso[i] = bso[i];
}
