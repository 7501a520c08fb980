/* core/gemm.c - the K-tile matmul primitive; see gemm.h for the recurrence.
 *
 * Every element is s = fma(A[k][i], B[k][j], s) for k ascending, then added
 * to C.  fma rounds once and exactly, so an AVX-512 lane, an AVX2 lane and
 * the portable fmaf loop give the same bits: where an element is computed,
 * by which thread and with which vector width never changes it.
 *
 * Speed: register-blocked micro-kernels (rows x columns of C held in vector
 * registers across the whole K loop, B rows loaded as vectors, A broadcast;
 * edge rows and columns use the same kernels with fewer rows and masked
 * lanes, never a scalar loop -- on AVX-512 a tile of at most 8 rows forms
 * only 8 rows' sums), columns blocked so a panel of B stays in L2,
 * and a second thread taking half the column blocks of big calls.  nt__gemm
 * (the whole product) packs both operands once (in chunks both threads
 * share) and keeps each block of C in cache across all its K-tiles, while
 * prefetching the next K-tile's panels when they come from past L2 (at
 * 2048^3 the packed operands are 32 MB), a line every other step of the
 * micro-kernel's loop, and, where A is read unpacked as A^T, its next
 * rows.  Block edges fall on whole panels,
 * spread evenly, and the last blocks run in pieces, so the two threads end
 * together.  A block accumulates in a scratch of contiguous micro-tiles
 * (C's rows are often a multiple of 4 KiB apart, one L1 set) and is copied
 * to C once.  Products of few rows (a batch of 128) pack B per column
 * block, on the thread that then uses it (rows_block), cut into as many
 * as 4 column blocks so both threads share a weight gradient's few
 * columns.  Where each element of f32 A serves one block only (one column
 * of C blocks: a layer 128-512 wide; a K-tile product), the AVX-512 kernel
 * reads A where it is (micro_avx512_s) instead of packing it first -- but
 * A^T (a weight gradient's dY^T, rows often 4 KiB apart) is packed by its
 * block, K-tile by K-tile, into a buffer that stays in cache (la).  bf16
 * operands are widened as they are packed, and a bf16 result rounded block
 * by block (nt__gemm_typed).
 *
 * The micro-kernel is chosen at run time, not by the build machine: the
 * widest of AVX-512F (12 x 32), AVX2+FMA (6 x 16) and portable C (4 x 8)
 * that this CPU runs, or the level NT_CPU_ISA asks for (docs/env.md).  The
 * x86 kernels are compiled for their own ISA with target attributes, so the
 * rest of the library needs no more than the baseline the build targets.
 * (Not ifunc / target_clones: their resolvers run before ThreadSanitizer is
 * up.)  A call reads the kernel once and uses it throughout, so a change of
 * level never mixes panel layouts inside one product. */
#include "core/gemm.h"

#include <glib.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>

#include <atomic_ops.h>
#include "core/dtype.h"
#include "core/tlkey.h"
#include "core/tsan.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include "core/tr16.h"
#define NT_X86 1
#else
#define NT_X86 0
#endif

/* A micro-kernel: c[0..mr)[0..nr) = A^T . B for one pair of packed panels
 * (A panel [K][mr], B panel [K][nr], see pack_a / pack_b), stored to C's
 * first rows_ rows and w columns; fl: MICRO_ACC adds it to C (as C + s),
 * MICRO_CANON makes NaNs canonical as they are stored (nt__canon: the CPU
 * kernel's rounding to f32, folded into the last K-tile's store). */
enum { MICRO_ACC = 1, MICRO_CANON = 2 };
typedef void (*micro_fn)(int K, const float *Ap, const float *Bp, float *C, int ldc, int rows_,
                         int w, int fl);
/* The same with A unpacked, element (k, r) at A[r * sra + k * ska]. */
typedef void (*micro_s_fn)(int K, const float *A, long sra, long ska, const float *Bp, float *C,
                           int ldc, int rows_, int w, int fl);
typedef struct kern {
    int mr, nr; /* tile: NT_MC is a multiple of mr, NT_JB, NT_NC and NT_NCB of nr */
    micro_fn micro;
    micro_s_fn micro_s; /* NULL: this level always packs A */
} kern;

/* Columns per block: a 128 x 256 panel of B is 128 KiB, comfortably in L2. */
#define NT_NC 256

/* One element the plain way (the fallback when panel memory is short). */
static inline float dot1(int K, const float *A, int lda, const float *B, int ldb)
{
    float s = 0.0f;
    for (int k = 0; k < K; k++)
        s = fmaf(A[(long)k * lda], B[(long)k * ldb], s);
    return s;
}

static inline void put(float *p, float s, bool acc) { *p = acc ? *p + s : s; }
static inline void putf(float *p, float s, int fl)
{
    float v = fl & MICRO_ACC ? *p + s : s;
    *p = fl & MICRO_CANON ? nt__canon(v) : v;
}

/* Packed operands.  A micro-kernel reads an A panel [K][mr] and a B panel
 * [K][nr], both contiguous: B rows of a strided matrix sit ldb floats apart
 * (often a multiple of 4 KiB), and 128 of them would all land in one L1 set.
 * Panels are zero-padded to full width; the padding's lanes compute zeros
 * that are never stored, and no lane affects another. */

/* Portable: 4 x 8, plain C fmaf (any CPU; NT_CPU_ISA=scalar). */
static void micro_c(int K, const float *Ap, const float *Bp, float *C, int ldc, int rows_, int w,
                    int fl)
{
    float c[4][8] = {{0}};
    for (int k = 0; k < K; k++)
        for (int r = 0; r < 4; r++)
            for (int q = 0; q < 8; q++)
                c[r][q] = fmaf(Ap[k * 4 + r], Bp[k * 8 + q], c[r][q]);
    for (int r = 0; r < rows_; r++)
        for (int j = 0; j < w; j++)
            putf(C + (long)r * ldc + j, c[r][j], fl);
}

#if NT_X86
/* AVX2 + FMA: 6 x 16, twelve 256-bit accumulators. */
__attribute__((target("avx2,fma"))) static void micro_avx2(int K, const float *Ap,
                                                           const float *Bp, float *C, int ldc,
                                                           int rows_, int w, int fl)
{
    /* twelve named accumulators: an array here would be spilled to the
     * stack after every fma (GCC keeps address-taken arrays in memory) */
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < K; k++) {
        const float *a = Ap + k * 6, *b = Bp + k * 16;
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), ar;
        ar = _mm256_broadcast_ss(a + 0);
        c00 = _mm256_fmadd_ps(ar, b0, c00), c01 = _mm256_fmadd_ps(ar, b1, c01);
        ar = _mm256_broadcast_ss(a + 1);
        c10 = _mm256_fmadd_ps(ar, b0, c10), c11 = _mm256_fmadd_ps(ar, b1, c11);
        ar = _mm256_broadcast_ss(a + 2);
        c20 = _mm256_fmadd_ps(ar, b0, c20), c21 = _mm256_fmadd_ps(ar, b1, c21);
        ar = _mm256_broadcast_ss(a + 3);
        c30 = _mm256_fmadd_ps(ar, b0, c30), c31 = _mm256_fmadd_ps(ar, b1, c31);
        ar = _mm256_broadcast_ss(a + 4);
        c40 = _mm256_fmadd_ps(ar, b0, c40), c41 = _mm256_fmadd_ps(ar, b1, c41);
        ar = _mm256_broadcast_ss(a + 5);
        c50 = _mm256_fmadd_ps(ar, b0, c50), c51 = _mm256_fmadd_ps(ar, b1, c51);
    }
    __m256 c[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (rows_ == 6 && w == 16) {
        const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32((int)NT__QNAN_F32));
        for (int r = 0; r < 6; r++) {
            float *p = C + (long)r * ldc;
            __m256 v0 = c[r][0], v1 = c[r][1];
            if (fl & MICRO_ACC) {
                v0 = _mm256_add_ps(_mm256_loadu_ps(p), v0);
                v1 = _mm256_add_ps(_mm256_loadu_ps(p + 8), v1);
            }
            if (fl & MICRO_CANON) {
                v0 = _mm256_blendv_ps(v0, qnan, _mm256_cmp_ps(v0, v0, _CMP_UNORD_Q));
                v1 = _mm256_blendv_ps(v1, qnan, _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q));
            }
            _mm256_storeu_ps(p, v0);
            _mm256_storeu_ps(p + 8, v1);
        }
        return;
    }
    float t[6][16] __attribute__((aligned(32)));
    for (int r = 0; r < 6; r++) {
        _mm256_store_ps(t[r], c[r][0]);
        _mm256_store_ps(t[r] + 8, c[r][1]);
    }
    for (int r = 0; r < rows_; r++)
        for (int j = 0; j < w; j++)
            putf(C + (long)r * ldc + j, t[r][j], fl);
}

/* AVX-512F: 12 x 32, twenty-four 512-bit accumulators (plus two B vectors
 * and the broadcast: 27 of the 32 registers).  Edge columns use masked
 * loads and stores, which touch no memory outside the mask. */
#define NT_R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* The end of both AVX-512 micro-kernels: the tile's rows_ x w results
 * (plus C where MICRO_ACC, canonical where MICRO_CANON) stored by masked
 * stores. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
store_avx512(const __m512 c[12][2], float *C, int ldc, int rows_, int w, int fl)
{
    __mmask16 m0 = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32 ? (__mmask16)0xffff : w > 16 ? (__mmask16)((1u << (w - 16)) - 1) : 0;
    const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32((int)NT__QNAN_F32));
    for (int r = 0; r < rows_; r++) {
        float *p = C + (long)r * ldc;
        __m512 v0 = c[r][0], v1 = c[r][1];
        if (fl & MICRO_ACC) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, p), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, p + 16), v1);
        }
        if (fl & MICRO_CANON) {
            v0 = _mm512_mask_mov_ps(v0, _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q), qnan);
            v1 = _mm512_mask_mov_ps(v1, _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q), qnan);
        }
        _mm512_mask_storeu_ps(p, m0, v0);
        _mm512_mask_storeu_ps(p + 16, m1, v1);
    }
}

/* store_avx512 for one whole row of a whole tile, from two registers: the
 * same loads, adds (C first) and stores.  A whole tile's rows stored by
 * name keep the 24 accumulators in registers; through store_avx512's
 * array (indexed by a variable row) they went to the stack and back first,
 * a tenth of a 32-deep K-tile's time (attention's 128 x 128 x 32). */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
store_row_avx512(float *p, __m512 v0, __m512 v1, int fl)
{
    if (fl & MICRO_ACC) {
        v0 = _mm512_add_ps(_mm512_loadu_ps(p), v0);
        v1 = _mm512_add_ps(_mm512_loadu_ps(p + 16), v1);
    }
    if (fl & MICRO_CANON) {
        const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32((int)NT__QNAN_F32));
        v0 = _mm512_mask_mov_ps(v0, _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q), qnan);
        v1 = _mm512_mask_mov_ps(v1, _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q), qnan);
    }
    _mm512_storeu_ps(p, v0);
    _mm512_storeu_ps(p + 16, v1);
}

