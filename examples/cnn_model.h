/* examples/cnn_model.h - the ResNet-style network of examples/cnn.c, shared
 * with bench/cnn_step.c and tests/test_cnn.c so all three train the same
 * model, written against the public API only.  bench/peer/cnn.py is the
 * same model, batch order, initialisation and schedule in PyTorch: a change
 * here needs the same change there.
 *
 * The model, for 1 x 28 x 28 images (C = width, every convolution 3 x 3,
 * padding 1, stride 1, no bias; every BN batch norm with momentum 0.1, eps
 * 1e-5, weight and bias learned, running statistics kept):
 *
 *   stem    conv(1 -> C) BN ReLU                            28 x 28
 *   block   conv(C -> C) BN ReLU conv(C -> C) BN, + x, ReLU  28 x 28
 *           max_pool 2                                      14 x 14
 *   down    conv(C -> 2C) BN ReLU                           14 x 14
 *   block   (2C)                                            14 x 14
 *           max_pool 2                                       7 x  7
 *   block   (2C)                                             7 x  7
 *   head    adaptive_avg_pool 1, linear(2C -> 10)
 *   loss    cross_entropy
 *
 * Parameters, in this order (cnn_model.p; --dump-init writes them so):
 * for each of the 8 convolutions its weight [out, in, 3, 3], then its batch
 * norm's weight and bias [out]; then the linear layer's weight [10, 2C] and
 * bias [10].  Each batch norm's running mean and variance (cnn_model.buf,
 * [out] each, 0 and 1 at the start) follow the same order.
 *
 * Initialisation from one generator (nt_generator_create(seed)), in the
 * parameters' order: the convolutions Kaiming normal, fan out, ReLU gain
 * (torchvision's ResNet); batch norms weight 1, bias 0; the linear layer
 * PyTorch's nn.Linear (Kaiming uniform a = sqrt 5, bias uniform +-1/sqrt(2C)).
 *
 * Optimizer: SGD with Nesterov momentum 0.9 or AdamW (betas 0.9, 0.999, eps
 * 1e-8) in two parameter groups: weight decay on the convolutions' and the
 * linear layer's weights, none on the batch norms and the linear bias; the
 * lr follows nt_scheduler_cosine (a linear warm-up, then cosine to 0).
 *
 * Data: pixels v / 255 standardised as (v - 0.2860) * (1 / 0.3530) in f32;
 * each epoch's order is a Fisher-Yates shuffle driven by splitmix64 from
 * seed * 1000003 + epoch (cnn_shuffle), batches taken in that order, the
 * last one smaller. */
#ifndef NT_EXAMPLES_CNN_MODEL_H
#define NT_EXAMPLES_CNN_MODEL_H

#include <math.h>
#include <ntensor.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmnist.h"

#define CNN_PIXELS 784
#define CNN_CLASSES 10
#define CNN_CONVS 8
#define CNN_NPARAMS (3 * CNN_CONVS + 2)
#define CNN_NBUFS (2 * CNN_CONVS)

typedef struct {
    int width;
    nt_tensor *p[CNN_NPARAMS];  /* see the top: conv w, bn w, bn b (x8), linear w, b */
    nt_tensor *buf[CNN_NBUFS];  /* running mean, running var of each batch norm */
} cnn_model;

typedef fmnist_data cnn_data; /* examples/fmnist.h */

typedef struct {
    int batch, width, warmup; /* warmup < 0: a tenth of an epoch's steps */
    bool adamw;               /* else SGD, Nesterov momentum 0.9 */
    double lr, wd;            /* <= 0 / < 0: 0.1 / 5e-4 for SGD, 2e-3 / 0.05 for AdamW */
    int64_t total_steps;      /* the schedule's length */
} cnn_train_opts;

/* (out, in) of each convolution for width C. */
static inline void cnn_conv_shape(int width, int k, int64_t *out, int64_t *in)
{
    static const int o[CNN_CONVS] = {1, 1, 1, 2, 2, 2, 2, 2}, i[CNN_CONVS] = {0, 1, 1, 1, 2, 2, 2, 2};
    *out = (int64_t)o[k] * width;
    *in = i[k] ? (int64_t)i[k] * width : 1;
}

