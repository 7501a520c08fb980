/* neuron/tp_matmul.c - the matmul tile program: C[M, N] = A[M, K] . B[K, N].
 *
 * Layout on the core (TensorE computes dst[m, n] = stat[k, m]^T . mov[k, n]):
 *
 *   panel  SBUF [128 k, BM*128 m] per K-tile: A^T for a block of BM M-tiles,
 *          loaded once per block and reused by every N-chunk ("stationary
 *          reuse"); if it cannot stay resident it is streamed per chunk
 *   bring  SBUF [128 k, 512 n] x NB: the moving B tiles, a ring on 8 queues
 *   acc    PSUM [128 m, 512 n] f32 x BM: one bank per M-tile, accumulated
 *          over K-tiles of 128 in ascending order (docs/exactness.md, rule 4)
 *   oring  SBUF [128 m, 512 n] in C's dtype: PSUM rounded once, then stored
 *
 * A given as A^T (a_trans) is loaded straight into the panel.  A given
 * row-major is loaded as [128 m, 512 k] strips, transposed on TensorE
 * (nc_transpose into a PSUM bank) and copied into the panel by VectorE, one
 * K-tile ahead of the matmuls that need it.
 *
 * B given as B^T [N, K] (b_trans: x . w^T with w [N, K] row-major, the
 * linear layer) is loaded as [128 n, 128 k] blocks (rows of w, one DMA per
 * 128 n), transposed on TensorE into the same PSUM transpose bank and copied
 * into the B ring slot by VectorE (GpSimd cannot read PSUM), so the
 * weight never makes a round trip through HBM scratch.  The transposes and
 * copies are exact, so the bits are those of a row-major B.
 *
 * Loop nest (per M-block of BM tiles):
 *   for n-chunk (512):
 *     for k-tile (128, ascending):
 *       [first chunk or streaming] panel[k] <- A^T[k, block]
 *       bring[s] <- B[k, chunk]                      (DMA queues 0-7)
 *       for bm < BM: acc[bm] (+)= panel[k][:, bm]^T . bring[s]   (TensorE)
 *     for bm < BM: oring <- acc[bm] (ScalarE, rounds); C <- oring (queues 12-15)
 * The engines run these in parallel as far as the data allows: loads run
 * ahead by up to NB tiles, evacuation of one chunk overlaps the next.
 *
 * When all of B fits (S_BRES per partition) and there are several M-tiles,
 * run_stream replaces the loop nest: B loaded (B^T turned) once into bres,
 * the M-tiles streaming past it (see there).
 *
 * With args x (a linear layer's weight gradient W = A^T . X beside dX =
 * A . B, A = dY), the streaming program also loads X's rows beside each
 * unit of A's rows and, after an M-tile's own matmuls, turns its A tile as
 * loaded (rows on partitions: W's stationary operand as it stands) against
 * X's rows into W's accumulators, one PSUM bank for the whole program
 * (side_mtile); W leaves at the end (side_finish).  W's K-tiles are the
 * M-tiles, in ascending order: the bits of A^T . X's own program.
 *
 * Functional step (NT_SIM_PROGRAM_GEMM=1, the default).  Every instruction
 * above is issued, checked and timed as written.  The values, though, are
 * computed once for the whole program: C32 = A.B through core/gemm.h over
 * the full M x N, K-tile by K-tile in ascending order -- the recurrence each
 * nc_matmul would run on its 128 x 512 block, so the same bits (gemm.h: a
 * big call equals the same call cut into blocks).  The operand loads,
 * transposes and matmuls then have no functional step (their tiles are the
 * program's own and die with it); each accumulator gets its C32 block when
 * its last K-tile is done, and the evacuation or the caller's epilogue runs
 * functionally as usual.  One big GEMM runs at the host's full GEMM rate
 * instead of per 128 x 512 x 128 instruction.  NT_SIM_PROGRAM_GEMM=0 runs
 * every instruction's own functional step (tests check both give the same
 * bits).  A C that overlaps A or B always runs per instruction. */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/gemm.h"
#include "core/reduce.h"
#include "sim/sim.h"

enum {
    TM = 128, /* M rows per tile (stationary free size) */
    TK = 128, /* K per matmul (partitions) */
    TN = 512, /* N per matmul (moving free size, one PSUM bank of f32) */
    NB = 8,   /* B ring slots */
    STRIP_KT = 4, /* K-tiles per row-major A strip */
    BT_KT = 4,    /* K-tiles per staged block of B^T rows */
    BT_SETS = 2,  /* staged blocks of B^T in flight */
    Q_B0 = 0, Q_BN = 8,  /* B loads: queues 0-7 */
    Q_A0 = 8, Q_AN = 4,  /* A loads: queues 8-11 */
    Q_C0 = 12, Q_CN = 4, /* C stores: queues 12-15 */
    /* the streaming program: B's one load, A's loads (the epilogue's
     * stores take 8-15) */
    QS_B0 = 0, QS_BN = 4, QS_A0 = 4, QS_AN = 4,
    S_SLOT = 2048,  /* bytes per partition a streaming load aims for */
    S_NS = 3,       /* A load slots: two loads ahead of the one in use */
    SIDE_NS = 1,    /* more of them with W beside (args x) */
    S_BRES = 64 * 1024, /* the most of B per partition it keeps */
    S_BTS = 8,          /* the most row blocks of B^T staged at once */
};

typedef struct mm {
    nt_sim_kernel *k;
    const nt_tile_matmul_args *a;
    int64_t esz, csz;
    int64_t nm, nk, nn;
    int BM;            /* M-tiles per block */
    bool resident;     /* panel holds every K-tile of the block */
    int NP;            /* panel slots */
    int NO;            /* output ring slots */
    int nb;            /* B ring slots: NB, or up to 2 NB (plan) */
    nt_tile *panel, *bring, *oring, *acc[NT_SIM_PSUM_BANKS];
    nt_tile *strip[2]; /* row-major A: [128 m, BM * STRIP_KT*128 k] x 2 */
    nt_tile *tpsum;    /* row-major A or B^T: transpose slots, one bank */
    nt_tile *bstage;   /* B^T: BT_SETS x (TN / TM) x [128 n, BT_KT * 128 k], rows of B^T
                          before their transpose */
    int64_t bsnext;
    int bset;          /* the stage set of the current K-group */
    int tslots, tnext;
    int qb, qa, qc;
    int64_t bnext, onext;
    const float *c32; /* the program-level product [M, N], or NULL */
    /* the output store not issued yet: rows r0 .. r0+mw, columns n0 ..
     * n0+nw of C from oring columns oo .. (nw == 0: none) */
    int64_t st_r0, st_mw, st_n0, st_nw, st_oo;
    double st_ready;     /* when its last chunk is in the ring */
    double dma_fixed_ns; /* a DMA's fixed cost (nt_sim_config) */
    /* the streaming program (run_stream) */
    bool stream;
    nt_tile *bres;       /* all of B: K-tile kt at columns kt * nstep */
    nt_tile *abuf;       /* row-major A: NS slots of G M-tiles [128 m, G * K] */
    int G, NS, nacc;
    /* steps (elements) between bres's K-tiles, abuf's slots and bstage's
     * sets, each a whole number of NT__SIM_ALIGN bytes (step); bts: the
     * stage sets of B^T rows */
    int64_t nstep, astep, bstep;
    int bts;
    int64_t naccn;
    int64_t bprev; /* run: the B ring offset of the previous K-tile */
    bool dr;       /* fp8 operands on a target with the double-row mode */
    /* a_colsum (cs_tile): lanes [128 k, nk * 16], sums [128 k, nk]; cs_on:
     * the block program loads the panel for its first N-chunk */
    nt_tile *cs_lane, *cs_acc;
    nt_tile *cs_out; /* the sums in a_colsum_dtype (not f32), or NULL */
    bool cs, cs_on;
    /* the weight gradient beside it (args x, run_stream): X's row tiles
     * [128 m, G * NX] x NS beside abuf's, W's accumulators (one PSUM bank,
     * K-tile kt at columns kt * NX), W's output slots [128 k, NX] x 2 */
    nt_tile *xbuf, *accw, *wout;
    bool side;
} mm;

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int next_q(int *q, int base, int n)
{
    int r = base + *q;
    *q = (*q + 1) % n;
    return r;
}

/* B's loads: of queues base..base+n-1 the one that frees up first, the
 * rotation's on a tie.  In a captured program the small kernels before a
 * matmul leave loads on some of those queues that wait for their inputs
 * (a loss's rows wait for the logits), and B (a weight, ready from the
 * start) queued behind them on the rotation while other queues of its
 * eight sat idle: the main job's MLP, tests/test_mlpsim.c. */
static int b_queue(const nt_sim_kernel *k, int *q, int base, int n)
{
    int r = next_q(q, base, n);
    for (int i = base; i < base + n; i++)
        if (k->q_free[i] < k->q_free[r])
            r = i;
    return r;
}

/* Elements of n of size esz rounded up to whole NT__SIM_ALIGN bytes.  The
 * streaming program's regions that separate DMAs fill (bres's K-tiles,
 * abuf's slots, bstage's sets) start on such a boundary: the simulator
 * tracks SBUF by NT__SIM_CHUNK bytes, and two regions sharing a chunk made
 * each load wait for the one before it or for the reads of the region
 * beside it -- B^T's rows of K = 300 bf16 (600 bytes) one 2 us DMA after
 * another, the stage set's transposes between (tests/test_gpt2.c). */
