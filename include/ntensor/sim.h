/*
 * ntensor/sim.h - the simulated NeuronCore's instruction set and user tile
 * kernels: part of ntensor's public API.  <ntensor.h> includes it, so a
 * program may include either; a program that uses only tensors never needs
 * to read it.
 */
#ifndef NTENSOR_SIM_H
#define NTENSOR_SIM_H

/* The tensor API first: this file uses its types (nt_dtype, nt_tensor,
 * NT_API ...).  Its include of this file then finds NTENSOR_SIM_H defined. */
#include "ntensor.h" /* from the include root, like ntensor.h's includes */

#ifdef __cplusplus
extern "C" {
#endif

/*
 * ntensor's default device is a simulated AWS Trainium NeuronCore-v2 (trn1;
 * NT_SIM_TARGET=trn2 models v3).  Every op runs as a tile kernel on it: a
 * straight-line program of NKI-like instructions issued from C.  The same
 * instruction set is public, so a user can write a kernel and register it
 * as an op (nt_op_register_kernel).  docs/sim.md explains the model.
 *
 *   nt_sim_kernel *k = nt_sim_kernel_begin("scale");     // takes the core
 *   nt_tile *x = nt_tile_alloc(k, "x", NT_MEM_SBUF, NT_F32, 128, 512);
 *   nt_ap hx = nt_hbm_ap(src, NT_F32, 0, 128, 512, 512);  // [128, 512] rows
 *   nt_ap sx = nt_tile_ap(x);
 *   nt_isa_dma_copy(k, &sx, &hx, NT_DMA_QUEUE_AUTO);
 *   nt_isa_tensor_scalar(k, &sx, &sx, &(nt_isa_alu){NT_ALU_MUL, {NULL, 2.0f}, false},
 *                        NULL, NT_ENGINE_DEFAULT);
 *   ...
 *   int rc = nt_sim_kernel_end(k, &report);              // releases the core
 *
 * Every instruction is checked against the hardware's rules and placed on
 * its engine's simulated timeline after the instructions it depends on; its
 * exact result is computed (unless timing-only mode is on) and visible in
 * HBM at the latest when the kernel ends or nt_sim_kernel_sync returns.  An
 * instruction that breaks a rule returns NT_ESIM, records a message naming
 * the kernel, the instruction and the rule (nt_sim_kernel_message), and the
 * kernel then ignores every later instruction and returns the same error.
 *
 * Memories.  HBM is the runtime's device memory: an HBM access pattern holds
 * a plain pointer (a tensor's storage pointer is its HBM address).  SBUF
 * (128 partitions x 192 KiB on trn1) and PSUM (128 x 16 KiB = 8 banks of
 * 2 KiB per partition) are allocated explicitly, per kernel, with
 * nt_tile_alloc.
 *
 * Exactness.  Floating math is done in f32 and rounded once when written,
 * through the same definitions as the CPU backend (NaN canonical on every
 * store), so a kernel built from these instructions can reproduce the CPU's
 * bits: the library's own kernels all do.
 *
 * Threads.  One simulated core runs one kernel at a time: nt_sim_kernel_begin
 * blocks while another thread's kernel is open.  A kernel handle and its
 * tiles belong to the thread that began it until nt_sim_kernel_end.  The
 * nt_sim_* configuration and statistics functions are thread-safe.
 */

#define NT_SIM_PARTITIONS 128        /* partitions of SBUF and PSUM */
#define NT_SIM_DMA_QUEUES 16         /* DMA queues per core */
#define NT_SIM_PSUM_BANKS 8          /* PSUM banks per partition */
#define NT_SIM_PSUM_BANK_BYTES 2048  /* one bank = 512 f32 per partition */
#define NT_SIM_MATMUL_MAX_K 128      /* contraction (partitions) per nc_matmul */
#define NT_SIM_MATMUL_MAX_M 128      /* stationary free size */
#define NT_SIM_MATMUL_MAX_N 512      /* moving free size */
#define NT_SIM_SBUF_MAX_FREE 65536   /* elements per partition in one SBUF access */
#define NT_AP_MAX_DIMS 4             /* free-axis dims of an access pattern */
#define NT_DMA_QUEUE_AUTO (-1)       /* dma_copy: pick queues round robin */

typedef enum nt_sim_target {
    NT_SIM_TRN1 = 0, /* NeuronCore-v2 (default) */
    NT_SIM_TRN2 = 1, /* NeuronCore-v3 */
} nt_sim_target;

/* TensorE operand formats, each with its own rate per target
 * (nt_sim_config.tensor_rate, docs/sim.md section 4): f32; bf16 and f16
 * (one rate); fp8 (e4m3/e5m2: an entry ready for when those dtypes exist). */
typedef enum nt_sim_mm_format {
    NT_SIM_MM_F32 = 0,
    NT_SIM_MM_BF16 = 1, /* bf16 and f16 */
    NT_SIM_MM_FP8 = 2,
    NT_SIM_MM_FORMATS = 3,
} nt_sim_mm_format;

typedef enum nt_mem {
    NT_MEM_HBM = 0, /* device memory = host pointers */
    NT_MEM_SBUF,    /* state buffer, 128 partitions */
    NT_MEM_PSUM,    /* matmul accumulators, 8 banks of 2 KiB per partition */
} nt_mem;

/* The engines.  NT_ENGINE_DMA stands for the 16 DMA queues in statistics;
 * NT_ENGINE_DEFAULT lets an instruction use its usual engine. */
typedef enum nt_engine {
    NT_ENGINE_DEFAULT = -1,
    NT_ENGINE_TENSOR = 0, /* TensorE: nc_matmul, nc_transpose */
    NT_ENGINE_VECTOR,     /* VectorE */
    NT_ENGINE_SCALAR,     /* ScalarE (activation) */
    NT_ENGINE_GPSIMD,     /* GpSimd (iota, affine_select, custom code); no PSUM access */
    NT_ENGINE_DMA,
    NT_ENGINE_COUNT
} nt_engine;

/* ALU operators of tensor_tensor / tensor_scalar / tensor_reduce / scans:
 * operators of the NKI ISA's ALU (nt_alu_op_nki names the one each models).
 * Floating forms evaluate through the CPU backend's definitions (add,
 * maximum with NaN propagating, ...).  Comparisons give 1.0 or 0.0.
 * POWER runs on GpSimd only, as on the hardware. */
#define NT_ALU_OP_MAP(X) \
    X(BYPASS, bypass)    \
    X(ADD, add)          \
    X(SUB, subtract)     \
    X(MUL, multiply)     \
    X(DIV, divide)       \
    X(MAX, maximum)      \
    X(MIN, minimum)      \
    X(POW, power)        \
    X(EQ, equal)         \
    X(NE, not_equal)     \
    X(LT, less)          \
    X(LE, less_equal)    \
    X(GT, greater)       \
    X(GE, greater_equal)

typedef enum nt_alu_op {
#define NT__ALU_ENUM(id, name) NT_ALU_##id,
    NT_ALU_OP_MAP(NT__ALU_ENUM)
#undef NT__ALU_ENUM
    NT_ALU_COUNT
} nt_alu_op;

/* Activation functions of ScalarE: functions of the NKI ISA's activation
 * table (nt_act_func_nki names the one each models), evaluated through the
 * CPU backend's definitions.  GELU_DX and SILU_DX are the derivatives
 * d/dx gelu(x) and d/dx silu(x) exactly as the backward ops compute them;
 * GELU_APPRX_TANH is nt_gelu_tanh's function.  NEG has no NKI function (the
 * table has none for -x): the simulator refuses it; -x is IDENTITY with
 * scale -1.  New functions are appended, so the values stay stable. */
#define NT_ACT_FUNC_MAP(X) \
    X(IDENTITY, identity)  \
    X(EXP, exp)            \
    X(LOG, log)            \
    X(SQRT, sqrt)          \
    X(RSQRT, rsqrt)        \
    X(TANH, tanh)          \
    X(SIGMOID, sigmoid)    \
    X(GELU, gelu)          \
    X(SILU, silu)          \
    X(RELU, relu)          \
    X(ABS, abs)            \
    X(NEG, negative)       \
    X(SQUARE, square)      \
    X(GELU_DX, gelu_dx)    \
    X(SILU_DX, silu_dx)    \
    X(SOFTPLUS, softplus)  \
    X(MISH, mish)          \
    X(RECIPROCAL, reciprocal) \
    X(GELU_APPRX_TANH, gelu_apprx_tanh) \
    X(ERF, erf)            \
    X(ERF_DX, erf_dx)      \
    X(SIGN, sign)

typedef enum nt_act_func {
#define NT__ACT_ENUM(id, name) NT_ACT_##id,
    NT_ACT_FUNC_MAP(NT__ACT_ENUM)
#undef NT__ACT_ENUM
    NT_ACT_COUNT
} nt_act_func;

/** Static names ("TensorE", "add", "exp", "SBUF", ...); "?" if out of range. */
NT_API const char *nt_engine_name(nt_engine e);
NT_API const char *nt_alu_op_name(nt_alu_op op);
NT_API const char *nt_act_func_name(nt_act_func f);
NT_API const char *nt_mem_name(nt_mem m);

/** The NKI name of the ALU operator / activation function an nt_alu_op /
 *  nt_act_func models ("nki.language.add", "nki.language.exp", ...), or
 *  NULL when the NKI ISA has none: the simulator executes exactly the codes
 *  with a name (docs/sim.md cites AWS's tables).  Static strings. */
NT_API const char *nt_alu_op_nki(nt_alu_op op);
NT_API const char *nt_act_func_nki(nt_act_func f);

/** The simulator's instruction kinds, each against the nki.isa instruction
 *  (or Neuron facility) it models: entry i of 0 .. count-1 sets *name to
 *  the simulator's name ("tensor_tensor") and *nki to the NKI one
 *  ("nki.isa.tensor_tensor"); returns the count.  An instruction outside
 *  this table cannot be issued.  Static strings; thread-safe. */
NT_API int nt_sim_isa_kind(int i, const char **name, const char **nki);

/** The numbers of the simulated core (docs/sim.md cites each one). */
typedef struct nt_sim_config {
    nt_sim_target target;
    const char *name;                 /* "trn1 (NeuronCore-v2)" */
    int partitions;                   /* 128 */
    int64_t sbuf_partition_bytes;     /* 196608 (trn2: 229376) */
    int64_t psum_partition_bytes;     /* 16384 */
    double clock_ghz[NT_ENGINE_COUNT];/* per engine; 0 for DMA */
    int dma_queues;                   /* 16 */
    int dma_engines;                  /* 16, shared by all queues */
    double dma_fixed_ns;              /* fixed cost of one dma_copy */
    double dma_engine_bytes_per_ns;   /* sustained rate of one DMA engine */
    int64_t dma_min_descriptor_bytes; /* a shorter contiguous run costs this much */
    double hbm_bytes_per_ns;          /* this core's share of HBM bandwidth */
    int min_instr_cycles;             /* minimum issue interval of an engine */
    int access_latency_cycles;        /* a result reaches SBUF/PSUM this late */
    double act_table_switch_ns;       /* ScalarE loads another function table */
    bool vector_gpsimd_share_sbuf;    /* v2: VectorE and GpSimd exclude each other on SBUF */
    bool vector_scalar_share_psum;    /* v2: VectorE and ScalarE exclude each other on PSUM */
    double tensor_peak_flops_bf16;    /* 128*128*2*clock = tensor_peak_flops[NT_SIM_MM_BF16] */
    double tensor_peak_flops_f32;     /* a quarter of that = tensor_peak_flops[NT_SIM_MM_F32] */
    /* multiply-accumulates per TensorE processing element per cycle, by
     * operand format: f32 0.25, bf16/f16 1; fp8 2 on trn2 (two K-rows per
     * element, 256-deep contraction in a bf16 instruction's time), 1 on trn1
     * (cFP8 at the bf16 rate) */
    double tensor_rate[NT_SIM_MM_FORMATS];
    double tensor_peak_flops[NT_SIM_MM_FORMATS]; /* 128*128*2*clock*rate */
    bool vector_perf_mode;            /* v3: VectorE's 16-bit copies 2-4x faster */
} nt_sim_config;

/** Initialises the simulator (idempotent, thread-safe; nt_init and every
 *  other nt_sim_* call do it implicitly).  Reads NT_SIM_TARGET=trn1|trn2,
 *  NT_SIM_FUNCTIONAL=0|1 and NT_TRACE=file.json (opens the trace unless one
 *  is open already).  Returns 0, NT_EINVAL for a bad NT_SIM_* value
 *  (docs/env.md; the message names the variable) or NT_ENOMEM. */
NT_API int nt_sim_init(void);
/** Frees the simulated memories and closes a trace opened by nt_sim_init.
 *  No kernel may be open.  nt_sim_init may be called again afterwards. */
NT_API void nt_sim_shutdown(void);
/** Copies the active configuration into *out.  Thread-safe. */
NT_API int nt_sim_config_get(nt_sim_config *out);
/** Switches the modelled core (waits until no kernel runs).  Thread-safe.
 *  NT_EINVAL (the message names the argument) for a target other than
 *  NT_SIM_TRN1 or NT_SIM_TRN2; the active target is then unchanged. */
NT_API int nt_sim_set_target(nt_sim_target target);
/** Copies the configuration `target` would have into *out, without
 *  switching to it (docs/sim.md lists every value and its source).
 *  NT_EINVAL for a target other than NT_SIM_TRN1/NT_SIM_TRN2 or a NULL out
 *  (the message names the argument). */
NT_API int nt_sim_target_config(nt_sim_target target, nt_sim_config *out);
/** Timing-only mode when `on` is false: instructions are checked and timed
 *  but no data is read or written (no DMA copy, no GEMM), so huge shapes
 *  can be modelled quickly.  Applies to kernels begun afterwards.  (The
 *  runtime's ops need the data: leave it on while ops run.) */
NT_API void nt_sim_set_functional(bool on);
NT_API bool nt_sim_get_functional(void);

/** Opaque kernel being issued; owned by the library, valid from begin to end. */
typedef struct nt_sim_kernel nt_sim_kernel;
/** Opaque SBUF/PSUM tile; owned by its kernel, freed at the latest by
 *  nt_sim_kernel_end. */
typedef struct nt_tile nt_tile;

/** What one kernel did (plain data). */
typedef struct nt_sim_report {
    char name[64];
    int error;                  /* 0 or the kernel's first NT_E* code */
    char message[320];          /* "" or the error message */
    double start_ns, end_ns;    /* on the core's simulated clock */
    double duration_ns;         /* end - start */
    double busy_ns[NT_ENGINE_COUNT];              /* DMA: time any queue was active */
    double dma_queue_busy_ns[NT_SIM_DMA_QUEUES];
    uint64_t instructions;
    double flops;               /* matmul FLOPs, 2*M*N*K */
    double tensor_ideal_ns;     /* time TensorE needs for them at peak */
    uint64_t hbm_read_bytes, hbm_write_bytes;
    int64_t sbuf_peak_bytes;    /* per partition */
    int64_t psum_peak_bytes;
} nt_sim_report;

/** Timing of the most recent instruction (plain data). */
typedef struct nt_sim_instr_info {
    const char *name;     /* "nc_matmul" (static) */
    nt_engine engine;     /* NT_ENGINE_DMA for dma_copy */
    int queue;            /* DMA queue, else -1 */
    double cycles;        /* engine cycles (0 for DMA) */
    double start_ns, end_ns;
} nt_sim_instr_info;

/** Opens a kernel named `name` (copied; for messages and the trace).
 *  Blocks until the simulated core is free, then owns it until
 *  nt_sim_kernel_end: never begin a second kernel on the same thread before
 *  ending the first.  The kernel starts when the previous one ended on the
 *  simulated clock.  Returns NULL only if memory runs out. */
NT_API nt_sim_kernel *nt_sim_kernel_begin(const char *name);
/** Closes k: completes its functional work, frees its tiles, adds its times
 *  to the global statistics, writes its trace events and releases the core.
 *  Fills *report if non-NULL.  Returns 0 or the kernel's first error.  k is
 *  invalid afterwards. */
NT_API int nt_sim_kernel_end(nt_sim_kernel *k, nt_sim_report *report);
/** Completes the functional work of the instructions issued so far, so
 *  their results are in HBM for the host to read.  Returns the kernel's
 *  error (0 if none).  Kernels that only read results after
 *  nt_sim_kernel_end never need it. */
NT_API int nt_sim_kernel_sync(nt_sim_kernel *k);
/** The kernel's first error code (0 if none) and its message ("" if none);
 *  the string is owned by k and valid until nt_sim_kernel_end. */
NT_API int nt_sim_kernel_error(const nt_sim_kernel *k);
NT_API const char *nt_sim_kernel_message(const nt_sim_kernel *k);
/** Timing of the last instruction issued in k; NT_ESTATE if none. */
NT_API int nt_sim_kernel_last(const nt_sim_kernel *k, nt_sim_instr_info *out);

/** Allocates a tile of `partitions` x `free_elems` elements of `dt` in SBUF
 *  or PSUM.  It occupies the same bytes in every partition.  A PSUM tile is
 *  at most one bank (2 KiB per partition) and never crosses a bank.  Returns
 *  NULL and sets the kernel's error (NT_ESIM, naming the kernel and the tile)
 *  if it does not fit.  `name` is copied. */
NT_API nt_tile *nt_tile_alloc(nt_sim_kernel *k, const char *name, nt_mem mem,
                              nt_dtype dt, int partitions, int64_t free_elems);
/** Returns t's space to k's allocator; later instructions that reuse the space
 *  wait for t's pending readers and writers.  Using t afterwards is an error. */
NT_API int nt_tile_release(nt_sim_kernel *k, nt_tile *t);
/** Largest tile (bytes per partition) that nt_tile_alloc could place now. */
NT_API int64_t nt_tile_free_bytes(const nt_sim_kernel *k, nt_mem mem);
/** A tile's dtype, partition count and free size (elements per partition);
 *  NT_DTYPE_COUNT / 0 for NULL. */
NT_API nt_dtype nt_tile_dtype(const nt_tile *t);
NT_API int nt_tile_partitions(const nt_tile *t);
NT_API int64_t nt_tile_size(const nt_tile *t); /* free elements per partition */

/** A view of memory as [np partitions] x [num[0] x ... x num[ndim-1]] with
 *  steps in elements (row-major: the last dim varies fastest; a step of 0
 *  repeats an element).  On-chip: the partitions p0 .. p0+np-1 of `tile`,
 *  element `offset` of each partition.  HBM (tile == NULL): row p starts at
 *  element offset + p*pstep of `hbm`.  Plain data: build it with the helpers
 *  below and edit num/step for 2-4-D views.  The simulator writes only
 *  through destination patterns. */
typedef struct nt_ap {
    nt_tile *tile;   /* SBUF/PSUM tile, or NULL for HBM */
    void *hbm;       /* HBM base pointer when tile == NULL */
    nt_dtype dtype;  /* must equal the tile's dtype on chip */
    int32_t p0, np;  /* partition start (relative to the tile) and count */
    int64_t pstep;   /* HBM only: elements between partition rows */
    int64_t offset;  /* elements */
    int32_t ndim;    /* 1 .. NT_AP_MAX_DIMS free dims */
    int64_t num[NT_AP_MAX_DIMS];
    int64_t step[NT_AP_MAX_DIMS];
} nt_ap;

/** The whole tile as [partitions, size]. */
NT_API nt_ap nt_tile_ap(const nt_tile *t);
/** Partitions [p0, p0+np) and free elements [f0, f0+nf) of t. */
NT_API nt_ap nt_tile_slice(const nt_tile *t, int p0, int np, int64_t f0, int64_t nf);
/** A 2-D HBM view: `rows` rows of `cols` contiguous elements of `dt`,
 *  row r at element offset + r*row_stride of base.  rows outside
 *  0..INT32_MAX gives np = -1, which every instruction refuses. */
NT_API nt_ap nt_hbm_ap(const void *base, nt_dtype dt, int64_t offset, int64_t rows,
                       int64_t row_stride, int64_t cols);

/* Instructions.  Each returns 0 or a negative NT_E* code (NT_ESIM for a
 * broken rule) and is a no-op returning the kernel's error once it failed.
 * Floating math is done in f32 and rounded once when written.  Lanes are
 * partitions: an elementwise instruction reads partition p0_in + i and
 * writes p0_out + i. */

/** A scalar operand: the per-partition value of a [np, 1] pattern `ap`
 *  (SBUF or PSUM, same partition count as the data) or, if ap is NULL, the
 *  immediate `imm`. */
typedef struct nt_isa_scalar {
    const nt_ap *ap;
    float imm;
} nt_isa_scalar;

/** One ALU step of tensor_scalar: x <op> operand, or operand <op> x when
 *  `reverse` is set. */
typedef struct nt_isa_alu {
    nt_alu_op op;
    nt_isa_scalar operand;
    bool reverse;
} nt_isa_alu;

/** An affine function of the position, for iota and affine_select:
 *  value = offset + channel_multiplier * p + sum_i step[i] * idx[i], with p
 *  the partition index within the destination pattern and idx[i] the index
 *  along its free dim i.  Computed in 32-bit integers. */
typedef struct nt_isa_affine {
    int32_t offset;
    int32_t channel_multiplier;
    int32_t step[NT_AP_MAX_DIMS];
} nt_isa_affine;

/** dst <- src on a DMA queue (0..15, or NT_DMA_QUEUE_AUTO).  HBM<->SBUF,
 *  SBUF<->SBUF or HBM<->HBM (never PSUM); same dtype (no conversion), same
 *  partition count, same number of free elements (shapes may differ: both
 *  are walked in row-major order).  HBM bytes moved are counted. */
NT_API int nt_isa_dma_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, int queue);

