/* cpu/ewise.c - the elementwise families: unary, tensor-scalar, binary,
 * compare, where, copy/cast, fill, arange.
 *
 * One driver walks the output in rows (dims collapsed where every operand is
 * contiguous across them) and hands chunks of up to NT_CHUNK elements to a
 * family function, which widens the inputs to f32 (or i32 for integer math),
 * applies the op's core/ewise.h definition, and rounds once into the output.
 * Compute type: f32 if the output or any input is floating, else i32. */
#include "cpu/cpu.h"

#include <string.h>

#include "core/ewise.h"
#include "core/ewise64.h"
#include "core/gemm.h"

#define NT_CHUNK 512
#define NT_MAXV (1 + NT__MAX_IN)

/* ---------------- views and the driver ---------------- */

void nt__kv_of(nt__kv *v, const nt_tensor *t, int ndim, const int64_t *shape)
{
    v->data = nt__tensor_data(t);
    v->dt = (nt_dtype)t->dtype;
    if (!shape) {
        v->ndim = t->ndim;
        for (int i = 0; i < t->ndim; i++)
            v->shape[i] = t->shape[i], v->stride[i] = t->stride[i];
        return;
    }
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        v->shape[i] = shape[i];
    nt__bcast_strides(t, ndim, shape, v->stride);
}

void nt__gather_f32(float *dst, const nt_tensor *t)
{
    nt__kv v;
    nt__kv_of(&v, t, 0, NULL);
    int64_t n = nt__numel(t->ndim, t->shape);
    if (n == 0)
        return;
    if (v.ndim == 0) {
        nt__ld_f32(dst, v.data, v.dt, 1, 1);
        return;
    }
    int64_t idx[NT_MAX_DIMS] = {0};
    int64_t inner = v.shape[v.ndim - 1], ist = v.stride[v.ndim - 1];
    size_t es = nt__dtype_size(v.dt);
    do {
        nt__ld_f32(dst, v.data + nt__kv_off(&v, idx) * (int64_t)es, v.dt, ist, inner);
        dst += inner;
        idx[v.ndim - 1] = inner - 1;
    } while (nt__idx_next(idx, v.ndim, v.shape));
}

typedef struct {
    int nv;
    char *p[NT_MAXV];
    int64_t st[NT_MAXV];
    nt_dtype dt[NT_MAXV];
} chunk;

typedef void (*chunk_fn)(const nt__rec *r, const chunk *c, int64_t n, void *scratch);

/* The collapsed iteration space of one call: nd dims of shape cs, per
 * operand the element strides cst and element size es. */
typedef struct walk {
    const nt__rec *r;
    nt__kv *v;
    int nv, nd;
    int64_t cs[NT_MAX_DIMS], cst[NT_MAXV][NT_MAX_DIMS];
    size_t es[NT_MAXV];
    chunk_fn fn;
    int64_t n_all, span;
} walk;

/* Elements [lo, hi) of the collapsed row-major order, in chunks of at most
 * NT_CHUNK that never cross a row. */
static void walk_span(const walk *w, int64_t lo, int64_t hi)
{
    float scratch[(NT_MAXV + 1) * NT_CHUNK];
    int nd = w->nd, nv = w->nv;
    int64_t inner = w->cs[nd - 1];
    int64_t idx[NT_MAX_DIMS] = {0};
    for (int64_t rem = lo, d = nd - 1; d >= 0; d--) {
        idx[d] = rem % w->cs[d];
        rem /= w->cs[d];
    }
    chunk c;
    c.nv = nv;
    /* Each operand's element offset, kept up to date as the index moves
     * (short rows, e.g. 32-element heads of a permute, made the offsets'
     * recomputation per chunk a visible part of a copy). */
    int64_t off[NT_MAXV];
    for (int k = 0; k < nv; k++) {
        c.st[k] = w->cst[k][nd - 1], c.dt[k] = w->v[k].dt;
        off[k] = 0;
        for (int i = 0; i < nd; i++)
            off[k] += idx[i] * w->cst[k][i];
    }
    for (int64_t pos = lo; pos < hi;) {
        int64_t j = idx[nd - 1];
        int64_t n = inner - j < NT_CHUNK ? inner - j : NT_CHUNK;
        if (n > hi - pos)
            n = hi - pos;
        for (int k = 0; k < nv; k++)
            c.p[k] = w->v[k].data + off[k] * (int64_t)w->es[k];
        w->fn(w->r, &c, n, scratch);
        pos += n;
        idx[nd - 1] += n;
        for (int k = 0; k < nv; k++)
            off[k] += n * w->cst[k][nd - 1];
        if (idx[nd - 1] == inner) { /* next row: carry through the outer dims */
            idx[nd - 1] = 0;
            for (int k = 0; k < nv; k++)
                off[k] -= inner * w->cst[k][nd - 1];
            for (int d = nd - 2; d >= 0; d--) {
                idx[d]++;
                for (int k = 0; k < nv; k++)
                    off[k] += w->cst[k][d];
                if (idx[d] < w->cs[d])
                    break;
                idx[d] = 0;
                for (int k = 0; k < nv; k++)
                    off[k] -= w->cs[d] * w->cst[k][d];
            }
        }
    }
}

static void walk_block(void *arg, int b)
{
    const walk *w = arg;
    int64_t lo = (int64_t)b * w->span, hi = lo + w->span < w->n_all ? lo + w->span : w->n_all;
    walk_span(w, lo, hi);
}

/* Spans of this many elements, which the caller and the matmul's helper
 * thread claim (nt__par_blocks; NT_CPU_THREADS): calls smaller than two
 * run on the calling thread alone (waking the helper costs more).
 * Elements are independent, and a chunk's stochastic rounding keys each
 * element by its own index, so the cut never changes a bit. */
#define EW_SPAN (64 * 1024)

