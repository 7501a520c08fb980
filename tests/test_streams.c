/* tests/test_streams.c - queues, workers, modes, events, cross-stream
 * ordering, backpressure, poisoning and async error provenance. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <glib.h>

#include "internal.h"
#include "streams/stream.h"
#include "nt_test.h"

static nt_tensor *ivec(int n, int32_t start)
{
    int32_t buf[256];
    for (int i = 0; i < n; i++)
        buf[i] = start + i;
    return nt_from_host(buf, NT_I32, 1, (int64_t[]){n});
}

/* x <- x*3 + i, N times, in i32 (wrapping): the result depends on the order
 * of every step, so a lost or reordered op shows. */
static uint32_t chain_expect(uint32_t x, int n)
{
    for (int i = 0; i < n; i++)
        x = x * 3u + (uint32_t)i;
    return x;
}

static nt_tensor *chain(nt_tensor *x, int n)
{
    nt_retain(x);
    for (int i = 0; i < n; i++) {
        nt_tensor *t = nt_mul_scalar(x, 3);
        nt_tensor *y = nt_add_scalar(t, i);
        nt_release(t);
        nt_release(x);
        x = y;
    }
    return x;
}

static void check_chain(nt_tensor *x, int len, int32_t start, int n)
{
    int32_t out[256];
    assert_int_equal(nt_to_host(x, out, sizeof out), 0);
    for (int k = 0; k < len; k++)
        assert_int_equal((uint32_t)out[k], chain_expect((uint32_t)(start + k), n));
}

/* ---------------- modes ---------------- */

static void run_chain_in_mode(const char *mode)
{
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    nt_tensor *x = ivec(32, 5);
    nt_tensor *y = chain(x, 200);
    check_chain(y, 32, 5, 200);
    nt_release(x);
    nt_release(y);
}

static void test_modes_same_values(void **state)
{
    (void)state;
    run_chain_in_mode("eager");
    run_chain_in_mode("adaptive");
    run_chain_in_mode("lazy");
    run_chain_in_mode("deterministic");
    nt_config_set("NT_MODE", "adaptive");
}

static void test_deterministic_runs_inline(void **state)
{
    (void)state;
    nt_config_set("NT_DETERMINISTIC", "1");
    nt_tensor *a = ivec(4, 1);
    nt_tensor *b = nt_mul_scalar(a, 7);
    /* no sync: the value is already there when the call returns */
    assert_true(nt__packed_done(AO_load(&b->st->last_write)));
    const int32_t *d = nt__tensor_data(b);
    assert_int_equal(d[0], 7);
    assert_int_equal(d[3], 28);
    nt_release(a);
    nt_release(b);
    nt_config_set("NT_DETERMINISTIC", "0");
}

static void test_lazy_holds_until_sync(void **state)
{
    (void)state;
    nt_config_set("NT_MODE", "lazy");
    nt_config_set("NT_LAZY_WINDOW", "100000");
    nt_stats_reset();
    nt_tensor *a = ivec(8, 0);
    nt_tensor *b = chain(a, 10);
    g_usleep(20000);
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.ops_enqueued, 20);
    assert_int_equal(st.ops_executed, 0); /* held */
    check_chain(b, 8, 0, 10);
    nt_stats_get(&st);
    assert_int_equal(st.ops_executed, 20);
    /* a full window runs without a sync */
    nt_config_set("NT_LAZY_WINDOW", "8");
    nt_stats_reset();
    nt_tensor *c = chain(a, 10);
    for (int i = 0; i < 200; i++) {
        nt_stats_get(&st);
        if (st.ops_executed >= 16)
            break;
        g_usleep(5000);
    }
    assert_true(st.ops_executed >= 16);
    check_chain(c, 8, 0, 10);
    nt_release(a);
    nt_release(b);
    nt_release(c);
    nt_config_set("NT_LAZY_WINDOW", "4096");
    nt_config_set("NT_MODE", "adaptive");
}

static void test_lazy_sync_runs_only_what_it_needs(void **state)
{
    (void)state;
    /* A sync on an early tensor runs the batch up to its producer, not the
     * ops queued after it. */
    nt_config_set("NT_MODE", "lazy");
    nt_config_set("NT_LAZY_WINDOW", "100000");
    nt_stats_reset();
    nt_tensor *a = ivec(8, 0);
    nt_tensor *b = nt_mul_scalar(a, 2);
    nt_tensor *later = chain(b, 5); /* 10 more ops */
    int32_t out[8];
    assert_int_equal(nt_to_host(b, out, sizeof out), 0);
    assert_int_equal(out[7], 14);
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.ops_executed, 1);
    assert_int_equal(nt_to_host(later, out, sizeof out), 0);
    for (int k = 0; k < 8; k++)
        assert_int_equal((uint32_t)out[k], chain_expect((uint32_t)(2 * k), 5));
    nt_release(a);
    nt_release(b);
    nt_release(later);
    nt_config_set("NT_LAZY_WINDOW", "4096");
    nt_config_set("NT_MODE", "adaptive");
}

/* ---------------- concurrency ---------------- */

