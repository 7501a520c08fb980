/* tests/test_debug.c - debugging and observability (docs/debugging.md).
 *
 *   NT_CHECK_NAN   the first op to make a NaN/Inf from finite inputs is
 *                  named with its line, unfused and inside fused kernels
 *                  (the exact inner op), on both backends; carried-along
 *                  NaNs are not blamed; downstream ops are poisoned
 *   provenance     errors from a CPU kernel, a simulator rule, device
 *                  memory, a composite op and a backward name op and line
 *   deterministic  a result holds its values when the call returns
 *   NT_TRACE       the file is JSON with host and simulator events
 *   NT_STATS       the summary nt_shutdown prints
 *
 * The gdb side (pretty-printers, nt-queue, stepping into kernels) is tested
 * by tests/gdb_test.py over examples/debug_demo. */
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
#include "core/internal.h"
#include "streams/stream.h"
#include "nt_test.h"

static int teardown(void **state)
{
    nt_test_teardown(state);
    unsetenv("NT_TRACE");
    unsetenv("NT_STATS");
    unsetenv("NT_HBM_BYTES");
    return 0;
}

static nt_tensor *vec(const float *v, int64_t n)
{
    return nt_from_host(v, NT_F32, 1, &n);
}

/* "test_debug.c:<line>" */
static const char *at_line(int line)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "test_debug.c:%d", line);
    return buf;
}

static void assert_has(const char *hay, const char *needle)
{
    if (!strstr(hay, needle)) {
        fprintf(stderr, "expected \"%s\" in:\n%s\n", needle, hay);
        fail();
    }
}

/* ---------------- NaN / Inf hunting ---------------- */

static void check_nan_unfused(const char *backend)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    float xv[4] = {1, 4, -1, 9};
    nt_tensor *x = vec(xv, 4);
    int line = __LINE__ + 2;
    nt_tensor *s = nt_sqrt(x);
    nt_tensor *l = nt_log(nt_add_scalar(x, -1.0)); /* log(0) = -inf at element 0 */
    nt_tensor *d = nt_add_scalar(l, 1.0);          /* downstream: poisoned */
    float out[4];
    /* sqrt(-1) = NaN came first: its own error */
    assert_int_equal(nt_to_host(s, out, sizeof out), NT_ENAN);
    assert_has(nt_last_error_message(), "nt_sqrt (at ");
    assert_has(nt_last_error_message(), at_line(line - 1));
    assert_has(nt_last_error_message(), "produced NaN at element 2 of its [4] f32 output");
    assert_has(nt_last_error_message(), "[reported by nt_to_host at ");
    /* the log is named, not the add that only carries its -inf along */
    assert_int_equal(nt_to_host(d, out, sizeof out), NT_ENAN);
    assert_has(nt_last_error_message(), "nt_log (at ");
    assert_has(nt_last_error_message(), at_line(line));
    assert_has(nt_last_error_message(), "produced -Inf at element 0");
    nt_stats st;
    nt_stats_get(&st);
    assert_true(st.ops_poisoned >= 1);
    nt_clear_error();
    nt_sync();
    nt_clear_error();
}

static void test_nan_unfused_cpu(void **state)
{
    (void)state;
    check_nan_unfused("cpu");
}

static void test_nan_unfused_sim(void **state)
{
    (void)state;
    check_nan_unfused("sim");
}

/* A NaN from the user's data is carried along, not blamed. */
static void test_nan_carried_not_blamed(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    float xv[3] = {1, NAN, 2};
    nt_tensor *x = vec(xv, 3);
    nt_tensor *y = nt_mul_scalar(nt_exp(x), 2.0);
    float out[3];
    assert_int_equal(nt_to_host(y, out, sizeof out), 0);
    assert_true(isnan(out[1]));
    assert_true(out[0] == (float)(2.0 * (double)expf(1.0f)) || out[0] > 5.43f);
    /* nor is a fill the user asked for: -inf is a value here */
    nt_tensor *m = nt_full(NT_F32, 1, (int64_t[]){3}, -INFINITY);
    nt_tensor *e = nt_exp(m); /* exp(-inf) = 0: fine */
    assert_int_equal(nt_to_host(e, out, sizeof out), 0);
    assert_true(out[0] == 0.0f);
    assert_int_equal(nt_sync(), 0);
    /* without NT_CHECK_NAN nothing is checked */
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "0"), 0);
    float nv[2] = {-1, 1};
    nt_tensor *l = nt_log(vec(nv, 2));
    assert_int_equal(nt_to_host(l, out, 2 * sizeof(float)), 0);
    assert_true(isnan(out[0]));
}

