/* bench/dispatch.c - host cost of enqueueing one tiny op.
 *
 * nt_add on two f32 [16] tensors from a tight loop: the time per call is
 * what a training step pays on the host for each op before it returns (the
 * work itself runs on the stream's worker).  Median over repeats; each
 * repeat enqueues BATCH ops (below the backpressure limit, so the host never
 * waits for the worker inside a timed batch) and then syncs, untimed.
 * Target: <= 150 ns per op.  PyTorch 1.13 eager pays about 1.0 us per
 * tiny torch.add from Python (bench/peer/tiny_op.py; 1.03-1.08 us in five
 * runs on a shared AMD EPYC Zen 4, 2026-12-05).
 *
 * Then BATCH adds captured as one program (nt_graph_*, docs/graphs.md)
 * and replayed: the host time of nt_graph_replay over the ops it holds
 * (target: <= 10 ns per captured op), median of REPEATS replays, each
 * followed by an untimed sync.  Twice: a chain whose intermediates the
 * program plans (y = y + b, only the last y kept: a step's shape), and
 * BATCH independent adds whose results the caller all keeps (each result
 * a storage the replay must order, the worst case). */
#include <ntensor.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "bench/dispatch"
#include "bench.h"

#define BATCH 4096
#define REPEATS 101

static double run(const char *mode, nt_tensor *a, nt_tensor *b)
{
    if (nt_config_set("NT_MODE", mode) != 0) {
        fprintf(stderr, "%s\n", nt_last_error_message());
        exit(1);
    }
    static double per_op[REPEATS];
    static nt_tensor *outs[BATCH];
    for (int r = 0; r < REPEATS; r++) {
        double t0 = bench_now_ns();
        for (int i = 0; i < BATCH; i++)
            outs[i] = nt_add(a, b);
        double t1 = bench_now_ns();
        per_op[r] = (t1 - t0) / BATCH;
        if (!outs[BATCH - 1]) {
            fprintf(stderr, "nt_add failed: %s\n", nt_last_error_message());
            exit(1);
        }
        for (int i = 0; i < BATCH; i++)
            nt_release(outs[i]);
        nt_sync();
    }
    qsort(per_op, REPEATS, sizeof per_op[0], bench_cmp);
    return per_op[REPEATS / 2];
}

/* Host ns per captured op of a replay of BATCH adds (chain: y = y + b). */
static double run_captured(nt_tensor *a, nt_tensor *b, bool chain)
{
    static nt_tensor *outs[BATCH];
    static double per_op[REPEATS];
    if (nt_config_set("NT_MODE", "adaptive") != 0 || nt_graph_capture_begin() != 0)
        bench_fail("nt_graph_capture_begin");
    for (int i = 0; i < BATCH; i++) {
        outs[i] = nt_add(chain && i ? outs[i - 1] : a, b);
        if (chain && i)
            nt_release(outs[i - 1]), outs[i - 1] = NULL;
    }
    nt_graph *g = nt_graph_capture_end();
    if (!g)
        bench_fail("nt_graph_capture_end");
    for (int r = 0; r < REPEATS; r++) {
        double t0 = bench_now_ns();
        int rc = nt_graph_replay(g);
        double t1 = bench_now_ns();
        if (rc != 0)
            bench_fail("nt_graph_replay");
        per_op[r] = (t1 - t0) / BATCH;
        nt_sync();
    }
    nt_graph_destroy(g);
    for (int i = 0; i < BATCH; i++)
        nt_release(outs[i]);
    qsort(per_op, REPEATS, sizeof per_op[0], bench_cmp);
    return per_op[REPEATS / 2];
}

int main(void)
{
    if (nt_init() != 0) {
        fprintf(stderr, "%s\n", nt_last_error_message());
        return 1;
    }
    float x[16];
    for (int i = 0; i < 16; i++)
        x[i] = (float)i;
    nt_tensor *a = nt_from_host(x, NT_F32, 1, (int64_t[]){16});
    nt_tensor *b = nt_from_host(x, NT_F32, 1, (int64_t[]){16});
    const char *modes[] = {"adaptive", "eager", "lazy"};
    double worst = 0;
    printf("bench/dispatch: host ns per enqueued nt_add([16]), median of %d x %d ops\n", REPEATS,
           BATCH);
    for (int m = 0; m < 3; m++) {
        double ns = run(modes[m], a, b);
        if (ns > worst)
            worst = ns;
        printf("  %-9s %7.1f ns/op\n", modes[m], ns);
    }
    printf("dispatch: %.1f ns/op (worst mode); target <= 150 ns: %s (ratio %.2f of the limit)\n",
           worst, worst <= 150 ? "met" : "NOT met", worst / 150.0);
    double cap = run_captured(a, b, true), held = run_captured(a, b, false);
    printf("  replay of %d independent adds, every result kept: %.2f ns per captured op\n",
           BATCH, held);
    printf("captured: %.2f ns of host time per captured op (a replay of a chain of %d adds); "
           "target <= 10 ns: %s (ratio %.2f of the limit)\n",
           cap, BATCH, cap <= 10 ? "met" : "NOT met", cap / 10.0);
    nt_release(a);
    nt_release(b);
    nt_shutdown();
    return 0;
}
