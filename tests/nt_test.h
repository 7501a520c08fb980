/* tests/nt_test.h - what the test programs of ntensor share: set-up, error
 * checks, seeded values, a JSON syntax check, a scratch directory, the
 * fusion log of a call.
 * Include after "ntensor.h" (and <cmocka.h> for the parts that assert:
 * they are compiled only where cmocka is, so tests/mpi_collectives.c can
 * share the values). */
#ifndef NT_TEST_H
#define NT_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h" /* nt__store_*: the same rounding as the library's */

/* ---------------- seeded values ---------------- */

/* An f32 from its bit pattern, and back (the torch_refs headers hold bits). */
static inline float nt_test_fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t nt_test_ubits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The element count of a shape. */
static inline int64_t nt_test_numel(int nd, const int64_t *sh)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= sh[i];
    return n;
}

/* The tests' generator (xorshift64): the next 32 bits of *state. */
static inline uint32_t nt_test_rand32(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state >> 16);
}

/* uniform in [-1, 1), from *state */
static inline float nt_test_uniform(uint64_t *state)
{
    return (float)((double)nt_test_rand32(state) / 2147483648.0 - 1.0);
}

/* x[0, n) uniform in [-1, 1), from *state */
static inline void nt_test_fill(float *x, size_t n, uint64_t *state)
{
    for (size_t i = 0; i < n; i++)
        x[i] = nt_test_uniform(state);
}

/* Global rank r's input element k of a collective, stored in dt: values of
 * many magnitudes whose sums depend on the order, the same in every
 * process (tests/test_collectives.c and tests/mpi_collectives.c compare
 * hashes of results made from them). */
static inline void nt_test_rank_input(void *buf, nt_dtype dt, int r, int64_t count)
{
    for (int64_t k = 0; k < count; k++) {
        int64_t h = (r * 7919 + k * 104729) % 2001;
        double v = ldexp((double)(h - 1000) / 1000.0, (int)((r * 3 + k) % 20) - 10);
        if (dt == NT_I32)
            nt__store_i32(buf, dt, k, (int32_t)(h * 1000003 - 77));
        else if (dt == NT_U8)
            nt__store_i32(buf, dt, k, (int32_t)(h & 255));
        else
            nt__store_f64(buf, dt, k, v);
    }
}

/* ---------------- JSON ---------------- */

/* A JSON syntax check (trace files; python3 -m json in tests/gdb_test.py
 * checks them too): the end of the value at s, or NULL. */
static inline const char *nt_test_json_ws(const char *s)
{
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')
        s++;
    return s;
}

static inline const char *nt_test_json_string(const char *s)
{
    if (*s != '"')
        return NULL;
    for (s++; *s && *s != '"'; s++) {
        if ((unsigned char)*s < 0x20)
            return NULL;
        if (*s == '\\') {
            s++;
            if (*s == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!s[i] || !strchr("0123456789abcdefABCDEF", s[i]))
                        return NULL;
                s += 4;
            } else if (!*s || !strchr("\"\\/bfnrt", *s)) {
                return NULL;
            }
        }
    }
    return *s == '"' ? s + 1 : NULL;
}

static inline const char *nt_test_json_value(const char *s, int depth)
{
    if (depth > 64)
        return NULL;
    s = nt_test_json_ws(s);
    if (*s == '{' || *s == '[') {
        char close = *s == '{' ? '}' : ']';
        bool obj = *s == '{';
        s = nt_test_json_ws(s + 1);
        if (*s == close)
            return s + 1;
        for (;;) {
            if (obj) {
                s = nt_test_json_string(nt_test_json_ws(s));
                if (!s)
                    return NULL;
                s = nt_test_json_ws(s);
                if (*s++ != ':')
                    return NULL;
            }
            s = nt_test_json_value(s, depth + 1);
            if (!s)
                return NULL;
            s = nt_test_json_ws(s);
            if (*s == ',') {
                s++;
                continue;
            }
            return *s == close ? s + 1 : NULL;
        }
    }
    if (*s == '"')
        return nt_test_json_string(s);
    if (!strncmp(s, "true", 4))
        return s + 4;
    if (!strncmp(s, "false", 5))
        return s + 5;
    if (!strncmp(s, "null", 4))
        return s + 4;
    char *e;
    strtod(s, &e);
    return e == s ? NULL : e;
}

/* text is one JSON value, white space around it */
static inline bool nt_test_json_ok(const char *text)
{
    const char *e = nt_test_json_value(text, 0);
    return e && !*nt_test_json_ws(e);
}

/* ---------------- a scratch directory ---------------- */

/* A private directory under /tmp for a group's files (checkpoints). */
static char nt_test_dir[256];

static inline int nt_test_dir_make(const char *tag)
{
    snprintf(nt_test_dir, sizeof nt_test_dir, "/tmp/nt_test_%s_XXXXXX", tag);
    return mkdtemp(nt_test_dir) ? 0 : -1;
}

static inline int nt_test_dir_remove(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", nt_test_dir);
    return system(cmd) == 0 ? 0 : -1;
}

