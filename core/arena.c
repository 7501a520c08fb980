/* core/arena.c - device memory: the simulated HBM.
 *
 * A capacity-limited caching allocator.  Sizes are rounded to classes (64 B
 * steps up to 4 KiB, then quarter powers of two) and freed blocks are kept
 * in per-class free lists, so a training loop that allocates the same shapes
 * every step reuses its blocks without page faults.  `in_use` counts the
 * rounded bytes of reserved blocks and is what the capacity limits: going
 * over waits for queued work, then is a clean NULL (the caller reports
 * NT_ENOMEM), never a crash.  Capacity can
 * also be reserved first and the block taken later (nt__arena_reserve,
 * nt__arena_alloc_reserved): big tensors get their memory only when a kernel
 * first writes them, so a fused-away intermediate never takes a block.
 * Cached blocks are poisoned for AddressSanitizer so a stale pointer is
 * still caught.
 *
 * Stream-ordered reuse.  A storage whose last user-visible handle is
 * released while queued ops still read it is "waiting": its block goes back
 * only when the worker has run them.  If all its uses are on one stream, its
 * capacity is credited at once to that stream's pool (nt__arena_pend): a
 * later allocation for an op of the same stream draws from it, because that
 * op runs after every queued reader of the old block (streams run in order)
 * and takes its own block only then.  Use on another stream leaves the bytes
 * reserved until the worker frees them (as PyTorch's record_stream does).
 * So the capacity counts
 *     in_use = live + pooled + waiting_nc
 * (live: storages some handle can still reach; pooled: credit not yet drawn;
 * waiting_nc: waiting storages not credited to a pool).  An allocation that
 * does not fit first waits for queued work (nt__arena_progress, set by
 * streams/) and fails only when live storage alone leaves no room.  A
 * kernel's workspace (nt__arena_alloc_scratch) may also use capacity that is
 * reserved but not yet backed: it is given back when the kernel ends, before
 * the stream's later ops take the blocks they reserved (another stream's
 * worker may take one meanwhile: then the blocks briefly exceed the
 * capacity, which the simulator's host memory absorbs).
 *
 * Devices.  Each device (NT_SIM_CORES) has its own capacity, NT_HBM_BYTES,
 * and its own counts (dev_acct): every function takes or knows the device
 * its bytes belong to -- a storage's (nt__storage.dev), or nt__alloc_dev
 * for a new one.  A stream's pool lends only to allocations on the device
 * whose bytes it holds.  The block caches are shared: host memory is one.
 * The statistics (nt__arena_in_use ...) add up every device. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/internal.h"

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

/* Set when the last failed allocation of this thread failed for want of
 * host memory, cleared when one fails for want of device capacity
 * (nt__arena_host_failed): both are set where the allocation fails, so the
 * path that succeeds touches neither. */
static _Thread_local bool tl_host_failed;

/* One device's counts, on a line of its own (the host reserves, a worker
 * frees and takes blocks: one line moves between them per op, not two, and
 * devices do not share lines). */
typedef struct dev_acct {
    _Alignas(64) volatile AO_t in_use;
    volatile AO_t peak;       /* statistics, raised by any thread */
    volatile AO_t pooled;     /* credit of waiting storages not drawn (its streams' pools) */
    volatile AO_t waiting_nc; /* bytes of waiting storages not credited (used on
                                 several streams, or small: see nt__arena_pend) */
    volatile AO_t live_peak;
    volatile AO_t backed; /* bytes of blocks handed out (in_use minus bare reservations) */
    volatile AO_t backed_peak; /* statistics, raised by any thread */
    volatile AO_t waiting_c;  /* bytes of waiting storages credited to a pool */
} dev_acct;

