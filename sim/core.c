/* sim/core.c - the simulated NeuronCore: memories, kernels, tile allocation,
 * dependency tracking, engine and DMA timelines, statistics, trace events.
 * The numbers come from NEURONCORE.md; docs/sim.md says which and why. */
#include "sim/sim.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

#include "core/simtls.h" /* the thread's core and timing hand-offs (sim/sim.h) */
#include "sim/trace.h"

nt__sim_global nt__sim;

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

/* Every value and its source: docs/sim.md, "Parameters and their sources".
 * A trn2 value differs from trn1's only where AWS publishes a different
 * NeuronCore-v3 figure; where it publishes none, v3 keeps v2's value. */
static void config_for(nt_sim_target t, nt_sim_config *c)
{
    memset(c, 0, sizeof *c);
    c->target = t;
    c->partitions = NT_SIM_PARTITIONS;
    c->psum_partition_bytes = NT__SIM_PSUM_BYTES; /* 2 MiB on both */
    c->dma_queues = NT_SIM_DMA_QUEUES;
    c->dma_engines = 16; /* per core on v2, v3 and v4 */
    /* NEURONCORE.md gives 1.3-2 us; the top of the range, see docs/sim.md */
    c->dma_fixed_ns = 2000.0;
    /* 27.2 GB/s in theory per engine on v2 and v3 alike, ~17 in practice */
    c->dma_engine_bytes_per_ns = 17.0;
    c->dma_min_descriptor_bytes = 64;
    c->min_instr_cycles = 64;
    c->access_latency_cycles = 60;
    c->act_table_switch_ns = 1000.0;
    c->tensor_rate[NT_SIM_MM_F32] = 0.25;
    c->tensor_rate[NT_SIM_MM_BF16] = 1.0;
    if (t == NT_SIM_TRN2) {
        c->name = "trn2 (NeuronCore-v3)";
        c->sbuf_partition_bytes = 224 * 1024;
        c->clock_ghz[NT_ENGINE_TENSOR] = 2.4;
        c->clock_ghz[NT_ENGINE_VECTOR] = 0.96;
        c->clock_ghz[NT_ENGINE_SCALAR] = 1.2;
        c->clock_ghz[NT_ENGINE_GPSIMD] = 1.2;
        c->hbm_bytes_per_ns = 2900.0 / 8.0; /* 2.9 TB/s per chip, 8 cores */
        c->tensor_rate[NT_SIM_MM_FP8] = 2.0; /* 158 against 79 TFLOPS */
        c->vector_perf_mode = true;
        c->vector_gpsimd_share_sbuf = false;
        c->vector_scalar_share_psum = false;
    } else {
        c->name = "trn1 (NeuronCore-v2)";
        c->sbuf_partition_bytes = 192 * 1024;
        c->clock_ghz[NT_ENGINE_TENSOR] = 2.8;
        c->clock_ghz[NT_ENGINE_VECTOR] = 1.12;
        c->clock_ghz[NT_ENGINE_SCALAR] = 1.4;
        c->clock_ghz[NT_ENGINE_GPSIMD] = 1.4;
        c->hbm_bytes_per_ns = 820.0 / 2.0; /* 820 GB/s per chip, 2 cores */
        c->tensor_rate[NT_SIM_MM_FP8] = 1.0; /* cFP8 at the bf16 rate */
        c->vector_perf_mode = false;
        c->vector_gpsimd_share_sbuf = true;
        c->vector_scalar_share_psum = true;
    }
    for (int f = 0; f < NT_SIM_MM_FORMATS; f++)
        c->tensor_peak_flops[f] =
            128.0 * 128.0 * 2.0 * c->clock_ghz[NT_ENGINE_TENSOR] * 1e9 * c->tensor_rate[f];
    c->tensor_peak_flops_bf16 = c->tensor_peak_flops[NT_SIM_MM_BF16];
    c->tensor_peak_flops_f32 = c->tensor_peak_flops[NT_SIM_MM_F32];
}

static const char *engine_names[NT_ENGINE_COUNT] = {"TensorE", "VectorE", "ScalarE", "GpSimd",
                                                    "DMA"};

const char *nt_engine_name(nt_engine e)
{
    return (unsigned)e < NT_ENGINE_COUNT ? engine_names[e] : "?";
}

const char *nt_mem_name(nt_mem m)
{
    switch (m) {
    case NT_MEM_HBM: return "HBM";
    case NT_MEM_SBUF: return "SBUF";
    case NT_MEM_PSUM: return "PSUM";
    default: return "?";
    }
}

/* ------------------------------------------------------------------------ */
/* Global state                                                             */
/* ------------------------------------------------------------------------ */

/* Guards init/shutdown, the core count and the configuration.  Never held
 * while a kernel runs: each core has its own run_lock (kernel begin to end)
 * and stats_lock (its clock and statistics). */
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool inited;
static atomic_bool functional = true;
static atomic_bool program_gemm = true; /* NT_SIM_PROGRAM_GEMM */
static atomic_bool program_values = true; /* NT_SIM_PROGRAM_VALUES */
static bool trace_ours; /* nt_sim_init opened the trace (NT_TRACE) */

/* Dependency state of on-chip memory, per chunk.  An entry stamped by an
 * earlier kernel (gen) counts as empty: kernels are ordered by the core
 * anyway, and stale entries never need clearing.  One chunk's fields side
 * by side (32 bytes): every instruction walks its operands' chunks, and
 * one line then holds two chunks instead of one field of each. */
typedef struct dep_ent {
    double wend;  /* end of the last write */
    double avail; /* when readers see that write */
    double rend;  /* end of the latest read */
    uint32_t gen; /* kernel that wrote the entry */
    uint8_t weng; /* engine of the last write */
} dep_ent;
typedef struct nt__sim_dep {
    dep_ent e[NT__SIM_SBUF_CHUNKS];
} dep_tab; /* psum uses the first PSUM_CHUNKS */

/* HBM dependencies: an open-addressing table of 16 KiB pages, entries
 * belonging to an older kernel (gen) count as empty.  A page is counted from
 * the access pattern's base (its tensor's data), never from the host
 * address: where the host allocator put a buffer must not change the
 * simulated time (two identical runs give identical nanoseconds, whatever
 * each buffer's alignment, and two buffers never share a page). */
#define HBM_PAGE_SHIFT 14 /* 16 KiB: fine enough to pipeline tiles, cheap on 16 MiB DMAs */
/* Within a page, the bytes [lo, hi) an access touched and when it ended:
 * an access waits only for the accesses to bytes it touches (a DMA engine
 * orders nothing else; with a page's whole 16 KiB, the four-byte stores of
 * the gradient norms into one vector each waited for the one before).  A
 * page keeps its last HBM_RECS writes and reads; older ones are folded into
 * wold / rold, which cover the whole page (later than need be, never
 * earlier). */
#define HBM_RECS 4
typedef struct hrec {
    int32_t lo, hi;
    double t;
} hrec;
typedef struct nt__sim_hpage {
    uintptr_t base; /* the pattern's base pointer */
    uintptr_t key;  /* the page, counted from base */
    uint32_t gen;
    uint8_t nw, nr;
    double wold, rold;
    hrec w[HBM_RECS], r[HBM_RECS];
} hpage;

/* A program running on a core (sim/sim.h, "Programs"): the timeline state
 * its kernels carry over, and what they add up to. */
typedef struct nt__sim_prog {
    pthread_t owner;
    bool timed;
    nt__sim_prog_snap snap;  /* untimed: what the program adds */
    double clock0;           /* its start on the core's clock */
    double eng_free[NT_ENGINE_DMA], q_free[NT_SIM_DMA_QUEUES];
    double port_sbuf_vg, port_psum_vs;
    int act_table, rr_queue;
    int64_t sbuf_origin[2]; /* where the next kernels' SBUF first fit starts */
    double *bucket;          /* the DMA engines' bookings, program time */
    size_t nbucket;
    double *dma_iv;          /* DMA activity, program time */
    size_t n_iv, cap_iv;
    double tend;
    double busy[NT_ENGINE_COUNT], qbusy[NT_SIM_DMA_QUEUES], flops, ideal;
    uint64_t ninstr, kernels, hbm_rd, hbm_wr;
    nt__sim_range *map;      /* the allocations HBM pages are counted in */
    int nmap;
} nt__sim_prog;

/* The sums of kernel times, kept exactly in 128-bit fixed point (64
 * fractional bits hold every bit of a time above 2^-11 ns): integer
 * addition does not depend on the order kernels of several streams end in,
 * where double addition does in the last bits, so identical programs report
 * identical times.  stats' double fields are the sums rounded once.  One per
 * core (nt__sim_core.sums); the totals over cores add them exactly too. */
typedef __int128 nt_fx;
typedef struct fx_sums {
    nt_fx sim, busy[NT_ENGINE_COUNT], qbusy[NT_SIM_DMA_QUEUES], ideal;
} fx_sums;

static nt_fx to_fx(double ns) { return ns > 0 ? (nt_fx)ldexp(ns, 64) : 0; }
static double from_fx(nt_fx v) { return ldexp((double)v, -64); }

/* Core c's memories, taken at its first kernel (under its run_lock): a
 * core that runs nothing costs nothing. */
static int ensure_core(nt__sim_core *c)
{
    if (c->sbuf)
        return 0;
    /* calloc: untouched pages cost nothing in timing-only runs */
    c->sbuf_raw = calloc(1, (size_t)nt__sim.sbuf_stride * NT_SIM_PARTITIONS + 64);
    c->psum_raw = calloc(1, (size_t)nt__sim.psum_stride * NT_SIM_PARTITIONS + 64);
    for (int i = 0; i < 4; i++)
        if (!c->scratch[i])
            c->scratch[i] = malloc(nt__sim.scratch_elems * sizeof(float) * 2);
    if (!c->dep_sbuf)
        c->dep_sbuf = calloc(1, sizeof *c->dep_sbuf);
    if (!c->dep_psum)
        c->dep_psum = calloc(1, sizeof *c->dep_psum);
    if (!c->ht) {
        c->ht_cap = 4096;
        c->ht = calloc(c->ht_cap, sizeof *c->ht);
    }
    if (!c->sbuf_raw || !c->psum_raw || !c->dep_sbuf || !c->dep_psum || !c->ht ||
        !c->scratch[0] || !c->scratch[1] || !c->scratch[2] || !c->scratch[3]) {
        free(c->sbuf_raw);
        free(c->psum_raw);
        c->sbuf_raw = c->psum_raw = NULL;
        return NT_EHOSTMEM;
    }
    c->sbuf = (uint8_t *)(((uintptr_t)c->sbuf_raw + 63) & ~(uintptr_t)63);
    c->psum = (uint8_t *)(((uintptr_t)c->psum_raw + 63) & ~(uintptr_t)63);
    c->ht_gen = 1;
    return 0;
}

