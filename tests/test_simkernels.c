/* tests/test_simkernels.c - the simulator backend against the CPU backend.
 *
 * Every kernel of neuron/ must give the CPU kernel's bits for the same
 * record.  Each test builds the same program from the same host data twice,
 * once with NT_BACKEND=cpu and once with NT_BACKEND=sim (nt_config_set), and
 * compares every output byte for byte: every op, dtypes f32/bf16/f16 (and
 * i32/u8 where the op takes them), broadcasting, strided views, special
 * values (NaN, Inf, -0, subnormals), and awkward sizes (1, 127, 129, 513,
 * 2049, 4097 along the reduced or free dims).  Fused programs run on the
 * simulator against the CPU's fused executor, and the simulator's HBM byte
 * counts show what a fused kernel reads and writes.  Then the backend
 * switches (NT_REQUIRE_SIM, NT_MIN_SIM_FLOPS), user tile kernels and their
 * error paths, and shapes far beyond SBUF.
 *
 * NT_TEST_QUICK=1 shrinks the biggest shapes (for sanitizer builds). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/internal.h"
#include "cpu/cpu.h"
#include "neuron/sk.h"
#include "sim/sim.h"
#include "nt_test.h"

static bool quick;

static int setup(void **state)
{
    nt_test_setup(state);
    nt_config_set("NT_FUSION", "0");
    nt_config_set("NT_MODE", "adaptive");
    return 0;
}

/* ---------------- data ---------------- */

static uint64_t rs = 1;
static uint64_t rnd(void)
{
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uni(void) { return (double)(rnd() >> 11) * 0x1p-53; }

/* n random elements of dt; with `special`, some NaN, Inf, -0, 0 and
 * subnormals among them (floats), extremes (ints). */
static void *gen(nt_dtype dt, int64_t n, double scale, bool special)
{
    size_t es = nt_dtype_size(dt);
    void *p = malloc((size_t)(n > 0 ? n : 1) * es);
    for (int64_t i = 0; i < n; i++) {
        double v = (uni() * 2.0 - 1.0) * scale;
        if (special && rnd() % 13 == 0) {
            static const double sp[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 1e-40, -3e-39,
                                        65504.0, 1e30};
            v = sp[rnd() % 9];
        }
        switch (dt) {
        case NT_F32: ((float *)p)[i] = (float)v; break;
        case NT_BF16: ((uint16_t *)p)[i] = nt__f32_to_bf16((float)v); break;
        case NT_F16: ((uint16_t *)p)[i] = nt__f32_to_f16((float)v); break;
        case NT_I32: {
            int32_t x = (int32_t)(rnd() % 2001) - 1000;
            if (special && rnd() % 11 == 0)
                x = rnd() % 2 ? INT32_MAX : INT32_MIN;
            ((int32_t *)p)[i] = x;
            break;
        }
        case NT_U8: ((uint8_t *)p)[i] = (uint8_t)rnd(); break;
        default: break;
        }
    }
    return p;
}

static nt_tensor *T(nt_dtype dt, int ndim, const int64_t *shape, double scale, bool special)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    void *p = gen(dt, n, scale, special);
    nt_tensor *t = nt_from_host(p, dt, ndim, shape);
    free(p);
    return t;
}

/* ---------------- run on both backends and compare ---------------- */

#define MAXOUT 16
typedef void (*build_fn)(void *ctx, nt_tensor **out, int *nout);

typedef struct result {
    int n;
    void *data[MAXOUT];
    size_t bytes[MAXOUT];
    nt_dtype dt[MAXOUT];
    int err;
    char msg[512];
} result;

static void run(const char *backend, const char *mode, uint64_t seed, build_fn f, void *ctx,
                result *r)
{
    memset(r, 0, sizeof *r);
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    nt_clear_error();
    rs = seed;
    nt_scope *s = nt_scope_begin();
    nt_tensor *out[MAXOUT] = {0};
    int n = 0;
    f(ctx, out, &n);
    r->n = n;
    for (int i = 0; i < n; i++) {
        if (!out[i]) {
            r->err = nt_last_error();
            snprintf(r->msg, sizeof r->msg, "%s", nt_last_error_message());
            continue;
        }
        r->dt[i] = nt_dtype_of(out[i]);
        r->bytes[i] = (size_t)nt_numel(out[i]) * nt_dtype_size(r->dt[i]);
        r->data[i] = malloc(r->bytes[i] ? r->bytes[i] : 1);
        int rc = nt_to_host(out[i], r->data[i], r->bytes[i]);
        if (rc && !r->err) {
            r->err = rc;
            snprintf(r->msg, sizeof r->msg, "%s", nt_last_error_message());
        }
    }
    nt_scope_end(s);
    nt_sync();
    nt_clear_error();
}

static void free_result(result *r)
{
    for (int i = 0; i < r->n; i++)
        free(r->data[i]);
}

static double val_of(const void *p, nt_dtype dt, size_t i)
{
    return nt__load_f64(p, dt, (int64_t)i);
}

/* Builds the program on the CPU and on the simulator and compares bits. */
static void cmp_mode(const char *what, const char *mode, build_fn f, void *ctx)
{
    uint64_t seed = rnd();
    result a, b;
    run("cpu", mode, seed, f, ctx, &a);
    run("sim", mode, seed, f, ctx, &b);
    if (a.err || b.err) {
        if (a.err != b.err || strcmp(a.msg, b.msg) != 0)
            fail_msg("%s (%s): cpu error %d '%s', sim error %d '%s'", what, mode, a.err, a.msg,
                     b.err, b.msg);
    } else {
        assert_int_equal(a.n, b.n);
        for (int i = 0; i < a.n; i++) {
            assert_int_equal(a.dt[i], b.dt[i]);
            assert_int_equal(a.bytes[i], b.bytes[i]);
            if (memcmp(a.data[i], b.data[i], a.bytes[i]) == 0)
                continue;
            size_t es = nt_dtype_size(a.dt[i]);
            for (size_t j = 0; j * es < a.bytes[i]; j++)
                if (memcmp((char *)a.data[i] + j * es, (char *)b.data[i] + j * es, es)) {
                    fail_msg("%s (%s): output %d (%s) differs at element %zu: cpu %.9g sim %.9g",
                             what, mode, i, nt_dtype_name(a.dt[i]), j,
                             val_of(a.data[i], a.dt[i], j), val_of(b.data[i], b.dt[i], j));
                }
        }
    }
    free_result(&a);
    free_result(&b);
}

/* eager: every op its own kernel (fusion is off in setup) */
static void cmp(const char *what, build_fn f, void *ctx) { cmp_mode(what, "eager", f, ctx); }

static const nt_dtype FLOATS[] = {NT_F32, NT_BF16, NT_F16};
static const nt_dtype ALL[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};

/* ---------------- elementwise ---------------- */

typedef nt_tensor *(*un_fn)(nt_tensor *);
static const struct {
    const char *name;
    un_fn f;
    bool ints;
} UNARY[] = {
/* every unary op of core/optable.h with a float form (integer-only ones
 * run in tests/test_conformance.c) */
#define T_UNARY(ID, name, nin, kind, flags, ints, ...) NT__IF_FLOAT(ints, {#name, (nt_##name), true},)
    NT_OPS_UNARY(T_UNARY)
#undef T_UNARY
};

typedef struct ew_ctx {
    int op;
    nt_dtype dt, dt2;
    int ndim;
    int64_t shape[4];
    int variant;
    double s0, s1;
} ew_ctx;

/* an input of c's shape: contiguous, a transposed view, or a slice */
static nt_tensor *input(const ew_ctx *c, nt_dtype dt, bool special)
{
    if (c->variant == 1 && c->ndim == 2) {
        int64_t sh[2] = {c->shape[1], c->shape[0]};
        return nt_transpose(T(dt, 2, sh, 3.0, special), 0, 1);
    }
    if (c->variant == 2) {
        int64_t sh[4];
        memcpy(sh, c->shape, sizeof sh);
        sh[c->ndim - 1] = c->shape[c->ndim - 1] * 2 + 1;
        return nt_slice(T(dt, c->ndim, sh, 3.0, special), c->ndim - 1, 1, sh[c->ndim - 1], 2);
    }
    return T(dt, c->ndim, c->shape, 3.0, special);
}

static void b_unary(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    out[(*n)++] = UNARY[c->op].f(input(c, c->dt, true));
}

static const struct {
    int ndim;
    int64_t shape[4];
} SHAPES[] = {{0, {0}}, {1, {1}}, {1, {127}}, {1, {129}}, {2, {3, 513}}, {1, {2049}},
              {2, {129, 33}}, {3, {2, 3, 4097}}};

static void test_unary(void **state)
{
    (void)state;
    for (size_t op = 0; op < sizeof UNARY / sizeof *UNARY; op++)
        for (size_t d = 0; d < 5; d++)
            for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
                for (int v = 0; v < 3; v++) {
                    ew_ctx c = {.op = (int)op, .dt = ALL[d], .ndim = SHAPES[s].ndim,
                                .variant = v};
                    memcpy(c.shape, SHAPES[s].shape, sizeof c.shape);
                    if (v && c.ndim == 0)
                        continue;
                    if (v == 1 && c.ndim != 2)
                        continue;
                    char w[96];
                    snprintf(w, sizeof w, "%s %s shape#%zu variant %d", UNARY[op].name,
                             nt_dtype_name(c.dt), s, v);
                    cmp(w, b_unary, &c);
                }
}

static void b_scalar(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    nt_tensor *x = input(c, c->dt, true);
    switch (c->op) {
    case 0: out[(*n)++] = nt_add_scalar(x, c->s0); break;
    case 1: out[(*n)++] = nt_mul_scalar(x, c->s0); break;
    case 2: out[(*n)++] = nt_div_scalar(x, c->s0); break;
    case 3: out[(*n)++] = nt_pow_scalar(x, c->s0); break;
    case 4: out[(*n)++] = nt_clamp(x, c->s0, c->s1); break;
    default: {
        /* in place through a view */
        nt_tensor *y = nt_contiguous(nt_add_scalar(x, 0.0));
        nt_tensor *v = nt_slice(y, 0, 0, nt_shape(y, 0), 2);
        nt_clamp_inplace(v, c->s0, c->s1);
        nt_relu_inplace(v);
        nt_mul_scalar_inplace(y, c->s0);
        out[(*n)++] = y;
    }
    }
}

static void test_scalar(void **state)
{
    (void)state;
    const double sc[][2] = {{2.5, 7.0}, {-0.0, 0.0}, {16777217.0, -3.0}, {0.1, -0.1},
                            {-1e30, 1e30}, {3.0, -2.0}};
    for (int op = 0; op < 6; op++)
        for (size_t d = 0; d < 5; d++)
            for (size_t k = 0; k < sizeof sc / sizeof *sc; k++)
                for (int s = 1; s < 6; s += 2) {
                    ew_ctx c = {.op = op, .dt = ALL[d], .ndim = SHAPES[s].ndim, .s0 = sc[k][0],
                                .s1 = sc[k][1]};
                    memcpy(c.shape, SHAPES[s].shape, sizeof c.shape);
                    if (op == 5 && c.ndim == 0)
                        continue;
                    char w[96];
                    snprintf(w, sizeof w, "scalar op %d %s s=(%g, %g) shape#%d", op,
                             nt_dtype_name(c.dt), c.s0, c.s1, s);
                    cmp(w, b_scalar, &c);
                }
}

typedef nt_tensor *(*bin_fn)(nt_tensor *, nt_tensor *);
static const struct {
    const char *name;
    bin_fn f;
} BINARY[] = {{"add", (nt_add)},         {"sub", (nt_sub)}, {"mul", (nt_mul)},
              {"div", (nt_div)},         {"maximum", (nt_maximum)},
              {"minimum", (nt_minimum)}, {"eq", (nt_eq)},   {"ne", (nt_ne)},
              {"lt", (nt_lt)},           {"le", (nt_le)},   {"gt", (nt_gt)},
              {"ge", (nt_ge)}};

static void b_binary(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    nt_tensor *a, *b;
    switch (c->variant) {
    case 0: /* same shape */
        a = T(c->dt, 2, (int64_t[]){33, 129}, 3.0, true);
        b = T(c->dt2, 2, (int64_t[]){33, 129}, 3.0, true);
        break;
    case 1: /* [A, 1] with [1, B] */
        a = T(c->dt, 2, (int64_t[]){129, 1}, 3.0, true);
        b = T(c->dt2, 2, (int64_t[]){1, 513}, 3.0, true);
        break;
    case 2: /* a 0-d scalar with a transposed view */
        a = T(c->dt, 0, NULL, 3.0, false);
        b = nt_transpose(T(c->dt2, 2, (int64_t[]){65, 127}, 3.0, true), 0, 1);
        break;
    default: /* a row broadcast over a long tensor */
        a = T(c->dt, 3, (int64_t[]){2, 4097, 3}, 3.0, true);
        b = T(c->dt2, 1, (int64_t[]){3}, 3.0, true);
        break;
    }
    out[(*n)++] = BINARY[c->op].f(a, b);
    out[(*n)++] = nt_where(nt_gt(a, b), a, b);
}

static void test_binary_compare_where(void **state)
{
    (void)state;
    const nt_dtype pairs[][2] = {{NT_F32, NT_F32}, {NT_BF16, NT_BF16}, {NT_F16, NT_F16},
                                 {NT_I32, NT_I32}, {NT_U8, NT_U8},     {NT_F32, NT_BF16},
                                 {NT_BF16, NT_F16}, {NT_I32, NT_U8},   {NT_U8, NT_F32}};
    for (size_t op = 0; op < sizeof BINARY / sizeof *BINARY; op++)
        for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++)
            for (int v = 0; v < 4; v++) {
                ew_ctx c = {.op = (int)op, .dt = pairs[p][0], .dt2 = pairs[p][1], .variant = v};
                char w[96];
                snprintf(w, sizeof w, "%s %s,%s variant %d", BINARY[op].name,
                         nt_dtype_name(c.dt), nt_dtype_name(c.dt2), v);
                cmp(w, b_binary, &c);
            }
}

/* the backward helpers (relu_bwd ...) run inside backward passes */
static void b_bwd(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    nt_tensor *x = T(c->dt, 2, (int64_t[]){65, 257}, 4.0, true);
    nt_set_requires_grad(x, true);
    nt_tensor *y = UNARY[c->op].f(x);
    nt_tensor *g = T(c->dt, 2, (int64_t[]){65, 257}, 2.0, true);
    nt_tensor *l = nt_sum(nt_mul(y, g), NT_DIM_ALL, false);
    nt_backward(l);
    out[(*n)++] = nt_grad(x);
    nt_release(out[*n - 1]);
}

static void test_backward_helpers(void **state)
{
    (void)state;
    for (size_t op = 0; op < sizeof UNARY / sizeof *UNARY; op++)
        for (size_t d = 0; d < 3; d++) {
            ew_ctx c = {.op = (int)op, .dt = FLOATS[d]};
            char w[64];
            snprintf(w, sizeof w, "backward of %s %s", UNARY[op].name, nt_dtype_name(c.dt));
            cmp(w, b_bwd, &c);
        }
}

static void b_copy(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    nt_tensor *x = T(c->dt, 2, (int64_t[]){129, 33}, 300.0, true);
    out[(*n)++] = nt_cast(x, c->dt2);
    out[(*n)++] = nt_cast(nt_transpose(x, 0, 1), c->dt2);
    out[(*n)++] = nt_contiguous(nt_expand(nt_slice(x, 1, 3, 4, 1), 3, (int64_t[]){2, 129, 513}));
    nt_tensor *d = nt_zeros(c->dt2, 2, (int64_t[]){33, 129});
    nt_copy_into(d, nt_transpose(x, 0, 1));
    out[(*n)++] = d;
}