#define NTHREADS 4
#define NSTEPS 300

typedef struct {
    int id;
    nt_stream *own, *shared;
    int failures;
} worker_arg;

static gpointer worker(gpointer p)
{
    worker_arg *w = p;
    int32_t start = 1000 * (w->id + 1);
    /* On its own stream: an out-of-place chain and an in-place chain. */
    nt_stream_set_current(w->own);
    nt_tensor *x = ivec(64, start);
    nt_tensor *y = chain(x, NSTEPS);
    nt_tensor *z = ivec(64, start);
    for (int i = 0; i < NSTEPS; i++) {
        nt_mul_scalar_inplace(z, 3);
        nt_add_scalar_inplace(z, i);
    }
    /* On the stream every thread shares, interleaved with the others. */
    nt_stream_set_current(w->shared);
    nt_tensor *u = chain(x, NSTEPS);
    nt_stream_set_current(NULL);
    int32_t out[64];
    nt_tensor *res[3] = {y, z, u};
    for (int r = 0; r < 3; r++) {
        if (nt_to_host(res[r], out, sizeof out) != 0) {
            w->failures++;
            continue;
        }
        for (int k = 0; k < 64; k++)
            if ((uint32_t)out[k] != chain_expect((uint32_t)(start + k), NSTEPS))
                w->failures++;
    }
    nt_release(x);
    nt_release(y);
    nt_release(z);
    nt_release(u);
    return NULL;
}

static void run_threads(void)
{
    nt_stream *shared = nt_stream_create();
    worker_arg args[NTHREADS];
    GThread *th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (worker_arg){i, nt_stream_create(), shared, 0};
        th[i] = g_thread_new("test-worker", worker, &args[i]);
    }
    for (int i = 0; i < NTHREADS; i++) {
        g_thread_join(th[i]);
        assert_int_equal(args[i].failures, 0);
        assert_int_equal(nt_stream_destroy(args[i].own), 0);
    }
    assert_int_equal(nt_stream_destroy(shared), 0);
    nt_stats st;
    nt_stats_get(&st);
    assert_int_equal(st.ops_enqueued, st.ops_executed);
}

static void test_threads_own_and_shared_streams(void **state)
{
    (void)state;
    nt_stats_reset();
    run_threads();
}

static void test_threads_lazy(void **state)
{
    (void)state;
    nt_config_set("NT_MODE", "lazy");
    nt_config_set("NT_LAZY_WINDOW", "64");
    nt_stats_reset();
    run_threads();
    nt_config_set("NT_LAZY_WINDOW", "4096");
    nt_config_set("NT_MODE", "adaptive");
}

static void test_threads_deterministic(void **state)
{
    (void)state;
    nt_config_set("NT_DETERMINISTIC", "1");
    nt_stats_reset();
    run_threads();
    nt_config_set("NT_DETERMINISTIC", "0");
}

/* ---------------- events and cross-stream ordering ---------------- */

static void test_events(void **state)
{
    (void)state;
    nt_stream *a = nt_stream_create(), *b = nt_stream_create();
    nt_event *e = nt_event_create();
    assert_true(nt_event_query(e)); /* never recorded */
    nt_stream_set_current(a);
    nt_tensor *x = ivec(16, 3);
    nt_tensor *y = chain(x, 100);
    assert_int_equal(nt_event_record(e, a), 0);
    nt_stream_set_current(b);
    assert_int_equal(nt_stream_wait_event(b, e), 0);
    nt_tensor *z = nt_add_scalar(y, 1);
    assert_int_equal(nt_event_synchronize(e), 0);
    assert_true(nt_event_query(e));
    int32_t out[16];
    assert_int_equal(nt_to_host(z, out, sizeof out), 0);
    for (int k = 0; k < 16; k++)
        assert_int_equal((uint32_t)out[k], chain_expect((uint32_t)(3 + k), 100) + 1u);
    nt_stream_set_current(NULL);
    assert_int_equal(nt_stream_synchronize(a), 0);
    nt_release(x);
    nt_release(y);
    nt_release(z);
    nt_event_destroy(e);
    assert_int_equal(nt_stream_destroy(a), 0);
    assert_int_equal(nt_stream_destroy(b), 0);
}

static void test_implicit_cross_stream(void **state)
{
    (void)state;
    /* No event: reading another stream's pending output still waits for it
     * (and makes a lazy producer run). */
    nt_config_set("NT_MODE", "lazy");
    nt_config_set("NT_LAZY_WINDOW", "100000");
    nt_stream *a = nt_stream_create(), *b = nt_stream_create();
    nt_stream_set_current(a);
    nt_tensor *x = ivec(16, 1);
    nt_tensor *y = chain(x, 50);
    nt_stream_set_current(b);
    nt_tensor *z = nt_mul_scalar(y, 2);
    /* and a write on b to a tensor a still reads waits for a's reads */
    nt_stream_set_current(a);
    nt_tensor *w = nt_add_scalar(x, 0);
    nt_stream_set_current(b);
    nt_fill_inplace(x, 0);
    nt_stream_set_current(NULL);
    int32_t out[16];
    assert_int_equal(nt_to_host(z, out, sizeof out), 0);
    for (int k = 0; k < 16; k++)
        assert_int_equal((uint32_t)out[k], chain_expect((uint32_t)(1 + k), 50) * 2u);
    assert_int_equal(nt_to_host(w, out, sizeof out), 0);
    for (int k = 0; k < 16; k++)
        assert_int_equal(out[k], 1 + k);
    assert_int_equal(nt_to_host(x, out, sizeof out), 0);
    assert_int_equal(out[5], 0);
    nt_release(x);
    nt_release(y);
    nt_release(z);
    nt_release(w);
    nt_stream_destroy(a);
    nt_stream_destroy(b);
    nt_config_set("NT_LAZY_WINDOW", "4096");
    nt_config_set("NT_MODE", "adaptive");
}

