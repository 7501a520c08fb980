/* neuron/conv.c - the convolution kernels conv_gemm and conv_wgrad on the
 * simulator (core/conv.h has the geometry, docs/ops.md "Convolution" the
 * contract, cpu/conv.c the reference).
 *
 * im2col by DMA access patterns, then nt_tile_matmul (PSUM accumulation
 * over K-tiles of 128 in ascending order: the CPU's recurrence, bit for
 * bit):
 *   1. x padded (and dilated, for the transposed convolution) into HBM
 *      scratch xp: zeros from an SBUF tile, then x's planes into the
 *      interior -- one strided DMA per 128 planes;
 *   2. the columns col [G][Kc][N OH OW]: one DMA per (image, channel), a
 *      pattern [ki (partitions), kj, oh, ow] over xp -- the padding and
 *      the holes are the zeros of xp, so no tap needs a case of its own;
 *   3. conv_gemm: per image and group w_g [COg, Kc] . col [Kc, OH OW]
 *      (stride 1 and one group: the SBUF kernels below instead);
 *      conv_wgrad: per group gy_g [COg, N OH OW] . col^T (col given as
 *      B^T), one product over every image's positions (stride 1, one
 *      group, 32/64/128 channels: the on-chip kernel wg_* instead). */
#include "neuron/sk.h"

#include <string.h>

#include "core/conv.h"

/* n elements of HBM at base + off (dtype dt) set to zero from z, a zeroed
 * SBUF tile [128, F]. */
static int zero_hbm(sk_k *s, char *base, nt_dtype dt, int64_t n, nt_tile *z, int64_t F)
{
    int64_t off = 0;
    while (n - off >= F) {
        int rows = (int)((n - off) / F < 128 ? (n - off) / F : 128);
        nt_ap d = nt_hbm_ap(base, dt, off, rows, F, F), src = nt_tile_slice(z, 0, rows, 0, F);
        int rc = nt_isa_dma_copy(s->k, &d, &src, sk_qout(s));
        if (rc)
            return rc;
        off += rows * F;
    }
    if (off < n) {
        nt_ap d = nt_hbm_ap(base, dt, off, 1, n - off, n - off);
        nt_ap src = nt_tile_slice(z, 0, 1, 0, n - off);
        return nt_isa_dma_copy(s->k, &d, &src, sk_qout(s));
    }
    return 0;
}

typedef struct padded {
    char *xp;
    int64_t Hp, Wp, pb[2]; /* xp row r holds dilated x's row r - pb[0] */
} padded;

/* Steps 1 and 2: the columns of every group into col [G][Kc][N L]. */
static int columns(sk_k *s, const nt__conv_geo *g, const nt_tensor *x, char *col)
{
    nt_dtype dt = (nt_dtype)x->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt), L = g->OH * g->OW, NL = g->N * L;
    int64_t Cg = g->C / g->G, Kc = Cg * g->kh * g->kw;
    int64_t k[2] = {g->kh, g->kw}, o[2] = {g->OH, g->OW}, in[2] = {g->H, g->W}, ext[2];
    padded P;
    for (int i = 0; i < 2; i++) {
        P.pb[i] = g->lo[i] > 0 ? g->lo[i] : 0;
        int64_t need = (o[i] - 1) * g->s[i] + (k[i] - 1) * g->d[i] - g->lo[i] + P.pb[i] + 1;
        int64_t have = P.pb[i] + (in[i] - 1) * g->u[i] + 1;
        ext[i] = need > have ? need : have;
    }
    P.Hp = ext[0], P.Wp = ext[1];
    int64_t nxp = g->N * g->C * P.Hp * P.Wp;
    const char *xd = nt__tensor_data(x);
    /* no padding, no dilation, nothing past the plane: x is its own xp */
    bool same = P.Hp == g->H && P.Wp == g->W && P.pb[0] == 0 && P.pb[1] == 0 && g->u[0] == 1 &&
                g->u[1] == 1;
    nt_tile *z = NULL;
    int rc = 0;
    if (same) {
        P.xp = (char *)xd;
    } else {
        if (!(P.xp = sk_scratch(s, (size_t)(nxp * es))))
            return s->derr_code;
        int64_t F = 2048;
        z = sk_tile(s, "conv.zero", dt, 128, F);
        rc = z ? 0 : nt_sim_kernel_error(s->k);
        nt_ap za = z ? nt_tile_ap(z) : (nt_ap){0};
        if (!rc)
            rc = nt_isa_memset(s->k, &za, 0.0, NT_ENGINE_GPSIMD);
        if (!rc)
            rc = zero_hbm(s, P.xp, dt, nxp, z, F);
    }
    int64_t planes = same ? 0 : g->N * g->C;
    for (int64_t p0 = 0; !rc && p0 < planes; p0 += 128) {
        int np = (int)(planes - p0 < 128 ? planes - p0 : 128);
        nt_ap src = nt_hbm_ap(xd, dt, p0 * g->H * g->W, np, g->H * g->W, g->W);
        src.ndim = 2, src.num[0] = g->H, src.step[0] = g->W, src.num[1] = g->W, src.step[1] = 1;
        nt_ap d = src;
        d.hbm = P.xp;
        d.pstep = P.Hp * P.Wp;
        d.offset = p0 * P.Hp * P.Wp + P.pb[0] * P.Wp + P.pb[1];
        d.step[0] = g->u[0] * P.Wp, d.step[1] = g->u[1];
        rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
    }
    /* column row (ki, kj, ci) at (oh, ow) reads xp row oh s0 + ki d0 - lo0 + pb0 */
    int64_t base = (P.pb[0] - g->lo[0]) * P.Wp + (P.pb[1] - g->lo[1]);
    /* one DMA per (group, kernel row, 128 channels): partitions ci, free
     * [kj, n, oh, ow]; row (ki, kj, ci) of group grp starts at (grp Kc +
     * (ki kw + kj) Cg + ci) N L in col */
    for (int64_t grp = 0; !rc && grp < g->G; grp++)
        for (int64_t ki = 0; !rc && ki < g->kh; ki++)
            for (int64_t c0 = 0; !rc && c0 < Cg; c0 += 128) {
                int np = (int)(Cg - c0 < 128 ? Cg - c0 : 128);
                nt_ap src;
                memset(&src, 0, sizeof src);
                src.hbm = P.xp, src.dtype = dt, src.np = np, src.pstep = P.Hp * P.Wp;
                src.offset = (grp * Cg + c0) * P.Hp * P.Wp + base + ki * g->d[0] * P.Wp;
                src.ndim = 4;
                src.num[0] = g->kw, src.step[0] = g->d[1];
                src.num[1] = g->N, src.step[1] = g->C * P.Hp * P.Wp;
                src.num[2] = g->OH, src.step[2] = g->s[0] * P.Wp;
                src.num[3] = g->OW, src.step[3] = g->s[1];
                nt_ap d;
                memset(&d, 0, sizeof d);
                d.hbm = col, d.dtype = dt, d.np = np, d.pstep = NL;
                d.offset = (grp * Kc + ki * g->kw * Cg + c0) * NL;
                d.ndim = 2;
                d.num[0] = g->kw, d.step[0] = Cg * NL;
                d.num[1] = NL, d.step[1] = 1;
                rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
            }
    if (z)
        nt_tile_release(s->k, z);
    return rc;
}

