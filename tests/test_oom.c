/* tests/test_oom.c - host memory exhaustion: fail the Nth allocation of a
 * small training program, for every N, and check that each failure ends in
 * a clean error (or is absorbed), leaks nothing, and leaves a runtime that
 * computes the right values once memory is back.
 *
 * The executable defines malloc and its siblings, so every allocation of
 * the process -- the library's objects (linked in statically), GLib, libc
 * itself -- goes through them; they forward to the next definition (libc's,
 * or the sanitizer's in an ASan build).  Failures are injected only while a
 * window is armed.  Each N runs in a forked child, so an abort or a crash
 * is counted (and named) instead of ending the test.  Leaks: the child
 * compares its count of live allocations before nt_init and after
 * nt_shutdown (normal build; under ASan the sanitizer's own interceptors
 * (strdup...) allocate behind our back, so there LeakSanitizer's check at
 * the child's exit does the job). */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <execinfo.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/handle.h"
#include "core/internal.h"
#include "ntensor.h"
#include "nt_test.h"

#if defined(__SANITIZE_ADDRESS__)
#define OOM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OOM_ASAN 1
#endif
#endif
#ifndef OOM_ASAN
#define OOM_ASAN 0
#endif
#if OOM_ASAN
#include <sanitizer/lsan_interface.h>
#else
static void __lsan_disable(void) {}
static void __lsan_enable(void) {}
static int __lsan_do_recoverable_leak_check(void) { return 0; }
#endif

/* ---- the interposed allocator ------------------------------------------ */

/* Exported, so GLib and libc resolve to these (the build hides symbols by
 * default). */
#define OOM_EXPORT __attribute__((visibility("default"))) OOM_NOSAN
/* Not instrumented: the sanitizer's own start-up allocates (through dlsym)
 * before its shadow memory exists. */
#define OOM_NOSAN __attribute__((no_sanitize("address", "undefined")))

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);

static atomic_int armed;        /* failures injected only while set */
static atomic_long seen;        /* allocations while armed */
/* Set: only the allocations of the thread that armed count (arm_here). */
static _Atomic pthread_t armed_thread;
static atomic_int armed_one_thread;
static atomic_long fail_at;     /* the one that fails (1-based; 0: none) */
static atomic_int fail_rest;    /* and, if set, every one after it */
static atomic_long injected;    /* failures injected */
static atomic_long live;        /* live allocations, whole process */

/* dlsym may allocate before the real functions are known: those blocks
 * come from here (a size word before each), and are never given back. */
static _Alignas(64) char boot[1 << 20];
static atomic_size_t boot_used;

OOM_NOSAN static void *boot_alloc(size_t n)
{
    size_t at = atomic_fetch_add(&boot_used, (n + 16 + 63) & ~(size_t)63);
    if (at + n + 16 > sizeof boot)
        return NULL;
    memcpy(boot + at, &n, sizeof n);
    return boot + at + 16;
}

OOM_NOSAN static int is_boot(const void *p)
{
    return (const char *)p >= boot && (const char *)p < boot + sizeof boot;
}

OOM_NOSAN static void resolve(void)
{
    static atomic_int state; /* 0 none, 1 resolving, 2 done */
    int expect = 0;
    if (!atomic_compare_exchange_strong(&state, &expect, 1))
        return;
    real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
    atomic_store(&state, 2);
}

/* The sanitizer runtime's own allocations are not failed: AddressSanitizer
 * stops the process (a CHECK) when pthread_getattr_np cannot allocate while
 * it starts a thread.  The failure moves to the next allocation. */
OOM_NOSAN static int exempt(const void *caller)
{
    (void)caller;
    if (!OOM_ASAN)
        return 0;
    void *f[32];
    static _Thread_local int inside;
    if (inside) /* the unwinder's own allocations */
        return 0;
    inside = 1;
    __lsan_disable();
    int n = backtrace(f, 32); /* main() loaded the unwinder already */
    __lsan_enable();
    inside = 0;
    for (int i = 1; i < n; i++) {
        Dl_info info;
        if (dladdr(f[i], &info) && info.dli_fname &&
            (strstr(info.dli_fname, "libasan") || strstr(info.dli_fname, "libubsan")))
            return 1;
    }
    return 0;
}

/* True if this allocation is to fail. */
OOM_NOSAN static int should_fail_from(const void *caller)
{
    if (!atomic_load_explicit(&armed, memory_order_relaxed))
        return 0;
    if (atomic_load(&armed_one_thread) && !pthread_equal(pthread_self(), atomic_load(&armed_thread)))
        return 0;
    long k = atomic_fetch_add(&seen, 1) + 1;
    long at = atomic_load(&fail_at);
    if (k == at || (at && k > at && atomic_load(&fail_rest))) {
        if (exempt(caller)) {
            atomic_store(&fail_at, k + 1);
            return 0;
        }
        atomic_fetch_add(&injected, 1);
        static int bt = -1;
        if (bt < 0)
            bt = getenv("OOM_BT") != NULL;
        if (bt) { /* debugging aid: where the failure lands */
            void *frames[24];
            atomic_store(&armed, 0);
            int nf = backtrace(frames, 24);
            backtrace_symbols_fd(frames, nf, 2);
            atomic_store(&armed, 1);
        }
        return 1;
    }
    return 0;
}
#define should_fail() should_fail_from(__builtin_return_address(0))