static void test_copy_cast(void **state)
{
    (void)state;
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 5; b++) {
            ew_ctx c = {.dt = ALL[a], .dt2 = ALL[b]};
            char w[64];
            snprintf(w, sizeof w, "cast %s -> %s", nt_dtype_name(c.dt), nt_dtype_name(c.dt2));
            cmp(w, b_copy, &c);
        }
}

static void b_fill(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t sh[2] = {129, 513};
    out[(*n)++] = nt_full(c->dt, 2, sh, c->s0);
    out[(*n)++] = nt_arange(c->dt, c->s1, c->s1 + 3000.0 * 0.37, 0.37);
    out[(*n)++] = nt_arange(c->dt, -7.0, 4100.0, 1.0);
    nt_tensor *v = nt_zeros(c->dt, 2, sh);
    nt_fill_inplace(nt_slice(v, 1, 1, 513, 3), c->s0);
    out[(*n)++] = v;
    if (nt__dtype_is_float(c->dt)) {
        out[(*n)++] = nt_rand(c->dt, 2, (int64_t[]){3, 4097}, 11);
        out[(*n)++] = nt_randn(c->dt, 1, (int64_t[]){5000}, 12);
        out[(*n)++] = nt_randn(c->dt, 0, NULL, 13);
    }
}

static void test_fill_arange_rand(void **state)
{
    (void)state;
    const double vals[] = {0.1, -1.0, 300.7, 1e10, -0.0, NAN, 1.00390625000001, 65519.9};
    for (size_t d = 0; d < 5; d++)
        for (size_t k = 0; k < sizeof vals / sizeof *vals; k++) {
            ew_ctx c = {.dt = ALL[d], .s0 = vals[k], .s1 = vals[k] * 0.5};
            if (isnan(c.s1))
                c.s1 = 0.5;
            char w[64];
            snprintf(w, sizeof w, "fill/arange/rand %s %g", nt_dtype_name(c.dt), vals[k]);
            cmp(w, b_fill, &c);
        }
}

/* ---------------- reductions ---------------- */

static const int64_t SIZES[] = {1, 127, 129, 513, 2049, 4097};

static void b_reduce(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t L = c->shape[0];
    nt_tensor *x = c->variant ? nt_transpose(T(c->dt, 2, (int64_t[]){L, 5}, 2.0, c->variant == 2), 0, 1)
                              : T(c->dt, 2, (int64_t[]){5, L}, 2.0, false);
    for (int dim = 0; dim < 2; dim++) {
        out[(*n)++] = nt_sum(x, dim, dim == 1);
        out[(*n)++] = nt_max(x, dim, false);
        out[(*n)++] = nt_argmax(x, dim, true);
        if (nt__dtype_is_float(c->dt))
            out[(*n)++] = nt_mean(x, dim, false);
    }
    out[(*n)++] = nt_sum(x, NT_DIM_ALL, false);
    out[(*n)++] = nt_max(x, NT_DIM_ALL, false);
    out[(*n)++] = nt_argmax(x, NT_DIM_ALL, false);
    if (nt__dtype_is_float(c->dt))
        out[(*n)++] = nt_mean(x, NT_DIM_ALL, true);
}

static void b_reduce_special(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t L = c->shape[0];
    /* rows of -0, rows with NaN, ties for argmax */
    float *h = malloc((size_t)(4 * L) * 4);
    for (int64_t j = 0; j < L; j++) {
        h[j] = -0.0f;
        h[L + j] = (float)(j % 7);
        h[2 * L + j] = (float)j;
        h[3 * L + j] = j == L / 2 ? NAN : 1.0f;
    }
    nt_tensor *x = nt_cast(nt_from_host(h, NT_F32, 2, (int64_t[]){4, L}), c->dt);
    free(h);
    out[(*n)++] = nt_sum(x, 1, false);
    out[(*n)++] = nt_max(x, 1, false);
    out[(*n)++] = nt_argmax(x, 1, false);
    out[(*n)++] = nt_argmax(x, 0, false);
    out[(*n)++] = nt_sum(nt_slice(x, 0, 0, 1, 1), NT_DIM_ALL, false);
}

static void test_reductions(void **state)
{
    (void)state;
    for (size_t d = 0; d < 5; d++)
        for (size_t s = 0; s < sizeof SIZES / sizeof *SIZES; s++)
            for (int v = 0; v < 3; v++) {
                ew_ctx c = {.dt = ALL[d], .variant = v, .shape = {SIZES[s]}};
                char w[64];
                snprintf(w, sizeof w, "reduce %s L=%lld variant %d", nt_dtype_name(c.dt),
                         (long long)SIZES[s], v);
                cmp(w, b_reduce, &c);
            }
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof SIZES / sizeof *SIZES; s++) {
            ew_ctx c = {.dt = FLOATS[d], .shape = {SIZES[s]}};
            cmp("reduce special values", b_reduce_special, &c);
        }
}

/* Sums over a strided dim whose neighbouring outputs are adjacent (bias and
 * norm-weight gradients: [B*T, C] over dim 0, [B, T, C] over dim 0): the
 * transposed path, in groups of 128 columns, 2048-position blocks through
 * PSUM banks and SBUF rows; partial groups, partial position tiles, several
 * blocks (4100), one bank (300), special values. */
static void b_colsum(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t R = c->shape[0], C = c->shape[1];
    nt_tensor *x = T(c->dt, 2, (int64_t[]){R, C}, 2.0, c->variant == 1);
    out[(*n)++] = nt_sum(x, 0, false);
    out[(*n)++] = nt_mean(x, 0, true);
    out[(*n)++] = nt_max(x, 0, false);
    out[(*n)++] = nt_min(x, 0, false);
    if (R % 4 == 0) /* the same rows as [4, R/4, C] over dim 0 */
        out[(*n)++] = nt_sum(nt_reshape(x, 3, (int64_t[]){4, R / 4, C}), 0, false);
}

static void test_column_reductions(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{2048, 384}, {2049, 300}, {300, 5},  {4100, 130},
                                        {513, 128},  {128, 640},  {1, 700}, {2048, 128}};
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int v = 0; v < 2; v++) {
                if (quick && shapes[i][0] * shapes[i][1] > 300000)
                    continue;
                ew_ctx c = {.dt = FLOATS[d], .variant = v, .shape = {shapes[i][0], shapes[i][1]}};
                char w[80];
                snprintf(w, sizeof w, "column sums %s [%lld, %lld] variant %d",
                         nt_dtype_name(c.dt), (long long)shapes[i][0], (long long)shapes[i][1], v);
                cmp(w, b_colsum, &c);
            }
}

/* ---------------- row ops and losses ---------------- */

static void b_rows(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t L = c->shape[0], R = c->shape[1];
    nt_tensor *x = c->variant ? nt_transpose(T(c->dt, 2, (int64_t[]){L, R}, 4.0, true), 0, 1)
                              : T(c->dt, 2, (int64_t[]){R, L}, 4.0, c->variant == 0 && L < 200);
    out[(*n)++] = nt_softmax(x, -1);
    out[(*n)++] = nt_log_softmax(x, -1);
    out[(*n)++] = nt_softmax(x, 0);
    nt_tensor *w = T(c->dt, 1, (int64_t[]){L}, 1.0, false), *b = T(c->dt, 1, (int64_t[]){L}, 1.0, false);
    out[(*n)++] = nt_layer_norm(x, w, b, 1e-5);
    out[(*n)++] = nt_layer_norm(x, NULL, NULL, 0.0);
    out[(*n)++] = nt_rms_norm(x, w, 1e-6);
    out[(*n)++] = nt_rms_norm(x, NULL, 1e-6);
    /* labels in i32 and u8 */
    int32_t *lab = malloc((size_t)R * 4);
    uint8_t *lab8 = malloc((size_t)R);
    for (int64_t i = 0; i < R; i++) {
        lab[i] = (int32_t)(rnd() % (uint64_t)L);
        lab8[i] = (uint8_t)(lab[i] % 256 < L ? lab[i] % 256 : 0);
    }
    nt_tensor *li = nt_from_host(lab, NT_I32, 1, (int64_t[]){R});
    nt_tensor *l8 = nt_from_host(lab8, NT_U8, 1, (int64_t[]){R});
    free(lab);
    free(lab8);
    out[(*n)++] = nt_cross_entropy(x, li);
    out[(*n)++] = nt_cross_entropy(x, l8);
    nt_tensor *y = T(c->dt2, 2, (int64_t[]){R, L}, 4.0, false);
    out[(*n)++] = nt_mse_loss(x, y);
}

static void test_rows(void **state)
{
    (void)state;
    const int64_t Ls[] = {1, 127, 129, 513, 2049, 4097, 9001};
    const int64_t Rs[] = {1, 3, 129};
    for (size_t d = 0; d < 3; d++)
        for (size_t l = 0; l < sizeof Ls / sizeof *Ls; l++)
            for (size_t r = 0; r < 3; r++)
                for (int v = 0; v < 2; v++) {
                    if (Ls[l] * Rs[r] > 300000)
                        continue;
                    ew_ctx c = {.dt = FLOATS[d], .dt2 = FLOATS[(d + 1) % 3],
                                .shape = {Ls[l], Rs[r]}, .variant = v};
                    char w[80];
                    snprintf(w, sizeof w, "rows %s L=%lld R=%lld variant %d", nt_dtype_name(c.dt),
                             (long long)Ls[l], (long long)Rs[r], v);
                    cmp(w, b_rows, &c);
                }
}

static void b_xent_long(void *ctx, nt_tensor **out, int *n)
{
    (void)ctx;
    /* more rows than one canonical block of losses */
    int64_t R = 2049 + 129, C = 10;
    nt_tensor *x = T(NT_F32, 2, (int64_t[]){R, C}, 3.0, false);
    int32_t *lab = malloc((size_t)R * 4);
    for (int64_t i = 0; i < R; i++)
        lab[i] = (int32_t)(rnd() % (uint64_t)C);
    nt_tensor *l = nt_from_host(lab, NT_I32, 1, (int64_t[]){R});
    free(lab);
    out[(*n)++] = nt_cross_entropy(x, l);
    out[(*n)++] = nt_cross_entropy(nt_transpose(nt_transpose(x, 0, 1), 0, 1), nt_slice(
                                       nt_cat((nt_tensor *[]){l, l}, 2, 0), 0, 0, 2 * R, 2));
}

static void test_cross_entropy_rows(void **state)
{
    (void)state;
    cmp("cross_entropy over 2178 rows", b_xent_long, NULL);
}

/* ---------------- matmul ---------------- */

typedef struct mm_ctx {
    nt_dtype dt;
    int64_t M, K, N;
    int variant;
} mm_ctx;

static void b_matmul(void *ctx, nt_tensor **out, int *n)
{
    mm_ctx *c = ctx;
    int64_t M = c->M, K = c->K, N = c->N;
    nt_tensor *a, *b;
    switch (c->variant) {
    case 0:
        a = T(c->dt, 2, (int64_t[]){M, K}, 1.0, false);
        b = T(c->dt, 2, (int64_t[]){K, N}, 1.0, false);
        break;
    case 1: /* both transposed views */
        a = nt_transpose(T(c->dt, 2, (int64_t[]){K, M}, 1.0, false), 0, 1);
        b = nt_transpose(T(c->dt, 2, (int64_t[]){N, K}, 1.0, false), 0, 1);
        break;
    case 2: /* batched with broadcast */
        a = T(c->dt, 3, (int64_t[]){3, M, K}, 1.0, false);
        b = T(c->dt, 4, (int64_t[]){2, 1, K, N}, 1.0, false);
        break;
    case 4: /* batched, B a transposed view (q @ k^T): B^T tiles transposed in SBUF */
        a = T(c->dt, 3, (int64_t[]){2, M, K}, 1.0, false);
        b = nt_transpose(T(c->dt, 3, (int64_t[]){2, N, K}, 1.0, false), 1, 2);
        break;
    default: /* strided columns (every other) */
        a = nt_slice(T(c->dt, 2, (int64_t[]){M, 2 * K}, 1.0, false), 1, 0, 2 * K, 2);
        b = nt_slice(T(c->dt, 2, (int64_t[]){K, 2 * N}, 1.0, false), 1, 1, 2 * N, 2);
        break;
    }
    out[(*n)++] = nt_matmul(a, b);
    if (c->variant == 0) {
        nt_tensor *v = T(c->dt, 1, (int64_t[]){K}, 1.0, false);
        out[(*n)++] = nt_matmul(v, b);
        out[(*n)++] = nt_matmul(a, v);
        out[(*n)++] = nt_matmul(v, v);
        nt_tensor *w = T(c->dt, 2, (int64_t[]){N, K}, 1.0, false);
        out[(*n)++] = nt_linear(a, w, T(c->dt, 1, (int64_t[]){N}, 1.0, false));
    }
}

static void matmul_all(void)
{
    const int64_t dims[][3] = {{1, 1, 1},     {3, 5, 7},     {127, 129, 33}, {129, 127, 513},
                               {2, 257, 515}, {130, 0, 9},   {64, 300, 1},   {513, 129, 65}};
    for (size_t d = 0; d < 3; d++)
        for (size_t k = 0; k < sizeof dims / sizeof *dims; k++)
            for (int v = 0; v < 5; v++) {
                mm_ctx c = {FLOATS[d], dims[k][0], dims[k][1], dims[k][2], v};
                if ((v == 2 || v == 4) && dims[k][0] * dims[k][1] * dims[k][2] > 3000000)
                    continue;
                char w[80];
                snprintf(w, sizeof w, "matmul %s %lldx%lldx%lld variant %d", nt_dtype_name(c.dt),
                         (long long)c.M, (long long)c.K, (long long)c.N, v);
                cmp(w, b_matmul, &c);
            }
}

static void test_matmul(void **state)
{
    (void)state;
    matmul_all();
}

/* The matmul tile program computes its product once per program by default
 * (NT_SIM_PROGRAM_GEMM, neuron/tp_matmul.c); with that off, every nc_matmul
 * computes its own block from the SBUF tiles the program loaded, transposed
 * and accumulated.  Both must give the CPU's bits: this run checks the tile
 * program's data flow itself, the default run only its timing. */
static void b_fused(void *ctx, nt_tensor **out, int *n);

static void test_matmul_instruction_level(void **state)
{
    (void)state;
    nt__sim_set_program_gemm(false);
    matmul_all();
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    for (size_t d = 0; d < 3; d++) {
        ew_ctx c = {.dt = FLOATS[d]};
        cmp_mode("fused programs, instruction-level matmul", "lazy", b_fused, &c);
    }
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
    nt__sim_set_program_gemm(true);
}

/* Values once per program (NT_SIM_PROGRAM_VALUES=1, the default outside the
 * tests) against every instruction computing its own: the same bits, and
 * the same simulated kernels -- instructions, time, HBM bytes -- since only
 * where the values come from changes, not the program.  Eager single ops,
 * fused elementwise/row/matmul programs, and a refused-then-replayed path
 * (nothing computed twice: an in-place update would show it). */
