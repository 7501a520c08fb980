/* tests/test_capcoll.c - captures of several streams: a data-parallel step
 * (nt_ddp's shards, nt_ddp_reduce's collectives, clipping, AdamW) captured
 * with nt_graph_capture_begin_multi and replayed (fusion/graph.c,
 * dist/comm.c; docs/graphs.md "Several devices", docs/ddp.md).
 *
 * The bits: each child (NT_SIM_CORES, NT_BACKEND, NT_MODE and
 * NT_DETERMINISTIC from the parent) trains the MLP of tests/ddp_harness.h
 * twice from the same parameters, op by op and captured (step 0 captured,
 * the later steps replayed with each step's batch bound and the learning
 * rate changed between steps), and prints both CRC-32s: they must be equal,
 * on 1, 2, 4 and 8 cores, on both backends and in every mode, and equal to
 * each other across all of those.  The error paths run in this process on
 * two simulated cores. */
#include <pthread.h>
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
#include "fusion/graph.h" /* nt__graph_check_plan */
#define BENCH_NAME "tests/test_capcoll"
#include "ddp_harness.h"

enum { F = 12, H = 24, NP = DDP_H_NP, SHARDS = 8, B = 32 };

/* Step 0 captured, then two replays (one under NT_TEST_QUICK=1): a replay
 * after a replay, each with its own batch and lr, is what the property
 * needs; more steps only repeat it. */
static int steps(void) { return getenv("NT_TEST_QUICK") ? 2 : 3; }

static nt_tensor *model_loss(nt_tensor **p, nt_tensor *x, nt_tensor *y, bool bf16,
                            nt_generator *drop)
{
    if (bf16)
        nt_autocast_begin(NT_BF16);
    nt_tensor *h = nt_relu(nt_linear(x, p[0], p[1]));
    if (drop) /* each shard's mask the generator's next: one count over every device */
        h = nt_dropout_next(h, 0.25, drop);
    nt_tensor *logits = nt_linear(h, p[2], p[3]);
    if (nt_dtype_of(logits) != NT_F32)
        logits = nt_cast(logits, NT_F32);
    if (bf16)
        nt_autocast_end();
    return nt_cross_entropy(logits, y);
}

typedef struct run {
    int stage; /* ZeRO */
    bool clip, bf16, dropout;
} run;

static double lr_at(int step) { return 1e-2 / (1 + step); }

/* One step on the shards' inputs x[s], y[s] (NULL for another process's). */
static int train_step(nt_ddp *d, const run *r, nt_optim **opts, int ndev, nt_tensor **x,
                      nt_tensor **y, nt_generator *gen)
{
    if (r->stage == 3 && nt_ddp_gather(d, 0, NP))
        return -1;
    for (int s = 0; s < SHARDS; s++) {
        int dev = nt_ddp_shard_device(d, s);
        if (dev < 0)
            continue;
        nt_device_set(dev);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *loss = model_loss(nt_ddp_params(d, dev), x[s], y[s], r->bf16,
                                       r->dropout ? gen : NULL);
        int rc = loss ? nt_ddp_backward(d, s, loss) : -1;
        nt_scope_end(sc);
        if (rc)
            return rc;
    }
    if (nt_ddp_reduce(d))
        return -1;
    if (r->clip) {
        nt_device_set(0);
        nt_tensor *t = nt_ddp_clip_grad_norm(d, 0.05);
        if (!t)
            return -1;
        nt_release(t);
    }
    return nt_ddp_step(d, opts, ndev);
}

/* Step `step`'s batch, cut into the shards' inputs on their devices. */
static void batch(nt_ddp *d, int step, nt_tensor **x, nt_tensor **y)
{
    float xb[B * F];
    int32_t yb[B];
    ddp_h_data(xb, yb, B, F, 1.0f, 100 + (uint32_t)step);
    for (int s = 0; s < SHARDS; s++) {
        x[s] = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, (int64_t[]){B, F});
        y[s] = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){B});
    }
}

static void batch_free(nt_tensor **x, nt_tensor **y)
{
    for (int s = 0; s < SHARDS; s++) {
        nt_release(x[s]);
        nt_release(y[s]);
    }
}

typedef struct model {
    nt_tensor *p[NP];
    nt_generator *gen;
    nt_ddp *d;
    nt_optim *opts[DDP_H_MAXDEV];
    int ndev, devs[DDP_H_MAXDEV];
} model;

