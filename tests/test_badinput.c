/* tests/test_badinput.c - the bad-input campaign: every public function of
 * include/ntensor.h called with arguments it must refuse.
 *
 * One table of cases, built at start-up from small generators (every unary
 * op x {NULL, released}, every binary op x {NULL a, NULL b, released a,
 * released b, shapes that do not broadcast, a broadcast past 2^48
 * elements}, ...).  Each case is one cmocka test that asserts
 *   - the return value and nt_last_error() are the expected NT_E* code,
 *   - the message names the function (and, where given, the argument or
 *     field: "lr", "shape[1]", ...),
 *   - nothing leaked or stayed queued: after the call nt_sync() returns 0
 *     and the device bytes in use are what they were before.
 * Functions whose contract is a sentinel instead of an error (nt_ndim of a
 * released tensor is -1, nt_dtype_name(99) is "?") have sentinel cases: the
 * value is asserted and no error may be set.  The suite runs under ASan and
 * UBSan too (scripts/test.sh), where any overflow the checks miss is fatal.
 *
 * NT_HANDLE_QUARANTINE=all is set before nt_init, so the released handles
 * of the fixture stay detectably released however many cases run. */
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

#include "ntensor.h"
#include "core/optable.h"
#include "nt_test.h"
#include "crc32.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define SENTINEL 1000 /* a case whose contract is a return value, not an error */
#define KERNEL 2000   /* NT_ESIM, with the message in the kernel (nt_sim_kernel_message) */

/* ------------------------------------------------------------------ */
/* Fixture                                                            */
/* ------------------------------------------------------------------ */

static struct {
    nt_tensor *a23, *b23, *a32, *i23, *u23, *v4, *s0, *rel, *ex, *big_a, *big_b, *lab2, *w,
        *pw, *pw2, *bf;
    nt_optim *sgd, *adam;
    nt_grad_scaler *sc;
    nt_stream *st;
    nt_event *ev;
    int user_op, kernel_op;
    char ckpt[300];  /* a valid checkpoint of pw2 + adam + sc */
    uint8_t *ckbuf;  /* its bytes */
    size_t cklen;
} F;

static nt_tensor *mk(nt_dtype dt, int nd, const int64_t *sh)
{
    nt_tensor *t = nt_zeros(dt, nd, sh);
    assert_non_null(t);
    return t;
}

static nt_tensor *uop_fwd(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_neg(in[0]);
}

static int kshape(const nt_tensor_view *in, int nin, nt_tensor_view *out, char *why, size_t n,
                  void *ctx)
{
    (void)nin, (void)why, (void)n, (void)ctx;
    *out = in[0];
    return 0;
}

/* Shape rules that break the contract in the way ctx says. */
static int kshape_bad(const nt_tensor_view *in, int nin, nt_tensor_view *out, char *why,
                      size_t n, void *ctx)
{
    (void)nin;
    *out = in[0];
    switch ((int)(intptr_t)ctx) {
    case 0: out->ndim = 9; break;
    case 1: out->ndim = -1; break;
    case 2: out->shape[0] = -4; break;
    case 3: out->ndim = 2, out->shape[0] = out->shape[1] = (int64_t)1 << 60; break;
    case 4: out->dtype = (nt_dtype)42; break;
    case 5: snprintf(why, n, "no thanks"); return NT_ESHAPE;
    case 6: return 7;      /* not an error code */
    case 7: return -12345; /* not an NT_E* code */
    case 8: out->ndim = 2, out->shape[0] = (int64_t)1 << 32, out->shape[1] = (int64_t)1 << 32;
        break; /* 2^64: wraps to 0 */
    }
    return 0;
}

static int kkernel(nt_sim_kernel *k, const nt_tensor_view *in, int nin, const nt_tensor_view *out,
                   void *ctx)
{
    (void)k, (void)in, (void)nin, (void)out, (void)ctx;
    return 0;
}

