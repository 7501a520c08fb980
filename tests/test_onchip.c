/* tests/test_onchip.c - what a captured program keeps off HBM: under bf16
 * autocast the parameters' casts made ahead (autograd/optim.c, ampcap):
 * the capturing forward reads a cast made outside the program, the
 * program's optimizer step rewrites it, each replay's forward reads what
 * the replay before it wrote.  Checked: the bits of every loss and
 * parameter equal the same steps run op by op (every mode, both backends,
 * captured at the first step or a later one); the program holds no cast of
 * a parameter, so it runs fewer kernels and moves fewer HBM bytes than with
 * the casts in it (stochastic rounding keeps them there); a parameter
 * written between replays (op by op steps, nt_copy_into) is cast again
 * before the next replay, never read stale.  And attention in bf16 on the
 * simulated core: a group of heads loads as one DMA and widens as one copy
 * (neuron/attention.c), the same bits as the CPU's, in about the f32
 * program's time, not twice it. */
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

#define NB 32
#define NI 48
#define NH 64
#define NO 9
#define NSTEP 6
#define NPAR 4

static const char *const modes[] = {"deterministic", "eager", "adaptive", "lazy"};
static const char *const backends[] = {"sim", "cpu"};

typedef struct {
    nt_tensor *p[NPAR]; /* w1 [NH, NI], b1, w2 [NO, NH], b2 */
    nt_optim *opt;
} net;

typedef struct {
    uint32_t loss[NSTEP];
    uint32_t w1[NH * NI], w2[NO * NH];
    nt_graph_info gi;
    uint64_t replay_hbm, replay_kernels; /* of the replays, summed */
} run_out;

static void net_make(net *n)
{
    n->p[0] = nt_mul_scalar(nt_randn(NT_F32, 2, (int64_t[]){NH, NI}, 21), 0.15);
    n->p[1] = nt_mul_scalar(nt_randn(NT_F32, 1, (int64_t[]){NH}, 22), 0.1);
    n->p[2] = nt_mul_scalar(nt_randn(NT_F32, 2, (int64_t[]){NO, NH}, 23), 0.15);
    n->p[3] = nt_zeros(NT_F32, 1, (int64_t[]){NO});
    for (int i = 0; i < NPAR; i++) {
        assert_non_null(n->p[i]);
        nt_keep(n->p[i]);
        assert_int_equal(nt_set_requires_grad(n->p[i], true), 0);
    }
    n->opt = nt_optim_adamw(n->p, NPAR, 3e-3, 0.9, 0.999, 1e-8, 0.01);
    assert_non_null(n->opt);
}

static void net_free(net *n)
{
    nt_optim_destroy(n->opt);
    for (int i = 0; i < NPAR; i++)
        nt_release(n->p[i]);
}

static void batch_of(int k, float *x, int32_t *y)
{
    for (int i = 0; i < NB * NI; i++)
        x[i] = (float)((i * 41 + k * 97) % 31) / 31.0f - 0.5f;
    for (int i = 0; i < NB; i++)
        y[i] = (i * 5 + k) % NO;
}

/* forward under bf16 autocast, backward, clipping, AdamW */
static nt_tensor *body(net *n, nt_tensor *x, nt_tensor *y)
{
    nt_scope *s = nt_scope_begin();
    assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    nt_tensor *h = nt_gelu(nt_linear(x, n->p[0], n->p[1]));
    nt_tensor *loss = nt_cross_entropy(nt_linear(h, n->p[2], n->p[3]), y);
    assert_int_equal(nt_autocast_end(), 0);
    int rc = !loss || nt_backward(loss) || !nt_clip_grad_norm(n->p, NPAR, 1.0) ||
             nt_optim_step(n->opt) || nt_optim_zero_grad(n->opt);
    if (!rc)
        nt_keep(loss);
    nt_scope_end(s);
    return rc ? NULL : loss;
}