/* Debugging aid (OOM_TRACK=1): which allocations outlive the child's run,
 * with where they were made.  A fixed table, so tracking allocates nothing;
 * mapped only when asked for (LeakSanitizer would scan 15 MB of it in
 * every child). */
#define TRACK_CAP (1 << 18)
static atomic_int tracking;
static struct track_entry {
    _Atomic(void *) p;
    void *where[6];
} *track;

OOM_NOSAN static void track_add(void *p)
{
    size_t h = ((uintptr_t)p >> 4) & (TRACK_CAP - 1);
    for (size_t i = 0; i < TRACK_CAP; i++, h = (h + 1) & (TRACK_CAP - 1)) {
        void *expect = NULL;
        if (atomic_compare_exchange_strong(&track[h].p, &expect, p)) {
            void *f[8] = {0};
            static _Thread_local int inside;
            if (!inside) { /* backtrace may allocate the first time */
                inside = 1;
                backtrace(f, 8);
                inside = 0;
            }
            memcpy(track[h].where, f, sizeof track[h].where);
            return;
        }
    }
}

OOM_NOSAN static void track_del(void *p)
{
    size_t h = ((uintptr_t)p >> 4) & (TRACK_CAP - 1);
    for (size_t i = 0; i < TRACK_CAP; i++, h = (h + 1) & (TRACK_CAP - 1)) {
        void *cur = atomic_load(&track[h].p);
        if (cur == p) {
            atomic_store(&track[h].p, (void *)1); /* a tombstone */
            return;
        }
        if (!cur)
            return;
    }
}

static void track_dump(void)
{
    for (size_t h = 0; h < TRACK_CAP; h++) {
        void *p = atomic_load(&track[h].p);
        if (p && p != (void *)1) {
            fprintf(stderr, "live %p from", p);
            fprintf(stderr, "\n");
            backtrace_symbols_fd(track[h].where, 6, 2);
        }
    }
}

OOM_NOSAN static void *counted(void *p)
{
    if (p) {
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
        if (atomic_load_explicit(&tracking, memory_order_relaxed))
            track_add(p);
    }
    return p;
}

