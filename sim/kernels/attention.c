/* sim/kernels/attention.c - scaled dot-product attention on the simulator:
 * one flash-attention tile program per op, the scores never in HBM.
 *
 * Forward, per batch (b, h): k^T [D, Tk] and v (as 128-row blocks) are
 * loaded once into SBUF (k transposed on TensorE); then per query block of
 * <= 128 rows (one row per partition) q^T is made the same way and the key
 * blocks are streamed through TensorE: S = q k^T into PSUM, then on
 * VectorE/ScalarE the scale, the mask (DMA'd block by block: tensor_tensor
 * add, or select on a u8 mask), the causal affine_select, the block max, the
 * online-softmax rescale alpha = exp(m - m_new), P = exp(s - m_new) with
 * its row sum from the same activation, l = l * alpha + sum, P^T on TensorE
 * and P V into PSUM, o = o * alpha + P V.  o / max(l, 1) and the
 * log-sum-exp m + log(max(l, 1)) are the only writes to HBM.
 *
 * Backward, per batch: q^T, dO^T and the rows of q and dO (f32) stay in
 * SBUF with Dr = rowsum(dO * O) and -lse; per key block k, k^T, v^T go to
 * SBUF and each query block recomputes S and P = exp(s - lse) (no row
 * state: lse is final), dV += P^T dO and dK += dS^T q accumulate in PSUM
 * over the query blocks, dP = dO v^T, dS = ((dP - Dr) * scale) * P, and
 * dQ's f32 accumulator in SBUF takes dS k (key blocks in ascending order).
 *
 * Every instruction computes what cpu/attention.c computes at that step
 * (the same nt__gemm_ktile products, core/ewise.h steps and canonical
 * reductions), so the bits are the CPU's; the simulator charges each
 * instruction its engine and DMA time. */
#include "sim/kernels/sk.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/attn.h"

#define BLK NT_ATTN_BLOCK

typedef struct ak {
    sk_k *s;
    nt_sim_kernel *k;
    nt__attn_geom g;
    nt__attn_opnd q, kk, v, m, dO, O;
    bool has_mask, causal;
    float scale;
    int64_t Tq, Tk, D, Dv;
    nt_dtype dt; /* q, k, v (and outputs) */
    /* shared tiles */
    nt_tile *raw[2];  /* a loaded block in its own dtype, [128, max(D, Dv)] */
    nt_tile *mraw[2]; /* a mask block, [128, BLK] */
    nt_tile *ninf;    /* [128, 1] of -Inf */
    nt_tile *tp[2];   /* PSUM transposes, [128, BLK] f32 */
    nt_tile *sp[2];   /* PSUM scores, [128, BLK] f32 */
    nt_tile *sc[2];   /* SBUF scores / P, [128, BLK] f32 */
    int nblk;         /* blocks issued: picks the buffer */
} ak;

static nt_ap hpat(const char *base, nt_dtype dt, int64_t off, int np, int64_t pstep, int64_t m,
                  int64_t step)
{
    nt_ap a;
    memset(&a, 0, sizeof a);
    a.hbm = (void *)base;
    a.dtype = dt;
    a.np = np;
    a.pstep = pstep;
    a.offset = off;
    a.ndim = 1;
    a.num[0] = m;
    a.step[0] = step;
    return a;
}

static nt_ap col(nt_tile *t, int np, int64_t j) { return nt_tile_slice(t, 0, np, j, 1); }

static int ts(ak *a, const nt_ap *d, const nt_ap *x, nt_alu_op op, const nt_ap *sap, float imm)
{
    return nt_isa_tensor_scalar(a->k, d, x, &(nt_isa_alu){op, {sap, imm}, false}, NULL,
                                sk_eng(a->s));
}

static int tt(ak *a, const nt_ap *d, const nt_ap *x, const nt_ap *y, nt_alu_op op)
{
    return nt_isa_tensor_tensor(a->k, d, x, y, op, NT_ENGINE_VECTOR);
}

/* rows [r0, r0+nr) x [0, nc) of operand x (batch offset boff) -> dst, an
 * f32 SBUF pattern [nr, nc]: a DMA, and a conversion on-chip when x is not
 * f32 (widening is exact). */
