/* neuron/moe.c - grouped_mm and grouped_mm_wgrad on the simulator (the
 * CPU's cpu/moe.c is the reference; docs/parallel.md, "Mixture of experts").
 *
 * One kernel for all experts: the counts are loaded from HBM into SBUF (a
 * DMA of E int32, what the kernel reads its loop bounds from on the device,
 * so nothing syncs with the host), then each expert's rows run as one
 * nt_tile_matmul program on TensorE over the row slice -- PSUM accumulation
 * over K-tiles of 128 in ascending order, the CPU recurrence bit for bit --
 * and rows past the counts' sum (and an expert without rows' weight
 * gradient) are zeroed by a memset tile stored by DMA.  The program depends
 * on the counts' values, so it is never filed in the timing memo. */
#include "neuron/sk.h"

#include <glib.h>
#include <stdio.h>
#include <string.h>

#include "core/moe.h"

/* Loads counts into SBUF (the device read) and reads them; checks them as
 * the CPU kernel does (a data error in its words). */
static int gmm_counts(sk_k *s, const nt_tensor *ct, int64_t E, int64_t M, int64_t *cnt)
{
    nt_tile *t = sk_tile(s, "gmm.counts", NT_I32, 1, E);
    if (!t)
        return nt_sim_kernel_error(s->k);
    const int32_t *cd = (const int32_t *)nt__tensor_data(ct);
    nt_ap dst = nt_tile_slice(t, 0, 1, 0, E);
    nt_ap src = nt_hbm_ap(cd, NT_I32, 0, 1, E, E);
    int rc = nt_isa_dma_copy(s->k, &dst, &src, sk_qin(s));
    if (rc)
        return rc;
    int64_t sum = 0;
    for (int64_t e = 0; e < E; e++) {
        cnt[e] = cd[e * ct->stride[0]];
        if (cnt[e] < 0)
            return sk_data_error(s, NT_ERANGE, "counts[%lld] = %lld is negative", (long long)e,
                                 (long long)cnt[e]);
        sum += cnt[e];
    }
    if (sum > M)
        return sk_data_error(s, NT_ERANGE, "counts add up to %lld rows; x has %lld",
                             (long long)sum, (long long)M);
    return 0;
}

/* rows x cols of zeros (dt) at base + off, rows `ld` apart: a memset tile
 * stored by DMA, 128 rows at a time. */
static int gmm_zeros(sk_k *s, char *base, nt_dtype dt, int64_t off, int64_t rows, int64_t cols,
                     int64_t ld)
{
    if (rows == 0 || cols == 0)
        return 0;
    int64_t cc = cols < 4096 ? cols : 4096;
    nt_tile *z = sk_tile(s, "gmm.zero", dt, 128, cc);
    if (!z)
        return nt_sim_kernel_error(s->k);
    nt_ap all = nt_tile_slice(z, 0, 128, 0, cc);
    int rc = nt_isa_memset(s->k, &all, 0.0, NT_ENGINE_GPSIMD);
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += 128) {
        int np = (int)(rows - r0 < 128 ? rows - r0 : 128);
        for (int64_t c0 = 0; c0 < cols && !rc; c0 += cc) {
            int64_t nc = cols - c0 < cc ? cols - c0 : cc;
            nt_ap src = nt_tile_slice(z, 0, np, 0, nc);
            nt_ap dst = nt_hbm_ap(base, dt, off + r0 * ld + c0, np, ld, nc);
            rc = nt_isa_dma_copy(s->k, &dst, &src, sk_qout(s));
        }
    }
    nt_tile_release(s->k, z);
    return rc;
}