static void fixture_make(void)
{
    memset(&F, 0, sizeof F);
    F.a23 = mk(NT_F32, 2, SH(2, 3));
    F.b23 = mk(NT_F32, 2, SH(2, 3));
    F.a32 = mk(NT_F32, 2, SH(3, 2));
    F.i23 = mk(NT_I32, 2, SH(2, 3));
    F.u23 = mk(NT_U8, 2, SH(2, 3));
    F.v4 = mk(NT_F32, 1, SH(4));
    F.s0 = mk(NT_F32, 0, NULL);
    F.bf = mk(NT_BF16, 2, SH(2, 3));
    F.rel = mk(NT_F32, 2, SH(2, 3));
    assert_int_equal(nt_release(F.rel), 0);
    nt_tensor *one = mk(NT_F32, 2, SH(1, 3));
    F.ex = nt_expand(one, 2, SH(2, 3));
    nt_tensor *o11 = mk(NT_F32, 2, SH(1, 1));
    F.big_a = nt_expand(o11, 2, SH((int64_t)1 << 33, 1));
    F.big_b = nt_expand(o11, 2, SH(1, (int64_t)1 << 31));
    assert_non_null(F.ex);
    assert_non_null(F.big_a);
    assert_non_null(F.big_b);
    nt_release(one);
    nt_release(o11);
    F.lab2 = mk(NT_I32, 1, SH(2));
    F.w = mk(NT_F32, 2, SH(2, 3));
    assert_int_equal(nt_set_requires_grad(F.w, true), 0);
    F.pw = mk(NT_F32, 1, SH(3));
    F.pw2 = mk(NT_F32, 1, SH(3));
    assert_int_equal(nt_set_requires_grad(F.pw, true), 0);
    assert_int_equal(nt_set_requires_grad(F.pw2, true), 0);
    F.sgd = nt_optim_sgd(&F.pw, 1, 0.1, 0.9, 0, false);
    F.adam = nt_optim_adamw(&F.pw2, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    F.sc = nt_grad_scaler_create(NULL);
    F.st = nt_stream_create();
    F.ev = nt_event_create();
    assert_non_null(F.sgd);
    assert_non_null(F.adam);
    assert_non_null(F.sc);
    assert_non_null(F.st);
    assert_non_null(F.ev);
    F.user_op = nt_op_register(&(nt_op_def){"badinput_neg", 1, uop_fwd, NULL, NULL});
    assert_true(F.user_op >= 0);
    F.kernel_op = nt_op_register_kernel(
        &(nt_kernel_op_def){"badinput_kernel", 1, kshape, kkernel, NULL, NULL});
    assert_true(F.kernel_op >= 0);
    /* a valid checkpoint with optimizer and scaler records */
    snprintf(F.ckpt, sizeof F.ckpt, "%s/good.ntck", nt_test_dir);
    assert_int_equal(nt_checkpoint_save(F.ckpt, &F.pw2, 1, F.adam, F.sc), 0);
    FILE *f = fopen(F.ckpt, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    F.cklen = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    F.ckbuf = malloc(F.cklen);
    assert_int_equal(fread(F.ckbuf, 1, F.cklen, f), F.cklen);
    fclose(f);
}

static void fixture_free(void)
{
    nt_optim_destroy(F.sgd);
    nt_optim_destroy(F.adam);
    nt_grad_scaler_destroy(F.sc);
    nt_event_destroy(F.ev);
    nt_stream_destroy(F.st);
    free(F.ckbuf);
}

/* ------------------------------------------------------------------ */
/* Cases                                                              */
/* ------------------------------------------------------------------ */

typedef struct bcase {
    char name[112];
    const char *fn;   /* the function the message must name */
    const char *want; /* another substring the message must hold, or NULL */
    int code;         /* expected NT_E*, or SENTINEL */
    int (*run)(int v);
    int v;
} bcase;

static bcase *cases;
static int ncases, capcases;

static void add(const char *fn, int code, const char *want, int (*run)(int), int v,
                const char *fmt, ...)
{
    if (ncases == capcases) {
        capcases = capcases ? 2 * capcases : 256;
        cases = realloc(cases, sizeof *cases * (size_t)capcases);
        assert_non_null(cases);
    }
    bcase *c = &cases[ncases++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
    c->fn = fn;
    c->want = want;
    c->code = code;
    c->run = run;
    c->v = v;
}

/* A tensor result: a non-NULL one is an unexpected success (1). */
static int T(nt_tensor *t)
{
    if (t) {
        nt_release(t);
        return 1;
    }
    return nt_last_error();
}
/* Any other pointer result. */
static int P(void *p) { return p ? 1 : nt_last_error(); }
/* A sentinel: 0 if the documented value came back. */
static int S(bool ok) { return ok ? 0 : 1; }

/* ---- elementwise ---- */

typedef nt_tensor *(*un_fn)(nt_tensor *);
typedef nt_tensor *(*bin_fn)(nt_tensor *, nt_tensor *);
typedef int (*ibin_fn)(nt_tensor *, nt_tensor *);
typedef nt_tensor *(*sc_fn)(nt_tensor *, double);
typedef int (*isc_fn)(nt_tensor *, double);
typedef nt_tensor *(*red_fn)(nt_tensor *, int, bool);

static const struct { const char *name; un_fn f; } UN[] = {
/* every unary op of core/optable.h, then the other one-tensor calls */
#define T_UNARY(ID, name, ...) {"nt_" #name, nt_##name},
    NT_OPS_UNARY(T_UNARY)
#undef T_UNARY
    {"nt_contiguous", nt_contiguous},
    {"nt_detach", nt_detach},   {"nt_zeros_like", nt_zeros_like},
    {"nt_ones_like", nt_ones_like},
};
#define NUN ((int)(sizeof UN / sizeof UN[0]))

static int run_un(int v)
{
    int op = v / 2;
    return T(UN[op].f(v % 2 ? F.rel : NULL));
}

static const struct { const char *name; bin_fn f; } BIN[] = {
/* every binary and compare op of core/optable.h, then the other two-tensor calls */
#define T_BINARY(ID, name, ...) {"nt_" #name, nt_##name},
    NT_OPS_BINARY(T_BINARY)
    NT_OPS_CMP(T_BINARY)
#undef T_BINARY
    {"nt_mse_loss", nt_mse_loss}, {"nt_matmul", nt_matmul},
};
#define NBIN ((int)(sizeof BIN / sizeof BIN[0]))
enum { B_NULL_A, B_NULL_B, B_REL_A, B_REL_B, B_SHAPE, B_OVERFLOW, B_RANK, B_NV };

static int run_bin(int v)
{
    int op = v / B_NV, k = v % B_NV;
    bool mm = !strcmp(BIN[op].name, "nt_matmul");
    nt_tensor *a = F.a23, *b = mm ? F.a32 : F.b23;
    switch (k) {
    case B_NULL_A: a = NULL; break;
    case B_NULL_B: b = NULL; break;
    case B_REL_A: a = F.rel; break;
    case B_REL_B: b = F.rel; break;
    case B_SHAPE: b = mm ? F.a23 : F.a32; break;
    case B_OVERFLOW: a = F.big_a, b = F.big_b; break;
    case B_RANK: b = F.v4; break;
    }
    return T(BIN[op].f(a, b));
}

static const struct { const char *name; ibin_fn f; } IBIN[] = {
    {"nt_copy_into", nt_copy_into}, {"nt_add_inplace", nt_add_inplace},
    {"nt_sub_inplace", nt_sub_inplace}, {"nt_mul_inplace", nt_mul_inplace},
    {"nt_div_inplace", nt_div_inplace},
};
#define NIBIN ((int)(sizeof IBIN / sizeof IBIN[0]))
enum { IB_NULL_D, IB_NULL_S, IB_REL_D, IB_REL_S, IB_SHAPE, IB_EXPANDED, IB_GROW, IB_GRAD, IB_NV };

static int run_ibin(int v)
{
    int op = v / IB_NV, k = v % IB_NV;
    nt_tensor *d = F.a23, *s = F.b23;
    switch (k) {
    case IB_NULL_D: d = NULL; break;
    case IB_NULL_S: s = NULL; break;
    case IB_REL_D: d = F.rel; break;
    case IB_REL_S: s = F.rel; break;
    case IB_SHAPE: s = F.a32; break;
    case IB_EXPANDED: d = F.ex; break;
    case IB_GROW: d = F.v4, s = F.a23; break; /* src does not broadcast to dst */
    case IB_GRAD: d = F.w; break;             /* a leaf that requires grad, grad mode on */
    }
    return IBIN[op].f(d, s);
}

static const struct { const char *name; sc_fn f; } SC[] = {
    {"nt_add_scalar", nt_add_scalar}, {"nt_mul_scalar", nt_mul_scalar},
    {"nt_div_scalar", nt_div_scalar}, {"nt_pow_scalar", nt_pow_scalar},
    {"nt_full_like", nt_full_like},
};
#define NSC ((int)(sizeof SC / sizeof SC[0]))

static int run_sc(int v) { return T(SC[v / 2].f(v % 2 ? F.rel : NULL, 2.0)); }

static const struct { const char *name; isc_fn f; } ISC[] = {
    {"nt_add_scalar_inplace", nt_add_scalar_inplace},
    {"nt_mul_scalar_inplace", nt_mul_scalar_inplace},
    {"nt_fill_inplace", nt_fill_inplace},
};
#define NISC ((int)(sizeof ISC / sizeof ISC[0]))

static int run_isc(int v)
{
    nt_tensor *d[] = {NULL, F.rel, F.ex, F.w};
    return ISC[v / 4].f(d[v % 4], 2.0);
}

static int run_iun(int v)
{
    nt_tensor *d[] = {NULL, F.rel, F.ex, F.w};
    return v / 4 ? nt_neg_inplace(d[v % 4]) : nt_relu_inplace(d[v % 4]);
}

static int run_clamp(int v)
{
    switch (v) {
    case 0: return T(nt_clamp(NULL, 0, 1));
    case 1: return T(nt_clamp(F.rel, 0, 1));
    case 2: return T(nt_clamp(F.a23, NAN, 1));
    case 3: return T(nt_clamp(F.a23, 0, NAN));
    case 4: return nt_clamp_inplace(NULL, 0, 1);
    case 5: return nt_clamp_inplace(F.rel, 0, 1);
    case 6: return nt_clamp_inplace(F.a23, NAN, 1);
    case 7: return nt_clamp_inplace(F.ex, 0, 1);
    case 8: return nt_clamp_inplace(F.w, 0, 1);
    }
    return -999;
}

static int run_where(int v)
{
    nt_tensor *c = F.u23, *a = F.a23, *b = F.b23;
    switch (v) {
    case 0: c = NULL; break;
    case 1: a = NULL; break;
    case 2: b = NULL; break;
    case 3: c = F.rel; break;
    case 4: a = F.rel; break;
    case 5: b = F.rel; break;
    case 6: a = F.a32; break;
    case 7: c = F.a32; break;
    case 8: c = F.big_a, a = F.big_b, b = F.s0; break;
    }
    return T(nt_where(c, a, b));
}

static int run_masks(int v)
{
    nt_tensor *t = F.a23, *m = F.u23;
    switch (v) {
    case 0: return T(nt_tril(NULL, 0));
    case 1: return T(nt_tril(F.rel, 0));
    case 2: return T(nt_tril(F.v4, 0));
    case 3: return T(nt_triu(NULL, 1));
    case 4: return T(nt_triu(F.s0, -1));
    case 5: t = NULL; break;
    case 6: m = NULL; break;
    case 7: t = F.rel; break;
    case 8: m = F.rel; break;
    case 9: m = F.a23; break;  /* f32, not u8 */
    case 10: t = F.a32; break; /* [2, 3] against [3, 2] */
    case 11: t = F.s0; break;  /* the mask would grow t */
    case 12: {
        /* NaN into i32: accepted and stored as nt_full stores it */
        nt_tensor *y = nt_masked_fill(F.i23, m, NAN), *f = nt_full(NT_I32, 0, NULL, NAN);
        int32_t yv[6], fv = -7;
        bool ok = y && f && !nt_to_host(y, yv, sizeof yv) && !nt_to_host(f, &fv, sizeof fv) &&
                  yv[0] == fv && yv[5] == fv;
        nt_release(y);
        nt_release(f);
        return S(ok);
    }
    }
    return T(nt_masked_fill(t, m, 1.5));
}

/* nt_scaled_dot_product_attention: q, k, v [2, 3] (Tq = Tk = 2, D = Dv =
 * 3) with one argument broken per case */
static int run_sdpa(int v)
{
    nt_tensor *q = F.a23, *k = F.b23, *vv = F.a23, *m = NULL, *tmp = NULL;
    double scale = 0;
    switch (v) {
    case 0: q = NULL; break;
    case 1: k = NULL; break;
    case 2: vv = NULL; break;
    case 3: q = F.rel; break;
    case 4: vv = F.rel; break;
    case 5: m = F.rel; break;
    case 6: q = F.i23; break;
    case 7: k = F.bf; break;
    case 8: q = F.v4; break;
    case 9: k = F.a32; break;  /* D 2 against q's 3 */
    case 10: vv = F.a32; break; /* 3 rows against k's 2 */
    case 11: m = F.a32; break;  /* [3, 2] against [2, 2] */
    case 12: m = F.i23; break;
    case 13: k = tmp = mk(NT_F32, 3, SH(2, 2, 3)); break;
    case 14: scale = NAN; break;
    case 15: q = tmp = mk(NT_F32, 2, SH(2, 129)), k = q, vv = F.a23; break;
    }
    nt_tensor *y = nt_scaled_dot_product_attention(q, k, vv, m, false, scale);
    nt_release(tmp);
    return T(y);
}

static int run_cast(int v)
{
    switch (v) {
    case 0: return T(nt_cast(NULL, NT_F32));
    case 1: return T(nt_cast(F.rel, NT_F32));
    case 2: return T(nt_cast(F.a23, (nt_dtype)-1));
    case 3: return T(nt_cast(F.a23, NT_DTYPE_COUNT));
    case 4: return T(nt_cast(F.a23, (nt_dtype)99));
    case 5: return T(nt_cast_sr(NULL, NT_BF16));
    case 6: return T(nt_cast_sr(F.rel, NT_BF16));
    case 7: return T(nt_cast_sr(F.a23, NT_I32));
    case 8: return T(nt_cast_sr(F.a23, NT_F32));
    case 9: return T(nt_cast_sr(F.i23, NT_BF16));
    case 10: return T(nt_cast_sr(F.a23, (nt_dtype)77));
    }
    return -999;
}

/* ---- reductions and rows ---- */

static const struct { const char *name; red_fn f; } RED[] = {
    {"nt_sum", nt_sum}, {"nt_mean", nt_mean}, {"nt_max", nt_max}, {"nt_argmax", nt_argmax},
    {"nt_min", nt_min}, {"nt_argmin", nt_argmin}, {"nt_any", nt_any},
};
#define NRED ((int)(sizeof RED / sizeof RED[0]))
static const int BADDIM[] = {2, -3, 100, -1001, 8};

static int run_red(int v)
{
    int op = v / 7, k = v % 7;
    if (k == 0)
        return T(RED[op].f(NULL, 0, false));
    if (k == 1)
        return T(RED[op].f(F.rel, 0, false));
    return T(RED[op].f(F.a23, BADDIM[k - 2], true));
}

static int run_soft(int v)
{
    nt_tensor *(*f)(nt_tensor *, int) = v / 7 ? nt_log_softmax : nt_softmax;
    int k = v % 7;
    if (k == 0)
        return T(f(NULL, 0));
    if (k == 1)
        return T(f(F.rel, 0));
    return T(f(F.a23, BADDIM[k - 2]));
}

static int run_red_mean_int(int v)
{
    (void)v;
    return T(nt_mean(F.i23, 0, false));
}

static int run_nn(int v)
{
    nt_tensor *w3 = F.pw; /* [3] */
    switch (v) {
    case 0: return T(nt_layer_norm(NULL, NULL, NULL, 1e-5));
    case 1: return T(nt_layer_norm(F.rel, NULL, NULL, 1e-5));
    case 2: return T(nt_layer_norm(F.a23, F.rel, NULL, 1e-5));
    case 3: return T(nt_layer_norm(F.a23, w3, F.rel, 1e-5));
    case 4: return T(nt_layer_norm(F.a23, F.v4, NULL, 1e-5));
    case 5: return T(nt_layer_norm(F.a23, w3, F.v4, 1e-5));
    case 6: return T(nt_layer_norm(F.a23, NULL, NULL, -1));
    case 7: return T(nt_layer_norm(F.a23, NULL, NULL, NAN));
    case 8: return T(nt_layer_norm(F.s0, NULL, NULL, 1e-5));
    case 9: return T(nt_rms_norm(NULL, NULL, 1e-5));
    case 10: return T(nt_rms_norm(F.rel, NULL, 1e-5));
    case 11: return T(nt_rms_norm(F.a23, F.rel, 1e-5));
    case 12: return T(nt_rms_norm(F.a23, F.v4, 1e-5));
    case 13: return T(nt_rms_norm(F.a23, NULL, -1));
    case 14: return T(nt_rms_norm(F.a23, NULL, INFINITY));
    case 15: return T(nt_cross_entropy(NULL, F.lab2));
    case 16: return T(nt_cross_entropy(F.a23, NULL));
    case 17: return T(nt_cross_entropy(F.rel, F.lab2));
    case 18: return T(nt_cross_entropy(F.a23, F.rel));
    case 19: return T(nt_cross_entropy(F.a23, F.v4));   /* f32 labels */
    case 20: return T(nt_cross_entropy(F.v4, F.lab2));  /* 1-D logits */
    case 21: return T(nt_cross_entropy(F.a32, F.lab2)); /* 3 rows, 2 labels */
    case 22: return T(nt_embedding(NULL, F.lab2));
    case 23: return T(nt_embedding(F.a23, NULL));
    case 24: return T(nt_embedding(F.rel, F.lab2));
    case 25: return T(nt_embedding(F.a23, F.rel));
    case 26: return T(nt_embedding(F.v4, F.lab2));  /* 1-D weight */
    case 27: return T(nt_embedding(F.a23, F.a23));  /* f32 indices */
    case 28: return T(nt_linear(NULL, F.a23, NULL));
    case 29: return T(nt_linear(F.a23, NULL, NULL));
    case 30: return T(nt_linear(F.rel, F.a23, NULL));
    case 31: return T(nt_linear(F.a23, F.rel, NULL));
    case 32: return T(nt_linear(F.a23, F.a23, F.rel));
    case 33: return T(nt_linear(F.a23, F.a32, NULL)); /* in 3 vs w's 2 */
    case 34: return T(nt_linear(F.a23, F.a23, F.v4)); /* bias 4 vs out 2 */
    case 35: return T(nt_matmul(F.s0, F.a23));
    case 36: return T(nt_matmul(F.i23, F.a32));
    case 37: return T(nt_linear(F.i23, F.i23, NULL)); /* the inner matmul refuses */
    case 38: return T(nt_linear(F.big_a, F.a23, NULL));
    }
    return -999;
}

/* ---- issue 15's ops: min/argmin on empty dims, norm, gather,
 * index_select, repeat, split ---- */

/* An op whose bad index is found when it runs: the sync reports it. */
static int run_late(nt_tensor *y)
{
    if (!y)
        return nt_last_error();
    float buf[64];
    int rc = nt_to_host(y, buf, sizeof buf);
    nt_release(y);
    return rc;
}

static int run_new(int v)
{
    nt_tensor *e = NULL, *ix = NULL, *outs[4] = {0};
    int rc = -999;
    switch (v) {
    case 0: e = mk(NT_F32, 2, SH(2, 0)); rc = T(nt_min(e, 1, false)); break;
    case 1: e = mk(NT_F32, 2, SH(2, 0)); rc = T(nt_argmin(e, NT_DIM_ALL, false)); break;
    case 2: return T(nt_norm(NULL, 2.0, 0, false));
    case 3: return T(nt_norm(F.rel, 2.0, 0, false));
    case 4: return T(nt_norm(F.i23, 2.0, 0, false));
    case 5: return T(nt_norm(F.a23, NAN, 0, false));
    case 6: return T(nt_norm(F.a23, 2.0, 2, false));
    case 7: e = mk(NT_F32, 2, SH(2, 0)); rc = T(nt_norm(e, INFINITY, 1, false)); break;
    case 8: e = mk(NT_F32, 2, SH(2, 0)); rc = T(nt_norm(e, -INFINITY, NT_DIM_ALL, false)); break;
    case 9: return T(nt_gather(NULL, 0, F.lab2));
    case 10: return T(nt_gather(F.a23, 0, NULL));
    case 11: return T(nt_gather(F.a23, 0, F.rel));
    case 12: return T(nt_gather(F.a23, 0, F.a23));  /* f32 index */
    case 13: return T(nt_gather(F.a23, 0, F.lab2)); /* 1-D index for 2-D t */
    case 14: ix = mk(NT_I32, 2, SH(3, 3)); rc = T(nt_gather(F.a23, 1, ix)); break;
    case 15: return T(nt_gather(F.a23, 2, F.i23));
    case 16: return T(nt_gather(F.s0, 0, F.lab2));
    case 17:
        ix = nt_from_host((int32_t[]){0, 1, 2, 0, 3, 1}, NT_I32, 2, SH(2, 3));
        rc = run_late(nt_gather(F.a23, 1, ix));
        break;
    case 18:
        ix = nt_from_host((int32_t[]){0, -1}, NT_I32, 2, SH(2, 1));
        rc = run_late(nt_gather(F.a23, 0, ix));
        break;
    case 19: return T(nt_index_select(F.a23, 0, F.i23)); /* 2-D index */
    case 20: return T(nt_index_select(F.a23, 0, F.v4));  /* f32 index */
    case 21: return T(nt_index_select(F.a23, -3, F.lab2));
    case 22:
        ix = nt_from_host((int32_t[]){1, 0, 2}, NT_I32, 1, SH(3));
        rc = run_late(nt_index_select(F.a23, 0, ix));
        break;
    case 23: return T(nt_repeat(NULL, SH(1, 1), 2));
    case 24: return T(nt_repeat(F.rel, SH(1, 1), 2));
    case 25: return T(nt_repeat(F.a23, SH(2), 1));      /* fewer repeats than dims */
    case 26: return T(nt_repeat(F.a23, NULL, 2));
    case 27: return T(nt_repeat(F.a23, SH(1, -2), 2));
    case 28: return T(nt_repeat(F.a23, SH(1, 1, 1, 1, 1, 1, 1, 1, 1), 9));
    case 29: return T(nt_repeat(F.a23, SH(1LL << 40, 1LL << 20), 2));
    case 30: return nt_split(NULL, 1, 0, outs, 4);
    case 31: return nt_split(F.rel, 1, 0, outs, 4);
    case 32: return nt_split(F.a23, 0, 1, outs, 4);
    case 33: return nt_split(F.a23, -3, 1, outs, 4);
    case 34: return nt_split(F.a23, 1, 1, outs, 2); /* makes 3 */
    case 35: return nt_split(F.a23, 1, 1, NULL, 3);
    case 36: return nt_split(F.a23, 1, 2, outs, 4);
    case 37: return nt_split(F.s0, 1, 0, outs, 4);
    }
    if (outs[0])
        fail_msg("a refused nt_split wrote out[0]");
    if (e)
        nt_release(e);
    if (ix)
        nt_release(ix);
    return rc;
}

/* ---- views ---- */

static int run_view(int v)
{
    nt_tensor *z = NULL;
    switch (v) {
    case 0: return T(nt_reshape(NULL, 1, SH(6)));
    case 1: return T(nt_reshape(F.rel, 1, SH(6)));
    case 2: return T(nt_reshape(F.a23, -1, SH(6)));
    case 3: return T(nt_reshape(F.a23, 9, SH(6)));
    case 4: return T(nt_reshape(F.a23, 2, NULL));
    case 5: return T(nt_reshape(F.a23, 1, SH(7)));
    case 6: return T(nt_reshape(F.a23, 2, SH(-1, -1)));
    case 7: return T(nt_reshape(F.a23, 2, SH(-2, 3)));
    case 8: return T(nt_reshape(F.a23, 2, SH(16, ((int64_t)1 << 60) + 1)));
    case 9: return T(nt_reshape(F.a23, 2, SH(INT64_MAX, 2)));
    case 10:
        z = mk(NT_F32, 1, SH(0));
        { int rc = T(nt_reshape(z, 2, SH(0, (int64_t)1 << 62))); nt_release(z); return rc; }
    case 11:
        z = mk(NT_F32, 1, SH(0));
        { int rc = T(nt_reshape(z, 2, SH(0, -1))); nt_release(z); return rc; }
    case 12: return T(nt_transpose(NULL, 0, 1));
    case 13: return T(nt_transpose(F.rel, 0, 1));
    case 14: return T(nt_transpose(F.a23, 2, 0));
    case 15: return T(nt_transpose(F.a23, 0, -3));
    case 16: return T(nt_transpose(F.a23, 1000, 1));
    case 17: return T(nt_transpose(F.s0, 0, 0));
    case 18: return T(nt_permute(NULL, (const int[]){1, 0}));
    case 19: return T(nt_permute(F.rel, (const int[]){1, 0}));
    case 20: return T(nt_permute(F.a23, NULL));
    case 21: return T(nt_permute(F.a23, (const int[]){0, 0}));
    case 22: return T(nt_permute(F.a23, (const int[]){0, 2}));
    case 23: return T(nt_permute(F.a23, (const int[]){-3, 1}));
    case 24: return T(nt_slice(NULL, 0, 0, 1, 1));
    case 25: return T(nt_slice(F.rel, 0, 0, 1, 1));
    case 26: return T(nt_slice(F.a23, 2, 0, 1, 1));
    case 27: return T(nt_slice(F.a23, -3, 0, 1, 1));
    case 28: return T(nt_slice(F.a23, 0, 0, 1, 0));
    case 29: return T(nt_slice(F.a23, 0, 0, 1, -1));
    case 30: return T(nt_slice(F.a23, 0, 0, 1, INT64_MIN));
    case 31: return T(nt_slice(F.s0, 0, 0, 1, 1));
    case 32: return T(nt_expand(NULL, 2, SH(2, 3)));
    case 33: return T(nt_expand(F.rel, 2, SH(2, 3)));
    case 34: return T(nt_expand(F.a23, 1, SH(6)));
    case 35: return T(nt_expand(F.a23, 9, SH(1, 1, 1, 1, 1, 1, 1, 2, 3)));
    case 36: return T(nt_expand(F.a23, 2, NULL));
    case 37: return T(nt_expand(F.a23, 2, SH(4, 3)));
    case 38: return T(nt_expand(F.a23, 3, SH(-1, 2, 3)));
    case 39: return T(nt_expand(F.a23, 3, SH(-5, 2, 3)));
    case 40: return T(nt_expand(F.a23, 2, SH(2, -7)));
    case 41: return T(nt_expand(F.big_a, 3, SH((int64_t)1 << 20, (int64_t)1 << 33, 1)));
    case 42: return T(nt_expand(F.a23, 4, SH((int64_t)1 << 40, (int64_t)1 << 40, 2, 3)));
    case 43: return T(nt_expand(F.a23, 3, SH(INT64_MAX, 2, 3)));
    case 44: return T(nt_cat(NULL, 2, 0));
    case 45: return T(nt_cat((nt_tensor *const[]){F.a23}, 0, 0));
    case 46: return T(nt_cat((nt_tensor *const[]){F.a23}, -1, 0));
    case 47: return T(nt_cat((nt_tensor *const[]){F.a23, NULL}, 2, 0));
    case 48: return T(nt_cat((nt_tensor *const[]){F.a23, F.rel}, 2, 0));
    case 49: return T(nt_cat((nt_tensor *const[]){F.a23, F.i23}, 2, 0));
    case 50: return T(nt_cat((nt_tensor *const[]){F.a23, F.a32}, 2, 0));
    case 51: return T(nt_cat((nt_tensor *const[]){F.a23, F.b23}, 2, 2));
    case 52: return T(nt_cat((nt_tensor *const[]){F.a23, F.v4}, 2, 0));
    case 53: return T(nt_cat((nt_tensor *const[]){F.big_a, F.big_a}, 2, 1));
    case 55: { /* 3 x 2^47 rows: past 2^48 */
        nt_tensor *o = mk(NT_F32, 2, SH(1, 1));
        nt_tensor *e = nt_expand(o, 2, SH((int64_t)1 << 47, 1));
        int rc = T(nt_cat((nt_tensor *const[]){e, e, e}, 3, 0));
        nt_release(e);
        nt_release(o);
        return rc;
    }
    case 54: return T(nt_cat((nt_tensor *const[]){F.s0, F.s0}, 2, 0));
    }
    return -999;
}

/* ---- creation ---- */

typedef nt_tensor *(*mk_fn)(nt_dtype, int, const int64_t *);
static nt_tensor *mk_full(nt_dtype d, int n, const int64_t *s) { return nt_full(d, n, s, 1.5); }
static nt_tensor *mk_rand(nt_dtype d, int n, const int64_t *s) { return nt_rand(d, n, s, 1); }
static nt_tensor *mk_randn(nt_dtype d, int n, const int64_t *s) { return nt_randn(d, n, s, 1); }
static float host_buf[64];
static nt_tensor *mk_host(nt_dtype d, int n, const int64_t *s)
{
    return nt_from_host(host_buf, d, n, s);
}
static const struct { const char *name; mk_fn f; } MK[] = {
    {"nt_zeros", nt_zeros}, {"nt_ones", nt_ones},     {"nt_full", mk_full},
    {"nt_rand", mk_rand},   {"nt_randn", mk_randn},   {"nt_from_host", mk_host},
};
#define NMK ((int)(sizeof MK / sizeof MK[0]))
enum { MK_DT_NEG, MK_DT_BIG, MK_NDIM_NEG, MK_NDIM_BIG, MK_SHAPE_NULL, MK_DIM_NEG, MK_DIM_MIN,
       MK_OVER, MK_OVER2, MK_WRAP, MK_NV };

static int run_mk(int v)
{
    mk_fn f = MK[v / MK_NV].f;
    switch (v % MK_NV) {
    case MK_DT_NEG: return T(f((nt_dtype)-1, 1, SH(2)));
    case MK_DT_BIG: return T(f(NT_DTYPE_COUNT, 1, SH(2)));
    case MK_NDIM_NEG: return T(f(NT_F32, -1, SH(2)));
    case MK_NDIM_BIG: return T(f(NT_F32, 9, SH(1, 1, 1, 1, 1, 1, 1, 1, 1)));
    case MK_SHAPE_NULL: return T(f(NT_F32, 2, NULL));
    case MK_DIM_NEG: return T(f(NT_F32, 2, SH(2, -3)));
    case MK_DIM_MIN: return T(f(NT_F32, 1, SH(INT64_MIN)));
    case MK_OVER: return T(f(NT_F32, 2, SH((int64_t)1 << 40, (int64_t)1 << 40)));
    case MK_OVER2: return T(f(NT_F32, 3, SH(0, (int64_t)1 << 62, (int64_t)1 << 62)));
    case MK_WRAP: /* 2^32 * 2^32 wraps to 0 in int64 */
        return T(f(NT_F32, 2, SH((int64_t)1 << 32, (int64_t)1 << 32)));
    }
    return -999;
}

static int run_mk_extra(int v)
{
    switch (v) {
    case 0: return T(nt_rand(NT_I32, 1, SH(2), 1));
    case 1: return T(nt_randn(NT_U8, 1, SH(2), 1));
    case 2: return T(nt_from_host(NULL, NT_F32, 1, SH(2)));
    case 3: return T(nt_arange(NT_F32, 0, 10, 0));
    case 4: return T(nt_arange(NT_F32, NAN, 10, 1));
    case 5: return T(nt_arange(NT_F32, 0, INFINITY, 1));
    case 6: return T(nt_arange(NT_F32, 0, 10, -1));
    case 7: return T(nt_arange(NT_F32, 10, 0, 1));
    case 8: return T(nt_arange(NT_F32, 0, 1e300, 1e-300));
    case 9: return T(nt_arange(NT_DTYPE_COUNT, 0, 10, 1));
    case 10: return T(nt_arange(NT_F32, -1e308, 1e308, 1));
    case 11: return T(nt_arange(NT_F32, 0, 10, NAN));
    }
    return -999;
}

/* ---- sync points and metadata ---- */

static int run_sync(int v)
{
    float buf[8];
    double d;
    switch (v) {
    case 0: return nt_to_host(NULL, buf, sizeof buf);
    case 1: return nt_to_host(F.rel, buf, sizeof buf);
    case 2: return nt_to_host(F.a23, NULL, 24);
    case 3: return nt_to_host(F.a23, buf, 23);
    case 4: return nt_to_host(F.a23, buf, 0);
    case 5: return nt_item(NULL, &d);
    case 6: return nt_item(F.rel, &d);
    case 7: return nt_item(F.s0, NULL);
    case 8: return nt_item(F.a23, &d);
    case 9: return nt_print(NULL);
    case 10: return nt_print(F.rel);
    case 11: return P(nt_format(NULL));
    case 12: return P(nt_format(F.rel));
    }
    return -999;
}

static int run_meta(int v)
{
    switch (v) {
    case 0: return S(nt_ndim(NULL) == -1);
    case 1: return S(nt_ndim(F.rel) == -1);
    case 2: return S(nt_shape(NULL, 0) == -1);
    case 3: return S(nt_shape(F.rel, 0) == -1);
    case 4: return S(nt_shape(F.a23, 2) == -1);
    case 5: return S(nt_shape(F.a23, -3) == -1);
    case 6: return S(nt_shape(F.a23, INT32_MIN) == -1);
    case 7: return S(nt_numel(NULL) == -1);
    case 8: return S(nt_numel(F.rel) == -1);
    case 9: return S(nt_dtype_of(NULL) == NT_DTYPE_COUNT);
    case 10: return S(nt_dtype_of(F.rel) == NT_DTYPE_COUNT);
    case 11: return S(nt_stride(NULL, 0) == -1);
    case 12: return S(nt_stride(F.a23, 5) == -1);
    case 13: return S(nt_stride(F.rel, 0) == -1);
    case 14: return S(!nt_is_contiguous(NULL));
    case 15: return S(!nt_is_contiguous(F.rel));
    case 16: return S(!strcmp(nt_dtype_name((nt_dtype)99), "?"));
    case 17: return S(!strcmp(nt_dtype_name((nt_dtype)-1), "?"));
    case 18: return S(nt_dtype_size((nt_dtype)99) == 0);
    case 19: return S(nt_dtype_size((nt_dtype)-1) == 0);
    case 20: return S(!strcmp(nt_strerror(12345), "unknown error"));
    case 21: return S(!strcmp(nt_strerror(INT32_MIN), "unknown error"));
    case 22: return S(!strcmp(nt_engine_name((nt_engine)99), "?"));
    case 23: return S(!strcmp(nt_engine_name(NT_ENGINE_DEFAULT), "?"));
    case 24: return S(!strcmp(nt_alu_op_name((nt_alu_op)99), "?"));
    case 25: return S(!strcmp(nt_act_func_name((nt_act_func)-5), "?"));
    case 26: return S(!strcmp(nt_mem_name((nt_mem)7), "?"));
    case 27: return S(!nt_requires_grad(NULL));
    case 28: return S(!nt_requires_grad(F.rel));
    case 29: return S(nt_config_get(NULL) == NULL);
    case 30: return S(nt_config_get("NT_NO_SUCH") == NULL);
    case 31: return S(nt_tile_dtype(NULL) == NT_DTYPE_COUNT);
    case 32: return S(nt_tile_partitions(NULL) == 0);
    case 33: return S(nt_tile_size(NULL) == 0);
    case 34: return S(nt_tile_free_bytes(NULL, NT_MEM_SBUF) == 0);
    case 35: return S(!strcmp(nt_sim_kernel_message(NULL), ""));
    case 36: return S(nt_tile_ap(NULL).tile == NULL);
    case 37: return S(nt_tile_free_bytes(NULL, NT_MEM_HBM) == 0);
    case 38: return S(nt_autocast_dtype() == NT_DTYPE_COUNT);
    case 39: return S(nt_grad_enabled());
    case 40: /* an unmatched end is ignored: grad mode stays on */
        nt_no_grad_end();
        return S(nt_grad_enabled());
    case 41: /* begin/end nest */
        nt_no_grad_begin();
        nt_no_grad_begin();
        nt_no_grad_end();
        { bool off = !nt_grad_enabled(); nt_no_grad_end(); return S(off && nt_grad_enabled()); }
    case 42: return S(nt_stream_set_current(NULL) == 0 &&
                      nt_stream_current() == nt_stream_default());
    case 43: return S(nt_get_mode() == NT_MODE_ADAPTIVE);
    case 44: /* idempotent set-up calls */
        return S(nt_sim_init() == 0 && nt_sim_get_functional());
    case 45:
        nt_sim_set_functional(true);
        nt_stats_reset();
        nt_sim_stats_reset();
        return S(nt_sim_get_functional());
    }
    return -999;
}

/* The sentinel getters that also set the error (their contract says so). */
static int run_meta_err(int v)
{
    switch (v) {
    case 0: return isnan(nt_grad_scaler_get_scale(NULL)) ? nt_last_error() : 1;
    case 1: return isnan(nt_optim_get_lr(NULL)) ? nt_last_error() : 1;
    case 2: return (int)nt_optim_steps(NULL);
    case 3: return P(nt_grad(NULL));
    case 4: return P(nt_grad(F.rel));
    case 5: return nt_event_query(NULL) ? 1 : nt_last_error();
    case 6: return (int)nt_grad_scaler_skipped_steps(NULL);
    case 7: return (int)nt_grad_scaler_growth_tracker(NULL);
    }
    return -999;
}

/* ---- lifetime, autograd ---- */

static int run_life(int v)
{
    nt_scope *s;
    switch (v) {
    case 0: return P(nt_retain(NULL));
    case 1: return P(nt_retain(F.rel));
    case 2: return nt_release(F.rel);
    case 3: return P(nt_keep(NULL));
    case 4: return P(nt_keep(F.rel));
    case 5: return nt_scope_end(NULL);
    case 6:
        s = nt_scope_begin();
        assert_int_equal(nt_scope_end(s), 0);
        return nt_scope_end(s); /* ended already: compared, never dereferenced */
    case 7: return nt_set_requires_grad(NULL, true);
    case 8: return nt_set_requires_grad(F.rel, true);
    case 9: return nt_set_requires_grad(F.i23, true);
    case 10: return nt_set_requires_grad(F.u23, true);
    case 11: return nt_backward(NULL);
    case 12: return nt_backward(F.rel);
    case 13: return nt_backward(F.w);  /* 6 elements */
    case 14: return nt_backward(F.s0); /* does not require grad */
    case 15: return nt_backward_ex(NULL, true);
    case 16: return nt_backward_ex(F.rel, false);
    case 17: return nt_backward_ex(F.a23, true);
    case 18: return nt_zero_grad(NULL);
    case 19: return nt_zero_grad(F.rel);
    case 20: { /* not a leaf */
        nt_tensor *y = nt_mul_scalar(F.w, 2);
        int rc = nt_set_requires_grad(y, false);
        nt_release(y);
        return rc;
    }
    }
    return -999;
}

static char name_store[9][32];
static const char *g_strdup_name(const char *n) /* names live as long as the ops */
{
    static int k;
    snprintf(name_store[k], sizeof name_store[k], "%s", n);
    return name_store[k++];
}

static int run_custom(int v)
{
    nt_op_def d = {"badinput_x", 1, uop_fwd, NULL, NULL};
    nt_kernel_op_def kd = {"badinput_kx", 1, kshape, kkernel, NULL, NULL};
    switch (v) {
    case 0: return nt_op_register(NULL);
    case 1: d.name = NULL; return nt_op_register(&d);
    case 2: d.name = ""; return nt_op_register(&d);
    case 3: d.forward = NULL; return nt_op_register(&d);
    case 4: d.nin = 0; return nt_op_register(&d);
    case 5: d.nin = 5; return nt_op_register(&d);
    case 6: d.nin = -1; return nt_op_register(&d);
    case 7: d.name = "badinput_neg"; return nt_op_register(&d); /* duplicate */
    case 8: return nt_op_register_kernel(NULL);
    case 9: kd.name = NULL; return nt_op_register_kernel(&kd);
    case 10: kd.shape = NULL; return nt_op_register_kernel(&kd);
    case 11: kd.kernel = NULL; return nt_op_register_kernel(&kd);
    case 12: kd.nin = 0; return nt_op_register_kernel(&kd);
    case 13: kd.nin = 9; return nt_op_register_kernel(&kd);
    case 14: kd.name = "badinput_kernel"; return nt_op_register_kernel(&kd);
    case 15: return T(nt_op_call(-1, (nt_tensor *const[]){F.a23}));
    case 16: return T(nt_op_call(1 << 20, (nt_tensor *const[]){F.a23}));
    case 17: return T(nt_op_call(F.user_op, NULL));
    case 18: return T(nt_op_call(F.user_op, (nt_tensor *const[]){NULL}));
    case 19: return T(nt_op_call(F.user_op, (nt_tensor *const[]){F.rel}));
    case 20: return T(nt_op_call(F.kernel_op, NULL));
    case 21: return T(nt_op_call(F.kernel_op, (nt_tensor *const[]){F.rel}));
    case 22: return T(nt_op_call(INT32_MIN, (nt_tensor *const[]){F.a23}));
    default: { /* kernel ops whose shape rule misbehaves */
        static int ids[9];
        int m = v - 23;
        if (!ids[m]) {
            char name[32];
            snprintf(name, sizeof name, "badshape%d", m);
            nt_kernel_op_def bad = {g_strdup_name(name), 1, kshape_bad, kkernel, NULL,
                                    (void *)(intptr_t)m};
            ids[m] = nt_op_register_kernel(&bad);
            assert_true(ids[m] >= 0);
        }
        return T(nt_op_call(ids[m], (nt_tensor *const[]){F.a23}));
    }
    }
    return -999;
}

static nt_tensor *gc_f(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mul(in[0], in[0]);
}

static int run_gradcheck(int v)
{
    nt_tensor *in1[] = {F.w}, *inrel[] = {F.rel}, *innog[] = {F.a23}, *innull[] = {NULL};
    switch (v) {
    case 0: return nt_gradcheck(NULL, in1, 1, NULL, 1e-3, 1e-3, 1e-3);
    case 1: return nt_gradcheck(gc_f, NULL, 1, NULL, 1e-3, 1e-3, 1e-3);
    case 2: return nt_gradcheck(gc_f, in1, 0, NULL, 1e-3, 1e-3, 1e-3);
    case 3: return nt_gradcheck(gc_f, in1, 17, NULL, 1e-3, 1e-3, 1e-3);
    case 4: return nt_gradcheck(gc_f, in1, 1, NULL, 0, 1e-3, 1e-3);
    case 5: return nt_gradcheck(gc_f, in1, 1, NULL, NAN, 1e-3, 1e-3);
    case 6: return nt_gradcheck(gc_f, inrel, 1, NULL, 1e-3, 1e-3, 1e-3);
    case 7: return nt_gradcheck(gc_f, innog, 1, NULL, 1e-3, 1e-3, 1e-3);
    case 8: return nt_gradcheck(gc_f, innull, 1, NULL, 1e-3, 1e-3, 1e-3);
    case 9: return nt_gradcheck(gc_f, in1, -1, NULL, 1e-3, 1e-3, 1e-3);
    }
    return -999;
}

/* nt_checkpoint's block: never runs in these cases (or fails by design). */
static int ck_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = nt_mul(in[0], in[0]);
    return out[0] ? 0 : nt_last_error();
}

static int ck_fail_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)in, (void)n_in, (void)n_out;
    out[0] = NULL;
    return 5;
}

