/* core/tensor.c - handles, storage, references, scopes, metadata.
 *
 * Handles come from slabs that are only freed at nt_shutdown, and a released
 * handle waits in a FIFO quarantine (NT_HANDLE_QUARANTINE releases) before
 * it is reused, so using a handle after releasing it is reported
 * (NT_ERELEASED) instead of touching freed memory.  A pointer kept past the
 * quarantine may name a new tensor: the handle is the address, and nothing
 * in it can tell the two uses apart; NT_HANDLE_QUARANTINE=all closes that
 * gap for a debugging run by never reusing a handle.  User references
 * (refs) and internal ones (irefs) are counted apart: a handle is invalid
 * for the user as soon as refs reaches 0, while queued work that still
 * reads it keeps it (and its storage) alive. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/hooks.h"
#include "core/hugecut.h"
#include "core/internal.h"

#define NT_SLAB_HANDLES 256
/* Past this many slabs (a program that keeps ~10k handles alive, e.g. a big
 * lazy batch), slabs are cut from 2 MiB blocks advised onto huge pages: the
 * fusion planner reads each queued op's output handle, and on 4 KiB pages
 * the handles of a 100k-op batch span 8,000 pages, many times what the TLB
 * holds (docs/fusion.md, Cost). */
#define NT_SLAB_HUGE_AFTER 32

static struct {
    GMutex lock;
    nt_tensor **slabs; /* own array: growing it may fail cleanly */
    bool *slab_owned;  /* slabs[i] is its own allocation (else cut from a block) */
    size_t nslabs, slabcap;
    nt__hugecut huge; /* slabs past the first NT_SLAB_HUGE_AFTER (core/hugecut.h) */
    nt_tensor *head, *tail; /* FIFO of batches of free handles (their first handles) */
    size_t nfree;
    volatile AO_t next_id;
} P;

static _Thread_local nt_scope *tls_scope NT_TLS_HOT;
static volatile AO_t pool_epoch; /* bumped by nt_shutdown: thread caches die */

struct nt_scope {
    uint32_t magic;
    nt_scope *parent;
    nt_tensor **items; /* own array, not a GPtrArray: growing it may fail cleanly */
    uint32_t nitems, cap;
};
#define NT__SCOPE_MAGIC 0x5c09e5c0u

void nt__tensor_pool_init(void)
{
    g_mutex_init(&P.lock);
    P.slabs = NULL;
    P.slab_owned = NULL;
    P.nslabs = P.slabcap = 0;
    P.huge = (nt__hugecut){0};
    P.head = P.tail = NULL;
    P.nfree = 0;
}

void nt__tensor_pool_shutdown(void)
{
    if (!P.nslabs)
        return;
    /* Handles the user never released: their storage goes with them. */
    for (size_t i = 0; i < P.nslabs; i++) {
        nt_tensor *slab = P.slabs[i];
        for (int k = 0; k < NT_SLAB_HANDLES; k++) {
            nt_tensor *t = &slab[k];
            if (!t->st)
                continue;
            if (t->ag && nt__chooks.ag_free)
                nt__chooks.ag_free(t->ag);
            t->ag = NULL;
            nt__storage_unref(t->st);
            t->st = NULL;
            t->magic = NT__MAGIC_DEAD;
        }
    }

    for (size_t i = 0; i < P.nslabs; i++)
        if (P.slab_owned[i])
            free(P.slabs[i]);
    free(P.slabs);
    free(P.slab_owned);
    P.slabs = NULL;
    P.slab_owned = NULL;
    P.nslabs = P.slabcap = 0;
    P.huge = (nt__hugecut){0};
    P.head = P.tail = NULL;
    P.nfree = 0;
    AO_fetch_and_add1(&pool_epoch);
    g_mutex_clear(&P.lock);
}

/* Handles alive (user or internal references): counted on demand by a scan
 * of the slabs, so the hot path keeps no shared counter. */
uint64_t nt__tensor_live_handles(void)
{
    uint64_t n = 0;
    g_mutex_lock(&P.lock);
    for (size_t i = 0; i < P.nslabs; i++) {
        nt_tensor *slab = P.slabs[i];
        for (int k = 0; k < NT_SLAB_HANDLES; k++)
            n += slab[k].st != NULL;
    }
    g_mutex_unlock(&P.lock);
    return n;
}

