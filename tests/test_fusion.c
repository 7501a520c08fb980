/* tests/test_fusion.c - fused == unfused, bit for bit.
 *
 * The differential test generates random op programs (DAGs over 30+ op kinds,
 * broadcasting shapes, f32/bf16/f16, reductions, row ops, matmuls, views,
 * in-place writes), runs each in deterministic mode and in eager, adaptive
 * and lazy mode (lazy with small windows too, so batches split anywhere),
 * and compares every output bit for bit.  A failure prints the seed; set
 * NT_DIFF_SEED=n to replay one program, NT_DIFF_PROGRAMS=n to run more.
 * Print invariance runs the same programs with nt_to_host / nt_format at
 * random points.  Then one unit test per grouping rule and break reason. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <glib.h>

#include "ntensor.h"
#include "cpu/cpu.h"
#include "cpu/subnormal.h"
#include "fusion/fusion.h"
#include "streams/stream.h"
#include "nt_test.h"

static int setup(void **state)
{
    nt_test_setup(state);
    nt_config_set("NT_BACKEND", "cpu");
    return 0;
}

/* ---------------- random programs ---------------- */

typedef struct {
    uint64_t s;
} rng;

static uint64_t rnext(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rint_(rng *r, int n) { return (int)(rnext(r) % (uint64_t)n); }
static double runi(rng *r) { return (double)(rnext(r) >> 11) * 0x1p-53; }

enum {
    P_ADD, P_SUB, P_MUL, P_DIV, P_MAXIMUM, P_MINIMUM, P_LT, P_GE, P_EQ, P_WHERE,
    P_NEG, P_EXP, P_LOG, P_SQRT, P_RSQRT, P_ABS, P_RELU, P_GELU, P_SIGMOID, P_TANH, P_SILU,
    P_ADDS, P_MULS, P_DIVS, P_POWS, P_CLAMP, P_CAST,
    P_SUM, P_MEAN, P_MAX, P_SOFTMAX, P_LOGSOFTMAX, P_LAYERNORM, P_RMSNORM,
    P_MATMUL, P_TRANSPOSE, P_RESHAPE, P_SLICE, P_INPLACE_ADD, P_INPLACE_MULS, P_COPY_INTO,
    P_MSE, P_NKINDS
};

#define MAXV 64
#define MAXSTEP 48

typedef struct {
    int kind, a, b, c;   /* operand value indices */
    double s0, s1;
    int dim, keep, dt;
} step;

typedef struct {
    int nin;             /* values 0..nin-1 are inputs */
    int64_t R, C, K;
    int in_ndim[4];
    int64_t in_shape[4][2];
    int in_dt[4];
    uint64_t data_seed;
    int nsteps;
    step st[MAXSTEP];
    bool keep[MAXV];     /* value read back at the end */
    int last_use[MAXV];
    int sync_at[MAXSTEP];/* print invariance: value to read after step i, or -1 */
} program;

/* Shapes of values as the generator tracks them (ndim <= 2). */
typedef struct {
    int ndim;
    int64_t sh[2];
    int dt;
} vinfo;

static bool bcast_ok(const vinfo *x, const vinfo *y)
{
    for (int i = 0; i < 2; i++) {
        int ix = x->ndim - 1 - i, iy = y->ndim - 1 - i;
        int64_t dx = ix >= 0 ? x->sh[ix] : 1, dy = iy >= 0 ? y->sh[iy] : 1;
        if (dx != dy && dx != 1 && dy != 1)
            return false;
    }
    return true;
}

static const int float_dts[3] = {NT_F32, NT_BF16, NT_F16};

/* ---------------- more ops for the programs: one line each ----------------
 *
 * The ops added since the kinds above were written (the transformer era),
 * as a table: a program step of kind P_NKINDS + i runs xops[i].  A new op
 * is one line here -- a plain unary op by name (`un`), anything else
 * through a small x_<name> adaptor (`fn`) -- and its shape class says which
 * operands the generator may give it and what it returns. */
typedef enum {
    XS_SAME,   /* floating a of any shape -> a's shape and dtype */
    XS_SAME1,  /* the same, a at least 1-D */
    XS_2D,     /* the same, a 2-D */
    XS_REDUCE, /* floating a, reduced over s->dim (NT_DIM_ALL too) as nt_sum is */
    XS_BINARY, /* floating a and b broadcast together, promoted as nt_add */
} xshape;

typedef struct {
    const char *name;
    xshape shape;
    nt_tensor *(*un)(nt_tensor *a);                              /* a unary op, or */
    nt_tensor *(*fn)(nt_tensor *a, nt_tensor *b, const step *s); /* an adaptor */
} xop;

/* u8 [R, C] where a < s0: masks that depend on the values. */
static nt_tensor *x_masked_fill(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b;
    nt_tensor *z = nt_full(NT_F32, 0, NULL, s->s0);
    nt_tensor *m = nt_lt(a, z);
    nt_tensor *y = nt_masked_fill(a, m, s->s1);
    nt_release(z);
    nt_release(m);
    return y;
}

/* While a program is captured (the "captured" column of the differential),
 * an index tensor the program makes from host data is named an input of the
 * capture: a replay reads it again (docs/graphs.md refuses host data baked
 * in otherwise). */
static int capture_aux;

static nt_tensor *host_index(const int32_t *buf, int nd, const int64_t *shape)
{
    nt_tensor *t = nt_from_host(buf, NT_I32, nd, shape);
    if (t && capture_aux) {
        char nm[16];
        snprintf(nm, sizeof nm, "aux%d", capture_aux++ - 1);
        assert_int_equal(nt_graph_input(t, nm), 0);
    }
    return t;
}

static nt_tensor *x_gather(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b, (void)s;
    int64_t r = nt_shape(a, 0), c = nt_shape(a, 1);
    int32_t *buf = malloc(sizeof *buf * (size_t)(r * c));
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++)
            buf[i * c + j] = (int32_t)((i * 7 + j * 3 + 1) % c);
    nt_tensor *idx = host_index(buf, 2, (int64_t[]){r, c});
    free(buf);
    nt_tensor *y = nt_gather(a, 1, idx);
    nt_release(idx);
    return y;
}

static nt_tensor *x_index_select(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b, (void)s;
    int64_t r = nt_shape(a, 0);
    int32_t *buf = malloc(sizeof *buf * (size_t)r);
    for (int64_t i = 0; i < r; i++)
        buf[i] = (int32_t)((i * 5 + 1) % r);
    nt_tensor *idx = host_index(buf, 1, (int64_t[]){r});
    free(buf);
    nt_tensor *y = nt_index_select(a, 0, idx);
    nt_release(idx);
    return y;
}

static nt_tensor *x_tril(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b;
    return nt_tril(a, (int64_t)lround(s->s0 * 2));
}
static nt_tensor *x_triu(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b;
    return nt_triu(a, (int64_t)lround(s->s0 * 2));
}
static nt_tensor *x_norm(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b;
    static const double ords[4] = {2, 1, INFINITY, 3};
    return nt_norm(a, ords[(s->dt + (int)(s->s1 * 4)) & 3], s->dim, s->keep);
}
static nt_tensor *x_min(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b;
    return nt_min(a, s->dim, s->keep);
}
static nt_tensor *x_leaky_relu(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b;
    return nt_leaky_relu(a, s->s0);
}
static nt_tensor *x_hardtanh(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b;
    return nt_hardtanh(a, s->s0, s->s1);
}
static nt_tensor *x_pow(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)s;
    return nt_pow(a, b);
}
static nt_tensor *x_dropout(nt_tensor *a, nt_tensor *b, const step *s)
{
    (void)b, (void)s;
    return nt_dropout(a, 0.25, 7);
}

static const xop xops[] = {
    {"softplus", XS_SAME, nt_softplus, NULL},
    {"mish", XS_SAME, nt_mish, NULL},
    {"softsign", XS_SAME, nt_softsign, NULL},
    {"reciprocal", XS_SAME, nt_reciprocal, NULL},
    {"leaky_relu", XS_SAME, NULL, x_leaky_relu},
    {"hardtanh", XS_SAME, NULL, x_hardtanh},
    {"tril", XS_2D, NULL, x_tril},
    {"triu", XS_2D, NULL, x_triu},
    {"masked_fill", XS_2D, NULL, x_masked_fill},
    {"gather", XS_2D, NULL, x_gather},
    {"index_select", XS_SAME1, NULL, x_index_select},
    {"norm", XS_REDUCE, NULL, x_norm},
    {"min", XS_REDUCE, NULL, x_min},
    {"pow", XS_BINARY, NULL, x_pow},
    {"gelu_tanh", XS_SAME, nt_gelu_tanh, NULL},
    {"dropout", XS_SAME, NULL, x_dropout},
};
#define NXOPS ((int)(sizeof xops / sizeof xops[0]))
static int xop_runs[NXOPS]; /* steps each ran, for the summary */

/* The output of xop x on A, B (or false: it does not apply to them). */
static bool xop_out(const xop *x, step *s, const vinfo *A, const vinfo *B, vinfo *out, rng *r)
{
    bool af = A->dt != NT_U8;
    *out = *A;
    if (!af)
        return false;
    switch (x->shape) {
    case XS_SAME:
        return true;
    case XS_SAME1:
        return A->ndim >= 1;
    case XS_2D:
        return A->ndim == 2;
    case XS_REDUCE:
        if (A->ndim == 0)
            return false;
        s->dim = rint_(r, 3) == 0 ? NT_DIM_ALL : rint_(r, A->ndim);
        if (s->dim == NT_DIM_ALL) {
            out->ndim = s->keep ? A->ndim : 0;
            out->sh[0] = out->sh[1] = 1;
        } else if (s->keep) {
            out->sh[s->dim] = 1;
        } else {
            out->ndim = A->ndim - 1;
            if (s->dim == 0)
                out->sh[0] = A->sh[1];
        }
        return true;
    case XS_BINARY:
        if (!bcast_ok(A, B) || B->dt == NT_U8)
            return false;
        if (B->ndim > out->ndim || (B->ndim == out->ndim && B->sh[0] > out->sh[0]))
            *out = *B;
        for (int i = 0; i < out->ndim; i++) {
            int ia = A->ndim - out->ndim + i, ib = B->ndim - out->ndim + i;
            int64_t da = ia >= 0 ? A->sh[ia] : 1, db = ib >= 0 ? B->sh[ib] : 1;
            out->sh[i] = da > db ? da : db;
        }
        out->dt = A->dt == B->dt ? A->dt : NT_F32;
        return true;
    }
    return false;
}

static void gen(program *p, uint64_t seed)
{
    rng r = {seed * 0x2545f4914f6cdd1dull + 1};
    memset(p, 0, sizeof *p);
    p->R = 1 + rint_(&r, 9);
    p->C = 2 + rint_(&r, 40);
    p->K = 1 + rint_(&r, 20);
    p->data_seed = rnext(&r);
    vinfo v[MAXV];
    int nv = 0;
    /* inputs: the main [R, C] tensor, a row [C], a column [R, 1], a weight [C, K] */
    int64_t shapes[4][2] = {{p->R, p->C}, {p->C, 0}, {p->R, 1}, {p->C, p->K}};
    int nds[4] = {2, 1, 2, 2};
    p->nin = 4;
    for (int i = 0; i < 4; i++) {
        p->in_ndim[i] = nds[i];
        p->in_shape[i][0] = shapes[i][0];
        p->in_shape[i][1] = shapes[i][1];
        p->in_dt[i] = rint_(&r, 3) == 0 ? float_dts[rint_(&r, 3)] : NT_F32;
        v[nv++] = (vinfo){nds[i], {shapes[i][0], shapes[i][1]}, p->in_dt[i]};
    }
    p->nsteps = 8 + rint_(&r, MAXSTEP - 8);
    for (int k = 0; k < p->nsteps; k++) {
        step *s = &p->st[k];
        p->sync_at[k] = -1;
        for (int tries = 0; tries < 50; tries++) {
            memset(s, 0, sizeof *s);
            s->kind = rint_(&r, P_NKINDS + NXOPS);
            /* prefer recent values: long chains fuse */
            s->a = nv - 1 - rint_(&r, nv < 6 ? nv : 6);
            if (rint_(&r, 4) == 0)
                s->a = rint_(&r, nv);
            s->b = rint_(&r, nv);
            s->c = rint_(&r, nv);
            s->s0 = (double)(rint_(&r, 9) - 4) * 0.375 + 0.125;
            s->s1 = s->s0 + 0.5 + runi(&r);
            s->keep = rint_(&r, 2);
            s->dt = float_dts[rint_(&r, 3)];
            vinfo *A = &v[s->a], *B = &v[s->b];
            bool af = A->dt != NT_U8;
            vinfo out = *A;
            if (s->kind >= P_NKINDS) {
                if (!xop_out(&xops[s->kind - P_NKINDS], s, A, B, &out, &r))
                    continue;
                v[nv++] = out;
                goto next;
            }
            switch (s->kind) {
            case P_ADD: case P_SUB: case P_MUL: case P_DIV: case P_MAXIMUM: case P_MINIMUM:
                if (!bcast_ok(A, B) || !af || B->dt == NT_U8)
                    continue;
                if (B->ndim > out.ndim || (B->ndim == out.ndim && B->sh[0] > out.sh[0]))
                    out = *B;
                for (int i = 0; i < out.ndim; i++) {
                    int ia = A->ndim - out.ndim + i, ib = B->ndim - out.ndim + i;
                    int64_t da = ia >= 0 ? A->sh[ia] : 1, db = ib >= 0 ? B->sh[ib] : 1;
                    out.sh[i] = da > db ? da : db;
                }
                out.dt = A->dt == B->dt ? A->dt : NT_F32;
                break;
            case P_LT: case P_GE: case P_EQ:
                if (!bcast_ok(A, B))
                    continue;
                if (B->ndim > out.ndim)
                    out = *B;
                for (int i = 0; i < out.ndim; i++) {
                    int ia = A->ndim - out.ndim + i, ib = B->ndim - out.ndim + i;
                    int64_t da = ia >= 0 ? A->sh[ia] : 1, db = ib >= 0 ? B->sh[ib] : 1;
                    out.sh[i] = da > db ? da : db;
                }
                out.dt = NT_U8;
                break;
            case P_WHERE: {
                vinfo *Cv = &v[s->c];
                if (!bcast_ok(A, B) || !bcast_ok(A, Cv) || !bcast_ok(B, Cv) || B->dt == NT_U8 ||
                    Cv->dt == NT_U8)
                    continue;
                /* result: the broadcast of all three */
                vinfo o = *A;
                const vinfo *all[3] = {A, B, Cv};
                int nd = 0;
                for (int q = 0; q < 3; q++)
                    nd = all[q]->ndim > nd ? all[q]->ndim : nd;
                o.ndim = nd;
                for (int i = 0; i < nd; i++) {
                    int64_t m = 1;
                    for (int q = 0; q < 3; q++) {
                        int j = all[q]->ndim - nd + i;
                        int64_t d = j >= 0 ? all[q]->sh[j] : 1;
                        m = d > m ? d : m;
                    }
                    o.sh[i] = m;
                }
                o.dt = B->dt == Cv->dt ? B->dt : NT_F32;
                out = o;
                break;
            }
            case P_CAST:
                out.dt = s->dt;
                break;
            case P_SUM: case P_MEAN: case P_MAX:
                if (!af || A->ndim == 0)
                    continue;
                s->dim = rint_(&r, 3) == 0 ? -1000 : rint_(&r, A->ndim);
                if (s->dim == -1000) {
                    out.ndim = s->keep ? A->ndim : 0;
                    out.sh[0] = out.sh[1] = 1;
                } else if (s->keep) {
                    out.sh[s->dim] = 1;
                } else {
                    out.ndim = A->ndim - 1;
                    if (s->dim == 0)
                        out.sh[0] = A->sh[1];
                }
                break;
            case P_SOFTMAX: case P_LOGSOFTMAX:
                if (!af || A->ndim == 0)
                    continue;
                s->dim = rint_(&r, A->ndim);
                break;
            case P_LAYERNORM: case P_RMSNORM:
                if (!af || A->ndim == 0)
                    continue;
                break;
            case P_MATMUL:
                if (!af || A->ndim != 2 || A->sh[1] != p->C || v[3].dt != A->dt)
                    continue;
                s->b = 3;
                out.sh[1] = p->K;
                break;
            case P_TRANSPOSE:
                if (A->ndim != 2)
                    continue;
                out.sh[0] = A->sh[1];
                out.sh[1] = A->sh[0];
                break;
            case P_RESHAPE:
                out.ndim = 1;
                out.sh[0] = A->ndim == 0 ? 1 : A->ndim == 1 ? A->sh[0] : A->sh[0] * A->sh[1];
                break;
            case P_SLICE:
                if (A->ndim == 0 || A->sh[A->ndim - 1] < 2)
                    continue;
                out.sh[A->ndim - 1] = (A->sh[A->ndim - 1] + 1) / 2;
                break;
            case P_INPLACE_ADD: case P_COPY_INTO:
                if (!af || !bcast_ok(A, B) || B->dt == NT_U8)
                    continue;
                /* B must broadcast to A's own shape */
                if (B->ndim > A->ndim)
                    continue;
                {
                    bool ok = true;
                    for (int i = 0; i < B->ndim; i++) {
                        int64_t db = B->sh[i], da = A->sh[A->ndim - B->ndim + i];
                        ok &= db == da || db == 1;
                    }
                    if (!ok)
                        continue;
                }
                break;
            case P_INPLACE_MULS:
                if (!af)
                    continue;
                break;
            case P_MSE:
                if (!af || A->ndim != B->ndim || A->sh[0] != B->sh[0] ||
                    (A->ndim > 1 && A->sh[1] != B->sh[1]) || B->dt == NT_U8)
                    continue;
                out.ndim = 0;
                out.dt = A->dt == B->dt ? A->dt : NT_F32;
                break;
            default: /* unary, scalar */
                if (!af)
                    continue;
                break;
            }
            v[nv++] = out;
            goto next;
        }
        p->nsteps = k; /* could not find a valid op: stop early */
        break;
    next:;
    }
    for (int i = 0; i < nv; i++)
        p->keep[i] = rint_(&r, 3) == 0;
    p->keep[nv - 1] = true;
    for (int i = 0; i < MAXV; i++)
        p->last_use[i] = -1;
    for (int k = 0; k < p->nsteps; k++) {
        const step *s = &p->st[k];
        int uses[3] = {s->a, s->b, s->c};
        for (int q = 0; q < 3; q++)
            p->last_use[uses[q]] = k;
    }
}

static void fill_input(float *buf, int64_t n, uint64_t seed)
{
    rng r = {seed};
    for (int64_t i = 0; i < n; i++) {
        /* a mix of magnitudes, some exact ties and zeros */
        int c = rint_(&r, 10);
        buf[i] = c == 0 ? 0.0f : c == 1 ? 1.0f : (float)((runi(&r) - 0.4) * (c < 5 ? 4.0 : 0.5));
    }
}

/* Program p's inputs, from its data seed, into v[0..nin). */
static int make_inputs(const program *p, nt_tensor **v)
{
    int nv = 0;
    for (int i = 0; i < p->nin; i++) {
        int64_t n = p->in_shape[i][0] * (p->in_ndim[i] == 2 ? p->in_shape[i][1] : 1);
        float *buf = malloc((size_t)n * sizeof(float));
        fill_input(buf, n, p->data_seed + (uint64_t)i);
        nt_tensor *f = nt_from_host(buf, NT_F32, p->in_ndim[i], p->in_shape[i]);
        v[nv++] = nt_cast(f, (nt_dtype)p->in_dt[i]);
        nt_release(f);
        free(buf);
    }
    return nv;
}

/* Appends the bytes of every kept value (and the last) of v[0..nv) to out
 * and releases them all. */
static void read_outputs(const program *p, nt_tensor **v, int nv, GByteArray *out)
{
    for (int i = 0; i < nv; i++) {
        if (!v[i])
            continue;
        if (p->keep[i] || i == nv - 1) {
            size_t nb = (size_t)nt_numel(v[i]) * nt_dtype_size(nt_dtype_of(v[i]));
            guint8 *buf = g_malloc(nb ? nb : 1);
            assert_int_equal(nt_to_host(v[i], buf, nb), 0);
            if (getenv("NT_DIFF_VERBOSE"))
                print_message("# v%d at byte %u, %zu bytes, dtype %d\n", i, out->len, nb,
                              nt_dtype_of(v[i]));
            g_byte_array_append(out, buf, (guint)nb);
            g_free(buf);
        }
        nt_release(v[i]);
    }
}