static int run_ckpt(int v)
{
    nt_tensor *out[3] = {NULL, NULL, NULL};
    nt_tensor *in[2] = {F.a23, F.a23};
    switch (v) {
    case 0: return nt_checkpoint(NULL, NULL, in, 1, out, 1);
    case 1: return nt_checkpoint(ck_fn, NULL, in, -1, out, 1);
    case 2: return nt_checkpoint(ck_fn, NULL, in, NT_CHECKPOINT_MAX_IN + 1, out, 1);
    case 3: return nt_checkpoint(ck_fn, NULL, in, 1, out, 0);
    case 4: return nt_checkpoint(ck_fn, NULL, in, 1, out, NT_CHECKPOINT_MAX_OUT + 1);
    case 5: return nt_checkpoint(ck_fn, NULL, in, 1, NULL, 1);
    case 6: return nt_checkpoint(ck_fn, NULL, NULL, 1, out, 1);
    case 7: in[1] = NULL; return nt_checkpoint(ck_fn, NULL, in, 2, out, 1);
    case 8: in[0] = F.rel; return nt_checkpoint(ck_fn, NULL, in, 1, out, 1);
    case 9: { /* a block that fails: its own error, the outputs NULL */
        int rc = nt_checkpoint(ck_fail_fn, NULL, in, 1, out, 1);
        return out[0] ? 1 : rc;
    }
    }
    return -999;
}


/* ---- streams, events, stats, amp ---- */

static int run_stream(int v)
{
    switch (v) {
    case 0: return nt_stream_destroy(NULL);
    case 1: return nt_stream_destroy(nt_stream_default());
    case 2: return nt_stream_synchronize(NULL);
    case 3: return nt_event_record(NULL, NULL);
    case 4: return nt_event_record(NULL, F.st);
    case 5: return nt_stream_wait_event(F.st, NULL);
    case 6: return nt_stream_wait_event(NULL, NULL);
    case 7: return nt_event_synchronize(NULL);
    case 8: return nt_stats_get(NULL);
    case 9: return nt_sim_stats_get(NULL);
    case 10: return nt_sim_config_get(NULL);
    case 11: return nt_sim_set_target((nt_sim_target)7);
    case 12: return nt_sim_set_target((nt_sim_target)-1);
    }
    return -999;
}

static int run_amp(int v)
{
    nt_grad_scaler_opts o = {65536, 2, 0.5, 2000};
    switch (v) {
    case 0: return nt_autocast_begin(NT_F32);
    case 1: return nt_autocast_begin(NT_I32);
    case 2: return nt_autocast_begin((nt_dtype)99);
    case 3: return nt_autocast_begin((nt_dtype)-1);
    case 4: return nt_autocast_end();
    case 5: { /* 65 deep */
        int rc = 0, i;
        for (i = 0; i < 65 && !rc; i++)
            rc = nt_autocast_begin(NT_BF16);
        int err = nt_last_error();
        for (int j = 0; j < i - 1; j++)
            assert_int_equal(nt_autocast_end(), 0);
        assert_int_equal(nt_autocast_dtype(), NT_DTYPE_COUNT);
        return rc ? err : 1;
    }
    case 6: o.init_scale = 0; return P(nt_grad_scaler_create(&o));
    case 7: o.init_scale = -1; return P(nt_grad_scaler_create(&o));
    case 8: o.init_scale = NAN; return P(nt_grad_scaler_create(&o));
    case 9: o.init_scale = INFINITY; return P(nt_grad_scaler_create(&o));
    case 10: o.growth_factor = 1; return P(nt_grad_scaler_create(&o));
    case 11: o.growth_factor = NAN; return P(nt_grad_scaler_create(&o));
    case 12: o.backoff_factor = 1; return P(nt_grad_scaler_create(&o));
    case 13: o.backoff_factor = 0; return P(nt_grad_scaler_create(&o));
    case 14: o.backoff_factor = NAN; return P(nt_grad_scaler_create(&o));
    case 15: o.growth_interval = 0; return P(nt_grad_scaler_create(&o));
    case 16: o.growth_interval = INT64_MIN; return P(nt_grad_scaler_create(&o));
    case 17: return T(nt_grad_scaler_scale(NULL, F.s0));
    case 18: return T(nt_grad_scaler_scale(F.sc, NULL));
    case 19: return T(nt_grad_scaler_scale(F.sc, F.rel));
    case 20: return nt_grad_scaler_unscale(NULL, F.adam);
    case 21: return nt_grad_scaler_unscale(F.sc, NULL);
    case 22: return nt_grad_scaler_step(NULL, F.adam);
    case 23: return nt_grad_scaler_step(F.sc, NULL);
    case 24: return nt_grad_scaler_update(NULL);
    case 25: return nt_grad_scaler_update(F.sc); /* no step since the last update */
    case 26: return (int)nt_grad_scaler_skipped_steps(NULL);
    case 27: return (int)nt_grad_scaler_growth_tracker(NULL);
    }
    return -999;
}

/* ---- optimizers and checkpoints ---- */

static int run_optim(int v)
{
    nt_tensor *p1[] = {F.pw}, *prel[] = {F.rel}, *pint[] = {F.i23}, *pnull[] = {NULL},
              *pdup[] = {F.pw, F.pw}, *pex[] = {F.ex};
    switch (v) {
    case 0: return P(nt_optim_sgd(NULL, 1, 0.1, 0, 0, false));
    case 1: return P(nt_optim_sgd(p1, 0, 0.1, 0, 0, false));
    case 2: return P(nt_optim_sgd(p1, -3, 0.1, 0, 0, false));
    case 3: return P(nt_optim_sgd(pnull, 1, 0.1, 0, 0, false));
    case 4: return P(nt_optim_sgd(prel, 1, 0.1, 0, 0, false));
    case 5: return P(nt_optim_sgd(pint, 1, 0.1, 0, 0, false));
    case 6: return P(nt_optim_sgd(p1, 1, -0.1, 0, 0, false));
    case 7: return P(nt_optim_sgd(p1, 1, NAN, 0, 0, false));
    case 8: return P(nt_optim_sgd(p1, 1, INFINITY, 0, 0, false));
    case 9: return P(nt_optim_sgd(p1, 1, 0.1, -0.9, 0, false));
    case 10: return P(nt_optim_sgd(p1, 1, 0.1, 0, -1, false));
    case 11: return P(nt_optim_sgd(p1, 1, 0.1, 0, NAN, false));
    case 12: return P(nt_optim_sgd(p1, 1, 0.1, 0, 0, true)); /* nesterov without momentum */
    case 13: return P(nt_optim_sgd(pdup, 2, 0.1, 0, 0, false));
    case 14: return P(nt_optim_sgd(pex, 1, 0.1, 0, 0, false));
    case 15: return P(nt_optim_adamw(NULL, 1, 1e-3, 0.9, 0.999, 1e-8, 0));
    case 16: return P(nt_optim_adamw(p1, 0, 1e-3, 0.9, 0.999, 1e-8, 0));
    case 17: return P(nt_optim_adamw(prel, 1, 1e-3, 0.9, 0.999, 1e-8, 0));
    case 18: return P(nt_optim_adamw(pint, 1, 1e-3, 0.9, 0.999, 1e-8, 0));
    case 19: return P(nt_optim_adamw(p1, 1, -1e-3, 0.9, 0.999, 1e-8, 0));
    case 20: return P(nt_optim_adamw(p1, 1, 1e-3, 1.0, 0.999, 1e-8, 0));
    case 21: return P(nt_optim_adamw(p1, 1, 1e-3, -0.1, 0.999, 1e-8, 0));
    case 22: return P(nt_optim_adamw(p1, 1, 1e-3, 0.9, 1.5, 1e-8, 0));
    case 23: return P(nt_optim_adamw(p1, 1, 1e-3, 0.9, NAN, 1e-8, 0));
    case 24: return P(nt_optim_adamw(p1, 1, 1e-3, 0.9, 0.999, -1, 0));
    case 25: return P(nt_optim_adamw(p1, 1, 1e-3, 0.9, 0.999, NAN, 0));
    case 26: return P(nt_optim_adamw(p1, 1, 1e-3, 0.9, 0.999, 1e-8, -0.01));
    case 27: return P(nt_optim_adamw(pdup, 2, 1e-3, 0.9, 0.999, 1e-8, 0));
    case 28: return nt_optim_step(NULL);
    case 29: return nt_sgd_step(NULL);
    case 30: return nt_optim_zero_grad(NULL);
    case 31: return nt_optim_set_lr(NULL, 0.1);
    case 32: return nt_optim_set_lr(F.sgd, -1);
    case 33: return nt_optim_set_lr(F.sgd, NAN);
    case 34: return nt_optim_set_lr(F.adam, INFINITY);
    case 35: return nt_optim_set_master_weights(NULL, true);
    case 36: return nt_optim_step_at(NULL, NULL);
    case 37: return nt_sgd_step_at(NULL, NULL);
    }
    return -999;
}

static char path_buf[400];
static const char *tmp_path(const char *leaf)
{
    snprintf(path_buf, sizeof path_buf, "%s/%s", nt_test_dir, leaf);
    return path_buf;
}

static int run_save(int v)
{
    nt_tensor *p1[] = {F.pw2}, *prel[] = {F.rel}, *pnull[] = {NULL};
    switch (v) {
    case 0: return nt_save(NULL, p1, 1, NULL);
    case 1: return nt_save("", p1, 1, NULL);
    case 2: return nt_save(tmp_path("x"), NULL, 1, NULL);
    case 3: return nt_save(tmp_path("x"), p1, 0, NULL);
    case 4: return nt_save(tmp_path("x"), prel, 1, NULL);
    case 5: return nt_save(tmp_path("x"), pnull, 1, NULL);
    case 6: return nt_save("/nonexistent-dir-ntensor/x.ntck", p1, 1, NULL);
    case 7: return nt_checkpoint_save(NULL, p1, 1, NULL, NULL);
    case 8: return nt_checkpoint_save(tmp_path("x"), prel, 1, NULL, F.sc);
    case 9: return nt_checkpoint_save(tmp_path("x"), p1, -1, F.adam, NULL);
    case 10: return nt_load(NULL, p1, 1, NULL);
    case 11: return nt_load("", p1, 1, NULL);
    case 12: return nt_load(tmp_path("missing.ntck"), p1, 1, NULL);
    case 13: return nt_load(F.ckpt, NULL, 1, NULL);
    case 14: return nt_load(F.ckpt, p1, 0, NULL);
    case 15: return nt_load(F.ckpt, prel, 1, NULL);
    case 16: return nt_load(F.ckpt, (nt_tensor *const[]){F.a23}, 1, NULL); /* shape */
    case 17: return nt_load(F.ckpt, (nt_tensor *const[]){F.pw2, F.pw}, 2, NULL); /* count */
    case 18: return nt_load(F.ckpt, p1, 1, F.sgd); /* another kind */
    case 19: return nt_checkpoint_load(F.ckpt, (nt_tensor *const[]){F.v4}, 1, NULL, NULL);
    case 20: return nt_load(nt_test_dir, p1, 1, NULL); /* a directory */
    case 21: return nt_checkpoint_load(NULL, p1, 1, NULL, F.sc);
    }
    return -999;
}

static uint32_t rd32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wrf64(uint8_t *p, double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    wr64(p, u);
}

/* Record i's table entry and data in the file b. */
static uint8_t *entry(uint8_t *b, int i) { return b + 32 + 96 * i; }
static int find_kind(uint8_t *b, int kind)
{
    uint32_t n = rd32(b + 12);
    for (uint32_t i = 0; i < n; i++)
        if ((entry(b, (int)i)[0] | entry(b, (int)i)[1] << 8) == kind)
            return (int)i;
    return -1;
}
/* Recomputes every CRC, so only the edited value is wrong. */
static void fix_crcs(uint8_t *b)
{
    uint32_t n = rd32(b + 12);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = entry(b, (int)i);
        if (rd64(e + 16) <= F.cklen && rd64(e + 24) <= F.cklen - rd64(e + 16))
            wr32(e + 12, crc32_ieee(b + rd64(e + 16), rd64(e + 24)));
    }
    size_t te = 32 + 96 * (size_t)n + 8;
    wr32(b + te - 8, crc32_ieee(b, te - 8));
}

