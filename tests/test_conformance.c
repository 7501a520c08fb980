/* tests/test_conformance.c - every op of the table, on every backend and
 * mode, in the spirit of ggml's test-backend-ops.
 *
 * One test per op id of core/optable.h (the list is built from NT_OP_COUNT
 * at run time, so a new op gets its test without an edit here).  Each op is
 * driven by its kind: the elementwise kinds through the dispatcher's
 * generic entry points (nt__unary, nt__scalar, nt__binary), the others by a
 * per-op case below.  An op whose kind or case has no driver fails, naming
 * the op: nothing can be added to the table without being run here.
 *
 * Checks per op (a cell of the coverage table printed at the end):
 *   sim=cpu       the simulator (NT_REQUIRE_SIM=1, no CPU fallback) gives
 *                 the CPU's bits, deterministic mode, f32 and bf16 inputs
 *   fused=unfused a chain x*1 -> op -> *2 in lazy mode (fused) against
 *                 eager with NT_FUSION=0, on both backends, bit for bit
 *   det=adaptive  the same chain, deterministic against adaptive
 *   gradcheck     nt_gradcheck on every NT_OPF_DIFF op (CPU)
 *   autocast      the result dtype in nt_autocast_begin(NT_BF16) is the one
 *                 the amp column says (LOW: bf16 from f32; F32: f32 from
 *                 bf16; KEEP: bf16 stays bf16)
 *   int           the ints column: INT/INTONLY ops give an integer result
 *                 from i32 and u8 inputs (sim == cpu), F32INT ones f32,
 *                 INTONLY ones refuse floats and FLOAT ones refuse integers
 *                 with NT_EDTYPE naming the function
 *   reference     the new ops against a double-precision host formula over
 *                 a sweep: max ulp within the bound stated in ref_of
 *   gradcheck f64 nt_gradcheck with f64 inputs (the whole check in double)
 *                 at PyTorch's double tolerances (NT_GRADCHECK_F64_*) on
 *                 every NT_OPF_DIFF op that takes f64 (docs/ops.md "Dtypes"
 *                 lists them; the others refuse f64 with NT_ENOTSUP: n/a)
 *   fp8           the ops that take e4m3 / e5m2 on fp8 data (sim=cpu, every
 *                 mode, captured and replayed on other values -- also noted
 *                 in the captured column --, fused=unfused, an exact
 *                 reference), the others' refusal (NT_ENOTSUP naming the
 *                 function): see "fp8" below
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "core/internal.h"
#include "core/ewise64.h"
#include "autograd/autograd.h"
#include "cpu/cpu.h"
#include "dispatcher/dispatch.h"
#include "nt_test.h"

enum { K_SIM, K_FUSE, K_MODES, K_CAPT, K_GRAD, K_AMP, K_INT, K_REF, K_G64, K_FP8, NCHK };
static const char *chk_name[NCHK] = {"sim=cpu", "fused=unfused", "det=adaptive", "captured",
                                     "gradcheck", "autocast", "int", "reference",
                                     "gradcheck f64", "fp8"};
static char cov[NT_OP_COUNT][NCHK][72];
static bool op_failed[NT_OP_COUNT];

static void cell(int op, int k, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static void cell(int op, int k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cov[op][k], sizeof cov[op][k], fmt, ap);
    va_end(ap);
    if (!strncmp(cov[op][k], "FAIL", 4)) {
        op_failed[op] = true;
        print_message("%s %s: %s\n", nt__ops[op].name, chk_name[k], cov[op][k]);
    }
}

static void config(const char *backend, const char *mode, const char *fusion)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(backend, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_FUSION", fusion), 0);
}

/* ---------------- inputs ---------------- */

enum { V_MIXED, V_GRID, V_POS }; /* values: with specials; smooth; positive */

typedef struct {
    int n;                       /* tensor inputs */
    int nd[4];
    int64_t sh[4][2];
    bool has_driver;
} spec;

static void shp(spec *s, int nd, int64_t a, int64_t b)
{
    s->nd[s->n] = nd;
    s->sh[s->n][0] = a;
    s->sh[s->n][1] = b;
    s->n++;
}

/* The inputs each op is driven with. */
static spec spec_of(int op)
{
    spec s = {0};
    s.has_driver = true;
    switch (nt__ops[op].kind) {
    case NT_KIND_FILL: break;
    case NT_KIND_COPY:
    case NT_KIND_UNARY:
    case NT_KIND_SCALAR:
    case NT_KIND_REDUCE: shp(&s, 2, 4, 33); break;
    case NT_KIND_BINARY:
    case NT_KIND_CMP: shp(&s, 2, 4, 33); shp(&s, 1, 33, 0); break;
    case NT_KIND_WHERE:
        shp(&s, 2, 4, 33);
        if (op == NT_OP_WHERE)
            shp(&s, 2, 4, 33);
        break;
    case NT_KIND_ROW:
        shp(&s, 2, 4, 33);
        if (op == NT_OP_LAYER_NORM || op == NT_OP_RMS_NORM)
            shp(&s, 1, 33, 0);
        if (op == NT_OP_LAYER_NORM)
            shp(&s, 1, 33, 0);
        break;
    case NT_KIND_LOSS:
        shp(&s, 2, 4, 33);
        if (op == NT_OP_MSE_LOSS)
            shp(&s, 2, 4, 33);
        break;
    case NT_KIND_MATMUL: shp(&s, 2, 4, 33); shp(&s, 2, 33, 5); break;
    case NT_KIND_GATHER:
    case NT_KIND_BWD:
        shp(&s, 2, 10, 33);
        if (op == NT_OP_SCATTER || op == NT_OP_SCATTER_ADD) /* src */
            shp(&s, 2, 10, 33);
        if (op == NT_OP_CONV_GEMM || op == NT_OP_CONV_WGRAD) /* w [3, 10, 2, 1] */
            shp(&s, 2, 3, 20);
        if (op == NT_OP_BN_FWD || op == NT_OP_BN_BWD) { /* w [5], b [5] */
            shp(&s, 1, 5, 0);
            shp(&s, 1, 5, 0);
        }
        if (op == NT_OP_GMM || op == NT_OP_GMM_WGRAD) /* w [3, 33, 5] */
            shp(&s, 2, 99, 5);
        if (op == NT_OP_GRAD_NORMS) { /* [7], [3, 5], [50, 45] (two blocks) */
            shp(&s, 1, 7, 0);
            shp(&s, 2, 3, 5);
            shp(&s, 2, 50, 45);
        }
        break;
    case NT_KIND_ATTN: /* q [9, 8], k [11, 8], v [11, 6]: no batch dims */
        shp(&s, 2, 9, 8);
        shp(&s, 2, 11, 8);
        shp(&s, 2, 11, 6);
        break;
    case NT_KIND_VIEW:
        shp(&s, 2, 4, 33);
        if (op == NT_OP_CAT)
            shp(&s, 2, 4, 33);
        if (op == NT_OP_CONV2D) /* x [1, 4, 3, 11], w [3, 4, 2, 1], b [3] */
            shp(&s, 2, 3, 8), shp(&s, 1, 3, 0);
        if (op == NT_OP_CONV_TRANSPOSE2D) /* w [4, 3, 2, 1] */
            shp(&s, 2, 4, 6), shp(&s, 1, 3, 0);
        break;
    default: s.has_driver = false; break;
    }
    return s;
}

static float frac(double x) { return (float)(x - floor(x)); }

/* Input i of n elements: floats as described by `v`, integers small and
 * mixed in sign (u8: 0..255). */
static nt_tensor *make_input(const spec *s, int i, nt_dtype dt, int v)
{
    int64_t n = s->sh[i][0] * (s->nd[i] > 1 ? s->sh[i][1] : 1);
    float *h = malloc((size_t)n * sizeof(float));
    int32_t *hi = malloc((size_t)n * sizeof(int32_t));
    static const float specials[] = {0.0f, -0.0f, 25.0f, -30.0f, 1e-3f, -1e-3f, 100.0f, -100.0f,
                                     0.5f, -1.0f, 20.0f, 19.5f, INFINITY, -INFINITY};
    for (int64_t k = 0; k < n; k++) {
        double u = frac((double)(k + 1 + 7 * i) * 0.6180339887);
        float x = (float)(-3.0 + 6.0 * u);
        if (v == V_MIXED && k % 5 == 0)
            x = specials[(k / 5 + (int64_t)i) % (int64_t)(sizeof specials / sizeof specials[0])];
        if (v == V_GRID) {
            /* smooth: |x| >= 0.3 (1/x, x/b stay tame) and away from the
             * scalar driver's kinks */
            float m = (float)(0.3 + 1.7 * frac((double)(k + 1 + 7 * i) * 0.7548776662));
            x = (u < 0.5 ? -m : m) + 0.013f * (float)i;
            const float kinks[] = {0.0f, -0.5f, 1.25f};
            for (int q = 0; q < 3; q++)
                if (fabsf(x - kinks[q]) < 0.05f)
                    x += 0.11f;
        }
        if (v == V_POS)
            x = (float)(0.3 + 1.7 * u) + 0.013f * (float)i;
        h[k] = x;
        hi[k] = dt == NT_U8 ? (int32_t)((k * 37 + 11 * i) % 256) : (int32_t)((k * 37 + 11 * i) % 101) - 50;
    }
    int64_t shape[2] = {s->sh[i][0], s->sh[i][1]};
    nt_tensor *t;
    if (nt__dtype_is_float(dt)) {
        t = nt_from_host(h, NT_F32, s->nd[i], shape);
        if (t && dt != NT_F32)
            t = nt_cast(t, dt);
    } else {
        t = nt_from_host(hi, NT_I32, s->nd[i], shape);
        if (t && dt != NT_I32)
            t = nt_cast(t, dt);
    }
    free(h);
    free(hi);
    return t;
}

/* ---------------- drivers ---------------- */

/* Host data a driver makes (an index, a mask, labels).  While the op is
 * captured (the "captured" column) it is named an input of the capture, so
 * a replay reads it again (docs/graphs.md refuses host data baked in). */
static int capture_aux;

static nt_tensor *host_t(const void *src, nt_dtype dt, int nd, const int64_t *shape)
{
    nt_tensor *t = nt_from_host(src, dt, nd, shape);
    if (t && capture_aux) {
        char nm[16];
        snprintf(nm, sizeof nm, "aux%d", capture_aux++ - 1);
        assert_int_equal(nt_graph_input(t, nm), 0);
    }
    return t;
}

/* gather's index for a [10, 33] input along dim 1: [10, 5], repeats within
 * a row (the backward adds them in order) */
static nt_tensor *gather_index(void)
{
    int32_t ix[50];
    for (int k = 0; k < 50; k++)
        ix[k] = (int32_t)((k * 13 + k / 5) % 33);
    ix[1] = ix[0];
    return host_t(ix, NT_I32, 2, (int64_t[]){10, 5});
}

/* The gradient of x through an embedding (EMBEDDING_BWD: idx repeats, rows
 * add in order) or a gather (INDEX_ADD: repeated indices add in g's
 * order), weighted so every element's share differs.  A new reference:
 * the caller's scope does not own it. */
/* With x requiring grad (the gradcheck column), the gradient of sum(e^2 k)
 * with respect to x itself, by a create_graph pass: a function of x that
 * the op's own backward (double backward) differentiates.  nt_gradcheck's
 * finite differences evaluate it in a no-grad region: the same gradient,
 * by a plain pass with grad mode on for the while. */
static nt_tensor *grad_of_x(nt_tensor *l, nt_tensor *x, bool create)
{
    nt_tensor *g = NULL;
    if (!l || nt_autograd_grad(&l, 1, &x, 1, NULL, true, create, false, &g))
        return NULL;
    return nt_retain(g);
}

static nt_tensor *index_grad(nt_tensor *x, int op)
{
    bool dbl = nt_requires_grad(x), num = !nt_grad_enabled();
    int ng = num ? nt__ag_set_no_grad(0) : 0;
    nt_tensor *w = dbl ? x : nt_detach(x);
    nt_set_requires_grad(w, true);
    int32_t ix[5] = {3, 0, 9, 3, 5};
    bool emb = op == NT_OP_EMBEDDING_BWD;
    int64_t r = emb ? 5 : 10, c = emb ? 33 : 5;
    nt_tensor *e = emb ? nt_embedding(w, host_t(ix, NT_I32, 1, (int64_t[]){5}))
                       : nt_gather(w, 1, gather_index());
    nt_tensor *k = nt_arange(nt_dtype_of(x), 0.0, (double)(r * c) * 0.03, 0.03);
    nt_tensor *l = e ? nt_sum(nt_mul(dbl || num ? nt_mul(e, e) : e,
                                     nt_reshape(k, 2, (int64_t[]){r, c})),
                              NT_DIM_ALL, false)
                     : NULL;
    if (dbl || num) {
        nt_tensor *g = grad_of_x(l, w, dbl);
        if (num) {
            nt__ag_set_no_grad(ng);
            nt_release(w);
        }
        return g;
    }
    if (!l || nt_backward(l))
        return NULL;
    nt_tensor *g = nt_grad(w);
    nt_release(w);
    return g;
}

/* linrec is cumprod's backward: the gradient of sum(cumprod(x, 1) * k) */
static nt_tensor *cumprod_grad(nt_tensor *x)
{
    bool dbl = nt_requires_grad(x), num = !nt_grad_enabled();
    int ng = num ? nt__ag_set_no_grad(0) : 0;
    nt_tensor *w = dbl ? x : nt_detach(x);
    nt_set_requires_grad(w, true);
    nt_tensor *k = nt_arange(nt_dtype_of(x), 0.0, 330 * 0.03, 0.03);
    nt_tensor *y = nt_cumprod(w, 1);
    nt_tensor *l = y ? nt_sum(nt_mul(y, nt_reshape(k, 2, (int64_t[]){10, 33})), NT_DIM_ALL, false)
                     : NULL;
    if (dbl || num) {
        nt_tensor *g = grad_of_x(l, w, dbl);
        if (num) {
            nt__ag_set_no_grad(ng);
            nt_release(w);
        }
        return g;
    }
    if (!l || nt_backward(l))
        return NULL;
    nt_tensor *g = nt_grad(w);
    nt_release(w);
    return g;
}

/* SDPA's fixed u8 mask for the [9, 8] x [11, 8] driver: every row keeps
 * key 0 and a pattern of others */