/* w's collapsed iteration space over views v[0..nv) (v[0] the output) of
 * a common shape: dims merged where every operand is contiguous across
 * them, size-1 dims dropped; w->n_all its element count. */
static void collapse(walk *w, nt__kv *v, int nv)
{
    int ndim = v[0].ndim;
    int64_t shape[NT_MAX_DIMS], st[NT_MAXV][NT_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        shape[i] = v[0].shape[i];
    for (int k = 0; k < nv; k++)
        for (int i = 0; i < ndim; i++)
            st[k][i] = v[k].stride[i];
    /* Collapse dim i into i+1 where every operand is contiguous across them. */
    int nd = 0;
    int64_t *cs = w->cs;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 1 && ndim > 1)
            continue; /* size-1 dims do not move */
        if (nd > 0) {
            bool merge = true;
            for (int k = 0; k < nv && merge; k++)
                merge = w->cst[k][nd - 1] == st[k][i] * shape[i];
            if (merge) {
                cs[nd - 1] *= shape[i];
                for (int k = 0; k < nv; k++)
                    w->cst[k][nd - 1] = st[k][i];
                continue;
            }
        }
        cs[nd] = shape[i];
        for (int k = 0; k < nv; k++)
            w->cst[k][nd] = st[k][i];
        nd++;
    }
    if (nd == 0) { /* a scalar, or all dims 1 */
        cs[0] = 1;
        for (int k = 0; k < nv; k++)
            w->cst[k][0] = 1;
        nd = 1;
    }
    w->nd = nd;
    w->n_all = 1;
    for (int i = 0; i < nd; i++)
        w->n_all *= cs[i];
    for (int k = 0; k < nv; k++)
        w->es[k] = nt__dtype_size(v[k].dt);
}

/* Walks views v[0..nv) (v[0] the output) of a common shape. */
static void drive(const nt__rec *r, nt__kv *v, int nv, chunk_fn fn)
{
    walk w;
    w.r = r, w.v = v, w.nv = nv, w.fn = fn;
    collapse(&w, v, nv);
    if (w.n_all == 0)
        return;
    w.span = EW_SPAN;
    int64_t nblocks = (w.n_all + EW_SPAN - 1) / EW_SPAN;
    if (nblocks < 2 || nblocks > INT32_MAX) {
        walk_span(&w, 0, w.n_all);
        return;
    }
    nt__par_blocks((int)nblocks, walk_block, &w, true);
}

/* Output view plus input views broadcast to the output's shape. */
static int setup(const nt__rec *r, nt__kv *v, int nin)
{
    const nt_tensor *o = r->out[0];
    nt__kv_of(&v[0], o, 0, NULL);
    for (int i = 0; i < nin; i++)
        nt__kv_of(&v[1 + i], r->in[i], o->ndim, o->shape);
    return 1 + nin;
}

/* ---------------- f64 ----------------
 *
 * A chunk with an f64 operand (input or output) computes in double, element
 * by element: each input widened exactly (nt__load_f64), the op's
 * core/ewise64.h definition, one rounding into the output (nt__store_f64).
 * Only ops of core/ewise64.h's lists reach here with f64 operands
 * (dispatcher/dispatch.c refuses the others), and f64 records never join a
 * fused group (fusion/plan.c), so this loop is the one evaluator of f64
 * arithmetic: the same bits in every mode. */
static bool f64_compute(const chunk *c)
{
    for (int k = 0; k < c->nv; k++)
        if (c->dt[k] == NT_F64)
            return true;
    return false;
}

static inline double ld64(const chunk *c, int k, int64_t i)
{
    return nt__load_f64(c->p[k], c->dt[k], i * c->st[k]);
}

static void f64_chunk(const nt__rec *r, const chunk *c, int64_t n)
{
    char *y = c->p[0];
    nt_dtype ydt = c->dt[0];
    int64_t ys = c->st[0];
    switch (nt__ops[r->op].kind) {
    case NT_KIND_UNARY:
        for (int64_t i = 0; i < n; i++)
            nt__store_f64(y, ydt, i * ys, nt__ew64_unary(r->op, ld64(c, 1, i)));
        break;
    case NT_KIND_SCALAR:
        for (int64_t i = 0; i < n; i++)
            nt__store_f64(y, ydt, i * ys, nt__ew64_scalar(r->op, ld64(c, 1, i), r->p.f[0], r->p.f[1]));
        break;
    case NT_KIND_BINARY:
        for (int64_t i = 0; i < n; i++)
            nt__store_f64(y, ydt, i * ys,
                          nt__ew64_binary(r->op, ld64(c, 1, i), ld64(c, 2, i), r->p.i, r->p.f));
        break;
    case NT_KIND_CMP:
        for (int64_t i = 0; i < n; i++)
            nt__store_f64(y, ydt, i * ys, (double)nt__ew64_cmp(r->op, ld64(c, 1, i), ld64(c, 2, i)));
        break;
    case NT_KIND_WHERE:
        for (int64_t i = 0; i < n; i++)
            nt__store_f64(y, ydt, i * ys, ld64(c, 1, i) != 0.0 ? ld64(c, 2, i) : ld64(c, 3, i));
        break;
    case NT_KIND_COPY:
        /* to bf16 / f16 through f32, each step to nearest even: PyTorch's
         * double -> half conversions (a double rounding, as theirs); to
         * f32, f64 and the integers one rounding from the double */
        if (ydt == NT_BF16 || ydt == NT_F16) {
            for (int64_t i = 0; i < n; i++)
                nt__store_f32(y, ydt, i * ys, (float)ld64(c, 1, i));
            break;
        }
        for (int64_t i = 0; i < n; i++)
            nt__store_f64(y, ydt, i * ys, ld64(c, 1, i));
        break;
    default: nt__op_unhandled("cpu f64 elementwise", r->op);
    }
}

