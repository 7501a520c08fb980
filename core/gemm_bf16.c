/* core/gemm_bf16.c - bf16 x bf16 products: their definition (core/gemm.h)
 * on AMX's tdpbf16ps where the CPU has it, else on the FMA units.
 *
 * The definition, per K-tile of NT_GEMM_KTILE (tiles added to C in
 * ascending order, C = C + s, as for every product):
 *     s = +0;  for each chunk of 16 consecutive k of the tile, in order
 *              (the tile's last chunk may be shorter):
 *         t = +0;  for k in the chunk, in order:  t = fma(a[k], b[k], t)
 *         s = s + t
 * It is what tdpbf16ps computes natively: with one real element per bf16
 * pair and a zero partner (A's -0, B's +0: the partner product is -0, and
 * x + -0 == x for every x), one instruction adds to each f32 element of its
 * tile the 16-step recurrence from +0, rounded once more in the add (T + t,
 * t rounded first; measured on the Xeon this was written on, and checked
 * again by a self-test at first use).  A tile zeroed per K-tile and one
 * instruction per chunk give s exactly; a short last chunk is padded with
 * pairs whose products are -0.  Exactness: every step still rounds once in
 * f32 (products of bf16 values are exact in f32), only the order inside a
 * tile differs from f32 x f32 products.
 *
 * The AMX path is taken only for operands that nt__gemm_bf16_range_ok
 * accepts (core/gemm_dpbf16.c: AMX, like vdpbf16ps, reads subnormal inputs
 * as 0 and flushes subnormal results; the range scan proves neither can
 * happen and nothing overflows; without acc the same range is gathered
 * while packing and judged once the blocks ran, a failing product then
 * taking another path that writes all of C) -- stored as bf16, or as f32
 * whose every element is a bf16 value (checked while packing) -- at the
 * AVX-512 level (nt__gemm_set_isa), on a CPU with AMX-TILE and AMX-BF16
 * whose kernel lets this process use the tile data (arch_prctl) and whose
 * instruction passes a self-test against the scalar definition at first
 * use.  Everything else runs the FMA path: packed f32 panels,
 * register-blocked micro-kernels at each ISA level (two accumulators per
 * element: s and the chunk's t), the same bits as the scalar definition
 * (fma rounds once in every lane) --
 * or vdpbf16ps (core/gemm_dpbf16.c) where that is faster.  If the host has
 * no memory for the panels, a plain loop. */
#include "core/gemm.h"

#include <glib.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic_ops.h>
#include "core/dtype.h"
#include "core/tsan.h" /* keep_lock: GLib's mutex made visible to TSan */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NT_BX 1
#else
#define NT_BX 0
#endif

#define CH 16  /* k per chunk */
#define SLOTS 4 /* AMX: blocks' buffers (at least the threads, core/gemm.h) */
#define MC 96  /* a block of C: MC rows x NC columns (multiples of every MR, NR, 32) */
#define NC 256

enum { AMX_AUTO, AMX_OFF, AMX_ON };
enum { AMX_UNKNOWN, AMX_NONE, AMX_RUNS };
static volatile AO_t amx_mode = AMX_AUTO, amx_state = AMX_UNKNOWN;
static volatile AO_t amx_calls, plain_forced;

/* Element (i, k) of A, (k, j) of B, whatever the storage. */
static inline float ld(const void *p, nt_dtype dt, long off)
{
    return dt == NT_BF16 ? nt__bf16_to_f32(((const uint16_t *)p)[off]) : ((const float *)p)[off];
}
static inline long aoff(int i, int k, int lda, bool arow)
{
    return arow ? (long)i * lda + k : (long)k * lda + i;
}
static inline long boff(int k, int j, int ldb, bool bcol)
{
    return bcol ? (long)j * ldb + k : (long)k * ldb + j;
}

/* One element's K-tile [k0, k1) of the definition. */
static float dot_chunked(const void *A, int lda, bool arow, nt_dtype adt, const void *B, int ldb,
                         bool bcol, nt_dtype bdt, int i, int j, int k0, int k1)
{
    float s = 0.0f;
    for (int c = k0; c < k1; c += CH) {
        float t = 0.0f;
        for (int k = c; k < k1 && k < c + CH; k++)
            t = fmaf(ld(A, adt, aoff(i, k, lda, arow)), ld(B, bdt, boff(k, j, ldb, bcol)), t);
        s = s + t;
    }
    return s;
}

/* ---------------- the FMA path ---------------- */

/* s over kk k-steps (chunks of CH) for one pair of panels (A [kk][MR],
 * B [kk][NR]) into tile [MR][NR]. */
typedef void (*bmicro_fn)(int kk, const float *Ap, const float *Bp, float *tile);
typedef struct bkern {
    int mr, nr;
    bmicro_fn fn;
} bkern;

static void micro_c(int kk, const float *Ap, const float *Bp, float *tile)
{
    float s[4][8] = {{0}};
    for (int c = 0; c < kk; c += CH) {
        float t[4][8] = {{0}};
        int e = c + CH < kk ? c + CH : kk;
        for (int k = c; k < e; k++)
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 8; q++)
                    t[r][q] = fmaf(Ap[k * 4 + r], Bp[k * 8 + q], t[r][q]);
        for (int r = 0; r < 4; r++)
            for (int q = 0; q < 8; q++)
                s[r][q] = s[r][q] + t[r][q];
    }
    memcpy(tile, s, sizeof s);
}

