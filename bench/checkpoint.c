/* bench/checkpoint.c - what gradient checkpointing (nt_checkpoint) saves and
 * costs: a few AdamW steps of a character model of N pre-LN transformer
 * blocks, once with every block run directly and once with each block under
 * nt_checkpoint, in the same process.  Prints per configuration the peak
 * device bytes (reserved, and held by live tensors) over the steps, the
 * simulated NeuronCore time per step and the host time per step, then the
 * ratios, and checks that both runs give the same losses bit for bit.
 *
 * Usage: bench/checkpoint [layers] [batch] [context] [width] [steps]
 * (defaults 4 8 128 128 3).  Runs in deterministic mode unless NT_MODE is
 * set, so the peaks are those of the program, not of a host running ahead. */
#define BENCH_NAME "bench/checkpoint"
#include "bench.h"

#include <string.h>

enum { V = 64, HEADS = 4, NPB = 12 };

typedef struct cfg {
    int L;
    int64_t B, T, D;
} cfg;

typedef struct block {
    const cfg *c;
    nt_tensor *p[NPB]; /* ln1 w b, wqkv, bqkv, wo, bo, ln2 w b, w1, b1, w2, b2 */
    nt_tensor *mask;   /* u8 [T, T], 1 above the diagonal */
} block;

static nt_tensor *param(int nd, int64_t a, int64_t b, double scale, double fill, uint64_t seed)
{
    int64_t shape[2] = {a, b};
    nt_tensor *t;
    if (scale != 0) {
        nt_tensor *r = nt_randn(NT_F32, nd, shape, seed);
        t = nt_mul_scalar(r, scale);
        nt_release(r);
    } else {
        t = nt_full(NT_F32, nd, shape, fill);
    }
    if (!t || nt_set_requires_grad(t, true))
        bench_fail("init");
    return t;
}

/* The heads of slice [off, off + D) of qkv [B, T, 3D]: [B, H, T, D/H]. */
static nt_tensor *heads(const cfg *c, nt_tensor *qkv, int64_t off)
{
    nt_tensor *s = nt_slice(qkv, 2, off, off + c->D, 1);
    nt_tensor *r = nt_reshape(s, 4, (int64_t[]){c->B, c->T, HEADS, c->D / HEADS});
    return nt_permute(r, (int[]){0, 2, 1, 3});
}

/* x + attn(ln1(x)), then + mlp(ln2(.)): the block of bench/models.h, with
 * the causal mask applied by nt_masked_fill. */
static int block_fn(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    block *bl = ctx;
    const cfg *c = bl->c;
    nt_tensor **p = bl->p, *x = in[0];
    (void)n_in, (void)n_out;
    nt_tensor *h = nt_layer_norm(x, p[0], p[1], 1e-5);
    nt_tensor *qkv = nt_linear(h, p[2], p[3]);
    nt_tensor *q = heads(c, qkv, 0), *k = heads(c, qkv, c->D), *v = heads(c, qkv, 2 * c->D);
    nt_tensor *att = nt_mul_scalar(nt_matmul(q, nt_transpose(k, 2, 3)),
                                   1 / sqrt((double)(c->D / HEADS)));
    att = nt_softmax(nt_masked_fill(att, bl->mask, -INFINITY), 3);
    nt_tensor *y = nt_permute(nt_matmul(att, v), (int[]){0, 2, 1, 3});
    y = nt_reshape(y, 3, (int64_t[]){c->B, c->T, c->D});
    x = nt_add(x, nt_linear(y, p[4], p[5]));
    h = nt_layer_norm(x, p[6], p[7], 1e-5);
    h = nt_linear(nt_gelu(nt_linear(h, p[8], p[9])), p[10], p[11]);
    out[0] = nt_add(x, h);
    return out[0] ? 0 : nt_last_error();
}

typedef struct result {
    double peak, live_peak, sim_ms, host_ms;
    float loss[16];
} result;

