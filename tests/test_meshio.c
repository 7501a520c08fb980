/* tests/test_meshio.c - checkpoints of the char GPT under a device mesh
 * (examples/gpt_mesh.h gptm_save / gptm_load, dist/ddp.c
 * nt_ddp_save_split / nt_ddp_load_split; docs/parallel.md "Mesh
 * checkpoints"): the small model of tests/test_mesh.c trained 6 steps
 * uninterrupted against 3 steps, a save, a new runtime, a load and 3 more
 * steps -- under the same layout, and resharded from (dp, tp, zero) =
 * (2, 2, 2) into (1, 1, 0), (4, 2, 3), (2, 4, 1) and back (and the MoE
 * variant over "expert"; with tp 2 x ep 2 resumed under its own (tp, ep)
 * at another dp and stage), on the simulator and the CPU: every run ends
 * on the uninterrupted run's CRC-32 (all mesh layouts share their
 * arithmetic).  And the errors: another layout without reshard, another
 * model, an MoE reshard across tp or ep with tp > 1, no checkpoint, a
 * plain checkpoint, nt_ddp_save_split's and nt_ddp_load_split's
 * arguments.  Each run has its own runtime with
 * NT_SIM_CORES = dp x tp (x ep).  NT_TEST_QUICK=1 runs two layouts of each
 * table (one MoE target).  Under mpirun (meson test meshio_mpi): a save
 * over 2 processes resumed in one and back, and processes that read
 * checkpoints of different layouts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "mesh_harness.h"

enum { STEPS = 6, HALF = 3, SHARDS = MESH_H_SHARDS, BATCH = MESH_H_BATCH, BLOCKS = MESH_H_BLOCKS };

static char dir[256];
static bool in_child; /* an mpirun child: NT_SIM_CORES and the backend from the caller */

/* NT_TEST_QUICK=1 (sanitizer runs): the first two layouts of each table. */
static size_t rows(size_t n)
{
    return getenv("NT_TEST_QUICK") && n > 2 ? 2 : n;
}

/* A run: layout, backend config (nt_test.h), what to load first (NULL:
 * none) and whether to reshard, the steps to train (from the loaded step),
 * where to save after them (NULL: nowhere). */
typedef struct {
    int dp, tp, zero, ep; /* ep > 0: the MoE variant (8 experts, top-2) */
    int cfg;
    const char *load;
    bool reshard;
    int steps;
    const char *save;
} run_spec;

/* The run in its own runtime: 0 and *crc (of the parameters after it),
 * or -1 with err set (by gptm_init, gptm_load, a step or gptm_save). */
static int run_ck(const run_spec *r, uint32_t *crc, char *err, size_t en)
{
    char cores[8];
    int ep = r->ep ? r->ep : 1;
    snprintf(cores, sizeof cores, "%d", r->dp * r->tp * ep);
    if (!in_child) {
        setenv("NT_SIM_CORES", cores, 1);
        assert_int_equal(nt_init(), 0);
        nt_test_cfg(r->cfg);
    } else if (nt_init()) {
        return gptm_fail(err, en, "nt_init: %s", nt_last_error_message());
    }
    gpt_data d;
    mesh_h_data(&d);
    gpt_config c = mesh_h_cfg();
    gpt_train_opts o = mesh_h_opts(STEPS, 2);
    static gpt_mesh g;
    int rc = gptm_init_moe(&g, &c, r->dp, r->tp, ep, r->ep ? 8 : 0, 2, r->zero, BLOCKS, SHARDS,
                           &o, err, en);
    if (!rc && r->load)
        rc = gptm_load(&g, r->load, r->reshard, err, en);
    int64_t start = rc ? 0 : nt_optim_steps(g.opt[0][0]);
    int32_t xb[BATCH * 8], yb[BATCH * 8];
    for (int64_t st = start; st < start + r->steps && !rc; st++) {
        gpt_batch(&d, false, o.seed, st, BATCH, c.context, xb, yb);
        if (gptm_step(&g, &o, xb, yb, NULL))
            rc = gptm_fail(err, en, "step %lld: %s", (long long)st, nt_last_error_message());
    }
    if (!rc && r->save)
        rc = gptm_save(&g, r->save, err, en);
    if (!rc && r->save) { /* once gptm_save returns, on every process: the whole checkpoint */
        int32_t v[GPTM_CK_N], w[GPTM_CK_N];
        rc = gptm_ck_read(r->save, v, err, en);
        gptm_ck_layout(&g, w);
        if (!rc && memcmp(v, w, sizeof v))
            rc = gptm_fail(err, en, "'%s' holds another layout when gptm_save returns", r->save);
    }
    if (!rc)
        rc = gptm_crc(&g, crc, err, en);
    gptm_free(&g);
    gpt_data_free(&d);
    nt_shutdown();
    if (!in_child)
        unsetenv("NT_SIM_CORES");
    return rc;
}

