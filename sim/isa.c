/* sim/isa.c - the instructions: rule checks, cost, functional step.
 *
 * Every instruction (1) checks its operands against the hardware's rules,
 * (2) hands its cost and operands to the scheduler (core.c), which places it
 * on its engine's timeline after what it depends on, and (3) unless the
 * kernel is timing-only, computes its exact result at once.  Floating math is
 * done in f32 through core/ewise.h, core/nmath.h, core/reduce.h and
 * core/gemm.h -- the definitions the CPU backend uses -- and every computed
 * value reaches memory through round_store(), the one rounding point. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ewise.h"
#include "gemm.h"
#include "reduce.h"
#include "sim.h"

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

static const char *dtn(nt_dtype dt)
{
    static const char *n[] = {"f32", "bf16", "f16", "i32", "u8"};
    return (unsigned)dt < NT_DTYPE_COUNT ? n[dt] : "?";
}

static bool is_int(nt_dtype dt)
{
    return dt == NT_I32 || dt == NT_U8;
}

static bool is_cmp(nt_alu_op op)
{
    return op >= NT_ALU_EQ && op <= NT_ALU_GE;
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
    int64_t F = nt__sim_free_count(ap);
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
    if (ap->p0 < 0 || ap->p0 + ap->np > t->parts)
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
            return NT_EINVAL;      \
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
/* Rows: gather to f32, and the one rounding store                          */
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

static void cvt_in(float *o, const uint8_t *p, nt_dtype dt, int64_t n, int64_t st)
{
    switch (dt) {
    case NT_F32: {
        const float *x = (const float *)p;
        if (st == 1)
            memcpy(o, x, (size_t)n * 4);
        else
            for (int64_t i = 0; i < n; i++)
                o[i] = x[i * st];
        break;
    }
    case NT_BF16: {
        const uint16_t *x = (const uint16_t *)p;
        for (int64_t i = 0; i < n; i++)
            o[i] = nt__bf16_to_f32(x[i * st]);
        break;
    }
    case NT_F16: {
        const uint16_t *x = (const uint16_t *)p;
        for (int64_t i = 0; i < n; i++)
            o[i] = nt__f16_to_f32(x[i * st]);
        break;
    }
    case NT_I32: {
        const int32_t *x = (const int32_t *)p;
        for (int64_t i = 0; i < n; i++)
            o[i] = (float)x[i * st];
        break;
    }
    case NT_U8:
        for (int64_t i = 0; i < n; i++)
            o[i] = (float)p[i * st];
        break;
    default: break;
    }
}

/* Partition p of ap as f32, in row-major order of ap's free dims: a pointer
 * into memory when it already is contiguous f32, else converted into buf. */
static const float *ld_f32(const nt_ap *ap, int p, float *buf)
{
    int64_t num[4], step[4];
    shape4(ap, num, step);
    const uint8_t *row = nt__sim_row(ap, p);
    if (ap->dtype == NT_F32 && num[0] == 1 && num[1] == 1 && num[2] == 1 && step[3] == 1)
        return (const float *)row;
    int64_t esz = (int64_t)nt__dtype_size(ap->dtype);
    float *o = buf;
    for (int64_t a = 0; a < num[0]; a++)
        for (int64_t b = 0; b < num[1]; b++)
            for (int64_t c = 0; c < num[2]; c++) {
                int64_t off = a * step[0] + b * step[1] + c * step[2];
                cvt_in(o, row + off * esz, ap->dtype, num[3], step[3]);
                o += num[3];
            }
    return buf;
}

/* Partition p of ap as int32 (exact for i32/u8 tiles). */
static void ld_i32(const nt_ap *ap, int p, int32_t *o)
{
    int64_t num[4], step[4];
    shape4(ap, num, step);
    const uint8_t *row = nt__sim_row(ap, p);
    for (int64_t a = 0; a < num[0]; a++)
        for (int64_t b = 0; b < num[1]; b++)
            for (int64_t c = 0; c < num[2]; c++) {
                int64_t off = a * step[0] + b * step[1] + c * step[2];
                if (ap->dtype == NT_I32) {
                    const int32_t *x = (const int32_t *)row + off;
                    for (int64_t i = 0; i < num[3]; i++)
                        *o++ = x[i * step[3]];
                } else if (ap->dtype == NT_U8) {
                    const uint8_t *x = row + off;
                    for (int64_t i = 0; i < num[3]; i++)
                        *o++ = x[i * step[3]];
                } else {
                    for (int64_t i = 0; i < num[3]; i++)
                        *o++ = nt__load_i32(row, ap->dtype, off + i * step[3]);
                }
            }
}

