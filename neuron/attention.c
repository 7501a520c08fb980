/* neuron/attention.c - scaled dot-product attention on the simulator:
 * one flash-attention tile program per op, the scores never in HBM.
 *
 * Forward, per batch (b, h): q, k and v of the head come into SBUF with a
 * couple of DMAs each (row r of a block at partition r % 128), q and k are
 * transposed on TensorE; then per query block of <= 128 rows (one row per
 * partition) the key blocks stream through TensorE: S = q k^T into PSUM,
 * then on VectorE/ScalarE the scale, the mask (DMA'd block by block:
 * tensor_tensor add, or select on a u8 mask), the causal affine_select, the
 * block max, the online-softmax rescale alpha = exp(m - m_new), P = exp(s -
 * m_new) with its row sum from the same activation, l = l * alpha + sum,
 * P^T on TensorE and P V into PSUM, o = o * alpha + P V.  o / max(l, 1) and
 * the log-sum-exp m + log(max(l, 1)) are the only writes to HBM.
 *
 * Backward, per batch: q, dO (rows and transposes), Dr = rowsum(dO * O) and
 * -lse for the head stay in SBUF, and k, v (rows and transposes); per key
 * block each query block recomputes S and P = exp(s - lse) (lse is final:
 * no running state), dV += P^T dO and dK += dS^T q accumulate in PSUM over
 * the query blocks in ascending order, dP = dO v^T, dS = ((dP - Dr) *
 * scale) * P, and dQ's f32 accumulator in SBUF takes dS k (key blocks in
 * ascending order).
 *
 * Query blocks run G at a time, their instructions interleaved step by step
 * (software pipelining): the engines are in-order, so one block's chain of
 * dependent steps would leave them idle between its steps.  The order of
 * the steps of any one block, and so every value, is unchanged.  With
 * fewer query blocks than G a head, the blocks of several heads fill the
 * slots (heads_in_flight); their row tiles are one tile, so a group's
 * operands load and its results store one DMA each (load_heads,
 * store_heads), and a second set lets the next group load meanwhile.
 *
 * Every instruction computes what cpu/attention.c computes at that step
 * (the same nt__gemm_ktile products, core/ewise.h steps and canonical
 * reductions), so the bits are the CPU's; the simulator charges each
 * instruction its engine and DMA time. */
#include "neuron/sk.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/attn.h"

#define BLK NT_ATTN_BLOCK
#define G 4 /* query blocks in flight */
#define RAW_FWD 3   /* operands a head loads: q, k, v */
#define RAW_BWD 5   /* q, dO, O, k, v */
#define RAW_SLOTS 5
#define LSE_COLS 256 /* (head, query block) columns whose lse waits for one LOG */

typedef struct ak {
    sk_k *s;
    nt_sim_kernel *k;
    nt__attn_geom g;
    nt__attn_opnd q, kk, v, m, dO, O;
    bool has_mask, causal;
    float scale;
    int64_t Tq, Tk, D, Dv;
    int64_t nqb, nkb;
    /* a head's operands in their own dtype, before widening: one slot per
     * operand a head loads (3 forward, 5 backward), so the loads of a head
     * overlap instead of each waiting for the last one's widening copy */
    nt_tile *raw[RAW_SLOTS];
    int nraw_slots, nraw;
    /* elements per partition of a raw slot: the operand of up to as many
     * heads as fill the query-block slots, so a group of heads loads as one
     * DMA and widens as one copy, as an f32 group loads (raw_extra: the
     * SBUF bytes past one head's slots) */
    int64_t raw_cap, raw_extra;
    nt_tile *tp[2];     /* PSUM for transposes, [128, 512] f32 */
    int ntp;
    nt_tile *ninf;      /* [128, 1] of -Inf */
    /* per query block in flight */
    nt_tile *mraw[G];   /* a mask block, [128, BLK] */
    nt_tile *S[G];      /* PSUM scores, [128, BLK] f32 */
    nt_tile *sc[G];     /* SBUF scores / P, [128, BLK] f32 */
} ak;

static nt_ap col(nt_tile *t, int np, int64_t j) { return nt_tile_slice(t, 0, np, j, 1); }

/* A head's columns of a tile the heads in flight share (a head's rows at
 * columns c0..): their loads and stores go as one DMA per operand. */
typedef struct tv {
    nt_tile *t;
    int64_t c0;
} tv;

static nt_ap tvs(tv v, int np, int64_t f0, int64_t nf) { return nt_tile_slice(v.t, 0, np, v.c0 + f0, nf); }

static inline tv tv_at(tv v, int64_t c) { return (tv){v.t, v.c0 + c}; }

static int ts(ak *a, const nt_ap *d, const nt_ap *x, nt_alu_op op, const nt_ap *sap, float imm)
{
    return nt_isa_tensor_scalar(a->k, d, x, &(nt_isa_alu){op, {sap, imm}, false}, NULL,
                                sk_eng(a->s));
}

static int tt(ak *a, const nt_ap *d, const nt_ap *x, const nt_ap *y, nt_alu_op op)
{
    return nt_isa_tensor_tensor(a->k, d, x, y, op, NT_ENGINE_VECTOR);
}

static inline int nblocks(int64_t T) { return (int)((T + BLK - 1) / BLK); }
static inline int bsize(int64_t T, int j) { return (int)(T - (int64_t)j * BLK < BLK ? T - (int64_t)j * BLK : BLK); }

/* Rows [0, T) x [0, nc) of operand x (batch offset boff) -> tile t (f32,
 * [128, nblocks(T) * nc], block j at column j * nc, row r at partition
 * r % 128): one DMA for the full blocks, one for the last, and a widening
 * copy on-chip when x is not f32 (exact). */
static int load_head(ak *a, tv t, const nt__attn_opnd *x, int64_t boff, int64_t T,
                     int64_t nc)
{
    int64_t nfull = T / BLK, tail = T % BLK;
    bool f32 = x->dt == NT_F32;
    int rc = 0;
    for (int part = 0; part < 2 && !rc; part++) {
        int np = part ? (int)tail : BLK;
        int64_t nb = part ? 1 : nfull, c0 = part ? nfull * nc : 0;
        if (np == 0 || nb == 0)
            continue;
        nt_ap h = sk_hbm_rows(x->base, x->dt, boff + (part ? nfull * BLK : 0) * x->rs, np, x->rs, nb * nc,
                       x->cs);
        h.ndim = 2;
        h.num[0] = nb, h.step[0] = BLK * x->rs;
        h.num[1] = nc, h.step[1] = x->cs;
        nt_ap d = tvs(t, np, c0, nb * nc);
        if (f32) {
            rc = nt_isa_dma_copy(a->k, &d, &h, sk_qfree(a->s));
        } else {
            nt_ap r = nt_tile_slice(a->raw[a->nraw % a->nraw_slots], 0, np, c0, nb * nc);
            rc = nt_isa_dma_copy(a->k, &r, &h, sk_qfree(a->s));
            if (!rc)
                rc = nt_isa_tensor_copy(a->k, &d, &r, NT_ENGINE_GPSIMD);
        }
    }
    if (!f32)
        a->nraw++; /* the next operand widens from the next slot */
    return rc;
}

/* tT [nc, T] (f32) = the head's rows t (load_head's layout) transposed: up
 * to 4 blocks per PSUM tile, one evacuating copy each */
