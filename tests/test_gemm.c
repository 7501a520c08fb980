/* tests/test_gemm.c - the f32 matmul primitive (core/gemm.c) on every vector
 * ISA level this CPU runs: each level forced in turn (NT_CPU_ISA, or the
 * internal setter) must give bit for bit the naive recurrence of
 * docs/ops.md section 7 -- K-tiles of 128 ascending, s = fma(a, b, s) from +0
 * inside a tile, C = C + s across tiles -- on shapes around every blocking
 * edge of every kernel, on the helper thread's path, through nt_matmul
 * with batched and strided (transposed, sliced) operands, and over 20
 * training steps on both backends in every mode (the simulator with its
 * values computed per instruction and once per program, NT_SIM_PROGRAM_VALUES),
 * on one host thread and two (NT_CPU_THREADS). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/gemm.h"
#include "core/internal.h"
#include "cpu/subnormal.h"
#include "sim/sim.h"
#include "nt_test.h"

/* the seeded values of every test here (nt_test.h's generator) */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;

/* Mostly uniform in [-1, 3), with special values sprinkled in: signed
 * zeros, subnormals, values whose products overflow, infinities (whose
 * products with 0 and sums with the other sign give the default NaN).  No
 * NaN inputs: which of two NaN operands an fma passes on is not part of the
 * contract (NaNs are made canonical where results are rounded). */
static float val(void)
{
    uint32_t r = nt_test_rand32(&rng_state);
    switch (r % 509) {
    case 0: return -0.0f;
    case 1: return 0.0f;
    case 2: return 1e-40f;
    case 3: return -3e-39f;
    case 4: return 3e38f;
    case 5: return INFINITY;
    default: return (float)((double)(r >> 8) / (double)(1u << 23) * 2.0 - 1.0);
    }
}

/* n of val()'s values, in a new buffer */
static float *vals(size_t n)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = val();
    return p;
}

/* The documented order, one element at a time, nothing shared with
 * core/gemm.c. */
static void naive(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float c = 0.0f;
            for (int k0 = 0; k0 < K || k0 == 0; k0 += 128) {
                float s = 0.0f;
                for (int k = k0; k < K && k < k0 + 128; k++)
                    s = fmaf(A[(long)k * lda + i], B[(long)k * ldb + j], s);
                c = k0 == 0 ? s : c + s;
            }
            C[(long)i * ldc + j] = c;
        }
}

/* The definition of bf16 x bf16 products (core/gemm.h), one element at a
 * time, nothing shared with core/: per K-tile of 128, s = +0, then per
 * chunk of 16 k (the tile's last may be shorter) t = +0, t = fma(a, b, t)
 * over the chunk, s = s + t; C = C + s across tiles.  acc: C's own value
 * first (else the first tile's s). */
static void naive_bf16_acc(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                           float *C, int ldc, bool acc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float c = acc ? C[(long)i * ldc + j] : 0.0f;
            for (int k0 = 0; k0 < K || k0 == 0; k0 += 128) {
                float s = 0.0f;
                for (int c0 = k0; c0 < K && c0 < k0 + 128; c0 += 16) {
                    float t = 0.0f;
                    for (int k = c0; k < K && k < c0 + 16; k++)
                        t = fmaf(A[(long)k * lda + i], B[(long)k * ldb + j], t);
                    s = s + t;
                }
                c = k0 == 0 && !acc ? s : c + s;
            }
            C[(long)i * ldc + j] = c;
        }
}

static void naive_bf16(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                       float *C, int ldc)
{
    naive_bf16_acc(M, N, K, A, lda, B, ldb, C, ldc, false);
}

/* The typed product's reference: naive's f32 result (naive_bf16's for
 * bf16 x bf16, bb), its bf16 rounding (what a bf16 output holds) and NaNs
 * made canonical, as the GEMM stores them.  ref and refh hold M rows of
 * ldc. */
static void naive_typed(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                        float *ref, uint16_t *refh, int ldc, bool bb)
{
    (bb ? naive_bf16 : naive)(M, N, K, A, lda, B, ldb, ref, ldc);
    for (int i = 0; i < M; i++)
        nt__st_f32((char *)(refh + (long)i * ldc), NT_BF16, 1, ref + (long)i * ldc, N);
    for (size_t i = 0; i < (size_t)M * ldc; i++)
        ref[i] = nt__canon(ref[i]);
}

static int differ(const float *x, const float *y, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(&x[i], &y[i], sizeof(float)) != 0;
    return bad;
}

/* Differences of a typed product from the reference: bf16 rows
 * compared bit for bit, f32 elements counted by differ. */
static int typed_rows_differ(int M, int N, int ldc, bool o16, const float *got, const float *ref,
                             const uint16_t *goth, const uint16_t *refh)
{
    int bad = 0;
    for (int i = 0; i < M; i++)
        bad += o16 ? memcmp(goth + (long)i * ldc, refh + (long)i * ldc, 2 * (size_t)N) != 0
                   : differ(got + (long)i * ldc, ref + (long)i * ldc, (size_t)N);
    return bad;
}

/* ---------------- the levels ---------------- */

static void test_levels(void **state)
{
    (void)state;
    assert_true(nt__gemm_isa_runs(NT_ISA_SCALAR));
    int best = nt__gemm_isa_best();
    assert_true(best >= NT_ISA_SCALAR && best < NT_ISA_COUNT);
    assert_true(nt__gemm_isa_runs(best));
    for (int i = best + 1; i < NT_ISA_COUNT; i++)
        assert_false(nt__gemm_isa_runs(i));
    assert_string_equal(nt__gemm_isa_label(NT_ISA_SCALAR), "scalar");
    assert_string_equal(nt__gemm_isa_label(NT_ISA_AVX2), "avx2");
    assert_string_equal(nt__gemm_isa_label(NT_ISA_AVX512), "avx512");
    assert_null(nt__gemm_isa_label(NT_ISA_COUNT));
    assert_null(nt__gemm_isa_label(-1));
    /* nt_init chose the widest (NT_CPU_ISA unset) */
    assert_int_equal(nt__gemm_isa(), best);
    assert_string_equal(nt_config_get("NT_CPU_ISA"), nt__gemm_isa_label(best));
    /* a level that does not exist is refused and changes nothing */
    assert_int_equal(nt__gemm_set_isa(NT_ISA_COUNT), -1);
    assert_int_equal(nt__gemm_isa(), best);
    assert_int_equal(nt__gemm_set_isa(NT_ISA_SCALAR), 0);
    assert_int_equal(nt__gemm_isa(), NT_ISA_SCALAR);
    assert_int_equal(nt__gemm_set_isa(-1), 0);
    assert_int_equal(nt__gemm_isa(), best);
}

static void test_config(void **state)
{
    (void)state;
    int best = nt__gemm_isa_best();
    for (int i = 0; i <= best; i++) {
        assert_int_equal(nt_config_set("NT_CPU_ISA", nt__gemm_isa_label(i)), 0);
        assert_string_equal(nt_config_get("NT_CPU_ISA"), nt__gemm_isa_label(i));
        assert_int_equal(nt__gemm_isa(), i);
    }
    assert_int_equal(nt_config_set("NT_CPU_ISA", "auto"), 0);
    assert_string_equal(nt_config_get("NT_CPU_ISA"), nt__gemm_isa_label(best));
    /* a bad name: an error naming the variable, the level unchanged */
    nt_config_set("NT_CPU_ISA", "scalar");
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_CPU_ISA", "avx1024"), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "NT_CPU_ISA"));
    assert_non_null(strstr(nt_last_error_message(), "avx1024"));
    assert_string_equal(nt_config_get("NT_CPU_ISA"), "scalar");
    /* a level this CPU does not run (when there is one) */
    if (best + 1 < NT_ISA_COUNT) {
        nt_clear_error();
        assert_int_equal(nt_config_set("NT_CPU_ISA", nt__gemm_isa_label(best + 1)), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), "does not run"));
        assert_string_equal(nt_config_get("NT_CPU_ISA"), "scalar");
    }
    nt_clear_error();
    /* nt_shutdown + nt_init go back to the default, then read the
     * environment: a bad value fails nt_init, a good one is taken */
    nt_shutdown();
    setenv("NT_CPU_ISA", "sse9", 1);
    assert_int_equal(nt_init(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "NT_CPU_ISA"));
    setenv("NT_CPU_ISA", "scalar", 1);
    assert_int_equal(nt_init(), 0);
    assert_string_equal(nt_config_get("NT_CPU_ISA"), "scalar");
    nt_shutdown();
    unsetenv("NT_CPU_ISA");
    assert_int_equal(nt_init(), 0);
    assert_string_equal(nt_config_get("NT_CPU_ISA"), nt__gemm_isa_label(best));
}

/* ---------------- bit for bit on every level ---------------- */

/* One K-tile (K <= 128), plain and accumulating into C, with leading dims
 * wider than the matrices: every level gives the naive recurrence's bits,
 * and C's padding columns are never written. */
static void test_ktile_every_level(void **state)
{
    (void)state;
    /* edges of the 4x8, 6x16 and 12x32 tiles, of the 64-column helper
     * blocks and 256-column B panels, and a call big enough to split
     * between two threads */
    static const int shapes[][3] = {
        {1, 1, 1},    {3, 5, 7},     {4, 8, 128},    {5, 9, 128},    {6, 16, 2},
        {7, 17, 3},   {11, 31, 127}, {12, 32, 128},  {13, 33, 100},  {25, 65, 64},
        {24, 96, 17}, {1, 300, 128}, {300, 1, 128},  {130, 300, 128}, {97, 513, 128},
    };
    int best = nt__gemm_isa_best();
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = M + 3, ldb = N + 5, ldc = N + 2;
        float *A = vals((size_t)K * lda), *B = vals((size_t)K * ldb);
        float *C0 = vals((size_t)M * ldc); /* what "acc" adds to */
        float *ref = malloc(sizeof(float) * (size_t)M * ldc);
        float *got = malloc(sizeof(float) * (size_t)M * ldc);
        for (int acc = 0; acc < 2; acc++) {
            memcpy(ref, C0, sizeof(float) * (size_t)M * ldc);
            naive(M, N, K, A, lda, B, ldb, ref, ldc);
            if (acc)
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        float t = ref[(long)i * ldc + j];
                        ref[(long)i * ldc + j] = C0[(long)i * ldc + j] + t;
                    }
            for (int isa = 0; isa <= best; isa++) {
                assert_int_equal(nt__gemm_set_isa(isa), 0);
                memcpy(got, C0, sizeof(float) * (size_t)M * ldc);
                nt__gemm_ktile(M, N, K, A, lda, B, ldb, got, ldc, acc);
                int bad = differ(got, ref, (size_t)M * ldc);
                if (bad)
                    print_message("# ktile %dx%dx%d acc %d on %s: %d elements differ\n", M, N, K,
                                  acc, nt__gemm_isa_label(isa), bad);
                assert_int_equal(bad, 0);
            }
        }
        free(A), free(B), free(C0), free(ref), free(got);
    }
    nt__gemm_set_isa(-1);
}

/* The whole product: K > 128 and not a multiple of it, shapes around the
 * C blocks (96 x 256, and 192 x 512 for big products) and the pack job's
 * chunks (16 A panels, 8 B panels), big enough for the second thread;
 * nt__gemm_ex_canon too. */
