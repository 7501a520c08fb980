/* neuron/sample.c - dropout, topk and multinomial on the simulator.
 *
 * Like arange and rand (gen.c), these run as custom code on GpSimd (the
 * engine that runs C on the NeuronCore), over tiles that DMA brings into
 * SBUF and takes out, computing each element with core/sample.h exactly as
 * the CPU kernels (cpu/sample.c) do. */
#include "neuron/sk.h"

#include <string.h>

#include "core/sample.h"

/* ---------------- dropout ---------------- */

typedef struct drop_ctx {
    int64_t base, F; /* element index of partition 0, elements per partition */
    uint64_t key;
    double p;
    float scale;
} drop_ctx;

static int drop_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                   void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    const drop_ctx *c = ctx;
    for (int q = 0; q < dst->np; q++) {
        const char *x = (const char *)src[0].data + q * src[0].pstride;
        char *y = (char *)dst->data + q * dst->pstride;
        int64_t i0 = c->base + q * c->F;
        for (int64_t j = 0; j < dst->n; j++)
            nt__store_f32(y, dst->dtype, j,
                          nt__load_f32(x, src[0].dtype, j) *
                              nt__dropout_mul(c->key, (uint64_t)(i0 + j), c->p, c->scale));
    }
    return 0;
}

/* x (made contiguous) in [np, F] tiles of the row-major order; element
 * (q, j) of a tile is element base + q * F + j. */
int nt__sk_dropout(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    int64_t n = nt__numel(o->ndim, o->shape);
    if (n == 0)
        return 0;
    nt_dtype xdt = (nt_dtype)x->dtype, odt = (nt_dtype)o->dtype;
    sk_k s;
    int rc = sk_begin(&s, "dropout");
    if (rc)
        return rc;
    const char *xb = sk_contig_of(&s, x);
    int64_t F = (n + 127) / 128;
    if (F > 2048)
        F = 2048;
    nt_tile *tx[2] = {sk_tile(&s, "drop.x", xdt, 128, F), sk_tile(&s, "drop.x", xdt, 128, F)};
    nt_tile *ty[2] = {sk_tile(&s, "drop.y", odt, 128, F), sk_tile(&s, "drop.y", odt, 128, F)};
    char *ob = nt__tensor_data(o);
    int64_t rows = n / F, rem = n % F;
    int k = 0;
    for (int64_t r0 = 0; xb && r0 < rows + (rem > 0) && !nt_sim_kernel_error(s.k); k++) {
        bool tail = r0 >= rows;
        int np = tail ? 1 : (int)(rows - r0 < 128 ? rows - r0 : 128);
        int64_t w = tail ? rem : F;
        drop_ctx c = {r0 * F, F, nt__rng_key(r->p.seed), r->p.f[0],
                      nt__dropout_scale(r->p.f[0])};
        nt_ap xs = nt_tile_slice(tx[k & 1], 0, np, 0, w), ys = nt_tile_slice(ty[k & 1], 0, np, 0, w);
        nt_ap hx = nt_hbm_ap((char *)xb, xdt, r0 * F, np, F, w);
        nt_ap hy = nt_hbm_ap(ob, odt, r0 * F, np, F, w);
        const nt_ap *srcs[1] = {&xs};
        if (nt_isa_dma_copy(s.k, &xs, &hx, sk_qin(&s)) ||
            nt_isa_gpsimd_custom(s.k, "dropout", &ys, srcs, 1, 8.0, drop_fn, &c) ||
            nt_isa_dma_copy(s.k, &hy, &ys, sk_qout(&s)))
            break;
        r0 += np;
    }
    return sk_end(&s);
}

