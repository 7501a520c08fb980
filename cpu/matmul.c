/* cpu/matmul.c - batched matmul with PyTorch's shape rules (1-D operands
 * promoted and the added dim dropped; batch dims broadcast), any strides.
 *
 * Arithmetic (docs/exactness.md, rule 4, the contract the simulator and fused kernels
 * reproduce): per batch, C [M, N] (f32) accumulates the K-tiles of 128 in
 * ascending order through nt__gemm_ktile,
 *     C = A^T[kt] . B[kt]           for the first tile (kt = 0),
 *     C = C + A^T[kt] . B[kt]       for every later tile,
 * where A^T[kt] is rows kt..kt+127 of a stored transposed (an f32 [Kt, M]
 * buffer) and B[kt] those of b (f32 [Kt, N]), both widened exactly from the
 * input dtype (f32 and bf16 operands as the GEMM packs its panels, others
 * into scratch first); then C is rounded once to the output dtype (per
 * block of C inside the GEMM, while it is in cache).  K = 0 gives
 * zeros.  nt__gemm runs those K-tiles over the whole M x N (in cache-sized
 * blocks of C): the per-element order does not depend on M, N or the
 * blocking (core/gemm.h), so this equals the simulator's 128 x 512 output
 * blocks bit for bit. */
#include "cpu/cpu.h"

#include <glib.h>
#include <stdatomic.h>
#include <string.h>

#include "core/gemm.h"

/* Scratch for packed operands: per thread, grown as needed and kept, so a
 * training loop does not page-fault a fresh buffer every call. */
static void scratch_free(void *p) { g_free(p); }
static nt__tlkey scratch_key = NT__TLKEY_INIT(scratch_free);

/* The backend's init makes the key, at nt_init (before any worker runs a
 * kernel): a failure is nt_init's error. */
int nt__cpu_matmul_init(void)
{
    if (!nt__tlkey_make(&scratch_key))
        return nt__err(NULL, NT_EHOSTMEM, "nt_init",
                       "the system has no thread-local key left for the CPU matmul's scratch");
    return 0;
}
static _Thread_local size_t scratch_n NT_TLS_HOT;

static float *scratch(size_t n)
{
    float *p = nt__tlkey_get(&scratch_key);
    if (p && scratch_n >= n)
        return p;
    g_free(p);
    p = g_try_malloc(n * sizeof(float));
    if (!nt__tlkey_set(&scratch_key, p)) {
        g_free(p);
        p = NULL;
    }
    scratch_n = p ? n : 0;
    return p;
}

/* A batch of operands used in place (nothing packed into scratch first)
 * and an f32 output: the products are independent, so both threads take
 * whole batches (nt__par_blocks) instead of sharing each small product.
 * A training step's weight gradients are such batches: x^T . dy per
 * sequence of a [16, 128, C] activation, 16 products of 128 x 384 x 128
 * each, too small to share well (a second thread there saved a fifth of
 * the time; whole batches save most of the other half).  Each product is
 * the same call either way, run whole on one thread: the same bits. */
typedef struct mm_batches {
    const nt__mminfo *mi;
    const char *ad, *bd;
    char *od;
    int64_t aes, bes, oes;
    int M, N, K, lda, ldb;
    bool a_rows, b_cols, typed;
    nt_dtype adt, bdt, odt;
    atomic_int failed; /* a typed call found no memory (read after nt__par_blocks) */
} mm_batches;

