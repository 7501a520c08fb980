/* examples/gpt_model.h - the character-level GPT of examples/char_gpt.c,
 * shared with bench/gpt_step.c and tests/test_gpt.c so all three train the
 * same model, written against the public API only.  bench/peer/char_gpt.py
 * is the same model, data, batch order and schedule in PyTorch: a change
 * here needs the same change there.
 *
 * The model (GPT-2's pre-LN layout):
 *   x      = wte[idx] + wpe[pos]                               [B, T, D]
 *            (c.sinpos: + gpt_sinpos, sin/cos of the position, for wpe;
 *             c.rope: no position term here, see attn)
 *   n_layer blocks:
 *     x    = x + proj(attn(ln1(x)))      H heads, causal (c.rope: q and k
 *                                        rotated by nt_rope, GPT-NeoX layout,
 *                                        every feature of a head, base 10000)
 *     x    = x + fc2(gelu(fc(ln2(x))))   4D hidden, exact (erf) GELU
 *   logits = linear(ln_f(x), head)       head = wte when tied
 *   loss   = cross_entropy(logits, next characters)
 * Init: weights N(0, 0.02), the two residual projections of each block
 * N(0, 0.02 / sqrt(2 n_layer)), biases 0, layer-norm weights 1.
 *
 * The data: the text files of Debian's fortunes package (the files of the
 * directory that are neither symlinks nor .dat indexes, in byte order of
 * their names), concatenated as they are -- the "%" lines between fortunes
 * stay, as a character the model learns to end a fortune with.  The
 * vocabulary is the bytes that occur, in increasing order; the last 10% of
 * the text is the validation split.
 *
 * Batches come from a counter-based generator: row b of step s starts at
 * splitmix64_at(seed, s * B + b) % (n - T), so a batch depends only on
 * (seed, step) -- a resumed run and the PyTorch peer draw the same ones. */
#ifndef NT_EXAMPLES_GPT_MODEL_H
#define NT_EXAMPLES_GPT_MODEL_H

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <ntensor.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GPT_DATA_DIR "/usr/share/games/fortunes"
#define GPT_VAL_SEED 0x5EEDull /* the validation batches' generator */

/* ---------------- counter-based random numbers ---------------- */

/* splitmix64's output finaliser. */
static inline uint64_t gpt_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The i-th output (from 0) of splitmix64 started at `seed`: a pure function
 * of (seed, i), in wrapping uint64 arithmetic (the Python peer masks to 64
 * bits to get the same numbers). */
static inline uint64_t gpt_rand_at(uint64_t seed, uint64_t i)
{
    return gpt_mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
}

