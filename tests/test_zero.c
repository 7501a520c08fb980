/* tests/test_zero.c - the device mesh (dist/mesh.c) and ZeRO stages 1-3
 * (dist/ddp.c, docs/sharding.md): the parameters after training are the
 * same bits for every stage and every core count as plain nt_ddp's and a
 * one-core run's (AdamW and SGD with momentum, with gradient clipping), on
 * both backends and in the modes; per-core model-state bytes against the
 * formula; stage 3 trains on 8 cores a model one core's NT_HBM_BYTES cannot
 * hold; sharded checkpoints; every error path.
 *
 * NT_SIM_CORES is read by nt_init, so the core counts run as child
 * processes of this test (it re-executes itself with --child ...:
 * tests/ddp_harness.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#define BENCH_NAME "tests/test_zero"
#include "ddp_harness.h"

/* ---------------- a small MLP (sizes that need padding on 8 ranks) ---------------- */

enum { F = 12, H = 24, C = DDP_H_CLASSES, NP = DDP_H_NP };
enum { STEPS = 8, SHARDS = 8, B = 32 };

static void make_data(float *x, int32_t *y, int rows, int cols, uint32_t seed)
{
    ddp_h_data(x, y, rows, cols, 1.0f, seed);
}

static int make_params(nt_tensor **p, int h, int f, uint64_t seed)
{
    return ddp_h_params(p, NT_F32, h, f, seed);
}

/* Layer l (0, 1) of the MLP on h: the hidden layer, then the loss. */
static nt_tensor *model_layer(nt_tensor **p, int l, nt_tensor *h, nt_tensor *y)
{
    return l == 0 ? nt_relu(nt_linear(h, p[0], p[1]))
                  : nt_cross_entropy(nt_linear(h, p[2], p[3]), y);
}

static nt_tensor *model_loss(nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    return model_layer(p, 1, model_layer(p, 0, x, y), y);
}

/* ---------------- the training a child runs ---------------- */

typedef struct run {
    int stage;
    bool sgd, clip, bf16; /* bf16: the forward under bf16 autocast */
    bool overlap;         /* nt_ddp_set_overlap (stages 2, 3) */
    bool joined;          /* rounds of one shard a device, one nt_ddp_backward_shards each */
    int h, f, steps;
    const char *save, *load; /* checkpoint paths (NULL: none) */
    int save_at;             /* the step after which to save */
    bool reshard;
} run;

static nt_optim *make_opt(const run *r, nt_tensor **ps)
{
    return r->sgd ? nt_optim_sgd(ps, NP, 5e-2, 0.9, 1e-3, false)
                  : nt_optim_adamw(ps, NP, 1e-2, 0.9, 0.999, 1e-8, 0.01);
}

/* The harness's hooks for a run: the loss (under bf16 autocast with
 * r->bf16), stage 3's gathers layer by layer (the next layer's issued
 * before the first shard's compute: the prefetch), clipping. */
static nt_tensor *run_loss(void *ctx, nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    const run *r = ctx;
    if (r->bf16)
        nt_autocast_begin(NT_BF16);
    nt_tensor *loss = model_loss(p, x, y);
    if (r->bf16)
        nt_autocast_end();
    return loss;
}

static int run_gather(void *ctx, nt_ddp *d)
{
    const run *r = ctx;
    return r->stage == 3 && (nt_ddp_gather(d, 0, 2) || nt_ddp_gather(d, 2, NP)) ? -1 : 0;
}

static int run_clip(void *ctx, nt_ddp *d)
{
    const run *r = ctx;
    if (!r->clip)
        return 0;
    nt_device_set(0);
    nt_tensor *t = nt_ddp_clip_grad_norm(d, 0.5);
    if (!t)
        return -1;
    nt_release(t);
    return 0;
}

/* The shards of a step in rounds of one shard a local device (devices[i]
 * = i): round q takes each device's q-th shard, runs layer 0 of every
 * device's shard, then layer 1 (the loss), and one nt_ddp_backward_shards
 * of the round's losses (docs/sharding.md, "The order"). */
static int run_joined(void *ctx, nt_ddp *d, int step, const float *xb, const int32_t *yb)
{
    const run *r = ctx;
    (void)step;
    enum { MAXD = DDP_H_MAXDEV };
    static int sh[MAXD][SHARDS];
    int cnt[MAXD] = {0}, ndev = nt_device_count(), rc = 0;
    for (int s = 0; s < SHARDS; s++) {
        int dev = nt_ddp_shard_device(d, s);
        if (dev >= 0)
            sh[dev][cnt[dev]++] = s;
    }
    for (int q = 0; q < cnt[0] && !rc; q++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *h[MAXD], *y[MAXD];
        int shards[MAXD];
        for (int i = 0; i < ndev; i++) {
            shards[i] = sh[i][q];
            nt_device_set(i);
            h[i] = nt_ddp_shard_from_host(d, shards[i], xb, NT_F32, 2, (int64_t[]){B, r->f});
            y[i] = nt_ddp_shard_from_host(d, shards[i], yb, NT_I32, 1, (int64_t[]){B});
        }
        if (r->bf16)
            nt_autocast_begin(NT_BF16);
        for (int l = 0; l < 2; l++)
            for (int i = 0; i < ndev; i++) {
                nt_device_set(i);
                h[i] = model_layer(nt_ddp_params(d, i), l, h[i], y[i]);
            }
        if (r->bf16)
            nt_autocast_end();
        nt_device_set(0);
        rc = nt_ddp_backward_shards(d, shards, h, ndev);
        nt_scope_end(sc);
    }
    return rc;
}

/* One step: every shard's forward and backward, the reduce, clipping, the
 * optimizers (ddp_h_step). */
static int train_step(nt_ddp *d, const run *r, nt_optim **opts, int ndev, int step)
{
    ddp_h_cfg cfg = {.shards = SHARDS, .rows = B, .cols = r->f, .range = 1.0f,
                     .loss = run_loss, .before = run_gather, .after_reduce = run_clip,
                     .shards_fn = r->joined ? run_joined : NULL, .ctx = (void *)r};
    return ddp_h_step(d, &cfg, opts, ndev, step);
}

static int child_train(const run *r)
{
    if (nt_init() != 0)
        return 3;
    int devs[DDP_H_MAXDEV], ndev = ddp_h_devices(devs), rc = 0;
    nt_tensor *p[NP];
    nt_device_set(0);
    if (make_params(p, r->h, r->f, 11))
        return 4;
    nt_ddp *d = nt_ddp_create(p, NP, SHARDS, devs, ndev);
    if (!d || nt_ddp_set_zero(d, r->stage) || (r->overlap && nt_ddp_set_overlap(d, true))) {
        fprintf(stderr, "child: %s\n", nt_last_error_message());
        return 4;
    }
    if (r->stage == 3) /* the shards are the parameters: ours may go */
        for (int j = 0; j < NP; j++)
            nt_release(p[j]), p[j] = NULL;
    nt_optim *opts[64];
    for (int i = 0; i < ndev; i++) {
        nt_device_set(devs[i]);
        opts[i] = make_opt(r, r->stage ? nt_ddp_zero_shards(d, devs[i])
                                       : nt_ddp_params(d, devs[i]));
    }
    if (r->load && nt_ddp_load(d, r->load, opts, ndev, r->reshard)) {
        printf("load failed: %d %s\n", nt_last_error(), nt_last_error_message());
        rc = 9;
    }
    int first = r->load ? r->save_at : 0;
    for (int step = first; step < r->steps && !rc; step++) {
        if (train_step(d, r, opts, ndev, step)) {
            fprintf(stderr, "child: step %d: %s\n", step, nt_last_error_message());
            rc = 5;
        }
        if (!rc && r->save && step + 1 == r->save_at && nt_ddp_save(d, r->save, opts, ndev)) {
            fprintf(stderr, "child: save: %s\n", nt_last_error_message());
            rc = 6;
        }
    }
    if (!rc && r->stage == 3 && nt_ddp_gather(d, 0, NP))
        rc = 7;
    if (!rc && ddp_h_report(d, devs, ndev, NP))
        rc = 8;
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_ddp_destroy(d);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
    nt_shutdown();
    return rc;
}

/* ---------------- running children ---------------- */

/* The CRC a training child prints, checking its core count and replicas. */
static unsigned train_crc(const char *const *env, const char *spec, int cores)
{
    return ddp_h_child_crc(env, spec, NULL, cores);
}

/* spec: "<stage><a|s><c|->[b][o][j]", e.g. "2ac" = stage 2, AdamW, clipping;
 * b: bf16 autocast; o: nt_ddp_set_overlap; j: joined rounds (run_joined). */
static void parse_spec(const char *spec, run *r)
{
    memset(r, 0, sizeof *r);
    r->stage = spec[0] - '0';
    r->sgd = spec[1] == 's';
    r->clip = spec[2] == 'c';
    r->bf16 = spec[2] && spec[3] == 'b';
    r->overlap = spec[2] && strchr(spec + 3, 'o');
    r->joined = spec[2] && strchr(spec + 3, 'j');
    r->h = H, r->f = F, r->steps = STEPS;
}