/* Runs p's steps on v[0..nv) (its inputs), appending each step's value;
 * with `syncs`, reads values back at the generator's chosen points.
 * Returns the count of values. */
static int exec_steps(const program *p, nt_tensor **v, int nv, bool syncs, uint64_t sync_seed)
{
    rng sr = {sync_seed};
    for (int k = 0; k < p->nsteps; k++) {
        const step *s = &p->st[k];
        nt_tensor *A = v[s->a], *B = v[s->b], *Cc = v[s->c], *y = NULL;
        if (s->kind >= P_NKINDS) {
            const xop *x = &xops[s->kind - P_NKINDS];
            y = x->un ? x->un(A) : x->fn(A, B, s);
            xop_runs[s->kind - P_NKINDS]++;
        }
        switch (s->kind) {
        case P_ADD: y = nt_add(A, B); break;
        case P_SUB: y = nt_sub(A, B); break;
        case P_MUL: y = nt_mul(A, B); break;
        case P_DIV: y = nt_div(A, B); break;
        case P_MAXIMUM: y = nt_maximum(A, B); break;
        case P_MINIMUM: y = nt_minimum(A, B); break;
        case P_LT: y = nt_lt(A, B); break;
        case P_GE: y = nt_ge(A, B); break;
        case P_EQ: y = nt_eq(A, B); break;
        case P_WHERE: y = nt_where(A, B, Cc); break;
        case P_NEG: y = nt_neg(A); break;
        case P_EXP: y = nt_exp(A); break;
        case P_LOG: y = nt_log(A); break;
        case P_SQRT: y = nt_sqrt(A); break;
        case P_RSQRT: y = nt_rsqrt(A); break;
        case P_ABS: y = nt_abs(A); break;
        case P_RELU: y = nt_relu(A); break;
        case P_GELU: y = nt_gelu(A); break;
        case P_SIGMOID: y = nt_sigmoid(A); break;
        case P_TANH: y = nt_tanh(A); break;
        case P_SILU: y = nt_silu(A); break;
        case P_ADDS: y = nt_add_scalar(A, s->s0); break;
        case P_MULS: y = nt_mul_scalar(A, s->s0); break;
        case P_DIVS: y = nt_div_scalar(A, s->s0); break;
        case P_POWS: y = nt_pow_scalar(A, fabs(s->s0) + 0.5); break;
        case P_CLAMP: y = nt_clamp(A, s->s0, s->s1); break;
        case P_CAST: y = nt_cast(A, (nt_dtype)s->dt); break;
        case P_SUM: y = nt_sum(A, s->dim, s->keep); break;
        case P_MEAN: y = nt_mean(A, s->dim, s->keep); break;
        case P_MAX: y = nt_max(A, s->dim, s->keep); break;
        case P_SOFTMAX: y = nt_softmax(A, s->dim); break;
        case P_LOGSOFTMAX: y = nt_log_softmax(A, s->dim); break;
        case P_LAYERNORM: y = nt_layer_norm(A, NULL, NULL, 1e-5); break;
        case P_RMSNORM: y = nt_rms_norm(A, NULL, 1e-6); break;
        case P_MATMUL: y = nt_matmul(A, B); break;
        case P_TRANSPOSE: y = nt_transpose(A, 0, 1); break;
        case P_RESHAPE: y = nt_reshape(A, 1, (int64_t[]){-1}); break;
        case P_SLICE: y = nt_slice(A, -1, 0, INT64_MAX, 2); break;
        case P_INPLACE_ADD:
        case P_INPLACE_MULS:
        case P_COPY_INTO:
            /* write into a fresh copy, so other values stay as they were */
            y = nt_mul_scalar(A, 1.0);
            if (s->kind == P_INPLACE_ADD)
                nt_add_inplace(y, B);
            else if (s->kind == P_INPLACE_MULS)
                nt_mul_scalar_inplace(y, s->s0);
            else
                nt_copy_into(y, B);
            break;
        case P_MSE: y = nt_mse_loss(A, B); break;
        }
        if (!y) {
            print_error("step %d (kind %d) failed: %s\n", k, s->kind, nt_last_error_message());
            fail();
        }
        v[nv++] = y;
        /* drop values nobody reads any more: they become dead intermediates */
        for (int i = 0; i < nv; i++)
            if (v[i] && !p->keep[i] && p->last_use[i] <= k && i < nv - 1) {
                nt_release(v[i]);
                v[i] = NULL;
            }
        if (syncs && rint_(&sr, 4) == 0) {
            int pick = rint_(&sr, nv);
            if (v[pick]) {
                if (rint_(&sr, 3) == 0) {
                    char *txt = nt_format(v[pick]);
                    g_free(txt);
                } else {
                    size_t nb = (size_t)nt_numel(v[pick]) * nt_dtype_size(nt_dtype_of(v[pick]));
                    void *tmp = malloc(nb ? nb : 1);
                    nt_to_host(v[pick], tmp, nb);
                    free(tmp);
                }
            }
        }
    }
    return nv;
}

/* Runs program p; appends the bytes of every kept value to out.  With
 * `syncs`, reads values back at the generator's chosen points as well. */
static void run(const program *p, GByteArray *out, bool syncs, uint64_t sync_seed)
{
    nt_tensor *v[MAXV] = {0};
    int nv = make_inputs(p, v);
    nv = exec_steps(p, v, nv, syncs, sync_seed);
    read_outputs(p, v, nv, out);
}

/* The "captured" column: p's steps captured once on inputs from one data
 * seed (nt_graph_capture_begin, the inputs named), then replayed on inputs
 * from p's data seed bound in their place; appends the replay's kept
 * values.  The capture run's own values are checked against `first`, the
 * same program run op by op on the capture's inputs. */
static void run_captured(const program *p, const program *pc, GByteArray *out,
                         const GByteArray *first)
{
    nt_tensor *v[MAXV] = {0}, *in2[MAXV] = {0};
    int nv = make_inputs(pc, v);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_graph_capture_begin(), 0);
    char nm[16];
    for (int i = 0; i < nv; i++) {
        snprintf(nm, sizeof nm, "in%d", i);
        assert_int_equal(nt_graph_input(v[i], nm), 0);
    }
    capture_aux = 1;
    nv = exec_steps(p, v, nv, false, 0);
    capture_aux = 0;
    nt_graph *g = nt_graph_capture_end();
    if (!g)
        print_error("capture: %s\n", nt_last_error_message());
    assert_non_null(g);
    /* the capture ran the program: its values are the op-by-op ones */
    nt_tensor *keep[MAXV] = {0};
    for (int i = 0; i < nv; i++)
        keep[i] = v[i] ? nt_retain(v[i]) : NULL;
    GByteArray *cap = g_byte_array_new();
    read_outputs(p, v, nv, cap);
    if (cap->len != first->len || memcmp(cap->data, first->data, first->len))
        fail_msg("the capture run's values differ from the program run op by op");
    g_byte_array_unref(cap);
    /* new inputs bound, one replay */
    int n2 = make_inputs(p, in2);
    for (int i = 0; i < n2; i++) {
        snprintf(nm, sizeof nm, "in%d", i);
        assert_int_equal(nt_graph_bind(g, nm, in2[i]), 0);
    }
    assert_int_equal(nt_graph_replay(g), 0);
    for (int i = 0; i < n2; i++) { /* a kept input is the one bound now */
        if (keep[i])
            nt_release(keep[i]);
        keep[i] = nt_retain(in2[i]);
    }
    read_outputs(p, keep, nv, out);
    for (int i = 0; i < n2; i++)
        nt_release(in2[i]);
    nt_graph_destroy(g);
}

static int nprograms(int dflt)
{
    const char *e = getenv("NT_DIFF_PROGRAMS");
    if (e)
        return atoi(e);
    return getenv("NT_TEST_QUICK") ? dflt / 8 : dflt;
}

typedef struct {
    const char *name, *mode, *window, *fusion;
} config;

static const config configs[] = {
    {"eager", "eager", "4096", "1"},
    {"adaptive", "adaptive", "4096", "1"},
    {"lazy", "lazy", "4096", "1"},
    {"lazy-window-5", "lazy", "5", "1"},
    {"lazy-window-2", "lazy", "2", "1"},
    {"adaptive-nofusion", "adaptive", "4096", "0"},
};

static void apply(const config *c)
{
    /* NT_DIFF_FUSION=0 replays a failure with fusion off, to tell fusion
     * bugs from batching bugs */
    const char *f = getenv("NT_DIFF_FUSION");
    nt_config_set("NT_MODE", c->mode);
    nt_config_set("NT_LAZY_WINDOW", c->window);
    nt_config_set("NT_FUSION", f ? f : c->fusion);
}

static void dump(const program *p)
{
    print_message("# program: R=%lld C=%lld K=%lld inputs dt %d %d %d %d\n", (long long)p->R,
                  (long long)p->C, (long long)p->K, p->in_dt[0], p->in_dt[1], p->in_dt[2],
                  p->in_dt[3]);
    for (int k = 0; k < p->nsteps; k++) {
        const step *s = &p->st[k];
        print_message("#   v%d = kind %d%s%s (v%d, v%d, v%d) s0=%g s1=%g dim=%d keep=%d dt=%d%s\n",
                      p->nin + k, s->kind, s->kind >= P_NKINDS ? " " : "",
                      s->kind >= P_NKINDS ? xops[s->kind - P_NKINDS].name : "", s->a, s->b, s->c, s->s0, s->s1, s->dim, s->keep, s->dt,
                      p->keep[p->nin + k] ? " [kept]" : "");
    }
}

/* backend: where the configs run; the reference is always the CPU backend
 * in deterministic mode (one op at a time, no fusion), so the simulator's
 * fused kernels are held to the CPU's unfused bits. */
static int captured_runs; /* programs checked captured and replayed */

static void first_diff(const GByteArray *ref, const GByteArray *got)
{
    for (guint b = 0; b < ref->len && b < got->len; b++)
        if (ref->data[b] != got->data[b]) {
            print_message("# first differing byte %u\n", b);
            guint w = b & ~3u;
            float fr, fg;
            memcpy(&fr, ref->data + w, 4);
            memcpy(&fg, got->data + w, 4);
            print_message("# as f32 at %u: want %.9g (%08x) got %.9g (%08x)\n", w, fr,
                          *(uint32_t *)(ref->data + w), fg, *(uint32_t *)(got->data + w));
            return;
        }
    print_message("# sizes %u and %u\n", ref->len, got->len);
}

static void differential(bool syncs, int count, const char *backend)
{
    const char *one = getenv("NT_DIFF_SEED");
    int first = one ? atoi(one) : 1, last = one ? first : count;
    nt_stats_reset();
    for (int seed = first; seed <= last; seed++) {
        program p;
        gen(&p, (uint64_t)seed);
        if (getenv("NT_DIFF_STEPS")) { /* replay a prefix, to shrink a failure */
            int n = atoi(getenv("NT_DIFF_STEPS"));
            if (n < p.nsteps) {
                p.nsteps = n;
                p.keep[p.nin + n - 1] = true;
            }
        }
        GByteArray *ref = g_byte_array_new();
        nt_config_set("NT_BACKEND", "cpu");
        nt_config_set("NT_MODE", "deterministic");
        run(&p, ref, false, 0);
        nt_config_set("NT_BACKEND", backend);
        for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
            if (syncs && c % 2) /* print invariance: half the configs suffice */
                continue;
            if (getenv("NT_DIFF_ONLY") && strcmp(getenv("NT_DIFF_ONLY"), configs[c].name))
                continue;
            apply(&configs[c]);
            GByteArray *got = g_byte_array_new();
            run(&p, got, syncs, (uint64_t)seed * 7 + c);
            if (got->len != ref->len || memcmp(got->data, ref->data, ref->len)) {
                print_error("program seed %d differs in config %s on the %s backend%s (replay: "
                            "NT_DIFF_SEED=%d)\n",
                            seed, configs[c].name, backend, syncs ? " with syncs" : "", seed);
                dump(&p);
                first_diff(ref, got);
                fail();
            }
            g_byte_array_unref(got);
        }
        /* captured on other inputs, replayed on these: the same bits */
        if (!syncs && (!getenv("NT_DIFF_ONLY") || !strcmp(getenv("NT_DIFF_ONLY"), "captured"))) {
            program pc = p;
            pc.data_seed += 7777;
            GByteArray *ref_c = g_byte_array_new(), *got = g_byte_array_new();
            nt_config_set("NT_BACKEND", "cpu");
            nt_config_set("NT_MODE", "deterministic");
            run(&pc, ref_c, false, 0);
            nt_config_set("NT_BACKEND", backend);
            apply(&configs[2]); /* lazy: the capture holds the program whole anyway */
            run_captured(&p, &pc, got, ref_c);
            if (got->len != ref->len || memcmp(got->data, ref->data, ref->len)) {
                print_error("program seed %d differs when captured and replayed on the %s "
                            "backend (replay: NT_DIFF_SEED=%d NT_DIFF_ONLY=captured)\n",
                            seed, backend, seed);
                dump(&p);
                first_diff(ref, got);
                fail();
            }
            g_byte_array_unref(ref_c);
            g_byte_array_unref(got);
            captured_runs++;
        }
        g_byte_array_unref(ref);
    }
    nt_config_set("NT_BACKEND", "cpu");
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_LAZY_WINDOW", "4096");
    nt_config_set("NT_FUSION", "1");
    nt_stats st;
    nt_stats_get(&st);
    print_message("# %s: %d programs: %llu fused kernels replaced %llu ops; %llu values elided, "
                  "%llu stored; cache %llu hits / %llu misses\n",
                  backend, last - first + 1, (unsigned long long)st.fusion_groups,
                  (unsigned long long)st.fused_ops, (unsigned long long)st.fused_values_elided,
                  (unsigned long long)st.fused_values_stored,
                  (unsigned long long)st.kernel_cache_hits,
                  (unsigned long long)st.kernel_cache_misses);
    if (!one) /* the programs must actually exercise fusion */
        assert_true(st.fusion_groups > 0 && st.fused_values_elided > 0);
    print_message("# %s: %d programs also captured and replayed on new inputs\n", backend,
                  captured_runs);
    if (!one && !syncs)
        assert_true(captured_runs > 0);
    captured_runs = 0;
    for (int x = 0; x < NXOPS; x++) {
        if (!one && count >= 100 && !xop_runs[x])
            fail_msg("no program ran %s", xops[x].name);
        xop_runs[x] = 0;
    }
}

static void test_differential(void **state)
{
    (void)state;
    differential(false, nprograms(2000), "cpu");
}

/* The simulator is the default device: its fused tile programs against the
 * CPU's unfused reference (fewer programs: every kernel is simulated). */
static void test_differential_sim(void **state)
{
    (void)state;
    differential(false, nprograms(400), "sim");
}

static void test_print_invariance(void **state)
{
    (void)state;
    differential(true, nprograms(600), "cpu");
    differential(true, nprograms(150), "sim");
}

/* ---------------- a transformer block, every mode, printing or not ----------------
 *
 * A small character model (token embedding + positions by index_select,
 * one pre-LN block with causal attention over 2 heads, a final norm and a
 * head, cross-entropy) trained 3 SGD steps: the losses and parameters must
 * have the bits of the CPU backend in deterministic mode in every config
 * above, on both backends, and again when every step prints the loss and
 * reads the attention weights back half-way through the forward pass.  The
 * cases table varies the parts; issue 13's ops are one line each there. */
enum { TB_V = 11, TB_B = 2, TB_T = 8, TB_C = 16, TB_H = 2, TB_NP = 15 };

typedef struct tb_case {
    const char *name;
    /* attention of q, k, v [B, H, T, D] under the causal u8 mask [T, T]
     * (1 = masked); NULL: matmul, masked_fill, softmax, matmul */
    nt_tensor *(*attn)(nt_tensor *q, nt_tensor *k, nt_tensor *v, nt_tensor *mask);
    nt_tensor *(*act)(nt_tensor *h);                       /* NULL: nt_gelu */
    nt_tensor *(*loss)(nt_tensor *logits, nt_tensor *y);   /* NULL: nt_cross_entropy */
    nt_tensor *(*drop)(nt_tensor *h, uint64_t seed);       /* NULL: none */
    bool checkpoint; /* the block under nt_checkpoint */
    bool amp;        /* under bf16 autocast */
} tb_case;

static nt_tensor *tb_attn_additive(nt_tensor *q, nt_tensor *k, nt_tensor *v, nt_tensor *mask)
{
    /* the additive form: where(mask, -1e9, 0) added to the scores */
    nt_tensor *s = nt_mul_scalar(nt_matmul(q, nt_transpose(k, 2, 3)), 1.0 / sqrt(TB_C / TB_H));
    nt_tensor *zero = nt_zeros(NT_F32, 2, (int64_t[]){TB_T, TB_T});
    nt_tensor *add = nt_masked_fill(zero, mask, -1e9);
    nt_tensor *a = nt_matmul(nt_softmax(nt_add(s, add), -1), v);
    nt_release(zero);
    return a;
}

static nt_tensor *tb_dropout(nt_tensor *h, uint64_t seed) { return nt_dropout(h, 0.25, seed); }
static nt_tensor *tb_sdpa(nt_tensor *q, nt_tensor *k, nt_tensor *v, nt_tensor *mask)
{
    (void)mask; /* causal: the same positions the u8 mask hides */
    return nt_scaled_dot_product_attention(q, k, v, NULL, true, 0.0);
}
static nt_tensor *tb_ce_ex(nt_tensor *logits, nt_tensor *y)
{
    return nt_cross_entropy_ex(logits, y, 3, 0.1); /* label 3 ignored, smoothing 0.1 */
}

static const tb_case tb_cases[] = {
    {"masked_fill attention, gelu", NULL, NULL, NULL, NULL, false, false},
    {"additive mask, mish", tb_attn_additive, nt_mish, NULL, NULL, false, false},
    {"checkpointed block", NULL, NULL, NULL, NULL, true, false},
    {"bf16 autocast", NULL, NULL, NULL, NULL, false, true},
    {"checkpointed block, bf16 autocast", NULL, NULL, NULL, NULL, true, true},
    {"gelu_tanh", NULL, nt_gelu_tanh, NULL, NULL, false, false},
    {"dropout", NULL, NULL, NULL, tb_dropout, false, false},
    {"dropout, checkpointed block", NULL, NULL, NULL, tb_dropout, true, false},
    {"cross_entropy_ex", NULL, NULL, tb_ce_ex, NULL, false, false},
    {"sdpa", tb_sdpa, NULL, NULL, NULL, false, false},
    {"sdpa, checkpointed block, bf16 autocast", tb_sdpa, NULL, NULL, NULL, true, true},
};

typedef struct tb_model {
    const tb_case *c;
    nt_tensor *p[TB_NP]; /* wte, wpe, ln1 w b, wq, wk, wv, wo, ln2 w b, w1, w2, lnf w b, head */
    nt_tensor *idx, *pos, *y, *mask;
    bool print;          /* read the attention weights back mid-step */
    uint64_t step;
} tb_model;

static nt_tensor *tb_heads(nt_tensor *x)
{
    int64_t sh[4] = {TB_B, TB_T, TB_H, TB_C / TB_H};
    return nt_permute(nt_reshape(x, 4, sh), (int[]){0, 2, 1, 3});
}

