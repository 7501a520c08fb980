/* sim/isa.c - the instructions: rule checks, cost, functional step.
 *
 * Every instruction (1) checks its operands against the hardware's rules,
 * (2) hands its cost and operands to the scheduler (core.c), which places it
 * on its engine's timeline after what it depends on, and (3) unless the
 * kernel is timing-only, computes its exact result.  Floating math is done
 * in f32 through core/ewise.h, core/nmath.h, core/reduce.h and core/gemm.h --
 * the definitions the CPU backend uses -- and every computed value reaches
 * memory through st() / round_store(), the one rounding point (NaN becomes
 * the canonical NaN there, as in core/dtype.h).
 *
 * Functional execution is row-major (docs/sim.md, "Functional speed"): an
 * instruction whose lane i touches only partition p0 + i of its on-chip
 * operands and row i of its HBM operands is "row-local" (DMA, the VectorE /
 * ScalarE / GpSimd elementwise family, reductions, scans).  Such
 * instructions are queued as records (fx_rec) and run lane by lane when the
 * kernel flushes: for each partition, every queued instruction in program
 * order.  Per partition that is exactly program order, and partitions are
 * independent (admission checks that the queued instructions share one
 * partition base and that no HBM write overlaps another row's access), so
 * the results are those of running each instruction at once; but a row of
 * a tile stays in L1 across a whole chain of instructions.  Big flushes
 * split their lanes over two host threads; the split never changes a bit.
 * TensorE, gathers and custom GpSimd code flush first and run at once. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/ewise.h"
#include "core/gemm.h"
#include "core/reduce.h"
#include "sim/sim.h"

/* The functional loops below are the simulator's hot path: on a host with
 * AVX-512 let GCC use the full width (GCC's tuning otherwise stops at 256
 * bits).  Lane width never changes a result: every op is one IEEE
 * operation per element, and -ffp-contract=off keeps FMA out. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#pragma GCC target("prefer-vector-width=512")
#endif

/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

static const char *alu_names[NT_ALU_COUNT] = {
#define NT__ALU_NAME(id, name) #name,
    NT_ALU_OP_MAP(NT__ALU_NAME)
#undef NT__ALU_NAME
};

static const char *act_names[NT_ACT_COUNT] = {
#define NT__ACT_NAME(id, name) #name,
    NT_ACT_FUNC_MAP(NT__ACT_NAME)
#undef NT__ACT_NAME
};

const char *nt_alu_op_name(nt_alu_op op)
{
    return (unsigned)op < NT_ALU_COUNT ? alu_names[op] : "?";
}

const char *nt_act_func_name(nt_act_func f)
{
    return (unsigned)f < NT_ACT_COUNT ? act_names[f] : "?";
}

/* What each code models in the NKI ISA (docs/sim.md, "Instructions and the
 * NKI ISA", cites the tables): the ALU operators of "Supported Math
 * Operators for NKI ISA" (divide: the hardware ALU's divide, an op
 * specifier of nki.language), the functions of "Supported Activation
 * Functions for NKI ISA".  A code without a name is not executed. */
static const char *const alu_nki[NT_ALU_COUNT] = {
    [NT_ALU_BYPASS] = "nki.language.bypass",
    [NT_ALU_ADD] = "nki.language.add",
    [NT_ALU_SUB] = "nki.language.subtract",
    [NT_ALU_MUL] = "nki.language.multiply",
    [NT_ALU_DIV] = "nki.language.divide",
    [NT_ALU_MAX] = "nki.language.maximum",
    [NT_ALU_MIN] = "nki.language.minimum",
    [NT_ALU_POW] = "nki.language.power",
    [NT_ALU_EQ] = "nki.language.equal",
    [NT_ALU_NE] = "nki.language.not_equal",
    [NT_ALU_LT] = "nki.language.less",
    [NT_ALU_LE] = "nki.language.less_equal",
    [NT_ALU_GT] = "nki.language.greater",
    [NT_ALU_GE] = "nki.language.greater_equal",
};

static const char *const act_nki[NT_ACT_COUNT] = {
    [NT_ACT_IDENTITY] = "nki.language.copy",
    [NT_ACT_EXP] = "nki.language.exp",
    [NT_ACT_LOG] = "nki.language.log",
    [NT_ACT_SQRT] = "nki.language.sqrt",
    [NT_ACT_RSQRT] = "nki.language.rsqrt",
    [NT_ACT_TANH] = "nki.language.tanh",
    [NT_ACT_SIGMOID] = "nki.language.sigmoid",
    [NT_ACT_GELU] = "nki.language.gelu",
    [NT_ACT_SILU] = "nki.language.silu",
    [NT_ACT_RELU] = "nki.language.relu",
    [NT_ACT_ABS] = "nki.language.abs",
    [NT_ACT_NEG] = NULL, /* no activation function computes -x */
    [NT_ACT_SQUARE] = "nki.language.square",
    [NT_ACT_GELU_DX] = "nki.language.gelu_dx",
    [NT_ACT_SILU_DX] = "nki.language.silu_dx",
    [NT_ACT_SOFTPLUS] = "nki.language.softplus",
    [NT_ACT_MISH] = "nki.language.mish",
    [NT_ACT_RECIPROCAL] = "nki.language.reciprocal",
    [NT_ACT_GELU_APPRX_TANH] = "nki.language.gelu_apprx_tanh",
    [NT_ACT_ERF] = "nki.language.erf",
    [NT_ACT_ERF_DX] = "nki.language.erf_dx",
    [NT_ACT_SIGN] = "nki.language.sign",
};

const char *nt_alu_op_nki(nt_alu_op op)
{
    return (unsigned)op < NT_ALU_COUNT ? alu_nki[op] : NULL;
}

const char *nt_act_func_nki(nt_act_func f)
{
    return (unsigned)f < NT_ACT_COUNT ? act_nki[f] : NULL;
}

/* The instruction kinds: every nt_isa_* names its instructions from here,
 * and issue() refuses a name that is not one of these pointers, so an
 * instruction the table does not list cannot run. */
enum {
    K_DMA_COPY, K_DMA_GATHER, K_NC_MATMUL, K_NC_TRANSPOSE, K_TENSOR_TENSOR, K_TENSOR_SCALAR,
    K_STT, K_ACTIVATION, K_TENSOR_REDUCE, K_TENSOR_COPY, K_TENSOR_COPY_SR, K_MEMSET, K_IOTA,
    K_AFFINE_SELECT, K_SELECT, K_SCAN, K_GPSIMD_CUSTOM, K_COUNT
};

static const struct {
    const char *name, *nki;
} isa_kinds[K_COUNT] = {
    [K_DMA_COPY] = {"dma_copy", "nki.isa.dma_copy"},
    /* an indirect (DGE) load: nki.isa.dma_copy from an indirectly indexed
     * source (nl.load with a dynamic index) */
    [K_DMA_GATHER] = {"dma_gather", "nki.isa.dma_copy (indirect source)"},
    [K_NC_MATMUL] = {"nc_matmul", "nki.isa.nc_matmul"},
    [K_NC_TRANSPOSE] = {"nc_transpose", "nki.isa.nc_transpose"},
    [K_TENSOR_TENSOR] = {"tensor_tensor", "nki.isa.tensor_tensor"},
    [K_TENSOR_SCALAR] = {"tensor_scalar", "nki.isa.tensor_scalar"},
    [K_STT] = {"scalar_tensor_tensor", "nki.isa.scalar_tensor_tensor"},
    [K_ACTIVATION] = {"activation", "nki.isa.activation"},
    [K_TENSOR_REDUCE] = {"tensor_reduce", "nki.isa.tensor_reduce"},
    [K_TENSOR_COPY] = {"tensor_copy", "nki.isa.tensor_copy"},
    /* the engines' stochastic rounding of an f32 -> bf16/f16 write (the
     * runtime's NEURON_RT_STOCHASTIC_ROUNDING_EN), seeded here */
    [K_TENSOR_COPY_SR] = {"tensor_copy_sr", "nki.isa.tensor_copy (stochastic rounding)"},
    [K_MEMSET] = {"memset", "nki.isa.memset"},
    [K_IOTA] = {"iota", "nki.isa.iota"},
    [K_AFFINE_SELECT] = {"affine_select", "nki.isa.affine_select"},
    /* nl.where: select_reduce without its reduction (a per-partition
     * on_false), or tensor_copy_predicated over a copy of on_false */
    [K_SELECT] = {"select", "nki.isa.select_reduce / nki.isa.tensor_copy_predicated"},
    [K_SCAN] = {"tensor_tensor_scan", "nki.isa.tensor_tensor_scan"},
    /* a Neuron custom C++ operator on GpSimd's cores */
    [K_GPSIMD_CUSTOM] = {"gpsimd_custom", "GpSimd custom operator (Neuron custom C++ ops)"},
};

/* nt__sim_issue for an instruction of the table (by its name's pointer) */
static int issue(nt_sim_kernel *k, nt__sim_instr *in)
{
    int i = 0;
    while (i < K_COUNT && isa_kinds[i].name != in->name)
        i++;
    if (i == K_COUNT || !isa_kinds[i].nki)
        return nt__sim_fail(k, in->name ? in->name : "?",
                            "not an instruction of the NKI ISA (rule: the simulator runs only "
                            "the instructions of nt_sim_isa_kind)");
    nt__sim_issue(k, in);
    return 0;
}

int nt_sim_isa_kind(int i, const char **name, const char **nki)
{
    if (i >= 0 && i < K_COUNT) {
        if (name)
            *name = isa_kinds[i].name;
        if (nki)
            *nki = isa_kinds[i].nki;
    }
    return K_COUNT;
}

static const char *dtn(nt_dtype dt)
{
    return nt_dtype_name(dt);
}

static bool is_int(nt_dtype dt)
{
    return dt == NT_I32 || dt == NT_U8;
}

/* ------------------------------------------------------------------------ */
/* Operand checks                                                           */
/* ------------------------------------------------------------------------ */

enum { M_HBM = 1, M_SBUF = 2, M_PSUM = 4 };

static nt_mem mem_of(const nt_ap *ap)
{
    return ap->tile ? ap->tile->mem : NT_MEM_HBM;
}

/* Checks one access pattern; `eng` < 0 for DMA (no partition-start rule). */
static int check_ap(nt_sim_kernel *k, const char *I, const char *role, const nt_ap *ap,
                    unsigned mems, int eng)
{
    if (!ap)
        return nt__sim_fail(k, I, "operand '%s' is missing", role);
    if ((unsigned)ap->dtype >= NT_DTYPE_COUNT)
        return nt__sim_fail(k, I, "operand '%s': bad dtype %d", role, (int)ap->dtype);
    if (!nt__dtype_on_device((nt_dtype)ap->dtype))
        return nt__sim_fail(k, I, "operand '%s' is %s (rule: f32, bf16, f16, i32 or u8: the "
                            "engines have no %s datapath)", role, dtn(ap->dtype), dtn(ap->dtype));
    if (ap->ndim < 1 || ap->ndim > NT_AP_MAX_DIMS)
        return nt__sim_fail(k, I,
                            "operand '%s': %d free dims (rule: access patterns have 1 to 4 "
                            "free dims)",
                            role, ap->ndim);
    for (int i = 0; i < ap->ndim; i++)
        if (ap->num[i] < 1)
            return nt__sim_fail(k, I, "operand '%s': free dim %d has size %lld (rule: >= 1)",
                                role, i, (long long)ap->num[i]);
    if (ap->np < 1)
        return nt__sim_fail(k, I, "operand '%s': %d partitions (rule: >= 1)", role, ap->np);
    /* Bounds first, so that the free count, the extent and the byte
     * offsets computed below and when the instruction runs cannot wrap. */
    const int64_t B = NT__SIM_MAX_ELEMS;
    int64_t F = 1, span;
    for (int i = 0; i < ap->ndim; i++)
        if (__builtin_mul_overflow(F, ap->num[i], &F) || F > B ||
            __builtin_mul_overflow(ap->num[i] - 1, ap->step[i], &span) || span > B || span < -B)
            return nt__sim_fail(k, I,
                                "operand '%s': free dim %d has size %lld and step %lld (rule: "
                                "the free count and each dim's span within 2^48 elements)",
                                role, i, (long long)ap->num[i], (long long)ap->step[i]);
    if (ap->offset > B || ap->offset < -B ||
        (!ap->tile && (__builtin_mul_overflow((int64_t)ap->np - 1, ap->pstep, &span) ||
                       span > B || span < -B)))
        return nt__sim_fail(k, I,
                            "operand '%s': offset %lld, %d rows %lld apart (rule: offset and "
                            "row span within 2^48 elements)",
                            role, (long long)ap->offset, ap->np, (long long)ap->pstep);
    nt_mem m = mem_of(ap);
    unsigned bit = m == NT_MEM_HBM ? M_HBM : m == NT_MEM_SBUF ? M_SBUF : M_PSUM;
    if (!(mems & bit)) {
        char allowed[32] = "";
        if (mems & M_HBM)
            strcat(allowed, "HBM ");
        if (mems & M_SBUF)
            strcat(allowed, "SBUF ");
        if (mems & M_PSUM)
            strcat(allowed, "PSUM ");
        allowed[strlen(allowed) ? strlen(allowed) - 1 : 0] = '\0';
        return nt__sim_fail(k, I, "operand '%s' is in %s (rule: %s may be in: %s)", role,
                            nt_mem_name(m), role, allowed);
    }
    if (m == NT_MEM_HBM) {
        if (!ap->hbm)
            return nt__sim_fail(k, I, "operand '%s': NULL HBM pointer", role);
        return 0;
    }
    const nt_tile *t = ap->tile;
    if (t->k != k || !t->live)
        return nt__sim_fail(k, I,
                            "operand '%s': tile '%s' is released or belongs to another kernel "
                            "(rule: use live tiles of this kernel)",
                            role, t->name);
    if (ap->dtype != t->dt)
        return nt__sim_fail(k, I,
                            "operand '%s': pattern dtype %s differs from tile '%s' dtype %s "
                            "(rule: a pattern has its tile's dtype)",
                            role, dtn(ap->dtype), t->name, dtn(t->dt));
    if (ap->p0 < 0 || (int64_t)ap->p0 + ap->np > t->parts)
        return nt__sim_fail(k, I,
                            "operand '%s': partitions [%d, %d) outside tile '%s' of %d partitions "
                            "(rule: partition range inside the tile)",
                            role, ap->p0, ap->p0 + ap->np, t->name, t->parts);
    int64_t lo, hi;
    nt__sim_extent(ap, &lo, &hi);
    if (ap->offset + lo < 0 || ap->offset + hi >= t->nfree)
        return nt__sim_fail(k, I,
                            "operand '%s': elements [%lld, %lld] outside tile '%s' of %lld per "
                            "partition (rule: access inside the tile)",
                            role, (long long)(ap->offset + lo), (long long)(ap->offset + hi),
                            t->name, (long long)t->nfree);
    if (eng >= 0) {
        int p0 = ap->p0, np = ap->np;
        int lim = p0 == 0 ? 128 : p0 == 64 ? 64 : 32;
        if (p0 % 32 != 0 || np > lim)
            return nt__sim_fail(k, I,
                                "operand '%s': partitions [%d, %d) (rule: a compute-engine "
                                "access starts at partition 0, 32, 64 or 96 and spans at most "
                                "128, 32, 64 or 32 partitions from there)",
                                role, p0, p0 + np);
    }
    if (m == NT_MEM_SBUF && F > NT_SIM_SBUF_MAX_FREE)
        return nt__sim_fail(k, I,
                            "operand '%s': %lld free elements (rule: SBUF access free size "
                            "<= 65536 elements)",
                            role, (long long)F);
    if (m == NT_MEM_PSUM) {
        int64_t esz = (int64_t)nt__dtype_size(ap->dtype);
        int64_t b0 = t->off + (ap->offset + lo) * esz, b1 = t->off + (ap->offset + hi + 1) * esz - 1;
        if (b0 / NT_SIM_PSUM_BANK_BYTES != b1 / NT_SIM_PSUM_BANK_BYTES)
            return nt__sim_fail(k, I,
                                "operand '%s': bytes [%lld, %lld] of a partition cross a PSUM "
                                "bank (rule: a PSUM access stays in one 2 KiB bank)",
                                role, (long long)b0, (long long)b1);
    }
    if (eng == NT_ENGINE_GPSIMD && m == NT_MEM_PSUM)
        return nt__sim_fail(k, I, "operand '%s' is in PSUM (rule: GpSimd cannot access PSUM)",
                            role);
    return 0;
}