static int64_t step(int64_t n, int64_t esz)
{
    return (n * esz + NT__SIM_ALIGN - 1) / NT__SIM_ALIGN * NT__SIM_ALIGN / esz;
}

/* bytes per partition the program needs for a block of BM tiles */
static int64_t need_bytes(const mm *p, int BM, int NP)
{
    int64_t align = NT__SIM_ALIGN * 8;
    int64_t b = (p->nb ? p->nb : NB) * TN * p->esz + (int64_t)(BM + 2) * TN * p->csz +
                (int64_t)NP * BM * TM * p->esz + align;
    if (!p->a->a_trans)
        b += 2 * (int64_t)BM * STRIP_KT * TK * p->esz;
    if (p->a->b_trans)
        b += (int64_t)BT_SETS * (TN / TM) * BT_KT * TK * p->esz;
    return b;
}

static nt_ap sl(nt_tile *t, int np, int64_t f0, int64_t nf)
{
    return nt_tile_slice(t, 0, np, f0, nf);
}

/* Whether K-tiles kt and kt + 1 go to TensorE as one fp8 double-row
 * instruction (nt_isa_nc_matmul_dr, trn2): both full, fp8 operands, a
 * target whose fp8 rate is twice bf16's.  The values are those of two
 * instructions in K order, so the bits do not change. */
static bool dr_pair(const mm *p, int64_t kt)
{
    return p->dr && (kt + 2) * TK <= p->a->K;
}

/* a [np, 2, n] pattern: x and the same rows `step` elements further */
static nt_ap dr_ap(nt_ap x, int64_t step)
{
    x.ndim = 2;
    x.num[1] = x.num[0], x.step[1] = x.step[0];
    x.num[0] = 2, x.step[0] = step;
    return x;
}

/* panel slot of K-tile kt */
static int64_t slot_off(const mm *p, int64_t kt)
{
    return (p->resident ? kt : kt % p->NP) * (int64_t)p->BM * TM;
}

/* ---------------- column sums of A (a_colsum) ----------------
 *
 * Row-major A reaches the panel turned: a K-tile's columns of A on
 * partitions, an M-tile's rows along the free axis -- the layout a sum over
 * the rows wants.  Each column is summed in the one reduction order
 * (core/reduce.h): row m of a 2048-row block goes to lane m % 16 of its
 * column, each lane adds its rows in order from +0, and at the block's end
 * the lanes fold in halves (8, 4, 2, 1) and acc[k] += lane 0 (acc from +0):
 * nt__red_sum_f32's additions in its order, so its bits.  One GpSimd add per
 * 16 rows covers every lane of the K-tiles of the call; GpSimd, idle in a
 * matmul, keeps them off VectorE's PSUM copies.  A bf16 or f16 A is added
 * from its panel as it is, each element widened exactly into the f32 lanes,
 * and the f32 sums are rounded once to a_colsum_dtype at the end: the
 * arithmetic of the sum op run alone on the same A (cpu/reduce.c: widened
 * to f32, summed in the one order, rounded once to the output). */

/* M-tile rows m0 .. m0+mw of K-tiles kt0 .. kt0+nkt (all of one width),
 * K-tile kt's rows at panel column off + (kt - kt0) * kstep. */
static int cs_tile(mm *p, int64_t m0, int64_t mw, int64_t kt0, int64_t nkt, int64_t off,
                   int64_t kstep)
{
    nt_sim_kernel *k = p->k;
    const nt_tile_matmul_args *a = p->a;
    int kw = (int)min64(TK, a->K - kt0 * TK);
    int64_t b0 = m0 / NT_RED_BLOCK * NT_RED_BLOCK, bend = min64(b0 + NT_RED_BLOCK, a->M);
    nt_ap ln = sl(p->cs_lane, kw, kt0 * NT_RED_LANES, nkt * NT_RED_LANES);
    ln.ndim = 2;
    ln.num[0] = nkt, ln.step[0] = NT_RED_LANES;
    ln.num[1] = NT_RED_LANES, ln.step[1] = 1;
    int rc = m0 == b0 ? nt_isa_memset(k, &ln, 0.0, NT_ENGINE_GPSIMD) : 0;
    for (int64_t q = 0; q < mw && !rc; q += NT_RED_LANES) {
        int64_t w = min64(NT_RED_LANES, mw - q);
        nt_ap d = ln, x = sl(p->panel, kw, off + q, (nkt - 1) * kstep + w);
        d.num[1] = w;
        x.ndim = 2;
        x.num[0] = nkt, x.step[0] = kstep;
        x.num[1] = w, x.step[1] = 1;
        rc = nt_isa_tensor_tensor(k, &d, &d, &x, NT_ALU_ADD, NT_ENGINE_GPSIMD);
    }
    if (rc || m0 + mw != bend)
        return rc;
    for (int h = NT_RED_LANES / 2; h >= 1 && !rc; h /= 2) {
        nt_ap lo = ln, hi = ln;
        lo.num[1] = hi.num[1] = h;
        hi.offset += h;
        rc = nt_isa_tensor_tensor(k, &lo, &lo, &hi, NT_ALU_ADD, NT_ENGINE_GPSIMD);
    }
    nt_ap acc = sl(p->cs_acc, kw, kt0, nkt), l0 = ln;
    l0.ndim = 1;
    l0.num[0] = nkt, l0.step[0] = NT_RED_LANES;
    return rc ? rc : nt_isa_tensor_tensor(k, &acc, &acc, &l0, NT_ALU_ADD, NT_ENGINE_GPSIMD);
}

/* Every K-tile of M-tile rows m0 .. m0+mw, K-tile kt at panel column so +
 * kt * kstep: the full K-tiles in one pass, a narrower last one alone. */
static int cs_mtile(mm *p, int64_t m0, int64_t mw, int64_t so, int64_t kstep)
{
    int64_t full = p->a->K / TK;
    int rc = full ? cs_tile(p, m0, mw, 0, full, so, kstep) : 0;
    if (!rc && full < p->nk)
        rc = cs_tile(p, m0, mw, full, 1, so + full * kstep, 0);
    return rc;
}

/* Column c of A (rows M, row stride lda, in_dtype) summed as
 * nt__red_sum_f32 sums f32 values: each element widened to f32 first (exact
 * for bf16 and f16), the widened column staged in col (M floats) when A is
 * not f32. */
static float cs_column(const nt_tile_matmul_args *a, int64_t c, float *col)
{
    if (a->in_dtype == NT_F32)
        return nt__red_sum_f32((const float *)a->a + c, a->M, a->lda);
    for (int64_t m = 0; m < a->M; m++)
        col[m] = nt__load_f32(a->a, a->in_dtype, m * a->lda + c);
    return nt__red_sum_f32(col, a->M, 1);
}

/* The sums to HBM (a_colsum[kt * 128 + k] from partition k, column kt),
 * rounded once to a_colsum_dtype on the way (a tensor_copy from the f32
 * sums, the rounding every op's store makes: the lone sum's bits).  With
 * the program-level product the panel was never filled (the loads and adds
 * were timed only): the sums are computed here, as the accumulators get
 * theirs (deliver), by nt__red_sum_f32 itself. */
static int cs_store(mm *p)
{
    nt_sim_kernel *k = p->k;
    const nt_tile_matmul_args *a = p->a;
    int rc = 0;
    if (p->c32) {
        float *col = a->in_dtype == NT_F32 ? NULL : malloc((size_t)a->M * sizeof(float));
        if (a->in_dtype != NT_F32 && !col)
            return nt__sim_fail(k, "nt_tile_matmul", "out of host memory for the column sums");
        nt__sim_fx_flush(k);
        for (int64_t kt = 0; kt < p->nk; kt++) {
            int kw = (int)min64(TK, a->K - kt * TK);
            nt_ap d = sl(p->cs_acc, kw, kt, 1);
            for (int r = 0; r < kw; r++) {
                float v = nt__canon(cs_column(a, kt * TK + r, col)); /* the NaN every store makes */
                memcpy(nt__sim_row(&d, r), &v, sizeof v);
            }
        }
        free(col);
    }
    nt_tile *out = p->cs_acc;
    if (p->cs_out) {
        nt_ap d = nt_tile_ap(p->cs_out), s = nt_tile_ap(p->cs_acc);
        rc = nt_isa_tensor_copy(k, &d, &s, NT_ENGINE_GPSIMD);
        out = p->cs_out;
    }
    for (int64_t kt0 = 0; kt0 < p->nk && !rc;) {
        int kw = (int)min64(TK, a->K - kt0 * TK);
        int64_t nkt = kw == TK ? a->K / TK - kt0 : 1;
        nt_ap src = sl(out, kw, kt0, nkt), dst;
        memset(&dst, 0, sizeof dst);
        dst.hbm = a->a_colsum;
        dst.dtype = a->a_colsum_dtype;
        dst.np = kw;
        dst.pstep = 1;
        dst.offset = kt0 * TK;
        dst.ndim = 1;
        dst.num[0] = nkt, dst.step[0] = TK;
        rc = nt_isa_dma_copy(k, &dst, &src, next_q(&p->qc, Q_C0, Q_CN));
        kt0 += nkt;
    }
    return rc;
}

