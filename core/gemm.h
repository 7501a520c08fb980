/* core/gemm.h - the one f32 matmul primitive (docs/exactness.md, rule 4).
 *
 * Every matmul path (the CPU kernel, the simulator's nc_matmul functional
 * step, fused matmul kernels) multiplies through this function, one K-tile of
 * at most 128 at a time, in ascending K order, so every path accumulates in
 * the same order and gets the same bits:
 *
 *   C[M,N] = (acc ? C : 0) + A^T[M,K] . B[K,N]
 *
 * A is stored K x M (row-major, leading dim lda >= M): the "stationary"
 * operand of nc_matmul, partition dim K.  B is stored K x N (ldb >= N): the
 * "moving" operand.  C is M x N (ldc >= N), f32.  K <= 128 (NT_GEMM_KTILE).
 * Inside a tile every element follows one recurrence, in f32:
 *     s = +0;  for k = 0, 1, ..., K-1:  s = fma(A[k][i], B[k][j], s)
 *     C[i][j] = acc ? C[i][j] + s : s
 * fma rounds once, exactly, whatever instruction computes it (a vector lane
 * or the scalar fmaf), so the result does not depend on M, N, the leading
 * dims, the thread or where the element sits: a big call equals the same
 * call cut into 128 x 512 blocks bit for bit (tests/test_ops.c checks it).
 * For bf16/f16 operands the products are exact in f32 anyway, as in the
 * NeuronCore's PE array; for f32 the fused multiply-add is the more accurate
 * choice and the one vector hardware runs at full rate.
 *
 * bf16 x bf16 products (both operands bf16; f32 x f32, f16 and mixed
 * products keep the recurrence above) sum a K-tile in chunks of 16:
 *     s = +0;  for each chunk of 16 consecutive k of the tile, in order
 *              (the tile's last chunk may be shorter):
 *         t = +0;  for k in the chunk, in order:  t = fma(A[k][i], B[k][j], t)
 *         s = s + t
 *     C[i][j] = acc ? C[i][j] + s : s
 * -- still fp32, K-tiles of 128 added in ascending order, every step
 * rounded once; it is what AMX's tdpbf16ps computes natively (16 steps
 * from +0 per instruction, then added to its tile), so those products run
 * there (core/gemm_bf16.c, nt__gemm_bf16).  Every path that multiplies
 * two bf16 operands (nt__gemm_typed, the CPU matmul kernel, the
 * simulator's nc_matmul and program-level products) goes through
 * nt__gemm_bf16. */
#ifndef NT_CORE_GEMM_H
#define NT_CORE_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ntensor.h"

#define NT_GEMM_KTILE 128

void nt__gemm_ktile(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, bool acc);
/* nt__gemm_ktile with A row-major M x K (lda >= K): the same bits. */
void nt__gemm_ktile_rowa(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                         float *C, int ldc, bool acc);

/* The whole product for any K: C = A^T[0] . B[0], then C = C + A^T[kt] .
 * B[kt] for the K-tiles kt = 1, 2, ... of NT_GEMM_KTILE rows in ascending
 * order -- what successive nt__gemm_ktile calls give, bit for bit -- but
 * blocked so each block of C stays in cache across its K-tiles.  K = 0
 * gives zeros. */
/* Runs fn(arg, b) for b in [0, nblocks), on the calling thread and, when
 * split and the helper thread that big products use is free, on that one
 * too (blocks are claimed from a shared counter; each runs once).  Returns
 * when every block has run. */
void nt__par_blocks(int nblocks, void (*fn)(void *arg, int b), void *arg, bool split);
/* Stops and joins the helper thread (nt_shutdown); the next call starts it
 * again.  No call may run meanwhile. */
void nt__gemm_shutdown(void);
/* Makes the per-thread panel buffers' keys (nt_init), so no worker finds
 * itself without one later.  False if the system refuses a key. */
bool nt__gemm_keys_init(void);

void nt__gemm(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
              int ldc);

