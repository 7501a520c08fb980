/* neuron/rows.c - the row ops and losses on the simulator.
 *
 * One row per partition (up to 128 rows per group, the innermost batch dim
 * on partitions), the row on the free axis in chunks of RCH (a multiple of
 * 2048).  A row that fits one chunk stays in SBUF across the passes; a
 * longer one is streamed from HBM once per pass.  The arithmetic is the CPU
 * kernels' (cpu/nn.c), step for step:
 *
 *   softmax      m = max(x); e = exp(x - m); s = sum(e); y = e / s
 *   log_softmax  m; d = x - m; s = sum(exp(d)); y = d - log(s)
 *   layer_norm   mean = sum(x) / D; d = x - mean; var = sum(d * d) / D;
 *                r = rsqrt(var + eps); y = d * r (* w) (+ b)
 *   rms_norm     r = rsqrt(sum(x * x) / D + eps); y = x * r (* w)
 *   cross_entropy  per row: m, d, ls = log(sum(exp(d))), nll = -(d[label] -
 *                ls); loss = sum(nll) / N, the sum over rows in the
 *                canonical order (the nll values are gathered into a row)
 *   mse_loss     sum((a - b) * (a - b)) / n over the flat sequence
 *
 * Every sum and max is sk_fold (block partials folded in order, so exactly
 * nt__red_sum_f32 / nt__red_max_f32 over the row); temporaries are f32;
 * the one rounding is the last instruction's write into the output tile.
 * d[label] is a masked maximum: every other element is -Inf, so the maximum
 * is d[label] itself, bit for bit. */
#include "neuron/sk.h"

#include <math.h>
#include <string.h>

#define RCH 4096
#define NR_RING 8 /* groups in flight in norm_group_short, at most */
#define NR_LAG 2  /* groups whose second half waits (norm_group_short) */
/* norm_group_short: a ring slot's four statistics columns, 64 bytes apart
 * from the next slot's (the unit of on-chip dependencies): four slots in
 * one 64-byte chunk made each group's statistics wait for the groups
 * before it to have read theirs */
#define NR_ST 16
#define XG (NT_RED_BLOCK / 128) /* cross_entropy: groups whose nll waits for one log */

typedef struct rk {
    sk_k *s;
    int op;
    int64_t n, sn, sc, oc, on;
    nt_dtype xdt, odt;
    char *xb, *ob;
    float eps;
    const nt_tensor *w, *b;
    nt_tile *x[2], *T, *U, *y, *wt, *bt, *st, *ii, *mk, *cnd, *ninf;
    /* softmax, log_softmax: a second output tile, taken by every other
     * store (ny counts them), so that a group's output need not wait for
     * the group before it to have stored (2 us a group) */
    nt_tile *y2;
    int64_t ny;
    int sb; /* the first column of the group's statistics in st */
    bool wb_loaded;
    /* norm_group_short: rings of tiles, so consecutive groups overlap */
    nt_tile *fx[NR_RING], *fT[NR_RING], *fy[NR_RING], *fst;
    /* a norm with its cast (nt__sk_norm_fused): the cast's output, its
     * dtype and tiles (ob NULL: the f32 output is not stored) */
    char *cb;
    nt_dtype cdt;
    nt_tile *fc[NR_RING], *yc;
    int nring, npend, pb[NR_LAG], pn[NR_LAG];
    int64_t po[NR_LAG];
    bool fast;
    int ng;
    /* cross_entropy */
    const nt_tensor *labels;
    int64_t row0;       /* first row of the group */
    nt_tile *nll_row, *acc;
    nt_tile *trp;
    /* groups whose log and nll wait (xent_flush): per group a column of
     * its labels, row sums, label logits, logs and nll */
    nt_tile *glab, *gsum, *gdl, *gls, *gnll;
    int gi, gnp[XG];
    int64_t grow0[XG];
    bool flush; /* the group is the last before xent_flush */
} rk;

static nt_ap colk(nt_tile *t, int np, int j) { return nt_tile_slice(t, 0, np, j, 1); }

/* The group's label column: 64 bytes apart, so that a group's label load
 * shares no 64-byte chunk (the unit of on-chip dependencies) with the
 * groups before it and need not wait for their reads. */
static nt_ap lab_col(const rk *c, int np)
{
    return colk(c->glab, np, (int)(c->gi * (64 / nt__dtype_size((nt_dtype)c->labels->dtype))));
}

static int ts(sk_k *s, const nt_ap *d, const nt_ap *x, nt_alu_op op, const nt_ap *sap, float imm)
{
    return nt_isa_tensor_scalar(s->k, d, x, &(nt_isa_alu){op, {sap, imm}, false}, NULL, sk_eng(s));
}

/* Loads chunk ch (elements c0 .. c0+m) of the group's rows into x[b]. */
static int load_chunk(rk *c, int64_t ioff, int np, int64_t c0, int64_t m, nt_ap *x)
{
    int b = c->ng & 1;
    *x = nt_tile_slice(c->x[b], 0, np, 0, m);
    nt_ap h = sk_hbm_rows(c->xb, c->xdt, ioff + c0 * c->sn, np, c->sc, m, c->sn);
    return nt_isa_dma_copy(c->s->k, x, &h, sk_qin(c->s));
}

