/* tests/test_mesh.c - the char GPT under a device mesh (examples/gpt_mesh.h,
 * docs/parallel.md "char GPT under a mesh"): a small model of the same
 * code trained at several (dp, tp) splits and ZeRO stages, on both
 * backends and in every mode, gives one CRC-32 of its parameters (with
 * gradient clipping, whose norm is defined over the blocks too), captured
 * and replayed (gptm_captured_step) as op by op; and the
 * errors: mesh sizes that are not the core count, heads, width, vocabulary
 * or blocks that tp does not divide, a ZeRO stage out of range,
 * nt_ddp_backward_group's arguments.  Each run has its own runtime with
 * NT_SIM_CORES = dp x tp.  With --mpi (meson test mesh_mpi) the model over 2
 * processes, the MoE variant at (dp 2, tp 2, ep 2) among them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "mesh_harness.h"

enum { STEPS = 3, SHARDS = MESH_H_SHARDS, BATCH = MESH_H_BATCH, BLOCKS = MESH_H_BLOCKS };
static double CLIP = 0.05; /* small enough that every step clips */
static bool CAPTURE;        /* steps 1.. through gptm_captured_step (recorded, replayed) */
static bool SP;             /* sequence parallelism (gptm_set_sp) */
static bool EVAL_MID;       /* an evaluation before the last step (between replays) */
static int LAYERS;          /* > 0: this many blocks of width 32 (test_release) */
static int RELEASE = -1;    /* 0, 1: gptm_set_release (-1: gptm_init's default) */
static int EXPERTS;         /* > 0: the MoE variant, top-2 of this many experts (mesh_mpi) */
static int EP = 1;          /* its expert parallelism (the cores are dp x tp x EP) */
static int64_t PEAK;        /* the run's largest per-core peak of live bytes (from nt_init) */

static void make_data(gpt_data *d)
{
    mesh_h_data(d);
    assert_int_equal(d->vocab, 10);
}

/* A runtime of 2 cores and the mesh (dp 1, tp 2) at ZeRO stage `zero` in *g,
 * for the tests of what it refuses. */
static void two_core_mesh(gpt_mesh *g, int zero, char *err, size_t en)
{
    setenv("NT_SIM_CORES", "2", 1);
    assert_int_equal(nt_init(), 0);
    gpt_config c = mesh_h_cfg();
    gpt_train_opts o = mesh_h_opts(STEPS, 1);
    assert_int_equal(gptm_init(g, &c, 1, 2, zero, BLOCKS, SHARDS, &o, err, en), 0);
}

/* Trains STEPS steps at (dp, tp, zero) in the runtime nt_init made (the
 * caller's); 0 and *crc, or -1 with err set.  No cmocka here: an mpirun
 * child runs it too. */
static int train(int dp, int tp, int zero, nt_dtype amp, uint32_t *crc, char *err, size_t en)
{
    gpt_data d;
    make_data(&d);
    gpt_config c = mesh_h_cfg();
    if (LAYERS)
        c.n_layer = LAYERS, c.width = 32;
    gpt_train_opts o = mesh_h_opts(STEPS, 1);
    o.amp = amp;
    o.clip = CLIP;
    static gpt_mesh g;
    int rc = gptm_init_moe(&g, &c, dp, tp, EXPERTS ? EP : 1, EXPERTS, EXPERTS ? 2 : 0, zero,
                           BLOCKS, SHARDS, &o, err, en);
    if (!rc && SP)
        rc = gptm_set_sp(&g, true, err, en);
    if (!rc && RELEASE >= 0)
        rc = gptm_set_release(&g, RELEASE, err, en);
    int32_t xb[BATCH * 8], yb[BATCH * 8];
    gptm_capture cap = {0};
    /* the loss sum rewritten in place by every replay */
    nt_tensor *loss_sum = CAPTURE && !rc ? nt_zeros(NT_F32, 0, NULL) : NULL;
    for (int st = 0; st < STEPS && !rc; st++) {
        if (EVAL_MID && st == STEPS - 1 && isnan(gptm_eval(&g, &d, &o, 1))) {
            rc = gptm_fail(err, en, "eval before step %d: %s", st, nt_last_error_message());
            break;
        }
        gpt_batch(&d, false, o.seed, st, BATCH, c.context, xb, yb);
        if (CAPTURE && st > 0 ? gptm_captured_step(&g, &o, xb, yb, loss_sum, &cap)
                              : gptm_step(&g, &o, xb, yb, loss_sum))
            rc = gptm_fail(err, en, "step %d: %s", st, nt_last_error_message());
    }
    PEAK = 0;
    for (int i = 0; i < nt_device_count() && !rc; i++)
        PEAK = nt_device_bytes_live_peak(i) > PEAK ? nt_device_bytes_live_peak(i) : PEAK;
    nt_graph_info gi;
    if (!rc && CAPTURE && (nt_graph_info_get(cap.graph, &gi) || gi.replays != STEPS - 2))
        rc = gptm_fail(err, en, "the captured step was not replayed %d times", STEPS - 2);
    nt_release(loss_sum);
    gptm_capture_free(&cap);
    if (!rc && isnan(gptm_eval(&g, &d, &o, 1)))
        rc = gptm_fail(err, en, "eval: %s", nt_last_error_message());
    if (!rc)
        rc = gptm_crc(&g, crc, err, en);
    gptm_free(&g);
    gpt_data_free(&d);
    return rc;
}

