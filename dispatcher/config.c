/* dispatcher/config.c - the runtime's start and stop behind nt_init /
 * nt_shutdown (nt__runtime_init / nt__runtime_shutdown; the public entry
 * points are init/init.c's), the NT_* environment (nt_config_set/_get),
 * and the counters (nt_stats_get/_reset). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/gemm.h"
#include "core/hooks.h"
#include "core/internal.h"
#include "debug/debug.h"
#include "dispatcher/dispatch.h"
#include "fusion/fusion.h"
#include "sim/trace.h"
#include "streams/stream.h"

nt__config nt__cfg;
nt__counters nt__ctr;

static GMutex init_lock;
volatile AO_t nt__init_epoch;

/* ---------------- options ---------------- */

static bool parse_bool(const char *v, bool *out)
{
    if (!strcmp(v, "1") || !g_ascii_strcasecmp(v, "true") || !g_ascii_strcasecmp(v, "on") ||
        !g_ascii_strcasecmp(v, "yes")) {
        *out = true;
        return true;
    }
    if (!strcmp(v, "0") || !g_ascii_strcasecmp(v, "false") || !g_ascii_strcasecmp(v, "off") ||
        !g_ascii_strcasecmp(v, "no") || !*v) {
        *out = false;
        return true;
    }
    return false;
}

/* A decimal integer >= 0 with an optional binary K/M/G suffix.  strtoull
 * alone would take "-1" as 2^64 - 1 and " 5" as 5, and a suffix shift could
 * wrap: all three are rejected. */
static bool parse_u64(const char *v, uint64_t *out)
{
    if (!g_ascii_isdigit(v[0]))
        return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v)
        return false;
    int shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10, end++;
    else if (*end == 'M' || *end == 'm')
        shift = 20, end++;
    else if (*end == 'G' || *end == 'g')
        shift = 30, end++;
    if (*end || (shift && x > (UINT64_MAX >> shift)))
        return false;
    *out = (uint64_t)x << shift;
    return true;
}

/* Largest NT_HBM_BYTES: 1 PiB.  Keeps the arena's byte counts (capacity plus
 * a reservation) far from wrapping. */
#define NT__MAX_HBM_BYTES ((uint64_t)1 << 50)

/* apply_opt's steps, one per kind of option: each returns NOT_MINE for a
 * name it does not know, else 0 or NT_EINVAL with the thread error set. */
#define NOT_MINE 1

/* The on/off options: 0 or 1 (true/false, on/off, yes/no). */
static int apply_flag(nt__config *c, const char *name, const char *v, const char *fn)
{
    static const struct {
        const char *name;
        size_t off; /* of its bool in nt__config */
    } flags[] = {
        {"NT_FUSION", offsetof(nt__config, fusion)},
        {"NT_REQUIRE_SIM", offsetof(nt__config, require_sim)},
        {"NT_CHECK_NAN", offsetof(nt__config, check_nan)},
        {"NT_STATS", offsetof(nt__config, stats_at_exit)},
        {"NT_FUSION_LOG", offsetof(nt__config, fusion_log)},
        {"NT_STOCHASTIC_ROUNDING", offsetof(nt__config, sr)},
        {"NT_FOREACH", offsetof(nt__config, foreach)},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(flags); i++) {
        if (strcmp(name, flags[i].name))
            continue;
        if (!parse_bool(v, (bool *)((char *)c + flags[i].off)))
            return nt__err(NULL, NT_EINVAL, fn, "%s: expected 0 or 1, got '%s'", name, v);
        return 0;
    }
    return NOT_MINE;
}

