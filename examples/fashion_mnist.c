/* examples/fashion_mnist.c - trains an MLP on Fashion-MNIST: the main job.
 *
 *   784 -> 1024 -> ReLU -> 1024 -> ReLU -> 10, cross-entropy, AdamW (or SGD
 *   with momentum), batch 128, fixed seed.
 *
 * --amp bf16 / fp16 run the forward pass (and the evaluation) under
 * autocast: the matmuls in bf16 / f16 with f32 accumulation, the loss in
 * f32; parameters, gradients and the optimizer stay f32 (docs/amp.md).
 * fp16 adds the dynamic loss scaler; bf16 has f32's exponent range and
 * needs none.
 *
 * Reads the gzip'ed IDX files of Debian's package dataset-fashion-mnist
 * (/usr/share/datasets/fashion-mnist/, or --data DIR).  Each training step
 * runs in a scope (every tensor made in it dies at its end) and never waits
 * for the device: the loss and the count of correct predictions are summed
 * into two device tensors and read only when a line is printed.  Each epoch
 * line is followed by what the device did: simulated NeuronCore time and
 * engine utilisation (nt_sim_stats) and the runtime's counters.
 *
 * --ddp trains data-parallel (docs/ddp.md) on every NeuronCore of the process
 * (NT_SIM_CORES=N) and, under mpirun, on every process: each global batch
 * is cut into --shards fixed shards (8), each shard's gradient computed on
 * the core that owns it, and the gradients combined in one fixed order, so
 * the parameters, and the checksum printed at the end, are the same bits
 * for 1, 2, 4 or 8 cores and 1 or 2 processes.  It drops an epoch's last
 * partial batch (the shards must divide every batch).
 *
 * Build against an installed ntensor with
 *   cc fashion_mnist.c $(pkg-config --cflags --libs ntensor) -lz
 * Run with --help for the options. */
#include <errno.h>
#include <math.h>
#include <ntensor.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "fmnist.h"

#define PIXELS 784
#define CLASSES 10

typedef fmnist_data dataset; /* examples/fmnist.h */

typedef struct {
    const char *data_dir;
    int epochs, batch, hidden, log_every;
    long limit_steps;
    double lr;
    uint64_t seed;
    const char *optim;
    const char *schedule;
    const char *checkpoint;
    bool resume, normalize;
    const char *amp;
    bool ddp;
    bool capture; /* each batch shape's step captured once, replayed after */
    int shards;
} options;

/* ---------------- timing ---------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------- the model ---------------- */

enum { W1, B1, W2, B2, W3, B3, NPARAMS };

/* PyTorch's nn.Linear initialisation (Kaiming-uniform with a = sqrt 5):
 * weight and bias uniform in +-1/sqrt(fan_in). */
static nt_tensor *uniform_param(int ndim, const int64_t *shape, double bound, uint64_t seed)
{
    nt_tensor *u = nt_rand(NT_F32, ndim, shape, seed);
    nt_tensor *t = nt_add_scalar(nt_mul_scalar(u, 2 * bound), -bound);
    nt_release(u);
    nt_set_requires_grad(t, true);
    return t;
}

static void init_params(nt_tensor **p, int hidden, uint64_t seed)
{
    int64_t h = hidden;
    int64_t fan[3] = {PIXELS, h, h}, out[3] = {h, h, CLASSES};
    for (int l = 0; l < 3; l++) {
        double bound = 1.0 / sqrt((double)fan[l]);
        p[2 * l] = uniform_param(2, (int64_t[]){out[l], fan[l]}, bound, seed * 16 + 2 * l);
        p[2 * l + 1] = uniform_param(1, (int64_t[]){out[l]}, bound, seed * 16 + 2 * l + 1);
    }
}

static nt_tensor *forward(nt_tensor **p, nt_tensor *x)
{
    nt_tensor *h1 = nt_relu(nt_linear(x, p[W1], p[B1]));
    nt_tensor *h2 = nt_relu(nt_linear(h1, p[W2], p[B2]));
    return nt_linear(h2, p[W3], p[B3]);
}

/* Host batch: pixels scaled to [0, 1] (optionally standardised with
 * Fashion-MNIST's mean and std), labels as i32. */
static void fill_batch(const dataset *d, const int *idx, int bs, bool normalize, float *xb,
                       int32_t *yb)
{
    const float mean = 0.2860f, inv_std = 1.0f / 0.3530f;
    for (int i = 0; i < bs; i++) {
        const uint8_t *src = d->images + (size_t)idx[i] * PIXELS;
        float *dst = xb + (size_t)i * PIXELS;
        for (int k = 0; k < PIXELS; k++) {
            float v = (float)src[k] / 255.0f;
            dst[k] = normalize ? (v - mean) * inv_std : v;
        }
        yb[i] = d->labels[idx[i]];
    }
}

