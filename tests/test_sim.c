/* tests/test_sim.c - the NeuronCore simulator: instruction semantics, rule
 * errors, the cost model, the matmul tile program, timing-only mode, the
 * trace file, statistics and threads.  Links the standalone ntsim library. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/dtype.h"
#include "core/ewise.h"
#include "core/gemm.h"
#include "sim/isa.h"
#include "sim/sim.h"
#include "core/reduce.h"
#include "sim/trace.h"
#include "nt_test.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

/* the seeded values of every test here (nt_test.h's generator) */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The kernel a test has open: a failing assertion jumps out of the test,
 * and the teardown must still end it or the core stays taken. */
static nt_sim_kernel *open_k;

static int reset(void **state)
{
    (void)state;
    nt_sim_set_target(NT_SIM_TRN1);
    nt_sim_set_functional(true);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (open_k)
        nt_sim_kernel_end(open_k, NULL);
    open_k = NULL;
    nt_sim_set_functional(true);
    return 0;
}

static nt_sim_kernel *begin(const char *name)
{
    nt_sim_kernel *k = nt_sim_kernel_begin(name);
    assert_non_null(k);
    open_k = k;
    return k;
}

static int end_kernel(nt_sim_kernel *k, nt_sim_report *r)
{
    if (k == open_k)
        open_k = NULL;
    return nt_sim_kernel_end(k, r);
}
#define nt_sim_kernel_end end_kernel

static void end_ok(nt_sim_kernel *k)
{
    nt_sim_report r;
    int rc = nt_sim_kernel_end(k, &r);
    if (rc)
        fprintf(stderr, "kernel error: %s\n", r.message);
    assert_int_equal(rc, 0);
}

/* HBM [rows, cols] f32 view with row stride ld */
static nt_ap hbm32(const float *p, int rows, int64_t ld, int64_t cols)
{
    return nt_hbm_ap(p, NT_F32, 0, rows, ld, cols);
}

/* Loads host rows (f32, contiguous rows of n) into a fresh SBUF tile. */
static nt_tile *load(nt_sim_kernel *k, const char *name, const float *src, int P, int64_t n)
{
    nt_tile *t = nt_tile_alloc(k, name, NT_MEM_SBUF, NT_F32, P, n);
    assert_non_null(t);
    nt_ap d = nt_tile_ap(t), s = hbm32(src, P, n, n);
    assert_int_equal(nt_isa_dma_copy(k, &d, &s, NT_DMA_QUEUE_AUTO), 0);
    return t;
}

/* Stores an f32 tile (or a [P, n] pattern) to host rows. */
static void store(nt_sim_kernel *k, float *dst, const nt_ap *src)
{
    nt_ap d = hbm32(dst, src->np, nt_tile_size(src->tile), nt_tile_size(src->tile));
    d.num[0] = src->num[0];
    d.ndim = src->ndim;
    for (int i = 0; i < src->ndim; i++)
        d.num[i] = src->num[i];
    /* contiguous host layout of the pattern's shape */
    int64_t st = 1;
    for (int i = src->ndim - 1; i >= 0; i--) {
        d.step[i] = st;
        st *= src->num[i];
    }
    d.pstep = st;
    assert_int_equal(nt_isa_dma_copy(k, &d, src, NT_DMA_QUEUE_AUTO), 0);
}

static double instr_ns(nt_sim_kernel *k)
{
    nt_sim_instr_info in;
    assert_int_equal(nt_sim_kernel_last(k, &in), 0);
    return in.end_ns - in.start_ns;
}

/* ------------------------------------------------------------------------ */
/* dma_copy                                                                 */
/* ------------------------------------------------------------------------ */

static void test_dma_roundtrip(void **state)
{
    (void)state;
    enum { P = 100, C = 300, LD = 320 };
    float *src = calloc(P * LD, 4), *dst = calloc(P * LD, 4);
    nt_test_fill(src, P * LD, &rng_state);
    nt_sim_kernel *k = begin("dma_roundtrip");
    nt_tile *t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 128, C);
    nt_ap s = hbm32(src, P, LD, C), d = nt_tile_slice(t, 0, P, 0, C);
    assert_int_equal(nt_isa_dma_copy(k, &d, &s, 3), 0);
    /* SBUF -> SBUF into partitions 20..119 of another tile */
    nt_tile *u = nt_tile_alloc(k, "u", NT_MEM_SBUF, NT_F32, 128, C);
    nt_ap u20 = nt_tile_slice(u, 20, P, 0, C);
    assert_int_equal(nt_isa_dma_copy(k, &u20, &d, NT_DMA_QUEUE_AUTO), 0);
    nt_ap o = hbm32(dst, P, LD, C);
    assert_int_equal(nt_isa_dma_copy(k, &o, &u20, 15), 0);
    end_ok(k);
    for (int p = 0; p < P; p++)
        assert_memory_equal(src + p * LD, dst + p * LD, C * 4);
    free(src);
    free(dst);
}

static void test_dma_patterns(void **state)
{
    (void)state;
    /* HBM [4 rows of 30]; read each row as a 5 x 6 grid transposed: element
     * (i, j) of the SBUF row is hbm[p*40 + i + 5*j] */
    float src[4 * 40], back[4 * 30];
    for (int i = 0; i < 160; i++)
        src[i] = (float)i;
    nt_sim_kernel *k = begin("dma_patterns");
    nt_tile *t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 4, 30);
    nt_ap s = nt_hbm_ap(src, NT_F32, 0, 4, 40, 5);
    s.ndim = 2;
    s.num[0] = 5;
    s.step[0] = 1;
    s.num[1] = 6;
    s.step[1] = 5;
    nt_ap d = nt_tile_ap(t);
    assert_int_equal(nt_isa_dma_copy(k, &d, &s, NT_DMA_QUEUE_AUTO), 0);
    /* a 4-D destination pattern that reverses the row in halves:
     * [2][3][1][5] with steps that walk 15..29 then 0..14 */
    float out[4 * 30];
    nt_ap o = nt_hbm_ap(out, NT_F32, 15, 4, 30, 1);
    o.ndim = 4;
    o.num[0] = 2, o.step[0] = -15;
    o.num[1] = 3, o.step[1] = 5;
    o.num[2] = 1, o.step[2] = 7;
    o.num[3] = 5, o.step[3] = 1;
    assert_int_equal(nt_isa_dma_copy(k, &o, &d, NT_DMA_QUEUE_AUTO), 0);
    nt_ap b = hbm32(back, 4, 30, 30);
    assert_int_equal(nt_isa_dma_copy(k, &b, &d, NT_DMA_QUEUE_AUTO), 0);
    end_ok(k);
    for (int p = 0; p < 4; p++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 6; j++)
                assert_true(back[p * 30 + i * 6 + j] == src[p * 40 + i + 5 * j]);
    for (int p = 0; p < 4; p++)
        for (int e = 0; e < 30; e++) {
            int half = e / 15, r = e % 15;
            int pos = 15 - 15 * half + r;
            assert_true(out[p * 30 + pos] == back[p * 30 + e]);
        }
}

static void test_dma_bf16(void **state)
{
    (void)state;
    uint16_t src[64 * 48], dst[64 * 48];
    for (int i = 0; i < 64 * 48; i++)
        src[i] = nt__f32_to_bf16(nt_test_uniform(&rng_state));
    memset(dst, 0, sizeof dst);
    nt_sim_kernel *k = begin("dma_bf16");
    nt_tile *t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_BF16, 64, 48);
    nt_ap s = nt_hbm_ap(src, NT_BF16, 0, 64, 48, 48), d = nt_tile_ap(t);
    assert_int_equal(nt_isa_dma_copy(k, &d, &s, NT_DMA_QUEUE_AUTO), 0);
    nt_ap o = nt_hbm_ap(dst, NT_BF16, 0, 64, 48, 48);
    assert_int_equal(nt_isa_dma_copy(k, &o, &d, NT_DMA_QUEUE_AUTO), 0);
    end_ok(k);
    assert_memory_equal(src, dst, sizeof src);
}

/* ------------------------------------------------------------------------ */
/* TensorE                                                                  */
/* ------------------------------------------------------------------------ */

/* The primitive's K-tile for operands of dtype dt: bf16 x bf16 products
 * have their own definition (core/gemm.h, nt__gemm_bf16), the rest
 * nt__gemm_ktile's recurrence. */
static void ktile_ref(nt_dtype dt, int M, int N, int K, const float *A, int lda, const float *B,
                      int ldb, float *C, int ldc, bool acc)
{
    if (dt == NT_BF16)
        nt__gemm_bf16(M, N, K, A, lda, false, NT_F32, B, ldb, false, NT_F32, C, ldc, acc, false,
                      NULL, NT_F32);
    else
        nt__gemm_ktile(M, N, K, A, lda, B, ldb, C, ldc, acc);
}

/* nc_matmul with K x M stationary and K x N moving, dtype dt; checks the
 * PSUM result bitwise against nt__gemm_ktile and within tolerance against a
 * double reference. */
static void matmul_case(nt_dtype dt, int K, int M, int N)
{
    float *st = malloc((size_t)K * M * 4), *mv = malloc((size_t)K * N * 4);
    nt_test_fill(st, (size_t)K * M, &rng_state);
    nt_test_fill(mv, (size_t)K * N, &rng_state);
    if (dt != NT_F32) { /* make the inputs representable */
        for (int i = 0; i < K * M; i++)
            st[i] = dt == NT_BF16 ? nt__bf16_to_f32(nt__f32_to_bf16(st[i]))
                                  : nt__f16_to_f32(nt__f32_to_f16(st[i]));
        for (int i = 0; i < K * N; i++)
            mv[i] = dt == NT_BF16 ? nt__bf16_to_f32(nt__f32_to_bf16(mv[i]))
                                  : nt__f16_to_f32(nt__f32_to_f16(mv[i]));
    }
    float *c = malloc((size_t)M * N * 4), *ref = malloc((size_t)M * N * 4);
    nt_sim_kernel *k = begin("matmul_case");
    nt_tile *ts = load(k, "st32", st, K, M), *tm = load(k, "mv32", mv, K, N);
    nt_tile *cs = nt_tile_alloc(k, "st", NT_MEM_SBUF, dt, K, M);
    nt_tile *cm = nt_tile_alloc(k, "mv", NT_MEM_SBUF, dt, K, N);
    nt_ap a = nt_tile_ap(ts), b = nt_tile_ap(tm), ca = nt_tile_ap(cs), cb = nt_tile_ap(cm);
    assert_int_equal(nt_isa_tensor_copy(k, &ca, &a, NT_ENGINE_DEFAULT), 0);
    assert_int_equal(nt_isa_tensor_copy(k, &cb, &b, NT_ENGINE_GPSIMD), 0);
    nt_tile *ps = nt_tile_alloc(k, "ps", NT_MEM_PSUM, NT_F32, M, N);
    nt_ap pd = nt_tile_ap(ps);
    assert_int_equal(nt_isa_nc_matmul(k, &pd, &ca, &cb, false), 0);
    nt_tile *out = nt_tile_alloc(k, "out", NT_MEM_SBUF, NT_F32, M, N);
    nt_ap od = nt_tile_ap(out);
    assert_int_equal(nt_isa_tensor_copy(k, &od, &pd, NT_ENGINE_SCALAR), 0);
    store(k, c, &od);
    end_ok(k);
    ktile_ref(dt, M, N, K, st, M, mv, N, ref, N, false);
    assert_memory_equal(c, ref, (size_t)M * N * 4);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int kk = 0; kk < K; kk++) {
                s += (double)st[kk * M + i] * mv[kk * N + j];
                mag += fabs((double)st[kk * M + i] * mv[kk * N + j]);
            }
            assert_true(fabs(c[i * N + j] - s) <= 1e-6 * mag + 1e-30);
        }
    free(st);
    free(mv);
    free(c);
    free(ref);
}

static void test_matmul_f32(void **state)
{
    (void)state;
    matmul_case(NT_F32, 100, 70, 300);
    matmul_case(NT_F32, 128, 128, 512);
}

static void test_matmul_half(void **state)
{
    (void)state;
    matmul_case(NT_BF16, 128, 128, 512);
    matmul_case(NT_F16, 33, 5, 17);
}

static void test_matmul_accumulate(void **state)
{
    (void)state;
    enum { K = 64, M = 32, N = 48 };
    float st[K * M], mv[K * N], st2[K * M], mv2[K * N], c[M * N], ref[M * N];
    nt_test_fill(st, K * M, &rng_state);
    nt_test_fill(mv, K * N, &rng_state);
    nt_test_fill(st2, K * M, &rng_state);
    nt_test_fill(mv2, K * N, &rng_state);
    nt_sim_kernel *k = begin("matmul_acc");
    nt_tile *a = load(k, "a", st, K, M), *b = load(k, "b", mv, K, N);
    nt_tile *a2 = load(k, "a2", st2, K, M), *b2 = load(k, "b2", mv2, K, N);
    nt_tile *ps = nt_tile_alloc(k, "ps", NT_MEM_PSUM, NT_F32, M, N);
    nt_ap pd = nt_tile_ap(ps), A = nt_tile_ap(a), B = nt_tile_ap(b), A2 = nt_tile_ap(a2),
          B2 = nt_tile_ap(b2);
    /* a stale value must be overwritten, then the second product added */
    assert_int_equal(nt_isa_memset(k, &pd, 7.0, NT_ENGINE_VECTOR), 0);
    assert_int_equal(nt_isa_nc_matmul(k, &pd, &A, &B, false), 0);
    assert_int_equal(nt_isa_nc_matmul(k, &pd, &A2, &B2, true), 0);
    nt_tile *o = nt_tile_alloc(k, "o", NT_MEM_SBUF, NT_F32, M, N);
    nt_ap od = nt_tile_ap(o);
    assert_int_equal(nt_isa_tensor_copy(k, &od, &pd, NT_ENGINE_VECTOR), 0);
    store(k, c, &od);
    end_ok(k);
    nt__gemm_ktile(M, N, K, st, M, mv, N, ref, N, false);
    nt__gemm_ktile(M, N, K, st2, M, mv2, N, ref, N, true);
    assert_memory_equal(c, ref, sizeof c);
}