/** Indirect DMA (an embedding gather): partition i of dst (SBUF) receives
 *  row idx[i] of src, an HBM pattern whose row r starts at element
 *  offset + r * pstep and has src's free dims; src->np is the number of rows
 *  (the bound).  idx is an SBUF [dst->np, 1] pattern of i32 or u8 on dst's
 *  partitions.  An index outside [0, src->np) is a broken rule (NT_ESIM).
 *  src is not dependency-tracked: do not write it earlier in the kernel. */
NT_API int nt_isa_dma_gather(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                             const nt_ap *idx, int queue);

/** TensorE: dst[M, N] (+)= stationary[K, M]^T . moving[K, N].
 *  stationary and moving in SBUF, same dtype (f32, bf16, f16, e4m3 or
 *  e5m2), K <= 128
 *  partitions, M <= 128, N <= 512; dst an f32 PSUM pattern of M partitions
 *  and N contiguous elements inside one bank.  accumulate=false overwrites.
 *  Products accumulate in f32 exactly as the CPU backend's K-tile. */
NT_API int nt_isa_nc_matmul(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *stationary,
                            const nt_ap *moving, bool accumulate);
/** TensorE's fp8 double-row mode (NeuronCore-v3, NT_SIM_TARGET=trn2):
 *  stationary [K, 2, M] and moving [K, 2, N], both e4m3 or both e5m2, a
 *  2K-deep contraction in one instruction at a bf16 instruction's cost
 *  (twice the fp8 rate of nc_matmul).  Its values are those of two
 *  nc_matmul instructions, row group 0 (accumulate as given) then row
 *  group 1 (accumulating): the CPU backend's K-tile recurrence.  Other
 *  rules as nc_matmul; on trn1 it is a rule error. */