static void b_values(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    nt_tensor *x = T(c->dt, 2, (int64_t[]){130, 515}, 2.0, true);
    nt_tensor *w = T(c->dt, 2, (int64_t[]){200, 515}, 1.0, false);
    nt_tensor *b = T(c->dt, 1, (int64_t[]){200}, 1.0, false);
    out[(*n)++] = nt_relu(nt_linear(x, w, b));                  /* fused.mm */
    out[(*n)++] = nt_softmax(nt_mul_scalar(x, 0.5), -1);        /* fused.row or rows */
    out[(*n)++] = nt_sqrt(nt_add_scalar(nt_mul(x, x), 1e-3));   /* fused.ew */
    out[(*n)++] = nt_matmul(x, nt_transpose(w, 0, 1));          /* matmul, B^T */
    nt_tensor *acc = nt_zeros(c->dt, 2, (int64_t[]){130, 515});
    for (int i = 0; i < 3; i++) /* in place: applied exactly once per call */
        assert_int_equal(nt_copy_into(acc, nt_add_scalar(nt_mul_scalar(acc, 0.5), 1.0)), 0);
    out[(*n)++] = acc;
    /* row, reduction, loss and attention kernels (eager: not fused) */
    out[(*n)++] = nt_layer_norm(x, NULL, NULL, 1e-5);
    out[(*n)++] = nt_log_softmax(x, 0);
    out[(*n)++] = nt_sum(x, 0, false);
    out[(*n)++] = nt_argmax(x, 1, false);
    out[(*n)++] = nt_mse_loss(x, nt_mul_scalar(x, 0.5));
    int32_t lab[130];
    for (int i = 0; i < 130; i++)
        lab[i] = (i * 37) % 515;
    if (c->variant) /* a label out of range: the same error both ways */
        lab[77] = 515;
    nt_tensor *y = nt_from_host(lab, NT_I32, 1, (int64_t[]){130});
    out[(*n)++] = nt_cross_entropy(x, y);
    nt_tensor *q = T(c->dt, 4, (int64_t[]){1, 2, 130, 16}, 1.0, true);
    nt_tensor *k = T(c->dt, 4, (int64_t[]){1, 2, 140, 16}, 1.0, true);
    nt_tensor *v = T(c->dt, 4, (int64_t[]){1, 2, 140, 8}, 1.0, true);
    nt_tensor *o = nt_scaled_dot_product_attention(q, k, v, NULL, true, 0.0);
    out[(*n)++] = o;
    if (o && nt_backward(nt_sum(nt_mul(o, o), NT_DIM_ALL, false)) == 0) {
        out[(*n)++] = nt_grad(q);
        nt_release(out[*n - 1]);
        out[(*n)++] = nt_grad(v);
        nt_release(out[*n - 1]);
    }
}

static void values_run(bool pv, const char *mode, ew_ctx *c, result *r, nt_sim_stats *st)
{
    nt__sim_set_program_values(pv);
    nt_sync();
    nt_sim_stats_reset();
    run("sim", mode, 12345, b_values, c, r);
    nt_sync();
    assert_int_equal(nt_sim_stats_get(st), 0);
}

static void test_program_values(void **state)
{
    (void)state;
    bool pv0 = nt__sim_program_values();
    static const char *modes[] = {"eager", "lazy"};
    for (size_t d = 0; d < 3; d++)
        for (int m = 0; m < 2; m++) {
            ew_ctx c = {.dt = FLOATS[d], .variant = d == 0 && m == 0 ? 1 : 0};
            assert_int_equal(nt_config_set("NT_FUSION", m ? "1" : "0"), 0);
            result a, b;
            nt_sim_stats sa, sb;
            values_run(false, modes[m], &c, &a, &sa);
            values_run(true, modes[m], &c, &b, &sb);
            if (c.variant) { /* the bad label: the same error, the same words */
                assert_int_not_equal(a.err, 0);
                assert_int_equal(a.err, b.err);
                assert_string_equal(a.msg, b.msg);
                free_result(&a);
                free_result(&b);
                c.variant = 0;
                values_run(false, modes[m], &c, &a, &sa);
                values_run(true, modes[m], &c, &b, &sb);
            }
            assert_int_equal(a.err, 0);
            assert_int_equal(b.err, 0);
            assert_int_equal(a.n, b.n);
            for (int i = 0; i < a.n; i++) {
                assert_int_equal(a.bytes[i], b.bytes[i]);
                if (memcmp(a.data[i], b.data[i], a.bytes[i]))
                    fail_msg("program values, %s %s: output %d differs", nt_dtype_name(c.dt),
                             modes[m], i);
            }
            assert_true(sa.kernels > 0);
            if (sa.instructions != sb.instructions || sa.sim_ns != sb.sim_ns)
                fail_msg("program values, %s %s: %llu instructions %.1f ns against %llu, %.1f ns",
                         nt_dtype_name(c.dt), modes[m], (unsigned long long)sb.instructions,
                         sb.sim_ns, (unsigned long long)sa.instructions, sa.sim_ns);
            assert_int_equal(sa.kernels, sb.kernels);
            assert_int_equal(sa.instructions, sb.instructions);
            assert_int_equal(sa.hbm_read_bytes, sb.hbm_read_bytes);
            assert_int_equal(sa.hbm_write_bytes, sb.hbm_write_bytes);
            assert_true(sa.sim_ns == sb.sim_ns);
            free_result(&a);
            free_result(&b);
        }
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
    nt__sim_set_program_values(pv0);
}

/* ---------------- the timing memo (neuron/runtime.c) ---------------- */

/* Every figure a kernel's timing feeds, bit for bit (clock_ns: the clock only
 * moves forward, so it is compared as durations by the callers). */
static void same_stats(const nt_sim_stats *a, const nt_sim_stats *b, const char *what)
{
    if (a->kernels != b->kernels || a->instructions != b->instructions ||
        a->errors != b->errors || a->hbm_read_bytes != b->hbm_read_bytes ||
        a->hbm_write_bytes != b->hbm_write_bytes ||
        memcmp(&a->sim_ns, &b->sim_ns, sizeof a->sim_ns) ||
        memcmp(&a->flops, &b->flops, sizeof a->flops) ||
        memcmp(&a->tensor_ideal_ns, &b->tensor_ideal_ns, sizeof a->tensor_ideal_ns) ||
        memcmp(a->busy_ns, b->busy_ns, sizeof a->busy_ns) ||
        memcmp(a->dma_queue_busy_ns, b->dma_queue_busy_ns, sizeof a->dma_queue_busy_ns))
        fail_msg("timing memo, %s: %llu kernels %llu instructions %a ns (TensorE %a, DMA %a) "
                 "against %llu, %llu, %a ns (%a, %a)",
                 what, (unsigned long long)b->kernels, (unsigned long long)b->instructions,
                 b->sim_ns, b->busy_ns[NT_ENGINE_TENSOR], b->busy_ns[NT_ENGINE_DMA],
                 (unsigned long long)a->kernels, (unsigned long long)a->instructions, a->sim_ns,
                 a->busy_ns[NT_ENGINE_TENSOR], a->busy_ns[NT_ENGINE_DMA]);
}

static void same_results(const result *a, const result *b, const char *what)
{
    assert_int_equal(a->err, 0);
    assert_int_equal(b->err, 0);
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        assert_int_equal(a->bytes[i], b->bytes[i]);
        if (memcmp(a->data[i], b->data[i], a->bytes[i]))
            fail_msg("timing memo, %s: output %d differs", what, i);
    }
}

/* The values-once programs of b_values (matmul, fused EW/ROW/MM, rows,
 * reductions, attention and its backward) run three times: memo off, memo on
 * from empty (programs filed), memo on again (restored): the same values and
 * every timing figure bit for bit, and the third run issues nothing new. */
static void test_timing_memo(void **state)
{
    (void)state;
    bool pv0 = nt__sim_program_values();
    static const char *modes[] = {"eager", "lazy"};
    for (size_t d = 0; d < 3; d++)
        for (int m = 0; m < 2; m++) {
            ew_ctx c = {.dt = FLOATS[d]};
            char what[64];
            snprintf(what, sizeof what, "%s %s", nt_dtype_name(c.dt), modes[m]);
            assert_int_equal(nt_config_set("NT_FUSION", m ? "1" : "0"), 0);
            result a, b, r3;
            nt_sim_stats sa, sb, s3;
            uint64_t hb, fb, h0, f0, h1, f1, h2, f2;
            nt__sk_memo_counts(&hb, &fb);
            nt__sk_memo_set(false);
            values_run(true, modes[m], &c, &a, &sa);
            nt__sk_memo_counts(&h0, &f0);
            nt__sk_memo_set(true);
            nt__sk_memo_clear();
            values_run(true, modes[m], &c, &b, &sb);
            nt__sk_memo_counts(&h1, &f1);
            values_run(true, modes[m], &c, &r3, &s3);
            nt__sk_memo_counts(&h2, &f2);
            assert_int_equal(h0, hb); /* memo off: nothing looked up or filed */
            assert_int_equal(f0, fb);
            assert_true(f1 > f0 + 5);
            assert_int_equal(f2, f1);        /* nothing new the second time ... */
            assert_true(h2 - h1 >= f1 - f0); /* ... every filed program restored */
            same_results(&a, &b, what);
            same_results(&a, &r3, what);
            same_stats(&sa, &sb, what);
            same_stats(&sa, &s3, what);
            free_result(&a);
            free_result(&b);
            free_result(&r3);
        }
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
    nt__sim_set_program_values(pv0);
}

/* A fused AdamW-like update over three steps whose scalars (a learning-rate
 * schedule, bias corrections) change every step: one program, filed at the
 * first step and restored at the next two, with the memo-off values and
 * figures bit for bit. */
static void memo_adamw_steps(bool memo, result *r, nt_sim_stats *st, uint64_t *hits,
                             uint64_t *filed)
{
    nt__sk_memo_set(memo);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    rs = 99;
    memset(r, 0, sizeof *r);
    nt_scope *sc = nt_scope_begin();
    int64_t sh[2] = {200, 300};
    nt_tensor *p = T(NT_F32, 2, sh, 1.0, false), *g = T(NT_F32, 2, sh, 1.0, true);
    nt_tensor *m = nt_zeros(NT_F32, 2, sh), *v = nt_zeros(NT_F32, 2, sh);
    nt_sync();
    nt_sim_stats_reset();
    uint64_t h0, f0;
    nt__sk_memo_counts(&h0, &f0);
    for (int t = 1; t <= 3; t++) {
        double lr = 1e-3 * t / 3.0, b1 = 1.0 - pow(0.9, t), b2 = 1.0 - pow(0.999, t);
        nt_tensor *m2 = nt_add(nt_mul_scalar(m, 0.9), nt_mul_scalar(g, 0.1));
        nt_tensor *v2 = nt_add(nt_mul_scalar(v, 0.999), nt_mul_scalar(nt_mul(g, g), 0.001));
        nt_tensor *upd = nt_div(nt_mul_scalar(m2, lr / b1),
                                nt_add_scalar(nt_sqrt(nt_mul_scalar(v2, 1.0 / b2)), 1e-8));
        assert_int_equal(nt_copy_into(m, m2), 0);
        assert_int_equal(nt_copy_into(v, v2), 0);
        assert_int_equal(nt_copy_into(p, nt_sub(p, upd)), 0);
        nt_sync();
    }
    assert_int_equal(nt_sim_stats_get(st), 0);
    nt__sk_memo_counts(hits, filed);
    *hits -= h0;
    *filed -= f0;
    nt_tensor *outs[3] = {p, m, v};
    r->n = 3;
    for (int i = 0; i < 3; i++) {
        r->bytes[i] = (size_t)nt_numel(outs[i]) * 4;
        r->data[i] = malloc(r->bytes[i]);
        assert_int_equal(nt_to_host(outs[i], r->data[i], r->bytes[i]), 0);
    }
    nt_scope_end(sc);
    nt_sync();
}

static void test_timing_memo_scalars(void **state)
{
    (void)state;
    bool pv0 = nt__sim_program_values();
    nt__sim_set_program_values(true);
    result a, b;
    nt_sim_stats sa, sb;
    uint64_t h, f;
    memo_adamw_steps(false, &a, &sa, &h, &f);
    assert_int_equal(h + f, 0);
    nt__sk_memo_clear();
    memo_adamw_steps(true, &b, &sb, &h, &f);
    assert_true(sa.kernels >= 3);
    assert_int_equal(sa.kernels % 3, 0); /* the same kernels every step */
    assert_int_equal(f, sa.kernels / 3); /* filed at the first ... */
    assert_int_equal(h, 2 * f);          /* ... restored at the others */
    same_results(&a, &b, "AdamW steps");
    same_stats(&sa, &sb, "AdamW steps");
    free_result(&a);
    free_result(&b);
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
    nt__sim_set_program_values(pv0);
}

/* One op per kernel (eager), each variant differing from the first in one
 * thing the key must see: a hit across them would restore the wrong timing. */
static nt_tensor *memo_variant(int v, nt_tensor *x, nt_tensor *y, nt_tensor *big, nt_tensor *w,
                               nt_tensor *big2)
{
    switch (v) {
    case 0: return nt_add(x, y);                                        /* the base */
    case 1: return nt_add(x, x);                                        /* one tensor twice */
    case 2: return nt_add(nt_transpose(nt_slice(big, 0, 0, 300, 1), 0, 1), y); /* strides */
    case 3: return nt_add(nt_slice(big, 0, 1, 257, 1), nt_slice(big, 0, 0, 256, 1)); /* offsets */
    case 4: return nt_add(nt_reshape(x, 2, (int64_t[]){300, 256}),
                          nt_reshape(y, 2, (int64_t[]){300, 256}));     /* shape */
    case 5: return nt_mul_scalar(x, 0.5);
    case 6: return nt_exp(x);                                           /* op */
    case 7: return nt_sum(x, 0, false);
    case 8: return nt_sum(x, 1, false);                                 /* dim */
    case 9: return nt_matmul(x, w);
    case 10: return nt_matmul(x, nt_transpose(nt_transpose(w, 0, 1), 0, 1)); /* same */
    case 11: return nt_layer_norm(x, NULL, NULL, 1e-5);
    case 12: return nt_cast(x, NT_BF16);                                /* dtype */
    case 13: {                                           /* in place: out is in[0] */
        nt_tensor *z = nt_add_scalar(x, 1.0);
        assert_int_equal(nt_add_inplace(z, y), 0);
        return z;
    }
    case 14: /* 3 with its second operand in another storage */
        return nt_add(nt_slice(big, 0, 1, 257, 1), nt_slice(big2, 0, 0, 256, 1));
    case 15: /* 5's program with another scalar (an immediate): restored */
        return nt_mul_scalar(x, -0.25);
    default: return NULL;
    }
}
#define MEMO_VARIANTS 16

static void memo_pass(nt_sim_stats *st, nt_tensor *x, nt_tensor *y, nt_tensor *big,
                      nt_tensor *w, nt_tensor *big2, result *r)
{
    for (int v = 0; v < MEMO_VARIANTS; v++) {
        nt_sync();
        nt_sim_stats_reset();
        nt_tensor *o = memo_variant(v, x, y, big, w, big2);
        assert_non_null(o);
        nt_sync();
        assert_int_equal(nt_sim_stats_get(&st[v]), 0);
        r->bytes[v] = (size_t)nt_numel(o) * nt_dtype_size(nt_dtype_of(o));
        r->data[v] = malloc(r->bytes[v]);
        assert_int_equal(nt_to_host(o, r->data[v], r->bytes[v]), 0);
        nt_release(o);
    }
    r->n = MEMO_VARIANTS;
}