/* ---------------- i64 ----------------
 *
 * A chunk with an i64 operand and no floating one computes in int64,
 * element by element (core/dtype.h nt__load_i64 / nt__store_i64): + - *
 * wrap (two's complement), max/min/abs/neg/relu/sign/clamp as for i32, the
 * roundings are the identity; compares and where pick by the exact values.
 * With a floating operand the chunk takes the f32 (or f64) path, the i64
 * values rounded once to f32 as PyTorch's type promotion does. */
static bool has_dtype(const chunk *c, nt_dtype dt)
{
    for (int k = 0; k < c->nv; k++)
        if (c->dt[k] == dt)
            return true;
    return false;
}

static inline int64_t ld_i64(const chunk *c, int k, int64_t i)
{
    return nt__load_i64(c->p[k], c->dt[k], i * c->st[k]);
}

static int64_t i64_unary(int op, int64_t a, int64_t s0, int64_t s1)
{
    switch (op) {
    case NT_OP_NEG: return (int64_t)(0u - (uint64_t)a);
    case NT_OP_ABS: return a < 0 ? (int64_t)(0u - (uint64_t)a) : a;
    case NT_OP_RELU: return a > 0 ? a : 0;
    case NT_OP_SIGN: return (a > 0) - (a < 0);
    case NT_OP_FLOOR:
    case NT_OP_CEIL:
    case NT_OP_ROUND:
    case NT_OP_TRUNC: return a;
    case NT_OP_ADD_SCALAR: return (int64_t)((uint64_t)a + (uint64_t)s0);
    case NT_OP_MUL_SCALAR: return (int64_t)((uint64_t)a * (uint64_t)s0);
    case NT_OP_CLAMP: {
        int64_t x = a < s0 ? s0 : a;
        return x > s1 ? s1 : x;
    }
    default: nt__op_unhandled("cpu i64 unary", op);
    }
}

static int64_t i64_binary(int op, int64_t a, int64_t b)
{
    switch (op) {
    case NT_OP_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
    case NT_OP_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
    case NT_OP_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
    case NT_OP_MAXIMUM: return b > a ? b : a;
    case NT_OP_MINIMUM: return b < a ? b : a;
    case NT_OP_EQ: return a == b;
    case NT_OP_NE: return a != b;
    case NT_OP_LT: return a < b;
    case NT_OP_LE: return a <= b;
    case NT_OP_GT: return a > b;
    case NT_OP_GE: return a >= b;
    default: nt__op_unhandled("cpu i64 binary", op);
    }
}

static void i64_chunk(const nt__rec *r, const chunk *c, int64_t n)
{
    char *y = c->p[0];
    nt_dtype ydt = c->dt[0];
    int64_t ys = c->st[0];
    int64_t s0 = nt__f64_to_i64(r->p.f[0]), s1 = nt__f64_to_i64(r->p.f[1]);
    switch (nt__ops[r->op].kind) {
    case NT_KIND_UNARY:
    case NT_KIND_SCALAR:
        for (int64_t i = 0; i < n; i++)
            nt__store_i64(y, ydt, i * ys, i64_unary(r->op, ld_i64(c, 1, i), s0, s1));
        break;
    case NT_KIND_BINARY:
    case NT_KIND_CMP:
        for (int64_t i = 0; i < n; i++)
            nt__store_i64(y, ydt, i * ys, i64_binary(r->op, ld_i64(c, 1, i), ld_i64(c, 2, i)));
        break;
    case NT_KIND_WHERE:
        for (int64_t i = 0; i < n; i++)
            nt__store_i64(y, ydt, i * ys, ld_i64(c, 1, i) != 0 ? ld_i64(c, 2, i) : ld_i64(c, 3, i));
        break;
    case NT_KIND_COPY: /* int to int wraps, as for i32 */
        for (int64_t i = 0; i < n; i++)
            nt__store_i64(y, ydt, i * ys, ld_i64(c, 1, i));
        break;
    default: nt__op_unhandled("cpu i64 elementwise", r->op);
    }
}

static bool float_compute(const chunk *c);

/* The chunk's f64 or i64 evaluation, when it has such an operand: true
 * when done. */
static bool wide(const nt__rec *r, const chunk *c, int64_t n)
{
    if (f64_compute(c)) {
        f64_chunk(r, c, n);
        return true;
    }
    /* casts to or from i64 too: exact from and to the int64 value */
    if (has_dtype(c, NT_I64) && (!float_compute(c) || nt__ops[r->op].kind == NT_KIND_COPY)) {
        i64_chunk(r, c, n);
        return true;
    }
    return false;
}

static bool float_compute(const chunk *c)
{
    for (int k = 0; k < c->nv; k++)
        if (nt__dtype_is_float(c->dt[k]))
            return true;
    return false;
}

/* Contiguous f32 operands are read where they are, and a contiguous f32
 * output is computed in place: no copy in, no copy out (the store then only
 * canonicalises NaNs, in place). */
static inline const float *src_f32(float *buf, const chunk *c, int k, int64_t n)
{
    if (c->dt[k] == NT_F32 && c->st[k] == 1)
        return (const float *)c->p[k];
    nt__ld_f32(buf, c->p[k], c->dt[k], c->st[k], n);
    return buf;
}

static inline float *dst_f32(float *buf, const chunk *c)
{
    return (c->dt[0] == NT_F32 && c->st[0] == 1) ? (float *)c->p[0] : buf;
}

/* ---------------- vector ISA levels ----------------
 *
 * The compute-heavy families (unary, tensor-scalar, binary: GELU and its
 * backward are most of their time) are compiled once per vector level and
 * the level of NT_CPU_ISA is picked at run time, as core/gemm.c and
 * cpu/fused.c do; the rest move memory and stay at the build's level.
 * Every level performs the same IEEE operations per element (no FMA
 * contraction, -ffp-contract=off; the transcendentals are core/nmath.h's
 * branch-free code), so every level gives the same bits.  scalar: the loops
 * as written, not vectorised (the reference the tests compare against). */