/* nt__gemm with A given row-major, M x K (A[i][k] at A[i * lda + k], lda
 * >= K), as a matmul's left operand usually is: the panels are packed from
 * it directly, instead of transposing it to K x M first.  Same bits. */
void nt__gemm_rowa(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                   float *C, int ldc);

/* Either operand in either layout: A row-major M x K (arow) or A^T K x M;
 * B^T row-major N x K (bcol: a linear layer's weight, B[k][j] at
 * B[j * ldb + k]) or B K x N.  The panels are packed from whichever is given,
 * so every layout gives the same bits. */
void nt__gemm_ex(int M, int N, int K, const float *A, int lda, bool arow, const float *B, int ldb,
                 bool bcol, float *C, int ldc);
/* nt__gemm_ex, then every element of C made canonical (nt__canon: NaNs
 * become the one quiet NaN), as the CPU kernel rounds its f32 result --
 * done in the last K-tile's store instead of another pass over C. */
void nt__gemm_ex_canon(int M, int N, int K, const float *A, int lda, bool arow, const float *B,
                       int ldb, bool bcol, float *C, int ldc);

/* nt__gemm_ex with bf16 operands too (adt, bdt: NT_F32 or NT_BF16), widened
 * exactly as they are packed (no widened copy first), and the result
 * rounded to odt: odt NT_F32 makes C the result, NaNs canonical, as
 * nt__gemm_ex_canon; any other odt rounds each block of C (f32 scratch, ldc)
 * into out (M x N of odt, rows ldc apart) with nt__st_f32 while the block is
 * still in cache.  The same bits as widening the operands to f32, calling
 * nt__gemm_ex and rounding C -- except bf16 x bf16, which goes to
 * nt__gemm_bf16 (their own definition, at the top).  0, or -1 (nothing
 * written) when the host has no memory for the f32 path's panels or a
 * dtype is neither f32 nor bf16: the caller then widens and calls
 * nt__gemm_ex. */
int nt__gemm_typed(int M, int N, int K, const void *A, int lda, bool arow, nt_dtype adt,
                   const void *B, int ldb, bool bcol, nt_dtype bdt, float *C, int ldc, void *out,
                   nt_dtype odt);

/* nt__gemm_typed's bf16 x bf16 products on AVX512_BF16's vdpbf16ps
 * (core/gemm_dpbf16.c), where that gives the same bits: at the AVX-512
 * level, on a CPU whose instruction passes a self-test, where it is faster
 * than the f32 kernel (or forced on), and only for operands whose range
 * provably keeps every product and partial sum normal and finite.  0: C
 * (and out, for odt other than NT_F32, else NULL) written as
 * nt__gemm_typed would; 1: not taken, nothing written. */
int nt__gemm_dpbf16(int M, int N, int K, const void *A, int lda, bool arow, const void *B,
                    int ldb, bool bcol, float *C, int ldc, void *out, nt_dtype odt);
/* Whether this CPU runs the path (AVX512_BF16, self-test passed). */
bool nt__gemm_dpbf16_runs(void);
/* Tests and benches: 1 takes the path wherever it is safe even if slower
 * here (-1 when the CPU does not run it), 0 never, -1 as measured at first
 * use; -1 for anything else. */
int nt__gemm_set_dpbf16(int mode);
/* Products that took the path so far. */
unsigned long nt__gemm_dpbf16_calls(void);

/* The bf16 x bf16 product (the chunked definition at the top; A and B
 * hold bf16 values, stored as NT_BF16 or as exactly widened NT_F32, any
 * K): C = (acc ? C : 0) + the K-tiles' sums in ascending order; canon
 * makes C's NaNs canonical (nt__canon); odt other than NT_F32 rounds each
 * block of C (f32, ldc) into out (M x N of odt, rows ldc apart) as
 * nt__st_f32 does (C is scratch then: with NT_BF16, AMX rounds from
 * registers and leaves C's last values unwritten).  On AMX where that
 * gives these bits (operands in nt__gemm_bf16_range_ok's range, AVX-512
 * level, self-test passed), else on the FMA units at the current ISA
 * level, else (no memory for panels) a plain loop: the same bits.
 * Returns 0. */