static uint32_t bits_of(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* w1 <- w1 * 0.5 + 0.001, from the host's side of the program (no grad) */
static void write_w1(net *n)
{
    nt_no_grad_begin();
    nt_tensor *v = nt_add_scalar(nt_mul_scalar(n->p[0], 0.5), 0.001);
    assert_non_null(v);
    assert_int_equal(nt_copy_into(n->p[0], v), 0);
    nt_release(v);
    nt_no_grad_end();
}

/* NSTEP steps; plan[k]: 'e' op by op, 'c' captured, 'r' replayed; 'W'
 * before a step's letter: write_w1 first. */
static void run(const char *mode, const char *backend, const char *plan, run_out *o)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    memset(o, 0, sizeof *o);
    net n;
    net_make(&n);
    nt_graph *g = NULL;
    nt_tensor *gloss = NULL;
    float xs[NB * NI];
    int32_t ys[NB];
    int k = 0;
    for (const char *c = plan; *c; c++) {
        if (*c == 'W') {
            write_w1(&n);
            continue;
        }
        batch_of(k, xs, ys);
        nt_tensor *x = nt_from_host(xs, NT_F32, 2, (int64_t[]){NB, NI});
        nt_tensor *y = nt_from_host(ys, NT_I32, 1, (int64_t[]){NB});
        assert_non_null(x);
        assert_non_null(y);
        nt_tensor *loss = NULL;
        if (*c == 'e') {
            loss = body(&n, x, y);
        } else if (*c == 'c') {
            assert_int_equal(nt_graph_capture_begin(), 0);
            assert_int_equal(nt_graph_input(x, "x"), 0);
            assert_int_equal(nt_graph_input(y, "y"), 0);
            gloss = body(&n, x, y);
            g = nt_graph_capture_end();
            if (!g)
                print_message("# capture: %s\n", nt_last_error_message());
            assert_non_null(g);
            loss = nt_retain(gloss);
        } else {
            assert_int_equal(nt_sync(), 0);
            nt_stats s0, s1;
            assert_int_equal(nt_stats_get(&s0), 0);
            assert_int_equal(nt_graph_bind(g, "x", x), 0);
            assert_int_equal(nt_graph_bind(g, "y", y), 0);
            assert_int_equal(nt_graph_replay(g), 0);
            assert_int_equal(nt_sync(), 0);
            assert_int_equal(nt_stats_get(&s1), 0);
            o->replay_hbm += s1.sim_hbm_bytes - s0.sim_hbm_bytes;
            o->replay_kernels += s1.sim_kernels - s0.sim_kernels;
            loss = nt_retain(gloss);
        }
        assert_non_null(loss);
        double l;
        assert_int_equal(nt_item(loss, &l), 0);
        o->loss[k++] = bits_of(l);
        nt_release(loss);
        nt_release(x);
        nt_release(y);
    }
    assert_int_equal(k, NSTEP);
    assert_int_equal(nt_to_host(n.p[0], o->w1, sizeof o->w1), 0);
    assert_int_equal(nt_to_host(n.p[2], o->w2, sizeof o->w2), 0);
    if (g) {
        assert_int_equal(nt_graph_info_get(g, &o->gi), 0);
        nt_graph_destroy(g);
    }
    nt_release(gloss);
    net_free(&n);
    assert_int_equal(nt_sync(), 0);
}

static void same_bits(const run_out *a, const run_out *b, const char *what)
{
    for (int k = 0; k < NSTEP; k++)
        if (a->loss[k] != b->loss[k])
            fail_msg("%s: step %d's loss %08x, op by op %08x", what, k, b->loss[k], a->loss[k]);
    if (memcmp(a->w1, b->w1, sizeof a->w1) || memcmp(a->w2, b->w2, sizeof a->w2))
        fail_msg("%s: the parameters differ from the steps run op by op", what);
}

/* plan replayed against the same plan with every step op by op */
static void check_plan(const char *plan)
{
    static run_out ref, got;
    char eager[2 * NSTEP + 1];
    size_t j = 0;
    for (const char *c = plan; *c; c++)
        eager[j++] = *c == 'W' ? 'W' : 'e';
    eager[j] = 0;
    for (size_t b = 0; b < G_N_ELEMENTS(backends); b++) {
        run("deterministic", backends[b], eager, &ref);
        for (size_t m = 0; m < G_N_ELEMENTS(modes); m++) {
            run(modes[m], backends[b], plan, &got);
            char what[128];
            snprintf(what, sizeof what, "%s / %s / %s", plan, modes[m], backends[b]);
            same_bits(&ref, &got, what);
        }
    }
}

static void test_first_step_captured(void **state)
{
    (void)state;
    check_plan("crrrrr");
}

static void test_later_step_captured(void **state)
{
    (void)state;
    check_plan("eecrrr");
}

/* an op by op step between replays makes its cast ahead in a storage of
 * its own; the next replay casts the parameter into the program's */
static void test_step_between_replays(void **state)
{
    (void)state;
    check_plan("crrerr");
}

static void test_parameter_written_between_replays(void **state)
{
    (void)state;
    check_plan("crWrrWrr");
}

/* The program holds no cast of w1 or w2: at least two kernels fewer and
 * their bytes (each cast reads 4 and writes 2 bytes an element; the update
 * writes 2 more) than the program with the casts, which stochastic
 * rounding keeps in it (its casts draw from their own seeds; it rounds
 * some other casts apart too, hence "at least").  Both without foreach
 * kernels: a lone cast may wait and share one (fusion/plan.c, join_kind),
 * which would hide the casts' kernels. */