/* Host batch -> device. */
static void make_batch(const dataset *d, const int *idx, int bs, bool normalize, float *xb,
                       int32_t *yb, nt_tensor **x, nt_tensor **y)
{
    fill_batch(d, idx, bs, normalize, xb, yb);
    *x = nt_from_host(xb, NT_F32, 2, (int64_t[]){bs, PIXELS});
    *y = nt_from_host(yb, NT_I32, 1, (int64_t[]){bs});
}

/* Number of rows whose argmax is the label, as an f32 scalar tensor. */
static nt_tensor *count_correct(nt_tensor *logits, nt_tensor *y)
{
    return nt_sum(nt_cast(nt_eq(nt_argmax(logits, 1, false), y), NT_F32), NT_DIM_ALL, false);
}

static int check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "fashion_mnist: %s failed: %s\n", what, nt_last_error_message());
        exit(1);
    }
    return rc;
}

static nt_tensor *check_t(nt_tensor *t, const char *what)
{
    if (!t) {
        fprintf(stderr, "fashion_mnist: %s failed: %s\n", what, nt_last_error_message());
        exit(1);
    }
    return t;
}

/* The autocast dtype of --amp, or NT_DTYPE_COUNT for none. */
static nt_dtype amp_dtype(const char *amp)
{
    return !strcmp(amp, "bf16") ? NT_BF16 : !strcmp(amp, "fp16") ? NT_F16 : NT_DTYPE_COUNT;
}

/* Test accuracy in percent: batches of 1000 without a graph, one sync;
 * under autocast if amp is not NT_DTYPE_COUNT. */
static double evaluate(nt_tensor **p, const dataset *d, bool normalize, nt_dtype amp)
{
    enum { EB = 1000 };
    float *xb = malloc(sizeof(float) * EB * PIXELS);
    int32_t yb[EB];
    int idx[EB];
    nt_no_grad_begin();
    nt_tensor *correct = check_t(nt_zeros(NT_F32, 0, NULL), "nt_zeros");
    for (int s = 0; s < d->n; s += EB) {
        int bs = d->n - s < EB ? d->n - s : EB;
        for (int i = 0; i < bs; i++)
            idx[i] = s + i;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x, *y;
        make_batch(d, idx, bs, normalize, xb, yb, &x, &y);
        if (amp != NT_DTYPE_COUNT)
            check(nt_autocast_begin(amp), "nt_autocast_begin");
        nt_tensor *logits = forward(p, x);
        if (amp != NT_DTYPE_COUNT)
            check(nt_autocast_end(), "nt_autocast_end");
        check(nt_add_inplace(correct, count_correct(logits, y)), "evaluation");
        nt_scope_end(sc);
    }
    nt_no_grad_end();
    double c = 0;
    check(nt_item(correct, &c), "evaluation");
    nt_release(correct);
    free(xb);
    return 100.0 * c / d->n;
}