/* A zeroed slab of NT_SLAB_HANDLES handles; P.lock held, slabs[nslabs] has
 * room.  NULL: the host is out of memory. */
static nt_tensor *slab_new(void)
{
    const size_t bytes = NT_SLAB_HANDLES * sizeof(nt_tensor);
    if (P.nslabs >= NT_SLAB_HUGE_AFTER) {
        void *block;
        nt_tensor *slab = nt__hugecut_take(&P.huge, bytes, &block);
        if (slab) {
            memset(slab, 0, bytes);
            P.slab_owned[P.nslabs] = block != NULL; /* the block's first slab owns it */
            return slab;
        }
    }
    P.slab_owned[P.nslabs] = true;
    return calloc(NT_SLAB_HANDLES, sizeof(nt_tensor));
}

/* Ids for messages and the debugger, unique per process: a thread takes a
 * block of 2^20 from the global counter and numbers from it. */
static _Thread_local struct {
    uint64_t next, end;
} tl_id NT_TLS_HOT;

static uint64_t next_id(void)
{
    if (tl_id.next == tl_id.end) {
        tl_id.next = AO_fetch_and_add(&P.next_id, (AO_t)1 << 20) + 1;
        tl_id.end = tl_id.next + ((uint64_t)1 << 20);
    }
    return tl_id.next++;
}

/* Per-thread caches: a producer takes a batch of NT_TL_BATCH handles at a
 * time, a thread that frees them (mostly a stream worker) hands them back
 * as a batch, so the global lock is taken once per batch.  The FIFO holds
 * whole batches, so taking one is O(1): no walk over handles that are cold
 * in cache.  Batches only ever return to the FIFO's tail, so the quarantine
 * still holds. */
#define NT_TL_BATCH 32
_Static_assert(NT_SLAB_HANDLES % NT_TL_BATCH == 0, "a slab splits into whole batches");
static _Thread_local struct {
    nt_tensor *take, *give; /* taken from the FIFO / waiting to go back */
    int ntake, ngive;
    nt_tensor *give_tail;
    uint64_t epoch;
} tl_h NT_TLS_HOT;

static void tl_check_epoch(void)
{
    uint64_t e = AO_load(&pool_epoch);
    if (tl_h.epoch != e) { /* handles of an earlier nt_init are gone */
        tl_h.take = tl_h.give = tl_h.give_tail = NULL;
        tl_h.ntake = tl_h.ngive = 0;
        tl_h.epoch = e;
    }
}

/* Appends the batch headed by b (n handles, linked by pool_next) to the
 * FIFO.  P.lock held. */
static void push_batch(nt_tensor *b, int n)
{
    b->pool_batch = NULL;
    b->pool_n = (uint32_t)n;
    if (P.tail)
        P.tail->pool_batch = b;
    else
        P.head = b;
    P.tail = b;
    P.nfree += (size_t)n;
}