/* ---------------- bit-identical for every stage and size ---------------- */

static const char *const CORES[] = {"NT_SIM_CORES=1", "NT_SIM_CORES=2", "NT_SIM_CORES=4",
                                    "NT_SIM_CORES=8"};

/* Stage x cores on the simulator (adaptive), AdamW with clipping and SGD
 * with momentum: one CRC per optimizer; then the other backend and modes
 * at 1 and 8 cores for every stage: the same CRC. */
static void test_bitwise_stages_sizes(void **state)
{
    (void)state;
    static const char *const opt_specs[][4] = {{"0ac", "1ac", "2ac", "3ac"},
                                               {"0s-", "1s-", "2s-", "3s-"}};
    unsigned ref[2] = {0, 0};
    for (int o = 0; o < 2; o++) {
        printf("# %s, %d steps, %d shards: crc32 of the parameters\n",
               o ? "SGD momentum 0.9" : "AdamW + clip_grad_norm 0.5", STEPS, SHARDS);
        printf("# stage   1 core    2 cores   4 cores   8 cores\n");
        for (int st = 0; st < 4; st++) {
            char row[128];
            int k = snprintf(row, sizeof row, "# %d    ", st);
            for (int c = 0; c < 4; c++) {
                const char *env[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", CORES[c], NULL};
                unsigned crc = train_crc(env, opt_specs[o][st], 1 << c);
                k += snprintf(row + k, sizeof row - (size_t)k, "  %08x", crc);
                if (st == 0 && c == 0)
                    ref[o] = crc;
                else if (crc != ref[o])
                    fail_msg("stage %d on %d cores (%s): %08x, plain 1-core DDP %08x", st,
                             1 << c, opt_specs[o][st], crc, ref[o]);
            }
            printf("%s\n", row);
        }
    }
    static const char *const cfg[][3] = {{"NT_BACKEND=cpu", "NT_MODE=adaptive", NULL},
                                         {"NT_BACKEND=cpu", "NT_DETERMINISTIC=1", NULL},
                                         {"NT_BACKEND=sim", "NT_DETERMINISTIC=1", NULL}};
    for (int g = 0; g < 3; g++)
        for (int st = 0; st < 4; st++)
            for (int c = 0; c < 4; c += 3) {
                const char *env[] = {cfg[g][0], cfg[g][1], CORES[c], NULL};
                char spec[4] = {(char)('0' + st), 'a', 'c', 0};
                unsigned crc = train_crc(env, spec, 1 << c);
                if (crc != ref[0])
                    fail_msg("%s %s stage %d, %d cores: %08x, sim adaptive %08x", cfg[g][0],
                             cfg[g][1], st, 1 << c, crc, ref[0]);
            }
    printf("# cpu adaptive, cpu and sim deterministic: stages 0-3 on 1 and 8 cores give "
           "%08x too\n", ref[0]);
    /* the reduce-scatter overlapped with the backward: the same bits */
    for (int o = 0; o < 2; o++)
        for (int st = 2; st < 4; st++)
            for (int c = 0; c < 4; c++) {
                const char *env[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", CORES[c], NULL};
                char spec[5] = {(char)('0' + st), o ? 's' : 'a', o ? '-' : 'c', 'o', 0};
                unsigned crc = train_crc(env, spec, 1 << c);
                if (crc != ref[o])
                    fail_msg("stage %d with nt_ddp_set_overlap on %d cores (%s): %08x, plain "
                             "1-core DDP %08x", st, 1 << c, spec, crc, ref[o]);
            }
    for (int c = 0; c < 4; c += 3) {
        const char *env[] = {"NT_BACKEND=cpu", "NT_DETERMINISTIC=1", CORES[c], NULL};
        unsigned crc = train_crc(env, "3aco", 1 << c);
        if (crc != ref[0])
            fail_msg("cpu deterministic, stage 3 with overlap, %d cores: %08x, %08x", 1 << c,
                     crc, ref[0]);
    }
    printf("# stages 2, 3 with nt_ddp_set_overlap: %08x (AdamW + clip) and %08x (SGD) on 1, "
           "2, 4, 8 cores; cpu deterministic on 1 and 8 too\n", ref[0], ref[1]);
    /* under bf16 autocast (f32 parameters): one CRC for every stage, 1 and 8 cores */
    unsigned bref = 0;
    for (int st = 0; st < 4; st++)
        for (int c = 0; c < 4; c += 3) {
            const char *env[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", CORES[c], NULL};
            char spec[5] = {(char)('0' + st), 'a', 'c', 'b', 0};
            unsigned crc = train_crc(env, spec, 1 << c);
            if (st == 0 && c == 0)
                bref = crc;
            else if (crc != bref)
                fail_msg("bf16 autocast, stage %d, %d cores: %08x, 1-core plain DDP %08x", st,
                         1 << c, crc, bref);
        }
    printf("# under bf16 autocast: stages 0-3 on 1 and 8 cores give %08x\n", bref);
}

/* ---------------- joined rounds (nt_ddp_backward_shards) ---------------- */

/* Every local shard's backward in joined rounds (run_joined: layer by layer
 * over the devices, one nt_ddp_backward_shards a round) against the
 * per-shard nt_ddp_backward loop: on 4 cores (2 rounds of 4 devices) the
 * same CRC at stages 0-3 on both backends in every mode, each against the
 * loop in the same configuration; on the simulator (adaptive) also 2 cores
 * (4 rounds) and 8 (1 round), with nt_ddp_set_overlap at stages 2 and 3,
 * and SGD with momentum. */
static void test_joined_rounds(void **state)
{
    (void)state;
    const char *env1[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", CORES[0], NULL};
    unsigned ref = train_crc(env1, "0ac", 1), sref = train_crc(env1, "0s-", 1);
    static const char *const be[] = {"NT_BACKEND=sim", "NT_BACKEND=cpu"};
    static const char *const mode[] = {"NT_MODE=deterministic", "NT_MODE=eager",
                                       "NT_MODE=adaptive", "NT_MODE=lazy"};
    printf("# joined rounds, 4 cores, AdamW + clip: crc32 for stages 0-3 (the per-shard "
           "loop: %08x)\n", ref);
    for (int b = 0; b < 2; b++)
        for (int md = 0; md < 4; md++) {
            const char *env[] = {be[b], mode[md], CORES[2], NULL};
            unsigned loop = train_crc(env, "0ac", 4);
            if (loop != ref)
                fail_msg("%s %s: the per-shard loop gives %08x, 1 core %08x", be[b], mode[md],
                         loop, ref);
            char row[128];
            int k = snprintf(row, sizeof row, "# %s %-21s", be[b] + 11, mode[md]);
            for (int st = 0; st < 4; st++) {
                char spec[5] = {(char)('0' + st), 'a', 'c', 'j', 0};
                unsigned crc = train_crc(env, spec, 4);
                k += snprintf(row + k, sizeof row - (size_t)k, "  %08x", crc);
                if (crc != loop)
                    fail_msg("%s %s stage %d, joined rounds on 4 cores: %08x, the per-shard "
                             "loop %08x", be[b], mode[md], st, crc, loop);
            }
            printf("%s\n", row);
        }
    for (int c = 1; c < 4; c += 2)
        for (int st = 0; st < 4; st++) {
            const char *env[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", CORES[c], NULL};
            char spec[6] = {(char)('0' + st), 'a', 'c', 'j', 0, 0};
            unsigned crc = train_crc(env, spec, 1 << c);
            if (crc != ref)
                fail_msg("stage %d, joined rounds on %d cores: %08x, the loop %08x", st,
                         1 << c, crc, ref);
            spec[1] = 's', spec[2] = '-';
            if ((crc = train_crc(env, spec, 1 << c)) != sref)
                fail_msg("SGD stage %d, joined rounds on %d cores: %08x, the loop %08x", st,
                         1 << c, crc, sref);
            if (st < 2)
                continue;
            spec[1] = 'a', spec[2] = 'c', spec[4] = 'o';
            if ((crc = train_crc(env, spec, 1 << c)) != ref)
                fail_msg("stage %d with nt_ddp_set_overlap, joined rounds on %d cores: %08x, "
                         "the loop %08x", st, 1 << c, crc, ref);
        }
    printf("# sim adaptive, 2 and 8 cores, stages 0-3: %08x (AdamW + clip, with overlap at "
           "2, 3) and %08x (SGD)\n", ref, sref);
}

/* ---------------- a layer's memory released after its forward ---------------- */

/* A 4-layer MLP of width LD (three tanh layers and a linear one into
 * cross-entropy; weights [LD, LD] of 256 KiB, biases [LD]), layer l's
 * parameters [2l, 2l + 2). */
enum { LL = 4, LD = 256, LNP = 2 * LL, LROWS = 8 };

static nt_tensor *lay_forward(nt_tensor **p, int l, nt_tensor *h)
{
    nt_tensor *z = nt_linear(h, p[2 * l], p[2 * l + 1]);
    return l + 1 < LL ? nt_tanh(z) : z;
}

/* The child: 3 AdamW steps at stage 3 over every core in 2 * cores
 * shards (2 rounds a step), in `mode`: 0 the per-shard nt_ddp_backward
 * loop, 1 joined rounds (nt_ddp_backward_shards) with every layer gathered
 * first, 2 joined rounds with each layer gathered just before its forward
 * and marked by nt_ddp_layer_done after it.  Prints the CRC of the
 * gathered parameters after the steps, the largest per-core peak of live
 * bytes over the steps (from after the setup) and Psi. */
static int child_layers(int mode)
{
    if (nt_init() != 0)
        return 3;
    int devs[DDP_H_MAXDEV], ndev = ddp_h_devices(devs), S = 2 * ndev, rc = 0;
    nt_tensor *p[LNP];
    double psi = 0;
    nt_device_set(0);
    for (int j = 0; j < LNP && !rc; j++) {
        nt_tensor *r = j % 2 ? nt_randn(NT_F32, 1, (int64_t[]){LD}, 900 + (uint64_t)j)
                             : nt_randn(NT_F32, 2, (int64_t[]){LD, LD}, 900 + (uint64_t)j);
        p[j] = nt_mul_scalar(r, j % 2 ? 0.1 : 1.0 / 16);
        nt_release(r);
        rc = !p[j] || nt_set_requires_grad(p[j], true);
        psi += p[j] ? (double)nt_numel(p[j]) : 0;
    }
    nt_ddp *d = rc ? NULL : nt_ddp_create(p, LNP, S, devs, ndev);
    if (!d || nt_ddp_set_zero(d, 3)) {
        fprintf(stderr, "child: %s\n", nt_last_error_message());
        return 4;
    }
    for (int j = 0; j < LNP; j++)
        nt_release(p[j]);
    nt_optim *opts[DDP_H_MAXDEV];
    for (int i = 0; i < ndev; i++) {
        nt_device_set(i);
        opts[i] = nt_optim_adamw(nt_ddp_zero_shards(d, i), LNP, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    }
    nt_device_set(0);
    if (nt_sync())
        return 4;
    nt_stats_reset();
    static float xb[64 * LROWS * LD];
    static int32_t yb[64 * LROWS];
    for (int step = 0; step < 3 && !rc; step++) {
        ddp_h_data(xb, yb, S * LROWS, LD, 1.0f, 300 + (uint32_t)step);
        if (mode < 2)
            rc = nt_ddp_gather(d, 0, LNP);
        for (int q = 0; q < 2 && !rc; q++) { /* round q: shard q of each device's block */
            nt_scope *sc = nt_scope_begin();
            nt_tensor *h[DDP_H_MAXDEV], *y[DDP_H_MAXDEV];
            int sh[DDP_H_MAXDEV];
            for (int i = 0; i < ndev; i++) {
                sh[i] = 2 * i + q;
                nt_device_set(i);
                h[i] = nt_ddp_shard_from_host(d, sh[i], xb, NT_F32, 2,
                                              (int64_t[]){S * LROWS, LD});
                y[i] = nt_ddp_shard_from_host(d, sh[i], yb, NT_I32, 1, (int64_t[]){S * LROWS});
            }
            if (mode == 0) { /* each shard alone, whole */
                for (int i = 0; i < ndev && !rc; i++) {
                    nt_device_set(i);
                    for (int l = 0; l < LL; l++)
                        h[i] = lay_forward(nt_ddp_params(d, i), l, h[i]);
                    rc = nt_ddp_backward(d, sh[i], nt_cross_entropy(h[i], y[i]));
                }
            } else {
                for (int l = 0; l < LL && !rc; l++) {
                    if (mode == 2)
                        rc = nt_ddp_gather(d, 2 * l, 2 * l + 2);
                    for (int i = 0; i < ndev && !rc; i++) {
                        nt_device_set(i);
                        h[i] = lay_forward(nt_ddp_params(d, i), l, h[i]);
                    }
                    nt_device_set(0);
                    if (!rc && mode == 2)
                        rc = nt_ddp_layer_done(d, 2 * l, 2 * l + 2, h, h);
                }
                for (int i = 0; i < ndev && !rc; i++) {
                    nt_device_set(i);
                    h[i] = nt_cross_entropy(h[i], y[i]);
                }
                nt_device_set(0);
                if (!rc)
                    rc = nt_ddp_backward_shards(d, sh, h, ndev);
            }
            nt_scope_end(sc);
        }
        nt_device_set(0);
        if (!rc)
            rc = nt_ddp_reduce(d);
        if (!rc)
            rc = nt_ddp_step(d, opts, ndev);
    }
    if (!rc)
        rc = nt_ddp_gather(d, 0, LNP) || nt_sync();
    if (rc) {
        fprintf(stderr, "child: %s\n", nt_last_error_message());
        return 5;
    }
    int64_t peak = 0;
    for (int i = 0; i < ndev; i++)
        peak = nt_device_bytes_live_peak(i) > peak ? nt_device_bytes_live_peak(i) : peak;
    printf("layers %d %08x %lld %.0f\n", mode, ddp_h_crc(nt_ddp_params(d, 0), LNP),
           (long long)peak, psi);
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_ddp_destroy(d);
    nt_shutdown();
    return 0;
}

/* nt_ddp_layer_done's errors on 2 of the 8 devices: each names the call
 * and the argument and changes nothing (the layer stays gathered, then is
 * released by a good call); a marked layer differentiated by a plain
 * nt_backward is refused in that backward; nt_ddp_gather fills the
 * released layer again with the same bits. */
static void test_layer_done_errors(void **state)
{
    (void)state;
    const char *fn = "nt_ddp_layer_done";
    int devs[2] = {0, 1};
    nt_tensor *p[NP], *z[NP];
    nt_device_set(0);
    assert_int_equal(make_params(p, 128, F, 2), 0);
    assert_int_equal(make_params(z, 128, F, 2), 0);
    nt_ddp *d = nt_ddp_create(p, NP, 2, devs, 2), *d0 = nt_ddp_create(z, NP, 2, devs, 2);
    assert_non_null(d);
    assert_non_null(d0);
    assert_int_equal(nt_ddp_set_zero(d, 3), 0);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *in[2], *out[2];
    for (int k = 0; k < 2; k++) {
        nt_device_set(k);
        in[k] = nt_ones(NT_F32, 2, (int64_t[]){2, F});
        assert_int_equal(nt_set_requires_grad(in[k], true), 0);
    }
    nt_device_set(0);
    nt_test_expect_err(nt_ddp_layer_done(d, 0, 2, in, out), NT_ESTATE, fn,
                       "parameter 0 of device 0 is not gathered", "nt_ddp_gather(d, 0, 2)");
    nt_test_expect_err(nt_ddp_layer_done(d0, 0, 2, in, out), NT_ESTATE, fn, "stage 0");
    assert_int_equal(nt_ddp_gather(d, 0, NP), 0);
    uint32_t before = ddp_h_crc(nt_ddp_params(d, 1), NP);
    nt_test_expect_err(nt_ddp_layer_done(NULL, 0, 2, in, out), NT_EINVAL, fn, "'d'");
    nt_test_expect_err(nt_ddp_layer_done(d, 0, 2, NULL, out), NT_EINVAL, fn, "'in' is NULL");
    nt_test_expect_err(nt_ddp_layer_done(d, 0, 2, in, NULL), NT_EINVAL, fn, "'out' is NULL");
    nt_test_expect_err(nt_ddp_layer_done(d, 2, 5, in, out), NT_EINVAL, fn, "'lo', 'hi' are 2, 5");
    nt_test_expect_err(nt_ddp_layer_done(d, 1, 1, in, out), NT_EINVAL, fn, "'lo', 'hi' are 1, 1");
    nt_tensor *swapped[2] = {in[1], in[0]};
    nt_test_expect_err(nt_ddp_layer_done(d, 0, 2, swapped, out), NT_EINVAL, fn,
                       "'in[0]' is on device 1", "local device 0");
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_test_expect_err(nt_ddp_layer_done(d, 0, 2, in, out), NT_ESTATE, fn, "capturing");
    nt_graph_destroy(nt_graph_capture_end());
    nt_clear_error();
    /* nothing released by the refusals */
    int64_t live = nt_device_bytes_live(1);
    assert_int_equal(ddp_h_crc(nt_ddp_params(d, 1), NP), before);
    /* a good mark: w1 (128 x 12 f32, 6 KiB) gives its memory back, b1 stays */
    nt_tensor *h[2];
    for (int k = 0; k < 2; k++) {
        nt_device_set(k);
        h[k] = nt_linear(in[k], nt_ddp_params(d, k)[0], nt_ddp_params(d, k)[1]);
    }
    nt_device_set(0);
    assert_int_equal(nt_ddp_layer_done(d, 0, 2, h, out), 0);
    assert_true(nt_device_bytes_live(1) <= live - 2048); /* h[1] is 1 KiB */
    /* differentiated outside nt_ddp_backward_shards */
    nt_test_expect_err(nt_backward(nt_sum(out[0], NT_DIM_ALL, false)), NT_ESTATE,
                       "outside the backward of its round", "nt_ddp_backward_shards");
    /* gathered again: the same bits */
    assert_int_equal(nt_ddp_gather(d, 0, NP), 0);
    assert_int_equal(ddp_h_crc(nt_ddp_params(d, 1), NP), before);
    nt_scope_end(sc);
    assert_int_equal(nt_sync(), 0);
    nt_ddp_destroy(d);
    nt_ddp_destroy(d0);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]), nt_release(z[j]);
}

/* Stage 3 on 4 cores, a 4-layer MLP (tests/test_zero.c child_layers), in
 * joined rounds: with each layer released after its forward and filled
 * again (with the next prefetched) for its backward (nt_ddp_layer_done),
 * the parameters after 3 steps are the bits of the per-shard loop's and
 * of joined rounds without the release, on both backends and in the modes,
 * and the per-core peak falls by at least a layer's 4 * LD * LD bytes
 * (the released layers), staying above the model state's 16P/N. */
static void test_layer_release(void **state)
{
    (void)state;
    static const char *const cfg[][2] = {{"NT_BACKEND=sim", "NT_MODE=deterministic"},
                                         {"NT_BACKEND=sim", "NT_MODE=adaptive"},
                                         {"NT_BACKEND=sim", "NT_MODE=lazy"},
                                         {"NT_BACKEND=cpu", "NT_MODE=eager"},
                                         {"NT_BACKEND=cpu", "NT_MODE=deterministic"}};
    printf("# stage 3, 4 cores, 4 layers of %dx%d: per-core peak MiB (16P/N, per-shard loop, "
           "joined rounds, joined + nt_ddp_layer_done)\n", LD, LD);
    for (int g = 0; g < 5; g++) {
        unsigned crc[3];
        long long peak[3];
        double psi = 0;
        for (int mode = 0; mode < 3; mode++) {
            const char *env[] = {cfg[g][0], cfg[g][1], "NT_SIM_CORES=4", NULL};
            char arg[4] = {(char)('0' + mode), 0}, line[256];
            char *argv[] = {ddp_h_exe, "--layers", arg, NULL};
            ddp_h_run(env, argv, line, sizeof line);
            int m2 = -1;
            if (sscanf(line, "layers %d %x %lld %lf", &m2, &crc[mode], &peak[mode], &psi) != 4 ||
                m2 != mode)
                fail_msg("child printed '%s'", line);
        }
        double state16 = 16 * psi / 4, layer = 4.0 * LD * LD;
        printf("# %s %-21s 16P/N %.3f  loop %.3f  joined %.3f  released %.3f  (crc %08x)\n",
               cfg[g][0] + 11, cfg[g][1], state16 / 1048576, peak[0] / 1048576.0,
               peak[1] / 1048576.0, peak[2] / 1048576.0, crc[0]);
        if (crc[1] != crc[0] || crc[2] != crc[0])
            fail_msg("%s %s: loop %08x, joined %08x, released %08x", cfg[g][0], cfg[g][1],
                     crc[0], crc[1], crc[2]);
        if ((double)peak[2] > (double)peak[1] - layer || (double)peak[2] < state16)
            fail_msg("%s %s: peak %lld with the release, %lld without (a layer is %.0f bytes, "
                     "16P/N %.0f)", cfg[g][0], cfg[g][1], peak[2], peak[1], layer, state16);
    }
    /* One core (one rank, 2 rounds of one shard): a bucket of one parameter
     * gathers into a view of its shard, which the release must leave alone
     * (it released the shard, and the next read failed); the same bits as
     * the per-shard loop. */
    unsigned crc1[3];
    for (int mode = 0; mode < 3; mode += 2) {
        const char *env[] = {"NT_BACKEND=sim", "NT_MODE=adaptive", "NT_SIM_CORES=1", NULL};
        char arg[4] = {(char)('0' + mode), 0}, line[256];
        char *argv[] = {ddp_h_exe, "--layers", arg, NULL};
        ddp_h_run(env, argv, line, sizeof line);
        long long pk;
        double ps;
        int m2 = -1;
        if (sscanf(line, "layers %d %x %lld %lf", &m2, &crc1[mode], &pk, &ps) != 4 || m2 != mode)
            fail_msg("one core, mode %d: child printed '%s'", mode, line);
    }
    printf("# one core: loop %08x, joined + nt_ddp_layer_done %08x\n", crc1[0], crc1[2]);
    assert_true(crc1[0] == crc1[2]);
}

/* ---------------- memory against the formula ---------------- */

/* f32 AdamW (4-byte parameters and gradients, 8 bytes of state), N ranks:
 * what each core holds after nt_ddp_reduce (docs/sharding.md). */
static double formula_bytes(int stage, double psi, int n)
{
    switch (stage) {
    case 0: return 16 * psi;
    case 1: return 8 * psi + 8 * psi / n;
    case 2: return 4 * psi + 12 * psi / n;
    default: return 16 * psi / n;
    }
}

/* The child: 2 steps of a 512-wide MLP at `stage`; after the second
 * step's nt_ddp_reduce (the gradients and the optimizer state exist)
 * prints every core's live bytes and the formula's. */
static int child_mem(int stage)
{
    if (nt_init() != 0)
        return 3;
    int ndev = nt_device_count(), devs[64];
    for (int i = 0; i < ndev; i++)
        devs[i] = i;
    run r = {.stage = stage, .h = 512, .f = 512, .steps = 2};
    nt_tensor *p[NP];
    nt_device_set(0);
    if (make_params(p, r.h, r.f, 3))
        return 4;
    double psi = 0;
    for (int j = 0; j < NP; j++)
        psi += (double)nt_numel(p[j]);
    nt_ddp *d = nt_ddp_create(p, NP, SHARDS, devs, ndev);
    if (!d || nt_ddp_set_zero(d, stage))
        return 4;
    for (int j = 0; j < NP; j++)
        nt_release(p[j]); /* the nt_ddp holds what it needs */
    nt_optim *opts[64];
    for (int i = 0; i < ndev; i++) {
        nt_device_set(i);
        opts[i] = make_opt(&r, stage ? nt_ddp_zero_shards(d, i) : nt_ddp_params(d, i));
    }
    int rc = train_step(d, &r, opts, ndev, 0);
    /* the second step up to its reduce */
    static float xb[B * 512];
    static int32_t yb[B];
    memset(xb, 0, sizeof xb);
    make_data(xb, yb, B, 512, 7);
    if (!rc && stage == 3)
        rc = nt_ddp_gather(d, 0, NP);
    for (int s = 0; s < SHARDS && !rc; s++) {
        int dev = nt_ddp_shard_device(d, s);
        nt_device_set(dev);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, (int64_t[]){B, 512});
        nt_tensor *y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){B});
        rc = nt_ddp_backward(d, s, model_loss(nt_ddp_params(d, dev), x, y));
        nt_scope_end(sc);
    }
    if (!rc)
        rc = nt_ddp_reduce(d);
    if (!rc)
        rc = nt_sync();
    if (rc) {
        fprintf(stderr, "child: %s\n", nt_last_error_message());
        return 5;
    }
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < ndev; i++) {
        int64_t b = nt_device_bytes_live(i);
        lo = b < lo ? b : lo, hi = b > hi ? b : hi;
    }
    printf("mem %d %d %.0f %lld %lld %.0f\n", stage, ndev, psi, (long long)lo, (long long)hi,
           formula_bytes(stage, psi, ndev));
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_ddp_destroy(d);
    nt_shutdown();
    return 0;
}

