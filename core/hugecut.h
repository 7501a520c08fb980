/* core/hugecut.h - pieces cut from 2 MiB blocks advised onto huge pages.
 *
 * The pools that the fusion planner walks in order (queued op records,
 * streams/stream.c; tensor handles, core/tensor.c) cut their chunks from
 * such blocks once a program keeps many of them alive: on 4 KiB pages the
 * records and handles of a 100k-op batch span thousands of pages, many
 * times what the TLB holds (docs/fusion.md, Cost).  The caller holds its
 * pool's lock and keeps every block it is handed, to free at shutdown. */
#ifndef NT_CORE_HUGECUT_H
#define NT_CORE_HUGECUT_H

#include <stdlib.h>
#include <sys/mman.h>

#define NT_HUGE_BLOCK ((size_t)2 << 20)

typedef struct nt__hugecut {
    char *next;  /* the unused rest of the current block */
    size_t left; /* its bytes */
} nt__hugecut;

/* bytes (<= NT_HUGE_BLOCK) from the current block, starting a new block when
 * the rest is too short.  *block: the new block when one was started (the
 * piece is its start), else NULL.  NULL: no block could be had (the caller
 * takes the heap). */
static inline void *nt__hugecut_take(nt__hugecut *h, size_t bytes, void **block)
{
    *block = NULL;
    if (h->left < bytes) {
        char *b = aligned_alloc(NT_HUGE_BLOCK, NT_HUGE_BLOCK);
        if (!b)
            return NULL;
#ifdef MADV_HUGEPAGE
        (void)madvise(b, NT_HUGE_BLOCK, MADV_HUGEPAGE); /* advice: may be refused */
#endif
        h->next = b;
        h->left = NT_HUGE_BLOCK;
        *block = b;
    }
    void *p = h->next;
    h->next += bytes;
    h->left -= bytes;
    return p;
}

#endif
