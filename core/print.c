/* core/print.c - tensors as text, the way PyTorch prints them.
 *
 *   tensor([[1.0000, 2.5000],
 *           [3.0000, 4.0000]], dtype=bf16)
 *
 * Floats print with 4 decimals; if every shown value is an integer they print
 * as "1." ; if the magnitudes of the nonzero finite values span more than
 * 1000x or exceed 1e8 (or, for non-integers, go below 1e-4), scientific
 * notation ("1.0000e-05").  Columns are as wide as the widest nonzero finite
 * value; a summarised tensor is formatted from the values it shows.  Tensors with more than
 * 1000 elements show the first and last 3 entries of each dim around "...".
 * Rows wrap at 80 columns.  f32 carries no dtype suffix; other dtypes do. */
#include <math.h>
#include <string.h>

#include "core/internal.h"

#define NT_PRINT_THRESHOLD 1000
#define NT_PRINT_EDGE 3
#define NT_PRINT_WIDTH 80

typedef struct {
    const nt_tensor *t;
    const char *base;
    bool summarize;
    bool is_float;
    int mode; /* 0 fixed, 1 integer-valued, 2 scientific */
    int64_t raw; /* an i64 element as read by elem(), exact (fmt_value prints it) */
    int width; /* at least 1, like PyTorch's max_width */
    nt__strbuf *out;
} pctx;

static double elem(pctx *c, const int64_t *idx)
{
    int64_t off = 0;
    for (int i = 0; i < c->t->ndim; i++)
        off += idx[i] * c->t->stride[i];
    if (c->t->dtype == NT_I64)
        c->raw = ((const int64_t *)(const void *)c->base)[off];
    return nt__load_f64(c->base, (nt_dtype)c->t->dtype, off);
}

static void fmt_value(const pctx *c, double v, char *buf, size_t n)
{
    if (c->t->dtype == NT_BOOL) { /* PyTorch's True / False */
        snprintf(buf, n, "%s", v != 0 ? "True" : "False");
        return;
    }
    if (c->t->dtype == NT_I64) { /* exact, also past 2^53 */
        snprintf(buf, n, "%lld", (long long)c->raw);
        return;
    }
    if (!c->is_float) {
        snprintf(buf, n, "%.0f", v);
        return;
    }
    if (isnan(v)) {
        snprintf(buf, n, "nan");
    } else if (isinf(v)) {
        snprintf(buf, n, v < 0 ? "-inf" : "inf");
    } else if (c->mode == 2) {
        snprintf(buf, n, "%.4e", v);
    } else if (c->mode == 1) {
        snprintf(buf, n, "%.0f.", v);
    } else {
        snprintf(buf, n, "%.4f", v);
    }
}

/* Visits the shown elements (all, or the summarised edges). */
typedef void (*visit_fn)(pctx *c, double v, void *arg);

static void visit(pctx *c, int dim, int64_t *idx, visit_fn fn, void *arg)
{
    const nt_tensor *t = c->t;
    if (dim == t->ndim) {
        fn(c, elem(c, idx), arg);
        return;
    }
    int64_t n = t->shape[dim];
    for (int64_t i = 0; i < n; i++) {
        if (c->summarize && n > 2 * NT_PRINT_EDGE && i == NT_PRINT_EDGE)
            i = n - NT_PRINT_EDGE;
        idx[dim] = i;
        visit(c, dim + 1, idx, fn, arg);
    }
}

typedef struct {
    double maxabs, minabs;
    bool all_int, any;
} stats;

static void collect(pctx *c, double v, void *arg)
{
    (void)c;
    stats *s = arg;
    if (!isfinite(v))
        return;
    if (v != floor(v))
        s->all_int = false;
    double a = fabs(v);
    if (a == 0)
        return;
    if (!s->any || a > s->maxabs)
        s->maxabs = a;
    if (!s->any || a < s->minabs)
        s->minabs = a;
    s->any = true;
}

static void measure(pctx *c, double v, void *arg)
{
    (void)arg;
    /* PyTorch sizes float columns by the nonzero finite values only */
    if (c->is_float && (!isfinite(v) || v == 0))
        return;
    char buf[64];
    fmt_value(c, v, buf, sizeof buf);
    int w = (int)strlen(buf);
    if (w > c->width)
        c->width = w;
}

static void put_elem(pctx *c, double v)
{
    char buf[64];
    fmt_value(c, v, buf, sizeof buf);
    nt__sb_printf(c->out, "%*s", c->width, buf);
}