#if defined(__clang__)
#define NT_EW_NOVEC /* clang has no optimize attribute: vector loops, same bits */
#else
#define NT_EW_NOVEC __attribute__((optimize("no-tree-vectorize")))
#endif
/* the scalar level, on every machine */
#define NT_EW_SCALAR(fam)                                                                  \
    NT_EW_NOVEC static void fam##_scalar(const nt__rec *r, const chunk *c, int64_t n,      \
                                         void *scr)                                        \
    {                                                                                      \
        fam##_body(r, c, n, scr);                                                          \
    }

#if defined(__x86_64__) && defined(__GNUC__)
#define NT_EW_VARIANTS(fam)                                                                \
    NT_EW_SCALAR(fam)                                                                      \
    __attribute__((target("avx2,fma"))) static void fam##_avx2(                            \
        const nt__rec *r, const chunk *c, int64_t n, void *scr)                            \
    {                                                                                      \
        fam##_body(r, c, n, scr);                                                          \
    }                                                                                      \
    __attribute__((target(NT_TARGET_AVX512))) static void fam##_avx512(                    \
        const nt__rec *r, const chunk *c, int64_t n, void *scr)                            \
    {                                                                                      \
        fam##_body(r, c, n, scr);                                                          \
    }                                                                                      \
    static chunk_fn fam##_isa(void)                                                        \
    {                                                                                      \
        switch (nt__gemm_isa()) {                                                          \
        case NT_ISA_SCALAR: return fam##_scalar;                                           \
        case NT_ISA_AVX2: return fam##_avx2;                                               \
        default: return fam##_avx512;                                                      \
        }                                                                                  \
    }
#else
#define NT_EW_VARIANTS(fam)                                                                \
    NT_EW_SCALAR(fam)                                                                      \
    static void fam##_vec(const nt__rec *r, const chunk *c, int64_t n, void *scr)          \
    {                                                                                      \
        fam##_body(r, c, n, scr);                                                          \
    }                                                                                      \
    static chunk_fn fam##_isa(void)                                                        \
    {                                                                                      \
        return nt__gemm_isa() == NT_ISA_SCALAR ? fam##_scalar : fam##_vec;                 \
    }
#endif

/* ---------------- unary ---------------- */

static inline __attribute__((always_inline)) void unary_body(const nt__rec *r, const chunk *c,
                                                             int64_t n, void *scr)
{
    if (wide(r, c, n))
        return;
    if (float_compute(c)) {
        const float *a = src_f32(scr, c, 1, n);
        float *y = dst_f32((float *)scr + NT_CHUNK, c);
        switch (r->op) {
#define NT__UN_F(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_FLOAT(ints, case NT_OP_##ID: for (int64_t i = 0; i < n; i++) y[i] = nt__ew_##name(a[i]); \
                 break;)
            NT_OPS_UNARY(NT__UN_F)
#undef NT__UN_F
        default: nt__op_unhandled("cpu unary (float)", r->op);
        }
        nt__st_f32(c->p[0], c->dt[0], c->st[0], y, n);
    } else {
        int32_t *a = scr, *y = a + NT_CHUNK;
        nt__ld_i32(a, c->p[1], c->dt[1], c->st[1], n);
        switch (r->op) {
#define NT__UN_I(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_INT(ints, case NT_OP_##ID: for (int64_t i = 0; i < n; i++) y[i] = nt__ewi_##name(a[i]); \
               break;)
            NT_OPS_UNARY(NT__UN_I)
#undef NT__UN_I
        default: nt__op_unhandled("cpu unary (int)", r->op);
        }
        nt__st_i32(c->p[0], c->dt[0], c->st[0], y, n);
    }
}

NT_EW_VARIANTS(unary)

int nt__cpu_unary(const nt__rec *r)
{
    nt__kv v[2];
    drive(r, v, setup(r, v, 1), unary_isa());
    return 0;
}

/* ---------------- tensor-scalar ---------------- */

static inline __attribute__((always_inline)) void scalar_body(const nt__rec *r, const chunk *c,
                                                              int64_t n, void *scr)
{
    if (wide(r, c, n))
        return;
    if (float_compute(c)) {
        const float *a = src_f32(scr, c, 1, n);
        float *y = dst_f32((float *)scr + NT_CHUNK, c);
        float s0 = (float)r->p.f[0], s1 = (float)r->p.f[1];
        switch (r->op) {
#define NT__SC_F(ID, name, nin, kind, flags, ...)                                                \
    case NT_OP_##ID:                                                                        \
        for (int64_t i = 0; i < n; i++)                                                     \
            y[i] = nt__ew_##name(a[i], s0, s1);                                             \
        break;
            NT_OPS_SCALAR(NT__SC_F)
#undef NT__SC_F
        default: nt__op_unhandled("cpu scalar (float)", r->op);
        }
        nt__st_f32(c->p[0], c->dt[0], c->st[0], y, n);
    } else {
        int32_t *a = scr, *y = a + NT_CHUNK;
        /* saturating: a plain (int32_t) cast of an out-of-range double is UB */
        int32_t s0 = nt__f64_to_i32(r->p.f[0]), s1 = nt__f64_to_i32(r->p.f[1]);
        nt__ld_i32(a, c->p[1], c->dt[1], c->st[1], n);
        switch (r->op) {
#define NT__SC_I(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_INT(ints, case NT_OP_##ID:                                                       \
               for (int64_t i = 0; i < n; i++) y[i] = nt__ewi_##name(a[i], s0, s1); break;)
            NT_OPS_SCALAR(NT__SC_I)
#undef NT__SC_I
        default: nt__op_unhandled("cpu scalar (int)", r->op);
        }
        nt__st_i32(c->p[0], c->dt[0], c->st[0], y, n);
    }
}

