/* examples/cnn.c - trains a small ResNet-style network on Fashion-MNIST.
 *
 * The model (examples/cnn_model.h): a 3x3 convolution stem, three residual
 * blocks of conv-BN-ReLU-conv-BN + identity (at 28x28 with C channels, then
 * 14x14 and 7x7 with 2C), max pooling between them, global average pooling
 * and a linear head; cross-entropy; SGD with Nesterov momentum (or AdamW)
 * in two parameter groups (no weight decay on the batch norms and the
 * bias) with a warm-up-then-cosine schedule; initialisation and data order
 * from --seed.  Each epoch prints the training loss and accuracy, the test
 * accuracy (running batch-norm statistics), the wall time per step and what
 * the device did (simulated NeuronCore time and MFU on the simulator,
 * kernels per step); the run ends with the CRC-32 of the parameters and
 * running statistics, the same bits in every mode (NT_MODE,
 * NT_DETERMINISTIC=1) and on both backends.
 *
 * bench/peer/cnn.py is the same network in PyTorch: --dump-init PATH
 * writes the initial parameters for its --init, and it draws the same
 * batch order; bench/cnn_step runs both and compares.
 *
 * Reads the gzip'ed IDX files of Debian's dataset-fashion-mnist
 * (/usr/share/datasets/fashion-mnist, or --data DIR).  Run with --help. */
#include <errno.h>
#include <math.h>
#include <ntensor.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmnist.h"
#include "cnn_model.h"

typedef struct {
    const char *data_dir, *dump_init, *backend;
    int epochs, log_every, train_subset, test_subset;
    long limit_steps;
    uint64_t seed;
    cnn_train_opts t;
} options;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "cnn: %s failed: %s\n", what, nt_last_error_message());
        exit(1);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cnn [options]\n"
            "  --epochs N        epochs to train (4)\n"
            "  --batch N         batch size (128)\n"
            "  --width N         channels of the first stage, C (16; 2C after)\n"
            "  --optim NAME      sgd (Nesterov momentum 0.9) or adamw (sgd)\n"
            "  --lr X            peak learning rate (0.1 for sgd, 2e-3 for adamw)\n"
            "  --wd X            weight decay of the weights (5e-4 for sgd, 0.05 for adamw)\n"
            "  --warmup N        warm-up steps of the cosine schedule (a tenth of an epoch)\n"
            "  --seed N          seed of the initialisation and the shuffling (1)\n"
            "  --backend NAME    sim or cpu (NT_BACKEND's, default sim)\n"
            "  --log-every N     a progress line every N steps (100; 0: none)\n"
            "  --limit-steps N   stop after N training steps\n"
            "  --train-subset N  train on the first N training images only\n"
            "  --test-subset N   evaluate on the first N test images only\n"
            "  --dump-init PATH  write the initial parameters (raw f32, for\n"
            "                    bench/peer/cnn.py --init)\n"
            "  --data DIR        where the .gz IDX files are\n"
            "                    (/usr/share/datasets/fashion-mnist)\n");
}

static long parse_long(const char *opt, const char *v, long lo)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || x < lo || x > 1000000000L) {
        fprintf(stderr, "cnn: %s needs an integer >= %ld (got '%s')\n", opt, lo, v ? v : "");
        exit(1);
    }
    return x;
}

static double parse_double(const char *opt, const char *v, double lo)
{
    char *end;
    double x = v ? strtod(v, &end) : NAN;
    if (!v || *end || !(x >= lo) || !isfinite(x)) {
        fprintf(stderr, "cnn: %s needs a number >= %g (got '%s')\n", opt, lo, v ? v : "");
        exit(1);
    }
    return x;
}

