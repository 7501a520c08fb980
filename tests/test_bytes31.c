/* tests/test_bytes31.c - fewer HBM bytes in a training step: a linear
 * layer's bias gradient (the sum over the rows of its output gradient dY)
 * rides on the matmul of its input gradient dX = dY . W, which reads dY
 * anyway (side sums: fusion/ir.h, fusion/plan.c side_sum_move / side_join,
 * neuron/tp_matmul.c a_colsum, cpu/fused.c run_mm_side).
 *
 *   - nt_tile_matmul's a_colsum against nt__red_sum_f32 (the one reduction
 *     order) bit for bit and a double-precision sum within its bound, on
 *     edge columns (-0, Inf, Inf - Inf, NaN, overflow, subnormals), on the
 *     streaming and the block program, with the program-level product and
 *     per instruction; the product's bits unchanged; its rule errors;
 *   - the same for a bf16 or f16 A with its sums in f32, bf16 or f16
 *     (a_colsum_dtype): each sum the lone sum's (the elements widened, the
 *     one order, rounded once);
 *   - a two-layer MLP's gradients with side sums on both backends, in every
 *     mode and captured, in the simulator's three value modes: the bits of
 *     the CPU's deterministic run; one kernel and one read of dY fewer per
 *     linear layer; the same under bf16 autocast (bf16 dY, bf16 sums cast
 *     to the f32 leaves), with the join and with it disabled;
 *   - the planner's rules: a sum does not move past a write of its input or
 *     a reader of its result, and an op that reads the sum leaves the
 *     matmul's kernel;
 *   - the weight gradient dW = dY^T . X in the same kernel (side products:
 *     fusion/plan.c side_mm_move, neuron/tp_matmul.c args x): the MLP's
 *     gradients with and without it the same bits, one kernel and one read
 *     of dY fewer per linear layer; where the planner keeps dW apart (W's
 *     accumulators past one PSUM bank) and where the tile program cannot
 *     stream (one M-tile: the two programs apart in one kernel); the
 *     planner's rules for the move. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "core/dtype.h"
#include "core/reduce.h"
#include "fusion/fusion.h"
#include "sim/sim.h"
#include "nt_test.h"

/* ---------------- nt_tile_matmul's column sums ---------------- */

/* A [M, K] with edge columns: 0 all -0, 1 one +Inf, 2 +Inf and -Inf, 3 a
 * NaN with a payload, 4 sums past FLT_MAX, 5 subnormals, 6 +-1e30 with
 * small values between (cancellation), the rest random. */
static void fill_a(float *A, int64_t M, int64_t K, uint64_t seed)
{
    uint64_t st = seed;
    nt_test_fill(A, (size_t)(M * K), &st);
    for (int64_t m = 0; m < M; m++) {
        float *r = A + m * K;
        if (K > 0)
            r[0] = -0.0f;
        if (K > 1 && m == M / 2)
            r[1] = INFINITY;
        if (K > 2)
            r[2] = m == 3 ? INFINITY : m == M - 2 ? -INFINITY : r[2];
        if (K > 3 && m == 7)
            r[3] = nt_test_fbits(0x7fa00001u);
        if (K > 4)
            r[4] = 3e37f;
        if (K > 5)
            r[5] = nt_test_fbits((uint32_t)(1 + m % 97)) * (m % 2 ? -1.0f : 1.0f);
        if (K > 6)
            r[6] = m % 3 == 0 ? 1e30f * (m % 2 ? -1.0f : 1.0f) : r[6] * 1e-3f;
    }
}

/* One matmul program on a fresh kernel: A and B of dtype in, C f32, the
 * column sums (colsum, may be NULL) of dtype sd; its simulated ns. */
static double tile_mm_dt(int64_t M, int64_t N, int64_t K, bool b_trans, const void *A,
                         const void *B, float *C, void *colsum, nt_dtype in, nt_dtype sd)
{
    nt_sim_kernel *k = nt_sim_kernel_begin("bytes31.colsum");
    assert_non_null(k);
    nt_tile_matmul_args g;
    memset(&g, 0, sizeof g);
    g.M = M, g.N = N, g.K = K;
    g.a = A, g.lda = K;
    g.b = B, g.ldb = b_trans ? K : N, g.b_trans = b_trans;
    g.in_dtype = in, g.out_dtype = NT_F32;
    g.c = C, g.ldc = N;
    g.a_colsum = colsum;
    g.a_colsum_dtype = sd;
    int rc = nt_tile_matmul(k, &g);
    if (rc)
        fail_msg("nt_tile_matmul: %s", nt_sim_kernel_message(k));
    nt_sim_report rep;
    assert_int_equal(nt_sim_kernel_end(k, &rep), 0);
    return rep.duration_ns;
}