static nt_tensor *attn_mask(void)
{
    uint8_t m[9 * 11];
    for (int k = 0; k < 99; k++)
        m[k] = k % 11 == 0 || (k * 7) % 5 != 2;
    return host_t(m, NT_U8, 2, (int64_t[]){9, 11});
}

/* The gradient of x through causal self-attention (SDPA_BWD), weighted so
 * every output element's share differs.  A new reference, like
 * index_grad's. */
static nt_tensor *attn_grad(nt_tensor *x)
{
    nt_tensor *w = nt_detach(x);
    nt_set_requires_grad(w, true);
    nt_tensor *y = nt_scaled_dot_product_attention(w, w, w, NULL, true, 0.125);
    nt_tensor *k = nt_arange(nt_dtype_of(x), 0.0, 330 * 0.01, 0.01);
    nt_tensor *l = y ? nt_sum(nt_mul(y, nt_reshape(k, 2, (int64_t[]){10, 33})), NT_DIM_ALL, false)
                     : NULL;
    if (!l || nt_backward(l))
        return NULL;
    nt_tensor *g = nt_grad(w);
    nt_release(w);
    return g;
}

/* conv_gemm (conv2d's product of x [1, 10, 3, 11] and w [3, 10, 2, 1],
 * padding (1, 0)) or conv_wgrad (w's gradient of that product). */
static nt_tensor *conv_drv(nt_tensor *x, nt_tensor *w, bool wgrad)
{
    nt_tensor *x4 = nt_reshape(x, 4, (int64_t[]){1, 10, 3, 11});
    nt_tensor *w4 = nt_detach(nt_reshape(w, 4, (int64_t[]){3, 10, 2, 1}));
    if (wgrad)
        nt_set_requires_grad(w4, true);
    nt_tensor *y = nt_conv2d(x4, w4, NULL, NULL, (int64_t[]){1, 0}, NULL, 1);
    if (!wgrad || !y) {
        nt_release(w4);
        return y;
    }
    nt_tensor *k = nt_arange(nt_dtype_of(x), 0.0, 132 * 0.01, 0.01);
    nt_tensor *l = nt_sum(nt_mul(y, nt_reshape(k, 4, (int64_t[]){1, 3, 4, 11})), NT_DIM_ALL, false);
    if (!l || nt_backward(l))
        return NULL;
    nt_tensor *g = nt_grad(w4);
    nt_release(w4);
    return g;
}

/* grouped_mm (nt_grouped_mm of x [10, 33] with w [3, 33, 5], counts 4, 0,
 * 5: a zero row), grouped_mm_wgrad (w's gradient of sum(y * k)),
 * all_to_all_index (nt_all_to_all of x over a communicator of device 0, all
 * 10 rows to itself, into 12: two zero rows). */
static nt_tensor *moe_drv(nt_tensor *const *in, int op)
{
    static const int32_t cv[3] = {4, 0, 5}, one[1] = {10};
    if (op == NT_OP_A2A_INDEX) {
        nt_comm *c = nt_comm_create((int[]){0}, 1);
        nt_tensor *sc = host_t(one, NT_I32, 1, (int64_t[]){1}), *out = NULL;
        int rc = c ? nt_all_to_all(c, in, &sc, 12, &out, NULL) : nt_last_error();
        nt_comm_destroy(c);
        return rc ? NULL : out;
    }
    nt_tensor *ct = host_t(cv, NT_I32, 1, (int64_t[]){3});
    if (op == NT_OP_GMM)
        return nt_grouped_mm(in[0], nt_reshape(in[1], 3, (int64_t[]){3, 33, 5}), ct);
    nt_tensor *w = nt_detach(nt_reshape(in[1], 3, (int64_t[]){3, 33, 5}));
    nt_set_requires_grad(w, true);
    nt_tensor *y = nt_grouped_mm(in[0], w, ct);
    if (!y) {
        nt_release(w);
        return NULL;
    }
    nt_tensor *k = nt_arange(nt_dtype_of(in[0]), 0.0, 50 * 0.01, 0.01);
    nt_tensor *l = nt_sum(nt_mul(y, nt_reshape(k, 2, (int64_t[]){10, 5})), NT_DIM_ALL, false);
    if (!l || nt_backward(l))
        return NULL;
    nt_tensor *g = nt_grad(w);
    nt_release(w);
    return g;
}

/* batch_norm_fwd (training nt_batch_norm of x [2, 5, 3, 11] with w and b)
 * or batch_norm_bwd (x's gradient of sum(y * k) through it). */
static nt_tensor *bn_drv(nt_tensor *x, nt_tensor *w, nt_tensor *b, bool grad)
{
    nt_tensor *x4 = nt_reshape(x, 4, (int64_t[]){2, 5, 3, 11});
    if (!grad)
        return nt_batch_norm(x4, NULL, NULL, w, b, true, 0.1, 1e-5);
    nt_tensor *xd = nt_detach(x4);
    nt_set_requires_grad(xd, true);
    nt_tensor *y = nt_batch_norm(xd, NULL, NULL, w, b, true, 0.1, 1e-5);
    nt_tensor *k = nt_arange(nt_dtype_of(x), 0.0, 330 * 0.01, 0.01);
    nt_tensor *l = y ? nt_sum(nt_mul(y, nt_reshape(k, 4, (int64_t[]){2, 5, 3, 11})),
                              NT_DIM_ALL, false)
                     : NULL;
    if (!l || nt_backward(l))
        return NULL;
    nt_tensor *g = nt_grad(xd);
    nt_release(xd);
    return g;
}

/* max_pool2d_fwd of x [2, 5, 3, 11] (padded, overlapping columns,
 * ceil_mode) or max_pool2d_bwd (x's gradient of sum(y * k) through it). */
static nt_tensor *pool_drv(nt_tensor *x, bool grad)
{
    const int64_t k[2] = {2, 3}, s[2] = {2, 2}, p[2] = {1, 1};
    nt_tensor *x4 = nt_reshape(x, 4, (int64_t[]){2, 5, 3, 11});
    if (!grad)
        return nt_max_pool2d(x4, k, s, p, NULL, true, NULL);
    nt_tensor *xd = nt_detach(x4);
    nt_set_requires_grad(xd, true);
    nt_tensor *y = nt_max_pool2d(xd, k, s, p, NULL, true, NULL);
    nt_tensor *w = y ? nt_arange(nt_dtype_of(y), 0.0, (double)nt_numel(y) * 0.25, 0.25) : NULL;
    nt_tensor *l = w ? nt_sum(nt_mul(y, nt_reshape(w, 4, (int64_t[]){2, 5, nt_shape(y, 2),
                                                                     nt_shape(y, 3)})),
                              NT_DIM_ALL, false)
                     : NULL;
    if (!l || nt_backward(l))
        return NULL;
    nt_tensor *g = nt_grad(xd);
    nt_release(xd);
    return g;
}

/* grad_norms (gradient clipping's norms) of the four inputs, as f32. */
static nt_tensor *norms_drv(nt_tensor *const *in)
{
    nt_tensor *g[4];
    for (int i = 0; i < 4; i++)
        g[i] = in[i] && nt_dtype_of(in[i]) != NT_F32 ? nt_cast(in[i], NT_F32) : in[i];
    return nt__grad_norms(NULL, "nt_clip_grad_norm", g, 4);
}

static int grad_of_op = NT_OP_SOFTPLUS; /* UNARY_BWD's forward op */

/* UNARY_BWD(g, v) for the forward op grad_of_op with the scalar driver's
 * scalars, built like autograd/backward.c builds it. */
static nt_tensor *unary_bwd(nt_tensor *g, nt_tensor *v)
{
    nt__call c;
    nt_tensor *in[2] = {g, v};
    const nt_site *site = NT_HERE; /* the call keeps the pointer: not inside the if */
    if (!nt__call_begin(&c, site, "nt_unary_bwd", NT_OP_UNARY_BWD, 2, in, "g,v"))
        return nt__call_fail(&c);
    c.no_grad = false; /* recorded where grad is on, as a create_graph pass records it */
    c.p.i[0] = grad_of_op;
    c.p.f[0] = -0.5;
    c.p.f[1] = 1.25;
    c.odt[0] = nt__promote((nt_dtype)g->dtype, (nt_dtype)v->dtype);
    c.ondim[0] = g->ndim;
    for (int i = 0; i < g->ndim; i++)
        c.oshape[0][i] = g->shape[i];
    c.flops = (double)nt_numel(g);
    return nt__dispatch(&c);
}

static int partial_of_op = NT_OP_DIV, partial_which = 1; /* BINARY_DX's forward op, d/db */

/* BINARY_DX(a, b) for partial_of_op, as autograd/backward.c builds it */
static nt_tensor *binary_dx(nt_tensor *a, nt_tensor *b)
{
    nt__call c;
    nt_tensor *in[2] = {a, b};
    const nt_site *site = NT_HERE;
    if (!nt__call_begin(&c, site, "nt_binary_dx", NT_OP_BINARY_DX, 2, in, "a,b"))
        return nt__call_fail(&c);
    c.no_grad = true;
    c.p.i[0] = partial_of_op;
    c.p.i[1] = partial_which;
    c.odt[0] = nt__promote((nt_dtype)a->dtype, (nt_dtype)b->dtype);
    c.ondim[0] = a->ndim; /* a [4, 33], b [33] */
    for (int i = 0; i < a->ndim; i++)
        c.oshape[0][i] = a->shape[i];
    c.flops = (double)nt_numel(a);
    return nt__dispatch(&c);
}

/* Runs op on in[] (the spec's inputs); NULL with the error set if the
 * dispatcher refused, or (nt_tensor *)-1 if there is no driver. */
#define NO_DRIVER ((nt_tensor *)(intptr_t)-1)