static void parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--epochs"))
            o->epochs = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--batch"))
            o->t.batch = (int)parse_long(a, v, 2);
        else if (!strcmp(a, "--width"))
            o->t.width = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--warmup"))
            o->t.warmup = (int)parse_long(a, v, 0);
        else if (!strcmp(a, "--seed"))
            o->seed = (uint64_t)parse_long(a, v, 0);
        else if (!strcmp(a, "--log-every"))
            o->log_every = (int)parse_long(a, v, 0);
        else if (!strcmp(a, "--limit-steps"))
            o->limit_steps = parse_long(a, v, 1);
        else if (!strcmp(a, "--train-subset"))
            o->train_subset = (int)parse_long(a, v, 2);
        else if (!strcmp(a, "--test-subset"))
            o->test_subset = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--lr"))
            o->t.lr = parse_double(a, v, 1e-12);
        else if (!strcmp(a, "--wd"))
            o->t.wd = parse_double(a, v, 0);
        else if (!strcmp(a, "--optim") && v && (!strcmp(v, "sgd") || !strcmp(v, "adamw")))
            o->t.adamw = !strcmp(v, "adamw");
        else if (!strcmp(a, "--backend") && v && (!strcmp(v, "sim") || !strcmp(v, "cpu")))
            o->backend = v;
        else if (!strcmp(a, "--dump-init") && v)
            o->dump_init = v;
        else if (!strcmp(a, "--data") && v)
            o->data_dir = v;
        else {
            fprintf(stderr, "cnn: unknown, incomplete or bad option '%s'%s%s\n", a,
                    v ? " " : "", v ? v : "");
            usage(stderr);
            exit(1);
        }
        i++;
    }
}

/* Per-step device figures over an epoch's training: simulated NeuronCore
 * time and MFU when ops ran on the simulator, and kernels per step. */
static void print_device_stats(const nt_stats *a, const nt_stats *b, const nt_sim_stats *sa,
                               const nt_sim_stats *sb, int steps)
{
    double sim_ns = sb->sim_ns - sa->sim_ns;
    if (sb->kernels > sa->kernels && sim_ns > 0)
        printf("  NeuronCore (simulated): %.3f ms/step; TensorE %.0f%%; MFU %.1f%%\n",
               sim_ns * 1e-6 / steps,
               100.0 * (sb->busy_ns[NT_ENGINE_TENSOR] - sa->busy_ns[NT_ENGINE_TENSOR]) / sim_ns,
               100.0 * (sb->tensor_ideal_ns - sa->tensor_ideal_ns) / sim_ns);
    uint64_t k = b->kernels_launched - a->kernels_launched;
    printf("  runtime: %.1f kernels per step, %llu CPU fallbacks\n", (double)k / steps,
           (unsigned long long)(b->cpu_fallbacks - a->cpu_fallbacks));
}

/* Trains epoch ep; returns the steps run (0 when --limit-steps is reached). */
static int train_epoch(const options *o, cnn_model *m, nt_optim *opt, nt_scheduler *sched,
                       const cnn_data *train, const int *order, int ep, float *xb,
                       int32_t *yb, double *loss_out, double *acc_out)
{
    int steps_per_epoch = (train->n + o->t.batch - 1) / o->t.batch, steps = 0, seen = 0;
    nt_tensor *correct = nt_zeros(NT_F32, 0, NULL), *prev = NULL;
    double loss_sum = 0, t0 = now_s();
    int prev_bs = 0;
    for (int s = 0; s < steps_per_epoch; s++) {
        if (o->limit_steps && nt_optim_steps(opt) >= o->limit_steps)
            break;
        int bs = train->n - s * o->t.batch < o->t.batch ? train->n - s * o->t.batch : o->t.batch;
        nt_tensor *c = NULL;
        nt_tensor *loss = cnn_train_step(m, opt, sched, train, order + s * o->t.batch, bs, xb,
                                         yb, &c);
        if (!loss)
            check(-1, "training step");
        nt_no_grad_begin();
        check(nt_add_inplace(correct, c), "summing the accuracy");
        nt_no_grad_end();
        nt_release(c);
        /* the loss is read one step late: the device runs step s - 1 while
         * the host queues step s */
        if (prev) {
            double l;
            check(nt_item(prev, &l), "reading the loss");
            loss_sum += l * prev_bs;
            nt_release(prev);
        }
        prev = loss;
        prev_bs = bs;
        seen += bs;
        steps++;
        if (o->log_every && (s + 1) % o->log_every == 0)
            printf("  epoch %d step %4d/%d  %.1f ms/step\n", ep + 1, s + 1, steps_per_epoch,
                   1e3 * (now_s() - t0) / steps);
    }
    if (prev) {
        double l;
        check(nt_item(prev, &l), "reading the loss");
        loss_sum += l * prev_bs;
        nt_release(prev);
    }
    double c = 0;
    check(nt_item(correct, &c), "reading the accuracy");
    nt_release(correct);
    *loss_out = seen ? loss_sum / seen : NAN;
    *acc_out = seen ? 100.0 * c / seen : NAN;
    return steps;
}