/* The same, all f32. */
static double tile_mm(int64_t M, int64_t N, int64_t K, bool b_trans, const float *A,
                      const float *B, float *C, float *colsum)
{
    return tile_mm_dt(M, N, K, b_trans, A, B, C, colsum, NT_F32, NT_F32);
}

/* The shapes: one M-tile (block program), a partial M-tile and K-tile past
 * one 2048-row block (streaming), three blocks, B^T too long for the
 * streaming program (block program, 33 K-tiles), and B past the
 * streaming program's 64 KiB a partition in f32 with A one block of two
 * M-tiles, every K-tile resident (the block program's sums in one pass per
 * M-tile after the first chunk's K-tiles; B's 40 tiles through a ring of
 * 16). */
static const int64_t cs_shapes[][4] = {{128, 64, 128, 0},  {2248, 100, 300, 0},
                                       {4226, 40, 256, 0}, {2100, 40, 4200, 1},
                                       {130, 2100, 1024, 0}};
#define NSHAPES ((int)(sizeof cs_shapes / sizeof cs_shapes[0]))

static void check_colsum(int s, bool program_gemm)
{
    int64_t M = cs_shapes[s][0], N = cs_shapes[s][1], K = cs_shapes[s][2];
    bool bt = cs_shapes[s][3];
    float *A = malloc((size_t)(M * K) * 4), *B = malloc((size_t)(K * N) * 4);
    float *C0 = malloc((size_t)(M * N) * 4), *C1 = malloc((size_t)(M * N) * 4);
    float *cs = malloc((size_t)K * 4);
    assert_true(A && B && C0 && C1 && cs);
    fill_a(A, M, K, 11 + (uint64_t)s);
    uint64_t st = 99;
    nt_test_fill(B, (size_t)(K * N), &st);
    for (int64_t i = 0; i < K; i++)
        cs[i] = -12345.0f;
    nt__sim_set_program_gemm(program_gemm);
    tile_mm(M, N, K, bt, A, B, C0, NULL);
    tile_mm(M, N, K, bt, A, B, C1, cs);
    nt__sim_set_program_gemm(true);
    for (int64_t i = 0; i < M * N; i++)
        if (nt_test_ubits(C0[i]) != nt_test_ubits(C1[i]))
            fail_msg("shape %d: C[%lld] is %08x with the column sums, %08x without", s,
                     (long long)i, nt_test_ubits(C1[i]), nt_test_ubits(C0[i]));
    for (int64_t c = 0; c < K; c++) {
        float want = nt__red_sum_f32(A + c, M, K);
        if (want != want) /* stored, a NaN is the canonical one (docs/exactness.md) */
            want = nt_test_fbits(0x7fc00000u);
        if (nt_test_ubits(cs[c]) != nt_test_ubits(want))
            fail_msg("shape %d (%s): column %lld sums to %08x, nt__red_sum_f32 %08x", s,
                     program_gemm ? "program product" : "per instruction", (long long)c,
                     nt_test_ubits(cs[c]), nt_test_ubits(want));
        /* independently: a double sum, within M ulps of the magnitudes */
        double d = 0, mag = 0;
        for (int64_t m = 0; m < M; m++)
            d += A[m * K + c], mag += fabs(A[m * K + c]);
        if (isfinite(d) && isfinite(cs[c]) && c != 6)
            assert_true(fabs(cs[c] - d) <= (double)M * 0x1p-24 * mag + 1e-44);
    }
    assert_true(nt_test_ubits(cs[0]) == 0);          /* -0s sum to +0 */
    assert_true(cs[1] == INFINITY);
    assert_true(nt_test_ubits(cs[2]) == 0x7fc00000u); /* Inf - Inf: the canonical NaN */
    assert_true(nt_test_ubits(cs[3]) == 0x7fc00000u); /* a payload made canonical */
    assert_true(cs[4] == INFINITY);
    free(A), free(B), free(C0), free(C1), free(cs);
}

static void test_tile_colsum(void **state)
{
    (void)state;
    for (int s = 0; s < NSHAPES; s++)
        for (int pg = 1; pg >= 0; pg--)
            check_colsum(s, pg);
}

/* A bf16 or f16 A (fill_a's values rounded to it) with its sums in f32,
 * bf16 or f16: each column the lone sum's arithmetic (cpu/reduce.c: the
 * elements widened to f32, nt__red_sum_f32's order, rounded once by the
 * store every op makes), the product's bits unchanged. */
