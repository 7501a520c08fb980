/* tests/test_graph.c - captured programs (fusion/graph.c, docs/graphs.md):
 * a training step captured once and replayed gives the same losses and
 * parameters, bit for bit, as the same steps run op by op -- in every mode,
 * on both backends, with a learning-rate schedule, autocast with stochastic
 * rounding, gradient checkpointing, SGD and AdamW; the memory plan is sound;
 * every refusal and mismatch is a clear error that leaves the runtime
 * working.  No timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <glib.h>

#include "ntensor.h"
#include "nt_test.h"
#include "fusion/graph.h"

static const char *const modes[] = {"deterministic", "eager", "adaptive", "lazy"};
static const char *const backends[] = {"sim", "cpu"};
#define STEPS 5
#define B 16
#define IN 24
#define HID 40
#define OUT 7

/* ---------------- a small MLP ---------------- */

typedef struct {
    nt_tensor *p[4]; /* w1, b1, w2, b2 */
    nt_optim *opt;
    nt_generator *gen;
    bool dropout;
} mlp;

typedef struct {
    bool sgd;      /* SGD with momentum (else AdamW) */
    bool amp;      /* bf16 autocast around the forward */
    bool ckpt;     /* the hidden layer under nt_checkpoint */
    int dropout;   /* 1: draws set by the host each step; 2: advanced by the step itself */
} variant;

static void mlp_make(mlp *m, const variant *v)
{
    m->p[0] = nt_mul_scalar(nt_randn(NT_F32, 2, (int64_t[]){HID, IN}, 11), 0.2);
    m->p[1] = nt_mul_scalar(nt_randn(NT_F32, 1, (int64_t[]){HID}, 12), 0.1);
    m->p[2] = nt_mul_scalar(nt_randn(NT_F32, 2, (int64_t[]){OUT, HID}, 13), 0.2);
    m->p[3] = nt_zeros(NT_F32, 1, (int64_t[]){OUT});
    for (int i = 0; i < 4; i++) {
        assert_non_null(m->p[i]);
        nt_keep(m->p[i]);
        assert_int_equal(nt_set_requires_grad(m->p[i], true), 0);
    }
    m->opt = v->sgd ? nt_optim_sgd(m->p, 4, 0.05, 0.9, 1e-3, false)
                    : nt_optim_adamw(m->p, 4, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    assert_non_null(m->opt);
    m->gen = nt_generator_create(1234);
    assert_non_null(m->gen);
    m->dropout = v->dropout != 0;
}

static void mlp_free(mlp *m)
{
    nt_generator_destroy(m->gen);
    nt_optim_destroy(m->opt);
    for (int i = 0; i < 4; i++)
        nt_release(m->p[i]);
}

static int hidden_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    mlp *m = ctx;
    (void)n_in;
    (void)n_out;
    out[0] = nt_gelu(nt_linear(in[0], m->p[0], m->p[1]));
    if (m->dropout) /* draws 0 and 1 of the step */
        out[0] = nt_dropout_gen(nt_dropout_gen(out[0], 0.2, m->gen, 0), 0.1, m->gen, 1);
    return out[0] ? 0 : -1;
}

/* Step k's batch (a function of k). */
static void batch(int k, float *x, int32_t *y)
{
    for (int i = 0; i < B * IN; i++)
        x[i] = (float)((i * 37 + k * 101) % 29) / 29.0f - 0.5f;
    for (int i = 0; i < B; i++)
        y[i] = (i * 3 + k) % OUT;
}

/* The device's part of a step: forward, backward, clipping, update. */
static nt_tensor *step_body(mlp *m, const variant *v, nt_tensor *x, nt_tensor *y)
{
    nt_scope *s = nt_scope_begin();
    if (v->amp)
        assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    nt_tensor *h;
    if (v->ckpt) {
        nt_tensor *o = NULL;
        h = nt_checkpoint(hidden_fn, m, &x, 1, &o, 1) == 0 ? o : NULL;
    } else {
        hidden_fn(m, &x, 1, &h, 1);
    }
    nt_tensor *loss = nt_cross_entropy(nt_linear(h, m->p[2], m->p[3]), y);
    if (v->amp)
        assert_int_equal(nt_autocast_end(), 0);
    int rc = !loss || nt_backward(loss) || !nt_clip_grad_norm(m->p, 4, 1.0) ||
             nt_optim_step(m->opt) || nt_optim_zero_grad(m->opt);
    if (!rc && v->dropout == 2)
        rc = nt_generator_advance(m->gen, 5);
    if (!rc)
        nt_keep(loss);
    nt_scope_end(s);
    return rc ? NULL : loss;
}