static void test_whole_every_level(void **state)
{
    (void)state;
    static const int shapes[][3] = {
        {1, 1, 129},    {13, 33, 300},  {12, 32, 256},   {97, 257, 385}, {96, 256, 129},
        {300, 1100, 228}, {12, 64, 1000}, {1, 700, 130},  {200, 520, 257}, {40, 40, 0},
        {37, 45, 200},  {390, 1601, 130}, /* the last: 192 x 512 C blocks */
        {8, 8200, 129}, /* B's panels over 4 MB: the huge-page buffer */
        {24, 32800, 130}, /* panels over 16 MB: the blocks prefetch the next ones */
        /* rows within one C block (192): each column block packs its own
         * B; at the limit of 192 rows and just past it */
        {128, 1024, 300}, {192, 700, 257}, {193, 300, 130},
        /* one column of C blocks (A read unpacked on AVX-512), rows not a
         * multiple of 12; few rows and columns over many K-tiles (the
         * column blocks cut to single panels for the helper thread) */
        {400, 130, 300}, {100, 100, 520}, {30, 64, 2100}, {1, 33, 1000},
        /* A^T read by the blocks over many K-tiles (packed by each block,
         * K-tile by K-tile, on AVX-512): an odd count of blocks of about
         * 256 rows made even; one K-tile */
        {1030, 100, 390}, {520, 64, 128},
        /* a last row tile of 8 (the AVX-512 kernel's 8-row body), at a
         * full and a partial column panel: one K-tile (few rows), several
         * with the next B fetched inside the loop (few rows), the blocks
         * of the whole product */
        {140, 600, 128}, {20, 300, 260}, {392, 700, 300},
    };
    int best = nt__gemm_isa_best();
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = M + 1, ldb = N + 7, ldc = N + 3;
        float *A = vals((size_t)K * lda + 1), *B = vals((size_t)K * ldb + 1);
        float *ref = vals((size_t)M * ldc);
        float *got = malloc(sizeof(float) * (size_t)M * ldc);
        memcpy(got, ref, sizeof(float) * (size_t)M * ldc); /* same padding */
        float *pad = malloc(sizeof(float) * (size_t)M * ldc);
        memcpy(pad, ref, sizeof(float) * (size_t)M * ldc);
        naive(M, N, K, A, lda, B, ldb, ref, ldc);
        /* nt__gemm_ex_canon: the same, NaNs made canonical inside C only
         * (the padding between rows is never written) */
        float *refc = malloc(sizeof(float) * (size_t)M * ldc);
        memcpy(refc, ref, sizeof(float) * (size_t)M * ldc);
        int nnan = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                nnan += isnan(refc[(long)i * ldc + j]) != 0;
                refc[(long)i * ldc + j] = nt__canon(refc[(long)i * ldc + j]);
            }
        if (M * N > 10000) /* the inputs' infinities make some (default, negative) NaNs */
            assert_true(nnan > 0);
        /* the same A row-major (M x K, rows K + 2 apart) for nt__gemm_rowa */
        int ldr = K + 2;
        float *Ar = malloc(sizeof(float) * ((size_t)M * ldr + 1));
        for (int i = 0; i < M; i++)
            for (int k = 0; k < ldr; k++)
                Ar[(long)i * ldr + k] = k < K ? A[(long)k * lda + i] : NAN; /* never read */
        /* and B^T (N x K, rows K + 3 apart) for nt__gemm_ex's bcol */
        int ldt = K + 3;
        float *Bt = malloc(sizeof(float) * ((size_t)N * ldt + 1));
        for (int j = 0; j < N; j++)
            for (int k = 0; k < ldt; k++)
                Bt[(long)j * ldt + k] = k < K ? B[(long)k * ldb + j] : NAN; /* never read */
        for (int isa = 0; isa <= best; isa++)
            for (int lay = 0; lay < 16; lay++) {
                bool rowa = lay & 1, bcol = lay & 2, canon = lay & 4;
                int th = lay & 8 ? 1 : 2;
                assert_int_equal(nt__gemm_set_isa(isa), 0);
                assert_int_equal(nt__gemm_set_threads(th), 0);
                memcpy(got, pad, sizeof(float) * (size_t)M * ldc);
                if (lay == 1)
                    nt__gemm_rowa(M, N, K, Ar, ldr, B, ldb, got, ldc);
                else if (lay == 0)
                    nt__gemm(M, N, K, A, lda, B, ldb, got, ldc);
                else if (canon)
                    nt__gemm_ex_canon(M, N, K, rowa ? Ar : A, rowa ? ldr : lda, rowa,
                                      bcol ? Bt : B, bcol ? ldt : ldb, bcol, got, ldc);
                else
                    nt__gemm_ex(M, N, K, rowa ? Ar : A, rowa ? ldr : lda, rowa, bcol ? Bt : B,
                                bcol ? ldt : ldb, bcol, got, ldc);
                int bad = differ(got, canon ? refc : ref, (size_t)M * ldc);
                if (bad)
                    print_message("# gemm%s (A %s, B %s) %dx%dx%d on %s, %d thread(s): %d "
                                  "elements differ\n",
                                  canon ? "_ex_canon" : "", rowa ? "row-major" : "transposed",
                                  bcol ? "transposed" : "row-major", M, N, K,
                                  nt__gemm_isa_label(isa), th, bad);
                assert_int_equal(bad, 0);
            }
        free(A), free(B), free(ref), free(refc), free(got), free(pad), free(Ar), free(Bt);
    }
    nt__gemm_set_threads(0);
    /* Few rows, memory short for the column blocks' own B buffers (two
     * 128 x 32 tiles: 8192 floats on AVX-512) but not for the whole
     * product's panels (12 x 129 and 32 x 129): the other path runs, the
     * same bits. */
    {
        int M = 12, N = 32, K = 129;
        float *A = vals((size_t)K * M), *B = vals((size_t)K * N);
        float *ref = calloc((size_t)M * N, sizeof(float)), *got = vals((size_t)M * N);
        naive(M, N, K, A, M, B, N, ref, N);
        nt__gemm_set_panel_cap(5000);
        for (int isa = 0; isa <= best; isa++) {
            assert_int_equal(nt__gemm_set_isa(isa), 0);
            nt__gemm(M, N, K, A, M, B, N, got, N);
            assert_int_equal(differ(got, ref, (size_t)M * N), 0);
        }
        nt__gemm_set_panel_cap(0);
        free(A), free(B), free(ref), free(got);
    }
    nt__gemm_set_isa(-1);
}

/* Products of over 16 MB of panels prefetch the next panels from inside
 * the micro-kernel's K loop (core/gemm.c, full_block): forced on for
 * products of test size, every layout, level and thread count gives the
 * naive bits -- ragged rows and columns, K not a multiple of 128, one
 * K-tile (nothing to prefetch ahead) and many, C accumulated in the
 * block scratch or stored directly. */
static void test_whole_prefetch(void **state)
{
    (void)state;
    static const int shapes[][3] = {
        {390, 1601, 130}, {205, 530, 300}, {300, 97, 129}, {204, 640, 128}, {217, 70, 40},
        {250, 1100, 1000}, {236, 300, 200}, /* the last: a last row tile of 8 */
    };
    int best = nt__gemm_isa_best();
    nt__gemm_set_prefetch(true);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = M + 1, ldb = N + 7, ldc = N + 3, ldr = K + 2, ldt = K + 3;
        float *A = vals((size_t)K * lda + 1), *B = vals((size_t)K * ldb + 1);
        float *ref = vals((size_t)M * ldc), *pad = malloc(sizeof(float) * (size_t)M * ldc);
        float *got = malloc(sizeof(float) * (size_t)M * ldc);
        float *Ar = malloc(sizeof(float) * ((size_t)M * ldr + 1));
        float *Bt = malloc(sizeof(float) * ((size_t)N * ldt + 1));
        memcpy(pad, ref, sizeof(float) * (size_t)M * ldc);
        naive(M, N, K, A, lda, B, ldb, ref, ldc);
        for (int i = 0; i < M; i++)
            for (int k = 0; k < ldr; k++)
                Ar[(long)i * ldr + k] = k < K ? A[(long)k * lda + i] : NAN;
        for (int j = 0; j < N; j++)
            for (int k = 0; k < ldt; k++)
                Bt[(long)j * ldt + k] = k < K ? B[(long)k * ldb + j] : NAN;
        for (int isa = 0; isa <= best; isa++)
            for (int lay = 0; lay < 8; lay++) {
                bool rowa = lay & 1, bcol = lay & 2;
                int th = lay & 4 ? 1 : 2;
                assert_int_equal(nt__gemm_set_isa(isa), 0);
                assert_int_equal(nt__gemm_set_threads(th), 0);
                memcpy(got, pad, sizeof(float) * (size_t)M * ldc);
                nt__gemm_ex(M, N, K, rowa ? Ar : A, rowa ? ldr : lda, rowa, bcol ? Bt : B,
                            bcol ? ldt : ldb, bcol, got, ldc);
                int bad = differ(got, ref, (size_t)M * ldc);
                if (bad)
                    print_message("# prefetching gemm_ex (A %s, B %s) %dx%dx%d on %s, %d "
                                  "thread(s): %d elements differ\n",
                                  rowa ? "row-major" : "transposed",
                                  bcol ? "transposed" : "row-major", M, N, K,
                                  nt__gemm_isa_label(isa), th, bad);
                assert_int_equal(bad, 0);
            }
        free(A), free(B), free(ref), free(pad), free(got), free(Ar), free(Bt);
    }
    nt__gemm_set_prefetch(false);
    nt__gemm_set_threads(0);
    nt__gemm_set_isa(-1);
}

/* The other layout of a K x R bf16 matrix (rows lds apart): R x K into dh,
 * rows ldd apart, and its values as f32 into df; the ldd - K columns of
 * padding hold a NaN, which no product may read. */
static void bf16_transpose(const uint16_t *src, int K, int R, int lds, int ldd, uint16_t *dh,
                           float *df)
{
    for (int i = 0; i < R; i++)
        for (int k = 0; k < ldd; k++) {
            dh[(long)i * ldd + k] = k < K ? src[(long)k * lds + i] : 0x7fc1;
            df[(long)i * ldd + k] = nt__bf16_to_f32(dh[(long)i * ldd + k]);
        }
}

/* nt__gemm_typed: bf16 operands packed straight into the f32 panels and
 * the result rounded to bf16 block by block must give the bits of widening
 * both operands to f32, the naive order and one rounding of C (f32: NaNs
 * made canonical), in every layout, mixed with f32 operands, on every
 * level and 1 and 2 threads; with no memory for the panels it writes
 * nothing and says so; a dtype it does not take is refused. */