static void test_stream_api_errors(void **state)
{
    (void)state;
    assert_int_equal(nt_stream_destroy(nt_stream_default()), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_stream_destroy(NULL), NT_EINVAL);
    nt_clear_error();
    nt_stream *s = nt_stream_create();
    nt_stream_set_current(s);
    assert_ptr_equal(nt_stream_current(), s);
    assert_int_equal(nt_stream_destroy(s), 0);
    /* the thread falls back to the default stream */
    assert_ptr_equal(nt_stream_current(), nt_stream_default());
    /* a destroyed stream is reported, not used */
    assert_int_equal(nt_stream_set_current(s), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_stream_synchronize(s), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_event_record(NULL, NULL), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_stream_set_current(NULL), 0);
}

static void test_backpressure(void **state)
{
    (void)state;
    nt_config_set("NT_MAX_INFLIGHT", "16");
    nt_tensor *x = ivec(4, 7);
    nt_tensor *y = chain(x, 2000);
    check_chain(y, 4, 7, 2000);
    nt_release(x);
    nt_release(y);
    nt_config_set("NT_MODE", "lazy");
    x = ivec(4, 7);
    y = chain(x, 500);
    check_chain(y, 4, 7, 500);
    nt_release(x);
    nt_release(y);
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_MAX_INFLIGHT", "65536");
}

/* ---------------- poisoning and provenance ---------------- */

static void check_provenance(const char *mode)
{
    nt_config_set("NT_MODE", mode);
    nt_stats_reset();
    float w[6] = {1, 2, 3, 4, 5, 6};
    nt_tensor *weight = nt_from_host(w, NT_F32, 2, (int64_t[]){3, 2});
    int32_t idx[2] = {1, 9};
    nt_tensor *ix = nt_from_host(idx, NT_I32, 1, (int64_t[]){2});
    int line = __LINE__ + 1;
    nt_tensor *e = nt_embedding(weight, ix);
    assert_non_null(e); /* the bad index is only seen when the op runs */
    nt_tensor *f = nt_relu(e);
    nt_tensor *g = nt_add(f, f);
    nt_tensor *ok = nt_mul_scalar(weight, 2); /* independent: unaffected */
    float out[4];
    int rc = nt_to_host(g, out, sizeof out);
    assert_int_equal(rc, NT_ERANGE);
    char want[64];
    snprintf(want, sizeof want, "test_streams.c:%d", line);
    const char *msg = nt_last_error_message();
    assert_non_null(strstr(msg, "nt_embedding"));
    assert_non_null(strstr(msg, want));
    assert_non_null(strstr(msg, "out of range"));
    assert_non_null(strstr(msg, "nt_to_host"));
    nt_clear_error();
    nt_stats st;
    nt_stats_get(&st);
    assert_true(st.ops_poisoned >= 2); /* relu and add did not run */
    float o6[6];
    assert_int_equal(nt_to_host(ok, o6, sizeof o6), 0);
    assert_true(o6[5] == 12.0f);
    /* already reported by nt_to_host: nt_sync has nothing new to say */
    assert_int_equal(nt_sync(), 0);
    /* an error nobody read is returned by the next nt_sync */
    nt_tensor *e2 = nt_embedding(weight, ix);
    int rc2 = nt_sync();
    assert_int_equal(rc2, NT_ERANGE);
    assert_non_null(strstr(nt_last_error_message(), "nt_embedding"));
    assert_non_null(strstr(nt_last_error_message(), "nt_sync"));
    nt_clear_error();
    assert_int_equal(nt_sync(), 0);
    nt_release(weight);
    nt_release(ix);
    nt_release(e);
    nt_release(f);
    nt_release(g);
    nt_release(ok);
    nt_release(e2);
    nt_config_set("NT_MODE", "adaptive");
}

static void test_async_error_provenance(void **state)
{
    (void)state;
    check_provenance("adaptive");
    check_provenance("eager");
    check_provenance("lazy");
    check_provenance("deterministic");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_modes_same_values, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_deterministic_runs_inline, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_lazy_holds_until_sync, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_lazy_sync_runs_only_what_it_needs, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_threads_own_and_shared_streams, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_threads_lazy, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_threads_deterministic, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_events, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_implicit_cross_stream, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_stream_api_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_backpressure, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_async_error_provenance, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
