/* tests/test_checkpointing.c - gradient checkpointing (nt_checkpoint,
 * autograd/checkpoint.c): gradients bit-identical to the direct call for an
 * MLP block and a transformer block, in f32 and under bf16 autocast, in
 * every mode; parameters reached through ctx; nested checkpoints; unused
 * outputs; retain_graph; errors (bad arguments, a block that fails or
 * changes when recomputed, an input written in place); and the memory it
 * saves. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"

enum { B = 2, T = 8, C = 16, H = 2, F = 64 };

/* ---------------- the blocks ---------------- */

typedef struct mlp {
    nt_tensor *w1, *b1, *w2, *b2;
    int calls;
    int fail_on; /* > 0: the call that fails (counts forward and recomputes) */
    int grow_on; /* > 0: the call that returns another shape */
    int drift_on; /* > 0: the call that returns other values of the same shape */
} mlp;

/* relu(x w1^T + b1) w2^T + b2, plus x (a residual: x is read twice). */
static int mlp_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    mlp *m = ctx;
    (void)n_in;
    m->calls++;
    if (m->fail_on == m->calls) {
        out[0] = nt_matmul(in[0], in[0]); /* [.., C] x [.., C]: a shape error */
        return out[0] ? 0 : nt_last_error();
    }
    nt_tensor *h = nt_relu(nt_linear(in[0], m->w1, m->b1));
    nt_tensor *y = nt_add(nt_linear(h, m->w2, m->b2), in[0]);
    if (m->grow_on == m->calls)
        y = nt_cat((nt_tensor *[]){y, y}, 2, 0);
    if (m->drift_on == m->calls)
        y = nt_add_scalar(y, 0x1p-10);
    out[0] = y;
    if (n_out > 1)
        out[1] = nt_sum(h, NT_DIM_ALL, false); /* a second output */
    return y ? 0 : nt_last_error();
}

typedef struct block {
    nt_tensor *ln1w, *ln1b, *wq, *wk, *wv, *wo, *ln2w, *ln2b, *w1, *b1, *w2, *b2;
    nt_tensor *mask; /* u8 [T, T]: 1 above the diagonal (masked) */
} block;

/* A pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(.)), with
 * causal softmax attention over H heads built from the existing ops. */
static nt_tensor *block_apply(block *p, nt_tensor *x)
{
    int64_t bthd[4] = {B, T, H, C / H}, btc[3] = {B, T, C};
    int perm[4] = {0, 2, 1, 3};
    nt_tensor *h = nt_layer_norm(x, p->ln1w, p->ln1b, 1e-5);
    nt_tensor *q = nt_permute(nt_reshape(nt_linear(h, p->wq, NULL), 4, bthd), perm);
    nt_tensor *k = nt_permute(nt_reshape(nt_linear(h, p->wk, NULL), 4, bthd), perm);
    nt_tensor *v = nt_permute(nt_reshape(nt_linear(h, p->wv, NULL), 4, bthd), perm);
    nt_tensor *s = nt_mul_scalar(nt_matmul(q, nt_transpose(k, 2, 3)), 1.0 / sqrt(C / H));
    nt_tensor *a = nt_softmax(nt_masked_fill(s, p->mask, -INFINITY), -1);
    nt_tensor *o = nt_reshape(nt_permute(nt_matmul(a, v), perm), 3, btc);
    nt_tensor *x1 = nt_add(x, nt_linear(o, p->wo, NULL));
    nt_tensor *m = nt_linear(nt_gelu(nt_linear(nt_layer_norm(x1, p->ln2w, p->ln2b, 1e-5), p->w1,
                                               p->b1)), p->w2, p->b2);
    return nt_add(x1, m);
}

static int block_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)n_in, (void)n_out;
    out[0] = block_apply(ctx, in[0]);
    return out[0] ? 0 : nt_last_error();
}