static double lr_at(int k) { return 1e-2 * (1.0 + 0.5 * k) / (1.0 + 0.1 * k * k); }

typedef struct {
    uint32_t loss[STEPS];
    uint32_t params[4][HID * IN];
    int64_t steps;
} result;

static uint32_t f32_bits(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void read_params(mlp *m, result *r)
{
    for (int i = 0; i < 4; i++)
        assert_int_equal(nt_to_host(m->p[i], r->params[i], (size_t)nt_numel(m->p[i]) * 4), 0);
    r->steps = nt_optim_steps(m->opt);
}

/* STEPS steps; capture_at >= 0: step capture_at is captured and the later
 * ones replayed (the ones before run op by op). */
static void train(const char *mode, const char *backend, const variant *v, int capture_at,
                  result *r)
{
    /* a fresh runtime: every run's ops hold the same seqs (stochastic
     * rounding keys its bits with them) */
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    memset(r, 0, sizeof *r);
    mlp m;
    mlp_make(&m, v);
    nt_graph *g = NULL;
    nt_tensor *gloss = NULL;
    float xs[B * IN];
    int32_t ys[B];
    for (int k = 0; k < STEPS; k++) {
        batch(k, xs, ys);
        assert_int_equal(nt_optim_set_lr(m.opt, lr_at(k)), 0);
        if (v->dropout == 1)
            assert_int_equal(nt_generator_set_state(m.gen, 99, (uint64_t)k * 16), 0);
        nt_tensor *x = nt_from_host(xs, NT_F32, 2, (int64_t[]){B, IN});
        nt_tensor *y = nt_from_host(ys, NT_I32, 1, (int64_t[]){B});
        assert_non_null(x);
        assert_non_null(y);
        nt_tensor *loss;
        if (capture_at < 0 || k < capture_at) {
            loss = step_body(&m, v, x, y);
        } else if (k == capture_at) {
            assert_int_equal(nt_graph_capture_begin(), 0);
            assert_int_equal(nt_graph_input(x, "x"), 0);
            assert_int_equal(nt_graph_input(y, "y"), 0);
            gloss = step_body(&m, v, x, y);
            g = nt_graph_capture_end();
            if (!g)
                print_message("# capture: %s\n", nt_last_error_message());
            assert_non_null(g);
            assert_non_null(gloss);
            loss = nt_retain(gloss);
        } else {
            assert_int_equal(nt_graph_bind(g, "x", x), 0);
            assert_int_equal(nt_graph_bind(g, "y", y), 0);
            assert_int_equal(nt_graph_replay(g), 0);
            loss = nt_retain(gloss);
        }
        assert_non_null(loss);
        double l;
        assert_int_equal(nt_item(loss, &l), 0);
        r->loss[k] = f32_bits(l);
        nt_release(loss);
        nt_release(x);
        nt_release(y);
    }
    read_params(&m, r);
    if (g) {
        char why[256];
        assert_int_equal(nt__graph_check_plan(g, why, sizeof why), 0);
        nt_graph_info gi;
        assert_int_equal(nt_graph_info_get(g, &gi), 0);
        assert_int_equal(gi.replays, STEPS - 1 - capture_at);
        assert_true(gi.ops > 0 && gi.kernels > 0 && gi.kernels <= gi.ops);
        assert_true(gi.plan_bytes <= gi.naive_bytes);
        assert_int_equal(gi.inputs, 2);
        assert_true(gi.patches >= 4); /* the learning rate of every parameter at least */
        nt_graph_destroy(g);
    }
    nt_release(gloss);
    mlp_free(&m);
    assert_int_equal(nt_sync(), 0);
}

static void expect_same(const result *a, const result *b, const char *what)
{
    if (memcmp(a->loss, b->loss, sizeof a->loss) || memcmp(a->params, b->params, sizeof a->params) ||
        a->steps != b->steps) {
        for (int k = 0; k < STEPS; k++)
            print_message("# %s: step %d loss %08x vs %08x\n", what, k, a->loss[k], b->loss[k]);
        print_message("# %s: optimizer steps %lld vs %lld\n", what, (long long)a->steps,
                      (long long)b->steps);
        fail_msg("%s: the replayed training differs from the one run op by op", what);
    }
}

static void replays_match(const variant *v, int capture_at)
{
    static result ref, got;
    for (size_t b = 0; b < 2; b++) {
        train("deterministic", backends[b], v, -1, &ref);
        for (size_t m = 0; m < G_N_ELEMENTS(modes); m++) {
            train(modes[m], backends[b], v, capture_at, &got);
            char what[96];
            snprintf(what, sizeof what, "%s / %s", modes[m], backends[b]);
            expect_same(&ref, &got, what);
        }
    }
}

static void test_adamw_replays_match(void **state)
{
    (void)state;
    replays_match(&(variant){0}, 0);
}

static void test_adamw_capture_later_step(void **state)
{
    (void)state;
    replays_match(&(variant){0}, 2);
}

static void test_sgd_momentum_replays_match(void **state)
{
    (void)state;
    /* SGD's first step differs (its buffer is made from the gradient): a
     * later step is captured */
    replays_match(&(variant){.sgd = true}, 1);
}

static void test_autocast_sr_replays_match(void **state)
{
    (void)state;
    setenv("NT_STOCHASTIC_ROUNDING", "1", 1);
    replays_match(&(variant){.amp = true}, 0);
    unsetenv("NT_STOCHASTIC_ROUNDING");
}

static void test_checkpoint_replays_match(void **state)
{
    (void)state;
    replays_match(&(variant){.ckpt = true}, 0);
}

/* Dropout drawing from a generator: set by the host before each step, or
 * advanced by the step itself; under nt_checkpoint the recompute draws the
 * same masks.  Every replay draws what the step run op by op would. */
static void test_dropout_replays_match(void **state)
{
    (void)state;
    replays_match(&(variant){.dropout = 1}, 0);
    replays_match(&(variant){.dropout = 2, .ckpt = true}, 1);
}

/* A step that advances its generator between two draws: the second draw
 * is at the advanced offset, at every replay as op by op (each replay also
 * starts where the last one left the offset). */
static nt_tensor *two_draws(nt_generator *g, nt_tensor *x, bool next)
{
    nt_tensor *a = next ? nt_dropout_next(x, 0.5, g) : nt_dropout_gen(x, 0.5, g, 0);
    if (!next)
        assert_int_equal(nt_generator_advance(g, 1), 0);
    nt_tensor *b = next ? nt_dropout_next(x, 0.5, g) : nt_dropout_gen(x, 0.5, g, 0);
    if (!next)
        assert_int_equal(nt_generator_advance(g, 3), 0);
    return nt_keep(nt_add(a, nt_mul_scalar(b, 3.0)));
}

static void draws_after_advance(bool next)
{
    enum { N = 64, REPS = 3 };
    nt_tensor *x = nt_keep(nt_arange(NT_F32, 1, N + 1, 1));
    float eager[REPS + 1][N], replayed[REPS + 1][N];
    nt_generator *g = nt_generator_create(77);
    for (int k = 0; k <= REPS; k++) {
        nt_scope *sc = nt_scope_begin();
        assert_int_equal(nt_to_host(two_draws(g, x, next), eager[k], sizeof eager[k]), 0);
        nt_scope_end(sc);
    }
    uint64_t seed, off_eager, off;
    assert_int_equal(nt_generator_get_state(g, &seed, &off_eager), 0);
    assert_int_equal(nt_generator_set_state(g, 77, 0), 0);
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *out = two_draws(g, x, next);
    nt_graph *gr = nt_graph_capture_end();
    assert_non_null(gr);
    assert_int_equal(nt_to_host(out, replayed[0], sizeof replayed[0]), 0);
    for (int k = 1; k <= REPS; k++) {
        assert_int_equal(nt_graph_replay(gr), 0);
        assert_int_equal(nt_to_host(out, replayed[k], sizeof replayed[k]), 0);
    }
    assert_int_equal(nt_generator_get_state(g, &seed, &off), 0);
    assert_int_equal(off, off_eager);
    for (int k = 0; k <= REPS; k++)
        assert_memory_equal(replayed[k], eager[k], sizeof eager[k]);
    /* the two draws of a step differ, and so do two steps */
    assert_memory_not_equal(eager[0], eager[1], sizeof eager[0]);
    nt_release(out);
    nt_graph_destroy(gr);
    nt_generator_destroy(g);
    nt_release(x);
}

static void test_draw_after_advance_replays_match(void **state)
{
    (void)state;
    draws_after_advance(false); /* nt_dropout_gen and nt_generator_advance */
    draws_after_advance(true);  /* nt_dropout_next: draw and advance by one */
}

/* ---------------- refusals ---------------- */

static void expect_err(int code, const char *needle)
{
    assert_int_equal(nt_last_error(), code);
    const char *m = nt_last_error_message();
    if (!strstr(m, needle))
        fail_msg("message '%s' lacks '%s'", m, needle);
    nt_clear_error();
}

static void test_sgd_first_step_refused(void **state)
{
    (void)state;
    mlp m;
    mlp_make(&m, &(variant){.sgd = true});
    float xs[B * IN];
    int32_t ys[B];
    batch(0, xs, ys);
    nt_tensor *x = nt_from_host(xs, NT_F32, 2, (int64_t[]){B, IN});
    nt_tensor *y = nt_from_host(ys, NT_I32, 1, (int64_t[]){B});
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_graph_input(x, "x"), 0);
    assert_int_equal(nt_graph_input(y, "y"), 0);
    nt_tensor *l = step_body(&m, &(variant){.sgd = true}, x, y);
    assert_non_null(l); /* the step itself ran */
    assert_null(nt_graph_capture_end());
    expect_err(NT_ESTATE, "run one step before capturing");
    double v;
    assert_int_equal(nt_item(l, &v), 0); /* healthy: the step's value is there */
    assert_true(v > 0);
    nt_release(l);
    nt_release(x);
    nt_release(y);
    mlp_free(&m);
}

