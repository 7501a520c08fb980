/* tests/test_core.c - handles, references, scopes, the arena, errors, config,
 * call-site capture, lifecycle. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/internal.h"
#include "nt_test.h"

uint64_t nt__tensor_live_handles(void);

static nt_tensor *vec(int n, float start)
{
    float buf[64];
    for (int i = 0; i < n; i++)
        buf[i] = start + (float)i;
    return nt_from_host(buf, NT_F32, 1, (int64_t[]){n});
}

/* ---------------- handles and references ---------------- */

static void test_retain_release(void **state)
{
    (void)state;
    nt_tensor *t = vec(4, 0);
    assert_non_null(t);
    assert_ptr_equal(nt_retain(t), t);
    assert_int_equal(nt_release(t), 0);
    assert_int_equal(nt_ndim(t), 1); /* still held once */
    assert_int_equal(nt_release(t), 0);
    /* now released: metadata says so, ops report it */
    assert_int_equal(nt_ndim(t), -1);
    assert_int_equal(nt_numel(t), -1);
    assert_int_equal(nt_dtype_of(t), NT_DTYPE_COUNT);
    nt_clear_error();
    assert_null(nt_neg(t));
    assert_int_equal(nt_last_error(), NT_ERELEASED);
    assert_non_null(strstr(nt_last_error_message(), "nt_neg"));
    assert_non_null(strstr(nt_last_error_message(), "released"));
    nt_clear_error();
    assert_int_equal(nt_release(t), NT_ERELEASED); /* double release is reported */
    nt_clear_error();
    assert_int_equal(nt_release(NULL), 0);
}

static void test_release_while_queued(void **state)
{
    (void)state;
    /* A handle released right after the op is queued: the queued op still
     * runs on it, and the consumer's value is right. */
    nt_config_set("NT_MODE", "lazy");
    nt_tensor *a = vec(8, 1);
    nt_tensor *b = nt_mul_scalar(a, 3.0);
    nt_release(a);
    nt_tensor *c = nt_add_scalar(b, 1.0);
    nt_release(b);
    float out[8];
    assert_int_equal(nt_to_host(c, out, sizeof out), 0);
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == (float)(i + 1) * 3.0f + 1.0f);
    nt_release(c);
    nt_config_set("NT_MODE", "adaptive");
}

static void test_metadata(void **state)
{
    (void)state;
    nt_tensor *t = nt_zeros(NT_BF16, 3, (int64_t[]){2, 3, 4});
    assert_int_equal(nt_ndim(t), 3);
    assert_int_equal(nt_shape(t, 0), 2);
    assert_int_equal(nt_shape(t, -1), 4);
    assert_int_equal(nt_shape(t, 3), -1);
    assert_int_equal(nt_numel(t), 24);
    assert_int_equal(nt_dtype_of(t), NT_BF16);
    assert_int_equal(nt_stride(t, 0), 12);
    assert_true(nt_is_contiguous(t));
    nt_tensor *tt = nt_transpose(t, 0, 2);
    assert_false(nt_is_contiguous(tt));
    assert_int_equal(nt_stride(tt, 0), 1);
    assert_int_equal(nt_shape(tt, 0), 4);
    nt_tensor *s = nt_zeros(NT_F32, 0, NULL);
    assert_int_equal(nt_ndim(s), 0);
    assert_int_equal(nt_numel(s), 1);
    assert_string_equal(nt_dtype_name(NT_F16), "f16");
    assert_int_equal(nt_dtype_size(NT_BF16), 2);
    assert_int_equal(nt_dtype_size(NT_DTYPE_COUNT), 0);
    assert_int_equal(nt_ndim(NULL), -1);
    nt_release(tt);
    nt_release(t);
    nt_release(s);
}

/* ---------------- scopes ---------------- */

static void test_scopes(void **state)
{
    (void)state;
    uint64_t before = nt__tensor_live_handles();
    nt_scope *s = nt_scope_begin();
    nt_tensor *a = vec(4, 0);
    nt_tensor *b = nt_add(a, a);
    nt_tensor *kept = nt_keep(nt_mul(b, b));
    nt_tensor *ret = nt_retain(a); /* a second reference survives the scope */
    nt_scope *inner = nt_scope_begin();
    nt_tensor *c = nt_neg(kept);
    (void)c;
    /* ending the outer scope also ends the inner one left open */
    assert_int_equal(nt_scope_end(s), 0);
    assert_int_equal(nt_ndim(b), -1);  /* released by the scope */
    assert_int_equal(nt_ndim(kept), 1); /* moved out by nt_keep */
    assert_int_equal(nt_ndim(ret), 1);
    nt_clear_error();
    assert_int_equal(nt_scope_end(inner), NT_ESTATE); /* already closed */
    nt_clear_error();
    float out[4];
    assert_int_equal(nt_to_host(kept, out, sizeof out), 0);
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == (float)(4 * i * i));
    nt_release(kept);
    nt_release(ret);
    assert_int_equal(nt_sync(), 0);
    assert_int_equal(nt__tensor_live_handles(), before);
    assert_int_equal(nt_scope_end(NULL), NT_EINVAL);
    nt_clear_error();
}