/* The options that name a choice: the mode, the backend, the log level. */
static int apply_choice(nt__config *c, const char *name, const char *v, const char *fn)
{
    bool b;
    if (!strcmp(name, "NT_DETERMINISTIC")) {
        if (!parse_bool(v, &b))
            return nt__err(NULL, NT_EINVAL, fn, "NT_DETERMINISTIC: expected 0 or 1, got '%s'", v);
        if (b)
            c->mode = NT_MODE_DETERMINISTIC;
        else if (c->mode == NT_MODE_DETERMINISTIC)
            c->mode = NT_MODE_ADAPTIVE;
    } else if (!strcmp(name, "NT_MODE")) {
        if (!strcmp(v, "eager"))
            c->mode = NT_MODE_EAGER;
        else if (!strcmp(v, "adaptive"))
            c->mode = NT_MODE_ADAPTIVE;
        else if (!strcmp(v, "lazy"))
            c->mode = NT_MODE_LAZY;
        else if (!strcmp(v, "deterministic"))
            c->mode = NT_MODE_DETERMINISTIC;
        else
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_MODE: expected eager, adaptive, lazy or deterministic, got '%s'", v);
    } else if (!strcmp(name, "NT_BACKEND")) {
        if (!strcmp(v, "sim"))
            c->backend = NT_BACKEND_SIM;
        else if (!strcmp(v, "cpu"))
            c->backend = NT_BACKEND_CPU;
        else
            return nt__err(NULL, NT_EINVAL, fn, "NT_BACKEND: expected sim or cpu, got '%s'", v);
    } else if (!strcmp(name, "NT_LOG")) {
        if (!strcmp(v, "error"))
            c->log_level = NT__LOG_ERROR;
        else if (!strcmp(v, "warn"))
            c->log_level = NT__LOG_WARN;
        else if (!strcmp(v, "info"))
            c->log_level = NT__LOG_INFO;
        else if (!strcmp(v, "debug"))
            c->log_level = NT__LOG_DEBUG;
        else
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_LOG: expected error, warn, info or debug, got '%s'", v);
    } else {
        return NOT_MINE;
    }
    return 0;
}

/* The numbers that may change while the runtime runs. */
static int apply_number(nt__config *c, const char *name, const char *v, const char *fn)
{
    uint64_t u;
    if (!strcmp(name, "NT_MIN_SIM_FLOPS")) {
        if (!parse_u64(v, &u))
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_MIN_SIM_FLOPS: expected a non-negative integer, got '%s'", v);
        c->min_sim_flops = (double)u;
    } else if (!strcmp(name, "NT_LAZY_WINDOW")) {
        if (!parse_u64(v, &u) || u < 1 || u > 10000000)
            return nt__err(NULL, NT_EINVAL, fn, "NT_LAZY_WINDOW: expected 1..10000000, got '%s'",
                           v);
        c->lazy_window = (int)u;
    } else if (!strcmp(name, "NT_MAX_INFLIGHT")) {
        if (!parse_u64(v, &u) || u < 2 || u > 100000000)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_MAX_INFLIGHT: expected 2..100000000, got '%s'", v);
        c->max_inflight = (int)u;
    } else if (!strcmp(name, "NT_MAX_INFLIGHT_BYTES")) {
        if (!parse_u64(v, &u))
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_MAX_INFLIGHT_BYTES: expected a size like 512M (0: half of "
                           "NT_HBM_BYTES), got '%s'",
                           v);
        c->max_inflight_bytes = u;
        if (nt__inited)
            nt__arena_set_max_waiting(u);
    } else if (!strcmp(name, "NT_SR_SEED")) {
        if (!parse_u64(v, &u))
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_SR_SEED: expected an integer from 0 to 2^64 - 1, got '%s'", v);
        c->sr_seed = u;
    } else if (!strcmp(name, "NT_SEED")) {
        if (!parse_u64(v, &u))
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_SEED: expected an integer from 0 to 2^64 - 1, got '%s'", v);
        c->seed = u;
    } else if (!strcmp(name, "NT_HANDLE_QUARANTINE")) {
        /* applies to the handles released and allocated from now on */
        if (!g_ascii_strcasecmp(v, "all"))
            u = UINT64_MAX;
        else if (!parse_u64(v, &u) || u < 4096)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_HANDLE_QUARANTINE: expected a count >= 4096 or 'all', got '%s'",
                           v);
        c->handle_quarantine = u;
    } else {
        return NOT_MINE;
    }
    return 0;
}

/* NT_TRACE_LEVEL and NT_TRACE_STEPS: the trace module keeps them (they
 * apply to the next file it opens); nt_init resets them before it reads
 * the environment. */