/* Writes dim `dim`, whose '[' sits at column `indent`, like PyTorch's
 * _tensor_str: a row is items joined by ", " and wrapped to the line width;
 * higher dims are blocks joined by "," and newlines. */
static void emit(pctx *c, int dim, int64_t *idx, int indent)
{
    const nt_tensor *t = c->t;
    int64_t n = t->shape[dim];
    bool cut = c->summarize && n > 2 * NT_PRINT_EDGE;
    nt__sb_append_c(c->out, '[');
    if (dim == t->ndim - 1) {
        int per_line = (NT_PRINT_WIDTH - indent) / (c->width + 2);
        if (per_line < 1)
            per_line = 1;
        int k = 0; /* items on this line */
        for (int64_t i = 0; i < n; i++) {
            bool ellipsis = cut && i == NT_PRINT_EDGE;
            if (i > 0 || ellipsis) {
                if (k == per_line) {
                    nt__sb_printf(c->out, ",\n%*s", indent + 1, "");
                    k = 0;
                } else if (i > 0) {
                    nt__sb_append(c->out, ", ");
                }
            }
            if (ellipsis) {
                nt__sb_append(c->out, " ...");
                k++;
                i = n - NT_PRINT_EDGE;
                if (k == per_line) {
                    nt__sb_printf(c->out, ",\n%*s", indent + 1, "");
                    k = 0;
                } else {
                    nt__sb_append(c->out, ", ");
                }
            }
            idx[dim] = i;
            put_elem(c, elem(c, idx));
            k++;
        }
    } else {
        int newlines = t->ndim - dim - 1;
        for (int64_t i = 0; i < n; i++) {
            if (i > 0) {
                nt__sb_append_c(c->out, ',');
                for (int k = 0; k < newlines; k++)
                    nt__sb_append_c(c->out, '\n');
                nt__sb_printf(c->out, "%*s", indent + 1, "");
            }
            if (cut && i == NT_PRINT_EDGE) {
                nt__sb_append(c->out, "...,");
                for (int k = 0; k < newlines; k++)
                    nt__sb_append_c(c->out, '\n');
                nt__sb_printf(c->out, "%*s", indent + 1, "");
                i = n - NT_PRINT_EDGE;
            }
            idx[dim] = i;
            emit(c, dim + 1, idx, indent + 1);
        }
    }
    nt__sb_append_c(c->out, ']');
}

/* The text for a ready tensor (the caller synchronised).  free it.  NULL:
 * the host is out of memory. */
char *nt__format_tensor(nt_tensor *t)
{
    pctx c = {0};
    nt__strbuf out = {0};
    c.t = t;
    c.base = nt__tensor_data(t);
    c.is_float = nt__dtype_is_float((nt_dtype)t->dtype);
    int64_t n = nt__numel(t->ndim, t->shape);
    c.summarize = n > NT_PRINT_THRESHOLD;
    c.out = &out;
    nt__sb_append(c.out, "tensor(");
    int64_t idx[NT_MAX_DIMS] = {0};
    if (n == 0) {
        nt__sb_append(c.out, "[]");
        if (t->ndim != 1) {
            nt__sb_append(c.out, ", size=(");
            for (int i = 0; i < t->ndim; i++)
                nt__sb_printf(c.out, i ? ", %lld" : "%lld", (long long)t->shape[i]);
            nt__sb_append(c.out, t->ndim == 1 ? ",)" : ")");
        }
    } else {
        if (c.is_float) {
            stats s = {0, 0, true, false};
            visit(&c, 0, idx, collect, &s);
            if (s.all_int)
                c.mode = (s.any && (s.maxabs / s.minabs > 1000.0 || s.maxabs > 1e8)) ? 2 : 1;
            else if (s.any && (s.maxabs / s.minabs > 1000.0 || s.maxabs > 1e8 || s.minabs < 1e-4))
                c.mode = 2;
            else
                c.mode = 0;
        }
        c.width = 1;
        visit(&c, 0, idx, measure, NULL);
        if (t->ndim == 0)
            put_elem(&c, elem(&c, idx));
        else
            emit(&c, 0, idx, (int)strlen("tensor("));
    }
    if (t->dtype != NT_F32)
        nt__sb_printf(c.out, ", dtype=%s", nt_dtype_name((nt_dtype)t->dtype));
    nt__sb_append_c(c.out, ')');
    if (out.oom) {
        free(out.str);
        return NULL;
    }
    return out.str;
}