static void check_colsum_half(int s, nt_dtype in, nt_dtype sd, bool program_gemm)
{
    int64_t M = cs_shapes[s][0], N = cs_shapes[s][1], K = cs_shapes[s][2];
    bool bt = cs_shapes[s][3];
    size_t es = nt_dtype_size(in), ss = nt_dtype_size(sd);
    float *A32 = malloc((size_t)(M * K) * 4), *B32 = malloc((size_t)(K * N) * 4);
    float *col = malloc((size_t)M * 4);
    char *A = malloc((size_t)(M * K) * es), *B = malloc((size_t)(K * N) * es);
    float *C0 = malloc((size_t)(M * N) * 4), *C1 = malloc((size_t)(M * N) * 4);
    char *cs = malloc((size_t)K * ss), *want = malloc(ss);
    assert_true(A32 && B32 && col && A && B && C0 && C1 && cs && want);
    fill_a(A32, M, K, 31 + (uint64_t)s);
    uint64_t st = 98;
    nt_test_fill(B32, (size_t)(K * N), &st);
    for (int64_t i = 0; i < M * K; i++)
        nt__store_f32(A, in, i, A32[i]);
    for (int64_t i = 0; i < K * N; i++)
        nt__store_f32(B, in, i, B32[i]);
    memset(cs, 0x5a, (size_t)K * ss);
    nt__sim_set_program_gemm(program_gemm);
    for (int with = 0; with < 2; with++)
        tile_mm_dt(M, N, K, bt, A, B, with ? C1 : C0, with ? cs : NULL, in, sd);
    nt__sim_set_program_gemm(true);
    assert_memory_equal(C0, C1, (size_t)(M * N) * 4);
    for (int64_t c = 0; c < K; c++) {
        for (int64_t m = 0; m < M; m++)
            col[m] = nt__load_f32(A, in, m * K + c);
        float f = nt__red_sum_f32(col, M, 1);
        nt__store_f32(want, sd, 0, f);
        if (memcmp(cs + c * (int64_t)ss, want, ss))
            fail_msg("shape %d, %s A, %s sums (%s): column %lld is not the lone sum's", s,
                     nt_dtype_name(in), nt_dtype_name(sd),
                     program_gemm ? "program product" : "per instruction", (long long)c);
        /* independently: a double sum of the widened column, within M ulps
         * of the magnitudes and the final rounding */
        double d = 0, mag = 0;
        for (int64_t m = 0; m < M; m++)
            d += col[m], mag += fabs(col[m]);
        float got = nt__load_f32(cs, sd, c);
        if (isfinite(d) && isfinite(got) && c != 6)
            assert_true(fabs(got - d) <= (double)M * 0x1p-24 * mag + fabs(d) * 0x1p-8 + 1e-44);
    }
    free(A32), free(B32), free(col), free(A), free(B), free(C0), free(C1), free(cs), free(want);
}

static void test_tile_colsum_half(void **state)
{
    (void)state;
    static const nt_dtype ins[] = {NT_BF16, NT_F16}, sds[] = {NT_F32, NT_BF16, NT_F16};
    for (int s = 0; s < NSHAPES; s++)
        for (int i = 0; i < 2; i++)
            for (int d = 0; d < 3; d++)
                for (int pg = 1; pg >= 0; pg--)
                    if (pg || s < 3) /* per instruction: the long B^T shape once, in f32 */
                        check_colsum_half(s, ins[i], sds[d], pg);
}

/* The rule: f32, bf16 or f16 A given row-major; M, N >= 1; sums f32, bf16
 * or f16.  The kernel fails, saying so. */
static void test_tile_colsum_rules(void **state)
{
    (void)state;
    static float A[128 * 8], B[8 * 8], C[128 * 8], cs[8];
    static const char *const says[] = {"transposed", "e4m3", "M=0", "sums i32"};
    for (int c = 0; c < 4; c++) {
        nt_sim_kernel *k = nt_sim_kernel_begin("bytes31.rule");
        assert_non_null(k);
        nt_tile_matmul_args g = {128, 8, 8, A, c == 0 ? 128 : 8, c == 0, B, 8,
                                 c == 1 ? NT_E4M3 : NT_F32, C, 8, NT_F32};
        g.M = c == 2 ? 0 : 128;
        g.a_colsum = cs;
        g.a_colsum_dtype = c == 3 ? NT_I32 : NT_F32;
        assert_int_not_equal(nt_tile_matmul(k, &g), 0);
        const char *m = nt_sim_kernel_message(k);
        assert_non_null(m);
        assert_non_null(strstr(m, "nt_tile_matmul"));
        assert_non_null(strstr(m, "a_colsum"));
        assert_non_null(strstr(m, says[c]));
        assert_int_not_equal(nt_sim_kernel_end(k, NULL), 0);
        nt_clear_error();
    }
}

