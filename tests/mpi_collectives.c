/* tests/mpi_collectives.c - run by tests/mpi_test.sh under mpirun (and
 * alone, as the 1-process reference).
 *
 *   mpi_collectives check DEVS   every collective x dtype x op over this
 *       process's DEVS devices (NT_SIM_CORES must allow them); checks each
 *       output against a reference computed here from every global rank's
 *       inputs (they are a function of the rank), and prints a hash of
 *       each local rank's outputs, "rank R hash H": the same lines for any
 *       split of the N ranks over processes.
 *   mpi_collectives mismatch     2 processes whose inputs' shapes differ:
 *       each reports the other's shape and its own.
 *   mpi_collectives kill         2 processes: process 1 dies (SIGKILL) after
 *       creating the communicator; process 0's all-reduce must fail with an
 *       error naming nt_all_reduce and this file's line, within
 *       NT_COLLECTIVE_TIMEOUT. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ntensor.h"
#include "dist/dist.h"
#include "nt_test.h"

static int fails;
#define CHECK(cond, ...)                                                            \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "process %d: ", nt_process_rank());                     \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            fails++;                                                                \
        }                                                                           \
    } while (0)


/* FNV-1a over every output byte of each local member, in issue order. */
static uint64_t rank_hash[64];
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211u;
    return h;
}

static void set_dev(int dev)
{
    if (nt_device_set(dev) != 0) {
        fprintf(stderr, "nt_device_set: %s\n", nt_last_error_message());
        exit(1);
    }
}

