/* examples/gpt_mesh.h - the char GPT of examples/gpt_model.h under a device
 * mesh: data parallel over "data" (nt_ddp, ZeRO stage 0-3), tensor parallel
 * over "tensor" (nt_tp_* layers), with parameters after any number of steps
 * the same bits for every (dp, tp) and ZeRO stage (docs/parallel.md, "char
 * GPT under a mesh").  Shared by examples/char_gpt.c (--dp, --tp, --zero)
 * and tests/test_mesh.c; written against the public API only.
 *
 * The model is gpt_model.h's (pre-LN blocks, GELU MLP, the head tied to
 * the token embedding) made of the tensor-parallel layers, at every tp,
 * 1 included:
 *   x      = tp_embedding(wte)[idx] + wpe[pos]     wte's rows split (vocabulary-parallel)
 *   blocks:
 *     qkv  = column_linear(ln1(x), wqkv, bqkv)     rows split by heads
 *     x    = x + row_linear(attn(q, k, v), wo) + bo   (causal sdpa on each member's heads)
 *     x    = x + row_linear(gelu(column_linear(ln2(x), w1, b1)), w2) + b2
 *   loss   = tp_cross_entropy(column_linear(ln_f(x), wte))
 * The layer norms, wpe and the row-parallel biases are replicated.  wqkv's
 * rows are head by head, q k v within a head ([H, 3, hd, D]), so a member's
 * rows are its heads' q, k and v whatever tp is.  The row-parallel sums
 * (over K), the column-parallel input gradients (over N) and the
 * cross-entropy's sum of exponentials (over V) are the fixed trees of
 * `blocks` blocks of dist/tp.c, so they do not depend on tp; the vocabulary
 * is padded with unused ids to a multiple of `blocks` (Megatron pads it
 * too; the padded rows' logits take part in the softmax and learn to be
 * small).  This is why a mesh run's bits are not those of the plain model
 * of gpt_model.h, even at (1, 1): that one sums over K in one matmul, over
 * V in one reduction, and uses one [3D, D] qkv weight with a q|k|v layout.
 *
 * Data parallelism: one nt_ddp per tensor rank r over the devices of
 * tensor coordinate r (its "data" group), S fixed shards of the batch
 * (--shards, 8); shard s's loss is the tensor group's joined loss and
 * nt_ddp_backward_group hands each nt_ddp its replica's gradients.  ZeRO
 * stages come from nt_ddp_set_zero on every one of them; at stage 3 a step
 * runs in rounds of one shard a tensor (or expert) group, each block's
 * weights released in every member after its forward (nt_ddp_layer_done,
 * gptm_rounds; docs/sharding.md, "The model").  Gradient
 * clipping (gptm_clip) defines its norm's order over the same blocks.  Not
 * done under a mesh: --untied, --sinpos, --rope.
 *
 * Sequence parallelism and dropout (gptm_set_sp, gptm_set_dropout): with
 * sp, the residual stream, the layer norms, the row-parallel biases and
 * dropout hold each member's slice of the sequence, [b, T / tp, D]; the
 * column-parallel linears all-gather their input along T and the
 * row-parallel ones reduce-scatter their output (nt_tp_*_linear_sp: every
 * activation element the bits of the layers without sp).  What the split
 * would cut is the replicated parameters' gradients, which sum over
 * tokens: under sp they are defined over `blocks` token blocks of T /
 * blocks positions (each block's layer norm, bias add and position rows
 * on its own, nt_tp_copy_blocks adding the blocks in the rank tree), so
 * every split gives one CRC -- not the CRC without sp, whose layer norms
 * sum all of a shard's tokens in one reduction.  Dropout (the plain
 * model's places: the embedding, each block's two residual branches) masks
 * each token block with its own seed, a hash of (seed, step, shard, site,
 * token block): nt_dropout's counter-based mask of (seed, element) then
 * depends on the global position only, not on the split, with or without
 * sp.
 *
 * The MoE variant (gptm_init_moe with experts > 0, char_gpt --ep/--experts):
 * every block's MLP is nt_moe_mlp over a third mesh dimension, "expert"
 * (data x tensor x expert): a group of tp x ep members processes one shard;
 * each expert coordinate's tensor group runs the embedding, attention,
 * layer norms and loss of the whole shard as the dense model does (so
 * every member holds the shard's residual stream), and the MoE MLP is
 * split over the whole tp x ep block (gptm_moe): its communicator is the
 * "expert" one of a second mesh, data x (tp ep), whose rank q = r ep + e
 * is member m = e tp + r (tensor rank r, expert rank e; gptm_moe_q);
 * member q routes rows q N/nm .. of the shard's tokens and owns experts
 * q E/nm .., nm = tp ep.  One nt_ddp per member (over the devices of its
 * (tensor, expert) coordinate), the experts' weights held as that member's
 * rows.  The loss adds auxw times the layers' load-balancing losses.
 *
 * Checkpoints (gptm_save, gptm_load at the end): one nt_ddp_save_split per
 * member plus a layout record; a load under another layout reshards.
 *
 * Capture (gptm_captured_step, char_gpt --capture): the device's part of a
 * step (gptm_step_body) recorded once over every core with
 * nt_graph_capture_begin_multi and replayed, each shard's batch bound per
 * replay; the same bits as op by op (sp too).  Not with dropout, the MoE MLP or
 * several processes (gptm_capture_refusal says why). */
#ifndef NT_EXAMPLES_GPT_MESH_H
#define NT_EXAMPLES_GPT_MESH_H

#include <stdarg.h>

#include "gpt_model.h"

#define GPTM_MAXD 64 /* devices of a process */

/* Parameter kinds: how a member holds it. */
enum { GPTM_ROWS, GPTM_COLS, GPTM_REP, GPTM_EXP /* rows split over "expert" */ };

typedef struct {
    int nd;
    int64_t r, c;   /* the full shape ([r] when nd == 1) */
    int split;      /* GPTM_ROWS / GPTM_COLS / GPTM_REP */
    double std, fill;
    bool decay;     /* AdamW weight decay (2-D) */
} gptm_spec;

typedef struct {
    gpt_config c;          /* c.vocab: padded to a multiple of blocks */
    int vocab_data;        /* the data's vocabulary */
    int dp, tp, zero, blocks, shards, ep;
    int nm;                /* members of a group: tp x ep */
    int experts, topk;     /* the MoE MLP (experts > 0; see gptm_moe) */
    double auxw;           /* the load-balancing loss's coefficient */
    bool tally;            /* gptm_moe adds its counts to `load` */
    nt_tensor *load;       /* i32 [experts] on device 0: tokens per expert since the reset */
    nt_dtype amp;          /* --amp bf16: the tensor-parallel linears' operands cast to it */
    int ndev;              /* this process's devices */
    nt_mesh *mesh;
    nt_mesh *moe_mesh;     /* with the MoE MLP: data x (tensor x expert), its "expert"
                              communicator the MoE group in q order (gptm_moe_q) */
    int n;                 /* parameters (per member) */
    gptm_spec *spec;       /* [n]: decay ones first (the optimizer's groups) */
    nt_ddp *ddp[GPTM_MAXD];            /* [tp] one per tensor rank */
    int ndd[GPTM_MAXD];                /* [tp] its local devices */
    int dd[GPTM_MAXD][GPTM_MAXD];      /* [tp][ndd] those devices */
    nt_optim *opt[GPTM_MAXD][GPTM_MAXD];
    nt_scheduler *sched[GPTM_MAXD][GPTM_MAXD];
    nt_tensor *mask_unused;
    /* Sequence parallelism (gptm_set_sp) and dropout (gptm_set_dropout):
     * the file's comment says what they do. */
    bool sp;
    double dropout;
    uint64_t seed, step;   /* dropout's key: the run's seed, the step (gptm_step counts) */
    int shard;             /* the shard gptm_loss computes (gptm_step sets it) */
    bool training;         /* dropout on (gptm_step's forward) */
    int64_t act_bytes;     /* the largest activation memory a shard's forward left on
                              member 0's device: nt_device_bytes_live after the
                              forward's scope ended (what the backward keeps, and
                              the loss) minus before the forward */
    int64_t live_bytes;    /* the largest nt_device_bytes_live there before a backward */
    /* Stage 3 (gptm_set_release): the local groups' shards run in rounds,
     * one shard a group (member r of group k on g->dd[r][k]), layer by
     * layer (gptm_rounds): each block's weights gathered in every member's
     * nt_ddp a block ahead of its forward and given back after it
     * (nt_ddp_layer_done, a mark per member), gathered again in the round's
     * backward (nt_ddp_backward_group_shards).  On by default at stage 3,
     * at every (tp, ep); not while recording a capture (both calls refuse
     * one: the captured step runs shard by shard). */
    bool release;
    bool recording;        /* gptm_captured_step is recording gptm_step_body */
    float *clip_sq;        /* NULL, or [n]: gptm_clip copies each parameter's sum of
                              squares here (member 0, the first local group; tests) */
} gpt_mesh;

/* Parameter index: wte, wpe, per block wqkv wo w1 w2 (the 2-D, decayed),
 * then per block ln1w ln1b bqkv bo ln2w ln2b b1 b2, then ln_f w, b. */
enum { GPTM_WQKV, GPTM_WO, GPTM_W1, GPTM_W2, GPTM_N2 };
enum { GPTM_LN1W, GPTM_LN1B, GPTM_BQKV, GPTM_BO, GPTM_LN2W, GPTM_LN2B, GPTM_B1, GPTM_B2,
       GPTM_N1 };
#define GPTM_WTE 0
#define GPTM_WPE 1
#define GPTM_M2(g, l, i) (2 + (l) * GPTM_N2 + (i))
#define GPTM_M1(g, l, i) (2 + (g)->c.n_layer * GPTM_N2 + (l) * GPTM_N1 + (i))
#define GPTM_LNF(g) (2 + (g)->c.n_layer * (GPTM_N2 + GPTM_N1))

/* Formats the caller's error message into err[n]; returns -1. */
static inline int gptm_fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err)
        vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Checks the sizes against tp and blocks; 0 or -1 with err set. */
static inline int gptm_check(const gpt_config *c, int dp, int tp, int zero, int blocks,
                             int shards, int batch, char *err, size_t n)
{
    if (dp < 1 || tp < 1)
        return gptm_fail(err, n, "--dp (%d) and --tp (%d) must be >= 1", dp, tp);
    if (zero < 0 || zero > 3)
        return gptm_fail(err, n, "--zero must be 0, 1, 2 or 3 (got %d)", zero);
    if (c->n_head % tp)
        return gptm_fail(err, n, "--heads (%d) must be a multiple of --tp (%d)", c->n_head,
                         tp);
    if (c->width % c->n_head)
        return gptm_fail(err, n, "--width (%d) must be a multiple of --heads (%d)", c->width,
                         c->n_head);
    int q = blocks / tp;
    if (blocks < 1 || blocks % tp || (q & (q - 1)))
        return gptm_fail(err, n, "--blocks (%d) must be a multiple of --tp (%d) with a "
                         "power-of-two quotient", blocks, tp);
    if (c->width % blocks)
        return gptm_fail(err, n, "--width (%d) must be a multiple of --blocks (%d)",
                         c->width, blocks);
    if (c->vocab % tp)
        return gptm_fail(err, n, "the vocabulary (%d) must be a multiple of --tp (%d): pad it",
                         c->vocab, tp);
    if (c->vocab % blocks)
        return gptm_fail(err, n, "the vocabulary (%d) must be a multiple of --blocks (%d): "
                         "pad it", c->vocab, blocks);
    int qs = shards / dp;
    if (shards % dp || (qs & (qs - 1)))
        return gptm_fail(err, n, "--shards (%d) must be a multiple of --dp (%d) with a "
                         "power-of-two quotient", shards, dp);
    if (batch % shards)
        return gptm_fail(err, n, "--batch (%d) must be a multiple of --shards (%d)", batch,
                         shards);
    return 0;
}

/* Sequence parallelism's sizes: 0 or -1 with err set. */
static inline int gptm_check_sp(const gpt_config *c, int tp, int blocks, int experts, char *err,
                                size_t n)
{
    if (experts)
        return gptm_fail(err, n, "--sp needs the dense MLP: not with --ep/--experts");
    if (c->context % blocks)
        return gptm_fail(err, n, "--sp: --context (%d) must be a multiple of --blocks (%d), "
                         "the token blocks (each member holds --context / --tp = %d / %d "
                         "positions)", c->context, blocks, c->context, tp);
    return 0;
}

/* Turns sequence parallelism on (before the first step): 0 or -1 with err
 * set. */
static inline int gptm_set_sp(gpt_mesh *g, bool on, char *err, size_t n)
{
    if (on && gptm_check_sp(&g->c, g->tp, g->blocks, g->experts, err, n))
        return -1;
    g->sp = on;
    return 0;
}

