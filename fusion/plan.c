/* fusion/plan.c - grouping a batch into fused kernels, liveness, the kernel
 * cache and the fusion log.  See fusion.h.
 *
 * The planner is one pass over the batch: each record either joins the open
 * group or closes it (with a reason the log reports) and starts the next.
 * Cost per record is bounded by the group limits, so planning is linear in
 * the batch size. */
#include "fusion/fusion.h"
#include "fusion/graph.h"

#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/simtls.h"
#include "debug/debug.h"
#include "streams/stream.h"

nt__fstats nt__fst;

/* The kernel cache: signature -> program, least recently used evicted past
 * NT_F_CACHE_MAX entries.  Programs are refcounted so an eviction cannot
 * free one a worker is running. */
#define NT_F_CACHE_MAX 4096
/* Chains and the recency list run through the programs themselves: adding
 * one allocates only the program, so the host running out of memory is a
 * failed compile (the group runs op by op), never an abort. */
#define NT_F_BUCKETS 8192
static GMutex cache_lock;
static nt__fprog *buckets[NT_F_BUCKETS];
static nt__fprog *lru_head, *lru_tail; /* most recent first */
static unsigned cache_n;
static volatile AO_t evictions;

static void lru_unlink(nt__fprog *c)
{
    *(c->lru_prev ? &c->lru_prev->lru_next : &lru_head) = c->lru_next;
    *(c->lru_next ? &c->lru_next->lru_prev : &lru_tail) = c->lru_prev;
    c->lru_prev = c->lru_next = NULL;
}

static void lru_push_head(nt__fprog *c)
{
    c->lru_prev = NULL;
    c->lru_next = lru_head;
    *(lru_head ? &lru_head->lru_prev : &lru_tail) = c;
    lru_head = c;
}

static void bucket_remove(nt__fprog *c)
{
    nt__fprog **pp = &buckets[c->hash % NT_F_BUCKETS];
    while (*pp && *pp != c)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = c->hnext;
}

static void prog_unref(nt__fprog *c)
{
    if (c && nt__ref_drop(&c->refs, 1)) {
        g_free(c->key);
        g_free(c);
    }
}
static volatile AO_t kernel_no;

bool nt__fusable_ew(int op)
{
    if (op >= NT_OP_COUNT)
        return false;
    switch (nt__ops[op].kind) {
    case NT_KIND_UNARY:
    case NT_KIND_SCALAR:
    case NT_KIND_BINARY:
    case NT_KIND_CMP:
    case NT_KIND_WHERE:
    case NT_KIND_COPY:
        return true;
    case NT_KIND_FILL:
        return op == NT_OP_FILL;
    default:
        return false;
    }
}

static bool is_row_reduce(const nt__rec *r)
{
    if (r->op != NT_OP_SUM && r->op != NT_OP_MAX && r->op != NT_OP_MEAN && r->op != NT_OP_MIN)
        return false;
    const nt_tensor *x = r->in[0];
    return x->ndim >= 1 && r->p.dim == x->ndim - 1 && r->p.flag &&
           nt__dtype_is_float((nt_dtype)x->dtype) && x->shape[x->ndim - 1] > 1;
}

/* ---------------- prefetching ----------------
 *
 * A big batch's records and handles were written when they were queued,
 * long before planning, and are out of cache by then; every pass follows
 * pointers (the record array -> a record -> its handles -> their storage),
 * which no hardware prefetcher follows.  Each pass therefore asks for the
 * lines it will read some records ahead, a level at a time: the record
 * first, then its handles once the record's line is in. */
enum { PF_REC = 32, PF_HANDLE = 16 };

static inline void pf_lines(const void *p, size_t bytes)
{
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch((const char *)p + off);
}

/* The lines a pass reads of a record: type..in[] (line 0) and out[] */
static inline void pf_rec_head(const nt__rec *r)
{
    __builtin_prefetch(r);
    __builtin_prefetch(&r->out[0]);
}

static inline void pf_outs_head(const nt__rec *r)
{
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (r->out[i])
            __builtin_prefetch(r->out[i]);
}

/* ---------------- views as keys ---------------- */

static bool shape_is(const nt_tensor *t, int ndim, const int64_t *shape)
{
    if (t->ndim != ndim)
        return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i])
            return false;
    return true;
}

/* ---------------- the group being built ---------------- */

/* Foreach kernels (see "sharing a kernel" below): independent small EW and
 * ROW programs and single elementwise records, queued to run as one. */
enum { JOIN_MAX = 64, JOIN_SET = 512, JOIN_NUMEL = 1 << 20 };
typedef struct jentry {
    nt__fgroup g;   /* g.prog NULL: the single record g.recs[0] */
    int stored, elided;
    bool hit;
    int w0;         /* where its storages start in the queue's wr */
} jentry;
typedef struct joinq {
    int n;
    uint8_t backend;
    bool nocap;                         /* its records' NT_RECF_NOCAPTURE */
    jentry e[JOIN_MAX];
    int nr, nw;                         /* storages they read, write */
    const nt__storage *rd[JOIN_SET], *wr[JOIN_SET];
} joinq;

typedef struct {
    bool open;
    nt__fprog p;
    nt__fgroup g;
    nt_tensor *val_t[NT_F_MAXVALS];   /* the tensor (view) each value stands for */
    nt_tensor *val_h[NT_F_MAXVALS];   /* the handle that defined it */
    int val_slots[NT_F_MAXVALS];      /* record slots in the group holding val_h */
    bool val_inplace[NT_F_MAXVALS];
    int first;                        /* index of the first record in the batch */
    int nbatch;                       /* the batch's records */
    int64_t red_shape[NT_MAX_DIMS];   /* ROW: [..., 1] */
    int nfull;                        /* ROW: values with a whole row each */
    /* storages the group writes: open addressing, storage -> latest value;
     * `multi` when two values live in one storage through different views */
    const nt__storage *st_key[2 * NT_F_MAXVALS];
    int8_t st_val[2 * NT_F_MAXVALS];
    bool st_multi[2 * NT_F_MAXVALS];
    joinq jq;                         /* programs waiting to share a kernel */
} gstate;

static int st_slot(const gstate *s, const nt__storage *st)
{
    unsigned h = (unsigned)(((uintptr_t)st >> 6) * 2654435761u) % (2 * NT_F_MAXVALS);
    while (s->st_key[h] && s->st_key[h] != st)
        h = (h + 1) % (2 * NT_F_MAXVALS);
    return (int)h;
}

/* Per-row SBUF budget for a ROW group: one partition holds one row of each
 * full value (f32), as the simulator's row kernels do. */
#define NT_F_ROW_BYTES (160 * 1024)

static const char *reason_buf(char *buf, size_t n, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static const char *reason_buf(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}

static int find_val(gstate *s, const nt_tensor *t)
{
    for (int v = s->p.nvals - 1; v >= 0; v--)
        if (s->val_t[v] == t)
            return v;
    for (int v = s->p.nvals - 1; v >= 0; v--)
        if (s->val_t[v] && nt__same_view(s->val_t[v], t))
            return v;
    return -1;
}

static int find_or_add_ext(gstate *s, nt_tensor *t)
{
    for (int k = 0; k < s->p.next; k++)
        if (nt__same_view(s->g.ext[k], t))
            return k;
    if (s->p.next >= NT_F_MAXEXT)
        return -1;
    int k = s->p.next++;
    s->g.ext[k] = t;
    s->p.ext[k].dtype = t->dtype;
    s->p.ext[k].red = 0;
    {
        /* which iteration dims it is stretched along: part of the signature */
        int64_t st[NT_MAX_DIMS];
        nt__bcast_strides(t, s->p.ndim, s->p.shape, st);
        uint16_t m = 0;
        for (int i = 0; i < s->p.ndim; i++)
            if (st[i] == 0 && s->p.shape[i] != 1)
                m |= (uint16_t)(1u << i);
        s->p.ext[k].bcast = m;
    }
    if (s->p.kind == NT_FK_ROW) {
        /* constant along the row: usable where a per-row value is */
        int64_t st[NT_MAX_DIMS];
        nt__bcast_strides(t, s->p.ndim, s->p.shape, st);
        s->p.ext[k].red = st[s->p.ndim - 1] == 0;
    }
    return k;
}

/* Resolves input t of a record to an operand; -128 on a hazard.  One pass
 * over the values' storages settles the common case: a storage the group
 * does not write is an external input. */
#define NT_F_HAZARD (-128)
static int operand(gstate *s, nt_tensor *t)
{
    int h = st_slot(s, t->st);
    if (!s->st_key[h]) { /* the group does not write this storage */
        int k = find_or_add_ext(s, t);
        return k < 0 ? NT_F_HAZARD - 1 : NT_F_EXT(k);
    }
    if (!s->st_multi[h]) {
        const nt_tensor *w = s->val_t[s->st_val[h]];
        if (w && nt__same_view(w, t))
            return s->st_val[h];
        return NT_F_HAZARD;
    }
    bool written = false;
    for (int v = s->p.nvals - 1; v >= 0; v--) {
        const nt_tensor *w = s->val_t[v];
        if (!w || w->st != t->st)
            continue;
        if (nt__same_view(w, t))
            return v;
        written = true;
    }
    if (written)
        return NT_F_HAZARD; /* another view of something the group writes */
    int k = find_or_add_ext(s, t);
    return k < 0 ? NT_F_HAZARD - 1 : NT_F_EXT(k);
}

static bool operand_red(const gstate *s, int a)
{
    return NT_F_IS_EXT(a) ? s->p.ext[NT_F_EXT_IDX(a)].red : s->p.vals[a].red;
}

static void group_reset(gstate *s, nt__rec **recs, int first, uint8_t backend)
{
    memset(&s->p, 0, sizeof s->p);
    memset(&s->g, 0, sizeof s->g);
    memset(s->val_t, 0, sizeof s->val_t);
    memset(s->val_h, 0, sizeof s->val_h);
    memset(s->val_slots, 0, sizeof s->val_slots);
    memset(s->val_inplace, 0, sizeof s->val_inplace);
    memset(s->st_key, 0, sizeof s->st_key);
    memset(s->st_multi, 0, sizeof s->st_multi);
    s->open = true;
    s->first = first;
    s->nfull = 0;
    s->g.recs = recs + first;
    s->g.nrecs = 0;
    s->g.backend = backend;
}

/* A layer norm whose output a cast may ride on (NT_FK_NORM, fusion/ir.h):
 * x, w and b all given, an f32 contiguous output of x's shape. */
static bool norm_head(const nt__rec *r)
{
    const nt_tensor *o = r->out[0];
    return r->type == NT_REC_OP && r->op == NT_OP_LAYER_NORM && r->nin == 3 && r->nout == 1 &&
           r->in[0] && r->in[1] && r->in[2] && o && o->dtype == NT_F32 && nt__is_contig(o) &&
           !(r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE));
}

/* Whether r is a cast that rides on layer norm x (norm_head) in its
 * kernel: x's output, the same view, rounded to bf16 or f16 into a
 * contiguous tensor of its shape, not stochastically. */
static bool norm_cast_of(const nt__rec *x, const nt__rec *r)
{
    const nt_tensor *o = r->out[0], *y = x->out[0];
    return r->type == NT_REC_OP && r->op == NT_OP_CAST && r->nin == 1 && r->nout == 1 && o &&
           r->in[0] && !(r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) &&
           !(r->p.flag & NT__CAST_SR) && (o->dtype == NT_BF16 || o->dtype == NT_F16) &&
           nt__is_contig(o) && nt__same_view(r->in[0], y) && shape_is(o, y->ndim, y->shape);
}

/* A contiguous f32 tensor of t's shape. */
static bool f32_contig_as(const nt_tensor *o, const nt_tensor *t)
{
    return o && o->dtype == NT_F32 && nt__is_contig(o) && shape_is(o, t->ndim, t->shape);
}

volatile AO_t nt__fplan_nobn;

/* A training batch norm a relu may ride on (NT_FK_BN, fusion/ir.h): x, w
 * and b all given, x and y contiguous f32 of one shape. */
