/* tests/test_fp8dist.c - fp8 training under data parallelism, bit for bit
 * (docs/amp.md, "fp8 autocast": the bitwise table), and the fp8 recipe's
 * state in checkpoints (record kind 7 of docs/checkpoint-format.md).
 *
 * The model: a one-block char-GPT (examples/gpt_model.h: embeddings, layer
 * norms, fused attention, a GELU MLP, the tied head) under fp8 autocast
 * with delayed scaling in the HYBRID format (e4m3 forward, e5m2
 * gradients), AdamW with gradient clipping at 1, over nt_ddp with 8 shards
 * (tests/ddp_harness.h); after each reduce the step's amaxes are reduced
 * with MAX over a communicator of every core and process
 * (nt_fp8_recipe_update).  Checked:
 *   - the parameters after the steps: the same bits on 1, 2, 4 and 8
 *     cores, on both backends, with and without NT_DETERMINISTIC, and (the
 *     --mpi main, test fp8dist_mpi) in 2 processes x 1, 2 and 4 cores;
 *   - a run saved after step SAVE_AT (nt_ddp_save plus the recipe alone in
 *     nt_checkpoint_write) and resumed gives the uninterrupted bits, on the
 *     same and on other core counts; resumed without the recipe's state it
 *     does not (the state matters);
 *   - the recipe record in this process: state restored exactly (before and
 *     after the recipe's first matmul), and every error: no record, other
 *     settings, devices that disagree, fields no writer makes, a kind this
 *     build does not know (how a reader from before the record refuses a
 *     file that has it), nothing changed by a failed load.
 *
 * NT_SIM_CORES is read by nt_init, so the runs are child processes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "examples/gpt_model.h"
#define BENCH_NAME "tests/test_fp8dist"
#include "ddp_harness.h"

enum { STEPS = 6, SAVE_AT = 3, SHARDS = 8, HIST = 4 };

/* The model's sizes: the test's one block (rows x context tokens of a
 * vocabulary of v per step), or with kind "train-chargpt" (a measurement,
 * docs/amp.md) char_gpt's default model: 4 blocks, 4 heads, width 128,
 * context 128, batch 16. */
static struct {
    int rows, T, V, layers, heads, width;
} g_m = {16, 16, 24, 1, 2, 32};

/* ---------------- the child ---------------- */

typedef struct fd_ctx {
    gpt_model m;
    nt_fp8_recipe *r;
    nt_comm *comm;
    int dev0; /* the first local device */
} fd_ctx;

/* Step `step`'s token rows (rows x T inputs, the next token as targets):
 * a stream with some structure (each token depends on the one before). */
static void fd_tokens(int32_t *x, int32_t *y, int step)
{
    int T = g_m.T, V = g_m.V;
    for (int b = 0; b < g_m.rows; b++) {
        uint64_t k = (uint64_t)(step * g_m.rows + b);
        int32_t t = (int32_t)(gpt_rand_at(7, k * 1000) % V);
        for (int i = 0; i <= T; i++) {
            if (i < T)
                x[b * T + i] = t;
            if (i > 0)
                y[b * T + i - 1] = t;
            uint64_t u = gpt_rand_at(9, k * 1000 + (uint64_t)i + 1);
            t = (int32_t)(u % 4 ? (uint64_t)(t * 5 + 3) % V : u % V);
        }
    }
}

static int fd_batch(void *ctx, nt_ddp *d, int s, int step, nt_tensor **x, nt_tensor **y)
{
    (void)ctx;
    size_t n = (size_t)g_m.rows * (size_t)g_m.T;
    int32_t *xb = malloc(n * sizeof *xb), *yb = malloc(n * sizeof *yb);
    if (xb && yb) {
        fd_tokens(xb, yb, step);
        *x = nt_ddp_shard_from_host(d, s, xb, NT_I32, 2, (int64_t[]){g_m.rows, g_m.T});
        *y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){(int64_t)n});
    }
    free(xb);
    free(yb);
    return xb && yb && *x && *y ? 0 : -1;
}