/* Dropout probability p in [0, 1) (the plain model's places). */
static inline int gptm_set_dropout(gpt_mesh *g, double p, char *err, size_t n)
{
    if (!(p >= 0 && p < 1))
        return gptm_fail(err, n, "--dropout (%g) must be in [0, 1)", p);
    if (p > 0 && g->experts)
        return gptm_fail(err, n, "--dropout is not supported with the MoE MLP (--ep/--experts)");
    if (p > 0 && g->c.context % g->blocks)
        return gptm_fail(err, n, "--dropout: --context (%d) must be a multiple of --blocks (%d) "
                         "(dropout's token blocks)", g->c.context, g->blocks);
    g->dropout = p;
    return 0;
}

static inline gptm_spec *gptm_specs(const gpt_config *c, int *np)
{
    int L = c->n_layer, n = 2 + L * (GPTM_N2 + GPTM_N1) + 2;
    int64_t D = c->width, V = c->vocab, T = c->context;
    double s = 0.02, so = 0.02 / sqrt(2.0 * L);
    gptm_spec *p = calloc((size_t)n, sizeof *p);
    if (!p)
        return NULL;
    p[GPTM_WTE] = (gptm_spec){2, V, D, GPTM_ROWS, s, 0, true};
    p[GPTM_WPE] = (gptm_spec){2, T, D, GPTM_REP, s, 0, true};
    for (int l = 0; l < L; l++) {
        gptm_spec *w = p + 2 + l * GPTM_N2, *b = p + 2 + L * GPTM_N2 + l * GPTM_N1;
        w[GPTM_WQKV] = (gptm_spec){2, 3 * D, D, GPTM_ROWS, s, 0, true};
        w[GPTM_WO] = (gptm_spec){2, D, D, GPTM_COLS, so, 0, true};
        w[GPTM_W1] = (gptm_spec){2, 4 * D, D, GPTM_ROWS, s, 0, true};
        w[GPTM_W2] = (gptm_spec){2, D, 4 * D, GPTM_COLS, so, 0, true};
        b[GPTM_LN1W] = (gptm_spec){1, D, 0, GPTM_REP, 0, 1, false};
        b[GPTM_LN1B] = (gptm_spec){1, D, 0, GPTM_REP, 0, 0, false};
        b[GPTM_BQKV] = (gptm_spec){1, 3 * D, 0, GPTM_ROWS, 0, 0, false};
        b[GPTM_BO] = (gptm_spec){1, D, 0, GPTM_REP, 0, 0, false};
        b[GPTM_LN2W] = (gptm_spec){1, D, 0, GPTM_REP, 0, 1, false};
        b[GPTM_LN2B] = (gptm_spec){1, D, 0, GPTM_REP, 0, 0, false};
        b[GPTM_B1] = (gptm_spec){1, 4 * D, 0, GPTM_ROWS, 0, 0, false};
        b[GPTM_B2] = (gptm_spec){1, D, 0, GPTM_REP, 0, 0, false};
    }
    p[n - 2] = (gptm_spec){1, D, 0, GPTM_REP, 0, 1, false};
    p[n - 1] = (gptm_spec){1, D, 0, GPTM_REP, 0, 0, false};
    *np = n;
    return p;
}

/* The MoE variant's parameters (experts > 0): block l's w1 is the experts'
 * [E, D, 4D] held as [E D, 4D], w2 [E, 4D, D] as [E 4D, D], both split by
 * experts over "expert"; b1's slot holds the router's weight [E, D]
 * (replicated, no weight decay); b2 stays the MLP's output bias. */
static inline void gptm_specs_moe(const gpt_config *c, int experts, gptm_spec *p)
{
    int L = c->n_layer;
    int64_t D = c->width, E = experts;
    double s = 0.02, so = 0.02 / sqrt(2.0 * L);
    for (int l = 0; l < L; l++) {
        gptm_spec *w = p + 2 + l * GPTM_N2, *b = p + 2 + L * GPTM_N2 + l * GPTM_N1;
        w[GPTM_W1] = (gptm_spec){2, E * D, 4 * D, GPTM_EXP, s, 0, true};
        w[GPTM_W2] = (gptm_spec){2, E * 4 * D, D, GPTM_EXP, so, 0, true};
        b[GPTM_B1] = (gptm_spec){2, E, D, GPTM_REP, s, 0, false};
    }
}

/* Member m = e tp + r (expert rank e, tensor rank r) is rank q = r ep + e
 * of the MoE group (the "expert" communicator of g->moe_mesh, tensor-major):
 * q owns experts q E/nm .. and routes rows q N/nm ...  gptm_moe_m is the
 * inverse. */
static inline int gptm_moe_q(const gpt_mesh *g, int m)
{
    return (m % g->tp) * g->ep + m / g->tp;
}

static inline int gptm_moe_m(const gpt_mesh *g, int q)
{
    return (q % g->ep) * g->tp + q / g->ep;
}

/* Member m's rank and part count for a parameter of kind split. */
static inline void gptm_rank(const gpt_mesh *g, int split, int m, int *rank, int *parts)
{
    bool exp = split == GPTM_EXP;
    *rank = exp ? gptm_moe_q(g, m) : m % g->tp;
    *parts = split == GPTM_REP ? 1 : exp ? g->nm : g->tp;
}

/* Tensor rank r of tp's part of parameter j, made on the current device:
 * the full tensor (nt_randn of the full shape: the same values at every
 * split), then the member's rows or columns. */
static inline nt_tensor *gptm_param(const gptm_spec *p, int r, int tp, uint64_t seed)
{
    int64_t shape[2] = {p->r, p->c};
    nt_tensor *full = p->std != 0 ? nt_mul_scalar(nt_randn(NT_F32, p->nd, shape, seed), p->std)
                                  : nt_full(NT_F32, p->nd, shape, p->fill);
    nt_tensor *t = full;
    if (p->split != GPTM_REP && tp > 1) {
        int dim = p->split == GPTM_COLS ? 1 : 0;
        int64_t part = shape[dim] / tp;
        t = nt_contiguous(nt_slice(full, dim, r * part, (r + 1) * part, 1));
    }
    if (t && nt_set_requires_grad(t, true) != 0)
        return NULL;
    return t;
}

/* The local devices of member m = expert rank * tp + tensor rank, in
 * data-coordinate order. */
static inline int gptm_layout(gpt_mesh *g, char *err, size_t n)
{
    for (int m = 0; m < g->nm; m++)
        g->ndd[m] = 0;
    for (int dev = 0; dev < g->ndev; dev++) {
        int r = nt_mesh_coord(g->mesh, "tensor", dev);
        int e = g->experts ? nt_mesh_coord(g->mesh, "expert", dev) : 0;
        if (r < 0 || e < 0)
            return gptm_fail(err, n, "nt_mesh_coord failed (%d)", r < 0 ? r : e);
        int devs[GPTM_MAXD];
        int k = nt_mesh_group(g->mesh, "tensor", dev, devs, GPTM_MAXD);
        if (k != g->tp)
            return gptm_fail(err, n, "a tensor group must lie in one process: this process "
                             "holds %d of its %d devices", k, g->tp);
        k = g->experts ? nt_mesh_group(g->mesh, "expert", dev, devs, GPTM_MAXD) : 1;
        if (k != g->ep)
            return gptm_fail(err, n, "an expert group must lie in one process: this process "
                             "holds %d of its %d devices", k, g->ep);
        int m = e * g->tp + r;
        g->dd[m][g->ndd[m]++] = dev;
        if (g->moe_mesh) { /* the MoE group: member m is its rank q */
            k = nt_mesh_group(g->moe_mesh, "expert", dev, devs, GPTM_MAXD);
            if (k != g->nm)
                return gptm_fail(err, n, "an MoE group (--tp x --ep = %d) must lie in one "
                                 "process: this process holds %d of its devices", g->nm, k);
            if (devs[gptm_moe_q(g, m)] != dev)
                return gptm_fail(err, n, "the MoE group's device %d is not member %d's",
                                 gptm_moe_q(g, m), m);
        }
    }
    return 0;
}

static inline void gptm_free(gpt_mesh *g)
{
    for (int r = 0; r < GPTM_MAXD; r++)
        for (int k = 0; k < GPTM_MAXD; k++) {
            if (g->sched[r][k])
                nt_scheduler_destroy(g->sched[r][k]);
            if (g->opt[r][k])
                nt_optim_destroy(g->opt[r][k]);
        }
    for (int r = 0; r < GPTM_MAXD; r++)
        if (g->ddp[r])
            nt_ddp_destroy(g->ddp[r]);
    nt_mesh_destroy(g->mesh);
    nt_mesh_destroy(g->moe_mesh);
    if (g->load)
        nt_release(g->load);
    free(g->spec);
    memset(g, 0, sizeof *g);
}

/* The optimizers of tensor rank r: AdamW per local device over its
 * replica (stage 0) or its shards, weight decay wd on the 2-D parameters
 * (the first ones), and the cosine schedule of gpt_optimizer. */
static inline int gptm_optim(gpt_mesh *g, int r, const gpt_train_opts *o, double wd)
{
    int nd = 0;
    while (nd < g->n && g->spec[nd].decay)
        nd++;
    for (int k = 0; k < g->ndd[r]; k++) {
        int dev = g->dd[r][k];
        nt_tensor **ps = g->zero ? nt_ddp_zero_shards(g->ddp[r], dev) : nt_ddp_params(g->ddp[r], dev);
        if (!ps || nt_device_set(dev))
            return -1;
        nt_optim *op = nt_optim_adamw(ps, nd, o->lr, 0.9, 0.95, 1e-8, wd);
        g->opt[r][k] = op;
        if (!op || (nd < g->n && nt_optim_add_group(op, ps + nd, g->n - nd, o->lr, 0) < 0))
            return -1;
        int64_t total = o->steps > o->warmup ? o->steps : o->warmup;
        g->sched[r][k] = nt_scheduler_cosine(op, o->warmup, total, o->lr * 0.1);
        if (!g->sched[r][k])
            return -1;
    }
    return 0;
}

/* The MoE variant's fixed token blocks (nt_moe_opts.blocks): the MoE group
 * (tp x ep) must divide it, so the bits are those of every group dividing 8. */
#define GPTM_MOE_BLOCKS 8
#define GPTM_MAXE 512 /* experts of an MoE MLP (gptm_clip's per-expert sums) */

/* Checks the MoE variant's sizes (experts > 0): 0 or -1 with err set. */
static inline int gptm_check_moe(const gpt_config *c, int tp, int ep, int experts, int topk,
                                 int shards, int batch, char *err, size_t n)
{
    if (ep < 1 || experts < 1)
        return gptm_fail(err, n, "--ep (%d) and --experts (%d) must be >= 1", ep, experts);
    if (tp < 1)
        return gptm_fail(err, n, "--tp (%d) must be >= 1", tp);
    int nm = tp * ep; /* the MoE group */
    if (experts % nm)
        return tp == 1 ? gptm_fail(err, n, "--experts (%d) must be divisible by --ep (%d)",
                                   experts, ep)
                       : gptm_fail(err, n, "--experts (%d) must be divisible by --tp x --ep "
                                   "(%d x %d = %d, the MoE group)", experts, tp, ep, nm);
    if (experts > GPTM_MAXE)
        return gptm_fail(err, n, "--experts (%d) must be at most %d", experts, GPTM_MAXE);
    if (topk < 1 || topk > experts)
        return gptm_fail(err, n, "--topk (%d) must be in 1..--experts (%d)", topk, experts);
    if (GPTM_MOE_BLOCKS % nm)
        return tp == 1 ? gptm_fail(err, n, "--ep (%d) must divide %d (the MoE's fixed token "
                                   "blocks)", ep, GPTM_MOE_BLOCKS)
                       : gptm_fail(err, n, "--tp x --ep (%d x %d = %d, the MoE group) must "
                                   "divide %d (the MoE's fixed token blocks)", tp, ep, nm,
                                   GPTM_MOE_BLOCKS);
    int64_t rows = (int64_t)(batch / (shards > 0 ? shards : 1)) * c->context;
    if (rows % GPTM_MOE_BLOCKS)
        return gptm_fail(err, n, "a shard's tokens (%lld) must be a multiple of %d for the "
                         "MoE MLP", (long long)rows, GPTM_MOE_BLOCKS);
    return 0;
}

/* Builds the mesh (dp x tp over every process's devices; dp x tp x ep with
 * the MoE MLP, experts > 0), the parameters of each member (seeded as
 * gpt_init is: one nt_randn seed per parameter), one nt_ddp per member at
 * ZeRO stage `zero`, and the optimizers.  c->vocab must be padded already.
 * 0, or -1 with err set. */