static uint32_t run_ok(run_spec r)
{
    char err[1024];
    uint32_t crc = 0;
    if (run_ck(&r, &crc, err, sizeof err))
        fail_msg("(dp %d, tp %d, zero %d, ep %d) load %s: %s", r.dp, r.tp, r.zero, r.ep,
                 r.load ? r.load : "-", err);
    return crc;
}

static void path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

/* The same layout: 3 + save + load + 3 == 6, at each ZeRO stage, tp 1, 2,
 * 4, on the simulator and the CPU. */
static void test_resume_same(void **state)
{
    (void)state;
    static const int lay[][4] = {
        /* dp, tp, zero, cfg (nt_test.h: 3 sim adaptive, 2 cpu adaptive) */
        {1, 1, 0, 3}, {2, 2, 2, 3}, {4, 2, 3, 3}, {2, 4, 1, 3}, {2, 2, 2, 2}, {1, 1, 0, 2},
    };
    uint32_t ref = 0;
    for (size_t i = 0; i < rows(sizeof lay / sizeof lay[0]); i++) {
        const int *l = lay[i];
        char ck[300];
        path(ck, sizeof ck, "same");
        uint32_t whole = run_ok((run_spec){l[0], l[1], l[2], 0, l[3], NULL, false, STEPS, NULL});
        run_ok((run_spec){l[0], l[1], l[2], 0, l[3], NULL, false, HALF, ck});
        uint32_t resumed = run_ok((run_spec){l[0], l[1], l[2], 0, l[3], ck, false, HALF, NULL});
        printf("# (dp %d, tp %d, zero %d) %s: %d steps %08x, %d + save + load + %d %08x\n",
               l[0], l[1], l[2], NT_TEST_CFGS[l[3]][0], STEPS, whole, HALF, HALF, resumed);
        assert_true(whole == resumed);
        if (i == 0)
            ref = whole;
        assert_true(whole == ref); /* one CRC for every layout and backend */
    }
}

/* A save at (2, 2, 2) after 3 steps, resharded into each target for 2
 * steps, saved, resharded back into (2, 2, 2) for the last step: the
 * uninterrupted run's CRC; and the target's own 3 steps after the first
 * reshard too. */
static void test_reshard(void **state)
{
    (void)state;
    static const int tgt[][4] = {{1, 1, 0, 3}, {4, 2, 3, 3}, {2, 4, 1, 3}, {1, 1, 0, 2},
                                 {2, 4, 1, 2}};
    uint32_t ref = run_ok((run_spec){1, 1, 0, 0, 3, NULL, false, STEPS, NULL});
    char a[300], b[300];
    path(a, sizeof a, "from222");
    path(b, sizeof b, "back");
    for (size_t i = 0; i < rows(sizeof tgt / sizeof tgt[0]); i++) {
        const int *t = tgt[i];
        int cfg = t[3];
        run_ok((run_spec){2, 2, 2, 0, cfg, NULL, false, HALF, a});
        uint32_t there = run_ok((run_spec){t[0], t[1], t[2], 0, cfg, a, true, HALF, NULL});
        run_ok((run_spec){t[0], t[1], t[2], 0, cfg, a, true, 2, b});
        uint32_t back = run_ok((run_spec){2, 2, 2, 0, cfg, b, true, 1, NULL});
        printf("# (2, 2, 2) -> (%d, %d, %d) on %s: %08x; and back: %08x; uninterrupted %08x\n",
               t[0], t[1], t[2], NT_TEST_CFGS[cfg][0], there, back, ref);
        assert_true(there == ref);
        assert_true(back == ref);
    }
}