/* Two blocks, each checkpointed itself: nested checkpoints. */
static int two_blocks_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    block *p = ctx;
    (void)n_in, (void)n_out;
    nt_tensor *y;
    int rc = nt_checkpoint(block_fn, &p[0], in, 1, &y, 1);
    if (!rc)
        rc = nt_checkpoint(block_fn, &p[1], &y, 1, out, 1);
    return rc;
}

static nt_tensor *param(int ndim, const int64_t *shape, uint64_t seed, double scale)
{
    nt_tensor *r = nt_randn(NT_F32, ndim, shape, seed);
    nt_tensor *t = nt_keep(nt_mul_scalar(r, scale));
    nt_release(r);
    nt_set_requires_grad(t, true);
    return t;
}

static void block_init(block *p, uint64_t seed)
{
    int64_t c[1] = {C}, cc[2] = {C, C}, fc[2] = {F, C}, cf[2] = {C, F}, f[1] = {F};
    p->ln1w = param(1, c, seed + 1, 1.0);
    p->ln1b = param(1, c, seed + 2, 0.1);
    p->wq = param(2, cc, seed + 3, 0.25);
    p->wk = param(2, cc, seed + 4, 0.25);
    p->wv = param(2, cc, seed + 5, 0.25);
    p->wo = param(2, cc, seed + 6, 0.25);
    p->ln2w = param(1, c, seed + 7, 1.0);
    p->ln2b = param(1, c, seed + 8, 0.1);
    p->w1 = param(2, fc, seed + 9, 0.25);
    p->b1 = param(1, f, seed + 10, 0.1);
    p->w2 = param(2, cf, seed + 11, 0.125);
    p->b2 = param(1, c, seed + 12, 0.1);
    nt_tensor *ones = nt_ones(NT_U8, 2, (int64_t[]){T, T});
    p->mask = nt_keep(nt_triu(ones, 1));
    nt_release(ones);
}

static nt_tensor **block_params(block *p) { return &p->ln1w; }
#define NPARAM 12

static void block_free(block *p)
{
    for (int i = 0; i < NPARAM; i++)
        nt_release(block_params(p)[i]);
    nt_release(p->mask);
}

/* ---------------- gradients of a small model, direct or checkpointed ---------------- */

enum { DIRECT, CKPT, NESTED };

/* Copies t's .grad (as f32) into out[*at..]; advances *at. */
static void take_grad(nt_tensor *t, float *out, size_t *at)
{
    nt_tensor *g = nt_grad(t);
    assert_non_null(g);
    nt_tensor *g32 = nt_cast(g, NT_F32);
    size_t n = (size_t)nt_numel(g32);
    assert_int_equal(nt_to_host(g32, out + *at, n * sizeof(float)), 0);
    *at += n;
    nt_release(g32);
    nt_release(g);
}

/* Two transformer blocks on x = 1.5 x0, loss = mean(y * r) + mean(x * x)
 * (x is also read after the blocks: its gradient sums an outside term and
 * the block's), under bf16 autocast if amp.  Writes the loss and every
 * gradient (x0's, then each block's parameters) to out; returns how many. */
