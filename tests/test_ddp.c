/* tests/test_ddp.c - data-parallel training (autograd/ddp.c, docs/ddp.md):
 * the shard tree against a hand-written tree of the same order, shards in
 * any order, every error path (and the runtime working after it), and the
 * parameters after 20 AdamW steps bit-identical for 1, 2, 4 and 8 cores.
 *
 * NT_SIM_CORES is read by nt_init, so the core counts run as child
 * processes of this test (it re-executes itself with --child and the
 * environment of the case), each printing a CRC-32 of its parameters
 * (tests/ddp_harness.h). */
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
#define BENCH_NAME "tests/test_ddp"
#include "ddp_harness.h"

/* ---------------- a small MLP ---------------- */

enum { F = 12, H = 24, C = DDP_H_CLASSES, NP = DDP_H_NP };

static void make_data(float *x, int32_t *y, int rows, uint32_t seed)
{
    ddp_h_data(x, y, rows, F, 1.0f, seed);
}

static void make_params(nt_tensor **p, nt_dtype dt, uint64_t seed)
{
    assert_int_equal(ddp_h_params(p, dt, H, F, seed), 0);
}

static nt_tensor *model_loss(nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    nt_dtype dt = nt_dtype_of(p[0]);
    nt_tensor *xx = dt == NT_F32 ? x : nt_cast(x, dt);
    nt_tensor *h = nt_relu(nt_linear(xx, p[0], p[1]));
    nt_tensor *logits = nt_linear(h, p[2], p[3]);
    if (nt_dtype_of(logits) != NT_F32)
        logits = nt_cast(logits, NT_F32);
    return nt_cross_entropy(logits, y);
}

static void grad_bytes(nt_tensor *p, void *dst, size_t cap)
{
    nt_tensor *g = nt_grad(p);
    assert_non_null(g);
    size_t nb = (size_t)nt_numel(g) * nt_dtype_size(nt_dtype_of(g));
    assert_true(nb <= cap);
    assert_int_equal(nt_to_host(g, dst, nb), 0);
    nt_release(g);
}

/* ---------------- the tree against a hand-written one ---------------- */

/* The shard tree written out: adjacent pairs level by level, odd last
 * carried, in f32, then times 1/S, rounded to dt. */
static nt_tensor *ref_tree(nt_tensor **g, int n, nt_dtype dt)
{
    nt_tensor *v[64];
    int m = n;
    for (int i = 0; i < n; i++)
        v[i] = g[i];
    while (m > 1) {
        int k = 0;
        for (int i = 0; i + 1 < m; i += 2)
            v[k++] = nt_add(v[i], v[i + 1]);
        if (m & 1)
            v[k++] = v[m - 1];
        m = k;
    }
    nt_tensor *r = nt_mul_scalar(v[0], 1.0 / n);
    return dt == NT_F32 ? r : nt_cast(r, dt);
}

