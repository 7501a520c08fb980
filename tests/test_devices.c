/* tests/test_devices.c - several simulated NeuronCores in one process
 * (NT_SIM_CORES): devices, streams and tensors on them, the device check
 * at the call, copies between devices, per-core simulator state running
 * concurrently, and the same bits on every device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <glib.h>

#include "core/internal.h"
#include "sim/sim.h"
#include "streams/stream.h"
#include "nt_test.h"

/* A runtime with `cores` devices on `backend` ("sim" or "cpu"). */
static void init_with(int cores, const char *backend)
{
    char v[16];
    snprintf(v, sizeof v, "%d", cores);
    setenv("NT_SIM_CORES", v, 1);
    setenv("NT_BACKEND", backend, 1);
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
}

static void done(void)
{
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
    unsetenv("NT_BACKEND");
}

static nt_tensor *fvec(int n, float start, float step)
{
    float buf[4096];
    for (int i = 0; i < n; i++)
        buf[i] = start + step * (float)i;
    return nt_from_host(buf, NT_F32, 1, (int64_t[]){n});
}

/* ---------------- the API ---------------- */

static void devices_basics(const char *backend)
{
    init_with(4, backend);
    assert_int_equal(nt_device_count(), 4);
    assert_int_equal(nt_device_current(), 0);
    assert_ptr_equal(nt_stream_default_on(0), nt_stream_default());
    for (int d = 0; d < 4; d++) {
        nt_stream *s = nt_stream_default_on(d);
        assert_non_null(s);
        assert_int_equal(nt_stream_device(s), d);
        for (int e = 0; e < d; e++)
            assert_ptr_not_equal(nt_stream_default_on(e), s);
    }
    assert_int_equal(nt_device_set(2), 0);
    assert_int_equal(nt_device_current(), 2);
    assert_ptr_equal(nt_stream_current(), nt_stream_default_on(2));
    /* new tensors and streams go on the current device */
    nt_tensor *x = fvec(8, 1, 1);
    assert_int_equal(nt_tensor_device(x), 2);
    nt_tensor *y = nt_mul_scalar(x, 2);
    assert_int_equal(nt_tensor_device(y), 2);
    nt_tensor *z = nt_zeros(NT_F32, 1, (int64_t[]){3});
    assert_int_equal(nt_tensor_device(z), 2);
    nt_stream *s = nt_stream_create();
    assert_int_equal(nt_stream_device(s), 2);
    nt_stream *s3 = nt_stream_create_on(3);
    assert_int_equal(nt_stream_device(s3), 3);
    /* a view is an op like any other: on its tensor's device */
    assert_int_equal(nt_device_set(1), 0);
    assert_null(nt_reshape(y, 2, (int64_t[]){2, 4}));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_device_set(2), 0);
    nt_tensor *v = nt_reshape(y, 2, (int64_t[]){2, 4});
    assert_int_equal(nt_tensor_device(v), 2);
    float out[8];
    assert_int_equal(nt_to_host(y, out, sizeof out), 0);
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == 2.0f * (float)(i + 1));
    assert_int_equal(nt_stream_destroy(s), 0);
    assert_int_equal(nt_stream_destroy(s3), 0);
    nt_release(v);
    nt_release(x);
    nt_release(y);
    nt_release(z);
    nt_device_set(0);
    done();
}

static void test_basics_sim(void **state)
{
    (void)state;
    devices_basics("sim");
}

static void test_basics_cpu(void **state)
{
    (void)state;
    devices_basics("cpu");
}

/* One device is exactly the runtime as it was. */
static void test_default_one_device(void **state)
{
    (void)state;
    unsetenv("NT_SIM_CORES");
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_device_count(), 1);
    assert_int_equal(nt_device_current(), 0);
    assert_int_equal(nt_sim_init(), 0);
    assert_int_equal(nt__sim_core_count(), 1);
    nt_shutdown();
}

/* ---------------- errors ---------------- */