/* stats columns: 0 m, 1 -m (unused), 2 s / sum, 3 ls / r, 4 mean, 5 tmp, 6 dl, 7 nll */
enum { S_M, S_X, S_S, S_L, S_MEAN, S_TMP, S_DL, S_NLL, S_COLS };
/* softmax_group's statistics alternate between two slots of 64 bytes (the
 * unit of on-chip dependencies; rk.sb): in one, each group's first memset
 * waited for the group before it to have read its statistics */
#define ST_SLOT 16

/* m = max over the row (pass 1). */
static int pass_max(rk *c, int64_t ioff, int np, nt_ap *xres)
{
    nt_ap m = colk(c->st, np, c->sb + S_M);
    int rc = nt_isa_memset(c->s->k, &m, -INFINITY, NT_ENGINE_VECTOR);
    int64_t nch = (c->n + RCH - 1) / RCH;
    for (int64_t ch = 0; ch < nch && !rc; ch++) {
        int64_t c0 = ch * RCH, w = c->n - c0 < RCH ? c->n - c0 : RCH;
        rc = load_chunk(c, ioff, np, c0, w, xres);
        if (!rc)
            rc = sk_fold(c->s, &m, xres, NT_ALU_MAX);
    }
    return rc;
}

/* ---------------- softmax, log_softmax, cross_entropy ---------------- */

/* Passes 2 and 3 of the softmax family over one group. */
static int softmax_group(void *ctx, int64_t ioff, int64_t ooff, int np)
{
    rk *c = ctx;
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    nt_ap x;
    int64_t nch = (c->n + RCH - 1) / RCH;
    bool res = nch == 1;
    c->sb = ST_SLOT * (c->ng & 1);
    int rc = pass_max(c, ioff, np, &x);
    bool xent = c->op == NT_OP_CROSS_ENTROPY;
    nt_ap m = colk(c->st, np, c->sb + S_M), sum = colk(c->st, np, c->sb + S_S);
    nt_ap ls = colk(c->st, np, c->sb + S_L), dl = colk(c->st, np, c->sb + S_DL);
    if (xent) /* the group's columns: its log and nll wait (xent_flush) */
        sum = colk(c->gsum, np, c->gi), dl = colk(c->gdl, np, c->gi);
    if (!rc)
        rc = nt_isa_memset(k, &sum, 0.0, NT_ENGINE_VECTOR);
    if (!rc && c->op == NT_OP_CROSS_ENTROPY)
        rc = nt_isa_memset(k, &dl, -INFINITY, NT_ENGINE_VECTOR);
    /* pass 2: s = sum(exp(x - m)); cross_entropy also d[label] */
    for (int64_t ch = 0; ch < nch && !rc; ch++) {
        int64_t c0 = ch * RCH, w = c->n - c0 < RCH ? c->n - c0 : RCH;
        if (!res)
            rc = load_chunk(c, ioff, np, c0, w, &x);
        nt_ap T = nt_tile_slice(c->T, 0, np, 0, w), U = nt_tile_slice(c->U, 0, np, 0, w);
        if (!rc)
            rc = ts(s, &T, &x, NT_ALU_SUB, &m, 0);
        if (!rc)
            rc = nt_isa_activation(k, &U, NT_ACT_EXP, &T, NULL, NULL, NULL);
        /* log's table loads right after the last exp, while the sum and
         * the label's logit are reduced (sk_warm_act) */
        if (!rc && ch == nch - 1 && c->op != NT_OP_SOFTMAX && (!xent || c->flush))
            rc = sk_warm_act(s, NT_ACT_LOG);
        if (!rc)
            rc = sk_fold(s, &sum, &U, NT_ALU_ADD);
        if (!rc && c->op == NT_OP_CROSS_ENTROPY) {
            /* d[label]: max of (j == label ? d : -Inf) */
            nt_ap I = nt_tile_slice(c->ii, 0, np, 0, w), M = nt_tile_slice(c->mk, 0, np, 0, w);
            nt_ap C = nt_tile_slice(c->cnd, 0, np, 0, w), lab = lab_col(c, np);
            nt_ap ni = colk(c->ninf, np, 0), t1 = colk(c->st, np, c->sb + S_TMP);
            ni.num[0] = w;
            ni.step[0] = 0;
            rc = nt_isa_iota(k, &I, &(nt_isa_affine){(int32_t)c0, 0, {1, 0, 0, 0}});
            if (!rc)
                rc = ts(s, &M, &I, NT_ALU_EQ, &lab, 0);
            if (!rc)
                rc = nt_isa_select(k, &C, &M, &T, &ni, NT_ENGINE_VECTOR);
            if (!rc)
                rc = nt_isa_tensor_reduce(k, &t1, &C, NT_ALU_MAX, 0);
            if (!rc)
                rc = nt_isa_tensor_tensor(k, &dl, &dl, &t1, NT_ALU_MAX, NT_ENGINE_VECTOR);
        }
    }
    if (rc)
        return rc;
    c->ng++;
    if (xent)
        return 0;
    if (c->op != NT_OP_SOFTMAX && (rc = nt_isa_activation(k, &ls, NT_ACT_LOG, &sum, NULL, NULL, NULL)))
        return rc;
    /* pass 3: the output */
    for (int64_t ch = 0; ch < nch && !rc; ch++) {
        int64_t c0 = ch * RCH, w = c->n - c0 < RCH ? c->n - c0 : RCH;
        nt_ap T = nt_tile_slice(c->T, 0, np, 0, w), U = nt_tile_slice(c->U, 0, np, 0, w);
        nt_ap Y = nt_tile_slice(c->y2 && (c->ny++ & 1) ? c->y2 : c->y, 0, np, 0, w);
        if (!res) {
            rc = load_chunk(c, ioff, np, c0, w, &x);
            if (!rc)
                rc = ts(s, &T, &x, NT_ALU_SUB, &m, 0);
            if (!rc && c->op == NT_OP_SOFTMAX)
                rc = nt_isa_activation(k, &U, NT_ACT_EXP, &T, NULL, NULL, NULL);
        }
        if (!rc)
            rc = c->op == NT_OP_SOFTMAX ? ts(s, &Y, &U, NT_ALU_DIV, &sum, 0)
                                        : ts(s, &Y, &T, NT_ALU_SUB, &ls, 0);
        nt_ap o = sk_hbm_rows(c->ob, c->odt, ooff + c0 * c->on, np, c->oc, w, c->on);
        if (!rc)
            rc = nt_isa_dma_copy(k, &o, &Y, sk_qout(s));
    }
    return rc;
}