/* Five elementwise ops in one fused kernel; the third makes the NaN: the
 * replay names it, with its line, and the values before it are right. */
static void check_nan_fused(const char *backend)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    float xv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    nt_tensor *x = vec(xv, 8);
    nt_sync();
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    nt_stats_reset();
    nt_scope *sc = nt_scope_begin();
    nt_tensor *a = nt_mul_scalar(x, 2.0);
    nt_tensor *b = nt_add_scalar(a, -5.0); /* -3 -1 1 3 ... */
    int line = __LINE__ + 1;
    nt_tensor *c = nt_sqrt(b); /* NaN at elements 0 and 1 */
    nt_tensor *d = nt_exp(c);
    nt_tensor *e = nt_mul(d, d);
    nt_keep(b);
    nt_keep(e);
    nt_scope_end(sc);
    float out[8];
    assert_int_equal(nt_to_host(e, out, sizeof out), NT_ENAN);
    const char *m = nt_last_error_message();
    assert_has(m, "nt_sqrt (at ");
    assert_has(m, at_line(line));
    assert_has(m, "produced NaN at element 0 of its [8] f32 output");
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.fusion_groups, 1); /* it did run as one kernel first */
    assert_int_equal(st.fused_ops, 5);
    /* what precedes the NaN is intact after the replay */
    assert_int_equal(nt_to_host(b, out, sizeof out), 0);
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == 2.0f * xv[i] - 5.0f);
    nt_release(b);
    nt_release(e);
    nt_clear_error();
    nt_sync();
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

static void test_nan_fused_cpu(void **state)
{
    (void)state;
    check_nan_fused("cpu");
}

static void test_nan_fused_sim(void **state)
{
    (void)state;
    check_nan_fused("sim");
}

/* An Inf that the fused kernel would keep on chip (exp overflows, 1/inf
 * is 0) is found as it is unfused: NT_CHECK_NAN stores every value. */
