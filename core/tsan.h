/* core/tsan.h - makes GLib's locks visible to ThreadSanitizer.
 *
 * GLib's GMutex, GCond and GOnce are built on futexes and atomics inside
 * libglib, which is not instrumented: TSan sees neither the lock nor the
 * order it gives, and reports every access a lock protects as a race.
 * Under -fsanitize=thread (only then: elsewhere this header is empty) the
 * calls are wrapped with __tsan_acquire / __tsan_release on the lock's
 * address, which is exactly the happens-before the lock provides.  Threads
 * (g_thread_new, g_thread_join) and thread keys go through pthread, which
 * TSan intercepts by itself.
 *
 * Include after <glib.h>; internal.h does. */
#ifndef NT_CORE_TSAN_H
#define NT_CORE_TSAN_H

#ifdef __SANITIZE_THREAD__
#include <glib.h>
#include <sanitizer/tsan_interface.h>

#define NT__TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#define NT__TSAN_RELEASE(p) __tsan_release((void *)(p))

static inline void nt__tsan_mutex_lock(GMutex *m)
{
    g_mutex_lock(m);
    __tsan_acquire(m);
}

static inline gboolean nt__tsan_mutex_trylock(GMutex *m)
{
    if (!g_mutex_trylock(m))
        return FALSE;
    __tsan_acquire(m);
    return TRUE;
}

static inline void nt__tsan_mutex_unlock(GMutex *m)
{
    __tsan_release(m);
    g_mutex_unlock(m);
}

/* A wait unlocks and relocks the mutex. */
static inline void nt__tsan_cond_wait(GCond *c, GMutex *m)
{
    __tsan_release(m);
    g_cond_wait(c, m);
    __tsan_acquire(m);
}

static inline gboolean nt__tsan_cond_wait_until(GCond *c, GMutex *m, gint64 end)
{
    __tsan_release(m);
    gboolean r = g_cond_wait_until(c, m, end);
    __tsan_acquire(m);
    return r;
}

/* g_once: what func wrote is released before GLib marks the once done, and
 * acquired by every caller after it returns. */
typedef struct {
    GThreadFunc fn;
    gpointer arg;
    GOnce *once;
} nt__tsan_once_call;

static inline gpointer nt__tsan_once_tramp(gpointer p)
{
    nt__tsan_once_call *c = p;
    gpointer r = c->fn(c->arg);
    __tsan_release(c->once);
    return r;
}

static inline gpointer nt__tsan_once(GOnce *once, GThreadFunc fn, gpointer arg)
{
    nt__tsan_once_call c = {fn, arg, once};
    gpointer r = g_once_impl(once, nt__tsan_once_tramp, &c);
    __tsan_acquire(once);
    return r;
}

#define g_mutex_lock(m) nt__tsan_mutex_lock(m)
#define g_mutex_trylock(m) nt__tsan_mutex_trylock(m)
#define g_mutex_unlock(m) nt__tsan_mutex_unlock(m)
#define g_cond_wait(c, m) nt__tsan_cond_wait(c, m)
#define g_cond_wait_until(c, m, e) nt__tsan_cond_wait_until(c, m, e)
#undef g_once
#define g_once(o, f, a) nt__tsan_once(o, f, a)

#else
#define NT__TSAN_ACQUIRE(p) ((void)0)
#define NT__TSAN_RELEASE(p) ((void)0)
#endif

#endif