static void tree_case(nt_dtype dt, int S, bool reverse)
{
    enum { B = 32 };
    float xb[B * F];
    int32_t yb[B];
    make_data(xb, yb, B, 7);
    nt_tensor *p[NP], *q[NP];
    make_params(p, dt, 3);
    make_params(q, dt, 3);
    int dev0 = 0;
    nt_ddp *d = nt_ddp_create(p, NP, S, &dev0, 1);
    assert_non_null(d);
    assert_int_equal(nt_ddp_shards(d), S);
    nt_tensor **rep = nt_ddp_params(d, 0);
    assert_non_null(rep);
    for (int j = 0; j < NP; j++)
        assert_ptr_equal(rep[j], p[j]); /* the home device's replica is the params */
    for (int k = 0; k < S; k++) {
        int s = reverse ? S - 1 - k : k;
        assert_int_equal(nt_ddp_shard_device(d, s), 0);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, (int64_t[]){B, F});
        nt_tensor *y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){B});
        assert_non_null(x);
        assert_int_equal(nt_shape(x, 0), B / S);
        assert_int_equal(nt_ddp_backward(d, s, model_loss(rep, x, y)), 0);
        nt_scope_end(sc);
        /* the shard's gradients went into the tree, not into .grad */
        nt_tensor *g = nt_grad(p[0]);
        assert_null(g);
    }
    assert_int_equal(nt_ddp_reduce(d), 0);

    /* by hand */
    nt_tensor *g[NP][64];
    for (int s = 0; s < S; s++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_from_host(xb + (size_t)s * (B / S) * F, NT_F32, 2,
                                    (int64_t[]){B / S, F});
        nt_tensor *y = nt_from_host(yb + (size_t)s * (B / S), NT_I32, 1, (int64_t[]){B / S});
        assert_int_equal(nt_backward(model_loss(q, x, y)), 0);
        nt_scope_end(sc);
        for (int j = 0; j < NP; j++) {
            nt_tensor *gj = nt_grad(q[j]);
            g[j][s] = nt_dtype_of(gj) == NT_F32 ? gj : nt_cast(gj, NT_F32);
            if (g[j][s] != gj)
                nt_release(gj);
            assert_int_equal(nt_zero_grad(q[j]), 0);
        }
    }
    static uint8_t a[H * F * 4], b[H * F * 4];
    for (int j = 0; j < NP; j++) {
        nt_tensor *r = ref_tree(g[j], S, dt);
        assert_non_null(r);
        size_t nb = (size_t)nt_numel(r) * nt_dtype_size(dt);
        assert_int_equal(nt_to_host(r, b, nb), 0);
        grad_bytes(p[j], a, sizeof a);
        if (memcmp(a, b, nb) != 0)
            fail_msg("%s S=%d%s: parameter %d's gradient differs from the hand-written tree",
                     nt_dtype_name(dt), S, reverse ? " (shards reversed)" : "", j);
        nt_release(r);
        for (int s = 0; s < S; s++)
            nt_release(g[j][s]);
    }
    nt_ddp_destroy(d);
    for (int j = 0; j < NP; j++) {
        nt_release(p[j]);
        nt_release(q[j]);
    }
    assert_int_equal(nt_sync(), 0);
}

static void test_tree_matches_reference(void **state)
{
    (void)state;
    for (int S = 1; S <= 8; S *= 2) {
        tree_case(NT_F32, S, false);
        tree_case(NT_F32, S, true);
        tree_case(NT_BF16, S, S == 4);
    }
}

/* ---------------- bad input ---------------- */

