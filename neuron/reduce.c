/* neuron/reduce.c - sum, mean, max, argmax, min, argmin, any, norm over
 * a dim or all.
 *
 * The CPU's arithmetic (cpu/reduce.c) is: the reduced sequence widened to
 * f32, blocks of 2048 in order, acc = +0 (-Inf); acc = op(acc, block
 * partial); mean divides by (float)n; integers sum (wrapping) and max
 * exactly; argmax is the first maximum, the first NaN winning.
 *
 * Over a dim: one row per partition (the innermost batch dim on partitions,
 * the row along the free axis in chunks of CH, a multiple of 2048).  A
 * tensor_reduce over [np, blocks, 2048] gives every block's partial (as
 * op(identity, partial), which changes nothing: see docs/sim.md), and a
 * tensor_tensor_scan folds them into the running accumulator in order.
 * A row whose elements are strided but whose neighbouring rows are adjacent
 * (a bias gradient: [B*T, C] over dim 0) takes the transposed path
 * (red_cols): positions on partitions as contiguous runs of the rows,
 * turned into rows on TensorE, each 2048-block folded as above.
 * A short dim (n <= 64) of a contiguous tensor [O, n, I] takes whole outer
 * blocks per partition instead (red_blocks: one descriptor per partition,
 * one tensor_reduce over [R, I, n] per tile).
 * Over all elements: the blocks go on partitions (128 blocks per tile), and
 * their partials are folded in order across partitions (nc_transpose into a
 * row, then the scan).  argmax: a first pass finds the maximum m, a second
 * marks x == m or x != x and takes the smallest marked index as the
 * maximum of -index (iota) in exact int32.  min/argmin are the same with
 * the minimum.  any and norm follow core/reduce.h's plan: each loaded tile is
 * first mapped elementwise into an f32 (any of ints: i32) tile (x != 0,
 * x*x, |x|, |x|^p: the CPU's nt__ew_* through the ALU and ScalarE), then
 * folded; the finish (sqrt, ^(1/p)) runs on the accumulator. */
#include "neuron/sk.h"

#include <math.h>
#include <string.h>

#include "core/ewise.h"

#define CH 4096 /* elements of a row per tile: two canonical blocks */
#define NPB (CH / NT_RED_BLOCK + 1) /* block partials of a chunk */
/* Result columns in flight: a group's result waits for its store only when
 * the ring comes round, not for the previous group's store. */
#define Y_RING 8
/* The transposed path (red_cols): load slots of 2 KiB per partition, the
 * groups of 128 columns taken together, the positions of the reduced dim
 * one PSUM bank holds, and the result columns that wait for one store. */
#define TX_RING 8
#define TX_SLOT 2048
#define TX_G 1
#define TX_STRIPE 512
#define TX_MAXG 64

typedef struct red {
    sk_k *s;
    int op;
    int rop, pre, fin; /* nt__red_plan */
    nt_alu_op alu;     /* the fold */
    float p;           /* norm: ord */
    bool ints;
    int64_t n, sn, sc, oc;
    nt_dtype xdt, odt;
    char *xb, *ob;
    bool xb_all; /* the dim's one row is the whole tensor: red_all ran */
    nt_tile *x[2], *part, *parti, *scan, *one, *acc, *acci, *mi, *res, *y;
    nt_tile *mask, *mask2, *neg, *cand; /* argmax */
    nt_tile *pre_t;                     /* any, norm: the mapped tile */
    nt_tile *ys[2];                     /* red_blocks: the results */
    int ng;
    int ny;                             /* results written: y's column ring */
    /* the transposed path (red_cols) */
    nt_tile *tx[TX_RING];               /* load slots */
    nt_tile *tb[NT_SIM_PSUM_BANKS];     /* PSUM banks the transposes fill */
    nt_tile *rt[2][TX_G];               /* a block's rows in SBUF (n > one bank) */
    int ntx, ntb, nbanks, nblk;
    int64_t gi[TX_G], go[TX_G];         /* the pending groups: input, output offsets */
    int gn[TX_G], ngp;
    nt_tile *yq;                        /* its pending results */
    int nq, qnp, qcol;
    int64_t qoff;
} red;

static nt_ap col(nt_tile *t, int np) { return nt_tile_slice(t, 0, np, 0, 1); }

/* Column g of the accumulators (the transposed path may fold TX_G groups
 * of rows at once; every other path uses g = 0). */
static nt_ap accg(const red *c, int g, int np)
{
    return nt_tile_slice(c->ints ? c->acci : c->acc, 0, np, g, 1);
}

/* Reduces x [np, m] (m <= CH, starting at a multiple of 2048) into the
 * running accumulator g, [np, 1] (f32 or i32). */