int nt__gemm_bf16(int M, int N, int K, const void *A, int lda, bool arow, nt_dtype adt,
                  const void *B, int ldb, bool bcol, nt_dtype bdt, float *C, int ldc, bool acc,
                  bool canon, void *out, nt_dtype odt);
/* Whether this CPU and OS run the AMX path (its self-test passed). */
bool nt__gemm_amx_runs(void);
/* Tests and benches: 1 takes AMX wherever it gives these bits (-1 when the
 * CPU does not run it), 0 never, -1 wherever it gives these bits (the
 * default); -1 for anything else. */
int nt__gemm_set_amx(int mode);
/* Products that took the AMX path so far. */
unsigned long nt__gemm_amx_calls(void);
/* Tests only: true makes nt__gemm_bf16 take its plain loop. */
void nt__gemm_bf16_set_plain(bool on);
/* Whether AMX and vdpbf16ps give the recurrences' bits on a product of
 * K-tiles of K terms whose A elements are the ar x ac bf16 at A (rows lda
 * apart) and B's the br x bc at B (core/gemm_dpbf16.c: every input finite
 * and normal or zero, no product or partial sum subnormal or overflowing;
 * zeros anywhere in the blocks, pads, change nothing); false where the
 * scan cannot run (no AVX-512BW). */
bool nt__gemm_bf16_range_ok(int K, const uint16_t *A, int ar, int ac, long lda, const uint16_t *B,
                            int br, int bc, long ldb);
/* nt__gemm_bf16_range_ok's verdict from the operands' least nonzero and
 * greatest magnitudes as bf16 bits (lo 0x10000: every element zero), for
 * a path that gathers them itself (AMX, while packing). */
bool nt__gemm_bf16_range_verdict(int K, unsigned alo, unsigned ahi, unsigned blo, unsigned bhi);

/* Tests only: panel buffers of more than n floats fail as if the host had
 * no memory for them (0: no cap), to run the fallback paths. */
void nt__gemm_set_panel_cap(size_t n);
/* Tests only: true makes every product prefetch its panels as the
 * biggest do (the same bits, another path through core/gemm.c). */
void nt__gemm_set_prefetch(bool on);

/* The vector ISA levels of the micro-kernel, chosen at run time (the first
 * call takes the widest this CPU runs; NT_CPU_ISA in docs/env.md forces
 * one).  Every level gives the same bits: only the speed differs. */
enum { NT_ISA_SCALAR, NT_ISA_AVX2, NT_ISA_AVX512, NT_ISA_COUNT };

/* The target attribute string of the AVX-512 level's loops outside the
 * micro-kernel (cpu/fused.c, cpu/ewise.c): 512-bit vectors, which GCC's
 * generic tuning would otherwise keep at 256. */
#if defined(__clang__)
#define NT_TARGET_AVX512 "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"
#else
#define NT_TARGET_AVX512 "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,prefer-vector-width=512"
#endif

/* Whether this CPU (and OS) runs level isa; scalar always. */
bool nt__gemm_isa_runs(int isa);
/* The widest level this CPU runs. */
int nt__gemm_isa_best(void);
/* "scalar", "avx2", "avx512"; NULL for anything else. */
const char *nt__gemm_isa_label(int isa);
/* Makes level isa (or the widest, for isa < 0) the one later calls use;
 * -1 (and no change) when this CPU does not run it.  Calls already running
 * finish with the kernel they started with. */
int nt__gemm_set_isa(int isa);
/* The level calls use now. */
int nt__gemm_isa(void);
/* Host threads a big call (and nt__par_blocks) may use: 1 or 2 (0: the
 * default, 2); -1 for anything else.  NT_CPU_THREADS in docs/env.md.  The
 * helper thread is used only when the host has a second processor. */
int nt__gemm_set_threads(int n);
int nt__gemm_threads(void);

#endif