/* ---------------- topk ----------------
 *
 * x (made contiguous) as rows (o, i) of length L along dim d, one row per
 * partition, streamed through SBUF in chunks of TK_CH.  The k first
 * elements of each row (in nt__topk_before's strict order) are found in
 * pieces of at most TK_B: a piece keeps, in a state tile, the TK_B first
 * elements that come after the previous piece's last one, merging each
 * chunk into it (GpSimd custom code); its indices then go out by DMA.  The
 * order is total, so this selects exactly the CPU's sorted indices. */

#define TK_CH 4096
#define TK_B 2048

typedef struct tk_ctx {
    bool largest, fl, has_thr;
    nt_dtype xdt;
    int64_t j0;          /* index along dim of the chunk's first element */
    int64_t B;           /* this piece's size */
    double thr_v[128];   /* per row: the previous piece's last element */
    int64_t thr_i[128];
    int64_t cnt[128];    /* per row: entries in the state */
} tk_ctx;

/* The state tile, per partition: TK_B doubles (as 2 TK_B i32 words), then
 * TK_B i32 indices; entries 0 .. cnt-1 sorted. */
static double tk_v(const char *st, int64_t e)
{
    double v;
    memcpy(&v, st + e * 8, 8);
    return v;
}

static int tk_merge(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                    void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    tk_ctx *c = ctx;
    for (int q = 0; q < dst->np; q++) {
        const char *x = (const char *)src[0].data + q * src[0].pstride;
        char *st = (char *)dst->data + q * dst->pstride;
        int32_t *ix = (int32_t *)(st + TK_B * 8);
        int64_t cnt = c->cnt[q];
        for (int64_t j = 0; j < src[0].n; j++) {
            double v = c->fl ? (double)nt__load_f32(x, c->xdt, j) : nt__load_f64(x, c->xdt, j);
            int64_t id = c->j0 + j;
            if (c->has_thr && !nt__topk_before(c->thr_v[q], c->thr_i[q], v, id, c->largest))
                continue; /* taken by an earlier piece */
            if (cnt == c->B && !nt__topk_before(v, id, tk_v(st, cnt - 1), ix[cnt - 1], c->largest))
                continue;
            /* insert at the first entry it comes before */
            int64_t lo = 0, hi = cnt;
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (nt__topk_before(tk_v(st, mid), ix[mid], v, id, c->largest))
                    lo = mid + 1;
                else
                    hi = mid;
            }
            int64_t keep = cnt < c->B ? cnt : c->B - 1;
            memmove(st + (lo + 1) * 8, st + lo * 8, (size_t)(keep - lo) * 8);
            memmove(ix + lo + 1, ix + lo, (size_t)(keep - lo) * sizeof(int32_t));
            memcpy(st + lo * 8, &v, 8);
            ix[lo] = (int32_t)id;
            cnt = keep + 1;
        }
        c->cnt[q] = cnt;
    }
    return 0;
}

/* End of a piece: its last entry is the next piece's threshold. */
static int tk_end(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                  void *ctx, char *msg, size_t msglen)
{
    (void)dst, (void)nsrc, (void)msg, (void)msglen;
    tk_ctx *c = ctx;
    for (int q = 0; q < src[0].np; q++) {
        const char *st = (const char *)src[0].data + q * src[0].pstride;
        int64_t e = c->cnt[q] - 1;
        c->thr_v[q] = tk_v(st, e);
        c->thr_i[q] = ((const int32_t *)(st + TK_B * 8))[e];
        c->cnt[q] = 0;
    }
    c->has_thr = true;
    return 0;
}