static void test_scope_release_inside(void **state)
{
    (void)state;
    /* Releasing a scoped tensor yourself is fine: the scope does not release
     * it a second time. */
    nt_scope *s = nt_scope_begin();
    nt_tensor *a = vec(3, 0);
    nt_release(a);
    nt_tensor *b = vec(3, 1);
    (void)b;
    assert_int_equal(nt_scope_end(s), 0);
    assert_int_equal(nt_last_error(), 0);
}

/* ---------------- errors ---------------- */

static void test_errors(void **state)
{
    (void)state;
    assert_string_equal(nt_strerror(0), "success");
    assert_string_equal(nt_strerror(NT_ENOMEM), "out of device memory");
    assert_string_equal(nt_strerror(12345), "unknown error");
#define CHECK_STR(name, val, desc) assert_string_equal(nt_strerror(val), desc);
    NT_ERRNO_MAP(CHECK_STR)
#undef CHECK_STR
    nt_clear_error();
    assert_int_equal(nt_last_error(), 0);
    assert_string_equal(nt_last_error_message(), "");
    /* NULL chaining keeps the first error */
    nt_tensor *a = vec(3, 0);
    nt_tensor *r = nt_relu(nt_add(a, nt_ones(NT_F32, 1, (int64_t[]){2})));
    assert_null(r);
    assert_int_equal(nt_last_error(), NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "nt_add"));
    assert_non_null(strstr(nt_last_error_message(), "test_core.c:"));
    nt_clear_error();
    assert_null(nt_relu(NULL));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "argument 't' is NULL"));
    nt_clear_error();
    nt_release(a);
}

static void test_site_capture(void **state)
{
    (void)state;
    nt_tensor *a = vec(3, 0);
    int line = __LINE__ + 1;
    nt_tensor *bad = nt_reshape(a, 1, (int64_t[]){4});
    assert_null(bad);
    char want[64];
    snprintf(want, sizeof want, "test_core.c:%d in test_site_capture", line);
    assert_non_null(strstr(nt_last_error_message(), want));
    nt_clear_error();
    /* The plain function (no macro) names its caller by return address. */
    bad = (nt_reshape)(a, 1, (int64_t[]){4});
    assert_null(bad);
    assert_non_null(strstr(nt_last_error_message(), "test_core"));
    nt_clear_error();
    nt_release(a);
}

/* ---------------- arena ---------------- */

static void test_arena_exhaustion(void **state)
{
    (void)state;
    uint64_t cap = nt__arena_capacity();
    assert_true(cap > 0);
    /* bigger than the whole device: clean NT_ENOMEM, nothing else disturbed */
    int64_t huge = (int64_t)(cap / 4) + 1024;
    nt_tensor *a = vec(4, 0);
    nt_tensor *t = nt_zeros(NT_F32, 1, &huge);
    assert_null(t);
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    assert_non_null(strstr(nt_last_error_message(), "nt_zeros"));
    assert_non_null(strstr(nt_last_error_message(), "out of device memory"));
    nt_clear_error();
    nt_tensor *b = nt_add(a, a);
    float out[4];
    assert_int_equal(nt_to_host(b, out, sizeof out), 0);
    assert_true(out[3] == 6.0f);
    nt_release(a);
    nt_release(b);
}

static void test_arena_fill_and_reuse(void **state)
{
    (void)state;
    /* Fill the device with 1/8-capacity blocks until NT_ENOMEM, free them,
     * and allocate again: the capacity is enforced and reusable. */
    uint64_t cap = nt__arena_capacity();
    assert_int_equal(cap, UINT64_C(256) << 20); /* NT_HBM_BYTES from main() */
    int64_t n = (int64_t)(cap / 8 / 4);
    nt_tensor *blocks[16];
    int k = 0;
    for (; k < 16; k++) {
        blocks[k] = nt_zeros(NT_F32, 1, &n);
        if (!blocks[k])
            break;
    }
    assert_true(k >= 6 && k <= 8);
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    nt_clear_error();
    for (int i = 0; i < k; i++)
        nt_release(blocks[i]);
    assert_int_equal(nt_sync(), 0);
    nt_tensor *again = nt_zeros(NT_F32, 1, &n);
    assert_non_null(again);
    nt_stats st;
    nt_stats_get(&st);
    assert_true(st.device_bytes_peak <= st.device_capacity);
    nt_release(again);
}