static nt_tensor *run_op(int op, nt_tensor *const *in)
{
    const nt__opinfo *I = &nt__ops[op];
    const int64_t lab[4] = {3, 0, 32, 17};
    switch (I->kind) {
    case NT_KIND_UNARY: return nt__unary(NT_HERE, I->api, op, in[0]);
    case NT_KIND_SCALAR: {
        bool fl = nt__dtype_is_float(nt_dtype_of(in[0]));
        return nt__scalar(NT_HERE, I->api, op, in[0], fl ? -0.5 : -2.0, fl ? 1.25 : 3.0);
    }
    case NT_KIND_BINARY:
        if (op == NT_OP_UNARY_BWD)
            return unary_bwd(in[0], nt_expand(in[1], 2, (int64_t[]){4, 33}));
        if (op == NT_OP_BINARY_DX)
            return binary_dx(in[0], in[1]);
        return nt__binary(NT_HERE, I->api, op, in[0], in[1]);
    case NT_KIND_CMP: return nt__binary(NT_HERE, I->api, op, in[0], in[1]);
    case NT_KIND_WHERE: {
        if (op == NT_OP_TRIL)
            return nt_tril(in[0], 1);
        if (op == NT_OP_TRIU)
            return nt_triu(in[0], -2);
        if (op == NT_OP_MASKED_FILL) {
            /* a fixed mask, broadcast over the rows: one the gradcheck's
             * steps cannot flip */
            uint8_t m[33];
            for (int k = 0; k < 33; k++)
                m[k] = k % 3 == 0;
            nt_tensor *mk = host_t(m, NT_U8, 2, (int64_t[]){1, 33});
            return nt_masked_fill(in[0], mk, nt__dtype_is_float(nt_dtype_of(in[0])) ? -2.5 : 7);
        }
        nt_tensor *z = nt_zeros(nt_dtype_of(in[0]), 0, NULL);
        return nt_where(nt_gt(in[0], z), in[0], in[1]);
    }
    case NT_KIND_FILL:
        switch (op) {
        case NT_OP_FILL: return nt_full(NT_F32, 2, (int64_t[]){4, 33}, 1.5);
        case NT_OP_ARANGE: return nt_arange(NT_F32, -3.0, 30.0, 0.25);
        case NT_OP_RAND: return nt_rand(NT_F32, 2, (int64_t[]){4, 33}, 7);
        case NT_OP_RANDN: return nt_randn(NT_F32, 2, (int64_t[]){4, 33}, 7);
        default: return NO_DRIVER;
        }
    case NT_KIND_COPY:
        switch (op) {
        case NT_OP_COPY: return nt_contiguous(nt_transpose(in[0], 0, 1));
        case NT_OP_CAST:
            return nt_cast(in[0], nt__dtype_is_float(nt_dtype_of(in[0])) ? NT_F16 : NT_U8);
        default: return NO_DRIVER;
        }
    case NT_KIND_REDUCE:
        switch (op) {
        case NT_OP_SUM: return nt_sum(in[0], 1, false);
        case NT_OP_MEAN: return nt_mean(in[0], 1, true);
        case NT_OP_MAX: return nt_max(in[0], 1, false);
        case NT_OP_ARGMAX: return nt_argmax(in[0], 1, false);
        case NT_OP_MIN: return nt_min(in[0], 1, false);
        case NT_OP_ARGMIN: return nt_argmin(in[0], 1, true);
        case NT_OP_ANY: return nt_any(in[0], 0, false);
        case NT_OP_NORM: return nt_norm(in[0], 2.0, 1, false);
        case NT_OP_AMAX: return nt_amax(in[0], 1, (const int[]){1}, false);
        case NT_OP_AMIN: return nt_amin(in[0], 2, (const int[]){0, 1}, true);
        case NT_OP_TOPK: {
            nt_tensor *v, *ix;
            return nt_topk(in[0], 7, 1, true, &v, &ix) ? NULL : ix;
        }
        case NT_OP_MULTINOMIAL: /* exp(-|x|): in [0, 1], zero where x is +-Inf */
            return nt_multinomial(nt__dtype_is_float(nt_dtype_of(in[0]))
                                      ? nt_exp(nt_neg(nt_abs(in[0])))
                                      : in[0],
                                  40, 3);
        default: return NO_DRIVER;
        }
    case NT_KIND_ROW:
        switch (op) {
        case NT_OP_SOFTMAX: return nt_softmax(in[0], 1);
        case NT_OP_LOG_SOFTMAX: return nt_log_softmax(in[0], 1);
        case NT_OP_LAYER_NORM: return nt_layer_norm(in[0], in[1], in[2], 1e-5);
        case NT_OP_RMS_NORM: return nt_rms_norm(in[0], in[1], 1e-5);
        case NT_OP_DROPOUT: return nt_dropout(in[0], 0.3, 7);
        case NT_OP_CUMSUM: return nt_cumsum(in[0], 1);
        case NT_OP_CUMPROD: return nt_cumprod(in[0], 1);
        case NT_OP_ROPE: /* the offset as a tensor: a capture takes it */
            return nt_rope_offset(in[0], 32, false, 1e4, 1.0, nt_full(NT_I32, 0, NULL, 3));
        default: return NO_DRIVER;
        }
    case NT_KIND_LOSS:
        switch (op) {
        case NT_OP_CROSS_ENTROPY: {
            int32_t l[4] = {(int32_t)lab[0], (int32_t)lab[1], (int32_t)lab[2], (int32_t)lab[3]};
            return nt_cross_entropy(in[0], host_t(l, NT_I32, 1, (int64_t[]){4}));
        }
        case NT_OP_MSE_LOSS: return nt_mse_loss(in[0], in[1]);
        default: return NO_DRIVER;
        }
    case NT_KIND_MATMUL: return op == NT_OP_MATMUL ? nt_matmul(in[0], in[1]) : NO_DRIVER;
    case NT_KIND_GATHER:
        if (op == NT_OP_EMBEDDING) {
            int32_t ix[5] = {3, 0, 9, 3, 5};
            return nt_embedding(in[0], host_t(ix, NT_I32, 1, (int64_t[]){5}));
        }
        if (op == NT_OP_GATHER)
            return nt_gather(in[0], 1, gather_index());
        if (op == NT_OP_INDEX_SELECT) {
            int32_t ix[4] = {7, 0, 7, 2};
            return nt_index_select(in[0], 0, host_t(ix, NT_I32, 1, (int64_t[]){4}));
        }
        if (op == NT_OP_SCATTER_ADD) /* repeated indices add in order */
            return nt_scatter_add(in[0], 1, gather_index(), in[1]);
        if (op == NT_OP_SCATTER) { /* distinct per row: the gradient is exact */
            int32_t ix[50];
            for (int k = 0; k < 50; k++)
                ix[k] = (int32_t)((k % 5) * 7 + k / 5 % 3);
            return nt_scatter(in[0], 1, host_t(ix, NT_I32, 2, (int64_t[]){10, 5}), in[1]);
        }
        return NO_DRIVER;
    case NT_KIND_VIEW:
        switch (op) {
        case NT_OP_RESHAPE: return nt_reshape(in[0], 2, (int64_t[]){12, 11});
        case NT_OP_TRANSPOSE: return nt_transpose(in[0], 0, 1);
        case NT_OP_PERMUTE: return nt_permute(in[0], (int[]){1, 0});
        case NT_OP_SLICE: return nt_slice(in[0], 1, 2, 30, 3);
        case NT_OP_EXPAND:
            return nt_expand(nt_reshape(in[0], 3, (int64_t[]){1, 4, 33}), 3, (int64_t[]){2, 4, 33});
        case NT_OP_ALIAS: return nt_contiguous(in[0]);
        case NT_OP_CAT: return nt_cat(in, 2, 0);
        case NT_OP_FLIP: return nt_flip(in[0], 2, (int[]){-1, 0});
        case NT_OP_DIAGONAL: return nt_diagonal(in[0], 1, 0, -1);
        case NT_OP_CONV2D:
            return nt_conv2d(nt_reshape(in[0], 4, (int64_t[]){1, 4, 3, 11}),
                             nt_reshape(in[1], 4, (int64_t[]){3, 4, 2, 1}), in[2],
                             (int64_t[]){1, 2}, (int64_t[]){1, 0}, NULL, 1);
        case NT_OP_CONV_TRANSPOSE2D:
            return nt_conv_transpose2d(nt_reshape(in[0], 4, (int64_t[]){1, 4, 3, 11}),
                                       nt_reshape(in[1], 4, (int64_t[]){4, 3, 2, 1}), in[2],
                                       (int64_t[]){2, 1}, NULL, (int64_t[]){1, 0}, 1, NULL);
        default: return NO_DRIVER;
        }
    case NT_KIND_BWD:
        if (op == NT_OP_EMBEDDING_BWD || op == NT_OP_INDEX_ADD)
            return index_grad(in[0], op);
        if (op == NT_OP_SDPA_BWD)
            return attn_grad(in[0]);
        if (op == NT_OP_LINREC)
            return cumprod_grad(in[0]);
        if (op == NT_OP_CONV_GEMM || op == NT_OP_CONV_WGRAD)
            return conv_drv(in[0], in[1], op == NT_OP_CONV_WGRAD);
        if (op == NT_OP_BN_FWD || op == NT_OP_BN_BWD)
            return bn_drv(in[0], in[1], in[2], op == NT_OP_BN_BWD);
        if (op == NT_OP_GRAD_NORMS)
            return norms_drv(in);
        if (op == NT_OP_GMM || op == NT_OP_GMM_WGRAD || op == NT_OP_A2A_INDEX)
            return moe_drv(in, op);
        if (op == NT_OP_MAX_POOL2D || op == NT_OP_MAX_POOL2D_BWD)
            return pool_drv(in[0], op == NT_OP_MAX_POOL2D_BWD);
        return NO_DRIVER;
    case NT_KIND_ATTN:
        if (op == NT_OP_SDPA)
            return nt_scaled_dot_product_attention(in[0], in[1], in[2], attn_mask(), false, 0);
        return NO_DRIVER;
    default: return NO_DRIVER;
    }
}

/* ---------------- one run, as bytes ---------------- */

typedef struct {
    int rc;
    char msg[200];
    nt_dtype dt;
    int nd;
    int64_t sh[NT_MAX_DIMS];
    size_t nb;
    unsigned char *b;
    nt_stats st;
} result;

static void result_free(result *r)
{
    free(r->b);
    memset(r, 0, sizeof *r);
}

/* Builds the inputs (dtype dt, values v), runs op (in a chain if asked)
 * and reads the result.  The current configuration is used. */
static void run(int op, nt_dtype dt, int v, bool chain, result *r)
{
    memset(r, 0, sizeof *r);
    spec s = spec_of(op);
    nt_stats_reset();
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[4] = {0};
    for (int i = 0; i < s.n; i++) {
        in[i] = make_input(&s, i, dt, v);
        if (chain && in[i])
            in[i] = nt_mul_scalar(in[i], 1.0);
    }
    nt_sync();
    nt_stats_reset();
    nt_tensor *y = run_op(op, in);
    bool owned = nt__ops[op].kind == NT_KIND_BWD && y && y != NO_DRIVER;
    if (y == NO_DRIVER) {
        r->rc = NT_ENOTSUP;
        snprintf(r->msg, sizeof r->msg, "no driver for op %s (kind %d) in tests/test_conformance.c",
                 nt__ops[op].name, (int)nt__ops[op].kind);
        nt_scope_end(sc);
        return;
    }
    nt_tensor *yy = y;
    if (chain && y)
        yy = nt_mul_scalar(y, 2.0);
    if (yy)
        yy = nt_contiguous(yy);
    if (!yy || nt_sync()) {
        r->rc = nt_last_error() ? nt_last_error() : NT_EEXEC;
        snprintf(r->msg, sizeof r->msg, "%s", nt_last_error_message());
        nt_clear_error();
        if (owned)
            nt_release(y);
        nt_scope_end(sc);
        return;
    }
    r->dt = nt_dtype_of(yy);
    r->nd = nt_ndim(yy);
    for (int i = 0; i < r->nd; i++)
        r->sh[i] = nt_shape(yy, i);
    r->nb = (size_t)nt_numel(yy) * nt_dtype_size(r->dt);
    r->b = malloc(r->nb ? r->nb : 1);
    r->rc = nt_to_host(yy, r->b, r->nb);
    if (r->rc) {
        snprintf(r->msg, sizeof r->msg, "%s", nt_last_error_message());
        nt_clear_error();
    }
    nt_stats_get(&r->st);
    if (owned)
        nt_release(y);
    nt_scope_end(sc);
}

/* "" if equal, else why not */
static const char *diff(const result *a, const result *b)
{
    static char why[120];
    if (a->rc || b->rc) {
        snprintf(why, sizeof why, "error: %.100s", a->rc ? a->msg : b->msg);
        return why;
    }
    if (a->dt != b->dt || a->nb != b->nb)
        return "dtype or size differs";
    for (size_t i = 0; i < a->nb; i++)
        if (a->b[i] != b->b[i]) {
            snprintf(why, sizeof why, "bytes differ from byte %zu", i);
            return why;
        }
    return "";
}

/* ---------------- the checks ---------------- */

/* the float dtype to drive op with, or i32 for an integer-only op */
static nt_dtype dt_main(int op) { return (nt__ops[op].flags & NT_OPF_INTONLY) ? NT_I32 : NT_F32; }

static void check_sim(int op)
{
    nt_dtype dts[2] = {NT_F32, NT_BF16};
    if (nt__ops[op].flags & NT_OPF_INTONLY)
        dts[0] = NT_I32, dts[1] = NT_U8;
    uint64_t sim_kernels = 0;
    for (int d = 0; d < 2; d++) {
        result c, s;
        config("cpu", "deterministic", "1");
        run(op, dts[d], V_MIXED, false, &c);
        config("sim", "deterministic", "1");
        run(op, dts[d], V_MIXED, false, &s);
        const char *w = diff(&c, &s);
        if (*w)
            cell(op, K_SIM, "FAIL %s: %s", nt_dtype_name(dts[d]), w);
        else if (s.st.cpu_fallbacks)
            cell(op, K_SIM, "FAIL %s: ran on the CPU", nt_dtype_name(dts[d]));
        sim_kernels += s.st.sim_kernels;
        result_free(&c);
        result_free(&s);
        if (*w)
            return;
    }
    cell(op, K_SIM, sim_kernels ? "ok" : "ok (no kernel)");
}

static void check_chain(int op)
{
    static const char *be[2] = {"cpu", "sim"};
    uint64_t groups = 0;
    for (int b = 0; b < 2; b++) {
        result det, ada, lazy, eager;
        nt_dtype dt = dt_main(op);
        config(be[b], "deterministic", "1");
        run(op, dt, V_MIXED, true, &det);
        config(be[b], "adaptive", "1");
        run(op, dt, V_MIXED, true, &ada);
        config(be[b], "lazy", "1");
        run(op, dt, V_MIXED, true, &lazy);
        config(be[b], "eager", "0");
        run(op, dt, V_MIXED, true, &eager);
        groups += lazy.st.fusion_groups;
        const char *w1 = diff(&lazy, &eager);
        if (*w1)
            cell(op, K_FUSE, "FAIL %s: %s", be[b], w1);
        const char *w2 = diff(&det, &ada);
        if (*w2)
            cell(op, K_MODES, "FAIL %s: %s", be[b], w2);
        result_free(&det);
        result_free(&ada);
        result_free(&lazy);
        result_free(&eager);
        if (*w1 || *w2)
            return;
    }
    /* views and backward helpers run no fusable kernel of their own */
    cell(op, K_FUSE, groups ? "ok" : "ok (nothing fused)");
    cell(op, K_MODES, "ok");
}

/* The op captured on one set of values, replayed on another (bound to the
 * captured inputs): the replay's bits are those of running the op on the
 * second set op by op; on both backends, in lazy mode. */
static void run_captured(int op, nt_dtype dt, result *r)
{
    memset(r, 0, sizeof *r);
    spec s = spec_of(op);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[4] = {0}, *in2[4] = {0};
    for (int i = 0; i < s.n; i++) {
        in[i] = make_input(&s, i, dt, V_GRID);
        in2[i] = make_input(&s, i, dt, V_MIXED);
    }
    nt_sync();
    assert_int_equal(nt_graph_capture_begin(), 0);
    char nm[16];
    for (int i = 0; i < s.n; i++) {
        snprintf(nm, sizeof nm, "in%d", i);
        if (in[i])
            assert_int_equal(nt_graph_input(in[i], nm), 0);
    }
    nt_tensor *x1[4] = {0}; /* x * 1, as run()'s chain */
    for (int i = 0; i < s.n; i++)
        x1[i] = in[i] ? nt_mul_scalar(in[i], 1.0) : NULL;
    capture_aux = 1;
    nt_tensor *y = run_op(op, x1);
    capture_aux = 0;
    bool owned = nt__ops[op].kind == NT_KIND_BWD && y && y != NO_DRIVER;
    nt_tensor *yy = y && y != NO_DRIVER ? nt_contiguous(nt_mul_scalar(y, 2.0)) : NULL;
    nt_graph *g = nt_graph_capture_end();
    if (!g || !yy) {
        r->rc = nt_last_error() ? nt_last_error() : NT_EEXEC;
        snprintf(r->msg, sizeof r->msg, "capture: %s", nt_last_error_message());
        nt_clear_error();
    }
    for (int i = 0; g && i < s.n; i++) {
        snprintf(nm, sizeof nm, "in%d", i);
        if (in[i])
            assert_int_equal(nt_graph_bind(g, nm, in2[i]), 0);
    }
    if (g && (r->rc = nt_graph_replay(g)) == 0) {
        r->dt = nt_dtype_of(yy);
        r->nb = (size_t)nt_numel(yy) * nt_dtype_size(r->dt);
        r->b = malloc(r->nb ? r->nb : 1);
        r->rc = nt_to_host(yy, r->b, r->nb);
    }
    if (r->rc && !r->msg[0]) {
        snprintf(r->msg, sizeof r->msg, "%s", nt_last_error_message());
        nt_clear_error();
    }
    nt_graph_destroy(g);
    if (owned)
        nt_release(y);
    nt_scope_end(sc);
}

static void check_captured(int op)
{
    static const char *be[2] = {"cpu", "sim"};
    if (op == NT_OP_A2A_INDEX) { /* issued by nt_all_to_all only */
        cell(op, K_CAPT, "n/a: part of nt_all_to_all, a collective (collectives run outside a "
                         "captured program)");
        return;
    }
    nt_dtype dt = dt_main(op);
    for (int b = 0; b < 2; b++) {
        result ref, got;
        config(be[b], "deterministic", "1");
        run(op, dt, V_MIXED, true, &ref); /* x * 1, the op, * 2: as run_captured */
        config(be[b], "lazy", "1");
        run_captured(op, dt, &got);
        const char *w = diff(&ref, &got);
        if (*w)
            cell(op, K_CAPT, "FAIL %s: %s", be[b], w);
        result_free(&ref);
        result_free(&got);
        if (*w)
            return;
    }
    cell(op, K_CAPT, "ok");
}