/* The model's loss on replica p under fp8 autocast. */
static nt_tensor *fd_loss(void *ctx, nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    fd_ctx *c = ctx;
    nt_tensor **home = c->m.p;
    c->m.p = p;
    nt_tensor *loss = NULL;
    if (nt_fp8_autocast_begin(c->r) == 0) {
        loss = gpt_loss(&c->m, x, y);
        nt_autocast_end();
    }
    c->m.p = home;
    return loss;
}

/* After the reduce: the amaxes over every replica, then clipping. */
static int fd_after(void *ctx, nt_ddp *d)
{
    fd_ctx *c = ctx;
    if (nt_fp8_recipe_update(c->r, c->comm))
        return -1;
    nt_device_set(c->dev0);
    nt_tensor *t = nt_ddp_clip_grad_norm(d, 1.0);
    if (!t)
        return -1;
    nt_release(t);
    return 0;
}

static void fp8_path(char *buf, size_t n, const char *path)
{
    snprintf(buf, n, "%s.fp8", path);
}

/* kind: "train" (STEPS steps), "save" (and nt_ddp_save + the recipe after
 * step SAVE_AT), "load" (resume from path at SAVE_AT), "load-norecipe"
 * (the same without the recipe's state), "train-chargpt" (char_gpt's
 * model). */
static int child_main(const char *kind, const char *path)
{
    if (nt_init() != 0)
        return 3;
    int devs[DDP_H_MAXDEV], ndev = ddp_h_devices(devs), rc = 0;
    fd_ctx c = {.dev0 = devs[0]};
    if (!strcmp(kind, "train-chargpt"))
        g_m.rows = 16, g_m.T = 128, g_m.V = 64, g_m.layers = 4, g_m.heads = 4, g_m.width = 128;
    gpt_config gc = {.n_layer = g_m.layers, .n_head = g_m.heads, .width = g_m.width,
                     .context = g_m.T, .vocab = g_m.V};
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, HIST, 0};
    nt_device_set(devs[0]);
    if (gpt_init(&c.m, &gc, 5) || !(c.r = nt_fp8_recipe_create(&o)))
        return 4;
    int np = c.m.n_params;
    nt_ddp *d = nt_ddp_create(c.m.p, np, SHARDS, devs, ndev);
    c.comm = nt_comm_create(devs, ndev);
    nt_optim *opts[DDP_H_MAXDEV] = {0};
    for (int i = 0; d && i < ndev; i++) {
        nt_device_set(devs[i]);
        opts[i] = nt_optim_adamw(nt_ddp_params(d, devs[i]), np, 3e-3, 0.9, 0.95, 1e-8, 0.1);
        rc |= !opts[i];
    }
    if (!d || !c.comm || rc) {
        fprintf(stderr, "child: %s\n", nt_last_error_message());
        return 4;
    }
    char fpath[4200];
    fp8_path(fpath, sizeof fpath, path ? path : "");
    nt_checkpoint_spec rs = {.fp8 = c.r};
    int first = 0;
    if (!strncmp(kind, "load", 4)) {
        first = SAVE_AT;
        rc = nt_ddp_load(d, path, opts, ndev, false);
        if (!rc && !strcmp(kind, "load"))
            rc = nt_checkpoint_read(fpath, &rs, true, NULL);
    }
    ddp_h_cfg cfg = {.shards = SHARDS, .rows = g_m.rows, .loss = fd_loss, .batch = fd_batch,
                     .after_reduce = fd_after, .ctx = &c};
    for (int step = first; step < STEPS && !rc; step++) {
        rc = ddp_h_step(d, &cfg, opts, ndev, step);
        if (!rc && !strcmp(kind, "save") && step + 1 == SAVE_AT) {
            rc = nt_ddp_save(d, path, opts, ndev);
            if (!rc && nt_process_rank() <= 0)
                rc = nt_checkpoint_write(fpath, &rs);
        }
    }
    if (!rc)
        rc = ddp_h_report(d, devs, ndev, np);
    if (rc)
        fprintf(stderr, "child (%s): %s\n", kind, nt_last_error_message());
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_comm_destroy(c.comm);
    nt_ddp_destroy(d);
    nt_fp8_recipe_destroy(c.r);
    gpt_free(&c.m);
    nt_shutdown();
    return rc ? 5 : 0;
}

/* ---------------- bit-identical on every core count ---------------- */

