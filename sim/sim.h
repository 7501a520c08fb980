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

/* First-fit allocator over one partition's byte range (per kernel). */
typedef struct nt__sim_alloc {
    nt__sim_block *free; /* sorted by offset, coalesced */
    int n, cap;
    int64_t total, used, peak;
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
    double gemm_ns;    /* wall time of the functional GEMMs */
};

/* The one simulated core. */
typedef struct nt__sim_core {
    nt_sim_config cfg;
    uint8_t *sbuf, *psum; /* 64-byte aligned views of the raw buffers */
    void *sbuf_raw, *psum_raw;
    int64_t sbuf_stride, psum_stride; /* bytes between partitions */
    float *scratch[4];    /* per-kernel work rows (kernels are serialised) */
    size_t scratch_elems;
} nt__sim_core;

extern nt__sim_core nt__sim;

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
/* Stops the functional helper thread (nt_sim_shutdown). */
void nt__sim_fx_shutdown(void);
/* NT_SIM_PROGRAM_GEMM (default on): the matmul tile program computes its
 * product once for the whole program (tp_matmul.c). */
bool nt__sim_program_gemm(void);
void nt__sim_set_program_gemm(bool on); /* for tests */
/* NT_SIM_PROGRAM_VALUES (default on): the built-in elementwise, row and
 * matmul programs (sim/kernels/ew.c, matmul.c) take their values from the
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