static nt_tensor *handle_alloc(void)
{
    tl_check_epoch();
    if (!tl_h.take) {
        g_mutex_lock(&P.lock);
        /* The quarantine (NT_HANDLE_QUARANTINE, default 4096): a handle is
         * reused only after that many others were released, so a stale
         * pointer finds a dead handle, not another tensor.  "all" never
         * reuses one: every stale use is caught, for a debugging run. */
        uint64_t q = NT__CFG(handle_quarantine);
        if (q == 0) /* nt__cfg not set up: a handle made outside nt_init */
            q = 4096;
        if (q == UINT64_MAX ? !P.head : P.nfree <= q + NT_TL_BATCH) {
            if (P.nslabs == P.slabcap) {
                size_t cap = P.slabcap ? P.slabcap * 2 : 64;
                nt_tensor **v = realloc(P.slabs, cap * sizeof *v);
                if (v)
                    P.slabs = v;
                bool *o = v ? realloc(P.slab_owned, cap * sizeof *o) : NULL;
                if (!o) {
                    g_mutex_unlock(&P.lock);
                    return NULL;
                }
                P.slab_owned = o;
                P.slabcap = cap;
            }
            nt_tensor *slab = slab_new();
            if (!slab) {
                g_mutex_unlock(&P.lock);
                return NULL;
            }
            P.slabs[P.nslabs++] = slab;
            for (int i = 0; i < NT_SLAB_HANDLES; i += NT_TL_BATCH) {
                for (int k = i; k < i + NT_TL_BATCH; k++) {
                    slab[k].magic = NT__MAGIC_DEAD;
                    slab[k].pool_next = k + 1 < i + NT_TL_BATCH ? &slab[k + 1] : NULL;
                }
                push_batch(&slab[i], NT_TL_BATCH);
            }
        }
        nt_tensor *b = P.head;
        P.head = b->pool_batch;
        if (!P.head)
            P.tail = NULL;
        P.nfree -= b->pool_n;
        tl_h.take = b;
        tl_h.ntake = (int)b->pool_n;
        g_mutex_unlock(&P.lock);
    }
    nt_tensor *t = tl_h.take;
    tl_h.take = t->pool_next;
    tl_h.ntake--;
    /* The quarantine means a handle comes back cold: start fetching the next
     * one now, so its initialisation does not stall the next op. */
    if (tl_h.take)
        for (size_t off = 0; off < sizeof(nt_tensor); off += 64)
            __builtin_prefetch((const char *)tl_h.take + off, 1);
    return t;
}

static void handle_free(nt_tensor *t)
{
    tl_check_epoch();
    /* Normally dead already (nt_release): then only read, since the user's
     * thread may still read it to report NT_ERELEASED. */
    if (t->magic != NT__MAGIC_DEAD)
        t->magic = NT__MAGIC_DEAD;
    t->pool_next = NULL;
    if (tl_h.give_tail)
        tl_h.give_tail->pool_next = t;
    else
        tl_h.give = t;
    tl_h.give_tail = t;
    if (++tl_h.ngive < NT_TL_BATCH)
        return;
    g_mutex_lock(&P.lock);
    /* NT_HANDLE_QUARANTINE=all: released handles stay dead in their slabs */
    if (NT__CFG(handle_quarantine) != UINT64_MAX)
        push_batch(tl_h.give, tl_h.ngive);
    g_mutex_unlock(&P.lock);
    tl_h.give = tl_h.give_tail = NULL;
    tl_h.ngive = 0;
}

/* ---------------- storage ---------------- */

/* The storage header sits at the start of its arena block, the data two
 * cache lines later: one allocation per small tensor, not two.  Bigger data
 * is deferred (internal.h): the header alone now, a reservation of the
 * data's capacity, and the data's own block at first use. */
#define NT_ST_HDR 128
_Static_assert(sizeof(nt__storage) <= NT_ST_HDR, "storage header outgrew its two lines");
/* Data up to this size shares the header's block (within the per-thread
 * caches' classes): deferring it would save nothing worth a second block. */
#define NT_ST_INLINE_MAX (4096 - NT_ST_HDR)

static GMutex materialize_lock; /* static: needs no init */

nt__storage *nt__storage_new(size_t nbytes)
{
    bool deferred = nbytes > NT_ST_INLINE_MAX;
    if (deferred && !nt__arena_reserve(nbytes))
        return NULL;
    char *block = nt__arena_alloc(NT_ST_HDR + (deferred ? 0 : nbytes));
    if (!block) {
        if (deferred)
            nt__arena_unreserve(nbytes, nt__alloc_dev);
        return NULL;
    }
    nt__storage *st = (nt__storage *)block;
    memset(st, 0, sizeof *st);
    st->refs = 1;
    st->hrefs = 1; /* the handle the caller makes for it */
    st->data = deferred ? NULL : block + NT_ST_HDR;
    st->deferred = deferred;
    st->nbytes = nbytes;
    st->id = next_id();
    st->dev = nt__alloc_dev;
    st->cap = nt__tl_cap;
    return st;
}

_Thread_local uint8_t nt__tl_cap NT_TLS_HOT;
_Thread_local struct nt__capture *nt__tl_recorder NT_TLS_HOT;

