/* bench/moe.c - an expert-parallel MoE MLP on simulated cores
 * (docs/parallel.md, "Mixture of experts"): nt_moe_mlp over `tokens`
 * tokens in all (each of ep members holds tokens / ep), E experts of
 * D -> H -> D, top k, forward and backward, at ep = 1, 2, 4 and 8 on the
 * NeuronCores of one trn1 instance (the default topology).  A step's
 * simulated time is how far the latest clock of the group's cores moved;
 * the host time is the wall time of the step on this machine.
 *
 *   build/bench/moe [--tokens N] [--width D] [--hidden H] [--experts E] [--k K]
 *                   [--dtype bf16|f32] [--capacity-factor F]
 *
 * --capacity-factor: each member's receive buffer holds F times its
 * average rows (tokens k / ep); 0: every row the group could send it
 * (tokens k, nt_moe_opts' default), which does not shrink with ep.
 * Defaults: 1024 tokens, D 512, H 1024, 8 experts, k 2, bf16, F 2. */
#define BENCH_NAME "bench/moe"
#include "bench.h"

static int64_t TOK = 1024, DM = 512, HM = 1024;
static int EX = 8, KX = 2;
static double CF = 2.0; /* capacity factor: rows a member can receive / its average */
static nt_dtype DT = NT_BF16;

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

static nt_tensor *param(int dev, int nd, const int64_t *sh, uint64_t seed, double scale)
{
    bench_check(nt_device_set(dev), "nt_device_set");
    nt_tensor *t = nt_cast(nt_mul_scalar(nt_randn(NT_F32, nd, sh, seed), scale), DT);
    if (!t || nt_set_requires_grad(t, true))
        bench_fail("param");
    return nt_keep(t);
}

typedef struct {
    int ep;
    nt_comm *c;
    nt_tensor *x[8], *wg[8], *w1[8], *w2[8];
} layer;

static void layer_init(layer *l, int ep)
{
    int devs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    l->ep = ep;
    l->c = nt_comm_create(devs, ep);
    if (!l->c)
        bench_fail("nt_comm_create");
    int64_t el = EX / ep;
    for (int r = 0; r < ep; r++) {
        l->x[r] = param(r, 2, (int64_t[]){TOK / ep, DM}, 1 + (uint64_t)r, 1.0);
        l->wg[r] = param(r, 2, (int64_t[]){EX, DM}, 5, 0.02);
        l->w1[r] = param(r, 3, (int64_t[]){el, DM, HM}, 10 + (uint64_t)r, 0.02);
        l->w2[r] = param(r, 3, (int64_t[]){el, HM, DM}, 20 + (uint64_t)r, 0.02);
    }
    bench_check(nt_device_set(0), "nt_device_set");
}

static void layer_step(layer *l)
{
    nt_scope *s = nt_scope_begin();
    int64_t avg = TOK * KX / l->ep, cap = (int64_t)(CF * (double)avg);
    nt_moe_opts o = {KX, NT_MOE_SOFTMAX, 8, CF > 0 && cap < avg * l->ep ? cap : 0};
    nt_tensor *y[8], *aux[8], *m[8], *Z[8];
    bench_check(nt_moe_mlp(l->c, l->x, l->wg, l->w1, l->w2, &o, y, aux, NULL), "nt_moe_mlp");
    for (int r = 0; r < l->ep; r++) {
        bench_check(nt_device_set(r), "nt_device_set");
        m[r] = nt_mean(nt_reshape(y[r], 1, (int64_t[]){-1}), 0, false);
    }
    bench_check(nt_device_set(0), "nt_device_set");
    bench_check(nt_tp_reduce(l->c, m, Z), "nt_tp_reduce");
    for (int r = 0; r < l->ep; r++) {
        bench_check(nt_device_set(r), "nt_device_set");
        Z[r] = nt_add(Z[r], nt_mul_scalar(aux[r], 0.01));
    }
    bench_check(nt_device_set(0), "nt_device_set");
    bench_check(nt_backward(nt_tp_join(l->c, Z)), "nt_backward");
    nt_scope_end(s);
    nt_tensor **ps[] = {l->x, l->wg, l->w1, l->w2};
    for (int r = 0; r < l->ep; r++)
        for (int j = 0; j < 4; j++)
            bench_check(nt_zero_grad(ps[j][r]), "nt_zero_grad");
}

static void measure(int ep, double *sim_ns, double *host_ns)
{
    layer l;
    layer_init(&l, ep);
    layer_step(&l); /* warm-up */
    bench_check(nt_sync(), "nt_sync");
    double c0 = max_clock(ep), w0 = bench_now_ns();
    layer_step(&l);
    bench_check(nt_sync(), "nt_sync");
    *sim_ns = max_clock(ep) - c0;
    *host_ns = bench_now_ns() - w0;
    nt_tensor **ps[] = {l.x, l.wg, l.w1, l.w2};
    for (int r = 0; r < ep; r++)
        for (int j = 0; j < 4; j++)
            nt_release(ps[j][r]);
    nt_comm_destroy(l.c);
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens"))
            TOK = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--width"))
            DM = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden"))
            HM = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--experts"))
            EX = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k"))
            KX = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--capacity-factor"))
            CF = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            DT = strcmp(argv[i + 1], "f32") ? NT_BF16 : NT_F32;
    }
    if (TOK % 64 || EX % 8)
        bench_fail("--tokens must be a multiple of 64 and --experts of 8");
    setenv("NT_SIM_CORES", "8", 0);
    setenv("NT_BACKEND", "sim", 0);
    bench_check(nt_init(), "nt_init");
    printf("MoE MLP: %lld tokens, %d experts of %lld -> %lld -> %lld, top %d, %s, capacity "
           "factor %g, topology %s\n", (long long)TOK, EX, (long long)DM, (long long)HM,
           (long long)DM, KX, nt_dtype_name(DT), CF, getenv("NT_SIM_TOPOLOGY") ? getenv("NT_SIM_TOPOLOGY")
                                                        : "trn1.32xlarge");
    printf("%-4s %12s %10s %12s\n", "ep", "sim ms/step", "vs ep 1", "host ms");
    double base = 0;
    for (int ep = 1; ep <= 8; ep *= 2) {
        double sim, host;
        measure(ep, &sim, &host);
        if (ep == 1)
            base = sim;
        printf("%-4d %12.3f %9.2fx %12.1f\n", ep, sim * 1e-6, base / sim, host * 1e-6);
        fflush(stdout);
    }
    nt_shutdown();
    return 0;
}