/* Fills the panel slot of K-tile kt for M-block mb (rows m0.., mt tiles). */
static int load_panel(mm *p, int64_t kt, int64_t m0, int mt)
{
    const nt_tile_matmul_args *a = p->a;
    int64_t k0 = kt * TK, kw = min64(TK, a->K - k0);
    int64_t mtot = min64((int64_t)mt * TM, a->M - m0);
    int64_t so = slot_off(p, kt);
    if (a->a_trans) {
        /* A^T[k0:k0+kw, m0:m0+mtot] -> panel[0:kw, slot] in one DMA */
        nt_ap src = nt_hbm_ap(a->a, a->in_dtype, k0 * a->lda + m0, kw, a->lda, mtot);
        nt_ap dst = sl(p->panel, (int)kw, so, mtot);
        return nt_isa_dma_copy(p->k, &dst, &src, next_q(&p->qa, Q_A0, Q_AN));
    }
    /* row-major A: a strip holds STRIP_KT K-tiles of every M-tile of the block */
    int64_t strip = kt / STRIP_KT, sk0 = strip * STRIP_KT * TK;
    int64_t skw = min64((int64_t)STRIP_KT * TK, a->K - sk0);
    nt_tile *st = p->strip[strip % 2];
    int64_t scols = (int64_t)STRIP_KT * TK;
    if (kt % STRIP_KT == 0) {
        for (int bm = 0; bm < mt; bm++) {
            int64_t r0 = m0 + (int64_t)bm * TM, mw = min64(TM, a->M - r0);
            nt_ap src = nt_hbm_ap(a->a, a->in_dtype, r0 * a->lda + sk0, mw, a->lda, skw);
            nt_ap dst = sl(st, (int)mw, bm * scols, skw);
            int rc = nt_isa_dma_copy(p->k, &dst, &src, next_q(&p->qa, Q_A0, Q_AN));
            if (rc)
                return rc;
        }
    }
    for (int bm = 0; bm < mt; bm++) {
        int64_t r0 = m0 + (int64_t)bm * TM, mw = min64(TM, a->M - r0);
        int slot = p->tnext;
        p->tnext = (p->tnext + 1) % p->tslots;
        /* [mw, kw] strip piece -> [kw, mw] in PSUM -> panel */
        nt_ap src = sl(st, (int)mw, bm * scols + (k0 - sk0), kw);
        nt_ap tp = sl(p->tpsum, (int)kw, (int64_t)slot * TM, mw);
        int rc = nt_isa_nc_transpose(p->k, &tp, &src);
        if (rc)
            return rc;
        nt_ap dst = sl(p->panel, (int)kw, so + (int64_t)bm * TM, mw);
        rc = nt_isa_tensor_copy(p->k, &dst, &tp, NT_ENGINE_VECTOR);
        if (!rc && p->cs && p->cs_on && !p->resident)
            rc = cs_tile(p, r0, mw, kt, 1, so + (int64_t)bm * TM, 0);
        if (rc)
            return rc;
    }
    return 0;
}

/* Fills B ring slot bo with B[k0:k0+kw, n0:n0+nw]: DMA for a row-major B;
 * for B^T, [128 n, kw] row blocks of B^T, each transposed on TensorE into
 * the transpose bank and copied into the slot.  The rows of B^T are loaded
 * BT_KT K-tiles at a time ([128 n, 512 k]: 2 KiB runs per partition in f32,
 * where one K-tile's [128 n, 128 k] is a 512-byte run per partition and a
 * 2 us DMA for 64 KiB), when the first K-tile of the group comes: the
 * caller walks the K-tiles of a chunk in ascending order. */
static int load_b(mm *p, int64_t k0, int64_t kw, int64_t n0, int64_t nw, int64_t bo)
{
    const nt_tile_matmul_args *a = p->a;
    if (!a->b_trans) {
        nt_ap bsrc = nt_hbm_ap(a->b, a->in_dtype, k0 * a->ldb + n0, kw, a->ldb, nw);
        nt_ap bdst = sl(p->bring, (int)kw, bo, nw);
        return nt_isa_dma_copy(p->k, &bdst, &bsrc, b_queue(p->k, &p->qb, Q_B0, Q_BN));
    }
    const int64_t gk = (int64_t)BT_KT * TK; /* stage columns per row block */
    int64_t kg0 = k0 / gk * gk;
    if (k0 == kg0) {
        int64_t gw = min64(gk, a->K - kg0);
        p->bset = (int)(p->bsnext++ % BT_SETS);
        for (int64_t j0 = 0; j0 < nw; j0 += TM) {
            int64_t jw = min64(TM, nw - j0);
            nt_ap src = nt_hbm_ap(a->b, a->in_dtype, (n0 + j0) * a->ldb + kg0, jw, a->ldb, gw);
            nt_ap st = sl(p->bstage, (int)jw, ((int64_t)p->bset * (TN / TM) + j0 / TM) * gk, gw);
            int rc = nt_isa_dma_copy(p->k, &st, &src, b_queue(p->k, &p->qb, Q_B0, Q_BN));
            if (rc)
                return rc;
        }
    }
    for (int64_t j0 = 0; j0 < nw; j0 += TM) {
        int64_t jw = min64(TM, nw - j0);
        nt_ap st = sl(p->bstage, (int)jw,
                      ((int64_t)p->bset * (TN / TM) + j0 / TM) * gk + (k0 - kg0), kw);
        int rc;
        int slot = p->tnext;
        p->tnext = (p->tnext + 1) % p->tslots;
        nt_ap tp = sl(p->tpsum, (int)kw, (int64_t)slot * TM, jw);
        if ((rc = nt_isa_nc_transpose(p->k, &tp, &st)))
            return rc;
        nt_ap dst = sl(p->bring, (int)kw, bo + j0, jw);
        if ((rc = nt_isa_tensor_copy(p->k, &dst, &tp, NT_ENGINE_VECTOR)))
            return rc;
    }
    return 0;
}

/* ---------------- the program-level product ---------------- */

/* Host buffer for it, one per core (nt__sim_core.pg_buf), kept between
 * calls (kernels of a core are serialised; a fresh malloc this big would be
 * a fresh mmap, page faults and all, on every call). */
static float *pg_scratch(nt__sim_core *c, size_t n)
{
    if (n > c->pg_cap) {
        float *q = realloc(c->pg_buf, n * sizeof(float));
        if (!q)
            return NULL;
        c->pg_buf = q;
        c->pg_cap = n;
    }
    return c->pg_buf;
}

/* Byte range [lo, hi) of a rows x cols matrix with row stride ld. */
static void span(const void *p, int64_t rows, int64_t cols, int64_t ld, int64_t esz,
                 uintptr_t *lo, uintptr_t *hi)
{
    *lo = (uintptr_t)p;
    *hi = *lo + (uintptr_t)(((rows - 1) * ld + cols) * esz);
}

static bool overlaps(const nt_tile_matmul_args *a)
{
    if (!a->c)
        return false;
    int64_t esz = (int64_t)nt__dtype_size(a->in_dtype);
    uintptr_t clo, chi, lo, hi;
    span(a->c, a->M, a->N, a->ldc, (int64_t)nt__dtype_size(a->out_dtype), &clo, &chi);
    if (a->a_trans)
        span(a->a, a->K, a->M, a->lda, esz, &lo, &hi);
    else
        span(a->a, a->M, a->K, a->lda, esz, &lo, &hi);
    if (lo < chi && clo < hi)
        return true;
    if (a->b_trans)
        span(a->b, a->N, a->K, a->ldb, esz, &lo, &hi);
    else
        span(a->b, a->K, a->N, a->ldb, esz, &lo, &hi);
    return lo < chi && clo < hi;
}

/* C32 = A.B as the program's nc_matmuls accumulate it (see the top).  The
 * operands are widened exactly to f32, as nc_matmul widens its SBUF tiles
 * (the loads, transposes and copies that bring them there are exact). */
static int program_product_in(mm *p, float *own)
{
    const nt_tile_matmul_args *a = p->a;
    int64_t M = a->M, N = a->N, K = a->K;
    nt_dtype dt = a->in_dtype;
    bool at_direct = a->a_trans && dt == NT_F32, b_direct = dt == NT_F32; /* B or B^T in place */
    /* a row-major f32 A goes in place too: nt__gemm_rowa packs from it */
    bool a_rows = !a->a_trans && dt == NT_F32;
    size_t n = (size_t)(M * N) + (at_direct || a_rows ? 0 : (size_t)(K * M)) +
               (b_direct ? 0 : (size_t)(K * N));
    float *buf = own ? own : pg_scratch(p->k->core, n);
    if (!buf)
        return nt__sim_fail(p->k, "nt_tile_matmul", "out of host memory for the product");
    /* HBM holds the operands' final values once queued work has landed */
    nt__sim_fx_flush(p->k);
    double t0 = nt__sim_now_ns();
    float *c = buf, *w = buf + M * N;
    /* bf16 operands: widened as they are packed (core/gemm.h,
     * nt__gemm_typed), not into widened copies first; the same bits but NaNs
     * canonical, which every evacuation of the accumulators makes them
     * anyway.  -1 (host memory short): the copies below */
    if (dt == NT_BF16 &&
        nt__gemm_typed((int)M, (int)N, (int)K, a->a, (int)a->lda, !a->a_trans, NT_BF16, a->b,
                       (int)a->ldb, a->b_trans, NT_BF16, c, (int)N, NULL, NT_F32) == 0) {
        p->k->gemm_ns += nt__sim_now_ns() - t0;
        p->c32 = c;
        return 0;
    }
    const float *at = a->a, *b = a->b;
    int64_t ldat = a->lda, ldb = a->ldb, es = (int64_t)nt__dtype_size(dt);
    if (!at_direct && !a_rows) {
        /* A^T [K, M]: from A^T (a_trans) or from row-major A [M, K] */
        nt__mm_pack(w, M, a->a, dt, es, K, M, a->a_trans ? a->lda : 1, a->a_trans ? 1 : a->lda);
        at = w;
        ldat = M;
        w += K * M;
    }
    bool bcol = b_direct && a->b_trans;
    if (!b_direct) {
        /* B [K, N] from row-major B, or from B^T [N, K] (b_trans) */
        nt__mm_pack(w, N, a->b, dt, es, K, N, a->b_trans ? 1 : a->ldb, a->b_trans ? a->ldb : 1);
        b = w;
        ldb = N;
    }
    if (dt == NT_BF16) /* bf16 x bf16: their own definition, as nc_matmul's (core/gemm.h) */
        nt__gemm_bf16((int)M, (int)N, (int)K, at, (int)ldat, false, NT_F32, b, (int)ldb, bcol,
                      NT_F32, c, (int)N, false, false, NULL, NT_F32);
    else
        nt__gemm_ex((int)M, (int)N, (int)K, a_rows ? a->a : at, (int)(a_rows ? a->lda : ldat),
                    a_rows, b, (int)ldb, bcol, c, (int)N);
    p->k->gemm_ns += nt__sim_now_ns() - t0;
    p->c32 = c;
    return 0;
}