static void test_host_read_refused(void **state)
{
    (void)state;
    nt_tensor *a = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){4}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *b = nt_add_scalar(a, 1.0);
    double v = 0;
    nt_tensor *sb = nt_sum(b, -1, false);
    assert_int_equal(nt_item(sb, &v), NT_ESTATE);
    nt_release(sb);
    expect_err(NT_ESTATE, "cannot read the device while capturing");
    float f[4];
    assert_int_equal(nt_to_host(b, f, sizeof f), NT_ESTATE);
    nt_clear_error();
    assert_int_equal(nt_sync(), NT_ESTATE);
    nt_clear_error();
    assert_int_equal(nt_graph_capture_begin(), NT_ESTATE); /* no nesting */
    expect_err(NT_ESTATE, "captures do not nest");
    assert_null(nt_graph_capture_end());
    expect_err(NT_ESTATE, "nt_item");
    /* the capture is over, the runtime works, the step's ops ran */
    assert_null(nt_graph_capture_end());
    expect_err(NT_ESTATE, "not capturing");
    assert_int_equal(nt_to_host(b, f, sizeof f), 0);
    for (int i = 0; i < 4; i++)
        assert_true(f[i] == 2.0f);
    nt_release(b);
    nt_release(a);
}

static void test_baked_host_data_refused(void **state)
{
    (void)state;
    float one[4] = {1, 2, 3, 4};
    nt_tensor *w = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){4}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *x = nt_from_host(one, NT_F32, 1, (int64_t[]){4});
    nt_tensor *y = nt_keep(nt_mul(x, w));
    assert_null(nt_graph_capture_end());
    expect_err(NT_ESTATE, "filled from the host during the capture");
    nt_release(y);
    /* named as an input, the same program is fine */
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_graph_input(x, "x"), 0);
    y = nt_keep(nt_mul(x, w));
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    float two[4] = {5, 6, 7, 8}, out[4];
    nt_tensor *x2 = nt_from_host(two, NT_F32, 1, (int64_t[]){4});
    assert_int_equal(nt_graph_bind(g, "x", x2), 0);
    assert_int_equal(nt_graph_replay(g), 0);
    assert_int_equal(nt_to_host(y, out, sizeof out), 0);
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == two[i]);
    nt_graph_destroy(g);
    nt_release(x2);
    nt_release(x);
    nt_release(y);
    nt_release(w);
}