static size_t gpt_grads(int how, bool amp, float *out)
{
    block p[2];
    block_init(&p[0], 100);
    block_init(&p[1], 200);
    int64_t btc[3] = {B, T, C};
    nt_tensor *x0 = param(3, btc, 7, 1.0);
    nt_tensor *r = nt_randn(NT_F32, 3, btc, 8);
    nt_scope *s = nt_scope_begin();
    if (amp)
        assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    nt_tensor *x = nt_mul_scalar(x0, 1.5), *y = NULL;
    if (how == DIRECT) {
        y = block_apply(&p[1], block_apply(&p[0], x));
    } else if (how == CKPT) {
        nt_tensor *y1;
        assert_int_equal(nt_checkpoint(block_fn, &p[0], &x, 1, &y1, 1), 0);
        assert_int_equal(nt_checkpoint(block_fn, &p[1], &y1, 1, &y, 1), 0);
    } else {
        assert_int_equal(nt_checkpoint(two_blocks_fn, p, &x, 1, &y, 1), 0);
    }
    assert_non_null(y);
    nt_tensor *loss = nt_add(nt_mean(nt_mul(nt_cast(y, NT_F32), r), NT_DIM_ALL, false),
                             nt_mean(nt_mul(x, x), NT_DIM_ALL, false));
    if (amp)
        assert_int_equal(nt_autocast_end(), 0);
    assert_int_equal(nt_backward(loss), 0);
    size_t at = 0;
    assert_int_equal(nt_to_host(loss, out, sizeof(float)), 0);
    at = 1;
    take_grad(x0, out, &at);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < NPARAM; i++)
            take_grad(block_params(&p[b])[i], out, &at);
    nt_scope_end(s);
    block_free(&p[0]);
    block_free(&p[1]);
    nt_release(x0);
    nt_release(r);
    return at;
}

#define GPT_FLOATS (1 + B * T * C + 2 * (4 * C + 4 * C * C + 2 * F * C + F + C))

static const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};

static void gpt_all_modes(bool amp)
{
    static float ref[GPT_FLOATS], got[GPT_FLOATS];
    nt_config_set("NT_MODE", "deterministic");
    assert_int_equal(gpt_grads(DIRECT, amp, ref), GPT_FLOATS);
    assert_true(isfinite(ref[0]) && ref[0] != 0.0f);
    for (int m = 0; m < 4; m++) {
        nt_config_set("NT_MODE", modes[m]);
        for (int how = DIRECT; how <= NESTED; how++) {
            memset(got, 0xff, sizeof got);
            assert_int_equal(gpt_grads(how, amp, got), GPT_FLOATS);
            if (memcmp(ref, got, sizeof ref))
                fail_msg("mode %s, %s%s: gradients differ from the direct run", modes[m],
                         how == DIRECT ? "direct" : how == CKPT ? "checkpointed" : "nested",
                         amp ? ", bf16 autocast" : "");
        }
    }
    nt_config_set("NT_MODE", "adaptive");
    assert_int_equal(nt_sync(), 0);
}

static void test_transformer_f32_every_mode(void **state)
{
    (void)state;
    gpt_all_modes(false);
}

static void test_transformer_bf16_autocast_every_mode(void **state)
{
    (void)state;
    gpt_all_modes(true);
}

/* The MLP block with its parameters passed as inputs (not through ctx):
 * both ways give the direct run's bits. */
static int mlp_explicit_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    nt_tensor *h = nt_relu(nt_linear(in[0], in[1], in[2]));
    out[0] = nt_add(nt_linear(h, in[3], in[4]), in[0]);
    return out[0] ? 0 : nt_last_error();
}

static void mlp_init(mlp *m)
{
    memset(m, 0, sizeof *m);
    m->w1 = param(2, (int64_t[]){F, C}, 31, 0.25);
    m->b1 = param(1, (int64_t[]){F}, 32, 0.1);
    m->w2 = param(2, (int64_t[]){C, F}, 33, 0.125);
    m->b2 = param(1, (int64_t[]){C}, 34, 0.1);
}

static void mlp_free(mlp *m)
{
    nt_release(m->w1), nt_release(m->b1), nt_release(m->w2), nt_release(m->b2);
}

#define MLP_FLOATS (1 + 4 * C + 2 * F * C + F + C)

/* 3 MLP blocks in a row on x0 [4, C]; how: 0 direct, 1 ckpt (params via
 * ctx), 2 ckpt (params as inputs). */