static int rk_tiles(rk *c, bool xent)
{
    sk_k *s = c->s;
    for (int b = 0; b < 2; b++)
        c->x[b] = sk_tile(s, "row.x", c->xdt, 128, RCH);
    c->T = sk_tile(s, "row.T", NT_F32, 128, RCH);
    c->U = sk_tile(s, "row.U", NT_F32, 128, RCH);
    c->st = sk_tile(s, "row.stats", NT_F32, 128, 2 * ST_SLOT);
    if (!xent)
        c->y = sk_tile(s, "row.y", c->odt, 128, RCH);
    return nt_sim_kernel_error(s->k);
}

/* The common start of a row kernel: rows of in[0] along dim (outputs shaped
 * like x when same_shape, else one value per row). */
static void rk_begin(rk *c, sk_k *s, const nt__rec *r, sk_rows *R, int dim, bool same_shape)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    memset(c, 0, sizeof *c);
    c->s = s;
    c->op = r->op;
    nt__rows_shape(R, x, dim, same_shape);
    c->n = R->n, c->sn = R->sn, c->sc = R->sc;
    c->xdt = (nt_dtype)x->dtype, c->odt = (nt_dtype)o->dtype;
    c->xb = nt__tensor_data(x);
    if (same_shape) {
        c->oc = R->oc, c->on = R->on;
        c->ob = nt__tensor_data(o);
    }
}

static int softmax_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    const nt_tensor *x = r->in[0];
    rk c;
    sk_rows R;
    rk_begin(&c, s, r, &R, x->ndim ? r->p.dim : 0, true);
    if (!rk_tiles(&c, false) && (c.y2 = sk_tile(s, "row.y", c.odt, 128, RCH)) &&
        !sk_warm_act(s, NT_ACT_EXP))
        sk_rows_run(&R, softmax_group, &c);
    return 0;
}

/* A row op's program, none for an empty input (no rows: no kernel). */
static int rows_run_prog(const nt__rec *r, int (*prog)(sk_k *s, const nt__rec *r, void *ctx))
{
    const nt_tensor *x = r->in[0];
    if (nt__numel(x->ndim, x->shape) == 0)
        return 0;
    return sk_run_prog(r, NULL, prog, NULL);
}

int nt__sk_softmax(const nt__rec *r) { return rows_run_prog(r, softmax_prog); }

typedef struct lab_check {
    sk_k *s;
    int64_t base, C;
} lab_check;

static int check_labels(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                        void *ctx, char *msg, size_t msglen)
{
    (void)dst, (void)nsrc;
    lab_check *lc = ctx;
    for (int p = 0; p < src[0].np; p++) {
        const char *q = (const char *)src[0].data + p * src[0].pstride;
        int32_t v = src[0].dtype == NT_U8 ? *(const uint8_t *)q : *(const int32_t *)q;
        if (v < 0 || v >= lc->C) {
            snprintf(msg, msglen, "labels[%lld] = %d is out of range [0, %lld)",
                     (long long)(lc->base + p), v, (long long)lc->C);
            return sk_data_error(lc->s, NT_ERANGE, "%s", msg);
        }
    }
    return 0;
}

/* The nll of the groups since the last flush: ls = log(sum), nll = -(dl -
 * ls) over every group's column at once (a run of groups of the same row
 * count per instruction), then each group's column into the row of nll
 * values at its canonical position, a full block folded into the sum.  Per
 * row these are the instructions, and so the values, of a group's own
 * steps; issued per group, ScalarE switched from exp's table to log's and
 * back in every group (2 us of table loads a group) and each group's
 * label load waited for the group before it to have read the one label
 * tile. */