/* train() at (dp, tp, zero) in test setting cfg, with NT_SIM_CORES = dp x tp
 * (x EP with EXPERTS). */
static uint32_t run(int dp, int tp, int zero, int cfg, nt_dtype amp)
{
    char cores[8], err[512];
    snprintf(cores, sizeof cores, "%d", dp * tp * (EXPERTS ? EP : 1));
    setenv("NT_SIM_CORES", cores, 1);
    assert_int_equal(nt_init(), 0);
    nt_test_cfg(cfg);
    uint32_t crc = 0;
    if (train(dp, tp, zero, amp, &crc, err, sizeof err))
        fail_msg("(dp %d, tp %d, zero %d): %s", dp, tp, zero, err);
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
    return crc;
}

/* Every split of the target at one stage each (all four stages among them)
 * and every stage at (2, 2), on the simulator (adaptive); (1, 1) and (2, 4)
 * in every backend and mode; all one CRC. */
static void test_bitwise(void **state)
{
    (void)state;
    static const int runs[][4] = {
        /* dp, tp, zero, cfg (nt_test.h: 3 sim adaptive) */
        {1, 1, 0, 3}, {2, 1, 1, 3}, {1, 2, 2, 3}, {2, 2, 3, 3}, {4, 2, 0, 3}, {2, 4, 2, 3},
        {8, 1, 3, 3}, {2, 2, 0, 3}, {2, 2, 1, 3}, {2, 2, 2, 3},
        {1, 1, 0, 0}, {1, 1, 0, 1}, {1, 1, 0, 2}, {1, 1, 0, 4}, {1, 1, 0, 5}, {1, 1, 0, 6},
        {1, 1, 0, 7}, {2, 4, 3, 0}, {2, 4, 1, 1}, {2, 4, 2, 2}, {2, 4, 3, 4}, {2, 4, 0, 5},
        {2, 4, 1, 6}, {2, 4, 3, 7},
    };
    enum { NR = sizeof runs / sizeof runs[0] };
    uint32_t first = 0;
    printf("# parameters after %d AdamW steps (crc32)\n", STEPS);
    for (int i = 0; i < NR; i++) {
        const int *r = runs[i];
        uint32_t crc = run(r[0], r[1], r[2], r[3], NT_DTYPE_COUNT);
        printf("# (dp %d, tp %d) zero %d %-4s %-14s %08x\n", r[0], r[1], r[2],
               NT_TEST_CFGS[r[3]][0], NT_TEST_CFGS[r[3]][1], crc);
        fflush(stdout);
        if (i == 0)
            first = crc;
        else if (crc != first)
            fail_msg("(dp %d, tp %d) zero %d on %s %s gives %08x; (1, 1) gave %08x", r[0], r[1],
                     r[2], NT_TEST_CFGS[r[3]][0], NT_TEST_CFGS[r[3]][1], crc, first);
    }
}

/* bf16 autocast: one CRC for (1, 1), (2, 2) and (2, 4) (its own). */
static void test_bitwise_bf16(void **state)
{
    (void)state;
    uint32_t a = run(1, 1, 0, 3, NT_BF16), b = run(2, 2, 2, 3, NT_BF16),
             c = run(2, 4, 3, 0, NT_BF16);
    printf("# bf16 autocast: %08x %08x %08x\n", a, b, c);
    assert_true(a == b && a == c);
}

/* Clipping: a bound no norm reaches scales by exactly 1 (the CRC of no
 * clipping), the small one of the other tests changes the parameters. */
