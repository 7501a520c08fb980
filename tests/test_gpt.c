/* tests/test_gpt.c - the character GPT of examples/char_gpt.c
 * (examples/gpt_model.h): a tiny config trained a few steps gives the same
 * losses and parameters bit for bit in every mode and on both backends
 * (with dropout, gradient clipping, the schedule and bf16 autocast in the
 * step); the batch sampler, schedule and clipping against independent
 * host computations; the data loader's errors.  No timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "examples/gpt_model.h"

static const char *const modes[] = {"deterministic", "eager", "adaptive", "lazy"};
#define NMODES 4
#define STEPS 3

/* A small text whose next character is learnable. */
static void tiny_data(gpt_data *d)
{
    static const char s[] = "the quick brown fox jumps over the lazy dog.\n%\n";
    int64_t n = 2000;
    uint8_t *t = malloc((size_t)n);
    assert_non_null(t);
    for (int64_t i = 0; i < n; i++)
        t[i] = (uint8_t)s[i % (int64_t)(sizeof s - 1)];
    memset(d, 0, sizeof *d);
    gpt_data_from_text(d, t, n);
    assert_non_null(d->ids);
}

typedef struct {
    uint32_t loss[STEPS]; /* f32 bits */
    double val;
    uint32_t sum_bits;    /* bits of the sum of every parameter after training */
} run_result;