/* Operands of an elementwise instruction: same partitions and free size. */
static int check_same(nt_sim_kernel *k, const char *I, const char *ra, const nt_ap *a,
                      const char *rb, const nt_ap *b)
{
    if (a->np != b->np)
        return nt__sim_fail(k, I,
                            "'%s' has %d partitions, '%s' %d (rule: operands cover the same "
                            "number of partitions)",
                            ra, a->np, rb, b->np);
    int64_t fa = nt__sim_free_count(a), fb = nt__sim_free_count(b);
    if (fa != fb)
        return nt__sim_fail(k, I,
                            "'%s' has %lld free elements, '%s' %lld (rule: operands have the "
                            "same free size)",
                            ra, (long long)fa, rb, (long long)fb);
    return 0;
}

/* A [np, 1] scalar operand. */
/* An on-chip elementwise instruction's dst and src: both SBUF or PSUM
 * patterns the engine can reach, of the same shape. */
static int check_dst_src(nt_sim_kernel *k, const char *I, const nt_ap *dst, const nt_ap *src,
                         int e)
{
    int rc = check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e);
    if (!rc)
        rc = check_ap(k, I, "src", src, M_SBUF | M_PSUM, e);
    return rc ? rc : check_same(k, I, "dst", dst, "src", src);
}

static int check_scalar(nt_sim_kernel *k, const char *I, const char *role,
                        const nt_isa_scalar *s, const nt_ap *data, int eng)
{
    if (!s || !s->ap)
        return 0;
    int rc = check_ap(k, I, role, s->ap, M_SBUF | M_PSUM, eng);
    if (rc)
        return rc;
    if (s->ap->np != data->np || nt__sim_free_count(s->ap) != 1)
        return nt__sim_fail(k, I,
                            "operand '%s' is [%d, %lld] (rule: a scalar operand is an immediate "
                            "or [%d, 1])",
                            role, s->ap->np, (long long)nt__sim_free_count(s->ap), data->np);
    return 0;
}

static int pick_engine(nt_sim_kernel *k, const char *I, nt_engine e, nt_engine dflt,
                       unsigned allowed)
{
    if (e == NT_ENGINE_DEFAULT)
        e = dflt;
    if ((unsigned)e >= NT_ENGINE_DMA || !(allowed & (1u << e))) {
        char list[64] = "";
        for (int i = 0; i < NT_ENGINE_DMA; i++)
            if (allowed & (1u << i)) {
                strcat(list, nt_engine_name((nt_engine)i));
                strcat(list, " ");
            }
        list[strlen(list) - 1] = '\0';
        nt__sim_fail(k, I, "engine %s (rule: %s runs on: %s)", nt_engine_name(e), I, list);
        return -1;
    }
    return e;
}

#define ENG(x) (1u << NT_ENGINE_##x)

/* Common prologue: NULL kernel, earlier error. */
#define PROLOGUE(k)                \
    do {                           \
        if (!(k))                  \
            return NT__SIM_NULL(__func__, "k"); \
        if ((k)->err)              \
            return (k)->err;       \
    } while (0)

