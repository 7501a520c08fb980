/* cpu/kernels.c - the CPU backend's kernel table, expanded from the op table:
 * each elementwise family shares one generic kernel; every other op has its
 * own nt__cpu_<name>.  Views never run a kernel. */
#include "cpu/cpu.h"

#define NT__K_FAMILY(fn) [NT_OP_##ID] = fn
#define NT__K_UNARY(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = nt__cpu_unary,
#define NT__K_SCALAR(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = nt__cpu_scalar,
#define NT__K_BINARY(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = nt__cpu_binary,
#define NT__K_CMP(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = nt__cpu_cmp,
#define NT__K_COPY(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = nt__cpu_copy,
#define NT__K_MISC(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = nt__cpu_##name,
#define NT__K_NONE(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = NULL,

/* Unsized (cpu/cpu.h too): the assert below then sees a missing last row;
 * tests/test_conformance.c checks that every op with a kernel has one. */
const nt__kernel_fn nt__cpu_kernels[] = {
    [NT_OP_FILL] = nt__cpu_fill,
    [NT_OP_ARANGE] = nt__cpu_arange,
    [NT_OP_RAND] = nt__cpu_rand,
    [NT_OP_RANDN] = nt__cpu_randn,
    NT_OPS_COPY(NT__K_COPY)
    NT_OPS_UNARY(NT__K_UNARY)
    NT_OPS_SCALAR(NT__K_SCALAR)
    NT_OPS_BINARY(NT__K_BINARY)
    NT_OPS_EW_BWD(NT__K_BINARY)
    NT_OPS_GRAD(NT__K_BINARY)
    NT_OPS_CMP(NT__K_CMP)
    NT_OPS_MISC(NT__K_MISC)
    NT_OPS_VIEW(NT__K_NONE)
    [NT_OP_EMBEDDING_BWD] = nt__cpu_embedding_bwd,
    [NT_OP_INDEX_ADD] = nt__cpu_index_add,
    [NT_OP_SDPA_BWD] = nt__cpu_sdpa_bwd,
    [NT_OP_CONV_GEMM] = nt__cpu_conv_gemm,
    [NT_OP_CONV_WGRAD] = nt__cpu_conv_wgrad,
    [NT_OP_BN_FWD] = nt__cpu_batch_norm_fwd,
    [NT_OP_BN_BWD] = nt__cpu_batch_norm_bwd,
    [NT_OP_GRAD_NORMS] = nt__cpu_grad_norms,
    [NT_OP_GMM] = nt__cpu_grouped_mm,
    [NT_OP_GMM_WGRAD] = nt__cpu_grouped_mm_wgrad,
    [NT_OP_A2A_INDEX] = nt__cpu_all_to_all_index,
    [NT_OP_MAX_POOL2D] = nt__cpu_max_pool2d_fwd,
    [NT_OP_MAX_POOL2D_BWD] = nt__cpu_max_pool2d_bwd,
};

_Static_assert(sizeof nt__cpu_kernels / sizeof nt__cpu_kernels[0] == NT_OP_COUNT,
               "CPU kernel table out of step with the op table");

static int cpu_init(void) { return nt__cpu_matmul_init(); }

/* The reference backend (core/backend.h): every op with a kernel, every
 * fused program; no counters of its own. */
const nt__backend_i nt__cpu_backend = {
    .name = "cpu",
    .init = cpu_init,
    .kernels = nt__cpu_kernels,
    .run_fused = nt__fused_cpu,
};