static int tb_block(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    tb_model *m = ctx;
    nt_tensor **p = m->p, *x = in[0];
    (void)n_in, (void)n_out;
    nt_tensor *h = nt_layer_norm(x, p[2], p[3], 1e-5);
    nt_tensor *q = tb_heads(nt_linear(h, p[4], NULL)), *k = tb_heads(nt_linear(h, p[5], NULL));
    nt_tensor *v = tb_heads(nt_linear(h, p[6], NULL)), *a;
    if (m->c->attn) {
        a = m->c->attn(q, k, v, m->mask);
    } else {
        nt_tensor *s = nt_mul_scalar(nt_matmul(q, nt_transpose(k, 2, 3)),
                                     1.0 / sqrt(TB_C / TB_H));
        nt_tensor *w = nt_softmax(nt_masked_fill(s, m->mask, -INFINITY), -1);
        if (m->print && w) { /* a sync in the middle of the forward pass */
            float buf[TB_B * TB_H * TB_T * TB_T];
            nt_tensor *w32 = nt_cast(w, NT_F32);
            nt_to_host(w32, buf, sizeof buf);
            nt_release(w32);
        }
        a = nt_matmul(w, v);
    }
    a = nt_reshape(nt_permute(a, (int[]){0, 2, 1, 3}), 3, (int64_t[]){TB_B, TB_T, TB_C});
    x = nt_add(x, nt_linear(a, p[7], NULL));
    h = nt_linear(nt_layer_norm(x, p[8], p[9], 1e-5), p[10], NULL);
    h = m->c->act ? m->c->act(h) : nt_gelu(h);
    if (m->c->drop)
        h = m->c->drop(h, 1000 + m->step);
    out[0] = nt_add(x, nt_linear(h, p[11], NULL));
    return out[0] ? 0 : nt_last_error();
}

static void tb_init(tb_model *m, const tb_case *c)
{
    memset(m, 0, sizeof *m);
    m->c = c;
    int64_t sh[TB_NP][2] = {{TB_V, TB_C}, {TB_T, TB_C}, {TB_C}, {TB_C}, {TB_C, TB_C},
                            {TB_C, TB_C}, {TB_C, TB_C}, {TB_C, TB_C}, {TB_C}, {TB_C},
                            {4 * TB_C, TB_C}, {TB_C, 4 * TB_C}, {TB_C}, {TB_C}, {TB_V, TB_C}};
    for (int i = 0; i < TB_NP; i++) {
        int nd = sh[i][1] ? 2 : 1;
        bool lnw = i == 2 || i == 8 || i == 12;
        nt_tensor *r = nt_randn(NT_F32, nd, sh[i], 500 + (uint64_t)i);
        nt_tensor *sc = nt_mul_scalar(r, lnw ? 0.1 : 0.3);
        m->p[i] = nt_add_scalar(sc, lnw ? 1.0 : 0.0);
        nt_release(sc);
        nt_release(r);
        assert_int_equal(nt_set_requires_grad(m->p[i], true), 0);
    }
    int32_t idx[TB_B * TB_T], y[TB_B * TB_T], pos[TB_T];
    for (int i = 0; i < TB_B * TB_T; i++) {
        idx[i] = (i * 5 + 2) % TB_V;
        y[i] = (i * 3 + 1) % TB_V;
    }
    for (int t = 0; t < TB_T; t++)
        pos[t] = t;
    m->idx = nt_from_host(idx, NT_I32, 2, (int64_t[]){TB_B, TB_T});
    m->y = nt_from_host(y, NT_I32, 1, (int64_t[]){TB_B * TB_T});
    m->pos = nt_from_host(pos, NT_I32, 1, (int64_t[]){TB_T});
    nt_tensor *ones = nt_ones(NT_U8, 2, (int64_t[]){TB_T, TB_T});
    m->mask = nt_triu(ones, 1);
    nt_release(ones);
}

static void tb_free(tb_model *m)
{
    for (int i = 0; i < TB_NP; i++)
        nt_release(m->p[i]);
    nt_release(m->idx), nt_release(m->y), nt_release(m->pos), nt_release(m->mask);
}

/* 3 SGD steps; the losses and the parameters' bytes go to out. */
static void tb_train(const tb_case *c, bool print, GByteArray *out)
{
    tb_model m;
    tb_init(&m, c);
    m.print = print;
    nt_optim *opt = nt_optim_sgd(m.p, TB_NP, 0.1, 0.9, 0.0, false);
    assert_non_null(opt);
    for (int st = 0; st < 3; st++) {
        m.step = (uint64_t)st;
        nt_scope *s = nt_scope_begin();
        if (c->amp)
            assert_int_equal(nt_autocast_begin(NT_BF16), 0);
        nt_tensor *x = nt_add(nt_embedding(m.p[0], m.idx), nt_index_select(m.p[1], 0, m.pos));
        nt_tensor *y = NULL;
        if (c->checkpoint)
            assert_int_equal(nt_checkpoint(tb_block, &m, &x, 1, &y, 1), 0);
        else
            assert_int_equal(tb_block(&m, &x, 1, &y, 1), 0);
        nt_tensor *h = nt_layer_norm(y, m.p[12], m.p[13], 1e-5);
        nt_tensor *logits = nt_reshape(nt_linear(h, m.p[14], NULL), 2,
                                       (int64_t[]){TB_B * TB_T, TB_V});
        nt_tensor *loss = c->loss ? c->loss(logits, m.y) : nt_cross_entropy(logits, m.y);
        if (c->amp)
            assert_int_equal(nt_autocast_end(), 0);
        if (!loss || nt_backward(loss) || nt_optim_step(opt) || nt_optim_zero_grad(opt))
            fail_msg("%s, step %d: %s", c->name, st, nt_last_error_message());
        if (print) {
            char *txt = nt_format(loss);
            assert_non_null(txt);
            g_free(txt);
        }
        float l;
        nt_tensor *l32 = nt_cast(loss, NT_F32);
        assert_int_equal(nt_to_host(l32, &l, sizeof l), 0);
        g_byte_array_append(out, (const guint8 *)&l, sizeof l);
        nt_scope_end(s);
    }
    for (int i = 0; i < TB_NP; i++) {
        size_t nb = (size_t)nt_numel(m.p[i]) * sizeof(float);
        guint8 *buf = g_malloc(nb);
        assert_int_equal(nt_to_host(m.p[i], buf, nb), 0);
        g_byte_array_append(out, buf, (guint)nb);
        g_free(buf);
    }
    nt_optim_destroy(opt);
    tb_free(&m);
}

static void test_transformer_block_every_mode(void **state)
{
    (void)state;
    const char *backends[] = {"cpu", "sim"};
    for (size_t k = 0; k < sizeof tb_cases / sizeof tb_cases[0]; k++) {
        const tb_case *c = &tb_cases[k];
        GByteArray *ref = g_byte_array_new();
        nt_config_set("NT_BACKEND", "cpu");
        nt_config_set("NT_MODE", "deterministic");
        tb_train(c, false, ref);
        for (int be = 0; be < 2; be++) {
            nt_config_set("NT_BACKEND", backends[be]);
            for (size_t cf = 0; cf < sizeof configs / sizeof configs[0]; cf++)
                for (int print = 0; print < 2; print++) {
                    apply(&configs[cf]);
                    GByteArray *got = g_byte_array_new();
                    tb_train(c, print, got);
                    if (got->len != ref->len || memcmp(got->data, ref->data, ref->len))
                        fail_msg("transformer block (%s): config %s on the %s backend%s "
                                 "differs from the deterministic CPU run", c->name,
                                 configs[cf].name, backends[be], print ? ", printing" : "");
                    g_byte_array_unref(got);
                }
        }
        g_byte_array_unref(ref);
    }
    nt_config_set("NT_BACKEND", "cpu");
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_LAZY_WINDOW", "4096");
    nt_config_set("NT_FUSION", "1");
}

/* ---------------- grouping rules, via the log ---------------- */

/* y = relu((x*1.5+0.25)*x - x)*0.5 + 1: 7 ops, intermediates released */
static nt_tensor *chain(nt_tensor *x)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *y = nt_add_scalar(
        nt_mul_scalar(nt_relu(nt_sub(nt_mul(nt_add_scalar(nt_mul_scalar(x, 1.5), 0.25), x), x)),
                      0.5),
        1.0);
    nt_keep(y);
    nt_scope_end(s);
    return y;
}

static void ew_chain_body(void *arg)
{
    nt_tensor **out = arg;
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){64, 256}, 1);
    nt_sync();
    nt_config_set("NT_MODE", "lazy");
    out[0] = chain(x);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
    nt_release(x);
}

static void test_ew_chain_one_kernel(void **state)
{
    (void)state;
    nt_tensor *y[1];
    nt_stats_reset();
    char *log = nt_test_fusion_log(ew_chain_body, y);
    assert_int_equal(nt_test_count(log, "kernel #"), 1);
    assert_non_null(strstr(log, "elementwise, 7 ops"));
    assert_non_null(strstr(log, "writes 1, elides 6"));
    assert_non_null(strstr(log, "test_fusion.c:")); /* each op names its line */
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.fusion_groups, 1);
    assert_int_equal(st.fused_ops, 7);
    assert_int_equal(st.fused_values_elided, 6);
    free(log);
    nt_release(y[0]);
}

/* Adaptive mode: a worker waking from idle waits a little for the rest of a
 * host burst over big tensors, so the burst fuses whole instead of as a
 * lone first op followed by the rest.  The wait is a few microseconds, so a
 * host descheduled mid-burst (a loaded machine) splits it: to assert
 * without timing, the test lifts the wait's time bounds
 * (nt__gather_scale = 0: the wait ends when the sync asks) and starts each
 * burst once the worker is asleep, then expects every burst whole, with the
 * eager bits.  At the real bounds it only reports how many fused whole. */

static nt_tensor *burst(nt_tensor *x)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *y = nt_mul(nt_add_scalar(nt_mul_scalar(nt_relu(nt_sub(
                              nt_mul(nt_add_scalar(nt_mul_scalar(x, 1.5), 0.25), x), x)),
                                                      0.5),
                                        1.0),
                          x);
    nt_keep(y);
    nt_scope_end(s);
    return y;
}

static int bursts_whole(nt_tensor *x, nt_tensor *small, const float *want, float *got,
                        int64_t n, int attempts)
{
    int whole = 0;
    for (int attempt = 0; attempt < attempts; attempt++) {
        nt_stats_reset();
        /* a tiny op just finished: the worker is idle and spinning, so it
         * takes the burst's first op the moment it lands */
        nt_release(nt_add_scalar(small, 1.0));
        nt_sync();
        if (!AO_load(&nt__gather_scale)) /* an observed state, not a time */
            while (!AO_load_full(&nt__stream_current()->sleeping))
                g_usleep(100);
        nt_tensor *y = burst(x);
        assert_int_equal(nt_to_host(y, got, sizeof(float) * (size_t)n), 0);
        assert_memory_equal(got, want, sizeof(float) * (size_t)n);
        nt_stats st;
        nt_stats_get(&st);
        if (st.fusion_groups == 1 && st.fused_ops == 8 && st.kernels_launched == 2)
            whole++;
        nt_release(y);
    }
    return whole;
}

static void test_adaptive_gathers_burst(void **state)
{
    (void)state;
    const int64_t n = 1 << 20;
    nt_tensor *x = nt_randn(NT_F32, 1, &n, 7);
    nt_tensor *small = nt_zeros(NT_F32, 1, (int64_t[]){4});
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    nt_tensor *ref = burst(x);
    float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    assert_int_equal(nt_to_host(ref, want, sizeof(float) * (size_t)n), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    AO_store(&nt__gather_scale, 0);
    int whole = bursts_whole(x, small, want, got, n, 8);
    AO_store(&nt__gather_scale, 1);
    print_message("# adaptive, no time bounds: %d of 8 bursts fused whole\n", whole);
    assert_int_equal(whole, 8);
    whole = bursts_whole(x, small, want, got, n, 8);
    print_message("# adaptive, real wait bounds: %d of 8 bursts fused whole\n", whole);
    free(want);
    free(got);
    nt_release(ref);
    nt_release(small);
    nt_release(x);
}

/* A fused-away intermediate never takes device memory: the 8-op chain over
 * 4 MiB values takes one 4 MiB block (y's) at its peak, where eager mode
 * holds at least two.  Its capacity was
 * reserved while its handle lived (so running out is reported at the call),
 * and everything returns when y goes. */
static void test_elided_values_take_no_memory(void **state)
{
    (void)state;
    const int64_t n = 1 << 20;
    const uint64_t MiB4 = (uint64_t)n * 4;
    nt_tensor *x = nt_randn(NT_F32, 1, &n, 11);
    /* x takes its block when randn runs: before the first count, not during
     * the burst (and earlier tests' releases have all landed) */
    assert_int_equal(nt_sync(), 0);
    const char *modes[] = {"lazy", "eager"};
    for (int m = 0; m < 2; m++) {
        assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
        nt_stats_reset();
        nt_stats a, b;
        nt_stats_get(&a);
        nt_tensor *y = burst(x);
        assert_int_equal(nt_sync(), 0);
        nt_stats_get(&b);
        uint64_t grew = b.device_bytes_backed - a.device_bytes_backed;
        uint64_t peak = b.device_bytes_backed_peak - a.device_bytes_backed;
        if (!(grew >= MiB4 && grew < MiB4 + 64 * 1024))
            print_message("# %s: backed grew %llu B (peak +%llu B)\n", modes[m],
                          (unsigned long long)grew, (unsigned long long)peak);
        assert_true(grew >= MiB4 && grew < MiB4 + 64 * 1024); /* y (and handles) */
        if (m == 0) { /* lazy: fused, 7 values elided, none of them ever backed */
            assert_int_equal(b.fused_values_elided - a.fused_values_elided, 7);
            assert_true(peak < MiB4 + 64 * 1024);
        } else { /* eager: every intermediate written, two or more at once */
            assert_true(peak >= 2 * MiB4);
        }
        nt_release(y);
        assert_int_equal(nt_sync(), 0);
        nt_stats_get(&b);
        assert_int_equal(b.device_bytes_backed, a.device_bytes_backed);
        assert_int_equal(b.device_bytes_in_use, a.device_bytes_in_use);
    }
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    nt_release(x);
}

/* A big EW program on the CPU runs in spans of the row-major order over two
 * threads (cpu/fused.c): spans that cut rows mid-way, a broadcast
 * bf16 operand, a transposed (strided) input, a stochastic-rounding cast
 * keyed by element index, and two outputs must all give the bits of the ops
 * run one by one. */
static nt_tensor *span_prog(nt_tensor *x, nt_tensor *b, nt_tensor *ct, nt_tensor **second)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *c = nt_transpose(ct, 0, 1); /* [3, R] view of an [R, 3] tensor */
    nt_tensor *u = nt_add(nt_mul(x, b), c);
    nt_tensor *v = nt_cast_sr(nt_mul_scalar(nt_tanh(u), 3.0), NT_BF16);
    nt_tensor *y = nt_sub(nt_cast(v, NT_F32), nt_relu(u));
    *second = nt_keep(v);
    nt_keep(y);
    nt_scope_end(s);
    return y;
}

static void test_cpu_spans_bitwise(void **state)
{
    (void)state;
    const int64_t R = 70001; /* 3 rows of 70001: 64 Ki-element spans cut rows */
    size_t n = (size_t)(3 * R);
    float *y0 = malloc(n * 4), *y1 = malloc(n * 4);
    uint16_t *v0 = malloc(n * 2), *v1 = malloc(n * 2);
    const char *modes[] = {"deterministic", "lazy"};
    for (int m = 0; m < 2; m++) {
        /* a fresh runtime per mode: the SR cast's bits are keyed by its
         * record's sequence number, which must be the same in both runs */
        nt_shutdown();
        assert_int_equal(nt_init(), 0);
        assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
        assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
        nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){3, R}, 21);
        nt_tensor *b = nt_cast(nt_randn(NT_F32, 1, (int64_t[]){R}, 22), NT_BF16);
        nt_tensor *ct = nt_randn(NT_F32, 2, (int64_t[]){R, 3}, 23);
        assert_int_equal(nt_sync(), 0);
        nt_stats_reset();
        nt_tensor *v, *y = span_prog(x, b, ct, &v);
        assert_int_equal(nt_to_host(y, m ? y1 : y0, n * 4), 0);
        assert_int_equal(nt_to_host(v, m ? v1 : v0, n * 2), 0);
        nt_stats st;
        nt_stats_get(&st);
        if (m) /* one fused kernel for the whole program */
            assert_int_equal(st.fusion_groups, 1);
        nt_release(y);
        nt_release(v);
        nt_release(x);
        nt_release(b);
        nt_release(ct);
    }
    assert_memory_equal(y0, y1, n * 4);
    assert_memory_equal(v0, v1, n * 2);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    free(y0), free(y1), free(v0), free(v1);
}

static void softmax_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", "lazy");
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = io[0];
    nt_tensor *m = nt_max(x, -1, true);
    nt_tensor *e = nt_exp(nt_sub(x, m));
    nt_tensor *y = nt_div(e, nt_sum(e, -1, true));
    io[1] = nt_keep(y);
    nt_scope_end(s);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

/* ---- every vector ISA level gives the scalar bits ---- */

/* Values with every kind of special: NaN (both signs, payloads), +-inf,
 * +-0, subnormals, the edges of exp's clamps, and random normals. */
static void isa_values(float *v, size_t n, uint64_t seed)
{
    static const uint32_t special[] = {
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u, 0x7f800000u, 0xff800000u,
        0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu,
        0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u, 0xbf800000u, 0x42b20000u,
        0xc2d00000u, 0x42b40000u, 0xc2cf0000u, 0x34000000u,
    };
    rng r = {seed};
    size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < n; i++) {
        uint64_t k = rnext(&r);
        if (k % 5 == 0) {
            uint32_t u = special[(k >> 8) % ns];
            memcpy(&v[i], &u, 4);
        } else if (k % 5 == 1) {
            uint32_t u = (uint32_t)(k >> 16); /* any bit pattern */
            memcpy(&v[i], &u, 4);
        } else {
            v[i] = (float)((runi(&r) - 0.5) * 40.0);
        }
    }
}

/* An EW program touching every kind of loop eval has (unary with sqrt / exp
 * / log / tanh, scalar, binary, compare, where, casts) and a ROW one. */
static nt_tensor *isa_ew_prog(nt_tensor *x, nt_tensor *z)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *a = nt_add(nt_sqrt(nt_abs(x)), nt_exp(nt_mul_scalar(z, 0.25)));
    nt_tensor *b = nt_div(nt_log(nt_abs(z)), nt_tanh(x));
    nt_tensor *c = nt_where(nt_gt(x, z), nt_rsqrt(nt_abs(a)), nt_sigmoid(b));
    nt_tensor *d = nt_maximum(nt_minimum(c, nt_gelu(z)), nt_silu(nt_add_scalar(x, -1.5)));
    nt_tensor *e = nt_cast(nt_cast(nt_mul(d, nt_sub(a, b)), NT_BF16), NT_F32);
    nt_tensor *f = nt_pow(nt_abs(nt_softplus(e)), nt_relu(nt_neg(nt_reciprocal(x))));
    nt_tensor *y = nt_add(nt_cast(nt_cast(f, NT_F16), NT_F32), nt_relu(e));
    nt_keep(y);
    nt_scope_end(s);
    return y;
}

static nt_tensor *isa_row_prog(nt_tensor *x)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *m = nt_max(x, -1, true);
    nt_tensor *e = nt_exp(nt_sub(x, m));
    nt_tensor *y = nt_mul(nt_div(e, nt_sum(e, -1, true)), nt_sqrt(nt_abs(x)));
    nt_keep(y);
    nt_scope_end(s);
    return y;
}

