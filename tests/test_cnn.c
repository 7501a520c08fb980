/* tests/test_cnn.c - the ResNet-style CNN of examples/cnn.c
 * (examples/cnn_model.h) on a small made-up data set (no download): a few
 * training steps lower the loss, and give the same losses and the same
 * parameter and running-statistics CRC bit for bit in every mode
 * (deterministic, eager, adaptive, lazy) and on both backends, with SGD
 * and with AdamW; evaluation leaves the model as it was; the batch order
 * is the one bench/peer/cnn.py draws.  No timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "examples/cnn_model.h"

static const char *const modes[] = {"deterministic", "eager", "adaptive", "lazy"};
#define NMODES 4
#define N_IMAGES 48
#define BATCH 12
#define STEPS 8 /* two epochs of 4 batches */
#define WIDTH 4

/* Images whose class is learnable: class c has a bright bar across rows
 * 2c .. 2c + 3 (columns for odd images), over noise. */
static void tiny_data(cnn_data *d)
{
    d->n = N_IMAGES;
    d->images = malloc((size_t)N_IMAGES * CNN_PIXELS);
    d->labels = malloc(N_IMAGES);
    assert_non_null(d->images);
    assert_non_null(d->labels);
    uint64_t s = 99;
    for (int i = 0; i < N_IMAGES; i++) {
        int c = (i * 7) % CNN_CLASSES;
        d->labels[i] = (uint8_t)c;
        for (int p = 0; p < CNN_PIXELS; p++) {
            int r = p / 28, col = p % 28, at = i % 2 ? col : r;
            uint8_t noise = (uint8_t)(cnn_splitmix64(&s) % 64);
            d->images[(size_t)i * CNN_PIXELS + p] =
                (uint8_t)(at >= 2 * c && at < 2 * c + 4 ? 190 + noise : noise);
        }
    }
}

typedef struct {
    uint32_t loss[STEPS]; /* f32 bits */
    uint32_t crc;         /* parameters and running statistics after training */
    uint32_t crc_eval;    /* the same after an evaluation */
    double acc;
} run_result;