/* ---------------- a two-layer MLP's gradients ---------------- */

/* x [B, T, D] -> linear(D, H) -> gelu -> linear(H, O); loss = sum(z * c).
 * c has a column of -0 (dY's column of -0s: its bias gradient is +0), one
 * with an Inf, the rest random: dY = c. */
enum { NPAR = 5 };
typedef struct mlp {
    int64_t B, T, D, H, O;
} mlp;
static const mlp shapes[] = {{1, 148, 24, 40, 16}, {2, 1152, 64, 130, 200}};

typedef struct grads {
    float *g[NPAR]; /* x, w1, b1, w2, b2 */
    int64_t n[NPAR];
    uint64_t sim_kernels, sim_hbm, kernels;
    int64_t graph_kernels;
} grads;

static nt_tensor *rand_t(int nd, const int64_t *sh, uint64_t seed, float scale)
{
    int64_t n = nt_test_numel(nd, sh);
    float *v = malloc((size_t)n * 4);
    assert_non_null(v);
    uint64_t st = seed;
    nt_test_fill(v, (size_t)n, &st);
    for (int64_t i = 0; i < n; i++)
        v[i] *= scale;
    nt_tensor *t = nt_from_host(v, NT_F32, nd, sh);
    free(v);
    assert_non_null(t);
    return t;
}

static nt_tensor *weight_c(const mlp *m)
{
    int64_t sh[3] = {m->B, m->T, m->O}, n = nt_test_numel(3, sh);
    float *v = malloc((size_t)n * 4);
    assert_non_null(v);
    uint64_t st = 5;
    nt_test_fill(v, (size_t)n, &st);
    for (int64_t i = 0; i < n; i++) {
        if (i % m->O == 1)
            v[i] = -0.0f;
        if (i % m->O == 2 && i / m->O == 9)
            v[i] = INFINITY;
    }
    nt_tensor *t = nt_from_host(v, NT_F32, 3, sh);
    free(v);
    return t;
}

/* mlp_step: the forward under bf16 autocast (dY and the bias gradients'
 * sums bf16, cast back to the f32 leaves) */
static bool amp;

/* The step's forward and backward (grads accumulate into the leaves). */
static void mlp_step(nt_tensor *const *p, nt_tensor *c)
{
    nt_scope *s = nt_scope_begin();
    if (amp)
        assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    nt_tensor *h = nt_gelu(nt_linear(p[0], p[1], p[2]));
    nt_tensor *z = nt_linear(h, p[3], p[4]);
    nt_tensor *loss = nt_sum(nt_mul(z, c), NT_DIM_ALL, false);
    if (amp)
        assert_int_equal(nt_autocast_end(), 0);
    assert_int_equal(nt_backward(loss), 0);
    nt_scope_end(s);
}

/* mode: an NT_MODE, or "captured" (a lazy step captured, then replayed
 * twice with the gradients zeroed between); vals: the simulator's value
 * modes, 0 default, 1 NT_SIM_PROGRAM_VALUES=0, 2 also NT_SIM_PROGRAM_GEMM=0. */
/* NT_FOREACH=0 in run_mlp: each program a kernel of its own */
static bool unshared;
/* nt__fplan_nopair in run_mlp: each weight gradient a kernel of its own */
static bool nopair;