static void test_isa_levels_bitwise(void **state)
{
    (void)state;
    /* rows of 4099 (no multiple of any vector width); 37 rows: several
     * blocks of rows and spans, so both threads take part */
    const int64_t R = 37, C = 4099;
    size_t n = (size_t)(R * C);
    float *xv = malloc(n * 4), *zv = malloc(n * 4);
    float *ref_ew = malloc(n * 4), *ref_row = malloc(n * 4), *got = malloc(n * 4);
    isa_values(xv, n, 101);
    isa_values(zv, n, 202);
    /* rows of finite values for the softmax: a NaN or inf row would make
     * every element NaN and hide the lanes */
    float *xr = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        xr[i] = isfinite(xv[i]) ? xv[i] : (float)i * 1e-3f;
    const char *levels[] = {"scalar", "avx2", "avx512"};
    const char *backends[] = {"cpu", "sim"};
    for (int be = 0; be < 2; be++) {
        assert_int_equal(nt_config_set("NT_BACKEND", backends[be]), 0);
        nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){R, C});
        nt_tensor *z = nt_from_host(zv, NT_F32, 2, (int64_t[]){R, C});
        nt_tensor *xs = nt_from_host(xr, NT_F32, 2, (int64_t[]){R, C});
        /* the reference: op by op (eager), unfused kernels */
        assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
        nt_tensor *y = isa_ew_prog(x, z);
        assert_int_equal(nt_to_host(y, ref_ew, n * 4), 0);
        nt_release(y);
        y = isa_row_prog(xs);
        assert_int_equal(nt_to_host(y, ref_row, n * 4), 0);
        nt_release(y);
        int ran = 0;
        for (int l = 0; l < 3; l++) {
            if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                continue; /* this CPU does not run it */
            ran++;
            assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
            nt_stats_reset();
            y = isa_ew_prog(x, z);
            assert_int_equal(nt_to_host(y, got, n * 4), 0);
            nt_release(y);
            assert_memory_equal(got, ref_ew, n * 4);
            y = isa_row_prog(xs);
            assert_int_equal(nt_to_host(y, got, n * 4), 0);
            nt_release(y);
            assert_memory_equal(got, ref_row, n * 4);
            nt_stats st;
            nt_stats_get(&st);
            assert_true(st.fusion_groups >= 2); /* both ran fused */
        }
        assert_true(ran >= 1); /* scalar always runs */
        assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
        assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
        nt_release(x), nt_release(z), nt_release(xs);
    }
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0); /* as setup left it */
    free(xv), free(zv), free(xr), free(ref_ew), free(ref_row), free(got);
}

/* ---- f32 multiply and divide through f64 (cpu/subnormal.h) ---- */

static uint32_t sn_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float sn_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* the same value as stored: equal bits, or both NaN (stored NaNs are
 * canonical) */
static bool sn_same(float got, float want)
{
    return (isnan(got) && isnan(want)) || sn_bits(got) == sn_bits(want);
}

/* Every exponent with mantissas at the edges, both signs: zeros,
 * subnormals, the smallest normals, the largest finite, infinities, NaNs
 * (quiet and signalling). */
static size_t sn_edges(float *v)
{
    static const uint32_t mant[] = {0, 1, 2, 0x3fffffu, 0x400000u, 0x400001u, 0x7ffffeu, 0x7fffffu};
    size_t k = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 0; e < 256; e++)
            for (size_t m = 0; m < sizeof mant / sizeof mant[0]; m++)
                v[k++] = sn_float(sign << 31 | e << 23 | mant[m]);
    return k; /* 4096 */
}

/* A random f32 with biased exponent e (0: zero or subnormal), random
 * mantissa and sign. */
static float sn_rand_exp(rng *r, int e)
{
    uint64_t k = rnext(r);
    uint32_t m = (uint32_t)k & 0x7fffffu;
    if ((k >> 23) % 8 == 0)
        m &= 0x7u; /* the few lowest bits set: the smallest subnormals */
    return sn_float((uint32_t)(k >> 40 & 1) << 31 | (uint32_t)e << 23 | m);
}

/* Random pairs whose product (div: quotient) lands around the subnormal
 * range: from 2^-190 (zero) up through the smallest normals. */
static void sn_pairs(rng *r, bool div, float *x, float *z, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int t = 64 + rint_(r, 84); /* ea + eb (mul) or eb - ea + 127 (div) */
        int ea, eb;
        if (!div) {
            ea = rint_(r, t + 1);
            eb = t - ea;
        } else {
            ea = rint_(r, 128);
            eb = ea + 254 - t;
        }
        if (eb > 254)
            eb = 254;
        x[i] = sn_rand_exp(r, ea);
        z[i] = sn_rand_exp(r, eb);
        if (rnext(r) % 2)
            x[i] = sn_rand_exp(r, (int)(rnext(r) % 3)), z[i] = sn_rand_exp(r, (int)(rnext(r) % 255));
        if (rnext(r) % 4 == 0) { /* swap: the subnormal side on either operand */
            float t_ = x[i];
            x[i] = z[i], z[i] = t_;
        }
    }
}

/* one call of the f64 route (not inlined: the checks below see it as the
 * evaluator does, a call on pointers of unknown extent) */
static __attribute__((noinline)) void sn_run(bool div, float *y, const float *x, const float *z,
                                             bool zscalar, int64_t n)
{
    if (div)
        nt__sn_div_f64(y, x, z, zscalar, n);
    else
        nt__sn_mul_f64(y, x, z, zscalar, n);
}

/* Checks nt__sn_{mul,div}_f64 against the f32 operation for n pairs, with
 * z as a vector and (for every 97th z) as the fixed second operand, and
 * that the risk tests mark every pair with a subnormal operand or result. */
static void sn_check(const float *x, const float *z, size_t n, float *got)
{
    for (int div = 0; div < 2; div++) {
        for (size_t i0 = 0; i0 < n; i0 += 4096) {
            int64_t len = (int64_t)(n - i0 < 4096 ? n - i0 : 4096);
            /* odd lengths: the 4-lane loop and the tail both run */
            for (int64_t j = 0; j < len; j += 1021) {
                int64_t l = len - j < 1021 ? len - j : 1021;
                sn_run(div, got + j, x + i0 + j, z + i0 + j, false, l);
            }
            for (int64_t j = 0; j < len; j++) {
                float a = x[i0 + j], b = z[i0 + j];
                float want = div ? a / b : a * b;
                if (!sn_same(got[j], want))
                    fail_msg("%s %08x %08x: %08x, want %08x", div ? "div" : "mul", sn_bits(a),
                             sn_bits(b), sn_bits(got[j]), sn_bits(want));
                uint32_t ua = sn_bits(a) & 0x7fffffffu, ub = sn_bits(b) & 0x7fffffffu;
                uint32_t uw = sn_bits(want) & 0x7fffffffu;
                bool sub = nt__sn_sub(ua) || nt__sn_sub(ub) || nt__sn_sub(uw);
                uint32_t risk = div ? nt__sn_div_risk(ua, ub) : nt__sn_mul_risk(ua, ub);
                if (sub && !risk)
                    fail_msg("%s %08x %08x: not marked", div ? "div" : "mul", sn_bits(a), sn_bits(b));
                (void)uw;
            }
        }
        /* a fixed second operand */
        for (size_t k = 0; k < n; k += 97) {
            float s = z[k];
            uint32_t us = sn_bits(s) & 0x7fffffffu;
            uint32_t bound = div ? nt__sn_div_bound(s) : nt__sn_mul_bound(s);
            size_t m = n < 4096 ? n : 4096;
            size_t i0 = (k * 31) % (n - m + 1);
            sn_run(div, got, x + i0, &s, true, (int64_t)m);
            for (size_t j = 0; j < m; j++) {
                float a = x[i0 + j];
                float want = div ? a / s : a * s;
                if (!sn_same(got[j], want))
                    fail_msg("%s %08x by %08x: %08x, want %08x", div ? "div_scalar" : "mul_scalar",
                             sn_bits(a), sn_bits(s), sn_bits(got[j]), sn_bits(want));
                uint32_t ua = sn_bits(a) & 0x7fffffffu, uw = sn_bits(want) & 0x7fffffffu;
                bool sub = nt__sn_sub(ua) || nt__sn_sub(us) || nt__sn_sub(uw);
                if (sub && ua != 0 && !(ua - 1u < bound))
                    fail_msg("%s %08x by %08x: not marked", div ? "div_scalar" : "mul_scalar",
                             sn_bits(a), sn_bits(s));
            }
        }
    }
}

static void test_subnormal_f64_route(void **state)
{
    (void)state;
    /* every pair of edge values */
    float *e = malloc(4096 * 4), *x = malloc(4096 * 4096 * sizeof(float));
    float *z = malloc(4096 * 4096 * sizeof(float)), *got = malloc(4096 * 4);
    size_t ne = sn_edges(e);
    assert_int_equal(ne, 4096);
    /* Single-threaded arithmetic: under NT_TEST_QUICK (the sanitizer runs,
     * where it took 87 s of ThreadSanitizer's time and races with nothing)
     * every 8th edge as x against every edge as z, and an eighth of the
     * random pairs; the normal run checks them all. */
    size_t step = getenv("NT_TEST_QUICK") ? 8 : 1, np = 0;
    for (size_t i = 0; i < ne; i += step)
        for (size_t j = 0; j < ne; j++, np++)
            x[np] = e[i], z[np] = e[j];
    sn_check(x, z, np, got);
    /* millions of random pairs around the subnormal range, both ops */
    rng r = {77};
    size_t nr = (4u << 20) / step;
    for (int div = 0; div < 2; div++) {
        sn_pairs(&r, div, x, z, nr);
        sn_check(x, z, nr, got);
    }
    free(e), free(x), free(z), free(got);
}

/* The fused evaluator at every ISA level, with subnormal assists taken as
 * costly and as cheap: mul, div, mul_scalar and div_scalar (the ops with
 * the f64 route) give the f32 operation's bits on operands that mix
 * subnormal-range blocks with ordinary ones. */
static void test_subnormal_fused_isa(void **state)
{
    (void)state;
    const int64_t n = 3 * 4096 + 37;
    float *xv = malloc((size_t)n * 4), *zv = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    float *e = malloc(4096 * 4);
    rng r = {99};
    sn_edges(e);
    sn_pairs(&r, false, xv, zv, (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t blk = i / 256;
        if (blk % 3 == 0) /* ordinary values: blocks that take the f32 path */
            xv[i] = (float)(runi(&r) - 0.5), zv[i] = (float)(runi(&r) + 0.5);
        else if (blk % 3 == 1 && rnext(&r) % 2) /* edges, NaN and infinities among them */
            xv[i] = e[rnext(&r) % 4096], zv[i] = e[rnext(&r) % 4096];
    }
    const double scal[] = {0.999, 0.1, 1e-3, 3e-39, 0.0, 1e30, -7.5};
    const char *levels[] = {"scalar", "avx2", "avx512"};
    nt_tensor *x = nt_from_host(xv, NT_F32, 1, (int64_t[]){n});
    nt_tensor *z = nt_from_host(zv, NT_F32, 1, (int64_t[]){n});
    int ran = 0;
    /* l / 3: subnormal assists taken as costly (FTZ passes, f64 where they
     * fail) and as cheap (the plain IEEE pass, cpu/subnormal.c) */
    for (int l = 0; l < 6; l++) {
        if (nt_config_set("NT_CPU_ISA", levels[l % 3]) != 0)
            continue; /* this CPU does not run it */
        nt__sn_set_assists(l / 3);
        ran++;
        assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
        for (int k = 0; k < 2 + 2 * 7; k++) {
            nt_stats_reset();
            /* -(x op z): the op and a neg, one fused kernel */
            float s = k >= 2 ? (float)scal[(k - 2) / 2] : 0.0f;
            nt_tensor *y = k == 0   ? nt_neg(nt_mul(x, z))
                           : k == 1 ? nt_neg(nt_div(x, z))
                           : k % 2  ? nt_neg(nt_div_scalar(x, scal[(k - 2) / 2]))
                                    : nt_neg(nt_mul_scalar(x, scal[(k - 2) / 2]));
            assert_non_null(y);
            assert_int_equal(nt_to_host(y, got, (size_t)n * 4), 0);
            nt_release(y);
            nt_stats st;
            nt_stats_get(&st);
            assert_true(st.fusion_groups >= 1);
            for (int64_t i = 0; i < n; i++) {
                float a = xv[i], b = k >= 2 ? s : zv[i];
                float want = -(k == 0 ? a * b : k == 1 || k % 2 ? a / b : a * b);
                if (!sn_same(got[i], want))
                    fail_msg("%s (assists %s), case %d: %08x, %08x: %08x, want %08x",
                             levels[l % 3], l / 3 ? "cheap" : "costly", k, sn_bits(a), sn_bits(b),
                             sn_bits(got[i]), sn_bits(want));
            }
        }
    }
    nt__sn_set_assists(-1);
    assert_true(ran >= 2);
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    nt_release(x), nt_release(z);
    free(xv), free(zv), free(got), free(e);
}

/* ---- the evaluator's registers (reused by liveness), outputs computed in
 * place, and binary ops by a row's broadcast value ---- */

/* An EW program whose values are read far from where they are made (a's
 * register must outlive several others), kept intermediates (stored), a
 * bf16 output (not computed in place), a subnormal scalar, and in-place
 * writes to an input (acc: its storage is read and written, so its output
 * must not be computed in place before the chunk's last read). */
static void regs_ew_prog(nt_tensor *x, nt_tensor *z, nt_tensor *acc, nt_tensor **out)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *a = nt_mul(x, z);
    nt_tensor *c = nt_div(nt_add_scalar(a, 0.5), z);
    nt_tensor *d = nt_mul_scalar(nt_neg(c), 3e-39);
    nt_tensor *e = nt_sub(nt_relu(d), nt_mul(a, acc));
    nt_tensor *f = nt_cast(nt_add(e, c), NT_BF16);
    assert_int_equal(nt_add_inplace(acc, e), 0);
    assert_int_equal(nt_mul_inplace(acc, x), 0);
    out[0] = nt_keep(c);
    out[1] = nt_keep(e);
    out[2] = nt_keep(f);
    nt_scope_end(s);
}

/* A ROW program: x times / by / minus a row's max or sum (one broadcast
 * value: subnormal, zero or negative in some rows), two full-row outputs
 * and a per-row one. */
static void regs_row_prog(nt_tensor *x, nt_tensor *z, nt_tensor **out)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *m = nt_max(z, -1, true);
    nt_tensor *y1 = nt_mul(x, m);
    nt_tensor *y2 = nt_div(nt_exp(nt_sub(x, nt_max(x, -1, true))), nt_sum(y1, -1, true));
    nt_tensor *y3 = nt_add(nt_div(y1, m), nt_sub(y2, m));
    out[0] = nt_keep(y2);
    out[1] = nt_keep(y3);
    out[2] = nt_keep(nt_sum(y3, -1, true));
    nt_scope_end(s);
}

/* ---- row programs over tiles of narrow rows (cpu/fused.c) ---- */

/* A layer-norm-like row program with every kind of operand a tile meets:
 * an input whose rows are adjacent (x, read in place), a weight read by
 * every row at one place (w), an input whose rows are not adjacent (a
 * transposed view), a per-row input ([B, T, 1]), per-row values made by
 * reductions and elementwise ops of per-row values, a bf16 rounding point,
 * a stochastic-rounding cast keyed by element, a compare and a where, and
 * outputs: full rows, per-row values, and rows written into a strided view
 * (not adjacent). */
static void tile_prog(nt_tensor *x, nt_tensor *w, nt_tensor *xt, nt_tensor *pr, nt_tensor *big,
                      nt_tensor **out)
{
    nt_scope *s = nt_scope_begin();
    int64_t C = nt_shape(x, 2);
    nt_tensor *mu = nt_mean(x, -1, true);
    nt_tensor *d = nt_sub(x, mu);
    nt_tensor *r = nt_rsqrt(nt_add_scalar(nt_mean(nt_mul(d, d), -1, true), 1e-5));
    nt_tensor *xh = nt_mul(d, r);
    nt_tensor *y = nt_add(nt_mul(xh, w), nt_permute(xt, (int[]){0, 2, 1}));
    nt_tensor *yb = nt_cast(nt_cast(nt_mul(y, pr), NT_BF16), NT_F32);
    nt_tensor *m = nt_max(yb, -1, true);
    nt_tensor *sr = nt_cast_sr(nt_div(nt_sub(y, m), nt_add_scalar(nt_abs(r), 0.5)), NT_BF16);
    nt_tensor *z = nt_where(nt_gt(y, pr), nt_cast(sr, NT_F32), nt_mul(xh, r));
    nt_tensor *v = nt_slice(big, 2, 1, 1 + C, 1);
    nt_copy_into(v, nt_sub(z, nt_mul_scalar(mu, 0.25)));
    out[0] = nt_keep(y);
    out[1] = nt_keep(nt_mul(r, m)); /* per row */
    out[2] = nt_keep(sr);
    nt_scope_end(s);
}

static void test_row_tiles_bitwise(void **state)
{
    (void)state;
    /* C = 24: 42 rows a tile, tiles across the [T] boundary, two spans of
     * rows; 128 (the GPT's width): 8 a tile; 300: 3; 513: one row at a time */
    const int64_t Cs[] = {24, 128, 300, 513}, Ts[] = {1001, 37, 29, 5};
    for (int ci = 0; ci < 4; ci++) {
        const int64_t B = 3, T = Ts[ci], C = Cs[ci], n = B * T * C;
        const size_t nb = (size_t)(B * T * (C + 2));
        float *xv = malloc((size_t)n * 4), *tv = malloc((size_t)n * 4);
        float *ref[4], *got[4];
        isa_values(xv, (size_t)n, 200 + (uint64_t)ci);
        isa_values(tv, (size_t)n, 300 + (uint64_t)ci);
        size_t sz[4] = {(size_t)n * 4, (size_t)(B * T) * 4, (size_t)n * 2, nb * 4};
        for (int k = 0; k < 4; k++)
            ref[k] = malloc(sz[k]), got[k] = malloc(sz[k]);
        /* deterministic (one op at a time), then fused with tiles, then
         * fused one row at a time */
        for (int run = 0; run < 3; run++) {
            nt_shutdown(); /* SR bits key by record sequence: a fresh runtime each */
            assert_int_equal(nt_init(), 0);
            assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
            assert_int_equal(nt_config_set("NT_MODE", run ? "lazy" : "deterministic"), 0);
            __atomic_store_n(&nt__cpu_row_tiles, run == 2 ? 0 : 1, __ATOMIC_RELAXED);
            nt_tensor *x = nt_from_host(xv, NT_F32, 3, (int64_t[]){B, T, C});
            nt_tensor *xt = nt_from_host(tv, NT_F32, 3, (int64_t[]){B, C, T});
            nt_tensor *w = nt_randn(NT_F32, 1, (int64_t[]){C}, 7);
            nt_tensor *pr = nt_randn(NT_F32, 3, (int64_t[]){B, T, 1}, 8);
            nt_tensor *big = nt_zeros(NT_F32, 3, (int64_t[]){B, T, C + 2});
            assert_int_equal(nt_sync(), 0);
            nt_stats_reset();
            nt_tensor *o[3];
            tile_prog(x, w, xt, pr, big, o);
            float **dst = run ? got : ref;
            for (int k = 0; k < 3; k++) {
                assert_int_equal(nt_to_host(o[k], dst[k], sz[k]), 0);
                nt_release(o[k]);
            }
            assert_int_equal(nt_to_host(big, dst[3], sz[3]), 0);
            nt_stats st;
            nt_stats_get(&st);
            if (run) /* the row program ran fused */
                assert_true(st.fusion_groups >= 1 && st.fused_ops >= 20);
            nt_release(x), nt_release(xt), nt_release(w), nt_release(pr), nt_release(big);
            if (run)
                for (int k = 0; k < 4; k++)
                    if (memcmp(ref[k], got[k], sz[k])) {
                        print_message("# C=%lld run %d output %d differs\n", (long long)C, run, k);
                        fail();
                    }
        }
        for (int k = 0; k < 4; k++)
            free(ref[k]), free(got[k]);
        free(xv), free(tv);
    }
    __atomic_store_n(&nt__cpu_row_tiles, 1, __ATOMIC_RELAXED);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

/* rows of 1031 (a tail at every width); 150 rows: 3 spans and 3 blocks of
 * rows, so with 2 threads both take part.  Then 700 rows of 3001: outputs
 * of 8 MiB and more, written by streaming stores, from chunks that start
 * at every alignment. */
static void fused_regs_case(int64_t R, int64_t C)
{
    size_t n = (size_t)(R * C), sz[3] = {n * 4, n * 4, n * 2}, szr[3] = {n * 4, n * 4, R * 4};
    float *xv = malloc(n * 4), *zv = malloc(n * 4), *av = malloc(n * 4);
    char *ref[4], *got = malloc(n * 4), *rref[3];
    rng r = {4242};
    for (size_t i = 0; i < n; i++) {
        int64_t row = (int64_t)i / C;
        uint32_t u = (uint32_t)(rnext(&r) % 0x007fffffu) + 1u; /* a subnormal */
        uint32_t us = u | (rnext(&r) % 2 ? 0x80000000u : 0u);
        float sub, ssub;
        memcpy(&sub, &u, 4);
        memcpy(&ssub, &us, 4);
        xv[i] = row % 5 == 1 ? ssub : (float)((runi(&r) - 0.5) * 8.0);
        zv[i] = row % 3 == 0   ? sub /* the row's max is subnormal */
                : row % 3 == 1 ? (float)(runi(&r) + 0.25)
                               : -(float)runi(&r) * (row % 2 ? 0.0f : 1.0f); /* max 0 or < 0 */
        av[i] = (float)(runi(&r) - 0.5);
    }
    for (int k = 0; k < 4; k++)
        ref[k] = malloc(n * 4);
    for (int k = 0; k < 3; k++)
        rref[k] = malloc(n * 4);
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *z = nt_from_host(zv, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *o[3];
    /* the reference: op by op */
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    nt_tensor *acc = nt_from_host(av, NT_F32, 2, (int64_t[]){R, C});
    regs_ew_prog(x, z, acc, o);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(nt_to_host(o[k], ref[k], sz[k]), 0);
        nt_release(o[k]);
    }
    assert_int_equal(nt_to_host(acc, ref[3], n * 4), 0);
    nt_release(acc);
    regs_row_prog(x, z, o);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(nt_to_host(o[k], rref[k], szr[k]), 0);
        nt_release(o[k]);
    }
    const char *levels[] = {"scalar", "avx2", "avx512"}, *threads[] = {"1", "2"};
    int ran = 0;
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 2; t++) {
            if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                continue; /* this CPU does not run it */
            assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
            ran++;
            assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
            nt_stats_reset();
            acc = nt_from_host(av, NT_F32, 2, (int64_t[]){R, C});
            assert_int_equal(nt_sync(), 0);
            regs_ew_prog(x, z, acc, o);
            for (int k = 0; k < 3; k++) {
                assert_int_equal(nt_to_host(o[k], got, sz[k]), 0);
                nt_release(o[k]);
                if (memcmp(got, ref[k], sz[k]))
                    fail_msg("EW output %d differs at %s, %s thread(s)", k, levels[l],
                             threads[t]);
            }
            assert_int_equal(nt_to_host(acc, got, n * 4), 0);
            nt_release(acc);
            if (memcmp(got, ref[3], n * 4))
                fail_msg("in-place output differs at %s, %s thread(s)", levels[l], threads[t]);
            regs_row_prog(x, z, o);
            for (int k = 0; k < 3; k++) {
                assert_int_equal(nt_to_host(o[k], got, szr[k]), 0);
                nt_release(o[k]);
                if (memcmp(got, rref[k], szr[k]))
                    fail_msg("ROW output %d differs at %s, %s thread(s)", k, levels[l],
                             threads[t]);
            }
            nt_stats st;
            nt_stats_get(&st);
            assert_true(st.fusion_groups >= 2); /* both ran fused */
        }
    assert_true(ran >= 2); /* scalar always runs */
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    nt_release(x), nt_release(z);
    for (int k = 0; k < 4; k++)
        free(ref[k]);
    for (int k = 0; k < 3; k++)
        free(rref[k]);
    free(xv), free(zv), free(av), free(got);
}

