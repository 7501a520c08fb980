/* bench/sim_fidelity.c - the simulator against published hardware times.
 *
 * AWS's NKI matmul tutorial computes bf16 result[M, N] = lhsT[K, M]^T . rhs[K, N]
 * with M = 4096, K = N = 8192 on one NeuronCore-v2 in four steps and
 * publishes the time of each: basic tiling 51.8 ms, hoisted loads 43.0 ms,
 * blocked free dims 22.1 ms, fully optimised 6.97 ms.  Each step is written
 * below as a tile program on our ISA with the tutorial's loop structure,
 * tile shapes and loads, and run timing-only on the simulated trn1 core.
 *
 * What NKI leaves to its compiler we have to spell out (docs/sim.md):
 *   - buffers: a tile declared inside a loop gets two rotating buffers when
 *     SBUF has room for two, else one; PSUM result tiles get two banks;
 *   - DMA queues: loads of lhsT alternate over queues 0-1, loads of rhs over
 *     2-3, stores use queue 4 (two queues per input operand);
 *   - the optimised step packs its result in bf16 (our dma_copy does not
 *     convert dtypes; the tutorial packs f32 and lets the DMA cast).
 * Then the library's own matmul program (neuron/tp_matmul.c) runs the same
 * shape, and its share of TensorE peak is printed.
 *
 * Then the same programs run on the simulated trn2 core (NeuronCore-v3).
 * AWS publishes no trn2 times for them: its trn2 version of the tutorial
 * (the NKI "Introduction to NKI Kernel Optimization" guide, the same four
 * kernels and shapes with platform_target="trn2") gives only the profiler's
 * engine activity, printed beside ours (docs/sim.md, section 5).
 *
 * Runs in a few seconds: nothing is computed, only timed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/isa.h"

enum { TM = 128, TK = 128, TN = 512 };

static const int64_t M = 4096, K = 8192, N = 8192;
static void *lhsT, *rhs, *result; /* HBM: malloc'ed, never touched */