static const char *const CORES[] = {"NT_SIM_CORES=1", "NT_SIM_CORES=2", "NT_SIM_CORES=4",
                                    "NT_SIM_CORES=8"};

static unsigned g_ref; /* sim adaptive, 1 core: every run's CRC */

static void test_bitwise_across_cores(void **state)
{
    (void)state;
    static const char *const cfg[][3] = {{"NT_BACKEND=sim", "NT_MODE=adaptive", "adaptive"},
                                         {"NT_BACKEND=sim", "NT_DETERMINISTIC=1", "determ."},
                                         {"NT_BACKEND=cpu", "NT_MODE=adaptive", "adaptive"},
                                         {"NT_BACKEND=cpu", "NT_DETERMINISTIC=1", "determ."}};
    /* NT_TEST_QUICK (the sanitizer runs): the simulator, adaptive, only */
    int ncfg = getenv("NT_TEST_QUICK") ? 1 : 4;
    printf("# fp8 (delayed, HYBRID, history %d) char-GPT, %d AdamW steps, %d shards: crc32 of "
           "the parameters\n", HIST, STEPS, SHARDS);
    printf("# backend  mode      1 core    2 cores   4 cores   8 cores\n");
    for (int g = 0; g < ncfg; g++) {
        char row[160];
        int k = snprintf(row, sizeof row, "# %-8s %-8s", cfg[g][0] + 11, cfg[g][2]);
        for (int c = 0; c < 4; c++) {
            const char *env[] = {cfg[g][0], cfg[g][1], CORES[c], NULL};
            unsigned crc = ddp_h_child_crc(env, "train", NULL, 1 << c);
            k += snprintf(row + k, sizeof row - (size_t)k, "  %08x", crc);
            if (g == 0 && c == 0)
                g_ref = crc;
            else if (crc != g_ref)
                fail_msg("%s %s, %d cores: %08x; sim adaptive on 1 core %08x", cfg[g][0],
                         cfg[g][1], 1 << c, crc, g_ref);
        }
        printf("%s\n", row);
    }
}

/* ---------------- resumed == uninterrupted ---------------- */

static unsigned ckpt_child(const char *cores, const char *kind, const char *path)
{
    const char *env[] = {"NT_BACKEND=sim", cores, NULL};
    int nc = cores[13] - '0';
    return ddp_h_child_crc(env, kind, path, nc);
}

static void test_resume(void **state)
{
    (void)state;
    if (!g_ref) {
        const char *env[] = {"NT_BACKEND=sim", CORES[0], NULL};
        g_ref = ddp_h_child_crc(env, "train", NULL, 1);
    }
    assert_int_equal(nt_test_dir_make("fp8dist"), 0);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/a", nt_test_dir);
    snprintf(b, sizeof b, "%s/b", nt_test_dir);
    printf("# saved after step %d of %d, resumed (uninterrupted: %08x):\n", SAVE_AT, STEPS,
           g_ref);
    /* 1 core into 1 core; 4 cores into 4, 2 and 8 */
    assert_int_equal(ckpt_child(CORES[0], "save", a), g_ref);
    unsigned c = ckpt_child(CORES[0], "load", a);
    printf("#   1 core -> 1 core:  %08x\n", c);
    assert_int_equal(c, g_ref);
    assert_int_equal(ckpt_child(CORES[2], "save", b), g_ref);
    for (int k = 1; k < 4; k++) {
        if (getenv("NT_TEST_QUICK") && k != 2)
            continue;
        c = ckpt_child(CORES[k], "load", b);
        printf("#   4 cores -> %d core%s: %08x\n", 1 << k, k ? "s" : "", c);
        if (c != g_ref)
            fail_msg("saved on 4 cores, resumed on %d: %08x, uninterrupted %08x", 1 << k, c,
                     g_ref);
    }
    /* the recipe's state matters: without it the scales restart at 1 */
    c = ckpt_child(CORES[0], "load-norecipe", a);
    printf("#   1 core -> 1 core without the recipe's state: %08x (differs)\n", c);
    assert_true(c != g_ref);
    assert_int_equal(nt_test_dir_remove(), 0);
}

/* ---------------- the record in this process ---------------- */