static int transpose_head(ak *a, nt_tile *tT, tv t, int64_t T, int64_t nc)
{
    int nb = nblocks(T), rc = 0;
    for (int j0 = 0; j0 < nb && !rc; j0 += 4) {
        nt_tile *p = a->tp[a->ntp++ & 1];
        int64_t w = 0;
        for (int j = j0; j < nb && j < j0 + 4 && !rc; j++) {
            int n = bsize(T, j);
            nt_ap src = tvs(t, n, (int64_t)j * nc, nc);
            nt_ap dst = nt_tile_slice(p, 0, (int)nc, w, n);
            rc = nt_isa_nc_transpose(a->k, &dst, &src);
            w += n;
        }
        nt_ap ps = nt_tile_slice(p, 0, (int)nc, 0, w);
        nt_ap d = nt_tile_slice(tT, 0, (int)nc, (int64_t)j0 * BLK, w);
        if (!rc)
            rc = nt_isa_tensor_copy(a->k, &d, &ps, NT_ENGINE_SCALAR);
    }
    return rc;
}

/* s [Mq, nk] (SBUF f32) = S (PSUM) * scale, then the mask and the causal
 * rule, as cpu/attention.c's scores() */
static int scores(ak *a, int g, const nt_ap *s, const nt_ap *S, int64_t mb, int64_t q0, int Mq,
                  int64_t k0, int nk)
{
    int rc = ts(a, s, S, NT_ALU_MUL, NULL, a->scale);
    if (!rc && a->has_mask) {
        nt_ap mt = nt_tile_slice(a->mraw[g], 0, Mq, 0, nk);
        nt_ap h = sk_hbm_rows(a->m.base, a->m.dt, mb + q0 * a->m.rs + k0 * a->m.cs, Mq, a->m.rs, nk,
                       a->m.cs);
        rc = nt_isa_dma_copy(a->k, &mt, &h, sk_qin(a->s));
        if (!rc && a->m.dt == NT_U8) {
            nt_ap ni = col(a->ninf, Mq, 0);
            ni.num[0] = nk;
            ni.step[0] = 0;
            rc = nt_isa_select(a->k, s, &mt, s, &ni, NT_ENGINE_VECTOR);
        } else if (!rc) {
            rc = tt(a, s, s, &mt, NT_ALU_ADD);
        }
    }
    /* only a block that reaches past its first query's diagonal has
     * anything to mask */
    if (!rc && a->causal && k0 + nk - 1 > q0)
        rc = nt_isa_affine_select(a->k, s, s,
                                  &(nt_isa_affine){(int32_t)(q0 - k0), 1, {-1, 0, 0, 0}},
                                  NT_ALU_GE, -INFINITY);
    return rc;
}

/* whether key block k0 lies wholly after query block [q0, q0+Mq): causal
 * skips it (docs/ops.md §7a) */
static inline bool skip_block(const ak *a, int64_t q0, int Mq, int64_t k0)
{
    return a->causal && k0 > q0 + Mq - 1;
}

static int setup(ak *a, sk_k *s, const nt__rec *r, int64_t raw_elems, int raw_slots, bool packed,
                 int64_t need, int64_t nqb)
{
    memset(a, 0, sizeof *a);
    a->s = s;
    a->k = s->k;
    a->scale = (float)r->p.f[0];
    a->causal = r->p.flag != 0;
    a->has_mask = r->in[3] != NULL && !(packed && r->p.i[4]);
    if (packed && r->p.i[4]) /* the backward's q, k, v in one view */
        nt__attn_geom_of(&a->g, r->in[1]);
    else if (packed)
        nt__attn_geom_flat(&a->g, r->in[0]);
    else
        nt__attn_geom_of(&a->g, r->in[0]);
    if (a->has_mask)
        nt__attn_opnd_of(&a->m, r->in[3], &a->g, 0);
    nt_sim_kernel *k = a->k;
    nt_dtype dt = (nt_dtype)r->in[0]->dtype;
    a->nraw_slots = raw_slots, a->nraw = 0;
    int64_t m = 1, es = (int64_t)nt__dtype_size(dt);
    if (dt != NT_F32) { /* heads_in_flight's first guess, as SBUF allows */
        m = nqb >= G ? 1 : G / (nqb < 1 ? 1 : nqb);
        if (m > a->g.nbatch)
            m = a->g.nbatch < 1 ? 1 : a->g.nbatch;
        while (m > 1 && need + raw_slots * raw_elems * (m - 1) * es > SK_SBUF_BUDGET)
            m--;
    }
    a->raw_cap = raw_elems * m;
    a->raw_extra = raw_slots * raw_elems * (m - 1) * es;
    for (int i = 0; i < raw_slots; i++)
        a->raw[i] = dt != NT_F32 ? sk_tile(s, "attn.raw", dt, BLK, a->raw_cap) : NULL;
    for (int b = 0; b < 2; b++)
        a->tp[b] = nt_tile_alloc(k, "attn.tr", NT_MEM_PSUM, NT_F32, BLK, 4 * BLK);
    for (int g = 0; g < G; g++) {
        a->mraw[g] = a->has_mask ? sk_tile(s, "attn.mask", a->m.dt, BLK, BLK) : NULL;
        a->S[g] = nt_tile_alloc(k, "attn.S", NT_MEM_PSUM, NT_F32, BLK, BLK);
        a->sc[g] = sk_tile(s, "attn.s", NT_F32, BLK, BLK);
    }
    a->ninf = sk_tile(s, "attn.ninf", NT_F32, BLK, 1);
    nt_ap ni = nt_tile_ap(a->ninf);
    return nt_sim_kernel_error(k) ? nt_sim_kernel_error(k)
                                  : nt_isa_memset(k, &ni, -INFINITY, NT_ENGINE_VECTOR);
}

static int too_long(int64_t Tq, int64_t Tk, int64_t bytes)
{
    return nt__kerr(NT_ENOTSUP, "the simulator's attention program keeps a whole head in SBUF: "
                    "Tq = %lld, Tk = %lld need %lld bytes per partition, more than its %d",
                    (long long)Tq, (long long)Tk, (long long)bytes, SK_SBUF_BUDGET);
}

/* Stores tile t (load_head's layout, [128, nblocks(T) * nc], dtype dt) to
 * the contiguous rows [0, T) x [0, nc) at element off of base (row stride
 * ld): one DMA for the full blocks, one for the last. */
static int store_head_at(ak *a, char *base, nt_dtype dt, int64_t off, int64_t ld, tv t,
                         int64_t col0, int64_t T, int64_t nc);
static int store_head(ak *a, char *base, nt_dtype dt, int64_t off, int64_t ld, tv t,
                      int64_t T, int64_t nc)
{
    return store_head_at(a, base, dt, off, ld, t, 0, T, nc);
}

/* store_head from columns col0.. of t */
static int store_head_at(ak *a, char *base, nt_dtype dt, int64_t off, int64_t ld, tv t,
                         int64_t col0, int64_t T, int64_t nc)
{
    int64_t nfull = T / BLK, tail = T % BLK;
    int rc = 0;
    for (int part = 0; part < 2 && !rc; part++) {
        int np = part ? (int)tail : BLK;
        int64_t nb = part ? 1 : nfull, c0 = part ? nfull * nc : 0;
        if (np == 0 || nb == 0)
            continue;
        nt_ap h = sk_hbm_rows(base, dt, off + (part ? nfull * BLK : 0) * ld, np, ld, nb * nc, 1);
        h.ndim = 2;
        h.num[0] = nb, h.step[0] = BLK * ld;
        h.num[1] = nc, h.step[1] = 1;
        nt_ap d = tvs(t, np, col0 + c0, nb * nc);
        rc = nt_isa_dma_copy(a->k, &h, &d, sk_qfree(a->s));
    }
    return rc;
}

/* Whether the nh heads from b0 of operand x (batch geometry g) lie at one
 * stride (*hs) elements apart, so that their rows go as one access
 * pattern. */
static bool heads_uniform(const nt__attn_geom *g, const nt__attn_opnd *x, int64_t b0, int nh,
                          int64_t *hs)
{
    if (nh < 2)
        return false;
    int64_t o0 = nt__attn_boff(x, g, b0);
    *hs = nt__attn_boff(x, g, b0 + 1) - o0;
    for (int h = 2; h < nh; h++)
        if (nt__attn_boff(x, g, b0 + h) - o0 != h * *hs)
            return false;
    return true;
}