/* The MoE variant: (dp 2, ep 2, zero 1) resharded into (1, ep 4, 0) and
 * (4, ep 1, 3) and back, against its uninterrupted run. */
static void test_reshard_moe(void **state)
{
    (void)state;
    uint32_t ref = run_ok((run_spec){2, 1, 1, 2, 3, NULL, false, STEPS, NULL});
    char a[300], b[300];
    path(a, sizeof a, "moe");
    path(b, sizeof b, "moeback");
    static const int tgt[][3] = {{1, 0, 4}, {4, 3, 1}};
    for (size_t i = 0; i < (getenv("NT_TEST_QUICK") ? 1u : 2u); i++) {
        const int *t = tgt[i];
        run_ok((run_spec){2, 1, 1, 2, 3, NULL, false, HALF, a});
        run_ok((run_spec){t[0], 1, t[1], t[2], 3, a, true, 2, b});
        uint32_t back = run_ok((run_spec){2, 1, 1, 2, 3, b, true, 1, NULL});
        printf("# MoE (dp 2, ep 2, zero 1) -> (dp %d, ep %d, zero %d) and back: %08x; "
               "uninterrupted %08x\n", t[0], t[2], t[1], back, ref);
        assert_true(back == ref);
    }
}

/* The MoE variant at tp 2 x ep 2 (dp 2, zero 1): 3 steps, a save, 3 more
 * under the same layout, and under (dp 1, tp 2, ep 2, zero 3) resharded
 * over the data dimension: both the uninterrupted run's CRC, which is the
 * tp 1 one's (ep 2, test_reshard_moe's). */
static void test_resume_moe_tp(void **state)
{
    (void)state;
    uint32_t ref = run_ok((run_spec){2, 1, 1, 2, 3, NULL, false, STEPS, NULL});
    uint32_t whole = run_ok((run_spec){2, 2, 1, 2, 3, NULL, false, STEPS, NULL});
    char a[300];
    path(a, sizeof a, "moetp");
    run_ok((run_spec){2, 2, 1, 2, 3, NULL, false, HALF, a});
    uint32_t same = run_ok((run_spec){2, 2, 1, 2, 3, a, false, HALF, NULL});
    uint32_t other = run_ok((run_spec){1, 2, 3, 2, 3, a, true, HALF, NULL});
    printf("# MoE (dp 2, tp 2, ep 2, zero 1): %08x; resumed %08x; resumed at (dp 1, zero 3) "
           "%08x; tp 1 %08x\n", whole, same, other, ref);
    assert_true(whole == ref);
    assert_true(same == ref);
    assert_true(other == ref);
}

/* run_ck's error, which must contain want1 and want2. */
static void expect_run_err(run_spec r, const char *want1, const char *want2)
{
    char err[1024] = "";
    uint32_t crc;
    assert_int_equal(run_ck(&r, &crc, err, sizeof err), -1);
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fail_msg("error '%s'; expected '%s' and '%s'", err, want1, want2 ? want2 : "");
}