int main(int argc, char **argv)
{
    options o = {.data_dir = FMNIST_DIR, .epochs = 4, .log_every = 100, .seed = 1,
                 .t = {.batch = 128, .width = 16, .warmup = -1, .lr = 0, .wd = -1}};
    parse_args(argc, argv, &o);
    double t_start = now_s();
    cnn_data train, test;
    if (fmnist_load("cnn", o.data_dir, "train", &train) || fmnist_load("cnn", o.data_dir, "t10k", &test))
        return 1;
    if (o.train_subset && o.train_subset < train.n)
        train.n = o.train_subset;
    if (o.test_subset && o.test_subset < test.n)
        test.n = o.test_subset;
    if (nt_init() != 0) {
        fprintf(stderr, "cnn: nt_init: %s\n", nt_last_error_message());
        return 1;
    }
    if (o.backend)
        check(nt_config_set("NT_BACKEND", o.backend), "--backend");
    int steps_per_epoch = (train.n + o.t.batch - 1) / o.t.batch;
    o.t.total_steps = (int64_t)o.epochs * steps_per_epoch;
    cnn_opts_defaults(&o.t, train.n);
    if (o.t.warmup > o.t.total_steps)
        o.t.warmup = (int)o.t.total_steps;
    cnn_model m;
    check(cnn_init(&m, o.t.width, o.seed), "initialisation");
    if (o.dump_init && cnn_dump_params(&m, o.dump_init))
        return 1;
    nt_scheduler *sched;
    nt_optim *opt = cnn_optimizer(&m, &o.t, &sched);
    if (!opt)
        check(-1, "the optimizer");
    int64_t nparams = 0;
    for (int i = 0; i < CNN_NPARAMS; i++)
        nparams += nt_numel(m.p[i]);
    printf("cnn: %d training and %d test images from %s\n", train.n, test.n, o.data_dir);
    printf("model: width %d, %lld parameters; batch %d, %s lr %g wd %g (warm-up %d, cosine "
           "over %lld steps), seed %llu; mode %s, backend %s\n",
           o.t.width, (long long)nparams, o.t.batch, o.t.adamw ? "adamw" : "sgd", o.t.lr, o.t.wd,
           o.t.warmup, (long long)o.t.total_steps, (unsigned long long)o.seed,
           nt_config_get("NT_MODE"), nt_config_get("NT_BACKEND"));
    fflush(stdout);
    float *xb = malloc(sizeof(float) * (size_t)o.t.batch * CNN_PIXELS);
    int32_t *yb = malloc(sizeof(int32_t) * (size_t)o.t.batch);
    int *order = malloc(sizeof(int) * (size_t)train.n);
    if (!xb || !yb || !order) {
        fprintf(stderr, "cnn: out of memory\n");
        return 1;
    }
    double acc = NAN, train_s = 0;
    for (int ep = 0; ep < o.epochs; ep++) {
        cnn_epoch_order(order, train.n, o.seed, ep);
        nt_stats st0, st1;
        nt_sim_stats sim0, sim1;
        nt_stats_get(&st0);
        nt_sim_stats_get(&sim0);
        double t0 = now_s(), loss, tacc;
        int steps = train_epoch(&o, &m, opt, sched, &train, order, ep, xb, yb, &loss, &tacc);
        double dt = now_s() - t0;
        nt_stats_get(&st1);
        nt_sim_stats_get(&sim1);
        if (!steps)
            break;
        train_s += dt;
        acc = cnn_evaluate(&m, &test, 0);
        printf("epoch %d/%d: loss %.4f  train acc %.2f%%  test acc %.2f%%  %.1f ms/step  "
               "(%.1f s; %.1f s since the start)\n",
               ep + 1, o.epochs, loss, tacc, acc, 1e3 * dt / steps, dt, now_s() - t_start);
        print_device_stats(&st0, &st1, &sim0, &sim1, steps);
        fflush(stdout);
    }
    bool ok;
    uint32_t crc = cnn_crc(&m, &ok);
    check(ok ? 0 : -1, "reading the parameters");
    printf("final test accuracy %.2f%% after %lld steps (%.1f s training, %.1f s wall)\n", acc,
           (long long)nt_optim_steps(opt), train_s, now_s() - t_start);
    printf("parameters crc32 %08x\n", (unsigned)crc);
    nt_scheduler_destroy(sched);
    nt_optim_destroy(opt);
    cnn_free(&m);
    free(xb);
    free(yb);
    free(order);
    fmnist_free(&train);
    fmnist_free(&test);
    nt_shutdown();
    return 0;
}
