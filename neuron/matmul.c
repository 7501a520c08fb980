/* neuron/matmul.c - nt_matmul on the simulator.
 *
 * PyTorch's shape rules (1-D operands promoted, batch dims broadcast) come
 * from nt__matmul_info; each batch is one nt_tile_matmul program in the same
 * kernel (batches of a row-major a that follow each other, under one 2-D b,
 * are one program: fold_batches): K-tiles of 128 accumulated in PSUM in
 * ascending order, exactly the
 * CPU kernel's recurrence (core/gemm.h), one rounding to the output dtype.
 *
 * Operands reach the tile program as it wants them: A row-major [M, K] or
 * given as A^T (a transposed view: the program transposes row-major A on
 * TensorE itself); B row-major [K, N], or given as B^T (x @ w^T, the linear
 * layer: the program transposes w's tiles on TensorE in SBUF, never through
 * HBM); any other strides are copied contiguous by DMA. */
#include "neuron/sk.h"

#include <string.h>

/* rows x cols at (rs, cs) -> contiguous rows x cols, by DMA */
static int copy2d(sk_k *s, const char *src, nt_dtype dt, int64_t rows, int64_t cols, int64_t rs,
                  int64_t cs, char *dst)
{
    for (int64_t r0 = 0; r0 < rows; r0 += 128) {
        int np = (int)(rows - r0 < 128 ? rows - r0 : 128);
        nt_ap a, b;
        memset(&a, 0, sizeof a);
        a.hbm = (void *)src;
        a.dtype = dt;
        a.np = np;
        a.pstep = rs;
        a.offset = r0 * rs;
        a.ndim = 1;
        a.num[0] = cols;
        a.step[0] = cs;
        b = nt_hbm_ap(dst, dt, r0 * cols, np, cols, cols);
        int rc = nt_isa_dma_copy(s->k, &b, &a, sk_qin(s));
        if (rc)
            return rc;
    }
    return 0;
}

typedef struct epi_tramp {
    sk_k *s;
    sk_mm_epi epi;
    void *ctx;
    int64_t batch;
    int64_t fold_m; /* M of one batch when the batches run as one product, else 0 */
} epi_tramp;

static int tramp(nt_sim_kernel *k, const nt_ap *acc, int64_t m0, int64_t n0, void *ctx)
{
    (void)k;
    epi_tramp *t = ctx;
    if (t->fold_m) /* a block of 128 rows lies inside one batch (M % 128 == 0) */
        return t->epi(t->s, acc, m0 / t->fold_m, m0 % t->fold_m, n0, t->ctx);
    return t->epi(t->s, acc, t->batch, m0, n0, t->ctx);
}

/* Whether the batches are one product of nbatch * M rows: b the same matrix
 * for every batch and a's batches one after the other in memory, row-major
 * (x [B, T, C] . w^T in nt_linear).  Each element of C is the same dot
 * product in the same K order either way, so the same bits; one program
 * fills TensorE's blocks of 8 M-tiles and loads B once, where a program per
 * batch of 128 rows ran its loads, matmul and store in series.  With an
 * epilogue, M must be a multiple of 128, so that each accumulator block it
 * gets lies in one batch. */
static bool fold_batches(const nt__mminfo *mi, bool a_row, bool has_epi)
{
    if (!a_row || mi->M < 2 || mi->K == 0 || (has_epi && mi->M % 128))
        return false;
    int64_t want = mi->M * mi->a_rs, n = 1;
    for (int i = mi->nbatch - 1; i >= 0; i--) {
        if (mi->batch[i] == 1)
            continue;
        if (mi->b_bstride[i] != 0 || mi->a_bstride[i] != want)
            return false;
        want *= mi->batch[i];
        n *= mi->batch[i];
    }
    return n > 1;
}