static int fold_chunk_g(red *c, int g, const nt_ap *x, int np, int64_t m, nt_alu_op op)
{
    nt_sim_kernel *k = c->s->k;
    if (c->ints) {
        nt_ap p = col(c->parti, np), a = col(c->acci, np);
        int rc = nt_isa_tensor_reduce(k, &p, x, op, 0);
        return rc ? rc : nt_isa_tensor_tensor(k, &a, &a, &p, op, NT_ENGINE_VECTOR);
    }
    int64_t nbf = m / NT_RED_BLOCK, rem = m % NT_RED_BLOCK, nb = nbf + (rem > 0);
    int64_t p0 = (int64_t)g * NPB;
    int rc = 0;
    if (nbf) {
        nt_ap xb = *x;
        xb.ndim = 2;
        xb.num[0] = nbf, xb.step[0] = NT_RED_BLOCK;
        xb.num[1] = NT_RED_BLOCK, xb.step[1] = 1;
        nt_ap p = nt_tile_slice(c->part, 0, np, p0, nbf);
        rc = nt_isa_tensor_reduce(k, &p, &xb, op, 1);
    }
    if (!rc && rem) {
        nt_ap xr = *x;
        xr.offset += nbf * NT_RED_BLOCK;
        xr.num[0] = rem;
        nt_ap p = nt_tile_slice(c->part, 0, np, p0 + nbf, 1);
        rc = nt_isa_tensor_reduce(k, &p, &xr, op, 0);
    }
    /* acc = op(acc, partial_0); acc = op(acc, partial_1) ...: a scan */
    nt_ap one = nt_tile_slice(c->one, 0, np, 0, 1);
    one.num[0] = nb;
    one.step[0] = 0;
    nt_ap p = nt_tile_slice(c->part, 0, np, p0, nb), sc = nt_tile_slice(c->scan, 0, np, p0, nb);
    nt_ap a = accg(c, g, np), last = nt_tile_slice(c->scan, 0, np, p0 + nb - 1, 1);
    if (!rc)
        rc = nt_isa_tensor_tensor_scan(k, &sc, &one, &p, &(nt_isa_scalar){&a, 0}, NT_ALU_MUL, op);
    return rc ? rc : nt_isa_tensor_copy(k, &a, &last, NT_ENGINE_VECTOR);
}

static int fold_chunk(red *c, const nt_ap *x, int np, int64_t m, nt_alu_op op)
{
    return fold_chunk_g(c, 0, x, np, m, op);
}

static nt_ap hx(const red *c, int64_t off, int np, int64_t m)
{
    return sk_hbm_rows(c->xb, c->xdt, off, np, c->sc, m, c->sn);
}

static int init_acc_g(red *c, int g, int np, nt_alu_op op)
{
    nt_ap a = accg(c, g, np);
    double v = op == NT_ALU_MAX   ? (c->ints ? (double)INT32_MIN : -INFINITY)
               : op == NT_ALU_MIN ? (c->ints ? (double)INT32_MAX : INFINITY)
                                  : 0.0;
    if (c->op == NT_OP_ANY)
        v = 0.0; /* any of nothing is false */
    return nt_isa_memset(c->s->k, &a, v, NT_ENGINE_VECTOR);
}

static int init_acc(red *c, int np, nt_alu_op op) { return init_acc_g(c, 0, np, op); }

/* The element map of any / norm (core/reduce.h): x [np, m] -> the mapped
 * tile, which *out then names; other ops fold x itself. */
static int pre_map(red *c, const nt_ap *x, int np, int64_t m, nt_ap *out)
{
    nt_sim_kernel *k = c->s->k;
    *out = *x;
    if (c->pre == NT_RED_PRE_NONE)
        return 0;
    nt_ap t = nt_tile_slice(c->pre_t, 0, np, 0, m);
    *out = t;
    switch (c->pre) {
    case NT_RED_PRE_NZ:
        return nt_isa_tensor_scalar(k, &t, x, &(nt_isa_alu){NT_ALU_NE, {NULL, 0.0f}, false}, NULL,
                                    NT_ENGINE_VECTOR);
    case NT_RED_PRE_SQ: return nt_isa_tensor_tensor(k, &t, x, x, NT_ALU_MUL, NT_ENGINE_VECTOR);
    case NT_RED_PRE_ABS: return nt_isa_activation(k, &t, NT_ACT_ABS, x, NULL, NULL, NULL);
    case NT_RED_PRE_POW: {
        int rc = nt_isa_activation(k, &t, NT_ACT_ABS, x, NULL, NULL, NULL);
        /* power runs on GpSimd only */
        return rc ? rc : nt_isa_tensor_scalar(k, &t, &t, &(nt_isa_alu){NT_ALU_POW, {NULL, c->p}, false},
                                              NULL, NT_ENGINE_GPSIMD);
    }
    default: return nt_sim_kernel_error(k) ? nt_sim_kernel_error(k) : NT_EINVAL;
    }
}

/* The result [np, 1] of accumulator g into r, rounded once to the output
 * dtype. */
static int finish_to_g(red *c, int g, int np, const nt_ap *rp)
{
    nt_sim_kernel *k = c->s->k;
    nt_ap r = *rp, a = accg(c, g, np);
    int rc;
    if (c->n == 0) {
        /* the CPU's identities: 0, -Inf (INT32_MIN), 0/0, index -1; any:
         * false; norm: its finish of 0 (min, argmin: refused when queued) */
        double v = c->op == NT_OP_SUM    ? 0.0
                   : c->op == NT_OP_MEAN ? NAN
                   : c->op == NT_OP_MAX  ? (c->ints ? (double)INT32_MIN : -INFINITY)
                   : c->op == NT_OP_ANY  ? 0.0
                   : c->op == NT_OP_NORM ? (c->fin == NT_RED_FIN_POW
                                                ? nt__ew_pow_scalar(0.0f, (float)(1.0 / c->p), 0.0f)
                                                : 0.0)
                                         : -1.0;
        rc = nt_isa_memset(k, &r, v, NT_ENGINE_VECTOR);
    } else if (c->rop == NT_RED_ARGMAX || c->rop == NT_RED_ARGMIN) {
        nt_ap b = col(c->res, np);
        rc = nt_isa_tensor_copy(k, &r, &b, NT_ENGINE_VECTOR);
    } else if (c->op == NT_OP_MEAN) {
        rc = nt_isa_tensor_scalar(k, &r, &a, &(nt_isa_alu){NT_ALU_DIV, {NULL, (float)c->n}, false},
                                  NULL, NT_ENGINE_VECTOR);
    } else if (c->fin == NT_RED_FIN_SQRT) {
        rc = nt_isa_activation(k, &r, NT_ACT_SQRT, &a, NULL, NULL, NULL);
    } else if (c->fin == NT_RED_FIN_POW) {
        nt_isa_alu pw = {NT_ALU_POW, {NULL, (float)(1.0 / c->p)}, false};
        rc = nt_isa_tensor_scalar(k, &r, &a, &pw, NULL, NT_ENGINE_GPSIMD);
    } else {
        rc = nt_isa_tensor_copy(k, &r, &a, NT_ENGINE_VECTOR);
    }
    return rc;
}

