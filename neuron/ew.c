/* neuron/ew.c - elementwise programs on the simulator.
 *
 * One executor runs every elementwise kernel: an eager op (unary, scalar,
 * binary, compare, where, copy/cast, fill, the backward helpers) is a
 * program of one op, and the fusion engine's programs (fusion/fusion.h) run
 * whole:
 *
 *   EW   tiles of the iteration space ([<=128 partitions, F] each, any
 *        strides and broadcasting through the DMA patterns); per tile: DMA
 *        the external inputs in once, run every op on SBUF tiles, DMA out
 *        only the values the planner marked stored.
 *   ROW  one row per partition (the full last dim on the free axis); sum /
 *        max / mean of a row are tensor_reduce into [np, 1] tiles, ops with
 *        per-row operands read them as per-partition scalars or step-0
 *        patterns.
 *   MM   the matmul program (matmul.c) with an epilogue: each accumulator
 *        block is rounded to the matmul's dtype as it leaves PSUM and the
 *        elementwise ops run on it before anything is stored.
 *
 * Exactness (the CPU executor cpu/fused.c is the reference): every
 * value lives in an SBUF tile of the dtype its op would have stored, so
 * writing it rounds exactly there, and reading it widens exactly as the
 * unfused kernel's load would; an op whose CPU definition is not one ALU or
 * activation step runs as several instructions on f32 temporaries, in the
 * CPU's order (docs/sim.md lists them).  Values get SBUF tiles from a
 * register allocator (a value's tile is reused once its last reader ran),
 * two register sets alternate between tiles so DMA overlaps compute. */
#include "neuron/sk.h"
#include "sim/sim.h"

#include <stddef.h>
#include <string.h>

#include "core/ewise.h"

/* Free elements per partition of an EW tile (a power of two; smaller when
 * two register sets would not fit SBUF).  Measured on the 8-op chain of
 * bench/fusion: [128, 8192] tiles run the functional simulator ~25% faster
 * than [128, 2048] ones (a quarter of the instructions to issue, time and
 * dispatch per partition) although a row no longer stays in L1 (docs/sim.md). */
#define EW_FMAX 8192
#define EW_FMIN 512 /* 2 KiB per partition in f32: an efficient DMA */
#define EW_TILES 16 /* tiles a big elementwise program is cut into, at least */
#define EW_NBUF 6   /* register sets in flight, at most: two pairs of tiles */
#define NT_F_MAXREG 48
/* epilogue register sets of an MM program, at most: an accumulator block's
 * epilogue loads (AdamW's parameter and moments) then run ahead of the
 * blocks still computing and storing instead of waiting for the block
 * before the last to have stored (two sets: the W1 gradient + AdamW kernel
 * took 158 us, its ops alone 78 us of VectorE) */
#define MM_NBUF EW_NBUF
/* ... and of one whose epilogue writes what it reads (AdamW's p, m, v in
 * place, issued one block late): the blocks' loads run further ahead of a
 * kernel bound by VectorE while its product waits for its operands (the
 * main job's MLP, captured: eight sets 0.2734 ms a step, six 0.2778) */
#define MM_NBUF_LAG 8
#define NBUF_MAX MM_NBUF_LAG

static bool isf(nt_dtype dt) { return nt__dtype_is_float(dt); }

/* Integer dtypes whose same-dtype tensor_copy moves the bits (the exact
 * int32 forms; no NaN to make canonical). */
static bool bc_int(nt_dtype dt) { return dt == NT_I32 || dt == NT_U8; }

static int64_t ap_count(const nt_ap *a)
{
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        n *= a->num[i];
    return n;
}

/* ---------------- op -> instructions ---------------- */

/* The sim column of core/optable.h: which instruction runs each op. */
static const int sim_of[NT_OP_COUNT] = {
#define NT__SIM_COL(ID, name, nin, kind, flags, ints, amp, bwd, save, sim) [NT_OP_##ID] = (sim),
    NT_OP_TABLE(NT__SIM_COL)
#undef NT__SIM_COL
};

/* A unary op's activation function (an NKI one: sim column >= 0). */
static nt_act_func act_of(int op)
{
    int f = sim_of[op];
    if (f < 0 || nt__ops[op].kind != NT_KIND_UNARY)
        nt__op_unhandled("sim act_of", op);
    return (nt_act_func)f;
}

/* A binary or compare op's ALU step; -1 for the ones with a sequence
 * (NT__SIM_SEQ: the backward helpers). */
static int alu_of(int op)
{
    int f = sim_of[op];
    if (f == NT__SIM_SEQ)
        return -1;
    if (f < 0)
        nt__op_unhandled("sim alu_of", op);
    return f;
}

/* The engine of an ALU step: power runs on GpSimd only (sim/isa.c). */
static nt_engine alu_eng(sk_k *s, nt_alu_op op, const nt_ap *dst)
{
    return op == NT_ALU_POW ? NT_ENGINE_GPSIMD : sk_eng_ap(s, dst);
}

static nt_engine tt_eng(nt_alu_op op)
{
    return op == NT_ALU_POW ? NT_ENGINE_GPSIMD : NT_ENGINE_VECTOR;
}

/* The value memset must be given so that it stores what nt__store_f64
 * stores: memset rounds (float)value to the tile, so half and fp8 types get
 * the round-to-odd f32 (one correct rounding), u8 the saturated value. */
static double memset_value(nt_dtype dt, double v)
{
    switch (dt) {
    case NT_BF16:
    case NT_F16:
    case NT_E4M3:
    case NT_E5M2: return (double)nt__f64_to_f32_odd(v);
    case NT_U8: return (double)nt__f64_to_u8(v);
    default: return v;
    }
}

/* Does op `o` (with operand dtypes) need the f32/i32 temporaries, and
 * which constants?  Constants live in [128, 2] tiles per op, set once;
 * NEED_CK: the kernel's 0 and 1 (one [128, 2] tile); NEED_TF4: four f32
 * temporaries instead of two. */
enum { NEED_TF = 1, NEED_TI = 2, NEED_CF = 4, NEED_CI = 8, NEED_CK = 16, NEED_TF4 = 32 };

static bool gp_op(int op); /* the ops GpSimd computes (issue 34, below) */

/* UNARY_BWD's sequence for forward op f (emit_unary_bwd) */
static unsigned unary_bwd_needs(int f)
{
    switch (f) {
    case NT_OP_SOFTPLUS: return NEED_TF | NEED_CK;
    case NT_OP_MISH:
    case NT_OP_GELU_TANH: return NEED_TF | NEED_TF4;
    default: return NEED_TF;
    }
}

static unsigned op_needs(const nt__fop *o, bool fc)
{
    switch (nt__ops[o->op].kind) {
    case NT_KIND_UNARY: /* int abs = max(a, -a); softsign's |x| + 1 */
        if (!fc)
            return nt__op_prim(o->op) == NT__PRIM_ABS ? NEED_TI : 0;
        return o->op == NT_OP_SOFTSIGN || gp_op(o->op) ? NEED_TF : 0;
    case NT_KIND_SCALAR: /* int forms read their scalars from i32 constants */
        if (!fc)
            return NEED_CI;
        return o->op == NT_OP_LEAKY_RELU ? NEED_TF : 0;
    case NT_KIND_BINARY: /* the helpers' sequences: f32 temporaries (relu_bwd's 0) */
        if (sim_of[o->op] != NT__SIM_SEQ)
            return 0;
        if (o->op == NT_OP_UNARY_BWD)
            return unary_bwd_needs((int)o->p.i[0]);
        if (o->op == NT_OP_BINARY_DX)
            return NEED_TF | NEED_CK;
        if (gp_op(o->op)) /* atan2, fmod: temporaries for broadcast operands */
            return NEED_TF | NEED_TI;
        return o->op == NT_OP_RELU_BWD ? NEED_TF | NEED_CF : NEED_TF;
    default: return 0; /* copies, fills, compare, where, row reductions */
    }
}

/* An operand as an op sees it. */
typedef struct sk_arg {
    nt_ap ap;   /* [np, nf] (step 0 along the free axis for a per-row value) */
    nt_ap col;  /* per-row values: the [np, 1] pattern */
    nt_dtype dt;
    bool red;
} sk_arg;

typedef struct emit_ctx {
    sk_k *s;
    int np;
    int64_t nf;
    nt_tile *tf[4], *ti;   /* f32 temporaries (2 or 4), i32 temporary */
    nt_tile *cf, *ci;      /* constants [128, 2 * nops] */
    nt_tile *ck;           /* the kernel's 0 and 1 [128, 2] (NEED_CK) */
    /* stochastic-rounding casts: their keys (per op), and the output
     * element index of the tile's positions: idx over the free dims
     * idx_num (full values), idxr for per-row values */
    const uint64_t *keys;
    nt_isa_index idx, idxr;
    int idx_ndim;
    int64_t idx_num[NT_AP_MAX_DIMS];
} emit_ctx;

static bool is_sr(const nt__fop *o)
{
    return o->op == NT_OP_CAST && (o->p.flag & NT__CAST_SR);
}

static bool prog_has_sr(const nt__fprog *P)
{
    for (int k = 0; k < P->nops; k++)
        if (is_sr(&P->ops[k]))
            return true;
    return false;
}

/* An HBM "view" with no data: the contiguous strides of (nd, shape), whose
 * tile patterns are the output element indices of the tile's positions. */
static void index_view(sk_hv *v, int nd, const int64_t *shape)
{
    v->base = NULL;
    v->dt = NT_F32;
    nt__contig_strides(nd, shape, v->st);
}

static void set_index(emit_ctx *E, const nt_ap *a)
{
    E->idx.offset = a->offset;
    E->idx.channel_multiplier = a->pstep;
    E->idx_ndim = a->ndim;
    for (int i = 0; i < a->ndim; i++) {
        E->idx.step[i] = a->step[i];
        E->idx_num[i] = a->num[i];
    }
}

/* src -> dst with the cast's stochastic rounding: the patterns are viewed
 * with the index's free dims so element positions line up */
static int emit_sr(emit_ctx *E, int opk, const nt_ap *dst, const nt_ap *src, bool red)
{
    if (red)
        return nt_isa_tensor_copy_sr(E->s->k, dst, src, E->keys[opk], &E->idxr, NT_ENGINE_VECTOR);
    nt_ap d = *dst, x = *src;
    bool bx = src->ndim == 1 && src->step[0] == 0;
    d.ndim = x.ndim = E->idx_ndim;
    int64_t st = 1;
    for (int i = E->idx_ndim - 1; i >= 0; i--) {
        d.num[i] = x.num[i] = E->idx_num[i];
        d.step[i] = st;
        x.step[i] = bx ? 0 : st * src->step[0];
        st *= E->idx_num[i];
    }
    return nt_isa_tensor_copy_sr(E->s->k, &d, &x, E->keys[opk], &E->idx, NT_ENGINE_VECTOR);
}

static nt_ap tslice(nt_tile *t, int np, int64_t nf) { return nt_tile_slice(t, 0, np, 0, nf); }

static nt_ap cslice(const emit_ctx *E, nt_tile *t, int opk, int j, bool bcast)
{
    nt_ap a = nt_tile_slice(t, 0, E->np, 2 * opk + j, 1);
    if (bcast) {
        a.num[0] = E->nf;
        a.step[0] = 0;
    }
    return a;
}