static void out_f32(uint8_t *p, nt_dtype dt, const float *v, int64_t n, int64_t st)
{
    switch (dt) {
    case NT_F32: {
        float *x = (float *)p;
        if (st == 1)
            memmove(x, v, (size_t)n * 4);
        else
            for (int64_t i = 0; i < n; i++)
                x[i * st] = v[i];
        break;
    }
    case NT_BF16: {
        uint16_t *x = (uint16_t *)p;
        for (int64_t i = 0; i < n; i++)
            x[i * st] = nt__f32_to_bf16(v[i]);
        break;
    }
    case NT_F16: {
        uint16_t *x = (uint16_t *)p;
        for (int64_t i = 0; i < n; i++)
            x[i * st] = nt__f32_to_f16(v[i]);
        break;
    }
    case NT_I32: {
        int32_t *x = (int32_t *)p;
        for (int64_t i = 0; i < n; i++)
            x[i * st] = nt__f64_to_i32((double)v[i]);
        break;
    }
    case NT_U8:
        for (int64_t i = 0; i < n; i++)
            p[i * st] = nt__f64_to_u8((double)v[i]);
        break;
    default: break;
    }
}

static void out_i32(uint8_t *p, nt_dtype dt, const int32_t *v, int64_t n, int64_t st)
{
    if (dt == NT_I32) {
        int32_t *x = (int32_t *)p;
        for (int64_t i = 0; i < n; i++)
            x[i * st] = v[i];
    } else {
        /* u8 wraps; floats round once from the exact integer */
        for (int64_t i = 0; i < n; i++)
            nt__store_i32(p, dt, i * st, v[i]);
    }
}

/* THE rounding point of the simulator: writes partition p of ap from the
 * f32 values v (or the exact integers iv when v is NULL), rounding each
 * once to ap's dtype (nearest even; float->int truncates and saturates,
 * int->u8 wraps).  Every instruction that computes a value stores it here,
 * so stochastic rounding (a later issue) has one place to go. */
static void round_store(const nt_ap *ap, int p, const float *v, const int32_t *iv)
{
    int64_t num[4], step[4];
    shape4(ap, num, step);
    uint8_t *row = nt__sim_row(ap, p);
    int64_t esz = (int64_t)nt__dtype_size(ap->dtype);
    int64_t k = 0;
    for (int64_t a = 0; a < num[0]; a++)
        for (int64_t b = 0; b < num[1]; b++)
            for (int64_t c = 0; c < num[2]; c++) {
                int64_t off = a * step[0] + b * step[1] + c * step[2];
                if (v)
                    out_f32(row + off * esz, ap->dtype, v + k, num[3], step[3]);
                else
                    out_i32(row + off * esz, ap->dtype, iv + k, num[3], step[3]);
                k += num[3];
            }
}

static float scalar_at(const nt_isa_scalar *s, int p, float *tmp)
{
    if (!s->ap)
        return s->imm;
    return ld_f32(s->ap, p, tmp)[0];
}