#if NT_BX
/* Named accumulators (arrays of vectors would live on the stack). */
#define R3(X) X(0) X(1) X(2)
__attribute__((target("avx2,fma"))) static void micro_avx2(int kk, const float *Ap,
                                                          const float *Bp, float *tile)
{
#define D(r) __m256 s##r##a = _mm256_setzero_ps(), s##r##b = s##r##a;
    R3(D)
#undef D
    for (int c = 0; c < kk; c += CH) {
#define D(r) __m256 t##r##a = _mm256_setzero_ps(), t##r##b = t##r##a;
        R3(D)
#undef D
        int e = c + CH < kk ? c + CH : kk;
        for (int k = c; k < e; k++) {
            __m256 b0 = _mm256_loadu_ps(Bp + k * 16), b1 = _mm256_loadu_ps(Bp + k * 16 + 8), a;
#define F(r)                                                                                       \
    a = _mm256_broadcast_ss(Ap + k * 3 + r);                                                       \
    t##r##a = _mm256_fmadd_ps(a, b0, t##r##a), t##r##b = _mm256_fmadd_ps(a, b1, t##r##b);
            R3(F)
#undef F
        }
#define S(r) s##r##a = _mm256_add_ps(s##r##a, t##r##a), s##r##b = _mm256_add_ps(s##r##b, t##r##b);
        R3(S)
#undef S
    }
#define W(r) _mm256_storeu_ps(tile + r * 16, s##r##a), _mm256_storeu_ps(tile + r * 16 + 8, s##r##b);
    R3(W)
#undef W
}
#undef R3

#define R6(X) X(0) X(1) X(2) X(3) X(4) X(5)
__attribute__((target(NT_TARGET_AVX512))) static void micro_avx512(int kk, const float *Ap,
                                                                  const float *Bp, float *tile)
{
#define D(r) __m512 s##r##a = _mm512_setzero_ps(), s##r##b = s##r##a;
    R6(D)
#undef D
    for (int c = 0; c < kk; c += CH) {
#define D(r) __m512 t##r##a = _mm512_setzero_ps(), t##r##b = t##r##a;
        R6(D)
#undef D
        int e = c + CH < kk ? c + CH : kk;
        for (int k = c; k < e; k++) {
            __m512 b0 = _mm512_loadu_ps(Bp + k * 32), b1 = _mm512_loadu_ps(Bp + k * 32 + 16), a;
#define F(r)                                                                                       \
    a = _mm512_set1_ps(Ap[k * 6 + r]);                                                             \
    t##r##a = _mm512_fmadd_ps(a, b0, t##r##a), t##r##b = _mm512_fmadd_ps(a, b1, t##r##b);
            R6(F)
#undef F
        }
#define S(r) s##r##a = _mm512_add_ps(s##r##a, t##r##a), s##r##b = _mm512_add_ps(s##r##b, t##r##b);
        R6(S)
#undef S
    }
#define W(r) _mm512_storeu_ps(tile + r * 32, s##r##a), _mm512_storeu_ps(tile + r * 32 + 16, s##r##b);
    R6(W)
#undef W
}
#undef R6
#endif

static const bkern bkerns[NT_ISA_COUNT] = {
    [NT_ISA_SCALAR] = {4, 8, micro_c},
#if NT_BX
    [NT_ISA_AVX2] = {3, 16, micro_avx2},
    [NT_ISA_AVX512] = {6, 32, micro_avx512},
#endif
};

typedef struct bjob {
    int M, N, K, lda, ldb, ldc;
    bool arow, bcol, acc, canon;
    nt_dtype adt, bdt, odt;
    const void *A, *B;
    float *C;
    char *out;
    const bkern *kn;
    float *Ap, *Bp; /* FMA path: panels [K][mr] / [K][nr] */
    uint32_t *Xa;      /* AMX path: A's 16-row tiles of pairs, per chunk */
    const void *Bb;    /* AMX path: B as bf16 (B, or Bn: B narrowed), rows ldbb apart */
    uint16_t *Bn;
    long ldbb;
    uint32_t *Bs;   /* AMX path: per slot, a block's B slices */
    float *Run;     /* AMX path: per slot, a block's running sums (NULL: one K-tile) */
    volatile AO_t slot[SLOTS]; /* AMX path: slots taken by running blocks */
    volatile AO_t alo, ahi, blo, bhi; /* AMX path: A's, B's least nonzero and greatest |x| */
    int ns, sg, ncb, mb, ng; /* AMX path: stripes of 32 columns, blocks of sg of them by mb rows */
    volatile AO_t notbf; /* AMX path: an f32-stored element is not a bf16 value */
    int nch;           /* AMX: chunks of K */
    int npa, npb, nbm, nbn;
} bjob;

/* n elements from p + off (unit stride) widened into d. */
static inline void widen(float *d, const void *p, nt_dtype dt, long off, int n)
{
    if (dt == NT_BF16) {
        const uint16_t *h = (const uint16_t *)p + off;
        for (int i = 0; i < n; i++) {
            uint32_t u = (uint32_t)h[i] << 16;
            memcpy(d + i, &u, 4);
        }
    } else {
        memcpy(d, (const float *)p + off, (size_t)n * 4);
    }
}

/* Panel b (A panels first, then B's) [K][R], widened, zeros past M / N. */
static void pack_fma(void *arg, int b)
{
    const bjob *d = arg;
    bool isa = b < d->npa;
    int R = isa ? d->kn->mr : d->kn->nr, P = isa ? b : b - d->npa;
    int tot = isa ? d->M : d->N, r0 = P * R, n = tot - r0 < R ? tot - r0 : R;
    float *dst = (isa ? d->Ap : d->Bp) + (long)P * d->K * R;
    const void *src = isa ? d->A : d->B;
    nt_dtype dt = isa ? d->adt : d->bdt;
    long ld = isa ? d->lda : d->ldb;
    if (!(isa ? d->arow : d->bcol)) { /* a row per k, the panel's elements contiguous */
        for (int k = 0; k < d->K; k++) {
            widen(dst + (long)k * R, src, dt, (long)k * ld + r0, n);
            for (int r = n; r < R; r++)
                dst[(long)k * R + r] = 0.0f;
        }
        return;
    }
    /* a row per element, k contiguous: 64 k of the panel's rows at a time
     * through a small buffer, then interleaved */
    float t[32][64];
    for (int k0 = 0; k0 < d->K; k0 += 64) {
        int kn = d->K - k0 < 64 ? d->K - k0 : 64;
        for (int r = 0; r < n; r++)
            widen(t[r], src, dt, (long)(r0 + r) * ld + k0, kn);
        for (int r = n; r < R; r++)
            memset(t[r], 0, sizeof t[r]);
        for (int k = 0; k < kn; k++)
            for (int r = 0; r < R; r++)
                dst[(long)(k0 + k) * R + r] = t[r][k];
    }
}

