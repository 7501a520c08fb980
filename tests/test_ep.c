/* tests/test_ep.c - the MoE variant of the char GPT under a device mesh
 * (examples/gpt_mesh.h gptm_moe, docs/parallel.md "MoE variant of the char
 * GPT"): every block's MLP a mixture of experts split over the tensor x
 * expert block.  A small model trained at ep 1, 2, 4 and 8 and tp 1, 2, 4
 * (tp x ep dividing 8; with dp and ZeRO stages among them), on both
 * backends and in every mode, gives one CRC-32 of its parameters; ep 1 is
 * the dense loop over the experts on one core (nt_moe_mlp at one member,
 * checked against that loop in test_moe.c); top-1 routing and 4 experts
 * give other parameters (at ep 1 and 2 alike).  Clipping's sums of squares
 * are the same bits at every (tp, ep), 6 experts too (3 a member at ep 2).
 * And the errors: experts not divisible by tp x ep, topk out of range, too
 * many experts, ep not dividing the cores, tp x ep not dividing the fixed
 * token blocks, the cores not dp x tp x ep.  Each run has its own runtime
 * with NT_SIM_CORES = dp x tp x ep.  Under --amp bf16 (bf16 experts, an
 * f32 router) one CRC for every split too.  NT_TEST_QUICK=1 (the sanitizer
 * runs) trains fewer splits in test_bitwise and test_amp. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "../examples/gpt_mesh.h"
#include "mesh_harness.h"

enum { STEPS = 3, SHARDS = 8, BATCH = 8, BLOCKS = 4, EXPERTS = 8 };

/* A text of 10 distinct characters (vocabulary padded to 12), another
 * draw than the mesh tests'. */
static void make_data(gpt_data *d)
{
    mesh_h_text(d, 777, 5);
}

static gpt_config small_cfg(void)
{
    return (gpt_config){.n_layer = 2, .n_head = 4, .width = 16, .context = 8, .vocab = 12};
}

static gpt_train_opts small_opts(void)
{
    return (gpt_train_opts){.batch = BATCH, .lr = 1e-2, .clip = 0.05, .steps = STEPS,
                            .warmup = 1, .seed = 5, .amp = NT_DTYPE_COUNT};
}

/* Trains STEPS steps at (dp, tp, ep, zero) with experts / topk; 0 and
 * *crc and the load statistics' total (and, sq not NULL, the first step's
 * clipping sums of squares, [n] floats), or -1 with err set. */
static nt_dtype train_amp = NT_DTYPE_COUNT; /* train's --amp (test_amp) */

static int train(int dp, int tp, int ep, int zero, int experts, int topk, uint32_t *crc,
                 int64_t *assigned, float *sq, char *err, size_t en)
{
    gpt_data d;
    make_data(&d);
    gpt_config c = small_cfg();
    gpt_train_opts o = small_opts();
    o.amp = train_amp;
    static gpt_mesh g;
    int rc = gptm_init_moe(&g, &c, dp, tp, ep, experts, topk, zero, BLOCKS, SHARDS, &o, err,
                           en);
    int32_t xb[BATCH * 8], yb[BATCH * 8];
    for (int st = 0; st < STEPS && !rc; st++) {
        gpt_batch(&d, false, o.seed, st, BATCH, c.context, xb, yb);
        g.clip_sq = st == 0 ? sq : NULL;
        if (gptm_step(&g, &o, xb, yb, NULL))
            rc = gptm_fail(err, en, "step %d: %s", st, nt_last_error_message());
    }
    if (!rc && isnan(gptm_eval(&g, &d, &o, 1)))
        rc = gptm_fail(err, en, "eval: %s", nt_last_error_message());
    if (!rc)
        rc = gptm_crc(&g, crc, err, en);
    if (!rc && assigned) {
        int32_t cnt[EXPERTS];
        rc = nt_to_host(g.load, cnt, sizeof cnt) ? gptm_fail(err, en, "load") : 0;
        *assigned = 0;
        for (int e = 0; e < EXPERTS; e++)
            *assigned += cnt[e];
    }
    gptm_free(&g);
    gpt_data_free(&d);
    return rc;
}