static bool bn_head(const nt__rec *r)
{
    return !AO_load(&nt__fplan_nobn) && r->type == NT_REC_OP && r->op == NT_OP_BN_FWD && r->nin == 3 && r->nout == 2 &&
           r->in[0] && r->in[1] && r->in[2] && r->out[1] && f32_contig_as(r->in[0], r->in[0]) &&
           f32_contig_as(r->out[0], r->in[0]) &&
           !(r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE));
}

/* Whether r is a relu of batch norm x's (bn_head) output, the same view,
 * into a contiguous f32 tensor of its shape. */
static bool bn_relu_of(const nt__rec *x, const nt__rec *r)
{
    return r->type == NT_REC_OP && r->op == NT_OP_RELU && r->nin == 1 && r->nout == 1 &&
           r->in[0] && !(r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) &&
           nt__same_view(r->in[0], x->out[0]) && f32_contig_as(r->out[0], x->out[0]);
}

/* Whether r is a batch norm backward whose gradient is relu_bwd record x's
 * output (the backward form of NT_FK_BN): x's g and y and r's x, stats
 * and w given, every tensor of the iteration contiguous f32 of one shape. */
static bool bn_bwd_of_relu(const nt__rec *x, const nt__rec *r)
{
    const nt_tensor *o = x->out[0];
    return !AO_load(&nt__fplan_nobn) && x->type == NT_REC_OP && x->op == NT_OP_RELU_BWD && x->nin == 2 && x->nout == 1 &&
           o && !(x->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) && x->in[0] && x->in[1] &&
           f32_contig_as(o, o) && f32_contig_as(x->in[0], o) && f32_contig_as(x->in[1], o) &&
           r->type == NT_REC_OP && r->op == NT_OP_BN_BWD && r->nin == 4 && r->nout == 2 &&
           r->in[0] && r->in[1] && r->in[2] && r->in[3] && r->out[1] &&
           !(r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) && nt__same_view(r->in[0], o) &&
           f32_contig_as(r->in[1], o) && f32_contig_as(r->out[0], o);
}

/* try_add's steps.  The group's first record decides the kind and the
 * iteration shape. */
static void start_kind(gstate *s, const nt__rec *r, bool red, bool mm, bool norm)
{
    if (mm) {
        s->p.kind = NT_FK_MM;
    } else if (norm) {
        s->p.kind = bn_head(r) ? NT_FK_BN : NT_FK_NORM;
    } else if (red) {
        s->p.kind = NT_FK_ROW;
    } else {
        s->p.kind = NT_FK_EW;
    }
    const nt_tensor *shp = red ? r->in[0] : r->out[0];
    s->p.ndim = shp->ndim;
    for (int i = 0; i < shp->ndim; i++)
        s->p.shape[i] = shp->shape[i];
    if (red) {
        for (int i = 0; i < shp->ndim; i++)
            s->red_shape[i] = shp->shape[i];
        s->red_shape[shp->ndim - 1] = 1;
    }
}

/* A row reduction joins an EW group: the group becomes a row group over
 * the same shape.  NULL, or why it cannot. */
static const char *ew_to_row(gstate *s)
{
    if (s->p.ndim < 1 || s->p.shape[s->p.ndim - 1] <= 1)
        return "shape change";
    /* each value so far would need a row of its own on chip */
    if ((int64_t)(s->p.nvals + 1) * s->p.shape[s->p.ndim - 1] * 4 > NT_F_ROW_BYTES)
        return "SBUF capacity";
    s->p.kind = NT_FK_ROW;
    for (int i = 0; i < s->p.ndim; i++)
        s->red_shape[i] = s->p.shape[i];
    s->red_shape[s->p.ndim - 1] = 1;
    for (int k = 0; k < s->p.next; k++) {
        int64_t st[NT_MAX_DIMS];
        nt__bcast_strides(s->g.ext[k], s->p.ndim, s->p.shape, st);
        s->p.ext[k].red = st[s->p.ndim - 1] == 0;
    }
    s->nfull = s->p.nvals;
    return NULL;
}

/* Whether r may join the open group: backend, kind, op limit, shape.  NULL,
 * or why not. */