static void mm_batch(void *arg, int bi)
{
    mm_batches *c = arg;
    const nt__mminfo *mi = c->mi;
    int64_t idx[NT_MAX_DIMS], rem = bi, aoff = 0, boff = 0;
    for (int i = mi->nbatch - 1; i >= 0; i--)
        idx[i] = rem % mi->batch[i], rem /= mi->batch[i];
    for (int i = 0; i < mi->nbatch; i++)
        aoff += idx[i] * mi->a_bstride[i], boff += idx[i] * mi->b_bstride[i];
    const void *Ap = c->ad + aoff * c->aes, *Bp = c->bd + boff * c->bes;
    char *ob = c->od + (int64_t)bi * c->M * c->N * c->oes;
    if (c->typed) {
        if (nt__gemm_typed(c->M, c->N, c->K, Ap, c->lda, c->a_rows, c->adt, Bp, c->ldb, c->b_cols,
                           c->bdt, (float *)ob, c->N, ob, c->odt) != 0)
            atomic_store_explicit(&c->failed, 1, memory_order_relaxed);
    } else {
        nt__gemm_ex_canon(c->M, c->N, c->K, Ap, c->lda, c->a_rows, Bp, c->ldb, c->b_cols,
                          (float *)ob, c->N);
    }
}

/* Per-batch products up to this many multiply-adds take whole batches per
 * thread (mm_batches); bigger ones share each product, as one does. */
#define NT_MM_BATCH_MACS (16L << 20)

/* One pass over the batches.  typed: bf16 operands are used in place too
 * (nt__gemm_typed widens them as it packs its panels) and a non-f32 result
 * is rounded block by block inside the GEMM; 1 when nt__gemm_typed had no
 * memory for its panels (the caller reruns the pass untyped).  Untyped:
 * only f32 operands in place, the rest widened into scratch first. */