static void mlp_grads(int how, float *out)
{
    mlp m;
    mlp_init(&m);
    nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = x0;
    for (int l = 0; l < 3; l++) {
        nt_tensor *y = NULL;
        if (how == 0)
            assert_int_equal(mlp_fn(&m, &x, 1, &y, 1), 0);
        else if (how == 1)
            assert_int_equal(nt_checkpoint(mlp_fn, &m, &x, 1, &y, 1), 0);
        else
            assert_int_equal(nt_checkpoint(mlp_explicit_fn, NULL,
                                           (nt_tensor *[]){x, m.w1, m.b1, m.w2, m.b2}, 5, &y, 1),
                             0);
        x = y;
    }
    nt_tensor *loss = nt_mean(nt_mul(x, x), NT_DIM_ALL, false);
    assert_int_equal(nt_backward(loss), 0);
    assert_int_equal(nt_to_host(loss, out, sizeof(float)), 0);
    size_t at = 1;
    take_grad(x0, out, &at);
    take_grad(m.w1, out, &at), take_grad(m.b1, out, &at);
    take_grad(m.w2, out, &at), take_grad(m.b2, out, &at);
    assert_int_equal(at, MLP_FLOATS);
    nt_scope_end(s);
    nt_release(x0);
    mlp_free(&m);
}

static void test_mlp_every_mode(void **state)
{
    (void)state;
    static float ref[MLP_FLOATS], got[MLP_FLOATS];
    nt_config_set("NT_MODE", "deterministic");
    mlp_grads(0, ref);
    for (int md = 0; md < 4; md++) {
        nt_config_set("NT_MODE", modes[md]);
        for (int how = 0; how < 3; how++) {
            mlp_grads(how, got);
            if (memcmp(ref, got, sizeof ref))
                fail_msg("mode %s, way %d: MLP gradients differ from the direct run", modes[md],
                         how);
        }
    }
    nt_config_set("NT_MODE", "adaptive");
}

/* Dropout inside a checkpoint: the recompute runs in the forward's training
 * mode, so a program that switches to eval mode between its forward and
 * nt_backward (to evaluate, say) still gets the direct call's gradients --
 * the same mask, not the identity. */
static int drop_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = nt_dropout(nt_mul(in[0], in[0]), 0.3, 1234);
    return out[0] ? 0 : nt_last_error();
}

static void test_dropout_training_mode(void **state)
{
    (void)state;
    float ref[64], got[64];
    for (int way = 0; way < 2; way++) {
        nt_tensor *x = nt_rand(NT_F32, 1, (int64_t[]){64}, 5);
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        nt_tensor *y = NULL;
        if (way == 0)
            assert_int_equal(drop_fn(NULL, &x, 1, &y, 1), 0);
        else
            assert_int_equal(nt_checkpoint(drop_fn, NULL, &x, 1, &y, 1), 0);
        nt_set_training(false); /* eval between forward and backward */
        assert_int_equal(nt_backward(nt_sum(y, NT_DIM_ALL, false)), 0);
        nt_set_training(true);
        nt_tensor *g = nt_grad(x);
        assert_int_equal(nt_to_host(g, way ? got : ref, sizeof ref), 0);
        nt_release(g), nt_release(y), nt_release(x);
    }
    int zeros = 0;
    for (int i = 0; i < 64; i++)
        zeros += ref[i] == 0.0f;
    assert_true(zeros > 0 && zeros < 64); /* a mask, not the identity */
    assert_memory_equal(ref, got, sizeof ref);
}

/* A block with two outputs of which only the first reaches the loss, and
 * one whose outputs reach nothing: gradients as the direct call's. */