static void test_memory_formula(void **state)
{
    (void)state;
    printf("# per-core model-state bytes after nt_ddp_reduce, f32 AdamW (MiB), "
           "measured (nt_device_bytes_live) / formula\n");
    printf("# stage  formula          1 core          2 cores         4 cores         8 cores\n");
    static const char *const fml[] = {"16P", "8P+8P/N", "4P+12P/N", "16P/N"};
    for (int st = 0; st < 4; st++) {
        char row[256];
        int k = snprintf(row, sizeof row, "# %d      %-9s", st, fml[st]);
        for (int c = 0; c < 4; c++) {
            const char *env[] = {"NT_BACKEND=sim", CORES[c], NULL};
            char arg[4] = {(char)('0' + st), 0}, line[256];
            char *argv[] = {ddp_h_exe, "--mem", arg, NULL};
            ddp_h_run(env, argv, line, sizeof line);
            int s2 = 0, n = 0;
            double psi = 0, f = 0;
            long long lo = 0, hi = 0;
            if (sscanf(line, "mem %d %d %lf %lld %lld %lf", &s2, &n, &psi, &lo, &hi, &f) != 6)
                fail_msg("child printed '%s'", line);
            k += snprintf(row + k, sizeof row - (size_t)k, "  %6.3f / %6.3f", hi / 1048576.0,
                          f / 1048576.0);
            if (fabs((double)lo - f) > 0.02 * f || fabs((double)hi - f) > 0.02 * f)
                fail_msg("stage %d on %d cores: %lld..%lld bytes per core, the formula %.0f "
                         "(psi %.0f)", st, n, lo, hi, f, psi);
        }
        printf("%s\n", row);
    }
}