/* C (rows x w of a tile, ldc) from the tile's s: s alone (first), or C + s;
 * last: NaNs canonical (canon). */
static void merge(float *C, int ldc, const float *tile, int ldt, int rows, int w, bool first,
                  bool canon)
{
    for (int r = 0; r < rows; r++) {
        float *c = C + (long)r * ldc;
        const float *t = tile + (long)r * ldt;
        if (first)
            for (int q = 0; q < w; q++)
                c[q] = t[q];
        else
            for (int q = 0; q < w; q++)
                c[q] = c[q] + t[q];
        if (canon)
            for (int q = 0; q < w; q++)
                c[q] = nt__canon(c[q]);
    }
}

/* Block b of C rounded to odt (rows ldc apart in out as in C). */
static void round_out(const bjob *d, int i0, int i1, int j0, int j1)
{
    if (!d->out)
        return;
    for (int i = i0; i < i1; i++) {
        long o = (long)i * d->ldc + j0;
        nt__st_f32(d->out + o * (long)nt__dtype_size(d->odt), d->odt, 1, d->C + o, j1 - j0);
    }
}

#if NT_BX
/* merge at the AVX-512 level: a tile of up to 6 x 32 (ld 32), masked
 * lanes past w; canon: NaNs canonical as they are stored. */
__attribute__((target(NT_TARGET_AVX512))) static void merge512(float *C, int ldc,
                                                              const float *tile, int rows, int w,
                                                              bool first, bool canon)
{
    __mmask16 m0 = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32 ? (__mmask16)0xffff : w > 16 ? (__mmask16)((1u << (w - 16)) - 1) : 0;
    const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32((int)NT__QNAN_F32));
    for (int r = 0; r < rows; r++) {
        float *c = C + (long)r * ldc;
        __m512 v[2] = {_mm512_loadu_ps(tile + r * 32), _mm512_loadu_ps(tile + r * 32 + 16)};
        __mmask16 m[2] = {m0, m1};
        for (int h = 0; h < 2; h++) {
            if (!first)
                v[h] = _mm512_add_ps(_mm512_maskz_loadu_ps(m[h], c + 16 * h), v[h]);
            if (canon)
                v[h] = _mm512_mask_mov_ps(v[h], _mm512_cmp_ps_mask(v[h], v[h], _CMP_UNORD_Q),
                                          qnan);
            _mm512_mask_storeu_ps(c + 16 * h, m[h], v[h]);
        }
    }
}
#endif

static void block_fma(void *arg, int b)
{
    const bjob *d = arg;
    const int MR = d->kn->mr, NR = d->kn->nr;
    int bi = b % d->nbm, bj = b / d->nbm;
    int i0 = bi * MC, i1 = i0 + MC < d->M ? i0 + MC : d->M;
    int j0 = bj * NC, j1 = j0 + NC < d->N ? j0 + NC : d->N;
    float tile[6 * 32] __attribute__((aligned(64)));
    for (int k0 = 0; k0 < d->K; k0 += NT_GEMM_KTILE) {
        int kk = d->K - k0 < NT_GEMM_KTILE ? d->K - k0 : NT_GEMM_KTILE;
        bool first = k0 == 0 && !d->acc, last = k0 + kk >= d->K;
        for (int j = j0; j < j1; j += NR) {
            const float *bp = d->Bp + ((long)(j / NR) * d->K + k0) * NR;
            for (int i = i0; i < i1; i += MR) {
                d->kn->fn(kk, d->Ap + ((long)(i / MR) * d->K + k0) * MR, bp, tile);
#if NT_BX
                if (NR == 32) { /* the AVX-512 kernel's tile */
                    merge512(d->C + (long)i * d->ldc + j, d->ldc, tile,
                             i1 - i < MR ? i1 - i : MR, j1 - j < NR ? j1 - j : NR, first,
                             last && d->canon);
                    continue;
                }
#endif
                merge(d->C + (long)i * d->ldc + j, d->ldc, tile, NR, i1 - i < MR ? i1 - i : MR,
                      j1 - j < NR ? j1 - j : NR, first, last && d->canon);
            }
        }
    }
    round_out(d, i0, i1, j0, j1);
}

/* No memory for panels: element by element, the same definition. */
static void plain(const bjob *d)
{
    for (int i = 0; i < d->M; i++)
        for (int j = 0; j < d->N; j++) {
            float *c = d->C + (long)i * d->ldc + j;
            for (int k0 = 0; k0 < d->K; k0 += NT_GEMM_KTILE) {
                int k1 = k0 + NT_GEMM_KTILE < d->K ? k0 + NT_GEMM_KTILE : d->K;
                float s = dot_chunked(d->A, d->lda, d->arow, d->adt, d->B, d->ldb, d->bcol,
                                      d->bdt, i, j, k0, k1);
                *c = k0 == 0 && !d->acc ? s : *c + s;
            }
            if (d->canon)
                *c = nt__canon(*c);
        }
    for (int i = 0; i < d->M; i++)
        round_out(d, i, i + 1, 0, d->N);
}

/* One set of panel buffers kept across calls (a fresh one per call would
 * page-fault it in every time); a call finding it taken (a product on
 * another thread) allocates its own. */
static GMutex keep_lock;
static void *keep;
static size_t keep_n;

static void *buf_get(size_t n, bool *kept)
{
    *kept = g_mutex_trylock(&keep_lock);
    if (!*kept)
        return aligned_alloc(64, (n + 63) / 64 * 64);
    if (keep_n < n) {
        free(keep);
        keep = aligned_alloc(64, (n + 63) / 64 * 64);
        keep_n = keep ? n : 0;
    }
    if (!keep)
        g_mutex_unlock(&keep_lock), *kept = false;
    return keep;
}