NT_API int nt_isa_nc_matmul_dr(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *stationary,
                               const nt_ap *moving, bool accumulate);

/** TensorE: dst[F, P] = src[P, F]^T with P, F <= 128; src in SBUF, dst in
 *  one PSUM bank with src's dtype or f32. */
NT_API int nt_isa_nc_transpose(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src);

/** dst = a <op> b elementwise (VectorE or GpSimd).  a and b may not both be
 *  in PSUM.  All-integer operands compute exactly in int32. */
NT_API int nt_isa_tensor_tensor(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *a,
                                const nt_ap *b, nt_alu_op op, nt_engine engine);

/** dst = (src <op0> operand0) <op1> operand1 (op1 may be NULL) on VectorE,
 *  ScalarE or GpSimd.  Operands are immediates or per-partition [np, 1]
 *  patterns.  All-integer operands compute exactly in int32. */
NT_API int nt_isa_tensor_scalar(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                const nt_isa_alu *op0, const nt_isa_alu *op1,
                                nt_engine engine);

/** VectorE or GpSimd: dst = (src <op0> operand0) <op1> b -- a tensor_scalar
 *  step, then a tensor_tensor step with b (b <op1> t when reverse1), in one
 *  instruction at tensor_tensor's cost (NKI's scalar_tensor_tensor).  The
 *  intermediate t stays f32 (exact, as an f32 tile would hold it); the
 *  result is rounded once to dst's dtype.  op0 and op1 are nt_alu_op
 *  codes; at most one of src and b in PSUM.  All-integer operands compute
 *  exactly in int32. */