/* Cache lines to prefetch while a micro-kernel runs: n[0] lines from p[0]
 * into L1, n[1] from p[1] and n[2] from p[2] into L2, one line of each
 * every other k step from the first.  Spread through the K loop they
 * keep a few misses in flight; issued in a burst between calls, they
 * stalled on the line fill buffers (half of full_block's samples). */
typedef struct pfq {
    const char *p[3];
    int n[3];
    int lim; /* 2 * the largest n (and rt) */
    /* and into L2, one line every other k step too: rt lines of rows of
     * rl lines from rp, rs bytes apart, from line r0 of the first row on
     * (pieces of rows of A^T read unpacked, or of the rows of C a block
     * stores next) */
    const char *rp;
    long rs;
    int rl, rt, r0;
    int rw;
} pfq;

/* The kernel's body for the first R rows of the tile (R 12, or 8 for a
 * tile of at most 8 rows: a batch of 128 is ten tiles of 12 and one of 8,
 * whose 4 padded rows took a third of that call's FMAs; the other rows'
 * sums are never formed).  Each row's sums are the same instructions in
 * the same order either way: the same bits. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
micro_avx512_body(int K, const float *Ap, const float *Bp, float *C, int ldc, int rows_, int w,
                  int fl, const pfq *q, const int R)
{
#define NT_DECL(r) __m512 c##r##a = _mm512_setzero_ps(), c##r##b = c##r##a;
    NT_R12(NT_DECL)
#undef NT_DECL
    /* one k step: row k of the A and B panels into the 24 sums */
#define NT_ROW(r)                                                                                  \
    if ((r) < R) {                                                                                 \
        ar = _mm512_set1_ps(a[r]);                                                                 \
        c##r##a = _mm512_fmadd_ps(ar, b0, c##r##a), c##r##b = _mm512_fmadd_ps(ar, b1, c##r##b);    \
    }
#define NT_STEP(kk)                                                                                \
    {                                                                                              \
        const float *a = Ap + (kk) * 12, *b = Bp + (kk) * 32;                                      \
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), ar;                            \
        NT_R12(NT_ROW)                                                                             \
    }
    /* The steps that prefetch (one line of each queue every other step,
     * while there are lines) in pairs, then the rest four at a time: the
     * same steps in the same order, without a test of k at every step. */
    int k = 0;
    if (q) {
        const char *rp = q->rp;
        int rline = q->r0, rleft = q->rt;
        int kp = (q->lim < K ? q->lim : K) & ~1;
        for (; k < kp; k += 2) {
            int l = k >> 1;
            if (l < q->n[0])
                _mm_prefetch(q->p[0] + 64 * (long)l, _MM_HINT_T0);
            if (l < q->n[1])
                _mm_prefetch(q->p[1] + 64 * (long)l, _MM_HINT_T1);
            if (l < q->n[2])
                _mm_prefetch(q->p[2] + 64 * (long)l, _MM_HINT_T1);
            if (rleft > 0) {
                if (q->rw) /* lines about to be written: fetched to own */
                    __builtin_prefetch(rp + 64 * (long)rline, 1, 2);
                else
                    _mm_prefetch(rp + 64 * (long)rline, _MM_HINT_T1);
                rleft--;
                if (++rline == q->rl)
                    rline = 0, rp += q->rs;
            }
            NT_STEP(k)
            NT_STEP(k + 1)
        }
    }
    for (; k + 4 <= K; k += 4) {
        NT_STEP(k)
        NT_STEP(k + 1)
        NT_STEP(k + 2)
        NT_STEP(k + 3)
    }
    for (; k < K; k++)
        NT_STEP(k)
#undef NT_STEP
#undef NT_ROW
    if (rows_ == R && w == 32) {
#define NT_ST(r)                                                                                   \
    if ((r) < R)                                                                                   \
        store_row_avx512(C + (long)(r) * ldc, c##r##a, c##r##b, fl);
        NT_R12(NT_ST)
#undef NT_ST
        return;
    }
#define NT_LIST(r) {c##r##a, c##r##b},
    __m512 c[12][2] = {NT_R12(NT_LIST)};
#undef NT_LIST
    store_avx512(c, C, ldc, rows_, w, fl);
}

__attribute__((target("avx512f,avx2,fma"))) static void micro_avx512(int K, const float *Ap,
                                                                     const float *Bp, float *C,
                                                                     int ldc, int rows_, int w,
                                                                     int fl)
{
    if (rows_ <= 8)
        micro_avx512_body(K, Ap, Bp, C, ldc, rows_, w, fl, NULL, 8);
    else
        micro_avx512_body(K, Ap, Bp, C, ldc, rows_, w, fl, NULL, 12);
}

/* micro_avx512 prefetching q's lines as it goes (full_block). */
__attribute__((target("avx512f,avx2,fma"))) static void
micro_avx512_pf(int K, const float *Ap, const float *Bp, float *C, int ldc, int rows_, int w,
                int fl, const pfq *q)
{
    if (rows_ <= 8)
        micro_avx512_body(K, Ap, Bp, C, ldc, rows_, w, fl, q, 8);
    else
        micro_avx512_body(K, Ap, Bp, C, ldc, rows_, w, fl, q, 12);
}

/* micro_avx512 with A read where it is stored, unpacked: row r of the
 * tile, element k at A[r * sra + k * ska] (A row-major M x K: sra = lda,
 * ska = 1; A^T K x M: sra = 1, ska = lda).  The broadcasts take the very
 * values the packed panel holds, in the same order, so the same bits;
 * rows past rows_ read row rows_ - 1 (never past A's end), and their lanes
 * are never stored.  Used where every element of A serves one block of C
 * only (N within one column block), so packing A would be a pass over it
 * that buys nothing. */
__attribute__((target("avx512f,avx2,fma"))) static void micro_avx512_s(int K, const float *A,
                                                                       long sra, long ska,
                                                                       const float *Bp, float *C,
                                                                       int ldc, int rows_, int w,
                                                                       int fl)
{
#define NT_BASE(r) const float *a##r = A + (long)((r) < rows_ ? (r) : rows_ - 1) * sra;
    NT_R12(NT_BASE)
#undef NT_BASE
#define NT_DECL(r) __m512 c##r##a = _mm512_setzero_ps(), c##r##b = c##r##a;
    NT_R12(NT_DECL)
#undef NT_DECL
#define NT_ROW(r, x)                                                                               \
    ar = _mm512_set1_ps(x);                                                                        \
    c##r##a = _mm512_fmadd_ps(ar, b0, c##r##a), c##r##b = _mm512_fmadd_ps(ar, b1, c##r##b);
    if (sra == 1 && rows_ == 12) {
        /* A^T, a whole tile: the 12 values of row k contiguous, as in a
         * packed panel (constant offsets, one pointer) */
        const float *a = A;
        for (int k = 0; k < K; k++, a += ska) {
            const float *b = Bp + k * 32;
            __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), ar;
#define NT_ROWT(r) NT_ROW(r, a[r])
            NT_R12(NT_ROWT)
#undef NT_ROWT
        }
    } else if (ska == 1 && rows_ == 12) {
        /* A row-major, a whole tile: four row pointers and two strides
         * address the 12 rows (twelve pointers would not fit the
         * registers next to the loop's own) */
        const float *p0 = A, *p3 = A + 3 * sra, *p6 = A + 6 * sra, *p9 = A + 9 * sra;
        const long s1 = sra, s2 = 2 * sra;
        for (int k = 0; k < K; k++, p0++, p3++, p6++, p9++) {
            const float *b = Bp + k * 32;
            __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), ar;
            NT_ROW(0, p0[0]) NT_ROW(1, p0[s1]) NT_ROW(2, p0[s2])
            NT_ROW(3, p3[0]) NT_ROW(4, p3[s1]) NT_ROW(5, p3[s2])
            NT_ROW(6, p6[0]) NT_ROW(7, p6[s1]) NT_ROW(8, p6[s2])
            NT_ROW(9, p9[0]) NT_ROW(10, p9[s1]) NT_ROW(11, p9[s2])
        }
    } else {
        long ka = 0;
        for (int k = 0; k < K; k++, ka += ska) {
            const float *b = Bp + k * 32;
            __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), ar;
#define NT_ROWS(r) NT_ROW(r, a##r[ka])
            NT_R12(NT_ROWS)
#undef NT_ROWS
        }
    }
#undef NT_ROW
    if (rows_ == 12 && w == 32) {
#define NT_ST(r) store_row_avx512(C + (long)(r) * ldc, c##r##a, c##r##b, fl);
        NT_R12(NT_ST)
#undef NT_ST
        return;
    }
#define NT_LIST(r) {c##r##a, c##r##b},
    __m512 c[12][2] = {NT_R12(NT_LIST)};
#undef NT_LIST
    store_avx512(c, C, ldc, rows_, w, fl);
}
#undef NT_R12
#endif

/* ---------------- run-time choice of the kernel ---------------- */

static const kern kerns[NT_ISA_COUNT] = {
    [NT_ISA_SCALAR] = {4, 8, micro_c},
#if NT_X86
    [NT_ISA_AVX2] = {6, 16, micro_avx2},
    [NT_ISA_AVX512] = {12, 32, micro_avx512, micro_avx512_s},
#endif
};

bool nt__gemm_isa_runs(int isa)
{
    if (isa == NT_ISA_SCALAR)
        return true;
#if NT_X86
    __builtin_cpu_init();
    /* libgcc's checks include the OS saving the wider registers (XCR0) */
    if (isa == NT_ISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == NT_ISA_AVX512)
        return __builtin_cpu_supports("avx512f") && nt__gemm_isa_runs(NT_ISA_AVX2);
#endif
    return false;
}

int nt__gemm_isa_best(void)
{
    for (int i = NT_ISA_COUNT - 1; i > 0; i--)
        if (nt__gemm_isa_runs(i))
            return i;
    return NT_ISA_SCALAR;
}

const char *nt__gemm_isa_label(int isa)
{
    static const char *const names[NT_ISA_COUNT] = {"scalar", "avx2", "avx512"};
    return isa >= 0 && isa < NT_ISA_COUNT ? names[isa] : NULL;
}

static volatile AO_t cur_kern; /* const kern *, 0 until the first use */

static const kern *kern_now(void)
{
    AO_t k = AO_load_acquire(&cur_kern);
    if (!k) {
        /* first use: the widest level (two racing threads pick the same) */
        AO_compare_and_swap_full(&cur_kern, 0, (AO_t)&kerns[nt__gemm_isa_best()]);
        k = AO_load_acquire(&cur_kern);
    }
    return (const kern *)k;
}

int nt__gemm_set_isa(int isa)
{
    if (isa < 0)
        isa = nt__gemm_isa_best();
    if (isa >= NT_ISA_COUNT || !nt__gemm_isa_runs(isa))
        return -1;
    AO_store_release(&cur_kern, (AO_t)&kerns[isa]);
    return 0;
}

int nt__gemm_isa(void) { return (int)(kern_now() - kerns); }

/* NT_CPU_THREADS: 2 lets big calls share their blocks with the helper
 * thread, 1 keeps every call on its caller.  Blocks are independent and
 * each runs once whoever claims it, so the bits never depend on it. */
static volatile AO_t max_threads = 2;

int nt__gemm_set_threads(int n)
{
    if (n == 0)
        n = 2;
    if (n != 1 && n != 2)
        return -1;
    AO_store(&max_threads, (AO_t)n);
    return 0;
}