static void run_mlp(const mlp *m, const char *be, const char *mode, int vals, bool side,
                    grads *r)
{
    nt_shutdown();
    AO_store(&nt__fplan_noside, side ? 0 : 1);
    AO_store(&nt__fplan_nopair, nopair ? 1 : 0);
    assert_int_equal(nt_init(), 0);
    bool cap = !strcmp(mode, "captured");
    assert_int_equal(nt_config_set("NT_BACKEND", be), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(be, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", cap ? "lazy" : mode), 0);
    assert_int_equal(nt_config_set("NT_FOREACH", unshared ? "0" : "1"), 0);
    nt__sim_set_program_values(!vals);
    nt__sim_set_program_gemm(vals != 2);
    int64_t sx[3] = {m->B, m->T, m->D}, s1[2] = {m->H, m->D}, sb1[1] = {m->H},
            s2[2] = {m->O, m->H}, sb2[1] = {m->O};
    nt_tensor *p[NPAR] = {rand_t(3, sx, 1, 1.0f), rand_t(2, s1, 2, 0.3f), rand_t(1, sb1, 3, 0.1f),
                          rand_t(2, s2, 4, 0.2f), rand_t(1, sb2, 6, 0.1f)};
    nt_tensor *c = weight_c(m);
    for (int i = 0; i < NPAR; i++)
        if (nt_set_requires_grad(p[i], true))
            fail_msg("nt_set_requires_grad: %s", nt_last_error_message());
    nt_graph *g = NULL;
    r->graph_kernels = -1;
    if (cap) {
        assert_int_equal(nt_graph_capture_begin(), 0);
        mlp_step(p, c);
        g = nt_graph_capture_end();
        assert_non_null(g);
    }
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    if (cap) {
        for (int rep = 0; rep < 2; rep++) {
            assert_int_equal(nt_sync(), 0);
            for (int i = 0; i < NPAR; i++)
                assert_int_equal(nt_zero_grad(p[i]), 0);
            assert_int_equal(nt_graph_replay(g), 0);
        }
    } else {
        mlp_step(p, c);
    }
    assert_int_equal(nt_sync(), 0);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    r->sim_kernels = cap ? st.graph_kernels_replayed / 2 : st.sim_kernels;
    r->sim_hbm = cap ? st.graph_sim_hbm_bytes / 2 : st.sim_hbm_bytes;
    r->kernels = st.kernels_launched;
    if (g) {
        nt_graph_info gi;
        assert_int_equal(nt_graph_info_get(g, &gi), 0);
        r->graph_kernels = gi.kernels;
        nt_graph_destroy(g);
    }
    for (int i = 0; i < NPAR; i++) {
        nt_tensor *gr = nt_grad(p[i]);
        assert_non_null(gr);
        r->n[i] = nt_test_tnumel(gr);
        r->g[i] = nt_test_host(gr);
        nt_release(gr);
        nt_release(p[i]);
    }
    nt_release(c);
    assert_int_equal(nt_sync(), 0);
    AO_store(&nt__fplan_noside, 0);
    AO_store(&nt__fplan_nopair, 0);
    nt__sim_set_program_values(true);
    nt__sim_set_program_gemm(true);
}

static void grads_free(grads *r)
{
    for (int i = 0; i < NPAR; i++)
        free(r->g[i]);
}

static void expect_same(const grads *a, const grads *ref, const char *what)
{
    static const char *const names[NPAR] = {"x", "w1", "b1", "w2", "b2"};
    for (int i = 0; i < NPAR; i++)
        for (int64_t j = 0; j < ref->n[i]; j++)
            if (nt_test_ubits(a->g[i][j]) != nt_test_ubits(ref->g[i][j]))
                fail_msg("%s: grad of %s [%lld] is %08x, the CPU's deterministic %08x", what,
                         names[i], (long long)j, nt_test_ubits(a->g[i][j]),
                         nt_test_ubits(ref->g[i][j]));
}

/* Lazy and captured with the side sums on and off (NT_FOREACH=0): the
 * bits of ref, and two kernels fewer with them (one a linear layer), on
 * both backends, dY read once less on the simulator. */
static void side_on_off(const mlp *m, int be, const char *mode, const grads *ref,
                        const char *what)
{
    grads on, off;
    unshared = true;
    run_mlp(m, be ? "sim" : "cpu", mode, 0, true, &on);
    run_mlp(m, be ? "sim" : "cpu", mode, 0, false, &off);
    unshared = false;
    expect_same(&on, ref, what);
    expect_same(&off, ref, what);
    print_message("# %s: kernels %llu -> %llu (graph %lld -> %lld), sim HBM "
                  "%llu -> %llu bytes\n",
                  what, (unsigned long long)off.kernels, (unsigned long long)on.kernels,
                  (long long)off.graph_kernels, (long long)on.graph_kernels,
                  (unsigned long long)off.sim_hbm, (unsigned long long)on.sim_hbm);
    if (!strcmp(mode, "captured"))
        assert_int_equal(off.graph_kernels - on.graph_kernels, 2);
    else
        assert_int_equal(off.kernels - on.kernels, 2);
    if (be) {
        assert_int_equal(off.sim_kernels - on.sim_kernels, 2);
        assert_true(off.sim_hbm > on.sim_hbm);
    }
    grads_free(&on), grads_free(&off);
}

/* Every shape, backend, mode and value mode, captured too: the bits of the
 * CPU's deterministic run (one step op by op, no fusion at all), `tag`
 * before each case's name; side: lazy and captured also with the side sums
 * on and off (side_on_off). */
static void mlp_every_mode(const char *tag, bool side)
{
    static const char *const modes[] = {"deterministic", "eager", "adaptive", "lazy",
                                        "captured"};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        grads ref;
        run_mlp(&shapes[s], "cpu", "deterministic", 0, true, &ref);
        /* the bias gradients' -0 column sums to +0, the Inf column to Inf */
        assert_true(nt_test_ubits(ref.g[4][1]) == 0);
        assert_true(ref.g[4][2] == INFINITY);
        for (int be = 0; be < 2; be++)
            for (int md = 0; md < 5; md++)
                for (int vals = 0; vals < (be ? 3 : 1); vals++) {
                    if (vals == 2 && (s > 0 || md == 0 || md == 4))
                        continue; /* per instruction: slow; the small shape shows it */
                    char what[128];
                    snprintf(what, sizeof what, "%sshape %zu, %s, %s, values %d", tag, s,
                             be ? "sim" : "cpu", modes[md], vals);
                    grads r;
                    run_mlp(&shapes[s], be ? "sim" : "cpu", modes[md], vals, true, &r);
                    expect_same(&r, &ref, what);
                    grads_free(&r);
                    if (side && md >= 3 && !vals)
                        side_on_off(&shapes[s], be, modes[md], &ref, what);
                }
        grads_free(&ref);
    }
}

/* Every backend, mode and value mode, captured too: the deterministic CPU
 * run's bits (one step op by op, no fusion at all). */
static void test_mlp_same_bits(void **state)
{
    (void)state;
    mlp_every_mode("", false);
}

/* Lazy and captured on the simulator: each of the two linear layers' bias
 * sums runs inside its dX matmul's kernel, one kernel fewer each, and dY
 * [rows, out] is read once less (less the sums' own loads of nothing: the
 * sums leave as before).  Every program a kernel of its own (NT_FOREACH=0):
 * else the two sums alone wait past the matmuls and share one kernel. */
static void test_mlp_kernels_bytes(void **state)
{
    (void)state;
    unshared = true;
    const mlp *m = &shapes[1];
    int64_t rows = m->B * m->T;
    uint64_t dy = (uint64_t)(rows * (m->H + m->O)) * 4;
    for (int cap = 0; cap < 2; cap++) {
        grads on, off;
        run_mlp(m, "sim", cap ? "captured" : "lazy", 0, true, &on);
        run_mlp(m, "sim", cap ? "captured" : "lazy", 0, false, &off);
        print_message("# %s: kernels %llu -> %llu, HBM %llu -> %llu bytes (dY %llu)\n",
                      cap ? "captured" : "lazy", (unsigned long long)off.sim_kernels,
                      (unsigned long long)on.sim_kernels, (unsigned long long)off.sim_hbm,
                      (unsigned long long)on.sim_hbm, (unsigned long long)dy);
        assert_int_equal(off.sim_kernels - on.sim_kernels, 2);
        if (cap)
            assert_int_equal(off.graph_kernels - on.graph_kernels, 2);
        assert_true(off.sim_hbm > on.sim_hbm);
        assert_true(off.sim_hbm - on.sim_hbm >= dy * 99 / 100 &&
                    off.sim_hbm - on.sim_hbm <= dy);
        expect_same(&on, &off, cap ? "captured" : "lazy");
        grads_free(&on), grads_free(&off);
    }
    unshared = false;
}

/* Under bf16 autocast dY is bf16 and so is its bias gradient's sum (cast
 * back to the f32 leaf): the side sum widens dY's elements to f32, sums
 * them in the one order and rounds once to bf16, as the sum run alone.
 * Every backend, mode and value mode, captured too: the bits of the CPU's
 * deterministic run (each sum its own kernel, no fusion).  Lazy and
 * captured, every program a kernel of its own: with the side sums each
 * linear layer's sum joins its dX matmul, one kernel fewer each on both
 * backends (and dY read once less on the simulator); with them disabled
 * (nt__fplan_noside) the same bits. */
static void test_mlp_bf16_side(void **state)
{
    (void)state;
    amp = true;
    mlp_every_mode("bf16 ", true);
    amp = false;
}

/* ---------------- the planner's rules ---------------- */

/* s = sum(x, 0) of x seen as [rows, K], then `between`, then x . w; the
 * values against deterministic mode (no reordering). */
enum { B_NONE, B_WRITE_X, B_READ_S, B_ADD_S };
static void rule_case(int between, float *out_s, float *out_y, const char *mode)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    int64_t sx[3] = {2, 160, 48}, sw[2] = {48, 48}, s2[2] = {320, 48};
    nt_tensor *x = rand_t(3, sx, 7, 1.0f), *w = rand_t(2, sw, 8, 0.5f);
    nt_tensor *s = nt_sum(nt_reshape(x, 2, s2), 0, false);
    nt_tensor *t = NULL;
    if (between == B_WRITE_X)
        assert_int_equal(nt_mul_scalar_inplace(x, 2.0), 0);
    if (between == B_READ_S)
        t = nt_mul_scalar(s, 3.0);
    nt_tensor *y = nt_matmul(x, w);
    if (between == B_ADD_S)
        y = nt_add(y, s); /* reads the sum: not in the matmul's kernel */
    assert_int_equal(nt_to_host(s, out_s, 48 * 4), 0);
    assert_int_equal(nt_to_host(y, out_y, 320 * 48 * 4), 0);
    if (t) {
        float tv[48];
        assert_int_equal(nt_to_host(t, tv, sizeof tv), 0);
        for (int i = 0; i < 48; i++)
            assert_true(tv[i] == out_s[i] * 3.0f);
    }
    nt_release(t), nt_release(y), nt_release(s), nt_release(x), nt_release(w);
}