static int check(int ndev)
{
    int *devs = malloc(sizeof *devs * (size_t)ndev);
    for (int i = 0; i < ndev; i++)
        devs[i] = i;
    nt_comm *c = nt_comm_create(devs, ndev);
    if (!c) {
        fprintf(stderr, "nt_comm_create: %s\n", nt_last_error_message());
        return 1;
    }
    int N = nt_comm_size(c);
    for (int i = 0; i < ndev; i++)
        rank_hash[i] = 1469598103934665603u;
    const nt_dtype dts[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    const int64_t rows = 2 * N, cols = 37; /* rows divisible by N */
    int64_t count = rows * cols;
    for (int di = 0; di < 5; di++) {
        nt_dtype dt = dts[di];
        size_t es = nt_dtype_size(dt);
        char **g = malloc(sizeof *g * (size_t)N); /* every rank's input */
        for (int r = 0; r < N; r++) {
            g[r] = malloc((size_t)count * es);
            nt_test_rank_input(g[r], dt, r, count);
        }
        nt_tensor **in = calloc((size_t)ndev, sizeof *in), **out = calloc((size_t)ndev, sizeof *out);
        for (int i = 0; i < ndev; i++) {
            set_dev(devs[i]);
            in[i] = nt_from_host(g[nt_comm_rank(c, i)], dt, 2, (int64_t[]){rows, cols});
        }
        set_dev(0);
        char *want = malloc((size_t)count * es * (size_t)N), *got = malloc((size_t)count * es * (size_t)N);
        for (int kind = 0; kind < 4; kind++)
            for (int op = 0; op < 3; op++) {
                if ((kind == 1 || kind == 3) && op > 0)
                    continue;
                if ((kind == 0 || kind == 2) && op == NT_REDUCE_MEAN && (dt == NT_I32 || dt == NT_U8))
                    continue;
                int rc, root = N - 1;
                size_t obytes = (size_t)count * es;
                switch (kind) {
                case 0:
                    rc = nt_all_reduce(c, in, out, (nt_reduce_op)op);
                    nt__tree_reduce(want, (const void *const *)g, N, count, dt, (nt_reduce_op)op);
                    break;
                case 1:
                    rc = nt_all_gather(c, in, out);
                    for (int r = 0; r < N; r++)
                        memcpy(want + (size_t)r * obytes, g[r], obytes);
                    obytes *= (size_t)N;
                    break;
                case 2:
                    rc = nt_reduce_scatter(c, in, out, (nt_reduce_op)op);
                    obytes /= (size_t)N;
                    break;
                default:
                    rc = nt_broadcast(c, in, out, root);
                    memcpy(want, g[root], obytes);
                    break;
                }
                CHECK(rc == 0, "kind %d op %d dtype %d: %s", kind, op, dt, nt_last_error_message());
                for (int i = 0; i < ndev && rc == 0; i++) {
                    int r = nt_comm_rank(c, i);
                    if (kind == 2) {
                        const void **bv = malloc(sizeof *bv * (size_t)N);
                        for (int q = 0; q < N; q++)
                            bv[q] = g[q] + (size_t)r * obytes;
                        nt__tree_reduce(want, bv, N, count / N, dt, (nt_reduce_op)op);
                        free(bv);
                    }
                    int e = nt_to_host(out[i], got, obytes);
                    CHECK(e == 0, "kind %d: nt_to_host: %s", kind, nt_last_error_message());
                    rank_hash[i] = hash_bytes(rank_hash[i], got, obytes);
                    CHECK(e != 0 || !memcmp(got, want, obytes),
                          "kind %d op %d dtype %d rank %d: values differ from the reference", kind,
                          op, dt, r);
                    nt_release(out[i]);
                }
            }
        for (int i = 0; i < ndev; i++)
            nt_release(in[i]);
        for (int r = 0; r < N; r++)
            free(g[r]);
        free(g);
        free(in);
        free(out);
        free(want);
        free(got);
    }
    free(devs);
    /* one line per global rank: the same lines for any split of the ranks
     * over processes when the outputs are bit-identical */
    for (int i = 0; i < ndev; i++)
        printf("rank %d hash %016llx\n", nt_comm_rank(c, i), (unsigned long long)rank_hash[i]);
    printf("process %d of %d: %d global ranks, %s\n", nt_process_rank(), nt_process_count(), N,
           fails ? "FAILED" : "ok");
    nt_comm_destroy(c);
    return fails ? 1 : 0;
}

static int kill_test(void)
{
    nt_comm *c = nt_comm_create((int[]){0}, 1);
    if (!c) {
        fprintf(stderr, "nt_comm_create: %s\n", nt_last_error_message());
        return 1;
    }
    if (nt_process_rank() == 1) {
        fflush(stdout);
        raise(SIGKILL); /* dies mid-step, before its collective */
    }
    float v[4] = {1, 2, 3, 4}, o[4];
    nt_tensor *x = nt_from_host(v, NT_F32, 1, (int64_t[]){4}), *y = NULL;
    int line = __LINE__ + 1;
    int rc = nt_all_reduce(c, (nt_tensor *[]){x}, &y, NT_REDUCE_SUM);
    CHECK(rc == 0, "the call itself fails: %s", nt_last_error_message());
    int e = nt_to_host(y, o, sizeof o);
    const char *msg = nt_last_error_message();
    char where[64];
    snprintf(where, sizeof where, "mpi_collectives.c:%d", line);
    printf("survivor's error: %s (%s)\n", msg, nt_strerror(e));
    CHECK(e == NT_ETIMEDOUT || e == NT_ECOMM, "expected a timeout or a communication error, got %d",
          e);
    CHECK(strstr(msg, "nt_all_reduce") != NULL, "the message does not name nt_all_reduce");
    CHECK(strstr(msg, where) != NULL, "the message does not name the call site %s", where);
    CHECK(strstr(msg, "process 1") != NULL, "the message does not name process 1");
    nt_release(x);
    nt_release(y);
    nt_comm_destroy(c);
    printf("fault test: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}

/* Shapes that differ between processes: both get an error naming the
 * other process and both shapes, at the first sync. */
static int mismatch_test(void)
{
    nt_comm *c = nt_comm_create((int[]){0}, 1);
    if (!c) {
        fprintf(stderr, "nt_comm_create: %s\n", nt_last_error_message());
        return 1;
    }
    int me = nt_process_rank(), other = 1 - me;
    /* a broadcast from the other process needs a template on every member:
     * an error at the call, nothing queued, nothing exchanged */
    nt_tensor *y = (nt_tensor *)1;
    CHECK(nt_broadcast(c, (nt_tensor *[]){NULL}, &y, other) == NT_EINVAL && y == NULL &&
              strstr(nt_last_error_message(), "another process"),
          "broadcast without a template: %s", nt_last_error_message());
    nt_clear_error();
    nt_tensor *x = nt_ones(NT_F32, 1, (int64_t[]){4 + me});
    CHECK(nt_all_reduce(c, (nt_tensor *[]){x}, &y, NT_REDUCE_SUM) == 0, "the call fails: %s",
          nt_last_error_message());
    float o[8];
    int e = nt_to_host(y, o, (size_t)(4 + me) * sizeof(float));
    const char *msg = nt_last_error_message();
    char want[96];
    snprintf(want, sizeof want, "process %d's inputs are f32 [%d]; this process's are f32 [%d]",
             other, 4 + other, 4 + me);
    printf("process %d's error: %s\n", me, msg);
    CHECK(e == NT_ESHAPE, "expected NT_ESHAPE, got %d", e);
    CHECK(strstr(msg, "nt_all_reduce") && strstr(msg, want), "expected '%s'", want);
    nt_release(x);
    nt_release(y);
    nt_comm_destroy(c);
    printf("mismatch test: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mpi_collectives check DEVS | kill\n");
        return 2;
    }
    if (nt_init() != 0) {
        fprintf(stderr, "nt_init: %s\n", nt_last_error_message());
        return 1;
    }
    int rc = !strcmp(argv[1], "kill")       ? kill_test()
             : !strcmp(argv[1], "mismatch") ? mismatch_test()
                                            : check(argc > 2 ? atoi(argv[2]) : 1);
    nt_shutdown();
    return rc;
}