static float **scr(void)
{
    return nt__sim.scratch;
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

/* The switch sits outside the loops so each loop vectorises. */
#define ALU_LOOPS(OUT, A, B, N)                                                              \
    switch (op) {                                                                            \
    case NT_ALU_ADD: for (int64_t i = 0; i < (N); i++) OUT = nt__ew_add(A, B); break;        \
    case NT_ALU_SUB: for (int64_t i = 0; i < (N); i++) OUT = nt__ew_sub(A, B); break;        \
    case NT_ALU_MUL: for (int64_t i = 0; i < (N); i++) OUT = nt__ew_mul(A, B); break;        \
    case NT_ALU_DIV: for (int64_t i = 0; i < (N); i++) OUT = nt__ew_div(A, B); break;        \
    case NT_ALU_MAX: for (int64_t i = 0; i < (N); i++) OUT = nt__ew_maximum(A, B); break;    \
    case NT_ALU_MIN: for (int64_t i = 0; i < (N); i++) OUT = nt__ew_minimum(A, B); break;    \
    default: for (int64_t i = 0; i < (N); i++) OUT = alu1(op, A, B); break;                  \
    }

static void alu_vv(nt_alu_op op, float *o, const float *a, const float *b, int64_t n)
{
    ALU_LOOPS(o[i], a[i], b[i], n)
}

static void alu_vs(nt_alu_op op, float *o, const float *a, float s, bool rev, int64_t n)
{
    if (rev) {
        ALU_LOOPS(o[i], s, a[i], n)
    } else {
        ALU_LOOPS(o[i], a[i], s, n)
    }
}

static bool alu_int_ok(nt_alu_op op)
{
    return op != NT_ALU_DIV && op != NT_ALU_POW;
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

/* ------------------------------------------------------------------------ */
/* dma_copy                                                                 */
/* ------------------------------------------------------------------------ */

/* Walks an access pattern as contiguous runs. */
typedef struct cursor {
    int64_t num[4], step[4], idx[4];
    uint8_t *row;
    int64_t esz;
} cursor;

static void cur_init(cursor *c, const nt_ap *ap, int p)
{
    shape4(ap, c->num, c->step);
    memset(c->idx, 0, sizeof c->idx);
    c->row = nt__sim_row(ap, p);
    c->esz = (int64_t)nt__dtype_size(ap->dtype);
}

static int64_t cur_run(const cursor *c)
{
    return c->step[3] == 1 ? c->num[3] - c->idx[3] : 1;
}

static uint8_t *cur_ptr(const cursor *c)
{
    int64_t off = 0;
    for (int i = 0; i < 4; i++)
        off += c->idx[i] * c->step[i];
    return c->row + off * c->esz;
}

static void cur_adv(cursor *c, int64_t n)
{
    c->idx[3] += n;
    for (int i = 3; i > 0 && c->idx[i] >= c->num[i]; i--) {
        c->idx[i] = 0;
        c->idx[i - 1]++;
    }
}

/* Contiguous run length (elements) a DMA descriptor can cover. */
static int64_t run_elems(const nt_ap *ap)
{
    nt__sim_shape s;
    nt__sim_canon(ap, &s);
    return s.step[s.nd - 1] == 1 ? s.num[s.nd - 1] : 1;
}

int nt_isa_dma_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, int queue)
{
    static const char *I = "dma_copy";
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
    int64_t run = run_elems(src), rd = run_elems(dst);
    if (rd < run)
        run = rd;
    int64_t run_bytes = run * esz;
    double cost = bytes;
    int64_t mind = nt__sim.cfg.dma_min_descriptor_bytes;
    if (run_bytes < mind) /* every descriptor costs at least `mind` bytes */
        cost = (double)src->np * (double)((F + run - 1) / run) * (double)mind;

    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_DMA, .queue = queue, .dma_bytes = bytes,
                        .dma_cost_bytes = cost, .dma_parts = src->np, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    if (!src->tile)
        in.hbm_rd = (uint64_t)bytes;
    if (!dst->tile)
        in.hbm_wr = (uint64_t)bytes;
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;

    for (int p = 0; p < src->np; p++) {
        cursor a, b;
        cur_init(&a, src, p);
        cur_init(&b, dst, p);
        if (a.step[3] == 1 && b.step[3] == 1 && a.num[3] == F && b.num[3] == F) {
            memmove(b.row, a.row, (size_t)(F * esz));
            continue;
        }
        for (int64_t left = F; left > 0;) {
            int64_t n = cur_run(&a), nb = cur_run(&b);
            if (nb < n)
                n = nb;
            if (n > left)
                n = left;
            memmove(cur_ptr(&b), cur_ptr(&a), (size_t)(n * esz));
            cur_adv(&a, n);
            cur_adv(&b, n);
            left -= n;
        }
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

int nt_isa_nc_matmul(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *st, const nt_ap *mv,
                     bool accumulate)
{
    static const char *I = "nc_matmul";
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_PSUM, NT_ENGINE_TENSOR));
    TRY(check_ap(k, I, "stationary", st, M_SBUF, NT_ENGINE_TENSOR));
    TRY(check_ap(k, I, "moving", mv, M_SBUF, NT_ENGINE_TENSOR));
    if (st->dtype != mv->dtype || !nt__dtype_is_float(st->dtype))
        return nt__sim_fail(k, I,
                            "stationary is %s, moving %s (rule: both f32, both bf16 or both f16)",
                            dtn(st->dtype), dtn(mv->dtype));
    if (dst->dtype != NT_F32)
        return nt__sim_fail(k, I, "dst is %s (rule: matmul writes f32 to PSUM)", dtn(dst->dtype));
    int K = st->np;
    int64_t M = nt__sim_free_count(st), N = nt__sim_free_count(mv);
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

    bool f32 = st->dtype == NT_F32;
    double cyc = (double)(M < 64 ? M : 64);
    if ((double)N > cyc)
        cyc = (double)N;
    if (f32)
        cyc *= 4.0; /* fp32 streams at a quarter of the rate */
    const nt_sim_config *c = &nt__sim.cfg;
    double flops = 2.0 * K * (double)M * (double)N;
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_TENSOR, .cycles = cyc, .flops = flops,
                        .act_table = -1};
    in.ideal_ns = flops / (f32 ? c->tensor_peak_flops_f32 : c->tensor_peak_flops_bf16) * 1e9;
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, accumulate};
    in.acc[in.nacc++] = (nt__sim_acc){"stationary", st, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"moving", mv, false, false};
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;

    /* operands as f32 matrices: SBUF itself when already f32 and contiguous,
     * else widened exactly into scratch */
    const float *S, *B;
    int lds, ldb;
    if (f32 && contiguous_row(st)) {
        S = (const float *)nt__sim_row(st, 0);
        lds = (int)(nt__sim.sbuf_stride / 4);
    } else {
        float *w = scr()[0];
        for (int p = 0; p < K; p++) {
            const float *r = ld_f32(st, p, w + (int64_t)p * M);
            if (r != w + (int64_t)p * M)
                memcpy(w + (int64_t)p * M, r, (size_t)M * 4);
        }
        S = w;
        lds = (int)M;
    }
    if (f32 && contiguous_row(mv)) {
        B = (const float *)nt__sim_row(mv, 0);
        ldb = (int)(nt__sim.sbuf_stride / 4);
    } else {
        float *w = scr()[1];
        for (int p = 0; p < K; p++) {
            const float *r = ld_f32(mv, p, w + (int64_t)p * N);
            if (r != w + (int64_t)p * N)
                memcpy(w + (int64_t)p * N, r, (size_t)N * 4);
        }
        B = w;
        ldb = (int)N;
    }
    nt__gemm_ktile((int)M, (int)N, K, S, lds, B, ldb, (float *)nt__sim_row(dst, 0),
                   (int)(nt__sim.psum_stride / 4), accumulate);
    return 0;
}