static int model_make(model *m, const run *r)
{
    memset(m, 0, sizeof *m);
    m->ndev = ddp_h_devices(m->devs);
    if (!(m->gen = nt_generator_create(7)))
        return -1;
    nt_device_set(0);
    if (ddp_h_params(m->p, NT_F32, H, F, 11))
        return -1;
    m->d = nt_ddp_create(m->p, NP, SHARDS, m->devs, m->ndev);
    if (!m->d || (r->stage && nt_ddp_set_zero(m->d, r->stage)))
        return -1;
    for (int i = 0; i < m->ndev; i++) {
        nt_device_set(m->devs[i]);
        m->opts[i] = nt_optim_adamw(r->stage ? nt_ddp_zero_shards(m->d, m->devs[i])
                                             : nt_ddp_params(m->d, m->devs[i]),
                                    NP, lr_at(0), 0.9, 0.999, 1e-8, 0.01);
        if (!m->opts[i])
            return -1;
    }
    nt_device_set(0);
    return 0;
}

static void model_free(model *m)
{
    for (int i = 0; i < m->ndev; i++)
        nt_optim_destroy(m->opts[i]);
    nt_ddp_destroy(m->d);
    for (int j = 0; j < NP; j++)
        nt_release(m->p[j]);
    nt_generator_destroy(m->gen);
}

static void set_lr(model *m, int step)
{
    for (int i = 0; i < m->ndev; i++)
        nt_optim_set_lr(m->opts[i], lr_at(step));
}

/* The replicas' CRC (after gathering them under ZeRO-3), and whether every
 * device's replica has it. */
static uint32_t model_crc(model *m, const run *r, bool *same)
{
    if (r->stage == 3 && nt_ddp_gather(m->d, 0, NP))
        return 0;
    uint32_t crc = ddp_h_crc(nt_ddp_params(m->d, m->devs[0]), NP);
    *same = true;
    for (int i = 1; i < m->ndev; i++)
        *same &= ddp_h_crc(nt_ddp_params(m->d, m->devs[i]), NP) == crc;
    return crc;
}

/* The latest simulated core clock (ms; 0 on the cpu backend). */
static double sim_ms(void)
{
    double m = 0;
    for (int i = 0; i < nt_device_count(); i++) {
        nt_sim_stats st;
        if (nt_device_stats_get(i, &st) == 0 && st.clock_ns > m)
            m = st.clock_ns;
    }
    return m / 1e6;
}

/* The child: `variant` is "plain", "clip", "zero1".."zero3", "bf16" or
 * "dropout". */
static int child_main(const char *variant)
{
    run r = {.clip = strcmp(variant, "plain") != 0};
    if (!strncmp(variant, "zero", 4))
        r.stage = atoi(variant + 4);
    r.bf16 = !strcmp(variant, "bf16");
    r.dropout = !strcmp(variant, "dropout");
    if (nt_init() != 0)
        return 3;
    model e, c;
    if (model_make(&e, &r) || model_make(&c, &r)) {
        fprintf(stderr, "child: %s\n", nt_last_error_message());
        return 4;
    }
    nt_tensor *x[SHARDS], *y[SHARDS];
    /* op by op */
    nt_sync();
    double t0 = sim_ms(), h0 = bench_now_ns();
    for (int k = 0; k < steps(); k++) {
        set_lr(&e, k);
        batch(e.d, k, x, y);
        if (train_step(e.d, &r, e.opts, e.ndev, x, y, e.gen)) {
            fprintf(stderr, "child: eager step %d: %s\n", k, nt_last_error_message());
            return 5;
        }
        batch_free(x, y);
    }
    nt_sync();
    double t1 = sim_ms(), h1 = bench_now_ns();
    /* captured: step 0 recorded, the others replayed */
    nt_tensor *cx[SHARDS], *cy[SHARDS];
    batch(c.d, 0, cx, cy);
    nt_sync();
    set_lr(&c, 0);
    int rc = nt_graph_capture_begin_multi();
    char name[16];
    for (int s = 0; s < SHARDS && !rc; s++) {
        snprintf(name, sizeof name, "x%d", s);
        rc = nt_graph_input(cx[s], name);
        snprintf(name, sizeof name, "y%d", s);
        rc = rc ? rc : nt_graph_input(cy[s], name);
    }
    rc = rc ? rc : train_step(c.d, &r, c.opts, c.ndev, cx, cy, c.gen);
    nt_graph *g = nt_graph_capture_end();
    if (rc || !g) {
        fprintf(stderr, "child: capture: %s\n", nt_last_error_message());
        return 6;
    }
    nt_sync();
    double t2 = sim_ms(), h2 = bench_now_ns();
    for (int k = 1; k < steps(); k++) {
        set_lr(&c, k);
        batch(c.d, k, x, y);
        for (int s = 0; s < SHARDS && !rc; s++) {
            snprintf(name, sizeof name, "x%d", s);
            rc = nt_graph_bind(g, name, x[s]);
            snprintf(name, sizeof name, "y%d", s);
            rc = rc ? rc : nt_graph_bind(g, name, y[s]);
        }
        rc = rc ? rc : nt_graph_replay(g);
        batch_free(x, y);
        if (rc) {
            fprintf(stderr, "child: replay %d: %s\n", k, nt_last_error_message());
            return 7;
        }
    }
    nt_sync();
    double t3 = sim_ms(), h3 = bench_now_ns();
    char why[256] = "";
    if (nt__graph_check_plan(g, why, sizeof why)) {
        fprintf(stderr, "child: plan: %s\n", why);
        return 8;
    }
    bool same_e, same_c;
    uint32_t ce = model_crc(&e, &r, &same_e), cc = model_crc(&c, &r, &same_c);
    if (nt_sync())
        return 9;
    int nr = steps() > 1 ? steps() - 1 : 1;
    printf("eager %08x captured %08x cores %d replicas %s sim ms a step %.4f %.4f host ms a "
           "step %.3f %.3f\n",
           ce, cc, e.ndev, same_e && same_c ? "same" : "differ", (t1 - t0) / steps(),
           (t3 - t2) / nr, (h1 - h0) / 1e6 / steps(), (h3 - h2) / 1e6 / nr);
    nt_graph_destroy(g);
    batch_free(cx, cy);
    model_free(&e);
    model_free(&c);
    nt_shutdown();
    return 0;
}