int nt__gemm_threads(void) { return (int)AO_load(&max_threads); }

/* Panels of A^T: for each MR rows i, [K][MR] floats (MR: kn's tile). */
static void pack_a(const kern *kn, float *dst, int M, int K, const float *A, int lda)
{
    const int MR = kn->mr;
    for (int i = 0; i < M; i += MR) {
        int mr = M - i < MR ? M - i : MR;
        float *d = dst + (long)(i / MR) * K * MR;
        for (int k = 0; k < K; k++) {
            const float *a = A + (long)k * lda + i;
            if (mr == 12 && MR == 12) { /* a constant size: inline moves, not a loop */
                memcpy(d + k * 12, a, 12 * sizeof(float));
                continue;
            }
            if (mr == 6 && MR == 6) {
                memcpy(d + k * 6, a, 6 * sizeof(float));
                continue;
            }
            int r = 0;
            for (; r < mr; r++)
                d[k * MR + r] = a[r];
            for (; r < MR; r++)
                d[k * MR + r] = 0.0f;
        }
    }
}

/* pack_a's panels, written k by k: each row k of A^T read once, in order,
 * across all the panels (pack_a reads a panel's 12 floats of every row
 * in turn; A^T's rows 4 KiB apart would then sit in one L1 set, and a
 * row's lines be fetched again for every panel).  The same floats. */
static void pack_a_rows(const kern *kn, float *dst, int M, int K, const float *A, int lda)
{
    const int MR = kn->mr;
    if (MR != 12) {
        pack_a(kn, dst, M, K, A, lda);
        return;
    }
    int full = M / 12, tail = M - full * 12;
    for (int k = 0; k < K; k++) {
        const float *a = A + (long)k * lda;
        float *d = dst + (long)k * 12;
        for (int p = 0; p < full; p++)
            memcpy(d + (long)p * K * 12, a + p * 12, 12 * sizeof(float));
        if (tail) {
            float *t = d + (long)full * K * 12;
            int r = 0;
            for (; r < tail; r++)
                t[r] = a[full * 12 + r];
            for (; r < 12; r++)
                t[r] = 0.0f;
        }
    }
}

/* Panels of B's columns [j0, j1): for each NR columns, [K][NR] floats. */
static void pack_b(const kern *kn, float *dst, int j0, int j1, int K, const float *B, int ldb)
{
    const int NR = kn->nr;
    if (NR == 32) {
        /* row by row: each row k of B's columns [j0, j1) read once, in
         * order, into every panel (panel by panel, down the rows, each
         * row's piece is a new line ldb apart, which the hardware does not
         * fetch ahead: a cache miss per row and panel); the rows a few
         * ahead are fetched meanwhile.  The same floats. */
        int full = (j1 - j0) / 32;
        size_t lines = ((size_t)full * 32 * sizeof(float) + 63) / 64;
        for (int k = 0; k < K; k++) {
            const float *b = B + (long)k * ldb + j0;
            if (k + 4 < K)
                for (size_t l = 0; l < lines; l++)
                    __builtin_prefetch((const char *)(b + 4L * ldb) + 64 * l, 0, 3);
            float *d = dst + (long)k * 32;
            for (int p = 0; p < full; p++)
                memcpy(d + (long)p * K * 32, b + p * 32, 32 * sizeof(float));
        }
        if (full * 32 == j1 - j0)
            return;
        j0 += full * 32;
        dst += (long)full * K * 32;
    }
    for (int j = j0; j < j1; j += NR) {
        int w = j1 - j < NR ? j1 - j : NR;
        float *d = dst + (long)((j - j0) / NR) * K * NR;
        for (int k = 0; k < K; k++) {
            const float *b = B + (long)k * ldb + j;
            if (w == NR && NR == 32) { /* constant sizes: inline copies, not calls */
                memcpy(d + k * 32, b, 32 * sizeof(float));
            } else if (w == NR && NR == 16) {
                memcpy(d + k * 16, b, 16 * sizeof(float));
            } else if (w == NR) {
                memcpy(d + k * NR, b, (size_t)NR * sizeof(float));
            } else {
                int q = 0;
                for (; q < w; q++)
                    d[k * NR + q] = b[q];
                for (; q < NR; q++)
                    d[k * NR + q] = 0.0f;
            }
        }
    }
}

/* Per-thread panel buffers, grown as needed and kept. */
typedef struct {
    float *p;
    size_t n;
} pbuf;
static void pbuf_free(void *p)
{
    if (p) {
        free(((pbuf *)p)->p);
        free(p);
    }
}
static nt__tlkey bpanel_key = NT__TLKEY_INIT(pbuf_free);
static nt__tlkey apanel_key = NT__TLKEY_INIT(pbuf_free);
static nt__tlkey fa_key = NT__TLKEY_INIT(pbuf_free), fb_key = NT__TLKEY_INIT(pbuf_free);
static nt__tlkey fc_key = NT__TLKEY_INIT(pbuf_free);
static nt__tlkey la_key = NT__TLKEY_INIT(pbuf_free);

/* nt_init makes them all (core/gemm.h), where a failure is still nt_init's
 * and no worker runs yet; the simulator alone (libntsim) makes each at its
 * first use. */
bool nt__gemm_keys_init(void)
{
    nt__tlkey *k[] = {&bpanel_key, &apanel_key, &fa_key, &fb_key, &fc_key, &la_key};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!nt__tlkey_make(k[i]))
            return false;
    return true;
}

/* Tests: the most floats a panel buffer may hold (0: no cap), so the
 * paths for a host short of panel memory run on demand. */
static volatile AO_t panel_cap;
void nt__gemm_set_panel_cap(size_t n) { AO_store(&panel_cap, (AO_t)n); }

/* Tests: 1 makes every whole product prefetch its panels (full_block's
 * pf), as only products of over 16 MB of panels do otherwise. */
static volatile AO_t force_pf;
void nt__gemm_set_prefetch(bool on) { AO_store(&force_pf, (AO_t)on); }

static float *panel(nt__tlkey *key, size_t n)
{
    size_t cap = (size_t)AO_load(&panel_cap);
    if (cap && n > cap)
        return NULL;
    pbuf *b = nt__tlkey_get(key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (b && !nt__tlkey_set(key, b)) {
            free(b);
            b = NULL;
        }
        if (!b)
            return NULL; /* the callers handle a missing panel */
    }
    if (b->n < n) {
        free(b->p);
        size_t by = (n * sizeof(float) + 63) / 64 * 64;
#ifdef MADV_HUGEPAGE
        /* The whole product's panels (tens of MB at 2048^3) are streamed
         * once per block of C: on 2 MB pages (where the host allows them
         * on request) that walks 512x fewer page tables. */
        const size_t huge = (size_t)2 << 20;
        if (by >= 2 * huge) {
            by = (by + huge - 1) / huge * huge;
            b->p = aligned_alloc(huge, by);
            if (b->p)
                (void)madvise(b->p, by, MADV_HUGEPAGE); /* advice: may be refused */
        } else
#endif
            b->p = aligned_alloc(64, by);
        b->n = b->p ? n : 0;
    }
    return b->p;
}

/* Columns [j0, j1) with A already packed (Ap), or, when sra (> 0), A
 * itself read by kn->micro_s: row i at Ap + i * sra, element k of it ska
 * further on. */
static int run_cols_packed(const kern *kn, int M, int j0, int j1, int K, const float *Ap,
                           long sra, long ska, const float *B, int ldb, float *C, int ldc,
                           bool acc)
{
    const int MR = kn->mr, NR = kn->nr;
    float *Bp = panel(&bpanel_key, (size_t)K * NT_NC);
    if (!Bp)
        return -1;
    for (int jb = j0; jb < j1; jb += NT_NC) {
        int je = jb + NT_NC < j1 ? jb + NT_NC : j1;
        pack_b(kn, Bp, jb, je, K, B, ldb);
        for (int i = 0; i < M; i += MR) {
            int mr = M - i < MR ? M - i : MR;
            const float *a = Ap + (long)(i / MR) * K * MR;
            for (int j = jb; j < je; j += NR) {
                int w = je - j < NR ? je - j : NR;
                if (sra)
                    kn->micro_s(K, Ap + i * sra, sra, ska, Bp + (long)((j - jb) / NR) * K * NR,
                                C + (long)i * ldc + j, ldc, mr, w, acc);
                else
                    kn->micro(K, a, Bp + (long)((j - jb) / NR) * K * NR, C + (long)i * ldc + j,
                              ldc, mr, w, acc);
            }
        }
    }
    return 0;
}

/* Portable: the same recurrence, element by element. */
static void run_cols_plain(int M, int j0, int j1, int K, const float *A, int lda,
                           const float *B, int ldb, float *C, int ldc, bool acc)
{
    for (int i = 0; i < M; i++)
        for (int j = j0; j < j1; j++)
            put(C + (long)i * ldc + j, dot1(K, A + i, lda, B + j, ldb), acc);
}

/* ---------------- the second thread ----------------
 *
 * A big call is cut into column blocks of NT_JB that the caller and one
 * helper thread claim from a shared counter.  If the helper is slow to wake
 * (the machine is busy), the caller simply takes more blocks: it only ever
 * waits for a block the helper has already started. */

#define NT_JB 64

typedef struct job job;
struct job {
    void (*block)(const job *j, int b); /* runs block b */
    int M, N, K, lda, ldb, ldc;
    const float *A, *B; /* A: packed panels (ktile jobs) */
    float *C;
    bool acc;
    int nbn;             /* full jobs: blocks per column of C blocks */
    int nblocks;
    volatile AO_t next;  /* next block to claim */
    volatile AO_t done;  /* blocks finished */
    volatile AO_t inside; /* helpers working on it (the job lives on the
                             caller's stack: it must not return before 0) */
    void (*gfn)(void *arg, int b); /* nt__par_blocks jobs */
    void *garg;
    const kern *kn; /* the micro-kernel and panel layout of this product */
    long sra, ska;  /* ktile jobs: A not packed, read by kn->micro_s (sra > 0) */
};

static struct {
    GMutex use;            /* one caller at a time shares the helper */
    GMutex lock;
    GCond cond;
    pthread_t th;
    bool have_th;          /* th runs (pthread_create succeeded) */
    job *volatile j;       /* the current job, or NULL */
    volatile AO_t seq;
    bool quit;             /* under lock: nt__gemm_shutdown */
    bool sleeping;         /* under lock: the helper waits on cond.  A job
                              signals only then: g_cond_signal is a futex
                              call even with no waiter (a GPT step on the
                              simulator made 2850 futex calls, 1700 now) */
} P;
static GMutex pool_lock;           /* starting and stopping the helper */
static volatile AO_t pool_started; /* P is set up (release: read with acquire) */