static void test_fused_regs_bitwise(void **state)
{
    (void)state;
    fused_regs_case(150, 1031);
    fused_regs_case(700, 3001);
}

/* NaNs canonicalised once (cpu/fused.c plan_canon): values read only by
 * NaN-propagating ops keep whatever NaN their op made (a payload passed
 * through, x86's negative default NaN from inf - inf, 0 * inf, 0 / 0) and
 * only the first canonicalising reader makes it 0x7fc00000.  Every op of
 * that kind in a chain (add, sub, mul, div, x * s, x + s, neg, relu, exp),
 * a loose value read by ops of both kinds, and softmax as primitives, on
 * inputs with NaNs of both signs, quiet and signalling, with payloads, in
 * every lane position, and infinities and zeros against each other: fused
 * == eager, bit for bit, at every ISA level and thread count, and every
 * NaN stored is the canonical one. */
static void nan_ew_prog(nt_tensor *x, nt_tensor *z, nt_tensor **out)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *c = nt_mul(nt_add_scalar(nt_mul_scalar(x, 1.5), 0.25), x);
    nt_tensor *d = nt_sub(c, z); /* read by relu and by add below */
    nt_tensor *g = nt_exp(nt_neg(nt_relu(d)));
    out[0] = nt_keep(nt_div(nt_mul(g, z), z));
    out[1] = nt_keep(nt_abs(nt_mul(x, z))); /* abs is not in the list: x * z canonical */
    out[2] = nt_keep(nt_cast(nt_add(d, x), NT_BF16));
    nt_scope_end(s);
}

static void nan_row_prog(nt_tensor *x, nt_tensor **out)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *e = nt_exp(nt_sub(x, nt_max(x, -1, true)));
    out[0] = nt_keep(nt_div(e, nt_sum(e, -1, true)));
    out[1] = NULL;
    out[2] = NULL;
    nt_scope_end(s);
}

static void test_fused_nan_bitwise(void **state)
{
    (void)state;
    const int64_t R = 48, C = 1031;
    const size_t n = (size_t)(R * C);
    static const uint32_t nans[8] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                     0x7fc12345u, 0xffd00001u, 0x7fbfffffu, 0xffffffffu};
    float *xv = malloc(n * 4), *zv = malloc(n * 4);
    rng r = {777};
    for (size_t i = 0; i < n; i++) {
        int64_t row = (int64_t)i / C;
        float *v[2] = {&xv[i], &zv[i]};
        for (int t = 0; t < 2; t++) {
            /* kind by i mod 5 (5 and 16 coprime: every lane sees every
             * kind); z's shifted against x's, so inf meets 0 and inf */
            size_t k = (i + 2 * (size_t)t) % 5, w = (i / 5 + (size_t)t) % 8;
            uint32_t u;
            if (row % 4 == 0 || k >= 3) /* some rows without NaN: softmax's finite rows */
                *v[t] = (float)((runi(&r) - 0.5) * 8.0);
            else if (k == 0)
                u = nans[w], memcpy(v[t], &u, 4);
            else if (k == 1)
                *v[t] = w % 2 ? -INFINITY : INFINITY;
            else
                *v[t] = w % 2 ? -0.0f : 0.0f;
        }
    }
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *z = nt_from_host(zv, NT_F32, 2, (int64_t[]){R, C});
    const size_t sz[2][3] = {{n * 4, n * 4, n * 2}, {n * 4, 0, 0}};
    char *ref[2][3], *got = malloc(n * 4);
    nt_tensor *o[3];
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    for (int p = 0; p < 2; p++) {
        if (p == 0)
            nan_ew_prog(x, z, o);
        else
            nan_row_prog(x, o);
        for (int k = 0; k < 3; k++) {
            ref[p][k] = NULL;
            if (!o[k])
                continue;
            ref[p][k] = malloc(sz[p][k]);
            assert_int_equal(nt_to_host(o[k], ref[p][k], sz[p][k]), 0);
            nt_release(o[k]);
        }
    }
    /* the reference's NaNs are canonical and there are some of each width */
    size_t nan32 = 0, nan16 = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; ref[p][k] && i < sz[p][k] / (k == 2 ? 2 : 4); i++) {
                if (k == 2) {
                    uint16_t h;
                    memcpy(&h, ref[p][k] + 2 * i, 2);
                    if ((h & 0x7fffu) > 0x7f80u)
                        assert_int_equal(h, 0x7fc0u), nan16++;
                } else {
                    uint32_t u;
                    memcpy(&u, ref[p][k] + 4 * i, 4);
                    if ((u & 0x7fffffffu) > 0x7f800000u)
                        assert_int_equal(u, 0x7fc00000u), nan32++;
                }
            }
    assert_true(nan32 > n / 4 && nan16 > n / 8);
    const char *levels[] = {"scalar", "avx2", "avx512"}, *threads[] = {"1", "2"};
    int ran = 0;
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 2; t++) {
            if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                continue; /* this CPU does not run it */
            assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
            ran++;
            assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
            for (int p = 0; p < 2; p++) {
                nt_stats_reset();
                if (p == 0)
                    nan_ew_prog(x, z, o);
                else
                    nan_row_prog(x, o);
                for (int k = 0; k < 3; k++) {
                    if (!o[k])
                        continue;
                    assert_int_equal(nt_to_host(o[k], got, sz[p][k]), 0);
                    nt_release(o[k]);
                    if (memcmp(got, ref[p][k], sz[p][k]))
                        fail_msg("%s output %d differs at %s, %s thread(s)", p ? "ROW" : "EW", k,
                                 levels[l], threads[t]);
                }
                nt_stats st;
                nt_stats_get(&st);
                assert_true(st.fusion_groups >= 1 && st.fused_values_elided >= 3);
            }
        }
    assert_true(ran >= 2);
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    nt_release(x), nt_release(z);
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++)
            free(ref[p][k]);
    free(xv), free(zv), free(got);
}

/* A row group that turns an op away for SBUF capacity (three full rows of
 * 16384 f32 exceed 160 KiB): the values the turned-away op reads must still
 * be written for the next kernel.  The planner counted the op's reads before
 * turning it away, so x - max(x) looked read inside the group only, was
 * elided, and exp read memory nobody wrote (every element wrong, by a factor
 * of about 50).  Both backends, each mode against deterministic. */
static nt_tensor *capacity_prog(nt_tensor *x, nt_tensor *z)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *y1 = nt_mul(x, nt_max(z, -1, true));
    nt_tensor *y = nt_div(nt_exp(nt_sub(x, nt_max(x, -1, true))), nt_sum(y1, -1, true));
    nt_keep(y);
    nt_scope_end(s);
    return y;
}

static void test_capacity_cut_keeps_read_values(void **state)
{
    (void)state;
    const int64_t R = 3, C = 16384;
    size_t n = (size_t)(R * C);
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    const char *backends[] = {"cpu", "sim"}, *modes[] = {"lazy", "adaptive", "eager"};
    for (int b = 0; b < 2; b++) {
        assert_int_equal(nt_config_set("NT_BACKEND", backends[b]), 0);
        nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){R, C}, 61);
        nt_tensor *z = nt_randn(NT_F32, 2, (int64_t[]){R, C}, 62);
        assert_int_equal(nt_config_set("NT_MODE", "deterministic"), 0);
        nt_tensor *y = capacity_prog(x, z);
        assert_int_equal(nt_to_host(y, ref, n * 4), 0);
        nt_release(y);
        for (int m = 0; m < 3; m++) {
            assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
            assert_int_equal(nt_sync(), 0);
            nt_stats_reset();
            y = capacity_prog(x, z);
            assert_int_equal(nt_to_host(y, got, n * 4), 0);
            nt_release(y);
            if (memcmp(got, ref, n * 4))
                fail_msg("%s backend, %s mode differs from deterministic", backends[b], modes[m]);
            nt_stats st;
            nt_stats_get(&st);
            if (m == 0)
                assert_true(st.fusion_groups >= 2); /* cut in two, both fused */
        }
        nt_release(x), nt_release(z);
    }
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    free(ref), free(got);
}

static void test_softmax_primitives_one_row_kernel(void **state)
{
    (void)state;
    nt_tensor *io[2];
    io[0] = nt_randn(NT_F32, 2, (int64_t[]){32, 300}, 2);
    nt_sync();
    char *log = nt_test_fusion_log(softmax_body, io);
    assert_non_null(strstr(log, "row, 5 ops"));
    assert_non_null(strstr(log, "writes 1, elides 4"));
    /* and it equals the built-in softmax bit for bit (same arithmetic) */
    float a[32 * 300], b[32 * 300];
    nt_to_host(io[1], a, sizeof a);
    nt_tensor *ref = nt_softmax(io[0], -1);
    nt_to_host(ref, b, sizeof b);
    assert_memory_equal(a, b, sizeof a);
    free(log);
    nt_release(io[0]), nt_release(io[1]), nt_release(ref);
}

static void linear_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", "lazy");
    nt_scope *s = nt_scope_begin();
    io[3] = nt_keep(nt_relu(nt_linear(io[0], io[1], io[2])));
    nt_scope_end(s);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_matmul_epilogue(void **state)
{
    (void)state;
    nt_tensor *io[4];
    io[0] = nt_randn(NT_F32, 2, (int64_t[]){16, 40}, 3);
    io[1] = nt_randn(NT_F32, 2, (int64_t[]){24, 40}, 4);
    io[2] = nt_randn(NT_F32, 1, (int64_t[]){24}, 5);
    nt_sync();
    char *log = nt_test_fusion_log(linear_body, io);
    assert_non_null(strstr(log, "matmul+epilogue, 3 ops"));
    assert_non_null(strstr(log, "writes 1, elides 2"));
    free(log);
    for (int i = 0; i < 4; i++)
        nt_release(io[i]);
}

static void live_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", "lazy");
    nt_tensor *a = nt_exp(io[0]);        /* kept by the user: written out */
    nt_tensor *b = nt_neg(a);
    nt_tensor *view = nt_reshape(b, 1, (int64_t[]){-1}); /* b has a view */
    nt_tensor *c = nt_mul_scalar(b, 2.0);
    nt_release(b);
    io[1] = a;
    io[2] = view;
    io[3] = c;
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_liveness_reasons(void **state)
{
    (void)state;
    nt_tensor *io[4];
    io[0] = nt_randn(NT_F32, 1, (int64_t[]){100}, 6);
    nt_sync();
    char *log = nt_test_fusion_log(live_body, io);
    assert_non_null(strstr(log, "elementwise, 3 ops"));
    assert_non_null(strstr(log, "written out (live user handle)"));
    assert_non_null(strstr(log, "another handle on its storage"));
    assert_non_null(strstr(log, "writes 3, elides 0"));
    free(log);
    for (int i = 0; i < 4; i++)
        nt_release(io[i]);
}

/* A value whose storage has a second handle -- the view a backward pass
 * leaves when it permutes a gradient back (permute twice: the same view
 * again) -- read only by the same kernel: nothing can read it afterwards,
 * so it is elided (storage_group_only in fusion/plan.c).  When the user
 * keeps the view, it is written out.  Same bits as unfused either way. */
static bool keep_view;

static void view_only_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", (const char *)io[3]);
    nt_tensor *a = nt_exp(io[0]);
    nt_tensor *p1 = nt_permute(a, (int[]){1, 0});
    nt_tensor *p2 = nt_permute(p1, (int[]){1, 0});
    nt_release(p1);
    nt_release(a);
    io[1] = nt_mul_scalar(p2, 2.0);
    if (keep_view)
        io[2] = p2;
    else
        nt_release(p2);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_view_read_only_in_kernel_elided(void **state)
{
    (void)state;
    const char *backends[2] = {"sim", "cpu"};
    for (int be = 0; be < 2; be++) {
        assert_int_equal(nt_config_set("NT_BACKEND", backends[be]), 0);
        for (int keep = 0; keep < 2; keep++) {
            keep_view = keep;
            nt_tensor *io[4] = {nt_randn(NT_F32, 2, (int64_t[]){6, 8}, 11), NULL, NULL,
                                (nt_tensor *)"lazy"};
            nt_sync();
            char *log = nt_test_fusion_log(view_only_body, io);
            assert_non_null(strstr(log, "elementwise, 2 ops"));
            if (keep) {
                assert_non_null(strstr(log, "writes 2, elides 0"));
                assert_non_null(strstr(log, "another handle on its storage"));
            } else {
                assert_non_null(strstr(log, "writes 1, elides 1"));
            }
            free(log);
            /* the unfused reference */
            nt_tensor *ref[4] = {io[0], NULL, NULL, (nt_tensor *)"deterministic"};
            view_only_body(ref);
            float got[48], want[48], kept[48], kwant[48];
            assert_int_equal(nt_to_host(io[1], got, sizeof got), 0);
            assert_int_equal(nt_to_host(ref[1], want, sizeof want), 0);
            assert_memory_equal(got, want, sizeof got);
            if (keep) {
                assert_int_equal(nt_to_host(io[2], kept, sizeof kept), 0);
                assert_int_equal(nt_to_host(ref[2], kwant, sizeof kwant), 0);
                assert_memory_equal(kept, kwant, sizeof kept);
                nt_release(io[2]);
                nt_release(ref[2]);
            }
            nt_release(io[0]);
            nt_release(io[1]);
            nt_release(ref[1]);
        }
    }
    keep_view = false;
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0); /* setup's */
}

/* The case above as a backward pass leaves it: under bf16 autocast the
 * weight of x @ w^T is cast in memory order and permuted, so its gradient
 * is a matmul output permuted back, read only by the cast to f32 in the
 * matmul's epilogue: the bf16 gradient is elided, on both backends, and w's
 * gradient has the unfused bits. */
static void amp_grad_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", (const char *)io[3]);
    nt_scope *sc = nt_scope_begin();
    assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    nt_tensor *y = nt_linear(io[0], io[1], NULL);
    assert_int_equal(nt_autocast_end(), 0);
    assert_int_equal(nt_backward(nt_sum(nt_cast(y, NT_F32), NT_DIM_ALL, false)), 0);
    nt_scope_end(sc);
    io[2] = nt_grad(io[1]);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_amp_weight_grad_not_written(void **state)
{
    (void)state;
    const char *backends[2] = {"sim", "cpu"};
    for (int be = 0; be < 2; be++) {
        assert_int_equal(nt_config_set("NT_BACKEND", backends[be]), 0);
        float got[160 * 48], want[160 * 48];
        for (int run = 0; run < 2; run++) {
            nt_tensor *io[4] = {nt_randn(NT_F32, 2, (int64_t[]){8, 48}, 21),
                                nt_randn(NT_F32, 2, (int64_t[]){160, 48}, 22), NULL,
                                (nt_tensor *)(run ? "deterministic" : "lazy")};
            assert_int_equal(nt_set_requires_grad(io[1], true), 0);
            nt_sync();
            char *log = nt_test_fusion_log(amp_grad_body, io);
            if (!run) {
                const char *k = strstr(log, "matmul+epilogue, 2 ops [backward:matmul");
                if (!k)
                    fail_msg("no weight-gradient kernel in:\n%s", log);
                const char *eol = strchr(k, '\n');
                char line[2048];
                snprintf(line, sizeof line, "%.*s", (int)(eol ? eol - k : (long)strlen(k)), k);
                if (!strstr(line, "writes 1, elides 1"))
                    fail_msg("the bf16 weight gradient was written out: %s", line);
            }
            free(log);
            assert_non_null(io[2]);
            assert_int_equal(nt_to_host(io[2], run ? want : got, sizeof got), 0);
            for (int i = 0; i < 3; i++)
                nt_release(io[i]);
        }
        assert_memory_equal(got, want, sizeof got);
    }
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0); /* setup's */
}

/* In-place copies whose result is only stored: the simulator's program
 * stores the source's register instead of copying it first (neuron/
 * ew.c run_op), when the source is a computed value of the same dtype --
 * canonical already.  A copy of a kernel input keeps its instruction (a
 * guard: the NaNs given to nt_from_host below are canonical by the time a
 * kernel reads them, so no public input shows a payload).  Elementwise and
 * matmul-epilogue programs, f32 and bf16, every mode, both backends: the
 * bits of the deterministic CPU run, NaNs canonical. */