/* ---------------- the transposing SBUF kernel: stride 1, one group ----------------
 *
 * (Channel counts the shifted-view kernel below does not take.)  The
 * columns never leave the chip.  Per image, x is loaded once into SBUF
 * as xs [C, padded plane] (zeros around).  The output
 * positions are taken in blocks of 128 flat positions q = oh Wp + ow of
 * the padded width (the Wp - OW extra columns of a row are computed and
 * dropped).  Per block:
 *   1. colT [q, K] (K = (ki, kj, ci) along the free dim): tap t's columns
 *      are xs's positions q + off_t, transposed by TensorE (positions onto
 *      partitions) and interleaved into K order by the PSUM copy;
 *   2. TensorE transposes colT in K-chunks of 128 into col [K, q], so the
 *      contraction dim is on partitions in the contract's K order;
 *   3. TensorE: acc [q, CO] (+)= col[kc]^T . wT[kc] for the K-chunks in
 *      ascending order -- the positions are the stationary operand (M =
 *      128: the whole PE array, where CO = 64 as the stationary would use
 *      half of it), the weight the moving one (N = CO);
 *   4. acc is copied to SBUF (exact), transposed to [CO, q] and rounded
 *      once into the image's output rows, stored by one DMA per image.
 * Per element this is the recurrence of nt__gemm_ktile over each K-tile
 * (fma(col, w, s): the operands' order in an fma does not matter) and the
 * K-tiles added in ascending order in PSUM: the CPU kernel's bits. */

#define FAST_D 2 /* stage C runs this many blocks behind stage A */
#define SV_D 4   /* the shifted-view kernel's rotation of its PSUM and ys tiles */

typedef struct fastk {
    sk_k *s;
    const nt__conv_geo *g;
    nt_dtype dt, odt;
    int64_t Hp, Wp, pb[2], Fx, Q, nch, Kc, nK, T;
    int64_t off[64]; /* per tap: flat offset in the padded plane */
    nt_tile *xs[2], *colT[2], *col[FAST_D][8], *wT, *ys[SV_D], *yimg[2];
    nt_tile *pxT[8], *pcol[2][8], *pacc[SV_D], *pyT[SV_D];
    int eng; /* rotation of the copy engines */
    /* the shifted-view kernel (sv_*): m taps per K-tile, the copies of the
     * plane (per image parity), each K-tile's copy, each copy's segments */
    int64_t m, delta[8][4];
    int nsig, sig[8], nseg[8];
    nt_tile *xv[2][8];
} fastk;

#define FAST_MAX_KC 1024

static bool fast_ok(const nt__conv_geo *g, nt_dtype dt)
{
    int64_t es = (int64_t)nt__dtype_size(dt), Kc = g->C * g->kh * g->kw;
    if (g->s[0] != 1 || g->s[1] != 1 || g->u[0] != 1 || g->u[1] != 1 || g->G != 1 ||
        g->C > 128 || g->CO > 128 || Kc > FAST_MAX_KC || g->kh * g->kw > 64 || g->N == 0 ||
        g->OH * g->OW == 0)
        return false;
    int64_t Wp = g->OW + (g->kw - 1) * g->d[1], Hp = g->OH + (g->kh - 1) * g->d[0] + 1;
    Wp = Wp > g->W + 2 * g->lo[1] ? Wp : g->W + 2 * g->lo[1];
    Hp = Hp > g->H + 2 * g->lo[0] ? Hp : g->H + 2 * g->lo[0];
    int64_t plane = Hp * Wp + 2 * 128;
    /* xs twice, yimg twice (f32 at most), colT, col, wT: per partition */
    int64_t bytes = 2 * plane * es + 2 * g->OH * Wp * 4 +
                    4 * Kc * es /* colT twice, the weight's staging twice */ +
                    FAST_D * 8 * 128 * es + 8 * g->CO * es + 4096;
    return bytes <= SK_SBUF_BUDGET;
}

/* The engine of the next PSUM evacuation: ScalarE and VectorE by turns
 * (GpSimd has no PSUM access). */
static nt_engine fast_eng(fastk *f, bool psum)
{
    (void)psum;
    return f->eng++ % 2 ? NT_ENGINE_VECTOR : NT_ENGINE_SCALAR;
}

static int fast_alloc(fastk *f)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    for (int i = 0; i < FAST_D; i++)
        for (int j = 0; j < f->nK; j++)
            f->col[i][j] = nt_tile_alloc(k, "conv.col", NT_MEM_SBUF, f->dt, 128, 128);
    for (int i = 0; i < 2; i++) {
        f->xs[i] = nt_tile_alloc(k, "conv.xs", NT_MEM_SBUF, f->dt, (int)g->C, f->Fx);
        f->colT[i] = nt_tile_alloc(k, "conv.colT", NT_MEM_SBUF, f->dt, 128, f->Kc);
        f->ys[i] = nt_tile_alloc(k, "conv.ys", NT_MEM_SBUF, NT_F32, 128, g->CO);
        f->pacc[i] = nt_tile_alloc(k, "conv.acc", NT_MEM_PSUM, NT_F32, 128, g->CO);
        f->pyT[i] = nt_tile_alloc(k, "conv.pyT", NT_MEM_PSUM, NT_F32, (int)g->CO, 128);
    }
    for (int i = 0; i < 8; i++)
        f->pxT[i] = nt_tile_alloc(k, "conv.pxT", NT_MEM_PSUM, f->dt, 128, g->C);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < f->nK; j++)
            f->pcol[i][j] = nt_tile_alloc(k, "conv.pcol", NT_MEM_PSUM, f->dt, 128, 128);
    f->wT = nt_tile_alloc(k, "conv.wT", NT_MEM_SBUF, f->dt, 128, f->nK * g->CO);
    for (int i = 0; i < 2; i++)
        f->yimg[i] = nt_tile_alloc(k, "conv.y", NT_MEM_SBUF, f->odt, (int)g->CO, f->Q);
    return nt_sim_kernel_error(k);
}

/* wT [K-chunk kc: 128 k, CO] from w' [CO, Kc] in HBM (wd): loaded with CO
 * on partitions, transposed chunk by chunk. */
static int fast_weights(fastk *f, const char *wd)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    nt_tile *ws = nt_tile_alloc(k, "conv.w", NT_MEM_SBUF, f->dt, (int)g->CO, f->Kc);
    nt_tile *wr = nt_tile_alloc(k, "conv.wr", NT_MEM_SBUF, f->dt, (int)g->CO, f->Kc);
    if (!ws || !wr)
        return nt_sim_kernel_error(k);
    /* w [CO, C, T] as it is (contiguous rows), permuted on chip into K
     * order (t, ci) (an element-wise DMA would cost a descriptor each) */
    nt_ap d = nt_tile_ap(wr), src = nt_hbm_ap(wd, f->dt, 0, (int)g->CO, f->Kc, f->Kc);
    nt_ap rv = nt_tile_slice(wr, 0, (int)g->CO, 0, 1);
    rv.ndim = 2, rv.num[0] = f->T, rv.step[0] = 1, rv.num[1] = g->C, rv.step[1] = f->T;
    if (g->flip) { /* w [C, CO, kh, kw]: rows co of (ci, tap) runs, taps reversed on chip */
        src = nt_hbm_ap(wd, f->dt, 0, (int)g->CO, f->T, f->T);
        src.ndim = 2, src.num[0] = g->C, src.step[0] = g->CO * f->T, src.num[1] = f->T,
        src.step[1] = 1;
        rv = nt_tile_slice(wr, 0, (int)g->CO, f->T - 1, 1); /* taps reversed */
        rv.ndim = 2, rv.num[0] = f->T, rv.step[0] = -1, rv.num[1] = g->C, rv.step[1] = f->T;
    }
    int rc = nt_isa_dma_copy(k, &d, &src, sk_qin(f->s));
    nt_ap o = nt_tile_ap(ws);
    if (!rc)
        rc = nt_isa_tensor_copy(k, &o, &rv, NT_ENGINE_GPSIMD);
    nt_tile_release(k, wr);
    for (int64_t kc = 0; !rc && kc < f->nK; kc++) {
        int64_t kw = f->Kc - kc * 128 < 128 ? f->Kc - kc * 128 : 128;
        nt_ap a = nt_tile_slice(ws, 0, (int)g->CO, kc * 128, kw);
        nt_ap t = nt_tile_slice(f->pcol[0][kc], 0, (int)kw, 0, g->CO);
        rc = nt_isa_nc_transpose(k, &t, &a);
        nt_ap ot = nt_tile_slice(f->wT, 0, (int)kw, kc * g->CO, g->CO);
        if (!rc)
            rc = nt_isa_tensor_copy(k, &ot, &t, NT_ENGINE_VECTOR);
    }
    nt_tile_release(k, ws);
    return rc;
}

