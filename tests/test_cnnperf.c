/* tests/test_cnnperf.c - the CNN step's faster CPU kernel paths give the
 * bits of the paths they replace.
 *
 * cpu/cpu.h's nt__cpu_ref_paths makes the CPU kernels take their reference
 * paths (batch norm: each phase over all channels in units of blocks; the
 * convolutions: the general paths; 2 x 2 max pooling: the scalar scan,
 * against its AVX2 and AVX-512 forms on each level this CPU runs); each case runs an op and its backward
 * once each way, on odd shapes (odd H and W, batch 1, a size-1 dim, more
 * than one 2048-element block per channel, no affine weight), with edge
 * values among the random ones, and compares every output and gradient bit
 * for bit. */
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
#include "core/gemm.h"
#include "cpu/cpu.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define NOUT 6

/* n floats of t (f32) into a new buffer. */
static float *host(nt_tensor *t, int64_t *n)
{
    *n = nt_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(*n ? *n : 1));
    assert_non_null(v);
    if (nt_to_host(t, v, sizeof(float) * (size_t)*n))
        fail_msg("to_host: %s", nt_last_error_message());
    return v;
}

/* An f32 tensor of shape sh, random normal values with a few edge values
 * (+-0, huge, tiny, subnormal) at fixed places. */
static nt_tensor *input(int nd, const int64_t *sh, uint64_t seed, bool edges)
{
    int64_t n = nt_test_numel(nd, sh);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    uint64_t st = seed;
    for (int64_t i = 0; i < n; i++)
        v[i] = 2.0f * nt_test_uniform(&st) - 1.0f;
    static const float ev[] = {0.0f, -0.0f, 3.0e4f, -2.5e-30f, 1.0e-41f, -7.0f};
    for (int64_t i = 0; edges && i < (int64_t)(sizeof ev / sizeof ev[0]) && i * 37 < n; i++)
        v[i * 37] = ev[i];
    nt_tensor *t = nt_from_host(v, NT_F32, nd, sh);
    free(v);
    assert_non_null(t);
    return t;
}

static void same_bits(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (nt_test_ubits(a[i]) != nt_test_ubits(b[i]))
            fail_msg("%s[%lld]: %.9g (%08x) with the fast path, %.9g (%08x) with the "
                     "reference one", what, (long long)i, (double)a[i], nt_test_ubits(a[i]),
                     (double)b[i], nt_test_ubits(b[i]));
}

typedef struct outs {
    float *v[NOUT];
    int64_t n[NOUT];
    int k;
} outs;

static void keep(outs *o, nt_tensor *t)
{
    assert_non_null(t);
    assert_true(o->k < NOUT);
    o->v[o->k] = host(t, &o->n[o->k]);
    o->k++;
}

static void compare(const char *what, outs *a, outs *b)
{
    assert_int_equal(a->k, b->k);
    for (int i = 0; i < a->k; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s output %d", what, i);
        assert_int_equal(a->n[i], b->n[i]);
        same_bits(name, a->v[i], b->v[i], a->n[i]);
        free(a->v[i]);
        free(b->v[i]);
    }
}

/* ---------------- batch norm ---------------- */

/* Training batch norm of x [sh] (affine or not), then the backward of
 * sum(y * g): y, the running statistics, dx, dw, db. */
static void bn_run(const int64_t *sh, bool affine, outs *o)
{
    nt_scope *sc = nt_scope_begin();
    int64_t C = sh[1];
    nt_tensor *x = input(4, sh, 11, true), *g = input(4, sh, 12, false);
    nt_tensor *rm = nt_zeros(NT_F32, 1, &C), *rv = nt_ones(NT_F32, 1, &C);
    nt_tensor *w = affine ? input(1, &C, 13, false) : NULL, *b = affine ? input(1, &C, 14, false)
                                                                       : NULL;
    assert_int_equal(nt_set_requires_grad(x, true), 0);
    if (affine) {
        assert_int_equal(nt_set_requires_grad(w, true), 0);
        assert_int_equal(nt_set_requires_grad(b, true), 0);
    }
    nt_tensor *y = nt_batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
    assert_non_null(y);
    assert_int_equal(nt_backward_full(y, g, false, false), 0);
    keep(o, y), keep(o, rm), keep(o, rv), keep(o, nt_grad(x));
    if (affine)
        keep(o, nt_grad(w)), keep(o, nt_grad(b));
    nt_scope_end(sc);
}

