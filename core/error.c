/* core/error.c - thread-local errors, error objects, call sites. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

typedef struct {
    int code;
    char msg[NT__ERRMSG_MAX];
} nt__tls_error;

static _Thread_local nt__tls_error tls_err;
static _Thread_local char tls_kerr[NT__ERRMSG_MAX];

NT_API int nt_last_error(void) { return tls_err.code; }

NT_API const char *nt_last_error_message(void) { return tls_err.msg; }

NT_API void nt_clear_error(void)
{
    tls_err.code = 0;
    tls_err.msg[0] = '\0';
}

NT_API const char *nt_strerror(int code)
{
    switch (code) {
    case 0: return "success";
#define NT__ERR_CASE(name, val, desc) case (val): return desc;
        NT_ERRNO_MAP(NT__ERR_CASE)
#undef NT__ERR_CASE
    default: return "unknown error";
    }
}

/* file + rest into buf; when both do not fit, the file's start gives way
 * ("...tail/of/file.c:12 in f"): the line and the function stay. */
static void site_fit(char *buf, size_t n, const char *file, const char *rest)
{
    static const char dots[] = "...";
    size_t fl = strlen(file), rl = strlen(rest);
    if (fl + rl < n) {
        memcpy(buf, file, fl);
        memcpy(buf + fl, rest, rl + 1);
    } else if (rl + sizeof dots <= n) {
        size_t keep = n - sizeof dots - rl; /* bytes of the file's tail */
        memcpy(buf, dots, sizeof dots - 1);
        memcpy(buf + sizeof dots - 1, file + fl - keep, keep);
        memcpy(buf + sizeof dots - 1 + keep, rest, rl + 1);
    } else {
        g_strlcpy(buf, rest, n);
    }
}

void nt__site_format(const nt_site *site, char *buf, size_t n)
{
    if (!site || (!site->file && !site->ra)) {
        snprintf(buf, n, "unknown site");
        return;
    }
    if (site->file) {
        char rest[NT__SITE_MAX];
        if (site->func)
            snprintf(rest, sizeof rest, ":%d in %s", site->line, site->func);
        else
            snprintf(rest, sizeof rest, ":%d", site->line);
        site_fit(buf, n, site->file, rest);
        return;
    }
    /* No macro-captured site: name the caller by its return address. */
    Dl_info info;
    if (dladdr(site->ra, &info) && info.dli_fname) {
        const char *obj = strrchr(info.dli_fname, '/');
        obj = obj ? obj + 1 : info.dli_fname;
        if (info.dli_sname)
            snprintf(buf, n, "%s(%s+0x%lx)", obj, info.dli_sname,
                     (unsigned long)((const char *)site->ra - (const char *)info.dli_saddr));
        else
            snprintf(buf, n, "%s+0x%lx", obj,
                     (unsigned long)((const char *)site->ra - (const char *)info.dli_fbase));
    } else {
        snprintf(buf, n, "%p", site->ra);
    }
}

#define CUT_MARK " [...] "

/* The length of s's first k bytes, backed off to a UTF-8 character start. */
static size_t utf8_floor(const char *s, size_t k)
{
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    return k;
}

void nt__msg_join(char *buf, size_t n, const char *head, const char *body, const char *tail)
{
    size_t h = strlen(head), b = strlen(body), t = strlen(tail);
    size_t mark = sizeof CUT_MARK - 1;
    if (h + b + t < n) {
        memcpy(buf, head, h);
        memcpy(buf + h, body, b);
        memcpy(buf + h + b, tail, t + 1);
    } else if (h + mark + t < n) {
        /* the middle of body goes: its start and its end (where an inner
         * message keeps its call site) stay */
        size_t avail = n - 1 - h - mark - t;
        size_t front = utf8_floor(body, avail - avail / 2);
        size_t start = b - avail / 2; /* of the back part, on a character too */
        while (start < b && ((unsigned char)body[start] & 0xC0) == 0x80)
            start++;
        size_t back = b - start;
        char *p = buf;
        memcpy(p, head, h), p += h;
        memcpy(p, body, front), p += front;
        memcpy(p, CUT_MARK, mark), p += mark;
        memcpy(p, body + b - back, back), p += back;
        memcpy(p, tail, t + 1);
    } else {
        /* not with NT__SITE_MAX-bounded sites: keep what fits, in order */
        g_strlcpy(buf, head, n);
        g_strlcat(buf, body, n);
        g_strlcat(buf, tail, n);
    }
}

void nt__err_set(int code, const char *msg)
{
    tls_err.code = code;
    g_strlcpy(tls_err.msg, msg ? msg : "", sizeof tls_err.msg);
}

