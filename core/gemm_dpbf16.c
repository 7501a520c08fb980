/* core/gemm_dpbf16.c - bf16 x bf16 products on AVX512_BF16's vdpbf16ps,
 * taken only where they give the bits of their definition in core/gemm.h
 * (each chunk of 16 k summed by the recurrence below from +0, in 8 pair
 * instructions, then added to the tile's sum: s = s + t).
 *
 * vdpbf16ps(acc, a, b) computes, per f32 lane j, from the bf16 pairs
 * (a[2j], a[2j+1]) and (b[2j], b[2j+1]):
 *     acc = fma(a[2j], b[2j], fma(a[2j+1], b[2j+1], acc))
 * the odd (high) element first, each step rounded once to nearest even (a
 * bf16 product is exact in f32, so "+= product" is an fma) -- but with
 * subnormal inputs read as zero and subnormal results flushed to zero, and
 * with no say in NaN payloads.  So element k of each K pair goes in the
 * high half of a dword and k + 1 in the low half: the instruction then does
 * k, then k + 1, the recurrence's order, two multiply-adds per lane.  An odd
 * K-tile's last pair holds its element in the high half and the product
 * +0 * -0 = -0 in the low: x + -0 == x for every x (+0 + -0 is +0 when
 * rounding to nearest), so the pad changes nothing.
 *
 * When the bits are provably the same (decided per call, from one scan of
 * both operands, panel by panel as they are packed; C is written only
 * after the verdict):
 *  - every input finite (no Inf, no NaN: nothing to say about payloads);
 *  - no input subnormal (the instruction would read it as 0);
 *  - no product and no partial sum subnormal (it would flush them): a
 *    normal bf16 x is m * 2^(e - 134), e its biased exponent and m an
 *    integer in [128, 255], so every product a * b is an integer multiple
 *    of q = 2^(ea + eb - 268), ea and eb the least exponents among A's and
 *    B's nonzero elements.  A sum of multiples of q is one, and rounding it
 *    keeps it one (a rounded result is a multiple of its ulp, and rounding
 *    only happens where the ulp exceeds the lowest set bit, itself at least
 *    q).  So a nonzero product or rounded partial sum is at least q in
 *    magnitude: with q >= 2^-126 (ea + eb >= 142) none is subnormal, in
 *    either computation.  Each K-tile starts from +0 (core/gemm.h), which
 *    has no quantum of its own; the sums across K-tiles (C + s) are plain
 *    f32 adds here as in the recurrence;
 *  - no overflow: |x| < 2^(e - 126), so every product is below
 *    2^(Ea + Eb - 252) with Ea, Eb the greatest exponents, and every partial
 *    sum (rounding is monotonic and 2^127 representable) at most K times
 *    that: with ceil(log2 K) + Ea + Eb <= 379 nothing reaches 2^127.
 *    Then no result is Inf or NaN either, and C needs no canonical NaNs.
 * Otherwise the call takes the f32 path (core/gemm.c), which is the
 * definition.
 *
 * Used only at the AVX-512 level (nt__gemm_set_isa), on CPUs with
 * AVX512_BF16 whose instruction passes a self-test against sequential fmaf
 * at first use (pair order, rounding, signed zeros, the pad) -- and, unless
 * forced on (tests), only where it is faster: at first use a short loop of
 * it is timed against one of 512-bit FMAs, and it must do more
 * multiply-adds per second (on some CPUs that have it, e.g. the Xeon this
 * was written on, it does half as many: then it is left off).  Whichever
 * path runs, the bits are the same; only the speed differs. */
#include "core/gemm.h"

#include <glib.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic_ops.h>
#include "core/dtype.h"
#include "core/tsan.h" /* buf_lock: GLib's mutex made visible to TSan */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include "core/tr16.h"
#define NT_DP 1
#else
#define NT_DP 0
#endif

/* The mode nt__gemm_set_dpbf16 sets, and what the first use found out. */
enum { DP_AUTO, DP_OFF, DP_ON };
enum { DP_UNKNOWN, DP_NONE, DP_SLOW, DP_FAST };
static volatile AO_t dp_mode = DP_AUTO, dp_state = DP_UNKNOWN;
static volatile AO_t dp_calls; /* products taken on this path (tests) */