static int xent_flush(rk *c)
{
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    int rc = 0;
    for (int g0 = 0, g1; g0 < c->gi && !rc; g0 = g1) {
        for (g1 = g0 + 1; g1 < c->gi && c->gnp[g1] == c->gnp[g0];)
            g1++;
        int np = c->gnp[g0];
        nt_ap sum = nt_tile_slice(c->gsum, 0, np, g0, g1 - g0);
        nt_ap dl = nt_tile_slice(c->gdl, 0, np, g0, g1 - g0);
        nt_ap ls = nt_tile_slice(c->gls, 0, np, g0, g1 - g0);
        nt_ap nll = nt_tile_slice(c->gnll, 0, np, g0, g1 - g0);
        rc = nt_isa_activation(k, &ls, NT_ACT_LOG, &sum, NULL, NULL, NULL);
        if (!rc)
            rc = nt_isa_tensor_tensor(k, &nll, &dl, &ls, NT_ALU_SUB, NT_ENGINE_VECTOR);
        if (!rc)
            rc = nt_isa_activation(k, &nll, NT_ACT_IDENTITY, &nll, &(nt_isa_scalar){NULL, -1.0f},
                                   NULL, NULL); /* -x */
    }
    int64_t N = c->labels->shape[0];
    for (int g = 0; g < c->gi && !rc; g++) {
        /* into the row of nll values at its canonical position */
        int np = c->gnp[g];
        int64_t row0 = c->grow0[g], pos = row0 % NT_RED_BLOCK;
        nt_ap nll = colk(c->gnll, np, g);
        nt_ap tp = nt_tile_slice(c->trp, 0, 1, 0, np);
        nt_ap dst = nt_tile_slice(c->nll_row, 0, 1, pos, np);
        rc = nt_isa_nc_transpose(k, &tp, &nll);
        if (!rc)
            rc = nt_isa_tensor_copy(k, &dst, &tp, NT_ENGINE_VECTOR);
        int64_t end = row0 + np;
        if (!rc && (end % NT_RED_BLOCK == 0 || end == N)) {
            int64_t len = end % NT_RED_BLOCK ? end % NT_RED_BLOCK : NT_RED_BLOCK;
            nt_ap blk = nt_tile_slice(c->nll_row, 0, 1, 0, len), acc = nt_tile_ap(c->acc);
            rc = sk_fold(s, &acc, &blk, NT_ALU_ADD);
        }
    }
    c->gi = 0;
    return rc;
}

static int xent_group(void *ctx, int64_t ioff, int64_t ooff, int np)
{
    rk *c = ctx;
    (void)ooff;
    /* labels of these rows, checked before anything uses them, in the
     * group's own column (loads need not wait for the groups before) */
    const nt_tensor *L = c->labels;
    nt_ap lab = lab_col(c, np);
    nt_ap h = sk_hbm_rows(nt__tensor_data(L), (nt_dtype)L->dtype, c->row0 * L->stride[0], np,
                     L->stride[0], 1, 1);
    int rc = nt_isa_dma_copy(c->s->k, &lab, &h, sk_qin(c->s));
    lab_check lc = {c->s, c->row0, c->n};
    const nt_ap *srcs[1] = {&lab};
    if (!rc)
        rc = nt_isa_gpsimd_custom(c->s->k, "check_labels", NULL, srcs, 1, 1.0, check_labels, &lc);
    int64_t N = L->shape[0];
    /* a flush when the columns run out (XG groups of 128 rows: a block of
     * the nll row) and at the end */
    c->flush = c->gi + 1 == XG || c->row0 + np == N;
    if (!rc)
        rc = softmax_group(ctx, ioff, 0, np);
    if (rc)
        return rc;
    c->gnp[c->gi] = np;
    c->grow0[c->gi] = c->row0;
    c->gi++;
    c->row0 += np;
    return c->flush ? xent_flush(c) : 0;
}

static int cross_entropy_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    const nt_tensor *x = r->in[0], *lab = r->in[1], *o = r->out[0];
    rk c;
    sk_rows R;
    rk_begin(&c, s, r, &R, 1, false);
    c.labels = lab;
    rk_tiles(&c, true);
    c.ii = sk_tile(s, "xent.iota", NT_I32, 128, RCH);
    c.mk = sk_tile(s, "xent.mask", NT_I32, 128, RCH);
    c.cnd = sk_tile(s, "xent.cand", NT_F32, 128, RCH);
    c.ninf = sk_tile(s, "xent.ninf", NT_F32, 128, 1);
    c.glab = sk_tile(s, "xent.labels", (nt_dtype)lab->dtype, 128,
                     XG * (int64_t)(64 / nt__dtype_size((nt_dtype)lab->dtype)));
    c.gsum = sk_tile(s, "xent.sum", NT_F32, 128, XG);
    c.gdl = sk_tile(s, "xent.dl", NT_F32, 128, XG);
    c.gls = sk_tile(s, "xent.ls", NT_F32, 128, XG);
    c.gnll = sk_tile(s, "xent.nll.col", NT_F32, 128, XG);
    c.nll_row = sk_tile(s, "xent.nll", NT_F32, 1, NT_RED_BLOCK);
    c.acc = sk_tile(s, "xent.acc", NT_F32, 1, 1);
    c.trp = nt_tile_alloc(s->k, "xent.T", NT_MEM_PSUM, NT_F32, 1, 128);
    nt_ap ni = nt_tile_ap(c.ninf), acc = nt_tile_ap(c.acc);
    nt_isa_memset(s->k, &ni, -INFINITY, NT_ENGINE_GPSIMD);
    nt_isa_memset(s->k, &acc, 0.0, NT_ENGINE_GPSIMD);
    sk_warm_act(s, NT_ACT_EXP);
    if (!nt_sim_kernel_error(s->k) && !sk_rows_run(&R, xent_group, &c)) {
        /* loss = sum(nll) / N, rounded once */
        nt_tile *yt = sk_tile(s, "xent.y", c.odt, 1, 1);
        if (yt) {
            nt_ap y = nt_tile_ap(yt);
            int64_t N = x->shape[0];
            if (!ts(s, &y, &acc, NT_ALU_DIV, NULL, (float)N)) {
                nt_ap out = nt_hbm_ap(nt__tensor_data(o), c.odt, 0, 1, 1, 1);
                nt_isa_dma_copy(s->k, &out, &y, sk_qout(s));
            }
        }
    }
    return 0;
}