static void test_bind_and_replay_errors(void **state)
{
    (void)state;
    nt_tensor *x = nt_keep(nt_ones(NT_F32, 2, (int64_t[]){2, 3}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_graph_input(x, "x"), 0);
    assert_int_equal(nt_graph_input(x, "x2"), NT_EINVAL);
    expect_err(NT_EINVAL, "input \"x\" already");
    assert_int_equal(nt_graph_input(x, ""), NT_EINVAL);
    nt_clear_error();
    nt_tensor *y = nt_keep(nt_exp(x));
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    nt_tensor *bad_dt = nt_keep(nt_ones(NT_BF16, 2, (int64_t[]){2, 3}));
    nt_tensor *bad_sh = nt_keep(nt_ones(NT_F32, 2, (int64_t[]){3, 2}));
    assert_int_equal(nt_graph_bind(g, "nope", x), NT_EINVAL);
    expect_err(NT_EINVAL, "not an input");
    assert_int_equal(nt_graph_bind(g, "x", bad_dt), NT_EDTYPE);
    expect_err(NT_EDTYPE, "input \"x\" is f32");
    assert_int_equal(nt_graph_bind(g, "x", bad_sh), NT_ESHAPE);
    expect_err(NT_ESHAPE, "[2, 3]");
    assert_int_equal(nt_graph_bind(g, NULL, x), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_graph_replay(NULL), NT_EINVAL);
    expect_err(NT_EINVAL, "'g' is NULL");
    /* another stream */
    nt_stream *s2 = nt_stream_create();
    assert_non_null(s2);
    nt_stream *old = nt_stream_current();
    assert_int_equal(nt_stream_set_current(s2), 0);
    assert_int_equal(nt_graph_replay(g), NT_EINVAL);
    expect_err(NT_EINVAL, "was captured on stream");
    assert_int_equal(nt_stream_set_current(old), 0);
    assert_int_equal(nt_stream_destroy(s2), 0);
    /* still fine after all that */
    assert_int_equal(nt_graph_replay(g), 0);
    float out[6];
    assert_int_equal(nt_to_host(y, out, sizeof out), 0);
    assert_true(out[0] > 2.718f && out[0] < 2.719f);
    nt_graph_destroy(g);
    nt_release(bad_dt);
    nt_release(bad_sh);
    nt_release(x);
    nt_release(y);
}

static void test_released_tensor_refused(void **state)
{
    (void)state;
    nt_tensor *w = nt_keep(nt_full(NT_F32, 1, (int64_t[]){3}, 2.0));
    nt_tensor *x = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){3}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *y = nt_keep(nt_mul(x, w));
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    nt_release(w); /* the program reads it */
    assert_int_equal(nt_graph_replay(g), NT_ERELEASED);
    expect_err(NT_ERELEASED, "which the captured program reads, was released");
    nt_graph_destroy(g);
    nt_release(x);
    nt_release(y);
}

