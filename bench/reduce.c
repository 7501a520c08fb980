/* bench/reduce.c - a reduction over a short middle dimension against the
 * strided-maximum formulation, in simulated time.
 *
 * A CNN's 2x2 max-pool of x [N, C, H, W] (default 16, 64, 28, 28, f32)
 * written two ways on the sim backend:
 *   reduce:  nt_reshape(x, [N, C, H/2, 2, W/2, 2]), nt_max over dim 5, then
 *            nt_max over dim 3 (a size-2 dimension in the middle of the
 *            tensor: the pooling a PyTorch user writes with view + amax);
 *   strided: nt_maximum of the even and odd columns (nt_slice with step 2),
 *            then of the even and odd rows of that;
 *   amax:    nt_amax of the reshape over the dim list {3, 5} (printed too);
 *   nt_max_pool2d with kernel 2 (printed too: the pooling op's composite).
 * Both give the same values (checked bit for bit).  Each is run a few times
 * after a warm-up, in deterministic mode, and its simulated time per pool
 * (nt_stats' sim_time_ns) printed with the ratio reduce / strided against
 * the target of 1.5.  Simulated time is deterministic, so one run suffices;
 * the repeats only confirm it.
 *
 * Usage: bench/reduce [N C H W] */
#define BENCH_NAME "bench/reduce"
#include "bench.h"

#define REPS 3

static nt_tensor *pool_reduce(nt_tensor *x, const int64_t *s)
{
    nt_tensor *r = nt_reshape(x, 6, (int64_t[]){s[0], s[1], s[2] / 2, 2, s[3] / 2, 2});
    return nt_max(nt_max(r, 5, false), 3, false);
}

/* The same pool as one reduction over the dim list {3, 5} (nt_amax: the
 * two dims moved last and flattened by a copy, then a reduction of 4). */
static nt_tensor *pool_amax(nt_tensor *x, const int64_t *s)
{
    nt_tensor *r = nt_reshape(x, 6, (int64_t[]){s[0], s[1], s[2] / 2, 2, s[3] / 2, 2});
    return nt_amax(r, 2, (const int[]){3, 5}, false);
}

static nt_tensor *pool_strided(nt_tensor *x, const int64_t *s)
{
    nt_tensor *w = nt_maximum(nt_slice(x, 3, 0, s[3], 2), nt_slice(x, 3, 1, s[3], 2));
    return nt_maximum(nt_slice(w, 2, 0, s[2], 2), nt_slice(w, 2, 1, s[2], 2));
}

/* nt_max_pool2d (2x2, stride 2): its composite (docs/ops.md, Pooling). */
static nt_tensor *pool_op(nt_tensor *x, const int64_t *s)
{
    (void)s;
    return nt_max_pool2d(x, (const int64_t[]){2, 2}, NULL, NULL, NULL, false, NULL);
}

/* Simulated ns of one call of f (its result kept in *out). */
static double sim_ns(nt_tensor *(*f)(nt_tensor *, const int64_t *), nt_tensor *x,
                     const int64_t *s, nt_tensor **out)
{
    bench_check(nt_sync(), "sync");
    nt_stats_reset();
    nt_tensor *y = f(x, s);
    if (!y)
        bench_fail("pool");
    bench_check(nt_sync(), "sync");
    nt_stats st;
    nt_stats_get(&st);
    *out = y;
    return (double)st.sim_time_ns;
}

int main(int argc, char **argv)
{
    int64_t s[4] = {16, 64, 28, 28};
    if (argc == 5)
        for (int i = 0; i < 4; i++)
            s[i] = atoll(argv[i + 1]);
    if (s[2] % 2 || s[3] % 2 || s[0] < 1 || s[1] < 1) {
        fprintf(stderr, "usage: bench/reduce [N C H W] (H and W even)\n");
        return 2;
    }
    setenv("NT_MODE", getenv("NT_MODE") ? getenv("NT_MODE") : "deterministic", 1);
    bench_check(nt_init(), "nt_init");
    nt_tensor *x = nt_randn(NT_F32, 4, s, 1);
    if (!x)
        bench_fail("randn");
    double tr[REPS], ts[REPS], ta[REPS], tp[REPS];
    nt_tensor *yr = NULL, *ys = NULL, *ya = NULL, *yp = NULL;
    for (int rep = -1; rep < REPS; rep++) { /* rep -1: the warm-up */
        double a = sim_ns(pool_reduce, x, s, &yr), b = sim_ns(pool_strided, x, s, &ys);
        double c = sim_ns(pool_amax, x, s, &ya);
        double d = sim_ns(pool_op, x, s, &yp);
        if (rep >= 0)
            tr[rep] = a, ts[rep] = b, ta[rep] = c, tp[rep] = d;
    }
    int64_t n = s[0] * s[1] * (s[2] / 2) * (s[3] / 2);
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    if (!a || !b)
        bench_fail("malloc");
    bench_check(nt_to_host(yr, a, sizeof(float) * (size_t)n), "to_host");
    bench_check(nt_to_host(ys, b, sizeof(float) * (size_t)n), "to_host");
    bool same = memcmp(a, b, sizeof(float) * (size_t)n) == 0;
    bench_check(nt_to_host(ya, b, sizeof(float) * (size_t)n), "to_host");
    same &= memcmp(a, b, sizeof(float) * (size_t)n) == 0;
    bench_check(nt_to_host(yp, b, sizeof(float) * (size_t)n), "to_host");
    same &= memcmp(a, b, sizeof(float) * (size_t)n) == 0;
    double pm = bench_median(tp, REPS);
    double r = bench_median(tr, REPS), t = bench_median(ts, REPS), am = bench_median(ta, REPS);
    printf("2x2 max-pool of f32 [%lld, %lld, %lld, %lld] on the simulated NeuronCore\n",
           (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
    printf("  reduce  (reshape, nt_max over dim 5 then dim 3): %9.1f us simulated\n", r / 1e3);
    printf("  strided (nt_maximum of step-2 slices, twice):    %9.1f us simulated\n", t / 1e3);
    printf("  amax    (reshape, nt_amax over dims {3, 5}):      %9.1f us simulated (%.2fx)\n",
           am / 1e3, am / t);
    printf("  nt_max_pool2d (2x2, stride 2, its composite):      %9.1f us simulated (%.2fx)\n",
           pm / 1e3, pm / t);
    printf("  ratio reduce / strided: %.2fx (target <= 1.5x: %s); results %s\n", r / t,
           r <= 1.5 * t ? "met" : "NOT met", same ? "bit-identical" : "DIFFER");
    free(a);
    free(b);
    nt_shutdown();
    return same && r <= 1.5 * t ? 0 : 1;
}