#define TRY(x)              \
    do {                    \
        int rc_ = (x);      \
        if (rc_)            \
            return rc_;     \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Operands as the functional step sees them                                */
/* ------------------------------------------------------------------------ */

/* ap's free dims, canonical and padded to 4 (outer dims first). */
static void shape4(const nt_ap *ap, int64_t num[4], int64_t step[4])
{
    nt__sim_shape s;
    nt__sim_canon(ap, &s);
    int pad = 4 - s.nd;
    for (int i = 0; i < 4; i++) {
        num[i] = i < pad ? 1 : s.num[i - pad];
        step[i] = i < pad ? 0 : s.step[i - pad];
    }
}

/* A copy of an access pattern with its walk precomputed. */
typedef struct fx_opnd {
    nt_ap ap;
    int64_t num[4], step[4];
    int64_t n;      /* free elements per partition */
    int64_t esz;
    bool contig;    /* one contiguous run of n elements */
    bool bcast;     /* one element repeated n times (a step-0 pattern) */
    uint8_t *base;  /* lane 0's first element */
    int64_t pstride; /* bytes between lanes */
} fx_opnd;

static void opnd_init(fx_opnd *o, const nt_ap *ap)
{
    o->ap = *ap;
    shape4(ap, o->num, o->step);
    o->n = nt__sim_free_count(ap);
    o->esz = (int64_t)nt__dtype_size(ap->dtype);
    o->contig = o->num[0] == 1 && o->num[1] == 1 && o->num[2] == 1 &&
                (o->step[3] == 1 || o->num[3] == 1);
    o->bcast = o->num[0] == 1 && o->num[1] == 1 && o->num[2] == 1 && o->step[3] == 0;
    o->base = nt__sim_row(ap, 0);
    o->pstride = nt__sim_pstride(ap);
}

static inline uint8_t *lane_row(const fx_opnd *o, int i)
{
    return o->base + (int64_t)i * o->pstride;
}

/* Lane i of o as f32 in row-major order of its free dims: a pointer into
 * memory when it already is contiguous f32, else converted into buf. */
static const float *ld_f32(const fx_opnd *o, int i, float *buf)
{
    const uint8_t *row = lane_row(o, i);
    if (o->ap.dtype == NT_F32 && o->contig)
        return (const float *)row;
    float *w = buf;
    for (int64_t a = 0; a < o->num[0]; a++)
        for (int64_t b = 0; b < o->num[1]; b++)
            for (int64_t c = 0; c < o->num[2]; c++) {
                int64_t off = a * o->step[0] + b * o->step[1] + c * o->step[2];
                nt__ld_f32(w, (const char *)row + off * o->esz, o->ap.dtype, o->step[3], o->num[3]);
                w += o->num[3];
            }
    return buf;
}

/* Lane i of o as int32 (exact for i32/u8; floats truncate and saturate). */
static void ld_i32(const fx_opnd *o, int i, int32_t *w)
{
    const uint8_t *row = lane_row(o, i);
    for (int64_t a = 0; a < o->num[0]; a++)
        for (int64_t b = 0; b < o->num[1]; b++)
            for (int64_t c = 0; c < o->num[2]; c++) {
                int64_t off = a * o->step[0] + b * o->step[1] + c * o->step[2];
                nt__ld_i32(w, (const char *)row + off * o->esz, o->ap.dtype, o->step[3],
                           o->num[3]);
                w += o->num[3];
            }
}

/* THE rounding point of the simulator: writes lane i of o from the f32
 * values v (or the exact integers iv when v is NULL), rounding each once to
 * o's dtype (nearest even, NaN canonical; float->int truncates and
 * saturates, int->u8 wraps).  Every instruction that computes a value
 * stores it here, so stochastic rounding has one place to go. */
static void st(const fx_opnd *o, int i, const float *v, const int32_t *iv)
{
    uint8_t *row = lane_row(o, i);
    int64_t k = 0;
    for (int64_t a = 0; a < o->num[0]; a++)
        for (int64_t b = 0; b < o->num[1]; b++)
            for (int64_t c = 0; c < o->num[2]; c++) {
                int64_t off = a * o->step[0] + b * o->step[1] + c * o->step[2];
                char *p = (char *)row + off * o->esz;
                if (v)
                    nt__st_f32(p, o->ap.dtype, o->step[3], v + k, o->num[3]);
                else
                    nt__st_i32(p, o->ap.dtype, o->step[3], iv + k, o->num[3]);
                k += o->num[3];
            }
}

/* Output pointer for a direct f32 write of lane i, or NULL: the lane is
 * contiguous f32 and overlaps none of the inputs except exactly (an
 * elementwise loop may then read and write the same element). */
static float *direct_f32(const fx_opnd *o, int i, const float *x, const float *y)
{
    if (o->ap.dtype != NT_F32 || !o->contig)
        return NULL;
    float *d = (float *)lane_row(o, i);
    int64_t n = o->n;
    const float *in[2] = {x, y};
    for (int k = 0; k < 2; k++) {
        const float *p = in[k];
        if (p && p != d && p < d + n && d < p + n)
            return NULL;
    }
    return d;
}

/* ------------------------------------------------------------------------ */
/* ALU                                                                      */
/* ------------------------------------------------------------------------ */

static inline float alu1(nt_alu_op op, float a, float b)
{
    switch (op) {
    case NT_ALU_BYPASS: return a;
    case NT_ALU_ADD: return nt__ew_add(a, b);
    case NT_ALU_SUB: return nt__ew_sub(a, b);
    case NT_ALU_MUL: return nt__ew_mul(a, b);
    case NT_ALU_DIV: return nt__ew_div(a, b);
    case NT_ALU_MAX: return nt__ew_maximum(a, b);
    case NT_ALU_MIN: return nt__ew_minimum(a, b);
    case NT_ALU_POW: return nt__ew_pow_scalar(a, b, 0.0f);
    case NT_ALU_EQ: return (float)nt__ew_eq(a, b);
    case NT_ALU_NE: return (float)nt__ew_ne(a, b);
    case NT_ALU_LT: return (float)nt__ew_lt(a, b);
    case NT_ALU_LE: return (float)nt__ew_le(a, b);
    case NT_ALU_GT: return (float)nt__ew_gt(a, b);
    case NT_ALU_GE: return (float)nt__ew_ge(a, b);
    default: return a;
    }
}

/* The switch sits outside the loops so each loop vectorises.  W wraps the
 * result: nothing, or nt__canon for a direct f32 store. */
#define ALU_LOOPS(W, OUT, A, B, N)                                                           \
    switch (op) {                                                                            \
    case NT_ALU_BYPASS: for (int64_t i = 0; i < (N); i++) OUT = W(A); break;                 \
    case NT_ALU_ADD: for (int64_t i = 0; i < (N); i++) OUT = W(nt__ew_add(A, B)); break;     \
    case NT_ALU_SUB: for (int64_t i = 0; i < (N); i++) OUT = W(nt__ew_sub(A, B)); break;     \
    case NT_ALU_MUL: for (int64_t i = 0; i < (N); i++) OUT = W(nt__ew_mul(A, B)); break;     \
    case NT_ALU_DIV: for (int64_t i = 0; i < (N); i++) OUT = W(nt__ew_div(A, B)); break;     \
    case NT_ALU_MAX: for (int64_t i = 0; i < (N); i++) OUT = W(nt__ew_maximum(A, B)); break; \
    case NT_ALU_MIN: for (int64_t i = 0; i < (N); i++) OUT = W(nt__ew_minimum(A, B)); break; \
    case NT_ALU_EQ: for (int64_t i = 0; i < (N); i++) OUT = (float)nt__ew_eq(A, B); break;   \
    case NT_ALU_NE: for (int64_t i = 0; i < (N); i++) OUT = (float)nt__ew_ne(A, B); break;   \
    case NT_ALU_LT: for (int64_t i = 0; i < (N); i++) OUT = (float)nt__ew_lt(A, B); break;   \
    case NT_ALU_LE: for (int64_t i = 0; i < (N); i++) OUT = (float)nt__ew_le(A, B); break;   \
    case NT_ALU_GT: for (int64_t i = 0; i < (N); i++) OUT = (float)nt__ew_gt(A, B); break;   \
    case NT_ALU_GE: for (int64_t i = 0; i < (N); i++) OUT = (float)nt__ew_ge(A, B); break;   \
    default: for (int64_t i = 0; i < (N); i++) OUT = W(alu1(op, A, B)); break;               \
    }
#define ID_(x) (x)

static void alu_vv(nt_alu_op op, float *o, const float *a, const float *b, int64_t n)
{
    ALU_LOOPS(ID_, o[i], a[i], b[i], n)
}

static void alu_vv_c(nt_alu_op op, float *o, const float *a, const float *b, int64_t n)
{
    ALU_LOOPS(nt__canon, o[i], a[i], b[i], n)
}

static void alu_vs(nt_alu_op op, float *o, const float *a, float s, bool rev, int64_t n)
{
    if (rev) {
        ALU_LOOPS(ID_, o[i], s, a[i], n)
    } else {
        ALU_LOOPS(ID_, o[i], a[i], s, n)
    }
}

static void alu_vs_c(nt_alu_op op, float *o, const float *a, float s, bool rev, int64_t n)
{
    if (rev) {
        ALU_LOOPS(nt__canon, o[i], s, a[i], n)
    } else {
        ALU_LOOPS(nt__canon, o[i], a[i], s, n)
    }
}

/* Both ALU steps of a two-op tensor_scalar in one pass with the canonical
 * store, for the common forward-operand pairs of add/sub/mul (x*a+b, the
 * scalar affine maps of the fusion engine); false: not one of them.  The
 * intermediate is the f32 the two-pass form would keep in scratch, so the
 * bits are the same. */
#define TS2_(O0, F0, O1, F1)                                                     \
    case NT_ALU_##O0 * NT_ALU_COUNT + NT_ALU_##O1:                               \
        for (int64_t i = 0; i < n; i++)                                          \
            o[i] = nt__canon(nt__ew_##F1(nt__ew_##F0(a[i], s0), s1));            \
        return true;
#define TS2_ROW_(O0, F0)                                                         \
    TS2_(O0, F0, ADD, add) TS2_(O0, F0, SUB, sub) TS2_(O0, F0, MUL, mul)

static bool alu_vs2_c(nt_alu_op op0, nt_alu_op op1, float *o, const float *a, float s0,
                      float s1, int64_t n)
{
    switch (op0 * NT_ALU_COUNT + op1) {
        TS2_ROW_(ADD, add)
        TS2_ROW_(SUB, sub)
        TS2_ROW_(MUL, mul)
    default: return false;
    }
}
#undef TS2_ROW_
#undef TS2_

static bool alu_int_ok(nt_alu_op op)
{
    return op != NT_ALU_DIV && op != NT_ALU_POW && (unsigned)op < NT_ALU_COUNT;
}

static inline int32_t alui1(nt_alu_op op, int32_t a, int32_t b)
{
    switch (op) {
    case NT_ALU_BYPASS: return a;
    case NT_ALU_ADD: return nt__ewi_add(a, b);
    case NT_ALU_SUB: return nt__ewi_sub(a, b);
    case NT_ALU_MUL: return nt__ewi_mul(a, b);
    case NT_ALU_MAX: return nt__ewi_maximum(a, b);
    case NT_ALU_MIN: return nt__ewi_minimum(a, b);
    case NT_ALU_EQ: return nt__ewi_eq(a, b);
    case NT_ALU_NE: return nt__ewi_ne(a, b);
    case NT_ALU_LT: return nt__ewi_lt(a, b);
    case NT_ALU_LE: return nt__ewi_le(a, b);
    case NT_ALU_GT: return nt__ewi_gt(a, b);
    case NT_ALU_GE: return nt__ewi_ge(a, b);
    default: return a;
    }
}

#define ALUI_LOOPS(OUT, A, B, N)                                                             \
    switch (op) {                                                                            \
    case NT_ALU_ADD: for (int64_t i = 0; i < (N); i++) OUT = nt__ewi_add(A, B); break;       \
    case NT_ALU_SUB: for (int64_t i = 0; i < (N); i++) OUT = nt__ewi_sub(A, B); break;       \
    case NT_ALU_MUL: for (int64_t i = 0; i < (N); i++) OUT = nt__ewi_mul(A, B); break;       \
    case NT_ALU_MAX: for (int64_t i = 0; i < (N); i++) OUT = nt__ewi_maximum(A, B); break;   \
    case NT_ALU_MIN: for (int64_t i = 0; i < (N); i++) OUT = nt__ewi_minimum(A, B); break;   \
    default: for (int64_t i = 0; i < (N); i++) OUT = alui1(op, A, B); break;                 \
    }

static void alui_vv(nt_alu_op op, int32_t *o, const int32_t *a, const int32_t *b, int64_t n)
{
    ALUI_LOOPS(o[i], a[i], b[i], n)
}

static void alui_vs(nt_alu_op op, int32_t *o, const int32_t *a, int32_t s, bool rev, int64_t n)
{
    if (rev) {
        ALUI_LOOPS(o[i], s, a[i], n)
    } else {
        ALUI_LOOPS(o[i], a[i], s, n)
    }
}

/* canonical-order reduction of one run (core/reduce.h): exactly
 * nt__red_sum_f32 / nt__red_max_f32, so even a run of <= 2048 elements is
 * acc = +0 (-Inf); acc = op(acc, block partial) */
static float reduce_run(nt_alu_op op, const float *x, int64_t n)
{
    return op == NT_ALU_MAX   ? nt__red_max_f32(x, n, 1)
           : op == NT_ALU_MIN ? nt__red_min_f32(x, n, 1)
                              : nt__red_sum_f32(x, n, 1);
}

/* ScalarE function tables: -1 = needs none; a change costs a table load. */
static int act_table_of(nt_act_func f)
{
    switch (f) {
    case NT_ACT_IDENTITY:
    case NT_ACT_RELU:
    case NT_ACT_ABS:
    case NT_ACT_SQUARE: return -1;
    default: return (int)f;
    }
}

/* the gradients' factors: nt__ew_<f>_bwd(1, x) is exactly the factor the
 * backward helper multiplies g by (1 * d == d bit for bit) */
static inline float act_gelu_dx(float x) { return nt__ew_gelu_bwd(1.0f, x); }
static inline float act_silu_dx(float x) { return nt__ew_silu_bwd(1.0f, x); }

static void act_apply_c(nt_act_func f, float *y, const float *x, int64_t n);

static void act_apply(nt_act_func f, float *y, const float *x, int64_t n)
{
#define ACT_LOOP(F) for (int64_t i = 0; i < n; i++) y[i] = F(x[i]); break;
    switch (f) {
    case NT_ACT_IDENTITY: if (y != x) memmove(y, x, (size_t)n * 4); break;
    case NT_ACT_EXP: ACT_LOOP(nt__ew_exp)
    case NT_ACT_LOG: ACT_LOOP(nt__ew_log)
    case NT_ACT_SQRT: ACT_LOOP(nt__ew_sqrt)
    case NT_ACT_RSQRT: ACT_LOOP(nt__ew_rsqrt)
    case NT_ACT_TANH: ACT_LOOP(nt__ew_tanh)
    case NT_ACT_SIGMOID: ACT_LOOP(nt__ew_sigmoid)
    case NT_ACT_GELU: ACT_LOOP(nt__ew_gelu)
    case NT_ACT_SILU: ACT_LOOP(nt__ew_silu)
    case NT_ACT_RELU: ACT_LOOP(nt__ew_relu)
    case NT_ACT_ABS: ACT_LOOP(nt__ew_abs)
    case NT_ACT_SQUARE: for (int64_t i = 0; i < n; i++) y[i] = nt__ew_mul(x[i], x[i]); break;
    case NT_ACT_GELU_DX: ACT_LOOP(act_gelu_dx)
    case NT_ACT_SILU_DX: ACT_LOOP(act_silu_dx)
    case NT_ACT_SOFTPLUS: ACT_LOOP(nt__ew_softplus)
    case NT_ACT_MISH: ACT_LOOP(nt__ew_mish)
    case NT_ACT_RECIPROCAL: ACT_LOOP(nt__ew_reciprocal)
    case NT_ACT_GELU_APPRX_TANH: ACT_LOOP(nt__ew_gelu_tanh)
    case NT_ACT_ERF: ACT_LOOP(nt__ew_erf)
    case NT_ACT_ERF_DX: ACT_LOOP(nt__ew_erf_dx)
    case NT_ACT_SIGN: ACT_LOOP(nt__ew_sign)
    default: nt__op_unhandled("sim activation", (int)f); /* checked at issue */
    }
#undef ACT_LOOP
}

/* the same, each result canonicalised: a direct f32 store */
static void act_apply_c(nt_act_func f, float *y, const float *x, int64_t n)
{
#define ACT_LOOP(F) for (int64_t i = 0; i < n; i++) y[i] = nt__canon(F(x[i])); break;
    switch (f) {
    case NT_ACT_IDENTITY: ACT_LOOP(ID_)
    case NT_ACT_RELU: ACT_LOOP(nt__ew_relu)
    case NT_ACT_ABS: ACT_LOOP(nt__ew_abs)
    case NT_ACT_SQUARE: for (int64_t i = 0; i < n; i++) y[i] = nt__canon(nt__ew_mul(x[i], x[i])); break;
    default:
        act_apply(f, y, x, n);
        for (int64_t i = 0; i < n; i++)
            y[i] = nt__canon(y[i]);
        break;
    }
#undef ACT_LOOP
}

/* ------------------------------------------------------------------------ */
/* Functional records                                                       */
/* ------------------------------------------------------------------------ */

enum { FX_DMA, FX_TT, FX_TS, FX_ACT, FX_RED, FX_COPY, FX_MEMSET, FX_IOTA, FX_ASEL, FX_SEL,
       FX_SCAN, FX_COPY_SR, FX_STT };

#define FX_MAXOP 5

/* One instruction's functional step; o[0] is the destination. */
typedef struct fx_rec {
    uint8_t kind, nop;
    bool ints;             /* exact int32 arithmetic */
    int np;                /* lanes */
    fx_opnd o[FX_MAXOP];
    int sc[2];             /* operand index of scalar k, 0 = immediate imm[k] */
    float imm[2];
    nt_alu_op op[2];
    bool rev[2];
    bool has_op1;
    nt_act_func func;
    bool has_scale, has_bias;
    int red;               /* operand index of activation's reduce_dst, 0 = none */
    int64_t outer, inner;  /* tensor_reduce */
    double value;          /* memset */
    nt_isa_affine aff;     /* iota, affine_select */
    nt_isa_index index;    /* tensor_copy_sr */
    uint64_t key;
    nt_alu_op cmp;
    float on_false;
} fx_rec;

static int add_opnd(fx_rec *r, const nt_ap *ap)
{
    opnd_init(&r->o[r->nop], ap);
    return r->nop++;
}

static float scalar_f(const fx_rec *r, int k, int i, float *tmp)
{
    if (!r->sc[k])
        return r->imm[k];
    return ld_f32(&r->o[r->sc[k]], i, tmp)[0];
}

static int32_t scalar_i(const fx_rec *r, int k, int i)
{
    if (!r->sc[k])
        return (int32_t)r->imm[k];
    int32_t v[1];
    ld_i32(&r->o[r->sc[k]], i, v);
    return v[0];
}

/* ---- lanes ---- */

static void strided_copy(uint8_t *d, int64_t ds, const uint8_t *s, int64_t ss, int64_t n,
                         int64_t esz)
{
    if (ds == 1 && ss == 1) {
        memmove(d, s, (size_t)(n * esz));
        return;
    }
    switch (esz) {
    case 4: {
        uint32_t *D = (uint32_t *)d;
        const uint32_t *S = (const uint32_t *)s;
        for (int64_t j = 0; j < n; j++)
            D[j * ds] = S[j * ss];
        break;
    }
    case 2: {
        uint16_t *D = (uint16_t *)d;
        const uint16_t *S = (const uint16_t *)s;
        for (int64_t j = 0; j < n; j++)
            D[j * ds] = S[j * ss];
        break;
    }
    default:
        for (int64_t j = 0; j < n; j++)
            d[j * ds] = s[j * ss];
        break;
    }
}

/* Walks the three outer dims of o, calling back with each innermost run. */
#define FOR_RUNS(o, row, OFFVAR, BODY)                                                     \
    for (int64_t a_ = 0; a_ < (o)->num[0]; a_++)                                           \
        for (int64_t b_ = 0; b_ < (o)->num[1]; b_++)                                       \
            for (int64_t c_ = 0; c_ < (o)->num[2]; c_++) {                                 \
                int64_t OFFVAR = a_ * (o)->step[0] + b_ * (o)->step[1] + c_ * (o)->step[2]; \
                BODY;                                                                      \
            }

/* Lane i of o to (write=false) or from (write=true) a contiguous buffer,
 * bit for bit. */
static void lane_bytes(const fx_opnd *o, int i, uint8_t *buf, bool write)
{
    uint8_t *row = lane_row(o, i);
    int64_t esz = o->esz;
    FOR_RUNS(o, row, off, {
        if (write)
            strided_copy(row + off * esz, o->step[3], buf, 1, o->num[3], esz);
        else
            strided_copy(buf, 1, row + off * esz, o->step[3], o->num[3], esz);
        buf += o->num[3] * esz;
    });
}

static void lane_dma(const fx_rec *r, int i, float **s)
{
    (void)s;
    const fx_opnd *d = &r->o[0], *a = &r->o[1];
    int64_t esz = a->esz, F = a->n;
    uint8_t *drow = lane_row(d, i);
    const uint8_t *srow = lane_row(a, i);
    if (d->contig && a->contig) {
        strided_copy(drow, d->step[3], srow, a->step[3], F, esz);
        return;
    }
    if (d->contig) { /* gather the runs of src into one run */
        uint8_t *w = drow;
        FOR_RUNS(a, srow, off, {
            strided_copy(w, d->step[3], srow + off * esz, a->step[3], a->num[3], esz);
            w += a->num[3] * d->step[3] * esz;
        });
        return;
    }
    if (a->contig) { /* scatter one run into the runs of dst */
        const uint8_t *w = srow;
        FOR_RUNS(d, drow, off, {
            strided_copy(drow + off * esz, d->step[3], w, a->step[3], d->num[3], esz);
            w += d->num[3] * a->step[3] * esz;
        });
        return;
    }
    /* both multi-dimensional: element by element in row-major order */
    int64_t ia[4] = {0}, ib[4] = {0};
    for (int64_t left = F; left > 0; left--) {
        int64_t oa = 0, ob = 0;
        for (int q = 0; q < 4; q++)
            oa += ia[q] * a->step[q], ob += ib[q] * d->step[q];
        memcpy(drow + ob * esz, srow + oa * esz, (size_t)esz);
        for (int q = 3; q >= 0 && ++ia[q] == a->num[q]; q--)
            ia[q] = 0;
        for (int q = 3; q >= 0 && ++ib[q] == d->num[q]; q--)
            ib[q] = 0;
    }
}

static void lane_tt(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    nt_alu_op op = r->op[0];
    int64_t N = d->n;
    if (r->ints) {
        int32_t *x = (int32_t *)s[0], *y = (int32_t *)s[1], *o = (int32_t *)s[2];
        ld_i32(&r->o[1], i, x);
        ld_i32(&r->o[2], i, y);
        alui_vv(op, o, x, y, N);
        st(d, i, NULL, o);
        return;
    }
    const float *x = ld_f32(&r->o[1], i, s[0]);
    const float *y = ld_f32(&r->o[2], i, s[1]);
    float *o = direct_f32(d, i, x, y);
    if (o) {
        alu_vv_c(op, o, x, y, N);
        return;
    }
    alu_vv(op, s[2], x, y, N);
    st(d, i, s[2], NULL);
}

static void lane_ts(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int64_t N = d->n;
    if (r->ints) {
        int32_t *x = (int32_t *)s[0];
        ld_i32(&r->o[1], i, x);
        for (int j = 0; j < 1 + r->has_op1; j++) {
            nt_alu_op op = r->op[j];
            alui_vs(op, x, x, scalar_i(r, j, i), r->rev[j], N);
        }
        st(d, i, NULL, x);
        return;
    }
    float tmp[4];
    const float *x = ld_f32(&r->o[1], i, s[0]);
    float s0 = scalar_f(r, 0, i, tmp);
    if (!r->has_op1) {
        float *o = direct_f32(d, i, x, NULL);
        if (o) {
            alu_vs_c(r->op[0], o, x, s0, r->rev[0], N);
            return;
        }
        alu_vs(r->op[0], s[1], x, s0, r->rev[0], N);
        st(d, i, s[1], NULL);
        return;
    }
    float s1 = scalar_f(r, 1, i, tmp);
    float *o = direct_f32(d, i, x, NULL);
    if (o && !r->rev[0] && !r->rev[1] && alu_vs2_c(r->op[0], r->op[1], o, x, s0, s1, N))
        return;
    alu_vs(r->op[0], s[1], x, s0, r->rev[0], N);
    if (o) {
        alu_vs_c(r->op[1], o, s[1], s1, r->rev[1], N);
        return;
    }
    alu_vs(r->op[1], s[1], s[1], s1, r->rev[1], N);
    st(d, i, s[1], NULL);
}

/* scalar_tensor_tensor: t = x <op0> s0 (f32), then t <op1> b (b <op1> t if
 * rev[1]), rounded once by the store; o[2] is b */
static void lane_stt(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int64_t N = d->n;
    if (r->ints) {
        int32_t *x = (int32_t *)s[0], *y = (int32_t *)s[1];
        ld_i32(&r->o[1], i, x);
        alui_vs(r->op[0], x, x, scalar_i(r, 0, i), r->rev[0], N);
        ld_i32(&r->o[2], i, y);
        if (r->rev[1])
            alui_vv(r->op[1], x, y, x, N);
        else
            alui_vv(r->op[1], x, x, y, N);
        st(d, i, NULL, x);
        return;
    }
    float tmp[4];
    const float *x = ld_f32(&r->o[1], i, s[0]);
    alu_vs(r->op[0], s[2], x, scalar_f(r, 0, i, tmp), r->rev[0], N);
    const float *y = ld_f32(&r->o[2], i, s[1]);
    const float *a = r->rev[1] ? y : s[2], *b = r->rev[1] ? s[2] : y;
    float *o = direct_f32(d, i, a, b);
    if (o) {
        alu_vv_c(r->op[1], o, a, b, N);
        return;
    }
    alu_vv(r->op[1], s[2], a, b, N); /* element i reads a[i], b[i] before writing o[i] */
    st(d, i, s[2], NULL);
}

static void lane_act(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int64_t N = d->n;
    float tmp[4];
    const float *x = ld_f32(&r->o[1], i, s[0]);
    /* absent scale/bias are skipped, not applied as *1 and +0: x*1+0
     * would turn -0 into +0 */
    if (r->has_scale) {
        float sc = scalar_f(r, 0, i, tmp);
        for (int64_t j = 0; j < N; j++)
            s[1][j] = nt__ew_mul(x[j], sc);
        x = s[1];
    }
    if (r->has_bias) {
        float bi = scalar_f(r, 1, i, tmp);
        for (int64_t j = 0; j < N; j++)
            s[1][j] = nt__ew_add(x[j], bi);
        x = s[1];
    }
    if (!r->red) {
        float *o = direct_f32(d, i, x, NULL);
        if (o) {
            act_apply_c(r->func, o, x, N);
            return;
        }
    }
    act_apply(r->func, s[2], x, N);
    st(d, i, s[2], NULL);
    if (r->red) {
        float v = reduce_run(NT_ALU_ADD, s[2], N);
        st(&r->o[r->red], i, &v, NULL);
    }
}

static void lane_red(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int64_t outer = r->outer, inner = r->inner;
    if (r->ints) {
        int32_t *x = (int32_t *)s[0], *o = (int32_t *)s[1];
        ld_i32(&r->o[1], i, x);
        for (int64_t j = 0; j < outer; j++) {
            if (r->op[0] == NT_ALU_ADD) {
                o[j] = nt__red_sum_i32(x + j * inner, inner, 1);
            } else {
                int32_t m = x[j * inner];
                for (int64_t q = 1; q < inner; q++)
                    m = r->op[0] == NT_ALU_MIN ? nt__ewi_minimum(m, x[j * inner + q])
                                               : nt__ewi_maximum(m, x[j * inner + q]);
                o[j] = m;
            }
        }
        st(d, i, NULL, o);
        return;
    }
    const float *x = ld_f32(&r->o[1], i, s[0]);
    for (int64_t j = 0; j < outer; j++)
        s[1][j] = reduce_run(r->op[0], x + j * inner, inner);
    st(d, i, s[1], NULL);
}

static void lane_copy(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0], *a = &r->o[1];
    if (r->ints) {
        /* exact integers: ints wrap into u8, floats round once */
        ld_i32(a, i, (int32_t *)s[0]);
        st(d, i, NULL, (const int32_t *)s[0]);
        return;
    }
    const float *x = ld_f32(a, i, s[0]);
    float *o = direct_f32(d, i, x, NULL);
    if (o) {
        for (int64_t j = 0; j < d->n; j++)
            o[j] = nt__canon(x[j]);
        return;
    }
    if (x != s[0]) {
        /* src may overlap dst in another dtype: read it all first */
        memcpy(s[0], x, (size_t)d->n * 4);
        x = s[0];
    }
    st(d, i, x, NULL);
}

/* the element indices of lane p, row-major over the pattern's own free dims */
static void index_row(const nt_ap *ap, const nt_isa_index *x, int p, uint64_t *o)
{
    int64_t num[4] = {1, 1, 1, 1}, stp[4] = {0, 0, 0, 0};
    int pad = 4 - ap->ndim;
    for (int i = 0; i < ap->ndim; i++) {
        num[pad + i] = ap->num[i];
        stp[pad + i] = x->step[i];
    }
    int64_t base = x->offset + x->channel_multiplier * (int64_t)p, n = 0;
    for (int64_t a = 0; a < num[0]; a++)
        for (int64_t b = 0; b < num[1]; b++)
            for (int64_t c = 0; c < num[2]; c++) {
                int64_t v = base + a * stp[0] + b * stp[1] + c * stp[2];
                for (int64_t d = 0; d < num[3]; d++)
                    o[n++] = (uint64_t)(v + d * stp[3]);
            }
}

static void lane_copy_sr(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    nt_dtype dt = d->ap.dtype;
    const float *x = ld_f32(&r->o[1], i, s[0]);
    uint64_t *ix = (uint64_t *)s[2]; /* n 64-bit indices fit a scratch row */
    index_row(&d->ap, &r->index, i, ix);
    float *y = s[1];
    for (int64_t j = 0; j < d->n; j++)
        y[j] = nt__round_f32_sr(dt, x[j], nt__sr_bits(r->key, ix[j]));
    st(d, i, y, NULL); /* the values are representable: this store is exact */
}

static void lane_memset(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int64_t N = d->n;
    if (r->ints) {
        int32_t *v = (int32_t *)s[0], x = nt__f64_to_i32(r->value);
        for (int64_t j = 0; j < N; j++)
            v[j] = x;
        st(d, i, NULL, v);
    } else {
        float x = (float)r->value;
        for (int64_t j = 0; j < N; j++)
            s[0][j] = x;
        st(d, i, s[0], NULL);
    }
}

/* Affine values of lane p in row-major order of the pattern's own free dims. */
static void affine_row(const nt_ap *ap, const nt_isa_affine *x, int p, int32_t *o)
{
    int64_t num[4] = {1, 1, 1, 1};
    uint32_t stp[4] = {0, 0, 0, 0};
    int pad = 4 - ap->ndim;
    for (int i = 0; i < ap->ndim; i++) {
        num[pad + i] = ap->num[i];
        stp[pad + i] = (uint32_t)x->step[i];
    }
    /* 32-bit wrapping integer math, as on the engine */
    uint32_t base = (uint32_t)x->offset + (uint32_t)x->channel_multiplier * (uint32_t)p;
    int64_t n = 0;
    for (int64_t a = 0; a < num[0]; a++)
        for (int64_t b = 0; b < num[1]; b++)
            for (int64_t c = 0; c < num[2]; c++) {
                uint32_t v = base + (uint32_t)a * stp[0] + (uint32_t)b * stp[1] + (uint32_t)c * stp[2];
                for (int64_t d = 0; d < num[3]; d++)
                    o[n++] = (int32_t)(v + (uint32_t)d * stp[3]);
            }
}

static void lane_iota(const fx_rec *r, int i, float **s)
{
    int32_t *v = (int32_t *)s[0];
    affine_row(&r->o[0].ap, &r->aff, i, v);
    st(&r->o[0], i, NULL, v);
}

static void lane_asel(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int32_t *v = (int32_t *)s[1];
    const float *x = ld_f32(&r->o[1], i, s[0]);
    affine_row(&d->ap, &r->aff, i, v);
    for (int64_t j = 0; j < d->n; j++)
        s[2][j] = alui1(r->cmp, v[j], 0) ? x[j] : r->on_false;
    st(d, i, s[2], NULL);
}

static void lane_sel(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int64_t N = d->n;
    const float *m = ld_f32(&r->o[1], i, s[0]);
    if (r->ints) {
        int32_t *a = (int32_t *)s[1], *b = (int32_t *)s[2], *y = (int32_t *)s[3];
        ld_i32(&r->o[2], i, a);
        ld_i32(&r->o[3], i, b);
        for (int64_t j = 0; j < N; j++)
            y[j] = m[j] != 0.0f ? a[j] : b[j];
        st(d, i, NULL, y);
        return;
    }
    const float *a = ld_f32(&r->o[2], i, s[1]);
    const float *b = ld_f32(&r->o[3], i, s[2]);
    float *y = s[3];
    for (int64_t j = 0; j < N; j++)
        y[j] = m[j] != 0.0f ? a[j] : b[j];
    st(d, i, y, NULL);
}

static void lane_scan(const fx_rec *r, int i, float **s)
{
    const fx_opnd *d = &r->o[0];
    int64_t N = d->n;
    float tmp[4];
    const float *d0 = ld_f32(&r->o[1], i, s[0]);
    const float *d1 = ld_f32(&r->o[2], i, s[1]);
    float acc = scalar_f(r, 0, i, tmp);
    nt_alu_op op0 = r->op[0], op1 = r->op[1];
    for (int64_t j = 0; j < N; j++) {
        acc = alu1(op1, alu1(op0, d0[j], acc), d1[j]);
        s[2][j] = acc;
    }
    st(d, i, s[2], NULL);
}

static void lane_run(const fx_rec *r, int i, float **s)
{
    switch (r->kind) {
    case FX_DMA: lane_dma(r, i, s); break;
    case FX_TT: lane_tt(r, i, s); break;
    case FX_TS: lane_ts(r, i, s); break;
    case FX_STT: lane_stt(r, i, s); break;
    case FX_ACT: lane_act(r, i, s); break;
    case FX_RED: lane_red(r, i, s); break;
    case FX_COPY: lane_copy(r, i, s); break;
    case FX_MEMSET: lane_memset(r, i, s); break;
    case FX_IOTA: lane_iota(r, i, s); break;
    case FX_ASEL: lane_asel(r, i, s); break;
    case FX_SEL: lane_sel(r, i, s); break;
    case FX_SCAN: lane_scan(r, i, s); break;
    case FX_COPY_SR: lane_copy_sr(r, i, s); break;
    default: break;
    }
}

/* ------------------------------------------------------------------------ */
/* The batch and the helper thread                                          */
/* ------------------------------------------------------------------------ */

#define FX_CAP 96
#define FX_MAXRNG (FX_CAP * FX_MAXOP)
/* A flush (or one instruction) smaller than this many element-steps runs
 * on one thread: waking the helper costs more than it saves. */
#define FX_SPLIT_WORK (1 << 17)

typedef struct fx_range {
    uintptr_t lo, hi; /* bytes [lo, hi) over all rows */
    int rec, opnd;
    bool write;
} fx_range;

typedef struct fx_batch {
    fx_rec rec[FX_CAP];
    int n;
    int p0;          /* on-chip partition base shared by the batch, -1 none yet */
    int maxnp;
    double work;
    fx_range rng[FX_MAXRNG];
    int nrng;
} fx_batch;

static int fx_defer = -1;   /* NT_SIM_DEFER (default on) */
static int fx_threads = -1; /* NT_SIM_THREADS (default 2 when the host has 2 cores) */

typedef struct fx_job {
    void (*fn)(void *arg, int lo, int hi, float **s);
    void *arg;
    int lo, hi;
} fx_job;

/* A core's functional state (nt__sim_core.fx): its batch and its helper
 * thread.  Kernels of one core are serialised, so the owner thread of the
 * core's open kernel is the only one touching it (the helper gets its job
 * under mu). */
struct nt__sim_fx {
    fx_batch *fxb;
    struct {
        pthread_t th;
        pthread_mutex_t mu;
        pthread_cond_t cv, done_cv;
        bool started, quit, has_job, done;
        fx_job job;
        float *scr[4];
    } hp;
    /* flush_chunked's windows, kept between flushes: a fresh malloc of
     * this size would be a fresh mmap, page faults and all, every flush */
    fx_rec *w;
    bool *has;
    size_t cap;
};

/* Core c's functional state, made at its first use (by the thread that
 * holds the core); NULL if the host has no memory for it. */
static struct nt__sim_fx *fx_of(nt__sim_core *c)
{
    if (c->fx)
        return c->fx;
    struct nt__sim_fx *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    pthread_mutex_init(&f->hp.mu, NULL);
    pthread_cond_init(&f->hp.cv, NULL);
    pthread_cond_init(&f->hp.done_cv, NULL);
    c->fx = f;
    return f;
}

static void *helper_main(void *arg)
{
    struct nt__sim_fx *f = arg;
    pthread_mutex_lock(&f->hp.mu);
    for (;;) {
        while (!f->hp.has_job && !f->hp.quit)
            pthread_cond_wait(&f->hp.cv, &f->hp.mu);
        if (f->hp.quit)
            break;
        fx_job j = f->hp.job;
        f->hp.has_job = false;
        pthread_mutex_unlock(&f->hp.mu);
        j.fn(j.arg, j.lo, j.hi, f->hp.scr);
        pthread_mutex_lock(&f->hp.mu);
        f->hp.done = true;
        pthread_cond_signal(&f->hp.done_cv);
    }
    pthread_mutex_unlock(&f->hp.mu);
    return NULL;
}

static void fx_config_once(void)
{
    const char *d = getenv("NT_SIM_DEFER");
    fx_defer = !(d && d[0] == '0');
    const char *t = getenv("NT_SIM_THREADS");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    fx_threads = t && *t ? (atoi(t) >= 2 ? 2 : 1) : (ncpu >= 2 ? 2 : 1);
}

/* Once per process, whichever core's thread comes first. */
static void fx_config(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fx_config_once);
}