NT_API int nt_isa_scalar_tensor_tensor(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                       const nt_isa_alu *op0, nt_alu_op op1, const nt_ap *b,
                                       bool reverse1, nt_engine engine);

/** ScalarE: dst = func(src * scale + bias).  scale and bias are optional
 *  (NULL): an absent one is not applied at all, so -0 stays -0.  If
 *  reduce_dst ([np, 1]) is given, the f32 results of each partition are also
 *  summed there in the canonical order of the CPU's sums. */
NT_API int nt_isa_activation(nt_sim_kernel *k, const nt_ap *dst, nt_act_func func,
                             const nt_ap *src, const nt_isa_scalar *scale,
                             const nt_isa_scalar *bias, const nt_ap *reduce_dst);

/** VectorE: reduces (NT_ALU_ADD, NT_ALU_MAX or NT_ALU_MIN) the innermost `naxes` free
 *  dims of src (0 = all of them); dst has the remaining elements per
 *  partition.  Each run is reduced exactly like the CPU's sum / max of that
 *  many elements: acc = +0 (or -Inf, +Inf); acc = op(acc, partial) over blocks of
 *  2048 in order, each block in a fixed 16-lane order. */
NT_API int nt_isa_tensor_reduce(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                nt_alu_op op, int naxes);

/** dst = src with dtype conversion (VectorE, ScalarE or GpSimd). */
NT_API int nt_isa_tensor_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                              nt_engine engine);