static int finish_to(red *c, int np, const nt_ap *rp) { return finish_to_g(c, 0, np, rp); }

/* Writes the group's result [np, 1], rounded once to the output dtype. */
static int finish(red *c, int np, int64_t ooff)
{
    nt_sim_kernel *k = c->s->k;
    /* each slot its own 64-byte chunk (the unit of dependency tracking) */
    int64_t slot = (int64_t)(c->ny++ % Y_RING) * (64 / (int64_t)nt__dtype_size(c->odt));
    nt_ap r = nt_tile_slice(c->y, 0, np, slot, 1);
    int rc = finish_to(c, np, &r);
    nt_ap o;
    memset(&o, 0, sizeof o);
    o.hbm = c->ob;
    o.dtype = c->odt;
    o.np = np;
    o.pstep = c->oc;
    o.offset = ooff;
    o.ndim = 1;
    o.num[0] = 1;
    o.step[0] = 1;
    return rc ? rc : nt_isa_dma_copy(k, &o, &r, sk_qout(c->s));
}

/* Can the rows take the transposed path?  A float sum / mean / max / min
 * whose neighbouring rows are adjacent in memory and whose reduced dim is
 * strided: a bias or norm-weight gradient, the sum over the B*T rows of
 * [B*T, C].  Loading the rows on partitions would read one element per
 * descriptor; this path loads blocks of the reduced dim's positions whose
 * partitions are contiguous runs of the rows and turns them on TensorE. */
static bool red_transposed(const red *c)
{
    return !c->ints && c->pre == NT_RED_PRE_NONE &&
           (c->rop == NT_RED_SUM || c->rop == NT_RED_MAX || c->rop == NT_RED_MIN) && c->sc == 1 &&
           c->sn != 1 && c->n >= 1;
}

/* The transposed path's results wait in columns of yq and leave by one DMA
 * per run of consecutive full groups: neighbouring outputs share HBM pages,
 * so a store per group would wait for the one before it. */
static int flush_q(red *c)
{
    if (!c->nq)
        return 0;
    nt_ap src = nt_tile_slice(c->yq, 0, c->qnp, c->qcol, c->nq), o;
    memset(&o, 0, sizeof o);
    o.hbm = c->ob;
    o.dtype = c->odt;
    o.np = c->qnp;
    o.pstep = c->oc;
    o.offset = c->qoff;
    o.ndim = 1;
    o.num[0] = c->nq;
    o.step[0] = 128 * c->oc;
    int rc = nt_isa_dma_copy(c->s->k, &o, &src, sk_qout(c->s));
    c->qcol += c->nq;
    c->nq = 0;
    return rc;
}

/* The column of yq for the result of a group of np rows at output offset
 * ooff: it joins the pending store when it continues it. */
static int q_slot(red *c, int64_t ooff, int np, nt_ap *r)
{
    int rc = 0;
    if (c->nq && (np != c->qnp || c->qnp != 128 || ooff != c->qoff + c->nq * 128 * c->oc ||
                  c->qcol + c->nq == TX_MAXG))
        rc = flush_q(c);
    if (!rc && !c->nq) {
        c->qoff = ooff;
        c->qnp = np;
        if (c->qcol >= TX_MAXG)
            c->qcol = 0; /* round the ring: waits for the first run's store */
    }
    *r = nt_tile_slice(c->yq, 0, np, c->qcol + c->nq, 1);
    c->nq++;
    return rc;
}

/* The transposed path over the pending groups (TX_G groups of at most 128
 * rows, adjacent in memory: W columns in all).  Per block of 2048 positions
 * of the reduced dim (the canonical block) and per stripe of TX_STRIPE
 * positions (one PSUM bank of them): loads of [128 positions, W columns]
 * (up to 2 KiB per partition: several position tiles per load when W is
 * short), nc_transpose of each group's [w, np] piece into the group's bank
 * as [np, w] at the position's column (bits moved as they are), and, when
 * the block is longer than a stripe, ScalarE copies of the banks into the
 * group's SBUF row (copies move values exactly).  Each group's row of the
 * block is then folded exactly as red_group folds a row from SBUF: the same
 * values in the same order, so the CPU's bits.  One group at a time (TX_G
 * 1): its fold on VectorE overlaps the next group's loads, where four
 * groups loaded together (2 KiB runs) left all four folds, 7 us, after the
 * last load. */