static int load_rows(ak *a, const nt_ap *dst, const nt__attn_opnd *x, int64_t boff, int64_t r0,
                     int nr, int64_t nc)
{
    nt_ap h = hpat(x->base, x->dt, boff + r0 * x->rs, nr, x->rs, nc, x->cs);
    if (x->dt == NT_F32)
        return nt_isa_dma_copy(a->k, dst, &h, sk_qin(a->s));
    nt_ap r = nt_tile_slice(a->raw[a->nblk & 1], 0, nr, 0, nc);
    a->nblk++;
    int rc = nt_isa_dma_copy(a->k, &r, &h, sk_qin(a->s));
    return rc ? rc : nt_isa_tensor_copy(a->k, dst, &r, NT_ENGINE_GPSIMD);
}

/* dst [nc, nr] (SBUF f32) = src [nr, nc]^T (SBUF f32), through PSUM */
static int transpose(ak *a, const nt_ap *dst, const nt_ap *src, int nr, int64_t nc)
{
    nt_ap p = nt_tile_slice(a->tp[a->nblk & 1], 0, (int)nc, 0, nr);
    a->nblk++;
    int rc = nt_isa_nc_transpose(a->k, &p, src);
    return rc ? rc : nt_isa_tensor_copy(a->k, dst, &p, NT_ENGINE_SCALAR);
}

/* s [Mq, nk] (SBUF f32) = S (PSUM) * scale, then the mask and the causal
 * rule, as cpu/attention.c's scores() */