OOM_EXPORT void *malloc(size_t n)
{
    if (!real_malloc) {
        resolve();
        if (!real_malloc)
            return boot_alloc(n);
    }
    if (should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(real_malloc(n));
}

OOM_EXPORT void *calloc(size_t m, size_t n)
{
    if (!real_calloc) {
        resolve();
        if (!real_calloc)
            return boot_alloc(m * n); /* boot is zeroed, never reused */
    }
    if (should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(real_calloc(m, n));
}

OOM_EXPORT void free(void *p)
{
    if (!p || is_boot(p))
        return;
    atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
    if (atomic_load_explicit(&tracking, memory_order_relaxed))
        track_del(p);
    real_free(p);
}

OOM_EXPORT void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (is_boot(p)) { /* a start-up block: copy it out */
        size_t old;
        memcpy(&old, (const char *)p - 16, sizeof old);
        void *q = malloc(n);
        if (q)
            memcpy(q, p, n < old ? n : old);
        return q;
    }
    if (n == 0) {
        free(p);
        return NULL;
    }
    if (should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    void *q = real_realloc(p, n);
    if (q && atomic_load_explicit(&tracking, memory_order_relaxed)) {
        track_del(p);
        track_add(q);
    }
    return q;
}

OOM_EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    if (!real_posix_memalign)
        resolve();
    if (should_fail())
        return ENOMEM;
    int rc = real_posix_memalign(out, align, n);
    if (rc == 0)
        counted(*out);
    return rc;
}

OOM_EXPORT void *aligned_alloc(size_t align, size_t n)
{
    if (!real_aligned_alloc)
        resolve();
    if (should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(real_aligned_alloc(align, n));
}

OOM_EXPORT void *memalign(size_t align, size_t n)
{
    if (!real_memalign)
        resolve();
    if (should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(real_memalign(align, n));
}

static void arm(long n)
{
    atomic_store(&seen, 0);
    atomic_store(&injected, 0);
    atomic_store(&fail_at, n);
    atomic_store(&armed, 1);
}

/* arm, counting this thread's allocations only: a worker's failure
 * poisons a kernel's outputs (the training loops check that), and how many
 * a worker makes meanwhile depends on timing */
static void arm_here(long n)
{
    atomic_store(&armed_thread, pthread_self());
    atomic_store(&armed_one_thread, 1);
    arm(n);
}

static long disarm(void)
{
    atomic_store(&armed, 0);
    atomic_store(&armed_one_thread, 0);
    return atomic_load(&seen);
}

/* ---- the program --------------------------------------------------------- */

#define B 4  /* batch */
#define I 6  /* inputs */
#define C 3  /* classes */
#define STEPS 2
#define BIG 2048 /* elements of a tensor too big to share its header's block */

typedef struct {
    double loss[STEPS];
    double scale;
    float w[C * I], b[C];
} result;

static char ckpt[300];
static bool do_print; /* children only: their stdout goes to /dev/null */

/* The checkpoint file of this process: in memory (/dev/shm) where there
 * is one, since every child saves one (and fsyncs it) and a disk would make
 * the loop wait on it. */
static void ckpt_name(void)
{
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(ckpt, sizeof ckpt, "%s/nt_test_oom_%ld.ckpt", dir, (long)getpid());
}

/* relu(x w^T + b), w and b reached through ctx: run under nt_checkpoint. */
static int oom_block(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    nt_tensor **p = ctx;
    (void)n_in, (void)n_out;
    out[0] = nt_relu(nt_linear(in[0], p[0], p[1]));
    return out[0] ? 0 : nt_last_error();
}

/* A linear classifier (its layer checkpointed) trained for STEPS AdamW steps through a loss scaler,
 * saved and loaded back, its weights read, formatted and printed.  Returns 0 or the first error code; frees
 * everything it made on every path. */
static int program(result *out)
{
    static float bigv[BIG];
    for (int i = 0; i < BIG; i++)
        bigv[i] = (float)(i % 7) / 64.0f;
    float wv[C * I], xv[B * I];
    int32_t yv[B] = {0, 2, 1, 2};
    for (int i = 0; i < C * I; i++)
        wv[i] = (float)((i * 7) % 11 - 5) / 8.0f;
    for (int i = 0; i < B * I; i++)
        xv[i] = (float)((i * 5) % 13 - 6) / 4.0f;
    int rc = 0;
    nt_scope *s = NULL;
    nt_optim *opt = NULL;
    nt_grad_scaler *sc = NULL;
    nt_tensor *p[2] = {NULL, NULL};
    char *txt = NULL;

    p[0] = nt_from_host(wv, NT_F32, 2, (int64_t[]){C, I});
    p[1] = nt_zeros(NT_F32, 1, (int64_t[]){C});
    if (!p[0] || !p[1])
        goto fail;
    if ((rc = nt_set_requires_grad(p[0], true)) || (rc = nt_set_requires_grad(p[1], true)))
        goto out;
    opt = nt_optim_adamw(p, 2, 0.05, 0.9, 0.999, 1e-8, 0.01);
    if (!opt)
        goto fail;
    sc = nt_grad_scaler_create(NULL);
    if (!sc)
        goto fail;
    for (int step = 0; step < STEPS; step++) {
        s = nt_scope_begin();
        if (!s)
            goto fail;
        nt_tensor *x = nt_from_host(xv, NT_F32, 2, (int64_t[]){B, I});
        nt_tensor *y = nt_from_host(yv, NT_I32, 1, (int64_t[]){B});
        nt_tensor *h = NULL;
        if (x && (rc = nt_checkpoint(oom_block, p, &x, 1, &h, 1)))
            goto out;
        nt_tensor *hh = nt_cat((nt_tensor *[]){nt_mul_scalar(h, 2.0), h}, 2, 1);
        /* a tensor over 4 KiB: its block is taken apart from its header */
        nt_tensor *big = nt_from_host(bigv, NT_F32, 1, (int64_t[]){BIG});
        nt_tensor *loss = nt_add(nt_cross_entropy(hh, y), nt_mean(big, NT_DIM_ALL, false));
        /* two slices of hh after the loss's other use of it: their
         * gradients share one buffer (autograd/tape.c, struct scat) */
        nt_tensor *hs = nt_sub(nt_slice(hh, 1, 0, C, 1), nt_slice(hh, 1, C, 2 * C, 1));
        loss = nt_add(loss, nt_mean(hs, NT_DIM_ALL, false));
        if (!loss)
            goto fail;
        nt_tensor *scaled = nt_grad_scaler_scale(sc, loss);
        if (!scaled)
            goto fail;
        if ((rc = nt_backward(scaled)) || (rc = nt_grad_scaler_step(sc, opt)) < 0 ||
            (rc = nt_grad_scaler_update(sc)) || (rc = nt_item(loss, &out->loss[step])) ||
            (rc = nt_optim_zero_grad(opt)))
            goto out;
        rc = nt_scope_end(s);
        s = NULL;
        if (rc)
            goto out;
    }
    if ((rc = nt_sync()) || (rc = nt_checkpoint_save(ckpt, p, 2, opt, sc)) ||
        (rc = nt_checkpoint_load(ckpt, p, 2, opt, sc)))
        goto out;
    out->scale = nt_grad_scaler_get_scale(sc);
    if ((rc = nt_to_host(p[0], out->w, sizeof out->w)) ||
        (rc = nt_to_host(p[1], out->b, sizeof out->b)))
        goto out;
    txt = nt_format(p[1]);
    if (!txt)
        goto fail;
    if (strncmp(txt, "tensor([", 8) != 0) {
        rc = -1000;
        goto out;
    }
    if (do_print)
        rc = nt_print(p[0]);
    goto out;
fail:
    rc = nt_last_error();
    if (rc == 0)
        rc = -1001; /* failed without an error: a bug */
out:
    free(txt);
    if (s)
        nt_scope_end(s);
    nt_grad_scaler_destroy(sc);
    nt_optim_destroy(opt);
    nt_release(p[0]);
    nt_release(p[1]);
    return rc;
}

static int same_result(const result *a, const result *b)
{
    return memcmp(a, b, sizeof *a) == 0;
}

/* ---- the loop ------------------------------------------------------------ */

/* Child exit codes. */
enum { CH_OK = 0, CH_ERROR = 10, CH_LEAK = 11, CH_WRONG = 12, CH_NOERR = 13, CH_INIT = 14 };

/* What a loop's window of injected failures holds. */
typedef struct {
    const char *backend; /* NT_BACKEND for the program */
    bool train;          /* the program too, not only nt_init and the setting */
    bool cold;           /* the process's first nt_init (GLib's one-time set-up) */
} loop_kind;

static result reference;
static const loop_kind *kind;
static bool parent_inited; /* this process has run nt_init (a cold loop needs it never had) */

/* The window: nt_init, the backend's setting and (kind->train) the program.
 * Returns 0 or the first error code. */
static int window(result *r)
{
    int rc = nt_init();
    if (rc == 0)
        rc = nt_config_set("NT_BACKEND", kind->backend);
    if (rc == 0 && kind->train)
        rc = program(r);
    return rc;
}

/* One cycle in a child: the window with allocation N failing, the outcome
 * checked, then with memory back nt_init (again, if it failed) and the
 * program, whose values must be right; then nt_shutdown.  Returns the
 * status (CH_OK if the failure was absorbed, CH_ERROR if it ended in a
 * clean error) and sets *leaked to the allocations still live. */
static int cycle(long n, int *code_out, long *leaked)
{
    long live0 = atomic_load(&live);
    /* freed handles of objects (optimizers, scalers, streams ...) wait in
     * their quarantine (core/handle.h), reused only after many more: how
     * many a cycle adds depends on where its failure lands, and it is memory
     * kept by design, not leaked */
    long kept0 = (long)nt__hobj_kept();
    nt_clear_error();
    result r;
    memset(&r, 0, sizeof r);
    arm(n);
    int rc = window(&r);
    disarm();
    int status = CH_OK;
    if (rc != 0) {
        const char *msg = nt_last_error_message();
        /* A clean error: a real NT_E* code with a message. */
        if (rc <= -1000 || !msg || !*msg || strcmp(nt_strerror(rc), "unknown error") == 0) {
            fprintf(stderr, "N=%ld: rc %d, message \"%s\"\n", n, rc, msg ? msg : "(null)");
            status = CH_NOERR;
        } else {
            status = CH_ERROR;
        }
        if (getenv("OOM_VERBOSE"))
            fprintf(stderr, "N=%ld: rc %d: %s\n", n, rc, msg);
    } else if (kind->train && !same_result(&r, &reference)) {
        fprintf(stderr, "N=%ld: absorbed, but the values differ\n", n);
        status = CH_WRONG;
    }
    /* Memory is back: the same runtime (or a new one, where nt_init
     * failed) must now compute the right values. */
    nt_clear_error();
    memset(&r, 0, sizeof r);
    int rc2 = nt_init();
    if (rc2 == 0)
        rc2 = nt_config_set("NT_BACKEND", kind->backend);
    if (rc2 == 0)
        rc2 = program(&r);
    if (status != CH_NOERR && (rc2 != 0 || !same_result(&r, &reference))) {
        fprintf(stderr, "N=%ld: rerun gave rc %d (%s), values %s\n", n, rc2,
                nt_last_error_message(), same_result(&r, &reference) ? "right" : "wrong");
        status = CH_WRONG;
    }
    nt_shutdown();
    *leaked = atomic_load(&live) - live0 - ((long)nt__hobj_kept() - kept0);
    *code_out = status == CH_ERROR ? rc : 0;
    return status;
}

/* In a child.  A failure may send the program down a path the warm-up did
 * not take, where GLib makes a one-time allocation it keeps for the
 * process (a GPrivate's key; in a cold loop, everything GLib sets up
 * once): so an allocation count that moved is checked with a second,
 * identical cycle, which must leave the count where it was. */
static int child(long n, int *code_out)
{
    if (getenv("OOM_TRACK")) {
        void *f[8];
        backtrace(f, 8); /* loads what it needs now */
        track = mmap(NULL, TRACK_CAP * sizeof *track, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (track != MAP_FAILED)
            atomic_store(&tracking, 1);
    }
    long leaked;
    int status = cycle(n, code_out, &leaked);
    if (!OOM_ASAN && leaked != 0 && status != CH_WRONG && status != CH_NOERR) {
        int code2;
        long leaked2;
        int status2 = cycle(n, &code2, &leaked2);
        if (status2 != CH_OK && status2 != CH_ERROR)
            return status2;
        if (leaked2 != 0) {
            fprintf(stderr, "N=%ld: %ld allocations leaked (rc %d)\n", n, leaked2, *code_out);
            if (atomic_load(&tracking)) {
                atomic_store(&tracking, 0);
                track_dump();
            }
            status = CH_LEAK;
        }
    }
    return status;
}

typedef struct {
    long points, absorbed, errors, aborts, crashes, hangs, leaks, wrong, noerr, other;
    long by_code[32];
} tally;

/* A child still running: its pid, the pipe its error code comes back on,
 * its N. */
typedef struct {
    pid_t pid;
    int fd;
    long n;
} slot;

/* A child that takes longer than this is stuck (a deadlock: a point takes
 * well under a second, even under a sanitizer); SIGALRM ends it and it is
 * counted as a hang. */
static unsigned hang_s(void)
{
    const char *e = getenv("OOM_HANG_S");
    return e && atoi(e) > 0 ? (unsigned)atoi(e) : 120;
}

/* Forks the child for point n. */
static slot start_point(long n)
{
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        /* cmocka catches these; here they must end the child, to be counted */
        static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGALRM};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
            signal(sigs[i], SIG_DFL);
        alarm(hang_s());
        if (!freopen("/dev/null", "w", stdout))
            _exit(CH_INIT);
        do_print = true;
        /* its own checkpoint file: children run side by side */
        ckpt_name();
        int code = 0;
        int st = child(n, &code);
        (void)!write(pipefd[1], &code, sizeof code);
        close(pipefd[1]);
        unlink(ckpt);
        char tmp[320];
        snprintf(tmp, sizeof tmp, "%s.tmp", ckpt);
        unlink(tmp);
        /* Under ASan, LeakSanitizer checks now (without stopping the
         * process); then no exit handlers: the parent's cmocka state is
         * not ours to tear down. */
        if (OOM_ASAN && st != CH_WRONG && st != CH_NOERR && __lsan_do_recoverable_leak_check()) {
            fprintf(stderr, "N=%ld: LeakSanitizer reported a leak\n", n);
            st = CH_LEAK;
        }
        _exit(st);
    }
    close(pipefd[1]);
    return (slot){pid, pipefd[0], n};
}

/* Counts the child of sl, which ended with wait status ws. */
static void finish_point(const slot *sl, int ws, tally *t)
{
    long n = sl->n;
    int code = 0;
    if (read(sl->fd, &code, sizeof code) != sizeof code)
        code = 0;
    close(sl->fd);
    t->points++;
    if (WIFSIGNALED(ws)) {
        /* GLib's g_error stops with SIGTRAP (a breakpoint), abort() with SIGABRT. */
        if (WTERMSIG(ws) == SIGABRT || WTERMSIG(ws) == SIGTRAP)
            t->aborts++;
        else if (WTERMSIG(ws) == SIGALRM)
            t->hangs++;
        else
            t->crashes++;
        fprintf(stderr, "N=%ld: %s (signal %d)\n", n,
                WTERMSIG(ws) == SIGALRM ? "hung" : "killed", WTERMSIG(ws));
        return;
    }
    switch (WEXITSTATUS(ws)) {
    case CH_OK: t->absorbed++; break;
    case CH_ERROR:
        t->errors++;
        if (code < 0 && -code < 32)
            t->by_code[-code]++;
        break;
    case CH_LEAK:
        t->leaks++;
        fprintf(stderr, "N=%ld: leaked\n", n);
        break;
    case CH_WRONG: t->wrong++; break;
    case CH_NOERR: t->noerr++; break;
    default:
        t->other++;
        fprintf(stderr, "N=%ld: child exit status %d\n", n, WEXITSTATUS(ws));
        break;
    }
}

/* Children at once: one per processor (OOM_JOBS to change).  Each is a
 * process of its own, so they run side by side. */
static int jobs(void)
{
    const char *e = getenv("OOM_JOBS");
    long j = e ? atol(e) : sysconf(_SC_NPROCESSORS_ONLN);
    return j < 1 ? 1 : j > 64 ? 64 : (int)j;
}

/* The window run once with no failure, counting its allocations, in a
 * child: a cold loop's parent must not run nt_init itself.  The reference
 * values come back too (computed after the window, memory on). */
static long probe_cold(void)
{
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        result r;
        memset(&r, 0, sizeof r);
        arm(0);
        int rc = window(&r);
        long total = disarm();
        if (rc == 0 && !kind->train)
            rc = program(&r);
        nt_shutdown();
        if (rc != 0)
            total = -1;
        (void)!write(pipefd[1], &total, sizeof total);
        (void)!write(pipefd[1], &r, sizeof r);
        _exit(0);
    }
    close(pipefd[1]);
    long total = 0;
    assert_int_equal(read(pipefd[0], &total, sizeof total), sizeof total);
    assert_int_equal(read(pipefd[0], &reference, sizeof reference), sizeof reference);
    close(pipefd[0]);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    return total;
}

/* The window run once here with no failure, counting its allocations,
 * after a warm-up: GLib's and libc's one-time allocations (thread pools,
 * locale, dlerror buffers) are made here, not counted as leaks in the
 * children. */
static long probe_warm(void)
{
    parent_inited = true;
    memset(&reference, 0, sizeof reference);
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", kind->backend), 0);
    assert_int_equal(program(&reference), 0);
    nt_shutdown();
    result r;
    memset(&r, 0, sizeof r);
    arm(0);
    int rc = window(&r);
    long total = disarm();
    assert_int_equal(rc, 0);
    if (kind->train)
        assert_true(same_result(&r, &reference));
    nt_shutdown();
    return total;
}

/* Under NT_TEST_QUICK (scripts/test.sh's sanitizer runs) every QUICK_STRIDE-th
 * point of a training loop runs (nt_init's few all run): the normal build
 * runs every one. */
#define QUICK_STRIDE 16

static void run_loop(const loop_kind *k)
{
    kind = k;
    if (k->cold)
        assert_false(parent_inited);
    long total = k->cold ? probe_cold() : probe_warm();
    assert_true(total > 0);

    /* Threads make the count vary a little from run to run: go a bit past
     * it.  OOM_STRIDE samples every k-th point (OOM_FIRST, OOM_LAST: a
     * range), for debugging. */
    long stride = getenv("NT_TEST_QUICK") && k->train ? QUICK_STRIDE : 1;
    const char *e = getenv("OOM_STRIDE");
    if (e)
        stride = atol(e) > 0 ? atol(e) : 1;
    long first = getenv("OOM_FIRST") ? atol(getenv("OOM_FIRST")) : 1;
    long last = getenv("OOM_LAST") ? atol(getenv("OOM_LAST")) : total + total / 20 + 8;
    tally t;
    memset(&t, 0, sizeof t);
    slot run[64];
    int nj = jobs(), running = 0;
    long n = first;
    while (n <= last || running) {
        while (running < nj && n <= last) {
            run[running++] = start_point(n);
            n += stride;
        }
        int ws;
        pid_t pid = waitpid(-1, &ws, 0);
        assert_true(pid > 0);
        int i = 0;
        while (i < running && run[i].pid != pid)
            i++;
        assert_true(i < running);
        finish_point(&run[i], ws, &t);
        run[i] = run[--running];
    }
    printf("# malloc-failure loop over nt_init%s, NT_BACKEND=%s%s: %ld allocations; %ld "
           "points (N = %ld..%ld step %ld, %d at once): %ld absorbed, %ld clean errors, "
           "%ld aborts, %ld crashes, %ld hangs, %ld leaks, %ld wrong values, %ld errors "
           "without a code, %ld other%s\n",
           k->train ? " and the program" : "", k->backend,
           k->cold ? " (the process's first nt_init)" : "", total, t.points, first, last,
           stride, nj, t.absorbed, t.errors, t.aborts, t.crashes, t.hangs, t.leaks, t.wrong,
           t.noerr, t.other,
           OOM_ASAN ? " (leaks: LeakSanitizer)" : " (leaks: live-allocation count)");
    for (int c = 1; c < 32; c++)
        if (t.by_code[c])
            printf("#   %ld x %s (%d)\n", t.by_code[c], nt_strerror(-c), -c);
    fflush(stdout);
    assert_int_equal(t.aborts, 0);
    assert_int_equal(t.crashes, 0);
    assert_int_equal(t.hangs, 0);
    assert_int_equal(t.leaks, 0);
    assert_int_equal(t.wrong, 0);
    assert_int_equal(t.noerr, 0);
    assert_int_equal(t.other, 0);
}

/* nt_init as the process's first: what GLib sets up once (thread keys,
 * the first thread) fails too.  The program runs after, memory back. */
static void test_malloc_failure_loop_first_init(void **state)
{
    (void)state;
    static const loop_kind k = {"sim", false, true};
    run_loop(&k);
}

static void test_malloc_failure_loop_sim(void **state)
{
    (void)state;
    static const loop_kind k = {"sim", true, false};
    run_loop(&k);
}

static void test_malloc_failure_loop_cpu(void **state)
{
    (void)state;
    static const loop_kind k = {"cpu", true, false};
    run_loop(&k);
}

/* The checks themselves: a child that leaks one block is caught, by the
 * live count (normal build) or by LeakSanitizer (ASan build). */
static void test_leak_check_catches_a_leak(void **state)
{
    (void)state;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        long live0 = atomic_load(&live);
        static void *volatile keep;
        keep = malloc(48);
        keep = NULL; /* lost */
        (void)keep;
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) /* the expected report would read as a failure in the log */
            dup2(devnull, 2);
        int caught = OOM_ASAN ? __lsan_do_recoverable_leak_check() != 0
                              : atomic_load(&live) - live0 == 1;
        _exit(caught ? 0 : 1);
    }
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
}