int nt__sk_topk(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    int d = r->p.dim;
    int64_t k = r->p.i[0], L = x->shape[d], O = 1, I = 1, n = nt__numel(x->ndim, x->shape);
    for (int a = 0; a < d; a++)
        O *= x->shape[a];
    for (int a = d + 1; a < x->ndim; a++)
        I *= x->shape[a];
    if (n == 0 || k == 0)
        return 0;
    nt_dtype xdt = (nt_dtype)x->dtype;
    sk_k s;
    int rc = sk_begin(&s, "topk");
    if (rc)
        return rc;
    const char *xb = sk_contig_of(&s, x);
    char *ob = nt__tensor_data(o);
    nt_tile *tx[2] = {sk_tile(&s, "topk.x", xdt, 128, TK_CH), sk_tile(&s, "topk.x", xdt, 128, TK_CH)};
    nt_tile *ts = sk_tile(&s, "topk.state", NT_I32, 128, 3 * TK_B);
    tk_ctx *c = g_try_malloc0(sizeof *c);
    if (!c) {
        sk_end(&s);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for the topk state");
    }
    c->largest = r->p.flag != 0;
    c->fl = nt__dtype_is_float(xdt);
    c->xdt = xdt;
    /* row groups: rows (a, i0 .. i0+np) of one a (partition step 1) when
     * I > 1, else rows a0 .. a0+np (partition step L) */
    int64_t nrows = O * I, kk = 0;
    for (int64_t r0 = 0; xb && r0 < nrows && !nt_sim_kernel_error(s.k);) {
        int64_t a = r0 / I, i0 = r0 % I;
        int np = (int)(I > 1 ? (I - i0 < 128 ? I - i0 : 128) : (nrows - r0 < 128 ? nrows - r0 : 128));
        int64_t xoff = a * L * I + i0, ooff = a * k * I + i0;
        int64_t xps = I > 1 ? 1 : L, ops = I > 1 ? 1 : k;
        c->has_thr = false;
        memset(c->cnt, 0, sizeof c->cnt);
        for (int64_t s0 = 0; s0 < k && !nt_sim_kernel_error(s.k); s0 += TK_B) {
            c->B = k - s0 < TK_B ? k - s0 : TK_B;
            nt_ap st = nt_tile_slice(ts, 0, np, 0, 3 * TK_B);
            for (int64_t j0 = 0; j0 < L; j0 += TK_CH, kk++) {
                int64_t w = L - j0 < TK_CH ? L - j0 : TK_CH;
                nt_ap xs = nt_tile_slice(tx[kk & 1], 0, np, 0, w);
                nt_ap hx = nt_hbm_ap(xb, xdt, xoff + j0 * I, np, xps, w);
                hx.step[0] = I;
                c->j0 = j0;
                const nt_ap *srcs[2] = {&xs, &st};
                if (nt_isa_dma_copy(s.k, &xs, &hx, sk_qin(&s)) ||
                    nt_isa_gpsimd_custom(s.k, "topk", &st, srcs, 2, 6.0, tk_merge, c))
                    break;
            }
            const nt_ap *srcs[1] = {&st};
            nt_ap idx = nt_tile_slice(ts, 0, np, 2 * TK_B, c->B);
            nt_ap ho = nt_hbm_ap(ob, NT_I32, ooff + s0 * I, np, ops, c->B);
            ho.step[0] = I;
            if (nt_sim_kernel_error(s.k) || nt_isa_dma_copy(s.k, &ho, &idx, sk_qout(&s)) ||
                (s0 + TK_B < k && nt_isa_gpsimd_custom(s.k, "topk.end", NULL, srcs, 1, 1.0, tk_end, c)))
                break;
        }
        r0 += np;
    }
    g_free(c);
    return sk_end(&s);
}

/* ---------------- multinomial ----------------
 *
 * Rows of probs on partitions (up to 128), streamed through SBUF in chunks
 * of MN_CH.  Pass 1 (GpSimd): each row's running sum in double, in index
 * order, and its first bad value; the first bad row is reported in the
 * CPU's words.  Pass 2, per block of MN_DB draws: the chunks again, the
 * running sums carried from chunk to chunk (the same additions as the
 * CPU's), each draw resolved in the chunk where the running sum first
 * exceeds its target. */

#define MN_CH 4096
#define MN_DB 2048