static void test_fewer_kernels_and_bytes(void **state)
{
    (void)state;
    static run_out ahead, in_prog;
    setenv("NT_FOREACH", "0", 1);
    run("lazy", "sim", "crrrrr", &ahead);
    setenv("NT_STOCHASTIC_ROUNDING", "1", 1);
    run("lazy", "sim", "crrrrr", &in_prog);
    unsetenv("NT_STOCHASTIC_ROUNDING");
    unsetenv("NT_FOREACH");
    print_message("# kernels %lld vs %lld; HBM a replay %llu vs %llu bytes\n",
                  (long long)ahead.gi.kernels, (long long)in_prog.gi.kernels,
                  (unsigned long long)ahead.replay_hbm / (NSTEP - 1),
                  (unsigned long long)in_prog.replay_hbm / (NSTEP - 1));
    assert_true(ahead.gi.kernels <= in_prog.gi.kernels - 2);
    assert_true(ahead.replay_kernels <= in_prog.replay_kernels - 2 * (NSTEP - 1));
    /* (a replay's kernels: the program's and the copies of its two inputs) */
    assert_int_equal(ahead.replay_kernels, (uint64_t)(ahead.gi.kernels + 2) * (NSTEP - 1));
    uint64_t saved = (uint64_t)(NH * NI + NO * NH) * 4 * (NSTEP - 1);
    assert_true(ahead.replay_hbm + saved <= in_prog.replay_hbm);
}

/* A capture of a forward alone: w (an optimizer's parameter) gets its cast
 * made outside the program, x (a named input that requires grad) is cast
 * in it.  Each replay's y equals y computed op by op with the x bound and
 * the w of then: x's new values are cast (not a stale cast of step 0's),
 * and w written between replays is cast again. */
static void test_forward_capture(void **state)
{
    (void)state;
    for (size_t b = 0; b < G_N_ELEMENTS(backends); b++) {
        nt_shutdown();
        assert_int_equal(nt_init(), 0);
        assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
        assert_int_equal(nt_config_set("NT_BACKEND", backends[b]), 0);
        net n;
        net_make(&n);
        float xs[NB * NI];
        batch_of(0, xs, (int32_t[NB]){0});
        nt_tensor *x = nt_from_host(xs, NT_F32, 2, (int64_t[]){NB, NI});
        assert_non_null(x);
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        assert_int_equal(nt_graph_capture_begin(), 0);
        assert_int_equal(nt_graph_input(x, "x"), 0);
        assert_int_equal(nt_autocast_begin(NT_BF16), 0);
        nt_tensor *y = nt_linear(x, n.p[0], NULL);
        assert_int_equal(nt_autocast_end(), 0);
        nt_graph *g = nt_graph_capture_end();
        assert_non_null(g);
        assert_non_null(y);
        for (int k = 1; k < 5; k++) {
            if (k == 3)
                write_w1(&n);
            batch_of(k, xs, (int32_t[NB]){0});
            nt_tensor *xk = nt_from_host(xs, NT_F32, 2, (int64_t[]){NB, NI});
            assert_non_null(xk);
            assert_int_equal(nt_graph_bind(g, "x", xk), 0);
            assert_int_equal(nt_graph_replay(g), 0);
            assert_int_equal(nt_autocast_begin(NT_BF16), 0);
            nt_tensor *want = nt_linear(xk, n.p[0], NULL);
            assert_int_equal(nt_autocast_end(), 0);
            assert_non_null(want);
            static uint16_t a[NB * NH], e[NB * NH];
            assert_int_equal(nt_to_host(y, a, sizeof a), 0);
            assert_int_equal(nt_to_host(want, e, sizeof e), 0);
            if (memcmp(a, e, sizeof a))
                fail_msg("%s: replay %d's y differs from y op by op", backends[b], k);
            nt_release(want);
            nt_release(xk);
        }
        nt_graph_destroy(g);
        nt_release(y);
        nt_release(x);
        net_free(&n);
        assert_int_equal(nt_sync(), 0);
    }
}

/* ---------------- attention in bf16 ---------------- */

enum { AB = 4, AH = 4 };

/* sdpa(q, k, v) on q [AB, AH, T, D], k and v [AB, AH, Tk, D] in dt
 * (causal when Tk == T), backward of sum(o * o): the bits of o, dq, dk, dv
 * (as f32) one after the other into out, and the simulated time of the
 * forward and of the backward */