static void test_clip(void **state)
{
    (void)state;
    CLIP = 0;
    uint32_t none = run(2, 2, 2, 3, NT_DTYPE_COUNT);
    CLIP = 1e9;
    uint32_t big = run(2, 2, 2, 3, NT_DTYPE_COUNT);
    CLIP = 0.05;
    uint32_t small = run(2, 2, 2, 3, NT_DTYPE_COUNT);
    printf("# clip none %08x, 1e9 %08x, 0.05 %08x\n", none, big, small);
    assert_true(none == big);
    assert_true(small != none);
}

/* --capture (gptm_captured_step: the second step recorded over every
 * core with nt_graph_capture_begin_multi, the later ones replayed): the
 * CRC of the steps op by op, at three splits, four stages and both
 * backends, with and without sequence parallelism; and what it refuses
 * (gptm_capture_refusal) names the option. */
static void test_capture(void **state)
{
    (void)state;
    static const int runs[][4] = {
        {1, 1, 0, 3}, {2, 2, 1, 3}, {2, 4, 2, 3}, {2, 2, 3, 3}, {2, 2, 0, 2}, {2, 4, 3, 0},
        {2, 2, 2, 3}, /* with sequence parallelism */
    };
    enum { NR = sizeof runs / sizeof runs[0] };
    for (int i = 0; i < NR; i++) {
        const int *r = runs[i];
        SP = i == NR - 1;
        uint32_t plain = run(r[0], r[1], r[2], r[3], NT_DTYPE_COUNT);
        CAPTURE = true;
        uint32_t cap = run(r[0], r[1], r[2], r[3], NT_DTYPE_COUNT);
        CAPTURE = false;
        printf("# (dp %d, tp %d) zero %d %-4s %-14s%s op by op %08x captured %08x\n", r[0],
               r[1], r[2], NT_TEST_CFGS[r[3]][0], NT_TEST_CFGS[r[3]][1], SP ? " sp" : "", plain,
               cap);
        fflush(stdout);
        if (cap != plain)
            fail_msg("(dp %d, tp %d) zero %d on %s %s: captured %08x, op by op %08x", r[0],
                     r[1], r[2], NT_TEST_CFGS[r[3]][0], NT_TEST_CFGS[r[3]][1], cap, plain);
    }
    SP = false;
    /* ZeRO stage 3 with an evaluation between the capture and the replay: the
     * evaluation's gathered parameters are stale once the replay updated the
     * shards, and the next gather must make them again (dist/ddp.c, gver) */
    EVAL_MID = true;
    uint32_t plain3 = run(2, 2, 3, 3, NT_DTYPE_COUNT);
    CAPTURE = true;
    uint32_t cap3 = run(2, 2, 3, 3, NT_DTYPE_COUNT);
    CAPTURE = EVAL_MID = false;
    uint32_t none3 = run(2, 2, 3, 3, NT_DTYPE_COUNT);
    printf("# (dp 2, tp 2) zero 3, an evaluation between replays: op by op %08x captured %08x "
           "(no evaluation %08x)\n", plain3, cap3, none3);
    assert_true(cap3 == plain3 && plain3 == none3);
    /* the refusals */
    char err[512];
    static gpt_mesh g;
    two_core_mesh(&g, 0, err, sizeof err);
    gpt_config c = mesh_h_cfg();
    gpt_train_opts o = mesh_h_opts(STEPS, 1);
    assert_null(gptm_capture_refusal(&g));
    assert_int_equal(gptm_set_dropout(&g, 0.1, err, sizeof err), 0);
    const char *why = gptm_capture_refusal(&g);
    assert_non_null(why);
    assert_non_null(strstr(why, "--dropout"));
    assert_int_equal(gptm_set_dropout(&g, 0, err, sizeof err), 0);
    assert_int_equal(gptm_set_sp(&g, true, err, sizeof err), 0);
    assert_null(gptm_capture_refusal(&g)); /* sp is captured */
    gptm_free(&g);
    assert_int_equal(gptm_init_moe(&g, &c, 1, 1, 2, 4, 2, 0, BLOCKS, SHARDS, &o, err, sizeof err),
                     0);
    assert_non_null((why = gptm_capture_refusal(&g)));
    assert_non_null(strstr(why, "--ep"));
    gptm_free(&g);
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

/* ZeRO stage 3 at tp 1 (gptm_set_release, on by default at stage 3): each
 * block's four weights gathered one block ahead of its forward and released
 * after it (nt_ddp_layer_done), the shards in rounds of one a device
 * (nt_ddp_backward_shards).  A 4-block model of width 32 (a block's
 * weights 48 KiB, most of P): at dp 1, 2, 4 and 8, on both backends in
 * several modes, with sequence parallelism and bf16 autocast, the CRC of
 * stage 0 at (1, 1) (its own for sp and bf16); and at dp 4 the per-core
 * peak of live bytes falls by at least two blocks' weights against the
 * run keeping every block gathered (gptm_set_release off, the shard by
 * shard loop).  Then gptm_set_release's default and refusal. */
static void test_release(void **state)
{
    (void)state;
    LAYERS = 4;
    const double block = 4.0 * 12 * 32 * 32;
    uint32_t ref = run(1, 1, 0, 3, NT_DTYPE_COUNT);
    static const int runs[][3] = {/* dp, cfg (nt_test.h), 1: also without the release */
                                  {4, 1, 1}, {4, 0, 1}, {1, 3, 0}, {2, 3, 0}, {8, 3, 0},
                                  {4, 3, 0}, {4, 2, 0}, {2, 5, 0}, {8, 7, 0}, {4, 6, 0}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const int *r = runs[i];
        uint32_t on = run(r[0], 1, 3, r[1], NT_DTYPE_COUNT);
        int64_t peak_on = PEAK;
        printf("# 4 blocks, (dp %d, tp 1) zero 3 %-4s %-14s released %08x (stage 0 %08x), "
               "per-core peak %.3f MiB", r[0], NT_TEST_CFGS[r[1]][0], NT_TEST_CFGS[r[1]][1], on,
               ref, peak_on / 1048576.0);
        if (r[2]) {
            RELEASE = 0;
            uint32_t off = run(r[0], 1, 3, r[1], NT_DTYPE_COUNT);
            RELEASE = -1;
            printf(", kept %08x %.3f MiB (a block's weights %.3f MiB)", off, PEAK / 1048576.0,
                   block / 1048576.0);
            if (off != ref || (double)peak_on > (double)PEAK - 2 * block)
                fail_msg("dp %d: kept %08x peak %lld; released peak %lld", r[0], off,
                         (long long)PEAK, (long long)peak_on);
        }
        printf("\n");
        fflush(stdout);
        if (on != ref)
            fail_msg("(dp %d, tp 1) zero 3 on %s %s with the release: %08x; stage 0 %08x", r[0],
                     NT_TEST_CFGS[r[1]][0], NT_TEST_CFGS[r[1]][1], on, ref);
    }
    SP = true;
    uint32_t sp0 = run(1, 1, 0, 3, NT_DTYPE_COUNT), sp3 = run(4, 1, 3, 3, NT_DTYPE_COUNT);
    SP = false;
    uint32_t bf0 = run(1, 1, 0, 3, NT_BF16), bf3 = run(4, 1, 3, 3, NT_BF16);
    printf("# sp: stage 0 %08x, released %08x; bf16: stage 0 %08x, released %08x\n", sp0, sp3,
           bf0, bf3);
    assert_true(sp0 == sp3 && bf0 == bf3);
    LAYERS = 0;
    /* the refusal: another stage; on by default at stage 3, tp 2 too */
    char err[512];
    static gpt_mesh g;
    two_core_mesh(&g, 3, err, sizeof err);
    gpt_config c = mesh_h_cfg();
    gpt_train_opts o = mesh_h_opts(STEPS, 1);
    assert_true(g.release); /* two tensor ranks: released too */
    assert_int_equal(gptm_set_release(&g, false, err, sizeof err), 0);
    assert_false(g.release);
    assert_int_equal(gptm_set_release(&g, true, err, sizeof err), 0);
    assert_true(g.release);
    gptm_free(&g);
    assert_int_equal(gptm_init(&g, &c, 2, 1, 2, BLOCKS, SHARDS, &o, err, sizeof err), 0);
    assert_false(g.release);
    assert_int_equal(gptm_set_release(&g, true, err, sizeof err), -1);
    assert_non_null(strstr(err, "gptm_set_release: "));
    assert_non_null(strstr(err, "needs --zero 3 (got --zero 2)"));
    assert_false(g.release);
    gptm_free(&g);
    assert_int_equal(gptm_init(&g, &c, 2, 1, 3, BLOCKS, SHARDS, &o, err, sizeof err), 0);
    assert_true(g.release);
    gptm_free(&g);
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

/* ZeRO stage 3 with tensor parallelism (gptm_set_release at tp > 1): the
 * round of one shard a tensor group, each block's weights released in
 * every tensor rank's nt_ddp after every group's forward of it, gathered
 * again (prefetched) for its backward, one pass over the groups' joined
 * losses (nt_ddp_backward_group_shards).  The 4-block model of
 * test_release at (dp, tp) (1, 2), (2, 2), (4, 2), (2, 4) on both backends
 * and several modes, with sp and bf16: the CRC of stage 0 at (1, 1); at
 * (2, 2) and (4, 2), deterministic (the adaptive mode's peaks move from run
 * to run), the release off gives it too, and the per-core peak of live
 * bytes with the release is below the one without by at least two blocks'
 * weights of a tensor rank.  (Before the release was built for
 * tp > 1, gptm_set_release(true) refused these meshes.) */
static void test_release_tp(void **state)
{
    (void)state;
    LAYERS = 4;
    const double block = 4.0 * 12 * 32 * 32;
    uint32_t ref = run(1, 1, 0, 3, NT_DTYPE_COUNT);
    static const int runs[][4] = {/* dp, tp, cfg (nt_test.h), 1: also without the release */
                                  {2, 2, 1, 1}, {4, 2, 0, 1}, {1, 2, 3, 0}, {2, 2, 7, 0},
                                  {2, 4, 5, 0}, {2, 2, 4, 0}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const int *r = runs[i];
        RELEASE = 1;
        uint32_t on = run(r[0], r[1], 3, r[2], NT_DTYPE_COUNT);
        int64_t peak_on = PEAK;
        printf("# 4 blocks, (dp %d, tp %d) zero 3 %-4s %-14s released %08x (stage 0 %08x), "
               "per-core peak %.3f MiB", r[0], r[1], NT_TEST_CFGS[r[2]][0],
               NT_TEST_CFGS[r[2]][1], on, ref, peak_on / 1048576.0);
        if (r[3]) {
            RELEASE = 0;
            uint32_t off = run(r[0], r[1], 3, r[2], NT_DTYPE_COUNT);
            printf(", kept %08x %.3f MiB (a tensor rank's block %.3f MiB)", off,
                   PEAK / 1048576.0, block / r[1] / 1048576.0);
            if (off != ref || (double)peak_on > (double)PEAK - 2 * block / r[1])
                fail_msg("(dp %d, tp %d): kept %08x peak %lld; released peak %lld", r[0], r[1],
                         off, (long long)PEAK, (long long)peak_on);
        }
        RELEASE = -1;
        printf("\n");
        fflush(stdout);
        if (on != ref)
            fail_msg("(dp %d, tp %d) zero 3 on %s %s with the release: %08x; stage 0 %08x",
                     r[0], r[1], NT_TEST_CFGS[r[2]][0], NT_TEST_CFGS[r[2]][1], on, ref);
    }
    SP = true;
    uint32_t sp0 = run(1, 1, 0, 3, NT_DTYPE_COUNT), sp3 = run(2, 2, 3, 3, NT_DTYPE_COUNT);
    SP = false;
    uint32_t bf0 = run(1, 1, 0, 3, NT_BF16), bf3 = run(2, 2, 3, 3, NT_BF16);
    printf("# sp: stage 0 %08x, (2, 2) released %08x; bf16: stage 0 %08x, (2, 2) released "
           "%08x\n", sp0, sp3, bf0, bf3);
    assert_true(sp0 == sp3 && bf0 == bf3);
    LAYERS = 0;
}

/* gptm_init's errors, with the runtime of `cores` cores. */
static void expect_init_err(int cores, gpt_config c, int dp, int tp, int zero, int blocks,
                            const char *want1, const char *want2)
{
    char buf[8], err[512] = "";
    snprintf(buf, sizeof buf, "%d", cores);
    setenv("NT_SIM_CORES", buf, 1);
    assert_int_equal(nt_init(), 0);
    gpt_train_opts o = mesh_h_opts(STEPS, 1);
    static gpt_mesh g;
    assert_int_equal(gptm_init(&g, &c, dp, tp, zero, blocks, SHARDS, &o, err, sizeof err), -1);
    gptm_free(&g);
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fail_msg("error '%s'; expected '%s' and '%s'", err, want1, want2 ? want2 : "");
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

static void test_errors(void **state)
{
    (void)state;
    gpt_config c = mesh_h_cfg();
    /* a mesh whose size is not the core count */
    expect_init_err(4, c, 2, 1, 0, BLOCKS, "nt_mesh_create", "has 2 ranks but there are 4");
    expect_init_err(4, c, 4, 2, 0, BLOCKS, "nt_mesh_create", "has 8 ranks but there are 4");
    /* heads, width, vocabulary, blocks that tp does not divide */
    expect_init_err(3, c, 1, 3, 0, 12, "--heads (4) must be a multiple of --tp (3)", NULL);
    gpt_config w = c;
    w.width = 18;
    expect_init_err(2, w, 1, 2, 0, BLOCKS, "--width (18) must be a multiple of --heads (4)",
                    NULL);
    gpt_config v = c;
    v.vocab = 10;
    expect_init_err(4, v, 1, 4, 0, BLOCKS, "vocabulary (10) must be a multiple of --tp (4)",
                    NULL);
    v.vocab = 14;
    expect_init_err(2, v, 1, 2, 0, BLOCKS, "vocabulary (14) must be a multiple of --blocks (4)",
                    NULL);
    expect_init_err(2, c, 1, 2, 0, 6, "--blocks (6) must be a multiple of --tp (2)", NULL);
    /* ZeRO out of range */
    expect_init_err(1, c, 1, 1, 4, BLOCKS, "--zero must be 0, 1, 2 or 3 (got 4)", NULL);
    expect_init_err(1, c, 1, 1, -1, BLOCKS, "--zero must be 0, 1, 2 or 3 (got -1)", NULL);
    /* shards the data dimension does not divide */
    expect_init_err(3, c, 3, 1, 0, BLOCKS, "--shards (8) must be a multiple of --dp (3)", NULL);
}

/* nt_ddp_backward_group's arguments. */
static void test_backward_group_errors(void **state)
{
    (void)state;
    setenv("NT_SIM_CORES", "2", 1);
    assert_int_equal(nt_init(), 0);
    float v[4] = {1, 2, 3, 4};
    nt_tensor *p = nt_from_host(v, NT_F32, 1, (int64_t[]){4});
    assert_int_equal(nt_set_requires_grad(p, true), 0);
    nt_ddp *d = nt_ddp_create(&p, 1, 2, (int[]){0, 1}, 2);
    assert_non_null(d);
    nt_tensor *loss = nt_sum(nt_ddp_params(d, 0)[0], NT_DIM_ALL, false);
    nt_test_expect_err(nt_ddp_backward_group(NULL, 1, 0, loss), NT_EINVAL,
                       "nt_ddp_backward_group", "'ds' is NULL");
    nt_test_expect_err(nt_ddp_backward_group(&d, 0, 0, loss), NT_EINVAL,
                       "nt_ddp_backward_group", "'nd'");
    nt_ddp *two[2] = {d, d};
    nt_test_expect_err(nt_ddp_backward_group(two, 2, 0, loss), NT_EINVAL,
                       "nt_ddp_backward_group", "same nt_ddp at 0 and 1");
    nt_test_expect_err(nt_ddp_backward_group(&d, 1, 5, loss), NT_EINVAL,
                       "nt_ddp_backward_group", "'shard' is 5");
    nt_test_expect_err(nt_ddp_backward_group(&d, 1, 1, loss), NT_EINVAL,
                       "nt_ddp_backward_group", "'loss' is on device 0", "device 1");
    nt_test_expect_err(nt_ddp_backward_group(&d, 1, 0, NULL), NT_EINVAL,
                       "nt_ddp_backward_group", "loss");
    /* still works, once per shard */
    assert_int_equal(nt_ddp_backward_group(&d, 1, 0, loss), 0);
    nt_test_expect_err(nt_ddp_backward_group(&d, 1, 0, loss), NT_ESTATE,
                       "nt_ddp_backward_group", "shard 0 already");
    nt_release(loss);
    nt_ddp_destroy(d);
    nt_release(p);
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

/* nt_ddp_backward_group_shards: two nt_ddps (tensor ranks 0 and 1, one
 * parameter p_r of 4 each) over devices {0, 1} and {2, 3}, 2 shards; group
 * k (devices k and 2 + k) computes shard k's loss, the join of member r's
 * sum(p_r * c_k).  After the one backward and the reduces each replica's
 * .grad is the mean of c_0 and c_1 (every member's loss gets the gradient
 * 1, nt_tp_join), written out by hand below.  Before it, the bad arguments:
 * each a clear error naming the call and the argument, nothing changed
 * (the call then works, once a shard). */
static void test_backward_group_shards(void **state)
{
    (void)state;
    setenv("NT_SIM_CORES", "5", 1);
    assert_int_equal(nt_init(), 0);
    const char *fn = "nt_ddp_backward_group_shards";
    float v[4] = {1, 2, 3, 4}, cv[2][4] = {{0.5f, -1, 2, 3}, {1.5f, 4, -2, 0.25f}};
    nt_tensor *p[2];
    nt_ddp *d[2];
    for (int r = 0; r < 2; r++) {
        nt_device_set(2 * r);
        p[r] = nt_from_host(v, NT_F32, 1, (int64_t[]){4});
        assert_int_equal(nt_set_requires_grad(p[r], true), 0);
        d[r] = nt_ddp_create(&p[r], 1, 2, (int[]){2 * r, 2 * r + 1}, 2);
        assert_non_null(d[r]);
    }
    nt_tensor *loss[2], *part[2];
    nt_comm *c[2];
    for (int k = 0; k < 2; k++) {
        assert_non_null(c[k] = nt_comm_create((int[]){k, 2 + k}, 2));
        for (int r = 0; r < 2; r++) {
            nt_device_set(2 * r + k);
            nt_tensor *ck = nt_from_host(cv[k], NT_F32, 1, (int64_t[]){4});
            part[r] = nt_sum(nt_mul(nt_ddp_params(d[r], 2 * r + k)[0], ck), NT_DIM_ALL, false);
        }
        nt_device_set(k);
        assert_non_null(loss[k] = nt_tp_join(c[k], part));
    }
    int sh[2] = {0, 1}, swapped[2] = {1, 0}, far[2] = {0, 7};
    nt_ddp *same[2] = {d[0], d[0]}, *rev[2] = {d[1], d[0]};
    nt_tensor *lswap[2] = {loss[1], loss[0]};
    nt_test_expect_err(nt_ddp_backward_group_shards(NULL, 2, sh, loss, 2), NT_EINVAL, fn,
                       "'ds' is NULL");
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 0, sh, loss, 2), NT_EINVAL, fn, "'nd'");
    nt_test_expect_err(nt_ddp_backward_group_shards(same, 2, sh, loss, 2), NT_EINVAL, fn,
                       "same nt_ddp at 0 and 1");
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 2, NULL, loss, 2), NT_EINVAL, fn,
                       "'shards' is NULL");
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 2, sh, NULL, 2), NT_EINVAL, fn,
                       "'losses' is NULL");
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 2, sh, loss, 1), NT_EINVAL, fn,
                       "'n' is 1", "expected 2");
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 2, swapped, loss, 2), NT_EINVAL, fn,
                       "'shards[0]' is 1", "another device", "local device 0");
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 2, far, loss, 2), NT_EINVAL, fn,
                       "'shards[1]' is 7", "< 2");
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 2, sh, lswap, 2), NT_EINVAL, fn,
                       "'losses[0]' is on device 1", "shard 0 belongs to device 0");
    /* ds[0]'s losses must be on ds[0]'s devices: d[1] first names them */
    nt_test_expect_err(nt_ddp_backward_group_shards(rev, 2, sh, loss, 2), NT_EINVAL, fn,
                       "'losses[0]' is on device 0", "device 2");
    /* a group member with another local device count, or whose device i
     * computes another shard */
    nt_device_set(4);
    nt_tensor *q = nt_from_host(v, NT_F32, 1, (int64_t[]){4});
    assert_int_equal(nt_set_requires_grad(q, true), 0);
    /* odd: 4 shards over its 2 devices, so its device 1 computes shards 2, 3 */
    nt_ddp *one = nt_ddp_create(&q, 1, 2, (int[]){4}, 1), *odd = nt_ddp_create(&q, 1, 4,
                                                                          (int[]){4, 3}, 2);
    nt_ddp *g1[2] = {d[0], one}, *g4[2] = {d[0], odd};
    assert_non_null(one);
    assert_non_null(odd);
    nt_test_expect_err(nt_ddp_backward_group_shards(g1, 2, sh, loss, 2), NT_EINVAL, fn,
                       "'ds[1]' has 1 local devices", "ds[0] 2");
    nt_test_expect_err(nt_ddp_backward_group_shards(g4, 2, sh, loss, 2), NT_EINVAL, fn,
                       "'shards[1]' is 1", "another device", "for ds[1]");
    nt_ddp_destroy(odd);
    nt_ddp_destroy(one);
    nt_release(q);
    /* nothing changed: the call works, once a shard */
    assert_int_equal(nt_ddp_backward_group_shards(d, 2, sh, loss, 2), 0);
    nt_test_expect_err(nt_ddp_backward_group_shards(d, 2, sh, loss, 2), NT_ESTATE, fn,
                       "shard 0 already");
    float want[4], got[4];
    for (int i = 0; i < 4; i++)
        want[i] = (cv[0][i] + cv[1][i]) * 0.5f;
    for (int r = 0; r < 2; r++) {
        assert_int_equal(nt_ddp_reduce(d[r]), 0);
        for (int k = 0; k < 2; k++) {
            nt_tensor *gr = nt_grad(nt_ddp_params(d[r], 2 * r + k)[0]);
            assert_non_null(gr);
            assert_int_equal(nt_to_host(gr, got, sizeof got), 0);
            assert_memory_equal(got, want, sizeof got);
            nt_release(gr);
        }
    }
    for (int k = 0; k < 2; k++) {
        nt_release(loss[k]);
        nt_comm_destroy(c[k]);
    }
    for (int r = 0; r < 2; r++) {
        nt_ddp_destroy(d[r]);
        nt_release(p[r]);
    }
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