/* ---------------- options ---------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fashion_mnist [options]\n"
            "  --epochs N        epochs to train (5)\n"
            "  --batch N         batch size (128)\n"
            "  --lr X            learning rate (1e-3 for adamw, 0.05 for sgd)\n"
            "  --hidden N        width of the two hidden layers (1024)\n"
            "  --seed N          seed of the initialisation and the shuffling (1)\n"
            "  --optim NAME      adamw (AdamW, weight decay 0.01) or sgd (momentum 0.9)\n"
            "  --schedule NAME   cosine (decay the learning rate to 0 over the run) or\n"
            "                    constant (cosine)\n"
            "  --checkpoint PATH save parameters and optimizer state after every epoch\n"
            "  --resume          load --checkpoint PATH first and continue from it\n"
            "  --log-every N     a progress line every N steps (100; 0: none)\n"
            "  --limit-steps N   stop after N training steps (for quick runs)\n"
            "  --normalize       standardise pixels with the data set's mean and std\n"
            "  --amp MODE        mixed precision: none, bf16 (autocast) or fp16 (autocast\n"
            "                    and dynamic loss scaling) (none)\n"
            "  --data DIR        where the .gz IDX files are\n"
            "                    (/usr/share/datasets/fashion-mnist)\n"
            "  --ddp             data-parallel on every core (NT_SIM_CORES) and MPI process;\n"
            "                    same parameters, bit for bit, at any count (docs/ddp.md)\n"
            "  --shards N        with --ddp: fixed shards per batch (8); a multiple of the\n"
            "                    cores x processes, by a power of two, dividing --batch\n"
            "  --capture         record the training step as a program the first time a\n"
            "                    batch shape comes and replay it after (nt_graph_cache;\n"
            "                    docs/graphs.md): the same parameters, bit for bit\n");
}

static long parse_long(const char *opt, const char *v, long lo)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || x < lo) {
        fprintf(stderr, "fashion_mnist: %s needs an integer >= %ld (got '%s')\n", opt, lo,
                v ? v : "");
        exit(1);
    }
    return x;
}

static void parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool used = true;
        if (!strcmp(a, "--epochs"))
            o->epochs = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--batch"))
            o->batch = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--hidden"))
            o->hidden = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--seed"))
            o->seed = (uint64_t)parse_long(a, v, 0);
        else if (!strcmp(a, "--log-every"))
            o->log_every = (int)parse_long(a, v, 0);
        else if (!strcmp(a, "--limit-steps"))
            o->limit_steps = parse_long(a, v, 1);
        else if (!strcmp(a, "--lr")) {
            char *end;
            o->lr = v ? strtod(v, &end) : -1;
            if (!v || *end || !(o->lr > 0)) {
                fprintf(stderr, "fashion_mnist: --lr needs a number > 0\n");
                exit(1);
            }
        } else if (!strcmp(a, "--optim") && v)
            o->optim = v;
        else if (!strcmp(a, "--schedule") && v)
            o->schedule = v;
        else if (!strcmp(a, "--checkpoint") && v)
            o->checkpoint = v;
        else if (!strcmp(a, "--data") && v)
            o->data_dir = v;
        else if (!strcmp(a, "--amp") && v)
            o->amp = v;
        else if (!strcmp(a, "--shards"))
            o->shards = (int)parse_long(a, v, 1);
        else {
            used = false;
            if (!strcmp(a, "--resume"))
                o->resume = true;
            else if (!strcmp(a, "--normalize"))
                o->normalize = true;
            else if (!strcmp(a, "--ddp"))
                o->ddp = true;
            else if (!strcmp(a, "--capture"))
                o->capture = true;
            else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
                usage(stdout);
                exit(0);
            } else {
                fprintf(stderr, "fashion_mnist: unknown or incomplete option '%s'\n", a);
                usage(stderr);
                exit(1);
            }
        }
        if (used)
            i++;
    }
    if (strcmp(o->optim, "adamw") && strcmp(o->optim, "sgd")) {
        fprintf(stderr, "fashion_mnist: --optim must be adamw or sgd (got '%s')\n", o->optim);
        exit(1);
    }
    if (strcmp(o->schedule, "cosine") && strcmp(o->schedule, "constant")) {
        fprintf(stderr, "fashion_mnist: --schedule must be cosine or constant (got '%s')\n",
                o->schedule);
        exit(1);
    }
    if (strcmp(o->amp, "none") && strcmp(o->amp, "bf16") && strcmp(o->amp, "fp16")) {
        fprintf(stderr, "fashion_mnist: --amp must be none, bf16 or fp16 (got '%s')\n", o->amp);
        exit(1);
    }
    if (o->resume && !o->checkpoint) {
        fprintf(stderr, "fashion_mnist: --resume needs --checkpoint PATH\n");
        exit(1);
    }
    if (o->lr <= 0)
        o->lr = strcmp(o->optim, "sgd") ? 1e-3 : 0.05;
    if (o->ddp && !strcmp(o->amp, "fp16")) {
        fprintf(stderr, "fashion_mnist: --ddp does not take --amp fp16 (its loss scaler is "
                        "per process); use --amp bf16\n");
        exit(1);
    }
    if (o->capture && (o->ddp || !strcmp(o->amp, "fp16"))) {
        fprintf(stderr, "fashion_mnist: --capture does not take %s yet (%s)\n",
                o->ddp ? "--ddp" : "--amp fp16",
                o->ddp ? "a captured program cannot hold collectives"
                       : "the loss scaler decides on the host whether a step is skipped");
        exit(1);
    }
    if (o->ddp && o->batch % o->shards) {
        fprintf(stderr, "fashion_mnist: --batch %d is not a multiple of --shards %d\n", o->batch,
                o->shards);
        exit(1);
    }
}

/* Fisher-Yates with splitmix64: the order depends only on the seed. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void shuffle(int *idx, int n, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        idx[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(splitmix64(&s) % (uint64_t)(i + 1));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* ---------------- training ---------------- */

/* What the device did over an epoch's training steps: simulated NeuronCore
 * time and engine utilisation when ops ran on the simulator, and the
 * runtime's counters (kernels, syncs) in any case. */