/* Fills o's defaults (see cnn_train_opts). */
static inline void cnn_opts_defaults(cnn_train_opts *o, int train_n)
{
    if (o->lr <= 0)
        o->lr = o->adamw ? 2e-3 : 0.1;
    if (o->wd < 0)
        o->wd = o->adamw ? 0.05 : 5e-4;
    if (o->warmup < 0)
        o->warmup = (train_n + o->batch - 1) / o->batch / 10;
}

static inline nt_tensor *cnn_leaf(nt_tensor *t)
{
    if (t && nt_set_requires_grad(t, true) != 0) {
        nt_release(t);
        return NULL;
    }
    return t;
}

/* Makes m's parameters and running statistics from `seed`.  0, or the
 * runtime's error (m holds nothing then). */
static inline int cnn_init(cnn_model *m, int width, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->width = width;
    nt_generator *g = nt_generator_create(seed);
    if (!g)
        return nt_last_error();
    bool ok = true;
    for (int k = 0; k < CNN_CONVS; k++) {
        int64_t o, i;
        cnn_conv_shape(width, k, &o, &i);
        int64_t ws[4] = {o, i, 3, 3};
        m->p[3 * k] = cnn_leaf(nt_kaiming_normal(NT_F32, 4, ws, 0, NT_FAN_OUT, NT_GAIN_RELU, g));
        m->p[3 * k + 1] = cnn_leaf(nt_ones(NT_F32, 1, &o));
        m->p[3 * k + 2] = cnn_leaf(nt_zeros(NT_F32, 1, &o));
        m->buf[2 * k] = nt_zeros(NT_F32, 1, &o);
        m->buf[2 * k + 1] = nt_ones(NT_F32, 1, &o);
    }
    int64_t c2 = 2 * (int64_t)width, ls[2] = {CNN_CLASSES, c2}, nb = CNN_CLASSES;
    double bound = 1 / sqrt((double)c2);
    m->p[3 * CNN_CONVS] = cnn_leaf(nt_kaiming_uniform(NT_F32, 2, ls, sqrt(5.0), NT_FAN_IN,
                                                      NT_GAIN_LEAKY_RELU, g));
    m->p[3 * CNN_CONVS + 1] = cnn_leaf(nt_uniform(NT_F32, 1, &nb, -bound, bound, g));
    int rc = 0;
    for (int i = 0; i < CNN_NPARAMS; i++)
        ok = ok && m->p[i];
    for (int i = 0; i < CNN_NBUFS; i++)
        ok = ok && m->buf[i];
    if (!ok)
        rc = nt_last_error() ? nt_last_error() : NT_EINVAL;
    nt_generator_destroy(g);
    if (rc) {
        for (int i = 0; i < CNN_NPARAMS; i++)
            nt_release(m->p[i]);
        for (int i = 0; i < CNN_NBUFS; i++)
            nt_release(m->buf[i]);
        memset(m, 0, sizeof *m);
    }
    return rc;
}

static inline void cnn_free(cnn_model *m)
{
    for (int i = 0; i < CNN_NPARAMS; i++)
        nt_release(m->p[i]);
    for (int i = 0; i < CNN_NBUFS; i++)
        nt_release(m->buf[i]);
    memset(m, 0, sizeof *m);
}

/* conv k, its batch norm, and a ReLU when relu. */
static inline nt_tensor *cnn_cbr(cnn_model *m, int k, nt_tensor *h, bool training, bool relu)
{
    static const int64_t one[2] = {1, 1};
    nt_tensor *c = nt_conv2d(h, m->p[3 * k], NULL, one, one, one, 1);
    nt_tensor *b = nt_batch_norm(c, m->buf[2 * k], m->buf[2 * k + 1], m->p[3 * k + 1],
                                 m->p[3 * k + 2], training, 0.1, 1e-5);
    return relu ? nt_relu(b) : b;
}

/* The residual block of convs k and k + 1. */
static inline nt_tensor *cnn_block(cnn_model *m, int k, nt_tensor *h, bool training)
{
    nt_tensor *z = cnn_cbr(m, k, h, training, true);
    z = cnn_cbr(m, k + 1, z, training, false);
    return nt_relu(nt_add(z, h));
}

/* Logits [N, 10] of x [N, 1, 28, 28]; training: batch statistics (and the
 * running ones updated), else the running ones.  Tensors made here belong
 * to the caller's scope. */