static void copy_store_run(const char *backend, const char *mode, nt_dtype dt, uint8_t *out,
                           size_t nb)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    enum { R = 16, C = 24 };
    float h[C * C]; /* x: its first R rows */
    for (int i = 0; i < C * C; i++)
        h[i] = (float)((i * 37) % 29) * 0.25f - 3.0f;
    const uint32_t nans[4] = {0x7fc00001u, 0xffc12345u, 0x7f800001u, 0x7fa00000u};
    for (int i = 0; i < 4; i++)
        memcpy(&h[i * 41], &nans[i], 4);
    nt_tensor *x = nt_from_host(h, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *w = nt_from_host(h, NT_F32, 2, (int64_t[]){C, C});
    nt_tensor *xd = dt == NT_F32 ? nt_keep(x) : nt_cast(x, dt), *wd = nt_cast(w, dt);
    nt_tensor *d[5];
    for (int i = 0; i < 5; i++)
        d[i] = nt_zeros(dt, 2, (int64_t[]){R, C});
    nt_scope *sc = nt_scope_begin();
    nt_tensor *y = nt_mul_scalar(xd, 2.0);         /* computed: NaNs canonical */
    assert_int_equal(nt_copy_into(d[0], y), 0);    /* the register stored */
    assert_int_equal(nt_copy_into(d[1], xd), 0);   /* a kernel input: copied */
    assert_int_equal(nt_copy_into(d[2], nt_add_scalar(y, 1.0)), 0);
    nt_tensor *m = nt_matmul(xd, wd);              /* an MM epilogue */
    assert_int_equal(nt_copy_into(d[3], m), 0);
    assert_int_equal(nt_copy_into(d[4], nt_relu(m)), 0);
    nt_scope_end(sc);
    size_t es = dt == NT_F32 ? 4 : 2, one = (size_t)R * C * es;
    assert_true(nb == 5 * one);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(nt_to_host(d[i], out + i * one, one), 0);
        nt_release(d[i]);
    }
    nt_release(x);
    nt_release(w);
    nt_release(xd);
    nt_release(wd);
}

static void test_sim_copy_stores_source(void **state)
{
    (void)state;
    const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};
    const nt_dtype dts[2] = {NT_F32, NT_BF16};
    for (int d = 0; d < 2; d++) {
        size_t nb = 5 * 16 * 24 * (dts[d] == NT_F32 ? 4 : 2);
        uint8_t *ref = malloc(nb), *got = malloc(nb);
        assert_non_null(ref);
        assert_non_null(got);
        copy_store_run("cpu", "deterministic", dts[d], ref, nb);
        for (int be = 0; be < 2; be++)
            for (int m = 0; m < 4; m++) {
                copy_store_run(be ? "sim" : "cpu", modes[m], dts[d], got, nb);
                size_t at = 0;
                while (at < nb && got[at] == ref[at])
                    at++;
                if (at < nb)
                    fail_msg("byte %zu (of %zu): %02x vs %02x; %s: %s backend, %s mode differs from the deterministic CPU run",
                             at, nb, got[at], ref[at], nt_dtype_name(dts[d]), be ? "sim" : "cpu", modes[m]);
            }
        /* the computed copy's NaNs are canonical; the input copy's too */
        if (dts[d] == NT_F32) {
            uint32_t u;
            memcpy(&u, ref + 41 * 4, 4);
            assert_int_equal(u, 0x7fc00000u);
            memcpy(&u, ref + 16 * 24 * 4 + 41 * 4, 4);
            assert_int_equal(u, 0x7fc00000u);
        }
        free(ref);
        free(got);
    }
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0); /* setup's */
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

static void breaks_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", "lazy");
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = io[0];
    nt_tensor *a = nt_exp(nt_neg(x));                      /* [8, 16] */
    nt_tensor *b = nt_relu(nt_sum(a, 0, false));           /* reduction over dim 0 */
    int32_t ix[3] = {0, 1, 2};
    nt_tensor *e = nt_embedding(a, nt_from_host(ix, NT_I32, 1, (int64_t[]){3}));
    nt_tensor *f = nt_add_scalar(nt_tanh(e), 1.0);
    io[1] = nt_keep(nt_add(nt_sum(f, NT_DIM_ALL, false), nt_sum(b, NT_DIM_ALL, false)));
    nt_scope_end(s);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_break_reasons(void **state)
{
    (void)state;
    nt_tensor *io[2];
    io[0] = nt_randn(NT_F32, 2, (int64_t[]){8, 16}, 7);
    nt_sync();
    char *log = nt_test_fusion_log(breaks_body, io);
    assert_non_null(strstr(log, "break before sum"));
    assert_non_null(strstr(log, "sum is not fusable"));
    assert_non_null(strstr(log, "embedding is not fusable"));
    assert_non_null(strstr(log, "batch of"));
    assert_non_null(strstr(log, "ends: sync point"));
    free(log);
    nt_release(io[0]);
    nt_release(io[1]);
}

static void capacity_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", "lazy");
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = io[0]; /* [4, 16384]: 64 KiB per row of f32 */
    nt_tensor *t = nt_exp(x);
    for (int k = 0; k < 4; k++)
        t = nt_add(t, nt_mul_scalar(x, k));
    io[1] = nt_keep(nt_sum(t, -1, true));
    nt_scope_end(s);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_break_sbuf_capacity(void **state)
{
    (void)state;
    nt_tensor *io[2];
    io[0] = nt_randn(NT_F32, 2, (int64_t[]){4, 16384}, 8);
    nt_sync();
    char *log = nt_test_fusion_log(capacity_body, io);
    assert_non_null(strstr(log, "SBUF capacity"));
    free(log);
    /* still the same values as unfused */
    float a[4], b[4];
    nt_to_host(io[1], a, sizeof a);
    nt_config_set("NT_FUSION", "0");
    nt_tensor *io2[2] = {io[0], NULL};
    capacity_body(io2);
    nt_to_host(io2[1], b, sizeof b);
    nt_config_set("NT_FUSION", "1");
    assert_memory_equal(a, b, sizeof a);
    nt_release(io[0]), nt_release(io[1]), nt_release(io2[1]);
}

static void hazard_body(void *arg)
{
    nt_tensor **io = arg;
    nt_config_set("NT_MODE", "lazy");
    nt_tensor *x = nt_mul_scalar(io[0], 1.0);      /* [6, 6] */
    nt_tensor *xt = nt_transpose(x, 0, 1);
    nt_tensor *y = nt_add_scalar(x, 1.0);
    nt_add_inplace(x, nt_exp(xt));                 /* exp reads x^T: another view */
    io[1] = x;
    io[2] = y;
    nt_release(xt);
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_break_view_hazards(void **state)
{
    (void)state;
    nt_tensor *io[3];
    io[0] = nt_randn(NT_F32, 2, (int64_t[]){6, 6}, 9);
    nt_sync();
    char *log = nt_test_fusion_log(hazard_body, io);
    assert_true(strstr(log, "another view") != NULL);
    free(log);
    float a[36], b[36];
    nt_to_host(io[1], a, sizeof a);
    nt_config_set("NT_DETERMINISTIC", "1");
    nt_tensor *io2[3] = {io[0], NULL, NULL};
    hazard_body(io2);
    nt_to_host(io2[1], b, sizeof b);
    nt_config_set("NT_DETERMINISTIC", "0");
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < 3; i++)
        nt_release(io[i]);
    nt_release(io2[1]), nt_release(io2[2]);
}

/* Two fused programs that differ only in an op's second integer
 * parameter (BINARY_DX's p.i[1]: d/da or d/db) are two kernels: pow's two
 * partials in one lazy batch gave b's gradient a's bits while the cache
 * keyed p.i[0] alone.  Both backends, against the deterministic run. */
static void test_cache_key_int_params(void **state)
{
    (void)state;
    const char *backends[] = {"cpu", "sim"};
    float a[6] = {2.0f, 3.0f, 0.5f, 1.5f, 0.0f, 4.0f}, b[6] = {1.5f, -0.5f, 2.0f, 0.25f, 2.0f, 0.0f};
    for (int be = 0; be < 2; be++) {
        float ga[2][6], gb[2][6];
        for (int m = 0; m < 2; m++) {
            assert_int_equal(nt_config_set("NT_BACKEND", backends[be]), 0);
            assert_int_equal(nt_config_set("NT_MODE", m ? "lazy" : "deterministic"), 0);
            nt_scope *s = nt_scope_begin();
            nt_tensor *A = nt_from_host(a, NT_F32, 1, (int64_t[]){6});
            nt_tensor *B = nt_from_host(b, NT_F32, 1, (int64_t[]){6});
            nt_set_requires_grad(A, true);
            nt_set_requires_grad(B, true);
            assert_int_equal(nt_backward(nt_sum(nt_pow(A, B), 0, false)), 0);
            assert_int_equal(nt_to_host(nt_grad(A), ga[m], sizeof ga[m]), 0);
            assert_int_equal(nt_to_host(nt_grad(B), gb[m], sizeof gb[m]), 0);
            nt_scope_end(s);
        }
        assert_memory_equal(ga[0], ga[1], sizeof ga[0]);
        assert_memory_equal(gb[0], gb[1], sizeof gb[0]);
        assert_true(gb[1][0] == powf(2.0f, 1.5f) * logf(2.0f)); /* not d/da's 1.5 * 2^0.5 */
    }
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

static void test_kernel_cache(void **state)
{
    (void)state;
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){64, 256}, 10);
    nt_sync();
    nt_config_set("NT_MODE", "lazy");
    nt_stats_reset();
    for (int k = 0; k < 5; k++) {
        nt_tensor *y = chain(x);
        nt_sync();
        nt_release(y);
    }
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.fusion_groups, 5);
    assert_true(st.kernel_cache_misses <= 1);
    assert_true(st.kernel_cache_hits >= 4);
    nt_config_set("NT_MODE", "adaptive");
    nt_release(x);
}

static void test_op_limit(void **state)
{
    (void)state;
    nt_config_set("NT_MODE", "lazy");
    nt_config_set("NT_FUSION_LOG", "0");
    nt_stats_reset();
    nt_tensor *x = nt_randn(NT_F32, 1, (int64_t[]){50}, 11);
    nt_scope *s = nt_scope_begin();
    nt_tensor *t = x;
    for (int k = 0; k < 150; k++)
        t = nt_add_scalar(t, 0.5);
    nt_keep(t);
    nt_scope_end(s);
    float out[50], in[50];
    nt_to_host(t, out, sizeof out);
    nt_to_host(x, in, sizeof in);
    for (int i = 0; i < 50; i++) {
        float e = in[i];
        for (int k = 0; k < 150; k++)
            e += 0.5f;
        assert_true(out[i] == e);
    }
    nt_stats st;
    nt_stats_get(&st);
    assert_true(st.fusion_groups >= 3); /* 150 ops do not fit one kernel */
    assert_true(st.fusion_breaks >= 2);
    nt_config_set("NT_MODE", "adaptive");
    nt_release(x), nt_release(t);
}

/* A group where every value stays live (the user keeps all 64): the kernel
 * writes them all.  Once, the output table held 24 and overflowed. */
static void test_many_live_outputs(void **state)
{
    (void)state;
    nt_config_set("NT_MODE", "lazy");
    nt_tensor *a = nt_arange(NT_F32, 0, 16, 1);
    nt_sync();
    nt_tensor *outs[100];
    for (int k = 0; k < 100; k++)
        outs[k] = nt_add_scalar(a, k);
    nt_sync();
    for (int k = 0; k < 100; k++) {
        float o[16];
        assert_int_equal(nt_to_host(outs[k], o, sizeof o), 0);
        for (int i = 0; i < 16; i++)
            assert_true(o[i] == (float)(i + k));
        nt_release(outs[k]);
    }
    nt_release(a);
    nt_config_set("NT_MODE", "adaptive");
}

/* Streamed outputs (8 MiB and more) whose last op writes its own streaming
 * stores (cpu/fused.c stream_direct): softmax as primitives (the div by the
 * row's sum), an 8-op-style chain ending in x * z, and one ending in x / s,
 * with chunks whose fast pass fails (subnormal operands, underflowing
 * results, a subnormal scalar: the lines streamed are then rewritten by the
 * exact route), a tail chunk of odd length and a ROW program with unaligned
 * rows: fused == eager bit for bit at every ISA level and thread count. */
static void stream_row_prog(nt_tensor *x, nt_tensor **out)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *e = nt_exp(nt_sub(x, nt_max(x, -1, true)));
    out[0] = nt_keep(nt_div(e, nt_sum(e, -1, true)));
    nt_scope_end(s);
}

static void stream_ew_prog(nt_tensor *x, nt_tensor *z, nt_tensor **out)
{
    nt_scope *s = nt_scope_begin();
    out[0] = nt_keep(nt_mul(nt_add_scalar(nt_mul_scalar(x, 1.5), 0.25), z));
    out[1] = nt_keep(nt_div_scalar(nt_relu(nt_sub(x, z)), 3.0));
    out[2] = nt_keep(nt_mul_scalar(nt_neg(x), 2e-39)); /* a subnormal scalar */
    nt_scope_end(s);
}

static void stream_direct_case(int64_t R, int64_t C, int64_t N)
{
    size_t nr = (size_t)(R * C), ne = (size_t)N;
    float *xr = malloc(nr * 4), *xe = malloc(ne * 4), *ze = malloc(ne * 4);
    char *ref[4], *got = malloc((nr > ne ? nr : ne) * 4);
    const size_t sz[4] = {nr * 4, ne * 4, ne * 4, ne * 4};
    rng r = {9191};
    for (size_t i = 0; i < nr; i++) {
        int64_t row = (int64_t)i / C, j = (int64_t)i % C;
        /* row % 4 == 1: one 0 and the rest 88 to 104 below it, so exp and
         * the quotient are subnormal or zero; == 2: one value, sum = C */
        xr[i] = row % 4 == 1   ? (j == 7 ? 0.0f : (float)(-88.0 - 16.0 * runi(&r)))
                : row % 4 == 2 ? 0.5f
                               : (float)((runi(&r) - 0.5) * 8.0);
    }
    for (size_t i = 0; i < ne; i++) {
        size_t chunk = i / 1024;
        uint32_t u = (uint32_t)(rnext(&r) % 0x007fffffu) + 1u;
        float sub;
        memcpy(&sub, &u, 4);
        xe[i] = (float)((runi(&r) - 0.5) * 8.0);
        /* every 7th chunk: a subnormal z here and there; every 5th: tiny
         * z, so products and differences underflow */
        ze[i] = chunk % 7 == 3 && i % 97 == 0 ? sub
                : chunk % 5 == 2              ? (float)(runi(&r) * 1e-37)
                                              : (float)(runi(&r) - 0.5);
    }
    nt_tensor *x = nt_from_host(xr, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *xv = nt_from_host(xe, NT_F32, 1, (int64_t[]){N});
    nt_tensor *zv = nt_from_host(ze, NT_F32, 1, (int64_t[]){N});
    nt_tensor *o[3];
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    stream_row_prog(x, o);
    ref[0] = malloc(sz[0]);
    assert_int_equal(nt_to_host(o[0], ref[0], sz[0]), 0);
    nt_release(o[0]);
    stream_ew_prog(xv, zv, o);
    size_t nsub = 0;
    for (int k = 0; k < 3; k++) {
        ref[k + 1] = malloc(sz[k + 1]);
        assert_int_equal(nt_to_host(o[k], ref[k + 1], sz[k + 1]), 0);
        nt_release(o[k]);
    }
    /* the inputs reach the subnormal range where they should */
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < sz[k] / 4; i++) {
            uint32_t u;
            memcpy(&u, ref[k] + 4 * i, 4);
            nsub += (u & 0x7fffffffu) - 1u < 0x007fffffu;
        }
    assert_true(nsub > 1000);
    const char *levels[] = {"scalar", "avx2", "avx512"}, *threads[] = {"1", "2"};
    int ran = 0;
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 2; t++) {
            if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                continue; /* this CPU does not run it */
            assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
            ran++;
            assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
            nt_stats_reset();
            stream_row_prog(x, o);
            assert_int_equal(nt_to_host(o[0], got, sz[0]), 0);
            nt_release(o[0]);
            if (memcmp(got, ref[0], sz[0]))
                fail_msg("ROW output differs at %s, %s thread(s)", levels[l], threads[t]);
            stream_ew_prog(xv, zv, o);
            for (int k = 0; k < 3; k++) {
                assert_int_equal(nt_to_host(o[k], got, sz[k + 1]), 0);
                nt_release(o[k]);
                if (memcmp(got, ref[k + 1], sz[k + 1]))
                    fail_msg("EW output %d differs at %s, %s thread(s)", k, levels[l],
                             threads[t]);
            }
            nt_stats st;
            nt_stats_get(&st);
            assert_true(st.fusion_groups >= 2); /* both ran fused */
        }
    assert_true(ran >= 2);
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    nt_release(x), nt_release(xv), nt_release(zv);
    for (int k = 0; k < 4; k++)
        free(ref[k]);
    free(xr), free(xe), free(ze), free(got);
}

/* ---------------- planning order ----------------
 *
 * The planner moves records in two reorder passes that now run in the same
 * pass as grouping (a window ahead of it), the matmul pass visiting only
 * the matmuls the worker noted.  With nt__fplan_check set, each batch is
 * also ordered the old way (each pass over the whole batch before any
 * kernel runs), and every record must be planned in the same place.  The
 * sequences below are built to make both passes move records: matmuls with
 * 128+ rows whose readers come later, elementwise records whose producers
 * are far back, in-place writes, views, fills, casts and breaks. */

static nt_tensor *plan_pick(nt_tensor **v, int nv, rng *g, int64_t rows)
{
    for (int tries = 0; tries < 16; tries++) {
        nt_tensor *t = v[rnext(g) % (uint64_t)nv];
        if (t && nt_ndim(t) == 2 && nt_shape(t, 0) == rows)
            return t;
    }
    return NULL;
}

static void plan_sequence(uint64_t seed, const char *mode, GByteArray *out)
{
    rng g = {seed * 0x9e3779b97f4a7c15ull + 1};
    nt_config_set("NT_MODE", mode);
    enum { NV = 48 };
    nt_tensor *v[NV] = {0};
    int nv = 0;
    const int64_t C = 32, K = 24;
    nt_tensor *w = nt_randn(NT_F32, 2, (int64_t[]){K, C}, seed + 100);
    for (int i = 0; i < 4; i++)
        v[nv++] = nt_randn(NT_F32, 2, (int64_t[]){i % 2 ? 160 : 128, C}, seed + i);
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){128, K}, seed + 7);
    int nsteps = 60 + rint_(&g, 120);
    for (int k = 0; k < nsteps; k++) {
        int kind = rint_(&g, 16);
        int64_t rows = rint_(&g, 4) ? 128 : 160;
        nt_tensor *a = plan_pick(v, nv, &g, rows), *b = plan_pick(v, nv, &g, rows), *y = NULL;
        if (!a)
            continue;
        switch (kind) {
        case 0: case 1: y = nt_matmul(x, w); break;
        case 2: y = nt_add(a, b ? b : a); break;
        case 3: y = nt_mul(a, b ? b : a); break;
        case 4: y = nt_add_scalar(a, 0.25); break;
        case 5: y = nt_mul_scalar(a, -1.5); break;
        case 6: y = nt_relu(a); break;
        case 7: y = nt_full(NT_F32, 2, (int64_t[]){rows, C}, 0.5); break;
        case 8: y = nt_div_scalar(a, 3.0); break;
        case 9: y = nt_cast(nt_cast(a, NT_BF16), NT_F32); break;
        case 10: y = nt_sum(a, -1, true); break; /* a row group, or a break */
        case 11: assert_int_equal(nt_add_scalar_inplace(a, 1.0), 0); break;
        case 12:
            if (b && b != a && nt_shape(a, 1) == nt_shape(b, 1))
                assert_int_equal(nt_mul_inplace(a, b), 0);
            break;
        case 13: y = nt_transpose(nt_transpose(a, 0, 1), 0, 1); break; /* a view */
        case 14: y = nt_exp(nt_mul_scalar(a, 0.01)); break;
        default: /* drop a value: its producer's output may stay on chip */
            if (nv > 6) {
                int d = 4 + rint_(&g, nv - 4);
                nt_release(v[d]);
                v[d] = v[--nv];
            }
            break;
        }
        if (y) {
            if (nv == NV) {
                int d = 4 + rint_(&g, nv - 4);
                nt_release(v[d]);
                v[d] = y;
            } else {
                v[nv++] = y;
            }
        }
    }
    assert_int_equal(nt_sync(), 0);
    for (int i = 0; i < nv; i++) {
        size_t nb = (size_t)nt_numel(v[i]) * 4;
        guint8 *buf = g_malloc(nb);
        assert_int_equal(nt_to_host(v[i], buf, nb), 0);
        g_byte_array_append(out, buf, (guint)nb);
        g_free(buf);
        nt_release(v[i]);
    }
    nt_release(w);
    nt_release(x);
    nt_config_set("NT_MODE", "adaptive");
}