/* A double in [0, 1) from the top 53 bits. */
static inline double gpt_uniform_at(uint64_t seed, uint64_t i)
{
    return (double)(gpt_rand_at(seed, i) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---------------- the data ---------------- */

typedef struct {
    int32_t *ids;       /* the text as vocabulary ids */
    int64_t n, n_train; /* characters; the first n_train train, the rest validate */
    int vocab;
    uint8_t itos[256];  /* id -> byte */
    int16_t stoi[256];  /* byte -> id, -1 if it does not occur */
    int files;
} gpt_data;

static int gpt_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Builds the vocabulary and the split from `text` (n bytes, taken over). */
static inline void gpt_data_from_text(gpt_data *d, uint8_t *text, int64_t n)
{
    bool seen[256] = {false};
    for (int64_t i = 0; i < n; i++)
        seen[text[i]] = true;
    d->vocab = 0;
    for (int c = 0; c < 256; c++) {
        d->stoi[c] = (int16_t)(seen[c] ? d->vocab : -1);
        if (seen[c])
            d->itos[d->vocab++] = (uint8_t)c;
    }
    d->ids = malloc(sizeof *d->ids * (size_t)(n ? n : 1));
    for (int64_t i = 0; d->ids && i < n; i++)
        d->ids[i] = d->stoi[text[i]];
    d->n = n;
    d->n_train = n - n / 10; /* the last 10% validate */
    free(text);
}

/* Reads the fortune files of `dir`.  Returns 0, or -1 after printing why
 * (naming the directory or file). */
static inline int gpt_data_load(gpt_data *d, const char *dir)
{
    memset(d, 0, sizeof *d);
    DIR *dh = opendir(dir);
    if (!dh) {
        fprintf(stderr, "char_gpt: cannot open the data directory '%s': %s\n", dir,
                strerror(errno));
        if (errno == ENOENT)
            fprintf(stderr, "char_gpt: install Debian's package fortunes (sh scripts/deps.sh) "
                            "or pass --data DIR\n");
        return -1;
    }
    char **names = NULL;
    int nn = 0, cap = 0;
    for (struct dirent *e; (e = readdir(dh));) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 4 && !strcmp(e->d_name + len - 4, ".dat")))
            continue;
        if (nn == cap) {
            cap = cap ? 2 * cap : 64;
            char **nw = realloc(names, sizeof *names * (size_t)cap);
            if (!nw)
                break;
            names = nw;
        }
        names[nn] = strdup(e->d_name);
        if (names[nn])
            nn++;
    }
    closedir(dh);
    if (nn > 1)
        qsort(names, (size_t)nn, sizeof *names, gpt_name_cmp);
    uint8_t *text = NULL;
    int64_t n = 0, tcap = 0;
    int rc = 0;
    for (int i = 0; i < nn && rc == 0; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        /* the .u8 names are symlinks to the same files: skip every link */
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "char_gpt: cannot read '%s': %s\n", path, strerror(errno));
            rc = -1;
            break;
        }
        if (n + st.st_size + 1 > tcap) {
            tcap = 2 * (n + st.st_size + 1);
            uint8_t *nt = realloc(text, (size_t)tcap);
            if (!nt) {
                fclose(f);
                fprintf(stderr, "char_gpt: out of memory reading '%s'\n", path);
                rc = -1;
                break;
            }
            text = nt;
        }
        size_t got = fread(text + n, 1, (size_t)st.st_size, f);
        fclose(f);
        n += (int64_t)got;
        d->files++;
    }
    for (int i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    if (rc == 0 && n < 1024) {
        fprintf(stderr, "char_gpt: '%s' holds %lld bytes of fortune text; expected the files "
                        "of Debian's package fortunes\n",
                dir, (long long)n);
        rc = -1;
    }
    if (rc != 0) {
        free(text);
        return -1;
    }
    gpt_data_from_text(d, text, n);
    if (!d->ids) {
        fprintf(stderr, "char_gpt: out of memory\n");
        return -1;
    }
    return 0;
}

static inline void gpt_data_free(gpt_data *d)
{
    free(d->ids);
    memset(d, 0, sizeof *d);
}

/* Batch `step` of B windows of T characters from ids[lo .. hi): inputs
 * x[b, t] and next-character targets y[b * T + t]. */
static inline void gpt_batch(const gpt_data *d, bool val, uint64_t seed, int64_t step, int B,
                             int T, int32_t *x, int32_t *y)
{
    int64_t lo = val ? d->n_train : 0, hi = val ? d->n : d->n_train;
    uint64_t span = (uint64_t)(hi - lo - T); /* starts leaving room for the last target */
    for (int b = 0; b < B; b++) {
        int64_t off = lo + (int64_t)(gpt_rand_at(seed, (uint64_t)step * (uint64_t)B +
                                                           (uint64_t)b) % span);
        memcpy(x + (size_t)b * T, d->ids + off, sizeof *x * (size_t)T);
        memcpy(y + (size_t)b * T, d->ids + off + 1, sizeof *y * (size_t)T);
    }
}

/* ---------------- the model ---------------- */

typedef struct {
    int n_layer, n_head, width, context, vocab;
    bool untied;
    double dropout; /* 0: none */
    bool checkpoint; /* recompute each block's activations in backward */
    bool composite_attn; /* matmul/masked_fill/softmax/matmul, not the fused op */
    bool sinpos; /* sinusoidal positions (nt_sin/nt_cos), not wpe (which then gets no
                    gradient and AdamW skips it) */
    bool rope; /* rotary position embedding of q and k in every block (nt_rope), not
                  wpe (which then gets no gradient, as with sinpos) */
} gpt_config;

/* Per block, in the peer's parameter order. */
enum {
    GPT_LN1W, GPT_LN1B, GPT_WQKV, GPT_BQKV, GPT_WO, GPT_BO,
    GPT_LN2W, GPT_LN2B, GPT_W1, GPT_B1, GPT_W2, GPT_B2, GPT_PER_BLOCK
};

struct gpt_model;
/* nt_checkpoint's context of block l: it must live until the backward pass
 * that recomputes the block, so the model owns one per block. */
typedef struct gpt_block_ctx {
    struct gpt_model *m;
    int l;
} gpt_block_ctx;

typedef struct gpt_model {
    gpt_config c;
    int n_params;
    nt_tensor **p;   /* wte, wpe, blocks, ln_f w, ln_f b[, head] */
    nt_tensor *mask; /* u8 [context, context]: 1 where a query may NOT look */
    nt_generator *gen;     /* dropout's: set to the step's state before each step */
    gpt_block_ctx *bctx;   /* [n_layer]; the model must not move after gpt_init */
} gpt_model;