int nt_isa_nc_transpose(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src)
{
    static const char *I = "nc_transpose";
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
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;
    float *m = scr()[0], *col = scr()[1];
    for (int p = 0; p < P; p++) {
        const float *r = ld_f32(src, p, m + (int64_t)p * F);
        if (r != m + (int64_t)p * F)
            memcpy(m + (int64_t)p * F, r, (size_t)F * 4);
    }
    for (int64_t f = 0; f < F; f++) {
        for (int p = 0; p < P; p++)
            col[p] = m[(int64_t)p * F + f];
        round_store(dst, (int)f, col, NULL);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* VectorE / ScalarE / GpSimd                                               */
/* ------------------------------------------------------------------------ */

int nt_isa_tensor_tensor(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *a, const nt_ap *b,
                         nt_alu_op op, nt_engine engine)
{
    static const char *I = "tensor_tensor";
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR, ENG(VECTOR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    if ((unsigned)op >= NT_ALU_COUNT)
        return nt__sim_fail(k, I, "ALU op %d (rule: one of nt_alu_op)", (int)op);
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
    nt__sim_instr in = {.name = I, .engine = e, .cycles = fast ? (double)N : 2.0 * N,
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"a", a, false, false};
    in.acc[in.nacc++] = (nt__sim_acc){"b", b, false, false};
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;

    float **s = scr();
    if (is_int(a->dtype) && is_int(b->dtype) && is_int(dst->dtype) && alu_int_ok(op)) {
        int32_t *x = (int32_t *)s[0], *y = (int32_t *)s[1], *o = (int32_t *)s[2];
        for (int p = 0; p < dst->np; p++) {
            ld_i32(a, p, x);
            ld_i32(b, p, y);
            for (int64_t i = 0; i < N; i++)
                o[i] = alui1(op, x[i], y[i]);
            round_store(dst, p, NULL, o);
        }
        return 0;
    }
    for (int p = 0; p < dst->np; p++) {
        const float *x = ld_f32(a, p, s[0]);
        const float *y = ld_f32(b, p, s[1]);
        alu_vv(op, s[2], x, y, N);
        round_store(dst, p, s[2], NULL);
    }
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

int nt_isa_tensor_scalar(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src,
                         const nt_isa_alu *op0, const nt_isa_alu *op1, nt_engine engine)
{
    static const char *I = "tensor_scalar";
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR,
                        ENG(VECTOR) | ENG(SCALAR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    if (!op0)
        return nt__sim_fail(k, I, "op0 is missing (rule: one or two ALU ops)");
    if ((unsigned)op0->op >= NT_ALU_COUNT || (op1 && (unsigned)op1->op >= NT_ALU_COUNT))
        return nt__sim_fail(k, I, "bad ALU op (rule: one of nt_alu_op)");
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "src", src, M_SBUF | M_PSUM, e));
    TRY(check_same(k, I, "dst", dst, "src", src));
    TRY(check_scalar(k, I, "operand0", &op0->operand, src, e));
    if (op1)
        TRY(check_scalar(k, I, "operand1", &op1->operand, src, e));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = (double)N, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    if (op0->operand.ap)
        in.acc[in.nacc++] = (nt__sim_acc){"operand0", op0->operand.ap, false, false};
    if (op1 && op1->operand.ap)
        in.acc[in.nacc++] = (nt__sim_acc){"operand1", op1->operand.ap, false, false};
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;

    float **s = scr();
    float tmp[4];
    if (is_int(src->dtype) && is_int(dst->dtype) && alu_int_ok(op0->op) && imm_int(op0) &&
        (!op1 || (alu_int_ok(op1->op) && imm_int(op1)))) {
        int32_t *x = (int32_t *)s[0];
        for (int p = 0; p < dst->np; p++) {
            ld_i32(src, p, x);
            const nt_isa_alu *ops[2] = {op0, op1};
            for (int j = 0; j < 2 && ops[j]; j++) {
                int32_t sv;
                if (ops[j]->operand.ap)
                    ld_i32(ops[j]->operand.ap, p, &sv);
                else
                    sv = (int32_t)ops[j]->operand.imm;
                nt_alu_op op = ops[j]->op;
                if (ops[j]->reverse)
                    for (int64_t i = 0; i < N; i++)
                        x[i] = alui1(op, sv, x[i]);
                else
                    for (int64_t i = 0; i < N; i++)
                        x[i] = alui1(op, x[i], sv);
            }
            round_store(dst, p, NULL, x);
        }
        return 0;
    }
    for (int p = 0; p < dst->np; p++) {
        const float *x = ld_f32(src, p, s[0]);
        alu_vs(op0->op, s[1], x, scalar_at(&op0->operand, p, tmp), op0->reverse, N);
        if (op1)
            alu_vs(op1->op, s[1], s[1], scalar_at(&op1->operand, p, tmp), op1->reverse, N);
        round_store(dst, p, s[1], NULL);
    }
    return 0;
}

/* canonical-order reduction of one run (core/reduce.h): a run of at most
 * NT_RED_BLOCK is one block; longer runs add the block partials in order */
static float reduce_run(nt_alu_op op, const float *x, int64_t n)
{
    if (op == NT_ALU_MAX)
        return n <= NT_RED_BLOCK ? nt__red_block_max_f32(x, n, 1) : nt__red_max_f32(x, n, 1);
    return n <= NT_RED_BLOCK ? nt__red_block_sum_f32(x, n, 1) : nt__red_sum_f32(x, n, 1);
}

/* ScalarE function tables: -1 = needs none; a change costs a table load. */
static int act_table_of(nt_act_func f)
{
    switch (f) {
    case NT_ACT_IDENTITY:
    case NT_ACT_RELU:
    case NT_ACT_ABS:
    case NT_ACT_NEG:
    case NT_ACT_SQUARE: return -1;
    default: return (int)f;
    }
}

static void act_apply(nt_act_func f, float *y, const float *x, int64_t n)
{
#define ACT_LOOP(F) for (int64_t i = 0; i < n; i++) y[i] = F(x[i]); break;
    switch (f) {
    case NT_ACT_IDENTITY: if (y != x) memcpy(y, x, (size_t)n * 4); break;
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
    case NT_ACT_NEG: ACT_LOOP(nt__ew_neg)
    case NT_ACT_SQUARE: for (int64_t i = 0; i < n; i++) y[i] = nt__ew_mul(x[i], x[i]); break;
    default: break;
    }
#undef ACT_LOOP
}

int nt_isa_activation(nt_sim_kernel *k, const nt_ap *dst, nt_act_func func, const nt_ap *src,
                      const nt_isa_scalar *scale, const nt_isa_scalar *bias,
                      const nt_ap *reduce_dst)
{
    static const char *I = "activation";
    PROLOGUE(k);
    int e = NT_ENGINE_SCALAR;
    if ((unsigned)func >= NT_ACT_COUNT)
        return nt__sim_fail(k, I, "function %d (rule: one of nt_act_func)", (int)func);
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "src", src, M_SBUF | M_PSUM, e));
    TRY(check_same(k, I, "dst", dst, "src", src));
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
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;

    float **s = scr();
    float tmp[4];
    for (int p = 0; p < dst->np; p++) {
        const float *x = ld_f32(src, p, s[0]);
        /* absent scale/bias are skipped, not applied as *1 and +0: x*1+0
         * would turn -0 into +0 */
        if (scale) {
            float sc = scalar_at(scale, p, tmp);
            for (int64_t i = 0; i < N; i++)
                s[1][i] = nt__ew_mul(x[i], sc);
            x = s[1];
        }
        if (bias) {
            float bi = scalar_at(bias, p, tmp);
            for (int64_t i = 0; i < N; i++)
                s[1][i] = nt__ew_add(x[i], bi);
            x = s[1];
        }
        act_apply(func, s[2], x, N);
        round_store(dst, p, s[2], NULL);
        if (reduce_dst) {
            float r = reduce_run(NT_ALU_ADD, s[2], N);
            round_store(reduce_dst, p, &r, NULL);
        }
    }
    return 0;
}

int nt_isa_tensor_reduce(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, nt_alu_op op,
                         int naxes)
{
    static const char *I = "tensor_reduce";
    PROLOGUE(k);
    int e = NT_ENGINE_VECTOR;
    if (op != NT_ALU_ADD && op != NT_ALU_MAX)
        return nt__sim_fail(k, I, "op %s (rule: add or maximum)", nt_alu_op_name(op));
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
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;

    float **s = scr();
    if (is_int(src->dtype) && is_int(dst->dtype)) {
        int32_t *x = (int32_t *)s[0], *o = (int32_t *)s[1];
        for (int p = 0; p < dst->np; p++) {
            ld_i32(src, p, x);
            for (int64_t j = 0; j < outer; j++) {
                if (op == NT_ALU_ADD) {
                    o[j] = nt__red_sum_i32(x + j * inner, inner, 1);
                } else {
                    int32_t m = x[j * inner];
                    for (int64_t i = 1; i < inner; i++)
                        m = nt__ewi_maximum(m, x[j * inner + i]);
                    o[j] = m;
                }
            }
            round_store(dst, p, NULL, o);
        }
        return 0;
    }
    for (int p = 0; p < dst->np; p++) {
        const float *x = ld_f32(src, p, s[0]);
        for (int64_t j = 0; j < outer; j++)
            s[1][j] = reduce_run(op, x + j * inner, inner);
        round_store(dst, p, s[1], NULL);
    }
    return 0;
}

int nt_isa_tensor_copy(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *src, nt_engine engine)
{
    static const char *I = "tensor_copy";
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR,
                        ENG(VECTOR) | ENG(SCALAR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    TRY(check_ap(k, I, "src", src, M_SBUF | M_PSUM, e));
    TRY(check_same(k, I, "dst", dst, "src", src));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = (double)N, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"src", src, false, false};
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;
    float **s = scr();
    for (int p = 0; p < dst->np; p++) {
        if (is_int(src->dtype)) {
            /* exact integers: ints wrap into u8, floats round once */
            ld_i32(src, p, (int32_t *)s[0]);
            round_store(dst, p, NULL, (const int32_t *)s[0]);
        } else {
            const float *x = ld_f32(src, p, s[0]);
            if (x != s[0] && src->tile == dst->tile) {
                /* src may overlap dst in another dtype: read it all first */
                memcpy(s[0], x, (size_t)N * 4);
                x = s[0];
            }
            round_store(dst, p, x, NULL);
        }
    }
    return 0;
}

int nt_isa_memset(nt_sim_kernel *k, const nt_ap *dst, double value, nt_engine engine)
{
    static const char *I = "memset";
    PROLOGUE(k);
    int e = pick_engine(k, I, engine, NT_ENGINE_VECTOR, ENG(VECTOR) | ENG(GPSIMD));
    if (e < 0)
        return k->err;
    TRY(check_ap(k, I, "dst", dst, M_SBUF | M_PSUM, e));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = e, .cycles = (double)N, .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;
    float **s = scr();
    if (is_int(dst->dtype)) {
        int32_t *v = (int32_t *)s[0], x = nt__f64_to_i32(value);
        for (int64_t i = 0; i < N; i++)
            v[i] = x;
        for (int p = 0; p < dst->np; p++)
            round_store(dst, p, NULL, v);
    } else {
        float x = (float)value;
        for (int64_t i = 0; i < N; i++)
            s[0][i] = x;
        for (int p = 0; p < dst->np; p++)
            round_store(dst, p, s[0], NULL);
    }
    return 0;
}

/* Affine values of partition p in row-major order of ap's own free dims. */
static void affine_row(const nt_ap *ap, const nt_isa_affine *x, int p, int32_t *o)
{
    int64_t num[4] = {1, 1, 1, 1};
    uint32_t st[4] = {0, 0, 0, 0};
    int pad = 4 - ap->ndim;
    for (int i = 0; i < ap->ndim; i++) {
        num[pad + i] = ap->num[i];
        st[pad + i] = (uint32_t)x->step[i];
    }
    /* 32-bit wrapping integer math, as on the engine */
    uint32_t base = (uint32_t)x->offset + (uint32_t)x->channel_multiplier * (uint32_t)p;
    int64_t n = 0;
    for (int64_t a = 0; a < num[0]; a++)
        for (int64_t b = 0; b < num[1]; b++)
            for (int64_t c = 0; c < num[2]; c++) {
                uint32_t v = base + (uint32_t)a * st[0] + (uint32_t)b * st[1] + (uint32_t)c * st[2];
                for (int64_t d = 0; d < num[3]; d++)
                    o[n++] = (int32_t)(v + (uint32_t)d * st[3]);
            }
}

int nt_isa_iota(nt_sim_kernel *k, const nt_ap *dst, const nt_isa_affine *expr)
{
    static const char *I = "iota";
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_SBUF, NT_ENGINE_GPSIMD));
    if (!expr)
        return nt__sim_fail(k, I, "expr is missing");
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_GPSIMD, .cycles = 150.0 + N,
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;
    int32_t *v = (int32_t *)scr()[0];
    for (int p = 0; p < dst->np; p++) {
        affine_row(dst, expr, p, v);
        round_store(dst, p, NULL, v);
    }
    return 0;
}