static void cores_env(int n)
{
    char cores[8];
    snprintf(cores, sizeof cores, "%d", n);
    setenv("NT_SIM_CORES", cores, 1);
}

static uint32_t run(int dp, int tp, int ep, int zero, int cfg)
{
    char err[512];
    cores_env(dp * tp * ep);
    assert_int_equal(nt_init(), 0);
    nt_test_cfg(cfg);
    uint32_t crc = 0;
    int64_t n = 0;
    if (train(dp, tp, ep, zero, EXPERTS, 2, &crc, &n, NULL, err, sizeof err))
        fail_msg("(dp %d, tp %d, ep %d, zero %d): %s", dp, tp, ep, zero, err);
    /* every token of every shard, layer and step assigned to topk experts */
    assert_int_equal(n, (int64_t)STEPS * BATCH * 8 * 2 * 2);
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
    return crc;
}

/* ep 1, 2, 4, 8 and tp 1, 2, 4 (with dp 1, 2, 4 and every ZeRO stage
 * among them) on the simulator, adaptive; ep 1 and 4 in every backend and
 * mode, tp 2 in some: one CRC. */
static void test_bitwise(void **state)
{
    (void)state;
    static const int runs[][5] = {
        /* dp, tp, ep, zero, cfg (nt_test.h: 3 sim adaptive) */
        {1, 1, 1, 0, 3}, {1, 1, 2, 0, 3}, {1, 1, 4, 0, 3}, {1, 1, 8, 0, 3}, {2, 1, 2, 1, 3},
        {2, 1, 4, 2, 3}, {4, 1, 2, 3, 3}, {2, 1, 1, 3, 3},
        {1, 1, 1, 0, 0}, {1, 1, 1, 0, 1}, {1, 1, 1, 0, 2}, {1, 1, 1, 0, 4}, {1, 1, 1, 0, 5},
        {1, 1, 1, 0, 6}, {1, 1, 1, 0, 7}, {1, 1, 4, 0, 0}, {1, 1, 4, 1, 1}, {2, 1, 4, 2, 2},
        {1, 1, 4, 3, 4}, {1, 1, 4, 0, 5}, {1, 1, 4, 1, 6}, {1, 1, 4, 3, 7}, {1, 1, 8, 0, 0},
        /* tensor x expert: the MoE group tp x ep */
        {1, 2, 1, 0, 3}, {1, 2, 2, 0, 3}, {1, 2, 4, 0, 3}, {1, 4, 2, 0, 3}, {1, 4, 1, 0, 3},
        {2, 2, 2, 1, 3}, {2, 2, 2, 3, 3}, {2, 4, 1, 3, 3},
        {1, 2, 2, 0, 0}, {1, 2, 2, 2, 4}, {1, 4, 2, 1, 6},
    };
    enum { NR = sizeof runs / sizeof runs[0] };
    uint32_t first = 0;
    printf("# MoE char GPT: parameters after %d AdamW steps (crc32)\n", STEPS);
    for (int i = 0; i < NR; i++) {
        const int *r = runs[i];
        if (getenv("NT_TEST_QUICK") && i >= 2 && !(r[1] == 2 && r[4] == 3))
            continue; /* ep 1, 2 and the tp 2 rows on sim adaptive */
        uint32_t crc = run(r[0], r[1], r[2], r[3], r[4]);
        printf("# (dp %d, tp %d, ep %d) zero %d %-4s %-14s %08x\n", r[0], r[1], r[2], r[3],
               NT_TEST_CFGS[r[4]][0], NT_TEST_CFGS[r[4]][1], crc);
        fflush(stdout);
        if (i == 0)
            first = crc;
        else if (crc != first)
            fail_msg("(dp %d, tp %d, ep %d) zero %d on %s %s gives %08x; ep 1 gave %08x", r[0],
                     r[1], r[2], r[3], NT_TEST_CFGS[r[4]][0], NT_TEST_CFGS[r[4]][1], crc,
                     first);
    }
}

/* The MoE MLP is in the model: top-1 routing, or 4 experts, train other
 * parameters than top-2 of 8 (the same at ep 1 and 2 each). */