static void test_nan_fused_elided_inf(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    float xv[4] = {1, 2, 100, 3};
    nt_tensor *x = vec(xv, 4);
    nt_sync();
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    nt_scope *sc = nt_scope_begin();
    int line = __LINE__ + 1;
    nt_tensor *big = nt_exp(x); /* exp(100) = inf in f32 */
    nt_tensor *y = nt_keep(nt_div(nt_ones(NT_F32, 1, (int64_t[]){4}), big));
    nt_scope_end(sc);
    float out[4];
    assert_int_equal(nt_to_host(y, out, sizeof out), NT_ENAN);
    assert_has(nt_last_error_message(), "nt_exp (at ");
    assert_has(nt_last_error_message(), at_line(line));
    assert_has(nt_last_error_message(), "produced Inf at element 2");
    nt_release(y);
    nt_clear_error();
    nt_sync();
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

/* In-place writes in a group: the check must not apply them twice. */
static void test_nan_fused_inplace(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    float xv[4] = {1, -3, 2, 0.5f};
    nt_tensor *x = vec(xv, 4);
    nt_tensor *acc = nt_ones(NT_F32, 1, (int64_t[]){4});
    nt_sync();
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    assert_int_equal(nt_add_inplace(acc, x), 0); /* 2 -2 3 1.5 */
    assert_int_equal(nt_mul_scalar_inplace(acc, 2.0), 0);
    int line = __LINE__ + 1;
    nt_tensor *l = nt_log(acc); /* log(-4) */
    float out[4];
    assert_int_equal(nt_to_host(l, out, sizeof out), NT_ENAN);
    assert_has(nt_last_error_message(), at_line(line));
    assert_has(nt_last_error_message(), "nt_log");
    nt_clear_error();
    assert_int_equal(nt_to_host(acc, out, sizeof out), 0);
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == 2.0f * (1.0f + xv[i]));
    /* an in-place op is blamed only if it made the NaN */
    float nv[2] = {NAN, 1};
    nt_tensor *n = vec(nv, 2);
    assert_int_equal(nt_add_scalar_inplace(n, 1.0), 0); /* carries it */
    assert_int_equal(nt_to_host(n, out, 2 * sizeof(float)), 0);
    nt_tensor *z = nt_zeros(NT_F32, 1, (int64_t[]){2});
    int line2 = __LINE__ + 1;
    assert_int_equal(nt_div_inplace(z, nt_zeros(NT_F32, 1, (int64_t[]){2})), 0); /* 0/0 */
    assert_int_equal(nt_to_host(z, out, 2 * sizeof(float)), NT_ENAN);
    assert_has(nt_last_error_message(), "nt_div_inplace");
    assert_has(nt_last_error_message(), at_line(line2));
    nt_clear_error();
    nt_sync();
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

/* ---------------- provenance ---------------- */

static void test_provenance_kernel_error(void **state)
{
    (void)state;
    float wv[6] = {1, 2, 3, 4, 5, 6};
    int32_t iv[2] = {0, 9};
    nt_tensor *w = nt_from_host(wv, NT_F32, 2, (int64_t[]){3, 2});
    nt_tensor *idx = nt_from_host(iv, NT_I32, 1, (int64_t[]){2});
    int line = __LINE__ + 1;
    nt_tensor *e = nt_embedding(w, idx);
    nt_tensor *s = nt_sum(e, NT_DIM_ALL, false);
    double v;
    int line2 = __LINE__ + 1;
    assert_int_equal(nt_item(s, &v), NT_ERANGE);
    const char *m = nt_last_error_message();
    assert_has(m, "nt_embedding (at ");
    assert_has(m, at_line(line));
    assert_has(m, "out of range");
    assert_has(strstr(m, "[reported by nt_item at "), at_line(line2));
    nt_clear_error();
    /* a later failure is still returned by nt_sync, though the first one
     * was reported through its tensor */
    int32_t iv2[1] = {-1};
    int line3 = __LINE__ + 1;
    nt_tensor *e2 = nt_embedding(w, nt_from_host(iv2, NT_I32, 1, (int64_t[]){1}));
    assert_non_null(e2);
    assert_int_equal(nt_sync(), NT_ERANGE);
    assert_has(nt_last_error_message(), at_line(line3));
    assert_has(nt_last_error_message(), "[reported by nt_sync at ");
    nt_clear_error();
    nt_sync();
    nt_clear_error();
}

/* A tile kernel that breaks a hardware rule (200 partitions). */
static int shape_same(const nt_tensor_view *in, int nin, nt_tensor_view *out, char *why,
                      size_t whylen, void *ctx)
{
    (void)nin, (void)why, (void)whylen, (void)ctx;
    *out = in[0];
    return 0;
}

static int kernel_too_wide(nt_sim_kernel *k, const nt_tensor_view *in, int nin,
                           const nt_tensor_view *out, void *ctx)
{
    (void)in, (void)nin, (void)out, (void)ctx;
    nt_tile_alloc(k, "wide", NT_MEM_SBUF, NT_F32, 200, 4);
    return nt_sim_kernel_error(k);
}

static void test_provenance_sim_rule(void **state)
{
    (void)state;
    nt_kernel_op_def def = {"too_wide", 1, shape_same, kernel_too_wide, NULL, NULL};
    int op = nt_op_register_kernel(&def);
    assert_true(op >= 0);
    nt_tensor *x = nt_ones(NT_F32, 1, (int64_t[]){4});
    int line = __LINE__ + 1;
    nt_tensor *y = nt_op_call(op, (nt_tensor *[]){x});
    assert_non_null(y);
    assert_int_equal(nt_sync(), NT_ESIM);
    const char *m = nt_last_error_message();
    assert_has(m, "nt_op_call(too_wide) (at ");
    assert_has(m, at_line(line));
    assert_has(m, "200 partitions");
    assert_has(m, "[reported by nt_sync at ");
    nt_clear_error();
}

static void test_provenance_device_memory(void **state)
{
    (void)state;
    nt_shutdown();
    setenv("NT_HBM_BYTES", "64K", 1);
    assert_int_equal(nt_init(), 0);
    nt_tensor *a = nt_zeros(NT_F32, 1, (int64_t[]){4096}); /* 16 KiB */
    assert_non_null(a);
    int line = __LINE__ + 1;
    nt_tensor *b = nt_zeros(NT_F32, 1, (int64_t[]){1 << 20}); /* 4 MiB */
    assert_null(b);
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    assert_has(nt_last_error_message(), "nt_zeros");
    assert_has(nt_last_error_message(), at_line(line));
    nt_clear_error();
}

/* An op issued by a composite names the function the user called. */
static void test_provenance_composite(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    nt_tensor *x = nt_full(NT_F32, 2, (int64_t[]){1, 2}, 1e19);
    nt_tensor *w = nt_full(NT_F32, 2, (int64_t[]){2, 2}, 1e19);
    nt_tensor *b = nt_full(NT_F32, 1, (int64_t[]){2}, 3e38);
    int line = __LINE__ + 1;
    nt_tensor *y = nt_linear(x, w, b); /* 2e38 + 3e38 overflows in the add */
    float out[2];
    assert_int_equal(nt_to_host(y, out, sizeof out), NT_ENAN);
    assert_has(nt_last_error_message(), "nt_add (in nt_linear at ");
    assert_has(nt_last_error_message(), at_line(line));
    nt_clear_error();
    nt_sync();
    nt_clear_error();
}

/* An op of a backward names the forward op and its line. */
static void test_provenance_backward(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    float xv[3] = {4, 0, 1};
    nt_tensor *x = vec(xv, 3);
    nt_set_requires_grad(x, true);
    int line = __LINE__ + 1;
    nt_tensor *y = nt_sqrt(x); /* fine forward; d/dx = 1/(2 sqrt x) = inf at 0 */
    assert_int_equal(nt_backward(nt_sum(y, NT_DIM_ALL, false)), 0);
    nt_tensor *g = nt_grad(x);
    assert_non_null(g);
    float out[3];
    assert_int_equal(nt_to_host(g, out, sizeof out), NT_ENAN);
    const char *m = nt_last_error_message();
    assert_has(m, "in the backward of nt_sqrt at ");
    assert_has(m, at_line(line));
    assert_has(m, "produced Inf at element 1");
    nt_release(g);
    nt_clear_error();
    nt_sync();
    nt_clear_error();
}

/* ---------------- deterministic mode ---------------- */

static void test_deterministic_ready_on_return(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_DETERMINISTIC", "1"), 0);
    float av[3] = {1, 2, 3}, bv[3] = {10, 20, 30};
    nt_tensor *a = vec(av, 3), *b = vec(bv, 3);
    nt_tensor *c = nt_add(a, b);
    /* done before any sync: its writer has completed and the data is there */
    assert_true(nt__packed_done(AO_load(&c->st->last_write)));
    const float *d = nt__tensor_data(c);
    assert_true(d[0] == 11 && d[1] == 22 && d[2] == 33);
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.syncs, 0);
    assert_int_equal(nt_config_set("NT_DETERMINISTIC", "0"), 0);
}