static void test_bad_device_index(void **state)
{
    (void)state;
    init_with(2, "sim");
    int bad[] = {-1, 2, 64, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nt_clear_error();
        assert_int_equal(nt_device_set(bad[i]), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), "nt_device_set"));
        assert_non_null(strstr(nt_last_error_message(), "argument 'dev'"));
        assert_int_equal(nt_device_current(), 0);
        nt_clear_error();
        assert_null(nt_stream_default_on(bad[i]));
        assert_int_equal(nt_last_error(), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), "nt_stream_default_on"));
        nt_clear_error();
        assert_null(nt_stream_create_on(bad[i]));
        assert_int_equal(nt_last_error(), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), "nt_stream_create_on"));
    }
    nt_clear_error();
    assert_int_equal(nt_stream_device(NULL), -1);
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nt_stream_device"));
    nt_clear_error();
    assert_int_equal(nt_tensor_device(NULL), -1);
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nt_tensor_device"));
    /* a default stream of any device stays */
    nt_clear_error();
    assert_int_equal(nt_stream_destroy(nt_stream_default_on(1)), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "device 1's default stream"));
    done();
}

static void test_bad_core_count(void **state)
{
    (void)state;
    const char *bad[] = {"0", "65", "-1", "two", "1.5", " 2", "100000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("NT_SIM_CORES", bad[i], 1);
        nt_clear_error();
        assert_int_equal(nt_init(), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), "NT_SIM_CORES"));
        nt_shutdown();
        /* the standalone simulator refuses it too */
        nt_clear_error();
        assert_int_equal(nt_sim_init(), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), "NT_SIM_CORES"));
    }
    setenv("NT_SIM_CORES", "64", 1);
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_device_count(), 64);
    assert_string_equal(nt_config_get("NT_SIM_CORES"), "64");
    /* only before nt_init */
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_SIM_CORES", "2"), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "before nt_init"));
    assert_int_equal(nt_device_count(), 64);
    done();
}

/* An op with an input on another device than its stream's: NT_EINVAL at
 * the call naming the function, the argument and both devices; nothing is
 * queued. */