nt__storage *nt__storage_borrowed(void *data, size_t nbytes, int dev)
{
    nt__storage *st = aligned_alloc(64, NT_ST_HDR);
    if (!st)
        return NULL;
    memset(st, 0, sizeof *st);
    st->refs = 1;
    st->data = data;
    st->nbytes = nbytes;
    st->id = next_id();
    st->dev = (uint8_t)dev;
    st->borrowed = 1;
    st->hostdead = 1; /* no handle of the user's: nothing to lend at release */
    return st;
}

void *nt__storage_materialize(nt__storage *st)
{
    void *d = __atomic_load_n(&st->data, __ATOMIC_ACQUIRE);
    if (d)
        return d;
    g_mutex_lock(&materialize_lock);
    d = st->data;
    if (!d && st->deferred) {
        d = nt__arena_alloc_reserved(st->nbytes, st->dev);
        if (d)
            __atomic_store_n(&st->data, d, __ATOMIC_RELEASE);
    }
    g_mutex_unlock(&materialize_lock);
    return d;
}

void *nt__storage_data_slow(nt__storage *st)
{
    void *d = nt__storage_materialize(st);
    if (!d) {
        fprintf(stderr, "ntensor: fatal: out of host memory for a %zu-byte tensor\n",
                st->nbytes);
        abort();
    }
    return d;
}

void nt__storage_ref(nt__storage *st) { AO_fetch_and_add1(&st->refs); }

void nt__storage_unref(nt__storage *st)
{
    if (st && nt__ref_drop(&st->refs, 1)) {
        if (st->cap && nt__chooks.storage_dead)
            nt__chooks.storage_dead(st);
        nt__errobj_unref((nt__errobj *)st->poison);
        if (st->borrowed) { /* its block is the plan's, freed by its owner */
            free(st);
            return;
        }
        int dev = st->dev; /* the header goes back last: read nothing of it after */
        if (!st->deferred) {
            if (st->hostdead)
                nt__arena_free_pended(st, NT_ST_HDR + st->nbytes, 0, dev);
            else
                nt__arena_free(st, NT_ST_HDR + st->nbytes, dev);
            return;
        }
        if (st->hostdead) {
            nt__arena_free_pended(st->data, st->nbytes, st->pend_sid, dev);
            nt__arena_free_pended(st, NT_ST_HDR, 0, dev);
            return;
        }
        if (st->data)
            nt__arena_free(st->data, st->nbytes, dev);
        else
            nt__arena_unreserve(st->nbytes, dev); /* never touched: never took a block */
        nt__arena_free(st, NT_ST_HDR, dev);
    }
}

/* ---------------- handles ---------------- */

/* A handle on st, taking over the caller's reference to st (adopt) or
 * adding one. */
static nt_tensor *handle_new(nt__storage *st, bool adopt, nt_dtype dt, int ndim,
                             const int64_t *shape, const int64_t *stride, int64_t offset,
                             const nt_site *site)
{
    nt_tensor *t = handle_alloc();
    if (!t)
        return NULL;
    if (!adopt) {
        nt__storage_ref(st);
        AO_fetch_and_add1(&st->hrefs);
    }
    t->ndim = (int8_t)ndim;
    t->dtype = (uint8_t)dt;
    t->expanded = 0;
    t->dev = st->dev;
    t->refs = 1;
    t->irefs = 1;
    t->st = st;
    t->offset = offset;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->stride[i] = stride[i];
        if (stride[i] == 0 && shape[i] > 1)
            t->expanded = 1;
    }
    t->scope = NULL;
    t->scope_idx = -1;
    t->ag = NULL;
    t->site = site ? *site : (nt_site){0};
    t->id = next_id();
    t->magic = NT__MAGIC_LIVE;
    return t;
}

nt_tensor *nt__tensor_new(nt__storage *st, nt_dtype dt, int ndim, const int64_t *shape,
                          const int64_t *stride, int64_t offset, const nt_site *site)
{
    return handle_new(st, false, dt, ndim, shape, stride, offset, site);
}