bool sk_matmul_side_ok(const nt_tensor *a, const nt_tensor *b, bool epi, bool cs)
{
    nt__mminfo mi;
    char why[160];
    if ((cs && !nt__dtype_is_f32_or_half((nt_dtype)a->dtype)) ||
        !nt__matmul_info(a, b, &mi, why, sizeof why) || mi.K == 0)
        return false;
    bool a_row = (mi.a_cs == 1 || mi.K == 1) && (mi.M == 1 || mi.a_rs >= mi.K);
    return a_row && (nt__numel(mi.nbatch, mi.batch) == 1 || fold_batches(&mi, a_row, epi));
}

int sk_matmul_run(sk_k *s, const nt_tensor *a, const nt_tensor *b, const nt_tensor *c,
                  sk_mm_epi epi, void *ctx)
{
    return sk_matmul_run_cs(s, a, b, c, epi, ctx, NULL);
}

/* The side product w = a^T . x (sk_mm_side) by its own program: the one
 * its record runs alone (nt__sk_matmul), on the view that record read. */
static int side_apart(sk_k *s, const nt_tensor *a, const sk_mm_side *side)
{
    nt_tensor at;
    nt__fside_at(a, &at);
    return sk_matmul_run(s, &at, side->x, side->w, NULL, NULL);
}

/* Whether the tile program may take w = a^T . x beside a's product of M
 * rows and K columns (nt_tile_matmul's rule for args x), w apart from
 * every operand. */
static bool side_pairs(const nt_tensor *a, const nt_tensor *b, const nt_tensor *c,
                       const sk_mm_side *side, int64_t M, int64_t K)
{
    const nt_tensor *x = side->x, *w = side->w;
    int64_t NX = x->ndim == 2 ? x->shape[1] : 0;
    nt_dtype wt = (nt_dtype)w->dtype;
    return x->dtype == a->dtype && NX >= 1 && NX <= 512 && (K + 127) / 128 * NX <= 512 &&
           x->shape[0] == M && nt__is_contig(x) && w->ndim == 2 && w->shape[0] == K &&
           w->shape[1] == NX && nt__is_contig(w) && (wt == NT_F32 || wt == NT_BF16 || wt == NT_F16) &&
           w->st != a->st && w->st != b->st && w->st != x->st && (!c || (c->st != w->st && c->st != x->st));
}