static void sdpa_bits(const char *backend, nt_dtype dt, int64_t T, int64_t Tk, int64_t D,
                      uint32_t *out, double *fwd_ns, double *bwd_ns)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_MODE", "deterministic"), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(backend, "sim") ? "0" : "1"), 0);
    int64_t shape[2][4] = {{AB, AH, T, D}, {AB, AH, Tk, D}};
    size_t nq = (size_t)(AB * AH) * (size_t)D * (size_t)T;
    size_t nk = (size_t)(AB * AH) * (size_t)D * (size_t)Tk;
    nt_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = nt_cast(nt_mul_scalar(nt_randn(NT_F32, 4, shape[i > 0], 40 + (uint64_t)i), 0.5), dt);
        assert_non_null(t[i]);
        nt_keep(t[i]);
        assert_int_equal(nt_set_requires_grad(t[i], true), 0);
    }
    assert_int_equal(nt_sync(), 0);
    nt_stats s0, s1, s2;
    assert_int_equal(nt_stats_get(&s0), 0);
    nt_tensor *o = nt_scaled_dot_product_attention(t[0], t[1], t[2], NULL, Tk == T, 0.0);
    assert_non_null(o);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_stats_get(&s1), 0);
    nt_tensor *loss = nt_sum(nt_mul(nt_cast(o, NT_F32), nt_cast(o, NT_F32)), -1, false);
    loss = nt_sum(nt_reshape(loss, 1, (int64_t[]){-1}), 0, false);
    assert_non_null(loss);
    assert_int_equal(nt_backward(loss), 0);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt_stats_get(&s2), 0);
    *fwd_ns = (double)(s1.sim_time_ns - s0.sim_time_ns);
    *bwd_ns = (double)(s2.sim_time_ns - s1.sim_time_ns);
    nt_tensor *v[4] = {o, nt_grad(t[0]), nt_grad(t[1]), nt_grad(t[2])};
    for (int i = 0, at = 0; i < 4; i++) {
        assert_non_null(v[i]);
        nt_tensor *f = nt_cast(v[i], NT_F32);
        size_t n = i < 2 ? nq : nk;
        assert_int_equal(nt_to_host(f, out + at, n * 4), 0);
        at += (int)n;
        nt_release(f);
    }
    nt_release(loss);
    for (int i = 0; i < 3; i++)
        nt_release(t[i]);
    assert_int_equal(nt_sync(), 0);
}

/* T = 256: whole blocks, the heads of a group in one DMA; T = 200: a short
 * last block, a DMA per head (as before); T = 384, D = 128: three query
 * blocks, one head a group; 128 queries over 4096 keys, D = 128: a group's
 * raw slots (sized for the keys) fit SBUF in the forward, not in the
 * backward, which falls back to a DMA per head. */
static void test_attention_bf16_grouped(void **state)
{
    (void)state;
    static const int64_t Ts[] = {256, 200, 384, 128}, Tks[] = {256, 200, 384, 4096},
                         Ds[] = {32, 32, 128, 128};
    for (size_t i = 0; i < G_N_ELEMENTS(Ts); i++) {
        int64_t T = Ts[i], Tk = Tks[i], D = Ds[i];
        size_t n = 2 * (size_t)(AB * AH) * (size_t)D * (size_t)(T + Tk);
        uint32_t *a = malloc(n * 4), *b = malloc(n * 4);
        assert_non_null(a);
        assert_non_null(b);
        double f16f, f16b, f32f, f32b, cf, cb;
        sdpa_bits("sim", NT_BF16, T, Tk, D, a, &f16f, &f16b);
        sdpa_bits("cpu", NT_BF16, T, Tk, D, b, &cf, &cb);
        if (memcmp(a, b, n * 4))
            fail_msg("T = %lld, D = %lld: bf16 attention on the simulator differs from the CPU's",
                     (long long)T, (long long)D);
        sdpa_bits("sim", NT_F32, T, Tk, D, a, &f32f, &f32b);
        print_message("# T = %lld, Tk = %lld, D = %lld: bf16 forward %.1f us, backward %.1f us; "
                      "f32 %.1f, %.1f us\n",
                      (long long)T, (long long)Tk, (long long)D, f16f / 1e3, f16b / 1e3,
                      f32f / 1e3, f32b / 1e3);
        if (T % 128 == 0 && Tk == T && D == 32) { /* grouped: about f32's time (was 1.6-2x) */
            assert_true(f16f <= 1.25 * f32f);
            assert_true(f16b <= 1.25 * f32b);
        }
        free(a);
        free(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_first_step_captured, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_later_step_captured, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_step_between_replays, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_parameter_written_between_replays, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fewer_kernels_and_bytes, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_forward_capture, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_attention_bf16_grouped, nt_test_setup,
                                        nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
