/* core/tlkey.h - per-thread pointers with a destructor, on pthread keys.
 * Needs only pthread, so core/gemm.c (also in the simulator's own library)
 * can use it. */
#ifndef NT_CORE_TLKEY_H
#define NT_CORE_TLKEY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* A per-thread pointer whose destructor runs when its thread ends (a
 * pthread key, made at its first use; nt_init makes the runtime's own
 * early, where a failure is still its error).  Not GLib's GPrivate: GLib
 * aborts the process when the host has no memory for the key or its
 * value's slot.  Define with NT__TLKEY_INIT(destructor). */
typedef struct {
    pthread_mutex_t lock; /* one thread makes the key */
    volatile int made;    /* 1 once key exists (read with acquire) */
    pthread_key_t key;
    void (*dtor)(void *);
} nt__tlkey;
#define NT__TLKEY_INIT(dtor) {PTHREAD_MUTEX_INITIALIZER, 0, 0, (dtor)}

/* Makes k's key if not made yet; false if the system refuses one. */
static inline bool nt__tlkey_make(nt__tlkey *k)
{
    if (__atomic_load_n(&k->made, __ATOMIC_ACQUIRE))
        return true;
    pthread_mutex_lock(&k->lock);
    if (!k->made && pthread_key_create(&k->key, k->dtor) == 0)
        __atomic_store_n(&k->made, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&k->lock);
    return __atomic_load_n(&k->made, __ATOMIC_ACQUIRE);
}

/* The calling thread's value (NULL if none or no key). */
static inline void *nt__tlkey_get(nt__tlkey *k)
{
    return nt__tlkey_make(k) ? pthread_getspecific(k->key) : NULL;
}

/* Sets the calling thread's value; false (nothing set) if there is no key
 * or no memory for the value's slot. */
static inline bool nt__tlkey_set(nt__tlkey *k, void *v)
{
    return nt__tlkey_make(k) && pthread_setspecific(k->key, v) == 0;
}

#endif