static int red_cols(red *c)
{
    int ng = c->ngp;
    c->ngp = 0;
    if (!ng)
        return 0;
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    nt_alu_op op = c->alu;
    int64_t esz = (int64_t)nt__dtype_size(c->xdt);
    int64_t W = (int64_t)(ng - 1) * 128 + c->gn[ng - 1];
    /* position tiles of 128 per load: up to 2 KiB per partition, inside a
     * stripe */
    int64_t tpl = TX_SLOT / (W * esz);
    tpl = tpl < 1 ? 1 : tpl > TX_STRIPE / 128 ? TX_STRIPE / 128 : tpl;
    bool via_sbuf = c->n > TX_STRIPE;
    /* a sum of one block: the fold acc = +0, acc = acc + partial is
     * partial + 0, one tensor_scalar straight into the result column
     * instead of a memset, a scan and two copies on VectorE's critical path
     * per group (same bits: the same addition, rounded once to the output
     * dtype) */
    bool direct = c->op == NT_OP_SUM && c->fin == NT_RED_FIN_NONE && c->n <= NT_RED_BLOCK;
    int rc = 0;
    for (int g = 0; g < ng && !rc && !direct; g++)
        rc = init_acc_g(c, g, c->gn[g], op);
    for (int64_t j0 = 0; j0 < c->n && !rc; j0 += NT_RED_BLOCK) {
        int64_t bw = c->n - j0 < NT_RED_BLOCK ? c->n - j0 : NT_RED_BLOCK;
        int set = c->nblk++ & 1;
        nt_tile *bank[TX_G] = {0};
        for (int64_t s0 = 0; s0 < bw && !rc; s0 += TX_STRIPE) {
            int64_t sw = bw - s0 < TX_STRIPE ? bw - s0 : TX_STRIPE;
            for (int g = 0; g < ng; g++)
                bank[g] = c->tb[c->ntb++ % c->nbanks];
            for (int64_t r0 = s0; r0 < s0 + sw && !rc; r0 += tpl * 128) {
                int64_t rw = s0 + sw - r0 < tpl * 128 ? s0 + sw - r0 : tpl * 128;
                int64_t full = rw / 128, part = rw % 128;
                nt_tile *slot = c->tx[c->ntx++ % TX_RING];
                /* partition p of tile i <- position j0 + r0 + 128 i + p */
                int64_t pos = c->gi[0] + (j0 + r0) * c->sn;
                if (full) {
                    nt_ap d = nt_tile_slice(slot, 0, 128, 0, full * W);
                    d.ndim = 2;
                    d.num[0] = full, d.step[0] = W;
                    d.num[1] = W, d.step[1] = 1;
                    nt_ap h = sk_hbm_rows(c->xb, c->xdt, pos, 128, c->sn, full, 128 * c->sn);
                    h.ndim = 2;
                    h.num[1] = W, h.step[1] = 1;
                    /* loads on all 16 queues: the stores come at the end */
                    rc = nt_isa_dma_copy(k, &d, &h, c->ntx & 1 ? sk_qin(s) : sk_qout(s));
                }
                if (!rc && part) {
                    nt_ap d = nt_tile_slice(slot, 0, (int)part, full * W, W);
                    nt_ap h = sk_hbm_rows(c->xb, c->xdt, pos + full * 128 * c->sn, (int)part, c->sn,
                                          W, 1);
                    rc = nt_isa_dma_copy(k, &d, &h, sk_qin(s));
                }
                for (int64_t i = 0; i < full + (part > 0) && !rc; i++) {
                    int w = i < full ? 128 : (int)part;
                    for (int g = 0; g < ng && !rc; g++) {
                        nt_ap src = nt_tile_slice(slot, 0, w, i * W + (int64_t)g * 128, c->gn[g]);
                        nt_ap dst = nt_tile_slice(bank[g], 0, c->gn[g], r0 - s0 + i * 128, w);
                        rc = nt_isa_nc_transpose(k, &dst, &src);
                    }
                }
            }
            for (int g = 0; g < ng && !rc && via_sbuf; g++) {
                nt_ap src = nt_tile_slice(bank[g], 0, c->gn[g], 0, sw);
                nt_ap dst = nt_tile_slice(c->rt[set][g], 0, c->gn[g], s0, sw);
                rc = nt_isa_tensor_copy(k, &dst, &src, NT_ENGINE_SCALAR);
            }
        }
        for (int g = 0; g < ng && !rc; g++) {
            int np = c->gn[g];
            nt_ap row = via_sbuf ? nt_tile_slice(c->rt[set][g], 0, np, 0, bw)
                                 : nt_tile_slice(bank[g], 0, np, 0, bw);
            if (direct) {
                nt_ap part = nt_tile_slice(c->part, 0, np, (int64_t)g * NPB, 1);
                rc = nt_isa_tensor_reduce(k, &part, &row, op, 0);
            } else {
                rc = fold_chunk_g(c, g, &row, np, bw, op);
            }
        }
    }
    for (int g = 0; g < ng && !rc; g++) {
        nt_ap r;
        int np = c->gn[g];
        rc = q_slot(c, c->go[g], np, &r);
        if (rc)
            break;
        if (direct) {
            nt_ap part = nt_tile_slice(c->part, 0, np, (int64_t)g * NPB, 1);
            rc = nt_isa_tensor_scalar(k, &r, &part, &(nt_isa_alu){NT_ALU_ADD, {NULL, 0.0f}, false},
                                      NULL, NT_ENGINE_VECTOR);
        } else {
            rc = finish_to_g(c, g, np, &r);
        }
    }
    return rc;
}

/* A group of np rows for the transposed path: it joins the pending groups
 * when it continues them in memory, else they run first. */
static int red_group_t(red *c, int64_t ioff, int64_t ooff, int np)
{
    /* pend is in [0, TX_G] (red_cols empties the groups); "> 0" and ">=",
     * not "!= 0" and "==", let GCC see that gn[pend - 1] is read in bounds
     * (with TX_G 1 it is never read; ASan builds warned -Warray-bounds) */
    int rc = 0, pend = c->ngp;
    if (pend > 0 && (pend >= TX_G || c->gn[pend - 1] != 128 ||
                     ioff != c->gi[0] + (int64_t)pend * 128))
        rc = red_cols(c);
    c->gi[c->ngp] = ioff;
    c->go[c->ngp] = ooff;
    c->gn[c->ngp++] = np;
    return rc;
}

/* One group of np rows starting at element offsets ioff (input) and ooff
 * (output). */