static bool helper_start(struct nt__sim_fx *f)
{
    if (f->hp.started)
        return true;
    for (int i = 0; i < 4; i++) {
        if (!f->hp.scr[i]) /* kept from an earlier try that failed part-way */
            f->hp.scr[i] = malloc(nt__sim.scratch_elems * sizeof(float) * 2);
        if (!f->hp.scr[i])
            return false;
    }
    f->hp.quit = false;
    if (pthread_create(&f->hp.th, NULL, helper_main, f) != 0)
        return false;
    f->hp.started = true;
    return true;
}

void nt__sim_fx_shutdown(nt__sim_core *c)
{
    struct nt__sim_fx *f = c->fx;
    if (!f)
        return;
    if (f->hp.started) {
        pthread_mutex_lock(&f->hp.mu);
        f->hp.quit = true;
        pthread_cond_signal(&f->hp.cv);
        pthread_mutex_unlock(&f->hp.mu);
        pthread_join(f->hp.th, NULL);
        f->hp.started = false;
    }
    for (int i = 0; i < 4; i++)
        free(f->hp.scr[i]);
    free(f->fxb);
    free(f->w);
    free(f->has);
    pthread_mutex_destroy(&f->hp.mu);
    pthread_cond_destroy(&f->hp.cv);
    pthread_cond_destroy(&f->hp.done_cv);
    free(f);
    c->fx = NULL;
}