/* Field edits of the valid checkpoint, each with the word its message names. */
typedef struct {
    const char *what, *want;
    int kind;   /* record kind whose data is edited, 0: header/table */
    int off;    /* byte offset in the data (or in the file for kind 0) */
    int type;   /* 'd' double, 'q' u64, 'l' u32, 'b' byte, 'M' INT64_MAX */
    double val; /* value to write */
    bool crc;   /* recompute the CRCs afterwards */
} edit;

static const edit EDITS[] = {
    {"lr NaN", "lr", 2, 24, 'd', NAN, true},
    {"lr -1", "lr", 2, 24, 'd', -1, true},
    {"lr inf", "lr", 2, 24, 'd', INFINITY, true},
    {"weight_decay -0.5", "weight_decay", 2, 40, 'd', -0.5, true},
    {"beta1 1.5", "beta1", 2, 48, 'd', 1.5, true},
    {"beta1 1", "beta1", 2, 48, 'd', 1.0, true},
    {"beta1 NaN", "beta1", 2, 48, 'd', NAN, true},
    {"beta2 -0.1", "beta2", 2, 56, 'd', -0.1, true},
    {"eps -1", "eps", 2, 64, 'd', -1, true},
    {"eps NaN", "eps", 2, 64, 'd', NAN, true},
    {"momentum 0.9 on AdamW", "momentum", 2, 32, 'd', 0.9, true},
    {"steps -1", "step count", 2, 16, 'q', -1, true},
    {"param steps -5", "step count of parameter", 2, 80, 'q', -5, true},
    {"param steps > steps", "step count of parameter", 2, 80, 'q', 7, true},
    /* the next step would overflow (or lose count in a double) */
    {"steps INT64_MAX", "step count is 9223372036854775807", 2, 16, 'M', 0, true},
    {"steps 2^53 + 2", "step count is 9007199254740994", 2, 16, 'q', 9007199254740994.0, true},
    {"optimizer kind 7", "optimizer kind", 2, 0, 'l', 7, true},
    {"optimizer kind 0", "optimizer kind", 2, 0, 'l', 0, true},
    {"flags bit 5", "flags", 2, 4, 'l', 32, true},
    {"nesterov on AdamW", "nesterov", 2, 4, 'l', 1, true},
    {"meta param count 2", "parameter count", 2, 8, 'l', 2, true},
    {"meta reserved 12", "reserved", 2, 12, 'b', 1, true},
    {"meta reserved 72", "reserved", 2, 72, 'b', 1, true},
    {"scaler scale 0", "scale", 4, 8, 'd', 0, true},
    {"scaler scale NaN", "scale", 4, 8, 'd', NAN, true},
    {"scaler growth 1", "growth_factor", 4, 16, 'd', 1, true},
    {"scaler backoff 2", "backoff_factor", 4, 24, 'd', 2, true},
    {"scaler interval 0", "growth_interval", 4, 32, 'q', 0, true},
    {"scaler tracker -1", "growth tracker", 4, 40, 'q', -1, true},
    {"scaler skipped -1", "skipped", 4, 48, 'q', -1, true},
    {"scaler skipped INT64_MAX", "skipped steps 9223372036854775807", 4, 48, 'M', 0, true},
    {"scaler version 2", "layout", 4, 0, 'l', 2, true},
    {"scaler reserved 4", "reserved", 4, 4, 'b', 1, true},
    {"scaler reserved 56", "reserved", 4, 56, 'b', 1, true},
    {"header reserved 24", "reserved", 0, 24, 'b', 1, true},
    {"header reserved 31", "reserved", 0, 31, 'b', 1, true},
    {"4 bytes after the header CRC", "reserved", 0, -4, 'b', 1, true},
    {"bad magic", "magic", 0, 0, 'b', 'X', false},
    {"version 4", "version", 0, 8, 'l', 4, false},
    {"size field", "bytes", 0, 16, 'q', 12345, false},
    {"header CRC", "checksum", 0, 40, 'b', 0x55, false},
    {"record count huge", "record table", 0, 12, 'l', 0x7fffffff, false},
};
#define NEDITS ((int)(sizeof EDITS / sizeof EDITS[0]))

/* Table-entry edits of record `kind` (offset within its 96-byte entry). */
static const edit TEDITS[] = {
    {"param dtype 9", "dtype", 1, 2, 'B', 9, true},
    {"param ndim 9", "dims", 1, 3, 'B', 9, true},
    {"param ndim 0", "shape entries", 1, 3, 'B', 0, true},
    {"param ndim 2", "size", 1, 3, 'B', 2, true},
    {"param shape -3", "shape[0]", 1, 32, 'q', -3, true},
    {"param shape 2^60", "2^48", 1, 32, 'q', 0x1000000000000000ULL, true},
    {"param shape 2^62 x 4 wraps", "2^48", 1, 32, 'q', 0x4000000000000000ULL, true},
    {"param unused shape entry", "shape entries", 1, 48, 'q', 1, true},
    {"param size", "size", 1, 24, 'q', 8, true},
    {"param offset unaligned", "offset", 1, 16, 'q', 65, true},
    {"param offset past the end", "offset", 1, 16, 'q', 1 << 30, true},
    {"param slot 1", "slot", 1, 8, 'l', 1, true},
    {"param index 3", "index", 1, 4, 'l', 3, true},
    {"meta dtype f32", "f32", 2, 2, 'B', 0, true},
    {"meta 2 dims", "size", 2, 3, 'B', 2, true},
    {"meta index 1", "index", 2, 4, 'l', 1, true},
    {"scaler slot 2", "slot", 4, 8, 'l', 2, true},
    {"kind 77", "kind", 1, 0, 'l', 77, true},
    {"data CRC", "checksum", 1, 12, 'l', 0, false},
};
#define NTEDITS ((int)(sizeof TEDITS / sizeof TEDITS[0]))

static int load_edited(const edit *e, bool table)
{
    uint8_t *b = malloc(F.cklen);
    memcpy(b, F.ckbuf, F.cklen);
    uint8_t *p;
    if (table) {
        int i = find_kind(b, e->kind);
        assert_true(i >= 0);
        p = entry(b, i) + e->off;
        if (e->type == 'l' && e->off == 0) { /* the kind is a u16 */
            p[0] = (uint8_t)e->val;
            p[1] = 0;
            goto done;
        }
    } else if (e->kind) {
        int i = find_kind(b, e->kind);
        assert_true(i >= 0);
        p = b + rd64(entry(b, i) + 16) + e->off;
    } else {
        uint32_t n = rd32(b + 12);
        p = b + (e->off < 0 ? 32 + 96 * (int)n + 8 + e->off : e->off);
    }
    switch (e->type) {
    case 'd': wrf64(p, e->val); break;
    case 'q': wr64(p, (uint64_t)(int64_t)e->val); break;
    case 'M': wr64(p, (uint64_t)INT64_MAX); break;
    case 'l': wr32(p, (uint32_t)e->val); break;
    case 'b': p[0] ^= (uint8_t)e->val; break; /* flip bits */
    case 'B': p[0] = (uint8_t)e->val; break;  /* set */
    }
done:
    if (e->crc)
        fix_crcs(b);
    const char *path = tmp_path("edited.ntck");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, F.cklen, f), F.cklen);
    fclose(f);
    free(b);
    return nt_checkpoint_load(path, &F.pw2, 1, F.adam, F.sc);
}

static int run_edit(int v) { return load_edited(&EDITS[v], false); }
static int run_tedit(int v) { return load_edited(&TEDITS[v], true); }

static int run_edit_noopt(int v)
{
    /* nt_load without an optimizer still rejects a corrupt optimizer record */
    assert_true(load_edited(&EDITS[v], false) != 0);
    nt_clear_error();
    return nt_load(tmp_path("edited.ntck"), &F.pw2, 1, NULL);
}

/* ---- configuration ---- */

static const struct { const char *name, *value; } CFG[] = {
    {"NT_MODE", "fast"},             {"NT_MODE", ""},                {"NT_MODE", "EAGER"},
    {"NT_DETERMINISTIC", "2"},       {"NT_DETERMINISTIC", "yesno"},  {"NT_FUSION", "maybe"},
    {"NT_BACKEND", "gpu"},           {"NT_BACKEND", ""},             {"NT_REQUIRE_SIM", "x"},
    {"NT_MIN_SIM_FLOPS", "-1"},      {"NT_MIN_SIM_FLOPS", "1e3"},    {"NT_MIN_SIM_FLOPS", " 5"},
    {"NT_MIN_SIM_FLOPS", "18446744073709551616"}, {"NT_MIN_SIM_FLOPS", "5x"},
    {"NT_MIN_SIM_FLOPS", ""},        {"NT_MIN_SIM_FLOPS", "+5"},     {"NT_CHECK_NAN", "nan"},
    {"NT_STATS", "-1"},              {"NT_FUSION_LOG", "2"},         {"NT_LAZY_WINDOW", "0"},
    {"NT_LAZY_WINDOW", "10000001"},  {"NT_LAZY_WINDOW", "-4"},       {"NT_LAZY_WINDOW", "4G"},
    {"NT_MAX_INFLIGHT", "1"},        {"NT_MAX_INFLIGHT", "-1"},      {"NT_MAX_INFLIGHT", "99999999999"},
    {"NT_HBM_BYTES", "16G"},         {"NT_HBM_BYTES", "17179869185G"}, {"NT_TRACE", "/tmp/x.json"},
    {"NT_LOG", "verbose"},           {"NT_LOG", ""},                 {"NT_STOCHASTIC_ROUNDING", "2"},
    {"NT_SR_SEED", "-5"},            {"NT_SR_SEED", "abc"},          {"NT_SR_SEED", "18446744073709551616"},
    {"NT_SR_SEED", "1K1"},           {"NT_SR_SEED", "17179869184G"}, {"NT_HANDLE_QUARANTINE", "10"},
    {"NT_HANDLE_QUARANTINE", "-1"},  {"NT_HANDLE_QUARANTINE", "none"}, {"NT_NO_SUCH", "1"},
    {"nt_mode", "eager"},            {"", "1"},
};
#define NCFG ((int)(sizeof CFG / sizeof CFG[0]))

static int run_cfg(int v)
{
    if (v == NCFG)
        return nt_config_set(NULL, "1");
    if (v == NCFG + 1)
        return nt_config_set("NT_MODE", NULL);
    int rc = nt_config_set(CFG[v].name, CFG[v].value);
    /* a refused value leaves the setting as it was */
    if (!strcmp(CFG[v].name, "NT_MODE"))
        assert_string_equal(nt_config_get("NT_MODE"), "adaptive");
    if (!strcmp(CFG[v].name, "NT_SR_SEED"))
        assert_string_equal(nt_config_get("NT_SR_SEED"), "0");
    if (!strcmp(CFG[v].name, "NT_MIN_SIM_FLOPS"))
        assert_string_equal(nt_config_get("NT_MIN_SIM_FLOPS"), "0");
    return rc;
}

/* ---- simulator ---- */

static int run_sim_null(int v)
{
    nt_ap ap = {0};
    nt_sim_instr_info info;
    switch (v) {
    case 0: return P(nt_tile_alloc(NULL, "t", NT_MEM_SBUF, NT_F32, 1, 1));
    case 1: return nt_tile_release(NULL, NULL);
    case 2: return nt_sim_kernel_end(NULL, NULL);
    case 3: return nt_sim_kernel_sync(NULL);
    case 4: return nt_sim_kernel_error(NULL);
    case 5: return nt_sim_kernel_last(NULL, &info);
    case 6: return nt_tile_matmul(NULL, NULL);
    case 7: return nt_isa_dma_copy(NULL, &ap, &ap, 0);
    case 8: return nt_isa_dma_gather(NULL, &ap, &ap, &ap, 0);
    case 9: return nt_isa_nc_matmul(NULL, &ap, &ap, &ap, false);
    case 10: return nt_isa_nc_transpose(NULL, &ap, &ap);
    case 11: return nt_isa_tensor_tensor(NULL, &ap, &ap, &ap, NT_ALU_ADD, NT_ENGINE_DEFAULT);
    case 12: return nt_isa_tensor_scalar(NULL, &ap, &ap, NULL, NULL, NT_ENGINE_DEFAULT);
    case 13: return nt_isa_activation(NULL, &ap, NT_ACT_EXP, &ap, NULL, NULL, NULL);
    case 14: return nt_isa_tensor_reduce(NULL, &ap, &ap, NT_ALU_ADD, 0);
    case 15: return nt_isa_tensor_copy(NULL, &ap, &ap, NT_ENGINE_DEFAULT);
    case 16: return nt_isa_tensor_copy_sr(NULL, &ap, &ap, 1, NULL, NT_ENGINE_DEFAULT);
    case 17: return nt_isa_memset(NULL, &ap, 0, NT_ENGINE_DEFAULT);
    case 18: return nt_isa_iota(NULL, &ap, NULL);
    case 19: return nt_isa_affine_select(NULL, &ap, &ap, NULL, NT_ALU_GT, 0);
    case 20: return nt_isa_select(NULL, &ap, &ap, &ap, &ap, NT_ENGINE_DEFAULT);
    case 21: return nt_isa_tensor_tensor_scan(NULL, &ap, &ap, &ap, NULL, NT_ALU_ADD, NT_ALU_ADD);
    case 22: return nt_isa_gpsimd_custom(NULL, "c", &ap, NULL, 0, 1, NULL, NULL);
    }
    return -999;
}
static const char *const SIM_NULL_FN[] = {
    "nt_tile_alloc", "nt_tile_release", "nt_sim_kernel_end", "nt_sim_kernel_sync",
    "nt_sim_kernel_error", "nt_sim_kernel_last", "nt_tile_matmul", "nt_isa_dma_copy",
    "nt_isa_dma_gather", "nt_isa_nc_matmul", "nt_isa_nc_transpose", "nt_isa_tensor_tensor",
    "nt_isa_tensor_scalar", "nt_isa_activation", "nt_isa_tensor_reduce", "nt_isa_tensor_copy",
    "nt_isa_tensor_copy_sr", "nt_isa_memset", "nt_isa_iota", "nt_isa_affine_select",
    "nt_isa_select", "nt_isa_tensor_tensor_scan", "nt_isa_gpsimd_custom",
};
#define NSIMNULL ((int)(sizeof SIM_NULL_FN / sizeof SIM_NULL_FN[0]))

/* Instructions on a broken destination pattern, in a fresh kernel each.  The
 * error is the kernel's (NT_ESIM, message naming the instruction): the
 * runner checks nt_sim_kernel_message for these. */
static char sim_msg[400];
static const char *const INSTR[] = {
    "dma_copy", "tensor_tensor", "tensor_scalar", "activation", "tensor_copy", "memset",
    "iota", "select", "tensor_copy_sr", "affine_select", "tensor_reduce", "tensor_tensor_scan",
    "nc_matmul", "nc_transpose", "dma_gather", "gpsimd_custom", "scalar_tensor_tensor",
};
#define NINSTR ((int)(sizeof INSTR / sizeof INSTR[0]))
enum { D_NULL, D_NUM0, D_HUGE, D_STEP, D_OFF, D_PARTS, D_DTYPE, D_P0NEG, D_NDIM, D_NUMPROD,
       D_OFFNEG, D_NV };
static const char *const DNAME[] = {
    "NULL", "a 0 size", "a 2^62 size", "a 2^62 step", "an offset past the tile",
    "partitions past the tile", "another dtype", "a negative partition start", "5 free dims",
    "a free count past 2^48", "a huge negative offset",
};

static int gp_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                 void *ctx, char *msg, size_t msglen)
{
    (void)dst, (void)src, (void)nsrc, (void)ctx, (void)msg, (void)msglen;
    return 0;
}

static int run_sim_bad(int v)
{
    int ins = v / D_NV, bad = v % D_NV;
    nt_sim_kernel *k = nt_sim_kernel_begin("badinput");
    assert_non_null(k);
    nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 64);
    nt_tile *b = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_F32, 128, 64);
    nt_tile *c = nt_tile_alloc(k, "c", NT_MEM_SBUF, NT_F32, 128, 1);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    nt_ap sa = nt_tile_ap(a), sb = nt_tile_ap(b), sc = nt_tile_ap(c), d = nt_tile_ap(a);
    switch (bad) {
    case D_NUM0: d.num[0] = 0; break;
    case D_HUGE: d.num[0] = (int64_t)1 << 62; break;
    case D_STEP: d.ndim = 2, d.num[0] = 2, d.step[0] = (int64_t)1 << 62, d.num[1] = 32,
                 d.step[1] = 1; break;
    case D_OFF: d.offset = 64; break;
    case D_PARTS: d.p0 = 96, d.np = 64; break;
    case D_DTYPE: d.dtype = NT_BF16; break;
    case D_P0NEG: d.p0 = -32; break;
    case D_NDIM: d.ndim = 5; break;
    case D_NUMPROD: d.ndim = 4, d.num[0] = d.num[1] = d.num[2] = d.num[3] = (int64_t)1 << 20,
                    d.step[0] = d.step[1] = d.step[2] = d.step[3] = 0; break;
    case D_OFFNEG: d.offset = INT64_MIN / 2; break;
    }
    const nt_ap *dp = bad == D_NULL ? NULL : &d;
    nt_isa_alu alu = {NT_ALU_ADD, {NULL, 1.0f}, false};
    nt_isa_affine aff = {0, 1, {1, 0, 0, 0}};
    nt_isa_index idx = {0, 64, {1, 0, 0, 0}};
    nt_isa_scalar init = {NULL, 0.0f};
    int rc = -999;
    switch (ins) {
    case 0: rc = nt_isa_dma_copy(k, dp, &sb, 0); break;
    case 1: rc = nt_isa_tensor_tensor(k, dp, &sa, &sb, NT_ALU_ADD, NT_ENGINE_DEFAULT); break;
    case 2: rc = nt_isa_tensor_scalar(k, dp, &sb, &alu, NULL, NT_ENGINE_DEFAULT); break;
    case 3: rc = nt_isa_activation(k, dp, NT_ACT_EXP, &sb, NULL, NULL, NULL); break;
    case 4: rc = nt_isa_tensor_copy(k, dp, &sb, NT_ENGINE_DEFAULT); break;
    case 5: rc = nt_isa_memset(k, dp, 1.0, NT_ENGINE_DEFAULT); break;
    case 6: rc = nt_isa_iota(k, dp, &aff); break;
    case 7: rc = nt_isa_select(k, dp, &sb, &sb, &sb, NT_ENGINE_DEFAULT); break;
    case 8: rc = nt_isa_tensor_copy_sr(k, dp, &sb, 1, &idx, NT_ENGINE_DEFAULT); break;
    case 9: rc = nt_isa_affine_select(k, dp, &sb, &aff, NT_ALU_GT, 0.0f); break;
    case 10: /* dst [128, 1]: the broken pattern is the source here */
        rc = nt_isa_tensor_reduce(k, &sc, dp, NT_ALU_ADD, 0);
        break;
    case 11: rc = nt_isa_tensor_tensor_scan(k, dp, &sa, &sb, &init, NT_ALU_ADD, NT_ALU_ADD); break;
    case 12: rc = nt_isa_nc_matmul(k, dp, &sa, &sb, false); break;
    case 13: rc = nt_isa_nc_transpose(k, dp, &sb); break;
    case 14: {
        static float hbuf[4 * 64];
        nt_tile *ix = nt_tile_alloc(k, "ix", NT_MEM_SBUF, NT_I32, 128, 1);
        nt_ap hs = nt_hbm_ap(hbuf, NT_F32, 0, 4, 64, 64), ia = nt_tile_ap(ix);
        rc = nt_isa_dma_gather(k, dp, &hs, &ia, 0);
        break;
    }
    case 15: {
        const nt_ap *srcs[] = {&sb};
        rc = nt_isa_gpsimd_custom(k, "c", dp, srcs, 1, 1.0, gp_fn, NULL);
        break;
    }
    case 16:
        rc = nt_isa_scalar_tensor_tensor(k, dp, &sb, &alu, NT_ALU_ADD, &sa, false,
                                         NT_ENGINE_DEFAULT);
        break;
    }
    snprintf(sim_msg, sizeof sim_msg, "%s", nt_sim_kernel_message(k));
    int end = nt_sim_kernel_end(k, NULL);
    assert_int_equal(end, rc);
    return rc;
}