static int red_group(void *ctx, int64_t ioff, int64_t ooff, int np)
{
    red *c = ctx;
    if (c->nbanks)
        return red_group_t(c, ioff, ooff, np);
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    nt_alu_op op = c->alu;
    int64_t nch = (c->n + CH - 1) / CH;
    int rc = init_acc(c, np, op);
    nt_ap xt[2];
    for (int64_t ch = 0; ch < nch && !rc; ch++) {
        int64_t c0 = ch * CH, m = c->n - c0 < CH ? c->n - c0 : CH;
        int b = (int)((c->ng + ch) & 1);
        xt[b] = nt_tile_slice(c->x[b], 0, np, 0, m);
        nt_ap h = hx(c, ioff + c0 * c->sn, np, m);
        rc = nt_isa_dma_copy(k, &xt[b], &h, sk_qin(s));
        nt_ap xm;
        if (!rc)
            rc = pre_map(c, &xt[b], np, m, &xm);
        if (!rc)
            rc = fold_chunk(c, &xm, np, m, op);
    }
    if (!rc && (c->rop == NT_RED_ARGMAX || c->rop == NT_RED_ARGMIN)) {
        /* second pass: the smallest index with x == m or x != x, as the
         * maximum of -index (m is the max, or for argmin the min) */
        nt_ap m = col(c->ints ? c->acci : c->acc, np);
        nt_ap best = col(c->res, np);
        rc = nt_isa_memset(k, &best, (double)INT32_MIN, NT_ENGINE_VECTOR);
        for (int64_t ch = 0; ch < nch && !rc; ch++) {
            int64_t c0 = ch * CH, w = c->n - c0 < CH ? c->n - c0 : CH;
            int b = (int)((c->ng + ch) & 1);
            nt_ap x = nt_tile_slice(c->x[b], 0, np, 0, w);
            if (nch > 1) {
                nt_ap h = hx(c, ioff + c0 * c->sn, np, w);
                rc = nt_isa_dma_copy(k, &x, &h, sk_qin(s));
            }
            nt_ap mk = nt_tile_slice(c->mask, 0, np, 0, w), mk2 = nt_tile_slice(c->mask2, 0, np, 0, w);
            nt_ap ng = nt_tile_slice(c->neg, 0, np, 0, w), cd = nt_tile_slice(c->cand, 0, np, 0, w);
            nt_isa_alu eq = {NT_ALU_EQ, {&m, 0}, false};
            if (!rc)
                rc = nt_isa_tensor_scalar(k, &mk, &x, &eq, NULL, NT_ENGINE_VECTOR);
            if (!rc && !c->ints) {
                rc = nt_isa_tensor_tensor(k, &mk2, &x, &x, NT_ALU_NE, NT_ENGINE_VECTOR);
                if (!rc)
                    rc = nt_isa_tensor_tensor(k, &mk, &mk, &mk2, NT_ALU_MAX, NT_ENGINE_VECTOR);
            }
            nt_isa_affine ix = {(int32_t)-c0, 0, {-1, 0, 0, 0}};
            if (!rc)
                rc = nt_isa_iota(k, &ng, &ix);
            nt_ap lo = nt_tile_slice(c->mi, 0, np, 0, 1);
            lo.num[0] = w;
            lo.step[0] = 0;
            if (!rc)
                rc = nt_isa_select(k, &cd, &mk, &ng, &lo, NT_ENGINE_VECTOR);
            nt_ap p = col(c->parti, np);
            if (!rc)
                rc = nt_isa_tensor_reduce(k, &p, &cd, NT_ALU_MAX, 0);
            if (!rc)
                rc = nt_isa_tensor_tensor(k, &best, &best, &p, NT_ALU_MAX, NT_ENGINE_VECTOR);
        }
        if (!rc)
            rc = nt_isa_tensor_scalar(k, &best, &best, &(nt_isa_alu){NT_ALU_MUL, {NULL, -1.0f}, false},
                                      NULL, NT_ENGINE_VECTOR);
    }
    c->ng += (int)nch;
    if (rc)
        return rc;
    return finish(c, np, ooff);
}

/* Integer partials on partitions [np, 1] folded into acc [1, 1] (exact, so
 * any order): transposed into a row and reduced. */
static int int_combine(red *c, const nt_ap *acc, const nt_ap *vals, nt_alu_op op)
{
    nt_sim_kernel *k = c->s->k;
    int np = vals->np;
    nt_tile *tp = nt_tile_alloc(k, "ic.T", NT_MEM_PSUM, NT_I32, 1, np);
    if (!tp)
        return nt_sim_kernel_error(k);
    nt_ap T = nt_tile_ap(tp), t1 = nt_tile_slice(c->parti, 0, 1, 0, 1);
    int rc = nt_isa_nc_transpose(k, &T, vals);
    if (!rc)
        rc = nt_isa_tensor_reduce(k, &t1, &T, op, 0);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, acc, acc, &t1, op, NT_ENGINE_VECTOR);
    nt_tile_release(k, tp);
    return rc;
}

/* sum / mean / max over all n elements of a contiguous sequence: blocks of
 * 2048 on partitions, their partials folded in order. */
static int red_all(red *c)
{
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    nt_alu_op op = c->alu;
    int64_t nbf = c->n / NT_RED_BLOCK, rem = c->n % NT_RED_BLOCK;
    /* one block: its partial is the result (op(identity, partial) is what
     * the fold would give), written straight into the accumulator */
    bool one = !c->ints && nbf + (rem > 0) == 1;
    int rc = one ? 0 : init_acc(c, 1, op);
    nt_ap acc = col(c->ints ? c->acci : c->acc, 1);
    int t = 0;
    for (int64_t b0 = 0; b0 < nbf + (rem > 0) && !rc; t++) {
        bool tail = b0 >= nbf;
        int np = tail ? 1 : (int)(nbf - b0 < 128 ? nbf - b0 : 128);
        int64_t w = tail ? rem : NT_RED_BLOCK;
        nt_ap x = nt_tile_slice(c->x[t & 1], 0, np, 0, w);
        nt_ap h = nt_hbm_ap(c->xb, c->xdt, b0 * NT_RED_BLOCK, np, NT_RED_BLOCK, w);
        rc = nt_isa_dma_copy(k, &x, &h, sk_qin(s));
        nt_ap p = one ? acc : col(c->ints ? c->parti : c->part, np), xm;
        if (!rc && c->pre == NT_RED_PRE_SQ && !c->ints) {
            /* a 2-norm's squares and their block sum in one ScalarE
             * activation: its add-reduce is the canonical sum of the
             * partition's block, the squares x * x as the ALU's */
            nt_ap sq = nt_tile_slice(c->pre_t, 0, np, 0, w);
            rc = nt_isa_activation(k, &sq, NT_ACT_SQUARE, &x, NULL, NULL, &p);
        } else {
            if (!rc)
                rc = pre_map(c, &x, np, w, &xm);
            if (!rc)
                rc = nt_isa_tensor_reduce(k, &p, &xm, op, 0);
        }
        if (!rc && !one)
            rc = c->ints ? int_combine(c, &acc, &p, op) : sk_seq_combine(s, &acc, &p, op);
        b0 += np;
    }
    return rc ? rc : finish(c, 1, 0);
}