static inline nt_tensor *cnn_forward(cnn_model *m, nt_tensor *x, bool training)
{
    static const int64_t two[2] = {2, 2};
    nt_tensor *h = cnn_cbr(m, 0, x, training, true);
    h = cnn_block(m, 1, h, training);
    h = nt_max_pool2d(h, two, NULL, NULL, NULL, false, NULL);
    h = cnn_cbr(m, 3, h, training, true);
    h = cnn_block(m, 4, h, training);
    h = nt_max_pool2d(h, two, NULL, NULL, NULL, false, NULL);
    h = cnn_block(m, 6, h, training);
    h = nt_flatten(nt_adaptive_avg_pool2d(h, 1, 1), 1, 3);
    return nt_linear(h, m->p[3 * CNN_CONVS], m->p[3 * CNN_CONVS + 1]);
}

/* The optimizer's two groups (see the top) and its cosine schedule over
 * o->total_steps (*sched; NULL on failure). */
static inline nt_optim *cnn_optimizer(cnn_model *m, const cnn_train_opts *o, nt_scheduler **sched)
{
    nt_tensor *decay[CNN_CONVS + 1], *other[2 * CNN_CONVS + 1];
    int nd = 0, no = 0;
    for (int k = 0; k < CNN_CONVS; k++) {
        decay[nd++] = m->p[3 * k];
        other[no++] = m->p[3 * k + 1];
        other[no++] = m->p[3 * k + 2];
    }
    decay[nd++] = m->p[3 * CNN_CONVS];
    other[no++] = m->p[3 * CNN_CONVS + 1];
    nt_optim *opt = o->adamw ? nt_optim_adamw(decay, nd, o->lr, 0.9, 0.999, 1e-8, o->wd)
                             : nt_optim_sgd(decay, nd, o->lr, 0.9, o->wd, true);
    *sched = NULL;
    if (!opt)
        return NULL;
    if (nt_optim_add_group(opt, other, no, o->lr, 0) < 0 ||
        !(*sched = nt_scheduler_cosine(opt, o->warmup, o->total_steps, 0))) {
        nt_optim_destroy(opt);
        return NULL;
    }
    return opt;
}