static void test_timing_memo_keys(void **state)
{
    (void)state;
    bool pv0 = nt__sim_program_values();
    nt__sim_set_program_values(true);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    rs = 77;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = T(NT_F32, 2, (int64_t[]){256, 300}, 1.0, true);
    nt_tensor *y = T(NT_F32, 2, (int64_t[]){256, 300}, 1.0, true);
    nt_tensor *big = T(NT_F32, 2, (int64_t[]){300, 256}, 1.0, false);
    big = nt_add_scalar(nt_cat((nt_tensor *[]){big, big}, 2, 0), 0.0); /* [600, 256] */
    nt_tensor *w = T(NT_F32, 2, (int64_t[]){300, 200}, 1.0, false);
    nt_tensor *big2 = nt_add_scalar(big, 0.0);
    nt_sync();
    for (int t = 0; t < 2; t++) { /* trn1, then trn2: the target is in the key too */
        nt_sim_stats off[MEMO_VARIANTS], on1[MEMO_VARIANTS], on2[MEMO_VARIANTS];
        result ro, r1, r2;
        memset(&ro, 0, sizeof ro);
        memset(&r1, 0, sizeof r1);
        memset(&r2, 0, sizeof r2);
        nt__sk_memo_set(false);
        memo_pass(off, x, y, big, w, big2, &ro);
        nt__sk_memo_set(true);
        if (t == 0)
            nt__sk_memo_clear(); /* trn2 starts with trn1's programs filed */
        uint64_t h0, f0, h1, f1, h2, f2;
        nt__sk_memo_counts(&h0, &f0);
        memo_pass(on1, x, y, big, w, big2, &r1);
        nt__sk_memo_counts(&h1, &f1);
        memo_pass(on2, x, y, big, w, big2, &r2);
        nt__sk_memo_counts(&h2, &f2);
        /* every kernel a program of its own (10 repeats 9's key exactly: a
         * transposed transpose is the same view; 15 is 5's), then all
         * restored */
        uint64_t nk = 0;
        for (int v = 0; v < MEMO_VARIANTS; v++)
            nk += off[v].kernels;
        assert_int_equal(nk, MEMO_VARIANTS + 1); /* 13 runs two */
        assert_int_equal(f1 - f0, nk - 2);
        assert_int_equal(h1 - h0, 2);
        assert_int_equal(f2, f1);
        assert_int_equal(h2 - h1, nk);
        for (int v = 0; v < MEMO_VARIANTS; v++) {
            char what[48];
            snprintf(what, sizeof what, "variant %d, %s", v, t ? "trn2" : "trn1");
            same_stats(&off[v], &on1[v], what);
            same_stats(&off[v], &on2[v], what);
            assert_int_equal(ro.bytes[v], r1.bytes[v]);
            assert_memory_equal(ro.data[v], r1.data[v], ro.bytes[v]);
            assert_memory_equal(ro.data[v], r2.data[v], ro.bytes[v]);
        }
        /* the variants time differently, so a false hit would show */
        for (int v = 1; v < 4; v++) /* (13, 14 differ from 0, 3 in what kernels compare) */
            assert_true(off[v].sim_ns != off[0].sim_ns || off[v].instructions != off[0].instructions);
        assert_true(off[7].sim_ns != off[8].sim_ns);
        static double trn1_add;
        if (t == 0)
            trn1_add = off[0].sim_ns;
        else
            assert_true(off[0].sim_ns != trn1_add);
        free_result(&ro);
        free_result(&r1);
        free_result(&r2);
        assert_int_equal(nt_sim_set_target(t ? NT_SIM_TRN1 : NT_SIM_TRN2), 0);
    }
    nt_scope_end(sc);
    nt_sync();
    nt__sim_set_program_values(pv0);
}

/* ---------------- embedding ---------------- */

static void b_embedding(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t V = 300, D = c->shape[0];
    nt_tensor *w = T(c->dt, 2, (int64_t[]){V, D}, 2.0, true);
    int64_t P = 2 * 129;
    int32_t *ix = malloc((size_t)P * 4);
    uint8_t *i8 = malloc((size_t)P);
    for (int64_t i = 0; i < P; i++) {
        ix[i] = (int32_t)(rnd() % (uint64_t)V);
        i8[i] = (uint8_t)(rnd() % 256);
    }
    if (c->variant)
        ix[77] = c->variant > 0 ? (int32_t)V : -1; /* a bad index */
    nt_tensor *idx = nt_from_host(ix, NT_I32, 2, (int64_t[]){2, 129});
    nt_tensor *idx8 = nt_from_host(i8, NT_U8, 1, (int64_t[]){P});
    free(ix);
    free(i8);
    nt_tensor *wt = nt_transpose(nt_contiguous(nt_transpose(w, 0, 1)), 0, 1); /* strided weight */
    out[(*n)++] = nt_embedding(w, idx);
    out[(*n)++] = nt_embedding(wt, nt_transpose(idx, 0, 1));
    out[(*n)++] = nt_embedding(w, idx8);
    if (nt__dtype_is_float(c->dt)) {
        nt_tensor *wg = nt_detach(w);
        nt_set_requires_grad(wg, true);
        nt_tensor *e = nt_embedding(wg, idx);
        nt_tensor *g = T(c->dt, 3, (int64_t[]){2, 129, D}, 1.0, false);
        nt_backward(nt_sum(nt_mul(e, g), NT_DIM_ALL, false));
        out[(*n)++] = nt_grad(wg);
        nt_release(out[*n - 1]);
    }
}

/* ThreadSanitizer sends every memory access through its runtime (5-15x):
 * the TSan run of scripts/test.sh is there for the threads, so it leaves
 * out the largest shapes, which the normal and ASan runs cover. */
#ifdef __SANITIZE_THREAD__
#define NT_TSAN_BUILD 1
#else
#define NT_TSAN_BUILD 0
#endif

static void test_embedding(void **state)
{
    (void)state;
    const int64_t Ds[] = {1, 129, 8193};
    for (size_t d = 0; d < 5; d++)
        for (size_t k = 0; k < (NT_TSAN_BUILD ? 2 : 3); k++)
            for (int v = -1; v <= 1; v++) {
                ew_ctx c = {.dt = ALL[d], .shape = {Ds[k]}, .variant = v};
                char w[64];
                snprintf(w, sizeof w, "embedding %s D=%lld bad=%d", nt_dtype_name(c.dt),
                         (long long)Ds[k], v);
                cmp(w, b_embedding, &c);
            }
}

static void test_data_error_messages(void **state)
{
    (void)state;
    /* the same error, worded the same, on both backends */
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    nt_tensor *w = nt_zeros(NT_F32, 2, (int64_t[]){5, 3});
    nt_tensor *i = nt_from_host((int32_t[]){0, 4, 7, 1}, NT_I32, 1, (int64_t[]){4});
    nt_tensor *e = nt_embedding(w, i);
    float buf[12];
    assert_int_equal(nt_to_host(e, buf, sizeof buf), NT_ERANGE);
    assert_non_null(strstr(nt_last_error_message(), "idx[2] = 7 is out of range [0, 5)"));
    assert_non_null(strstr(nt_last_error_message(), "nt_embedding"));
    nt_tensor *lg = nt_zeros(NT_F32, 2, (int64_t[]){3, 4});
    nt_tensor *lb = nt_from_host((int32_t[]){1, -2, 9}, NT_I32, 1, (int64_t[]){3});
    nt_tensor *ce = nt_cross_entropy(lg, lb);
    double v;
    assert_int_equal(nt_item(ce, &v), NT_ERANGE);
    assert_non_null(strstr(nt_last_error_message(), "labels[1] = -2 is out of range [0, 4)"));
    nt_release(w), nt_release(i), nt_release(e), nt_release(lg), nt_release(lb), nt_release(ce);
    nt_clear_error();
}

/* ---------------- issue 15: min, argmin, any, norm, gather, index_select,
 * repeat, split ---------------- */

static const double ORDS[] = {2.0, 1.0, INFINITY, -INFINITY, 0.0, 3.0, 0.5, -1.5};

static void b_newred(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t L = c->shape[0];
    nt_tensor *x = c->variant ? nt_transpose(T(c->dt, 2, (int64_t[]){L, 3}, 2.0, c->variant == 2), 0, 1)
                              : T(c->dt, 2, (int64_t[]){3, L}, 2.0, false);
    for (int dim = 0; dim < 2; dim++) {
        out[(*n)++] = nt_min(x, dim, dim == 1);
        out[(*n)++] = nt_argmin(x, dim, false);
        out[(*n)++] = nt_any(x, dim, true);
    }
    out[(*n)++] = nt_min(x, NT_DIM_ALL, false);
    out[(*n)++] = nt_argmin(x, NT_DIM_ALL, false);
    out[(*n)++] = nt_any(x, NT_DIM_ALL, false);
    out[(*n)++] = nt_any(nt_mul_scalar(x, 0.0), 1, false); /* all zero (ints), NaN*0 (floats) */
}

static void b_norm(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t L = c->shape[0];
    nt_tensor *x = c->variant ? nt_transpose(T(c->dt, 2, (int64_t[]){L, 3}, 2.0, c->variant == 2), 0, 1)
                              : T(c->dt, 2, (int64_t[]){3, L}, 2.0, false);
    for (size_t k = 0; k < sizeof ORDS / sizeof *ORDS; k++) {
            out[(*n)++] = nt_norm(x, ORDS[k], 1, false);
            if (k < 4)
                out[(*n)++] = nt_norm(x, ORDS[k], NT_DIM_ALL, k == 0);
        }
}

static void test_new_reductions(void **state)
{
    (void)state;
    for (size_t d = 0; d < 5; d++)
        for (size_t s = 0; s < sizeof SIZES / sizeof *SIZES; s++)
            for (int v = 0; v < 3; v++) {
                ew_ctx c = {.dt = ALL[d], .variant = v, .shape = {SIZES[s]}};
                char w[80];
                snprintf(w, sizeof w, "min/argmin/any/norm %s L=%lld variant %d",
                         nt_dtype_name(c.dt), (long long)SIZES[s], v);
                cmp(w, b_newred, &c);
                if (nt__dtype_is_float(c.dt))
                    cmp(w, b_norm, &c);
            }
}

/* gather / index_select (values and, for floats, gradients), repeat and
 * split; variant 1 puts a bad index in, variant -1 a negative one */
static void b_index(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    int64_t R = 37, C = c->shape[0];
    nt_tensor *x = T(c->dt, 2, (int64_t[]){R, C}, 2.0, true);
    int64_t GR = 300, P = GR * C;
    int32_t *ix = malloc((size_t)P * 4);
    uint8_t *i8 = malloc((size_t)GR);
    for (int64_t i = 0; i < P; i++)
        ix[i] = (int32_t)(rnd() % (uint64_t)R);
    for (int64_t i = 0; i < GR; i++)
        i8[i] = (uint8_t)(rnd() % (uint64_t)C);
    if (c->variant)
        ix[P / 2 + 1] = c->variant > 0 ? (int32_t)R : -1;
    nt_tensor *idx = nt_from_host(ix, NT_I32, 2, (int64_t[]){GR, C});
    nt_tensor *idx8 = nt_from_host(i8, NT_U8, 1, (int64_t[]){GR});
    nt_tensor *sel = nt_reshape(nt_slice(idx, 1, 0, 1, 1), 1, (int64_t[]){GR});
    free(ix);
    free(i8);
    out[(*n)++] = nt_gather(x, 0, idx);
    out[(*n)++] = nt_gather(nt_transpose(x, 0, 1), 1, nt_transpose(idx, 0, 1));
    out[(*n)++] = nt_index_select(x, 0, sel);
    out[(*n)++] = nt_index_select(x, 1, idx8);
    int64_t reps[3] = {2, 3, 1};
    out[(*n)++] = nt_repeat(nt_transpose(x, 0, 1), reps, 3);
    nt_tensor *parts[8];
    int np = nt_split(x, 10, 0, parts, 8);
    assert_int_equal(np, 4);
    out[(*n)++] = nt_add(parts[3], parts[3]); /* the short last chunk, through a kernel */
    if (nt__dtype_is_float(c->dt)) {
        nt_tensor *xg = nt_detach(x);
        nt_set_requires_grad(xg, true);
        nt_tensor *g = T(c->dt, 2, (int64_t[]){GR, C}, 1.0, false);
        nt_tensor *l = nt_add(nt_sum(nt_mul(nt_gather(xg, 0, idx), g), NT_DIM_ALL, false),
                              nt_sum(nt_index_select(xg, 1, idx8), NT_DIM_ALL, false));
        l = nt_add(l, nt_sum(nt_mul(nt_index_select(xg, 0, sel), g), NT_DIM_ALL, false));
        l = nt_add(l, nt_sum(nt_mul(nt_repeat(xg, reps + 1, 2), nt_slice(g, 0, 0, 111, 1)),
                             NT_DIM_ALL, false));
        l = nt_add(l, nt_sum(nt_min(xg, 1, false), NT_DIM_ALL, false));
        for (size_t k = 0; k < sizeof ORDS / sizeof *ORDS; k++)
            l = nt_add(l, nt_sum(nt_norm(xg, ORDS[k], 1, false), NT_DIM_ALL, false));
        nt_backward(l);
        out[(*n)++] = nt_grad(xg);
        nt_release(out[*n - 1]);
    }
}

static void test_gather_index_select_repeat_split(void **state)
{
    (void)state;
    const int64_t Cs[] = {1, 5, 130};
    for (size_t d = 0; d < 5; d++)
        for (size_t k = 0; k < 3; k++)
            for (int v = -1; v <= 1; v++) {
                ew_ctx c = {.dt = ALL[d], .shape = {Cs[k]}, .variant = v};
                char w[80];
                snprintf(w, sizeof w, "gather/index_select %s C=%lld bad=%d", nt_dtype_name(c.dt),
                         (long long)Cs[k], v);
                cmp(w, b_index, &c);
            }
}

/* min as a row-reduction epilogue: fused on both backends, and the fused
 * simulator against the unfused (deterministic) CPU */
static void b_fused_min(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    nt_tensor *x = T(c->dt, 2, (int64_t[]){9, 2100}, 2.0, true);
    nt_tensor *m = nt_min(nt_add_scalar(nt_mul_scalar(x, 1.5), 0.25), -1, true);
    out[(*n)++] = nt_exp(nt_sub(x, m));
    out[(*n)++] = nt_mul_scalar(nt_min(nt_abs(x), 1, true), 2.0);
}

static void test_fused_min_epilogue(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    for (size_t d = 0; d < 3; d++) {
        ew_ctx c = {.dt = FLOATS[d]};
        cmp_mode("fused min", "lazy", b_fused_min, &c);
        uint64_t seed = rnd();
        result a, b;
        run("cpu", "deterministic", seed, b_fused_min, &c, &a);
        run("sim", "lazy", seed, b_fused_min, &c, &b);
        assert_int_equal(a.n, b.n);
        for (int i = 0; i < a.n; i++)
            assert_memory_equal(a.data[i], b.data[i], a.bytes[i]);
        free_result(&a);
        free_result(&b);
    }
    nt_stats st;
    nt_stats_get(&st);
    assert_true(st.fusion_groups > 0);
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
}

/* ---------------- fused programs ---------------- */

static nt_tensor *chain8(nt_tensor *x)
{
    return nt_mul(nt_add_scalar(nt_mul_scalar(nt_relu(nt_sub(nt_mul(nt_add_scalar(
                                                                        nt_mul_scalar(x, 1.5), 0.25),
                                                                    x),
                                                             x)),
                                              0.5),
                                1.0),
                  x);
}

static void b_fused(void *ctx, nt_tensor **out, int *n)
{
    ew_ctx *c = ctx;
    nt_tensor *x = T(c->dt, 2, (int64_t[]){257, 1000}, 3.0, true);
    nt_tensor *b = T(c->dt, 1, (int64_t[]){1000}, 1.0, false);
    nt_tensor *w = T(c->dt, 2, (int64_t[]){1000, 129}, 0.1, false);
    nt_sync(); /* inputs first: the programs below go to the planner together */
    out[(*n)++] = chain8(x);
    /* softmax as primitives (a ROW program) */
    nt_tensor *m = nt_max(x, -1, true);
    nt_tensor *e = nt_exp(nt_sub(x, m));
    out[(*n)++] = nt_div(e, nt_sum(e, -1, true));
    /* layer norm as primitives, with a broadcast bias */
    nt_tensor *mu = nt_mean(x, -1, true);
    nt_tensor *d = nt_sub(x, mu);
    nt_tensor *var = nt_mean(nt_mul(d, d), -1, true);
    out[(*n)++] = nt_add(nt_mul(d, nt_rsqrt(nt_add_scalar(var, 1e-5))), b);
    /* matmul + bias + gelu + cast (an MM program) */
    nt_tensor *h = nt_gelu(nt_add(nt_matmul(x, w), nt_slice(b, 0, 0, 129, 1)));
    out[(*n)++] = nt_cast(h, NT_BF16);
    out[(*n)++] = nt_relu(nt_matmul(nt_slice(x, 0, 0, 5, 1), w));
    /* int and compare in one program */
    nt_tensor *q = nt_cast(nt_mul_scalar(x, 10.0), NT_I32);
    out[(*n)++] = nt_where(nt_gt(q, nt_abs(nt_neg(q))), nt_clamp(q, 5, -5), nt_relu(q));
    /* an in-place chain */
    nt_tensor *y = nt_contiguous(nt_mul_scalar(x, 1.0));
    nt_add_scalar_inplace(y, 2.0);
    nt_mul_inplace(y, x);
    out[(*n)++] = y;
}