static void test_plan_order_unchanged(void **state)
{
    nt__fplan_check = true;
    AO_store(&nt__fplan_mismatch, 0);
    AO_store(&nt__fplan_moved, 0);
    int n = getenv("NT_TEST_QUICK") ? 40 : 200;
    for (int seed = 1; seed <= n; seed++) {
        GByteArray *ref = g_byte_array_new(), *got = g_byte_array_new();
        plan_sequence((uint64_t)seed, "deterministic", ref);
        plan_sequence((uint64_t)seed, seed % 2 ? "lazy" : "adaptive", got);
        if (ref->len != got->len || memcmp(ref->data, got->data, ref->len))
            fail_msg("plan sequence %d: fused results differ from deterministic mode", seed);
        g_byte_array_unref(ref);
        g_byte_array_unref(got);
    }
    AO_t moved_own = AO_load(&nt__fplan_moved);
    /* and the existing programs that move records: random DAGs, a linear
     * layer, a bf16 weight gradient */
    differential(false, nprograms(200), "cpu");
    test_matmul_epilogue(state);
    test_amp_weight_grad_not_written(state);
    nt__fplan_check = false;
    print_message("# planning order: %lu records moved by the reorder passes (%lu in the "
                  "sequences built for it), %lu planned elsewhere\n",
                  (unsigned long)AO_load(&nt__fplan_moved), (unsigned long)moved_own,
                  (unsigned long)AO_load(&nt__fplan_mismatch));
    assert_true(moved_own > 0);
    assert_int_equal(AO_load(&nt__fplan_mismatch), 0);
}

static void test_fused_stream_direct_bitwise(void **state)
{
    (void)state;
    /* 8 MiB outputs: rows of 4096 (every chunk aligned), an EW tail of 5 */
    stream_direct_case(520, 4096, (2 << 20) + 5);
    /* rows of 4100: most rows start unaligned (the L1-chunk route) */
    stream_direct_case(520, 4100, 2 << 20);
}

/* Elementwise chains in vector registers (cpu/fused.c, lin_*): a program
 * whose every op reads the op before it (and otherwise inputs and scalars)
 * runs at the AVX-512 level as one loop over registers, under flush-to-zero
 * with the per-op passes as the exact route for a chunk with a tiny result.
 * Every op kind it takes, the chain's value as first and as second operand,
 * inputs broadcast along the row and along the column, a chain that starts
 * from a broadcast input; on NaNs of both signs with payloads, infinities,
 * signed zeros, subnormal operands, operands whose products underflow, and
 * plain values; rows of 1031 (a masked tail) and a 1-D span of odd length:
 * fused == eager bit for bit at every ISA level, 1 and 2 threads, with the
 * chain route on and off and the subnormal-testing passes forced, and with
 * subnormal assists taken as costly (FTZ runs redone) and as cheap (the
 * plain IEEE operations, cpu/subnormal.c). */
static nt_tensor *chain_prog(int p, nt_tensor *x, nt_tensor *z, nt_tensor *rb, nt_tensor *cb)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *a;
    switch (p) {
    case 0: /* bench/fusion's */
        a = nt_mul(nt_add_scalar(nt_mul_scalar(nt_relu(nt_sub(nt_mul(nt_add_scalar(nt_mul_scalar(x, 1.5), 0.25), x), x)), 0.5), 1.0), x);
        break;
    case 1:
        a = nt_div(z, nt_sub(x, z));                 /* the value second */
        a = nt_minimum(z, nt_maximum(a, x));         /* canonical before max/min */
        a = nt_mul(nt_add(rb, a), cb);               /* broadcast inputs */
        a = nt_div_scalar(nt_abs(nt_neg(a)), 3.0);
        a = nt_cast(a, NT_F32);
        a = nt_div(nt_relu(nt_sub(nt_minimum(nt_maximum(x, a), rb), z)), x);
        break;
    case 2: /* max and min on ties of signed zeros, either side */
        a = nt_div(x, nt_maximum(nt_relu(x), z)); /* x / +-0: the zero's sign shows */
        a = nt_div(x, nt_minimum(z, nt_mul_scalar(nt_relu(a), 0.0)));
        break;
    default: /* from a broadcast input; tiny scalars make products underflow */
        a = nt_mul_scalar(nt_mul(nt_add(rb, x), z), 1e-30);
        a = nt_add_scalar(nt_mul_scalar(a, 1e-8), -1e-38);
        break;
    }
    nt_keep(a);
    nt_scope_end(s);
    return a;
}

static void chain_case(int64_t R, int64_t C, bool special, uint64_t *chunks, uint64_t *redone)
{
    const size_t n = (size_t)(R * C);
    static const uint32_t nans[6] = {0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                     0xff812345u, 0x7fd00001u, 0xffffffffu};
    float *xv = malloc(n * 4), *zv = malloc(n * 4), *rv = malloc((size_t)R * 4);
    float *cv = malloc((size_t)C * 4), *ref = malloc(n * 4), *got = malloc(n * 4);
    rng r = {4242 + (uint64_t)special};
    for (size_t i = 0; i < n; i++) {
        float *v[2] = {&xv[i], &zv[i]};
        int64_t row = (int64_t)i / C;
        for (int t = 0; t < 2; t++) {
            int k = special ? (int)((i + 3 * (size_t)t) % 7) : 6;
            uint32_t u;
            if (k == 0 && row % 3 == 1)
                u = nans[(i / 7 + (size_t)t) % 6], memcpy(v[t], &u, 4);
            else if (k == 1 && row % 3 == 1)
                *v[t] = (i / 7) % 2 ? -INFINITY : INFINITY;
            else if (k == 2)
                *v[t] = (i / 7) % 2 ? -0.0f : 0.0f;
            else if (k == 3 && row % 5 == 2) /* subnormal operands */
                u = (uint32_t)(rnext(&r) % 0x007fffffu) + 1u, memcpy(v[t], &u, 4);
            else if (k == 4 && row % 5 == 3) /* products underflow */
                *v[t] = (float)((runi(&r) - 0.5) * 1e-20);
            else
                *v[t] = (float)((runi(&r) - 0.5) * 8.0);
        }
    }
    for (int64_t i = 0; i < R; i++)
        rv[i] = i % 4 == 1 ? -0.0f : (float)(i % 9) - 4.0f;
    for (int64_t j = 0; j < C; j++)
        cv[j] = j % 11 == 5 ? NAN : (float)(j % 7) * 0.25f - 0.75f;
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *z = nt_from_host(zv, NT_F32, 2, (int64_t[]){R, C});
    nt_tensor *rb = nt_from_host(rv, NT_F32, 2, (int64_t[]){R, 1});
    nt_tensor *cb = nt_from_host(cv, NT_F32, 2, (int64_t[]){1, C});
    const char *levels[] = {"scalar", "avx2", "avx512"}, *threads[] = {"1", "2"};
    for (int p = 0; p < 4; p++) {
        assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
        nt_tensor *y = chain_prog(p, x, z, rb, cb);
        assert_int_equal(nt_to_host(y, ref, n * 4), 0);
        nt_release(y);
        for (int l = 0; l < 3; l++)
            for (int t = 0; t < 2; t++)
                for (int route = 0; route < 6; route++) {
                    if (nt_config_set("NT_CPU_ISA", levels[l]) != 0)
                        continue; /* this CPU does not run it */
                    assert_int_equal(nt_config_set("NT_CPU_THREADS", threads[t]), 0);
                    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
                    /* route % 3 == 0: chains; 1: per-op passes; 2: those,
                     * tested (0 and 1 never switch to the tested passes);
                     * route / 3: assists costly (0) or cheap (1) */
                    nt__fused_cpu_set_routes(route % 3 == 0, route % 3 == 2 ? 1 : -1);
                    nt__sn_set_assists(route / 3);
                    uint64_t c0, r0, c1, r1;
                    nt__fused_cpu_route_counts(&c0, &r0);
                    nt_stats_reset();
                    y = chain_prog(p, x, z, rb, cb);
                    assert_int_equal(nt_to_host(y, got, n * 4), 0);
                    nt_release(y);
                    nt__fused_cpu_route_counts(&c1, &r1);
                    *chunks += c1 - c0, *redone += r1 - r0;
                    if (route % 3)
                        assert_true(c1 == c0); /* the chain route was off */
                    if (route / 3)
                        assert_true(r1 == r0); /* no FTZ run to redo */
                    nt_stats st;
                    nt_stats_get(&st);
                    assert_int_equal(st.fusion_groups, 1);
                    if (memcmp(got, ref, n * 4))
                        fail_msg("chain %d differs at %s, %s thread(s), route %d", p, levels[l],
                                 threads[t], route);
                }
    }
    nt__fused_cpu_set_routes(true, 0);
    nt__sn_set_assists(-1);
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    nt_release(x), nt_release(z), nt_release(rb), nt_release(cb);
    free(xv), free(zv), free(rv), free(cv), free(ref), free(got);
}

static void test_fused_chain_registers_bitwise(void **state)
{
    (void)state;
    uint64_t chunks = 0, redone = 0;
    chain_case(1, 3 * 65536 + 77, false, &chunks, &redone); /* spans on both threads */
    chain_case(37, 1031, true, &chunks, &redone);
    chain_case(3, 65536 + 333, true, &chunks, &redone);
    if (nt_config_set("NT_CPU_ISA", "avx512") == 0) {
        /* the route ran, and so did its exact redo */
        assert_true(chunks > 0 && redone > 0);
        assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    }
}

/* ---------------- AdamW's update as one loop ----------------
 *
 * cpu/fused.c runs the program nt_optim_step records for AdamW as one
 * AVX-512 loop (opt_try).  A parameter trained for four steps, its gradient
 * the weight gradient of a matmul (the update is the matmul's epilogue) or
 * an input (the update alone), with and without weight decay, in f32 and
 * under bf16 autocast (the gradient widened from bf16, the parameter also
 * cast for the next forward), on NaNs of both signs with payloads,
 * infinities, signed zeros, subnormals, products that underflow and
 * overflow, and plain values, over a masked tail and over spans on both
 * threads: the route == the per-op passes == eager mode, bit for bit, at
 * every ISA level and 1 and 2 threads, and the route ran where AVX-512
 * does. */
/* finite: no NaN, no infinity, nothing whose square overflows (through a
 * matmul one would reach whole rows of the gradient) */
static float adam_special(rng *r, size_t i, int salt, bool finite)
{
    static const uint32_t nans[4] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u};
    uint32_t u;
    float f;
    int k = (int)((i * 7 + (size_t)salt) % 41);
    if (finite && (k == 0 || k == 1 || k == 5))
        k = 2 + (int)(i % 2) * 2; /* a signed zero or a product that underflows */
    switch (k) {
    case 0: u = nans[(i / 41) % 4]; memcpy(&f, &u, 4); return f;
    case 1: return (i / 41) % 2 ? -INFINITY : INFINITY;
    case 2: return (i / 41) % 2 ? -0.0f : 0.0f;
    case 3: u = (uint32_t)(rnext(r) % 0x007fffffu) + 1u; memcpy(&f, &u, 4); return f;
    case 4: return (float)((runi(r) - 0.5) * 1e-21); /* g * g underflows */
    case 5: return (float)((runi(r) - 0.5) * 1e21);  /* g * g overflows */
    case 6: return (float)((runi(r) - 0.5) * 1e-36);
    default: return (float)((runi(r) - 0.5) * 2.0);
    }
}

/* Four steps of AdamW on w [R, C] (wv, updated in place); B rows of x for
 * the matmul. */
/* The AdamW route tests' configuration: ISA level lv (scalar, avx2,
 * avx512), th + 1 threads, mode; route % 2 == 1 turns the one-loop route off
 * (the per-op passes), route / 2 makes subnormal assists cheap; no switch to
 * the per-op passes after a subnormal operand.  False: this CPU does not run
 * that level. */
static const char *const adam_levels[] = {"scalar", "avx2", "avx512"};
static const char *const adam_threads[] = {"1", "2"};
static bool adam_route_setup(int lv, int th, int route, const char *mode)
{
    if (nt_config_set("NT_CPU_ISA", adam_levels[lv]) != 0)
        return false;
    assert_int_equal(nt_config_set("NT_CPU_THREADS", adam_threads[th]), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    nt__fused_cpu_set_optim_route(route % 2 == 0);
    nt__sn_set_assists(route / 2);
    nt__fused_cpu_set_routes(true, -1);
    return true;
}

/* Back to the defaults adam_route_setup moved away from. */
static void adam_route_reset(void)
{
    nt__fused_cpu_set_optim_route(true);
    nt__fused_cpu_set_routes(true, 0);
    nt__sn_set_assists(-1);
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

static void adam_train(float *wv, int64_t R, int64_t C, bool mm, bool amp, bool wd,
                       const float *xv, const float *tv, const float *gv, int64_t B,
                       const char *ckpt)
{
    nt_tensor *w = nt_from_host(wv, NT_F32, 2, (int64_t[]){R, C});
    assert_non_null(w);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){B, C});
    nt_tensor *t = nt_from_host(tv, NT_F32, 2, (int64_t[]){B, R});
    nt_tensor *gt = nt_from_host(gv, NT_F32, 2, (int64_t[]){R, C});
    nt_optim *o = nt_optim_adamw(&w, 1, 1e-2, 0.9, 0.999, 1e-8, wd ? 0.05 : 0.0);
    assert_non_null(o);
    for (int s = 0; s < 4; s++) {
        nt_scope *sc = nt_scope_begin();
        if (amp)
            assert_int_equal(nt_autocast_begin(NT_BF16), 0);
        /* z * z: the gradient depends on the forward's cast of w, which
         * the previous update made ahead under autocast */
        nt_tensor *z = mm ? nt_matmul(x, nt_transpose(w, 0, 1)) : NULL;
        nt_tensor *y = mm ? nt_mul(nt_mul(z, z), t) : nt_mul(w, gt);
        if (amp)
            assert_int_equal(nt_autocast_end(), 0);
        assert_int_equal(nt_backward(nt_sum(y, NT_DIM_ALL, false)), 0);
        if (!mm) /* the gradient an input of the update's program */
            assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_optim_step(o), 0);
        assert_int_equal(nt_optim_zero_grad(o), 0);
        nt_scope_end(sc);
    }
    assert_int_equal(nt_to_host(w, wv, sizeof(float) * (size_t)(R * C)), 0);
    assert_int_equal(nt_save(ckpt, &w, 1, o), 0); /* m and v too, as stored */
    nt_optim_destroy(o);
    nt_release(w), nt_release(x), nt_release(t), nt_release(gt);
}

/* The route's runs in this case (0 where AVX-512 does not run): runs[0]
 * with subnormal assists taken as costly (FTZ blocks, redone where tiny),
 * runs[1] as cheap (each block once, IEEE), and of those the spans stored
 * straight to the outputs. */