static void buf_put(void *p, bool kept)
{
    if (kept)
        g_mutex_unlock(&keep_lock);
    else
        free(p);
}

/* ---------------- the AMX path ---------------- */

#if NT_BX
#define AMX_TARGET NT_TARGET_AVX512 ",amx-tile,amx-bf16"

typedef struct __attribute__((packed)) tilecfg {
    uint8_t palette, start;
    uint8_t res[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* Tiles 0-3: C (16 x 16 f32); 4, 5: A (16 rows x 16 pairs); 6, 7: B
 * (16 pair rows x 16 columns).  Every tile 16 rows of 64 bytes.  A static
 * constant: GCC 12 drops stores to a local config before ldtilecfg as if
 * the instruction did not read them. */
static const tilecfg tcfg __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

__attribute__((target(AMX_TARGET))) static void tiles_on(void) { _tile_loadconfig(&tcfg); }

__attribute__((target(AMX_TARGET))) static void tiles_off(void) { _tile_release(); }

/* A pair dword: the element in the low (first) half, the partner high. */
#define A_PAD 0x80000000u /* A's partner -0 */
#define A_NONE 0x80008000u /* past K: -0 with -0: the product is -0 */

/* 16 elements (n of them real, the rest 0) as u32 bf16 bits: at p (bf16
 * or f32 storage), unit stride; *low collects the f32 low halves. */
__attribute__((target(AMX_TARGET))) static inline __m512i ld16(const void *p, nt_dtype dt, long off,
                                                               int n, __m512i *low)
{
    __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1);
    if (dt == NT_BF16)
        return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + off));
    __m512i v = _mm512_maskz_loadu_epi32(m, (const float *)p + off);
    *low = _mm512_or_si512(*low, _mm512_and_si512(v, _mm512_set1_epi32(0xffff)));
    return _mm512_srli_epi32(v, 16);
}

/* The least nonzero and the greatest |x| of 2 x 16 bf16 (as u32 lanes,
 * high halves zero) into mn (|x| - 1 per u16 lane, 0xffff for zeros) and
 * mx, as nt__gemm_bf16_range_ok's scan: both vectors in one, 16-bit lanes. */
__attribute__((target(AMX_TARGET))) static inline void stat32(__m512i v, __m512i w, __m512i *mn,
                                                              __m512i *mx)
{
    v = _mm512_and_si512(_mm512_or_si512(v, _mm512_slli_epi32(w, 16)),
                         _mm512_set1_epi16(0x7fff));
    *mx = _mm512_max_epu16(*mx, v);
    *mn = _mm512_min_epu16(*mn, _mm512_sub_epi16(v, _mm512_set1_epi16(1)));
}

/* mn, mx (stat32's) folded into *lo, *hi, which other blocks update too. */
__attribute__((target(AMX_TARGET))) static void stat_fold(__m512i mn, __m512i mx,
                                                         volatile AO_t *lo, volatile AO_t *hi)
{
    uint16_t a[32], b[32];
    _mm512_storeu_si512(a, mn);
    _mm512_storeu_si512(b, mx);
    AO_t l = 0xffff, h = 0, o;
    for (int i = 0; i < 32; i++) {
        l = a[i] < l ? a[i] : l;
        h = b[i] > h ? b[i] : h;
    }
    l++;
    do
        o = AO_load(lo);
    while (l < o && !AO_compare_and_swap_full(lo, o, l));
    do
        o = AO_load(hi);
    while (h > o && !AO_compare_and_swap_full(hi, o, h));
}

/* r[0..16) transposed in place (16 x 16 dwords). */
__attribute__((target(AMX_TARGET))) static inline void tr16(__m512i *r)
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int g = 0; g < 16; g += 8)
        for (int c = 0; c < 4; c++) {
            t[g + c] = _mm512_shuffle_i32x4(u[g + c], u[g + 4 + c], 0x88);
            t[g + 4 + c] = _mm512_shuffle_i32x4(u[g + c], u[g + 4 + c], 0xdd);
        }
    for (int c = 0; c < 8; c++) {
        r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    }
}

/* A tile set b: rows [16 b, 16 b + 16), every chunk: Xa[b][c][16][16],
 * 16 x 16 at a time; A's partner -0, A_NONE past K, zeros past M. */
__attribute__((target(AMX_TARGET))) static void pack_amx_a_vec(bjob *d, int b)
{
    uint32_t *dst = d->Xa + (long)b * d->nch * 256;
    int i0 = 16 * b, mi = d->M - i0 < 16 ? d->M - i0 : 16;
    __m512i low = _mm512_setzero_si512(), pad = _mm512_set1_epi32((int)A_PAD),
            none = _mm512_set1_epi32((int)A_NONE), r[16];
    __m512i mn = _mm512_set1_epi32(-1), mx = _mm512_setzero_si512();
    for (int c = 0; c < d->nch; c++) {
        int k0 = c * CH, kn = d->K - k0 < 16 ? d->K - k0 : 16;
        __mmask16 kin = (__mmask16)(kn >= 16 ? 0xffff : (1u << kn) - 1);
        uint32_t *t = dst + (long)c * 256;
        if (d->arow) { /* row i: its k contiguous */
            for (int q = 0; q < 16; q++)
                r[q] = q < mi ? ld16(d->A, d->adt, (long)(i0 + q) * d->lda + k0, kn, &low)
                              : _mm512_setzero_si512();
        } else { /* rows k of A^T: m contiguous, then transposed */
            for (int q = 0; q < 16; q++)
                r[q] = q < kn ? ld16(d->A, d->adt, (long)(k0 + q) * d->lda + i0, mi, &low)
                              : _mm512_setzero_si512();
            tr16(r);
        }
        for (int q = 0; q < 16; q += 2)
            stat32(r[q], r[q + 1], &mn, &mx);
        for (int q = 0; q < 16; q++) {
            __m512i v = q < mi ? _mm512_mask_or_epi32(none, kin, r[q], pad) : _mm512_setzero_si512();
            _mm512_store_si512(t + q * 16, v);
        }
    }
    stat_fold(mn, mx, &d->alo, &d->ahi);
    if (_mm512_test_epi32_mask(low, low))
        AO_store(&d->notbf, 1);
}