static nt_tensor *grad_f(nt_tensor *const *in, void *ctx)
{
    nt_tensor *y = run_op(*(int *)ctx, in);
    return y == NO_DRIVER ? NULL : y;
}

static int grad_v[NT_OP_COUNT]; /* check_grad's inputs for check_grad64 */

static void check_grad(int op)
{
    if (!(nt__ops[op].flags & NT_OPF_DIFF)) {
        cell(op, K_GRAD, "n/a: not differentiable");
        return;
    }
    spec s = spec_of(op);
    if (s.n == 0) {
        cell(op, K_GRAD, "n/a: no inputs");
        return;
    }
    if (op == NT_OP_GMM_WGRAD) { /* its driver returns a first-order gradient */
        cell(op, K_GRAD, "n/a: its gradient is nt_grouped_mm's second derivative, checked "
                         "by nt_gradgradcheck in test_moe.c");
        return;
    }
    config("cpu", "deterministic", "1");
    nt_scope *sc = nt_scope_begin();
    /* positive inputs where the op is not finite on both signs (log, sqrt,
     * pow_scalar's x^-0.5 ...) */
    int v = V_GRID;
    nt_tensor *in[4];
    for (int i = 0; i < s.n; i++)
        in[i] = make_input(&s, i, NT_F32, V_GRID);
    nt_tensor *y = run_op(op, in);
    nt_tensor *fin = y ? nt_sum(nt_cast(nt_ne(nt_sub(y, y), nt_zeros(NT_F32, 0, NULL)), NT_F32),
                                NT_DIM_ALL, false)
                       : NULL;
    double bad = 0;
    if (fin && !nt_item(fin, &bad) && bad > 0)
        v = V_POS;
    for (int i = 0; i < s.n; i++) {
        in[i] = make_input(&s, i, NT_F32, v);
        nt_set_requires_grad(in[i], true);
    }
    /* a cast to f16 rounds: a wider step keeps the difference quotient honest */
    double eps = op == NT_OP_CAST ? 0.25 : 1e-2;
    /* the steps of floor/ceil/round/trunc and fmod's jumps: a narrow
     * difference quotient that straddles none of the grid's values */
    if (op == NT_OP_FLOOR || op == NT_OP_CEIL || op == NT_OP_ROUND || op == NT_OP_TRUNC ||
        op == NT_OP_FMOD)
        eps = 1e-4;
    grad_v[op] = v;
    int o = op;
    int rc = nt_gradcheck(grad_f, in, s.n, &o, eps, 2e-2, 2e-2);
    if (rc)
        cell(op, K_GRAD, "FAIL %.60s", nt_last_error_message());
    else
        cell(op, K_GRAD, "ok%s", v == V_POS ? " (x > 0)" : "");
    nt_clear_error();
    nt_scope_end(sc);
}

/* The gradcheck column again with f64 inputs (check_grad's values, the
 * whole check in double) at PyTorch's double tolerances.  An op that takes
 * no f64 input refuses it before anything runs (NT_ENOTSUP): n/a. */
static void check_grad64(int op)
{
    spec s = spec_of(op);
    if (!(nt__ops[op].flags & NT_OPF_DIFF) || s.n == 0) {
        cell(op, K_G64, "n/a: %s", s.n ? "not differentiable" : "no inputs");
        return;
    }
    config("cpu", "deterministic", "1");
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[4];
    for (int i = 0; i < s.n; i++)
        in[i] = make_input(&s, i, NT_F64, grad_v[op]);
    nt_clear_error();
    nt_tensor *y = run_op(op, in);
    int err = nt_last_error();
    if (!y && (err == NT_ENOTSUP || err == NT_EDTYPE)) {
        cell(op, K_G64, "n/a: takes no f64");
    } else if (!y || (y->dtype != NT_F64 && op != NT_OP_CAST)) { /* cast: to its target */
        cell(op, K_G64, "FAIL f64 forward: %.50s", y ? "not f64" : nt_last_error_message());
    } else {
        for (int i = 0; i < s.n; i++)
            nt_set_requires_grad(in[i], true);
        /* the f32 column's wide steps where the op rounds through f16 */
        double eps = op == NT_OP_CAST ? 0.25 : NT_GRADCHECK_F64_EPS;
        double tol = op == NT_OP_CAST ? 2e-2 : NT_GRADCHECK_F64_ATOL;
        int o = op;
        if (nt_gradcheck(grad_f, in, s.n, &o, eps, tol,
                         op == NT_OP_CAST ? 2e-2 : NT_GRADCHECK_F64_RTOL))
            cell(op, K_G64, "FAIL %.60s", nt_last_error_message());
        else
            cell(op, K_G64, "ok (double tolerances)%s", grad_v[op] == V_POS ? " (x > 0)" : "");
    }
    nt_clear_error();
    nt_scope_end(sc);
}

static void check_amp(int op)
{
    const nt__opinfo *I = &nt__ops[op];
    spec s = spec_of(op);
    if (s.n == 0) {
        cell(op, K_AMP, "n/a: no inputs");
        return;
    }
    if (I->kind == NT_KIND_BWD) {
        cell(op, K_AMP, "n/a: backward ops are never autocast");
        return;
    }
    config("cpu", "deterministic", "1");
    nt_dtype in_dt = I->amp == NT__AMP_LOW ? NT_F32 : NT_BF16;
    nt_dtype want = I->amp == NT__AMP_F32 ? NT_F32 : NT_BF16;
    if (I->kind == NT_KIND_CMP || op == NT_OP_ARGMAX || op == NT_OP_ARGMIN || op == NT_OP_ANY ||
        op == NT_OP_TOPK || op == NT_OP_MULTINOMIAL ||
        (I->flags & NT_OPF_INTONLY)) {
        cell(op, K_AMP, "n/a: integer result");
        return;
    }
    if (op == NT_OP_CAST)
        want = NT_F16; /* the driver asks for f16 */
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[4];
    for (int i = 0; i < s.n; i++)
        in[i] = make_input(&s, i, in_dt, V_GRID);
    assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    nt_tensor *y = run_op(op, in);
    assert_int_equal(nt_autocast_end(), 0);
    if (!y || y == NO_DRIVER)
        cell(op, K_AMP, "FAIL: %.60s", nt_last_error_message());
    else if (nt_dtype_of(y) != want)
        cell(op, K_AMP, "FAIL: %s from %s, the amp column says %s", nt_dtype_name(nt_dtype_of(y)),
             nt_dtype_name(in_dt), nt_dtype_name(want));
    else
        cell(op, K_AMP, "ok: %s -> %s (%s)", nt_dtype_name(in_dt), nt_dtype_name(want),
             I->amp == NT__AMP_LOW ? "low" : I->amp == NT__AMP_F32 ? "f32" : "keep");
    if (y && y != NO_DRIVER && I->kind == NT_KIND_BWD)
        nt_release(y);
    nt_clear_error();
    nt_scope_end(sc);
}

static void check_int(int op)
{
    const nt__opinfo *I = &nt__ops[op];
    unsigned fl = I->flags;
    spec s = spec_of(op);
    if (op == NT_OP_UNARY_BWD || op == NT_OP_BINARY_DX || I->kind == NT_KIND_BWD) {
        cell(op, K_INT, "n/a: internal, reached from float gradients only");
        return;
    }
    if (s.n == 0 && I->kind == NT_KIND_FILL) {
        /* creation: the dtype is an argument */
        config("cpu", "deterministic", "1");
        nt_tensor *t = op == NT_OP_FILL     ? nt_full(NT_I32, 1, (int64_t[]){3}, 2)
                       : op == NT_OP_ARANGE ? nt_arange(NT_I32, 0, 5, 1)
                       : op == NT_OP_RAND   ? nt_rand(NT_I32, 1, (int64_t[]){3}, 1)
                                            : nt_randn(NT_I32, 1, (int64_t[]){3}, 1);
        bool ok = (fl & NT_OPF_INT) ? t && nt_dtype_of(t) == NT_I32 : !t && nt_last_error() == NT_EDTYPE;
        cell(op, K_INT, ok ? ((fl & NT_OPF_INT) ? "ok: i32" : "ok: NT_EDTYPE") : "FAIL: i32 creation");
        if (t)
            nt_release(t);
        nt_clear_error();
        return;
    }
    if (!(fl & (NT_OPF_INT | NT_OPF_F32INT))) {
        /* floats only: an integer input is refused, naming the function */
        config("cpu", "deterministic", "1");
        result r;
        run(op, NT_I32, V_MIXED, false, &r);
        if (r.rc == NT_EDTYPE && strstr(r.msg, I->api))
            cell(op, K_INT, "ok: i32 is NT_EDTYPE");
        else
            cell(op, K_INT, "FAIL: i32 input gave %s", r.rc ? nt_strerror(r.rc) : "a result");
        result_free(&r);
        return;
    }
    static const nt_dtype dts[2] = {NT_I32, NT_U8};
    for (int d = 0; d < 2; d++) {
        result c, sm;
        config("cpu", "deterministic", "1");
        run(op, dts[d], V_MIXED, false, &c);
        config("sim", "deterministic", "1");
        run(op, dts[d], V_MIXED, false, &sm);
        const char *w = diff(&c, &sm);
        bool isint = !c.rc && !nt__dtype_is_float(c.dt);
        bool want_int = (fl & NT_OPF_INT) != 0;
        if (*w)
            cell(op, K_INT, "FAIL %s sim!=cpu: %s", nt_dtype_name(dts[d]), w);
        else if (op != NT_OP_CAST && isint != want_int)
            cell(op, K_INT, "FAIL %s gave %s", nt_dtype_name(dts[d]), nt_dtype_name(c.dt));
        result_free(&c);
        result_free(&sm);
        if (!strncmp(cov[op][K_INT], "FAIL", 4))
            return;
    }
    if (fl & NT_OPF_INTONLY) {
        result r;
        config("cpu", "deterministic", "1");
        run(op, NT_F32, V_MIXED, false, &r);
        bool ok = r.rc == NT_EDTYPE && strstr(r.msg, I->api) && strstr(r.msg, "'t'");
        if (!ok)
            cell(op, K_INT, "FAIL: f32 input gave %s", r.rc ? r.msg : "a result");
        else
            cell(op, K_INT, "ok: i32, u8 (sim=cpu); f32 is NT_EDTYPE");
        result_free(&r);
        return;
    }
    cell(op, K_INT, "ok: i32, u8 -> %s (sim=cpu)", (fl & NT_OPF_INT) ? "int" : "f32");
}

/* ---------------- independent references ---------------- */

typedef struct {
    int op;
    double (*f)(double x, double s0, double s1); /* NULL: an integer op */
    int32_t (*fi)(int32_t x);
    double s0, s1;
    double max_ulp; /* the bound (0: the f32 rounding of the exact value,
                       sign of zero included), from the measured sweep */
} ref;

static double r_softplus(double x, double s0, double s1)
{
    (void)s0, (void)s1;
    return x > 20 ? x : log1p(exp(x));
}
static double r_mish(double x, double s0, double s1) { return x * tanh(r_softplus(x, s0, s1)); }
static double r_softsign(double x, double s0, double s1)
{
    (void)s0, (void)s1;
    return x / (1.0 + fabs(x));
}
static double r_reciprocal(double x, double s0, double s1)
{
    (void)s0, (void)s1;
    return 1.0 / x;
}
static double r_leaky(double x, double s, double s1)
{
    (void)s1;
    return x > 0 ? x : x * (double)(float)s;
}
static double r_hardtanh(double x, double lo, double hi)
{
    return x != x ? x : x < lo ? lo : x > hi ? hi : x;
}
static double r_pow(double x, double e, double s1)
{
    (void)s1;
    return pow(x, e);
}
static int32_t r_not(int32_t x) { return (int32_t)~(uint32_t)x; }
/* PyTorch's gelu(approximate='tanh') formula in double, 0.5 x (1 + tanh(u));
 * below u = -1 the same value as x e^2u / (1 + e^2u), since 1 + tanh(u)
 * cancels there even in double (to 0 below about x = -4.7) */
static double r_gelu_tanh(double x, double s0, double s1)
{
    (void)s0, (void)s1;
    double u = sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x);
    if (u >= -1.0 || isnan(u))
        return 0.5 * x * (1.0 + tanh(u));
    double e = exp(2.0 * u);
    return x * e / (1.0 + e);
}

/* issue 34: libm's double functions (sin of a float is exact in double
 * arithmetic to well under an ulp); sign and the roundings exact */
static double r_sin(double x, double s0, double s1) { (void)s0, (void)s1; return sin(x); }
static double r_cos(double x, double s0, double s1) { (void)s0, (void)s1; return cos(x); }
static double r_erf(double x, double s0, double s1) { (void)s0, (void)s1; return erf(x); }
static double r_log1p(double x, double s0, double s1) { (void)s0, (void)s1; return log1p(x); }
static double r_expm1(double x, double s0, double s1) { (void)s0, (void)s1; return expm1(x); }
static double r_sign(double x, double s0, double s1)
{
    (void)s0, (void)s1;
    return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
}
static double r_floor(double x, double s0, double s1) { (void)s0, (void)s1; return floor(x); }
static double r_ceil(double x, double s0, double s1) { (void)s0, (void)s1; return ceil(x); }
static double r_trunc(double x, double s0, double s1) { (void)s0, (void)s1; return trunc(x); }
static double r_round(double x, double s0, double s1) { (void)s0, (void)s1; return nearbyint(x); }
static double r_atan2(double x, double s0, double s1) { (void)s1; return atan2(x, (float)s0); }
static double r_fmod(double x, double s0, double s1) { (void)s1; return fmod(x, (float)s0); }

