/* tests/test_gpt2.c - the matmul tile program at a GPT-2-small block's
 * shapes (neuron/tp_matmul.c):
 *
 * - an epilogue that writes nothing it reads (epilogue_apart) streams the
 *   row blocks past a B kept in SBUF, several N-chunks each, where an
 *   in-place one keeps the block program: the same bits either way, fewer
 *   HBM bytes and less simulated time apart;
 * - a row-major A's transposes of the next M-tile spread between the
 *   current M-tile's matmuls (prep_a_spread): the same bits, with the
 *   program-level product and with every instruction computing its own
 *   values (NT_SIM_PROGRAM_GEMM=0), as the K-tile reference says;
 * - through the runtime, linear layers with a bias and a GELU epilogue (the
 *   fused matmul kernels that now stream) give the CPU backend's bits, f32
 *   and bf16 autocast, in lazy and adaptive mode, with both ways of
 *   computing the simulator's values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/dtype.h"
#include "ntensor.h"
#include "nt_test.h"
#include "sim/sim.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* ---------------- the tile program itself ---------------- */

typedef struct {
    nt_tile *o;  /* [128, 512] f32: a block on its way out */
    float *c;    /* C [M, N] f32, row stride ldc */
    int64_t ldc;
    int calls;
} epi_ctx;

/* Copies the accumulator block to SBUF and stores it at its place in C. */
static int store_epi(nt_sim_kernel *k, const nt_ap *acc, int64_t m0, int64_t n0, void *ctx)
{
    epi_ctx *e = ctx;
    int64_t nf = 1;
    for (int i = 0; i < acc->ndim; i++)
        nf *= acc->num[i];
    nt_ap o = nt_tile_slice(e->o, 0, acc->np, 0, nf);
    int rc = nt_isa_tensor_copy(k, &o, acc, NT_ENGINE_SCALAR);
    nt_ap c = nt_hbm_ap(e->c, NT_F32, m0 * e->ldc + n0, acc->np, e->ldc, nf);
    if (!rc)
        rc = nt_isa_dma_copy(k, &c, &o, NT_DMA_QUEUE_AUTO);
    e->calls++;
    return rc;
}

/* C = A . B (A row-major [M, K], B [K, N] or B^T [N, K]) with the store
 * epilogue, apart or not; fills C and the kernel's report. */
static void tile_run(int64_t M, int64_t N, int64_t K, nt_dtype dt, bool b_trans, bool apart,
                     const void *A, const void *Bm, float *C, nt_sim_report *r)
{
    memset(C, 0xff, sizeof *C * (size_t)(M * N)); /* NaNs where nothing was written */
    nt_sim_kernel *k = nt_sim_kernel_begin("gpt2_tile");
    assert_non_null(k);
    epi_ctx e = {nt_tile_alloc(k, "epi.out", NT_MEM_SBUF, NT_F32, 128, 512), C, N, 0};
    assert_non_null(e.o);
    nt_tile_matmul_args g = {.M = M, .N = N, .K = K, .a = A, .lda = K, .b = Bm,
                             .ldb = b_trans ? K : N, .b_trans = b_trans, .in_dtype = dt,
                             .out_dtype = NT_F32, .epilogue = store_epi, .epilogue_ctx = &e,
                             .epilogue_apart = apart};
    int rc = nt_tile_matmul(k, &g);
    if (rc)
        fail_msg("nt_tile_matmul: %s", nt_sim_kernel_message(k));
    assert_int_equal(nt_sim_kernel_end(k, r), 0);
    assert_int_equal(e.calls, (int)(((M + 127) / 128) * ((N + 511) / 512)));
}

/* The product in double precision, an independent check of the values
 * (the bits are compared between the programs). */
static void ref_product(int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                        double *C, double *mag)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, g = 0;
            for (int64_t kk = 0; kk < K; kk++) {
                acc += (double)A[m * K + kk] * B[kk * N + n];
                g += fabs((double)A[m * K + kk] * B[kk * N + n]);
            }
            C[m * N + n] = acc;
            mag[m * N + n] = g;
        }
}