static uint32_t f32_bits(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void train_tiny(const char *mode, const char *backend, bool adamw, run_result *r)
{
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    cnn_data d;
    tiny_data(&d);
    cnn_train_opts o = {.batch = BATCH, .width = WIDTH, .warmup = 1, .adamw = adamw,
                        .lr = adamw ? 5e-3 : 0.05, .wd = -1, .total_steps = STEPS};
    cnn_opts_defaults(&o, d.n);
    cnn_model m;
    assert_int_equal(cnn_init(&m, WIDTH, 3), 0);
    nt_scheduler *sched;
    nt_optim *opt = cnn_optimizer(&m, &o, &sched);
    assert_non_null(opt);
    assert_non_null(sched);
    float xb[BATCH * CNN_PIXELS];
    int32_t yb[BATCH];
    int order[N_IMAGES];
    for (int s = 0; s < STEPS; s++) {
        int per = N_IMAGES / BATCH;
        if (s % per == 0)
            cnn_epoch_order(order, N_IMAGES, 5, s / per);
        nt_tensor *c = NULL;
        nt_tensor *loss = cnn_train_step(&m, opt, sched, &d, order + (s % per) * BATCH, BATCH, xb,
                                         yb, &c);
        if (!loss)
            fail_msg("%s/%s step %d: %s", mode, backend, s, nt_last_error_message());
        double l, cc;
        assert_int_equal(nt_item(loss, &l), 0);
        assert_int_equal(nt_item(c, &cc), 0);
        assert_true(cc >= 0 && cc <= BATCH);
        r->loss[s] = f32_bits(l);
        nt_release(loss);
        nt_release(c);
    }
    bool ok;
    r->crc = cnn_crc(&m, &ok);
    assert_true(ok);
    r->acc = cnn_evaluate(&m, &d, 0);
    assert_false(isnan(r->acc));
    r->crc_eval = cnn_crc(&m, &ok);
    assert_true(ok);
    nt_scheduler_destroy(sched);
    nt_optim_destroy(opt);
    cnn_free(&m);
    free(d.images);
    free(d.labels);
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Every mode and backend against deterministic mode on the CPU. */
static void check_all_modes(bool adamw)
{
    run_result ref;
    memset(&ref, 0, sizeof ref);
    train_tiny("deterministic", "cpu", adamw, &ref);
    /* it learned: the last two losses are below the first two */
    float first = bits_f32(ref.loss[0]) + bits_f32(ref.loss[1]);
    float last = bits_f32(ref.loss[STEPS - 2]) + bits_f32(ref.loss[STEPS - 1]);
    if (!(last < first))
        fail_msg("%s: the loss did not go down (first two %g, last two %g)",
                 adamw ? "adamw" : "sgd", first, last);
    assert_int_equal(ref.crc_eval, ref.crc); /* evaluation changes nothing */
    for (int b = 0; b < 2; b++)
        for (int mi = 0; mi < NMODES; mi++) {
            const char *be = b ? "sim" : "cpu";
            if (!b && !mi)
                continue;
            run_result r;
            memset(&r, 0, sizeof r);
            train_tiny(modes[mi], be, adamw, &r);
            for (int s = 0; s < STEPS; s++)
                if (r.loss[s] != ref.loss[s])
                    fail_msg("%s/%s: step %d loss bits %08x, deterministic cpu %08x", modes[mi],
                             be, s, r.loss[s], ref.loss[s]);
            if (r.crc != ref.crc || r.crc_eval != ref.crc)
                fail_msg("%s/%s: parameters crc %08x (after evaluation %08x), deterministic "
                         "cpu %08x", modes[mi], be, r.crc, r.crc_eval, ref.crc);
            assert_true(r.acc == ref.acc);
        }
}

static void test_bitwise_sgd(void **state)
{
    (void)state;
    check_all_modes(false);
}

static void test_bitwise_adamw(void **state)
{
    (void)state;
    check_all_modes(true);
}

/* The order bench/peer/cnn.py's shuffle() gives (computed there):
 * shuffle(12, 1 * 1000003 + 0) and shuffle(12, 7 * 1000003 + 1). */
static void test_order(void **state)
{
    (void)state;
    static const int want0[12] = {2, 11, 1, 3, 6, 8, 5, 10, 9, 0, 7, 4};
    static const int want1[12] = {3, 11, 4, 2, 5, 9, 1, 7, 6, 8, 10, 0};
    int got[12];
    cnn_epoch_order(got, 12, 1, 0);
    assert_memory_equal(got, want0, sizeof got);
    cnn_epoch_order(got, 12, 7, 1);
    assert_memory_equal(got, want1, sizeof got);
}

/* The parameters' shapes and count, in the documented order. */
static void test_shapes(void **state)
{
    (void)state;
    cnn_model m;
    assert_int_equal(cnn_init(&m, 16, 1), 0);
    int64_t total = 0;
    for (int i = 0; i < CNN_NPARAMS; i++)
        total += nt_numel(m.p[i]);
    /* convolutions 9 (1*16 + 2*16*16 + 16*32 + 4*32*32), batch norms
     * 2 (3*16 + 5*32), linear 10*32 + 10: 46970, bench/peer/cnn.py's count */
    assert_int_equal(total, 9 * (16 + 512 + 512 + 4096) + 2 * (48 + 160) + 330);
    assert_int_equal(total, 46970);
    assert_int_equal(nt_ndim(m.p[9]), 4);
    assert_int_equal(nt_shape(m.p[9], 0), 32);
    assert_int_equal(nt_shape(m.p[9], 1), 16);
    assert_int_equal(nt_shape(m.p[CNN_NPARAMS - 2], 1), 32);
    cnn_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bitwise_sgd, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bitwise_adamw, nt_test_setup, nt_test_teardown),
        cmocka_unit_test(test_order),
        cmocka_unit_test_setup_teardown(test_shapes, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