enum { M = 6, K = 8, N = 5 };
/* The record of a recipe with 2 slots (6 rows), history 3: 32 bytes, then
 * f32 scale [6], 1 / scale [6], step amax [6], history [6, 3]. */
enum { SCALE_AT = 32, INV_AT = 32 + 24, PEND_AT = 32 + 48, HIST_AT = 32 + 72 };

/* A leaf copy of w on device 1, requiring grad. */
static nt_tensor *on_dev1(nt_tensor *w)
{
    int old = nt_device_current();
    nt_tensor *t = nt_to_device(w, 1);
    assert_int_equal(nt_device_set(1), 0);
    nt_tensor *d = nt_detach(t);
    nt_release(t);
    assert_int_equal(nt_device_set(old), 0);
    assert_non_null(d);
    assert_int_equal(nt_set_requires_grad(d, true), 0);
    return d;
}

/* One fp8 step of recipe r on the current device: y = x w^T for the two
 * weights, loss sum(y), backward, update (comm may be NULL). */
static void fp8_step(nt_fp8_recipe *r, nt_tensor *w1, nt_tensor *w2, float xscale, nt_comm *comm)
{
    float xv[M * K];
    uint64_t seed = 3;
    for (int i = 0; i < M * K; i++)
        xv[i] = nt_test_uniform(&seed) * xscale;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){M, K});
    assert_int_equal(nt_fp8_autocast_begin(r), 0);
    nt_tensor *h = nt_linear(x, w1, NULL);
    nt_tensor *y = nt_linear(nt_cast(h, NT_F32), w2, NULL);
    nt_tensor *loss = nt_sum(nt_cast(y, NT_F32), NT_DIM_ALL, false);
    assert_int_equal(nt_autocast_end(), 0);
    assert_int_equal(nt_backward(loss), 0);
    nt_scope_end(sc);
    if (comm != (nt_comm *)1)
        assert_int_equal(nt_fp8_recipe_update(r, comm), 0);
}

/* Recipe r's state on dev (scales, histories, step amaxes) as bytes. */
static size_t state_bytes(nt_fp8_recipe *r, int dev, uint8_t *buf, size_t cap)
{
    size_t at = 0;
    for (int w = 0; w < 3; w++) {
        nt_tensor *t = nt_fp8_recipe_state(r, dev, w);
        assert_non_null(t);
        size_t nb = (size_t)nt_numel(t) * 4;
        assert_true(at + nb <= cap);
        assert_int_equal(nt_to_host(t, buf + at, nb), 0);
        nt_release(t);
        at += nb;
    }
    return at;
}

static nt_tensor *weight(int rows, int cols, uint64_t seed)
{
    nt_tensor *r = nt_randn(NT_F32, 2, (int64_t[]){rows, cols}, seed);
    nt_tensor *w = nt_mul_scalar(r, 0.5);
    nt_release(r);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    return w;
}

/* A file's bytes (malloc'ed; *n its size). */
static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes `src` to `dst` with the fp8 record's byte `at` (from its data's
 * start; a negative `at`: its table entry's kind) set to the 4 bytes of v,
 * the checksums made right again: the field checks must catch it. */
static void edit_fp8(const char *src, const char *dst, long at, uint32_t v)
{
    size_t n;
    uint8_t *b = slurp(src, &n);
    uint32_t count = le32(b + 12);
    uint8_t *e = NULL;
    for (uint32_t i = 0; i < count; i++)
        if ((b[32 + 96 * i] | b[33 + 96 * i] << 8) == 7)
            e = b + 32 + 96 * i;
    assert_non_null(e);
    uint64_t off = le32(e + 16) | (uint64_t)le32(e + 20) << 32;
    uint64_t nb = le32(e + 24) | (uint64_t)le32(e + 28) << 32;
    if (at < 0) {
        e[0] = (uint8_t)v, e[1] = (uint8_t)(v >> 8);
    } else {
        put32(b + off + (uint64_t)at, v);
        put32(e + 12, crc32_ieee(b + off, nb));
    }
    size_t tend = 32 + 96 * (size_t)count;
    put32(b + tend, crc32_ieee(b, tend));
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
    free(b);
}

