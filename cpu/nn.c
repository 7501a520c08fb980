/* cpu/nn.c - the row ops (softmax, log_softmax over p.dim; layer_norm,
 * rms_norm over the last dim) and the losses (cross_entropy, mse_loss).
 *
 * Arithmetic (the contract; all in f32 through core/ewise.h and the
 * canonical reductions of core/reduce.h; inputs widened exactly; one
 * rounding to the output dtype at the end):
 *   softmax      m = max(x); e_i = exp(x_i - m); s = sum(e); y_i = e_i / s
 *   log_softmax  m; d_i = x_i - m; s = sum(exp(d_i)); y_i = d_i - log(s)
 *   layer_norm   mean = sum(x) / D; d_i = x_i - mean;
 *                var = sum(d_i * d_i) / D; r = rsqrt(var + (float)eps);
 *                y_i = d_i * r, then * w_i, then + b_i (when given)
 *   rms_norm     ms = sum(x_i * x_i) / D; r = rsqrt(ms + (float)eps);
 *                y_i = x_i * r, then * w_i
 *   cross_entropy  per row of logits [N, C]: m, d_i, ls = log(sum(exp(d_i)));
 *                nll = -(d_label - ls); loss = sum(nll[0..N)) / N
 *   mse_loss     sq_i = (a_i - b_i) * (a_i - b_i); loss = sum(sq) / numel,
 *                sum in row-major order
 * Every sum and max is nt__red_sum_f32 / nt__red_max_f32 over the row in
 * index order, and every division by a count divides by (float)count. */
#include "cpu/rows.h"

#include <string.h>

#include "core/ewise.h"
#include "core/gemm.h"
#include "core/reduce.h"

/* Floats a row-op kernel holds per group ([n, w] tiles). */
#define ROW_TILE (32 * 1024)

typedef struct rowop {
    int op;
    char *y;
    nt_dtype ydt;
    int64_t yes;
    float eps;
    const float *wv, *bv;  /* affine parameters widened to f32, or NULL */
    float *T, *U;          /* [n, w] work tiles */
    float *s1, *s2;        /* [w] per-column statistics */
    const int32_t *labels; /* cross_entropy */
    float *nll;
} rowop;

/* Stores the [n, w] tile T to the group's output rows. */
static void store_tile(const nt__rows *R, const rowop *c, const float *T, int64_t oo, int64_t w)
{
    char *y = c->y + oo * c->yes;
    if (w == 1) {
        nt__st_f32(y, c->ydt, R->on, T, R->n);
        return;
    }
    for (int64_t k = 0; k < R->n; k++)
        nt__st_f32(y + k * R->on * c->yes, c->ydt, R->oc, T + k * w, w);
}

/* Elementwise helpers.  Fixed blocks of VB with restrict pointers, so GCC's
 * -O2 cost model vectorises them (it will not for an unknown trip count);
 * each element gets the same single IEEE operation as a scalar loop would. */
#define VB 64
#define NT__VLOOP(n, body)                                                  \
    do {                                                                    \
        int64_t i0_ = 0;                                                    \
        for (; i0_ + VB <= (n); i0_ += VB)                                  \
            for (int64_t i = i0_; i < i0_ + VB; i++)                        \
                body;                                                       \
        for (int64_t i = i0_; i < (n); i++)                                 \
            body;                                                           \
    } while (0)

enum { V_SUB, V_MUL, V_DIV, V_ADD };

/* y[i] = y[i] op s */
static void v_op_s(int op, float *restrict y, int64_t n, float s)
{
    switch (op) {
    case V_SUB: NT__VLOOP(n, y[i] = y[i] - s); break;
    case V_MUL: NT__VLOOP(n, y[i] = y[i] * s); break;
    case V_DIV: NT__VLOOP(n, y[i] = y[i] / s); break;
    default: NT__VLOOP(n, y[i] = y[i] + s); break;
    }
}

/* y[i] = y[i] op v[i] */
static void v_op_v(int op, float *restrict y, const float *restrict v, int64_t n)
{
    switch (op) {
    case V_SUB: NT__VLOOP(n, y[i] = y[i] - v[i]); break;
    case V_MUL: NT__VLOOP(n, y[i] = y[i] * v[i]); break;
    case V_DIV: NT__VLOOP(n, y[i] = y[i] / v[i]); break;
    default: NT__VLOOP(n, y[i] = y[i] + v[i]); break;
    }
}

/* T[k, j] = T[k, j] op s[j]: one statistic per column (per row of x) */
static void cols_op(int op, float *T, const float *s, int64_t n, int64_t w)
{
    if (w == 1)
        v_op_s(op, T, n, s[0]);
    else
        for (int64_t k = 0; k < n; k++)
            v_op_v(op, T + k * w, s, w);
}