/* load_head for the nh heads from b0, head h into t0's columns from h * w
 * (w = nblocks(T) * nc): f32 whole blocks at one stride apart in one DMA,
 * [128 rows, heads, blocks, nc], else head by head (the same bits: a DMA
 * moves them). */
static int load_heads_g(ak *a, const nt__attn_geom *g, tv t0, int64_t w,
                        const nt__attn_opnd *x, int64_t b0, int nh, int64_t T, int64_t nc)
{
    int64_t hs;
    bool f32 = x->dt == NT_F32;
    if ((f32 || nh * w <= a->raw_cap) && T > 0 && T % BLK == 0 &&
        heads_uniform(g, x, b0, nh, &hs)) {
        nt_ap h = sk_hbm_rows(x->base, x->dt, nt__attn_boff(x, g, b0), BLK, x->rs,
                              nh * w, x->cs);
        h.ndim = 3;
        h.num[0] = nh, h.step[0] = hs;
        h.num[1] = T / BLK, h.step[1] = BLK * x->rs;
        h.num[2] = nc, h.step[2] = x->cs;
        nt_ap d = tvs(t0, BLK, 0, nh * w);
        if (f32)
            return nt_isa_dma_copy(a->k, &d, &h, sk_qfree(a->s));
        /* the group into a raw slot, widened by one copy (exact) */
        nt_ap r = nt_tile_slice(a->raw[a->nraw++ % a->nraw_slots], 0, BLK, 0, nh * w);
        int rc = nt_isa_dma_copy(a->k, &r, &h, sk_qfree(a->s));
        return rc ? rc : nt_isa_tensor_copy(a->k, &d, &r, NT_ENGINE_GPSIMD);
    }
    int rc = 0;
    for (int h = 0; h < nh && !rc; h++)
        rc = load_head(a, tv_at(t0, h * w), x, nt__attn_boff(x, g, b0 + h), T, nc);
    return rc;
}

static int load_heads(ak *a, tv t0, int64_t w, const nt__attn_opnd *x, int64_t b0, int nh,
                      int64_t T, int64_t nc)
{
    return load_heads_g(a, &a->g, t0, w, x, b0, nh, T, nc);
}

/* store_head for nh heads, head h from t0's columns h * w (w = nblocks(T)
 * * nc) to element off + h * hs: whole blocks in one DMA. */
static int store_heads(ak *a, char *base, nt_dtype dt, int64_t off, int64_t hs, int64_t ld, tv t0,
                       int64_t w, int nh, int64_t T, int64_t nc)
{
    if (nh > 1 && T > 0 && T % BLK == 0) {
        nt_ap h = sk_hbm_rows(base, dt, off, BLK, ld, nh * w, 1);
        h.ndim = 3;
        h.num[0] = nh, h.step[0] = hs;
        h.num[1] = T / BLK, h.step[1] = BLK * ld;
        h.num[2] = nc, h.step[2] = 1;
        nt_ap d = tvs(t0, BLK, 0, nh * w);
        return nt_isa_dma_copy(a->k, &h, &d, sk_qfree(a->s));
    }
    int rc = 0;
    for (int h = 0; h < nh && !rc; h++)
        rc = store_head(a, base, dt, off + h * hs, ld, tv_at(t0, h * w), T, nc);
    return rc;
}

/* store_heads to operand x (cs 1: a fresh output, x's rows and heads at
 * their strides; nt__attn_opnd_out): the nh heads from b0 in one DMA when
 * they lie at one stride apart, else head by head. */
static int store_heads_x(ak *a, const nt__attn_opnd *x, int64_t b0, tv t0, int64_t w, int nh,
                         int64_t T, int64_t nc)
{
    char *base = (char *)x->base;
    int64_t hs = 0;
    if (nh == 1 || heads_uniform(&a->g, x, b0, nh, &hs))
        return store_heads(a, base, x->dt, nt__attn_boff(x, &a->g, b0), hs, x->rs, t0, w, nh, T,
                           nc);
    int rc = 0;
    for (int h = 0; h < nh && !rc; h++)
        rc = store_head(a, base, x->dt, nt__attn_boff(x, &a->g, b0 + h), x->rs,
                        tv_at(t0, h * w), T, nc);
    return rc;
}

/* ---------------- forward ---------------- */

enum { C_M, C_MNEW, C_BMAX, C_ALPHA, C_NEGM, C_RS, C_L, C_LS, C_T, C_NCOL };

/* a head's widest operand, in elements per partition (the raw loads) */
static int64_t raw_elems(int64_t D, int64_t Dv, int64_t nqb, int64_t nkb)
{
    int64_t w = D > Dv ? D : Dv, nb = nqb > nkb ? nqb : nkb;
    return nb * w;
}

/* SBUF bytes per partition the forward plans with: k^T, q^T, the rows of
 * k, v, q, the output and lse of the head, the raw loads (at most half an
 * f32's size), the blocks in flight */
static int64_t fwd_need(int64_t D, int64_t Dv, int64_t Tq, int64_t Tk)
{
    int64_t nqb = nblocks(Tq), nkb = nblocks(Tk);
    return 4 * (Tk + Tq + nkb * (D + Dv) + nqb * (D + Dv + 1) +
                RAW_FWD * raw_elems(D, Dv, nqb, nkb) / 2 + G * (3 * BLK + Dv + C_NCOL) + 2);
}

/* the backward's: q^T, dO^T, k^T, v^T; the rows of q, dO, O, k, v; dQ's
 * accumulator, Dr, -lse; the head's dq, dk, dv; raw loads; the blocks in
 * flight */
static int64_t bwd_need(int64_t D, int64_t Dv, int64_t Tq, int64_t Tk)
{
    int64_t nqb = nblocks(Tq), nkb = nblocks(Tk);
    return 4 * (2 * Tq + 2 * Tk + nqb * (2 * D + 3 * Dv + 2) + nkb * (2 * D + 2 * Dv) +
                RAW_BWD * raw_elems(D, Dv, nqb, nkb) / 2 + G * 3 * BLK + 2);
}

/* the part of fwd_need one more head in flight adds */
static int64_t fwd_head(int64_t D, int64_t Dv, int64_t Tq, int64_t Tk)
{
    int64_t nqb = nblocks(Tq), nkb = nblocks(Tk);
    return 4 * (Tk + Tq + nkb * (D + Dv) + nqb * (D + Dv));
}

/* the part of bwd_need one more head in flight adds */
static int64_t bwd_head(int64_t D, int64_t Dv, int64_t Tq, int64_t Tk)
{
    int64_t nqb = nblocks(Tq), nkb = nblocks(Tk);
    return 4 * (2 * Tq + 2 * Tk + nqb * (2 * D + 3 * Dv + 2) + nkb * (2 * D + 2 * Dv));
}

/* Heads in flight (*hb): with fewer query blocks than G, the blocks of
 * several heads fill the G slots (a head of one block is a chain of
 * dependent steps that leaves the engines idle); and two sets of their
 * tiles (*nset = 2 * hb) when SBUF has room, so the next group's loads run
 * while this one computes.  need: the SBUF bytes of one head's program,
 * per_head: what another head adds; psum_head: the PSUM bytes another head
 * adds, of psum_spare left free by one head's program. */
static void heads_in_flight(int64_t need, int64_t per_head, int64_t nqb, int64_t nbatch,
                           int64_t psum_head, int64_t psum_spare, int *hb, int *nset)
{
    int64_t h = nqb >= G ? 1 : G / (nqb < 1 ? 1 : nqb);
    if (h > nbatch)
        h = nbatch < 1 ? 1 : nbatch;
    while (h > 1 && (need + (2 * h - 1) * per_head > SK_SBUF_BUDGET ||
                     (h - 1) * psum_head > psum_spare))
        h--;
    *hb = (int)h;
    *nset = need + (2 * h - 1) * per_head <= SK_SBUF_BUDGET ? (int)(2 * h) : (int)h;
}