/* A float sum / mean / max / min (no element map: not a norm or any) over
 * a dim whose one row is the whole contiguous tensor (a 1-D tensor's mean:
 * a replicated loss over [T*D]): the row's blocks go on partitions as
 * red_all's do, instead of 2048 at a time on one partition (2053 instructions and 1.1 ms for 2M elements,
 * now a few per 128 blocks).  The same arithmetic: blocks of 2048 in
 * order, each block's partial folded into the accumulator in order
 * (core/reduce.h; red_all and red_group are both the CPU's). */
static bool red_one_row(red *c, const nt_tensor *x, const nt_tensor *o)
{
    bool ok = !c->ints && c->pre == NT_RED_PRE_NONE &&
              (c->fin == NT_RED_FIN_NONE || c->fin == NT_RED_FIN_MEAN) &&
              c->n > NT_RED_BLOCK && c->sn == 1 &&
              nt__numel(o->ndim, o->shape) == 1 && c->n == nt__numel(x->ndim, x->shape) &&
              c->rop != NT_RED_ARGMAX && c->rop != NT_RED_ARGMIN && nt__is_contig(x);
    c->xb_all = ok;
    return ok;
}

/* A short reduced dim of a contiguous tensor, seen as [O, n, I] (O the
 * elements of the dims before it, I of those after it): each partition
 * takes R whole outer blocks, R*n*I contiguous elements, in one DMA
 * descriptor (one row per partition would read n elements per descriptor,
 * and a single one when the dim is in the middle: a 2x2 max-pool written
 * as nt_max over a size-2 dim), and one tensor_reduce over the view
 * [R, I, n] (n at step I) gives the R*I results, each reduced like the
 * CPU's reduction of its n elements (n <= 2048: one block; tensor_reduce's
 * acc = identity op partial is the canonical fold).  Float sum, mean, max
 * and min without an element map. */
#define SHORT_N 64
static bool red_short(const red *c, const nt_tensor *x, const nt_tensor *o, int d, int64_t *O,
                      int64_t *I)
{
    if (c->ints || c->pre != NT_RED_PRE_NONE || c->n < 1 || c->n > SHORT_N ||
        (c->rop != NT_RED_SUM && c->rop != NT_RED_MAX && c->rop != NT_RED_MIN) ||
        (c->fin != NT_RED_FIN_NONE && c->op != NT_OP_MEAN) || !nt__is_contig(x) ||
        !nt__is_contig(o))
        return false;
    *O = nt__numel(d, x->shape);
    *I = nt__numel(x->ndim - d - 1, x->shape + d + 1);
    return c->n * *I <= CH;
}

static int red_blocks(red *c, int64_t O, int64_t I)
{
    sk_k *s = c->s;
    nt_sim_kernel *k = s->k;
    int64_t n = c->n, R = CH / (n * I);
    int rc = 0;
    for (int64_t b0 = 0, t = 0; b0 < O && !rc; t++) {
        /* full partitions of R blocks, or a last one with what is left */
        int64_t r = O - b0 >= R ? R : O - b0;
        int np = (int)((O - b0) / r < 128 ? (O - b0) / r : 128);
        nt_ap xt = nt_tile_slice(c->x[t & 1], 0, np, 0, r * n * I);
        nt_ap h = nt_hbm_ap(c->xb, c->xdt, b0 * n * I, np, r * n * I, r * n * I);
        rc = nt_isa_dma_copy(k, &xt, &h, sk_qin(s));
        nt_ap v = xt; /* [r, I, n]: the reduced dim innermost */
        v.ndim = 3;
        v.num[0] = r, v.step[0] = n * I;
        v.num[1] = I, v.step[1] = 1;
        v.num[2] = n, v.step[2] = I;
        nt_ap y = nt_tile_slice(c->ys[t & 1], 0, np, 0, r * I);
        if (c->op == NT_OP_MEAN) {
            nt_ap p = nt_tile_slice(c->pre_t, 0, np, 0, r * I);
            if (!rc)
                rc = nt_isa_tensor_reduce(k, &p, &v, c->alu, 1);
            nt_isa_alu dv = {NT_ALU_DIV, {NULL, (float)n}, false};
            if (!rc)
                rc = nt_isa_tensor_scalar(k, &y, &p, &dv, NULL, NT_ENGINE_VECTOR);
        } else if (!rc) {
            rc = nt_isa_tensor_reduce(k, &y, &v, c->alu, 1);
        }
        nt_ap ho = nt_hbm_ap(c->ob, c->odt, b0 * I, np, r * I, r * I);
        if (!rc)
            rc = nt_isa_dma_copy(k, &ho, &y, sk_qout(s));
        b0 += (int64_t)np * r;
    }
    return rc;
}