/* A K-tile's product from +0 in PSUM (acc false), then added by VectorE
 * into an f32 SBUF accumulator, gives the bits of the same K-tiles
 * accumulated in PSUM: core/gemm.h's C = C + s across K-tiles is one f32
 * add either way.  A program that pairs a linear layer's weight gradient
 * with its input gradient (one load of dY for both) can keep a weight
 * gradient larger than PSUM in SBUF this way (docs/graphs.md, "The weight
 * gradient beside the input gradient"). */
static void sbuf_acc_case(nt_dtype dt)
{
    enum { K = 128, M = 64, N = 96, T = 3 };
    static float st[T][K * M], mv[T][K * N], c[M * N], ref[M * N];
    for (int t = 0; t < T; t++) {
        nt_test_fill(st[t], K * M, &rng_state);
        nt_test_fill(mv[t], K * N, &rng_state);
        for (int i = 0; dt == NT_BF16 && i < K * M; i++)
            st[t][i] = nt__bf16_to_f32(nt__f32_to_bf16(st[t][i]));
        for (int i = 0; dt == NT_BF16 && i < K * N; i++)
            mv[t][i] = nt__bf16_to_f32(nt__f32_to_bf16(mv[t][i]));
    }
    nt_sim_kernel *k = begin("matmul_sbuf_acc");
    nt_tile *o = nt_tile_alloc(k, "o", NT_MEM_SBUF, NT_F32, M, N);
    nt_tile *ps = nt_tile_alloc(k, "ps", NT_MEM_PSUM, NT_F32, M, N);
    nt_ap od = nt_tile_ap(o), pd = nt_tile_ap(ps);
    for (int t = 0; t < T; t++) {
        nt_tile *a = load(k, "a", st[t], K, M), *b = load(k, "b", mv[t], K, N);
        nt_tile *ca = nt_tile_alloc(k, "ca", NT_MEM_SBUF, dt, K, M);
        nt_tile *cb = nt_tile_alloc(k, "cb", NT_MEM_SBUF, dt, K, N);
        nt_ap A = nt_tile_ap(a), B = nt_tile_ap(b), CA = nt_tile_ap(ca), CB = nt_tile_ap(cb);
        assert_int_equal(nt_isa_tensor_copy(k, &CA, &A, NT_ENGINE_VECTOR), 0);
        assert_int_equal(nt_isa_tensor_copy(k, &CB, &B, NT_ENGINE_VECTOR), 0);
        assert_int_equal(nt_isa_nc_matmul(k, &pd, &CA, &CB, false), 0);
        if (t == 0)
            assert_int_equal(nt_isa_tensor_copy(k, &od, &pd, NT_ENGINE_VECTOR), 0);
        else
            assert_int_equal(nt_isa_tensor_tensor(k, &od, &od, &pd, NT_ALU_ADD, NT_ENGINE_VECTOR),
                             0);
    }
    store(k, c, &od);
    end_ok(k);
    for (int t = 0; t < T; t++)
        ktile_ref(dt, M, N, K, st[t], M, mv[t], N, ref, N, t > 0);
    assert_memory_equal(c, ref, sizeof c);
}

static void test_matmul_accumulate_sbuf(void **state)
{
    (void)state;
    sbuf_acc_case(NT_F32);
    sbuf_acc_case(NT_BF16);
}

static void test_transpose(void **state)
{
    (void)state;
    enum { P = 96, F = 40 };
    float x[P * F], y[F * P];
    nt_test_fill(x, P * F, &rng_state);
    nt_sim_kernel *k = begin("transpose");
    nt_tile *t = load(k, "x", x, P, F);
    nt_tile *ps = nt_tile_alloc(k, "xt", NT_MEM_PSUM, NT_F32, F, P);
    nt_ap s = nt_tile_ap(t), d = nt_tile_ap(ps);
    assert_int_equal(nt_isa_nc_transpose(k, &d, &s), 0);
    nt_tile *o = nt_tile_alloc(k, "o", NT_MEM_SBUF, NT_F32, F, P);
    nt_ap od = nt_tile_ap(o);
    assert_int_equal(nt_isa_tensor_copy(k, &od, &d, NT_ENGINE_DEFAULT), 0);
    store(k, y, &od);
    end_ok(k);
    for (int p = 0; p < P; p++)
        for (int f = 0; f < F; f++)
            assert_true(bits(y[f * P + p]) == bits(x[p * F + f]));
}

/* The other data paths of nc_transpose: 2-byte elements (bf16 -> bf16),
 * widening (bf16 -> f32), a full 128 x 128 block, and a source whose rows
 * are not contiguous (every other column). */
static void test_transpose_paths(void **state)
{
    (void)state;
    enum { P = 128, F = 128 };
    static float x[P * F], y[F * P], z[F * P], w[64 * P];
    static uint16_t hb[P * F], yb[F * P];
    nt_test_fill(x, P * F, &rng_state);
    for (int i = 0; i < P * F; i++)
        hb[i] = nt__f32_to_bf16(x[i]);
    nt_sim_kernel *k = begin("transpose_paths");
    nt_tile *t = load(k, "x", x, P, F);
    nt_tile *tb = nt_tile_alloc(k, "xb", NT_MEM_SBUF, NT_BF16, P, F);
    nt_ap sb = nt_tile_ap(tb), hbm = nt_hbm_ap(hb, NT_BF16, 0, P, F, F);
    assert_int_equal(nt_isa_dma_copy(k, &sb, &hbm, NT_DMA_QUEUE_AUTO), 0);
    /* f32 128 x 128 */
    nt_tile *ps = nt_tile_alloc(k, "xt", NT_MEM_PSUM, NT_F32, F, P);
    nt_ap s = nt_tile_ap(t), d = nt_tile_ap(ps);
    assert_int_equal(nt_isa_nc_transpose(k, &d, &s), 0);
    nt_tile *o = nt_tile_alloc(k, "o", NT_MEM_SBUF, NT_F32, F, P);
    nt_ap od = nt_tile_ap(o);
    assert_int_equal(nt_isa_tensor_copy(k, &od, &d, NT_ENGINE_DEFAULT), 0);
    store(k, y, &od);
    /* bf16 -> f32 */
    assert_int_equal(nt_isa_nc_transpose(k, &d, &sb), 0);
    assert_int_equal(nt_isa_tensor_copy(k, &od, &d, NT_ENGINE_DEFAULT), 0);
    store(k, z, &od);
    /* bf16 -> bf16 */
    nt_tile *pb = nt_tile_alloc(k, "xtb", NT_MEM_PSUM, NT_BF16, F, P);
    nt_ap db = nt_tile_ap(pb);
    assert_int_equal(nt_isa_nc_transpose(k, &db, &sb), 0);
    nt_tile *ob = nt_tile_alloc(k, "ob", NT_MEM_SBUF, NT_BF16, F, P);
    nt_ap odb = nt_tile_ap(ob), hy = nt_hbm_ap(yb, NT_BF16, 0, F, P, P);
    assert_int_equal(nt_isa_tensor_copy(k, &odb, &db, NT_ENGINE_DEFAULT), 0);
    assert_int_equal(nt_isa_dma_copy(k, &hy, &odb, NT_DMA_QUEUE_AUTO), 0);
    /* every other column of x: a strided source */
    nt_ap ev = nt_tile_ap(t);
    ev.num[0] = 64;
    ev.step[0] = 2;
    nt_ap dw = nt_tile_slice(ps, 0, 64, 0, P), ow = nt_tile_slice(o, 0, 64, 0, P);
    assert_int_equal(nt_isa_nc_transpose(k, &dw, &ev), 0);
    assert_int_equal(nt_isa_tensor_copy(k, &ow, &dw, NT_ENGINE_DEFAULT), 0);
    store(k, w, &ow);
    end_ok(k);
    for (int p = 0; p < P; p++)
        for (int f = 0; f < F; f++) {
            assert_true(bits(y[f * P + p]) == bits(x[p * F + f]));
            assert_true(bits(z[f * P + p]) == bits(nt__bf16_to_f32(hb[p * F + f])));
            assert_int_equal(yb[f * P + p], hb[p * F + f]);
            if (f < 64)
                assert_true(bits(w[f * P + p]) == bits(x[p * F + 2 * f]));
        }
}

/* ------------------------------------------------------------------------ */
/* Vector / Scalar / GpSimd                                                 */
/* ------------------------------------------------------------------------ */

static float ref_alu(nt_alu_op op, float a, float b)
{
    switch (op) {
    case NT_ALU_ADD: return a + b;
    case NT_ALU_SUB: return a - b;
    case NT_ALU_MUL: return a * b;
    case NT_ALU_DIV: return a / b;
    case NT_ALU_MAX: return (a != a || b != b) ? a + b : (b > a ? b : a);
    case NT_ALU_MIN: return (a != a || b != b) ? a + b : (b < a ? b : a);
    case NT_ALU_POW: return nt__powf(a, b);
    case NT_ALU_EQ: return a == b;
    case NT_ALU_NE: return a != b;
    case NT_ALU_LT: return a < b;
    case NT_ALU_LE: return a <= b;
    case NT_ALU_GT: return a > b;
    case NT_ALU_GE: return a >= b;
    default: return a;
    }
}

static void test_tensor_tensor(void **state)
{
    (void)state;
    enum { P = 64, N = 200 };
    float a[P * N], b[P * N], c[P * N];
    nt_test_fill(a, P * N, &rng_state);
    nt_test_fill(b, P * N, &rng_state);
    a[5] = NAN;
    b[7] = NAN;
    a[9] = b[9]; /* ties and equality */
    for (int op = NT_ALU_ADD; op < NT_ALU_COUNT; op++) {
        nt_sim_kernel *k = begin("tt");
        nt_tile *ta = load(k, "a", a, P, N), *tb = load(k, "b", b, P, N);
        nt_tile *tc = nt_tile_alloc(k, "c", NT_MEM_SBUF, NT_F32, P, N);
        nt_tile *th = nt_tile_alloc(k, "h", NT_MEM_SBUF, NT_BF16, P, N);
        nt_ap A = nt_tile_ap(ta), B = nt_tile_ap(tb), C = nt_tile_ap(tc), H = nt_tile_ap(th);
        assert_int_equal(nt_isa_tensor_tensor(k, &C, &A, &B, (nt_alu_op)op, NT_ENGINE_DEFAULT), 0);
        store(k, c, &C);
        /* bf16 destination: the f32 result rounded once */
        assert_int_equal(nt_isa_tensor_tensor(k, &H, &A, &B, (nt_alu_op)op, NT_ENGINE_GPSIMD), 0);
        uint16_t h[P * N];
        nt_ap hh = nt_hbm_ap(h, NT_BF16, 0, P, N, N);
        assert_int_equal(nt_isa_dma_copy(k, &hh, &H, NT_DMA_QUEUE_AUTO), 0);
        end_ok(k);
        for (int i = 0; i < P * N; i++) {
            float r = ref_alu((nt_alu_op)op, a[i], b[i]);
            if (r != r)
                assert_true(c[i] != c[i]);
            else
                assert_true(bits(c[i]) == bits(r));
            assert_int_equal(h[i], nt__f32_to_bf16(c[i]));
        }
    }
}

static void test_tensor_tensor_int(void **state)
{
    (void)state;
    enum { P = 8, N = 16 };
    int32_t a[P * N], b[P * N], c[P * N];
    for (int i = 0; i < P * N; i++) {
        a[i] = (int32_t)nt_test_rand32(&rng_state);
        b[i] = (int32_t)nt_test_rand32(&rng_state);
    }
    a[0] = INT32_MAX;
    b[0] = 1;
    nt_sim_kernel *k = begin("tt_int");
    nt_tile *ta = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_I32, P, N);
    nt_tile *tb = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_I32, P, N);
    nt_ap A = nt_tile_ap(ta), B = nt_tile_ap(tb);
    nt_ap ha = nt_hbm_ap(a, NT_I32, 0, P, N, N), hb = nt_hbm_ap(b, NT_I32, 0, P, N, N),
          hc = nt_hbm_ap(c, NT_I32, 0, P, N, N);
    assert_int_equal(nt_isa_dma_copy(k, &A, &ha, 0), 0);
    assert_int_equal(nt_isa_dma_copy(k, &B, &hb, 1), 0);
    assert_int_equal(nt_isa_tensor_tensor(k, &A, &A, &B, NT_ALU_ADD, NT_ENGINE_VECTOR), 0);
    assert_int_equal(nt_isa_dma_copy(k, &hc, &A, 2), 0);
    end_ok(k);
    for (int i = 0; i < P * N; i++)
        assert_int_equal(c[i], (int32_t)((uint32_t)a[i] + (uint32_t)b[i]));
}

static void test_tensor_scalar(void **state)
{
    (void)state;
    enum { P = 32, N = 100 };
    float x[P * N], v[P], y[P * N], z[P * N];
    nt_test_fill(x, P * N, &rng_state);
    nt_test_fill(v, P, &rng_state);
    nt_sim_kernel *k = begin("ts");
    nt_tile *tx = load(k, "x", x, P, N), *tv = load(k, "v", v, P, 1);
    nt_tile *ty = nt_tile_alloc(k, "y", NT_MEM_SBUF, NT_F32, P, N);
    nt_ap X = nt_tile_ap(tx), V = nt_tile_ap(tv), Y = nt_tile_ap(ty);
    /* (x - v[p]) * 3, on ScalarE */
    nt_isa_alu o0 = {NT_ALU_SUB, {&V, 0}, false}, o1 = {NT_ALU_MUL, {NULL, 3.0f}, false};
    assert_int_equal(nt_isa_tensor_scalar(k, &Y, &X, &o0, &o1, NT_ENGINE_SCALAR), 0);
    store(k, y, &Y);
    /* reversed: 2 / x, one op */
    nt_isa_alu r0 = {NT_ALU_DIV, {NULL, 2.0f}, true};
    assert_int_equal(nt_isa_tensor_scalar(k, &Y, &X, &r0, NULL, NT_ENGINE_DEFAULT), 0);
    store(k, z, &Y);
    end_ok(k);
    for (int p = 0; p < P; p++)
        for (int i = 0; i < N; i++) {
            float e = (x[p * N + i] - v[p]) * 3.0f;
            assert_true(bits(y[p * N + i]) == bits(e));
            assert_true(bits(z[p * N + i]) == bits(2.0f / x[p * N + i]));
        }
}

