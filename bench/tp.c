/* bench/tp.c - tensor parallelism on simulated cores (docs/parallel.md):
 * one MLP block D -> 4D -> D (column-parallel, GELU, row-parallel) over
 * `tokens` tokens, forward and backward, at tp = 1, 2 and 4 on the
 * NeuronCores of one trn1 instance (NT_SIM_TOPOLOGY=trn1.32xlarge, the
 * default; NT_SIM_TOPOLOGY=trn2.48xlarge NT_SIM_TARGET=trn2 for Trainium2's).  A step's simulated time is how far the latest clock of the
 * group's cores moved; the communication is the cost model's time of the
 * step's two all-reduces (f32 [tokens, D]: the row-parallel output, the
 * column-parallel input gradient).  Also the plain block (nt_linear, no
 * K-blocks) on one core: what the fixed reduction tree costs.
 *
 *   build/bench/tp [--tokens N] [--width D] [--blocks B] [--dtype bf16|f32] [--detail]
 *                  [--tp N]
 *
 * --detail: each core's kernel time in the step (the rest is waiting).
 * --tp N: that configuration alone (0: the plain block), for a trace.
 *
 * Defaults: 2048 tokens, width 4096 (hidden 16384), 4 blocks, bf16. */
#define BENCH_NAME "bench/tp"
#include "bench.h"

static int64_t TOK = 2048, DM = 4096;
static int BLOCKS = 4;
static nt_dtype DT = NT_BF16;

static bool DETAIL;
static int ONLY = -1; /* --tp N: that configuration alone (0: plain) */

/* Each core's kernel time (sum of its kernels' durations). */
static void kernel_ns(int n, double *k)
{
    for (int i = 0; i < n; i++) {
        nt_sim_stats st;
        bench_check(nt_device_stats_get(i, &st), "nt_device_stats_get");
        k[i] = st.sim_ns;
    }
}

static double max_clock(int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) {
        nt_sim_stats st;
        bench_check(nt_device_stats_get(i, &st), "nt_device_stats_get");
        if (st.clock_ns > m)
            m = st.clock_ns;
    }
    return m;
}

static nt_tensor *param(int dev, int64_t r, int64_t c, uint64_t seed)
{
    bench_check(nt_device_set(dev), "nt_device_set");
    int64_t sh[2] = {r, c};
    nt_tensor *t = nt_cast(nt_mul_scalar(nt_randn(NT_F32, c ? 2 : 1, sh, seed), 0.02), DT);
    if (!t || nt_set_requires_grad(t, true))
        bench_fail("param");
    return nt_keep(t);
}

typedef struct {
    int tp; /* 0: the plain block on one core */
    nt_comm *c;
    nt_tensor *x[4], *w1[4], *b1[4], *w2[4], *b2[4];
} block;

static void block_init(block *b, int tp)
{
    int n = tp ? tp : 1, devs[4] = {0, 1, 2, 3};
    b->tp = tp;
    b->c = tp ? nt_comm_create(devs, tp) : NULL;
    if (tp && !b->c)
        bench_fail("nt_comm_create");
    int64_t H = 4 * DM;
    for (int r = 0; r < n; r++) {
        b->x[r] = param(r, TOK, DM, 1);
        b->w1[r] = param(r, H / n, DM, 10 + r);
        b->b1[r] = param(r, H / n, 0, 20 + r);
        b->w2[r] = param(r, DM, H / n, 30 + r);
        b->b2[r] = param(r, DM, 0, 40);
    }
    bench_check(nt_device_set(0), "nt_device_set");
}