/* Runs a child; returns the captured CRC after checking it equals the op
 * by op one. */
static unsigned child(const char *const *env, const char *variant, int cores, char *line,
                      size_t cap)
{
    char *argv[] = {ddp_h_exe, "--child", (char *)variant, NULL};
    ddp_h_run(env, argv, line, cap);
    unsigned ce = 0, cc = 0;
    int n = 0;
    char rep[16] = "";
    if (sscanf(line, "eager %x captured %x cores %d replicas %15s", &ce, &cc, &n, rep) != 4)
        fail_msg("child %s printed '%s'", variant, line);
    if (n != cores)
        fail_msg("child %s ran on %d cores, expected %d", variant, n, cores);
    if (strcmp(rep, "same"))
        fail_msg("child %s (%s %s %s): the replicas differ", variant, env[0], env[1], env[2]);
    if (ce != cc)
        fail_msg("child %s (%s %s %s %s): captured %08x, op by op %08x", variant, env[0], env[1],
                 env[2], env[3], cc, ce);
    return cc;
}

static void test_bits_vs_eager(void **state)
{
    (void)state;
    static const char *const backends[] = {"NT_BACKEND=sim", "NT_BACKEND=cpu"};
    static const char *const modes[][2] = {{"NT_MODE=eager", "NT_DETERMINISTIC=0"},
                                           {"NT_MODE=adaptive", "NT_DETERMINISTIC=0"},
                                           {"NT_MODE=lazy", "NT_DETERMINISTIC=0"},
                                           {"NT_MODE=adaptive", "NT_DETERMINISTIC=1"}};
    static const char *const cores[] = {"NT_SIM_CORES=1", "NT_SIM_CORES=2", "NT_SIM_CORES=4",
                                        "NT_SIM_CORES=8"};
    bool quick = getenv("NT_TEST_QUICK") != NULL;
    unsigned first = 0;
    char line[512];
    printf("# parameters after %d AdamW steps with clipping, %d shards, captured = op by op "
           "(crc32):\n", steps(), SHARDS);
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 4; m++) {
            if (quick && m != 1 && m != 3)
                continue;
            char row[200];
            int k = snprintf(row, sizeof row, "# %-4s %-22s", backends[b] + 11,
                             m == 3 ? "deterministic" : modes[m][0] + 8);
            for (int c = 0; c < 4; c++) {
                const char *env[] = {backends[b], modes[m][0], modes[m][1], cores[c], NULL};
                unsigned crc = child(env, "clip", 1 << c, line, sizeof line);
                k += snprintf(row + k, sizeof row - (size_t)k, " %08x", crc);
                if (!first)
                    first = crc;
                else if (crc != first)
                    fail_msg("%s %s %s %s: %08x, the first run %08x", backends[b], modes[m][0],
                             modes[m][1], cores[c], crc, first);
                if (m == 1) { /* (figures, not checked: op by op, then captured) */
                    const char *sp = strstr(line, "sim ms a step");
                    printf("# %s, adaptive, %d cores: %.*s\n", backends[b] + 11, 1 << c,
                           sp ? (int)strcspn(sp, "\n") : 0, sp ? sp : "");
                }
            }
            printf("%s\n", row);
        }
}

