/* core/tensor.c - handles, storage, references, scopes, metadata.
 *
 * Handles come from slabs that are never given back to the system, not
 * even by nt_shutdown, and a released handle waits in a FIFO quarantine
 * before it is reused, so using a handle after releasing it is reported
 * (NT_ERELEASED) instead of touching freed memory, and so is using one kept
 * across nt_shutdown (NT_ESTATE: nt_shutdown marks the handles it frees
 * NT__MAGIC_OLD).  The quarantine counts the handles the program could
 * see: a handle is reused only after NT_HANDLE_QUARANTINE more of those
 * came back after it.  The library's own temporaries (tensors owned by a
 * scope the library opened inside one of its calls, core/internal.h) were
 * never the program's: they are reused at once.  A pointer kept past the
 * quarantine may name a new tensor: the handle is the address, and nothing
 * in it can tell the two uses apart; NT_HANDLE_QUARANTINE=all closes that
 * gap for a debugging run by never reusing a handle the program saw.  User
 * references (refs) and internal ones (irefs) are counted apart: a handle
 * is invalid for the user as soon as refs reaches 0, while queued work that
 * still reads it keeps it (and its storage) alive. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/handle.h"
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
/* Handles move between a thread and the free lists in batches of this many. */
#define NT_TL_BATCH 32

/* A list of batches of free handles: each batch's first handle heads it
 * (pool_n handles linked by pool_next), batches are linked by pool_batch. */
typedef struct {
    nt_tensor *head, *tail;
    size_t n; /* handles */
} blist;

/* Lives as long as the process: a handle kept across nt_shutdown must
 * still point at a handle (GMutex: static storage needs no init). */
static struct {
    GMutex lock;
    nt_tensor **slabs; /* own array: growing it may fail cleanly */
    bool *slab_owned;  /* slabs[i] is its own allocation (else cut from a block) */
    size_t nslabs, slabcap;
    nt__hugecut huge; /* slabs past the first NT_SLAB_HUGE_AFTER (core/hugecut.h) */
    blist fifo;  /* the quarantine: released handles the program could see,
                    in the order they came back */
    blist ready; /* reused first, at once: handles never used, the library's
                    temporaries, and (nt_shutdown) every handle of an
                    earlier runtime, those that were live last */
    volatile AO_t next_id;
} P;

static _Thread_local nt_scope *tls_scope NT_TLS_HOT;
_Thread_local uint32_t nt__user_code NT_TLS_HOT;
static volatile AO_t pool_epoch; /* bumped by nt_shutdown: thread caches die */

struct nt_scope {
    uint32_t magic;
    uint32_t epoch;   /* nt__epoch() when opened: a scope a thread left open
                         across nt_shutdown is dropped, not reused */
    nt_scope *parent;
    nt_tensor **items; /* own array, not a GPtrArray: growing it may fail cleanly */
    uint32_t nitems, cap;
    uint32_t ucb;     /* nt__user_code when opened */
    bool lib;         /* opened by the library for its temporaries */
};
#define NT__SCOPE_MAGIC 0x5c09e5c0u

static void push_back(blist *l, nt_tensor *b, int n)
{
    b->pool_batch = NULL;
    b->pool_n = (uint32_t)n;
    if (l->tail)
        l->tail->pool_batch = b;
    else
        l->head = b;
    l->tail = b;
    l->n += (size_t)n;
}

static void push_front(blist *l, nt_tensor *b, int n)
{
    b->pool_n = (uint32_t)n;
    b->pool_batch = l->head;
    l->head = b;
    if (!l->tail)
        l->tail = b;
    l->n += (size_t)n;
}

static nt_tensor *pop_front(blist *l)
{
    nt_tensor *b = l->head;
    l->head = b->pool_batch;
    if (!l->head)
        l->tail = NULL;
    l->n -= b->pool_n;
    return b;
}

/* a then b, in one list */
static blist join(blist a, blist b)
{
    if (!a.head)
        return b;
    if (b.head) {
        a.tail->pool_batch = b.head;
        a.tail = b.tail;
        a.n += b.n;
    }
    return a;
}

void nt__tensor_pool_init(void) {}

/* Appends the handles of the slabs that no list holds (mark unset) and whose
 * magic is (old) or is not (!old) NT__MAGIC_OLD to l, in batches. */