/* The reduction's instructions into kernel s, by its plan (nt__red_plan). */
static void red_issue(sk_k *s, const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    red c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.op = r->op;
    nt__red_plan(r->op, r->p.f[0], &c.rop, &c.pre, &c.fin); /* checked by nt__sk_reduce */
    c.alu = c.rop == NT_RED_SUM                               ? NT_ALU_ADD
            : c.rop == NT_RED_MAX || c.rop == NT_RED_ARGMAX ? NT_ALU_MAX
                                                             : NT_ALU_MIN;
    c.p = (float)r->p.f[0];
    c.ints = !nt__dtype_is_float((nt_dtype)x->dtype);
    c.xdt = (nt_dtype)x->dtype;
    c.odt = (nt_dtype)o->dtype;
    c.ob = nt__tensor_data(o);
    nt_dtype adt = c.ints ? NT_I32 : NT_F32;
    for (int b = 0; b < 2; b++)
        c.x[b] = sk_tile(s, "red.x", c.xdt, 128, CH);
    c.part = sk_tile(s, "red.part", NT_F32, 128, TX_G * NPB);
    c.parti = sk_tile(s, "red.parti", NT_I32, 128, 1);
    c.scan = sk_tile(s, "red.scan", NT_F32, 128, TX_G * NPB);
    c.one = sk_tile(s, "red.one", NT_F32, 128, 1);
    c.acc = sk_tile(s, "red.acc", NT_F32, 128, TX_G);
    c.acci = sk_tile(s, "red.acci", NT_I32, 128, 1);
    c.res = sk_tile(s, "red.best", NT_I32, 128, 1);
    c.mi = sk_tile(s, "red.min", NT_I32, 128, 1);
    c.y = sk_tile(s, "red.y", c.odt, 128, Y_RING * 64 / (int64_t)nt__dtype_size(c.odt));
    if (c.pre != NT_RED_PRE_NONE)
        c.pre_t = sk_tile(s, "red.pre", adt, 128, CH);
    if (c.rop == NT_RED_ARGMAX || c.rop == NT_RED_ARGMIN) {
        c.mask = sk_tile(s, "am.mask", adt, 128, CH);
        c.mask2 = sk_tile(s, "am.nan", NT_F32, 128, CH);
        c.neg = sk_tile(s, "am.negidx", NT_I32, 128, CH);
        c.cand = sk_tile(s, "am.cand", NT_I32, 128, CH);
    }
    nt_ap one = nt_tile_ap(c.one), mi = nt_tile_ap(c.mi);
    /* a norm's sqrt table loads while the first tile does */
    if (c.fin == NT_RED_FIN_SQRT)
        sk_warm_act(s, NT_ACT_SQRT);
    nt_isa_memset(s->k, &one, 1.0, NT_ENGINE_GPSIMD);
    nt_isa_memset(s->k, &mi, (double)INT32_MIN, NT_ENGINE_GPSIMD);
    if (!nt_sim_kernel_error(s->k)) {
        if (r->p.dim == NT_DIM_ALL) {
            c.n = nt__numel(x->ndim, x->shape);
            c.xb = (char *)sk_contig_of(s, x);
            c.sn = 1;
            if (!c.xb)
                ;
            else if (c.rop == NT_RED_ARGMAX || c.rop == NT_RED_ARGMIN || c.n == 0)
                red_group(&c, 0, 0, 1); /* one row */
            else
                red_all(&c);
        } else {
            sk_rows R;
            nt__rows_shape(&R, x, r->p.dim, false);
            c.n = R.n;
            c.sn = R.sn;
            c.sc = R.sc;
            c.oc = R.oc;
            c.xb = nt__tensor_data(x);
            int64_t O, I;
            if (red_one_row(&c, x, o)) {
                c.xb = (char *)sk_contig_of(s, x);
                if (c.xb)
                    red_all(&c);
            } else if (red_short(&c, x, o, r->p.dim, &O, &I)) {
                for (int b = 0; b < 2; b++)
                    c.ys[b] = sk_tile(s, "red.ys", c.odt, 128, CH);
                if (c.op == NT_OP_MEAN)
                    c.pre_t = sk_tile(s, "red.pre", NT_F32, 128, CH);
                red_blocks(&c, O, I);
            } else if (red_transposed(&c)) {
                int64_t esz = (int64_t)nt__dtype_size(c.xdt);
                for (int b = 0; b < TX_RING; b++)
                    c.tx[b] = sk_tile(s, "red.xt", c.xdt, 128, TX_SLOT / esz);
                c.nbanks = NT_SIM_PSUM_BANKS;
                for (int b = 0; b < c.nbanks; b++)
                    c.tb[b] = nt_tile_alloc(s->k, "red.T", NT_MEM_PSUM, c.xdt, 128, TX_STRIPE);
                if (c.n > TX_STRIPE)
                    for (int b = 0; b < 2 * TX_G; b++)
                        c.rt[b / TX_G][b % TX_G] = sk_tile(s, "red.row", c.xdt, 128, NT_RED_BLOCK);
                c.yq = sk_tile(s, "red.yq", c.odt, 128, TX_MAXG);
            }
            if (!c.ys[0] && !c.xb_all && !nt_sim_kernel_error(s->k) &&
                !sk_rows_run(&R, red_group, &c) && !red_cols(&c))
                flush_q(&c);
        }
    }
}

int nt__sk_reduce(const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    if (nt__numel(o->ndim, o->shape) == 0)
        return 0;
    int rop, pre, fin;
    if (nt__red_plan(r->op, r->p.f[0], &rop, &pre, &fin))
        return nt__kerr(NT_EINVAL, "op %s is not a reduction", nt__op_name(r->op));
    /* a sum may be one program of a shared kernel (neuron/foreach.c; the
     * planner queues sums with foreach programs, fusion/plan.c) */
    return sk_run_rec(r, r->op == NT_OP_SUM, red_issue);
}