#define GPT_WTE 0
#define GPT_WPE 1
#define GPT_BLOCK(l, i) (2 + (l) * GPT_PER_BLOCK + (i))

/* Parameters: tied 2 + 12 L + 2, untied one more. */
static inline int gpt_n_params(const gpt_config *c)
{
    return 2 + GPT_PER_BLOCK * c->n_layer + 2 + (c->untied ? 1 : 0);
}

/* N(0, 1) * std with requires_grad, or the constant `fill` when std is 0. */
static inline nt_tensor *gpt_param(int nd, int64_t a, int64_t b, double std, double fill,
                                   uint64_t seed)
{
    int64_t shape[2] = {a, b};
    nt_tensor *t;
    if (std != 0) {
        nt_tensor *r = nt_randn(NT_F32, nd, shape, seed);
        t = nt_mul_scalar(r, std);
        nt_release(r);
    } else {
        t = nt_full(NT_F32, nd, shape, fill);
    }
    if (t && nt_set_requires_grad(t, true) != 0) {
        nt_release(t);
        t = NULL;
    }
    return t;
}

static inline void gpt_free(gpt_model *m)
{
    for (int i = 0; m->p && i < m->n_params; i++)
        nt_release(m->p[i]);
    free(m->p);
    free(m->bctx);
    nt_release(m->mask);
    nt_generator_destroy(m->gen);
    memset(m, 0, sizeof *m);
}

/* Parameter i's name, as GPT-2's state_dict calls it ("h.0.attn.c_attn.weight"),
 * for named checkpoints. */
static inline void gpt_param_name(const gpt_model *m, int i, char *buf, size_t n)
{
    static const char *const blk[GPT_PER_BLOCK] = {
        [GPT_LN1W] = "ln_1.weight",        [GPT_LN1B] = "ln_1.bias",
        [GPT_WQKV] = "attn.c_attn.weight", [GPT_BQKV] = "attn.c_attn.bias",
        [GPT_WO] = "attn.c_proj.weight",   [GPT_BO] = "attn.c_proj.bias",
        [GPT_LN2W] = "ln_2.weight",        [GPT_LN2B] = "ln_2.bias",
        [GPT_W1] = "mlp.c_fc.weight",      [GPT_B1] = "mlp.c_fc.bias",
        [GPT_W2] = "mlp.c_proj.weight",    [GPT_B2] = "mlp.c_proj.bias",
    };
    int f = GPT_BLOCK(m->c.n_layer, 0);
    if (i == GPT_WTE || i == GPT_WTE + 1)
        snprintf(buf, n, "%s.weight", i == GPT_WTE ? "wte" : "wpe");
    else if (i < f)
        snprintf(buf, n, "h.%d.%s", (i - 2) / GPT_PER_BLOCK, blk[(i - 2) % GPT_PER_BLOCK]);
    else
        snprintf(buf, n, "%s", i == f ? "ln_f.weight" : i == f + 1 ? "ln_f.bias" : "lm_head.weight");
}

/* The parameters' names (free with free(); NULL without memory). */
static inline const char **gpt_param_names(const gpt_model *m)
{
    const char **nm = calloc((size_t)m->n_params, sizeof *nm + 48);
    char *store = nm ? (char *)(nm + m->n_params) : NULL;
    for (int i = 0; nm && i < m->n_params; i++) {
        gpt_param_name(m, i, store + 48 * (size_t)i, 48);
        nm[i] = store + 48 * (size_t)i;
    }
    return nm;
}