static void print_device_stats(const nt_stats *a, const nt_stats *b, const nt_sim_stats *sa,
                               const nt_sim_stats *sb, int steps)
{
    double sim_ns = sb->sim_ns - sa->sim_ns;
    if (sb->kernels > sa->kernels && sim_ns > 0) {
        double u[NT_ENGINE_COUNT];
        for (int e = 0; e < NT_ENGINE_COUNT; e++)
            u[e] = 100.0 * (sb->busy_ns[e] - sa->busy_ns[e]) / sim_ns;
        double ideal = sb->tensor_ideal_ns - sa->tensor_ideal_ns;
        printf("  NeuronCore (simulated): %.3f s, %.3f ms/step; utilisation TensorE %.0f%%, "
               "VectorE %.0f%%, ScalarE %.0f%%, GpSimd %.0f%%, DMA %.0f%%; MFU %.1f%%\n",
               sim_ns * 1e-9, steps ? sim_ns * 1e-6 / steps : 0.0, u[NT_ENGINE_TENSOR],
               u[NT_ENGINE_VECTOR], u[NT_ENGINE_SCALAR], u[NT_ENGINE_GPSIMD], u[NT_ENGINE_DMA],
               100.0 * ideal / sim_ns);
    }
    uint64_t k = b->kernels_launched - a->kernels_launched, sy = b->syncs - a->syncs;
    printf("  runtime: %llu kernels (%.1f per step), %llu ops, %llu syncs, %llu CPU fallbacks\n",
           (unsigned long long)k, steps ? (double)k / steps : 0.0,
           (unsigned long long)(b->ops_enqueued - a->ops_enqueued), (unsigned long long)sy,
           (unsigned long long)(b->cpu_fallbacks - a->cpu_fallbacks));
}

/* Cosine annealing from lr to 0 over `total` steps. */
static double cosine_lr(double lr, int64_t step, int64_t total)
{
    if (step >= total)
        return 0;
    return 0.5 * lr * (1 + cos(M_PI * (double)step / (double)total));
}

/* ---------------- data-parallel training (--ddp) ---------------- */

#define MAX_DEV 64

/* CRC-32 (zlib's) of every parameter's bytes, in order. */
static uint32_t params_crc(nt_tensor **p)
{
    uLong c = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < NPARAMS; i++) {
        size_t nb = (size_t)nt_numel(p[i]) * nt_dtype_size(nt_dtype_of(p[i]));
        void *buf = malloc(nb);
        if (!buf) {
            fprintf(stderr, "fashion_mnist: out of memory\n");
            exit(1);
        }
        check(nt_to_host(p[i], buf, nb), "reading the parameters");
        c = crc32(c, buf, (uInt)nb);
        free(buf);
    }
    return (uint32_t)c;
}

/* Sum over the local devices of per-device scalar accumulators (a sync). */
static double sum_devices(nt_tensor **acc, int ndev)
{
    double t = 0;
    for (int i = 0; i < ndev; i++) {
        double v;
        check(nt_item(acc[i], &v), "reading a total");
        t += v;
    }
    return t;
}

/* The training loop of --ddp: one replica per local core, one optimizer per
 * replica, every shard's forward and backward on the core that owns it.
 * Per device the loss (times the shard's rows) and the correct predictions
 * are summed on the device and read when a line is printed; the host waits
 * only for the previous step's last shard, so one step is queued while the
 * cores run the last. */