/* ZeRO stages 1-3, bf16 autocast and dropout (a generator's masks drawn on
 * every device), on 2 and 4 cores (sim, adaptive) and 2 cores (cpu,
 * deterministic). */
static void test_zero_and_amp(void **state)
{
    (void)state;
    static const char *const variants[] = {"plain", "zero1", "zero2", "zero3", "bf16",
                                           "dropout"};
    char line[512];
    for (int v = 0; v < 6; v++) {
        const char *e2[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", "NT_DETERMINISTIC=0",
                            "NT_SIM_CORES=2", NULL};
        const char *e4[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", "NT_DETERMINISTIC=0",
                            "NT_SIM_CORES=4", NULL};
        const char *c2[] = {"NT_BACKEND=cpu", "NT_MODE=adaptive", "NT_DETERMINISTIC=1",
                            "NT_SIM_CORES=2", NULL};
        unsigned a = child(e2, variants[v], 2, line, sizeof line);
        unsigned b = child(e4, variants[v], 4, line, sizeof line);
        unsigned c = child(c2, variants[v], 2, line, sizeof line);
        printf("# %-5s captured = op by op: %08x %08x %08x\n", variants[v], a, b, c);
        assert_int_equal(a, b);
        assert_int_equal(a, c);
    }
}

/* ---------------- the error paths (two cores in this process) ---------------- */

static nt_comm *comm2(void)
{
    int devs[2] = {0, 1};
    nt_comm *c = nt_comm_create(devs, 2);
    assert_non_null(c);
    return c;
}

static void ones_on(nt_tensor **t, int n)
{
    for (int i = 0; i < n; i++) {
        nt_device_set(i);
        t[i] = nt_full(NT_F32, 1, (int64_t[]){4}, 1.0 + i);
        assert_non_null(t[i]);
    }
    nt_device_set(0);
}

static void vals(nt_tensor *t, float *v)
{
    assert_int_equal(nt_to_host(t, v, 4 * sizeof *v), 0);
}

/* A collective between two devices' ops, replayed: each replay's result is
 * the step's run op by op on the values the inputs hold then. */
static void test_collective_replay(void **state)
{
    (void)state;
    nt_comm *cm = comm2();
    nt_tensor *in[2], *acc[2], *out[2];
    ones_on(in, 2);
    ones_on(acc, 2);
    assert_int_equal(nt_graph_capture_begin_multi(), 0);
    assert_int_equal(nt_graph_input(in[0], "a"), 0);
    assert_int_equal(nt_graph_input(in[1], "b"), 0);
    nt_tensor *sq[2];
    for (int i = 0; i < 2; i++) {
        nt_device_set(i);
        sq[i] = nt_mul(in[i], in[i]);
    }
    assert_int_equal(nt_all_reduce(cm, sq, out, NT_REDUCE_SUM), 0);
    for (int i = 0; i < 2; i++) {
        nt_device_set(i);
        assert_int_equal(nt_add_inplace(acc[i], out[i]), 0); /* acc += a^2 + b^2 */
        nt_release(sq[i]);
        nt_release(out[i]);
    }
    nt_device_set(0);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    nt_graph_info info;
    assert_int_equal(nt_graph_info_get(g, &info), 0);
    assert_true(info.ops >= 4);
    assert_int_equal(info.inputs, 2);
    char why[256];
    assert_int_equal(nt__graph_check_plan(g, why, sizeof why), 0);
    float v[4];
    vals(acc[0], v);
    assert_true(v[0] == 1 + 1 + 4); /* the captured step ran: 1 + (1 + 4) */
    /* new inputs, bound from the other thread's device too */
    nt_tensor *a3 = nt_full(NT_F32, 1, (int64_t[]){4}, 3.0);
    nt_device_set(1);
    nt_tensor *b5 = nt_full(NT_F32, 1, (int64_t[]){4}, 5.0);
    assert_int_equal(nt_graph_bind(g, "a", a3), 0);
    assert_int_equal(nt_graph_bind(g, "b", b5), 0);
    assert_int_equal(nt_graph_replay(g), 0); /* current stream: device 1's, any will do */
    nt_device_set(0);
    assert_int_equal(nt_graph_replay(g), 0);
    vals(acc[0], v);
    assert_true(v[0] == 6 + 2 * (9 + 25));
    vals(acc[1], v);
    assert_true(v[3] == 2 + 5 + 2 * (9 + 25));
    /* a bind that does not fit */
    nt_tensor *bad = nt_full(NT_F32, 1, (int64_t[]){5}, 0.0);
    nt_test_expect_err(nt_graph_bind(g, "a", bad), NT_ESHAPE, "nt_graph_bind", "shape");
    nt_test_expect_err(nt_graph_bind(g, "c", a3), NT_EINVAL, "nt_graph_bind", "\"c\"");
    nt_release(bad);
    nt_graph_destroy(g);
    for (int i = 0; i < 2; i++) {
        nt_release(in[i]);
        nt_release(acc[i]);
    }
    nt_release(a3);
    nt_release(b5);
    nt_comm_destroy(cm);
}