/* Columns [j0, j1), A given as kn's panels. */
static void run(const kern *kn, int M, int j0, int j1, int K, const float *A, long sra,
                long ska, const float *B, int ldb, float *C, int ldc, bool acc)
{
    if (run_cols_packed(kn, M, j0, j1, K, A, sra, ska, B, ldb, C, ldc, acc) == 0)
        return;
    if (sra) { /* A unpacked */
        for (int i = 0; i < M; i++)
            for (int j = j0; j < j1; j++)
                put(C + (long)i * ldc + j, dot1(K, A + i * sra, (int)ska, B + j, ldb), acc);
        return;
    }
    /* no memory for a B panel: element by element from A's panels (same
     * recurrence, same bits) */
    const int MR = kn->mr;
    for (int i = 0; i < M; i++) {
        const float *a = A + (long)(i / MR) * K * MR + i % MR;
        for (int j = j0; j < j1; j++)
            put(C + (long)i * ldc + j, dot1(K, a, MR, B + j, ldb), acc);
    }
}

/* A ktile job's block b: columns [b * NT_JB, ...). */
static void ktile_block(const job *j, int b)
{
    int j0 = b * NT_JB, j1 = j0 + NT_JB < j->N ? j0 + NT_JB : j->N;
    run(j->kn, j->M, j0, j1, j->K, j->A, j->sra, j->ska, j->B, j->ldb, j->C, j->ldc, j->acc);
}

static void work(job *j)
{
    for (;;) {
        AO_t b = AO_fetch_and_add1(&j->next);
        if (b >= (AO_t)j->nblocks)
            return;
        j->block(j, (int)b);
        AO_fetch_and_add1_release(&j->done);
    }
}

/* Runs j's blocks on the caller and, when worth it and free, the helper. */
static void run_job(job *j, bool split)
{
    if (P.have_th && split && j->nblocks >= 2 && AO_load(&max_threads) > 1 &&
        g_mutex_trylock(&P.use)) {
        g_mutex_lock(&P.lock);
        P.j = j;
        AO_store_release(&P.seq, AO_load(&P.seq) + 1);
        if (P.sleeping) /* else it spins on seq and sees the job itself */
            g_cond_signal(&P.cond);
        g_mutex_unlock(&P.lock);
        work(j);
        /* No new helper may enter once P.j is cleared (it enters under the
         * lock); then wait for blocks still running and for the helper to
         * leave the job. */
        g_mutex_lock(&P.lock);
        P.j = NULL;
        g_mutex_unlock(&P.lock);
        /* Spin a little (a block ends within microseconds), then yield:
         * on a busy host the helper may have been preempted inside its
         * block, and spinning would only keep it off the processor. */
        for (int spins = 0;
             AO_load_acquire(&j->done) != (AO_t)j->nblocks || AO_load_acquire(&j->inside);
             spins++) {
            if (spins >= 500)
                sched_yield();
#if defined(__x86_64__)
            else
                __builtin_ia32_pause();
#endif
        }
        g_mutex_unlock(&P.use);
        return;
    }
    work(j);
}

static void *helper(void *unused)
{
    (void)unused;
    AO_t seen = 0;
    for (;;) {
        /* spin a little for the next job (calls come in bursts), then sleep */
        for (int spins = 0; AO_load_acquire(&P.seq) == seen && spins < 2000; spins++) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        g_mutex_lock(&P.lock);
        while (AO_load_acquire(&P.seq) == seen) {
            P.sleeping = true;
            g_cond_wait(&P.cond, &P.lock);
            P.sleeping = false;
        }
        seen = AO_load_acquire(&P.seq);
        if (P.quit) {
            g_mutex_unlock(&P.lock);
            return NULL;
        }
        job *j = P.j;
        if (j)
            AO_fetch_and_add1_full(&j->inside); /* under the lock: see below */
        g_mutex_unlock(&P.lock);
        if (j) {
            work(j);
            AO_fetch_and_sub1_release(&j->inside); /* last touch of j */
        }
    }
    return NULL;
}

static void pool_start(void)
{
    if (AO_load_acquire(&pool_started))
        return;
    g_mutex_lock(&pool_lock);
    if (!AO_load(&pool_started)) {
        g_mutex_init(&P.use);
        g_mutex_init(&P.lock);
        g_cond_init(&P.cond);
        P.quit = false;
        P.sleeping = false;
        P.j = NULL;
        /* A plain pthread: GLib's thread wrapper allocates its own
         * structures and aborts when the host is out of memory.  No thread
         * (host short): the caller does all the work. */
        P.have_th = g_get_num_processors() > 1 && pthread_create(&P.th, NULL, helper, NULL) == 0;
        if (P.have_th)
            pthread_setname_np(P.th, "nt-gemm");
        AO_store_release(&pool_started, 1);
    }
    g_mutex_unlock(&pool_lock);
}

void nt__gemm_shutdown(void)
{
    g_mutex_lock(&pool_lock);
    if (AO_load(&pool_started)) {
        if (P.have_th) {
            g_mutex_lock(&P.use); /* no job is using the helper */
            g_mutex_lock(&P.lock);
            P.quit = true;
            AO_store_release(&P.seq, AO_load(&P.seq) + 1);
            g_cond_signal(&P.cond);
            g_mutex_unlock(&P.lock);
            pthread_join(P.th, NULL);
            P.have_th = false;
            g_mutex_unlock(&P.use);
        }
        g_mutex_clear(&P.use);
        g_mutex_clear(&P.lock);
        g_cond_clear(&P.cond);
        AO_store_release(&pool_started, 0);
    }
    g_mutex_unlock(&pool_lock);
}

static void generic_block(const job *j, int b) { j->gfn(j->garg, b); }

void nt__par_blocks(int nblocks, void (*fn)(void *arg, int b), void *arg, bool split)
{
    if (nblocks <= 0)
        return;
    pool_start();
    job j;
    memset(&j, 0, sizeof j);
    j.block = generic_block;
    j.nblocks = nblocks;
    j.gfn = fn;
    j.garg = arg;
    run_job(&j, split);
}

/* Big enough to be worth a second thread (MACs). */
#define NT_GEMM_SPLIT (1 << 20)

/* One K-tile product; A is K x M (A^T row-major) or, with arow, M x K
 * row-major.  pack_rows makes from the rows the very panels pack_a makes
 * from A^T, so both layouts give the same bits. */
static void pack_rows(int R, float *dst, int n, int K, const float *src, int ld);
static void ktile(int M, int N, int K, const float *A, int lda, bool arow, const float *B,
                  int ldb, float *C, int ldc, bool acc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        if (!acc)
            for (int i = 0; i < M; i++)
                memset(C + (long)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    pool_start();
    const kern *kn = kern_now();
    job j = {ktile_block, M, N, K, lda, ldb, ldc, A, B, C, acc, 0, (N + NT_JB - 1) / NT_JB,
             0, 0, 0};
    j.kn = kn;
    bool split = (long)M * N * K >= NT_GEMM_SPLIT && N >= 2 * NT_JB;
    if (kn->micro_s) {
        /* A read where it is: a tile of attention (128 x 128 x 32) costs
         * about what packing its A does */
        j.sra = arow ? lda : 1, j.ska = arow ? 1 : lda;
        run_job(&j, split);
        return;
    }
    float *Ap = panel(&apanel_key, (size_t)K * (size_t)((M + kn->mr - 1) / kn->mr * kn->mr));
    if (!Ap) { /* host memory short: element by element, same bits */
        if (!arow)
            run_cols_plain(M, 0, N, K, A, lda, B, ldb, C, ldc, acc);
        else
            for (int i = 0; i < M; i++)
                for (int jj = 0; jj < N; jj++)
                    put(C + (long)i * ldc + jj, dot1(K, A + (long)i * lda, 1, B + jj, ldb), acc);
        return;
    }
    if (arow)
        pack_rows(kn->mr, Ap, M, K, A, lda);
    else
        pack_a(kn, Ap, M, K, A, lda);
    j.A = Ap;
    run_job(&j, split);
}

void nt__gemm_ktile(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, bool acc)
{
    ktile(M, N, K, A, lda, false, B, ldb, C, ldc, acc);
}

/* A given row-major, M x K (cpu/attention.c: P . V, dS . K without
 * transposing P or dS first). */
void nt__gemm_ktile_rowa(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                         float *C, int ldc, bool acc)
{
    ktile(M, N, K, A, lda, true, B, ldb, C, ldc, acc);
}

/* ---------------- the whole product ----------------
 *
 * Both operands are packed once, every K-tile (in parallel: one block per
 * tile), then C is cut into blocks of mc x ncb; each block runs every
 * K-tile in ascending order before the next block starts, so it stays in L2
 * while it accumulates instead of streaming through memory once per K-tile.
 * Each element still follows the recurrence of gemm.h exactly. */

/* C blocks: rows a multiple of every kernel's mr, columns of every nr.  Big
 * products take the big blocks: their operands stream from L3 or memory
 * once per block and K-tile, (mc + ncb) x 128 floats for mc x ncb x 128
 * FMAs, so a bigger block needs less bandwidth per FLOP (192 x 512: 3.4
 * GB/s per core at 240 GFLOPS, where 96 x 256 needs 6.9); smaller ones keep
 * enough blocks for both threads. */
#define NT_MC 96
#define NT_MC_LA 256
#define NT_NCB 256
static int gemm_mc_big = 2 * NT_MC, gemm_ncb_big = 2 * NT_NCB;

typedef struct full {
    job j;
    float *Ap, *Bp; /* K-tile kt's panels start at Mpad * k0 and Npad * k0 */
    int Mpad, Npad, nk;
    int nca, ncbp; /* pack job: A and B chunks per K-tile */
    int mc, ncb; /* C block */
    bool arow;   /* A given row-major M x K (nt__gemm_rowa) */
    bool bcol;   /* B given as B^T, row-major N x K (nt__gemm_ex) */
    bool canon;  /* NaNs made canonical in the last K-tile's store */
    bool abf, bbf; /* A, B stored as bf16 (j.A, j.B point at uint16_t) */
    char *out;     /* non-NULL: each block of C rounded to odt here (nt__gemm_typed) */
    nt_dtype odt;
    int nbc;       /* full job: columns of C blocks (j.nbn: rows) */
    int nreg;      /* full job: blocks run whole; each later one in tsub pieces */
    int tsub;
    bool pf;       /* full job: prefetch the next panels (operands past the caches) */
    float *Bs;     /* rows job: two threads' B tile buffers, bslot floats each */
    size_t bslot;
    bool ua;       /* A not packed: the micro-kernels read it where it is (micro_s) */
    bool la;       /* with ua, A^T: each block packs its rows K-tile by K-tile */
} full;

/* bf16 -> f32 is exact (the 16 bits on top, zeros below), so a panel
 * packed from bf16 holds the very floats a widened copy would: the
 * micro-kernels then compute the same bits. */
static inline void widen_bf16(float *d, const uint16_t *s, int n)
{
    for (int q = 0; q < n; q++)
        d[q] = nt__bf16_to_f32(s[q]);
}

/* pack_a and pack_b from bf16 A (K x M) or B (K x N). */
static void pack_cols_bf16(int R, float *dst, int n, int K, const uint16_t *src, int ld)
{
    for (int i = 0; i < n; i += R) {
        int w = n - i < R ? n - i : R;
        float *d = dst + (long)(i / R) * K * R;
        for (int k = 0; k < K; k++) {
            widen_bf16(d + (long)k * R, src + (long)k * ld + i, w);
            for (int q = w; q < R; q++)
                d[(long)k * R + q] = 0.0f;
        }
    }
}

#if NT_X86
/* pack_rows_body's full panels on AVX-512 (R 32 and 12: only the AVX-512
 * kernel has them): 16 x 16 blocks (12 rows: 4 of zeros, not stored)
 * transposed in registers (nt__tr16), a fourth of the 4 x 4 SSE blocks'
 * loads, stores and shuffles per element.  Rows r of src (ld apart) ->
 * d[k * R + r]; returns the k done (a multiple of 16). */
__attribute__((target("avx512f"))) static int pack_rows_avx512(float *d, const float *src,
                                                               int ld, int K, int R)
{
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int h = 0; h < R; h += 16) {
            const float *s = src + (long)h * ld + k;
            int nr = R - h < 16 ? R - h : 16;
            __mmask16 m = (__mmask16)((1u << nr) - 1);
            __m512i v[16];
            for (int r = 0; r < 16; r++)
                v[r] = r < nr ? _mm512_loadu_si512(s + (long)r * ld) : _mm512_setzero_si512();
            nt__tr16(v); /* v[e]: column k + e of rows h.. */
            for (int e = 0; e < 16; e++)
                _mm512_mask_storeu_epi32(d + (long)(k + e) * R + h, m, v[e]);
        }
    return k;
}
#endif

