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
    _Static_assert(n <= 9, #name ": add ZARGS_" #n " below");
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
#define ZARGS_9 (0, 0, 0, 0, 0, 0, 0, 0, 0)
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
                                            "nt_randn", "nt_sync", "nt_graph_capture_begin",
                                            "nt_uniform", "nt_normal", "nt_randperm"};
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
/* at the end of this file, under #line directives that give them long
 * file names */
static void long_file_keeps_the_call_site(void **state);
static void very_long_file_keeps_line_and_function(void **state);
static void long_message_keeps_its_ends(void **state);

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
        cmocka_unit_test_setup_teardown(long_file_keeps_the_call_site, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(very_long_file_keeps_line_and_function, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(long_message_keeps_its_ends, nt_test_setup,
                                        nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* ---------------- long names, long messages ----------------
 * A message is cut only past the limit include/ntensor.h documents (4095
 * bytes), and then in the middle of its text: the function's name and every
 * call site stay whole.  The #line directives give the functions below a
 * long __FILE__, as a deep build directory would (meson passes sources as
 * paths relative to the build directory). */
static void check_site(const char *m, const char *file, int line, const char *func)
{
    char want[4200];
    snprintf(want, sizeof want, "(at %s:%d in %s)", file, line, func);
    if (!strstr(m, want))
        fail_msg("the call site is not whole in '%s'", m);
}

#line 1 "/srv/a_rather_deep_build_directory_0/a_rather_deep_build_directory_1/a_rather_deep_build_directory_2/a_rather_deep_build_directory_3/a_rather_deep_build_directory_4/a_rather_deep_build_directory_5/a_rather_deep_build_directory_6/a_rather_deep_build_directory_7/a_rather_deep_build_directory_8/a_rather_deep_build_directory_9/a_rather_deep_build_directory_10/a_rather_deep_build_directory_/long_site.c"
static void long_file_keeps_the_call_site(void **state)
{
    (void)state;
    assert_int_equal((int)strlen(__FILE__), 400);
    int line = __LINE__ + 1;
    assert_null(nt_relu_at(NT_HERE, NULL));
    char want[600];
    snprintf(want, sizeof want, "nt_relu: argument 't' is NULL (at %s:%d in %s)", __FILE__, line,
             __func__);
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_string_equal(nt_last_error_message(), want);
    nt_clear_error();

    /* an error raised when the op runs, reported at a later sync: the op's
     * site and the sync's, both whole */
    nt_tensor *w = nt_zeros(NT_F32, 2, (int64_t[]){3, 2});
    int32_t bad[2] = {0, 7};
    nt_tensor *idx = nt_from_host(bad, NT_I32, 1, (int64_t[]){2});
    int op_line = __LINE__ + 1;
    nt_tensor *e = nt_embedding(w, idx);
    assert_non_null(e);
    float out[4];
    int sync_line = __LINE__ + 1;
    assert_true(nt_to_host(e, out, sizeof out) < 0);
    const char *m = nt_last_error_message();
    assert_true(strncmp(m, "nt_embedding (at ", 17) == 0);
    check_site(m, __FILE__, op_line, __func__);
    char rep[600];
    snprintf(rep, sizeof rep, "[reported by nt_to_host at %s:%d in %s]", __FILE__, sync_line,
             __func__);
    assert_non_null(strstr(m, rep));
    nt_clear_error();
    assert_int_equal(nt_release(e), 0);
    assert_int_equal(nt_release(idx), 0);
    assert_int_equal(nt_release(w), 0);
}

#line 1 "/srv/an_absurdly_deep_tree_00/an_absurdly_deep_tree_01/an_absurdly_deep_tree_02/an_absurdly_deep_tree_03/an_absurdly_deep_tree_04/an_absurdly_deep_tree_05/an_absurdly_deep_tree_06/an_absurdly_deep_tree_07/an_absurdly_deep_tree_08/an_absurdly_deep_tree_09/an_absurdly_deep_tree_10/an_absurdly_deep_tree_11/an_absurdly_deep_tree_12/an_absurdly_deep_tree_13/an_absurdly_deep_tree_14/an_absurdly_deep_tree_15/an_absurdly_deep_tree_16/an_absurdly_deep_tree_17/an_absurdly_deep_tree_18/an_absurdly_deep_tree_19/an_absurdly_deep_tree_20/an_absurdly_deep_tree_21/an_absurdly_deep_tree_22/an_absurdly_deep_tree_23/an_absurdly_deep_tree_24/an_absurdly_deep_tree_25/an_absurdly_deep_tree_26/an_absurdly_deep_tree_27/an_absurdly_deep_tree_28/an_absurdly_deep_tree_29/an_absurdly_deep_tree_30/an_absurdly_deep_tree_31/an_absurdly_deep_tree_32/an_absurdly_deep_tree_33/an_absurdly_deep_tree_34/an_absurdly_deep_tree_35/an_absurdly_deep_tree_36/an_absurdly_deep_tree_37/an_absurdly_deep_tree_38/an_absurdly_deep_tree_39/an_absurdly_deep_tree_40/an_absurdly_deep_tree_41/an_absurdly_deep_tree_42/an_absurdly_deep_tree_43/an_absurdly_deep_tree_44/an_absurdly_deep_tree_45/an_absurdly_deep_tree_46/an_absurdly_deep_tree_47/an_absurdly_deep_tree_48/an_absurdly_deep_tree_49/an_absurdly_deep_tree_50/an_absurdly_deep_tree_51/an_absurdly_deep_tree_52/an_absurdly_deep_tree_53/an_absurdly_deep_tree_54/an_absurdly_deep_tree_55/an_absurdly_deep_tree_56/an_absurdly_deep_tree_57/an_absurdly_deep_tree_58/an_absurdly_deep_tree_59/an_absurdly_deep_tree_60/an_absurdly_deep_tree_61/an_absurdly_deep_tree_62/an_absurdly_deep_tree_63/an_absurdly_deep_tree_64/an_absurdly_deep_tree_65/an_absurdly_deep_tree_66/an_absurdly_deep_tree_67/an_absurdly_deep_tree_68/an_absurdly_deep_tree_69/an_absurdly_deep_tree_70/an_absurdly_deep_tree_71/an_absurdly_deep_tree_72/an_absurdly_deep_tree_73/an_absurdly_deep_tree_74/an_absurdly_deep_tree_75/an_absurdly_deep_tree_76/an_absurdly_deep_tree_77/an_absurdly_deep_tree_78/an_absurdly_deep_tree_79/an_absurdly_deep_tree_80/an_absurdly_deep_tree_81/an_absurdly_deep_tree_82/an_absurdly_deep_tree_83/an_absurdly_deep_tree_84/an_absurdly_deep_tree_85/an_absurdly_deep_tree_86/an_absurdly_deep_tree_87/an_absurdly_deep_tree_88/an_absurdly_deep_tree_89/an_absurdly_deep_tree_90/an_absurdly_deep_tree_91/an_absurdly_deep_tree_92/an_absurdly_deep_tree_93/an_absurdly_deep_tree_94/an_absurdly_deep_tree_95/an_absurdly_deep_tree_96/an_absurdly_deep_tree_97/an_absurdly_deep_tree_98/an_absurdly_deep_tree_99/an_absurdly_deep_tree_100/an_absurdly_deep_tree_101/an_absurdly_deep_tree_102/an_absurdly_deep_tree_103/an_absurdly_deep_tree_104/an_absurdly_deep_tree_105/an_absurdly_deep_tree_106/an_absurdly_deep_tree_107/an_absurdly_deep_tree_108/an_absurdly_deep_tree_109/an_absurdly_deep_tree_110/an_absurdly_deep_tree_111/an_absurdly_deep_tree_112/an_absurdly_deep_tree_113/an_absurdly_deep_tree_114/an_absurdly_deep_tree_115/an_absurdly_deep_tree_116/an_absurdly_deep_tree_117/an_absurdl/very_long_site.c"
static void very_long_file_keeps_line_and_function(void **state)
{
    (void)state;
    /* past what a call site may take (about 1000 bytes): the file name
     * loses its start, never the line or the function */
    assert_int_equal((int)strlen(__FILE__), 3000);
    int line = __LINE__ + 1;
    assert_null(nt_relu_at(NT_HERE, NULL));
    const char *m = nt_last_error_message();
    assert_true(strncmp(m, "nt_relu: argument 't' is NULL (at ...", 37) == 0);
    char end[200];
    snprintf(end, sizeof end, "/very_long_site.c:%d in %s)", line, __func__);
    size_t ml = strlen(m), el = strlen(end);
    assert_true(ml > el && strcmp(m + ml - el, end) == 0);
    /* what is kept of the file is its tail, unchanged */
    const char *kept = m + 37;
    size_t kl = (size_t)(strstr(kept, end) - kept), sl = strlen("/very_long_site.c");
    assert_true(kl > 500);
    assert_memory_equal(kept, __FILE__ + 3000 - sl - kl, kl);
    nt_clear_error();
}

static void long_message_keeps_its_ends(void **state)
{
    (void)state;
    /* a path longer than the limit: the message is cut in its middle; it
     * still starts with the function's name and ends with the system's
     * reason */
    size_t n = 6000;
    char *path = malloc(n + 1);
    assert_non_null(path);
    memset(path, 'x', n);
    memcpy(path, "/nonexistent/", 13);
    path[n] = '\0';
    nt_tensor *p = nt_zeros(NT_F32, 1, (int64_t[]){2});
    assert_int_equal(nt_load(path, &p, 1, NULL), NT_EIO);
    const char *m = nt_last_error_message();
    assert_int_equal((int)strlen(m), 4095);
    assert_true(strncmp(m, "nt_load: cannot open '/nonexistent/xxx", 38) == 0);
    assert_non_null(strstr(m, "xxx [...] xxx"));
    assert_non_null(strstr(m, "xxx': "));
    nt_clear_error();
    assert_int_equal(nt_release(p), 0);
    free(path);
}