static void gather_unlisted(blist *l, bool old)
{
    nt_tensor *b = NULL, *last = NULL;
    int n = 0;
    for (size_t i = 0; i < P.nslabs; i++)
        for (int k = 0; k < NT_SLAB_HANDLES; k++) {
            nt_tensor *t = &P.slabs[i][k];
            if (t->mark || (t->magic == NT__MAGIC_OLD) != old)
                continue;
            t->pool_next = NULL;
            if (last)
                last->pool_next = t;
            else
                b = t;
            last = t;
            if (++n == NT_TL_BATCH) {
                push_back(l, b, n);
                b = last = NULL;
                n = 0;
            }
        }
    if (n)
        push_back(l, b, n);
}

static void mark_list(const blist *l, uint8_t m)
{
    for (nt_tensor *b = l->head; b; b = b->pool_batch)
        for (nt_tensor *t = b; t; t = t->pool_next)
            t->mark = m;
}

/* nt_shutdown, once every stream has drained: frees what the handles still
 * hold and keeps the handles.  Those the program still held read
 * NT__MAGIC_OLD from now on.  Every handle goes into one list for the next
 * runtime, in the order that keeps a stale one detectable longest: never
 * used or the library's, then the quarantine's oldest first, then those
 * thread caches held (lost with their threads or their epoch), then the
 * ones that were live. */
void nt__tensor_pool_shutdown(void)
{
    /* Not under P.lock: freeing a tensor's autograd state may release other
     * handles (handle_free takes the lock).  A live handle keeps one
     * internal reference of its own, so none is freed that way while it
     * still reads live. */
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
            t->magic = t->magic == NT__MAGIC_LIVE ? NT__MAGIC_OLD : NT__MAGIC_DEAD;
        }
    }
    g_mutex_lock(&P.lock);
    mark_list(&P.ready, 1);
    mark_list(&P.fifo, 1);
    blist all = join(P.ready, P.fifo);
    gather_unlisted(&all, false);
    gather_unlisted(&all, true);
    mark_list(&all, 0);
    P.ready = all;
    P.fifo = (blist){0};
    AO_fetch_and_add1(&pool_epoch);
    g_mutex_unlock(&P.lock);
    nt__epoch_next();
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
 * as a batch, so the global lock is taken once per batch.  The lists hold
 * whole batches, so taking one is O(1): no walk over handles that are cold
 * in cache.  The program's handles only ever return to the FIFO's tail, so
 * the quarantine still holds; the library's temporaries go to `ready`. */
_Static_assert(NT_SLAB_HANDLES % NT_TL_BATCH == 0, "a slab splits into whole batches");
typedef struct {
    nt_tensor *head, *tail;
    int n;
} tl_give;
static _Thread_local struct {
    nt_tensor *take; /* taken from a list */
    int ntake;
    tl_give give, give_tmp; /* waiting to go back: the program's, the library's */
    uint64_t epoch;
} tl_h NT_TLS_HOT;

static void tl_check_epoch(void)
{
    uint64_t e = AO_load(&pool_epoch);
    if (tl_h.epoch != e) { /* nt_shutdown put these handles back already */
        tl_h.take = NULL;
        tl_h.ntake = 0;
        tl_h.give = tl_h.give_tmp = (tl_give){0};
        tl_h.epoch = e;
    }
}

/* The quarantine (NT_HANDLE_QUARANTINE, default 4096); UINT64_MAX: all. */
static uint64_t quarantine(void)
{
    uint64_t q = NT__CFG(handle_quarantine);
    return q ? q : 4096; /* 0: nt__cfg not set up, a handle made outside nt_init */
}

/* A batch of free handles.  P.lock held.  NULL: the host is out of memory. */
static nt_tensor *batch_take(void)
{
    if (P.ready.head)
        return pop_front(&P.ready);
    /* A handle the program saw is reused only when q more came back after
     * it; "all" never reuses one: every stale use is caught, for a
     * debugging run. */
    uint64_t q = quarantine();
    if (q != UINT64_MAX && P.fifo.head && P.fifo.n - P.fifo.head->pool_n >= q)
        return pop_front(&P.fifo);
    if (P.nslabs == P.slabcap) {
        size_t cap = P.slabcap ? P.slabcap * 2 : 64;
        nt_tensor **v = realloc(P.slabs, cap * sizeof *v);
        if (v)
            P.slabs = v;
        bool *o = v ? realloc(P.slab_owned, cap * sizeof *o) : NULL;
        if (!o)
            return NULL;
        P.slab_owned = o;
        P.slabcap = cap;
    }
    nt_tensor *slab = slab_new();
    if (!slab)
        return NULL;
    P.slabs[P.nslabs++] = slab;
    for (int i = 0; i < NT_SLAB_HANDLES; i += NT_TL_BATCH) {
        for (int k = i; k < i + NT_TL_BATCH; k++) {
            slab[k].magic = NT__MAGIC_DEAD;
            slab[k].pool_next = k + 1 < i + NT_TL_BATCH ? &slab[k + 1] : NULL;
        }
        if (i)
            push_front(&P.ready, &slab[i], NT_TL_BATCH);
    }
    slab[0].pool_n = NT_TL_BATCH;
    return &slab[0];
}