bool nt__sk_sdpa_fits(int op, const nt__params *p)
{
    int64_t D = p->i[0], Dv = p->i[1], Tq = p->i[2], Tk = p->i[3];
    return (op == NT_OP_SDPA ? fwd_need(D, Dv, Tq, Tk) : bwd_need(D, Dv, Tq, Tk)) <=
           SK_SBUF_BUDGET;
}

/* the steps of one key block for one query block, in order */
enum { F_MM, F_SCORES, F_MAX, F_MNEW, F_SUB, F_ALPHA, F_P, F_L, F_TR, F_TRC, F_PV, F_OA,
       F_OADD, F_NSTEP };

/* A query block in flight: its head b (tile set hs), block i (rows q0,
 * Mq of them), the head's mask offset mb. */
typedef struct fq {
    int64_t q0, b, i, mb;
    int Mq, hs;
    nt_tile *st, *acc, *PT, *pv;
} fq;

/* One head's tiles: k^T, q^T, rows of k, v, q, its output. */
typedef struct fh {
    nt_tile *KT, *QT;
    tv Kr, V, Qr, OT;
} fh;

/* The forward's tiles: nset sets of a head's tiles (hb heads in flight,
 * two groups of them when SBUF has room, so the next group's loads go
 * while this one computes); the lse of a group of HG heads (LS) with their
 * m (LM); per query block in flight its stats, o accumulator, P^T and PSUM
 * for P V. */
typedef struct ft {
    fh h[2 * G];
    int hb, nset;
    nt_tile *LS, *LM;
    int64_t HG;
    fq f[G];
} ft;

static int fwd_tiles(ak *a, ft *T, nt_dtype odt, int rc)
{
    sk_k *s = a->s;
    nt_sim_kernel *k = a->k;
    int64_t D = a->D, Dv = a->Dv, Tq = a->Tq, Tk = a->Tk, nqb = a->nqb, nkb = a->nkb;
    heads_in_flight(fwd_need(D, Dv, Tq, Tk) + a->raw_extra, fwd_head(D, Dv, Tq, Tk), nqb,
                    a->g.nbatch, 0, 0,
                    &T->hb, &T->nset);
    for (int g0 = 0; g0 < T->nset; g0 += T->hb) {
        int hb = T->hb;
        nt_tile *Kr = sk_tile(s, "attn.k", NT_F32, BLK, hb * nkb * D);
        nt_tile *V = sk_tile(s, "attn.v", NT_F32, BLK, hb * nkb * Dv);
        nt_tile *Qr = sk_tile(s, "attn.q", NT_F32, BLK, hb * nqb * D);
        nt_tile *OT = sk_tile(s, "attn.out", odt, BLK, hb * nqb * Dv);
        for (int h = 0; h < hb; h++) {
            fh *x = &T->h[g0 + h];
            x->KT = sk_tile(s, "attn.kT", NT_F32, (int)D, Tk);
            x->QT = sk_tile(s, "attn.qT", NT_F32, (int)D, Tq);
            x->Kr = (tv){Kr, h * nkb * D};
            x->V = (tv){V, h * nkb * Dv};
            x->Qr = (tv){Qr, h * nqb * D};
            x->OT = (tv){OT, h * nqb * Dv};
        }
    }
    /* lse = m + log(max(l, 1)) waits for a group of HG heads: one LOG
     * activation over all of them, not one per head (each switched
     * ScalarE's function table from exp to log and back: 2 us a head) */
    int64_t HG = nqb < 1 || LSE_COLS / nqb < 1 ? 1 : LSE_COLS / nqb;
    if (HG > a->g.nbatch)
        HG = a->g.nbatch < 1 ? 1 : a->g.nbatch;
    if (HG > T->hb) /* whole groups of heads in flight: a group's lse columns are final */
        HG -= HG % T->hb;
    T->HG = HG;
    T->LS = sk_tile(s, "attn.lse", NT_F32, BLK, HG * nqb);
    T->LM = sk_tile(s, "attn.lsem", NT_F32, BLK, HG * nqb);
    if (T->LS && T->LM) { /* rows past a short last block: finite, never stored */
        nt_ap ls0 = nt_tile_ap(T->LS), lm0 = nt_tile_ap(T->LM);
        if (!rc)
            rc = nt_isa_memset(k, &ls0, 1.0, NT_ENGINE_GPSIMD);
        if (!rc)
            rc = nt_isa_memset(k, &lm0, 0.0, NT_ENGINE_GPSIMD);
    }
    for (int g = 0; g < G; g++) {
        T->f[g].st = sk_tile(s, "attn.stats", NT_F32, BLK, C_NCOL);
        T->f[g].acc = sk_tile(s, "attn.o", NT_F32, BLK, Dv);
        T->f[g].PT = sk_tile(s, "attn.pT", NT_F32, BLK, BLK);
        T->f[g].pv = nt_tile_alloc(k, "attn.pv", NT_MEM_PSUM, NT_F32, BLK, Dv);
    }
    return rc;
}

/* Step `step` of query block slot g against key block j (k0, nk keys);
 * mb, the batch's mask offset. */
static int fwd_step(ak *a, const ft *T, int step, int g, int j)
{
    nt_sim_kernel *k = a->k;
    int64_t D = a->D, Dv = a->Dv, k0 = (int64_t)j * BLK;
    int nk = bsize(a->Tk, j);
    const fq *f = &T->f[g];
    const fh *H = &T->h[f->hs];
    int Mq = f->Mq;
    int64_t q0 = f->q0, mb = f->mb;
    nt_tile *st = f->st;
    nt_ap S = nt_tile_slice(a->S[g], 0, Mq, 0, nk);
    nt_ap sc = nt_tile_slice(a->sc[g], 0, Mq, 0, nk);
    nt_ap m = col(st, Mq, C_M), mnew = col(st, Mq, C_MNEW);
    nt_ap bmax = col(st, Mq, C_BMAX), alpha = col(st, Mq, C_ALPHA);
    nt_ap negm = col(st, Mq, C_NEGM), rs = col(st, Mq, C_RS);
    nt_ap l = col(st, Mq, C_L), t = col(st, Mq, C_T);
    nt_ap o_ = nt_tile_slice(f->acc, 0, Mq, 0, Dv);
    nt_ap pT = nt_tile_slice(f->PT, 0, nk, 0, Mq);
    nt_ap PV = nt_tile_slice(f->pv, 0, Mq, 0, Dv);
    nt_ap trp = nt_tile_slice(a->tp[g & 1], 0, nk, (g >> 1) * BLK, Mq);
    int rc;
    switch (step) {
    case F_MM: {
        nt_ap qT = nt_tile_slice(H->QT, 0, (int)D, q0, Mq);
        nt_ap kd = nt_tile_slice(H->KT, 0, (int)D, k0, nk);
        return nt_isa_nc_matmul(k, &S, &qT, &kd, false);
    }
    case F_SCORES: return scores(a, g, &sc, &S, mb, q0, Mq, k0, nk);
    case F_MAX: return nt_isa_tensor_reduce(k, &bmax, &sc, NT_ALU_MAX, 1);
    case F_MNEW: return tt(a, &mnew, &m, &bmax, NT_ALU_MAX);
    case F_SUB:
        if ((rc = tt(a, &t, &m, &mnew, NT_ALU_SUB)))
            return rc;
        return ts(a, &negm, &mnew, NT_ALU_MUL, NULL, -1.0f);
    case F_ALPHA: return nt_isa_activation(k, &alpha, NT_ACT_EXP, &t, NULL, NULL, NULL);
    case F_P:
        return nt_isa_activation(k, &sc, NT_ACT_EXP, &sc, NULL, &(nt_isa_scalar){&negm, 0}, &rs);
    case F_L:
        rc = nt_isa_tensor_scalar(k, &l, &l, &(nt_isa_alu){NT_ALU_MUL, {&alpha, 0}, false},
                                  &(nt_isa_alu){NT_ALU_ADD, {&rs, 0}, false}, NT_ENGINE_VECTOR);
        return rc ? rc : nt_isa_tensor_copy(k, &m, &mnew, NT_ENGINE_GPSIMD);
    case F_TR: return nt_isa_nc_transpose(k, &trp, &sc);
    case F_TRC: return nt_isa_tensor_copy(k, &pT, &trp, NT_ENGINE_SCALAR);
    case F_PV: {
        nt_ap vd = tvs(H->V, nk, (int64_t)j * Dv, Dv);
        return nt_isa_nc_matmul(k, &PV, &pT, &vd, false);
    }
    case F_OA: return ts(a, &o_, &o_, NT_ALU_MUL, &alpha, 0);
    case F_OADD: return tt(a, &o_, &o_, &PV, NT_ALU_ADD);
    }
    return 0;
}