static void test_fused_programs(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    for (size_t d = 0; d < 3; d++) {
        ew_ctx c = {.dt = FLOATS[d]};
        char w[64];
        snprintf(w, sizeof w, "fused programs %s", nt_dtype_name(c.dt));
        cmp_mode(w, "lazy", b_fused, &c); /* sim fused vs cpu fused */
        /* and the fused simulator against the unfused CPU */
        uint64_t seed = rnd();
        result a, b;
        run("cpu", "deterministic", seed, b_fused, &c, &a);
        run("sim", "lazy", seed, b_fused, &c, &b);
        assert_int_equal(a.n, b.n);
        for (int i = 0; i < a.n; i++)
            assert_memory_equal(a.data[i], b.data[i], a.bytes[i]);
        free_result(&a);
        free_result(&b);
    }
    nt_stats st;
    nt_stats_get(&st);
    assert_true(st.fusion_groups > 0);
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
}

static void test_fused_hbm_bytes(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    int64_t n = quick ? 100000 : 1 << 20;
    nt_tensor *x = nt_randn(NT_F32, 1, &n, 3);
    nt_sync();
    nt_sim_stats_reset();
    nt_stats_reset();
    nt_scope *s = nt_scope_begin();
    nt_tensor *y = nt_keep(chain8(x));
    nt_scope_end(s);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats st;
    nt_sim_stats_get(&st);
    nt_stats fs;
    nt_stats_get(&fs);
    assert_int_equal(fs.fusion_groups, 1);
    assert_int_equal(fs.fused_ops, 8);
    /* one read of x, one write of y: no intermediate reached HBM */
    assert_int_equal(st.hbm_read_bytes, (uint64_t)n * 4);
    assert_int_equal(st.hbm_write_bytes, (uint64_t)n * 4);
    assert_int_equal(st.kernels, 1);
    /* and the same values as the CPU op by op */
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    nt_to_host(y, a, (size_t)n * 4);
    nt_config_set("NT_BACKEND", "cpu");
    nt_config_set("NT_MODE", "deterministic");
    nt_tensor *z = chain8(x);
    nt_to_host(z, b, (size_t)n * 4);
    assert_memory_equal(a, b, (size_t)n * 4);
    free(a), free(b);
    nt_release(x), nt_release(y), nt_release(z);
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_FUSION", "0");
}

/* ---------------- stochastic rounding ---------------- */

/* The random bits of a stochastic cast come from (seed, the record's stream
 * and seq, the element index): each run starts from a fresh nt_init so the
 * records get the same seqs on both backends. */
static void b_sr(void *ctx, nt_tensor **out, int *n)
{
    (void)ctx;
    nt_tensor *x = T(NT_F32, 2, (int64_t[]){257, 1000}, 3.0, true);
    nt_tensor *w = T(NT_F32, 2, (int64_t[]){1000, 130}, 0.1, false);
    nt_sync();
    out[(*n)++] = nt_cast_sr(nt_mul_scalar(x, 1.1), NT_BF16);          /* EW */
    nt_tensor *m = nt_max(x, -1, true);
    nt_tensor *e = nt_exp(nt_sub(x, m));
    out[(*n)++] = nt_cast_sr(nt_div(e, nt_sum(e, -1, true)), NT_F16); /* ROW */
    out[(*n)++] = nt_cast_sr(nt_add_scalar(m, 0.3), NT_BF16);         /* a per-row value */
    out[(*n)++] = nt_cast_sr(nt_relu(nt_matmul(x, w)), NT_BF16);      /* MM epilogue */
    out[(*n)++] = nt_cast_sr(nt_transpose(x, 0, 1), NT_F16);          /* strided source */
}

static void run_fresh(const char *backend, const char *mode, const char *fusion, result *r)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_FUSION", fusion), 0);
    assert_int_equal(nt_config_set("NT_SR_SEED", "4242"), 0);
    run(backend, mode, 77, b_sr, NULL, r);
}

static void test_stochastic_rounding(void **state)
{
    (void)state;
    result ref;
    run_fresh("cpu", "deterministic", "0", &ref);
    const char *cfg[][3] = {{"sim", "deterministic", "0"}, {"sim", "eager", "0"},
                            {"sim", "lazy", "1"},          {"cpu", "lazy", "1"}};
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        result r;
        run_fresh(cfg[c][0], cfg[c][1], cfg[c][2], &r);
        assert_int_equal(r.err, 0);
        assert_int_equal(r.n, ref.n);
        for (int i = 0; i < r.n; i++)
            if (memcmp(r.data[i], ref.data[i], r.bytes[i]))
                fail_msg("stochastic rounding: %s %s fusion %s output %d differs", cfg[c][0],
                         cfg[c][1], cfg[c][2], i);
        free_result(&r);
    }
    free_result(&ref);
}

/* ---------------- backend switches ---------------- */

/* A backend that refuses a multiply by 3 (by parameter, not by op): what
 * core/backend.h's supports() is for. */
static bool refuse_mul3(int op, const nt__params *p)
{
    if (op == NT_OP_MUL_SCALAR && p->f[0] == 3.0)
        return false;
    return op >= NT_OP_COUNT || nt__sim_kernels[op] != NULL;
}

static void test_backend_supports(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_ptr_equal(nt__backends[NT_BACKEND_SIM], &nt__sim_backend);
    assert_ptr_equal(nt__backends[NT_BACKEND_CPU], &nt__cpu_backend);
    assert_string_equal(nt__backends[NT_BACKEND_SIM]->name, "sim");
    nt_tensor *x = nt_full(NT_F32, 1, (int64_t[]){1000}, 2.0);
    nt_sync(); /* no record runs while the table changes */
    nt__backend_i picky = nt__sim_backend;
    static const bool picky_checked[NT_OP_COUNT] = {[NT_OP_MUL_SCALAR] = true};
    picky.supports = refuse_mul3;
    picky.checked = picky_checked;
    nt__backends[NT_BACKEND_SIM] = &picky;
    /* refused under NT_REQUIRE_SIM=1: a clear error at the call, nothing queued */
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    nt_stats st;
    nt_stats_reset();
    assert_null(nt_mul_scalar(x, 3.0));
    assert_int_equal(nt_last_error(), NT_ENOTSUP);
    assert_non_null(strstr(nt_last_error_message(), "nt_mul_scalar"));
    assert_non_null(strstr(nt_last_error_message(), "NT_REQUIRE_SIM"));
    nt_stats_get(&st);
    assert_int_equal(st.ops_enqueued, 0);
    nt_clear_error();
    /* the same op with other parameters runs on the simulator */
    nt_sim_stats_reset();
    nt_tensor *y = nt_mul_scalar(x, 2.0);
    double v;
    assert_int_equal(nt_item(nt_sum(y, NT_DIM_ALL, false), &v), 0);
    assert_true(v == 4000.0);
    nt_sim_stats ss;
    nt_sim_stats_get(&ss);
    assert_true(ss.kernels >= 2); /* the multiply and the sum */
    /* without NT_REQUIRE_SIM the refused op runs on the CPU, counted */
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
    nt_stats_reset();
    nt_tensor *z = nt_mul_scalar(x, 3.0);
    assert_non_null(z);
    nt_sync();
    nt_stats_get(&st);
    assert_int_equal(st.cpu_fallbacks, 1);
    float out[1000];
    assert_int_equal(nt_to_host(z, out, sizeof out), 0);
    for (int i = 0; i < 1000; i++)
        assert_true(out[i] == 6.0f);
    nt__backends[NT_BACKEND_SIM] = &nt__sim_backend;
    nt_release(x);
    nt_release(y);
    nt_release(z);
}

static void test_require_sim_and_min_flops(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    /* every op with a CPU kernel has a simulator kernel */
    for (int op = 0; op < NT_OP_COUNT; op++)
        if (nt__cpu_kernels[op])
            assert_non_null(nt__sim_kernels[op]);
    nt_tensor *x = nt_ones(NT_F32, 1, (int64_t[]){1000});
    nt_sync();
    /* an op without a simulator kernel: an error under NT_REQUIRE_SIM=1 */
    nt__kernel_fn saved = nt__sim_kernels[NT_OP_EXP];
    nt__sim_kernels[NT_OP_EXP] = NULL;
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    nt_tensor *e = nt_exp(x);
    assert_null(e);
    assert_int_equal(nt_last_error(), NT_ENOTSUP);
    assert_non_null(strstr(nt_last_error_message(), "NT_REQUIRE_SIM"));
    nt_clear_error();
    /* ... and a CPU fallback (counted) without it */
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
    nt_stats_reset();
    e = nt_exp(x);
    double v;
    assert_int_equal(nt_item(nt_sum(e, NT_DIM_ALL, false), &v), 0);
    assert_true(fabs(v - 1000 * exp(1.0)) < 0.1);
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.cpu_fallbacks, 1);
    nt__sim_kernels[NT_OP_EXP] = saved;
    nt_release(e);
    /* NT_MIN_SIM_FLOPS sends small ops to the CPU */
    assert_int_equal(nt_config_set("NT_MIN_SIM_FLOPS", "5000"), 0);
    nt_sync();
    nt_sim_stats_reset();
    nt_stats_reset();
    nt_tensor *small = nt_add_scalar(x, 1.0);
    nt_tensor *big = nt_add_scalar(nt_ones(NT_F32, 1, (int64_t[]){8000}), 1.0);
    nt_sync();
    nt_sim_stats ss;
    nt_sim_stats_get(&ss);
    nt_stats_get(&st);
    assert_int_equal(st.cpu_fallbacks, 1); /* the 1000-element add */
    assert_int_equal(ss.kernels, 2);       /* ones(8000) and its add on the simulator */
    assert_int_equal(nt_config_set("NT_MIN_SIM_FLOPS", "0"), 0);
    assert_string_equal(nt_config_get("NT_BACKEND"), "sim");
    nt_release(small), nt_release(big), nt_release(x);
}

/* A generator kernel given another op (a kernel table pointing FILL at
 * randn's entry, say) refuses it, naming both, instead of filling the
 * tensor with its own values. */
static void test_generator_refuses_other_op(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
    nt_sync();
    nt__kernel_fn saved = nt__sim_kernels[NT_OP_FILL];
    nt__sim_kernels[NT_OP_FILL] = nt__sim_kernels[NT_OP_RANDN];
    nt_tensor *x = nt_full(NT_F32, 1, (int64_t[]){300}, 2.0);
    float out[300];
    int rc = x ? nt_to_host(x, out, sizeof out) : nt_last_error();
    nt__sim_kernels[NT_OP_FILL] = saved;
    assert_int_equal(rc, NT_ENOTSUP);
    const char *m = nt_last_error_message();
    if (!strstr(m, "randn generator") || !strstr(m, "nt_fill"))
        fail_msg("message does not name the generator and the op: %s", m);
    nt_clear_error();
    nt_release(x);
    /* the generators themselves still run their own ops */
    nt_tensor *r = nt_randn(NT_F32, 1, (int64_t[]){300}, 7);
    assert_int_equal(nt_to_host(r, out, sizeof out), 0);
    assert_true(out[0] != out[1]);
    nt_release(r);
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
}

/* ---------------- user tile kernels ---------------- */

/* softplus-like "scaled swish": y = x * sigmoid(beta * x), one ScalarE
 * activation with scale and one VectorE multiply per tile */
typedef struct swish {
    float beta;
    int mode; /* 0 ok, 1 bad shape rule, 2 kernel breaks a rule, 3 wrong-shape backward */
} swish;

static int swish_shape(const nt_tensor_view *in, int nin, nt_tensor_view *out, char *why,
                       size_t whylen, void *ctx)
{
    swish *s = ctx;
    if (nin != 1 || in[0].dtype != NT_F32 || s->mode == 1) {
        snprintf(why, whylen, "expected one f32 tensor");
        return NT_EDTYPE;
    }
    out->dtype = NT_F32;
    out->ndim = in[0].ndim;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    return 0;
}

static int swish_kernel(nt_sim_kernel *k, const nt_tensor_view *in, int nin,
                        const nt_tensor_view *out, void *ctx)
{
    (void)nin;
    swish *s = ctx;
    int64_t n = 1;
    for (int i = 0; i < in[0].ndim; i++)
        n *= in[0].shape[i];
    /* contiguous input required by this simple kernel */
    int64_t F = 512;
    nt_tile *x = nt_tile_alloc(k, "x", NT_MEM_SBUF, NT_F32, 128, F);
    nt_tile *g = nt_tile_alloc(k, "sig", NT_MEM_SBUF, NT_F32, 128, s->mode == 2 ? 70000 : F);
    for (int64_t i0 = 0; i0 < n;) {
        int64_t rows = (n - i0) / F;
        int np = rows ? (int)(rows < 128 ? rows : 128) : 1;
        int64_t w = rows ? F : n - i0;
        nt_ap hx = nt_hbm_ap(in[0].data, NT_F32, i0, np, F, w);
        nt_ap ho = nt_hbm_ap(out->data, NT_F32, i0, np, F, w);
        nt_ap X = nt_tile_slice(x, 0, np, 0, w), G = nt_tile_slice(g, 0, np, 0, w);
        nt_isa_dma_copy(k, &X, &hx, NT_DMA_QUEUE_AUTO);
        nt_isa_activation(k, &G, NT_ACT_SIGMOID, &X, &(nt_isa_scalar){NULL, s->beta}, NULL, NULL);
        nt_isa_tensor_tensor(k, &G, &X, &G, NT_ALU_MUL, NT_ENGINE_VECTOR);
        nt_isa_dma_copy(k, &ho, &G, NT_DMA_QUEUE_AUTO);
        i0 += np * w;
    }
    return nt_sim_kernel_error(k);
}

static int swish_backward(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out,
                          nt_tensor **gin, void *ctx)
{
    (void)out;
    swish *s = ctx;
    nt_tensor *x = in[0];
    nt_tensor *sg = nt_sigmoid(nt_mul_scalar(x, s->beta));
    /* d/dx x s(bx) = s + b x s (1 - s) */
    nt_tensor *d = nt_add(sg, nt_mul(nt_mul_scalar(x, s->beta),
                                     nt_mul(sg, nt_add_scalar(nt_neg(sg), 1.0))));
    gin[0] = s->mode == 3 ? nt_sum(d, 0, false) : nt_mul(gout, d);
    return 0;
}