/* ---------------- a model one core cannot hold ---------------- */

/* A child's r->steps steps of the MLP (parameters from seed 5) over every
 * core at r->stage, overlapped with r->overlap, after nt_init: 0 or the
 * first error (nt_last_error), the nt_ddp (NULL if it could not be made)
 * and the optimizers in z for the caller to read, then child_end. */
typedef struct {
    nt_ddp *d;
    nt_optim *opts[64];
    int ndev;
    double psi; /* the parameter count */
} child_run;

static int child_steps(child_run *z, const run *r)
{
    int devs[DDP_H_MAXDEV];
    *z = (child_run){.ndev = ddp_h_devices(devs)};
    nt_tensor *p[NP] = {0};
    nt_device_set(0);
    int rc = make_params(p, r->h, r->f, 5) ? nt_last_error() : 0;
    for (int j = 0; j < NP && !rc; j++)
        z->psi += (double)nt_numel(p[j]);
    z->d = rc ? NULL : nt_ddp_create(p, NP, SHARDS, devs, z->ndev);
    if (z->d && (nt_ddp_set_zero(z->d, r->stage) ||
                 (r->overlap && nt_ddp_set_overlap(z->d, true))))
        rc = nt_last_error();
    for (int j = 0; j < NP; j++)
        nt_release(p[j]); /* the nt_ddp holds what it needs */
    for (int i = 0; i < z->ndev && z->d && !rc; i++) {
        nt_device_set(i);
        z->opts[i] = make_opt(r, r->stage ? nt_ddp_zero_shards(z->d, i) : nt_ddp_params(z->d, i));
    }
    for (int step = 0; step < r->steps && z->d && !rc; step++)
        if (train_step(z->d, r, z->opts, z->ndev, step))
            rc = nt_last_error();
    return rc ? rc : nt_sync();
}

