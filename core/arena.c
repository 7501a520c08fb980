/* core/arena.c - device memory: the simulated HBM.
 *
 * A capacity-limited caching allocator.  Sizes are rounded to classes (64 B
 * steps below 4 KiB, then quarter powers of two) and freed blocks are kept in
 * per-class free lists, so a training loop that allocates the same shapes
 * every step reuses its blocks without page faults.  `in_use` counts the
 * rounded bytes of live blocks and is what the capacity limits: going over is
 * a clean NULL (the caller reports NT_ENOMEM), never a crash.  Cached blocks
 * are poisoned for AddressSanitizer so a stale pointer is still caught. */
#include <stdlib.h>

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

static struct {
    GMutex lock;
    uint64_t capacity, in_use, peak, cached;
    GHashTable *free; /* class size -> GPtrArray of blocks */
    bool ready;
} A;

static size_t size_class(size_t n)
{
    if (n == 0)
        n = 1;
    if (n <= 4096)
        return (n + 63) & ~(size_t)63;
    size_t p = (size_t)1 << (63 - __builtin_clzll((unsigned long long)n));
    if (p == n)
        return n;
    size_t q = p / 4; /* quarter steps: p, 1.25p, 1.5p, 1.75p, 2p */
    return (n + q - 1) / q * q;
}

static void drop_cache_locked(void)
{
    GHashTableIter it;
    gpointer key, val;
    g_hash_table_iter_init(&it, A.free);
    while (g_hash_table_iter_next(&it, &key, &val)) {
        GPtrArray *arr = val;
        for (guint i = 0; i < arr->len; i++) {
            NT_UNPOISON(arr->pdata[i], GPOINTER_TO_SIZE(key));
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
    A.free = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL,
                                   (GDestroyNotify)g_ptr_array_unref);
    A.ready = true;
}

void nt__arena_shutdown(void)
{
    if (!A.ready)
        return;
    g_mutex_lock(&A.lock);
    drop_cache_locked();
    g_hash_table_destroy(A.free);
    A.free = NULL;
    g_mutex_unlock(&A.lock);
    g_mutex_clear(&A.lock);
    A.ready = false;
}

void *nt__arena_alloc(size_t nbytes)
{
    size_t cls = size_class(nbytes);
    void *p = NULL;
    g_mutex_lock(&A.lock);
    if (A.in_use + cls > A.capacity) {
        g_mutex_unlock(&A.lock);
        return NULL;
    }
    GPtrArray *arr = g_hash_table_lookup(A.free, GSIZE_TO_POINTER(cls));
    if (arr && arr->len) {
        p = g_ptr_array_steal_index_fast(arr, arr->len - 1);
        A.cached -= cls;
        NT_UNPOISON(p, cls);
    } else {
        p = aligned_alloc(NT_ARENA_ALIGN, cls);
        if (!p && A.cached) { /* the host is short: give the cache back, retry */
            drop_cache_locked();
            p = aligned_alloc(NT_ARENA_ALIGN, cls);
        }
        if (!p) {
            g_mutex_unlock(&A.lock);
            return NULL;
        }
    }
    A.in_use += cls;
    if (A.in_use > A.peak)
        A.peak = A.in_use;
    g_mutex_unlock(&A.lock);
    return p;
}

void nt__arena_free(void *p, size_t nbytes)
{
    if (!p)
        return;
    size_t cls = size_class(nbytes);
    g_mutex_lock(&A.lock);
    A.in_use -= cls;
    if (A.cached + cls <= NT_ARENA_CACHE_MAX && A.cached + cls + A.in_use <= A.capacity) {
        GPtrArray *arr = g_hash_table_lookup(A.free, GSIZE_TO_POINTER(cls));
        if (!arr) {
            arr = g_ptr_array_new();
            g_hash_table_insert(A.free, GSIZE_TO_POINTER(cls), arr);
        }
        g_ptr_array_add(arr, p);
        A.cached += cls;
        NT_POISON(p, cls);
        p = NULL;
    }
    g_mutex_unlock(&A.lock);
    free(p);
}

uint64_t nt__arena_in_use(void) { return A.in_use; }
uint64_t nt__arena_peak(void) { return A.peak; }
uint64_t nt__arena_capacity(void) { return A.capacity; }

void nt__arena_reset_peak(void)
{
    g_mutex_lock(&A.lock);
    A.peak = A.in_use;
    g_mutex_unlock(&A.lock);
}