/* Every pair of ALU ops in one tensor_scalar, both operand orders, written
 * to a new tile and in place, against the two steps computed one at a time
 * (the simulator runs the common add/sub/mul pairs in one pass; the bits
 * must be those of two).  Inputs include NaN, infinities and zeros so
 * generated NaNs (inf - inf, 0 * inf) are canonical. */
static void test_tensor_scalar_pairs(void **state)
{
    (void)state;
    enum { P = 4, N = 40 };
    float x[P * N], y[P * N], w[P * N];
    nt_test_fill(x, P * N, &rng_state);
    x[1] = INFINITY;
    x[2] = -INFINITY;
    x[3] = 0.0f;
    x[4] = -0.0f;
    x[5] = nt__bits_f32(0xffc00001u); /* a NaN with payload and sign */
    const float sc[][2] = {{1.5f, 0.25f}, {INFINITY, 0.0f}, {0.0f, -INFINITY}, {-2.0f, 3.0f}};
    const nt_alu_op ops[] = {NT_ALU_ADD, NT_ALU_SUB, NT_ALU_MUL, NT_ALU_DIV, NT_ALU_MAX};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++)
            for (int rv = 0; rv < 4; rv++)
                for (int c = 0; c < 4; c++) {
                    nt_sim_kernel *k = begin("ts2");
                    nt_tile *tx = load(k, "x", x, P, N);
                    nt_tile *ty = nt_tile_alloc(k, "y", NT_MEM_SBUF, NT_F32, P, N);
                    nt_ap X = nt_tile_ap(tx), Y = nt_tile_ap(ty);
                    nt_isa_alu o0 = {ops[a], {NULL, sc[c][0]}, rv & 1};
                    nt_isa_alu o1 = {ops[b], {NULL, sc[c][1]}, (rv >> 1) & 1};
                    assert_int_equal(nt_isa_tensor_scalar(k, &Y, &X, &o0, &o1, NT_ENGINE_VECTOR),
                                     0);
                    store(k, y, &Y);
                    assert_int_equal(nt_isa_tensor_scalar(k, &X, &X, &o0, &o1, NT_ENGINE_VECTOR),
                                     0);
                    store(k, w, &X);
                    end_ok(k);
                    for (int i = 0; i < P * N; i++) {
                        float t = (rv & 1) ? ref_alu(ops[a], sc[c][0], x[i])
                                           : ref_alu(ops[a], x[i], sc[c][0]);
                        float e = (rv & 2) ? ref_alu(ops[b], sc[c][1], t)
                                           : ref_alu(ops[b], t, sc[c][1]);
                        e = nt__canon(e);
                        if (bits(y[i]) != bits(e) || bits(w[i]) != bits(e))
                            fail_msg("ops %d,%d rev %d scalars %d elem %d: %08x %08x want %08x", a,
                                     b, rv, c, i, bits(y[i]), bits(w[i]), bits(e));
                    }
                }
}

/* scalar_tensor_tensor against its two steps, one at a time: every pair of
 * ALU ops, both orders of the second step, an immediate and a per-partition
 * scalar, an f32 and a bf16 destination, in place over b too; specials
 * included (a generated NaN is canonical).  Then the all-int path, the cost
 * (tensor_tensor's) and the rules. */
static void test_scalar_tensor_tensor(void **state)
{
    (void)state;
    enum { P = 8, N = 40 };
    float x[P * N], b[P * N], v[P], y[P * N], w[P * N];
    uint16_t h[P * N];
    nt_test_fill(x, P * N, &rng_state);
    nt_test_fill(b, P * N, &rng_state);
    nt_test_fill(v, P, &rng_state);
    x[1] = INFINITY, x[2] = -INFINITY, x[3] = 0.0f, x[4] = -0.0f;
    b[5] = nt__bits_f32(0xffc00001u); /* a NaN with payload and sign */
    b[6] = INFINITY;
    const nt_alu_op ops[] = {NT_ALU_ADD, NT_ALU_SUB, NT_ALU_MUL, NT_ALU_DIV, NT_ALU_MAX};
    for (int a = 0; a < 5; a++)
        for (int c = 0; c < 5; c++)
            for (int rv = 0; rv < 8; rv++) {
                bool rev0 = rv & 1, rev1 = rv & 2, per_part = rv & 4;
                nt_sim_kernel *k = begin("stt");
                nt_tile *tx = load(k, "x", x, P, N), *tb = load(k, "b", b, P, N);
                nt_tile *tv = load(k, "v", v, P, 1);
                nt_tile *ty = nt_tile_alloc(k, "y", NT_MEM_SBUF, NT_F32, P, N);
                nt_tile *th = nt_tile_alloc(k, "h", NT_MEM_SBUF, NT_BF16, P, N);
                nt_ap X = nt_tile_ap(tx), B = nt_tile_ap(tb), V = nt_tile_ap(tv);
                nt_ap Y = nt_tile_ap(ty), H = nt_tile_ap(th);
                nt_isa_alu o0 = {ops[a], {per_part ? &V : NULL, 1.5f}, rev0};
                assert_int_equal(nt_isa_scalar_tensor_tensor(k, &Y, &X, &o0, ops[c], &B, rev1,
                                                             NT_ENGINE_DEFAULT),
                                 0);
                store(k, y, &Y);
                assert_int_equal(nt_isa_scalar_tensor_tensor(k, &H, &X, &o0, ops[c], &B, rev1,
                                                             NT_ENGINE_GPSIMD),
                                 0);
                nt_ap hh = nt_hbm_ap(h, NT_BF16, 0, P, N, N);
                assert_int_equal(nt_isa_dma_copy(k, &hh, &H, NT_DMA_QUEUE_AUTO), 0);
                /* in place over b */
                assert_int_equal(nt_isa_scalar_tensor_tensor(k, &B, &X, &o0, ops[c], &B, rev1,
                                                             NT_ENGINE_VECTOR),
                                 0);
                store(k, w, &B);
                end_ok(k);
                for (int p = 0; p < P; p++)
                    for (int i = 0; i < N; i++) {
                        int j = p * N + i;
                        float sc = per_part ? v[p] : 1.5f;
                        float t = rev0 ? ref_alu(ops[a], sc, x[j]) : ref_alu(ops[a], x[j], sc);
                        float e = nt__canon(rev1 ? ref_alu(ops[c], b[j], t) : ref_alu(ops[c], t, b[j]));
                        if (bits(y[j]) != bits(e) || bits(w[j]) != bits(e) ||
                            h[j] != nt__f32_to_bf16(e))
                            fail_msg("ops %d,%d rev %d elem %d: %08x %08x %04x want %08x", a, c, rv,
                                     j, bits(y[j]), bits(w[j]), h[j], bits(e));
                    }
            }
    /* all ints: exact int32, wrapping */
    {
        int32_t xi[P * N], bi[P * N], ci[P * N];
        for (int i = 0; i < P * N; i++) {
            xi[i] = (int32_t)nt_test_rand32(&rng_state);
            bi[i] = (int32_t)nt_test_rand32(&rng_state);
        }
        nt_sim_kernel *k = begin("stt_int");
        nt_tile *ta = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_I32, P, N);
        nt_tile *tb = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_I32, P, N);
        nt_ap A = nt_tile_ap(ta), B = nt_tile_ap(tb);
        nt_ap ha = nt_hbm_ap(xi, NT_I32, 0, P, N, N), hb = nt_hbm_ap(bi, NT_I32, 0, P, N, N),
              hc = nt_hbm_ap(ci, NT_I32, 0, P, N, N);
        assert_int_equal(nt_isa_dma_copy(k, &A, &ha, 0), 0);
        assert_int_equal(nt_isa_dma_copy(k, &B, &hb, 1), 0);
        nt_isa_alu m3 = {NT_ALU_MUL, {NULL, 3.0f}, false};
        assert_int_equal(nt_isa_scalar_tensor_tensor(k, &A, &A, &m3, NT_ALU_SUB, &B, true,
                                                     NT_ENGINE_VECTOR),
                         0);
        assert_int_equal(nt_isa_dma_copy(k, &hc, &A, 2), 0);
        end_ok(k);
        for (int i = 0; i < P * N; i++)
            assert_int_equal(ci[i], (int32_t)((uint32_t)bi[i] - (uint32_t)xi[i] * 3u));
    }
    /* cost: exactly a tensor_tensor's (2 cycles an element in f32), where the
     * two steps as instructions cost a tensor_scalar more */
    {
        double dur[3];
        for (int q = 0; q < 3; q++) {
            nt_sim_kernel *k = begin("stt_cost");
            nt_tile *ta = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 4096);
            nt_tile *tb = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_F32, 128, 4096);
            nt_ap A = nt_tile_ap(ta), B = nt_tile_ap(tb);
            nt_isa_alu m2 = {NT_ALU_MUL, {NULL, 2.0f}, false};
            assert_int_equal(nt_isa_memset(k, &A, 1.0, NT_ENGINE_VECTOR), 0);
            assert_int_equal(nt_isa_memset(k, &B, 1.0, NT_ENGINE_VECTOR), 0);
            if (q == 0)
                assert_int_equal(nt_isa_tensor_tensor(k, &A, &A, &B, NT_ALU_ADD, NT_ENGINE_VECTOR),
                                 0);
            else if (q == 1)
                assert_int_equal(nt_isa_scalar_tensor_tensor(k, &A, &A, &m2, NT_ALU_ADD, &B, false,
                                                             NT_ENGINE_VECTOR),
                                 0);
            else {
                assert_int_equal(nt_isa_tensor_scalar(k, &A, &A, &m2, NULL, NT_ENGINE_VECTOR), 0);
                assert_int_equal(nt_isa_tensor_tensor(k, &A, &A, &B, NT_ALU_ADD, NT_ENGINE_VECTOR),
                                 0);
            }
            nt_sim_report r;
            assert_int_equal(nt_sim_kernel_end(k, &r), 0);
            dur[q] = r.duration_ns;
        }
        assert_true(dur[1] == dur[0]);
        assert_true(dur[2] > dur[1]);
    }
}

static void test_activation(void **state)
{
    (void)state;
    enum { P = 16, N = 300 };
    float x[P * N], bias[P], y[P * N], r[P];
    nt_test_fill(x, P * N, &rng_state);
    nt_test_fill(bias, P, &rng_state);
    nt_sim_kernel *k = begin("act");
    nt_tile *tx = load(k, "x", x, P, N), *tb = load(k, "bias", bias, P, 1);
    nt_tile *ty = nt_tile_alloc(k, "y", NT_MEM_SBUF, NT_F32, P, N);
    nt_tile *tr = nt_tile_alloc(k, "r", NT_MEM_PSUM, NT_F32, P, 1);
    nt_ap X = nt_tile_ap(tx), B = nt_tile_ap(tb), Y = nt_tile_ap(ty), R = nt_tile_ap(tr);
    nt_isa_scalar sc = {NULL, 0.5f}, bi = {&B, 0};
    assert_int_equal(nt_isa_activation(k, &Y, NT_ACT_EXP, &X, &sc, &bi, &R), 0);
    store(k, y, &Y);
    nt_tile *rs = nt_tile_alloc(k, "rs", NT_MEM_SBUF, NT_F32, P, 1);
    nt_ap RS = nt_tile_ap(rs);
    assert_int_equal(nt_isa_tensor_copy(k, &RS, &R, NT_ENGINE_VECTOR), 0);
    store(k, r, &RS);
    end_ok(k);
    for (int p = 0; p < P; p++) {
        float row[N];
        for (int i = 0; i < N; i++) {
            row[i] = nt__expf(x[p * N + i] * 0.5f + bias[p]);
            assert_true(bits(y[p * N + i]) == bits(row[i]));
        }
        assert_true(bits(r[p]) == bits(nt__red_block_sum_f32(row, N, 1)));
    }
}

static float gelu_dx(float x) { return nt__ew_gelu_bwd(1.0f, x); }
static float silu_dx(float x) { return nt__ew_silu_bwd(1.0f, x); }