static void test_bad_input(void **state)
{
    (void)state;
    enum { B = 8 };
    float xb[B * F];
    int32_t yb[B];
    make_data(xb, yb, B, 1);
    nt_tensor *p[NP];
    make_params(p, NT_F32, 5);
    int dev0 = 0, bad_dev = 999;

    /* nt_ddp_create */
    nt_test_expect_err(nt_ddp_create(NULL, NP, 2, &dev0, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "params");
    nt_test_expect_err(nt_ddp_create(p, 0, 2, &dev0, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "parameter");
    nt_tensor *dup[2] = {p[0], p[0]};
    nt_test_expect_err(nt_ddp_create(dup, 2, 2, &dev0, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "same tensor");
    nt_tensor *plain = nt_zeros(NT_F32, 1, (int64_t[]){3});
    nt_tensor *nrg[2] = {p[0], plain};
    nt_test_expect_err(nt_ddp_create(nrg, 2, 2, &dev0, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "require grad");
    nt_test_expect_err(nt_ddp_create(p, NP, 0, &dev0, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "shards");
    nt_test_expect_err(nt_ddp_create(p, NP, 3, &dev0, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "power of two");
    nt_test_expect_err(nt_ddp_create(p, NP, 2, NULL, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "devices");
    nt_test_expect_err(nt_ddp_create(p, NP, 2, &dev0, 0) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "ndev");
    nt_test_expect_err(nt_ddp_create(p, NP, 2, &bad_dev, 1) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "devices[0]");

    /* a NULL or dead nt_ddp */
    nt_test_expect_err(nt_ddp_reduce(NULL), NT_EINVAL, "nt_ddp_reduce", "'d'");
    nt_test_expect_err(nt_ddp_shards(NULL), NT_EINVAL, "nt_ddp_shards", "'d'");
    nt_test_expect_err(nt_ddp_params(NULL, 0) ? 0 : nt_last_error(), NT_EINVAL, "nt_ddp_params",
                       "'d'");
    nt_ddp_destroy(NULL);

    nt_ddp *d = nt_ddp_create(p, NP, 4, &dev0, 1);
    assert_non_null(d);
    nt_tensor **rep = nt_ddp_params(d, 0);
    nt_test_expect_err(nt_ddp_params(d, 5) ? 0 : nt_last_error(), NT_EINVAL, "nt_ddp_params",
                       "'dev'");
    nt_test_expect_err(nt_ddp_shard_device(d, 4), NT_EINVAL, "nt_ddp_shard_device", "'shard'");
    nt_test_expect_err(nt_ddp_shard_device(d, -1), NT_EINVAL, "nt_ddp_shard_device", "'shard'");
    nt_test_expect_err(nt_ddp_shard_from_host(d, 4, xb, NT_F32, 2, (int64_t[]){B, F}) ? 0
                       : nt_last_error(),
                       NT_EINVAL, "nt_ddp_shard_from_host", "'shard'");
    nt_test_expect_err(nt_ddp_shard_from_host(d, 0, xb, NT_F32, 2, (int64_t[]){B - 1, F})
                       ? 0 : nt_last_error(),
                       NT_ESHAPE, "nt_ddp_shard_from_host", "'shape'");
    nt_test_expect_err(nt_ddp_shard_from_host(d, 0, NULL, NT_F32, 2, (int64_t[]){B, F})
                       ? 0 : nt_last_error(),
                       NT_EINVAL, "nt_ddp_shard_from_host", "'src'");
    nt_tensor *odd = nt_zeros(NT_F32, 2, (int64_t[]){6, F});
    nt_test_expect_err(nt_ddp_shard(d, odd, 0) ? 0 : nt_last_error(), NT_ESHAPE, "nt_ddp_shard",
                       "'batch'");
    nt_tensor *whole = nt_from_host(xb, NT_F32, 2, (int64_t[]){B, F});
    nt_tensor *part = nt_ddp_shard(d, whole, 1);
    assert_non_null(part);
    float got[2 * F];
    assert_int_equal(nt_to_host(part, got, sizeof got), 0);
    assert_memory_equal(got, xb + 2 * F, sizeof got);
    nt_test_expect_err(nt_ddp_shard(d, whole, 7) ? 0 : nt_last_error(), NT_EINVAL, "nt_ddp_shard",
                       "'shard'");

    /* a step with every kind of misuse on the way */
    nt_test_expect_err(nt_ddp_reduce(d), NT_ESTATE, "nt_ddp_reduce", "shard 0");
    for (int s = 0; s < 4; s++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, (int64_t[]){B, F});
        nt_tensor *y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){B});
        nt_tensor *loss = model_loss(rep, x, y);
        nt_test_expect_err(nt_ddp_backward(d, 9, loss), NT_EINVAL, "nt_ddp_backward", "'shard'");
        nt_test_expect_err(nt_ddp_backward(d, s, NULL), NT_EINVAL, "nt_ddp_backward", "loss");
        nt_tensor *nograd = nt_sum(x, NT_DIM_ALL, false);
        nt_test_expect_err(nt_ddp_backward(d, s, nograd), NT_ESTATE, "nt_backward", "require grad");
        assert_int_equal(nt_ddp_backward(d, s, loss), 0);
        nt_tensor *again = model_loss(rep, x, y);
        nt_test_expect_err(nt_ddp_backward(d, s, again), NT_ESTATE, "nt_ddp_backward", "already");
        nt_scope_end(sc);
        if (s == 1)
            nt_test_expect_err(nt_ddp_reduce(d), NT_ESTATE, "nt_ddp_reduce", "shard 2");
    }
    assert_int_equal(nt_ddp_reduce(d), 0);
    nt_optim *opt = nt_optim_adamw(rep, NP, 1e-2, 0.9, 0.999, 1e-8, 0.0);
    nt_optim *other = nt_optim_adamw(rep, 2, 1e-2, 0.9, 0.999, 1e-8, 0.0);
    nt_test_expect_err(nt_ddp_step(d, NULL, 1), NT_EINVAL, "nt_ddp_step", "'opts'");
    nt_test_expect_err(nt_ddp_step(d, &opt, 2), NT_EINVAL, "nt_ddp_step", "'nopts'");
    nt_test_expect_err(nt_ddp_step(d, &other, 1), NT_EINVAL, "nt_ddp_step", "'opts[0]'");
    uint8_t before[H * F * 4], after[H * F * 4];
    assert_int_equal(nt_to_host(rep[0], before, sizeof before), 0);
    assert_int_equal(nt_ddp_step(d, &opt, 1), 0);
    assert_int_equal(nt_to_host(rep[0], after, sizeof after), 0);
    assert_true(memcmp(before, after, sizeof after) != 0); /* it stepped */
    assert_null(nt_grad(rep[0]));                          /* and zeroed */
    assert_int_equal(nt_sync(), 0);
    nt_optim_destroy(opt);
    nt_optim_destroy(other);
    nt_ddp_destroy(d);
    nt_release(odd);
    nt_release(whole);
    nt_release(part);
    nt_release(plain);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
}

/* ---------------- bit-identical at any core count ---------------- */

enum { TRAIN_STEPS = 20, TRAIN_SHARDS = 8, TRAIN_B = 32 };

/* CRC-32 of a replica's parameter bytes. */
static uint32_t replica_crc(nt_tensor **p) { return ddp_h_crc(p, NP); }

/* The shard's loss under autocast `ctx` (an nt_dtype, or NT_DTYPE_COUNT: none). */
static nt_tensor *amp_loss(void *ctx, nt_tensor **p, nt_tensor *x, nt_tensor *y)
{
    nt_dtype amp = *(nt_dtype *)ctx;
    if (amp != NT_DTYPE_COUNT)
        nt_autocast_begin(amp);
    nt_tensor *loss = model_loss(p, x, y);
    if (amp != NT_DTYPE_COUNT)
        nt_autocast_end();
    return loss;
}

/* The child: 20 AdamW steps of the MLP on every core nt_init found
 * (NT_SIM_CORES), global batch 32 in 8 shards (NT_TEST_SHARDS), under
 * autocast `amp` (or none); prints the harness's line. */
static int child_main(const char *amp_name)
{
    nt_dtype amp = !strcmp(amp_name, "bf16") ? NT_BF16 : NT_DTYPE_COUNT;
    if (nt_init() != 0)
        return 3;
    int devs[DDP_H_MAXDEV], ndev = ddp_h_devices(devs);
    nt_tensor *p[NP];
    make_params(p, NT_F32, 11);
    int shards = getenv("NT_TEST_SHARDS") ? atoi(getenv("NT_TEST_SHARDS")) : TRAIN_SHARDS;
    nt_ddp *d = nt_ddp_create(p, NP, shards, devs, ndev);
    if (!d) {
        fprintf(stderr, "child: %s\n", nt_last_error_message());
        return 4;
    }
    nt_optim *opts[DDP_H_MAXDEV];
    for (int i = 0; i < ndev; i++) {
        nt_device_set(devs[i]);
        opts[i] = nt_optim_adamw(nt_ddp_params(d, devs[i]), NP, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    }
    ddp_h_cfg cfg = {.shards = shards, .rows = TRAIN_B, .cols = F, .range = 1.0f,
                     .loss = amp_loss, .ctx = &amp};
    for (int step = 0; step < TRAIN_STEPS; step++)
        if (ddp_h_step(d, &cfg, opts, ndev, step)) {
            fprintf(stderr, "child: %s\n", nt_last_error_message());
            return 6;
        }
    int rc = ddp_h_report(d, devs, ndev, NP);
    for (int i = 0; i < ndev; i++)
        nt_optim_destroy(opts[i]);
    nt_ddp_destroy(d);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
    nt_shutdown();
    return rc ? 7 : 0;
}

static void test_bitwise_across_cores(void **state)
{
    (void)state;
    static const char *const backends[] = {"NT_BACKEND=sim", "NT_BACKEND=cpu"};
    static const char *const modes[][2] = {{"NT_MODE=adaptive", "NT_DETERMINISTIC=0"},
                                           {"NT_MODE=adaptive", "NT_DETERMINISTIC=1"}};
    static const char *const amps[] = {"none", "bf16"};
    static const char *const cores[] = {"NT_SIM_CORES=1", "NT_SIM_CORES=2", "NT_SIM_CORES=4",
                                        "NT_SIM_CORES=8"};
    printf("# parameters after %d AdamW steps, %d shards (crc32):\n", TRAIN_STEPS,
           TRAIN_SHARDS);
    printf("# backend  mode           amp    1 core    2 cores   4 cores   8 cores\n");
    for (int a = 0; a < 2; a++) {
        unsigned first = 0;
        for (int b = 0; b < 2; b++)
            for (int m = 0; m < 2; m++) {
                unsigned crc[4];
                char row[160];
                int k = snprintf(row, sizeof row, "# %-8s %-14s %-5s", backends[b] + 11,
                                 m ? "deterministic" : "adaptive", amps[a]);
                for (int c = 0; c < 4; c++) {
                    const char *env[] = {backends[b], modes[m][0], modes[m][1], cores[c], NULL};
                    crc[c] = ddp_h_child_crc(env, amps[a], NULL, 1 << c);
                    k += snprintf(row + k, sizeof row - (size_t)k, "  %08x", crc[c]);
                }
                printf("%s\n", row);
                for (int c = 1; c < 4; c++)
                    if (crc[c] != crc[0])
                        fail_msg("%s %s amp %s: %d cores give %08x, 1 core %08x", backends[b],
                                 modes[m][1], amps[a], 1 << c, crc[c], crc[0]);
                /* and the same bits in every mode and on both backends */
                if (b == 0 && m == 0)
                    first = crc[0];
                else if (crc[0] != first)
                    fail_msg("%s %s amp %s: %08x, but sim adaptive gives %08x", backends[b],
                             modes[m][1], amps[a], crc[0], first);
            }
    }
}

/* ---------------- two devices in this process ---------------- */

/* What needs two devices: duplicate devices, shard counts that do not
 * split over them, parameters on two devices, a loss on the wrong device;
 * the replica on device 1 is a copy with the same bits; after the errors a
 * step still works and leaves both replicas equal. */
static void test_two_devices(void **state)
{
    (void)state;
    assert_int_equal(nt_device_count(), 2);
    enum { B = 8 };
    float xb[B * F];
    int32_t yb[B];
    make_data(xb, yb, B, 3);
    nt_tensor *p[NP];
    make_params(p, NT_F32, 9);
    int devs[2] = {0, 1}, dup[2] = {1, 1};
    nt_test_expect_err(nt_ddp_create(p, NP, 2, dup, 2) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "device 1 at 0 and 1");
    nt_test_expect_err(nt_ddp_create(p, NP, 3, devs, 2) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "'shards' is 3");
    nt_test_expect_err(nt_ddp_create(p, NP, 6, devs, 2) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "power of two");
    assert_int_equal(nt_device_set(1), 0);
    nt_tensor *far = nt_zeros(NT_F32, 1, (int64_t[]){3});
    assert_int_equal(nt_set_requires_grad(far, true), 0);
    assert_int_equal(nt_device_set(0), 0);
    nt_tensor *mixed[2] = {p[0], far};
    nt_test_expect_err(nt_ddp_create(mixed, 2, 2, devs, 2) ? 0 : nt_last_error(), NT_EINVAL,
                       "nt_ddp_create", "one device");

    nt_ddp *d = nt_ddp_create(p, NP, 4, devs, 2);
    assert_non_null(d);
    nt_tensor **r0 = nt_ddp_params(d, 0), **r1 = nt_ddp_params(d, 1);
    assert_ptr_equal(r0[0], p[0]);
    assert_true(r1[0] != p[0]);
    assert_int_equal(nt_tensor_device(r1[0]), 1);
    assert_true(nt_requires_grad(r1[0]));
    static uint8_t a[H * F * 4], b[H * F * 4];
    for (int j = 0; j < NP; j++) {
        size_t nb = (size_t)nt_numel(p[j]) * 4;
        assert_int_equal(nt_to_host(r0[j], a, nb), 0);
        assert_int_equal(nt_to_host(r1[j], b, nb), 0);
        assert_memory_equal(a, b, nb);
    }
    assert_int_equal(nt_ddp_shard_device(d, 0), 0);
    assert_int_equal(nt_ddp_shard_device(d, 1), 0);
    assert_int_equal(nt_ddp_shard_device(d, 2), 1);
    assert_int_equal(nt_ddp_shard_device(d, 3), 1);
    /* a batch on device 0 sliced for shard 3 lands on device 1 */
    nt_tensor *whole = nt_from_host(xb, NT_F32, 2, (int64_t[]){B, F});
    nt_tensor *part = nt_ddp_shard(d, whole, 3);
    assert_non_null(part);
    assert_int_equal(nt_tensor_device(part), 1);
    float got[2 * F];
    assert_int_equal(nt_to_host(part, got, sizeof got), 0);
    assert_memory_equal(got, xb + 6 * F, sizeof got);
    /* and shard 0 of it, asked from device 1, stays on device 0 */
    assert_int_equal(nt_device_set(1), 0);
    nt_tensor *part0 = nt_ddp_shard(d, whole, 0);
    assert_non_null(part0);
    assert_int_equal(nt_tensor_device(part0), 0);
    assert_ptr_equal(nt_stream_current(), nt_stream_default_on(1));
    assert_int_equal(nt_to_host(part0, got, sizeof got), 0);
    assert_memory_equal(got, xb, sizeof got);
    nt_release(part0);
    assert_int_equal(nt_device_set(0), 0);

    nt_optim *opts[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(nt_device_set(k), 0);
        opts[k] = nt_optim_adamw(nt_ddp_params(d, k), NP, 1e-2, 0.9, 0.999, 1e-8, 0.0);
        assert_non_null(opts[k]);
    }
    nt_optim *swapped[2] = {opts[1], opts[0]};
    for (int s = 0; s < 4; s++) {
        int dev = nt_ddp_shard_device(d, s);
        assert_int_equal(nt_device_set(dev), 0);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_ddp_shard_from_host(d, s, xb, NT_F32, 2, (int64_t[]){B, F});
        nt_tensor *y = nt_ddp_shard_from_host(d, s, yb, NT_I32, 1, (int64_t[]){B});
        assert_int_equal(nt_tensor_device(x), dev);
        if (s == 0) {
            /* shard 0's loss computed on device 1 */
            assert_int_equal(nt_device_set(1), 0);
            nt_tensor *x1 = nt_ddp_shard_from_host(d, 2, xb, NT_F32, 2, (int64_t[]){B, F});
            nt_tensor *y1 = nt_ddp_shard_from_host(d, 2, yb, NT_I32, 1, (int64_t[]){B});
            nt_tensor *wrong = model_loss(r1, x1, y1);
            nt_test_expect_err(nt_ddp_backward(d, 0, wrong), NT_EINVAL, "nt_ddp_backward",
                               "'loss' is on device 1");
            assert_int_equal(nt_device_set(dev), 0);
        }
        assert_int_equal(nt_ddp_backward(d, s, model_loss(nt_ddp_params(d, dev), x, y)), 0);
        nt_scope_end(sc);
    }
    assert_int_equal(nt_ddp_reduce(d), 0);
    nt_test_expect_err(nt_ddp_step(d, swapped, 2), NT_EINVAL, "nt_ddp_step", "'opts[0]'");
    assert_int_equal(nt_ddp_step(d, opts, 2), 0);
    assert_int_equal(nt_device_set(0), 0);
    assert_int_equal(replica_crc(r0), replica_crc(r1));
    assert_int_equal(nt_sync(), 0);
    for (int k = 0; k < 2; k++)
        nt_optim_destroy(opts[k]);
    nt_ddp_destroy(d);
    nt_release(part);
    nt_release(whole);
    nt_release(far);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]);
}

/* ---------------- one backward for a shard of each device ---------------- */

/* The shards' bad arguments to nt_ddp_backward_shards at one round: each a
 * clear error naming the call and the argument, nothing changed. */
static void shards_bad_input(nt_ddp *d, int *sh, nt_tensor **l, nt_tensor *wide)
{
    const char *fn = "nt_ddp_backward_shards";
    nt_test_expect_err(nt_ddp_backward_shards(d, NULL, l, 2), NT_EINVAL, fn,
                       "'shards' is NULL");
    nt_test_expect_err(nt_ddp_backward_shards(d, sh, NULL, 2), NT_EINVAL, fn,
                       "'losses' is NULL");
    nt_test_expect_err(nt_ddp_backward_shards(d, sh, l, 1), NT_EINVAL, fn, "'n' is 1",
                       "expected 2");
    nt_test_expect_err(nt_ddp_backward_shards(d, sh, l, 3), NT_EINVAL, fn, "'n' is 3");
    int swapped[2] = {sh[1], sh[0]}, far[2] = {sh[0], 9};
    nt_test_expect_err(nt_ddp_backward_shards(d, swapped, l, 2), NT_EINVAL, fn,
                       "'shards[0]' is 2", "another device", "local device 0");
    nt_test_expect_err(nt_ddp_backward_shards(d, far, l, 2), NT_EINVAL, fn, "'shards[1]' is 9",
                       "< 4");
    nt_tensor *lswap[2] = {l[1], l[0]}, *lwide[2] = {wide, l[1]};
    nt_test_expect_err(nt_ddp_backward_shards(d, sh, lswap, 2), NT_EINVAL, fn,
                       "'losses[0]' is on device 1", "shard 0 belongs to device 0");
    nt_test_expect_err(nt_ddp_backward_shards(d, sh, lwide, 2), NT_EINVAL, fn, "'losses[0]'",
                       "one element");
    assert_int_equal(nt_graph_capture_begin(), 0);
    nt_test_expect_err(nt_ddp_backward_shards(d, sh, l, 2), NT_ESTATE, fn, "capturing");
    nt_graph_destroy(nt_graph_capture_end());
    nt_clear_error();
}

/* 2 devices, 4 shards, 3 steps: two rounds a step, each device's hidden
 * layer, then each device's loss, and one nt_ddp_backward_shards a round;
 * the replicas after the steps are the bits of a second nt_ddp trained by
 * the per-shard nt_ddp_backward loop from the same parameters.  Before the
 * first round's call the bad arguments (shards_bad_input), after it the
 * same round again (NT_ESTATE): the training then goes on to the same
 * bits. */
static void test_backward_shards(void **state)
{
    (void)state;
    assert_int_equal(nt_device_count(), 2);
    enum { B = 8, S = 4, STEPS = 3 };
    float xb[B * F];
    int32_t yb[B];
    nt_tensor *p[NP], *q[NP];
    make_params(p, NT_F32, 21);
    make_params(q, NT_F32, 21);
    int devs[2] = {0, 1};
    nt_ddp *d = nt_ddp_create(p, NP, S, devs, 2), *e = nt_ddp_create(q, NP, S, devs, 2);
    assert_non_null(d);
    assert_non_null(e);
    nt_optim *od[2], *oe[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(nt_device_set(k), 0);
        od[k] = nt_optim_adamw(nt_ddp_params(d, k), NP, 1e-2, 0.9, 0.999, 1e-8, 0.01);
        oe[k] = nt_optim_adamw(nt_ddp_params(e, k), NP, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    }
    for (int step = 0; step < STEPS; step++) {
        make_data(xb, yb, B, 40 + (uint32_t)step);
        for (int s = 0; s < S; s++) { /* e: the loop */
            int dev = nt_ddp_shard_device(e, s);
            assert_int_equal(nt_device_set(dev), 0);
            nt_scope *sc = nt_scope_begin();
            nt_tensor *x = nt_ddp_shard_from_host(e, s, xb, NT_F32, 2, (int64_t[]){B, F});
            nt_tensor *y = nt_ddp_shard_from_host(e, s, yb, NT_I32, 1, (int64_t[]){B});
            assert_int_equal(nt_ddp_backward(e, s, model_loss(nt_ddp_params(e, dev), x, y)), 0);
            nt_scope_end(sc);
        }
        for (int r = 0; r < 2; r++) { /* d: round r is shard r of each device */
            nt_scope *sc = nt_scope_begin();
            int sh[2] = {r, 2 + r};
            nt_tensor *h[2], *y[2], *l[2];
            for (int k = 0; k < 2; k++) {
                assert_int_equal(nt_device_set(k), 0);
                nt_tensor **w = nt_ddp_params(d, k);
                nt_tensor *x = nt_ddp_shard_from_host(d, sh[k], xb, NT_F32, 2, (int64_t[]){B, F});
                y[k] = nt_ddp_shard_from_host(d, sh[k], yb, NT_I32, 1, (int64_t[]){B});
                h[k] = nt_relu(nt_linear(x, w[0], w[1]));
            }
            for (int k = 0; k < 2; k++) {
                assert_int_equal(nt_device_set(k), 0);
                nt_tensor **w = nt_ddp_params(d, k);
                l[k] = nt_cross_entropy(nt_linear(h[k], w[2], w[3]), y[k]);
            }
            assert_int_equal(nt_device_set(0), 0);
            if (step == 0 && r == 0)
                shards_bad_input(d, sh, l, h[0]);
            assert_int_equal(nt_ddp_backward_shards(d, sh, l, 2), 0);
            if (step == 0 && r == 0)
                nt_test_expect_err(nt_ddp_backward_shards(d, sh, l, 2), NT_ESTATE,
                                   "nt_ddp_backward_shards", "shard 0 already has its gradients");
            nt_scope_end(sc);
        }
        assert_int_equal(nt_ddp_reduce(e), 0);
        assert_int_equal(nt_ddp_step(e, oe, 2), 0);
        assert_int_equal(nt_ddp_reduce(d), 0);
        assert_int_equal(nt_ddp_step(d, od, 2), 0);
    }
    assert_int_equal(nt_device_set(0), 0);
    for (int k = 0; k < 2; k++)
        assert_int_equal(replica_crc(nt_ddp_params(d, k)), replica_crc(nt_ddp_params(e, k)));
    assert_int_equal(nt_sync(), 0);
    for (int k = 0; k < 2; k++)
        nt_optim_destroy(od[k]), nt_optim_destroy(oe[k]);
    nt_ddp_destroy(d);
    nt_ddp_destroy(e);
    for (int j = 0; j < NP; j++)
        nt_release(p[j]), nt_release(q[j]);
}

/* ---------------- and over 2 processes (mpirun) ---------------- */

static const char *mpirun_path;

/* 2 processes x 1, 2, 4 cores give the parameters of 1 process x 1 core. */
static void test_bitwise_across_processes(void **state)
{
    (void)state;
    const char *env1[] = {"NT_SIM_CORES=1", NULL};
    unsigned ref = ddp_h_child_crc(env1, "none", NULL, 1);
    printf("# 1 process x 1 core: %08x\n", ref);
    static const char *const cores[] = {"NT_SIM_CORES=1", "NT_SIM_CORES=2", "NT_SIM_CORES=4"};
    for (int c = 0; c < 3; c++) {
        const char *env[] = {cores[c], NULL};
        unsigned crc = ddp_h_mpi_crc(mpirun_path, env, "none", 1 << c);
        printf("# 2 processes x %d cores: %08x (replicas same)\n", 1 << c, crc);
        if (crc != ref)
            fail_msg("2 processes x %d cores give %08x, 1 process %08x", 1 << c, crc, ref);
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child"))
        return child_main(argv[2]);
    if (ddp_h_self())
        return 1;
    if (argc == 3 && !strcmp(argv[1], "--mpi")) {
        const struct CMUnitTest mpi_tests[] = {cmocka_unit_test(test_bitwise_across_processes)};
        return ddp_h_mpi_main(argv[2], &mpirun_path, mpi_tests, 1);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tree_matches_reference, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_two_devices, ddp_h_setup_2dev, ddp_h_teardown_2dev),
        cmocka_unit_test_setup_teardown(test_backward_shards, ddp_h_setup_2dev,
                                        ddp_h_teardown_2dev),
        cmocka_unit_test(test_bitwise_across_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
