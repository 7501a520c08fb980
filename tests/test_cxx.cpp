/* tests/test_cxx.cpp - the public header from C++ (built when meson finds a
 * C++ compiler; scripts/deps.sh installs g++): it compiles as C++11 with
 * -Wpedantic, the call-site macros name the caller's file:line as they do
 * in C (NT_HERE is a temporary nt_site living through the call), and a
 * small training step runs.  Linked with the shared library only, as a C++
 * user links it. */
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

extern "C" {
#include <cmocka.h>
}

#include "ntensor.h"

static void test_errors_name_the_line(void **state)
{
    (void)state;
    const int64_t shape[1] = {3};
    nt_tensor *t = nt_zeros(NT_F32, 1, shape);
    const int line = __LINE__ + 1;
    nt_tensor *bad = nt_add(t, nullptr);
    assert_null(bad);
    char want[64];
    std::snprintf(want, sizeof want, "test_cxx.cpp:%d in ", line);
    const char *m = nt_last_error_message();
    if (!std::strstr(m, want) || !std::strstr(m, "nt_add: argument 'b' is NULL"))
        fail_msg("message '%s' lacks '%s'", m, want);
    nt_clear_error();
    /* a sync point's error names its line too */
    double v;
    const int line2 = __LINE__ + 1;
    assert_int_equal(nt_item(nullptr, &v), NT_EINVAL);
    std::snprintf(want, sizeof want, "test_cxx.cpp:%d in ", line2);
    if (!std::strstr(nt_last_error_message(), want))
        fail_msg("message '%s' lacks '%s'", nt_last_error_message(), want);
    nt_clear_error();
    /* NT_HERE with an _at form */
    assert_null(nt_neg_at(NT_HERE, nullptr));
    assert_non_null(std::strstr(nt_last_error_message(), "test_cxx.cpp:"));
    nt_clear_error();
    nt_release(t);
}

/* One SGD step on y = w x from C++: the value of the update. */
static void test_step(void **state)
{
    (void)state;
    const float wv[2] = {1.0f, -2.0f}, xv[2] = {3.0f, 4.0f};
    const int64_t s[1] = {2};
    nt_tensor *w = nt_from_host(wv, NT_F32, 1, s);
    nt_tensor *x = nt_from_host(xv, NT_F32, 1, s);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    nt_optim *opt = nt_optim_sgd(&w, 1, 0.5, 0, 0, false);
    assert_non_null(opt);
    nt_scope *sc = nt_scope_begin();
    assert_int_equal(nt_backward(nt_sum(nt_mul(w, x), NT_DIM_ALL, false)), 0);
    assert_int_equal(nt_optim_step(opt), 0);
    nt_scope_end(sc);
    float out[2];
    assert_int_equal(nt_to_host(w, out, sizeof out), 0);
    assert_true(out[0] == 1.0f - 0.5f * 3.0f && out[1] == -2.0f - 0.5f * 4.0f);
    nt_optim_destroy(opt);
    nt_release(w);
    nt_release(x);
}

static int setup(void **state)
{
    (void)state;
    return nt_init();
}
static int teardown(void **state)
{
    (void)state;
    nt_shutdown();
    return 0;
}

int main()
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_errors_name_the_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_step, setup, teardown),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