static const char *check_join(gstate *s, const nt__rec *r, bool ew, bool red, bool mm,
                              bool norm, char *why, size_t whylen)
{
    const nt_tensor *o = r->out[0];
    if (r->backend != s->g.backend)
        return "backend change";
    if ((r->flags ^ s->g.recs[0]->flags) & NT_RECF_NOCAPTURE)
        return "the edge of a captured program";
    if (mm)
        return "a matmul starts its own kernel";
    if (norm)
        return bn_head(r) ? "a batch norm starts its own kernel"
                          : "a layer norm starts its own kernel";
    if (s->p.kind == NT_FK_NORM) /* one cast, fusion/ir.h */
        return s->g.nrecs == 1 && norm_cast_of(s->g.recs[0], r)
                   ? NULL
                   : "a layer norm's epilogue is one cast of its output to bf16 or f16";
    if (s->p.kind == NT_FK_BN) /* one relu, fusion/ir.h */
        return s->g.nrecs == 1 && s->g.recs[0]->op == NT_OP_BN_FWD &&
                       bn_relu_of(s->g.recs[0], r)
                   ? NULL
                   : "a batch norm's epilogue is one relu of its output";
    if (s->p.kind == NT_FK_EW && s->g.nrecs == 1 && bn_bwd_of_relu(s->g.recs[0], r)) {
        s->p.kind = NT_FK_BN; /* the relu's backward feeds the norm's */
        return NULL;
    }
    if (!ew && !red)
        return reason_buf(why, whylen, "%s is not fusable", nt__op_name(r->op));
    if (s->g.nrecs >= NT_F_MAXOPS)
        return "kernel op limit";
    if (red) {
        if (s->p.kind == NT_FK_MM)
            return "a reduction after a matmul epilogue";
        if (!shape_is(r->in[0], s->p.ndim, s->p.shape))
            return "shape change";
        return s->p.kind == NT_FK_EW ? ew_to_row(s) : NULL;
    }
    if (s->p.kind == NT_FK_ROW) {
        if (!shape_is(o, s->p.ndim, s->p.shape) && !shape_is(o, s->p.ndim, s->red_shape))
            return "shape change";
        return NULL;
    }
    return shape_is(o, s->p.ndim, s->p.shape) ? NULL : "shape change";
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* Where view t's elements lie, as a residue class: every element sits at
 * t->offset + (an inner offset in [0, *len)) + (a multiple of the gcd of the
 * other dims' strides, returned).  The inner block is t's trailing dims that
 * are laid out contiguously (stride 1, then each the size times the stride
 * of the one after it); dims of size 1 count for nothing.  INT64_MAX: the
 * view is one block; 0: no such form (a negative or zero stride). */
static int64_t view_pitch(const nt_tensor *t, int64_t *len)
{
    int64_t inner = 1, g = 0;
    bool in_block = true;
    for (int i = t->ndim - 1; i >= 0; i--) {
        int64_t n = t->shape[i], st = t->stride[i];
        if (n == 1)
            continue;
        if (st <= 0)
            return 0;
        if (in_block && st == inner) {
            inner *= n;
            continue;
        }
        in_block = false;
        g = gcd64(g, st);
    }
    *len = inner;
    return g ? g : INT64_MAX; /* one block: no outer dim */
}

/* Whether views a and b of one storage provably share no element: their
 * element ranges do not meet, or, with P the gcd of both views' outer
 * strides, each view's elements fall in a block of residues mod P that
 * does not wrap, and the two blocks do not meet (the heads of q, k and v
 * in one [B, T, 3C] buffer: rows of pitch 3C, blocks [0, C), [C, 2C),
 * [2C, 3C)).  false when unsure. */
static bool views_disjoint(const nt_tensor *a, const nt_tensor *b)
{
    if (a->st != b->st || a->dtype != b->dtype || a->expanded || b->expanded)
        return false;
    int64_t lo[2], hi[2];
    const nt_tensor *t[2] = {a, b};
    for (int j = 0; j < 2; j++) {
        lo[j] = hi[j] = t[j]->offset;
        for (int i = 0; i < t[j]->ndim; i++) {
            if (t[j]->shape[i] == 0)
                return true; /* no elements */
            int64_t d = (t[j]->shape[i] - 1) * t[j]->stride[i];
            if (d < 0)
                lo[j] += d;
            else
                hi[j] += d;
        }
    }
    if (hi[0] < lo[1] || hi[1] < lo[0])
        return true;
    int64_t la, lb, pa = view_pitch(a, &la), pb = view_pitch(b, &lb);
    if (pa <= 0 || pb <= 0)
        return false;
    int64_t p = gcd64(pa, pb), ra = a->offset % p, rb = b->offset % p;
    if (ra + la > p || rb + lb > p)
        return false;
    return ra + la <= rb || rb + lb <= ra;
}

/* What r's operands (op->a, already found) allow: in a ROW group an op
 * with a per-row result (*out_red) may only use per-row operands, a full
 * row needs SBUF room; an in-place write must be element-aligned with
 * every read of the same storage.  NULL, or why not. */
static const char *check_operands(const gstate *s, const nt__rec *r, const nt__fop *op,
                                  bool red, bool inplace, bool *out_red)
{
    const nt_tensor *o = r->out[0];
    *out_red = false;
    /* a side op's value (fusion/ir.h) leaves the kernel, never read in it;
     * value v is op v's */
    for (int i = 0; i < r->nin; i++)
        if (r->in[i] && !NT_F_IS_EXT(op->a[i]) && nt__fop_is_side(&s->p, op->a[i]))
            return s->p.ops[op->a[i]].op == NT_OP_SUM ? "reads a column sum the kernel makes"
                                                       : "reads a weight gradient the kernel makes";
    if (s->p.kind == NT_FK_ROW) {
        *out_red = red || shape_is(o, s->p.ndim, s->red_shape);
        if (*out_red && !red)
            for (int i = 0; i < r->nin; i++)
                if (r->in[i] && !operand_red(s, op->a[i]))
                    return "shape change";
        if (!*out_red && (s->nfull + 1) * s->p.shape[s->p.ndim - 1] * 4 > NT_F_ROW_BYTES)
            return "SBUF capacity";
    }
    if (inplace) {
        for (int k = 0; k < s->p.next; k++)
            if (s->g.ext[k]->st == o->st && !nt__same_view(s->g.ext[k], o))
                return "in-place write to another view of a kernel input";
        for (int v = 0; v < s->p.nvals; v++)
            if (s->val_t[v] && s->val_t[v]->st == o->st && !nt__same_view(s->val_t[v], o) &&
                !(s->val_inplace[v] && views_disjoint(s->val_t[v], o)))
                return "in-place write to another view of a kernel value";
    }
    return NULL;
}

/* r's operands as program slots (op->a; new kernel inputs appended), and
 * the checks that need them.  NULL, or why not (the inputs appended are
 * dropped again). */
static const char *add_operands(gstate *s, const nt__rec *r, nt__fop *op, bool red,
                                bool inplace, bool *out_red)
{
    int nexts = s->p.next;
    for (int i = 0; i < r->nin; i++) {
        if (!r->in[i]) {
            op->a[i] = 0;
            continue;
        }
        int a = operand(s, r->in[i]);
        if (a <= NT_F_HAZARD) {
            s->p.next = nexts;
            return a == NT_F_HAZARD ? "reads another view of a value the kernel writes"
                                    : "kernel input limit";
        }
        op->a[i] = (int8_t)a;
    }
    const char *no = check_operands(s, r, op, red, inplace, out_red);
    if (no)
        s->p.next = nexts;
    return no;
}

/* r joins the group: its output becomes the program's next value. */
static void append_op(gstate *s, const nt__rec *r, nt__fop *op, bool out_red, bool inplace)
{
    nt_tensor *o = r->out[0];
    /* Slots that hold a value's own handle, counted only once the op is in:
     * an op turned away above must not count its reads, or a value it reads
     * would look read by the group alone and be elided (live_after) while
     * the next kernel, where the op goes, still reads it. */
    for (int i = 0; i < r->nin; i++)
        if (r->in[i] && !NT_F_IS_EXT(op->a[i]) && r->in[i] == s->val_h[op->a[i]])
            s->val_slots[op->a[i]]++;
    int v = s->p.nvals++;
    op->out = (int8_t)v;
    s->p.vals[v].dtype = o->dtype;
    s->p.vals[v].red = out_red;
    s->p.vals[v].store = -1;
    if (s->p.kind == NT_FK_ROW && !out_red)
        s->nfull++;
    /* an earlier value of the same view (an in-place chain) is superseded;
     * a fresh output cannot match anything */
    int prev = inplace ? find_val(s, o) : -1;
    if (prev >= 0)
        s->val_t[prev] = NULL;
    int h = st_slot(s, o->st);
    if (!s->st_key[h]) {
        s->st_key[h] = o->st;
    } else if (prev < 0) {
        s->st_multi[h] = true; /* another view of a written storage */
    }
    s->st_val[h] = (int8_t)v;
    s->val_t[v] = o;
    s->val_h[v] = o;
    s->val_slots[v] = 1; /* the producer's output slot */
    s->val_inplace[v] = inplace;
    s->p.ops[s->p.nops++] = *op;
    s->g.nrecs++;
}

/* A batch norm's second output (its stats, or [dw; db]) as the value after
 * its first (NT_FK_BN, fusion/ir.h): a fresh tensor, as append_op takes
 * an output. */
static void append_second(gstate *s, const nt__rec *r)
{
    nt_tensor *o = r->out[1];
    int v = s->p.nvals++;
    s->p.vals[v].dtype = o->dtype;
    s->p.vals[v].red = 0;
    s->p.vals[v].store = -1;
    int h = st_slot(s, o->st);
    if (!s->st_key[h])
        s->st_key[h] = o->st;
    else
        s->st_multi[h] = true;
    s->st_val[h] = (int8_t)v;
    s->val_t[v] = o;
    s->val_h[v] = o;
    s->val_slots[v] = 1;
    s->val_inplace[v] = false;
}

/* An f64, i64 or bool operand (a dtype the device lacks): such ops run as
 * their own CPU kernels, never fused (the fused evaluators compute in f32
 * or i32; core/ewise64.h). */
static bool rec_wide(const nt__rec *r)
{
    for (int i = 0; i < NT__MAX_IN; i++)
        if (r->in[i] && !nt__dtype_on_device((nt_dtype)r->in[i]->dtype))
            return true;
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (r->out[i] && !nt__dtype_on_device((nt_dtype)r->out[i]->dtype))
            return true;
    return false;
}

/* ---------------- side sums (fusion/ir.h) ----------------
 *
 * A linear layer's backward reads its output gradient dY three times: the
 * bias gradient (a sum over dY's rows), the weight gradient and the input
 * gradient dX = dY . W, each a kernel loading all of dY from HBM.  The sum
 * joins dX's matmul as a side sum: the simulator's matmul program sums the
 * rows of the tiles of dY it turns for TensorE anyway, in the one reduction
 * order (neuron/tp_matmul.c), so dY is read once for both, and the CPU runs
 * the sum kernel itself: the bits of the sum run alone. */

/* A sum over dim 0 of a contiguous f32, bf16 or f16 [rows, K] into f32,
 * bf16 or f16 (reduce_to in autograd/backward.c: dY seen as [B*T, C]; under
 * bf16 autocast dY and its sum are bf16). */
static bool side_sum_rec(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    return r->type == NT_REC_OP && r->op == NT_OP_SUM && r->nin == 1 && r->nout == 1 && x && o &&
           !(r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) && r->p.dim == 0 && x->ndim == 2 &&
           nt__dtype_is_f32_or_half((nt_dtype)x->dtype) &&
           nt__dtype_is_f32_or_half((nt_dtype)o->dtype) && x->shape[0] >= 128 &&
           x->shape[1] >= 1 && nt__is_contig(x);
}

/* Whether matmul m reads x's rows as its first operand A: contiguous, the
 * same elements in the same order, x [rows, K] with K A's last dim, and
 * the rows one product whatever the epilogue (A 2-D, one batch, or 128-row
 * batches: the simulator folds the batches of such an A into one program,
 * neuron/matmul.c fold_batches, and the sums ride on one program).  x is
 * given by its storage, offset, dtype and [rows, K]: side_mm_of asks it of
 * dY's rows, which it describes without copying a handle (a handle's magic
 * is the host's to write while a worker plans). */
static bool side_sum_of_rows(const nt__rec *m, const nt__storage *st, int64_t offset, int dtype,
                             int64_t rows, int64_t K)
{
    const nt_tensor *a = m->in[0];
    return m->type == NT_REC_OP && m->op == NT_OP_MATMUL && m->nout == 1 && a && m->in[1] &&
           m->out[0] && !(m->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) && a->st == st &&
           a->offset == offset && a->dtype == dtype && a->ndim >= 2 && a->shape[a->ndim - 1] == K &&
           nt__numel(a->ndim, a->shape) == rows * K && nt__is_contig(a) &&
           (nt__numel(a->ndim - 2, a->shape) == 1 || a->shape[a->ndim - 2] % 128 == 0);
}

static bool side_sum_of(const nt__rec *m, const nt_tensor *x)
{
    return side_sum_of_rows(m, x->st, x->offset, x->dtype, x->shape[0], x->shape[1]);
}

/* ---------------- side products (fusion/ir.h) ----------------
 *
 * The same layer's weight gradient dW = dY^T . X reads dY a third time.
 * The simulator's streaming matmul program can turn each row tile of dY it
 * loads for dX against X's rows as well (include/ntensor/sim.h,
 * nt_tile_matmul_args.x), W's K-tiles being dX's M-tiles in ascending
 * order: the bits of dW's own program.  So the dW record joins dX's kernel
 * as a side product; the CPU runs the matmul kernel itself on the same
 * operands. */
volatile AO_t nt__fplan_nopair;

/* dW as autograd/backward.c issues a linear layer's (in w's layout, (g^T
 * a)^T): a matmul of dY^T -- the transposed view [K, rows], strides (1, K),
 * of a contiguous [rows, K] -- and X, a contiguous [rows, NX] of dY's
 * dtype (f32, bf16 or f16), into a contiguous [K, NX], at least 128 rows,
 * with W's accumulators in one PSUM bank as the paired program wants them
 * (NX <= 512, ceil(K / 128) * NX <= 512): a wider layer (GPT-2's 768)
 * keeps its own kernel. */
static bool side_mm_rec(const nt__rec *r)
{
    const nt_tensor *at = r->in[0], *x = r->in[1], *o = r->out[0];
    if (r->type != NT_REC_OP || r->op != NT_OP_MATMUL || r->nin != 2 || r->nout != 1 || !at ||
        !x || !o || (r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) || at->ndim != 2 ||
        x->ndim != 2 || o->ndim != 2)
        return false;
    int64_t K = at->shape[0], rows = at->shape[1], NX = x->shape[1];
    nt_dtype dt = (nt_dtype)at->dtype, ot = (nt_dtype)o->dtype;
    return (dt == NT_F32 || dt == NT_BF16 || dt == NT_F16) && x->dtype == dt &&
           (ot == NT_F32 || ot == NT_BF16 || ot == NT_F16) && K >= 1 && rows >= 128 &&
           NX >= 1 && NX <= 512 && (K + 127) / 128 * NX <= 512 && at->stride[0] == 1 &&
           at->stride[1] == K && !at->expanded && x->shape[0] == rows && nt__is_contig(x) &&
           o->shape[0] == K && o->shape[1] == NX && nt__is_contig(o) && o->st != at->st &&
           o->st != x->st;
}

/* Whether matmul m is the dX whose A is dW record r's dY (side_sum_of with
 * dY seen as [rows, K]), its output and operands apart from W's. */
static bool side_mm_of(const nt__rec *m, const nt__rec *r)
{
    const nt_tensor *yt = r->in[0]; /* dY^T [K, rows]: dY is [rows, K] */
    const nt__storage *w = r->out[0]->st;
    return m != r &&
           side_sum_of_rows(m, yt->st, yt->offset, yt->dtype, yt->shape[1], yt->shape[0]) &&
           m->out[0]->st != w && m->in[1]->st != w &&
           m->out[0]->st != r->in[1]->st;
}

static bool ew_joinable(const nt__rec *x, const nt_tensor *o);
static bool rec_touches(const nt__rec *x, const nt__storage *st, bool writes_only);

/* Whether the matmul at j has its epilogue next to it: recs[j + 1] reads
 * its output and could join its group (hoist_matmuls brings such a reader
 * there when it can). */
static bool takes_its_reader(nt__rec *const *recs, int n, int j)
{
    const nt_tensor *o = recs[j]->out[0];
    return j + 1 < n && rec_touches(recs[j + 1], o->st, false) && ew_joinable(recs[j + 1], o);
}

/* r joins the open MM group as its side sum or side product: 0, 1
 * (refused, *why), or -1 (r is neither for this group: the usual rules
 * decide).  A side product with its epilogue next to it starts its own
 * kernel (side_mm_move). */
static int side_join(gstate *s, nt__rec *r, const char **why)
{
    bool mm = r->op == NT_OP_MATMUL;
    if (mm ? AO_load(&nt__fplan_nopair) || !side_mm_rec(r) || !side_mm_of(s->g.recs[0], r) ||
                 takes_its_reader(s->g.recs - s->first, s->nbatch, s->first + s->g.nrecs)
           : !side_sum_rec(r) || !side_sum_of(s->g.recs[0], r->in[0]))
        return -1;
    *why = r->backend != s->g.backend                                    ? "backend change"
           : (r->flags ^ s->g.recs[0]->flags) & NT_RECF_NOCAPTURE       ? "the edge of a captured program"
           : s->g.nrecs >= NT_F_MAXOPS || s->p.nvals >= NT_F_MAXVALS ? "kernel op limit"
           : s->st_key[st_slot(s, r->in[0]->st)] ||
                   (mm && s->st_key[st_slot(s, r->in[1]->st)])
               ? "reads another view of a value the kernel writes"
               : NULL;
    for (int k = 1; k < s->p.nops && !*why; k++)
        if (nt__fop_is_side(&s->p, k) && s->p.ops[k].op == r->op)
            *why = mm ? "a second weight gradient" : "a second column sum";
    int x = 0;
    if (!*why && mm && (x = operand(s, r->in[1])) <= NT_F_HAZARD)
        *why = "kernel input limit"; /* the group writes no view of X: checked above */
    if (*why)
        return 1;
    nt__fop op;
    memset(&op, 0, sizeof op);
    op.op = r->op;
    op.nin = mm ? 2 : 1;
    op.a[0] = s->p.ops[0].a[0];
    op.a[1] = (int8_t)x;
    op.p = r->p;
    append_op(s, r, &op, false, false);
    return 0;
}

/* Tries to append record r; returns NULL on success or the reason why not. */
static const char *try_add(gstate *s, nt__rec *r, char *why, size_t whylen)
{
    if (rec_wide(r))
        return "an f64, i64 or bool op runs alone";
    if (s->g.nrecs > 0 && s->p.kind == NT_FK_MM && (r->op == NT_OP_SUM || r->op == NT_OP_MATMUL)) {
        const char *no = NULL;
        if (side_join(s, r, &no) >= 0)
            return no;
    }
    bool inplace = r->flags & NT_RECF_INPLACE;
    bool ew = nt__fusable_ew(r->op);
    bool red = is_row_reduce(r);
    bool mm = r->op == NT_OP_MATMUL && !inplace;
    bool norm = norm_head(r) || bn_head(r); /* a kernel of its own with an epilogue */
    if (s->g.nrecs == 0) {
        start_kind(s, r, red, mm, norm);
    } else {
        const char *no = check_join(s, r, ew, red, mm, norm, why, whylen);
        if (no)
            return no;
    }
    bool bn = s->p.kind == NT_FK_BN && r->op == NT_OP_BN_BWD; /* check_join let it in */
    if (!ew && !red && !mm && !norm && !bn)
        return reason_buf(why, whylen, "%s is not fusable", nt__op_name(r->op));
    bool two = r->op == NT_OP_BN_FWD || r->op == NT_OP_BN_BWD; /* append_second */
    if (s->p.nvals + two >= NT_F_MAXVALS)
        return "kernel value limit";
    nt__fop op;
    memset(&op, 0, sizeof op);
    op.op = r->op;
    op.nin = r->nin;
    op.p = r->p;
    bool out_red;
    const char *no = add_operands(s, r, &op, red, inplace, &out_red);
    if (no)
        return no;
    append_op(s, r, &op, out_red, inplace);
    if (two)
        append_second(s, r);
    return NULL;
}

/* Whether only the group can reach t's storage: every handle on it is one
 * of its records' operands or outputs, none has a user reference or an
 * internal one beyond the group's own slots (no record outside, no autograd
 * save, no view parent), and the group reads each as a value of its
 * program, never from memory.  A backward pass leaves such handles: a bf16
 * weight gradient computed in the weight's memory layout and permuted back
 * (autocast casts w^T in memory order) is a second handle on the matmul's
 * output, read only by the cast to f32 in the same kernel; without this the
 * gradient was written out for nobody (3.7 MB a step of bench/amp). */
static bool storage_group_only(const gstate *s, const nt_tensor *t)
{
    const nt__storage *st = t->st;
    enum { MAXH = NT_F_MAXOPS * (NT__MAX_IN + NT__MAX_OUT) };
    const nt_tensor *h[MAXH];
    int slots[MAXH], nh = 0;
    for (int k = 0; k < s->g.nrecs; k++) {
        const nt__rec *r = s->g.recs[k];
        const nt__fop *op = &s->p.ops[k];
        for (int i = 0; i < r->nin + r->nout; i++) {
            const nt_tensor *x = i < r->nin ? r->in[i] : r->out[i - r->nin];
            if (!x || x->st != st)
                continue;
            if (i < r->nin && NT_F_IS_EXT(op->a[i]))
                return false; /* read from memory: the kernel needs it there */
            int j = 0;
            while (j < nh && h[j] != x)
                j++;
            if (j == nh) {
                h[nh] = x;
                slots[nh++] = 0;
            }
            slots[j]++;
        }
    }
    if (AO_load_full(&((nt__storage *)st)->refs) != (AO_t)nh)
        return false;
    for (int j = 0; j < nh; j++)
        if (AO_load_full(&((nt_tensor *)h[j])->refs) > 0 ||
            (int)AO_load_full(&((nt_tensor *)h[j])->irefs) != slots[j])
            return false;
    return true;
}

/* Can anything outside the group read value v's tensor after it?  (See
 * fusion.h.)  Every pending record holds an internal reference per slot, so
 * a handle with more internal references than the group's own slots is read
 * by some record outside the group. */
static bool live_after(const gstate *s, int v, const char **why)
{
    nt_tensor *t = s->val_t[v];
    bool inplace = s->val_inplace[v];
    if (inplace) {
        *why = "in-place destination";
        return true;
    }
    if (AO_load_full(&t->refs) > 0) {
        *why = "live user handle";
        return true;
    }
    if (AO_load_full(&t->st->refs) > 1 && !storage_group_only(s, t)) {
        *why = "another handle on its storage (a view, or saved for backward)";
        return true;
    }
    if ((int)AO_load_full(&t->irefs) > s->val_slots[v]) {
        *why = "read by a later kernel";
        return true;
    }
    return false;
}

/* ---------------- signatures and the cache ---------------- */

/* The signature is the program itself, as bytes: kind, shape, every op
 * (operands and parameters by bit pattern), every value's dtype, row-ness
 * and store slot, every input's dtype and broadcast pattern.  Equal bytes,
 * equal program. */
typedef struct {
    uint8_t buf[8192];
    size_t n;
} keybuf;

static void kput(keybuf *k, const void *p, size_t n)
{
    if (k->n + n <= sizeof k->buf)
        memcpy(k->buf + k->n, p, n);
    k->n += n;
}

static void make_key(const nt__fprog *p, keybuf *k)
{
    k->n = 0;
    int32_t hdr[6] = {p->kind, p->ndim, p->nops, p->nvals, p->next, p->nout};
    kput(k, hdr, sizeof hdr);
    kput(k, p->shape, sizeof(int64_t) * (size_t)p->ndim);
    for (int i = 0; i < p->nops; i++) {
        const nt__fop *o = &p->ops[i];
        int8_t b[6] = {(int8_t)o->nin, o->a[0], o->a[1], o->a[2], o->out, o->a[3]};
        kput(k, &o->op, sizeof o->op);
        kput(k, b, sizeof b);
        kput(k, o->p.f, sizeof(double) * 2);
        int32_t d[2] = {o->p.dim, o->p.flag};
        kput(k, d, sizeof d);
        kput(k, o->p.i, sizeof(int64_t) * 2); /* UNARY_BWD's op; BINARY_DX's op and side */
    }
    for (int v = 0; v < p->nvals; v++) {
        int8_t b[3] = {(int8_t)p->vals[v].dtype, (int8_t)p->vals[v].red, p->vals[v].store};
        kput(k, b, sizeof b);
    }
    for (int e = 0; e < p->next; e++) {
        uint8_t b[2] = {p->ext[e].dtype, p->ext[e].red};
        kput(k, b, sizeof b);
        kput(k, &p->ext[e].bcast, sizeof p->ext[e].bcast);
    }
}

static uint64_t key_hash(const uint8_t *b, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    return h * 0xc4ceb9fe1a85ec53ull;
}

static bool prog_equal(const nt__fprog *x, const nt__fprog *y)
{
    return x->hash == y->hash && x->keylen == y->keylen && !memcmp(x->key, y->key, x->keylen);
}

/* Looks the program up by signature (or caches this one); the caller owns
 * one reference.  NULL: the host is out of memory. */
static nt__fprog *compile(const nt__fprog *p, bool *hit)
{
    keybuf kb; /* 8 KiB of stack: workers have megabytes */
    make_key(p, &kb);
    nt__fprog probe;
    probe.key = kb.buf;
    probe.keylen = kb.n;
    probe.hash = key_hash(kb.buf, kb.n);
    g_mutex_lock(&cache_lock);
    nt__fprog *c = buckets[probe.hash % NT_F_BUCKETS];
    while (c && !prog_equal(c, &probe))
        c = c->hnext;
    if (c) {
        *hit = true;
        lru_unlink(c);
        lru_push_head(c);
    } else {
        *hit = false;
        c = malloc(sizeof *c);
        uint8_t *key = malloc(kb.n ? kb.n : 1);
        if (!c || !key) {
            free(c);
            free(key);
            g_mutex_unlock(&cache_lock);
            return NULL;
        }
        *c = *p;
        c->key = key;
        memcpy(key, kb.buf, kb.n);
        c->keylen = kb.n;
        c->hash = probe.hash;
        c->runs = 0;
        c->refs = 1; /* the cache's */
        c->hnext = buckets[c->hash % NT_F_BUCKETS];
        buckets[c->hash % NT_F_BUCKETS] = c;
        lru_push_head(c);
        cache_n++;
        while (cache_n > NT_F_CACHE_MAX) {
            nt__fprog *old = lru_tail;
            lru_unlink(old);
            bucket_remove(old);
            cache_n--;
            AO_fetch_and_add1(&evictions);
            prog_unref(old);
        }
    }
    AO_fetch_and_add1(&c->refs);
    g_mutex_unlock(&cache_lock);
    return c;
}

/* ---------------- the log ---------------- */

static void log_site(nt__strbuf *g, const nt__rec *r)
{
    char where[160];
    nt__site_format(&r->site, where, sizeof where);
    nt__sb_printf(g, "%s%s (%s)", r->bwd_of ? "backward:" : "", nt__op_name(r->op), where);
}

static void log_break(const nt__rec *r, const char *reason)
{
    nt__strbuf g_ = {0}, *g = &g_; /* a failed buffer prints what it could */
    nt__sb_append(g, "fusion: break before ");
    log_site(g, r);
    nt__sb_printf(g, ": %s", reason);
    fprintf(stderr, "ntensor: %s\n", nt__sb_str(g, "fusion: (no host memory for this line)"));
    free(g->str);
}

static const char *kind_name(nt__fkind k)
{
    return k == NT_FK_EW    ? "elementwise"
           : k == NT_FK_ROW ? "row"
           : k == NT_FK_MM  ? "matmul+epilogue"
           : k == NT_FK_BN  ? "batchnorm+relu"
                            : "norm+cast";
}

static void log_group(const gstate *s, const nt__fprog *c, bool hit, int stored, int elided,
                      const char *const *why_stored)
{
    nt__strbuf g_ = {0}, *g = &g_;
    nt__sb_printf(g, "fusion: kernel #%lu %s, %d ops [", (unsigned long)kernel_no,
                  kind_name(c->kind), s->g.nrecs);
    for (int k = 0; k < s->g.nrecs; k++) {
        if (k)
            nt__sb_append(g, ", ");
        log_site(g, s->g.recs[k]);
    }
    nt__sb_printf(g, "] reads %d, writes %d, elides %d intermediate%s; cache %s", c->next,
                  stored, elided, elided == 1 ? "" : "s", hit ? "hit" : "miss");
    /* why each written value could not stay on chip, grouped by reason */
    const char *seen[NT_F_MAXVALS];
    int nseen = 0;
    for (int v = 0; v < c->nvals; v++) {
        if (!why_stored[v])
            continue;
        bool dup = false;
        for (int k = 0; k < nseen; k++)
            dup |= seen[k] == why_stored[v];
        if (dup)
            continue;
        seen[nseen++] = why_stored[v];
        nt__sb_printf(g, "; written out (%s):", why_stored[v]);
        for (int w = v; w < c->nvals; w++)
            if (why_stored[w] == why_stored[v])
                nt__sb_printf(g, " v%d", w);
    }
    fprintf(stderr, "ntensor: %s\n", nt__sb_str(g, "fusion: (no host memory for this line)"));
    free(g->str);
}

/* ---------------- running ---------------- */

/* Planning time excludes kernels: the clock stops around every run. */
static _Thread_local uint64_t plan_t0 NT_TLS_HOT;
static void plan_pause(void) { AO_fetch_and_add(&nt__fst.plan_ns, (AO_t)(nt__now_ns() - plan_t0)); }
static void plan_resume(void) { plan_t0 = nt__now_ns(); }


static bool run_group_kernel(gstate *s);
static bool join_offer(joinq *q, const nt__fgroup *g, int stored, int elided, bool hit);
static void join_flush(joinq *q);
static bool join_passes(const joinq *q, const nt__fgroup *g);

/* Runs the open group, then lets its records drop what only they held
 * (nt__rec_drop_dead), so the next group can reuse those blocks; a group
 * queued to share a kernel runs (and drops) when its queue is flushed. */
static void run_group(gstate *s)
{
    if (!s->open || s->g.nrecs == 0)
        return;
    if (run_group_kernel(s))
        return;
    for (int k = 0; k < s->g.nrecs; k++)
        nt__rec_drop_dead(s->g.recs[k]);
}

static void launch(nt__fgroup *g, int stored, int elided, bool hit, bool poisoned,
                   bool *joined);

/* Runs the open group's kernel, or queues it to share one (true). */
static bool run_group_kernel(gstate *s)
{
    s->open = false;
    if (s->g.nrecs == 1) {
        if (join_offer(&s->jq, &s->g, 0, 0, false))
            return true;
        if (!join_passes(&s->jq, &s->g))
            join_flush(&s->jq);
        plan_pause();
        nt__exec_rec(s->g.recs[0]);
        plan_resume();
        return false;
    }
    /* Decide what the kernel writes out. */
    const char *why_stored[NT_F_MAXVALS] = {0};
    int stored = 0, elided = 0;
    for (int v = 0; v < s->p.nvals; v++) {
        s->p.vals[v].store = -1;
        nt_tensor *t = s->val_t[v];
        if (!t) { /* superseded by a later in-place write: nothing to store */
            continue;
        }
        const char *why = NULL;
        bool live = live_after(s, v, &why);
        if (!live && NT__CFG(check_nan)) { /* no NaN may hide in an elided value */
            live = true;
            why = "NT_CHECK_NAN checks every value";
        }
        if (live) {
            int slot = s->p.nout++;
            s->p.vals[v].store = (int8_t)slot;
            s->p.out_val[slot] = (int8_t)v;
            s->g.out[slot] = t;
            why_stored[v] = why;
            stored++;
        } else {
            elided++;
        }
    }
    /* superseded in-place values count as elided too */
    for (int v = 0; v < s->p.nvals; v++)
        if (!s->val_t[v])
            elided++;
    bool hit;
    nt__fprog *c = compile(&s->p, &hit);
    if (!c) { /* the host is out of memory: the same bits, op by op */
        join_flush(&s->jq);
        plan_pause();
        for (int k = 0; k < s->g.nrecs; k++)
            nt__exec_rec(s->g.recs[k]);
        plan_resume();
        return false;
    }
    s->g.prog = c;
    AO_fetch_and_add1(&c->runs);
    AO_fetch_and_add1(&kernel_no);
    AO_fetch_and_add1(&nt__fst.groups);
    AO_fetch_and_add(&nt__fst.fused_ops, (AO_t)s->g.nrecs);
    AO_fetch_and_add1(hit ? &nt__fst.hits : &nt__fst.misses);
    AO_fetch_and_add(&nt__fst.stored, (AO_t)stored);
    AO_fetch_and_add(&nt__fst.elided, (AO_t)elided);
    if (NT__CFG(fusion_log))
        log_group(s, c, hit, stored, elided, why_stored);

    /* An input already poisoned: run op by op so only its consumers fail.
     * Under NT_CHECK_NAN a group with an in-place write runs op by op too:
     * replaying it after a NaN was found would apply the write twice. */
    bool poisoned = false;
    for (int k = 0; k < c->next; k++)
        if (AO_load_acquire(&s->g.ext[k]->st->poison))
            poisoned = true;
    for (int k = 0; NT__CFG(check_nan) && k < s->g.nrecs; k++)
        if (s->g.recs[k]->flags & NT_RECF_INPLACE)
            poisoned = true;
    if (!poisoned && join_offer(&s->jq, &s->g, stored, elided, hit))
        return true;
    if (!join_passes(&s->jq, &s->g))
        join_flush(&s->jq);
    bool joined = false;
    launch(&s->g, stored, elided, hit, poisoned, &joined);
    return false;
}

/* Runs bound group g (its program compiled, counted and logged); joined:
 * it is a program of the open shared kernel, which a failure closes
 * before the group runs op by op. */
static void join_close(int backend, const nt__rec *r, const nt__storage *const *wr, int nw);
static void launch(nt__fgroup *g, int stored, int elided, bool hit, bool poisoned,
                   bool *joined)
{
    nt__fprog *c = g->prog;
    int rc = NT_ENOTSUP;
    /* a queued group's input may have been poisoned since it was planned
     * (by a program queued before it ran): op by op, as the planner does */
    for (int k = 0; k < c->next && !poisoned; k++)
        poisoned = AO_load_acquire(&g->ext[k]->st->poison) != 0;
    plan_pause();
    bool traced = nt__trace_enabled();
    double t0 = traced ? nt__htrace_now() : 0;
    /* the blocks of what the kernel reads and stores; a value it elides
     * never takes one */
    if (!poisoned && (nt__tensors_materialize(g->ext, c->next) < 0 ||
                      nt__tensors_materialize(g->out, c->nout) < 0))
        poisoned = true; /* host out of memory: op by op reports it per op */
    if (!poisoned) {
        const nt__backend_i *be = nt__backends[g->backend];
        nt__sim_ready_begin(g->ext, c->next, g->out, c->nout);
        if (be->run_fused)
            rc = be->run_fused(g);
        nt__sim_ready_end(g->out, c->nout);
    }
    if (traced)
        nt__htrace_fused(kind_name(c->kind), (unsigned long)AO_load(&kernel_no), g->recs,
                         g->nrecs, stored, elided, hit, t0, rc);
    /* NT_CHECK_NAN: every value was stored (above); if one holds a NaN or
     * an Inf, replay the group op by op with the check on.  The replay
     * recomputes the same bits, and nt__exec_rec names the first op that
     * made a NaN or Inf from finite inputs, as an unfused run would. */
    if (rc == 0 && NT__CFG(check_nan) && nt__nan_any(g->out, c->nout))
        rc = NT_ENAN;
    /* a captured program keeps its own copy of the program */
    if (rc == 0 && nt__tl_recorder && !(g->recs[0]->flags & NT_RECF_NOCAPTURE))
        nt__capture_group(nt__tl_recorder, g);
    prog_unref(c);
    g->prog = NULL;
    if (rc == 0) {
        NT__COUNT(ops_executed, g->nrecs);
        NT__COUNT(kernels, 1);
        plan_resume();
        return;
    }
    /* Could not run fused (no executor, or it failed): replay op by op,
     * which names the exact op that fails (the shared kernel closed first:
     * the op's own kernels run alone). */
    if (*joined) {
        join_close(g->backend, NULL, NULL, 0);
        *joined = false;
        nt__fjoined = 0;
    }
    for (int k = 0; k < g->nrecs; k++)
        nt__exec_rec(g->recs[k]);
    plan_resume();
}

/* ---------------- sharing a kernel (foreach kernels) ----------------
 *
 * An optimizer step, gradient clipping's scaling and the loss scaler's
 * unscale each issue the same short chain for every parameter: each chain
 * fuses into a program of its own, and each program alone is a kernel --
 * dozens a step, each a round trip of small DMAs with nothing to overlap
 * (PyTorch's answer is the _foreach_* ops and fused AdamW).  So a small EW
 * or ROW program (or a single elementwise record) that neither reads what
 * the queued ones write nor writes what they read or write waits in the
 * queue (so do gradient clipping's grad_norms records and sums); the queue
 * runs as one kernel when something else must run, when it is full, or at
 * the end of the batch.  The backend runs every program
 * exactly as alone (core/backend.h kernel_open / kernel_close; the
 * simulator's neuron/foreach.c), so the bits are the same; the kernel is
 * counted once, and a captured program replays it as one (fusion/graph.c,
 * nt__fjoined). */
_Thread_local int nt__fjoined;

static bool join_has(const nt__storage *const *set, int n, const nt__storage *st)
{
    for (int i = 0; i < n; i++)
        if (set[i] == st)
            return true;
    return false;
}

/* Whether g (prog NULL: its one record) may wait in q: what it reads and
 * writes in *in / *out. */
static bool join_kind(const nt__fgroup *g, nt_tensor *const **in, int *nin,
                      nt_tensor *const **out, int *nout)
{
    const nt__rec *r = g->recs[0];
    int64_t numel;
    if (g->prog) {
        if (g->prog->kind == NT_FK_MM || g->prog->kind == NT_FK_NORM || g->prog->kind == NT_FK_BN)
            return false;
        *in = g->ext, *nin = g->prog->next, *out = g->out, *nout = g->prog->nout;
        numel = nt__numel(g->prog->ndim, g->prog->shape);
    } else {
        int k = r->type == NT_REC_OP && r->op < NT_OP_COUNT ? (int)nt__ops[r->op].kind : -1;
        /* these read more than they write: their inputs count too */
        bool big_in = r->op == NT_OP_GRAD_NORMS || r->op == NT_OP_SUM;
        /* a cast alone (under autocast, a bias gradient's cast back to its
         * f32 leaf, which reads the sum just before it) runs through the
         * same elementwise kernel as a unary op (neuron/ew.c nt__sk_ew) */
        bool cast = r->op == NT_OP_CAST;
        if ((k != NT_KIND_UNARY && k != NT_KIND_SCALAR && k != NT_KIND_BINARY && !big_in &&
             !cast) ||
            r->nout != 1 || !r->out[0])
            return false;
        *in = r->in, *nin = r->nin, *out = r->out, *nout = 1;
        numel = nt__numel(r->out[0]->ndim, r->out[0]->shape);
        for (int i = 0; big_in && i < r->nin; i++)
            if (r->in[i])
                numel += nt__numel(r->in[i]->ndim, r->in[i]->shape);
    }
    return numel <= JOIN_NUMEL;
}

/* Whether a program reading in and writing out neither reads what the
 * queued ones write nor writes what they read or write. */
static bool join_apart(const joinq *q, nt_tensor *const *in, int nin, nt_tensor *const *out,
                       int nout)
{
    for (int i = 0; i < nin; i++)
        if (in[i] && join_has(q->wr, q->nw, in[i]->st))
            return false;
    for (int i = 0; i < nout; i++)
        if (out[i] && (join_has(q->wr, q->nw, out[i]->st) || join_has(q->rd, q->nr, out[i]->st)))
            return false;
    return true;
}

static bool join_fits(const joinq *q, const nt__fgroup *g, bool nocap, nt_tensor *const *in,
                      int nin, nt_tensor *const *out, int nout)
{
    if (q->n >= JOIN_MAX || q->nr + nin > JOIN_SET || q->nw + nout > JOIN_SET ||
        (q->n > 0 && (q->backend != g->backend || q->nocap != nocap)))
        return false;
    return join_apart(q, in, nin, out, nout);
}

/* Queues g to share a kernel (true), flushing the queue first if g
 * conflicts with it; false: g runs alone (the caller flushes first). */
static bool join_offer(joinq *q, const nt__fgroup *g, int stored, int elided, bool hit)
{
    nt_tensor *const *in, *const *out;
    int nin, nout;
    if (!NT__CFG(foreach) || NT__CFG(check_nan) || !join_kind(g, &in, &nin, &out, &nout))
        return false;
    bool nocap = g->recs[0]->flags & NT_RECF_NOCAPTURE;
    if (nocap)
        return false; /* state made on first use while capturing: passes the queue */
    if (!join_fits(q, g, nocap, in, nin, out, nout)) {
        if (q->n == 0 || nocap != q->nocap)
            return false;
        join_flush(q);
        if (!join_fits(q, g, nocap, in, nin, out, nout))
            return false;
    }
    jentry *e = &q->e[q->n++];
    e->g = *g;
    e->stored = stored, e->elided = elided, e->hit = hit;
    e->w0 = q->nw;
    q->backend = g->backend;
    q->nocap = nocap;
    for (int i = 0; i < nin; i++)
        if (in[i])
            q->rd[q->nr++] = in[i]->st;
    for (int i = 0; i < nout; i++)
        if (out[i])
            q->wr[q->nw++] = out[i]->st;
    return true;
}

/* Whether g, which runs alone, may run before the queued programs: it
 * reads nothing they write and writes nothing they read or write, so the
 * order does not matter, and the queue keeps waiting for programs that may
 * share its kernel.  Two kinds pass: state made on first use while
 * capturing (an optimizer's moments: NT_RECF_NOCAPTURE, never part of the
 * program), so the updates of a step captured with its optimizer's first
 * update still share their kernels; and a fused program, a matmul,
 * attention's backward or an embedding's backward (what each reads and
 * writes in memory is exactly its operands), so a sum that reads the row
 * kernel just before it (a layer norm's weight gradient, sum(g * xhat))
 * waits past the next layer's matmuls and attention and shares a later
 * kernel instead of running as a kernel of its own.  A sum too big to wait
 * itself passes too (a bf16 bias gradient over [2048, 512]): a cast waiting
 * in the queue then shares a later kernel rather than running alone. */
static bool passes_kind(const nt__rec *r)
{
    if (r->type != NT_REC_OP || r->op >= NT_OP_COUNT)
        return false;
    return nt__ops[r->op].kind == NT_KIND_MATMUL || r->op == NT_OP_SDPA_BWD ||
           r->op == NT_OP_EMBEDDING_BWD || r->op == NT_OP_SUM;
}

static bool join_passes(const joinq *q, const nt__fgroup *g)
{
    if (q->n == 0)
        return true;
    const nt__rec *r = g->recs[0];
    if (q->nocap)
        return false;
    if (!(r->flags & NT_RECF_NOCAPTURE) && !g->prog && !passes_kind(r))
        return false;
    nt_tensor *const *in = g->prog ? g->ext : r->in, *const *out = g->prog ? g->out : r->out;
    int nin = g->prog ? g->prog->next : r->nin, nout = g->prog ? g->prog->nout : r->nout;
    return join_apart(q, in, nin, out, nout);
}

/* Ends the shared kernel: what its programs wrote is ready at its end.  A
 * program that fails reports its own error; the kernel fails here only if
 * its end does, named after the op that begins it (r, as a replayed
 * kernel's failure is) and on its stream, which nt_sync reports. */
static void join_close(int backend, const nt__rec *r, const nt__storage *const *wr, int nw)
{
    const nt__backend_i *be = nt__backends[backend];
    nt__tl_sim_end = -1.0;
    int rc = be->kernel_close ? be->kernel_close() : 0;
    double t = nt__tl_sim_end;
    nt__errobj *e = NULL;
    if (rc < 0 && r) {
        char msg[512];
        snprintf(msg, sizeof msg, "the shared kernel this op begins failed at its end: %s",
                 nt__kerr_msg());
        e = nt__rec_error(r, rc, msg);
        if (r->stream)
            nt__stream_note_error(r->stream, e, r->seq);
    }
    for (int i = 0; i < nw; i++) {
        nt__storage *st = (nt__storage *)wr[i];
        if (t > 0)
            nt__storage_ready_set(st, t);
        if (e) {
            nt__errobj_ref(e);
            if (!AO_compare_and_swap_full(&st->poison, 0, (AO_t)e))
                nt__errobj_unref(e);
        }
    }
    if (e)
        nt__errobj_unref(e);
}

/* Whether one of e's records holds a reference nt__rec_drop_dead drops. */
static bool join_dead(const jentry *e)
{
    for (int k = 0; k < e->g.nrecs; k++) {
        const nt__rec *r = e->g.recs[k];
        for (int i = 0; r->type == NT_REC_OP && i < NT__MAX_IN + NT__MAX_OUT; i++) {
            const nt_tensor *t = i < NT__MAX_IN ? r->in[i] : r->out[i - NT__MAX_IN];
            if (t && t->st->deferred && __atomic_load_n(&t->st->hostdead, __ATOMIC_ACQUIRE))
                return true;
        }
    }
    return false;
}

/* The bytes of the blocks e's kernel takes: storages it reads or writes
 * that have none yet. */
static uint64_t join_takes(const jentry *e)
{
    const nt__fgroup *g = &e->g;
    const nt__rec *r = g->recs[0];
    nt_tensor *const *in = g->prog ? g->ext : r->in, *const *out = g->prog ? g->out : r->out;
    int nin = g->prog ? g->prog->next : r->nin, nout = g->prog ? g->prog->nout : r->nout;
    uint64_t b = 0;
    for (int i = 0; i < nin + nout; i++) {
        const nt_tensor *t = i < nin ? in[i] : out[i - nin];
        if (t && !__atomic_load_n(&t->st->data, __ATOMIC_ACQUIRE))
            b += t->st->nbytes;
    }
    return b;
}

/* Whether taking b more bytes of blocks would back more than is reserved:
 * then bytes lent by a storage whose block is still held are backed twice. */
static bool tight(uint64_t b)
{
    return b > 0 && nt__arena_backed() + b > nt__arena_in_use();
}

static void join_drop(joinq *q, int i)
{
    for (int k = 0; k < q->e[i].g.nrecs; k++)
        nt__rec_drop_dead(q->e[i].g.recs[k]);
}

/* Runs q's programs from..: two or more as one kernel; returns where it
 * stopped.  Each program's dead references drop as soon as it ran, as a
 * group alone does (run_group), so a later program's block may be the one
 * it leaves: lent bytes are then never backed twice.  In an open kernel
 * (the simulator's) the blocks its programs touch stay until it closes, so
 * there a program that takes a block while earlier ones left dead
 * references starts the next kernel instead, after those drop -- when the
 * blocks would exceed the reserved bytes (else sharing wins). */
static int join_run(joinq *q, int from)
{
    int n = q->n;
    const nt__backend_i *be = nt__backends[q->backend];
    const nt__fgroup *list[JOIN_MAX];
    for (int i = from; i < n; i++)
        list[i - from] = &q->e[i].g;
    bool joined = n - from >= 2 && (!be->kernel_open || be->kernel_open(list, n - from) == 0);
    bool keep = joined && be->kernel_open; /* blocks stay until the kernel closes */
    bool dead = false;
    int in = 0; /* programs run in the shared kernel */
    int i = from;
    for (; i < n; i++) {
        jentry *e = &q->e[i];
        if (joined && keep && dead && tight(join_takes(e)))
            break;
        nt__fjoined = joined ? in : 0;
        if (e->g.prog) {
            launch(&e->g, e->stored, e->elided, e->hit, false, &joined);
        } else {
            plan_pause();
            nt__exec_rec(e->g.recs[0]);
            plan_resume();
        }
        in += joined;
        if (!(joined && keep))
            join_drop(q, i);
        else
            dead |= join_dead(e);
    }
    nt__fjoined = 0;
    if (joined) /* what it wrote is ready when it closes (its blocks kept) */
        join_close(q->backend, q->e[from].g.recs[0], q->wr + q->e[from].w0,
                   keep ? (i < n ? q->e[i].w0 : q->nw) - q->e[from].w0 : 0);
    if (in > 1 && NT__CFG(fusion_log)) {
        char where[NT__SITE_MAX];
        nt__site_format(&q->e[from].g.recs[0]->site, where, sizeof where);
        fprintf(stderr, "ntensor: fusion: foreach kernel of %d programs (the first at %s)\n", in,
                where);
    }
    if (in > 1) {
        NT__COUNT(kernels, -(in - 1));
        AO_fetch_and_add1(&nt__fst.foreach_kernels);
        AO_fetch_and_add(&nt__fst.foreach_programs, (AO_t)in);
    }
    for (int k = from; k < i && keep; k++)
        join_drop(q, k);
    return i;
}

/* Runs the queue. */
static void join_flush(joinq *q)
{
    for (int i = 0; i < q->n;)
        i = join_run(q, i);
    q->n = q->nr = q->nw = 0;
}

/* A captured program's shared kernels at replay (fusion/graph.c). */
void nt__fusion_join(int backend, bool open, int n)
{
    const nt__backend_i *be = nt__backends[backend];
    if (open) {
        if (be->kernel_open)
            be->kernel_open(NULL, 0);
        return;
    }
    join_close(backend, NULL, NULL, 0);
    if (n > 1) {
        NT__COUNT(kernels, -(n - 1));
        AO_fetch_and_add1(&nt__fst.foreach_kernels);
        AO_fetch_and_add(&nt__fst.foreach_programs, (AO_t)n);
    }
}

/* ---------------- moving a matmul next to its consumers ----------------
 *
 * A matmul fuses with the elementwise chain that follows it (an MM program
 * with an epilogue).  In a training step a weight's gradient matmul runs in
 * the backward pass and its AdamW chain only after the rest of the
 * backward: unfused, the gradient makes a round trip through memory and
 * the matmul is a kernel of its own (on the simulator: the W2 gradient
 * matmul took 23 us, and its AdamW kernel re-read the 4 MB gradient).  So,
 * before planning, a matmul record moves forward to the start of the
 * elementwise run that ends at its first reader, when nothing it passes
 * depends on it: no record in between reads or writes its output's
 * storage, writes an input's storage, or is anything but an op.  The
 * executed order is then another topological order of the same records,
 * and every kernel computes the same bits (each op reads what it read). */
enum { HOIST_WINDOW = 256 }; /* records scanned ahead: planning stays linear */

static bool rec_touches(const nt__rec *x, const nt__storage *st, bool writes_only)
{
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (x->out[i] && x->out[i]->st == st)
            return true;
    if (writes_only)
        return false;
    for (int i = 0; i < NT__MAX_IN; i++)
        if (x->in[i] && x->in[i]->st == st)
            return true;
    return false;
}

/* Whether x writes a storage r reads. */
static bool writes_an_input(const nt__rec *x, const nt__rec *r)
{
    for (int i = 0; i < NT__MAX_IN; i++)
        if (r->in[i] && rec_touches(x, r->in[i]->st, true))
            return true;
    return false;
}

static bool ew_joinable(const nt__rec *x, const nt_tensor *o)
{
    if (x->type != NT_REC_OP || !nt__fusable_ew(x->op) || !x->out[0] || (x->flags & NT_RECF_ALONE))
        return false;
    int64_t n = nt__numel(x->out[0]->ndim, x->out[0]->shape);
    return n == 1 || n == nt__numel(o->ndim, o->shape);
}

/* Whether x may share a kernel with r as far as a capture goes: both part
 * of the program being captured, or both not (check_join).  While a step
 * is captured, the optimizer's moments made on first use (fills: not part
 * of the program) sit between a weight gradient's matmul and its update; a
 * matmul moved to just before them would meet a break at the first fill and
 * its update would run as a kernel of its own, re-reading the gradient from
 * HBM at every replay (the MLP step: 14.7 MB).  Moved to just after them, it
 * takes the update as its epilogue as it does uncaptured. */
static bool same_capture(const nt__rec *x, const nt__rec *r)
{
    return !((x->flags ^ r->flags) & NT_RECF_NOCAPTURE);
}

/* A matmul at k whose only next record is a cast of its output (under
 * autocast, a bf16 weight gradient cast back to the f32 parameter's
 * dtype) already has its reader next to it; the two move forward together
 * to the elementwise run that ends at the cast's first reader (the
 * parameter's update), with the same conditions as one matmul: nothing in
 * between touches either output, writes an input, or is anything but an
 * op.  Without this the update re-read the f32 gradient in a kernel of its
 * own (7.4 MB a step on the MLP). */
static bool hoist_with_cast(nt__rec **recs, int n, int k)
{
    nt__rec *r = recs[k], *e = k + 2 < n ? recs[k + 1] : NULL;
    if (!e || e->type != NT_REC_OP || (e->op != NT_OP_CAST && e->op != NT_OP_COPY) ||
        e->nin != 1 || e->nout != 1 || !e->out[0] || !e->in[0] ||
        e->in[0]->st != r->out[0]->st || (e->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) ||
        nt__numel(e->out[0]->ndim, e->out[0]->shape) !=
            nt__numel(r->out[0]->ndim, r->out[0]->shape))
        return false;
    const nt__storage *ost = r->out[0]->st, *est = e->out[0]->st;
    int j = k + 2, end = k + HOIST_WINDOW < n ? k + HOIST_WINDOW : n;
    for (; j < end; j++) {
        const nt__rec *x = recs[j];
        if (x->type != NT_REC_OP || (x->flags & NT_RECF_ALONE))
            return false;
        if (rec_touches(x, est, false))
            break;
        if (rec_touches(x, ost, false))
            return false; /* the matmul's output has another reader */
        if (writes_an_input(x, r))
            return false;
    }
    if (j == end || !ew_joinable(recs[j], e->out[0]))
        return false;
    /* a run that a row reduction ends (the loss scaler's check of the
     * gradients) would be split by the move: the matmul's epilogue takes
     * the run's head, and the reduction re-reads what it wrote (f16 step:
     * 6.5 MB more) */
    int q = j;
    while (q < n && ew_joinable(recs[q], e->out[0]))
        q++;
    if (q < n && recs[q]->type == NT_REC_OP && is_row_reduce(recs[q]))
        return false;
    int p = j;
    while (p - 1 > k + 1 && ew_joinable(recs[p - 1], e->out[0]) && same_capture(recs[p - 1], r))
        p--;
    if (p - 1 == k + 1)
        return false;
    memmove(&recs[k], &recs[k + 2], sizeof *recs * (size_t)(p - 2 - k));
    recs[p - 2] = r;
    recs[p - 1] = e;
    return true;
}

/* Whether b, queued after a, may run before it: b touches nothing a
 * writes and writes nothing a reads. */
static bool runs_before(const nt__rec *a, const nt__rec *b)
{
    for (int i = 0; i < NT__MAX_OUT; i++)
        if (a->out[i] && rec_touches(b, a->out[i]->st, false))
            return false;
    return !writes_an_input(b, a);
}

/* A side sum at j (side_sum_rec) moves forward to just after the first
 * later matmul that reads its rows as A (dX = dY . W of the same layer),
 * when nothing in between writes its input or is anything but an op of
 * the same capture: the same records in an order in which every op reads
 * what it read.  The matmul's kernel then takes it (side_join).  Records
 * in between that read its output, or that must stay after such a reader
 * (under autocast the bias gradient's cast of its bf16 sum to the f32
 * leaf, issued right after it; at most SIDE_FOLLOW), move with it: after
 * the matmul and the elementwise run that reads the matmul's output
 * (takes_its_reader: its epilogue, which the reader would otherwise cut
 * off), when that run may pass them.  Reads recs[j .. j + HOIST_WINDOW),
 * moves within. */
volatile AO_t nt__fplan_noside;
enum { SIDE_FOLLOW = 4 };

static bool side_sum_move(nt__rec **recs, int n, int j)
{
    nt__rec *r = recs[j];
    if (AO_load(&nt__fplan_noside) || !side_sum_rec(r) || (j > 0 && side_sum_of(recs[j - 1], r->in[0])))
        return false; /* none, or in place already */
    const nt_tensor *x = r->in[0];
    int end = j + HOIST_WINDOW < n ? j + HOIST_WINDOW : n, fol[SIDE_FOLLOW], nf = 0;
    for (int q = j + 1; q < end; q++) {
        const nt__rec *m = recs[q];
        if (m->type != NT_REC_OP || (m->flags & NT_RECF_ALONE) || !same_capture(m, r) ||
            rec_touches(m, x->st, true))
            return false;
        bool follows = rec_touches(m, r->out[0]->st, false);
        for (int f = 0; f < nf && !follows; f++)
            follows = !runs_before(recs[fol[f]], m);
        if (follows) {
            if (nf == SIDE_FOLLOW)
                return false;
            fol[nf++] = q;
            continue;
        }
        if (!side_sum_of(m, x))
            continue;
        if (!nf) {
            memmove(&recs[j], &recs[j + 1], sizeof *recs * (size_t)(q - j));
            recs[q] = r;
            return true;
        }
        int p = q; /* the matmul's epilogue run: recs (q, p] */
        bool passes = true;
        while (p + 1 < end && takes_its_reader(recs, end, p) && passes) {
            for (int f = 0; f < nf && passes; f++)
                passes = runs_before(recs[fol[f]], recs[p + 1]);
            p += passes;
        }
        nt__rec *o[HOIST_WINDOW];
        int k = 0;
        for (int i = j + 1, f = 0; i <= q; i++) {
            if (f < nf && fol[f] == i)
                f++;
            else
                o[k++] = recs[i];
        }
        o[k++] = r;
        for (int i = q + 1; i <= p; i++)
            o[k++] = recs[i];
        for (int f = 0; f < nf; f++)
            o[k++] = recs[fol[f]];
        memcpy(&recs[j], o, sizeof *recs * (size_t)k);
        return true;
    }
    return false;
}

/* A side product's record at j (side_mm_rec) moves forward to just after
 * the first later matmul it rides on (side_mm_of: dX = dY . W of the same
 * layer; hoist_matmuls has moved dX down to its epilogue's first reader,
 * past dW), on side_sum_move's conditions (nothing in between reads or
 * writes W, writes dY or X, or is anything but an op of the same capture).
 * It stays where its epilogue is next to it (takes_its_reader: the MLP's
 * AdamW update fused into the weight gradient, a bf16 gradient's cast to
 * f32): that reader reads W in PSUM, or at least not from HBM. */
static bool side_mm_move(nt__rec **recs, int n, int j)
{
    nt__rec *r = recs[j];
    if (AO_load(&nt__fplan_nopair) || !side_mm_rec(r) || (j > 0 && side_mm_of(recs[j - 1], r)) ||
        (j > 1 && side_sum_rec(recs[j - 1]) && side_mm_of(recs[j - 2], r)) ||
        takes_its_reader(recs, n, j))
        return false; /* none, in place already, or taken by its reader */
    const nt__storage *ost = r->out[0]->st, *yst = r->in[0]->st, *xst = r->in[1]->st;
    int end = j + HOIST_WINDOW < n ? j + HOIST_WINDOW : n;
    for (int q = j + 1; q < end; q++) {
        const nt__rec *m = recs[q];
        if (m->type != NT_REC_OP || (m->flags & NT_RECF_ALONE) || !same_capture(m, r) ||
            rec_touches(m, ost, false) || rec_touches(m, yst, true) || rec_touches(m, xst, true))
            return false;
        if (side_mm_of(m, r)) {
            memmove(&recs[j], &recs[j + 1], sizeof *recs * (size_t)(q - j));
            recs[q] = r;
            return true;
        }
    }
    return false;
}

/* One move of the side op at j, a column sum or a weight gradient, to its
 * matmul; the planner and reference_order repeat it until none moves. */
static bool side_move(nt__rec **recs, int n, int j)
{
    return side_sum_move(recs, n, j) || side_mm_move(recs, n, j);
}

/* mm[0..nmm): the positions of the batch's matmul records, ascending (the
 * worker's note, nt__batch_mm), or nmm < 0: walk the whole batch.  A move
 * at k reorders only recs[k..], so the positions below k stay right. */
static bool hoist_matmuls(nt__rec **recs, int n, const uint32_t *mm, int nmm)
{
    bool moved = false;
    for (int t = nmm < 0 ? n - 2 : nmm - 1; t >= 0; t--) {
        int k = nmm < 0 ? t : (int)mm[t];
        if (k > n - 2)
            continue;
        if (nmm < 0 && k >= PF_REC)
            __builtin_prefetch(recs[k - PF_REC]);
        nt__rec *r = recs[k];
        if (r->type != NT_REC_OP || r->op != NT_OP_MATMUL || !r->out[0] || r->nout != 1 ||
            (r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)))
            continue;
        /* an epilogue works on [rows <= 128, 512] blocks of the output: one
         * with few rows would run the chain on few partitions, slower than
         * the elementwise kernel (the [10, 1024] head: 23 us against 17) */
        const nt_tensor *o = r->out[0];
        if (o->ndim < 2 || nt__numel(o->ndim - 1, o->shape) < 128)
            continue;
        const nt__storage *ost = o->st;
        int j = k + 1, end = k + HOIST_WINDOW < n ? k + HOIST_WINDOW : n;
        bool ok = true;
        /* the first record that touches the output; the ones before it may
         * not write an input or be anything but an op */
        for (; j < end; j++) {
            const nt__rec *x = recs[j];
            if (x->type != NT_REC_OP || (x->flags & NT_RECF_ALONE)) {
                ok = false;
                break;
            }
            if (rec_touches(x, ost, false))
                break;
            if (writes_an_input(x, r)) {
                ok = false;
                break;
            }
        }
        if (!ok || j == end || !ew_joinable(recs[j], r->out[0]))
            continue;
        int p = j;
        while (p - 1 > k && ew_joinable(recs[p - 1], r->out[0]) && same_capture(recs[p - 1], r))
            p--;
        if (p - 1 == k) {
            moved |= hoist_with_cast(recs, n, k); /* already there; maybe both go */
            continue;
        }
        memmove(&recs[k], &recs[k + 1], sizeof *recs * (size_t)(p - 1 - k));
        recs[p - 1] = r;
        moved = true;
    }
    return moved;
}

/* The same idea the other way: an elementwise record whose inputs were all
 * written by one elementwise record of its size moves back to just after
 * that producer, when nothing in between touches its output or is anything
 * but an op (nothing in between writes its inputs: the producer is their
 * last writer).  The loss gradient's seed (a fill) and its scaling
 * (div_scalar) sat on either side of softmax's and the one-hot's kernels:
 * two kernels of their own, now one. */
/* Whether the first later record that reads recs[j]'s output could join
 * recs[j]'s group.  Then recs[j] already fuses forward and stays: pulled
 * back, a chain that reads it would lose its head.  In a bf16 step, AdamW's
 * first ops read only the gradient (made by a cast); pulled back to that
 * cast, each parameter's 17-op update ran as three kernels, and the step
 * moved 16 MB more. */
static bool joins_its_reader(nt__rec *const *recs, int n, int j)
{
    const nt_tensor *o = recs[j]->out[0];
    int end = j + HOIST_WINDOW < n ? j + HOIST_WINDOW : n;
    for (int k = j + 1; k < end; k++)
        if (rec_touches(recs[k], o->st, false))
            return ew_joinable(recs[k], o);
    return false;
}

/* The storages the batch's records write, as a set: a record none of whose
 * inputs is one has no producer in the batch to move back to, and
 * pull_one skips the scan of the HOIST_WINDOW records before it -- which,
 * on a batch of ops that read the same long-lived tensors (bench/dispatch's
 * lazy mode: 4,096 adds of two inputs), was ~15,000 instructions a record,
 * most of the worker's time.  Open addressing on the storage's address;
 * cap 0 (a small batch, or no memory): no set, every record is scanned.
 * Records move within the batch but never leave it, so the set holds. */
typedef struct {
    const nt__storage **slot;
    uint32_t mask;
} wset;
enum { WSET_MIN_BATCH = 64, WSET_STACK = 4096 };

static uint32_t wset_hash(const nt__storage *st)
{
    return (uint32_t)(((uintptr_t)st >> 6) * 0x9e3779b97f4a7c15ull >> 32);
}

/* Fills w (slots: `stack`, or malloc'ed when the batch needs more; the
 * caller frees w->slot if it is not stack). */
static void wset_build(wset *w, nt__rec *const *recs, int n, const nt__storage **stack)
{
    w->slot = NULL;
    w->mask = 0;
    if (n < WSET_MIN_BATCH)
        return;
    uint32_t nout = 0; /* at most half full: probes stay short */
    for (int k = 0; k < n; k++)
        for (int i = 0; i < NT__MAX_OUT; i++)
            nout += recs[k]->out[i] != NULL;
    uint32_t cap = WSET_STACK;
    while (cap < 2u * nout)
        cap *= 2;
    w->slot = cap == WSET_STACK ? stack : malloc(sizeof *w->slot * cap);
    if (!w->slot)
        return;
    memset(w->slot, 0, sizeof *w->slot * cap);
    w->mask = cap - 1;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < NT__MAX_OUT; i++) {
            const nt__storage *st = recs[k]->out[i] ? recs[k]->out[i]->st : NULL;
            if (!st)
                continue;
            uint32_t h = wset_hash(st) & w->mask;
            while (w->slot[h] && w->slot[h] != st)
                h = (h + 1) & w->mask;
            w->slot[h] = st;
        }
}