int sk_matmul_run_cs(sk_k *s, const nt_tensor *a, const nt_tensor *b, const nt_tensor *c,
                     sk_mm_epi epi, void *ctx, const sk_mm_side *side)
{
    void *colsum = side ? side->colsum : NULL;
    bool pair = side && side->x;
    nt__mminfo mi;
    char why[160];
    if (!nt__matmul_info(a, b, &mi, why, sizeof why))
        return nt__kerr(NT_ESHAPE, "%s", why);
    int64_t M = mi.M, N = mi.N, K = mi.K;
    int64_t nbatch = nt__numel(mi.nbatch, mi.batch);
    if (M == 0 || N == 0 || nbatch == 0)
        return 0;
    nt_dtype dt = (nt_dtype)a->dtype;
    int64_t esz = (int64_t)nt__dtype_size(dt);
    const char *ad = nt__tensor_data(a), *bd = nt__tensor_data(b);
    char *cd = c ? nt__tensor_data(c) : NULL;
    int64_t oes = c ? (int64_t)nt__dtype_size((nt_dtype)c->dtype) : 0;
    /* how each operand is handed over */
    bool a_row = (mi.a_cs == 1 || K == 1) && (M == 1 || mi.a_rs >= K);
    bool a_col = !a_row && (mi.a_rs == 1 || M == 1) && (K == 1 || mi.a_cs >= M);
    bool b_row = (mi.b_cs == 1 || N == 1) && (K == 1 || mi.b_rs >= N);
    bool b_col = !b_row && (mi.b_rs == 1 || K == 1) && (N == 1 || mi.b_cs >= K);
    if ((colsum || pair) && !sk_matmul_side_ok(a, b, epi != NULL, colsum != NULL))
        return NT_ENOTSUP; /* nothing issued yet */
    char *ascr = NULL, *bscr = NULL;
    if (K > 0 && !a_row && !a_col && !(ascr = sk_scratch(s, (size_t)(M * K * esz))))
        return s->derr_code;
    if (K > 0 && !b_row && !b_col && !(bscr = sk_scratch(s, (size_t)(K * N * esz))))
        return s->derr_code;
    int64_t idx[NT_MAX_DIMS] = {0};
    int64_t a_prev = -1, b_prev = -1, bi = 0;
    int64_t fold_m = fold_batches(&mi, a_row, epi != NULL) ? M : 0;
    if (fold_m) { /* one program over every batch's rows */
        M *= nbatch;
        mi.nbatch = 0;
    }
    int rc = 0;
    if (pair && !side_pairs(a, b, c, side, M, K)) {
        if ((rc = side_apart(s, a, side)))
            return rc;
        pair = false;
    }
    do {
        int64_t aoff = 0, boff = 0;
        for (int i = 0; i < mi.nbatch; i++)
            aoff += idx[i] * mi.a_bstride[i], boff += idx[i] * mi.b_bstride[i];
        nt_tile_matmul_args g;
        memset(&g, 0, sizeof g);
        g.M = M, g.N = N, g.K = K;
        g.in_dtype = dt;
        if (K > 0) {
            const char *ap = ad + aoff * esz, *bp = bd + boff * esz;
            if (a_row) {
                g.a = ap;
                g.lda = M == 1 ? K : mi.a_rs;
            } else if (a_col) {
                g.a = ap;
                g.a_trans = true;
                g.lda = K == 1 ? M : mi.a_cs;
            } else {
                if (aoff != a_prev && (rc = copy2d(s, ap, dt, M, K, mi.a_rs, mi.a_cs, ascr)))
                    break;
                g.a = ascr;
                g.lda = K;
            }
            if (b_row) {
                g.b = bp;
                g.ldb = K == 1 ? N : mi.b_rs;
            } else if (b_col) {
                g.b = bp;
                g.b_trans = true;
                g.ldb = N == 1 ? K : mi.b_cs;
            } else {
                if (boff != b_prev && (rc = copy2d(s, bp, dt, K, N, mi.b_rs, mi.b_cs, bscr)))
                    break;
                g.b = bscr;
                g.ldb = N;
            }
        }
        a_prev = aoff, b_prev = boff;
        g.a_colsum = colsum;
        g.a_colsum_dtype = colsum ? side->colsum_dtype : NT_F32;
        if (pair) { /* one program (sk_matmul_side_ok): w over all of a's rows */
            g.x = nt__tensor_data(side->x);
            g.ldx = g.NX = side->x->shape[1];
            g.w = nt__tensor_data(side->w);
            g.ldw = g.NX;
            g.w_dtype = (nt_dtype)side->w->dtype;
        }
        epi_tramp t = {s, epi, ctx, bi, fold_m};
        if (epi) {
            g.epilogue = tramp;
            g.epilogue_ctx = &t;
            g.epilogue_apart = s->mm_apart;
            g.acc_lives = s->mm_lives;
            g.out_dtype = NT_F32;
        } else {
            g.c = cd + bi * M * N * oes;
            g.ldc = N;
            g.out_dtype = (nt_dtype)c->dtype;
        }
        rc = nt_tile_matmul(s->k, &g);
        if (rc == NT_ENOTSUP && g.x) {
            /* it cannot stream, nothing issued: w's program, then the
             * product's (w's first, as its record ran before the epilogue) */
            g.x = g.w = NULL;
            rc = side_apart(s, a, side);
            if (!rc)
                rc = nt_tile_matmul(s->k, &g);
        }
        if (rc)
            break;
        bi++;
    } while (nt__idx_next(idx, mi.nbatch, mi.batch));
    return rc;
}

static int matmul_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    (void)ctx;
    return sk_matmul_run(s, r->in[0], r->in[1], r->out[0], NULL, NULL);
}

int nt__sk_matmul(const nt__rec *r) { return sk_run_prog(r, "matmul", matmul_prog, NULL); }
