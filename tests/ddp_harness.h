/* tests/ddp_harness.h - the data-parallel training harness of the tests
 * that check parameters bit for bit across core and process counts
 * (tests/test_ddp.c, tests/test_zero.c, tests/test_fp8amp.c,
 * tests/test_fp8dist.c).
 *
 * NT_SIM_CORES is read by nt_init, so every core count runs in a child
 * process: the test re-executes itself (ddp_h_self) with --child ... and
 * the case's environment, the child trains with nt_ddp (ddp_h_step) and
 * prints one line (ddp_h_report):
 *     crc <hex> cores <n> procs <p> replicas <same|differ>
 * which the parent reads (ddp_h_child_crc).  Under mpirun the parent runs
 * `mpirun -np 2 <self> --child ...` with Open MPI's settings for a
 * container (ddp_h_mpi_env); a test's `--mpi <mpirun|none>` main skips as
 * a TAP plan when MPI is missing (ddp_h_mpi_main).
 *
 * The model most of them train: a 2-layer MLP (F features, H hidden, C
 * classes; params w1 [H, F], b1 [H], w2 [C, H], b2 [C]) on synthetic data
 * whose step s is drawn from seed 100 + s. */
#ifndef NT_TESTS_DDP_HARNESS_H
#define NT_TESTS_DDP_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ntensor.h"
#include "crc32.h"
#include "nt_test.h" /* nt_test_setup, nt_test_teardown */
#include "bench/bench.h" /* bench_run_child */

enum { DDP_H_CLASSES = 5, DDP_H_NP = 4, DDP_H_MAXDEV = 64 };

/* ---------------- the model and its data ---------------- */

/* rows x cols inputs on a grid of range / 2^16 in [-range/2, range/2) and
 * rows labels in 0..DDP_H_CLASSES-1, from seed. */
static inline void ddp_h_data(float *x, int32_t *y, int rows, int cols, float range,
                              uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (int i = 0; i < rows * cols; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) & 0xFFFF) / (65536.0f / range) - range / 2;
    }
    for (int i = 0; i < rows; i++) {
        s = s * 1664525u + 1013904223u;
        y[i] = (int32_t)((s >> 16) % DDP_H_CLASSES);
    }
}

/* The MLP's parameters, N(0, 0.3^2) from seed (nt_randn seed * 8 + j),
 * rounded to dt, requiring grad.  0, or -1 with the runtime's error set. */
static inline int ddp_h_params(nt_tensor **p, nt_dtype dt, int h, int f, uint64_t seed)
{
    const int64_t shapes[DDP_H_NP][2] = {{h, f}, {h, 0}, {DDP_H_CLASSES, h},
                                         {DDP_H_CLASSES, 0}};
    for (int j = 0; j < DDP_H_NP; j++) {
        int nd = shapes[j][1] ? 2 : 1;
        nt_tensor *r = nt_randn(NT_F32, nd, shapes[j], seed * 8 + (uint64_t)j);
        nt_tensor *t = nt_mul_scalar(r, 0.3);
        nt_release(r);
        if (t && dt != NT_F32) {
            nt_tensor *c = nt_cast(t, dt);
            nt_release(t);
            t = c;
        }
        p[j] = t;
        if (!t || nt_set_requires_grad(t, true))
            return -1;
    }
    return 0;
}

/* CRC-32 of n tensors' bytes, chained (0 and a message on stderr if one
 * cannot be read). */
static inline uint32_t ddp_h_crc(nt_tensor *const *p, int n)
{
    uint32_t c = 0;
    for (int j = 0; j < n; j++) {
        size_t nb = (size_t)nt_numel(p[j]) * nt_dtype_size(nt_dtype_of(p[j]));
        uint8_t *buf = malloc(nb ? nb : 1);
        if (!buf || nt_to_host(p[j], buf, nb) != 0) {
            fprintf(stderr, "child: %s\n", nt_last_error_message());
            free(buf);
            return 0;
        }
        c = crc32_ieee(buf, nb) ^ (c * 31u);
        free(buf);
    }
    return c;
}

/* ---------------- a child's training ---------------- */

/* What ddp_h_step runs.  Every hook is optional but loss. */
typedef struct ddp_h_cfg {
    int shards, rows; /* the global batch's rows */
    int cols;    /* the MLP data's features */
    float range; /* ... and their range (ddp_h_data) */
    /* the loss of one shard on the replica p of its device (in the
     * caller's scope), or NULL with the runtime's error set */
    nt_tensor *(*loss)(void *ctx, nt_tensor **p, nt_tensor *x, nt_tensor *y);
    /* shard s's inputs at `step` on its device; NULL: the MLP data's rows
     * of the shard (nt_ddp_shard_from_host) */
    int (*batch)(void *ctx, nt_ddp *d, int s, int step, nt_tensor **x, nt_tensor **y);
    int (*before)(void *ctx, nt_ddp *d);       /* before the shards (ZeRO-3's gathers) */
    /* every local shard's forward and backward in place of ddp_h_shards
     * (xb, yb: the MLP data of the step, NULL with `batch`) */
    int (*shards_fn)(void *ctx, nt_ddp *d, int step, const float *xb, const int32_t *yb);
    int (*after_reduce)(void *ctx, nt_ddp *d); /* clipping, the fp8 amax reduction */
    void *ctx;
} ddp_h_cfg;

