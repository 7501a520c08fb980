/* bench/conv.c - nt_conv2d forward and backward on a ResNet layer: 3x3, 64
 * -> 64 channels, 56x56, padding 1, stride 1 (batch 8 by default, --batch
 * N), f32 and bf16.
 *
 * On the simulated NeuronCore (deterministic mode): the simulated time of
 * the forward (conv_gemm), of the input gradient (the transposed
 * convolution of g: conv_gemm over the flipped weight), of the weight
 * gradient (conv_wgrad, one product over every (n, oh, ow)), the TensorE
 * utilisation of each against the peak of its dtype (nt_sim_stats: matmul
 * FLOPs at peak / simulated time) and the HBM bytes moved.  Each is measured
 * alone: the inputs are made and synced first; the input gradient is
 * nt_conv_transpose2d of g (the very kernel the backward runs), the weight
 * gradient y.backward(g) (nt_backward_full) with only w requiring grad:
 * conv_wgrad alone (a loss sum(y * g) would add its own backward's copy).
 * On the CPU backend: the wall time of the same three, best of a few runs.
 * --quick: batch 2, one repeat (for a smoke run). */
#include <ntensor.h>
#include <ntensor/sim.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench/conv"
#include "bench.h"

#define CHECK(x)                                                                             \
    do {                                                                                     \
        if (!(x)) {                                                                          \
            fprintf(stderr, BENCH_NAME ": %s failed: %s\n", #x, nt_last_error_message());    \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

enum { C = 64, HW = 56 };
static const int64_t PAD[2] = {1, 1};

typedef struct fig {
    double ns, ideal_ns, hbm, wall_ms;
    double busy[NT_ENGINE_COUNT]; /* per engine, ns */
} fig;

static void sim_begin(nt_sim_stats *s)
{
    CHECK(nt_sync() == 0);
    nt_sim_stats_get(s);
}

static fig sim_end(const nt_sim_stats *s0)
{
    CHECK(nt_sync() == 0);
    nt_sim_stats s1;
    nt_sim_stats_get(&s1);
    fig f = {s1.sim_ns - s0->sim_ns, s1.tensor_ideal_ns - s0->tensor_ideal_ns,
             (double)(s1.hbm_read_bytes + s1.hbm_write_bytes) -
                 (double)(s0->hbm_read_bytes + s0->hbm_write_bytes),
             0, {0}};
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        f.busy[e] = s1.busy_ns[e] - s0->busy_ns[e];
    return f;
}

/* 0 forward, 1 input gradient, 2 weight gradient (forward and backward:
 * the caller subtracts the forward), 3 a mul. */
static void one(int what, nt_tensor *x, nt_tensor *w, nt_tensor *g)
{
    nt_scope *sc = nt_scope_begin();
    if (what == 0) {
        CHECK(nt_conv2d(x, w, NULL, NULL, PAD, NULL, 1));
    } else if (what == 1) {
        CHECK(nt_conv_transpose2d(g, w, NULL, NULL, PAD, NULL, 1, NULL));
    } else if (what == 2) {
        nt_tensor *wl = nt_detach(w);
        CHECK(nt_set_requires_grad(wl, true) == 0);
        nt_tensor *y = nt_conv2d(x, wl, NULL, NULL, PAD, NULL, 1);
        CHECK(y);
        CHECK(nt_sync() == 0);
        /* the forward is not part of the figure: the caller subtracts it */
        CHECK(nt_backward_full(y, g, false, false) == 0);
        CHECK(nt_grad(wl));
        nt_release(wl);
    } else {
        CHECK(nt_mul(x, g));
    }
    CHECK(nt_sync() == 0);
    nt_scope_end(sc);
}

/* The weight gradient's forward, run and synced before the timed backward. */
static fig time_wgrad_sim(nt_tensor *x, nt_tensor *w, nt_tensor *g)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *wl = nt_detach(w);
    CHECK(nt_set_requires_grad(wl, true) == 0);
    nt_tensor *y = nt_conv2d(x, wl, NULL, NULL, PAD, NULL, 1);
    CHECK(y);
    nt_sim_stats s0;
    sim_begin(&s0);
    CHECK(nt_backward_full(y, g, false, false) == 0); /* y.backward(g): conv_wgrad alone */
    CHECK(nt_grad(wl));
    fig f = sim_end(&s0);
    nt_release(wl);
    nt_scope_end(sc);
    return f;
}

static double wall_of(int what, nt_tensor *x, nt_tensor *w, nt_tensor *g, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        CHECK(nt_sync() == 0);
        double t0 = bench_now_ns();
        one(what, x, w, g);
        double t = bench_now_ns() - t0;
        best = t < best ? t : best;
    }
    return best * 1e-6;
}

static void print_fig(const char *dt, const char *what, const fig *f, double wall_ms)
{
    printf("%-5s %-16s sim %9.1f us  TensorE %5.1f%% of peak  HBM %7.1f MB  cpu wall %8.2f ms\n",
           dt, what, f->ns * 1e-3, f->ns > 0 ? 100.0 * f->ideal_ns / f->ns : 0.0, f->hbm * 1e-6,
           wall_ms);
    if (getenv("CONV_BENCH_ENGINES") && f->ns > 0) {
        printf("      busy:");
        for (int e = 0; e < NT_ENGINE_COUNT; e++)
            printf(" %s %.0f%%", nt_engine_name((nt_engine)e), 100.0 * f->busy[e] / f->ns);
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    int64_t N = 8;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            N = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            N = 2, reps = 1;
        else {
            fprintf(stderr, "usage: %s [--batch N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    CHECK(nt_config_set("NT_MODE", "deterministic") == 0);
    CHECK(nt_init() == 0);
    printf("conv2d 3x3, %d -> %d channels, %dx%d, padding 1, batch %lld (GFLOP per pass: %.2f)\n",
           C, C, HW, HW, (long long)N, 2.0 * (double)N * C * HW * HW * C * 9 * 1e-9);
    static const nt_dtype dts[2] = {NT_F32, NT_BF16};
    for (int t = 0; t < 2; t++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_cast(nt_randn(NT_F32, 4, (int64_t[]){N, C, HW, HW}, 1), dts[t]);
        nt_tensor *w = nt_cast(nt_mul_scalar(nt_randn(NT_F32, 4, (int64_t[]){C, C, 3, 3}, 2), 0.05),
                               dts[t]);
        nt_tensor *g = nt_cast(nt_randn(NT_F32, 4, (int64_t[]){N, C, HW, HW}, 3), dts[t]);
        CHECK(x && w && g);
        const char *dn = nt_dtype_name(dts[t]);
        double wall[3];
        CHECK(nt_config_set("NT_BACKEND", "cpu") == 0);
        for (int k = 0; k < 3; k++)
            wall[k] = wall_of(k, x, w, g, reps);
        /* the weight gradient's wall time without its forward */
        wall[2] -= wall_of(0, x, w, g, reps);
        CHECK(nt_config_set("NT_BACKEND", "sim") == 0);
        nt_sim_stats s0;
        sim_begin(&s0);
        one(0, x, w, g);
        fig f0 = sim_end(&s0);
        sim_begin(&s0);
        one(1, x, w, g);
        fig f1 = sim_end(&s0);
        fig f2 = time_wgrad_sim(x, w, g);
        print_fig(dn, "forward", &f0, wall[0]);
        print_fig(dn, "input gradient", &f1, wall[1]);
        print_fig(dn, "weight gradient", &f2, wall[2]);
        fig fb = {f1.ns + f2.ns, f1.ideal_ns + f2.ideal_ns, f1.hbm + f2.hbm, 0};
        fig fa = {f0.ns + fb.ns, f0.ideal_ns + fb.ideal_ns, f0.hbm + fb.hbm, 0};
        print_fig(dn, "backward", &fb, wall[1] + wall[2]);
        print_fig(dn, "forward+backward", &fa, wall[0] + wall[1] + wall[2]);
        nt_scope_end(sc);
    }
    nt_shutdown();
    return 0;
}