static void test_bn_by_channel(void **state)
{
    (void)state;
    static const int64_t shapes[][4] = {
        {2, 5, 3, 7}, {1, 4, 33, 65}, {3, 6, 1, 1}, {5, 9, 13, 11}, {2, 3, 7, 5}, {128, 4, 3, 3},
        /* runs of 63 (gathered sums) and of 32 (read in place) across a
         * block's end; two channels over units of blocks */
        {40, 4, 7, 9}, {300, 2, 7, 9}, {80, 4, 4, 8}, {300, 2, 4, 8}, {2, 3, 1, 2080},
    };
    /* the in-place sums' lanes in C (scalar level), in AVX2 vectors and in
     * AVX-512 ones (its y and dx loops built for that level too) */
    int isas[] = {NT_ISA_SCALAR, NT_ISA_AVX2, NT_ISA_AVX512};
    for (size_t q = 0; q < sizeof isas / sizeof isas[0]; q++) {
        if (!nt__gemm_isa_runs(isas[q]))
            continue;
        assert_int_equal(nt__gemm_set_isa(isas[q]), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int affine = 0; affine < 2; affine++) {
                outs fast = {0}, ref = {0};
                assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
                atomic_store(&nt__cpu_ref_paths, 0);
                bn_run(shapes[s], affine, &fast);
                atomic_store(&nt__cpu_ref_paths, 1);
                bn_run(shapes[s], affine, &ref);
                atomic_store(&nt__cpu_ref_paths, 0);
                char what[80];
                snprintf(what, sizeof what, "batch_norm %s shape %zu affine %d",
                         nt__gemm_isa_label(isas[q]), s, affine);
                compare(what, &fast, &ref);
            }
    }
    nt__gemm_set_isa(-1);
}

/* ---------------- convolutions ---------------- */

typedef struct conv_case {
    int64_t x[4], w[4], stride[2], pad[2], dil[2], groups;
} conv_case;

/* conv2d of case c, then the backward of sum(y * g): y, dx, dw. */
static void conv_run(const conv_case *c, outs *o)
{
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = input(4, c->x, 21, true), *w = input(4, c->w, 22, false);
    assert_int_equal(nt_set_requires_grad(x, true), 0);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    nt_tensor *y = nt_conv2d(x, w, NULL, c->stride, c->pad, c->dil, c->groups);
    if (!y)
        fail_msg("conv2d: %s", nt_last_error_message());
    int64_t gs[4];
    for (int d = 0; d < 4; d++)
        gs[d] = nt_shape(y, d);
    nt_tensor *g = input(4, gs, 23, false);
    assert_int_equal(nt_backward_full(y, g, false, false), 0);
    keep(o, y), keep(o, nt_grad(x)), keep(o, nt_grad(w));
    nt_scope_end(sc);
}