static void test_deferred_storage(void **state)
{
    (void)state;
    /* A big tensor reserves its capacity when made and takes its memory
     * when first written; in lazy mode nothing is written before a sync. */
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    nt_stats a, b;
    nt_stats_get(&a);
    const int64_t n = 1 << 20; /* 4 MiB of f32 */
    nt_tensor *z = nt_zeros(NT_F32, 1, &n);
    assert_non_null(z);
    nt_stats_get(&b);
    assert_true(b.device_bytes_in_use - a.device_bytes_in_use >= (uint64_t)n * 4);
    assert_true(b.device_bytes_backed - a.device_bytes_backed < 4096); /* the header only */
    assert_null(z->st->data);
    /* the fill kernel takes the block */
    float first = 1;
    nt_tensor *head = nt_slice(z, 0, 0, 1, 1);
    assert_int_equal(nt_to_host(head, &first, sizeof first), 0);
    nt_release(head);
    assert_true(first == 0.0f);
    assert_non_null(z->st->data);
    nt_stats_get(&b);
    assert_true(b.device_bytes_backed - a.device_bytes_backed >= (uint64_t)n * 4);
    nt_release(z);
    nt_sync();
    nt_stats_get(&b);
    assert_int_equal(b.device_bytes_in_use, a.device_bytes_in_use);
    assert_int_equal(b.device_bytes_backed, a.device_bytes_backed);
    /* the reservation is what the capacity limits: unwritten tensors still
     * run the device out, at the call that makes one too many */
    int64_t big = (int64_t)(nt__arena_capacity() / 8 / 4);
    nt_tensor *held[16];
    int k = 0;
    for (; k < 16 && (held[k] = nt_zeros(NT_F32, 1, &big)) != NULL; k++)
        ;
    assert_true(k >= 6 && k <= 8);
    assert_int_equal(nt_last_error(), NT_ENOMEM);
    assert_non_null(strstr(nt_last_error_message(), "nt_zeros"));
    nt_clear_error();
    nt_stats_get(&b);
    assert_true(b.device_bytes_backed - a.device_bytes_backed < 64 * 1024);
    for (int i = 0; i < k; i++)
        nt_release(held[i]); /* never written: the queued fills still run */
    assert_int_equal(nt_sync(), 0);
    nt_stats_get(&b);
    assert_int_equal(b.device_bytes_in_use, a.device_bytes_in_use);
    assert_int_equal(b.device_bytes_backed, a.device_bytes_backed);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

/* ---------------- config and lifecycle ---------------- */

static void test_config(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_MODE", "fast"), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "NT_MODE"));
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_NOPE", "1"), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_config_set(NULL, "1"), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    assert_string_equal(nt_config_get("NT_MODE"), "lazy");
    assert_int_equal(nt_get_mode(), NT_MODE_LAZY);
    assert_int_equal(nt_config_set("NT_DETERMINISTIC", "1"), 0);
    assert_int_equal(nt_get_mode(), NT_MODE_DETERMINISTIC);
    assert_string_equal(nt_config_get("NT_DETERMINISTIC"), "1");
    assert_int_equal(nt_config_set("NT_DETERMINISTIC", "0"), 0);
    assert_int_equal(nt_get_mode(), NT_MODE_ADAPTIVE);
    assert_int_equal(nt_config_set("NT_LAZY_WINDOW", "0"), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_LAZY_WINDOW", "128"), 0);
    assert_string_equal(nt_config_get("NT_LAZY_WINDOW"), "128");
    assert_int_equal(nt_config_set("NT_HBM_BYTES", "1G"), NT_EINVAL); /* only before init */
    nt_clear_error();
    assert_null(nt_config_get("NT_NOPE"));
    nt_config_set("NT_LAZY_WINDOW", "4096");
}

static void test_reinit(void **state)
{
    (void)state;
    nt_shutdown();
    nt_shutdown(); /* idempotent */
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_init(), 0);
    nt_tensor *a = vec(5, 2);
    double v;
    assert_int_equal(nt_item(nt_sum(a, 0, false), &v), 0);
    assert_true(v == 2 + 3 + 4 + 5 + 6);
    nt_release(a);
}

/* A tensor kept across nt_shutdown: after the next nt_init every use is a
 * clear error naming the function and the argument (NT_ESTATE), metadata
 * gives its sentinel, and nothing reads freed memory (the ASan run of this
 * test would stop at such a read). */
static void test_stale_tensor_after_reinit(void **state)
{
    (void)state;
    nt_tensor *live = vec(4, 1);
    nt_tensor *view = nt_transpose(nt_reshape(live, 2, (int64_t[]){2, 2}), 0, 1);
    nt_tensor *queued = nt_mul_scalar(live, 2.0); /* its op may still be queued */
    nt_tensor *gone = vec(3, 0);
    assert_int_equal(nt_release(gone), 0);
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    nt_tensor *fresh = vec(4, 0);
    for (int i = 0; i < 100; i++) /* the new runtime makes tensors meanwhile */
        nt_release(vec(4, (float)i));
    nt_tensor *stale[] = {live, view, queued};
    for (int i = 0; i < 3; i++) {
        nt_tensor *t = stale[i];
        assert_true(t != fresh);
        nt_clear_error();
        assert_int_equal(nt_numel(t), -1);
        assert_int_equal(nt_ndim(t), -1);
        assert_int_equal(nt_dtype_of(t), NT_DTYPE_COUNT);
        assert_int_equal(nt_last_error(), 0); /* sentinels, as for a released tensor */
        assert_int_equal(nt_release(t), NT_ESTATE);
        assert_non_null(strstr(nt_last_error_message(), "nt_release"));
        assert_non_null(strstr(nt_last_error_message(), "argument 't'"));
        assert_non_null(strstr(nt_last_error_message(), "nt_shutdown"));
        nt_clear_error();
        assert_null(nt_add(fresh, t));
        assert_int_equal(nt_last_error(), NT_ESTATE);
        assert_non_null(strstr(nt_last_error_message(), "nt_add"));
        assert_non_null(strstr(nt_last_error_message(), "argument 'b'"));
        nt_clear_error();
        assert_null(nt_retain(t));
        assert_int_equal(nt_last_error(), NT_ESTATE);
        nt_clear_error();
        assert_int_equal(nt_tensor_device(t), -1);
        assert_int_equal(nt_last_error(), NT_ESTATE);
    }
    /* released before the shutdown: still reported as released */
    nt_clear_error();
    assert_int_equal(nt_release(gone), NT_ERELEASED);
    /* and the new runtime is untouched by all that */
    nt_clear_error();
    double v;
    assert_int_equal(nt_item(nt_sum(fresh, 0, false), &v), 0);
    assert_true(v == 0 + 1 + 2 + 3);
    nt_release(fresh);
    /* two shutdowns later, the same */
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    assert_int_equal(nt_release(live), NT_ESTATE);
    nt_clear_error();
}

typedef struct {
    GMutex lock;
    GCond cond;
    int step; /* 1: the thread opened its scope; 2: the runtime restarted */
    nt_scope *scope;
    int end_rc, numel;
    char msg[512];
} scope_thread_ctx;

static gpointer scope_thread(gpointer p)
{
    scope_thread_ctx *c = p;
    c->scope = nt_scope_begin();
    nt_tensor *in_old = vec(2, 0); /* owned by the scope */
    (void)in_old;
    g_mutex_lock(&c->lock);
    c->step = 1;
    g_cond_broadcast(&c->cond);
    while (c->step != 2)
        g_cond_wait(&c->cond, &c->lock);
    g_mutex_unlock(&c->lock);
    /* The scope is from the ended runtime: a new tensor is the thread's
     * own, not the old scope's, and ending the old scope is an error. */
    nt_tensor *t = vec(3, 0);
    nt_clear_error();
    c->end_rc = nt_scope_end(c->scope);
    g_strlcpy(c->msg, nt_last_error_message(), sizeof c->msg);
    nt_clear_error();
    c->numel = (int)nt_numel(t); /* still live: no scope released it */
    nt_release(t);
    return NULL;
}

/* A scope left open across nt_shutdown, on the thread that shut down and on
 * another one: after nt_init, ending it is NT_ESTATE naming nt_scope_end and
 * its argument, and new tensors are not adopted by it. */
static void test_stale_scope_after_reinit(void **state)
{
    (void)state;
    nt_scope *mine = nt_scope_begin();
    nt_tensor *t = vec(2, 0);
    assert_non_null(t);
    scope_thread_ctx c = {0};
    g_mutex_init(&c.lock);
    g_cond_init(&c.cond);
    GThread *th = g_thread_new("scope", scope_thread, &c);
    g_mutex_lock(&c.lock);
    while (c.step != 1)
        g_cond_wait(&c.cond, &c.lock);
    g_mutex_unlock(&c.lock);
    nt_shutdown(); /* closes this thread's scopes; the other's stays open */
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    assert_int_equal(nt_scope_end(mine), NT_ESTATE);
    assert_non_null(strstr(nt_last_error_message(), "nt_scope_end"));
    assert_non_null(strstr(nt_last_error_message(), "argument 's'"));
    nt_clear_error();
    g_mutex_lock(&c.lock);
    c.step = 2;
    g_cond_broadcast(&c.cond);
    g_mutex_unlock(&c.lock);
    g_thread_join(th);
    assert_int_equal(c.end_rc, NT_ESTATE);
    assert_non_null(strstr(c.msg, "nt_scope_end"));
    assert_non_null(strstr(c.msg, "nt_shutdown"));
    assert_int_equal(c.numel, 3);
    g_mutex_clear(&c.lock);
    g_cond_clear(&c.cond);
}

/* The quarantine (NT_HANDLE_QUARANTINE, 4096) counts the handles the
 * program could see: a released tensor is still reported as released after
 * 4000 more of those were released (results, and the gradients zero_grad
 * drops), from a fresh runtime (whose free lists hold only new slabs) and
 * with ops that make temporaries of their own (nt_linear, nt_backward); and
 * its handle is reused after not many more (a FIFO, not a leak). */
static void test_quarantine_counts_program_handles(void **state)
{
    (void)state;
    const char *modes[] = {"deterministic", "adaptive"};
    for (int m = 0; m < 2; m++) {
        nt_shutdown();
        assert_int_equal(nt_init(), 0);
        assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
        nt_tensor *x = vec(4, 1), *w = nt_ones(NT_F32, 2, (int64_t[]){3, 4});
        nt_tensor *b = vec(3, 0);
        nt_set_requires_grad(w, true);
        nt_tensor *t = vec(4, 0);
        assert_int_equal(nt_release(t), 0);
        int released = 0;
        for (int i = 0; released < 4000; i++) {
            nt_tensor *y = nt_linear(x, w, b);
            assert_non_null(y);
            if (i % 64 == 0) { /* a backward pass now and then */
                nt_tensor *l = nt_sum(y, NT_DIM_ALL, false);
                assert_int_equal(nt_backward(l), 0);
                nt_release(l);
                nt_zero_grad(w); /* drops w's gradient */
                released += 2;
            }
            nt_release(y);
            released++;
            if (nt_numel(t) != -1)
                fail_msg("%s: the handle was reused after %d releases", modes[m], released);
            if (i % 256 == 0)
                assert_int_equal(nt_sync(), 0);
        }
        nt_clear_error();
        assert_int_equal(nt_release(t), NT_ERELEASED);
        nt_clear_error();
        int reused = 0;
        for (int i = 0; i < 8192 && !reused; i++) {
            nt_tensor *y = vec(4, 0);
            reused = y == t;
            nt_release(y);
            assert_int_equal(nt_sync(), 0);
        }
        assert_true(reused);
        nt_release(x);
        nt_release(w);
        nt_release(b);
    }
}

static void test_bad_env(void **state)
{
    (void)state;
    nt_shutdown();
    setenv("NT_MODE", "warp", 1);
    assert_int_equal(nt_init(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "environment variable"));
    assert_non_null(strstr(nt_last_error_message(), "NT_MODE"));
    assert_non_null(strstr(nt_last_error_message(), "warp"));
    nt_clear_error();
    unsetenv("NT_MODE");
    assert_int_equal(nt_init(), 0);
}

static void test_stats(void **state)
{
    (void)state;
    nt_stats_reset();
    nt_tensor *a = vec(4, 0);
    nt_tensor *b = nt_exp(a);
    float out[4];
    nt_to_host(b, out, sizeof out);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    assert_true(st.ops_enqueued >= 1);
    assert_true(st.ops_executed >= 1);
    assert_true(st.syncs >= 1);
    assert_int_equal(st.bytes_to_host, 16);
    assert_int_equal(st.bytes_from_host, 16);
    assert_true(st.device_bytes_in_use > 0);
    assert_int_equal(nt_stats_get(NULL), NT_EINVAL);
    nt_clear_error();
    nt_release(a);
    nt_release(b);
}

int main(void)
{
    /* A small device so exhaustion can be tested for real. */
    setenv("NT_HBM_BYTES", "256M", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_retain_release, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_release_while_queued, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_metadata, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_scopes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_scope_release_inside, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_site_capture, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_arena_exhaustion, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_arena_fill_and_reuse, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_deferred_storage, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_config, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_reinit, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_stale_tensor_after_reinit, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_stale_scope_after_reinit, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_quarantine_counts_program_handles, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_env, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_stats, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