static void test_record_restores(void **state)
{
    (void)state;
    assert_int_equal(nt_test_dir_make("fp8rec"), 0);
    char path[512], alone[512];
    snprintf(path, sizeof path, "%s/r", nt_test_dir);
    snprintf(alone, sizeof alone, "%s/alone", nt_test_dir);
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, 3, 1};
    nt_fp8_recipe *r = nt_fp8_recipe_create(&o);
    nt_tensor *w1 = weight(N, K, 1), *w2 = weight(3, N, 2);
    nt_tensor *ps[2] = {w1, w2};
    /* a recipe that ran nothing saves no slot, and loads as one */
    nt_checkpoint_spec spec = {.tensors = ps, .n = 2, .fp8 = r};
    assert_int_equal(nt_checkpoint_write(path, &spec), 0);
    for (int s = 0; s < 4; s++)
        fp8_step(r, w1, w2, s == 2 ? 40.0f : 1.0f + (float)s, NULL);
    /* a step's amaxes recorded and not yet pushed are state too */
    fp8_step(r, w1, w2, 9.0f, (nt_comm *)1);
    static uint8_t want[2][8192], got[8192];
    size_t nw = state_bytes(r, 0, want[0], sizeof want[0]);
    assert_int_equal(nt_checkpoint_write(path, &spec), 0);
    nt_checkpoint_spec only = {.fp8 = r};
    assert_int_equal(nt_checkpoint_write(alone, &only), 0);
    /* into a recipe that has run (its state replaced now) and one that
     * has not (its first matmul's block is seeded): the same bytes */
    nt_fp8_recipe *r2 = nt_fp8_recipe_create(&o), *r3 = nt_fp8_recipe_create(&o);
    fp8_step(r2, w1, w2, 100.0f, NULL);
    nt_checkpoint_spec sp2 = {.fp8 = r2}, sp3 = {.fp8 = r3};
    assert_int_equal(nt_checkpoint_read(alone, &sp2, true, NULL), 0);
    assert_int_equal(state_bytes(r2, 0, got, sizeof got), nw);
    assert_memory_equal(got, want[0], nw);
    assert_int_equal(nt_checkpoint_read(alone, &sp3, true, NULL), 0);
    assert_int_equal(nt_fp8_recipe_slots(r3, 0), 0);
    /* the next update of each: the same bits as r's */
    fp8_step(r, w1, w2, 2.0f, NULL);
    fp8_step(r2, w1, w2, 2.0f, NULL);
    fp8_step(r3, w1, w2, 2.0f, NULL);
    nw = state_bytes(r, 0, want[1], sizeof want[1]);
    assert_int_equal(state_bytes(r2, 0, got, sizeof got), nw);
    assert_memory_equal(got, want[1], nw);
    assert_int_equal(state_bytes(r3, 0, got, sizeof got), nw);
    assert_memory_equal(got, want[1], nw);
    /* on device 1, whose block is made after the load */
    nt_fp8_recipe *r4 = nt_fp8_recipe_create(&o);
    nt_checkpoint_spec sp4 = {.fp8 = r4};
    assert_int_equal(nt_checkpoint_read(alone, &sp4, true, NULL), 0);
    assert_int_equal(nt_device_set(1), 0);
    nt_tensor *q1 = on_dev1(w1), *q2 = on_dev1(w2);
    fp8_step(r4, q1, q2, 2.0f, NULL);
    assert_int_equal(state_bytes(r4, 1, got, sizeof got), nw);
    assert_memory_equal(got, want[1], nw);
    assert_int_equal(nt_device_set(0), 0);
    /* the full file by position; nt_load checks the record, restores the tensors */
    nt_checkpoint_spec sp5 = {.tensors = ps, .n = 2, .fp8 = r2};
    assert_int_equal(nt_checkpoint_read(path, &sp5, true, NULL), 0);
    assert_int_equal(nt_load(path, ps, 2, NULL), 0);
    nt_release(q1), nt_release(q2);
    nt_release(w1), nt_release(w2);
    nt_fp8_recipe_destroy(r), nt_fp8_recipe_destroy(r2), nt_fp8_recipe_destroy(r3);
    nt_fp8_recipe_destroy(r4);
    assert_int_equal(nt_test_dir_remove(), 0);
}

