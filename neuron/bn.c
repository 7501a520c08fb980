/* neuron/bn.c - batch_norm_fwd and batch_norm_bwd on the simulator: the CPU
 * kernels' arithmetic (cpu/bn.c, docs/ops.md "Normalisation over
 * channels"), step for step.
 *
 * Channels on partitions (groups of up to 128), channel c's row of M = N S
 * values on the free axis in (n, s) order, in chunks of RCH (a multiple of
 * 2048, so each sum is sk_fold's canonical order continued across chunks,
 * nt__red_sum_f32 itself).  A chunk comes from HBM in at most three DMAs
 * (the rest of a sample, whole samples as a [n][s] pattern, the start of a
 * sample); a row of one chunk stays in SBUF across the passes, a longer one
 * is streamed once per pass.  Per channel, on VectorE/ScalarE:
 *   forward   pass 1  mean = fold(x) / M
 *             pass 2  d = x - mean; ss = fold(d * d)
 *                     r = rsqrt(ss / M + eps)      (tensor_scalar, RSQRT)
 *             pass 3  y = (x - mean) * r, then * w, then + b
 *   backward  r from the stats as above;
 *             pass 1  xh = (x - mean) * r; db = fold(g); dw = fold(g * xh);
 *                     with w: gx = g * w, s1 = fold(gx), s2 = fold(gx * xh)
 *             pass 2  dx = ((gx - s1 / M) - xh * (s2 / M)) * r
 * every product with a per-channel value a per-partition scalar operand.
 * NKI's bn_stats / bn_aggr (VectorE's mean and variance in 512-element
 * pieces, aggregated as count/mean/variance tuples) take another order
 * than the canonical sums, so they are not used: their bits would differ
 * from the CPU's. */
#include "neuron/sk.h"

#include <string.h>

#define RCH 4096

typedef struct bnc {
    sk_k *s;
    int64_t N, C, S, M;
    float eps;
    const char *x, *g;
    char *y, *o2;
    const nt_tensor *w, *b, *st;
    /* the fused relu (NT_FK_BN, nt__sk_bn_fused): forward, relu(y) also
     * stored there (y, o2 NULL: not stored); backward, g first masked as
     * relu_bwd against relu's output ym (stored to gz when given) */
    char *relu, *gz;
    const char *ym;
    nt_tile *X, *G, *T, *U, *V, *col, *Ym, *Z;
    int np;
    int64_t c0;
} bnc;

/* columns of the per-channel tile */
enum { K_MEAN, K_SS, K_R, K_W, K_B, K_S1, K_S2, K_DB, K_DW, K_M1, K_M2, K_N };

static nt_ap col(const bnc *c, int k) { return nt_tile_slice(c->col, 0, c->np, k, 1); }

/* Row elements j0 .. j0+w of the group's channels between tile t (from
 * element 0) and HBM f32 data at base. */
static int span(bnc *c, nt_tile *t, int64_t j0, int64_t w, const char *base, bool store)
{
    int64_t S = c->S, CS = c->C * c->S, f = 0;
    int rc = 0;
    while (w > 0 && !rc) {
        int64_t n = j0 / S, s0 = j0 % S, len;
        nt_ap h;
        if (s0 == 0 && w >= S) { /* whole samples */
            int64_t nn = w / S;
            len = nn * S;
            h = nt_hbm_ap(base, NT_F32, n * CS + c->c0 * S, c->np, S, len);
            h.ndim = 2;
            h.num[0] = nn, h.step[0] = CS, h.num[1] = S, h.step[1] = 1;
        } else {
            len = S - s0 < w ? S - s0 : w;
            h = nt_hbm_ap(base, NT_F32, n * CS + c->c0 * S + s0, c->np, S, len);
        }
        nt_ap d = nt_tile_slice(t, 0, c->np, f, len);
        rc = store ? nt_isa_dma_copy(c->s->k, &h, &d, sk_qout(c->s))
                   : nt_isa_dma_copy(c->s->k, &d, &h, sk_qin(c->s));
        f += len, j0 += len, w -= len;
    }
    return rc;
}