/* Image n: xs (zeros, then x's plane inside). */
static int fast_load(fastk *f, const char *xd, int64_t n)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    nt_tile *xs = f->xs[n % 2];
    nt_ap all = nt_tile_ap(xs);
    int rc = nt_isa_memset(k, &all, 0.0, NT_ENGINE_GPSIMD);
    nt_ap src = nt_hbm_ap(xd, f->dt, n * g->C * g->H * g->W, (int)g->C, g->H * g->W, g->W);
    src.ndim = 2, src.num[0] = g->H, src.step[0] = g->W, src.num[1] = g->W, src.step[1] = 1;
    nt_ap d = nt_tile_slice(xs, 0, (int)g->C, f->pb[0] * f->Wp + f->pb[1], g->W);
    d.ndim = 2, d.num[0] = g->H, d.step[0] = f->Wp, d.num[1] = g->W, d.step[1] = 1;
    if (!rc)
        rc = nt_isa_dma_copy(k, &d, &src, sk_qin(f->s));
    return rc;
}

/* colT rows [0, qw) of the block at q0: per tap, TensorE transposes xs's
 * positions q0 + off_t .. (x's channels on partitions) into PSUM, and a
 * copy interleaves them into colT's K order (a compute engine may only
 * start at partition 0, 32, 64 or 96, so the transpose, not a
 * partition-shifted copy, moves the positions onto partitions). */
static int fast_colT(fastk *f, nt_tile *colT, nt_tile *xs, int64_t q0, int64_t qw)
{
    const nt__conv_geo *g = f->g;
    int rc = 0;
    for (int64_t t = 0; !rc && t < f->T; t++) {
        nt_ap a = nt_tile_slice(xs, 0, (int)g->C, q0 + f->off[t], qw);
        nt_ap tp = nt_tile_slice(f->pxT[f->eng % 8], 0, (int)qw, 0, g->C);
        rc = nt_isa_nc_transpose(f->s->k, &tp, &a);
        nt_ap d = nt_tile_slice(colT, 0, (int)qw, t * g->C, g->C);
        if (!rc)
            rc = nt_isa_tensor_copy(f->s->k, &d, &tp, fast_eng(f, true));
    }
    return rc;
}

/* The three stages of a block of 128 flat positions (b counts blocks over
 * every image, so the buffers alternate across images too):
 * A: colT; B: col (TensorE transposes, evacuated); C: the matmuls and the
 * output.  fast_run issues them software-pipelined (A of block b, B of
 * b - 1, C of b - 2), so TensorE and the evacuating engines work on
 * different blocks instead of waiting for each other in turn. */
typedef struct fblk {
    int64_t b, q0, qw, n;
} fblk;

static int fast_stage_b(fastk *f, const fblk *k2)
{
    nt_sim_kernel *k = f->s->k;
    nt_tile *colT = f->colT[k2->b % 2], **col = f->col[k2->b % FAST_D];
    int rc = 0;
    for (int64_t kc = 0; !rc && kc < f->nK; kc++) {
        int64_t kw = f->Kc - kc * 128 < 128 ? f->Kc - kc * 128 : 128;
        nt_ap a = nt_tile_slice(colT, 0, (int)k2->qw, kc * 128, kw);
        nt_ap t = nt_tile_slice(f->pcol[k2->b % 2][kc], 0, (int)kw, 0, k2->qw);
        rc = nt_isa_nc_transpose(k, &t, &a);
        nt_ap o = nt_tile_slice(col[kc], 0, (int)kw, 0, k2->qw);
        if (!rc)
            rc = nt_isa_tensor_copy(k, &o, &t, fast_eng(f, true));
    }
    return rc;
}

static int fast_stage_c(fastk *f, const fblk *k3)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    int64_t b = k3->b, qw = k3->qw;
    nt_tile **col = f->col[b % FAST_D];
    nt_ap ad = nt_tile_slice(f->pacc[b % 2], 0, (int)qw, 0, g->CO);
    int rc = 0;
    for (int64_t kc = 0; !rc && kc < f->nK; kc++) {
        int64_t kw = f->Kc - kc * 128 < 128 ? f->Kc - kc * 128 : 128;
        nt_ap st = nt_tile_slice(col[kc], 0, (int)kw, 0, qw);
        nt_ap mv = nt_tile_slice(f->wT, 0, (int)kw, kc * g->CO, g->CO);
        rc = nt_isa_nc_matmul(k, &ad, &st, &mv, kc > 0);
    }
    nt_ap ys = nt_tile_slice(f->ys[b % 2], 0, (int)qw, 0, g->CO);
    if (!rc)
        rc = nt_isa_tensor_copy(k, &ys, &ad, NT_ENGINE_SCALAR);
    nt_ap yt = nt_tile_slice(f->pyT[b % 2], 0, (int)g->CO, 0, qw);
    if (!rc)
        rc = nt_isa_nc_transpose(k, &yt, &ys);
    nt_ap yo = nt_tile_slice(f->yimg[k3->n % 2], 0, (int)g->CO, k3->q0, qw);
    if (!rc)
        rc = nt_isa_tensor_copy(k, &yo, &yt, NT_ENGINE_VECTOR);
    return rc;
}

/* Image n's output rows (the extra columns dropped) to y. */
static int fast_store(fastk *f, char *yd, int64_t n)
{
    const nt__conv_geo *g = f->g;
    int64_t L = g->OH * g->OW;
    nt_ap src = nt_tile_slice(f->yimg[n % 2], 0, (int)g->CO, 0, g->OW);
    src.ndim = 2, src.num[0] = g->OH, src.step[0] = f->Wp, src.num[1] = g->OW, src.step[1] = 1;
    nt_ap d = nt_hbm_ap(yd, f->odt, n * g->CO * L, (int)g->CO, L, L);
    return nt_isa_dma_copy(f->s->k, &d, &src, sk_qout(f->s));
}

/* ---------------- the shifted-view kernel: C in {32, 64, 128} ----------------
 *
 * With K = (ki, kj, ci) and C dividing 128, K-tile kc is m = 128 / C whole
 * taps t0 = kc m, t0 + 1, ..: partitions j C .. (j + 1) C - 1 are tap t0 +
 * j's channels, and its rows at block q0 are the padded plane's positions
 * q0 + off(t0 + j) ..  So the K-tile is one SBUF view -- positions q0 +
 * off(t0) of a copy of the plane whose segment j holds the plane shifted
 * by off(t0 + j) - off(t0) -- and TensorE multiplies it as it is, no
 * transpose.  Per image the plane is loaded by DMA into partitions [0, C)
 * of each distinct copy (the zeros around it written once), and GpSimd
 * copies it, shifted, into the other segments (an engine access starts at
 * partition 0, 32, 64 or 96: C a multiple of 32).  Per block of 128 flat
 * positions: acc [q, CO] (+)= view[kc]^T . wT[kc] over the K-tiles in
 * ascending order (the positions stationary: M = 128), copied to SBUF by
 * ScalarE, transposed by TensorE to [CO, q] and rounded once by VectorE into
 * the image's rows -- the transposing kernel's arithmetic, step for step:
 * the same bits.  The next image loads while this one multiplies; a
 * block's transpose is issued after the next block's matmuls so TensorE
 * does not wait for the copy. */