/* Query blocks p0 .. p0+ng of the heads b0.. in flight (block p: head
 * b0 + p / nqb in tile set set0 + p / nqb, its query block p % nqb):
 * state cleared, every key block with their steps interleaved, then out =
 * o / max(l, 1), with max(l, 1) and m kept in the group's lse columns. */
static int fwd_query_blocks(ak *a, ft *T, int64_t b0, int set0, int64_t p0, int ng)
{
    nt_sim_kernel *k = a->k;
    int64_t Dv = a->Dv, nqb = a->nqb;
    int rc = 0;
    for (int g = 0; g < ng && !rc; g++) {
        fq *f = &T->f[g];
        int64_t p = p0 + g;
        f->b = b0 + p / nqb;
        f->hs = set0 + (int)(p / nqb);
        f->i = p % nqb;
        f->mb = a->has_mask ? nt__attn_boff(&a->m, &a->g, f->b) : 0;
        f->q0 = f->i * BLK;
        f->Mq = bsize(a->Tq, (int)f->i);
        nt_ap m = col(f->st, f->Mq, C_M), l = col(f->st, f->Mq, C_L);
        nt_ap o_ = nt_tile_slice(f->acc, 0, f->Mq, 0, Dv);
        if (!(rc = nt_isa_memset(k, &m, -FLT_MAX, NT_ENGINE_VECTOR)) &&
            !(rc = nt_isa_memset(k, &l, 0.0, NT_ENGINE_VECTOR)))
            rc = nt_isa_memset(k, &o_, 0.0, NT_ENGINE_GPSIMD);
    }
    for (int j = 0; j < a->nkb && !rc; j++) {
        int64_t k0 = (int64_t)j * BLK;
        for (int step = 0; step < F_NSTEP && !rc; step++)
            for (int g = 0; g < ng && !rc; g++)
                if (!skip_block(a, T->f[g].q0, T->f[g].Mq, k0))
                    rc = fwd_step(a, T, step, g, j);
    }
    for (int g = 0; g < ng && !rc; g++) {
        const fq *f = &T->f[g];
        int Mq = f->Mq;
        int64_t i = f->i, c = (f->b % T->HG) * nqb + i;
        nt_ap m = col(f->st, Mq, C_M), l = col(f->st, Mq, C_L);
        nt_ap o_ = nt_tile_slice(f->acc, 0, Mq, 0, Dv);
        nt_ap out = tvs(T->h[f->hs].OT, Mq, i * Dv, Dv);
        nt_ap ls = col(T->LS, Mq, c), lm = col(T->LM, Mq, c);
        if ((rc = ts(a, &ls, &l, NT_ALU_MAX, NULL, 1.0f)) ||
            (rc = ts(a, &out, &o_, NT_ALU_DIV, &ls, 0)))
            break;
        rc = nt_isa_tensor_copy(k, &lm, &m, NT_ENGINE_GPSIMD);
    }
    return rc;
}

/* The lse of the group of heads ending at batch b: m + log(max(l, 1)),
 * elementwise as per head, to HBM. */
static int fwd_lse(ak *a, const ft *T, int64_t b, char *ld)
{
    int64_t Tq = a->Tq, nqb = a->nqb;
    int64_t b0 = b - b % T->HG, nh = b - b0 + 1;
    nt_ap ls = nt_tile_slice(T->LS, 0, BLK, 0, nh * nqb);
    nt_ap lm = nt_tile_slice(T->LM, 0, BLK, 0, nh * nqb);
    int rc = nt_isa_activation(a->k, &ls, NT_ACT_LOG, &ls, NULL, NULL, NULL);
    if (!rc)
        rc = tt(a, &ls, &lm, &ls, NT_ALU_ADD);
    /* whole blocks: the group's lse is one run of HBM, column c at c * BLK
     * -- one store (a store per head waited for the one before it on their
     * shared HBM pages) */
    if (!rc && Tq % BLK == 0)
        rc = store_head_at(a, ld, NT_F32, b0 * Tq, 1, (tv){T->LS, 0}, 0, nh * Tq, 1);
    for (int64_t h = 0; h < nh && !rc && Tq % BLK; h++)
        rc = store_head_at(a, ld, NT_F32, (b0 + h) * Tq, 1, (tv){T->LS, 0}, h * nqb, Tq, 1);
    return rc;
}

/* Heads b0 .. b0+nh: k, v, q into tile sets set0.., q and k transposed. */
static int fwd_heads(ak *a, ft *T, int64_t b0, int nh, int set0)
{
    int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, nqb = a->nqb, nkb = a->nkb;
    const fh *H0 = &T->h[set0];
    int rc;
    if ((rc = load_heads(a, H0->Kr, nkb * D, &a->kk, b0, nh, Tk, D)) ||
        (rc = load_heads(a, H0->V, nkb * Dv, &a->v, b0, nh, Tk, Dv)) ||
        (rc = load_heads(a, H0->Qr, nqb * D, &a->q, b0, nh, Tq, D)))
        return rc;
    for (int h = 0; h < nh && !rc; h++) {
        const fh *H = &T->h[set0 + h];
        if (!(rc = transpose_head(a, H->KT, H->Kr, Tk, D)))
            rc = transpose_head(a, H->QT, H->Qr, Tq, D);
    }
    return rc;
}

