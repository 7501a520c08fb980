/* neuron/sk.h - what the simulator backend's kernels share.
 *
 * Every op of the runtime runs on the simulated NeuronCore as a tile program
 * built from the public ISA (include/ntensor/sim.h):
 *
 *   runtime.c  the backend (nt__sim_backend, core/backend.h), the kernel
 *              table, kernel
 *              begin/end with error mapping, HBM scratch, the tilers
 *   ew.c       elementwise programs: every eager elementwise op (a program of
 *              one op) and the fusion engine's EW, ROW and MM programs
 *   reduce.c   sum, mean, max, argmax, min, argmin, any, norm over a dim
 *              or all
 *   rows.c     softmax, log_softmax, layer_norm, rms_norm, cross_entropy,
 *              mse_loss
 *   matmul.c   batched matmul through nt_tile_matmul (and MM programs)
 *   gather.c   embedding and embedding_bwd
 *   index.c    gather, index_select, their backward index_add, scatter(_add)
 *   attention.c  scaled dot-product attention and its backward (flash style)
 *   conv.c     conv_gemm and conv_wgrad (convolutions: im2col on chip or by DMA)
 *   bn.c       batch_norm_fwd and batch_norm_bwd (training batch norm)
 *   moe.c      grouped_mm, grouped_mm_wgrad and all_to_all_index (mixture
 *              of experts: one nt_tile_matmul program per expert)
 *   pool.c     max_pool2d_fwd and max_pool2d_bwd (max pooling with indices)
 *   gen.c      arange, rand, randn (GpSimd custom code)
 *   sample.c   dropout, topk, multinomial (GpSimd custom code)
 *   user.c     user tile kernels (nt_op_register_kernel)
 *
 * Contract: a kernel computes exactly the CPU kernel's bits for the same
 * record (cpu/ is the reference: same loads, same core/ewise.h definitions,
 * same reduction order, same rounding points).  docs/sim.md says how each
 * kernel maps the CPU's arithmetic onto instructions. */
#ifndef NT_SIM_KERNELS_SK_H
#define NT_SIM_KERNELS_SK_H

#include "core/backend.h"
#include "core/internal.h"
#include "core/reduce.h"
#include "core/rows.h"
#include "fusion/ir.h"

/* ---------------- kernels ---------------- */

/* Per-kernel helper state: the open kernel and DMA queue rotation. */
typedef struct sk_k {
    nt_sim_kernel *k;
    int qin, qout;   /* next load / store queue */
    int eng;         /* alternation of VectorE / ScalarE for tensor_scalar */
    bool scalar_first; /* sk_eng_ap: VectorE has more than its share (ew.c) */
    nt_tile *warm;   /* sk_warm_act's scratch element */
    char derr[200];  /* a data error found by the kernel (CPU-style message) */
    int derr_code;
    void *scratch[8]; /* HBM scratch buffers, freed at end */
    size_t scratch_bytes[8];
    int nscratch;
    /* the timing memo (runtime.c): the key of a program that missed, kept
     * for sk_values_end to file the program's timing under */
    uint8_t *mkey;
    size_t mlen;
    uint64_t mhash;
    /* sk_matmul_run: its epilogue writes nothing it or the product reads
     * (nt_tile_matmul_args.epilogue_apart); set by the caller around the call */
    bool mm_apart;
    /* sk_matmul_run: nt_tile_matmul_args.acc_lives (NULL: not asked; its
     * acc_kept is this >= 1); set by the caller around the call, as mm_apart */
    int *mm_lives;
} sk_k;

/* Opens kernel `name` (an op name, "fused.ew", ...). */
int sk_begin(sk_k *s, const char *name);
/* Values once per program (NT_SIM_PROGRAM_VALUES, docs/sim.md): when on and
 * the kernel computes values, turns its instructions' functional steps off
 * and returns true -- the caller then issues the program (checked and timed
 * as usual) and, if it ran, gets the values from the reference kernel with
 * sk_values_end; false: the instructions compute the values themselves. */
bool sk_values_begin(sk_k *s);
/* Ends what sk_values_begin started: turns the kernel's functional steps
 * back on and, if rc (the program's result) is 0, runs ref(arg) -- the CPU
 * backend's kernel or fused executor for the same record or group -- for the
 * values.  Returns rc, or ref's result. */