static void wrong_device(const char *backend)
{
    init_with(2, backend);
    nt_tensor *a = fvec(16, 0, 1);        /* device 0 */
    nt_device_set(1);
    nt_tensor *b = fvec(16, 1, 0.5f);     /* device 1 */
    assert_int_equal(nt_sync(), 0);
    uint64_t before = NT__COUNTER(ops_enqueued);
    nt_clear_error();
    assert_null(nt_add(a, b));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    const char *m = nt_last_error_message();
    assert_non_null(strstr(m, "nt_add"));
    assert_non_null(strstr(m, "argument 'a'"));
    assert_non_null(strstr(m, "device 0"));
    assert_non_null(strstr(m, "device 1"));
    nt_clear_error();
    nt_tensor *b2 = nt_reshape(b, 2, (int64_t[]){4, 4});
    nt_device_set(0);
    nt_tensor *a2 = nt_reshape(a, 2, (int64_t[]){4, 4});
    assert_null(nt_matmul(a2, b2));
    assert_non_null(strstr(nt_last_error_message(), "argument 'b'"));
    assert_non_null(strstr(nt_last_error_message(), "nt_matmul"));
    nt_release(a2);
    nt_release(b2);
    /* in place: the destination on another device */
    nt_clear_error();
    assert_int_equal(nt_add_inplace(b, a), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nt_add_inplace"));
    assert_int_equal(NT__COUNTER(ops_enqueued), before);
    /* the right device works, and nothing above left anything behind */
    nt_device_set(1);
    nt_tensor *c = nt_add(b, b);
    assert_non_null(c);
    float out[16];
    assert_int_equal(nt_to_host(c, out, sizeof out), 0);
    for (int i = 0; i < 16; i++)
        assert_true(out[i] == 2.0f * (1.0f + 0.5f * (float)i));
    nt_release(a);
    nt_release(b);
    nt_release(c);
    nt_device_set(0);
    done();
}

static void test_wrong_device_sim(void **state)
{
    (void)state;
    wrong_device("sim");
}

static void test_wrong_device_cpu(void **state)
{
    (void)state;
    wrong_device("cpu");
}

/* Destroying a stream of a non-zero device: its work ran, and a thread
 * whose current stream it was goes back to that device's default. */
static void test_destroy_nonzero(void **state)
{
    (void)state;
    init_with(3, "sim");
    nt_stream *s = nt_stream_create_on(2);
    assert_int_equal(nt_stream_set_current(s), 0);
    nt_tensor *x = fvec(64, 0, 1);
    nt_tensor *y = nt_mul_scalar(x, 3);
    assert_int_equal(nt_tensor_device(y), 2);
    assert_int_equal(nt_stream_destroy(s), 0);
    assert_int_equal(nt_device_current(), 2);
    assert_ptr_equal(nt_stream_current(), nt_stream_default_on(2));
    nt_tensor *z = nt_add_scalar(y, 1);
    float out[64];
    assert_int_equal(nt_to_host(z, out, sizeof out), 0);
    for (int i = 0; i < 64; i++)
        assert_true(out[i] == 3.0f * (float)i + 1.0f);
    nt_release(x);
    nt_release(y);
    nt_release(z);
    nt_device_set(0);
    done();
}


/* ---------------- copies between devices ---------------- */

static void to_device(const char *backend, const char *mode)
{
    init_with(3, backend);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){32, 24}, 5); /* device 0 */
    nt_tensor *x2 = nt_mul_scalar(x, 0.5);
    /* copied onto device 2 from device 0's stream, used there */
    nt_tensor *y = nt_to_device(x2, 2);
    assert_non_null(y);
    assert_int_equal(nt_tensor_device(y), 2);
    assert_int_equal(nt_tensor_device(x2), 0);
    nt_device_set(2);
    nt_tensor *z = nt_exp(y);
    /* and back, onto device 1, from device 2's stream */
    nt_tensor *w = nt_to_device(z, 1);
    assert_int_equal(nt_tensor_device(w), 1);
    nt_device_set(0);
    nt_tensor *ze = nt_exp(x2);
    float a[32 * 24], b[32 * 24], c[32 * 24];
    assert_int_equal(nt_to_host(x2, a, sizeof a), 0);
    assert_int_equal(nt_to_host(y, b, sizeof b), 0);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(nt_to_host(w, b, sizeof b), 0);
    assert_int_equal(nt_to_host(ze, c, sizeof c), 0);
    assert_memory_equal(b, c, sizeof b);
    /* dtype and shape kept */
    nt_tensor *h = nt_cast(x, NT_BF16);
    nt_tensor *h1 = nt_to_device(h, 1);
    assert_int_equal(nt_dtype_of(h1), NT_BF16);
    assert_int_equal(nt_ndim(h1), 2);
    /* bad input */
    nt_clear_error();
    assert_null(nt_to_device(x, 3));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nt_to_device"));
    assert_non_null(strstr(nt_last_error_message(), "argument 'dev' is 3"));
    nt_clear_error();
    assert_null(nt_to_device(x, -1));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    nt_clear_error();
    assert_null(nt_to_device(NULL, 1));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "argument 't'"));
    nt_tensor *all[] = {x, x2, y, z, w, ze, h, h1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        nt_release(all[i]);
    done();
}

static void test_to_device_sim(void **state)
{
    (void)state;
    to_device("sim", "adaptive");
    to_device("sim", "deterministic");
    to_device("sim", "lazy");
}

static void test_to_device_cpu(void **state)
{
    (void)state;
    to_device("cpu", "adaptive");
}

/* The gradient of a program that crosses devices equals the one-device
 * program's, bit for bit: nt_to_device's backward copies it back. */