/** A 64-bit affine element index, for tensor_copy_sr: index = offset +
 *  channel_multiplier * p + sum_i step[i] * idx[i] over dst's partitions p
 *  and free dims i. */
typedef struct nt_isa_index {
    int64_t offset;
    int64_t channel_multiplier;
    int64_t step[NT_AP_MAX_DIMS];
} nt_isa_index;

/** dst = src with stochastic rounding (VectorE, ScalarE or GpSimd): an f32
 *  value going to a bf16 or f16 dst rounds to one of its two neighbours
 *  with the random bits of (key, its element index), exactly as the CPU
 *  backend's NT_STOCHASTIC_ROUNDING casts do (core/dtype.h); any other
 *  pair of dtypes converts as tensor_copy does. */
NT_API int nt_isa_tensor_copy_sr(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                 uint64_t key, const nt_isa_index *index, nt_engine engine);

/** dst = value (VectorE or GpSimd): (float)value rounded to dst's dtype;
 *  integer tiles get value truncated (saturated to int32). */
NT_API int nt_isa_memset(nt_sim_kernel *k, const nt_ap *dst, double value, nt_engine engine);

/** GpSimd: dst = the affine function of each position (SBUF only). */
NT_API int nt_isa_iota(nt_sim_kernel *k, const nt_ap *dst, const nt_isa_affine *expr);

