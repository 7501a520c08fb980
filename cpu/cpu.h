/* cpu/cpu.h - the CPU reference backend: shared helpers for its kernels.
 *
 * Kernels read their inputs through the records' tensor views (any strides,
 * broadcast via stride 0) and write their outputs (fresh and contiguous,
 * except for in-place ops, which write through any view).  All floating math
 * is f32 through core/ewise.h, core/nmath.h, core/reduce.h and core/gemm.h,
 * so the CPU and the simulator compute the same bits. */
#ifndef NT_CPU_CPU_H
#define NT_CPU_CPU_H

#include <stdatomic.h>

#include "core/backend.h"
#include "core/internal.h"

struct nt__fgroup;

/* The backend (cpu/kernels.c), its kernel table (expanded from the op
 * table) and its fused-program executor (cpu/fused.c). */
extern const nt__backend_i nt__cpu_backend;
extern const nt__kernel_fn nt__cpu_kernels[];
int nt__fused_cpu(const struct nt__fgroup *g);
/* For tests: cpu/fused.c's AVX-512 routes.  chains: an elementwise chain
 * runs in vector registers (the default).  sn_test: the per-op passes test
 * every operand for subnormals (> 0), never do (< 0: nor does a subnormal
 * operand send the thread to them), or only for a while after an untested
 * pass met one (0, the default; never where nt__sn_assists_cheap, whose
 * plain IEEE passes test nothing, cpu/subnormal.h). */
void nt__fused_cpu_set_routes(bool chains, int sn_test);
/* Chunks run as chains in registers since start, and of those computed
 * again by the per-op passes (a tiny result under flush-to-zero). */
void nt__fused_cpu_route_counts(uint64_t *chunks, uint64_t *redone);
/* For tests: AdamW's update as one AVX-512 loop (cpu/fused.c), on by
 * default; the programs it has run since start, its blocks computed again
 * without flush-to-zero (a tiny result), and its spans whose blocks were
 * stored straight to the outputs (cheap subnormal assists, no buffer). */
void nt__fused_cpu_set_optim_route(bool on);
void nt__fused_cpu_optim_counts(uint64_t *runs, uint64_t *redone, uint64_t *direct);
/* Test hook (cpu/fused.c): 0 runs row programs one row at a time, never in
 * tiles of narrow rows.  Read atomically by the workers. */
extern int nt__cpu_row_tiles;
/* Test hook (cpu/attention.c): 0 computes every causal attention block
 * whole, masked half included. */
extern int nt__cpu_attn_causal_skip;
/* Test hook (cpu/ewise.c): 0 copies every f32 view through the generic
 * driver, never by short rows. */
extern int nt__cpu_rowcopy;
/* Makes the matmul scratch's thread key (cpu/matmul.c): backend init.  0,
 * or NT_EHOSTMEM with the error set. */
int nt__cpu_matmul_init(void);

/* A strided view as kernels see it. */
typedef struct nt__kv {
    char *data;
    nt_dtype dt;
    int ndim;
    int64_t shape[NT_MAX_DIMS];
    int64_t stride[NT_MAX_DIMS];
} nt__kv;

/* t as a kernel view; with `shape` non-NULL, broadcast to (ndim, shape). */
void nt__kv_of(nt__kv *v, const nt_tensor *t, int ndim, const int64_t *shape);

/* Element helpers */
static inline int64_t nt__kv_off(const nt__kv *v, const int64_t *idx)
{
    int64_t o = 0;
    for (int i = 0; i < v->ndim; i++)
        o += idx[i] * v->stride[i];
    return o;
}

/* Block conversions and the matmul operand packing: core/dtype.h. */

/* Reads a whole (possibly strided) tensor into a contiguous f32 array. */
void nt__gather_f32(float *dst, const nt_tensor *t);

/* The values of index tensor ix in row-major order (malloc'd into *out),
 * each checked against [0, V): NT_ERANGE naming the first bad position
 * (cpu/index.c). */
int nt__index_load(const nt_tensor *ix, int64_t V, int32_t **out);

/* The elementwise family kernels (cpu/ewise.c). */
int nt__cpu_unary(const nt__rec *r);
int nt__cpu_scalar(const nt__rec *r);
int nt__cpu_binary(const nt__rec *r);
int nt__cpu_cmp(const nt__rec *r);
int nt__cpu_copy(const nt__rec *r);
int nt__cpu_fill(const nt__rec *r);
int nt__cpu_arange(const nt__rec *r);

/* Per-op kernels of the other families (one function per op, named
 * nt__cpu_<name> after the op table). */
#define NT__CPU_DECL(ID, name, nin, kind, flags, ...) int nt__cpu_##name(const nt__rec *r);
NT_OPS_MISC(NT__CPU_DECL)
int nt__cpu_rand(const nt__rec *r);
int nt__cpu_embedding_bwd(const nt__rec *r);
int nt__cpu_index_add(const nt__rec *r);
int nt__cpu_scatter(const nt__rec *r);
int nt__cpu_scatter_add(const nt__rec *r);
/* cpu/attention.c */
int nt__cpu_scaled_dot_product_attention(const nt__rec *r);
int nt__cpu_sdpa_bwd(const nt__rec *r);
int nt__cpu_randn(const nt__rec *r);
/* cpu/conv.c */
int nt__cpu_conv_gemm(const nt__rec *r);
int nt__cpu_conv_wgrad(const nt__rec *r);
/* cpu/bn.c: training batch norm, forward and backward */
int nt__cpu_batch_norm_fwd(const nt__rec *r);
int nt__cpu_batch_norm_bwd(const nt__rec *r);
/* The fused batch norm and relu (NT_FK_BN, fusion/ir.h; cpu/bn.c): r's
 * forward with relu(y) also written into relu (contiguous f32 of x's
 * shape; r->out[0] NULL: y itself not stored); r's backward with its
 * gradient r->in[0] first taken through relu_bwd against relu's output y
 * (contiguous f32 of x's shape) -- in the kernels' passes, the bits of the
 * records one by one. */
int nt__cpu_bn_relu_fwd(const nt__rec *r, nt_tensor *relu);
int nt__cpu_bn_relu_bwd(const nt__rec *r, const nt_tensor *y);
int nt__cpu_max_pool2d_fwd(const nt__rec *r); /* pool.c */
int nt__cpu_max_pool2d_bwd(const nt__rec *r);
/* Nonzero: the CPU kernels take their reference paths where a faster one
 * gives the same bits (batch norm's phases over all channels; the
 * convolutions' general paths), so tests/test_cnnperf.c can compare the
 * two.  Tests set it between ops; kernels read it (relaxed). */
extern atomic_int nt__cpu_ref_paths;
/* cpu/reduce.c: gradient clipping's per-parameter 2-norms */
int nt__cpu_grad_norms(const nt__rec *r);
int nt__cpu_grouped_mm(const nt__rec *r);       /* moe.c */
int nt__cpu_grouped_mm_wgrad(const nt__rec *r); /* moe.c */
int nt__cpu_all_to_all_index(const nt__rec *r); /* moe.c */
#undef NT__CPU_DECL

#endif