/* Every local shard's forward and nt_ddp_backward, each on its device in a
 * scope of its own. */
static inline int ddp_h_shards(nt_ddp *d, const ddp_h_cfg *c, int step, const float *xb,
                               const int32_t *yb)
{
    for (int s = 0; s < c->shards; s++) {
        int dev = nt_ddp_shard_device(d, s);
        if (dev < 0)
            continue; /* another process's */
        nt_device_set(dev);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x, *y;
        int rc = 0;
        if (c->batch) {
            rc = c->batch(c->ctx, d, s, step, &x, &y);
        } else {
            x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, (int64_t[]){c->rows, c->cols});
            y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){c->rows});
        }
        nt_tensor *loss = rc ? NULL : c->loss(c->ctx, nt_ddp_params(d, dev), x, y);
        rc = loss ? nt_ddp_backward(d, s, loss) : -1;
        nt_scope_end(sc);
        if (rc)
            return rc;
    }
    return 0;
}

/* One training step `step`: c->before, the shards, nt_ddp_reduce,
 * c->after_reduce, nt_ddp_step(opts).  0, or nonzero with the runtime's
 * error set. */
static inline int ddp_h_step(nt_ddp *d, const ddp_h_cfg *c, nt_optim **opts, int nopts,
                             int step)
{
    float *xb = NULL;
    int32_t *yb = NULL;
    if (!c->batch) {
        xb = malloc(sizeof *xb * (size_t)c->rows * (size_t)c->cols);
        yb = malloc(sizeof *yb * (size_t)c->rows);
        if (!xb || !yb) {
            free(xb);
            free(yb);
            return -1;
        }
        ddp_h_data(xb, yb, c->rows, c->cols, c->range, 100 + (uint32_t)step);
    }
    int rc = c->before ? c->before(c->ctx, d) : 0;
    if (!rc)
        rc = c->shards_fn ? c->shards_fn(c->ctx, d, step, xb, yb)
                          : ddp_h_shards(d, c, step, xb, yb);
    free(xb);
    free(yb);
    if (!rc)
        rc = nt_ddp_reduce(d);
    if (!rc && c->after_reduce)
        rc = c->after_reduce(c->ctx, d);
    return rc ? rc : nt_ddp_step(d, opts, nopts);
}

/* Devices 0 .. nt_device_count() - 1 into devs; returns the count. */
static inline int ddp_h_devices(int *devs)
{
    int n = nt_device_count();
    for (int i = 0; i < n && i < DDP_H_MAXDEV; i++)
        devs[i] = i;
    return n < DDP_H_MAXDEV ? n : DDP_H_MAXDEV;
}

/* The child's answer: the CRC of devs[0]'s replica (np parameters),
 * whether every device's replica has it, after an nt_sync; printed by
 * process 0 (or the only one) as the harness's line.  0, or -1 if the
 * sync failed (nothing printed). */
static inline int ddp_h_report(nt_ddp *d, const int *devs, int ndev, int np)
{
    uint32_t crc = ddp_h_crc(nt_ddp_params(d, devs[0]), np);
    bool same = true;
    for (int i = 1; i < ndev; i++)
        same &= ddp_h_crc(nt_ddp_params(d, devs[i]), np) == crc;
    if (nt_sync())
        return -1;
    if (nt_process_rank() <= 0)
        printf("crc %08x cores %d procs %d replicas %s\n", crc, ndev,
               nt_process_count() > 1 ? nt_process_count() : 1, same ? "same" : "differ");
    return 0;
}

/* ---------------- the parent ---------------- */

static char ddp_h_exe[4096];

/* Finds this executable for the children (in main, before any test). */
static inline int ddp_h_self(void)
{
    ssize_t k = readlink("/proc/self/exe", ddp_h_exe, sizeof ddp_h_exe - 1);
    if (k <= 0)
        return -1;
    ddp_h_exe[k] = '\0';
    return 0;
}

/* Runs argv with env added (NAME=VALUE strings, NULL-terminated), its
 * output into line; a failed start or exit is the test's failure, naming
 * the first environment entries, the first arguments and the output. */