static int ensure_memories(int ncores)
{
    nt__sim.sbuf_stride = NT__SIM_SBUF_MAX_BYTES + NT__SIM_PART_PAD;
    nt__sim.psum_stride = NT__SIM_PSUM_BYTES + NT__SIM_PART_PAD;
    nt__sim.scratch_elems = NT_SIM_SBUF_MAX_FREE + 64;
    nt__sim.cores = calloc((size_t)ncores, sizeof *nt__sim.cores);
    if (!nt__sim.cores)
        return NT_EHOSTMEM;
    for (int i = 0; i < ncores; i++) {
        nt__sim_core *c = &nt__sim.cores[i];
        c->index = i;
        pthread_mutex_init(&c->run_lock, NULL);
        pthread_mutex_init(&c->stats_lock, NULL);
        c->sums = calloc(1, sizeof(fx_sums));
        if (!c->sums) {
            nt__sim.ncores = i + 1;
            return NT_EHOSTMEM;
        }
    }
    nt__sim.ncores = ncores;
    /* core 0 at once, as before cores existed: a simulator that cannot get
     * its memories fails at init, not at the first kernel */
    return ensure_core(&nt__sim.cores[0]);
}

static void free_memories(void)
{
    for (int i = 0; i < nt__sim.ncores; i++) {
        nt__sim_core *c = &nt__sim.cores[i];
        nt__sim_fx_shutdown(c);
        free(c->sbuf_raw);
        free(c->psum_raw);
        for (int j = 0; j < 4; j++)
            free(c->scratch[j]);
        free(c->dep_sbuf);
        free(c->dep_psum);
        free(c->ht);
        free(c->hp);
        free(c->pg_buf);
        free(c->sums);
        pthread_mutex_destroy(&c->run_lock);
        pthread_mutex_destroy(&c->stats_lock);
    }
    free(nt__sim.cores);
    nt__sim.cores = NULL;
    nt__sim.ncores = 0;
}

/* NT_SIM_CORES: 1..NT__SIM_MAX_CORES, default 1; 0 if malformed. */
static int env_cores(void)
{
    const char *v = getenv("NT_SIM_CORES");
    if (!v || !*v)
        return 1;
    if (strspn(v, "0123456789") != strlen(v) || strlen(v) > 3)
        return 0;
    int n = atoi(v);
    return n >= 1 && n <= NT__SIM_MAX_CORES ? n : 0;
}

/* Checks the simulator's environment variables (docs/env.md): a bad value
 * is an error naming the variable, never silently a default. */
static int check_env(void)
{
    static const struct { const char *name, *const vals[5], *expect; } V[] = {
        {"NT_SIM_TARGET", {"", "trn1", "trn2", "v2", "v3"}, "trn1 or trn2"},
        {"NT_SIM_FUNCTIONAL", {"", "0", "1", NULL, NULL}, "0 or 1"},
        {"NT_SIM_PROGRAM_GEMM", {"", "0", "1", NULL, NULL}, "0 or 1"},
        {"NT_SIM_PROGRAM_VALUES", {"", "0", "1", NULL, NULL}, "0 or 1"},
        {"NT_SIM_DEFER", {"", "0", "1", NULL, NULL}, "0 or 1"},
        {"NT_SIM_MEMO", {"", "0", "1", NULL, NULL}, "0 or 1"},
        {"NT_SIM_THREADS", {"", NULL, NULL, NULL, NULL}, "a count >= 1 (more than 2 uses 2)"},
    };
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        const char *v = getenv(V[i].name);
        if (!v)
            continue;
        bool ok = false;
        for (int k = 0; k < 5 && V[i].vals[k] && !ok; k++)
            ok = !strcmp(v, V[i].vals[k]);
        if (!strcmp(V[i].name, "NT_SIM_THREADS")) /* digits, not 0 */
            ok = !*v || (strspn(v, "0123456789") == strlen(v) && strspn(v, "0") < strlen(v));
        if (!ok)
            return nt__err(NULL, NT_EINVAL, "nt_sim_init",
                           "environment variable %s: expected %s, got '%s'", V[i].name,
                           V[i].expect, v);
    }
    if (!env_cores())
        return nt__err(NULL, NT_EINVAL, "nt_sim_init",
                       "environment variable NT_SIM_CORES: expected a core count from 1 to %d, "
                       "got '%s'", NT__SIM_MAX_CORES, getenv("NT_SIM_CORES"));
    return 0;
}

