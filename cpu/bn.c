/* cpu/bn.c - training batch norm in one kernel each way: batch_norm_fwd and
 * batch_norm_bwd (dispatcher/api_norm.c issues them; docs/ops.md,
 * "Normalisation over channels", is the contract).
 *
 * x is contiguous f32 [N, C, S]; channel c's row is its M = N S values
 * x[n, c, s] in (n, s) row-major order, the order every sum below takes
 * (the canonical one of core/reduce.h, block by block: acc += the block's
 * lane-and-fold partial).  Per channel, in f32, each step rounded:
 *   forward   mean = sum(x) / (float)M; d = x - mean; ss = sum(d * d);
 *             r = rsqrt(ss / (float)M + eps); y = d * r, then * w[c], then
 *             + b[c] (when given); stats[0][c] = mean, stats[1][c] = ss
 *   backward  r as above from stats; xh = (x - mean) * r; gx = g * w[c]
 *             (g without w); db = sum(g); dw = sum(g * xh);
 *             m1 = sum(gx) / (float)M; m2 = sum(gx * xh) / (float)M;
 *             dx = r * ((gx - m1) - xh * m2); dwb[0][c] = dw, dwb[1][c] = db
 * which are the steps, and so the bits, of the composite it replaces
 * (layer_norm's row kernel and backward over the rows [C, M], then the
 * affine ops).  A channel's row is gathered into a buffer once (one read
 * of x and g from memory) and each sum taken a 2048-element block at a
 * time, as its block is written; channels are split into blocks that the
 * calling thread and the pool's helper run: which thread runs a channel
 * never changes its bits. */
#include "cpu/cpu.h"

#include <string.h>

#include "core/ewise.h"
#include "core/gemm.h"
#include "core/reduce.h"

typedef struct bnk {
    const float *x, *g, *w, *b, *st;
    float *y, *out2; /* y or dx; stats or dwb */
    int64_t N, C, S, M, per;
    float eps;
    volatile AO_t fail;
} bnk;

/* Row elements j0 .. j0+m of channel c (row j = n S + s) into T, and T
 * back to y. */
static void gather(float *T, const float *x, const bnk *k, int64_t c, int64_t j0, int64_t m)
{
    int64_t S = k->S;
    while (m > 0) {
        int64_t n = j0 / S, s = j0 % S, len = S - s < m ? S - s : m;
        memcpy(T, x + (n * k->C + c) * S + s, (size_t)len * sizeof(float));
        T += len, j0 += len, m -= len;
    }
}

static void scatter(float *y, const float *T, const bnk *k, int64_t c, int64_t j0, int64_t m)
{
    int64_t S = k->S;
    while (m > 0) {
        int64_t n = j0 / S, s = j0 % S, len = S - s < m ? S - s : m;
        memcpy(y + (n * k->C + c) * S + s, T, (size_t)len * sizeof(float));
        T += len, j0 += len, m -= len;
    }
}

/* the canonical block partial of t[i] * u[i] (B: scratch) */
static float block_dot(const float *restrict t, const float *restrict u, int64_t m,
                       float *restrict B)
{
    for (int64_t i = 0; i < m; i++)
        B[i] = t[i] * u[i];
    return nt__red_block_sum_f32(B, m, 1);
}

static float rstd(const bnk *k, float ss)
{
    return nt__ew_rsqrt(ss / (float)k->M + k->eps);
}

/* Each sum is acc = +0, acc += the partial of each 2048-element block in
 * order: nt__red_sum_f32, taken a block at a time while the block is in L1
 * (the row is gathered into T once; three passes over it in all). */
static void fwd_channel(const bnk *k, int64_t c, float *T, float *B)
{
    int64_t M = k->M;
    float acc = 0.0f;
    for (int64_t b0 = 0; b0 < M; b0 += NT_RED_BLOCK) {
        int64_t m = M - b0 < NT_RED_BLOCK ? M - b0 : NT_RED_BLOCK;
        gather(T + b0, k->x, k, c, b0, m);
        acc += nt__red_block_sum_f32(T + b0, m, 1);
    }
    float mean = acc / (float)M, ss = 0.0f;
    for (int64_t b0 = 0; b0 < M; b0 += NT_RED_BLOCK) {
        int64_t m = M - b0 < NT_RED_BLOCK ? M - b0 : NT_RED_BLOCK;
        float *restrict t = T + b0;
        for (int64_t i = 0; i < m; i++)
            t[i] = t[i] - mean;
        ss += block_dot(t, t, m, B);
    }
    float r = rstd(k, ss), wc = k->w ? k->w[c] : 0.0f, bc = k->b ? k->b[c] : 0.0f;
    for (int64_t b0 = 0; b0 < M; b0 += NT_RED_BLOCK) {
        int64_t m = M - b0 < NT_RED_BLOCK ? M - b0 : NT_RED_BLOCK;
        const float *restrict t = T + b0;
        float *restrict o = B;
        for (int64_t i = 0; i < m; i++)
            o[i] = t[i] * r;
        if (k->w)
            for (int64_t i = 0; i < m; i++)
                o[i] = o[i] * wc;
        if (k->b)
            for (int64_t i = 0; i < m; i++)
                o[i] = o[i] + bc;
        for (int64_t i = 0; i < m; i++)
            o[i] = nt__canon(o[i]); /* stored NaNs are canonical (core/dtype.h) */
        scatter(k->y, B, k, c, b0, m);
    }
    k->out2[c] = nt__canon(mean), k->out2[k->C + c] = nt__canon(ss);
}

