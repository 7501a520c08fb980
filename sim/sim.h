/* sim/sim.h - internals shared by the simulator's files (not public).
 *
 *   core.c      the core: configuration, memories, kernels, the tile
 *               allocator, dependency tracking, the timelines, statistics,
 *               trace events
 *   isa.c       the instructions: rule checks, cost, functional step
 *   tp_matmul.c the matmul tile program
 *   trace.c     the JSON trace writer
 */
#ifndef NT_SIM_SIM_H
#define NT_SIM_SIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "sim/isa.h"

/* The thread's error (core/error.c): set by the public functions that fail
 * without a kernel to hold the message (a NULL kernel or argument). */
int nt__err(const nt_site *site, int code, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "argument 'what' is NULL" as fn's NT_EINVAL. */
#define NT__SIM_NULL(fn, what) nt__err(NULL, NT_EINVAL, (fn), "argument '%s' is NULL", (what))
/* Bound on every size and offset in an access pattern (elements): with it
 * the pattern arithmetic (free count, extent, byte offsets) stays far from
 * int64 overflow. */
#define NT__SIM_MAX_ELEMS ((int64_t)1 << 48)

#define NT__SIM_SBUF_MAX_BYTES (224 * 1024) /* largest target (trn2) */
#define NT__SIM_PSUM_BYTES (16 * 1024)
/* Partitions are laid out with a cache line of padding so that a column of
 * a tile (one element per partition) does not map to one cache set. */
#define NT__SIM_PART_PAD 64
/* Dependencies are tracked per 64-byte chunk of a partition's address range
 * (the same chunk in every partition). */
#define NT__SIM_CHUNK 64
#define NT__SIM_SBUF_CHUNKS (NT__SIM_SBUF_MAX_BYTES / NT__SIM_CHUNK)
#define NT__SIM_PSUM_CHUNKS (NT__SIM_PSUM_BYTES / NT__SIM_CHUNK)
#define NT__SIM_ALIGN 64 /* tile start alignment in a partition */
/* The DMA engines' shared bandwidth is booked in buckets of this many ns. */
#define NT__SIM_DMA_BUCKET_NS 256.0
#define NT__SIM_MAX_ACC 6

typedef struct nt__sim_block {
    int64_t off, size;
} nt__sim_block;

/* First-fit allocator over one partition's byte range (per kernel).  In a
 * program (SBUF, sim/core.c): every other kernel fits from the top down
 * (down), first fit starts origin bytes from its end (then falls back to
 * the whole range), and hi is how far from its end its blocks reach. */
typedef struct nt__sim_alloc {
    nt__sim_block *free; /* sorted by offset, coalesced */
    int n, cap;
    int64_t total, used, peak;
    int64_t origin, hi;
    bool down;
} nt__sim_alloc;

struct nt_tile {
    nt_sim_kernel *k;
    char name[48];
    nt_mem mem;
    nt_dtype dt;
    int parts;
    int64_t nfree;   /* elements per partition */
    int64_t off;     /* byte offset inside every partition */
    int64_t bytes;   /* bytes per partition */
    bool live;
    struct nt_tile *next;
};

/* One operand of an instruction, for dependencies and the trace. */
typedef struct nt__sim_acc {
    const char *role;  /* "dst", "src", "stationary", ... */
    const nt_ap *ap;
    bool write;
    bool accum;        /* nc_matmul accumulate: read-modify-write in PSUM */
} nt__sim_acc;

/* What isa.c hands to the scheduler for one instruction. */
typedef struct nt__sim_instr {
    const char *name;
    int engine;        /* NT_ENGINE_TENSOR .. NT_ENGINE_DMA */
    int queue;         /* DMA queue (resolved) */
    double cycles;     /* compute engines: cost in engine cycles */
    double dma_bytes;  /* bytes moved */
    double dma_cost_bytes; /* bytes after the descriptor minimum */
    int dma_parts;     /* partitions (rows) of the transfer */
    int nacc;
    nt__sim_acc acc[NT__SIM_MAX_ACC];
    double flops, ideal_ns;
    uint64_t hbm_rd, hbm_wr;
    int act_table;     /* ScalarE function table, -1 if none */
} nt__sim_instr;

struct nt_sim_kernel {
    char name[64];
    bool in_prog;      /* a kernel of the core's running program (nt__sim_program_begin) */
    double tmin;       /* its first instruction's start (program time) */
    int err;
    char msg[320];
    uint64_t ninstr;
    bool functional;
    double t0, tend;   /* the kernel's own timeline: t0 = 0 */
    double clock0;     /* where it starts on the core's clock (reports, trace) */
    double eng_free[NT_ENGINE_DMA];
    double q_free[NT_SIM_DMA_QUEUES];
    int rr_queue;
    double port_sbuf_vg, port_psum_vs;
    int act_table;
    nt__sim_alloc sbuf, psum;
    nt_tile *tiles;
    double busy[NT_ENGINE_COUNT];
    double qbusy[NT_SIM_DMA_QUEUES];
    double flops, ideal_ns;
    uint64_t hbm_rd, hbm_wr;
    double *dma_iv;    /* (start, end) pairs of DMA activity */
    size_t n_iv, cap_iv;
    double *bucket;    /* bytes booked on the DMA engines per bucket */
    size_t nbucket;
    nt_sim_instr_info last;
    bool has_last;
    double host_t0;    /* wall clock at begin (ns) */
    struct nt__sim_core *core; /* the core it runs on */
    double gemm_ns;    /* wall time of the functional GEMMs */
    double values_ns;  /* wall time of the values computed once per program */
    uint64_t nfunc;    /* instructions issued with the functional step on */
    uint64_t nopaque;  /* gpsimd_custom / dma_gather issued (code or data decide) */
};

/* Most simulated NeuronCores in one process (NT_SIM_CORES). */
#define NT__SIM_MAX_CORES 64

struct nt__sim_fx;  /* isa.c: the functional batch and helper thread of a core */
struct nt__sim_dep; /* core.c: on-chip dependency tables */
struct nt__sim_hpage; /* core.c: the HBM page table */

/* One simulated NeuronCore: everything a kernel running on it touches.
 * Cores share nothing while kernels run, so kernels of two cores run at
 * once on two host threads; one core runs one kernel at a time (run_lock,
 * held from nt_sim_kernel_begin to nt_sim_kernel_end). */
typedef struct nt__sim_core {
    int index;
    pthread_mutex_t run_lock;
    uint8_t *sbuf, *psum; /* 64-byte aligned views of the raw buffers */
    void *sbuf_raw, *psum_raw;
    float *scratch[4];    /* per-kernel work rows (kernels of a core are serialised) */
    struct nt__sim_dep *dep_sbuf, *dep_psum;
    struct nt__sim_hpage *ht;
    size_t ht_cap, ht_count;
    uint32_t ht_gen;      /* the running kernel's generation (HBM and chunks) */
    struct nt__sim_hpage **hp; /* core.c: the HBM pages one instruction touches */
    size_t hp_cap;
    struct nt__sim_fx *fx;
    float *pg_buf;        /* tp_matmul.c: the program-level product's buffer */
    size_t pg_cap;
    /* under stats_lock: the clock (end of the core's last kernel, ns) and
     * the statistics */
    pthread_mutex_t stats_lock;
    double clock;
    nt_sim_stats stats;
    void *sums;           /* core.c: exact fixed-point sums of kernel times */
    unsigned trace_gen_seen;
    struct nt__sim_prog *prog; /* core.c: the program running on it, or NULL */
} nt__sim_core;

/* What all cores share: the configuration (one target for every core) and
 * the geometry of the on-chip memories. */
typedef struct nt__sim_global {
    nt_sim_config cfg;
    int64_t sbuf_stride, psum_stride; /* bytes between partitions */
    size_t scratch_elems;
    int ncores;                       /* NT_SIM_CORES, set by nt_sim_init */
    nt__sim_core *cores;              /* ncores entries */
} nt__sim_global;

extern nt__sim_global nt__sim;

/* ---- Cores, for the runtime (devices) and collectives --------------------
 *
 * The runtime's device d is simulated core d.  A kernel runs on the calling
 * thread's core: a stream worker sets its stream's device once at start, a
 * thread running ops inline (deterministic mode) sets the op's device around
 * each op.  Threads that never set one run on core 0, so the standalone
 * simulator and every single-core program behave as before.
 *
 * Timing.  Each core has its own clock (the end of its last kernel).  A
 * kernel starts at max(its core's clock, the thread's "after" time), where
 * the runtime sets "after" to the latest ready time of the storages the op
 * reads (nt__storage.sim_ready, the end of their last writer on whatever
 * core wrote them).  With one core "after" never exceeds the clock, so
 * every time is exactly what it was before cores existed. */

/* ---- Programs: many kernels on one timeline ------------------------------
 *
 * A captured program (fusion/graph.c) runs its kernels as one program: the
 * engines, DMA queues and the DMA engines' bandwidth carry over from one
 * kernel to the next instead of starting afresh, and the on-chip chunk and
 * HBM page dependencies are kept across kernels, so a kernel's loads start
 * as soon as what they read is written and its engines are free -- while the
 * previous kernel still computes -- and never earlier.  An HBM page is
 * counted from the start of the allocation that holds it (ranges[]: the
 * program's storages and its plan's block), so two planned tensors that
 * reuse the same bytes wait for each other, and where the host put a
 * buffer never changes the time.  The program's time (its makespan) is
 * added to the core's clock and statistics once, at its end.  Its kernels
 * take SBUF away from the kernels just before them (every other one fits
 * from the top down, each from where the last one from its end stopped:
 * sim/core.c, next_origin), as a compiler allocating the whole program's
 * buffers would, when the kernel asks before its first tile
 * (nt__sim_kernel_spread: the runtime's kernels, planned within 160 KiB);
 * alone, or a user's tile kernel, fits from offset 0.
 *
 * Untimed: a program whose timing is known (the snapshot of an earlier
 * run of the same program) runs its kernels for their values only -- the
 * built-in programs issue no instruction (nt__sim_program_untimed), others
 * issue theirs unrecorded -- and the snapshot is added at the end.
 *
 * Begin and end on the same thread, which holds the core from begin to end
 * (other threads' kernels on the core wait). */
typedef struct nt__sim_range {
    uintptr_t lo, hi;                 /* [lo, hi) */
} nt__sim_range;
typedef struct nt__sim_prog_snap {
    double makespan_ns;
    double busy_ns[NT_ENGINE_COUNT];
    double queue_busy_ns[NT_SIM_DMA_QUEUES];
    uint64_t kernels, instructions, hbm_read_bytes, hbm_write_bytes;
    double flops, tensor_ideal_ns;
} nt__sim_prog_snap;
/* Starts a program on the calling thread's core, no earlier than `after`;
 * ranges: sorted, disjoint, nranges of them (copied).  snap NULL: timed
 * (every instruction issued and placed); else untimed, adding *snap at the
 * end.  0, or NT_EHOSTMEM. */
int nt__sim_program_begin(double after, const nt__sim_range *ranges, int nranges,
                          const nt__sim_prog_snap *snap);
/* Ends it: the core's clock moves to its end; *out (if not NULL) gets what
 * a timed program added.  Returns the program's end on the core clock. */
double nt__sim_program_end(nt__sim_prog_snap *out);
/* True between begin and end of an untimed program on this thread's core:
 * a built-in kernel computes its values without issuing. */
bool nt__sim_program_untimed(void);
/* In a timed program, k (before its first tile) takes SBUF away from the
 * kernels just before it (sim/core.c, next_origin); else nothing. */
void nt__sim_kernel_spread(nt_sim_kernel *k);
/* True between begin and end of any program on this thread's core. */
bool nt__sim_program_active(void);

/* NT_SIM_CORES (1..64, default 1); initialises the simulator if needed
 * (0 if that fails). */
int nt__sim_core_count(void);
/* The core the calling thread's kernels run on (0 unless set). */
void nt__sim_thread_core_set(int core);
int nt__sim_thread_core(void);
/* Simulated ns at which core `core`'s last kernel ended (its clock); 0 for
 * a core out of range.  Thread-safe. */
double nt__sim_core_clock(int core);
/* Moves core `core`'s clock forward to at least t (a collective that
 * occupies the core until t); never backwards.  Thread-safe. */
void nt__sim_core_advance(int core, double t);
/* The next kernel this thread begins starts no earlier than t on its core's
 * clock (consumed by that nt_sim_kernel_begin, which resets it to 0); also
 * forgets the last end below.  The runtime's executor does the same through
 * core/simtls.h around every op (fusion/exec.c, nt__sim_ready_begin/_end):
 * "after" = the latest nt__storage.sim_ready of the op's inputs (and of an
 * in-place output), and afterwards each output's sim_ready = the last end
 * (or "after" when no simulator kernel ran). */
void nt__sim_thread_after(double t);
/* Simulated end (on its core's clock) of the last kernel this thread ended,
 * or -1 if it ended none since the last nt__sim_thread_after. */
double nt__sim_thread_last_end(void);
/* The trace process (track group) of core `core`: NT_TRACE_PID_SIM for core
 * 0, NT_TRACE_PID_CORE0 + core for the others (sim/trace.h). */
int nt__sim_trace_pid(int core);
/* Statistics of one core (as nt_sim_stats_get for all of them); NT_EINVAL
 * (no message) for a core out of range.  nt_device_stats_get is the public
 * form. */
int nt__sim_core_stats(int core, nt_sim_stats *out);
/* For a collective (or anything that is not a kernel but takes simulated
 * time): read its inputs' ready times with nt__storage_ready_get
 * (core/internal.h), start at the latest of them and of the members' clocks
 * as it models, and stamp its outputs with nt__storage_ready_set(st, end);
 * a kernel that reads them then starts after `end` on its own core.  Call
 * nt__sim_core_advance(core, end) only if the core can do nothing else
 * meanwhile. */

/* Records k's first error (NT_ESIM): "<instr> in kernel '<k>': <what>" and
 * returns NT_ESIM.  Later calls keep the first message. */
int nt__sim_fail(nt_sim_kernel *k, const char *instr, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Schedules one checked instruction: dependencies, engine/queue timeline,
 * statistics, trace.  Call before the functional step. */
void nt__sim_issue(nt_sim_kernel *k, nt__sim_instr *in);
/* Whole PSUM banks still free in k. */
int nt__sim_free_banks(const nt_sim_kernel *k);
/* Round-robin DMA queue of k. */
int nt__sim_auto_queue(nt_sim_kernel *k);

/* Functional execution (isa.c).  Row-local instructions are queued and run
 * partition-major when the kernel flushes (before an instruction that is not
 * row-local, at nt_sim_kernel_sync and nt_sim_kernel_end): see docs/sim.md. */
void nt__sim_fx_flush(nt_sim_kernel *k);
/* Stops core c's functional helper thread and frees its batch
 * (nt_sim_shutdown). */
void nt__sim_fx_shutdown(nt__sim_core *c);
/* NT_SIM_PROGRAM_GEMM (default on): the matmul tile program computes its
 * product once for the whole program (tp_matmul.c). */
bool nt__sim_program_gemm(void);
void nt__sim_set_program_gemm(bool on); /* for tests */
/* NT_SIM_PROGRAM_VALUES (default on): the built-in elementwise, row and
 * matmul programs (neuron/ew.c, matmul.c) take their values from the
 * reference kernels once per program and issue their instructions timed
 * only (docs/sim.md, "values once per program"). */
bool nt__sim_program_values(void);
void nt__sim_set_program_values(bool on); /* for tests */
/* Whether kernel k's instructions compute values; a kernel whose values come
 * from elsewhere turns it off for its own instructions only. */
bool nt__sim_kernel_functional(const nt_sim_kernel *k);
void nt__sim_kernel_set_functional(nt_sim_kernel *k, bool on);
/* When compute engine e of kernel k finishes what was issued to it so far
 * (simulated ns): kernels balance work that may run on several engines. */
double nt__sim_kernel_engine_free(const nt_sim_kernel *k, nt_engine e);
/* What nt_sim_kernel_end reads of a kernel's timing (its report, the
 * core's clock and statistics): a snapshot taken after a program was issued
 * replays it onto another kernel that runs the same program (the timing
 * memo of neuron/runtime.c).  nt__sim_kernel_snap: false if the host is
 * short of memory (then nothing to free); nt__sim_kernel_restore: false
 * likewise (k unchanged).  nt__sim_ksnap_free frees what snap allocated. */
typedef struct nt__sim_ksnap {
    uint64_t ninstr, hbm_rd, hbm_wr;
    double tend, flops, ideal_ns;
    double busy[NT_ENGINE_COUNT];
    double qbusy[NT_SIM_DMA_QUEUES];
    int64_t sbuf_peak, psum_peak;
    size_t n_iv;
    double *iv; /* n_iv (start, end) pairs */
} nt__sim_ksnap;
bool nt__sim_kernel_snap(const nt_sim_kernel *k, nt__sim_ksnap *out);
bool nt__sim_kernel_restore(nt_sim_kernel *k, const nt__sim_ksnap *s);
void nt__sim_ksnap_free(nt__sim_ksnap *s);
/* Wall clock in ns (CLOCK_MONOTONIC). */
double nt__sim_now_ns(void);

/* Host address of partition p's first element of ap (HBM or on chip). */
uint8_t *nt__sim_row(const nt_ap *ap, int p);
/* Bytes between consecutive partitions of ap's memory. */
int64_t nt__sim_pstride(const nt_ap *ap);

/* Access-pattern shape with size-1 dims dropped and contiguous dims merged. */
typedef struct nt__sim_shape {
    int nd;
    int64_t num[NT_AP_MAX_DIMS], step[NT_AP_MAX_DIMS];
} nt__sim_shape;
void nt__sim_canon(const nt_ap *ap, nt__sim_shape *s);
int64_t nt__sim_free_count(const nt_ap *ap);
/* Min and max element offsets (relative to ap->offset) over the free dims. */
void nt__sim_extent(const nt_ap *ap, int64_t *lo, int64_t *hi);

#endif