static int apply_trace_filter(const char *name, const char *v, const char *fn)
{
    if (nt__inited)
        return nt__err(NULL, NT_EINVAL, fn, "%s can only be set before nt_init (environment)",
                       name);
    if (!strcmp(name, "NT_TRACE_LEVEL")) {
        int l = nt__trace_level_parse(v);
        if (!l)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_TRACE_LEVEL: expected host, fusion, kernel or instruction, got "
                           "'%s'", v);
        nt__trace_set_level(l);
    } else {
        int64_t a, b;
        if (!nt__trace_steps_parse(v, &a, &b))
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_TRACE_STEPS: expected a:b (steps a to b - 1, b > a), a: or a, "
                           "got '%s'", v);
        nt__trace_set_steps(a, b);
    }
    return 0;
}

/* The options read only before nt_init (from the environment). */
static int apply_startup(nt__config *c, const char *name, const char *v, const char *fn)
{
    uint64_t u;
    if (!strcmp(name, "NT_HBM_BYTES")) {
        if (!parse_u64(v, &u) || u == 0 || u > NT__MAX_HBM_BYTES)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_HBM_BYTES: expected a size from 1 to 1048576G (1 PiB) like 16G, "
                           "got '%s'", v);
        if (nt__inited)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_HBM_BYTES can only be set before nt_init (environment)");
        c->hbm_bytes = u;
    } else if (!strcmp(name, "NT_SIM_CORES")) {
        if (!parse_u64(v, &u) || u < 1 || u > NT_MAX_DEVICES)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_SIM_CORES: expected a core count from 1 to %d, got '%s'",
                           NT_MAX_DEVICES, v);
        if (nt__inited)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_SIM_CORES can only be set before nt_init (environment)");
        c->devices = (int)u;
    } else if (!strcmp(name, "NT_TRACE")) {
        if (nt__inited)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_TRACE can only be set before nt_init (environment)");
        char *path = *v ? strdup(v) : NULL;
        if (*v && !path)
            return nt__err_hostmem(NULL, fn, "the trace file's name");
        free(c->trace_path);
        c->trace_path = path;
    } else if (!strcmp(name, "NT_TRACE_LEVEL") || !strcmp(name, "NT_TRACE_STEPS")) {
        return apply_trace_filter(name, v, fn);
    } else {
        return NOT_MINE;
    }
    return 0;
}

/* The matmul primitive's settings: they live with it (core/gemm.c), not in
 * nt__cfg, as the primitive runs without nt_init too. */
static int apply_cpu(nt__config *c, const char *name, const char *v, const char *fn)
{
    (void)c;
    if (!strcmp(name, "NT_CPU_ISA")) {
        /* the matmul micro-kernel's vector level */
        int isa = -2;
        if (!strcmp(v, "auto"))
            isa = -1;
        for (int i = 0; i < NT_ISA_COUNT; i++)
            if (!strcmp(v, nt__gemm_isa_label(i)))
                isa = i;
        if (isa == -2)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_CPU_ISA: expected auto, avx512, avx2 or scalar, got '%s'", v);
        if (nt__gemm_set_isa(isa) < 0)
            return nt__err(NULL, NT_EINVAL, fn,
                           "NT_CPU_ISA: this CPU does not run %s (the widest it runs is %s)", v,
                           nt__gemm_isa_label(nt__gemm_isa_best()));
    } else if (!strcmp(name, "NT_CPU_THREADS")) {
        int n = !strcmp(v, "auto") ? 0 : !strcmp(v, "1") ? 1 : !strcmp(v, "2") ? 2 : -1;
        if (n < 0 || nt__gemm_set_threads(n) < 0)
            return nt__err(NULL, NT_EINVAL, fn, "NT_CPU_THREADS: expected auto, 1 or 2, got '%s'",
                           v);
    } else {
        return NOT_MINE;
    }
    return 0;
}

/* Applies one option to c; returns 0 or NT_EINVAL with the thread error set. */
static int apply_opt(nt__config *c, const char *name, const char *v, const char *fn)
{
    static int (*const kinds[])(nt__config *, const char *, const char *, const char *) = {
        apply_flag, apply_choice, apply_number, apply_startup, apply_cpu,
    };
    for (size_t i = 0; i < G_N_ELEMENTS(kinds); i++) {
        int rc = kinds[i](c, name, v, fn);
        if (rc != NOT_MINE)
            return rc;
    }
    return nt__err(NULL, NT_EINVAL, fn, "unknown option '%s'", name);
}
#undef NOT_MINE