static int gmm_run(sk_k *s, const nt__rec *r, bool wgrad)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    int64_t M = x->shape[0], K = x->shape[1];
    int64_t E = wgrad ? o->shape[0] : r->in[1]->shape[0];
    int64_t N = wgrad ? r->in[1]->shape[1] : o->shape[1];
    bool tr = !wgrad && r->p.dim == 1;
    nt_dtype dt = (nt_dtype)x->dtype;
    int64_t es = (int64_t)nt__dtype_size(dt);
    int64_t cnt[1024];
    int64_t *cp = E <= 1024 ? cnt : g_try_malloc((size_t)E * sizeof *cp);
    if (!cp)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for grouped_mm's counts");
    int rc = gmm_counts(s, r->in[2], E, M, cp);
    const char *xd = nt__tensor_data(x), *bd = nt__tensor_data(r->in[1]);
    char *od = nt__tensor_data(o);
    int64_t row = 0;
    for (int64_t e = 0; e < E && !rc; e++) {
        nt_tile_matmul_args g;
        memset(&g, 0, sizeof g);
        g.in_dtype = dt;
        g.out_dtype = dt;
        g.ldc = N;
        if (!wgrad) { /* y_e [c, N] = x_e [c, K] . w_e (or w_e^T) */
            g.M = cp[e], g.N = N, g.K = K;
            g.a = xd + row * K * es, g.lda = K;
            g.b = bd + e * K * N * es, g.ldb = tr ? K : N, g.b_trans = tr;
            g.c = od + row * N * es;
            rc = cp[e] && N ? nt_tile_matmul(s->k, &g) : 0;
        } else if (cp[e] == 0) { /* no rows: the empty sum */
            rc = gmm_zeros(s, od, dt, e * K * N, K, N, N);
        } else { /* dw_e [K, N] = x_e^T . gy_e, contracting over the rows */
            g.M = K, g.N = N, g.K = cp[e];
            g.a = xd + row * K * es, g.lda = K, g.a_trans = true;
            g.b = bd + row * N * es, g.ldb = N;
            g.c = od + e * K * N * es;
            rc = K && N ? nt_tile_matmul(s->k, &g) : 0;
        }
        row += cp[e];
    }
    if (!rc && !wgrad && row < M)
        rc = gmm_zeros(s, od, dt, row * N, M - row, N, N);
    if (cp != cnt)
        g_free(cp);
    return rc;
}

static int gmm_kernel(const nt__rec *r, bool wgrad)
{
    sk_k s;
    int rc = sk_begin(&s, wgrad ? "grouped_mm_wgrad" : "grouped_mm");
    if (rc)
        return rc;
    bool values = sk_values_begin(&s); /* no memo: the program follows the counts */
    return sk_end_values(&s, values, gmm_run(&s, r, wgrad), r);
}

int nt__sk_grouped_mm(const nt__rec *r) { return gmm_kernel(r, false); }
int nt__sk_grouped_mm_wgrad(const nt__rec *r) { return gmm_kernel(r, true); }

/* ---------------- all_to_all_index ---------------- */

typedef struct a2a_ctx {
    int64_t P, j, R, cap, c0; /* c0: the chunk's first entry */
} a2a_ctx;

/* GpSimd: the whole index from the counts in SBUF (core/moe.h), its chunk
 * [c0, c0 + n) written to dst. */
static int a2a_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                  void *ctxp, char *msg, size_t msglen)
{
    (void)nsrc;
    a2a_ctx *c = ctxp;
    int32_t *all = g_try_malloc((size_t)(c->cap + 1) * sizeof *all);
    if (!all) {
        snprintf(msg, msglen, "out of host memory for the all_to_all index");
        return NT_EHOSTMEM;
    }
    int rc = nt__a2a_index((const int32_t *)src[0].data, c->P, c->j, c->R, all, c->cap, msg,
                           msglen);
    if (!rc)
        memcpy(dst->data, all + c->c0, (size_t)dst->n * sizeof *all);
    g_free(all);
    return rc;
}

int nt__sk_all_to_all_index(const nt__rec *r)
{
    const nt_tensor *C = r->in[0], *o = r->out[0];
    int64_t P = C->shape[0], cap = o->shape[0];
    if (cap == 0)
        return 0;
    sk_k s;
    int rc = sk_begin(&s, "all_to_all_index");
    if (rc)
        return rc;
    const void *cb = sk_contig_of(&s, C);
    int64_t F = cap < 16384 ? cap : 16384;
    nt_tile *tc = sk_tile(&s, "a2a.counts", NT_I32, 1, P * P);
    nt_tile *ti = sk_tile(&s, "a2a.idx", NT_I32, 1, F);
    char *ob = nt__tensor_data(o);
    if (cb && tc && ti) {
        nt_ap cs = nt_tile_slice(tc, 0, 1, 0, P * P);
        nt_ap hc = nt_hbm_ap(cb, NT_I32, 0, 1, P * P, P * P);
        rc = nt_isa_dma_copy(s.k, &cs, &hc, sk_qin(&s));
        for (int64_t c0 = 0; c0 < cap && !rc; c0 += F) {
            int64_t n = cap - c0 < F ? cap - c0 : F;
            a2a_ctx c = {P, r->p.i[0], r->p.i[1], cap, c0};
            nt_ap is = nt_tile_slice(ti, 0, 1, 0, n);
            nt_ap ho = nt_hbm_ap(ob, NT_I32, c0, 1, n, n);
            const nt_ap *srcs[1] = {&cs};
            rc = nt_isa_gpsimd_custom(s.k, "all_to_all_index", &is, srcs, 1, 2.0, a2a_fn, &c) ||
                 nt_isa_dma_copy(s.k, &ho, &is, sk_qout(&s));
        }
    }
    return sk_end(&s);
}