static void child_end(child_run *z)
{
    for (int i = 0; i < z->ndev; i++)
        nt_optim_destroy(z->opts[i]);
    nt_ddp_destroy(z->d);
    nt_shutdown();
}

/* The child: 2 steps of a 1024-wide MLP at `stage`; prints "trained" or
 * the error (NT_ENOMEM expected on one core). */
static int child_hbm(int stage)
{
    if (nt_init() != 0)
        return 3;
    run r = {.stage = stage, .h = 1024, .f = 1024, .steps = 2};
    child_run z;
    int rc = child_steps(&z, &r);
    if (!rc && nt_device_count() > 0)
        printf("trained %d cores stage %d\n", z.ndev, stage);
    else
        printf("failed %d %s\n", rc, nt_last_error_message());
    child_end(&z);
    return 0;
}

static void test_stage3_beyond_one_core(void **state)
{
    (void)state;
    char line[1024];
    char *argv0[] = {ddp_h_exe, "--hbm", "0", NULL}, *argv3[] = {ddp_h_exe, "--hbm", "3", NULL};
    const char *env1[] = {"NT_BACKEND=sim", "NT_HBM_BYTES=12M", "NT_SIM_CORES=1", NULL};
    ddp_h_run(env1, argv0, line, sizeof line);
    printf("# 1 core, plain DDP, NT_HBM_BYTES=12M: %s", line);
    if (strncmp(line, "failed -2 ", 10))
        fail_msg("expected NT_ENOMEM on one core, got '%s'", line);
    const char *env8[] = {"NT_BACKEND=sim", "NT_HBM_BYTES=12M", "NT_SIM_CORES=8", NULL};
    ddp_h_run(env8, argv3, line, sizeof line);
    printf("# 8 cores, ZeRO-3, NT_HBM_BYTES=12M: %s", line);
    assert_string_equal(line, "trained 8 cores stage 3\n");
}

/* ---------------- the reduce-scatter overlapped with the backward ---------------- */

/* The child: 2 steps of a 512-wide MLP at stage 3 (with nt_ddp_set_overlap
 * if `ov`); prints "peak OV BYTES PSI" (the largest per-core peak of live
 * bytes) or "failed RC MSG". */
static int child_peak(int ov)
{
    if (nt_init() != 0)
        return 3;
    run r = {.stage = 3, .overlap = ov, .h = 512, .f = 512, .steps = 2};
    child_run z;
    int rc = child_steps(&z, &r);
    int64_t peak = 0;
    for (int i = 0; i < z.ndev && !rc; i++)
        peak = nt_device_bytes_live_peak(i) > peak ? nt_device_bytes_live_peak(i) : peak;
    if (!rc)
        printf("peak %d %lld %.0f\n", ov, (long long)peak, z.psi);
    else
        printf("failed %d %s\n", rc, nt_last_error_message());
    child_end(&z);
    return 0;
}

/* Stage 3 on 8 cores, the per-core peak with and without the overlapped
 * reduce-scatter: in one process a core's packed buckets wait for the last
 * core's backward (one collective takes every local member's input), while
 * the replica's .grad still holds the gradient until nt_backward returns,
 * so the overlap costs at most one more copy of the gradients (4P) per core
 * at the peak; both peaks hold the gathered parameters (16P/N + 4P). */
static void test_overlap_memory(void **state)
{
    (void)state;
    char line[1024];
    long long peak[2];
    double psi = 0;
    for (int ov = 0; ov < 2; ov++) {
        const char *env[] = {"NT_BACKEND=sim", "NT_HBM_BYTES=16G", "NT_SIM_CORES=8", NULL};
        char arg[4] = {(char)('0' + ov), 0};
        char *argv[] = {ddp_h_exe, "--peak", arg, NULL};
        ddp_h_run(env, argv, line, sizeof line);
        int o2 = -1;
        if (sscanf(line, "peak %d %lld %lf", &o2, &peak[ov], &psi) != 3 || o2 != ov)
            fail_msg("child printed '%s'", line);
    }
    double f = 16 * psi / 8;
    printf("# ZeRO-3, 8 cores, 512-wide MLP (4P = %.3f MiB): per-core peak %.3f MiB, with "
           "nt_ddp_set_overlap %.3f MiB (16P/N = %.3f MiB)\n", 4 * psi / 1048576.0,
           peak[0] / 1048576.0, peak[1] / 1048576.0, f / 1048576.0);
    assert_true((double)peak[0] > f + 4 * psi && (double)peak[1] > f + 4 * psi);
    if ((double)peak[1] > (double)peak[0] + 4 * psi * 1.02)
        fail_msg("the overlapped peak %lld is more than 4P above %lld (P = %.0f)", peak[1],
                 peak[0], psi);
}

/* Fills every device up to within 4 KiB with ballast tensors (kept in bal). */
static int fill_devices(nt_tensor **bal, int cap)
{
    int nb = 0;
    for (int dev = 0; dev < nt_device_count(); dev++) {
        nt_device_set(dev);
        for (int64_t sz = (int64_t)1 << 26; sz >= 1024 && nb < cap; sz /= 2)
            while (nb < cap) {
                nt_tensor *t = nt_zeros(NT_U8, 1, (int64_t[]){sz});
                if (!t)
                    break;
                bal[nb++] = nt_keep(t);
            }
    }
    nt_clear_error();
    return nb;
}

/* The child: stage 3 on the cores of NT_SIM_CORES, every device filled up;
 * nt_ddp_gather must fail with NT_ENOMEM naming itself, the range and the
 * bytes, with no parameter gathered and the shards unchanged; then the
 * ballast goes and AdamW with clipping trains 8 steps ("crc ..."). */
static int child_gather_oom(void)
{
    if (nt_init() != 0)
        return 3;
    int devs[DDP_H_MAXDEV], ndev = ddp_h_devices(devs), rc = 0;
    run r;
    parse_spec("3ac", &r);
    nt_tensor *p[NP];
    nt_device_set(0);
    if (make_params(p, r.h, r.f, 11))
        return 4;
    nt_ddp *d = nt_ddp_create(p, NP, SHARDS, devs, ndev);
    if (!d || nt_ddp_set_zero(d, 3) || nt_ddp_set_overlap(d, true))
        return 4;
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
    nt_optim *opts[64];
    for (int i = 0; i < ndev; i++) {
        nt_device_set(devs[i]);
        opts[i] = make_opt(&r, nt_ddp_zero_shards(d, devs[i]));
    }
    uint32_t before = 0;
    for (int i = 0; i < ndev; i++)
        before = before * 31u + ddp_h_crc(nt_ddp_zero_shards(d, devs[i]), NP);
    static nt_tensor *bal[4096];
    int nb = fill_devices(bal, 4096);
    int g = nt_ddp_gather(d, 0, NP);
    const char *msg = nt_last_error_message();
    if (g != NT_ENOMEM || !strstr(msg, "nt_ddp_gather") || !strstr(msg, "[0, 4)") ||
        !strstr(msg, "bytes on each of") || !strstr(msg, "nothing was gathered")) {
        fprintf(stderr, "child: gather gave %d '%s'\n", g, msg);
        rc = 5;
    } else {
        fprintf(stderr, "# %s\n", msg);
    }
    for (int i = 0; i < ndev && !rc; i++)
        for (int j = 0; j < NP; j++)
            if (nt_ddp_params(d, devs[i])[j]) {
                fprintf(stderr, "child: parameter %d of device %d gathered\n", j, devs[i]);
                rc = 6;
            }
    for (int i = 0; i < nb; i++)
        nt_release(bal[i]);
    uint32_t after = 0;
    for (int i = 0; i < ndev && !rc; i++)
        after = after * 31u + ddp_h_crc(nt_ddp_zero_shards(d, devs[i]), NP);
    if (!rc && after != before) {
        fprintf(stderr, "child: the shards changed\n");
        rc = 7;
    }
    for (int step = 0; step < r.steps && !rc; step++)
        if (train_step(d, &r, opts, ndev, step)) {
            fprintf(stderr, "child: step %d: %s\n", step, nt_last_error_message());
            rc = 8;
        }
    if (!rc && (nt_ddp_gather(d, 0, NP) || ddp_h_report(d, devs, ndev, NP)))
        rc = 9;
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_ddp_destroy(d);
    nt_shutdown();
    return rc;
}