int nt__sk_sdpa(const nt__rec *r)
{
    const nt_tensor *q = r->in[0], *kt = r->in[1], *vt = r->in[2];
    int64_t Tq = q->shape[q->ndim - 2], D = q->shape[q->ndim - 1];
    int64_t Tk = kt->shape[kt->ndim - 2], Dv = vt->shape[vt->ndim - 1];
    int64_t nqb = nblocks(Tq), nkb = nblocks(Tk);
    int64_t raw = raw_elems(D, Dv, nqb, nkb), need = fwd_need(D, Dv, Tq, Tk);
    if (need > SK_SBUF_BUDGET) /* nt__sk_sdpa_fits sent it to the CPU: unreachable */
        return too_long(Tq, Tk, need);
    sk_k s;
    int rc = sk_begin(&s, "scaled_dot_product_attention");
    if (rc)
        return rc;
    bool values = sk_values_begin(&s); /* NT_SIM_PROGRAM_VALUES */
    if (values && sk_memo_rec(&s, r, false)) /* the same program ran before */
        return sk_end_values(&s, values, 0, r);
    ak a;
    rc = setup(&a, &s, r, raw, RAW_FWD, false, need, nqb);
    a.Tq = Tq, a.Tk = Tk, a.D = D, a.Dv = Dv, a.nqb = nqb, a.nkb = nkb;
    nt__attn_opnd_of(&a.q, q, &a.g, 0);
    nt__attn_opnd_of(&a.kk, kt, &a.g, 0);
    nt__attn_opnd_of(&a.v, vt, &a.g, 0);
    const nt_tensor *o = r->out[0], *lse = r->out[1];
    nt_dtype odt = (nt_dtype)o->dtype;
    char *ld = nt__tensor_data(lse);
    nt__attn_opnd ox; /* o's rows and heads (heads inside rows: Dv apart) */
    nt__attn_opnd_out(&ox, o, &a.g, r->p.i[4]);
    ft T;
    rc = fwd_tiles(&a, &T, odt, rc);
    if (!rc)
        rc = nt_sim_kernel_error(s.k);
    for (int64_t b0 = 0; b0 < a.g.nbatch && !rc; b0 += T.hb) {
        int nh = (int)(a.g.nbatch - b0 < T.hb ? a.g.nbatch - b0 : T.hb);
        int set0 = T.nset > T.hb ? (int)((b0 / T.hb) & 1) * T.hb : 0;
        rc = fwd_heads(&a, &T, b0, nh, set0);
        for (int64_t p0 = 0; p0 < nh * nqb && !rc; p0 += G)
            rc = fwd_query_blocks(&a, &T, b0, set0, p0,
                                  (int)(nh * nqb - p0 < G ? nh * nqb - p0 : G));
        if (!rc)
            rc = store_heads_x(&a, &ox, b0, T.h[set0].OT, nqb * Dv, nh, Tq, Dv);
        for (int64_t b = b0; b < b0 + nh && !rc; b++)
            if (nqb > 0 && (b % T.HG == T.HG - 1 || b + 1 == a.g.nbatch))
                rc = fwd_lse(&a, &T, b, ld);
    }
    return sk_end_values(&s, values, rc, r);
}

/* ---------------- backward ---------------- */

enum { B_MM, B_SCORES, B_P, B_DV, B_DP, B_DS, B_DSP, B_DK, B_TR, B_TRC, B_DQ, B_DQA, B_NSTEP };

/* The backward's tiles: the head's operands (transposes and rows), dQ's
 * f32 accumulator, Dr and -lse, the head's dq, dk, dv in the output dtype;
 * per query block in flight dS, dS^T and PSUM for dP and dQ; PSUM for dK
 * and dV, two key blocks. */
typedef struct bh {
    nt_tile *QT, *GT, *KT, *VT, *dQ, *Dr;
    tv Qr, Gr, Of, Kr, Vr, NL, dQo, dKo, dVo;
} bh;

/* nset sets of a head's tiles, hb heads in flight (as the forward's ft);
 * dK, dV in PSUM per head in flight and key block parity. */
typedef struct bt {
    bh h[2 * G];
    int hb, nset;
    nt_tile *dS[G], *dSt[G], *dPp[G], *dQp[G];
    nt_tile *dKp[G][2], *dVp[G][2];
} bt;

static void bwd_tiles(ak *a, bt *T, nt_dtype dt)
{
    sk_k *s = a->s;
    nt_sim_kernel *k = a->k;
    int64_t D = a->D, Dv = a->Dv, Tq = a->Tq, Tk = a->Tk, nqb = a->nqb, nkb = a->nkb;
    /* PSUM: the transposes' two banks, S and dP per block in flight, dQ's
     * products; what another head adds: its dK and dV for two key blocks;
     * two banks kept free for the packing of tiles into banks */
    int64_t psum = 2 * 4 * BLK * 4 + 2 * G * BLK * 4 + G * D * 4 + 2 * (D + Dv) * 4;
    heads_in_flight(bwd_need(D, Dv, Tq, Tk) + a->raw_extra, bwd_head(D, Dv, Tq, Tk), nqb,
                    a->g.nbatch,
                    2 * (D + Dv) * 4,
                    NT_SIM_PSUM_BANKS * NT_SIM_PSUM_BANK_BYTES - 2 * NT_SIM_PSUM_BANK_BYTES - psum,
                    &T->hb, &T->nset);
    for (int g0 = 0; g0 < T->nset; g0 += T->hb) {
        int hb = T->hb;
        nt_tile *Qr = sk_tile(s, "attn.q", NT_F32, BLK, hb * nqb * D);
        nt_tile *Gr = sk_tile(s, "attn.dO", NT_F32, BLK, hb * nqb * Dv);
        nt_tile *Of = sk_tile(s, "attn.O", NT_F32, BLK, hb * nqb * Dv);
        nt_tile *Kr = sk_tile(s, "attn.k", NT_F32, BLK, hb * nkb * D);
        nt_tile *Vr = sk_tile(s, "attn.v", NT_F32, BLK, hb * nkb * Dv);
        nt_tile *NL = sk_tile(s, "attn.negl", NT_F32, BLK, hb * nqb);
        nt_tile *dQo = sk_tile(s, "attn.dq.out", dt, BLK, hb * nqb * D);
        nt_tile *dKo = sk_tile(s, "attn.dk.out", dt, BLK, hb * nkb * D);
        nt_tile *dVo = sk_tile(s, "attn.dv.out", dt, BLK, hb * nkb * Dv);
        for (int h = 0; h < hb; h++) {
            bh *x = &T->h[g0 + h];
            x->QT = sk_tile(s, "attn.qT", NT_F32, (int)D, Tq);
            x->GT = sk_tile(s, "attn.dOT", NT_F32, (int)Dv, Tq);
            x->KT = sk_tile(s, "attn.kT", NT_F32, (int)D, Tk);
            x->VT = sk_tile(s, "attn.vT", NT_F32, (int)Dv, Tk);
            x->dQ = sk_tile(s, "attn.dq", NT_F32, BLK, nqb * D);
            x->Dr = sk_tile(s, "attn.Dr", NT_F32, BLK, nqb);
            x->Qr = (tv){Qr, h * nqb * D};
            x->Gr = (tv){Gr, h * nqb * Dv};
            x->Of = (tv){Of, h * nqb * Dv};
            x->Kr = (tv){Kr, h * nkb * D};
            x->Vr = (tv){Vr, h * nkb * Dv};
            x->NL = (tv){NL, h * nqb};
            x->dQo = (tv){dQo, h * nqb * D};
            x->dKo = (tv){dKo, h * nkb * D};
            x->dVo = (tv){dVo, h * nkb * Dv};
        }
    }
    for (int g = 0; g < G; g++) {
        T->dS[g] = sk_tile(s, "attn.dS", NT_F32, BLK, BLK);
        T->dSt[g] = sk_tile(s, "attn.dST", NT_F32, BLK, BLK);
        T->dPp[g] = nt_tile_alloc(k, "attn.dP", NT_MEM_PSUM, NT_F32, BLK, BLK);
        T->dQp[g] = nt_tile_alloc(k, "attn.dQp", NT_MEM_PSUM, NT_F32, BLK, D);
    }
    for (int h = 0; h < T->hb; h++)
        for (int i = 0; i < 2; i++) {
            T->dKp[h][i] = nt_tile_alloc(k, "attn.dK", NT_MEM_PSUM, NT_F32, BLK, D);
            T->dVp[h][i] = nt_tile_alloc(k, "attn.dV", NT_MEM_PSUM, NT_F32, BLK, Dv);
        }
}

/* Heads b0 .. b0+nh (tile sets from T): q, dO, k, v as rows and
 * transposes, O as rows, -lse; dQ's accumulators cleared. */