static void test_conv_paths(void **state)
{
    (void)state;
    static const conv_case cases[] = {
        {{2, 3, 9, 11}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},     /* odd H, W */
        {{3, 4, 10, 7}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2},     /* groups */
        {{2, 6, 9, 9}, {6, 1, 3, 3}, {1, 1}, {2, 0}, {1, 1}, 6},      /* depthwise */
        {{3, 5, 11, 13}, {7, 5, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},    /* stride 2 */
        {{2, 5, 8, 9}, {9, 5, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},      /* 1x1 */
        {{2, 4, 12, 10}, {3, 4, 3, 2}, {1, 1}, {2, 1}, {2, 3}, 1},    /* dilation */
        {{1, 16, 28, 28}, {16, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1}, /* batch 1 */
        {{4, 16, 14, 14}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1}, /* the CNN's */
        {{3, 32, 7, 7}, {32, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{2, 3, 5, 5}, {70, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},     /* > 64 channels */
        {{2, 2, 1, 9}, {3, 2, 1, 4}, {1, 2}, {0, 3}, {1, 1}, 1},      /* H = 1 */
        /* channels in sixteens: the channel-last weight gradient (its
         * vectors in threes, a last block of one or two; the output
         * channels' blocks on one thread or split) */
        {{2, 48, 5, 7}, {16, 48, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{3, 32, 6, 9}, {48, 32, 2, 3}, {2, 1}, {0, 1}, {1, 1}, 1},
        {{2, 64, 5, 5}, {16, 64, 3, 4}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{3, 16, 9, 11}, {16, 16, 3, 3}, {2, 1}, {0, 1}, {1, 2}, 1},
        {{2, 16, 5, 6}, {16, 16, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
        {{2, 16, 7, 8}, {16, 16, 3, 4}, {1, 1}, {1, 2}, {1, 1}, 1},
        {{5, 16, 6, 19}, {16, 16, 2, 2}, {1, 1}, {1, 0}, {1, 1}, 1},
        /* the column-free kernels' edges at either vector level: padded
         * rows sharing their zeros (padding 2; 0 and 2; 3, more than the
         * kernel, rows then OW apart), 5 output channels (a half block of
         * one), the stem's one input channel (rows 6 + 3, its weight
         * gradient's 9 rows split between the threads), 40 channels
         * (the AVX2 weight gradient's two passes of 32), dilation */
        {{3, 5, 7, 13}, {5, 5, 3, 3}, {1, 1}, {2, 2}, {1, 1}, 1},
        {{2, 7, 4, 10}, {9, 7, 2, 3}, {1, 1}, {0, 2}, {1, 1}, 1},
        {{2, 2, 9, 4}, {3, 2, 3, 3}, {1, 1}, {3, 3}, {1, 1}, 1},
        {{10, 1, 28, 28}, {16, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{2, 3, 6, 5}, {40, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{2, 3, 11, 9}, {4, 3, 3, 3}, {1, 1}, {2, 1}, {2, 2}, 1},
        {{3, 4, 5, 3}, {12, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2},
        /* conv_gemm's last K-tile stored straight into y, its kept lanes
         * packed: three K-tiles and 13 channels (a last block of 5 rows),
         * rows of 3 in vectors of 16 (four output rows a vector, each
         * with its dropped lane); two K-tiles, one block past the plane's
         * end; one output column (the padded copy's rows of one) */
        {{2, 40, 5, 3}, {13, 40, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{3, 20, 6, 6}, {11, 20, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{2, 3, 7, 1}, {5, 3, 3, 1}, {1, 1}, {1, 0}, {1, 1}, 1},
        {{2, 17, 30, 2}, {9, 17, 3, 3}, {1, 1}, {2, 1}, {1, 1}, 1},
        /* conv_gemm's table of vectors (made once a call) to its end: 81
         * positions, a last block of 48 from 48, its last vector past the
         * plane */
        {{2, 16, 9, 8}, {16, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        /* the channel-last weight gradient's units, big enough to be
         * shared: 16 output channels (two blocks of 8) with their three
         * triples of vectors split (six units), eight vectors (the last
         * triple's spare one), and 48 channels (six blocks, whole) */
        {{4, 16, 14, 14}, {16, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
        {{5, 32, 12, 12}, {16, 32, 2, 2}, {1, 1}, {0, 0}, {1, 1}, 1},
        {{4, 16, 14, 14}, {48, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    };
    /* every vector level this CPU runs against the reference path */
    static const int isas[] = {NT_ISA_AVX2, NT_ISA_AVX512};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int l = 0; l < 2; l++) {
            if (!nt__gemm_isa_runs(isas[l]))
                continue;
            outs fast = {0}, ref = {0};
            assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
            atomic_store(&nt__cpu_ref_paths, 1);
            conv_run(&cases[i], &ref);
            atomic_store(&nt__cpu_ref_paths, 0);
            assert_int_equal(nt__gemm_set_isa(isas[l]), 0);
            conv_run(&cases[i], &fast);
            assert_int_equal(nt__gemm_set_isa(-1), 0);
            char what[64];
            snprintf(what, sizeof what, "conv2d case %zu (%s)", i, nt__gemm_isa_label(isas[l]));
            compare(what, &fast, &ref);
        }
}

/* ---------------- 2 x 2 max pooling ---------------- */

/* max_pool2d 2 x 2 of x [sh] (values from a few levels, so windows tie;
 * NaNs, infinities and signed zeros at fixed places), then the backward of
 * sum(y * g): y, the positions, dx. */
static void pool_run(const int64_t *sh, outs *o)
{
    nt_scope *sc = nt_scope_begin();
    int64_t n = nt_test_numel(4, sh);
    float *v = malloc(sizeof(float) * (size_t)n);
    assert_non_null(v);
    uint64_t st = 31;
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(int)(7.0 * nt_test_uniform(&st)) - 3.0f;
    static const float ev[] = {NAN, -INFINITY, -0.0f, INFINITY, 0.0f, -NAN};
    for (int64_t i = 0; i * 13 < n; i++)
        if (i % 3 == 0)
            v[i * 13] = ev[(i / 3) % 6];
    nt_tensor *x = nt_from_host(v, NT_F32, 4, sh), *idx = NULL;
    free(v);
    assert_int_equal(nt_set_requires_grad(x, true), 0);
    nt_tensor *y = nt_max_pool2d(x, SH(2, 2), NULL, NULL, NULL, false, &idx);
    if (!y)
        fail_msg("max_pool2d: %s", nt_last_error_message());
    int64_t gs[4];
    for (int d = 0; d < 4; d++)
        gs[d] = nt_shape(y, d);
    /* the gradient with the edge values, a NaN of another payload and -0
     * (+0 + -0 is +0) */
    int64_t ng = nt_test_numel(4, gs);
    float *gv = host(input(4, gs, 33, true), &ng);
    uint32_t nanbits = 0x7fa00001u;
    for (int64_t i = 5; i < ng; i += 29)
        memcpy(&gv[i], &nanbits, sizeof nanbits), gv[i - 1] = -0.0f;
    nt_tensor *g = nt_from_host(gv, NT_F32, 4, gs);
    free(gv);
    assert_int_equal(nt_backward_full(y, g, false, false), 0);
    keep(o, y), keep(o, idx), keep(o, nt_grad(x));
    nt_scope_end(sc);
}

static void test_pool_2x2_paths(void **state)
{
    (void)state;
    /* output widths of 1 to 17 (vectors of 8 and 16 windows with and
     * without a tail), odd H and W (a last row and column no window
     * reads), the CNN's 28 x 28 and 14 x 14 planes */
    static const int64_t shapes[][4] = {
        {2, 3, 4, 2},  {1, 2, 5, 7},   {3, 2, 6, 16},  {2, 1, 3, 17}, {2, 3, 8, 18},
        {1, 4, 9, 33}, {2, 2, 4, 35},  {3, 5, 28, 28}, {2, 7, 14, 14}, {1, 1, 2, 34},
    };
    int isas[] = {NT_ISA_AVX2, NT_ISA_AVX512};
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    for (size_t q = 0; q < sizeof isas / sizeof isas[0]; q++) {
        if (!nt__gemm_isa_runs(isas[q]))
            continue;
        assert_int_equal(nt__gemm_set_isa(isas[q]), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            outs fast = {0}, ref = {0};
            atomic_store(&nt__cpu_ref_paths, 0);
            pool_run(shapes[s], &fast);
            atomic_store(&nt__cpu_ref_paths, 1);
            pool_run(shapes[s], &ref);
            atomic_store(&nt__cpu_ref_paths, 0);
            char what[64];
            snprintf(what, sizeof what, "max_pool2d %s shape %zu", nt__gemm_isa_label(isas[q]), s);
            compare(what, &fast, &ref);
        }
    }
    nt__gemm_set_isa(-1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bn_by_channel, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_conv_paths, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_pool_2x2_paths, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