static void test_user_tile_kernel(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    static swish sw = {1.702f, 0}, bad_shape = {1.0f, 1}, bad_kernel = {1.0f, 2},
                 bad_bwd = {1.0f, 3};
    nt_kernel_op_def def = {"scaled_swish", 1, swish_shape, swish_kernel, swish_backward, &sw};
    int op = nt_op_register_kernel(&def);
    assert_true(op >= 0);
    assert_true(nt_op_register_kernel(&def) < 0); /* duplicate name */
    nt_clear_error();
    nt_kernel_op_def nok = def;
    nok.name = "no_kernel";
    nok.kernel = NULL;
    assert_int_equal(nt_op_register_kernel(&nok), NT_EINVAL);
    nt_clear_error();

    int64_t n = 128 * 512 + 100;
    nt_tensor *x = T(NT_F32, 1, &n, 3.0, false);
    nt_set_requires_grad(x, true);
    nt_tensor *y = nt_op_call(op, (nt_tensor *[]){x});
    assert_non_null(y);
    /* the same instructions the built-in ops use: the same bits */
    nt_tensor *ref = nt_mul(x, nt_sigmoid(nt_mul_scalar(x, 1.702f)));
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    assert_int_equal(nt_to_host(y, a, (size_t)n * 4), 0);
    assert_int_equal(nt_to_host(ref, b, (size_t)n * 4), 0);
    assert_memory_equal(a, b, (size_t)n * 4);
    /* backward through the user's gradient */
    assert_int_equal(nt_backward(nt_sum(y, NT_DIM_ALL, false)), 0);
    nt_tensor *g = nt_grad(x);
    assert_non_null(g);
    assert_int_equal(nt_to_host(g, a, (size_t)n * 4), 0);
    assert_true(fabsf(a[0]) < 2.0f);
    nt_release(g);

    /* a shape rule that rejects the inputs: a clean error, nothing queued */
    def.name = "swish_bad_shape";
    def.ctx = &bad_shape;
    int op2 = nt_op_register_kernel(&def);
    assert_true(op2 >= 0);
    assert_null(nt_op_call(op2, (nt_tensor *[]){x}));
    assert_int_equal(nt_last_error(), NT_EDTYPE);
    assert_non_null(strstr(nt_last_error_message(), "shape rule of op 'swish_bad_shape'"));
    assert_non_null(strstr(nt_last_error_message(), "expected one f32 tensor"));
    nt_clear_error();

    /* a kernel that breaks a hardware rule: the sync names the op and site */
    def.name = "swish_bad_kernel";
    def.ctx = &bad_kernel;
    int op3 = nt_op_register_kernel(&def);
    nt_tensor *y3 = nt_op_call(op3, (nt_tensor *[]){x});
    assert_non_null(y3);
    assert_int_equal(nt_to_host(y3, a, (size_t)n * 4), NT_ESIM);
    const char *m = nt_last_error_message();
    assert_non_null(strstr(m, "nt_op_call(swish_bad_kernel)"));
    assert_non_null(strstr(m, "test_simkernels.c"));
    assert_non_null(strstr(m, "SBUF"));
    nt_clear_error();

    /* a backward that returns the wrong shape */
    def.name = "swish_bad_bwd";
    def.ctx = &bad_bwd;
    int op4 = nt_op_register_kernel(&def);
    nt_tensor *x2 = T(NT_F32, 2, (int64_t[]){4, 5}, 1.0, false);
    nt_set_requires_grad(x2, true);
    nt_tensor *y4 = nt_op_call(op4, (nt_tensor *[]){x2});
    assert_int_equal(nt_backward(nt_sum(y4, NT_DIM_ALL, false)), NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "swish_bad_bwd"));
    nt_clear_error();
    free(a), free(b);
    nt_release(x), nt_release(y), nt_release(ref), nt_release(y3), nt_release(x2), nt_release(y4);
}

/* ---------------- shapes far beyond SBUF ---------------- */

static void b_big(void *ctx, nt_tensor **out, int *n)
{
    (void)ctx;
    int64_t L = quick ? 70000 : 200003;
    nt_tensor *x = T(NT_F32, 2, (int64_t[]){2, L}, 3.0, false);
    out[(*n)++] = nt_softmax(x, -1);
    out[(*n)++] = nt_layer_norm(x, NULL, NULL, 1e-5);
    out[(*n)++] = nt_sum(x, 1, false);
    out[(*n)++] = nt_argmax(x, 1, false);
    out[(*n)++] = nt_add(x, nt_slice(x, 0, 1, 2, 1));
    int64_t K = quick ? 3000 : 20000;
    nt_tensor *a = T(NT_BF16, 2, (int64_t[]){130, K}, 1.0, false);
    nt_tensor *b = T(NT_BF16, 2, (int64_t[]){K, 3}, 1.0, false);
    out[(*n)++] = nt_matmul(a, b);
    nt_tensor *w = T(NT_F32, 2, (int64_t[]){4, 30000}, 1.0, false);
    out[(*n)++] = nt_embedding(w, nt_from_host((int32_t[]){3, 0, 3}, NT_I32, 1, (int64_t[]){3}));
    nt_tensor *lg = T(NT_F32, 2, (int64_t[]){2, L}, 3.0, false);
    out[(*n)++] = nt_cross_entropy(lg, nt_from_host((int32_t[]){5, (int32_t)L - 1}, NT_I32, 1,
                                                    (int64_t[]){2}));
}

/* ---------------- schedules: what the kernels do with the hardware ----------------
 *
 * Simulated-time properties of the kernels the MLP training step spends its
 * time in (issue 11, target 2).  Simulated time depends only on the program
 * (never on the host), so these are exact, repeatable checks; each also
 * compares the values with the CPU backend's, bit for bit. */

/* The DMA-limited time of `bytes` of HBM traffic (bench/train_step's floor). */
static double dma_floor_ns(double bytes)
{
    nt_sim_config c;
    assert_int_equal(nt_sim_config_get(&c), 0);
    double rate = c.dma_engines * c.dma_engine_bytes_per_ns;
    if (c.hbm_bytes_per_ns > 0 && c.hbm_bytes_per_ns < rate)
        rate = c.hbm_bytes_per_ns;
    return bytes / rate;
}

/* Runs f(x...) on the sim in `mode`, returns its stats and output bytes. */
typedef nt_tensor *(*sched_fn)(nt_tensor **in);
static void sched_run(const char *mode, sched_fn f, nt_tensor **in, nt_sim_stats *st, void *out,
                      size_t bytes)
{
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats_reset();
    nt_scope *sc = nt_scope_begin();
    nt_tensor *y = nt_keep(f(in));
    nt_scope_end(sc);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_sim_stats_get(st), 0);
    assert_int_equal(nt_to_host(y, out, bytes), 0);
    nt_release(y);
}

static void sched_cpu(sched_fn f, nt_tensor **in, void *out, size_t bytes)
{
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "deterministic"), 0);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *y = nt_keep(f(in));
    nt_scope_end(sc);
    assert_int_equal(nt_to_host(y, out, bytes), 0);
    nt_release(y);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
}

static nt_tensor *sched_sum0(nt_tensor **in) { return nt_sum(in[0], 0, false); }
static nt_tensor *sched_sum1(nt_tensor **in) { return nt_sum(in[0], 1, false); }
/* AdamW's shape of program: four inputs, the new parameter out (m and v
 * stay in SBUF: the property is the schedule of a long chain per tile) */
static nt_tensor *sched_adamw(nt_tensor **in)
{
    nt_tensor *p = in[0], *g = in[1], *m = in[2], *v = in[3];
    nt_tensor *m2 = nt_add(nt_mul_scalar(m, 0.9), nt_mul_scalar(g, 0.1));
    nt_tensor *v2 = nt_add(nt_mul_scalar(v, 0.999), nt_mul_scalar(nt_mul(g, g), 0.001));
    nt_tensor *u = nt_div(m2, nt_add_scalar(nt_sqrt(v2), 1e-8));
    return nt_sub(nt_mul_scalar(p, 1.0 - 1e-5), nt_mul_scalar(u, 1e-3));
}
static nt_tensor *sched_linear(nt_tensor **in) { return nt_matmul(in[0], nt_transpose(in[1], 0, 1)); }
/* The W1 gradient and its update (AdamW's data flow): g = dz^T x, then an
 * unrelated op (the backward's next ops), then a chain that writes p and m
 * in place.  in: dz [128, 1024], x [128, 784], p, m [1024, 784], y. */
static nt_tensor *sched_grad_update(nt_tensor **in)
{
    nt_tensor *g = nt_matmul(nt_transpose(in[0], 0, 1), in[1]);
    nt_tensor *other = nt_keep(nt_add(in[4], in[4]));
    nt_tensor *m2 = nt_add(in[3], nt_mul_scalar(nt_sub(g, in[3]), 0.1));
    nt_tensor *u = nt_div(m2, nt_add_scalar(nt_sqrt(nt_abs(m2)), 1e-8));
    nt_tensor *p2 = nt_sub(nt_mul_scalar(in[2], 1.0 - 1e-5), nt_mul_scalar(u, 1e-3));
    assert_int_equal(nt_copy_into(in[3], m2), 0);
    assert_int_equal(nt_copy_into(in[2], p2), 0);
    nt_release(other);
    return g;
}
static nt_tensor *sched_layer_norm(nt_tensor **in) { return nt_layer_norm(in[0], in[1], in[2], 1e-5); }
static nt_tensor *sched_norm2(nt_tensor **in) { return nt_norm(in[0], 2.0, NT_DIM_ALL, false); }
static nt_tensor *sched_sdpa(nt_tensor **in)
{
    return nt_scaled_dot_product_attention(in[0], in[1], in[2], NULL, true, 0.0);
}
static nt_tensor *sched_mm_small(nt_tensor **in) { return nt_matmul(nt_transpose(in[0], 0, 1), in[1]); }
/* A bf16 step's gradient and its moment updates: g = cast(gradient), an
 * unrelated op, then a chain whose first ops read only g.  in: gb [n] bf16,
 * m, v [n] f32, y [100] f32. */
static nt_tensor *sched_cast_chain(nt_tensor **in)
{
    nt_tensor *g = nt_cast(in[0], NT_F32);
    nt_tensor *other = nt_keep(nt_add(in[3], in[3]));
    nt_tensor *m2 = nt_add(nt_mul_scalar(in[1], 0.9), nt_mul_scalar(g, 0.1));
    nt_tensor *v2 = nt_add(nt_mul_scalar(in[2], 0.999), nt_mul_scalar(nt_mul(g, g), 0.001));
    nt_release(other);
    return nt_div(m2, nt_add_scalar(nt_sqrt(v2), 1e-8));
}

/* The char GPT's step kernels whose groups of rows were one dependent
 * chain after another (issue 31): cross_entropy, softmax, embedding, the
 * one-hot of cross_entropy's backward over 2048 rows of 114 classes, and
 * layer norm's backward as a ROW program, each against the CPU bit for bit
 * and within a simulated time the chained programs missed (before: 78.9,
 * 40.8, 71.7, 71.6 and 27.8 us; after: 41.7, 26.2, 16.8, 19.1 and 24.0). */
static nt_tensor *sched_xent(nt_tensor **in) { return nt_cross_entropy(in[0], in[1]); }
static nt_tensor *sched_softmax(nt_tensor **in) { return nt_softmax(in[0], 1); }
static nt_tensor *sched_emb(nt_tensor **in) { return nt_embedding(in[0], in[1]); }
static nt_tensor *sched_onehot(nt_tensor **in)
{
    int64_t N = in[1]->shape[0], C = in[0]->shape[1];
    nt_tensor *lab = nt_expand(nt_unsqueeze(in[1], 1), 2, (int64_t[]){N, C});
    nt_tensor *hot = nt_cast(nt_eq(lab, nt_arange(NT_I32, 0, (double)C, 1)), NT_F32);
    return nt_mul_scalar(nt_sub(in[0], hot), 0.5);
}

/* layer norm's backward as primitives (one ROW program): dx = (g w -
 * mean(g w) - xh mean(g w xh)) r; in: g, w, xh, r */
static nt_tensor *sched_ln_bwd(nt_tensor **in)
{
    nt_tensor *gw = nt_mul(in[0], in[1]);
    nt_tensor *m1 = nt_mean(gw, 1, true), *m2 = nt_mean(nt_mul(gw, in[2]), 1, true);
    return nt_mul(nt_sub(nt_sub(gw, m1), nt_mul(in[2], m2)), in[3]);
}

static void test_step_chains(void **state)
{
    (void)state;
    const int64_t N = 2048, C = 114, D = 128;
    nt_sim_stats st;
    nt_tensor *in[2];
    in[0] = nt_randn(NT_F32, 2, (int64_t[]){N, C}, 31);
    in[1] = nt_randint(0, C, 1, (int64_t[]){N}, NULL);
    nt_tensor *w = nt_randn(NT_F32, 2, (int64_t[]){C, D}, 32);
    float *a = malloc((size_t)(N * D) * 4), *b = malloc((size_t)(N * D) * 4);
    /* 1. cross_entropy: the log and the nll of 16 groups at once, each
     * group's labels in a column of their own (2 us of table loads and a
     * label load's wait a group: 94 us before) */
    sched_run("eager", sched_xent, in, &st, a, 4);
    double t_xent = st.sim_ns;
    print_message("# cross_entropy [2048, 114]: %.0f ns\n", st.sim_ns);
    sched_cpu(sched_xent, in, b, 4);
    assert_memory_equal(a, b, 4);
    /* 2. softmax: every other group's output from a second tile (each
     * group's output waited for the one before to have stored: 65 us) */
    sched_run("eager", sched_softmax, in, &st, a, (size_t)(N * C) * 4);
    double t_soft = st.sim_ns;
    print_message("# softmax [2048, 114]: %.0f ns\n", st.sim_ns);
    sched_cpu(sched_softmax, in, b, (size_t)(N * C) * 4);
    assert_memory_equal(a, b, (size_t)(N * C) * 4);
    /* 3. embedding: eight groups of positions in flight (a chain of index
     * load, gather and store per group: 72 us) */
    nt_tensor *ein[2] = {w, in[1]};
    sched_run("eager", sched_emb, ein, &st, a, (size_t)(N * D) * 4);
    double t_emb = st.sim_ns;
    print_message("# embedding of 2048 positions, width 128: %.0f ns\n", st.sim_ns);
    sched_cpu(sched_emb, ein, b, (size_t)(N * D) * 4);
    assert_memory_equal(a, b, (size_t)(N * D) * 4);
    /* 4. the one-hot: the labels expanded over the classes load as one
     * column a tile and spread on chip (one 4-byte descriptor per element
     * before: the kernel read the labels C times) */
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    sched_run("lazy", sched_onehot, in, &st, a, (size_t)(N * C) * 4);
    print_message("# one-hot of [2048] labels over 114 classes: %.0f ns, %llu B read\n",
                  st.sim_ns, (unsigned long long)st.hbm_read_bytes);
    uint64_t rd = st.hbm_read_bytes;
    double t_hot = st.sim_ns;
    sched_cpu(sched_onehot, in, b, (size_t)(N * C) * 4);
    assert_memory_equal(a, b, (size_t)(N * C) * 4);
    /* 5. layer norm's backward over [2048, 128] rows: one ROW program, its
     * tiles in pairs, their ops interleaved (one tile's chain left VectorE
     * and ScalarE waiting for each other) */
    nt_tensor *lin[4] = {nt_randn(NT_F32, 2, (int64_t[]){N, D}, 33),
                         nt_randn(NT_F32, 1, (int64_t[]){D}, 34),
                         nt_randn(NT_F32, 2, (int64_t[]){N, D}, 35),
                         nt_abs(nt_randn(NT_F32, 2, (int64_t[]){N, 1}, 36))};
    sched_run("lazy", sched_ln_bwd, lin, &st, a, (size_t)(N * D) * 4);
    double t_ln = st.sim_ns;
    print_message("# layer norm's backward over [2048, 128]: %.0f ns, %llu kernels\n", st.sim_ns,
                  (unsigned long long)st.kernels);
    assert_int_equal(st.kernels, 1);
    sched_cpu(sched_ln_bwd, lin, b, (size_t)(N * D) * 4);
    assert_memory_equal(a, b, (size_t)(N * D) * 4);
    for (int i = 0; i < 4; i++)
        nt_release(lin[i]);
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
    /* the times (and bytes) the chained programs missed */
    assert_true(t_ln < 26000);
    assert_true(t_xent < 60000);
    assert_true(t_soft < 33000);
    assert_true(t_emb < 40000);
    assert_true(t_hot < 40000);
    /* x once, the class indices' row once per row (a partition-step-0
     * pattern), each label once */
    assert_int_equal(rd, (uint64_t)(N * C) * 4 * 2 + (uint64_t)N * 4);
    free(a), free(b);
    nt_release(in[0]), nt_release(in[1]), nt_release(w);
}