/** GpSimd: dst = cmp(affine value, 0) ? on_true : on_false, where cmp is one
 *  of the comparison ALU ops (SBUF only). */
NT_API int nt_isa_affine_select(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *on_true,
                                const nt_isa_affine *pred, nt_alu_op cmp, float on_false);

/** dst = pred != 0 ? on_true : on_false elementwise (VectorE or GpSimd),
 *  like nl.where: pred is read as f32 (any dtype); the chosen value is
 *  rounded to dst (all-integer values are copied exactly).  Use a step-0
 *  pattern of a [np, 1] tile for a constant. */
NT_API int nt_isa_select(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *pred,
                         const nt_ap *on_true, const nt_ap *on_false, nt_engine engine);

/** VectorE: a scan along the free elements of each partition (row-major
 *  order), like NKI's tensor_tensor_scan: r = initial; for each j:
 *  r = (data0[j] <op0> r) <op1> data1[j]; dst[j] = r.  r stays f32 between
 *  steps; each dst[j] is rounded once.  initial: immediate or [np, 1]. */
NT_API int nt_isa_tensor_tensor_scan(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *data0,
                                     const nt_ap *data1, const nt_isa_scalar *initial,
                                     nt_alu_op op0, nt_alu_op op1);

/** One operand of a custom GpSimd operator, as its code sees it: partition
 *  p's n elements start at (char *)data + p * pstride. */
typedef struct nt_gpsimd_operand {
    void *data;
    int64_t pstride; /* bytes between partitions */
    nt_dtype dtype;
    int np;          /* partitions */
    int64_t n;       /* elements per partition, contiguous */
} nt_gpsimd_operand;

/** A custom GpSimd operator (like a Neuron custom C++ operator): reads src
 *  and writes dst (NULL for a check that writes nothing) on the host.  It
 *  may move data across partitions.  Returns 0, or a negative NT_E* code
 *  after writing a message into msg (msglen bytes): the instruction then
 *  fails with that code and message. */
