/*
 * tests/test_api.c - the public header's call-site layer (include/ntensor.h,
 * include/ntensor/site.h generated from include/ntensor/site.list).
 *
 * For every function of the list: the plain prototype, the _at form and the
 * list's signature agree (checked at compile time, so a drifted prototype
 * breaks the build of this file), the macro expands to X_at(NT_HERE, ...),
 * and a call through the macro that fails names this file and line.
 * tests/test_api_plain.c is the same API compiled with NT_NO_SITE_MACROS.
 * Whether the generated headers are fresh is the meson test 'api_generated'
 * (scripts/gen_api.py --check).
 */
#include <setjmp.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"

/* ---------------- compile time: prototypes against the list ---------------- */

/* X(ret, name, (params), (site, params), nparams): the plain function and
 * its _at form have exactly the list's types (parameter and return types;
 * names do not matter to C). */
#define AGREE(ret, name, params, at_params, n)                                              \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret(*) params),           \
                   #name ": the prototype differs from include/ntensor/site.list");          \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name##_at), ret(*) at_params),   \
                   #name "_at: the declaration differs from include/ntensor/site.list");      \
    _Static_assert(n <= 8, #name ": add ZARGS_" #n " below");
NT_SITE_FUNCS(AGREE)

/* The check itself must be able to fail: a wrong signature is not
 * compatible (else every assertion above would hold vacuously). */
_Static_assert(!__builtin_types_compatible_p(__typeof__(&nt_add),
                                             nt_tensor *(*)(nt_tensor *, nt_tensor *const *)),
               "types_compatible_p does not see parameter types");
_Static_assert(!__builtin_types_compatible_p(__typeof__(&nt_sum),
                                             nt_tensor *(*)(nt_tensor *, int64_t, bool)),
               "types_compatible_p does not see parameter types");

/* Every function of the list, plain and _at, exists in the library: taking
 * their addresses makes the link fail otherwise. */
typedef void (*any_fn)(void);
typedef struct fn_pair {
    const char *name;
    any_fn plain, at;
    int nparams;
} fn_pair;

#define PAIR(ret, name, params, at_params, n) {#name, (any_fn)&name, (any_fn)&name##_at, n},
static const fn_pair all_fns[] = {NT_SITE_FUNCS(PAIR)};
#define NFNS ((int)(sizeof all_fns / sizeof all_fns[0]))

static void list_is_whole(void **state)
{
    (void)state;
    /* The op table's groups are in it (generated prototypes, core/optable.h),
     * and so are hand-declared functions of every section. */
    const char *must[] = {"nt_add", "nt_ge", "nt_neg", "nt_silu", "nt_from_host", "nt_sync",
                          "nt_where", "nt_cast_sr", "nt_cat", "nt_clamp_inplace",
                          "nt_op_call", "nt_optim_step", "nt_sgd_step"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) {
        int found = 0;
        for (int j = 0; j < NFNS; j++)
            found += strcmp(all_fns[j].name, must[i]) == 0;
        assert_int_equal(found, 1);
    }
    for (int j = 0; j < NFNS; j++) {
        assert_non_null(all_fns[j].plain);
        assert_non_null(all_fns[j].at);
        assert_true(all_fns[j].plain != all_fns[j].at);
        for (int k = 0; k < j; k++)
            assert_string_not_equal(all_fns[j].name, all_fns[k].name);
    }
    assert_true(NFNS >= 83);
}

/* ---------------- the macros route to _at with the caller's site ---------------- */

#define STR_(...) #__VA_ARGS__
#define STR(...) STR_(__VA_ARGS__)
/* A call with n zero arguments: 0 converts to every parameter type of the
 * list (pointers, integers, doubles, enums, bool). */
#define ZARGS_0 ()
#define ZARGS_1 (0)
#define ZARGS_2 (0, 0)
#define ZARGS_3 (0, 0, 0)
#define ZARGS_4 (0, 0, 0, 0)
#define ZARGS_5 (0, 0, 0, 0, 0)
#define ZARGS_6 (0, 0, 0, 0, 0, 0)
#define ZARGS_7 (0, 0, 0, 0, 0, 0, 0)
#define ZARGS_8 (0, 0, 0, 0, 0, 0, 0, 0)
#define ZARGS(n) ZARGS_##n
/* f is substituted unexpanded (no '(' follows it in the argument), so the
 * rescan of `f args` is what invokes the site macro. */
#define CALL(f, args) f args

typedef struct expansion {
    const char *name;
    const char *text;
} expansion;

#define EXPANSION(ret, name, params, at_params, n) {#name, STR(CALL(name, ZARGS(n)))},
static const expansion expansions[] = {NT_SITE_FUNCS(EXPANSION)};

static void every_macro_calls_at_with_here(void **state)
{
    (void)state;
    assert_int_equal((int)(sizeof expansions / sizeof expansions[0]), NFNS);
    char prefix[160], args[64];
    for (int i = 0; i < NFNS; i++) {
        const char *t = expansions[i].text;
        /* name_at((&(const nt_site){"<this file>", __func__, <line>, 0}), 0, ..., 0) */
        snprintf(prefix, sizeof prefix, "%s_at((&(const nt_site){\"", expansions[i].name);
        if (strncmp(t, prefix, strlen(prefix)) != 0)
            fail_msg("%s(...) expands to '%s', not %s_at(NT_HERE, ...)", expansions[i].name, t,
                     expansions[i].name);
        const char *site = t + strlen(prefix);
        const char *site_end = strstr(site, ", 0})");
        assert_non_null(site_end);
        if (!strstr(site, "test_api.c\", __func__, ") || strstr(site, "test_api.c") > site_end)
            fail_msg("%s: the site in '%s' is not this file's", expansions[i].name, t);
        /* the arguments follow the site unchanged */
        args[0] = '\0';
        for (int k = 0; k < all_fns[i].nparams; k++)
            strcat(args, ", 0");
        strcat(args, ")");
        assert_string_equal(site_end + strlen(", 0})"), args);
    }
}

/* Calls every function of the list through its macro with all-zero
 * arguments (NULL tensors, null pointers, zeros) on one line: each call
 * that fails must name this file and that line.  The few that accept zeros
 * (0-d f32 creation, nt_sync) must leave no error; any other function
 * accepting them is reported, so a new one gets a look. */
static const char *const accepts_zeros[] = {"nt_zeros", "nt_ones", "nt_full", "nt_rand",
                                            "nt_randn", "nt_sync", "nt_graph_capture_begin"};
static int failed, succeeded, misnamed, unexpected;
static char misnamed_msg[512], unexpected_msg[256];

static void check_call(const char *name, int line)
{
    char want[64];
    snprintf(want, sizeof want, "test_api.c:%d in ", line);
    if (nt_last_error() == 0) {
        succeeded++;
        bool known = false;
        for (size_t i = 0; i < sizeof accepts_zeros / sizeof accepts_zeros[0]; i++)
            known |= strcmp(name, accepts_zeros[i]) == 0;
        if (!known) {
            unexpected++;
            snprintf(unexpected_msg, sizeof unexpected_msg,
                     "%s accepted all-zero arguments: if that is right, add it to "
                     "accepts_zeros in tests/test_api.c", name);
        }
        return;
    }
    failed++;
    /* The message starts with the function's name (nt_backward_ex reports
     * as nt_backward, the function it extends) and names the site. */
    const char *m = nt_last_error_message();
    size_t fn_len = strcspn(m, ":");
    if (fn_len == 0 || strncmp(m, name, fn_len) != 0 || !strstr(m, want)) {
        misnamed++;
        print_message("# misnamed: %s: '%s'\n", name, m);
        snprintf(misnamed_msg, sizeof misnamed_msg, "%s: '%s' (wanted '%s')", name, m, want);
    }
    nt_clear_error();
}

#define ZERO_CALL(ret, name, params, at_params, n)                                             \
    nt_clear_error();                                                                           \
    (void)(CALL(name, ZARGS(n)));                                                               \
    check_call(#name, line);

static void every_macro_names_the_caller(void **state)
{
    (void)state;
    nt_scope *s = nt_scope_begin(); /* owns the few tensors that are made */
    assert_non_null(s);
    failed = succeeded = misnamed = unexpected = 0;
    int line = __LINE__ + 1;
    NT_SITE_FUNCS(ZERO_CALL)
    assert_int_equal(nt_scope_end(s), 0);
    if (misnamed)
        fail_msg("%d call(s) did not name this line; last: %s", misnamed, misnamed_msg);
    if (unexpected)
        fail_msg("%s", unexpected_msg);
    assert_int_equal(failed + succeeded, NFNS);
    assert_int_equal(succeeded, (int)(sizeof accepts_zeros / sizeof accepts_zeros[0]));
}

/* A few by hand, with a real bad argument among good ones. */
static void bad_arguments_name_the_line(void **state)
{
    (void)state;
    int64_t sh[1] = {3};
    nt_tensor *a = nt_ones(NT_F32, 1, sh);
    assert_non_null(a);
    char want[64];

    int line = __LINE__ + 1;
    assert_null(nt_add(a, NULL));
    snprintf(want, sizeof want, "test_api.c:%d in bad_arguments_name_the_line", line);
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nt_add: argument 'b' is NULL"));
    assert_non_null(strstr(nt_last_error_message(), want));
    nt_clear_error();

    line = __LINE__ + 1;
    assert_null(nt_sum(a, 5, false));
    snprintf(want, sizeof want, "test_api.c:%d in bad_arguments_name_the_line", line);
    assert_int_equal(nt_last_error(), NT_EDIM);
    assert_non_null(strstr(nt_last_error_message(), "nt_sum"));
    assert_non_null(strstr(nt_last_error_message(), want));
    nt_clear_error();

    line = __LINE__ + 1;
    assert_true(nt_optim_step(NULL) < 0);
    snprintf(want, sizeof want, "test_api.c:%d in bad_arguments_name_the_line", line);
    assert_non_null(strstr(nt_last_error_message(), "nt_optim_step"));
    assert_non_null(strstr(nt_last_error_message(), want));
    nt_clear_error();

    /* A generated op (include/ntensor/ops.h) works and reports like the rest. */
    nt_tensor *r = nt_relu(nt_neg(a));
    assert_non_null(r);
    float out[3];
    assert_int_equal(nt_to_host(r, out, sizeof out), 0);
    for (int i = 0; i < 3; i++)
        assert_true(out[i] == 0.0f && !signbit(out[i]));
    line = __LINE__ + 1;
    assert_null(nt_silu(NULL));
    snprintf(want, sizeof want, "test_api.c:%d in bad_arguments_name_the_line", line);
    assert_non_null(strstr(nt_last_error_message(), "nt_silu: argument 't' is NULL"));
    assert_non_null(strstr(nt_last_error_message(), want));
    nt_clear_error();

    /* An explicit _at call names the site it is given. */
    static const nt_site there = {"elsewhere.c", "somewhere", 77, 0};
    assert_null(nt_ge_at(&there, NULL, a));
    assert_non_null(strstr(nt_last_error_message(), "nt_ge: argument 'a' is NULL"));
    assert_non_null(strstr(nt_last_error_message(), "elsewhere.c:77 in somewhere"));
    nt_clear_error();

    assert_int_equal(nt_release(r), 0);
    assert_int_equal(nt_release(a), 0);
}

/* tests/test_api_plain.c (NT_NO_SITE_MACROS) */
void plain_calls_work(void **state);
void plain_here_names_the_line(void **state);

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(list_is_whole),
        cmocka_unit_test(every_macro_calls_at_with_here),
        cmocka_unit_test_setup_teardown(every_macro_names_the_caller, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(bad_arguments_name_the_line, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(plain_calls_work, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(plain_here_names_the_line, nt_test_setup,
                                        nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