static int bwd_load(ak *a, const bh *T, int64_t b0, int nh, const char *lsed)
{
    nt_sim_kernel *k = a->k;
    int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, nqb = a->nqb, nkb = a->nkb;
    int rc = 0;
    for (int h = 0; h < nh && !rc; h++) {
        nt_ap dqall = nt_tile_ap(T[h].dQ);
        rc = nt_isa_memset(k, &dqall, 0.0, NT_ENGINE_GPSIMD);
    }
    /* -lse: [rows, heads, blocks] of lse's [heads, Tq], one element a run */
    nt__attn_opnd l = {.base = lsed, .dt = NT_F32, .rs = 1, .cs = 1, .nb = 1};
    l.bst[0] = Tq;
    nt__attn_geom lg = {.nb = 1, .nbatch = a->g.nbatch};
    lg.bshape[0] = a->g.nbatch;
    if (!rc)
        rc = load_heads_g(a, &lg, T[0].NL, nqb, &l, b0, nh, Tq, 1);
    if (rc || (rc = load_heads(a, T[0].Qr, nqb * D, &a->q, b0, nh, Tq, D)) ||
        (rc = load_heads(a, T[0].Gr, nqb * Dv, &a->dO, b0, nh, Tq, Dv)) ||
        (rc = load_heads(a, T[0].Of, nqb * Dv, &a->O, b0, nh, Tq, Dv)) ||
        (rc = load_heads(a, T[0].Kr, nkb * D, &a->kk, b0, nh, Tk, D)) ||
        (rc = load_heads(a, T[0].Vr, nkb * Dv, &a->v, b0, nh, Tk, Dv)))
        return rc;
    for (int h = 0; h < nh && !rc; h++) {
        const bh *H = &T[h];
        if ((rc = transpose_head(a, H->QT, H->Qr, Tq, D)) ||
            (rc = transpose_head(a, H->GT, H->Gr, Tq, Dv)) ||
            (rc = transpose_head(a, H->KT, H->Kr, Tk, D)))
            break;
        rc = transpose_head(a, H->VT, H->Vr, Tk, Dv);
    }
    return rc;
}

/* Dr = rowsum(dO * O) (products rounded to f32), -lse; dO * O goes into
 * O's tile. */
static int bwd_drow(ak *a, const bh *T)
{
    nt_sim_kernel *k = a->k;
    int64_t Tq = a->Tq, Dv = a->Dv;
    int rc = 0;
    for (int64_t i = 0; i < a->nqb && !rc; i++) {
        int Mq = bsize(Tq, (int)i);
        nt_ap gr = tvs(T->Gr, Mq, i * Dv, Dv), of = tvs(T->Of, Mq, i * Dv, Dv);
        nt_ap dr = col(T->Dr, Mq, i), nl = tvs(T->NL, Mq, i, 1);
        if ((rc = tt(a, &of, &gr, &of, NT_ALU_MUL)) ||
            (rc = nt_isa_tensor_reduce(k, &dr, &of, NT_ALU_ADD, 1)))
            break;
        rc = ts(a, &nl, &nl, NT_ALU_MUL, NULL, -1.0f);
    }
    return rc;
}

/* Key block j (k0, nk keys) of one head's backward: its slices of k^T,
 * v^T, k's rows and the dK, dV accumulators; firstq, the first query
 * block that reaches it (-1: none); mb, the batch's mask offset; H, the
 * head's tiles. */
typedef struct bkey {
    int j, nk;
    int64_t k0, firstq, mb;
    nt_ap kT, vT, kr, dK, dV;
    const bh *H;
} bkey;

/* Step `step` of query block i (slot g in flight) against key block kb. */
static int bwd_step(ak *a, const bt *TT, const bkey *kb, int step, int g, int64_t i)
{
    nt_sim_kernel *k = a->k;
    const bh *T = kb->H;
    int64_t D = a->D, Dv = a->Dv, q0 = i * BLK;
    int Mq = bsize(a->Tq, (int)i), nk = kb->nk;
    bool first = i == kb->firstq;
    nt_ap S = nt_tile_slice(a->S[g], 0, Mq, 0, nk);
    nt_ap P = nt_tile_slice(a->sc[g], 0, Mq, 0, nk);
    nt_ap dP = nt_tile_slice(TT->dPp[g], 0, Mq, 0, nk);
    nt_ap ds = nt_tile_slice(TT->dS[g], 0, Mq, 0, nk);
    nt_ap dsT = nt_tile_slice(TT->dSt[g], 0, nk, 0, Mq);
    nt_ap dQs = nt_tile_slice(TT->dQp[g], 0, Mq, 0, D);
    nt_ap trp = nt_tile_slice(a->tp[g & 1], 0, nk, (g >> 1) * BLK, Mq);
    switch (step) {
    case B_MM: {
        nt_ap qT = nt_tile_slice(T->QT, 0, (int)D, q0, Mq);
        return nt_isa_nc_matmul(k, &S, &qT, &kb->kT, false);
    }
    case B_SCORES: return scores(a, g, &P, &S, kb->mb, q0, Mq, kb->k0, nk);
    case B_P: {
        nt_ap nl = tvs(T->NL, Mq, i, 1);
        return nt_isa_activation(k, &P, NT_ACT_EXP, &P, NULL, &(nt_isa_scalar){&nl, 0}, NULL);
    }
    case B_DV: {
        nt_ap gr = tvs(T->Gr, Mq, i * Dv, Dv);
        return nt_isa_nc_matmul(k, &kb->dV, &P, &gr, !first);
    }
    case B_DP: {
        nt_ap gT = nt_tile_slice(T->GT, 0, (int)Dv, q0, Mq);
        return nt_isa_nc_matmul(k, &dP, &gT, &kb->vT, false);
    }
    case B_DS: {
        nt_ap dr = col(T->Dr, Mq, i);
        return nt_isa_tensor_scalar(k, &ds, &dP, &(nt_isa_alu){NT_ALU_SUB, {&dr, 0}, false},
                                    &(nt_isa_alu){NT_ALU_MUL, {NULL, a->scale}, false},
                                    NT_ENGINE_VECTOR);
    }
    case B_DSP: return tt(a, &ds, &ds, &P, NT_ALU_MUL);
    case B_DK: {
        nt_ap qr = tvs(T->Qr, Mq, i * D, D);
        return nt_isa_nc_matmul(k, &kb->dK, &ds, &qr, !first);
    }
    case B_TR: return nt_isa_nc_transpose(k, &trp, &ds);
    case B_TRC: return nt_isa_tensor_copy(k, &dsT, &trp, NT_ENGINE_SCALAR);
    case B_DQ: return nt_isa_nc_matmul(k, &dQs, &dsT, &kb->kr, false);
    case B_DQA: {
        nt_ap dqa = nt_tile_slice(T->dQ, 0, Mq, i * D, D);
        return kb->j == 0 ? nt_isa_tensor_copy(k, &dqa, &dQs, NT_ENGINE_SCALAR)
                          : tt(a, &dqa, &dqa, &dQs, NT_ALU_ADD);
    }
    }
    return 0;
}

/* Key block j of heads b0 .. b0+nh (tile sets set0..): every query block
 * of theirs that reaches it, G at a time (block p: head p / nqb, query
 * block p % nqb), their steps interleaved; then each head's dk, dv of the
 * block (zero if no query reached it). */
