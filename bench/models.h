/* bench/models.h - the small models bench/train_step and the tests train:
 * the benches' MLP and a character-level transformer step, written against
 * the public API only (the way a user writes a model).
 *
 * The transformer (one block, pre-norm, like GPT-2's):
 *   x      = wte[idx] + wpe[pos]                       [B, T, D]
 *   qkv    = linear(layer_norm(x), Wqkv, bqkv)         [B, T, 3D]
 *   q,k,v  = heads of its three slices                 [B, H, T, D/H]
 *   att    = softmax(q k^T / sqrt(D/H) + mask)         [B, H, T, T]  (mask: -1e9
 *            above the diagonal, so a token sees only itself and the past)
 *   x      = x + linear(att v, Wo, bo)
 *   x      = x + linear(gelu(linear(layer_norm(x), W1, b1)), W2, b2)
 *   loss   = cross_entropy(linear(layer_norm(x), Whead), next tokens)
 * and AdamW over every parameter.  Every function returns 0 / non-NULL, or
 * fails with the runtime's error set. */
#ifndef NT_BENCH_MODELS_H
#define NT_BENCH_MODELS_H

#include <math.h>
#include <ntensor.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A leaf parameter: N(0, 1) * scale, or the constant `fill` when scale is 0,
 * with requires_grad set. */
static inline nt_tensor *model_param(int ndim, const int64_t *shape, double scale, double fill,
                                     uint64_t seed)
{
    nt_tensor *t;
    if (scale != 0) {
        nt_tensor *r = nt_randn(NT_F32, ndim, shape, seed);
        t = nt_mul_scalar(r, scale);
        nt_release(r);
    } else {
        t = nt_full(NT_F32, ndim, shape, fill);
    }
    if (t && nt_set_requires_grad(t, true) != 0) {
        nt_release(t);
        t = NULL;
    }
    return t;
}

/* ---------------- the MLP: in -> hid -> hid -> out, ReLU ---------------- */

typedef struct {
    nt_tensor *p[6]; /* w1 b1 w2 b2 w3 b3 */
    nt_tensor *x, *y;
} model_mlp;

/* PyTorch's nn.Linear initialisation (uniform in +-1/sqrt(fan_in)); batch
 * of `batch` random inputs with fixed labels. */
static inline int model_mlp_init(model_mlp *m, int64_t in, int64_t hid, int64_t out,
                                 int64_t batch)
{
    memset(m, 0, sizeof *m);
    const int64_t shp[6][2] = {{hid, in}, {hid, 0}, {hid, hid}, {hid, 0}, {out, hid}, {out, 0}};
    const double fan[6] = {(double)in, (double)in, (double)hid, (double)hid, (double)hid,
                           (double)hid};
    for (int i = 0; i < 6; i++) {
        int nd = shp[i][1] ? 2 : 1;
        double b = 1 / sqrt(fan[i]);
        nt_tensor *u = nt_rand(NT_F32, nd, shp[i], (uint64_t)i + 1);
        nt_tensor *s = nt_mul_scalar(u, 2 * b);
        nt_tensor *t = nt_add_scalar(s, -b);
        nt_release(u);
        nt_release(s);
        if (!t || nt_set_requires_grad(t, true) != 0)
            return -1;
        m->p[i] = t;
    }
    m->x = nt_rand(NT_F32, 2, (int64_t[]){batch, in}, 42);
    int32_t *lab = malloc(sizeof *lab * (size_t)batch);
    if (!lab)
        return -1;
    for (int64_t i = 0; i < batch; i++)
        lab[i] = (int32_t)((i * 7 + 3) % out);
    m->y = nt_from_host(lab, NT_I32, 1, (int64_t[]){batch});
    free(lab);
    return m->x && m->y ? 0 : -1;
}

/* The step's loss; every tensor it makes belongs to the caller's scope. */
static inline nt_tensor *model_mlp_loss(model_mlp *m)
{
    nt_tensor *h1 = nt_relu(nt_linear(m->x, m->p[0], m->p[1]));
    nt_tensor *h2 = nt_relu(nt_linear(h1, m->p[2], m->p[3]));
    return nt_cross_entropy(nt_linear(h2, m->p[4], m->p[5]), m->y);
}