/* Panels of width R (pack_a's MR, pack_b's NR) from a matrix stored with
 * the panel dim as rows: n rows of K, ld apart -- A row-major (M x K) or
 * B^T (N x K, a linear layer's weight).  Row i + r is read in order and
 * written with stride R, zero-padded to R rows: the panels pack_a/pack_b
 * make from the other layout, so the same bits.  src holds f32, or bf16
 * (each element widened, exactly) when `bf16`; always inlined into the two
 * packers below, so each gets its own loop. */
static inline __attribute__((always_inline)) void pack_rows_body(int R, float *dst, int n, int K,
                                                                 const void *src, int ld,
                                                                 bool bf16)
{
    for (int i = 0; i < n; i += R) {
        int w = n - i < R ? n - i : R;
        float *d = dst + (long)(i / R) * K * R;
        const float *af = (const float *)src + (long)i * ld;
        const uint16_t *ah = (const uint16_t *)src + (long)i * ld;
        int k = 0;
#if NT_X86
        /* full panels of a width that is a multiple of 4 (12 and 32 for
         * AVX-512, 16 for AVX2, 8 for the portable kernel's B): 4 x 4
         * blocks transposed in SSE registers (the x86-64 baseline), the
         * panel written in order; 4 bf16 of a row are put on top of zero
         * halves (their f32 values) first */
#define PACK_ROW4(off)                                                                     \
    (bf16 ? _mm_castsi128_ps(_mm_unpacklo_epi16(                                           \
                _mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)(ah + (off)))))      \
          : _mm_loadu_ps(af + (off)))
        if (!bf16 && w == R && (R == 32 || R == 12))
            k = pack_rows_avx512(d, af, ld, K, R);
        if (w == R && R % 4 == 0)
            for (; k + 4 <= K; k += 4)
                for (int r = 0; r < R; r += 4) {
                    long o = (long)r * ld + k;
                    __m128 x0 = PACK_ROW4(o), x1 = PACK_ROW4(o + ld);
                    __m128 x2 = PACK_ROW4(o + 2 * (long)ld), x3 = PACK_ROW4(o + 3 * (long)ld);
                    _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
                    float *d0 = d + (long)k * R + r;
                    _mm_storeu_ps(d0, x0);
                    _mm_storeu_ps(d0 + R, x1);
                    _mm_storeu_ps(d0 + 2 * R, x2);
                    _mm_storeu_ps(d0 + 3 * R, x3);
                }
#undef PACK_ROW4
#endif
        /* the rest k outer: the panel written in order, the w rows read as
         * w sequential streams (row by row, the strided writes would sweep
         * the whole panel through L1 once per row) */
        for (; k < K; k++) {
            float *dk = d + (long)k * R;
            int r = 0;
            for (; r < w; r++)
                dk[r] = bf16 ? nt__bf16_to_f32(ah[(long)r * ld + k]) : af[(long)r * ld + k];
            for (; r < R; r++)
                dk[r] = 0.0f;
        }
    }
}

static void pack_rows(int R, float *dst, int n, int K, const float *src, int ld)
{
    pack_rows_body(R, dst, n, K, src, ld, false);
}

static void pack_rows_bf16(int R, float *dst, int n, int K, const uint16_t *src, int ld)
{
    pack_rows_body(R, dst, n, K, src, ld, true);
}

/* Pack job: per K-tile, A's panels in chunks of NT_PACK_A panels (rows),
 * then B's in chunks of NT_PACK_B panels (columns): enough blocks that the
 * two threads share the packing of a skinny product evenly (x [2048, 128]
 * against w [384, 128]: one block each would leave one thread 5x the
 * other's work).  Block b < nk * nca packs A chunk b % nca of K-tile
 * b / nca, else B chunk (b - nk * nca) % ncb of K-tile (b - nk * nca) / ncb. */
#define NT_PACK_A 16
#define NT_PACK_B 8
static void pack_block(const job *jb, int b)
{
    const full *f = (const full *)jb;
    const kern *kn = jb->kn;
    bool isa = b < f->nk * f->nca;
    int n = isa ? f->nca : f->ncbp, q = isa ? b : b - f->nk * f->nca;
    int kt = q / n, ch = q % n, k0 = kt * NT_GEMM_KTILE;
    int kw = jb->K - k0 < NT_GEMM_KTILE ? jb->K - k0 : NT_GEMM_KTILE;
    int R = isa ? kn->mr : kn->nr, span = R * (isa ? NT_PACK_A : NT_PACK_B);
    int tot = isa ? jb->M : jb->N;
    int r0 = ch * span, r1 = r0 + span < tot ? r0 + span : tot;
    /* panels r0 / R, ... of K-tile kt (r0 is a multiple of R) */
    float *d = (isa ? f->Ap + (long)f->Mpad * k0 : f->Bp + (long)f->Npad * k0) + (long)r0 * kw;
    if (isa ? f->abf : f->bbf) {
        const uint16_t *s = (const uint16_t *)(isa ? (const void *)jb->A : (const void *)jb->B);
        int ld = isa ? jb->lda : jb->ldb;
        if (isa ? f->arow : f->bcol)
            pack_rows_bf16(R, d, r1 - r0, kw, s + (long)r0 * ld + k0, ld);
        else
            pack_cols_bf16(R, d, r1 - r0, kw, s + (long)k0 * ld + r0, ld);
        return;
    }
    if (isa && f->arow)
        pack_rows(R, d, r1 - r0, kw, jb->A + (long)r0 * jb->lda + k0, jb->lda);
    else if (isa)
        pack_a(kn, d, r1 - r0, kw, jb->A + (long)k0 * jb->lda + r0, jb->lda);
    else if (f->bcol)
        pack_rows(R, d, r1 - r0, kw, jb->B + (long)r0 * jb->ldb + k0, jb->ldb);
    else
        pack_b(kn, d, r0, r1, kw, jb->B + (long)k0 * jb->ldb, jb->ldb);
}

/* B's panels of columns [r0, r1) (r0 a multiple of NR) and rows [k0, k0 +
 * kw) into d: what pack_block writes for them, from any layout and dtype. */
static void pack_b_tile(const full *f, float *d, int r0, int r1, int k0, int kw)
{
    const job *jb = &f->j;
    const int R = jb->kn->nr, ld = jb->ldb;
    if (f->bbf) {
        const uint16_t *s = (const uint16_t *)(const void *)jb->B;
        if (f->bcol)
            pack_rows_bf16(R, d, r1 - r0, kw, s + (long)r0 * ld + k0, ld);
        else
            pack_cols_bf16(R, d, r1 - r0, kw, s + (long)k0 * ld + r0, ld);
    } else if (f->bcol) {
        pack_rows(R, d, r1 - r0, kw, jb->B + (long)r0 * ld + k0, ld);
    } else {
        pack_b(jb->kn, d, r0, r1, kw, jb->B + (long)k0 * ld, ld);
    }
}

/* Prefetches the cache lines [p + 64 * l0, p + 64 * l1) of a panel of n
 * bytes: into L1 (near) or L2. */
static inline void prefetch_lines(const float *p, size_t n, size_t l0, size_t l1, bool near)
{
    size_t nl = (n + 63) / 64;
    if (l1 > nl)
        l1 = nl;
    for (size_t l = l0; l < l1; l++) {
        if (near)
            __builtin_prefetch((const char *)p + l * 64, 0, 3);
        else
            __builtin_prefetch((const char *)p + l * 64, 0, 2);
    }
}

#if NT_X86
/* prefetch_lines's range as slot s of q (lines [l0, l1) of a panel of n
 * bytes at p, clipped to the panel). */
static inline void pf_range(pfq *q, int s, const float *p, size_t n, size_t l0, size_t l1)
{
    size_t nl = (n + 63) / 64;
    if (l1 > nl)
        l1 = nl;
    if (l1 > l0) {
        q->p[s] = (const char *)p + l0 * 64;
        q->n[s] = (int)(l1 - l0);
    }
}

/* q's row queue: lines [l0, l1) of rows of rl lines each, rs bytes apart,
 * the first at p (line l of them: row l / rl, its line l % rl). */
static inline void pf_rows(pfq *q, const char *p, long rs, int rl, long l0, long l1)
{
    if (l1 > l0) {
        q->rp = p + (l0 / rl) * rs, q->rs = rs;
        q->rl = rl, q->r0 = (int)(l0 % rl), q->rt = (int)(l1 - l0);
    }
}
#endif

/* Copies a block's scratch (micro-tiles of MR x NR, contiguous, tile (r,
 * q) at (q * nrow + r) * MR * NR) to its m x n place in C. */
static void scratch_to_c(const float *Cs, int nrow, int MR, int NR, int m, int n, float *C,
                         int ldc)
{
    for (int i = 0; i < m; i++)
        for (int c = 0; c < n; c += NR) {
            float *d = C + (long)i * ldc + c;
            const float *s = Cs + ((long)(c / NR) * nrow + i / MR) * MR * NR + (long)(i % MR) * NR;
            if (NR == 32 && n - c >= 32) /* a constant size: inline moves, not a call */
                memcpy(d, s, 32 * sizeof(float));
            else
                memcpy(d, s, (size_t)(n - c < NR ? n - c : NR) * sizeof(float));
        }
}

#if NT_X86
/* scratch_to_c for NR = 32 on AVX-512: each row's 32 floats of a tile in
 * two 64-byte moves (the same floats, a fourth of the stores of the
 * 16-byte moves a generic copy makes: C's lines are often still in
 * flight, and every store waits in the store buffer for its line). */
__attribute__((target("avx512f"))) static void scratch_to_c_avx512(const float *Cs, int nrow,
                                                                    int m, int n, float *C,
                                                                    int ldc)
{
    for (int i = 0; i < m; i++) {
        float *d = C + (long)i * ldc;
        const float *s = Cs + (long)(i / 12) * 12 * 32 + (long)(i % 12) * 32;
        int c = 0;
        for (; c + 32 <= n; c += 32, s += (long)nrow * 12 * 32) {
            _mm512_storeu_ps(d + c, _mm512_loadu_ps(s));
            _mm512_storeu_ps(d + c + 16, _mm512_loadu_ps(s + 16));
        }
        if (c < n)
            memcpy(d + c, s, (size_t)(n - c) * sizeof(float));
    }
}
#endif