/* Runs fn over lanes [0, n) for core c: split in two halves over the core's
 * helper thread when the work is big enough, else on the calling thread. */
static void run_split(nt__sim_core *c, void (*fn)(void *, int, int, float **), void *arg, int n,
                      double work)
{
    fx_config();
    struct nt__sim_fx *f = fx_threads < 2 || n < 2 || work < FX_SPLIT_WORK ? NULL : fx_of(c);
    if (!f || !helper_start(f)) {
        fn(arg, 0, n, c->scratch);
        return;
    }
    int h = n / 2;
    pthread_mutex_lock(&f->hp.mu);
    f->hp.job = (fx_job){fn, arg, h, n};
    f->hp.has_job = true;
    f->hp.done = false;
    pthread_cond_signal(&f->hp.cv);
    pthread_mutex_unlock(&f->hp.mu);
    fn(arg, 0, h, c->scratch);
    pthread_mutex_lock(&f->hp.mu);
    while (!f->hp.done)
        pthread_cond_wait(&f->hp.done_cv, &f->hp.mu);
    pthread_mutex_unlock(&f->hp.mu);
}

typedef struct lanes_arg {
    const fx_rec *rec;
    int n;
} lanes_arg;

static void run_lanes(void *arg, int lo, int hi, float **s)
{
    const lanes_arg *a = arg;
    for (int i = lo; i < hi; i++)
        for (int j = 0; j < a->n; j++)
            if (i < a->rec[j].np)
                lane_run(&a->rec[j], i, s);
}

/* ---- column chunks ----
 * A batch of positionwise instructions (element j of every output depends
 * only on element j of the inputs, all operands walked from the same
 * origin) may run chunk by chunk of the free axis: for each lane, for each
 * chunk of FX_COL elements, every instruction in order.  Each element still
 * sees the instructions in program order, and the rows being worked on stay
 * in L2.  Measured: chunks of 1024 made the 8-op chain of bench/fusion
 * slower (the per-call cost of an instruction on a lane outweighs the L1
 * hits), so only rows longer than 8192 elements are chunked. */
#define FX_COL 8192

static bool rec_positionwise(const fx_rec *r)
{
    switch (r->kind) {
    case FX_DMA:
    case FX_TT:
    case FX_TS:
    case FX_STT:
    case FX_COPY:
    case FX_MEMSET:
    case FX_SEL: break;
    case FX_ACT:
        if (r->red)
            return false;
        break;
    default: return false;
    }
    int64_t n = r->o[0].n;
    for (int k = 0; k < r->nop; k++) {
        if ((r->sc[0] && k == r->sc[0]) || (r->sc[1] && k == r->sc[1]))
            continue; /* a per-lane scalar */
        const fx_opnd *o = &r->o[k];
        if (o->n != n || !(o->contig || o->bcast))
            return false;
    }
    return true;
}

typedef struct span {
    const nt_tile *tile;
    int64_t lo, hi, origin, esz;
    bool write, bcast;
} span;

/* Every on-chip byte range touched from two different origins (or written
 * and also read as a broadcast element) breaks the chunk order. */
static bool batch_chunkable(const fx_batch *b)
{
    span u[256];
    int nu = 0;
    for (int j = 0; j < b->n; j++) {
        const fx_rec *r = &b->rec[j];
        if (!rec_positionwise(r))
            return false;
        for (int k = 0; k < r->nop; k++) {
            const fx_opnd *o = &r->o[k];
            if (!o->ap.tile)
                continue;
            span sp = {o->ap.tile, 0, 0, 0, o->esz, k == 0 || k == r->red, o->bcast};
            sp.origin = o->ap.tile->off + o->ap.offset * o->esz;
            sp.lo = sp.origin;
            sp.hi = sp.origin + (o->bcast ? 1 : o->n) * o->esz;
            bool dup = false;
            for (int q = 0; q < nu; q++) {
                span *t = &u[q];
                if (t->tile->mem != sp.tile->mem || sp.lo >= t->hi || t->lo >= sp.hi)
                    continue;
                if (t->tile == sp.tile && t->lo == sp.lo && t->hi == sp.hi &&
                    t->bcast == sp.bcast && t->esz == sp.esz) {
                    t->write |= sp.write;
                    dup = true;
                    if (sp.bcast && t->write)
                        return false;
                    continue;
                }
                if (sp.bcast || t->bcast) {
                    if (sp.write || t->write)
                        return false;
                } else if (sp.origin != t->origin || sp.esz != t->esz) {
                    return false;
                }
            }
            if (!dup) {
                if (nu == 256)
                    return false;
                u[nu++] = sp;
            }
        }
    }
    return true;
}

/* r restricted to elements [c0, c0 + cn) of its free axis */
static void rec_window(const fx_rec *r, fx_rec *w, int64_t c0, int64_t cn)
{
    *w = *r;
    for (int k = 0; k < r->nop; k++) {
        if ((r->sc[0] && k == r->sc[0]) || (r->sc[1] && k == r->sc[1]))
            continue;
        fx_opnd *o = &w->o[k];
        if (!o->bcast)
            o->base += c0 * o->step[3] * o->esz;
        o->n = cn;
        o->num[3] = cn;
        o->ap.ndim = 1;
        o->ap.num[0] = cn;
    }
}

typedef struct chunks_arg {
    const fx_rec *rec; /* [nch][n] windows, NULL where empty */
    const bool *has;
    int n, nch;
} chunks_arg;

static void run_chunks(void *arg, int lo, int hi, float **s)
{
    const chunks_arg *a = arg;
    for (int i = lo; i < hi; i++)
        for (int c = 0; c < a->nch; c++)
            for (int j = 0; j < a->n; j++) {
                const fx_rec *r = &a->rec[c * a->n + j];
                if (a->has[c * a->n + j] && i < r->np)
                    lane_run(r, i, s);
            }
}

/* Runs the batch chunk by chunk when it can; false if it cannot. */
static bool flush_chunked(nt__sim_core *core, fx_batch *b)
{
    int64_t nmax = 0;
    for (int j = 0; j < b->n; j++)
        if (b->rec[j].o[0].n > nmax)
            nmax = b->rec[j].o[0].n;
    if (nmax <= FX_COL || !batch_chunkable(b))
        return false;
    int nch = (int)((nmax + FX_COL - 1) / FX_COL);
    struct nt__sim_fx *f = core->fx; /* the batch lives there */
    size_t need = (size_t)nch * (size_t)b->n;
    if (need > f->cap) {
        fx_rec *nw = realloc(f->w, sizeof *nw * need);
        if (!nw)
            return false;
        f->w = nw;
        bool *nh = realloc(f->has, need);
        if (!nh)
            return false;
        f->has = nh;
        f->cap = need;
    }
    fx_rec *w = f->w;
    bool *has = f->has;
    memset(has, 0, need);
    for (int c = 0; c < nch; c++)
        for (int j = 0; j < b->n; j++) {
            const fx_rec *r = &b->rec[j];
            int64_t c0 = (int64_t)c * FX_COL, n = r->o[0].n;
            if (c0 >= n)
                continue;
            rec_window(r, &w[c * b->n + j], c0, n - c0 < FX_COL ? n - c0 : FX_COL);
            has[c * b->n + j] = true;
        }
    chunks_arg a = {w, has, b->n, nch};
    run_split(core, run_chunks, &a, b->maxnp, b->work);
    return true;
}

static double rec_work(const fx_rec *r)
{
    int64_t n = r->o[0].n;
    for (int k = 1; k < r->nop; k++)
        if (r->o[k].n > n)
            n = r->o[k].n;
    return (double)r->np * (double)(n + 16);
}

void nt__sim_fx_flush(nt_sim_kernel *k)
{
    nt__sim_core *core = k->core;
    fx_batch *b = core->fx ? core->fx->fxb : NULL;
    if (!b || !b->n)
        return;
    if (!flush_chunked(core, b)) {
        lanes_arg a = {b->rec, b->n};
        run_split(core, run_lanes, &a, b->maxnp, b->work);
    }
    b->n = 0;
    b->nrng = 0;
    b->p0 = -1;
    b->maxnp = 0;
    b->work = 0;
}

static void range_of(const fx_opnd *o, uintptr_t *lo, uintptr_t *hi)
{
    int64_t elo, ehi;
    nt__sim_extent(&o->ap, &elo, &ehi);
    int64_t plo = 0, phi = (int64_t)(o->ap.np - 1) * o->ap.pstep;
    if (phi < 0)
        plo = phi, phi = 0;
    uintptr_t base = (uintptr_t)o->ap.hbm;
    *lo = base + (uintptr_t)((o->ap.offset + plo + elo) * o->esz);
    *hi = base + (uintptr_t)((o->ap.offset + phi + ehi + 1) * o->esz);
}

static bool same_pattern(const nt_ap *a, const nt_ap *b)
{
    if (a->hbm != b->hbm || a->dtype != b->dtype || a->np != b->np || a->pstep != b->pstep ||
        a->offset != b->offset || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->num[i] != b->num[i] || a->step[i] != b->step[i])
            return false;
    return true;
}

/* Rows of a written HBM pattern must not overlap each other (lanes may run
 * on different threads). */
static bool rows_disjoint(const fx_opnd *o)
{
    if (o->ap.np <= 1)
        return true;
    int64_t lo, hi;
    nt__sim_extent(&o->ap, &lo, &hi);
    int64_t ps = o->ap.pstep < 0 ? -o->ap.pstep : o->ap.pstep;
    return ps > hi - lo;
}

/* Two HBM patterns of interleaved rows (same base and row step, rows no
 * longer than the step) that never touch the same element. */
static bool rows_interleave(const fx_opnd *a, const fx_opnd *b)
{
    const nt_ap *x = &a->ap, *y = &b->ap;
    if (x->hbm != y->hbm || x->dtype != y->dtype || x->pstep != y->pstep || x->pstep <= 0)
        return false;
    int64_t la, ha, lb, hb;
    nt__sim_extent(x, &la, &ha);
    nt__sim_extent(y, &lb, &hb);
    int64_t ps = x->pstep, ea = ha - la + 1, eb = hb - lb + 1;
    if (ea > ps || eb > ps)
        return false;
    int64_t d = ((y->offset + lb) - (x->offset + la)) % ps;
    if (d < 0)
        d += ps;
    return d >= ea && ps - d >= eb;
}

enum { ADM_OK, ADM_CONFLICT, ADM_NEVER };

/* Can r join batch b without changing any result? */
static int fx_admit(const fx_batch *b, const fx_rec *r, bool rowlocal)
{
    if (!rowlocal)
        return ADM_NEVER;
    int p0 = -1;
    for (int k = 0; k < r->nop; k++) {
        const nt_ap *ap = &r->o[k].ap;
        if (!ap->tile)
            continue;
        if (p0 < 0)
            p0 = ap->p0;
        else if (ap->p0 != p0)
            return ADM_NEVER; /* moves data across partitions */
    }
    /* HBM operands of r itself: a write overlapping another operand */
    for (int k = 0; k < r->nop; k++) {
        const fx_opnd *o = &r->o[k];
        if (o->ap.tile)
            continue;
        bool wr = k == 0;
        if (wr && !rows_disjoint(o))
            return ADM_NEVER;
        uintptr_t lo, hi;
        range_of(o, &lo, &hi);
        for (int q = 0; q < r->nop; q++) {
            if (q == k || r->o[q].ap.tile || (!wr && q != 0))
                continue;
            uintptr_t l2, h2;
            range_of(&r->o[q], &l2, &h2);
            if (lo < h2 && l2 < hi && !same_pattern(&o->ap, &r->o[q].ap))
                return ADM_NEVER;
        }
    }
    if (b->n == 0)
        return ADM_OK;
    if (p0 >= 0 && b->p0 >= 0 && p0 != b->p0)
        return ADM_CONFLICT;
    for (int k = 0; k < r->nop; k++) {
        const fx_opnd *o = &r->o[k];
        if (o->ap.tile)
            continue;
        bool wr = k == 0;
        uintptr_t lo, hi;
        range_of(o, &lo, &hi);
        for (int q = 0; q < b->nrng; q++) {
            const fx_range *g = &b->rng[q];
            if (!(wr || g->write) || lo >= g->hi || g->lo >= hi)
                continue;
            const fx_opnd *q2 = &b->rec[g->rec].o[g->opnd];
            if (!same_pattern(&o->ap, &q2->ap) && !rows_interleave(o, q2))
                return ADM_CONFLICT;
        }
    }
    if (b->nrng + r->nop > FX_MAXRNG)
        return ADM_CONFLICT;
    return ADM_OK;
}

/* Executes (or queues) the functional step of a checked, scheduled
 * instruction.  rowlocal: lane i touches only partition p0 + i and HBM row
 * i of its operands. */