typedef struct mn_ctx {
    sk_k *s;
    int nd;
    int64_t row0, C, n, c0, j0, db;
    uint64_t key;
    double total[128], cum[128];
    int64_t bad[128], last[128];
    double badv[128];
} mn_ctx;

static int mn_sum(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                  void *ctx, char *msg, size_t msglen)
{
    (void)dst, (void)nsrc, (void)msg, (void)msglen;
    mn_ctx *c = ctx;
    for (int q = 0; q < src[0].np; q++) {
        const char *x = (const char *)src[0].data + q * src[0].pstride;
        for (int64_t j = 0; j < src[0].n; j++) {
            double v = nt__load_f32(x, src[0].dtype, j);
            if (nt__multinomial_bad(v) && c->bad[q] < 0)
                c->bad[q] = c->c0 + j, c->badv[q] = v;
            c->total[q] += v;
            if (v > 0)
                c->last[q] = c->c0 + j;
        }
    }
    return 0;
}

/* After pass 1: the first row with a bad value or a zero sum fails. */
static int mn_check(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                    void *ctx, char *msg, size_t msglen)
{
    (void)dst, (void)nsrc;
    mn_ctx *c = ctx;
    for (int q = 0; q < src[0].np; q++)
        if (c->bad[q] >= 0 || c->total[q] == 0) {
            nt__multinomial_msg(msg, msglen, c->nd, c->row0 + q, c->bad[q], c->badv[q],
                                c->bad[q] < 0);
            return sk_data_error(c->s, NT_EINVAL, "%s", msg);
        }
    return 0;
}

/* One chunk of pass 2: dst = the block's results (i32, -1 = not yet). */
static int mn_draw(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                   void *ctx, char *msg, size_t msglen)
{
    (void)nsrc, (void)msg, (void)msglen;
    mn_ctx *c = ctx;
    double cc[MN_CH];
    for (int q = 0; q < dst->np; q++) {
        const char *x = (const char *)src[0].data + q * src[0].pstride;
        int32_t *res = (int32_t *)((char *)dst->data + q * dst->pstride);
        int64_t w = src[0].n;
        double s = c->cum[q];
        for (int64_t j = 0; j < w; j++) {
            s += (double)nt__load_f32(x, src[0].dtype, j);
            cc[j] = s;
        }
        c->cum[q] = s;
        for (int64_t j = 0; j < c->db; j++) {
            if (res[j] >= 0)
                continue;
            double t = nt__multinomial_target(c->key, (uint64_t)((c->row0 + q) * c->n + c->j0 + j),
                                              c->total[q]);
            if (!(cc[w - 1] > t))
                continue;
            int64_t lo = 0, hi = w;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (cc[mid] > t)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            res[j] = (int32_t)(c->c0 + lo);
        }
    }
    return 0;
}

/* End of a block: draws no running sum exceeded (t rounded to the total)
 * take the last category with p > 0, as on the CPU. */
static int mn_fin(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc,
                  void *ctx, char *msg, size_t msglen)
{
    (void)src, (void)nsrc, (void)msg, (void)msglen;
    mn_ctx *c = ctx;
    for (int q = 0; q < dst->np; q++) {
        int32_t *res = (int32_t *)((char *)dst->data + q * dst->pstride);
        for (int64_t j = 0; j < c->db; j++)
            if (res[j] < 0)
                res[j] = (int32_t)c->last[q];
        c->cum[q] = 0;
    }
    return 0;
}