static void test_grad_state_checked(void **state)
{
    (void)state;
    nt_tensor *w = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){3}));
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *l = nt_keep(nt_sum(nt_mul(w, w), -1, false));
    assert_int_equal(nt_backward(l), 0); /* .grad made, not zeroed */
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    assert_int_equal(nt_graph_replay(g), NT_ESTATE);
    expect_err(NT_ESTATE, "has a gradient now");
    assert_int_equal(nt_zero_grad(w), 0);
    assert_int_equal(nt_graph_replay(g), 0);
    nt_tensor *gr = nt_grad(w);
    float f[3];
    assert_int_equal(nt_to_host(gr, f, sizeof f), 0);
    assert_true(f[0] == 2.0f && f[2] == 2.0f);
    nt_release(gr);
    nt_graph_destroy(g);
    nt_release(l);
    nt_release(w);
}

static gpointer other_thread_op(gpointer arg)
{
    nt_tensor *a = arg;
    nt_tensor *b = nt_add_scalar(a, 1.0);
    int rc = nt_last_error();
    nt_clear_error();
    nt_release(b);
    return GINT_TO_POINTER(rc);
}

static void test_other_thread_refused(void **state)
{
    (void)state;
    nt_tensor *a = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){4}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    GThread *t = g_thread_new("other", other_thread_op, a);
    assert_int_equal(GPOINTER_TO_INT(g_thread_join(t)), NT_ESTATE);
    nt_tensor *b = nt_keep(nt_add_scalar(a, 2.0));
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    /* after the capture the other thread's op goes through */
    t = g_thread_new("other", other_thread_op, a);
    assert_int_equal(GPOINTER_TO_INT(g_thread_join(t)), 0);
    nt_graph_destroy(g);
    nt_release(b);
    nt_release(a);
}

