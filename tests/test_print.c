/* tests/test_print.c - nt_format / nt_print against the text PyTorch prints
 * for the same tensors (dtype names are ntensor's: dtype=bf16, not
 * torch.bfloat16). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <glib.h>

#include "ntensor.h"
#include "nt_test.h"

static int setup(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    return 0;
}

static void expect(nt_tensor *t, const char *want)
{
    assert_non_null(t);
    char *s = nt_format(t);
    assert_non_null(s);
    assert_string_equal(s, want);
    g_free(s);
    nt_release(t);
}

static nt_tensor *f32(const float *v, int ndim, const int64_t *shape)
{
    return nt_from_host(v, NT_F32, ndim, shape);
}

static void test_fixed_and_int_mode(void **state)
{
    (void)state;
    expect(f32((float[]){1, 2, 3}, 1, (int64_t[]){3}), "tensor([1., 2., 3.])");
    expect(f32((float[]){1.5f, 2.25f}, 1, (int64_t[]){2}), "tensor([1.5000, 2.2500])");
    expect(f32((float[]){-1.5f, 2}, 1, (int64_t[]){2}), "tensor([-1.5000,  2.0000])");
    expect(f32((float[]){1, 2, 3, 4}, 2, (int64_t[]){2, 2}),
           "tensor([[1., 2.],\n        [3., 4.]])");
    expect(f32((float[]){3.5f}, 0, NULL), "tensor(3.5000)");
    expect(f32((float[]){-0.0f, 0.0f}, 1, (int64_t[]){2}), "tensor([-0., 0.])");
}

static void test_scientific(void **state)
{
    (void)state;
    expect(f32((float[]){1e-5f, 1.0f}, 1, (int64_t[]){2}), "tensor([1.0000e-05, 1.0000e+00])");
    expect(f32((float[]){1e9f, 1.5f}, 1, (int64_t[]){2}), "tensor([1.0000e+09, 1.5000e+00])");
    expect(f32((float[]){1e10f, 2e10f}, 1, (int64_t[]){2}), "tensor([1.0000e+10, 2.0000e+10])");
    expect(f32((float[]){1, 2000}, 1, (int64_t[]){2}), "tensor([1.0000e+00, 2.0000e+03])");
}

static void test_special_values(void **state)
{
    (void)state;
    expect(f32((float[]){NAN, 1.0f, INFINITY}, 1, (int64_t[]){3}), "tensor([nan, 1., inf])");
    expect(f32((float[]){-INFINITY, 0.5f}, 1, (int64_t[]){2}), "tensor([  -inf, 0.5000])");
}

static void test_dtypes(void **state)
{
    (void)state;
    expect(nt_arange(NT_I32, 0, 5, 1), "tensor([0, 1, 2, 3, 4], dtype=i32)");
    expect(nt_cast(f32((float[]){1.5f}, 1, (int64_t[]){1}), NT_BF16),
           "tensor([1.5000], dtype=bf16)");
    expect(nt_cast(f32((float[]){1, -2}, 1, (int64_t[]){2}), NT_F16),
           "tensor([ 1., -2.], dtype=f16)");
    expect(nt_full(NT_U8, 1, (int64_t[]){3}, 7), "tensor([7, 7, 7], dtype=u8)");
}

static void test_empty(void **state)
{
    (void)state;
    expect(nt_zeros(NT_F32, 1, (int64_t[]){0}), "tensor([])");
    expect(nt_zeros(NT_F32, 2, (int64_t[]){0, 3}), "tensor([], size=(0, 3))");
}

static void test_3d(void **state)
{
    (void)state;
    nt_tensor *a = nt_arange(NT_F32, 0, 8, 1);
    expect(nt_reshape(a, 3, (int64_t[]){2, 2, 2}),
           "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]])");
    nt_release(a);
}

static void test_wrap(void **state)
{
    (void)state;
    expect(nt_arange(NT_F32, 0, 30, 1),
           "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
           "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
           "        28., 29.])");
}

static void test_summarize(void **state)
{
    (void)state;
    /* the formatter sees only the shown values: 1000..2999 is integer mode */
    expect(nt_arange(NT_F32, 1000, 3000, 1),
           "tensor([1000., 1001., 1002.,  ..., 2997., 2998., 2999.])");
    /* 1 and 1999 are more than 1000x apart: scientific, wrapped at 80 */
    expect(nt_arange(NT_F32, 0, 2000, 1),
           "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
           "        1.9990e+03])");
    nt_tensor *a = nt_arange(NT_F32, 10000, 20000, 1);
    expect(nt_reshape(a, 2, (int64_t[]){100, 100}),
           "tensor([[10000., 10001., 10002.,  ..., 10097., 10098., 10099.],\n"
           "        [10100., 10101., 10102.,  ..., 10197., 10198., 10199.],\n"
           "        [10200., 10201., 10202.,  ..., 10297., 10298., 10299.],\n"
           "        ...,\n"
           "        [19700., 19701., 19702.,  ..., 19797., 19798., 19799.],\n"
           "        [19800., 19801., 19802.,  ..., 19897., 19898., 19899.],\n"
           "        [19900., 19901., 19902.,  ..., 19997., 19998., 19999.]])");
    nt_release(a);
    expect(nt_arange(NT_I32, 0, 2000, 1),
           "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], dtype=i32)");
}

static void test_views_print(void **state)
{
    (void)state;
    nt_tensor *a = f32((float[]){1, 2, 3, 4, 5, 6}, 2, (int64_t[]){2, 3});
    expect(nt_transpose(a, 0, 1), "tensor([[1., 4.],\n        [2., 5.],\n        [3., 6.]])");
    expect(nt_slice(a, 1, 0, 3, 2), "tensor([[1., 3.],\n        [4., 6.]])");
    nt_release(a);
}

static void test_print_errors(void **state)
{
    (void)state;
    nt_clear_error();
    assert_null(nt_format(NULL));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    nt_clear_error();
    assert_int_equal(nt_print(NULL), NT_EINVAL);
    nt_clear_error();
    nt_tensor *a = nt_zeros(NT_F32, 1, (int64_t[]){2});
    nt_release(a);
    assert_int_equal(nt_print(a), NT_ERELEASED);
    nt_clear_error();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fixed_and_int_mode, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_scientific, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_special_values, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_dtypes, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_empty, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_3d, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_wrap, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_summarize, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_views_print, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_print_errors, setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