static int run_sim_misc(int v)
{
    nt_sim_kernel *k = nt_sim_kernel_begin("badinput");
    assert_non_null(k);
    int rc = -999;
    nt_tile *t = NULL;
    nt_sim_instr_info info;
    switch (v) {
    case 0: t = nt_tile_alloc(k, "t", NT_MEM_HBM, NT_F32, 1, 1); break;
    case 1: t = nt_tile_alloc(k, "t", (nt_mem)9, NT_F32, 1, 1); break;
    case 2: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_DTYPE_COUNT, 1, 1); break;
    case 3: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 0, 1); break;
    case 4: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 129, 1); break;
    case 5: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 1, 0); break;
    case 6: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 1, -5); break;
    case 7: /* 2^62 * 4 bytes wraps to 0: the heap overflow of issue 16 */
        t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 128, (int64_t)1 << 62);
        break;
    case 8: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 128, ((int64_t)1 << 62) + 16); break;
    case 9: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_U8, 128, INT64_MAX); break;
    case 10: t = nt_tile_alloc(k, "t", NT_MEM_PSUM, NT_F32, 128, 513); break;
    case 11: t = nt_tile_alloc(k, "t", NT_MEM_PSUM, NT_F32, 128, (int64_t)1 << 61); break;
    case 12: t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 128, 1 << 20); break;
    case 13:
        t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 128, 16);
        assert_int_equal(nt_tile_release(k, t), 0);
        rc = nt_tile_release(k, t);
        t = NULL;
        break;
    case 14: rc = nt_sim_kernel_last(k, &info); break; /* nothing issued yet */
    case 15: rc = nt_tile_matmul(k, NULL); break;
    case 16: rc = nt_tile_matmul(k, &(nt_tile_matmul_args){.M = -1, .N = 2, .K = 2}); break;
    case 17: { /* an HBM pattern whose partition step would overflow */
        float h[4];
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, 2, 2);
        nt_ap hp = nt_hbm_ap(h, NT_F32, 0, 2, INT64_MAX / 2, 2), sp = nt_tile_ap(s);
        rc = nt_isa_dma_copy(k, &sp, &hp, 0);
        break;
    }
    case 18: { /* psum tile across a bank */
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 128, 512);
        nt_ap pa = nt_tile_slice(p, 0, 128, 300, 300);
        rc = nt_isa_memset(k, &pa, 0, NT_ENGINE_VECTOR);
        break;
    }
    case 19: { /* gpsimd touching PSUM */
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 128, 16);
        nt_ap pa = nt_tile_ap(p);
        rc = nt_isa_memset(k, &pa, 0, NT_ENGINE_GPSIMD);
        break;
    }
    case 20: { /* a released tile used */
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, 128, 16);
        nt_ap sp = nt_tile_ap(s);
        assert_int_equal(nt_tile_release(k, s), 0);
        rc = nt_isa_memset(k, &sp, 0, NT_ENGINE_VECTOR);
        break;
    }
    case 21: { /* matmul with K > 128 */
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, 128, 16);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 16, 16);
        nt_ap sp = nt_tile_ap(s), pp = nt_tile_ap(p);
        sp.np = 129;
        rc = nt_isa_nc_matmul(k, &pp, &sp, &sp, false);
        break;
    }
    case 22: rc = nt_isa_dma_copy(k, &(nt_ap){0}, &(nt_ap){0}, 99); break;
    case 23: rc = nt_isa_gpsimd_custom(k, "c", NULL, NULL, 9, 1, NULL, NULL); break;
    case 24: { /* M + 127 would overflow */
        float x[4];
        rc = nt_tile_matmul(k, &(nt_tile_matmul_args){.M = INT64_MAX, .N = 2, .K = 2, .a = x,
                                                        .lda = 2, .b = x, .ldb = 2, .c = x,
                                                        .ldc = 2, .in_dtype = NT_F32,
                                                        .out_dtype = NT_F32});
        break;
    }
    case 26: { /* 2^32 + 2 rows: not truncated to 2 */
        float h[4];
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, 2, 2);
        nt_ap hp = nt_hbm_ap(h, NT_F32, 0, ((int64_t)1 << 32) + 2, 2, 2), sp = nt_tile_ap(s);
        rc = nt_isa_dma_copy(k, &sp, &hp, 0);
        break;
    }
    case 25: {
        float x[4];
        rc = nt_tile_matmul(k, &(nt_tile_matmul_args){.M = 2, .N = 2, .K = 2, .a = x,
                                                        .lda = INT64_MAX, .b = x, .ldb = 2,
                                                        .c = x, .ldc = 2, .in_dtype = NT_F32,
                                                        .out_dtype = NT_F32});
        break;
    }
    }
    if (v <= 12) {
        if (t)
            rc = 1;
        else
            rc = nt_sim_kernel_error(k);
    }
    snprintf(sim_msg, sizeof sim_msg, "%s", nt_sim_kernel_message(k));
    nt_sim_kernel_end(k, NULL);
    return rc;
}
static const char *const SIM_MISC_WANT[] = {
    "nt_tile_alloc", "nt_tile_alloc", "nt_tile_alloc", "nt_tile_alloc", "nt_tile_alloc",
    "nt_tile_alloc", "nt_tile_alloc", "nt_tile_alloc", "nt_tile_alloc", "nt_tile_alloc",
    "nt_tile_alloc", "nt_tile_alloc", "nt_tile_alloc", "nt_tile_release", "",
    "nt_tile_matmul", "nt_tile_matmul", "dma_copy", "memset", "memset", "memset", "nc_matmul",
    "dma_copy", "gpsimd_custom", "nt_tile_matmul", "nt_tile_matmul", "dma_copy",
};
#define NSIMMISC ((int)(sizeof SIM_MISC_WANT / sizeof SIM_MISC_WANT[0]))

/* ------------------------------------------------------------------ */
/* Issue 13's training ops                                            */
/* ------------------------------------------------------------------ */

/* A run-time error: the op is accepted, the sync reports the error. */
static int R(nt_tensor *t)
{
    if (!t)
        return 1; /* refused at the call: not what the case expects */
    size_t nb = (size_t)nt_numel(t) * nt_dtype_size(nt_dtype_of(t));
    void *buf = malloc(nb ? nb : 1);
    int rc = nt_to_host(t, buf, nb);
    free(buf);
    nt_release(t);
    return rc;
}

/* nt_topk with either output pointer NULL or not; a given one must come
 * back NULL on an error. */
static int TK(nt_tensor *x, int64_t k, int dim, bool give_v, bool give_i)
{
    nt_tensor *v = F.a23, *i = F.a23; /* not NULL: the call must clear them */
    int rc = nt_topk(x, k, dim, true, give_v ? &v : NULL, give_i ? &i : NULL);
    if (rc == 0) {
        nt_release(v), nt_release(i);
        return 1;
    }
    if ((give_v && v) || (give_i && i))
        return 2; /* an output left set */
    return rc;
}

static const struct { const char *fn; int code; const char *want; const char *name; } TR[] = {
    {"nt_cross_entropy_ex", NT_EINVAL, "'logits'", "logits NULL"},
    {"nt_cross_entropy_ex", NT_EINVAL, "'labels'", "labels NULL"},
    {"nt_cross_entropy_ex", NT_ERELEASED, "'logits'", "logits released"},
    {"nt_cross_entropy_ex", NT_EDTYPE, "'labels'", "f32 labels"},
    {"nt_cross_entropy_ex", NT_ESHAPE, "'labels'", "3 rows, 2 labels"},
    {"nt_cross_entropy_ex", NT_EINVAL, "label_smoothing", "label_smoothing NaN"},
    {"nt_cross_entropy_ex", NT_EINVAL, "label_smoothing", "label_smoothing -0.1"},
    {"nt_cross_entropy_ex", NT_EINVAL, "label_smoothing", "label_smoothing 1.5"},
    {"nt_cross_entropy_ex", NT_ERANGE, "labels[1] = 3 is out of range [0, 3)",
     "a label out of range, not ignore_index (when it runs)"},
    {"nt_dropout", NT_EINVAL, "'x'", "x NULL"},
    {"nt_dropout", NT_ERELEASED, "'x'", "x released"},
    {"nt_dropout", NT_EDTYPE, "'x' has dtype i32", "i32 x"},
    {"nt_dropout", NT_EINVAL, "'p' is -0.1; expected a probability in [0, 1)", "p -0.1"},
    {"nt_dropout", NT_EINVAL, "'p' is 1", "p 1"},
    {"nt_dropout", NT_EINVAL, "'p' is nan", "p NaN"},
    {"nt_clip_grad_norm", NT_EINVAL, "'params' is NULL", "params NULL"},
    {"nt_clip_grad_norm", NT_EINVAL, "'n' is < 0", "n -1"},
    {"nt_clip_grad_norm", NT_EINVAL, "'max_norm' is 0; expected a value > 0", "max_norm 0"},
    {"nt_clip_grad_norm", NT_EINVAL, "'max_norm' is -1", "max_norm -1"},
    {"nt_clip_grad_norm", NT_EINVAL, "'max_norm' is nan", "max_norm NaN"},
    {"nt_clip_grad_norm", NT_EDTYPE, "'params[1]' is i32", "an i32 parameter"},
    {"nt_clip_grad_norm", NT_ERELEASED, "params[0]", "a released parameter"},
    {"nt_clip_grad_norm", NT_EINVAL, "params[1]", "a NULL parameter"},
    {"nt_clip_grad_norm", NT_EINVAL, "same tensor at 0 and 1", "a repeated parameter"},
    {"nt_topk", NT_EINVAL, "'x'", "x NULL"},
    {"nt_topk", NT_ERELEASED, "'x'", "x released"},
    {"nt_topk", NT_EINVAL, "'values' is NULL", "values NULL"},
    {"nt_topk", NT_EINVAL, "'indices' is NULL", "indices NULL"},
    {"nt_topk", NT_EINVAL, "'k' is 4; expected 0 <= k <= 3, the size of dim 1", "k > size"},
    {"nt_topk", NT_EINVAL, "'k' is -1", "k -1"},
    {"nt_topk", NT_EDIM, "dim 2 is out of range", "dim 2 of 2"},
    {"nt_topk", NT_EDIM, "dim -3", "dim -3 of 2"},
    {"nt_topk", NT_EINVAL, "'k' is 2; expected 0 or 1 for a 0-d tensor", "0-d x, k 2"},
    {"nt_multinomial", NT_EINVAL, "'probs'", "probs NULL"},
    {"nt_multinomial", NT_ERELEASED, "'probs'", "probs released"},
    {"nt_multinomial", NT_EDTYPE, "'probs' has dtype i32", "i32 probs"},
    {"nt_multinomial", NT_ESHAPE, "expected [C] or [N, C]", "0-d probs"},
    {"nt_multinomial", NT_ESHAPE, "expected [C] or [N, C]", "3-d probs"},
    {"nt_multinomial", NT_EINVAL, "'n' is 0; expected 1 <= n", "n 0"},
    {"nt_multinomial", NT_EINVAL, "'n' is -3", "n -3"},
    {"nt_multinomial", NT_EINVAL, "probs[1, 2] = -0.5; expected finite probabilities >= 0",
     "a negative probability (when it runs)"},
    {"nt_multinomial", NT_EINVAL, "probs[0, 1] = nan", "a NaN probability (when it runs)"},
    {"nt_multinomial", NT_EINVAL, "probs[2] = inf", "an Inf probability (when it runs)"},
    {"nt_multinomial", NT_EINVAL, "row 1 of probs sums to 0", "a zero row (when it runs)"},
    {"nt_topk", NT_EDIM, "dim 1 is out of range for a 0-d tensor", "0-d x, dim 1"},
    {"nt_cross_entropy_ex", NT_ESHAPE, "expected [N, C] with N, C >= 1 (or N = 0)",
     "2 rows, 0 classes"},
};
#define NTR ((int)(sizeof TR / sizeof TR[0]))

static int run_trainops(int v)
{
    switch (v) {
    case 0: return T(nt_cross_entropy_ex(NULL, F.lab2, -100, 0.0));
    case 1: return T(nt_cross_entropy_ex(F.a23, NULL, -100, 0.0));
    case 2: return T(nt_cross_entropy_ex(F.rel, F.lab2, -100, 0.0));
    case 3: return T(nt_cross_entropy_ex(F.a23, F.v4, -100, 0.0));
    case 4: return T(nt_cross_entropy_ex(F.a32, F.lab2, -100, 0.0));
    case 5: return T(nt_cross_entropy_ex(F.a23, F.lab2, -100, NAN));
    case 6: return T(nt_cross_entropy_ex(F.a23, F.lab2, -100, -0.1));
    case 7: return T(nt_cross_entropy_ex(F.a23, F.lab2, -100, 1.5));
    case 8: {
        nt_tensor *lab = nt_from_host((int32_t[]){-100, 3}, NT_I32, 1, SH(2));
        int rc = R(nt_cross_entropy_ex(F.a23, lab, -100, 0.1));
        nt_release(lab);
        return rc;
    }
    case 9: return T(nt_dropout(NULL, 0.5, 1));
    case 10: return T(nt_dropout(F.rel, 0.5, 1));
    case 11: return T(nt_dropout(F.i23, 0.5, 1));
    case 12: return T(nt_dropout(F.a23, -0.1, 1));
    case 13: return T(nt_dropout(F.a23, 1.0, 1));
    case 14: return T(nt_dropout(F.a23, NAN, 1));
    case 15: return T(nt_clip_grad_norm(NULL, 1, 1.0));
    case 16: return T(nt_clip_grad_norm(&F.pw, -1, 1.0));
    case 17: return T(nt_clip_grad_norm(&F.pw, 1, 0.0));
    case 18: return T(nt_clip_grad_norm(&F.pw, 1, -1.0));
    case 19: return T(nt_clip_grad_norm(&F.pw, 1, NAN));
    case 20: return T(nt_clip_grad_norm((nt_tensor *[]){F.pw, F.i23}, 2, 1.0));
    case 21: return T(nt_clip_grad_norm((nt_tensor *[]){F.rel, F.pw}, 2, 1.0));
    case 22: return T(nt_clip_grad_norm((nt_tensor *[]){F.pw, NULL}, 2, 1.0));
    case 23: return T(nt_clip_grad_norm((nt_tensor *[]){F.pw, F.pw}, 2, 1.0));
    case 24: return TK(NULL, 1, 0, true, true);
    case 25: return TK(F.rel, 1, 0, true, true);
    case 26: return TK(F.a23, 1, 1, false, true);
    case 27: return TK(F.a23, 1, 1, true, false);
    case 28: return TK(F.a23, 4, 1, true, true);
    case 29: return TK(F.a23, -1, 1, true, true);
    case 30: return TK(F.a23, 1, 2, true, true);
    case 31: return TK(F.a23, 1, -3, true, true);
    case 32: return TK(F.s0, 2, 0, true, true);
    case 33: return T(nt_multinomial(NULL, 1, 1));
    case 34: return T(nt_multinomial(F.rel, 1, 1));
    case 35: return T(nt_multinomial(F.i23, 1, 1));
    case 36: return T(nt_multinomial(F.s0, 1, 1));
    case 37: {
        nt_tensor *t3 = nt_ones(NT_F32, 3, SH(2, 2, 2));
        int rc = T(nt_multinomial(t3, 1, 1));
        nt_release(t3);
        return rc;
    }
    case 38: return T(nt_multinomial(F.a23, 0, 1));
    case 39: return T(nt_multinomial(F.a23, -3, 1));
    case 40:
    case 41:
    case 42:
    case 43: {
        /* rows [2, 3] (or [3] for the Inf case); the bad value or the zero row */
        float h[6] = {0.5f, 1, 2, 3, 0, 1};
        if (v == 40)
            h[5] = -0.5f;
        if (v == 41)
            h[1] = NAN;
        if (v == 42)
            h[2] = INFINITY;
        if (v == 43)
            h[3] = h[4] = h[5] = 0;
        nt_tensor *pr = v == 42 ? nt_from_host(h, NT_F32, 1, SH(3))
                                : nt_from_host(h, NT_F32, 2, SH(2, 3));
        int rc = R(nt_multinomial(pr, 4, 9));
        nt_release(pr);
        return rc;
    }
    case 44: return TK(F.s0, 1, 1, true, true);
    case 45: {
        nt_tensor *l = nt_zeros(NT_F32, 2, SH(2, 0));
        int rc = T(nt_cross_entropy_ex(l, F.lab2, -100, 0.0));
        nt_release(l);
        return rc;
    }
    }
    return 1;
}

/* ------------------------------------------------------------------ */
/* The table                                                          */
/* ------------------------------------------------------------------ */