/* The micro-kernel on rows [i, i + mr) of K-tile k0 (kw deep): A's packed
 * panel, or A itself (f->ua). */
static inline void micro_at(const full *f, int i, int k0, int kw, const float *bp, float *cp,
                            int ldc, int mr, int w, int fl, const float *Al)
{
    const job *jb = &f->j;
    const kern *kn = jb->kn;
    if (Al) {
        kn->micro(kw, Al, bp, cp, ldc, mr, w, fl);
    } else if (f->ua) {
        long lda = jb->lda;
        const float *a = f->arow ? jb->A + (long)i * lda + k0 : jb->A + (long)k0 * lda + i;
        kn->micro_s(kw, a, f->arow ? lda : 1, f->arow ? 1 : lda, bp, cp, ldc, mr, w, fl);
    } else {
        const float *Ak = f->Ap + (long)f->Mpad * k0;
        kn->micro(kw, Ak + (long)(i / kn->mr) * kw * kn->mr, bp, cp, ldc, mr, w, fl);
    }
}

/* full_block's steps.  A block of C: rows [i0, i1), columns [j0, j1), in
 * nrow x ncol micro-tiles; Cs its scratch (or NULL: C itself), Al its rows
 * of A^T packed K-tile by K-tile (la) or NULL. */
typedef struct fblock {
    int i0, i1, j0, j1, nrow, ncol;
    float *Cs, *Al;
} fblock;

/* One K-tile (k0, kw deep) of a block: what every micro-kernel call of it
 * shares, and the prefetches spread over the calls. */
typedef struct fktile {
    int k0, kw, k1, kw1, fl;
    const float *Bk;
    /* The next K-tile's panels of this block come from memory or the
     * shared cache: fetched into L2 a few lines per micro-kernel call
     * (fper), spread over this K-tile's calls, so they are there when
     * needed; pl: the next line of An then Bn to fetch. */
    const float *An, *Bn;
    size_t an, bn, anl, pl, fper;
    /* A^T read unpacked (ua; a weight gradient dY^T . X, K the batch's
     * rows): each k row of the block is a short piece of a long row of A,
     * a new line every step of the kernel's loop, which the hardware does
     * not fetch ahead.  Its next K-tile's rows are fetched into L2
     * meanwhile, uarpc per call: on one thread 512 x 128 x 2048 +5-10%,
     * 1024 x 128 x 2048 +12-20% (A row-major, contiguous along k, gains
     * nothing). */
    bool uap;
    int uarpc;
    size_t uabytes;
    /* a B panel (kw x NR) stays in L1 while the block's A panels stream
     * past it from L2; the next B panel is fetched into L1 meanwhile, bper
     * of its bpl lines a call */
    size_t bpl, bper;
#if NT_X86
    bool spread; /* the prefetches issued inside micro_avx512_pf's K loop */
    /* C's lines per row of the block, its lines in all, and each call's
     * share of them (spread and the last K-tile only) */
    int crl;
    long cl, cpl;
#endif
} fktile;

#define FB_STEP static inline __attribute__((always_inline))

FB_STEP void ktile_plan(const full *f, const fblock *bk, int k0, fktile *t)
{
    const job *jb = &f->j;
    const kern *kn = jb->kn;
    const int MR = kn->mr, NR = kn->nr;
    int nrow = bk->nrow, ncol = bk->ncol;
    t->k0 = k0;
    t->kw = jb->K - k0 < NT_GEMM_KTILE ? jb->K - k0 : NT_GEMM_KTILE;
    t->Bk = f->Bp + (long)f->Npad * k0;
    t->k1 = k0 + NT_GEMM_KTILE;
    t->kw1 = jb->K - t->k1 < NT_GEMM_KTILE ? jb->K - t->k1 : NT_GEMM_KTILE;
    t->An = t->Bn = NULL;
    t->an = t->bn = t->pl = t->fper = 0;
    if (t->k1 < jb->K && f->pf) {
        t->An = f->ua ? NULL : f->Ap + (long)f->Mpad * t->k1 + (long)(bk->i0 / MR) * t->kw1 * MR;
        t->Bn = f->Bp + (long)f->Npad * t->k1 + (long)(bk->j0 / NR) * t->kw1 * NR;
        t->an = f->ua ? 0 : (size_t)nrow * MR * t->kw1 * sizeof(float);
        t->bn = (size_t)ncol * NR * t->kw1 * sizeof(float);
        t->fper = ((t->an + t->bn) / 64 + (size_t)(nrow * ncol) - 1) / (size_t)(nrow * ncol);
    }
    t->anl = (t->an + 63) / 64;
    t->uap = f->ua && !f->arow && t->k1 < jb->K;
    t->uarpc = t->uap ? (t->kw1 + nrow * ncol - 1) / (nrow * ncol) : 0;
    t->uabytes = (size_t)(bk->i1 - bk->i0) * sizeof(float);
    t->fl = (k0 > 0 ? MICRO_ACC : 0) | (f->canon && t->k1 >= jb->K ? MICRO_CANON : 0);
    t->bpl = ((size_t)t->kw * NR * sizeof(float) + 63) / 64;
    t->bper = (t->bpl + (size_t)nrow - 1) / (size_t)nrow;
#if NT_X86
    t->spread = f->pf && !f->ua && kn->micro == micro_avx512;
    t->crl = (int)(((size_t)(bk->j1 - bk->j0) * sizeof(float) + 63) / 64);
    t->cl = (long)t->crl * (bk->i1 - bk->i0);
    t->cpl = t->spread && bk->Cs && t->k1 >= jb->K
                 ? (t->cl + (long)nrow * ncol - 1) / ((long)nrow * ncol)
                 : 0;
#endif
}

/* Where the call for micro-tile (r, column c) at row i accumulates: the
 * scratch's tile, or C. */
FB_STEP float *tile_c(const full *f, const fblock *bk, int c, int i, int r)
{
    const job *jb = &f->j;
    const int MR = jb->kn->mr, NR = jb->kn->nr;
    return bk->Cs ? bk->Cs + ((long)((c - bk->j0) / NR) * bk->nrow + r) * MR * NR
                  : jb->C + (long)i * jb->ldc + c;
}

#if NT_X86
/* The call with the same lines as the generic path fetches, issued inside
 * the K loop (spread). */
FB_STEP void call_spread(const full *f, const fblock *bk, fktile *t, int c, int i, int r,
                         int mr, int w, const float *bp, bool bnext)
{
    const job *jb = &f->j;
    const int MR = jb->kn->mr, NR = jb->kn->nr, kw = t->kw;
    pfq q = {{NULL, NULL, NULL}, {0, 0, 0}, 0, NULL, 0, 0, 0, 0, 0};
    if (bnext)
        pf_range(&q, 0, bp + (long)kw * NR, t->bpl * 64, r * t->bper, (r + 1) * t->bper);
    size_t e = t->pl + t->fper;
    if (t->fper && t->pl < t->anl)
        pf_range(&q, 1, t->An, t->an, t->pl, e);
    if (t->fper && e > t->anl)
        pf_range(&q, 2, t->Bn, t->bn, t->pl > t->anl ? t->pl - t->anl : 0, e - t->anl);
    t->pl = e;
    if (t->cpl) {
        /* the last K-tile: this call's share of the block's lines of C,
         * which scratch_to_c stores next -- fetched meanwhile, they are
         * not missed one store at a time at the end */
        int tt = ((c - bk->j0) / NR) * bk->nrow + r;
        long l0 = (long)tt * t->cpl, l1 = l0 + t->cpl < t->cl ? l0 + t->cpl : t->cl;
        pf_rows(&q, (const char *)(jb->C + (long)bk->i0 * jb->ldc + bk->j0),
                (long)jb->ldc * (long)sizeof(float), t->crl, l0, l1);
        q.rw = 1;
    }
    int lim = q.n[0] > q.n[1] ? q.n[0] : q.n[1];
    lim = lim > q.n[2] ? lim : q.n[2];
    q.lim = 2 * (lim > q.rt ? lim : q.rt);
    const float *Ak = f->Ap + (long)f->Mpad * t->k0;
    micro_avx512_pf(kw, Ak + (long)(i / MR) * kw * MR, bp, tile_c(f, bk, c, i, r),
                    bk->Cs ? NR : jb->ldc, mr, w, t->fl, &q);
}

/* The call on A^T's rows packed here (la): the same prefetches of A^T's
 * next rows as call_generic, issued from inside the kernel's loop --
 * in a burst between calls they stalled on the line fill buffers (a sixth
 * of the time). */
FB_STEP void call_la(const full *f, const fblock *bk, const fktile *t, int c, int i, int r,
                     int mr, int w, const float *bp)
{
    const job *jb = &f->j;
    const int MR = jb->kn->mr, NR = jb->kn->nr;
    pfq q = {{NULL, NULL, NULL}, {0, 0, 0}, 0, NULL, 0, 0, 0, 0, 0};
    if (t->uap) {
        int tt = ((c - bk->j0) / NR) * bk->nrow + r, ka = t->k1 + tt * t->uarpc;
        int kb = ka + t->uarpc < t->k1 + t->kw1 ? ka + t->uarpc : t->k1 + t->kw1;
        if (kb > ka) {
            q.rp = (const char *)(jb->A + (long)ka * jb->lda + bk->i0);
            q.rs = (long)jb->lda * (long)sizeof(float);
            q.rl = (int)(t->uabytes / 64 + 1), q.rt = q.rl * (kb - ka);
            q.lim = 2 * q.rt;
        }
    }
    micro_avx512_pf(t->kw, bk->Al + (long)r * t->kw * MR, bp, tile_c(f, bk, c, i, r),
                    bk->Cs ? NR : jb->ldc, mr, w, t->fl, &q);
}
#endif

/* Before a call that does not spread them (not call_spread): the next B
 * panel's share of lines and the next K-tile's panels' share. */
FB_STEP void prefetch_next(const full *f, fktile *t, int r, const float *bp, bool bnext)
{
    const int NR = f->j.kn->nr, kw = t->kw;
    if (bnext && f->pf)
        prefetch_lines(bp + (long)kw * NR, t->bpl * 64, r * t->bper, (r + 1) * t->bper, true);
    if (t->fper) {
        /* lines [pl, pl + fper) of An then Bn */
        size_t e = t->pl + t->fper;
        if (t->pl < t->anl)
            prefetch_lines(t->An, t->an, t->pl, e, false);
        if (e > t->anl)
            prefetch_lines(t->Bn, t->bn, t->pl > t->anl ? t->pl - t->anl : 0, e - t->anl,
                           false);
        t->pl = e;
    }
}