static struct {
    uint64_t capacity;        /* per device (NT_HBM_BYTES) */
    int ndev;
    dev_acct d[NT_MAX_DEVICES];
    _Alignas(64) GMutex lock;
    volatile AO_t alloc_waits, alloc_wait_ns;
    uint64_t max_waiting;     /* NT_MAX_INFLIGHT_BYTES: back-pressure on waiting bytes */
    uint64_t *pool;           /* per stream id: credit, under lock */
    uint64_t *pool_w;         /* per stream id: bytes of the waiting storages credited
                                 to its pool and not yet freed (pool <= pool_w) */
    uint8_t *pool_dev;        /* per stream id: the device its credit belongs to */
    uint32_t npool;
    uint64_t cached;
    nt__ptrvec *free[NT_NCLASS]; /* cached blocks of each class */
    uint64_t sys_allocs, sys_frees; /* blocks taken from / given back to the system */
    size_t bytes[NT_NCLASS];    /* the size of each class */
    bool ready;
} A;

/* Device dev's counts (a device out of range is device 0's: the callers
 * pass a storage's device or nt__alloc_dev, both checked where they are
 * set). */
static inline dev_acct *dev_of(int dev)
{
    return &A.d[dev >= 0 && dev < A.ndev ? dev : 0];
}

/* The sum of one count over every device. */
#define SUM_DEV(field)                                                        \
    __extension__({                                                           \
        uint64_t s_ = 0;                                                      \
        for (int d_ = 0; d_ < A.ndev; d_++)                                   \
            s_ += AO_load(&A.d[d_].field);                                    \
        s_;                                                                   \
    })

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

/* A thread's cache is on the heap; a fast pointer to it, and a thread key
 * whose destructor gives its blocks back when the thread exits. */
static _Thread_local tlcache *tl_a NT_TLS_HOT;
static void tl_flush(void *p);
static nt__tlkey tl_key = NT__TLKEY_INIT(tl_flush);

/* Moves a cache's blocks to the global free lists (or frees them). */
static void tl_flush(void *p)
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
                    __atomic_store_n(&A.free[ci], nt__ptrvec_new(0), __ATOMIC_RELEASE);
                }
                if (!A.free[ci] || !nt__ptrvec_add(A.free[ci], c->blk[ci][i])) {
                    NT_UNPOISON(c->blk[ci][i], (size_t)ci * 64);
                    free(c->blk[ci][i]); /* no room to keep it: back to the system */
                    continue;
                }
                A.cached += (size_t)ci * 64;
            }
            c->n[ci] = 0;
        }
        g_mutex_unlock(&A.lock);
    }
    if (tl_a == c)
        tl_a = NULL;
    free(c);
}

static tlcache *tl_get(void)
{
    if (!tl_a) {
        tl_a = calloc(1, sizeof *tl_a);
        if (tl_a && !nt__tlkey_set(&tl_key, tl_a)) { /* no slot: nobody would flush it */
            free(tl_a);
            tl_a = NULL;
        } /* without one the caller goes without a cache */
    }
    return tl_a;
}

static void drop_cache_locked(void)
{
    for (int c = 0; c < NT_NCLASS; c++) {
        nt__ptrvec *arr = A.free[c];
        if (!arr)
            continue;
        for (guint i = 0; i < arr->len; i++) {
            NT_UNPOISON(arr->pdata[i], A.bytes[c]);
            free(arr->pdata[i]);
        }
        arr->len = 0;
    }
    A.cached = 0;
}

void nt__arena_init(uint64_t capacity, uint64_t max_waiting, int ndev)
{
    g_mutex_init(&A.lock);
    /* Made here, not at a worker's first free (a thread cache goes
     * without a key if the system refuses one: the blocks then go
     * straight back to the lists). */
    (void)nt__tlkey_make(&tl_key);
    A.capacity = capacity;
    A.ndev = ndev >= 1 && ndev <= NT_MAX_DEVICES ? ndev : 1;
    memset(A.d, 0, sizeof A.d);
    A.cached = 0;
    A.alloc_waits = A.alloc_wait_ns = 0;
    A.max_waiting = max_waiting ? max_waiting : capacity / 2;
    A.pool = NULL;
    A.pool_w = NULL;
    A.pool_dev = NULL;
    A.npool = 0;
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
        (void)nt__tlkey_set(&tl_key, NULL);
    }
    g_mutex_lock(&A.lock);
    if (getenv("NT_ARENA_TRACE"))
        fprintf(stderr, "arena: %llu system allocations, %llu returned early, peak %llu B\n",
                (unsigned long long)A.sys_allocs, (unsigned long long)A.sys_frees,
                (unsigned long long)nt__arena_peak());
    drop_cache_locked();
    for (int c = 0; c < NT_NCLASS; c++)
        if (A.free[c]) {
            nt__ptrvec_free(A.free[c]);
            A.free[c] = NULL;
        }
    g_free(A.pool);
    g_free(A.pool_w);
    g_free(A.pool_dev);
    A.pool = NULL;
    A.pool_w = NULL;
    A.pool_dev = NULL;
    A.npool = 0;
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

