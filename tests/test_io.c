/* tests/test_io.c - io/checkpoint.c's named checkpoints: nt_checkpoint_write,
 * nt_checkpoint_read (by name, in any order, partial with a report, strict),
 * nt_checkpoint_list, generators' states, the old positional files, and
 * every bad input leaving files and tensors as they were.  (The positional
 * nt_save / nt_load with optimizers are tested in tests/test_optim.c.) */
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

#include "nt_test.h"
#include "ntensor.h"

static char path[64];

static int setup_io(void **state)
{
    snprintf(path, sizeof path, "/tmp/nt_test_io_%d.ckpt", (int)getpid());
    return nt_test_setup(state);
}
static int teardown_io(void **state)
{
    unlink(path);
    return nt_test_teardown(state);
}

static nt_tensor *make(float base, int64_t r, int64_t c)
{
    float v[64];
    for (int i = 0; i < r * c; i++)
        v[i] = base + 0.25f * (float)i;
    return nt_from_host(v, NT_F32, 2, (int64_t[]){r, c});
}

static void values(nt_tensor *t, float *out, size_t n)
{
    assert_int_equal(nt_to_host(t, out, n * sizeof *out), 0);
}

static void expect_err(int rc, int code, const char *a, const char *b)
{
    assert_int_equal(rc, code);
    const char *m = nt_last_error_message();
    if (!strstr(m, a) || (b && !strstr(m, b)))
        fail_msg("message '%s' lacks '%s' / '%s'", m, a, b ? b : "");
    nt_clear_error();
}

/* Names round trip in another order; the list is state_dict's keys. */
static void test_named_round_trip(void **state)
{
    (void)state;
    nt_tensor *w = make(1, 3, 4), *b = make(-2, 1, 4);
    int32_t iv[3] = {7, -8, 9};
    nt_tensor *ids = nt_from_host(iv, NT_I32, 1, (int64_t[]){3});
    nt_tensor *h = nt_cast(make(0.5f, 2, 2), NT_BF16);
    nt_tensor *ts[4] = {w, b, ids, h};
    const char *names[4] = {"layer.weight", "layer.bias", "ids", "half"};
    assert_int_equal(nt_checkpoint_write(path, &(nt_checkpoint_spec){ts, names, 4}), 0);

    nt_checkpoint_entry *e;
    int n;
    assert_int_equal(nt_checkpoint_list(path, &e, &n), 0);
    assert_int_equal(n, 4);
    assert_string_equal(e[0].name, "layer.weight");
    assert_int_equal(e[0].ndim, 2);
    assert_int_equal(e[0].shape[0], 3);
    assert_int_equal(e[0].shape[1], 4);
    assert_string_equal(e[2].name, "ids");
    assert_int_equal(e[2].dtype, NT_I32);
    assert_int_equal(e[3].dtype, NT_BF16);
    nt_checkpoint_list_free(e, n);

    /* fresh tensors, asked for in another order */
    nt_tensor *w2 = nt_zeros(NT_F32, 2, (int64_t[]){3, 4}), *b2 = nt_zeros(NT_F32, 2,
                                                                             (int64_t[]){1, 4});
    nt_tensor *ids2 = nt_zeros(NT_I32, 1, (int64_t[]){3}), *h2 = nt_zeros(NT_BF16, 2,
                                                                           (int64_t[]){2, 2});
    nt_tensor *ts2[4] = {h2, ids2, b2, w2};
    const char *names2[4] = {"half", "ids", "layer.bias", "layer.weight"};
    nt_load_report rep;
    assert_int_equal(nt_checkpoint_read(path, &(nt_checkpoint_spec){ts2, names2, 4}, true, &rep),
                     0);
    assert_int_equal(rep.loaded, 4);
    assert_int_equal(rep.n_missing + rep.n_unexpected, 0);
    nt_load_report_clear(&rep);
    float a[12], z[12];
    values(w, a, 12);
    values(w2, z, 12);
    assert_memory_equal(a, z, sizeof a);
    int32_t iz[3];
    assert_int_equal(nt_to_host(ids2, iz, sizeof iz), 0);
    assert_memory_equal(iv, iz, sizeof iv);
    uint16_t hb[4], hz[4];
    assert_int_equal(nt_to_host(h, hb, sizeof hb), 0);
    assert_int_equal(nt_to_host(h2, hz, sizeof hz), 0);
    assert_memory_equal(hb, hz, sizeof hb);
    /* the positional reader still loads a named file */
    assert_int_equal(nt_load(path, ts, 4, NULL), 0);
    for (int i = 0; i < 4; i++) {
        nt_release(ts[i]);
        nt_release(ts2[i]);
    }
}