static const ref refs[] = {
    {NT_OP_SOFTPLUS, r_softplus, NULL, 0, 0, 3},
    {NT_OP_MISH, r_mish, NULL, 0, 0, 4},
    {NT_OP_SOFTSIGN, r_softsign, NULL, 0, 0, 2}, /* two roundings: 1 + |x|, then / */
    {NT_OP_RECIPROCAL, r_reciprocal, NULL, 0, 0, 0},
    {NT_OP_LEAKY_RELU, r_leaky, NULL, 0.01, 0, 0},
    {NT_OP_HARDTANH, r_hardtanh, NULL, -1.0, 1.0, 0},
    {NT_OP_BITWISE_NOT, NULL, r_not, 0, 0, 0},
    {NT_OP_POW, r_pow, NULL, 1.5, 0, 1}, /* b: a 0-d tensor of s0, broadcast */
    {NT_OP_POW, r_pow, NULL, -2.25, 0, 1},
    {NT_OP_GELU_TANH, r_gelu_tanh, NULL, 0, 0, 400},
    {NT_OP_SIN, r_sin, NULL, 0, 0, 1},
    {NT_OP_COS, r_cos, NULL, 0, 0, 1},
    {NT_OP_ERF, r_erf, NULL, 0, 0, 2},
    {NT_OP_LOG1P, r_log1p, NULL, 0, 0, 1},
    {NT_OP_EXPM1, r_expm1, NULL, 0, 0, 1},
    {NT_OP_SIGN, r_sign, NULL, 0, 0, 0},
    {NT_OP_FLOOR, r_floor, NULL, 0, 0, 0},
    {NT_OP_CEIL, r_ceil, NULL, 0, 0, 0},
    {NT_OP_ROUND, r_round, NULL, 0, 0, 0},
    {NT_OP_TRUNC, r_trunc, NULL, 0, 0, 0},
    {NT_OP_ATAN2, r_atan2, NULL, 1.5, 0, 1}, /* b: a 0-d tensor of s0, as pow's */
    {NT_OP_ATAN2, r_atan2, NULL, -0.0, 0, 1},
    {NT_OP_FMOD, r_fmod, NULL, 2.75, 0, 0},
    {NT_OP_FMOD, r_fmod, NULL, -0.3, 0, 0},
};

/* |a - ref| in units of the f32 spacing at ref; 0 when a is the f32
 * rounding of ref (also the same infinity, or both NaN) */
static double ulps(float a, double r)
{
    if (isnan(r) || isnan(a))
        return isnan(r) && isnan(a) ? 0 : INFINITY;
    float rf = (float)r;
    if (a == rf && signbit(a) == signbit(rf))
        return 0;
    if (isinf(rf) || isinf(a))
        return INFINITY;
    double sp = (double)nextafterf(fabsf(rf), INFINITY) - fabsf(rf);
    return fabs((double)a - r) / sp;
}

static void check_ref1(const ref *R);

/* tril, triu, masked_fill against a plain host loop over the bytes: every
 * dtype, batched and non-square shapes, diagonals beyond the size either
 * way, broadcast masks, empty tensors; cpu and sim, bit for bit.  The fill
 * value's bytes are nt_full's (the op promises its rounding). */
static bool tri_keep(int op, int64_t i, int64_t j, int64_t d)
{
    return op == NT_OP_TRIL ? j - i <= d : j - i >= d;
}

static int64_t check_mask_ref1(int op, const char *be, nt_dtype dt, int nd, const int64_t *sh,
                               int64_t d, int mnd, const int64_t *msh, double value)
{
    int64_t n = 1, es = (int64_t)nt_dtype_size(dt);
    for (int k = 0; k < nd; k++)
        n *= sh[k];
    float *xf = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t k = 0; k < n; k++)
        xf[k] = (float)((double)(k * 37 % 101) * 0.75 - 30.0);
    if (n > 3)
        xf[1] = -0.0f, xf[2] = NAN, xf[3] = -INFINITY;
    nt_tensor *x = n ? nt_cast(nt_from_host(xf, NT_F32, nd, sh), dt) : nt_zeros(dt, nd, sh);
    assert_non_null(x);
    unsigned char *xb = malloc((size_t)(n * es + 1)), *yb = malloc((size_t)(n * es + 1));
    if (n)
        assert_int_equal(nt_to_host(x, xb, (size_t)(n * es)), 0);
    nt_tensor *y;
    unsigned char fill[8] = {0}, *mb = NULL; /* the widest dtype: f64 */
    int64_t mst[NT_MAX_DIMS] = {0};
    if (op == NT_OP_MASKED_FILL) {
        int64_t mn = 1;
        for (int k = 0; k < mnd; k++)
            mn *= msh[k];
        mb = malloc((size_t)(mn + 1));
        for (int64_t k = 0; k < mn; k++)
            mb[k] = (uint8_t)(k % 3 == 1 ? 1 : k % 5 == 0 ? 255 : 0);
        nt_tensor *m = mn ? nt_from_host(mb, NT_U8, mnd, msh) : nt_zeros(NT_U8, mnd, msh);
        y = nt_masked_fill(x, m, value);
        assert_int_equal(nt_to_host(nt_full(dt, 0, NULL, value), fill, (size_t)es), 0);
        /* the mask's strides against x's dims, right-aligned, 0 where broadcast */
        int64_t st = 1;
        for (int k = mnd - 1; k >= 0; k--) {
            mst[nd - mnd + k] = msh[k] == 1 ? 0 : st;
            st *= msh[k];
        }
    } else {
        y = op == NT_OP_TRIL ? nt_tril(x, d) : nt_triu(x, d);
    }
    assert_non_null(y);
    assert_int_equal(nt_ndim(y), nd);
    for (int k = 0; k < nd; k++)
        assert_int_equal(nt_shape(y, k), sh[k]);
    assert_int_equal(nt_dtype_of(y), dt);
    int64_t bad = 0;
    if (n) {
        assert_int_equal(nt_to_host(y, yb, (size_t)(n * es)), 0);
        int64_t R = sh[nd - 2 >= 0 ? nd - 2 : 0], C = sh[nd - 1];
        for (int64_t e = 0; e < n; e++) {
            const unsigned char *want;
            static const unsigned char zero[8];
            if (op == NT_OP_MASKED_FILL) {
                int64_t rem = e, mo = 0;
                for (int k = nd - 1; k >= 0; k--) {
                    mo += (rem % sh[k]) * mst[k];
                    rem /= sh[k];
                }
                want = mb[mo] ? fill : xb + e * es;
            } else {
                int64_t i = (e / C) % R, j = e % C;
                want = tri_keep(op, i, j, d) ? xb + e * es : zero;
            }
            if (memcmp(yb + e * es, want, (size_t)es))
                bad++;
        }
    } else {
        assert_int_equal(nt_numel(y), 0);
    }
    if (bad)
        print_message("# %s %s %s nd %d d %lld value %g: %lld elements differ\n", be,
                      nt__ops[op].name, nt_dtype_name(dt), nd, (long long)d, value, (long long)bad);
    free(xf), free(xb), free(yb), free(mb);
    return bad;
}

static void check_mask_ref(int op)
{
    static const char *be[2] = {"cpu", "sim"};
    static const struct { int nd; int64_t sh[3]; } shapes[] = {
        {2, {3, 4}}, {2, {5, 2}}, {3, {2, 3, 5}}, {2, {1, 1}}, {2, {0, 4}}, {3, {2, 4, 0}},
        {2, {17, 33}},
    };
    static const int64_t diags[] = {INT64_MIN, -100, -4, -1, 0, 1, 3, 100, INT64_MAX};
    static const double values[] = {1.5, -INFINITY, NAN, 1e10, -0.0, 300.7};
    int64_t bad = 0, cases = 0;
    for (int b = 0; b < 2; b++) {
        config(be[b], "deterministic", "1");
        for (int dt = 0; dt < NT_DTYPE_COUNT; dt++)
            for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
                if (b == 1 && !nt__dtype_on_device((nt_dtype)dt))
                    break; /* f64 on the simulator is refused (NT_REQUIRE_SIM) */
                if (nt__dtype_is_fp8((nt_dtype)dt))
                    break; /* a storage dtype: these ops refuse it (test_fp8.c) */
                nt_scope *sc = nt_scope_begin();
                int nd = shapes[q].nd;
                const int64_t *sh = shapes[q].sh;
                if (op != NT_OP_MASKED_FILL) {
                    for (size_t k = 0; k < sizeof diags / sizeof diags[0]; k++, cases++)
                        bad += check_mask_ref1(op, be[b], (nt_dtype)dt, nd, sh, diags[k], 0,
                                               NULL, 0);
                } else {
                    /* masks: the full shape, the last dim, the rows [.., R, 1], 0-d */
                    int64_t last[1] = {sh[nd - 1]}, rows[2] = {sh[nd - 2], 1};
                    for (size_t k = 0; k < sizeof values / sizeof values[0]; k++, cases += 4) {
                        bad += check_mask_ref1(op, be[b], (nt_dtype)dt, nd, sh, 0, nd, sh,
                                               values[k]);
                        bad += check_mask_ref1(op, be[b], (nt_dtype)dt, nd, sh, 0, 1, last,
                                               values[k]);
                        bad += check_mask_ref1(op, be[b], (nt_dtype)dt, nd, sh, 0, 2, rows,
                                               values[k]);
                        bad += check_mask_ref1(op, be[b], (nt_dtype)dt, nd, sh, 0, 0, NULL,
                                               values[k]);
                    }
                }
                nt_scope_end(sc);
            }
    }
    if (bad)
        cell(op, K_REF, "FAIL: %lld elements differ from the host loop", (long long)bad);
    else
        cell(op, K_REF, "ok: exact, %lld cases, every dtype (cpu, sim)", (long long)cases);
}

/* The public elementwise ops (the unary, tensor-scalar and binary groups of
 * core/optable.h): each needs a reference, here or in test_ops.c. */
static bool public_ew(int op)
{
#define PUB_EW(ID, ...) || op == NT_OP_##ID
    return false NT_OPS_UNARY(PUB_EW) NT_OPS_SCALAR(PUB_EW) NT_OPS_BINARY(PUB_EW);
#undef PUB_EW
}

/* The public elementwise ops whose double-precision reference lives in
 * test_ops.c (checked there since before this table had columns), each
 * named with where: an op not listed here needs its entry in refs[] above,
 * wherever it sits in the enum. */
static const struct {
    int op;
    const char *where;
} ref_elsewhere[] = {
    {NT_OP_NEG, "test_ops.c un_name, exact"},
    {NT_OP_EXP, "test_ops.c un_name, 1 ulp"},
    {NT_OP_LOG, "test_ops.c un_name, 1 ulp"},
    {NT_OP_SQRT, "test_ops.c un_name, exact"},
    {NT_OP_RSQRT, "test_ops.c un_name, 1.5 ulp"},
    {NT_OP_ABS, "test_ops.c un_name, exact"},
    {NT_OP_RELU, "test_ops.c un_name, exact"},
    {NT_OP_GELU, "test_ops.c un_name, gelu_tol"},
    {NT_OP_SIGMOID, "test_ops.c un_name, 3 ulp"},
    {NT_OP_TANH, "test_ops.c un_name, 2 ulp"},
    {NT_OP_SILU, "test_ops.c un_name, silu_tol"},
    {NT_OP_ADD_SCALAR, "test_ops.c scalar_ops_float_exact"},
    {NT_OP_MUL_SCALAR, "test_ops.c scalar_ops_float_exact"},
    {NT_OP_DIV_SCALAR, "test_ops.c scalar_ops_float_exact"},
    {NT_OP_POW_SCALAR, "test_ops.c pow_and_clamp"},
    {NT_OP_CLAMP, "test_ops.c pow_and_clamp, clamp_lo_above_hi"},
    {NT_OP_ADD, "test_ops.c binary_float_exact_with_broadcast"},
    {NT_OP_SUB, "test_ops.c binary_float_exact_with_broadcast"},
    {NT_OP_MUL, "test_ops.c binary_float_exact_with_broadcast"},
    {NT_OP_DIV, "test_ops.c binary_float_exact_with_broadcast"},
    {NT_OP_MAXIMUM, "test_ops.c maximum_minimum_nan_inf_zero"},
    {NT_OP_MINIMUM, "test_ops.c maximum_minimum_nan_inf_zero"},
};

static const char *ref_where(int op)
{
    for (size_t i = 0; i < sizeof ref_elsewhere / sizeof ref_elsewhere[0]; i++)
        if (ref_elsewhere[i].op == op)
            return ref_elsewhere[i].where;
    return NULL;
}

static void check_ref(int op)
{
    if (op == NT_OP_TRIL || op == NT_OP_TRIU || op == NT_OP_MASKED_FILL) {
        check_mask_ref(op);
        return;
    }
    bool any = false;
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
        if (refs[i].op == op) {
            any = true;
            check_ref1(&refs[i]);
        }
    if (any)
        return;
    if (public_ew(op) && !ref_where(op))
        cell(op, K_REF, "FAIL: no double-precision reference: add one to refs[] above");
    else if (public_ew(op))
        cell(op, K_REF, "n/a: in %s", ref_where(op));
    else if (op == NT_OP_FLIP)
        cell(op, K_REF, "n/a: values and gradients vs torch.flip in test_mathops.c");
    else if (op == NT_OP_SCATTER || op == NT_OP_SCATTER_ADD || op == NT_OP_DIAGONAL)
        cell(op, K_REF, "n/a: vs a double host loop and PyTorch in test_shapeops.c");
    else if (op == NT_OP_CONV2D || op == NT_OP_CONV_TRANSPOSE2D || op == NT_OP_CONV_GEMM ||
             op == NT_OP_CONV_WGRAD)
        cell(op, K_REF, "n/a: values and gradients vs double and PyTorch in test_conv.c");
    else if (op == NT_OP_BN_FWD || op == NT_OP_BN_BWD)
        cell(op, K_REF, "n/a: values and gradients vs double and PyTorch in test_norms.c");
    else if (op == NT_OP_GRAD_NORMS)
        cell(op, K_REF, "n/a: the bits of nt_norm, checked in test_compile.c");
    else if (op == NT_OP_GMM || op == NT_OP_GMM_WGRAD || op == NT_OP_A2A_INDEX)
        cell(op, K_REF, "n/a: values and gradients vs double and a loop of nt_matmul in "
                        "test_moe.c");
    else if (op == NT_OP_MAX_POOL2D || op == NT_OP_MAX_POOL2D_BWD)
        cell(op, K_REF, "n/a: values and gradients vs double and PyTorch in test_cnn2.c");
    else if (op == NT_OP_SDPA || op == NT_OP_SDPA_BWD)
        cell(op, K_REF, "n/a: values and gradients vs double in test_attention.c");
    else if (op == NT_OP_AMAX || op == NT_OP_AMIN || op == NT_OP_CUMSUM || op == NT_OP_CUMPROD ||
             op == NT_OP_LINREC)
        cell(op, K_REF, "n/a: values and gradients vs PyTorch and double in test_reductions.c");
    else if (op == NT_OP_ROPE)
        cell(op, K_REF, "n/a: values and gradients vs PyTorch and double in test_rope.c");
    else
        cell(op, K_REF, "n/a: values checked in test_ops.c / test_autograd.c");
}