static inline void model_mlp_free(model_mlp *m)
{
    for (int i = 0; i < 6; i++)
        nt_release(m->p[i]);
    nt_release(m->x);
    nt_release(m->y);
    memset(m, 0, sizeof *m);
}

/* ---------------- the transformer ---------------- */

enum {
    TF_WTE, TF_WPE, TF_LN1W, TF_LN1B, TF_WQKV, TF_BQKV, TF_WO, TF_BO, TF_LN2W, TF_LN2B,
    TF_W1, TF_B1, TF_W2, TF_B2, TF_LNFW, TF_LNFB, TF_WHEAD, TF_NPARAM
};

typedef struct {
    int64_t V, D, H, T, B;
    nt_tensor *p[TF_NPARAM];
    nt_tensor *idx, *tgt, *pos, *mask; /* [B, T] i32, [B*T] i32, [T] i32, [T, T] f32 */
} model_tf;

/* A vocabulary of V characters, width D, H heads, context T, batch B.  The
 * text is a fixed pseudo-random walk over the characters, so the next
 * character is learnable. */
static inline int model_tf_init(model_tf *m, int64_t V, int64_t D, int64_t H, int64_t T,
                                int64_t B)
{
    memset(m, 0, sizeof *m);
    m->V = V, m->D = D, m->H = H, m->T = T, m->B = B;
    const double s = 0.02, so = 0.02 / sqrt(2.0); /* GPT-2: residual outputs scaled */
    struct {
        int nd;
        int64_t a, b;
        double scale, fill;
    } spec[TF_NPARAM] = {
        [TF_WTE] = {2, V, D, s, 0},       [TF_WPE] = {2, T, D, s, 0},
        [TF_LN1W] = {1, D, 0, 0, 1},      [TF_LN1B] = {1, D, 0, 0, 0},
        [TF_WQKV] = {2, 3 * D, D, s, 0},  [TF_BQKV] = {1, 3 * D, 0, 0, 0},
        [TF_WO] = {2, D, D, so, 0},       [TF_BO] = {1, D, 0, 0, 0},
        [TF_LN2W] = {1, D, 0, 0, 1},      [TF_LN2B] = {1, D, 0, 0, 0},
        [TF_W1] = {2, 4 * D, D, s, 0},    [TF_B1] = {1, 4 * D, 0, 0, 0},
        [TF_W2] = {2, D, 4 * D, so, 0},   [TF_B2] = {1, D, 0, 0, 0},
        [TF_LNFW] = {1, D, 0, 0, 1},      [TF_LNFB] = {1, D, 0, 0, 0},
        [TF_WHEAD] = {2, V, D, s, 0},
    };
    for (int i = 0; i < TF_NPARAM; i++) {
        int64_t shape[2] = {spec[i].a, spec[i].b};
        m->p[i] = model_param(spec[i].nd, shape, spec[i].scale, spec[i].fill, 100 + (uint64_t)i);
        if (!m->p[i])
            return -1;
    }
    int32_t *tok = malloc(sizeof *tok * (size_t)(B * (T + 1)));
    float *mask = malloc(sizeof *mask * (size_t)(T * T));
    int32_t *pos = malloc(sizeof *pos * (size_t)T);
    if (!tok || !mask || !pos) {
        free(tok), free(mask), free(pos);
        return -1;
    }
    uint64_t r = 12345;
    for (int64_t b = 0; b < B; b++) {
        int32_t c = (int32_t)(b % V);
        for (int64_t t = 0; t <= T; t++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            c = (int32_t)((c + 1 + (int64_t)((r >> 60) & 1)) % V);
            tok[b * (T + 1) + t] = c;
        }
    }
    int32_t *in = malloc(sizeof *in * (size_t)(B * T)), *out = malloc(sizeof *out * (size_t)(B * T));
    if (!in || !out) {
        free(tok), free(mask), free(pos), free(in), free(out);
        return -1;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            in[b * T + t] = tok[b * (T + 1) + t];
            out[b * T + t] = tok[b * (T + 1) + t + 1];
        }
    for (int64_t i = 0; i < T; i++) {
        pos[i] = (int32_t)i;
        for (int64_t j = 0; j < T; j++)
            mask[i * T + j] = j <= i ? 0.0f : -1e9f;
    }
    m->idx = nt_from_host(in, NT_I32, 2, (int64_t[]){B, T});
    m->tgt = nt_from_host(out, NT_I32, 1, (int64_t[]){B * T});
    m->pos = nt_from_host(pos, NT_I32, 1, (int64_t[]){T});
    m->mask = nt_from_host(mask, NT_F32, 2, (int64_t[]){T, T});
    free(tok), free(mask), free(pos), free(in), free(out);
    return m->idx && m->tgt && m->pos && m->mask ? 0 : -1;
}