/* ---------------- NT_TRACE ---------------- */

static void test_trace_file(void **state)
{
    (void)state;
    char path[] = "/tmp/nt_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    nt_shutdown();
    setenv("NT_TRACE", path, 1);
    assert_int_equal(nt_init(), 0);
    float xv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    nt_tensor *x = vec(xv, 8);
    nt_sync();
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *y = nt_keep(nt_exp(nt_mul_scalar(nt_add(x, x), 0.5))); /* one fused kernel */
    nt_tensor *s = nt_keep(nt_sum(y, 0, false));                        /* a break */
    nt_scope_end(sc);
    double v;
    assert_int_equal(nt_item(s, &v), 0);
    nt_release(y);
    nt_release(s);
    nt_shutdown(); /* closes the trace */
    unsetenv("NT_TRACE");
    assert_int_equal(nt_init(), 0);

    char *text = NULL;
    assert_true(g_file_get_contents(path, &text, NULL, NULL));
    unlink(path);
    assert_true(nt_test_json_ok(text)); /* one JSON value, nothing after it */
    /* the two processes */
    assert_has(text, "\"name\":\"process_name\",\"args\":{\"name\":\"host\"}");
    assert_has(text, "NeuronCore (simulated)");
    /* host: an enqueue with its call site, the sync wait, the fused kernel
     * with its ops and counts, the break with its reason, kernel spans on
     * the worker's track */
    assert_has(text, "{\"ph\":\"i\",\"s\":\"t\",\"pid\":2");
    assert_has(text, "\"name\":\"nt_add\"");
    assert_has(text, "\"site\":\"");
    assert_has(text, "test_debug.c:");
    assert_has(text, "\"name\":\"sync: nt_item\"");
    assert_has(text, "\"waited_for\":\"nt-stream-default seq ");
    assert_has(text, "fused elementwise kernel #");
    assert_has(text, "\"written\":1,\"elided\":2");
    assert_has(text, "\"name\":\"fusion break\"");
    assert_has(text, "\"reason\":\"sum is not fusable\"");
    assert_has(text, "worker of nt-stream-default");
    assert_has(text, "\"name\":\"main thread\"");
    /* the simulator's engines */
    assert_has(text, "\"pid\":1");
    g_free(text);
}