/* B's columns [j, j + 32), chunks [c0, c1) (at most SLICE of them): two
 * tile sets, bs[h][c - c0][16 k][16] for columns j + 16 h ..; B's partner
 * +0, and +0 past K and N.  B as bf16 bits: d->Bb, rows d->ldbb apart.
 * Packed by the block that uses it, right before: the slice stays in L1
 * for every row of the block, where packing all of B first (twice its
 * bf16 bytes) went out to memory and back. */
#define SLICE (NT_GEMM_KTILE / CH)
#define SLW (2 * SLICE * 256) /* u32 of one stripe's slice */
#define SG 8 /* stripes per block, at most */
__attribute__((target(AMX_TARGET))) static void pack_b_slice(const bjob *d, int j, int c0, int c1,
                                                            uint32_t *bs)
{
    __m512i low = _mm512_setzero_si512(), r[16];
    __m512i mn = _mm512_set1_epi32(-1), mx = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        int j0 = j + 16 * h, nj = d->N - j0 < 16 ? d->N - j0 : 16;
        for (int c = c0; c < c1; c++) {
            int k0 = c * CH, kn = d->K - k0 < 16 ? d->K - k0 : 16;
            uint32_t *t = bs + (long)(h * SLICE + c - c0) * 256;
            if (nj <= 0) { /* past N: a zero tile */
                for (int q = 0; q < 16; q++)
                    _mm512_store_si512(t + q * 16, _mm512_setzero_si512());
                continue;
            }
            if (!d->bcol) { /* row k of B: n contiguous */
                for (int q = 0; q < 16; q++)
                    r[q] = q < kn ? ld16(d->Bb, NT_BF16, (long)(k0 + q) * d->ldbb + j0, nj, &low)
                                  : _mm512_setzero_si512();
            } else { /* rows j of B^T: k contiguous, then transposed */
                for (int q = 0; q < 16; q++)
                    r[q] = q < nj ? ld16(d->Bb, NT_BF16, (long)(j0 + q) * d->ldbb + k0, kn, &low)
                                  : _mm512_setzero_si512();
                tr16(r);
            }
            for (int q = 0; q < 16; q += 2)
                stat32(r[q], r[q + 1], &mn, &mx);
            for (int q = 0; q < 16; q++)
                _mm512_store_si512(t + q * 16, r[q]);
        }
    }
    bjob *w = (bjob *)d; /* the range, for amx_run's verdict */
    stat_fold(mn, mx, &w->blo, &w->bhi);
}

/* Rows [r0, r1) of an f32-stored B (as stored) narrowed to their bf16 bits
 * in d->Bn (rows d->ldbb apart); notbf where a low half is not zero. */
__attribute__((target(AMX_TARGET))) static void narrow_b(bjob *d, int r0, int r1)
{
    int len = d->bcol ? d->K : d->N;
    const __m512i lomask = _mm512_set1_epi32(0xffff);
    __m512i low = _mm512_setzero_si512();
    for (int r = r0; r < r1; r++) {
        const float *s = (const float *)d->B + (long)r * d->ldb;
        uint16_t *o = d->Bn + (long)r * d->ldbb;
        for (int x = 0; x < len; x += 16) {
            __mmask16 m = len - x >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - x)) - 1);
            __m512i v = _mm512_maskz_loadu_epi32(m, s + x);
            low = _mm512_or_si512(low, _mm512_and_si512(v, lomask));
            _mm256_mask_storeu_epi16(o + x, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
        }
    }
    if (_mm512_test_epi32_mask(low, low))
        AO_store(&d->notbf, 1);
}

/* Before the blocks: A's tile sets, and an f32-stored B narrowed (64 rows
 * a block). */
static void prep_amx(void *arg, int b)
{
    bjob *d = arg;
    if (b < d->npa) {
        pack_amx_a_vec(d, b);
        return;
    }
    int rows = d->bcol ? d->N : d->K, r0 = (b - d->npa) * 64;
    narrow_b(d, r0, r0 + 64 < rows ? r0 + 64 : rows);
}

/* A tile sets a0, a0 + one (rows 32 i ..), B tile sets b0, b0 + SLICE
 * chunks (a slice); n chunks from there: s of 32 x 32 elements into sc
 * (ld 32). */
__attribute__((target(AMX_TARGET))) static void amx_2x2(const uint32_t *a0, long astep,
                                                       const uint32_t *b0, int n, float *sc)
{
    const uint32_t *a1 = a0 + astep, *b1 = b0 + SLICE * 256;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int c = 0; c < n; c++) {
        _tile_loadd(4, a0 + (long)c * 256, 64);
        _tile_loadd(5, a1 + (long)c * 256, 64);
        _tile_loadd(6, b0 + (long)c * 256, 64);
        _tile_loadd(7, b1 + (long)c * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, sc, 128);
    _tile_stored(1, sc + 16, 128);
    _tile_stored(2, sc + 16 * 32, 128);
    _tile_stored(3, sc + 16 * 32 + 16, 128);
}

/* 16 f32 to bf16 bits, as nt__f32_to_bf16: to nearest even by the same
 * integer steps, NaNs canonical. */
__attribute__((target(AMX_TARGET))) static inline __m256i to_bf16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                            _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_set1_epi32(NT__QNAN_BF16));
    return _mm512_cvtepi32_epi16(r);
}

/* A 32 x 32 block of s (sc, ld 32) for C's rows i.., columns j.. (the
 * part inside M x N): s, or p + s (p: C or the block's running sum, rows
 * ldp apart), stored at q (rows ldq apart).  The last K-tile's (q is C
 * then): NaNs canonical (canon; C may hold NaNs with acc), and with out
 * rounded to odt here, from registers (bf16: C itself not written, it is
 * scratch then, core/gemm.h) or from C (any other odt). */