static void test_unused_outputs(void **state)
{
    (void)state;
    float ref[MLP_FLOATS], got[MLP_FLOATS];
    for (int how = 0; how < 2; how++) {
        mlp m;
        mlp_init(&m);
        nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
        nt_scope *s = nt_scope_begin();
        nt_tensor *y[2] = {0}, *z[2] = {0};
        if (how == 0) {
            assert_int_equal(mlp_fn(&m, &x0, 1, y, 2), 0);
            assert_int_equal(mlp_fn(&m, &x0, 1, z, 2), 0);
        } else {
            assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, y, 2), 0);
            assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, z, 2), 0);
            assert_true(nt_requires_grad(y[0]) && nt_requires_grad(y[1]));
            assert_int_equal(m.calls, 2);
        }
        nt_tensor *loss = nt_mean(nt_mul(y[0], y[0]), NT_DIM_ALL, false);
        assert_int_equal(nt_backward(loss), 0);
        if (how == 1)
            assert_int_equal(m.calls, 3); /* z's block was not recomputed */
        float *o = how ? got : ref;
        assert_int_equal(nt_to_host(loss, o, sizeof(float)), 0);
        size_t at = 1;
        take_grad(x0, o, &at);
        take_grad(m.w1, o, &at), take_grad(m.b1, o, &at);
        take_grad(m.w2, o, &at), take_grad(m.b2, o, &at);
        nt_scope_end(s);
        nt_release(x0);
        mlp_free(&m);
    }
    assert_memory_equal(ref, got, sizeof ref);
}

/* retain_graph: a second backward recomputes again and accumulates the
 * same as the direct graph does. */
static void test_retain_graph(void **state)
{
    (void)state;
    float ref[MLP_FLOATS], got[MLP_FLOATS];
    for (int how = 0; how < 2; how++) {
        mlp m;
        mlp_init(&m);
        nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
        nt_scope *s = nt_scope_begin();
        nt_tensor *y;
        if (how == 0)
            assert_int_equal(mlp_fn(&m, &x0, 1, &y, 1), 0);
        else
            assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, &y, 1), 0);
        nt_tensor *loss = nt_mean(nt_mul(y, y), NT_DIM_ALL, false);
        assert_int_equal(nt_backward_ex(loss, true), 0);
        assert_int_equal(nt_backward(loss), 0);
        if (how == 1)
            assert_int_equal(m.calls, 3);
        assert_int_not_equal(nt_backward(loss), 0); /* freed now */
        assert_int_equal(nt_last_error(), NT_ESTATE);
        nt_clear_error();
        float *o = how ? got : ref;
        assert_int_equal(nt_to_host(loss, o, sizeof(float)), 0);
        size_t at = 1;
        take_grad(x0, o, &at);
        take_grad(m.w1, o, &at), take_grad(m.b1, o, &at);
        take_grad(m.w2, o, &at), take_grad(m.b2, o, &at);
        nt_scope_end(s);
        nt_release(x0);
        mlp_free(&m);
    }
    assert_memory_equal(ref, got, sizeof ref);
}

/* Outside a graph it is a plain call: same values, nothing requires grad,
 * no recompute; a passed-through input comes back as a new handle. */
static int identity_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = nt_retain(in[0]);
    return 0;
}

static void test_plain_call_and_passthrough(void **state)
{
    (void)state;
    mlp m;
    mlp_init(&m);
    nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
    nt_scope *s = nt_scope_begin();
    nt_tensor *y, *yd;
    nt_no_grad_begin();
    assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, &y, 1), 0);
    assert_int_equal(mlp_fn(&m, &x0, 1, &yd, 1), 0);
    nt_no_grad_end();
    assert_false(nt_requires_grad(y));
    float a[4 * C], b[4 * C];
    assert_int_equal(nt_to_host(y, a, sizeof a), 0);
    assert_int_equal(nt_to_host(yd, b, sizeof b), 0);
    assert_memory_equal(a, b, sizeof a);
    /* an identity block: the gradient flows straight to x0 */
    nt_tensor *z;
    assert_int_equal(nt_checkpoint(identity_fn, NULL, &x0, 1, &z, 1), 0);
    assert_ptr_not_equal(z, x0);
    assert_true(nt_requires_grad(z));
    nt_tensor *loss = nt_sum(nt_mul_scalar(z, 3.0), NT_DIM_ALL, false);
    assert_int_equal(nt_backward(loss), 0);
    nt_tensor *g = nt_grad(x0);
    assert_int_equal(nt_to_host(g, a, sizeof a), 0);
    for (int i = 0; i < 4 * C; i++)
        assert_true(a[i] == 3.0f);
    nt_scope_end(s);
    assert_true(nt_requires_grad(x0)); /* its own state untouched */
    nt_release(x0);
    mlp_free(&m);
}