static void test_errors(void **state)
{
    (void)state;
    char ck[300], plain[300], none[300];
    path(ck, sizeof ck, "err");
    path(plain, sizeof plain, "plain");
    path(none, sizeof none, "none");
    run_ok((run_spec){2, 2, 2, 0, 3, NULL, false, 1, ck});
    /* another layout without reshard: both named, and how to ask */
    expect_run_err((run_spec){1, 1, 0, 0, 3, ck, false, 1, NULL},
                   "was saved under (dp 2, tp 2, zero 2); this run is (dp 1, tp 1, zero 0)",
                   "--reshard");
    expect_run_err((run_spec){2, 2, 1, 0, 3, ck, false, 1, NULL}, "(dp 2, tp 2, zero 1)",
                   "--reshard");
    /* another model: the MoE variant */
    expect_run_err((run_spec){4, 1, 2, 1, 3, ck, true, 1, NULL}, "holds another model",
                   "--experts is 0 there, 8 here");
    /* the MoE model across tp or ep with tp > 1: refused, even asked to reshard */
    char moe[300];
    path(moe, sizeof moe, "errmoe");
    run_ok((run_spec){1, 2, 0, 2, 3, NULL, false, 1, moe});
    expect_run_err((run_spec){1, 1, 0, 4, 3, moe, true, 1, NULL},
                   "saved under (dp 1, tp 2, ep 2, zero 0); this run is (dp 1, ep 4, zero 0)",
                   "resharding the MoE model across --tp or --ep with --tp > 1 is not "
                   "supported");
    expect_run_err((run_spec){1, 2, 0, 1, 3, moe, true, 1, NULL}, "(dp 1, tp 2, ep 1, zero 0)",
                   "is not supported");
    /* no checkpoint; a checkpoint that is not a mesh's */
    expect_run_err((run_spec){2, 2, 2, 0, 3, none, false, 1, NULL}, none, NULL);
    setenv("NT_SIM_CORES", "1", 1);
    assert_int_equal(nt_init(), 0);
    nt_tensor *t = nt_zeros(NT_F32, 1, (int64_t[]){3});
    assert_int_equal(nt_save(plain, &t, 1, NULL), 0);
    nt_release(t);
    nt_shutdown();
    expect_run_err((run_spec){1, 1, 0, 0, 3, plain, false, 1, NULL}, "not a mesh checkpoint",
                   "'mesh.layout'");
    /* a member's files gone: nt_ddp_load_split's error, nothing else run */
    char gone[400];
    snprintf(gone, sizeof gone, "%s.tp1of2.zero0of2", ck);
    assert_int_equal(unlink(gone), 0);
    expect_run_err((run_spec){2, 2, 2, 0, 3, ck, false, 1, NULL}, "loading", "nt_ddp_load");
}

/* nt_ddp_save_split's and nt_ddp_load_split's own errors, and a split
 * reshard of a plain nt_ddp (two parameter groups) by hand. */