__attribute__((target(AMX_TARGET))) static void merge_out(const bjob *d, int i, int j,
                                                         const float *sc, const float *p,
                                                         long ldp, float *q, long ldq, bool last)
{
    int rows = d->M - i < 32 ? d->M - i : 32, w = d->N - j < 32 ? d->N - j : 32;
    __mmask16 m0 = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32 ? (__mmask16)0xffff : w > 16 ? (__mmask16)((1u << (w - 16)) - 1) : 0;
    bool canon = last && d->canon, o16 = last && d->out && d->odt == NT_BF16;
    const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32((int)NT__QNAN_F32));
    for (int r = 0; r < rows; r++) {
        __m512 v0 = _mm512_load_ps(sc + r * 32), v1 = _mm512_load_ps(sc + r * 32 + 16);
        if (p) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, p + r * ldp), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, p + r * ldp + 16), v1);
        }
        if (canon) {
            v0 = _mm512_mask_mov_ps(v0, _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q), qnan);
            v1 = _mm512_mask_mov_ps(v1, _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q), qnan);
        }
        if (o16) {
            uint16_t *o = (uint16_t *)d->out + (long)(i + r) * d->ldc + j;
            _mm256_mask_storeu_epi16(o, m0, to_bf16(v0));
            _mm256_mask_storeu_epi16(o + 16, m1, to_bf16(v1));
            continue;
        }
        _mm512_mask_storeu_ps(q + r * ldq, m0, v0);
        _mm512_mask_storeu_ps(q + r * ldq + 16, m1, v1);
    }
    if (last && d->out && !o16)
        for (int r = 0; r < rows; r++) {
            long o = (long)(i + r) * d->ldc + j;
            nt__st_f32(d->out + o * (long)nt__dtype_size(d->odt), d->odt, 1, d->C + o, w);
        }
}

/* Output rows [i, i + 32) x columns [j, j + w) (inside M x N) fetched
 * for writing: the rows are far apart, beyond what the hardware
 * prefetchers follow, and a store missing every cache stalls the tiles. */
static void prefetch_out(const bjob *d, int i, int j, int w)
{
    int rows = d->M - i < 32 ? d->M - i : 32;
    w = d->N - j < w ? d->N - j : w;
    bool o16 = d->out && d->odt == NT_BF16;
    for (int r = 0; r < rows; r++) {
        long o = (long)(i + r) * d->ldc + j;
        if (o16)
            for (int x = 0; x < w; x += 32)
                __builtin_prefetch((const uint16_t *)d->out + o + x, 1, 3);
        else
            for (int x = 0; x < w; x += 16)
                __builtin_prefetch(d->C + o + x, 1, 3);
    }
}

/* Block b: columns of sg stripes of 32 from 32 sg cb, rows [mb g, mb g +
 * mb) (b = g * ncb + cb).  Per K-tile: B's slices packed, then every 32 x
 * 32 s, each merged after the next one is computed (vector loads of what
 * the tile store just wrote would wait for it).  Between K-tiles the sums
 * stay in the block's own buffer (rows 32 sg apart), not in C: C's rows,
 * a page apart for N = 1024, all fall in the same few L1 sets. */
static void block_amx(void *arg, int b)
{
    const bjob *d = arg;
    int cb = b % d->ncb, g = b / d->ncb, s0 = cb * d->sg;
    int s1 = s0 + d->sg < d->ns ? s0 + d->sg : d->ns;
    int i0 = g * d->mb, i1 = i0 + d->mb < d->M ? i0 + d->mb : d->M;
    /* a free slot: blocks running at once never outnumber them (the
     * threads); the same few stay in cache from block to block */
    int sl = 0;
    while (!AO_compare_and_swap_full(&((bjob *)d)->slot[sl], 0, 1))
        sl = (sl + 1) % SLOTS;
    NT__TSAN_ACQUIRE(&d->slot[sl]); /* the last holder's writes to its buffers */
    uint32_t *bs = d->Bs + (long)sl * SG * SLW;
    float *run = d->Run ? d->Run + (long)sl * d->mb * 32 * d->sg : NULL;
    float sc[2][32 * 32] __attribute__((aligned(64)));
    long astep = (long)d->nch * 256, ldr = 32 * d->sg;
    int n = 0, pi = 0, pj = 0; /* s computed so far; the pending one's place */
    bool pfirst = false, plast = false;
    tiles_on();
    for (int k0 = 0; k0 < d->K; k0 += NT_GEMM_KTILE) {
        int kk = d->K - k0 < NT_GEMM_KTILE ? d->K - k0 : NT_GEMM_KTILE;
        int c0 = k0 / CH, c1 = (k0 + kk + CH - 1) / CH;
        bool first = k0 == 0, last = k0 + kk >= d->K;
        for (int s = s0; s < s1; s++)
            pack_b_slice(d, 32 * s, c0, c1, bs + (long)(s - s0) * SLW);
        for (int i = i0; i < i1; i += 32)
            for (int s = s0; s < s1; s++, n++) {
                if (last && s == s0 && i + 32 < i1) /* the next rows' output, written soon */
                    prefetch_out(d, i + 32, 32 * s0, 32 * (s1 - s0));
                amx_2x2(d->Xa + (long)(i / 16) * astep + (long)c0 * 256, astep,
                        bs + (long)(s - s0) * SLW, c1 - c0, sc[n & 1]);
                if (n > 0) {
                    float *c = d->C + (long)pi * d->ldc + pj;
                    float *r = run ? run + (long)(pi - i0) * ldr + (pj - 32 * s0) : NULL;
                    merge_out(d, pi, pj, sc[(n - 1) & 1], pfirst ? (d->acc ? c : NULL) : r,
                              pfirst ? d->ldc : ldr, plast ? c : r, plast ? d->ldc : ldr, plast);
                }
                pi = i, pj = 32 * s, pfirst = first, plast = last;
            }
    }
    float *c = d->C + (long)pi * d->ldc + pj;
    float *r = run ? run + (long)(pi - i0) * ldr + (pj - 32 * s0) : NULL;
    merge_out(d, pi, pj, sc[(n - 1) & 1], pfirst ? (d->acc ? c : NULL) : r,
              pfirst ? d->ldc : ldr, plast ? c : r, plast ? d->ldc : ldr, plast);
    tiles_off();
    NT__TSAN_RELEASE(&d->slot[sl]);
    AO_store_release(&((bjob *)d)->slot[sl], 0);
}