/* false: no record of the batch writes st (w built); true: one may. */
static bool wset_may_have(const wset *w, const nt__storage *st)
{
    if (!w->mask)
        return true;
    for (uint32_t h = wset_hash(st) & w->mask;; h = (h + 1) & w->mask) {
        if (w->slot[h] == st)
            return true;
        if (!w->slot[h])
            return false;
    }
}

/* Whether relu r moves back to just after batch norm x, whose output it
 * reads, to share its kernel (NT_FK_BN): in training the running
 * statistics' updates (a few ops on [C] values) sit between the two. */
static bool bn_pulls(const nt__rec *x, const nt__rec *r)
{
    return bn_head(x) && same_capture(x, r) && bn_relu_of(x, r);
}

/* Whether cast r moves back to just after layer norm x, whose output it
 * rounds, to share its kernel (NT_FK_NORM, norm_cast's rule): while a step
 * is captured, autocast's casts of the next matmul's weights, made ahead
 * and not part of the program, sit between the two and end the norm's
 * group at the edge of the program. */
static bool norm_pulls(const nt__rec *x, const nt__rec *r)
{
    return (norm_head(x) && same_capture(x, r) && norm_cast_of(x, r)) || bn_pulls(x, r);
}

/* Considers recs[j] (j >= 1) for the move back; true if it moved.  Reads
 * recs[j - HOIST_WINDOW .. j + HOIST_WINDOW) and moves a record only within
 * recs[j - HOIST_WINDOW + 1 .. j]. */