/* A tensor the program reads, released: NT_ERELEASED, nothing queued. */
static void test_released(void **state)
{
    (void)state;
    nt_comm *cm = comm2();
    nt_tensor *w[2], *acc[2], *out[2];
    ones_on(w, 2);
    ones_on(acc, 2);
    assert_int_equal(nt_graph_capture_begin_multi(), 0);
    assert_int_equal(nt_all_reduce(cm, w, out, NT_REDUCE_SUM), 0);
    for (int i = 0; i < 2; i++) {
        nt_device_set(i);
        assert_int_equal(nt_add_inplace(acc[i], out[i]), 0);
        nt_release(out[i]);
    }
    nt_device_set(0);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    float v[4];
    vals(acc[1], v);
    assert_true(v[0] == 2 + 3);
    nt_release(w[1]); /* the collective's input on device 1: the user's */
    nt_test_expect_err(nt_graph_replay(g), NT_ERELEASED, "nt_graph_replay", "released");
    vals(acc[0], v);
    assert_true(v[0] == 1 + 3); /* nothing ran */
    vals(acc[1], v);
    assert_true(v[0] == 2 + 3);
    nt_graph_destroy(g);
    nt_release(w[0]);
    nt_release(acc[0]);
    nt_release(acc[1]);
    nt_comm_destroy(cm);
}

typedef struct racer {
    nt_graph *g;
    int n, rc;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    for (int k = 0; k < r->n && !r->rc; k++)
        r->rc = nt_graph_replay(r->g);
    return NULL;
}

/* Replays from two threads at once serialise: 2n replays' worth. */
static void test_replay_race(void **state)
{
    (void)state;
    nt_comm *cm = comm2();
    nt_tensor *w[2], *acc[2], *out[2];
    ones_on(w, 2);
    ones_on(acc, 2);
    assert_int_equal(nt_graph_capture_begin_multi(), 0);
    for (int i = 0; i < 2; i++) {
        nt_device_set(i);
        assert_int_equal(nt_add_inplace(w[i], acc[i]), 0); /* w += acc */
    }
    assert_int_equal(nt_all_reduce(cm, w, out, NT_REDUCE_MAX), 0);
    for (int i = 0; i < 2; i++) {
        nt_device_set(i);
        assert_int_equal(nt_copy_into(acc[i], out[i]), 0); /* acc = max(w) */
        nt_release(out[i]);
    }
    nt_device_set(0);
    nt_graph *g = nt_graph_capture_end();
    assert_non_null(g);
    /* each step: w_i += acc_i, acc_i = max_j w_j (integers in f32: exact) */
    double ew[2] = {1 + 1, 2 + 2}, ea = 4;
    racer r1 = {g, 20, 0}, r2 = {g, 20, 0};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, race, &r1), 0);
    assert_int_equal(pthread_create(&t2, NULL, race, &r2), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(r1.rc, 0);
    assert_int_equal(r2.rc, 0);
    for (int k = 0; k < 40; k++) {
        ew[0] += ea;
        ew[1] += ea;
        ea = ew[0] > ew[1] ? ew[0] : ew[1];
    }
    float v[4];
    vals(w[0], v);
    assert_true(v[0] == (float)ew[0]);
    vals(acc[1], v);
    assert_true(v[2] == (float)ea);
    nt_graph_info info;
    assert_int_equal(nt_graph_info_get(g, &info), 0);
    assert_int_equal(info.replays, 40);
    nt_graph_destroy(g);
    for (int i = 0; i < 2; i++) {
        nt_release(w[i]);
        nt_release(acc[i]);
    }
    nt_comm_destroy(cm);
}