static int program_product(mm *p) { return program_product_in(p, NULL); }

/* W = A^T . X (args x) as the program for it alone computes its values:
 * *w32 [K, NX] f32, malloc'd (the core's scratch holds C's). */
static int side_product(mm *p, float **w32)
{
    const nt_tile_matmul_args *a = p->a;
    nt_tile_matmul_args wa;
    memset(&wa, 0, sizeof wa);
    wa.M = a->K, wa.N = a->NX, wa.K = a->M;
    wa.a = a->a, wa.lda = a->lda, wa.a_trans = true;
    wa.b = a->x, wa.ldb = a->ldx;
    wa.in_dtype = a->in_dtype;
    mm q;
    memset(&q, 0, sizeof q);
    q.k = p->k;
    q.a = &wa;
    float *buf = malloc(sizeof(float) * (size_t)(wa.M * wa.N + wa.K * wa.M + wa.K * wa.N));
    if (!buf)
        return nt__sim_fail(p->k, "nt_tile_matmul", "out of host memory for the product");
    int rc = program_product_in(&q, buf);
    if (rc)
        free(buf);
    else
        *w32 = buf;
    return rc;
}

/* Whether W (args x) shares a byte with A, B, C or X, or C with X. */
static bool side_overlaps(const nt_tile_matmul_args *a)
{
    int64_t esz = (int64_t)nt__dtype_size(a->in_dtype);
    uintptr_t r[5][2];
    span(a->w, a->K, a->NX, a->ldw, (int64_t)nt__dtype_size(a->w_dtype), &r[0][0], &r[0][1]);
    span(a->x, a->M, a->NX, a->ldx, esz, &r[1][0], &r[1][1]);
    span(a->a, a->M, a->K, a->lda, esz, &r[2][0], &r[2][1]);
    if (a->b_trans)
        span(a->b, a->N, a->K, a->ldb, esz, &r[3][0], &r[3][1]);
    else
        span(a->b, a->K, a->N, a->ldb, esz, &r[3][0], &r[3][1]);
    int n = 4;
    if (a->c) {
        span(a->c, a->M, a->N, a->ldc, (int64_t)nt__dtype_size(a->out_dtype), &r[4][0], &r[4][1]);
        n = 5;
    }
    for (int i = 1; i < n; i++)
        if (r[i][0] < r[0][1] && r[0][0] < r[i][1])
            return true;
    return n == 5 && r[1][0] < r[4][1] && r[4][0] < r[1][1];
}

/* Accumulator acc gets its block of the product: rows r0 .. r0+mw,
 * columns n0 .. n0+nw. */
static void deliver_to(mm *p, nt_tile *acc, int64_t r0, int64_t mw, int64_t n0, int64_t nw)
{
    nt_ap d = sl(acc, (int)mw, 0, nw);
    for (int r = 0; r < (int)mw; r++)
        memcpy(nt__sim_row(&d, r), p->c32 + (r0 + r) * p->a->N + n0, (size_t)nw * sizeof(float));
}

/* The accumulators of M-block m0 (mt tiles), N-chunk n0 get their values. */
static void deliver(mm *p, int64_t m0, int mt, int64_t n0, int64_t nw)
{
    const nt_tile_matmul_args *a = p->a;
    /* queued readers of these banks (the previous chunk's evacuation) first */
    nt__sim_fx_flush(p->k);
    for (int bm = 0; bm < mt; bm++) {
        int64_t r0 = m0 + (int64_t)bm * TM, mw = min64(TM, a->M - r0);
        deliver_to(p, p->acc[bm], r0, mw, n0, nw);
    }
}

static int zero_fill(mm *p)
{
    /* K == 0: C is all zeros */
    const nt_tile_matmul_args *a = p->a;
    for (int64_t mt = 0; mt < p->nm; mt++)
        for (int64_t nt = 0; nt < p->nn; nt++) {
            int64_t m0 = mt * TM, n0 = nt * TN;
            int64_t mw = min64(TM, a->M - m0), nw = min64(TN, a->N - n0);
            if (a->epilogue) {
                /* the epilogue evacuates a zeroed accumulator */
                nt_ap z = sl(p->acc[0], (int)mw, 0, nw);
                int rc = nt_isa_memset(p->k, &z, 0.0, NT_ENGINE_VECTOR);
                if (a->acc_kept) /* the next block zeroes the same bank */
                    *a->acc_kept = false;
                if (a->acc_lives)
                    *a->acc_lives = 0;
                if (!rc)
                    rc = a->epilogue(p->k, &z, m0, n0, a->epilogue_ctx);
                if (rc)
                    return rc;
                continue;
            }
            nt_tile *o = p->oring;
            int64_t oo = (p->onext++ % p->NO) * TN;
            nt_ap d = sl(o, (int)mw, oo, nw);
            int rc = nt_isa_memset(p->k, &d, 0.0, NT_ENGINE_VECTOR);
            if (rc)
                return rc;
            nt_ap c = nt_hbm_ap(a->c, a->out_dtype, m0 * a->ldc + n0, mw, a->ldc, nw);
            rc = nt_isa_dma_copy(p->k, &c, &d, next_q(&p->qc, Q_C0, Q_CN));
            if (rc)
                return rc;
        }
    return 0;
}

/* Issues the pending output store.  Consecutive N-chunks of the same rows
 * (one M-tile per block) sit side by side in the output ring and in C, and
 * their stores would share HBM pages (each waiting for the one before): they
 * leave as one DMA instead (bigger descriptors, one fixed cost). */
static int flush_store(mm *p)
{
    if (!p->st_nw)
        return 0;
    const nt_tile_matmul_args *a = p->a;
    nt_ap o = sl(p->oring, (int)p->st_mw, p->st_oo, p->st_nw);
    nt_ap c = nt_hbm_ap(a->c, a->out_dtype, p->st_r0 * a->ldc + p->st_n0, (int)p->st_mw, a->ldc,
                        p->st_nw);
    p->st_nw = 0;
    return nt_isa_dma_copy(p->k, &c, &o, next_q(&p->qc, Q_C0, Q_CN));
}

/* Empties accumulator acc (rows r0 .. r0+mw, columns n0 .. n0+nw of C):
 * the caller's epilogue, or a copy into the output ring (the one rounding)
 * and its store.  next_other: the next block evacuated is another M-tile's,
 * so this one's store leaves now. */
static int evac_block(mm *p, nt_tile *acc, int64_t r0, int64_t mw, int64_t n0, int64_t nw,
                      bool next_other, int lives)
{
    const nt_tile_matmul_args *a = p->a;
    nt_ap src = sl(acc, (int)mw, 0, nw);
    if (a->epilogue) {
        if (a->acc_kept)
            *a->acc_kept = lives >= 1;
        if (a->acc_lives)
            *a->acc_lives = lives;
        return a->epilogue(p->k, &src, r0, n0, a->epilogue_ctx);
    }
    int64_t oo = (p->onext++ % p->NO) * TN;
    nt_ap o = sl(p->oring, (int)mw, oo, nw);
    /* the pending store goes before its ring slots are written again */
    int rc = p->st_nw && oo < p->st_oo + p->st_nw && oo + nw > p->st_oo ? flush_store(p) : 0;
    /* ScalarE evacuates PSUM (faster clock than VectorE) */
    if (!rc)
        rc = nt_isa_tensor_copy(p->k, &o, &src, NT_ENGINE_SCALAR);
    if (rc)
        return rc;
    /* this chunk joins the pending store when it continues it and is ready
     * before that store's fixed cost would be paid (else the pending one
     * leaves alone, ahead of it) */
    double ready = nt__sim_kernel_engine_free(p->k, NT_ENGINE_SCALAR);
    bool cont = p->st_nw && p->st_r0 == r0 && p->st_mw == mw && p->st_n0 + p->st_nw == n0 &&
                p->st_oo + p->st_nw == oo && ready - p->st_ready < p->dma_fixed_ns;
    if (!cont && (rc = flush_store(p)))
        return rc;
    if (cont) {
        p->st_nw += nw;
    } else {
        p->st_r0 = r0, p->st_mw = mw, p->st_n0 = n0, p->st_nw = nw, p->st_oo = oo;
    }
    p->st_ready = ready;
    /* a chunk that ends a row of C, or whose next chunk is another M-tile's,
     * leaves now */
    if (n0 + nw >= a->N || next_other)
        rc = flush_store(p);
    return rc;
}