static void test_split_api(void **state)
{
    (void)state;
    setenv("NT_SIM_CORES", "2", 1);
    assert_int_equal(nt_init(), 0);
    char p[300], q[300];
    path(p, sizeof p, "split");
    path(q, sizeof q, "nosuch");
    /* the whole [4, 2] w (split by rows) and b [2] (replicated) */
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bv[2] = {9, 10};
    nt_ddp *d[2];
    nt_optim *o[2];
    for (int r = 0; r < 2; r++) { /* tensor rank r on device r, one data rank */
        nt_device_set(r);
        nt_tensor *ps[2] = {nt_from_host(w + 4 * r, NT_F32, 2, (int64_t[]){2, 2}),
                            nt_from_host(bv, NT_F32, 1, (int64_t[]){2})};
        for (int j = 0; j < 2; j++)
            assert_int_equal(nt_set_requires_grad(ps[j], true), 0);
        d[r] = nt_ddp_create(ps, 2, 1, (int[]){r}, 1);
        assert_non_null(d[r]);
        nt_release(ps[0]), nt_release(ps[1]);
        nt_tensor **rp = nt_ddp_params(d[r], r);
        o[r] = nt_optim_adamw(rp, 1, 0.1, 0.9, 0.95, 1e-8, 0.1);
        assert_non_null(o[r]);
        assert_int_equal(nt_optim_add_group(o[r], rp + 1, 1, 0.1, 0), 1);
        /* one step: gradient 1 everywhere */
        for (int j = 0; j < 2; j++) {
            nt_tensor *l = nt_sum(rp[j], NT_DIM_ALL, false);
            assert_int_equal(nt_backward(l), 0);
            nt_release(l);
        }
        assert_int_equal(nt_optim_step(o[r]), 0);
    }
    nt_device_set(0);
    int dims[2] = {0, -1};
    nt_test_expect_err(nt_ddp_save_split(d[0], NULL, 0, 2, o, 1), NT_EINVAL,
                       "nt_ddp_save_split", "'path'");
    nt_test_expect_err(nt_ddp_save_split(d[0], p, 2, 2, o, 1), NT_EINVAL, "nt_ddp_save_split",
                       "'rank' is 2 of 'ranks' 2");
    nt_test_expect_err(nt_ddp_save_split(NULL, p, 0, 2, o, 1), NT_EINVAL, "nt_ddp_save_split");
    for (int r = 0; r < 2; r++)
        assert_int_equal(nt_ddp_save_split(d[r], p, r, 2, &o[r], 1), 0);
    nt_test_expect_err(nt_ddp_load_split(d[0], NULL, 0, 2, dims, &o[0], 1, false), NT_EINVAL,
                       "nt_ddp_load_split", "'path'");
    nt_test_expect_err(nt_ddp_load_split(d[0], p, -1, 2, dims, &o[0], 1, false), NT_EINVAL,
                       "nt_ddp_load_split", "'rank' is -1");
    nt_test_expect_err(nt_ddp_load_split(d[0], p, 0, 2, NULL, &o[0], 1, false), NT_EINVAL,
                       "nt_ddp_load_split", "'dims' is NULL");
    nt_test_expect_err(nt_ddp_load_split(d[0], q, 0, 2, dims, &o[0], 1, false), NT_EIO,
                       "nt_ddp_load_split", "no tensor-parallel checkpoint", q);
    /* the same count: each rank its own (values as saved) */
    for (int r = 0; r < 2; r++)
        assert_int_equal(nt_ddp_load_split(d[r], p, r, 2, dims, &o[r], 1, false), 0);
    /* into one rank holding the whole: an error without reshard, then the
     * parts joined (w's rows in rank order, b rank 0's), state included */
    nt_tensor *ws = nt_zeros(NT_F32, 2, (int64_t[]){4, 2}), *bs = nt_zeros(NT_F32, 1,
                                                                           (int64_t[]){2});
    assert_int_equal(nt_set_requires_grad(ws, true), 0);
    assert_int_equal(nt_set_requires_grad(bs, true), 0);
    nt_ddp *one = nt_ddp_create((nt_tensor *[]){ws, bs}, 2, 1, (int[]){0}, 1);
    assert_non_null(one);
    nt_tensor **op = nt_ddp_params(one, 0);
    nt_optim *oo = nt_optim_adamw(op, 1, 0.1, 0.9, 0.95, 1e-8, 0.1);
    assert_int_equal(nt_optim_add_group(oo, op + 1, 1, 0.1, 0), 1);
    nt_test_expect_err(nt_ddp_load_split(one, p, 0, 1, dims, &oo, 1, false), NT_EINVAL,
                       "nt_ddp_load_split", "saved over 2 tensor ranks",
                       "tensor rank 0 of 1", "reshard = true");
    nt_test_expect_err(nt_ddp_load_split(one, p, 0, 1, (int[]){2, -1}, &oo, 1, true), NT_EINVAL,
                       "nt_ddp_load_split", "'dims[0]' is 2");
    nt_test_expect_err(nt_ddp_load_split(one, p, 0, 1, (int[]){-1, 0}, &oo, 1, true),
                       NT_ESHAPE, "nt_ddp_load", "parameter 0 has 4 elements", "has 8");
    {   /* a split dim the saved count does not divide: 3 rows over 2 */
        nt_tensor *x = nt_zeros(NT_F32, 2, (int64_t[]){3, 2}), *y = nt_zeros(NT_F32, 1,
                                                                             (int64_t[]){2});
        assert_int_equal(nt_set_requires_grad(x, true), 0);
        assert_int_equal(nt_set_requires_grad(y, true), 0);
        nt_ddp *odd = nt_ddp_create((nt_tensor *[]){x, y}, 2, 1, (int[]){0}, 1);
        assert_non_null(odd);
        nt_test_expect_err(nt_ddp_load_split(odd, p, 0, 1, dims, NULL, 0, true), NT_ESHAPE,
                           "nt_ddp_load_split", "parameter 0", "saved 2 tensor ranks");
        nt_ddp_destroy(odd);
        nt_release(x), nt_release(y);
    }
    {   /* a tensor rank whose optimizer never updated the split w (no state
         * for it) beside one that did, either way round: an error naming
         * the call, the file without it and the entry; nothing loaded */
        for (int lack = 1; lack >= 0; lack--) {
            char s[300], m1[400], m2[400];
            path(s, sizeof s, lack ? "nostate1" : "nostate0");
            nt_tensor **rp = nt_ddp_params(d[lack], lack);
            nt_device_set(lack);
            nt_optim *fresh = nt_optim_adamw(rp, 1, 0.1, 0.9, 0.95, 1e-8, 0.1);
            assert_non_null(fresh);
            assert_int_equal(nt_optim_add_group(fresh, rp + 1, 1, 0.1, 0), 1);
            nt_device_set(0);
            for (int r = 0; r < 2; r++)
                assert_int_equal(nt_ddp_save_split(d[r], s, r, 2, r == lack ? &fresh : &o[r], 1),
                                 0);
            nt_optim_destroy(fresh);
            snprintf(m1, sizeof m1, "'%s.tp%dof2.zero0of1' holds no optimizer state slot 0", s,
                     lack);
            snprintf(m2, sizeof m2, "'%s.tp%dof2.zero0of1' does", s, 1 - lack);
            float before[8];
            assert_int_equal(nt_to_host(op[0], before, sizeof before), 0);
            nt_test_expect_err(nt_ddp_load_split(one, s, 0, 1, dims, &oo, 1, true), NT_EINVAL,
                               "nt_ddp_load_split", m1, "of parameter 0 (\"p0\")", m2);
            float after[8];
            assert_int_equal(nt_to_host(op[0], after, sizeof after), 0);
            assert_memory_equal(before, after, sizeof after);
        }
    }
    {   /* glob's metacharacters in the path are plain characters: saved
         * and loaded under the same count and joined into one rank */
        char g[300];
        path(g, sizeof g, "b[r]a*ck?");
        float parts[8], whole[8];
        for (int r = 0; r < 2; r++) {
            assert_int_equal(nt_ddp_save_split(d[r], g, r, 2, &o[r], 1), 0);
            assert_int_equal(nt_to_host(nt_ddp_params(d[r], r)[0], parts + 4 * r,
                                        sizeof(float) * 4), 0);
        }
        for (int r = 0; r < 2; r++)
            assert_int_equal(nt_ddp_load_split(d[r], g, r, 2, dims, &o[r], 1, false), 0);
        assert_int_equal(nt_ddp_load_split(one, g, 0, 1, dims, &oo, 1, true), 0);
        assert_int_equal(nt_to_host(op[0], whole, sizeof whole), 0);
        assert_memory_equal(whole, parts, sizeof whole);
    }
    assert_int_equal(nt_ddp_load_split(one, p, 0, 1, dims, &oo, 1, true), 0);
    assert_int_equal(nt_optim_steps(oo), 1);
    /* the values: one more step on every side gives the same bits */
    float got[8], want[8], gb[2], wb[2];
    for (int r = 0; r < 2; r++) {
        nt_tensor **rp = nt_ddp_params(d[r], r);
        nt_device_set(r);
        assert_int_equal(nt_optim_zero_grad(o[r]), 0); /* the first step's gradients */
        for (int j = 0; j < 2; j++) {
            nt_tensor *l = nt_sum(rp[j], NT_DIM_ALL, false);
            assert_int_equal(nt_backward(l), 0);
            nt_release(l);
        }
        assert_int_equal(nt_optim_step(o[r]), 0);
        assert_int_equal(nt_to_host(rp[0], want + 4 * r, sizeof(float) * 4), 0);
        if (r == 0)
            assert_int_equal(nt_to_host(rp[1], wb, sizeof wb), 0);
    }
    nt_device_set(0);
    for (int j = 0; j < 2; j++) {
        nt_tensor *l = nt_sum(op[j], NT_DIM_ALL, false);
        assert_int_equal(nt_backward(l), 0);
        nt_release(l);
    }
    assert_int_equal(nt_optim_step(oo), 0);
    assert_int_equal(nt_to_host(op[0], got, sizeof got), 0);
    assert_int_equal(nt_to_host(op[1], gb, sizeof gb), 0);
    assert_memory_equal(got, want, sizeof got);
    assert_memory_equal(gb, wb, sizeof gb);
    assert_true(got[0] != 1.0f); /* the steps moved them */
    nt_optim_destroy(oo);
    nt_ddp_destroy(one);
    nt_release(ws), nt_release(bs);
    for (int r = 0; r < 2; r++) {
        nt_optim_destroy(o[r]);
        nt_ddp_destroy(d[r]);
    }
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/nt_meshio_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR")
                                                                         : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---------------- over 2 processes (mpirun) ---------------- */

/* A (2, 2, 2) save over 2 processes x 2 cores resumes under (1, 1, 0) in
 * one process, and a one-process (1, 1, 0) save under (2, 2, 3) over 2
 * processes: the one-process uninterrupted CRC.  Processes that read
 * checkpoints of different layouts stop with an error naming both. */
static void test_across_processes(void **state)
{
    (void)state;
    char a[300], b[300], args[1024], out[16384];
    path(a, sizeof a, "mpi222");
    path(b, sizeof b, "mpi110");
    uint32_t ref = run_ok((run_spec){1, 1, 0, 0, 3, NULL, false, STEPS, NULL}), crc = 0;
    snprintf(args, sizeof args, "2 2 2 - %d %s", HALF, a);
    if (mesh_h_mpi_run(2, args, &crc, out, sizeof out))
        fail_msg("the save over 2 processes failed");
    uint32_t one = run_ok((run_spec){1, 1, 0, 0, 3, a, true, HALF, NULL});
    run_ok((run_spec){1, 1, 0, 0, 3, NULL, false, HALF, b});
    snprintf(args, sizeof args, "2 2 3 %s %d -", b, HALF);
    if (mesh_h_mpi_run(2, args, &crc, out, sizeof out))
        fail_msg("the load over 2 processes failed");
    printf("# 2 processes (2, 2, 2) -> 1 process (1, 1, 0): %08x; 1 process (1, 1, 0) -> 2 "
           "processes (2, 2, 3): %08x; uninterrupted %08x\n", one, crc, ref);
    assert_true(one == ref);
    assert_true(crc == ref);
    /* process 0 reads a (dp 2, tp 2, zero 2), process 1 b (dp 1, tp 1, zero 0) */
    char p0[300], p1[300];
    path(p0, sizeof p0, "mpiR0");
    path(p1, sizeof p1, "mpiR1");
    assert_int_equal(symlink(a, p0), 0);
    assert_int_equal(symlink(b, p1), 0);
    snprintf(args, sizeof args, "2 2 2 %s/mpiR 1 -", dir);
    assert_int_equal(mesh_h_mpi_run(2, args, &crc, out, sizeof out), -1);
    if (!strstr(out, "the processes read different checkpoints") ||
        !strstr(out, "(dp 2, tp 2, zero 2)") || !strstr(out, "(dp 1, tp 1, zero 0)"))
        fail_msg("expected the processes' layouts named; got: %s", out);
}

/* An mpirun child: dp tp zero load steps save ('-': none; a load path
 * ending in "R" has the process rank appended).  Process 0 prints "crc X". */
static int child(char **argv)
{
    in_child = true;
    char load[4096], err[1024];
    const char *rk = getenv("OMPI_COMM_WORLD_RANK");
    size_t ln = strlen(argv[3]);
    snprintf(load, sizeof load, "%s%s", argv[3],
             ln && argv[3][ln - 1] == 'R' ? (rk ? rk : "0") : "");
    uint32_t crc = 0;
    run_spec r = {atoi(argv[0]), atoi(argv[1]), atoi(argv[2]), 0, 3,
                  strcmp(argv[3], "-") ? load : NULL, true, atoi(argv[4]),
                  strcmp(argv[5], "-") ? argv[5] : NULL};
    if (run_ck(&r, &crc, err, sizeof err)) {
        fprintf(stderr, "child: %s\n", err);
        return 1;
    }
    if (!rk || atoi(rk) == 0)
        printf("crc %08x\n", crc);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 8 && !strcmp(argv[1], "--child"))
        return child(argv + 2);
    if (argc == 3 && !strcmp(argv[1], "--mpi")) {
        const struct CMUnitTest mpi_tests[] = {cmocka_unit_test(test_across_processes)};
        return mesh_h_mpi_main(argv[2], mpi_tests, 1, setup, teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_api),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_resume_same),
        cmocka_unit_test(test_reshard),
        cmocka_unit_test(test_reshard_moe),
        cmocka_unit_test(test_resume_moe_tp),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