/* dst = (src op0 a) op1 b (b NULL: one step), a and b columns or NULL for imm */
static int ts2(bnc *c, const nt_ap *dst, const nt_ap *src, nt_alu_op op0, const nt_ap *a,
               float ia, nt_alu_op op1, const nt_ap *b)
{
    sk_k *s = c->s;
    nt_isa_alu A = {op0, {a, ia}, false}, B = {op1, {b, 0}, false};
    return nt_isa_tensor_scalar(s->k, dst, src, &A, b ? &B : NULL, sk_eng(s));
}

/* r = rsqrt(ss / M + eps) */
static int rstd(bnc *c)
{
    nt_ap ss = col(c, K_SS), r = col(c, K_R);
    float M = (float)c->M;
    int rc = nt_isa_tensor_scalar(c->s->k, &r, &ss, &(nt_isa_alu){NT_ALU_DIV, {NULL, M}, false},
                                  &(nt_isa_alu){NT_ALU_ADD, {NULL, c->eps}, false},
                                  NT_ENGINE_VECTOR);
    return rc ? rc : nt_isa_activation(c->s->k, &r, NT_ACT_RSQRT, &r, NULL, NULL, NULL);
}

/* A [C] f32 vector's elements c0 .. c0+np (or row `row` of a [2, C] one)
 * to and from column k. */
static int vec_dma(bnc *c, const nt_tensor *t, int64_t off, int k, bool store, char *out)
{
    nt_ap d = col(c, k);
    if (store) {
        nt_ap h = nt_hbm_ap(out, NT_F32, off + c->c0, c->np, 1, 1);
        return nt_isa_dma_copy(c->s->k, &h, &d, sk_qout(c->s));
    }
    nt_ap h = nt_hbm_ap(nt__tensor_data(t), (nt_dtype)t->dtype, off + c->c0 * t->stride[t->ndim - 1],
                        c->np, t->stride[t->ndim - 1], 1);
    return nt_isa_dma_copy(c->s->k, &d, &h, sk_qin(c->s));
}

static int fwd_group(bnc *c)
{
    nt_sim_kernel *k = c->s->k;
    int64_t nch = (c->M + RCH - 1) / RCH;
    bool res = nch == 1;
    nt_ap mean = col(c, K_MEAN), ss = col(c, K_SS), r = col(c, K_R);
    nt_ap W = col(c, K_W), B = col(c, K_B);
    int rc = nt_isa_memset(k, &mean, 0.0, NT_ENGINE_VECTOR);
    if (!rc)
        rc = nt_isa_memset(k, &ss, 0.0, NT_ENGINE_VECTOR);
    if (!rc && c->w)
        rc = vec_dma(c, c->w, 0, K_W, false, NULL);
    if (!rc && c->b)
        rc = vec_dma(c, c->b, 0, K_B, false, NULL);
    for (int64_t ch = 0; ch < nch && !rc; ch++) { /* pass 1 */
        int64_t j0 = ch * RCH, w = c->M - j0 < RCH ? c->M - j0 : RCH;
        nt_ap x = nt_tile_slice(c->X, 0, c->np, 0, w);
        rc = span(c, c->X, j0, w, c->x, false);
        if (!rc)
            rc = sk_fold(c->s, &mean, &x, NT_ALU_ADD);
    }
    if (!rc)
        rc = ts2(c, &mean, &mean, NT_ALU_DIV, NULL, (float)c->M, 0, NULL);
    for (int64_t ch = 0; ch < nch && !rc; ch++) { /* pass 2 */
        int64_t j0 = ch * RCH, w = c->M - j0 < RCH ? c->M - j0 : RCH;
        nt_ap x = nt_tile_slice(c->X, 0, c->np, 0, w), T = nt_tile_slice(c->T, 0, c->np, 0, w);
        nt_ap U = nt_tile_slice(c->U, 0, c->np, 0, w);
        if (!res)
            rc = span(c, c->X, j0, w, c->x, false);
        if (!rc)
            rc = ts2(c, &T, &x, NT_ALU_SUB, &mean, 0, 0, NULL);
        if (!rc)
            rc = nt_isa_tensor_tensor(k, &U, &T, &T, NT_ALU_MUL, NT_ENGINE_VECTOR);
        if (!rc)
            rc = sk_fold(c->s, &ss, &U, NT_ALU_ADD);
    }
    if (!rc)
        rc = rstd(c);
    for (int64_t ch = 0; ch < nch && !rc; ch++) { /* pass 3 */
        int64_t j0 = ch * RCH, w = c->M - j0 < RCH ? c->M - j0 : RCH;
        nt_ap x = nt_tile_slice(c->X, 0, c->np, 0, w), T = nt_tile_slice(c->T, 0, c->np, 0, w);
        if (!res)
            rc = span(c, c->X, j0, w, c->x, false);
        if (!rc)
            rc = ts2(c, &T, &x, NT_ALU_SUB, &mean, 0, NT_ALU_MUL, &r);
        if (!rc && (c->w || c->b))
            rc = c->w && c->b ? ts2(c, &T, &T, NT_ALU_MUL, &W, 0, NT_ALU_ADD, &B)
                 : c->w       ? ts2(c, &T, &T, NT_ALU_MUL, &W, 0, 0, NULL)
                              : ts2(c, &T, &T, NT_ALU_ADD, &B, 0, 0, NULL);
        if (!rc && c->y)
            rc = span(c, c->T, j0, w, c->y, true);
        if (!rc && c->relu) { /* the relu kernel's activation on the y it read */
            nt_ap U = nt_tile_slice(c->U, 0, c->np, 0, w);
            rc = nt_isa_activation(k, &U, NT_ACT_RELU, &T, NULL, NULL, NULL);
            if (!rc)
                rc = span(c, c->U, j0, w, c->relu, true);
        }
    }
    if (!rc && c->o2)
        rc = vec_dma(c, NULL, 0, K_MEAN, true, c->o2);
    return rc || !c->o2 ? rc : vec_dma(c, NULL, c->C, K_SS, true, c->o2);
}