/* The shapes: 8 M-tiles (the last partial; a block holds 7), 3 N-chunks (the last partial),
 * 3 K-tiles (the last partial); f32 and bf16 operands; B row-major and as
 * B^T (the linear layer's weight). */
static void tile_case(nt_dtype dt, bool b_trans)
{
    const int64_t M = 1000, N = 1100, K = 300;
    size_t esz = nt__dtype_size(dt);
    void *A = malloc(esz * (size_t)(M * K)), *Bm = malloc(esz * (size_t)(K * N));
    float *Af = malloc(sizeof *Af * (size_t)(M * K)), *Bf = malloc(sizeof *Bf * (size_t)(K * N));
    float *c_blk = malloc(sizeof(float) * (size_t)(M * N));
    float *c_str = malloc(sizeof(float) * (size_t)(M * N));
    float *c_ins = malloc(sizeof(float) * (size_t)(M * N));
    double *ref = malloc(sizeof(double) * (size_t)(M * N));
    double *mag = malloc(sizeof(double) * (size_t)(M * N));
    assert_true(A && Bm && Af && Bf && c_blk && c_str && c_ins && ref && mag);
    for (int64_t i = 0; i < M * K; i++) {
        float v = nt_test_uniform(&rng) * 2 - 1;
        nt__store_f32(A, dt, i, v);
        Af[i] = nt__load_f32(A, dt, i);
    }
    for (int64_t kk = 0; kk < K; kk++)
        for (int64_t n = 0; n < N; n++) {
            float v = nt_test_uniform(&rng) * 2 - 1;
            int64_t at = b_trans ? n * K + kk : kk * N + n;
            nt__store_f32(Bm, dt, at, v);
            Bf[kk * N + n] = nt__load_f32(Bm, dt, at);
        }
    nt_sim_report rb, rs, ri;
    tile_run(M, N, K, dt, b_trans, false, A, Bm, c_blk, &rb);
    tile_run(M, N, K, dt, b_trans, true, A, Bm, c_str, &rs);
    nt__sim_set_program_gemm(false); /* every nc_matmul, transpose, copy computes */
    tile_run(M, N, K, dt, b_trans, true, A, Bm, c_ins, &ri);
    nt__sim_set_program_gemm(true);
    ref_product(M, N, K, Af, Bf, ref, mag);
    for (int64_t i = 0; i < M * N; i++) {
        if (nt_test_ubits(c_blk[i]) != nt_test_ubits(c_str[i]) ||
            nt_test_ubits(c_blk[i]) != nt_test_ubits(c_ins[i]))
            fail_msg("C[%lld]: block program %a, streamed %a, per instruction %a",
                     (long long)i, c_blk[i], c_str[i], c_ins[i]);
        /* and the product itself: an f32 sum of K terms is within K ulps of
         * the sum of their magnitudes */
        if (fabs(c_blk[i] - ref[i]) > (double)K * 0x1p-24 * mag[i])
            fail_msg("C[%lld] = %a, the double product %a", (long long)i, c_blk[i], ref[i]);
    }
    /* the figures first: a failed comparison below shows them */
    print_message("#   %s%s: block program %.1f us, %.2f MB read; streamed %.1f us, %.2f MB\n",
                  dt == NT_BF16 ? "bf16" : "f32", b_trans ? ", B^T" : "",
                  rb.duration_ns * 1e-3, rb.hbm_read_bytes * 1e-6, rs.duration_ns * 1e-3,
                  rs.hbm_read_bytes * 1e-6);
    /* streamed: B loaded (and turned) once, not once per block of M-tiles */
    assert_true(rs.hbm_read_bytes < rb.hbm_read_bytes);
    assert_true(rs.hbm_write_bytes == rb.hbm_write_bytes);
    assert_true(rs.duration_ns < rb.duration_ns);
    assert_true(fabs(rs.flops - 2.0 * M * N * K) < 0.5);
    free(A), free(Bm), free(Af), free(Bf), free(c_blk), free(c_str), free(c_ins), free(ref);
    free(mag);
}