static inline int gptm_init_moe(gpt_mesh *g, const gpt_config *c, int dp, int tp, int ep,
                                int experts, int topk, int zero, int blocks, int shards,
                                const gpt_train_opts *o, char *err, size_t en)
{
    memset(g, 0, sizeof *g);
    g->c = *c;
    g->dp = dp, g->tp = tp, g->zero = zero, g->blocks = blocks, g->shards = shards;
    g->ep = experts ? ep : 1, g->experts = experts, g->topk = topk, g->auxw = 0.01;
    g->nm = tp * g->ep;
    g->amp = o->amp;
    g->seed = o->seed;
    if (gptm_check(c, dp, tp, zero, blocks, shards, o->batch, err, en))
        return -1;
    if (experts && gptm_check_moe(c, tp, ep, experts, topk, shards, o->batch, err, en))
        return -1;
    if (experts && o->amp != NT_DTYPE_COUNT && o->amp != NT_BF16)
        return gptm_fail(err, en, "the MoE MLP's experts run in f32 or bf16: --amp %s is not "
                         "supported with it", nt_dtype_name(o->amp));
    g->ndev = nt_device_count();
    if (g->ndev > GPTM_MAXD)
        return gptm_fail(err, en, "%d devices; at most %d", g->ndev, GPTM_MAXD);
    int cores = g->ndev * nt_process_count();
    if (experts && cores % g->ep)
        return gptm_fail(err, en, "--ep (%d) must divide the cores (%d, NT_SIM_CORES)", g->ep,
                         cores);
    if (experts && cores != dp * g->nm)
        return tp == 1 ? gptm_fail(err, en, "--dp %d x --ep %d needs %d cores; the runtime has "
                                   "%d (NT_SIM_CORES)", dp, g->ep, dp * g->nm, cores)
                       : gptm_fail(err, en, "--dp %d x --tp %d x --ep %d needs %d cores; the "
                                   "runtime has %d (NT_SIM_CORES)", dp, tp, g->ep,
                                   dp * g->nm, cores);
    static const char *const names[] = {"data", "tensor", "expert"};
    g->mesh = nt_mesh_create((int[]){dp, tp, g->ep}, names, experts ? 3 : 2);
    if (!g->mesh)
        return gptm_fail(err, en, "%s", nt_last_error_message());
    /* the MoE group, tp x ep ranks of one data coordinate, tensor-major */
    if (experts &&
        !(g->moe_mesh = nt_mesh_create((int[]){dp, g->nm},
                                       (const char *const[]){"data", "expert"}, 2)))
        return gptm_fail(err, en, "%s", nt_last_error_message());
    if (gptm_layout(g, err, en))
        return -1;
    g->spec = gptm_specs(c, &g->n);
    if (!g->spec)
        return gptm_fail(err, en, "out of memory");
    if (experts) {
        gptm_specs_moe(c, experts, g->spec);
        nt_device_set(0);
        if (!(g->load = nt_zeros(NT_I32, 1, (int64_t[]){experts})))
            return gptm_fail(err, en, "%s", nt_last_error_message());
    }
    uint64_t seed = o->seed * 1000;
    for (int m = 0; m < g->nm; m++) {
        nt_tensor *ps[1024];
        if (g->n > 1024)
            return gptm_fail(err, en, "%d parameters; at most %d", g->n, 1024);
        nt_device_set(g->dd[m][0]);
        nt_scope *sc = nt_scope_begin();
        for (int j = 0; j < g->n; j++) {
            int rank, parts;
            gptm_rank(g, g->spec[j].split, m, &rank, &parts);
            ps[j] = gptm_param(&g->spec[j], rank, parts, seed + (uint64_t)j);
            if (!ps[j]) {
                nt_scope_end(sc);
                return gptm_fail(err, en, "making parameter %d failed", j);
            }
        }
        g->ddp[m] = nt_ddp_create(ps, g->n, shards, g->dd[m], g->ndd[m]);
        nt_scope_end(sc); /* the nt_ddp holds the replicas */
        if (!g->ddp[m] || (zero && nt_ddp_set_zero(g->ddp[m], zero)) || gptm_optim(g, m, o, 0.1)) {
            snprintf(err, en, "%s", nt_last_error_message());
            return -1;
        }
    }
    g->release = zero == 3;
    nt_device_set(0);
    return 0;
}

/* Turns the per-layer release of stage 3 (gpt_mesh.release) on or off
 * (before a step): 0, or -1 with err set when asked for at another stage. */
static inline int gptm_set_release(gpt_mesh *g, bool on, char *err, size_t n)
{
    if (on && g->zero != 3)
        return gptm_fail(err, n, "gptm_set_release: releasing each block's gathered weights "
                         "after its forward needs --zero 3 (got --zero %d): the other stages "
                         "keep the parameters whole", g->zero);
    g->release = on;
    return 0;
}

/* gptm_init_moe without the MoE MLP: the dp x tp mesh. */
static inline int gptm_init(gpt_mesh *g, const gpt_config *c, int dp, int tp, int zero,
                            int blocks, int shards, const gpt_train_opts *o, char *err,
                            size_t en)
{
    return gptm_init_moe(g, c, dp, tp, 1, 0, 0, zero, blocks, shards, o, err, en);
}

/* Member arrays: P[r] = tensor rank r's parameters on the device of
 * data coordinate dc (this process's k-th of that rank). */
static inline int gptm_params(gpt_mesh *g, int k, nt_tensor **P[GPTM_MAXD])
{
    for (int r = 0; r < g->nm; r++)
        if (!(P[r] = nt_ddp_params(g->ddp[r], g->dd[r][k])))
            return -1;
    return 0;
}

/* layer norm of each member's x with parameter j, j + 1 */
static inline void gptm_ln(gpt_mesh *g, nt_tensor **P[], const int *devs, nt_tensor **x,
                           int j, nt_tensor **h)
{
    for (int r = 0; r < g->nm; r++) {
        nt_device_set(devs[r]);
        h[r] = nt_layer_norm(x[r], P[r][j], P[r][j + 1], 1e-5);
    }
}

/* Under --amp, the operands of a tensor-parallel linear (x, w, b: NULL
 * skipped) cast to the autocast dtype, as autocast casts nt_linear's: the
 * nt_tp_* layers take one dtype and are not autocast themselves. */
static inline void gptm_lowp(gpt_mesh *g, const int *devs, nt_tensor **x, nt_tensor **w,
                             nt_tensor **b)
{
    if (g->amp == NT_DTYPE_COUNT)
        return;
    for (int r = 0; r < g->nm; r++) {
        nt_device_set(devs[r]);
        x[r] = nt_cast(x[r], g->amp);
        w[r] = nt_cast(w[r], g->amp);
        if (b)
            b[r] = nt_cast(b[r], g->amp);
    }
}

/* [B, T, hl * 3 * hd] -> q, k or v (which) [B, hl, T, hd]. */
static inline nt_tensor *gptm_head(nt_tensor *qkv, int64_t hl, int64_t hd, int which)
{
    int64_t B = nt_shape(qkv, 0), T = nt_shape(qkv, 1);
    nt_tensor *t = nt_reshape(qkv, 5, (int64_t[]){B, T, hl, 3, hd});
    t = nt_reshape(nt_slice(t, 3, which, which + 1, 1), 4, (int64_t[]){B, T, hl, hd});
    return nt_permute(t, (int[]){0, 2, 1, 3});
}

/* nt_tp_column_linear (row false) or nt_tp_row_linear (row true) on each
 * expert rank's tensor group (c[e]; members e tp ..). */
static inline int gptm_linear(gpt_mesh *g, bool row, nt_comm **c, nt_tensor **x, nt_tensor **w,
                              nt_tensor **b, int blocks, nt_tensor **y)
{
    for (int e = 0, t = g->tp; e < g->ep; e++) {
        nt_tensor **be = b ? b + e * t : NULL;
        int rc = row ? nt_tp_row_linear(c[e], x + e * t, w + e * t, be, blocks, y + e * t)
                     : nt_tp_column_linear(c[e], x + e * t, w + e * t, be, blocks, y + e * t);
        if (rc)
            return -1;
    }
    return 0;
}

/* The MoE MLP of block l over the MoE group (the tp x ep members, in q
 * order: rank q is member gptm_moe_m(q)): every member holds the shard's
 * whole h [b, T, D] (its tensor group computed it as the dense model
 * does), flattened to [N, D]; rank q takes rows q N/nm .. (nt_tp_split:
 * its gradient is all-gathered back), nt_moe_mlp over the group (top-k
 * softmax router, GPTM_MOE_BLOCKS blocks; rank q owns experts q E/nm ..),
 * and the ranks' outputs are put together on every member by zero-padding
 * each to [N, D] and nt_tp_reduce (a sum of one value and zeros: exact;
 * backward the identity, so each rank's rows get the gradient of its own
 * rows).  x += y + b2; aux[m] += the layer's load-balancing loss; the
 * counts (tokens per expert) go into g->load while g->tally.  Under --amp
 * bf16 the experts' weights are cast to bf16 (the rows too, when
 * dispatched) and the router, the combine and y stay f32.  The bits do not
 * depend on tp or ep. */
static inline int gptm_moe(gpt_mesh *g, nt_tensor **P[], const int *devs, int l,
                           nt_tensor **h, nt_tensor **x, nt_tensor **aux)
{
    int nm = g->nm;
    int64_t Bt = nt_shape(x[0], 0), T = nt_shape(x[0], 1), D = g->c.width, N = Bt * T,
            n = N / nm, E = g->experts, H = 4 * D;
    nt_comm *ce = nt_mesh_comm(g->moe_mesh, "expert", devs[0]);
    /* indexed by q */
    nt_tensor *xf[GPTM_MAXD], *xs[GPTM_MAXD], *wg[GPTM_MAXD], *w1[GPTM_MAXD], *w2[GPTM_MAXD],
              *y[GPTM_MAXD], *a[GPTM_MAXD], *cnt[GPTM_MAXD], *yp[GPTM_MAXD], *ys[GPTM_MAXD];
    for (int q = 0; q < nm; q++) {
        int m = gptm_moe_m(g, q);
        nt_device_set(devs[m]);
        xf[q] = nt_reshape(h[m], 2, (int64_t[]){N, D});
        wg[q] = P[m][GPTM_M1(g, l, GPTM_B1)];
        w1[q] = nt_reshape(P[m][GPTM_M2(g, l, GPTM_W1)], 3, (int64_t[]){E / nm, D, H});
        w2[q] = nt_reshape(P[m][GPTM_M2(g, l, GPTM_W2)], 3, (int64_t[]){E / nm, H, D});
        if (g->amp != NT_DTYPE_COUNT) { /* --amp bf16: the experts in it, the router f32 */
            w1[q] = nt_cast(w1[q], g->amp);
            w2[q] = nt_cast(w2[q], g->amp);
        }
    }
    if (!ce || nt_tp_split(ce, xf, xs, 0) ||
        nt_moe_mlp(ce, xs, wg, w1, w2, &(nt_moe_opts){g->topk, NT_MOE_SOFTMAX, GPTM_MOE_BLOCKS, 0},
                   y, a, cnt))
        return -1;
    for (int q = 0; q < nm; q++) {
        int m = gptm_moe_m(g, q);
        nt_device_set(devs[m]);
        nt_tensor *parts[3];
        int np = 0;
        if (q > 0)
            parts[np++] = nt_zeros(NT_F32, 2, (int64_t[]){q * n, D});
        parts[np++] = nt_add_scalar(y[q], 0.0); /* -0 to +0, as a sum with zeros gives */
        if (q < nm - 1)
            parts[np++] = nt_zeros(NT_F32, 2, (int64_t[]){(nm - 1 - q) * n, D});
        yp[q] = np > 1 ? nt_cat(parts, np, 0) : parts[0];
        aux[m] = aux[m] ? nt_add(aux[m], a[q]) : a[q];
    }
    if (nt_tp_reduce(ce, yp, ys))
        return -1;
    for (int q = 0; q < nm; q++) {
        int m = gptm_moe_m(g, q);
        nt_device_set(devs[m]);
        nt_tensor *yy = nt_reshape(ys[q], 3, (int64_t[]){Bt, T, D});
        x[m] = nt_add(x[m], nt_add(yy, P[m][GPTM_M1(g, l, GPTM_B2)]));
        if (!x[m] || !aux[m])
            return -1;
    }
    if (g->tally && g->load) {
        nt_no_grad_begin();
        nt_device_set(nt_tensor_device(g->load));
        int rc = nt_add_inplace(g->load, nt_to_device(cnt[0], nt_tensor_device(g->load)));
        nt_no_grad_end();
        if (rc)
            return -1;
    }
    return 0;
}

/* ---------------- dropout and sequence parallelism ---------------- */

#define GPTM_MAXLB 64 /* token blocks of a member */

static inline uint64_t gptm_mix(uint64_t x) /* splitmix64's finalizer */
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline bool gptm_dropping(const gpt_mesh *g)
{
    return g->dropout > 0 && g->training;
}

/* Dropout of global token block kg (x [b, T / blocks, D]) at `site` (0 the
 * embedding, then two per block, as gpt_dropout's): nt_dropout's mask of
 * (seed, element index in the block), the seed a hash of (the run's seed,
 * the step, the shard, site, kg) -- the same whatever holds the block. */