static uint32_t f32_bits(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static bool tiny_checkpoint; /* the blocks under nt_checkpoint */

static void train_tiny(const char *mode, const char *backend, nt_dtype amp, bool untied,
                       run_result *r)
{
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    gpt_data d;
    tiny_data(&d);
    gpt_config c = {.n_layer = 2, .n_head = 2, .width = 16, .context = 8, .vocab = d.vocab,
                    .untied = untied, .dropout = 0.1, .checkpoint = tiny_checkpoint};
    gpt_train_opts o = {.batch = 2, .lr = 1e-2, .clip = 0.5, .steps = STEPS, .warmup = 1,
                        .amp = amp, .seed = 7};
    gpt_model m;
    assert_int_equal(gpt_init(&m, &c, 3), 0);
    nt_optim *opt = gpt_optimizer(&m, &o, 0.1);
    assert_non_null(opt);
    int32_t xb[16], yb[16];
    for (int s = 0; s < STEPS; s++) {
        nt_tensor *loss = gpt_train_step(&m, opt, &d, &o, s, xb, yb);
        if (!loss)
            fail_msg("%s/%s step %d: %s", mode, backend, s, nt_last_error_message());
        double l;
        assert_int_equal(nt_item(loss, &l), 0);
        r->loss[s] = f32_bits(l);
        nt_release(loss);
    }
    r->val = gpt_eval(&m, &d, 2, 2, amp);
    assert_false(isnan(r->val));
    nt_scope *sc = nt_scope_begin();
    nt_tensor *tot = nt_zeros(NT_F32, 0, NULL);
    for (int i = 0; i < m.n_params; i++)
        assert_int_equal(nt_add_inplace(tot, nt_sum(m.p[i], NT_DIM_ALL, false)), 0);
    double sum;
    assert_int_equal(nt_item(tot, &sum), 0);
    r->sum_bits = f32_bits(sum);
    nt_scope_end(sc);
    gpt_optimizer_free(opt, &o);
    gpt_free(&m);
    gpt_data_free(&d);
}

/* Every mode and backend: the same bits as deterministic mode on the CPU
 * (without checkpointing: with it, the runs must give that reference's
 * bits too). */
static void check_all_modes(nt_dtype amp, bool untied)
{
    run_result ref;
    memset(&ref, 0, sizeof ref);
    bool ck = tiny_checkpoint;
    tiny_checkpoint = false;
    train_tiny("deterministic", "cpu", amp, untied, &ref);
    tiny_checkpoint = ck;
    /* it learned something: the loss moved */
    assert_true(ref.loss[0] != ref.loss[STEPS - 1]);
    for (int b = 0; b < 2; b++)
        for (int mi = 0; mi < NMODES; mi++) {
            run_result r;
            memset(&r, 0, sizeof r);
            const char *be = b ? "sim" : "cpu";
            train_tiny(modes[mi], be, amp, untied, &r);
            for (int s = 0; s < STEPS; s++)
                if (r.loss[s] != ref.loss[s])
                    fail_msg("%s/%s: step %d loss bits %08x, deterministic cpu %08x", modes[mi],
                             be, s, r.loss[s], ref.loss[s]);
            assert_true(f32_bits(r.val) == f32_bits(ref.val));
            assert_int_equal(r.sum_bits, ref.sum_bits);
        }
}

static void test_bitwise_f32(void **state)
{
    (void)state;
    check_all_modes(NT_DTYPE_COUNT, false);
}

static void test_bitwise_bf16_untied(void **state)
{
    (void)state;
    check_all_modes(NT_BF16, true);
}

/* --checkpoint-activations (dropout included): bit-identical training. */
static void test_bitwise_checkpointed(void **state)
{
    (void)state;
    tiny_checkpoint = true;
    check_all_modes(NT_DTYPE_COUNT, false);
    check_all_modes(NT_BF16, true);
    tiny_checkpoint = false;
}

/* splitmix64 (seed 0: first outputs known), windows in range, the
 * validation split after the training one. */
static void test_sampler(void **state)
{
    (void)state;
    assert_true(gpt_rand_at(0, 0) == 0xE220A8397B1DCDAFull);
    assert_true(gpt_rand_at(0, 1) == 0x6E789E6AA1B965F4ull);
    gpt_data d;
    tiny_data(&d);
    assert_int_equal(d.n_train, 1800);
    assert_int_equal(d.vocab, 30); /* 26 letters, space, '.', newline, '%' */
    int32_t x[4 * 8], y[4 * 8], x2[4 * 8], y2[4 * 8];
    gpt_batch(&d, false, 5, 9, 4, 8, x, y);
    gpt_batch(&d, false, 5, 9, 4, 8, x2, y2);
    assert_memory_equal(x, x2, sizeof x);
    for (int b = 0; b < 4; b++) {
        int64_t off = (int64_t)(gpt_rand_at(5, 9 * 4 + (uint64_t)b) % (uint64_t)(1800 - 8));
        for (int t = 0; t < 8; t++) {
            assert_int_equal(x[b * 8 + t], d.ids[off + t]);
            assert_int_equal(y[b * 8 + t], d.ids[off + t + 1]);
        }
    }
    gpt_batch(&d, true, 5, 0, 4, 8, x, y);
    int64_t off = 1800 + (int64_t)(gpt_rand_at(5, 0) % (uint64_t)(200 - 8));
    assert_int_equal(x[0], d.ids[off]);
    gpt_data_free(&d);
}

/* gpt_optimizer's schedule: warm-up from lr/warmup to lr, cosine to lr/10
 * at the last step, in both groups. */
static double lr_at(nt_optim *opt, gpt_train_opts *o, int64_t step)
{
    while (nt_optim_steps(opt) < step)
        assert_int_equal(nt_optim_step(opt), 0); /* no .grads: only counts */
    assert_int_equal(nt_scheduler_step(o->sched), 0);
    assert_true(nt_optim_get_group_lr(opt, 0) == nt_optim_get_group_lr(opt, 1));
    return nt_optim_get_group_lr(opt, 1);
}

static void test_schedule(void **state)
{
    (void)state;
    gpt_data d;
    tiny_data(&d);
    gpt_config c = {.n_layer = 1, .n_head = 1, .width = 8, .context = 4, .vocab = d.vocab};
    gpt_train_opts o = {.lr = 1.0, .steps = 100, .warmup = 10};
    gpt_model m;
    assert_int_equal(gpt_init(&m, &c, 3), 0);
    nt_optim *opt = gpt_optimizer(&m, &o, 0.1);
    assert_non_null(opt);
    assert_int_equal(nt_optim_ngroups(opt), 2);
    assert_true(nt_optim_get_group_weight_decay(opt, 1) == 0);
    assert_true(fabs(lr_at(opt, &o, 0) - 0.1) < 1e-15);
    assert_true(fabs(lr_at(opt, &o, 9) - 1.0) < 1e-15);
    assert_true(fabs(lr_at(opt, &o, 10) - 1.0) < 1e-15);
    double mid = lr_at(opt, &o, 54); /* progress 44 / 89 */
    double want = 0.1 + 0.45 * (1 + cos(M_PI * 44.0 / 89.0));
    assert_true(fabs(mid - want) < 1e-12);
    assert_true(fabs(lr_at(opt, &o, 99) - 0.1) < 1e-15);
    gpt_optimizer_free(opt, &o);
    gpt_free(&m);
    gpt_data_free(&d);
}

/* The gradients after gpt_clip_grads: scaled by max / total when total is
 * above max, untouched below; total = the L2 norm of all of them. */
static void test_clip(void **state)
{
    (void)state;
    float a[6] = {3, 0, 0, 0, 4, 0}, b[2] = {0, 12}; /* norm 13 */
    nt_tensor *pa = nt_from_host(a, NT_F32, 1, (int64_t[]){6});
    nt_tensor *pb = nt_from_host(b, NT_F32, 1, (int64_t[]){2});
    nt_tensor *pc = nt_zeros(NT_F32, 1, (int64_t[]){3}); /* no .grad: skipped */
    assert_int_equal(nt_set_requires_grad(pa, true), 0);
    assert_int_equal(nt_set_requires_grad(pb, true), 0);
    assert_int_equal(nt_set_requires_grad(pc, true), 0);
    for (int round = 0; round < 2; round++) {
        nt_scope *sc = nt_scope_begin();
        /* loss = sum(pa * a) + sum(pb * b): grads a and b */
        nt_tensor *ta = nt_from_host(a, NT_F32, 1, (int64_t[]){6});
        nt_tensor *tb = nt_from_host(b, NT_F32, 1, (int64_t[]){2});
        nt_tensor *loss = nt_add(nt_sum(nt_mul(pa, ta), NT_DIM_ALL, false),
                                 nt_sum(nt_mul(pb, tb), NT_DIM_ALL, false));
        assert_int_equal(nt_backward(loss), 0);
        double max = round ? 100.0 : 6.5;
        nt_tensor *tot = gpt_clip_grads((nt_tensor *[]){pa, pb, pc}, 3, max);
        assert_non_null(tot);
        double t;
        assert_int_equal(nt_item(tot, &t), 0);
        assert_true(fabs(t - 13.0) < 1e-5);
        float ga[6], gb[2];
        assert_int_equal(nt_to_host(nt_grad(pa), ga, sizeof ga), 0);
        assert_int_equal(nt_to_host(nt_grad(pb), gb, sizeof gb), 0);
        double scale = round ? 1.0 : 6.5 / (13.0 + 1e-6);
        assert_true(fabs(ga[0] - 3 * scale) < 1e-5 && fabs(ga[4] - 4 * scale) < 1e-5);
        assert_true(fabs(gb[1] - 12 * scale) < 1e-5 && ga[1] == 0);
        assert_null(nt_grad(pc));
        assert_int_equal(nt_zero_grad(pa), 0);
        assert_int_equal(nt_zero_grad(pb), 0);
        nt_scope_end(sc);
    }
    nt_release(pa);
    nt_release(pb);
    nt_release(pc);
}

/* A missing directory and one without enough text: -1, nothing leaked. */
static void test_data_errors(void **state)
{
    (void)state;
    gpt_data d;
    assert_int_equal(gpt_data_load(&d, "/nonexistent/fortunes"), -1);
    assert_int_equal(nt_test_dir_make("gpt"), 0);
    char path[400];
    snprintf(path, sizeof path, "%s/tiny", nt_test_dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("too short\n%\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/tiny.dat", nt_test_dir); /* skipped */
    f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 4096; i++)
        fputc('x', f);
    fclose(f);
    assert_int_equal(gpt_data_load(&d, nt_test_dir), -1);
    /* enough text: loads, in name order */
    snprintf(path, sizeof path, "%s/big", nt_test_dir);
    f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 2048; i++)
        fputc('a' + i % 3, f);
    fclose(f);
    assert_int_equal(gpt_data_load(&d, nt_test_dir), 0);
    assert_int_equal(d.files, 2);
    assert_int_equal(d.n, 2048 + 12);
    assert_int_equal(d.ids[0], d.stoi['a']);
    assert_int_equal(d.ids[2048], d.stoi['t']);
    gpt_data_free(&d);
    assert_int_equal(nt_test_dir_remove(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bitwise_f32, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bitwise_checkpointed, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bitwise_bf16_untied, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_schedule),
        cmocka_unit_test_setup_teardown(test_clip, nt_test_setup, nt_test_teardown),
        cmocka_unit_test(test_data_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