static void tile_epilogue_apart(void **state)
{
    (void)state;
    assert_int_equal(nt_sim_init(), 0);
    tile_case(NT_F32, true);
    tile_case(NT_F32, false);
    tile_case(NT_BF16, true);
    tile_case(NT_BF16, false);
}

/* ---------------- through the runtime ---------------- */

enum { NOUT = 4 };

/* y = gelu(x w1^T + b1), z = y w2^T + b2 and a plain x w1^T, under
 * autocast `amp` (NT_DTYPE_COUNT: none), as f32 on the host. */
static void linears(const char *backend, const char *mode, nt_dtype amp, bool pg,
                    float *out[NOUT], int64_t n[NOUT])
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    /* no op may fall back to the CPU on the simulator */
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(backend, "sim") ? "0" : "1"), 0);
    nt__sim_set_program_gemm(pg);
    const int64_t Bt = 3, T = 170, D = 300, H = 1100;
    nt_tensor *x = nt_randn(NT_F32, 3, (int64_t[]){Bt, T, D}, 7);
    nt_tensor *w1 = nt_mul_scalar(nt_randn(NT_F32, 2, (int64_t[]){H, D}, 8), 0.05);
    nt_tensor *b1 = nt_randn(NT_F32, 1, (int64_t[]){H}, 9);
    nt_tensor *w2 = nt_mul_scalar(nt_randn(NT_F32, 2, (int64_t[]){D, H}, 10), 0.03);
    nt_tensor *b2 = nt_randn(NT_F32, 1, (int64_t[]){D}, 11);
    if (amp != NT_DTYPE_COUNT)
        assert_int_equal(nt_autocast_begin(amp), 0);
    nt_tensor *h = nt_linear(x, w1, b1);
    nt_tensor *y = nt_gelu(nt_linear(x, w1, b1));
    nt_tensor *z = nt_linear(y, w2, b2);
    nt_tensor *p = nt_matmul(x, nt_transpose(w1, 0, 1));
    if (amp != NT_DTYPE_COUNT)
        nt_autocast_end();
    nt_tensor *r[NOUT] = {h, y, z, p};
    for (int i = 0; i < NOUT; i++) {
        assert_non_null(r[i]);
        nt_tensor *f = nt_cast(r[i], NT_F32);
        n[i] = nt_numel(f);
        out[i] = malloc(sizeof(float) * (size_t)n[i]);
        assert_int_equal(nt_to_host(f, out[i], sizeof(float) * (size_t)n[i]), 0);
        nt_release(f);
    }
    nt__sim_set_program_gemm(true);
    nt_shutdown();
}

static void runtime_linears(void **state)
{
    (void)state;
    const char *modes[] = {"lazy", "adaptive"};
    nt_dtype amps[] = {NT_DTYPE_COUNT, NT_BF16};
    for (int a = 0; a < 2; a++) {
        float *want[NOUT];
        int64_t n[NOUT];
        linears("cpu", "eager", amps[a], true, want, n);
        for (int m = 0; m < 2; m++)
            for (int pg = 0; pg < 2; pg++) {
                float *got[NOUT];
                int64_t gn[NOUT];
                linears("sim", modes[m], amps[a], pg == 0, got, gn);
                for (int i = 0; i < NOUT; i++) {
                    assert_int_equal(gn[i], n[i]);
                    for (int64_t j = 0; j < n[i]; j++)
                        if (nt_test_ubits(got[i][j]) != nt_test_ubits(want[i][j]))
                            fail_msg("%s, %s, %s values: output %d [%lld] sim %a, cpu %a",
                                     amps[a] == NT_BF16 ? "bf16" : "f32", modes[m],
                                     pg ? "per-instruction" : "program", i, (long long)j,
                                     got[i][j], want[i][j]);
                    free(got[i]);
                }
            }
        for (int i = 0; i < NOUT; i++)
            free(want[i]);
    }
    assert_int_equal(nt_init(), 0); /* the teardown shuts down */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tile_epilogue_apart),
        cmocka_unit_test_setup_teardown(runtime_linears, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