static void test_variants(void **state)
{
    (void)state;
    char err[512];
    uint32_t crc[2][3];
    for (int i = 0; i < 2; i++) {
        int ep = i ? 2 : 1;
        for (int v = 0; v < 3; v++) {
            cores_env(ep);
            assert_int_equal(nt_init(), 0);
            nt_test_cfg(3);
            if (train(1, 1, ep, 0, v == 2 ? 4 : EXPERTS, v == 1 ? 1 : 2, &crc[i][v], NULL, NULL,
                      err, sizeof err))
                fail_msg("ep %d variant %d: %s", ep, v, err);
            nt_shutdown();
            unsetenv("NT_SIM_CORES");
        }
    }
    printf("# top-2 of 8 %08x, top-1 of 8 %08x, top-2 of 4 %08x\n", crc[0][0], crc[0][1],
           crc[0][2]);
    assert_memory_equal(crc[0], crc[1], sizeof crc[0]);
    assert_true(crc[0][0] != crc[0][1] && crc[0][0] != crc[0][2] && crc[0][1] != crc[0][2]);
}

/* Clipping's sums of squares (gptm_clip, the first step's) are the
 * same bits at every (tp, ep): with 6 experts, 3 a member at ep 2, whose
 * tree over a member's experts then over the members is not the tree over
 * the 6 (what gptm_clip did before it gathered the experts' sums), and
 * with 8 at the MoE group's sizes. */
static void test_clip_sums(void **state)
{
    (void)state;
    static const int runs[][3] = {
        /* tp, ep, experts */
        {1, 1, 6}, {1, 2, 6}, {2, 1, 6}, {1, 1, 8}, {1, 8, 8}, {2, 2, 8}, {4, 2, 8},
    };
    enum { NR = sizeof runs / sizeof runs[0], MAXN = 64 };
    float sq[NR][MAXN];
    uint32_t crc[NR];
    char err[512];
    int n = 2 + small_cfg().n_layer * (GPTM_N2 + GPTM_N1) + 2; /* the parameters */
    for (int i = 0; i < NR; i++) {
        const int *r = runs[i];
        cores_env(r[0] * r[1]);
        assert_int_equal(nt_init(), 0);
        nt_test_cfg(3);
        memset(sq[i], 0, sizeof sq[i]);
        if (train(1, r[0], r[1], 0, r[2], 2, &crc[i], NULL, sq[i], err, sizeof err))
            fail_msg("(tp %d, ep %d, %d experts): %s", r[0], r[1], r[2], err);
        nt_shutdown();
        unsetenv("NT_SIM_CORES");
        printf("# (tp %d, ep %d) %d experts: crc %08x\n", r[0], r[1], r[2], crc[i]);
    }
    double total = 0;
    for (int j = 0; j < n; j++)
        total += sq[0][j];
    assert_true(n < MAXN && total > 0);
    for (int i = 1; i < NR; i++) {
        int ref = runs[i][2] == runs[0][2] ? 0 : 3;
        for (int j = 0; j < n; j++)
            if (memcmp(&sq[i][j], &sq[ref][j], sizeof(float)))
                fail_msg("(tp %d, ep %d, %d experts): parameter %d's sum of squares %a; "
                         "(tp 1, ep 1) gave %a", runs[i][0], runs[i][1], runs[i][2], j,
                         (double)sq[i][j], (double)sq[ref][j]);
        assert_int_equal(crc[i], crc[ref]);
    }
}

/* --amp bf16 (the experts in bf16, the router and the rest of the MoE MLP
 * in f32; the tensor-parallel linears as the dense mesh model's): one CRC
 * at every (dp, tp, ep, zero) and mode run, another than f32's. */