static int train_ddp(const options *o, nt_tensor **p, const dataset *train, const dataset *test,
                     nt_dtype amp, double t_start)
{
    int ndev = nt_device_count();
    if (ndev > MAX_DEV)
        ndev = MAX_DEV;
    int devs[MAX_DEV];
    for (int i = 0; i < ndev; i++)
        devs[i] = i;
    int procs = nt_process_count() > 1 ? nt_process_count() : 1;
    bool lead = nt_process_rank() <= 0;
    nt_ddp *d = nt_ddp_create(p, NPARAMS, o->shards, devs, ndev);
    if (!d) {
        fprintf(stderr, "fashion_mnist: --ddp: %s\n", nt_last_error_message());
        return 1;
    }
    nt_optim *opts[MAX_DEV];
    for (int i = 0; i < ndev; i++) {
        nt_tensor **r = nt_ddp_params(d, devs[i]);
        check(nt_device_set(devs[i]), "nt_device_set");
        opts[i] = !strcmp(o->optim, "sgd") ? nt_optim_sgd(r, NPARAMS, o->lr, 0.9, 0.0, false)
                                           : nt_optim_adamw(r, NPARAMS, o->lr, 0.9, 0.999, 1e-8,
                                                            0.01);
        check_t((nt_tensor *)opts[i], "the optimizer");
        if (o->resume)
            check(nt_checkpoint_load(o->checkpoint, r, NPARAMS, opts[i], NULL), "--resume");
    }
    int steps_per_epoch = train->n / o->batch; /* whole batches: the shards divide each */
    int first_epoch = 0, first_step = 0;
    if (o->resume) {
        int64_t done = nt_optim_steps(opts[0]);
        first_epoch = (int)(done / steps_per_epoch);
        first_step = (int)(done % steps_per_epoch);
        if (lead)
            printf("resumed from %s after %lld steps\n", o->checkpoint, (long long)done);
    }
    if (lead)
        printf("data parallel: %d shards of %d rows per batch over %d cores x %d processes\n",
               o->shards, o->batch / o->shards, ndev, procs);
    bool cosine = !strcmp(o->schedule, "cosine");
    int64_t total_planned = (int64_t)o->epochs * steps_per_epoch;
    float *xb = malloc(sizeof(float) * (size_t)o->batch * PIXELS);
    int32_t *yb = malloc(sizeof(int32_t) * (size_t)o->batch);
    int *order = malloc(sizeof(int) * (size_t)train->n);
    long total_steps = 0;
    double last_test = 0;
    bool stop = false;
    const int64_t xshape[2] = {o->batch, PIXELS}, yshape[1] = {o->batch};
    for (int ep = first_epoch; ep < o->epochs && !stop; ep++) {
        shuffle(order, train->n, o->seed * 1000003u + (uint64_t)ep);
        nt_tensor *loss_acc[MAX_DEV], *corr_acc[MAX_DEV];
        for (int i = 0; i < ndev; i++) {
            check(nt_device_set(devs[i]), "nt_device_set");
            loss_acc[i] = check_t(nt_zeros(NT_F32, 0, NULL), "nt_zeros");
            corr_acc[i] = check_t(nt_zeros(NT_F32, 0, NULL), "nt_zeros");
        }
        nt_tensor *prev = NULL;
        double t0 = now_s();
        int seen = 0, step;
        for (step = ep == first_epoch ? first_step : 0; step < steps_per_epoch; step++) {
            if (o->limit_steps && total_steps >= o->limit_steps) {
                stop = true;
                break;
            }
            for (int i = 0; i < ndev && cosine; i++)
                check(nt_optim_set_lr(opts[i], cosine_lr(o->lr, nt_optim_steps(opts[i]),
                                                         total_planned)),
                      "nt_optim_set_lr");
            fill_batch(train, order + step * o->batch, o->batch, o->normalize, xb, yb);
            nt_tensor *last = NULL;
            for (int s = 0; s < o->shards; s++) {
                int dev = nt_ddp_shard_device(d, s);
                if (dev < 0)
                    continue; /* another process's shard */
                check(nt_device_set(dev), "nt_device_set");
                nt_scope *sc = nt_scope_begin();
                nt_tensor *x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, xshape);
                nt_tensor *y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, yshape);
                if (amp != NT_DTYPE_COUNT)
                    check(nt_autocast_begin(amp), "nt_autocast_begin");
                nt_tensor *logits = forward(nt_ddp_params(d, dev), x);
                nt_tensor *loss = nt_cross_entropy(logits, y);
                if (amp != NT_DTYPE_COUNT)
                    check(nt_autocast_end(), "nt_autocast_end");
                check(nt_ddp_backward(d, s, loss), "nt_ddp_backward");
                nt_no_grad_begin();
                check(nt_add_inplace(loss_acc[dev],
                                     nt_mul_scalar(loss, (double)(o->batch / o->shards))),
                      "the loss total");
                check(nt_add_inplace(corr_acc[dev], count_correct(logits, y)), "accuracy");
                nt_no_grad_end();
                nt_release(last);
                last = nt_keep(loss);
                nt_scope_end(sc);
            }
            check(nt_ddp_reduce(d), "nt_ddp_reduce");
            check(nt_ddp_step(d, opts, ndev), "nt_ddp_step");
            if (prev) { /* at most two steps in flight */
                double l;
                check(nt_item(prev, &l), "reading the loss");
                nt_release(prev);
            }
            prev = last;
            seen += o->batch;
            total_steps++;
            if (lead && o->log_every && (step + 1) % o->log_every == 0) {
                double l = sum_devices(loss_acc, ndev), c = sum_devices(corr_acc, ndev);
                int local = seen / procs;
                printf("  epoch %d step %4d/%d  loss %.4f  train acc %6.2f%%  %7.0f ex/s\n",
                       ep + 1, step + 1, steps_per_epoch, l / local, 100.0 * c / local,
                       seen / (now_s() - t0));
                fflush(stdout);
            }
        }
        nt_release(prev);
        double l = sum_devices(loss_acc, ndev), c = sum_devices(corr_acc, ndev);
        double train_s = now_s() - t0;
        for (int i = 0; i < ndev; i++) {
            nt_release(loss_acc[i]);
            nt_release(corr_acc[i]);
        }
        if (seen == 0)
            break;
        check(nt_device_set(devs[0]), "nt_device_set");
        last_test = evaluate(nt_ddp_params(d, devs[0]), test, o->normalize, amp);
        if (lead) {
            int local = seen / procs;
            printf("epoch %d/%d: loss %.4f  train acc %.2f%%%s  test acc %.2f%%  %.0f ex/s  "
                   "(%.1f s)\n", ep + 1, o->epochs, l / local, 100.0 * c / local,
                   procs > 1 ? " (this process's shards)" : "", last_test, seen / train_s,
                   train_s);
            fflush(stdout);
        }
        if (o->checkpoint && lead) {
            check(nt_checkpoint_save(o->checkpoint, nt_ddp_params(d, devs[0]), NPARAMS,
                                     opts[0], NULL), "saving the checkpoint");
            printf("  saved %s (step %lld)\n", o->checkpoint, (long long)nt_optim_steps(opts[0]));
        }
    }
    /* Every replica holds the same bits; the checksum is the run's result. */
    uint32_t crc = params_crc(nt_ddp_params(d, devs[0]));
    bool same = true;
    for (int i = 1; i < ndev; i++)
        same &= params_crc(nt_ddp_params(d, devs[i])) == crc;
    if (lead) {
        printf("final test accuracy %.2f%% after %lld steps (%.1f s wall)\n", last_test,
               (long long)nt_optim_steps(opts[0]), now_s() - t_start);
        printf("parameter checksum %08x (crc32 of every parameter's bytes; %d shards, %d cores "
               "x %d processes; replicas %s)\n", crc, o->shards, ndev, procs,
               same ? "identical" : "DIFFER");
    }
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_ddp_destroy(d);
    free(xb);
    free(yb);
    free(order);
    return same ? 0 : 1;
}

