/* bench/norm.c - nt_batch_norm's forward + backward (training, running
 * statistics, w and b) on x [N, C, H, W] (default 16, 64, 28, 28, f32):
 * the host wall time per step on the CPU backend (median of REPS, adaptive
 * mode unless NT_MODE says otherwise), and the simulated time of one step on
 * the sim backend (deterministic mode: simulated time is deterministic), and
 * the same for nt_group_norm (32 groups), and for the loss alone (what a
 * step spends outside the norm).  bench/peer/norm.py is PyTorch's
 * side of the comparison (docs/ops.md, "Normalisation over channels").
 *
 * Usage: bench/norm [N C H W] */
#define BENCH_NAME "bench/norm"
#include "bench.h"

#define REPS 15

static nt_tensor *xg, *wg, *bg, *rm, *rv, *cot;

/* One training step: y = bn(x); backward of sum(y * cot).  Case 2: the
 * loss alone (y = x), the part of a step that is not the norm. */
static void step(int group)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *y = group == 2 ? nt_retain(xg)
                   : group    ? nt_group_norm(xg, 32, wg, bg, 1e-5)
                              : nt_batch_norm(xg, rm, rv, wg, bg, true, 0.1, 1e-5);
    if (!y)
        bench_fail("norm");
    nt_tensor *l = nt_sum(nt_reshape(nt_mul(y, cot), 1, (int64_t[]){-1}), 0, false);
    bench_check(nt_backward(l), "backward");
    bench_check(nt_sync(), "sync");
    nt_zero_grad(xg);
    if (group < 2)
        nt_zero_grad(wg), nt_zero_grad(bg);
    nt_scope_end(sc);
}

static void setup(const int64_t *s)
{
    xg = nt_randn(NT_F32, 4, s, 1);
    cot = nt_randn(NT_F32, 4, s, 2);
    wg = nt_randn(NT_F32, 1, &s[1], 3);
    bg = nt_randn(NT_F32, 1, &s[1], 4);
    rm = nt_zeros(NT_F32, 1, &s[1]);
    rv = nt_ones(NT_F32, 1, &s[1]);
    nt_set_requires_grad(xg, true), nt_set_requires_grad(wg, true), nt_set_requires_grad(bg, true);
}

int main(int argc, char **argv)
{
    int64_t s[4] = {16, 64, 28, 28};
    if (argc == 5)
        for (int i = 0; i < 4; i++)
            s[i] = atoll(argv[i + 1]);
    bench_check(nt_init(), "nt_init");
    setup(s);
    for (int group = 0; group < 3; group++) {
        const char *name = group == 2 ? "the loss alone (sum(x * cot))"
                           : group    ? "group_norm (32 groups)"
                                      : "batch_norm (training)";
        nt_config_set("NT_BACKEND", "cpu");
        nt_config_set("NT_MODE", getenv("NT_MODE") ? getenv("NT_MODE") : "adaptive");
        double t[REPS];
        step(group), step(group);
        for (int r = 0; r < REPS; r++) {
            double t0 = bench_now_ns();
            step(group);
            t[r] = bench_now_ns() - t0;
        }
        nt_config_set("NT_BACKEND", "sim");
        nt_config_set("NT_MODE", getenv("NT_SIM_MODE") ? getenv("NT_SIM_MODE") : "deterministic");
        step(group);
        nt_stats_reset();
        step(group);
        nt_stats st;
        nt_stats_get(&st);
        printf("%s [%lld, %lld, %lld, %lld] f32, forward + backward: cpu %.3f ms (median of %d), "
               "sim %.1f us simulated (%llu kernels)\n",
               name, (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3],
               bench_median(t, REPS) / 1e6, REPS, (double)st.sim_time_ns / 1e3,
               (unsigned long long)st.sim_kernels);
    }
    nt_shutdown();
    return 0;
}