/* ---------------- the streaming program ---------------- */

/* Rows r0 .. r0+rows of a row-major matrix at base (row stride ld), cols
 * columns from c0, as tiles of 128 rows: partition q of tile t is row
 * r0 + 128 t + q.  Into SBUF tile dst at column d0, tile t at d0 + t *
 * dstep.  One DMA for the full tiles, one for a last partial tile. */
static int load_tiles(mm *p, const void *base, int64_t ld, int64_t r0, int64_t rows, int64_t c0,
                      int64_t cols, nt_tile *dst, int64_t d0, int64_t dstep, int q)
{
    const nt_tile_matmul_args *a = p->a;
    int64_t full = rows / TK, part = rows % TK;
    int rc = 0;
    if (full) {
        nt_ap d = sl(dst, TK, d0, (full - 1) * dstep + cols);
        d.ndim = 2;
        d.num[0] = full, d.step[0] = dstep;
        d.num[1] = cols, d.step[1] = 1;
        nt_ap h = nt_hbm_ap(base, a->in_dtype, r0 * ld + c0, TK, ld, full);
        h.step[0] = TK * ld;
        h.ndim = 2;
        h.num[1] = cols, h.step[1] = 1;
        rc = nt_isa_dma_copy(p->k, &d, &h, q);
    }
    if (!rc && part) {
        nt_ap d = sl(dst, (int)part, d0 + full * dstep, cols);
        nt_ap h = nt_hbm_ap(base, a->in_dtype, (r0 + full * TK) * ld + c0, (int)part, ld, cols);
        rc = nt_isa_dma_copy(p->k, &d, &h, q);
    }
    return rc;
}

/* K-tiles per streaming load of `cols` columns: about S_SLOT bytes per
 * partition. */
static int64_t per_load(const mm *p, int64_t cols)
{
    int64_t t = S_SLOT / (cols * p->esz);
    return t < 1 ? 1 : t;
}

/* All of B into bres, K-tile kt at columns kt * nstep (issued first). */
static int load_bres(mm *p)
{
    const nt_tile_matmul_args *a = p->a;
    int64_t N = a->N;
    int qb = 0, rc = 0;
    if (!a->b_trans) {
        int64_t g = per_load(p, N);
        for (int64_t kt = 0; kt < p->nk && !rc; kt += g) {
            int64_t rows = min64(g * TK, a->K - kt * TK);
            rc = load_tiles(p, a->b, a->ldb, kt * TK, rows, 0, N, p->bres, kt * p->nstep, p->nstep,
                            next_q(&qb, QS_B0, QS_BN));
        }
        return rc;
    }
    /* B^T [N, K]: rows of 128 n, all of K, into the transpose stage; each
     * K-tile's [128 n, kw] piece turned on TensorE and copied into bres */
    for (int64_t n0 = 0; n0 < N && !rc; n0 += TM) {
        int64_t jw = min64(TM, N - n0);
        int64_t so = (n0 / TM % p->bts) * p->bstep;
        nt_ap st = sl(p->bstage, (int)jw, so, a->K);
        nt_ap src = nt_hbm_ap(a->b, a->in_dtype, n0 * a->ldb, (int)jw, a->ldb, a->K);
        rc = nt_isa_dma_copy(p->k, &st, &src, next_q(&qb, QS_B0, QS_BN));
        for (int64_t kt = 0; kt < p->nk && !rc; kt++) {
            int64_t k0 = kt * TK, kw = min64(TK, a->K - k0);
            int slot = p->tnext;
            p->tnext = (p->tnext + 1) % p->tslots;
            nt_ap piece = sl(p->bstage, (int)jw, so + k0, kw);
            nt_ap tp = sl(p->tpsum, (int)kw, (int64_t)slot * TM, jw);
            rc = nt_isa_nc_transpose(p->k, &tp, &piece);
            nt_ap dst = sl(p->bres, (int)kw, kt * p->nstep + n0, jw);
            if (!rc)
                rc = nt_isa_tensor_copy(p->k, &dst, &tp, NT_ENGINE_VECTOR);
        }
    }
    return rc;
}

/* The load of A unit u: row-major, M-tiles u*G .. u*G+G-1 into abuf slot
 * u % NS; given A^T, M-tile u's every K-tile into its panel slot u % NS. */
static int load_a_unit(mm *p, int64_t u)
{
    const nt_tile_matmul_args *a = p->a;
    int rc = 0;
    if (!a->a_trans) {
        int64_t r0 = u * p->G * TM, rows = min64((int64_t)p->G * TM, a->M - r0);
        rc = load_tiles(p, a->a, a->lda, r0, rows, 0, a->K, p->abuf, (u % p->NS) * p->astep,
                        a->K, next_q(&p->qa, QS_A0, QS_AN));
        /* the same rows of X, for W: a DMA per M-tile, on B's queues (idle
         * once B is in) */
        for (int64_t t = 0; p->side && t * TM < rows && !rc; t++)
            rc = load_tiles(p, a->x, a->ldx, r0 + t * TM, min64(TM, rows - t * TM), 0, a->NX,
                            p->xbuf, ((u % p->NS) * p->G + t) * a->NX, a->NX,
                            next_q(&p->qb, QS_B0, QS_BN));
        return rc;
    }
    /* A^T [K, M]: partition = k, K-tiles of this M-tile's columns */
    int64_t m0 = u * TM, mw = min64(TM, a->M - m0), so = (u % p->NS) * p->nk * TM;
    int64_t g = per_load(p, mw);
    for (int64_t kt = 0; kt < p->nk && !rc; kt += g) {
        int64_t rows = min64(g * TK, a->K - kt * TK);
        rc = load_tiles(p, a->a, a->lda, kt * TK, rows, m0, mw, p->panel, so + kt * TM, TM,
                        next_q(&p->qa, QS_A0, QS_AN));
    }
    return rc;
}

/* Row-major A: M-tile i's K-tiles kt0 .. kt1-1 turned into its panel slot
 * i % NP. */
static int prep_a_range(mm *p, int64_t i, int64_t kt0, int64_t kt1)
{
    const nt_tile_matmul_args *a = p->a;
    int64_t m0 = i * TM, mw = min64(TM, a->M - m0);
    int64_t ao = (i / p->G % p->NS) * p->astep + (i % p->G) * a->K, so = (i % p->NP) * p->nk * TM;
    for (int64_t kt = kt0; kt < kt1; kt++) {
        int64_t k0 = kt * TK, kw = min64(TK, a->K - k0);
        int slot = p->tnext;
        p->tnext = (p->tnext + 1) % p->tslots;
        nt_ap src = sl(p->abuf, (int)mw, ao + k0, kw);
        nt_ap tp = sl(p->tpsum, (int)kw, (int64_t)slot * TM, mw);
        int rc = nt_isa_nc_transpose(p->k, &tp, &src);
        nt_ap dst = sl(p->panel, (int)kw, so + kt * TM, mw);
        if (!rc)
            rc = nt_isa_tensor_copy(p->k, &dst, &tp, NT_ENGINE_VECTOR);
        if (rc)
            return rc;
    }
    /* the column sums once the M-tile's last K-tile is turned (the spread
     * turns it in parts): once per M-tile, in M-tile order */
    return p->cs && kt1 == p->nk ? cs_mtile(p, m0, mw, so, TM) : 0;
}

/* Row-major A: all of M-tile i's K-tiles. */
static int prep_a(mm *p, int64_t i)
{
    return prep_a_range(p, i, 0, p->nk);
}

/* The next M-tile's transposes spread over the current M-tile's matmuls:
 * after the current tile's `done`-th of `total` matmul steps, the next
 * tile's K-tiles up to done * nk / total (rounded up) are turned.  Issued
 * all at once, TensorE (in order) would wait for each transpose slot's
 * copy out of PSUM -- VectorE's 128 cycles at its slower clock against
 * TensorE's 128, a bank of eight slots -- before the matmuls; spread, the
 * copies run under the matmuls.  The transposes and copies are exact and
 * every one still precedes the matmuls that read it, so the bits are the
 * same.  A tile of at most a bank's slots of K-tiles (no slot waits) is
 * still turned all at once before the matmuls (run_stream). */
static int prep_a_spread(mm *p, int64_t next, int64_t *turned, int64_t done, int64_t total)
{
    if (next < 0 || *turned >= p->nk)
        return 0;
    int64_t want = total > 0 ? (done * p->nk + total - 1) / total : p->nk;
    if (want > p->nk)
        want = p->nk;
    if (want <= *turned)
        return 0;
    int rc = prep_a_range(p, next, *turned, want);
    *turned = want;
    return rc;
}

/* W (args x) gets M-tile i's part: for each K-tile kt of A, W's rows kt*128..
 * (+)= A[rows of i, kt cols]^T . X[rows of i, :] -- A's row tile as loaded
 * (rows on partitions) is the stationary operand as it stands.  The M-tiles
 * come in ascending order: each element of W sums them in the order of
 * A^T . X's K-tiles run alone. */