/* Heads of the slice [off, off + D) of qkv [B, T, 3D]: [B, H, T, D/H]. */
static inline nt_tensor *model_tf_heads(model_tf *m, nt_tensor *qkv, int64_t off)
{
    int64_t hd = m->D / m->H;
    nt_tensor *s = nt_slice(qkv, 2, off, off + m->D, 1);
    nt_tensor *r = nt_reshape(s, 4, (int64_t[]){m->B, m->T, m->H, hd});
    return nt_permute(r, (int[]){0, 2, 1, 3});
}

/* The step's loss; every tensor it makes belongs to the caller's scope. */
static inline nt_tensor *model_tf_loss(model_tf *m)
{
    nt_tensor **p = m->p;
    int64_t B = m->B, T = m->T, D = m->D, hd = D / m->H;
    nt_tensor *x = nt_add(nt_embedding(p[TF_WTE], m->idx), nt_embedding(p[TF_WPE], m->pos));
    /* attention */
    nt_tensor *h = nt_layer_norm(x, p[TF_LN1W], p[TF_LN1B], 1e-5);
    nt_tensor *qkv = nt_linear(h, p[TF_WQKV], p[TF_BQKV]);
    nt_tensor *q = model_tf_heads(m, qkv, 0);
    nt_tensor *k = model_tf_heads(m, qkv, D);
    nt_tensor *v = model_tf_heads(m, qkv, 2 * D);
    nt_tensor *att = nt_mul_scalar(nt_matmul(q, nt_transpose(k, 2, 3)), 1 / sqrt((double)hd));
    att = nt_softmax(nt_add(att, m->mask), 3);
    nt_tensor *y = nt_permute(nt_matmul(att, v), (int[]){0, 2, 1, 3}); /* [B, T, H, hd] */
    y = nt_reshape(y, 3, (int64_t[]){B, T, D});
    x = nt_add(x, nt_linear(y, p[TF_WO], p[TF_BO]));
    /* MLP */
    h = nt_layer_norm(x, p[TF_LN2W], p[TF_LN2B], 1e-5);
    h = nt_linear(nt_gelu(nt_linear(h, p[TF_W1], p[TF_B1])), p[TF_W2], p[TF_B2]);
    x = nt_add(x, h);
    /* head */
    h = nt_layer_norm(x, p[TF_LNFW], p[TF_LNFB], 1e-5);
    nt_tensor *logits = nt_reshape(nt_linear(h, p[TF_WHEAD], NULL), 2,
                                   (int64_t[]){B * T, m->V});
    return nt_cross_entropy(logits, m->tgt);
}

static inline void model_tf_free(model_tf *m)
{
    for (int i = 0; i < TF_NPARAM; i++)
        nt_release(m->p[i]);
    nt_release(m->idx);
    nt_release(m->tgt);
    nt_release(m->pos);
    nt_release(m->mask);
    memset(m, 0, sizeof *m);
}

/* Parameters of a model, for nt_optim_adamw and for comparing results. */
static inline int model_params(void *m, bool tf, nt_tensor ***p)
{
    if (tf) {
        *p = ((model_tf *)m)->p;
        return TF_NPARAM;
    }
    *p = ((model_mlp *)m)->p;
    return 6;
}

#endif