static void test_gather_oom(void **state)
{
    (void)state;
    const char *env1[] = {"NT_BACKEND=sim", "NT_SIM_CORES=1", NULL};
    unsigned ref = train_crc(env1, "0ac", 1);
    for (int c = 1; c < 4; c += 2) {
        const char *env[] = {"NT_BACKEND=sim", "NT_HBM_BYTES=8M", CORES[c], NULL};
        char line[1024];
        char *argv[] = {ddp_h_exe, "--gatheroom", NULL};
        ddp_h_run(env, argv, line, sizeof line);
        unsigned crc = ddp_h_parse(line, "--gatheroom", 1 << c, 1);
        printf("# %d cores, every device full: nt_ddp_gather fails with NT_ENOMEM, nothing "
               "gathered, the shards unchanged; then 8 steps: %08x (1-core DDP %08x)\n",
               1 << c, crc, ref);
        assert_int_equal(crc, ref);
    }
}

/* ---------------- the mesh ---------------- */

static int setup_8dev(void **state)
{
    setenv("NT_SIM_CORES", "8", 1);
    return nt_test_setup(state);
}

static int teardown_8dev(void **state)
{
    int rc = nt_test_teardown(state);
    unsetenv("NT_SIM_CORES");
    return rc;
}

/* Sums every member's rank over the group of `name` holding dev: checks
 * the group is the ranks that differ from dev's along that dimension. */
static void check_group(nt_mesh *m, const char *name, int dev, int stride)
{
    int devs[8];
    int n = nt_mesh_group(m, name, dev, devs, 8);
    assert_int_equal(n, nt_mesh_size(m, name));
    nt_comm *c = nt_mesh_comm(m, name, dev);
    assert_non_null(c);
    assert_int_equal(nt_comm_size(c), n);
    nt_tensor *in[8], *out[8] = {0};
    int base = nt_mesh_rank(m, dev) - nt_mesh_coord(m, name, dev) * stride;
    for (int i = 0; i < n; i++) {
        assert_int_equal(devs[i], base + i * stride);
        assert_int_equal(nt_mesh_coord(m, name, devs[i]), i);
        assert_ptr_equal(nt_mesh_comm(m, name, devs[i]), c);
        nt_device_set(devs[i]);
        in[i] = nt_full(NT_F32, 1, (int64_t[]){1}, (double)nt_mesh_rank(m, devs[i]));
    }
    assert_int_equal(nt_all_reduce(c, in, out, NT_REDUCE_SUM), 0);
    float got = 0;
    assert_int_equal(nt_to_host(out[n - 1], &got, 4), 0);
    float want = 0;
    for (int i = 0; i < n; i++)
        want += (float)(base + i * stride);
    assert_true(got == want);
    for (int i = 0; i < n; i++)
        nt_release(in[i]), nt_release(out[i]);
    nt_device_set(0);
}

static void test_mesh(void **state)
{
    (void)state;
    const char *names3[] = {"data", "tensor", "expert"};
    nt_mesh *m = nt_mesh_create((int[]){2, 2, 2}, names3, 3);
    assert_non_null(m);
    assert_int_equal(nt_mesh_size(m, NULL), 8);
    for (int dev = 0; dev < 8; dev++) {
        assert_int_equal(nt_mesh_rank(m, dev), dev);
        check_group(m, "data", dev, 4);
        check_group(m, "tensor", dev, 2);
        check_group(m, "expert", dev, 1);
    }
    assert_int_equal(nt_mesh_coord(m, "data", 6), 1);
    assert_int_equal(nt_mesh_coord(m, "tensor", 6), 1);
    assert_int_equal(nt_mesh_coord(m, "expert", 6), 0);
    nt_mesh_destroy(m);
    const char *names2[] = {"tensor", "data"};
    m = nt_mesh_create((int[]){4, 2}, names2, 2);
    assert_non_null(m);
    for (int dev = 0; dev < 8; dev++) {
        check_group(m, "tensor", dev, 2);
        check_group(m, "data", dev, 1);
    }
    /* a mesh's errors */
    nt_test_expect_err((int)nt_mesh_size(m, "expert"), NT_EINVAL, "nt_mesh_size", "'name'",
                       "\"expert\"", "tensor=4 x data=2");
    assert_null(nt_mesh_comm(m, "pipeline", 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_comm", "\"pipeline\"");
    assert_null(nt_mesh_comm(m, NULL, 0));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_comm", "'name'");
    assert_null(nt_mesh_comm(m, "data", 8));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_comm", "'dev' is 8", "0..7");
    nt_test_expect_err(nt_mesh_coord(m, "data", -1), NT_EINVAL, "nt_mesh_coord", "'dev'");
    nt_test_expect_err(nt_mesh_rank(m, 9), NT_EINVAL, "nt_mesh_rank", "'dev' is 9");
    int devs[1];
    nt_test_expect_err(nt_mesh_group(m, "tensor", 0, devs, 1), NT_EINVAL, "nt_mesh_group",
                       "'cap' is 1");
    nt_test_expect_err(nt_mesh_group(m, "tensor", 0, NULL, 4), NT_EINVAL, "nt_mesh_group",
                       "'devs'");
    nt_mesh_destroy(m);
    nt_test_expect_err(nt_mesh_size(m, NULL), NT_EINVAL, "nt_mesh_size", "'m'");
    nt_mesh_destroy(NULL);
    /* bad layouts */
    assert_null(nt_mesh_create((int[]){3, 2}, names2, 2));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "tensor=3 x data=2",
                       "6 ranks", "8 devices");
    assert_null(nt_mesh_create((int[]){16}, names2, 1));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "tensor=16", "16 ranks",
                       "8 devices");
    const char *bad[] = {"data", "tensr"};
    assert_null(nt_mesh_create((int[]){2, 4}, bad, 2));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "'names[1]'",
                       "\"tensr\"", "\"expert\"");
    const char *dup[] = {"data", "data"};
    assert_null(nt_mesh_create((int[]){2, 4}, dup, 2));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "\"data\" at 0 and 1");
    const char *nul[] = {"data", NULL};
    assert_null(nt_mesh_create((int[]){2, 4}, nul, 2));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "'names[1]' is NULL");
    assert_null(nt_mesh_create((int[]){0, 4}, names2, 2));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "'dims[0]' is 0");
    assert_null(nt_mesh_create((int[]){2, 2, 2, 1}, names3, 4));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "'ndims' is 4");
    assert_null(nt_mesh_create(NULL, names3, 1));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "'dims' is NULL");
    assert_null(nt_mesh_create((int[]){8}, NULL, 1));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_mesh_create", "'names' is NULL");
}

/* ---------------- ZeRO's errors ---------------- */

static nt_tensor *shard_loss(nt_ddp *d, int s)
{
    static float xb[B * F];
    static int32_t yb[B];
    make_data(xb, yb, B, F, 1);
    int dev = nt_ddp_shard_device(d, s);
    nt_device_set(dev);
    nt_tensor *x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, (int64_t[]){B, F});
    nt_tensor *y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){B});
    return model_loss(nt_ddp_params(d, dev), x, y);
}