/* Plans the copies; false when the kernel does not apply. */
static bool sv_plan(fastk *f)
{
    const nt__conv_geo *g = f->g;
    int64_t C = g->C, es = (int64_t)nt__dtype_size(f->dt);
    if ((C != 32 && C != 64 && C != 128) || f->nK > 8 || f->Fx > 65536)
        return false;
    f->m = 128 / C;
    f->nsig = 0;
    for (int64_t kc = 0; kc < f->nK; kc++) {
        int64_t t0 = kc * f->m, mm = f->T - t0 < f->m ? f->T - t0 : f->m;
        int sg;
        for (sg = 0; sg < f->nsig; sg++) {
            bool ok = f->nseg[sg] >= mm;
            for (int64_t j = 1; ok && j < mm; j++)
                ok = f->delta[sg][j] == f->off[t0 + j] - f->off[t0];
            if (ok)
                break;
        }
        if (sg == f->nsig) {
            f->nseg[sg] = (int)mm, f->delta[sg][0] = 0;
            for (int64_t j = 1; j < mm; j++)
                f->delta[sg][j] = f->off[t0 + j] - f->off[t0];
            f->nsig++;
        }
        f->sig[kc] = sg;
    }
    /* the copies twice, yimg twice (f32 at most), the weight's staging, wT */
    int64_t bytes = 2 * f->nsig * f->Fx * es + 2 * f->Q * 4 + 4 * f->Kc * es +
                    f->nK * g->CO * es + 2 * g->CO * 4 + 4096;
    return bytes <= SK_SBUF_BUDGET;
}

/* The zeros around the plane in partitions [0, C) of copy t (once: the
 * loads write only the interior). */
static int sv_zero(fastk *f, nt_tile *t)
{
    const nt__conv_geo *g = f->g;
    int64_t a = f->pb[0] * f->Wp + f->pb[1], gap = f->Wp - g->W;
    int64_t end = (f->pb[0] + g->H - 1) * f->Wp + f->pb[1] + g->W;
    int rc = 0;
    if (a > 0) {
        nt_ap z = nt_tile_slice(t, 0, (int)g->C, 0, a);
        rc = nt_isa_memset(f->s->k, &z, 0.0, NT_ENGINE_GPSIMD);
    }
    if (!rc && gap > 0 && g->H > 1) {
        nt_ap z = nt_tile_slice(t, 0, (int)g->C, a + g->W, gap);
        z.ndim = 2, z.num[0] = g->H - 1, z.step[0] = f->Wp, z.num[1] = gap, z.step[1] = 1;
        rc = nt_isa_memset(f->s->k, &z, 0.0, NT_ENGINE_GPSIMD);
    }
    if (!rc && end < f->Fx) {
        nt_ap z = nt_tile_slice(t, 0, (int)g->C, end, f->Fx - end);
        rc = nt_isa_memset(f->s->k, &z, 0.0, NT_ENGINE_GPSIMD);
    }
    return rc;
}

static int sv_alloc(fastk *f)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    for (int i = 0; i < SV_D; i++) {
        f->ys[i] = nt_tile_alloc(k, "conv.ys", NT_MEM_SBUF, NT_F32, 128, g->CO);
        f->pacc[i] = nt_tile_alloc(k, "conv.acc", NT_MEM_PSUM, NT_F32, 128, g->CO);
        f->pyT[i] = nt_tile_alloc(k, "conv.pyT", NT_MEM_PSUM, NT_F32, (int)g->CO, 128);
    }
    for (int i = 0; i < 2; i++) {
        for (int sg = 0; sg < f->nsig; sg++)
            f->xv[i][sg] = nt_tile_alloc(k, "conv.xv", NT_MEM_SBUF, f->dt, 128, f->Fx);
        f->yimg[i] = nt_tile_alloc(k, "conv.y", NT_MEM_SBUF, f->odt, (int)g->CO, f->Q);
    }
    for (int j = 0; j < f->nK; j++) /* fast_weights' transposes */
        f->pcol[0][j] = nt_tile_alloc(k, "conv.pcol", NT_MEM_PSUM, f->dt, 128, 128);
    f->wT = nt_tile_alloc(k, "conv.wT", NT_MEM_SBUF, f->dt, 128, f->nK * g->CO);
    int rc = nt_sim_kernel_error(k);
    for (int i = 0; !rc && i < 2; i++)
        for (int sg = 0; !rc && sg < f->nsig; sg++)
            rc = sv_zero(f, f->xv[i][sg]);
    return rc;
}

/* Image n into its copies: the plane by DMA into partitions [0, C) of
 * each, then segment j (partitions j C ..) = the plane from element
 * delta_j on, by GpSimd. */
static int sv_load(fastk *f, const char *xd, int64_t n)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    int rc = 0;
    for (int sg = 0; !rc && sg < f->nsig; sg++) {
        nt_tile *t = f->xv[n % 2][sg];
        nt_ap src = nt_hbm_ap(xd, f->dt, n * g->C * g->H * g->W, (int)g->C, g->H * g->W, g->W);
        src.ndim = 2, src.num[0] = g->H, src.step[0] = g->W, src.num[1] = g->W, src.step[1] = 1;
        nt_ap d = nt_tile_slice(t, 0, (int)g->C, f->pb[0] * f->Wp + f->pb[1], g->W);
        d.ndim = 2, d.num[0] = g->H, d.step[0] = f->Wp, d.num[1] = g->W, d.step[1] = 1;
        rc = nt_isa_dma_copy(k, &d, &src, sk_qin(f->s));
        for (int j = 1; !rc && j < f->nseg[sg]; j++) {
            int64_t dl = f->delta[sg][j];
            nt_ap a = nt_tile_slice(t, 0, (int)g->C, dl, f->Fx - dl);
            nt_ap o = nt_tile_slice(t, j * (int)g->C, (int)g->C, 0, f->Fx - dl);
            rc = nt_isa_tensor_copy(k, &o, &a, NT_ENGINE_GPSIMD);
        }
    }
    return rc;
}

/* Block b's matmuls over the K-tiles in ascending order, and acc to ys. */
static int sv_mm(fastk *f, const fblk *bk)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    nt_ap ad = nt_tile_slice(f->pacc[bk->b % SV_D], 0, (int)bk->qw, 0, g->CO);
    int rc = 0;
    for (int64_t kc = 0; !rc && kc < f->nK; kc++) {
        int64_t kw = f->Kc - kc * 128 < 128 ? f->Kc - kc * 128 : 128;
        nt_tile *v = f->xv[bk->n % 2][f->sig[kc]];
        nt_ap st = nt_tile_slice(v, 0, (int)kw, bk->q0 + f->off[kc * f->m], bk->qw);
        nt_ap mv = nt_tile_slice(f->wT, 0, (int)kw, kc * g->CO, g->CO);
        rc = nt_isa_nc_matmul(k, &ad, &st, &mv, kc > 0);
    }
    nt_ap ys = nt_tile_slice(f->ys[bk->b % SV_D], 0, (int)bk->qw, 0, g->CO);
    if (!rc)
        rc = nt_isa_tensor_copy(k, &ys, &ad, NT_ENGINE_SCALAR);
    return rc;
}

/* Block b's output: ys transposed to [CO, q], rounded into the image's rows;
 * the image stored after its last block. */