static void test_activation_funcs(void **state)
{
    (void)state;
    enum { P = 4, N = 64 };
    float x[P * N], y[P * N];
    nt_test_fill(x, P * N, &rng_state);
    x[0] = -0.0f;
    x[1] = 3.0f;
    static float (*const ref[])(float) = {
        [NT_ACT_EXP] = nt__ew_exp,       [NT_ACT_LOG] = nt__ew_log,   [NT_ACT_SQRT] = nt__ew_sqrt,
        [NT_ACT_RSQRT] = nt__ew_rsqrt,   [NT_ACT_TANH] = nt__ew_tanh, [NT_ACT_SIGMOID] = nt__ew_sigmoid,
        [NT_ACT_GELU] = nt__ew_gelu,     [NT_ACT_SILU] = nt__ew_silu, [NT_ACT_RELU] = nt__ew_relu,
        [NT_ACT_ABS] = nt__ew_abs,       [NT_ACT_GELU_DX] = gelu_dx,  [NT_ACT_SILU_DX] = silu_dx,
        [NT_ACT_SOFTPLUS] = nt__ew_softplus, [NT_ACT_MISH] = nt__ew_mish,
        [NT_ACT_RECIPROCAL] = nt__ew_reciprocal, [NT_ACT_GELU_APPRX_TANH] = nt__ew_gelu_tanh,
        [NT_ACT_ERF] = nt__ew_erf, [NT_ACT_ERF_DX] = nt__ew_erf_dx, [NT_ACT_SIGN] = nt__ew_sign,
    };
    for (int f = 0; f < NT_ACT_COUNT; f++) {
        if (f == NT_ACT_NEG) /* no NKI function: test_isa_nki */
            continue;
        nt_sim_kernel *k = begin("act_funcs");
        nt_tile *tx = load(k, "x", x, P, N);
        nt_tile *ty = nt_tile_alloc(k, "y", NT_MEM_SBUF, NT_F32, P, N);
        nt_ap X = nt_tile_ap(tx), Y = nt_tile_ap(ty);
        assert_int_equal(nt_isa_activation(k, &Y, (nt_act_func)f, &X, NULL, NULL, NULL), 0);
        store(k, y, &Y);
        end_ok(k);
        for (int i = 0; i < P * N; i++) {
            float e = f == NT_ACT_IDENTITY ? x[i]
                      : f == NT_ACT_SQUARE ? x[i] * x[i]
                                           : ref[f](x[i]);
            if (e != e)
                assert_true(y[i] != y[i]);
            else
                assert_true(bits(y[i]) == bits(e));
        }
        /* without scale and bias, identity keeps -0 */
        if (f == NT_ACT_IDENTITY)
            assert_true(bits(y[0]) == 0x80000000u);
    }
}

/* One instruction with ALU code `op` (or activation function `f`) in a
 * timing-only kernel of its own: accepted or refused. */
enum { ISA_TT, ISA_TS, ISA_STT, ISA_SCAN, ISA_RED, ISA_ASEL, ISA_ACT, ISA_NKINDS };

static bool isa_accepts(int kind, int code)
{
    nt_sim_kernel *k = begin("isa_nki");
    nt_tile *t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 4, 8);
    nt_tile *r = nt_tile_alloc(k, "r", NT_MEM_SBUF, NT_F32, 4, 1);
    nt_ap T = nt_tile_ap(t), R = nt_tile_ap(r);
    nt_alu_op op = (nt_alu_op)code;
    nt_isa_alu a = {op, {NULL, 2.0f}, false};
    nt_isa_affine aff = {0, 1, {-1}};
    int rc = 0;
    switch (kind) {
    case ISA_TT: rc = nt_isa_tensor_tensor(k, &T, &T, &T, op, NT_ENGINE_DEFAULT); break;
    case ISA_TS: rc = nt_isa_tensor_scalar(k, &T, &T, &a, NULL, NT_ENGINE_DEFAULT); break;
    case ISA_STT: rc = nt_isa_scalar_tensor_tensor(k, &T, &T, &a, op, &T, false, NT_ENGINE_DEFAULT); break;
    case ISA_SCAN: rc = nt_isa_tensor_tensor_scan(k, &T, &T, &T, &(nt_isa_scalar){NULL, 0}, op, op); break;
    case ISA_RED: rc = nt_isa_tensor_reduce(k, &R, &T, op, 0); break;
    case ISA_ASEL: rc = nt_isa_affine_select(k, &T, &T, &aff, op, 0.0f); break;
    case ISA_ACT: rc = nt_isa_activation(k, &T, (nt_act_func)code, &T, NULL, NULL, NULL); break;
    }
    nt_sim_report rep;
    int rc2 = nt_sim_kernel_end(k, &rep);
    assert_int_equal(rc2, rc);
    if (rc)
        assert_int_equal(rc, NT_ESIM);
    return rc == 0;
}

/* Every instruction kind, ALU operator and activation function the
 * simulator accepts, against the NKI name it models: an accepted code
 * without an NKI name (a hidden code, like the op-table codes past the
 * public enums this replaced: 0x1000 + op ...) fails the test, and so does
 * an NKI-named code the simulator refuses.  The codes tried cover the
 * public ranges and far past them. */
static void test_isa_nki(void **state)
{
    (void)state;
    bool functional = nt_sim_get_functional();
    nt_sim_set_functional(false); /* acceptance is decided at issue */
    const char *name, *nki;
    int nk = nt_sim_isa_kind(0, NULL, NULL);
    assert_true(nk >= 17);
    for (int i = 0; i < nk; i++) {
        name = nki = NULL;
        nt_sim_isa_kind(i, &name, &nki);
        assert_non_null(name);
        if (!nki || !nki[0])
            fail_msg("instruction %s has no NKI instruction", name);
        print_message("# instruction %-22s %s\n", name, nki);
        for (int j = 0; j < i; j++) {
            const char *other;
            nt_sim_isa_kind(j, &other, NULL);
            assert_string_not_equal(name, other);
        }
    }
    static const char *const kinds[ISA_NKINDS] = {"tensor_tensor", "tensor_scalar",
                                                  "scalar_tensor_tensor", "tensor_tensor_scan",
                                                  "tensor_reduce", "affine_select", "activation"};
    int accepted[ISA_NKINDS] = {0};
    for (int kind = 0; kind < ISA_NKINDS; kind++)
        for (int code = -4; code < 0x4400; code++) {
            /* the public range densely, beyond it in steps (hidden codes
             * sat at 0x1000, 0x2000 and 0x3000 + op) */
            if (code > 64 && code % 7 != 0 && (code & 0xfff) > 64)
                continue;
            bool ok = isa_accepts(kind, code);
            const char *n = kind == ISA_ACT ? nt_act_func_nki((nt_act_func)code)
                                            : nt_alu_op_nki((nt_alu_op)code);
            if (ok && !n)
                fail_msg("%s accepts code %d, which has no NKI name", kinds[kind], code);
            if (ok) {
                accepted[kind]++;
                if (kind == ISA_ACT || kind == ISA_TT)
                    print_message("# %-10s %-16s %s\n", kind == ISA_ACT ? "activation" : "ALU",
                                  kind == ISA_ACT ? nt_act_func_name((nt_act_func)code)
                                                  : nt_alu_op_name((nt_alu_op)code), n);
            }
            /* every NKI operator runs in tensor_tensor, tensor_scalar and
             * scalar_tensor_tensor, every NKI function in activation */
            if (!ok && n && kind != ISA_SCAN && kind != ISA_RED && kind != ISA_ASEL)
                fail_msg("%s refuses %s (%s)", kinds[kind],
                         kind == ISA_ACT ? nt_act_func_name((nt_act_func)code)
                                         : nt_alu_op_name((nt_alu_op)code), n);
        }
    assert_int_equal(accepted[ISA_TT], NT_ALU_COUNT);
    assert_int_equal(accepted[ISA_ACT], NT_ACT_COUNT - 1); /* all but NEG */
    assert_int_equal(accepted[ISA_RED], 3);                /* add, maximum, minimum */
    assert_int_equal(accepted[ISA_ASEL], 4);               /* greater(_equal), (not_)equal */
    assert_int_equal(accepted[ISA_SCAN], NT_ALU_COUNT - 1); /* power: GpSimd only */
    assert_null(nt_act_func_nki(NT_ACT_NEG));
    /* power on VectorE is a broken rule naming GpSimd; -x names its form */
    nt_sim_set_functional(functional);
    nt_sim_kernel *k = begin("isa_rules");
    nt_tile *t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 4, 8);
    nt_ap T = nt_tile_ap(t);
    assert_int_equal(nt_isa_tensor_tensor(k, &T, &T, &T, NT_ALU_POW, NT_ENGINE_VECTOR), NT_ESIM);
    assert_non_null(strstr(nt_sim_kernel_message(k), "power runs on GpSimd only"));
    nt_sim_report rep;
    assert_int_equal(nt_sim_kernel_end(k, &rep), NT_ESIM);
    k = begin("isa_neg");
    t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 4, 8);
    T = nt_tile_ap(t);
    assert_int_equal(nt_isa_activation(k, &T, NT_ACT_NEG, &T, NULL, NULL, NULL), NT_ESIM);
    assert_non_null(strstr(nt_sim_kernel_message(k), "not an activation function of the NKI ISA"));
    assert_int_equal(nt_sim_kernel_end(k, &rep), NT_ESIM);
}

static void test_tensor_reduce(void **state)
{
    (void)state;
    enum { P = 8, N = 5000 };
    float *x = malloc(P * N * 4), s[P], m[P], mn[P], part[P * 4];
    nt_test_fill(x, P * N, &rng_state);
    nt_sim_kernel *k = begin("reduce");
    nt_tile *tx = load(k, "x", x, P, N);
    nt_tile *ts = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, P, 1);
    nt_tile *tm = nt_tile_alloc(k, "m", NT_MEM_SBUF, NT_F32, P, 1);
    nt_tile *tn = nt_tile_alloc(k, "mn", NT_MEM_SBUF, NT_F32, P, 1);
    nt_tile *tp = nt_tile_alloc(k, "part", NT_MEM_SBUF, NT_F32, P, 4);
    nt_ap X = nt_tile_ap(tx), S = nt_tile_ap(ts), M = nt_tile_ap(tm), PT = nt_tile_ap(tp);
    nt_ap MN = nt_tile_ap(tn);
    assert_int_equal(nt_isa_tensor_reduce(k, &S, &X, NT_ALU_ADD, 0), 0);
    assert_int_equal(nt_isa_tensor_reduce(k, &M, &X, NT_ALU_MAX, 0), 0);
    assert_int_equal(nt_isa_tensor_reduce(k, &MN, &X, NT_ALU_MIN, 0), 0);
    /* [P, 4, 1000] with the innermost dim reduced: 4 partials of 1000 */
    nt_ap X3 = nt_tile_slice(tx, 0, P, 0, 4000);
    X3.ndim = 2;
    X3.num[0] = 4, X3.step[0] = 1000;
    X3.num[1] = 1000, X3.step[1] = 1;
    assert_int_equal(nt_isa_tensor_reduce(k, &PT, &X3, NT_ALU_ADD, 1), 0);
    store(k, s, &S);
    store(k, m, &M);
    store(k, mn, &MN);
    store(k, part, &PT);
    end_ok(k);
    for (int p = 0; p < P; p++) {
        assert_true(bits(s[p]) == bits(nt__red_sum_f32(x + p * N, N, 1)));
        assert_true(bits(m[p]) == bits(nt__red_max_f32(x + p * N, N, 1)));
        /* the minimum of a sequence is its plain minimum (nt_test_fill(, &rng_state) makes no
         * NaN and no signed-zero ties) */
        float lo = INFINITY;
        for (int j = 0; j < N; j++)
            lo = x[p * N + j] < lo ? x[p * N + j] : lo;
        assert_true(bits(mn[p]) == bits(lo));
        assert_true(bits(mn[p]) == bits(nt__red_min_f32(x + p * N, N, 1)));
        for (int j = 0; j < 4; j++)
            assert_true(bits(part[p * 4 + j]) ==
                        bits(nt__red_block_sum_f32(x + p * N + j * 1000, 1000, 1)));
    }
    free(x);
}

static void test_tensor_copy_cast(void **state)
{
    (void)state;
    enum { N = 64 };
    float x[N];
    nt_test_fill(x, N, &rng_state);
    for (int i = 0; i < N; i++)
        x[i] *= 70000.0f; /* some overflow f16 */
    x[0] = NAN;
    x[1] = -3.7f;
    uint16_t hb[N], hh[N];
    int32_t hi[N];
    uint8_t hu[N];
    int32_t big[N];
    uint16_t bigb[N];
    for (int i = 0; i < N; i++)
        big[i] = (int32_t)nt_test_rand32(&rng_state);
    nt_sim_kernel *k = begin("cast");
    nt_tile *tx = load(k, "x", x, 1, N);
    nt_tile *tb = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_BF16, 1, N);
    nt_tile *th = nt_tile_alloc(k, "h", NT_MEM_SBUF, NT_F16, 1, N);
    nt_tile *ti = nt_tile_alloc(k, "i", NT_MEM_SBUF, NT_I32, 1, N);
    nt_tile *tu = nt_tile_alloc(k, "u", NT_MEM_SBUF, NT_U8, 1, N);
    nt_tile *tg = nt_tile_alloc(k, "g", NT_MEM_SBUF, NT_I32, 1, N);
    nt_tile *tgb = nt_tile_alloc(k, "gb", NT_MEM_SBUF, NT_BF16, 1, N);
    nt_ap X = nt_tile_ap(tx), B = nt_tile_ap(tb), H = nt_tile_ap(th), I = nt_tile_ap(ti),
          U = nt_tile_ap(tu), G = nt_tile_ap(tg), GB = nt_tile_ap(tgb);
    assert_int_equal(nt_isa_tensor_copy(k, &B, &X, NT_ENGINE_VECTOR), 0);
    assert_int_equal(nt_isa_tensor_copy(k, &H, &X, NT_ENGINE_SCALAR), 0);
    assert_int_equal(nt_isa_tensor_copy(k, &I, &X, NT_ENGINE_GPSIMD), 0);
    assert_int_equal(nt_isa_tensor_copy(k, &U, &I, NT_ENGINE_VECTOR), 0);
    nt_ap hg = nt_hbm_ap(big, NT_I32, 0, 1, N, N);
    assert_int_equal(nt_isa_dma_copy(k, &G, &hg, 0), 0);
    assert_int_equal(nt_isa_tensor_copy(k, &GB, &G, NT_ENGINE_VECTOR), 0);
    nt_ap o1 = nt_hbm_ap(hb, NT_BF16, 0, 1, N, N), o2 = nt_hbm_ap(hh, NT_F16, 0, 1, N, N),
          o3 = nt_hbm_ap(hi, NT_I32, 0, 1, N, N), o4 = nt_hbm_ap(hu, NT_U8, 0, 1, N, N),
          o5 = nt_hbm_ap(bigb, NT_BF16, 0, 1, N, N);
    assert_int_equal(nt_isa_dma_copy(k, &o1, &B, 0), 0);
    assert_int_equal(nt_isa_dma_copy(k, &o2, &H, 1), 0);
    assert_int_equal(nt_isa_dma_copy(k, &o3, &I, 2), 0);
    assert_int_equal(nt_isa_dma_copy(k, &o4, &U, 3), 0);
    assert_int_equal(nt_isa_dma_copy(k, &o5, &GB, 4), 0);
    end_ok(k);
    for (int i = 0; i < N; i++) {
        assert_int_equal(hb[i], nt__f32_to_bf16(x[i]));
        assert_int_equal(hh[i], nt__f32_to_f16(x[i]));
        assert_int_equal(hi[i], nt__f64_to_i32((double)x[i]));
        assert_int_equal(hu[i], (uint8_t)(uint32_t)hi[i]);
        /* one rounding from the exact integer, not via f32 */
        assert_int_equal(bigb[i], nt__f64_to_bf16((double)big[i]));
    }
    assert_int_equal(hi[0], 0);
    assert_int_equal(hi[1], -3);
}