/* Reporting an error needs no memory: the message is formatted on the
 * stack, and an error object the host has no memory for is replaced by a
 * static one that keeps the code. */
static void test_errors_need_no_memory(void **state)
{
    (void)state;
    parent_inited = true;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    atomic_store(&fail_rest, 1); /* no allocation succeeds in these windows */
    arm(1);
    int rc = nt_zero_grad(NULL);
    disarm();
    assert_int_equal(rc, NT_EINVAL);
    assert_string_equal(nt_last_error_message(),
                        "nt_zero_grad: argument 't' is NULL");

    arm(1);
    nt__errobj *e = nt__errobj_new(NT_ERANGE, "idx[3] = 7 is out of range");
    disarm();
    atomic_store(&fail_rest, 0);
    assert_true(atomic_load(&injected) >= 1);
    assert_non_null(e);
    assert_int_equal(e->code, NT_ERANGE);
    assert_non_null(strstr(e->msg, "value out of range"));
    assert_non_null(strstr(e->msg, "out of host memory"));
    nt__errobj_ref(e);
    nt__errobj_unref(e);
    nt__errobj_unref(e); /* static: never freed */
    assert_int_equal(e->code, NT_ERANGE);

    e = nt__errobj_new(NT_ERANGE, "idx[3] = 7 is out of range"); /* memory is back */
    assert_string_equal(e->msg, "idx[3] = 7 is out of range");
    nt__errobj_unref(e);
    assert_string_equal(nt_strerror(NT_EHOSTMEM), "out of host memory");
    assert_string_equal(nt_strerror(NT_ENOMEM), "out of device memory");
    nt_shutdown();
}