typedef int (*nt_gpsimd_fn)(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src,
                            int nsrc, void *ctx, char *msg, size_t msglen);

/** GpSimd: runs fn over dst and src[0..nsrc) (nsrc <= 4; contiguous [np, n]
 *  SBUF patterns).  Costs 150 + cycles_per_elem * n cycles (n = free
 *  elements per partition of dst, or of src[0]).  `name` is for messages.
 *  fn is not called in timing-only mode. */
NT_API int nt_isa_gpsimd_custom(nt_sim_kernel *k, const char *name, const nt_ap *dst,
                                const nt_ap *const *src, int nsrc, double cycles_per_elem,
                                nt_gpsimd_fn fn, void *ctx);

/** Called by nt_tile_matmul for every finished accumulator block instead of
 *  its own store: acc is an f32 PSUM pattern [mw, nw] holding
 *  C[m0 .. m0+mw, n0 .. n0+nw]; the epilogue must read it (evacuate it)
 *  before returning, with any instructions.  Returns 0 or an error. */
typedef int (*nt_tile_matmul_epilogue)(nt_sim_kernel *k, const nt_ap *acc, int64_t m0,
                                       int64_t n0, void *ctx);

/** C[M, N] = A[M, K] . B[K, N] from HBM to HBM.  With b_trans, b holds B^T
 *  [N, K] row-major (row stride ldb >= K), as a linear layer's weight does
 *  for x . w^T: the program transposes its tiles on TensorE in SBUF/PSUM,
 *  never through HBM.  Same bits as B given row-major. */
typedef struct nt_tile_matmul_args {
    int64_t M, N, K;
    const void *a;        /* A [M, K] (row stride lda), or A^T [K, M] if a_trans */
    int64_t lda;
    bool a_trans;
    const void *b;        /* B [K, N], row stride ldb */
    int64_t ldb;
    nt_dtype in_dtype;    /* of A and B: f32, bf16 or f16 */
    void *c;              /* C [M, N], row stride ldc (unused with an epilogue) */
    int64_t ldc;
    nt_dtype out_dtype;   /* f32, bf16 or f16 */
    nt_tile_matmul_epilogue epilogue; /* NULL: round to out_dtype and store C */
    void *epilogue_ctx;
    bool b_trans;         /* b is B^T [N, K], row stride ldb */
    /* Non-NULL: also the sums of A's K columns over its M rows (M >= 1),
     * [K] contiguous in a_colsum_dtype (the last field: f32 when left 0),
     * each of A's elements widened to f32 and summed in f32 in the one
     * reduction order (core/reduce.h: blocks of 2048 rows ascending, 16
     * lanes in a block folded in halves), rounded once to a_colsum_dtype,
     * taken from A's tiles as the program turns them for TensorE (GpSimd
     * adds), so A is read once for both: a linear layer's bias gradient
     * beside dX = dY . W.  Rule: A f32, bf16 or f16 and row-major (not
     * a_trans); a_colsum_dtype f32, bf16 or f16. */
    void *a_colsum;
    bool epilogue_apart;  /* the epilogue writes nothing that it, A or B reads: the
                             program may hand it the N-chunks of one row block in
                             turn (B kept in SBUF); false: as an in-place epilogue */
    bool *acc_kept;       /* non-NULL: set before each epilogue call -- true when the
                             program writes and frees that accumulator no earlier
                             than the epilogue's next call has returned, so the
                             epilogue may leave reads of acc to that call */
    /* Non-NULL x: also W[K, NX] = A^T . X (X [M, NX] row-major, row stride
     * ldx, in_dtype; W in w_dtype, row stride ldw), from the tiles of A the
     * program loads for its own product, so A is read once for both: a
     * linear layer's weight gradient dY^T . X beside dX = dY . W.  Each
     * element of W sums A's M-tiles of 128 in ascending order, as the
     * program for A^T . X alone does (same bits).  Rule: A row-major (not
     * a_trans): see nt_tile_matmul. */
    const void *x;
    int64_t ldx, NX;
    void *w;
    int64_t ldw;
    nt_dtype w_dtype;
    nt_dtype a_colsum_dtype; /* of a_colsum's sums: f32 (0), bf16 or f16 */
    int *acc_lives;       /* non-NULL: set before each epilogue call -- how many of the
                             epilogue's next calls return before the program writes or
                             frees that accumulator (0: none; acc_kept is this >= 1), so
                             the epilogue may leave reads of acc to the last of them */
} nt_tile_matmul_args;

/** Issues into k a matmul program: PSUM accumulation over K-tiles of 128 in
 *  ascending order (bitwise equal to the CPU backend's matmul), one
 *  rounding to out_dtype, stationary panels reused across N, DMA spread over
 *  queues with multi-buffering.  Uses (and frees again) SBUF and PSUM left
 *  free in k.  Any M, N, K >= 0 and row strides.  With x (the weight
 *  gradient beside it): A row-major and f32, bf16 or f16, M, N, K >= 1, NX in
 *  1..512 and ceil(K / 128) * NX <= 512 (W's accumulators share one PSUM
 *  bank for the whole program); a program that cannot keep all of B in
 *  SBUF and stream A's row tiles past it returns NT_ENOTSUP with nothing
 *  issued and k still usable (run the two products apart). */