/* CPUID leaf 7: AMX-BF16 (EDX 22), AMX-TILE (EDX 24); the OS enabling the
 * tile state (XCR0 bits 17, 18) once this process asked for it. */
static bool amx_cpu(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 22 & 1))
        return false;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512bf16") ||
        !nt__gemm_isa_runs(NT_ISA_AVX512))
        return false;
    /* Linux: permission to use the tile data (ARCH_REQ_XCOMP_PERM,
     * XFEATURE_XTILEDATA); refused on kernels without it */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0)
        return false;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c >> 27 & 1)) /* OSXSAVE */
        return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo >> 17 & 3) == 3;
}

static int amx_run(bjob *d, bool checked); /* below */

/* At first use: AMX against the scalar definition on products where the
 * order shows (K not a multiple of 16, K < 16, several K-tiles, sums that
 * round and cancel, signed zeros, an accumulating C). */
static bool amx_selftest(void)
{
    enum { M = 40, N = 36, KMAX = 300 };
    uint16_t *A = malloc(sizeof(uint16_t) * M * KMAX), *B = malloc(sizeof(uint16_t) * KMAX * N);
    float *C = malloc(sizeof(float) * M * N);
    bool ok = A && B && C;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    static const int Ks[] = {1, 5, 16, 17, 127, 128, 129, 300};
    for (size_t t = 0; ok && t < sizeof Ks / sizeof *Ks; t++) {
        int K = Ks[t];
        for (int x = 0; x < M * K || x < K * N; x++) {
            uint16_t v[2];
            for (int h = 0; h < 2; h++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                v[h] = (s >> 20) % 8 == 0
                           ? (uint16_t)(s >> 32 & 0x8000) /* signed zeros */
                           : (uint16_t)((s >> 32 & 0x8000) | (uint16_t)((100 + (s >> 8) % 50) << 7) |
                                        (s & 0x7f));
            }
            if (x < M * K)
                A[x] = v[0];
            if (x < K * N)
                B[x] = v[1];
        }
        for (int x = 0; x < M * N; x++)
            C[x] = (float)(x % 7) - 3.0f;
        for (int acc = 0; ok && acc < 2; acc++) {
            bjob d = {.M = M, .N = N, .K = K, .lda = K, .ldb = N, .ldc = N, .arow = true,
                      .bcol = false, .acc = acc, .adt = NT_BF16, .bdt = NT_BF16, .A = A, .B = B,
                      .C = C};
            float *want = malloc(sizeof(float) * M * N);
            if (!want) {
                ok = false;
                break;
            }
            memcpy(want, C, sizeof(float) * M * N);
            bjob p = d;
            p.C = want;
            plain(&p);
            ok = amx_run(&d, true) == 0 && memcmp(want, C, sizeof(float) * M * N) == 0;
            free(want);
        }
    }
    free(A), free(B), free(C);
    return ok;
}

static int amx_state_now(void)
{
    AO_t st = AO_load_acquire(&amx_state);
    if (st == AMX_UNKNOWN) {
        /* two threads racing here both test; either finds the same */
        st = amx_cpu() ? AMX_RUNS : AMX_NONE;
        if (st == AMX_RUNS && !amx_selftest())
            st = AMX_NONE;
        AO_store_release(&amx_state, st);
    }
    return (int)st;
}

/* The AMX product into d: A's tiles packed (and an f32-stored B narrowed
 * to bf16), then (unless the caller did) checked: every f32-stored
 * element a bf16 value, and the operands' range (nt__gemm_bf16_range_ok's
 * conditions).  With acc the range scan runs first; without, the range
 * is gathered while A and B are packed (B is read once, not twice) and
 * judged at the end.  -1: not done (no memory for the tiles, or they fail
 * the checks): C untouched with acc, else C and out hold anything (the
 * caller's other path writes them all). */
