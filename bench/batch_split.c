/* bench/batch_split.c - host wall time of batch-split work (B independent
 * MLP inferences, examples/batch_split.h) on C simulated NeuronCores over
 * the same work on one core, in one run: each core's worker runs its
 * kernels on its own host thread, so on a host with C free CPUs the wall
 * time should approach 1/C (target: <= 0.6x with 2 cores on a
 * 2-CPU machine).  Also prints each core's simulated time and checks the
 * outputs equal the 1-core run's bit for bit.
 *
 *   ./build/bench/batch_split [--pieces B] [--cores C] [--reps R] */
#define BENCH_NAME "bench/batch_split"
#include "bench.h"

#include <string.h>
#include <unistd.h>

#include "../examples/batch_split.h"

static int arg_int(int argc, char **argv, const char *name, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return atoi(argv[i + 1]);
    return dflt;
}

int main(int argc, char **argv)
{
    bs_cfg c = {.pieces = arg_int(argc, argv, "--pieces", 256),
                .rows = arg_int(argc, argv, "--rows", 64),
                .in = 96, .hidden = 128, .out = 64, .seed = 7};
    int cores = arg_int(argc, argv, "--cores", 2), reps = arg_int(argc, argv, "--reps", 5);
    if (c.pieces < 1 || c.rows < 1 || cores < 2 || cores > NT_MAX_DEVICES || reps < 2) {
        fprintf(stderr, "%s: need --pieces >= 1, --rows >= 1, --cores 2..%d, --reps >= 2\n",
                BENCH_NAME, NT_MAX_DEVICES);
        return 2;
    }
    size_t n = (size_t)c.pieces * (size_t)c.rows * (size_t)c.out;
    float *one = malloc(n * sizeof *one), *many = malloc(n * sizeof *many);
    if (!one || !many)
        return 2;
    printf("%s: %d pieces [%d x %d] -> %d -> %d (gelu, softmax), best of %d runs after a "
           "warm-up, host has %ld CPUs\n", BENCH_NAME, c.pieces, c.rows, c.in, c.hidden, c.out,
           reps - 1, sysconf(_SC_NPROCESSORS_ONLN));
    bs_result r1, rc;
    if (bs_run(&c, 1, reps, one, &r1) || bs_run(&c, cores, reps, many, &rc))
        return 2;
    printf("  %-8s %12s %16s %s\n", "cores", "host wall", "sim makespan", "sim per core");
    const bs_result *rs[2] = {&r1, &rc};
    for (int k = 0; k < 2; k++) {
        printf("  %-8d %9.1f ms %13.3f ms ", rs[k]->cores, rs[k]->wall_ns / 1e6,
               bs_sim_max(rs[k]) / 1e6);
        for (int d = 0; d < rs[k]->cores; d++)
            printf(" %.3f", rs[k]->sim_ns[d] / 1e6);
        printf(" ms\n");
    }
    double ratio = rc.wall_ns / r1.wall_ns;
    printf("  host wall, %d cores over 1: %.2fx (target <= 0.60x on 2 CPUs)\n", cores, ratio);
    printf("  simulated makespan speed-up: %.2fx\n", bs_sim_max(&r1) / bs_sim_max(&rc));
    int same = memcmp(one, many, n * sizeof *one) == 0;
    printf("  outputs bit-identical to the 1-core run: %s\n", same ? "yes" : "NO");
    free(one);
    free(many);
    return same ? 0 : 1;
}