/* ---------------- errors ---------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    mlp m;
    mlp_init(&m);
    nt_tensor *x = nt_ones(NT_F32, 2, (int64_t[]){4, C});
    nt_tensor *out[3] = {x, x, x};
    nt_test_expect_err(nt_checkpoint(NULL, &m, &x, 1, out, 1), NT_EINVAL, "nt_checkpoint", "'fn'");
    assert_null(out[0]); /* outputs set to NULL */
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, &x, -1, out, 1), NT_EINVAL, "nt_checkpoint",
                       "'n_in'");
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, &x, NT_CHECKPOINT_MAX_IN + 1, out, 1), NT_EINVAL,
                       "nt_checkpoint", "'n_in'");
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, &x, 1, out, 0), NT_EINVAL, "nt_checkpoint",
                       "'n_out'");
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, &x, 1, out, NT_CHECKPOINT_MAX_OUT + 1), NT_EINVAL,
                       "nt_checkpoint", "'n_out'");
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, &x, 1, NULL, 1), NT_EINVAL, "nt_checkpoint",
                       "'outputs'");
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, NULL, 1, out, 1), NT_EINVAL, "nt_checkpoint",
                       "'inputs'");
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, (nt_tensor *[]){x, NULL}, 2, out, 1), NT_EINVAL,
                       "nt_checkpoint", "'inputs[1]'");
    nt_tensor *dead = nt_ones(NT_F32, 1, (int64_t[]){C});
    nt_release(dead);
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, &dead, 1, out, 1), NT_ERELEASED, "nt_checkpoint",
                       "'inputs[0]'");
    assert_int_equal(m.calls, 0); /* fn never ran */
    /* a block that fails in the forward: its own error, outputs NULL */
    m.fail_on = 1;
    out[0] = x;
    nt_test_expect_err(nt_checkpoint(mlp_fn, &m, &x, 1, out, 1), NT_ESHAPE, "nt_matmul", NULL);
    assert_null(out[0]);
    /* still working */
    m.fail_on = 0;
    nt_tensor *y;
    assert_int_equal(nt_checkpoint(mlp_fn, &m, &x, 1, &y, 1), 0);
    assert_int_equal(nt_sync(), 0);
    nt_release(y);
    nt_release(x);
    mlp_free(&m);
}

static int fail_quietly_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)in, (void)n_in, (void)n_out;
    out[0] = NULL;
    return 5;
}

static int null_out_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = nt_retain(in[0]); /* out[1] left NULL */
    return 0;
}

static void test_block_errors(void **state)
{
    (void)state;
    nt_tensor *x = nt_ones(NT_F32, 2, (int64_t[]){4, C}), *out[2];
    nt_test_expect_err(nt_checkpoint(fail_quietly_fn, NULL, &x, 1, out, 1), NT_EINVAL,
                       "nt_checkpoint", "returned 5");
    nt_test_expect_err(nt_checkpoint(null_out_fn, NULL, &x, 1, out, 2), NT_EINVAL, "nt_checkpoint",
                       "outputs[1] is NULL");
    assert_null(out[0]);
    assert_null(out[1]);
    nt_release(x);
}

/* A block that fails, or gives another shape, when recomputed: an error of
 * nt_backward naming nt_checkpoint and the line that called it; the
 * runtime keeps working. */