/* T[k, j] = T[k, j] op p[k]: one parameter per position along the row */
static void rows_op(int op, float *T, const float *p, int64_t n, int64_t w)
{
    if (w == 1)
        v_op_v(op, T, p, n);
    else
        for (int64_t k = 0; k < n; k++)
            v_op_s(op, T + k * w, w, p[k]);
}

/* U[i] = T[i] * T[i] */
static void v_sq(float *restrict U, const float *restrict T, int64_t n)
{
    NT__VLOOP(n, U[i] = T[i] * T[i]);
}

/* ---------------- softmax, log_softmax ---------------- */

static void softmax_group(const nt__rows *R, void *ctx, const char *x, int64_t oo, int64_t w)
{
    rowop *c = ctx;
    int64_t n = R->n, nw = n * w;
    float *T = c->T, *U = c->U;
    nt__rows_load_f32(R, x, 0, n, w, T);
    for (int64_t j = 0; j < w; j++)
        c->s1[j] = nt__red_max_f32(T + j, n, w);
    cols_op(V_SUB, T, c->s1, n, w); /* d = x - m */
    if (c->op == NT_OP_SOFTMAX) {
        nt__expf_n(T, T, nw); /* bitwise nt__ew_exp */
        for (int64_t j = 0; j < w; j++)
            c->s2[j] = nt__red_sum_f32(T + j, n, w);
        cols_op(V_DIV, T, c->s2, n, w);
    } else {
        nt__expf_n(U, T, nw);
        for (int64_t j = 0; j < w; j++)
            c->s2[j] = nt__ew_log(nt__red_sum_f32(U + j, n, w));
        cols_op(V_SUB, T, c->s2, n, w); /* d - log(s) */
    }
    store_tile(R, c, T, oo, w);
}

/* ---------------- layer_norm, rms_norm ---------------- */

static void norm_group(const nt__rows *R, void *ctx, const char *x, int64_t oo, int64_t w)
{
    rowop *c = ctx;
    int64_t n = R->n, nw = n * w;
    float *T = c->T, *U = c->U;
    float D = (float)n;
    nt__rows_load_f32(R, x, 0, n, w, T);
    if (c->op == NT_OP_LAYER_NORM) {
        for (int64_t j = 0; j < w; j++)
            c->s1[j] = nt__red_sum_f32(T + j, n, w) / D; /* mean */
        cols_op(V_SUB, T, c->s1, n, w);                  /* d */
    }
    v_sq(U, T, nw);
    for (int64_t j = 0; j < w; j++)
        c->s2[j] = nt__ew_rsqrt(nt__red_sum_f32(U + j, n, w) / D + c->eps);
    cols_op(V_MUL, T, c->s2, n, w);
    if (c->wv)
        rows_op(V_MUL, T, c->wv, n, w);
    if (c->bv)
        rows_op(V_ADD, T, c->bv, n, w);
    store_tile(R, c, T, oo, w);
}

/* ---------------- cross_entropy ---------------- */

/* Rows of logits along dim 1; the group's output offset is its row index. */
static void xent_group(const nt__rows *R, void *ctx, const char *x, int64_t oo, int64_t w)
{
    rowop *c = ctx;
    int64_t n = R->n, nw = n * w;
    float *T = c->T, *U = c->U;
    nt__rows_load_f32(R, x, 0, n, w, T);
    for (int64_t j = 0; j < w; j++)
        c->s1[j] = nt__red_max_f32(T + j, n, w);
    cols_op(V_SUB, T, c->s1, n, w);
    nt__expf_n(U, T, nw);
    for (int64_t j = 0; j < w; j++) {
        float ls = nt__ew_log(nt__red_sum_f32(U + j, n, w));
        int64_t row = oo + j * R->oc;
        c->nll[row] = -(T[(int64_t)c->labels[row] * w + j] - ls);
    }
}

/* ---------------- drivers ---------------- */

/* Blocks of groups (nt__rows_blocks), each with its own work tiles. */
typedef struct row_par {
    const nt__rows *R;
    const rowop *base;
    nt__rows_fn fn;
    int64_t w, G, per;
    size_t cells;
    volatile AO_t fail; /* a block had no memory for its tiles */
} row_par;

static void row_block(void *arg, int b)
{
    row_par *p = arg;
    rowop c = *p->base;
    float *buf = g_try_malloc((2 * p->cells + 2 * (size_t)p->w) * sizeof(float));
    if (!buf) {
        AO_store(&p->fail, 1);
        return;
    }
    c.T = buf;
    c.U = buf + p->cells;
    c.s1 = buf + 2 * p->cells;
    c.s2 = c.s1 + p->w;
    int64_t g0 = (int64_t)b * p->per, g1 = g0 + p->per < p->G ? g0 + p->per : p->G;
    nt__rows_range(p->R, p->w, g0, g1, p->fn, &c);
    g_free(buf);
}