static bool pull_one(nt__rec **recs, int n, int j, const wset *w)
{
    nt__rec *r = recs[j];
    if (r->type != NT_REC_OP || !nt__fusable_ew(r->op) || !r->out[0] || r->nout != 1 ||
        (r->flags & (NT_RECF_ALONE | NT_RECF_INPLACE)) || r->nin == 0)
        return false;
    /* The scan below moves r only after a record that writes one of its
     * inputs: with none in the batch it ends in false, so say it now. */
    bool producer = false;
    for (int q = 0; q < NT__MAX_IN && !producer; q++)
        producer = r->in[q] && wset_may_have(w, r->in[q]->st);
    if (!producer)
        return false;
    int i = j - 1, stop = j - HOIST_WINDOW > 0 ? j - HOIST_WINDOW : 0;
    for (; i >= stop; i--) {
        const nt__rec *x = recs[i];
        if (x->type != NT_REC_OP || (x->flags & NT_RECF_ALONE) ||
            rec_touches(x, r->out[0]->st, false))
            return false;
        if (writes_an_input(x, r))
            break;
    }
    /* r joins its producer's kernel only in its shape (check_join): a
     * reader of the producer's output reshaped (|x| of an attention output
     * [B, T, H, hd] read as [B, T, D] for an fp8 rounding pass's amax) would
     * meet a "shape change" and run as a kernel of its own, where left in
     * place it joins its own readers */
    if (i < stop || i == j - 1 ||
        (!norm_pulls(recs[i], r) &&
         (!ew_joinable(recs[i], r->out[0]) ||
          !shape_is(r->out[0], recs[i]->out[0]->ndim, recs[i]->out[0]->shape))) ||
        /* a relu whose reader is its own backward (a loss right after it)
         * still goes to its batch norm: both halves then ride on the norm's
         * kernels, two kernels where the relu's pair and the norm's two
         * made three */
        (joins_its_reader(recs, n, j) && !bn_pulls(recs[i], r)))
        return false;
    memmove(&recs[i + 2], &recs[i + 1], sizeof *recs * (size_t)(j - i - 1));
    recs[i + 1] = r;
    return true;
}