/* A model that renamed one tensor and gained one: strict refuses and
 * changes nothing; non-strict loads the rest and reports both lists. */
static void test_partial_load_report(void **state)
{
    (void)state;
    nt_tensor *a = make(1, 2, 3), *b = make(5, 2, 2), *old = make(9, 1, 1);
    nt_tensor *ts[3] = {a, b, old};
    const char *names[3] = {"a", "b", "old"};
    assert_int_equal(nt_checkpoint_write(path, &(nt_checkpoint_spec){ts, names, 3}), 0);

    nt_tensor *a2 = nt_zeros(NT_F32, 2, (int64_t[]){2, 3});
    nt_tensor *b2 = nt_zeros(NT_F32, 2, (int64_t[]){2, 2});
    nt_tensor *nw = nt_full(NT_F32, 1, (int64_t[]){2}, 3.0);
    nt_tensor *ts2[3] = {a2, nw, b2};
    const char *names2[3] = {"a", "new", "b"};
    nt_load_report rep;
    expect_err(nt_checkpoint_read(path, &(nt_checkpoint_spec){ts2, names2, 3}, true, &rep),
               NT_EINVAL, "missing from the file: \"new\"", "not passed: \"old\"");
    assert_int_equal(rep.n_missing + rep.n_unexpected + rep.loaded, 0); /* cleared */
    float v[6];
    values(a2, v, 6);
    for (int i = 0; i < 6; i++)
        assert_true(v[i] == 0.0f); /* nothing changed */

    assert_int_equal(nt_checkpoint_read(path, &(nt_checkpoint_spec){ts2, names2, 3}, false, &rep),
                     0);
    assert_int_equal(rep.loaded, 2);
    assert_int_equal(rep.n_missing, 1);
    assert_string_equal(rep.missing[0], "new");
    assert_int_equal(rep.n_unexpected, 1);
    assert_string_equal(rep.unexpected[0], "old");
    nt_load_report_clear(&rep);
    float w[6];
    values(a, w, 6);
    values(a2, v, 6);
    assert_memory_equal(v, w, sizeof v);
    values(nw, v, 2);
    assert_true(v[0] == 3.0f && v[1] == 3.0f); /* left as it was */
    /* a report is optional */
    assert_int_equal(nt_checkpoint_read(path, &(nt_checkpoint_spec){ts2, names2, 3}, false, NULL),
                     0);
    for (int i = 0; i < 3; i++) {
        nt_release(ts[i]);
        nt_release(ts2[i]);
    }
}

/* A matched name with another shape names the tensor and both shapes; a
 * file without names calls its tensors "0", "1". */