/* Returns 0, or -1 with the runtime's error set (or NT_EHOSTMEM's cause). */
static inline int gpt_init(gpt_model *m, const gpt_config *c, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->c = *c;
    m->n_params = gpt_n_params(c);
    m->p = calloc((size_t)m->n_params, sizeof *m->p);
    m->bctx = calloc((size_t)(c->n_layer > 0 ? c->n_layer : 1), sizeof *m->bctx);
    for (int l = 0; m->bctx && l < c->n_layer; l++)
        m->bctx[l] = (gpt_block_ctx){m, l};
    m->gen = nt_generator_create(0);
    if (!m->p || !m->bctx || !m->gen) {
        gpt_free(m);
        return -1;
    }
    int64_t D = c->width, V = c->vocab;
    const double s = 0.02, so = 0.02 / sqrt(2.0 * c->n_layer);
    uint64_t k = seed * 1000; /* one nt_randn seed per parameter */
    m->p[GPT_WTE] = gpt_param(2, V, D, s, 0, k + GPT_WTE);
    m->p[GPT_WPE] = gpt_param(2, c->context, D, s, 0, k + GPT_WPE);
    for (int l = 0; l < c->n_layer; l++) {
        struct {
            int nd;
            int64_t a, b;
            double std, fill;
        } spec[GPT_PER_BLOCK] = {
            [GPT_LN1W] = {1, D, 0, 0, 1},     [GPT_LN1B] = {1, D, 0, 0, 0},
            [GPT_WQKV] = {2, 3 * D, D, s, 0}, [GPT_BQKV] = {1, 3 * D, 0, 0, 0},
            [GPT_WO] = {2, D, D, so, 0},      [GPT_BO] = {1, D, 0, 0, 0},
            [GPT_LN2W] = {1, D, 0, 0, 1},     [GPT_LN2B] = {1, D, 0, 0, 0},
            [GPT_W1] = {2, 4 * D, D, s, 0},   [GPT_B1] = {1, 4 * D, 0, 0, 0},
            [GPT_W2] = {2, D, 4 * D, so, 0},  [GPT_B2] = {1, D, 0, 0, 0},
        };
        for (int i = 0; i < GPT_PER_BLOCK; i++) {
            int j = GPT_BLOCK(l, i);
            m->p[j] = gpt_param(spec[i].nd, spec[i].a, spec[i].b, spec[i].std, spec[i].fill,
                                k + (uint64_t)j);
        }
    }
    int f = GPT_BLOCK(c->n_layer, 0);
    m->p[f] = gpt_param(1, D, 0, 0, 1, 0);
    m->p[f + 1] = gpt_param(1, D, 0, 0, 0, 0);
    if (c->untied)
        m->p[f + 2] = gpt_param(2, V, D, s, 0, k + (uint64_t)f + 2);
    for (int i = 0; i < m->n_params; i++)
        if (!m->p[i]) {
            gpt_free(m);
            return -1;
        }
    /* The causal mask: built once, sliced to [T, T] for shorter inputs. */
    int64_t T = c->context;
    nt_tensor *ones = nt_ones(NT_U8, 2, (int64_t[]){T, T});
    m->mask = nt_triu(ones, 1);
    nt_release(ones);
    if (!m->mask) {
        gpt_free(m);
        return -1;
    }
    return 0;
}

/* The head's weight: wte when tied. */
static inline nt_tensor *gpt_head_weight(gpt_model *m)
{
    return m->c.untied ? m->p[m->n_params - 1] : m->p[GPT_WTE];
}

/* Causal self-attention of q, k, v [B, H, T, hd] -> [B, H, T, hd]:
 * nt_scaled_dot_product_attention, the flash-style op (on the simulator one
 * tile program: the [T, T] scores never reach HBM; backward recomputes
 * them), within 1e-5 of the peer's softmax(q k^T / sqrt(hd)) v.  --no-sdpa
 * (c.composite_attn) runs the composite instead: scores, masked_fill(-inf)
 * above the diagonal, softmax, times v -- to compare the two. */
static inline nt_tensor *gpt_attn(gpt_model *m, nt_tensor *q, nt_tensor *k, nt_tensor *v)
{
    if (!m->c.composite_attn)
        return nt_scaled_dot_product_attention(q, k, v, NULL, true, 0.0);
    int64_t T = nt_shape(q, 2), hd = nt_shape(q, 3);
    nt_tensor *mask = m->mask;
    if (T != m->c.context)
        mask = nt_slice(nt_slice(m->mask, 0, 0, T, 1), 1, 0, T, 1);
    nt_tensor *att = nt_mul_scalar(nt_matmul(q, nt_transpose(k, 2, 3)), 1 / sqrt((double)hd));
    att = nt_softmax(nt_masked_fill(att, mask, -INFINITY), 3);
    return nt_matmul(att, v);
}

/* Dropout with probability p (the identity when p is 0 or outside training
 * mode: gpt_eval turns nt_set_training off), its seed draw `site` (0 the
 * embedding, then two per block) of the model's generator, whose state is
 * the step's (gpt_step_prepare), not a running counter.  nt_dropout's mask
 * is a counter-based hash of (seed, element index), the same in every mode
 * and on every backend; nt_checkpoint's recompute runs in the forward's
 * training mode and draws the same sites, so the same masks; and a captured
 * step (char_gpt --capture) draws them at each replay from the state set
 * then (docs/graphs.md). */