nt_tensor *nt__tensor_new_internal(nt__storage *st, nt_dtype dt, int ndim, const int64_t *shape,
                                   const int64_t *stride, int64_t offset, const nt_site *site)
{
    /* adopt: the caller's hrefs count stays as it is */
    nt__storage_ref(st);
    nt_tensor *t = handle_new(st, true, dt, ndim, shape, stride, offset, site);
    if (!t) {
        nt__storage_unref(st);
        return NULL;
    }
    t->refs = 0;
    t->magic = NT__MAGIC_DEAD;
    return t;
}

nt_tensor *nt__tensor_empty(nt_dtype dt, int ndim, const int64_t *shape, const nt_site *site,
                            const char *fn)
{
    /* The one place every fresh tensor passes: a shape rule (broadcast,
     * matmul, cat, a custom op's) that produced an impossible shape stops
     * here, before any size is computed from it. */
    char why[256];
    if (!nt__shape_ok(ndim, shape, why, sizeof why)) {
        nt__err(site, NT_ESHAPE, fn, "the result's %s", why);
        return NULL;
    }
    int64_t n = nt__numel(ndim, shape);
    size_t nbytes = (size_t)n * nt__dtype_size(dt);
    nt__arena_host_failed(); /* forget an earlier failure */
    nt__storage *st = nt__storage_new(nbytes);
    if (!st && nt__arena_host_failed()) {
        char sh[128];
        nt__err(site, NT_EHOSTMEM, fn, "out of host memory for a %s tensor of shape %s",
                nt_dtype_name(dt), nt__shape_str(ndim, shape, sh, sizeof sh));
        return NULL;
    }
    if (!st) {
        char sh[128];
        int dev = nt__alloc_dev;
        uint64_t cap = nt__arena_capacity(), used = nt__arena_in_use_on(dev);
        /* "device memory" with one device, as always; "device N's" with more */
        char which[48] = "device memory";
        if (NT__CFG(devices) > 1)
            snprintf(which, sizeof which, "device %d's memory", dev);
        if (nt__arena_too_big())
            nt__err(site, NT_ENOMEM, fn,
                    "out of %s: a %s tensor of shape %s needs %zu bytes, more than "
                    "the whole device capacity of %llu bytes (NT_HBM_BYTES)",
                    which, nt_dtype_name(dt), nt__shape_str(ndim, shape, sh, sizeof sh), nbytes,
                    (unsigned long long)cap);
        else
            nt__err(site, NT_ENOMEM, fn,
                    "out of %s: a %s tensor of shape %s needs %zu bytes; live "
                    "tensors hold %llu bytes, %llu bytes are waiting to be freed by queued "
                    "ops, the largest free block is %llu bytes (capacity %llu, "
                    "NT_HBM_BYTES)",
                    which, nt_dtype_name(dt), nt__shape_str(ndim, shape, sh, sizeof sh), nbytes,
                    (unsigned long long)nt__arena_live_on(dev),
                    (unsigned long long)nt__arena_waiting_on(dev),
                    (unsigned long long)(cap > used ? cap - used : 0), (unsigned long long)cap);
        return NULL;
    }
    int64_t stride[NT_MAX_DIMS];
    nt__contig_strides(ndim, shape, stride);
    nt_tensor *t = handle_new(st, true, dt, ndim, shape, stride, 0, site); /* holds st now */
    if (!t) {
        nt__storage_unref(st);
        nt__err_hostmem(site, fn, "a tensor handle");
    }
    return t;
}

void nt__tensor_iref(nt_tensor *t) { AO_fetch_and_add1(&t->irefs); }

void nt__tensor_iunref(nt_tensor *t) { nt__tensor_iunref_n(t, 1); }

void nt__tensor_iunref_n(nt_tensor *t, AO_t n)
{
    if (!t || !nt__ref_drop(&t->irefs, n))
        return;
    if (t->ag && nt__chooks.ag_free)
        nt__chooks.ag_free(t->ag);
    t->ag = NULL;
    nt__storage_unref(t->st);
    t->st = NULL;
    handle_free(t);
}