static int run_rows(rowop *c, const nt_tensor *t, int d, bool same_shape, nt__rows_fn fn)
{
    nt__rows R;
    nt__rows_init(&R, t, d, same_shape);
    row_par p = {.R = &R, .base = c, .fn = fn};
    p.w = nt__rows_width(&R, R.n, ROW_TILE);
    p.cells = (size_t)(R.n > 0 ? R.n : 1) * (size_t)p.w;
    p.G = nt__rows_groups(&R, p.w);
    int nb = nt__rows_blocks(&R, p.w, &p.per);
    nt__par_blocks(nb, row_block, &p, nb >= 2);
    if (AO_load(&p.fail))
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a %zu-float row buffer",
                        2 * p.cells);
    return 0;
}

static void rowop_out(rowop *c, const nt__rec *r)
{
    memset(c, 0, sizeof *c);
    c->op = r->op;
    c->y = nt__tensor_data(r->out[0]);
    c->ydt = (nt_dtype)r->out[0]->dtype;
    c->yes = (int64_t)nt__dtype_size(c->ydt);
}

static int softmax_kernel(const nt__rec *r)
{
    rowop c;
    rowop_out(&c, r);
    if (nt__numel(r->in[0]->ndim, r->in[0]->shape) == 0)
        return 0;
    return run_rows(&c, r->in[0], r->p.dim, true, softmax_group);
}

int nt__cpu_softmax(const nt__rec *r) { return softmax_kernel(r); }
int nt__cpu_log_softmax(const nt__rec *r) { return softmax_kernel(r); }

static int norm_kernel(const nt__rec *r)
{
    const nt_tensor *x = r->in[0];
    const nt_tensor *w = r->in[1];
    const nt_tensor *b = r->op == NT_OP_LAYER_NORM ? r->in[2] : NULL;
    rowop c;
    rowop_out(&c, r);
    c.eps = (float)r->p.f[0];
    int64_t D = x->shape[x->ndim - 1];
    if (nt__numel(x->ndim, x->shape) == 0)
        return 0;
    float *aff = g_try_malloc((size_t)(2 * D) * sizeof(float));
    if (!aff)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for the affine parameters");
    if (w) {
        nt__gather_f32(aff, w);
        c.wv = aff;
    }
    if (b) {
        nt__gather_f32(aff + D, b);
        c.bv = aff + D;
    }
    int rc = run_rows(&c, x, x->ndim - 1, true, norm_group);
    g_free(aff);
    return rc;
}

int nt__cpu_layer_norm(const nt__rec *r) { return norm_kernel(r); }
int nt__cpu_rms_norm(const nt__rec *r) { return norm_kernel(r); }

int nt__cpu_cross_entropy(const nt__rec *r)
{
    const nt_tensor *logits = r->in[0], *lab = r->in[1];
    int64_t N = logits->shape[0], C = logits->shape[1];
    rowop c;
    rowop_out(&c, r);
    int32_t *labels = g_try_malloc((size_t)N * (sizeof(int32_t) + sizeof(float)));
    if (!labels)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for %lld labels", (long long)N);
    nt__ld_i32(labels, nt__tensor_data(lab), (nt_dtype)lab->dtype, lab->stride[0], N);
    for (int64_t i = 0; i < N; i++)
        if (labels[i] < 0 || labels[i] >= C) {
            int rc = nt__kerr(NT_ERANGE, "labels[%lld] = %d is out of range [0, %lld)",
                              (long long)i, labels[i], (long long)C);
            g_free(labels);
            return rc;
        }
    c.labels = labels;
    c.nll = (float *)(labels + N);
    int rc = run_rows(&c, logits, 1, false, xent_group);
    if (rc == 0) {
        float loss = nt__red_sum_f32(c.nll, N, 1) / (float)N;
        nt__st_f32(c.y, c.ydt, 1, &loss, 1);
    }
    g_free(labels);
    return rc;
}

/* ---------------- mse_loss ---------------- */

int nt__cpu_mse_loss(const nt__rec *r)
{
    const nt_tensor *a = r->in[0], *b = r->in[1];
    int64_t n = nt__numel(a->ndim, a->shape);
    nt__flat Fa, Fb;
    nt__flat_init(&Fa, a);
    nt__flat_init(&Fb, b);
    float A[NT_RED_BLOCK], B[NT_RED_BLOCK];
    float acc = 0.0f; /* the canonical sum, block by block (core/reduce.h) */
    for (int64_t k0 = 0; k0 < n; k0 += NT_RED_BLOCK) {
        int64_t m = n - k0 < NT_RED_BLOCK ? n - k0 : NT_RED_BLOCK;
        nt__flat_read_f32(&Fa, A, m);
        nt__flat_read_f32(&Fb, B, m);
        for (int64_t i = 0; i < m; i++) {
            float d = A[i] - B[i];
            A[i] = d * d;
        }
        acc += nt__red_block_sum_f32(A, m, 1);
    }
    float loss = acc / (float)n;
    nt__st_f32(nt__tensor_data(r->out[0]), (nt_dtype)r->out[0]->dtype, 1, &loss, 1);
    return 0;
}