/* NT_TRACE_LEVEL and NT_TRACE_STEPS: three SGD steps, each with an op of
 * its own (exp, tanh, sigmoid); a window of step 1 at `level` holds tanh's
 * events and none of the others'.  Returns the file's text (g_free). */
static char *trace_steps(const char *level, const char *steps)
{
    char path[] = "/tmp/nt_trace_steps_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    nt_shutdown();
    setenv("NT_TRACE", path, 1);
    setenv("NT_TRACE_LEVEL", level, 1);
    setenv("NT_TRACE_STEPS", steps, 1);
    assert_int_equal(nt_init(), 0);
    float wv[4] = {0.5f, -1, 2, 0.25f};
    nt_tensor *w = vec(wv, 4);
    nt_set_requires_grad(w, true);
    nt_optim *opt = nt_optim_sgd(&w, 1, 0.1, 0, 0, false);
    assert_non_null(opt);
    nt_tensor *(*const f[3])(nt_tensor *) = {nt_exp, nt_tanh, nt_sigmoid};
    for (int s = 0; s < 3; s++) {
        nt_scope *sc = nt_scope_begin();
        assert_int_equal(nt_backward(nt_sum(f[s](w), NT_DIM_ALL, false)), 0);
        assert_int_equal(nt_optim_step(opt), 0);
        assert_int_equal(nt_optim_zero_grad(opt), 0);
        nt_scope_end(sc);
    }
    nt_optim_destroy(opt);
    nt_release(w);
    nt_shutdown(); /* closes the trace */
    unsetenv("NT_TRACE");
    unsetenv("NT_TRACE_LEVEL");
    unsetenv("NT_TRACE_STEPS");
    assert_int_equal(nt_init(), 0);
    char *text = NULL;
    assert_true(g_file_get_contents(path, &text, NULL, NULL));
    unlink(path);
    assert_true(nt_test_json_ok(text));
    return text;
}

static void test_trace_steps_levels(void **state)
{
    (void)state;
    static const char *const levels[] = {"host", "fusion", "kernel", "instruction"};
    size_t len[4];
    for (int l = 0; l < 4; l++) {
        char *t = trace_steps(levels[l], "1:2");
        len[l] = strlen(t);
        /* the window: step 1's op only (its name on the host's enqueue) */
        assert_has(t, "\"name\":\"nt_tanh\"");
        assert_null(strstr(t, "\"name\":\"nt_exp\""));
        assert_null(strstr(t, "\"name\":\"nt_sigmoid\""));
        /* the simulator's kernels from kernel on, its engines' instructions
         * only at instruction */
        assert_true((strstr(t, "\"hbm_read\"") != NULL) == (l >= 2));
        assert_true((strstr(t, "\"cycles\"") != NULL) == (l == 3));
        if (l)
            assert_true(len[l] > len[l - 1]);
        g_free(t);
    }
    /* "1": the one step 1, as 1:2; "2:" from step 2 on: sigmoid, not tanh */
    char *t = trace_steps("kernel", "1");
    assert_has(t, "\"name\":\"nt_tanh\"");
    assert_null(strstr(t, "\"name\":\"nt_exp\""));
    assert_null(strstr(t, "\"name\":\"nt_sigmoid\""));
    g_free(t);
    t = trace_steps("host", "2:");
    assert_has(t, "\"name\":\"nt_sigmoid\"");
    assert_null(strstr(t, "\"name\":\"nt_tanh\""));
    g_free(t);
}