static inline nt_tensor *gpt_dropout(gpt_model *m, nt_tensor *x, int site)
{
    double p = m->c.dropout;
    if (p <= 0)
        return x;
    return nt_dropout_gen(x, p, m->gen, (uint64_t)site);
}

/* Heads of the slice [off, off + D) of qkv [B, T, 3D]: [B, H, T, D/H]. */
static inline nt_tensor *gpt_heads(gpt_model *m, nt_tensor *qkv, int64_t off)
{
    int64_t B = nt_shape(qkv, 0), T = nt_shape(qkv, 1), D = m->c.width, H = m->c.n_head;
    nt_tensor *s = nt_slice(qkv, 2, off, off + D, 1);
    return nt_permute(nt_reshape(s, 4, (int64_t[]){B, T, H, D / H}), (int[]){0, 2, 1, 3});
}

/* c.rope: GPT-NeoX's rotary embedding of every feature of the heads t [B,
 * H, T, hd] (positions 0 .. T-1, base 10000). */
static inline nt_tensor *gpt_rope(gpt_model *m, nt_tensor *t)
{
    return nt_rope(t, m->c.width / m->c.n_head, false, 10000.0, 1.0, 0);
}

/* Pre-LN block l on x [B, T, D]; p = its GPT_PER_BLOCK params. */
static inline nt_tensor *gpt_block_fn(gpt_model *m, int l, nt_tensor *const *p, nt_tensor *x)
{
    int64_t B = nt_shape(x, 0), T = nt_shape(x, 1), D = m->c.width;
    nt_tensor *h = nt_layer_norm(x, p[GPT_LN1W], p[GPT_LN1B], 1e-5);
    nt_tensor *qkv = nt_linear(h, p[GPT_WQKV], p[GPT_BQKV]);
    nt_tensor *y;
    if (!m->c.rope)
        y = gpt_attn(m, gpt_heads(m, qkv, 0), gpt_heads(m, qkv, D), gpt_heads(m, qkv, 2 * D));
    else
        y = gpt_attn(m, gpt_rope(m, gpt_heads(m, qkv, 0)), gpt_rope(m, gpt_heads(m, qkv, D)),
                     gpt_heads(m, qkv, 2 * D));
    y = nt_reshape(nt_permute(y, (int[]){0, 2, 1, 3}), 3, (int64_t[]){B, T, D});
    x = nt_add(x, gpt_dropout(m, nt_linear(y, p[GPT_WO], p[GPT_BO]), 1 + 2 * l));
    h = nt_layer_norm(x, p[GPT_LN2W], p[GPT_LN2B], 1e-5);
    h = nt_linear(nt_gelu(nt_linear(h, p[GPT_W1], p[GPT_B1])), p[GPT_W2], p[GPT_B2]);
    return nt_add(x, gpt_dropout(m, h, 2 + 2 * l));
}

/* nt_checkpoint's view of block l: ctx is m->bctx[l], inputs[0] is x; the
 * block's parameters are read through ctx (nt_checkpoint finds them as the
 * block runs). */
static inline int gpt_block_ckpt(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out,
                                 int n_out)
{
    (void)n_in, (void)n_out;
    gpt_block_ctx *c = ctx;
    out[0] = gpt_block_fn(c->m, c->l, c->m->p + GPT_BLOCK(c->l, 0), in[0]);
    return out[0] ? 0 : nt_last_error();
}

/* Block l on x; with c.checkpoint through nt_checkpoint, so its activations
 * are recomputed in backward (bit-identical gradients, less memory). */
static inline nt_tensor *gpt_block(gpt_model *m, int l, nt_tensor *x)
{
    if (!m->c.checkpoint)
        return gpt_block_fn(m, l, m->p + GPT_BLOCK(l, 0), x);
    nt_tensor *y = NULL;
    return nt_checkpoint(gpt_block_ckpt, &m->bctx[l], &x, 1, &y, 1) == 0 ? y : NULL;
}

/* The sinusoidal position encoding of "Attention is all you need", [T, D]
 * (D even): pe[t, 2i] = sin(t w_i), pe[t, 2i + 1] = cos(t w_i), w_i =
 * exp(2i * -ln(10000) / D), made from aranges on the device (a captured
 * step replays it, no host data).  gpt_logits scales it by the embeddings'
 * initial std (0.02): at amplitude 1 it drowns the token embeddings (the
 * first layer norm then sees mostly position: 300 steps of the default
 * model reached val 3.39; scaled 2.55, learned 2.56, CPU backend). */