static void test_record_errors(void **state)
{
    (void)state;
    assert_int_equal(nt_test_dir_make("fp8err"), 0);
    char path[512], bad[512], plain[512];
    snprintf(path, sizeof path, "%s/r", nt_test_dir);
    snprintf(bad, sizeof bad, "%s/bad", nt_test_dir);
    snprintf(plain, sizeof plain, "%s/plain", nt_test_dir);
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, 3, 1};
    nt_fp8_recipe *r = nt_fp8_recipe_create(&o);
    nt_tensor *w1 = weight(N, K, 1), *w2 = weight(3, N, 2);
    nt_tensor *ps[2] = {w1, w2};
    for (int s = 0; s < 3; s++)
        fp8_step(r, w1, w2, 1.0f + (float)s, NULL);
    nt_checkpoint_spec only = {.fp8 = r};
    assert_int_equal(nt_checkpoint_write(path, &only), 0);
    nt_checkpoint_spec sp = {.tensors = ps, .n = 2};
    assert_int_equal(nt_checkpoint_write(plain, &sp), 0);
    nt_fp8_recipe *q = nt_fp8_recipe_create(&o);
    fp8_step(q, w1, w2, 7.0f, NULL);
    static uint8_t before[8192], after[8192];
    size_t nb = state_bytes(q, 0, before, sizeof before);
    nt_checkpoint_spec sq = {.fp8 = q};

    /* no record; a recipe of other settings */
    nt_checkpoint_spec sqp = {.tensors = ps, .n = 2, .fp8 = q};
    nt_test_expect_err(nt_checkpoint_read(plain, &sqp, true, NULL), NT_EINVAL,
                       "nt_checkpoint_read", "holds no fp8 recipe state", "fp8 = NULL");
    const struct {
        nt_fp8_recipe_opts o;
        const char *field;
    } other[] = {{{NT_FP8_CURRENT, NT_FP8_HYBRID, 3, 1}, "scaling 0"},
                 {{NT_FP8_DELAYED, NT_FP8_E4M3_ALL, 3, 1}, "format 0"},
                 {{NT_FP8_DELAYED, NT_FP8_HYBRID, 4, 1}, "amax_history_len 3"},
                 {{NT_FP8_DELAYED, NT_FP8_HYBRID, 3, 0}, "margin 1"}};
    for (int i = 0; i < 4; i++) {
        nt_fp8_recipe *x = nt_fp8_recipe_create(&other[i].o);
        nt_checkpoint_spec sx = {.fp8 = x};
        nt_test_expect_err(nt_checkpoint_read(path, &sx, true, NULL), NT_EINVAL,
                           "nt_checkpoint_read", other[i].field, "spec->fp8");
        nt_fp8_recipe_destroy(x);
    }
    /* fields no writer makes (the checksums right: the field checks see them) */
    const struct {
        long at;
        uint32_t v;
        const char *why;
    } edits[] = {{0, 2, "unknown layout"},
                 {4, 2, "scaling 2"},
                 {12, 0, "amax_history_len 0"},
                 {16, 33, "margin 33"},
                 {20, 257, "257 slots"},
                 {20, 1, "1 slots with a history of 3"},
                 {28, 1, "reserved bytes"},
                 {SCALE_AT, 0, "scale of row 0 is 0"},
                 {SCALE_AT + 4, 0x7fc00000u, "scale of row 1 is nan"},
                 {INV_AT, 0x7f800000u, "1 / scale of row 0 is inf"},
                 {HIST_AT, 0xbf800000u, "amax history of row 0 is -1"},
                 {PEND_AT + 4, 0xff800000u, "step amax of row 1 is -inf"},
                 {-1, 9, "kind 9, unknown to this build"}};
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        edit_fp8(path, bad, edits[i].at, edits[i].v);
        int rc = nt_checkpoint_read(bad, &sq, true, NULL);
        nt_test_expect_err(rc, NT_EFORMAT, "nt_checkpoint_read", "is not a valid checkpoint",
                           edits[i].why);
        /* checked without a recipe too */
        nt_checkpoint_spec none = {.tensors = ps, .n = 2};
        assert_int_not_equal(nt_checkpoint_read(bad, &none, true, NULL), 0);
    }
    /* NaN and +Inf are amaxes a step can have: they load */
    edit_fp8(path, bad, HIST_AT, 0x7fc00000u);
    assert_int_equal(nt_checkpoint_read(bad, &(nt_checkpoint_spec){.fp8 = r}, true, NULL), 0);
    /* nothing changed by the failed loads */
    assert_int_equal(state_bytes(q, 0, after, sizeof after), nb);
    assert_memory_equal(after, before, nb);
    /* bad arguments */
    nt_checkpoint_spec none0 = {0};
    nt_test_expect_err(nt_checkpoint_write(path, &none0), NT_EINVAL, "nt_checkpoint_write",
                       "'params' is NULL");
    nt_fp8_recipe *dead = nt_fp8_recipe_create(&o);
    nt_fp8_recipe_destroy(dead);
    nt_checkpoint_spec sd = {.fp8 = dead};
    nt_test_expect_err(nt_checkpoint_write(path, &sd), NT_EINVAL, "nt_checkpoint_write", "'r'");
    nt_test_expect_err(nt_checkpoint_read(path, &sd, true, NULL), NT_EINVAL,
                       "nt_checkpoint_read", "'r'");
    /* two devices whose amaxes were not reduced over both: their states
     * differ, and the save says so; reduced with MAX, they agree */
    nt_tensor *v1 = on_dev1(w1), *v2 = on_dev1(w2);
    nt_comm *comm = nt_comm_create((int[]){0, 1}, 2);
    assert_non_null(comm);
    for (int red = 0; red < 2; red++) {
        nt_fp8_recipe *two = nt_fp8_recipe_create(&o);
        fp8_step(two, w1, w2, 1.0f, (nt_comm *)1);
        assert_int_equal(nt_device_set(1), 0);
        fp8_step(two, v1, v2, 5.0f, (nt_comm *)1);
        assert_int_equal(nt_device_set(0), 0);
        assert_int_equal(nt_fp8_recipe_update(two, red ? comm : NULL), 0);
        nt_checkpoint_spec st2 = {.fp8 = two};
        if (red)
            assert_int_equal(nt_checkpoint_write(path, &st2), 0);
        else
            nt_test_expect_err(nt_checkpoint_write(path, &st2), NT_ESTATE,
                               "nt_checkpoint_write", "on device 1 differs from device 0's",
                               "communicator");
        nt_fp8_recipe_destroy(two);
    }
    nt_comm_destroy(comm);
    nt_release(v1), nt_release(v2);
    nt_release(w1), nt_release(w2);
    nt_fp8_recipe_destroy(r), nt_fp8_recipe_destroy(q);
    assert_int_equal(nt_test_dir_remove(), 0);
}