/* The call through micro_at, A^T's next rows (uap) fetched before it. */
FB_STEP void call_generic(const full *f, const fblock *bk, const fktile *t, int c, int i, int r,
                          int mr, int w, const float *bp)
{
    const job *jb = &f->j;
    const int MR = jb->kn->mr, NR = jb->kn->nr, kw = t->kw;
    if (t->uap) {
        /* this call's share (uarpc rows k) of the next K-tile's rows of
         * A^T, the block's columns of each */
        int tt = ((c - bk->j0) / NR) * bk->nrow + r;
        for (int k = t->k1 + tt * t->uarpc; k < t->k1 + (tt + 1) * t->uarpc && k < t->k1 + t->kw1;
             k++)
            prefetch_lines(jb->A + (long)k * jb->lda + bk->i0, t->uabytes, 0,
                           t->uabytes / 64 + 1, false);
    }
    micro_at(f, i, t->k0, kw, bp, tile_c(f, bk, c, i, r), bk->Cs ? NR : jb->ldc, mr, w, t->fl,
             bk->Al ? bk->Al + (long)r * kw * MR : NULL);
}

/* K-tile k0 of the block: A's rows packed first (la), then the
 * micro-kernel over every micro-tile, column panel by column panel. */
static void ktile_run(const full *f, const fblock *bk, int k0)
{
    const job *jb = &f->j;
    const kern *kn = jb->kn;
    const int MR = kn->mr, NR = kn->nr;
    fktile t;
    ktile_plan(f, bk, k0, &t);
    if (bk->Al)
        pack_a_rows(kn, bk->Al, bk->i1 - bk->i0, t.kw, jb->A + (long)k0 * jb->lda + bk->i0,
                    jb->lda);
    for (int c = bk->j0; c < bk->j1; c += NR) {
        int w = bk->j1 - c < NR ? bk->j1 - c : NR;
        const float *bp = t.Bk + (long)(c / NR) * t.kw * NR;
        bool bnext = c + NR < bk->j1;
        for (int i = bk->i0, r = 0; i < bk->i1; i += MR, r++) {
            int mr = bk->i1 - i < MR ? bk->i1 - i : MR;
#if NT_X86
            if (t.spread) {
                call_spread(f, bk, &t, c, i, r, mr, w, bp, bnext);
                continue;
            }
#endif
            prefetch_next(f, &t, r, bp, bnext);
#if NT_X86
            if (bk->Al && kn->micro == micro_avx512) {
                call_la(f, bk, &t, c, i, r, mr, w, bp);
                continue;
            }
#endif
            call_generic(f, bk, &t, c, i, r, mr, w, bp);
        }
    }
}

/* The block is complete: its scratch copied to C, and, still in cache,
 * rounded once to the output dtype (f->out). */
static void block_store(const full *f, const fblock *bk)
{
    const job *jb = &f->j;
    const kern *kn = jb->kn;
    int i0 = bk->i0, i1 = bk->i1, j0 = bk->j0, j1 = bk->j1;
#if NT_X86
    if (bk->Cs && kn->micro == micro_avx512)
        scratch_to_c_avx512(bk->Cs, bk->nrow, i1 - i0, j1 - j0,
                            jb->C + (long)i0 * jb->ldc + j0, jb->ldc);
    else
#endif
    if (bk->Cs)
        scratch_to_c(bk->Cs, bk->nrow, kn->mr, kn->nr, i1 - i0, j1 - j0,
                     jb->C + (long)i0 * jb->ldc + j0, jb->ldc);
    if (f->out)
        for (int i = i0; i < i1; i++) {
            long o = (long)i * jb->ldc + j0;
            nt__st_f32(f->out + o * (long)nt__dtype_size(f->odt), f->odt, 1, jb->C + o,
                       j1 - j0);
        }
}
#undef FB_STEP

static void full_block(const job *jb, int b)
{
    const full *f = (const full *)jb;
    const kern *kn = jb->kn;
    const int MR = kn->mr, NR = kn->nr;
    /* blocks down a column of C in turn: the two threads take neighbours,
     * which share the column's B panels (read from memory once, then from
     * the shared cache); A is the smaller stream */
    /* The last few blocks run as tsub pieces (columns): whichever thread
     * finishes first takes pieces, so the other waits for a piece at
     * most, not a whole block (192 x 512 x 2048: 2 ms). */
    int piece = -1;
    if (b >= f->nreg) {
        piece = (b - f->nreg) % f->tsub;
        b = f->nreg + (b - f->nreg) / f->tsub;
    }
    int bi = b % jb->nbn, bj = b / jb->nbn, nbc = f->nbc;
    /* block edges at whole panels, spread evenly (784 columns in 4 blocks:
     * 7, 6, 6 and 6 panels of 32, not 8, 8, 8 and 1/2): the two threads'
     * last blocks end together instead of one waiting for the other */
    int npr = (jb->M + MR - 1) / MR, npc = (jb->N + NR - 1) / NR;
    int i0 = (int)((long)bi * npr / jb->nbn) * MR;
    int i1 = (int)((long)(bi + 1) * npr / jb->nbn) * MR;
    int j0 = (int)((long)bj * npc / nbc) * NR, j1 = (int)((long)(bj + 1) * npc / nbc) * NR;
    if (piece >= 0) {
        int np = (j1 - j0) / NR; /* whole panels: j1 is a panel edge here */
        int p0 = (int)((long)piece * np / f->tsub), p1 = (int)((long)(piece + 1) * np / f->tsub);
        if (p0 == p1)
            return; /* a block of fewer panels than pieces */
        j1 = j0 + p1 * NR, j0 += p0 * NR;
    }
    i1 = i1 < jb->M ? i1 : jb->M;
    j1 = j1 < jb->N ? j1 : jb->N;
    int nrow = (i1 - i0 + MR - 1) / MR, ncol = (j1 - j0 + NR - 1) / NR;
    /* With more than one K-tile the block accumulates in a scratch copy
     * whose micro-tiles are contiguous, copied to C at the end: C's rows
     * are often a multiple of 4 KiB apart, so a tile's 12 rows all fall in
     * one L1 set and evict each other and the panels (the scratch holds
     * the very floats C would, the same adds and stores). */
    float *Cs = jb->K > NT_GEMM_KTILE ? panel(&fc_key, (size_t)nrow * ncol * MR * NR) : NULL;
    float *Al = f->la ? panel(&la_key, (size_t)nrow * MR * NT_GEMM_KTILE) : NULL;
    fblock bk = {i0, i1, j0, j1, nrow, ncol, Cs, Al};
    for (int k0 = 0; k0 < jb->K; k0 += NT_GEMM_KTILE)
        ktile_run(f, &bk, k0);
    block_store(f, &bk);
}

/* Few rows (M within one block of C, as a training step's x @ w^T at
 * batch 128): each B element serves only M FMAs, so packing B is a fifth
 * of the work, and B packed by the other thread sits in the other core's
 * cache when used.  A column block here packs its own B, K-tile by
 * K-tile, into its thread's buffer and runs it at once from L1/L2; A (all
 * rows, packed before) is read by every block.  Same panels, same K-tile
 * order and stores as full_block: the same bits. */
static void rows_block(const job *jb, int b)
{
    const full *f = (const full *)jb;
    const kern *kn = jb->kn;
    const int MR = kn->mr, NR = kn->nr;
    int npc = (jb->N + NR - 1) / NR;
    int j0 = (int)((long)b * npc / jb->nblocks) * NR;
    int j1 = (int)((long)(b + 1) * npc / jb->nblocks) * NR;
    j1 = j1 < jb->N ? j1 : jb->N;
    /* the helper thread takes the second buffer */
    float *Bt = f->Bs + (P.have_th && pthread_equal(pthread_self(), P.th) ? f->bslot : 0);
    /* C's rows in a scratch of contiguous micro-tiles (full_block) */
    int nrow = (jb->M + MR - 1) / MR, ncol = (j1 - j0 + NR - 1) / NR;
    float *Cs = jb->K > NT_GEMM_KTILE ? panel(&fc_key, (size_t)nrow * ncol * MR * NR) : NULL;
    for (int k0 = 0; k0 < jb->K; k0 += NT_GEMM_KTILE) {
        int kw = jb->K - k0 < NT_GEMM_KTILE ? jb->K - k0 : NT_GEMM_KTILE;
        pack_b_tile(f, Bt, j0, j1, k0, kw);
        int fl = (k0 > 0 ? MICRO_ACC : 0) | (f->canon && k0 + kw >= jb->K ? MICRO_CANON : 0);
#if NT_X86
        /* The next K-tile's piece of B, as stored, comes from memory or
         * L3 (a weight the optimizer just rewrote), and pack_b_tile reads
         * it next as rows ld apart: fetched into L2 meanwhile, a share of
         * its lines per micro-kernel call, issued inside the K loop. */
        const int k1 = k0 + NT_GEMM_KTILE;
        const bool pfb = !f->ua && kn->micro == micro_avx512 && k1 < jb->K;
        const char *nrp = NULL;
        long nrs = 0, nl = 0, per = 0;
        int nrl = 0;
        if (pfb) {
            const int kw1 = jb->K - k1 < NT_GEMM_KTILE ? jb->K - k1 : NT_GEMM_KTILE;
            const long esz = f->bbf ? 2 : 4, ld = jb->ldb;
            const char *B = (const char *)(const void *)jb->B;
            /* B^T (x . w^T's w): rows j0.. of w, kw1 long; else rows k1.. */
            const long rows = f->bcol ? j1 - j0 : kw1, len = (f->bcol ? kw1 : j1 - j0) * esz;
            nrp = f->bcol ? B + ((long)j0 * ld + k1) * esz : B + ((long)k1 * ld + j0) * esz;
            nrs = ld * esz, nrl = (int)(len / 64 + 1), nl = rows * nrl;
            per = (nl + (long)nrow * ncol - 1) / ((long)nrow * ncol);
        }
#endif
        for (int c = j0; c < j1; c += NR) {
            int w = j1 - c < NR ? j1 - c : NR;
            const float *bp = Bt + (long)((c - j0) / NR) * kw * NR;
            for (int i = 0; i < jb->M; i += MR) {
                int mr = jb->M - i < MR ? jb->M - i : MR;
                float *cp = Cs ? Cs + ((long)((c - j0) / NR) * nrow + i / MR) * MR * NR
                               : jb->C + (long)i * jb->ldc + c;
#if NT_X86
                if (pfb) {
                    pfq q = {{NULL, NULL, NULL}, {0, 0, 0}, 0, NULL, 0, 0, 0, 0, 0};
                    long t = (long)((c - j0) / NR) * nrow + i / MR, l0 = t * per;
                    pf_rows(&q, nrp, nrs, nrl, l0, l0 + per < nl ? l0 + per : nl);
                    q.lim = 2 * q.rt;
                    const float *Ak = f->Ap + (long)f->Mpad * k0;
                    micro_avx512_pf(kw, Ak + (long)(i / MR) * kw * MR, bp, cp,
                                    Cs ? NR : jb->ldc, mr, w, fl, &q);
                    continue;
                }
#endif
                micro_at(f, i, k0, kw, bp, cp, Cs ? NR : jb->ldc, mr, w, fl, NULL);
            }
        }
    }
    if (Cs)
        scratch_to_c(Cs, nrow, MR, NR, jb->M, j1 - j0, jb->C + j0, jb->ldc);
    if (f->out)
        for (int i = 0; i < jb->M; i++) {
            long o = (long)i * jb->ldc + j0;
            nt__st_f32(f->out + o * (long)nt__dtype_size(f->odt), f->odt, 1, jb->C + o,
                       j1 - j0);
        }
}