static void build(void)
{
    static const char *const BNAME[] = {"a NULL", "b NULL", "a released", "b released",
                                        "shapes that do not broadcast",
                                        "[2^33,1] with [1,2^31]: 2^64 elements", "rank mismatch"};
    for (int i = 0; i < NUN; i++) {
        add(UN[i].name, NT_EINVAL, "'t' is NULL", run_un, 2 * i, "%s: t NULL", UN[i].name);
        add(UN[i].name, NT_ERELEASED, "released", run_un, 2 * i + 1, "%s: t released",
            UN[i].name);
    }
    for (int i = 0; i < NBIN; i++) {
        bool mse = !strcmp(BIN[i].name, "nt_mse_loss");
        for (int k = 0; k < B_NV; k++) {
            int code = k <= B_NULL_B ? NT_EINVAL : k <= B_REL_B ? NT_ERELEASED : NT_ESHAPE;
            const char *want = k == B_NULL_A ? "'a'" : k == B_NULL_B ? "'b'" : k == B_REL_A ? "'a'"
                               : k == B_REL_B ? "'b'" : k == B_OVERFLOW && !mse ? "2^48"
                                                                                       : NULL;
            add(BIN[i].name, code, want, run_bin, i * B_NV + k, "%s: %s", BIN[i].name, BNAME[k]);
        }
    }
    static const char *const IBNAME[] = {"dst NULL", "src NULL", "dst released", "src released",
                                         "src does not broadcast", "dst an expanded view",
                                         "src bigger than dst", "dst requires grad"};
    for (int i = 0; i < NIBIN; i++)
        for (int k = 0; k < IB_NV; k++) {
            int code = k <= IB_NULL_S      ? NT_EINVAL
                       : k <= IB_REL_S     ? NT_ERELEASED
                       : k == IB_EXPANDED  ? NT_EINVAL
                       : k == IB_GRAD      ? NT_ESTATE
                                           : NT_ESHAPE;
            add(IBIN[i].name, code, NULL, run_ibin, i * IB_NV + k, "%s: %s", IBIN[i].name,
                IBNAME[k]);
        }
    for (int i = 0; i < NSC; i++) {
        add(SC[i].name, NT_EINVAL, "NULL", run_sc, 2 * i, "%s: t NULL", SC[i].name);
        add(SC[i].name, NT_ERELEASED, "released", run_sc, 2 * i + 1, "%s: t released",
            SC[i].name);
    }
    static const char *const DNM[] = {"dst NULL", "dst released", "dst expanded",
                                      "dst requires grad"};
    static const int DCODE[] = {NT_EINVAL, NT_ERELEASED, NT_EINVAL, NT_ESTATE};
    for (int i = 0; i < NISC; i++)
        for (int k = 0; k < 4; k++)
            add(ISC[i].name, DCODE[k], NULL, run_isc, 4 * i + k, "%s: %s", ISC[i].name, DNM[k]);
    for (int k = 0; k < 8; k++)
        add(k / 4 ? "nt_neg_inplace" : "nt_relu_inplace", DCODE[k % 4], NULL, run_iun, k, "%s: %s",
            k / 4 ? "nt_neg_inplace" : "nt_relu_inplace", DNM[k % 4]);
    static const struct { const char *fn; int code; const char *w, *name; } CL[] = {
        {"nt_clamp", NT_EINVAL, "NULL", "t NULL"},
        {"nt_clamp", NT_ERELEASED, "released", "t released"},
        {"nt_clamp", NT_EINVAL, "NaN", "lo NaN"},
        {"nt_clamp", NT_EINVAL, "NaN", "hi NaN"},
        {"nt_clamp_inplace", NT_EINVAL, "NULL", "dst NULL"},
        {"nt_clamp_inplace", NT_ERELEASED, "released", "dst released"},
        {"nt_clamp_inplace", NT_EINVAL, "NaN", "lo NaN"},
        {"nt_clamp_inplace", NT_EINVAL, NULL, "dst expanded"},
        {"nt_clamp_inplace", NT_ESTATE, NULL, "dst requires grad"},
    };
    for (int k = 0; k < 9; k++)
        add(CL[k].fn, CL[k].code, CL[k].w, run_clamp, k, "%s: %s", CL[k].fn, CL[k].name);
    static const struct { int code; const char *w, *name; } WH[] = {
        {NT_EINVAL, "'cond'", "cond NULL"}, {NT_EINVAL, "'a'", "a NULL"},
        {NT_EINVAL, "'b'", "b NULL"},       {NT_ERELEASED, "'cond'", "cond released"},
        {NT_ERELEASED, "'a'", "a released"}, {NT_ERELEASED, "'b'", "b released"},
        {NT_ESHAPE, NULL, "a does not broadcast"}, {NT_ESHAPE, NULL, "cond does not broadcast"},
        {NT_ESHAPE, "2^48", "2^64 elements"},
    };
    for (int k = 0; k < 9; k++)
        add("nt_where", WH[k].code, WH[k].w, run_where, k, "nt_where: %s", WH[k].name);
    static const struct { const char *fn; int code; const char *w, *name; } MF[] = {
        {"nt_tril", NT_EINVAL, "'t'", "t NULL"},
        {"nt_tril", NT_ERELEASED, "'t'", "t released"},
        {"nt_tril", NT_ESHAPE, "'t' [4] must have at least 2 dimensions", "t 1-d"},
        {"nt_triu", NT_EINVAL, "'t'", "t NULL"},
        {"nt_triu", NT_ESHAPE, "at least 2 dimensions", "t 0-d"},
        {"nt_masked_fill", NT_EINVAL, "'t'", "t NULL"},
        {"nt_masked_fill", NT_EINVAL, "'mask'", "mask NULL"},
        {"nt_masked_fill", NT_ERELEASED, "'t'", "t released"},
        {"nt_masked_fill", NT_ERELEASED, "'mask'", "mask released"},
        {"nt_masked_fill", NT_EDTYPE, "'mask' has dtype f32; expected u8", "mask f32"},
        {"nt_masked_fill", NT_ESHAPE, "'mask' [2, 3] does not broadcast to 't' [3, 2]",
         "mask does not broadcast"},
        {"nt_masked_fill", NT_ESHAPE, "'mask'", "mask would grow t"},
        {NULL, SENTINEL, NULL, "NaN into i32 is stored as nt_full stores it"},
    };
    for (int k = 0; k < (int)(sizeof MF / sizeof MF[0]); k++)
        add(MF[k].fn, MF[k].code, MF[k].w, run_masks, k, "%s: %s",
            MF[k].fn ? MF[k].fn : "nt_masked_fill", MF[k].name);
    static const struct { int code; const char *w, *name; } SD[] = {
        {NT_EINVAL, "'q'", "q NULL"},
        {NT_EINVAL, "'k'", "k NULL"},
        {NT_EINVAL, "'v'", "v NULL"},
        {NT_ERELEASED, "'q'", "q released"},
        {NT_ERELEASED, "'v'", "v released"},
        {NT_ERELEASED, "'mask'", "mask released"},
        {NT_EDTYPE, "'q' has dtype i32", "q i32"},
        {NT_EDTYPE, "'k' has dtype bf16; expected q's f32", "k bf16, q f32"},
        {NT_ESHAPE, "'q' has shape [4]; expected at least 2 dims", "q 1-d"},
        {NT_ESHAPE, "'k' has shape [3, 2]; expected its last dim to be q's 3", "k's D"},
        {NT_ESHAPE, "'v' has shape [3, 2]; expected 2 rows", "v's rows"},
        {NT_ESHAPE, "'mask' has shape [3, 2]; expected one that broadcasts to [2, 2]",
         "mask does not broadcast"},
        {NT_EDTYPE, "'mask' has dtype i32", "mask i32"},
        {NT_ESHAPE, "'k' has shape [2, 2, 3]; expected the leading dims", "k's leading dims"},
        {NT_EINVAL, "'scale' is nan", "scale NaN"},
        {NT_ESHAPE, "head dim 129; expected 1..128", "D 129"},
    };
    for (int k = 0; k < (int)(sizeof SD / sizeof SD[0]); k++)
        add("nt_scaled_dot_product_attention", SD[k].code, SD[k].w, run_sdpa, k,
            "nt_scaled_dot_product_attention: %s", SD[k].name);
    static const struct { const char *fn; int code; const char *name; } CA[] = {
        {"nt_cast", NT_EINVAL, "t NULL"},       {"nt_cast", NT_ERELEASED, "t released"},
        {"nt_cast", NT_EDTYPE, "dt -1"},        {"nt_cast", NT_EDTYPE, "dt NT_DTYPE_COUNT"},
        {"nt_cast", NT_EDTYPE, "dt 99"},        {"nt_cast_sr", NT_EINVAL, "t NULL"},
        {"nt_cast_sr", NT_ERELEASED, "t released"}, {"nt_cast_sr", NT_EDTYPE, "to i32"},
        {"nt_cast_sr", NT_EDTYPE, "to f32"},    {"nt_cast_sr", NT_EDTYPE, "from i32"},
        {"nt_cast_sr", NT_EDTYPE, "dt 77"},
    };
    for (int k = 0; k < 11; k++)
        add(CA[k].fn, CA[k].code, NULL, run_cast, k, "%s: %s", CA[k].fn, CA[k].name);
    for (int i = 0; i < NRED; i++)
        for (int k = 0; k < 7; k++)
            add(RED[i].name, k == 0 ? NT_EINVAL : k == 1 ? NT_ERELEASED : NT_EDIM, NULL, run_red,
                i * 7 + k, "%s: %s", RED[i].name,
                k == 0 ? "t NULL" : k == 1 ? "t released" : "dim out of range");
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 7; k++) {
            const char *fn = i ? "nt_log_softmax" : "nt_softmax";
            add(fn, k == 0 ? NT_EINVAL : k == 1 ? NT_ERELEASED : NT_EDIM, NULL, run_soft,
                i * 7 + k, "%s: %s (%d)", fn,
                k == 0 ? "t NULL" : k == 1 ? "t released" : "dim out of range", k);
        }
    add("nt_mean", NT_EDTYPE, NULL, run_red_mean_int, 0, "nt_mean: i32 input");
    static const struct { const char *fn; int code; const char *name; } NN[] = {
        {"nt_layer_norm", NT_EINVAL, "x NULL"},       {"nt_layer_norm", NT_ERELEASED, "x released"},
        {"nt_layer_norm", NT_ERELEASED, "w released"}, {"nt_layer_norm", NT_ERELEASED, "b released"},
        {"nt_layer_norm", NT_ESHAPE, "w [4] for 3"},  {"nt_layer_norm", NT_ESHAPE, "b [4] for 3"},
        {"nt_layer_norm", NT_EINVAL, "eps -1"},       {"nt_layer_norm", NT_EINVAL, "eps NaN"},
        {"nt_layer_norm", NT_ESHAPE, "0-d x"},        {"nt_rms_norm", NT_EINVAL, "x NULL"},
        {"nt_rms_norm", NT_ERELEASED, "x released"},  {"nt_rms_norm", NT_ERELEASED, "w released"},
        {"nt_rms_norm", NT_ESHAPE, "w [4] for 3"},    {"nt_rms_norm", NT_EINVAL, "eps -1"},
        {"nt_rms_norm", NT_EINVAL, "eps inf"},        {"nt_cross_entropy", NT_EINVAL, "logits NULL"},
        {"nt_cross_entropy", NT_EINVAL, "labels NULL"},
        {"nt_cross_entropy", NT_ERELEASED, "logits released"},
        {"nt_cross_entropy", NT_ERELEASED, "labels released"},
        {"nt_cross_entropy", NT_EDTYPE, "f32 labels"},
        {"nt_cross_entropy", NT_ESHAPE, "1-D logits"},
        {"nt_cross_entropy", NT_ESHAPE, "3 rows, 2 labels"},
        {"nt_embedding", NT_EINVAL, "weight NULL"},  {"nt_embedding", NT_EINVAL, "idx NULL"},
        {"nt_embedding", NT_ERELEASED, "weight released"},
        {"nt_embedding", NT_ERELEASED, "idx released"},
        {"nt_embedding", NT_ESHAPE, "1-D weight"},   {"nt_embedding", NT_EDTYPE, "f32 indices"},
        {"nt_linear", NT_EINVAL, "x NULL"},          {"nt_linear", NT_EINVAL, "w NULL"},
        {"nt_linear", NT_ERELEASED, "x released"},   {"nt_linear", NT_ERELEASED, "w released"},
        {"nt_linear", NT_ERELEASED, "b released"},   {"nt_linear", NT_ESHAPE, "in 3 vs w's 2"},
        {"nt_linear", NT_ESHAPE, "bias 4 for 2 outputs"},
        {"nt_matmul", NT_ESHAPE, "0-d a"},           {"nt_matmul", NT_EDTYPE, "i32 operands"},
        {"nt_linear", NT_EDTYPE, "i32 operands"},    {"nt_linear", NT_ESHAPE, "x [2^33, 1] for w [2, 3]"},
    };
    for (int k = 0; k < (int)(sizeof NN / sizeof NN[0]); k++)
        add(NN[k].fn, NN[k].code, NULL, run_nn, k, "%s: %s", NN[k].fn, NN[k].name);
    static const struct { const char *fn; int code; const char *w, *name; } NW[] = {
        {"nt_min", NT_ESHAPE, "empty", "empty dim"},
        {"nt_argmin", NT_ESHAPE, "empty", "empty tensor"},
        {"nt_norm", NT_EINVAL, "NULL", "t NULL"},
        {"nt_norm", NT_ERELEASED, NULL, "t released"},
        {"nt_norm", NT_EDTYPE, "'t'", "i32 input"},
        {"nt_norm", NT_EINVAL, "'ord' is NaN", "ord NaN"},
        {"nt_norm", NT_EDIM, "dim 2", "dim 2"},
        {"nt_norm", NT_ESHAPE, "inf-norm", "inf-norm of an empty dim"},
        {"nt_norm", NT_ESHAPE, "-inf-norm", "-inf-norm of an empty tensor"},
        {"nt_gather", NT_EINVAL, "NULL", "t NULL"},
        {"nt_gather", NT_EINVAL, "index", "index NULL"},
        {"nt_gather", NT_ERELEASED, "index", "index released"},
        {"nt_gather", NT_EDTYPE, "'index' has dtype f32", "f32 index"},
        {"nt_gather", NT_ESHAPE, "'index' has shape [2]", "1-D index for 2-D t"},
        {"nt_gather", NT_ESHAPE, "'index' has shape [3, 3]", "index larger than t"},
        {"nt_gather", NT_EDIM, "dim 2", "dim 2"},
        {"nt_gather", NT_ESHAPE, "0-d", "0-d t"},
        {"nt_gather", NT_ERANGE, "index[4] = 3 is out of range [0, 3)", "index 3 of 3"},
        {"nt_gather", NT_ERANGE, "index[1] = -1 is out of range [0, 2)", "negative index"},
        {"nt_index_select", NT_ESHAPE, "1-D", "2-D index"},
        {"nt_index_select", NT_EDTYPE, "'index' has dtype f32", "f32 index"},
        {"nt_index_select", NT_EDIM, "dim -3", "dim -3"},
        {"nt_index_select", NT_ERANGE, "index[2] = 2 is out of range [0, 2)", "index 2 of 2"},
        {"nt_repeat", NT_EINVAL, "NULL", "t NULL"},
        {"nt_repeat", NT_ERELEASED, NULL, "t released"},
        {"nt_repeat", NT_EINVAL, "'n' is 1", "fewer repeats than dims"},
        {"nt_repeat", NT_EINVAL, "repeats array", "repeats NULL"},
        {"nt_repeat", NT_EINVAL, "repeats[1] is -2", "negative repeat"},
        {"nt_repeat", NT_EINVAL, "'n' is 9", "9 repeats"},
        {"nt_repeat", NT_EINVAL, "2^48", "2^41 x 3 x 2^20 elements"},
        {"nt_split", NT_EINVAL, "NULL", "t NULL"},
        {"nt_split", NT_ERELEASED, NULL, "t released"},
        {"nt_split", NT_EINVAL, "'split_size' is 0", "split_size 0"},
        {"nt_split", NT_EINVAL, "'split_size' is -3", "split_size -3"},
        {"nt_split", NT_EINVAL, "'max_out' is 2; the split makes 3", "max_out too small"},
        {"nt_split", NT_EINVAL, "out NULL", "out NULL"},
        {"nt_split", NT_EDIM, "dim 2", "dim 2"},
        {"nt_split", NT_EDIM, "0 dims", "0-d t"},
    };
    for (int k = 0; k < (int)(sizeof NW / sizeof NW[0]); k++)
        add(NW[k].fn, NW[k].code, NW[k].w, run_new, k, "%s: %s", NW[k].fn, NW[k].name);
    static const struct { const char *fn; int code; const char *w, *name; } VW[] = {
        {"nt_reshape", NT_EINVAL, "NULL", "t NULL"},
        {"nt_reshape", NT_ERELEASED, NULL, "t released"},
        {"nt_reshape", NT_EINVAL, "ndim", "ndim -1"},
        {"nt_reshape", NT_EINVAL, "ndim", "ndim 9"},
        {"nt_reshape", NT_EINVAL, "ndim", "shape NULL"},
        {"nt_reshape", NT_ESHAPE, NULL, "numel 7 for 6"},
        {"nt_reshape", NT_EINVAL, "shape[1]", "two -1"},
        {"nt_reshape", NT_EINVAL, "shape[0]", "-2"},
        {"nt_reshape", NT_EINVAL, "2^48", "[16, 2^60+1] (wraps to 16)"},
        {"nt_reshape", NT_EINVAL, "2^48", "[INT64_MAX, 2] (wraps)"},
        {"nt_reshape", NT_EINVAL, "2^48", "[0] to [0, 2^62]"},
        {"nt_reshape", NT_ESHAPE, "infer", "[0] to [0, -1]"},
        {"nt_transpose", NT_EINVAL, "NULL", "t NULL"},
        {"nt_transpose", NT_ERELEASED, NULL, "t released"},
        {"nt_transpose", NT_EDIM, NULL, "d0 2"},
        {"nt_transpose", NT_EDIM, NULL, "d1 -3"},
        {"nt_transpose", NT_EDIM, NULL, "d0 1000"},
        {"nt_transpose", NT_EDIM, NULL, "0-d tensor"},
        {"nt_permute", NT_EINVAL, "NULL", "t NULL"},
        {"nt_permute", NT_ERELEASED, NULL, "t released"},
        {"nt_permute", NT_EINVAL, "perm", "perm NULL"},
        {"nt_permute", NT_EDIM, "repeated", "perm repeated"},
        {"nt_permute", NT_EDIM, "out of range", "perm out of range"},
        {"nt_permute", NT_EDIM, "out of range", "perm -3"},
        {"nt_slice", NT_EINVAL, "NULL", "t NULL"},
        {"nt_slice", NT_ERELEASED, NULL, "t released"},
        {"nt_slice", NT_EDIM, NULL, "dim 2"},
        {"nt_slice", NT_EDIM, NULL, "dim -3"},
        {"nt_slice", NT_EINVAL, "step", "step 0"},
        {"nt_slice", NT_EINVAL, "step", "step -1"},
        {"nt_slice", NT_EINVAL, "step", "step INT64_MIN"},
        {"nt_slice", NT_EDIM, NULL, "0-d tensor"},
        {"nt_expand", NT_EINVAL, "NULL", "t NULL"},
        {"nt_expand", NT_ERELEASED, NULL, "t released"},
        {"nt_expand", NT_EINVAL, "ndim", "ndim below t's"},
        {"nt_expand", NT_EINVAL, "ndim", "ndim 9"},
        {"nt_expand", NT_EINVAL, "ndim", "shape NULL"},
        {"nt_expand", NT_ESHAPE, NULL, "dim 0 of size 2 to 4"},
        {"nt_expand", NT_EINVAL, "shape[0]", "-1 for a new dim"},
        {"nt_expand", NT_EINVAL, "shape[0]", "-5 for a new dim"},
        {"nt_expand", NT_ESHAPE, NULL, "-7 on an existing dim"},
        {"nt_expand", NT_EINVAL, "2^48", "2^20 x 2^33"},
        {"nt_expand", NT_EINVAL, "2^48", "2^40 x 2^40 x 6"},
        {"nt_expand", NT_EINVAL, "2^48", "INT64_MAX x 6"},
        {"nt_cat", NT_EINVAL, "NULL", "ts NULL"},
        {"nt_cat", NT_EINVAL, "n = 0", "n 0"},
        {"nt_cat", NT_EINVAL, "n = -1", "n -1"},
        {"nt_cat", NT_EINVAL, "ts[1]", "ts[1] NULL"},
        {"nt_cat", NT_ERELEASED, "ts[1]", "ts[1] released"},
        {"nt_cat", NT_ESHAPE, "ts[1]", "dtype mismatch"},
        {"nt_cat", NT_ESHAPE, "ts[1]", "shape mismatch"},
        {"nt_cat", NT_EDIM, NULL, "dim 2"},
        {"nt_cat", NT_ESHAPE, "ts[1]", "rank mismatch"},
        {"nt_cat", NT_ENOMEM, "bytes", "2 x [2^33, 1] along dim 1: 2^34 x 4 B, over capacity"},
        {"nt_cat", NT_EDIM, NULL, "0-d tensors"},
        {"nt_cat", NT_ESHAPE, "2^48", "3 x [2^47, 1] along dim 0"},
    };
    for (int k = 0; k < (int)(sizeof VW / sizeof VW[0]); k++)
        add(VW[k].fn, VW[k].code, VW[k].w, run_view, k, "%s: %s", VW[k].fn, VW[k].name);
    static const char *const MKN[] = {"dt -1", "dt NT_DTYPE_COUNT", "ndim -1", "ndim 9", "shape NULL",
                                      "shape[1] -3", "shape[0] INT64_MIN", "2^40 x 2^40",
                                      "0 x 2^62 x 2^62", "2^32 x 2^32 (wraps to 0)"};
    for (int i = 0; i < NMK; i++)
        for (int k = 0; k < MK_NV; k++) {
            int code = k <= MK_DT_BIG ? NT_EDTYPE : NT_EINVAL;
            const char *want = k >= MK_OVER ? "2^48" : k >= MK_DIM_NEG ? "shape[" : NULL;
            add(MK[i].name, code, want, run_mk, i * MK_NV + k, "%s: %s", MK[i].name, MKN[k]);
        }
    static const struct { const char *fn; int code; const char *name; } MX[] = {
        {"nt_rand", NT_EDTYPE, "i32"},        {"nt_randn", NT_EDTYPE, "u8"},
        {"nt_from_host", NT_EINVAL, "src NULL"}, {"nt_arange", NT_EINVAL, "step 0"},
        {"nt_arange", NT_EINVAL, "start NaN"}, {"nt_arange", NT_EINVAL, "end inf"},
        {"nt_arange", NT_EINVAL, "step away from end"}, {"nt_arange", NT_EINVAL, "end before start"},
        {"nt_arange", NT_EINVAL, "1e600 elements"}, {"nt_arange", NT_EDTYPE, "dt 9"},
        {"nt_arange", NT_EINVAL, "end - start overflows"}, {"nt_arange", NT_EINVAL, "step NaN"},
    };
    for (int k = 0; k < 12; k++)
        add(MX[k].fn, MX[k].code, NULL, run_mk_extra, k, "%s: %s", MX[k].fn, MX[k].name);
    static const struct { const char *fn; int code; const char *name; } SY[] = {
        {"nt_to_host", NT_EINVAL, "t NULL"},     {"nt_to_host", NT_ERELEASED, "t released"},
        {"nt_to_host", NT_EINVAL, "dst NULL"},   {"nt_to_host", NT_EINVAL, "nbytes 23 < 24"},
        {"nt_to_host", NT_EINVAL, "nbytes 0"},   {"nt_item", NT_EINVAL, "t NULL"},
        {"nt_item", NT_ERELEASED, "t released"}, {"nt_item", NT_EINVAL, "out NULL"},
        {"nt_item", NT_ESHAPE, "6 elements"},    {"nt_print", NT_EINVAL, "t NULL"},
        {"nt_print", NT_ERELEASED, "t released"}, {"nt_format", NT_EINVAL, "t NULL"},
        {"nt_format", NT_ERELEASED, "t released"},
    };
    for (int k = 0; k < 13; k++)
        add(SY[k].fn, SY[k].code, NULL, run_sync, k, "%s: %s", SY[k].fn, SY[k].name);
    static const char *const MT[] = {
        "nt_ndim(NULL)", "nt_ndim(released)", "nt_shape(NULL)", "nt_shape(released)",
        "nt_shape(dim 2)", "nt_shape(dim -3)", "nt_shape(INT32_MIN)", "nt_numel(NULL)",
        "nt_numel(released)", "nt_dtype_of(NULL)", "nt_dtype_of(released)", "nt_stride(NULL)",
        "nt_stride(dim 5)", "nt_stride(released)", "nt_is_contiguous(NULL)",
        "nt_is_contiguous(released)", "nt_dtype_name(99)", "nt_dtype_name(-1)",
        "nt_dtype_size(99)", "nt_dtype_size(-1)", "nt_strerror(12345)", "nt_strerror(INT32_MIN)",
        "nt_engine_name(99)", "nt_engine_name(DEFAULT)", "nt_alu_op_name(99)",
        "nt_act_func_name(-5)", "nt_mem_name(7)", "nt_requires_grad(NULL)",
        "nt_requires_grad(released)", "nt_config_get(NULL)", "nt_config_get(unknown)",
        "nt_tile_dtype(NULL)", "nt_tile_partitions(NULL)", "nt_tile_size(NULL)",
        "nt_tile_free_bytes(NULL)", "nt_sim_kernel_message(NULL)", "nt_tile_ap(NULL)",
        "nt_tile_free_bytes(NULL, HBM)", "nt_autocast_dtype() outside a region",
        "nt_grad_enabled() outside a no-grad region", "nt_no_grad_end() unmatched",
        "nt_no_grad_begin() nested", "nt_stream_set_current(NULL): the default",
        "nt_get_mode()", "nt_sim_init() again", "nt_sim_set_functional/nt_stats_reset twice",
    };
    for (int k = 0; k < (int)(sizeof MT / sizeof MT[0]); k++)
        add(NULL, SENTINEL, NULL, run_meta, k, "sentinel: %s", MT[k]);
    static const struct { const char *fn; int code; const char *name; } ME[] = {
        {"nt_grad_scaler_get_scale", NT_EINVAL, "s NULL"}, {"nt_optim_get_lr", NT_EINVAL, "opt NULL"},
        {"nt_optim_steps", NT_EINVAL, "opt NULL"},         {"nt_grad", NT_EINVAL, "t NULL"},
        {"nt_grad", NT_ERELEASED, "t released"},         {"nt_event_query", NT_EINVAL, "e NULL"},
        {"nt_grad_scaler_skipped_steps", NT_EINVAL, "s NULL"},
        {"nt_grad_scaler_growth_tracker", NT_EINVAL, "s NULL"},
    };
    for (int k = 0; k < 8; k++)
        add(ME[k].fn, ME[k].code, NULL, run_meta_err, k, "%s: %s", ME[k].fn, ME[k].name);
    static const struct { const char *fn; int code; const char *name; } LF[] = {
        {"nt_retain", NT_EINVAL, "NULL"},            {"nt_retain", NT_ERELEASED, "released"},
        {"nt_release", NT_ERELEASED, "released again"}, {"nt_keep", NT_EINVAL, "NULL"},
        {"nt_keep", NT_ERELEASED, "released"},       {"nt_scope_end", NT_EINVAL, "NULL"},
        {"nt_scope_end", NT_ESTATE, "ended twice"},  {"nt_set_requires_grad", NT_EINVAL, "NULL"},
        {"nt_set_requires_grad", NT_ERELEASED, "released"},
        {"nt_set_requires_grad", NT_EDTYPE, "i32"},  {"nt_set_requires_grad", NT_EDTYPE, "u8"},
        {"nt_backward", NT_EINVAL, "NULL"},          {"nt_backward", NT_ERELEASED, "released"},
        {"nt_backward", NT_ESHAPE, "6 elements"},    {"nt_backward", NT_ESTATE, "no grad"},
        {"nt_backward", NT_EINVAL, "ex: NULL"},      {"nt_backward", NT_ERELEASED, "ex: released"},
        {"nt_backward", NT_ESHAPE, "ex: 6 elements"}, {"nt_zero_grad", NT_EINVAL, "NULL"},
        {"nt_zero_grad", NT_ERELEASED, "released"},  {"nt_set_requires_grad", NT_ESTATE, "not a leaf"},
    };
    for (int k = 0; k < (int)(sizeof LF / sizeof LF[0]); k++)
        add(LF[k].fn, LF[k].code, NULL, run_life, k, "%s: %s", LF[k].fn, LF[k].name);
    static const struct { const char *fn; int code; const char *name; } CU[] = {
        {"nt_op_register", NT_EINVAL, "def NULL"},   {"nt_op_register", NT_EINVAL, "name NULL"},
        {"nt_op_register", NT_EINVAL, "name empty"}, {"nt_op_register", NT_EINVAL, "forward NULL"},
        {"nt_op_register", NT_EINVAL, "nin 0"},      {"nt_op_register", NT_EINVAL, "nin 5"},
        {"nt_op_register", NT_EINVAL, "nin -1"},     {"nt_op_register", NT_EINVAL, "duplicate name"},
        {"nt_op_register_kernel", NT_EINVAL, "def NULL"},
        {"nt_op_register_kernel", NT_EINVAL, "name NULL"},
        {"nt_op_register_kernel", NT_EINVAL, "shape NULL"},
        {"nt_op_register_kernel", NT_EINVAL, "kernel NULL"},
        {"nt_op_register_kernel", NT_EINVAL, "nin 0"},
        {"nt_op_register_kernel", NT_EINVAL, "nin 9"},
        {"nt_op_register_kernel", NT_EINVAL, "duplicate name"},
        {"nt_op_call", NT_EINVAL, "op -1"},          {"nt_op_call", NT_EINVAL, "op 2^20"},
        {"nt_op_call", NT_EINVAL, "in NULL"},        {"badinput_neg", NT_EINVAL, "in[0] NULL"},
        {"badinput_neg", NT_ERELEASED, "in[0] released"},
        {"nt_op_call", NT_EINVAL, "kernel op, in NULL"},
        {"badinput_kernel", NT_ERELEASED, "kernel op, in[0] released"},
        {"nt_op_call", NT_EINVAL, "op INT32_MIN"},
        {"nt_op_call(badshape0)", NT_EINVAL, "shape rule: 9 dims"},
        {"nt_op_call(badshape1)", NT_EINVAL, "shape rule: -1 dims"},
        {"nt_op_call(badshape2)", NT_EINVAL, "shape rule: size -4"},
        {"nt_op_call(badshape3)", NT_ESHAPE, "shape rule: 2^60 x 2^60"},
        {"nt_op_call(badshape4)", NT_EINVAL, "shape rule: dtype 42"},
        {"nt_op_call(badshape5)", NT_ESHAPE, "shape rule: refuses"},
        {"nt_op_call(badshape6)", NT_EINVAL, "shape rule: returns 7"},
        {"nt_op_call(badshape7)", NT_EINVAL, "shape rule: returns -12345"},
        {"nt_op_call(badshape8)", NT_ESHAPE, "shape rule: 2^32 x 2^32"},
    };
    for (int k = 0; k < (int)(sizeof CU / sizeof CU[0]); k++)
        add(CU[k].fn, CU[k].code, NULL, run_custom, k, "%s: %s", CU[k].fn, CU[k].name);
    static const char *const GC[] = {"f NULL", "in NULL", "n 0", "n 17", "eps 0", "eps NaN",
                                     "in[0] released", "in[0] without grad", "in[0] NULL", "n -1"};
    for (int k = 0; k < 10; k++)
        add("nt_gradcheck", k == 6 ? NT_ERELEASED : NT_EINVAL, NULL, run_gradcheck, k,
            "nt_gradcheck: %s", GC[k]);
    static const struct { int code; const char *want, *name; } CK[] = {
        {NT_EINVAL, "'fn'", "fn NULL"},           {NT_EINVAL, "'n_in'", "n_in -1"},
        {NT_EINVAL, "'n_in'", "n_in too big"},    {NT_EINVAL, "'n_out'", "n_out 0"},
        {NT_EINVAL, "'n_out'", "n_out too big"},  {NT_EINVAL, "'outputs'", "outputs NULL"},
        {NT_EINVAL, "'inputs'", "inputs NULL"},   {NT_EINVAL, "'inputs[1]'", "inputs[1] NULL"},
        {NT_ERELEASED, "'inputs[0]'", "inputs[0] released"},
        {NT_EINVAL, "returned 5", "the block fails without an error"},
    };
    for (int k = 0; k < (int)(sizeof CK / sizeof CK[0]); k++)
        add("nt_checkpoint", CK[k].code, CK[k].want, run_ckpt, k, "nt_checkpoint: %s",
            CK[k].name);
    static const struct { const char *fn; int code; const char *name; } ST[] = {
        {"nt_stream_destroy", NT_EINVAL, "NULL"},      {"nt_stream_destroy", NT_EINVAL, "default"},
        {"nt_stream_synchronize", NT_EINVAL, "NULL"},  {"nt_event_record", NT_EINVAL, "e NULL"},
        {"nt_event_record", NT_EINVAL, "e NULL, s given"},
        {"nt_stream_wait_event", NT_EINVAL, "e NULL"}, {"nt_stream_wait_event", NT_EINVAL, "both NULL"},
        {"nt_event_synchronize", NT_EINVAL, "NULL"},   {"nt_stats_get", NT_EINVAL, "NULL"},
        {"nt_sim_stats_get", NT_EINVAL, "NULL"},       {"nt_sim_config_get", NT_EINVAL, "NULL"},
        {"nt_sim_set_target", NT_EINVAL, "7"},         {"nt_sim_set_target", NT_EINVAL, "-1"},
    };
    for (int k = 0; k < 13; k++)
        add(ST[k].fn, ST[k].code, NULL, run_stream, k, "%s: %s", ST[k].fn, ST[k].name);
    static const struct { const char *fn; int code; const char *name; } AM[] = {
        {"nt_autocast_begin", NT_EDTYPE, "f32"},   {"nt_autocast_begin", NT_EDTYPE, "i32"},
        {"nt_autocast_begin", NT_EDTYPE, "99"},    {"nt_autocast_begin", NT_EDTYPE, "-1"},
        {"nt_autocast_end", NT_ESTATE, "none open"}, {"nt_autocast_begin", NT_ESTATE, "65 deep"},
        {"nt_grad_scaler_create", NT_EINVAL, "init_scale 0"},
        {"nt_grad_scaler_create", NT_EINVAL, "init_scale -1"},
        {"nt_grad_scaler_create", NT_EINVAL, "init_scale NaN"},
        {"nt_grad_scaler_create", NT_EINVAL, "init_scale inf"},
        {"nt_grad_scaler_create", NT_EINVAL, "growth_factor 1"},
        {"nt_grad_scaler_create", NT_EINVAL, "growth_factor NaN"},
        {"nt_grad_scaler_create", NT_EINVAL, "backoff_factor 1"},
        {"nt_grad_scaler_create", NT_EINVAL, "backoff_factor 0"},
        {"nt_grad_scaler_create", NT_EINVAL, "backoff_factor NaN"},
        {"nt_grad_scaler_create", NT_EINVAL, "growth_interval 0"},
        {"nt_grad_scaler_create", NT_EINVAL, "growth_interval INT64_MIN"},
        {"nt_grad_scaler_scale", NT_EINVAL, "s NULL"},
        {"nt_grad_scaler_scale", NT_EINVAL, "loss NULL"},
        {"nt_grad_scaler_scale", NT_ERELEASED, "loss released"},
        {"nt_grad_scaler_unscale", NT_EINVAL, "s NULL"},
        {"nt_grad_scaler_unscale", NT_EINVAL, "opt NULL"},
        {"nt_grad_scaler_step", NT_EINVAL, "s NULL"},
        {"nt_grad_scaler_step", NT_EINVAL, "opt NULL"},
        {"nt_grad_scaler_update", NT_EINVAL, "s NULL"},
        {"nt_grad_scaler_update", NT_ESTATE, "no step since the last update"},
        {"nt_grad_scaler_skipped_steps", NT_EINVAL, "s NULL"},
        {"nt_grad_scaler_growth_tracker", NT_EINVAL, "s NULL"},
    };
    for (int k = 0; k < (int)(sizeof AM / sizeof AM[0]); k++)
        add(AM[k].fn, AM[k].code, NULL, run_amp, k, "%s: %s", AM[k].fn, AM[k].name);
    static const struct { const char *fn; int code; const char *w, *name; } OP[] = {
        {"nt_optim_sgd", NT_EINVAL, "params", "params NULL"},
        {"nt_optim_sgd", NT_EINVAL, NULL, "n 0"},
        {"nt_optim_sgd", NT_EINVAL, NULL, "n -3"},
        {"nt_optim_sgd", NT_EINVAL, "params[0]", "params[0] NULL"},
        {"nt_optim_sgd", NT_ERELEASED, "params[0]", "params[0] released"},
        {"nt_optim_sgd", NT_EDTYPE, NULL, "i32 parameter"},
        {"nt_optim_sgd", NT_EINVAL, "lr", "lr -0.1"},
        {"nt_optim_sgd", NT_EINVAL, "lr", "lr NaN"},
        {"nt_optim_sgd", NT_EINVAL, "lr", "lr inf"},
        {"nt_optim_sgd", NT_EINVAL, "momentum", "momentum -0.9"},
        {"nt_optim_sgd", NT_EINVAL, "weight_decay", "weight_decay -1"},
        {"nt_optim_sgd", NT_EINVAL, "weight_decay", "weight_decay NaN"},
        {"nt_optim_sgd", NT_EINVAL, "nesterov", "nesterov without momentum"},
        {"nt_optim_sgd", NT_EINVAL, NULL, "the same parameter twice"},
        {"nt_optim_sgd", NT_EINVAL, NULL, "an expanded view"},
        {"nt_optim_adamw", NT_EINVAL, "params", "params NULL"},
        {"nt_optim_adamw", NT_EINVAL, NULL, "n 0"},
        {"nt_optim_adamw", NT_ERELEASED, "params[0]", "params[0] released"},
        {"nt_optim_adamw", NT_EDTYPE, NULL, "i32 parameter"},
        {"nt_optim_adamw", NT_EINVAL, "lr", "lr -1e-3"},
        {"nt_optim_adamw", NT_EINVAL, "betas", "beta1 1.0"},
        {"nt_optim_adamw", NT_EINVAL, "betas", "beta1 -0.1"},
        {"nt_optim_adamw", NT_EINVAL, "betas", "beta2 1.5"},
        {"nt_optim_adamw", NT_EINVAL, "betas", "beta2 NaN"},
        {"nt_optim_adamw", NT_EINVAL, "eps", "eps -1"},
        {"nt_optim_adamw", NT_EINVAL, "eps", "eps NaN"},
        {"nt_optim_adamw", NT_EINVAL, "weight_decay", "weight_decay -0.01"},
        {"nt_optim_adamw", NT_EINVAL, NULL, "the same parameter twice"},
        {"nt_optim_step", NT_EINVAL, NULL, "NULL"},
        {"nt_sgd_step", NT_EINVAL, NULL, "NULL"},
        {"nt_optim_zero_grad", NT_EINVAL, NULL, "NULL"},
        {"nt_optim_set_lr", NT_EINVAL, NULL, "opt NULL"},
        {"nt_optim_set_lr", NT_EINVAL, "lr", "lr -1"},
        {"nt_optim_set_lr", NT_EINVAL, "lr", "lr NaN"},
        {"nt_optim_set_lr", NT_EINVAL, "lr", "lr inf"},
        {"nt_optim_set_master_weights", NT_EINVAL, NULL, "NULL"},
        {"nt_optim_step", NT_EINVAL, NULL, "_at, NULL site and opt"},
        {"nt_sgd_step", NT_EINVAL, NULL, "_at, NULL site and opt"},
    };
    for (int k = 0; k < (int)(sizeof OP / sizeof OP[0]); k++)
        add(OP[k].fn, OP[k].code, OP[k].w, run_optim, k, "%s: %s", OP[k].fn, OP[k].name);
    static const struct { const char *fn; int code; const char *w, *name; } SV[] = {
        {"nt_save", NT_EINVAL, "path", "path NULL"},
        {"nt_save", NT_EINVAL, "path", "path empty"},
        {"nt_save", NT_EINVAL, "params", "params NULL"},
        {"nt_save", NT_EINVAL, NULL, "n 0"},
        {"nt_save", NT_ERELEASED, "params[0]", "params[0] released"},
        {"nt_save", NT_EINVAL, "params[0]", "params[0] NULL"},
        {"nt_save", NT_EIO, "nonexistent-dir", "directory missing"},
        {"nt_checkpoint_save", NT_EINVAL, "path", "path NULL"},
        {"nt_checkpoint_save", NT_ERELEASED, "params[0]", "params[0] released"},
        {"nt_checkpoint_save", NT_EINVAL, NULL, "n -1"},
        {"nt_load", NT_EINVAL, "path", "path NULL"},
        {"nt_load", NT_EINVAL, "path", "path empty"},
        {"nt_load", NT_EIO, "missing.ntck", "file missing"},
        {"nt_load", NT_EINVAL, "params", "params NULL"},
        {"nt_load", NT_EINVAL, NULL, "n 0"},
        {"nt_load", NT_ERELEASED, "params[0]", "params[0] released"},
        {"nt_load", NT_ESHAPE, "parameter 0", "another shape"},
        {"nt_load", NT_ESHAPE, "parameters", "another count"},
        {"nt_load", NT_EINVAL, "AdamW", "an SGD optimizer for AdamW state"},
        {"nt_checkpoint_load", NT_ESHAPE, "parameter 0", "another shape"},
        {"nt_load", NT_EIO, NULL, "a directory"},
        {"nt_checkpoint_load", NT_EINVAL, "path", "path NULL"},
    };
    for (int k = 0; k < (int)(sizeof SV / sizeof SV[0]); k++)
        add(SV[k].fn, SV[k].code, SV[k].w, run_save, k, "%s: %s", SV[k].fn, SV[k].name);
    for (int k = 0; k < NEDITS; k++)
        add("nt_checkpoint_load", NT_EFORMAT, EDITS[k].want, run_edit, k,
            "nt_checkpoint_load: file with %s", EDITS[k].what);
    for (int k = 0; k < NTEDITS; k++)
        add("nt_checkpoint_load", NT_EFORMAT, TEDITS[k].want, run_tedit, k,
            "nt_checkpoint_load: table entry %s", TEDITS[k].what);
    for (int k = 0; k < NEDITS && EDITS[k].kind == 2; k++) /* the optimizer-record edits */
        add("nt_load", NT_EFORMAT, EDITS[k].want, run_edit_noopt, k,
            "nt_load without opt: file with %s", EDITS[k].what);
    for (int k = 0; k < NCFG + 2; k++)
        add("nt_config_set", NT_EINVAL,
            k < NCFG && *CFG[k].name && strncmp(CFG[k].name, "nt_", 3) ? CFG[k].name : NULL,
            run_cfg, k, "nt_config_set: %s = '%s'", k < NCFG ? CFG[k].name : "(NULL)",
            k < NCFG ? CFG[k].value : k == NCFG ? "1" : "(NULL)");
    for (int k = 0; k < NSIMNULL; k++)
        add(SIM_NULL_FN[k], NT_EINVAL, "NULL", run_sim_null, k, "%s: kernel NULL",
            SIM_NULL_FN[k]);
    for (int i = 0; i < NINSTR; i++)
        for (int k = 0; k < D_NV; k++)
            if (!(i == 15 && k == D_NULL)) /* gpsimd_custom: a NULL dst is a pure check */
            add(INSTR[i], KERNEL, k == D_HUGE || k == D_STEP || k == D_NUMPROD ||
                k == D_OFFNEG ? "2^48" : NULL, run_sim_bad, i * D_NV + k,
                "nt_isa_%s: %s with %s", INSTR[i], i == 10 ? "src" : "dst", DNAME[k]);
    static const int MISC_CODE[] = {
        NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM,
        NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESTATE, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM,
        NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM, NT_ESIM,
    };
    static const char *const MISC_NAME[] = {
        "tile in HBM", "memory 9", "dtype 9", "0 partitions", "129 partitions", "free size 0",
        "free size -5", "2^62 f32 per partition (bytes wrap to 0)", "2^62 + 16 f32",
        "INT64_MAX u8", "PSUM 513 f32 (over a bank)", "PSUM 2^61 f32", "SBUF 4 MiB per partition",
        "release twice", "last with nothing issued", "args NULL", "M -1",
        "HBM partition step INT64_MAX/2", "PSUM access across banks", "GpSimd on PSUM",
        "a released tile", "K 129", "DMA queue 99", "gpsimd_custom nsrc 9",
        "nt_tile_matmul M INT64_MAX", "nt_tile_matmul lda INT64_MAX",
        "nt_hbm_ap with 2^32 + 2 rows",
    };
    for (int k = 0; k < NSIMMISC; k++)
        add(*SIM_MISC_WANT[k] ? SIM_MISC_WANT[k] : "nt_sim_kernel_last",
            MISC_CODE[k] == NT_ESTATE ? NT_ESTATE : KERNEL, NULL, run_sim_misc, k,
            "simulator: %s", MISC_NAME[k]);
    for (int k = 0; k < NTR; k++)
        add(TR[k].fn, TR[k].code, TR[k].want, run_trainops, k, "%s: %s", TR[k].fn, TR[k].name);
}