/* ---------------- grad_norms ---------------- */

/* grad_norms: y[j] = nt_norm(in[j], 2) over all of in[j] (f32), each in
 * the norm kernel's arithmetic (red_all): the blocks of 2048 on partitions,
 * each block's sum of squares by one ScalarE Square activation with its
 * canonical add-reduce, the partials folded in order into sum j (+0 first;
 * a single block's partial is the sum), then sqrt.  Across the inputs:
 * four load buffers and two partial tiles in turn (the next input loads
 * and squares while this one folds), a load split by columns over queues
 * when its partitions alone would leave DMA engines idle, the k sums in
 * one row, one sqrt of the row and one store. */
#define GN_BUF 4
typedef struct gn {
    sk_k *s;
    nt_tile *x[GN_BUF], *part[2], *sq, *sums, *y;
    int t;
} gn;

/* Loads [np, w] from h into x, in up to 4 column pieces on their own queues
 * (a transfer takes ceil(np / 8) of the 16 DMA engines). */
static int gn_load(gn *g, const nt_ap *x, const nt_ap *h)
{
    int np = x->np, eng = (np + 7) / 8;
    int64_t w = x->num[0];
    int pieces = 16 / eng;
    if (pieces > 4)
        pieces = 4;
    while (pieces > 1 && w / pieces < 512)
        pieces--;
    int64_t step = (w + pieces - 1) / pieces;
    int rc = 0;
    for (int64_t c0 = 0; c0 < w && !rc; c0 += step) {
        int64_t cw = w - c0 < step ? w - c0 : step;
        nt_ap xs = *x, hs = *h;
        xs.offset += c0, xs.num[0] = cw;
        hs.offset += c0, hs.num[0] = cw;
        rc = nt_isa_dma_copy(g->s->k, &xs, &hs, sk_qin(g->s));
    }
    return rc;
}

/* Sum j of the squares of the n f32 elements at xb. */
static int gn_sum(gn *g, const char *xb, int64_t n, int j)
{
    nt_sim_kernel *k = g->s->k;
    int64_t nbf = n / NT_RED_BLOCK, rem = n % NT_RED_BLOCK, nb = nbf + (rem > 0);
    nt_ap acc = nt_tile_slice(g->sums, 0, 1, j, 1);
    int rc = nb == 1 ? 0 : nt_isa_memset(k, &acc, 0.0, NT_ENGINE_VECTOR);
    for (int64_t b0 = 0; b0 < nb && !rc;) {
        bool tail = b0 >= nbf;
        int np = tail ? 1 : (int)(nbf - b0 < 128 ? nbf - b0 : 128);
        int64_t w = tail ? rem : NT_RED_BLOCK;
        int t = g->t++;
        nt_ap x = nt_tile_slice(g->x[t % GN_BUF], 0, np, 0, w);
        nt_ap h = nt_hbm_ap((void *)xb, NT_F32, b0 * NT_RED_BLOCK, np, NT_RED_BLOCK, w);
        rc = gn_load(g, &x, &h);
        nt_ap p = nb == 1 ? acc : nt_tile_slice(g->part[t & 1], 0, np, 0, 1);
        nt_ap sq = nt_tile_slice(g->sq, 0, np, 0, w);
        if (!rc)
            rc = nt_isa_activation(k, &sq, NT_ACT_SQUARE, &x, NULL, NULL, &p);
        if (!rc && nb > 1)
            rc = sk_seq_combine(g->s, &acc, &p, NT_ALU_ADD);
        b0 += np;
    }
    return rc;
}

/* grad_norms' instructions into kernel s. */
static void norms_issue(sk_k *s, const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    int64_t k = nt__numel(o->ndim, o->shape);
    gn g = {.s = s};
    for (int b = 0; b < GN_BUF; b++)
        g.x[b] = sk_tile(s, "norms.x", NT_F32, 128, NT_RED_BLOCK);
    for (int b = 0; b < 2; b++)
        g.part[b] = sk_tile(s, "norms.part", NT_F32, 128, 1);
    g.sq = sk_tile(s, "norms.sq", NT_F32, 128, NT_RED_BLOCK);
    g.sums = sk_tile(s, "norms.sums", NT_F32, 1, k > 0 ? k : 1);
    g.y = sk_tile(s, "norms.y", (nt_dtype)o->dtype, 1, k > 0 ? k : 1);
    sk_warm_act(s, NT_ACT_SQRT); /* the sqrt table loads while the squares run */
    for (int j = 0; j < k && !nt_sim_kernel_error(s->k); j++) {
        const nt_tensor *x = r->in[j];
        int64_t n = x ? nt__numel(x->ndim, x->shape) : 0;
        if (n == 0) { /* the norm of nothing: sqrt(+0) */
            nt_ap a = nt_tile_slice(g.sums, 0, 1, j, 1);
            nt_isa_memset(s->k, &a, 0.0, NT_ENGINE_VECTOR);
            continue;
        }
        const char *xb = sk_contig_of(s, x);
        if (xb)
            gn_sum(&g, xb, n, j);
    }
    nt_ap sums = nt_tile_slice(g.sums, 0, 1, 0, k), y = nt_tile_slice(g.y, 0, 1, 0, k);
    nt_ap ho = nt_hbm_ap(nt__tensor_data(o), (nt_dtype)o->dtype, 0, 1, k, k);
    if (k > 0 && !nt_sim_kernel_error(s->k) &&
        !nt_isa_activation(s->k, &y, NT_ACT_SQRT, &sums, NULL, NULL, NULL))
        nt_isa_dma_copy(s->k, &ho, &y, sk_qout(s));
}

int nt__sk_grad_norms(const nt__rec *r)
{
    return sk_run_rec(r, true, norms_issue);
}