static void *other_thread_op(void *arg)
{
    nt_tensor *t = arg;
    nt_device_set(1);
    nt_tensor *r = nt_add_scalar(t, 1.0);
    int rc = r ? 0 : nt_last_error();
    nt_release(r);
    return (void *)(intptr_t)rc;
}

/* What a capture of several streams refuses, and the capture errors that
 * hold for it as for one stream. */
static void test_refused(void **state)
{
    (void)state;
    nt_comm *cm = comm2();
    nt_tensor *w[2], *out[2];
    ones_on(w, 2);
    /* nesting, both ways */
    assert_int_equal(nt_graph_capture_begin_multi(), 0);
    nt_test_expect_err(nt_graph_capture_begin(), NT_ESTATE, "nt_graph_capture_begin", "nest");
    nt_test_expect_err(nt_graph_capture_begin_multi(), NT_ESTATE,
                       "nt_graph_capture_begin_multi", "nest");
    /* a host read */
    nt_device_set(1);
    nt_tensor *t = nt_sum(w[1], 0, false);
    double d;
    nt_test_expect_err(nt_item(t, &d), NT_ESTATE, "nt_item", "capturing");
    nt_release(t);
    nt_device_set(0);
    assert_null(nt_graph_capture_end());
    assert_int_equal(nt_last_error(), NT_ESTATE);
    assert_non_null(strstr(nt_last_error_message(), "cannot be replayed"));
    /* another thread's op on a stream the capture holds */
    assert_int_equal(nt_graph_capture_begin_multi(), 0);
    nt_device_set(1);
    t = nt_add_scalar(w[1], 1.0);
    pthread_t th;
    void *res;
    assert_int_equal(pthread_create(&th, NULL, other_thread_op, w[1]), 0);
    pthread_join(th, &res);
    assert_int_equal((int)(intptr_t)res, NT_ESTATE);
    nt_release(t);
    nt_device_set(0);
    nt_graph *g = nt_graph_capture_end();
    if (!g)
        fail_msg("%s", nt_last_error_message());
    nt_graph_destroy(g);
    /* host data baked in */
    assert_int_equal(nt_graph_capture_begin_multi(), 0);
    nt_device_set(1);
    float h[4] = {1, 2, 3, 4};
    nt_tensor *fh = nt_from_host(h, NT_F32, 1, (int64_t[]){4});
    t = nt_add(fh, w[1]);
    nt_release(fh);
    nt_release(t);
    nt_device_set(0);
    assert_null(nt_graph_capture_end());
    assert_non_null(strstr(nt_last_error_message(), "filled from the host"));
    /* nothing recorded */
    assert_int_equal(nt_graph_capture_begin_multi(), 0);
    assert_null(nt_graph_capture_end());
    assert_non_null(strstr(nt_last_error_message(), "recorded no op"));
    /* a single-stream capture still refuses a collective */
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_all_reduce(cm, w, out, NT_REDUCE_SUM);
    assert_null(nt_graph_capture_end());
    assert_non_null(strstr(nt_last_error_message(), "collectives run outside"));
    for (int i = 0; i < 2; i++)
        nt_release(out[i]);
    nt_test_expect_err(nt_graph_capture_end() ? 0 : nt_last_error(), NT_ESTATE,
                       "nt_graph_capture_end", "not capturing");
    assert_int_equal(nt_sync(), 0);
    for (int i = 0; i < 2; i++)
        nt_release(w[i]);
    nt_comm_destroy(cm);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child"))
        return child_main(argv[2]);
    if (ddp_h_self())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_collective_replay, ddp_h_setup_2dev,
                                        ddp_h_teardown_2dev),
        cmocka_unit_test_setup_teardown(test_released, ddp_h_setup_2dev, ddp_h_teardown_2dev),
        cmocka_unit_test_setup_teardown(test_replay_race, ddp_h_setup_2dev,
                                        ddp_h_teardown_2dev),
        cmocka_unit_test_setup_teardown(test_refused, ddp_h_setup_2dev, ddp_h_teardown_2dev),
        cmocka_unit_test(test_bits_vs_eager),
        cmocka_unit_test(test_zero_and_amp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