static const char *const env_names[] = {
    "NT_MODE", "NT_DETERMINISTIC", "NT_FUSION", "NT_BACKEND", "NT_REQUIRE_SIM",
    "NT_MIN_SIM_FLOPS", "NT_CHECK_NAN", "NT_STATS", "NT_FUSION_LOG", "NT_LAZY_WINDOW",
    "NT_MAX_INFLIGHT", "NT_MAX_INFLIGHT_BYTES", "NT_HBM_BYTES", "NT_TRACE", "NT_TRACE_LEVEL",
    "NT_TRACE_STEPS", "NT_LOG",
    "NT_STOCHASTIC_ROUNDING", "NT_SR_SEED", "NT_SEED", "NT_HANDLE_QUARANTINE", "NT_CPU_ISA",
    "NT_SIM_CORES", "NT_CPU_THREADS", "NT_FOREACH",
};

/* Writers of nt__cfg (nt_init, nt_config_set) hold this, so each works on a
 * private copy that it then publishes. */
static GMutex cfg_lock;

/* Makes c the configuration.  Field by field, each atomically: readers
 * (NT__CFG) may run on any thread meanwhile. */
static void cfg_publish(const nt__config *c)
{
#define NT_PUB(f) __atomic_store(&nt__cfg.f, &c->f, __ATOMIC_RELAXED)
    NT_PUB(mode);
    NT_PUB(fusion);
    NT_PUB(backend);
    NT_PUB(require_sim);
    NT_PUB(min_sim_flops);
    NT_PUB(check_nan);
    NT_PUB(stats_at_exit);
    NT_PUB(fusion_log);
    NT_PUB(foreach);
    NT_PUB(lazy_window);
    NT_PUB(max_inflight);
    NT_PUB(hbm_bytes);
    NT_PUB(trace_path);
    NT_PUB(log_level);
    NT_PUB(sr);
    NT_PUB(sr_seed);
    NT_PUB(seed);
    NT_PUB(max_inflight_bytes);
    NT_PUB(handle_quarantine);
    NT_PUB(devices);
#undef NT_PUB
}
/* A field added to nt__config must be published above too. */
_Static_assert(sizeof(nt__config) == 104, "nt__config grew: add the new field to cfg_publish");

static void cfg_defaults(nt__config *c)
{
    g_free(c->trace_path);
    memset(c, 0, sizeof *c);
    c->mode = NT_MODE_ADAPTIVE;
    c->fusion = true;
    c->foreach = true;
    /* The simulator is the default when it is registered (init/init.c). */
    c->backend = nt__backends[NT_BACKEND_SIM] ? NT_BACKEND_SIM : NT_BACKEND_CPU;
    c->lazy_window = 4096;
    c->max_inflight = 1 << 16;
    c->hbm_bytes = UINT64_C(16) << 30; /* one NeuronCore-v2's share of 32 GiB */
    c->log_level = NT__LOG_WARN;
    c->handle_quarantine = 4096;
    c->devices = 1;
    nt__gemm_set_isa(-1);
    nt__gemm_set_threads(0);
}

/* Backends in id order; shutdown in the reverse order. */
static int backends_init(void)
{
    for (int b = 0; b < NT_BACKEND_COUNT; b++) {
        const nt__backend_i *be = nt__backends[b];
        int rc = be && be->init ? be->init() : 0;
        if (rc < 0) {
            while (--b >= 0)
                if (nt__backends[b] && nt__backends[b]->shutdown)
                    nt__backends[b]->shutdown();
            return rc;
        }
    }
    return 0;
}

static void backends_shutdown(void)
{
    for (int b = NT_BACKEND_COUNT - 1; b >= 0; b--)
        if (nt__backends[b] && nt__backends[b]->shutdown)
            nt__backends[b]->shutdown();
}