static void test_memset_iota_select(void **state)
{
    (void)state;
    enum { P = 8, N = 8 };
    uint16_t m[P * N];
    int32_t io[P * 2 * 4];
    float sel[P * N], ones[P * N];
    for (int i = 0; i < P * N; i++)
        ones[i] = 1.5f;
    nt_sim_kernel *k = begin("gpsimd");
    nt_tile *tm = nt_tile_alloc(k, "m", NT_MEM_SBUF, NT_BF16, P, N);
    nt_ap M = nt_tile_ap(tm);
    assert_int_equal(nt_isa_memset(k, &M, 3.14159, NT_ENGINE_GPSIMD), 0);
    /* iota over [P, 2, 4]: 100 + 10p + 4i - j */
    nt_tile *ti = nt_tile_alloc(k, "io", NT_MEM_SBUF, NT_I32, P, 8);
    nt_ap IO = nt_tile_ap(ti);
    IO.ndim = 2;
    IO.num[0] = 2, IO.step[0] = 4;
    IO.num[1] = 4, IO.step[1] = 1;
    nt_isa_affine ex = {100, 10, {4, -1, 0, 0}};
    assert_int_equal(nt_isa_iota(k, &IO, &ex), 0);
    /* causal mask: keep where p - j >= 0 */
    nt_tile *t1 = load(k, "ones", ones, P, N);
    nt_tile *ts = nt_tile_alloc(k, "sel", NT_MEM_SBUF, NT_F32, P, N);
    nt_ap O = nt_tile_ap(t1), S = nt_tile_ap(ts);
    nt_isa_affine pr = {0, 1, {-1, 0, 0, 0}};
    assert_int_equal(nt_isa_affine_select(k, &S, &O, &pr, NT_ALU_GE, -1e30f), 0);
    nt_ap hm = nt_hbm_ap(m, NT_BF16, 0, P, N, N), hi = nt_hbm_ap(io, NT_I32, 0, P, 8, 8);
    assert_int_equal(nt_isa_dma_copy(k, &hm, &M, 0), 0);
    assert_int_equal(nt_isa_dma_copy(k, &hi, &IO, 1), 0);
    store(k, sel, &S);
    end_ok(k);
    for (int i = 0; i < P * N; i++)
        assert_int_equal(m[i], nt__f32_to_bf16(3.14159f));
    for (int p = 0; p < P; p++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 4; j++)
                assert_int_equal(io[p * 8 + i * 4 + j], 100 + 10 * p + 4 * i - j);
    for (int p = 0; p < P; p++)
        for (int j = 0; j < N; j++)
            assert_true(sel[p * N + j] == (p - j >= 0 ? 1.5f : -1e30f));
}

/* ------------------------------------------------------------------------ */
/* Rule errors                                                              */
/* ------------------------------------------------------------------------ */

/* Runs `body` in a fresh kernel and checks it fails with NT_ESIM and a
 * message naming the instruction, the kernel and the rule. */
#define EXPECT_FAIL(instr, rule, ...)                                                      \
    do {                                                                                    \
        nt_sim_kernel *k = begin("errk");                                                   \
        __VA_ARGS__;                                                                            \
        assert_int_equal(nt_sim_kernel_error(k), NT_ESIM);                                  \
        char msg[400];                                                                      \
        snprintf(msg, sizeof msg, "%s", nt_sim_kernel_message(k));                          \
        if (!strstr(msg, instr) || !strstr(msg, "errk") || !strstr(msg, rule))              \
            fail_msg("message '%s' lacks '%s' / '%s'", msg, instr, rule);                   \
        nt_sim_report r;                                                                    \
        assert_int_equal(nt_sim_kernel_end(k, &r), NT_ESIM);                                \
        assert_string_equal(r.message, msg);                                                \
    } while (0)

static void test_errors(void **state)
{
    (void)state;
    static float host[128 * 1024];
    EXPECT_FAIL("nt_tile_alloc", "partitions <= 128",
                nt_tile_alloc(k, "big", NT_MEM_SBUF, NT_F32, 129, 4));
    EXPECT_FAIL("nt_tile_alloc", "SBUF capacity", {
        assert_non_null(nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 47 * 1024));
        assert_null(nt_tile_alloc(k, "overflow_tile", NT_MEM_SBUF, NT_F32, 128, 2048));
        assert_non_null(strstr(nt_sim_kernel_message(k), "overflow_tile"));
    });
    EXPECT_FAIL("nt_tile_alloc", "PSUM capacity", {
        for (int i = 0; i < 8; i++)
            assert_non_null(nt_tile_alloc(k, "bank", NT_MEM_PSUM, NT_F32, 128, 512));
        assert_null(nt_tile_alloc(k, "ninth", NT_MEM_PSUM, NT_F32, 128, 1));
    });
    EXPECT_FAIL("nt_tile_alloc", "one 2048 B bank",
                nt_tile_alloc(k, "wide", NT_MEM_PSUM, NT_F32, 128, 600));
    EXPECT_FAIL("nc_matmul", "moving free size <= 512", {
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_BF16, 128, 128);
        nt_tile *m = nt_tile_alloc(k, "m", NT_MEM_SBUF, NT_BF16, 128, 600);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 128, 512);
        nt_ap S = nt_tile_ap(s), Mv = nt_tile_ap(m), D = nt_tile_ap(p);
        assert_int_equal(nt_isa_nc_matmul(k, &D, &S, &Mv, false), NT_ESIM);
    });
    EXPECT_FAIL("nc_matmul", "stationary free size <= 128", {
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_BF16, 128, 200);
        nt_tile *m = nt_tile_alloc(k, "m", NT_MEM_SBUF, NT_BF16, 128, 64);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 128, 64);
        nt_ap S = nt_tile_ap(s), Mv = nt_tile_ap(m), D = nt_tile_ap(p);
        nt_isa_nc_matmul(k, &D, &S, &Mv, false);
    });
    EXPECT_FAIL("nc_matmul", "dst may be in: PSUM", {
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, 64, 64);
        nt_ap S = nt_tile_ap(s);
        nt_isa_nc_matmul(k, &S, &S, &S, false);
    });
    EXPECT_FAIL("nc_matmul", "both f32, both bf16", {
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, 64, 64);
        nt_tile *m = nt_tile_alloc(k, "m", NT_MEM_SBUF, NT_BF16, 64, 64);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 64, 64);
        nt_ap S = nt_tile_ap(s), Mv = nt_tile_ap(m), D = nt_tile_ap(p);
        nt_isa_nc_matmul(k, &D, &S, &Mv, false);
    });
    EXPECT_FAIL("nc_matmul", "K contraction", {
        nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, NT_F32, 64, 64);
        nt_tile *m = nt_tile_alloc(k, "m", NT_MEM_SBUF, NT_F32, 32, 64);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 64, 64);
        nt_ap S = nt_tile_ap(s), Mv = nt_tile_ap(m), D = nt_tile_ap(p);
        nt_isa_nc_matmul(k, &D, &S, &Mv, false);
    });
    EXPECT_FAIL("tensor_copy", "starts at partition 0, 32, 64 or 96", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 8);
        nt_ap x = nt_tile_slice(a, 16, 16, 0, 8), y = nt_tile_slice(a, 64, 16, 0, 8);
        nt_isa_tensor_copy(k, &y, &x, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("tensor_copy", "spans at most", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 8);
        nt_ap x = nt_tile_slice(a, 32, 64, 0, 8), y = nt_tile_slice(a, 0, 64, 0, 8);
        nt_isa_tensor_copy(k, &y, &x, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("tensor_copy", "<= 65536 elements", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_U8, 1, 70000);
        nt_ap x = nt_tile_ap(a);
        nt_isa_tensor_copy(k, &x, &x, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("tensor_tensor", "GpSimd cannot access PSUM", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a), P = nt_tile_ap(p);
        nt_isa_tensor_tensor(k, &A, &A, &P, NT_ALU_ADD, NT_ENGINE_GPSIMD);
    });
    EXPECT_FAIL("tensor_tensor", "at most one input in PSUM", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a), P = nt_tile_ap(p);
        nt_isa_tensor_tensor(k, &A, &P, &P, NT_ALU_ADD, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("tensor_tensor", "tensor_tensor runs on", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a);
        nt_isa_tensor_tensor(k, &A, &A, &A, NT_ALU_ADD, NT_ENGINE_SCALAR);
    });
    EXPECT_FAIL("scalar_tensor_tensor", "at most one input in PSUM", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a), P = nt_tile_ap(p);
        nt_isa_alu m = {NT_ALU_MUL, {NULL, 2.0f}, false};
        nt_isa_scalar_tensor_tensor(k, &A, &P, &m, NT_ALU_ADD, &P, false, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("scalar_tensor_tensor", "scalar_tensor_tensor runs on", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a);
        nt_isa_alu m = {NT_ALU_MUL, {NULL, 2.0f}, false};
        nt_isa_scalar_tensor_tensor(k, &A, &A, &m, NT_ALU_ADD, &A, false, NT_ENGINE_SCALAR);
    });
    EXPECT_FAIL("scalar_tensor_tensor", "op0 is missing", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a);
        nt_isa_scalar_tensor_tensor(k, &A, &A, NULL, NT_ALU_ADD, &A, false, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("scalar_tensor_tensor", "(rule: one of nt_alu_op", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a);
        nt_isa_alu m = {NT_ALU_MUL, {NULL, 2.0f}, false};
        nt_isa_scalar_tensor_tensor(k, &A, &A, &m, (nt_alu_op)NT_ALU_COUNT, &A, false,
                                    NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("scalar_tensor_tensor", "same free size", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a), B = nt_tile_slice(a, 0, 8, 0, 4);
        nt_isa_alu m = {NT_ALU_MUL, {NULL, 2.0f}, false};
        nt_isa_scalar_tensor_tensor(k, &A, &A, &m, NT_ALU_ADD, &B, false, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("tensor_tensor", "same free size", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a), B = nt_tile_slice(a, 0, 8, 0, 4);
        nt_isa_tensor_tensor(k, &A, &A, &B, NT_ALU_ADD, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("dma_copy", "src may be in: HBM SBUF", {
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 8, 8);
        nt_ap P = nt_tile_ap(p), H = hbm32(host, 8, 8, 8);
        nt_isa_dma_copy(k, &H, &P, 0);
    });
    EXPECT_FAIL("dma_copy", "same dtype", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_BF16, 8, 8);
        nt_ap A = nt_tile_ap(a), H = hbm32(host, 8, 8, 8);
        nt_isa_dma_copy(k, &A, &H, 0);
    });
    EXPECT_FAIL("dma_copy", "queues 0..15", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a), H = hbm32(host, 8, 8, 8);
        nt_isa_dma_copy(k, &A, &H, 16);
    });
    EXPECT_FAIL("dma_copy", "access inside the tile", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_slice(a, 0, 8, 4, 8), H = hbm32(host, 8, 8, 8);
        nt_isa_dma_copy(k, &A, &H, 0);
    });
    EXPECT_FAIL("tensor_copy", "released", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a);
        assert_int_equal(nt_tile_release(k, a), 0);
        nt_isa_tensor_copy(k, &A, &A, NT_ENGINE_VECTOR);
    });
    EXPECT_FAIL("tensor_reduce", "add, maximum or minimum", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a), R = nt_tile_slice(a, 0, 8, 0, 1);
        nt_isa_tensor_reduce(k, &R, &A, NT_ALU_MUL, 0);
    });
    EXPECT_FAIL("activation", "reduce_dst is [8, 1]", {
        nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 8, 8);
        nt_ap A = nt_tile_ap(a);
        nt_isa_activation(k, &A, NT_ACT_EXP, &A, NULL, NULL, &A);
    });
    EXPECT_FAIL("iota", "SBUF", {
        nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_I32, 8, 8);
        nt_ap P = nt_tile_ap(p);
        nt_isa_affine ex = {0, 1, {1, 0, 0, 0}};
        nt_isa_iota(k, &P, &ex);
    });
}