static void test_shape_mismatch_and_old_files(void **state)
{
    (void)state;
    nt_tensor *a = make(1, 2, 3), *b = make(5, 2, 2);
    nt_tensor *ts[2] = {a, b};
    assert_int_equal(nt_save(path, ts, 2, NULL), 0); /* positional */
    nt_checkpoint_entry *e;
    int n;
    assert_int_equal(nt_checkpoint_list(path, &e, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(e[0].name, "0");
    assert_string_equal(e[1].name, "1");
    nt_checkpoint_list_free(e, n);
    nt_tensor *x = nt_zeros(NT_F32, 2, (int64_t[]){2, 2});
    nt_tensor *y = nt_zeros(NT_F32, 2, (int64_t[]){3, 2});
    nt_tensor *ts2[2] = {x, y};
    const char *byidx[2] = {"1", "0"};
    expect_err(nt_checkpoint_read(path, &(nt_checkpoint_spec){ts2, byidx, 2}, true, NULL),
               NT_ESHAPE, "tensor \"0\" is f32 [2, 3] in the file", "passed is f32 [3, 2]");
    float v[6];
    values(x, v, 4);
    assert_true(v[0] == 0.0f); /* nothing changed */
    nt_release(y);
    y = nt_zeros(NT_F32, 2, (int64_t[]){2, 3});
    ts2[1] = y;
    assert_int_equal(nt_checkpoint_read(path, &(nt_checkpoint_spec){ts2, byidx, 2}, true, NULL),
                     0);
    float w[6];
    values(a, w, 6);
    values(y, v, 6);
    assert_memory_equal(v, w, sizeof v);
    nt_release(a);
    nt_release(b);
    nt_release(x);
    nt_release(y);
}

/* One AdamW step, its state saved by name, loaded into a new model and
 * optimizer: the next step gives the bits of the run that never stopped.
 * A partial load with an optimizer is refused. */
static void adam_step(nt_tensor *w, nt_optim *o, float scale)
{
    nt_scope *sc = nt_scope_begin();
    assert_int_equal(nt_backward(nt_sum(nt_mul_scalar(nt_mul(w, w), scale), NT_DIM_ALL, false)),
                     0);
    assert_int_equal(nt_optim_step(o), 0);
    assert_int_equal(nt_optim_zero_grad(o), 0);
    nt_scope_end(sc);
}

static void test_optimizer_by_name(void **state)
{
    (void)state;
    nt_tensor *w = make(0.5f, 2, 3), *u = make(-1, 3, 1);
    nt_set_requires_grad(w, true);
    nt_set_requires_grad(u, true);
    nt_tensor *ps[2] = {w, u};
    nt_optim *o = nt_optim_adamw(ps, 2, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    assert_non_null(o);
    adam_step(w, o, 1.0f);
    adam_step(u, o, 2.0f);
    const char *names[2] = {"w", "u"};
    assert_int_equal(nt_checkpoint_write(path, &(nt_checkpoint_spec){ps, names, 2, o}), 0);
    adam_step(w, o, 3.0f);
    float want[6], got[6];
    values(w, want, 6);

    nt_tensor *w2 = nt_zeros(NT_F32, 2, (int64_t[]){2, 3}), *u2 = nt_zeros(NT_F32, 2,
                                                                            (int64_t[]){3, 1});
    nt_set_requires_grad(w2, true);
    nt_set_requires_grad(u2, true);
    nt_tensor *ps2[2] = {w2, u2};
    nt_optim *o2 = nt_optim_adamw(ps2, 2, 1.0, 0.9, 0.999, 1e-8, 0.01);
    /* the caller's list in another order: matched by name */
    nt_tensor *rev[2] = {u2, w2};
    const char *revn[2] = {"u", "w"};
    assert_int_equal(nt_checkpoint_read(path, &(nt_checkpoint_spec){rev, revn, 2, o2}, true,
                                        NULL), 0);
    assert_true(nt_optim_get_lr(o2) == 1e-2);
    adam_step(w2, o2, 3.0f);
    values(w2, got, 6);
    assert_memory_equal(want, got, sizeof want);
    /* partial with an optimizer: refused, whatever strict says */
    const char *one[1] = {"w"};
    expect_err(nt_checkpoint_read(path, &(nt_checkpoint_spec){ps2, one, 1, o2}, false, NULL),
               NT_EINVAL, "not passed: \"u\"", "every name matches");
    nt_optim_destroy(o);
    nt_optim_destroy(o2);
    nt_release(w);
    nt_release(u);
    nt_release(w2);
    nt_release(u2);
}

/* Generators' states come back; counts must agree. */
static void test_generators(void **state)
{
    (void)state;
    nt_tensor *a = make(1, 1, 2);
    nt_generator *g[2] = {nt_generator_create(5), nt_generator_create(6)};
    assert_int_equal(nt_generator_advance(g[0], 3), 0);
    assert_int_equal(nt_generator_advance(g[1], 7), 0);
    assert_int_equal(nt_checkpoint_write(path, &(nt_checkpoint_spec){&a, NULL, 1, NULL, NULL,
                                                                      g, 2}), 0);
    assert_int_equal(nt_generator_set_state(g[0], 1, 100), 0);
    assert_int_equal(nt_generator_advance(g[1], 50), 0);
    assert_int_equal(nt_checkpoint_read(path, &(nt_checkpoint_spec){&a, NULL, 1, NULL, NULL,
                                                                     g, 2}, true, NULL), 0);
    uint64_t s, o;
    assert_int_equal(nt_generator_get_state(g[0], &s, &o), 0);
    assert_true(s == 5 && o == 3);
    assert_int_equal(nt_generator_get_state(g[1], &s, &o), 0);
    assert_true(s == 6 && o == 7);
    expect_err(nt_checkpoint_read(path, &(nt_checkpoint_spec){&a, NULL, 1, NULL, NULL, g, 1},
                                  true, NULL), NT_ESHAPE, "holds 2 generators", NULL);
    assert_int_equal(nt_save(path, &a, 1, NULL), 0);
    expect_err(nt_checkpoint_read(path, &(nt_checkpoint_spec){&a, NULL, 1, NULL, NULL, g, 2},
                                  true, NULL), NT_EINVAL, "holds no generator state", NULL);
    nt_generator_destroy(g[0]);
    nt_generator_destroy(g[1]);
    nt_release(a);
}

/* Bad names and specs: NT_EINVAL naming the field; no file is written. */
static void test_bad_input(void **state)
{
    (void)state;
    unlink(path);
    nt_tensor *a = make(1, 1, 2), *b = make(2, 1, 2);
    nt_tensor *ts[2] = {a, b};
    char longname[300];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    const char *dup[2] = {"p", "p"}, *empty[2] = {"p", ""}, *nul[2] = {"p", NULL},
               *lng[2] = {"p", longname};
    expect_err(nt_checkpoint_write(path, &(nt_checkpoint_spec){ts, dup, 2}), NT_EINVAL,
               "nt_checkpoint_write", "'names[0]' and 'names[1]' are both \"p\"");
    expect_err(nt_checkpoint_write(path, &(nt_checkpoint_spec){ts, empty, 2}), NT_EINVAL,
               "'names[1]' is empty", NULL);
    expect_err(nt_checkpoint_write(path, &(nt_checkpoint_spec){ts, nul, 2}), NT_EINVAL,
               "'names[1]' is NULL", NULL);
    expect_err(nt_checkpoint_write(path, &(nt_checkpoint_spec){ts, lng, 2}), NT_EINVAL,
               "'names[1]' is too long", NULL);
    expect_err(nt_checkpoint_write(path, NULL), NT_EINVAL, "'spec' is NULL", NULL);
    nt_generator *gz[1] = {NULL};
    expect_err(nt_checkpoint_write(path, &(nt_checkpoint_spec){ts, NULL, 2, NULL, NULL, gz, 1}),
               NT_EINVAL, "'spec->gens[0]' is NULL", NULL);
    assert_true(access(path, F_OK) != 0); /* nothing written */
    expect_err(nt_checkpoint_read(path, &(nt_checkpoint_spec){ts, NULL, 2}, true, NULL), NT_EIO,
               "nt_checkpoint_read", NULL);
    expect_err(nt_checkpoint_read(path, NULL, true, NULL), NT_EINVAL, "'spec' is NULL", NULL);
    nt_checkpoint_entry *e = (nt_checkpoint_entry *)1;
    int n = 5;
    expect_err(nt_checkpoint_list(path, &e, &n), NT_EIO, "nt_checkpoint_list", NULL);
    assert_null(e);
    assert_int_equal(n, 0);
    expect_err(nt_checkpoint_list(NULL, &e, &n), NT_EINVAL, "'path' is NULL", NULL);
    nt_load_report_clear(NULL);
    nt_release(a);
    nt_release(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup_io, teardown_io)
        T(test_named_round_trip), T(test_partial_load_report), T(test_shape_mismatch_and_old_files),
        T(test_optimizer_by_name), T(test_generators),         T(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
