/* core/internal.h - what the modules of ntensor share.  Not installed.
 *
 * The objects:
 *   nt_tensor    a handle: a view (dtype, shape, strides, offset) of a storage,
 *                plus autograd metadata.  User references (refs) and internal
 *                references (irefs, held by queued records, views, autograd)
 *                are counted apart, so a handle the user released is reported
 *                as released even while queued work still uses it.
 *   nt__storage  device memory (in the arena, which is the simulated HBM),
 *                its version (bumped by in-place writes), its last writer and
 *                reader on the streams (for syncs and cross-stream ordering),
 *                and its poison (the error that made its content invalid).
 *   nt__rec      one queued op: inputs, outputs, parameters, the user's call
 *                site.  Recycled through per-stream free lists.
 */
#ifndef NT_CORE_INTERNAL_H
#define NT_CORE_INTERNAL_H

#include <atomic_ops.h>
#include <glib.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <urcu/wfcqueue.h>

#include "ntensor.h"
#include "core/dtype.h"
#include "core/optable.h"
#include "core/tlkey.h"
#include "core/tsan.h"

/* Hot thread-locals (touched on every op) use the initial-exec TLS model:
 * a plain %fs-relative access instead of a __tls_get_addr call.  They are a
 * few words, well within the static TLS surplus a dlopen'ed library gets. */
#define NT_TLS_HOT __attribute__((tls_model("initial-exec")))

#define NT__MAGIC_LIVE 0x4e54544eu /* "NTTN" */
#define NT__MAGIC_DEAD 0xdeadbeefu
/* A handle that was live when nt_shutdown freed its tensor: a use after the
 * next nt_init is NT_ESTATE, not a use after free (core/tensor.c). */
#define NT__MAGIC_OLD 0x0fd0fd0fu
#define NT__MAX_IN 4
#define NT__MAX_OUT 2

/* ------------------------------------------------------------------ */
/* Errors                                                             */
/* ------------------------------------------------------------------ */

/* Drops n references from a count; true if they were the last.  Every drop
 * releases and the last one then acquires (its load reads the value its own
 * drop wrote, the end of every other drop's release sequence), so all that
 * any holder did to the object happens before the freeing thread frees or
 * reuses it -- on weakly ordered CPUs too, and visibly to TSan, which does
 * not model a bare fence. */
static inline bool nt__ref_drop(volatile AO_t *count, AO_t n)
{
    if (AO_fetch_and_add_release(count, (AO_t)0 - n) != n)
        return false;
    (void)AO_load_acquire(count);
    return true;
}

/* A refcounted error carried by poisoned storage until a sync reports it. */
typedef struct nt__errobj {
    volatile AO_t refs;
    int code;
    volatile AO_t reported; /* a sync already returned it */
    char *msg; /* "nt_embedding (train.c:42 in main): index 7 out of range [0, 5)" */
} nt__errobj;

/* Message sizes.  A thread's error message holds at most NT__ERRMSG_MAX - 1
 * bytes (include/ntensor.h says so at nt_last_error_message); a call site
 * is formatted into at most NT__SITE_MAX bytes, a longer file name losing
 * its start, never the line or the function.  Messages are formatted on
 * the stack (no allocation), and one too long for the limit is cut in the
 * middle of its body, never in a function name or a call site
 * (nt__msg_join). */
#define NT__ERRMSG_MAX 4096
#define NT__SITE_MAX 1024
/* Sets the thread's error: "<fn>: <message> (at file:line in func)".
 * Returns code, so callers can `return nt__err(...)`. */
int nt__err(const nt_site *site, int code, const char *fn, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);
/* The host is out of memory: sets NT_EHOSTMEM "<fn>: out of host memory
 * for <what>" (formatted without allocating) and returns the code. */
#define nt__err_hostmem(site, fn, what) \
    nt__err((site), NT_EHOSTMEM, (fn), "out of host memory for %s", (what))
/* Sets the thread's error to a preformatted message. */
void nt__err_set(int code, const char *msg);
/* The thread's error code if a call set one, else dflt: what a caller
 * returns after a callee failed without always saying why. */
static inline int nt__err_or(int dflt)
{
    int rc = nt_last_error();
    return rc ? rc : dflt;
}
/* Writes "file:line in func" (or a symbolised return address) to buf; a
 * file too long for n loses its start ("...dir/f.c:12 in main"). */
void nt__site_format(const nt_site *site, char *buf, size_t n);
/* Plain (macro-less) entry points name their caller by return address. */
#define NT_RA_SITE (&(nt_site){NULL, NULL, 0, __builtin_return_address(0)})
/* head + body + tail into buf[n]; when they do not fit, the middle of
 * body gives way (marked " [...] "), so head and tail (a function name, a
 * call site) stay whole, and so does a call site at the end of body. */