/* --capture: the device's part of a step -- forward, loss, backward, the
 * optimizer, the batch's correct count -- as one function of the batch,
 * which nt_graph_cache captures for each batch shape (the last, smaller
 * batch of an epoch gets its own program) and replays after.  The learning
 * rate the host sets before each step and the optimizer's step count are
 * refreshed at every replay (docs/graphs.md). */
typedef struct {
    nt_tensor **p;
    nt_optim *opt;
    nt_dtype amp;
} step_ctx;

static int train_step_fn(void *ctx, nt_tensor *const *in, int nin, nt_tensor **out, int nout)
{
    (void)nin, (void)nout;
    const step_ctx *c = ctx;
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt_last_error();
    int rc = 0;
    if (c->amp != NT_DTYPE_COUNT)
        rc = nt_autocast_begin(c->amp);
    nt_tensor *logits = rc ? NULL : forward(c->p, in[0]);
    nt_tensor *loss = logits ? nt_cross_entropy(logits, in[1]) : NULL;
    if (c->amp != NT_DTYPE_COUNT && !rc)
        nt_autocast_end();
    if (!rc && !loss)
        rc = nt_last_error();
    if (!rc)
        rc = nt_backward(loss);
    if (!rc)
        rc = nt_optim_step(c->opt);
    if (!rc)
        rc = nt_optim_zero_grad(c->opt);
    nt_tensor *correct = NULL;
    if (!rc) {
        nt_no_grad_begin();
        correct = count_correct(logits, in[1]);
        nt_no_grad_end();
        if (!correct)
            rc = nt_last_error();
    }
    if (!rc) {
        out[0] = nt_keep(loss);
        out[1] = nt_keep(correct);
    }
    nt_scope_end(sc);
    return rc;
}