int nt__err_within(const char *fn)
{
    int code = tls_err.code ? tls_err.code : NT_EINVAL;
    size_t fl = strlen(fn);
    if (strncmp(tls_err.msg, fn, fl) != 0 || strncmp(tls_err.msg + fl, ": ", 2) != 0) {
        char head[NT__SITE_MAX], m[NT__ERRMSG_MAX];
        snprintf(head, sizeof head, "%s: ", fn);
        nt__msg_join(m, sizeof m, head, tls_err.msg, "");
        memcpy(tls_err.msg, m, strlen(m) + 1);
    }
    tls_err.code = code;
    return code;
}

int nt__err(const nt_site *site, int code, const char *fn, const char *fmt, ...)
{
    /* Formatted on the stack: reporting an error must work when the host is
     * out of memory.  A message too long for the buffer loses the middle of
     * its body, never the function's name or the call site. */
    char body[2 * NT__ERRMSG_MAX], head[NT__SITE_MAX], tail[NT__SITE_MAX + 8];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (len >= (int)sizeof body) /* cut already (twice the limit): say so */
        memcpy(body + sizeof body - sizeof " [...]", " [...]", sizeof " [...]");
    snprintf(head, sizeof head, "%s: ", fn ? fn : "ntensor");
    tail[0] = '\0';
    if (site) {
        char where[NT__SITE_MAX];
        nt__site_format(site, where, sizeof where);
        snprintf(tail, sizeof tail, " (at %s)", where);
    }
    nt__msg_join(tls_err.msg, sizeof tls_err.msg, head, body, tail);
    tls_err.code = code;
    return code;
}

int nt__kerr(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_kerr, sizeof tls_kerr, fmt, ap);
    va_end(ap);
    return code;
}

const char *nt__kerr_msg(void) { return tls_kerr; }

/* When the host cannot hold an error's message, one of these (per code)
 * stands in: never freed, so its count never reaches 0.  A constant
 * initializer, not code run at load or at nt_init: they are there before
 * anything can fail, and making them cannot fail. */
#define NT__NCODES 32
#define NT__LOST " (the message was lost: out of host memory)"
#define NT__FALLBACK(code, desc) [-(code)] = {(AO_t)1 << 40, (code), 0, (char *)desc NT__LOST}
#define NT__FALLBACK_ERR(name, val, desc) NT__FALLBACK(val, desc),
/* Codes past the last NT_E* (nt__errobj_new takes any code > -32). */
#define NT__FALLBACK_UNKNOWN(i) NT__FALLBACK(-(i), "unknown error")
_Static_assert(NT_ECOMM == -18 && -NT_ECOMM + 1 == 19,
               "a new NT_E* code: move the first NT__FALLBACK_UNKNOWN below past it");
static nt__errobj fallback_err[NT__NCODES] = {
    NT__FALLBACK(0, "success"),
    NT_ERRNO_MAP(NT__FALLBACK_ERR)
    NT__FALLBACK_UNKNOWN(19),
    NT__FALLBACK_UNKNOWN(20), NT__FALLBACK_UNKNOWN(21), NT__FALLBACK_UNKNOWN(22),
    NT__FALLBACK_UNKNOWN(23), NT__FALLBACK_UNKNOWN(24), NT__FALLBACK_UNKNOWN(25),
    NT__FALLBACK_UNKNOWN(26), NT__FALLBACK_UNKNOWN(27), NT__FALLBACK_UNKNOWN(28),
    NT__FALLBACK_UNKNOWN(29), NT__FALLBACK_UNKNOWN(30), NT__FALLBACK_UNKNOWN(31),
};

static bool is_fallback(const nt__errobj *e)
{
    return e >= fallback_err && e < fallback_err + NT__NCODES;
}

nt__errobj *nt__errobj_new(int code, const char *msg)
{
    size_t len = strlen(msg ? msg : "");
    /* One block for the object and its message. */
    nt__errobj *e = malloc(sizeof *e + len + 1);
    if (!e)
        return &fallback_err[code < 0 && code > -NT__NCODES ? -code : 0];
    memset(e, 0, sizeof *e);
    e->refs = 1;
    e->code = code;
    e->msg = (char *)(e + 1);
    memcpy(e->msg, msg ? msg : "", len + 1);
    return e;
}

void nt__errobj_ref(nt__errobj *e)
{
    if (e)
        AO_fetch_and_add1(&e->refs);
}

void nt__errobj_unref(nt__errobj *e)
{
    if (e && nt__ref_drop(&e->refs, 1) && !is_fallback(e))
        free(e);
}