static void fx_submit(nt_sim_kernel *k, const fx_rec *r, bool rowlocal)
{
    if (!k->functional)
        return;
    fx_config();
    nt__sim_core *core = k->core;
    struct nt__sim_fx *f = fx_of(core);
    if (f && !f->fxb) {
        f->fxb = calloc(1, sizeof *f->fxb);
        if (f->fxb)
            f->fxb->p0 = -1;
    }
    fx_batch *b = f ? f->fxb : NULL;
    int adm = b ? fx_admit(b, r, rowlocal) : ADM_NEVER;
    if (adm == ADM_CONFLICT) {
        nt__sim_fx_flush(k);
        adm = fx_admit(b, r, rowlocal);
    }
    if (adm != ADM_OK || !fx_defer) {
        nt__sim_fx_flush(k);
        lanes_arg a = {r, 1};
        if (adm == ADM_OK) /* lanes independent: may split over threads */
            run_split(core, run_lanes, &a, r->np, rec_work(r));
        else /* lanes in order, as the engine streams partitions */
            run_lanes(&a, 0, r->np, core->scratch);
        return;
    }
    fx_rec *slot = &b->rec[b->n];
    *slot = *r;
    for (int q = 0; q < r->nop; q++) {
        const nt_ap *ap = &r->o[q].ap;
        if (ap->tile) {
            if (b->p0 < 0)
                b->p0 = ap->p0;
            continue;
        }
        fx_range *g = &b->rng[b->nrng++];
        range_of(&r->o[q], &g->lo, &g->hi);
        g->rec = b->n;
        g->opnd = q;
        g->write = q == 0;
    }
    if (r->np > b->maxnp)
        b->maxnp = r->np;
    b->work += rec_work(r);
    b->n++;
    if (b->n == FX_CAP)
        nt__sim_fx_flush(k);
}

int nt_sim_kernel_sync(nt_sim_kernel *k)
{
    if (!k)
        return NT__SIM_NULL("nt_sim_kernel_sync", "k");
    nt__sim_fx_flush(k);
    return k->err;
}

double nt__sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The work rows of k's core. */
static float **scr(const nt_sim_kernel *k)
{
    return k->core->scratch;
}
/* ------------------------------------------------------------------------ */
/* dma_copy                                                                 */
/* ------------------------------------------------------------------------ */

/* Contiguous run length (elements) a DMA descriptor can cover. */
static int64_t run_elems(const nt_ap *ap)
{
    nt__sim_shape s;
    nt__sim_canon(ap, &s);
    return s.step[s.nd - 1] == 1 ? s.num[s.nd - 1] : 1;
}

/* DMA cost: every descriptor (contiguous run) costs at least the minimum. */
static double dma_cost(const nt_ap *dst, const nt_ap *src, double bytes)
{
    int64_t esz = (int64_t)nt__dtype_size(src->dtype);
    int64_t F = nt__sim_free_count(src);
    int64_t run = run_elems(src), rd = run_elems(dst);
    if (rd < run)
        run = rd;
    int64_t mind = nt__sim.cfg.dma_min_descriptor_bytes;
    if (run * esz < mind)
        return (double)src->np * (double)((F + run - 1) / run) * (double)mind;
    return bytes;
}

int nt_isa_dma_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, int queue)
{
    const char *I = isa_kinds[K_DMA_COPY].name;
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_HBM | M_SBUF, -1));
    TRY(check_ap(k, I, "src", src, M_HBM | M_SBUF, -1));
    if (dst->dtype != src->dtype)
        return nt__sim_fail(k, I,
                            "dst is %s, src %s (rule: a DMA copies bytes: same dtype; convert "
                            "with tensor_copy)",
                            dtn(dst->dtype), dtn(src->dtype));
    TRY(check_same(k, I, "dst", dst, "src", src));
    if (queue < NT_DMA_QUEUE_AUTO || queue >= NT_SIM_DMA_QUEUES)
        return nt__sim_fail(k, I, "queue %d (rule: queues 0..15 or NT_DMA_QUEUE_AUTO)", queue);
    if (queue == NT_DMA_QUEUE_AUTO)
        queue = nt__sim_auto_queue(k);

    int64_t esz = (int64_t)nt__dtype_size(src->dtype);
    int64_t F = nt__sim_free_count(src);
    double bytes = (double)src->np * (double)F * (double)esz;
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_DMA, .queue = queue, .dma_bytes = bytes,
                        .dma_cost_bytes = dma_cost(dst, src, bytes), .dma_parts = src->np,
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    if (!src->tile)
        in.hbm_rd = (uint64_t)bytes;
    if (!dst->tile)
        in.hbm_wr = (uint64_t)bytes;
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_DMA, .np = src->np};
    add_opnd(&r, dst);
    add_opnd(&r, src);
    fx_submit(k, &r, true);
    return 0;
}

static bool idx_dtype_ok(nt_dtype dt)
{
    return dt == NT_I32 || dt == NT_U8;
}

int nt_isa_dma_gather(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, const nt_ap *idx,
                      int queue)
{
    const char *I = isa_kinds[K_DMA_GATHER].name;
    PROLOGUE(k);
    k->nopaque++; /* its data decide what it touches */
    TRY(check_ap(k, I, "dst", dst, M_SBUF, -1));
    TRY(check_ap(k, I, "src", src, M_HBM, -1));
    TRY(check_ap(k, I, "idx", idx, M_SBUF, -1));
    if (dst->dtype != src->dtype)
        return nt__sim_fail(k, I, "dst is %s, src %s (rule: a DMA copies bytes: same dtype)",
                            dtn(dst->dtype), dtn(src->dtype));
    if (!idx_dtype_ok(idx->dtype))
        return nt__sim_fail(k, I, "idx is %s (rule: indices are i32 or u8)", dtn(idx->dtype));
    if (idx->np != dst->np || nt__sim_free_count(idx) != 1)
        return nt__sim_fail(k, I, "idx is [%d, %lld] (rule: idx is [%d, 1], one row per partition)",
                            idx->np, (long long)nt__sim_free_count(idx), dst->np);
    if (idx->p0 != dst->p0)
        return nt__sim_fail(k, I, "idx starts at partition %d, dst at %d (rule: the same "
                                  "partitions)", idx->p0, dst->p0);
    int64_t F = nt__sim_free_count(dst);
    if (nt__sim_free_count(src) != F)
        return nt__sim_fail(k, I, "a src row has %lld elements, a dst row %lld (rule: equal)",
                            (long long)nt__sim_free_count(src), (long long)F);
    if (queue < NT_DMA_QUEUE_AUTO || queue >= NT_SIM_DMA_QUEUES)
        return nt__sim_fail(k, I, "queue %d (rule: queues 0..15 or NT_DMA_QUEUE_AUTO)", queue);
    if (queue == NT_DMA_QUEUE_AUTO)
        queue = nt__sim_auto_queue(k);
    int64_t esz = (int64_t)nt__dtype_size(dst->dtype);
    double bytes = (double)dst->np * (double)F * (double)esz;
    /* one row of src per partition: the descriptors are those of a copy of
     * dst->np rows of the src pattern */
    nt_ap one = *src;
    one.np = dst->np;
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_DMA, .queue = queue, .dma_bytes = bytes,
                        .dma_cost_bytes = dma_cost(dst, &one, bytes), .dma_parts = dst->np,
                        .act_table = -1, .hbm_rd = (uint64_t)bytes};
    /* the table is read where the data says: not dependency-tracked (a
     * kernel must not write it before gathering from it) */
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"idx", idx, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    nt__sim_fx_flush(k);
    fx_opnd d, s, x;
    opnd_init(&d, dst);
    opnd_init(&s, src);
    opnd_init(&x, idx);
    for (int p = 0; p < dst->np; p++) {
        int32_t v;
        ld_i32(&x, p, &v);
        if (v < 0 || v >= src->np)
            return nt__sim_fail(k, I,
                                "index %d at partition %d (rule: indices in [0, %d), the rows "
                                "of src)",
                                v, dst->p0 + p, src->np);
        fx_rec r = {.kind = FX_DMA, .np = 1};
        r.o[0] = d;
        r.o[1] = s;
        r.nop = 2;
        /* lane p of dst, row v of src */
        r.o[0].base = lane_row(&d, p);
        r.o[1].base = lane_row(&s, v);
        lane_dma(&r, 0, scr(k));
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* TensorE                                                                  */
/* ------------------------------------------------------------------------ */

static bool contiguous_row(const nt_ap *ap)
{
    nt__sim_shape s;
    nt__sim_canon(ap, &s);
    return s.nd == 1 && s.step[0] == 1;
}

/* Widens the K rows of ap into w as a [K, n] f32 matrix. */
static const float *as_matrix(const nt_ap *ap, float *w, int *ld)
{
    fx_opnd o;
    opnd_init(&o, ap);
    if (ap->dtype == NT_F32 && o.contig) {
        *ld = (int)(nt__sim.sbuf_stride / 4);
        return (const float *)lane_row(&o, 0);
    }
    for (int p = 0; p < ap->np; p++) {
        const float *r = ld_f32(&o, p, w + (int64_t)p * o.n);
        if (r != w + (int64_t)p * o.n)
            memcpy(w + (int64_t)p * o.n, r, (size_t)o.n * 4);
    }
    *ld = (int)o.n;
    return w;
}

typedef struct gemm_arg {
    int M, N, K;
    const float *S, *B;
    int lds, ldb;
    float *C;
    int ldc;
    bool acc, bf16; /* bf16: both operands bf16 (their own definition, core/gemm.h) */
} gemm_arg;

/* columns [lo, hi) of the product (core/gemm.h's per-element recurrence
 * does not depend on N, so any split gives the same bits) */
static void gemm_cols(void *arg, int lo, int hi, float **s)
{
    (void)s;
    const gemm_arg *g = arg;
    if (hi > lo && g->bf16)
        nt__gemm_bf16(g->M, hi - lo, g->K, g->S, g->lds, false, NT_F32, g->B + lo, g->ldb, false,
                      NT_F32, g->C + lo, g->ldc, g->acc, false, NULL, NT_F32);
    else if (hi > lo)
        nt__gemm_ktile(g->M, hi - lo, g->K, g->S, g->lds, g->B + lo, g->ldb, g->C + lo, g->ldc,
                       g->acc);
}

/* TensorE operand format of a dtype (its row of nt_sim_config.tensor_rate),
 * -1 when TensorE does not multiply it. */
static int mm_format(nt_dtype dt)
{
    switch (dt) {
    case NT_F32: return NT_SIM_MM_F32;
    case NT_BF16:
    case NT_F16: return NT_SIM_MM_BF16;
    case NT_E4M3:
    case NT_E5M2: return NT_SIM_MM_FP8;
    default: return -1;
    }
}

/* nc_matmul's operand rules (after check_ap): the formats, the shapes;
 * the product's M and N */
static int mm_check(nt_sim_kernel *k, const char *I, const nt_ap *dst, const nt_ap *st_,
                    const nt_ap *mv, int64_t *Mp, int64_t *Np)
{
    int fmt = mm_format(st_->dtype);
    if (st_->dtype != mv->dtype || fmt < 0)
        return nt__sim_fail(k, I,
                            "stationary is %s, moving %s (rule: both f32, both bf16, both f16, "
                            "both e4m3 or both e5m2)",
                            dtn(st_->dtype), dtn(mv->dtype));
    if (dst->dtype != NT_F32)
        return nt__sim_fail(k, I, "dst is %s (rule: matmul writes f32 to PSUM)", dtn(dst->dtype));
    int K = st_->np;
    int64_t M = nt__sim_free_count(st_), N = nt__sim_free_count(mv);
    if (mv->np != K)
        return nt__sim_fail(k, I,
                            "stationary has %d partitions, moving %d (rule: both span the K "
                            "contraction partitions)",
                            K, mv->np);
    if (M > NT_SIM_MATMUL_MAX_M)
        return nt__sim_fail(k, I, "stationary free size %lld (rule: stationary free size <= 128)",
                            (long long)M);
    if (N > NT_SIM_MATMUL_MAX_N)
        return nt__sim_fail(k, I, "moving free size %lld (rule: moving free size <= 512)",
                            (long long)N);
    if (dst->np != M || nt__sim_free_count(dst) != N)
        return nt__sim_fail(k, I,
                            "dst is [%d, %lld] for a [%lld, %lld] product (rule: dst is "
                            "[stationary free, moving free])",
                            dst->np, (long long)nt__sim_free_count(dst), (long long)M,
                            (long long)N);
    if (!contiguous_row(dst))
        return nt__sim_fail(k, I, "dst free dims are strided (rule: matmul writes contiguous "
                                  "PSUM rows)");
    *Mp = M, *Np = N;
    return 0;
}

/* The instruction's timing entry: K contraction rows of M x N in format
 * fmt.  The target's rate for the operand format (nt_sim_config.tensor_rate):
 * below one MAC per processing element per cycle (f32, a quarter) the
 * moving data streams in several passes; above it (fp8 on v3) each element
 * takes more K rows in the same time (the double-row mode,
 * nt_isa_nc_matmul_dr), so an instruction costs what a bf16 one does and
 * the peak (tensor_peak_flops) doubles. */
static int mm_issue(nt_sim_kernel *k, const char *I, int fmt, int K, int64_t M, int64_t N,
                    const nt_ap *dst, const nt_ap *st_, const nt_ap *mv, bool accumulate)
{
    const nt_sim_config *c = &nt__sim.cfg;
    double rate = c->tensor_rate[fmt];
    double cyc = (double)(M < 64 ? M : 64);
    if ((double)N > cyc)
        cyc = (double)N;
    if (rate < 1.0)
        cyc /= rate;
    double flops = 2.0 * K * (double)M * (double)N;
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_TENSOR, .cycles = cyc, .flops = flops,
                        .act_table = -1};
    in.ideal_ns = flops / c->tensor_peak_flops[fmt] * 1e9;
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, accumulate};
    in.acc[in.nacc++] = (nt__sim_acc){"stationary", st_, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"moving", mv, false, false};
    return issue(k, &in);
}

/* The functional step: dst (+)= st^T . mv, K = st's partitions. */
static void mm_values(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *st_, const nt_ap *mv,
                      int64_t M, int64_t N, bool accumulate)
{
    nt__sim_fx_flush(k);
    /* operands as f32 matrices: SBUF itself when already f32 and contiguous,
     * else widened exactly into scratch */
    gemm_arg g = {.M = (int)M, .N = (int)N, .K = st_->np, .acc = accumulate,
                  .bf16 = st_->dtype == NT_BF16};
    g.S = as_matrix(st_, scr(k)[0], &g.lds);
    g.B = as_matrix(mv, scr(k)[1], &g.ldb);
    g.C = (float *)nt__sim_row(dst, 0);
    g.ldc = (int)(nt__sim.psum_stride / 4);
    /* one call: core/gemm.c spreads big calls over its own threads */
    double t0 = nt__sim_now_ns();
    gemm_cols(&g, 0, (int)N, NULL);
    k->gemm_ns += nt__sim_now_ns() - t0;
}

