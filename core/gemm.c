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
 * in L2, and a second thread taking half the column blocks of big calls.
 * nt__gemm (the whole product) packs both operands once and keeps each
 * block of C in cache across all its K-tiles. */
#include "gemm.h"

#include <glib.h>
#include <math.h>
#include <string.h>

#include <atomic_ops.h>
#include "tsan.h"

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
/* Packed operands.  A micro-kernel reads an A panel [K][6] and a B panel
 * [K][16], both contiguous: B rows of a strided matrix sit ldb floats apart
 * (often a multiple of 4 KiB), and 128 of them would all land in one L1 set.
 * Panels are zero-padded to full width; the padding's lanes compute zeros
 * that are never stored, and no lane affects another. */

/* c[0..6)[0..16) = A^T . B for one pair of panels, stored to C's first mr
 * rows and w columns (acc: added to C). */
static void micro(int K, const float *Ap, const float *Bp, float *C, int ldc, int mr, int w,
                  bool acc)
{
    /* twelve named accumulators: an array here would be spilled to the
     * stack after every fma (GCC keeps address-taken arrays in memory) */
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < K; k++) {
        const float *a = Ap + k * NT_MR, *b = Bp + k * NT_NR;
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
    __m256 c[NT_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (mr == NT_MR && w == NT_NR) {
        for (int r = 0; r < NT_MR; r++) {
            float *p = C + (long)r * ldc;
            __m256 v0 = c[r][0], v1 = c[r][1];
            if (acc) {
                v0 = _mm256_add_ps(_mm256_loadu_ps(p), v0);
                v1 = _mm256_add_ps(_mm256_loadu_ps(p + 8), v1);
            }
            _mm256_storeu_ps(p, v0);
            _mm256_storeu_ps(p + 8, v1);
        }
        return;
    }
    float t[NT_MR][NT_NR] __attribute__((aligned(32)));
    for (int r = 0; r < NT_MR; r++) {
        _mm256_store_ps(t[r], c[r][0]);
        _mm256_store_ps(t[r] + 8, c[r][1]);
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < w; j++)
            put(C + (long)r * ldc + j, t[r][j], acc);
}

/* Panels of A^T: for each MR rows i, [K][MR] floats. */
static void pack_a(float *dst, int M, int K, const float *A, int lda)
{
    for (int i = 0; i < M; i += NT_MR) {
        int mr = M - i < NT_MR ? M - i : NT_MR;
        float *d = dst + (long)(i / NT_MR) * K * NT_MR;
        for (int k = 0; k < K; k++) {
            const float *a = A + (long)k * lda + i;
            int r = 0;
            for (; r < mr; r++)
                d[k * NT_MR + r] = a[r];
            for (; r < NT_MR; r++)
                d[k * NT_MR + r] = 0.0f;
        }
    }
}

/* Panels of B's columns [j0, j1): for each NR columns, [K][NR] floats. */
static void pack_b(float *dst, int j0, int j1, int K, const float *B, int ldb)
{
    for (int j = j0; j < j1; j += NT_NR) {
        int w = j1 - j < NT_NR ? j1 - j : NT_NR;
        float *d = dst + (long)((j - j0) / NT_NR) * K * NT_NR;
        for (int k = 0; k < K; k++) {
            const float *b = B + (long)k * ldb + j;
            if (w == NT_NR) {
                memcpy(d + k * NT_NR, b, NT_NR * sizeof(float));
            } else {
                int q = 0;
                for (; q < w; q++)
                    d[k * NT_NR + q] = b[q];
                for (; q < NT_NR; q++)
                    d[k * NT_NR + q] = 0.0f;
            }
        }
    }
}

/* Per-thread panel buffers, grown as needed and kept. */
typedef struct {
    float *p;
    size_t n;
} pbuf;
static void pbuf_free(gpointer p)
{
    if (p) {
        free(((pbuf *)p)->p);
        g_free(p);
    }
}
static GPrivate bpanel_key = G_PRIVATE_INIT(pbuf_free);

static float *panel(GPrivate *key, size_t n)
{
    pbuf *b = g_private_get(key);
    if (!b) {
        b = g_new0(pbuf, 1);
        g_private_set(key, b);
    }
    if (b->n < n) {
        free(b->p);
        b->p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        b->n = b->p ? n : 0;
    }
    return b->p;
}

/* Columns [j0, j1) with A already packed (Ap). */
static int run_cols_packed(int M, int j0, int j1, int K, const float *Ap, const float *B, int ldb,
                           float *C, int ldc, bool acc)
{
    float *Bp = panel(&bpanel_key, (size_t)K * NT_NC);
    if (!Bp)
        return -1;
    for (int jb = j0; jb < j1; jb += NT_NC) {
        int je = jb + NT_NC < j1 ? jb + NT_NC : j1;
        pack_b(Bp, jb, je, K, B, ldb);
        for (int i = 0; i < M; i += NT_MR) {
            int mr = M - i < NT_MR ? M - i : NT_MR;
            const float *a = Ap + (long)(i / NT_MR) * K * NT_MR;
            for (int j = jb; j < je; j += NT_NR) {
                int w = je - j < NT_NR ? je - j : NT_NR;
                micro(K, a, Bp + (long)((j - jb) / NT_NR) * K * NT_NR,
                      C + (long)i * ldc + j, ldc, mr, w, acc);
            }
        }
    }
    return 0;
}
#endif

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
    const float *A, *B; /* A: packed panels when vectorised (ktile jobs) */
    float *C;
    bool acc;
    int nbn;             /* full jobs: blocks per row of C blocks */
    int nblocks;
    volatile AO_t next;  /* next block to claim */
    volatile AO_t done;  /* blocks finished */
    volatile AO_t inside; /* helpers working on it (the job lives on the
                             caller's stack: it must not return before 0) */
    void (*gfn)(void *arg, int b); /* nt__par_blocks jobs */
    void *garg;
};