static int sv_out(fastk *f, const fblk *bk, char *yd)
{
    nt_sim_kernel *k = f->s->k;
    const nt__conv_geo *g = f->g;
    nt_ap ys = nt_tile_slice(f->ys[bk->b % SV_D], 0, (int)bk->qw, 0, g->CO);
    nt_ap yt = nt_tile_slice(f->pyT[bk->b % SV_D], 0, (int)g->CO, 0, bk->qw);
    int rc = nt_isa_nc_transpose(k, &yt, &ys);
    nt_ap yo = nt_tile_slice(f->yimg[bk->n % 2], 0, (int)g->CO, bk->q0, bk->qw);
    /* ScalarE, not VectorE: VectorE would wait for GpSimd's long copies
     * (they share the SBUF port on trn1) and TensorE for it */
    if (!rc)
        rc = nt_isa_tensor_copy(k, &yo, &yt, NT_ENGINE_SCALAR);
    if (!rc && bk->q0 + bk->qw == f->Q)
        rc = fast_store(f, yd, bk->n);
    return rc;
}

static int sv_run(fastk *f, const nt_tensor *x, const char *wd, const nt_tensor *y)
{
    const nt__conv_geo *g = f->g;
    int rc = sv_alloc(f);
    if (!rc)
        rc = fast_weights(f, wd);
    const char *xd = nt__tensor_data(x);
    char *yd = nt__tensor_data(y);
    int64_t nb = (f->Q + 127) / 128, total = g->N * nb;
    fblk prev = {0, 0, 0, 0};
    for (int64_t i = 0; !rc && i < total; i++) {
        fblk a = {i, (i % nb) * 128, 0, i / nb};
        a.qw = f->Q - a.q0 < 128 ? f->Q - a.q0 : 128;
        if (i == 0)
            rc = sv_load(f, xd, 0);
        if (!rc && a.q0 == 0 && a.n + 1 < g->N) /* the next image, ahead */
            rc = sv_load(f, xd, a.n + 1);
        if (!rc)
            rc = sv_mm(f, &a);
        if (!rc && i > 0)
            rc = sv_out(f, &prev, yd);
        prev = a;
    }
    if (!rc && total > 0)
        rc = sv_out(f, &prev, yd);
    return rc;
}

/* The geometry both SBUF kernels share: the padded plane, the taps'
 * offsets in it, the flat positions Q. */
static void fast_geo(fastk *fp, sk_k *s, const nt__conv_geo *g, nt_dtype dt, nt_dtype odt)
{
    fastk f;
    memset(&f, 0, sizeof f);
    f.s = s, f.g = g, f.dt = dt, f.odt = odt;
    f.T = g->kh * g->kw, f.Kc = g->C * f.T, f.nK = (f.Kc + 127) / 128;
    f.pb[0] = g->lo[0] > 0 ? g->lo[0] : 0, f.pb[1] = g->lo[1] > 0 ? g->lo[1] : 0;
    f.Wp = g->OW + (g->kw - 1) * g->d[1];
    if (f.Wp < f.pb[1] + g->W)
        f.Wp = f.pb[1] + g->W;
    f.Hp = g->OH + (g->kh - 1) * g->d[0] + 1;
    if (f.Hp < f.pb[0] + g->H)
        f.Hp = f.pb[0] + g->H;
    f.Q = g->OH * f.Wp;
    int64_t offmax = 0;
    for (int64_t ki = 0; ki < g->kh; ki++)
        for (int64_t kj = 0; kj < g->kw; kj++) {
            int64_t o = (ki * g->d[0] - g->lo[0] + f.pb[0]) * f.Wp + kj * g->d[1] - g->lo[1] +
                        f.pb[1];
            f.off[ki * g->kw + kj] = o;
            offmax = o > offmax ? o : offmax;
        }
    f.Fx = f.Q + offmax > f.Hp * f.Wp ? f.Q + offmax : f.Hp * f.Wp;
    f.nch = (f.Fx + 127) / 128;
    f.Fx = f.nch * 128; /* whole chunks: the tail is zeros */
    *fp = f;
}

static int sv_run(fastk *f, const nt_tensor *x, const char *wd, const nt_tensor *y);

static int fast_run(sk_k *s, const nt__conv_geo *g, const nt_tensor *x, const char *wd,
                    const nt_tensor *y)
{
    fastk f;
    fast_geo(&f, s, g, (nt_dtype)x->dtype, (nt_dtype)y->dtype);
    if (sv_plan(&f))
        return sv_run(&f, x, wd, y);
    int rc = fast_alloc(&f);
    if (!rc)
        rc = fast_weights(&f, wd);
    const char *xd = nt__tensor_data(x);
    char *yd = nt__tensor_data(y);
    int64_t nb = (f.Q + 127) / 128, total = g->N * nb;
    fblk q[FAST_D + 1]; /* the blocks in stages A, B, C */
    for (int64_t i = 0; !rc && i < total + FAST_D; i++) {
        if (i < total) {
            fblk a = {i, (i % nb) * 128, 0, i / nb};
            a.qw = f.Q - a.q0 < 128 ? f.Q - a.q0 : 128;
            if (a.q0 == 0)
                rc = fast_load(&f, xd, a.n);
            if (!rc)
                rc = fast_colT(&f, f.colT[i % 2], f.xs[a.n % 2], a.q0, a.qw);
            q[i % (FAST_D + 1)] = a;
        }
        if (!rc && i >= 1 && i - 1 < total)
            rc = fast_stage_b(&f, &q[(i - 1) % (FAST_D + 1)]);
        if (!rc && i >= FAST_D) {
            const fblk *c = &q[(i - FAST_D) % (FAST_D + 1)];
            rc = fast_stage_c(&f, c);
            if (!rc && c->q0 + c->qw == f.Q) /* the image's last block */
                rc = fast_store(&f, yd, c->n);
        }
    }
    return rc;
}

static int conv_gemm_run(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    nt__conv_geo g;
    nt__conv_geo_of(r, false, &g);
    const nt_tensor *x = r->in[0], *w = r->in[1], *y = r->out[0];
    nt_dtype dt = (nt_dtype)x->dtype, odt = (nt_dtype)y->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt), oes = (int64_t)nt__dtype_size(odt);
    int64_t Cg = g.C / g.G, COg = g.CO / g.G, Kc = Cg * g.kh * g.kw, L = g.OH * g.OW;
    int64_t NL = g.N * L;
    if (NL == 0 || g.CO == 0)
        return 0;
    bool fast = fast_ok(&g, dt);
    char *col = fast ? NULL : sk_scratch(s, (size_t)(g.G * Kc * NL * es));
    if (!fast && !col)
        return s->derr_code;
    int rc = fast ? 0 : columns(s, &g, x, col);
    const char *wd = nt__tensor_data(w);
    int64_t T = g.kh * g.kw;
    if (!rc && !g.flip && !fast && T > 1 && Cg > 1) { /* w' [CO, (t, ci)] into scratch */
        char *wt = sk_scratch(s, (size_t)(g.CO * Kc * es));
        if (!wt)
            return s->derr_code;
        for (int64_t c0 = 0; !rc && c0 < g.CO; c0 += 128) {
            int np = (int)(g.CO - c0 < 128 ? g.CO - c0 : 128);
            nt_ap src = nt_hbm_ap(wd, dt, c0 * Kc, np, Kc, Kc);
            src.ndim = 2, src.num[0] = T, src.step[0] = 1, src.num[1] = Cg, src.step[1] = T;
            nt_ap d = nt_hbm_ap(wt, dt, c0 * Kc, np, Kc, Kc);
            rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
        }
        wd = wt;
    }
    if (!rc && g.flip && !fast) { /* w' into scratch: one DMA per input channel */
        char *wt = sk_scratch(s, (size_t)(g.CO * Kc * es));
        if (!wt)
            return s->derr_code;
        for (int64_t c = 0; !rc && c < g.C; c++) {
            int64_t grp = c / Cg, ci = c % Cg, kk = g.kh * g.kw;
            nt_ap src;
            memset(&src, 0, sizeof src);
            src.hbm = (void *)wd, src.dtype = dt, src.np = (int)COg, src.pstep = kk;
            src.offset = c * COg * kk + kk - 1; /* w[c][co][kh-1][kw-1], walked down */
            src.ndim = 2;
            src.num[0] = g.kh, src.step[0] = -g.kw;
            src.num[1] = g.kw, src.step[1] = -1;
            nt_ap d = nt_hbm_ap(wt, dt, grp * COg * Kc + ci, (int)COg, Kc, kk);
            d.step[0] = Cg; /* tap t of channel ci at t Cg + ci */
            rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
        }
        wd = wt;
    }
    if (fast)
        return rc ? rc : fast_run(s, &g, x, wd, y);
    char *yd = nt__tensor_data(y);
    for (int64_t n = 0; !rc && n < g.N; n++)
        for (int64_t grp = 0; !rc && grp < g.G; grp++) {
            nt_tile_matmul_args a;
            memset(&a, 0, sizeof a);
            a.M = COg, a.N = L, a.K = Kc;
            a.a = wd + grp * COg * Kc * es, a.lda = Kc;
            a.b = col + (grp * Kc * NL + n * L) * es, a.ldb = NL;
            a.in_dtype = dt;
            a.c = yd + (n * g.CO + grp * COg) * L * oes, a.ldc = L;
            a.out_dtype = odt;
            rc = nt_tile_matmul(s->k, &a);
        }
    return rc;
}