static inline nt_tensor *gptm_drop1(const gpt_mesh *g, nt_tensor *x, int site, int kg)
{
    uint64_t h = gptm_mix(g->seed);
    h = gptm_mix(h ^ g->step);
    h = gptm_mix(h ^ (uint64_t)g->shard);
    h = gptm_mix(h ^ ((uint64_t)site << 32 | (uint64_t)kg));
    return nt_dropout(x, g->dropout, h);
}

/* Without sp: dropout of the members' whole x [b, T, D], block by block. */
static inline void gptm_drop_full(const gpt_mesh *g, const int *devs, nt_tensor **x, int site)
{
    if (!gptm_dropping(g))
        return;
    int nb = g->blocks;
    for (int r = 0; r < g->nm; r++) {
        nt_device_set(devs[r]);
        int64_t tb = nt_shape(x[r], 1) / nb;
        nt_tensor *parts[GPTM_MAXLB];
        for (int k = 0; k < nb; k++)
            parts[k] = gptm_drop1(g, nt_slice(x[r], 1, k * tb, (k + 1) * tb, 1), site, k);
        x[r] = nb > 1 ? nt_cat(parts, nb, 1) : parts[0];
    }
}

/* Row k of a nt_tp_copy_blocks result [lb, ...]: the k-th block's copy. */
static inline nt_tensor *gptm_blk(nt_tensor *pc, int k)
{
    int nd = nt_ndim(pc);
    int64_t shape[2] = {nt_shape(pc, 1), nd > 2 ? nt_shape(pc, 2) : 0};
    return nt_reshape(nt_slice(pc, 0, k, k + 1, 1), nd - 1, shape);
}

/* The members' replicated parameter j as blocks / tp copies each. */
static inline int gptm_sp_copy(const gpt_mesh *g, nt_comm *c, nt_tensor **P[], int j,
                               nt_tensor **pc)
{
    nt_tensor *in[GPTM_MAXD];
    for (int r = 0; r < g->tp; r++)
        in[r] = P[r][j];
    return nt_tp_copy_blocks(c, in, g->blocks / g->tp, pc);
}

/* sp: each member's token blocks of x [b, T / tp, D] layer-normed, each
 * block with its copy of parameters j, j + 1. */
static inline int gptm_sp_ln(gpt_mesh *g, nt_comm *c, nt_tensor **P[], const int *devs,
                             nt_tensor **x, int j, nt_tensor **h)
{
    int lb = g->blocks / g->tp;
    nt_tensor *wc[GPTM_MAXD], *bc[GPTM_MAXD];
    if (gptm_sp_copy(g, c, P, j, wc) || gptm_sp_copy(g, c, P, j + 1, bc))
        return -1;
    for (int r = 0; r < g->tp; r++) {
        nt_device_set(devs[r]);
        int64_t tb = nt_shape(x[r], 1) / lb;
        nt_tensor *parts[GPTM_MAXLB];
        for (int k = 0; k < lb; k++)
            parts[k] = nt_layer_norm(nt_slice(x[r], 1, k * tb, (k + 1) * tb, 1),
                                     gptm_blk(wc[r], k), gptm_blk(bc[r], k), 1e-5);
        h[r] = lb > 1 ? nt_cat(parts, lb, 1) : parts[0];
        if (!h[r])
            return -1;
    }
    return 0;
}

/* sp: x[r] += dropout(y[r] + bias j), token block by token block. */
static inline int gptm_sp_resid(gpt_mesh *g, nt_comm *c, nt_tensor **P[], const int *devs,
                                int j, nt_tensor **y, nt_tensor **x, int site)
{
    int lb = g->blocks / g->tp;
    nt_tensor *bc[GPTM_MAXD];
    if (gptm_sp_copy(g, c, P, j, bc))
        return -1;
    for (int r = 0; r < g->tp; r++) {
        nt_device_set(devs[r]);
        int64_t tb = nt_shape(y[r], 1) / lb;
        nt_tensor *parts[GPTM_MAXLB];
        for (int k = 0; k < lb; k++) {
            nt_tensor *b = gptm_blk(bc[r], k);
            if (g->amp != NT_DTYPE_COUNT)
                b = nt_cast(b, g->amp);
            nt_tensor *v = nt_add(nt_slice(y[r], 1, k * tb, (k + 1) * tb, 1), b);
            parts[k] = gptm_dropping(g) ? gptm_drop1(g, v, site, r * lb + k) : v;
        }
        x[r] = nt_add(x[r], lb > 1 ? nt_cat(parts, lb, 1) : parts[0]);
        if (!x[r])
            return -1;
    }
    return 0;
}

/* sp: block l on the members' slices x [b, T / tp, D]. */
static inline int gptm_block_sp(gpt_mesh *g, nt_comm *c, nt_tensor **P[], const int *devs,
                                int l, nt_tensor **x)
{
    int tp = g->tp, B = g->blocks;
    int64_t D = g->c.width, H = g->c.n_head, hl = H / tp, hd = D / H;
    nt_tensor *h[GPTM_MAXD] = {0}, *q[GPTM_MAXD] = {0}, *w[GPTM_MAXD] = {0},
              *b[GPTM_MAXD] = {0}, *y[GPTM_MAXD] = {0};
    if (gptm_sp_ln(g, c, P, devs, x, GPTM_M1(g, l, GPTM_LN1W), h))
        return -1;
    for (int r = 0; r < tp; r++)
        w[r] = P[r][GPTM_M2(g, l, GPTM_WQKV)], b[r] = P[r][GPTM_M1(g, l, GPTM_BQKV)];
    gptm_lowp(g, devs, h, w, b);
    if (nt_tp_column_linear_sp(c, h, w, b, B, 1, q))
        return -1;
    for (int r = 0; r < tp; r++) {
        nt_device_set(devs[r]);
        int64_t Bt = nt_shape(q[r], 0), T = nt_shape(q[r], 1);
        nt_tensor *a = nt_scaled_dot_product_attention(gptm_head(q[r], hl, hd, 0),
                                                       gptm_head(q[r], hl, hd, 1),
                                                       gptm_head(q[r], hl, hd, 2), NULL, true,
                                                       0.0);
        h[r] = nt_reshape(nt_permute(a, (int[]){0, 2, 1, 3}), 3, (int64_t[]){Bt, T, hl * hd});
        w[r] = P[r][GPTM_M2(g, l, GPTM_WO)];
    }
    gptm_lowp(g, devs, h, w, NULL);
    if (nt_tp_row_linear_sp(c, h, w, NULL, B, 1, y) ||
        gptm_sp_resid(g, c, P, devs, GPTM_M1(g, l, GPTM_BO), y, x, 1 + 2 * l) ||
        gptm_sp_ln(g, c, P, devs, x, GPTM_M1(g, l, GPTM_LN2W), h))
        return -1;
    for (int r = 0; r < tp; r++)
        w[r] = P[r][GPTM_M2(g, l, GPTM_W1)], b[r] = P[r][GPTM_M1(g, l, GPTM_B1)];
    gptm_lowp(g, devs, h, w, b);
    if (nt_tp_column_linear_sp(c, h, w, b, B, 1, q))
        return -1;
    for (int r = 0; r < tp; r++) {
        nt_device_set(devs[r]);
        h[r] = nt_gelu(q[r]);
        w[r] = P[r][GPTM_M2(g, l, GPTM_W2)];
    }
    gptm_lowp(g, devs, h, w, NULL);
    if (nt_tp_row_linear_sp(c, h, w, NULL, B, 1, y))
        return -1;
    return gptm_sp_resid(g, c, P, devs, GPTM_M1(g, l, GPTM_B2), y, x, 2 + 2 * l);
}

/* sp: the members' slices of the embedding e [b, T, D] (replicated) plus
 * the positions, token block by token block (dropout site 0). */
static inline int gptm_sp_embed(gpt_mesh *g, nt_comm *c, nt_tensor **P[], const int *devs,
                                nt_tensor **e, nt_tensor **x)
{
    int lb = g->blocks / g->tp;
    nt_tensor *xs[GPTM_MAXD], *pc[GPTM_MAXD];
    if (nt_tp_split(c, e, xs, 1) || gptm_sp_copy(g, c, P, GPTM_WPE, pc))
        return -1;
    for (int r = 0; r < g->tp; r++) {
        nt_device_set(devs[r]);
        int64_t tb = nt_shape(xs[r], 1) / lb;
        nt_tensor *parts[GPTM_MAXLB];
        for (int k = 0; k < lb; k++) {
            int kg = r * lb + k;
            nt_tensor *pos = nt_slice(gptm_blk(pc[r], k), 0, kg * tb, (kg + 1) * tb, 1);
            nt_tensor *v = nt_add(nt_slice(xs[r], 1, k * tb, (k + 1) * tb, 1), pos);
            parts[k] = gptm_dropping(g) ? gptm_drop1(g, v, 0, kg) : v;
        }
        x[r] = lb > 1 ? nt_cat(parts, lb, 1) : parts[0];
        if (!x[r])
            return -1;
    }
    return 0;
}

/* Block l on the members' x [B, T, D]. */
static inline int gptm_block(gpt_mesh *g, nt_comm **c, nt_tensor **P[], const int *devs, int l,
                             nt_tensor **x, nt_tensor **aux)
{
    int tp = g->nm, B = g->blocks;
    int64_t D = g->c.width, H = g->c.n_head, hl = H / g->tp, hd = D / H;
    nt_tensor *h[GPTM_MAXD] = {0}, *q[GPTM_MAXD] = {0}, *w[GPTM_MAXD] = {0},
              *b[GPTM_MAXD] = {0}, *y[GPTM_MAXD] = {0};
    gptm_ln(g, P, devs, x, GPTM_M1(g, l, GPTM_LN1W), h);
    for (int r = 0; r < tp; r++)
        w[r] = P[r][GPTM_M2(g, l, GPTM_WQKV)], b[r] = P[r][GPTM_M1(g, l, GPTM_BQKV)];
    gptm_lowp(g, devs, h, w, b);
    if (gptm_linear(g, false, c, h, w, b, B, q))
        return -1;
    for (int r = 0; r < tp; r++) {
        nt_device_set(devs[r]);
        int64_t Bt = nt_shape(x[r], 0), T = nt_shape(x[r], 1);
        nt_tensor *a = nt_scaled_dot_product_attention(gptm_head(q[r], hl, hd, 0),
                                                       gptm_head(q[r], hl, hd, 1),
                                                       gptm_head(q[r], hl, hd, 2), NULL, true,
                                                       0.0);
        h[r] = nt_reshape(nt_permute(a, (int[]){0, 2, 1, 3}), 3, (int64_t[]){Bt, T, hl * hd});
        w[r] = P[r][GPTM_M2(g, l, GPTM_WO)], b[r] = P[r][GPTM_M1(g, l, GPTM_BO)];
    }
    gptm_lowp(g, devs, h, w, b);
    if (gptm_linear(g, true, c, h, w, b, B, y))
        return -1;
    gptm_drop_full(g, devs, y, 1 + 2 * l);
    for (int r = 0; r < tp; r++) {
        nt_device_set(devs[r]);
        x[r] = nt_add(x[r], y[r]);
    }
    gptm_ln(g, P, devs, x, GPTM_M1(g, l, GPTM_LN2W), h);
    if (g->experts)
        return gptm_moe(g, P, devs, l, h, x, aux);
    for (int r = 0; r < tp; r++)
        w[r] = P[r][GPTM_M2(g, l, GPTM_W1)], b[r] = P[r][GPTM_M1(g, l, GPTM_B1)];
    gptm_lowp(g, devs, h, w, b);
    if (gptm_linear(g, false, c, h, w, b, B, q))
        return -1;
    for (int r = 0; r < tp; r++) {
        nt_device_set(devs[r]);
        h[r] = nt_gelu(q[r]);
        w[r] = P[r][GPTM_M2(g, l, GPTM_W2)], b[r] = P[r][GPTM_M1(g, l, GPTM_B2)];
    }
    gptm_lowp(g, devs, h, w, b);
    if (gptm_linear(g, true, c, h, w, b, B, y))
        return -1;
    gptm_drop_full(g, devs, y, 2 + 2 * l);
    for (int r = 0; r < tp; r++) {
        nt_device_set(devs[r]);
        x[r] = nt_add(x[r], y[r]);
        if (!x[r])
            return -1;
    }
    return 0;
}

/* The members' embedding of idx [b, T] (one per member, replicated) plus
 * the positions (dropout site 0): x [b, T, D], or under sp each member's
 * slice [b, T / tp, D]. */
