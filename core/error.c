/* core/error.c - thread-local errors, error objects, call sites. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define NT__ERRMSG_MAX 1024

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

void nt__site_format(const nt_site *site, char *buf, size_t n)
{
    if (!site || (!site->file && !site->ra)) {
        snprintf(buf, n, "unknown site");
        return;
    }
    if (site->file) {
        if (site->func)
            snprintf(buf, n, "%s:%d in %s", site->file, site->line, site->func);
        else
            snprintf(buf, n, "%s:%d", site->file, site->line);
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

void nt__err_set(int code, const char *msg)
{
    tls_err.code = code;
    g_strlcpy(tls_err.msg, msg ? msg : "", sizeof tls_err.msg);
}

int nt__err(const nt_site *site, int code, const char *fn, const char *fmt, ...)
{
    /* Formatted on the stack: reporting an error must work when the host is
     * out of memory (long messages are cut). */
    char body[NT__ERRMSG_MAX], where[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    size_t n = sizeof tls_err.msg;
    g_strlcpy(tls_err.msg, fn ? fn : "ntensor", n);
    g_strlcat(tls_err.msg, ": ", n);
    g_strlcat(tls_err.msg, body, n);
    if (site) {
        nt__site_format(site, where, sizeof where);
        g_strlcat(tls_err.msg, " (at ", n);
        g_strlcat(tls_err.msg, where, n);
        g_strlcat(tls_err.msg, ")", n);
    }
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