int nt_isa_affine_select(nt_sim_kernel *k, const nt_ap *dst, const nt_ap *on_true,
                         const nt_isa_affine *pred, nt_alu_op cmp, float on_false)
{
    static const char *I = "affine_select";
    PROLOGUE(k);
    TRY(check_ap(k, I, "dst", dst, M_SBUF, NT_ENGINE_GPSIMD));
    TRY(check_ap(k, I, "on_true", on_true, M_SBUF, NT_ENGINE_GPSIMD));
    TRY(check_same(k, I, "dst", dst, "on_true", on_true));
    if (!pred)
        return nt__sim_fail(k, I, "pred is missing");
    if (!is_cmp(cmp))
        return nt__sim_fail(k, I, "cmp %s (rule: a comparison op)", nt_alu_op_name(cmp));
    int64_t N = nt__sim_free_count(dst);
    nt__sim_instr in = {.name = I, .engine = NT_ENGINE_GPSIMD, .cycles = 150.0 + N,
                        .act_table = -1};
    in.acc[in.nacc++] = (nt__sim_acc){"dst", dst, true, false};
    in.acc[in.nacc++] = (nt__sim_acc){"on_true", on_true, false, false};
    nt__sim_issue(k, &in);
    if (!k->functional)
        return 0;
    float **s = scr();
    int32_t *v = (int32_t *)s[1];
    for (int p = 0; p < dst->np; p++) {
        const float *x = ld_f32(on_true, p, s[0]);
        affine_row(dst, pred, p, v);
        for (int64_t i = 0; i < N; i++)
            s[2][i] = alui1(cmp, v[i], 0) ? x[i] : on_false;
        round_store(dst, p, s[2], NULL);
    }
    return 0;
}