static void test_error_stops_kernel(void **state)
{
    (void)state;
    float x[8 * 8], y[8 * 8];
    for (int i = 0; i < 64; i++) {
        x[i] = (float)i;
        y[i] = -1.0f;
    }
    nt_sim_kernel *k = begin("stops");
    nt_tile *a = load(k, "a", x, 8, 8);
    nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 8, 8);
    nt_ap A = nt_tile_ap(a), P = nt_tile_ap(p), H = hbm32(y, 8, 8, 8);
    assert_int_equal(nt_isa_tensor_tensor(k, &A, &P, &P, NT_ALU_ADD, NT_ENGINE_VECTOR), NT_ESIM);
    char first[400];
    snprintf(first, sizeof first, "%s", nt_sim_kernel_message(k));
    /* a valid instruction after the error is not executed */
    assert_int_equal(nt_isa_dma_copy(k, &H, &A, 0), NT_ESIM);
    assert_null(nt_tile_alloc(k, "later", NT_MEM_SBUF, NT_F32, 8, 8));
    assert_string_equal(nt_sim_kernel_message(k), first);
    assert_int_equal(nt_sim_kernel_end(k, NULL), NT_ESIM);
    for (int i = 0; i < 64; i++)
        assert_true(y[i] == -1.0f);
    /* the next kernel is unaffected */
    k = begin("after");
    a = load(k, "a", x, 8, 8);
    A = nt_tile_ap(a);
    assert_int_equal(nt_isa_dma_copy(k, &H, &A, 0), 0);
    end_ok(k);
    assert_memory_equal(x, y, sizeof x);
}

/* ------------------------------------------------------------------------ */
/* Cost model                                                               */
/* ------------------------------------------------------------------------ */

static double one_matmul_ns(nt_dtype dt, int K, int M, int N, double *cycles)
{
    nt_sim_kernel *k = begin("one_matmul");
    nt_tile *s = nt_tile_alloc(k, "s", NT_MEM_SBUF, dt, K, M);
    nt_tile *m = nt_tile_alloc(k, "m", NT_MEM_SBUF, dt, K, N);
    nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, M, N);
    nt_ap S = nt_tile_ap(s), Mv = nt_tile_ap(m), D = nt_tile_ap(p);
    assert_int_equal(nt_isa_nc_matmul(k, &D, &S, &Mv, false), 0);
    nt_sim_instr_info in;
    assert_int_equal(nt_sim_kernel_last(k, &in), 0);
    assert_int_equal(in.engine, NT_ENGINE_TENSOR);
    *cycles = in.cycles;
    nt_sim_report r;
    assert_int_equal(nt_sim_kernel_end(k, &r), 0);
    assert_true(fabs(r.busy_ns[NT_ENGINE_TENSOR] - (in.end_ns - in.start_ns)) < 1e-6);
    assert_true(fabs(r.flops - 2.0 * K * M * N) < 0.5);
    return r.duration_ns;
}

static void test_cost_matmul(void **state)
{
    (void)state;
    double cyc;
    double ns = one_matmul_ns(NT_BF16, 128, 128, 512, &cyc);
    assert_true(cyc == 512.0);
    assert_true(fabs(ns - 512.0 / 2.8) < 1e-6);
    ns = one_matmul_ns(NT_F32, 128, 128, 512, &cyc);
    assert_true(cyc == 2048.0);
    assert_true(fabs(ns - 2048.0 / 2.8) < 1e-6);
    one_matmul_ns(NT_F16, 128, 128, 100, &cyc);
    assert_true(cyc == 100.0); /* max(min(64, 128), 100) */
    one_matmul_ns(NT_BF16, 128, 32, 16, &cyc);
    assert_true(cyc == 64.0); /* max(min(64, 32), 16) = 32, floored at 64 */
    nt_sim_set_target(NT_SIM_TRN2);
    ns = one_matmul_ns(NT_BF16, 128, 128, 512, &cyc);
    assert_true(fabs(ns - 512.0 / 2.4) < 1e-6);
    nt_sim_set_target(NT_SIM_TRN1);
}

static void test_cost_vector_rules(void **state)
{
    (void)state;
    nt_sim_kernel *k = begin("vector_costs");
    nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 1000);
    nt_tile *b = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_BF16, 128, 1000);
    nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 128, 500);
    nt_ap A = nt_tile_ap(a), B = nt_tile_ap(b), P = nt_tile_ap(p);
    nt_ap A5 = nt_tile_slice(a, 0, 128, 0, 500);
    nt_sim_instr_info in;
    nt_isa_tensor_tensor(k, &A, &A, &A, NT_ALU_ADD, NT_ENGINE_VECTOR);
    nt_sim_kernel_last(k, &in);
    assert_true(in.cycles == 2000.0); /* f32 SBUF inputs: 2N */
    nt_isa_tensor_tensor(k, &B, &B, &B, NT_ALU_MUL, NT_ENGINE_VECTOR);
    nt_sim_kernel_last(k, &in);
    assert_true(in.cycles == 1000.0); /* all-bf16 mul: N */
    nt_isa_tensor_tensor(k, &A5, &A5, &P, NT_ALU_ADD, NT_ENGINE_VECTOR);
    nt_sim_kernel_last(k, &in);
    assert_true(in.cycles == 500.0); /* one input in PSUM: N */
    nt_ap R = nt_tile_slice(a, 0, 128, 999, 1);
    nt_isa_tensor_reduce(k, &R, &B, NT_ALU_MAX, 0);
    nt_sim_kernel_last(k, &in);
    assert_true(in.cycles == 500.0); /* bf16 max: N/2 */
    nt_isa_alu o = {NT_ALU_ADD, {NULL, 1}, false};
    nt_ap A8 = nt_tile_slice(a, 0, 128, 0, 8);
    nt_isa_tensor_scalar(k, &A8, &A8, &o, NULL, NT_ENGINE_VECTOR);
    nt_sim_kernel_last(k, &in);
    assert_true(in.cycles == 64.0); /* floored at the minimum issue interval */
    assert_true(fabs(in.end_ns - in.start_ns - 64.0 / 1.12) < 1e-6);
    nt_isa_affine ex = {0, 0, {1, 0, 0, 0}};
    nt_isa_iota(k, &A, &ex);
    nt_sim_kernel_last(k, &in);
    assert_true(in.cycles == 1150.0); /* 150 + N on GpSimd */
    assert_true(fabs(in.end_ns - in.start_ns - 1150.0 / 1.4) < 1e-6);
    end_ok(k);
}

static void test_cost_activation_table(void **state)
{
    (void)state;
    nt_sim_kernel *k = begin("act_table");
    nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 640);
    nt_tile *b = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_F32, 128, 640);
    nt_ap A = nt_tile_ap(a), B = nt_tile_ap(b);
    nt_isa_activation(k, &B, NT_ACT_EXP, &A, NULL, NULL, NULL);
    double first = instr_ns(k);
    nt_isa_activation(k, &A, NT_ACT_EXP, &B, NULL, NULL, NULL);
    double again = instr_ns(k);
    nt_isa_activation(k, &B, NT_ACT_TANH, &A, NULL, NULL, NULL);
    double other = instr_ns(k);
    nt_isa_activation(k, &A, NT_ACT_RELU, &B, NULL, NULL, NULL);
    double relu = instr_ns(k);
    end_ok(k);
    assert_true(fabs(again - 640.0 / 1.4) < 1e-6);
    assert_true(fabs(first - again - 1000.0) < 1e-6); /* table load */
    assert_true(fabs(other - again - 1000.0) < 1e-6); /* switch */
    assert_true(fabs(relu - again) < 1e-6);           /* no table */
}

static void test_cost_parallel_engines(void **state)
{
    (void)state;
    /* three independent instructions on three engines overlap */
    nt_sim_kernel *k = begin("parallel");
    nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 2048);
    nt_tile *b = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_F32, 128, 2048);
    nt_tile *c = nt_tile_alloc(k, "c", NT_MEM_SBUF, NT_F32, 128, 2048);
    nt_tile *d = nt_tile_alloc(k, "d", NT_MEM_SBUF, NT_F32, 128, 2048);
    nt_ap A = nt_tile_ap(a), B = nt_tile_ap(b), C = nt_tile_ap(c), D = nt_tile_ap(d);
    double sum = 0;
    nt_isa_tensor_copy(k, &B, &A, NT_ENGINE_VECTOR);
    sum += instr_ns(k);
    nt_isa_activation(k, &C, NT_ACT_RELU, &A, NULL, NULL, NULL);
    sum += instr_ns(k);
    nt_isa_tensor_scalar(k, &D, &A, &(nt_isa_alu){NT_ALU_MUL, {NULL, 2}, false}, NULL,
                         NT_ENGINE_SCALAR);
    sum += instr_ns(k);
    nt_sim_report r;
    assert_int_equal(nt_sim_kernel_end(k, &r), 0);
    double vec = 2048 / 1.12, sca = 2048 / 1.4;
    assert_true(r.duration_ns < sum);
    assert_true(fabs(r.duration_ns - (vec > 2 * sca ? vec : 2 * sca)) < 1e-6);

    /* v2: VectorE and GpSimd exclude each other on SBUF; v3 lifts that */
    for (int t = 0; t < 2; t++) {
        nt_sim_set_target(t ? NT_SIM_TRN2 : NT_SIM_TRN1);
        k = begin("sbuf_port");
        a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 2048);
        b = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_F32, 128, 2048);
        c = nt_tile_alloc(k, "c", NT_MEM_SBUF, NT_F32, 128, 2048);
        A = nt_tile_ap(a), B = nt_tile_ap(b), C = nt_tile_ap(c);
        nt_isa_tensor_copy(k, &B, &A, NT_ENGINE_VECTOR);
        double v = instr_ns(k);
        nt_isa_tensor_copy(k, &C, &A, NT_ENGINE_GPSIMD);
        double g = instr_ns(k);
        assert_int_equal(nt_sim_kernel_end(k, &r), 0);
        if (t == 0)
            assert_true(fabs(r.duration_ns - (v + g)) < 1e-6);
        else
            assert_true(fabs(r.duration_ns - (v > g ? v : g)) < 1e-6);
    }
    nt_sim_set_target(NT_SIM_TRN1);
}

static void test_cost_dependencies(void **state)
{
    (void)state;
    static float x[128 * 512];
    nt_sim_config cfg;
    nt_sim_config_get(&cfg);
    nt_sim_kernel *k = begin("deps");
    nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_BF16, 128, 512);
    nt_tile *f = nt_tile_alloc(k, "f", NT_MEM_SBUF, NT_F32, 128, 512);
    nt_ap F = nt_tile_ap(f), A = nt_tile_ap(a), H = hbm32(x, 128, 512, 512);
    nt_sim_instr_info i1, i2, i3, i4;
    nt_isa_dma_copy(k, &F, &H, 0); /* RAW producer */
    nt_sim_kernel_last(k, &i1);
    /* DMA cost: fixed + bytes / (16 engines * 17 B/ns) */
    assert_true(fabs(i1.end_ns - i1.start_ns - (cfg.dma_fixed_ns + 128.0 * 512 * 4 / (16 * 17.0))) <
                1e-3);
    nt_isa_tensor_copy(k, &A, &F, NT_ENGINE_VECTOR); /* reads F */
    nt_sim_kernel_last(k, &i2);
    assert_true(i2.start_ns >= i1.end_ns);
    nt_isa_dma_copy(k, &F, &H, 1); /* WAR: rewrites F after the copy read it */
    nt_sim_kernel_last(k, &i3);
    assert_true(i3.start_ns >= i2.end_ns);
    nt_isa_activation(k, &A, NT_ACT_EXP, &F, NULL, NULL, NULL); /* WAW on A, RAW on F */
    nt_sim_kernel_last(k, &i4);
    assert_true(i4.start_ns >= i3.end_ns);
    assert_true(i4.start_ns >= i2.end_ns);
    end_ok(k);

    /* a result reaches the next engine access_latency cycles after it ends */
    k = begin("latency");
    a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_F32, 128, 64);
    f = nt_tile_alloc(k, "f", NT_MEM_SBUF, NT_F32, 128, 64);
    A = nt_tile_ap(a), F = nt_tile_ap(f);
    nt_isa_tensor_copy(k, &F, &A, NT_ENGINE_VECTOR);
    nt_sim_kernel_last(k, &i1);
    nt_isa_activation(k, &A, NT_ACT_RELU, &F, NULL, NULL, NULL);
    nt_sim_kernel_last(k, &i2);
    assert_true(fabs(i2.start_ns - i1.end_ns - cfg.access_latency_cycles / 1.12) < 1e-6);
    end_ok(k);

    /* released and reallocated space: the new tile's writer waits for the
     * old tile's reader */
    k = begin("reuse");
    a = nt_tile_alloc(k, "old", NT_MEM_SBUF, NT_F32, 128, 4096);
    f = nt_tile_alloc(k, "f", NT_MEM_SBUF, NT_F32, 128, 4096);
    A = nt_tile_ap(a), F = nt_tile_ap(f);
    nt_isa_activation(k, &F, NT_ACT_RELU, &A, NULL, NULL, NULL);
    nt_sim_kernel_last(k, &i1);
    nt_tile_release(k, a);
    nt_tile *n = nt_tile_alloc(k, "new", NT_MEM_SBUF, NT_F32, 128, 4096);
    nt_ap N = nt_tile_ap(n);
    nt_isa_memset(k, &N, 0.0, NT_ENGINE_GPSIMD);
    nt_sim_kernel_last(k, &i2);
    assert_true(i2.start_ns >= i1.end_ns);
    end_ok(k);
}

/* N tiles: load (DMA), exp (ScalarE), store (DMA); `bufs` rotating buffers.
 * Returns the kernel time; *parts gets the sum of every instruction's time. */
static double pipeline(int bufs, double *parts)
{
    enum { T = 8, F = 2048 };
    static float in[T * 128 * F], out[T * 128 * F];
    nt_sim_kernel *k = begin("pipeline");
    nt_tile *x[4], *y[4];
    for (int b = 0; b < bufs; b++) {
        x[b] = nt_tile_alloc(k, "x", NT_MEM_SBUF, NT_F32, 128, F);
        y[b] = nt_tile_alloc(k, "y", NT_MEM_SBUF, NT_F32, 128, F);
    }
    *parts = 0;
    for (int t = 0; t < T; t++) {
        nt_ap X = nt_tile_ap(x[t % bufs]), Y = nt_tile_ap(y[t % bufs]);
        nt_ap hi = hbm32(in + (size_t)t * 128 * F, 128, F, F);
        nt_ap ho = hbm32(out + (size_t)t * 128 * F, 128, F, F);
        nt_isa_dma_copy(k, &X, &hi, t % 2);
        *parts += instr_ns(k);
        nt_isa_activation(k, &Y, NT_ACT_EXP, &X, NULL, NULL, NULL);
        *parts += instr_ns(k);
        nt_isa_dma_copy(k, &ho, &Y, 2 + t % 2);
        *parts += instr_ns(k);
    }
    nt_sim_report r;
    assert_int_equal(nt_sim_kernel_end(k, &r), 0);
    return r.duration_ns;
}

