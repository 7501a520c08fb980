/* core/arena.c - device memory: the simulated HBM.
 *
 * A capacity-limited caching allocator.  Sizes are rounded to classes (64 B
 * steps up to 4 KiB, then quarter powers of two) and freed blocks are kept
 * in per-class free lists, so a training loop that allocates the same shapes
 * every step reuses its blocks without page faults.  `in_use` counts the
 * rounded bytes of live blocks and is what the capacity limits: going over is
 * a clean NULL (the caller reports NT_ENOMEM), never a crash.  Capacity can
 * also be reserved first and the block taken later (nt__arena_reserve,
 * nt__arena_alloc_reserved): big tensors get their memory only when a kernel
 * first writes them, so a fused-away intermediate never takes a block.
 * Cached blocks are poisoned for AddressSanitizer so a stale pointer is
 * still caught. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define NT_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define NT_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define NT_POISON(p, n) ((void)(p), (void)(n))
#define NT_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define NT_ARENA_ALIGN 64
/* Most bytes kept in free lists; more are returned to the system. */
#define NT_ARENA_CACHE_MAX (UINT64_C(2) << 30)
#define NT_NCLASS 256

/* Blocks up to NT_TL_MAXBYTES also pass through small per-thread caches, so
 * the common alloc/free of a training step takes no lock; in_use stays exact
 * (an atomic), the capacity check is against it. */
#define NT_TL_MAXCLASS 64 /* classes 1..64: up to 4 KiB */
#define NT_TL_KEEP 16

static struct {
    GMutex lock;
    volatile AO_t in_use;
    volatile AO_t backed; /* bytes of blocks handed out (in_use minus bare reservations) */
    volatile AO_t backed_peak, peak; /* statistics, raised by any thread */
    uint64_t capacity, cached;
    GPtrArray *free[NT_NCLASS]; /* cached blocks of each class */
    uint64_t sys_allocs, sys_frees; /* blocks taken from / given back to the system */
    size_t bytes[NT_NCLASS];    /* the size of each class */
    bool ready;
} A;

/* Classes 1..64: 64-byte steps up to 4 KiB; from 65 on, four per power of
 * two: 2^p, 1.25 2^p, 1.5 2^p, 1.75 2^p. */
static int class_of(size_t n, size_t *bytes)
{
    if (n == 0)
        n = 1;
    if (n <= 4096) {
        size_t k = (n + 63) / 64;
        *bytes = k * 64;
        return (int)k;
    }
    int p = 63 - __builtin_clzll((unsigned long long)n);
    size_t base = (size_t)1 << p, q = base / 4;
    size_t k = (n - base + q - 1) / q; /* 0..4 */
    if (k == 4)
        p++, base <<= 1, q <<= 1, k = 0;
    *bytes = base + k * q;
    return 65 + (p - 12) * 4 + (int)k;
}

typedef struct {
    void *blk[NT_TL_MAXCLASS + 1][NT_TL_KEEP];
    int n[NT_TL_MAXCLASS + 1];
} tlcache;

/* A thread's cache is on the heap; a fast pointer to it, and a GPrivate
 * whose destructor gives its blocks back when the thread exits. */
static _Thread_local tlcache *tl_a NT_TLS_HOT;
static void tl_flush(gpointer p);
static GPrivate tl_key = G_PRIVATE_INIT(tl_flush);

/* Moves a cache's blocks to the global free lists (or frees them). */
static void tl_flush(gpointer p)
{
    tlcache *c = p;
    if (!c)
        return;
    if (A.ready) {
        g_mutex_lock(&A.lock);
        for (int ci = 1; ci <= NT_TL_MAXCLASS; ci++) {
            for (int i = 0; i < c->n[ci]; i++) {
                if (!A.free[ci]) {
                    A.bytes[ci] = (size_t)ci * 64;
                    __atomic_store_n(&A.free[ci], g_ptr_array_new(), __ATOMIC_RELEASE);
                }
                g_ptr_array_add(A.free[ci], c->blk[ci][i]);
                A.cached += (size_t)ci * 64;
            }
            c->n[ci] = 0;
        }
        g_mutex_unlock(&A.lock);
    }
    if (tl_a == c)
        tl_a = NULL;
    g_free(c);
}