static struct {
    GMutex use;            /* one caller at a time shares the helper */
    GMutex lock;
    GCond cond;
    GThread *th;
    job *volatile j;       /* the current job, or NULL */
    volatile AO_t seq;
    bool quit;             /* under lock: nt__gemm_shutdown */
} P;
static GMutex pool_lock;           /* starting and stopping the helper */
static volatile AO_t pool_started; /* P is set up (release: read with acquire) */

/* Columns [j0, j1): packed when vectorised (A given as panels). */
static void run(int M, int j0, int j1, int K, const float *A, int lda, const float *B, int ldb,
                float *C, int ldc, bool acc)
{
#if NT_VEC
    if (run_cols_packed(M, j0, j1, K, A, B, ldb, C, ldc, acc) == 0)
        return;
    /* no memory for a B panel: element by element from A's panels (same
     * recurrence, same bits) */
    for (int i = 0; i < M; i++) {
        const float *a = A + (long)(i / NT_MR) * K * NT_MR + i % NT_MR;
        for (int j = j0; j < j1; j++)
            put(C + (long)i * ldc + j, dot1(K, a, NT_MR, B + j, ldb), acc);
    }
    (void)lda;
#else
    run_cols_plain(M, j0, j1, K, A, lda, B, ldb, C, ldc, acc);
#endif
}

/* A ktile job's block b: columns [b * NT_JB, ...). */
static void ktile_block(const job *j, int b)
{
    int j0 = b * NT_JB, j1 = j0 + NT_JB < j->N ? j0 + NT_JB : j->N;
    run(j->M, j0, j1, j->K, j->A, j->lda, j->B, j->ldb, j->C, j->ldc, j->acc);
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
    if (P.th && split && j->nblocks >= 2 && g_mutex_trylock(&P.use)) {
        g_mutex_lock(&P.lock);
        P.j = j;
        AO_store_release(&P.seq, AO_load(&P.seq) + 1);
        g_cond_signal(&P.cond);
        g_mutex_unlock(&P.lock);
        work(j);
        /* No new helper may enter once P.j is cleared (it enters under the
         * lock); then wait for blocks still running and for the helper to
         * leave the job. */
        g_mutex_lock(&P.lock);
        P.j = NULL;
        g_mutex_unlock(&P.lock);
        while (AO_load_acquire(&j->done) != (AO_t)j->nblocks || AO_load_acquire(&j->inside)) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        g_mutex_unlock(&P.use);
        return;
    }
    work(j);
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
        P.j = NULL;
        if (g_get_num_processors() > 1)
            P.th = g_thread_new("nt-gemm", helper, NULL);
        AO_store_release(&pool_started, 1);
    }
    g_mutex_unlock(&pool_lock);
}