static void grad_program(bool cross, float *gx)
{
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){16, 12}, 9);
    nt_set_requires_grad(x, true);
    nt_tensor *w = nt_randn(NT_F32, 2, (int64_t[]){12, 8}, 10);
    nt_tensor *h = nt_tanh(x);
    nt_tensor *hh = h, *ww = w;
    if (cross) {
        hh = nt_to_device(h, 1);
        ww = nt_to_device(w, 1);
        nt_device_set(1);
    }
    nt_tensor *m = nt_matmul(hh, ww);
    nt_tensor *l = nt_mean(nt_mul(m, m), NT_DIM_ALL, false);
    nt_device_set(0);
    assert_int_equal(nt_backward(l), 0);
    nt_tensor *g = nt_grad(x);
    assert_non_null(g);
    assert_int_equal(nt_tensor_device(g), 0);
    assert_int_equal(nt_to_host(g, gx, 16 * 12 * sizeof(float)), 0);
}

static void test_to_device_grad(void **state)
{
    (void)state;
    static float g1[16 * 12], g2[16 * 12];
    init_with(2, "sim");
    nt_scope *sc = nt_scope_begin();
    grad_program(false, g1);
    nt_scope_end(sc);
    sc = nt_scope_begin();
    grad_program(true, g2);
    nt_scope_end(sc);
    assert_memory_equal(g1, g2, sizeof g1);
    done();
}

/* ---------------- same bits, concurrency ---------------- */

/* A small program: matmul, softmax, layer norm, a reduction, on whatever
 * device is current; returns its outputs' bytes (n floats). */
static void program(float *out, int n)
{
    nt_tensor *a = nt_randn(NT_F32, 2, (int64_t[]){48, 64}, 11);
    nt_tensor *b = nt_randn(NT_F32, 2, (int64_t[]){64, 40}, 12);
    nt_tensor *m = nt_matmul(a, b);
    nt_tensor *sm = nt_softmax(m, -1);
    nt_tensor *ln = nt_layer_norm(sm, NULL, NULL, 1e-5);
    nt_tensor *g = nt_gelu(ln);
    nt_tensor *s = nt_sum(g, 0, false);
    assert_non_null(s);
    assert_int_equal(nt_tensor_device(s), nt_device_current());
    assert_int_equal(nt_to_host(g, out, (size_t)(n - 40) * sizeof(float)), 0);
    assert_int_equal(nt_to_host(s, out + (n - 40), 40 * sizeof(float)), 0);
    nt_tensor *all[] = {a, b, m, sm, ln, g, s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        nt_release(all[i]);
}

#define PROG_N (48 * 40 + 40)

static void same_bits(const char *backend, const char *mode)
{
    init_with(4, backend);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    static float ref[PROG_N], got[PROG_N];
    program(ref, PROG_N);
    for (int d = 1; d < 4; d++) {
        assert_int_equal(nt_device_set(d), 0);
        memset(got, 0, sizeof got);
        program(got, PROG_N);
        assert_memory_equal(ref, got, sizeof ref);
    }
    nt_device_set(0);
    done();
}

static void test_same_bits_sim(void **state)
{
    (void)state;
    same_bits("sim", "adaptive");
    same_bits("sim", "deterministic");
    same_bits("sim", "eager");
}

static void test_same_bits_cpu(void **state)
{
    (void)state;
    same_bits("cpu", "adaptive");
}

/* Every device runs the same program at once from its own host thread:
 * the values are device 0's alone, and every core's clock moved by the
 * same simulated time (each core's timeline is its own).  In lazy mode, so
 * each run is the same kernels: an adaptive batch is what queued while the
 * worker was busy. */
typedef struct dev_job {
    int dev;
    float out[PROG_N];
} dev_job;

static gpointer dev_thread(gpointer p)
{
    dev_job *j = p;
    nt_device_set(j->dev);
    for (int r = 0; r < 3; r++)
        program(j->out, PROG_N);
    return NULL;
}

static void test_concurrent_devices(void **state)
{
    (void)state;
    init_with(4, "sim");
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    static float ref[PROG_N];
    program(ref, PROG_N); /* device 0, alone */
    assert_int_equal(nt_sync(), 0);
    double c0 = nt__sim_core_clock(0);
    assert_true(c0 > 0);
    for (int d = 1; d < 4; d++)
        assert_true(nt__sim_core_clock(d) == 0.0);
    static dev_job jobs[3];
    GThread *th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i].dev = i + 1;
        th[i] = g_thread_new("dev", dev_thread, &jobs[i]);
    }
    for (int i = 0; i < 3; i++)
        g_thread_join(th[i]);
    assert_int_equal(nt_sync(), 0);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(ref, jobs[i].out, sizeof ref);
    /* three runs each on cores 1..3, one on core 0 */
    assert_true(nt__sim_core_clock(0) == c0);
    double c1 = nt__sim_core_clock(1);
    assert_true(c1 > 2.5 * c0 && c1 < 3.5 * c0);
    for (int d = 2; d < 4; d++)
        assert_true(nt__sim_core_clock(d) == c1);
    done();
}