static inline int gptm_embed(gpt_mesh *g, nt_comm **c, nt_tensor **P[], const int *devs,
                             nt_tensor *const *idx, nt_tensor **x)
{
    int t = g->tp;
    int64_t T = nt_shape(idx[0], 1);
    nt_tensor *w[GPTM_MAXD], *e[GPTM_MAXD];
    for (int r = 0; r < g->nm; r++)
        w[r] = P[r][GPTM_WTE];
    for (int k = 0; k < g->ep; k++)
        if (nt_tp_embedding(c[k], w + k * t, idx + k * t, e + k * t))
            return -1;
    if (g->sp)
        return gptm_sp_embed(g, c[0], P, devs, e, x);
    for (int r = 0; r < g->nm; r++) {
        nt_device_set(devs[r]);
        nt_tensor *pos = nt_arange(NT_I32, 0, (double)T, 1);
        x[r] = nt_add(e[r], nt_embedding(P[r][GPTM_WPE], pos));
    }
    gptm_drop_full(g, devs, x, 0);
    return 0;
}

/* Block l on the members' x (sp: their slices). */
static inline int gptm_fwd_block(gpt_mesh *g, nt_comm **c, nt_tensor **P[], const int *devs,
                                 int l, nt_tensor **x, nt_tensor **aux)
{
    return g->sp ? gptm_block_sp(g, c[0], P, devs, l, x) : gptm_block(g, c, P, devs, l, x, aux);
}

/* The final layer norm, the tied head and the members' mean cross-entropy
 * against tgt [b * T] of the members' x after the blocks (sp: their
 * slices; idx gives b and T), joined into one loss on devs[0]. */
static inline nt_tensor *gptm_out(gpt_mesh *g, nt_comm **c, nt_tensor **P[], const int *devs,
                                   nt_tensor *const *idx, nt_tensor *const *tgt, nt_tensor **x,
                                   nt_tensor **aux)
{
    int tp = g->nm, t = g->tp;
    int64_t Bt = nt_shape(idx[0], 0), T = nt_shape(idx[0], 1), D = g->c.width;
    nt_tensor *w[GPTM_MAXD], *lg[GPTM_MAXD], *loss[GPTM_MAXD];
    for (int r = 0; r < tp; r++)
        w[r] = P[r][GPTM_WTE];
    if (g->sp) {
        if (gptm_sp_ln(g, c[0], P, devs, x, GPTM_LNF(g), x))
            return NULL;
        gptm_lowp(g, devs, x, w, NULL);
        if (nt_tp_column_linear_sp(c[0], x, w, NULL, g->blocks, 1, lg))
            return NULL;
        for (int r = 0; r < tp; r++) {
            nt_device_set(devs[r]);
            lg[r] = nt_reshape(lg[r], 2, (int64_t[]){Bt * T, nt_shape(lg[r], 2)});
        }
    } else {
        gptm_ln(g, P, devs, x, GPTM_LNF(g), x);
        for (int r = 0; r < tp; r++) {
            nt_device_set(devs[r]);
            x[r] = nt_reshape(x[r], 2, (int64_t[]){Bt * T, D});
        }
        gptm_lowp(g, devs, x, w, NULL);
        if (gptm_linear(g, false, c, x, w, NULL, g->blocks, lg))
            return NULL;
    }
    for (int e = 0; e < g->ep; e++)
        if (nt_tp_cross_entropy(c[e], lg + e * t, tgt + e * t, g->blocks, loss + e * t))
            return NULL;
    if (!g->experts) {
        nt_device_set(devs[0]);
        return nt_tp_join(c[0], loss);
    }
    /* each member's loss plus the load-balancing losses, joined over the
     * MoE group in q order (every member computed the same loss; q 0 is
     * member 0) */
    nt_tensor *lq[GPTM_MAXD];
    for (int q = 0; q < g->nm; q++) {
        int m = gptm_moe_m(g, q);
        nt_device_set(devs[m]);
        lq[q] = nt_add(loss[m], nt_mul_scalar(aux[m], g->auxw));
    }
    nt_device_set(devs[0]);
    return nt_tp_join(nt_mesh_comm(g->moe_mesh, "expert", devs[0]), lq);
}

/* The members' mean cross-entropy of idx [b, T] against tgt [b * T] (one
 * per member, replicated), joined into one loss on devs[0]: the
 * embedding, the blocks and the head of one shard. */
static inline nt_tensor *gptm_loss(gpt_mesh *g, nt_comm **c, nt_tensor **P[], const int *devs,
                                   nt_tensor *const *idx, nt_tensor *const *tgt)
{
    nt_tensor *x[GPTM_MAXD], *aux[GPTM_MAXD] = {0};
    if (gptm_embed(g, c, P, devs, idx, x))
        return NULL;
    for (int l = 0; l < g->c.n_layer; l++)
        if (gptm_fwd_block(g, c, P, devs, l, x, aux))
            return NULL;
    return gptm_out(g, c, P, devs, idx, tgt, x, aux);
}

/* ---------------- gradient clipping, the same at every split ----------------
 *
 * torch's clip_grad_norm_(max_norm) scales every gradient by min(1,
 * max_norm / (total + 1e-6)), total the L2 norm of all of them.  Its bits
 * depend on the order of the sums, which a split would change, so here the
 * order is defined by the model, not by the layout: a split parameter's sum
 * of squares is `blocks` blocks along its split dim (each an nt_sum of the
 * block's squares), added pairwise in the rank tree's order (each member
 * its blocks, then nt_all_reduce over the tensor group, as dist/tp.c's
 * sums); a replicated one's is one nt_sum on every member; total^2 is the
 * nt_sum of the [n] vector of them.  The gradients are whole here: the
 * replicas' (stages 0, 1), or the shards all-gathered over the data group
 * (stages 2, 3, as nt_ddp_clip_grad_norm does).  The scale multiplies, an
 * elementwise op, what the optimizers read (the replicas' .grad at stage 0,
 * the shards' at 1-3), so its bits do not depend on the layout either. */

/* Adjacent pairs level by level, an odd last one carried (dist/tree.c). */
static inline nt_tensor *gptm_tree(nt_tensor **v, int n)
{
    for (int len = n; len > 1; len = (len + 1) / 2)
        for (int i = 0; 2 * i < len; i++)
            v[i] = 2 * i + 1 < len ? nt_add(v[2 * i], v[2 * i + 1]) : v[2 * i];
    return v[0];
}

/* Member r's part of parameter j: its shape. */
static inline void gptm_part_shape(const gpt_mesh *g, int j, int64_t *shape)
{
    const gptm_spec *p = &g->spec[j];
    shape[0] = p->r / (p->split == GPTM_ROWS ? g->tp : p->split == GPTM_EXP ? g->nm : 1);
    shape[1] = p->c / (p->split == GPTM_COLS ? g->tp : 1);
}

/* The whole mean gradients of tensor rank r's parameters on its k-th local
 * device into G[j * nk + k] (stages 2, 3: all-gathered over the data group);
 * in the caller's scope. */
static inline int gptm_full_grads(gpt_mesh *g, int r, nt_tensor **G)
{
    int n = g->n, nk = g->ndd[r];
    for (int j = 0; j < n; j++) {
        nt_tensor *in[GPTM_MAXD], *out[GPTM_MAXD];
        for (int k = 0; k < nk; k++) {
            int dev = g->dd[r][k];
            nt_device_set(dev);
            nt_tensor *t = g->zero >= 2 ? nt_ddp_zero_shards(g->ddp[r], dev)[j]
                                        : nt_ddp_params(g->ddp[r], dev)[j];
            if (!(in[k] = nt_grad(t)))
                return -1;
        }
        if (g->zero < 2) {
            memcpy(G + (size_t)j * nk, in, sizeof *in * (size_t)nk);
            continue;
        }
        if (nt_all_gather(nt_mesh_comm(g->mesh, "data", g->dd[r][0]), in, out))
            return -1;
        int64_t shape[2];
        gptm_part_shape(g, j, shape);
        for (int k = 0; k < nk; k++) {
            nt_device_set(g->dd[r][k]);
            int64_t numel = shape[0] * (g->spec[j].nd == 2 ? shape[1] : 1);
            G[(size_t)j * nk + k] = nt_reshape(nt_slice(out[k], 0, 0, numel, 1),
                                               g->spec[j].nd, shape);
        }
    }
    return 0;
}

/* v[b] = the sum of squares (0-d) of x's b-th of nb equal blocks along dim. */
static inline void gptm_block_sumsq(nt_tensor *x, int dim, int nb, nt_tensor **v)
{
    int64_t len = nt_shape(x, dim) / nb;
    for (int b = 0; b < nb; b++) {
        nt_tensor *blk = nt_contiguous(nt_slice(x, dim, b * len, (b + 1) * len, 1));
        v[b] = nt_sum(nt_mul(blk, blk), NT_DIM_ALL, false);
    }
}

/* Sum of squares of member r's part x of parameter j: its blocks' tree (a
 * tensor-split parameter: blocks / tp blocks along its split dim) or the
 * whole (replicated).  An expert-split one: gptm_expert_sumsq. */
static inline nt_tensor *gptm_sumsq(const gpt_mesh *g, int j, nt_tensor *x)
{
    const gptm_spec *p = &g->spec[j];
    if (p->split == GPTM_REP)
        return nt_sum(nt_mul(x, x), NT_DIM_ALL, false);
    int lb = g->blocks / g->tp;
    nt_tensor *v[GPTM_MAXD * 8];
    gptm_block_sumsq(x, p->split == GPTM_COLS ? 1 : 0, lb, v);
    return gptm_tree(v, lb);
}

/* A member's part x of an expert-split parameter (its E / nm experts'
 * rows): each expert's sum of squares, [E / nm]. */
static inline nt_tensor *gptm_expert_sumsq(const gpt_mesh *g, nt_tensor *x)
{
    int le = g->experts / g->nm;
    nt_tensor *v[GPTM_MAXE];
    gptm_block_sumsq(x, 0, le, v);
    for (int b = 0; b < le; b++)
        v[b] = nt_reshape(v[b], 1, (int64_t[]){1});
    return le > 1 ? nt_cat(v, le, 0) : v[0];
}

/* Clips the reduced gradients of every parameter to total norm max_norm
 * (after nt_ddp_reduce, before nt_ddp_step).  0 or -1 with the error.
 * Three kinds of sum: a replicated parameter's on every member; a
 * tensor-split one's blocks added in the rank tree over its tensor group
 * (nt_all_reduce, one per expert coordinate); an expert-split one's
 * per-expert sums all-gathered over the MoE group (q order: expert order)
 * and added in the tree over the E experts, so that neither tp nor ep
 * changes them (an E / nm that is not a power of two too). */
static inline int gptm_clip(gpt_mesh *g, double max_norm)
{
    int n = g->n, nm = g->nm, tp = g->tp, nk = g->ndd[0], E = g->experts, rc = 0;
    int le = E ? E / nm : 0;
    nt_scope *sc = nt_scope_begin();
    nt_no_grad_begin();
    nt_tensor **G = calloc((size_t)nm * n * nk, sizeof *G);
    nt_tensor **sq = calloc((size_t)n, sizeof *sq);
    rc = !G || !sq;
    for (int r = 0; r < nm && !rc; r++)
        rc = gptm_full_grads(g, r, G + (size_t)r * n * nk);
    int nx = 0; /* expert-split parameters */
    for (int j = 0; j < n; j++)
        nx += g->spec[j].split == GPTM_EXP;
    for (int k = 0; k < nk && !rc; k++) { /* the group of local data index k */
        nt_tensor *part[GPTM_MAXD], *sum[GPTM_MAXD], *xq[GPTM_MAXD], *xg[GPTM_MAXD],
                  *coef[GPTM_MAXD];
        for (int r = 0; r < nm; r++) {
            nt_device_set(g->dd[r][k]);
            nt_tensor *v[1024], *xv[1024];
            int ns = 0, ne = 0;
            for (int j = 0; j < n; j++) {
                nt_tensor *gr = G[((size_t)r * n + j) * nk + k];
                int split = g->spec[j].split;
                if (split == GPTM_ROWS || split == GPTM_COLS)
                    v[ns++] = nt_reshape(gptm_sumsq(g, j, gr), 1, (int64_t[]){1});
                else if (split == GPTM_EXP)
                    xv[ne++] = gptm_expert_sumsq(g, gr);
            }
            part[r] = nt_cat(v, ns, 0);
            if (nx)
                xq[gptm_moe_q(g, r)] = ne > 1 ? nt_cat(xv, ne, 0) : xv[0];
        }
        for (int e = 0; e < g->ep && !rc; e++)
            rc = nt_all_reduce(nt_mesh_comm(g->mesh, "tensor", g->dd[e * tp][k]), part + e * tp,
                               sum + e * tp, NT_REDUCE_SUM);
        /* xg[q]: [nm, nx, le], rank q's per-expert sums of each parameter */
        if (!rc && nx)
            rc = nt_all_gather(nt_mesh_comm(g->moe_mesh, "expert", g->dd[0][k]), xq, xg);
        for (int r = 0; r < nm && !rc; r++) {
            nt_device_set(g->dd[r][k]);
            nt_tensor *xs = nx ? xg[gptm_moe_q(g, r)] : NULL;
            for (int j = 0, s = 0, i = 0; j < n; j++) {
                int split = g->spec[j].split;
                if (split == GPTM_ROWS || split == GPTM_COLS) {
                    sq[j] = nt_slice(sum[r], 0, s, s + 1, 1);
                    s++;
                } else if (split == GPTM_EXP) {
                    nt_tensor *v[GPTM_MAXE];
                    for (int x = 0; x < E; x++) { /* expert x: rank x / le's (x % le)-th */
                        int64_t at = (int64_t)(x / le) * nx * le + (int64_t)i * le + x % le;
                        v[x] = nt_slice(xs, 0, at, at + 1, 1);
                    }
                    sq[j] = gptm_tree(v, E);
                    i++;
                } else {
                    sq[j] = nt_reshape(gptm_sumsq(g, j, G[((size_t)r * n + j) * nk + k]), 1,
                                       (int64_t[]){1});
                }
            }
            nt_tensor *total = nt_sqrt(nt_sum(nt_cat(sq, n, 0), NT_DIM_ALL, false));
            nt_tensor *mx = nt_full(NT_F32, 0, NULL, max_norm);
            coef[r] = nt_clamp(nt_div(mx, nt_add_scalar(total, 1e-6)), 0.0, 1.0);
            if (g->clip_sq && r == 0 && k == 0) /* the tests' view of the sums */
                rc = nt_to_host(nt_cat(sq, n, 0), g->clip_sq, sizeof *g->clip_sq * (size_t)n);
            for (int j = 0; j < n && !rc; j++) {
                int dev = g->dd[r][k];
                nt_tensor *t = g->zero ? nt_ddp_zero_shards(g->ddp[r], dev)[j]
                                       : nt_ddp_params(g->ddp[r], dev)[j];
                nt_tensor *gr = nt_grad(t);
                rc = !gr || !coef[r] || nt_mul_inplace(gr, coef[r]);
            }
        }
    }
    free(G);
    free(sq);
    nt_no_grad_end();
    nt_scope_end(sc);
    nt_device_set(0);
    return rc ? -1 : 0;
}

