/* core/gemm.c - the K-tile matmul primitive; see gemm.h for the recurrence.
 *
 * Every element is s = fma(A[k][i], B[k][j], s) for k ascending, then added
 * to C.  fma rounds once and exactly, so a 16-lane AVX-512 lane, an 8-lane
 * AVX2 lane and the scalar fmaf of the edge loops give the same bits: where
 * an element is computed, and by which thread, never changes it.
 *
 * Speed: a register-blocked micro-kernel (MR rows x NR columns of C held in
 * vector registers across the whole K loop, B rows loaded as vectors, A
 * broadcast), columns blocked so a panel of B stays in L2, and a second
 * thread taking half the column blocks of big calls. */
#include "gemm.h"

#include <glib.h>
#include <math.h>
#include <string.h>

#include <atomic_ops.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define NT_MR 8
#define NT_NR 32
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NT_MR 6
#define NT_NR 16
#else
#define NT_MR 4
#define NT_NR 4
#endif

/* Columns per block: a 128 x 256 panel of B is 128 KiB, comfortably in L2. */
#define NT_NC 256

/* One element the scalar way (edges). */
static inline float dot1(int K, const float *A, int lda, const float *B, int ldb)
{
    float s = 0.0f;
    for (int k = 0; k < K; k++)
        s = fmaf(A[(long)k * lda], B[(long)k * ldb], s);
    return s;
}

static inline void put(float *p, float s, bool acc) { *p = acc ? *p + s : s; }

#if defined(__AVX512F__)
/* C[i0 .. i0+8)[j0 .. j0+32) */
static void micro(int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
                  bool acc)
{
    __m512 c[NT_MR][2];
    for (int r = 0; r < NT_MR; r++)
        c[r][0] = c[r][1] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *a = A + (long)k * lda, *b = B + (long)k * ldb;
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        for (int r = 0; r < NT_MR; r++) {
            __m512 ar = _mm512_set1_ps(a[r]);
            c[r][0] = _mm512_fmadd_ps(ar, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(ar, b1, c[r][1]);
        }
    }
    for (int r = 0; r < NT_MR; r++)
        for (int h = 0; h < 2; h++) {
            float *p = C + (long)r * ldc + 16 * h;
            __m512 v = acc ? _mm512_add_ps(_mm512_loadu_ps(p), c[r][h]) : c[r][h];
            _mm512_storeu_ps(p, v);
        }
}
#elif defined(__AVX2__) && defined(__FMA__)
static void micro(int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
                  bool acc)
{
    __m256 c[NT_MR][2];
    for (int r = 0; r < NT_MR; r++)
        c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *a = A + (long)k * lda, *b = B + (long)k * ldb;
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        for (int r = 0; r < NT_MR; r++) {
            __m256 ar = _mm256_set1_ps(a[r]);
            c[r][0] = _mm256_fmadd_ps(ar, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(ar, b1, c[r][1]);
        }
    }
    for (int r = 0; r < NT_MR; r++)
        for (int h = 0; h < 2; h++) {
            float *p = C + (long)r * ldc + 8 * h;
            __m256 v = acc ? _mm256_add_ps(_mm256_loadu_ps(p), c[r][h]) : c[r][h];
            _mm256_storeu_ps(p, v);
        }
}
#else
static void micro(int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
                  bool acc)
{
    float c[NT_MR][NT_NR] = {{0}};
    for (int k = 0; k < K; k++)
        for (int r = 0; r < NT_MR; r++)
            for (int j = 0; j < NT_NR; j++)
                c[r][j] = fmaf(A[(long)k * lda + r], B[(long)k * ldb + j], c[r][j]);
    for (int r = 0; r < NT_MR; r++)
        for (int j = 0; j < NT_NR; j++)
            put(C + (long)r * ldc + j, c[r][j], acc);
}
#endif

/* Columns [j0, j1) of the whole call. */
static void run_cols(int M, int j0, int j1, int K, const float *A, int lda, const float *B,
                     int ldb, float *C, int ldc, bool acc)
{
    int Mb = M - M % NT_MR;
    for (int jb = j0; jb < j1; jb += NT_NC) {
        int je = jb + NT_NC < j1 ? jb + NT_NC : j1;
        int Nb = jb + (je - jb) / NT_NR * NT_NR;
        for (int i = 0; i < Mb; i += NT_MR)
            for (int j = jb; j < Nb; j += NT_NR)
                micro(K, A + i, lda, B + j, ldb, C + (long)i * ldc + j, ldc, acc);
        /* edges: the same recurrence, element by element */
        for (int i = 0; i < M; i++)
            for (int j = i < Mb ? Nb : jb; j < je; j++)
                put(C + (long)i * ldc + j, dot1(K, A + i, lda, B + j, ldb), acc);
    }
}

/* ---------------- the second thread ---------------- */

typedef struct {
    int M, j0, j1, K, lda, ldb, ldc;
    const float *A, *B;
    float *C;
    bool acc;
} job;

static struct {
    GMutex use;            /* one caller at a time shares the helper */
    GMutex lock;
    GCond cond;
    GThread *th;
    job j;
    volatile AO_t seq, done;
    bool stop;
} P;
static GOnce pool_once = G_ONCE_INIT;

static gpointer helper(gpointer unused)
{
    (void)unused;
    AO_t seen = 0;
    for (;;) {
        /* spin briefly for the next job, then sleep */
        int spins = 0;
        while (AO_load_acquire(&P.seq) == seen && spins < 20000) {
            spins++;
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        g_mutex_lock(&P.lock);
        while (AO_load_acquire(&P.seq) == seen && !P.stop)
            g_cond_wait(&P.cond, &P.lock);
        bool stop = P.stop;
        job j = P.j;
        g_mutex_unlock(&P.lock);
        if (stop)
            return NULL;
        seen = AO_load_acquire(&P.seq);
        run_cols(j.M, j.j0, j.j1, j.K, j.A, j.lda, j.B, j.ldb, j.C, j.ldc, j.acc);
        AO_store_release(&P.done, seen);
    }
}

static gpointer pool_start(gpointer unused)
{
    (void)unused;
    g_mutex_init(&P.use);
    g_mutex_init(&P.lock);
    g_cond_init(&P.cond);
    if (g_get_num_processors() > 1)
        P.th = g_thread_new("nt-gemm", helper, NULL);
    return NULL;
}

/* Big enough to be worth a second thread (MACs). */
#define NT_GEMM_SPLIT (1 << 20)

void nt__gemm_ktile(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, bool acc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        if (!acc)
            for (int i = 0; i < M; i++)
                memset(C + (long)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    g_once(&pool_once, pool_start, NULL);
    if (P.th && (long)M * N * K >= NT_GEMM_SPLIT && N >= 2 * NT_NR && g_mutex_trylock(&P.use)) {
        /* the helper takes the right half of the columns, on a block edge */
        int half = (N / 2 + NT_NR - 1) / NT_NR * NT_NR;
        g_mutex_lock(&P.lock);
        P.j = (job){M, half, N, K, lda, ldb, ldc, A, B, C, acc};
        AO_t s = AO_load(&P.seq) + 1;
        AO_store_release(&P.seq, s);
        g_cond_signal(&P.cond);
        g_mutex_unlock(&P.lock);
        run_cols(M, 0, half, K, A, lda, B, ldb, C, ldc, acc);
        while (AO_load_acquire(&P.done) != s) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        g_mutex_unlock(&P.use);
        return;
    }
    run_cols(M, 0, N, K, A, lda, B, ldb, C, ldc, acc);
}