/* With the fused relu: the chunk's g in G (w elements from row element j0)
 * masked as relu_bwd's sequence does it, y > 0 ? g : 0 (a select against
 * zeros), against relu's output y loaded into Ym. */
static int relu_mask(bnc *c, int64_t j0, int64_t w)
{
    if (!c->ym)
        return 0;
    nt_ap g = nt_tile_slice(c->G, 0, c->np, 0, w), y = nt_tile_slice(c->Ym, 0, c->np, 0, w);
    nt_ap z = nt_tile_slice(c->Z, 0, c->np, 0, w);
    int rc = span(c, c->Ym, j0, w, c->ym, false);
    if (!rc)
        rc = ts2(c, &y, &y, NT_ALU_GT, NULL, 0.0f, 0, NULL);
    return rc ? rc : nt_isa_select(c->s->k, &g, &y, &g, &z, NT_ENGINE_VECTOR);
}

/* Backward pass 1 over one chunk: xh to T, g in G; the four folds. */
static int bwd_sums(bnc *c, int64_t w)
{
    nt_sim_kernel *k = c->s->k;
    nt_ap x = nt_tile_slice(c->X, 0, c->np, 0, w), g = nt_tile_slice(c->G, 0, c->np, 0, w);
    nt_ap T = nt_tile_slice(c->T, 0, c->np, 0, w), U = nt_tile_slice(c->U, 0, c->np, 0, w);
    nt_ap V = nt_tile_slice(c->V, 0, c->np, 0, w);
    nt_ap mean = col(c, K_MEAN), r = col(c, K_R), W = col(c, K_W);
    nt_ap db = col(c, K_DB), dw = col(c, K_DW), s1 = col(c, K_S1), s2 = col(c, K_S2);
    int rc = ts2(c, &T, &x, NT_ALU_SUB, &mean, 0, NT_ALU_MUL, &r);
    if (!rc)
        rc = sk_fold(c->s, &db, &g, NT_ALU_ADD);
    if (!rc)
        rc = nt_isa_tensor_tensor(k, &U, &g, &T, NT_ALU_MUL, NT_ENGINE_VECTOR);
    if (!rc)
        rc = sk_fold(c->s, &dw, &U, NT_ALU_ADD);
    if (!rc && c->w) {
        rc = ts2(c, &V, &g, NT_ALU_MUL, &W, 0, 0, NULL);
        if (!rc)
            rc = sk_fold(c->s, &s1, &V, NT_ALU_ADD);
        if (!rc)
            rc = nt_isa_tensor_tensor(k, &U, &V, &T, NT_ALU_MUL, NT_ENGINE_VECTOR);
        if (!rc)
            rc = sk_fold(c->s, &s2, &U, NT_ALU_ADD);
    }
    return rc;
}