/* ------------------------------------------------------------------ */
/* Runner                                                             */
/* ------------------------------------------------------------------ */

static void run_case(void **state)
{
    const bcase *c = *state;
    nt_clear_error();
    assert_int_equal(nt_sync(), 0);
    nt_stats s0, s1;
    assert_int_equal(nt_stats_get(&s0), 0);
    nt_clear_error();
    sim_msg[0] = '\0';
    int got = c->run(c->v);
    int err = nt_last_error();
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", nt_last_error_message());
    if (c->code == SENTINEL) {
        if (got != 0)
            fail_msg("%s: the documented sentinel did not come back", c->name);
        if (err != 0)
            fail_msg("%s: set an error (%d: %s) where the contract has none", c->name, err, msg);
    } else if (c->code == KERNEL) {
        /* a broken simulator rule: the kernel holds the message */
        if (got != NT_ESIM)
            fail_msg("%s: returned %d, expected NT_ESIM", c->name, got);
        if (!strstr(sim_msg, c->fn))
            fail_msg("%s: kernel message '%s' does not name '%s'", c->name, sim_msg, c->fn);
        if (c->want && !strstr(sim_msg, c->want))
            fail_msg("%s: kernel message '%s' does not say '%s'", c->name, sim_msg, c->want);
    } else {
        if (got != c->code || err != c->code)
            fail_msg("%s: returned %d with error %d (%s), expected %d (%s)", c->name, got, err,
                     msg, c->code, nt_strerror(c->code));
        if (!strstr(msg, c->fn))
            fail_msg("%s: message '%s' does not name '%s'", c->name, msg, c->fn);
        if (c->want && !strstr(msg, c->want))
            fail_msg("%s: message '%s' does not say '%s'", c->name, msg, c->want);
    }
    /* nothing queued, nothing leaked */
    nt_clear_error();
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_stats_get(&s1), 0);
    if (s1.device_bytes_in_use != s0.device_bytes_in_use)
        fail_msg("%s: device bytes in use went from %llu to %llu", c->name,
                 (unsigned long long)s0.device_bytes_in_use,
                 (unsigned long long)s1.device_bytes_in_use);
    nt_clear_error();
}

