/* bench/rope.c - nt_rope's fused kernel against the composite a user would
 * write without it, in simulated time.
 *
 * Rotary position embedding (GPT-NeoX layout, every feature, base 10000)
 * of q [B, H, T, D] (default 16, 4, 64, 32, f32) on the sim backend:
 *   fused:     nt_rope (one kernel: the cos/sin table on GpSimd, the
 *              rotation on VectorE);
 *   composite: the angle table theta = t * inv_freq (nt_arange, nt_mul of a
 *              host inv_freq row), nt_cos and nt_sin of it, the halves of x
 *              by nt_slice, y1 = x1 c - x2 s, y2 = x2 c + x1 s by
 *              nt_mul/nt_sub/nt_add, nt_cat of the two: the same products in
 *              the same order, so the same bits (checked).
 * Each forward alone, then forward and backward of sum(y * cot), in
 * deterministic mode (one kernel per op: no fusion) and in lazy mode (the
 * composite's elementwise ops fused).  Simulated time is deterministic; the
 * repeat after a warm-up only confirms it.
 *
 * Usage: bench/rope [B H T D] */
#define BENCH_NAME "bench/rope"
#include "bench.h"

typedef struct ctx {
    int64_t s[4];
    nt_tensor *inv, *cot;
} ctx;

static nt_tensor *rope_fused(const ctx *c, nt_tensor *x)
{
    return nt_rope(x, c->s[3], false, 10000.0, 1.0, 0);
}

static nt_tensor *rope_composite(const ctx *c, nt_tensor *x)
{
    int64_t T = c->s[2], D = c->s[3], h = D / 2;
    nt_tensor *t = nt_reshape(nt_arange(NT_F32, 0, (double)T, 1), 2, (int64_t[]){T, 1});
    nt_tensor *th = nt_mul(t, c->inv); /* [T, h] */
    nt_tensor *cs = nt_cos(th), *sn = nt_sin(th);
    nt_tensor *x1 = nt_slice(x, 3, 0, h, 1), *x2 = nt_slice(x, 3, h, D, 1);
    nt_tensor *y[2] = {nt_sub(nt_mul(x1, cs), nt_mul(x2, sn)),
                       nt_add(nt_mul(x2, cs), nt_mul(x1, sn))};
    return nt_cat(y, 2, 3);
}

/* Simulated ns of f on x (its result in *out), with backward when bwd. */
static double sim_ns(nt_tensor *(*f)(const ctx *, nt_tensor *), const ctx *c, nt_tensor *x,
                     bool bwd, nt_tensor **out)
{
    bench_check(nt_sync(), "sync");
    nt_stats_reset();
    nt_tensor *y = f(c, x);
    if (!y)
        bench_fail("rope");
    if (bwd) {
        nt_zero_grad(x);
        nt_tensor *l = nt_sum(nt_reshape(nt_mul(y, c->cot), 1, (int64_t[]){-1}), 0, false);
        bench_check(nt_backward(l), "backward");
        nt_release(l);
    }
    bench_check(nt_sync(), "sync");
    nt_stats st;
    nt_stats_get(&st);
    *out = y;
    return (double)st.sim_time_ns;
}

static bool same(nt_tensor *a, nt_tensor *b, int64_t n)
{
    float *u = malloc(sizeof(float) * (size_t)n), *v = malloc(sizeof(float) * (size_t)n);
    if (!u || !v)
        bench_fail("malloc");
    bench_check(nt_to_host(a, u, sizeof(float) * (size_t)n), "to_host");
    bench_check(nt_to_host(b, v, sizeof(float) * (size_t)n), "to_host");
    bool eq = memcmp(u, v, sizeof(float) * (size_t)n) == 0;
    free(u), free(v);
    return eq;
}

int main(int argc, char **argv)
{
    ctx c = {{16, 4, 64, 32}, NULL, NULL};
    if (argc == 5)
        for (int i = 0; i < 4; i++)
            c.s[i] = atoll(argv[i + 1]);
    if (c.s[3] % 2 || c.s[0] < 1 || c.s[1] < 1 || c.s[2] < 1) {
        fprintf(stderr, "usage: bench/rope [B H T D] (D even)\n");
        return 2;
    }
    bench_check(nt_init(), "nt_init");
    int64_t h = c.s[3] / 2, n = c.s[0] * c.s[1] * c.s[2] * c.s[3];
    float *inv = malloc(sizeof(float) * (size_t)h);
    if (!inv)
        bench_fail("malloc");
    for (int64_t i = 0; i < h; i++) /* docs/ops.md: in double, rounded once */
        inv[i] = (float)pow(10000.0, -(double)(2 * i) / (double)c.s[3]);
    c.inv = nt_from_host(inv, NT_F32, 2, (int64_t[]){1, h});
    c.cot = nt_randn(NT_F32, 4, c.s, 2);
    nt_tensor *x = nt_randn(NT_F32, 4, c.s, 1);
    bench_check(nt_set_requires_grad(x, true), "requires_grad");
    printf("rotary position embedding of f32 [%lld, %lld, %lld, %lld] on the simulated "
           "NeuronCore (us simulated)\n",
           (long long)c.s[0], (long long)c.s[1], (long long)c.s[2], (long long)c.s[3]);
    bool ok = true;
    const char *modes[2] = {"deterministic", "lazy"};
    for (int m = 0; m < 2; m++) {
        bench_check(nt_config_set("NT_MODE", modes[m]), "NT_MODE");
        double t[2][2] = {{0}};
        for (int rep = 0; rep < 2; rep++) /* rep 0: the warm-up */
            for (int bwd = 0; bwd < 2; bwd++) {
                nt_tensor *yf, *yc;
                t[bwd][0] = sim_ns(rope_fused, &c, x, bwd, &yf);
                nt_tensor *gf = bwd ? nt_detach(nt_grad(x)) : NULL;
                t[bwd][1] = sim_ns(rope_composite, &c, x, bwd, &yc);
                ok &= same(yf, yc, n);
                if (bwd)
                    ok &= same(gf, nt_grad(x), n);
                nt_release(yf), nt_release(yc), nt_release(gf);
            }
        printf("  %-13s forward: fused %8.1f, composite %8.1f (%.2fx); forward + backward: "
               "fused %8.1f, composite %8.1f (%.2fx)\n",
               modes[m], t[0][0] / 1e3, t[0][1] / 1e3, t[0][1] / t[0][0], t[1][0] / 1e3,
               t[1][1] / 1e3, t[1][1] / t[1][0]);
    }
    printf("  results and gradients %s\n", ok ? "bit-identical" : "DIFFER");
    free(inv);
    nt_shutdown();
    return ok ? 0 : 1;
}