/* Two cores run kernels at once: a kernel open on core 0 does not stop one
 * on core 1 from beginning and ending (one lock for all cores would make
 * this wait forever). */
typedef struct open_job {
    int core;
    int rc;
} open_job;

static gpointer open_kernel(gpointer p)
{
    open_job *j = p;
    nt__sim_thread_core_set(j->core);
    nt_sim_kernel *k = nt_sim_kernel_begin("other core");
    j->rc = k ? nt_sim_kernel_end(k, NULL) : -1;
    return NULL;
}

static void test_cores_run_at_once(void **state)
{
    (void)state;
    setenv("NT_SIM_CORES", "2", 1);
    assert_int_equal(nt_sim_init(), 0);
    assert_int_equal(nt__sim_core_count(), 2);
    nt__sim_thread_core_set(0);
    nt_sim_kernel *k = nt_sim_kernel_begin("core 0");
    assert_non_null(k);
    open_job j = {1, -2};
    GThread *t = g_thread_new("core1", open_kernel, &j);
    g_thread_join(t); /* returns while core 0's kernel is still open */
    assert_int_equal(j.rc, 0);
    assert_int_equal(nt_sim_kernel_end(k, NULL), 0);
    nt_sim_shutdown();
    unsetenv("NT_SIM_CORES");
}

/* Per-core statistics: each device's own kernels and clock; the totals
 * add them; bad index and NULL are errors.  In lazy mode: an adaptive batch
 * is what queued while the worker was busy, so the kernels a run of the
 * program takes (and their time) would depend on timing. */