int nt_isa_nc_matmul(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *st_, const nt_ap *mv,
                     bool accumulate)
{
    const char *I = isa_kinds[K_NC_MATMUL].name;
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_PSUM, NT_ENGINE_TENSOR));
    TRY(check_ap(k, I, "stationary", st_, M_SBUF, NT_ENGINE_TENSOR));
    TRY(check_ap(k, I, "moving", mv, M_SBUF, NT_ENGINE_TENSOR));
    int64_t M, N;
    TRY(mm_check(k, I, dst, st_, mv, &M, &N));
    TRY(mm_issue(k, I, mm_format(st_->dtype), st_->np, M, N, dst, st_, mv, accumulate));
    if (k->functional)
        mm_values(k, dst, st_, mv, M, N, accumulate);
    return 0;
}

/* row r (0 or 1) of a double-row operand [K, 2, F]: [K, F] */
static nt_ap dr_half(const nt_ap *ap, int r)
{
    nt_ap h = *ap;
    h.ndim = ap->ndim - 1;
    for (int i = 0; i < h.ndim; i++)
        h.num[i] = ap->num[i + 1], h.step[i] = ap->step[i + 1];
    h.offset = ap->offset + r * ap->step[0];
    return h;
}

int nt_isa_nc_matmul_dr(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *st_, const nt_ap *mv,
                        bool accumulate)
{
    const char *I = isa_kinds[K_NC_MATMUL].name;
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_PSUM, NT_ENGINE_TENSOR));
    TRY(check_ap(k, I, "stationary", st_, M_SBUF, NT_ENGINE_TENSOR));
    TRY(check_ap(k, I, "moving", mv, M_SBUF, NT_ENGINE_TENSOR));
    if (st_->ndim < 2 || st_->num[0] != 2 || mv->ndim < 2 || mv->num[0] != 2)
        return nt__sim_fail(k, I, "double-row operands of %d and %d free dims (rule: stationary "
                            "[K, 2, M] and moving [K, 2, N])", st_->ndim, mv->ndim);
    if (!nt__dtype_is_fp8(st_->dtype))
        return nt__sim_fail(k, I, "double-row operands are %s (rule: the double-row mode "
                            "multiplies e4m3 or e5m2)", dtn(st_->dtype));
    if (nt__sim.cfg.tensor_rate[NT_SIM_MM_FP8] < 2.0)
        return nt__sim_fail(k, I, "the double-row mode on %s (rule: NeuronCore-v3's, "
                            "NT_SIM_TARGET=trn2)", nt__sim.cfg.name);
    nt_ap s0 = dr_half(st_, 0), s1 = dr_half(st_, 1), m0 = dr_half(mv, 0), m1 = dr_half(mv, 1);
    int64_t M, N;
    TRY(mm_check(k, I, dst, &s0, &m0, &M, &N));
    TRY(mm_check(k, I, dst, &s1, &m1, &M, &N));
    TRY(mm_issue(k, I, NT_SIM_MM_FP8, 2 * st_->np, M, N, dst, st_, mv, accumulate));
    /* the two row groups in order, each accumulated as nc_matmul does: the
     * bits of two nc_matmul instructions (the CPU's K-tile recurrence) */
    if (k->functional) {
        mm_values(k, dst, &s0, &m0, M, N, accumulate);
        mm_values(k, dst, &s1, &m1, M, N, true);
    }
    return 0;
}

int nt_isa_nc_transpose(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src)
{
    const char *I = isa_kinds[K_NC_TRANSPOSE].name;
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_PSUM, NT_ENGINE_TENSOR));
    TRY(check_ap(k, I, "src", src, M_SBUF, NT_ENGINE_TENSOR));
    int P = src->np;
    int64_t F = nt__sim_free_count(src);
    if (F > 128)
        return nt__sim_fail(k, I, "src free size %lld (rule: transpose of at most 128 x 128)",
                            (long long)F);
    if (dst->np != F || nt__sim_free_count(dst) != P)
        return nt__sim_fail(k, I,
                            "dst is [%d, %lld] for a [%d, %lld] src (rule: dst is [src free, "
                            "src partitions])",
                            dst->np, (long long)nt__sim_free_count(dst), P, (long long)F);
    if (dst->dtype != src->dtype && dst->dtype != NT_F32)
        return nt__sim_fail(k, I, "dst is %s, src %s (rule: dst has src's dtype or f32)",
                            dtn(dst->dtype), dtn(src->dtype));
    double cyc = F < 64 ? (double)F : 64.0;
    if (P > cyc)
        cyc = P;
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_TENSOR, .cycles = cyc, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    nt__sim_fx_flush(k);
    float *m = scr(k)[0], *col = scr(k)[1];
    fx_opnd s, d;
    opnd_init(&s, src);
    opnd_init(&d, dst);
    if (dst->dtype == src->dtype && s.esz == 4 && s.contig && d.contig) {
        /* 4-byte elements, rows contiguous on both sides (SBUF and PSUM
         * never overlap): straight from source rows into destination rows,
         * in 16 x 16 blocks */
        for (int p0 = 0; p0 < P; p0 += 16)
            for (int64_t f0 = 0; f0 < F; f0 += 16) {
                int pn = P - p0 < 16 ? P - p0 : 16;
                int64_t fn = F - f0 < 16 ? F - f0 : 16;
                for (int64_t f = f0; f < f0 + fn; f++) {
                    uint32_t *drow = (uint32_t *)lane_row(&d, (int)f);
                    for (int p = p0; p < p0 + pn; p++)
                        drow[p] = ((const uint32_t *)lane_row(&s, p))[f];
                }
            }
        return 0;
    }
    if (dst->dtype == src->dtype) {
        /* same dtype: pure data movement, bit for bit (ints too) */
        int64_t esz = s.esz;
        uint8_t *mb = (uint8_t *)m, *cb = (uint8_t *)col;
        for (int p = 0; p < P; p++)
            lane_bytes(&s, p, mb + (int64_t)p * F * esz, false);
        for (int64_t f = 0; f < F; f++) {
            if (esz == 4) {
                const uint32_t *m4 = (const uint32_t *)mb;
                uint32_t *c4 = (uint32_t *)cb;
                for (int p = 0; p < P; p++)
                    c4[p] = m4[(int64_t)p * F + f];
            } else if (esz == 2) {
                const uint16_t *m2 = (const uint16_t *)mb;
                uint16_t *c2 = (uint16_t *)cb;
                for (int p = 0; p < P; p++)
                    c2[p] = m2[(int64_t)p * F + f];
            } else {
                for (int p = 0; p < P; p++)
                    cb[p] = mb[(int64_t)p * F + f];
            }
            lane_bytes(&d, (int)f, cb, true);
        }
        return 0;
    }
    for (int p = 0; p < P; p++) {
        const float *r = ld_f32(&s, p, m + (int64_t)p * F);
        if (r != m + (int64_t)p * F)
            memcpy(m + (int64_t)p * F, r, (size_t)F * 4);
    }
    for (int64_t f = 0; f < F; f++) {
        for (int p = 0; p < P; p++)
            col[p] = m[(int64_t)p * F + f];
        st(&d, (int)f, col, NULL);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* VectorE / ScalarE / GpSimd                                               */
/* ------------------------------------------------------------------------ */

/* An ALU code the NKI ISA has (alu_nki). */
static int check_alu(nt_sim_kernel *k, const char *I, nt_alu_op op)
{
    if ((unsigned)op >= NT_ALU_COUNT || !alu_nki[op])
        return nt__sim_fail(k, I, "ALU op %d (rule: one of nt_alu_op, an operator of the NKI "
                                  "ISA)", (int)op);
    return 0;
}

/* Power runs on GpSimd only (nki.isa.tensor_tensor: "np.power/nl.power
 * that runs on the GpSimd Engine"): the default engine of an instruction
 * with a power step, and the rule. */
static nt_engine pow_engine(nt_alu_op a, nt_alu_op b)
{
    return a == NT_ALU_POW || b == NT_ALU_POW ? NT_ENGINE_GPSIMD : NT_ENGINE_VECTOR;
}

static int check_pow_engine(nt_sim_kernel *k, const char *I, int e, nt_alu_op a, nt_alu_op b)
{
    if ((a == NT_ALU_POW || b == NT_ALU_POW) && e != NT_ENGINE_GPSIMD)
        return nt__sim_fail(k, I, "op power on %s (rule: power runs on GpSimd only)",
                            nt_engine_name((nt_engine)e));
    return 0;
}

static bool is_f16ish(nt_dtype dt)
{
    return dt == NT_BF16 || dt == NT_F16;
}

static bool inner_contig(const nt_ap *ap)
{
    nt__sim_shape s;
    nt__sim_canon(ap, &s);
    return s.step[s.nd - 1] == 1;
}

/* NeuronCore-v3's VectorE performance mode (docs/sim.md, section 4): how
 * many times faster than on v2 a VectorE tensor_copy or tensor_scalar
 * (`copy`: a, no b) or tensor_tensor (a and b) runs, all operands bf16/f16:
 * copies 4x with both sides in SBUF and contiguous innermost dims, 2x when
 * not contiguous or when one side is in PSUM (contiguous); tensor_tensor 2x
 * with both inputs in SBUF.  1 on targets without the mode and on the other
 * engines. */
static double vec_speedup(int e, const nt_ap *dst, const nt_ap *a, const nt_ap *b)
{
    if (e != NT_ENGINE_VECTOR || !nt__sim.cfg.vector_perf_mode)
        return 1.0;
    if (!is_f16ish(dst->dtype) || !is_f16ish(a->dtype) || (b && !is_f16ish(b->dtype)))
        return 1.0;
    if (b)
        return mem_of(a) == NT_MEM_SBUF && mem_of(b) == NT_MEM_SBUF ? 2.0 : 1.0;
    bool contig = inner_contig(dst) && inner_contig(a);
    if (mem_of(a) == NT_MEM_SBUF && mem_of(dst) == NT_MEM_SBUF)
        return contig ? 4.0 : 2.0;
    return contig ? 2.0 : 1.0;
}

int nt_isa_tensor_tensor(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *a, const nt_ap *b,
                         nt_alu_op op, nt_engine engine)
{
    const char *I = isa_kinds[K_TENSOR_TENSOR].name;
    PROLOGUE(k);
    TRY(check_alu(k, I, op));
    int e = pick_engine(k, I, engine, pow_engine(op, op), ENG(VECTOR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_pow_engine(k, I, e, op, op));
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "a", a, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "b", b, M_SBUF | M_PSUM, e));
    if (mem_of(a) == NT_MEM_PSUM && mem_of(b) == NT_MEM_PSUM)
        return nt__sim_fail(k, I, "a and b are both in PSUM (rule: at most one input in PSUM)");
    TRY(check_same(k, I, "dst", dst, "a", a));
    TRY(check_same(k, I, "dst", dst, "b", b));
    int64_t N = nt__sim_free_count(dst);
    bool fast = mem_of(a) == NT_MEM_PSUM || mem_of(b) == NT_MEM_PSUM ||
                (a->dtype == NT_BF16 && b->dtype == NT_BF16 && dst->dtype == NT_BF16 &&
                 (op == NT_ALU_ADD || op == NT_ALU_SUB || op == NT_ALU_MUL));
    nt__sim_instr in = {.name = I, .engine = e,
                        .cycles = (fast ? (double)N : 2.0 * N) / vec_speedup(e, dst, a, b),
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"a", a, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"b", b, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_TT, .np = dst->np, .op = {op, NT_ALU_BYPASS}};
    r.ints = is_int(a->dtype) && is_int(b->dtype) && is_int(dst->dtype) && alu_int_ok(op);
    add_opnd(&r, dst);
    add_opnd(&r, a);
    add_opnd(&r, b);
    fx_submit(k, &r, true);
    return 0;
}

static bool imm_int(const nt_isa_alu *o)
{
    if (!o)
        return true;
    if (o->operand.ap)
        return is_int(o->operand.ap->dtype);
    float v = o->operand.imm;
    return v == truncf(v) && fabsf(v) < 2147483648.0f;
}

/* Copies a scalar operand into r (operand slot or immediate). */
static void set_scalar(fx_rec *r, int k, const nt_isa_scalar *s)
{
    if (s && s->ap)
        r->sc[k] = add_opnd(r, s->ap);
    else
        r->imm[k] = s ? s->imm : 0.0f;
}