#if NT_DP

#define DP_TARGET NT_TARGET_AVX512 ",avx512bf16"
#define MR 6 /* a tile of C: MR rows x NR columns (two accumulators each: s and t) */
#define NR 32
#define KP 64 /* pairs per K-tile (NT_GEMM_KTILE / 2) */
#define MC 96 /* a block of C: MC rows x NC columns */
#define NC 256

/* ---------------- the operands' range ---------------- */

/* Over rows x cols bf16 (rows ld apart): the least nonzero |x| (as bits,
 * 0x10000 when all are zero) and the greatest |x|. */
__attribute__((target(DP_TARGET))) static void scan(const uint16_t *p, int rows, int cols,
                                                    long ld, unsigned *lo, unsigned *hi)
{
    const __m512i abs = _mm512_set1_epi16(0x7fff), one = _mm512_set1_epi16(1);
    __m512i mn = _mm512_set1_epi16(-1), mx = _mm512_setzero_si512();
    for (int r = 0; r < rows; r++) {
        const uint16_t *s = p + (long)r * ld;
        for (int c = 0; c < cols; c += 32) {
            int n = cols - c < 32 ? cols - c : 32;
            __mmask32 m = n == 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1);
            __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi16(m, s + c), abs);
            mx = _mm512_max_epu16(mx, v);
            /* |x| - 1 wraps to 0xffff for zeros (and the lanes past n) */
            mn = _mm512_min_epu16(mn, _mm512_sub_epi16(v, one));
        }
    }
    uint16_t a[32], b[32];
    _mm512_storeu_si512(a, mn);
    _mm512_storeu_si512(b, mx);
    unsigned l = 0xffff, h = 0;
    for (int i = 0; i < 32; i++) {
        l = a[i] < l ? a[i] : l;
        h = b[i] > h ? b[i] : h;
    }
    *lo = l + 1, *hi = h;
}

/* Whether the instruction gives the recurrence's bits on these operands
 * (the conditions at the top of the file). */
static bool verdict(int K, const uint16_t *A, int ar, int ac, long lda, const uint16_t *B, int br,
                    int bc, long ldb)
{
    if (!nt__gemm_isa_runs(NT_ISA_AVX512) || !__builtin_cpu_supports("avx512bw"))
        return false; /* scan's instructions */
    unsigned alo, ahi, blo, bhi;
    scan(A, ar, ac, lda, &alo, &ahi);
    scan(B, br, bc, ldb, &blo, &bhi);
    return nt__gemm_bf16_range_verdict(K, alo, ahi, blo, bhi);
}
#endif /* NT_DP */

bool nt__gemm_bf16_range_verdict(int K, unsigned alo, unsigned ahi, unsigned blo, unsigned bhi)
{
    if (ahi >= 0x7f80 || bhi >= 0x7f80) /* Inf or NaN */
        return false;
    if (alo < 0x80 || blo < 0x80) /* a subnormal input */
        return false;
    if ((alo >> 7) + (blo >> 7) < 142) /* q below 2^-126 */
        return false;
    int lk = 0;
    while ((1L << lk) < (long)K)
        lk++;
    return lk + (int)(ahi >> 7) + (int)(bhi >> 7) <= 379;
}
#if NT_DP

/* ---------------- packing ---------------- */

/* Panels of pairs: A panel P is [Kp][MR] dwords, B panel Q [Kp][NR], for
 * the Kp = ceil(K / 2) pairs (k, k + 1), k even: element k in the high
 * half, k + 1 (or the pad: +0 in A, -0 in B) in the low half.  K-tile t
 * is pairs [KP t, KP t + KP).  Rows past M, columns past N: zeros. */
typedef struct dp {
    int M, N, K, Kp, lda, ldb, ldc;
    bool arow, bcol;
    const uint16_t *A, *B;
    uint32_t *Ap, *Bp;
    float *C;
    char *out;
    nt_dtype odt;
    int npa, npb; /* panels */
    int nbm, nbn; /* blocks of C */
    unsigned *rng; /* per panel: its elements' least nonzero |x| and greatest (scan) */
} dp;