/* The members' devices of global shard s (this process's), or -1. */
static inline int gptm_shard_devs(gpt_mesh *g, int s, int *devs)
{
    for (int r = 0; r < g->nm; r++)
        if ((devs[r] = nt_ddp_shard_device(g->ddp[r], s)) < 0)
            return -1;
    return 0;
}

/* The host's part of a step: the step count (dropout's key) and every
 * optimizer's learning rate schedule.  0 or -1 with the runtime's error. */
static inline int gptm_step_prepare(gpt_mesh *g)
{
    g->step++;
    for (int r = 0; r < g->nm; r++)
        for (int k = 0; k < g->ndd[r]; k++)
            if (nt_scheduler_step(g->sched[r][k]))
                return -1;
    return 0;
}

/* Releases gptm_inputs' tensors (NULL entries skipped) and clears them. */
static inline void gptm_inputs_free(const gpt_mesh *g, nt_tensor **idx, nt_tensor **tgt)
{
    for (int i = 0; i < g->shards * g->nm; i++) {
        nt_release(idx[i]);
        nt_release(tgt[i]);
        idx[i] = tgt[i] = NULL;
    }
}

/* Every local shard's batch (xb [B, T], yb [B * T], host ints) on its
 * members' devices: idx[s * nm + r], tgt[s * nm + r] (NULL for another
 * process's shard; the caller releases them, gptm_inputs_free).  0 or -1
 * with the runtime's error (what was made released). */
static inline int gptm_inputs(gpt_mesh *g, const gpt_train_opts *o, const int32_t *xb,
                              const int32_t *yb, nt_tensor **idx, nt_tensor **tgt)
{
    int B = o->batch, T = g->c.context, tp = g->nm;
    for (int i = 0; i < g->shards * tp; i++)
        idx[i] = tgt[i] = NULL;
    for (int s = 0; s < g->shards; s++) {
        int devs[GPTM_MAXD];
        if (gptm_shard_devs(g, s, devs))
            continue; /* another process's */
        for (int r = 0; r < tp; r++) {
            nt_device_set(devs[r]);
            nt_tensor **x = &idx[s * tp + r], **y = &tgt[s * tp + r];
            *x = nt_ddp_shard_from_host(g->ddp[r], s, xb, NT_I32, 2, (int64_t[]){B, T});
            *y = nt_ddp_shard_from_host(g->ddp[r], s, yb, NT_I32, 1,
                                        (int64_t[]){(int64_t)B * T});
            if (!*x || !*y) {
                gptm_inputs_free(g, idx, tgt);
                nt_device_set(0);
                return -1;
            }
        }
    }
    nt_device_set(0);
    return 0;
}

/* The end of a step's device part: each tensor rank's nt_ddp_reduce, the
 * clipping, the optimizers' step.  0 or -1 with the runtime's error. */
static inline int gptm_step_end(gpt_mesh *g, const gpt_train_opts *o)
{
    for (int r = 0; r < g->nm; r++)
        if (nt_ddp_reduce(g->ddp[r]))
            return -1;
    if (o->clip > 0 && gptm_clip(g, o->clip))
        return -1;
    for (int r = 0; r < g->nm; r++)
        if (nt_ddp_step(g->ddp[r], g->opt[r], g->ndd[r]))
            return -1;
    nt_device_set(0);
    return 0;
}

/* The tensor communicators of one group's expert ranks: c[e] the one of
 * member e tp (devs: the group's members' devices).  0 or -1 with the
 * runtime's error. */
static inline int gptm_comms(gpt_mesh *g, const int *devs, nt_comm **c)
{
    for (int e = 0; e < g->ep; e++)
        if (!(c[e] = nt_mesh_comm(g->mesh, "tensor", devs[e * g->tp])))
            return -1;
    return 0;
}

/* The forward and backward of one round (g->release): the group of local
 * index k (member r on its k-th device, g->dd[r][k]) computes shard sh[k],
 * block by block over the groups.  The embeddings, the position table, the
 * layer norms, the biases and the final layer norm are gathered for the
 * whole step (wte also feeds the tied head); block l's four weights
 * [GPTM_M2(g, l, 0), GPTM_M2(g, l + 1, 0)) are gathered in every member's
 * nt_ddp (refilled after an earlier round) one block ahead of its forward
 * and released after every group's forward of it by nt_ddp_layer_done, one
 * mark per member, whose marks refill them in the round's backward
 * (nt_ddp_backward_group_shards: one pass over every group's joined loss).
 * *loss[k] gets shard sh[k]'s loss (a reference each, on member 0's
 * device).  0 or -1 with the runtime's error. */
static inline int gptm_round(gpt_mesh *g, const gpt_train_opts *o, nt_tensor **idx_all,
                             nt_tensor **tgt_all, const int *sh, nt_tensor **loss)
{
    int nk = g->ndd[0], nm = g->nm, L = g->c.n_layer, wlo = GPTM_M2(g, 0, 0),
        whi = GPTM_M2(g, L, 0);
    for (int r = 0; r < nm; r++)
        if (nt_ddp_gather(g->ddp[r], 0, wlo) || nt_ddp_gather(g->ddp[r], whi, g->n) ||
            (L > 0 && nt_ddp_gather(g->ddp[r], wlo, GPTM_M2(g, 1, 0))))
            return -1;
    /* group k's members at [k nm, (k + 1) nm) (its expert ranks' tensor
     * communicators at [k ep, (k + 1) ep)); nk x nm <= this process's devices */
    nt_comm *c[GPTM_MAXD];
    nt_tensor **P[GPTM_MAXD], *x[GPTM_MAXD], *aux[GPTM_MAXD] = {0}, *in[GPTM_MAXD];
    int devs[GPTM_MAXD];
    for (int k = 0; k < nk; k++) {
        loss[k] = NULL;
        if (gptm_shard_devs(g, sh[k], devs + k * nm))
            return -1;
        for (int r = 0; r < nm; r++)
            if (!(P[k * nm + r] = nt_ddp_params(g->ddp[r], devs[k * nm + r])))
                return -1;
        if (gptm_comms(g, devs + k * nm, c + k * g->ep))
            return -1;
    }
    bool amp = o->amp != NT_DTYPE_COUNT;
    if (amp && nt_autocast_begin(o->amp))
        return -1;
    g->tally = g->training = true;
    int64_t live0 = nt_device_bytes_live(g->dd[0][0]);
    nt_scope *fs = nt_scope_begin();
    int rc = !fs;
    for (int k = 0; k < nk && !rc; k++) {
        g->shard = sh[k];
        rc = gptm_embed(g, c + k * g->ep, P + k * nm, devs + k * nm,
                        idx_all + (size_t)sh[k] * nm, x + k * nm);
    }
    for (int l = 0; l < L && !rc; l++) {
        int lo = GPTM_M2(g, l, 0), hi = GPTM_M2(g, l + 1, 0);
        for (int r = 0; r < nm && l + 1 < L && !rc; r++) /* the next block's */
            rc = nt_ddp_gather(g->ddp[r], hi, GPTM_M2(g, l + 2, 0)) ? -1 : 0;
        for (int k = 0; k < nk && !rc; k++) {
            g->shard = sh[k];
            rc = gptm_fwd_block(g, c + k * g->ep, P + k * nm, devs + k * nm, l, x + k * nm,
                                aux + k * nm);
        }
        for (int r = 0; r < nm && !rc; r++) { /* member r's x on its nk devices */
            for (int k = 0; k < nk; k++)
                in[k] = x[k * nm + r];
            rc = nt_ddp_layer_done(g->ddp[r], lo, hi, in, in) ? -1 : 0;
            for (int k = 0; k < nk && !rc; k++)
                x[k * nm + r] = in[k];
        }
    }
    for (int k = 0; k < nk && !rc; k++) {
        g->shard = sh[k];
        loss[k] = gptm_out(g, c + k * g->ep, P + k * nm, devs + k * nm,
                           idx_all + (size_t)sh[k] * nm, tgt_all + (size_t)sh[k] * nm,
                           x + k * nm, aux + k * nm);
        rc = !loss[k] || !nt_keep(loss[k]);
    }
    if (fs)
        nt_scope_end(fs);
    int64_t live1 = nt_device_bytes_live(g->dd[0][0]);
    if (!rc && live1 - live0 > g->act_bytes)
        g->act_bytes = live1 - live0;
    if (!rc && live1 > g->live_bytes)
        g->live_bytes = live1;
    g->tally = g->training = false;
    if (amp)
        nt_autocast_end();
    if (!rc && nt_ddp_backward_group_shards(g->ddp, nm, sh, loss, nk))
        rc = -1;
    return rc ? -1 : 0;
}

/* Every local shard's forward and backward in rounds (g->release): round
 * q takes each local group's q-th shard (gptm_round; the groups are
 * numbered by member 0's local devices).  The
 * shards' losses go into *loss_sum in shard order, as the loop of
 * gptm_step_body adds them.  0 or -1 with the runtime's error. */
static inline int gptm_rounds(gpt_mesh *g, const gpt_train_opts *o, nt_tensor **idx_all,
                              nt_tensor **tgt_all, nt_tensor *loss_sum)
{
    int nk = g->ndd[0], S = g->shards, rounds = 0, rc = 0;
    int *of = malloc(sizeof *of * (size_t)S); /* local device of shard s, or -1 */
    nt_tensor **lv = calloc((size_t)S, sizeof *lv); /* the shards' detached losses */
    rc = !of || !lv;
    for (int s = 0; s < S && !rc; s++) {
        int dev = nt_ddp_shard_device(g->ddp[0], s);
        of[s] = -1;
        for (int k = 0; k < nk; k++)
            of[s] = g->dd[0][k] == dev ? k : of[s];
        rounds += of[s] == 0;
    }
    for (int q = 0; q < rounds && !rc; q++) {
        int sh[GPTM_MAXD], seen[GPTM_MAXD] = {0};
        for (int s = 0; s < S; s++) /* device k's q-th shard */
            if (of[s] >= 0 && seen[of[s]]++ == q)
                sh[of[s]] = s;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *loss[GPTM_MAXD] = {0};
        rc = !sc || gptm_round(g, o, idx_all, tgt_all, sh, loss);
        for (int k = 0; k < nk; k++) {
            if (!rc && loss_sum) {
                nt_no_grad_begin();
                nt_device_set(g->dd[0][k]);
                lv[sh[k]] = nt_keep(nt_to_device(nt_detach(loss[k]),
                                                 nt_tensor_device(loss_sum)));
                nt_no_grad_end();
                rc = !lv[sh[k]];
            }
            nt_release(loss[k]);
        }
        if (sc)
            nt_scope_end(sc);
    }
    if (!rc && loss_sum) {
        nt_device_set(nt_tensor_device(loss_sum));
        nt_no_grad_begin();
        for (int s = 0; s < S && !rc; s++)
            if (of[s] >= 0)
                rc = nt_add_inplace(loss_sum, lv[s]) != 0;
        nt_no_grad_end();
    }
    for (int s = 0; lv && s < S; s++)
        nt_release(lv[s]);
    free(of);
    free(lv);
    nt_device_set(0);
    return rc ? -1 : 0;
}