static void test_recompute_errors(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        mlp m;
        mlp_init(&m);
        if (k == 0)
            m.fail_on = 2;
        else
            m.grow_on = 2;
        nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
        nt_scope *s = nt_scope_begin();
        nt_tensor *y;
        assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, &y, 1), 0);
        nt_tensor *loss = nt_mean(nt_mul(y, y), NT_DIM_ALL, false);
        int rc = nt_backward(loss);
        const char *msg = nt_last_error_message();
        if (k == 0) {
            assert_int_equal(rc, NT_ESHAPE);
            assert_non_null(strstr(msg, "nt_matmul")); /* the block's own error inside */
        } else {
            assert_int_equal(rc, NT_ESTATE);
            assert_non_null(strstr(msg, "deterministic"));
        }
        if (!strstr(msg, "nt_backward") || !strstr(msg, "nt_checkpoint") ||
            !strstr(msg, "test_checkpointing.c"))
            fail_msg("message '%s' does not name nt_backward, nt_checkpoint and its line", msg);
        nt_clear_error();
        nt_scope_end(s);
        /* the runtime keeps working: a fresh checkpointed step trains */
        m.fail_on = m.grow_on = 0;
        s = nt_scope_begin();
        assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, &y, 1), 0);
        assert_int_equal(nt_backward(nt_mean(nt_mul(y, y), NT_DIM_ALL, false)), 0);
        nt_tensor *g = nt_grad(m.w1);
        assert_non_null(g);
        assert_int_equal(nt_sync(), 0);
        nt_scope_end(s);
        nt_release(x0);
        mlp_free(&m);
    }
}

/* A block that is not deterministic but keeps its shapes: in deterministic
 * (debug) mode the recompute's checksum differs from the forward's and
 * nt_backward says so; in the other modes it goes unseen (reading every
 * output back would cost a sync per checkpoint: docs/gradient-checkpointing.md
 * says so), which this pins down. */
static void test_nondeterministic_block(void **state)
{
    (void)state;
    for (int det = 1; det >= 0; det--) {
        assert_int_equal(nt_config_set("NT_MODE", det ? "deterministic" : "adaptive"), 0);
        mlp m;
        mlp_init(&m);
        m.drift_on = 2; /* the recompute */
        nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
        nt_scope *s = nt_scope_begin();
        nt_tensor *y;
        assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, &y, 1), 0);
        int line = __LINE__ - 1;
        int rc = nt_backward(nt_mean(nt_mul(y, y), NT_DIM_ALL, false));
        if (det) {
            char where[64];
            snprintf(where, sizeof where, "test_checkpointing.c:%d", line);
            nt_test_expect_err(rc, NT_ESTATE, "other values than the forward pass", where);
        } else {
            assert_int_equal(rc, 0);
        }
        assert_int_equal(m.calls, 2);
        /* a deterministic block passes the same check */
        m.drift_on = 0;
        assert_int_equal(nt_checkpoint(mlp_fn, &m, &x0, 1, &y, 1), 0);
        assert_int_equal(nt_backward(nt_mean(nt_mul(y, y), NT_DIM_ALL, false)), 0);
        assert_int_equal(m.calls, 4);
        assert_int_equal(nt_sync(), 0);
        nt_scope_end(s);
        nt_release(x0);
        mlp_free(&m);
    }
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

/* A block that hands back a tensor it did not take a reference to (an
 * input, or a tensor of the caller's scope reached through ctx): NT_EINVAL
 * naming nt_checkpoint, and the caller's tensor stays alive (it used to
 * be released). */
static int borrow_input_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = in[0];
    return 0;
}

static int borrow_ctx_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)in, (void)n_in, (void)n_out;
    out[0] = ctx;
    return 0;
}