/* Statistics, raised by any thread: device a's in_use is now `now`. */
static void note_peaks(dev_acct *a, uint64_t now)
{
    raise_peak(&a->peak, now);
    uint64_t hold = AO_load(&a->pooled) + AO_load(&a->waiting_nc);
    raise_peak(&a->live_peak, now > hold ? now - hold : 0);
}

/* Reserves cls bytes of device a's capacity; false if the device is full. */
static bool reserve(dev_acct *a, size_t cls)
{
    AO_t old;
    do {
        old = AO_load(&a->in_use);
        if (old + cls > A.capacity)
            return false;
    } while (!AO_compare_and_swap_full(&a->in_use, old, old + cls));
    note_peaks(a, old + cls);
    return true;
}

/* ---------------- stream-ordered reuse ---------------- */

_Thread_local uint32_t nt__alloc_sid NT_TLS_HOT;
_Thread_local uint8_t nt__alloc_dev NT_TLS_HOT; /* core/internal.h */
bool (*nt__arena_progress)(bool all);

void nt__arena_set_max_waiting(uint64_t bytes)
{
    A.max_waiting = bytes ? bytes : A.capacity / 2;
}

/* Stream sid's pool slot, grown on demand.  A.lock held. */
static uint64_t *pool_slot(uint32_t sid)
{
    if (sid >= A.npool) {
        uint32_t n = A.npool ? A.npool : 16;
        while (n <= sid)
            n *= 2;
        uint64_t *p = g_try_realloc(A.pool, sizeof *p * n);
        if (!p)
            return NULL;
        A.pool = p;
        uint64_t *pw = g_try_realloc(A.pool_w, sizeof *pw * n);
        if (!pw)
            return NULL; /* A.pool grew; npool did not: the next call retries */
        A.pool_w = pw;
        uint8_t *pd = g_try_realloc(A.pool_dev, n);
        if (!pd)
            return NULL;
        A.pool_dev = pd;
        memset(p + A.npool, 0, sizeof *p * (n - A.npool));
        memset(pw + A.npool, 0, sizeof *pw * (n - A.npool));
        memset(pd + A.npool, 0, n - A.npool);
        A.npool = n;
    }
    return &A.pool[sid];
}

/* Reserves cls bytes on device dev for an op of stream sid, taking what its
 * pool holds for that device first; false if even that does not fit. */
static bool reserve_on(uint32_t sid, int dev, size_t cls)
{
    dev_acct *a = dev_of(dev);
    if (!sid || !AO_load(&a->pooled))
        return reserve(a, cls);
    g_mutex_lock(&A.lock);
    uint64_t d = 0; /* what the pool lends */
    if (sid < A.npool && A.pool_dev[sid] == (uint8_t)(a - A.d))
        d = A.pool[sid] < cls ? A.pool[sid] : cls;
    bool ok = reserve(a, cls - d);
    if (ok && d) {
        A.pool[sid] -= d;
        AO_fetch_and_add(&a->pooled, (AO_t)0 - d);
        note_peaks(a, AO_load(&a->in_use));
    }
    g_mutex_unlock(&A.lock);
    return ok;
}