void nt__gemm_shutdown(void)
{
    g_mutex_lock(&pool_lock);
    if (AO_load(&pool_started)) {
        if (P.th) {
            g_mutex_lock(&P.use); /* no job is using the helper */
            g_mutex_lock(&P.lock);
            P.quit = true;
            AO_store_release(&P.seq, AO_load(&P.seq) + 1);
            g_cond_signal(&P.cond);
            g_mutex_unlock(&P.lock);
            g_thread_join(P.th);
            P.th = NULL;
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
    pool_start();
#if NT_VEC
    static GPrivate apanel_key = G_PRIVATE_INIT(pbuf_free);
    float *Ap = panel(&apanel_key, (size_t)K * (size_t)((M + NT_MR - 1) / NT_MR * NT_MR));
    if (!Ap) { /* host memory short: element by element, same bits */
        run_cols_plain(M, 0, N, K, A, lda, B, ldb, C, ldc, acc);
        return;
    }
    pack_a(Ap, M, K, A, lda);
    const float *Ause = Ap;
#else
    const float *Ause = A;
#endif
    job j = {ktile_block, M, N, K, lda, ldb, ldc, Ause, B, C, acc, 0, (N + NT_JB - 1) / NT_JB,
             0, 0, 0};
    run_job(&j, (long)M * N * K >= NT_GEMM_SPLIT && N >= 2 * NT_JB);
}

/* ---------------- the whole product ----------------
 *
 * Both operands are packed once, every K-tile (in parallel: one block per
 * tile), then C is cut into blocks of NT_MC x NT_NCB; each block runs every
 * K-tile in ascending order before the next block starts, so it stays in L2
 * while it accumulates instead of streaming through memory once per K-tile.
 * Each element still follows the recurrence of gemm.h exactly. */

#define NT_MC 96   /* rows per C block (a multiple of NT_MR) */
#define NT_NCB 256 /* columns per C block (a multiple of NT_NR) */

#if NT_VEC
typedef struct full {
    job j;
    float *Ap, *Bp; /* K-tile kt's panels start at Mpad * k0 and Npad * k0 */
    int Mpad, Npad, nk;
} full;

/* Pack job: block b < nk packs A's K-tile b, else B's K-tile b - nk. */
static void pack_block(const job *jb, int b)
{
    const full *f = (const full *)jb;
    int kt = b < f->nk ? b : b - f->nk, k0 = kt * NT_GEMM_KTILE;
    int kw = jb->K - k0 < NT_GEMM_KTILE ? jb->K - k0 : NT_GEMM_KTILE;
    if (b < f->nk)
        pack_a(f->Ap + (long)f->Mpad * k0, jb->M, kw, jb->A + (long)k0 * jb->lda, jb->lda);
    else
        pack_b(f->Bp + (long)f->Npad * k0, 0, jb->N, kw, jb->B + (long)k0 * jb->ldb, jb->ldb);
}

static void full_block(const job *jb, int b)
{
    const full *f = (const full *)jb;
    int bi = b / jb->nbn, bj = b % jb->nbn;
    int i0 = bi * NT_MC, i1 = i0 + NT_MC < jb->M ? i0 + NT_MC : jb->M;
    int j0 = bj * NT_NCB, j1 = j0 + NT_NCB < jb->N ? j0 + NT_NCB : jb->N;
    for (int k0 = 0; k0 < jb->K; k0 += NT_GEMM_KTILE) {
        int kw = jb->K - k0 < NT_GEMM_KTILE ? jb->K - k0 : NT_GEMM_KTILE;
        const float *Ak = f->Ap + (long)f->Mpad * k0, *Bk = f->Bp + (long)f->Npad * k0;
        for (int i = i0; i < i1; i += NT_MR) {
            int mr = i1 - i < NT_MR ? i1 - i : NT_MR;
            const float *a = Ak + (long)(i / NT_MR) * kw * NT_MR;
            for (int c = j0; c < j1; c += NT_NR) {
                int w = j1 - c < NT_NR ? j1 - c : NT_NR;
                micro(kw, a, Bk + (long)(c / NT_NR) * kw * NT_NR, jb->C + (long)i * jb->ldc + c,
                      jb->ldc, mr, w, k0 > 0);
            }
        }
    }
}
#endif

void nt__gemm(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
              int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            memset(C + (long)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    pool_start();
#if NT_VEC
    static GPrivate fa_key = G_PRIVATE_INIT(pbuf_free), fb_key = G_PRIVATE_INIT(pbuf_free);
    int Mpad = (M + NT_MR - 1) / NT_MR * NT_MR, Npad = (N + NT_NR - 1) / NT_NR * NT_NR;
    float *Ap = panel(&fa_key, (size_t)Mpad * (size_t)K);
    float *Bp = Ap ? panel(&fb_key, (size_t)Npad * (size_t)K) : NULL;
    if (Ap && Bp) {
        bool split = (long)M * N * K >= NT_GEMM_SPLIT;
        int nk = (K + NT_GEMM_KTILE - 1) / NT_GEMM_KTILE;
        full f = {{pack_block, M, N, K, lda, ldb, ldc, A, B, C, false, 0, 2 * nk, 0, 0, 0},
                  Ap, Bp, Mpad, Npad, nk};
        run_job(&f.j, split);
        int nbm = (M + NT_MC - 1) / NT_MC, nbn = (N + NT_NCB - 1) / NT_NCB;
        full g = {{full_block, M, N, K, lda, ldb, ldc, A, B, C, false, nbn, nbm * nbn, 0, 0, 0},
                  Ap, Bp, Mpad, Npad, nk};
        run_job(&g.j, split);
        return;
    }
#endif
    /* portable, or host memory short for the panels: K-tile by K-tile */
    for (int k0 = 0; k0 < K; k0 += NT_GEMM_KTILE) {
        int kw = K - k0 < NT_GEMM_KTILE ? K - k0 : NT_GEMM_KTILE;
        nt__gemm_ktile(M, N, kw, A + (long)k0 * lda, lda, B + (long)k0 * ldb, ldb, C, ldc, k0 > 0);
    }
}
