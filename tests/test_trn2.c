/* tests/test_trn2.c - the simulator's two targets: every rate and size of
 * trn1 (NeuronCore-v2) and trn2 (NeuronCore-v3) as docs/sim.md lists them
 * with their sources, the TensorE rate table per operand format, VectorE's
 * v3 performance mode, trn1's timings unchanged to the last bit (recorded
 * before trn2 was completed), the same result bits on both targets, and the
 * errors for a bad target.  Simulated times are deterministic (not wall
 * clock), so they are asserted exactly. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"

/* The kernel a test has open: a failing assertion jumps out of the test,
 * and the teardown must still end it or the core stays taken. */
static nt_sim_kernel *open_k;

static int setup(void **state)
{
    (void)state;
    nt_clear_error();
    assert_int_equal(nt_sim_set_target(NT_SIM_TRN1), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (open_k)
        nt_sim_kernel_end(open_k, NULL);
    open_k = NULL;
    nt_sim_set_functional(true);
    nt_sim_set_target(NT_SIM_TRN1);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The tables                                                               */
/* ------------------------------------------------------------------------ */

/* What both targets share (docs/sim.md, "Parameters and their sources"). */
static void check_common(const nt_sim_config *c)
{
    assert_int_equal(c->partitions, 128);
    assert_int_equal(c->psum_partition_bytes, 16 * 1024); /* 2 MiB on both */
    assert_int_equal(c->dma_queues, 16);
    assert_int_equal(c->dma_engines, 16);
    assert_true(c->dma_fixed_ns == 2000.0);
    assert_true(c->dma_engine_bytes_per_ns == 17.0); /* 27.2 GB/s in theory on v2 and v3 */
    assert_int_equal(c->dma_min_descriptor_bytes, 64);
    assert_int_equal(c->min_instr_cycles, 64);
    assert_int_equal(c->access_latency_cycles, 60);
    assert_true(c->act_table_switch_ns == 1000.0);
    assert_true(c->tensor_rate[NT_SIM_MM_F32] == 0.25);
    assert_true(c->tensor_rate[NT_SIM_MM_BF16] == 1.0);
    for (int f = 0; f < NT_SIM_MM_FORMATS; f++)
        assert_true(c->tensor_peak_flops[f] ==
                    128.0 * 128.0 * 2.0 * c->clock_ghz[NT_ENGINE_TENSOR] * 1e9 *
                        c->tensor_rate[f]);
    assert_true(c->tensor_peak_flops_bf16 == c->tensor_peak_flops[NT_SIM_MM_BF16]);
    assert_true(c->tensor_peak_flops_f32 == c->tensor_peak_flops[NT_SIM_MM_F32]);
    assert_true(c->tensor_peak_flops_f32 * 4.0 == c->tensor_peak_flops_bf16);
    assert_true(c->clock_ghz[NT_ENGINE_DMA] == 0.0);
}

static void test_trn1_table(void **state)
{
    (void)state;
    nt_sim_config c;
    assert_int_equal(nt_sim_target_config(NT_SIM_TRN1, &c), 0);
    check_common(&c);
    assert_int_equal(c.target, NT_SIM_TRN1);
    assert_string_equal(c.name, "trn1 (NeuronCore-v2)");
    assert_int_equal(c.sbuf_partition_bytes, 192 * 1024); /* 24 MiB */
    assert_true(c.clock_ghz[NT_ENGINE_TENSOR] == 2.8);
    assert_true(c.clock_ghz[NT_ENGINE_VECTOR] == 1.12);
    assert_true(c.clock_ghz[NT_ENGINE_SCALAR] == 1.4);
    assert_true(c.clock_ghz[NT_ENGINE_GPSIMD] == 1.4);
    assert_true(c.hbm_bytes_per_ns == 410.0); /* 820 GB/s, 2 cores */
    assert_true(c.tensor_rate[NT_SIM_MM_FP8] == 1.0); /* cFP8 at the bf16 rate */
    assert_true(c.tensor_peak_flops[NT_SIM_MM_FP8] == c.tensor_peak_flops_bf16);
    assert_false(c.vector_perf_mode);
    assert_true(c.vector_gpsimd_share_sbuf);
    assert_true(c.vector_scalar_share_psum);
    /* "over 90 TFLOPS" bf16 per core; 47.5 f32 TFLOPS per 2-core chip */
    assert_true(c.tensor_peak_flops_bf16 > 90e12);
    assert_true(fabs(c.tensor_peak_flops_f32 / (47.5e12 / 2) - 1) < 0.05);
}

static void test_trn2_table(void **state)
{
    (void)state;
    nt_sim_config c;
    assert_int_equal(nt_sim_target_config(NT_SIM_TRN2, &c), 0);
    check_common(&c);
    assert_int_equal(c.target, NT_SIM_TRN2);
    assert_string_equal(c.name, "trn2 (NeuronCore-v3)");
    assert_int_equal(c.sbuf_partition_bytes, 224 * 1024); /* 28 MiB */
    assert_true(c.clock_ghz[NT_ENGINE_TENSOR] == 2.4);
    assert_true(c.clock_ghz[NT_ENGINE_VECTOR] == 0.96);
    assert_true(c.clock_ghz[NT_ENGINE_SCALAR] == 1.2);
    assert_true(c.clock_ghz[NT_ENGINE_GPSIMD] == 1.2);
    assert_true(c.hbm_bytes_per_ns == 362.5); /* 2.9 TB/s, 8 cores */
    assert_true(c.tensor_rate[NT_SIM_MM_FP8] == 2.0);
    assert_true(c.tensor_peak_flops[NT_SIM_MM_FP8] == 2.0 * c.tensor_peak_flops_bf16);
    assert_true(c.vector_perf_mode);
    assert_false(c.vector_gpsimd_share_sbuf);
    assert_false(c.vector_scalar_share_psum);
    /* the published dense TFLOPS per NeuronCore-v3: 158 fp8, 79 bf16, 20 f32 */
    assert_true(fabs(c.tensor_peak_flops[NT_SIM_MM_FP8] / 158e12 - 1) < 0.01);
    assert_true(fabs(c.tensor_peak_flops[NT_SIM_MM_BF16] / 79e12 - 1) < 0.01);
    assert_true(fabs(c.tensor_peak_flops[NT_SIM_MM_F32] / 20e12 - 1) < 0.02);
    /* the active configuration is the table's once switched to */
    assert_int_equal(nt_sim_set_target(NT_SIM_TRN2), 0);
    nt_sim_config a;
    assert_int_equal(nt_sim_config_get(&a), 0);
    assert_int_equal(a.target, NT_SIM_TRN2);
    assert_int_equal(a.sbuf_partition_bytes, c.sbuf_partition_bytes);
    assert_true(a.tensor_peak_flops[NT_SIM_MM_FP8] == c.tensor_peak_flops[NT_SIM_MM_FP8]);
    assert_true(a.dma_engine_bytes_per_ns == c.dma_engine_bytes_per_ns);
}

/* ------------------------------------------------------------------------ */
/* One kernel, every kind of cost                                           */
/* ------------------------------------------------------------------------ */

typedef struct row {
    const char *what;
    double cycles, start_ns, end_ns;
} row;
enum { NROWS = 22 };

static void rec(nt_sim_kernel *k, row *out, int *n, const char *what)
{
    nt_sim_instr_info in;
    assert_int_equal(nt_sim_kernel_last(k, &in), 0);
    out[*n] = (row){what, in.cycles, in.start_ns, in.end_ns};
    (*n)++;
}

/* DMAs, matmuls (bf16, f32, small), VectorE/ScalarE/GpSimd copies and ALU
 * ops in bf16 and f32, SBUF and PSUM, contiguous and strided, an
 * activation, a transpose: timing only. */
static void probe(row *out, nt_sim_report *r)
{
    static uint16_t hbm[128 * 1024];
    int n = 0;
    /* a fresh simulator: the core's clock at 0, as when trn1's figures were
     * recorded (instruction times are on the core's clock) */
    nt_sim_config cfg;
    assert_int_equal(nt_sim_config_get(&cfg), 0);
    nt_sim_shutdown();
    assert_int_equal(nt_sim_init(), 0);
    assert_int_equal(nt_sim_set_target(cfg.target), 0);
    nt_sim_set_functional(false);
    nt_sim_kernel *k = open_k = nt_sim_kernel_begin("probe");
    assert_non_null(k);
    nt_tile *a = nt_tile_alloc(k, "a", NT_MEM_SBUF, NT_BF16, 128, 512);
    nt_tile *b = nt_tile_alloc(k, "b", NT_MEM_SBUF, NT_BF16, 128, 512);
    nt_tile *c = nt_tile_alloc(k, "c", NT_MEM_SBUF, NT_BF16, 128, 512);
    nt_tile *f = nt_tile_alloc(k, "f", NT_MEM_SBUF, NT_F32, 128, 512);
    nt_tile *g = nt_tile_alloc(k, "g", NT_MEM_SBUF, NT_F32, 128, 512);
    nt_tile *p = nt_tile_alloc(k, "p", NT_MEM_PSUM, NT_F32, 128, 512);
    nt_ap A = nt_tile_ap(a), B = nt_tile_ap(b), C = nt_tile_ap(c), F = nt_tile_ap(f),
          G = nt_tile_ap(g), P = nt_tile_ap(p);
    nt_ap H = nt_hbm_ap(hbm, NT_BF16, 0, 128, 512, 512);
    nt_ap Hf = nt_hbm_ap(hbm, NT_F32, 0, 128, 512, 512);
    assert_int_equal(nt_isa_dma_copy(k, &A, &H, 0), 0);
    rec(k, out, &n, "dma bf16");
    assert_int_equal(nt_isa_dma_copy(k, &B, &H, 1), 0);
    rec(k, out, &n, "dma bf16 q1");
    assert_int_equal(nt_isa_dma_copy(k, &F, &Hf, 2), 0);
    rec(k, out, &n, "dma f32");
    nt_ap S = nt_tile_slice(a, 0, 128, 0, 128), Sf = nt_tile_slice(f, 0, 128, 0, 128);
    assert_int_equal(nt_isa_nc_matmul(k, &P, &S, &B, false), 0);
    rec(k, out, &n, "matmul bf16");
    assert_int_equal(nt_isa_nc_matmul(k, &P, &Sf, &F, true), 0);
    rec(k, out, &n, "matmul f32");
    nt_ap S64 = nt_tile_slice(a, 0, 128, 0, 64);
    nt_ap P64 = nt_tile_slice(p, 0, 64, 0, 100), B100 = nt_tile_slice(b, 0, 128, 0, 100);
    assert_int_equal(nt_isa_nc_matmul(k, &P64, &S64, &B100, false), 0);
    rec(k, out, &n, "matmul bf16 small");
    assert_int_equal(nt_isa_tensor_copy(k, &C, &A, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "copy bf16 sbuf");
    assert_int_equal(nt_isa_tensor_copy(k, &C, &P, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "copy psum->bf16");
    assert_int_equal(nt_isa_tensor_copy(k, &G, &F, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "copy f32");
    assert_int_equal(nt_isa_tensor_copy(k, &C, &A, NT_ENGINE_SCALAR), 0);
    rec(k, out, &n, "copy bf16 scalar");
    nt_ap As = A; /* [256, 2] read column-wise: innermost step 256 */
    As.ndim = 2, As.num[0] = 256, As.num[1] = 2, As.step[0] = 1, As.step[1] = 256;
    assert_int_equal(nt_isa_tensor_copy(k, &C, &As, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "copy bf16 strided");
    nt_isa_alu op = {.op = NT_ALU_MUL, .operand = {.imm = 2.0f}};
    assert_int_equal(nt_isa_tensor_scalar(k, &C, &A, &op, NULL, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "tscalar bf16");
    assert_int_equal(nt_isa_tensor_scalar(k, &G, &F, &op, NULL, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "tscalar f32");
    assert_int_equal(nt_isa_tensor_tensor(k, &C, &A, &B, NT_ALU_ADD, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "tt bf16 add");
    assert_int_equal(nt_isa_tensor_tensor(k, &C, &A, &B, NT_ALU_MAX, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "tt bf16 max");
    assert_int_equal(nt_isa_tensor_tensor(k, &G, &F, &P, NT_ALU_ADD, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "tt f32 psum");
    assert_int_equal(nt_isa_tensor_tensor(k, &G, &F, &G, NT_ALU_MAX, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "tt f32");
    assert_int_equal(nt_isa_tensor_tensor(k, &C, &A, &B, NT_ALU_ADD, NT_ENGINE_GPSIMD), 0);
    rec(k, out, &n, "tt bf16 gpsimd");
    assert_int_equal(nt_isa_memset(k, &C, 0.0, NT_ENGINE_VECTOR), 0);
    rec(k, out, &n, "memset bf16");
    assert_int_equal(nt_isa_activation(k, &G, NT_ACT_EXP, &F, NULL, NULL, NULL), 0);
    rec(k, out, &n, "act exp");
    nt_ap T = nt_tile_slice(p, 0, 128, 0, 128);
    assert_int_equal(nt_isa_nc_transpose(k, &T, &Sf), 0);
    rec(k, out, &n, "transpose f32");
    assert_int_equal(nt_isa_dma_copy(k, &H, &C, 3), 0);
    rec(k, out, &n, "dma store");
    assert_int_equal(n, NROWS);
    open_k = NULL;
    assert_int_equal(nt_sim_kernel_end(k, r), 0);
    nt_sim_set_functional(true);
}

/* trn1's timings of the probe, recorded (printf %a) on the build before
 * trn2's rates were completed: every cycle count, start and end, bit for
 * bit. */
static const row trn1_rows[NROWS] = {
    {"dma bf16", 0x0p+0, 0x0p+0, 0x1.363c3c3c3c3c4p+11},
    {"dma bf16 q1", 0x0p+0, 0x0p+0, 0x1.6c78787878788p+11},
    {"dma f32", 0x0p+0, 0x0p+0, 0x1.def0f0f0f0f0fp+11},
    {"matmul bf16", 0x1p+9, 0x1.6c78787878788p+11, 0x1.8353e62f53e63p+11},
    {"matmul f32", 0x1p+11, 0x1.def0f0f0f0f0fp+11, 0x1.1d2f53e62f53ep+12},
    {"matmul bf16 small", 0x1.9p+6, 0x1.1d2f53e62f53ep+12, 0x1.1f6ac19d0ac19p+12},
    {"copy bf16 sbuf", 0x1p+9, 0x1.363c3c3c3c3c4p+11, 0x1.6f60ce8560ce8p+11},
    {"copy psum->bf16", 0x1p+9, 0x1.20c19d0ac19dp+12, 0x1.3d53e62f53e62p+12},
    {"copy f32", 0x1p+9, 0x1.3d53e62f53e62p+12, 0x1.59e62f53e62f4p+12},
    {"copy bf16 scalar", 0x1p+9, 0x1.3d53e62f53e62p+12, 0x1.542f53e62f53dp+12},
    {"copy bf16 strided", 0x1p+9, 0x1.59e62f53e62f4p+12, 0x1.7678787878786p+12},
    {"tscalar bf16", 0x1p+9, 0x1.7678787878786p+12, 0x1.930ac19d0ac18p+12},
    {"tscalar f32", 0x1p+9, 0x1.930ac19d0ac18p+12, 0x1.af9d0ac19d0aap+12},
    {"tt bf16 add", 0x1p+9, 0x1.af9d0ac19d0aap+12, 0x1.cc2f53e62f53cp+12},
    {"tt bf16 max", 0x1p+10, 0x1.cc2f53e62f53cp+12, 0x1.02a9f317a9f3p+13},
    {"tt f32 psum", 0x1p+9, 0x1.02a9f317a9f3p+13, 0x1.10f317a9f3179p+13},
    {"tt f32", 0x1p+10, 0x1.129fa9f317a9ep+13, 0x1.2f31f317a9f3p+13},
    {"tt bf16 gpsimd", 0x1p+9, 0x1.2f31f317a9f3p+13, 0x1.3a9fa9f317a9ep+13},
    {"memset bf16", 0x1p+9, 0x1.3a9fa9f317a9ep+13, 0x1.48e8ce8560ce7p+13},
    {"act exp", 0x1p+9, 0x1.2f31f317a9f3p+13, 0x1.59dfa9f317a9ep+13},
    {"transpose f32", 0x1p+7, 0x1.10f317a9f3179p+13, 0x1.1260ce8560ce7p+13},
    {"dma store", 0x0p+0, 0x1.4a9560ce8560cp+13, 0x1.98246fdd946fdp+13},
};

static void test_trn1_unchanged(void **state)
{
    (void)state;
    row got[NROWS];
    nt_sim_report r;
    probe(got, &r);
    for (int i = 0; i < NROWS; i++) {
        if (got[i].cycles != trn1_rows[i].cycles || got[i].start_ns != trn1_rows[i].start_ns ||
            got[i].end_ns != trn1_rows[i].end_ns)
            fail_msg("trn1 %s: cycles %a start %a end %a, recorded %a %a %a", got[i].what,
                     got[i].cycles, got[i].start_ns, got[i].end_ns, trn1_rows[i].cycles,
                     trn1_rows[i].start_ns, trn1_rows[i].end_ns);
    }
    assert_true(r.duration_ns == 0x1.98246fdd946fdp+13);
    assert_true(r.flops == 0x1.0c8p+25);
    assert_true(r.tensor_ideal_ns == 0x1.d212492492493p+9);
    static const double busy[NT_ENGINE_COUNT] = {0x1.f1db6db6db6dbp+9, 0x1.736db6db6db6cp+12,
                                                 0x1.b0db6db6db6dcp+10, 0x1.6db6db6db6db7p+8,
                                                 0x1.8a9696969696ap+12};
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        assert_true(r.busy_ns[e] == busy[e]);
}

/* trn2's cycles: v2's rules, TensorE at the format's rate, VectorE's 16-bit
 * performance mode (4x copies in SBUF, 2x strided or from/to PSUM, 2x
 * tensor_tensor in SBUF), other engines and f32 as on v2. */
static void test_trn2_costs(void **state)
{
    (void)state;
    static const double cyc[NROWS] = {
        0, 0, 0,            /* DMAs */
        512, 2048, 100,     /* matmuls: bf16, f32 at a quarter, max(min(64, M), N) */
        128, 512, 512, 512, /* copies: bf16 SBUF 4x; PSUM f32 source, f32, ScalarE as v2 */
        256,                /* bf16 strided: 2x */
        128, 512,           /* tensor_scalar bf16 4x, f32 as v2 */
        256, 512, 512, 1024, /* tensor_tensor bf16 add, max 2x; f32 as v2 */
        512, 512, 512,      /* GpSimd, memset, activation as v2 */
        128, 0,             /* transpose, store */
    };
    assert_int_equal(nt_sim_set_target(NT_SIM_TRN2), 0);
    nt_sim_config c;
    nt_sim_config_get(&c);
    row got[NROWS];
    nt_sim_report r;
    probe(got, &r);
    for (int i = 0; i < NROWS; i++) {
        if (got[i].cycles != cyc[i])
            fail_msg("trn2 %s: %g cycles, expected %g", got[i].what, got[i].cycles, cyc[i]);
        if (cyc[i] == 0)
            continue;
        int e = i <= 5 || i == 20 ? NT_ENGINE_TENSOR
                : i == 9 || i == 19 ? NT_ENGINE_SCALAR
                : i == 17 ? NT_ENGINE_GPSIMD : NT_ENGINE_VECTOR;
        double want = (cyc[i] < 64 ? 64 : cyc[i]) / c.clock_ghz[e];
        if (i == 19) /* ScalarE loads exp's function table first */
            want += c.act_table_switch_ns;
        if (fabs(got[i].end_ns - got[i].start_ns - want) > 1e-9)
            fail_msg("trn2 %s: %.6f ns, expected %.6f", got[i].what,
                     got[i].end_ns - got[i].start_ns, want);
    }
    /* the DMAs cost what they cost on trn1: same engines, same rate */
    for (int i = 0; i < 3; i++)
        if (got[i].end_ns != trn1_rows[i].end_ns)
            fail_msg("trn2 %s ends at %a, trn1 at %a", got[i].what, got[i].end_ns,
                     trn1_rows[i].end_ns);
    /* ideal TensorE time at trn2's peaks: two 128x128x512 and one 64x128x100 */
    double bf = 2.0 * 128 * 128 * 512 + 2.0 * 128 * 64 * 100, f32 = 2.0 * 128 * 128 * 512;
    double ideal = bf / c.tensor_peak_flops[NT_SIM_MM_BF16] * 1e9 +
                   f32 / c.tensor_peak_flops[NT_SIM_MM_F32] * 1e9;
    assert_true(fabs(r.tensor_ideal_ns - ideal) < 1e-6);
}

/* Sizes: SBUF 224 KiB per partition on trn2 (192 on trn1), PSUM 16 KiB in
 * 2 KiB banks on both. */
static void test_sizes(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++) {
        assert_int_equal(nt_sim_set_target(t ? NT_SIM_TRN2 : NT_SIM_TRN1), 0);
        int64_t sb = (t ? 224 : 192) * 1024;
        nt_sim_kernel *k = open_k = nt_sim_kernel_begin("sizes");
        assert_int_equal(nt_tile_free_bytes(k, NT_MEM_SBUF), sb);
        assert_int_equal(nt_tile_free_bytes(k, NT_MEM_PSUM), 2048);
        assert_non_null(nt_tile_alloc(k, "all", NT_MEM_SBUF, NT_F32, 128, sb / 4));
        assert_int_equal(nt_tile_free_bytes(k, NT_MEM_SBUF), 0);
        for (int i = 0; i < 8; i++)
            assert_non_null(nt_tile_alloc(k, "bank", NT_MEM_PSUM, NT_F32, 128, 512));
        assert_null(nt_tile_alloc(k, "more", NT_MEM_SBUF, NT_BF16, 128, 32));
        assert_int_not_equal(nt_sim_kernel_error(k), 0);
        open_k = NULL;
        nt_sim_kernel_end(k, NULL);
        /* one byte more than SBUF has does not fit */
        k = open_k = nt_sim_kernel_begin("sizes");
        assert_null(nt_tile_alloc(k, "over", NT_MEM_SBUF, NT_BF16, 128, sb / 2 + 32));
        assert_non_null(strstr(nt_sim_kernel_message(k), "SBUF"));
        open_k = NULL;
        nt_sim_kernel_end(k, NULL);
    }
}

/* ------------------------------------------------------------------------ */
/* Bad targets                                                              */
/* ------------------------------------------------------------------------ */

static void test_bad_targets(void **state)
{
    (void)state;
    assert_int_equal(nt_sim_set_target(NT_SIM_TRN2), 0);
    nt_test_expect_err(nt_sim_set_target((nt_sim_target)2), NT_EINVAL, "nt_sim_set_target",
                       "'target'", "NT_SIM_TRN1 or NT_SIM_TRN2");
    nt_test_expect_err(nt_sim_set_target((nt_sim_target)-1), NT_EINVAL, "nt_sim_set_target");
    nt_sim_config c;
    assert_int_equal(nt_sim_config_get(&c), 0);
    assert_int_equal(c.target, NT_SIM_TRN2); /* unchanged */
    memset(&c, 0x5a, sizeof c);
    nt_sim_config before = c;
    nt_test_expect_err(nt_sim_target_config((nt_sim_target)7, &c), NT_EINVAL,
                       "nt_sim_target_config", "'target'");
    assert_memory_equal(&c, &before, sizeof c); /* untouched */
    nt_test_expect_err(nt_sim_target_config(NT_SIM_TRN2, NULL), NT_EINVAL,
                       "nt_sim_target_config", "'out'");
    nt_test_expect_err(nt_sim_config_get(NULL), NT_EINVAL, "nt_sim_config_get", "'out'");
}

/* NT_SIM_TARGET: trn1/v2 and trn2/v3 are read at initialisation; anything
 * else is an error naming the variable, and no target is picked. */
static void test_env_target(void **state)
{
    (void)state;
    static const struct { const char *v; int target; } cases[] = {
        {"trn2", NT_SIM_TRN2}, {"v3", NT_SIM_TRN2}, {"trn1", NT_SIM_TRN1},
        {"v2", NT_SIM_TRN1},   {"trn3", -1},        {"TRN2", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nt_sim_shutdown();
        setenv("NT_SIM_TARGET", cases[i].v, 1);
        if (cases[i].target < 0) {
            nt_test_expect_err(nt_sim_init(), NT_EINVAL, "NT_SIM_TARGET", cases[i].v,
                               "trn1 or trn2");
            continue;
        }
        assert_int_equal(nt_sim_init(), 0);
        nt_sim_config c;
        assert_int_equal(nt_sim_config_get(&c), 0);
        assert_int_equal(c.target, cases[i].target);
    }
    nt_sim_shutdown();
    unsetenv("NT_SIM_TARGET");
    assert_int_equal(nt_sim_init(), 0);
    nt_sim_config c;
    assert_int_equal(nt_sim_config_get(&c), 0);
    assert_int_equal(c.target, NT_SIM_TRN1); /* the default */
}

/* ------------------------------------------------------------------------ */
/* The same bits on both targets                                            */
/* ------------------------------------------------------------------------ */

/* A bf16 linear layer and its gradient on the runtime's sim backend: the
 * target changes the time, never a bit; trn2's matmul is quicker. */
static void test_same_bits(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "eager"), 0);
    uint32_t out[2][40 * 24], grad[2][24 * 130];
    double tensor_ns[2];
    for (int t = 0; t < 2; t++) {
        assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_sim_set_target(t ? NT_SIM_TRN2 : NT_SIM_TRN1), 0);
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_rand(NT_F32, 2, (int64_t[]){40, 130}, 11);
        nt_tensor *w = nt_rand(NT_F32, 2, (int64_t[]){24, 130}, 12);
        assert_int_equal(nt_set_requires_grad(w, true), 0);
        nt_sim_stats s0, s1;
        assert_int_equal(nt_sim_stats_get(&s0), 0);
        assert_int_equal(nt_autocast_begin(NT_BF16), 0);
        nt_tensor *y = nt_linear(x, w, NULL);
        nt_autocast_end();
        nt_tensor *yf = nt_cast(y, NT_F32);
        assert_int_equal(nt_backward(nt_sum(nt_flatten(nt_mul(yf, yf), 0, -1), 0, false)), 0);
        assert_int_equal(nt_to_host(yf, out[t], sizeof out[t]), 0);
        assert_int_equal(nt_to_host(nt_grad(w), grad[t], sizeof grad[t]), 0);
        assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_sim_stats_get(&s1), 0);
        tensor_ns[t] = s1.busy_ns[NT_ENGINE_TENSOR] - s0.busy_ns[NT_ENGINE_TENSOR];
        nt_scope_end(sc);
    }
    assert_memory_equal(out[0], out[1], sizeof out[0]);
    assert_memory_equal(grad[0], grad[1], sizeof grad[0]);
    assert_true(tensor_ns[0] > 0 && tensor_ns[1] > 0);
    /* TensorE at 2.4 GHz against 2.8: the same cycles take 7/6 as long */
    assert_true(fabs(tensor_ns[1] / tensor_ns[0] - 2.8 / 2.4) < 1e-9);
    nt_sim_set_target(NT_SIM_TRN1);
    nt_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_trn1_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trn2_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trn1_unchanged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trn2_costs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_targets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_env_target, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_bits, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