uint32_t nt__arena_pend(uint32_t sid, size_t nbytes, int dev)
{
    size_t cls;
    class_of(nbytes, &cls);
    dev_acct *a = dev_of(dev);
    if (!sid) { /* no lock: a small tensor's release stays cheap */
        AO_fetch_and_add(&a->waiting_nc, (AO_t)cls);
        return 0;
    }
    g_mutex_lock(&A.lock);
    uint64_t *slot = pool_slot(sid);
    /* a pool holds one device's bytes (its stream's, in practice): a credit
     * of another device waits uncredited */
    if (slot && A.pool_w[sid] && A.pool_dev[sid] != (uint8_t)(a - A.d))
        slot = NULL;
    if (slot) {
        A.pool_dev[sid] = (uint8_t)(a - A.d);
        *slot += cls;
        A.pool_w[sid] += cls;
        AO_fetch_and_add(&a->pooled, (AO_t)cls);
        AO_fetch_and_add(&a->waiting_c, (AO_t)cls);
    } else {
        AO_fetch_and_add(&a->waiting_nc, (AO_t)cls);
        sid = 0;
    }
    g_mutex_unlock(&A.lock);
    return sid;
}

/* A waiting storage's block went back.  A pool's credit is one sum, not
 * this storage's own: what is left in it may be that of a storage released
 * after the draws, whose block is still held or still to come.  So the
 * pool keeps at most the bytes of the storages still waiting in it
 * (pool_w); the rest of its credit leaves the count, and what was drawn
 * stays reserved for its new owners.  (Taking this storage's size from the
 * pool instead took a still-waiting storage's bytes out of the count while
 * its block stayed: char_gpt held blocks 11 MiB above its reserved bytes.)
 * A credit that found no pool slot was counted as not credited: pool_slot
 * fails only when the host is out of memory, and then sid's slot does not
 * exist, which unpend checks. */
static void unpend(uint32_t sid, size_t cls, dev_acct *a)
{
    g_mutex_lock(&A.lock);
    uint64_t *slot = sid < A.npool ? &A.pool[sid] : NULL;
    if (!slot) {
        g_mutex_unlock(&A.lock);
        AO_fetch_and_add(&a->waiting_nc, (AO_t)0 - cls);
        AO_fetch_and_add(&a->in_use, (AO_t)0 - cls);
        return;
    }
    AO_fetch_and_add(&a->waiting_c, (AO_t)0 - cls);
    /* pool_w counts this storage: the pool holds this device's credit
     * (nt__arena_pend switches a pool's device only when pool_w is 0) */
    A.pool_w[sid] -= A.pool_w[sid] < cls ? A.pool_w[sid] : cls;
    uint64_t d = *slot > A.pool_w[sid] ? *slot - A.pool_w[sid] : 0;
    if (d) {
        *slot -= d;
        AO_fetch_and_add(&a->pooled, (AO_t)0 - d);
        AO_fetch_and_add(&a->in_use, (AO_t)0 - d);
    }
    g_mutex_unlock(&A.lock);
}

/* Device a's live bytes: what no queued work will give back. */
static uint64_t live_of(dev_acct *a)
{
    uint64_t u = AO_load(&a->in_use), hold = AO_load(&a->pooled) + AO_load(&a->waiting_nc);
    return u > hold ? u - hold : 0;
}

uint64_t nt__arena_live(void)
{
    uint64_t s = 0;
    for (int d = 0; d < A.ndev; d++)
        s += live_of(&A.d[d]);
    return s;
}

static _Thread_local int tl_nomem; /* why the thread's last reservation failed */

/* The slow path of a reservation: back-pressure on waiting bytes, then
 * waiting for queued work while that can free enough.  Fails when live
 * storage alone leaves no room for cls, or when the queues are empty and it
 * still does not fit. */
