/* tests/mesh_harness.h - the small char GPT that the mesh tests train
 * (tests/test_mesh.c, tests/test_meshio.c, tests/test_seqpar.c; tests/test_ep.c
 * takes its text generator): its text,
 * its configuration and training options, and the mpirun plumbing of the
 * ones that also run over 2 processes (meson test mesh_mpi, meshio_mpi):
 * the parent re-executes itself under `mpirun -np 2 <self> --child ...`
 * and reads the "crc X" line process 0 prints. */
#ifndef NT_TESTS_MESH_HARNESS_H
#define NT_TESTS_MESH_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ntensor.h"
#include "../examples/gpt_mesh.h"

enum { MESH_H_BATCH = 8, MESH_H_SHARDS = 8, MESH_H_BLOCKS = 4 };

/* A text of 10 distinct characters (vocabulary padded to 12): every
 * `every`-th one the tenth, the others drawn from nine by a generator
 * seeded with `seed`. */
static inline void mesh_h_text(gpt_data *d, uint64_t seed, int every)
{
    enum { N = 4096 };
    uint8_t *text = malloc(N);
    assert_non_null(text);
    uint64_t s = seed;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        text[i] = (uint8_t)('a' + (i % every == 0 ? 9 : (int)((s >> 33) % 9)));
    }
    gpt_data_from_text(d, text, N);
    assert_non_null(d->ids);
}

/* The mesh tests' text. */
static inline void mesh_h_data(gpt_data *d)
{
    mesh_h_text(d, 12345, 7);
}

static inline gpt_config mesh_h_cfg(void)
{
    return (gpt_config){.n_layer = 1, .n_head = 4, .width = 16, .context = 8, .vocab = 12};
}

/* AdamW at 1e-2 with clipping at 0.05, `steps` steps of MESH_H_BATCH
 * sequences after `warmup`, data seed 3, f32. */
static inline gpt_train_opts mesh_h_opts(int steps, int warmup)
{
    return (gpt_train_opts){.batch = MESH_H_BATCH, .lr = 1e-2, .clip = 0.05, .steps = steps,
                            .warmup = warmup, .seed = 3, .amp = NT_DTYPE_COUNT};
}

/* ---------------- over 2 processes (mpirun) ---------------- */

static const char *mesh_h_mpirun;
static char mesh_h_exe[4096];

/* mpirun -np 2 of this program as `--child args` (`cores` cores a
 * process): 0 and the CRC process 0 printed, or -1 (no CRC or a failed
 * run, its status printed); the children's other lines are echoed as TAP
 * comments, and all of them kept in out[n] if out. */
static inline int mesh_h_mpi_run(int cores, const char *args, uint32_t *crc, char *out,
                                 size_t n)
{
    char cmd[8192], line[1024];
    const char *asan = getenv("ASAN_OPTIONS");
    /* Open MPI's plugins leave allocations at exit (tests/mpi_test.sh) */
    snprintf(cmd, sizeof cmd, "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none "
             "OMPI_MCA_rmaps_base_oversubscribe=1 ASAN_OPTIONS=%s%sdetect_leaks=0 "
             "NT_SIM_CORES=%d timeout 600 %s -np 2 --oversubscribe %s --child %s 2>&1",
             asan ? asan : "", asan ? ":" : "", cores, mesh_h_mpirun, mesh_h_exe, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    bool got = false;
    if (out)
        out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "crc %x", crc) == 1)
            got = true;
        else
            printf("# child: %s", line);
        if (out)
            strncat(out, line, n - strlen(out) - 1);
    }
    int st = pclose(f);
    if (!got || st != 0) {
        printf("# mpirun: %s, status %d\n", got ? "a CRC" : "no CRC", st);
        return -1;
    }
    return 0;
}

/* A test's `--mpi <mpirun|none>` main: a TAP skip without MPI, else the
 * tests with this executable's path kept for mesh_h_mpi_run. */
static inline int mesh_h_mpi_main(const char *arg, const struct CMUnitTest *tests, size_t n,
                                  CMFixtureFunction setup, CMFixtureFunction teardown)
{
    if (!strcmp(arg, "none")) {
        printf("1..0 # SKIP ntensor was built without MPI or mpirun is missing\n");
        return 0;
    }
    ssize_t k = readlink("/proc/self/exe", mesh_h_exe, sizeof mesh_h_exe - 1);
    if (k <= 0)
        return 1;
    mesh_h_exe[k] = '\0';
    mesh_h_mpirun = arg;
    return _cmocka_run_group_tests("mpi_tests", tests, n, setup, teardown);
}

#endif