static void test_planner_rules(void **state)
{
    (void)state;
    static float s0[48], y0[320 * 48], s1[48], y1[320 * 48];
    for (int b = B_NONE; b <= B_ADD_S; b++) {
        rule_case(b, s0, y0, "deterministic");
        rule_case(b, s1, y1, "lazy");
        assert_memory_equal(s0, s1, sizeof s0);
        assert_memory_equal(y0, y1, sizeof y0);
    }
    /* the write of x after the sum: the sum saw x before it (x's first
     * row's elements are summed from the values before doubling) */
    rule_case(B_NONE, s0, y0, "deterministic");
    rule_case(B_WRITE_X, s1, y1, "lazy");
    assert_memory_equal(s0, s1, sizeof s0);
}

/* ---------------- the weight gradient beside the input gradient ---------------- */

/* The shapes: the big MLP (both layers pair); one M-tile of 128 rows (the
 * planner pairs both, the tile program cannot stream: the two programs
 * apart in one kernel, dY read twice); the first layer's X 600 wide (W's
 * accumulators past one PSUM bank: the planner keeps its dW apart). */
static const mlp pair_shapes[] = {{2, 1152, 64, 130, 200}, {1, 128, 24, 40, 16}, {1, 160, 600, 40, 16}};
static const int pair_kernels[] = {2, 2, 1};