static inline nt_tensor *gpt_sinpos(int64_t T, int64_t D)
{
    nt_tensor *w = nt_exp(nt_mul_scalar(nt_arange(NT_F32, 0, (double)D, 2), -9.210340371976184 / (double)D));
    nt_tensor *t = nt_reshape(nt_arange(NT_F32, 0, (double)T, 1), 2, (int64_t[]){T, 1});
    nt_tensor *a = nt_mul(t, nt_reshape(w, 2, (int64_t[]){1, D / 2}));
    int64_t sh3[3] = {T, D / 2, 1};
    nt_tensor *sc[2] = {nt_reshape(nt_sin(a), 3, sh3), nt_reshape(nt_cos(a), 3, sh3)};
    return nt_reshape(nt_cat(sc, 2, 2), 2, (int64_t[]){T, D});
}

/* Logits [B * T, V] of idx [B, T] (i32). */
static inline nt_tensor *gpt_logits(gpt_model *m, nt_tensor *idx)
{
    nt_tensor **p = m->p;
    int64_t B = nt_shape(idx, 0), T = nt_shape(idx, 1);
    nt_tensor *pos = m->c.sinpos || m->c.rope ? NULL : nt_arange(NT_I32, 0, (double)T, 1);
    nt_tensor *x;
    if (!m->c.rope)
        x = nt_add(nt_embedding(p[GPT_WTE], idx),
                   pos ? nt_embedding(p[GPT_WPE], pos)
                       : nt_mul_scalar(gpt_sinpos(T, m->c.width), 0.02));
    else /* the positions enter in attention only */
        x = nt_embedding(p[GPT_WTE], idx);
    x = gpt_dropout(m, x, 0);
    for (int l = 0; l < m->c.n_layer; l++)
        x = gpt_block(m, l, x);
    int f = GPT_BLOCK(m->c.n_layer, 0);
    x = nt_layer_norm(x, p[f], p[f + 1], 1e-5);
    return nt_reshape(nt_linear(x, gpt_head_weight(m), NULL), 2,
                      (int64_t[]){B * T, m->c.vocab});
}

/* Mean cross-entropy of the next characters tgt [B * T] (i32). */
static inline nt_tensor *gpt_loss(gpt_model *m, nt_tensor *idx, nt_tensor *tgt)
{
    return nt_cross_entropy(gpt_logits(m, idx), tgt);
}

/* torch.nn.utils.clip_grad_norm_(params, max_norm): scales every .grad by
 * min(1, max_norm / (total + 1e-6)), total the L2 norm of all of them, on
 * the device (nt_clip_grad_norm: no sync).  Returns total (0-dim, in the
 * caller's scope), or NULL. */
static inline nt_tensor *gpt_clip_grads(nt_tensor *const *p, int n, double max_norm)
{
    return nt_clip_grad_norm(p, n, max_norm);
}

/* ---------------- training ---------------- */

typedef struct {
    int batch;
    double lr, clip;      /* peak learning rate; max gradient norm (0: none) */
    int64_t steps, warmup;
    nt_dtype amp;         /* NT_BF16 / NT_F16 autocast, NT_DTYPE_COUNT: none */
    nt_fp8_recipe *fp8;   /* fp8 autocast with this recipe (amp then unused), or NULL */
    uint64_t seed;        /* the batches' generator */
    nt_scheduler *sched;  /* the lr schedule (gpt_optimizer makes it) */
} gpt_train_opts;

/* AdamW (betas 0.9, 0.95, eps 1e-8) in two parameter groups, as nanoGPT's
 * configure_optimizers: weight decay `wd` on the matrices and embeddings
 * (2-D), none on the layer norms' weights and the biases (1-D); and the
 * schedule in o->sched: linear warm-up over o->warmup steps, then cosine
 * decay to lr / 10 at the last step (nt_scheduler_cosine; its position is
 * the optimizer's step count, so a run resumed by nt_load continues it).
 * NULL with the runtime's error set.  Free with gpt_optimizer_free. */
static inline nt_optim *gpt_optimizer(gpt_model *m, gpt_train_opts *o, double wd)
{
    nt_tensor **decay = malloc(sizeof *decay * (size_t)m->n_params);
    nt_tensor **none = malloc(sizeof *none * (size_t)m->n_params);
    int nd = 0, nn = 0;
    for (int i = 0; decay && none && i < m->n_params; i++) {
        if (nt_ndim(m->p[i]) >= 2)
            decay[nd++] = m->p[i];
        else
            none[nn++] = m->p[i];
    }
    nt_optim *opt = decay && none && nd ? nt_optim_adamw(decay, nd, o->lr, 0.9, 0.95, 1e-8, wd)
                                        : NULL;
    if (opt && nn && nt_optim_add_group(opt, none, nn, o->lr, 0) < 0) {
        nt_optim_destroy(opt);
        opt = NULL;
    }
    free(decay);
    free(none);
    int64_t total = o->steps > o->warmup ? o->steps : o->warmup;
    o->sched = opt ? nt_scheduler_cosine(opt, o->warmup, total, o->lr * 0.1) : NULL;
    if (opt && !o->sched) {
        nt_optim_destroy(opt);
        opt = NULL;
    }
    return opt;
}