/* ---------------- the weight gradient on chip ----------------
 *
 * Stride 1, one group, C in {32, 64, 128}, OH OW a multiple of 64.  The
 * contract's K-tiles are 128 consecutive flat positions p = (n, oh, ow),
 * across rows and images, so both operands need the positions on
 * partitions.  Per image the column rows are built in SBUF, compact over
 * (oh, ow): K-chunk kc's tile holds tap t0 + j's channels on partitions j
 * C .. (the K order (ki, kj, ci)), each tap's valid rectangle loaded by DMA
 * from x or copied by ScalarE from x's plane in SBUF (the identity tap's
 * rows, when the convolution has one), its zeros written once.  Per position tile: TensorE transposes
 * each K-chunk's [K, 128 p] view (an image boundary inside the tile: two
 * transposes into PSUM partitions [0, 64) and [64, 128)) and gy's [CO, 128
 * p] (DMA'd per tile), the copies evacuate, and acc[kc] [K, CO] (+)= colT^T
 * . gyT accumulates in PSUM over the tiles in ascending order: the
 * recurrence of the CPU's product, the same bits.  The matmuls of tile i
 * are issued after tile i + 1's transposes.  At the end acc is transposed
 * to [CO, K], permuted into w's (ci, ki, kj) and rounded once. */

typedef struct wgk {
    sk_k *s;
    const nt__conv_geo *g;
    nt_dtype dt, odt;
    int64_t L, P, Kc, nK, T, m, loaded, ident; /* ident: the identity tap, or -1 */
    int64_t ra[64], rb[64], ca[64], cb[64]; /* per tap: the valid rows, cols */
    nt_tile *cp[2][8], *colT[2][8], *gyc[4], *gyT[2], *ptc[2][8], *ptg[2], *acc[8], *xc;
    int eng;
} wgk;

static bool wg_ok(const nt__conv_geo *g, nt_dtype dt)
{
    int64_t es = (int64_t)nt__dtype_size(dt), T = g->kh * g->kw, Kc = g->C * T;
    int64_t L = g->OH * g->OW, nK = (Kc + 127) / 128;
    if (g->s[0] != 1 || g->s[1] != 1 || g->u[0] != 1 || g->u[1] != 1 || g->G != 1 ||
        (g->C != 32 && g->C != 64 && g->C != 128) || g->CO < 1 || g->CO > 128 ||
        Kc > FAST_MAX_KC || T > 64 || g->N == 0 || L == 0 || L % 64 || L > 65536)
        return false;
    int64_t bytes = 2 * nK * L * es + g->H * g->W * es + 2 * nK * 128 * es + 6 * 128 * es +
                    3 * Kc * 4 + g->CO * 4 + 4096;
    return bytes <= SK_SBUF_BUDGET;
}

/* Valid output range [*a, *b) of a tap offset off = k d - lo along a dim
 * of input size n and output size o (stride 1). */
static void wg_range(int64_t off, int64_t n, int64_t o, int64_t *a, int64_t *b)
{
    int64_t lo = off >= 0 ? 0 : -off, hi = n - off;
    hi = hi < o ? hi : o;
    *a = lo < o ? lo : o;
    *b = hi < *a ? *a : hi;
}

/* The PSUM evacuations: VectorE (ScalarE builds column rows, GpSimd would
 * hold VectorE's SBUF port). */
static nt_engine wg_eng(wgk *w)
{
    (void)w;
    return NT_ENGINE_VECTOR;
}

static int wg_alloc(wgk *w)
{
    nt_sim_kernel *k = w->s->k;
    const nt__conv_geo *g = w->g;
    for (int i = 0; i < 2; i++) {
        for (int kc = 0; kc < w->nK; kc++) {
            w->cp[i][kc] = nt_tile_alloc(k, "wg.cp", NT_MEM_SBUF, w->dt, 128, w->L);
            w->colT[i][kc] = nt_tile_alloc(k, "wg.colT", NT_MEM_SBUF, w->dt, 128, 128);
            w->ptc[i][kc] = nt_tile_alloc(k, "wg.ptc", NT_MEM_PSUM, w->dt, 128, 128);
        }
        w->gyT[i] = nt_tile_alloc(k, "wg.gyT", NT_MEM_SBUF, w->dt, 128, g->CO);
        w->ptg[i] = nt_tile_alloc(k, "wg.ptg", NT_MEM_PSUM, w->dt, 128, g->CO);
    }
    for (int i = 0; i < 4; i++)
        w->gyc[i] = nt_tile_alloc(k, "wg.gy", NT_MEM_SBUF, w->dt, (int)g->CO, 128);
    if (w->ident < 0)
        w->xc = nt_tile_alloc(k, "wg.x", NT_MEM_SBUF, w->dt, (int)g->C, g->H * g->W);
    for (int kc = 0; kc < w->nK; kc++)
        w->acc[kc] = nt_tile_alloc(k, "wg.acc", NT_MEM_PSUM, NT_F32, 128, g->CO);
    int rc = nt_sim_kernel_error(k);
    /* the zeros of every tap's segment, once (the loads write only the
     * valid rectangle) */
    for (int i = 0; !rc && i < 2; i++)
        for (int64_t t = 0; !rc && t < w->T; t++) {
            nt_tile *c = w->cp[i][t / w->m];
            int p0 = (int)((t % w->m) * g->C), np = (int)g->C;
            int64_t ra = w->ra[t], rb = w->rb[t], ca = w->ca[t], cb = w->cb[t];
            nt_ap z[4];
            int nz = 0;
            if (ra >= rb || ca >= cb) {
                z[nz++] = nt_tile_slice(c, p0, np, 0, w->L);
            } else {
                if (ra > 0)
                    z[nz++] = nt_tile_slice(c, p0, np, 0, ra * g->OW);
                if (rb < g->OH)
                    z[nz++] = nt_tile_slice(c, p0, np, rb * g->OW, (g->OH - rb) * g->OW);
                for (int side = 0; side < 2; side++) {
                    int64_t c0 = side ? cb : 0, nc = side ? g->OW - cb : ca;
                    if (nc <= 0)
                        continue;
                    nt_ap a = nt_tile_slice(c, p0, np, ra * g->OW + c0, nc);
                    a.ndim = 2, a.num[0] = rb - ra, a.step[0] = g->OW, a.num[1] = nc,
                    a.step[1] = 1;
                    z[nz++] = a;
                }
            }
            for (int q = 0; !rc && q < nz; q++)
                rc = nt_isa_memset(k, &z[q], 0.0, NT_ENGINE_GPSIMD);
        }
    return rc;
}