NT_EW_VARIANTS(scalar)

int nt__cpu_scalar(const nt__rec *r)
{
    nt__kv v[2];
    drive(r, v, setup(r, v, 1), scalar_isa());
    return 0;
}

/* ---------------- binary ---------------- */

static inline __attribute__((always_inline)) void binary_body(const nt__rec *r, const chunk *c,
                                                              int64_t n, void *scr)
{
    if (wide(r, c, n))
        return;
    if (float_compute(c)) {
        const float *a = src_f32(scr, c, 1, n);
        const float *b = src_f32((float *)scr + NT_CHUNK, c, 2, n);
        float *y = dst_f32((float *)scr + 2 * NT_CHUNK, c);
        switch (r->op) {
#define NT__BI_F(ID, name, nin, kind, flags, ...)                                                \
    case NT_OP_##ID:                                                                        \
        for (int64_t i = 0; i < n; i++)                                                     \
            y[i] = nt__ew_##name(a[i], b[i]);                                               \
        break;
            NT_OPS_BINARY(NT__BI_F)
            NT_OPS_EW_BWD(NT__BI_F)
#undef NT__BI_F
        case NT_OP_UNARY_BWD: {
            /* the forward op and its scalars */
            int f = (int)r->p.i[0];
            float s0 = (float)r->p.f[0], s1 = (float)r->p.f[1];
            for (int64_t i = 0; i < n; i++)
                y[i] = nt__ew_unary_bwd(f, a[i], b[i], s0, s1);
            break;
        }
        case NT_OP_BINARY_DX: {
            int f = (int)r->p.i[0], which = (int)r->p.i[1]; /* the forward op, d/da or d/db */
            for (int64_t i = 0; i < n; i++)
                y[i] = nt__ew_binary_dx(f, which, a[i], b[i]);
            break;
        }
        default: nt__op_unhandled("cpu binary (float)", r->op);
        }
        nt__st_f32(c->p[0], c->dt[0], c->st[0], y, n);
    } else {
        int32_t *a = scr, *b = a + NT_CHUNK, *y = b + NT_CHUNK;
        nt__ld_i32(a, c->p[1], c->dt[1], c->st[1], n);
        nt__ld_i32(b, c->p[2], c->dt[2], c->st[2], n);
        switch (r->op) {
#define NT__BI_I(ID, name, nin, kind, flags, ints, ...)                                     \
    NT__IF_INT(ints, case NT_OP_##ID:                                                       \
               for (int64_t i = 0; i < n; i++) y[i] = nt__ewi_##name(a[i], b[i]); break;)
            NT_OPS_BINARY(NT__BI_I)
#undef NT__BI_I
        default: nt__op_unhandled("cpu binary (int)", r->op);
        }
        nt__st_i32(c->p[0], c->dt[0], c->st[0], y, n);
    }
}

NT_EW_VARIANTS(binary)

int nt__cpu_binary(const nt__rec *r)
{
    nt__kv v[3];
    drive(r, v, setup(r, v, 2), binary_isa());
    return 0;
}

/* ---------------- compare ---------------- */

/* A comparison of f32 operands, each contiguous or one broadcast element
 * (stride 0), into a contiguous u8 output: the compare and the 0/1 store
 * inline, without staging (max_pool2d's window compares).  The same 0/1 as
 * the staged path. */
#define CMP_U8_LOOP(name, AI, BI)         \
    for (int64_t i = 0; i < n; i++)       \
        y[i] = (uint8_t)nt__ew_##name(ap[AI], bp[BI]);

static bool cmp_f32_u8(const nt__rec *r, const chunk *c, int64_t n)
{
    if (c->dt[0] != NT_U8 || c->dt[1] != NT_F32 || c->dt[2] != NT_F32 || c->st[0] != 1 ||
        (c->st[1] & ~(int64_t)1) || (c->st[2] & ~(int64_t)1))
        return false;
    const float *ap = (const float *)c->p[1], *bp = (const float *)c->p[2];
    uint8_t *y = (uint8_t *)c->p[0];
    int form = (c->st[1] ? 2 : 0) + (c->st[2] ? 1 : 0);
    switch (r->op) {
#define NT__CM_U8(ID, name, nin, kind, flags, ...) \
    case NT_OP_##ID:                                \
        if (form == 3)                              \
            CMP_U8_LOOP(name, i, i)                 \
        else if (form == 2)                         \
            CMP_U8_LOOP(name, i, 0)                 \
        else if (form == 1)                         \
            CMP_U8_LOOP(name, 0, i)                 \
        else                                        \
            CMP_U8_LOOP(name, 0, 0)                 \
        return true;
        NT_OPS_CMP(NT__CM_U8)
#undef NT__CM_U8
    default: return false;
    }
}

static void cmp_chunk(const nt__rec *r, const chunk *c, int64_t n, void *scr)
{
    if (cmp_f32_u8(r, c, n))
        return;
    if (wide(r, c, n))
        return;
    int32_t *y = (int32_t *)scr + 2 * NT_CHUNK;
    if (nt__dtype_is_float(c->dt[1]) || nt__dtype_is_float(c->dt[2])) {
        float *a = scr, *b = a + NT_CHUNK;
        nt__ld_f32(a, c->p[1], c->dt[1], c->st[1], n);
        nt__ld_f32(b, c->p[2], c->dt[2], c->st[2], n);
        switch (r->op) {
#define NT__CM_F(ID, name, nin, kind, flags, ...)                                                \
    case NT_OP_##ID:                                                                        \
        for (int64_t i = 0; i < n; i++)                                                     \
            y[i] = nt__ew_##name(a[i], b[i]);                                               \
        break;
            NT_OPS_CMP(NT__CM_F)
#undef NT__CM_F
        default: nt__op_unhandled("cpu compare (float)", r->op);
        }
    } else {
        int32_t *a = scr, *b = a + NT_CHUNK;
        nt__ld_i32(a, c->p[1], c->dt[1], c->st[1], n);
        nt__ld_i32(b, c->p[2], c->dt[2], c->st[2], n);
        switch (r->op) {
#define NT__CM_I(ID, name, nin, kind, flags, ...)                                                \
    case NT_OP_##ID:                                                                        \
        for (int64_t i = 0; i < n; i++)                                                     \
            y[i] = nt__ewi_##name(a[i], b[i]);                                              \
        break;
            NT_OPS_CMP(NT__CM_I)
#undef NT__CM_I
        default: nt__op_unhandled("cpu compare (int)", r->op);
        }
    }
    nt__st_i32(c->p[0], c->dt[0], c->st[0], y, n);
}

int nt__cpu_cmp(const nt__rec *r)
{
    nt__kv v[3];
    drive(r, v, setup(r, v, 2), cmp_chunk);
    return 0;
}

/* ---------------- where ---------------- */

/* where on f32 values with a contiguous u8 condition, each value
 * contiguous or one broadcast element (stride 0) into a contiguous f32
 * output: the pick and nt__canon inline, without staging the operands
 * (the where chains of max_pool2d and its gradient).  The same values:
 * the picked element's bits, made canonical as nt__st_f32 does. */
#define WHERE_U8_LOOP(AI, BI)                                                              \
    for (int64_t i = 0; i < n; i++) {                                                     \
        uint32_t m = 0u - (uint32_t)(cp[i] != 0);                                         \
        y[i] = nt__canon(nt__bits_f32((nt__f32_bits(ap[AI]) & m) | (nt__f32_bits(bp[BI]) & ~m))); \
    }

static bool where_u8_f32(const chunk *c, int64_t n)
{
    if (c->dt[0] != NT_F32 || c->dt[1] != NT_U8 || c->dt[2] != NT_F32 || c->dt[3] != NT_F32 ||
        c->st[0] != 1 || c->st[1] != 1 || (c->st[2] & ~(int64_t)1) || (c->st[3] & ~(int64_t)1))
        return false;
    const uint8_t *cp = (const uint8_t *)c->p[1];
    const float *ap = (const float *)c->p[2], *bp = (const float *)c->p[3];
    float *y = (float *)c->p[0];
    if (c->st[2] && c->st[3])
        WHERE_U8_LOOP(i, i)
    else if (c->st[2])
        WHERE_U8_LOOP(i, 0)
    else if (c->st[3])
        WHERE_U8_LOOP(0, i)
    else
        WHERE_U8_LOOP(0, 0)
    return true;
}

static void where_chunk(const nt__rec *r, const chunk *c, int64_t n, void *scr)
{
    if (where_u8_f32(c, n))
        return;
    if (wide(r, c, n))
        return;
    float *m = scr; /* cond != 0 */
    nt__ld_f32(m, c->p[1], c->dt[1], c->st[1], n);
    if (nt__dtype_is_float(c->dt[0])) {
        float *a = m + NT_CHUNK, *b = a + NT_CHUNK, *y = b + NT_CHUNK;
        nt__ld_f32(a, c->p[2], c->dt[2], c->st[2], n);
        nt__ld_f32(b, c->p[3], c->dt[3], c->st[3], n);
        for (int64_t i = 0; i < n; i++)
            y[i] = m[i] != 0.0f ? a[i] : b[i];
        nt__st_f32(c->p[0], c->dt[0], c->st[0], y, n);
    } else {
        int32_t *a = (int32_t *)(m + NT_CHUNK), *b = a + NT_CHUNK, *y = b + NT_CHUNK;
        nt__ld_i32(a, c->p[2], c->dt[2], c->st[2], n);
        nt__ld_i32(b, c->p[3], c->dt[3], c->st[3], n);
        for (int64_t i = 0; i < n; i++)
            y[i] = m[i] != 0.0f ? a[i] : b[i];
        nt__st_i32(c->p[0], c->dt[0], c->st[0], y, n);
    }
}

int nt__cpu_where(const nt__rec *r)
{
    nt__kv v[4];
    drive(r, v, setup(r, v, 3), where_chunk);
    return 0;
}
/* tril, triu, masked_fill: selects whose condition and fill the dispatcher
 * made (core/optable.h) */
int nt__cpu_tril(const nt__rec *r) { return nt__cpu_where(r); }
int nt__cpu_triu(const nt__rec *r) { return nt__cpu_where(r); }
int nt__cpu_masked_fill(const nt__rec *r) { return nt__cpu_where(r); }

/* ---------------- copy / cast ---------------- */

/* float->float through f32 (exact widening, one rounding); int->int wraps;
 * int->float rounds once from the exact integer; float->int truncates and
 * saturates (core/dtype.h). */
static void copy_chunk(const nt__rec *r, const chunk *c, int64_t n, void *scr)
{
    nt_dtype sd = c->dt[1], dd = c->dt[0];
    if (wide(r, c, n))
        return;
    if (sd == NT_F32 && c->st[1] == 1) { /* autocast's casts: no staging copy */
        nt__st_f32(c->p[0], dd, c->st[0], (const float *)c->p[1], n);
    } else if (nt__dtype_is_float(sd)) {
        float *a = scr;
        nt__ld_f32(a, c->p[1], sd, c->st[1], n);
        nt__st_f32(c->p[0], dd, c->st[0], a, n);
    } else {
        int32_t *a = scr;
        nt__ld_i32(a, c->p[1], sd, c->st[1], n);
        nt__st_i32(c->p[0], dd, c->st[0], a, n);
    }
}

/* f32 -> bf16/f16 with stochastic rounding (a CAST with NT__CAST_SR).  The
 * output is fresh and contiguous, so an element's row-major index is its
 * offset from the output's start: the driver needs no index of its own. */
static void sr_chunk(const nt__rec *r, const chunk *c, int64_t n, void *scr)
{
    const nt_tensor *o = r->out[0];
    int64_t es = (int64_t)nt__dtype_size(c->dt[0]);
    int64_t i0 = (c->p[0] - (const char *)nt__tensor_data(o)) / es;
    uint64_t key = nt__rec_sr_key(r);
    float *a = scr;
    nt__ld_f32(a, c->p[1], c->dt[1], c->st[1], n);
    for (int64_t i = 0; i < n; i++)
        nt__store_f32_sr(c->p[0], c->dt[0], i * c->st[0], a[i],
                         nt__sr_bits(key, (uint64_t)(i0 + i * c->st[0])));
}

/* An f32 -> f32 copy whose rows (the collapsed inner dim) are short: the
 * permuted heads of attention, 32 floats a row (contiguous in both), or a
 * pooling window's strided slots (gathered or scattered).  The
 * driver's chunk per row (a call, a store dispatch and a vector loop with
 * its tail for two vectors) cost more than the copy; here each row is
 * copied and canonicalised inline at the AVX-512 level, rows walked with
 * their offsets kept up to date, spans of rows split as drive splits them.
 * The same store as copy_chunk's: nt__canon of every element. */
#define ROWCOPY_MAX 128

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ROWCOPY_X86 1

/* cnt <= 16 elements p[0], p[2], ... as a vector: the 2 cnt - 1 floats
 * they span in two masked loads (nothing past them is read), the even ones
 * picked. */
__attribute__((target(NT_TARGET_AVX512))) static inline __m512i ld_stride2(const float *p,
                                                                          int64_t cnt)
{
    int64_t span = 2 * cnt - 1;
    __mmask16 mlo = (__mmask16)(span >= 16 ? 0xffffu : (1u << span) - 1u);
    __mmask16 mhi = (__mmask16)(span > 16 ? (1u << (span - 16)) - 1u : 0u);
    __m512i lo = _mm512_maskz_loadu_epi32(mlo, p), hi = _mm512_maskz_loadu_epi32(mhi, p + 16);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_epi32(lo, even, hi);
}

/* The first cnt <= 16 lanes of u to p[0], p[2], ...: spread to the even
 * lanes of two vectors, stored under masks of those lanes alone. */
__attribute__((target(NT_TARGET_AVX512))) static inline void st_stride2(float *p, int64_t cnt,
                                                                       __m512i u)
{
    const __m512i ilo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i ihi = _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    uint32_t nlo = (uint32_t)(cnt < 8 ? cnt : 8), nhi = (uint32_t)(cnt > 8 ? cnt - 8 : 0);
    __mmask16 mlo = (__mmask16)(0x5555u & ((1u << (2 * nlo)) - 1u));
    __mmask16 mhi = (__mmask16)(0x5555u & ((1u << (2 * nhi)) - 1u));
    _mm512_mask_storeu_epi32(p, mlo, _mm512_permutexvar_epi32(ilo, u));
    if (mhi)
        _mm512_mask_storeu_epi32(p + 16, mhi, _mm512_permutexvar_epi32(ihi, u));
}

__attribute__((target(NT_TARGET_AVX512))) static void rowcopy_span(const walk *w, int64_t lo,
                                                                   int64_t hi)
{
    const int nd = w->nd;
    const int64_t inner = w->cs[nd - 1];
    int64_t idx[NT_MAX_DIMS] = {0}, off[2] = {0, 0};
    int64_t r0 = lo / inner, r1 = hi / inner; /* spans are whole rows */
    for (int64_t rem = r0, d = nd - 2; d >= 0; d--) {
        idx[d] = rem % w->cs[d];
        rem /= w->cs[d];
    }
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < nd - 1; d++)
            off[k] += idx[d] * w->cst[k][d];
    float *dst0 = (float *)w->v[0].data;
    const float *src0 = (const float *)w->v[1].data;
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i qnan = _mm512_set1_epi32((int)NT__QNAN_F32);
    const __mmask16 tail = (__mmask16)((1u << (inner % 16)) - 1u);
    const int64_t s0 = w->cst[0][nd - 1], s1 = w->cst[1][nd - 1];
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i i0 = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)s0));
    const __m512i i1 = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)s1));
    for (int64_t r = r0; r < r1; r++) {
        float *d = dst0 + off[0];
        const float *sp = src0 + off[1];
        int64_t j = 0;
        if (s0 == 1 && s1 == 1) {
            for (; j + 16 <= inner; j += 16) {
                __m512i u = _mm512_loadu_si512(sp + j);
                __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absm), inf);
                _mm512_storeu_si512(d + j, _mm512_mask_mov_epi32(u, nan, qnan));
            }
            if (tail) {
                __m512i u = _mm512_maskz_loadu_epi32(tail, sp + j);
                __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absm), inf);
                _mm512_mask_storeu_epi32(d + j, tail, _mm512_mask_mov_epi32(u, nan, qnan));
            }
        } else { /* strided rows: gathered, scattered (stride 2: two vectors) */
            for (; j < inner; j += 16) {
                int64_t cnt = inner - j >= 16 ? 16 : inner - j;
                __mmask16 k = cnt == 16 ? (__mmask16)0xffffu : tail;
                __m512i u;
                if (s1 == 1)
                    u = _mm512_maskz_loadu_epi32(k, sp + j);
                else if (s1 == 2)
                    u = ld_stride2(sp + 2 * j, cnt);
                else
                    u = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, i1, sp + j * s1, 4);
                __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absm), inf);
                u = _mm512_mask_mov_epi32(u, nan, qnan);
                if (s0 == 1)
                    _mm512_mask_storeu_epi32(d + j, k, u);
                else if (s0 == 2)
                    st_stride2(d + 2 * j, cnt, u);
                else
                    _mm512_mask_i32scatter_epi32(d + j * s0, k, i0, u, 4);
            }
        }
        for (int dd = nd - 2; dd >= 0; dd--) { /* next row */
            idx[dd]++;
            off[0] += w->cst[0][dd], off[1] += w->cst[1][dd];
            if (idx[dd] < w->cs[dd])
                break;
            idx[dd] = 0;
            off[0] -= w->cs[dd] * w->cst[0][dd], off[1] -= w->cs[dd] * w->cst[1][dd];
        }
    }
}