int nt__sk_multinomial(const nt__rec *r)
{
    const nt_tensor *pr = r->in[0], *o = r->out[0];
    int nd = pr->ndim;
    int64_t C = pr->shape[nd - 1], N = nd == 2 ? pr->shape[0] : 1, n = r->p.i[0];
    if (N == 0)
        return 0;
    nt_dtype pdt = (nt_dtype)pr->dtype;
    sk_k s;
    int rc = sk_begin(&s, "multinomial");
    if (rc)
        return rc;
    const char *pb = sk_contig_of(&s, pr);
    char *ob = nt__tensor_data(o);
    nt_tile *tx[2] = {sk_tile(&s, "mn.p", pdt, 128, MN_CH), sk_tile(&s, "mn.p", pdt, 128, MN_CH)};
    nt_tile *tr = sk_tile(&s, "mn.draws", NT_I32, 128, MN_DB);
    mn_ctx *c = g_try_malloc0(sizeof *c);
    if (!c) {
        sk_end(&s);
        return nt__kerr(NT_EHOSTMEM, "out of host memory for the multinomial state");
    }
    c->s = &s;
    c->nd = nd;
    c->C = C;
    c->n = n;
    c->key = nt__rng_key(r->p.seed);
    int kk = 0;
    for (int64_t r0 = 0; pb && r0 < N && !nt_sim_kernel_error(s.k); r0 += 128) {
        int np = (int)(N - r0 < 128 ? N - r0 : 128);
        c->row0 = r0;
        for (int q = 0; q < 128; q++)
            c->total[q] = 0, c->cum[q] = 0, c->bad[q] = -1, c->last[q] = -1, c->badv[q] = 0;
        /* pass 1 */
        for (int64_t c0 = 0; c0 < C; c0 += MN_CH, kk++) {
            int64_t w = C - c0 < MN_CH ? C - c0 : MN_CH;
            nt_ap xs = nt_tile_slice(tx[kk & 1], 0, np, 0, w);
            nt_ap hx = nt_hbm_ap(pb, pdt, r0 * C + c0, np, C, w);
            const nt_ap *srcs[1] = {&xs};
            c->c0 = c0;
            if (nt_isa_dma_copy(s.k, &xs, &hx, sk_qin(&s)) ||
                nt_isa_gpsimd_custom(s.k, "multinomial.sum", NULL, srcs, 1, 2.0, mn_sum, c))
                break;
        }
        nt_ap all = nt_tile_slice(tx[0], 0, np, 0, 1);
        const nt_ap *chk[1] = {&all};
        if (nt_sim_kernel_error(s.k) ||
            nt_isa_gpsimd_custom(s.k, "multinomial.check", NULL, chk, 1, 1.0, mn_check, c))
            break;
        /* pass 2 */
        for (int64_t j0 = 0; j0 < n && !nt_sim_kernel_error(s.k); j0 += MN_DB) {
            c->j0 = j0;
            c->db = n - j0 < MN_DB ? n - j0 : MN_DB;
            nt_ap res = nt_tile_slice(tr, 0, np, 0, c->db);
            if (nt_isa_memset(s.k, &res, -1.0, NT_ENGINE_VECTOR))
                break;
            for (int64_t c0 = 0; c0 < C; c0 += MN_CH, kk++) {
                int64_t w = C - c0 < MN_CH ? C - c0 : MN_CH;
                nt_ap xs = nt_tile_slice(tx[kk & 1], 0, np, 0, w);
                nt_ap hx = nt_hbm_ap(pb, pdt, r0 * C + c0, np, C, w);
                const nt_ap *srcs[2] = {&xs, &res};
                c->c0 = c0;
                if (nt_isa_dma_copy(s.k, &xs, &hx, sk_qin(&s)) ||
                    nt_isa_gpsimd_custom(s.k, "multinomial", &res, srcs, 2, 4.0, mn_draw, c))
                    break;
            }
            const nt_ap *srcs[1] = {&res};
            nt_ap ho = nt_hbm_ap(ob, NT_I32, r0 * n + j0, np, n, c->db);
            if (nt_sim_kernel_error(s.k) ||
                nt_isa_gpsimd_custom(s.k, "multinomial.fin", &res, srcs, 1, 1.0, mn_fin, c) ||
                nt_isa_dma_copy(s.k, &ho, &res, sk_qout(&s)))
                break;
        }
    }
    g_free(c);
    return sk_end(&s);
}
