/*
 * tests/test_api_plain.c - part of tests/test_api.c: the public header
 * compiled with NT_NO_SITE_MACROS, as a program that wants plain function
 * calls gets it.  The calls below are then real calls of nt_add, nt_full...
 * (no macro rewrites them), while NT_HERE and the _at forms still work.
 */
#define NT_NO_SITE_MACROS
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"

#if defined(nt_add) || defined(nt_neg) || defined(nt_sync) || defined(nt_from_host) ||     \
    defined(nt_optim_step)
#error "NT_NO_SITE_MACROS must leave the plain functions"
#endif
#ifndef NT_HERE
#error "NT_HERE must be usable under NT_NO_SITE_MACROS"
#endif
/* The list stays usable too (bindings and wrappers take it). */
#ifndef NT_SITE_FUNCS
#error "NT_SITE_FUNCS must be defined under NT_NO_SITE_MACROS"
#endif

void plain_calls_work(void **state);
void plain_here_names_the_line(void **state);

/* Plain calls compute what the macros' calls compute, and their errors name
 * the caller by return address instead of a file:line. */
void plain_calls_work(void **state)
{
    (void)state;
    int64_t sh[2] = {2, 3};
    nt_tensor *a = nt_full(NT_F32, 2, sh, 1.5);
    nt_tensor *b = nt_arange(NT_F32, 0, 6, 1);
    assert_non_null(a);
    assert_non_null(b);
    nt_tensor *b2 = nt_reshape(b, 2, sh);
    nt_tensor *ab = nt_mul(a, b2), *nb = nt_neg(b2);
    nt_tensor *y = nt_sub(ab, nb); /* 1.5 b + b = 2.5 b */
    assert_non_null(y);
    float out[6];
    assert_int_equal(nt_to_host(y, out, sizeof out), 0);
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == 2.5f * (float)i);
    double s;
    nt_tensor *sum = nt_sum(y, NT_DIM_ALL, false);
    assert_int_equal(nt_item(sum, &s), 0);
    assert_true(s == 37.5);
    assert_int_equal(nt_sync(), 0);

    /* No file:line here: the error names the caller by return address. */
    assert_null(nt_add(a, NULL));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    const char *m = nt_last_error_message();
    assert_non_null(strstr(m, "nt_add: argument 'b' is NULL (at "));
    assert_null(strstr(m, "test_api_plain.c"));
    assert_null(strstr(m, "unknown site"));
    nt_clear_error();

    /* nt_tensor *(*)(nt_tensor *, nt_tensor *): plain functions have
     * addresses, so they can be passed around as callbacks. */
    nt_tensor *(*op)(nt_tensor *, nt_tensor *) = nt_maximum;
    nt_tensor *m2 = op(a, b2);
    assert_int_equal(nt_to_host(m2, out, sizeof out), 0);
    assert_true(out[0] == 1.5f && out[5] == 5.0f);

    nt_tensor *all[] = {a, b, b2, ab, nb, y, sum, m2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        assert_int_equal(nt_release(all[i]), 0);
}

/* NT_HERE with an _at form names this file, line and function. */
void plain_here_names_the_line(void **state)
{
    (void)state;
    int line = __LINE__ + 1;
    assert_null(nt_relu_at(NT_HERE, NULL));
    char want[1200]; /* __FILE__ is as long as the build directory makes it */
    assert_true(snprintf(want, sizeof want, "nt_relu: argument 't' is NULL (at %s:%d in %s)",
                         __FILE__, line, __func__) < (int)sizeof want);
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_string_equal(nt_last_error_message(), want);
    nt_clear_error();

    assert_int_equal(nt_sync_at(NT_HERE), 0);
    assert_int_equal(nt_last_error(), 0);

    line = __LINE__ + 1;
    const nt_site *here = NT_HERE;
    assert_string_equal(here->file, __FILE__);
    assert_string_equal(here->func, "plain_here_names_the_line");
    assert_int_equal(here->line, line);
    assert_null(here->ra);
}