static int mm_pass(const nt__rec *r, const nt__mminfo *mip, bool typed)
{
    const nt_tensor *a = r->in[0], *b = r->in[1], *o = r->out[0];
    const nt__mminfo mi = *mip;
    int64_t M = mi.M, N = mi.N, K = mi.K;
    nt_dtype adt = (nt_dtype)a->dtype, bdt = (nt_dtype)b->dtype, odt = (nt_dtype)o->dtype;
    int64_t aes = (int64_t)nt__dtype_size(adt), bes = (int64_t)nt__dtype_size(bdt);
    int64_t oes = (int64_t)nt__dtype_size(odt);
    bool a_flat = adt == NT_F32 || (typed && adt == NT_BF16);
    bool b_flat = bdt == NT_F32 || (typed && bdt == NT_BF16);
    /* Operands already in the primitive's layout are used in place: A^T
     * (K x M) when a's rows are unit-strided (a transposed view), B (K x N)
     * when b's columns are; C is the output itself when it is f32. */
    bool a_direct = a_flat && mi.a_rs == 1 && mi.a_cs >= M && mi.a_cs <= INT32_MAX;
    /* a row-major a (M x K) too: the GEMM packs its panels from it */
    bool a_rows = !a_direct && a_flat && mi.a_cs == 1 && mi.a_rs >= K && mi.a_rs <= INT32_MAX;
    bool b_direct = b_flat && mi.b_cs == 1 && mi.b_rs >= N && mi.b_rs <= INT32_MAX;
    /* a transposed b (x @ w^T: w N x K row-major): packed from w itself */
    bool b_cols = !b_direct && b_flat && mi.b_rs == 1 && mi.b_cs >= K && mi.b_cs <= INT32_MAX;
    bool c_direct = odt == NT_F32;
    /* x @ w^T on [B, T, C] (a linear layer): a row-major a whose batches
     * follow one another row after row (each a_rs after the last row of
     * the one before), against one b for all: one product of B * T rows
     * instead of B products of T -- b packed once, not per batch.  Each
     * element's recurrence does not depend on M (core/gemm.h): the same
     * bits. */
    int64_t nb_all = nt__numel(mi.nbatch, mi.batch), Mx = M;
    if (a_rows && nb_all > 1) {
        bool fold = true;
        int64_t want = M * mi.a_rs; /* the next batch's first row */
        for (int i = mi.nbatch - 1; i >= 0 && fold; i--) {
            if (mi.batch[i] == 1)
                continue;
            fold = mi.b_bstride[i] == 0 && mi.a_bstride[i] == want;
            want *= mi.batch[i];
        }
        if (fold && M * nb_all <= INT32_MAX)
            Mx = M * nb_all;
    }
    /* an odd count of batches leaves one thread a batch more: only where
     * there are many, or each is too small to share anyway */
    if (Mx == M && nb_all >= 2 && nb_all <= INT32_MAX && (a_direct || a_rows) &&
        (b_direct || b_cols) && c_direct && !(adt == NT_BF16 && bdt == NT_BF16) &&
        M * N * K <= NT_MM_BATCH_MACS &&
        (nb_all % 2 == 0 || nb_all >= 8 || M * N * K < NT_MM_BATCH_MACS / 8)) {
        mm_batches c = {&mi, nt__tensor_data(a), nt__tensor_data(b), nt__tensor_data(o),
                        aes, bes, oes, (int)M, (int)N, (int)K,
                        (int)(a_rows ? mi.a_rs : mi.a_cs), (int)(b_cols ? mi.b_cs : mi.b_rs),
                        a_rows, b_cols, typed, adt, bdt, odt, 0};
        /* two threads only where the whole is worth one (core/gemm.c's rule) */
        nt__par_blocks((int)nb_all, mm_batch, &c, M * N * K * nb_all >= (1L << 20));
        /* nt__par_blocks returns after every block, its ends published */
        return atomic_load_explicit(&c.failed, memory_order_relaxed) ? 1 : 0;
    }
    size_t na = a_direct || a_rows ? 0 : (size_t)(K * M);
    size_t nb = b_direct || b_cols ? 0 : (size_t)(K * N);
    size_t nc = c_direct ? 0 : (size_t)(Mx * N);
    float *buf = scratch(na + nb + nc + 1);
    if (!buf)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for matmul buffers (%zu floats)",
                        na + nb + nc);
    float *At = buf, *B = buf + na, *C = buf + na + nb;
    const char *ad = nt__tensor_data(a), *bd = nt__tensor_data(b);
    char *od = nt__tensor_data(o);
    int64_t idx[NT_MAX_DIMS] = {0};
    int64_t a_prev = -1, b_prev = -1; /* broadcast batches reuse the packing */
    int64_t bi = 0;
    do {
        int64_t aoff = 0, boff = 0;
        for (int i = 0; i < mi.nbatch; i++)
            aoff += idx[i] * mi.a_bstride[i], boff += idx[i] * mi.b_bstride[i];
        const void *Ap = At, *Bp = B;
        nt_dtype apt = NT_F32, bpt = NT_F32; /* what Ap and Bp hold */
        int lda = (int)M, ldb = (int)N;
        if (a_direct || a_rows) {
            Ap = ad + aoff * aes;
            apt = adt;
            lda = (int)(a_rows ? mi.a_rs : mi.a_cs);
        } else if (aoff != a_prev) {
            nt__mm_pack(At, M, ad + aoff * aes, adt, aes, K, M, mi.a_cs, mi.a_rs);
        }
        if (b_direct || b_cols) {
            Bp = bd + boff * bes;
            bpt = bdt;
            ldb = (int)(b_cols ? mi.b_cs : mi.b_rs);
        } else if (boff != b_prev) {
            nt__mm_pack(B, N, bd + boff * bes, bdt, bes, K, N, mi.b_rs, mi.b_cs);
        }
        a_prev = aoff, b_prev = boff;
        char *ob = od + bi * (int64_t)(M * N) * oes;
        float *Cp = c_direct ? (float *)ob : C;
        /* one rounding to the output dtype (for f32: NaNs made canonical),
         * in the GEMM's last store or per block of C while it is in cache,
         * rather than another pass over C */
        if (adt == NT_BF16 && bdt == NT_BF16) {
            /* bf16 x bf16: their own definition (core/gemm.h), whether the
             * operands are used in place or were widened into scratch */
            nt__gemm_bf16((int)Mx, (int)N, (int)K, Ap, lda, a_rows, apt, Bp, ldb, b_cols, bpt, Cp,
                          (int)N, false, c_direct, ob, odt);
        } else if (typed) {
            if (nt__gemm_typed((int)Mx, (int)N, (int)K, Ap, lda, a_rows, apt, Bp, ldb, b_cols,
                               bpt, Cp, (int)N, ob, odt) != 0)
                return 1;
        } else if (c_direct) {
            nt__gemm_ex_canon((int)Mx, (int)N, (int)K, Ap, lda, a_rows, Bp, ldb, b_cols, Cp,
                              (int)N);
        } else {
            nt__gemm_ex((int)Mx, (int)N, (int)K, Ap, lda, a_rows, Bp, ldb, b_cols, Cp, (int)N);
            nt__st_f32(ob, odt, 1, Cp, Mx * N);
        }
        bi++;
    } while (Mx == M && nt__idx_next(idx, mi.nbatch, mi.batch));
    return 0;
}