static void check_ref1(const ref *R)
{
    int op = R->op;
    enum { N = 20011 };
    static const char *be[2] = {"cpu", "sim"};
    double worst = 0;
    for (int b = 0; b < 2; b++) {
        config(be[b], "deterministic", "1");
        nt_scope *sc = nt_scope_begin();
        nt_tensor *y;
        if (R->f) {
            static float x[N];
            for (int k = 0; k < N; k++)
                x[k] = (float)(-45.0 + 90.0 * k / (N - 1)); /* covers 20 and the tails */
            x[0] = NAN, x[1] = -0.0f, x[2] = INFINITY, x[3] = -INFINITY, x[4] = 1e-30f;
            x[5] = 20.0f, x[6] = nextafterf(20.0f, 30.0f), x[7] = -1e-30f, x[8] = 88.0f;
            nt_tensor *t = nt_from_host(x, NT_F32, 1, (int64_t[]){N});
            nt__opkind kd = nt__ops[op].kind;
            y = kd == NT_KIND_SCALAR   ? nt__scalar(NT_HERE, nt__ops[op].api, op, t, R->s0, R->s1)
                : kd == NT_KIND_BINARY ? nt__binary(NT_HERE, nt__ops[op].api, op, t,
                                                    nt_full(NT_F32, 0, NULL, R->s0))
                                       : nt__unary(NT_HERE, nt__ops[op].api, op, t);
            static float out[N];
            assert_non_null(y);
            assert_int_equal(nt_to_host(y, out, sizeof out), 0);
            for (int k = 0; k < N; k++) {
                double u = ulps(out[k], R->f((double)x[k], R->s0, R->s1));
                if (u > worst)
                    worst = u;
            }
        } else {
            static int32_t x[N], out[N];
            for (int k = 0; k < N; k++)
                x[k] = (int32_t)((uint32_t)k * 2654435761u);
            x[0] = INT32_MIN, x[1] = INT32_MAX, x[2] = 0, x[3] = -1;
            nt_tensor *t = nt_from_host(x, NT_I32, 1, (int64_t[]){N});
            y = nt__unary(NT_HERE, nt__ops[op].api, op, t);
            assert_non_null(y);
            assert_int_equal(nt_to_host(y, out, sizeof out), 0);
            for (int k = 0; k < N; k++)
                if (out[k] != R->fi(x[k]))
                    worst = INFINITY;
            /* u8: 255 - x */
            uint8_t xb[256], ob[256];
            for (int k = 0; k < 256; k++)
                xb[k] = (uint8_t)k;
            nt_tensor *tb = nt_from_host(xb, NT_U8, 1, (int64_t[]){256});
            nt_tensor *yb = nt__unary(NT_HERE, nt__ops[op].api, op, tb);
            assert_non_null(yb);
            assert_int_equal(nt_dtype_of(yb), NT_U8);
            assert_int_equal(nt_to_host(yb, ob, sizeof ob), 0);
            for (int k = 0; k < 256; k++)
                if (ob[k] != (uint8_t)(255 - k))
                    worst = INFINITY;
        }
        nt_scope_end(sc);
    }
    if (!strncmp(cov[op][K_REF], "FAIL", 4))
        return; /* an earlier reference of this op failed: keep that */
    if (worst > R->max_ulp)
        cell(op, K_REF, "FAIL: %.1f ulp > %.0f", worst, R->max_ulp);
    else if (R->max_ulp == 0)
        cell(op, K_REF, R->f ? "ok: exact, == (f32)ref (cpu, sim)" : "ok: exact, i32 and u8 (cpu, sim)");
    else
        cell(op, K_REF, "ok: max %.2f ulp <= %.0f (cpu, sim)", worst, R->max_ulp);
}

/* ---------------- fp8 ----------------
 *
 * The fp8 column.  An op that takes e4m3 / e5m2 (core/ewise64.h's
 * NT_FP8_OPS; MATMUL's fp8 operands through nt_matmul_fp8) runs on fp8
 * data in every variant below, each format: the simulator gives the CPU's
 * bits (deterministic), and a chain x*1 -> cast -> op -> cast to f32 -> *2
 * gives the same bits in every mode (deterministic, adaptive, lazy, eager
 * with NT_FUSION=0) on both backends, and captured on other values and
 * replayed on these (not the stochastic roundings, whose bits are keyed by
 * where a run falls in the record sequence); the values against this file's own
 * decoding and encoding of the formats (sign, exponent and mantissa fields
 * with ldexp, round to nearest even by search over the codes).  Every
 * other op refuses fp8 with NT_ENOTSUP naming its function, with fp8 in
 * each input position in turn and in all of them. */

typedef struct {
    nt_dtype dt;
    int eb, mb, bias;
    bool ieee; /* E5M2: infinities; E4M3 ("fn"): none, NaN is S.1111.111 */
} f8fmt;
static const f8fmt f8fmts[2] = {{NT_E4M3, 4, 3, 7, false}, {NT_E5M2, 5, 2, 15, true}};

static bool f8_isnan(const f8fmt *f, uint8_t c)
{
    int e = (c >> f->mb) & ((1 << f->eb) - 1), m = c & ((1 << f->mb) - 1);
    return e == (1 << f->eb) - 1 && (f->ieee ? m != 0 : m == (1 << f->mb) - 1);
}

static double f8_decode(const f8fmt *f, uint8_t c)
{
    int e = (c >> f->mb) & ((1 << f->eb) - 1), m = c & ((1 << f->mb) - 1);
    double s = (c & 0x80) ? -1.0 : 1.0;
    if (f8_isnan(f, c))
        return NAN;
    if (f->ieee && e == (1 << f->eb) - 1)
        return s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, 1 - f->bias - f->mb);
    return s * ldexp((double)((1 << f->mb) | m), e - f->bias - f->mb);
}

/* the largest finite value */
static double f8_max(const f8fmt *f) { return f8_decode(f, f->ieee ? 0x7b : 0x7e); }

/* x to nearest, ties to the even code; E4M3 saturates finite values and
 * makes +-Inf NaN; E5M2 overflows to +-Inf from the midpoint past its max.
 * NaN: 0xff as "some NaN" (callers compare NaN-ness). */
static uint8_t f8_encode(const f8fmt *f, double x)
{
    if (isnan(x) || (isinf(x) && !f->ieee))
        return 0xff;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double ax = fabs(x), top = f8_max(f), ulp_top = ldexp(1.0, (int)floor(log2(top)) - f->mb);
    if (f->ieee && ax >= top + ulp_top / 2)
        return (uint8_t)(sign | 0x7c);
    if (ax > top)
        return (uint8_t)(sign | f8_encode(f, top));
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 0x80; c++) {
        double v = f8_decode(f, (uint8_t)c);
        if (isnan(v) || isinf(v))
            continue;
        double d = fabs(ax - v);
        if (d < bd || (d == bd && (c & 1) == 0))
            bd = d, best = c;
    }
    return (uint8_t)(sign | best);
}

static bool same_val(double a, double b)
{
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

static double bf16_val(uint16_t u)
{
    uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
}

static double f16_val(uint16_t u)
{
    int e = (u >> 10) & 31, m = u & 1023;
    double s = (u & 0x8000) ? -1.0 : 1.0;
    if (e == 31)
        return m ? NAN : s * INFINITY;
    return s * (e ? ldexp(1024 + m, e - 25) : ldexp(m, -24));
}

/* f32 x to bf16, to nearest even (finite and Inf; NaN stays NaN) */
static double bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x))
        return NAN;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return bf16_val((uint16_t)(u >> 16));
}

/* The variants an fp8 op is run in (fp8_variants(op) of them). */
enum { CV_TO, CV_F32, CV_BF16, CV_F16, CV_SR, CV_FROM_BF16, CV_CROSS, CV_SR_BF16, CV_N };
static const double fill_vals[] = {1.5, 300.7, -1e10, NAN, -0.0, 0x1p-12, 1e-3, -INFINITY};
static int fp8_variants(int op)
{
    return op == NT_OP_CAST ? CV_N
           : op == NT_OP_FILL ? (int)(sizeof fill_vals / sizeof fill_vals[0])
           : op == NT_OP_MATMUL ? 2 : 1;
}

/* Host values for input i: across fp8's whole range (subnormals of both
 * formats, the saturation and overflow edges, ties) and specials; finite
 * and moderate for a matmul's operands. */
static void fp8_host(int64_t n, int i, bool finite, float *h)
{
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f,
                               -480.0f, 57344.0f, 61440.0f, -61439.0f, 0x1p-10f, 0x1.8p-10f,
                               0x1p-17f, 0x1.8p-16f, 240.0f, 0x1.1p0f, 1e30f};
    for (int64_t k = 0; k < n; k++) {
        double u = frac((double)(k + 1 + 7 * i) * 0.6180339887);
        double w = frac((double)(k + 3 + 5 * i) * 0.7548776662);
        h[k] = (float)((u < 0.5 ? -1 : 1) * ldexp(1.0 + w, (int)(u * 1000) % 38 - 20));
        if (finite)
            h[k] = (float)((u * 8 - 4) * (1.0 + w));
        else if (k % 4 == 1)
            h[k] = sp[(k / 4 + i) % (int64_t)(sizeof sp / sizeof sp[0])];
    }
}

/* Input i with the values of pattern `pat` (fp8_host's i) */
static nt_tensor *fp8_input_pat(const spec *s, int i, int pat, bool finite)
{
    int64_t n = s->sh[i][0] * (s->nd[i] > 1 ? s->sh[i][1] : 1);
    float *h = malloc((size_t)n * sizeof(float));
    fp8_host(n, pat, finite, h);
    nt_tensor *t = nt_from_host(h, NT_F32, s->nd[i], (int64_t[]){s->sh[i][0], s->sh[i][1]});
    free(h);
    return t;
}

static nt_tensor *fp8_input(const spec *s, int i, bool finite)
{
    int64_t n = s->sh[i][0] * (s->nd[i] > 1 ? s->sh[i][1] : 1);
    float *h = malloc((size_t)n * sizeof(float));
    fp8_host(n, i, finite, h);
    nt_tensor *t = nt_from_host(h, NT_F32, s->nd[i], (int64_t[]){s->sh[i][0], s->sh[i][1]});
    free(h);
    return t;
}

/* op in variant v on format f; the inputs are f32 (x*1 when chained)
 * cast to f unless the variant casts into fp8 itself */
static nt_tensor *fp8_op(int op, const f8fmt *f, int v, nt_tensor **in, int n)
{
    nt_dtype other = f->dt == NT_E4M3 ? NT_E5M2 : NT_E4M3;
    if (op == NT_OP_FILL)
        return nt_full(f->dt, 2, (int64_t[]){4, 33}, fill_vals[v]);
    if (op == NT_OP_CAST)
        switch (v) {
        case CV_TO: return nt_cast(in[0], f->dt);
        case CV_SR: return nt_cast_sr(in[0], f->dt);
        case CV_FROM_BF16: return nt_cast(nt_cast(in[0], NT_BF16), f->dt);
        case CV_SR_BF16: return nt_cast_sr(nt_cast(in[0], NT_BF16), f->dt);
        case CV_CROSS: return nt_cast(nt_cast(in[0], other), f->dt);
        default: break;
        }
    nt_tensor *q[4];
    for (int i = 0; i < n; i++)
        q[i] = nt_cast(in[i], f->dt);
    if (op == NT_OP_CAST)
        return nt_cast(q[0], v == CV_F32 ? NT_F32 : v == CV_BF16 ? NT_BF16 : NT_F16);
    if (op == NT_OP_MATMUL)
        return nt_matmul_fp8(q[0], q[1], nt_full(NT_F32, 0, NULL, 0.5),
                             nt_full(NT_F32, 1, (int64_t[]){1}, -3.0), v ? NT_BF16 : NT_F32);
    return run_op(op, q);
}

/* run()'s counterpart for fp8: the current configuration */
static void run_fp8(int op, const f8fmt *f, int v, bool chain, result *r)
{
    memset(r, 0, sizeof *r);
    spec s = spec_of(op);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[4] = {0};
    for (int i = 0; i < s.n; i++) {
        in[i] = fp8_input(&s, i, op == NT_OP_MATMUL);
        if (chain)
            in[i] = nt_mul_scalar(in[i], 1.0);
    }
    nt_sync();
    nt_stats_reset();
    nt_tensor *y = fp8_op(op, f, v, in, s.n);
    if (chain && y)
        y = nt_mul_scalar(nt_cast(y, NT_F32), 2.0);
    if (y)
        y = nt_contiguous(y);
    if (!y || nt_sync()) {
        r->rc = nt_last_error() ? nt_last_error() : NT_EEXEC;
        snprintf(r->msg, sizeof r->msg, "%s", nt_last_error_message());
        nt_clear_error();
        nt_scope_end(sc);
        return;
    }
    r->dt = nt_dtype_of(y);
    r->nb = (size_t)nt_numel(y) * nt_dtype_size(r->dt);
    r->b = malloc(r->nb ? r->nb : 1);
    r->rc = nt_to_host(y, r->b, r->nb);
    nt_stats_get(&r->st);
    nt_scope_end(sc);
}

/* The fp8 chain (x*1, the variant, cast to f32, *2) captured on other
 * values (fp8_host's pattern i + 2), replayed on run_fp8's (bound to the
 * captured inputs): the replay's bits must be run_fp8's chained ones. */