#ifdef cmocka_unit_test /* the parts that assert */

/* The eight settings a test that compares bits runs an op in: backend,
 * mode, fusion.  nt_test_cfg(k) makes setting k current; on the simulator
 * NT_REQUIRE_SIM is on, so it runs every op itself (no silent CPU
 * fallback). */
static const char *const NT_TEST_CFGS[][3] = {
    {"cpu", "deterministic", "1"}, {"sim", "deterministic", "1"}, {"cpu", "adaptive", "1"},
    {"sim", "adaptive", "1"},      {"cpu", "lazy", "1"},          {"sim", "lazy", "1"},
    {"sim", "eager", "0"},         {"cpu", "eager", "0"},
};
enum { NT_TEST_NCFG = sizeof NT_TEST_CFGS / sizeof NT_TEST_CFGS[0] };

/* Backend, mode and fusion (NT_FUSION "0" or "1") made current. */
static inline void nt_test_config(const char *backend, const char *mode, const char *fusion)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(backend, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_FUSION", fusion), 0);
}

static inline void nt_test_cfg(int k)
{
    nt_test_config(NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], NT_TEST_CFGS[k][2]);
}

/* A fresh runtime per test, with no error left over. */
static inline int nt_test_setup(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    return 0;
}

static inline int nt_test_teardown(void **state)
{
    (void)state;
    nt_shutdown();
    return 0;
}

/* nt_test_expect_err(rc, code, s1, ...): the error a call left.  rc (what
 * the call returned: pass nt_last_error() for one that returns a pointer)
 * and nt_last_error() are code, and the message contains every string
 * given, up to the first NULL (the function, 'the argument', a call site
 * such as "test_ops.c:" ...).  Clears the error; a failure names the
 * caller's line. */
#define nt_test_expect_err(rc, code, ...)                                                  \
    nt_test_expect_err_((rc), (code), (const char *const[]){__VA_ARGS__, NULL}, __FILE__,  \
                        __LINE__)

static inline void nt_test_expect_err_(int rc, int code, const char *const *want,
                                       const char *file, int line)
{
    /* never NULL, but nothing in its declaration says so: under UBSan the
     * compiler keeps a path where strstr's null check fails and goes on to
     * print m, and -Wformat-overflow flags that "%s" (argument null) */
    const char *m = nt_last_error_message();
    if (!m)
        m = "";
    if (rc != code || nt_last_error() != code) {
        print_error("expected %s (%d); the call returned %d, the last error is %d: %s\n",
                    nt_strerror(code), code, rc, nt_last_error(), m);
        _fail(file, line);
    }
    for (; *want; want++)
        if (!strstr(m, *want)) {
            print_error("the message does not contain '%s': %s\n", *want, m);
            _fail(file, line);
        }
    nt_clear_error();
}

/* ---------------- tensors for the autograd tests ---------------- */

/* t's element count. */
static inline int64_t nt_test_tnumel(nt_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < nt_ndim(t); i++)
        n *= nt_shape(t, i);
    return n;
}

/* An f32 leaf that requires grad, from v (nd dims of shape sh). */
static inline nt_tensor *nt_test_leaf(const float *v, int nd, const int64_t *sh)
{
    nt_tensor *t = nt_from_host(v, NT_F32, nd, sh);
    assert_non_null(t);
    assert_int_equal(nt_set_requires_grad(t, true), 0);
    return t;
}

/* t's values (f32) in a malloc'd array. */
static inline float *nt_test_host(nt_tensor *t)
{
    assert_non_null(t);
    int64_t n = nt_test_tnumel(t);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_int_equal(nt_to_host(t, v, (size_t)n * sizeof *v), 0);
    return v;
}

/* d/dx of a one-element y, create_graph as given (graph kept). */
static inline nt_tensor *nt_test_grad1(nt_tensor *y, nt_tensor *x, bool create)
{
    nt_tensor *g = NULL;
    int rc = nt_autograd_grad(&y, 1, &x, 1, NULL, true, create, true, &g);
    if (rc)
        fail_msg("nt_autograd_grad: %s", nt_last_error_message());
    return g;
}


/* ---------------- the fusion log ---------------- */

/* fn(arg) with the fusion log (NT_FUSION_LOG, on stderr) on: the log's
 * text, malloc'd (free it). */
static inline char *nt_test_fusion_log(void (*fn)(void *), void *arg)
{
    fflush(stderr);
    char path[] = "/tmp/nt_test_fusion_logXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(2);
    dup2(fd, 2);
    nt_config_set("NT_FUSION_LOG", "1");
    fn(arg);
    nt_sync();
    nt_config_set("NT_FUSION_LOG", "0");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *text = malloc(n > 0 ? (size_t)n + 1 : 1);
    assert_non_null(text);
    ssize_t got = n > 0 ? pread(fd, text, (size_t)n, 0) : 0;
    text[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(path);
    return text;
}

/* How many times needle occurs in hay (overlapping occurrences too). */
static inline int nt_test_count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

#endif /* cmocka_unit_test */

#endif