/* Along a row (element k at s[k]): dst[p * R] for p < Kp. */
static void pair_along(uint32_t *dst, int R, const uint16_t *s, int K, uint16_t pad)
{
    int p = 0;
    for (; 2 * p + 1 < K; p++)
        dst[(long)p * R] = (uint32_t)s[2 * p] << 16 | s[2 * p + 1];
    if (K & 1)
        dst[(long)p * R] = (uint32_t)s[K - 1] << 16 | pad;
}

/* pair_along for the n <= R rows of a panel at once (row r at s + r * ld,
 * R a multiple of 16): pairs [0, p1), p1 a multiple of 16 with 2 p1 <= K,
 * 16 rows x 16 pairs a block -- each row's 16 pairs are 16 dwords in
 * memory with element k in the low half, so a 16-bit rotate puts it high,
 * and a transpose puts each pair's 16 rows side by side.  Rows past n get
 * zeros.  Returns p1; pair_along does the rest. */
__attribute__((target(DP_TARGET))) static int pair_rows(uint32_t *dst, int R, int n,
                                                        const uint16_t *s, long ld, int K)
{
    const int p1 = K / 32 * 16;
    for (int p0 = 0; p0 < p1; p0 += 16) /* both halves of a 128-byte dst row in turn */
        for (int r0 = 0; r0 < R; r0 += 16) {
            __m512i v[16];
            for (int r = 0; r < 16; r++)
                v[r] = r0 + r < n ? _mm512_rol_epi32(
                                        _mm512_loadu_si512(s + (long)(r0 + r) * ld + 2 * p0), 16)
                                  : _mm512_setzero_si512();
            nt__tr16(v);
            for (int e = 0; e < 16; e++)
                _mm512_storeu_si512(dst + (long)(p0 + e) * R + r0, v[e]);
        }
    return p1;
}

/* Across rows (element k of lane c at s[k * ld + c]): dst[p * R + c] for
 * c < n, zeros for c in [n, R). */
__attribute__((target(DP_TARGET))) static void pair_across(uint32_t *dst, int R, int n,
                                                           const uint16_t *s, long ld, int K,
                                                           uint16_t pad)
{
    const __m512i padv = _mm512_set1_epi32(pad);
    for (int p = 0; 2 * p < K; p++) {
        const uint16_t *r0 = s + (long)(2 * p) * ld, *r1 = r0 + ld;
        bool two = 2 * p + 1 < K;
        for (int c = 0; c < R; c += 16) {
            int w = n - c < 16 ? (n - c > 0 ? n - c : 0) : 16;
            __mmask16 m = (__mmask16)((1u << w) - 1);
            __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + c));
            __m512i l = two ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + c))
                            : _mm512_maskz_mov_epi32(m, padv);
            __m512i v = _mm512_or_si512(_mm512_slli_epi32(h, 16), l);
            /* only this pair's R lanes (R = 12 for A): writing 16 would
             * clobber the next pair's, or the next panel's, which another
             * thread may have packed already */
            int q = R - c < 16 ? R - c : 16;
            _mm512_mask_storeu_epi32(dst + (long)p * R + c, (__mmask16)((1u << q) - 1), v);
        }
    }
}

/* One panel: b < npa packs A panel b, else B panel b - npa; first it
 * scans the elements it packs (d->rng[2 b], [2 b + 1]): the panels cover
 * A and B exactly, so their ranges together are the operands' (safe's
 * verdict, from one pass on both threads, the data then in cache for the
 * packing, instead of a pass over both operands on one thread first). */
static void pack_panel(void *arg, int b)
{
    const dp *d = arg;
    bool isa = b < d->npa;
    int P = isa ? b : b - d->npa, R = isa ? MR : NR, tot = isa ? d->M : d->N;
    int r0 = P * R, n = tot - r0 < R ? tot - r0 : R;
    uint32_t *dst = (isa ? d->Ap : d->Bp) + (long)P * d->Kp * R;
    const uint16_t *s = isa ? d->A : d->B;
    long ld = isa ? d->lda : d->ldb;
    uint16_t pad = isa ? 0x0000 : 0x8000;
    if (isa ? d->arow : d->bcol) /* rows r0 .. r0 + n of K elements */
        scan(s + (long)r0 * ld, n, d->K, ld, &d->rng[2 * b], &d->rng[2 * b + 1]);
    else /* K rows, columns r0 .. r0 + n */
        scan(s + r0, d->K, n, ld, &d->rng[2 * b], &d->rng[2 * b + 1]);
    if (isa ? d->arow : d->bcol) {
        /* B's panels (x @ w^T's w, R = NR): whole blocks of pairs in registers */
        int p1 = isa ? 0 : pair_rows(dst, R, n, s + (long)r0 * ld, ld, d->K);
        for (int r = 0; r < n; r++)
            pair_along(dst + (long)p1 * R + r, R, s + (long)(r0 + r) * ld + 2 * p1, d->K - 2 * p1,
                       pad);
        for (int r = n; r < R; r++)
            for (int p = p1; p < d->Kp; p++)
                dst[(long)p * R + r] = 0;
    } else {
        pair_across(dst, R, n, s + r0, ld, d->K, pad);
    }
}