/* Bad NT_TRACE_LEVEL / NT_TRACE_STEPS values fail nt_init naming the
 * variable and what it takes; after nt_init they cannot be set. */
static void test_trace_filter_bad(void **state)
{
    (void)state;
    static const char *const bad[][2] = {
        {"NT_TRACE_LEVEL", "verbose"}, {"NT_TRACE_LEVEL", ""},   {"NT_TRACE_STEPS", "3:2"},
        {"NT_TRACE_STEPS", "2:2"},     {"NT_TRACE_STEPS", "-1:4"}, {"NT_TRACE_STEPS", "a:b"},
        {"NT_TRACE_STEPS", ":4"},      {"NT_TRACE_STEPS", "1:2:3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        nt_shutdown();
        setenv(bad[i][0], bad[i][1], 1);
        assert_int_equal(nt_init(), NT_EINVAL);
        assert_has(nt_last_error_message(), bad[i][0]);
        assert_has(nt_last_error_message(), "expected");
        unsetenv(bad[i][0]);
    }
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_TRACE_LEVEL", "host"), NT_EINVAL);
    assert_has(nt_last_error_message(), "only be set before nt_init");
    assert_int_equal(nt_config_set("NT_TRACE_STEPS", "1:2"), NT_EINVAL);
}

/* ---------------- NT_STATS ---------------- */

static void test_stats_summary(void **state)
{
    (void)state;
    nt_shutdown();
    setenv("NT_STATS", "1", 1);
    assert_int_equal(nt_init(), 0);
    float xv[4] = {1, 2, 3, 4};
    nt_tensor *x = vec(xv, 4);
    nt_sync();
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    nt_tensor *y = nt_relu(nt_add_scalar(nt_mul_scalar(x, 2.0), 1.0));
    float out[4];
    assert_int_equal(nt_to_host(y, out, sizeof out), 0);

    char path[] = "/tmp/nt_stats_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    nt_shutdown();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    unsetenv("NT_STATS");
    char *text = NULL;
    assert_true(g_file_get_contents(path, &text, NULL, NULL));
    unlink(path);
    assert_has(text, "ntensor stats:\n");
    assert_has(text, "  ops         3 enqueued, 3 executed, 0 skipped (poisoned input)\n");
    assert_has(text, "  kernels     1 run: 1 fused running 3 ops (3.0 ops/kernel), 0 single ops");
    assert_has(text, "kernel cache 0 hits, 1 misses");
    assert_has(text, "  syncs       2, ");
    assert_has(text, " ms waiting");
    assert_has(text, "  host        16 B to host, 16 B from host\n");
    assert_has(text, "  device      peak ");
    assert_has(text, "  simulator   ");
    assert_has(text, " ms simulated (host ");
    assert_has(text, "  utilisation TensorE ");
    g_free(text);
    assert_int_equal(nt_init(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nan_unfused_cpu, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan_unfused_sim, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan_carried_not_blamed, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan_fused_cpu, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan_fused_sim, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan_fused_elided_inf, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan_fused_inplace, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_provenance_kernel_error, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_provenance_sim_rule, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_provenance_device_memory, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_provenance_composite, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_provenance_backward, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_deterministic_ready_on_return, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_file, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_steps_levels, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_filter_bad, nt_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_summary, nt_test_setup, teardown),
    };
    return cmocka_run_group_tests_name("debug", tests, NULL, NULL);
}