/* Lazy and captured on both backends, with and without the pairs (every
 * program a kernel of its own): the bits of the CPU's deterministic run;
 * the simulator's kernels and HBM bytes. */
static void test_pair_kernels_bytes(void **state)
{
    (void)state;
    unshared = true;
    for (int s = 0; s < 3; s++) {
        const mlp *m = &pair_shapes[s];
        int64_t rows = m->B * m->T;
        uint64_t dy2 = (uint64_t)(rows * m->O) * 4, dy = (uint64_t)(rows * (m->H + m->O)) * 4;
        grads ref;
        run_mlp(m, "cpu", "deterministic", 0, true, &ref);
        for (int be = 0; be < 2; be++)
            for (int cap = 0; cap < 2; cap++) {
                grads on, off;
                const char *mode = cap ? "captured" : "lazy";
                nopair = false;
                run_mlp(m, be ? "sim" : "cpu", mode, 0, true, &on);
                nopair = true;
                run_mlp(m, be ? "sim" : "cpu", mode, 0, true, &off);
                nopair = false;
                char what[96];
                snprintf(what, sizeof what, "pair shape %d, %s, %s", s, be ? "sim" : "cpu", mode);
                expect_same(&on, &ref, what);
                expect_same(&off, &ref, what);
                if (cap) {
                    assert_int_equal(off.graph_kernels - on.graph_kernels, pair_kernels[s]);
                } else {
                    assert_int_equal(off.kernels - on.kernels, pair_kernels[s]);
                }
                if (be) {
                    print_message("# %s: kernels %llu -> %llu, HBM %llu -> %llu bytes (dY %llu)\n",
                                  what, (unsigned long long)off.sim_kernels,
                                  (unsigned long long)on.sim_kernels,
                                  (unsigned long long)off.sim_hbm, (unsigned long long)on.sim_hbm,
                                  (unsigned long long)dy);
                    assert_int_equal(off.sim_kernels - on.sim_kernels, pair_kernels[s]);
                    if (s == 0) /* dY of both layers read once less */
                        assert_true(off.sim_hbm >= on.sim_hbm + dy * 99 / 100);
                    else if (s == 1) /* apart: dY still read twice */
                        assert_true(on.sim_hbm + dy2 / 2 > off.sim_hbm);
                    else /* the second layer's dY alone */
                        assert_true(off.sim_hbm >= on.sim_hbm + dy2 * 99 / 100 &&
                                    off.sim_hbm < on.sim_hbm + dy);
                }
                grads_free(&on), grads_free(&off);
            }
        grads_free(&ref);
    }
    unshared = false;
}

/* w = dy^T . x (autograd's weight gradient in w's layout), `between`, then
 * dx = dy . b: values against deterministic mode (no reordering) on both
 * backends, and the kernels lazy mode runs with the pair allowed, less
 * those with it forbidden (nt__fplan_nopair): -1 where w joins dx's
 * kernel, else 0. */