/* ---------------- the micro-kernel ---------------- */

/* C[0..rows)[0..w) = (acc ? C + s : s), s the MR x NR tile of kp pairs
 * summed as bf16 x bf16 products are (core/gemm.h): t from +0 over each
 * chunk of 8 pairs (16 k), s = s + t.  Named accumulators (an array would
 * live on the stack).  Only the first R rows' sums are formed (R = MR, or
 * 2 for a tile of at most 2 rows: a batch of 128 is 21 tiles of 6 and one
 * of 2), each row's by the same instructions in the same order. */
#define DP_R6(X) X(0) X(1) X(2) X(3) X(4) X(5)
__attribute__((target(DP_TARGET), always_inline)) static inline void
micro_dp_rows(int kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int ldc, int rows, int w,
              bool acc, const int R)
{
#define DP_DECL(r) __m512 s##r##a = _mm512_setzero_ps(), s##r##b = s##r##a;
    DP_R6(DP_DECL)
#undef DP_DECL
    for (int p0 = 0; p0 < kp; p0 += 8) {
        int p1 = p0 + 8 < kp ? p0 + 8 : kp;
#define DP_DECL(r) __m512 t##r##a = _mm512_setzero_ps(), t##r##b = t##r##a;
        DP_R6(DP_DECL)
#undef DP_DECL
        for (int p = p0; p < p1; p++) {
            const uint32_t *a = Ap + p * MR, *b = Bp + p * NR;
            __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
            __m512bh ar;
#define DP_ROW(r)                                                                                  \
    if ((r) < R) {                                                                                 \
        ar = (__m512bh)_mm512_set1_epi32((int)a[r]);                                               \
        t##r##a = _mm512_dpbf16_ps(t##r##a, ar, b0), t##r##b = _mm512_dpbf16_ps(t##r##b, ar, b1);  \
    }
            DP_R6(DP_ROW)
#undef DP_ROW
        }
#define DP_ADD(r)                                                                                  \
    if ((r) < R)                                                                                   \
        s##r##a = _mm512_add_ps(s##r##a, t##r##a), s##r##b = _mm512_add_ps(s##r##b, t##r##b);
        DP_R6(DP_ADD)
#undef DP_ADD
    }
#define DP_LIST(r) {s##r##a, s##r##b},
    __m512 c[MR][2] = {DP_R6(DP_LIST)};
#undef DP_LIST
    __mmask16 m0 = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32 ? (__mmask16)0xffff : w > 16 ? (__mmask16)((1u << (w - 16)) - 1) : 0;
    for (int r = 0; r < rows; r++) {
        float *q = C + (long)r * ldc;
        __m512 v0 = c[r][0], v1 = c[r][1];
        if (acc) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, q), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, q + 16), v1);
        }
        _mm512_mask_storeu_ps(q, m0, v0);
        _mm512_mask_storeu_ps(q + 16, m1, v1);
    }
}
#undef DP_R6

__attribute__((target(DP_TARGET))) static void micro_dp(int kp, const uint32_t *Ap,
                                                        const uint32_t *Bp, float *C, int ldc,
                                                        int rows, int w, bool acc)
{
    if (rows <= 2)
        micro_dp_rows(kp, Ap, Bp, C, ldc, rows, w, acc, 2);
    else
        micro_dp_rows(kp, Ap, Bp, C, ldc, rows, w, acc, MR);
}