static int bwd_key_block(ak *a, const bt *T, int j, int64_t b0, int nh, int set0)
{
    nt_sim_kernel *k = a->k;
    int64_t D = a->D, Dv = a->Dv, nqb = a->nqb;
    bkey kb[G];
    int nk = bsize(a->Tk, j);
    int64_t k0 = (int64_t)j * BLK, firstq = -1;
    for (int64_t i = 0; i < nqb && firstq < 0; i++)
        if (!skip_block(a, i * BLK, bsize(a->Tq, (int)i), k0))
            firstq = i;
    for (int h = 0; h < nh; h++) {
        const bh *H = &T->h[set0 + h];
        kb[h] = (bkey){.j = j, .nk = nk, .k0 = k0, .firstq = firstq, .H = H,
                       .mb = a->has_mask ? nt__attn_boff(&a->m, &a->g, b0 + h) : 0};
        kb[h].kT = nt_tile_slice(H->KT, 0, (int)D, k0, nk);
        kb[h].vT = nt_tile_slice(H->VT, 0, (int)Dv, k0, nk);
        kb[h].kr = tvs(H->Kr, nk, (int64_t)j * D, D);
        kb[h].dK = nt_tile_slice(T->dKp[h][j & 1], 0, nk, 0, D);
        kb[h].dV = nt_tile_slice(T->dVp[h][j & 1], 0, nk, 0, Dv);
    }
    int rc = 0;
    int64_t np = nh * nqb;
    for (int64_t p0 = 0; p0 < np && !rc && firstq >= 0; p0 += G) {
        int ng = (int)(np - p0 < G ? np - p0 : G);
        for (int step = 0; step < B_NSTEP && !rc; step++)
            for (int g = 0; g < ng && !rc; g++) {
                int64_t p = p0 + g, i = p % nqb;
                if (!skip_block(a, i * BLK, bsize(a->Tq, (int)i), k0))
                    rc = bwd_step(a, T, &kb[p / nqb], step, g, i);
            }
    }
    for (int h = 0; h < nh && !rc; h++) {
        /* dk, dv of this block */
        const bh *H = &T->h[set0 + h];
        nt_ap o1 = tvs(H->dKo, nk, (int64_t)j * D, D);
        nt_ap o2 = tvs(H->dVo, nk, (int64_t)j * Dv, Dv);
        if (firstq < 0) { /* no query reached this block */
            if (!(rc = nt_isa_memset(k, &o1, 0.0, NT_ENGINE_VECTOR)))
                rc = nt_isa_memset(k, &o2, 0.0, NT_ENGINE_VECTOR);
        } else if (!(rc = nt_isa_tensor_copy(k, &o1, &kb[h].dK, NT_ENGINE_VECTOR))) {
            rc = nt_isa_tensor_copy(k, &o2, &kb[h].dV, NT_ENGINE_SCALAR);
        }
    }
    return rc;
}

/* Heads b0 .. b0+nh: dq (the accumulators in the output dtype), dk and dv
 * to HBM. */
static int bwd_store(ak *a, const bh *T, int64_t b0, int nh, char *dqd, char *dkvd, nt_dtype dt,
                     const nt__attn_opnd *placed)
{
    int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, nqb = a->nqb, nkb = a->nkb;
    int rc = 0;
    for (int h = 0; h < nh; h++)
        for (int64_t i = 0; i < nqb && !rc; i++) {
            int Mq = bsize(Tq, (int)i);
            nt_ap dqa = nt_tile_slice(T[h].dQ, 0, Mq, i * D, D), o1 = tvs(T[h].dQo, Mq, i * D, D);
            rc = nt_isa_tensor_copy(a->k, &o1, &dqa, NT_ENGINE_VECTOR);
        }
    if (placed) { /* where q, k, v lie (p.i[5]) */
        if (!rc)
            rc = store_heads_x(a, &placed[0], b0, T[0].dQo, nqb * D, nh, Tq, D);
        if (!rc)
            rc = store_heads_x(a, &placed[1], b0, T[0].dKo, nkb * D, nh, Tk, D);
        return rc ? rc : store_heads_x(a, &placed[2], b0, T[0].dVo, nkb * Dv, nh, Tk, Dv);
    }
    int64_t kvs = Tk * (D + Dv);
    if (!rc)
        rc = store_heads(a, dqd, dt, b0 * Tq * D, Tq * D, D, T[0].dQo, nqb * D, nh, Tq, D);
    if (!rc)
        rc = store_heads(a, dkvd, dt, b0 * kvs, kvs, D, T[0].dKo, nkb * D, nh, Tk, D);
    if (!rc)
        rc = store_heads(a, dkvd, dt, b0 * kvs + Tk * D, kvs, Dv, T[0].dVo, nkb * Dv, nh, Tk,
                         Dv);
    return rc;
}

int nt__sk_sdpa_bwd(const nt__rec *r)
{
    const nt_tensor *qx = r->in[0], *kv = r->in[1], *lse = r->p.i[4] ? r->in[3] : r->in[2];
    int64_t D = r->p.i[0], Dv = r->p.i[1], Tq = r->p.i[2], Tk = r->p.i[3];
    int64_t nqb = nblocks(Tq), nkb = nblocks(Tk);
    int64_t raw = raw_elems(D, Dv, nqb, nkb), need = bwd_need(D, Dv, Tq, Tk);
    if (need > SK_SBUF_BUDGET) /* nt__sk_sdpa_fits sent it to the CPU: unreachable */
        return too_long(Tq, Tk, need);
    sk_k s;
    int rc = sk_begin(&s, "sdpa_bwd");
    if (rc)
        return rc;
    bool values = sk_values_begin(&s); /* NT_SIM_PROGRAM_VALUES */
    if (values && sk_memo_rec(&s, r, false)) /* the same program ran before */
        return sk_end_values(&s, values, 0, r);
    ak a;
    rc = setup(&a, &s, r, raw, RAW_BWD, true, need, nqb);
    a.Tq = Tq, a.Tk = Tk, a.D = D, a.Dv = Dv, a.nqb = nqb, a.nkb = nkb;
    if (r->p.i[4]) { /* q, k, v in one view, dO, O, lse: read where they are */
        nt__attn_opnd_stack(&a.q, qx, &a.g, 0);
        nt__attn_opnd_stack(&a.kk, qx, &a.g, 1);
        nt__attn_opnd_stack(&a.v, qx, &a.g, 2);
        nt__attn_opnd_of(&a.dO, kv, &a.g, 0);
        nt__attn_opnd_of(&a.O, r->in[2], &a.g, 0);
    } else {
        nt__attn_opnd_flat(&a.q, qx, &a.g, 0, D);
        nt__attn_opnd_flat(&a.dO, qx, &a.g, Tq * D, Dv);
        nt__attn_opnd_flat(&a.O, qx, &a.g, Tq * (D + Dv), Dv);
        nt__attn_opnd_flat(&a.kk, kv, &a.g, 0, D);
        nt__attn_opnd_flat(&a.v, kv, &a.g, Tk * D, Dv);
    }
    const nt_tensor *dq = r->out[0], *dkv = r->p.i[5] ? NULL : r->out[1];
    nt_dtype dt = (nt_dtype)dq->dtype;
    char *dqd = nt__tensor_data(dq), *dkvd = dkv ? nt__tensor_data(dkv) : NULL;
    nt__attn_opnd placed[3]; /* dq, dk, dv into one buffer laid out as q, k, v */
    for (int i = 0; i < 3 && r->p.i[5]; i++)
        nt__attn_opnd_placed(&placed[i], qx, &a.g, i, dq);
    const char *lsed = nt__tensor_data(lse);
    bt T;
    bwd_tiles(&a, &T, dt);
    if (!rc)
        rc = nt_sim_kernel_error(s.k);
    for (int64_t b0 = 0; b0 < a.g.nbatch && !rc; b0 += T.hb) {
        int nh = (int)(a.g.nbatch - b0 < T.hb ? a.g.nbatch - b0 : T.hb);
        int set0 = T.nset > T.hb ? (int)((b0 / T.hb) & 1) * T.hb : 0;
        rc = bwd_load(&a, &T.h[set0], b0, nh, lsed);
        for (int h = 0; h < nh && !rc; h++)
            rc = bwd_drow(&a, &T.h[set0 + h]);
        for (int j = 0; j < nkb && !rc; j++)
            rc = bwd_key_block(&a, &T, j, b0, nh, set0);
        if (!rc)
            rc = bwd_store(&a, &T.h[set0], b0, nh, dqd, dkvd, dt, r->p.i[5] ? placed : NULL);
    }
    return sk_end_values(&s, values, rc, r);
}