/* The device's part of a step on the shards' inputs of gptm_inputs: every
 * local shard's forward and backward, the reduce, clipping and the step of
 * each tensor rank's nt_ddp -- what `char_gpt --capture` records once under
 * a mesh (gptm_captured_step).  *loss_sum (f32 0-d on device 0) gets this
 * process's shards' losses added.  0 or -1 with the runtime's error. */
static inline int gptm_step_body(gpt_mesh *g, const gpt_train_opts *o, nt_tensor **idx_all,
                                 nt_tensor **tgt_all, nt_tensor *loss_sum)
{
    int tp = g->nm;
    if (g->release && !g->recording)
        return gptm_rounds(g, o, idx_all, tgt_all, loss_sum) ? -1 : gptm_step_end(g, o);
    if (g->zero == 3)
        for (int r = 0; r < tp; r++)
            if (nt_ddp_gather(g->ddp[r], 0, g->n))
                return -1;
    for (int s = 0; s < g->shards; s++) {
        int devs[GPTM_MAXD];
        if (gptm_shard_devs(g, s, devs))
            continue; /* another process's */
        nt_scope *sc = nt_scope_begin();
        nt_tensor **idx = idx_all + (size_t)s * tp, **tgt = tgt_all + (size_t)s * tp,
                  **P[GPTM_MAXD];
        for (int r = 0; r < tp; r++) {
            nt_device_set(devs[r]);
            P[r] = nt_ddp_params(g->ddp[r], devs[r]);
            if (!P[r] || !idx[r] || !tgt[r]) {
                nt_scope_end(sc);
                return -1;
            }
        }
        nt_comm *c[GPTM_MAXD];
        bool ok = !gptm_comms(g, devs, c);
        bool amp = o->amp != NT_DTYPE_COUNT;
        if (amp && nt_autocast_begin(o->amp)) {
            nt_scope_end(sc);
            return -1;
        }
        g->tally = true;
        g->training = true;
        g->shard = s;
        /* the forward in its own scope: what stays live after it is what the
         * backward keeps (the activations) and the loss */
        int64_t live0 = nt_device_bytes_live(devs[0]);
        nt_scope *fs = nt_scope_begin();
        nt_tensor *loss = ok && fs ? gptm_loss(g, c, P, devs, idx, tgt) : NULL;
        if (loss)
            nt_keep(loss);
        if (fs)
            nt_scope_end(fs);
        int64_t live1 = nt_device_bytes_live(devs[0]);
        if (loss && live1 - live0 > g->act_bytes)
            g->act_bytes = live1 - live0;
        if (loss && live1 > g->live_bytes)
            g->live_bytes = live1;
        g->training = false;
        g->tally = false;
        if (amp)
            nt_autocast_end();
        int rc = !loss || nt_ddp_backward_group(g->ddp, tp, s, loss);
        if (!rc && loss_sum) {
            int dst = nt_tensor_device(loss_sum);
            nt_no_grad_begin();
            nt_tensor *lv = nt_to_device(nt_detach(loss), dst);
            nt_device_set(dst);
            rc = nt_add_inplace(loss_sum, lv) != 0;
            nt_no_grad_end();
        }
        if (loss)
            nt_release(loss);
        nt_scope_end(sc);
        if (rc)
            return -1;
    }
    return gptm_step_end(g, o);
}

/* The host's part of a step (gptm_step_prepare) and its inputs
 * (gptm_inputs) in *idx, *tgt, shards x nm entries each, allocated here:
 * 0 (gptm_step_finish frees them) or -1 with the runtime's error (nothing
 * left to free). */
static inline int gptm_step_start(gpt_mesh *g, const gpt_train_opts *o, const int32_t *xb,
                                  const int32_t *yb, nt_tensor ***idx, nt_tensor ***tgt)
{
    size_t n = (size_t)g->shards * (size_t)g->nm;
    *idx = calloc(n, sizeof **idx), *tgt = calloc(n, sizeof **tgt);
    if (!*idx || !*tgt || gptm_step_prepare(g) || gptm_inputs(g, o, xb, yb, *idx, *tgt)) {
        free(*idx);
        free(*tgt);
        return -1;
    }
    return 0;
}

static inline void gptm_step_finish(const gpt_mesh *g, nt_tensor **idx, nt_tensor **tgt)
{
    gptm_inputs_free(g, idx, tgt);
    free(idx);
    free(tgt);
}

/* One training step on batch xb [B, T], yb [B * T] (host ints), op by op:
 * gptm_step_prepare, gptm_inputs, gptm_step_body.  0 or -1 with the
 * runtime's error. */
static inline int gptm_step(gpt_mesh *g, const gpt_train_opts *o, const int32_t *xb,
                            const int32_t *yb, nt_tensor *loss_sum)
{
    nt_tensor **idx, **tgt;
    if (gptm_step_start(g, o, xb, yb, &idx, &tgt))
        return -1;
    int rc = gptm_step_body(g, o, idx, tgt, loss_sum);
    gptm_step_finish(g, idx, tgt);
    return rc ? -1 : 0;
}

/* Why a mesh step cannot be captured (a sentence naming the option), or
 * NULL: dropout's masks are keyed on the step and shard by host seeds a
 * replay would not redraw; the MoE MLP (--ep/--experts) is not checked
 * against a capture; several processes' steps
 * exchange through MPI, which a capture does not record. */
static inline const char *gptm_capture_refusal(const gpt_mesh *g)
{
    if (g->dropout > 0)
        return "--dropout: the masks' seeds are a hash of the step computed on the host, "
               "which a replay would not recompute";
    if (g->experts)
        return "--ep/--experts: the MoE step is not captured (its load statistics and "
               "routing are not checked under a capture)";
    if (nt_process_count() > 1)
        return "several processes (MPI): a capture records this process's streams only";
    return NULL;
}

/* A mesh step recorded once and replayed (docs/graphs.md, "Several
 * devices").  Zero it before the first step; gptm_capture_free at the end. */
typedef struct {
    nt_graph *graph;
} gptm_capture;

/* gptm_step through a capture of every device's stream
 * (nt_graph_capture_begin_multi): the host's part (the step count, the
 * schedules, the batch) every step; the device's part recorded at the
 * first call and replayed after, each shard's batch bound to the inputs
 * "x<s>.<r>" and "y<s>.<r>" (shard s, member r).  The caller checks
 * gptm_capture_refusal first.  0 or -1 with the runtime's error. */
static inline int gptm_captured_step(gpt_mesh *g, const gpt_train_opts *o, const int32_t *xb,
                                     const int32_t *yb, nt_tensor *loss_sum, gptm_capture *cap)
{
    nt_tensor **idx, **tgt;
    if (gptm_step_start(g, o, xb, yb, &idx, &tgt))
        return -1;
    bool record = !cap->graph;
    int rc = record ? nt_graph_capture_begin_multi() : 0;
    if (!rc) {
        /* the inputs: declared when recording, bound when replaying */
        for (int i = 0; i < g->shards * g->nm && !rc; i++) {
            if (!idx[i])
                continue; /* another process's shard */
            char xn[32], yn[32];
            snprintf(xn, sizeof xn, "x%d.%d", i / g->nm, i % g->nm);
            snprintf(yn, sizeof yn, "y%d.%d", i / g->nm, i % g->nm);
            rc = record ? nt_graph_input(idx[i], xn) || nt_graph_input(tgt[i], yn)
                        : nt_graph_bind(cap->graph, xn, idx[i]) ||
                              nt_graph_bind(cap->graph, yn, tgt[i]);
        }
        if (record) {
            g->recording = true; /* shard by shard: the release refuses a capture */
            rc = rc || gptm_step_body(g, o, idx, tgt, loss_sum);
            g->recording = false;
            cap->graph = nt_graph_capture_end(); /* ends the capture either way */
            rc = rc || !cap->graph;
        } else {
            rc = rc || nt_graph_replay(cap->graph);
        }
    }
    gptm_step_finish(g, idx, tgt);
    nt_device_set(0);
    return rc ? -1 : 0;
}

static inline void gptm_capture_free(gptm_capture *cap)
{
    nt_graph_destroy(cap->graph);
    cap->graph = NULL;
}

/* Mean loss of nb fixed validation batches, on this process's first tensor
 * group, no graph.  NaN with the runtime's error. */
static inline double gptm_eval(gpt_mesh *g, const gpt_data *d, const gpt_train_opts *o, int nb)
{
    int B = o->batch, T = g->c.context, tp = g->nm;
    if (g->zero == 3)
        for (int r = 0; r < tp; r++)
            if (nt_ddp_gather(g->ddp[r], 0, g->n))
                return NAN;
    int devs[GPTM_MAXD];
    nt_tensor **P[GPTM_MAXD];
    for (int r = 0; r < tp; r++)
        devs[r] = g->dd[r][0];
    if (gptm_params(g, 0, P))
        return NAN;
    int32_t *xb = malloc(sizeof *xb * (size_t)B * T), *yb = malloc(sizeof *yb * (size_t)B * T);
    nt_comm *c[GPTM_MAXD];
    int rc = !xb || !yb || gptm_comms(g, devs, c);
    double sum = 0;
    nt_no_grad_begin();
    for (int k = 0; k < nb && !rc; k++) {
        nt_scope *sc = nt_scope_begin();
        gpt_batch(d, true, GPT_VAL_SEED, k, B, T, xb, yb);
        nt_tensor *idx[GPTM_MAXD], *tgt[GPTM_MAXD];
        for (int r = 0; r < tp; r++) {
            nt_device_set(devs[r]);
            idx[r] = nt_from_host(xb, NT_I32, 2, (int64_t[]){B, T});
            tgt[r] = nt_from_host(yb, NT_I32, 1, (int64_t[]){(int64_t)B * T});
        }
        bool amp = o->amp != NT_DTYPE_COUNT;
        if (amp)
            nt_autocast_begin(o->amp);
        nt_tensor *l = gptm_loss(g, c, P, devs, idx, tgt);
        if (amp)
            nt_autocast_end();
        double v;
        rc = !l || nt_item(l, &v);
        sum += rc ? 0 : v;
        nt_scope_end(sc);
    }
    nt_no_grad_end();
    nt_device_set(0);
    free(xb);
    free(yb);
    return rc ? NAN : sum / nb;
}