int sk_values_end(sk_k *s, int rc, int (*ref)(const void *arg), const void *arg);
/* The timing memo.  A program that takes its values from the reference
 * (sk_values_begin returned true) is a function of what its kernel reads of
 * the record or group -- op, parameters, every tensor's dtype, shape,
 * strides and offset, which operands are the same tensor or share a storage
 * -- and of the simulator's target: the same key issues the same
 * instructions, and a kernel's timing depends on nothing else (it starts on
 * its own timeline at 0; HBM pages count from each pattern's base, so where
 * a buffer lies never matters, only which patterns share one).  So the
 * first run files what nt_sim_kernel_end reads (nt__sim_ksnap) under the key
 * and a later run with the same key, compared byte for byte, restores it
 * instead of issuing the program again: the same report, statistics and
 * clock, bit for bit.  Filed only for a program that ran clean: no error,
 * no data error, no HBM scratch, no instruction computed values, no
 * gpsimd_custom or dma_gather; never while tracing (the trace wants the
 * instructions).  sk_memo_rec / sk_memo_group: call right after
 * sk_values_begin returned true; true = a hit, the kernel's timing is
 * restored and the caller goes straight to sk_values_end (issuing
 * nothing); false = issue the program as usual.  imm: the program uses the
 * record's float scalars (p.f) only as instruction operands -- immediates
 * and memset values, which no rule or cost reads -- so they stay out of the
 * key (ew.c's programs; a fused group's always do).  Else their bits are
 * part of it (a norm's p picks its program). */
bool sk_memo_rec(sk_k *s, const nt__rec *r, bool imm);
bool sk_memo_group(sk_k *s, const nt__fgroup *g);
/* The same for the programs g[0..n) of a shared kernel (neuron/foreach.c;
 * g->prog NULL: the record g->recs[0]), their operands compared across
 * them. */
bool sk_memo_list(sk_k *s, const nt__fgroup *const *g, int n);
/* Counts since start (tests): hits, programs filed. */
void nt__sk_memo_counts(uint64_t *hits, uint64_t *filed);
/* On (default) or off (NT_SIM_MEMO=0; tests compare both). */
void nt__sk_memo_set(bool on);
/* Drops every entry (sim_shutdown). */
void nt__sk_memo_clear(void);
/* The references: the CPU backend's kernel of record r (an nt__rec), its
 * fused executor for group g (an nt__fgroup). */
int sk_ref_rec(const void *r);
int sk_ref_fused(const void *g);
/* The end of a record's kernel that began its stretch with values =
 * sk_values_begin(s): the reference for record r (when values and the
 * program's rc is 0), then sk_end; sk_end's error first, else rc. */
int sk_end_values(sk_k *s, bool values, int rc, const nt__rec *r);
/* Ends the kernel; returns 0, or a negative code after nt__kerr() described
 * the problem (a data error in CPU words, else the simulator's message). */
int sk_end(sk_k *s);
/* HBM scratch of n bytes (64-byte aligned, from the device arena), freed by
 * sk_end.  NULL (and the kernel's error set) if the arena is full. */