static bool reserve_wait(uint32_t sid, int dev, size_t cls)
{
    dev_acct *a = dev_of(dev);
    tl_nomem = 0;
    tl_host_failed = false; /* if this fails, it is for want of capacity */
    if (cls > A.capacity) {
        tl_nomem = 1;
        return false;
    }
    if (reserve_on(sid, dev, cls))
        return true;
    if (!nt__arena_progress) {
        tl_nomem = 2;
        return false;
    }
    uint64_t t0 = nt__now_ns();
    bool ok = false;
    /* Each round runs every stream's queued work to its end; other threads
     * may queue more meanwhile, so a few rounds, then a clear failure. */
    for (int round = 0; round < 64 && !ok; round++) {
        if (live_of(a) + cls > A.capacity)
            break;
        uint64_t before = AO_load(&a->in_use);
        if (round == 0)
            AO_fetch_and_add1(&A.alloc_waits);
        if (!nt__arena_progress(true))
            break; /* a worker cannot wait for its own stream */
        ok = reserve_on(sid, dev, cls);
        if (!ok && AO_load(&a->waiting_c) + AO_load(&a->waiting_nc) == 0 &&
            AO_load(&a->in_use) >= before)
            break; /* nothing left to wait for */
    }
    AO_fetch_and_add(&A.alloc_wait_ns, (AO_t)(nt__now_ns() - t0));
    if (!ok)
        tl_nomem = 2;
    return ok;
}

/* Back-pressure by bytes: a host whose released storage still waiting for
 * its queued readers exceeds max_waiting lets the workers catch up. */
static void waiting_backpressure(void)
{
    /* (max_waiting is a device's share: the bound grows with the devices) */
    if (nt__arena_waiting() <= A.max_waiting * (uint64_t)A.ndev || !nt__arena_progress)
        return;
    uint64_t t0 = nt__now_ns();
    if (nt__arena_progress(false))
        AO_fetch_and_add1(&A.alloc_waits);
    AO_fetch_and_add(&A.alloc_wait_ns, (AO_t)(nt__now_ns() - t0));
}

bool nt__arena_too_big(void) { return tl_nomem == 1; }

static void backed_add(dev_acct *a, size_t cls)
{
    AO_t now = AO_fetch_and_add(&a->backed, (AO_t)cls) + cls;
    raise_peak(&a->backed_peak, now);
}

/* Blocks of this many bytes or more start on a 2 MiB boundary and are
 * advised onto huge pages. */
#define NT_ARENA_HUGE_MIN ((size_t)2 << 20)

/* A new block from the system.  A big one is advised onto huge pages: its
 * first writes then take one page fault per 2 MiB instead of one per 4 KiB.
 * On this project's VM a fault costs several microseconds, and a captured
 * program's memory plan (one block of 73 MiB for the character GPT) took
 * 18,700 of them in its first replay.  The advice may be refused (then the
 * block is on 4 KiB pages, as before); the bytes are the same either way. */
static void *sys_block(size_t cls)
{
#ifdef MADV_HUGEPAGE
    if (cls >= NT_ARENA_HUGE_MIN) {
        void *p = NULL;
        if (posix_memalign(&p, NT_ARENA_HUGE_MIN, cls) != 0)
            return NULL;
        (void)madvise(p, cls, MADV_HUGEPAGE);
        return p;
    }
#endif
    return aligned_alloc(NT_ARENA_ALIGN, cls);
}

/* A block of class ci (cls bytes) from the caches or the system; the
 * capacity was reserved by the caller.  NULL: the host is out of memory. */