/* Tap t's valid rectangle of image n into cp[n % 2] by DMA from x. */
static int wg_tap_dma(wgk *w, const char *xd, int64_t n, int64_t t)
{
    const nt__conv_geo *g = w->g;
    int64_t ki = t / g->kw, kj = t % g->kw, ra = w->ra[t], rb = w->rb[t];
    int64_t ca = w->ca[t], cb = w->cb[t];
    int64_t ih = ra + ki * g->d[0] - g->lo[0], iw = ca + kj * g->d[1] - g->lo[1];
    nt_ap src = nt_hbm_ap(xd, w->dt, (n * g->C * g->H + ih) * g->W + iw, (int)g->C,
                          g->H * g->W, cb - ca);
    src.ndim = 2, src.num[0] = rb - ra, src.step[0] = g->W, src.num[1] = cb - ca,
    src.step[1] = 1;
    nt_ap d = nt_tile_slice(w->cp[n % 2][t / w->m], (int)((t % w->m) * g->C), (int)g->C,
                            ra * g->OW + ca, cb - ca);
    d.ndim = 2, d.num[0] = rb - ra, d.step[0] = g->OW, d.num[1] = cb - ca, d.step[1] = 1;
    return nt_isa_dma_copy(w->s->k, &d, &src, sk_qin(w->s));
}

/* Image n's column rows (the valid rectangles) into cp[n % 2]: some taps by
 * DMA from x, the others by ScalarE from x's plane in SBUF (the DMA
 * engines' bandwidth would bound the kernel otherwise).  The plane is the
 * identity tap's rows when there is one (offset 0 and OH, OW = H, W: the
 * centre of a "same" convolution), so it comes with the double-buffered
 * columns; else xc, loaded once per image. */
static int wg_load(wgk *w, const char *xd, int64_t n)
{
    const nt__conv_geo *g = w->g;
    int64_t id = w->ident, ndma = id >= 0 ? w->T / 4 + 1 : w->T / 3;
    int rc = 0, xp0 = 0;
    nt_tile *xs = w->xc;
    if (id >= 0) {
        rc = wg_tap_dma(w, xd, n, id);
        xs = w->cp[n % 2][id / w->m], xp0 = (int)((id % w->m) * g->C);
    } else if (ndma < w->T) {
        nt_ap src = nt_hbm_ap(xd, w->dt, n * g->C * g->H * g->W, (int)g->C, g->H * g->W,
                              g->H * g->W);
        nt_ap d = nt_tile_ap(w->xc);
        rc = nt_isa_dma_copy(w->s->k, &d, &src, sk_qin(w->s));
    }
    for (int64_t t = 0, nd = id >= 0; !rc && t < w->T; t++) {
        int64_t ki = t / g->kw, kj = t % g->kw, ra = w->ra[t], rb = w->rb[t];
        int64_t ca = w->ca[t], cb = w->cb[t];
        if (t == id || ra >= rb || ca >= cb)
            continue;
        if (nd < ndma) {
            nd++;
            rc = wg_tap_dma(w, xd, n, t);
            continue;
        }
        int64_t ih = ra + ki * g->d[0] - g->lo[0], iw = ca + kj * g->d[1] - g->lo[1];
        nt_ap d = nt_tile_slice(w->cp[n % 2][t / w->m], (int)((t % w->m) * g->C), (int)g->C,
                                ra * g->OW + ca, cb - ca);
        d.ndim = 2, d.num[0] = rb - ra, d.step[0] = g->OW, d.num[1] = cb - ca, d.step[1] = 1;
        nt_ap a = nt_tile_slice(xs, xp0, (int)g->C, ih * g->W + iw, cb - ca);
        a.ndim = 2, a.num[0] = rb - ra, a.step[0] = g->W, a.num[1] = cb - ca, a.step[1] = 1;
        rc = nt_isa_tensor_copy(w->s->k, &d, &a, NT_ENGINE_SCALAR);
    }
    return rc;
}

/* Tile i (positions [128 i, 128 i + len)): the transposes and their
 * evacuations into colT[i % 2], gyT[i % 2]. */
static int wg_stage_a(wgk *w, const char *xd, const char *gd, int64_t i)
{
    nt_sim_kernel *k = w->s->k;
    const nt__conv_geo *g = w->g;
    int64_t p0 = i * 128, len = w->P - p0 < 128 ? w->P - p0 : 128;
    int par = (int)(i % 2), rc = 0;
    nt_tile *gc = w->gyc[i % 4];
    for (int64_t c = 0; !rc && c < len;) {
        int64_t n = (p0 + c) / w->L, pa = (p0 + c) % w->L;
        int64_t l = len - c < w->L - pa ? len - c : w->L - pa;
        for (; !rc && w->loaded < n + 1 && w->loaded + 1 < g->N; w->loaded++)
            rc = wg_load(w, xd, w->loaded + 1); /* one image ahead */
        for (int64_t kc = 0; !rc && kc < w->nK; kc++) {
            int64_t kw = w->Kc - kc * 128 < 128 ? w->Kc - kc * 128 : 128;
            nt_ap a = nt_tile_slice(w->cp[n % 2][kc], 0, (int)kw, pa, l);
            nt_ap t = nt_tile_slice(w->ptc[par][kc], (int)c, (int)l, 0, kw);
            rc = nt_isa_nc_transpose(k, &t, &a);
        }
        nt_ap src = nt_hbm_ap(gd, w->dt, n * g->CO * w->L + pa, (int)g->CO, w->L, l);
        nt_ap d = nt_tile_slice(gc, 0, (int)g->CO, c, l);
        if (!rc) /* the output queues, idle till the end: not behind the loads */
            rc = nt_isa_dma_copy(k, &d, &src, sk_qout(w->s));
        c += l;
    }
    nt_ap ga = nt_tile_slice(gc, 0, (int)g->CO, 0, len);
    nt_ap gt = nt_tile_slice(w->ptg[par], 0, (int)len, 0, g->CO);
    if (!rc)
        rc = nt_isa_nc_transpose(k, &gt, &ga);
    for (int64_t kc = 0; !rc && kc < w->nK; kc++) {
        int64_t kw = w->Kc - kc * 128 < 128 ? w->Kc - kc * 128 : 128;
        nt_ap t = nt_tile_slice(w->ptc[par][kc], 0, (int)len, 0, kw);
        nt_ap o = nt_tile_slice(w->colT[par][kc], 0, (int)len, 0, kw);
        rc = nt_isa_tensor_copy(k, &o, &t, wg_eng(w));
    }
    nt_ap go = nt_tile_slice(w->gyT[par], 0, (int)len, 0, g->CO);
    if (!rc)
        rc = nt_isa_tensor_copy(k, &go, &gt, wg_eng(w));
    return rc;
}

/* Tile i's matmuls: acc[kc] (+)= colT[kc]^T . gyT. */
static int wg_stage_b(wgk *w, int64_t i)
{
    const nt__conv_geo *g = w->g;
    int64_t len = w->P - i * 128 < 128 ? w->P - i * 128 : 128;
    int par = (int)(i % 2), rc = 0;
    for (int64_t kc = 0; !rc && kc < w->nK; kc++) {
        int64_t kw = w->Kc - kc * 128 < 128 ? w->Kc - kc * 128 : 128;
        nt_ap ad = nt_tile_slice(w->acc[kc], 0, (int)kw, 0, g->CO);
        nt_ap st = nt_tile_slice(w->colT[par][kc], 0, (int)len, 0, kw);
        nt_ap mv = nt_tile_slice(w->gyT[par], 0, (int)len, 0, g->CO);
        rc = nt_isa_nc_matmul(w->s->k, &ad, &st, &mv, i > 0);
    }
    return rc;
}