/* Puts a batch back in queue order (ascending seq: one stream's records)
 * for the stream, which completes them in array order: out of order, each
 * completion would wait in its list (an allocation, and a sort). */
static void queue_order(nt__rec **recs, int n)
{
    for (int k = 1; k < n; k++) {
        nt__rec *r = recs[k];
        int j = k;
        for (; j > 0 && recs[j - 1]->seq > r->seq; j--)
            recs[j] = recs[j - 1];
        recs[j] = r;
    }
}

bool nt__fplan_check;
volatile AO_t nt__fplan_mismatch, nt__fplan_moved;

/* nt__fplan_check (tests): the order both reorder passes give when each runs
 * over the whole batch before any kernel, with the matmul pass walking
 * every record (the planner before the passes were merged); NULL if the
 * host has no memory for it. */
static nt__rec **reference_order(nt__rec *const *recs, int n, const wset *w)
{
    nt__rec **ref = malloc(sizeof *ref * (size_t)(n ? n : 1));
    if (!ref)
        return NULL;
    memcpy(ref, recs, sizeof *ref * (size_t)n);
    hoist_matmuls(ref, n, NULL, -1);
    while (n > 1 && side_move(ref, n, 0))
        ;
    for (int j = 1; j < n; j++) {
        while (side_move(ref, n, j))
            ;
        pull_one(ref, n, j, w);
    }
    int moved = 0;
    for (int k = 0; k < n; k++)
        moved += ref[k] != recs[k];
    AO_fetch_and_add(&nt__fplan_moved, (AO_t)moved);
    return ref;
}