/* Pass 1: xh into T, g (gx with w) into U, the four sums block by block;
 * pass 2: dx. */
static void bwd_channel(const bnk *k, int64_t c, float *T, float *U, float *B)
{
    int64_t M = k->M;
    float mean = k->st[c], r = rstd(k, k->st[k->C + c]), wc = k->w ? k->w[c] : 0.0f;
    float db = 0.0f, dw = 0.0f, s1 = 0.0f, s2 = 0.0f;
    for (int64_t b0 = 0; b0 < M; b0 += NT_RED_BLOCK) {
        int64_t m = M - b0 < NT_RED_BLOCK ? M - b0 : NT_RED_BLOCK;
        float *restrict t = T + b0, *restrict u = U + b0;
        gather(t, k->x, k, c, b0, m);
        gather(u, k->g, k, c, b0, m);
        for (int64_t i = 0; i < m; i++)
            t[i] = (t[i] - mean) * r;
        db += nt__red_block_sum_f32(u, m, 1);
        dw += block_dot(u, t, m, B);
        if (k->w) {
            for (int64_t i = 0; i < m; i++)
                u[i] = u[i] * wc;
            s1 += nt__red_block_sum_f32(u, m, 1);
            s2 += block_dot(u, t, m, B);
        }
    }
    if (!k->w)
        s1 = db, s2 = dw;
    float m1 = s1 / (float)M, m2 = s2 / (float)M;
    for (int64_t b0 = 0; b0 < M; b0 += NT_RED_BLOCK) {
        int64_t m = M - b0 < NT_RED_BLOCK ? M - b0 : NT_RED_BLOCK;
        const float *restrict t = T + b0, *restrict u = U + b0;
        float *restrict o = B;
        for (int64_t i = 0; i < m; i++)
            o[i] = nt__canon(r * ((u[i] - m1) - t[i] * m2));
        scatter(k->y, B, k, c, b0, m);
    }
    k->out2[c] = nt__canon(dw), k->out2[k->C + c] = nt__canon(db);
}

static void bn_block(void *arg, int blk)
{
    bnk *k = arg;
    size_t M = (size_t)k->M;
    float *buf = g_try_malloc((2 * M + NT_RED_BLOCK) * sizeof(float));
    if (!buf) {
        AO_store(&k->fail, 1);
        return;
    }
    int64_t c0 = (int64_t)blk * k->per, c1 = c0 + k->per < k->C ? c0 + k->per : k->C;
    for (int64_t c = c0; c < c1; c++) {
        if (k->g)
            bwd_channel(k, c, buf, buf + M, buf + 2 * M);
        else
            fwd_channel(k, c, buf, buf + 2 * M);
    }
    g_free(buf);
}

/* Shapes from x [N, C, *], then the channel blocks. */
static int run_bn(bnk *k, const nt__rec *r, const nt_tensor *x)
{
    k->N = x->shape[0], k->C = x->shape[1];
    k->S = nt__numel(x->ndim - 2, x->shape + 2);
    k->M = k->N * k->S;
    k->eps = (float)r->p.f[0];
    if (k->C == 0)
        return 0;
    int nb = k->C < 16 ? (int)k->C : 16;
    k->per = (k->C + nb - 1) / nb;
    nb = (int)((k->C + k->per - 1) / k->per);
    nt__par_blocks(nb, bn_block, k, nb >= 2 && k->M * k->C >= 16384);
    if (AO_load(&k->fail))
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a %lld-float channel buffer",
                        (long long)(2 * k->M));
    return 0;
}

int nt__cpu_batch_norm_fwd(const nt__rec *r)
{
    const nt_tensor *x = r->in[0];
    bnk k = {.x = nt__tensor_data(x), .y = nt__tensor_data(r->out[0]),
             .out2 = nt__tensor_data(r->out[1])};
    float *wb = NULL;
    int64_t C = x->shape[1];
    if (r->in[1] || r->in[2]) {
        wb = g_try_malloc((size_t)(2 * (C > 0 ? C : 1)) * sizeof(float));
        if (!wb)
            return nt__kerr(NT_EHOSTMEM, "out of host memory for the affine parameters");
        if (r->in[1])
            nt__gather_f32(wb, r->in[1]), k.w = wb;
        if (r->in[2])
            nt__gather_f32(wb + C, r->in[2]), k.b = wb + C;
    }
    int rc = run_bn(&k, r, x);
    g_free(wb);
    return rc;
}

int nt__cpu_batch_norm_bwd(const nt__rec *r)
{
    const nt_tensor *x = r->in[1];
    bnk k = {.g = nt__tensor_data(r->in[0]), .x = nt__tensor_data(x),
             .st = nt__tensor_data(r->in[2]), .y = nt__tensor_data(r->out[0]),
             .out2 = nt__tensor_data(r->out[1])};
    float *wv = NULL;
    if (r->in[3]) {
        wv = g_try_malloc((size_t)(x->shape[1] > 0 ? x->shape[1] : 1) * sizeof(float));
        if (!wv)
            return nt__kerr(NT_EHOSTMEM, "out of host memory for the weights");
        nt__gather_f32(wv, r->in[3]);
        k.w = wv;
    }
    int rc = run_bn(&k, r, x);
    g_free(wv);
    return rc;
}
