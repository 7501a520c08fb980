/* sim/trace.c - see trace.h. */
#include "sim/trace.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic_ops.h>
#include <time.h>

#include "ntensor.h"

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_fp;
static char *trace_buf;      /* setvbuf buffer: events are small and many */
static bool trace_first;     /* no event written yet: no leading comma */
static atomic_int trace_emit;  /* the level being written now; 0: none */
static atomic_bool trace_isopen; /* a file is open (its window may be shut) */
static atomic_uint trace_gen;
static bool atexit_done;
/* NT_TRACE_LEVEL and NT_TRACE_STEPS (dispatcher/config.c sets them) */
static atomic_int filt_level = NT__TRACE_INSTR; /* nt_init makes it kernel */
static _Atomic int64_t filt_first = 0, filt_end = INT64_MAX;
/* step boundaries passed since the file opened; the file's size when the
 * current step began (trace_lock) */
static _Atomic int64_t trace_step;
static long step_start_bytes;

#define TRACE_BUFSZ (1u << 20)

bool nt__trace_enabled(void)
{
    return atomic_load_explicit(&trace_emit, memory_order_relaxed) > 0;
}

static bool trace_fp_open(void)
{
    return atomic_load_explicit(&trace_isopen, memory_order_relaxed);
}

bool nt__trace_is_open(void)
{
    return trace_fp_open();
}

bool nt__trace_at(int level)
{
    return atomic_load_explicit(&trace_emit, memory_order_relaxed) >= level;
}

static const char *const level_names[] = {"", "host", "fusion", "kernel", "instruction"};

int nt__trace_level_parse(const char *s)
{
    for (int l = NT__TRACE_HOST; l <= NT__TRACE_INSTR; l++)
        if (s && !strcmp(s, level_names[l]))
            return l;
    return 0;
}

const char *nt__trace_level_name(int level)
{
    return level >= NT__TRACE_HOST && level <= NT__TRACE_INSTR ? level_names[level] : "?";
}

/* A step number: decimal digits only, below 2^62. */
static bool parse_step(const char *s, const char *e, int64_t *v)
{
    if (s == e || e - s > 18)
        return false;
    int64_t x = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return false;
        x = x * 10 + (*s - '0');
    }
    *v = x;
    return true;
}

bool nt__trace_steps_parse(const char *s, int64_t *first, int64_t *end)
{
    if (!s)
        return false;
    const char *colon = strchr(s, ':'), *z = s + strlen(s);
    if (!colon) { /* "a": the one step a */
        if (!parse_step(s, z, first))
            return false;
        *end = *first + 1;
        return true;
    }
    if (!parse_step(s, colon, first))
        return false;
    if (colon + 1 == z) {
        *end = INT64_MAX;
        return true;
    }
    return parse_step(colon + 1, z, end) && *end > *first;
}

/* The level to write at step `step` (trace_lock held or the file closed). */
static int level_at(int64_t step)
{
    return step >= atomic_load(&filt_first) && step < atomic_load(&filt_end)
               ? atomic_load(&filt_level)
               : 0;
}

void nt__trace_set_level(int level)
{
    atomic_store(&filt_level, level >= NT__TRACE_HOST && level <= NT__TRACE_INSTR
                                  ? level
                                  : NT__TRACE_INSTR);
}

void nt__trace_set_steps(int64_t first, int64_t end)
{
    atomic_store(&filt_first, first < 0 ? 0 : first);
    atomic_store(&filt_end, end);
}

int nt__trace_filter_level(void)
{
    return atomic_load(&filt_level);
}

bool nt__trace_step_wants_drain(void)
{
    if (!trace_fp_open())
        return false;
    int64_t s = atomic_load(&trace_step);
    return level_at(s) != level_at(s + 1) || level_at(s) > 0;
}

int64_t nt__trace_step_end(int64_t *step)
{
    int64_t bytes = -1;
    pthread_mutex_lock(&trace_lock);
    if (trace_fp) {
        int64_t s = atomic_fetch_add(&trace_step, 1);
        long now = -1;
        if (level_at(s) > 0 || level_at(s + 1) > 0) {
            fflush(trace_fp);
            now = ftell(trace_fp);
        }
        if (level_at(s) > 0 && now >= 0) {
            bytes = now - step_start_bytes;
            *step = s;
        }
        if (now >= 0)
            step_start_bytes = now;
        atomic_store(&trace_emit, level_at(s + 1));
    }
    pthread_mutex_unlock(&trace_lock);
    return bytes;
}

unsigned nt__trace_generation(void)
{
    return atomic_load_explicit(&trace_gen, memory_order_acquire);
}

static void close_locked(void)
{
    if (!trace_fp)
        return;
    atomic_store(&trace_emit, 0);
    atomic_store(&trace_isopen, false);
    fputs("\n],\n\"displayTimeUnit\":\"ns\",\n"
          "\"otherData\":{\"producer\":\"ntensor\"}}\n",
          trace_fp);
    fclose(trace_fp);
    trace_fp = NULL;
    free(trace_buf);
    trace_buf = NULL;
}

static void close_at_exit(void)
{
    nt__trace_close();
}