static int amx_run(bjob *d, bool checked)
{
    d->nch = (d->K + CH - 1) / CH;
    d->npa = (d->M + 31) / 32 * 2;
    bool narrow = d->bdt != NT_BF16;
    int brows = d->bcol ? d->N : d->K, blen = d->bcol ? d->K : d->N;
    /* blocks: sg stripes of 32 columns by mb rows; A's tiles for mb rows
     * within 1 MB (a block reads them once per K-tile, best from L2), at
     * least 128 rows, fewer where there are under 8 blocks of columns
     * (for the threads).  4 stripes keep a K-tile's slices in L1 (64 KB
     * measured 0.75x slower with 128 x 1024 x 1024); with one K-tile there
     * is no next one to keep them for, and 8 give C's rows longer runs
     * (1024 x 1024 x 128 into f32: 0.82x the time of 4) */
    d->ns = (d->N + 31) / 32, d->sg = d->K > NT_GEMM_KTILE ? 4 : SG;
    d->ncb = (d->ns + d->sg - 1) / d->sg;
    int mb = 32 * (int)((1L << 20) / (2048L * d->nch)), want = (8 + d->ncb - 1) / d->ncb;
    int even = ((d->M + want - 1) / want + 31) / 32 * 32;
    mb = mb < 128 ? 128 : mb;
    d->mb = even < mb ? even : mb;
    d->ng = (d->M + d->mb - 1) / d->mb;
    int nblk = d->ncb * d->ng;
    /* u32 units: A's tiles, the slots' B slices, their running sums (more
     * than one K-tile), B narrowed */
    size_t na = (size_t)d->npa * d->nch * 256, ns = (size_t)SLOTS * SG * SLW;
    size_t nr = d->K > NT_GEMM_KTILE ? (size_t)SLOTS * d->mb * 32 * d->sg : 0;
    size_t nbn = narrow ? ((size_t)brows * blen + 1) / 2 : 0;
    bool kept;
    uint32_t *buf = buf_get((na + ns + nr + nbn) * sizeof(uint32_t), &kept);
    if (!buf)
        return -1;
    d->Xa = buf, d->Bs = buf + na;
    d->Run = nr ? (float *)(buf + na + ns) : NULL;
    d->Bn = narrow ? (uint16_t *)(buf + na + ns + nr) : NULL;
    d->Bb = narrow ? (const void *)d->Bn : d->B;
    d->ldbb = narrow ? blen : d->ldb;
    bool split = (long)d->M * d->N * d->K >= (1L << 20);
    AO_store(&d->notbf, 0);
    for (int s = 0; s < SLOTS; s++)
        AO_store(&d->slot[s], 0);
    AO_store(&d->alo, 0x10000), AO_store(&d->ahi, 0);
    AO_store(&d->blo, 0x10000), AO_store(&d->bhi, 0);
    nt__par_blocks(d->npa + (narrow ? (brows + 63) / 64 : 0), prep_amx, d, split);
    bool late = !checked && !d->acc, ok = checked || !AO_load(&d->notbf);
    if (ok && late) /* A alone: Inf, NaN or a subnormal fail whatever B holds */
        ok = AO_load(&d->ahi) < 0x7f80 && AO_load(&d->alo) >= 0x80;
    else if (ok && !checked && d->adt == NT_BF16) /* the operands: half the tiles' bytes */
        ok = nt__gemm_bf16_range_ok(d->K, d->A, d->arow ? d->M : d->K, d->arow ? d->K : d->M,
                                    d->lda, d->Bb, brows, blen, d->ldbb);
    else if (ok && !checked)
        ok = nt__gemm_bf16_range_ok(d->K, (const uint16_t *)d->Xa, (int)(na / 16), 32, 32, d->Bb,
                                    brows, blen, d->ldbb);
    if (ok)
        nt__par_blocks(nblk, block_amx, d, split);
    if (ok && late)
        ok = nt__gemm_bf16_range_verdict(d->K, (unsigned)AO_load(&d->alo),
                                         (unsigned)AO_load(&d->ahi), (unsigned)AO_load(&d->blo),
                                         (unsigned)AO_load(&d->bhi));
    buf_put(buf, kept);
    return ok ? 0 : -1;
}
#endif /* NT_BX */

bool nt__gemm_amx_runs(void)
{
#if NT_BX
    return amx_state_now() == AMX_RUNS;
#else
    return false;
#endif
}

int nt__gemm_set_amx(int mode)
{
    if (mode < -1 || mode > 1)
        return -1;
    if (mode == 1 && !nt__gemm_amx_runs())
        return -1;
    AO_store_release(&amx_mode, mode < 0 ? AMX_AUTO : mode ? AMX_ON : AMX_OFF);
    return 0;
}

unsigned long nt__gemm_amx_calls(void) { return (unsigned long)AO_load_acquire(&amx_calls); }

void nt__gemm_bf16_set_plain(bool on) { AO_store_release(&plain_forced, on); }

int nt__gemm_bf16(int M, int N, int K, const void *A, int lda, bool arow, nt_dtype adt,
                  const void *B, int ldb, bool bcol, nt_dtype bdt, float *C, int ldc, bool acc,
                  bool canon, void *out, nt_dtype odt)
{
    if (M <= 0 || N <= 0)
        return 0;
    bjob d = {.M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .arow = arow,
              .bcol = bcol, .acc = acc, .canon = canon, .adt = adt, .bdt = bdt, .odt = odt,
              .A = A, .B = B, .C = C, .out = odt == NT_F32 ? NULL : out};
    if (K <= 0) { /* one empty K-tile, s = +0, as nt__gemm_ktile: C + 0 (acc) or zeros */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float *c = C + (long)i * ldc + j;
                *c = acc ? *c + 0.0f : 0.0f;
                if (canon)
                    *c = nt__canon(*c);
            }
        round_out(&d, 0, M, 0, N);
        return 0;
    }
    if (AO_load_acquire(&plain_forced)) {
        plain(&d);
        return 0;
    }
    int isa = nt__gemm_isa();
#if NT_BX
    AO_t mode = AO_load_acquire(&amx_mode);
    if (mode != AMX_OFF && isa == NT_ISA_AVX512 && amx_state_now() == AMX_RUNS) {
        bjob x = d;
        if (amx_run(&x, false) == 0) {
            AO_fetch_and_add1(&amx_calls);
            return 0;
        }
    }
    /* vdpbf16ps (core/gemm_dpbf16.c: only where faster, or forced) */
    if (!acc && adt == NT_BF16 && bdt == NT_BF16 &&
        nt__gemm_dpbf16(M, N, K, A, lda, arow, B, ldb, bcol, C, ldc, d.out, odt) == 0)
        return 0;
#endif
    d.kn = &bkerns[isa];
    d.npa = (M + d.kn->mr - 1) / d.kn->mr, d.npb = (N + d.kn->nr - 1) / d.kn->nr;
    size_t na = (size_t)d.npa * d.kn->mr * (size_t)K, nb = (size_t)d.npb * d.kn->nr * (size_t)K;
    bool kept;
    float *buf = buf_get((na + nb) * sizeof(float), &kept);
    if (!buf) {
        plain(&d);
        return 0;
    }
    d.Ap = buf, d.Bp = buf + na;
    d.nbm = (M + MC - 1) / MC, d.nbn = (N + NC - 1) / NC;
    bool split = (long)M * N * K >= (1L << 20);
    nt__par_blocks(d.npa + d.npb, pack_fma, &d, split);
    nt__par_blocks(d.nbm * d.nbn, block_fma, &d, split);
    buf_put(buf, kept);
    return 0;
}