/* Two threads replay one graph (an in-place counter): every replay runs
 * once, in some order, and the sum says so. */
static gpointer replayer(gpointer arg)
{
    nt_graph *g = arg;
    int bad = 0;
    for (int i = 0; i < 20; i++)
        bad += nt_graph_replay(g) != 0;
    return GINT_TO_POINTER(bad);
}

static void test_racing_replays(void **state)
{
    (void)state;
    nt_tensor *c = nt_keep(nt_zeros(NT_F32, 1, (int64_t[]){8}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_add_scalar_inplace(c, 1.0), 0);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    GThread *t1 = g_thread_new("r1", replayer, g), *t2 = g_thread_new("r2", replayer, g);
    assert_int_equal(GPOINTER_TO_INT(g_thread_join(t1)), 0);
    assert_int_equal(GPOINTER_TO_INT(g_thread_join(t2)), 0);
    float f[8];
    assert_int_equal(nt_to_host(c, f, sizeof f), 0);
    for (int i = 0; i < 8; i++)
        assert_true(f[i] == 41.0f);
    nt_graph_info gi;
    assert_int_equal(nt_graph_info_get(g, &gi), 0);
    assert_int_equal(gi.replays, 40);
    nt_graph_destroy(g);
    nt_release(c);
}

/* A long chain of tiny ops: every op is replayed, the value says so. */
static void test_tiny_op_program(void **state)
{
    (void)state;
    nt_tensor *a = nt_keep(nt_zeros(NT_F32, 1, (int64_t[]){4}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_scope *s = nt_scope_begin();
    nt_tensor *t = a;
    for (int i = 0; i < 1000; i++)
        t = nt_add_scalar(t, 1.0);
    assert_int_equal(nt_copy_into(a, t), 0);
    nt_scope_end(s);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    nt_graph_info gi;
    assert_int_equal(nt_graph_info_get(g, &gi), 0);
    assert_int_equal(gi.ops, 1001);
    for (int r = 0; r < 3; r++)
        assert_int_equal(nt_graph_replay(g), 0);
    float f[4];
    assert_int_equal(nt_to_host(a, f, sizeof f), 0);
    for (int i = 0; i < 4; i++)
        assert_true(f[i] == 4000.0f);
    nt_graph_destroy(g);
    nt_release(a);
}

/* A kernel error in a replay (an index out of range in the bound input)
 * poisons what it reaches, names the op, and the next replay with good data
 * is clean again. */
static void test_kernel_error_in_replay(void **state)
{
    (void)state;
    nt_tensor *emb = nt_keep(nt_randn(NT_F32, 2, (int64_t[]){5, 3}, 7));
    int32_t good[2] = {1, 4}, bad[2] = {1, 9};
    nt_tensor *idx = nt_keep(nt_from_host(good, NT_I32, 1, (int64_t[]){2}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_graph_input(idx, "idx"), 0);
    nt_tensor *out = nt_keep(nt_sum(nt_embedding(emb, idx), -1, false));
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    float ref[2], f[2];
    assert_int_equal(nt_to_host(out, ref, sizeof ref), 0);
    nt_tensor *ib = nt_keep(nt_from_host(bad, NT_I32, 1, (int64_t[]){2}));
    assert_int_equal(nt_graph_bind(g, "idx", ib), 0);
    assert_int_equal(nt_graph_replay(g), 0);
    assert_int_equal(nt_to_host(out, f, sizeof f), NT_ERANGE);
    expect_err(NT_ERANGE, "nt_embedding");
    nt_sync(); /* reports it once */
    nt_clear_error();
    /* the captured input holds the last values copied in: bind good ones */
    nt_tensor *ig = nt_keep(nt_from_host(good, NT_I32, 1, (int64_t[]){2}));
    assert_int_equal(nt_graph_bind(g, "idx", ig), 0);
    assert_int_equal(nt_graph_replay(g), 0);
    assert_int_equal(nt_to_host(out, f, sizeof f), 0);
    assert_memory_equal(f, ref, sizeof f);
    nt_graph_destroy(g);
    nt_release(ig);
    nt_release(ib);
    nt_release(idx);
    nt_release(out);
    nt_release(emb);
}

static void test_graph_after_reinit(void **state)
{
    (void)state;
    nt_tensor *a = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){2}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_add_scalar_inplace(a, 1.0), 0);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    nt_release(a);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_graph_replay(g), NT_ESTATE);
    expect_err(NT_ESTATE, "before the last nt_shutdown");
    nt_graph_destroy(g); /* frees what is left, touches nothing of the new runtime */
}

/* The capture run needs at most one of {its step's memory, the big tensor}
 * at a time; the plan needs both at once: the device is too small for the
 * plan, which says so, and nothing else changes. */
static void test_plan_out_of_device_memory(void **state)
{
    (void)state;
    nt_shutdown();
    setenv("NT_HBM_BYTES", "6M", 1);
    assert_int_equal(nt_init(), 0);
    unsetenv("NT_HBM_BYTES");
    nt_tensor *x = nt_keep(nt_ones(NT_F32, 2, (int64_t[]){512, 1024})); /* 2 MiB */
    nt_tensor *w = nt_keep(nt_ones(NT_F32, 2, (int64_t[]){1024, 1}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_scope *s = nt_scope_begin();
    nt_tensor *t = nt_exp(x); /* 2 MiB, stored: the matmul reads it */
    nt_tensor *u = nt_keep(nt_sum(nt_matmul(t, w), 0, false));
    nt_scope_end(s);
    nt_tensor *big = nt_keep(nt_zeros(NT_F32, 1, (int64_t[]){3 << 18})); /* 3 MiB, kept */
    nt_graph *g = nt_graph_capture_end();
    assert_null(g);
    expect_err(NT_ENOMEM, "out of device memory");
    double v;
    assert_int_equal(nt_item(u, &v), 0); /* the step ran */
    nt_release(big);
    nt_release(u);
    nt_release(w);
    nt_release(x);
    /* the runtime is whole: a capture that fits works */
    nt_tensor *a = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){16}));
    assert_int_equal(nt_graph_capture_begin(), 0);
    assert_int_equal(nt_mul_scalar_inplace(a, 2.0), 0);
    g = nt_graph_capture_end();
    assert_non_null(g);
    assert_int_equal(nt_graph_replay(g), 0);
    nt_tensor *sa = nt_sum(a, -1, false);
    assert_int_equal(nt_item(sa, &v), 0);
    nt_release(sa);
    assert_true(v == 64.0);
    nt_graph_destroy(g);
    nt_release(a);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
}

static int setup(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_adamw_replays_match, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_adamw_capture_later_step, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sgd_momentum_replays_match, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_autocast_sr_replays_match, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_replays_match, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_dropout_replays_match, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_draw_after_advance_replays_match, setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sgd_first_step_refused, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_host_read_refused, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_baked_host_data_refused, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bind_and_replay_errors, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_released_tensor_refused, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_grad_state_checked, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_other_thread_refused, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_racing_replays, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_tiny_op_program, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_kernel_error_in_replay, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_after_reinit, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_plan_out_of_device_memory, setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