static void test_kernel_schedules(void **state)
{
    (void)state;
    nt_sim_stats st, st1;
    /* 1. the bias gradient: a sum over the batch dim of [128, 1024].  Rows
     * of 1024 go on partitions as contiguous runs and turn on TensorE; no
     * element is read twice, and it costs about what the contiguous
     * reduction of the same bytes costs (it took 4x: one-element
     * descriptors and a serialised store per group) */
    {
        nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){128, 1024}, 5);
        nt_tensor *xt = nt_contiguous(nt_transpose(x, 0, 1)); /* [1024, 128] */
        float a[1024], b[1024];
        sched_run("eager", sched_sum0, &x, &st, a, sizeof a);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)128 * 1024 * 4);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)1024 * 4);
        assert_true(st.busy_ns[NT_ENGINE_TENSOR] > 0);
        sched_run("eager", sched_sum1, &xt, &st1, b, sizeof b);
        print_message("# sum over dim 0 of [128, 1024]: %.0f ns; over dim 1 of [1024, 128]: %.0f ns\n",
                      st.sim_ns, st1.sim_ns);
        assert_true(st.sim_ns <= 1.5 * st1.sim_ns);
        sched_cpu(sched_sum0, &x, b, sizeof b);
        assert_memory_equal(a, b, sizeof a);
        nt_release(x), nt_release(xt);
    }
    /* 2. a long elementwise chain over [1024, 784] (AdamW's program): one
     * kernel, each input read once, and within 25% of the DMA-limited time
     * of its bytes (four tiles of 2048 took 1.8x: nothing overlapped the
     * first loads and the last stores, and one tile's chain made VectorE
     * and ScalarE wait for each other) */
    {
        const int64_t shape[2] = {1024, 784}, n = 1024 * 784;
        nt_tensor *in[4];
        for (int i = 0; i < 4; i++)
            in[i] = nt_randn(NT_F32, 2, shape, 11 + (uint64_t)i);
        nt_tensor *vp = nt_abs(in[3]); /* v >= 0 */
        nt_release(in[3]);
        in[3] = vp;
        assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
        float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        sched_run("lazy", sched_adamw, in, &st, a, (size_t)n * 4);
        assert_int_equal(st.kernels, 1);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)n * 4 * 4);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)n * 4);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# AdamW-like chain over [1024, 784]: %.0f ns, DMA floor %.0f ns (%.2fx)\n",
                      st.sim_ns, floor, st.sim_ns / floor);
        assert_true(st.sim_ns <= 1.25 * floor);
        sched_cpu(sched_adamw, in, b, (size_t)n * 4);
        assert_memory_equal(a, b, (size_t)n * 4);
        assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
        free(a), free(b);
        for (int i = 0; i < 4; i++)
            nt_release(in[i]);
    }
    /* 3. the linear layer x @ w^T, w [1024, 784]: w is read once, straight
     * (no HBM scratch), and transposed on TensorE from 2 KiB runs; the
     * transposes of the next K-tile overlap this one's matmuls (1.75x of
     * the floor with 512-byte runs transposed in line; what is left is the
     * first loads' and the last store's fixed DMA cost) */
    {
        nt_tensor *in[2] = {nt_randn(NT_F32, 2, (int64_t[]){128, 784}, 21),
                            nt_randn(NT_F32, 2, (int64_t[]){1024, 784}, 22)};
        size_t ob = (size_t)128 * 1024 * 4;
        float *a = malloc(ob), *b = malloc(ob);
        sched_run("eager", sched_linear, in, &st, a, ob);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)(128 + 1024) * 784 * 4);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)ob);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# x @ w^T [128, 784] x [784, 1024]: %.0f ns, DMA floor %.0f ns (%.2fx)\n",
                      st.sim_ns, floor, st.sim_ns / floor);
        assert_true(st.sim_ns <= 1.65 * floor);
        sched_cpu(sched_linear, in, b, ob);
        assert_memory_equal(a, b, ob);
        free(a), free(b);
        nt_release(in[0]), nt_release(in[1]);
    }
    /* 4. a gradient matmul and its in-place update, an unrelated op in
     * between: the matmul moves to its chain (fusion/plan.c) and runs as
     * one MM program with the update as its epilogue, two kernels in all;
     * each block's loads of p and m go before the previous block's stores
     * and VectorE keeps only the tensor_tensor work, so the kernel is within
     * 25% of its bytes' DMA time (it took 1.8x: every block's loads waited
     * for the stores before them) */
    {
        const int64_t B = 128, O = 1024, I = 784, n = O * I;
        size_t gb = (size_t)n * 4;
        float *a = malloc(gb), *b = malloc(gb), *pa = malloc(gb), *pb = malloc(gb);
        nt_tensor *in[2][5];
        for (int r = 0; r < 2; r++) { /* one set per backend: the update writes them */
            in[r][0] = nt_randn(NT_F32, 2, (int64_t[]){B, O}, 31);
            in[r][1] = nt_randn(NT_F32, 2, (int64_t[]){B, I}, 32);
            in[r][2] = nt_randn(NT_F32, 2, (int64_t[]){O, I}, 33);
            in[r][3] = nt_randn(NT_F32, 2, (int64_t[]){O, I}, 34);
            in[r][4] = nt_randn(NT_F32, 1, (int64_t[]){100}, 35);
        }
        assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
        sched_run("lazy", sched_grad_update, in[0], &st, a, gb);
        assert_int_equal(st.kernels, 2);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)((B * O + B * I + 2 * n + 100) * 4));
        assert_int_equal(st.hbm_write_bytes, (uint64_t)((3 * n + 100) * 4));
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# dz^T x [1024, 784] + in-place update: %.0f ns, DMA floor %.0f ns (%.2fx)\n",
                      st.sim_ns, floor, st.sim_ns / floor);
        assert_true(st.sim_ns <= 1.25 * floor);
        assert_int_equal(nt_to_host(in[0][2], pa, gb), 0);
        sched_cpu(sched_grad_update, in[1], b, gb);
        assert_int_equal(nt_to_host(in[1][2], pb, gb), 0);
        assert_memory_equal(a, b, gb);
        assert_memory_equal(pa, pb, gb);
        assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
        free(a), free(b), free(pa), free(pb);
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 5; i++)
                nt_release(in[r][i]);
    }
    /* 5. a matmul whose two N-chunks share their rows ([10, 1024]: the head's
     * weight gradient): one store for both, not two that wait for each
     * other on shared HBM pages (9.3 us before) */
    {
        nt_tensor *in[2] = {nt_randn(NT_F32, 2, (int64_t[]){128, 10}, 41),
                            nt_randn(NT_F32, 2, (int64_t[]){128, 1024}, 42)};
        size_t ob = (size_t)10 * 1024 * 4;
        float *a = malloc(ob), *b = malloc(ob);
        sched_run("eager", sched_mm_small, in, &st, a, ob);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)(128 * 10 + 128 * 1024) * 4);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)ob);
        print_message("# dz^T h [10, 128] x [128, 1024]: %.0f ns\n", st.sim_ns);
        assert_true(st.sim_ns <= 8600);
        sched_cpu(sched_mm_small, in, b, ob);
        assert_memory_equal(a, b, ob);
        free(a), free(b);
        nt_release(in[0]), nt_release(in[1]);
    }
    /* 7. a chain whose first ops read only a cast's output stays one kernel
     * with the rest of the chain: the planner does not pull those ops back
     * next to the cast (fusion/plan.c joins_its_reader), which wrote g * 0.1
     * and g * g to HBM and read them again (a bf16 step moved 16 MB more).
     * Two kernels: the cast and the unrelated add, independent of each
     * other, share one (a foreach kernel, fusion/plan.c join_offer; three
     * with NT_FOREACH=0), and the chain; each byte moves once either way. */
    {
        const int64_t n = 512 * 1024;
        size_t ob = (size_t)n * 4;
        float *a = malloc(ob), *b = malloc(ob);
        nt_tensor *in[4] = {nt_cast(nt_randn(NT_F32, 1, &n, 51), NT_BF16),
                            nt_randn(NT_F32, 1, &n, 52), nt_abs(nt_randn(NT_F32, 1, &n, 53)),
                            nt_randn(NT_F32, 1, (int64_t[]){100}, 54)};
        assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
        sched_run("lazy", sched_cast_chain, in, &st, a, ob);
        assert_int_equal(st.kernels, 2);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)(n * 2 + 100 * 4 + 3 * n * 4));
        assert_int_equal(st.hbm_write_bytes, (uint64_t)(n * 4 + 100 * 4 + n * 4));
        sched_cpu(sched_cast_chain, in, b, ob);
        assert_memory_equal(a, b, ob);
        assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
        free(a), free(b);
        for (int i = 0; i < 4; i++)
            nt_release(in[i]);
    }
    /* 8. a bias gradient over B*T = 2048 rows ([2048, 512] over dim 0): the
     * positions turn on TensorE 2048 at a time through PSUM banks, one group
     * of 128 columns folding while the next loads; within 1.5x of its bytes'
     * DMA time (the rows on partitions read one element per descriptor:
     * 253 us) */
    {
        nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){2048, 512}, 61);
        float *a = malloc(512 * 4), *b = malloc(512 * 4);
        sched_run("eager", sched_sum0, &x, &st, a, 512 * 4);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)2048 * 512 * 4);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)512 * 4);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# sum over dim 0 of [2048, 512]: %.0f ns, DMA floor %.0f ns (%.2fx)\n",
                      st.sim_ns, floor, st.sim_ns / floor);
        assert_true(st.sim_ns <= 1.5 * floor);
        sched_cpu(sched_sum0, &x, b, 512 * 4);
        assert_memory_equal(a, b, 512 * 4);
        free(a), free(b);
        nt_release(x);
    }
    /* 9. nt_linear's product on batched rows, x [16, 128, 128] . w^T [384,
     * 128]: the batches are one program of 2048 rows, w loaded and turned
     * once and the M-tiles streaming past it (neuron/tp_matmul.c, run_stream),
     * not 16 programs that each loaded w again and ran their loads, matmul
     * and store in series (60 us), nor blocks of 7 M-tiles that reloaded w
     * and waited for each other (1.4 MB read) */
    {
        nt_tensor *in[2] = {nt_randn(NT_F32, 3, (int64_t[]){16, 128, 128}, 71),
                            nt_randn(NT_F32, 2, (int64_t[]){384, 128}, 72)};
        size_t ob = (size_t)2048 * 384 * 4;
        float *a = malloc(ob), *b = malloc(ob);
        sched_run("eager", sched_linear, in, &st, a, ob);
        assert_int_equal(st.kernels, 1);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)(2048 + 384) * 128 * 4);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)ob);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# x [16, 128, 128] @ w^T [128, 384]: %.0f ns, DMA floor %.0f ns (%.2fx)\n",
                      st.sim_ns, floor, st.sim_ns / floor);
        assert_true(st.sim_ns <= 1.35 * floor);
        sched_cpu(sched_linear, in, b, ob);
        assert_memory_equal(a, b, ob);
        free(a), free(b);
        nt_release(in[0]), nt_release(in[1]);
    }
    /* 10. layer norm of [2048, 128] rows (the GPT's): each sum one
     * instruction, the per-row steps on ScalarE, the groups' tiles in a
     * ring and each group's products issued two groups later, so that
     * VectorE never waits behind a group's ScalarE chain (44.7 us when
     * every group ran ~20 dependent instructions, mostly on VectorE) */
    {
        nt_tensor *in[3] = {nt_randn(NT_F32, 2, (int64_t[]){2048, 128}, 81),
                            nt_randn(NT_F32, 1, (int64_t[]){128}, 82),
                            nt_randn(NT_F32, 1, (int64_t[]){128}, 83)};
        size_t ob = (size_t)2048 * 128 * 4;
        float *a = malloc(ob), *b = malloc(ob);
        sched_run("eager", sched_layer_norm, in, &st, a, ob);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# layer_norm [2048, 128]: %.0f ns, DMA floor %.0f ns (%.2fx)\n", st.sim_ns,
                      floor, st.sim_ns / floor);
        assert_true(st.sim_ns <= 3.0 * floor);
        sched_cpu(sched_layer_norm, in, b, ob);
        assert_memory_equal(a, b, ob);
        free(a), free(b);
        for (int i = 0; i < 3; i++)
            nt_release(in[i]);
    }
    /* 11. gradient clipping's 2-norms over all of a bias and of a weight:
     * one block is its own result (no fold across partitions), a weight's
     * squares and block sums are one ScalarE activation per tile, and the
     * sqrt table loads while the first tile does (5.9 and 14.8 us) */
    {
        static const int64_t ns[2] = {128, 384 * 128};
        static const double lim[2] = {4500, 10500};
        for (int i = 0; i < 2; i++) {
            nt_tensor *x = nt_randn(NT_F32, 1, &ns[i], 91);
            float a, b;
            sched_run("eager", sched_norm2, &x, &st, &a, sizeof a);
            print_message("# 2-norm over all of %lld elements: %.0f ns\n", (long long)ns[i],
                          st.sim_ns);
            assert_true(st.sim_ns <= lim[i]);
            sched_cpu(sched_norm2, &x, &b, sizeof b);
            assert_memory_equal(&a, &b, sizeof a);
            nt_release(x);
        }
    }
    /* 12. causal attention over 16 heads of [128, 32] (the GPT's): the
     * log-sum-exp of every head waits for one LOG activation and one
     * store, where each head switched ScalarE's table from exp to log and
     * back (2 us a head) and the heads' lse stores waited for each other on
     * shared HBM pages (64 heads: 264.7 -> 146.1 us) */
    {
        int64_t sh[4] = {4, 4, 128, 32};
        nt_tensor *in[3] = {nt_randn(NT_F32, 4, sh, 101), nt_randn(NT_F32, 4, sh, 102),
                            nt_randn(NT_F32, 4, sh, 103)};
        size_t ob = (size_t)16 * 128 * 32 * 4;
        float *a = malloc(ob), *b = malloc(ob);
        sched_run("eager", sched_sdpa, in, &st, a, ob);
        print_message("# causal attention, 16 heads [128, 32]: %.0f ns\n", st.sim_ns);
        assert_true(st.sim_ns <= 50000);
        sched_cpu(sched_sdpa, in, b, ob);
        assert_memory_equal(a, b, ob);
        free(a), free(b);
        for (int i = 0; i < 3; i++)
            nt_release(in[i]);
    }
    /* 6. the one-block sum's shortcut (partial + 0) keeps the CPU's signed
     * zeros and NaN: a column of -0 sums to +0, a NaN column to NaN */
    {
        float h[128 * 4], a[4], b[4];
        for (int i = 0; i < 128; i++) {
            h[i * 4 + 0] = -0.0f;
            h[i * 4 + 1] = i == 5 ? NAN : 1.0f;
            h[i * 4 + 2] = (float)i * 0.37f - 20.0f;
            h[i * 4 + 3] = i & 1 ? -0.0f : 0.0f;
        }
        nt_tensor *x = nt_from_host(h, NT_F32, 2, (int64_t[]){128, 4});
        sched_run("eager", sched_sum0, &x, &st, a, sizeof a);
        sched_cpu(sched_sum0, &x, b, sizeof b);
        assert_memory_equal(a, b, sizeof a);
        assert_false(signbit(a[0]));
        assert_true(isnan(a[1]));
        nt_release(x);
    }
}

static nt_tensor *sched_linear_bias(nt_tensor **in) { return nt_linear(in[0], in[1], in[2]); }
/* layer norm's statistics recomputed in its backward: one ROW program
 * with three outputs (xhat and the row's rstd live on: in[2], in[3]) */