static void adam_case(int64_t R, int64_t C, int64_t B, bool mm, bool amp, bool wd,
                      uint64_t runs[2], uint64_t *redone, uint64_t *direct)
{
    runs[0] = runs[1] = 0;
    const size_t n = (size_t)(R * C);
    float *w0 = malloc(n * 4), *ref = malloc(n * 4), *got = malloc(n * 4), *gv = malloc(n * 4);
    float *xv = malloc((size_t)(B * C) * 4), *tv = malloc((size_t)(B * R) * 4);
    rng r = {977 + (uint64_t)mm * 2 + (uint64_t)amp * 4 + (uint64_t)wd};
    /* through the matmul a NaN or infinity in w or x would reach every
     * gradient: there they are finite, and t's few reach rows of it */
    for (size_t i = 0; i < n; i++)
        w0[i] = adam_special(&r, i, 3, mm), gv[i] = adam_special(&r, i, 0, false);
    for (size_t i = 0; i < (size_t)(B * C); i++)
        xv[i] = adam_special(&r, i, 1, true);
    for (size_t i = 0; i < (size_t)(B * R); i++)
        tv[i] = i % 101 == 4 ? adam_special(&r, i / 101, 0, false)
                             : (float)((runi(&r) - 0.5) * 2.0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    char *pref = g_strdup_printf("%s/nt_adam_%d_ref.ckpt", g_get_tmp_dir(), (int)getpid());
    char *pgot = g_strdup_printf("%s/nt_adam_%d_got.ckpt", g_get_tmp_dir(), (int)getpid());
    memcpy(ref, w0, n * 4);
    adam_train(ref, R, C, mm, amp, wd, xv, tv, gv, B, pref);
    gchar *cref, *cgot;
    gsize lref, lgot;
    assert_true(g_file_get_contents(pref, &cref, &lref, NULL));
    for (int l = 0; l < 3; l++)
        for (int th = 0; th < 2; th++)
            for (int route = 0; route < 4; route++) {
                if (!adam_route_setup(l, th, route, "lazy"))
                    continue; /* this CPU does not run it */
                const int as = route / 2;
                uint64_t c0, c1, r0, r1, d0, d1;
                nt__fused_cpu_optim_counts(&c0, &r0, &d0);
                memcpy(got, w0, n * 4);
                adam_train(got, R, C, mm, amp, wd, xv, tv, gv, B, pgot);
                assert_true(g_file_get_contents(pgot, &cgot, &lgot, NULL));
                if (lgot != lref || memcmp(cgot, cref, lref))
                    fail_msg("adamw (mm %d, amp %d, wd %d): m or v differ at %s, %s thread(s), "
                             "route %d", mm, amp, wd, adam_levels[l], adam_threads[th], route);
                g_free(cgot);
                nt__fused_cpu_optim_counts(&c1, &r1, &d1);
                if (route % 2)
                    assert_true(c1 == c0); /* the route was off */
                if (as)
                    assert_true(r1 == r0); /* no FTZ block to redo */
                else
                    assert_true(d1 == d0); /* FTZ blocks wait in the buffer */
                runs[as] += c1 - c0;
                *redone += r1 - r0, *direct += d1 - d0;
                if (memcmp(got, ref, n * 4)) {
                    size_t i = 0;
                    while (!memcmp(&got[i], &ref[i], 4))
                        i++;
                    fail_msg("adamw (mm %d, amp %d, wd %d) differs at %s, %s thread(s), route %d: "
                             "element %zu %a, eager %a",
                             mm, amp, wd, adam_levels[l], adam_threads[th], route, i, got[i],
                             ref[i]);
                }
            }
    adam_route_reset();
    g_free(cref);
    remove(pref), remove(pgot);
    g_free(pref), g_free(pgot);
    free(w0), free(ref), free(got), free(gv), free(xv), free(tv);
}

static void test_fused_adamw_route_bitwise(void **state)
{
    (void)state;
    bool avx512 = nt_config_set("NT_CPU_ISA", "avx512") == 0;
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    uint64_t redone = 0, direct = 0, runs[2];
    for (int c = 0; c < 8; c++) {
        bool mm = c & 1, amp = c & 2, wd = c & 4;
        /* the first step's update is another program (m and v are fills), and
         * a later one may take the next forward's op along: not this route;
         * but each case takes it at least once where AVX-512 runs, with
         * assists costly and cheap */
        adam_case(37, 1031, 8, mm, amp, wd, runs, &redone, &direct); /* a masked tail */
        if (avx512 && (!runs[0] || !runs[1]))
            fail_msg("adamw (mm %d, amp %d, wd %d) never took the route (%d %d)", mm, amp, wd,
                     (int)runs[0], (int)runs[1]);
        if (c == 1 || c == 6) { /* spans on both threads */
            adam_case(129, 1537, 4, mm, amp, wd, runs, &redone, &direct);
            if (avx512 && (!runs[0] || !runs[1]))
                fail_msg("adamw (mm %d, amp %d, wd %d), 129 x 1537, never took the route", mm,
                         amp, wd);
        }
    }
    /* tiny results (g * g of 1e-21) were flushed, and those blocks redone;
     * with cheap assists, blocks were stored straight to m, v and w */
    if (avx512)
        assert_true(redone > 0 && direct > 0);
}

/* The same update in a captured step under bf16 autocast: there the
 * parameter's cast for the next forward is a copy into the storage the
 * captured forward reads (autograd/optim.c, ampcap_write), not a cast op.
 * One step op by op, one captured, three replays, on a linear layer's
 * weight (its gradient the matmul's value; 37 x 1031, a masked tail) with
 * weight decay: at every ISA level, 1 and 2 threads, subnormal assists
 * costly and cheap, route on or off, they give eager mode's bits, and at
 * the AVX-512 level with the route on every replay takes it;
 * the bf16 cast the forward reads included (the loss after each replay
 * depends on it). */
static void adam_cap_run(float *wv, nt_tensor *x, nt_tensor *t, int64_t R, int64_t C,
                         bool capture, float losses[5], const char *ckpt, uint64_t *replay_runs)
{
    nt_tensor *w = nt_from_host(wv, NT_F32, 2, (int64_t[]){R, C});
    assert_non_null(w);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    nt_optim *o = nt_optim_adamw(&w, 1, 1e-2, 0.9, 0.999, 1e-8, 0.05);
    assert_non_null(o);
    nt_graph *g = NULL;
    nt_tensor *kept = NULL;
    for (int s = 0; s < 5; s++) {
        uint64_t c0 = 0, c1 = 0, r, d;
        if (capture && s >= 2) {
            nt__fused_cpu_optim_counts(&c0, &r, &d);
            assert_int_equal(nt_graph_replay(g), 0);
        } else {
            if (capture && s == 1)
                assert_int_equal(nt_graph_capture_begin(), 0);
            nt_scope *sc = nt_scope_begin();
            assert_int_equal(nt_autocast_begin(NT_BF16), 0);
            nt_tensor *z = nt_matmul(x, nt_transpose(w, 0, 1));
            nt_tensor *y = nt_mul(nt_mul(z, z), t);
            assert_int_equal(nt_autocast_end(), 0);
            nt_tensor *loss = nt_sum(y, NT_DIM_ALL, false);
            assert_int_equal(nt_backward(loss), 0);
            assert_int_equal(nt_optim_step(o), 0);
            assert_int_equal(nt_optim_zero_grad(o), 0);
            nt_release(kept);
            kept = nt_keep(loss);
            nt_scope_end(sc);
            if (capture && s == 1)
                assert_non_null(g = nt_graph_capture_end());
        }
        double l;
        assert_int_equal(nt_item(kept, &l), 0); /* waits for the step or the replay */
        losses[s] = (float)l;
        if (capture && s >= 2) {
            nt__fused_cpu_optim_counts(&c1, &r, &d);
            *replay_runs += c1 - c0;
        }
    }
    assert_int_equal(nt_to_host(w, wv, sizeof(float) * (size_t)(R * C)), 0);
    assert_int_equal(nt_save(ckpt, &w, 1, o), 0);
    nt_graph_destroy(g);
    nt_release(kept);
    nt_optim_destroy(o);
    nt_release(w);
}

static void test_fused_adamw_route_captured_amp(void **state)
{
    (void)state;
    const int64_t R = 37, C = 1031, B = 8;
    const size_t n = (size_t)(R * C);
    float *w0 = malloc(n * 4), *ref = malloc(n * 4), *got = malloc(n * 4);
    float *xv = malloc((size_t)(B * C) * 4), *tv = malloc((size_t)(B * R) * 4);
    rng r = {4242};
    for (size_t i = 0; i < n; i++)
        w0[i] = adam_special(&r, i, 3, true);
    for (size_t i = 0; i < (size_t)(B * C); i++)
        xv[i] = adam_special(&r, i, 1, true);
    for (size_t i = 0; i < (size_t)(B * R); i++)
        tv[i] = (float)((runi(&r) - 0.5) * 2.0);
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){B, C});
    nt_tensor *t = nt_from_host(tv, NT_F32, 2, (int64_t[]){B, R});
    char *pref = g_strdup_printf("%s/nt_adamcap_%d_ref.ckpt", g_get_tmp_dir(), (int)getpid());
    char *pgot = g_strdup_printf("%s/nt_adamcap_%d_got.ckpt", g_get_tmp_dir(), (int)getpid());
    float lref[5], lgot[5];
    uint64_t unused = 0;
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    memcpy(ref, w0, n * 4);
    adam_cap_run(ref, x, t, R, C, false, lref, pref, &unused);
    gchar *cref, *cgot;
    gsize nref, ngot;
    assert_true(g_file_get_contents(pref, &cref, &nref, NULL));
    for (int lv = 0; lv < 3; lv++)
        for (int th = 0; th < 2; th++)
            for (int route = 0; route < 4; route++) {
                if (!adam_route_setup(lv, th, route, "adaptive"))
                    continue; /* this CPU does not run it */
                uint64_t runs = 0;
                memcpy(got, w0, n * 4);
                adam_cap_run(got, x, t, R, C, true, lgot, pgot, &runs);
                if (memcmp(lgot, lref, sizeof lref))
                    fail_msg("captured adamw under bf16: the losses differ from eager's, %s, %s "
                             "thread(s), route %d", adam_levels[lv], adam_threads[th], route);
                if (memcmp(got, ref, n * 4))
                    fail_msg("captured adamw under bf16: w differs from eager's, %s, %s "
                             "thread(s), route %d", adam_levels[lv], adam_threads[th], route);
                assert_true(g_file_get_contents(pgot, &cgot, &ngot, NULL));
                if (ngot != nref || memcmp(cgot, cref, nref))
                    fail_msg("captured adamw under bf16: m or v differ from eager's, %s, %s "
                             "thread(s), route %d", adam_levels[lv], adam_threads[th], route);
                g_free(cgot);
                /* each of the three replays' updates took the route where it is
                 * on (the AVX-512 level only) */
                if (route % 2 || lv != 2)
                    assert_true(runs == 0);
                else if (runs < 3)
                    fail_msg("captured adamw under bf16: %d of 3 replays took the route (%s "
                             "thread(s), assists %s)",
                             (int)runs, adam_threads[th], route / 2 ? "cheap" : "costly");
            }
    adam_route_reset();
    g_free(cref);
    remove(pref), remove(pgot);
    g_free(pref), g_free(pgot);
    nt_release(x), nt_release(t);
    free(w0), free(ref), free(got), free(xv), free(tv);
}

/* The measurement of cpu/subnormal.c: a ratio where AVX-512 runs (a
 * subnormal case is never much faster than its normal twin), the verdict
 * the ratio's, and a forced verdict obeyed and undone. */
static void test_subnormal_assist_probe(void **state)
{
    (void)state;
    double r = nt__sn_assist_ratio();
    bool avx512 = nt_config_set("NT_CPU_ISA", "avx512") == 0;
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    if (avx512)
        assert_true(r > 0.5);
    else
        assert_true(r == 0.0 && !nt__sn_assists_cheap());
    nt__sn_set_assists(1);
    assert_true(nt__sn_assists_cheap());
    nt__sn_set_assists(0);
    assert_false(nt__sn_assists_cheap());
    nt__sn_set_assists(-1);
    assert_true(nt__sn_assists_cheap() == (avx512 && r <= 6.0));
}

/* Iteration dims merged (cpu/fused.c, coalesce_dims): operands that step
 * through some adjacent dims as one and not others -- channel rows
 * [C, N, 1, H, W] permuted to [N, C, 1, H, W] (H and W merge, N and C do
 * not; the size-1 dim drops), a per-channel [1, C, 1, 1, 1] operand, a
 * contiguous one, a bf16 cast -- on NaNs, infinities and signed zeros, and
 * the [2, 3, 1, 1, 1] shape (all but two dims of size 1): lazy (fused, in
 * fewer kernels than ops) == deterministic (unfused), bit for bit. */
static void coalesce_case(int64_t N, int64_t C, int64_t H, int64_t W)
{
    int64_t n = N * C * H * W;
    float *rv = malloc(sizeof(float) * (size_t)n), *zv = malloc(sizeof(float) * (size_t)n);
    float wv[64];
    static const float edge[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 3.0f};
    for (int64_t i = 0; i < n; i++) {
        rv[i] = i % 97 < 8 ? edge[i % 97] : sinf((float)i * 0.37f) * 4.0f;
        zv[i] = cosf((float)i * 0.11f);
    }
    for (int64_t c = 0; c < C; c++)
        wv[c] = c == 1 ? -0.0f : 0.5f + (float)c;
    uint32_t *got[2];
    for (int m = 0; m < 2; m++) {
        nt_config_set("NT_MODE", m ? "lazy" : "deterministic");
        nt_scope *s = nt_scope_begin();
        nt_tensor *rows = nt_from_host(rv, NT_F32, 5, (int64_t[]){C, N, 1, H, W});
        nt_tensor *w = nt_from_host(wv, NT_F32, 5, (int64_t[]){1, C, 1, 1, 1});
        nt_tensor *z = nt_from_host(zv, NT_F32, 5, (int64_t[]){N, C, 1, H, W});
        nt_stats a, b;
        nt_stats_get(&a);
        nt_tensor *p = nt_permute(rows, (int[]){1, 0, 2, 3, 4});
        nt_tensor *y = nt_sub(nt_mul_scalar(nt_add(nt_mul(p, w), z), 0.5), p);
        nt_tensor *yb = nt_cast(nt_mul(y, p), NT_BF16);
        got[m] = malloc(sizeof(uint32_t) * (size_t)n + sizeof(uint16_t) * (size_t)n);
        assert_int_equal(nt_to_host(y, got[m], sizeof(float) * (size_t)n), 0);
        assert_int_equal(nt_to_host(yb, got[m] + n, sizeof(uint16_t) * (size_t)n), 0);
        nt_stats_get(&b);
        if (m && n > 1000)
            assert_true(b.kernels_launched - a.kernels_launched < 5);
        nt_scope_end(s);
    }
    assert_memory_equal(got[0], got[1], sizeof(uint32_t) * (size_t)n + sizeof(uint16_t) * (size_t)n);
    free(got[0]), free(got[1]), free(rv), free(zv);
}

static void test_coalesced_dims_bitwise(void **state)
{
    (void)state;
    coalesce_case(16, 5, 28, 28);
    coalesce_case(3, 7, 1, 33);
    coalesce_case(2, 3, 1, 1);
}

/* ---------------- fp8 chains ----------------
 *
 * Random chains of f32 elementwise ops with casts to e4m3 / e5m2 and back
 * in between (round to nearest even by nt_cast, stochastic by nt_cast_sr,
 * from f32 or bf16), some fp8 values read back as bytes: fused (lazy,
 * adaptive, short windows) against op by op (eager, NT_FUSION=0) and the
 * CPU's deterministic run, bit for bit, on both backends.  The values span
 * fp8's range: subnormals, the saturation and overflow edges, +-Inf, NaN. */
enum { F8_R = 5, F8_C = 37, F8_STEPS = 14 };

static nt_tensor *fp8_step(rng *r, nt_tensor *x, nt_tensor *other)
{
    static const nt_dtype f8[2] = {NT_E4M3, NT_E5M2};
    nt_dtype d = f8[rint_(r, 2)];
    switch (rint_(r, 10)) {
    case 0: return nt_mul_scalar(x, ldexp(1.0, rint_(r, 17) - 8) * (rint_(r, 2) ? 1 : -1.3));
    case 1: return nt_add_scalar(x, runi(r) * 4 - 2);
    case 2: return nt_tanh(x);
    case 3: return nt_exp(nt_mul_scalar(x, 0.25));
    case 4: return rint_(r, 2) ? nt_add(x, other) : nt_mul(x, other);
    case 5:
    case 6: return nt_cast(nt_cast(x, d), NT_F32);
    case 7:
    case 8: return nt_cast(nt_cast_sr(x, d), NT_F32);
    default: /* through bf16 first (fp8 casts from bf16 too) */
        return nt_cast(nt_cast(rint_(r, 2) ? nt_cast_sr(nt_cast(x, NT_BF16), d)
                                           : nt_cast(nt_cast(x, NT_BF16), d),
                               NT_BF16),
                       NT_F32);
    }
}

/* One chain (seed), its kept values' bytes appended to out. */
static void fp8_chain(uint64_t seed, GByteArray *out)
{
    rng r = {seed * 0x2545f4914f6cdd1dull + 1};
    nt_scope *sc = nt_scope_begin();
    float h[F8_R * F8_C];
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 61440.0f,
                               57344.0f, 0x1p-9f, 0x1p-10f, 0x1.8p-17f, 0x1p-16f, 240.0f};
    for (int k = 0; k < F8_R * F8_C; k++) {
        h[k] = (float)((runi(&r) * 2 - 1) * ldexp(1.0, rint_(&r, 36) - 20));
        if (rint_(&r, 9) == 0)
            h[k] = sp[rint_(&r, (int)(sizeof sp / sizeof sp[0]))];
    }
    int64_t sh[2] = {F8_R, F8_C};
    nt_tensor *x = nt_from_host(h, NT_F32, 2, sh);
    nt_tensor *o = nt_mul_scalar(x, -0.75);
    nt_tensor *keep[2 * F8_STEPS + 1];
    int nk = 0;
    for (int k = 0; k < F8_STEPS; k++) {
        x = fp8_step(&r, x, rint_(&r, 3) ? o : nt_transpose(nt_transpose(o, 0, 1), 0, 1));
        assert_non_null(x);
        if (rint_(&r, 5) == 0) /* an fp8 value itself, read as bytes */
            keep[nk++] = nt_cast(x, rint_(&r, 2) ? NT_E4M3 : NT_E5M2);
        if (rint_(&r, 6) == 0)
            keep[nk++] = x;
    }
    keep[nk++] = x;
    for (int k = 0; k < nk; k++) {
        nt_tensor *t = nt_contiguous(keep[k]);
        size_t nb = (size_t)nt_numel(t) * nt_dtype_size(nt_dtype_of(t));
        uint8_t *b = malloc(nb);
        assert_int_equal(nt_to_host(t, b, nb), 0);
        g_byte_array_append(out, b, (guint)nb);
        free(b);
    }
    assert_int_equal(nt_scope_end(sc), 0);
}

/* One run of chain `seed` in a fresh runtime: a stochastic rounding's bits
 * depend on its record's sequence number (nt__rec_sr_key), so every run
 * numbers its records from the start, as test_fp8.c's program runs do.
 * cfg: NULL is the CPU's deterministic reference. */
static void fp8_run(uint64_t seed, const char *backend, const config *cfg, GByteArray *out)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    nt_config_set("NT_SR_SEED", "4242");
    nt_config_set("NT_BACKEND", backend);
    if (cfg)
        apply(cfg);
    else {
        nt_config_set("NT_MODE", "deterministic");
        nt_config_set("NT_FUSION", "1");
    }
    fp8_chain(seed, out);
}

/* The move back of an elementwise record to its producer (fusion/plan.c
 * pull_one) leaves a record where it is when it could not join the
 * producer's group in its own shape: |v| of a copy's output v read
 * reshaped (the copy that makes a permuted attention output [B, T, H, hd]
 * contiguous, read as [B, T, D] by an fp8 rounding pass for its amax).
 * Moved next to the copy it met a "shape change" and ran as a kernel of
 * its own; left in place it joins its row reduction.  io[0] t [2, 4, 3, 5],
 * io[1] o [5]; results io[2], io[3]; io[4] names the mode ("capture": lazy,
 * recorded with nt_graph_capture_begin). */
static void pull_body(void *arg)
{
    nt_tensor **io = arg;
    const char *mode = (const char *)io[4];
    bool cap = !strcmp(mode, "capture");
    nt_config_set("NT_MODE", cap ? "lazy" : mode);
    if (cap)
        assert_int_equal(nt_graph_capture_begin(), 0);
    nt_scope *s = nt_scope_begin();
    nt_tensor *v = nt_reshape(nt_permute(io[0], (int[]){0, 2, 1, 3}), 3, (int64_t[]){2, 3, 20});
    io[2] = nt_keep(nt_add_scalar(io[1], 2.0)); /* another shape: ends the copy's kernel */
    io[3] = nt_keep(nt_max(nt_abs(v), 2, true));
    nt_scope_end(s);
    if (cap) {
        nt_graph *gr = nt_graph_capture_end();
        assert_non_null(gr);
        nt_graph_destroy(gr);
    }
    nt_sync();
    nt_config_set("NT_MODE", "adaptive");
}

static void test_pull_keeps_shape(void **state)
{
    (void)state;
    static const char *be[2] = {"cpu", "sim"};
    static const char *modes[4] = {"deterministic", "eager", "lazy", "capture"};
    static const size_t nel[2] = {5, 6};
    float want[2][6], got[6];
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 4; m++) {
            assert_int_equal(nt_config_set("NT_BACKEND", be[b]), 0);
            nt_tensor *io[5] = {nt_randn(NT_F32, 4, (int64_t[]){2, 4, 3, 5}, 33),
                                nt_randn(NT_F32, 1, (int64_t[]){5}, 34)};
            io[4] = (nt_tensor *)modes[m];
            nt_sync();
            char *log = nt_test_fusion_log(pull_body, io);
            if (m >= 2 && !strstr(log, "row, 2 ops [abs")) { /* planned whole */
                fputs(log, stdout);
                fail_msg("%s %s: |v| left its row reduction (the log above)", be[b], modes[m]);
            }
            free(log);
            for (int k = 0; k < 2; k++) {
                nt_tensor *t = io[2 + k];
                assert_non_null(t);
                float *dst = b == 0 && m == 0 ? want[k] : got;
                assert_int_equal(nt_to_host(t, dst, nel[k] * sizeof(float)), 0);
                if (dst == got && memcmp(got, want[k], nel[k] * sizeof(float)))
                    fail_msg("%s %s: result %d differs from cpu deterministic", be[b], modes[m], k);
                nt_release(t);
            }
            nt_release(io[0]);
            nt_release(io[1]);
        }
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0); /* setup's */
}

static void test_fp8_chains_bitwise(void **state)
{
    (void)state;
    static const char *be[2] = {"cpu", "sim"};
    int n = nprograms(60), runs = 0;
    nt_stats st;
    uint64_t fused = 0;
    for (int seed = 1; seed <= n; seed++) {
        GByteArray *ref = g_byte_array_new();
        fp8_run((uint64_t)seed, "cpu", NULL, ref);
        for (int b = 0; b < 2; b++)
            for (size_t c = 0; c <= sizeof configs / sizeof configs[0]; c++) {
                bool det = c == sizeof configs / sizeof configs[0];
                if ((det && b == 0) || (b == 1 && seed % 3 && c != 0 && c != 2 && !det))
                    continue; /* the simulator: eager, lazy and deterministic for most */
                GByteArray *got = g_byte_array_new();
                fp8_run((uint64_t)seed, be[b], det ? NULL : &configs[c], got);
                nt_stats_get(&st);
                fused += st.fused_ops;
                if (got->len != ref->len || memcmp(got->data, ref->data, ref->len)) {
                    print_error("fp8 chain seed %d differs in config %s on the %s backend\n",
                                seed, det ? "deterministic" : configs[c].name, be[b]);
                    first_diff(ref, got);
                    fail();
                }
                g_byte_array_unref(got);
                runs++;
            }
        g_byte_array_unref(ref);
    }
    print_message("# fp8 chains: %d chains, %d runs (%llu ops fused) against the CPU's "
                  "deterministic bits\n", n, runs, (unsigned long long)fused);
    assert_true(fused > 0);
    nt_config_set("NT_BACKEND", "cpu");
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_LAZY_WINDOW", "4096");
    nt_config_set("NT_FUSION", "1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_many_live_outputs, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_differential, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_differential_sim, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_print_invariance, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_transformer_block_every_mode, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_ew_chain_one_kernel, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_adaptive_gathers_burst, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_elided_values_take_no_memory, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_view_read_only_in_kernel_elided, setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_amp_weight_grad_not_written, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sim_copy_stores_source, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_cpu_spans_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_isa_levels_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_subnormal_f64_route, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_subnormal_fused_isa, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_regs_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_row_tiles_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_nan_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_stream_direct_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_plan_order_unchanged, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_chain_registers_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_adamw_route_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_adamw_route_captured_amp, setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_subnormal_assist_probe, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_capacity_cut_keeps_read_values, setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_softmax_primitives_one_row_kernel, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul_epilogue, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_liveness_reasons, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_break_reasons, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_break_sbuf_capacity, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_break_view_hazards, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_kernel_cache, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_cache_key_int_params, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_op_limit, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_coalesced_dims_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fp8_chains_bitwise, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_pull_keeps_shape, setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