static void test_typed_every_level(void **state)
{
    (void)state;
    static const int shapes[][3] = {
        {1, 1, 129}, {13, 33, 300}, {97, 257, 385}, {128, 1024, 300}, {390, 700, 130}, {5, 7, 0},
    };
    int best = nt__gemm_isa_best();
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = M + 1, ldb = N + 7, ldc = N + 3, ldr = K + 2, ldt = K + 5;
        size_t na = (size_t)K * lda + 1, nb = (size_t)K * ldb + 1, nc = (size_t)M * ldc;
        /* values that bf16 holds exactly: A, B as floats and as bf16, in
         * both layouts each */
        float *A = vals(na), *B = vals(nb);
        uint16_t *Ah = malloc(2 * na), *Bh = malloc(2 * nb);
        uint16_t *Arh = malloc(2 * ((size_t)M * ldr + 1)), *Bth = malloc(2 * ((size_t)N * ldt + 1));
        float *Ar = malloc(4 * ((size_t)M * ldr + 1)), *Bt = malloc(4 * ((size_t)N * ldt + 1));
        for (size_t i = 0; i < na; i++)
            Ah[i] = nt__f32_to_bf16(A[i]), A[i] = nt__bf16_to_f32(Ah[i]);
        for (size_t i = 0; i < nb; i++)
            Bh[i] = nt__f32_to_bf16(B[i]), B[i] = nt__bf16_to_f32(Bh[i]);
        bf16_transpose(Ah, K, M, lda, ldr, Arh, Ar);
        bf16_transpose(Bh, K, N, ldb, ldt, Bth, Bt);
        float *ref2 = malloc(4 * nc), *refb = malloc(4 * nc), *got = malloc(4 * nc);
        uint16_t *refh2 = malloc(2 * nc), *refbh = malloc(2 * nc), *goth = malloc(2 * nc);
        naive_typed(M, N, K, A, lda, B, ldb, ref2, refh2, ldc, false);
        naive_typed(M, N, K, A, lda, B, ldb, refb, refbh, ldc, true); /* bf16 x bf16 */
        for (int isa = 0; isa <= best; isa++)
            for (int th = 1; th <= 2; th++)
                for (int lay = 0; lay < 16; lay++) {
                    bool rowa = lay & 1, bcol = lay & 2, a16 = !(lay & 4), o16 = lay & 8;
                    bool b16 = a16 ? (lay & 8) || rowa : true; /* mixed pairs too */
                    assert_int_equal(nt__gemm_set_isa(isa), 0);
                    assert_int_equal(nt__gemm_set_threads(th), 0);
                    const void *a = rowa ? (a16 ? (const void *)Arh : Ar)
                                         : (a16 ? (const void *)Ah : A);
                    const void *b = bcol ? (b16 ? (const void *)Bth : Bt)
                                         : (b16 ? (const void *)Bh : B);
                    memset(got, 0x55, 4 * nc);
                    memset(goth, 0x55, 2 * nc);
                    int rc = nt__gemm_typed(M, N, K, a, rowa ? ldr : lda, rowa,
                                            a16 ? NT_BF16 : NT_F32, b, bcol ? ldt : ldb, bcol,
                                            b16 ? NT_BF16 : NT_F32, got, ldc,
                                            o16 ? (void *)goth : NULL, o16 ? NT_BF16 : NT_F32);
                    assert_int_equal(rc, 0);
                    const float *ref = a16 && b16 ? refb : ref2;
                    const uint16_t *refh = a16 && b16 ? refbh : refh2;
                    int bad = typed_rows_differ(M, N, ldc, o16, got, ref, goth, refh);
                    if (bad)
                        print_message("# gemm_typed %dx%dx%d A %s %s, B %s %s, out %s, %s, %d "
                                      "thread(s): %d rows differ\n",
                                      M, N, K, a16 ? "bf16" : "f32", rowa ? "rows" : "cols",
                                      b16 ? "bf16" : "f32", bcol ? "cols" : "rows",
                                      o16 ? "bf16" : "f32", nt__gemm_isa_label(isa), th, bad);
                    assert_int_equal(bad, 0);
                }
        /* no memory for the f32 path's panels: -1, nothing written (bf16 x
         * bf16 products have their own path: still done); a dtype it does
         * not take: -1 */
        if (K > 0) {
            nt__gemm_set_panel_cap(1);
            memset(goth, 0x55, 2 * nc);
            assert_int_equal(nt__gemm_typed(M, N, K, A, lda, false, NT_F32, Bh, ldb, false,
                                            NT_BF16, got, ldc, goth, NT_BF16),
                             -1);
            for (size_t i = 0; i < nc; i++)
                assert_int_equal(goth[i], 0x5555);
            assert_int_equal(nt__gemm_typed(M, N, K, Ah, lda, false, NT_BF16, Bh, ldb, false,
                                            NT_BF16, got, ldc, goth, NT_BF16),
                             0);
            assert_int_equal(typed_rows_differ(M, N, ldc, true, got, refb, goth, refbh), 0);
            nt__gemm_set_panel_cap(0);
        }
        assert_int_equal(nt__gemm_typed(M, N, K, Ah, lda, false, NT_F16, Bh, ldb, false, NT_BF16,
                                        got, ldc, goth, NT_BF16),
                         -1);
        free(A), free(B), free(Ah), free(Bh), free(Arh), free(Bth), free(Ar), free(Bt);
        free(ref2), free(refb), free(got), free(refh2), free(refbh), free(goth);
    }
    nt__gemm_set_isa(-1);
    nt__gemm_set_threads(0);
}

/* nt_matmul on bf16 tensors (autocast's matmuls) in every layout the
 * CPU kernel takes in place (row-major, transposed view) and one it widens
 * first (a strided slice), with bf16 and f32 results, against the same
 * product of the widened f32 tensors rounded once; and the same when the
 * host has no memory for the GEMM's panels (the kernel then widens the
 * operands itself): the same bits. */
static void test_matmul_bf16(void **state)
{
    (void)state;
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    const int64_t M = 37, K = 300, N = 45;
    float *a = vals((size_t)(M * K * 2)), *b = vals((size_t)(K * N * 2));
    for (int64_t i = 0; i < M * K * 2; i++)
        a[i] = isinf(a[i]) || fabsf(a[i]) > 1 ? 0.5f : a[i];
    for (int64_t i = 0; i < K * N * 2; i++)
        b[i] = isinf(b[i]) || fabsf(b[i]) > 1 ? -0.25f : b[i];
    size_t n = (size_t)(M * N);
    float *want = malloc(4 * n), *got = malloc(4 * n);
    for (int cap = 0; cap < 2; cap++)
        for (int lay = 0; lay < 3; lay++) {
            /* a [M, 2K]: every second column (a strided slice, widened by
             * the kernel), or a [M, K] / its transpose's transpose */
            nt_tensor *fa = lay == 2 ? nt_from_host(a, NT_F32, 2, (int64_t[]){M, 2 * K})
                          : lay == 1 ? nt_from_host(a, NT_F32, 2, (int64_t[]){K, M})
                                     : nt_from_host(a, NT_F32, 2, (int64_t[]){M, K});
            nt_tensor *fb = lay == 1 ? nt_from_host(b, NT_F32, 2, (int64_t[]){N, K})
                                     : nt_from_host(b, NT_F32, 2, (int64_t[]){K, N});
            nt_tensor *ha = nt_cast(fa, NT_BF16), *hb = nt_cast(fb, NT_BF16);
            nt_tensor *wa = nt_cast(ha, NT_F32), *wb = nt_cast(hb, NT_F32);
            nt_tensor *va[2], *vb[2];
            nt_tensor *src[2][2] = {{wa, wb}, {ha, hb}};
            for (int t = 0; t < 2; t++) {
                va[t] = lay == 2 ? nt_slice(src[t][0], 1, 0, 2 * K, 2)
                      : lay == 1 ? nt_transpose(src[t][0], 0, 1)
                                 : nt_retain(src[t][0]);
                vb[t] = lay == 1 ? nt_transpose(src[t][1], 0, 1) : nt_retain(src[t][1]);
            }
            nt__gemm_set_panel_cap(cap ? 16 : 0);
            nt_tensor *yh = nt_matmul(va[1], vb[1]); /* bf16 product */
            nt_tensor *yhf = nt_cast(yh, NT_F32);
            assert_non_null(yhf);
            assert_int_equal(nt_to_host(yhf, got, 4 * n), 0);
            /* the reference: the bf16 definition on the widened values
             * (contiguous copies of the views: A^T [K, M], B [K, N]) */
            nt_tensor *vt = nt_transpose(va[0], 0, 1), *at = nt_contiguous(vt),
                      *bc = nt_contiguous(vb[0]);
            float *hat = malloc(4 * (size_t)(K * M)), *hbc = malloc(4 * (size_t)(K * N));
            assert_int_equal(nt_to_host(at, hat, 4 * (size_t)(K * M)), 0);
            assert_int_equal(nt_to_host(bc, hbc, 4 * (size_t)(K * N)), 0);
            naive_bf16((int)M, (int)N, (int)K, hat, (int)M, hbc, (int)N, want, (int)N);
            for (size_t i = 0; i < n; i++)
                want[i] = nt__bf16_to_f32(nt__f32_to_bf16(want[i]));
            free(hat), free(hbc);
            nt_release(vt), nt_release(at), nt_release(bc);
            nt__gemm_set_panel_cap(0);
            int bad = differ(got, want, n);
            if (bad)
                print_message("# bf16 nt_matmul, layout %d, panel cap %d: %d elements differ\n",
                              lay, cap, bad);
            assert_int_equal(bad, 0);
            nt_release(yh), nt_release(yhf);
            for (int t = 0; t < 2; t++)
                nt_release(va[t]), nt_release(vb[t]);
            nt_release(fa), nt_release(fb), nt_release(ha), nt_release(hb), nt_release(wa),
                nt_release(wb);
        }
    free(a), free(b), free(want), free(got);
}

/* Through the public API with NT_CPU_ISA: batched operands, a transposed
 * and a sliced view, on both backends; every level the same bits. */