int nt__trace_open(const char *path)
{
    pthread_mutex_lock(&trace_lock);
    close_locked();
    FILE *fp = fopen(path, "w");
    if (!fp) {
        pthread_mutex_unlock(&trace_lock);
        return NT_EIO;
    }
    trace_buf = malloc(TRACE_BUFSZ);
    if (trace_buf)
        setvbuf(fp, trace_buf, _IOFBF, TRACE_BUFSZ);
    fputs("{\"traceEvents\":[\n", fp);
    trace_fp = fp;
    trace_first = true;
    atomic_store(&trace_step, 0);
    step_start_bytes = ftell(fp);
    if (!atexit_done) {
        atexit(close_at_exit);
        atexit_done = true;
    }
    atomic_fetch_add(&trace_gen, 1);
    atomic_store(&trace_isopen, true);
    atomic_store(&trace_emit, level_at(0));
    pthread_mutex_unlock(&trace_lock);
    return 0;
}

void nt__trace_close(void)
{
    pthread_mutex_lock(&trace_lock);
    close_locked();
    pthread_mutex_unlock(&trace_lock);
}

size_t nt__trace_json_str(char *buf, size_t n, const char *s)
{
    size_t o = 0;
    if (n < 3) {
        if (n)
            buf[0] = '\0';
        return 0;
    }
    buf[o++] = '"';
    for (; s && *s && o + 8 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(buf + o, n - o, "\\u%04x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return o;
}

/* Appends one event object (already formatted) under the lock. */
static void emit(const char *ev)
{
    pthread_mutex_lock(&trace_lock);
    if (trace_fp) {
        if (!trace_first)
            fputs(",\n", trace_fp);
        trace_first = false;
        fputs(ev, trace_fp);
    }
    pthread_mutex_unlock(&trace_lock);
}

/* Formats an event into a stack buffer, or a heap one if args are long. */
static void emitf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emitf(const char *fmt, ...)
{
    char stack[1024];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(stack, sizeof stack, fmt, ap);
    va_end(ap);
    if (len < 0)
        return;
    if ((size_t)len < sizeof stack) {
        emit(stack);
        return;
    }
    char *heap = malloc((size_t)len + 1);
    if (!heap)
        return;
    va_start(ap, fmt);
    vsnprintf(heap, (size_t)len + 1, fmt, ap);
    va_end(ap);
    emit(heap);
    free(heap);
}

void nt__trace_process_name(int pid, const char *name, int sort_index)
{
    if (!trace_fp_open())
        return;
    char q[256];
    nt__trace_json_str(q, sizeof q, name);
    emitf("{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":%s}}",
          pid, q);
    emitf("{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\","
          "\"args\":{\"sort_index\":%d}}",
          pid, sort_index);
}

void nt__trace_thread_name(int pid, int tid, const char *name, int sort_index)
{
    if (!trace_fp_open())
        return;
    char q[256];
    nt__trace_json_str(q, sizeof q, name);
    emitf("{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":%s}}",
          pid, tid, q);
    emitf("{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\","
          "\"args\":{\"sort_index\":%d}}",
          pid, tid, sort_index);
}

void nt__trace_complete(int pid, int tid, const char *name, double ts_us, double dur_us,
                        const char *args_json)
{
    if (!nt__trace_enabled())
        return;
    char q[256];
    nt__trace_json_str(q, sizeof q, name);
    emitf("{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"name\":%s,\"ts\":%.4f,\"dur\":%.4f%s%s}", pid,
          tid, q, ts_us, dur_us, args_json ? ",\"args\":" : "", args_json ? args_json : "");
}

void nt__trace_instant(int pid, int tid, const char *name, double ts_us, const char *args_json)
{
    if (!nt__trace_enabled())
        return;
    char q[256];
    nt__trace_json_str(q, sizeof q, name);
    emitf("{\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,\"tid\":%d,\"name\":%s,\"ts\":%.4f%s%s}", pid,
          tid, q, ts_us, args_json ? ",\"args\":" : "", args_json ? args_json : "");
}

void nt__trace_counter(int pid, const char *name, double ts_us, const char *args_json)
{
    if (!nt__trace_enabled())
        return;
    char q[256];
    nt__trace_json_str(q, sizeof q, name);
    emitf("{\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"name\":%s,\"ts\":%.4f,\"args\":%s}", pid, q,
          ts_us, args_json ? args_json : "{}");
}

/* ---------------- the host tracks' clock ---------------- */

static pthread_mutex_t origin_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile AO_t origin_gen; /* trace generation the origin belongs to */
static double origin_us;

static double wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1000.0;
}

/* The origin is the first host event of each trace file: host tracks start
 * near 0, like the simulator's. */
double nt__htrace_now(void)
{
    unsigned gen = nt__trace_generation();
    if ((unsigned)AO_load_acquire(&origin_gen) != gen) {
        pthread_mutex_lock(&origin_lock);
        if ((unsigned)AO_load(&origin_gen) != gen) {
            origin_us = wall_us();
            nt__trace_process_name(NT_TRACE_PID_HOST, "host", 0);
            AO_store_release(&origin_gen, gen);
        }
        pthread_mutex_unlock(&origin_lock);
    }
    return wall_us() - origin_us;
}
