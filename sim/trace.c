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
static atomic_bool trace_on;
static atomic_uint trace_gen;
static bool atexit_done;

#define TRACE_BUFSZ (1u << 20)

bool nt__trace_enabled(void)
{
    return atomic_load_explicit(&trace_on, memory_order_relaxed);
}

unsigned nt__trace_generation(void)
{
    return atomic_load_explicit(&trace_gen, memory_order_acquire);
}

static void close_locked(void)
{
    if (!trace_fp)
        return;
    atomic_store(&trace_on, false);
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
    if (!atexit_done) {
        atexit(close_at_exit);
        atexit_done = true;
    }
    atomic_fetch_add(&trace_gen, 1);
    atomic_store(&trace_on, true);
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
    if (!nt__trace_enabled())
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
    if (!nt__trace_enabled())
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