int nt__runtime_init(void (*register_modules)(void))
{
    if (AO_load_acquire(&nt__inited))
        return 0;
    g_mutex_lock(&init_lock);
    if (nt__inited) {
        g_mutex_unlock(&init_lock);
        return 0;
    }
    /* Once per process, before anything reads the tables: no stream worker
     * runs yet, and every other thread reaches them only after the release
     * of `nt__inited` below (or of a later nt_init) -- the tables are never
     * written again, so nt_shutdown leaves them for a later nt_init. */
    static bool registered;
    if (!registered) {
        register_modules();
        registered = true;
    }
    g_mutex_lock(&cfg_lock);
    nt__config c = nt__cfg;
    cfg_defaults(&c);
    nt__trace_set_level(NT__TRACE_KERNEL);
    nt__trace_set_steps(0, INT64_MAX);
    for (size_t i = 0; i < G_N_ELEMENTS(env_names); i++) {
        const char *v = getenv(env_names[i]);
        if (v && apply_opt(&c, env_names[i], v, "nt_init: environment variable") < 0) {
            cfg_publish(&c);
            g_mutex_unlock(&cfg_lock);
            g_mutex_unlock(&init_lock);
            return NT_EINVAL;
        }
    }
    /* NT_DETERMINISTIC wins over NT_MODE whatever their order above. */
    const char *det = getenv("NT_DETERMINISTIC");
    bool detb;
    if (det && parse_bool(det, &detb) && detb)
        c.mode = NT_MODE_DETERMINISTIC;
    cfg_publish(&c);
    g_mutex_unlock(&cfg_lock);
    /* Nothing here goes through GLib's logging, threads or thread keys:
     * GLib aborts (or, logging that it has no memory while it installs a
     * log handler, deadlocks) when the host is out of memory, and this
     * promises NT_EHOSTMEM instead.  (nt__log prints directly, and no code
     * logs to a GLib domain, so no GLib log handler is installed.) */
    memset(&nt__ctr, 0, sizeof nt__ctr);
    if (!nt__gemm_keys_init()) {
        g_mutex_unlock(&init_lock);
        return nt__err(NULL, NT_EHOSTMEM, "nt_init",
                       "the system has no thread-local key left for the matmul's buffers");
    }
    int rc;
    nt__arena_init(c.hbm_bytes, c.max_inflight_bytes, c.devices);
    nt__tensor_pool_init();
    /* NT_TRACE opens here once (nt_sim_init then finds it open and leaves
     * it alone); nt_shutdown closes it. */
    if (c.trace_path && !nt__trace_is_open() && nt__trace_open(c.trace_path) != 0)
        nt__log(NT__LOG_WARN, "NT_TRACE: cannot open '%s' for writing", c.trace_path);
    rc = backends_init();
    if (rc == 0) {
        nt__fusion_init();
        rc = nt__streams_init();
        if (rc < 0)
            backends_shutdown();
    }
    if (rc < 0) { /* the error is set; nothing of this nt_init is left */
        nt__trace_close();
        nt__tensor_pool_shutdown();
        nt__arena_shutdown();
        g_mutex_unlock(&init_lock);
        return rc;
    }
    AO_fetch_and_add1_release(&nt__init_epoch);
    AO_store_release(&nt__inited, 1); /* core/hooks.h */
    g_mutex_unlock(&init_lock);
    return 0;
}

void nt__runtime_shutdown(void)
{
    g_mutex_lock(&init_lock);
    if (!nt__inited) {
        g_mutex_unlock(&init_lock);
        return;
    }
    nt__scopes_close_thread();
    nt__streams_shutdown();
    if (NT__CFG(stats_at_exit))
        nt__debug_stats_print(stderr);
    nt__fusion_shutdown();
    backends_shutdown();
    nt__trace_close();
    nt__tensor_pool_shutdown();
    if (nt__dhooks.custom_shutdown)
        nt__dhooks.custom_shutdown();
    nt__gemm_shutdown(); /* joined, not left running (valgrind) */
    nt__arena_shutdown();
    g_mutex_lock(&cfg_lock);
    char *path = NT__CFG(trace_path);
    __atomic_store_n(&nt__cfg.trace_path, NULL, __ATOMIC_RELAXED);
    g_mutex_unlock(&cfg_lock);
    g_free(path);
    AO_store_release(&nt__inited, 0);
    g_mutex_unlock(&init_lock);
}

static void drain_one(nt_stream *s, void *arg)
{
    (void)arg;
    nt__stream_drain(s);
}