static void test_cost_pipeline(void **state)
{
    (void)state;
    nt_sim_set_functional(false);
    double p1, p2;
    double single = pipeline(1, &p1);
    double dbl = pipeline(2, &p2);
    nt_sim_set_functional(true);
    assert_true(single < p1 + 1e-6);
    assert_true(dbl < single);
    assert_true(dbl < 0.75 * p2);
}

/* ------------------------------------------------------------------------ */
/* The matmul tile program                                                  */
/* ------------------------------------------------------------------------ */

static float round_to(nt_dtype dt, float v)
{
    if (dt == NT_BF16)
        return nt__bf16_to_f32(nt__f32_to_bf16(v));
    if (dt == NT_F16)
        return nt__f16_to_f32(nt__f32_to_f16(v));
    return v;
}

static void put(void *p, nt_dtype dt, size_t i, float v)
{
    nt__store_f32(p, dt, (int64_t)i, v);
}

static void tile_matmul_case(int64_t M, int64_t N, int64_t K, nt_dtype in, nt_dtype out,
                             bool a_trans)
{
    int64_t lda = (a_trans ? M : K) + 3, ldb = N + 5, ldc = N + 2;
    size_t esz = nt__dtype_size(in), csz = nt__dtype_size(out);
    int64_t arows = a_trans ? K : M;
    void *A = calloc((size_t)(arows * lda) + 1, esz), *B = calloc((size_t)(K * ldb) + 1, esz);
    void *C = calloc((size_t)(M * ldc) + 1, csz);
    float *At = malloc((size_t)(K * M + 1) * 4), *Bf = malloc((size_t)(K * N + 1) * 4);
    float *ref = malloc((size_t)(M * N + 1) * 4);
    for (int64_t kk = 0; kk < K; kk++)
        for (int64_t m = 0; m < M; m++) {
            float v = round_to(in, nt_test_uniform(&rng_state));
            At[kk * M + m] = v;
            put(A, in, (size_t)(a_trans ? kk * lda + m : m * lda + kk), v);
        }
    for (int64_t kk = 0; kk < K; kk++)
        for (int64_t n = 0; n < N; n++) {
            float v = round_to(in, nt_test_uniform(&rng_state));
            Bf[kk * N + n] = v;
            put(B, in, (size_t)(kk * ldb + n), v);
        }
    nt_sim_kernel *k = begin("tile_matmul");
    nt_tile_matmul_args args = {M, N, K, A, lda, a_trans, B, ldb, in, C, ldc, out};
    int rc = nt_tile_matmul(k, &args);
    if (rc)
        fail_msg("%s", nt_sim_kernel_message(k));
    nt_sim_report r;
    assert_int_equal(nt_sim_kernel_end(k, &r), 0);
    assert_true(fabs(r.flops - 2.0 * M * N * K) < 0.5);
    /* every input byte is read at least once, the output written once */
    assert_true(r.hbm_write_bytes == (uint64_t)(M * N) * csz);
    assert_true(r.hbm_read_bytes >= (uint64_t)(M * K + K * N) * esz);

    /* bitwise: nt__gemm_ktile over K-tiles of 128, ascending, then one rounding */
    memset(ref, 0, (size_t)(M * N) * 4);
    for (int64_t k0 = 0; k0 < K; k0 += 128)
        ktile_ref(in, (int)M, (int)N, (int)(K - k0 < 128 ? K - k0 : 128), At + k0 * M, (int)M,
                  Bf + k0 * N, (int)N, ref, (int)N, k0 > 0);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float got = nt__load_f32(C, out, m * ldc + n);
            float want = round_to(out, ref[m * N + n]);
            if (bits(got) != bits(want))
                fail_msg("C[%lld,%lld] = %a, want %a (M=%lld N=%lld K=%lld)", (long long)m,
                         (long long)n, got, want, (long long)M, (long long)N, (long long)K);
            double s = 0, mag = 0;
            for (int64_t kk = 0; kk < K; kk++) {
                s += (double)At[kk * M + m] * Bf[kk * N + n];
                mag += fabs((double)At[kk * M + m] * Bf[kk * N + n]);
            }
            double tol = (out == NT_F32 ? 1e-6 * mag : 0.0) +
                         (out == NT_F32 ? 0.0 : fabs(s) * (out == NT_BF16 ? 0x1p-8 : 0x1p-11) +
                                                    1e-6 * mag);
            assert_true(fabs((double)got - s) <= tol + 1e-30);
        }
    /* bytes outside C's [M, N] window (the row padding) stay untouched */
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = N; n < ldc; n++)
            assert_true(nt__load_f32(C, out, m * ldc + n) == 0.0f);
    free(A);
    free(B);
    free(C);
    free(At);
    free(Bf);
    free(ref);
}

/* nt_tile_matmul with x: C = A . B and W = A^T . X (a linear layer's dX =
 * dY . W and dW = dY^T . X) in one program give the bits of the two
 * programs apart -- C of the program without x, W of the program for A^T . X
 * (A given transposed) -- and of nt__gemm_ktile over K-tiles of 128
 * ascending, with the values computed once per program and per
 * instruction; the program reads A once: fewer HBM bytes than the two. */
static void side_case(int64_t M, int64_t K, int64_t N, int64_t NX, nt_dtype in, bool pg)
{
    size_t esz = nt__dtype_size(in);
    int64_t lda = K + 3, ldb = N + 1, ldx = NX + 2, ldc = N, ldw = NX + 1;
    void *A = calloc((size_t)(M * lda), esz), *B = calloc((size_t)(K * ldb), esz);
    void *X = calloc((size_t)(M * ldx), esz);
    float *Af = malloc((size_t)(M * K) * 4), *Xf = malloc((size_t)(M * NX) * 4);
    float *C1 = calloc((size_t)(M * ldc), 4), *C2 = calloc((size_t)(M * ldc), 4);
    float *W1 = calloc((size_t)(K * ldw), 4), *W2 = calloc((size_t)(K * ldw), 4);
    float *ref = malloc((size_t)(K * NX) * 4);
    for (int64_t m = 0; m < M; m++)
        for (int64_t kk = 0; kk < K; kk++) {
            Af[m * K + kk] = round_to(in, nt_test_uniform(&rng_state));
            put(A, in, (size_t)(m * lda + kk), Af[m * K + kk]);
        }
    for (int64_t kk = 0; kk < K; kk++)
        for (int64_t n = 0; n < N; n++)
            put(B, in, (size_t)(kk * ldb + n), round_to(in, nt_test_uniform(&rng_state)));
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < NX; j++) {
            Xf[m * NX + j] = round_to(in, nt_test_uniform(&rng_state));
            put(X, in, (size_t)(m * ldx + j), Xf[m * NX + j]);
        }
    nt__sim_set_program_gemm(pg);
    nt_sim_report r1, r2, r3;
    nt_sim_kernel *k = begin("tile_matmul_side");
    nt_tile_matmul_args g = {M, N, K, A, lda, false, B, ldb, in, C1, ldc, NT_F32};
    g.x = X, g.ldx = ldx, g.NX = NX, g.w = W1, g.ldw = ldw, g.w_dtype = NT_F32;
    if (nt_tile_matmul(k, &g))
        fail_msg("%s", nt_sim_kernel_message(k));
    assert_int_equal(end_kernel(k, &r1), 0);
    k = begin("tile_matmul_dx");
    nt_tile_matmul_args gx = {M, N, K, A, lda, false, B, ldb, in, C2, ldc, NT_F32};
    assert_int_equal(nt_tile_matmul(k, &gx), 0);
    assert_int_equal(end_kernel(k, &r2), 0);
    k = begin("tile_matmul_dw");
    nt_tile_matmul_args gw = {K, NX, M, A, lda, true, X, ldx, in, W2, ldw, NT_F32};
    assert_int_equal(nt_tile_matmul(k, &gw), 0);
    assert_int_equal(end_kernel(k, &r3), 0);
    nt__sim_set_program_gemm(true);
    assert_memory_equal(C1, C2, (size_t)(M * ldc) * 4);
    assert_memory_equal(W1, W2, (size_t)(K * ldw) * 4);
    for (int64_t r0 = 0; r0 < M; r0 += 128)
        ktile_ref(in, (int)K, (int)NX, (int)(M - r0 < 128 ? M - r0 : 128), Af + r0 * K, (int)K,
                  Xf + r0 * NX, (int)NX, ref, (int)NX, r0 > 0);
    for (int64_t kk = 0; kk < K; kk++)
        for (int64_t j = 0; j < NX; j++)
            if (bits(W1[kk * ldw + j]) != bits(ref[kk * NX + j]))
                fail_msg("W[%lld,%lld] = %a, want %a", (long long)kk, (long long)j,
                         W1[kk * ldw + j], ref[kk * NX + j]);
    /* A read once: the pair reads what the two read, less one A */
    assert_true(r1.hbm_read_bytes + (uint64_t)(M * K) * esz <=
                r2.hbm_read_bytes + r3.hbm_read_bytes);
    assert_true(r1.hbm_write_bytes == r2.hbm_write_bytes + r3.hbm_write_bytes);
    assert_true(fabs(r1.flops - r2.flops - r3.flops) < 0.5);
    free(A);
    free(B);
    free(X);
    free(Af);
    free(Xf);
    free(C1);
    free(C2);
    free(W1);
    free(W2);
    free(ref);
}

static void test_tile_matmul_side(void **state)
{
    (void)state;
    for (int pg = 0; pg < 2; pg++) {
        side_case(2048, 512, 128, 128, NT_F32, pg); /* the MLP's first layer: dW [512, 128] */
        side_case(1024, 128, 512, 512, NT_F32, pg); /* its second: dW [128, 512] */
        side_case(300, 384, 128, 128, NT_F32, pg);  /* a last M-tile of 44 rows */
        side_case(512, 200, 96, 64, NT_BF16, pg);
    }
}

/* nt_tile_matmul's x: what it refuses, and NT_ENOTSUP (nothing issued, the
 * kernel still usable) where A cannot stream past all of B. */
static void test_tile_matmul_side_errors(void **state)
{
    (void)state;
    static float A[512 * 128], B[256 * 64], X[512 * 600], C[512 * 64], W[128 * 600];
    nt_tile_matmul_args g = {512, 64, 128, A, 128, false, B, 64, NT_F32, C, 64, NT_F32};
    g.x = X, g.ldx = 64, g.NX = 64, g.w = W, g.ldw = 64, g.w_dtype = NT_F32;
    const char *want[] = {"x with a transposed A", "NX=600", "K=256, NX=300",
                          "W shares memory"};
    for (int i = 0; i < 4; i++) {
        nt_tile_matmul_args b = g;
        if (i == 0)
            b.a_trans = true, b.lda = 512;
        if (i == 1)
            b.NX = 600, b.ldx = 600, b.ldw = 600;
        if (i == 2) /* K 256: 2 K-tiles of 300 columns */
            b.K = 256, b.M = 256, b.NX = 300, b.ldx = 300, b.ldw = 300, b.lda = 256;
        if (i == 3)
            b.w = X;
        nt_sim_kernel *k = begin("tile_matmul_side_bad");
        assert_int_equal(nt_tile_matmul(k, &b), NT_ESIM);
        const char *m = nt_sim_kernel_message(k);
        if (!strstr(m, want[i]))
            fail_msg("case %d: message \"%s\" lacks \"%s\"", i, m, want[i]);
        nt_sim_report r;
        assert_int_equal(end_kernel(k, &r), NT_ESIM);
    }
    /* one M-tile: no stream, NT_ENOTSUP and nothing issued */
    nt_tile_matmul_args one = g;
    one.M = 100;
    nt_sim_kernel *k = begin("tile_matmul_side_one");
    assert_int_equal(nt_tile_matmul(k, &one), NT_ENOTSUP);
    one.x = NULL;
    assert_int_equal(nt_tile_matmul(k, &one), 0);
    end_ok(k);
}

static void test_tile_matmul_small(void **state)
{
    (void)state;
    tile_matmul_case(1, 1, 1, NT_F32, NT_F32, false);
    tile_matmul_case(1, 1, 1, NT_F32, NT_F32, true);
    tile_matmul_case(5, 7, 0, NT_F32, NT_BF16, false); /* K = 0: zeros */
    tile_matmul_case(128, 512, 128, NT_F32, NT_F32, true);
    tile_matmul_case(128, 512, 128, NT_BF16, NT_BF16, false);
}

static void test_tile_matmul_ragged(void **state)
{
    (void)state;
    tile_matmul_case(130, 700, 300, NT_F32, NT_F32, false);
    tile_matmul_case(130, 700, 300, NT_F32, NT_F32, true);
    tile_matmul_case(77, 1030, 260, NT_BF16, NT_F32, true);
    tile_matmul_case(300, 90, 520, NT_BF16, NT_BF16, false);
    tile_matmul_case(1100, 33, 129, NT_F16, NT_F16, false); /* more M-tiles than banks */
}

static void test_tile_matmul_streamed_panel(void **state)
{
    (void)state;
    /* K too large for a resident A panel: the panel is streamed per chunk */
    tile_matmul_case(200, 20, 45000, NT_F32, NT_F32, true);
    tile_matmul_case(130, 12, 90000, NT_BF16, NT_F32, false);
}