/* ---------------- over 2 processes (mpirun) ---------------- */

static const char *mpirun_path;

/* 2 processes x 1, 2, 4 cores give the parameters of 1 process x 1 core. */
static void test_across_processes(void **state)
{
    (void)state;
    const char *env1[] = {"NT_SIM_CORES=1", NULL};
    unsigned ref = ddp_h_child_crc(env1, "train", NULL, 1);
    printf("# fp8 char-GPT, 1 process x 1 core: %08x\n", ref);
    for (int c = 0; c < 3; c++) {
        const char *env[] = {CORES[c], NULL};
        unsigned crc = ddp_h_mpi_crc(mpirun_path, env, "train", 1 << c);
        printf("# 2 processes x %d core%s: %08x\n", 1 << c, c ? "s" : "", crc);
        if (crc != ref)
            fail_msg("2 processes x %d cores give %08x, 1 process %08x", 1 << c, crc, ref);
    }
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "--child"))
        return child_main(argv[2], argc > 3 ? argv[3] : NULL);
    if (ddp_h_self())
        return 1;
    if (argc == 3 && !strcmp(argv[1], "--mpi")) {
        const struct CMUnitTest mpi_tests[] = {cmocka_unit_test(test_across_processes)};
        return ddp_h_mpi_main(argv[2], &mpirun_path, mpi_tests, 1);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_restores, ddp_h_setup_2dev, ddp_h_teardown_2dev),
        cmocka_unit_test_setup_teardown(test_record_errors, ddp_h_setup_2dev, ddp_h_teardown_2dev),
        cmocka_unit_test(test_bitwise_across_cores),
        cmocka_unit_test(test_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