void nt__msg_join(char *buf, size_t n, const char *head, const char *body, const char *tail);
/* Says which call an inner op's error belongs to: the thread's error
 * becomes "<fn>: <message>", unless the message already starts with
 * "<fn>: " (an inner op called with fn as its name); NT_EINVAL if no code
 * was set.  Returns the code. */
int nt__err_within(const char *fn);
nt__errobj *nt__errobj_new(int code, const char *msg);
void nt__errobj_ref(nt__errobj *e);
void nt__errobj_unref(nt__errobj *e);

/* A growable array of pointers with GPtrArray's field names (pdata, len)
 * whose growth fails cleanly (false) instead of aborting the process when
 * the host is out of memory, as GLib's containers do. */
typedef struct {
    void **pdata;
    unsigned len, cap;
} nt__ptrvec;

/* Room for n pointers in all; false if the host has no memory for it. */
static inline bool nt__ptrvec_reserve(nt__ptrvec *v, unsigned n)
{
    if (n <= v->cap)
        return true;
    size_t cap = v->cap ? (size_t)v->cap * 2 : 16;
    if (cap < n)
        cap = n;
    if (cap > UINT32_MAX)
        return false;
    void **p = realloc(v->pdata, cap * sizeof *p);
    if (!p)
        return false;
    v->pdata = p;
    v->cap = (unsigned)cap;
    return true;
}

/* A new empty array with room for `reserve`; NULL if out of memory. */
static inline nt__ptrvec *nt__ptrvec_new(unsigned reserve)
{
    nt__ptrvec *v = calloc(1, sizeof *v);
    if (v && reserve && !nt__ptrvec_reserve(v, reserve)) {
        free(v);
        return NULL;
    }
    return v;
}

static inline bool nt__ptrvec_add(nt__ptrvec *v, void *p)
{
    if (!nt__ptrvec_reserve(v, v->len + 1))
        return false;
    v->pdata[v->len++] = p;
    return true;
}

/* Drops the first k elements. */
static inline void nt__ptrvec_remove_front(nt__ptrvec *v, unsigned k)
{
    memmove(v->pdata, v->pdata + k, (v->len - k) * sizeof *v->pdata);
    v->len -= k;
}

static inline void nt__ptrvec_free(nt__ptrvec *v)
{
    if (v) {
        free(v->pdata);
        free(v);
    }
}


/* Text being built: like a GString, but running out of host memory marks
 * it failed (oom) instead of aborting the process. */
typedef struct {
    char *str; /* NULL until something is appended; free() it */
    size_t len, cap;
    bool oom;
} nt__strbuf;

static inline bool nt__sb_room(nt__strbuf *b, size_t add)
{
    if (b->oom)
        return false;
    if (b->len + add + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + add + 1)
            cap *= 2;
        char *p = realloc(b->str, cap);
        if (!p) {
            b->oom = true;
            return false;
        }
        b->str = p;
        b->cap = cap;
    }
    return true;
}

static inline void nt__sb_append_len(nt__strbuf *b, const char *s, size_t n)
{
    if (!nt__sb_room(b, n))
        return;
    memcpy(b->str + b->len, s, n);
    b->len += n;
    b->str[b->len] = '\0';
}

static inline void nt__sb_append(nt__strbuf *b, const char *s)
{
    nt__sb_append_len(b, s, strlen(s));
}

static inline void nt__sb_append_c(nt__strbuf *b, char ch) { nt__sb_append_len(b, &ch, 1); }