int main(int argc, char **argv)
{
    options o = {.data_dir = FMNIST_DIR, .epochs = 5, .batch = 128,
                 .hidden = 1024, .log_every = 100, .seed = 1, .optim = "adamw", .schedule = "cosine",
                 .amp = "none", .shards = 8};
    parse_args(argc, argv, &o);
    double t_start = now_s();

    dataset train, test;
    if (fmnist_load("fashion_mnist", o.data_dir, "train", &train) ||
        fmnist_load("fashion_mnist", o.data_dir, "t10k", &test))
        return 1;
    if (nt_init() != 0) {
        fprintf(stderr, "fashion_mnist: nt_init: %s\n", nt_last_error_message());
        return 1;
    }
    printf("fashion_mnist: %d training and %d test images from %s\n", train.n, test.n,
           o.data_dir);
    printf("model 784-%d-%d-10 (ReLU), cross-entropy, %s lr %g (%s), batch %d, seed %llu, "
           "mode %s, backend %s, amp %s\n",
           o.hidden, o.hidden, o.optim, o.lr, o.schedule, o.batch, (unsigned long long)o.seed,
           nt_config_get("NT_MODE"), nt_config_get("NT_BACKEND"), o.amp);
    nt_dtype amp = amp_dtype(o.amp);

    nt_tensor *p[NPARAMS];
    init_params(p, o.hidden, o.seed);
    for (int i = 0; i < NPARAMS; i++)
        check_t(p[i], "initialisation");
    if (o.ddp) {
        int rc = train_ddp(&o, p, &train, &test, amp, t_start);
        for (int i = 0; i < NPARAMS; i++)
            nt_release(p[i]);
        fmnist_free(&train);
        fmnist_free(&test);
        nt_shutdown();
        return rc;
    }
    nt_optim *opt = !strcmp(o.optim, "sgd")
                        ? nt_optim_sgd(p, NPARAMS, o.lr, 0.9, 0.0, false)
                        : nt_optim_adamw(p, NPARAMS, o.lr, 0.9, 0.999, 1e-8, 0.01);
    if (!opt) {
        fprintf(stderr, "fashion_mnist: optimizer: %s\n", nt_last_error_message());
        return 1;
    }
    /* fp16: the loss scaler (PyTorch's defaults: 2^16, x2 after 2000 clean
     * steps, x0.5 on an overflow, whose step is skipped) */
    nt_grad_scaler *scaler = amp == NT_F16 ? nt_grad_scaler_create(NULL) : NULL;
    if (amp == NT_F16 && !scaler) {
        fprintf(stderr, "fashion_mnist: loss scaler: %s\n", nt_last_error_message());
        return 1;
    }
    step_ctx sctx = {p, opt, amp};
    nt_graph_cache *cache = NULL;
    if (o.capture && !(cache = nt_graph_cache_create(train_step_fn, &sctx, 2, 2, 4))) {
        fprintf(stderr, "fashion_mnist: nt_graph_cache_create: %s\n", nt_last_error_message());
        return 1;
    }
    int steps_per_epoch = (train.n + o.batch - 1) / o.batch;
    int first_epoch = 0, first_step = 0;
    if (o.resume) {
        check(nt_checkpoint_load(o.checkpoint, p, NPARAMS, opt, scaler), "--resume");
        /* the same shuffles as an uninterrupted run: skip what was done
         * (steps the scaler skipped were batches too) */
        int64_t done = nt_optim_steps(opt) + (scaler ? nt_grad_scaler_skipped_steps(scaler) : 0);
        first_epoch = (int)(done / steps_per_epoch);
        first_step = (int)(done % steps_per_epoch);
        printf("resumed from %s after %lld steps (epoch %d, step %d)\n", o.checkpoint,
               (long long)done, first_epoch + 1, first_step);
    }

    /* The schedule spans --epochs (--limit-steps only cuts a run short) and
     * follows the optimizer's step count, so a resumed run continues it
     * where it stopped. */
    bool cosine = !strcmp(o.schedule, "cosine");
    int64_t total_planned = (int64_t)o.epochs * steps_per_epoch;
    float *xb = malloc(sizeof(float) * (size_t)o.batch * PIXELS);
    int32_t *yb = malloc(sizeof(int32_t) * (size_t)o.batch);
    int *order = malloc(sizeof(int) * (size_t)train.n);
    long total_steps = 0;
    double last_test = 0;
    int epochs_run = 0;
    bool stop = false;
    nt_stats_reset();
    for (int ep = first_epoch; ep < o.epochs && !stop; ep++) {
        shuffle(order, train.n, o.seed * 1000003u + (uint64_t)ep);
        /* The loss is read one step late: the host queues step k while the
         * device still runs step k-1, and at most two steps are in flight
         * (bounded memory, one sync per step).  Correct predictions are
         * summed on the device and read only when a line is printed. */
        nt_tensor *correct_sum = check_t(nt_zeros(NT_F32, 0, NULL), "nt_zeros");
        /* --capture: the loss too is summed on the device (x the batch's
         * size), as the program's output is rewritten by the next replay */
        nt_tensor *loss_dev = cache ? check_t(nt_zeros(NT_F32, 0, NULL), "nt_zeros") : NULL;
        nt_tensor *prev_loss = NULL;
        int prev_bs = 0;
        double loss_sum = 0;
        nt_stats st0;
        nt_sim_stats sim0;
        nt_stats_get(&st0);
        nt_sim_stats_get(&sim0);
        double t0 = now_s();
        int seen = 0, step;
        for (step = ep == first_epoch ? first_step : 0; step < steps_per_epoch; step++) {
            if (o.limit_steps && total_steps >= o.limit_steps) {
                stop = true;
                break;
            }
            int s0 = step * o.batch;
            int bs = train.n - s0 < o.batch ? train.n - s0 : o.batch;
            if (cosine)
                check(nt_optim_set_lr(opt, cosine_lr(o.lr, nt_optim_steps(opt), total_planned)),
                      "nt_optim_set_lr");
            nt_scope *sc = nt_scope_begin();
            nt_tensor *x, *y;
            make_batch(&train, order + s0, bs, o.normalize, xb, yb, &x, &y);
            nt_tensor *loss = NULL;
            if (cache) {
                nt_tensor *out[2];
                check(nt_graph_cache_run(cache, (nt_tensor *[]){x, y}, out), "the captured step");
                nt_no_grad_begin();
                check(nt_add_inplace(loss_dev, nt_mul_scalar(out[0], bs)), "summing the loss");
                check(nt_add_inplace(correct_sum, out[1]), "accuracy");
                nt_no_grad_end();
                nt_scope_end(sc);
                goto stepped;
            }
            if (amp != NT_DTYPE_COUNT)
                check(nt_autocast_begin(amp), "nt_autocast_begin");
            nt_tensor *logits = forward(p, x);
            loss = nt_cross_entropy(logits, y); /* f32 under autocast */
            if (amp != NT_DTYPE_COUNT)
                check(nt_autocast_end(), "nt_autocast_end");
            if (scaler) {
                check(nt_backward(nt_grad_scaler_scale(scaler, loss)), "nt_backward");
                if (nt_grad_scaler_step(scaler, opt) < 0) /* 1: skipped (overflow) */
                    check(nt_last_error(), "nt_grad_scaler_step");
                check(nt_grad_scaler_update(scaler), "nt_grad_scaler_update");
            } else {
                check(nt_backward(loss), "nt_backward");
                check(nt_optim_step(opt), "nt_optim_step");
            }
            check(nt_optim_zero_grad(opt), "nt_optim_zero_grad");
            nt_no_grad_begin();
            check(nt_add_inplace(correct_sum, count_correct(logits, y)), "accuracy");
            nt_no_grad_end();
            nt_keep(loss);
            nt_scope_end(sc);
        stepped:
            if (prev_loss) {
                double l;
                check(nt_item(prev_loss, &l), "reading the loss");
                loss_sum += l * prev_bs;
                nt_release(prev_loss);
            }
            prev_loss = loss;
            prev_bs = bs;
            seen += bs;
            total_steps++;
            if (o.log_every && (step + 1) % o.log_every == 0) {
                double c, l;
                if (prev_loss) {
                    check(nt_item(prev_loss, &l), "reading the loss");
                    loss_sum += l * prev_bs;
                    nt_release(prev_loss);
                    prev_loss = NULL;
                }
                if (loss_dev)
                    check(nt_item(loss_dev, &loss_sum), "reading the loss");
                check(nt_item(correct_sum, &c), "reading the accuracy");
                printf("  epoch %d step %4d/%d  loss %.4f  train acc %6.2f%%  %7.0f ex/s\n",
                       ep + 1, step + 1, steps_per_epoch, loss_sum / seen, 100.0 * c / seen,
                       seen / (now_s() - t0));
                fflush(stdout);
            }
        }
        if (prev_loss) {
            double l;
            check(nt_item(prev_loss, &l), "reading the loss");
            loss_sum += l * prev_bs;
            nt_release(prev_loss);
        }
        if (loss_dev) {
            check(nt_item(loss_dev, &loss_sum), "reading the loss");
            nt_release(loss_dev);
        }
        if (seen == 0) {
            nt_release(correct_sum);
            break;
        }
        double c, l = loss_sum;
        check(nt_item(correct_sum, &c), "reading the accuracy");
        double train_s = now_s() - t0;
        nt_sim_stats sim1;
        nt_sim_stats_get(&sim1); /* training only: before the evaluation */
        int steps_run = step - (ep == first_epoch ? first_step : 0);
        nt_release(correct_sum);
        last_test = evaluate(p, &test, o.normalize, amp);
        epochs_run++;
        nt_stats st1;
        nt_stats_get(&st1);
        printf("epoch %d/%d: loss %.4f  train acc %.2f%%  test acc %.2f%%  %.0f ex/s  (%.1f s)\n",
               ep + 1, o.epochs, l / seen, 100.0 * c / seen, last_test, seen / train_s, train_s);
        print_device_stats(&st0, &st1, &sim0, &sim1, steps_run);
        if (scaler)
            printf("  loss scale %g, %lld steps skipped so far\n",
                   nt_grad_scaler_get_scale(scaler),
                   (long long)nt_grad_scaler_skipped_steps(scaler));
        fflush(stdout);
        if (o.checkpoint) {
            check(nt_checkpoint_save(o.checkpoint, p, NPARAMS, opt, scaler),
                  "saving the checkpoint");
            printf("  saved %s (step %lld)\n", o.checkpoint, (long long)nt_optim_steps(opt));
        }
    }
    if (epochs_run == 0 && first_epoch > 0)
        last_test = evaluate(p, &test, o.normalize, amp);
    printf("final test accuracy %.2f%% after %lld steps (%.1f s wall)\n", last_test,
           (long long)nt_optim_steps(opt), now_s() - t_start);
    /* the same for every mode and backend, and with or without --capture */
    printf("parameters crc32 %08x\n", (unsigned)params_crc(p));
    if (cache) {
        nt_graph_cache_stats cs;
        check(nt_graph_cache_stats_get(cache, &cs), "nt_graph_cache_stats_get");
        printf("captured steps: %lld programs captured, %lld replays\n", (long long)cs.captures,
               (long long)cs.replays);
    }
    nt_graph_cache_destroy(cache);

    nt_optim_destroy(opt);
    nt_grad_scaler_destroy(scaler);
    for (int i = 0; i < NPARAMS; i++)
        nt_release(p[i]);
    free(xb);
    free(yb);
    free(order);
    fmnist_free(&train);
    fmnist_free(&test);
    nt_shutdown();
    return 0;
}