/* Runs recs[k], a record that starts no group (not fusable), or queues it
 * to share a kernel: gradient clipping's grad_norms records, one for every
 * four gradients, and sums (a layer norm's bias gradient, a sum over the
 * rows) wait in the queue as a group's program does (join_kind), so a
 * step's norms are one kernel, not one each, and a layer norm's bias sum
 * shares its backward's row kernel.  Anything else runs now, after the
 * queue. */
static void run_lone(gstate *s, nt__rec **recs, int k)
{
    nt__rec *r = recs[k];
    nt__fgroup g;
    memset(&g, 0, sizeof g);
    g.recs = recs + k;
    g.nrecs = 1;
    g.backend = r->backend;
    if (join_offer(&s->jq, &g, 0, 0, false))
        return;
    if (!join_passes(&s->jq, &g))
        join_flush(&s->jq);
    plan_pause();
    nt__exec_rec(r);
    nt__rec_drop_dead(r);
    plan_resume();
}

void nt__fusion_run(nt__rec **recs, int n)
{
    bool moved = false;
    plan_resume(); /* the reorder passes are planning too */
    const nt__storage *wstack[WSET_STACK];
    wset w;
    wset_build(&w, recs, n, wstack);
    nt__rec **ref = nt__fplan_check && !NT__CFG(check_nan) ? reference_order(recs, n, &w) : NULL;
    /* j: the next record pull_one looks at (NT_CHECK_NAN: none) */
    int j = 1;
    if (!NT__CFG(check_nan)) { /* NT_CHECK_NAN names the first op in queue order */
        moved = hoist_matmuls(recs, n, nt__batch_mm, nt__batch_nmm);
        /* the side moves at 0 (the look-ahead below starts at 1) */
        while (n > 1 && side_move(recs, n, 0))
            moved = true;
    } else {
        j = n;
    }
    gstate s;
    s.open = false;
    s.nbatch = n;
    s.jq.n = s.jq.nr = s.jq.nw = 0;
    char why[128];
    for (int k = 0; k < n; k++) {
        /* The move back runs HOIST_WINDOW records ahead of grouping, in the
         * same pass: a record it moves lands after k, and it never reads a
         * record that has run (dropped handles).  recs[0..k] are final. */
        int jend = k + HOIST_WINDOW < n - 1 ? k + HOIST_WINDOW : n - 1;
        for (; j <= jend; j++) {
            if (j + PF_REC < n)
                pf_rec_head(recs[j + PF_REC]);
            if (j + PF_HANDLE < n) {
                const nt__rec *q = recs[j + PF_HANDLE];
                pf_outs_head(q);
                for (int i = 0; i < NT__MAX_IN; i++)
                    if (q->in[i])
                        __builtin_prefetch(q->in[i]);
            }
            while (side_move(recs, n, j))
                moved = true;
            moved |= pull_one(recs, n, j, &w);
            /* what grouping reads of recs[j] beyond what pull_one did,
             * fetched now so that it is in cache when grouping gets there */
            const nt__rec *q = recs[j];
            pf_lines(&q->p, offsetof(nt__rec, site) - offsetof(nt__rec, p));
            for (int i = 0; i < NT__MAX_OUT; i++)
                if (q->out[i]) {
                    __builtin_prefetch((const char *)&q->out[i]->refs);
                    __builtin_prefetch(q->out[i]->st);
                }
        }
        nt__rec *r = recs[k];
        if (ref && ref[k] != r)
            AO_fetch_and_add1(&nt__fplan_mismatch);
        if (r->type != NT_REC_OP || r->op >= NT_OP_COUNT) {
            run_group(&s);
            join_flush(&s.jq);
            plan_pause();
            nt__exec_rec(r);
            nt__rec_drop_dead(r);
            plan_resume();
            continue;
        }
        if (s.open) {
            const char *reason = try_add(&s, r, why, sizeof why);
            if (!reason)
                continue;
            AO_fetch_and_add1(&nt__fst.breaks);
            if (NT__CFG(fusion_log))
                log_break(r, reason);
            if (nt__trace_enabled())
                nt__htrace_break(r, reason);
            run_group(&s);
        }
        group_reset(&s, recs, k, r->backend);
        if (try_add(&s, r, why, sizeof why)) { /* cannot even start a group */
            s.open = false;
            run_lone(&s, recs, k);
        }
    }
    run_group(&s);
    join_flush(&s.jq);
    free(ref);
    if (w.slot != wstack)
        free(w.slot);
    if (moved)
        queue_order(recs, n);
    plan_pause();
    if (n > 0 && NT__CFG(fusion_log))
        fprintf(stderr, "ntensor: fusion: batch of %d ops ends: %s\n", n,
                nt__batch_end_reason ? nt__batch_end_reason : "end of the queued work");
}