int nt_sim_init(void)
{
    if (atomic_load_explicit(&inited, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&state_lock);
    int rc = 0;
    if (!atomic_load(&inited) && (rc = check_env()) == 0) {
        const char *t = getenv("NT_SIM_TARGET");
        nt_sim_target target = NT_SIM_TRN1;
        if (t && (!strcmp(t, "trn2") || !strcmp(t, "v3")))
            target = NT_SIM_TRN2;
        config_for(target, &nt__sim.cfg);
        const char *f = getenv("NT_SIM_FUNCTIONAL");
        if (f && f[0] == '0')
            atomic_store(&functional, false);
        const char *pg = getenv("NT_SIM_PROGRAM_GEMM");
        atomic_store(&program_gemm, !(pg && pg[0] == '0'));
        const char *pv = getenv("NT_SIM_PROGRAM_VALUES");
        atomic_store(&program_values, !(pv && pv[0] == '0'));
        rc = ensure_memories(env_cores());
        if (rc == 0) {
            const char *tr = getenv("NT_TRACE");
            if (tr && *tr && !nt__trace_is_open()) {
                /* the simulator alone: every instruction unless
                 * NT_TRACE_LEVEL says less (it has no steps) */
                int lv = nt__trace_level_parse(getenv("NT_TRACE_LEVEL"));
                nt__trace_set_level(lv ? lv : NT__TRACE_INSTR);
                nt__trace_set_steps(0, INT64_MAX);
                trace_ours = nt__trace_open(tr) == 0;
            }
            atomic_store_explicit(&inited, true, memory_order_release);
        } else {
            free_memories();
        }
    }
    pthread_mutex_unlock(&state_lock);
    return rc;
}

void nt_sim_shutdown(void)
{
    pthread_mutex_lock(&state_lock);
    if (atomic_load(&inited)) {
        /* no kernel may be open on any core: wait out each core's (one at
         * a time; a kernel begun meanwhile is the caller's error, as
         * before) */
        for (int i = 0; i < nt__sim.ncores; i++) {
            pthread_mutex_lock(&nt__sim.cores[i].run_lock);
            pthread_mutex_unlock(&nt__sim.cores[i].run_lock);
        }
        if (trace_ours)
            nt__trace_close();
        trace_ours = false;
        free_memories();
        atomic_store(&inited, false);
    }
    pthread_mutex_unlock(&state_lock);
}

int nt_sim_config_get(nt_sim_config *out)
{
    if (!out)
        return NT__SIM_NULL("nt_sim_config_get", "out");
    int rc = nt_sim_init();
    if (rc)
        return rc;
    pthread_mutex_lock(&state_lock);
    *out = nt__sim.cfg;
    pthread_mutex_unlock(&state_lock);
    return 0;
}

int nt_sim_target_config(nt_sim_target target, nt_sim_config *out)
{
    if (target != NT_SIM_TRN1 && target != NT_SIM_TRN2)
        return nt__err(NULL, NT_EINVAL, "nt_sim_target_config",
                       "argument 'target' is %d; expected NT_SIM_TRN1 or NT_SIM_TRN2",
                       (int)target);
    if (!out)
        return NT__SIM_NULL("nt_sim_target_config", "out");
    config_for(target, out);
    return 0;
}

int nt_sim_set_target(nt_sim_target target)
{
    if (target != NT_SIM_TRN1 && target != NT_SIM_TRN2)
        return nt__err(NULL, NT_EINVAL, "nt_sim_set_target",
                       "argument 'target' is %d; expected NT_SIM_TRN1 or NT_SIM_TRN2",
                       (int)target);
    int rc = nt_sim_init();
    if (rc)
        return rc;
    /* every core idle: a kernel reads the configuration while it runs */
    pthread_mutex_lock(&state_lock);
    for (int i = 0; i < nt__sim.ncores; i++)
        pthread_mutex_lock(&nt__sim.cores[i].run_lock);
    config_for(target, &nt__sim.cfg);
    for (int i = nt__sim.ncores - 1; i >= 0; i--)
        pthread_mutex_unlock(&nt__sim.cores[i].run_lock);
    pthread_mutex_unlock(&state_lock);
    return 0;
}

void nt_sim_set_functional(bool on)
{
    nt_sim_init();
    atomic_store(&functional, on);
}

bool nt__sim_program_gemm(void) { return atomic_load(&program_gemm); }
void nt__sim_set_program_gemm(bool on) { atomic_store(&program_gemm, on); }
bool nt__sim_program_values(void) { return atomic_load(&program_values); }
bool nt__sim_kernel_functional(const nt_sim_kernel *k) { return k->functional; }
void nt__sim_kernel_set_functional(nt_sim_kernel *k, bool on) { k->functional = on; }
double nt__sim_kernel_engine_free(const nt_sim_kernel *k, nt_engine e)
{
    return e >= 0 && e < NT_ENGINE_DMA ? k->eng_free[e] : 0.0;
}
void nt__sim_set_program_values(bool on) { atomic_store(&program_values, on); }

bool nt_sim_get_functional(void)
{
    nt_sim_init();
    return atomic_load(&functional);
}

/* ------------------------------------------------------------------------ */
/* Access patterns                                                          */
/* ------------------------------------------------------------------------ */

void nt__sim_canon(const nt_ap *ap, nt__sim_shape *s)
{
    int nd = 0;
    for (int i = 0; i < ap->ndim && i < NT_AP_MAX_DIMS; i++) {
        if (ap->num[i] == 1)
            continue;
        if (nd > 0 && s->step[nd - 1] == ap->num[i] * ap->step[i]) {
            /* previous dim steps exactly over this one: merge */
            s->num[nd - 1] *= ap->num[i];
            s->step[nd - 1] = ap->step[i];
            continue;
        }
        s->num[nd] = ap->num[i];
        s->step[nd] = ap->step[i];
        nd++;
    }
    if (nd == 0) {
        s->num[0] = 1;
        s->step[0] = 1;
        nd = 1;
    }
    s->nd = nd;
}

int64_t nt__sim_free_count(const nt_ap *ap)
{
    int64_t n = 1;
    for (int i = 0; i < ap->ndim && i < NT_AP_MAX_DIMS; i++)
        n *= ap->num[i];
    return n;
}

void nt__sim_extent(const nt_ap *ap, int64_t *lo, int64_t *hi)
{
    int64_t a = 0, b = 0;
    for (int i = 0; i < ap->ndim && i < NT_AP_MAX_DIMS; i++) {
        int64_t d = (ap->num[i] - 1) * ap->step[i];
        if (d > 0)
            b += d;
        else
            a += d;
    }
    *lo = a;
    *hi = b;
}

int64_t nt__sim_pstride(const nt_ap *ap)
{
    if (!ap->tile)
        return ap->pstep * (int64_t)nt__dtype_size(ap->dtype);
    return ap->tile->mem == NT_MEM_PSUM ? nt__sim.psum_stride : nt__sim.sbuf_stride;
}

uint8_t *nt__sim_row(const nt_ap *ap, int p)
{
    int64_t esz = (int64_t)nt__dtype_size(ap->dtype);
    if (!ap->tile)
        return (uint8_t *)ap->hbm + (ap->offset + (int64_t)p * ap->pstep) * esz;
    const nt_tile *t = ap->tile;
    uint8_t *base = t->mem == NT_MEM_PSUM ? t->k->core->psum : t->k->core->sbuf;
    int64_t stride = t->mem == NT_MEM_PSUM ? nt__sim.psum_stride : nt__sim.sbuf_stride;
    return base + (int64_t)(ap->p0 + p) * stride + t->off + ap->offset * esz;
}

/* Built with one initialiser (the rest zero), no memset and copy: the
 * kernels make several patterns per instruction they issue.  An exported
 * function is not inlined into another (it could be interposed), so the
 * slice does not go through nt_tile_ap. */
static inline nt_ap tile_ap(const nt_tile *t, int p0, int np, int64_t f0, int64_t nf)
{
    if (!t)
        return (nt_ap){.p0 = p0, .np = np, .offset = f0, .num = {nf}};
    return (nt_ap){.tile = (nt_tile *)t, .dtype = t->dt, .p0 = p0, .np = np, .offset = f0,
                   .ndim = 1, .num = {nf}, .step = {1}};
}

nt_ap nt_tile_ap(const nt_tile *t)
{
    if (!t)
        return tile_ap(NULL, 0, 0, 0, 0);
    return tile_ap(t, 0, t->parts, 0, t->nfree);
}

nt_ap nt_tile_slice(const nt_tile *t, int p0, int np, int64_t f0, int64_t nf)
{
    return tile_ap(t, p0, np, f0, nf);
}

nt_ap nt_hbm_ap(const void *base, nt_dtype dt, int64_t offset, int64_t rows, int64_t row_stride,
                int64_t cols)
{
    nt_ap ap;
    memset(&ap, 0, sizeof ap);
    ap.hbm = (void *)base;
    ap.dtype = dt;
    /* np is 32-bit: a row count it cannot hold becomes -1, which every
     * instruction refuses, instead of a silently truncated count */
    ap.np = rows >= 0 && rows <= INT32_MAX ? (int32_t)rows : -1;
    ap.pstep = row_stride;
    ap.offset = offset;
    ap.ndim = 1;
    ap.num[0] = cols;
    ap.step[0] = 1;
    return ap;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

int nt__sim_fail(nt_sim_kernel *k, const char *instr, const char *fmt, ...)
{
    if (k->err)
        return k->err;
    int n = snprintf(k->msg, sizeof k->msg, "%.32s in kernel '%.63s' (instruction #%llu): ",
                     instr, k->name, (unsigned long long)k->ninstr);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof k->msg)
        vsnprintf(k->msg + n, sizeof k->msg - (size_t)n, fmt, ap);
    va_end(ap);
    k->err = NT_ESIM;
    return NT_ESIM;
}

int nt_sim_kernel_error(const nt_sim_kernel *k)
{
    return k ? k->err : NT__SIM_NULL("nt_sim_kernel_error", "k");
}

const char *nt_sim_kernel_message(const nt_sim_kernel *k)
{
    return k ? k->msg : "";
}

int nt_sim_kernel_last(const nt_sim_kernel *k, nt_sim_instr_info *out)
{
    if (!k || !out)
        return NT__SIM_NULL("nt_sim_kernel_last", k ? "out" : "k");
    if (!k->has_last)
        return nt__err(NULL, NT_ESTATE, "nt_sim_kernel_last",
                       "kernel '%s' has issued no instruction yet", k->name);
    *out = k->last;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Tile allocator                                                           */
/* ------------------------------------------------------------------------ */

static int alloc_init(nt__sim_alloc *a, int64_t total)
{
    a->cap = 16;
    a->free = malloc(sizeof *a->free * (size_t)a->cap);
    if (!a->free)
        return NT_EHOSTMEM;
    a->n = 1;
    a->free[0] = (nt__sim_block){0, total};
    a->total = total;
    a->used = a->peak = 0;
    a->origin = a->hi = 0;
    a->down = false;
    return 0;
}

static int64_t align_up(int64_t x, int64_t a)
{
    return (x + a - 1) / a * a;
}

/* Where a block of `size` bytes fits inside free block b, or -1.  PSUM tiles
 * stay inside one bank. */
static int64_t fit_in(const nt__sim_block *b, int64_t size, bool psum)
{
    int64_t s = align_up(b->off, NT__SIM_ALIGN);
    if (psum && s / NT_SIM_PSUM_BANK_BYTES != (s + size - 1) / NT_SIM_PSUM_BANK_BYTES)
        s = align_up(s, NT_SIM_PSUM_BANK_BYTES);
    return s + size <= b->off + b->size ? s : -1;
}

/* Where a block of `size` bytes fits inside free block b below `top`,
 * as high as it can (an SBUF allocation from the top down), or -1. */
static int64_t fit_down(const nt__sim_block *b, int64_t size, int64_t top)
{
    if (top > b->off + b->size)
        top = b->off + b->size;
    int64_t s = (top - size) / NT__SIM_ALIGN * NT__SIM_ALIGN;
    return top - size >= b->off && s >= b->off ? s : -1;
}

/* Free block j of the scan in a's direction, fit at most `reach` bytes
 * from a's end (pass 0: the origin; pass 1: all of it); -1 if none. */
static int64_t fit_dir(const nt__sim_alloc *a, int j, int64_t size, bool psum, int64_t reach)
{
    const nt__sim_block *b = &a->free[j];
    if (a->down)
        return fit_down(b, size, a->total - reach);
    if (b->off + b->size <= reach)
        return -1;
    nt__sim_block up = *b;
    if (up.off < reach) {
        up.size -= reach - up.off;
        up.off = reach;
    }
    return fit_in(&up, size, psum);
}

static int64_t alloc_take(nt__sim_alloc *a, int64_t size, bool psum)
{
    /* pass 0: first fit from the origin on; pass 1: from the end */
    for (int pass = a->origin > 0 ? 0 : 1, t = 0; pass < 2; pass++, t = 0)
    for (; t < a->n; t++) {
        int i = a->down ? a->n - 1 - t : t;
        nt__sim_block *b = &a->free[i];
        int64_t s = fit_dir(a, i, size, psum, pass == 0 ? a->origin : 0);
        if (s < 0)
            continue;
        int64_t end = b->off + b->size;
        int64_t head = s - b->off, tail = end - (s + size);
        if (head > 0 && tail > 0) {
            if (a->n == a->cap) {
                nt__sim_block *nb = realloc(a->free, sizeof *nb * (size_t)a->cap * 2);
                if (!nb)
                    return -1;
                a->free = nb;
                a->cap *= 2;
                b = &a->free[i];
            }
            memmove(&a->free[i + 2], &a->free[i + 1], sizeof *b * (size_t)(a->n - i - 1));
            a->free[i + 1] = (nt__sim_block){s + size, tail};
            b->size = head;
            a->n++;
        } else if (head > 0) {
            b->size = head;
        } else if (tail > 0) {
            b->off = s + size;
            b->size = tail;
        } else {
            memmove(&a->free[i], &a->free[i + 1], sizeof *b * (size_t)(a->n - i - 1));
            a->n--;
        }
        a->used += size;
        if (a->used > a->peak)
            a->peak = a->used;
        int64_t reach = a->down ? a->total - s : s + size;
        if (reach > a->hi)
            a->hi = reach;
        return s;
    }
    return -1;
}

static void alloc_give(nt__sim_alloc *a, int64_t off, int64_t size)
{
    int i = 0;
    while (i < a->n && a->free[i].off < off)
        i++;
    bool merge_prev = i > 0 && a->free[i - 1].off + a->free[i - 1].size == off;
    bool merge_next = i < a->n && off + size == a->free[i].off;
    if (merge_prev && merge_next) {
        a->free[i - 1].size += size + a->free[i].size;
        memmove(&a->free[i], &a->free[i + 1], sizeof *a->free * (size_t)(a->n - i - 1));
        a->n--;
    } else if (merge_prev) {
        a->free[i - 1].size += size;
    } else if (merge_next) {
        a->free[i].off = off;
        a->free[i].size += size;
    } else {
        if (a->n == a->cap) {
            nt__sim_block *nb = realloc(a->free, sizeof *nb * (size_t)a->cap * 2);
            if (!nb)
                return; /* leak the space rather than corrupt the list */
            a->free = nb;
            a->cap *= 2;
        }
        memmove(&a->free[i + 1], &a->free[i], sizeof *a->free * (size_t)(a->n - i));
        a->free[i] = (nt__sim_block){off, size};
        a->n++;
    }
    a->used -= size;
}

/* A program's kernels take their SBUF tiles away from the kernels just
 * before them, as a compiler that allocates the whole program's buffers
 * does: each kernel from offset 0 made every kernel's first tiles wait for
 * the last one's reads of the same bytes (a run of 4-byte copies each
 * waited for the one before it to store).  Every other kernel fits from
 * the top down (the mirror image of first fit: it fits whatever first fit
 * does), and each starts where the last kernel from the same end stopped,
 * while that is below SBUF_ORIGIN_MAX, so a kernel planned within its
 * budget (neuron/sk.h: 160 of 192 KiB) has room there; past that it
 * starts from its end again.  Either way a tile that does not fit there
 * takes the first fit over all of SBUF.  Only the runtime's own kernels,
 * planned within that budget, are placed so (nt__sim_kernel_spread, from
 * neuron/ sk_begin); a user's tile kernel may count on SBUF from 0. */
#define SBUF_ORIGIN_MAX (24 * 1024)
static int64_t next_origin(const nt__sim_alloc *a)
{
    return a->hi < SBUF_ORIGIN_MAX ? a->hi : 0;
}

void nt__sim_kernel_spread(nt_sim_kernel *k)
{
    nt__sim_prog *pg = k && k->in_prog ? k->core->prog : NULL;
    if (!pg || !pg->timed || k->sbuf.used)
        return;
    k->sbuf.down = pg->kernels & 1;
    k->sbuf.origin = pg->sbuf_origin[pg->kernels & 1];
}

static int64_t alloc_largest(const nt__sim_alloc *a, bool psum)
{
    int64_t best = 0;
    for (int i = 0; i < a->n; i++) {
        const nt__sim_block *b = &a->free[i];
        int64_t s = align_up(b->off, NT__SIM_ALIGN), end = b->off + b->size;
        if (!psum) {
            if (end - s > best)
                best = end - s;
            continue;
        }
        /* the largest bank-contained piece */
        for (int64_t bank = s / NT_SIM_PSUM_BANK_BYTES * NT_SIM_PSUM_BANK_BYTES; bank < end;
             bank += NT_SIM_PSUM_BANK_BYTES) {
            int64_t lo = s > bank ? s : bank;
            int64_t hi = end < bank + NT_SIM_PSUM_BANK_BYTES ? end : bank + NT_SIM_PSUM_BANK_BYTES;
            if (hi - lo > best)
                best = hi - lo;
        }
    }
    return best;
}

static const char *dt_name(nt_dtype dt)
{
    return nt_dtype_name(dt);
}

nt_tile *nt_tile_alloc(nt_sim_kernel *k, const char *name, nt_mem mem, nt_dtype dt,
                       int partitions, int64_t free_elems)
{
    static const char *I = "nt_tile_alloc";
    if (!k) {
        NT__SIM_NULL(I, "k");
        return NULL;
    }
    if (k->err)
        return NULL;
    if (!name)
        name = "?";
    if (mem != NT_MEM_SBUF && mem != NT_MEM_PSUM) {
        nt__sim_fail(k, I, "tile '%s': memory %s is not on chip (rule: tiles live in SBUF or PSUM)",
                     name, nt_mem_name(mem));
        return NULL;
    }
    if ((unsigned)dt >= NT_DTYPE_COUNT || !nt__dtype_on_device(dt)) {
        nt__sim_fail(k, I, "tile '%s': bad dtype %s (%d) (rule: f32, bf16, f16, e4m3, e5m2, "
                     "i32 or u8: the engines have no f64, i64 or bool datapath)", name,
                     dt_name(dt), (int)dt);
        return NULL;
    }
    if (partitions < 1 || partitions > NT_SIM_PARTITIONS) {
        nt__sim_fail(k, I, "tile '%s': %d partitions (rule: 1 <= partitions <= 128)", name,
                     partitions);
        return NULL;
    }
    if (free_elems < 1) {
        nt__sim_fail(k, I, "tile '%s': free size %lld (rule: free size >= 1)", name,
                     (long long)free_elems);
        return NULL;
    }
    bool psum = mem == NT_MEM_PSUM;
    nt__sim_alloc *a = psum ? &k->psum : &k->sbuf;
    /* Checked before the multiplication below, which would wrap for a huge
     * free size and leave a tiny block behind a huge tile. */
    if (free_elems > a->total / (int64_t)nt__dtype_size(dt)) {
        nt__sim_fail(k, I,
                     "tile '%s' [%d x %lld %s] needs more than the %lld B per partition of %s "
                     "(rule: a tile fits in its memory)",
                     name, partitions, (long long)free_elems, dt_name(dt), (long long)a->total,
                     nt_mem_name(mem));
        return NULL;
    }
    int64_t bytes = free_elems * (int64_t)nt__dtype_size(dt);
    if (psum && bytes > NT_SIM_PSUM_BANK_BYTES) {
        nt__sim_fail(k, I,
                     "tile '%s' [%d x %lld %s] needs %lld B per partition (rule: a PSUM tile fits "
                     "in one 2048 B bank)",
                     name, partitions, (long long)free_elems, dt_name(dt), (long long)bytes);
        return NULL;
    }
    int64_t off = alloc_take(a, bytes, psum);
    if (off < 0) {
        nt__sim_fail(k, I,
                     "tile '%s' [%d x %lld %s] needs %lld B per partition but %s has %lld B free "
                     "in its largest block (%lld of %lld B in use) (rule: %s capacity %lld B per "
                     "partition)",
                     name, partitions, (long long)free_elems, dt_name(dt), (long long)bytes,
                     nt_mem_name(mem), (long long)alloc_largest(a, psum), (long long)a->used,
                     (long long)a->total, nt_mem_name(mem), (long long)a->total);
        return NULL;
    }
    nt_tile *t = calloc(1, sizeof *t);
    if (!t) {
        alloc_give(a, off, bytes);
        k->err = NT_EHOSTMEM;
        snprintf(k->msg, sizeof k->msg, "%s in kernel '%s': out of host memory", I, k->name);
        return NULL;
    }
    t->k = k;
    g_strlcpy(t->name, name, sizeof t->name);
    t->mem = mem;
    t->dt = dt;
    t->parts = partitions;
    t->nfree = free_elems;
    t->off = off;
    t->bytes = bytes;
    t->live = true;
    t->next = k->tiles;
    k->tiles = t;
    return t;
}

int nt_tile_release(nt_sim_kernel *k, nt_tile *t)
{
    if (!k || !t)
        return NT__SIM_NULL("nt_tile_release", k ? "t" : "k");
    if (t->k != k || !t->live)
        return nt__sim_fail(k, "nt_tile_release",
                            "tile '%s' is not a live tile of this kernel (rule: release a tile "
                            "once, in its kernel)",
                            t->name);
    alloc_give(t->mem == NT_MEM_PSUM ? &k->psum : &k->sbuf, t->off, t->bytes);
    t->live = false;
    return 0;
}

int64_t nt_tile_free_bytes(const nt_sim_kernel *k, nt_mem mem)
{
    if (!k || (mem != NT_MEM_SBUF && mem != NT_MEM_PSUM))
        return 0;
    return alloc_largest(mem == NT_MEM_PSUM ? &k->psum : &k->sbuf, mem == NT_MEM_PSUM);
}

int nt__sim_free_banks(const nt_sim_kernel *k)
{
    int n = 0;
    for (int i = 0; i < k->psum.n; i++) {
        const nt__sim_block *b = &k->psum.free[i];
        int64_t s = align_up(b->off, NT_SIM_PSUM_BANK_BYTES), e = b->off + b->size;
        if (e > s)
            n += (int)((e - s) / NT_SIM_PSUM_BANK_BYTES);
    }
    return n;
}

nt_dtype nt_tile_dtype(const nt_tile *t)
{
    return t ? t->dt : NT_DTYPE_COUNT;
}

int nt_tile_partitions(const nt_tile *t)
{
    return t ? t->parts : 0;
}

int64_t nt_tile_size(const nt_tile *t)
{
    return t ? t->nfree : 0;
}

/* ------------------------------------------------------------------------ */
/* Kernels                                                                  */
/* ------------------------------------------------------------------------ */

int nt__sim_trace_pid(int core)
{
    return core <= 0 ? NT_TRACE_PID_SIM : NT_TRACE_PID_CORE0 + core;
}

/* Names core c's track group once per trace file (under its run_lock). */
static void trace_meta(nt__sim_core *c)
{
    unsigned g = nt__trace_generation();
    if (g == c->trace_gen_seen)
        return;
    c->trace_gen_seen = g;
    int pid = nt__sim_trace_pid(c->index);
    if (c->index == 0) {
        nt__trace_process_name(pid, "NeuronCore (simulated)", 1);
    } else {
        char n[48];
        snprintf(n, sizeof n, "NeuronCore %d (simulated)", c->index);
        nt__trace_process_name(pid, n, 2 + c->index);
    }
    nt__trace_thread_name(pid, 0, "kernels", 0);
    for (int e = 0; e < NT_ENGINE_DMA; e++)
        nt__trace_thread_name(pid, 1 + e, engine_names[e], 1 + e);
    for (int q = 0; q < NT_SIM_DMA_QUEUES; q++) {
        char n[32];
        snprintf(n, sizeof n, "DMA queue %d", q);
        nt__trace_thread_name(pid, 16 + q, n, 16 + q);
    }
}

/* ---- cores and threads (sim/sim.h) ---- */

int nt__sim_core_count(void)
{
    if (nt_sim_init())
        return 0;
    return nt__sim.ncores;
}

void nt__sim_thread_core_set(int core) { nt__tl_core = core; }
int nt__sim_thread_core(void) { return nt__tl_core; }
void nt__sim_thread_after(double t)
{
    nt__tl_sim_after = t;
    nt__tl_sim_end = -1.0;
}
double nt__sim_thread_last_end(void) { return nt__tl_sim_end; }

static nt__sim_core *core_at(int core)
{
    if (!atomic_load_explicit(&inited, memory_order_acquire) || core < 0 ||
        core >= nt__sim.ncores)
        return NULL;
    return &nt__sim.cores[core];
}

double nt__sim_core_clock(int core)
{
    nt__sim_core *c = core_at(core);
    if (!c)
        return 0.0;
    pthread_mutex_lock(&c->stats_lock);
    double t = c->clock;
    pthread_mutex_unlock(&c->stats_lock);
    return t;
}

void nt__sim_core_advance(int core, double t)
{
    nt__sim_core *c = core_at(core);
    if (!c)
        return;
    pthread_mutex_lock(&c->stats_lock);
    if (t > c->clock)
        c->clock = t;
    pthread_mutex_unlock(&c->stats_lock);
}

nt_sim_kernel *nt_sim_kernel_begin(const char *name)
{
    if (nt_sim_init())
        return NULL;
    nt_sim_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    /* the thread's core; one it cannot have (more than NT_SIM_CORES) is
     * core 0's, which the runtime never asks for (it checks devices) */
    int ci = nt__tl_core;
    nt__sim_core *core = &nt__sim.cores[ci >= 0 && ci < nt__sim.ncores ? ci : 0];
    double after = nt__tl_sim_after;
    nt__tl_sim_after = 0.0;
    /* a program of this thread holds the core already; another's makes
     * this wait for its end */
    nt__sim_prog *pg = __atomic_load_n(&core->prog, __ATOMIC_ACQUIRE);
    bool mine = pg && pthread_equal(pg->owner, pthread_self());
    if (!mine) {
        pthread_mutex_lock(&core->run_lock);
        pg = NULL;
    }
    k->core = core;
    const nt_sim_config *c = &nt__sim.cfg;
    if (ensure_core(core) || alloc_init(&k->sbuf, c->sbuf_partition_bytes) ||
        alloc_init(&k->psum, c->psum_partition_bytes)) {
        if (!pg)
            pthread_mutex_unlock(&core->run_lock);
        free(k->sbuf.free);
        free(k->psum.free);
        free(k);
        return NULL;
    }
    g_strlcpy(k->name, name ? name : "kernel", sizeof k->name);
    k->functional = atomic_load(&functional);
    /* Timed from 0, placed on the clock only in reports: a kernel's
     * duration must not depend on how far the clock has run (doubles round
     * t0 + x - t0 differently at different t0, and the order kernels of
     * several streams reach the core is host timing).  It starts when its
     * core is free and what it reads is ready (sim/sim.h). */
    pthread_mutex_lock(&core->stats_lock);
    k->clock0 = core->clock;
    pthread_mutex_unlock(&core->stats_lock);
    if (after > k->clock0)
        k->clock0 = after;
    k->t0 = k->tend = 0.0;
    for (int e = 0; e < NT_ENGINE_DMA; e++)
        k->eng_free[e] = k->t0;
    for (int q = 0; q < NT_SIM_DMA_QUEUES; q++)
        k->q_free[q] = k->t0;
    k->port_sbuf_vg = k->port_psum_vs = k->t0;
    k->act_table = -1;
    k->host_t0 = nt__sim_now_ns();
    k->tmin = INFINITY;
    if (pg && pg->timed) {
        /* the program's timeline goes on: engines, queues, the DMA
         * engines' bookings, the dependency tables (no new generation) */
        k->in_prog = true;
        k->clock0 = pg->clock0;
        memcpy(k->eng_free, pg->eng_free, sizeof k->eng_free);
        memcpy(k->q_free, pg->q_free, sizeof k->q_free);
        k->port_sbuf_vg = pg->port_sbuf_vg;
        k->port_psum_vs = pg->port_psum_vs;
        k->act_table = pg->act_table;
        k->rr_queue = pg->rr_queue;
        k->bucket = pg->bucket, pg->bucket = NULL;
        k->nbucket = pg->nbucket;
        k->dma_iv = pg->dma_iv, pg->dma_iv = NULL;
        k->n_iv = pg->n_iv;
        k->cap_iv = pg->cap_iv;
    } else {
        k->in_prog = pg != NULL; /* untimed: its own throwaway timeline */
        if (++core->ht_gen == 0)
            core->ht_gen = 1;
        core->ht_count = 0;
    }
    if (nt__trace_enabled())
        trace_meta(core);
    return k;
}

static int cmp_iv(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? -1 : x > y;
}

/* Time during which at least one DMA queue was active. */
static double dma_union(nt_sim_kernel *k)
{
    if (!k->n_iv)
        return 0.0;
    qsort(k->dma_iv, k->n_iv, 2 * sizeof(double), cmp_iv);
    double total = 0.0, s = k->dma_iv[0], e = k->dma_iv[1];
    for (size_t i = 1; i < k->n_iv; i++) {
        double a = k->dma_iv[2 * i], b = k->dma_iv[2 * i + 1];
        if (a > e) {
            total += e - s;
            s = a;
            e = b;
        } else if (b > e) {
            e = b;
        }
    }
    return total + (e - s);
}

bool nt__sim_kernel_snap(const nt_sim_kernel *k, nt__sim_ksnap *out)
{
    memset(out, 0, sizeof *out);
    if (k->n_iv && !(out->iv = malloc(k->n_iv * 2 * sizeof *out->iv)))
        return false;
    if (k->n_iv)
        memcpy(out->iv, k->dma_iv, k->n_iv * 2 * sizeof *out->iv);
    out->n_iv = k->n_iv;
    out->ninstr = k->ninstr;
    out->hbm_rd = k->hbm_rd;
    out->hbm_wr = k->hbm_wr;
    out->tend = k->tend;
    out->flops = k->flops;
    out->ideal_ns = k->ideal_ns;
    memcpy(out->busy, k->busy, sizeof out->busy);
    memcpy(out->qbusy, k->qbusy, sizeof out->qbusy);
    out->sbuf_peak = k->sbuf.peak;
    out->psum_peak = k->psum.peak;
    return true;
}

bool nt__sim_kernel_restore(nt_sim_kernel *k, const nt__sim_ksnap *s)
{
    if (s->n_iv > k->cap_iv) {
        double *iv = realloc(k->dma_iv, s->n_iv * 2 * sizeof *iv);
        if (!iv)
            return false;
        k->dma_iv = iv;
        k->cap_iv = s->n_iv;
    }
    if (s->n_iv)
        memcpy(k->dma_iv, s->iv, s->n_iv * 2 * sizeof *s->iv);
    k->n_iv = s->n_iv;
    k->ninstr = s->ninstr;
    k->hbm_rd = s->hbm_rd;
    k->hbm_wr = s->hbm_wr;
    k->tend = s->tend;
    k->flops = s->flops;
    k->ideal_ns = s->ideal_ns;
    memcpy(k->busy, s->busy, sizeof k->busy);
    memcpy(k->qbusy, s->qbusy, sizeof k->qbusy);
    k->sbuf.peak = s->sbuf_peak; /* k allocated nothing */
    k->psum.peak = s->psum_peak;
    return true;
}

void nt__sim_ksnap_free(nt__sim_ksnap *s)
{
    free(s->iv);
    s->iv = NULL;
    s->n_iv = 0;
}

static void kernel_free(nt_sim_kernel *k)
{
    for (nt_tile *t = k->tiles, *n; t; t = n) {
        n = t->next;
        free(t);
    }
    free(k->sbuf.free);
    free(k->psum.free);
    free(k->dma_iv);
    free(k->bucket);
    free(k);
}

/* The end of a kernel of a program: its timeline goes back to the program,
 * its counts into the program's (timed) or nowhere (untimed: the snapshot
 * has them); the core's clock and time move at the program's end. */
static int prog_kernel_end(nt_sim_kernel *k, nt__sim_prog *pg, nt_sim_report *rep)
{
    nt__sim_core *core = k->core;
    double t0 = k->tmin < k->tend ? k->tmin : k->tend;
    if (rep) {
        memset(rep, 0, sizeof *rep);
        g_strlcpy(rep->name, k->name, sizeof rep->name);
        rep->error = k->err;
        g_strlcpy(rep->message, k->msg, sizeof rep->message);
        rep->start_ns = k->clock0 + t0;
        rep->end_ns = k->clock0 + k->tend;
        rep->duration_ns = k->tend - t0;
        memcpy(rep->busy_ns, k->busy, sizeof rep->busy_ns);
        memcpy(rep->dma_queue_busy_ns, k->qbusy, sizeof rep->dma_queue_busy_ns);
        rep->instructions = k->ninstr;
        rep->flops = k->flops;
        rep->tensor_ideal_ns = k->ideal_ns;
        rep->hbm_read_bytes = k->hbm_rd;
        rep->hbm_write_bytes = k->hbm_wr;
        rep->sbuf_peak_bytes = k->sbuf.peak;
        rep->psum_peak_bytes = k->psum.peak;
    }
    if (pg->timed) {
        if (nt__trace_at(NT__TRACE_KERNEL) && k->ninstr) {
            trace_meta(core);
            char args[256];
            snprintf(args, sizeof args,
                     "{\"instructions\":%llu,\"flops\":%.0f,\"hbm_read\":%llu,"
                     "\"hbm_write\":%llu,\"in_program\":true}",
                     (unsigned long long)k->ninstr, k->flops, (unsigned long long)k->hbm_rd,
                     (unsigned long long)k->hbm_wr);
            nt__trace_complete(nt__sim_trace_pid(core->index), 0, k->name,
                               (k->clock0 + t0) / 1e3, (k->tend - t0) / 1e3, args);
        }
        memcpy(pg->eng_free, k->eng_free, sizeof pg->eng_free);
        memcpy(pg->q_free, k->q_free, sizeof pg->q_free);
        pg->port_sbuf_vg = k->port_sbuf_vg;
        pg->port_psum_vs = k->port_psum_vs;
        pg->act_table = k->act_table;
        pg->rr_queue = k->rr_queue;
        pg->sbuf_origin[k->sbuf.down] = next_origin(&k->sbuf);
        pg->bucket = k->bucket, k->bucket = NULL;
        pg->nbucket = k->nbucket;
        pg->dma_iv = k->dma_iv, k->dma_iv = NULL;
        pg->n_iv = k->n_iv;
        pg->cap_iv = k->cap_iv;
        if (k->tend > pg->tend)
            pg->tend = k->tend;
        for (int e = 0; e < NT_ENGINE_DMA; e++)
            pg->busy[e] += k->busy[e];
        for (int q = 0; q < NT_SIM_DMA_QUEUES; q++)
            pg->qbusy[q] += k->qbusy[q];
        pg->flops += k->flops;
        pg->ideal += k->ideal_ns;
        pg->hbm_rd += k->hbm_rd;
        pg->hbm_wr += k->hbm_wr;
        pg->ninstr += k->ninstr;
        pg->kernels++;
        nt__tl_sim_end = k->clock0 + k->tend;
    } else {
        nt__tl_sim_end = pg->clock0; /* the program's end stamps what it wrote */
    }
    pthread_mutex_lock(&core->stats_lock);
    if (k->err)
        core->stats.errors++;
    core->stats.host_ns += nt__sim_now_ns() - k->host_t0;
    core->stats.host_gemm_ns += k->gemm_ns;
    core->stats.host_values_ns += k->values_ns;
    pthread_mutex_unlock(&core->stats_lock);
    int err = k->err;
    kernel_free(k);
    return err;
}

int nt__sim_program_begin(double after, const nt__sim_range *ranges, int nranges,
                          const nt__sim_prog_snap *snap)
{
    if (nt_sim_init())
        return NT_ESIM;
    int ci = nt__tl_core;
    nt__sim_core *core = &nt__sim.cores[ci >= 0 && ci < nt__sim.ncores ? ci : 0];
    nt__sim_prog *pg = calloc(1, sizeof *pg);
    nt__sim_range *map = nranges > 0 ? malloc((size_t)nranges * sizeof *map) : NULL;
    if (!pg || (nranges > 0 && !map)) {
        free(pg);
        free(map);
        return NT_EHOSTMEM;
    }
    if (nranges > 0)
        memcpy(map, ranges, (size_t)nranges * sizeof *map);
    pthread_mutex_lock(&core->run_lock);
    if (ensure_core(core)) {
        pthread_mutex_unlock(&core->run_lock);
        free(pg);
        free(map);
        return NT_EHOSTMEM;
    }
    pg->owner = pthread_self();
    pg->timed = snap == NULL;
    if (snap)
        pg->snap = *snap;
    pg->map = map;
    pg->nmap = nranges;
    pg->act_table = -1;
    pthread_mutex_lock(&core->stats_lock);
    pg->clock0 = core->clock > after ? core->clock : after;
    pthread_mutex_unlock(&core->stats_lock);
    if (++core->ht_gen == 0) /* the program's dependencies start afresh */
        core->ht_gen = 1;
    core->ht_count = 0;
    __atomic_store_n(&core->prog, pg, __ATOMIC_RELEASE);
    return 0;
}

static nt__sim_core *prog_core(void)
{
    int ci = nt__tl_core;
    if (!atomic_load_explicit(&inited, memory_order_acquire))
        return NULL;
    return &nt__sim.cores[ci >= 0 && ci < nt__sim.ncores ? ci : 0];
}

static nt__sim_prog *my_prog(void)
{
    nt__sim_core *core = prog_core();
    nt__sim_prog *pg = core ? __atomic_load_n(&core->prog, __ATOMIC_ACQUIRE) : NULL;
    return pg && pthread_equal(pg->owner, pthread_self()) ? pg : NULL;
}

bool nt__sim_program_active(void) { return my_prog() != NULL; }

bool nt__sim_program_untimed(void)
{
    nt__sim_prog *pg = my_prog();
    return pg && !pg->timed;
}

/* Time during which at least one DMA queue was active, over (s, e) pairs. */
static double iv_union(double *iv, size_t n)
{
    if (!n)
        return 0.0;
    qsort(iv, n, 2 * sizeof(double), cmp_iv);
    double total = 0.0, s = iv[0], e = iv[1];
    for (size_t i = 1; i < n; i++) {
        double a = iv[2 * i], b = iv[2 * i + 1];
        if (a > e) {
            total += e - s;
            s = a;
            e = b;
        } else if (b > e) {
            e = b;
        }
    }
    return total + (e - s);
}

double nt__sim_program_end(nt__sim_prog_snap *out)
{
    nt__sim_core *core = prog_core();
    nt__sim_prog *pg = my_prog();
    if (!pg)
        return 0.0;
    nt__sim_prog_snap sn;
    if (pg->timed) {
        memset(&sn, 0, sizeof sn);
        sn.makespan_ns = pg->tend;
        memcpy(sn.busy_ns, pg->busy, sizeof sn.busy_ns);
        sn.busy_ns[NT_ENGINE_DMA] = iv_union(pg->dma_iv, pg->n_iv);
        memcpy(sn.queue_busy_ns, pg->qbusy, sizeof sn.queue_busy_ns);
        sn.kernels = pg->kernels;
        sn.instructions = pg->ninstr;
        sn.hbm_read_bytes = pg->hbm_rd;
        sn.hbm_write_bytes = pg->hbm_wr;
        sn.flops = pg->flops;
        sn.tensor_ideal_ns = pg->ideal;
        if (out)
            *out = sn;
    } else {
        sn = pg->snap;
    }
    double end = pg->clock0 + sn.makespan_ns;
    pthread_mutex_lock(&core->stats_lock);
    if (end > core->clock)
        core->clock = end;
    nt_sim_stats *st = &core->stats;
    fx_sums *sums = core->sums;
    st->kernels += sn.kernels;
    st->instructions += sn.instructions;
    sums->sim += to_fx(sn.makespan_ns);
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        sums->busy[e] += to_fx(sn.busy_ns[e]);
    for (int q = 0; q < NT_SIM_DMA_QUEUES; q++)
        sums->qbusy[q] += to_fx(sn.queue_busy_ns[q]);
    st->hbm_read_bytes += sn.hbm_read_bytes;
    st->hbm_write_bytes += sn.hbm_write_bytes;
    st->flops += sn.flops;
    sums->ideal += to_fx(sn.tensor_ideal_ns);
    pthread_mutex_unlock(&core->stats_lock);
    if (nt__trace_at(NT__TRACE_KERNEL)) {
        trace_meta(core);
        nt__trace_complete(nt__sim_trace_pid(core->index), 0, "captured program",
                           pg->clock0 / 1e3, sn.makespan_ns / 1e3, "{}");
    }
    __atomic_store_n(&core->prog, NULL, __ATOMIC_RELEASE);
    free(pg->bucket);
    free(pg->dma_iv);
    free(pg->map);
    free(pg);
    pthread_mutex_unlock(&core->run_lock);
    return end;
}

int nt_sim_kernel_end(nt_sim_kernel *k, nt_sim_report *rep)
{
    if (!k)
        return NT__SIM_NULL("nt_sim_kernel_end", "k");
    nt__sim_fx_flush(k); /* queued functional work lands before the report */
    nt__sim_core *core = k->core;
    nt__sim_prog *pg = k->in_prog ? core->prog : NULL;
    if (pg)
        return prog_kernel_end(k, pg, rep);
    double dur = k->tend - k->t0;
    k->busy[NT_ENGINE_DMA] = dma_union(k);
    if (nt__trace_at(NT__TRACE_KERNEL)) {
        trace_meta(core);
        char args[512], q[128];
        nt__trace_json_str(q, sizeof q, k->msg);
        snprintf(args, sizeof args,
                 "{\"instructions\":%llu,\"flops\":%.0f,\"hbm_read\":%llu,\"hbm_write\":%llu,"
                 "\"tensor_busy_us\":%.3f,\"mfu\":%.4f,\"error\":%s}",
                 (unsigned long long)k->ninstr, k->flops, (unsigned long long)k->hbm_rd,
                 (unsigned long long)k->hbm_wr, k->busy[0] / 1e3,
                 dur > 0 ? k->ideal_ns / dur : 0.0, q);
        nt__trace_complete(nt__sim_trace_pid(core->index), 0, k->name,
                           (k->clock0 + k->t0) / 1e3, dur / 1e3, args);
    }
    if (rep) {
        memset(rep, 0, sizeof *rep);
        g_strlcpy(rep->name, k->name, sizeof rep->name);
        rep->error = k->err;
        g_strlcpy(rep->message, k->msg, sizeof rep->message);
        rep->start_ns = k->clock0 + k->t0;
        rep->end_ns = k->clock0 + k->tend;
        rep->duration_ns = dur;
        memcpy(rep->busy_ns, k->busy, sizeof rep->busy_ns);
        memcpy(rep->dma_queue_busy_ns, k->qbusy, sizeof rep->dma_queue_busy_ns);
        rep->instructions = k->ninstr;
        rep->flops = k->flops;
        rep->tensor_ideal_ns = k->ideal_ns;
        rep->hbm_read_bytes = k->hbm_rd;
        rep->hbm_write_bytes = k->hbm_wr;
        rep->sbuf_peak_bytes = k->sbuf.peak;
        rep->psum_peak_bytes = k->psum.peak;
    }
    pthread_mutex_lock(&core->stats_lock);
    if (k->clock0 + k->tend > core->clock)
        core->clock = k->clock0 + k->tend;
    nt_sim_stats *st = &core->stats;
    fx_sums *sums = core->sums;
    st->kernels++;
    st->instructions += k->ninstr;
    if (k->err)
        st->errors++;
    sums->sim += to_fx(dur);
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        sums->busy[e] += to_fx(k->busy[e]);
    for (int q = 0; q < NT_SIM_DMA_QUEUES; q++)
        sums->qbusy[q] += to_fx(k->qbusy[q]);
    st->hbm_read_bytes += k->hbm_rd;
    st->hbm_write_bytes += k->hbm_wr;
    st->flops += k->flops;
    sums->ideal += to_fx(k->ideal_ns);
    st->host_ns += nt__sim_now_ns() - k->host_t0;
    st->host_gemm_ns += k->gemm_ns;
    st->host_values_ns += k->values_ns;
    pthread_mutex_unlock(&core->stats_lock);
    nt__tl_sim_end = k->clock0 + k->tend;

    int err = k->err;
    kernel_free(k);
    pthread_mutex_unlock(&core->run_lock);
    return err;
}

/* ------------------------------------------------------------------------ */
/* Statistics                                                               */
/* ------------------------------------------------------------------------ */

/* Adds core c's counters and sums into *out / *sums (under its lock). */
static void stats_add(nt__sim_core *c, nt_sim_stats *out, fx_sums *sums)
{
    pthread_mutex_lock(&c->stats_lock);
    const nt_sim_stats *st = &c->stats;
    const fx_sums *cs = c->sums;
    out->kernels += st->kernels;
    out->instructions += st->instructions;
    out->errors += st->errors;
    out->hbm_read_bytes += st->hbm_read_bytes;
    out->hbm_write_bytes += st->hbm_write_bytes;
    out->flops += st->flops;
    out->host_ns += st->host_ns;
    out->host_gemm_ns += st->host_gemm_ns;
    out->host_values_ns += st->host_values_ns;
    if (c->clock > out->clock_ns)
        out->clock_ns = c->clock;
    sums->sim += cs->sim;
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        sums->busy[e] += cs->busy[e];
    for (int q = 0; q < NT_SIM_DMA_QUEUES; q++)
        sums->qbusy[q] += cs->qbusy[q];
    sums->ideal += cs->ideal;
    pthread_mutex_unlock(&c->stats_lock);
}

/* The derived fields of *out from the exact sums. */
static void stats_finish(nt_sim_stats *out, const fx_sums *sums)
{
    out->sim_ns = from_fx(sums->sim);
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        out->busy_ns[e] = from_fx(sums->busy[e]);
    for (int q = 0; q < NT_SIM_DMA_QUEUES; q++)
        out->dma_queue_busy_ns[q] = from_fx(sums->qbusy[q]);
    out->tensor_ideal_ns = from_fx(sums->ideal);
    out->hbm_bytes_per_ns = nt__sim.cfg.hbm_bytes_per_ns;
    if (out->sim_ns > 0) {
        for (int e = 0; e < NT_ENGINE_COUNT; e++)
            out->utilization[e] = out->busy_ns[e] / out->sim_ns;
        out->hbm_bw_utilization = (double)(out->hbm_read_bytes + out->hbm_write_bytes) /
                                  (out->sim_ns * out->hbm_bytes_per_ns);
        out->mfu = out->tensor_ideal_ns / out->sim_ns;
    }
}

/* The totals of cores [c0, c1) into out (NT_EINVAL for a range outside
 * the cores); the clock is the latest core's. */
static int stats_of(int c0, int c1, nt_sim_stats *out)
{
    int rc = nt_sim_init();
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    fx_sums sums;
    memset(&sums, 0, sizeof sums);
    pthread_mutex_lock(&state_lock);
    if (c0 < 0 || c1 > nt__sim.ncores) {
        pthread_mutex_unlock(&state_lock);
        return NT_EINVAL;
    }
    for (int i = c0; i < c1; i++)
        stats_add(&nt__sim.cores[i], out, &sums);
    stats_finish(out, &sums);
    pthread_mutex_unlock(&state_lock);
    return 0;
}

int nt_sim_stats_get(nt_sim_stats *out)
{
    if (!out)
        return NT__SIM_NULL("nt_sim_stats_get", "out");
    int rc = nt_sim_init();
    return rc ? rc : stats_of(0, nt__sim.ncores, out);
}

int nt_device_stats_get(int dev, nt_sim_stats *out)
{
    if (!out)
        return NT__SIM_NULL("nt_device_stats_get", "out");
    int rc = nt_sim_init();
    if (rc)
        return rc;
    if (dev < 0 || dev >= nt__sim.ncores)
        return nt__err(NULL, NT_EINVAL, "nt_device_stats_get",
                       "argument 'dev' is %d; expected a device from 0 to %d (NT_SIM_CORES=%d)",
                       dev, nt__sim.ncores - 1, nt__sim.ncores);
    return stats_of(dev, dev + 1, out);
}

int nt__sim_core_stats(int core, nt_sim_stats *out) { return stats_of(core, core + 1, out); }

void nt_sim_stats_reset(void)
{
    nt_sim_init();
    pthread_mutex_lock(&state_lock);
    for (int i = 0; i < nt__sim.ncores; i++) {
        nt__sim_core *c = &nt__sim.cores[i];
        pthread_mutex_lock(&c->stats_lock);
        memset(&c->stats, 0, sizeof c->stats);
        memset(c->sums, 0, sizeof(fx_sums));
        pthread_mutex_unlock(&c->stats_lock);
    }
    pthread_mutex_unlock(&state_lock);
}

/* ------------------------------------------------------------------------ */
/* HBM page table                                                           */
/* ------------------------------------------------------------------------ */

/* splitmix64's finaliser over base and the page number: the table's low bits
 * depend on both, so the pages of one tensor spread over the table (a
 * product shifted right left the page number out of the index bits, and
 * every page of a big tensor probed one chain). */
static size_t ht_hash(uintptr_t base, uintptr_t key)
{
    uint64_t z = (uint64_t)base ^ ((uint64_t)key * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (size_t)(z ^ (z >> 31));
}

static void ht_grow(nt__sim_core *c)
{
    size_t ncap = c->ht_cap * 2;
    hpage *nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return;
    for (size_t i = 0; i < c->ht_cap; i++) {
        if (c->ht[i].gen != c->ht_gen)
            continue;
        size_t j = ht_hash(c->ht[i].base, c->ht[i].key) & (ncap - 1);
        while (nt[j].gen == c->ht_gen)
            j = (j + 1) & (ncap - 1);
        nt[j] = c->ht[i];
    }
    free(c->ht);
    c->ht = nt;
    c->ht_cap = ncap;
}

/* The page's entry, created empty (times 0) if absent. */
static hpage *ht_get(nt__sim_core *c, uintptr_t base, uintptr_t key)
{
    if (c->ht_count * 2 >= c->ht_cap)
        ht_grow(c);
    size_t j = ht_hash(base, key) & (c->ht_cap - 1);
    while (c->ht[j].gen == c->ht_gen) {
        if (c->ht[j].key == key && c->ht[j].base == base)
            return &c->ht[j];
        j = (j + 1) & (c->ht_cap - 1);
    }
    c->ht[j].base = base;
    c->ht[j].key = key;
    c->ht[j].gen = c->ht_gen;
    c->ht[j].wold = c->ht[j].rold = 0.0;
    c->ht[j].nw = c->ht[j].nr = 0;
    c->ht_count++;
    return &c->ht[j];
}

/* Room for n page entries in c->hp; false: the host is short (the caller
 * then looks the pages up again). */
static bool hp_room(nt__sim_core *c, size_t n)
{
    if (n <= c->hp_cap)
        return true;
    size_t cap = c->hp_cap ? c->hp_cap : 256;
    while (cap < n)
        cap *= 2;
    hpage **hp = realloc(c->hp, cap * sizeof *hp);
    if (!hp)
        return false;
    c->hp = hp;
    c->hp_cap = cap;
    return true;
}

/* When an access to bytes [lo, hi) of page e may start. */
static double hp_wait(const hpage *e, int32_t lo, int32_t hi, bool write)
{
    double t = e->wold;
    for (int i = 0; i < e->nw; i++)
        if (e->w[i].lo < hi && lo < e->w[i].hi && e->w[i].t > t)
            t = e->w[i].t;
    if (!write)
        return t;
    if (e->rold > t)
        t = e->rold;
    for (int i = 0; i < e->nr; i++)
        if (e->r[i].lo < hi && lo < e->r[i].hi && e->r[i].t > t)
            t = e->r[i].t;
    return t;
}

/* Records an access to bytes [lo, hi) of page e ending at end. */
static void hp_note(hpage *e, int32_t lo, int32_t hi, bool write, double end)
{
    hrec *r = write ? e->w : e->r;
    uint8_t *n = write ? &e->nw : &e->nr;
    double *old = write ? &e->wold : &e->rold;
    int m = 0;
    for (int i = 0; i < *n; i++) {
        if (r[i].lo == lo && r[i].hi == hi) {
            if (end > r[i].t)
                r[i].t = end;
            return;
        }
        if (r[i].t < r[m].t)
            m = i;
    }
    if (*n < HBM_RECS) {
        r[(*n)++] = (hrec){lo, hi, end};
        return;
    }
    if (r[m].t > *old)
        *old = r[m].t;
    r[m] = (hrec){lo, hi, end};
}

/* The bytes of page pg that an access spanning [elo, ehi) touches. */
static void hp_span(int64_t pg, int64_t elo, int64_t ehi, int32_t *lo, int32_t *hi)
{
    int64_t p0 = pg << HBM_PAGE_SHIFT, p1 = p0 + ((int64_t)1 << HBM_PAGE_SHIFT);
    *lo = (int32_t)((elo > p0 ? elo : p0) - p0);
    *hi = (int32_t)((ehi < p1 ? ehi : p1) - p0);
}

/* Visits the HBM pages of every row of ap: mode 0 = collect the time a read
 * (write=false) or write must wait for, mode 1 = record the access ending at
 * `end`.  In mode 0, when *nhp is not SIZE_MAX each visited entry is also
 * appended to c->hp (at *nhp, which is advanced), so that mode 1 can update
 * them without another lookup; SIZE_MAX on return: the list is incomplete.
 * Within a page the access counts as its bytes from its lowest to its
 * highest (*elo, *ehi, from the page origin). */
static double hbm_pages(nt__sim_core *c, const nt_ap *ap, bool write, int mode, double end,
                        size_t *nhp, int64_t *elo, int64_t *ehi)
{
    int64_t esz = (int64_t)nt__dtype_size(ap->dtype);
    int64_t lo, hi;
    nt__sim_extent(ap, &lo, &hi);
    uintptr_t base = (uintptr_t)ap->hbm;
    int64_t shift = 0; /* bytes from the page origin to the pattern's base */
    const nt__sim_prog *prg = c->prog;
    if (prg && prg->nmap) {
        /* in a program: pages of the allocation that holds the base */
        int lo_i = 0, hi_i = prg->nmap;
        while (lo_i < hi_i) {
            int mid = (lo_i + hi_i) / 2;
            if (prg->map[mid].hi <= base)
                lo_i = mid + 1;
            else
                hi_i = mid;
        }
        if (lo_i < prg->nmap && prg->map[lo_i].lo <= base) {
            shift = (int64_t)(base - prg->map[lo_i].lo);
            base = prg->map[lo_i].lo;
        }
    }
    int64_t F = nt__sim_free_count(ap);
    int64_t r0 = shift + (ap->offset + lo) * esz, span = (int64_t)(ap->np - 1) * ap->pstep * esz;
    int64_t xlo = r0 + (span < 0 ? span : 0), xhi = r0 + (span > 0 ? span : 0) + (hi - lo + 1) * esz;
    if (elo)
        *elo = xlo, *ehi = xhi;
    nt__sim_shape s;
    nt__sim_canon(ap, &s);
    bool dense = s.nd == 1 && s.step[0] == 1;
    int rows = ap->np;
    int64_t row_bytes = (hi - lo + 1) * esz;
    /* rows that tile one contiguous range are visited as one */
    if (dense && ap->pstep == F) {
        row_bytes *= rows;
        rows = 1;
    }
    double t = 0.0;
    int64_t last_page = INT64_MIN;
    /* Visiting a page twice changes nothing (mode 0 takes a maximum, mode 1
     * stores the same end), so when rows go up in memory each visits only
     * the pages above those already seen: a strided read whose rows span
     * the same pages (a reduction over a leading dim) costs its page count,
     * not rows times that. */
    int64_t seen_hi = INT64_MIN;
    for (int p = 0; p < rows; p++) {
        int64_t a = shift + (ap->offset + (int64_t)p * ap->pstep + lo) * esz; /* from base */
        int64_t first = a >> HBM_PAGE_SHIFT, last = (a + row_bytes - 1) >> HBM_PAGE_SHIFT;
        if (ap->pstep >= 0) {
            if (first <= seen_hi)
                first = seen_hi + 1;
            if (last > seen_hi)
                seen_hi = last;
        }
        for (int64_t pg = first; pg <= last; pg++) {
            if (pg == last_page)
                continue; /* adjacent rows on one page: visited already */
            hpage *e = ht_get(c, base, (uintptr_t)pg);
            if (nhp && *nhp != SIZE_MAX) {
                if (hp_room(c, *nhp + 1))
                    c->hp[(*nhp)++] = e;
                else
                    *nhp = SIZE_MAX;
            }
            int32_t plo, phi;
            hp_span(pg, xlo, xhi, &plo, &phi);
            if (mode == 0) {
                double w = hp_wait(e, plo, phi, write);
                if (w > t)
                    t = w;
            } else {
                hp_note(e, plo, phi, write, end);
            }
        }
        last_page = last;
    }
    return t;
}

/* ------------------------------------------------------------------------ */
/* Scheduling                                                               */
/* ------------------------------------------------------------------------ */

int nt__sim_auto_queue(nt_sim_kernel *k)
{
    int q = k->rr_queue;
    k->rr_queue = (q + 1) % NT_SIM_DMA_QUEUES;
    return q;
}

static dep_tab *dep_of(nt__sim_core *c, const nt_ap *ap)
{
    return ap->tile->mem == NT_MEM_PSUM ? c->dep_psum : c->dep_sbuf;
}

static void chunk_range(const nt_ap *ap, int *c0, int *c1)
{
    int64_t lo, hi, esz = (int64_t)nt__dtype_size(ap->dtype);
    nt__sim_extent(ap, &lo, &hi);
    int64_t blo = ap->tile->off + (ap->offset + lo) * esz;
    int64_t bhi = ap->tile->off + (ap->offset + hi + 1) * esz; /* exclusive */
    *c0 = (int)(blo / NT__SIM_CHUNK);
    *c1 = (int)((bhi + NT__SIM_CHUNK - 1) / NT__SIM_CHUNK);
}

/* Books `bytes` on the shared DMA engines from time t at most `rate` B/ns;
 * returns when the last byte moves.  Buckets keep what each 256 ns slice of
 * the kernel has booked, so a transfer issued later in program order can use
 * bandwidth left idle earlier (a fluid model of 16 engines). */
static double dma_book(nt_sim_kernel *k, double t, double bytes, double rate)
{
    const nt_sim_config *c = &nt__sim.cfg;
    const double W = NT__SIM_DMA_BUCKET_NS;
    double pool = c->dma_engines * c->dma_engine_bytes_per_ns * W;
    if (bytes <= 0)
        return t;
    size_t b = t > k->t0 ? (size_t)((t - k->t0) / W) : 0;
    while (k->t0 + (double)(b + 1) * W <= t) /* rounding at a bucket edge */
        b++;
    for (double cur = t;; b++) {
        if (b >= k->nbucket) {
            size_t n = k->nbucket ? k->nbucket : 1024;
            while (n <= b)
                n *= 2;
            double *nb = realloc(k->bucket, n * sizeof *nb);
            if (!nb)
                return cur + bytes / rate; /* no booking: unshared */
            memset(nb + k->nbucket, 0, (n - k->nbucket) * sizeof *nb);
            k->bucket = nb;
            k->nbucket = n;
        }
        double bstart = k->t0 + (double)b * W, bend = bstart + W;
        double s = cur > bstart ? cur : bstart;
        double span = bend - s;
        if (span <= 0)
            continue;
        double can = rate * span, left = pool - k->bucket[b];
        if (can > left)
            can = left;
        if (can <= 0)
            continue;
        if (can >= bytes) {
            k->bucket[b] += bytes;
            return s + bytes / (can / span);
        }
        k->bucket[b] += can;
        bytes -= can;
        cur = bend;
    }
}

static void trace_instr(nt_sim_kernel *k, const nt__sim_instr *in, int tid, double start,
                        double end)
{
    char args[1400];
    size_t o = 0;
    char q[96];
    nt__trace_json_str(q, sizeof q, k->name);
    o += (size_t)snprintf(args + o, sizeof args - o, "{\"kernel\":%s,\"index\":%llu", q,
                          (unsigned long long)k->ninstr);
    for (int i = 0; i < in->nacc && o < sizeof args - 200; i++) {
        const nt_ap *ap = in->acc[i].ap;
        char shape[96];
        size_t so = 0;
        so += (size_t)snprintf(shape + so, sizeof shape - so, "[%d", ap->np);
        for (int d = 0; d < ap->ndim && d < NT_AP_MAX_DIMS; d++)
            so += (size_t)snprintf(shape + so, sizeof shape - so, "x%lld", (long long)ap->num[d]);
        snprintf(shape + so, sizeof shape - so, "]");
        if (ap->tile) {
            char tn[64];
            nt__trace_json_str(tn, sizeof tn, ap->tile->name);
            /* strip the quotes of the escaped name inside our own string */
            tn[strlen(tn) - 1] = '\0';
            o += (size_t)snprintf(args + o, sizeof args - o, ",\"%s\":\"%s %s[p%d] %s %s\"",
                                  in->acc[i].role, nt_mem_name(ap->tile->mem), tn + 1, ap->p0,
                                  shape, dt_name(ap->dtype));
        } else {
            o += (size_t)snprintf(args + o, sizeof args - o, ",\"%s\":\"HBM %s %s\"",
                                  in->acc[i].role, shape, dt_name(ap->dtype));
        }
    }
    if (in->engine == NT_ENGINE_DMA)
        o += (size_t)snprintf(args + o, sizeof args - o, ",\"bytes\":%.0f,\"queue\":%d",
                              in->dma_bytes, in->queue);
    else
        o += (size_t)snprintf(args + o, sizeof args - o, ",\"cycles\":%.0f", in->cycles);
    if (in->flops > 0)
        o += (size_t)snprintf(args + o, sizeof args - o, ",\"flops\":%.0f", in->flops);
    snprintf(args + o, sizeof args - o, "}");
    nt__trace_complete(nt__sim_trace_pid(k->core->index), tid, in->name, start / 1e3,
                       (end - start) / 1e3, args);
}

/* nt__sim_issue's steps, inlined into it (it runs once per simulated
 * instruction).  `issued` carries what one step finds for the next. */
#define ISSUE_STEP static inline __attribute__((always_inline))
typedef struct issued {
    double ready;      /* earliest start its dependencies allow */
    bool sbuf, psum;   /* it accesses an SBUF / a PSUM tile */
    /* the HBM page entries each access visits, collected while the wait is
     * found, so that recording the access needs no second lookup: valid
     * while the table is not rehashed (only a new entry grows it) */
    size_t nhp, hp_end[NT__SIM_MAX_ACC];
    int64_t elo[NT__SIM_MAX_ACC], ehi[NT__SIM_MAX_ACC]; /* each HBM access's bytes */
    const hpage *ht0;
    double start, end, lat; /* when it runs; its writes' access latency */
} issued;

/* When may it start: after what it reads was written (RAW), what it writes
 * was read (WAR) and written (WAW). */
ISSUE_STEP void issue_wait(nt_sim_kernel *k, const nt__sim_instr *in, issued *is)
{
    nt__sim_core *core = k->core;
    int me = in->engine;
    /* locals, not is's fields, in the loops: `is` is not stored to there */
    double ready = k->t0;
    bool sbuf = false, psum = false;
    size_t nhp = 0;
    is->ht0 = core->ht;
    for (int i = 0; i < in->nacc; i++) {
        const nt__sim_acc *a = &in->acc[i];
        const nt_ap *ap = a->ap;
        if (!ap->tile) {
            double t = hbm_pages(core, ap, a->write, 0, 0.0, &nhp, &is->elo[i], &is->ehi[i]);
            is->hp_end[i] = nhp;
            if (t > ready)
                ready = t;
            continue;
        }
        if (ap->tile->mem == NT_MEM_PSUM)
            psum = true;
        else
            sbuf = true;
        dep_ent *d = dep_of(core, ap)->e;
        int c0, c1;
        chunk_range(ap, &c0, &c1);
        uint32_t gen = core->ht_gen;
        if (!a->write) {
            for (int j = c0; j < c1; j++)
                if (d[j].gen == gen && d[j].avail > ready)
                    ready = d[j].avail;
            continue;
        }
        for (int j = c0; j < c1; j++) {
            if (d[j].gen != gen)
                continue;
            /* WAW orders after the last write; an accumulating matmul also
             * reads it, without the access latency when the previous
             * accumulation is TensorE's own (it stays in the pipeline) */
            double w = d[j].wend;
            if (a->accum && d[j].weng != me)
                w = d[j].avail;
            if (w > ready)
                ready = w;
            if (d[j].rend > ready)
                ready = d[j].rend;
        }
    }
    is->ready = ready;
    is->sbuf = sbuf;
    is->psum = psum;
    is->nhp = nhp;
}

/* A compute engine's time: after the engine (and a shared SBUF or PSUM
 * port) is free, its cycles at the engine's clock. */
ISSUE_STEP void issue_engine(nt_sim_kernel *k, nt__sim_instr *in, issued *is)
{
    const nt_sim_config *c = &nt__sim.cfg;
    int me = in->engine;
    double ghz = c->clock_ghz[me];
    double start = is->ready > k->eng_free[me] ? is->ready : k->eng_free[me];
    bool use_sbuf_port = c->vector_gpsimd_share_sbuf && is->sbuf &&
                         (me == NT_ENGINE_VECTOR || me == NT_ENGINE_GPSIMD);
    bool use_psum_port = c->vector_scalar_share_psum && is->psum &&
                         (me == NT_ENGINE_VECTOR || me == NT_ENGINE_SCALAR);
    if (use_sbuf_port && k->port_sbuf_vg > start)
        start = k->port_sbuf_vg;
    if (use_psum_port && k->port_psum_vs > start)
        start = k->port_psum_vs;
    double cyc = in->cycles < c->min_instr_cycles ? c->min_instr_cycles : in->cycles;
    in->cycles = cyc;
    double dur = cyc / ghz;
    /* a function from another table makes ScalarE load that table first */
    if (me == NT_ENGINE_SCALAR && in->act_table >= 0 && in->act_table != k->act_table) {
        dur += c->act_table_switch_ns;
        k->act_table = in->act_table;
    }
    double end = start + dur;
    k->eng_free[me] = end;
    if (use_sbuf_port)
        k->port_sbuf_vg = end;
    if (use_psum_port)
        k->port_psum_vs = end;
    k->busy[me] += dur;
    is->lat = c->access_latency_cycles / ghz;
    is->start = start;
    is->end = end;
}

/* A DMA's time: after its queue is free, its bytes over the DMA engines
 * its partitions use; the interval is kept for the kernel's DMA busy time. */
ISSUE_STEP void issue_dma(nt_sim_kernel *k, const nt__sim_instr *in, issued *is)
{
    const nt_sim_config *c = &nt__sim.cfg;
    int q = in->queue;
    double start = is->ready > k->q_free[q] ? is->ready : k->q_free[q];
    int eng = (in->dma_parts + 7) / 8;
    if (eng > c->dma_engines)
        eng = c->dma_engines;
    if (eng < 1)
        eng = 1;
    double end = dma_book(k, start + c->dma_fixed_ns, in->dma_cost_bytes,
                          eng * c->dma_engine_bytes_per_ns);
    k->q_free[q] = end;
    k->qbusy[q] += end - start;
    if (k->n_iv == k->cap_iv) {
        size_t n = k->cap_iv ? k->cap_iv * 2 : 256;
        double *iv = realloc(k->dma_iv, n * 2 * sizeof *iv);
        if (iv) {
            k->dma_iv = iv;
            k->cap_iv = n;
        }
    }
    if (k->n_iv < k->cap_iv) {
        k->dma_iv[2 * k->n_iv] = start;
        k->dma_iv[2 * k->n_iv + 1] = end;
        k->n_iv++;
    }
    is->start = start;
    is->end = end;
}

/* Records its accesses: the HBM pages and tile chunks it reads and writes
 * now end (and a write's value is available) when it does. */
ISSUE_STEP void issue_record(nt_sim_kernel *k, const nt__sim_instr *in, const issued *is)
{
    nt__sim_core *core = k->core;
    int me = in->engine;
    double end = is->end, lat = is->lat;
    bool hp_ok = is->nhp != SIZE_MAX && core->ht == is->ht0;
    size_t hp0 = 0;
    for (int i = 0; i < in->nacc; i++) {
        const nt__sim_acc *a = &in->acc[i];
        const nt_ap *ap = a->ap;
        if (!ap->tile) {
            if (!hp_ok) {
                hbm_pages(core, ap, a->write, 1, end, NULL, NULL, NULL);
                continue;
            }
            /* what hbm_pages' mode 1 does to each page it visits */
            for (size_t h = hp0; h < is->hp_end[i]; h++) {
                hpage *e = core->hp[h];
                int32_t plo, phi;
                hp_span((int64_t)e->key, is->elo[i], is->ehi[i], &plo, &phi);
                hp_note(e, plo, phi, a->write, end);
            }
            hp0 = is->hp_end[i];
            continue;
        }
        dep_ent *d = dep_of(core, ap)->e;
        int c0, c1;
        chunk_range(ap, &c0, &c1);
        uint32_t gen = core->ht_gen;
        bool reads = !a->write || a->accum;
        for (int j = c0; j < c1; j++) {
            if (d[j].gen != gen) {
                d[j].gen = gen;
                d[j].wend = d[j].avail = d[j].rend = k->t0;
                d[j].weng = NT_ENGINE_DMA;
            }
            if (a->write) {
                d[j].wend = end;
                d[j].avail = end + lat;
                d[j].weng = (uint8_t)me;
            }
            if (reads && end > d[j].rend)
                d[j].rend = end;
        }
    }
}

/* The kernel's totals, its last instruction, the trace span. */
ISSUE_STEP void issue_account(nt_sim_kernel *k, const nt__sim_instr *in, const issued *is)
{
    int me = in->engine;
    double start = is->start, end = is->end;
    if (end > k->tend)
        k->tend = end;
    if (start < k->tmin)
        k->tmin = start;
    k->flops += in->flops;
    k->ideal_ns += in->ideal_ns;
    k->hbm_rd += in->hbm_rd;
    k->hbm_wr += in->hbm_wr;
    k->last = (nt_sim_instr_info){in->name, (nt_engine)me,
                                  me == NT_ENGINE_DMA ? in->queue : -1,
                                  me == NT_ENGINE_DMA ? 0.0 : in->cycles, k->clock0 + start,
                                  k->clock0 + end};
    k->has_last = true;
    if (k->functional)
        k->nfunc++;
    if (nt__trace_at(NT__TRACE_INSTR))
        trace_instr(k, in, me == NT_ENGINE_DMA ? 16 + in->queue : 1 + me, k->clock0 + start,
                    k->clock0 + end);
    k->ninstr++;
}
#undef ISSUE_STEP

void nt__sim_issue(nt_sim_kernel *k, nt__sim_instr *in)
{
    issued is;
    is.lat = 0.0;
    issue_wait(k, in, &is);
    if (in->engine < NT_ENGINE_DMA)
        issue_engine(k, in, &is);
    else
        issue_dma(k, in, &is);
    issue_record(k, in, &is);
    issue_account(k, in, &is);
}