void *sk_scratch(sk_k *s, size_t n);
/* Records a data error (first one wins); returns code. */
int sk_data_error(sk_k *s, int code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static inline int sk_qin(sk_k *s) { int q = s->qin; s->qin = (q + 1) % 8; return q; }
static inline int sk_qout(sk_k *s) { int q = s->qout; s->qout = (q + 1) % 8; return 8 + q; }
/* VectorE or ScalarE for work either runs (tensor_scalar, tensor_copy):
 * the one that frees up first for what was issued so far, so a program
 * heavy in tensor_tensor work (VectorE only) moves its scalar steps and
 * copies to ScalarE.  Ties alternate. */
nt_engine sk_eng(sk_k *s);
/* The same choice for a program whose VectorE-only work (tensor_tensor)
 * outweighs what ScalarE would get with every flexible step
 * (s->scalar_first, set by the program): ScalarE, always.  Picking the
 * engine that frees up first put AdamW's scalar steps on VectorE, its
 * bottleneck, whenever ScalarE was a little behind. */
nt_engine sk_eng_ap(sk_k *s, const nt_ap *dst);
/* Loads ScalarE's table for activation f now (one activation on a scratch
 * element, never read): issued first, the 1 us table load overlaps the
 * kernel's first loads instead of sitting in its chain. */
int sk_warm_act(sk_k *s, nt_act_func f);
/* The DMA queue that frees up first (the lowest on a tie): for loads that
 * can start at once but would queue behind another program's transfers on
 * a fixed rotation (an MM epilogue's inputs behind the matmul's B loads). */
int sk_qfree(sk_k *s);
/* Engine e's clock (the configuration, read-only while a kernel runs: no
 * lock, unlike nt_sim_config_get, whose lock a kernel must not take). */
double sk_clock_ghz(nt_engine e);

/* SBUF bytes per partition a kernel plans with (the rest is headroom for
 * nt_tile_matmul's minimum and small tiles). */
#define SK_SBUF_BUDGET (160 * 1024)

/* Allocates a tile; on failure the kernel's error is set and NULL returned. */
static inline nt_tile *sk_tile(sk_k *s, const char *name, nt_dtype dt, int np, int64_t n)
{
    return nt_tile_alloc(s->k, name, NT_MEM_SBUF, dt, np, n < 1 ? 1 : n);
}

/* ---------------- HBM views ---------------- */

/* np rows of HBM from base + off (elements), pstep elements apart, each of
 * m elements step apart: nt_hbm_ap with a free-dim step. */
static inline nt_ap sk_hbm_rows(const void *base, nt_dtype dt, int64_t off, int np, int64_t pstep,
                                int64_t m, int64_t step)
{
    nt_ap a = nt_hbm_ap(base, dt, off, np, pstep, m);
    a.step[0] = step;
    return a;
}

/* A tensor in HBM: base pointer at its offset, dtype, strides at some
 * iteration shape (0 on broadcast dims). */
typedef struct sk_hv {
    char *base;
    nt_dtype dt;
    int64_t st[NT_MAX_DIMS];
} sk_hv;

/* t at iteration shape (ndim, shape) (broadcast strides). */
void sk_hv_of(sk_hv *v, const nt_tensor *t, int ndim, const int64_t *shape);

/* ---------------- the elementwise tiler ---------------- */

#define SK_MAXOPND (NT_F_MAXEXT + NT_F_MAXOUT + 1) /* + the element index */

/* One tile of an iteration space: np partitions x nf free elements; for
 * every operand an HBM pattern covering exactly those elements in the same
 * (row-major) order. */
typedef struct sk_tile_iter {
    int np;
    int64_t nf;
    nt_ap ap[SK_MAXOPND];
} sk_tile_iter;

typedef struct sk_tiler {
    int nd;
    int64_t c[NT_MAX_DIMS];              /* collapsed iteration dims */
    int nop;
    int64_t st[SK_MAXOPND][NT_MAX_DIMS]; /* collapsed strides */
    char *base[SK_MAXOPND];
    nt_dtype dt[SK_MAXOPND];
    int P;            /* partition dim; nd - 1 = split the last dim into rows */
    int64_t cs;       /* chunk of dim P + 1 (or row length when P = nd - 1) */
    int64_t fmax;
} sk_tiler;

/* Plans tiles of at most fmax free elements over (nd, shape) for nop
 * operands given as HBM views at that shape. */
void sk_tiler_init(sk_tiler *T, int nd, const int64_t *shape, int nop, const sk_hv *v,
                   int64_t fmax);
/* Calls fn for every tile in order; stops at the first nonzero return. */
int sk_tiler_run(const sk_tiler *T, int (*fn)(void *ctx, const sk_tile_iter *t), void *ctx);

/* Rows of a tensor along dim d, as the CPU walks them (cpu/rows.h; set up
 * with nt__rows_shape): for the other dims (the batch, row-major) a row of n
 * elements at stride sn.  The innermost batch dim goes on partitions. */
typedef nt__rows sk_rows;
/* Calls fn(ctx, in_off, out_off, c0, np) for groups of np <= 128 rows:
 * rows c0 .. c0+np-1 of the innermost batch dim at outer position with
 * element offsets in_off / out_off of row c0. */
int sk_rows_run(const sk_rows *R, int (*fn)(void *ctx, int64_t ioff, int64_t ooff, int np),
                void *ctx);

/* ---------------- shared tile programs ---------------- */

/* Copies a view into a contiguous HBM buffer (same dtype, bit for bit) with
 * DMAs; dst must hold numel(t) elements. */
int sk_hbm_contig(sk_k *s, const nt_tensor *t, void *dst);
/* A contiguous copy of t in scratch, or t's own data when already
 * contiguous.  NULL on error (kernel error set). */
const void *sk_contig_of(sk_k *s, const nt_tensor *t);

/* Sequential combination across partitions: for lanes i = 0 .. np-1 of
 * `vals` (an f32 [np, 1] pattern), acc = op(acc, vals[i]) in order, where
 * acc is an f32 [1, 1] pattern (add or maximum; nc_transpose + scan). */
int sk_seq_combine(sk_k *s, const nt_ap *acc, const nt_ap *vals, nt_alu_op op);

/* acc [np, 1] (f32) = op(acc, block partial) over x [np, m] (one free dim,
 * starting at a multiple of 2048 of its row) in the canonical order: the
 * CPU's nt__red_sum_f32 / nt__red_max_f32 continued across chunks. */
int sk_fold(sk_k *s, const nt_ap *acc, const nt_ap *x, nt_alu_op op);

/* ---------------- entry points ---------------- */

int nt__sk_ew(const nt__rec *r);          /* unary, scalar, binary, cmp, where, copy, fill */
int nt__sk_reduce(const nt__rec *r);      /* sum, mean, max, argmax, min, argmin, any, norm */
int nt__sk_scan(const nt__rec *r);        /* cumsum, cumprod, linrec (neuron/scan.c) */
int nt__sk_softmax(const nt__rec *r);     /* softmax, log_softmax */
int nt__sk_norm(const nt__rec *r);        /* layer_norm, rms_norm */
/* An NT_FK_NORM program (fusion/ir.h) in kernel s: the layer norm's row
 * program, each group's f32 rows rounded to the cast's dtype as a cast
 * kernel rounds them and stored beside (or instead of) the f32 output. */
int nt__sk_norm_fused(sk_k *s, const nt__fgroup *g);
int nt__sk_cross_entropy(const nt__rec *r);
int nt__sk_mse_loss(const nt__rec *r);
int nt__sk_matmul(const nt__rec *r);
int nt__sk_embedding(const nt__rec *r);
int nt__sk_embedding_bwd(const nt__rec *r);
int nt__sk_gather(const nt__rec *r);       /* gather, index_select */
int nt__sk_index_add(const nt__rec *r);
int nt__sk_scatter(const nt__rec *r);     /* scatter, scatter_add */
int nt__sk_conv_gemm(const nt__rec *r);   /* conv_gemm (neuron/conv.c) */
int nt__sk_conv_wgrad(const nt__rec *r);  /* conv_wgrad */
int nt__sk_batch_norm_fwd(const nt__rec *r); /* bn.c */
int nt__sk_batch_norm_bwd(const nt__rec *r);
/* An NT_FK_BN program (fusion/ir.h) in kernel s: the batch norm's program
 * with the relu in its passes (bn.c). */
int nt__sk_bn_fused(sk_k *s, const nt__fgroup *g);
int nt__sk_grad_norms(const nt__rec *r); /* reduce.c: clipping's norms */
int nt__sk_grouped_mm(const nt__rec *r);       /* moe.c */
int nt__sk_grouped_mm_wgrad(const nt__rec *r); /* moe.c */
int nt__sk_all_to_all_index(const nt__rec *r); /* moe.c */
int nt__sk_max_pool2d_fwd(const nt__rec *r); /* pool.c */
int nt__sk_max_pool2d_bwd(const nt__rec *r);
/* foreach.c: programs that share one kernel.  join_open / join_close are
 * the backend's kernel_open / kernel_close (core/backend.h).  Between them
 * an EW or ROW program (ew.c) calls sk_join_enter: the shared kernel (begun
 * by the first program; NULL when none is open: the program runs alone),
 * *mark where its tiles start, *issue false when only its values are
 * wanted (an untimed captured program); then sk_join_leave(s, mark, rc,
 * ref, arg): its tiles released, ref(arg) -- the CPU reference -- for its
 * values, its error. */
int nt__sk_join_open(const nt__fgroup *const *g, int n);
int nt__sk_join_close(void);
sk_k *sk_join_enter(const char *name, bool *issue, nt_tile **mark);
int sk_join_leave(sk_k *s, nt_tile *mark, int rc, int (*ref)(const void *arg), const void *arg);
/* Whether s is the open shared kernel.  sk_join_hold(flush): the program
 * being issued left instructions to come (ew.c: its last tile, to run beside
 * the next program's); its tiles and those of the programs after it stay
 * until a program calls sk_join_hold(NULL) (it issued them) or
 * sk_join_unhold, or nt__sk_join_close calls flush() to issue them before
 * the kernel ends.  The hold ends at the next program's sk_join_leave
 * whether or not that program failed: then flush() gives the held
 * program its values (ew.c held_end: its group's reference where the
 * kernel failed before its stores ran). */
bool sk_join_is(const sk_k *s);
void sk_join_hold(int (*flush)(void));
/* Issues what a program held (its flush), if any, and lets it go: before a
 * program that will not take it, whose stores could otherwise come before
 * the held program's to the same bytes (a dead output's storage reused). */
int sk_join_unhold(void);
/* A record's program: with join and a shared kernel open, one program of it
 * (sk_join_enter/leave); else a kernel of its own, skipped for the timing
 * memo of the same record (sk_memo_rec).  issue(s, r) writes the program. */
int sk_run_rec(const nt__rec *r, bool join, void (*issue)(sk_k *s, const nt__rec *r));
/* A record's program in a kernel of its own, named name (the op's when
 * NULL), skipped for the timing memo of the same record (sk_memo_rec):
 * prog(s, r, ctx) writes it and returns its code, the kernel's. */
int sk_run_prog(const nt__rec *r, const char *name,
                int (*prog)(sk_k *s, const nt__rec *r, void *ctx), void *ctx);
int nt__sk_sdpa(const nt__rec *r);         /* attention.c */
int nt__sk_sdpa_bwd(const nt__rec *r);
/* Whether a head of SDPA / SDPA_BWD with p's sizes fits SBUF (else the op
 * runs on the CPU: the backend's supports()). */
bool nt__sk_sdpa_fits(int op, const nt__params *p);
int nt__sk_arange(const nt__rec *r);
int nt__sk_rand(const nt__rec *r);
int nt__sk_randn(const nt__rec *r);
int nt__sk_dropout(const nt__rec *r);      /* sample.c */
int nt__sk_topk(const nt__rec *r);
int nt__sk_multinomial(const nt__rec *r);
int nt__sk_rope(const nt__rec *r);        /* rope.c */
/* Whether ROPE with p's sizes fits the kernel's tiles (else the CPU runs it). */
bool nt__sk_rope_fits(const nt__params *p);

/* Fusion programs on the simulator (ew.c). */
int nt__sk_fused(const nt__fgroup *g);
/* The kernel of a user tile-kernel op (user.c), or NULL. */
nt__kernel_fn nt__sk_custom_kernel(int op);

/* The simulator backend (runtime.c) and the kernel table it runs: filled
 * by its init, NULL entries fall back to the CPU. */
extern const nt__backend_i nt__sim_backend;
extern nt__kernel_fn nt__sim_kernels[NT_OP_COUNT];
/* Whether the simulator has a kernel for built-in op `op` (up or not). */
bool nt__sim_kernel_exists(int op);

/* The matmul driver shared by nt_matmul and MM programs: C = a . b with the
 * runtime's shape rules; epi (may be NULL) evacuates each accumulator block,
 * given the batch index. */
typedef int (*sk_mm_epi)(sk_k *s, const nt_ap *acc, int64_t batch, int64_t m0, int64_t n0,
                         void *ctx);
int sk_matmul_run(sk_k *s, const nt_tensor *a, const nt_tensor *b, const nt_tensor *c,
                  sk_mm_epi epi, void *ctx);
/* What rides on the product of a's rows (fusion/ir.h's side ops): colsum
 * ([K] in colsum_dtype, f32, bf16 or f16, or NULL) gets the sums of a's
 * columns over all its rows (nt_tile_matmul_args.a_colsum); x (or NULL), contiguous [rows, NX] in a's
 * dtype, makes w (contiguous [K, NX]) = a^T . x over a seen as [rows, K]
 * (nt_tile_matmul_args.x). */
typedef struct sk_mm_side {
    void *colsum;
    const nt_tensor *x;
    const nt_tensor *w;
    nt_dtype colsum_dtype;
} sk_mm_side;
/* The same, with the side ops (side may be NULL).  NT_ENOTSUP, nothing
 * issued, unless a is row-major and its rows one program (sk_matmul_side_ok);
 * where the tile program cannot take w beside the product (it does not
 * stream, or W's accumulators would not fit one PSUM bank), w's own
 * program runs first, then the product's: the same bits. */
int sk_matmul_run_cs(sk_k *s, const nt_tensor *a, const nt_tensor *b, const nt_tensor *c,
                     sk_mm_epi epi, void *ctx, const sk_mm_side *side);
/* Whether a, b (and the epilogue, epi) take the side ops: a row-major and
 * its rows one program; f32, bf16 or f16 for a column sum (cs). */
bool sk_matmul_side_ok(const nt_tensor *a, const nt_tensor *b, bool epi, bool cs);

#endif