bool nt__check_arg(const nt_site *site, const char *fn, const char *arg, nt_tensor *t)
{
    if (!t) {
        if (!nt_last_error())
            nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL", arg);
        return false;
    }
    if (t->magic != NT__MAGIC_LIVE) {
        nt__err(site, NT_ERELEASED, fn, "argument '%s' is a tensor that was already released",
                arg);
        return false;
    }
    return true;
}

bool nt__check_list(const char *fn, nt_tensor *const *ts, int n, const char *noun,
                    bool (*each)(const char *fn, const char *arg, nt_tensor *const *ts, int i))
{
    if (!ts || n <= 0) {
        nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %s; expected at least one %s",
                ts ? "n" : "params", ts ? "<= 0" : "NULL", noun);
        return false;
    }
    for (int i = 0; i < n; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "params[%d]", i);
        if (!nt__check_arg(NULL, fn, arg, ts[i]) || (each && !each(fn, arg, ts, i)))
            return false;
    }
    return true;
}

/* ---------------- references ---------------- */

NT_API nt_tensor *nt_retain(nt_tensor *t)
{
    if (!nt__check_arg(NULL, "nt_retain", "t", t))
        return NULL;
    AO_fetch_and_add1(&t->refs);
    return t;
}

static void scope_detach(nt_tensor *t)
{
    nt_scope *s = t->scope;
    if (s && t->scope_idx >= 0 && (uint32_t)t->scope_idx < s->nitems &&
        s->items[t->scope_idx] == t)
        s->items[t->scope_idx] = NULL;
    t->scope = NULL;
    t->scope_idx = -1;
}

/* t's last user reference went.  If that leaves its storage to queued
 * records alone, the storage is hostdead: the arena counts its bytes as
 * waiting for those records (and, when they are all on one stream, lends
 * them to that stream's later ops), and the worker drops its records'
 * references as soon as each has run (nt__rec_drop_dead).  Runs before the
 * handle's own internal reference goes, so the storage outlives it. */
static void host_release(nt_tensor *t)
{
    nt__storage *st = t->st;
    /* The only handle: no other can be made on it now (that needs a live
     * handle), so no locked instruction is needed. */
    bool only = AO_load(&st->refs) == 1;
    AO_t left;
    if (only) {
        AO_store(&st->hrefs, 0);
        left = 0;
    } else {
        left = AO_fetch_and_sub1(&st->hrefs) - 1;
    }
    if (left)
        return;
    if (only && AO_load(&t->irefs) == 1)
        return; /* nothing queued holds it: it is freed right now */
    if (!st->deferred) {
        /* small: waiting, but not lent -- its block is its header's */
        st->pend_sid = 0;
        nt__arena_pend(0, NT_ST_HDR + st->nbytes, st->dev);
        __atomic_store_n(&st->hostdead, 1, __ATOMIC_RELEASE);
        return;
    }
    uint64_t lw = AO_load(&st->last_write), lr = AO_load(&st->last_read);
    uint32_t sw = NT__PACK_SID(lw), sr = NT__PACK_SID(lr);
    uint32_t sid = sr ? sr : sw;
    if (__atomic_load_n(&st->xstream, __ATOMIC_RELAXED) || (sw && sw != sid))
        sid = 0; /* read on another stream: wait for it to finish */
    st->pend_sid = nt__arena_pend(sid, st->nbytes, st->dev);
    nt__arena_pend(0, NT_ST_HDR, st->dev); /* its header waits too, not lent */
    __atomic_store_n(&st->hostdead, 1, __ATOMIC_RELEASE);
}

NT_API int nt_release(nt_tensor *t)
{
    if (!t)
        return 0;
    if (t->magic != NT__MAGIC_LIVE)
        return nt__err(NULL, NT_ERELEASED, "nt_release",
                       "argument 't' is a tensor that was already released");
    if (nt__ref_drop(&t->refs, 1)) {
        t->magic = NT__MAGIC_DEAD;
        scope_detach(t);
        host_release(t);
        nt__tensor_iunref(t);
    }
    return 0;
}

/* ---------------- scopes ---------------- */