static void run_fp8_captured(int op, const f8fmt *f, int v, result *r)
{
    memset(r, 0, sizeof *r);
    spec s = spec_of(op);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[4] = {0}, *in2[4] = {0}, *x1[4] = {0};
    for (int i = 0; i < s.n; i++) {
        in[i] = fp8_input_pat(&s, i, i + 2, op == NT_OP_MATMUL);
        in2[i] = fp8_input(&s, i, op == NT_OP_MATMUL);
    }
    nt_sync();
    assert_int_equal(nt_graph_capture_begin(), 0);
    char nm[16];
    for (int i = 0; i < s.n; i++) {
        snprintf(nm, sizeof nm, "in%d", i);
        assert_int_equal(nt_graph_input(in[i], nm), 0);
        x1[i] = nt_mul_scalar(in[i], 1.0);
    }
    nt_tensor *y = fp8_op(op, f, v, x1, s.n);
    nt_tensor *yy = y ? nt_contiguous(nt_mul_scalar(nt_cast(y, NT_F32), 2.0)) : NULL;
    nt_graph *g = nt_graph_capture_end();
    if (!g || !yy) {
        r->rc = nt_last_error() ? nt_last_error() : NT_EEXEC;
        snprintf(r->msg, sizeof r->msg, "capture: %s", nt_last_error_message());
        nt_clear_error();
    }
    for (int i = 0; g && i < s.n; i++) {
        snprintf(nm, sizeof nm, "in%d", i);
        assert_int_equal(nt_graph_bind(g, nm, in2[i]), 0);
    }
    if (g && (r->rc = nt_graph_replay(g)) == 0) {
        r->dt = nt_dtype_of(yy);
        r->nb = (size_t)nt_numel(yy) * nt_dtype_size(r->dt);
        r->b = malloc(r->nb ? r->nb : 1);
        r->rc = nt_to_host(yy, r->b, r->nb);
    }
    if (r->rc && !r->msg[0]) {
        snprintf(r->msg, sizeof r->msg, "%s", nt_last_error_message());
        nt_clear_error();
    }
    nt_graph_destroy(g);
    nt_scope_end(sc);
}

/* The value of element k of a plain (unchained) result of dtype dt */
static double elem_val(const result *r, const f8fmt *f, size_t k)
{
    if (r->dt == f->dt)
        return f8_decode(f, r->b[k]);
    if (r->dt == NT_F32) {
        float x;
        memcpy(&x, r->b + 4 * k, 4);
        return x;
    }
    uint16_t u;
    memcpy(&u, r->b + 2 * k, 2);
    return r->dt == NT_BF16 ? bf16_val(u) : f16_val(u);
}

/* The reference for a cast variant at input value x: the exact value
 * wanted, or for stochastic rounding (*lo, *hi) the two neighbours */
static double cast_ref(const f8fmt *f, int v, float x, double *alt)
{
    const f8fmt *o = &f8fmts[f->dt == NT_E4M3];
    *alt = NAN;
    double src = v == CV_FROM_BF16 || v == CV_SR_BF16 ? bf16_round(x) : (double)x;
    if (v == CV_CROSS)
        src = f8_decode(o, f8_encode(o, x));
    if (v == CV_SR || v == CV_SR_BF16) {
        /* the code at or below |x| and the next one up (saturating E4M3) */
        double ax = fabs(src), lo = 0, hi = INFINITY;
        for (int c = 0; c < 0x80; c++) {
            double d = f8_decode(f, (uint8_t)c);
            if (isnan(d))
                continue;
            if (d <= ax && d >= lo)
                lo = d;
            if (d >= ax && d < hi)
                hi = d;
        }
        if (!f->ieee && isinf(hi) && !isinf(ax))
            hi = f8_max(f);
        double sg = signbit(src) ? -1.0 : 1.0;
        if (isnan(src) || (isinf(src) && !f->ieee))
            return NAN;
        *alt = sg * hi;
        return sg * lo;
    }
    if (v == CV_F32 || v == CV_BF16 || v == CV_F16)
        return f8_decode(f, f8_encode(f, x)); /* the fp8 input's value, exact in each */
    uint8_t c = f8_encode(f, src);
    return c == 0xff ? NAN : f8_decode(f, c);
}

/* The plain CPU result r against the reference: the number of elements off */
static int64_t fp8_ref_bad(int op, const f8fmt *f, int v, const result *r, double *worst)
{
    spec s = spec_of(op);
    size_t n = r->nb / nt_dtype_size(r->dt);
    float *h[4] = {0};
    int64_t bad = 0;
    for (int i = 0; i < s.n; i++) {
        int64_t m = s.sh[i][0] * (s.nd[i] > 1 ? s.sh[i][1] : 1);
        h[i] = malloc((size_t)m * sizeof(float));
        fp8_host(m, i, op == NT_OP_MATMUL, h[i]);
    }
    if (op == NT_OP_FILL) {
        double want = f8_decode(f, f8_encode(f, fill_vals[v]));
        for (size_t k = 0; k < n; k++)
            bad += !same_val(elem_val(r, f, k), want);
    } else if (op == NT_OP_CAST) {
        for (size_t k = 0; k < n; k++) {
            double alt, want = cast_ref(f, v, h[0][k], &alt), got = elem_val(r, f, k);
            bad += !same_val(got, want) && !same_val(got, alt);
        }
    } else if (op == NT_OP_MATMUL) {
        /* f32 accumulation of exact fp8 products, K = 33: within
         * (K + 2) 2^-24 of sum |a b| |s|, bf16's rounding on top */
        for (size_t k = 0; k < n; k++) {
            int i = (int)(k / 5), j = (int)(k % 5);
            double acc = 0, mag = 0;
            for (int q = 0; q < 33; q++) {
                double a = f8_decode(f, f8_encode(f, h[0][i * 33 + q]));
                double b = f8_decode(f, f8_encode(f, h[1][q * 5 + j]));
                acc += a * b, mag += fabs(a * b);
            }
            double want = acc * -1.5, got = elem_val(r, f, k);
            double tol = 35 * 0x1p-24 * mag * 1.5 + (v ? 0x1p-8 * fabs(want) : 0) + 1e-30;
            double e = fabs(got - want) / tol;
            if (e > *worst)
                *worst = e;
            bad += !(e <= 1.0);
        }
    } else {
        /* data movement: the same op on f32 holding the inputs' fp8 values */
        nt_scope *sc = nt_scope_begin();
        nt_tensor *q[4];
        for (int i = 0; i < s.n; i++) {
            int64_t m = s.sh[i][0] * (s.nd[i] > 1 ? s.sh[i][1] : 1);
            for (int64_t k = 0; k < m; k++) {
                uint8_t c = f8_encode(f, h[i][k]);
                h[i][k] = c == 0xff ? NAN : (float)f8_decode(f, c);
            }
            q[i] = nt_from_host(h[i], NT_F32, s.nd[i], (int64_t[]){s.sh[i][0], s.sh[i][1]});
        }
        nt_tensor *y = nt_contiguous(run_op(op, q));
        float *yf = malloc(n * sizeof(float));
        if (!y || (size_t)nt_numel(y) != n || nt_to_host(y, yf, n * sizeof(float)))
            bad = (int64_t)n + 1;
        for (size_t k = 0; !bad && k < n; k++)
            bad += !same_val(elem_val(r, f, k), yf[k]);
        free(yf);
        nt_scope_end(sc);
    }
    for (int i = 0; i < s.n; i++)
        free(h[i]);
    return bad;
}

/* The configuration for a run.  A stochastic rounding's bits depend on
 * its record's sequence number (nt__rec_sr_key): a run that casts with
 * nt_cast_sr starts from a fresh runtime, so each run numbers its records
 * alike (as test_fp8.c's program runs do). */
static void fp8_config(int op, int v, const char *be, const char *mode, const char *fusion)
{
    if (op == NT_OP_CAST && (v == CV_SR || v == CV_SR_BF16)) {
        nt_shutdown();
        assert_int_equal(nt_init(), 0);
        assert_int_equal(nt_config_set("NT_SR_SEED", "4242"), 0);
    }
    config(be, mode, fusion);
}

/* one variant on one format: "" or why not */
static const char *fp8_case(int op, const f8fmt *f, int v, double *worst, uint64_t *groups)
{
    static char why[160];
    static const char *be[2] = {"cpu", "sim"};
    static const struct { const char *mode, *fusion; } modes[4] = {
        {"deterministic", "1"}, {"adaptive", "1"}, {"lazy", "1"}, {"eager", "0"}};
    result c, sm, ref;
    why[0] = 0;
    fp8_config(op, v, "cpu", "deterministic", "1");
    run_fp8(op, f, v, false, &c);
    fp8_config(op, v, "sim", "deterministic", "1");
    run_fp8(op, f, v, false, &sm);
    const char *w = diff(&c, &sm);
    if (*w)
        snprintf(why, sizeof why, "sim!=cpu: %s", w);
    else if (sm.st.cpu_fallbacks)
        snprintf(why, sizeof why, "sim ran on the CPU");
    else {
        int64_t bad = fp8_ref_bad(op, f, v, &c, worst);
        if (bad)
            snprintf(why, sizeof why, "%lld elements off the reference", (long long)bad);
    }
    fp8_config(op, v, "cpu", "deterministic", "1");
    run_fp8(op, f, v, true, &ref);
    for (int b = 0; b < 2 && !why[0]; b++)
        for (int m = 0; m < 4 && !why[0]; m++) {
            result g;
            fp8_config(op, v, be[b], modes[m].mode, modes[m].fusion);
            run_fp8(op, f, v, true, &g);
            w = diff(&ref, &g);
            if (*w)
                snprintf(why, sizeof why, "%s %s: %s", be[b], modes[m].mode, w);
            if (!strcmp(modes[m].mode, "lazy"))
                *groups += g.st.fusion_groups;
            result_free(&g);
        }
    /* captured (the "captured" column's fp8 part); not the stochastic
     * roundings: their bits are keyed by the records' sequence numbers,
     * which a replay draws where the step would run, not where a fresh
     * runtime's first run does */
    bool sr = op == NT_OP_CAST && (v == CV_SR || v == CV_SR_BF16);
    for (int b = 0; b < 2 && !why[0] && !sr; b++) {
        result g;
        fp8_config(op, v, be[b], "lazy", "1");
        run_fp8_captured(op, f, v, &g);
        w = diff(&ref, &g);
        if (*w)
            snprintf(why, sizeof why, "%s captured: %s", be[b], w);
        result_free(&g);
    }
    result_free(&c);
    result_free(&sm);
    result_free(&ref);
    return why;
}

/* the refusal: fp8 in input `pos` (-1: all of them) */
static const char *fp8_refused(int op, int pos)
{
    static char why[200];
    const nt__opinfo *I = &nt__ops[op];
    spec s = spec_of(op);
    config("cpu", "deterministic", "1");
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[4] = {0};
    for (int i = 0; i < s.n; i++) {
        in[i] = make_input(&s, i, NT_F32, V_GRID);
        if (pos < 0 || pos == i)
            in[i] = nt_cast(in[i], NT_E4M3);
    }
    nt_tensor *y;
    if (I->kind == NT_KIND_FILL)
        y = op == NT_OP_ARANGE ? nt_arange(NT_E5M2, 0, 4, 1)
            : op == NT_OP_RAND ? nt_rand(NT_E4M3, 1, (int64_t[]){4}, 1)
                               : nt_randn(NT_E4M3, 1, (int64_t[]){4}, 1);
    else if (op == NT_OP_WHERE)
        y = nt_where(nt_ones(NT_U8, 1, (int64_t[]){33}), in[0], in[1]);
    else if (op == NT_OP_MULTINOMIAL)
        y = nt_multinomial(in[0], 4, 1);
    else if (I->kind == NT_KIND_BWD) {
        /* internal: the record as the backward would make it */
        nt__call c;
        if (!nt__call_begin(&c, NT_HERE, I->api, op, s.n, in, "a,b,c,d"))
            y = nt__call_fail(&c);
        else {
            c.odt[0] = NT_F32;
            c.ondim[0] = in[0]->ndim;
            for (int i = 0; i < in[0]->ndim; i++)
                c.oshape[0][i] = in[0]->shape[i];
            y = nt__dispatch(&c);
        }
    } else
        y = run_op(op, in);
    int rc = y ? 0 : nt_last_error();
    const char *msg = nt_last_error_message();
    /* an int-only op refuses every float (NT_EDTYPE, as f32); fp8 next to
     * f32 may meet the check that the operands' dtypes agree first */
    bool code_ok = rc == NT_ENOTSUP ||
                   (rc == NT_EDTYPE && ((I->flags & NT_OPF_INTONLY) || pos >= 0));
    if (code_ok && strstr(msg, I->api) && (strstr(msg, "e4m3") || strstr(msg, "e5m2")))
        why[0] = 0;
    else
        snprintf(why, sizeof why, "fp8 in %d gave %s: %.80s", pos,
                 y ? "a result" : nt_strerror(rc), y ? "" : msg);
    nt_clear_error();
    nt_scope_end(sc);
    return why;
}

static void check_fp8(int op)
{
    const nt__opinfo *I = &nt__ops[op];
    if (!nt__dtype_op_ok(NT_E4M3, op, 0)) {
        spec s = spec_of(op);
        int n = I->kind == NT_KIND_FILL ? 0 : s.n;
        for (int pos = -1; pos < (n > 1 ? n : 0); pos++) {
            const char *w = fp8_refused(op, pos);
            if (*w) {
                cell(op, K_FP8, "FAIL %.66s", w);
                return;
            }
        }
        cell(op, K_FP8, "ok: refused, NT_ENOTSUP naming %s", I->api);
        return;
    }
    double worst = 0;
    uint64_t groups = 0;
    int nv = fp8_variants(op);
    for (int fi = 0; fi < 2; fi++)
        for (int v = 0; v < nv; v++) {
            const char *w = fp8_case(op, &f8fmts[fi], v, &worst, &groups);
            if (*w) {
                cell(op, K_FP8, "FAIL %s v%d %.56s", nt_dtype_name(f8fmts[fi].dt), v, w);
                return;
            }
        }
    /* the captured column: the fp8 runs replayed too (fp8_case) */
    if (!strncmp(cov[op][K_CAPT], "ok", 2))
        cell(op, K_CAPT, "ok; fp8: %s captured", op == NT_OP_MATMUL ? "nt_matmul_fp8"
                                                  : op == NT_OP_CAST ? "casts but SR"
                                                                     : "e4m3,e5m2");
    if (op == NT_OP_MATMUL) { /* and nt_matmul itself refuses fp8 */
        const char *w = fp8_refused(op, -1);
        if (*w) {
            cell(op, K_FP8, "FAIL nt_matmul: %.56s", w);
            return;
        }
        cell(op, K_FP8, "ok: nt_matmul_fp8 %.2f of the bound; nt_matmul refuses", worst);
        return;
    }
    cell(op, K_FP8, "ok: %d variant%s x e4m3,e5m2, modes, captured, exact ref%s", nv,
         nv > 1 ? "s" : "",
         groups ? "" : " (no fusion)");
}