int nt_isa_tensor_scalar(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                         const nt_isa_alu *op0, const nt_isa_alu *op1, nt_engine engine)
{
    const char *I = isa_kinds[K_TENSOR_SCALAR].name;
    PROLOGUE(k);
    if (!op0)
        return nt__sim_fail(k, I, "op0 is missing (rule: one or two ALU ops)");
    TRY(check_alu(k, I, op0->op));
    if (op1)
        TRY(check_alu(k, I, op1->op));
    nt_alu_op o1 = op1 ? op1->op : op0->op;
    int e = pick_engine(k, I, engine, pow_engine(op0->op, o1),
                        ENG(VECTOR) | ENG(SCALAR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_pow_engine(k, I, e, op0->op, o1));
    TRY(check_dst_src(k, I, dst, src, e));
    TRY(check_scalar(k, I, "operand0", &op0->operand, src, e));
    if (op1)
        TRY(check_scalar(k, I, "operand1", &op1->operand, src, e));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e,
                        .cycles = (double)N / vec_speedup(e, dst, src, NULL), .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    if (op0->operand.ap)
        in.acc[in.nacc++] = (nt__sim_acc){"operand0", op0->operand.ap, false, false};
    if (op1 && op1->operand.ap)
        in.acc[in.nacc++] = (nt__sim_acc){"operand1", op1->operand.ap, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_TS, .np = dst->np};
    r.ints = is_int(src->dtype) && is_int(dst->dtype) && alu_int_ok(op0->op) && imm_int(op0) &&
             (!op1 || (alu_int_ok(op1->op) && imm_int(op1)));
    add_opnd(&r, dst);
    add_opnd(&r, src);
    r.op[0] = op0->op;
    r.rev[0] = op0->reverse;
    set_scalar(&r, 0, &op0->operand);
    if (op1) {
        r.has_op1 = true;
        r.op[1] = op1->op;
        r.rev[1] = op1->reverse;
        set_scalar(&r, 1, &op1->operand);
    }
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_scalar_tensor_tensor(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                                const nt_isa_alu *op0, nt_alu_op op1, const nt_ap *b,
                                bool reverse1, nt_engine engine)
{
    const char *I = isa_kinds[K_STT].name;
    PROLOGUE(k);
    if (!op0)
        return nt__sim_fail(k, I, "op0 is missing (rule: an ALU step with its operand)");
    TRY(check_alu(k, I, op0->op));
    TRY(check_alu(k, I, op1));
    int e = pick_engine(k, I, engine, pow_engine(op0->op, op1), ENG(VECTOR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_pow_engine(k, I, e, op0->op, op1));
    TRY(check_dst_src(k, I, dst, src, e));
    TRY(check_scalar(k, I, "operand0", &op0->operand, src, e));
    TRY(check_ap(k, I, "b", b, M_SBUF | M_PSUM, e));
    if (mem_of(src) == NT_MEM_PSUM && mem_of(b) == NT_MEM_PSUM)
        return nt__sim_fail(k, I, "src and b are both in PSUM (rule: at most one input in PSUM)");
    TRY(check_same(k, I, "dst", dst, "b", b));
    int64_t N = nt__sim_free_count(dst);
    /* tensor_tensor's cost: the scalar step rides in the same pass */
    bool fast = mem_of(src) == NT_MEM_PSUM || mem_of(b) == NT_MEM_PSUM ||
                (src->dtype == NT_BF16 && b->dtype == NT_BF16 && dst->dtype == NT_BF16 &&
                 (op1 == NT_ALU_ADD || op1 == NT_ALU_SUB || op1 == NT_ALU_MUL));
    nt__sim_instr in = {.name = I, .engine = e, .cycles = fast ? (double)N : 2.0 * N,
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"b", b, false, false};
    if (op0->operand.ap)
        in.acc[in.nacc++] = (nt__sim_acc){"operand0", op0->operand.ap, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_STT, .np = dst->np};
    r.ints = is_int(src->dtype) && is_int(b->dtype) && is_int(dst->dtype) &&
             alu_int_ok(op0->op) && imm_int(op0) && alu_int_ok(op1);
    add_opnd(&r, dst);
    add_opnd(&r, src);
    add_opnd(&r, b); /* o[2], before the scalar's operand */
    r.op[0] = op0->op;
    r.rev[0] = op0->reverse;
    r.op[1] = op1;
    r.rev[1] = reverse1;
    set_scalar(&r, 0, &op0->operand);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_activation(nt_sim_kernel *k, const nt_ap *dst, nt_act_func func, const nt_ap *src,
                      const nt_isa_scalar *scale, const nt_isa_scalar *bias,
                      const nt_ap *reduce_dst)
{
    const char *I = isa_kinds[K_ACTIVATION].name;
    PROLOGUE(k);
    int e = NT_ENGINE_SCALAR;
    if ((unsigned)func >= NT_ACT_COUNT)
        return nt__sim_fail(k, I, "function %d (rule: one of nt_act_func)", (int)func);
    if (!act_nki[func])
        return nt__sim_fail(k, I, "function %s is not an activation function of the NKI ISA "
                                  "(rule: nki.isa.activation's table; -x is identity with "
                                  "scale -1)", act_names[func]);
    TRY(check_dst_src(k, I, dst, src, e));
    TRY(check_scalar(k, I, "scale", scale, src, e));
    TRY(check_scalar(k, I, "bias", bias, src, e));
    if (reduce_dst) {
        TRY(check_ap(k, I, "reduce_dst", reduce_dst, M_SBUF | M_PSUM, e));
        if (reduce_dst->np != src->np || nt__sim_free_count(reduce_dst) != 1)
            return nt__sim_fail(k, I, "reduce_dst is [%d, %lld] (rule: reduce_dst is [%d, 1])",
                                reduce_dst->np, (long long)nt__sim_free_count(reduce_dst),
                                src->np);
    }
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = (double)N + (reduce_dst ? 64.0 : 0.0),
                        .act_table = act_table_of(func)};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    if (scale && scale->ap)
        in.acc[in.nacc++] = (nt__sim_acc){"scale", scale->ap, false, false};
    if (bias && bias->ap)
        in.acc[in.nacc++] = (nt__sim_acc){"bias", bias->ap, false, false};
    if (reduce_dst)
        in.acc[in.nacc++] = (nt__sim_acc){"reduce_dst", reduce_dst, true, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_ACT, .np = dst->np, .func = func};
    add_opnd(&r, dst);
    add_opnd(&r, src);
    r.has_scale = scale != NULL;
    r.has_bias = bias != NULL;
    set_scalar(&r, 0, scale);
    set_scalar(&r, 1, bias);
    if (reduce_dst)
        r.red = add_opnd(&r, reduce_dst);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_tensor_reduce(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, nt_alu_op op,
                         int naxes)
{
    const char *I = isa_kinds[K_TENSOR_REDUCE].name;
    PROLOGUE(k);
    int e = NT_ENGINE_VECTOR;
    if (op != NT_ALU_ADD && op != NT_ALU_MAX && op != NT_ALU_MIN)
        return nt__sim_fail(k, I, "op %s (rule: add, maximum or minimum)", nt_alu_op_name(op));
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "src", src, M_SBUF | M_PSUM, e));
    if (naxes < 0 || naxes > src->ndim)
        return nt__sim_fail(k, I, "naxes %d for %d free dims (rule: 0 <= naxes <= ndim)", naxes,
                            src->ndim);
    if (naxes == 0)
        naxes = src->ndim;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < src->ndim; i++) {
        if (i < src->ndim - naxes)
            outer *= src->num[i];
        else
            inner *= src->num[i];
    }
    if (dst->np != src->np || nt__sim_free_count(dst) != outer)
        return nt__sim_fail(k, I,
                            "dst is [%d, %lld] (rule: dst is [%d, %lld], the dims left after "
                            "reducing the innermost %d)",
                            dst->np, (long long)nt__sim_free_count(dst), src->np,
                            (long long)outer, naxes);
    int64_t N = outer * inner;
    double cyc = (src->dtype == NT_BF16) ? N / 2.0 : (double)N;
    nt__sim_instr in = {.name = I, .engine = e, .cycles = cyc, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_RED, .np = dst->np, .op = {op, NT_ALU_BYPASS}, .outer = outer,
                .inner = inner};
    r.ints = is_int(src->dtype) && is_int(dst->dtype);
    add_opnd(&r, dst);
    add_opnd(&r, src);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_tensor_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, nt_engine engine)
{
    const char *I = isa_kinds[K_TENSOR_COPY].name;
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR,
                        ENG(VECTOR) | ENG(SCALAR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_dst_src(k, I, dst, src, e));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e,
                        .cycles = (double)N / vec_speedup(e, dst, src, NULL), .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_COPY, .np = dst->np, .ints = is_int(src->dtype)};
    add_opnd(&r, dst);
    add_opnd(&r, src);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_tensor_copy_sr(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, uint64_t key,
                          const nt_isa_index *index, nt_engine engine)
{
    const char *I = isa_kinds[K_TENSOR_COPY_SR].name;
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR,
                        ENG(VECTOR) | ENG(SCALAR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    if (!index)
        return nt__sim_fail(k, I, "index is missing");
    TRY(check_dst_src(k, I, dst, src, e));
    /* f32 -> bf16/f16, and f32/bf16/f16 -> fp8 (nt_cast_sr's pairs) */
    bool half_src = src->dtype == NT_BF16 || src->dtype == NT_F16;
    bool sr = (src->dtype == NT_F32 && (dst->dtype == NT_BF16 || dst->dtype == NT_F16)) ||
              ((src->dtype == NT_F32 || half_src) && nt__dtype_is_fp8(dst->dtype));
    if (!sr)
        return nt_isa_tensor_copy(k, dst, src, engine);
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = (double)N, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_COPY_SR, .np = dst->np, .index = *index, .key = key};
    add_opnd(&r, dst);
    add_opnd(&r, src);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_memset(nt_sim_kernel *k, const nt_ap *dst, double value, nt_engine engine)
{
    const char *I = isa_kinds[K_MEMSET].name;
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR, ENG(VECTOR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = (double)N, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_MEMSET, .np = dst->np, .ints = is_int(dst->dtype), .value = value};
    add_opnd(&r, dst);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_iota(nt_sim_kernel *k, const nt_ap *dst, const nt_isa_affine *expr)
{
    const char *I = isa_kinds[K_IOTA].name;
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_SBUF, NT_ENGINE_GPSIMD));
    if (!expr)
        return nt__sim_fail(k, I, "expr is missing");
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_GPSIMD, .cycles = 150.0 + N,
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_IOTA, .np = dst->np, .aff = *expr};
    add_opnd(&r, dst);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_affine_select(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *on_true,
                         const nt_isa_affine *pred, nt_alu_op cmp, float on_false)
{
    const char *I = isa_kinds[K_AFFINE_SELECT].name;
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_SBUF, NT_ENGINE_GPSIMD));
    TRY(check_ap(k, I, "on_true", on_true, M_SBUF, NT_ENGINE_GPSIMD));
    TRY(check_same(k, I, "dst", dst, "on_true", on_true));
    if (!pred)
        return nt__sim_fail(k, I, "pred is missing");
    /* the hardware's comparators of an affine value with 0 (KLR's
     * AffineSelectCmp): greater, greater_equal, equal, not_equal */
    if (cmp != NT_ALU_GT && cmp != NT_ALU_GE && cmp != NT_ALU_EQ && cmp != NT_ALU_NE)
        return nt__sim_fail(k, I, "cmp %s (rule: greater, greater_equal, equal or not_equal)",
                            nt_alu_op_name(cmp));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_GPSIMD, .cycles = 150.0 + N,
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"on_true", on_true, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_ASEL, .np = dst->np, .aff = *pred, .cmp = cmp, .on_false = on_false};
    add_opnd(&r, dst);
    add_opnd(&r, on_true);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_select(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *pred, const nt_ap *on_true,
                  const nt_ap *on_false, nt_engine engine)
{
    const char *I = isa_kinds[K_SELECT].name;
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR, ENG(VECTOR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "pred", pred, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "on_true", on_true, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "on_false", on_false, M_SBUF | M_PSUM, e));
    TRY(check_same(k, I, "dst", dst, "pred", pred));
    TRY(check_same(k, I, "dst", dst, "on_true", on_true));
    TRY(check_same(k, I, "dst", dst, "on_false", on_false));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = 2.0 * N, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"pred", pred, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"on_true", on_true, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"on_false", on_false, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_SEL, .np = dst->np};
    r.ints = is_int(dst->dtype) && is_int(on_true->dtype) && is_int(on_false->dtype);
    add_opnd(&r, dst);
    add_opnd(&r, pred);
    add_opnd(&r, on_true);
    add_opnd(&r, on_false);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_tensor_tensor_scan(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *data0,
                              const nt_ap *data1, const nt_isa_scalar *initial, nt_alu_op op0,
                              nt_alu_op op1)
{
    const char *I = isa_kinds[K_SCAN].name;
    PROLOGUE(k);
    int e = NT_ENGINE_VECTOR;
    TRY(check_alu(k, I, op0));
    TRY(check_alu(k, I, op1));
    if (op0 == NT_ALU_POW || op1 == NT_ALU_POW)
        return nt__sim_fail(k, I, "op power (rule: power runs on GpSimd only; the scan runs on "
                                  "VectorE)");
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "data0", data0, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "data1", data1, M_SBUF | M_PSUM, e));
    TRY(check_same(k, I, "dst", dst, "data0", data0));
    TRY(check_same(k, I, "dst", dst, "data1", data1));
    TRY(check_scalar(k, I, "initial", initial, dst, e));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = 2.0 * N, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"data0", data0, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"data1", data1, false, false};
    if (initial && initial->ap)
        in.acc[in.nacc++] = (nt__sim_acc){"initial", initial->ap, false, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    fx_rec r = {.kind = FX_SCAN, .np = dst->np, .op = {op0, op1}};
    add_opnd(&r, dst);
    add_opnd(&r, data0);
    add_opnd(&r, data1);
    set_scalar(&r, 0, initial);
    fx_submit(k, &r, true);
    return 0;
}

int nt_isa_gpsimd_custom(nt_sim_kernel *k, const char *name, const nt_ap *dst,
                         const nt_ap *const *src, int nsrc, double cycles_per_elem,
                         nt_gpsimd_fn fn, void *ctx)
{
    const char *I = isa_kinds[K_GPSIMD_CUSTOM].name;
    PROLOGUE(k);
    k->nopaque++; /* its code decides what it does */
    if (!fn)
        return nt__sim_fail(k, I, "fn is missing");
    if (nsrc < 0 || nsrc > 4 || (nsrc > 0 && !src))
        return nt__sim_fail(k, I, "%d sources (rule: 0 to 4)", nsrc);
    if (!dst && nsrc == 0)
        return nt__sim_fail(k, I, "no operands (rule: a dst or at least one src)");
    const nt_ap *all[5] = {0};
    int n = 0;
    if (dst)
        all[n++] = dst;
    for (int i = 0; i < nsrc; i++)
        all[n++] = src[i];
    for (int i = 0; i < n; i++) {
        const char *role = dst && i == 0 ? "dst" : "src";
        TRY(check_ap(k, I, role, all[i], M_SBUF, NT_ENGINE_GPSIMD));
        if (!contiguous_row(all[i]))
            return nt__sim_fail(k, I, "operand '%s' is strided (rule: custom operands are "
                                      "contiguous [np, n] patterns)", role);
    }
    int64_t N = nt__sim_free_count(all[0]);
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_GPSIMD,
                        .cycles = 150.0 + cycles_per_elem * (double)N,
                        .act_table = -1};
    for (int i = 0; i < n && in.nacc < NT__SIM_MAX_ACC; i++)
        in.acc[in.nacc++] = (nt__sim_acc){dst && i == 0 ? "dst" : "src", all[i],
                                          dst && i == 0, false};
    TRY(issue(k, &in));
    if (!k->functional)
        return 0;
    nt__sim_fx_flush(k);
    nt_gpsimd_operand ops[5];
    for (int i = 0; i < n; i++) {
        ops[i].data = nt__sim_row(all[i], 0);
        ops[i].pstride = nt__sim_pstride(all[i]);
        ops[i].dtype = all[i]->dtype;
        ops[i].np = all[i]->np;
        ops[i].n = nt__sim_free_count(all[i]);
    }
    char msg[256] = "";
    int rc = fn(dst ? &ops[0] : NULL, dst ? ops + 1 : ops, nsrc, ctx, msg, sizeof msg);
    if (rc) {
        if (rc > 0)
            rc = NT_EEXEC;
        nt__sim_fail(k, I, "'%s': %s", name ? name : "?", msg[0] ? msg : "failed");
        k->err = rc;
        return rc;
    }
    return 0;
}
