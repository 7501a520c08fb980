/* core/gemm.c - the K-tile matmul primitive; see gemm.h for the recurrence.
 *
 * Every element is s = fma(A[k][i], B[k][j], s) for k ascending, then added
 * to C.  fma rounds once and exactly, so an AVX2 lane and the portable
 * fmaf loop give the same bits: where an element is computed, and by which
 * thread, never changes it.
 *
 * Speed: register-blocked micro-kernels (up to 6 rows x 16 columns of C held
 * in AVX2 registers across the whole K loop, B rows loaded as vectors, A
 * broadcast; edge rows and columns use the same kernels with fewer rows and
 * masked lanes, never a scalar loop), columns blocked so a panel of B stays
 * in L2, and a second thread taking half the column blocks of big calls. */
#include "gemm.h"

#include <glib.h>
#include <math.h>
#include <string.h>

#include <atomic_ops.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NT_MR 6
#define NT_NR 16
#define NT_VEC 1
#else
#define NT_MR 4
#define NT_NR 4
#define NT_VEC 0
#endif

/* Columns per block: a 128 x 256 panel of B is 128 KiB, comfortably in L2. */
#define NT_NC 256

/* One element the scalar way (only without AVX2). */
static inline float dot1(int K, const float *A, int lda, const float *B, int ldb)
{
    float s = 0.0f;
    for (int k = 0; k < K; k++)
        s = fmaf(A[(long)k * lda], B[(long)k * ldb], s);
    return s;
}

static inline void put(float *p, float s, bool acc) { *p = acc ? *p + s : s; }

#if NT_VEC
/* C[0 .. MR)[0 .. 16) += A^T . B over K, for MR = 1..6 rows: one function
 * per row count (the accumulators must stay in registers), all lanes the
 * same fma recurrence.  `mask` selects the valid columns of a partial block
 * (all ones for a full one). */
#define NT_MICRO(MR)                                                                        \
    static void micro##MR(int K, const float *A, int lda, const float *B, int ldb, float *C,  \
                          int ldc, bool acc, __m256i m0, __m256i m1)                        \
    {                                                                                       \
        __m256 c[MR][2];                                                                    \
        for (int r = 0; r < MR; r++)                                                        \
            c[r][0] = c[r][1] = _mm256_setzero_ps();                                        \
        for (int k = 0; k < K; k++) {                                                       \
            const float *a = A + (long)k * lda, *b = B + (long)k * ldb;                      \
            __m256 b0 = _mm256_maskload_ps(b, m0), b1 = _mm256_maskload_ps(b + 8, m1);       \
            for (int r = 0; r < MR; r++) {                                                  \
                __m256 ar = _mm256_broadcast_ss(a + r);                                     \
                c[r][0] = _mm256_fmadd_ps(ar, b0, c[r][0]);                                  \
                c[r][1] = _mm256_fmadd_ps(ar, b1, c[r][1]);                                  \
            }                                                                               \
        }                                                                                   \
        for (int r = 0; r < MR; r++) {                                                      \
            float *p = C + (long)r * ldc;                                                   \
            __m256 v0 = c[r][0], v1 = c[r][1];                                              \
            if (acc) {                                                                      \
                v0 = _mm256_add_ps(_mm256_maskload_ps(p, m0), v0);                           \
                v1 = _mm256_add_ps(_mm256_maskload_ps(p + 8, m1), v1);                       \
            }                                                                               \
            _mm256_maskstore_ps(p, m0, v0);                                                 \
            _mm256_maskstore_ps(p + 8, m1, v1);                                             \
        }                                                                                   \
    }
NT_MICRO(1)
NT_MICRO(2)
NT_MICRO(3)
NT_MICRO(4)
NT_MICRO(5)
NT_MICRO(6)

typedef void (*micro_fn)(int, const float *, int, const float *, int, float *, int, bool, __m256i,
                         __m256i);
static const micro_fn micro[NT_MR + 1] = {NULL, micro1, micro2, micro3, micro4, micro5, micro6};

/* Lane masks for the first w (0..16) columns of a block. */
static void col_masks(int w, __m256i *m0, __m256i *m1)
{
    int32_t lanes[16];
    for (int i = 0; i < 16; i++)
        lanes[i] = i < w ? -1 : 0;
    *m0 = _mm256_loadu_si256((const __m256i *)lanes);
    *m1 = _mm256_loadu_si256((const __m256i *)(lanes + 8));
}