/* ---------------- the tests ---------------- */

static void test_op(void **state)
{
    int op = (int)(intptr_t)*state;
    spec s = spec_of(op);
    result probe;
    config("cpu", "deterministic", "1");
    if (s.has_driver)
        run(op, dt_main(op), V_MIXED, false, &probe);
    if (!s.has_driver || probe.rc == NT_ENOTSUP) {
        for (int k = 0; k < NCHK; k++)
            cell(op, k, "FAIL: no driver");
        if (s.has_driver)
            result_free(&probe);
        fail_msg("op %s (kind %d) has no driver in tests/test_conformance.c", nt__ops[op].name,
                 (int)nt__ops[op].kind);
    }
    result_free(&probe);
    check_sim(op);
    check_chain(op);
    check_captured(op);
    check_grad(op);
    check_grad64(op);
    check_amp(op);
    check_int(op);
    check_ref(op);
    check_fp8(op);
    if (op_failed[op])
        fail_msg("op %s failed a conformance check (see above)", nt__ops[op].name);
}

/* UNARY_BWD with every forward op that has a derivative: sim == cpu */
static void test_every_derivative_sim_cpu(void **state)
{
    (void)state;
    int n = 0;
    for (int f = 0; f < NT_OP_COUNT; f++) {
        nt__opkind kd = nt__ops[f].kind;
        if ((kd != NT_KIND_UNARY && kd != NT_KIND_SCALAR) || (nt__ops[f].flags & NT_OPF_INTONLY))
            continue;
        grad_of_op = f;
        result c, s;
        config("cpu", "deterministic", "1");
        run(NT_OP_UNARY_BWD, NT_F32, V_MIXED, false, &c);
        config("sim", "deterministic", "1");
        run(NT_OP_UNARY_BWD, NT_F32, V_MIXED, false, &s);
        const char *w = diff(&c, &s);
        if (*w)
            fail_msg("derivative of %s: sim != cpu: %s", nt__ops[f].name, w);
        result_free(&c);
        result_free(&s);
        n++;
    }
    grad_of_op = NT_OP_SOFTPLUS;
    int nb = 0;
    static const int binary[] = {
#define T_BIN(ID, name, nin, kind, flags, ints, ...) NT__IF_FLOAT(ints, NT_OP_##ID,)
        NT_OPS_BINARY(T_BIN)
#undef T_BIN
    };
    for (size_t q = 0; q < sizeof binary / sizeof binary[0]; q++) {
        int f = binary[q];
        for (int which = 0; which < 2; which++) {
            partial_of_op = f;
            partial_which = which;
            result c, s;
            config("cpu", "deterministic", "1");
            run(NT_OP_BINARY_DX, NT_F32, V_MIXED, false, &c);
            config("sim", "deterministic", "1");
            run(NT_OP_BINARY_DX, NT_F32, V_MIXED, false, &s);
            const char *w = diff(&c, &s);
            if (*w)
                fail_msg("partial %d of %s: sim != cpu: %s", which, nt__ops[f].name, w);
            result_free(&c);
            result_free(&s);
            nb++;
        }
    }
    partial_of_op = NT_OP_DIV, partial_which = 1;
    print_message("# %d derivatives (nt__ew_<op>_dx), %d partials (_da, _db): sim == cpu\n", n,
                  nb);
}

/* The dispatcher's refusal names the function and the argument. */
static void test_int_only_error(void **state)
{
    (void)state;
    nt_tensor *x = nt_ones(NT_F32, 1, (int64_t[]){3});
    assert_null(nt_bitwise_not(x));
    assert_int_equal(nt_last_error(), NT_EDTYPE);
    assert_non_null(strstr(nt_last_error_message(), "nt_bitwise_not"));
    assert_non_null(strstr(nt_last_error_message(), "argument 't' is f32"));
    nt_clear_error();
    nt_tensor *i = nt_ones(NT_I32, 1, (int64_t[]){3});
    assert_null(nt_leaky_relu(i, 0.1));
    assert_int_equal(nt_last_error(), NT_EDTYPE);
    assert_non_null(strstr(nt_last_error_message(), "nt_leaky_relu"));
    nt_clear_error();
    assert_null(nt_hardtanh(x, 1.0, -1.0));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "min_val"));
    nt_clear_error();
    assert_null(nt_leaky_relu(x, NAN));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    nt_clear_error();
    nt_release(x);
    nt_release(i);
}

/* Every row of the tables expanded from core/optable.h is filled: the
 * _Static_asserts next to them see only a missing last row.  An op has a
 * name, a CPU kernel unless it is a view, a backward if it is
 * differentiable; a primitive only on an elementwise op, a reduction's
 * recipe only on a reduction. */
static void test_table_rows_filled(void **state)
{
    (void)state;
    for (int op = 0; op < NT_OP_COUNT; op++) {
        const nt__opinfo *I = &nt__ops[op];
        if (!I->name || !I->api)
            fail_msg("op id %d has no row in nt__ops (core/optable.c)", op);
        if (!nt__cpu_kernels[op] && I->kind != NT_KIND_VIEW)
            fail_msg("op %s has no CPU kernel (cpu/kernels.c)", I->name);
        if ((I->flags & NT_OPF_DIFF) && !nt__bwd_table[op].fn)
            fail_msg("op %s is differentiable but has no backward (autograd/backward.c)",
                     I->name);
        if (nt__op_prim(op) != NT__PRIM_NONE && I->kind != NT_KIND_UNARY &&
            I->kind != NT_KIND_SCALAR && I->kind != NT_KIND_BINARY)
            fail_msg("op %s has a primitive but is not elementwise", I->name);
        if ((I->flags & NT_OPF_REDUCTION) && I->kind != NT_KIND_REDUCE)
            fail_msg("op %s has a reduction recipe but is not a reduction", I->name);
    }
}

static void test_coverage_table(void **state)
{
    (void)state;
    int nfail = 0;
    printf("# coverage: op x check\n# %-14s", "op");
    for (int k = 0; k < NCHK; k++)
        printf(" | %s", chk_name[k]);
    printf("\n");
    for (int op = 0; op < NT_OP_COUNT; op++) {
        printf("# %-14s", nt__ops[op].name);
        for (int k = 0; k < NCHK; k++)
            printf(" | %s", cov[op][k][0] ? cov[op][k] : "FAIL: not run");
        printf("\n");
        nfail += op_failed[op] || !cov[op][0][0];
    }
    printf("# %d ops, %d failing\n", NT_OP_COUNT, nfail);
    assert_int_equal(nfail, 0);
}

/* The backwards, exactly: d sum(tril(x, -1) * w) / dx = tril(w, -1), the
 * same for triu, and masked_fill's is w where the mask is 0, +0 elsewhere. */
static void test_mask_backward(void **state)
{
    (void)state;
    static const char *be[2] = {"cpu", "sim"};
    enum { B = 2, R = 3, C = 4, N = B * R * C };
    float xv[N], wv[N], g[N];
    uint8_t mv[C] = {1, 0, 0, 1};
    for (int k = 0; k < N; k++)
        xv[k] = (float)k * 0.5f - 3.0f, wv[k] = (float)(k % 7) - 2.5f;
    for (int b = 0; b < 2; b++)
        for (int which = 0; which < 3; which++) {
            config(be[b], "deterministic", "1");
            nt_scope *sc = nt_scope_begin();
            nt_tensor *x = nt_from_host(xv, NT_F32, 3, (int64_t[]){B, R, C});
            nt_tensor *w = nt_from_host(wv, NT_F32, 3, (int64_t[]){B, R, C});
            nt_tensor *m = nt_from_host(mv, NT_U8, 1, (int64_t[]){C});
            nt_set_requires_grad(x, true);
            nt_tensor *y = which == 0   ? nt_tril(x, -1)
                           : which == 1 ? nt_triu(x, 1)
                                        : nt_masked_fill(x, m, 9.0);
            assert_int_equal(nt_backward(nt_sum(nt_mul(y, w), NT_DIM_ALL, false)), 0);
            assert_int_equal(nt_to_host(nt_grad(x), g, sizeof g), 0);
            for (int k = 0; k < N; k++) {
                int i = (k / C) % R, j = k % C;
                bool keep = which == 0 ? j - i <= -1 : which == 1 ? j - i >= 1 : !mv[j];
                float want = keep ? wv[k] : 0.0f;
                if (memcmp(&g[k], &want, sizeof want))
                    fail_msg("%s: %s grad[%d] = %g, expected %g", be[b],
                             which == 0 ? "tril" : which == 1 ? "triu" : "masked_fill", k,
                             (double)g[k], (double)want);
            }
            nt_scope_end(sc);
        }
}

static int setup(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    return 0;
}

/* The VIEW flag says which ops' results share input 0's storage (autograd
 * refuses in-place writes through those while they require grad): every
 * flagged op's result does, CAT's and FLIP's (new tensors, of the VIEW
 * kind for having no kernel) do not; ALIAS shares it unflagged (the same
 * value under a new handle, core/optable.h); no op of another kind is
 * flagged. */
static void test_view_flag(void **state)
{
    (void)state;
    for (int op = 0; op < NT_OP_COUNT; op++) {
        const nt__opinfo *I = &nt__ops[op];
        bool flag = (I->flags & NT_OPF_VIEW) != 0;
        if (I->kind != NT_KIND_VIEW) {
            if (flag)
                fail_msg("op %s has the VIEW flag but is not of the VIEW kind", I->name);
            continue;
        }
        spec sp = spec_of(op);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *in[4];
        for (int i = 0; i < sp.n; i++)
            in[i] = make_input(&sp, i, NT_F32, V_GRID);
        nt_tensor *y = run_op(op, in);
        if (!y || y == NO_DRIVER)
            fail_msg("op %s: no result (%s)", I->name, nt_last_error_message());
        bool shares = y->st == in[0]->st;
        if (shares != (flag || op == NT_OP_ALIAS))
            fail_msg("op %s: its result %s input 0's storage but the op %s the VIEW flag",
                     I->name, shares ? "shares" : "does not share", flag ? "has" : "lacks");
        assert_int_equal(nt_scope_end(sc), 0);
    }
}

/* The public composites (ops built of other ops) refuse fp8 as the table
 * ops do, naming themselves: none may widen it to f32 behind the caller's
 * back (docs/ops.md "fp8": cast first). */
static int fp8_refusal_bad(const char *fn, nt_tensor *r)
{
    const char *m = nt_last_error_message();
    bool ok = !r && nt_last_error() == NT_ENOTSUP && strstr(m, fn) &&
              (strstr(m, "e4m3") || strstr(m, "e5m2"));
    if (!ok)
        print_message("# %s on fp8 gave %s: %s\n", fn, r ? "a result" : nt_strerror(nt_last_error()),
                      r ? "" : m);
    nt_clear_error();
    return !ok;
}

static void test_fp8_composites_refused(void **state)
{
    (void)state;
    config("cpu", "deterministic", "1");
    nt_scope *sc = nt_scope_begin();
    int64_t sh[2] = {3, 4};
    nt_tensor *x = nt_cast(nt_ones(NT_F32, 2, sh), NT_E4M3);
    nt_tensor *x5 = nt_cast(nt_ones(NT_F32, 2, sh), NT_E5M2);
    int32_t lab[3] = {0, 3, 1};
    nt_tensor *y = nt_from_host(lab, NT_I32, 1, (int64_t[]){3});
    const int d1[1] = {1};
    int bad = 0;
    bad += fp8_refusal_bad("nt_prod", nt_prod(x, 1, false));
    bad += fp8_refusal_bad("nt_cumsum", nt_cumsum(x5, 0));
    bad += fp8_refusal_bad("nt_cumprod", nt_cumprod(x, 1));
    bad += fp8_refusal_bad("nt_var", nt_var(x, 1, d1, 1.0, false));
    bad += fp8_refusal_bad("nt_std", nt_std(x5, 1, d1, 0.0, true));
    bad += fp8_refusal_bad("nt_logsumexp", nt_logsumexp(x, 1, d1, false));
    bad += fp8_refusal_bad("nt_mean", nt_mean(x, 1, false));
    bad += fp8_refusal_bad("nt_norm", nt_norm(x, 2.0, 1, false));
    bad += fp8_refusal_bad("nt_cross_entropy_ex", nt_cross_entropy_ex(x, y, -100, 0.1));
    bad += fp8_refusal_bad("nt_nll_loss", nt_nll_loss(x, y, NULL, -100, NT_REDUCTION_MEAN));
    bad += fp8_refusal_bad("nt_l1_loss", nt_l1_loss(x, x, NT_REDUCTION_SUM));
    bad += fp8_refusal_bad("nt_mse_loss", nt_mse_loss(x5, x5));
    bad += fp8_refusal_bad("nt_softmax", nt_softmax(x, 1));
    bad += fp8_refusal_bad("nt_linear", nt_linear(x, x, NULL));
    assert_int_equal(nt_scope_end(sc), 0);
    assert_int_equal(bad, 0);
}

int main(void)
{
    static struct CMUnitTest tests[NT_OP_COUNT + 7];
    static char names[NT_OP_COUNT][48];
    int n = 0;
    for (int op = 0; op < NT_OP_COUNT; op++) {
        snprintf(names[op], sizeof names[op], "op_%s", nt__ops[op].name);
        tests[n++] = (struct CMUnitTest){names[op], test_op, NULL, NULL, (void *)(intptr_t)op};
    }
    tests[n++] = (struct CMUnitTest){"every_derivative_sim_cpu", test_every_derivative_sim_cpu,
                                     NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"int_only_error", test_int_only_error, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"mask_backward", test_mask_backward, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"table_rows_filled", test_table_rows_filled, NULL, NULL,
                                     NULL};
    tests[n++] = (struct CMUnitTest){"view_flag", test_view_flag, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"fp8_composites_refused", test_fp8_composites_refused,
                                     NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"coverage_table", test_coverage_table, NULL, NULL, NULL};
    return _cmocka_run_group_tests("conformance", tests, (size_t)n, setup, nt_test_teardown);
}