static int side_mtile(mm *p, int64_t i, int64_t mw)
{
    const nt_tile_matmul_args *a = p->a;
    int64_t slot = i / p->G % p->NS, g = i % p->G;
    nt_ap mv = sl(p->xbuf, (int)mw, (slot * p->G + g) * a->NX, a->NX);
    for (int64_t kt = 0; kt < p->nk; kt++) {
        int64_t k0 = kt * TK, kw = min64(TK, a->K - k0);
        nt_ap st = sl(p->abuf, (int)mw, slot * p->astep + g * a->K + k0, kw);
        nt_ap d = sl(p->accw, (int)kw, kt * a->NX, a->NX);
        int rc = nt_isa_nc_matmul(p->k, &d, &st, &mv, i > 0);
        if (rc)
            return rc;
    }
    return 0;
}

/* W's accumulators out: with the program-level product, their values first
 * (the product A^T . X alone computes, w32 [K, NX]); then each K-tile's
 * rows rounded into an output slot by ScalarE and stored. */
static int side_finish(mm *p, const float *w32)
{
    const nt_tile_matmul_args *a = p->a;
    if (w32) {
        nt__sim_fx_flush(p->k);
        for (int64_t kt = 0; kt < p->nk; kt++) {
            int64_t k0 = kt * TK, kw = min64(TK, a->K - k0);
            nt_ap d = sl(p->accw, (int)kw, kt * a->NX, a->NX);
            for (int r = 0; r < (int)kw; r++)
                memcpy(nt__sim_row(&d, r), w32 + (k0 + r) * a->NX, (size_t)a->NX * sizeof(float));
        }
    }
    int rc = 0;
    for (int64_t kt = 0; kt < p->nk && !rc; kt++) {
        int64_t k0 = kt * TK, kw = min64(TK, a->K - k0);
        nt_ap src = sl(p->accw, (int)kw, kt * a->NX, a->NX);
        nt_ap o = sl(p->wout, (int)kw, (kt % 2) * a->NX, a->NX);
        rc = nt_isa_tensor_copy(p->k, &o, &src, NT_ENGINE_SCALAR);
        nt_ap c = nt_hbm_ap(a->w, a->w_dtype, k0 * a->ldw, (int)kw, a->ldw, a->NX);
        if (!rc)
            rc = nt_isa_dma_copy(p->k, &c, &o, next_q(&p->qc, Q_C0, Q_CN));
    }
    return rc;
}

/* B small enough to stay in SBUF, many M-tiles (nt_linear on B*T rows, a
 * weight gradient over B*T): B is loaded (and for B^T turned) once, and
 * the M-tiles stream past it one at a time -- loads S_NS - 1 units ahead
 * on their own queues, each M-tile's transposes one tile ahead of the
 * matmuls, accumulators in a ring of PSUM banks, each evacuated as soon as
 * its last K-tile is in.  The block program (run) reloaded B for every
 * block of 8 M-tiles and ran a block's loads, matmuls and stores in series.
 * The K-tiles accumulate in ascending order into one bank, as there. */
static int run_stream(mm *p)
{
    const nt_tile_matmul_args *a = p->a;
    int64_t nm = p->nm, units = a->a_trans ? nm : (nm + p->G - 1) / p->G;
    bool fx = p->k->functional;
    if (p->c32)
        p->k->functional = false;
    int rc = load_bres(p);
    for (int64_t u = 0; u < units && u < p->NS - 1 && !rc; u++)
        rc = load_a_unit(p, u);
    if (!rc && !a->a_trans)
        rc = prep_a(p, 0);
    for (int64_t i = 0; i < nm && !rc; i++) {
        int64_t m0 = i * TM, mw = min64(TM, a->M - m0);
        /* the next unit's load goes once the slot it reuses is done with */
        int64_t u = a->a_trans ? i : (i % p->G == 0 ? i / p->G : -1);
        if (u >= 0 && u + p->NS - 1 < units)
            rc = load_a_unit(p, u + p->NS - 1);
        /* row-major A: the next M-tile's transposes between this one's
         * matmuls (prep_a_spread) */
        int64_t next = !a->a_trans && i + 1 < nm ? i + 1 : -1, turned = 0;
        if (next >= 0 && p->nk <= p->tslots) { /* they fit the bank: no wait */
            rc = prep_a(p, next);
            turned = p->nk;
        }
        int64_t so = (i % p->NP) * p->nk * TM;
        for (int64_t nc = 0; nc < p->nn && !rc; nc++) {
            int64_t n0 = nc * TN, nw = min64(TN, a->N - n0);
            nt_tile *acc = p->acc[p->naccn++ % p->nacc];
            nt_ap dst = sl(acc, (int)mw, 0, nw);
            for (int64_t kt = 0; kt < p->nk && !rc; kt++) {
                int64_t kw = min64(TK, a->K - kt * TK);
                nt_ap st = sl(p->panel, (int)kw, so + kt * TM, mw);
                nt_ap mv = sl(p->bres, (int)kw, kt * p->nstep + n0, nw);
                if (dr_pair(p, kt)) { /* K-tiles kt, kt + 1: TM and N apart */
                    nt_ap st2 = dr_ap(st, TM), mv2 = dr_ap(mv, p->nstep);
                    rc = nt_isa_nc_matmul_dr(p->k, &dst, &st2, &mv2, kt > 0);
                    kt++;
                } else {
                    rc = nt_isa_nc_matmul(p->k, &dst, &st, &mv, kt > 0);
                }
                if (!rc)
                    rc = prep_a_spread(p, next, &turned, nc * p->nk + kt + 1, p->nn * p->nk);
            }
            if (rc)
                break;
            if (p->c32) {
                p->k->functional = fx;
                nt__sim_fx_flush(p->k); /* the bank's queued readers first */
                deliver_to(p, acc, m0, mw, n0, nw);
            }
            /* the bank comes round again p->nacc blocks on, once the
             * evacuation nacc - 1 blocks on has returned (none after the
             * last block) */
            int64_t left = (nm - 1 - i) * p->nn + (p->nn - 1 - nc);
            rc = evac_block(p, acc, m0, mw, n0, nw, nc + 1 == p->nn,
                            (int)min64(p->nacc - 1, left));
            if (p->c32)
                p->k->functional = false;
        }
        if (!rc && p->side)
            rc = side_mtile(p, i, mw);
    }
    p->k->functional = fx;
    return rc;
}

static int run(mm *p)
{
    const nt_tile_matmul_args *a = p->a;
    if (a->K == 0)
        return zero_fill(p);
    for (int64_t mb = 0; mb * p->BM < p->nm; mb++) {
        int64_t m0 = mb * p->BM * TM;
        int mt = (int)min64(p->BM, p->nm - mb * p->BM);
        for (int64_t nc = 0; nc < p->nn; nc++) {
            int64_t n0 = nc * TN, nw = min64(TN, a->N - n0);
            bool load = !p->resident || nc == 0;
            p->cs_on = nc == 0; /* the column sums from the first chunk's panel */
            /* with the program-level product, the loads and matmuls are
             * timed but compute nothing (see the top) */
            if (p->c32)
                p->k->functional = false;
            /* row-major A: prepare one K-tile ahead so the VectorE copies
             * of K-tile k+1 overlap the matmuls of K-tile k */
            if (load && !a->a_trans) {
                int rc = load_panel(p, 0, m0, mt);
                if (rc)
                    return rc;
            }
            /* B one K-tile ahead too: for B^T its transposes and VectorE
             * copies then overlap the previous K-tile's matmuls instead of
             * holding TensorE up (TensorE runs in program order) */
            int64_t bo = (p->bnext++ % p->nb) * TN;
            {
                int rc = load_b(p, 0, min64(TK, a->K), n0, nw, bo);
                if (rc)
                    return rc;
            }
            for (int64_t kt = 0; kt < p->nk; kt++) {
                int64_t k0 = kt * TK, kw = min64(TK, a->K - k0);
                int rc;
                if (load) {
                    if (a->a_trans)
                        rc = load_panel(p, kt, m0, mt);
                    else
                        rc = kt + 1 < p->nk ? load_panel(p, kt + 1, m0, mt) : 0;
                    if (rc)
                        return rc;
                }
                int64_t bo_next = 0;
                if (kt + 1 < p->nk) {
                    int64_t k1 = k0 + TK;
                    bo_next = (p->bnext++ % p->nb) * TN;
                    if ((rc = load_b(p, k1, min64(TK, a->K - k1), n0, nw, bo_next)))
                        return rc;
                }
                nt_ap bdst = sl(p->bring, (int)kw, bo, nw);
                int64_t so = slot_off(p, kt);
                /* fp8 on trn2: K-tiles kt (even) and kt + 1, whose panel
                 * (row-major A: prepared one ahead) and B are both in
                 * SBUF by now, as one double-row instruction; the odd
                 * K-tile's turn then only loads */
                int64_t sstep = kt + 1 < p->nk ? slot_off(p, kt + 1) - so : 0;
                bool pair = kt % 2 == 0 && !a->a_trans && dr_pair(p, kt) && sstep > 0 &&
                            bo_next > bo;
                bool second = kt % 2 == 1 && !a->a_trans && dr_pair(p, kt - 1) &&
                              slot_off(p, kt) > slot_off(p, kt - 1) && bo > p->bprev;
                for (int bm = 0; bm < mt && !second; bm++) {
                    int64_t mw = min64(TM, a->M - (m0 + (int64_t)bm * TM));
                    nt_ap dst = sl(p->acc[bm], (int)mw, 0, nw);
                    nt_ap st = sl(p->panel, (int)kw, so + (int64_t)bm * TM, mw);
                    if (pair) {
                        nt_ap st2 = dr_ap(st, sstep), mv2 = dr_ap(bdst, bo_next - bo);
                        rc = nt_isa_nc_matmul_dr(p->k, &dst, &st2, &mv2, kt > 0);
                    } else {
                        rc = nt_isa_nc_matmul(p->k, &dst, &st, &bdst, kt > 0);
                    }
                    if (rc)
                        return rc;
                }
                p->bprev = bo;
                bo = bo_next;
            }
            /* a resident panel's column sums once all its K-tiles are in,
             * every K-tile in one pass per M-tile (cs_mtile), not one
             * K-tile's after each copy: GpSimd shares VectorE's SBUF port
             * on trn1, so each pass held the next K-tile's copy, and with it
             * the matmuls, about 0.7 us (the MLP's input gradient dY . W2
             * with b2's gradient beside it: 24.1 -> 20.3 us after dY came).
             * Each column still adds its rows in order, so the same bits */
            for (int bm = 0; load && p->cs && p->cs_on && p->resident && bm < mt; bm++) {
                int64_t r0 = m0 + (int64_t)bm * TM;
                int rc = cs_mtile(p, r0, min64(TM, a->M - r0), (int64_t)bm * TM,
                                  (int64_t)p->BM * TM);
                if (rc)
                    return rc;
            }
            if (p->c32) {
                p->k->functional = true;
                deliver(p, m0, mt, n0, nw);
            }
            for (int bm = 0; bm < mt; bm++) {
                int64_t r0 = m0 + (int64_t)bm * TM, mw = min64(TM, a->M - r0);
                /* the next chunk's matmuls write every bank of the block
                 * before its first evacuation: only the block's later banks
                 * evacuate first */
                int rc = evac_block(p, p->acc[bm], r0, mw, n0, nw, mt > 1, mt - 1 - bm);
                if (rc)
                    return rc;
            }
        }
    }
    return 0;
}