/* The typed part of a product (nt__gemm_typed): bf16 operands, a rounded
 * copy of C.  NULL: f32 operands, C is the result. */
typedef struct typed {
    bool abf, bbf;
    char *out;
    nt_dtype odt;
} typed;

/* gemm_full for few rows (rows_block): A packed by a pack job, then
 * column blocks of NT_NC.  -1 (nothing written) when the host has no
 * memory for the buffers: gemm_full's other paths then run. */
static int gemm_rows(const kern *kn, int M, int N, int K, const float *A, int lda, bool arow,
                     const float *B, int ldb, bool bcol, float *C, int ldc, bool canon,
                     const typed *ty)
{
    int Mpad = (M + kn->mr - 1) / kn->mr * kn->mr, NB = NT_NC;
    int npc = (N + kn->nr - 1) / kn->nr, nbl = (N + NB - 1) / NB;
    bool split = (long)M * N * K >= NT_GEMM_SPLIT;
    /* A weight gradient (dY^T . X: 128 x 128 from K = 2048 rows) has a
     * single column block of NT_NC: cut into up to 4 blocks of whole
     * panels, so the second thread takes half of it (each block reads all
     * of A, packed once, from the caches) */
    if (split && nbl < 4)
        nbl = npc < 4 ? npc : 4;
    size_t bslot = (size_t)NT_GEMM_KTILE * (size_t)((npc + nbl - 1) / nbl * kn->nr);
    /* f32 A read where it is when few blocks read it (every block reads
     * all of it: packed, it would be read from the caches just the same,
     * after a pass to pack; for more blocks the packed stream is the
     * cheaper to read again) */
    bool ua = kn->micro_s && !(ty && ty->abf) && N <= NB;
    float *Ap = ua ? NULL : panel(&fa_key, (size_t)Mpad * (size_t)K);
    float *Bs = Ap || ua ? panel(&fb_key, 2 * bslot) : NULL;
    if (!Bs)
        return -1;
    int nk = (K + NT_GEMM_KTILE - 1) / NT_GEMM_KTILE;
    int nca = (M + kn->mr * NT_PACK_A - 1) / (kn->mr * NT_PACK_A);
    if (!ua) {
        full f = {{pack_block, M, N, K, lda, ldb, ldc, A, B, C, false, 0, nk * nca, 0, 0, 0},
                  Ap, NULL, Mpad, 0, nk, nca, 0, 0, 0, arow, bcol, false,
                  ty && ty->abf, ty && ty->bbf, NULL, NT_F32, 0, 0, 1, false, NULL, 0};
        f.j.kn = kn;
        run_job(&f.j, split);
    }
    full g = {{rows_block, M, N, K, lda, ldb, ldc, A, B, C, false, 0, nbl, 0, 0, 0},
              Ap, NULL, Mpad, 0, nk, 0, 0, 0, 0, arow, bcol, canon,
              ty && ty->abf, ty && ty->bbf, ty ? ty->out : NULL, ty ? ty->odt : NT_F32,
              0, 0, 1, false, Bs, bslot, ua};
    g.j.kn = kn;
    run_job(&g.j, split);
    return 0;
}

static int gemm_full(int M, int N, int K, const float *A, int lda, bool arow, const float *B,
                     int ldb, bool bcol, float *C, int ldc, bool canon, const typed *ty)
{
    if (M <= 0 || N <= 0)
        return 0;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            memset(C + (long)i * ldc, 0, (size_t)N * sizeof(float));
        if (ty && ty->out)
            for (int i = 0; i < M; i++)
                nt__st_f32(ty->out + (long)i * ldc * (long)nt__dtype_size(ty->odt), ty->odt, 1,
                           C + (long)i * ldc, N);
        return 0;
    }
    pool_start();
    const kern *kn = kern_now();
    int Mpad = (M + kn->mr - 1) / kn->mr * kn->mr, Npad = (N + kn->nr - 1) / kn->nr * kn->nr;
    if (Mpad <= gemm_mc_big && gemm_rows(kn, M, N, K, A, lda, arow, B, ldb, bcol, C, ldc, canon,
                                         ty) == 0)
        return 0;
    int mc = gemm_mc_big, ncb = gemm_ncb_big;
    if ((long)((M + mc - 1) / mc) * ((N + ncb - 1) / ncb) < 8)
        mc = NT_MC, ncb = NT_NCB;
    /* One column of C blocks (x . w^T at a layer's width: N 128 to 512):
     * each element of A serves one block only, so packing it would be a
     * pass over A (as long as the product's compute at N = 128) that buys
     * nothing: the micro-kernels read f32 A where it is. */
    bool ua = kn->micro_s && !(ty && ty->abf) && N <= ncb;
    float *Ap = ua ? NULL : panel(&fa_key, (size_t)Mpad * (size_t)K);
    float *Bp = Ap || ua ? panel(&fb_key, (size_t)Npad * (size_t)K) : NULL;
    if (Bp) {
        bool split = (long)M * N * K >= NT_GEMM_SPLIT;
        int nk = (K + NT_GEMM_KTILE - 1) / NT_GEMM_KTILE;
        int nca = ua ? 0 : (M + kn->mr * NT_PACK_A - 1) / (kn->mr * NT_PACK_A);
        int ncbp = (N + kn->nr * NT_PACK_B - 1) / (kn->nr * NT_PACK_B);
        full f = {{pack_block, M, N, K, lda, ldb, ldc, A, B, C, false, 0, nk * (nca + ncbp), 0,
                   0, 0},
                  Ap, Bp, Mpad, Npad, nk, nca, ncbp, 0, 0, arow, bcol, false,
                  ty && ty->abf, ty && ty->bbf, NULL, NT_F32, 0, 0, 1, false};
        f.j.kn = kn;
        run_job(&f.j, split);
        int nbm = (M + mc - 1) / mc, nbn = (N + ncb - 1) / ncb;
        if (ua && !arow && K > NT_GEMM_KTILE) {
            /* A^T packed block by block (la) over many K-tiles: blocks of
             * about NT_MC_LA rows read longer pieces of A^T's rows (its
             * rows are often 4 KiB apart, each in a page of its own) per
             * K-tile -- on one thread 1024 x 128 x 2048 took 0.72 of the
             * time with 96 rows; an even count for two threads */
            nbm = (M + NT_MC_LA - 1) / NT_MC_LA;
            if (split && nbm > 1 && nbm % 2)
                nbm++;
        }
        /* two threads: the last 4 blocks in 4 pieces each (not where each
         * piece would pack its block's rows of A again: la) */
        bool la = ua && !arow;
        int nbl = nbm * nbn, ntail = split && nbl >= 8 && !la ? 4 : 0, tsub = 4;
        full g = {{full_block, M, N, K, lda, ldb, ldc, A, B, C, false, nbm,
                   nbl - ntail + ntail * tsub, 0, 0, 0},
                  Ap, Bp, Mpad, Npad, nk, 0, 0, mc, ncb, arow, bcol, canon,
                  ty && ty->abf, ty && ty->bbf, ty ? ty->out : NULL, ty ? ty->odt : NT_F32,
                  nbn, nbl - ntail, tsub, false};
        g.ua = ua;
        g.la = la;
        /* Prefetching pays where the panels stream from memory (32 MB at
         * 2048^3); a training step's products (under 5 MB) find them in
         * the caches, where the prefetches only cost issue slots: 7% of
         * the CPU MLP step's samples sat on them.  Issued from inside the
         * AVX-512 kernel's loop (packed A) they cost little, and the next
         * K-tile's panels pay from past L2 (2 MB) on: on one thread 768^3
         * +11-13%, 1024^3 +8-11%, 1024 x 1024 x 256 +4-5%, 512^3 +2%;
         * with one K-tile (nothing ahead but the next B panel, already
         * near) or A unpacked they cost 1-7%. */
        size_t pbytes = (size_t)(Mpad + Npad) * (size_t)K * sizeof(float);
        g.pf = pbytes >= ((size_t)16 << 20) || AO_load(&force_pf) ||
               (!ua && K > NT_GEMM_KTILE && pbytes >= ((size_t)2 << 20));
        g.j.kn = kn;
        run_job(&g.j, split);
        return 0;
    }
    if (ty)
        return -1; /* the caller widens the operands and calls nt__gemm_ex */
    /* host memory short for the panels: K-tile by K-tile */
    for (int k0 = 0; k0 < K; k0 += NT_GEMM_KTILE) {
        int kw = K - k0 < NT_GEMM_KTILE ? K - k0 : NT_GEMM_KTILE;
        if (!arow && !bcol) {
            nt__gemm_ktile(M, N, kw, A + (long)k0 * lda, lda, B + (long)k0 * ldb, ldb, C, ldc,
                           k0 > 0);
            continue;
        }
        for (int i = 0; i < M; i++) /* element by element: the same recurrence */
            for (int j = 0; j < N; j++) {
                const float *a = arow ? A + (long)i * lda + k0 : A + (long)k0 * lda + i;
                const float *b = bcol ? B + (long)j * ldb + k0 : B + (long)k0 * ldb + j;
                put(C + (long)i * ldc + j, dot1(kw, a, arow ? 1 : lda, b, bcol ? 1 : ldb),
                    k0 > 0);
            }
    }
    if (canon)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(long)i * ldc + j] = nt__canon(C[(long)i * ldc + j]);
    return 0;
}

void nt__gemm(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
              int ldc)
{
    gemm_full(M, N, K, A, lda, false, B, ldb, false, C, ldc, false, NULL);
}

void nt__gemm_rowa(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                   float *C, int ldc)
{
    gemm_full(M, N, K, A, lda, true, B, ldb, false, C, ldc, false, NULL);
}

void nt__gemm_ex(int M, int N, int K, const float *A, int lda, bool arow, const float *B, int ldb,
                 bool bcol, float *C, int ldc)
{
    gemm_full(M, N, K, A, lda, arow, B, ldb, bcol, C, ldc, false, NULL);
}

void nt__gemm_ex_canon(int M, int N, int K, const float *A, int lda, bool arow, const float *B,
                       int ldb, bool bcol, float *C, int ldc)
{
    gemm_full(M, N, K, A, lda, arow, B, ldb, bcol, C, ldc, true, NULL);
}

int nt__gemm_typed(int M, int N, int K, const void *A, int lda, bool arow, nt_dtype adt,
                   const void *B, int ldb, bool bcol, nt_dtype bdt, float *C, int ldc, void *out,
                   nt_dtype odt)
{
    if ((adt != NT_F32 && adt != NT_BF16) || (bdt != NT_F32 && bdt != NT_BF16))
        return -1;
    /* bf16 x bf16: their own definition (core/gemm.h, core/gemm_bf16.c) */
    if (adt == NT_BF16 && bdt == NT_BF16)
        return nt__gemm_bf16(M, N, K, A, lda, arow, adt, B, ldb, bcol, bdt, C, ldc, false,
                             odt == NT_F32, out, odt);
    typed ty = {adt == NT_BF16, bdt == NT_BF16, odt == NT_F32 ? NULL : (char *)out, odt};
    return gemm_full(M, N, K, (const float *)A, lda, arow, (const float *)B, ldb, bcol, C, ldc,
                     odt == NT_F32, &ty);
}