static void test_matmul_every_level(void **state)
{
    (void)state;
    const int64_t Bt = 3, M = 37, K = 300, N = 45;
    float *a = vals((size_t)(Bt * K * M)), *b = vals((size_t)(K * (N + 10)));
    for (size_t i = 0; i < (size_t)(Bt * K * M); i++)
        a[i] = isinf(a[i]) || fabsf(a[i]) > 1 ? 0.5f : a[i]; /* finite sums to compare */
    for (size_t i = 0; i < (size_t)(K * (N + 10)); i++)
        b[i] = isinf(b[i]) || fabsf(b[i]) > 1 ? -0.25f : b[i];
    /* the same values row-major, [3, M, K]: the in-place row-major path */
    float *arm = malloc(sizeof(float) * (size_t)(Bt * K * M));
    for (int64_t q = 0; q < Bt; q++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t k = 0; k < K; k++)
                arm[(q * M + i) * K + k] = a[(q * K + k) * M + i];
    size_t n = (size_t)(Bt * M * N);
    float *first = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    static const char *backends[] = {"cpu", "sim"};
    int best = nt__gemm_isa_best();
    for (int be = 0; be < 2; be++) {
        assert_int_equal(nt_config_set("NT_BACKEND", backends[be]), 0);
        for (int isa = 0; isa <= best; isa++)
            for (int rm = 0; rm < 2; rm++) {
                assert_int_equal(nt_config_set("NT_CPU_ISA", nt__gemm_isa_label(isa)), 0);
                /* a: [3, K, M] stored, used as its transpose [3, M, K] (or the
                 * row-major copy); b: the first N of N + 10 columns */
                nt_tensor *ta = rm ? nt_from_host(arm, NT_F32, 3, (int64_t[]){Bt, M, K})
                                   : nt_from_host(a, NT_F32, 3, (int64_t[]){Bt, K, M});
                nt_tensor *tb = nt_from_host(b, NT_F32, 2, (int64_t[]){K, N + 10});
                nt_tensor *at = rm ? nt_retain(ta) : nt_transpose(ta, 1, 2);
                nt_tensor *bs = nt_slice(tb, 1, 0, N, 1);
                nt_tensor *y = nt_matmul(at, bs);
                assert_non_null(y);
                assert_int_equal(nt_to_host(y, got, n * sizeof(float)), 0);
                if (be == 0 && isa == 0 && rm == 0) {
                    memcpy(first, got, n * sizeof(float));
                    /* and the naive order, batch by batch */
                    float *ref = malloc((size_t)(M * N) * sizeof(float));
                    for (int64_t q = 0; q < Bt; q++) {
                        naive((int)M, (int)N, (int)K, a + q * K * M, (int)M, b, (int)(N + 10),
                              ref, (int)N);
                        assert_int_equal(differ(ref, got + q * M * N, (size_t)(M * N)), 0);
                    }
                    free(ref);
                }
                int bad = differ(got, first, n);
                if (bad)
                    print_message("# nt_matmul on %s, %s, a %s: %d elements differ\n",
                                  backends[be], nt__gemm_isa_label(isa),
                                  rm ? "row-major" : "transposed", bad);
                assert_int_equal(bad, 0);
                nt_release(y), nt_release(at), nt_release(bs), nt_release(ta), nt_release(tb);
            }
    }
    free(a), free(b), free(first), free(got), free(arm);
}

/* A row-major a of several batches against one b (x @ w^T on [B, T, C])
 * runs as one product of all the rows (cpu/matmul.c): the same bits as
 * each batch's own product, for two batch dims, a bf16 a and result (the
 * typed path), and a sliced a whose batches do not follow one another
 * (not folded), on the CPU backend at every level. */
static void test_matmul_fold(void **state)
{
    (void)state;
    const int64_t B0 = 3, B1 = 2, M = 13, Mp = 16, K = 140, N = 37;
    float *a = vals((size_t)(B0 * B1 * Mp * K)), *b = vals((size_t)(K * N));
    for (size_t i = 0; i < (size_t)(B0 * B1 * Mp * K); i++)
        a[i] = isinf(a[i]) || fabsf(a[i]) > 1 ? 0.5f : a[i];
    for (size_t i = 0; i < (size_t)(K * N); i++)
        b[i] = isinf(b[i]) || fabsf(b[i]) > 1 ? -0.25f : b[i];
    size_t n = (size_t)(B0 * B1 * M * N);
    float *got = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    int best = nt__gemm_isa_best();
    for (int isa = 0; isa <= best; isa++)
        for (int v = 0; v < 3; v++) { /* contiguous f32, bf16, sliced f32 */
            assert_int_equal(nt_config_set("NT_CPU_ISA", nt__gemm_isa_label(isa)), 0);
            nt_scope *sc = nt_scope_begin(); /* releases the views made below */
            nt_tensor *ta = nt_from_host(a, NT_F32, 4, (int64_t[]){B0, B1, Mp, K});
            nt_tensor *tb = nt_from_host(b, NT_F32, 2, (int64_t[]){K, N});
            nt_tensor *x = v == 2 ? nt_slice(ta, 2, 1, 1 + M, 1)
                                  : nt_reshape(nt_slice(nt_reshape(ta, 2, (int64_t[]){
                                                            B0 * B1 * Mp, K}),
                                                        0, 0, B0 * B1 * M, 1),
                                               4, (int64_t[]){B0, B1, M, K});
            nt_tensor *w = nt_retain(tb);
            if (v == 1)
                x = nt_cast(x, NT_BF16), w = nt_cast(w, NT_BF16);
            nt_tensor *y = nt_matmul(x, w);
            assert_non_null(y);
            if (v == 1)
                y = nt_cast(y, NT_F32);
            assert_int_equal(nt_to_host(y, got, n * sizeof(float)), 0);
            for (int64_t q = 0; q < B0 * B1; q++) { /* batch by batch: 2-D products */
                nt_tensor *xq = nt_reshape(x, 3, (int64_t[]){B0 * B1, M, K});
                nt_tensor *yq = nt_matmul(nt_slice(nt_slice(xq, 0, q, q + 1, 1), 0, 0, 1, 1), w);
                yq = nt_reshape(yq, 2, (int64_t[]){M, N});
                if (v == 1)
                    yq = nt_cast(yq, NT_F32);
                assert_int_equal(nt_to_host(yq, ref + q * M * N, (size_t)(M * N) * sizeof(float)),
                                 0);
            }
            int bad = differ(got, ref, n);
            if (bad)
                print_message("# folded matmul (%s) on %s: %d elements differ\n",
                              v == 0 ? "f32" : v == 1 ? "bf16" : "sliced", nt__gemm_isa_label(isa),
                              bad);
            assert_int_equal(bad, 0);
            nt_scope_end(sc);
        }
    free(a), free(b), free(got), free(ref);
}

/* Batched products whose operands are used in place and whose result is
 * f32 run whole batches per thread (cpu/matmul.c, mm_batches): a weight
 * gradient's a^T . g per sequence ([B, C, T] transposed view of a [B, T,
 * C] activation against g [B, T, N]), a row-major a, a broadcast b, two
 * batch dims with one broadcast, b given transposed, sizes around
 * the kernels' edges and K over one K-tile -- each batch bit for bit the
 * naive recurrence, on every level, one thread and two; and b with its
 * columns 2 apart, packed into scratch first, which keeps the batch
 * loop: the same bits. */
static void test_matmul_batches(void **state)
{
    (void)state;
    static const int shp[][4] = {/* batches, M, N, K */
                                 {16, 13, 37, 40}, {5, 128, 45, 130}, {3, 25, 140, 257},
                                 {7, 1, 1, 1},     {2, 200, 33, 20}};
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
    int best = nt__gemm_isa_best();
    for (size_t si = 0; si < sizeof shp / sizeof *shp; si++) {
        const int64_t Bt = shp[si][0], M = shp[si][1], N = shp[si][2], K = shp[si][3];
        /* a stored [Bt, K, M] (used transposed) and row-major [Bt, M, K]; b [Bt, K, N] */
        float *a = vals((size_t)(Bt * K * M)), *b = vals((size_t)(Bt * K * N));
        float *bt = malloc(sizeof(float) * (size_t)(Bt * K * N));
        for (int64_t q = 0; q < Bt; q++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = 0; j < N; j++)
                    bt[(q * N + j) * K + k] = b[(q * K + k) * N + j];
        float *arm = malloc(sizeof(float) * (size_t)(Bt * K * M));
        for (int64_t q = 0; q < Bt; q++)
            for (int64_t i = 0; i < M; i++)
                for (int64_t k = 0; k < K; k++)
                    arm[(q * M + i) * K + k] = a[(q * K + k) * M + i];
        float *b2 = malloc(sizeof(float) * (size_t)(Bt * K * 2 * N)); /* b between NaNs */
        for (size_t i = 0; i < (size_t)(Bt * K * N); i++)
            b2[2 * i] = b[i], b2[2 * i + 1] = NAN;
        size_t n = (size_t)(Bt * M * N);
        float *ref = malloc(n * sizeof(float)), *refb = malloc(n * sizeof(float));
        float *got = malloc(n * sizeof(float));
        for (int64_t q = 0; q < Bt; q++) { /* b batched, and b's batch 0 for all */
            naive((int)M, (int)N, (int)K, a + q * K * M, (int)M, b + q * K * N, (int)N,
                  ref + q * M * N, (int)N);
            naive((int)M, (int)N, (int)K, a + q * K * M, (int)M, b, (int)N, refb + q * M * N,
                  (int)N);
        }
        for (size_t i = 0; i < n; i++)
            ref[i] = nt__canon(ref[i]), refb[i] = nt__canon(refb[i]);
        for (int isa = 0; isa <= best; isa++)
            for (int th = 1; th <= 2; th++)
                for (int v = 0; v < 6; v++) {
                    assert_int_equal(nt_config_set("NT_CPU_ISA", nt__gemm_isa_label(isa)), 0);
                    assert_int_equal(nt_config_set("NT_CPU_THREADS", th == 1 ? "1" : "2"), 0);
                    nt_scope *sc = nt_scope_begin();
                    nt_tensor *ta = nt_from_host(a, NT_F32, 3, (int64_t[]){Bt, K, M});
                    nt_tensor *tr = nt_from_host(arm, NT_F32, 3, (int64_t[]){Bt, M, K});
                    nt_tensor *tb = nt_from_host(b, NT_F32, 3, (int64_t[]){Bt, K, N});
                    nt_tensor *x = v == 1 ? tr : nt_transpose(ta, 1, 2), *w = tb, *y;
                    const float *want = ref;
                    if (v == 2) /* one b for every batch (a broadcast batch dim) */
                        w = nt_slice(tb, 0, 0, 1, 1), want = refb;
                    if (v == 3) { /* [Bt, 1] batches of a against b's [1, 1]: broadcast */
                        x = nt_reshape(tr, 4, (int64_t[]){Bt, 1, M, K});
                        w = nt_reshape(nt_slice(tb, 0, 0, 1, 1), 4, (int64_t[]){1, 1, K, N});
                        want = refb;
                    }
                    if (v == 4) /* b^T stored, [Bt, N, K] (x @ w^T per batch) */
                        w = nt_transpose(nt_from_host(bt, NT_F32, 3, (int64_t[]){Bt, N, K}), 1,
                                         2);
                    if (v == 5) { /* b's columns 2 apart: packed into scratch first */
                        nt_tensor *t2 = nt_from_host(b2, NT_F32, 3, (int64_t[]){Bt, K, 2 * N});
                        w = nt_slice(t2, 2, 0, 2 * N, 2);
                    }
                    y = nt_matmul(x, w);
                    if (!y)
                        print_message("# case %d: %s\n", v, nt_last_error_message());
                    assert_non_null(y);
                    assert_int_equal(nt_to_host(y, got, n * sizeof(float)), 0);
                    int bad = differ(got, want, n);
                    if (bad)
                        print_message("# batched matmul %dx%dx%dx%d (case %d) on %s, %d "
                                      "thread(s): %d elements differ\n",
                                      (int)Bt, (int)M, (int)N, (int)K, v, nt__gemm_isa_label(isa),
                                      th, bad);
                    assert_int_equal(bad, 0);
                    nt_scope_end(sc);
                }
        free(a), free(b), free(bt), free(b2), free(arm), free(ref), free(refb), free(got);
    }
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "2"), 0);
    assert_int_equal(nt_config_set("NT_CPU_ISA", nt__gemm_isa_label(best)), 0);
}

/* 20 AdamW steps of a small MLP (ragged sizes: 100-160-10, batch 40) on
 * every level, both backends, every mode, and on the simulator with its
 * values per instruction and per program, and at the AVX-512 level with
 * subnormal assists taken as measured, as costly and as cheap: the
 * parameters come out the same bit for bit (issue 11's "every dispatch
 * path" check at unit-test scale). */