#define CHECK(x)                                                                      \
    do {                                                                              \
        int rc_ = (x);                                                                \
        if (rc_) {                                                                    \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, nt_sim_kernel_message(k)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* rotating buffers: `n` tiles of one shape */
typedef struct ring {
    nt_tile *t[64 * 2];
    int n, next;
} ring;

static void ring_alloc(nt_sim_kernel *k, ring *r, const char *name, nt_mem mem, nt_dtype dt,
                       int parts, int64_t size, int n)
{
    r->n = n;
    r->next = 0;
    for (int i = 0; i < n; i++) {
        r->t[i] = nt_tile_alloc(k, name, mem, dt, parts, size);
        if (!r->t[i]) {
            fprintf(stderr, "%s\n", nt_sim_kernel_message(k));
            exit(1);
        }
    }
}

static nt_tile *ring_get(ring *r)
{
    nt_tile *t = r->t[r->next];
    r->next = (r->next + 1) % r->n;
    return t;
}

static int q_lhs, q_rhs;
static int lhs_q(void) { return (q_lhs++ & 1); }
static int rhs_q(void) { return 2 + (q_rhs++ & 1); }
enum { Q_OUT = 4 };

static nt_ap lhsT_ap(int64_t k0, int64_t m0, int64_t mw)
{
    return nt_hbm_ap(lhsT, NT_BF16, k0 * M + m0, TK, M, mw);
}

static nt_ap rhs_ap(int64_t k0, int64_t n0, int64_t nw)
{
    return nt_hbm_ap(rhs, NT_BF16, k0 * N + n0, TK, N, nw);
}

static nt_ap result_ap(int64_t m0, int64_t n0, int64_t nw)
{
    return nt_hbm_ap(result, NT_BF16, m0 * N + n0, TM, N, nw);
}

/* PSUM -> SBUF (cast to bf16) -> HBM */
static void write_back(nt_sim_kernel *k, ring *res, nt_tile *psum, int64_t m0, int64_t n0)
{
    nt_tile *sb = ring_get(res);
    nt_ap s = nt_tile_ap(sb), p = nt_tile_ap(psum), d = result_ap(m0, n0, TN);
    CHECK(nt_isa_tensor_copy(k, &s, &p, NT_ENGINE_VECTOR));
    CHECK(nt_isa_dma_copy(k, &d, &s, Q_OUT));
}

/* Step 1, nki_matmul_tiled_: every K-step loads its lhsT and rhs tiles. */
static void basic(nt_sim_kernel *k)
{
    ring lt, rt, ps, res;
    ring_alloc(k, &lt, "lhsT_tile", NT_MEM_SBUF, NT_BF16, TK, TM, 2);
    ring_alloc(k, &rt, "rhs_tile", NT_MEM_SBUF, NT_BF16, TK, TN, 2);
    ring_alloc(k, &ps, "res_psum", NT_MEM_PSUM, NT_F32, TM, TN, 2);
    ring_alloc(k, &res, "res_sb", NT_MEM_SBUF, NT_BF16, TM, TN, 2);
    for (int64_t m = 0; m < M / TM; m++)
        for (int64_t n = 0; n < N / TN; n++) {
            nt_tile *p = ring_get(&ps);
            nt_ap P = nt_tile_ap(p);
            for (int64_t kk = 0; kk < K / TK; kk++) {
                nt_tile *l = ring_get(&lt), *r = ring_get(&rt);
                nt_ap L = nt_tile_ap(l), R = nt_tile_ap(r);
                nt_ap hl = lhsT_ap(kk * TK, m * TM, TM), hr = rhs_ap(kk * TK, n * TN, TN);
                CHECK(nt_isa_dma_copy(k, &L, &hl, lhs_q()));
                CHECK(nt_isa_dma_copy(k, &R, &hr, rhs_q()));
                CHECK(nt_isa_nc_matmul(k, &P, &L, &R, kk > 0));
            }
            write_back(k, &res, p, m * TM, n * TN);
        }
}

/* Step 2, nki_matmul_hoist_load_: a column of lhsT tiles per m, a column of
 * rhs tiles per n, then the K-steps. */
static void hoisted(nt_sim_kernel *k)
{
    enum { KT = 8192 / TK };
    ring lt, rt, ps, res;
    ring_alloc(k, &lt, "lhsT_tiles", NT_MEM_SBUF, NT_BF16, TK, TM, 2 * KT);
    ring_alloc(k, &rt, "rhs_tiles", NT_MEM_SBUF, NT_BF16, TK, TN, 2 * KT);
    ring_alloc(k, &ps, "res_psum", NT_MEM_PSUM, NT_F32, TM, TN, 2);
    ring_alloc(k, &res, "res_sb", NT_MEM_SBUF, NT_BF16, TM, TN, 2);
    for (int64_t m = 0; m < M / TM; m++) {
        nt_tile *l[KT];
        for (int kk = 0; kk < KT; kk++) {
            l[kk] = ring_get(&lt);
            nt_ap L = nt_tile_ap(l[kk]), h = lhsT_ap(kk * TK, m * TM, TM);
            CHECK(nt_isa_dma_copy(k, &L, &h, lhs_q()));
        }
        for (int64_t n = 0; n < N / TN; n++) {
            nt_tile *r[KT];
            for (int kk = 0; kk < KT; kk++) {
                r[kk] = ring_get(&rt);
                nt_ap R = nt_tile_ap(r[kk]), h = rhs_ap(kk * TK, n * TN, TN);
                CHECK(nt_isa_dma_copy(k, &R, &h, rhs_q()));
            }
            nt_tile *p = ring_get(&ps);
            nt_ap P = nt_tile_ap(p);
            for (int kk = 0; kk < KT; kk++) {
                nt_ap L = nt_tile_ap(l[kk]), R = nt_tile_ap(r[kk]);
                CHECK(nt_isa_nc_matmul(k, &P, &L, &R, kk > 0));
            }
            write_back(k, &res, p, m * TM, n * TN);
        }
    }
}

/* Step 3, nki_matmul_block_free_dimension_: blocks of 2 M-tiles and 2
 * N-tiles share their loads. */
static void blocked(nt_sim_kernel *k)
{
    enum { KT = 8192 / TK, BM = 2, BN = 2 };
    ring lt, rt, ps, res;
    /* one set each: two rhs sets (256 KiB per partition) do not fit SBUF */
    ring_alloc(k, &lt, "lhsT_tiles", NT_MEM_SBUF, NT_BF16, TK, TM, BM * KT);
    ring_alloc(k, &rt, "rhs_tiles", NT_MEM_SBUF, NT_BF16, TK, TN, BN * KT);
    ring_alloc(k, &ps, "result_tile", NT_MEM_PSUM, NT_F32, TM, TN, 2);
    ring_alloc(k, &res, "result_tmp", NT_MEM_SBUF, NT_BF16, TM, TN, 2);
    for (int64_t m = 0; m < M / (TM * BM); m++) {
        nt_tile *l[BM][KT];
        for (int bm = 0; bm < BM; bm++)
            for (int kk = 0; kk < KT; kk++) {
                l[bm][kk] = ring_get(&lt);
                nt_ap L = nt_tile_ap(l[bm][kk]), h = lhsT_ap(kk * TK, (m * BM + bm) * TM, TM);
                CHECK(nt_isa_dma_copy(k, &L, &h, lhs_q()));
            }
        for (int64_t n = 0; n < N / (TN * BN); n++) {
            nt_tile *r[BN][KT];
            for (int bn = 0; bn < BN; bn++)
                for (int kk = 0; kk < KT; kk++) {
                    r[bn][kk] = ring_get(&rt);
                    nt_ap R = nt_tile_ap(r[bn][kk]), h = rhs_ap(kk * TK, (n * BN + bn) * TN, TN);
                    CHECK(nt_isa_dma_copy(k, &R, &h, rhs_q()));
                }
            for (int bm = 0; bm < BM; bm++)
                for (int bn = 0; bn < BN; bn++) {
                    nt_tile *p = ring_get(&ps);
                    nt_ap P = nt_tile_ap(p);
                    for (int kk = 0; kk < KT; kk++) {
                        nt_ap L = nt_tile_ap(l[bm][kk]), R = nt_tile_ap(r[bn][kk]);
                        CHECK(nt_isa_nc_matmul(k, &P, &L, &R, kk > 0));
                    }
                    write_back(k, &res, p, (m * BM + bm) * TM, (n * BN + bn) * TN);
                }
        }
    }
}

/* Step 4, nki_matmul_fully_optimized_ (TILES_IN_BLOCK M=16, N=2, K=8):
 * blocks on every dim, wide loads, partial sums kept in SBUF, in dt.
 *
 * bf16 (the tutorial's): the input tiles double-buffered, the packed result
 * in a ring of its own.  f32, as the trn2 guide's driver passes them (numpy
 * float32 matrices; its kernels allocate tiles in the inputs' dtype): the
 * partial sums (128 KiB per partition) and one set of lhsT (64 KiB) and rhs
 * tiles (32 KiB) fill trn2's 224 KiB exactly, so the input tiles are
 * single-buffered and the packed result is built in the block's last lhsT
 * tile, free by then (the choice a compiler short of SBUF makes). */
static void optimized_in(nt_sim_kernel *k, nt_dtype dt)
{
    enum { TBM = 16, TBN = 2, TBK = 8 };
    const int64_t BLOCK_M = TM * TBM, BLOCK_N = TN * TBN, BLOCK_K = TK * TBK;
    const int64_t NBM = M / BLOCK_M, NBN = N / BLOCK_N, NBK = K / BLOCK_K;
    const bool wide = dt == NT_F32; /* single buffers, packed in lhsT's tile */
    ring rt, lt, ps, packed;
    nt_tile *acc[2][TBM][TBN];
    for (int m = 0; m < NBM; m++)
        for (int bm = 0; bm < TBM; bm++)
            for (int bn = 0; bn < TBN; bn++)
                acc[m][bm][bn] = nt_tile_alloc(k, "result_tmps", NT_MEM_SBUF, dt, TM, TN);
    ring_alloc(k, &rt, "rhs_tile", NT_MEM_SBUF, dt, TK, BLOCK_N, wide ? TBK : 2 * TBK);
    ring_alloc(k, &lt, "lhsT_tile", NT_MEM_SBUF, dt, TK, BLOCK_M, wide ? TBK : 2 * TBK);
    ring_alloc(k, &ps, "result_tile", NT_MEM_PSUM, NT_F32, TM, TN, 2);
    if (!wide)
        ring_alloc(k, &packed, "result_packed", NT_MEM_SBUF, dt, TM, BLOCK_N, 2);
    for (int64_t n = 0; n < NBN; n++) {
        nt_tile *l[TBK] = {0};
        for (int m = 0; m < NBM; m++)
            for (int bm = 0; bm < TBM; bm++)
                for (int bn = 0; bn < TBN; bn++) {
                    nt_ap A = nt_tile_ap(acc[m][bm][bn]);
                    CHECK(nt_isa_memset(k, &A, 0.0, NT_ENGINE_VECTOR));
                }
        for (int64_t kb = 0; kb < NBK; kb++) {
            nt_tile *r[TBK];
            for (int bk = 0; bk < TBK; bk++) {
                r[bk] = ring_get(&rt);
                nt_ap R = nt_tile_ap(r[bk]);
                nt_ap h = nt_hbm_ap(rhs, dt, (kb * TBK + bk) * TK * N + n * BLOCK_N, TK, N,
                                    BLOCK_N);
                CHECK(nt_isa_dma_copy(k, &R, &h, rhs_q()));
            }
            for (int m = 0; m < NBM; m++) {
                for (int bk = 0; bk < TBK; bk++) {
                    l[bk] = ring_get(&lt);
                    nt_ap L = nt_tile_ap(l[bk]);
                    nt_ap h = nt_hbm_ap(lhsT, dt, (kb * TBK + bk) * TK * M + m * BLOCK_M, TK,
                                        M, BLOCK_M);
                    CHECK(nt_isa_dma_copy(k, &L, &h, lhs_q()));
                }
                for (int bn = 0; bn < TBN; bn++)
                    for (int bm = 0; bm < TBM; bm++) {
                        nt_tile *p = ring_get(&ps);
                        nt_ap P = nt_tile_ap(p);
                        for (int bk = 0; bk < TBK; bk++) {
                            nt_ap L = nt_tile_slice(l[bk], 0, TK, bm * TM, TM);
                            nt_ap R = nt_tile_slice(r[bk], 0, TK, bn * TN, TN);
                            CHECK(nt_isa_nc_matmul(k, &P, &L, &R, bk > 0));
                        }
                        nt_ap A = nt_tile_ap(acc[m][bm][bn]);
                        CHECK(nt_isa_tensor_tensor(k, &A, &A, &P, NT_ALU_ADD, NT_ENGINE_VECTOR));
                    }
            }
        }
        for (int m = 0; m < NBM; m++)
            for (int bm = 0; bm < TBM; bm++) {
                nt_tile *pk = wide ? l[TBK - 1] : ring_get(&packed);
                for (int bn = 0; bn < TBN; bn++) {
                    nt_ap d = nt_tile_slice(pk, 0, TM, bn * TN, TN);
                    nt_ap s = nt_tile_ap(acc[m][bm][bn]);
                    CHECK(nt_isa_tensor_copy(k, &d, &s, NT_ENGINE_VECTOR));
                }
                nt_ap s = wide ? nt_tile_slice(pk, 0, TM, 0, BLOCK_N) : nt_tile_ap(pk);
                nt_ap d = nt_hbm_ap(result, dt, (m * BLOCK_M + bm * TM) * N + n * BLOCK_N,
                                    TM, N, BLOCK_N);
                CHECK(nt_isa_dma_copy(k, &d, &s, Q_OUT));
            }
    }
}

static void optimized(nt_sim_kernel *k) { optimized_in(k, NT_BF16); }
static void optimized_f32(nt_sim_kernel *k) { optimized_in(k, NT_F32); }

static double run(const char *name, void (*prog)(nt_sim_kernel *), nt_sim_report *r)
{
    q_lhs = q_rhs = 0;
    nt_sim_kernel *k = nt_sim_kernel_begin(name);
    prog(k);
    if (nt_sim_kernel_end(k, r)) {
        fprintf(stderr, "%s: %s\n", name, r->message);
        exit(1);
    }
    return r->duration_ns / 1e6;
}

static nt_tile_matmul_args lib_args;
static void library(nt_sim_kernel *k)
{
    CHECK(nt_tile_matmul(k, &lib_args));
}

/* The four steps on the active target against `paper` (ms, 0: none
 * published) or the published trn2 engine activity; returns the number of
 * checks that failed. */
typedef struct step_ref {
    double ms;                 /* published time, 0 if none */
    double dma, tensor, vector; /* published engine activity %, < 0 if none */
} step_ref;

static int run_steps(const step_ref *ref)
{
    static const char *names[4] = {"1 basic tiling", "2 hoisted loads", "3 blocked free dims",
                                   "4 fully optimised"};
    void (*progs[4])(nt_sim_kernel *) = {basic, hoisted, blocked, optimized};
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        nt_sim_report r;
        double ms = run(names[i], progs[i], &r);
        double t = 100 * r.busy_ns[NT_ENGINE_TENSOR] / r.duration_ns;
        double d = 100 * r.busy_ns[NT_ENGINE_DMA] / r.duration_ns;
        double v = 100 * r.busy_ns[NT_ENGINE_VECTOR] / r.duration_ns;
        double mfu = 100 * r.tensor_ideal_ns / r.duration_ns;
        if (ref[i].ms > 0) {
            double ratio = ms / ref[i].ms;
            bool ok = ratio >= 0.65 && ratio <= 1.35;
            bad += !ok;
            printf("%-22s %9.2f %9.2f %6.3f %8s %7.1f%% %7.1f%% %7.1f%%\n", names[i], ms,
                   ref[i].ms, ratio, ok ? "yes" : "NO", t, d, mfu);
        } else {
            printf("%-22s %9.2f %9s %6s %8s %7.1f%% %7.1f%% %7.1f%% %7.1f%%   DMA %5.1f%%, "
                   "TensorE %5.1f%%",
                   names[i], ms, "none", "-", "-", t, d, v, mfu, ref[i].dma, ref[i].tensor);
            if (ref[i].vector >= 0)
                printf(", VectorE %5.1f%%", ref[i].vector);
            printf("\n");
        }
    }
    return bad;
}

/* The library's matmul program on the active target: both layouts of A,
 * each at least 85% of the target's bf16 peak. */
static int run_library(void)
{
    int bad = 0;
    printf("\n%-28s %10s %10s %9s\n", "library nt_tile_matmul", "sim ms", "ideal ms",
           "% of peak");
    for (int t = 0; t < 2; t++) {
        /* A row-major [M, K] (what nt_matmul passes), then A^T as in the tutorial */
        lib_args = (nt_tile_matmul_args){M, N, K, lhsT, t ? M : K, t == 1, rhs, N, NT_BF16,
                                         result, N, NT_BF16};
        nt_sim_report r;
        double ms = run("nt_tile_matmul", library, &r);
        double pct = 100 * r.tensor_ideal_ns / r.duration_ns;
        bad += pct < 85.0;
        printf("%-28s %10.2f %10.2f %8.1f%%  (target >= 85%%)\n",
               t ? "A^T given (a_trans)" : "A row-major", ms, r.tensor_ideal_ns / 1e6, pct);
    }
    return bad;
}

static void print_target(void)
{
    nt_sim_config c;
    nt_sim_config_get(&c);
    printf("simulated %s, timing only; bf16 [%lld,%lld] x [%lld,%lld]\n", c.name, (long long)M,
           (long long)K, (long long)K, (long long)N);
    printf("DMA: %.0f ns fixed + bytes / (min(partitions/8, 16) x %.0f B/ns); HBM share %.1f "
           "B/ns; TensorE bf16 peak %.2f TFLOPS\n\n",
           c.dma_fixed_ns, c.dma_engine_bytes_per_ns, c.hbm_bytes_per_ns,
           c.tensor_peak_flops[NT_SIM_MM_BF16] / 1e12);
}

int main(void)
{
    nt_sim_set_target(NT_SIM_TRN1);
    nt_sim_set_functional(false);
    /* 4 bytes an element, for the f32 run; never touched (timing only) */
    lhsT = malloc((size_t)(K * M) * 4);
    rhs = malloc((size_t)(K * N) * 4);
    result = malloc((size_t)(M * N) * 4);
    if (!lhsT || !rhs || !result)
        return 1;

    /* trn1: the tutorial's published times (NeuronCore-v2) */
    print_target();
    printf("%-22s %9s %9s %6s %8s %8s %8s %8s\n", "NKI tutorial step", "sim ms", "paper ms",
           "ratio", "within35", "TensorE", "DMA", "MFU");
    static const step_ref trn1[4] = {{51.8, -1, -1, -1}, {43.0, -1, -1, -1},
                                     {22.1, -1, -1, -1}, {6.97, -1, -1, -1}};
    int bad = run_steps(trn1);
    bad += run_library();

    /* trn2: no published times; the trn2 guide's profiler activity */
    printf("\n");
    nt_sim_set_target(NT_SIM_TRN2);
    print_target();
    printf("%-22s %9s %9s %6s %8s %8s %8s %8s %8s   %s\n", "NKI tutorial step", "sim ms",
           "paper ms", "ratio", "within35", "TensorE", "DMA", "VectorE", "MFU",
           "published trn2 activity (no time)");
    static const step_ref trn2[4] = {{0, 99.93, 87.28, -1}, {0, 99.73, 99.85, -1},
                                     {0, 95.70, 99.52, -1}, {0, 21.54, 99.50, 10.55}};
    bad += run_steps(trn2);
    {
        /* the published activity is of an f32 run (see optimized_f32):
         * DMA and VectorE within 35% of it */
        nt_sim_report r;
        double ms = run("4 fully optimised, f32", optimized_f32, &r);
        double d = 100 * r.busy_ns[NT_ENGINE_DMA] / r.duration_ns;
        double v = 100 * r.busy_ns[NT_ENGINE_VECTOR] / r.duration_ns;
        double rd = d / trn2[3].dma, rv = v / trn2[3].vector;
        bool ok = rd >= 0.65 && rd <= 1.35 && rv >= 0.65 && rv <= 1.35;
        bad += !ok;
        printf("%-22s %9.2f %9s %6s %8s %7.1f%% %7.1f%% %7.1f%% %7.1f%%   f32 operands as in "
               "the guide's driver: DMA x%.2f, VectorE x%.2f of it (within 35%%: %s)\n",
               "4 optimised, f32", ms, "none", "-", "-",
               100 * r.busy_ns[NT_ENGINE_TENSOR] / r.duration_ns, d, v,
               100 * r.tensor_ideal_ns / r.duration_ns, rd, rv, ok ? "yes" : "NO");
    }
    bad += run_library();
    nt_sim_set_target(NT_SIM_TRN1);
    free(lhsT);
    free(rhs);
    free(result);
    nt_sim_shutdown();
    return bad ? 1 : 0;
}
