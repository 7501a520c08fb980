/* core/log.c - the monotonic clock and the log every layer uses (NT_LOG
 * filters by level).  In core/ because everything below the dispatcher
 * times and warns too. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "core/internal.h"

uint64_t nt__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void nt__log(int level, const char *fmt, ...)
{
    if (level > NT__CFG(log_level))
        return;
    /* Formatted on the stack and handed to the handler directly: g_log
     * copies the message on the heap and aborts when the host is out of
     * memory, which is when a warning matters most. */
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    static const GLogLevelFlags gl[] = {G_LOG_LEVEL_CRITICAL, G_LOG_LEVEL_WARNING,
                                        G_LOG_LEVEL_MESSAGE, G_LOG_LEVEL_DEBUG};
    nt__log_handler(NT_LOG_DOMAIN, gl[level], msg, NULL);
}

/* NT_LOG filters; this handler prints what passes, one plain line each. */
void nt__log_handler(const gchar *domain, GLogLevelFlags level, const gchar *msg, gpointer u)
{
    (void)domain, (void)u;
    const char *name = (level & G_LOG_LEVEL_CRITICAL)  ? "error"
                       : (level & G_LOG_LEVEL_WARNING) ? "warning"
                       : (level & G_LOG_LEVEL_MESSAGE) ? "info"
                                                       : "debug";
    fprintf(stderr, "ntensor: %s: %s\n", name, msg);
}
