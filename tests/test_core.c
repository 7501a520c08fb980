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
        cmocka_unit_test_setup_teardown(test_bad_env, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_stats, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