/* Chooses the program (streaming or blocks), the block of M-tiles and the
 * slots of the A panel from the PSUM banks and SBUF bytes the kernel has
 * left. */
static int plan(mm *p, bool tbank)
{
    static const char *I = "nt_tile_matmul";
    nt_sim_kernel *k = p->k;
    const nt_tile_matmul_args *a = p->a;
    /* PSUM: one bank per M-tile of a block, plus one for transposes */
    int banks = nt__sim_free_banks(k) - (tbank ? 1 : 0);
    int bm_max = (int)min64(banks, p->nm);
    if (bm_max > NT_SIM_PSUM_BANKS)
        bm_max = NT_SIM_PSUM_BANKS;
    if (bm_max < 1)
        return nt__sim_fail(k, I, "needs %d free PSUM banks, %d left in the kernel",
                            tbank ? 2 : 1, nt__sim_free_banks(k));

    /* SBUF: the streaming program when all of B stays (run_stream); else
     * the largest block whose whole A panel stays resident, else the
     * largest block that streams the panel through a few slots */
    int64_t avail = nt_tile_free_bytes(k, NT_MEM_SBUF);
    /* (with an epilogue, one N-chunk unless it is apart: an in-place
     * epilogue's loads of the next chunk of the same rows would wait for
     * this chunk's stores to the same HBM pages; the block program puts
     * other M-tiles between them.  An epilogue that writes nothing it reads
     * takes the chunks in turn: B stays resident, where the block program
     * loaded and turned it again for every block of M-tiles) */
    /* A given as A^T (a weight gradient over a few K-tiles of tokens) and
     * four or more N-chunks per M-tile: the block program, whose output
     * ring of BM + 2 slots keeps the stores flowing where the stream's four
     * wait on them (tensor-parallel W1 gradient [4096, 512] x [512, 4096]:
     * 367 us streamed, 217 us blocked; [16384, 512] x [512, 4096]: 1411 us,
     * 848 us; the stream stays ahead with one N-chunk: [65536, 64] x
     * [64, 512] 398 us, 465 us blocked) */
    bool wide_at = a->a_trans && p->nn >= 4;
    if (a->K > 0 && p->nm >= 2 && banks >= 2 && (!a->epilogue || p->nn == 1 || a->epilogue_apart)) {
        int64_t bres = p->nk * step(a->N, p->esz) * p->esz;
        int64_t G = a->a_trans ? 1 : min64(min64(per_load(p, a->K), 8), p->nm);
        int64_t bst = step(a->K, p->esz) * p->esz;
        /* with W beside it, A's slots stay until W's matmuls read them, a
         * tile after the transposes: one slot more keeps the loads ahead */
        int NS = S_NS + (p->side ? SIDE_NS : 0);
        int NP = a->a_trans ? S_NS : 2;
        int64_t need = bres + (a->a_trans ? 0 : NS * step(G * a->K, p->esz) * p->esz) +
                       (int64_t)NP * p->nk * TM * p->esz + (a->epilogue ? 0 : 8 * TN * p->csz) +
                       (a->b_trans ? BT_SETS * bst : 0) + NT__SIM_ALIGN * 8 +
                       (p->side ? NS * G * a->NX * p->esz +
                                      2 * a->NX * (int64_t)nt__dtype_size(a->w_dtype)
                                : 0);
        if (bres <= S_BRES && !wide_at && (!a->b_trans || a->K * p->esz <= 16 * 1024) && need <= avail) {
            p->stream = true;
            p->G = (int)G;
            p->NS = NS;
            p->NP = NP;
            p->NO = 8;
            p->nacc = banks < 6 ? banks : 6;
            p->nstep = step(a->N, p->esz);
            p->astep = step(G * a->K, p->esz);
            p->bstep = bst / p->esz;
            /* B^T: a stage set per row block of 128 n, up to S_BTS, when
             * SBUF has them: with two, each row block's load waited for
             * the transposes of the one two before it */
            p->bts = BT_SETS;
            int64_t rows = (a->N + TM - 1) / TM;
            while (a->b_trans && p->bts < min64(rows, S_BTS) && need + bst <= avail) {
                p->bts++;
                need += bst;
            }
        }
    }
    p->BM = 0;
    if (p->stream)
        p->BM = 1; /* skips the block search below */
    for (int bm = bm_max; bm >= 1 && !p->stream; bm--)
        if (need_bytes(p, bm, (int)p->nk) <= avail) {
            p->BM = bm;
            p->resident = true;
            p->NP = (int)p->nk;
            break;
        }
    if (!p->BM) {
        int np = (int)min64(p->nk, 4);
        for (int bm = bm_max; bm >= 1; bm--)
            if (need_bytes(p, bm, np) <= avail) {
                p->BM = bm;
                p->NP = np;
                break;
            }
    }
    if (!p->BM)
        return nt__sim_fail(k, I, "needs %lld B per partition of SBUF, %lld B free in the kernel",
                            (long long)need_bytes(p, 1, 1), (long long)avail);
    /* one block of M-tiles: B streams past once, each tile loaded for its
     * one use; up to twice the ring's slots, when SBUF has them, let the
     * loads of the next N-chunks go while the block still waits for A (the
     * MLP's input gradient dY . W2: its second chunk of W2 loaded behind
     * the first chunk's matmuls, in the DMA time the next kernels needed) */
    p->nb = NB;
    if (!p->stream && p->BM >= p->nm && p->nk * p->nn > NB) {
        p->nb = (int)min64(p->nk * p->nn, 2 * NB);
        if (need_bytes(p, p->BM, p->NP) > avail)
            p->nb = NB;
    }
    if (!p->stream)
        p->NO = p->BM + 2;
    if (a->K == 0)
        p->NO = 2;
    return 0;
}

/* The tiles of the chosen program (an allocation failure is left in
 * k->err). */
static void alloc_tiles(mm *p, bool tbank)
{
    nt_sim_kernel *k = p->k;
    const nt_tile_matmul_args *a = p->a;
    if (!p->stream || !a->epilogue)
        p->oring = nt_tile_alloc(k, "mm.out", NT_MEM_SBUF, a->out_dtype, TM, (int64_t)p->NO * TN);
    if (a->K == 0 && a->epilogue)
        p->acc[0] = nt_tile_alloc(k, "mm.acc", NT_MEM_PSUM, NT_F32, TM, TN);
    if (p->stream) {
        p->bres = nt_tile_alloc(k, "mm.Bres", NT_MEM_SBUF, a->in_dtype, TK, p->nk * p->nstep);
        p->panel = nt_tile_alloc(k, "mm.At", NT_MEM_SBUF, a->in_dtype, TK,
                                (int64_t)p->NP * p->nk * TM);
        if (!a->a_trans)
            p->abuf = nt_tile_alloc(k, "mm.A", NT_MEM_SBUF, a->in_dtype, TM,
                                   (int64_t)p->NS * p->astep);
        if (p->side) {
            p->xbuf = nt_tile_alloc(k, "mm.X", NT_MEM_SBUF, a->in_dtype, TM,
                                   (int64_t)p->NS * p->G * a->NX);
            p->wout = nt_tile_alloc(k, "mm.Wout", NT_MEM_SBUF, a->w_dtype, TK, 2 * a->NX);
        }
        if (a->b_trans)
            p->bstage = nt_tile_alloc(k, "mm.Bt", NT_MEM_SBUF, a->in_dtype, TM,
                                     (int64_t)p->bts * p->bstep);
        for (int i = 0; i < p->nacc; i++)
            p->acc[i] = nt_tile_alloc(k, "mm.acc", NT_MEM_PSUM, NT_F32, TM, TN);
        if (tbank) {
            p->tslots = (int)(NT_SIM_PSUM_BANK_BYTES / (TM * p->esz));
            p->tpsum = nt_tile_alloc(k, "mm.T", NT_MEM_PSUM, a->in_dtype, TK,
                                    (int64_t)p->tslots * TM);
        }
    } else if (a->K > 0) {
        p->bring = nt_tile_alloc(k, "mm.B", NT_MEM_SBUF, a->in_dtype, TK, (int64_t)p->nb * TN);
        p->panel = nt_tile_alloc(k, "mm.At", NT_MEM_SBUF, a->in_dtype, TK,
                                (int64_t)p->NP * p->BM * TM);
        for (int i = 0; i < p->BM; i++)
            p->acc[i] = nt_tile_alloc(k, "mm.acc", NT_MEM_PSUM, NT_F32, TM, TN);
        if (!a->a_trans)
            for (int i = 0; i < 2; i++)
                p->strip[i] = nt_tile_alloc(k, "mm.Astrip", NT_MEM_SBUF, a->in_dtype, TM,
                                           (int64_t)p->BM * STRIP_KT * TK);
        if (a->b_trans)
            p->bstage = nt_tile_alloc(k, "mm.Bt", NT_MEM_SBUF, a->in_dtype, TM,
                                     (int64_t)BT_SETS * (TN / TM) * BT_KT * TK);
        if (tbank) {
            p->tslots = (int)(NT_SIM_PSUM_BANK_BYTES / (TM * p->esz));
            p->tpsum = nt_tile_alloc(k, "mm.T", NT_MEM_PSUM, a->in_dtype, TK,
                                    (int64_t)p->tslots * TM);
        }
    }
}