/* splitmix64's next output from state *s. */
static inline uint64_t cnn_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fisher-Yates from splitmix64(seed): the order depends only on the seed. */
static inline void cnn_shuffle(int *idx, int n, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        idx[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(cnn_splitmix64(&s) % (uint64_t)(i + 1));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* The order of epoch ep (bench/peer/cnn.py draws the same). */
static inline void cnn_epoch_order(int *idx, int n, uint64_t seed, int ep)
{
    cnn_shuffle(idx, n, seed * 1000003u + (uint64_t)ep);
}

/* Rows idx[0 .. bs) of d as a device batch: *x [bs, 1, 28, 28] standardised,
 * *y [bs] i32 (xb, yb: host buffers of bs rows). */
static inline void cnn_batch(const cnn_data *d, const int *idx, int bs, float *xb, int32_t *yb,
                             nt_tensor **x, nt_tensor **y)
{
    const float mean = 0.2860f, inv_std = 1.0f / 0.3530f;
    for (int i = 0; i < bs; i++) {
        const uint8_t *src = d->images + (size_t)idx[i] * CNN_PIXELS;
        float *dst = xb + (size_t)i * CNN_PIXELS;
        for (int k = 0; k < CNN_PIXELS; k++)
            dst[k] = ((float)src[k] / 255.0f - mean) * inv_std;
        yb[i] = d->labels[idx[i]];
    }
    *x = nt_from_host(xb, NT_F32, 4, (int64_t[]){bs, 1, 28, 28});
    *y = nt_from_host(yb, NT_I32, 1, (int64_t[]){bs});
}

/* Rows whose argmax is the label, as an f32 scalar tensor. */
static inline nt_tensor *cnn_count_correct(nt_tensor *logits, nt_tensor *y)
{
    return nt_sum(nt_cast(nt_eq(nt_argmax(logits, 1, false), y), NT_F32), NT_DIM_ALL, false);
}

/* One training step on rows idx[0 .. bs) of d: lr from the schedule,
 * forward, loss, backward, the optimizer, the gradients dropped; *correct
 * (if not NULL) gets the batch's correct count.  Returns the loss (kept: the
 * caller releases it), or NULL with the runtime's error. */
static inline nt_tensor *cnn_train_step(cnn_model *m, nt_optim *opt, nt_scheduler *sched,
                                        const cnn_data *d, const int *idx, int bs, float *xb,
                                        int32_t *yb, nt_tensor **correct)
{
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return NULL;
    nt_tensor *x, *y, *loss = NULL;
    cnn_batch(d, idx, bs, xb, yb, &x, &y);
    int rc = nt_scheduler_step(sched);
    nt_tensor *logits = rc ? NULL : cnn_forward(m, x, true);
    if (logits)
        loss = nt_cross_entropy(logits, y);
    if (!loss || nt_backward(loss) || nt_optim_step(opt) || nt_optim_zero_grad(opt))
        loss = NULL;
    if (loss && correct) {
        nt_no_grad_begin();
        *correct = nt_keep(cnn_count_correct(logits, y));
        nt_no_grad_end();
        if (!*correct)
            loss = NULL;
    }
    if (loss)
        nt_keep(loss);
    nt_scope_end(sc);
    return loss;
}

/* Accuracy in percent on the first n rows of d (n <= d->n; 0: all), with the
 * running statistics, batches of 500, one sync. */
static inline double cnn_evaluate(cnn_model *m, const cnn_data *d, int n)
{
    enum { EB = 500 };
    n = n > 0 && n < d->n ? n : d->n;
    float *xb = malloc(sizeof(float) * EB * CNN_PIXELS);
    int32_t yb[EB];
    int idx[EB];
    double c = -1;
    nt_no_grad_begin();
    nt_tensor *correct = nt_zeros(NT_F32, 0, NULL);
    for (int s = 0; xb && correct && s < n; s += EB) {
        int bs = n - s < EB ? n - s : EB;
        for (int i = 0; i < bs; i++)
            idx[i] = s + i;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x, *y;
        cnn_batch(d, idx, bs, xb, yb, &x, &y);
        nt_add_inplace(correct, cnn_count_correct(cnn_forward(m, x, false), y));
        nt_scope_end(sc);
    }
    nt_no_grad_end();
    if (correct && nt_item(correct, &c) != 0)
        c = -1;
    nt_release(correct);
    free(xb);
    return c < 0 ? NAN : 100.0 * c / n;
}

/* CRC-32 (zlib's, IEEE) continued over n bytes. */
static inline uint32_t cnn_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* f32 values of t into a malloc'ed buffer (NULL on failure). */
static inline float *cnn_host(nt_tensor *t)
{
    size_t n = (size_t)nt_numel(t);
    float *v = malloc(sizeof *v * (n ? n : 1));
    if (v && nt_to_host(t, v, sizeof *v * n) != 0) {
        free(v);
        v = NULL;
    }
    return v;
}

/* CRC-32 of every parameter's bytes, then every running statistic's, in
 * order; 0 with *ok false if one could not be read. */
static inline uint32_t cnn_crc(cnn_model *m, bool *ok)
{
    uint32_t c = 0;
    *ok = true;
    for (int i = 0; i < CNN_NPARAMS + CNN_NBUFS; i++) {
        nt_tensor *t = i < CNN_NPARAMS ? m->p[i] : m->buf[i - CNN_NPARAMS];
        float *v = cnn_host(t);
        if (!v) {
            *ok = false;
            return 0;
        }
        c = cnn_crc32(c, (const uint8_t *)v, sizeof *v * (size_t)nt_numel(t));
        free(v);
    }
    return c;
}

/* Writes the parameters, raw little-endian f32 in order (bench/peer/cnn.py
 * --init reads them).  0, or -1 after printing why. */
static inline int cnn_dump_params(cnn_model *m, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cnn: cannot write '%s'\n", path);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < CNN_NPARAMS && !rc; i++) {
        float *v = cnn_host(m->p[i]);
        size_t n = (size_t)nt_numel(m->p[i]);
        if (!v || fwrite(v, sizeof *v, n, f) != n)
            rc = -1;
        free(v);
    }
    if (fclose(f) != 0)
        rc = -1;
    if (rc)
        fprintf(stderr, "cnn: writing '%s' failed: %s\n", path, nt_last_error_message());
    return rc;
}

#endif