NT_API int nt_config_set(const char *name, const char *value)
{
    if (!name || !value)
        return nt__err(NULL, NT_EINVAL, "nt_config_set", "argument '%s' is NULL",
                       name ? "value" : "name");
    bool early = !strcmp(name, "NT_HBM_BYTES") || !strcmp(name, "NT_TRACE") ||
                 !strcmp(name, "NT_SIM_CORES");
    if (!early) {
        if (!nt__ensure_init())
            return nt_last_error();
        /* Everything queued so far runs under the old settings. */
        nt__streams_foreach(drain_one, NULL);
    }
    /* (NT_HBM_BYTES and NT_TRACE refuse "only before nt_init" once nt__inited.)
     * A private copy, published whole on success: a failed set changes
     * nothing, and no reader sees a half-parsed value. */
    g_mutex_lock(&cfg_lock);
    nt__config c = nt__cfg;
    int rc = apply_opt(&c, name, value, "nt_config_set");
    if (rc == 0)
        cfg_publish(&c);
    else if (c.trace_path != nt__cfg.trace_path)
        g_free(c.trace_path);
    g_mutex_unlock(&cfg_lock);
    /* A worker holding ops for lazy mode re-reads the mode now: an op of
     * the new mode must not wait for a sync. */
    if (rc == 0 && !early)
        nt__streams_wake();
    return rc;
}

NT_API const char *nt_config_get(const char *name)
{
    static _Thread_local char buf[64];
    if (!name)
        return NULL;
    nt__ensure_init();
    if (!strcmp(name, "NT_MODE")) {
        static const char *m[] = {"adaptive", "eager", "lazy", "deterministic"};
        return m[NT__CFG(mode)];
    }
    if (!strcmp(name, "NT_DETERMINISTIC"))
        return NT__CFG(mode) == NT_MODE_DETERMINISTIC ? "1" : "0";
    if (!strcmp(name, "NT_FUSION"))
        return NT__CFG(fusion) ? "1" : "0";
    if (!strcmp(name, "NT_BACKEND"))
        return NT__CFG(backend) == NT_BACKEND_SIM ? "sim" : "cpu";
    if (!strcmp(name, "NT_REQUIRE_SIM"))
        return NT__CFG(require_sim) ? "1" : "0";
    if (!strcmp(name, "NT_CHECK_NAN"))
        return NT__CFG(check_nan) ? "1" : "0";
    if (!strcmp(name, "NT_STATS"))
        return NT__CFG(stats_at_exit) ? "1" : "0";
    if (!strcmp(name, "NT_FUSION_LOG"))
        return NT__CFG(fusion_log) ? "1" : "0";
    if (!strcmp(name, "NT_STOCHASTIC_ROUNDING"))
        return NT__CFG(sr) ? "1" : "0";
    if (!strcmp(name, "NT_FOREACH"))
        return NT__CFG(foreach) ? "1" : "0";
    if (!strcmp(name, "NT_TRACE"))
        return NT__CFG(trace_path) ? NT__CFG(trace_path) : "";
    if (!strcmp(name, "NT_CPU_ISA"))
        return nt__gemm_isa_label(nt__gemm_isa());
    if (!strcmp(name, "NT_CPU_THREADS"))
        return nt__gemm_threads() == 1 ? "1" : "2";
    if (!strcmp(name, "NT_LOG")) {
        static const char *l[] = {"error", "warn", "info", "debug"};
        return l[NT__CFG(log_level)];
    }
    uint64_t v;
    if (!strcmp(name, "NT_MIN_SIM_FLOPS"))
        v = (uint64_t)NT__CFG(min_sim_flops);
    else if (!strcmp(name, "NT_LAZY_WINDOW"))
        v = (uint64_t)NT__CFG(lazy_window);
    else if (!strcmp(name, "NT_MAX_INFLIGHT"))
        v = (uint64_t)NT__CFG(max_inflight);
    else if (!strcmp(name, "NT_MAX_INFLIGHT_BYTES"))
        v = NT__CFG(max_inflight_bytes) ? NT__CFG(max_inflight_bytes) : NT__CFG(hbm_bytes) / 2;
    else if (!strcmp(name, "NT_HBM_BYTES"))
        v = NT__CFG(hbm_bytes);
    else if (!strcmp(name, "NT_SR_SEED"))
        v = NT__CFG(sr_seed);
    else if (!strcmp(name, "NT_SEED"))
        v = NT__CFG(seed);
    else if (!strcmp(name, "NT_HANDLE_QUARANTINE") && NT__CFG(handle_quarantine) == UINT64_MAX)
        return "all";
    else if (!strcmp(name, "NT_HANDLE_QUARANTINE"))
        v = NT__CFG(handle_quarantine);
    else if (!strcmp(name, "NT_SIM_CORES"))
        v = (uint64_t)NT__CFG(devices);
    else
        return NULL;
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return buf;
}