static void test_amp(void **state)
{
    (void)state;
    static const int runs[][5] = {
        /* dp, tp, ep, zero, cfg */
        {1, 1, 1, 0, 3}, {1, 1, 2, 0, 3}, {1, 1, 8, 0, 3}, {1, 2, 2, 0, 3}, {2, 2, 2, 1, 3},
        {2, 4, 1, 3, 3}, {1, 1, 1, 0, 0}, {1, 2, 4, 2, 0}, {1, 1, 4, 0, 6}, {1, 2, 2, 1, 4},
    };
    enum { NR = sizeof runs / sizeof runs[0] };
    uint32_t first = 0, f32 = run(1, 1, 1, 0, 3);
    train_amp = NT_BF16;
    for (int i = 0; i < (getenv("NT_TEST_QUICK") ? 4 : NR); i++) {
        const int *r = runs[i];
        uint32_t crc = run(r[0], r[1], r[2], r[3], r[4]);
        printf("# --amp bf16 (dp %d, tp %d, ep %d) zero %d %-4s %-14s %08x\n", r[0], r[1], r[2],
               r[3], NT_TEST_CFGS[r[4]][0], NT_TEST_CFGS[r[4]][1], crc);
        fflush(stdout);
        first = i ? first : crc;
        if (crc != first) {
            train_amp = NT_DTYPE_COUNT;
            fail_msg("--amp bf16 (dp %d, tp %d, ep %d) zero %d on %s %s gives %08x; ep 1 gave "
                     "%08x", r[0], r[1], r[2], r[3], NT_TEST_CFGS[r[4]][0],
                     NT_TEST_CFGS[r[4]][1], crc, first);
        }
    }
    train_amp = NT_DTYPE_COUNT;
    assert_true(first != f32);
}

/* gptm_init_moe's errors with `cores` cores, naming want. */
static void expect_err(int cores, int dp, int tp, int ep, int experts, int topk,
                       const char *want)
{
    char err[512] = "";
    cores_env(cores);
    assert_int_equal(nt_init(), 0);
    gpt_config c = small_cfg();
    gpt_train_opts o = small_opts();
    static gpt_mesh g;
    assert_int_equal(gptm_init_moe(&g, &c, dp, tp, ep, experts, topk, 0, BLOCKS, SHARDS, &o,
                                   err, sizeof err),
                     -1);
    gptm_free(&g);
    if (!strstr(err, want))
        fail_msg("error '%s'; expected '%s'", err, want);
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

static void test_errors(void **state)
{
    (void)state;
    expect_err(4, 1, 1, 4, 6, 2, "--experts (6) must be divisible by --ep (4)");
    expect_err(2, 1, 1, 2, 8, 9, "--topk (9) must be in 1..--experts (8)");
    expect_err(2, 1, 1, 2, 8, 0, "--topk (0) must be in 1..--experts (8)");
    expect_err(6, 1, 1, 4, 8, 2, "--ep (4) must divide the cores (6");
    expect_err(6, 1, 1, 2, 8, 2, "--dp 1 x --ep 2 needs 2 cores; the runtime has 6");
    expect_err(3, 1, 1, 3, 6, 2, "--ep (3) must divide 8");
    expect_err(2, 1, 1, 2, 1024, 2, "--experts (1024) must be at most 512");
    /* with --tp: the MoE group is tp x ep */
    expect_err(4, 1, 2, 2, 6, 2, "--experts (6) must be divisible by --tp x --ep (2 x 2 = 4");
    expect_err(4, 1, 2, 8, 16, 2, "--tp x --ep (2 x 8 = 16, the MoE group) must divide 8");
    expect_err(6, 1, 2, 2, 8, 2, "--dp 1 x --tp 2 x --ep 2 needs 4 cores; the runtime has 6");
    /* autocast to another dtype than bf16 is refused with the MoE MLP */
    char err[512] = "";
    cores_env(2);
    assert_int_equal(nt_init(), 0);
    gpt_config c = small_cfg();
    gpt_train_opts o = small_opts();
    o.amp = NT_F16;
    static gpt_mesh g;
    assert_int_equal(gptm_init_moe(&g, &c, 1, 1, 2, 8, 2, 0, BLOCKS, SHARDS, &o, err,
                                   sizeof err),
                     -1);
    gptm_free(&g);
    assert_non_null(strstr(err, "--amp f16 is not supported"));
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_bitwise),
        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_clip_sums),
        cmocka_unit_test(test_amp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