static nt_tensor *sched_ln_recompute(nt_tensor **in)
{
    nt_tensor *xc = nt_sub(in[0], nt_mean(in[0], 1, true));
    nt_tensor *r = nt_rsqrt(nt_add_scalar(nt_mean(nt_mul(xc, xc), 1, true), 1e-5));
    nt_tensor *xh = nt_mul(xc, r);
    in[2] = nt_keep(xh);
    in[3] = nt_keep(r);
    return nt_mul(xh, in[1]);
}
/* attention's heads of a [B, T, 3D] projection made contiguous ([B, H, T,
 * hd]), as autograd's cat for sdpa_bwd does */
static nt_tensor *sched_heads(nt_tensor **in)
{
    nt_tensor *s = nt_slice(in[0], 2, 128, 256, 1);
    return nt_contiguous(nt_permute(nt_reshape(s, 4, (int64_t[]){16, 128, 4, 32}),
                                    (int[]){0, 2, 1, 3}));
}

/* Schedules of the char GPT's kernels (issue 31): each within a bound of
 * its floor and bit for bit the CPU's. */
static void test_gpt_schedules(void **state)
{
    (void)state;
    nt_sim_stats st;
    /* 1. the qkv layer, x [16, 128, 128] . w^T [384, 128] + b: one MM
     * program; the bias goes into SBUF once as [128, 384] (it was loaded
     * with every block of 128 rows: 3.1 MB of the kernel's 7.5), and the
     * add reads the accumulator from PSUM (N VectorE cycles) instead of an
     * f32 copy ScalarE made first (then 2N); b holds -0, Inf and NaN */
    {
        nt_tensor *in[3] = {nt_randn(NT_F32, 3, (int64_t[]){16, 128, 128}, 111),
                            nt_randn(NT_F32, 2, (int64_t[]){384, 128}, 112), NULL};
        float bh[384];
        for (int i = 0; i < 384; i++)
            bh[i] = (float)(i % 7) * 0.25f - 0.75f;
        bh[3] = -0.0f, bh[100] = INFINITY, bh[200] = NAN, bh[300] = -INFINITY;
        in[2] = nt_from_host(bh, NT_F32, 1, (int64_t[]){384});
        size_t ob = (size_t)2048 * 384 * 4;
        float *a = malloc(ob), *b = malloc(ob);
        assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
        sched_run("lazy", sched_linear_bias, in, &st, a, ob);
        assert_int_equal(st.kernels, 1);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)(2048 + 384 + 128 * 3) * 128 * 4);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)ob);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# x [16, 128, 128] @ w^T [128, 384] + b: %.0f ns, DMA floor %.0f ns "
                      "(%.2fx), ScalarE %.0f ns\n",
                      st.sim_ns, floor, st.sim_ns / floor, st.busy_ns[NT_ENGINE_SCALAR]);
        assert_true(st.sim_ns <= 1.35 * floor);
        assert_true(st.busy_ns[NT_ENGINE_SCALAR] == 0);
        sched_cpu(sched_linear_bias, in, b, ob);
        assert_memory_equal(a, b, ob);
        assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
        free(a), free(b);
        for (int i = 0; i < 3; i++)
            nt_release(in[i]);
    }
    /* 2. a permuted copy, the heads of [16, 128, 384] to [16, 4, 128, 32]:
     * T on partitions and (B, H, hd) on the free axis (sk_tiler_init's
     * reorder), four tiles of 256 KiB, where T on partitions with hd = 32
     * alone on the free axis made 64 tiles of 16 KiB, each load and store
     * paying the DMA's fixed cost (46.6 us) */
    {
        nt_tensor *x = nt_randn(NT_F32, 3, (int64_t[]){16, 128, 384}, 121);
        size_t ob = (size_t)16 * 128 * 128 * 4;
        float *a = malloc(ob), *b = malloc(ob);
        sched_run("eager", sched_heads, &x, &st, a, ob);
        assert_int_equal(st.kernels, 1);
        assert_int_equal(st.hbm_read_bytes, (uint64_t)ob);
        assert_int_equal(st.hbm_write_bytes, (uint64_t)ob);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# heads of [16, 128, 384] made contiguous: %.0f ns, %llu instructions, "
                      "DMA floor %.0f ns (%.2fx)\n",
                      st.sim_ns, (unsigned long long)st.instructions, floor, st.sim_ns / floor);
        assert_true(st.instructions <= 16);
        assert_true(st.sim_ns <= 1.6 * floor);
        sched_cpu(sched_heads, &x, b, ob);
        assert_memory_equal(a, b, ob);
        free(a), free(b);
        nt_release(x);
    }
    /* 3. that recompute over [2048, 128] (the GPT's layer norms): a stored
     * value keeps its register for the rest of its tile and six register
     * sets rotate, so no op waits for a store's DMA and a tile's loads go
     * while the tiles before it compute (70 us: every tile's chain waited
     * for its own stores, and its loads for the stores two tiles back) */
    {
        nt_tensor *in[4] = {nt_randn(NT_F32, 2, (int64_t[]){2048, 128}, 131),
                            nt_randn(NT_F32, 1, (int64_t[]){128}, 132), NULL, NULL};
        size_t ob = (size_t)2048 * 128 * 4;
        float *a = malloc(ob), *b = malloc(ob), *xa = malloc(ob), *xb = malloc(ob);
        float ra[2048], rb[2048];
        assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
        sched_run("lazy", sched_ln_recompute, in, &st, a, ob);
        assert_int_equal(st.kernels, 1);
        assert_int_equal(nt_to_host(in[2], xa, ob), 0);
        assert_int_equal(nt_to_host(in[3], ra, sizeof ra), 0);
        nt_release(in[2]), nt_release(in[3]);
        double floor = dma_floor_ns((double)(st.hbm_read_bytes + st.hbm_write_bytes));
        print_message("# layer norm recompute [2048, 128], 3 outputs: %.0f ns, DMA floor %.0f ns "
                      "(%.2fx)\n", st.sim_ns, floor, st.sim_ns / floor);
        assert_true(st.sim_ns <= 2.6 * floor);
        sched_cpu(sched_ln_recompute, in, b, ob);
        assert_int_equal(nt_to_host(in[2], xb, ob), 0);
        assert_int_equal(nt_to_host(in[3], rb, sizeof rb), 0);
        assert_memory_equal(a, b, ob);
        assert_memory_equal(xa, xb, ob);
        assert_memory_equal(ra, rb, sizeof ra);
        assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
        free(a), free(b), free(xa), free(xb);
        for (int i = 0; i < 4; i++)
            nt_release(in[i]);
    }
}

static void test_big_shapes(void **state)
{
    (void)state;
    cmp("shapes beyond SBUF", b_big, NULL);
    assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
    cmp_mode("shapes beyond SBUF, fused", "lazy", b_big, NULL);
    assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
}

/* embedding_bwd's GpSimd scatter-add costs 2 cycles for each element it
 * adds, on one lane: linear in the width.  It was charged 2 dw cycles per
 * element of its accumulator's width, quadratic (81 of the 103 simulated
 * ms of a GPT-2-small-shaped block's step), 9x from D = 256 to 768. */
static void test_embedding_bwd_cost_linear(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    enum { P = 512, V = 100 };
    int32_t iv[P];
    for (int i = 0; i < P; i++)
        iv[i] = (i * 37) % V;
    const int64_t D[2] = {256, 768};
    double busy[2];
    for (int k = 0; k < 2; k++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *w = nt_randn(NT_F32, 2, (int64_t[]){V, D[k]}, 3);
        assert_int_equal(nt_set_requires_grad(w, true), 0);
        nt_tensor *ix = nt_from_host(iv, NT_I32, 1, (int64_t[]){P});
        nt_tensor *y = nt_embedding(w, ix);
        assert_int_equal(nt_sync(), 0);
        nt_sim_stats_reset();
        assert_int_equal(nt_backward(nt_sum(y, NT_DIM_ALL, false)), 0);
        assert_int_equal(nt_sync(), 0);
        nt_sim_stats st;
        assert_int_equal(nt_sim_stats_get(&st), 0);
        busy[k] = st.busy_ns[NT_ENGINE_GPSIMD];
        assert_int_equal(nt_scope_end(sc), 0);
    }
    print_message("# embedding_bwd GpSimd busy: D=256 %.1f us, D=768 %.1f us\n", busy[0] * 1e-3,
                  busy[1] * 1e-3);
    assert_true(busy[1] / busy[0] > 2.9 && busy[1] / busy[0] < 3.1);
    /* 4 tiles of 128 positions, 150 + 2 * 128 * 768 cycles each, at 1.2 GHz
     * or faster */
    assert_true(busy[1] < 1.05 * 4 * (150 + 2.0 * 128 * 768) / 1.2);
}

/* bf16 attention is not slower than f32 on the simulator: its operands
 * widen on chip from one SBUF slot each, so a head's loads overlap (with
 * one shared slot each load waited for the last one's widening copy: the
 * char GPT's attention took 2.8x its f32 time under bf16 autocast). */
static void test_sdpa_bf16_not_slower(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    double ns[2];
    for (int k = 0; k < 2; k++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x[3];
        for (int i = 0; i < 3; i++) {
            x[i] = nt_randn(NT_F32, 4, (int64_t[]){4, 4, 128, 32}, 7 + (uint64_t)i);
            if (k)
                x[i] = nt_cast(x[i], NT_BF16);
            assert_int_equal(nt_set_requires_grad(x[i], true), 0);
        }
        nt_tensor *y = nt_scaled_dot_product_attention(x[0], x[1], x[2], NULL, true, 0.125);
        nt_tensor *l = nt_sum(nt_cast(y, NT_F32), NT_DIM_ALL, false);
        assert_int_equal(nt_sync(), 0);
        nt_sim_stats_reset();
        assert_int_equal(nt_backward(l), 0);
        assert_int_equal(nt_sync(), 0);
        nt_sim_stats a;
        assert_int_equal(nt_sim_stats_get(&a), 0);
        ns[k] = a.sim_ns;
        nt_sim_stats_reset();
        nt_tensor *y2 = nt_scaled_dot_product_attention(x[0], x[1], x[2], NULL, true, 0.125);
        assert_non_null(y2);
        assert_int_equal(nt_sync(), 0);
        nt_sim_stats b;
        assert_int_equal(nt_sim_stats_get(&b), 0);
        ns[k] += b.sim_ns;
        assert_int_equal(nt_scope_end(sc), 0);
    }
    print_message("# sdpa forward + backward, simulated: f32 %.1f us, bf16 %.1f us\n", ns[0] * 1e-3,
                  ns[1] * 1e-3);
    assert_true(ns[1] <= 1.1 * ns[0]);
}

static void test_sim_stats_and_trace_hook(void **state)
{
    (void)state;
    /* values per instruction first, as the suite runs it (tests/meson.build:
     * NT_SIM_PROGRAM_VALUES=0), whatever the environment: run by hand with
     * the default it failed */
    bool pv0 = nt__sim_program_values();
    nt__sim_set_program_values(false);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    nt_sim_stats_reset();
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){256, 256}, 1);
    nt_tensor *y = nt_matmul(x, x);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats st;
    assert_int_equal(nt_sim_stats_get(&st), 0);
    assert_true(st.kernels >= 2);
    assert_true(st.flops == 2.0 * 256 * 256 * 256);
    assert_true(st.sim_ns > 0 && st.mfu > 0 && st.mfu <= 1.0);
    assert_true(st.host_ns > 0 && st.host_gemm_ns > 0);
    nt_stats s;
    nt_stats_get(&s);
    assert_true(s.sim_kernels >= 2);
    assert_true(s.sim_time_ns > 0);
    /* values per instruction here (the suite's setting): none once per program */
    assert_true(!nt__sim_program_values() && st.host_values_ns == 0);
    /* once per program: the GEMM runs in the CPU kernel, counted there */
    nt__sim_set_program_values(true);
    nt_sim_stats_reset();
    nt_tensor *y2 = nt_matmul(x, x);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats st2;
    assert_int_equal(nt_sim_stats_get(&st2), 0);
    nt__sim_set_program_values(pv0);
    assert_true(st2.host_values_ns > 0 && st2.host_gemm_ns == 0);
    assert_true(st2.host_values_ns <= st2.host_ns);
    nt_release(y2);
    nt_release(x), nt_release(y);
}

/* The simulated clock depends only on the program (issue 16: identical runs
 * reported 1.011 and 1.054 ms/step).  A small training step runs in two
 * threads on their own streams (their kernels reach the core in whatever
 * order the host gives), twice, with nt_shutdown / nt_init between and the
 * host allocations shifted by a different spacer each time (buffers land at
 * other addresses and alignments): simulated nanoseconds must be equal to
 * the last bit, in every mode whose batches the program fixes.  Adaptive
 * mode fuses what queued while the worker was busy, which is host timing by
 * design, so its kernels -- and their time -- may differ (docs/sim.md). */
static gpointer sim_step_thread(gpointer p)
{
    (void)p;
    nt_stream *s = nt_stream_create();
    nt_stream_set_current(s);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){64, 96}, 1);
    nt_tensor *w = nt_randn(NT_F32, 2, (int64_t[]){96, 48}, 2);
    nt_set_requires_grad(w, true);
    for (int step = 0; step < 3; step++) {
        nt_tensor *h = nt_relu(nt_matmul(x, w));
        nt_tensor *loss = nt_mean(nt_mul(h, h), NT_DIM_ALL, false);
        nt_backward(loss);
        nt_tensor *g = nt_grad(w);
        double l, gs;
        nt_item(loss, &l);
        nt_item(nt_sum(g, NT_DIM_ALL, false), &gs);
        nt_release(g);
        nt_zero_grad(w);
    }
    nt_scope_end(sc);
    nt_stream_set_current(NULL);
    nt_stream_destroy(s);
    return NULL;
}

static double sim_ns_of_run(const char *mode, size_t spacer)
{
    void *pad = malloc(spacer); /* shifts where the host puts what follows */
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    nt_sim_stats_reset();
    GThread *a = g_thread_new("s1", sim_step_thread, NULL);
    GThread *b = g_thread_new("s2", sim_step_thread, NULL);
    g_thread_join(a);
    g_thread_join(b);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats st;
    nt_sim_stats_get(&st);
    nt_shutdown();
    free(pad);
    return st.sim_ns;
}

static void test_sim_time_is_the_programs(void **state)
{
    (void)state;
    nt_shutdown(); /* each run has a runtime of its own */
    const char *modes[] = {"eager", "lazy", "deterministic"};
    int ok = 0;
    for (int m = 0; m < 3; m++) {
        double t1 = sim_ns_of_run(modes[m], 24), t2 = sim_ns_of_run(modes[m], 4096 + 40);
        print_message("# %s: %.3f ns, %.3f ns simulated\n", modes[m], t1, t2);
        ok += t1 > 0 && t1 == t2;
    }
    assert_int_equal(ok, 3);
    assert_int_equal(nt_init(), 0); /* for the teardown */
}

int main(void)
{
    const char *q = getenv("NT_TEST_QUICK");
    quick = q && *q && *q != '0';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_scalar, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_binary_compare_where, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_backward_helpers, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_copy_cast, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fill_arange_rand, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_reductions, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_column_reductions, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_rows, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_rows, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_program_values, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_timing_memo, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_timing_memo_keys, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_timing_memo_scalars, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul_instruction_level, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_embedding, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_data_error_messages, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_reductions, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gather_index_select_repeat_split, setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_min_epilogue, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_programs, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fused_hbm_bytes, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_kernel_schedules, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gpt_schedules, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_stochastic_rounding, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_require_sim_and_min_flops, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_generator_refuses_other_op, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_backend_supports, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_user_tile_kernel, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_big_shapes, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_embedding_bwd_cost_linear, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sdpa_bf16_not_slower, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sim_stats_and_trace_hook, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sim_time_is_the_programs, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_step_chains, setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
