/* core/handle.h - the runtime's epoch, and the memory and checks of the
 * public objects other than tensors: streams, events, optimizers, loss
 * scalers, communicators and data-parallel sets (tensor handles have their
 * own pool, core/tensor.c).
 *
 * Each such object starts with NT__HOBJ_HEAD: its kind's magic while it
 * lives (the complement once it is destroyed) and the epoch it was made in
 * (nt__epoch; every nt_shutdown starts a new one), or died in.  Its memory comes from
 * nt__hobj_new and goes back with nt__hobj_free, which never hands it to
 * the system: it waits in a FIFO of its kind and is reused only after
 * NT_HANDLE_QUARANTINE more objects of that kind were freed (never, with
 * NT_HANDLE_QUARANTINE=all).  Objects freed before the last nt_shutdown are
 * reused first, oldest first, before new memory is taken, so a program that
 * starts and stops the runtime again and again does not grow.  So a stale
 * pointer -- to an object destroyed, or made before the last nt_shutdown --
 * reads a header that says so (nt__hobj_check), never freed memory, as
 * long as its memory has not been reused.
 *
 * Thread-safe: one lock for the FIFOs; the header is read without it (a
 * stale use races with nothing that the program did right). */
#ifndef NT_CORE_HANDLE_H
#define NT_CORE_HANDLE_H

#include "core/internal.h"

/* The first two fields of every such object. */
#define NT__HOBJ_HEAD \
    uint32_t magic;   \
    uint32_t epoch

typedef struct nt__hobj {
    NT__HOBJ_HEAD;
} nt__hobj;

/* The epoch of the runtime now running (or about to start): objects made
 * under another one are stale.  Written by nt_shutdown only. */
extern volatile uint32_t nt__epoch_now;
static inline uint32_t nt__epoch(void)
{
    return __atomic_load_n(&nt__epoch_now, __ATOMIC_RELAXED);
}
/* nt_shutdown: objects made so far belong to an ended runtime.  Called
 * once every object of the runtime was freed or left to its owner. */
void nt__epoch_next(void);

/* A zeroed object of `size` bytes (64-byte aligned) with magic and epoch
 * set; NULL if the host is out of memory. */
void *nt__hobj_new(size_t size, uint32_t magic);
/* Marks the object destroyed and puts its memory in its kind's FIFO.  p
 * may be NULL. */
void nt__hobj_free(void *p);

/* How many freed objects the FIFOs keep (memory held by design, never
 * returned: tests/test_oom.c does not count it as leaked). */
uint64_t nt__hobj_kept(void);

/* Is p a live object of this kind (of any epoch)? */
static inline bool nt__hobj_live(const void *p, uint32_t magic)
{
    return p && __atomic_load_n(&((const nt__hobj *)p)->magic, __ATOMIC_RELAXED) == magic;
}
/* Was the live object p made under the runtime now running? */
static inline bool nt__hobj_current(const void *p)
{
    return ((const nt__hobj *)p)->epoch == nt__epoch();
}

/* 0 if p is a live object of this kind made under the running runtime.
 * Otherwise sets the thread's error naming fn and its argument `arg` (a
 * `noun`: "event", "stream") and returns it: NT_EINVAL for NULL, for an
 * object destroyed under this runtime and for something else; NT_ESTATE
 * for one made (or destroyed) before the last nt_shutdown. */
int nt__hobj_check(const void *p, uint32_t magic, const nt_site *site, const char *fn,
                   const char *arg, const char *noun);

#endif