static tlcache *tl_get(void)
{
    if (!tl_a) {
        tl_a = g_new0(tlcache, 1);
        g_private_set(&tl_key, tl_a);
    }
    return tl_a;
}

static void drop_cache_locked(void)
{
    for (int c = 0; c < NT_NCLASS; c++) {
        GPtrArray *arr = A.free[c];
        if (!arr)
            continue;
        for (guint i = 0; i < arr->len; i++) {
            NT_UNPOISON(arr->pdata[i], A.bytes[c]);
            free(arr->pdata[i]);
        }
        g_ptr_array_set_size(arr, 0);
    }
    A.cached = 0;
}

void nt__arena_init(uint64_t capacity)
{
    g_mutex_init(&A.lock);
    A.capacity = capacity;
    A.in_use = A.peak = A.cached = 0;
    A.backed = A.backed_peak = 0;
    for (int c = 0; c < NT_NCLASS; c++)
        A.free[c] = NULL;
    A.ready = true;
}

void nt__arena_shutdown(void)
{
    if (!A.ready)
        return;
    /* the calling thread's cache; workers flushed theirs when they exited */
    if (tl_a) {
        tl_flush(tl_a);
        g_private_set(&tl_key, NULL);
    }
    g_mutex_lock(&A.lock);
    if (getenv("NT_ARENA_TRACE"))
        fprintf(stderr, "arena: %llu system allocations, %llu returned early, peak %llu B\n",
                (unsigned long long)A.sys_allocs, (unsigned long long)A.sys_frees,
                (unsigned long long)A.peak);
    drop_cache_locked();
    for (int c = 0; c < NT_NCLASS; c++)
        if (A.free[c]) {
            g_ptr_array_unref(A.free[c]);
            A.free[c] = NULL;
        }
    g_mutex_unlock(&A.lock);
    g_mutex_clear(&A.lock);
    A.ready = false;
}

static void raise_peak(volatile AO_t *peak, AO_t now)
{
    AO_t p;
    do {
        p = AO_load(peak);
    } while (now > p && !AO_compare_and_swap(peak, p, now));
}

/* Reserves cls bytes of capacity; false if the device is full. */
static bool reserve(size_t cls)
{
    AO_t old;
    do {
        old = AO_load(&A.in_use);
        if (old + cls > A.capacity)
            return false;
    } while (!AO_compare_and_swap_full(&A.in_use, old, old + cls));
    raise_peak(&A.peak, old + cls);
    return true;
}

static void backed_add(size_t cls)
{
    AO_t now = AO_fetch_and_add(&A.backed, (AO_t)cls) + cls;
    raise_peak(&A.backed_peak, now);
}

/* A block of class ci (cls bytes) from the caches or the system; the
 * capacity was reserved by the caller.  NULL: the host is out of memory. */
static void *take_block(int ci, size_t cls)
{
    if (ci <= NT_TL_MAXCLASS) {
        tlcache *c = tl_get();
        /* An unlocked look (a hint, checked again under the lock). */
        GPtrArray *hint = __atomic_load_n(&A.free[ci], __ATOMIC_ACQUIRE);
        if (!c->n[ci] && hint && __atomic_load_n(&hint->len, __ATOMIC_RELAXED)) {
            /* refill half the cache in one lock: the blocks a worker thread
             * freed come back to the thread that allocates */
            g_mutex_lock(&A.lock);
            GPtrArray *arr = A.free[ci];
            while (arr->len && c->n[ci] < NT_TL_KEEP / 2) {
                c->blk[ci][c->n[ci]++] = g_ptr_array_steal_index_fast(arr, arr->len - 1);
                A.cached -= cls;
            }
            g_mutex_unlock(&A.lock);
        }
        if (c->n[ci]) {
            void *q = c->blk[ci][--c->n[ci]];
            NT_UNPOISON(q, cls);
            if (c->n[ci]) /* the next block's first lines (a storage header) */
                for (size_t off = 0; off < cls && off < 192; off += 64)
                    __builtin_prefetch((const char *)c->blk[ci][c->n[ci] - 1] + off, 1);
            return q;
        }
    }
    void *p = NULL;
    g_mutex_lock(&A.lock);
    GPtrArray *arr = A.free[ci];
    if (arr && arr->len) {
        p = g_ptr_array_steal_index_fast(arr, arr->len - 1);
        A.cached -= cls;
        NT_UNPOISON(p, cls);
    } else {
        p = aligned_alloc(NT_ARENA_ALIGN, cls);
        A.sys_allocs++;
        if (!p && A.cached) { /* the host is short: give the cache back, retry */
            drop_cache_locked();
            p = aligned_alloc(NT_ARENA_ALIGN, cls);
        }
    }
    g_mutex_unlock(&A.lock);
    return p;
}