static void test_device_stats(void **state)
{
    (void)state;
    init_with(2, "sim");
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    nt_sim_stats_reset();
    static float out[PROG_N];
    program(out, PROG_N);
    nt_device_set(1);
    program(out, PROG_N);
    program(out, PROG_N);
    nt_device_set(0);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats s0, s1, all;
    assert_int_equal(nt_device_stats_get(0, &s0), 0);
    assert_int_equal(nt_device_stats_get(1, &s1), 0);
    assert_int_equal(nt_sim_stats_get(&all), 0);
    assert_true(s0.kernels > 0);
    assert_int_equal(s1.kernels, 2 * s0.kernels);
    assert_int_equal(all.kernels, s0.kernels + s1.kernels);
    assert_true(s1.sim_ns == 2 * s0.sim_ns);
    assert_true(s0.clock_ns == nt__sim_core_clock(0));
    assert_true(s1.clock_ns == nt__sim_core_clock(1));
    assert_true(all.clock_ns == (s0.clock_ns > s1.clock_ns ? s0.clock_ns : s1.clock_ns));
    assert_true(all.flops == s0.flops + s1.flops);
    nt_clear_error();
    assert_int_equal(nt_device_stats_get(2, &s0), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nt_device_stats_get"));
    assert_non_null(strstr(nt_last_error_message(), "argument 'dev' is 2"));
    assert_int_equal(nt_device_stats_get(-1, &s0), NT_EINVAL);
    assert_int_equal(nt_device_stats_get(0, NULL), NT_EINVAL);
    nt_sim_stats_reset();
    assert_int_equal(nt_device_stats_get(1, &s1), 0);
    assert_int_equal(s1.kernels, 0);
    assert_true(s1.clock_ns == nt__sim_core_clock(1)); /* the clock stays */
    done();
}

/* Each device has NT_HBM_BYTES of its own: one full device does not stop
 * another, and the error names the device that is full. */
static void hbm_per_device(const char *backend)
{
    setenv("NT_HBM_BYTES", "1M", 1);
    init_with(2, backend);
    int64_t big[] = {200 * 1024}; /* 800 KiB of f32 */
    nt_tensor *a = nt_zeros(NT_F32, 1, big);
    assert_non_null(a);
    nt_device_set(1);
    nt_tensor *b = nt_zeros(NT_F32, 1, big); /* device 1: room of its own */
    assert_non_null(b);
    assert_int_equal(nt_tensor_device(b), 1);
    nt_clear_error();
    nt_tensor *c = nt_zeros(NT_F32, 1, big); /* device 1 is full now */
    assert_null(c);
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    assert_non_null(strstr(nt_last_error_message(), "device 1's memory"));
    nt_device_set(0);
    nt_clear_error();
    assert_null(nt_ones(NT_F32, 1, big));
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    assert_non_null(strstr(nt_last_error_message(), "device 0's memory"));
    /* a copy goes to the device it names: the full one refuses it */
    nt_clear_error();
    assert_null(nt_to_device(a, 1));
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    assert_non_null(strstr(nt_last_error_message(), "device 1's memory"));
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    assert_true(st.device_bytes_in_use >= 2 * 800 * 1024);
    /* freeing device 1's tensor makes room there only */
    nt_release(b);
    assert_int_equal(nt_sync(), 0);
    nt_clear_error();
    nt_tensor *d = nt_to_device(a, 1);
    assert_non_null(d);
    assert_int_equal(nt_tensor_device(d), 1);
    float v[4];
    nt_device_set(1); /* a view is an op on its tensor's device */
    nt_tensor *h = nt_slice(d, 0, 0, 4, 1);
    nt_device_set(0);
    assert_int_equal(nt_to_host(h, v, sizeof v), 0);
    for (int i = 0; i < 4; i++)
        assert_true(v[i] == 0.0f);
    nt_release(h);
    nt_release(a);
    nt_release(d);
    done();
    unsetenv("NT_HBM_BYTES");
}

static void test_hbm_per_device_sim(void **state)
{
    (void)state;
    hbm_per_device("sim");
}

static void test_hbm_per_device_cpu(void **state)
{
    (void)state;
    hbm_per_device("cpu");
}

/* A kernel starts no earlier than what it reads is ready: a tensor copied
 * to device 1 at the end of a long stretch on core 0 holds up core 1's
 * kernel that reads it until then, on core 1's clock. */
static void test_ready_time_orders_cores(void **state)
{
    (void)state;
    init_with(2, "sim");
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    nt_tensor *a = nt_randn(NT_F32, 2, (int64_t[]){128, 128}, 3);
    nt_tensor *x = nt_retain(a);
    for (int i = 0; i < 20; i++) {
        nt_tensor *y = nt_tanh(nt_matmul(x, a));
        nt_release(x);
        x = y;
    }
    nt_tensor *c = nt_to_device(x, 1); /* on core 0, at the end of its work */
    assert_int_equal(nt_sync(), 0);
    double t0 = nt__sim_core_clock(0);
    assert_true(nt__sim_core_clock(1) == 0.0);
    assert_true(nt__storage_ready_get(c->st) == t0);
    nt_device_set(1);
    nt_tensor *e = nt_exp(c);
    assert_int_equal(nt_sync(), 0);
    double t1 = nt__sim_core_clock(1);
    assert_true(t1 > t0);
    assert_true(nt__storage_ready_get(e->st) == t1);
    /* without a dependency core 1 starts at its own clock */
    nt_tensor *f = nt_full(NT_F32, 1, (int64_t[]){8}, 1.0);
    assert_int_equal(nt_sync(), 0);
    nt_sim_stats s1;
    assert_int_equal(nt_device_stats_get(1, &s1), 0);
    /* f's kernel began at t1: the clock moved by no more than its kernels */
    assert_true(nt__sim_core_clock(1) > t1);
    assert_true(nt__sim_core_clock(1) - t1 <= s1.sim_ns);
    nt_device_set(0);
    nt_tensor *all[] = {a, x, c, e, f};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        nt_release(all[i]);
    done();
}

/* The trace has a track group per core, named, with its kernels in it. */
static void test_trace_per_core(void **state)
{
    (void)state;
    char path[] = "/tmp/nt_test_devices_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    setenv("NT_TRACE", path, 1);
    init_with(3, "sim");
    for (int d = 0; d < 3; d++) {
        nt_device_set(d);
        nt_tensor *x = nt_full(NT_F32, 1, (int64_t[]){64}, d);
        nt_tensor *y = nt_exp(x);
        assert_int_equal(nt_sync(), 0);
        nt_release(x);
        nt_release(y);
    }
    nt_device_set(0);
    done();
    unsetenv("NT_TRACE");
    gchar *text = NULL;
    assert_true(g_file_get_contents(path, &text, NULL, NULL));
    assert_non_null(strstr(text, "\"NeuronCore (simulated)\""));
    assert_non_null(strstr(text, "\"NeuronCore 1 (simulated)\""));
    assert_non_null(strstr(text, "\"NeuronCore 2 (simulated)\""));
    char pid[32];
    for (int c = 1; c < 3; c++) {
        snprintf(pid, sizeof pid, "\"pid\":%d", nt__sim_trace_pid(c));
        assert_non_null(strstr(text, pid));
    }
    assert_int_equal(nt__sim_trace_pid(0), 1);
    g_free(text);
    unlink(path);
}

/* Handles that are no longer live: a clear error, not a crash. */
static void test_dead_handles(void **state)
{
    (void)state;
    init_with(2, "sim");
    nt_stream *s = nt_stream_create_on(1);
    assert_int_equal(nt_stream_destroy(s), 0);
    nt_clear_error();
    assert_int_equal(nt_stream_device(s), -1);
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "a stream that was already destroyed"));
    nt_tensor *x = nt_zeros(NT_F32, 1, (int64_t[]){4});
    nt_release(x);
    nt_clear_error();
    assert_int_equal(nt_tensor_device(x), -1);
    assert_int_equal(nt_last_error(), NT_ERELEASED);
    done();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_one_device),
        cmocka_unit_test(test_basics_sim),
        cmocka_unit_test(test_basics_cpu),
        cmocka_unit_test(test_bad_device_index),
        cmocka_unit_test(test_bad_core_count),
        cmocka_unit_test(test_wrong_device_sim),
        cmocka_unit_test(test_wrong_device_cpu),
        cmocka_unit_test(test_destroy_nonzero),
        cmocka_unit_test(test_to_device_sim),
        cmocka_unit_test(test_to_device_cpu),
        cmocka_unit_test(test_to_device_grad),
        cmocka_unit_test(test_same_bits_sim),
        cmocka_unit_test(test_same_bits_cpu),
        cmocka_unit_test(test_concurrent_devices),
        cmocka_unit_test(test_cores_run_at_once),
        cmocka_unit_test(test_device_stats),
        cmocka_unit_test(test_hbm_per_device_sim),
        cmocka_unit_test(test_hbm_per_device_cpu),
        cmocka_unit_test(test_ready_time_orders_cores),
        cmocka_unit_test(test_trace_per_core),
        cmocka_unit_test(test_dead_handles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