static int m_in = 100, m_hid = 160, m_batch = 40; /* the MLP train() builds */
static const char *m_threads = "2";                 /* NT_CPU_THREADS */

static void train(const char *backend, const char *isa, const char *mode, float *out, size_t n)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_CPU_ISA", isa), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_CPU_THREADS", m_threads), 0);
    const int64_t shp[4][2] = {{m_hid, m_in}, {m_hid, 1}, {10, m_hid}, {10, 1}};
    nt_tensor *p[4];
    for (int i = 0; i < 4; i++) {
        int nd = shp[i][1] == 1 ? 1 : 2;
        nt_tensor *u = nt_rand(NT_F32, nd, shp[i], 100 + (uint64_t)i);
        p[i] = nt_mul_scalar(nt_add_scalar(u, -0.5), 0.2);
        nt_release(u);
        assert_int_equal(nt_set_requires_grad(p[i], true), 0);
    }
    nt_tensor *x = nt_rand(NT_F32, 2, (int64_t[]){m_batch, m_in}, 7);
    int32_t lab[64];
    assert_true(m_batch <= 64);
    for (int i = 0; i < m_batch; i++)
        lab[i] = (i * 7) % 10;
    nt_tensor *y = nt_from_host(lab, NT_I32, 1, (int64_t[]){m_batch});
    nt_optim *opt = nt_optim_adamw(p, 4, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    assert_non_null(opt);
    for (int step = 0; step < 20; step++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *h = nt_relu(nt_linear(x, p[0], p[1]));
        nt_tensor *loss = nt_cross_entropy(nt_linear(h, p[2], p[3]), y);
        assert_int_equal(nt_backward(loss), 0);
        assert_int_equal(nt_optim_step(opt), 0);
        assert_int_equal(nt_optim_zero_grad(opt), 0);
        nt_scope_end(sc);
    }
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        size_t k = (size_t)(shp[i][0] * shp[i][1]);
        assert_true(off + k <= n);
        assert_int_equal(nt_to_host(p[i], out + off, k * sizeof(float)), 0);
        off += k;
    }
    nt_optim_destroy(opt);
    for (int i = 0; i < 4; i++)
        nt_release(p[i]);
    nt_release(x), nt_release(y);
}

static void test_train_every_level(void **state)
{
    (void)state;
    const size_t n = 160 * 100 + 160 + 10 * 160 + 10;
    float *first = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    /* the simulator twice: values per instruction, then once per program */
    static const char *backends[] = {"cpu", "sim", "sim"};
    static const char *modes[] = {"eager", "adaptive", "lazy", "deterministic"};
    bool pv0 = nt__sim_program_values();
    int best = nt__gemm_isa_best(), runs = 0;
    for (int be = 0; be < 3; be++) {
        nt__sim_set_program_values(be == 2);
        for (int m = 0; m < 4; m++)
            for (int isa = 0; isa <= best; isa++)
                /* at the AVX-512 level, subnormal assists taken as costly
                 * and as cheap too (cpu/subnormal.h: FTZ runs redone, or
                 * the plain operations) */
                for (int as = -1; as < (isa == NT_ISA_AVX512 ? 2 : 0); as++) {
                    nt__sn_set_assists(as);
                    train(backends[be], nt__gemm_isa_label(isa), modes[m], runs ? got : first,
                          n);
                    if (runs++) {
                        int bad = differ(got, first, n);
                        if (bad)
                            print_message("# training on %s%s, %s, %s, assists %s: %d "
                                          "parameters differ\n",
                                          backends[be], be == 2 ? " (values per program)" : "",
                                          modes[m], nt__gemm_isa_label(isa),
                                          as < 0 ? "as measured" : as ? "cheap" : "costly", bad);
                        assert_int_equal(bad, 0);
                    }
                }
    }
    nt__sn_set_assists(-1);
    nt__sim_set_program_values(pv0);
    free(first), free(got);
}

/* The same training on 1 and 2 host threads (NT_CPU_THREADS), with a
 * model whose calls are big enough to be split (the first layer's products
 * are 4 Mi multiply-adds, its AdamW programs 128 Ki elements: two blocks
 * each), on both backends in every mode, at the widest ISA level (and the
 * portable one once): the parameters come out the same bit for bit. */
static void test_train_threads(void **state)
{
    (void)state;
    m_in = 256, m_hid = 512, m_batch = 32;
    const size_t n = 512 * 256 + 512 + 10 * 512 + 10;
    float *first = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    static const char *backends[] = {"cpu", "sim", "sim"};
    static const char *modes[] = {"eager", "adaptive", "lazy", "deterministic"};
    bool pv0 = nt__sim_program_values();
    int isas[2] = {nt__gemm_isa_best(), NT_ISA_SCALAR}, runs = 0;
    for (int be = 0; be < 3; be++) {
        nt__sim_set_program_values(be == 2);
        for (int m = 0; m < 4; m++)
            for (int i = 0; i < (be == 0 && m == 1 ? 2 : 1); i++)
                for (int th = 1; th <= 2; th++) {
                    m_threads = th == 1 ? "1" : "2";
                    train(backends[be], nt__gemm_isa_label(isas[i]), modes[m],
                          runs ? got : first, n);
                    if (runs++) {
                        int bad = differ(got, first, n);
                        if (bad)
                            print_message("# training on %s%s, %s, %s, %d thread(s): %d "
                                          "parameters differ\n",
                                          backends[be], be == 2 ? " (values per program)" : "",
                                          modes[m], nt__gemm_isa_label(isas[i]), th, bad);
                        assert_int_equal(bad, 0);
                    }
                }
    }
    assert_string_equal(nt_config_get("NT_CPU_THREADS"), "2");
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "1"), 0);
    assert_string_equal(nt_config_get("NT_CPU_THREADS"), "1");
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "3"), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "NT_CPU_THREADS: expected auto, 1 or 2"));
    nt_clear_error();
    assert_int_equal(nt_config_set("NT_CPU_THREADS", "auto"), 0);
    assert_string_equal(nt_config_get("NT_CPU_THREADS"), "2");
    nt__sim_set_program_values(pv0);
    m_in = 100, m_hid = 160, m_batch = 40, m_threads = "2";
    free(first), free(got);
}

/* ---------------- bf16 x bf16 on vdpbf16ps (core/gemm_dpbf16.c) ---------------- */

/* bf16 bits, normal, exponents 2^-20 .. 2^19, either sign; a few signed
 * zeros. */
static uint16_t rbf(void)
{
    uint32_t r = nt_test_rand32(&rng_state);
    if (r % 61 == 0)
        return r & 0x100 ? 0x8000 : 0x0000;
    return (uint16_t)((r >> 20 & 0x8000) | ((107 + (r >> 8) % 40) << 7) | (r & 0x7f));
}

/* The products a path took so far (dp_check's *took). */
static unsigned long (*path_calls)(void) = nt__gemm_dpbf16_calls;

/* nt__gemm_typed on bf16 x bf16 (A K x M, lda; B K x N, ldb; both layouts
 * made here), out f32 or bf16, against the bf16 definition on the widened
 * values: 0 when every element matches; *took: the call went through the
 * path path_calls counts (vdpbf16ps, or AMX). */
static int dp_check(int M, int N, int K, const uint16_t *Ah, int lda, const uint16_t *Bh, int ldb,
                    bool rowa, bool bcol, bool o16, bool *took)
{
    int ldc = N + 3, ldr = K + 1, ldt = K + 3;
    size_t nc = (size_t)M * ldc;
    float *A = malloc(4 * ((size_t)K * lda + 1)), *B = malloc(4 * ((size_t)K * ldb + 1));
    uint16_t *Ar = malloc(2 * ((size_t)M * ldr + 1)), *Bt = malloc(2 * ((size_t)N * ldt + 1));
    for (size_t i = 0; i < (size_t)K * lda; i++)
        A[i] = nt__bf16_to_f32(Ah[i]);
    for (size_t i = 0; i < (size_t)K * ldb; i++)
        B[i] = nt__bf16_to_f32(Bh[i]);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < ldr; k++)
            Ar[(long)i * ldr + k] = k < K ? Ah[(long)k * lda + i] : 0x7fc1; /* never read */
    for (int j = 0; j < N; j++)
        for (int k = 0; k < ldt; k++)
            Bt[(long)j * ldt + k] = k < K ? Bh[(long)k * ldb + j] : 0x7fc1;
    float *ref = malloc(4 * nc), *got = malloc(4 * nc);
    uint16_t *refh = malloc(2 * nc), *goth = malloc(2 * nc);
    naive_typed(M, N, K, A, lda, B, ldb, ref, refh, ldc, true);
    memset(got, 0x55, 4 * nc);
    memset(goth, 0x55, 2 * nc);
    unsigned long c0 = path_calls();
    int rc = nt__gemm_typed(M, N, K, rowa ? (const void *)Ar : Ah, rowa ? ldr : lda, rowa, NT_BF16,
                            bcol ? (const void *)Bt : Bh, bcol ? ldt : ldb, bcol, NT_BF16, got,
                            ldc, o16 ? (void *)goth : NULL, o16 ? NT_BF16 : NT_F32);
    *took = path_calls() != c0;
    assert_int_equal(rc, 0);
    int bad = typed_rows_differ(M, N, ldc, o16, got, ref, goth, refh);
    if (bad)
        print_message("# dpbf16 %dx%dx%d, A %s, B %s, out %s: %d rows differ\n", M, N, K,
                      rowa ? "rows" : "cols", bcol ? "cols" : "rows", o16 ? "bf16" : "f32", bad);
    free(A), free(B), free(Ar), free(Bt), free(ref), free(got), free(refh), free(goth);
    return bad;
}

/* The path (forced on where the CPU runs it, whatever its speed here) on
 * shapes around its edges -- K = 1, odd K (the pad), K-tile edges, tails
 * of M and N, both layouts of each operand, f32 and bf16 results, 1 and 2
 * threads -- gives the naive recurrence's bits; at every level below
 * AVX-512, and when forced off, the call takes the f32 path (same bits).
 * Where the CPU lacks AVX512_BF16 (or its self-test fails) forcing it on
 * is refused. */