void *nt__arena_alloc(size_t nbytes)
{
    size_t cls;
    int ci = class_of(nbytes, &cls);
    if (!reserve(cls))
        return NULL;
    void *p = take_block(ci, cls);
    if (!p)
        AO_fetch_and_add(&A.in_use, (AO_t)0 - cls);
    else
        backed_add(cls);
    return p;
}

bool nt__arena_reserve(size_t nbytes)
{
    size_t cls;
    class_of(nbytes, &cls);
    return reserve(cls);
}

void nt__arena_unreserve(size_t nbytes)
{
    size_t cls;
    class_of(nbytes, &cls);
    AO_fetch_and_add(&A.in_use, (AO_t)0 - cls);
}

void *nt__arena_alloc_reserved(size_t nbytes)
{
    size_t cls;
    int ci = class_of(nbytes, &cls);
    void *p = take_block(ci, cls);
    if (p)
        backed_add(cls);
    return p;
}

void nt__arena_free(void *p, size_t nbytes)
{
    if (!p)
        return;
    size_t cls;
    int ci = class_of(nbytes, &cls);
    AO_fetch_and_add(&A.in_use, (AO_t)0 - cls);
    AO_fetch_and_add(&A.backed, (AO_t)0 - cls);
    if (ci <= NT_TL_MAXCLASS) {
        tlcache *c = tl_get();
        if (c->n[ci] == NT_TL_KEEP) {
            /* full: give half back in one lock */
            g_mutex_lock(&A.lock);
            if (!A.free[ci]) {
                A.bytes[ci] = cls;
                __atomic_store_n(&A.free[ci], g_ptr_array_new(), __ATOMIC_RELEASE);
            }
            while (c->n[ci] > NT_TL_KEEP / 2) {
                g_ptr_array_add(A.free[ci], c->blk[ci][--c->n[ci]]);
                A.cached += cls;
            }
            g_mutex_unlock(&A.lock);
        }
        c->blk[ci][c->n[ci]++] = p;
        NT_POISON(p, cls);
        return;
    }
    g_mutex_lock(&A.lock);
    if (A.cached + cls <= NT_ARENA_CACHE_MAX && A.cached + cls + AO_load(&A.in_use) <= A.capacity) {
        GPtrArray *arr = A.free[ci];
        if (!arr) {
            arr = A.free[ci] = g_ptr_array_new();
            A.bytes[ci] = cls;
        }
        g_ptr_array_add(arr, p);
        A.cached += cls;
        NT_POISON(p, cls);
        p = NULL;
    }
    if (p)
        A.sys_frees++;
    g_mutex_unlock(&A.lock);
    free(p);
}

uint64_t nt__arena_in_use(void) { return AO_load(&A.in_use); }
uint64_t nt__arena_backed(void) { return AO_load(&A.backed); }
uint64_t nt__arena_backed_peak(void) { return AO_load(&A.backed_peak); }
uint64_t nt__arena_peak(void) { return AO_load(&A.peak); }
uint64_t nt__arena_capacity(void) { return A.capacity; }

void nt__arena_reset_peak(void)
{
    AO_store(&A.peak, AO_load(&A.in_use));
    AO_store(&A.backed_peak, AO_load(&A.backed));
}
