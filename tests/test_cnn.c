/* tests/test_cnn.c - the ResNet-style CNN of examples/cnn.c
 * (examples/cnn_model.h) on a small made-up data set (no download): a few
 * training steps lower the loss, and give the same losses and the same
 * parameter and running-statistics CRC bit for bit in every mode
 * (deterministic, eager, adaptive, lazy) and on both backends, with SGD
 * and with AdamW; evaluation leaves the model as it was; the batch order
 * is the one bench/peer/cnn.py draws; examples/fmnist.h reads .gz IDX
 * files whole, in place, and from several gzip members.  No timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Writes bytes [0, n) of p to path as gzip, in one member or (split > 0)
 * two: [0, split) and [split, n), so the trailer's size is the second's. */
static void write_gz(const char *path, const uint8_t *p, size_t n, size_t split)
{
    size_t cut = split ? split : n;
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, p, (unsigned)cut), (int)cut);
    assert_int_equal(gzclose(f), Z_OK);
    if (split) {
        f = gzopen(path, "ab");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, p + cut, (unsigned)(n - cut)), (int)(n - cut));
        assert_int_equal(gzclose(f), Z_OK);
    }
}

/* An IDX pair of n images (pixel (i * 31 + p * 7) mod 256, label i mod 10)
 * written under prefix `pre` of nt_test_dir, the images in two gzip members
 * when split; into *img and *lab (malloc'ed) as written. */
static void write_split(const char *pre, int n, bool split, uint8_t **img, uint8_t **lab)
{
    size_t ni = 16 + (size_t)n * FMNIST_PIXELS, nl = 8 + (size_t)n;
    uint8_t *im = malloc(ni), *lb = malloc(nl);
    assert_non_null(im);
    assert_non_null(lb);
    const uint32_t ih[4] = {0x803, (uint32_t)n, 28, 28}, lh[2] = {0x801, (uint32_t)n};
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 4; b++)
            im[4 * k + b] = (uint8_t)(ih[k] >> (24 - 8 * b));
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < 4; b++)
            lb[4 * k + b] = (uint8_t)(lh[k] >> (24 - 8 * b));
    for (int i = 0; i < n; i++) {
        for (int p = 0; p < FMNIST_PIXELS; p++)
            im[16 + (size_t)i * FMNIST_PIXELS + (size_t)p] = (uint8_t)((i * 31 + p * 7) % 256);
        lb[8 + i] = (uint8_t)(i % FMNIST_CLASSES);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", nt_test_dir, pre);
    /* split: the second member holds the last 10 images only, so the
     * trailer says 7,840 bytes and the buffer must grow */
    write_gz(path, im, ni, split ? ni - 10 * FMNIST_PIXELS : 0);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", nt_test_dir, pre);
    write_gz(path, lb, nl, 0);
    *img = im;
    *lab = lb;
}

/* fmnist_load gives the written bytes, pointing into the decompressed file
 * (no copy), for one gzip member (the buffer sized from the trailer) and
 * for two (the trailer names only the last: the buffer grows past 1 MiB);
 * a truncated file is a clear error. */
static void test_fmnist_load(void **state)
{
    (void)state;
    assert_int_equal(nt_test_dir_make("cnn"), 0);
    const int n = 1400; /* 1.1 MB of images: past the smallest buffer */
    for (int split = 0; split < 2; split++) {
        uint8_t *img, *lab;
        const char *pre = split ? "two" : "one";
        write_split(pre, n, split, &img, &lab);
        fmnist_data d = {0};
        assert_int_equal(fmnist_load("test_cnn", nt_test_dir, pre, &d), 0);
        assert_int_equal(d.n, n);
        assert_memory_equal(d.images, img + 16, (size_t)n * FMNIST_PIXELS);
        assert_memory_equal(d.labels, lab + 8, (size_t)n);
        assert_ptr_equal(d.images, d.image_file + 16);
        assert_ptr_equal(d.labels, d.label_file + 8);
        fmnist_free(&d);
        assert_null(d.images);
        assert_null(d.image_file);
        assert_int_equal(d.n, 0);
        free(img);
        free(lab);
    }
    /* the one-member images cut short: the reader names the file */
    char path[400];
    snprintf(path, sizeof path, "%s/one-images-idx3-ubyte.gz", nt_test_dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t buf[1 << 16];
    size_t got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(got > 100 && got < sizeof buf);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, got / 2, f), got / 2);
    fclose(f);
    fmnist_data d = {0};
    assert_int_equal(fmnist_load("test_cnn", nt_test_dir, "one", &d), -1);
    assert_null(d.images);
    assert_int_equal(nt_test_dir_remove(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bitwise_sgd, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bitwise_adamw, nt_test_setup, nt_test_teardown),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_fmnist_load),
        cmocka_unit_test_setup_teardown(test_shapes, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
