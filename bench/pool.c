/* bench/pool.c - nt_max_pool2d and nt_avg_pool2d (2x2, stride 2) on x
 * [N, C, H, W] (default 128, 16, 28, 28, f32, examples/cnn's first pool):
 * the CPU backend's host wall time of the forward alone (x requiring a
 * gradient, as in training) and of forward + backward of sum(y * cot) (best of REPS: the machine is shared), next to
 * PyTorch 1.13's (bench/peer/pool.py, run by this bench at 1 and 2
 * threads, at its best through bench/peer/peer_env.py) in the same run, and
 * the ratio ours / PyTorch's best.  NT_MODE picks the mode (default
 * deterministic).
 *
 * Usage: bench/pool [N C H W] [--python PATH] [--no-peer] */
#define BENCH_NAME "bench/pool"
#include "bench.h"

#include <string.h>

#define REPS 15
#define NCASES 4

static nt_tensor *xg, *cot;
static const char *names[NCASES] = {"max_pool2d forward", "max_pool2d forward+backward",
                                    "avg_pool2d forward", "avg_pool2d forward+backward"};

/* One step of case c: y = pool(x); with backward (c odd): of sum(y * cot). */
static void step(int c)
{
    nt_scope *sc = nt_scope_begin();
    const int64_t k[2] = {2, 2};
    bool bwd = c & 1;
    nt_tensor *y = c < 2 ? nt_max_pool2d(xg, k, NULL, NULL, NULL, false, NULL)
                         : nt_avg_pool2d(xg, k, NULL, NULL, false, true);
    if (!y)
        bench_fail("pool");
    if (bwd) {
        nt_tensor *l = nt_sum(nt_reshape(nt_mul(y, cot), 1, (int64_t[]){-1}), 0, false);
        bench_check(nt_backward(l), "backward");
    }
    bench_check(nt_sync(), "sync");
    if (bwd)
        nt_zero_grad(xg);
    nt_scope_end(sc);
}

typedef struct peer_out {
    double ms[NCASES]; /* the best over thread counts, 0: none */
} peer_out;

static void peer_line(const char *line, void *arg)
{
    peer_out *o = arg;
    printf("    peer: %s", line);
    for (int c = 0; c < NCASES; c++) {
        size_t n = strlen(names[c]);
        const char *ms = strstr(line, " ms");
        if (!strncmp(line, names[c], n) && line[n] == ' ' && ms) {
            const char *p = ms;
            while (p > line && p[-1] != ' ')
                p--;
            double v = atof(p);
            if (v > 0 && (o->ms[c] == 0 || v < o->ms[c]))
                o->ms[c] = v;
        }
    }
}

int main(int argc, char **argv)
{
    int64_t s[4] = {128, 16, 28, 28};
    const char *python = "/usr/bin/python3";
    bool peer = true;
    int na = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--no-peer"))
            peer = false;
        else if (na < 4)
            s[na++] = atoll(argv[i]);
    }
    bench_check(nt_init(), "nt_init");
    peer_out po = {{0}};
    if (peer && bench_python_has_torch(python)) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "%s bench/peer/pool.py %lld %lld %lld %lld", python,
                 (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
        if (bench_peer_lines(cmd, peer_line, &po) != 0)
            printf("    peer: failed (%s)\n", cmd);
    }
    xg = nt_randn(NT_F32, 4, s, 1);
    nt_set_requires_grad(xg, true);
    int64_t os[4] = {s[0], s[1], s[2] / 2, s[3] / 2};
    cot = nt_randn(NT_F32, 4, os, 2);
    nt_config_set("NT_BACKEND", "cpu");
    nt_config_set("NT_MODE", getenv("NT_MODE") ? getenv("NT_MODE") : "deterministic");
    for (int c = 0; c < NCASES; c++) {
        double best = 0;
        step(c), step(c);
        for (int r = 0; r < REPS; r++) {
            double t0 = bench_now_ns();
            step(c);
            double t = bench_now_ns() - t0;
            best = r == 0 || t < best ? t : best;
        }
        printf("%s [%lld, %lld, %lld, %lld] f32 2x2: ntensor cpu %.3f ms (best of %d)", names[c],
               (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3], best / 1e6, REPS);
        if (po.ms[c] > 0)
            printf(", PyTorch %.3f ms, ratio %.2fx", po.ms[c], best / 1e6 / po.ms[c]);
        printf("\n");
    }
    nt_shutdown();
    return 0;
}