/* ---- composites: the error is the caller's -------------------------------
 *
 * A public function built from other calls (a scope of its own, inner ops)
 * that meets a host memory failure returns NT_EHOSTMEM naming itself, not
 * an inner function (nt_scope_end's "argument 's' is NULL", nt_norm's
 * name).  Each composite below runs once to warm up, then with its Nth
 * allocation failing, N = 1, 2 ... until a run meets no failure: with no
 * scope open, then inside a scope whose list of tensors is full (64), so
 * that taking the result into it needs memory too.  N counts the calling
 * thread's allocations only (arm_here): a stream worker's in between would
 * move the failure off the composite by a count that depends on timing
 * (under ASan a run once never reached the host's and saw no failure). */
typedef struct {
    nt_tensor *x, *w, *b, *logits, *labels, *m2, *p[2], *loss;
    nt_optim *opt;
    nt_grad_scaler *sc;
    int op;
} comp_ctx;

static nt_tensor *comp_square(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mul(in[0], in[0]);
}

static int comp_block(void *ctx, nt_tensor *const *in, int n_in, nt_tensor **out, int n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = nt_tanh(nt_mul_scalar(in[0], 0.5));
    return out[0] ? 0 : nt_last_error();
}

/* A tensor result: 0, or the error with the result NULL. */
static int comp_t(nt_tensor *t)
{
    if (!t)
        return nt_last_error() ? nt_last_error() : -1001;
    nt_release(t);
    return 0;
}