/* Columns [j0, j1) of the whole call. */
static void run_cols(int M, int j0, int j1, int K, const float *A, int lda, const float *B,
                     int ldb, float *C, int ldc, bool acc)
{
    __m256i full0, full1;
    col_masks(16, &full0, &full1);
    for (int jb = j0; jb < j1; jb += NT_NC) {
        int je = jb + NT_NC < j1 ? jb + NT_NC : j1;
        for (int i = 0; i < M; i += NT_MR) {
            int mr = M - i < NT_MR ? M - i : NT_MR;
            for (int j = jb; j < je; j += NT_NR) {
                int w = je - j < NT_NR ? je - j : NT_NR;
                __m256i m0 = full0, m1 = full1;
                if (w < NT_NR)
                    col_masks(w, &m0, &m1);
                micro[mr](K, A + i, lda, B + j, ldb, C + (long)i * ldc + j, ldc, acc, m0, m1);
            }
        }
    }
}
#else
/* Portable: the same recurrence, element by element. */
static void run_cols(int M, int j0, int j1, int K, const float *A, int lda, const float *B,
                     int ldb, float *C, int ldc, bool acc)
{
    for (int i = 0; i < M; i++)
        for (int j = j0; j < j1; j++)
            put(C + (long)i * ldc + j, dot1(K, A + i, lda, B + j, ldb), acc);
}
#endif

/* ---------------- the second thread ----------------
 *
 * A big call is cut into column blocks of NT_JB that the caller and one
 * helper thread claim from a shared counter.  If the helper is slow to wake
 * (the machine is busy), the caller simply takes more blocks: it only ever
 * waits for a block the helper has already started. */

#define NT_JB 64

typedef struct {
    int M, N, K, lda, ldb, ldc;
    const float *A, *B;
    float *C;
    bool acc;
    int nblocks;
    volatile AO_t next;  /* next block to claim */
    volatile AO_t done;  /* blocks finished */
    volatile AO_t inside; /* helpers working on it (the job lives on the
                             caller's stack: it must not return before 0) */
} job;

static struct {
    GMutex use;            /* one caller at a time shares the helper */
    GMutex lock;
    GCond cond;
    GThread *th;
    job *volatile j;       /* the current job, or NULL */
    volatile AO_t seq;
} P;
static GOnce pool_once = G_ONCE_INIT;

static void work(job *j)
{
    for (;;) {
        AO_t b = AO_fetch_and_add1(&j->next);
        if (b >= (AO_t)j->nblocks)
            return;
        int j0 = (int)b * NT_JB, j1 = j0 + NT_JB < j->N ? j0 + NT_JB : j->N;
        run_cols(j->M, j0, j1, j->K, j->A, j->lda, j->B, j->ldb, j->C, j->ldc, j->acc);
        AO_fetch_and_add1_release(&j->done);
    }
}

static gpointer helper(gpointer unused)
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
        while (AO_load_acquire(&P.seq) == seen)
            g_cond_wait(&P.cond, &P.lock);
        seen = AO_load_acquire(&P.seq);
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
    if (P.th && (long)M * N * K >= NT_GEMM_SPLIT && N >= 2 * NT_JB && g_mutex_trylock(&P.use)) {
        job j = {M, N, K, lda, ldb, ldc, A, B, C, acc, (N + NT_JB - 1) / NT_JB, 0, 0, 0};
        g_mutex_lock(&P.lock);
        P.j = &j;
        AO_store_release(&P.seq, AO_load(&P.seq) + 1);
        g_cond_signal(&P.cond);
        g_mutex_unlock(&P.lock);
        work(&j);
        /* No new helper may enter once P.j is cleared (it enters under the
         * lock); then wait for blocks still running and for the helper to
         * leave the job. */
        g_mutex_lock(&P.lock);
        P.j = NULL;
        g_mutex_unlock(&P.lock);
        while (AO_load_acquire(&j.done) != (AO_t)j.nblocks || AO_load_acquire(&j.inside)) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        g_mutex_unlock(&P.use);
        return;
    }
    run_cols(M, 0, N, K, A, lda, B, ldb, C, ldc, acc);
}