static void test_dpbf16_shapes(void **state)
{
    (void)state;
    bool has = false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    has = __builtin_cpu_supports("avx512bf16") && nt__gemm_isa_runs(NT_ISA_AVX512);
#endif
    /* the self-test passes on every CPU that has the instruction */
    assert_int_equal(nt__gemm_dpbf16_runs(), has);
    assert_int_equal(nt__gemm_set_amx(0), 0); /* it would take them first */
    assert_int_equal(nt__gemm_set_dpbf16(2), -1);
    assert_int_equal(nt__gemm_set_dpbf16(-2), -1);
    if (!has) {
        assert_int_equal(nt__gemm_set_dpbf16(1), -1);
        nt__gemm_set_amx(-1);
        return;
    }
    static const int shapes[][3] = {
        {1, 1, 1},    {1, 1, 2},     {3, 5, 3},     {13, 33, 1},    {12, 32, 64},
        {13, 33, 129}, {24, 64, 128}, {25, 70, 127}, {40, 50, 255}, {97, 257, 385},
        {7, 600, 784}, {128, 300, 257},
    };
    int best = nt__gemm_isa_best();
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], lda = M + 1, ldb = N + 5;
        /* sanitizer builds: one big (two-thread) shape, not three */
        if (getenv("NT_TEST_QUICK") && (M == 97 || M == 7))
            continue;
        uint16_t *Ah = malloc(2 * ((size_t)K * lda + 1)), *Bh = malloc(2 * ((size_t)K * ldb + 1));
        for (size_t i = 0; i < (size_t)K * lda; i++)
            Ah[i] = rbf();
        for (size_t i = 0; i < (size_t)K * ldb; i++)
            Bh[i] = rbf();
        for (int th = 1; th <= 2; th++)
            for (int lay = 0; lay < 8; lay++) {
                bool took;
                assert_int_equal(nt__gemm_set_threads(th), 0);
                assert_int_equal(nt__gemm_set_dpbf16(1), 0);
                assert_int_equal(dp_check(M, N, K, Ah, lda, Bh, ldb, lay & 1, lay & 2, lay & 4,
                                          &took),
                                 0);
                assert_true(took);
                /* forced off, and every level below AVX-512: the f32 path */
                assert_int_equal(nt__gemm_set_dpbf16(0), 0);
                assert_int_equal(dp_check(M, N, K, Ah, lda, Bh, ldb, lay & 1, lay & 2, lay & 4,
                                          &took),
                                 0);
                assert_false(took);
                assert_int_equal(nt__gemm_set_dpbf16(1), 0);
                for (int isa = 0; isa < NT_ISA_AVX512 && isa <= best && lay == 0; isa++) {
                    assert_int_equal(nt__gemm_set_isa(isa), 0);
                    assert_int_equal(dp_check(M, N, K, Ah, lda, Bh, ldb, false, false, false,
                                              &took),
                                     0);
                    assert_false(took);
                    assert_int_equal(nt__gemm_set_isa(-1), 0);
                }
            }
        free(Ah), free(Bh);
    }
    nt__gemm_set_dpbf16(-1);
    nt__gemm_set_amx(-1);
    nt__gemm_set_threads(0);
    nt__gemm_set_isa(-1);
}

/* Operands the instruction would not compute the recurrence's bits for
 * (it reads subnormals as 0, flushes subnormal results, and NaN payloads
 * are its own) must take the f32 path: a subnormal input, a pair whose
 * product is subnormal, products that cancel into the subnormal range,
 * Inf, NaN, a product that overflows, sums that could overflow; all give
 * the naive bits.  Ranges just inside the bounds take the path and give
 * them too. */
static void fallback_cases(const char *path)
{
    const int M = 20, N = 40, K = 131, lda = M, ldb = N;
    uint16_t *Ah = malloc(2 * (size_t)K * lda), *Bh = malloc(2 * (size_t)K * ldb);
    static const struct {
        const char *what;
        uint16_t a0, a1, b0, b1; /* A[0][0], A[1][0], B[0][0], B[1][0] */
        int scale;               /* added to every exponent of A and of B (biased) */
        bool takes;
        bool alone; /* C[0][0] is the pair's alone (A[k][0] = 0 past it): the
                       instruction's flushing to 0 would show */
    } cases[] = {
        {"plain values", 0x3f80, 0xbf80, 0x3f80, 0x3f80, 0, true, false},
        {"a subnormal input", 0x0001, 0x0000, 0x3f80, 0x3f80, 0, false, true},
        {"a subnormal product", 0x1c80, 0x0000, 0x2080, 0x3f80, 0, false, true},
        /* 2^-60 (1 + 2^-7) * 2^-60 - 2^-60 * 2^-60 = 2^-127 */
        {"sums cancelling below 2^-126", 0x2181, 0xa180, 0x2180, 0x2180, -60, false, true},
        {"an infinity", 0x7f80, 0xbf80, 0x3f80, 0x3f80, 0, false, false},
        {"a NaN", 0x3f80, 0xbf80, 0x7fc1, 0x3f80, 0, false, false},
        {"an overflowing product", 0x7180, 0xbf80, 0x7180, 0x3f80, 0, false, false},
        /* products below 2^122, but 256 of them could pass 2^127 */
        {"sums that may overflow", 0x3f80, 0xbf80, 0x3f80, 0x3f80, 41, false, false},
        /* the least exponents (2^-56 each) make q = 2^-126 exactly: taken */
        {"quantum 2^-126", 0x3f80, 0xbf80, 0x3f80, 0x3f80, -36, true, false},
        /* exponents up to 2^58: 256 products below 2^119 each */
        {"the greatest sums allowed", 0x3f80, 0xbf80, 0x3f80, 0x3f80, 39, true, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int rep = 0; rep < 3; rep++) {
            /* values with exponents [127 - 20, 127 + 19] shifted by scale
             * (rbf's range), A and B alike */
            for (size_t i = 0; i < (size_t)K * lda; i++) {
                uint16_t v = rbf();
                Ah[i] = (v & 0x7fff) ? (uint16_t)(v + cases[c].scale * 128) : v;
            }
            for (size_t i = 0; i < (size_t)K * ldb; i++) {
                uint16_t v = rbf();
                Bh[i] = (v & 0x7fff) ? (uint16_t)(v + cases[c].scale * 128) : v;
            }
            /* the case's elements at k = 0 and 1 of row 0 and column 0 (or,
             * rep 1, at the odd K's last k: the pair with the pad; rep 2, at
             * k = 0 and 1 of A's last row and B's last column: the last
             * panel of each, whose range the verdict must see too) */
            int k0 = rep == 1 ? K - 1 : 0, i0 = rep == 2 ? M - 1 : 0, j0 = rep == 2 ? N - 1 : 0;
            Ah[(long)k0 * lda + i0] = cases[c].a0, Bh[(long)k0 * ldb + j0] = cases[c].b0;
            if (rep != 1)
                Ah[lda + i0] = cases[c].a1, Bh[ldb + j0] = cases[c].b1;
            if (cases[c].alone && rep != 1)
                for (int k = 2; k < K; k++)
                    Ah[(long)k * lda + i0] = 0;
            for (int lay = 0; lay < 8; lay++) {
                bool took;
                assert_int_equal(dp_check(M, N, K, Ah, lda, Bh, ldb, lay & 1, lay & 2, lay & 4,
                                          &took),
                                 0);
                if (took != cases[c].takes)
                    print_message("# %s with %s (%d): %s\n", path, cases[c].what, rep,
                                  took ? "taken" : "not taken");
                assert_int_equal(took, cases[c].takes);
            }
        }
    }
    free(Ah), free(Bh);
}

static void test_dpbf16_fallback(void **state)
{
    (void)state;
    if (nt__gemm_set_dpbf16(1) != 0)
        return; /* this CPU does not run it (test_dpbf16_shapes checks why) */
    assert_int_equal(nt__gemm_set_amx(0), 0);
    path_calls = nt__gemm_dpbf16_calls;
    fallback_cases("dpbf16");
    nt__gemm_set_dpbf16(-1);
    nt__gemm_set_amx(-1);
}

/* 20 AdamW steps of the MLP under bf16 autocast on the CPU backend, 1 and
 * 2 threads: with the path forced on (taken by some of the products) the
 * parameters come out as with it off, bit for bit. */
static void test_dpbf16_train(void **state)
{
    (void)state;
    if (nt__gemm_set_dpbf16(1) != 0)
        return;
    assert_int_equal(nt__gemm_set_amx(0), 0);
    const size_t n = 160 * 100 + 160 + 10 * 160 + 10;
    float *first = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    int runs = 0;
    for (int th = 1; th <= 2; th++)
        for (int on = 0; on < 2; on++) {
            m_threads = th == 1 ? "1" : "2";
            assert_int_equal(nt__gemm_set_dpbf16(on), 0);
            unsigned long c0 = nt__gemm_dpbf16_calls();
            assert_int_equal(nt_autocast_begin(NT_BF16), 0);
            train("cpu", nt__gemm_isa_label(nt__gemm_isa_best()), "eager", runs ? got : first, n);
            assert_int_equal(nt_autocast_end(), 0);
            if (on)
                assert_true(nt__gemm_dpbf16_calls() > c0);
            else
                assert_true(nt__gemm_dpbf16_calls() == c0);
            if (runs++) {
                int bad = differ(got, first, n);
                if (bad)
                    print_message("# bf16 training, path %s, %d thread(s): %d parameters "
                                  "differ\n", on ? "on" : "off", th, bad);
                assert_int_equal(bad, 0);
            }
        }
    nt__gemm_set_dpbf16(-1);
    nt__gemm_set_amx(-1);
    m_threads = "2";
    free(first), free(got);
}

/* ---------------- bf16 x bf16: the chunked definition (core/gemm_bf16.c) ---------------- */

/* The paths of nt__gemm_bf16 a test forces: AMX, the FMA units at ISA
 * level isa (AMX and vdpbf16ps off), vdpbf16ps, the plain loop. */
enum { P_AMX, P_FMA, P_DP, P_PLAIN };

static void bf_path(int path, int isa)
{
    assert_int_equal(nt__gemm_set_isa(path == P_FMA ? isa : -1), 0);
    assert_int_equal(nt__gemm_set_amx(path == P_AMX ? 1 : 0), 0);
    assert_int_equal(nt__gemm_set_dpbf16(path == P_DP ? 1 : 0), 0);
    nt__gemm_bf16_set_plain(path == P_PLAIN);
}

static void bf_path_reset(void)
{
    nt__gemm_set_isa(-1);
    nt__gemm_set_amx(-1);
    nt__gemm_set_dpbf16(-1);
    nt__gemm_bf16_set_plain(false);
    nt__gemm_set_threads(0);
}

/* A 33 x 40 x 150 bf16 product that the settings made so far keep off
 * AMX: no AMX call, the definition's bits. */
static void bf_product_off_amx(void)
{
    enum { M = 33, N = 40, K = 150 };
    uint16_t Ah[K * M], Bh[K * N];
    float A[K * M], B[K * N], ref[M * N], got[M * N];
    for (int i = 0; i < K * M; i++)
        Ah[i] = rbf(), A[i] = nt__bf16_to_f32(Ah[i]);
    for (int i = 0; i < K * N; i++)
        Bh[i] = rbf(), B[i] = nt__bf16_to_f32(Bh[i]);
    naive_bf16(M, N, K, A, M, B, N, ref, N);
    unsigned long a0 = nt__gemm_amx_calls();
    nt__gemm_bf16(M, N, K, Ah, M, false, NT_BF16, Bh, N, false, NT_BF16, got, N, false, true,
                  NULL, NT_F32);
    assert_true(nt__gemm_amx_calls() == a0);
    assert_int_equal(differ(got, ref, M * N), 0);
}

/* Where this CPU or its kernel does not run AMX, what can be checked here:
 * forcing it on is refused and leaves the mode as it was (auto), and under
 * auto a bf16 product takes no AMX call and gives the definition's bits.
 * What the AMX kernel computes is checked where the CPU runs it (the rest
 * of each AMX test); cmocka's skip() would print "not ok # SKIP", which
 * meson and scripts/count_tests.py count as a failure. */