/* Sets the constants of op k (once per kernel, all 128 partitions). */
static int set_consts(sk_k *s, emit_ctx *E, const nt__fop *o, int opk, bool fc)
{
    unsigned need = op_needs(o, fc);
    for (int j = 0; j < 2; j++) {
        double v = o->op == NT_OP_RELU_BWD ? 0.0 : o->p.f[j];
        if (need & NEED_CF) {
            nt_ap a = nt_tile_slice(E->cf, 0, 128, 2 * opk + j, 1);
            /* the CPU's f32 scalar (float)p.f[j], exactly */
            int rc = nt_isa_memset(s->k, &a, (double)(float)v, NT_ENGINE_GPSIMD);
            if (rc)
                return rc;
        }
        if (need & NEED_CI) {
            nt_ap a = nt_tile_slice(E->ci, 0, 128, 2 * opk + j, 1);
            int rc = nt_isa_memset(s->k, &a, v, NT_ENGINE_GPSIMD); /* (int32_t)p.f[j] */
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int ts1(sk_k *s, const nt_ap *dst, const nt_ap *src, nt_alu_op op, const nt_ap *sap,
               float imm, bool rev)
{
    nt_isa_alu a = {op, {sap, imm}, rev};
    return nt_isa_tensor_scalar(s->k, dst, src, &a, NULL, alu_eng(s, op, dst));
}

/* (src op0 i0) op1 i1, immediates */
static int ts2(sk_k *s, const nt_ap *dst, const nt_ap *src, nt_alu_op op0, float i0,
               nt_alu_op op1, float i1)
{
    nt_isa_alu a = {op0, {NULL, i0}, false}, b = {op1, {NULL, i1}, false};
    return nt_isa_tensor_scalar(s->k, dst, src, &a, &b, sk_eng_ap(s, dst));
}

static int tt(sk_k *s, const nt_ap *dst, const nt_ap *a, const nt_ap *b, nt_alu_op op)
{
    return nt_isa_tensor_tensor(s->k, dst, a, b, op, tt_eng(op));
}

/* (src op0 i0) op1 b on VectorE */
static int stt(sk_k *s, const nt_ap *dst, const nt_ap *src, nt_alu_op op0, float i0,
               nt_alu_op op1, const nt_ap *b)
{
    nt_isa_alu a = {op0, {NULL, i0}, false};
    return nt_isa_scalar_tensor_tensor(s->k, dst, src, &a, op1, b, false, NT_ENGINE_VECTOR);
}

static int act(sk_k *s, const nt_ap *dst, nt_act_func f, const nt_ap *src)
{
    return nt_isa_activation(s->k, dst, f, src, NULL, NULL, NULL);
}

/* The kernel constant j (0: 0.0f, 1: 1.0f) over the tile, a step-0 pattern */
static nt_ap kconst(const emit_ctx *E, int j)
{
    nt_ap a = nt_tile_slice(E->ck, 0, E->np, j, 1);
    a.num[0] = E->nf;
    a.step[0] = 0;
    return a;
}

/* ---- sequences: ops of the op table that the NKI ISA has no function or
 * operator for, as instructions it has, each step the CPU definition's
 * step in f32 (core/ewise.h), so every value rounds where the CPU's does.
 * x * 1 == x and -(a * b) == (-a) * b hold bit for bit, which some steps
 * use. ---- */

/* ---- issue 34: sin, cos, log1p, expm1, floor, ceil, round, trunc (float),
 * atan2, fmod, and the derivatives of sin, cos, log1p, expm1, atan2 and
 * fmod: the NKI ISA has no activation function or ALU operator for them
 * (nl.sin takes only [-pi, pi], and an exact range reduction needs integer
 * products no ALU operator gives), so GpSimd runs the core/ewise.h
 * definition per element as a custom operator (a Neuron custom C++
 * operator on its general-purpose cores): one instruction, the CPU's bits
 * by construction. ---- */
enum { GP_FWD, GP_DX, GP_DA, GP_DB };

typedef struct gp_ctx {
    int op, mode;
} gp_ctx;

static float gp_f(const gp_ctx *c, float a, float b)
{
    switch (c->mode) {
    case GP_DX: return nt__ew_table_dx(c->op, a, 0.0f, 0.0f);
    case GP_DA: return nt__ew_binary_dx(c->op, 0, a, b);
    case GP_DB: return nt__ew_binary_dx(c->op, 1, a, b);
    default: break;
    }
    switch (c->op) {
    case NT_OP_SIN: return nt__ew_sin(a);
    case NT_OP_COS: return nt__ew_cos(a);
    case NT_OP_LOG1P: return nt__ew_log1p(a);
    case NT_OP_EXPM1: return nt__ew_expm1(a);
    case NT_OP_FLOOR: return nt__ew_floor(a);
    case NT_OP_CEIL: return nt__ew_ceil(a);
    case NT_OP_ROUND: return nt__ew_round(a);
    case NT_OP_TRUNC: return nt__ew_trunc(a);
    case NT_OP_ATAN2: return nt__ew_atan2(a, b);
    case NT_OP_FMOD: return nt__ew_fmod(a, b);
    default: nt__op_unhandled("sim GpSimd elementwise", c->op);
    }
}

/* dst = f(src...) element by element: floats through f32 as the CPU's
 * kernels load and store them, an integer result (fmod of integers) in
 * exact int32 */
static int gp_fn(const nt_gpsimd_operand *dst, const nt_gpsimd_operand *src, int nsrc, void *ctx,
                 char *msg, size_t msglen)
{
    (void)msg, (void)msglen;
    const gp_ctx *c = ctx;
    bool fl = nt__dtype_is_float(dst->dtype);
    for (int p = 0; p < dst->np; p++) {
        char *d = (char *)dst->data + (int64_t)p * dst->pstride;
        const char *x = (const char *)src[0].data + (int64_t)p * src[0].pstride;
        const char *y = nsrc > 1 ? (const char *)src[1].data + (int64_t)p * src[1].pstride : x;
        nt_dtype yt = nsrc > 1 ? src[1].dtype : src[0].dtype;
        for (int64_t i = 0; i < dst->n; i++) {
            if (!fl) {
                int32_t a = nt__load_i32(x, src[0].dtype, i), b = nt__load_i32(y, yt, i);
                nt__store_i32(d, dst->dtype, i, c->op == NT_OP_FMOD ? nt__ewi_fmod(a, b) : a);
            } else {
                float a = nt__load_f32(x, src[0].dtype, i), b = nt__load_f32(y, yt, i);
                nt__store_f32(d, dst->dtype, i, gp_f(c, a, b));
            }
        }
    }
    return 0;
}

static bool ap_dense(const nt_ap *a)
{
    for (int d = 0; d < a->ndim; d++)
        if (a->num[d] > 1 && (d != a->ndim - 1 || a->step[d] != 1))
            return false;
    return true;
}

/* One GpSimd instruction computing dst from x (and y); an operand that is
 * not a dense [np, n] pattern (a per-row value read as a step-0 row) is
 * first copied into a temporary of its kind (f32: tf[k]; int: ti). */
static int gp_ew(emit_ctx *E, int op, int mode, const nt_ap *dst, const nt_ap *x, const nt_ap *y)
{
    sk_k *s = E->s;
    const nt_ap *in[2] = {x, y};
    nt_ap tmp[2];
    int n = y ? 2 : 1;
    bool ti_used = false;
    if (!ap_dense(dst))
        return nt__kerr(NT_ENOTSUP, "%s on the simulator: a strided destination",
                        nt__op_api(op));
    for (int q = 0; q < n; q++) {
        if (ap_dense(in[q]) && ap_count(in[q]) == ap_count(dst))
            continue;
        nt_tile *t = nt__dtype_is_float(in[q]->dtype) ? E->tf[q] : ti_used ? NULL : E->ti;
        if (!t)
            return nt__kerr(NT_ENOTSUP, "%s on the simulator: no temporary for operand %d",
                            nt__op_api(op), q);
        ti_used |= t == E->ti;
        tmp[q] = tslice(t, E->np, ap_count(dst) / E->np);
        int rc = nt_isa_tensor_copy(s->k, &tmp[q], in[q], sk_eng_ap(s, &tmp[q]));
        if (rc)
            return rc;
        in[q] = &tmp[q];
    }
    gp_ctx c = {op, mode};
    bool heavy = op == NT_OP_SIN || op == NT_OP_COS || op == NT_OP_ATAN2 || mode != GP_FWD;
    return nt_isa_gpsimd_custom(s->k, nt__op_name(op), dst, in, n, heavy ? 16.0 : 4.0, gp_fn, &c);
}

static bool gp_op(int op)
{
    switch (op) {
    case NT_OP_SIN: case NT_OP_COS: case NT_OP_LOG1P: case NT_OP_EXPM1: case NT_OP_FLOOR:
    case NT_OP_CEIL: case NT_OP_ROUND: case NT_OP_TRUNC: case NT_OP_ATAN2: case NT_OP_FMOD:
        return true;
    default: return false;
    }
}

/* NEG: -x = identity(x * -1); softsign: x / (1 + |x|) */
static int emit_unary_seq(emit_ctx *E, const nt__fop *o, const nt_ap *dst, const nt_ap *x)
{
    sk_k *s = E->s;
    if (o->op == NT_OP_NEG)
        return nt_isa_activation(s->k, dst, NT_ACT_IDENTITY, x, &(nt_isa_scalar){NULL, -1.0f},
                                 NULL, NULL);
    if (gp_op(o->op))
        return gp_ew(E, o->op, GP_FWD, dst, x, NULL);
    if (o->op != NT_OP_SOFTSIGN)
        nt__op_unhandled("sim unary sequence", o->op);
    nt_ap T0 = tslice(E->tf[0], E->np, E->nf);
    int rc = act(s, &T0, NT_ACT_ABS, x);
    if (!rc)
        rc = ts1(s, &T0, &T0, NT_ALU_ADD, NULL, 1.0f, false);
    return rc ? rc : tt(s, dst, x, &T0, NT_ALU_DIV);
}

/* leaky_relu x > 0 ? x : x * s; hardtanh = clamp */
static int emit_scalar_seq(emit_ctx *E, const nt__fop *o, const nt_ap *dst, const nt_ap *x)
{
    sk_k *s = E->s;
    float s0 = (float)o->p.f[0], s1 = (float)o->p.f[1];
    if (o->op == NT_OP_LEAKY_RELU) {
        nt_ap T0 = tslice(E->tf[0], E->np, E->nf), T1 = tslice(E->tf[1], E->np, E->nf);
        int rc = ts1(s, &T0, x, NT_ALU_MUL, NULL, s0, false);
        if (!rc)
            rc = ts1(s, &T1, x, NT_ALU_GT, NULL, 0.0f, false);
        return rc ? rc : nt_isa_select(s->k, dst, &T1, x, &T0, NT_ENGINE_VECTOR);
    }
    if (o->op != NT_OP_HARDTANH)
        nt__op_unhandled("sim scalar sequence", o->op);
    return ts2(s, dst, x, NT_ALU_MAX, s0, NT_ALU_MIN, s1);
}

/* gelu_tanh'(x) (nt__ew_gelu_tanh_dx) into T[3]: t = 2u(x), q = exp(-|t|),
 * d = 1 + q, s = (t >= 0 ? 1 : q) / d (max(t >= 0, q): q <= 1), ss =
 * (q / d) / d, du = c (1 + 0.134145 x^2), q == 0 ? s : s + 2x ss du */
static int gelu_tanh_dx(sk_k *s, const nt_ap *T, const nt_ap *x)
{
    const float c = 0.79788456080286535588f;
    int rc = act(s, &T[0], NT_ACT_SQUARE, x);
    if (!rc)
        rc = tt(s, &T[0], x, &T[0], NT_ALU_MUL);
    if (!rc)
        rc = stt(s, &T[0], &T[0], NT_ALU_MUL, 0.044715f, NT_ALU_ADD, x);
    if (!rc)
        rc = ts2(s, &T[0], &T[0], NT_ALU_MUL, c, NT_ALU_MUL, 2.0f); /* t */
    if (!rc)
        rc = act(s, &T[1], NT_ACT_ABS, &T[0]);
    if (!rc) /* q */
        rc = nt_isa_activation(s->k, &T[1], NT_ACT_EXP, &T[1], &(nt_isa_scalar){NULL, -1.0f},
                               NULL, NULL);
    if (!rc)
        rc = stt(s, &T[0], &T[0], NT_ALU_GE, 0.0f, NT_ALU_MAX, &T[1]);
    if (!rc)
        rc = ts1(s, &T[2], &T[1], NT_ALU_ADD, NULL, 1.0f, false); /* d */
    if (!rc)
        rc = tt(s, &T[0], &T[0], &T[2], NT_ALU_DIV); /* s */
    if (!rc)
        rc = tt(s, &T[3], &T[1], &T[2], NT_ALU_DIV);
    if (!rc)
        rc = tt(s, &T[3], &T[3], &T[2], NT_ALU_DIV); /* ss */
    if (!rc)
        rc = ts1(s, &T[1], &T[1], NT_ALU_EQ, NULL, 0.0f, false); /* q == 0 */
    if (!rc)
        rc = act(s, &T[2], NT_ACT_SQUARE, x);
    if (!rc)
        rc = ts2(s, &T[2], &T[2], NT_ALU_MUL, 0.134145f, NT_ALU_ADD, 1.0f);
    if (!rc)
        rc = ts1(s, &T[2], &T[2], NT_ALU_MUL, NULL, c, false); /* du */
    if (!rc)
        rc = stt(s, &T[3], x, NT_ALU_MUL, 2.0f, NT_ALU_MUL, &T[3]);
    if (!rc)
        rc = tt(s, &T[3], &T[3], &T[2], NT_ALU_MUL);
    if (!rc)
        rc = tt(s, &T[3], &T[0], &T[3], NT_ALU_ADD);
    return rc ? rc : nt_isa_select(s->k, &T[3], &T[1], &T[0], &T[3], NT_ENGINE_VECTOR);
}

/* mish'(x) into T[0]: t + (x sigmoid(x)) (1 - t t), t = tanh(softplus(x)) */
static int mish_dx(sk_k *s, const nt_ap *T, const nt_ap *x)
{
    int rc = act(s, &T[0], NT_ACT_SOFTPLUS, x);
    if (!rc)
        rc = act(s, &T[0], NT_ACT_TANH, &T[0]);
    if (!rc)
        rc = act(s, &T[1], NT_ACT_SIGMOID, x);
    if (!rc)
        rc = tt(s, &T[1], x, &T[1], NT_ALU_MUL);
    if (!rc)
        rc = act(s, &T[2], NT_ACT_SQUARE, &T[0]);
    if (!rc)
        rc = ts1(s, &T[2], &T[2], NT_ALU_SUB, NULL, 1.0f, true);
    if (!rc)
        rc = tt(s, &T[1], &T[1], &T[2], NT_ALU_MUL);
    return rc ? rc : tt(s, &T[0], &T[0], &T[1], NT_ALU_ADD);
}

/* The factor f'(v) of UNARY_BWD (core/ewise.h, nt__ew_<f>_dx) for the
 * forward op f = p.i[0] with its scalars, into T[*w]. */
static int unary_bwd_factor(emit_ctx *E, const nt__fop *o, const nt_ap *T, const nt_ap *v,
                            int *w)
{
    sk_k *s = E->s;
    float s0 = (float)o->p.f[0], s1 = (float)o->p.f[1];
    int rc = 0, f = (int)o->p.i[0];
    *w = 0;
    switch (f) {
    case NT_OP_LOG: return act(s, &T[0], NT_ACT_RECIPROCAL, v);                 /* 1 / x */
    case NT_OP_SQRT: return ts1(s, &T[0], v, NT_ALU_DIV, NULL, 0.5f, true);     /* 0.5 / y */
    case NT_OP_RSQRT: /* -0.5 * (y * (y * y)) */
        rc = act(s, &T[0], NT_ACT_SQUARE, v);
        if (!rc)
            rc = tt(s, &T[0], v, &T[0], NT_ALU_MUL);
        return rc ? rc : ts1(s, &T[0], &T[0], NT_ALU_MUL, NULL, -0.5f, false);
    case NT_OP_ABS: /* (x > 0) - (x < 0): 1, -1, 0 (NaN: 0) */
        rc = ts1(s, &T[0], v, NT_ALU_GT, NULL, 0.0f, false);
        return rc ? rc : nt_isa_scalar_tensor_tensor(s->k, &T[0], v,
                                                     &(nt_isa_alu){NT_ALU_LT, {NULL, 0.0f}, false},
                                                     NT_ALU_SUB, &T[0], true, NT_ENGINE_VECTOR);
    case NT_OP_RELU: return ts1(s, &T[0], v, NT_ALU_GT, NULL, 0.0f, false);     /* y > 0 */
    case NT_OP_GELU: return act(s, &T[0], NT_ACT_GELU_DX, v);
    case NT_OP_SILU: return act(s, &T[0], NT_ACT_SILU_DX, v);
    case NT_OP_SIGMOID: /* y * (1 - y) */
        rc = ts1(s, &T[0], v, NT_ALU_SUB, NULL, 1.0f, true);
        return rc ? rc : tt(s, &T[0], v, &T[0], NT_ALU_MUL);
    case NT_OP_TANH: /* 1 - y * y */
        rc = act(s, &T[0], NT_ACT_SQUARE, v);
        return rc ? rc : ts1(s, &T[0], &T[0], NT_ALU_SUB, NULL, 1.0f, true);
    case NT_OP_SOFTPLUS: { /* x > 20 ? 1 : z / (z + 1), z = exp(x) */
        nt_ap one = kconst(E, 1);
        rc = act(s, &T[0], NT_ACT_EXP, v);
        if (!rc)
            rc = ts1(s, &T[1], &T[0], NT_ALU_ADD, NULL, 1.0f, false);
        if (!rc)
            rc = tt(s, &T[1], &T[0], &T[1], NT_ALU_DIV);
        if (!rc)
            rc = ts1(s, &T[0], v, NT_ALU_GT, NULL, 20.0f, false);
        return rc ? rc : nt_isa_select(s->k, &T[0], &T[0], &one, &T[1], NT_ENGINE_VECTOR);
    }
    case NT_OP_MISH: return mish_dx(s, T, v);
    case NT_OP_SOFTSIGN: /* 1 / (d * d), d = 1 + |x| */
        rc = act(s, &T[0], NT_ACT_ABS, v);
        if (!rc)
            rc = nt_isa_activation(s->k, &T[0], NT_ACT_SQUARE, &T[0], NULL,
                                   &(nt_isa_scalar){NULL, 1.0f}, NULL);
        return rc ? rc : act(s, &T[0], NT_ACT_RECIPROCAL, &T[0]);
    case NT_OP_RECIPROCAL: /* -(y * y) = (y * -1) * y */
        return stt(s, &T[0], v, NT_ALU_MUL, -1.0f, NT_ALU_MUL, v);
    case NT_OP_GELU_TANH: *w = 3; return gelu_tanh_dx(s, T, v);
    case NT_OP_ERF: return act(s, &T[0], NT_ACT_ERF_DX, v);
    case NT_OP_SIN:
    case NT_OP_COS:
    case NT_OP_LOG1P: return gp_ew(E, f, GP_DX, &T[0], v, NULL);
    case NT_OP_EXPM1: return ts1(s, &T[0], v, NT_ALU_ADD, NULL, 1.0f, false); /* y + 1 */
    case NT_OP_SIGN:
    case NT_OP_FLOOR:
    case NT_OP_CEIL:
    case NT_OP_ROUND:
    case NT_OP_TRUNC: /* 0 (their backward is zeros; the table's factor is g * 0) */
        return nt_isa_memset(s->k, &T[0], 0.0, NT_ENGINE_VECTOR);
    case NT_OP_POW_SCALAR: /* s0 * pow(x, s0 - 1) */
        rc = ts1(s, &T[0], v, NT_ALU_POW, NULL, s0 - 1.0f, false);
        return rc ? rc : ts1(s, &T[0], &T[0], NT_ALU_MUL, NULL, s0, false);
    case NT_OP_CLAMP: /* lo <= x <= hi (NaN: 0) */
        rc = ts1(s, &T[0], v, NT_ALU_GE, NULL, s0, false);
        return rc ? rc : stt(s, &T[0], v, NT_ALU_LE, s1, NT_ALU_MUL, &T[0]);
    case NT_OP_HARDTANH: /* 1 - max(x >= hi, x <= lo): 0 where clamped, NaN passes */
        rc = ts1(s, &T[0], v, NT_ALU_LE, NULL, s0, false);
        if (!rc)
            rc = stt(s, &T[0], v, NT_ALU_GE, s1, NT_ALU_MAX, &T[0]);
        return rc ? rc : ts1(s, &T[0], &T[0], NT_ALU_SUB, NULL, 1.0f, true);
    default:
        return nt__kerr(NT_ENOTSUP, "no simulator sequence for the gradient of %s",
                        nt__op_api(f));
    }
}

/* UNARY_BWD g * f'(v): the factor as the CPU computes it, then one
 * multiply; a constant factor or y itself multiplies g at once, and
 * leaky_relu's g * (x > 0 ? 1 : s) is a select of g and g * s */
static int emit_unary_bwd(emit_ctx *E, const nt__fop *o, const nt_ap *dst, const nt_ap *g,
                          const nt_ap *v)
{
    sk_k *s = E->s;
    float s0 = (float)o->p.f[0];
    nt_ap T[4];
    for (int i = 0; i < 4; i++)
        T[i] = E->tf[i] ? tslice(E->tf[i], E->np, E->nf) : (nt_ap){0};
    int rc, w;
    switch ((int)o->p.i[0]) {
    case NT_OP_NEG: return ts1(s, dst, g, NT_ALU_MUL, NULL, -1.0f, false);
    case NT_OP_EXP: return tt(s, dst, g, v, NT_ALU_MUL);
    case NT_OP_ADD_SCALAR: return ts1(s, dst, g, NT_ALU_MUL, NULL, 1.0f, false);
    case NT_OP_MUL_SCALAR: return ts1(s, dst, g, NT_ALU_MUL, NULL, s0, false);
    case NT_OP_DIV_SCALAR: /* the immediate 1 / s0, as the CPU's f32 division */
        return ts1(s, dst, g, NT_ALU_MUL, NULL, 1.0f / s0, false);
    case NT_OP_LEAKY_RELU:
        rc = ts1(s, &T[0], v, NT_ALU_GT, NULL, 0.0f, false);
        if (!rc)
            rc = ts1(s, &T[1], g, NT_ALU_MUL, NULL, s0, false);
        return rc ? rc : nt_isa_select(s->k, dst, &T[0], g, &T[1], NT_ENGINE_VECTOR);
    default:
        rc = unary_bwd_factor(E, o, T, v, &w);
        return rc ? rc : tt(s, dst, g, &T[w], NT_ALU_MUL);
    }
}

/* BINARY_DX: the partial d/da (p.i[1] = 0) or d/db of binary op p.i[0]
 * (core/ewise.h, nt__ew_<f>_da / _db), each as the CPU computes it */
static int emit_binary_dx(emit_ctx *E, const nt__fop *o, const nt_ap *dst, const nt_ap *a,
                          const nt_ap *b)
{
    sk_k *s = E->s;
    bool db = o->p.i[1] != 0;
    nt_ap T0 = tslice(E->tf[0], E->np, E->nf), T1 = tslice(E->tf[1], E->np, E->nf);
    nt_ap zero = kconst(E, 0);
    int rc = 0;
    switch ((int)o->p.i[0]) {
    case NT_OP_ADD: return nt_isa_memset(s->k, dst, 1.0, NT_ENGINE_VECTOR);
    case NT_OP_SUB: return nt_isa_memset(s->k, dst, db ? -1.0 : 1.0, NT_ENGINE_VECTOR);
    case NT_OP_MUL: return nt_isa_tensor_copy(s->k, dst, db ? a : b, sk_eng_ap(s, dst));
    case NT_OP_DIV:
        if (!db) /* 1 / b */
            return act(s, dst, NT_ACT_RECIPROCAL, b);
        rc = tt(s, &T0, a, b, NT_ALU_DIV); /* -(a / b) / b */
        return rc ? rc : stt(s, dst, &T0, NT_ALU_MUL, -1.0f, NT_ALU_DIV, b);
    case NT_OP_MAXIMUM:
    case NT_OP_MINIMUM: { /* a >= b (a <= b) ? 1 : 0, and 1 minus that (NaN: 0, 1) */
        nt_alu_op c = o->p.i[0] == NT_OP_MAXIMUM ? NT_ALU_GE : NT_ALU_LE;
        if (!db)
            return tt(s, dst, a, b, c);
        rc = tt(s, &T0, a, b, c);
        return rc ? rc : ts1(s, dst, &T0, NT_ALU_SUB, NULL, 1.0f, true);
    }
    case NT_OP_POW:
        if (!db) { /* b == 0 ? 0 : b * pow(a, b - 1) */
            rc = ts1(s, &T0, b, NT_ALU_SUB, NULL, 1.0f, false);
            if (!rc)
                rc = tt(s, &T0, a, &T0, NT_ALU_POW);
            if (!rc)
                rc = tt(s, &T0, b, &T0, NT_ALU_MUL);
            if (!rc)
                rc = ts1(s, &T1, b, NT_ALU_EQ, NULL, 0.0f, false);
        } else { /* a == 0 && b >= 0 ? 0 : pow(a, b) * log(a) */
            rc = tt(s, &T0, a, b, NT_ALU_POW);
            if (!rc)
                rc = act(s, &T1, NT_ACT_LOG, a);
            if (!rc)
                rc = tt(s, &T0, &T0, &T1, NT_ALU_MUL);
            if (!rc)
                rc = ts1(s, &T1, a, NT_ALU_EQ, NULL, 0.0f, false);
            if (!rc)
                rc = stt(s, &T1, b, NT_ALU_GE, 0.0f, NT_ALU_MUL, &T1);
        }
        return rc ? rc : nt_isa_select(s->k, dst, &T1, &zero, &T0, NT_ENGINE_VECTOR);
    case NT_OP_ATAN2:
    case NT_OP_FMOD: return gp_ew(E, (int)o->p.i[0], db ? GP_DB : GP_DA, dst, a, b);
    default:
        return nt__kerr(NT_ENOTSUP, "no simulator sequence for the partials of %s",
                        nt__op_api((int)o->p.i[0]));
    }
}

/* Emits op o (program op index opk) writing dst (dtype odt). */
static int emit_op(emit_ctx *E, const nt__fop *o, int opk, nt_dtype odt, const nt_ap *dst,
                   const sk_arg *a)
{
    sk_k *s = E->s;
    nt_sim_kernel *k = s->k;
    const nt__opinfo *info = &nt__ops[o->op];
    bool fc = isf(odt);
    for (int q = 0; q < o->nin; q++)
        fc |= isf(a[q].dt);
    int np = E->np;
    int64_t nf = E->nf;
    nt_ap T0 = E->tf[0] ? tslice(E->tf[0], np, nf) : (nt_ap){0};
    nt_ap TI = E->ti ? tslice(E->ti, np, nf) : (nt_ap){0};
    switch (info->kind) {
    case NT_KIND_FILL:
        return nt_isa_memset(k, dst, memset_value(odt, o->p.f[0]), NT_ENGINE_VECTOR);
    case NT_KIND_COPY:
        if (is_sr(o))
            return emit_sr(E, opk, dst, &a[0].ap, E->nf == 1 && a[0].red);
        return nt_isa_tensor_copy(k, dst, &a[0].ap, sk_eng_ap(s, dst));
    case NT_KIND_UNARY:
        if (fc && sim_of[o->op] >= 0)
            return nt_isa_activation(k, dst, act_of(o->op), &a[0].ap, NULL, NULL, NULL);
        if (fc)
            return emit_unary_seq(E, o, dst, &a[0].ap);
        /* exact int32 (the ops whose ints column is INT or INTONLY), by the
         * op's primitive (core/optable.h): -a wraps like 0u - a; relu =
         * max(a, 0); abs = max(a, -a) */
        if (o->op == NT_OP_SIGN) { /* clamp(a, -1, 1) */
            nt_isa_alu lo = {NT_ALU_MAX, {NULL, -1.0f}, false};
            nt_isa_alu hi = {NT_ALU_MIN, {NULL, 1.0f}, false};
            return nt_isa_tensor_scalar(k, dst, &a[0].ap, &lo, &hi, sk_eng_ap(s, dst));
        }
        if (o->op == NT_OP_FLOOR || o->op == NT_OP_CEIL || o->op == NT_OP_ROUND ||
            o->op == NT_OP_TRUNC) /* integers are their own roundings */
            return nt_isa_tensor_copy(k, dst, &a[0].ap, sk_eng_ap(s, dst));
        switch (nt__op_prim(o->op)) {
        case NT__PRIM_NEG: return ts1(s, dst, &a[0].ap, NT_ALU_MUL, NULL, -1.0f, false);
        case NT__PRIM_RELU: return ts1(s, dst, &a[0].ap, NT_ALU_MAX, NULL, 0.0f, false);
        case NT__PRIM_ABS: {
            int rc = ts1(s, &TI, &a[0].ap, NT_ALU_MUL, NULL, -1.0f, false);
            return rc ? rc : nt_isa_tensor_tensor(k, dst, &a[0].ap, &TI, NT_ALU_MAX,
                                                  NT_ENGINE_VECTOR);
        }
        case NT__PRIM_NOT: { /* ~a = -a - 1, wrapping */
            nt_isa_alu neg = {NT_ALU_MUL, {NULL, -1.0f}, false};
            nt_isa_alu dec = {NT_ALU_ADD, {NULL, -1.0f}, false};
            return nt_isa_tensor_scalar(k, dst, &a[0].ap, &neg, &dec, sk_eng_ap(s, dst));
        }
        default:
            return nt__kerr(NT_ENOTSUP, "no simulator sequence for integer %s", nt__op_api(o->op));
        }
    case NT_KIND_SCALAR: {
        float s0 = (float)o->p.f[0], s1 = (float)o->p.f[1];
        nt_ap c0 = {0}, c1 = {0};
        if (!fc) {
            c0 = cslice(E, E->ci, opk, 0, false);
            c1 = cslice(E, E->ci, opk, 1, false);
        }
        if (sim_of[o->op] >= 0) /* one ALU step */
            return ts1(s, dst, &a[0].ap, (nt_alu_op)sim_of[o->op], fc ? NULL : &c0, s0, false);
        if (o->op != NT_OP_CLAMP)
            return emit_scalar_seq(E, o, dst, &a[0].ap);
        switch (o->op) {
        case NT_OP_CLAMP: {
            /* max(a, lo) then min(., hi) is the CPU's clamp, NaN, signed
             * zeros and lo > hi (all hi) included */
            nt_isa_alu lo = {NT_ALU_MAX, {fc ? NULL : &c0, s0}, false};
            nt_isa_alu hi = {NT_ALU_MIN, {fc ? NULL : &c1, s1}, false};
            return nt_isa_tensor_scalar(k, dst, &a[0].ap, &lo, &hi, sk_eng_ap(s, dst));
        }
        default: nt__op_unhandled("sim scalar sequence", o->op);
        }
    }
    case NT_KIND_BINARY:
    case NT_KIND_CMP: {
        int alu = alu_of(o->op);
        if (alu >= 0) {
            /* a per-row operand becomes the per-partition scalar */
            if (a[1].red && !a[0].red)
                return ts1(s, dst, &a[0].ap, (nt_alu_op)alu, &a[1].col, 0.0f, false);
            if (a[0].red && !a[1].red)
                return ts1(s, dst, &a[1].ap, (nt_alu_op)alu, &a[0].col, 0.0f, true);
            return tt(s, dst, &a[0].ap, &a[1].ap, (nt_alu_op)alu);
        }
        if (gp_op(o->op)) /* atan2, fmod */
            return gp_ew(E, o->op, GP_FWD, dst, &a[0].ap, &a[1].ap);
        /* backward helpers (g, y-or-x) in the CPU's order on f32 temps */
        const nt_ap *g = &a[0].ap, *y = &a[1].ap;
        int rc = 0;
        if (o->op == NT_OP_BINARY_DX)
            return emit_binary_dx(E, o, dst, &a[0].ap, &a[1].ap);
        if (o->op == NT_OP_UNARY_BWD)
            return emit_unary_bwd(E, o, dst, g, y);
        switch (o->op) {
        case NT_OP_RELU_BWD: { /* y > 0 ? g : 0 */
            nt_ap zero = cslice(E, E->cf, opk, 0, true);
            rc = ts1(s, &T0, y, NT_ALU_GT, NULL, 0.0f, false);
            return rc ? rc : nt_isa_select(k, dst, &T0, g, &zero, NT_ENGINE_VECTOR);
        }
        case NT_OP_SIGMOID_BWD: /* g * (y * (1 - y)) */
            rc = ts1(s, &T0, y, NT_ALU_SUB, NULL, 1.0f, true);
            if (!rc)
                rc = nt_isa_tensor_tensor(k, &T0, y, &T0, NT_ALU_MUL, NT_ENGINE_VECTOR);
            break;
        case NT_OP_TANH_BWD: /* g * (1 - y * y) */
            rc = nt_isa_tensor_tensor(k, &T0, y, y, NT_ALU_MUL, NT_ENGINE_VECTOR);
            if (!rc)
                rc = ts1(s, &T0, &T0, NT_ALU_SUB, NULL, 1.0f, true);
            break;
        case NT_OP_GELU_BWD: /* g * gelu'(x) */
            rc = nt_isa_activation(k, &T0, NT_ACT_GELU_DX, y, NULL, NULL, NULL);
            break;
        case NT_OP_SILU_BWD: /* g * silu'(x) */
            rc = nt_isa_activation(k, &T0, NT_ACT_SILU_DX, y, NULL, NULL, NULL);
            break;
        default: nt__op_unhandled("sim backward-helper sequence", o->op);
        }
        return rc ? rc : nt_isa_tensor_tensor(k, dst, g, &T0, NT_ALU_MUL, NT_ENGINE_VECTOR);
    }
    case NT_KIND_WHERE:
        return nt_isa_select(k, dst, &a[0].ap, &a[1].ap, &a[2].ap, NT_ENGINE_VECTOR);
    default:
        return NT_ENOTSUP;
    }
}

/* ---------------- registers ---------------- */

/* A register is an SBUF tile class: (dtype, per-row or full). */
typedef struct regs {
    int n;
    nt_dtype dt[NT_F_MAXREG];
    bool red[NT_F_MAXREG];
    bool busy[NT_F_MAXREG];
    nt_tile *tile[NBUF_MAX][NT_F_MAXREG];
} regs;

static int reg_get(regs *R, nt_dtype dt, bool red)
{
    for (int r = 0; r < R->n; r++)
        if (!R->busy[r] && R->dt[r] == dt && R->red[r] == red) {
            R->busy[r] = true;
            return r;
        }
    if (R->n == NT_F_MAXREG)
        return -1;
    int r = R->n++;
    R->dt[r] = dt;
    R->red[r] = red;
    R->busy[r] = true;
    return r;
}

/* The plan of a program: a register per external input and value, which
 * ops to run, temporaries and constants. */
typedef struct plan {
    const nt__fprog *P;
    int first;                   /* first op to run (MM: 1) */
    int ereg[NT_F_MAXEXT], vreg[NT_F_MAXVALS];
    bool eused[NT_F_MAXEXT], live[NT_F_MAXOPS];
    int vuses[NT_F_MAXVALS];     /* operand references by live ops */
    unsigned needs;
    int ve_only, se_only, flex; /* cycles per element of the live ops, by engine */
    regs R;
    /* MM programs: an input the same for every row block (a bias), loaded
     * once per kernel as [128, N]; a block reads its columns n0.. */
    nt_tile *pre[NT_F_MAXEXT];
    /* EW: an f32 input read only by binary ALU ops, which a tile may load as
     * one column when it is constant along the tile's free axis (ew_tile) */
    bool colok[NT_F_MAXEXT];
    /* EW: a float input read only by computing ops (no copy, cast or
     * select, which would pass a NaN's payload through), or an integer
     * input, which a tile constant along its free axis loads as one column
     * and spreads over the free axis on VectorE (ew_tile) */
    bool bcok[NT_F_MAXEXT];
} plan;

static bool val_fc(const nt__fprog *P, const nt__fop *o)
{
    bool fc = isf((nt_dtype)P->vals[o->out].dtype);
    for (int q = 0; q < o->nin; q++) {
        int a = o->a[q];
        fc |= isf((nt_dtype)(NT_F_IS_EXT(a) ? P->ext[NT_F_EXT_IDX(a)].dtype : P->vals[a].dtype));
    }
    return fc;
}

/* Liveness and register allocation.  mm_v0: value 0 is the matmul result
 * (a register of its own, like an input). */
static int plan_make(plan *L, const nt__fprog *P, int first, bool keep_stored)
{
    memset(L, 0, sizeof *L);
    L->P = P;
    L->first = first;
    int vlast[NT_F_MAXVALS], elast[NT_F_MAXEXT];
    for (int v = 0; v < P->nvals; v++)
        vlast[v] = -1;
    for (int e = 0; e < P->next; e++)
        elast[e] = -1;
    /* which ops matter: walk back from stored values */
    for (int k = P->nops - 1; k >= first; k--) {
        const nt__fop *o = &P->ops[k];
        L->live[k] = vlast[o->out] >= 0 || P->vals[o->out].store >= 0;
        if (!L->live[k])
            continue;
        for (int q = 0; q < o->nin; q++) {
            int a = o->a[q];
            if (NT_F_IS_EXT(a)) {
                if (elast[NT_F_EXT_IDX(a)] < k)
                    elast[NT_F_EXT_IDX(a)] = k;
            } else {
                L->vuses[a]++;
                if (vlast[a] < k)
                    vlast[a] = k;
            }
        }
    }
    for (int e = 0; e < P->next; e++) {
        L->eused[e] = elast[e] >= 0;
        L->ereg[e] = -1;
        if (L->eused[e] && (L->ereg[e] = reg_get(&L->R, (nt_dtype)P->ext[e].dtype, P->ext[e].red)) < 0)
            return NT_ENOTSUP;
    }
    for (int v = 0; v < P->nvals; v++)
        L->vreg[v] = -1;
    if (first == 1 && (L->vreg[0] = reg_get(&L->R, (nt_dtype)P->vals[0].dtype, false)) < 0)
        return NT_ENOTSUP;
    for (int k = first; k < P->nops; k++) {
        if (!L->live[k])
            continue;
        const nt__fop *o = &P->ops[k];
        L->needs |= op_needs(o, val_fc(P, o));
        switch (nt__ops[o->op].kind) {
        case NT_KIND_BINARY:
        case NT_KIND_CMP:
        case NT_KIND_WHERE: L->ve_only += 2; break;
        case NT_KIND_UNARY:
        case NT_KIND_SCALAR:
            if (val_fc(P, o) && nt__ops[o->op].kind == NT_KIND_UNARY) {
                L->se_only++; /* activation */
                if (o->op == NT_OP_SOFTSIGN) /* + 1, the divide */
                    L->flex++, L->ve_only += 2;
                break;
            }
            if (o->op == NT_OP_LEAKY_RELU) /* x * s, x > 0, select */
                L->flex += 2, L->ve_only += 2;
            L->flex++;
            break;
        case NT_KIND_COPY: L->flex++; break;
        default: L->ve_only++; break;
        }
        /* operands whose last reader is this op free their registers: the
         * result may overwrite them elementwise */
        for (int e = 0; e < P->next; e++)
            if (L->eused[e] && elast[e] == k)
                L->R.busy[L->ereg[e]] = false;
        /* keep_stored (EW programs, whose tiles are small): a stored value
         * keeps its register for the rest of the tile, as a later op
         * writing there would wait for the store's DMA (2 us and more) to
         * have read it */
        for (int v = 0; v < P->nvals; v++)
            if (L->vreg[v] >= 0 && vlast[v] == k && !(keep_stored && P->vals[v].store >= 0))
                L->R.busy[L->vreg[v]] = false;
        int v = o->out;
        L->vreg[v] = reg_get(&L->R, (nt_dtype)P->vals[v].dtype, P->vals[v].red);
        if (L->vreg[v] < 0)
            return NT_ENOTSUP;
        if (vlast[v] <= k && !keep_stored) /* stored right away and never read again */
            L->R.busy[L->vreg[v]] = false;
    }
    return 0;
}

/* Bytes per partition for free size F and nbuf register sets. */
static int64_t plan_bytes(const plan *L, int64_t F, int nbuf)
{
    int64_t b = 0;
    for (int r = 0; r < L->R.n; r++) {
        int64_t e = (int64_t)nt__dtype_size(L->R.dt[r]);
        b += ((L->R.red[r] ? 1 : F) * e + 63) / 64 * 64 * nbuf;
    }
    if (L->needs & NEED_TF)
        b += ((L->needs & NEED_TF4) ? 4 : 2) * ((F * 4 + 63) / 64 * 64);
    if (L->needs & NEED_TI)
        b += (F * 4 + 63) / 64 * 64;
    b += 3 * 64 + 2 * ((2 * NT_F_MAXOPS * 4 + 63) / 64 * 64);
    return b;
}

/* ScalarE loads a function table (1 us) before the first activation that
 * needs one.  In a kernel that is a chain on its first tile's loads (a small
 * AdamW: sqrt), that load sat on the critical path; one activation of the
 * program's first table function on a scratch element, issued before
 * anything else, loads it while the inputs are still on their way (as a
 * compiler hoists the table load).  Its value is never read. */
static int warm_table(sk_k *s, const plan *L)
{
    const nt__fprog *P = L->P;
    for (int k = L->first; k < P->nops; k++) {
        const nt__fop *o = &P->ops[k];
        if (!L->live[k] || !val_fc(P, o))
            continue;
        if (nt__ops[o->op].kind != NT_KIND_UNARY || sim_of[o->op] < 0)
            continue;
        nt_act_func f = act_of(o->op);
        if (f == NT_ACT_IDENTITY || f == NT_ACT_RELU || f == NT_ACT_ABS ||
            f == NT_ACT_SQUARE) /* no table */
            continue;
        nt_tile *w = sk_tile(s, "act.warm", NT_F32, 1, 1);
        nt_ap a = tslice(w, 1, 1);
        int rc = nt_isa_memset(s->k, &a, 1.0, NT_ENGINE_GPSIMD);
        return rc ? rc : nt_isa_activation(s->k, &a, f, &a, NULL, NULL, NULL);
    }
    return 0;
}

static int plan_alloc(sk_k *s, plan *L, emit_ctx *E, int64_t F, int nbuf)
{
    /* tile names for the trace: "reg.<dtype>[.row]" (no printf per kernel) */
    static const char *const full[NT_DTYPE_COUNT] = {
        [NT_F32] = "reg.f32", [NT_BF16] = "reg.bf16", [NT_F16] = "reg.f16",
        [NT_I32] = "reg.i32", [NT_U8] = "reg.u8",     [NT_E4M3] = "reg.e4m3",
        [NT_E5M2] = "reg.e5m2"};
    static const char *const row[NT_DTYPE_COUNT] = {
        [NT_F32] = "reg.f32.row", [NT_BF16] = "reg.bf16.row", [NT_F16] = "reg.f16.row",
        [NT_I32] = "reg.i32.row", [NT_U8] = "reg.u8.row",     [NT_E4M3] = "reg.e4m3.row",
        [NT_E5M2] = "reg.e5m2.row"};
    for (int b = 0; b < nbuf; b++)
        for (int r = 0; r < L->R.n; r++) {
            const char *name = (L->R.red[r] ? row : full)[L->R.dt[r]];
            if (!name) /* a dtype the device has not: never planned here */
                name = "reg";
            L->R.tile[b][r] = sk_tile(s, name, L->R.dt[r], 128, L->R.red[r] ? 1 : F);
        }
    for (int r = 0; r < L->R.n; r++)
        if (nbuf == 1)
            L->R.tile[1][r] = L->R.tile[0][r];
    memset(E, 0, sizeof *E);
    E->s = s;
    /* ScalarE takes every flexible step when VectorE's own work (plus an MM
     * program's evacuations on ScalarE) still outweighs them; else the
     * engine that frees up first (sk_eng) */
    double cv = sk_clock_ghz(NT_ENGINE_VECTOR), ca = sk_clock_ghz(NT_ENGINE_SCALAR);
    if (cv > 0 && ca > 0)
        s->scalar_first = L->ve_only / cv >= (L->se_only + L->flex + L->first) / ca;
    if (L->needs & NEED_TF) {
        static const char *const tn[4] = {"tmp0", "tmp1", "tmp2", "tmp3"};
        for (int i = 0; i < ((L->needs & NEED_TF4) ? 4 : 2); i++)
            E->tf[i] = sk_tile(s, tn[i], NT_F32, 128, F);
    }
    if (L->needs & NEED_TI)
        E->ti = sk_tile(s, "tmpi", NT_I32, 128, F);
    const nt__fprog *P = L->P;
    int rc = warm_table(s, L);
    if (rc)
        return rc;
    if (L->needs & NEED_CK) { /* the sequences' 0 and 1 */
        E->ck = sk_tile(s, "const.k", NT_F32, 128, 2);
        for (int j = 0; j < 2 && !rc; j++) {
            nt_ap a = nt_tile_slice(E->ck, 0, 128, j, 1);
            rc = nt_isa_memset(s->k, &a, (double)j, NT_ENGINE_GPSIMD);
        }
    }
    if (L->needs & (NEED_CF | NEED_CI)) {
        E->cf = sk_tile(s, "const.f32", NT_F32, 128, 2 * P->nops);
        E->ci = sk_tile(s, "const.i32", NT_I32, 128, 2 * P->nops);
        for (int k = L->first; k < P->nops && !nt_sim_kernel_error(s->k); k++)
            if (L->live[k])
                set_consts(s, E, &P->ops[k], k, val_fc(P, &P->ops[k]));
    }
    return nt_sim_kernel_error(s->k);
}

/* ---------------- running a tile ---------------- */

/* Where each operand of the current tile lives. */
typedef struct tile_state {
    plan *L;
    emit_ctx E;
    int buf;
    int np;
    int64_t nf;
    int64_t n0; /* MM: the block's first column (L->pre's slice) */
    unsigned ecol; /* EW: inputs loaded as one column this tile (ew_tile) */
    signed char sf; /* 0, or the program's s->scalar_first + 1 when its tile runs
                     * beside another program's (ew_lone) */
    const nt_ap *acc; /* MM: value 0 read in PSUM, not evacuated (mm_epi), or NULL */
} tile_state;

static sk_arg arg_of(tile_state *t, int a)
{
    const nt__fprog *P = t->L->P;
    sk_arg r;
    memset(&r, 0, sizeof r);
    int reg;
    if (NT_F_IS_EXT(a)) {
        int e = NT_F_EXT_IDX(a);
        reg = t->L->ereg[e];
        r.dt = (nt_dtype)P->ext[e].dtype;
        r.red = P->ext[e].red || (t->ecol >> e & 1u);
        if (t->L->pre[e]) {
            r.ap = nt_tile_slice(t->L->pre[e], 0, t->np, t->n0, t->nf);
            return r;
        }
    } else {
        reg = t->L->vreg[a];
        r.dt = (nt_dtype)P->vals[a].dtype;
        r.red = P->vals[a].red;
        if (a == 0 && t->acc) {
            r.ap = *t->acc;
            return r;
        }
    }
    nt_tile *tl = t->L->R.tile[t->buf][reg];
    if (r.red) {
        r.col = nt_tile_slice(tl, 0, t->np, 0, 1);
        r.ap = r.col;
        r.ap.num[0] = t->nf;
        r.ap.step[0] = 0;
    } else {
        r.ap = nt_tile_slice(tl, 0, t->np, 0, t->nf);
    }
    return r;
}

static nt_ap val_ap(tile_state *t, int v)
{
    nt_tile *tl = t->L->R.tile[t->buf][t->L->vreg[v]];
    return nt_tile_slice(tl, 0, t->np, 0, t->L->P->vals[v].red ? 1 : t->nf);
}

/* ---- two peepholes that merge instructions without moving a rounding ----
 *
 * A value that is f32, stored nowhere and read only by the next op is
 * rounded to f32 by its op -- which changes nothing (an f32 result already
 * is one; a NaN's payload never matters, every store canonicalises it).  So
 * the pair may run as one instruction that keeps it in f32:
 *   scalar op then scalar op         -> one tensor_scalar with two ALU steps
 *   scalar op then binary op reading it (the other input a full tile)
 *                                    -> one scalar_tensor_tensor: AdamW's
 *                                       m + (g - m) * c, b2 * v + g*g * c and
 *                                       w - u * lr each lose an instruction
 *   x - m (m per row) then exp [then the row's sum of that]
 *                                    -> activation(exp, bias = -m) with the
 *                                       add-reduce: x + (-m) is x - m in IEEE
 *                                       arithmetic, and the add-reduce is the
 *                                       CPU's canonical sum of the f32 results */

static int scalar_alu(int op)
{
    return nt__ops[op].kind == NT_KIND_SCALAR && sim_of[op] >= 0 ? sim_of[op] : -1;
}

/* Is value v (defined by op k) an f32 full value read only by op k + 1? */
static bool feeds_next_only(const plan *L, int k, int *next)
{
    const nt__fprog *P = L->P;
    int v = P->ops[k].out;
    if (k + 1 >= P->nops || !L->live[k + 1] || P->vals[v].dtype != NT_F32 || P->vals[v].red ||
        P->vals[v].store >= 0 || L->vuses[v] != 1)
        return false;
    const nt__fop *n = &P->ops[k + 1];
    for (int q = 0; q < n->nin; q++)
        if (n->a[q] == v) {
            *next = k + 1;
            return true;
        }
    return false;
}

static bool float_scalar_op(const nt__fprog *P, const nt__fop *o)
{
    return scalar_alu(o->op) >= 0 && val_fc(P, o) && !P->vals[o->out].red;
}

/* Tries the peepholes at op k; returns the number of ops it ran (0: none). */
static int peephole(tile_state *t, int k, int *rcp, int (*store)(void *, int, const nt_ap *),
                    void *sctx)
{
    const plan *L = t->L;
    const nt__fprog *P = L->P;
    const nt__fop *o = &P->ops[k];
    sk_k *s = t->E.s;
    int nx;
    if (!feeds_next_only(L, k, &nx))
        return 0;
    const nt__fop *n = &P->ops[nx];
    if (float_scalar_op(P, o) && float_scalar_op(P, n) && n->a[0] == o->out) {
        sk_arg a = arg_of(t, o->a[0]);
        if (a.red)
            return 0;
        nt_ap dst = val_ap(t, n->out);
        nt_isa_alu op0 = {(nt_alu_op)scalar_alu(o->op), {NULL, (float)o->p.f[0]}, false};
        nt_isa_alu op1 = {(nt_alu_op)scalar_alu(n->op), {NULL, (float)n->p.f[0]}, false};
        nt_engine e = op0.op == NT_ALU_POW ? NT_ENGINE_GPSIMD : alu_eng(s, op1.op, &dst);
        int rc = nt_isa_tensor_scalar(s->k, &dst, &a.ap, &op0, &op1, e);
        if (!rc && P->vals[n->out].store >= 0)
            rc = store(sctx, P->vals[n->out].store, &dst);
        *rcp = rc;
        return 2;
    }
    int kn = nt__ops[n->op].kind;
    int alu1 = kn == NT_KIND_BINARY || kn == NT_KIND_CMP ? alu_of(n->op) : -1;
    if (float_scalar_op(P, o) && alu1 >= 0 && alu1 < NT_ALU_COUNT && !P->vals[n->out].red) {
        int other = n->a[0] == o->out ? n->a[1] : n->a[0];
        if (other == o->out)
            return 0;
        sk_arg x = arg_of(t, o->a[0]), b = arg_of(t, other);
        /* a float x: the scalar step computes in f32, as the op alone would */
        if (x.red || b.red || !isf(x.dt))
            return 0;
        nt_ap dst = val_ap(t, n->out);
        nt_isa_alu op0 = {(nt_alu_op)scalar_alu(o->op), {NULL, (float)o->p.f[0]}, false};
        nt_engine e = op0.op == NT_ALU_POW ? NT_ENGINE_GPSIMD : tt_eng((nt_alu_op)alu1);
        int rc = nt_isa_scalar_tensor_tensor(s->k, &dst, &x.ap, &op0, (nt_alu_op)alu1, &b.ap,
                                             n->a[0] != o->out, e);
        if (!rc && P->vals[n->out].store >= 0)
            rc = store(sctx, P->vals[n->out].store, &dst);
        *rcp = rc;
        return 2;
    }
    if (o->op == NT_OP_SUB && n->op == NT_OP_EXP && t->E.tf[1]) {
        sk_arg x = arg_of(t, o->a[0]), m = arg_of(t, o->a[1]);
        if (x.red || !m.red)
            return 0;
        /* the row's sum of exp(x - m), when the next op takes it */
        int nsum = -1, e = n->out;
        if (nx + 1 < P->nops && L->live[nx + 1] && P->ops[nx + 1].op == NT_OP_SUM &&
            P->ops[nx + 1].a[0] == e && P->vals[e].dtype == NT_F32 &&
            P->vals[P->ops[nx + 1].out].red)
            nsum = nx + 1;
        nt_ap negm = nt_tile_slice(t->E.tf[1], 0, t->np, 0, 1);
        nt_ap dst = val_ap(t, e);
        int rc = ts1(s, &negm, &m.col, NT_ALU_MUL, NULL, -1.0f, false);
        nt_ap sum = nsum >= 0 ? val_ap(t, P->ops[nsum].out) : (nt_ap){0};
        if (!rc)
            rc = nt_isa_activation(s->k, &dst, NT_ACT_EXP, &x.ap, NULL,
                                   &(nt_isa_scalar){&negm, 0}, nsum >= 0 ? &sum : NULL);
        if (!rc && P->vals[e].store >= 0)
            rc = store(sctx, P->vals[e].store, &dst);
        if (!rc && nsum >= 0 && P->vals[P->ops[nsum].out].store >= 0)
            rc = store(sctx, P->vals[P->ops[nsum].out].store, &sum);
        *rcp = rc;
        return nsum >= 0 ? 3 : 2;
    }
    return 0;
}

/* Runs live op *kp (with whatever a peephole merges into it) on the current
 * tile and advances *kp past what it ran; stores go through store(). */
static int run_op(tile_state *t, int *kp, int (*store)(void *ctx, int slot, const nt_ap *src),
                  void *sctx)
{
    const nt__fprog *P = t->L->P;
    sk_k *s = t->E.s;
    int k = *kp;
    if (t->sf)
        s->scalar_first = t->sf > 1;
    int rc = 0, ran = peephole(t, k, &rc, store, sctx);
    *kp = k + (ran ? ran : 1);
    if (rc || ran)
        return rc;
    const nt__fop *o = &P->ops[k];
    sk_arg a[3];
    for (int q = 0; q < o->nin; q++)
        a[q] = arg_of(t, o->a[q]);
    const nt__fval *val = &P->vals[o->out];
    /* A same-dtype copy whose result is only stored (AdamW's writes back
     * into p, m and v): the store reads the source's register instead.
     * The bytes are the copy's: a computed value is canonical already
     * (every instruction's result passes isa.c's st()), and the DMA moves
     * bytes.  The copy was a link in each block's ScalarE chain of an MM
     * epilogue (bf16: the evacuation, the cast, the cast ahead and three
     * copies in a row while VectorE waited). */
    if (nt__ops[o->op].kind == NT_KIND_COPY && !is_sr(o) && val->store >= 0 && !val->red &&
        t->L->vuses[o->out] == 0 && o->nin == 1 && !NT_F_IS_EXT(o->a[0]) && !a[0].red &&
        a[0].dt == (nt_dtype)val->dtype)
        return store(sctx, val->store, &a[0].ap);
    nt_ap dst = val_ap(t, o->out);
    /* x * x of an f32 value in a program bound by VectorE (AdamW's g * g):
     * ScalarE's square, nt__ew_mul(x, x) as the tensor_tensor computes it,
     * N ScalarE cycles instead of 2N of VectorE's */
    if (o->op == NT_OP_MUL && o->nin == 2 && o->a[0] == o->a[1] && s->scalar_first &&
        val->dtype == NT_F32 && !val->red && a[0].dt == NT_F32 && !a[0].red) {
        rc = act(s, &dst, NT_ACT_SQUARE, &a[0].ap);
        return !rc && val->store >= 0 ? store(sctx, val->store, &dst) : rc;
    }
    if (o->op == NT_OP_SUM || o->op == NT_OP_MAX || o->op == NT_OP_MEAN || o->op == NT_OP_MIN) {
        /* ROW: a row reduction, the CPU's canonical order over C */
        nt_alu_op op = o->op == NT_OP_MAX   ? NT_ALU_MAX
                       : o->op == NT_OP_MIN ? NT_ALU_MIN
                                            : NT_ALU_ADD;
        if (o->op == NT_OP_MEAN) {
            nt_ap t0 = nt_tile_slice(t->E.tf[0], 0, t->np, 0, 1);
            rc = nt_isa_tensor_reduce(s->k, &t0, &a[0].ap, op, 0);
            if (!rc)
                rc = ts1(s, &dst, &t0, NT_ALU_DIV, NULL, (float)a[0].ap.num[0], false);
        } else {
            rc = nt_isa_tensor_reduce(s->k, &dst, &a[0].ap, op, 0);
        }
    } else {
        emit_ctx E = t->E;
        if (val->red) /* a per-row op works on [np, 1] */
            E.nf = 1;
        if (val->red)
            for (int q = 0; q < o->nin; q++)
                a[q].ap = a[q].col;
        rc = emit_op(&E, o, k, (nt_dtype)val->dtype, &dst, a);
    }
    if (!rc && val->store >= 0)
        rc = store(sctx, val->store, &dst);
    return rc;
}

/* The next live op at or after k (nops when none). */
static int next_live(const tile_state *t, int k)
{
    while (k < t->L->P->nops && !t->L->live[k])
        k++;
    return k;
}

/* Runs ops [k0, nops) on the current tile; stores go through store(). */
static int run_ops_from(tile_state *t, int k0, int (*store)(void *ctx, int slot, const nt_ap *src),
                        void *sctx)
{
    t->E.np = t->np;
    t->E.nf = t->nf;
    int rc = 0;
    for (int k = next_live(t, k0); k < t->L->P->nops && !rc; k = next_live(t, k))
        rc = run_op(t, &k, store, sctx);
    return rc;
}

/* Runs ops [first, nops) on the current tile; stores go through store(). */
static int run_ops(tile_state *t, int (*store)(void *ctx, int slot, const nt_ap *src),
                   void *sctx)
{
    return run_ops_from(t, t->L->first, store, sctx);
}

/* Runs the ops of two tiles interleaved, op by op: the instruction streams
 * of the engines then alternate between two independent dependency chains,
 * so one engine works on one tile while the other engine's step of the other
 * tile is still running (one tile's chain alone alternates VectorE and
 * ScalarE, each waiting for the other).  Temporaries live inside one op, so
 * sharing them between the tiles moves no value; each instruction computes
 * what it computed in run_ops. */
static int run_ops2_from(tile_state *t0, void *c0, int k00, tile_state *t1, void *c1, int k01,
                         int (*store)(void *ctx, int slot, const nt_ap *src))
{
    tile_state *t[2] = {t0, t1};
    void *c[2] = {c0, c1};
    int k[2] = {k00, k01}, n[2] = {t0->L->P->nops, t1->L->P->nops}, rc = 0;
    for (int i = 0; i < 2; i++) {
        t[i]->E.np = t[i]->np;
        t[i]->E.nf = t[i]->nf;
        k[i] = next_live(t[i], k[i]);
    }
    while (!rc && (k[0] < n[0] || k[1] < n[1])) {
        int i = k[0] < n[0] && (k[1] >= n[1] || k[0] <= k[1]) ? 0 : 1;
        rc = run_op(t[i], &k[i], store, c[i]);
        k[i] = next_live(t[i], k[i]);
    }
    return rc;
}

static int run_ops2(tile_state *t0, void *c0, tile_state *t1, void *c1,
                    int (*store)(void *ctx, int slot, const nt_ap *src))
{
    return run_ops2_from(t0, c0, t0->L->first, t1, c1, t1->L->first, store);
}

/* ---------------- EW programs ---------------- */

/* A tile of an EW program waiting for its pair: its patterns (the tiler's
 * are gone once its callback returns) and its state. */
typedef struct ew_tile_rec {
    struct ew_run *w;
    sk_tile_iter it;
    tile_state t;
    int nst; /* its stores issued (held_end) */
} ew_tile_rec;

typedef struct ew_run {
    sk_k *s;
    tile_state t;
    int ntile;
    int next;
    bool has_sr;
    int nbuf;
    int npend;        /* tiles loaded whose ops wait for a partner (0 or 1) */
    bool one;         /* one tile, of a shared kernel: it may run beside the
                       * next such program's (ew_lone) */
    const nt__fgroup *g; /* the group run (nt__sk_fused), or NULL: only a
                          * group's tile is held (its reference, held_end) */
    ew_tile_rec tr[2];
} ew_run;

static int ew_store(void *ctx, int slot, const nt_ap *src)
{
    ew_tile_rec *r = ctx;
    int rc = nt_isa_dma_copy(r->w->s->k, &r->it.ap[r->w->next + slot], src, sk_qfree(r->w->s));
    r->nst += !rc;
    return rc;
}

/* Inputs that may be loaded as a column (plan.colok): f32, and every live
 * op reading them a binary ALU op, which takes a column operand as the
 * per-partition scalar of tensor_scalar (emit_op) -- the same ALU step on
 * the same values as the full tile, so the same bits.  plan.bcok: float
 * inputs read by computing ops only, spread from one column on chip (a
 * scalar's gradient expanded over a mean's input: 512 us of DMA
 * descriptors for [2M] bf16, one per element, before); and integer inputs
 * whatever reads them: an integer tensor_copy moves the bits (there is no
 * NaN payload to make canonical), so the spread tile is the tile the DMA
 * would have loaded (cross_entropy's backward compares each row's label,
 * expanded over the row, with the class index: i32 labels of [2048, 114]
 * were one 4-byte descriptor per element, 0.9 MB of DMA time a tile). */
static void plan_colok(plan *L)
{
    const nt__fprog *P = L->P;
    for (int e = 0; e < P->next; e++) {
        L->colok[e] = L->eused[e] && !P->ext[e].red && P->ext[e].dtype == NT_F32;
        L->bcok[e] = L->eused[e] && !P->ext[e].red &&
                     (isf((nt_dtype)P->ext[e].dtype) || bc_int((nt_dtype)P->ext[e].dtype));
    }
    for (int k = L->first; k < P->nops; k++) {
        const nt__fop *o = &P->ops[k];
        if (!L->live[k])
            continue;
        int kind = nt__ops[o->op].kind;
        bool alu = (kind == NT_KIND_BINARY || kind == NT_KIND_CMP) && alu_of(o->op) >= 0 &&
                   isf((nt_dtype)P->vals[o->out].dtype) && !P->vals[o->out].red;
        bool calc = kind == NT_KIND_UNARY || kind == NT_KIND_SCALAR ||
                    kind == NT_KIND_BINARY || kind == NT_KIND_CMP;
        for (int q = 0; q < o->nin; q++) {
            if (NT_F_IS_EXT(o->a[q]) && !alu)
                L->colok[NT_F_EXT_IDX(o->a[q])] = false;
            if (NT_F_IS_EXT(o->a[q]) && !calc &&
                !bc_int((nt_dtype)P->ext[NT_F_EXT_IDX(o->a[q])].dtype))
                L->bcok[NT_F_EXT_IDX(o->a[q])] = false;
        }
    }
}

/* Whether the HBM pattern a is constant along the free axis (every free
 * dim of step 0 or size 1): a [C, 1] operand of a [C, M] op.  Its DMA with
 * a step-0 source is one small descriptor per element, so the tile loads
 * one column instead (219 us -> about 30 us for [64, 12544] * [64, 1]). */
static bool ap_col(const nt_ap *a, int64_t nf)
{
    if (nf < 2)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->step[i] != 0 && a->num[i] != 1)
            return false;
    return true;
}

/* Loads a tile and runs the ops of tiles in pairs (run_ops2); run_ew runs
 * a last odd tile alone. */
static int ew_tile(void *ctx, const sk_tile_iter *it)
{
    ew_run *w = ctx;
    plan *L = w->t.L;
    const nt__fprog *P = L->P;
    ew_tile_rec *r = &w->tr[w->npend];
    r->w = w;
    r->it = *it;
    r->t = w->t;
    r->t.buf = w->ntile++ % w->nbuf;
    r->t.np = it->np;
    r->t.nf = it->nf;
    if (w->has_sr)
        set_index(&r->t.E, &r->it.ap[w->next + P->nout]);
    r->t.ecol = 0;
    for (int e = 0; e < P->next; e++) {
        if (!L->eused[e])
            continue;
        nt_ap src = r->it.ap[e];
        bool cst = !w->has_sr && e < 32 && ap_col(&src, it->nf);
        bool col = cst && L->colok[e], spread = cst && !col && L->bcok[e];
        if (col || spread)
            src.ndim = 1, src.num[0] = 1, src.step[0] = 1;
        if (col)
            r->t.ecol |= 1u << e;
        nt_tile *rt = L->R.tile[r->t.buf][L->ereg[e]];
        nt_ap d = nt_tile_slice(rt, 0, it->np, 0, col || spread ? 1 : it->nf);
        int rc = nt_isa_dma_copy(w->s->k, &d, &src, sk_qfree(w->s));
        if (!rc && spread) { /* columns 1.. from column 0 (an exact copy) */
            nt_ap rest = nt_tile_slice(rt, 0, it->np, 1, it->nf - 1);
            d.num[0] = it->nf - 1, d.step[0] = 0;
            rc = nt_isa_tensor_copy(w->s->k, &rest, &d, NT_ENGINE_VECTOR);
        }
        if (rc)
            return rc;
    }
    if (w->npend == 0) {
        w->npend = 1;
        return 0;
    }
    w->npend = 0;
    return run_ops2(&w->tr[0].t, &w->tr[0], &w->tr[1].t, &w->tr[1], ew_store);
}

/* The tiles of a program, and its first one. */
typedef struct tile_first {
    int64_t n;
    sk_tile_iter it;
} tile_first;

static int tile_count(void *ctx, const sk_tile_iter *t)
{
    tile_first *c = ctx;
    if (c->n++ == 0)
        c->it = *t;
    return 0;
}

static int tile_widest(void *ctx, const sk_tile_iter *t)
{
    int64_t *m = ctx;
    if (t->nf > *m)
        *m = t->nf;
    return 0;
}

/* The free size of a program's registers: F, or for a program smaller than
 * one tile of F a partition (a bias's update: [128, 8]) the widest tile the
 * tiler makes of it, so that the registers take what the program uses.
 * Registers of F (2 KiB a partition each) put a small program's six sets
 * on 60 KiB of SBUF, over the bytes of the kernels around it in a
 * captured program or the programs of a shared kernel, whose reads its
 * loads then wait for; the tiles, and so the instructions, stay the same. */
static int64_t ew_regs_free(const sk_tiler *T, int64_t F, int64_t per)
{
    if (per >= F)
        return F;
    int64_t m = 1;
    sk_tiler_run(T, tile_widest, &m);
    m = (m + 15) / 16 * 16; /* a multiple of 16 elements (64 bytes of f32) */
    return m < F ? m : F;
}

/* The last tile of an EW program of a shared kernel left alone (a bias's
 * update is one tile, [128, 8]), held until the next program's lone tile,
 * beside which it runs (run_ops2): AdamW's chain of one tile alternates
 * VectorE and ScalarE, each waiting for the other, and the small updates of
 * the main job's MLP ran four such chains one after another.  Each tile
 * runs its own ops with its own program's engine choice (tile_state.sf),
 * so every instruction is the one it was. */
typedef struct ew_held {
    ew_run w; /* w.tr[0] the tile */
    plan *L;
    nt__fprog P; /* L's program (the caller's goes when it returns) */
    nt__fgroup g; /* the caller's group, its program P */
} ew_held;

static _Thread_local ew_held *Held;

/* The HBM bytes [*lo, *hi) pattern a may touch. */
static void ap_span(const nt_ap *a, uintptr_t *lo, uintptr_t *hi)
{
    int64_t esz = (int64_t)nt__dtype_size(a->dtype), l, h;
    nt__sim_extent(a, &l, &h); /* the free dims' */
    int64_t d = (int64_t)(a->np - 1) * a->pstep;
    *(d < 0 ? &l : &h) += d;
    *lo = (uintptr_t)a->hbm + (uintptr_t)((a->offset + l) * esz);
    *hi = (uintptr_t)a->hbm + (uintptr_t)((a->offset + h + 1) * esz);
}

/* Whether the HBM bytes patterns a[0..na) may touch meet those b[0..nb) may. */
static bool spans_meet(const nt_ap *a, int na, const nt_ap *b, int nb)
{
    for (int i = 0; i < na; i++) {
        uintptr_t a0, a1;
        ap_span(&a[i], &a0, &a1);
        for (int j = 0; j < nb; j++) {
            uintptr_t b0, b1;
            ap_span(&b[j], &b0, &b1);
            if (a0 < b1 && b0 < a1)
                return true;
        }
    }
    return false;
}

/* Whether a held tile's stores may touch bytes ap[0..n) (the next program's
 * inputs and outputs, before it loads any) read or write: the planner keeps
 * programs of a shared kernel from reading what another writes, but a dead
 * output's storage may be another's output (its stores must then keep
 * their order), and a load before the held stores would read stale bytes. */
static bool held_clash(const ew_held *h, const nt_ap *ap, int n)
{
    const ew_tile_rec *r = &h->w.tr[0];
    return spans_meet(&r->it.ap[h->w.next], h->P.nout, ap, n);
}

/* The held program's end, its tiles' ops run (rc their error, 0 if they
 * all ran): its values are the kernel's, unless the kernel failed before
 * its stores were all issued (a later program's allocation or instruction
 * failed; test_oom's loop).  Its sk_join_leave had returned success, so no
 * fallback of the planner's comes for it: its values then come from its
 * reference (as with NT_SIM_PROGRAM_VALUES on, sk_join_leave), the same
 * bits, when no store ran or it writes none of the bytes it reads (an
 * in-place update half stored cannot be done again); else, or if the
 * reference fails, its outputs carry the error (core/backend.h
 * nt__group_failed). */
static void held_end(ew_held *h, int rc)
{
    sk_k *s = h->w.s;
    const ew_tile_rec *r = &h->w.tr[0];
    if (!rc)
        rc = nt_sim_kernel_error(s->k);
    if (r->nst >= h->P.nout) /* every output slot's one store ran */
        rc = 0;
    if (rc && nt__sim_kernel_functional(s->k)) {
        bool redo = r->nst == 0 || !spans_meet(&r->it.ap[h->w.next], h->P.nout, r->it.ap,
                                               h->w.next);
        int rr = redo ? sk_ref_fused(&h->g) : rc;
        if (rr && nt__group_failed)
            nt__group_failed(&h->g, rr, "in a shared kernel");
    }
    g_free(h->L);
    free(h);
}

/* nt__sk_join_close or sk_join_leave: the held tile runs alone (in a
 * kernel that failed, none of its instructions run: held_end). */
static int ew_flush(void)
{
    ew_held *h = Held;
    Held = NULL;
    sk_k *s = h->w.s;
    bool sf = s->scalar_first; /* the next program's engine choice stays */
    int rc = nt_sim_kernel_error(s->k);
    if (!rc)
        rc = run_ops(&h->w.tr[0].t, ew_store, &h->w.tr[0]);
    s->scalar_first = sf;
    held_end(h, rc);
    return rc;
}

/* Runs a program's lone last tile: beside a held one (whose stores touch
 * none of this program's bytes: run_ew), held itself (the plan *Lp then
 * the held tile's), or alone. */
static int ew_lone(ew_run *w, plan **Lp)
{
    sk_k *s = w->s;
    ew_held *h = Held;
    if (!w->one)
        return run_ops(&w->tr[0].t, ew_store, &w->tr[0]);
    bool sf = s->scalar_first;
    if (h) {
        Held = NULL;
        sk_join_hold(NULL);
        w->tr[0].t.sf = (signed char)(sf + 1);
        int rc = run_ops2(&h->w.tr[0].t, &h->w.tr[0], &w->tr[0].t, &w->tr[0], ew_store);
        s->scalar_first = sf;
        held_end(h, rc);
        return rc;
    }
    h = malloc(sizeof *h);
    if (!h)
        return run_ops(&w->tr[0].t, ew_store, &w->tr[0]);
    h->w = *w;
    h->w.tr[0].w = &h->w;
    h->w.tr[0].t.sf = (signed char)(s->scalar_first + 1);
    h->L = *Lp;
    /* the compiled program only: its run and reference counts and the
     * cache's links change under the threads running the same cached
     * program meanwhile (plan.c prog_unref, under its cache lock) */
    memcpy(&h->P, h->L->P, offsetof(nt__fprog, runs));
    memset((char *)&h->P + offsetof(nt__fprog, runs), 0, sizeof h->P - offsetof(nt__fprog, runs));
    h->L->P = &h->P;
    h->g = *w->g;
    h->g.prog = &h->P;
    *Lp = NULL;
    Held = h;
    sk_join_hold(ew_flush);
    return 0;
}

/* Runs an EW program over its iteration shape. */
static int run_ew(sk_k *s, const nt__fprog *P, const nt__fgroup *g, nt_tensor *const *ext,
                  nt_tensor *const *out, const uint64_t *keys)
{
    plan *L = malloc(sizeof *L);
    if (!L)
        return sk_data_error(s, NT_EHOSTMEM, "out of host memory for a kernel plan");
    int rc = plan_make(L, P, 0, true);
    if (rc) {
        g_free(L);
        return rc;
    }
    plan_colok(L);
    /* The largest free size (<= EW_FMAX) whose two register sets fit, but
     * no more than a sixteenth of each partition's share of the iteration
     * space (down to EW_FMIN): a program of few big tiles loads its first
     * tile and computes and stores its last one with nothing to overlap
     * (AdamW over [1024, 1024] in four tiles of 2048 spent a third of its
     * time so).  Tiles run in pairs (run_ops2); up to EW_NBUF register
     * sets, so the next pair loads while this one computes and stores. */
    int64_t F = EW_FMAX, per = nt__numel(P->ndim, P->shape) / 128;
    while (F > EW_FMIN && F > per / EW_TILES)
        F /= 2;
    while (F > 64 && plan_bytes(L, F, 2) > SK_SBUF_BUDGET)
        F /= 2;
    /* a row length that cuts a partition's share evenly (down to F / 2, in
     * steps of 16 elements), so the last tile is not a sliver on a few
     * partitions -- as slow per instruction as a full one, and its DMAs on
     * few engines ([1024, 784]: 14 tiles of 448, not 12 of 512 and one on
     * 32 partitions) */
    if (nt__numel(P->ndim, P->shape) % 128 == 0 && per % F)
        for (int64_t f = F - F % 16; f >= F / 2 && f >= 16; f -= 16)
            if (per % f == 0) {
                F = f;
                break;
            }
    int nbuf = plan_bytes(L, F, EW_NBUF) <= SK_SBUF_BUDGET ? EW_NBUF
               : plan_bytes(L, F, 2) <= SK_SBUF_BUDGET ? 2
                                                        : 1;
    if (plan_bytes(L, F, nbuf) > SK_SBUF_BUDGET) {
        g_free(L);
        return NT_ENOTSUP;
    }
    ew_run w;
    memset(&w, 0, sizeof w);
    w.s = s;
    w.t.L = L;
    w.next = P->next;
    w.has_sr = prog_has_sr(P);
    w.nbuf = nbuf;
    sk_hv v[SK_MAXOPND];
    for (int e = 0; e < P->next; e++)
        sk_hv_of(&v[e], ext[e], P->ndim, P->shape);
    for (int o = 0; o < P->nout; o++)
        sk_hv_of(&v[P->next + o], out[o], P->ndim, P->shape);
    int nv = P->next + P->nout;
    if (w.has_sr)
        index_view(&v[nv++], P->ndim, P->shape);
    sk_tiler T;
    sk_tiler_init(&T, P->ndim, P->shape, nv, v, F);
    tile_first tf = {0};
    if (per < F)
        sk_tiler_run(&T, tile_count, &tf);
    w.g = g;
    w.one = tf.n == 1 && g && sk_join_is(s) && !w.has_sr; /* (keys are the caller's) */
    /* a held tile has no partner here, or one whose bytes its stores may
     * touch: it runs alone first, before this program's loads */
    if (sk_join_is(s) && (!w.one || (Held && held_clash(Held, tf.it.ap, P->next + P->nout))))
        rc = sk_join_unhold();
    if (!rc)
        rc = plan_alloc(s, L, &w.t.E, ew_regs_free(&T, F, per), nbuf);
    w.t.E.keys = keys;
    if (!rc) {
        rc = sk_tiler_run(&T, ew_tile, &w);
        if (!rc && w.npend)
            rc = ew_lone(&w, &L);
    }
    g_free(L);
    return rc;
}

/* ---------------- ROW programs ---------------- */

/* A tile of a ROW program waiting for its pair (as ew_tile_rec): its row
 * patterns and its state. */
typedef struct row_tile_rec {
    struct row_run *w;
    nt_ap rows[SK_MAXOPND]; /* this tile's patterns */
    tile_state t;
} row_tile_rec;

typedef struct row_run {
    sk_k *s;
    tile_state t;
    int ntile;
    int nbuf; /* register sets in rotation */
    const nt__fprog *P;
    bool has_sr;
    int64_t C;
    int64_t cst[SK_MAXOPND]; /* strides along the row */
    int npend;               /* tiles loaded whose ops wait for a partner (0 or 1) */
    bool pairs;              /* tiles run in pairs (run_ops2) */
    emit_ctx E1;             /* the temporaries of a pair's second tile */
    row_tile_rec tr[2];
} row_run;

static int row_store(void *ctx, int slot, const nt_ap *src)
{
    row_tile_rec *r = ctx;
    return nt_isa_dma_copy(r->w->s->k, &r->rows[r->w->P->next + slot], src, sk_qout(r->w->s));
}

/* Loads a tile; with pairs, runs the ops of two tiles interleaved op by op
 * (run_ops2, as EW programs do), each with temporaries of its own, so that
 * VectorE and ScalarE each have two independent chains to work on: one
 * tile's chain (a layer norm's backward: reductions and row scalars on
 * VectorE and ScalarE in turn, each step waiting for the other's) left
 * both engines idle half of the time.  run_row runs a last odd tile
 * alone. */
static int row_tile(void *ctx, const sk_tile_iter *it)
{
    row_run *w = ctx;
    plan *L = w->t.L;
    const nt__fprog *P = w->P;
    row_tile_rec *r = &w->tr[w->npend];
    r->w = w;
    r->t = w->t;
    if (w->npend == 1) { /* the pair's second tile: its own temporaries */
        memcpy(r->t.E.tf, w->E1.tf, sizeof r->t.E.tf);
        r->t.E.ti = w->E1.ti;
    }
    r->t.buf = w->ntile++ % w->nbuf;
    r->t.np = it->np;
    r->t.nf = w->C;
    if (w->has_sr) {
        /* row r's elements are r * C + j; a per-row value's index is r */
        const nt_ap *ix = &it->ap[P->next + P->nout];
        emit_ctx *E = &r->t.E;
        E->idx = (nt_isa_index){ix->offset * w->C, ix->pstep * w->C, {1, 0, 0, 0}};
        E->idx_ndim = 1;
        E->idx_num[0] = w->C;
        E->idxr = (nt_isa_index){ix->offset, ix->pstep, {0, 0, 0, 0}};
    }
    for (int q = 0; q < P->next + P->nout; q++) {
        bool red = q < P->next ? P->ext[q].red : P->vals[P->out_val[q - P->next]].red;
        nt_ap a = it->ap[q];
        a.ndim = 1;
        a.num[0] = red ? 1 : w->C;
        a.step[0] = red ? 1 : w->cst[q];
        r->rows[q] = a;
    }
    for (int e = 0; e < P->next; e++) {
        if (!L->eused[e])
            continue;
        nt_ap d = nt_tile_slice(L->R.tile[r->t.buf][L->ereg[e]], 0, it->np, 0,
                                P->ext[e].red ? 1 : w->C);
        int rc = nt_isa_dma_copy(w->s->k, &d, &r->rows[e], sk_qfree(w->s));
        if (rc)
            return rc;
    }
    if (!w->pairs)
        return run_ops(&r->t, row_store, r);
    if (w->npend == 0) {
        w->npend = 1;
        return 0;
    }
    w->npend = 0;
    return run_ops2(&w->tr[0].t, &w->tr[0], &w->tr[1].t, &w->tr[1], row_store);
}

/* Bytes per partition of the temporaries plan_alloc gives a tile of free
 * size F (a pair's second tile takes as many again). */
static int64_t temp_bytes(const plan *L, int64_t F)
{
    int64_t f = (F * 4 + 63) / 64 * 64, b = 0;
    if (L->needs & NEED_TF)
        b += ((L->needs & NEED_TF4) ? 4 : 2) * f;
    if (L->needs & NEED_TI)
        b += f;
    return b;
}

static int run_row(sk_k *s, const nt__fprog *P, nt_tensor *const *ext, nt_tensor *const *out,
                   const uint64_t *keys)
{
    int nd = P->ndim;
    int64_t C = P->shape[nd - 1];
    plan *L = malloc(sizeof *L);
    if (!L)
        return sk_data_error(s, NT_EHOSTMEM, "out of host memory for a kernel plan");
    /* a stored value keeps its register for the rest of the tile when two
     * sets of such registers fit (as in EW programs): a later op writing
     * there waited for the store's DMA, 2 us and more, in every tile's
     * chain (the GPT's layer norm recompute over [2048, 128]: 70 us) */
    int rc = plan_make(L, P, 0, true);
    L->needs |= NEED_TF; /* mean's f32 sum */
    if (!rc && plan_bytes(L, C, 2) > SK_SBUF_BUDGET) {
        rc = plan_make(L, P, 0, false);
        L->needs |= NEED_TF;
    }
    /* up to EW_NBUF register sets: a tile's loads go while the tiles before
     * it compute and store (with two, a short row's tile -- ~1 us of work,
     * 2 us of fixed DMA cost per transfer -- waited for the tile before the
     * last to have stored) */
    int nbuf = EW_NBUF;
    while (nbuf > 1 && plan_bytes(L, C, nbuf) > SK_SBUF_BUDGET)
        nbuf--;
    if (rc || plan_bytes(L, C, nbuf) > SK_SBUF_BUDGET || C > NT_SIM_SBUF_MAX_FREE) {
        g_free(L);
        return rc ? rc : NT_ENOTSUP;
    }
    row_run w;
    memset(&w, 0, sizeof w);
    w.s = s;
    w.P = P;
    w.C = C;
    w.nbuf = nbuf;
    w.t.L = L;
    w.has_sr = prog_has_sr(P);
    /* tiles in pairs when two register sets rotate and a second set of
     * temporaries fits beside them */
    w.pairs = nbuf >= 2 && plan_bytes(L, C, nbuf) + temp_bytes(L, C) <= SK_SBUF_BUDGET;
    rc = plan_alloc(s, L, &w.t.E, C, nbuf);
    w.t.E.keys = keys;
    if (!rc && w.pairs) {
        static const char *const tn[4] = {"tmp0.b", "tmp1.b", "tmp2.b", "tmp3.b"};
        for (int i = 0; i < ((L->needs & NEED_TF4) ? 4 : 2) && (L->needs & NEED_TF); i++)
            w.E1.tf[i] = sk_tile(s, tn[i], NT_F32, 128, C);
        if (L->needs & NEED_TI)
            w.E1.ti = sk_tile(s, "tmpi.b", NT_I32, 128, C);
        rc = nt_sim_kernel_error(s->k);
    }
    if (!rc) {
        /* tiles over the row index (all dims but the last), one row per
         * partition; operands per-row or full along the last dim */
        sk_hv v[SK_MAXOPND];
        for (int e = 0; e < P->next; e++)
            sk_hv_of(&v[e], ext[e], nd, P->shape);
        for (int o = 0; o < P->nout; o++)
            sk_hv_of(&v[P->next + o], out[o], nd, P->shape);
        for (int q = 0; q < P->next + P->nout; q++)
            w.cst[q] = v[q].st[nd - 1];
        int nv = P->next + P->nout;
        if (w.has_sr) /* the row index space, contiguous */
            index_view(&v[nv++], nd - 1, P->shape);
        sk_tiler T;
        sk_tiler_init(&T, nd - 1, P->shape, nv, v, 1);
        rc = sk_tiler_run(&T, row_tile, &w);
        if (!rc && w.npend)
            rc = run_ops(&w.tr[0].t, row_store, &w.tr[0]);
    }
    g_free(L);
    return rc;
}

/* ---------------- MM programs ---------------- */

/* One accumulator block of the epilogue: its register set (t.buf), its
 * HBM patterns and its program's state. */
typedef struct mm_blk {
    struct mm_run *w;
    tile_state t;
    int k0; /* the first op mm_finish runs (the evacuation may have run one) */
    int64_t due; /* the last epilogue call its ops may be issued in (its bank's
                    life, nt_tile_matmul_args.acc_lives), INT64_MAX: any */
    nt_ap acc; /* the accumulator its ops read value 0 from (t.acc) */
    nt_ap pats[SK_MAXOPND];
} mm_blk;

typedef struct mm_run {
    sk_k *s;
    tile_state t;
    int ntile;
    const nt__fprog *P;
    nt_tensor *const *ext;
    nt_tensor *const *out;
    sk_hv v[SK_MAXOPND];
    int nbatch;
    int64_t batch[NT_MAX_DIMS];
    int dm, dn;          /* iteration dims of m and n, -1 if dropped */
    int nbuf;            /* epilogue register sets in rotation (>= 2) */
    int pend[3];         /* the blocks whose ops wait for later blocks' loads, oldest
                            first (npend of them) */
    int npend;
    bool lag;            /* an output is an input too (in place): lag one block */
    bool pairs;          /* ... and the lagged blocks' ops run in pairs (mm_drain) */
    int lives;           /* nt_tile_matmul_args.acc_lives of the block evacuated: its
                            bank stays for the lag when >= 1 (acc_kept) */
    int64_t ncall;       /* epilogue calls so far */
    int evk;             /* the op the evacuation runs from PSUM (evac_op), 0 none */
    bool in_psum;        /* value 0 may be read in PSUM (psum_ok) */
    mm_blk blk[NBUF_MAX];
    sk_hv iv;            /* element indices (stochastic rounding) */
} mm_run;

static int mm_store(void *ctx, int slot, const nt_ap *src)
{
    mm_blk *b = ctx;
    return nt_isa_dma_copy(b->w->s->k, &b->pats[b->w->P->next + slot], src, sk_qout(b->w->s));
}

/* The store of the value a block's evacuation made: the matmul's, or its
 * op's (none when the ops read the accumulator). */
static int mm_evac_store(mm_blk *b)
{
    const nt__fprog *P = b->w->P;
    int v = b->k0 > b->t.L->first ? P->ops[b->k0 - 1].out : 0;
    if (b->t.acc || P->vals[v].store < 0)
        return 0;
    nt_ap va = val_ap(&b->t, v);
    return mm_store(b, P->vals[v].store, &va);
}

/* The second half of a block's epilogue: its stores and ops. */
static int mm_finish(mm_blk *b)
{
    int rc = mm_evac_store(b);
    return rc ? rc : run_ops_from(&b->t, b->k0, mm_store, b);
}

/* The second halves of two blocks' epilogues, their ops interleaved op by
 * op (run_ops2_from): AdamW's chain alternates VectorE and ScalarE, and
 * VectorE waited for ScalarE's sqrt and scaling of each block (0.9 of its
 * 5 us) with nothing else to do. */
static int mm_finish2(mm_blk *b0, mm_blk *b1)
{
    int rc = mm_evac_store(b0);
    if (!rc)
        rc = mm_evac_store(b1);
    return rc ? rc : run_ops2_from(&b0->t, b0, b0->k0, &b1->t, b1, b1->k0, mm_store);
}

/* Finishes the waiting blocks that may go: all of them (all), else every
 * one but the block just loaded (the newest).  In pairs (w->pairs) a block
 * waits for a partner unless its bank's life ends with this call (due). */
static int mm_drain(mm_run *w, bool all)
{
    int rc = 0;
    while (!rc) {
        int ready = all ? w->npend : w->npend - 1;
        if (ready <= 0)
            break;
        mm_blk *b0 = &w->blk[w->pend[0]];
        int take = ready >= 2 && w->pairs ? 2 : 1;
        if (take == 1 && w->pairs && !all && b0->due > w->ncall)
            break;
        rc = take == 2 ? mm_finish2(b0, &w->blk[w->pend[1]]) : mm_finish(b0);
        w->npend -= take;
        memmove(w->pend, w->pend + take, (size_t)w->npend * sizeof w->pend[0]);
    }
    return rc;
}

/* The op the evacuation can run reading PSUM itself, 0 if none: the first
 * op, a binary ALU step of the f32 matmul result (read by nothing else,
 * never stored) and an input loaded once (a bias).  Its tensor_tensor
 * computes from the accumulator what it computed from the f32 copy the
 * evacuation made: the copy changed no bit (f32 to f32; a NaN's payload
 * never matters), and an input in PSUM costs VectorE N cycles, not 2N,
 * where the copy took ScalarE N more. */
static int evac_op(const plan *L)
{
    const nt__fprog *P = L->P;
    int k = 1;
    while (k < P->nops && !L->live[k])
        k++;
    if (k >= P->nops || P->vals[0].dtype != NT_F32 || P->vals[0].red ||
        P->vals[0].store >= 0 || L->vuses[0] != 1)
        return 0;
    const nt__fop *o = &P->ops[k];
    int kind = nt__ops[o->op].kind;
    if ((kind != NT_KIND_BINARY && kind != NT_KIND_CMP) || o->nin != 2 || P->vals[o->out].red)
        return 0;
    int alu = alu_of(o->op);
    if (alu < 0 || alu >= NT_ALU_COUNT)
        return 0;
    int other = o->a[0] == 0 ? o->a[1] : o->a[1] == 0 ? o->a[0] : 0;
    return NT_F_IS_EXT(other) && L->pre[NT_F_EXT_IDX(other)] ? k : 0;
}

/* Whether the ops may read the f32 matmul result (value 0) in PSUM instead
 * of its copy: stored nowhere, and read only by ALU steps that VectorE or
 * ScalarE run (GpSimd cannot read PSUM), which read from the accumulator
 * what they read from the f32 copy -- the copy changed no bit (f32 to f32;
 * a NaN's payload never matters).  An input in PSUM costs VectorE N cycles
 * instead of 2N, and ScalarE's N of the copy go: AdamW's g - m and g * g.
 * Asked only of a lagged program (mm_epi), whose ops would otherwise wait
 * for the copy on ScalarE; the tile program says per block whether the
 * bank stays for the lag (nt_tile_matmul_args.acc_lives >= 1). */
static bool psum_ok(const plan *L)
{
    const nt__fprog *P = L->P;
    if (P->vals[0].dtype != NT_F32 || P->vals[0].red || P->vals[0].store >= 0 || L->vuses[0] < 1)
        return false;
    for (int k = L->first; k < P->nops; k++) {
        const nt__fop *o = &P->ops[k];
        bool reads = false;
        for (int q = 0; q < o->nin; q++)
            reads |= o->a[q] == 0;
        if (!L->live[k] || !reads)
            continue;
        int kind = nt__ops[o->op].kind, alu = -1;
        if (kind == NT_KIND_BINARY || kind == NT_KIND_CMP)
            alu = sim_of[o->op];
        else if (kind == NT_KIND_SCALAR)
            alu = scalar_alu(o->op);
        if (alu < 0 || alu >= NT_ALU_COUNT || alu == NT_ALU_POW || P->vals[o->out].red ||
            is_sr(o))
            return false;
    }
    return true;
}

/* Inputs the same for every row block of the product -- broadcast along m
 * and the batch, as a linear layer's bias is -- go into SBUF once, as
 * [128, N] (one DMA), instead of with every block: the qkv layer's bias
 * was 3.1 of the 7.5 MB its kernel moved.  Not an input the program also
 * writes. */
static int mm_preload(sk_k *s, mm_run *w, nt_tensor *const *ext, nt_tensor *const *out)
{
    plan *L = w->t.L;
    const nt__fprog *P = w->P;
    if (w->dn < 0)
        return 0;
    int64_t N = P->shape[w->dn];
    for (int e = 0; e < P->next; e++) {
        if (!L->eused[e] || P->ext[e].red)
            continue;
        const sk_hv *h = &w->v[e];
        bool bc = w->dm < 0 || h->st[w->dm] == 0;
        for (int i = 0; i < w->nbatch; i++)
            bc &= h->st[i] == 0;
        for (int o = 0; o < P->nout; o++)
            bc &= ext[e]->st != out[o]->st;
        if (!bc || N * (int64_t)nt__dtype_size(h->dt) > 16 * 1024)
            continue;
        nt_tile *t = sk_tile(s, "mm.bcast", h->dt, 128, N);
        if (!t)
            return nt_sim_kernel_error(s->k);
        nt_ap src;
        memset(&src, 0, sizeof src);
        src.hbm = h->base;
        src.dtype = h->dt;
        src.np = 128;
        src.pstep = 0;
        src.ndim = 1;
        src.num[0] = N;
        src.step[0] = h->st[w->dn];
        nt_ap dst = nt_tile_ap(t);
        /* the last store queue: the matmul's loads start on the others at
         * once, and its stores reach this one last */
        int rc = nt_isa_dma_copy(s->k, &dst, &src, NT_SIM_DMA_QUEUES - 1);
        if (rc)
            return rc;
        L->pre[e] = t;
    }
    return 0;
}

/* Evacuates the block and loads its epilogue inputs, then runs the ops and
 * stores of the block before it (w->lag) or of this one: with the lag a
 * block's loads are issued before the previous block's stores, which would
 * otherwise hold them up when the program writes what it reads (adjacent
 * row blocks share HBM pages, and a load waits for a store to a page it
 * reads), and run while that block computes. */
static int mm_epi(sk_k *s, const nt_ap *acc, int64_t b, int64_t m0, int64_t n0, void *ctx)
{
    mm_run *w = ctx;
    const nt__fprog *P = w->P;
    plan *L = w->t.L;
    int np = acc->np;
    int64_t nf = ap_count(acc);
    int buf = w->ntile++ % w->nbuf;
    mm_blk *k = &w->blk[buf];
    k->w = w;
    k->t = w->t;
    k->t.buf = buf;
    k->t.np = np;
    k->t.nf = nf;
    k->t.n0 = n0;
    k->k0 = L->first;
    /* batch multi-index */
    int64_t bi[NT_MAX_DIMS];
    for (int i = w->nbatch - 1; i >= 0; i--) {
        bi[i] = b % w->batch[i];
        b /= w->batch[i];
    }
    for (int q = 0; q <= P->next + P->nout; q++) {
        const sk_hv *h = q < P->next + P->nout ? &w->v[q] : &w->iv;
        int64_t off = 0;
        for (int i = 0; i < w->nbatch; i++)
            off += bi[i] * h->st[i];
        int64_t sm = w->dm >= 0 ? h->st[w->dm] : 0, sn = w->dn >= 0 ? h->st[w->dn] : 0;
        nt_ap a;
        memset(&a, 0, sizeof a);
        a.hbm = h->base;
        a.dtype = h->dt;
        a.np = np;
        a.pstep = sm;
        a.offset = off + m0 * sm + n0 * sn;
        a.ndim = 1;
        a.num[0] = nf;
        a.step[0] = sn;
        if (q == P->next + P->nout)
            set_index(&k->t.E, &a);
        else
            k->pats[q] = a;
    }
    /* evacuate: PSUM -> the matmul's dtype (its one rounding), or the
     * first op straight from PSUM, or nothing: the ops read the bank, which
     * the tile program keeps until this block's ops are issued (w->lag:
     * the next block's mm_epi) */
    int rc = 0;
    k->t.acc = NULL;
    if (w->in_psum && w->lives >= 1) {
        k->acc = *acc;
        k->t.acc = &k->acc;
    } else if (w->evk) {
        const nt__fop *o = &P->ops[w->evk];
        int e = NT_F_EXT_IDX(o->a[0] == 0 ? o->a[1] : o->a[0]);
        nt_ap pre = nt_tile_slice(L->pre[e], 0, np, n0, nf), dst = val_ap(&k->t, o->out);
        rc = nt_isa_tensor_tensor(s->k, &dst, o->a[0] == 0 ? acc : &pre, o->a[0] == 0 ? &pre : acc,
                                  (nt_alu_op)alu_of(o->op), NT_ENGINE_VECTOR);
        k->k0 = w->evk + 1;
    } else {
        nt_ap v0 = val_ap(&k->t, 0);
        rc = nt_isa_tensor_copy(s->k, &v0, acc, NT_ENGINE_SCALAR);
    }
    for (int e = 0; e < P->next && !rc; e++) {
        if (!L->eused[e] || L->pre[e])
            continue;
        nt_ap d = nt_tile_slice(L->R.tile[buf][L->ereg[e]], 0, np, 0, nf);
        rc = nt_isa_dma_copy(s->k, &d, &k->pats[e], sk_qfree(s));
    }
    k->due = k->t.acc ? w->ncall + w->lives : INT64_MAX;
    w->pend[w->npend++] = buf;
    if (!rc)
        rc = mm_drain(w, !w->lag);
    w->ncall++;
    return rc;
}

/* side: the side ops (fusion/ir.h) the matmul program takes from A's tiles
 * (sk_mm_side), or NULL. */
static int run_mm(sk_k *s, const nt__fprog *P, nt_tensor *const *ext, nt_tensor *const *out,
                  const uint64_t *keys, const sk_mm_side *side)
{
    const nt__fop *m = &P->ops[0];
    const nt_tensor *a = ext[NT_F_EXT_IDX(m->a[0])], *b = ext[NT_F_EXT_IDX(m->a[1])];
    nt__mminfo mi;
    char why[160];
    if (!nt__matmul_info(a, b, &mi, why, sizeof why))
        return NT_ENOTSUP;
    if (side && !sk_matmul_side_ok(a, b, P->nops > 1, side->colsum != NULL))
        return NT_ENOTSUP;
    if (P->nops == 1) { /* the product and its side sum: stored as nt_matmul stores it */
        int sv = P->vals[0].store;
        return sv < 0 || !nt__is_contig(out[sv])
                   ? NT_ENOTSUP
                   : sk_matmul_run_cs(s, a, b, out[sv], NULL, NULL, side);
    }
    plan *L = malloc(sizeof *L);
    if (!L)
        return sk_data_error(s, NT_EHOSTMEM, "out of host memory for a kernel plan");
    int rc = plan_make(L, P, 1, true);
    if (rc || plan_bytes(L, 512, 2) > SK_SBUF_BUDGET - 64 * 1024) {
        g_free(L);
        return rc ? rc : NT_ENOTSUP;
    }
    /* the matmul's inputs are read by the matmul, not the epilogue */
    mm_run *w = calloc(1, sizeof *w);
    if (!w) {
        g_free(L);
        return sk_data_error(s, NT_EHOSTMEM, "out of host memory for a kernel plan");
    }
    w->s = s;
    w->P = P;
    w->ext = ext;
    w->out = out;
    w->t.L = L;
    w->nbatch = mi.nbatch;
    memcpy(w->batch, mi.batch, sizeof mi.batch);
    int nd = P->ndim;
    bool keep_m = a->ndim > 1, keep_n = b->ndim > 1;
    w->dn = keep_n ? nd - 1 : -1;
    w->dm = keep_m ? (keep_n ? nd - 2 : nd - 1) : -1;
    for (int e = 0; e < P->next; e++)
        sk_hv_of(&w->v[e], ext[e], nd, P->shape);
    for (int o = 0; o < P->nout; o++)
        sk_hv_of(&w->v[P->next + o], out[o], nd, P->shape);
    index_view(&w->iv, nd, P->shape);
    /* the lag pays when a block's loads would wait for the stores before
     * them (an in-place output: AdamW's p, m, v); otherwise a block's ops
     * run at once, before the next block's matmul work takes VectorE */
    for (int e = 0; e < P->next; e++)
        for (int o = 0; o < P->nout; o++)
            if (L->eused[e] && ext[e]->st == out[o]->st)
                w->lag = true;
    w->nbuf = w->lag ? MM_NBUF_LAG : MM_NBUF;
    while (w->nbuf > 2 && plan_bytes(L, 512, w->nbuf) > SK_SBUF_BUDGET - 64 * 1024)
        w->nbuf--;
    /* a pair and the block loaded after it take three register sets */
    w->pairs = w->lag && w->nbuf >= 3;
    rc = plan_alloc(s, L, &w->t.E, 512, w->nbuf);
    w->t.E.keys = keys;
    if (!rc)
        rc = mm_preload(s, w, ext, out);
    w->evk = evac_op(L);
    /* no output shares a storage with any input (the operands included):
     * the tile program may stream the row blocks past a resident B */
    bool apart = true;
    for (int e = 0; e < P->next; e++)
        for (int o = 0; o < P->nout; o++)
            apart &= ext[e]->st != out[o]->st;
    s->mm_apart = apart;
    w->in_psum = w->lag && !w->evk && psum_ok(L);
    s->mm_lives = w->in_psum ? &w->lives : NULL;
    if (!rc)
        rc = sk_matmul_run_cs(s, a, b, NULL, mm_epi, w, side);
    s->mm_apart = false;
    s->mm_lives = NULL;
    if (!rc)
        rc = mm_drain(w, true);
    g_free(w);
    g_free(L);
    return rc;
}

/* An MM program with side ops (fusion/ir.h): the product and epilogue
 * without them, the side sum and the side product riding on the matmul
 * program (sk_mm_side: one program over A's rows, A contiguous; the sum f32;
 * else NT_ENOTSUP, nothing issued, and the planner runs the records one by
 * one).  A side product whose X shares a storage with one of the kernel's
 * outputs runs apart first, as its record did before the epilogue's writes
 * (the program would read X's tiles as the epilogue writes). */
static int run_mm_group(sk_k *s, const nt__fgroup *g, const uint64_t *keys)
{
    const nt__fprog *P = g->prog;
    int ks = 0;
    for (int k = 1; k < P->nops && !ks; k++)
        ks = nt__fop_is_side(P, k) ? k : 0;
    if (!ks)
        return run_mm(s, P, g->ext, g->out, keys, NULL);
    nt__fprog *rp = malloc(sizeof *rp);
    if (!rp)
        return sk_data_error(s, NT_EHOSTMEM, "out of host memory for a kernel plan");
    nt__fgroup rest;
    nt_tensor *so[2];
    int sk[2];
    const nt_tensor *a = g->ext[NT_F_EXT_IDX(P->ops[0].a[0])];
    int ns = nt__fgroup_split(g, &rest, rp, so, sk, 2);
    int rc = ns >= 1 && a->ndim >= 1 && nt__is_contig(a) ? 0 : NT_ENOTSUP;
    int64_t K = a->ndim >= 1 ? a->shape[a->ndim - 1] : 0;
    sk_mm_side side = {0};
    for (int i = 0; i < ns && !rc; i++) {
        if (!so[i] || !nt__is_contig(so[i])) {
            rc = NT_ENOTSUP;
        } else if (P->ops[sk[i]].op == NT_OP_SUM) {
            nt_dtype cd = (nt_dtype)so[i]->dtype;
            if (!nt__dtype_is_f32_or_half(cd) || nt__numel(so[i]->ndim, so[i]->shape) != K)
                rc = NT_ENOTSUP;
            side.colsum = nt__tensor_data(so[i]);
            side.colsum_dtype = cd;
        } else {
            side.x = g->ext[NT_F_EXT_IDX(P->ops[sk[i]].a[1])];
            side.w = so[i];
        }
    }
    if (!rc && side.x) {
        bool shared = false;
        for (int o = 0; o < rp->nout; o++)
            shared |= rest.out[o]->st == side.x->st;
        if (shared) { /* its record's own program, before the epilogue */
            nt_tensor at;
            nt__fside_at(a, &at);
            rc = sk_matmul_run(s, &at, side.x, side.w, NULL, NULL);
            side.x = NULL;
        }
    }
    if (!rc) {
        uint64_t k2[NT_F_MAXOPS] = {0};
        for (int k = 0, j = 0; k < P->nops; k++)
            if (!nt__fop_is_side(P, k))
                k2[j++] = keys[k];
        rc = run_mm(s, rp, rest.ext, rest.out, k2, side.colsum || side.x ? &side : NULL);
    }
    g_free(rp);
    return rc;
}

/* ---------------- entry points ---------------- */

/* Every op the planner puts in a program has an instruction sequence here;
 * checked before anything runs, so a refusal writes nothing. */
static bool prog_supported(const nt__fprog *P)
{
    if (P->kind == NT_FK_BN) /* nt__sk_bn_fused: the planner's two forms */
        return P->nops == 2 && P->ndim >= 2 &&
               (P->ops[0].op == NT_OP_BN_FWD ? P->ops[1].op == NT_OP_RELU && P->ops[1].a[0] == 0
                                              : P->ops[0].op == NT_OP_RELU_BWD &&
                                                    P->ops[1].op == NT_OP_BN_BWD &&
                                                    P->ops[1].a[0] == 0);
    if (P->kind == NT_FK_NORM) /* nt__sk_norm_fused */
        return P->nops == 2 && P->ops[0].op == NT_OP_LAYER_NORM && P->ops[0].nin == 3 &&
               NT_F_IS_EXT(P->ops[0].a[0]) && NT_F_IS_EXT(P->ops[0].a[1]) &&
               NT_F_IS_EXT(P->ops[0].a[2]) && P->vals[0].dtype == NT_F32 &&
               P->ops[1].op == NT_OP_CAST && P->ops[1].nin == 1 && P->ops[1].a[0] == 0 &&
               !is_sr(&P->ops[1]);
    for (int k = P->kind == NT_FK_MM ? 1 : 0; k < P->nops; k++) {
        const nt__fop *o = &P->ops[k];
        if (o->op >= NT_OP_COUNT)
            return false;
        if (nt__fop_is_side(P, k)) /* run_mm_group */
            continue;
        switch (nt__ops[o->op].kind) {
        case NT_KIND_FILL:
            if (o->op != NT_OP_FILL)
                return false;
            break;
        case NT_KIND_COPY:
        case NT_KIND_UNARY:
        case NT_KIND_SCALAR:
        case NT_KIND_BINARY:
        case NT_KIND_CMP:
        case NT_KIND_WHERE: break;
        case NT_KIND_REDUCE:
            if (P->kind != NT_FK_ROW || (o->op != NT_OP_SUM && o->op != NT_OP_MEAN &&
                                         o->op != NT_OP_MAX && o->op != NT_OP_MIN))
                return false;
            break;
        default: return false;
        }
    }
    return P->kind != NT_FK_MM || (P->ops[0].op == NT_OP_MATMUL && NT_F_IS_EXT(P->ops[0].a[0]) &&
                                   NT_F_IS_EXT(P->ops[0].a[1]));
}

int nt__sk_fused(const nt__fgroup *g)
{
    const nt__fprog *P = g->prog;
    static const char *names[] = {"fused.ew", "fused.row", "fused.mm", "fused.norm",
                                  "fused.bn"};
    if (!prog_supported(P))
        return NT_ENOTSUP;
    /* stochastic-rounding casts draw their bits from their own records */
    uint64_t keys[NT_F_MAXOPS] = {0};
    for (int k = 0; k < P->nops && k < g->nrecs; k++)
        if (is_sr(&P->ops[k]))
            keys[k] = nt__rec_sr_key(g->recs[k]);
    nt_tile *mark;
    bool issue;
    bool alone = P->kind == NT_FK_MM || P->kind == NT_FK_NORM || P->kind == NT_FK_BN;
    sk_k *js = !alone ? sk_join_enter("foreach", &issue, &mark) : NULL;
    if (js) { /* a program of a shared kernel (neuron/foreach.c) */
        int jr = issue && P->kind != NT_FK_EW ? sk_join_unhold() : 0; /* run_ew: its own */
        jr = jr || !issue                 ? jr
                 : P->kind == NT_FK_EW ? run_ew(js, P, g, g->ext, g->out, keys)
                                       : run_row(js, P, g->ext, g->out, keys);
        return sk_join_leave(js, mark, jr, sk_ref_fused, g);
    }
    sk_k s;
    int rc = sk_begin(&s, names[P->kind]);
    if (rc)
        return rc;
    bool values = sk_values_begin(&s);
    /* the timing memo: a program with stochastic rounding draws from its
     * records' keys, new every run, so it never comes back */
    if (values && !prog_has_sr(P) && sk_memo_group(&s, g))
        rc = 0; /* the same program ran before: its timing is restored */
    else
        switch (P->kind) {
        case NT_FK_EW: rc = run_ew(&s, P, g, g->ext, g->out, keys); break;
        case NT_FK_ROW: rc = run_row(&s, P, g->ext, g->out, keys); break;
        case NT_FK_MM: rc = run_mm_group(&s, g, keys); break;
        case NT_FK_NORM: rc = nt__sk_norm_fused(&s, g); break;
        case NT_FK_BN: rc = nt__sk_bn_fused(&s, g); break;
        default: rc = NT_ENOTSUP; break;
        }
    /* a refused program issued nothing and computed nothing: the planner
     * replays the group op by op, so the reference must not run either */
    if (values)
        rc = sk_values_end(&s, rc, sk_ref_fused, g);
    bool refused = rc == NT_ENOTSUP && !nt_sim_kernel_error(s.k);
    int rc2 = sk_end(&s);
    if (refused)
        return NT_ENOTSUP; /* nothing issued: the planner replays op by op */
    return rc2 ? rc2 : rc;
}

int nt__sk_ew(const nt__rec *r)
{
    nt__fprog *P = calloc(1, sizeof *P);
    if (!P)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a kernel program");
    const nt_tensor *o = r->out[0];
    P->kind = NT_FK_EW;
    P->nops = 1;
    P->nvals = 1;
    P->ndim = o->ndim;
    memcpy(P->shape, o->shape, sizeof P->shape);
    nt_tensor *ext[NT__MAX_IN] = {0};
    nt__fop *op = &P->ops[0];
    op->op = r->op;
    op->nin = r->nin;
    op->p = r->p;
    op->out = 0;
    for (int i = 0; i < r->nin; i++) {
        int e = -1;
        for (int j = 0; j < P->next; j++)
            if (ext[j] == r->in[i])
                e = j;
        if (e < 0) {
            e = P->next++;
            ext[e] = r->in[i];
            P->ext[e].dtype = r->in[i]->dtype;
        }
        op->a[i] = (int8_t)NT_F_EXT(e);
    }
    P->vals[0].dtype = o->dtype;
    P->vals[0].store = 0;
    P->nout = 1;
    P->out_val[0] = 0;
    uint64_t keys[1] = {0};
    if (is_sr(op))
        keys[0] = nt__rec_sr_key(r);
    nt_tile *mark;
    bool issue;
    sk_k *js = sk_join_enter("foreach", &issue, &mark);
    if (js) { /* one program of a shared kernel (neuron/foreach.c) */
        nt_tensor *outs[1] = {r->out[0]};
        int jr = issue ? run_ew(js, P, NULL, ext, outs, keys) : 0;
        jr = sk_join_leave(js, mark, jr, sk_ref_rec, r);
        g_free(P);
        return jr;
    }
    sk_k s;
    int rc = sk_begin(&s, nt__op_name(r->op));
    if (!rc) {
        nt_tensor *outs[1] = {r->out[0]};
        bool values = sk_values_begin(&s);
        /* the timing memo (a stochastic cast's key is new every run); the
         * program reads its scalars only as immediates (emit_op) */
        int prog = values && !is_sr(op) && sk_memo_rec(&s, r, true) ? 0
                                                              : run_ew(&s, P, NULL, ext, outs, keys);
        rc = values ? sk_values_end(&s, prog, sk_ref_rec, r) : prog;
        int rc2 = sk_end(&s);
        /* the program's own refusal gets a message; sk_end's and the
         * reference's errors already have theirs */
        if (rc2)
            rc = rc2;
        else if (prog)
            rc = nt__kerr(prog, "no simulator program for this op (%s)", nt_strerror(prog));
    }
    g_free(P);
    return rc;
}