static void rowcopy_block(void *arg, int b)
{
    const walk *w = arg;
    int64_t lo = (int64_t)b * w->span, hi = lo + w->span < w->n_all ? lo + w->span : w->n_all;
    rowcopy_span(w, lo, hi);
}
#endif

/* 1: copied (rowcopy_span), 0: not such a copy. */
static int copy_rows_f32(const nt__rec *r, nt__kv *v)
{
#ifdef ROWCOPY_X86
    if (v[0].dt != NT_F32 || v[1].dt != NT_F32 || nt__gemm_isa() != NT_ISA_AVX512 ||
        r->in[0]->st == r->out[0]->st) /* one storage: the driver's order */
        return 0;
    walk w;
    w.r = r, w.v = v, w.nv = 2, w.fn = NULL;
    collapse(&w, v, 2);
    int nd = w.nd;
    /* Rows shorter than a vector along a longer neighbour dim: the walk
     * takes the two innermost dims the other way round (each element is
     * written once, from its own source: the order does not matter), e.g.
     * the gradient of a 2x2 pool's window copy, rows of 2 [N, C, OH, 2,
     * OW, 2] from [N, C, 2, 2, OH, OW], walked as rows of OW. */
    if (nd >= 2 && w.cs[nd - 1] < 16 && w.cs[nd - 2] > w.cs[nd - 1] && w.cs[nd - 2] <= ROWCOPY_MAX &&
        (w.cst[0][nd - 1] != 1 || w.cst[1][nd - 1] != 1)) {
        int64_t t = w.cs[nd - 1];
        w.cs[nd - 1] = w.cs[nd - 2], w.cs[nd - 2] = t;
        for (int k = 0; k < 2; k++)
            t = w.cst[k][nd - 1], w.cst[k][nd - 1] = w.cst[k][nd - 2], w.cst[k][nd - 2] = t;
    }
    int64_t inner = w.cs[nd - 1], s0 = w.cst[0][nd - 1], s1 = w.cst[1][nd - 1];
    /* strided rows: gather/scatter indices j * stride in int32; an output
     * stride 0 (several elements on one) is left to the driver */
    const int64_t smax = ((int64_t)1 << 30) / (ROWCOPY_MAX + 16);
    if (w.n_all == 0 || nd < 2 || inner > ROWCOPY_MAX || s0 == 0 || s0 > smax || s0 < -smax ||
        s1 > smax || s1 < -smax)
        return 0;
    if ((s0 != 1 || s1 != 1) && inner < 4) /* rows of 1-3 strided elements: the driver */
        return 0;
    /* spans of whole rows, about EW_SPAN elements */
    w.span = (EW_SPAN + inner - 1) / inner * inner;
    int64_t nblocks = (w.n_all + w.span - 1) / w.span;
    if (nblocks < 2 || nblocks > INT32_MAX)
        rowcopy_span(&w, 0, w.n_all);
    else
        nt__par_blocks((int)nblocks, rowcopy_block, &w, true);
    return 1;
#else
    (void)r, (void)v;
    return 0;
#endif
}