enum { P_NONE, P_WRITE_X, P_WRITE_DY, P_READ_W, P_WIDE, P_COUNT };
static uint64_t pair_case(int between, const char *be, const char *mode, bool pair, float *out_w,
                          float *out_dx)
{
    nt_shutdown();
    AO_store(&nt__fplan_nopair, pair ? 0 : 1);
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", be), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(be, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_FOREACH", "0"), 0);
    int64_t NX = between == P_WIDE ? 520 : 40;
    int64_t sy[2] = {256, 48}, sx[2] = {256, NX}, sb[2] = {48, 64};
    nt_tensor *dy = rand_t(2, sy, 21, 1.0f), *x = rand_t(2, sx, 22, 1.0f), *b = rand_t(2, sb, 23, 0.5f);
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_tensor *w = nt_matmul(nt_transpose(dy, 0, 1), x);
    nt_tensor *t = NULL;
    if (between == P_WRITE_X)
        assert_int_equal(nt_mul_scalar_inplace(x, 2.0), 0);
    if (between == P_WRITE_DY)
        assert_int_equal(nt_mul_scalar_inplace(dy, 2.0), 0);
    if (between == P_READ_W)
        t = nt_mul_scalar(w, 3.0); /* w's own epilogue: w stays with it */
    nt_tensor *dx = nt_matmul(dy, b);
    assert_int_equal(nt_sync(), 0);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    assert_int_equal(nt_to_host(w, out_w, (size_t)(48 * NX) * 4), 0);
    assert_int_equal(nt_to_host(dx, out_dx, 256 * 64 * 4), 0);
    if (t) {
        float *tv = malloc((size_t)(48 * NX) * 4);
        assert_non_null(tv);
        assert_int_equal(nt_to_host(t, tv, (size_t)(48 * NX) * 4), 0);
        for (int64_t i = 0; i < 48 * NX; i++)
            assert_true(nt_test_ubits(tv[i]) == nt_test_ubits(out_w[i] * 3.0f));
        free(tv);
    }
    nt_release(t), nt_release(dx), nt_release(w), nt_release(b), nt_release(x), nt_release(dy);
    AO_store(&nt__fplan_nopair, 0);
    return st.kernels_launched;
}

static void test_pair_rules(void **state)
{
    (void)state;
    enum { NW = 48 * 520, NDX = 256 * 64 };
    float *w0 = malloc(NW * 4), *w1 = malloc(NW * 4), *d0 = malloc(NDX * 4), *d1 = malloc(NDX * 4);
    assert_true(w0 && w1 && d0 && d1);
    nt__fplan_check = true;
    AO_store(&nt__fplan_mismatch, 0);
    for (int be = 0; be < 2; be++)
        for (int c = P_NONE; c < P_COUNT; c++) {
            const char *bn = be ? "sim" : "cpu";
            size_t nw = (size_t)(48 * (c == P_WIDE ? 520 : 40)) * 4;
            pair_case(c, bn, "deterministic", true, w0, d0);
            uint64_t kon = pair_case(c, bn, "lazy", true, w1, d1);
            if (memcmp(w0, w1, nw) || memcmp(d0, d1, NDX * 4))
                fail_msg("%s, case %d: lazy's values are not deterministic mode's", bn, c);
            uint64_t koff = pair_case(c, bn, "lazy", false, w1, d1);
            assert_memory_equal(w0, w1, nw);
            assert_memory_equal(d0, d1, NDX * 4);
            print_message("# %s, case %d: kernels %llu paired, %llu apart\n", bn, c,
                          (unsigned long long)kon, (unsigned long long)koff);
            assert_int_equal((int64_t)koff - (int64_t)kon, c == P_NONE ? 1 : 0);
        }
    nt__fplan_check = false;
    /* the passes as the planner runs them give the reference order */
    assert_int_equal(AO_load(&nt__fplan_mismatch), 0);
    /* the write of x after dW: dW saw x before it (deterministic mode's w
     * with the write, against lazy's without: the same) */
    pair_case(P_NONE, "sim", "deterministic", true, w0, d0);
    pair_case(P_WRITE_X, "sim", "lazy", true, w1, d1);
    assert_memory_equal(w0, w1, 48 * 40 * 4);
    free(w0), free(w1), free(d0), free(d1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tile_colsum, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_tile_colsum_half, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_tile_colsum_rules, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_mlp_same_bits, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_mlp_kernels_bytes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_mlp_bf16_side, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_planner_rules, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_pair_kernels_bytes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_pair_rules, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