int nt__sk_cross_entropy(const nt__rec *r)
{
    return sk_run_prog(r, "cross_entropy", cross_entropy_prog, NULL);
}

/* ---------------- layer_norm, rms_norm ---------------- */

/* w or b as a [np, m] tile: the same elements c0 .. c0+m on every partition
 * (a DMA with partition step 0) */
static int load_affine(rk *c, const nt_tensor *v, nt_tile *t, int np, int64_t c0, int64_t m)
{
    nt_ap d = nt_tile_slice(t, 0, np, 0, m);
    nt_ap h = sk_hbm_rows(nt__tensor_data(v), (nt_dtype)v->dtype, c0 * v->stride[0], np, 0, m,
                     v->stride[0]);
    return nt_isa_dma_copy(c->s->k, &d, &h, sk_qin(c->s));
}

/* Stores a group's output rows Y (f32 unless the op's output is not),
 * elements off.. of the output's layout: to the output and, for a norm with
 * its cast, rounded by a copy into tile ct (the cast's instruction,
 * neuron/ew.c) and stored to the cast's output. */
static int norm_store(rk *c, const nt_ap *Y, nt_tile *ct, int64_t off, int np, int64_t w)
{
    sk_k *s = c->s;
    int rc = 0;
    if (c->ob) {
        nt_ap o = sk_hbm_rows(c->ob, c->odt, off, np, c->oc, w, c->on);
        rc = nt_isa_dma_copy(s->k, &o, Y, sk_qout(s));
    }
    if (!rc && c->cb) {
        nt_ap C = nt_tile_slice(ct, 0, np, 0, w);
        nt_ap o = sk_hbm_rows(c->cb, c->cdt, off, np, c->oc, w, c->on);
        rc = nt_isa_tensor_copy(s->k, &C, Y, sk_eng_ap(s, &C));
        if (!rc)
            rc = nt_isa_dma_copy(s->k, &o, &C, sk_qout(s));
    }
    return rc;
}

static int norm_group(void *ctx, int64_t ioff, int64_t ooff, int np)
{
    rk *c = ctx;
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    int64_t nch = (c->n + RCH - 1) / RCH;
    bool res = nch == 1, ln = c->op == NT_OP_LAYER_NORM;
    float D = (float)c->n;
    nt_ap x, mean = colk(c->st, np, S_MEAN), ss = colk(c->st, np, S_S), r = colk(c->st, np, S_L);
    int rc = 0;
    if (ln) { /* pass 1: mean = sum(x) / D */
        rc = nt_isa_memset(k, &mean, 0.0, NT_ENGINE_VECTOR);
        for (int64_t ch = 0; ch < nch && !rc; ch++) {
            int64_t c0 = ch * RCH, w = c->n - c0 < RCH ? c->n - c0 : RCH;
            rc = load_chunk(c, ioff, np, c0, w, &x);
            if (!rc)
                rc = sk_fold(s, &mean, &x, NT_ALU_ADD);
        }
        if (!rc)
            rc = ts(s, &mean, &mean, NT_ALU_DIV, NULL, D);
    }
    /* pass 2: ss = sum(d * d), d = x - mean (layer_norm) or x */
    if (!rc)
        rc = nt_isa_memset(k, &ss, 0.0, NT_ENGINE_VECTOR);
    for (int64_t ch = 0; ch < nch && !rc; ch++) {
        int64_t c0 = ch * RCH, w = c->n - c0 < RCH ? c->n - c0 : RCH;
        if (!res || !ln)
            rc = load_chunk(c, ioff, np, c0, w, &x);
        nt_ap T = nt_tile_slice(c->T, 0, np, 0, w), U = nt_tile_slice(c->U, 0, np, 0, w);
        const nt_ap *d = &x;
        if (!rc && ln) {
            rc = ts(s, &T, &x, NT_ALU_SUB, &mean, 0);
            d = &T;
        }
        if (!rc)
            rc = nt_isa_tensor_tensor(k, &U, d, d, NT_ALU_MUL, NT_ENGINE_VECTOR);
        if (!rc)
            rc = sk_fold(s, &ss, &U, NT_ALU_ADD);
    }
    /* r = rsqrt(ss / D + eps) */
    if (!rc)
        rc = nt_isa_tensor_scalar(k, &r, &ss, &(nt_isa_alu){NT_ALU_DIV, {NULL, D}, false},
                                  &(nt_isa_alu){NT_ALU_ADD, {NULL, c->eps}, false},
                                  NT_ENGINE_VECTOR);
    if (!rc)
        rc = nt_isa_activation(k, &r, NT_ACT_RSQRT, &r, NULL, NULL, NULL);
    c->ng++;
    /* pass 3: y = d * r (* w) (+ b), rounded at the last step */
    for (int64_t ch = 0; ch < nch && !rc; ch++) {
        int64_t c0 = ch * RCH, w = c->n - c0 < RCH ? c->n - c0 : RCH;
        nt_ap T = nt_tile_slice(c->T, 0, np, 0, w), Y = nt_tile_slice(c->y, 0, np, 0, w);
        const nt_ap *d = ln ? &T : &x;
        if (!res) {
            rc = load_chunk(c, ioff, np, c0, w, &x);
            if (!rc && ln)
                rc = ts(s, &T, &x, NT_ALU_SUB, &mean, 0);
        }
        bool more = c->w || c->b;
        if (!rc)
            rc = ts(s, more ? &T : &Y, d, NT_ALU_MUL, &r, 0);
        if (c->w && !rc) {
            nt_ap W = nt_tile_slice(c->wt, 0, np, 0, w);
            if (!res || !c->wb_loaded)
                rc = load_affine(c, c->w, c->wt, 128, c0, w);
            if (!rc)
                rc = nt_isa_tensor_tensor(k, c->b ? &T : &Y, &T, &W, NT_ALU_MUL, NT_ENGINE_VECTOR);
        }
        if (c->b && !rc) {
            nt_ap B = nt_tile_slice(c->bt, 0, np, 0, w);
            if (!res || !c->wb_loaded)
                rc = load_affine(c, c->b, c->bt, 128, c0, w);
            if (!rc)
                rc = nt_isa_tensor_tensor(k, &Y, &T, &B, NT_ALU_ADD, NT_ENGINE_VECTOR);
        }
        c->wb_loaded = res;
        if (!rc)
            rc = norm_store(c, &Y, c->yc, ooff + c0 * c->on, np, w);
    }
    return rc;
}