static void test_borrowed_outputs(void **state)
{
    (void)state;
    nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = nt_mul_scalar(x0, 2.0), *w = nt_mul_scalar(x0, 3.0), *y = x0;
    for (int grad = 1; grad >= 0; grad--) {
        if (!grad)
            nt_no_grad_begin();
        nt_test_expect_err(nt_checkpoint(borrow_input_fn, NULL, &x, 1, &y, 1), NT_EINVAL,
                   "nt_checkpoint: the block returned inputs[0] as outputs[0] without a new "
                   "reference", "nt_retain(inputs[0])");
        assert_null(y);
        nt_test_expect_err(nt_checkpoint(borrow_ctx_fn, w, &x, 1, &y, 1), NT_EINVAL, "nt_checkpoint",
                   "a tensor that an enclosing scope owns");
        assert_null(y);
        if (!grad)
            nt_no_grad_end();
    }
    /* both still alive and intact */
    float a[4 * C], b[4 * C], c[4 * C];
    assert_int_equal(nt_to_host(x, a, sizeof a), 0);
    assert_int_equal(nt_to_host(w, b, sizeof b), 0);
    assert_int_equal(nt_to_host(x0, c, sizeof c), 0);
    for (int i = 0; i < 4 * C; i++)
        assert_true(a[i] == 2 * c[i] && b[i] == 3 * c[i]);
    nt_scope_end(s);
    nt_release(x0);
}

/* An input, or a parameter the block reads through ctx, written in place
 * between the forward and the backward: NT_EVERSION naming nt_checkpoint. */
static void test_modified_in_place(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        mlp m;
        mlp_init(&m);
        nt_tensor *x0 = param(2, (int64_t[]){4, C}, 35, 1.0);
        nt_scope *s = nt_scope_begin();
        nt_tensor *x = nt_mul_scalar(x0, 2.0), *y;
        assert_int_equal(nt_checkpoint(mlp_fn, &m, &x, 1, &y, 1), 0);
        nt_tensor *loss = nt_mean(nt_mul(y, y), NT_DIM_ALL, false);
        nt_no_grad_begin();
        assert_int_equal(nt_add_scalar_inplace(k ? m.w2 : x, 1.0), 0);
        nt_no_grad_end();
        nt_test_expect_err(nt_backward(loss), NT_EVERSION, "nt_checkpoint",
                           k ? "through ctx" : "inputs[0]");
        nt_scope_end(s);
        nt_release(x0);
        mlp_free(&m);
    }
}

/* ---------------- memory ---------------- */

/* Peak device bytes of forward + backward through 4 blocks, in
 * deterministic mode (no host running ahead): checkpointing keeps less. */
static uint64_t peak_of(bool ckpt)
{
    nt_config_set("NT_MODE", "deterministic");
    block p[4];
    for (int l = 0; l < 4; l++)
        block_init(&p[l], 300 + 20 * (uint64_t)l);
    nt_tensor *x0 = param(3, (int64_t[]){B, T, C}, 9, 1.0);
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_stats st0;
    nt_stats_get(&st0);
    nt_scope *s = nt_scope_begin();
    nt_tensor *x = x0;
    for (int l = 0; l < 4; l++) {
        nt_tensor *y;
        if (ckpt)
            assert_int_equal(nt_checkpoint(block_fn, &p[l], &x, 1, &y, 1), 0);
        else
            y = block_apply(&p[l], x);
        x = y;
    }
    assert_int_equal(nt_backward(nt_mean(nt_mul(x, x), NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_sync(), 0);
    nt_scope_end(s);
    nt_stats st;
    nt_stats_get(&st);
    for (int l = 0; l < 4; l++)
        block_free(&p[l]);
    nt_release(x0);
    nt_config_set("NT_MODE", "adaptive");
    return st.device_bytes_live_peak;
}

static void test_memory_saved(void **state)
{
    (void)state;
    uint64_t plain = peak_of(false), ck = peak_of(true);
    printf("# live peak: %llu bytes without checkpointing, %llu with\n",
           (unsigned long long)plain, (unsigned long long)ck);
    assert_true(ck < plain);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mlp_every_mode, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_transformer_f32_every_mode, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_transformer_bf16_autocast_every_mode, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_unused_outputs, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_dropout_training_mode, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_retain_graph, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_plain_call_and_passthrough, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_block_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_recompute_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_modified_in_place, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_nondeterministic_block, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_borrowed_outputs, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_memory_saved, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