static int bwd_group(bnc *c)
{
    nt_sim_kernel *k = c->s->k;
    int64_t nch = (c->M + RCH - 1) / RCH;
    bool res = nch == 1;
    nt_ap mean = col(c, K_MEAN), r = col(c, K_R), W = col(c, K_W);
    nt_ap m1 = col(c, K_M1), m2 = col(c, K_M2);
    int rc = vec_dma(c, c->st, 0, K_MEAN, false, NULL);
    if (!rc)
        rc = vec_dma(c, c->st, c->C, K_SS, false, NULL);
    if (!rc && c->w)
        rc = vec_dma(c, c->w, 0, K_W, false, NULL);
    for (int kk = K_S1; kk <= K_DW && !rc; kk++) {
        nt_ap z = col(c, kk);
        rc = nt_isa_memset(k, &z, 0.0, NT_ENGINE_VECTOR);
    }
    if (!rc)
        rc = rstd(c);
    for (int64_t ch = 0; ch < nch && !rc; ch++) { /* pass 1 */
        int64_t j0 = ch * RCH, w = c->M - j0 < RCH ? c->M - j0 : RCH;
        rc = span(c, c->X, j0, w, c->x, false);
        if (!rc)
            rc = span(c, c->G, j0, w, c->g, false);
        if (!rc)
            rc = relu_mask(c, j0, w);
        if (!rc && c->gz)
            rc = span(c, c->G, j0, w, c->gz, true);
        if (!rc)
            rc = bwd_sums(c, w);
    }
    nt_ap s1 = col(c, c->w ? K_S1 : K_DB), s2 = col(c, c->w ? K_S2 : K_DW);
    if (!rc)
        rc = ts2(c, &m1, &s1, NT_ALU_DIV, NULL, (float)c->M, 0, NULL);
    if (!rc)
        rc = ts2(c, &m2, &s2, NT_ALU_DIV, NULL, (float)c->M, 0, NULL);
    for (int64_t ch = 0; ch < nch && !rc; ch++) { /* pass 2 */
        int64_t j0 = ch * RCH, w = c->M - j0 < RCH ? c->M - j0 : RCH;
        nt_ap x = nt_tile_slice(c->X, 0, c->np, 0, w), g = nt_tile_slice(c->G, 0, c->np, 0, w);
        nt_ap T = nt_tile_slice(c->T, 0, c->np, 0, w), U = nt_tile_slice(c->U, 0, c->np, 0, w);
        if (!res) {
            rc = span(c, c->X, j0, w, c->x, false);
            if (!rc)
                rc = span(c, c->G, j0, w, c->g, false);
            if (!rc)
                rc = relu_mask(c, j0, w);
            if (!rc)
                rc = ts2(c, &T, &x, NT_ALU_SUB, &mean, 0, NT_ALU_MUL, &r);
        }
        /* U = gx - m1; T = U - xh * m2; T = T * r */
        if (!rc)
            rc = c->w ? ts2(c, &U, &g, NT_ALU_MUL, &W, 0, NT_ALU_SUB, &m1)
                      : ts2(c, &U, &g, NT_ALU_SUB, &m1, 0, 0, NULL);
        if (!rc)
            rc = nt_isa_scalar_tensor_tensor(k, &T, &T, &(nt_isa_alu){NT_ALU_MUL, {&m2, 0}, false},
                                             NT_ALU_SUB, &U, true, NT_ENGINE_VECTOR);
        if (!rc)
            rc = ts2(c, &T, &T, NT_ALU_MUL, &r, 0, 0, NULL);
        if (!rc && c->y)
            rc = span(c, c->T, j0, w, c->y, true);
    }
    if (!rc && c->o2)
        rc = vec_dma(c, NULL, 0, K_DW, true, c->o2);
    return rc || !c->o2 ? rc : vec_dma(c, NULL, c->C, K_DB, true, c->o2);
}