/* A row of at most one canonical block (layer and RMS norms of model
 * widths): each sum is one tensor_reduce or activation add-reduce (acc = +0
 * plus the block's partial, nt__red_sum_f32 itself), the per-row steps go
 * to ScalarE (per-partition scalars, one cycle an element) and only the
 * products with w and b to VectorE, and the tiles rotate over NR_RING
 * groups so that one group's chain overlaps the next one's.  The same
 * arithmetic as norm_group, step for step:
 *   negm = s / -D                 (= -(s / D) exactly: rounding is symmetric)
 *   d    = x + negm               (= x - mean exactly: IEEE's a - b is a + -b)
 *   ss   = sum(d * d)             (activation(square) with its add-reduce)
 *   r    = rsqrt(ss / D + eps)
 *   y    = ((d * r) * w) + b      (scalar_tensor_tensor, tensor_tensor)
 * (rms_norm: d = x).  norm_group chained ~20 dependent instructions per
 * group of 128 rows, most on VectorE: [2048, 128] took 44.7 us. */
/* The second half of group b (ring slot): y = d * r (* w) (+ b), rounded at
 * the last step (the others keep f32: T and the scalar_tensor_tensor
 * intermediate are f32), and its store. */
static int norm_short_b(rk *c, int b, int64_t ooff, int np)
{
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    int64_t n = c->n;
    nt_ap T = nt_tile_slice(c->fT[b], 0, np, 0, n), Y = nt_tile_slice(c->fy[b], 0, np, 0, n);
    nt_ap x = nt_tile_slice(c->fx[b], 0, np, 0, n);
    nt_ap r = nt_tile_slice(c->fst, 0, np, NR_ST * b + 3, 1);
    const nt_ap *d = c->op == NT_OP_LAYER_NORM ? &T : &x;
    nt_ap *last = c->b ? &T : &Y;
    int rc;
    if (c->w) {
        nt_ap W = nt_tile_slice(c->wt, 0, np, 0, n);
        rc = nt_isa_scalar_tensor_tensor(k, last, d, &(nt_isa_alu){NT_ALU_MUL, {&r, 0}, false},
                                         NT_ALU_MUL, &W, false, NT_ENGINE_VECTOR);
    } else {
        rc = nt_isa_tensor_scalar(k, last, d, &(nt_isa_alu){NT_ALU_MUL, {&r, 0}, false}, NULL,
                                  c->b ? NT_ENGINE_SCALAR : NT_ENGINE_VECTOR);
    }
    if (!rc && c->b) {
        nt_ap B = nt_tile_slice(c->bt, 0, np, 0, n);
        rc = nt_isa_tensor_tensor(k, &Y, &T, &B, NT_ALU_ADD, NT_ENGINE_VECTOR);
    }
    return rc ? rc : norm_store(c, &Y, c->fc[b], ooff, np, n);
}

/* Runs the second halves still pending (the last groups). */
static int norm_short_flush(rk *c)
{
    int rc = 0;
    for (int i = 0; i < c->npend && !rc; i++)
        rc = norm_short_b(c, c->pb[i], c->po[i], c->pn[i]);
    c->npend = 0;
    return rc;
}