static void *take_block(int ci, size_t cls)
{
    if (ci <= NT_TL_MAXCLASS) {
        tlcache *c = tl_get();
        if (c && !c->n[ci]) {
            /* refill half the cache in one lock: the blocks a worker thread
             * freed come back to the thread that allocates.  (No unlocked
             * look at the list first: the lists change under the lock
             * only, and an empty one takes the lock below anyway.) */
            g_mutex_lock(&A.lock);
            nt__ptrvec *arr = A.free[ci];
            while (arr && arr->len && c->n[ci] < NT_TL_KEEP / 2) {
                c->blk[ci][c->n[ci]++] = arr->pdata[--arr->len];
                A.cached -= cls;
            }
            g_mutex_unlock(&A.lock);
        }
        if (c && c->n[ci]) {
            void *q = c->blk[ci][--c->n[ci]];
            NT_UNPOISON(q, cls);
            if (c->n[ci]) { /* the next block's first lines (a storage header) */
                const char *nx = c->blk[ci][c->n[ci] - 1];
                __builtin_prefetch(nx, 1);
                if (cls > 64)
                    __builtin_prefetch(nx + 64, 1);
                if (cls > 128)
                    __builtin_prefetch(nx + 128, 1);
            }
            return q;
        }
    }
    void *p = NULL;
    g_mutex_lock(&A.lock);
    nt__ptrvec *arr = A.free[ci];
    if (arr && arr->len) {
        p = arr->pdata[--arr->len];
        A.cached -= cls;
        NT_UNPOISON(p, cls);
    } else {
        p = sys_block(cls);
        A.sys_allocs++;
        if (!p && A.cached) { /* the host is short: give the cache back, retry */
            drop_cache_locked();
            p = sys_block(cls);
        }
    }
    g_mutex_unlock(&A.lock);
    if (!p)
        tl_host_failed = true;
    return p;
}

/* The block for capacity cls the caller has reserved; NULL (the host is
 * out of memory) gives the reservation back. */
static void *take_reserved(int ci, size_t cls, dev_acct *a)
{
    void *p = take_block(ci, cls);
    if (!p)
        AO_fetch_and_add(&a->in_use, (AO_t)0 - cls);
    else
        backed_add(a, cls);
    return p;
}

void *nt__arena_alloc(size_t nbytes)
{
    size_t cls;
    int ci = class_of(nbytes, &cls);
    int dev = nt__alloc_dev;
    dev_acct *a = dev_of(dev);
    if (!reserve(a, cls) && !reserve_wait(0, dev, cls))
        return NULL;
    return take_reserved(ci, cls, a);
}

void *nt__arena_alloc_scratch(size_t nbytes, int dev)
{
    size_t cls;
    int ci = class_of(nbytes, &cls);
    dev_acct *a = dev_of(dev);
    if (!reserve(a, cls)) {
        /* Capacity reserved for tensors that queued ops will write later is
         * not in use yet: a kernel's workspace, given back when it ends, may
         * use it while the device's blocks (backed) leave room. */
        if (AO_load(&a->backed) + cls <= A.capacity)
            note_peaks(a, AO_fetch_and_add(&a->in_use, (AO_t)cls) + cls);
        else if (!reserve_wait(0, dev, cls))
            return NULL;
    }
    return take_reserved(ci, cls, a);
}

bool nt__arena_reserve(size_t nbytes)
{
    size_t cls;
    class_of(nbytes, &cls);
    uint32_t sid = nt__alloc_sid;
    int dev = nt__alloc_dev;
    waiting_backpressure();
    return reserve_on(sid, dev, cls) || reserve_wait(sid, dev, cls);
}

void nt__arena_unreserve(size_t nbytes, int dev)
{
    size_t cls;
    class_of(nbytes, &cls);
    AO_fetch_and_add(&dev_of(dev)->in_use, (AO_t)0 - cls);
}

void *nt__arena_alloc_reserved(size_t nbytes, int dev)
{
    size_t cls;
    int ci = class_of(nbytes, &cls);
    void *p = take_block(ci, cls);
    if (p)
        backed_add(dev_of(dev), cls);
    return p;
}

static void give_block(void *p, int ci, size_t cls, dev_acct *a);

void nt__arena_free(void *p, size_t nbytes, int dev)
{
    if (!p)
        return;
    size_t cls;
    int ci = class_of(nbytes, &cls);
    dev_acct *a = dev_of(dev);
    AO_fetch_and_add(&a->in_use, (AO_t)0 - cls);
    give_block(p, ci, cls, a);
}

void nt__arena_free_pended(void *p, size_t nbytes, uint32_t sid, int dev)
{
    size_t cls;
    int ci = class_of(nbytes, &cls);
    dev_acct *a = dev_of(dev);
    if (sid) {
        unpend(sid, cls, a);
    } else {
        AO_fetch_and_add(&a->waiting_nc, (AO_t)0 - cls);
        AO_fetch_and_add(&a->in_use, (AO_t)0 - cls);
    }
    if (p)
        give_block(p, ci, cls, a);
}