/* Test hook: 0 sends every copy through the driver (copy_chunk). */
int nt__cpu_rowcopy = 1;

int nt__cpu_copy(const nt__rec *r)
{
    nt__kv v[2];
    bool sr = r->op == NT_OP_CAST && (r->p.flag & NT__CAST_SR);
    int nv = setup(r, v, 1);
    if (!sr && __atomic_load_n(&nt__cpu_rowcopy, __ATOMIC_RELAXED) && copy_rows_f32(r, v))
        return 0;
    drive(r, v, nv, sr ? sr_chunk : copy_chunk);
    return 0;
}

/* ---------------- fill, arange ---------------- */

static void fill_chunk(const nt__rec *r, const chunk *c, int64_t n, void *scr)
{
    (void)scr;
    double v = r->p.f[0];
    size_t es = nt__dtype_size(c->dt[0]);
    char first[8];
    nt__store_f64(first, c->dt[0], 0, v);
    if (c->st[0] == 1 && es == 4) { /* the usual case: a constant size, a vector loop */
        uint32_t u;
        memcpy(&u, first, 4);
        char *d = c->p[0];
        if (u == 0) { /* zeros (autograd's nt_zeros): the library's widest stores */
            memset(d, 0, (size_t)n * 4);
            return;
        }
        /* from a local word, not the byte array: GCC left the copy from
         * `first` one 4-byte store per element */
        for (int64_t i = 0; i < n; i++)
            memcpy(d + i * 4, &u, 4);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy(c->p[0] + i * c->st[0] * (int64_t)es, first, es);
}

int nt__cpu_fill(const nt__rec *r)
{
    nt__kv v[1];
    drive(r, v, setup(r, v, 0), fill_chunk);
    return 0;
}

int nt__cpu_arange(const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    char *d = nt__tensor_data(o);
    int64_t n = o->shape[0], st = o->stride[0];
    for (int64_t i = 0; i < n; i++)
        nt__store_f64(d, (nt_dtype)o->dtype, i * st, r->p.f[0] + (double)i * r->p.f[1]);
    return 0;
}