static void block_step(block *b)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *h[4], *y[4], *l[4];
    if (!b->tp) {
        nt_tensor *v = nt_linear(nt_gelu(nt_linear(b->x[0], b->w1[0], b->b1[0])), b->w2[0],
                                 b->b2[0]);
        bench_check(nt_backward(nt_mean(nt_reshape(v, 1, (int64_t[]){-1}), 0, false)),
                    "nt_backward");
    } else {
        bench_check(nt_tp_column_linear(b->c, b->x, b->w1, b->b1, BLOCKS, h), "column");
        for (int r = 0; r < b->tp; r++) {
            bench_check(nt_device_set(r), "nt_device_set");
            h[r] = nt_gelu(h[r]);
        }
        bench_check(nt_tp_row_linear(b->c, h, b->w2, b->b2, BLOCKS, y), "row");
        for (int r = 0; r < b->tp; r++) {
            bench_check(nt_device_set(r), "nt_device_set");
            l[r] = nt_mean(nt_reshape(y[r], 1, (int64_t[]){-1}), 0, false);
        }
        bench_check(nt_device_set(0), "nt_device_set");
        bench_check(nt_backward(nt_tp_join(b->c, l)), "nt_backward");
    }
    nt_scope_end(s);
    int n = b->tp ? b->tp : 1;
    nt_tensor **ps[] = {b->x, b->w1, b->b1, b->w2, b->b2};
    for (int r = 0; r < n; r++)
        for (int j = 0; j < 5; j++)
            bench_check(nt_zero_grad(ps[j][r]), "nt_zero_grad");
}

/* Simulated and host time of one step (after a warm-up step). */
static void measure(int tp, double *sim_ns, double *host_ns)
{
    block b;
    block_init(&b, tp);
    int n = tp ? tp : 1;
    block_step(&b);
    bench_check(nt_sync(), "nt_sync");
    double k0[4], k1[4];
    kernel_ns(n, k0);
    double c0 = max_clock(n), w0 = bench_now_ns();
    block_step(&b);
    bench_check(nt_sync(), "nt_sync");
    *sim_ns = max_clock(n) - c0;
    *host_ns = bench_now_ns() - w0;
    kernel_ns(n, k1);
    if (DETAIL)
        for (int r = 0; r < n; r++)
            printf("  tp %d core %d: kernels %.3f ms of the step's %.3f ms\n", tp, r,
                   (k1[r] - k0[r]) * 1e-6, *sim_ns * 1e-6);
    nt_tensor **ps[] = {b.x, b.w1, b.b1, b.w2, b.b2};
    for (int r = 0; r < n; r++)
        for (int j = 0; j < 5; j++)
            nt_release(ps[j][r]);
    nt_comm_destroy(b.c);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        DETAIL |= !strcmp(argv[i], "--detail");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens"))
            TOK = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--width"))
            DM = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--blocks"))
            BLOCKS = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tp"))
            ONLY = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            DT = strcmp(argv[i + 1], "f32") ? NT_BF16 : NT_F32;
    }
    setenv("NT_SIM_CORES", "4", 0);
    setenv("NT_BACKEND", "sim", 0);
    bench_check(nt_init(), "nt_init");
    printf("MLP block %lld -> %lld -> %lld, %lld tokens, %s, %d K-blocks, topology %s, core %s\n",
           (long long)DM, (long long)(4 * DM), (long long)DM, (long long)TOK,
           nt_dtype_name(DT), BLOCKS, getenv("NT_SIM_TOPOLOGY") ? getenv("NT_SIM_TOPOLOGY")
                                                               : "trn1.32xlarge",
           getenv("NT_SIM_TARGET") ? getenv("NT_SIM_TARGET") : "trn1");
    double plain_sim = 0, plain_host = 0;
    if (ONLY <= 0)
        measure(0, &plain_sim, &plain_host);
    printf("plain (nt_linear, 1 core): sim %.3f ms/step, host %.1f ms/step\n", plain_sim * 1e-6,
           plain_host * 1e-6);
    printf("%-4s %12s %10s %10s %12s %12s %8s\n", "tp", "sim ms/step", "vs tp 1", "vs plain",
           "comm ms", "host ms", "target");
    double base = 0;
    static const char *const target[] = {"", "", ">= 1.8x", "", ">= 3.2x"};
    for (int tp = 1; tp <= 4; tp *= 2) {
        double sim, host, f = 0, sch = 0;
        if (ONLY >= 0 && tp != ONLY)
            continue;
        measure(tp, &sim, &host);
        if (tp == 1)
            base = sim;
        bench_check(nt_collective_cost(NT_COLL_ALL_REDUCE, tp, (double)TOK * DM * 4, &f, &sch),
                    "nt_collective_cost");
        printf("%-4d %12.3f %9.2fx %9.2fx %12.3f %12.1f %8s\n", tp, sim * 1e-6, base / sim,
               plain_sim / sim, 2 * f * 1e-6, host * 1e-6, target[tp]);
        fflush(stdout);
    }
    nt_shutdown();
    return 0;
}