/* ---------------- over 2 processes (mpirun) ---------------- */

/* mpirun -np 2 of this program at (dp, tp, ep, zero) with `experts` experts
 * (0: the dense MLP, ep 1) and `cores` cores a process: the CRC process 0
 * printed. */
static uint32_t mpi_crc(int cores, int dp, int tp, int ep, int zero, int experts)
{
    char args[64];
    snprintf(args, sizeof args, "%d %d %d %d %d", dp, tp, zero, ep, experts);
    uint32_t crc = 0;
    if (mesh_h_mpi_run(cores, args, &crc, NULL, 0))
        fail_msg("mpirun at (dp %d, tp %d, ep %d, zero %d), %d experts, gave no CRC", dp, tp,
                 ep, zero, experts);
    return crc;
}

/* (2, 1) over 2 processes of 1 core at stages 0 and 3, and (2, 2) over 2
 * processes of 2 cores at stage 2, give the one-process CRC; the MoE
 * variant (top-2 of 8 experts) at (dp 2, tp 2, ep 2) stage 1 over 2
 * processes of 4 cores (one MoE group, tp x ep, a process) gives the CRC of
 * its dense loop over the experts on one core (ep 1), another than the
 * dense MLP's. */
static void test_across_processes(void **state)
{
    (void)state;
    uint32_t ref = run(1, 1, 0, 3, NT_DTYPE_COUNT);
    EXPERTS = 8;
    uint32_t moe = run(1, 1, 0, 3, NT_DTYPE_COUNT);
    EXPERTS = 0;
    assert_true(moe != ref);
    static const int runs[][6] = {
        /* cores a process, dp, tp, ep, zero, experts */
        {1, 2, 1, 1, 0, 0}, {1, 2, 1, 1, 3, 0}, {2, 2, 2, 1, 2, 0}, {4, 2, 2, 2, 1, 8},
    };
    for (int i = 0; i < 4; i++) {
        const int *r = runs[i];
        uint32_t crc = mpi_crc(r[0], r[1], r[2], r[3], r[4], r[5]);
        uint32_t want = r[5] ? moe : ref;
        printf("# 2 processes x %d cores, (dp %d, tp %d, ep %d) zero %d, %d experts: %08x "
               "(1 process %08x)\n", r[0], r[1], r[2], r[3], r[4], r[5], crc, want);
        assert_true(crc == want);
    }
}

/* An mpirun child: trains (with `experts` > 0 the MoE variant at ep), process
 * 0 prints "crc X". */
static int child(int dp, int tp, int zero, int ep, int experts)
{
    EXPERTS = experts;
    EP = ep;
    char err[512];
    uint32_t crc = 0;
    if (nt_init() || train(dp, tp, zero, NT_DTYPE_COUNT, &crc, err, sizeof err)) {
        fprintf(stderr, "child: %s\n", nt_last_error() ? nt_last_error_message() : err);
        return 1;
    }
    if (nt_process_rank() == 0)
        printf("crc %08x\n", crc);
    nt_shutdown();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--child"))
        return child(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    if (argc == 3 && !strcmp(argv[1], "--mpi")) {
        const struct CMUnitTest mpi_tests[] = {cmocka_unit_test(test_across_processes)};
        return mesh_h_mpi_main(argv[2], mpi_tests, 1, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_backward_group_errors),
        cmocka_unit_test(test_backward_group_shards),
        cmocka_unit_test(test_bitwise),
        cmocka_unit_test(test_bitwise_bf16),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_capture),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_release_tp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