static inline void gpt_optimizer_free(nt_optim *opt, gpt_train_opts *o)
{
    nt_scheduler_destroy(o->sched);
    o->sched = NULL;
    nt_optim_destroy(opt);
}

/* One step of AdamW (opt) on batch `step`: learning rate from the
 * schedule, forward, backward, gradient clipping, update, zero_grad.  Never
 * waits for the device.  Returns the loss (0-dim f32, the caller's to
 * release), or NULL with the runtime's error set.  xb, yb: B * T host ints. */
/* The host's part of step `step`: the learning rate from the schedule, the
 * dropout seed, the batch into xb, yb (B * T ints each). */
static inline int gpt_step_prepare(gpt_model *m, nt_optim *opt, const gpt_data *d,
                                   const gpt_train_opts *o, int64_t step, int32_t *xb,
                                   int32_t *yb)
{
    (void)opt; /* the schedule's position is its step count, `step` */
    if (nt_scheduler_step(o->sched) != 0)
        return -1;
    /* a function of the step, so a resumed run draws the same masks */
    if (nt_generator_set_state(m->gen, o->seed * 0x100000000ull, (uint64_t)step * 1024) != 0)
        return -1;
    gpt_batch(d, false, o->seed, step, o->batch, m->c.context, xb, yb);
    return 0;
}

/* Opens the autocast region of amp or, if fp8 is not NULL, the fp8 one
 * (docs/amp.md); *open says whether one was opened (close it with
 * nt_autocast_end).  0 or an error code. */
static inline int gpt_autocast_begin(nt_dtype amp, nt_fp8_recipe *fp8, bool *open)
{
    *open = fp8 || amp != NT_DTYPE_COUNT;
    return fp8 ? nt_fp8_autocast_begin(fp8) : *open ? nt_autocast_begin(amp) : 0;
}

/* The device's part of a step on batch x [B, T], targets y [B * T] (i32):
 * forward, backward, gradient clipping, update, zero_grad -- what
 * `char_gpt --capture` records once and replays.  Returns the loss (0-dim
 * f32, the caller's to release), or NULL with the runtime's error set. */
static inline nt_tensor *gpt_step_body(gpt_model *m, nt_optim *opt, const gpt_train_opts *o,
                                       nt_tensor *x, nt_tensor *y)
{
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return NULL;
    bool amp;
    if (gpt_autocast_begin(o->amp, o->fp8, &amp) != 0) {
        nt_scope_end(sc);
        return NULL;
    }
    nt_tensor *loss = gpt_loss(m, x, y); /* f32 under autocast */
    if (amp)
        nt_autocast_end();
    int rc = !loss || nt_backward(loss) != 0;
    /* fp8: push this step's amaxes, rescale (device ops: captured too) */
    if (!rc && o->fp8)
        rc = nt_fp8_recipe_update(o->fp8, NULL) != 0;
    if (!rc && o->clip > 0 && !gpt_clip_grads(m->p, m->n_params, o->clip))
        rc = 1;
    if (!rc)
        rc = nt_optim_step(opt) != 0 || nt_optim_zero_grad(opt) != 0;
    if (!rc)
        nt_keep(loss);
    nt_scope_end(sc);
    return rc ? NULL : loss;
}

/* One step of AdamW (opt) on batch `step`: gpt_step_prepare, then the body
 * on the batch copied to the device.  Never waits for the device.  Returns
 * the loss (0-dim f32, the caller's to release), or NULL with the runtime's
 * error set.  xb, yb: B * T host ints. */
static inline nt_tensor *gpt_train_step(gpt_model *m, nt_optim *opt, const gpt_data *d,
                                        const gpt_train_opts *o, int64_t step, int32_t *xb,
                                        int32_t *yb)
{
    int B = o->batch, T = m->c.context;
    if (gpt_step_prepare(m, opt, d, o, step, xb, yb) != 0)
        return NULL;
    nt_tensor *x = nt_from_host(xb, NT_I32, 2, (int64_t[]){B, T});
    nt_tensor *y = nt_from_host(yb, NT_I32, 1, (int64_t[]){(int64_t)B * T});
    nt_tensor *loss = x && y ? gpt_step_body(m, opt, o, x, y) : NULL;
    nt_release(x);
    nt_release(y);
    return loss;
}