static int norm_group_short(void *ctx, int64_t ioff, int64_t ooff, int np)
{
    rk *c = ctx;
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    bool ln = c->op == NT_OP_LAYER_NORM;
    int64_t n = c->n;
    float D = (float)n;
    int b = c->ng++ % c->nring;
    nt_ap x = nt_tile_slice(c->fx[b], 0, np, 0, n), T = nt_tile_slice(c->fT[b], 0, np, 0, n);
    nt_ap Y = nt_tile_slice(c->fy[b], 0, np, 0, n);
    nt_ap sum = nt_tile_slice(c->fst, 0, np, NR_ST * b, 1);
    nt_ap negm = nt_tile_slice(c->fst, 0, np, NR_ST * b + 1, 1);
    nt_ap ss = nt_tile_slice(c->fst, 0, np, NR_ST * b + 2, 1);
    nt_ap r = nt_tile_slice(c->fst, 0, np, NR_ST * b + 3, 1);
    nt_ap h = sk_hbm_rows(c->xb, c->xdt, ioff, np, c->sc, n, c->sn);
    int rc = nt_isa_dma_copy(k, &x, &h, sk_qin(s));
    const nt_ap *d = &x;
    if (!rc && ln) {
        rc = nt_isa_tensor_reduce(k, &sum, &x, NT_ALU_ADD, 0);
        if (!rc)
            rc = nt_isa_tensor_scalar(k, &negm, &sum, &(nt_isa_alu){NT_ALU_DIV, {NULL, -D}, false},
                                      NULL, NT_ENGINE_SCALAR);
        if (!rc)
            rc = nt_isa_tensor_scalar(k, &T, &x, &(nt_isa_alu){NT_ALU_ADD, {&negm, 0}, false},
                                      NULL, NT_ENGINE_SCALAR);
        d = &T;
    }
    /* the squares go to Y, which the second half overwrites */
    if (!rc)
        rc = nt_isa_activation(k, &Y, NT_ACT_SQUARE, d, NULL, NULL, &ss);
    if (!rc)
        rc = nt_isa_tensor_scalar(k, &r, &ss, &(nt_isa_alu){NT_ALU_DIV, {NULL, D}, false},
                                  &(nt_isa_alu){NT_ALU_ADD, {NULL, c->eps}, false},
                                  NT_ENGINE_SCALAR);
    if (!rc)
        rc = nt_isa_activation(k, &r, NT_ACT_RSQRT, &r, NULL, NULL, NULL);
    if (!rc && !c->wb_loaded) {
        if (c->w)
            rc = load_affine(c, c->w, c->wt, 128, 0, n);
        if (!rc && c->b)
            rc = load_affine(c, c->b, c->bt, 128, 0, n);
        c->wb_loaded = true;
    }
    /* engines run in program order: the second half of the group NR_LAG
     * groups back goes here, so VectorE's products never wait behind this
     * group's ScalarE chain */
    if (!rc && c->npend == NR_LAG) {
        rc = norm_short_b(c, c->pb[0], c->po[0], c->pn[0]);
        memmove(c->pb, c->pb + 1, (NR_LAG - 1) * sizeof *c->pb);
        memmove(c->po, c->po + 1, (NR_LAG - 1) * sizeof *c->po);
        memmove(c->pn, c->pn + 1, (NR_LAG - 1) * sizeof *c->pn);
        c->npend--;
    }
    c->pb[c->npend] = b, c->po[c->npend] = ooff, c->pn[c->npend++] = np;
    return rc;
}

/* ctx: NULL, or the cast's output of a norm with its cast (r->out[0] the
 * f32 output, or NULL when it is not stored) */
static int norm_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    const nt_tensor *x = r->in[0], *cast = ctx;
    nt__rec rr;
    if (cast && !r->out[0]) { /* the cast's output has the f32 output's layout */
        rr = *r;
        rr.out[0] = (nt_tensor *)cast;
        r = &rr;
    }
    rk c;
    sk_rows R;
    rk_begin(&c, s, r, &R, x->ndim - 1, true);
    if (cast) {
        if (r->out[0] == cast)
            c.ob = NULL;
        c.odt = NT_F32;
        c.cb = nt__tensor_data(cast);
        c.cdt = (nt_dtype)cast->dtype;
    }
    c.eps = (float)r->p.f[0];
    c.w = r->in[1];
    c.b = r->op == NT_OP_LAYER_NORM ? r->in[2] : NULL;
    c.fast = c.n <= NT_RED_BLOCK;
    if (c.fast) {
        /* as many groups in flight as 96 KiB per partition holds (a load's
         * fixed cost is 2 us; a group's chain much less) */
        int64_t slot = c.n * (int64_t)(nt__dtype_size(c.xdt) + 4 + nt__dtype_size(c.odt) +
                                       (c.cb ? nt__dtype_size(c.cdt) : 0));
        c.nring = (int)(96 * 1024 / slot);
        c.nring = c.nring < NR_LAG + 2 ? NR_LAG + 2 : c.nring > NR_RING ? NR_RING : c.nring;
        for (int b = 0; b < c.nring; b++) {
            c.fx[b] = sk_tile(s, "norm.x", c.xdt, 128, c.n);
            c.fT[b] = sk_tile(s, "norm.d", NT_F32, 128, c.n);
            c.fy[b] = sk_tile(s, "norm.y", c.odt, 128, c.n);
            if (c.cb)
                c.fc[b] = sk_tile(s, "norm.cast", c.cdt, 128, c.n);
        }
        c.fst = sk_tile(s, "norm.stats", NT_F32, 128, NR_ST * NR_RING);
    } else {
        rk_tiles(&c, false);
        if (c.cb)
            c.yc = sk_tile(s, "norm.cast", c.cdt, 128, RCH);
    }
    if (c.w)
        c.wt = sk_tile(s, "norm.w", (nt_dtype)c.w->dtype, 128, c.fast ? c.n : RCH);
    if (c.b)
        c.bt = sk_tile(s, "norm.b", (nt_dtype)c.b->dtype, 128, c.fast ? c.n : RCH);
    if (!nt_sim_kernel_error(s->k) && !sk_warm_act(s, NT_ACT_RSQRT))
        if (!sk_rows_run(&R, c.fast ? norm_group_short : norm_group, &c) && c.fast)
            norm_short_flush(&c);
    return 0;
}