/* Block b of C (rows down a column of blocks first): every K-tile in
 * order, then the block rounded to odt while it is in cache. */
static void block(void *arg, int b)
{
    const dp *d = arg;
    int bi = b % d->nbm, bj = b / d->nbm;
    int i0 = bi * MC, i1 = i0 + MC < d->M ? i0 + MC : d->M;
    int j0 = bj * NC, j1 = j0 + NC < d->N ? j0 + NC : d->N;
    for (int p0 = 0; p0 < d->Kp; p0 += KP) {
        int kp = d->Kp - p0 < KP ? d->Kp - p0 : KP;
        for (int j = j0; j < j1; j += NR) {
            const uint32_t *bp = d->Bp + ((long)(j / NR) * d->Kp + p0) * NR;
            for (int i = i0; i < i1; i += MR)
                micro_dp(kp, d->Ap + ((long)(i / MR) * d->Kp + p0) * MR, bp,
                         d->C + (long)i * d->ldc + j, d->ldc, i1 - i < MR ? i1 - i : MR,
                         j1 - j < NR ? j1 - j : NR, p0 > 0);
        }
    }
    if (d->out)
        for (int i = i0; i < i1; i++) {
            long o = (long)i * d->ldc + j0;
            nt__st_f32(d->out + o * (long)nt__dtype_size(d->odt), d->odt, 1, d->C + o, j1 - j0);
        }
}

/* ---------------- first use: self-test and speed ---------------- */

static float bfv(uint16_t h) { return nt__bf16_to_f32(h); }

/* Lane by lane against sequential fmaf, odd element first. */
__attribute__((target(DP_TARGET))) static bool check16(const uint16_t *a, const uint16_t *b,
                                                       const float *acc)
{
    __m512bh va, vb;
    memcpy(&va, a, 64);
    memcpy(&vb, b, 64);
    float got[16];
    _mm512_storeu_ps(got, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), va, vb));
    for (int j = 0; j < 16; j++) {
        float want = fmaf(bfv(a[2 * j]), bfv(b[2 * j]),
                          fmaf(bfv(a[2 * j + 1]), bfv(b[2 * j + 1]), acc[j]));
        if (memcmp(&want, &got[j], 4) != 0)
            return false;
    }
    return true;
}

static bool selftest(void)
{
    uint16_t a[32], b[32];
    float acc[16];
    /* where the order shows: 1 + 2^24 rounds to 2^24 first, or 1 - 2^24 is
     * exact first; signed zeros; the pad (+0 * -0) after every sign */
    static const struct {
        uint16_t alo, ahi, blo, bhi;
        float acc;
    } fixed[] = {
        {0xcb80, 0x4b80, 0x3f80, 0x3f80, 1.0f},   /* hi 2^24 first: 2^24, then 0 */
        {0x4b80, 0xcb80, 0x3f80, 0x3f80, 1.0f},
        {0x0000, 0x3fc0, 0x8000, 0x4040, 0.0f},   /* the pad after a real element */
        {0x0000, 0x8000, 0x8000, 0x3f80, 0.0f},   /* +0 + -0 + -0 = +0 */
        {0x0000, 0x8000, 0x8000, 0x3f80, -0.0f},  /* -0 stays -0 */
        {0x0000, 0x0000, 0x8000, 0x8000, -0.0f},
        {0x0000, 0x3f80, 0x8000, 0xbf80, 1.0f},   /* 1 - 1 = +0, then the pad */
        {0x3f80, 0x3f80, 0x3f80, 0xbf80, 0.0f},   /* -1 + 1 = +0 */
        {0x3f81, 0x3f81, 0x3f81, 0x3f81, 3e-8f},  /* rounding to even in the sums */
        {0x4b00, 0xcb00, 0x3f80, 0x3f80, 0.5f},
    };
    size_t nf = sizeof fixed / sizeof *fixed;
    for (size_t base = 0; base < nf; base += 16) {
        for (int j = 0; j < 16; j++) {
            size_t f = base + (size_t)j < nf ? base + (size_t)j : 0;
            a[2 * j] = fixed[f].alo, a[2 * j + 1] = fixed[f].ahi;
            b[2 * j] = fixed[f].blo, b[2 * j + 1] = fixed[f].bhi;
            acc[j] = fixed[f].acc;
        }
        if (!check16(a, b, acc))
            return false;
    }
    /* random normal-range values: products and sums with exponents over
     * +-40, so sums round and cancel everywhere */
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int it = 0; it < 4096; it++) {
        for (int i = 0; i < 32; i++) {
            uint16_t v[2];
            for (int t = 0; t < 2; t++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                v[t] = (uint16_t)((s >> 32 & 0x8000) | (uint16_t)((107 + (s >> 8) % 40) << 7) |
                                  (s & 0x7f));
            }
            a[i] = v[0], b[i] = v[1];
        }
        for (int j = 0; j < 16; j++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            acc[j] = bfv((uint16_t)((s >> 32 & 0x8000) | (uint16_t)((107 + (s >> 8) % 40) << 7) |
                                    (s & 0x7f))) *
                     (1.0f + (float)(s >> 40 & 0xff) / 256.0f);
        }
        if (!check16(a, b, acc))
            return false;
    }
    return true;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* n rounds of 8 independent vdpbf16ps (256 multiply-adds each) ... */
