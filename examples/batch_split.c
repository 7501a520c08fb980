/* examples/batch_split.c - B independent pieces of work split over C
 * simulated NeuronCores (examples/batch_split.h): core c takes B/C pieces,
 * with no communication.  Runs the work on 1 core and on C cores, prints
 * each core's simulated time and the host wall time of both runs, and checks
 * that the C-core outputs equal the 1-core outputs bit for bit.
 *
 *   ./build/examples/batch_split [--pieces B] [--cores C] [--rows N]
 *
 * Exits 1 if the outputs differ. */
#include "batch_split.h"

static int arg_int(int argc, char **argv, const char *name, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return atoi(argv[i + 1]);
    return dflt;
}

static void report(const char *what, const bs_result *r)
{
    printf("%s: host wall %.1f ms; simulated per core:", what, r->wall_ns / 1e6);
    for (int d = 0; d < r->cores; d++)
        printf(" core %d %.3f ms (%llu kernels)%s", d, r->sim_ns[d] / 1e6,
               (unsigned long long)r->kernels[d], d + 1 < r->cores ? "," : "");
    printf("\n");
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            printf("usage: batch_split [--pieces B] [--cores C] [--rows N]\n"
                   "  B independent MLP inferences (rows x 96 -> 128 -> 64, softmax), B/C per\n"
                   "  core; compares the C-core outputs with the 1-core run bit for bit\n");
            return 0;
        }
    bs_cfg c = {.pieces = arg_int(argc, argv, "--pieces", 64),
                .rows = arg_int(argc, argv, "--rows", 64),
                .in = 96, .hidden = 128, .out = 64, .seed = 7};
    int cores = arg_int(argc, argv, "--cores", 2);
    if (c.pieces < 1 || c.rows < 1 || cores < 1 || cores > NT_MAX_DEVICES) {
        fprintf(stderr, "batch_split: need --pieces >= 1, --rows >= 1, --cores 1..%d\n",
                NT_MAX_DEVICES);
        return 2;
    }
    size_t n = (size_t)c.pieces * (size_t)c.rows * (size_t)c.out;
    float *one = malloc(n * sizeof *one), *many = malloc(n * sizeof *many);
    if (!one || !many) {
        fprintf(stderr, "batch_split: out of host memory\n");
        return 2;
    }
    printf("batch_split: %d pieces of [%d x %d] -> %d -> %d, %d per core on %d cores\n",
           c.pieces, c.rows, c.in, c.hidden, c.out, c.pieces / cores, cores);
    bs_result r1, rc;
    if (bs_run(&c, 1, 2, one, &r1) || bs_run(&c, cores, 2, many, &rc))
        return 2;
    report("1 core ", &r1);
    char what[32];
    snprintf(what, sizeof what, "%d cores", cores);
    report(what, &rc);
    if (bs_sim_max(&rc) > 0)
        printf("simulated makespan %.3f ms -> %.3f ms (%.2fx); ", bs_sim_max(&r1) / 1e6,
               bs_sim_max(&rc) / 1e6, bs_sim_max(&r1) / bs_sim_max(&rc));
    else
        printf("no simulated time (the CPU backend); ");
    printf("host wall %.2fx of 1 core\n", rc.wall_ns / r1.wall_ns);
    int same = memcmp(one, many, n * sizeof *one) == 0;
    printf("outputs on %d cores equal the 1-core run bit for bit: %s\n", cores,
           same ? "yes" : "NO");
    free(one);
    free(many);
    return same ? 0 : 1;
}