static int group_setup(void **state)
{
    (void)state;
    setenv("NT_HANDLE_QUARANTINE", "all", 1);
    if (nt_init() != 0 || nt_test_dir_make("badinput") != 0)
        return -1;
    fixture_make();
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    fixture_free();
    nt_shutdown();
    unsetenv("NT_HANDLE_QUARANTINE");
    return nt_test_dir_remove();
}

/* Bad environment values make nt_init fail naming the variable, and leave the
 * runtime uninitialised (a later good environment initialises it). */
static void test_bad_environment(void **state)
{
    (void)state;
    static const struct { const char *name, *value; } E[] = {
        {"NT_HBM_BYTES", "17179869185G"}, {"NT_HBM_BYTES", "0"},
        {"NT_HBM_BYTES", "2000000G"},     {"NT_HBM_BYTES", "-1"},
        {"NT_MIN_SIM_FLOPS", "-1"},       {"NT_SR_SEED", "-5"},
        {"NT_SR_SEED", "99999999999999999999"}, {"NT_MODE", "bogus"},
        {"NT_LAZY_WINDOW", "0"},          {"NT_HANDLE_QUARANTINE", "1"},
        {"NT_MAX_INFLIGHT", "1K1"},       {"NT_BACKEND", "tpu"},
        {"NT_SIM_TARGET", "trn3"},        {"NT_SIM_FUNCTIONAL", "yes"},
        {"NT_SIM_THREADS", "0"},          {"NT_SIM_THREADS", "-2"},
        {"NT_SIM_DEFER", "01"},
        {"NT_SIM_PROGRAM_GEMM", "-1"},   {"NT_SIM_PROGRAM_VALUES", "on"},
    };
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        nt_clear_error();
        setenv(E[i].name, E[i].value, 1);
        int rc = nt_init();
        unsetenv(E[i].name);
        if (rc != NT_EINVAL || nt_last_error() != NT_EINVAL)
            fail_msg("%s=%s: nt_init returned %d (error %d)", E[i].name, E[i].value, rc,
                     nt_last_error());
        if (!strstr(nt_last_error_message(), "nt_init") ||
            !strstr(nt_last_error_message(), E[i].name))
            fail_msg("%s=%s: message '%s'", E[i].name, E[i].value, nt_last_error_message());
        assert_int_equal(nt_init(), 0);
        nt_shutdown();
    }
    /* the largest accepted sizes */
    setenv("NT_HBM_BYTES", "1048576G", 1);
    assert_int_equal(nt_init(), 0);
    assert_string_equal(nt_config_get("NT_HBM_BYTES"), "1125899906842624");
    nt_shutdown();
    unsetenv("NT_HBM_BYTES");
    setenv("NT_SR_SEED", "18446744073709551615", 1);
    assert_int_equal(nt_init(), 0);
    assert_string_equal(nt_config_get("NT_SR_SEED"), "18446744073709551615");
    nt_shutdown();
    unsetenv("NT_SR_SEED");
}

/* Values that are at the edge but valid give the right shapes, not
 * overflowed ones. */
static void test_edge_shapes_are_right(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_tensor *t = nt_zeros(NT_F32, 2, SH(3, 4));
    /* step INT64_MAX: one element, not [2, -1] */
    nt_tensor *s = nt_slice(t, 1, 0, 4, INT64_MAX);
    assert_non_null(s);
    assert_int_equal(nt_shape(s, 0), 3);
    assert_int_equal(nt_shape(s, 1), 1);
    nt_tensor *s2 = nt_slice(t, 1, INT64_MIN, INT64_MAX, INT64_MAX - 1);
    assert_non_null(s2);
    assert_int_equal(nt_shape(s2, 1), 1);
    nt_tensor *s3 = nt_slice(t, 1, 3, 1, 2); /* empty */
    assert_int_equal(nt_shape(s3, 1), 0);
    nt_tensor *s4 = nt_slice(t, 1, 1, 4, 2);
    assert_int_equal(nt_shape(s4, 1), 2);
    float v[3];
    assert_int_equal(nt_to_host(nt_contiguous(s), v, sizeof v), 0);
    /* a 2^48-element view is allowed; only its materialisation is refused
     * (capacity), cleanly */
    nt_tensor *one = nt_ones(NT_F32, 2, SH(1, 1));
    nt_tensor *e = nt_expand(one, 2, SH((int64_t)1 << 24, (int64_t)1 << 24));
    assert_non_null(e);
    assert_int_equal(nt_numel(e), (int64_t)1 << 48);
    nt_clear_error();
    assert_null(nt_add(e, e));
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    assert_non_null(strstr(nt_last_error_message(), "nt_add"));
    nt_clear_error();
    /* a 0-element tensor with a big other dim is fine within the bound */
    nt_tensor *z = nt_zeros(NT_F32, 2, SH(0, (int64_t)1 << 40));
    assert_non_null(z);
    assert_int_equal(nt_numel(z), 0);
    /* empty tensors are contiguous whatever their strides: reshape of one
     * (found by fuzz_api: it recursed until the stack overflowed) */
    nt_tensor *e3 = nt_zeros(NT_F32, 3, SH(2, 0, 3));
    assert_true(nt_is_contiguous(e3));
    nt_tensor *tr = nt_transpose(e3, 0, 2);
    assert_true(nt_is_contiguous(tr));
    nt_tensor *r0 = nt_reshape(tr, 2, SH(0, 7));
    assert_non_null(r0);
    assert_int_equal(nt_shape(r0, 1), 7);
    assert_non_null(nt_reshape(nt_slice(e3, 2, 0, 3, 2), 1, SH(-1)));
    assert_non_null(nt_contiguous(tr));
    assert_int_equal(nt_sync(), 0);
    nt_shutdown();
}

/* A released handle is detected however many tensors were made since, with
 * NT_HANDLE_QUARANTINE=all; with the default, within the quarantine. */
static void test_released_handle_detection(void **state)
{
    (void)state;
    setenv("NT_HANDLE_QUARANTINE", "all", 1);
    assert_int_equal(nt_init(), 0);
    assert_string_equal(nt_config_get("NT_HANDLE_QUARANTINE"), "all");
    nt_tensor *t = nt_zeros(NT_F32, 1, SH(4));
    assert_int_equal(nt_release(t), 0);
    for (int i = 0; i < 20000; i++) /* well past the default quarantine */
        nt_release(nt_zeros(NT_F32, 1, SH(1)));
    nt_clear_error();
    assert_int_equal(nt_release(t), NT_ERELEASED);
    assert_null(nt_neg(t));
    assert_int_equal(nt_last_error(), NT_ERELEASED);
    assert_int_equal(nt_ndim(t), -1);
    nt_shutdown();
    unsetenv("NT_HANDLE_QUARANTINE");
    assert_int_equal(nt_init(), 0);
    assert_string_equal(nt_config_get("NT_HANDLE_QUARANTINE"), "4096");
    t = nt_zeros(NT_F32, 1, SH(4));
    assert_int_equal(nt_release(t), 0);
    for (int i = 0; i < 4000; i++)
        nt_release(nt_zeros(NT_F32, 1, SH(1)));
    nt_clear_error();
    assert_int_equal(nt_release(t), NT_ERELEASED);
    assert_int_equal(nt_config_set("NT_HANDLE_QUARANTINE", "100000"), 0);
    assert_string_equal(nt_config_get("NT_HANDLE_QUARANTINE"), "100000");
    nt_shutdown();
}

static nt_tensor *stale_op_fwd(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_neg(in[0]);
}

static nt_tensor *stale_op_fwd2(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_add_scalar(in[0], 1);
}

/* The optimizer, loss scaler, communicator, nt_ddp, graph and user op id
 * kept across nt_shutdown: after nt_init each use is NT_ESTATE naming the
 * function and the argument, each destroy frees it quietly, and a second
 * destroy is an error naming it -- never a read of freed memory (the ASan
 * run of this test would stop at one), nor another op of the same index. */
static void test_stale_objects_after_reinit(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_tensor *p = nt_ones(NT_F32, 1, SH(4));
    nt_set_requires_grad(p, true);
    nt_optim *opt = nt_optim_adamw(&p, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    nt_grad_scaler *sc = nt_grad_scaler_create(NULL);
    nt_comm *comm = nt_comm_create((const int[]){0}, 1);
    nt_ddp *d = nt_ddp_create(&p, 1, 1, (const int[]){0}, 1);
    nt_tensor *gx = nt_ones(NT_F32, 1, SH(4));
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *gy = nt_mul_scalar(gx, 3);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    (void)gy;
    int op = nt_op_register(&(nt_op_def){"stale_neg", 1, stale_op_fwd, NULL, NULL});
    assert_true(op >= 0);
    assert_non_null(opt);
    assert_non_null(sc);
    assert_non_null(comm);
    assert_non_null(d);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    /* the new runtime registers an op at the same index */
    int op2 = nt_op_register(&(nt_op_def){"stale_inc", 1, stale_op_fwd2, NULL, NULL});
    assert_true(op2 >= 0 && op2 != op);
    struct { int rc; const char *fn, *arg; } R[9];
    int n = 0;
    nt_clear_error();
#define CALL(expr, fname, argname)                                                            \
    do {                                                                                      \
        nt_clear_error();                                                                     \
        (void)(expr);                                                                         \
        R[n].rc = nt_last_error();                                                            \
        R[n].fn = fname;                                                                      \
        R[n].arg = argname;                                                                   \
        if (R[n].rc != NT_ESTATE || !strstr(nt_last_error_message(), fname) ||                \
            !strstr(nt_last_error_message(), argname) ||                                      \
            !strstr(nt_last_error_message(), "nt_shutdown"))                                  \
            fail_msg("%s: error %d, '%s'", fname, R[n].rc, nt_last_error_message());          \
        n++;                                                                                  \
    } while (0)
    CALL(nt_optim_step(opt), "nt_optim_step", "argument 'opt'");
    CALL(nt_optim_set_lr(opt, 0.1), "nt_optim_set_lr", "argument 'opt'");
    CALL(nt_grad_scaler_get_scale(sc), "nt_grad_scaler_get_scale", "argument 'scaler'");
    CALL(nt_ddp_reduce(d), "nt_ddp_reduce", "argument 'd'");
    nt_tensor *in[1] = {nt_ones(NT_F32, 1, SH(2))}, *out[1];
    CALL(nt_all_reduce(comm, in, out, NT_REDUCE_SUM), "nt_all_reduce", "'c'");
    CALL(nt_graph_replay(g), "nt_graph_replay", "argument 'g'");
    CALL(nt_op_call(op, in), "nt_op_call", "argument 'op'");
#undef CALL
    assert_true(isnan(nt_grad_scaler_get_scale(sc)));
    nt_clear_error();
    nt_tensor *inc = nt_op_call(op2, in); /* the new op is the new runtime's */
    float iv[2];
    assert_int_equal(nt_to_host(inc, iv, sizeof iv), 0);
    assert_true(iv[0] == 2.0f && iv[1] == 2.0f);
    nt_release(inc);
    nt_release(in[0]);
    /* freed by their destroy, quietly */
    nt_ddp_destroy(d);
    nt_optim_destroy(opt);
    nt_grad_scaler_destroy(sc);
    nt_comm_destroy(comm);
    nt_graph_destroy(g);
    assert_int_equal(nt_last_error(), 0);
    /* a second destroy is an error naming the function, not a crash */
    static const char *fns[] = {"nt_ddp_destroy", "nt_optim_destroy", "nt_grad_scaler_destroy",
                                "nt_comm_destroy", "nt_graph_destroy"};
    for (int i = 0; i < 5; i++) {
        nt_clear_error();
        if (i == 0)
            nt_ddp_destroy(d);
        else if (i == 1)
            nt_optim_destroy(opt);
        else if (i == 2)
            nt_grad_scaler_destroy(sc);
        else if (i == 3)
            nt_comm_destroy(comm);
        else
            nt_graph_destroy(g);
        if (nt_last_error() != NT_EINVAL || !strstr(nt_last_error_message(), fns[i]) ||
            !strstr(nt_last_error_message(), "already destroyed"))
            fail_msg("%s twice: error %d, '%s'", fns[i], nt_last_error(),
                     nt_last_error_message());
    }
    nt_clear_error();
    /* and the new runtime makes and uses them as usual */
    nt_tensor *q = nt_ones(NT_F32, 1, SH(4));
    nt_set_requires_grad(q, true);
    nt_optim *o2 = nt_optim_sgd(&q, 1, 0.5, 0, 0, false);
    assert_non_null(o2);
    assert_int_equal(nt_backward(nt_sum(q, NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_optim_step(o2), 0);
    float v[4];
    assert_int_equal(nt_to_host(q, v, sizeof v), 0);
    assert_true(v[0] == 0.5f && v[3] == 0.5f);
    nt_optim_destroy(o2);
    nt_release(q);
    nt_shutdown();
}

static int table_setup(void **state)
{
    (void)state;
    return group_setup(NULL);
}

static int table_teardown(void **state)
{
    (void)state;
    return group_teardown(NULL);
}

int main(void)
{
    build();
    /* One group (one TAP plan): the three tests that start and stop the
     * runtime themselves first, then the table, whose first case sets the
     * fixture up and whose last tears it down. */
    const struct CMUnitTest edges[] = {
        cmocka_unit_test(test_bad_environment),
        cmocka_unit_test(test_edge_shapes_are_right),
        cmocka_unit_test(test_released_handle_detection),
        cmocka_unit_test(test_stale_objects_after_reinit),
    };
    size_t ne = sizeof edges / sizeof edges[0], n = ne + (size_t)ncases;
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    memcpy(tests, edges, sizeof edges);
    for (int i = 0; i < ncases; i++) {
        struct CMUnitTest *t = &tests[ne + (size_t)i];
        t->name = cases[i].name;
        t->test_func = run_case;
        t->initial_state = &cases[i];
    }
    tests[ne].setup_func = table_setup;
    tests[n - 1].teardown_func = table_teardown;
    /* the table is built at run time: cmocka's generic runner takes a count */
    int fails = _cmocka_run_group_tests("bad_inputs", tests, n, NULL, NULL);
    free(tests);
    free(cases);
    return fails;
}