static int comp_run(int k, comp_ctx *c)
{
    switch (k) {
    case 0: return comp_t(nt_linear(c->x, c->w, c->b));
    case 1: return comp_t(nt_cross_entropy_ex(c->logits, c->labels, 2, 0.1));
    case 2: return comp_t(nt_repeat(c->x, (int64_t[]){2, 1}, 2));
    case 3: return comp_t(nt_tril(c->m2, 0));
    case 4: return comp_t(nt_clip_grad_norm(c->p, 2, 0.5));
    case 5: return nt_optim_step(c->opt);
    case 6: return comp_t(nt_grad_scaler_scale(c->sc, c->loss));
    case 7: {
        int rc = nt_grad_scaler_unscale(c->sc, c->opt);
        if (rc >= 0)
            rc = nt_grad_scaler_update(c->sc); /* so that the next unscale is allowed */
        return rc;
    }
    case 8: return nt_gradcheck(comp_square, &c->p[1], 1, NULL, 1e-2, 1e-2, 1e-2);
    case 9: return comp_t(nt_op_call(c->op, &c->x));
    case 10: {
        nt_tensor *out = NULL;
        int rc = nt_checkpoint(comp_block, NULL, &c->p[1], 1, &out, 1);
        if (!rc)
            nt_release(out);
        return rc;
    }
    case 11: return nt_load(ckpt, c->p, 2, c->opt);
    }
    return -1002;
}