static inline void ddp_h_run(const char *const *env, char *const *argv, char *line, size_t cap)
{
    int status = bench_run_child(argv, env, line, cap);
    assert_true(status >= 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        /* env's first entries, read up to its NULL only (a loop, not
         * env[1] .. env[3] guarded by &&: inlined with a 2- or 3-entry list,
         * GCC's -Warray-bounds flagged those reads, which never happen) */
        char words[256] = "";
        size_t at = 0;
        for (int i = 0; i < 4 && env[i] && at < sizeof words; i++)
            at += (size_t)snprintf(words + at, sizeof words - at, "%s%s", i ? " " : "", env[i]);
        fail_msg("child (%s; %s %s %s) failed with status %d: '%s'", words, argv[0], argv[1],
                 argv[1] && argv[2] ? argv[2] : "", status, line);
    }
}

/* The CRC of the harness line in `line` (the output of `what`); checks the
 * line, its core count (cores > 0), process count (procs > 0) and that
 * the replicas agree. */
static inline unsigned ddp_h_parse(const char *line, const char *what, int cores, int procs)
{
    unsigned crc = 0;
    int nc = 0, np = 0;
    char rep[16] = "";
    if (sscanf(line, "crc %x cores %d procs %d replicas %15s", &crc, &nc, &np, rep) != 4)
        fail_msg("child %s printed '%s'", what, line);
    if (cores > 0 && nc != cores)
        fail_msg("child %s ran on %d cores, expected %d", what, nc, cores);
    if (procs > 0 && np != procs)
        fail_msg("child %s ran in %d processes, expected %d", what, np, procs);
    if (strcmp(rep, "same"))
        fail_msg("child %s: the replicas differ", what);
    return crc;
}

/* Runs `self --child <arg> [arg2]` with env; returns its CRC (checked as
 * ddp_h_parse does, one process). */
static inline unsigned ddp_h_child_crc(const char *const *env, const char *arg,
                                       const char *arg2, int cores)
{
    char line[1024];
    char *argv[] = {ddp_h_exe, "--child", (char *)arg, (char *)arg2, NULL};
    ddp_h_run(env, argv, line, sizeof line);
    return ddp_h_parse(line, arg, cores, 1);
}

/* Open MPI as root in a container, on loopback (tests/mpi_test.sh): allow
 * root, shared memory without the single-copy mechanism, oversubscribe.
 * Open MPI's plugins leave allocations at exit no suppression can name, so
 * the MPI processes run without leak checking: ddp_h_mpi_asan(true) before
 * an mpirun, (false) after. */
static inline void ddp_h_mpi_env(void)
{
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl", "self,vader", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
}

static inline void ddp_h_mpi_asan(bool mpi)
{
    static char saved[512], opts[600];
    static bool had;
    if (mpi) {
        const char *asan = getenv("ASAN_OPTIONS");
        had = asan != NULL;
        snprintf(saved, sizeof saved, "%s", asan ? asan : "");
        snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", saved, had ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
    } else if (had) {
        setenv("ASAN_OPTIONS", saved, 1);
    } else {
        unsetenv("ASAN_OPTIONS");
    }
}

/* `mpirun -np 2 self --child <arg>` with env; returns its CRC, checked for
 * `cores` cores per process and 2 processes. */
static inline unsigned ddp_h_mpi_crc(const char *mpirun, const char *const *env,
                                     const char *arg, int cores)
{
    char line[1024];
    char *argv[] = {(char *)mpirun, "-np", "2", ddp_h_exe, "--child", (char *)arg, NULL};
    ddp_h_mpi_env();
    ddp_h_mpi_asan(true);
    ddp_h_run(env, argv, line, sizeof line);
    ddp_h_mpi_asan(false);
    return ddp_h_parse(line, arg, cores, 2);
}

/* A test's `--mpi <mpirun|none>` main: with "none" (no MPI in this build,
 * or no mpirun) a skipped TAP plan (meson's TAP protocol counts exit 77 as
 * an error), else the tests with *mpirun set. */
static inline int ddp_h_mpi_main(const char *arg, const char **mpirun,
                                 const struct CMUnitTest *tests, size_t n)
{
    if (!strcmp(arg, "none")) {
        printf("1..0 # SKIP ntensor was built without MPI or mpirun is missing\n");
        return 0;
    }
    *mpirun = arg;
    return _cmocka_run_group_tests("mpi_tests", tests, n, NULL, NULL);
}

/* cmocka setup / teardown of a group run on two simulated cores
 * (NT_SIM_CORES=2 for the group's runtime, unset after it). */
static inline int ddp_h_setup_2dev(void **state)
{
    setenv("NT_SIM_CORES", "2", 1);
    return nt_test_setup(state);
}

static inline int ddp_h_teardown_2dev(void **state)
{
    int rc = nt_test_teardown(state);
    unsetenv("NT_SIM_CORES");
    return rc;
}

#endif