/* f64 (an f64 operand; the other one widened exactly): each output element
 * sum_k a[m][k] * b[k][n] in double, k ascending from +0, a multiply and an
 * add per step (no FMA), rounded once into the output.  On the calling
 * thread, in batch-major order: every mode gives the same bits. */
static int mm_f64(const nt__rec *r, const nt__mminfo *mi)
{
    const nt_tensor *a = r->in[0], *b = r->in[1], *o = r->out[0];
    const char *ad = nt__tensor_data(a), *bd = nt__tensor_data(b);
    char *od = nt__tensor_data(o);
    nt_dtype adt = (nt_dtype)a->dtype, bdt = (nt_dtype)b->dtype, odt = (nt_dtype)o->dtype;
    int64_t idx[NT_MAX_DIMS] = {0}, bi = 0;
    do {
        int64_t aoff = 0, boff = 0;
        for (int i = 0; i < mi->nbatch; i++)
            aoff += idx[i] * mi->a_bstride[i], boff += idx[i] * mi->b_bstride[i];
        for (int64_t m = 0; m < mi->M; m++)
            for (int64_t n = 0; n < mi->N; n++) {
                double acc = 0.0;
                for (int64_t k = 0; k < mi->K; k++) {
                    double p = nt__load_f64(ad, adt, aoff + m * mi->a_rs + k * mi->a_cs) *
                               nt__load_f64(bd, bdt, boff + k * mi->b_rs + n * mi->b_cs);
                    acc = acc + p;
                }
                nt__store_f64(od, odt, (bi * mi->M + m) * mi->N + n, acc);
            }
        bi++;
    } while (mi->nbatch > 0 && nt__idx_next(idx, mi->nbatch, mi->batch));
    return 0;
}

int nt__cpu_matmul(const nt__rec *r)
{
    const nt_tensor *a = r->in[0], *b = r->in[1];
    nt__mminfo mi;
    char why[160];
    if (!nt__matmul_info(a, b, &mi, why, sizeof why))
        return nt__kerr(NT_ESHAPE, "%s", why); /* the dispatcher checked: unreachable */
    int64_t M = mi.M, N = mi.N, K = mi.K;
    int64_t nbatch = nt__numel(mi.nbatch, mi.batch);
    if (M == 0 || N == 0 || nbatch == 0)
        return 0;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return nt__kerr(NT_ENOTSUP, "matrix dims %lld x %lld x %lld exceed the int range",
                        (long long)M, (long long)K, (long long)N);
    if (a->dtype == NT_F64 || b->dtype == NT_F64 || r->out[0]->dtype == NT_F64)
        return mm_f64(r, &mi);
    /* Typed first; with no memory for its panels, every batch again the
     * plain way (outputs never alias inputs, and each batch's result is
     * the same bits either way). */
    int rc = mm_pass(r, &mi, true);
    return rc == 1 ? mm_pass(r, &mi, false) : rc;
}