static void test_zero_errors(void **state)
{
    (void)state;
    int devs[2] = {0, 1};
    nt_tensor *p[NP];
    nt_device_set(0);
    assert_int_equal(make_params(p, H, F, 2), 0);
    nt_ddp *d = nt_ddp_create(p, NP, SHARDS, devs, 2);
    assert_non_null(d);
    nt_test_expect_err(nt_ddp_set_zero(d, 4), NT_EINVAL, "nt_ddp_set_zero", "'stage' is 4");
    nt_test_expect_err(nt_ddp_set_zero(d, -1), NT_EINVAL, "nt_ddp_set_zero", "'stage' is -1");
    assert_null(nt_ddp_zero_shards(d, 0));
    nt_test_expect_err(nt_last_error(), NT_ESTATE, "nt_ddp_zero_shards", "no ZeRO stage");
    nt_test_expect_err(nt_ddp_gather(d, 0, NP), NT_ESTATE, "nt_ddp_gather", "stage 0");
    assert_int_equal(nt_ddp_zero_stage(d), 0);
    /* a stage after training began */
    nt_scope *sc = nt_scope_begin();
    assert_int_equal(nt_ddp_backward(d, 0, shard_loss(d, 0)), 0);
    nt_scope_end(sc);
    nt_test_expect_err(nt_ddp_set_zero(d, 2), NT_ESTATE, "nt_ddp_set_zero", "begun training");
    nt_test_expect_err(nt_ddp_set_overlap(d, true), NT_ESTATE, "nt_ddp_set_overlap",
                       "stage 0", "stages 2 and 3");
    nt_test_expect_err(nt_ddp_set_overlap(NULL, true), NT_EINVAL, "nt_ddp_set_overlap", "'d'");
    /* the per-device peak: at least what is live now; a bad device */
    assert_true(nt_device_bytes_live_peak(0) >= nt_device_bytes_live(0));
    assert_true(nt_device_bytes_live(0) > 0);
    nt_test_expect_err((int)nt_device_bytes_live_peak(8), NT_EINVAL, "nt_device_bytes_live_peak",
                       "'dev' is 8", "0..7");
    nt_ddp_destroy(d);
    /* the overlap at stage 1, and after a shard's backward of the step */
    d = nt_ddp_create(p, NP, SHARDS, devs, 2);
    assert_int_equal(nt_ddp_set_zero(d, 1), 0);
    nt_test_expect_err(nt_ddp_set_overlap(d, true), NT_ESTATE, "nt_ddp_set_overlap", "stage 1");
    nt_ddp_destroy(d);
    d = nt_ddp_create(p, NP, SHARDS, devs, 2);
    assert_int_equal(nt_ddp_set_zero(d, 2), 0);
    assert_int_equal(nt_ddp_set_overlap(d, true), 0);
    sc = nt_scope_begin();
    assert_int_equal(nt_ddp_backward(d, 0, shard_loss(d, 0)), 0);
    nt_scope_end(sc);
    nt_test_expect_err(nt_ddp_set_overlap(d, false), NT_ESTATE, "nt_ddp_set_overlap",
                       "shard 0 already has its gradients", "after nt_ddp_reduce");
    for (int s = 1; s < SHARDS; s++) {
        sc = nt_scope_begin();
        assert_int_equal(nt_ddp_backward(d, s, shard_loss(d, s)), 0);
        nt_scope_end(sc);
    }
    assert_int_equal(nt_ddp_reduce(d), 0);
    assert_int_equal(nt_ddp_set_overlap(d, false), 0); /* between steps */
    nt_ddp_destroy(d);
    /* stage 3 */
    d = nt_ddp_create(p, NP, SHARDS, devs, 2);
    assert_non_null(d);
    assert_int_equal(nt_ddp_set_zero(d, 3), 0);
    assert_int_equal(nt_ddp_zero_stage(d), 3);
    nt_test_expect_err(nt_ddp_set_zero(d, 1), NT_ESTATE, "nt_ddp_set_zero", "already");
    assert_null(nt_ddp_zero_shards(d, 5));
    nt_test_expect_err(nt_last_error(), NT_EINVAL, "nt_ddp_zero_shards", "'dev' is 5");
    nt_test_expect_err(nt_ddp_gather(d, 2, 2), NT_EINVAL, "nt_ddp_gather", "'lo', 'hi'");
    nt_test_expect_err(nt_ddp_gather(d, 0, NP + 1), NT_EINVAL, "nt_ddp_gather", "<= 4");
    assert_null(nt_ddp_params(d, 0)[0]); /* not gathered */
    sc = nt_scope_begin();
    assert_int_equal(nt_ddp_gather(d, 0, 2), 0);
    nt_test_expect_err(nt_ddp_backward(d, 0, shard_loss(d, 0)), NT_EINVAL, "");
    nt_clear_error();
    nt_tensor *l = nt_sum(nt_ddp_params(d, 0)[0], NT_DIM_ALL, false);
    nt_test_expect_err(nt_ddp_backward(d, 0, l), NT_ESTATE, "nt_ddp_backward",
                       "parameter 2 of device 0 is not gathered", "nt_ddp_gather");
    nt_scope_end(sc);
    nt_tensor *t = nt_ddp_clip_grad_norm(d, 1.0);
    assert_null(t);
    nt_test_expect_err(nt_last_error(), NT_ESTATE, "nt_ddp_clip_grad_norm", "nt_ddp_reduce");
    /* a step with the replicas' optimizers, not the shards' */
    assert_int_equal(nt_ddp_gather(d, 2, NP), 0);
    nt_optim *bad[2], *good[2];
    for (int i = 0; i < 2; i++) {
        nt_device_set(i);
        bad[i] = nt_optim_sgd(nt_ddp_params(d, i), NP, 0.1, 0, 0, false);
        good[i] = nt_optim_sgd(nt_ddp_zero_shards(d, i), NP, 0.1, 0, 0, false);
    }
    for (int s = 0; s < SHARDS; s++) {
        sc = nt_scope_begin();
        assert_int_equal(nt_ddp_backward(d, s, shard_loss(d, s)), 0);
        nt_scope_end(sc);
    }
    assert_null(nt_ddp_params(d, 0)[0]); /* released after the backward */
    assert_int_equal(nt_ddp_reduce(d), 0);
    nt_test_expect_err(nt_ddp_step(d, bad, 2), NT_EINVAL, "nt_ddp_step", "'opts[0]'",
                       "nt_ddp_zero_shards(d, 0)");
    assert_int_equal(nt_ddp_step(d, good, 2), 0);
    for (int i = 0; i < 2; i++)
        nt_optim_destroy(bad[i]), nt_optim_destroy(good[i]);
    nt_ddp_destroy(d);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
    nt_device_set(0);
}

/* ---------------- sharded checkpoints ---------------- */

/* Trains `spec` on `cores` for STEPS steps, with a save after step 4
 * ("save") or from a checkpoint of step 4 ("load"); returns the CRC. */
static unsigned ckpt_run(const char *cores, const char *spec, const char *how, const char *path,
                         bool reshard)
{
    char line[1024];
    char *argv[] = {ddp_h_exe, "--ckpt", (char *)spec, (char *)how, (char *)path,
                    reshard ? "1" : "0", NULL};
    const char *env[] = {"NT_BACKEND=sim", cores, NULL};
    ddp_h_run(env, argv, line, sizeof line);
    return ddp_h_parse(line, spec, 0, 1);
}

static void test_checkpoints(void **state)
{
    (void)state;
    assert_int_equal(nt_test_dir_make("zero"), 0);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/a", nt_test_dir);
    snprintf(b, sizeof b, "%s/b", nt_test_dir);
    const char *env1[] = {"NT_BACKEND=sim", "NT_SIM_CORES=1", NULL};
    unsigned ref = train_crc(env1, "0a-", 1), sref = train_crc(env1, "0s-", 1);
    /* saved at step 4 on 4 cores, stage 2; loaded in the same layout */
    unsigned c = ckpt_run("NT_SIM_CORES=4", "2a-", "save", a, false);
    assert_int_equal(c, ref);
    c = ckpt_run("NT_SIM_CORES=4", "2a-", "load", a, false);
    printf("# stage 2 x 4 cores saved at step 4, loaded on 4 cores: %08x (uninterrupted "
           "%08x)\n", c, ref);
    assert_int_equal(c, ref);
    /* into one core, plain DDP, and back into 8 cores at stage 3 */
    c = ckpt_run("NT_SIM_CORES=1", "0a-", "load", a, true);
    printf("# ... resharded into 1 core, stage 0: %08x\n", c);
    assert_int_equal(c, ref);
    c = ckpt_run("NT_SIM_CORES=1", "0a-", "save", b, false);
    assert_int_equal(c, ref);
    c = ckpt_run("NT_SIM_CORES=8", "3a-", "load", b, true);
    printf("# a 1-core stage-0 save resharded into 8 cores, stage 3: %08x\n", c);
    assert_int_equal(c, ref);
    /* SGD's momentum buffers, stage 1 on 2 cores into stage 3 on 4 */
    c = ckpt_run("NT_SIM_CORES=2", "1s-", "save", b, false);
    assert_int_equal(c, sref);
    c = ckpt_run("NT_SIM_CORES=4", "3s-", "load", b, true);
    assert_int_equal(c, sref);
    /* another layout without asking: a clear error */
    char line[1024];
    char *argv[] = {ddp_h_exe, "--ckpt", "1a-", "load", a, "0", NULL};
    const char *env2[] = {"NT_BACKEND=sim", "NT_SIM_CORES=2", NULL};
    int st = bench_run_child(argv, env2, line, sizeof line);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 9);
    printf("# stage 1 x 2 cores loading it without reshard: %s", line);
    if (!strstr(line, "nt_ddp_load") || !strstr(line, "stage 2 over 4 ranks") ||
        !strstr(line, "stage 1 over 2 ranks") || !strstr(line, "reshard"))
        fail_msg("the message: %s", line);
    assert_int_equal(nt_test_dir_remove(), 0);
}