NT_API nt_mode nt_get_mode(void)
{
    nt__ensure_init();
    return NT__CFG(mode);
}

NT_API int nt_stats_get(nt_stats *out)
{
    if (!out)
        return nt__err(NULL, NT_EINVAL, "nt_stats_get", "argument 'out' is NULL");
    memset(out, 0, sizeof *out);
    if (!nt__initialized())
        return 0;
    out->ops_enqueued = NT__COUNTER(ops_enqueued);
    out->ops_executed = NT__COUNTER(ops_executed);
    out->kernels_launched = NT__COUNTER(kernels);
    out->ops_poisoned = NT__COUNTER(ops_poisoned);
    out->syncs = NT__COUNTER(syncs);
    out->sync_wait_ns = NT__COUNTER(sync_wait_ns);
    out->bytes_to_host = NT__COUNTER(bytes_to_host);
    out->bytes_from_host = NT__COUNTER(bytes_from_host);
    out->cpu_fallbacks = NT__COUNTER(cpu_fallbacks);
    nt__fusion_stats(out);
    for (int b = 0; b < NT_BACKEND_COUNT; b++)
        if (nt__backends[b] && nt__backends[b]->stats_fill)
            nt__backends[b]->stats_fill(out);
    out->device_bytes_in_use = nt__arena_in_use();
    out->device_bytes_backed = nt__arena_backed();
    out->device_bytes_backed_peak = nt__arena_backed_peak();
    out->device_bytes_peak = nt__arena_peak();
    out->device_capacity = nt__arena_capacity();
    out->device_bytes_live = nt__arena_live();
    out->device_bytes_live_peak = nt__arena_live_peak();
    out->device_bytes_waiting = nt__arena_waiting();
    out->device_alloc_waits = nt__arena_alloc_waits();
    out->device_alloc_wait_ns = nt__arena_alloc_wait_ns();
    return 0;
}

NT_API void nt_stats_reset(void)
{
    if (!nt__initialized())
        return;
    AO_store(&nt__ctr.ops_enqueued.v, 0);
    AO_store(&nt__ctr.ops_executed.v, 0);
    AO_store(&nt__ctr.kernels.v, 0);
    AO_store(&nt__ctr.ops_poisoned.v, 0);
    AO_store(&nt__ctr.syncs.v, 0);
    AO_store(&nt__ctr.sync_wait_ns.v, 0);
    AO_store(&nt__ctr.bytes_to_host.v, 0);
    AO_store(&nt__ctr.bytes_from_host.v, 0);
    AO_store(&nt__ctr.cpu_fallbacks.v, 0);
    nt__fusion_stats_reset();
    for (int b = 0; b < NT_BACKEND_COUNT; b++)
        if (nt__backends[b] && nt__backends[b]->stats_clear)
            nt__backends[b]->stats_clear();
    nt__arena_reset_peak();
}

/* A device index's check for the byte counts below: 0, or the error. */
static int live_dev_ok(const char *fn, int dev)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (dev < 0 || dev >= nt_device_count())
        return nt__err(NULL, NT_EINVAL, fn, "argument 'dev' is %d; expected a device 0..%d",
                       dev, nt_device_count() - 1);
    return 0;
}

NT_API int64_t nt_device_bytes_live(int dev)
{
    int rc = live_dev_ok("nt_device_bytes_live", dev);
    return rc ? rc : (int64_t)nt__arena_live_on(dev);
}

NT_API int64_t nt_device_bytes_live_peak(int dev)
{
    int rc = live_dev_ok("nt_device_bytes_live_peak", dev);
    return rc ? rc : (int64_t)nt__arena_live_peak_on(dev);
}