int nt_tile_matmul(nt_sim_kernel *k, const nt_tile_matmul_args *a)
{
    static const char *I = "nt_tile_matmul";
    if (!k)
        return NT__SIM_NULL(I, "k");
    if (k->err)
        return k->err;
    if (!a)
        return nt__sim_fail(k, I, "args is NULL");
    if (a->M < 0 || a->N < 0 || a->K < 0 || a->M > NT__SIM_MAX_ELEMS ||
        a->N > NT__SIM_MAX_ELEMS || a->K > NT__SIM_MAX_ELEMS)
        return nt__sim_fail(k, I, "shape M=%lld N=%lld K=%lld (rule: sizes in 0..2^48)",
                            (long long)a->M, (long long)a->N, (long long)a->K);
    if (a->lda > NT__SIM_MAX_ELEMS || a->ldb > NT__SIM_MAX_ELEMS || a->ldc > NT__SIM_MAX_ELEMS)
        return nt__sim_fail(k, I, "row strides lda=%lld ldb=%lld ldc=%lld (rule: at most 2^48)",
                            (long long)a->lda, (long long)a->ldb, (long long)a->ldc);
    if (!nt__dtype_is_float(a->in_dtype) || !nt__dtype_is_float(a->out_dtype))
        return nt__sim_fail(k, I, "dtypes in=%d out=%d (rule: f32, bf16, f16, e4m3 or e5m2 in, "
                            "f32, bf16 or f16 out)",
                            (int)a->in_dtype, (int)a->out_dtype);
    if (a->a_colsum && (a->a_trans || !nt__dtype_is_f32_or_half(a->in_dtype) ||
                        !nt__dtype_is_f32_or_half(a->a_colsum_dtype) ||
                        a->M < 1 || a->N < 1))
        return nt__sim_fail(k, I, "a_colsum with %s A of M=%lld, N=%lld, sums %s (rule: f32, "
                            "bf16 or f16 A given row-major, M and N >= 1, sums f32, bf16 or "
                            "f16)",
                            a->a_trans ? "a transposed" : nt_dtype_name(a->in_dtype),
                            (long long)a->M, (long long)a->N, nt_dtype_name(a->a_colsum_dtype));
    if (a->x && (a->a_trans || !a->w || a->M < 1 || a->N < 1 || a->K < 1 || a->NX < 1 ||
                 a->NX > TN || (a->K + TK - 1) / TK * a->NX > TN || a->ldx < a->NX ||
                 a->ldw < a->NX ||
                 (a->in_dtype != NT_F32 && a->in_dtype != NT_BF16 && a->in_dtype != NT_F16) ||
                 !nt__dtype_is_float(a->w_dtype) || nt__dtype_is_fp8(a->w_dtype)))
        return nt__sim_fail(k, I, "x with %s A, M=%lld, N=%lld, K=%lld, NX=%lld, ldx=%lld, "
                            "ldw=%lld, w %s (rule: A row-major f32, bf16 or f16, W given, "
                            "M, N, K >= 1, NX in 1..512, "
                            "ceil(K / 128) * NX <= 512, ldx and ldw >= NX, W f32, bf16 or f16)",
                            a->a_trans ? "a transposed" : nt_dtype_name(a->in_dtype),
                            (long long)a->M, (long long)a->N, (long long)a->K, (long long)a->NX,
                            (long long)a->ldx, (long long)a->ldw,
                            a->w ? nt_dtype_name(a->w_dtype) : "NULL");
    if (a->M == 0 || a->N == 0)
        return 0;
    if (a->x && a->a && a->b && side_overlaps(a))
        return nt__sim_fail(k, I, "W shares memory with A, B, C or X, or C with X (rule: W and "
                            "C apart from every operand)");
    if ((!a->c && !a->epilogue) || (a->K > 0 && (!a->a || !a->b)))
        return nt__sim_fail(k, I, "NULL matrix pointer");
    if ((!a->epilogue && a->ldc < a->N) ||
        (a->K > 0 &&
         (a->ldb < (a->b_trans ? a->K : a->N) || a->lda < (a->a_trans ? a->M : a->K))))
        return nt__sim_fail(k, I,
                            "row strides lda=%lld ldb=%lld ldc=%lld too small for M=%lld "
                            "N=%lld K=%lld",
                            (long long)a->lda, (long long)a->ldb, (long long)a->ldc,
                            (long long)a->M, (long long)a->N, (long long)a->K);

    mm p;
    memset(&p, 0, sizeof p);
    p.k = k;
    p.dma_fixed_ns = nt__sim.cfg.dma_fixed_ns;
    p.a = a;
    p.esz = (int64_t)nt__dtype_size(a->in_dtype);
    p.csz = (int64_t)nt__dtype_size(a->out_dtype);
    p.dr = nt__dtype_is_fp8(a->in_dtype) && nt__sim.cfg.tensor_rate[NT_SIM_MM_FP8] >= 2.0;
    p.nm = (a->M + TM - 1) / TM;
    p.nk = (a->K + TK - 1) / TK;
    p.nn = (a->N + TN - 1) / TN;

    /* PSUM: one bank per M-tile of a block, plus one for transposes */
    bool tbank = a->K > 0 && (!a->a_trans || a->b_trans); /* transposes on TensorE */
    /* the column sums' tiles and W's accumulators first: the program's
     * plan fits around them */
    p.cs = a->a_colsum && a->K > 0;
    p.side = a->x != NULL;
    if (p.side)
        p.accw = nt_tile_alloc(k, "mm.W", NT_MEM_PSUM, NT_F32, TK, TN);
    if (p.cs) {
        p.cs_lane = nt_tile_alloc(k, "mm.colsum.lanes", NT_MEM_SBUF, NT_F32, TK,
                                  p.nk * NT_RED_LANES);
        p.cs_acc = nt_tile_alloc(k, "mm.colsum", NT_MEM_SBUF, NT_F32, TK, p.nk);
        if (a->a_colsum_dtype != NT_F32)
            p.cs_out = nt_tile_alloc(k, "mm.colsum.out", NT_MEM_SBUF, a->a_colsum_dtype, TK, p.nk);
    }
    int rc = k->err ? k->err : plan(&p, tbank);
    if (!rc && p.side && !p.stream)
        rc = NT_ENOTSUP; /* nothing issued: the caller runs the products apart */
    if (!rc && p.cs) {
        nt_ap z = nt_tile_ap(p.cs_acc);
        rc = nt_isa_memset(k, &z, 0.0, NT_ENGINE_GPSIMD);
    }
    if (!rc)
        alloc_tiles(&p, tbank);
    bool fx = k->functional;
    float *w32 = NULL;
    if (rc || k->err)
        rc = rc ? rc : k->err;
    else if (fx && a->K > 0 && nt__sim_program_gemm() && !overlaps(a)) {
        rc = program_product(&p);
        if (!rc && p.side)
            rc = side_product(&p, &w32);
    }
    if (!rc)
        rc = p.stream ? run_stream(&p) : run(&p);
    if (!rc)
        rc = flush_store(&p);
    k->functional = fx; /* also after an error inside a timed-only stretch */
    if (!rc && p.side)
        rc = side_finish(&p, w32);
    free(w32);
    if (!rc && p.cs)
        rc = cs_store(&p);

    /* give the space back to the kernel (dependencies keep later users of
     * these bytes behind this program's accesses) */
    nt_tile *all[] = {p.oring, p.bring, p.panel, p.strip[0], p.strip[1], p.tpsum, p.bstage,
                      p.bres, p.abuf, p.cs_lane, p.cs_acc, p.cs_out, p.xbuf, p.accw, p.wout};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i] && all[i]->live)
            nt_tile_release(k, all[i]);
    for (int i = 0; i < NT_SIM_PSUM_BANKS; i++)
        if (p.acc[i] && p.acc[i]->live)
            nt_tile_release(k, p.acc[i]);
    return rc ? rc : k->err;
}