static inline void nt__sb_printf(nt__strbuf *b, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
static inline void nt__sb_printf(nt__strbuf *b, const char *fmt, ...)
{
    char small[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        nt__sb_append_len(b, small, (size_t)n);
        return;
    }
    if (!nt__sb_room(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->str + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* The text, or `fallback` if building it ran out of memory. */
static inline const char *nt__sb_str(const nt__strbuf *b, const char *fallback)
{
    return b->oom || !b->str ? fallback : b->str;
}

/* Zeroes n bytes (a constant multiple of 8) at p with plain vector stores.
 * For the small structs every op clears (its parameters, a storage
 * header): GCC turns a memset of ~100 bytes into `rep stos`, whose start-up
 * costs more than the four stores it replaces. */
typedef uint64_t nt__zv __attribute__((vector_size(32), may_alias, aligned(8)));
typedef uint64_t nt__z8 __attribute__((may_alias, aligned(8)));
static inline __attribute__((always_inline)) void nt__zero(void *p, size_t n)
{
    char *c = p;
    size_t off = 0;
#pragma GCC unroll 16
    for (; off + 32 <= n; off += 32)
        *(nt__zv *)(c + off) = (nt__zv){0};
#pragma GCC unroll 4
    for (; off < n; off += 8)
        *(nt__z8 *)(c + off) = 0;
}

/* ------------------------------------------------------------------ */
/* Storage, handles                                                   */
/* ------------------------------------------------------------------ */

typedef struct nt__storage {
    /* line 1: what kernels read */
    void *data;             /* 64-byte aligned, in the arena; NULL until first
                               use when deferred (nt__storage_data) */
    size_t nbytes;
    volatile AO_t poison;   /* nt__errobj * or 0 */
    volatile AO_t refs;     /* handles pointing here + other holders */
    uint64_t id;            /* for traces and the debugger */
    uint8_t deferred;       /* data is a separate block, taken at first use */
    volatile uint8_t hostdead; /* no handle the host can use is left: only queued
                               records hold it (set once, by nt_release) */
    uint8_t dev;            /* the device whose HBM holds it (never changes) */
    uint8_t borrowed;       /* data lies in another storage's block (a captured
                               program's memory plan, fusion/graph.c): freeing
                               this header frees no device memory */
    uint32_t pend_sid;      /* hostdead: the stream whose pool its bytes were
                               credited to, 0 = none (core/arena.c) */
    /* Simulated ns (on the clock of the core that wrote it) at which its
     * last writer's kernel ended: a kernel that reads it starts no earlier
     * (sim/sim.h).  Written by the worker that ran the writer (or by a
     * collective, with its end), read by the executor of a later reader;
     * the stream ordering between the two orders the accesses too.  Atomic
     * (relaxed) all the same: nt__storage_ready_get / _set. */
    double sim_ready;
    /* made while the thread captured a program: the capture's slot
     * (nt__tl_cap), told when the storage dies (nt__chooks.storage_dead) */
    uint8_t cap;
    /* line 2: what every enqueue writes -- apart, so a worker reading line
     * 1 does not see it change under it on every op */
    _Alignas(64) volatile AO_t last_write; /* packed (stream id, seq) of the last writer */
    volatile AO_t last_read;  /* packed (stream id, seq) of the last reader */
    volatile AO_t version;    /* bumped at enqueue of every in-place write */
    volatile AO_t hrefs;      /* handles on it with user references (refs > 0) */
    volatile uint8_t xstream; /* used by ops of more than one stream */
    /* Its memory given back while its handles stay (nt__storage_release_
     * begin .. nt__storage_refill_begin, dispatcher/resident.c): released is
     * the host's view, set and cleared at those calls and read by every op
     * that takes the storage as an argument; gone is the workers' view, set
     * where the release runs in stream order (data is NULL from then on)
     * and cleared where the refill runs.  Both atomic: one is read by other
     * host threads and by the thread that frees the storage, the other by
     * the worker of another stream. */
    volatile uint8_t released;
    volatile uint8_t gone;
    uint64_t rel_version;  /* released: its version before the release, which
                              the refill puts back */
} nt__storage;

/* Packed (stream id, seq): the seq of an op on a stream, 0 = none. */
#define NT__PACK(sid, seq) (((uint64_t)(sid) << 48) | (uint64_t)(seq))
#define NT__PACK_SID(p) ((uint32_t)((uint64_t)(p) >> 48))
#define NT__PACK_SEQ(p) ((uint64_t)(p) & ((UINT64_C(1) << 48) - 1))

struct nt__ag; /* autograd metadata, autograd/ */

struct nt_tensor {
    uint32_t magic;          /* NT__MAGIC_LIVE while the user holds a ref */
    int8_t ndim;
    uint8_t dtype;
    uint8_t expanded;        /* has a stride-0 dim from expand: not writable */
    uint8_t dev;             /* st->dev, here for the dispatcher's device check
                                (a line it reads anyway) */
    nt__storage *st;
    int64_t offset;          /* in elements */
    int64_t shape[NT_MAX_DIMS];
    int64_t stride[NT_MAX_DIMS]; /* in elements */
    nt_scope *scope;         /* owning scope or NULL */
    int32_t scope_idx;
    uint32_t pool_n;         /* free: handles in the batch this one heads */
    struct nt__ag *ag;       /* autograd: NULL unless part of a graph */
    nt_site site;            /* where it was made */
    uint64_t id;             /* unique, for messages and the debugger */
    nt_tensor *pool_next;    /* free: the next handle of its batch */
    nt_tensor *pool_batch;   /* free, heading a batch: the next batch */
    uint8_t tmp;             /* a temporary of the library's own, never the
                                program's: reused at once, not quarantined
                                (nt__scope_adopt and nt__save set it, nt_keep
                                and a user callback's nt_retain clear it) */
    uint8_t mark;            /* nt_shutdown's rebuild of the free lists */
    /* The counts change on every op that reads the tensor, from the host and
     * from a worker: their own line keeps the view fields above clean. */
    _Alignas(64) volatile AO_t refs; /* user references; 0 = released */
    volatile AO_t irefs;     /* internal references, +1 while refs > 0 */
};

static inline double nt__storage_ready_get(const nt__storage *st)
{
    double t;
    __atomic_load(&st->sim_ready, &t, __ATOMIC_RELAXED);
    return t;
}
static inline void nt__storage_ready_set(nt__storage *st, double t)
{
    __atomic_store(&st->sim_ready, &t, __ATOMIC_RELAXED);
}

/* Validates a tensor argument: NULL keeps the first error (or sets EINVAL);
 * a released handle is NT_ERELEASED.  Returns true if usable. */
bool nt__check_arg(const nt_site *site, const char *fn, const char *arg, nt_tensor *t);
/* The list argument `params` of n live tensors (nt_save, the optimizers):
 * NULL or n <= 0 is NT_EINVAL ("expected at least one <noun>"); then each
 * element is checked by nt__check_arg and, if given, by each(.., i), in
 * order, so the first bad element is the one named. */
bool nt__check_list(const char *fn, nt_tensor *const *ts, int n, const char *noun,
                    bool (*each)(const char *fn, const char *arg, nt_tensor *const *ts, int i));

/* Handles.  nt__tensor_new returns a handle with refs = 1, irefs = 1, for a
 * view of `st` (which it references); ndim/shape/stride copied. */
nt_tensor *nt__tensor_new(nt__storage *st, nt_dtype dt, int ndim, const int64_t *shape,
                          const int64_t *stride, int64_t offset, const nt_site *site);
/* A fresh contiguous tensor with new storage, or NULL + NT_ENOMEM set. */
nt_tensor *nt__tensor_empty(nt_dtype dt, int ndim, const int64_t *shape,
                            const nt_site *site, const char *fn);
void nt__tensor_iref(nt_tensor *t);
void nt__tensor_iunref(nt_tensor *t);
/* Drops n internal references at once. */
void nt__tensor_iunref_n(nt_tensor *t, AO_t n);
/* Registers a fresh reference in the thread's innermost scope, if any; if
 * the scope has no memory to record it, releases t and returns NULL with
 * NT_EHOSTMEM naming fn (the function the user called). */
nt_tensor *nt__scope_adopt(nt_tensor *t, const char *fn);

/* A handle for the runtime's own use on st (which it references): refs = 0,
 * irefs = 1, not counted in st->hrefs, never valid for the user.  A
 * captured program's tensors (fusion/graph.c). */
nt_tensor *nt__tensor_new_internal(nt__storage *st, nt_dtype dt, int ndim, const int64_t *shape,
                                   const int64_t *stride, int64_t offset, const nt_site *site);
/* A storage whose data is `data`, inside a block someone else owns (a
 * captured program's plan): refs = 1, hostdead, never deferred; freeing it
 * frees the header only.  NULL if the host is out of memory. */
nt__storage *nt__storage_borrowed(void *data, size_t nbytes, int dev);

/* The capture slot (1..255) of the program the thread is capturing, 0 if
 * none: storages it makes remember it (nt__storage.cap). */
extern _Thread_local uint8_t nt__tl_cap NT_TLS_HOT;
/* The capture (struct nt__capture *, fusion/graph.h) that the records this
 * thread runs now belong to: set by a stream worker around a batch of a
 * stream being captured (and by a thread running ops inline), NULL
 * otherwise; the executor records each kernel it runs into it. */
struct nt__capture;
extern _Thread_local struct nt__capture *nt__tl_recorder NT_TLS_HOT;

/* The scopes the library opens for its own temporaries (composite ops, the
 * backward pass, optimizer steps) are marked as the library's: a tensor
 * they own dies inside the call that made it, so the program never saw it
 * and its handle skips the quarantine (NT_HANDLE_QUARANTINE counts the
 * handles the program could see).  Library code calls nt_scope_begin() as
 * a program does; this macro makes it the marked kind. */
#ifdef NT_BUILDING_LIBRARY
nt_scope *nt__scope_begin_lib(void);
#define nt_scope_begin() nt__scope_begin_lib()
#endif
/* Except what a user callback makes while it runs (a custom op's forward
 * and backward, a checkpoint's block, gradcheck's function), though a
 * library scope is the innermost: the program holds those.  The library
 * brackets every such call with these (per thread, nestable). */
extern _Thread_local uint32_t nt__user_code NT_TLS_HOT;
static inline void nt__user_code_begin(void) { nt__user_code++; }
static inline void nt__user_code_end(void) { nt__user_code--; }

/* NULL: arena full (no error set).  On device nt__alloc_dev. */
nt__storage *nt__storage_new(size_t nbytes);
/* The device new storage goes on (nt__storage_new, nt__tensor_empty): 0
 * unless a caller sets it -- the dispatcher sets its stream's device around
 * the outputs it makes, the creation functions the current stream's device,
 * a collective the device of each output.  Set it, make, set it back to 0. */
extern _Thread_local uint8_t nt__alloc_dev NT_TLS_HOT;
void nt__storage_ref(nt__storage *st);
void nt__storage_unref(nt__storage *st);

/* Big storages are deferred: their capacity is reserved when the tensor is
 * made (so running out is still NT_ENOMEM at the call), their block is taken
 * when something first touches the data -- normally the kernel that writes
 * it, on the worker.  A value that fusion keeps in registers is never
 * touched, so it never takes memory (nor page-faults a fresh block).
 * nt__storage_materialize: the block, taken now if need be; NULL if the host
 * is out of memory. */
void *nt__storage_materialize(nt__storage *st);
/* The same, for paths that cannot report an error: aborts with a message
 * when the host is out of memory (kernels are materialized beforehand by
 * nt__rec_materialize, which reports it). */
void *nt__storage_data_slow(nt__storage *st);

/* Releasing a big storage's memory while its handles (and the views
 * autograd saved) stay, then filling it again with the same bits: the
 * storage half of ZeRO-3's free-after-forward (docs/sharding.md); the
 * calls that queue the work are nt__mem_release / nt__mem_refill
 * (dispatcher/dispatch.h).
 * - nt__storage_release_begin (host): checks t (a live handle on a big,
 *   resident storage that no captured program owns: else an error naming
 *   fn, nothing changed), remembers the version, and gives the data's
 *   bytes back to the arena's accounting now -- waiting, credited to stream
 *   sid's pool (0: none), so nt_device_bytes_live falls at this call -- and
 *   marks the storage released.  *pool is the pool the bytes went to
 *   (nt__arena_pend): the release's record carries it, not the storage,
 *   since the storage may be refilled and released again on the host
 *   before that record has run.  The block itself goes in
 * - nt__storage_release_run (a stream worker, or the host in deterministic
 *   mode), queued after the storage's last reader: arg is that NT_REC_HOST
 *   record (out[0] the tensor, p.i[0] the pool); the block back, data
 *   NULL, gone set.
 * - nt__storage_refill_begin (host): the capacity reserved again on the
 *   storage's device (for an op of stream sid); NT_ENOMEM naming fn and
 *   the bytes leaves it released.  Then released is clear, and
 * - nt__storage_refill_run, queued before the write that fills it, clears
 *   gone: the writer's kernel takes a block at first use as for a new
 *   storage.  The caller puts rel_version back after queueing that write.
 * A small storage (data in the header's block, nbytes <= 3968) is refused
 * (NT_ENOTSUP): its bytes are a fraction of a header's cost to track, and
 * its block cannot be given back without the header. */
int nt__storage_release_begin(const nt_site *site, const char *fn, nt_tensor *t, uint32_t sid,
                              uint32_t *pool);
void nt__storage_release_run(void *rec);
int nt__storage_refill_begin(const nt_site *site, const char *fn, nt_tensor *t, uint32_t sid);
void nt__storage_refill_run(void *rec);
/* False, with NT_ESTATE naming fn, arg and the tensor, if t's storage is
 * released (t must be a live handle). */
bool nt__check_resident(const nt_site *site, const char *fn, const char *arg, const nt_tensor *t);
static inline bool nt__storage_released(const nt__storage *st)
{
    return __atomic_load_n(&st->released, __ATOMIC_ACQUIRE);
}
/* Storages released and neither refilled nor freed, in the process
 * (core/tensor.c). The dispatcher reads it before each input's flag, so a
 * program that never releases pays one load an op, not one storage line an
 * input. Relaxed: a release on one host thread and an op on another that
 * reads the same storage with nothing ordering them is the caller's race;
 * the worker side checks `gone`, not this. */
extern uint64_t nt__n_released;
static inline bool nt__any_released(void)
{
    return __atomic_load_n(&nt__n_released, __ATOMIC_RELAXED) != 0;
}

static inline void *nt__storage_data(nt__storage *st)
{
    void *d = __atomic_load_n(&st->data, __ATOMIC_ACQUIRE);
    return d ? d : nt__storage_data_slow(st);
}

static inline void *nt__tensor_data(const nt_tensor *t)
{
    return (char *)nt__storage_data(t->st) +
           t->offset * (int64_t)nt__dtype_size((nt_dtype)t->dtype);
}

/* ------------------------------------------------------------------ */
/* Device memory arena (the simulated HBM)                            */
/* ------------------------------------------------------------------ */

/* Each of ndev devices has `capacity` bytes (NT_HBM_BYTES) and its own
 * counts; a function that makes or frees bytes names their device (a
 * storage's dev, or nt__alloc_dev for a new one).  max_waiting:
 * NT_MAX_INFLIGHT_BYTES, 0 = half the capacity. */
void nt__arena_init(uint64_t capacity, uint64_t max_waiting, int ndev);
void nt__arena_shutdown(void);
/* On device nt__alloc_dev.  NULL if over capacity (after waiting for
 * queued work that frees memory). */
void *nt__arena_alloc(size_t nbytes);
/* True (once) if this thread's last failed arena allocation failed for want
 * of host memory rather than device capacity. */
bool nt__arena_host_failed(void);
void nt__arena_free(void *p, size_t nbytes, int dev); /* also ends the reservation */
/* Capacity only, on device nt__alloc_dev for an op of stream nt__alloc_sid
 * (0: none), which may take
 * the stream's pool; waits for queued work when full (streams/ sets
 * nt__arena_progress); false if it still does not fit (nt__arena_too_big:
 * because it is bigger than the whole capacity). */
bool nt__arena_reserve(size_t nbytes);
bool nt__arena_too_big(void);
/* A kernel's workspace, freed with nt__arena_free when the kernel ends: may
 * use capacity reserved for tensors not written yet while the blocks handed
 * out leave room (a worker cannot wait for its own stream); NULL if not. */
void *nt__arena_alloc_scratch(size_t nbytes, int dev);
extern _Thread_local uint32_t nt__alloc_sid NT_TLS_HOT;
/* Runs queued work of every stream (all: to its end; else about half);
 * false on a thread that must not wait (a stream worker). */
extern bool (*nt__arena_progress)(bool all);
/* A storage of nbytes on device dev became hostdead while queued ops still
 * use it: its bytes are waiting, credited to stream sid's pool (0: to
 * none).  Returns the pool it was credited to (0: none -- sid's pool holds
 * another device's bytes), which the storage keeps for the free. */
uint32_t nt__arena_pend(uint32_t sid, size_t nbytes, int dev);
/* Frees such a storage's block (p may be NULL: it never took one). */
void nt__arena_free_pended(void *p, size_t nbytes, uint32_t sid, int dev);
uint64_t nt__arena_live(void);      /* reserved bytes no queued work gives back */
uint64_t nt__arena_live_peak(void);
uint64_t nt__arena_waiting(void);   /* bytes of hostdead storages not yet freed */
uint64_t nt__arena_alloc_waits(void);
uint64_t nt__arena_alloc_wait_ns(void);
void nt__arena_set_max_waiting(uint64_t bytes);
void nt__arena_unreserve(size_t nbytes, int dev); /* a reservation that never got a block */
void *nt__arena_alloc_reserved(size_t nbytes, int dev); /* the block of a reservation;
                                                  NULL: the host is out of memory */
/* The counts below add up every device; the _on forms are one device's. */
uint64_t nt__arena_in_use(void);
uint64_t nt__arena_in_use_on(int dev);
uint64_t nt__arena_live_on(int dev);
uint64_t nt__arena_live_peak_on(int dev); /* its live bytes' peak */
uint64_t nt__arena_waiting_on(int dev);
uint64_t nt__arena_backed(void); /* of in_use: bytes that hold a block */
uint64_t nt__arena_backed_peak(void);
uint64_t nt__arena_peak(void);
uint64_t nt__arena_capacity(void); /* of one device */
void nt__arena_reset_peak(void);

/* ------------------------------------------------------------------ */
/* Shapes                                                             */
/* ------------------------------------------------------------------ */

/* Every tensor's shape keeps sizes >= 0 and the product of its sizes, with
 * 0 counted as 1, at most NT__MAX_NUMEL: then numel, numel * dtype size,
 * contiguous strides and element offsets all fit in int64 with room to
 * spare, and no later size arithmetic can overflow.  2^48 elements is far
 * beyond any device memory. */
#define NT__MAX_NUMEL ((int64_t)1 << 48)
/* Number of elements; saturates at INT64_MAX instead of overflowing (only
 * possible for a shape that nt__shape_ok rejects). */
int64_t nt__numel(int ndim, const int64_t *shape);
/* Whether a and b are the same view: one storage, offset, dtype, shape and
 * strides (two handles on the same elements, read the same way). */
static inline bool nt__same_view(const nt_tensor *a, const nt_tensor *b)
{
    if (a == b)
        return true;
    if (a->st != b->st || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i])
            return false;
    return true;
}
/* True if shape obeys the rule above.  Otherwise false with why filled
 * ("shape[1] is -3; expected a size >= 0", "... more than 2^48 elements"). */
bool nt__shape_ok(int ndim, const int64_t *shape, char *why, size_t whylen);
void nt__contig_strides(int ndim, const int64_t *shape, int64_t *stride);
/* Advances a row-major index over shape; false when it wraps to zero. */
static inline bool nt__idx_next(int64_t *idx, int ndim, const int64_t *shape)
{
    for (int i = ndim - 1; i >= 0; i--) {
        if (++idx[i] < shape[i])
            return true;
        idx[i] = 0;
    }
    return false;
}
bool nt__is_contig(const nt_tensor *t);
/* Broadcast a and b shapes into out; false if incompatible. */
bool nt__broadcast(int na, const int64_t *a, int nb, const int64_t *b, int *nout,
                   int64_t *out);
/* Strides of t viewed at the broadcast shape (ndim, shape): 0 on stretched dims. */
void nt__bcast_strides(const nt_tensor *t, int ndim, const int64_t *shape, int64_t *stride);
/* Matmul shapes with PyTorch's rules (1-D promotion, batch broadcasting). */
typedef struct nt__mminfo {
    int64_t M, K, N;
    int nbatch;                      /* batch dims of the output */
    int64_t batch[NT_MAX_DIMS];
    int64_t a_bstride[NT_MAX_DIMS];  /* element strides of a/b per batch dim (0: broadcast) */
    int64_t b_bstride[NT_MAX_DIMS];
    int64_t a_rs, a_cs, b_rs, b_cs;  /* row/col strides of the matrices */
    int ondim;
    int64_t oshape[NT_MAX_DIMS];
} nt__mminfo;
/* Fills info from a's and b's shapes and strides; false (with a reason in
 * why) if they do not fit. */
bool nt__matmul_info(const nt_tensor *a, const nt_tensor *b, nt__mminfo *info, char *why,
                     size_t whylen);
/* Normalises a possibly negative dim; -1 if out of range. */
int nt__norm_dim(int dim, int ndim);
/* "[2, 3, 4]" into buf */
const char *nt__shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* ------------------------------------------------------------------ */
/* Op records                                                         */
/* ------------------------------------------------------------------ */

typedef struct nt__params {
    double f[3];           /* scalars, eps, fill value, arange start/step */
    int64_t i[NT_MAX_DIMS]; /* permutation and other integer arguments */
    int32_t dim;           /* normalised dim, or NT_DIM_ALL */
    int32_t flag;          /* keepdim and other booleans */
    uint64_t seed;
} nt__params;

typedef enum nt__rectype {
    NT_REC_OP = 0,   /* run op `op` */
    NT_REC_WAIT,     /* wait until deps are done (stream waits on an event) */
    NT_REC_HOST,     /* run fn(arg) on the worker, in order */
} nt__rectype;

typedef struct nt_stream nt__stream; /* streams/stream.h */

typedef struct nt__rec {
    struct cds_wfcq_node node;
    nt__stream *stream;
    uint64_t seq;
    uint8_t type;           /* nt__rectype */
    uint8_t nin, nout, ndeps;
    uint16_t op;
    uint8_t backend;        /* nt__backend */
    uint8_t flags;          /* NT_RECF_* */
    nt_tensor *in[NT__MAX_IN];   /* irefs held; entries may be NULL */
    nt_tensor *out[NT__MAX_OUT]; /* irefs held */
    uint64_t deps[NT__MAX_IN + NT__MAX_OUT]; /* packed cross-stream waits */
    nt__params p;
    nt_site site;           /* the user call that enqueued it */
    const char *bwd_of;     /* "nt_mul" if enqueued by its backward, else NULL */
    const char *fn;         /* the public function that issued it ("nt_linear"
                               for its matmul): op records only */
    uint32_t sid;           /* id of the stream whose seq it holds: with seq,
                               what kernels key random bits with
                               (nt__rec_sr_key), never read through stream */
    uint32_t span;          /* seqs it stands for: seq .. seq + span - 1 (0 or
                               1: its own; a replayed program's record holds
                               the seqs of every op it replays) */
    void (*host_fn)(void *);
    void *host_arg;
    struct nt__rec *pool_next;
} nt__rec;

enum {
    NT_RECF_INPLACE = 1u << 0, /* out[0] aliases in[0] */
    /* Runs in a batch of its own, after the records before it are done
     * (streams/stream.c): a collective member may block until the other
     * members arrive, and another member may be waiting (through a
     * cross-stream dependency) for a record this worker ran before it. */
    NT_RECF_ALONE = 1u << 1,
    /* Runs, but is not part of the program the thread is capturing
     * (fusion/graph.h): state made once on first use, such as an
     * optimizer's moments; the planner never fuses it with captured ops. */
    NT_RECF_NOCAPTURE = 1u << 2,
};

/* The stochastic-rounding key of a CAST record (core/dtype.h): its seed and
 * its place on its stream, so a cast's bits do not depend on the path that
 * runs it (eager, fused, either backend). */
static inline uint64_t nt__rec_sr_key(const nt__rec *r)
{
    return nt__sr_key(r->p.seed, r->sid, r->seq);
}

typedef enum nt__backend {
    NT_BACKEND_CPU = 0,
    NT_BACKEND_SIM = 1,
    NT_BACKEND_COUNT
} nt__backend;

/* Kernel signature: compute r's outputs from its inputs.  Returns 0, or a
 * negative code after nt__kerr() described the problem. */
typedef int (*nt__kernel_fn)(const nt__rec *r);

/* Sets the executing thread's kernel error message (without op/site, which
 * the executor adds) and returns code. */
int nt__kerr(int code, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
const char *nt__kerr_msg(void);

/* Human name of an op id: "add"; api name "nt_add". */
const char *nt__op_name(int op);
const char *nt__op_api(int op);

/* ------------------------------------------------------------------ */
/* Configuration and runtime state                                    */
/* ------------------------------------------------------------------ */

typedef struct nt__config {
    nt_mode mode;
    bool fusion;           /* NT_FUSION */
    nt__backend backend;   /* NT_BACKEND */
    bool require_sim;      /* NT_REQUIRE_SIM */
    double min_sim_flops;  /* NT_MIN_SIM_FLOPS */
    bool check_nan;        /* NT_CHECK_NAN */
    bool stats_at_exit;    /* NT_STATS */
    bool fusion_log;       /* NT_FUSION_LOG */
    bool foreach;          /* NT_FOREACH: small programs in a row share a kernel */
    int lazy_window;       /* NT_LAZY_WINDOW: ops held in lazy mode */
    int max_inflight;      /* NT_MAX_INFLIGHT: backpressure per stream */
    uint64_t max_inflight_bytes; /* NT_MAX_INFLIGHT_BYTES: 0 = half of hbm_bytes */
    uint64_t hbm_bytes;    /* NT_HBM_BYTES: arena capacity */
    char *trace_path;      /* NT_TRACE */
    int log_level;         /* NT_LOG */
    bool sr;               /* NT_STOCHASTIC_ROUNDING */
    uint64_t sr_seed;      /* NT_SR_SEED */
    uint64_t handle_quarantine; /* NT_HANDLE_QUARANTINE: releases before a handle's
                                   memory is reused (UINT64_MAX: never) */
    int devices;           /* NT_SIM_CORES: devices (simulated cores), 1..64 */
    uint64_t seed;         /* NT_SEED: the default generators' seed */
} nt__config;

extern nt__config nt__cfg;

/* Reads one setting.  nt_config_set changes settings while workers and
 * other threads run, so every field is read and written atomically.
 * Relaxed is enough: settings are independent of each other and of the
 * data, and nt_config_set drains the streams before it changes one, so no
 * op depends on seeing a change at a precise moment. */
#define NT__CFG(field)                                                    \
    __extension__({                                                       \
        __typeof__(nt__cfg.field) nt_cfg_v_;                              \
        __atomic_load(&nt__cfg.field, &nt_cfg_v_, __ATOMIC_RELAXED);      \
        nt_cfg_v_;                                                        \
    })

/* Global counters (libatomic_ops).  Each on its own cache line: the host
 * bumps ops_enqueued while a worker bumps ops_executed, and two counters on
 * one line would bounce it between the cores on every op. */
typedef struct {
    volatile AO_t v;
    char pad_[64 - sizeof(AO_t)];
} nt__ctr_line;
typedef struct nt__counters {
    nt__ctr_line ops_enqueued, ops_executed, kernels, ops_poisoned, syncs, sync_wait_ns,
        bytes_to_host, bytes_from_host, cpu_fallbacks;
} nt__counters;
extern nt__counters nt__ctr;
#define NT__COUNT(field, n) AO_fetch_and_add(&nt__ctr.field.v, (AO_t)(n))
#define NT__COUNTER(field) AO_load(&nt__ctr.field.v)

bool nt__initialized(void);
/* Implicit init from every entry point; returns false (error set) on failure. */
bool nt__ensure_init(void);

uint64_t nt__now_ns(void);

/* core/tensor.c: the handle pool and the per-thread scopes, which nt_init
 * and nt_shutdown (dispatcher/config.c) start and stop */
void nt__tensor_pool_init(void);
void nt__tensor_pool_shutdown(void);
void nt__scopes_close_thread(void);
uint64_t nt__tensor_live_handles(void);

/* core/print.c: a ready tensor's values as text (nt_print, nt_format);
 * free() it; NULL when the host is out of memory */
char *nt__format_tensor(nt_tensor *t);

/* Logging through glib (NT_LOG) */
#define NT_LOG_DOMAIN "ntensor"
void nt__log(int level, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* the handler nt__log prints through (GLib's signature; not installed in
 * GLib: no code logs through GLib, and installing it allocates) */
void nt__log_handler(const gchar *domain, GLogLevelFlags level, const gchar *msg, gpointer u);
enum { NT__LOG_ERROR = 0, NT__LOG_WARN = 1, NT__LOG_INFO = 2, NT__LOG_DEBUG = 3 };

#endif