static void run(const cfg *c, bool ckpt, int steps, result *res)
{
    const double s = 0.02, so = 0.02 / sqrt(2.0 * c->L);
    int64_t D = c->D;
    nt_tensor *wte = param(2, V, D, s, 0, 1), *wpe = param(2, c->T, D, s, 0, 2);
    nt_tensor *lnfw = param(1, D, 0, 0, 1, 3), *lnfb = param(1, D, 0, 0, 0, 4);
    nt_tensor *whead = param(2, V, D, s, 0, 5);
    block *bl = calloc((size_t)c->L, sizeof *bl);
    int np = 5 + NPB * c->L;
    nt_tensor **all = calloc((size_t)np, sizeof *all);
    if (!bl || !all)
        bench_fail("malloc");
    all[0] = wte, all[1] = wpe, all[2] = lnfw, all[3] = lnfb, all[4] = whead;
    nt_tensor *ones = nt_ones(NT_U8, 2, (int64_t[]){c->T, c->T});
    nt_tensor *mask = nt_keep(nt_triu(ones, 1));
    nt_release(ones);
    for (int l = 0; l < c->L; l++) {
        uint64_t sd = 100 + 20 * (uint64_t)l;
        bl[l].c = c;
        bl[l].mask = mask;
        nt_tensor **p = bl[l].p;
        p[0] = param(1, D, 0, 0, 1, sd), p[1] = param(1, D, 0, 0, 0, sd + 1);
        p[2] = param(2, 3 * D, D, s, 0, sd + 2), p[3] = param(1, 3 * D, 0, 0, 0, sd + 3);
        p[4] = param(2, D, D, so, 0, sd + 4), p[5] = param(1, D, 0, 0, 0, sd + 5);
        p[6] = param(1, D, 0, 0, 1, sd + 6), p[7] = param(1, D, 0, 0, 0, sd + 7);
        p[8] = param(2, 4 * D, D, s, 0, sd + 8), p[9] = param(1, 4 * D, 0, 0, 0, sd + 9);
        p[10] = param(2, D, 4 * D, so, 0, sd + 10), p[11] = param(1, D, 0, 0, 0, sd + 11);
        memcpy(all + 5 + NPB * l, p, sizeof bl[l].p);
    }
    /* a fixed pseudo-random walk over the characters: learnable */
    int64_t n = c->B * c->T;
    int32_t *tok = malloc(sizeof *tok * (size_t)(n + c->B)), *pos = malloc(sizeof *pos * (size_t)c->T);
    int32_t *in = malloc(sizeof *in * (size_t)n), *tg = malloc(sizeof *tg * (size_t)n);
    if (!tok || !pos || !in || !tg)
        bench_fail("malloc");
    uint64_t r = 12345;
    for (int64_t b = 0; b < c->B; b++) {
        int32_t ch = (int32_t)(b % V);
        for (int64_t t = 0; t <= c->T; t++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ch = (int32_t)((ch + 1 + (int64_t)((r >> 60) & 1)) % V);
            tok[b * (c->T + 1) + t] = ch;
        }
        for (int64_t t = 0; t < c->T; t++) {
            in[b * c->T + t] = tok[b * (c->T + 1) + t];
            tg[b * c->T + t] = tok[b * (c->T + 1) + t + 1];
        }
    }
    for (int64_t t = 0; t < c->T; t++)
        pos[t] = (int32_t)t;
    nt_tensor *idx = nt_from_host(in, NT_I32, 2, (int64_t[]){c->B, c->T});
    nt_tensor *tgt = nt_from_host(tg, NT_I32, 1, (int64_t[]){n});
    nt_tensor *tpos = nt_from_host(pos, NT_I32, 1, (int64_t[]){c->T});
    free(tok), free(pos), free(in), free(tg);
    nt_optim *opt = nt_optim_adamw(all, np, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    if (!opt)
        bench_fail("nt_optim_adamw");
    bench_check(nt_sync(), "init");
    double host = 0, sim = 0, peak = 0, live = 0;
    for (int st = 0; st < steps; st++) {
        bench_check(nt_sync(), "sync");
        nt_stats_reset();
        double t0 = bench_now_ns();
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_add(nt_embedding(wte, idx), nt_embedding(wpe, tpos));
        for (int l = 0; l < c->L; l++) {
            nt_tensor *y;
            if (ckpt)
                bench_check(nt_checkpoint(block_fn, &bl[l], &x, 1, &y, 1), "nt_checkpoint");
            else
                bench_check(block_fn(&bl[l], &x, 1, &y, 1), "block");
            x = y;
        }
        nt_tensor *h = nt_layer_norm(x, lnfw, lnfb, 1e-5);
        nt_tensor *logits = nt_reshape(nt_linear(h, whead, NULL), 2, (int64_t[]){n, V});
        nt_tensor *loss = nt_cross_entropy(logits, tgt);
        if (!loss)
            bench_fail("forward");
        bench_check(nt_backward(loss), "nt_backward");
        bench_check(nt_optim_step(opt), "nt_optim_step");
        bench_check(nt_optim_zero_grad(opt), "nt_optim_zero_grad");
        double lv;
        bench_check(nt_item(loss, &lv), "nt_item");
        bench_check(nt_sync(), "sync");
        host += bench_now_ns() - t0;
        if (st < 16)
            res->loss[st] = (float)lv;
        nt_scope_end(sc);
        nt_stats ss;
        nt_stats_get(&ss);
        sim += (double)ss.sim_time_ns;
        if ((double)ss.device_bytes_peak > peak)
            peak = (double)ss.device_bytes_peak;
        if ((double)ss.device_bytes_live_peak > live)
            live = (double)ss.device_bytes_live_peak;
    }
    res->peak = peak;
    res->live_peak = live;
    res->sim_ms = sim / steps / 1e6;
    res->host_ms = host / steps / 1e6;
    nt_optim_destroy(opt);
    for (int i = 0; i < np; i++)
        nt_release(all[i]);
    nt_release(mask), nt_release(idx), nt_release(tgt), nt_release(tpos);
    free(bl);
    free(all);
}

int main(int argc, char **argv)
{
    cfg c = {4, 8, 128, 128};
    int steps = 3;
    if (argc > 1)
        c.L = atoi(argv[1]);
    if (argc > 2)
        c.B = atoll(argv[2]);
    if (argc > 3)
        c.T = atoll(argv[3]);
    if (argc > 4)
        c.D = atoll(argv[4]);
    if (argc > 5)
        steps = atoi(argv[5]);
    if (c.L < 1 || c.B < 1 || c.T < 1 || c.D < HEADS || c.D % HEADS || steps < 1 || steps > 16) {
        fprintf(stderr, "usage: %s [layers] [batch] [context] [width (a multiple of %d)] "
                        "[steps 1..16]\n", argv[0], HEADS);
        return 2;
    }
    if (!getenv("NT_MODE"))
        setenv("NT_MODE", "deterministic", 1);
    if (nt_init())
        bench_fail("nt_init");
    printf("%s: %d blocks, batch %lld, context %lld, width %lld, %d heads, %d AdamW steps, "
           "NT_MODE=%s\n", BENCH_NAME, c.L, (long long)c.B, (long long)c.T, (long long)c.D,
           HEADS, steps, getenv("NT_MODE"));
    result plain, ck;
    memset(&plain, 0, sizeof plain);
    memset(&ck, 0, sizeof ck);
    run(&c, false, steps, &plain);
    run(&c, true, steps, &ck);
    printf("%-14s %14s %14s %12s %12s\n", "", "peak (MiB)", "live peak", "sim ms/step",
           "host ms/step");
    const result *rs[2] = {&plain, &ck};
    const char *names[2] = {"direct", "nt_checkpoint"};
    for (int i = 0; i < 2; i++)
        printf("%-14s %14.2f %14.2f %12.3f %12.1f\n", names[i], rs[i]->peak / 1048576.0,
               rs[i]->live_peak / 1048576.0, rs[i]->sim_ms, rs[i]->host_ms);
    printf("%-14s %14.3f %14.3f %12.3f %12.3f\n", "ratio", ck.peak / plain.peak,
           ck.live_peak / plain.live_peak, ck.sim_ms / plain.sim_ms, ck.host_ms / plain.host_ms);
    bool same = memcmp(plain.loss, ck.loss, sizeof plain.loss) == 0;
    printf("losses");
    for (int i = 0; i < steps; i++)
        printf(" %.6f", (double)plain.loss[i]);
    printf("; checkpointed run %s\n", same ? "bit-identical" : "DIFFERS");
    nt_shutdown();
    return same ? 0 : 1;
}