static void test_tile_matmul_peak(void **state)
{
    (void)state;
    /* bf16 [4096, 8192] x [8192, 8192], timing only: >= 85% of TensorE peak */
    int64_t M = 4096, K = 8192, N = 8192;
    void *A = malloc((size_t)(M * K) * 2), *B = malloc((size_t)(K * N) * 2);
    void *C = malloc((size_t)(M * N) * 2);
    nt_sim_set_functional(false);
    for (int t = 0; t < 2; t++) {
        nt_sim_kernel *k = begin("peak");
        nt_tile_matmul_args args = {M, N, K, A, t ? M : K, t == 1, B, N, NT_BF16, C, N, NT_BF16};
        assert_int_equal(nt_tile_matmul(k, &args), 0);
        nt_sim_report r;
        assert_int_equal(nt_sim_kernel_end(k, &r), 0);
        double mfu = r.tensor_ideal_ns / r.duration_ns;
        print_message("# tile matmul bf16 4096x8192x8192 (A%s): %.3f ms, %.1f%% of peak\n",
                      t ? "^T given" : " row-major", r.duration_ns / 1e6, 100 * mfu);
        assert_true(mfu >= 0.85);
        assert_true(mfu <= 1.0);
    }
    nt_sim_set_functional(true);
    free(A);
    free(B);
    free(C);
}

/* ------------------------------------------------------------------------ */
/* Timing-only mode                                                         */
/* ------------------------------------------------------------------------ */

static double run_small_matmul(float *C, bool functional)
{
    enum { M = 200, N = 300, K = 150 };
    static float A[M * K], B[K * N];
    for (int i = 0; i < M * K; i++)
        A[i] = (float)(i % 7);
    for (int i = 0; i < K * N; i++)
        B[i] = (float)(i % 5);
    nt_sim_set_functional(functional);
    nt_sim_kernel *k = begin("timing_only");
    nt_tile_matmul_args args = {M, N, K, A, K, false, B, N, NT_F32, C, N, NT_F32};
    assert_int_equal(nt_tile_matmul(k, &args), 0);
    nt_sim_report r;
    assert_int_equal(nt_sim_kernel_end(k, &r), 0);
    nt_sim_set_functional(true);
    return r.duration_ns;
}

static void test_timing_only(void **state)
{
    (void)state;
    float *C = malloc(200 * 300 * 4);
    for (int i = 0; i < 200 * 300; i++)
        C[i] = -7.0f;
    double t0 = run_small_matmul(C, false);
    for (int i = 0; i < 200 * 300; i++)
        assert_true(C[i] == -7.0f); /* no data moved */
    double t1 = run_small_matmul(C, true);
    assert_true(C[0] != -7.0f);
    assert_true(t0 == t1); /* the same timeline either way */
    assert_true(nt_sim_get_functional());
    free(C);
}

/* ------------------------------------------------------------------------ */
/* Trace                                                                    */
/* ------------------------------------------------------------------------ */

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static void test_trace(void **state)
{
    (void)state;
    char path[] = "/tmp/nt_test_sim_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(nt__trace_open(path), 0);
    assert_true(nt__trace_enabled());
    float C[64 * 64];
    static float A[64 * 64], B[64 * 64];
    nt_sim_kernel *k = begin("traced \"kernel\"");
    nt_tile_matmul_args args = {64, 64, 64, A, 64, true, B, 64, NT_F32, C, 64, NT_F32};
    assert_int_equal(nt_tile_matmul(k, &args), 0);
    end_ok(k);
    /* the host side adds its own process and tracks */
    nt__trace_process_name(NT_TRACE_PID_HOST, "host", 0);
    nt__trace_thread_name(NT_TRACE_PID_HOST, 1, "main thread", 0);
    nt__trace_complete(NT_TRACE_PID_HOST, 1, "nt_matmul", 1.0, 2.0, "{\"site\":\"x.c:1\"}");
    nt__trace_instant(NT_TRACE_PID_HOST, 1, "sync", 3.0, NULL);
    nt__trace_counter(NT_TRACE_PID_HOST, "queue depth", 3.0, "{\"ops\":4}");
    nt__trace_close();
    assert_false(nt__trace_enabled());
    nt__trace_close(); /* idempotent */

    FILE *f = fopen(path, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(txt, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    unlink(path);
    assert_true(nt_test_json_ok(txt)); /* one JSON value, nothing after it */
    assert_non_null(strstr(txt, "\"traceEvents\":["));
    assert_non_null(strstr(txt, "\"NeuronCore (simulated)\""));
    const char *tracks[] = {"\"TensorE\"", "\"VectorE\"", "\"ScalarE\"", "\"GpSimd\"",
                            "\"DMA queue 0\"", "\"DMA queue 15\"", "\"kernels\""};
    for (size_t i = 0; i < sizeof tracks / sizeof *tracks; i++)
        assert_non_null(strstr(txt, tracks[i]));
    assert_true(count(txt, "\"name\":\"nc_matmul\"") == 1);
    assert_true(count(txt, "\"name\":\"dma_copy\"") == 3); /* A, B, C */
    assert_non_null(strstr(txt, "\"name\":\"traced \\\"kernel\\\"\""));
    assert_non_null(strstr(txt, "\"flops\":524288"));
    assert_non_null(strstr(txt, "\"bytes\":16384"));
    assert_non_null(strstr(txt, "\"name\":\"host\""));
    free(txt);
}

/* ------------------------------------------------------------------------ */
/* Statistics and threads                                                   */
/* ------------------------------------------------------------------------ */

static void test_stats(void **state)
{
    (void)state;
    nt_sim_stats_reset();
    nt_sim_stats s;
    assert_int_equal(nt_sim_stats_get(&s), 0);
    assert_int_equal(s.kernels, 0);
    double clock0 = s.clock_ns;
    float C[128 * 512];
    static float A[128 * 128], B[128 * 512];
    nt_sim_kernel *k = begin("stats");
    nt_tile_matmul_args args = {128, 512, 128, A, 128, true, B, 512, NT_F32, C, 512, NT_F32};
    assert_int_equal(nt_tile_matmul(k, &args), 0);
    nt_sim_report r;
    assert_int_equal(nt_sim_kernel_end(k, &r), 0);
    assert_int_equal(nt_sim_stats_get(&s), 0);
    assert_int_equal(s.kernels, 1);
    assert_int_equal(s.instructions, r.instructions);
    assert_int_equal(s.errors, 0);
    assert_true(s.flops == 2.0 * 128 * 512 * 128);
    assert_int_equal(s.hbm_read_bytes, (128 * 128 + 128 * 512) * 4);
    assert_int_equal(s.hbm_write_bytes, 128 * 512 * 4);
    assert_true(s.sim_ns == r.duration_ns);
    assert_true(s.clock_ns >= clock0 + r.duration_ns - 1e-6);
    assert_true(r.start_ns >= clock0);
    assert_true(s.mfu > 0 && s.mfu < 1);
    assert_true(fabs(s.mfu - r.tensor_ideal_ns / r.duration_ns) < 1e-12);
    assert_true(fabs(s.tensor_ideal_ns - s.flops / (128.0 * 128 * 2 * 2.8e9 / 4) * 1e9) < 1e-6);
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        assert_true(s.utilization[e] >= 0 && s.utilization[e] <= 1.0 + 1e-12);
    assert_true(s.busy_ns[NT_ENGINE_DMA] > 0);
    assert_true(s.hbm_bw_utilization > 0 && s.hbm_bw_utilization < 1);
    assert_true(r.sbuf_peak_bytes > 0 && r.psum_peak_bytes == 2048);
    nt_sim_stats_reset();
    assert_int_equal(nt_sim_stats_get(&s), 0);
    assert_int_equal(s.kernels, 0);
    assert_true(s.clock_ns >= r.end_ns); /* the clock is not reset */
}

enum { THREADS = 4, PER_THREAD = 25 };
static nt_sim_report thread_reports[THREADS * PER_THREAD];

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    float x[32 * 32], y[32 * 32];
    for (int i = 0; i < 32 * 32; i++)
        x[i] = (float)(id * 1000 + i);
    for (int j = 0; j < PER_THREAD; j++) {
        nt_sim_kernel *k = nt_sim_kernel_begin("thread");
        nt_tile *t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 32, 32);
        nt_ap T = nt_tile_ap(t), hx = nt_hbm_ap(x, NT_F32, 0, 32, 32, 32),
              hy = nt_hbm_ap(y, NT_F32, 0, 32, 32, 32);
        nt_isa_dma_copy(k, &T, &hx, NT_DMA_QUEUE_AUTO);
        nt_isa_activation(k, &T, NT_ACT_IDENTITY, &T, &(nt_isa_scalar){NULL, -1.0f}, NULL, NULL);
        nt_isa_dma_copy(k, &hy, &T, NT_DMA_QUEUE_AUTO);
        (nt_sim_kernel_end)(k, &thread_reports[id * PER_THREAD + j]);
        for (int i = 0; i < 32 * 32; i++)
            if (y[i] != -x[i])
                return (void *)1;
    }
    return NULL;
}

static int cmp_start(const void *a, const void *b)
{
    double x = ((const nt_sim_report *)a)->start_ns, y = ((const nt_sim_report *)b)->start_ns;
    return x < y ? -1 : x > y;
}

static void test_threads(void **state)
{
    (void)state;
    nt_sim_stats_reset();
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
    }
    nt_sim_stats s;
    nt_sim_stats_get(&s);
    assert_int_equal(s.kernels, THREADS * PER_THREAD);
    assert_int_equal(s.instructions, THREADS * PER_THREAD * 3);
    /* one core: kernels follow each other on the simulated clock */
    qsort(thread_reports, THREADS * PER_THREAD, sizeof *thread_reports, cmp_start);
    for (int i = 1; i < THREADS * PER_THREAD; i++)
        assert_true(thread_reports[i].start_ns >= thread_reports[i - 1].end_ns);
}

static void test_names_and_config(void **state)
{
    (void)state;
    assert_string_equal(nt_engine_name(NT_ENGINE_TENSOR), "TensorE");
    assert_string_equal(nt_alu_op_name(NT_ALU_MAX), "maximum");
    assert_string_equal(nt_act_func_name(NT_ACT_GELU), "gelu");
    assert_string_equal(nt_mem_name(NT_MEM_PSUM), "PSUM");
    assert_string_equal(nt_engine_name((nt_engine)42), "?");
    nt_sim_config c;
    assert_int_equal(nt_sim_config_get(&c), 0);
    assert_int_equal(c.sbuf_partition_bytes, 192 * 1024);
    assert_true(fabs(c.tensor_peak_flops_bf16 - 91.75e12) < 0.01e12);
    nt_sim_set_target(NT_SIM_TRN2);
    nt_sim_config_get(&c);
    assert_int_equal(c.sbuf_partition_bytes, 224 * 1024);
    assert_true(c.clock_ghz[NT_ENGINE_VECTOR] == 0.96);
    nt_sim_kernel *k = begin("trn2");
    assert_int_equal(nt_tile_free_bytes(k, NT_MEM_SBUF), 224 * 1024);
    assert_int_equal(nt_tile_free_bytes(k, NT_MEM_PSUM), 2048);
    nt_tile *t = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 128, 50 * 1024);
    assert_non_null(t);
    assert_int_equal(nt_tile_partitions(t), 128);
    assert_int_equal(nt_tile_size(t), 50 * 1024);
    assert_int_equal(nt_tile_dtype(t), NT_F32);
    end_ok(k);
    nt_sim_set_target(NT_SIM_TRN1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_names_and_config, reset, teardown),
        cmocka_unit_test_setup_teardown(test_dma_roundtrip, reset, teardown),
        cmocka_unit_test_setup_teardown(test_dma_patterns, reset, teardown),
        cmocka_unit_test_setup_teardown(test_dma_bf16, reset, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_f32, reset, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_half, reset, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_accumulate, reset, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_accumulate_sbuf, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tile_matmul_side, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tile_matmul_side_errors, reset, teardown),
        cmocka_unit_test_setup_teardown(test_transpose, reset, teardown),
        cmocka_unit_test_setup_teardown(test_transpose_paths, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_tensor, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_tensor_int, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_scalar, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_scalar_pairs, reset, teardown),
        cmocka_unit_test_setup_teardown(test_scalar_tensor_tensor, reset, teardown),
        cmocka_unit_test_setup_teardown(test_activation, reset, teardown),
        cmocka_unit_test_setup_teardown(test_activation_funcs, reset, teardown),
        cmocka_unit_test_setup_teardown(test_isa_nki, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_reduce, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_copy_cast, reset, teardown),
        cmocka_unit_test_setup_teardown(test_memset_iota_select, reset, teardown),
        cmocka_unit_test_setup_teardown(test_errors, reset, teardown),
        cmocka_unit_test_setup_teardown(test_error_stops_kernel, reset, teardown),
        cmocka_unit_test_setup_teardown(test_cost_matmul, reset, teardown),
        cmocka_unit_test_setup_teardown(test_cost_vector_rules, reset, teardown),
        cmocka_unit_test_setup_teardown(test_cost_activation_table, reset, teardown),
        cmocka_unit_test_setup_teardown(test_cost_parallel_engines, reset, teardown),
        cmocka_unit_test_setup_teardown(test_cost_dependencies, reset, teardown),
        cmocka_unit_test_setup_teardown(test_cost_pipeline, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tile_matmul_small, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tile_matmul_ragged, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tile_matmul_streamed_panel, reset, teardown),
        cmocka_unit_test_setup_teardown(test_tile_matmul_peak, reset, teardown),
        cmocka_unit_test_setup_teardown(test_timing_only, reset, teardown),
        cmocka_unit_test_setup_teardown(test_trace, reset, teardown),
        cmocka_unit_test_setup_teardown(test_stats, reset, teardown),
        cmocka_unit_test_setup_teardown(test_threads, reset, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nt_sim_shutdown();
    return rc;
}
