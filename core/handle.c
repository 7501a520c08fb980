/* core/handle.c - the runtime's epoch and the memory of the public objects
 * other than tensors (core/handle.h). */
#include "core/handle.h"

volatile uint32_t nt__epoch_now = 1;

/* A freed object: its header, then the FIFO link (objects are at least 64
 * bytes, so a dead one has room; only the header is read through a stale
 * pointer). */
typedef struct dead {
    NT__HOBJ_HEAD;
    struct dead *next;
} dead;

#define NT_HOBJ_KINDS 8

/* One FIFO per kind (its magic), objects of one size.  `prior` of them, at
 * the head, were freed before the last nt_shutdown: reused first, with no
 * wait. */
static struct {
    GMutex lock; /* static: needs no init, and lives as long as the memory */
    struct kind {
        uint32_t magic;
        size_t size;
        dead *head, *tail;
        uint64_t n, prior;
    } k[NT_HOBJ_KINDS];
} H;

static size_t rounded(size_t size)
{
    size = size < 64 ? 64 : size;
    return (size + 63) & ~(size_t)63;
}

/* The kind of magic, made on first use; NULL if the table is full (then
 * objects of that kind go back to the system: a new kind needs a bigger
 * table).  H.lock held. */
static struct kind *kind_of(uint32_t magic, size_t size)
{
    for (int i = 0; i < NT_HOBJ_KINDS; i++) {
        struct kind *k = &H.k[i];
        if (k->magic == magic)
            return k->size == size ? k : NULL;
        if (!k->magic) {
            k->magic = magic;
            k->size = size;
            return k;
        }
    }
    return NULL;
}

void *nt__hobj_new(size_t size, uint32_t magic)
{
    size = rounded(size);
    void *p = NULL;
    g_mutex_lock(&H.lock);
    struct kind *k = kind_of(magic, size);
    uint64_t q = NT__CFG(handle_quarantine);
    if (q == 0) /* nt__cfg not set up yet */
        q = 4096;
    if (k && k->head && (k->prior || (q != UINT64_MAX && k->n > q))) {
        dead *d = k->head;
        k->head = d->next;
        if (!k->head)
            k->tail = NULL;
        k->n--;
        if (k->prior)
            k->prior--;
        p = d;
    }
    g_mutex_unlock(&H.lock);
    if (!p && !(p = aligned_alloc(64, size)))
        return NULL;
    memset(p, 0, size);
    nt__hobj *h = p;
    h->epoch = nt__epoch();
    __atomic_store_n(&h->magic, magic, __ATOMIC_RELAXED);
    return p;
}

void nt__hobj_free(void *p)
{
    if (!p)
        return;
    dead *d = p;
    uint32_t magic = __atomic_load_n(&d->magic, __ATOMIC_RELAXED);
    /* live (magic) or already marked destroyed (~magic, a stream retired
     * until nt_shutdown) */
    g_mutex_lock(&H.lock);
    struct kind *k = NULL;
    for (int i = 0; i < NT_HOBJ_KINDS && H.k[i].magic; i++)
        if (H.k[i].magic == magic || H.k[i].magic == ~magic)
            k = &H.k[i];
    /* the epoch it died in, from now on: a second destroy in the same
     * runtime says "destroyed", one after nt_shutdown says so */
    d->epoch = nt__epoch();
    __atomic_store_n(&d->magic, k ? ~k->magic : 0, __ATOMIC_RELAXED);
    if (k) {
        d->next = NULL;
        if (k->tail)
            k->tail->next = d;
        else
            k->head = d;
        k->tail = d;
        k->n++;
    }
    g_mutex_unlock(&H.lock);
    if (!k)
        free(p); /* a kind the table had no room for (never made here) */
}

uint64_t nt__hobj_kept(void)
{
    uint64_t n = 0;
    g_mutex_lock(&H.lock);
    for (int i = 0; i < NT_HOBJ_KINDS; i++)
        n += H.k[i].n;
    g_mutex_unlock(&H.lock);
    return n;
}

void nt__epoch_next(void)
{
    g_mutex_lock(&H.lock);
    for (int i = 0; i < NT_HOBJ_KINDS; i++)
        H.k[i].prior = H.k[i].n;
    g_mutex_unlock(&H.lock);
    __atomic_store_n(&nt__epoch_now, nt__epoch() + 1, __ATOMIC_RELAXED);
}

static const char *article(const char *noun)
{
    return strchr("aeiou", noun[0]) || !strncmp(noun, "nt_", 3) ? "an" : "a";
}

int nt__hobj_check(const void *p, uint32_t magic, const nt_site *site, const char *fn,
                   const char *arg, const char *noun)
{
    if (!p)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is NULL", arg);
    const nt__hobj *h = p;
    uint32_t m = __atomic_load_n(&h->magic, __ATOMIC_RELAXED);
    bool old = h->epoch != nt__epoch();
    if (m == magic && !old)
        return 0;
    if ((m == magic || m == ~magic) && old)
        return nt__err(site, NT_ESTATE, fn,
                       "argument '%s' is %s %s made before the last nt_shutdown; make a new "
                       "one after nt_init",
                       arg, article(noun), noun);
    if (m == ~magic)
        return nt__err(site, NT_EINVAL, fn, "argument '%s' is %s %s that was already destroyed",
                       arg, article(noun), noun);
    return nt__err(site, NT_EINVAL, fn, "argument '%s' is not a live %s", arg, noun);
}