__attribute__((target(DP_TARGET), noinline)) static float loop_dp(int n)
{
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
           c7 = c0;
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    __m512bh b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    for (int i = 0; i < n; i++) {
        c0 = _mm512_dpbf16_ps(c0, a, b), c1 = _mm512_dpbf16_ps(c1, a, b);
        c2 = _mm512_dpbf16_ps(c2, a, b), c3 = _mm512_dpbf16_ps(c3, a, b);
        c4 = _mm512_dpbf16_ps(c4, a, b), c5 = _mm512_dpbf16_ps(c5, a, b);
        c6 = _mm512_dpbf16_ps(c6, a, b), c7 = _mm512_dpbf16_ps(c7, a, b);
        __asm__ volatile("" : "+v"(a)); /* no hoisting */
    }
    __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    return _mm512_reduce_add_ps(t);
}

/* ... and of 8 independent 512-bit FMAs (128 multiply-adds each). */
__attribute__((target(DP_TARGET), noinline)) static float loop_fma(int n)
{
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
           c7 = c0;
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0x1p-7f);
    for (int i = 0; i < n; i++) {
        c0 = _mm512_fmadd_ps(a, b, c0), c1 = _mm512_fmadd_ps(a, b, c1);
        c2 = _mm512_fmadd_ps(a, b, c2), c3 = _mm512_fmadd_ps(a, b, c3);
        c4 = _mm512_fmadd_ps(a, b, c4), c5 = _mm512_fmadd_ps(a, b, c5);
        c6 = _mm512_fmadd_ps(a, b, c6), c7 = _mm512_fmadd_ps(a, b, c7);
        __asm__ volatile("" : "+v"(a));
    }
    __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    return _mm512_reduce_add_ps(t);
}

/* Whether vdpbf16ps does clearly more multiply-adds per second than FMA:
 * the best of nine short runs of each (about 0.1 ms in all), interleaved
 * so a busy host slows both alike.  Only the speed depends on it. */
static bool faster(void)
{
    double bd = 1e30, bf = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < 9; r++) {
        double t0 = now_ns();
        sink += loop_dp(1000);
        double t1 = now_ns();
        sink += loop_fma(1000);
        double t2 = now_ns();
        bd = t1 - t0 < bd ? t1 - t0 : bd;
        bf = t2 - t1 < bf ? t2 - t1 : bf;
    }
    (void)sink;
    /* twice the multiply-adds per instruction: faster if under 2x the time,
     * with a margin for the scan and the pairing */
    return bd * 1.25 < 2.0 * bf;
}

static int state_now(void)
{
    AO_t s = AO_load_acquire(&dp_state);
    if (s == DP_UNKNOWN) {
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("avx512bf16") || !nt__gemm_isa_runs(NT_ISA_AVX512) ||
            !selftest())
            s = DP_NONE;
        else
            s = faster() ? DP_FAST : DP_SLOW;
        AO_store_release(&dp_state, s);
    }
    return (int)s;
}

/* The packed panels: one set, reused (a product running on another thread
 * meanwhile takes the f32 path). */
static GMutex buf_lock;
static uint32_t *buf;
static size_t buf_n;

#endif /* NT_DP */