static const char *const COMP_FN[] = {
    "nt_linear", "nt_cross_entropy_ex", "nt_repeat", "nt_tril", "nt_clip_grad_norm",
    "nt_optim_step", "nt_grad_scaler_scale", "nt_grad_scaler_unscale", "nt_gradcheck",
    "nt_op_call(comp_square)", "nt_checkpoint", "nt_load",
};
#define NCOMP ((int)(sizeof COMP_FN / sizeof COMP_FN[0]))

/* Fresh tensors, optimizer and scaler for one run: a kernel that failed
 * in an earlier run poisoned what it wrote in place (the gradients, the
 * parameters), and a poisoned input is reported by every later run. */
static void comp_setup(comp_ctx *c, int op)
{
    float xv[12], lv[12];
    for (int i = 0; i < 12; i++)
        xv[i] = (float)(i % 5 - 2) / 4.0f, lv[i] = (float)(i % 3) / 2.0f;
    int32_t yv[4] = {0, 2, 1, 2};
    c->x = nt_from_host(xv, NT_F32, 2, (int64_t[]){2, 6});
    c->w = nt_from_host(xv, NT_F32, 2, (int64_t[]){2, 6});
    c->b = nt_zeros(NT_F32, 1, (int64_t[]){2});
    c->logits = nt_from_host(lv, NT_F32, 2, (int64_t[]){4, 3});
    c->labels = nt_from_host(yv, NT_I32, 1, (int64_t[]){4});
    c->m2 = nt_from_host(xv, NT_F32, 2, (int64_t[]){3, 4});
    c->p[0] = nt_from_host(xv, NT_F32, 1, (int64_t[]){12});
    c->p[1] = nt_from_host(lv, NT_F32, 1, (int64_t[]){3});
    for (int i = 0; i < 2; i++)
        assert_int_equal(nt_set_requires_grad(c->p[i], true), 0);
    c->loss = nt_add(nt_sum(nt_mul(c->p[0], c->p[0]), NT_DIM_ALL, false),
                     nt_sum(nt_mul(c->p[1], c->p[1]), NT_DIM_ALL, false));
    assert_non_null(c->loss);
    assert_int_equal(nt_backward(c->loss), 0);
    c->opt = nt_optim_adamw(c->p, 2, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    c->sc = nt_grad_scaler_create(NULL);
    assert_non_null(c->opt);
    assert_non_null(c->sc);
    c->op = op;
    assert_int_equal(nt_sync(), 0);
}

static void comp_free(comp_ctx *c)
{
    nt_grad_scaler_destroy(c->sc);
    nt_optim_destroy(c->opt);
    nt_tensor *all[] = {c->x, c->w, c->b, c->logits, c->labels, c->m2, c->p[0], c->p[1], c->loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        nt_release(all[i]);
}

static void test_composites_name_themselves(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    nt_op_def def = {"comp_square", 1, comp_square, NULL, NULL};
    int op = nt_op_register(&def);
    assert_true(op >= 0);
    comp_ctx c;
    comp_setup(&c, op);
    assert_int_equal(nt_save(ckpt, c.p, 2, c.opt), 0);
    comp_free(&c);

    for (int k = 0; k < 2 * NCOMP; k++) {
        const char *fn = COMP_FN[k % NCOMP];
        bool scoped = k >= NCOMP;
        size_t fl = strlen(fn);
        comp_setup(&c, op);
        if (comp_run(k % NCOMP, &c) != 0)
            fail_msg("%s failed with memory: %s", fn, nt_last_error_message());
        assert_int_equal(nt_sync(), 0);
        comp_free(&c);
        long fails = 0;
        for (long n = 1;; n++) {
            comp_setup(&c, op);
            nt_scope *sc = NULL;
            if (scoped) {
                assert_non_null(sc = nt_scope_begin());
                for (int i = 0; i < 64; i++)
                    assert_non_null(nt_zeros(NT_F32, 0, NULL));
            }
            nt_clear_error();
            arm_here(n);
            int rc = comp_run(k % NCOMP, &c);
            disarm();
            long inj = atomic_load(&injected);
            if (rc != 0) {
                const char *m = nt_last_error_message();
                /* "nt_linear: nt_linear: ..." names it twice */
                bool twice = strncmp(m + fl + 2, fn, fl) == 0 && m[2 * fl + 2] == ':';
                if (rc != NT_EHOSTMEM || strncmp(m, fn, fl) != 0 || m[fl] != ':' || twice)
                    fail_msg("%s with allocation %ld failing: rc %d (%s), message '%s'; "
                             "expected NT_EHOSTMEM naming %s", fn, n, rc, nt_strerror(rc), m,
                             fn);
                if (inj == 0)
                    fail_msg("%s with allocation %ld failing: rc %d ('%s') but no failure was "
                             "injected", fn, n, rc, m);
                fails++;
            } else if (nt_last_error() != 0) { /* a result, and an error left behind */
                fail_msg("%s with allocation %ld failing: succeeded with the error '%s' set",
                         fn, n, nt_last_error_message());
            }
            nt_sync(); /* a failure in a kernel poisons; reported here, not ours */
            if (sc)
                assert_int_equal(nt_scope_end(sc), 0);
            nt_clear_error();
            comp_free(&c);
            if (inj == 0) {
                assert_int_equal(rc, 0);
                break;
            }
            assert_true(n < 100000);
        }
        print_message("# %s%s: %ld allocation failures reported as its NT_EHOSTMEM\n", fn,
                      scoped ? " in a full scope" : "", fails);
        assert_true(fails > 0);
    }
    nt_shutdown();
}

/* Usage: test_oom [init|sim|cpu] -- one part of the tests (tests/meson.build
 * runs the three side by side); all of them without an argument. */
int main(int argc, char **argv)
{
    void *frames[4];
    /* Big blocks straight from mmap, always: glibc would raise the
     * threshold once the warm-up frees the simulator's 24 MiB SBUF, and
     * then every child's nt_init would clear it page by page (calloc from
     * the heap), most of a point's time.  Allocations are counted the same. */
    if (!OOM_ASAN)
        mallopt(M_MMAP_THRESHOLD, 1 << 20);
    __lsan_disable(); /* the loader keeps what it allocates */
    backtrace(frames, 4); /* loads libgcc's unwinder now, not inside a window */
    __lsan_enable();
    ckpt_name();
    /* The first-init loop first: its parent must never have run nt_init. */
    const struct CMUnitTest init_part[] = {
        cmocka_unit_test(test_malloc_failure_loop_first_init),
        cmocka_unit_test(test_leak_check_catches_a_leak),
        cmocka_unit_test(test_errors_need_no_memory),
        cmocka_unit_test(test_composites_name_themselves),
    };
    const struct CMUnitTest sim_part[] = {
        cmocka_unit_test(test_malloc_failure_loop_sim),
    };
    const struct CMUnitTest cpu_part[] = {
        cmocka_unit_test(test_malloc_failure_loop_cpu),
    };
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_malloc_failure_loop_first_init),
        cmocka_unit_test(test_leak_check_catches_a_leak),
        cmocka_unit_test(test_errors_need_no_memory),
        cmocka_unit_test(test_composites_name_themselves),
        cmocka_unit_test(test_malloc_failure_loop_sim),
        cmocka_unit_test(test_malloc_failure_loop_cpu),
    };
    const char *part = argc > 1 ? argv[1] : "all";
    int rc;
    if (!strcmp(part, "init"))
        rc = cmocka_run_group_tests_name("oom_init", init_part, NULL, NULL);
    else if (!strcmp(part, "sim"))
        rc = cmocka_run_group_tests_name("oom_sim", sim_part, NULL, NULL);
    else if (!strcmp(part, "cpu"))
        rc = cmocka_run_group_tests_name("oom_cpu", cpu_part, NULL, NULL);
    else if (!strcmp(part, "all"))
        rc = cmocka_run_group_tests_name("oom", all, NULL, NULL);
    else {
        fprintf(stderr, "test_oom: unknown part '%s'; expected init, sim or cpu\n", part);
        return 2;
    }
    unlink(ckpt);
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", ckpt);
    unlink(tmp);
    return rc;
}