/* The checkpoints' errors in this process. */
static void test_checkpoint_errors(void **state)
{
    (void)state;
    assert_int_equal(nt_test_dir_make("zeroerr"), 0);
    int devs[2] = {0, 1};
    nt_tensor *p[NP];
    nt_device_set(0);
    assert_int_equal(make_params(p, H, F, 2), 0);
    nt_ddp *d = nt_ddp_create(p, NP, SHARDS, devs, 2);
    assert_non_null(d);
    assert_int_equal(nt_ddp_set_zero(d, 2), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/none", nt_test_dir);
    nt_test_expect_err(nt_ddp_load(d, path, NULL, 0, false), NT_EIO, "nt_ddp_load",
                       "no sharded checkpoint", ".zero0of<R>");
    nt_test_expect_err(nt_ddp_save(d, NULL, NULL, 0), NT_EINVAL, "nt_ddp_save", "'path'");
    nt_test_expect_err(nt_ddp_load(d, NULL, NULL, 0, true), NT_EINVAL, "nt_ddp_load", "'path'");
    nt_optim *o[2];
    for (int i = 0; i < 2; i++) {
        nt_device_set(i);
        o[i] = nt_optim_adamw(nt_ddp_params(d, i), NP, 1e-3, 0.9, 0.99, 1e-8, 0);
    }
    nt_test_expect_err(nt_ddp_save(d, path, o, 2), NT_EINVAL, "nt_ddp_save", "'opts[0]'",
                       "shards");
    nt_test_expect_err(nt_ddp_save(d, path, o, 1), NT_EINVAL, "nt_ddp_save", "'nopts' is 1");
    for (int i = 0; i < 2; i++)
        nt_optim_destroy(o[i]);
    assert_int_equal(nt_ddp_save(d, path, NULL, 0), 0);
    assert_int_equal(nt_ddp_load(d, path, NULL, 0, false), 0);
    /* a model of other sizes */
    nt_tensor *q[NP];
    nt_device_set(0);
    assert_int_equal(make_params(q, H + 8, F, 2), 0);
    nt_ddp *e = nt_ddp_create(q, NP, SHARDS, devs, 2);
    assert_non_null(e);
    assert_int_equal(nt_ddp_set_zero(e, 2), 0);
    nt_test_expect_err(nt_ddp_load(e, path, NULL, 0, true), NT_ESHAPE, "nt_ddp_load",
                       "parameter 0 has 288 elements", "has 384");
    nt_ddp_destroy(e);
    nt_ddp_destroy(d);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]), nt_release(q[j]);
    nt_device_set(0);
    assert_int_equal(nt_test_dir_remove(), 0);
}

/* ---------------- over 2 processes (mpirun) ---------------- */

static const char *mpirun_path;

/* 2 processes x 1 and 2 cores at stages 2 and 3 give the one-core CRC; a
 * mesh whose layout differs between the processes is a clear error. */
static void test_across_processes(void **state)
{
    (void)state;
    char line[1024];
    const char *env1[] = {"NT_SIM_CORES=1", NULL};
    unsigned ref = train_crc(env1, "0ac", 1);
    printf("# 1 process x 1 core, plain DDP: %08x\n", ref);
    static const char *const specs[] = {"2ac", "3ac", "3acj"};
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 3; s++) {
            const char *env[] = {CORES[c], NULL};
            unsigned crc = ddp_h_mpi_crc(mpirun_path, env, specs[s], 1 << c);
            printf("# 2 processes x %d cores, ZeRO stage %c%s: %08x\n", 1 << c, specs[s][0],
                   specs[s][3] ? ", joined rounds" : "", crc);
            if (crc != ref)
                fail_msg("2 processes x %d cores stage %c: %08x, 1 core %08x", 1 << c,
                         specs[s][0], crc, ref);
        }
    const char *env2[] = {"NT_SIM_CORES=2", NULL};
    char *argv[] = {(char *)mpirun_path, "-np", "2", ddp_h_exe, "--meshmpi", NULL};
    ddp_h_mpi_env();
    ddp_h_mpi_asan(true);
    ddp_h_run(env2, argv, line, sizeof line);
    ddp_h_mpi_asan(false);
    printf("# %s", line);
    if (!strstr(line, "mesh ok") || !strstr(line, "nt_mesh_create") ||
        !strstr(line, "data=2 x tensor=2") || !strstr(line, "data=4"))
        fail_msg("mesh over processes: '%s'", line);
}

/* Under mpirun -np 2 with 2 cores each: a 2 x 2 mesh whose data groups
 * span the processes and tensor groups lie in one (checked by sums), then
 * process 1 asks for another layout. */
static int child_meshmpi(void)
{
    if (nt_init() != 0)
        return 3;
    int me = nt_process_rank();
    const char *names[] = {"data", "tensor"};
    nt_mesh *m = nt_mesh_create((int[]){2, 2}, names, 2);
    bool ok = m != NULL;
    for (int dev = 0; ok && dev < 2; dev++) {
        int r = nt_mesh_rank(m, dev);
        ok = r == me * 2 + dev && nt_mesh_coord(m, "data", dev) == me &&
             nt_comm_size(nt_mesh_comm(m, "data", dev)) == 2 &&
             nt_comm_size(nt_mesh_comm(m, "tensor", dev)) == 2;
    }
    /* sums of the global ranks over each group */
    const char *dims[] = {"data", "tensor"};
    for (int a = 0; a < 2 && ok; a++) {
        int devs[2], n = 0;
        for (int dev = 0; dev < 2; dev += n) {
            n = nt_mesh_group(m, dims[a], dev, devs, 2);
            nt_tensor *in[2], *out[2] = {0};
            for (int i = 0; i < n; i++) {
                nt_device_set(devs[i]);
                in[i] = nt_full(NT_F32, 1, (int64_t[]){1}, nt_mesh_rank(m, devs[i]));
            }
            float got = -1;
            ok = nt_all_reduce(nt_mesh_comm(m, dims[a], dev), in, out, NT_REDUCE_SUM) == 0 &&
                 nt_to_host(out[0], &got, 4) == 0;
            int r = nt_mesh_rank(m, devs[0]);
            float want = a == 0 ? (float)(2 * (r % 2) + 2) : (float)(4 * me + 1);
            ok = ok && got == want;
            for (int i = 0; i < n; i++)
                nt_release(in[i]), nt_release(out[i]);
            nt_device_set(0);
        }
    }
    nt_mesh_destroy(m);
    int dims2[2] = {2, 2}, dims1[1] = {4};
    nt_mesh *bad = me == 0 ? nt_mesh_create(dims2, names, 2) : nt_mesh_create(dims1, names, 1);
    if (me == 0)
        printf("mesh %s; mismatch: %s\n", ok && !bad ? "ok" : "FAILED",
               bad ? "accepted" : nt_last_error_message());
    nt_mesh_destroy(bad);
    nt_shutdown();
    return 0;
}

/* ---------------- main ---------------- */

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child")) {
        run r;
        parse_spec(argv[2], &r);
        return child_train(&r);
    }
    if (argc == 3 && !strcmp(argv[1], "--layers"))
        return child_layers(atoi(argv[2]));
    if (argc == 3 && !strcmp(argv[1], "--mem"))
        return child_mem(atoi(argv[2]));
    if (argc == 3 && !strcmp(argv[1], "--hbm"))
        return child_hbm(atoi(argv[2]));
    if (argc == 3 && !strcmp(argv[1], "--peak"))
        return child_peak(atoi(argv[2]));
    if (argc == 2 && !strcmp(argv[1], "--gatheroom"))
        return child_gather_oom();
    if (argc == 2 && !strcmp(argv[1], "--meshmpi"))
        return child_meshmpi();
    if (argc == 6 && !strcmp(argv[1], "--ckpt")) {
        run r;
        parse_spec(argv[2], &r);
        r.save_at = 4;
        if (!strcmp(argv[3], "save"))
            r.save = argv[4];
        else
            r.load = argv[4];
        r.reshard = argv[5][0] == '1';
        return child_train(&r);
    }
    if (ddp_h_self())
        return 1;
    if (argc == 3 && !strcmp(argv[1], "--mpi")) {
        const struct CMUnitTest mpi_tests[] = {cmocka_unit_test(test_across_processes)};
        return ddp_h_mpi_main(argv[2], &mpirun_path, mpi_tests, 1);
    }
    /* --only NAME: one test of the list */
    const char *only = argc == 3 && !strcmp(argv[1], "--only") ? argv[2] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mesh, setup_8dev, teardown_8dev),
        cmocka_unit_test_setup_teardown(test_zero_errors, setup_8dev, teardown_8dev),
        cmocka_unit_test_setup_teardown(test_checkpoint_errors, setup_8dev, teardown_8dev),
        cmocka_unit_test(test_bitwise_stages_sizes),
        cmocka_unit_test(test_joined_rounds),
        cmocka_unit_test(test_layer_release),
        cmocka_unit_test_setup_teardown(test_layer_done_errors, setup_8dev, teardown_8dev),
        cmocka_unit_test(test_memory_formula),
        cmocka_unit_test(test_stage3_beyond_one_core),
        cmocka_unit_test(test_overlap_memory),
        cmocka_unit_test(test_gather_oom),
        cmocka_unit_test(test_checkpoints),
    };
    if (only) {
        for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
            if (!strcmp(tests[i].name, only))
                return _cmocka_run_group_tests("test_zero", tests + i, 1, NULL, NULL);
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