static void amx_refused(const char *test)
{
    assert_false(nt__gemm_amx_runs());
    assert_int_equal(nt__gemm_set_amx(1), -1);
    bf_product_off_amx();
    assert_int_equal(nt__gemm_set_amx(0), 0);
    assert_int_equal(nt__gemm_set_amx(-1), 0);
    print_message("# %s: AMX not run on this CPU or kernel; checked only that forcing it is "
                  "refused and a product keeps the definition's bits without it\n",
                  test);
}

/* Every shape: both layouts of each operand, acc on and off, f32 (NaNs
 * canonical) and bf16 results, bf16 storage (and widened f32 storage for
 * some), 1 and 2 threads, on the path forced: the bits of naive_bf16_acc. */
static void bf_shapes(int path, int isa)
{
    static const int shapes[][3] = {
        {1, 1, 1},     {1, 1, 15},    {1, 1, 16},     {2, 3, 17},      {16, 16, 16},
        {17, 33, 127}, {32, 32, 128}, {33, 31, 129},  {5, 300, 33},    {300, 1, 300},
        {64, 96, 700}, {97, 257, 385}, {128, 200, 784}, {257, 299, 640}, {7, 9, 0},
    };
    bool quick = getenv("NT_TEST_QUICK") != NULL;
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
        long macs = (long)M * N * K;
        if ((quick || path == P_PLAIN) && macs > 4000000)
            continue;
        int lda = M + 1, ldb = N + 5, ldc = N + 3, ldr = K + 2, ldt = K + 5;
        size_t na = (size_t)K * lda + 1, nb = (size_t)K * ldb + 1, nc = (size_t)M * ldc;
        uint16_t *Ah = malloc(2 * na), *Bh = malloc(2 * nb);
        uint16_t *Arh = malloc(2 * ((size_t)M * ldr + 1)), *Bth = malloc(2 * ((size_t)N * ldt + 1));
        float *A = malloc(4 * na), *B = malloc(4 * nb);
        float *Ar = malloc(4 * ((size_t)M * ldr + 1)), *Bt = malloc(4 * ((size_t)N * ldt + 1));
        for (size_t i = 0; i < na; i++)
            Ah[i] = rbf(), A[i] = nt__bf16_to_f32(Ah[i]);
        for (size_t i = 0; i < nb; i++)
            Bh[i] = rbf(), B[i] = nt__bf16_to_f32(Bh[i]);
        bf16_transpose(Ah, K, M, lda, ldr, Arh, Ar);
        bf16_transpose(Bh, K, N, ldb, ldt, Bth, Bt);
        /* C's starting values for acc; the references (acc off, on) */
        float *C0 = malloc(4 * nc), *ref[2], *got = malloc(4 * nc);
        uint16_t *refh[2], *goth = malloc(2 * nc);
        for (size_t i = 0; i < nc; i++)
            C0[i] = nt__bf16_to_f32(rbf());
        C0[0] = -0.0f; /* -0 + s: +0 where s is +0 (K = 0 too) */
        for (int acc = 0; acc < 2; acc++) {
            ref[acc] = malloc(4 * nc), refh[acc] = malloc(2 * nc);
            memcpy(ref[acc], C0, 4 * nc);
            naive_bf16_acc(M, N, K, A, lda, B, ldb, ref[acc], ldc, acc);
            for (int i = 0; i < M; i++)
                nt__st_f32((char *)(refh[acc] + (long)i * ldc), NT_BF16, 1,
                           ref[acc] + (long)i * ldc, N);
        }
        for (int th = 1; th <= 2; th++)
            for (int c = 0; c < 20; c++) {
                bool rowa = c & 1, bcol = c & 2, acc = c & 4, o16 = c & 8, f32s = c >= 16;
                assert_int_equal(nt__gemm_set_threads(th), 0);
                bf_path(path, isa);
                const void *a = rowa ? (f32s ? (const void *)Ar : Arh) : (f32s ? (const void *)A : Ah);
                const void *b = bcol ? (f32s ? (const void *)Bt : Bth) : (f32s ? (const void *)B : Bh);
                memcpy(got, C0, 4 * nc);
                memset(goth, 0x55, 2 * nc);
                unsigned long a0 = nt__gemm_amx_calls(), d0 = nt__gemm_dpbf16_calls();
                assert_int_equal(nt__gemm_bf16(M, N, K, a, rowa ? ldr : lda, rowa,
                                               f32s ? NT_F32 : NT_BF16, b, bcol ? ldt : ldb, bcol,
                                               f32s ? NT_F32 : NT_BF16, got, ldc, acc, true,
                                               o16 ? (void *)goth : NULL,
                                               o16 ? NT_BF16 : NT_F32),
                                 0);
                /* the forced path took it (AMX: either storage; rbf's range is
                 * inside the scan's bounds; vdpbf16ps does not accumulate) */
                if (K > 0 && path == P_AMX)
                    assert_true(nt__gemm_amx_calls() > a0);
                else
                    assert_true(nt__gemm_amx_calls() == a0);
                if (K > 0 && !f32s && !acc && path == P_DP)
                    assert_true(nt__gemm_dpbf16_calls() > d0);
                else
                    assert_true(nt__gemm_dpbf16_calls() == d0);
                int bad = typed_rows_differ(M, N, ldc, o16, got, ref[acc], goth, refh[acc]);
                if (bad)
                    print_message("# bf16 %dx%dx%d path %d (isa %d), A %s, B %s, acc %d, out %s, "
                                  "%s storage, %d thread(s): %d rows differ\n",
                                  M, N, K, path, isa, rowa ? "rows" : "cols",
                                  bcol ? "cols" : "rows", acc, o16 ? "bf16" : "f32",
                                  f32s ? "f32" : "bf16", th, bad);
                assert_int_equal(bad, 0);
            }
        free(Ah), free(Bh), free(Arh), free(Bth), free(A), free(B), free(Ar), free(Bt);
        free(C0), free(got), free(goth);
        for (int acc = 0; acc < 2; acc++)
            free(ref[acc]), free(refh[acc]);
    }
    bf_path_reset();
}

/* The FMA units at every ISA level this CPU runs, vdpbf16ps (forced on,
 * where the CPU has it) and the plain loop give the definition's bits. */
static void test_bf16_paths(void **state)
{
    (void)state;
    for (int isa = 0; isa <= nt__gemm_isa_best(); isa++)
        bf_shapes(P_FMA, isa);
    bf_shapes(P_PLAIN, 0);
    if (nt__gemm_dpbf16_runs())
        bf_shapes(P_DP, 0);
}

/* AMX, forced on: the same bits on the same shapes; where the CPU (or
 * its kernel) does not run it, the refusal (amx_refused). */
static void test_bf16_amx(void **state)
{
    (void)state;
    assert_int_equal(nt__gemm_set_amx(2), -1);
    assert_int_equal(nt__gemm_set_amx(-2), -1);
    if (!nt__gemm_amx_runs()) {
        amx_refused(__func__);
        return;
    }
    bf_shapes(P_AMX, 0);
    /* below the AVX-512 level (the range scan's instructions) it is not
     * taken even when forced: the FMA path's bits */
    if (nt__gemm_isa_best() >= NT_ISA_AVX2) {
        assert_int_equal(nt__gemm_set_amx(1), 0);
        assert_int_equal(nt__gemm_set_isa(NT_ISA_AVX2), 0);
        bf_product_off_amx();
    }
    bf_path_reset();
}

/* AMX, forced on, accumulating into a C holding NaNs (one signalling, one
 * negative, with payloads) and infinities over several K-tiles (the
 * blocks' running sums), rounded to f32 (NaNs canonical), bf16 and f16
 * (nt__st_f32 from C): the plain loop's bits; the shapes leave partial
 * column stripes and row blocks.  Then B out of range, with acc and
 * without (the two ways the range is checked). */
static void test_bf16_amx_acc_nan(void **state)
{
    (void)state;
    if (!nt__gemm_amx_runs()) {
        amx_refused(__func__);
        return;
    }
    assert_int_equal(nt__gemm_set_amx(1), 0);
    static const int shapes[][3] = {{70, 50, 300}, {33, 17, 129}, {5, 130, 256}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2], ldc = N + 2;
        uint16_t *Ah = malloc(2 * (size_t)M * K), *Bh = malloc(2 * (size_t)K * N);
        float *C0 = malloc(4 * (size_t)M * ldc), *ref = malloc(4 * (size_t)M * ldc),
              *got = malloc(4 * (size_t)M * ldc);
        uint16_t *refh = malloc(2 * (size_t)M * ldc), *goth = malloc(2 * (size_t)M * ldc);
        for (long i = 0; i < (long)M * K; i++)
            Ah[i] = rbf();
        for (long i = 0; i < (long)K * N; i++)
            Bh[i] = rbf();
        for (long i = 0; i < (long)M * ldc; i++)
            C0[i] = nt__bf16_to_f32(rbf());
        static const uint32_t odd[] = {0x7fa00001u, 0xffc00123u, 0x7f800000u, 0xff800000u};
        for (int x = 0; x < 4; x++) {
            long at = ((long)(M - 1) * x / 3) * ldc + (long)(N - 1) * (3 - x) / 3;
            memcpy(C0 + at, &odd[x], 4);
        }
        static const nt_dtype odts[] = {NT_F32, NT_BF16, NT_F16};
        for (size_t o = 0; o < 3; o++) {
            nt_dtype odt = odts[o];
            size_t es = odt == NT_F32 ? 4 : 2;
            for (int path = 0; path < 2; path++) { /* the plain loop, then AMX */
                float *c = path ? got : ref;
                void *out = odt == NT_F32 ? NULL : path ? (void *)goth : (void *)refh;
                memcpy(c, C0, 4 * (size_t)M * ldc);
                if (out)
                    memset(out, 0x55, es * (size_t)M * ldc);
                bf_path(path ? P_AMX : P_PLAIN, 0);
                unsigned long a0 = nt__gemm_amx_calls();
                assert_int_equal(nt__gemm_bf16(M, N, K, Ah, K, true, NT_BF16, Bh, N, false,
                                               NT_BF16, c, ldc, true, odt == NT_F32, out, odt),
                                 0);
                assert_true(nt__gemm_amx_calls() == a0 + (unsigned long)path);
            }
            int bad = 0;
            for (int i = 0; i < M; i++)
                bad += odt == NT_F32
                           ? memcmp(got + (long)i * ldc, ref + (long)i * ldc, 4 * (size_t)N) != 0
                           : memcmp(goth + (long)i * ldc, refh + (long)i * ldc, 2 * (size_t)N) != 0;
            if (bad)
                print_message("# AMX acc %dx%dx%d out %d: %d rows differ\n", M, N, K, (int)odt,
                              bad);
            assert_int_equal(bad, 0);
        }
        /* B out of AMX's range (a NaN, a subnormal), acc on (the scan runs
         * first, C must survive for the other path) and off (judged after
         * the blocks ran): not taken, the plain loop's bits */
        for (int x = 0; x < 4; x++) {
            bool acc = x & 1;
            Bh[(long)(K / 2) * N + N / 2] = x & 2 ? 0x0001 : 0x7fc1;
            for (int path = 0; path < 2; path++) {
                float *c = path ? got : ref;
                memcpy(c, C0, 4 * (size_t)M * ldc);
                bf_path(path ? P_AMX : P_PLAIN, 0);
                unsigned long a0 = nt__gemm_amx_calls();
                assert_int_equal(nt__gemm_bf16(M, N, K, Ah, K, true, NT_BF16, Bh, N, false,
                                               NT_BF16, c, ldc, acc, true, NULL, NT_F32),
                                 0);
                assert_true(nt__gemm_amx_calls() == a0);
            }
            for (int i = 0; i < M; i++)
                assert_int_equal(
                    memcmp(got + (long)i * ldc, ref + (long)i * ldc, 4 * (size_t)N), 0);
        }
        free(Ah), free(Bh), free(C0), free(ref), free(got), free(refh), free(goth);
    }
    bf_path_reset();
}