int nt__sk_norm(const nt__rec *r) { return rows_run_prog(r, norm_prog); }

int nt__sk_norm_fused(sk_k *s, const nt__fgroup *g)
{
    const nt__fprog *P = g->prog;
    const nt__fop *o = &P->ops[0];
    int sy = P->vals[0].store, sc = P->vals[1].store;
    nt__rec r;
    nt__fop_rec(&r, g, o, sy >= 0 ? g->out[sy] : NULL);
    const nt_tensor *x = r.in[0];
    if (sc < 0 && sy < 0)
        return 0; /* nothing is stored (the planner stores the cast's output) */
    if (sc < 0)
        return norm_prog(s, &r, NULL);
    if (nt__numel(x->ndim, x->shape) == 0)
        return 0;
    return norm_prog(s, &r, g->out[sc]);
}

/* ---------------- mse_loss ---------------- */

static int mse_loss_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    const nt_tensor *a = r->in[0], *b = r->in[1], *o = r->out[0];
    nt_sim_kernel *k = s->k;
    int64_t n = nt__numel(a->ndim, a->shape);
    const char *ab = sk_contig_of(s, a), *bb = sk_contig_of(s, b);
    nt_dtype adt = (nt_dtype)a->dtype, bdt = (nt_dtype)b->dtype, odt = (nt_dtype)o->dtype;
    nt_tile *ta[2], *tb[2], *T = sk_tile(s, "mse.d", NT_F32, 128, NT_RED_BLOCK);
    for (int i = 0; i < 2; i++) {
        ta[i] = sk_tile(s, "mse.a", adt, 128, NT_RED_BLOCK);
        tb[i] = sk_tile(s, "mse.b", bdt, 128, NT_RED_BLOCK);
    }
    nt_tile *part = sk_tile(s, "mse.part", NT_F32, 128, 1), *acct = sk_tile(s, "mse.acc", NT_F32, 1, 1);
    nt_tile *yt = sk_tile(s, "mse.y", odt, 1, 1);
    nt_ap acc = nt_tile_ap(acct);
    int rc = nt_isa_memset(k, &acc, 0.0, NT_ENGINE_VECTOR);
    if (!ab || !bb)
        rc = -1;
    /* blocks of 2048 on partitions, their partials folded in order; the
     * last, short block alone */
    int64_t nbf = n / NT_RED_BLOCK, rem = n % NT_RED_BLOCK;
    int t = 0;
    for (int64_t b0 = 0; b0 < nbf + (rem > 0) && !rc; t++) {
        bool tail = b0 >= nbf;
        int np = tail ? 1 : (int)(nbf - b0 < 128 ? nbf - b0 : 128);
        int64_t w = tail ? rem : NT_RED_BLOCK;
        nt_ap A = nt_tile_slice(ta[t & 1], 0, np, 0, w), B = nt_tile_slice(tb[t & 1], 0, np, 0, w);
        nt_ap D = nt_tile_slice(T, 0, np, 0, w), P = nt_tile_slice(part, 0, np, 0, 1);
        nt_ap ha = nt_hbm_ap(ab, adt, b0 * NT_RED_BLOCK, np, NT_RED_BLOCK, w);
        nt_ap hb = nt_hbm_ap(bb, bdt, b0 * NT_RED_BLOCK, np, NT_RED_BLOCK, w);
        if ((rc = nt_isa_dma_copy(k, &A, &ha, sk_qin(s))) ||
            (rc = nt_isa_dma_copy(k, &B, &hb, sk_qin(s))) ||
            (rc = nt_isa_tensor_tensor(k, &D, &A, &B, NT_ALU_SUB, NT_ENGINE_VECTOR)) ||
            (rc = nt_isa_tensor_tensor(k, &D, &D, &D, NT_ALU_MUL, NT_ENGINE_VECTOR)) ||
            (rc = nt_isa_tensor_reduce(k, &P, &D, NT_ALU_ADD, 0)) ||
            (rc = sk_seq_combine(s, &acc, &P, NT_ALU_ADD)))
            break;
        b0 += np;
    }
    if (!rc) {
        nt_ap y = nt_tile_ap(yt);
        rc = ts(s, &y, &acc, NT_ALU_DIV, NULL, (float)n);
        nt_ap out = nt_hbm_ap(nt__tensor_data(o), odt, 0, 1, 1, 1);
        if (!rc)
            nt_isa_dma_copy(k, &out, &y, sk_qout(s));
    }
    return 0;
}

int nt__sk_mse_loss(const nt__rec *r) { return sk_run_prog(r, "mse_loss", mse_loss_prog, NULL); }