NT_API int nt_tile_matmul(nt_sim_kernel *k, const nt_tile_matmul_args *args);

/** Totals over all kernels since the start or the last reset (plain data). */
typedef struct nt_sim_stats {
    uint64_t kernels, instructions, errors;
    double sim_ns;                          /* sum of kernel durations */
    double clock_ns;                        /* the core's clock: end of the last kernel */
    double busy_ns[NT_ENGINE_COUNT];
    double utilization[NT_ENGINE_COUNT];    /* busy / sim_ns */
    double dma_queue_busy_ns[NT_SIM_DMA_QUEUES];
    uint64_t hbm_read_bytes, hbm_write_bytes;
    double hbm_bytes_per_ns;                /* peak used for the utilisation */
    double hbm_bw_utilization;              /* bytes / (sim_ns * peak) */
    double flops;                           /* matmul FLOPs */
    double tensor_ideal_ns;                 /* at TensorE peak for the dtypes used */
    double mfu;                             /* tensor_ideal_ns / sim_ns */
    double host_ns;                         /* wall time the host spent inside kernels */
    double host_gemm_ns;                    /* of which in nc_matmul's functional GEMM */
    double host_values_ns;                  /* of which computing values once per program
                                               (the CPU backend's kernel or fused executor,
                                               NT_SIM_PROGRAM_VALUES) */
} nt_sim_stats;

/** Fills *out with the totals.  Thread-safe; after nt_init it covers every
 *  op the runtime ran on the simulator. */
NT_API int nt_sim_stats_get(nt_sim_stats *out);
/** Zeroes the totals (not the clock, which only moves forward).  Thread-safe. */
NT_API void nt_sim_stats_reset(void);
/** The totals of one device (simulated core `dev`, NT_SIM_CORES): its
 *  kernels, their simulated time, its clock (clock_ns), engine busy time,
 *  HBM traffic; nt_sim_stats_get adds them over every core (clock_ns: the
 *  latest core's).  NT_EINVAL for a dev out of 0..NT_SIM_CORES-1.  All
 *  zero for a device that ran nothing on the simulator (the CPU backend).
 *  Reset with the others by nt_sim_stats_reset. */
NT_API int nt_device_stats_get(int dev, nt_sim_stats *out);

/** A device tensor as a tile kernel sees it (plain data): element
 *  [i0, i1, ...] is at data + (i0 * stride[0] + i1 * stride[1] + ...) *
 *  nt_dtype_size(dtype), an HBM address to use in nt_ap patterns. */
typedef struct nt_tensor_view {
    void *data;
    nt_dtype dtype;
    int ndim;
    int64_t shape[NT_MAX_DIMS];
    int64_t stride[NT_MAX_DIMS]; /* in elements */
} nt_tensor_view;

/** A user op whose forward is a tile kernel on the simulator.  Called with
 *  nt_op_call like an nt_op_register op; it is queued, ordered and
 *  reported like a built-in op. */
typedef struct nt_kernel_op_def {
    const char *name; /* for messages, the trace and kernel names (copied) */
    int nin;          /* tensor inputs: 1..4 */
    /** The shape rule, run by nt_op_call before anything is queued: given
     *  the inputs' dtypes and shapes (data and strides are filled but the
     *  data may not be computed yet: do not read it), set out->dtype,
     *  out->ndim (0..NT_MAX_DIMS) and out->shape.  Return 0, or a negative
     *  NT_E* code after writing the reason into why (whylen bytes):
     *  nt_op_call then fails with that code, naming the op. */
    int (*shape)(const nt_tensor_view *in, int nin, nt_tensor_view *out, char *why,
                 size_t whylen, void *ctx);
    /** The kernel: issue instructions into k (opened and closed by the
     *  runtime, named after the op) that read in[0..nin) and write out (a
     *  fresh contiguous tensor).  Return 0 or a negative code; an error (or
     *  a broken rule) poisons the output, and the next sync on it reports
     *  it with the op's name and the nt_op_call site. */
    int (*kernel)(nt_sim_kernel *k, const nt_tensor_view *in, int nin,
                  const nt_tensor_view *out, void *ctx);
    /** Optional: as nt_op_def.backward (ntensor ops, gin[i] shaped like
     *  in[i]); NULL for an op without a gradient. */
    int (*backward)(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                    void *ctx);
    void *ctx;        /* passed to all three; must outlive the op */
} nt_kernel_op_def;

/** Registers a tile-kernel op; returns its id for nt_op_call, or a negative
 *  error (NULL def, shape or kernel, nin out of range, empty or duplicate
 *  name).  The kernel always runs on the simulator (NT_BACKEND=cpu does not
 *  apply: it has no CPU form).  Thread-safe. */
NT_API int nt_op_register_kernel(const nt_kernel_op_def *def);

#ifdef __cplusplus
}
#endif
#endif /* NTENSOR_SIM_H */