nt_tensor *nt__scope_adopt(nt_tensor *t, const char *fn)
{
    nt_scope *s = tls_scope;
    if (t && s) {
        if (s->nitems == s->cap) {
            size_t cap = (size_t)s->cap * 2;
            nt_tensor **v = cap <= INT32_MAX ? realloc(s->items, cap * sizeof *v) : NULL;
            if (!v) { /* the scope cannot own it: nobody would release it */
                nt_release(t);
                nt__err_hostmem(NULL, fn, "the open scope's list of tensors");
                return NULL;
            }
            s->items = v;
            s->cap = (uint32_t)cap;
        }
        t->scope = s;
        t->scope_idx = (int32_t)s->nitems;
        s->items[s->nitems++] = t;
    }
    return t;
}

NT_API nt_scope *nt_scope_begin(void)
{
    nt_scope *s = calloc(1, sizeof *s);
    if (s) {
        s->cap = 64;
        s->items = malloc(s->cap * sizeof *s->items);
    }
    if (!s || !s->items) {
        free(s);
        nt__err_hostmem(NULL, "nt_scope_begin", "a scope");
        return NULL;
    }
    s->magic = NT__SCOPE_MAGIC;
    s->parent = tls_scope;
    tls_scope = s;
    return s;
}

static void scope_close(nt_scope *s)
{
    for (uint32_t i = 0; i < s->nitems; i++) {
        nt_tensor *t = s->items[i];
        if (!t)
            continue;
        t->scope = NULL;
        t->scope_idx = -1;
        nt_release(t);
    }
    free(s->items);
    s->magic = 0;
    free(s);
}

NT_API int nt_scope_end(nt_scope *s)
{
    if (!s)
        return nt__err(NULL, NT_EINVAL, "nt_scope_end", "argument 's' is NULL");
    nt_scope *c = tls_scope;
    while (c && c != s)
        c = c->parent;
    if (!c)
        return nt__err(NULL, NT_ESTATE, "nt_scope_end",
                       "scope %p is not open on this thread (already ended, or opened on "
                       "another thread)",
                       (void *)s);
    /* Close s and every scope opened inside it and left open. */
    for (;;) {
        nt_scope *top = tls_scope;
        tls_scope = top->parent;
        scope_close(top);
        if (top == s)
            break;
    }
    return 0;
}

NT_API nt_tensor *nt_keep(nt_tensor *t)
{
    if (!nt__check_arg(NULL, "nt_keep", "t", t))
        return NULL;
    scope_detach(t);
    return t;
}

/* Closes every scope the calling thread left open (nt_shutdown). */
void nt__scopes_close_thread(void)
{
    while (tls_scope) {
        nt_scope *top = tls_scope;
        tls_scope = top->parent;
        scope_close(top);
    }
}

/* ---------------- metadata ---------------- */

static bool meta_ok(nt_tensor *t) { return t && t->magic == NT__MAGIC_LIVE; }

NT_API int nt_ndim(nt_tensor *t) { return meta_ok(t) ? t->ndim : -1; }

NT_API int64_t nt_shape(nt_tensor *t, int i)
{
    if (!meta_ok(t))
        return -1;
    int d = nt__norm_dim(i, t->ndim);
    return d < 0 ? -1 : t->shape[d];
}

NT_API int64_t nt_stride(nt_tensor *t, int i)
{
    if (!meta_ok(t))
        return -1;
    int d = nt__norm_dim(i, t->ndim);
    return d < 0 ? -1 : t->stride[d];
}

NT_API int64_t nt_numel(nt_tensor *t) { return meta_ok(t) ? nt__numel(t->ndim, t->shape) : -1; }

NT_API nt_dtype nt_dtype_of(nt_tensor *t)
{
    return meta_ok(t) ? (nt_dtype)t->dtype : NT_DTYPE_COUNT;
}

NT_API bool nt_is_contiguous(nt_tensor *t) { return meta_ok(t) && nt__is_contig(t); }

/* core/backend.h: what a user tile kernel sees of a tensor. */
void nt__tensor_view_of(nt_tensor_view *v, const nt_tensor *t)
{
    memset(v, 0, sizeof *v);
    v->data = nt__tensor_data(t);
    v->dtype = (nt_dtype)t->dtype;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof v->shape);
    memcpy(v->stride, t->stride, sizeof v->stride);
}