/* CRC-32 (IEEE, reflected), continuing from crc. */
static inline uint32_t gptm_crc32(uint32_t crc, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* The CRC-32 of every parameter whole (put together from the tensor ranks'
 * parts, in f32, in the spec's order), read from this process's first
 * device of each tensor rank; checks that every local replica agrees (at
 * stages 0-2).  Returns 0 and *crc, or -1 with err set. */
static inline int gptm_crc(gpt_mesh *g, uint32_t *crc, char *err, size_t en)
{
    int tp = g->nm;
    if (g->zero == 3)
        for (int r = 0; r < tp; r++)
            if (nt_ddp_gather(g->ddp[r], 0, g->n))
                return gptm_fail(err, en, "nt_ddp_gather failed");
    uint32_t c = 0;
    for (int j = 0; j < g->n; j++) {
        const gptm_spec *p = &g->spec[j];
        int64_t R = p->r, C = p->nd == 2 ? p->c : 1;
        float *full = malloc(sizeof *full * (size_t)(R * C)), *part = malloc(sizeof *part * (size_t)(R * C));
        float *other = malloc(sizeof *other * (size_t)(R * C));
        int rc = !full || !part || !other ? gptm_fail(err, en, "out of memory") : 0;
        for (int r = 0; r < tp && !rc; r++) {
            int pr, parts; /* member r's part of the parameter's parts */
            gptm_rank(g, p->split, r, &pr, &parts);
            bool rows = p->split != GPTM_COLS && parts > 1, cols = p->split == GPTM_COLS && parts > 1;
            int64_t rr = rows ? R / parts : R, cc = cols ? C / parts : C;
            for (int k = 0; k < g->ndd[r] && !rc; k++) {
                nt_tensor *t = nt_ddp_params(g->ddp[r], g->dd[r][k])[j];
                if (nt_to_host(t, k ? other : part, sizeof *part * (size_t)(rr * cc)))
                    rc = gptm_fail(err, en, "reading parameter %d failed: %s", j,
                                   nt_last_error_message());
                else if (k && memcmp(part, other, sizeof *part * (size_t)(rr * cc)))
                    rc = gptm_fail(err, en, "parameter %d differs between the replicas of "
                                   "tensor rank %d", j, r);
            }
            /* a replicated parameter: the same bits on every member */
            if (!rc && r > 0 && parts == 1 &&
                memcmp(part, full, sizeof *part * (size_t)(R * C)))
                rc = gptm_fail(err, en, "replicated parameter %d differs between tensor ranks "
                               "0 and %d", j, r);
            if (rc)
                break;
            for (int64_t a = 0; a < rr; a++)
                for (int64_t b = 0; b < cc; b++)
                    full[(rows ? a + pr * rr : a) * C + (cols ? b + pr * cc : b)] = part[a * cc + b];
        }
        if (!rc)
            c = gptm_crc32(c, full, sizeof *full * (size_t)(R * C));
        free(full);
        free(part);
        free(other);
        if (rc)
            return -1;
    }
    *crc = c;
    return 0;
}

/* ---------------- checkpoints (docs/parallel.md, "Mesh checkpoints") ----------------
 *
 * A save at `path` is one nt_ddp_save_split per member (tensor rank r of
 * tp; with the MoE MLP, rank q of the MoE group, gptm_moe_q, so that the
 * files hold the experts in order: "<path>.tp<q>of<nm>.zero<r>of<R>", its
 * shards or replica and its AdamW state, step counts and lrs) and, written
 * last by process 0, "<path>" itself: the tensor "mesh.layout" (the model,
 * which must match to load, and the layout it was split by).  Under mpirun
 * the processes wait for each other after their parts (process 0 writes
 * "<path>" only once every part is on disk) and after "<path>" (no process
 * returns before the checkpoint is whole).  A load under
 * the same layout reads each member's own files; under another (dp, tp,
 * ep, zero) it is an error unless asked to reshard: then
 * nt_ddp_load_split puts each parameter and its AdamW moments together
 * from every saved file and cuts them for this layout (the MoE model only
 * between layouts of --tp 1, or with the same --tp and --ep: its
 * tensor-split parameters are not put together across the files of an MoE
 * group).  The mesh layouts
 * share their arithmetic (fixed blocks and shards), so a resharded run
 * continues with the bits of an uninterrupted run.  The schedule's
 * position and the batches are the optimizer's step count (gpt_batch of
 * the step), restored with it. */

enum { GPTM_CK_VERSION = 1, GPTM_CK_N = 16 };

/* The layout record: version, dp, tp, ep, zero, then the model: blocks,
 * shards, experts, topk, vocab (padded), layers, heads, width, context,
 * parameter count, auxw x 1e6. */
static inline void gptm_ck_layout(const gpt_mesh *g, int32_t *v)
{
    int32_t w[GPTM_CK_N] = {GPTM_CK_VERSION, g->dp, g->tp, g->ep, g->zero, g->blocks,
                            g->shards, g->experts, g->topk, g->c.vocab, g->c.n_layer,
                            g->c.n_head, g->c.width, g->c.context, g->n,
                            (int32_t)lround(g->auxw * 1e6)};
    memcpy(v, w, sizeof w);
}

/* "dp 2, tp 2, zero 2" (and ", ep E" with the MoE MLP) of layout v. */
static inline void gptm_ck_name(const int32_t *v, char *buf, size_t n)
{
    if (v[0] < 0)
        snprintf(buf, n, "no checkpoint it could read");
    else if (v[7] && v[2] > 1)
        snprintf(buf, n, "dp %d, tp %d, ep %d, zero %d", v[1], v[2], v[3], v[4]);
    else if (v[7])
        snprintf(buf, n, "dp %d, ep %d, zero %d", v[1], v[3], v[4]);
    else
        snprintf(buf, n, "dp %d, tp %d, zero %d", v[1], v[2], v[4]);
}

/* Member m's file index: its MoE rank q with the MoE MLP, else m (the
 * tensor rank). */
static inline int gptm_ck_index(const gpt_mesh *g, int m)
{
    return g->experts ? gptm_moe_q(g, m) : m;
}

/* Parameter j's split dim over the members (-1: the same on every one). */
static inline int gptm_split_dim(const gpt_mesh *g, int j)
{
    int split = g->spec[j].split;
    if (split == GPTM_REP)
        return -1;
    if (g->experts)
        return split == GPTM_EXP ? 0 : -1;
    return split == GPTM_COLS ? 1 : 0;
}

/* Every process's k i32 values v, gathered over the processes' devices
 * (global rank order) into a malloc'd *every of *total x k; 0, or -1 with
 * err set.  Every process must call it (a barrier). */
static inline int gptm_ck_gather(gpt_mesh *g, const int32_t *v, int k, int32_t **every,
                                 int *total, char *err, size_t en)
{
    int devs[GPTM_MAXD];
    for (int i = 0; i < g->ndev; i++)
        devs[i] = i;
    *every = NULL;
    nt_comm *w = nt_comm_create(devs, g->ndev);
    if (!w)
        return gptm_fail(err, en, "%s", nt_last_error_message());
    int rc = 0;
    *total = nt_comm_size(w);
    *every = malloc(sizeof **every * (size_t)k * (size_t)*total);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[GPTM_MAXD], *out[GPTM_MAXD];
    for (int i = 0; i < g->ndev && !rc; i++) {
        nt_device_set(i);
        rc = !(in[i] = nt_from_host(v, NT_I32, 1, (int64_t[]){k}));
    }
    if (rc || !*every || nt_all_gather(w, in, out) ||
        nt_to_host(out[0], *every, sizeof **every * (size_t)k * (size_t)*total))
        rc = gptm_fail(err, en, "%s", nt_last_error_message());
    nt_scope_end(sc);
    nt_comm_destroy(w);
    nt_device_set(0);
    if (rc) {
        free(*every);
        *every = NULL;
    }
    return rc ? -1 : 0;
}

/* A save's barrier under mpirun: every process says whether its part of
 * `what` failed (its err is set then).  0 when none did, else -1 with err
 * set (its own error, or the first global rank that failed). */
static inline int gptm_ck_sync(gpt_mesh *g, const char *path, bool failed, const char *what,
                               char *err, size_t en)
{
    if (nt_process_count() == 1)
        return failed ? -1 : 0;
    int32_t f = failed, *every;
    int total = 0;
    char gerr[512];
    if (gptm_ck_gather(g, &f, 1, &every, &total, gerr, sizeof gerr))
        return failed ? -1 : gptm_fail(err, en, "saving '%s': waiting for the other processes "
                                       "after %s: %s", path, what, gerr);
    int who = -1;
    for (int r = total - 1; r >= 0; r--)
        if (every[r])
            who = r;
    free(every);
    if (who < 0 || failed)
        return who < 0 ? 0 : -1;
    return gptm_fail(err, en, "saving '%s': global rank %d failed writing %s (its process "
                     "prints why)", path, who, what);
}

/* Saves g at path (see above); every process calls it.  0 or -1 with err. */
static inline int gptm_save(gpt_mesh *g, const char *path, char *err, size_t en)
{
    int rc = 0;
    for (int m = 0; m < g->nm && !rc; m++)
        if (nt_ddp_save_split(g->ddp[m], path, gptm_ck_index(g, m), g->nm, g->opt[m],
                              g->ndd[m]))
            rc = gptm_fail(err, en, "%s", nt_last_error_message());
    /* every process's parts are on disk before "<path>" names them */
    if (gptm_ck_sync(g, path, rc != 0, "its parts", err, en))
        return -1;
    if (nt_process_rank() == 0) {
        int32_t v[GPTM_CK_N];
        gptm_ck_layout(g, v);
        nt_device_set(0);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *t = nt_from_host(v, NT_I32, 1, (int64_t[]){GPTM_CK_N});
        const char *name = "mesh.layout";
        rc = !t || nt_checkpoint_write(path, &(nt_checkpoint_spec){.tensors = &t,
                                                                  .names = &name, .n = 1});
        nt_scope_end(sc);
        if (rc)
            gptm_fail(err, en, "%s", nt_last_error_message());
    }
    /* and "<path>" before any process returns */
    return gptm_ck_sync(g, path, rc != 0, "the header", err, en);
}

/* Reads path's layout record into v.  0 or -1 with err set. */
static inline int gptm_ck_read(const char *path, int32_t *v, char *err, size_t en)
{
    nt_device_set(0);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *t = nt_zeros(NT_I32, 1, (int64_t[]){GPTM_CK_N});
    const char *name = "mesh.layout";
    nt_load_report rep = {0};
    int rc = !t || nt_checkpoint_read(path, &(nt_checkpoint_spec){.tensors = &t, .names = &name,
                                                                 .n = 1}, false, &rep);
    if (rc)
        gptm_fail(err, en, "%s", nt_last_error_message());
    else if (rep.loaded != 1)
        rc = gptm_fail(err, en, "'%s' is not a mesh checkpoint (no tensor 'mesh.layout'): "
                       "a checkpoint of char_gpt without --dp/--tp/--zero/--ep loads only "
                       "there", path);
    else if (nt_to_host(t, v, sizeof *v * GPTM_CK_N))
        rc = gptm_fail(err, en, "%s", nt_last_error_message());
    nt_load_report_clear(&rep);
    nt_scope_end(sc);
    return rc ? -1 : 0;
}

/* Under mpirun: every process's layout record v must be the same (each
 * read the file itself); 0 or -1 with err naming both. */
static inline int gptm_ck_agree(gpt_mesh *g, const char *path, const int32_t *v, char *err,
                                size_t en)
{
    if (nt_process_count() == 1)
        return 0;
    int total = 0, rc = 0;
    int32_t *every;
    char gerr[512];
    if (gptm_ck_gather(g, v, GPTM_CK_N, &every, &total, gerr, sizeof gerr))
        return gptm_fail(err, en, "comparing the layouts of the processes: %s", gerr);
    for (int r = 0; r < total && !rc; r++)
        if (memcmp(every + (size_t)r * GPTM_CK_N, every, sizeof *every * GPTM_CK_N)) {
            char a[64], b[64];
            gptm_ck_name(every, a, sizeof a);
            gptm_ck_name(every + (size_t)r * GPTM_CK_N, b, sizeof b);
            rc = gptm_fail(err, en, "the processes read different checkpoints at '%s': global "
                           "rank 0's was saved under (%s), global rank %d's under (%s)%s", path,
                           a, r, b, strcmp(a, b) ? "" : " (another model)");
        }
    free(every);
    return rc ? -1 : 0;
}

/* Loads path into g (its parameters, AdamW moments, step counts and lrs):
 * the same layout as saved, or any other with reshard.  Every process
 * calls it.  0 or -1 with err set (a different model, a layout asked for
 * without reshard, the runtime's errors), nothing loaded on a mismatch. */
static inline int gptm_load(gpt_mesh *g, const char *path, bool reshard, char *err, size_t en)
{
    int32_t v[GPTM_CK_N], w[GPTM_CK_N];
    char rerr[512] = "";
    bool bad = gptm_ck_read(path, v, rerr, sizeof rerr) != 0;
    if (bad) /* still compared: the others must not wait for this process */
        for (int i = 0; i < GPTM_CK_N; i++)
            v[i] = -1;
    if (gptm_ck_agree(g, path, v, err, en))
        return -1;
    if (bad)
        return gptm_fail(err, en, "%s", rerr);
    gptm_ck_layout(g, w);
    if (v[0] != GPTM_CK_VERSION)
        return gptm_fail(err, en, "'%s': mesh checkpoint version %d; this build reads %d", path,
                         v[0], GPTM_CK_VERSION);
    static const char *const what[GPTM_CK_N] = {
        "", "", "", "", "", "--blocks", "--shards", "--experts", "--topk",
        "the padded vocabulary", "--layers", "--heads", "--width", "--context",
        "the parameter count", "the load-balancing coefficient (x 1e6)"};
    for (int i = 5; i < GPTM_CK_N; i++)
        if (v[i] != w[i])
            return gptm_fail(err, en, "'%s' holds another model: %s is %d there, %d here", path,
                             what[i], v[i], w[i]);
    bool same = v[1] == w[1] && v[2] == w[2] && v[3] == w[3] && v[4] == w[4];
    char saved[64], here[64];
    gptm_ck_name(v, saved, sizeof saved);
    gptm_ck_name(w, here, sizeof here);
    if (!same && !reshard)
        return gptm_fail(err, en, "'%s' was saved under (%s); this run is (%s): pass --reshard "
                         "(gptm_load's reshard) to cut the parameters and the optimizer state "
                         "for this layout", path, saved, here);
    /* the MoE model's files are the MoE group's ranks; its tensor-split
     * parameters (wte, wqkv, wo, bqkv) are not put together across them */
    if (!same && w[7] && (v[2] > 1 || w[2] > 1) && (v[2] != w[2] || v[3] != w[3]))
        return gptm_fail(err, en, "'%s' was saved under (%s); this run is (%s): resharding the "
                         "MoE model across --tp or --ep with --tp > 1 is not supported (load it "
                         "with the same --tp and --ep, or save and load at --tp 1)", path,
                         saved, here);
    int dims[1024];
    for (int j = 0; j < g->n && j < 1024; j++)
        dims[j] = gptm_split_dim(g, j);
    for (int m = 0; m < g->nm; m++)
        if (nt_ddp_load_split(g->ddp[m], path, gptm_ck_index(g, m), g->nm, dims, g->opt[m],
                              g->ndd[m], !same))
            return gptm_fail(err, en, "loading '%s' (%s) into (%s): %s", path, saved, here,
                             nt_last_error_message());
    nt_device_set(0);
    return 0;
}

#endif