/* A block back to the caches (or the system); in_use is the caller's. */
static void give_block(void *p, int ci, size_t cls, dev_acct *a)
{
    AO_fetch_and_add(&a->backed, (AO_t)0 - cls);
    tlcache *c = ci <= NT_TL_MAXCLASS ? tl_get() : NULL;
    if (c) {
        if (c->n[ci] == NT_TL_KEEP) {
            /* full: give half back in one lock */
            g_mutex_lock(&A.lock);
            if (!A.free[ci]) {
                A.bytes[ci] = cls;
                __atomic_store_n(&A.free[ci], nt__ptrvec_new(0), __ATOMIC_RELEASE);
            }
            while (c->n[ci] > NT_TL_KEEP / 2) {
                void *q = c->blk[ci][--c->n[ci]];
                if (!A.free[ci] || !nt__ptrvec_add(A.free[ci], q)) {
                    NT_UNPOISON(q, cls);
                    free(q); /* no room to keep it: back to the system */
                    continue;
                }
                A.cached += cls;
            }
            g_mutex_unlock(&A.lock);
        }
        c->blk[ci][c->n[ci]++] = p;
        NT_POISON(p, cls);
        return;
    }
    g_mutex_lock(&A.lock);
    if (A.cached + cls <= NT_ARENA_CACHE_MAX &&
        A.cached + cls + SUM_DEV(in_use) <= A.capacity * (uint64_t)A.ndev) {
        nt__ptrvec *arr = A.free[ci];
        if (!arr) {
            arr = A.free[ci] = nt__ptrvec_new(0);
            A.bytes[ci] = cls;
        }
        if (arr && nt__ptrvec_add(arr, p)) { /* else no room to keep it: freed below */
            A.cached += cls;
            NT_POISON(p, cls);
            p = NULL;
        }
    }
    if (p)
        A.sys_frees++;
    g_mutex_unlock(&A.lock);
    free(p);
}

bool nt__arena_host_failed(void)
{
    bool f = tl_host_failed;
    tl_host_failed = false;
    return f;
}

uint64_t nt__arena_in_use(void) { return SUM_DEV(in_use); }
uint64_t nt__arena_backed(void) { return SUM_DEV(backed); }
uint64_t nt__arena_backed_peak(void) { return SUM_DEV(backed_peak); }
uint64_t nt__arena_peak(void) { return SUM_DEV(peak); }
uint64_t nt__arena_capacity(void) { return A.capacity; }
uint64_t nt__arena_live_peak(void) { return SUM_DEV(live_peak); }
uint64_t nt__arena_waiting(void) { return SUM_DEV(waiting_c) + SUM_DEV(waiting_nc); }
uint64_t nt__arena_alloc_waits(void) { return AO_load(&A.alloc_waits); }
uint64_t nt__arena_alloc_wait_ns(void) { return AO_load(&A.alloc_wait_ns); }
uint64_t nt__arena_in_use_on(int dev) { return AO_load(&dev_of(dev)->in_use); }
uint64_t nt__arena_live_on(int dev) { return live_of(dev_of(dev)); }
uint64_t nt__arena_live_peak_on(int dev) { return AO_load(&dev_of(dev)->live_peak); }
uint64_t nt__arena_waiting_on(int dev)
{
    return AO_load(&dev_of(dev)->waiting_c) + AO_load(&dev_of(dev)->waiting_nc);
}

void nt__arena_reset_peak(void)
{
    for (int d = 0; d < A.ndev; d++) {
        dev_acct *a = &A.d[d];
        AO_store(&a->peak, AO_load(&a->in_use));
        AO_store(&a->backed_peak, AO_load(&a->backed));
        AO_store(&a->live_peak, live_of(a));
    }
    AO_store(&A.alloc_waits, 0);
    AO_store(&A.alloc_wait_ns, 0);
}