/* acc [K, CO] -> dw [CO, (ci, ki, kj)]: transposed, permuted, rounded once. */
static int wg_finish(wgk *w, char *od)
{
    nt_sim_kernel *k = w->s->k;
    const nt__conv_geo *g = w->g;
    nt_tile *as = nt_tile_alloc(k, "wg.as", NT_MEM_SBUF, NT_F32, 128, g->CO);
    nt_tile *pf = nt_tile_alloc(k, "wg.pf", NT_MEM_PSUM, NT_F32, (int)g->CO, 128);
    nt_tile *dk = nt_tile_alloc(k, "wg.dk", NT_MEM_SBUF, NT_F32, (int)g->CO, w->Kc);
    nt_tile *dout = nt_tile_alloc(k, "wg.do", NT_MEM_SBUF, w->odt, (int)g->CO, w->Kc);
    int rc = nt_sim_kernel_error(k);
    for (int64_t kc = 0; !rc && kc < w->nK; kc++) {
        int64_t kw = w->Kc - kc * 128 < 128 ? w->Kc - kc * 128 : 128;
        nt_ap a = nt_tile_slice(w->acc[kc], 0, (int)kw, 0, g->CO);
        nt_ap s = nt_tile_slice(as, 0, (int)kw, 0, g->CO);
        rc = nt_isa_tensor_copy(k, &s, &a, NT_ENGINE_SCALAR);
        nt_ap t = nt_tile_slice(pf, 0, (int)g->CO, 0, kw);
        if (!rc)
            rc = nt_isa_nc_transpose(k, &t, &s);
        nt_ap o = nt_tile_slice(dk, 0, (int)g->CO, kc * 128, kw);
        if (!rc)
            rc = nt_isa_tensor_copy(k, &o, &t, NT_ENGINE_VECTOR);
    }
    nt_ap src = nt_tile_slice(dk, 0, (int)g->CO, 0, 1); /* (ci, t) from (t, ci) */
    src.ndim = 2, src.num[0] = g->C, src.step[0] = 1, src.num[1] = w->T, src.step[1] = g->C;
    nt_ap o = nt_tile_ap(dout);
    if (!rc)
        rc = nt_isa_tensor_copy(k, &o, &src, NT_ENGINE_VECTOR);
    nt_ap d = nt_hbm_ap(od, w->odt, 0, (int)g->CO, w->Kc, w->Kc);
    nt_ap ds = nt_tile_ap(dout);
    if (!rc)
        rc = nt_isa_dma_copy(k, &d, &ds, sk_qout(w->s));
    return rc;
}

static int wg_run(sk_k *s, const nt__conv_geo *g, const nt_tensor *x, const nt_tensor *gy,
                  const nt_tensor *dw)
{
    wgk w;
    memset(&w, 0, sizeof w);
    w.s = s, w.g = g, w.dt = (nt_dtype)x->dtype, w.odt = (nt_dtype)dw->dtype;
    w.T = g->kh * g->kw, w.Kc = g->C * w.T, w.nK = (w.Kc + 127) / 128, w.m = 128 / g->C;
    w.L = g->OH * g->OW, w.P = g->N * w.L, w.loaded = 0;
    w.ident = -1;
    for (int64_t t = 0; t < w.T; t++) {
        if ((t / g->kw) * g->d[0] == g->lo[0] && (t % g->kw) * g->d[1] == g->lo[1] &&
            g->OH == g->H && g->OW == g->W)
            w.ident = t;
        wg_range((t / g->kw) * g->d[0] - g->lo[0], g->H, g->OH, &w.ra[t], &w.rb[t]);
        wg_range((t % g->kw) * g->d[1] - g->lo[1], g->W, g->OW, &w.ca[t], &w.cb[t]);
    }
    const char *xd = nt__tensor_data(x), *gd = nt__tensor_data(gy);
    int rc = wg_alloc(&w);
    if (!rc)
        rc = wg_load(&w, xd, 0);
    int64_t nt = (w.P + 127) / 128;
    for (int64_t i = 0; !rc && i <= nt; i++) {
        if (i < nt)
            rc = wg_stage_a(&w, xd, gd, i);
        if (!rc && i > 0)
            rc = wg_stage_b(&w, i - 1);
    }
    return rc ? rc : wg_finish(&w, nt__tensor_data(dw));
}

static int conv_wgrad_run(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    nt__conv_geo g;
    nt__conv_geo_of(r, true, &g);
    const nt_tensor *x = r->in[0], *gy = r->in[1], *dw = r->out[0];
    nt_dtype dt = (nt_dtype)x->dtype, odt = (nt_dtype)dw->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt), oes = (int64_t)nt__dtype_size(odt);
    int64_t Cg = g.C / g.G, COg = g.CO / g.G, Kc = Cg * g.kh * g.kw, L = g.OH * g.OW;
    int64_t NL = g.N * L;
    if (NL && wg_ok(&g, dt))
        return wg_run(s, &g, x, gy, dw);
    char *col = NL ? sk_scratch(s, (size_t)(g.G * Kc * NL * es)) : NULL;
    char *gs = NL ? sk_scratch(s, (size_t)(g.CO * NL * es)) : NULL;
    if (NL && (!col || !gs))
        return s->derr_code;
    int rc = NL ? columns(s, &g, x, col) : 0;
    /* gy [N, CO, L] -> gs [CO, N L] */
    const char *gd = nt__tensor_data(gy);
    for (int64_t n = 0; !rc && n < g.N; n++)
        for (int64_t c0 = 0; !rc && c0 < g.CO; c0 += 128) {
            int np = (int)(g.CO - c0 < 128 ? g.CO - c0 : 128);
            nt_ap src = nt_hbm_ap(gd, dt, (n * g.CO + c0) * L, np, L, L);
            nt_ap d = nt_hbm_ap(gs, dt, c0 * NL + n * L, np, NL, L);
            rc = nt_isa_dma_copy(s->k, &d, &src, sk_qin(s));
        }
    /* the product's rows are in K order (t, ci): through scratch, then
     * permuted into dw's (ci, t) unless they agree (T or Cg 1) */
    int64_t T = g.kh * g.kw;
    char *od = nt__tensor_data(dw), *dd = od;
    if (T > 1 && Cg > 1 && !(od = sk_scratch(s, (size_t)(g.CO * Kc * oes))))
        return s->derr_code;
    for (int64_t grp = 0; !rc && grp < g.G; grp++) {
        nt_tile_matmul_args a;
        memset(&a, 0, sizeof a);
        a.M = COg, a.N = Kc, a.K = NL;
        a.a = gs + grp * COg * NL * es, a.lda = NL;
        a.b = col + grp * Kc * NL * es, a.ldb = NL, a.b_trans = true;
        a.in_dtype = dt;
        a.c = od + grp * COg * Kc * oes, a.ldc = Kc;
        a.out_dtype = odt;
        rc = nt_tile_matmul(s->k, &a);
    }
    for (int64_t c0 = 0; !rc && od != dd && c0 < g.CO; c0 += 128) {
        int np = (int)(g.CO - c0 < 128 ? g.CO - c0 : 128);
        nt_ap src = nt_hbm_ap(od, odt, c0 * Kc, np, Kc, Kc);
        src.ndim = 2, src.num[0] = Cg, src.step[0] = 1, src.num[1] = T, src.step[1] = Cg;
        nt_ap d = nt_hbm_ap(dd, odt, c0 * Kc, np, Kc, Kc);
        rc = nt_isa_dma_copy(s->k, &d, &src, sk_qout(s));
    }
    return rc;
}

int nt__sk_conv_gemm(const nt__rec *r) { return sk_run_prog(r, "conv_gemm", conv_gemm_run, NULL); }

int nt__sk_conv_wgrad(const nt__rec *r)
{
    return sk_run_prog(r, "conv_wgrad", conv_wgrad_run, NULL);
}