/* A step recorded once and replayed (docs/graphs.md): the graph and its
 * loss, which each replay rewrites.  Zero it before the first step;
 * gpt_capture_free at the end. */
typedef struct {
    nt_graph *graph;
    nt_tensor *loss;
} gpt_capture;

/* gpt_train_step through a capture: the host's part (the schedule, the
 * batch) every step; the device's part recorded at the first call and
 * replayed after with this step's batch bound to the inputs "x" and "y".
 * Returns a new reference to the loss, or NULL with the runtime's error
 * set. */
static inline nt_tensor *gpt_captured_step(gpt_model *m, nt_optim *opt, const gpt_data *d,
                                           const gpt_train_opts *o, int64_t step, int32_t *xb,
                                           int32_t *yb, gpt_capture *cap)
{
    int B = o->batch, T = m->c.context;
    if (gpt_step_prepare(m, opt, d, o, step, xb, yb) != 0)
        return NULL;
    nt_tensor *x = nt_from_host(xb, NT_I32, 2, (int64_t[]){B, T});
    nt_tensor *y = nt_from_host(yb, NT_I32, 1, (int64_t[]){(int64_t)B * T});
    int rc = x && y ? 0 : -1;
    if (!rc && !cap->graph) {
        rc = nt_graph_capture_begin();
        if (!rc) {
            rc = nt_graph_input(x, "x") || nt_graph_input(y, "y");
            cap->loss = rc ? NULL : gpt_step_body(m, opt, o, x, y);
            cap->graph = nt_graph_capture_end(); /* ends the capture either way */
            rc = rc || !cap->loss || !cap->graph;
        }
    } else if (!rc) {
        rc = nt_graph_bind(cap->graph, "x", x) || nt_graph_bind(cap->graph, "y", y) ||
             nt_graph_replay(cap->graph);
    }
    nt_release(x);
    nt_release(y);
    return rc ? NULL : nt_retain(cap->loss);
}

static inline void gpt_capture_free(gpt_capture *cap)
{
    nt_release(cap->loss);
    nt_graph_destroy(cap->graph);
    cap->loss = NULL;
    cap->graph = NULL;
}

/* Mean loss over `nb` fixed validation batches (GPT_VAL_SEED), without a
 * graph: one sync.  NaN with the runtime's error set on failure. */
static inline double gpt_eval_fp8(gpt_model *m, const gpt_data *d, int B, int nb, nt_dtype amp,
                                  nt_fp8_recipe *fp8)
{
    int T = m->c.context;
    int32_t *xb = malloc(sizeof *xb * (size_t)B * (size_t)T);
    int32_t *yb = malloc(sizeof *yb * (size_t)B * (size_t)T);
    double v = NAN;
    nt_scope *sc = xb && yb ? nt_scope_begin() : NULL;
    if (sc) {
        bool train = nt_is_training();
        nt_set_training(false); /* no dropout */
        nt_no_grad_begin();
        nt_tensor *sum = nt_zeros(NT_F32, 0, NULL);
        int rc = !sum;
        for (int k = 0; k < nb && !rc; k++) {
            /* a scope per batch: each batch's activations go as soon as
             * its loss is added, not at the end of the evaluation */
            nt_scope *bs = nt_scope_begin();
            gpt_batch(d, true, GPT_VAL_SEED, k, B, T, xb, yb);
            nt_tensor *x = nt_from_host(xb, NT_I32, 2, (int64_t[]){B, T});
            nt_tensor *y = nt_from_host(yb, NT_I32, 1, (int64_t[]){(int64_t)B * T});
            bool open = false;
            gpt_autocast_begin(amp, fp8, &open);
            nt_tensor *l = gpt_loss(m, x, y);
            if (open)
                nt_autocast_end();
            rc = !bs || nt_add_inplace(sum, l) != 0;
            nt_scope_end(bs);
        }
        nt_no_grad_end();
        nt_set_training(train);
        double s;
        if (!rc && nt_item(sum, &s) == 0)
            v = s / nb;
        nt_scope_end(sc);
    }
    free(xb);
    free(yb);
    return v;
}

/* gpt_eval_fp8 without fp8. */
static inline double gpt_eval(gpt_model *m, const gpt_data *d, int B, int nb, nt_dtype amp)
{
    return gpt_eval_fp8(m, d, B, nb, amp, NULL);
}

#endif