/* ---------------- replaying a recorded group (fusion/graph.c) ---------------- */

static void poison_group(nt__fgroup *g, nt__errobj *e)
{
    for (int k = 0; k < g->prog->nout; k++) {
        nt_tensor *o = g->out[k];
        nt__errobj_ref(e);
        if (!AO_compare_and_swap_full(&o->st->poison, 0, (AO_t)e))
            nt__errobj_unref(e);
    }
}

void nt__fusion_replay_group(nt__fgroup *g)
{
    nt__fprog *c = g->prog;
    for (int k = 0; k < c->next; k++) {
        nt__errobj *pe = (nt__errobj *)AO_load_acquire(&g->ext[k]->st->poison);
        if (pe) { /* an earlier op failed: its error reaches these outputs */
            poison_group(g, pe);
            NT__COUNT(ops_poisoned, g->nrecs);
            return;
        }
    }
    int rc = NT_ENOTSUP;
    bool traced = nt__trace_enabled();
    double t0 = traced ? nt__htrace_now() : 0;
    const nt__backend_i *be = nt__backends[g->backend];
    nt__sim_ready_begin(g->ext, c->next, g->out, c->nout);
    if (be->run_fused)
        rc = be->run_fused(g);
    nt__sim_ready_end(g->out, c->nout);
    if (traced)
        nt__htrace_fused(kind_name(c->kind), (unsigned long)AO_fetch_and_add1(&kernel_no) + 1,
                         g->recs, g->nrecs, c->nout, 0, true, t0, rc);
    if (rc == 0 && NT__CFG(check_nan) && nt__nan_any(g->out, c->nout))
        rc = NT_ENAN;
    AO_fetch_and_add1(&c->runs);
    if (rc == 0) {
        NT__COUNT(ops_executed, g->nrecs);
        NT__COUNT(kernels, 1);
        return;
    }
    /* A replay runs the kernel the capture ran; its failure is named after
     * the kernel's first op (run the step op by op, not replayed, to name
     * the exact op). */
    nt__fusion_group_failed(g, rc, "in a replay");
}

void nt__fusion_group_failed(nt__fgroup *g, int rc, const char *how)
{
    char msg[512];
    snprintf(msg, sizeof msg, "the fused kernel of %d ops this op begins failed %s: %s", g->nrecs,
             how, rc == NT_ENAN ? "it made a NaN or Inf (NT_CHECK_NAN)" : nt__kerr_msg());
    nt__errobj *e = nt__rec_error(g->recs[0], rc, msg);
    poison_group(g, e);
    if (g->recs[0]->stream)
        nt__stream_note_error(g->recs[0]->stream, e, g->recs[0]->seq);
    nt__errobj_unref(e);
}

/* ---------------- set-up ---------------- */

int nt__fusion_init(void)
{
    memset(&nt__fst, 0, sizeof nt__fst);
    kernel_no = 0;
    nt__group_failed = nt__fusion_group_failed;
    nt__graph_init();
    return 0;
}

void nt__fusion_shutdown(void)
{
    nt__graph_shutdown();
    g_mutex_lock(&cache_lock);
    nt__fprog *c;
    while ((c = lru_head) != NULL) {
        lru_unlink(c);
        prog_unref(c);
    }
    memset(buckets, 0, sizeof buckets);
    cache_n = 0;
    g_mutex_unlock(&cache_lock);
}

void nt__fusion_stats(nt_stats *out)
{
    out->fusion_groups = AO_load(&nt__fst.groups);
    out->fused_ops = AO_load(&nt__fst.fused_ops);
    out->fusion_breaks = AO_load(&nt__fst.breaks);
    out->kernel_cache_hits = AO_load(&nt__fst.hits);
    out->kernel_cache_misses = AO_load(&nt__fst.misses);
    out->fused_values_stored = AO_load(&nt__fst.stored);
    out->fused_values_elided = AO_load(&nt__fst.elided);
    out->fusion_plan_ns = AO_load(&nt__fst.plan_ns);
    out->foreach_kernels = AO_load(&nt__fst.foreach_kernels);
    out->foreach_programs = AO_load(&nt__fst.foreach_programs);
    nt__graph_stats(out);
}

void nt__fusion_stats_reset(void)
{
    memset((void *)&nt__fst, 0, sizeof nt__fst);
    nt__graph_stats_reset();
}