/* What the fused relu adds to a program (bnc's relu, gz, ym). */
typedef struct bnrelu {
    bool bwd;
    nt_tensor *relu, *gz;
    const nt_tensor *ym;
} bnrelu;

static char *data_or_null(const nt_tensor *t) { return t ? nt__tensor_data(t) : NULL; }

static int bn_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    const bnrelu *f = ctx;
    bool bwd = f->bwd;
    const nt_tensor *x = r->in[bwd ? 1 : 0];
    bnc c = {.s = s, .N = x->shape[0], .C = x->shape[1], .eps = (float)r->p.f[0]};
    c.S = nt__numel(x->ndim - 2, x->shape + 2);
    c.M = c.N * c.S;
    c.x = nt__tensor_data(x);
    c.y = data_or_null(r->out[0]), c.o2 = data_or_null(r->out[1]);
    c.relu = data_or_null(f->relu), c.gz = data_or_null(f->gz), c.ym = data_or_null(f->ym);
    if (bwd)
        c.g = nt__tensor_data(r->in[0]), c.st = r->in[2], c.w = r->in[3];
    else
        c.w = r->in[1], c.b = r->in[2];
    int64_t cw = c.M < RCH ? (c.M > 0 ? c.M : 1) : RCH;
    c.X = sk_tile(s, "bn.x", NT_F32, 128, cw);
    c.T = sk_tile(s, "bn.t", NT_F32, 128, cw);
    c.U = sk_tile(s, "bn.u", NT_F32, 128, cw);
    if (bwd) {
        c.G = sk_tile(s, "bn.g", NT_F32, 128, cw);
        c.V = sk_tile(s, "bn.v", NT_F32, 128, cw);
    }
    if (c.ym) {
        c.Ym = sk_tile(s, "bn.ym", NT_F32, 128, cw);
        c.Z = sk_tile(s, "bn.zero", NT_F32, 128, cw);
    }
    c.col = sk_tile(s, "bn.cols", NT_F32, 128, K_N);
    int rc = nt_sim_kernel_error(s->k);
    if (!rc)
        rc = sk_warm_act(s, NT_ACT_RSQRT);
    if (!rc && c.ym) {
        nt_ap z = nt_tile_ap(c.Z);
        rc = nt_isa_memset(s->k, &z, 0.0, NT_ENGINE_VECTOR);
    }
    for (c.c0 = 0; c.c0 < c.C && !rc; c.c0 += 128) {
        c.np = c.C - c.c0 < 128 ? (int)(c.C - c.c0) : 128;
        rc = bwd ? bwd_group(&c) : fwd_group(&c);
    }
    return rc;
}

int nt__sk_batch_norm_fwd(const nt__rec *r)
{
    return sk_run_prog(r, NULL, bn_prog, &(bnrelu){.bwd = false});
}

int nt__sk_batch_norm_bwd(const nt__rec *r)
{
    return sk_run_prog(r, NULL, bn_prog, &(bnrelu){.bwd = true});
}

int nt__sk_bn_fused(sk_k *s, const nt__fgroup *g)
{
    const nt__fprog *P = g->prog;
    const nt__fop *bo, *ro;
    bool fwd = nt__fbn_ops(P, &bo, &ro);
    int sv[3] = {P->vals[bo->out].store, P->vals[bo->out + 1].store, P->vals[ro->out].store};
    nt__rec r;
    nt__fbn_rec(&r, g, sv[0] >= 0 ? g->out[sv[0]] : NULL, sv[1] >= 0 ? g->out[sv[1]] : NULL);
    bnrelu f = {.bwd = !fwd};
    if (fwd) {
        f.relu = sv[2] >= 0 ? g->out[sv[2]] : NULL;
    } else {
        f.ym = g->ext[NT_F_EXT_IDX(ro->a[1])];
        f.gz = sv[2] >= 0 ? g->out[sv[2]] : NULL;
    }
    if (nt__numel(r.in[fwd ? 0 : 1]->ndim, r.in[fwd ? 0 : 1]->shape) == 0)
        return 0;
    return bn_prog(s, &r, &f);
}