static int scores(ak *a, const nt_ap *s, const nt_ap *S, int64_t mb, int64_t q0, int Mq,
                  int64_t k0, int nk)
{
    int rc = ts(a, s, S, NT_ALU_MUL, NULL, a->scale);
    if (!rc && a->has_mask) {
        nt_ap mt = nt_tile_slice(a->mraw[a->nblk & 1], 0, Mq, 0, nk);
        a->nblk++;
        nt_ap h = hpat(a->m.base, a->m.dt, mb + q0 * a->m.rs + k0 * a->m.cs, Mq, a->m.rs, nk,
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

static inline bool skip_block(const ak *a, int64_t q0, int Mq, int64_t k0)
{
    return a->causal && k0 > q0 + Mq - 1;
}

static int setup(ak *a, sk_k *s, const nt__rec *r)
{
    memset(a, 0, sizeof *a);
    a->s = s;
    a->k = s->k;
    a->scale = (float)r->p.f[0];
    a->causal = r->p.flag != 0;
    a->has_mask = r->in[3] != NULL;
    nt__attn_geom_of(&a->g, r->in[0]);
    if (a->has_mask)
        nt__attn_opnd_of(&a->m, r->in[3], &a->g, 0);
    nt_sim_kernel *k = a->k;
    for (int b = 0; b < 2; b++) {
        a->raw[b] = sk_tile(s, "attn.raw", (nt_dtype)r->in[0]->dtype, BLK, BLK);
        a->mraw[b] = a->has_mask ? sk_tile(s, "attn.mask", a->m.dt, BLK, BLK) : NULL;
        a->tp[b] = nt_tile_alloc(k, "attn.tr", NT_MEM_PSUM, NT_F32, BLK, BLK);
        a->sp[b] = nt_tile_alloc(k, "attn.S", NT_MEM_PSUM, NT_F32, BLK, BLK);
        a->sc[b] = sk_tile(s, "attn.s", NT_F32, BLK, BLK);
    }
    a->ninf = sk_tile(s, "attn.ninf", NT_F32, BLK, 1);
    nt_ap ni = nt_tile_ap(a->ninf);
    return nt_sim_kernel_error(k) ? nt_sim_kernel_error(k)
                                  : nt_isa_memset(k, &ni, -INFINITY, NT_ENGINE_VECTOR);
}

static int too_long(const char *what, int64_t T, int64_t bytes)
{
    return nt__kerr(NT_ENOTSUP, "the simulator's attention program keeps a whole head's %s in "
                    "SBUF: T = %lld needs %lld bytes per partition, more than its %d",
                    what, (long long)T, (long long)bytes, SK_SBUF_BUDGET);
}

/* ---------------- forward ---------------- */

enum { C_M, C_MNEW, C_BMAX, C_ALPHA, C_NEGM, C_RS, C_L, C_LS, C_T, C_NCOL };

int nt__sk_sdpa(const nt__rec *r)
{
    const nt_tensor *q = r->in[0], *kt = r->in[1], *vt = r->in[2];
    int64_t Tq = q->shape[q->ndim - 2], D = q->shape[q->ndim - 1];
    int64_t Tk = kt->shape[kt->ndim - 2], Dv = vt->shape[vt->ndim - 1];
    int64_t nkb = (Tk + BLK - 1) / BLK;
    /* resident per head: k^T [D, Tk] and v's blocks [128, nkb * Dv], f32 */
    int64_t need = (Tk + nkb * Dv) * 4 + (BLK * 10 + Dv * 3 + D + 64) * 4;
    if (need > SK_SBUF_BUDGET)
        return too_long("keys and values", Tk, need);
    sk_k s;
    int rc = sk_begin(&s, "scaled_dot_product_attention");
    if (rc)
        return rc;
    ak a;
    rc = setup(&a, &s, r);
    a.Tq = Tq, a.Tk = Tk, a.D = D, a.Dv = Dv;
    nt__attn_opnd_of(&a.q, q, &a.g, 0);
    nt__attn_opnd_of(&a.kk, kt, &a.g, 0);
    nt__attn_opnd_of(&a.v, vt, &a.g, 0);
    nt_sim_kernel *k = s.k;
    const nt_tensor *o = r->out[0], *lse = r->out[1];
    nt_dtype odt = (nt_dtype)o->dtype;
    char *od = nt__tensor_data(o), *ld = nt__tensor_data(lse);
    nt_tile *KT = sk_tile(&s, "attn.kT", NT_F32, (int)D, Tk);
    nt_tile *V = sk_tile(&s, "attn.v", NT_F32, BLK, nkb * Dv);
    nt_tile *kf = sk_tile(&s, "attn.k", NT_F32, BLK, D);
    nt_tile *qf = sk_tile(&s, "attn.q", NT_F32, BLK, D);
    nt_tile *QT = sk_tile(&s, "attn.qT", NT_F32, (int)D, BLK);
    nt_tile *PT = sk_tile(&s, "attn.pT", NT_F32, BLK, BLK);
    nt_tile *st = sk_tile(&s, "attn.stats", NT_F32, BLK, C_NCOL);
    nt_tile *acc = sk_tile(&s, "attn.o", NT_F32, BLK, Dv);
    nt_tile *ot = sk_tile(&s, "attn.out", odt, BLK, Dv);
    nt_tile *pv = nt_tile_alloc(k, "attn.pv", NT_MEM_PSUM, NT_F32, BLK, Dv);
    if (!rc)
        rc = nt_sim_kernel_error(k);
    for (int64_t b = 0; b < a.g.nbatch && !rc; b++) {
        int64_t qb = nt__attn_boff(&a.q, &a.g, b), kb = nt__attn_boff(&a.kk, &a.g, b);
        int64_t vb = nt__attn_boff(&a.v, &a.g, b);
        int64_t mb = a.has_mask ? nt__attn_boff(&a.m, &a.g, b) : 0;
        /* this head's keys (transposed) and values, once */
        for (int64_t j = 0; j < nkb && !rc; j++) {
            int64_t k0 = j * BLK;
            int nk = (int)(Tk - k0 < BLK ? Tk - k0 : BLK);
            nt_ap kr = nt_tile_slice(kf, 0, nk, 0, D);
            nt_ap kd = nt_tile_slice(KT, 0, (int)D, k0, nk);
            nt_ap vd = nt_tile_slice(V, 0, nk, j * Dv, Dv);
            if (!(rc = load_rows(&a, &kr, &a.kk, kb, k0, nk, D)) &&
                !(rc = transpose(&a, &kd, &kr, nk, D)))
                rc = load_rows(&a, &vd, &a.v, vb, k0, nk, Dv);
        }
        for (int64_t q0 = 0; q0 < Tq && !rc; q0 += BLK) {
            int Mq = (int)(Tq - q0 < BLK ? Tq - q0 : BLK);
            nt_ap qr = nt_tile_slice(qf, 0, Mq, 0, D), qT = nt_tile_slice(QT, 0, (int)D, 0, Mq);
            nt_ap m = col(st, Mq, C_M), mnew = col(st, Mq, C_MNEW), bmax = col(st, Mq, C_BMAX);
            nt_ap alpha = col(st, Mq, C_ALPHA), negm = col(st, Mq, C_NEGM);
            nt_ap rs = col(st, Mq, C_RS), l = col(st, Mq, C_L), ls = col(st, Mq, C_LS);
            nt_ap t = col(st, Mq, C_T);
            nt_ap o_ = nt_tile_slice(acc, 0, Mq, 0, Dv);
            if ((rc = load_rows(&a, &qr, &a.q, qb, q0, Mq, D)) ||
                (rc = transpose(&a, &qT, &qr, Mq, D)) ||
                (rc = nt_isa_memset(k, &m, -FLT_MAX, NT_ENGINE_VECTOR)) ||
                (rc = nt_isa_memset(k, &l, 0.0, NT_ENGINE_VECTOR)) ||
                (rc = nt_isa_memset(k, &o_, 0.0, NT_ENGINE_GPSIMD)))
                break;
            for (int64_t j = 0; j < nkb && !rc; j++) {
                int64_t k0 = j * BLK;
                int nk = (int)(Tk - k0 < BLK ? Tk - k0 : BLK);
                if (skip_block(&a, q0, Mq, k0))
                    break;
                int bb = (int)(j & 1);
                nt_ap S = nt_tile_slice(a.sp[bb], 0, Mq, 0, nk);
                nt_ap sc = nt_tile_slice(a.sc[bb], 0, Mq, 0, nk);
                nt_ap kd = nt_tile_slice(KT, 0, (int)D, k0, nk);
                nt_ap pT = nt_tile_slice(PT, 0, nk, 0, Mq);
                nt_ap vd = nt_tile_slice(V, 0, nk, j * Dv, Dv);
                nt_ap PV = nt_tile_slice(pv, 0, Mq, 0, Dv);
                if ((rc = nt_isa_nc_matmul(k, &S, &qT, &kd, false)) ||
                    (rc = scores(&a, &sc, &S, mb, q0, Mq, k0, nk)) ||
                    (rc = nt_isa_tensor_reduce(k, &bmax, &sc, NT_ALU_MAX, 1)) ||
                    (rc = tt(&a, &mnew, &m, &bmax, NT_ALU_MAX)) ||
                    (rc = tt(&a, &t, &m, &mnew, NT_ALU_SUB)) ||
                    (rc = nt_isa_activation(k, &alpha, NT_ACT_EXP, &t, NULL, NULL, NULL)) ||
                    (rc = ts(&a, &negm, &mnew, NT_ALU_MUL, NULL, -1.0f)) ||
                    (rc = nt_isa_activation(k, &sc, NT_ACT_EXP, &sc, NULL,
                                            &(nt_isa_scalar){&negm, 0}, &rs)) ||
                    (rc = nt_isa_tensor_scalar(k, &l, &l,
                                               &(nt_isa_alu){NT_ALU_MUL, {&alpha, 0}, false},
                                               &(nt_isa_alu){NT_ALU_ADD, {&rs, 0}, false},
                                               NT_ENGINE_VECTOR)) ||
                    (rc = nt_isa_tensor_copy(k, &m, &mnew, NT_ENGINE_VECTOR)) ||
                    (rc = transpose(&a, &pT, &sc, Mq, nk)) ||
                    (rc = nt_isa_nc_matmul(k, &PV, &pT, &vd, false)) ||
                    (rc = ts(&a, &o_, &o_, NT_ALU_MUL, &alpha, 0)) ||
                    (rc = tt(&a, &o_, &o_, &PV, NT_ALU_ADD)))
                    break;
            }
            if (rc)
                break;
            /* out = o / max(l, 1); lse = m + log(max(l, 1)) */
            nt_ap out = nt_tile_slice(ot, 0, Mq, 0, Dv);
            nt_ap ho = hpat(od, odt, (b * Tq + q0) * Dv, Mq, Dv, Dv, 1);
            nt_ap hl = hpat(ld, NT_F32, b * Tq + q0, Mq, 1, 1, 1);
            if ((rc = ts(&a, &ls, &l, NT_ALU_MAX, NULL, 1.0f)) ||
                (rc = ts(&a, &out, &o_, NT_ALU_DIV, &ls, 0)) ||
                (rc = nt_isa_dma_copy(k, &ho, &out, sk_qout(&s))) ||
                (rc = nt_isa_activation(k, &t, NT_ACT_LOG, &ls, NULL, NULL, NULL)) ||
                (rc = tt(&a, &rs, &m, &t, NT_ALU_ADD)) ||
                (rc = nt_isa_dma_copy(k, &hl, &rs, sk_qout(&s))))
                break;
        }
    }
    int rc2 = sk_end(&s);
    return rc2 ? rc2 : rc;
}

/* ---------------- backward ---------------- */

int nt__sk_sdpa_bwd(const nt__rec *r)
{
    const nt_tensor *qx = r->in[0], *kv = r->in[1], *lse = r->in[2];
    int64_t D = r->p.i[0], Dv = r->p.i[1];
    int64_t Tq = qx->shape[qx->ndim - 2], Tk = kv->shape[kv->ndim - 2];
    int64_t nqb = (Tq + BLK - 1) / BLK;
    /* resident per head: q^T, dO^T [., Tq], q and dO rows, dQ's
     * accumulator, Dr and -lse: f32 */
    int64_t need = (2 * Tq + nqb * (2 * D + Dv + 3)) * 4 + (BLK * 10 + 4 * D + 4 * Dv) * 4;
    if (need > SK_SBUF_BUDGET)
        return too_long("queries", Tq, need);
    sk_k s;
    int rc = sk_begin(&s, "sdpa_bwd");
    if (rc)
        return rc;
    ak a;
    rc = setup(&a, &s, r);
    a.Tq = Tq, a.Tk = Tk, a.D = D, a.Dv = Dv;
    nt__attn_opnd_of(&a.q, qx, &a.g, 0);
    nt__attn_opnd_of(&a.dO, qx, &a.g, D);
    nt__attn_opnd_of(&a.O, qx, &a.g, D + Dv);
    nt__attn_opnd_of(&a.kk, kv, &a.g, 0);
    nt__attn_opnd_of(&a.v, kv, &a.g, D);
    nt_sim_kernel *k = s.k;
    const nt_tensor *dq = r->out[0], *dkv = r->out[1];
    nt_dtype dt = (nt_dtype)dq->dtype;
    char *dqd = nt__tensor_data(dq), *dkvd = nt__tensor_data(dkv);
    const char *lsed = nt__tensor_data(lse);
    nt_tile *QT = sk_tile(&s, "attn.qT", NT_F32, (int)D, Tq);
    nt_tile *GT = sk_tile(&s, "attn.dOT", NT_F32, (int)Dv, Tq);
    nt_tile *Qr = sk_tile(&s, "attn.q", NT_F32, BLK, nqb * D);
    nt_tile *Gr = sk_tile(&s, "attn.dO", NT_F32, BLK, nqb * Dv);
    nt_tile *dQ = sk_tile(&s, "attn.dq", NT_F32, BLK, nqb * D);
    nt_tile *Dr = sk_tile(&s, "attn.Dr", NT_F32, BLK, nqb);
    nt_tile *NL = sk_tile(&s, "attn.negl", NT_F32, BLK, nqb);
    nt_tile *Of = sk_tile(&s, "attn.O", NT_F32, BLK, Dv);
    nt_tile *pr = sk_tile(&s, "attn.dOO", NT_F32, BLK, Dv);
    nt_tile *kf = sk_tile(&s, "attn.k", NT_F32, BLK, D);
    nt_tile *KT = sk_tile(&s, "attn.kT", NT_F32, (int)D, BLK);
    nt_tile *vf = sk_tile(&s, "attn.v", NT_F32, BLK, Dv);
    nt_tile *VT = sk_tile(&s, "attn.vT", NT_F32, (int)Dv, BLK);
    nt_tile *dS = sk_tile(&s, "attn.dS", NT_F32, BLK, BLK);
    nt_tile *dST = sk_tile(&s, "attn.dST", NT_F32, BLK, BLK);
    nt_tile *ob = sk_tile(&s, "attn.out", dt, BLK, D > Dv ? D : Dv);
    nt_tile *dKp = nt_tile_alloc(k, "attn.dK", NT_MEM_PSUM, NT_F32, BLK, D);
    nt_tile *dVp = nt_tile_alloc(k, "attn.dV", NT_MEM_PSUM, NT_F32, BLK, Dv);
    nt_tile *dPp = nt_tile_alloc(k, "attn.dP", NT_MEM_PSUM, NT_F32, BLK, BLK);
    nt_tile *dQp = nt_tile_alloc(k, "attn.dQp", NT_MEM_PSUM, NT_F32, BLK, D);
    if (!rc)
        rc = nt_sim_kernel_error(k);
    int64_t es = (int64_t)nt__dtype_size(dt);
    (void)es;
    for (int64_t b = 0; b < a.g.nbatch && !rc; b++) {
        int64_t qb = nt__attn_boff(&a.q, &a.g, b), kb = nt__attn_boff(&a.kk, &a.g, b);
        int64_t mb = a.has_mask ? nt__attn_boff(&a.m, &a.g, b) : 0;
        nt_ap dqall = nt_tile_ap(dQ);
        rc = nt_isa_memset(k, &dqall, 0.0, NT_ENGINE_GPSIMD);
        /* the head's queries: rows, transposes, Dr = rowsum(dO * O), -lse */
        for (int64_t i = 0; i < nqb && !rc; i++) {
            int64_t q0 = i * BLK;
            int Mq = (int)(Tq - q0 < BLK ? Tq - q0 : BLK);
            nt_ap qr = nt_tile_slice(Qr, 0, Mq, i * D, D), gr = nt_tile_slice(Gr, 0, Mq, i * Dv, Dv);
            nt_ap qT = nt_tile_slice(QT, 0, (int)D, q0, Mq), gT = nt_tile_slice(GT, 0, (int)Dv, q0, Mq);
            nt_ap of = nt_tile_slice(Of, 0, Mq, 0, Dv), p = nt_tile_slice(pr, 0, Mq, 0, Dv);
            nt_ap dr = col(Dr, Mq, i), nl = col(NL, Mq, i);
            nt_ap hl = hpat(lsed, NT_F32, b * Tq + q0, Mq, 1, 1, 1);
            if ((rc = load_rows(&a, &qr, &a.q, qb, q0, Mq, D)) ||
                (rc = transpose(&a, &qT, &qr, Mq, D)) ||
                (rc = load_rows(&a, &gr, &a.dO, qb, q0, Mq, Dv)) ||
                (rc = transpose(&a, &gT, &gr, Mq, Dv)) ||
                (rc = load_rows(&a, &of, &a.O, qb, q0, Mq, Dv)) ||
                (rc = tt(&a, &p, &gr, &of, NT_ALU_MUL)) ||
                (rc = nt_isa_tensor_reduce(k, &dr, &p, NT_ALU_ADD, 1)) ||
                (rc = nt_isa_dma_copy(k, &nl, &hl, sk_qin(&s))) ||
                (rc = ts(&a, &nl, &nl, NT_ALU_MUL, NULL, -1.0f)))
                break;
        }
        for (int64_t k0 = 0; k0 < Tk && !rc; k0 += BLK) {
            int nk = (int)(Tk - k0 < BLK ? Tk - k0 : BLK);
            nt_ap kr = nt_tile_slice(kf, 0, nk, 0, D), kT = nt_tile_slice(KT, 0, (int)D, 0, nk);
            nt_ap vr = nt_tile_slice(vf, 0, nk, 0, Dv), vT = nt_tile_slice(VT, 0, (int)Dv, 0, nk);
            nt_ap dK = nt_tile_slice(dKp, 0, nk, 0, D), dV = nt_tile_slice(dVp, 0, nk, 0, Dv);
            if ((rc = load_rows(&a, &kr, &a.kk, kb, k0, nk, D)) ||
                (rc = transpose(&a, &kT, &kr, nk, D)) ||
                (rc = load_rows(&a, &vr, &a.v, kb, k0, nk, Dv)) ||
                (rc = transpose(&a, &vT, &vr, nk, Dv)))
                break;
            bool first = true;
            for (int64_t i = 0; i < nqb && !rc; i++) {
                int64_t q0 = i * BLK;
                int Mq = (int)(Tq - q0 < BLK ? Tq - q0 : BLK);
                if (skip_block(&a, q0, Mq, k0))
                    continue;
                int bb = (int)(i & 1);
                nt_ap S = nt_tile_slice(a.sp[bb], 0, Mq, 0, nk);
                nt_ap P = nt_tile_slice(a.sc[bb], 0, Mq, 0, nk);
                nt_ap qT = nt_tile_slice(QT, 0, (int)D, q0, Mq);
                nt_ap gT = nt_tile_slice(GT, 0, (int)Dv, q0, Mq);
                nt_ap qr = nt_tile_slice(Qr, 0, Mq, i * D, D);
                nt_ap gr = nt_tile_slice(Gr, 0, Mq, i * Dv, Dv);
                nt_ap dP = nt_tile_slice(dPp, 0, Mq, 0, nk);
                nt_ap ds = nt_tile_slice(dS, 0, Mq, 0, nk);
                nt_ap dsT = nt_tile_slice(dST, 0, nk, 0, Mq);
                nt_ap dQs = nt_tile_slice(dQp, 0, Mq, 0, D);
                nt_ap dqa = nt_tile_slice(dQ, 0, Mq, i * D, D);
                nt_ap dr = col(Dr, Mq, i), nl = col(NL, Mq, i);
                if ((rc = nt_isa_nc_matmul(k, &S, &qT, &kT, false)) ||
                    (rc = scores(&a, &P, &S, mb, q0, Mq, k0, nk)) ||
                    (rc = nt_isa_activation(k, &P, NT_ACT_EXP, &P, NULL,
                                            &(nt_isa_scalar){&nl, 0}, NULL)) ||
                    (rc = nt_isa_nc_matmul(k, &dV, &P, &gr, !first)) ||
                    (rc = nt_isa_nc_matmul(k, &dP, &gT, &vT, false)) ||
                    (rc = nt_isa_tensor_scalar(k, &ds, &dP,
                                               &(nt_isa_alu){NT_ALU_SUB, {&dr, 0}, false},
                                               &(nt_isa_alu){NT_ALU_MUL, {NULL, a.scale}, false},
                                               NT_ENGINE_VECTOR)) ||
                    (rc = tt(&a, &ds, &ds, &P, NT_ALU_MUL)) ||
                    (rc = nt_isa_nc_matmul(k, &dK, &ds, &qr, !first)) ||
                    (rc = transpose(&a, &dsT, &ds, Mq, nk)) ||
                    (rc = nt_isa_nc_matmul(k, &dQs, &dsT, &kr, false)) ||
                    (rc = k0 == 0 ? nt_isa_tensor_copy(k, &dqa, &dQs, NT_ENGINE_SCALAR)
                                  : tt(&a, &dqa, &dqa, &dQs, NT_ALU_ADD)))
                    break;
                first = false;
            }
            if (rc)
                break;
            /* dk, dv rows of this block: columns [0, D) and [D, D + Dv) */
            nt_ap o1 = nt_tile_slice(ob, 0, nk, 0, D);
            nt_ap h1 = hpat(dkvd, dt, (b * Tk + k0) * (D + Dv), nk, D + Dv, D, 1);
            rc = first ? nt_isa_memset(k, &o1, 0.0, NT_ENGINE_VECTOR)
                       : nt_isa_tensor_copy(k, &o1, &dK, NT_ENGINE_VECTOR);
            if (!rc)
                rc = nt_isa_dma_copy(k, &h1, &o1, sk_qout(&s));
            nt_ap o2 = nt_tile_slice(ob, 0, nk, 0, Dv);
            nt_ap h2 = hpat(dkvd, dt, (b * Tk + k0) * (D + Dv) + D, nk, D + Dv, Dv, 1);
            if (!rc)
                rc = first ? nt_isa_memset(k, &o2, 0.0, NT_ENGINE_VECTOR)
                           : nt_isa_tensor_copy(k, &o2, &dV, NT_ENGINE_VECTOR);
            if (!rc)
                rc = nt_isa_dma_copy(k, &h2, &o2, sk_qout(&s));
        }
        for (int64_t i = 0; i < nqb && !rc; i++) {
            int64_t q0 = i * BLK;
            int Mq = (int)(Tq - q0 < BLK ? Tq - q0 : BLK);
            nt_ap dqa = nt_tile_slice(dQ, 0, Mq, i * D, D);
            nt_ap o1 = nt_tile_slice(ob, 0, Mq, 0, D);
            nt_ap h1 = hpat(dqd, dt, (b * Tq + q0) * D, Mq, D, D, 1);
            if ((rc = nt_isa_tensor_copy(k, &o1, &dqa, NT_ENGINE_VECTOR)) ||
                (rc = nt_isa_dma_copy(k, &h1, &o1, sk_qout(&s))))
                break;
        }
    }
    int rc2 = sk_end(&s);
    return rc2 ? rc2 : rc;
}