bool nt__gemm_bf16_range_ok(int K, const uint16_t *A, int ar, int ac, long lda, const uint16_t *B,
                            int br, int bc, long ldb)
{
#if NT_DP
    return K > 0 && ar > 0 && ac > 0 && br > 0 && bc > 0 &&
           verdict(K, A, ar, ac, lda, B, br, bc, ldb);
#else
    (void)K, (void)A, (void)ar, (void)ac, (void)lda, (void)B, (void)br, (void)bc, (void)ldb;
    return false;
#endif
}

bool nt__gemm_dpbf16_runs(void)
{
#if NT_DP
    return state_now() >= DP_SLOW;
#else
    return false;
#endif
}

int nt__gemm_set_dpbf16(int mode)
{
    if (mode < -1 || mode > 1)
        return -1;
    if (mode == 1 && !nt__gemm_dpbf16_runs())
        return -1;
    AO_store_release(&dp_mode, mode < 0 ? DP_AUTO : mode ? DP_ON : DP_OFF);
    return 0;
}

unsigned long nt__gemm_dpbf16_calls(void) { return (unsigned long)AO_load_acquire(&dp_calls); }

int nt__gemm_dpbf16(int M, int N, int K, const void *A, int lda, bool arow, const void *B,
                    int ldb, bool bcol, float *C, int ldc, void *out, nt_dtype odt)
{
#if NT_DP
    AO_t mode = AO_load_acquire(&dp_mode);
    if (mode == DP_OFF || M <= 0 || N <= 0 || K <= 0 || nt__gemm_isa() != NT_ISA_AVX512)
        return 1;
    int st = state_now();
    if (st == DP_NONE || (st == DP_SLOW && mode != DP_ON))
        return 1;
    if (!nt__gemm_isa_runs(NT_ISA_AVX512) || !__builtin_cpu_supports("avx512bw"))
        return 1; /* scan's instructions */
    if (!g_mutex_trylock(&buf_lock))
        return 1;
    int Kp = (K + 1) / 2, npa = (M + MR - 1) / MR, npb = (N + NR - 1) / NR;
    /* B's panels start 64-byte aligned, for their aligned loads; then each
     * panel's range (pack_panel) */
    size_t na = ((size_t)npa * MR * (size_t)Kp + 15) / 16 * 16, nb = (size_t)npb * NR * (size_t)Kp;
    size_t nr = 2 * (size_t)(npa + npb);
    /* aligned_alloc: a size that is a multiple of the alignment */
    size_t nall = (na + nb + nr + 15) / 16 * 16;
    if (buf_n < nall) {
        free(buf);
        buf = aligned_alloc(64, nall * sizeof(uint32_t));
        buf_n = buf ? nall : 0;
    }
    if (!buf) {
        g_mutex_unlock(&buf_lock);
        return 1;
    }
    dp d = {M, N, K, Kp, lda, ldb, ldc, arow, bcol, A, B, buf, buf + na, C,
            out, odt, npa, npb, (M + MC - 1) / MC, (N + NC - 1) / NC, buf + na + nb};
    bool split = (long)M * N * K >= (1L << 20);
    nt__par_blocks(npa + npb, pack_panel, &d, split);
    /* safe's verdict from the panels' ranges: not safe, nothing written
     * but the panels (the f32 path then computes C) */
    unsigned lo[2] = {0x10000, 0x10000}, hi[2] = {0, 0};
    for (int b = 0; b < npa + npb; b++) {
        int o = b >= npa;
        lo[o] = d.rng[2 * b] < lo[o] ? d.rng[2 * b] : lo[o];
        hi[o] = d.rng[2 * b + 1] > hi[o] ? d.rng[2 * b + 1] : hi[o];
    }
    if (!nt__gemm_bf16_range_verdict(K, lo[0], hi[0], lo[1], hi[1])) {
        g_mutex_unlock(&buf_lock);
        return 1;
    }
    nt__par_blocks(d.nbm * d.nbn, block, &d, split);
    g_mutex_unlock(&buf_lock);
    AO_fetch_and_add1(&dp_calls);
    return 0;
#else
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)arow, (void)B, (void)ldb, (void)bcol;
    (void)C, (void)ldc, (void)out, (void)odt;
    return 1;
#endif
}