static nt_tensor *handle_alloc(void)
{
    tl_check_epoch();
    if (!tl_h.take) {
        g_mutex_lock(&P.lock);
        nt_tensor *b = batch_take();
        g_mutex_unlock(&P.lock);
        if (!b)
            return NULL;
        tl_h.take = b;
        tl_h.ntake = (int)b->pool_n;
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
    bool tmp = t->tmp;
    tl_give *g = tmp ? &tl_h.give_tmp : &tl_h.give;
    t->pool_next = NULL;
    if (g->tail)
        g->tail->pool_next = t;
    else
        g->head = t;
    g->tail = t;
    if (++g->n < NT_TL_BATCH)
        return;
    g_mutex_lock(&P.lock);
    if (tmp)
        push_front(&P.ready, g->head, g->n);
    else if (quarantine() != UINT64_MAX) /* all: the program's stay dead in their slabs */
        push_back(&P.fifo, g->head, g->n);
    g_mutex_unlock(&P.lock);
    *g = (tl_give){0};
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
    _Static_assert(sizeof *st % 8 == 0, "nt__zero clears whole words");
    nt__zero(st, sizeof *st);
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
    /* gone: released, and its refill not reached yet -- no block to give */
    if (!d && st->deferred && !__atomic_load_n(&st->gone, __ATOMIC_ACQUIRE)) {
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
    if (!d && __atomic_load_n(&st->gone, __ATOMIC_ACQUIRE)) {
        /* the host refuses every read of a released storage
         * (nt__check_resident): reaching here is the runtime's own bug */
        fprintf(stderr,
                "ntensor: fatal: read of storage #%llu (%zu bytes) whose memory was released "
                "(nt__mem_release) and not refilled\n",
                (unsigned long long)st->id, st->nbytes);
        abort();
    }
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
        if (!st->deferred) { /* small: never released (refused) */
            if (st->hostdead)
                nt__arena_free_pended(st, NT_ST_HDR + st->nbytes, 0, dev);
            else
                nt__arena_free(st, NT_ST_HDR + st->nbytes, dev);
            return;
        }
        /* released: its data's bytes went back at the release (the record
         * that gave the block back held a reference, so it has run) */
        bool rel = __atomic_load_n(&st->released, __ATOMIC_ACQUIRE);
        if (rel) /* dies released: no longer counted */
            __atomic_fetch_sub(&nt__n_released, 1, __ATOMIC_RELAXED);
        if (st->hostdead) {
            if (!rel)
                nt__arena_free_pended(st->data, st->nbytes, st->pend_sid, dev);
            nt__arena_free_pended(st, NT_ST_HDR, 0, dev);
            return;
        }
        if (rel)
            ; /* nothing of its data left to give back */
        else if (st->data)
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
    t->tmp = 0;
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
    t->tmp = 1; /* never the program's: skips the quarantine */
    return t;
}

nt_tensor *nt__tensor_empty(nt_dtype dt, int ndim, const int64_t *shape, const nt_site *site,
                            const char *fn)
{
    /* The one place every fresh tensor passes: a shape rule (broadcast,
     * matmul, cat, a custom op's) that produced an impossible shape stops
     * here, before any size is computed from it. */
    /* One pass: the rule of nt__shape_ok (sizes >= 0, the span with 0
     * counted as 1 at most 2^48, so nothing below overflows), the element
     * count and the contiguous strides.  nt__shape_ok says what is wrong. */
    int64_t stride[NT_MAX_DIMS], n = 1, span = 1;
    bool bad = (unsigned)ndim > NT_MAX_DIMS;
    for (int i = ndim - 1; i >= 0 && !bad; i--) {
        int64_t d = shape[i];
        stride[i] = span;
        bad = d < 0 || __builtin_mul_overflow(span, d ? d : 1, &span) || span > NT__MAX_NUMEL;
        if (!bad)
            n *= d; /* n <= span: no overflow */
    }
    if (bad) {
        char why[256] = "shape is invalid";
        nt__shape_ok(ndim, shape, why, sizeof why);
        nt__err(site, NT_ESHAPE, fn, "the result's %s", why);
        return NULL;
    }
    size_t nbytes = (size_t)n * nt__dtype_size(dt);
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

/* The error of a handle that is not live: released (NT_ERELEASED), or
 * freed by the last nt_shutdown (NT_ESTATE). */
static int stale_err(const nt_site *site, const char *fn, const char *arg, const nt_tensor *t)
{
    if (t->magic == NT__MAGIC_OLD)
        return nt__err(site, NT_ESTATE, fn,
                       "argument '%s' is a tensor made before the last nt_shutdown, which "
                       "freed it", arg);
    return nt__err(site, NT_ERELEASED, fn, "argument '%s' is a tensor that was already released",
                   arg);
}

bool nt__check_arg(const nt_site *site, const char *fn, const char *arg, nt_tensor *t)
{
    if (!t) {
        if (!nt_last_error())
            nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL", arg);
        return false;
    }
    if (t->magic != NT__MAGIC_LIVE) {
        stale_err(site, fn, arg, t);
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
    /* A user callback keeping a tensor it was lent (a saved input): the
     * program's from now on.  The library's own references (the backward
     * pass's gradient slots) leave a temporary its own. */
    if (nt__user_code)
        t->tmp = 0;
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
    if (nt__storage_released(st)) {
        /* its data's bytes went back at the release: the header waits */
        st->pend_sid = 0;
        nt__arena_pend(0, NT_ST_HDR, st->dev);
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

/* ---------------- releasing a storage's memory (internal.h) ---------------- */

static const char *tensor_desc(const nt_tensor *t, char *buf, size_t n)
{
    char sh[128];
    snprintf(buf, n, "tensor #%llu (%s %s, made at %s:%d)", (unsigned long long)t->id,
             nt_dtype_name((nt_dtype)t->dtype), nt__shape_str(t->ndim, t->shape, sh, sizeof sh),
             t->site.file ? t->site.file : "?", t->site.line);
    return buf;
}

uint64_t nt__n_released;

bool nt__check_resident(const nt_site *site, const char *fn, const char *arg, const nt_tensor *t)
{
    if (!nt__any_released())
        return true;
    if (!nt__storage_released(t->st))
        return true;
    char d[256];
    nt__err(site, NT_ESTATE, fn,
            "argument '%s' is %s, whose storage's memory was released (nt__mem_release) and "
            "not refilled: refill it (nt__mem_refill) before reading it",
            arg, tensor_desc(t, d, sizeof d));
    return false;
}

int nt__storage_release_begin(const nt_site *site, const char *fn, nt_tensor *t, uint32_t sid,
                              uint32_t *pool)
{
    nt__storage *st = t->st;
    char d[256];
    if (nt__storage_released(st))
        return nt__err(site, NT_ESTATE, fn, "argument 't' is %s, whose storage is released already",
                       tensor_desc(t, d, sizeof d));
    if (st->borrowed || st->cap)
        return nt__err(site, NT_ENOTSUP, fn,
                       "argument 't' is %s, whose storage belongs to a captured program's memory "
                       "plan; its memory cannot be released", tensor_desc(t, d, sizeof d));
    if (!st->deferred)
        return nt__err(site, NT_ENOTSUP, fn,
                       "argument 't' is %s, whose storage is small (%zu bytes, kept in its "
                       "header's block, at most %d); only a bigger storage's memory can be "
                       "released, a small one stays", tensor_desc(t, d, sizeof d), st->nbytes,
                       (int)NT_ST_INLINE_MAX);
    st->rel_version = AO_load(&st->version);
    *pool = nt__arena_pend(sid, st->nbytes, st->dev);
    __atomic_store_n(&st->released, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&nt__n_released, 1, __ATOMIC_RELAXED);
    return 0;
}

void nt__storage_release_run(void *arg)
{
    const nt__rec *r = arg;
    nt__storage *st = r->out[0]->st;
    /* every earlier reader and writer has run (the record's place in its
     * stream, and its waits on the others); the lock orders this against a
     * materialize of another thread all the same */
    g_mutex_lock(&materialize_lock);
    void *d = st->data;
    __atomic_store_n(&st->data, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&st->gone, 1, __ATOMIC_RELEASE);
    g_mutex_unlock(&materialize_lock);
    nt__arena_free_pended(d, st->nbytes, (uint32_t)r->p.i[0], st->dev);
}

int nt__storage_refill_begin(const nt_site *site, const char *fn, nt_tensor *t, uint32_t sid)
{
    nt__storage *st = t->st;
    char d[256];
    if (!nt__storage_released(st))
        return nt__err(site, NT_ESTATE, fn, "argument 't' is %s, whose storage is not released",
                       tensor_desc(t, d, sizeof d));
    nt__alloc_dev = st->dev;
    nt__alloc_sid = sid;
    bool ok = nt__arena_reserve(st->nbytes);
    nt__alloc_sid = 0;
    nt__alloc_dev = 0;
    if (!ok)
        return nt__err(site, NT_ENOMEM, fn,
                       "no room on device %d for the %zu bytes of %s (%llu of %llu bytes live); "
                       "its storage stays released",
                       (int)st->dev, st->nbytes, tensor_desc(t, d, sizeof d),
                       (unsigned long long)nt__arena_live_on(st->dev),
                       (unsigned long long)nt__arena_capacity());
    __atomic_store_n(&st->released, 0, __ATOMIC_RELEASE);
    __atomic_fetch_sub(&nt__n_released, 1, __ATOMIC_RELAXED);
    return 0;
}

void nt__storage_refill_run(void *arg)
{
    const nt__rec *r = arg;
    nt__storage *st = r->out[0]->st;
    g_mutex_lock(&materialize_lock);
    __atomic_store_n(&st->gone, 0, __ATOMIC_RELEASE);
    g_mutex_unlock(&materialize_lock);
}

NT_API int nt_release(nt_tensor *t)
{
    if (!t)
        return 0;
    if (t->magic != NT__MAGIC_LIVE)
        return stale_err(NULL, "nt_release", "t", t);
    if (nt__ref_drop(&t->refs, 1)) {
        t->magic = NT__MAGIC_DEAD;
        scope_detach(t);
        host_release(t);
        nt__tensor_iunref(t);
    }
    return 0;
}

/* ---------------- scopes ---------------- */

/* Frees the calling thread's scopes, which a runtime that has ended made
 * (the thread left them open across nt_shutdown): their tensors went with
 * it.  A later nt_scope_end of one finds it no longer open. */
static void scopes_drop_stale(void)
{
    while (tls_scope) {
        nt_scope *top = tls_scope;
        tls_scope = top->parent;
        free(top->items);
        top->magic = 0;
        free(top);
    }
}

/* The thread's innermost scope of this runtime, or NULL. */
static inline nt_scope *scope_top(void)
{
    nt_scope *s = tls_scope;
    if (s && s->epoch != nt__epoch()) {
        scopes_drop_stale();
        return NULL;
    }
    return s;
}

nt_tensor *nt__scope_adopt(nt_tensor *t, const char *fn)
{
    nt_scope *s = scope_top();
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
    /* Made by the library for itself (not by a user callback it runs): dies
     * inside the call, unseen by the program.  Anything else the caller
     * may see. */
    if (t)
        t->tmp = s && s->lib && s->ucb == nt__user_code;
    return t;
}

static nt_scope *scope_open(bool lib)
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
    s->epoch = nt__epoch();
    s->lib = lib;
    s->ucb = nt__user_code;
    s->parent = scope_top();
    tls_scope = s;
    return s;
}

/* (parenthesised: library code gets the macro of core/internal.h) */
NT_API nt_scope *(nt_scope_begin)(void) { return scope_open(false); }

nt_scope *nt__scope_begin_lib(void) { return scope_open(true); }

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
    /* s is compared, never read: it may be freed memory */
    nt_scope *c = scope_top();
    while (c && c != s)
        c = c->parent;
    if (!c)
        return nt__err(NULL, NT_ESTATE, "nt_scope_end",
                       "argument 's' (scope %p) is not open on this thread (already ended, "
                       "opened on another thread, or opened before the last nt_shutdown)",
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
    t->tmp = 0; /* kept: the caller may hand it out */
    return t;
}

/* Closes every scope the calling thread left open (nt_shutdown). */
void nt__scopes_close_thread(void)
{
    if (!scope_top())
        return;
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