/* Operands AMX would not compute the definition's bits for (the range
 * scan's cases: subnormals, Inf, NaN, overflow) take the FMA path, the
 * rest AMX: the definition's bits either way. */
static void test_bf16_amx_fallback(void **state)
{
    (void)state;
    if (!nt__gemm_amx_runs()) {
        amx_refused(__func__);
        return;
    }
    assert_int_equal(nt__gemm_set_amx(1), 0);
    assert_int_equal(nt__gemm_set_dpbf16(0), 0);
    path_calls = nt__gemm_amx_calls;
    fallback_cases("amx");
    path_calls = nt__gemm_dpbf16_calls;
    bf_path_reset();
}

/* nt_matmul on bf16 tensors on the simulator -- values per nc_matmul
 * instruction (NT_SIM_PROGRAM_GEMM=0) and per program, each with values per
 * instruction or per program (NT_SIM_PROGRAM_VALUES) -- and on the CPU
 * backend, at every ISA level: the definition's bits (rounded to bf16),
 * where the old recurrence's differ. */
static void test_bf16_sim_steps(void **state)
{
    (void)state;
    const int64_t M = 130, K = 700, N = 530;
    uint16_t *ah = malloc(2 * (size_t)(M * K)), *bh = malloc(2 * (size_t)(K * N));
    float *at = malloc(4 * (size_t)(K * M)), *bf = malloc(4 * (size_t)(K * N));
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) {
            /* values near 1 with both signs: partial sums cancel and round */
            ah[i * K + k] = (uint16_t)(rbf() % 0x200 +
                                       (nt_test_rand32(&rng_state) & 1 ? 0x3f00 : 0xbf00));
            at[k * M + i] = nt__bf16_to_f32(ah[i * K + k]);
        }
    for (int64_t i = 0; i < K * N; i++)
        bh[i] = (uint16_t)(rbf() % 0x200 +
                           (nt_test_rand32(&rng_state) & 1 ? 0x3f00 : 0xbf00)),
        bf[i] = nt__bf16_to_f32(bh[i]);
    /* row 0 of A all ones, column 0 of B over the first K-tile 2^24, 126
     * ones, -2^24: the old recurrence loses every one (0), the chunks keep
     * those of the middle chunks (111) */
    for (int64_t k = 0; k < K; k++)
        ah[k] = 0x3f80, at[k * M] = 1.0f;
    for (int64_t k = 0; k < 128; k++) {
        bh[k * N] = k == 0 ? 0x4b80 : k == 127 ? 0xcb80 : 0x3f80;
        bf[k * N] = nt__bf16_to_f32(bh[k * N]);
    }
    size_t n = (size_t)(M * N);
    float *ref = malloc(4 * n), *old = malloc(4 * n), *got = malloc(4 * n);
    uint16_t *gh = malloc(2 * n);
    naive_bf16((int)M, (int)N, (int)K, at, (int)M, bf, (int)N, ref, (int)N);
    naive((int)M, (int)N, (int)K, at, (int)M, bf, (int)N, old, (int)N);
    int changed = 0;
    for (size_t i = 0; i < n; i++) {
        ref[i] = nt__bf16_to_f32(nt__f32_to_bf16(ref[i]));
        changed += nt__f32_to_bf16(old[i]) != nt__f32_to_bf16(ref[i]);
    }
    print_message("# %d of %zu bf16 results differ between the two definitions\n", changed, n);
    assert_true(changed > 0);
    bool pg0 = nt__sim_program_gemm(), pv0 = nt__sim_program_values();
    for (int cfg = 0; cfg < 5; cfg++) {
        bool sim = cfg < 4;
        assert_int_equal(nt_config_set("NT_BACKEND", sim ? "sim" : "cpu"), 0);
        nt__sim_set_program_gemm(cfg & 1);
        nt__sim_set_program_values(cfg & 2);
        for (int isa = 0; isa <= nt__gemm_isa_best(); isa++) {
            assert_int_equal(nt__gemm_set_isa(isa), 0);
            nt_tensor *a = nt_from_host(ah, NT_BF16, 2, (int64_t[]){M, K});
            nt_tensor *b = nt_from_host(bh, NT_BF16, 2, (int64_t[]){K, N});
            nt_tensor *y = nt_matmul(a, b);
            assert_non_null(y);
            assert_int_equal(nt_to_host(y, gh, 2 * n), 0);
            for (size_t i = 0; i < n; i++)
                got[i] = nt__bf16_to_f32(gh[i]);
            int bad = differ(got, ref, n);
            if (bad)
                print_message("# bf16 matmul on %s, program gemm %d, program values %d, %s: %d "
                              "elements differ\n",
                              sim ? "sim" : "cpu", cfg & 1, (cfg & 2) != 0,
                              nt__gemm_isa_label(isa), bad);
            assert_int_equal(bad, 0);
            nt_release(a), nt_release(b), nt_release(y);
        }
    }
    nt__sim_set_program_gemm(pg0);
    nt__sim_set_program_values(pv0);
    nt__gemm_set_isa(-1);
    free(ah), free(bh), free(at), free(bf), free(ref), free(old), free(got), free(gh);
}

/* 20 AdamW steps of the MLP under bf16 autocast, on both backends, 1 and 2
 * threads: with AMX forced on (taken by the products) the parameters come
 * out as with it off, bit for bit. */
static void test_bf16_train_amx(void **state)
{
    (void)state;
    if (!nt__gemm_amx_runs()) {
        amx_refused(__func__);
        return;
    }
    assert_int_equal(nt__gemm_set_amx(1), 0);
    const size_t n = 160 * 100 + 160 + 10 * 160 + 10;
    float *first = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    static const char *backends[] = {"cpu", "sim"};
    int runs = 0;
    for (int be = 0; be < 2; be++)
        for (int th = 1; th <= 2; th++)
            for (int on = 0; on < 2; on++) {
                m_threads = th == 1 ? "1" : "2";
                assert_int_equal(nt__gemm_set_amx(on), 0);
                unsigned long c0 = nt__gemm_amx_calls();
                assert_int_equal(nt_autocast_begin(NT_BF16), 0);
                train(backends[be], nt__gemm_isa_label(nt__gemm_isa_best()), "eager",
                      runs ? got : first, n);
                assert_int_equal(nt_autocast_end(), 0);
                if (on)
                    assert_true(nt__gemm_amx_calls() > c0);
                else
                    assert_true(nt__gemm_amx_calls() == c0);
                if (runs++) {
                    int bad = differ(got, first, n);
                    if (bad)
                        print_message("# bf16 training on %s, AMX %s, %d thread(s): %d "
                                      "parameters differ\n",
                                      backends[be], on ? "on" : "off", th, bad);
                    assert_int_equal(bad, 0);
                }
            }
    bf_path_reset();
    m_threads = "2";
    free(first), free(got);
}

/* ---------------- the simulator's program-level bf16 product ---------------- */

/* With NT_SIM_PROGRAM_VALUES=0 the simulator computes a matmul program's
 * product once (neuron/tp_matmul.c, NT_SIM_PROGRAM_GEMM), bf16 operands
 * through nt__gemm_typed in place.  With special values (signed zeros,
 * subnormals, overflowing products, infinities and the NaNs they make),
 * each operand in either layout, and with the panels capped (the typed
 * path refuses: the widened copies then): the CPU backend's bits, and the
 * instruction-level run's. */
static void test_sim_bf16_product(void **state)
{
    (void)state;
    const int64_t M = 37, K = 300, N = 45;
    bool pv0 = nt__sim_program_values();
    nt__sim_set_program_values(false);
    float *a = vals((size_t)(M * K)), *b = vals((size_t)(K * N));
    size_t n = (size_t)(M * N);
    float *want = malloc(4 * n), *got = malloc(4 * n);
    static const char *runs[] = {"cpu", "sim, program product", "sim, panels capped",
                                 "sim, instruction level"};
    for (int lay = 0; lay < 4; lay++)
        for (int r = 0; r < 4; r++) {
            assert_int_equal(nt_config_set("NT_BACKEND", r ? "sim" : "cpu"), 0);
            nt__sim_set_program_gemm(r != 3);
            nt_tensor *fa = lay & 1 ? nt_from_host(a, NT_F32, 2, (int64_t[]){K, M})
                                    : nt_from_host(a, NT_F32, 2, (int64_t[]){M, K});
            nt_tensor *fb = lay & 2 ? nt_from_host(b, NT_F32, 2, (int64_t[]){N, K})
                                    : nt_from_host(b, NT_F32, 2, (int64_t[]){K, N});
            nt_tensor *ha = nt_cast(fa, NT_BF16), *hb = nt_cast(fb, NT_BF16);
            nt_tensor *va = lay & 1 ? nt_transpose(ha, 0, 1) : nt_retain(ha);
            nt_tensor *vb = lay & 2 ? nt_transpose(hb, 0, 1) : nt_retain(hb);
            nt__gemm_set_panel_cap(r == 2 ? 16 : 0);
            nt_tensor *y = nt_matmul(va, vb);
            nt_tensor *yf = nt_cast(y, NT_F32);
            assert_non_null(yf);
            assert_int_equal(nt_to_host(yf, r ? got : want, 4 * n), 0);
            nt__gemm_set_panel_cap(0);
            if (!r) { /* the special values reach the result */
                int nan = 0;
                for (size_t i = 0; i < n; i++)
                    nan += isnan(want[i]);
                assert_true(nan > 0 && nan < (int)n);
            }
            if (r) {
                int bad = differ(got, want, n);
                if (bad)
                    print_message("# bf16 matmul, A %s, B %s, %s: %d elements differ from "
                                  "the CPU's\n", lay & 1 ? "transposed" : "plain",
                                  lay & 2 ? "transposed" : "plain", runs[r], bad);
                assert_int_equal(bad, 0);
            }
            nt_release(y), nt_release(yf), nt_release(va), nt_release(vb), nt_release(ha),
                nt_release(hb), nt_release(fa), nt_release(fb);
        }
    nt__sim_set_program_gemm(true);
    nt__sim_set_program_values(pv0);
    free(a), free(b), free(want), free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_levels, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_config, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_ktile_every_level, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_whole_every_level, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_whole_prefetch, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_typed_every_level, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul_every_level, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul_bf16, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul_fold, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_matmul_batches, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_train_every_level, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_train_threads, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_dpbf16_shapes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_dpbf16_fallback, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_dpbf16_train, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sim_bf16_product, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_paths, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_amx, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_amx_acc_nan, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_amx_fallback, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_sim_steps, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_train_amx, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
