/* dist/comm.c - communicators and the collective ops.
 *
 * A collective is one record per local member, on a stream of that
 * member's device (NT_REC_HOST: a fusion boundary, run in order like any
 * op), all pointing at one shared object (`coll`).  A member's record runs
 * when its input is ready (its stream's order and the input writer's
 * cross-stream dependency); it *arrives*.  The last local member to arrive
 * completes the collective for every local member: under MPI it exchanges
 * the members' inputs with the other processes (dist/mpi.c), then computes
 * every local output in the rank tree (dist/tree.c) and books the
 * simulated time (dist/cost.c).  The others wait for that, bounded by
 * NT_COLLECTIVE_TIMEOUT, so that no op after the collective on their
 * stream reads an output before it is written.
 *
 *   - Deterministic mode runs each member's record inline at the call, in
 *     member order, on the calling thread: a member that is not the last
 *     returns at once (it must not wait for a member the same thread runs
 *     next); the last completes everything before the call returns.
 *   - Lazy mode: the call asks each member's worker to run up to the
 *     member's record (as a sync would), so no held window keeps a member
 *     from arriving while the others wait for it.
 *   - Lifetime: `coll` holds references on every input and output until
 *     the last member is done with it, so an input stays alive until every
 *     member has read it, whatever the program releases meanwhile.
 *   - Failure (a member that does not arrive in time, a dead process, a
 *     poisoned input): every output is poisoned with one error naming the
 *     collective and the user's call site; members that arrive later find
 *     the collective failed and return. */
#include "dist/dist.h"

#include "core/handle.h"

#include <math.h>

#include "dispatcher/dispatch.h"
#include "fusion/graph.h"
#include "sim/sim.h"
#include "sim/trace.h"
#include "streams/stream.h"

#define COMM_MAGIC 0x434f4d4du /* "COMM" */

struct nt_comm {
    NT__HOBJ_HEAD;       /* core/handle.h: its memory outlives it */
    uint64_t gen;        /* nt__dist_generation() when made */
    volatile AO_t refs;  /* the user's + one per collective in flight */
    int n;               /* local members */
    int *dev;            /* their devices */
    int size;            /* global ranks */
    int first;           /* global rank of local member 0 */
    int nproc, me;
    int *pcount, *pfirst; /* members and first global rank of each process */
    nt__pcomm *pc;       /* NULL with one process */
    volatile AO_t issued; /* collectives issued: numbers them for MPI's tags */
};

enum { ST_WAITING = 0, ST_RUNNING, ST_DONE, ST_FAILED };

typedef struct coll coll;
typedef struct member {
    coll *c;
    int i;
} member;

struct coll {
    volatile AO_t refs;  /* members not yet finished, and the issuing call */
    nt_comm *comm;
    nt__coll_kind kind;
    nt_reduce_op op;
    int root;            /* broadcast: global rank */
    const char *fn;      /* "nt_all_reduce" */
    nt_site site;
    bool inline_run;     /* deterministic mode: records run at the call */
    bool fixed_out;      /* a captured collective's replay: out[] are the captured
                            outputs, known to other threads */
    uint64_t tag;        /* its number among the comm's collectives */
    int n;
    nt_tensor **in, **out;
    nt_stream **stream;
    double *ready;       /* simulated ns each local input was ready */
    member *mem;
    uint8_t *here;       /* member i arrived (under lock) */
    GMutex lock;
    GCond cond;
    int arrived;
    int state;           /* ST_*, under lock */
};

/* ------------------------------------------------------------------ */
/* Devices                                                            */
/* ------------------------------------------------------------------ */

static int dev_count(void) { return NT__CFG(devices); }
static int tensor_dev(const nt_tensor *t) { return t->dev; }
/* The member's stream: the thread's current one if it is on the device,
 * else the device's default stream. */
static nt_stream *member_stream(int dev)
{
    nt_stream *s = nt__stream_current();
    return s->dev == dev ? s : nt__stream_default_on(dev);
}
/* When t's last writer ended on the simulated cores (ns). */
static double tensor_ready_ns(const nt_tensor *t) { return nt__storage_ready_get(t->st); }
/* A kernel that reads t starts no earlier than ns (sim/sim.h). */
static void tensor_set_ready_ns(nt_tensor *t, double ns) { nt__storage_ready_set(t->st, ns); }

/* Each core's collective engine: when its last collective ended
 * (simulated ns).  A core runs its collectives one at a time, so the next
 * starts no earlier; other kernels overlap them. */
#define MAX_CORES 64
static GMutex cc_lock;
static double cc_free[MAX_CORES];
static unsigned cc_trace_gen[MAX_CORES]; /* under cc_lock */
/* The trace track of a core's collectives, beside its engines (0..15) and
 * DMA queues (16..31, sim/core.c). */
#define CC_TRACE_TID 64

void nt__coll_reset_clocks(void)
{
    g_mutex_lock(&cc_lock);
    memset(cc_free, 0, sizeof cc_free);
    memset(cc_trace_gen, 0, sizeof cc_trace_gen);
    g_mutex_unlock(&cc_lock);
}

/* ------------------------------------------------------------------ */
/* Communicators                                                      */
/* ------------------------------------------------------------------ */

static void comm_unref(nt_comm *c)
{
    if (!nt__ref_drop(&c->refs, 1))
        return;
    nt__pcomm_destroy(c->pc);
    free(c->dev);
    free(c->pcount);
    free(c->pfirst);
    nt__hobj_free(c); /* a stale pointer still finds a dead communicator */
}

/* local: a communicator of this process's devices alone (no exchange with
 * the other processes; for a mesh's sub-groups inside one process). */
static nt_comm *comm_create(const int *devices, int n, bool local)
{
    static const char fn[] = "nt_comm_create";
    if (!nt__ensure_init())
        return NULL;
    if (!devices) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'devices' is NULL");
        return NULL;
    }
    int nd = dev_count();
    if (n < 1 || n > nd) {
        nt__err(NULL, NT_EINVAL, fn, "n is %d; expected 1 .. %d (the devices of this process)",
                n, nd);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (devices[i] < 0 || devices[i] >= nd) {
            nt__err(NULL, NT_EINVAL, fn, "devices[%d] is %d; expected a device 0 .. %d", i,
                    devices[i], nd - 1);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i]) {
                nt__err(NULL, NT_EINVAL, fn,
                        "devices[%d] and devices[%d] are both device %d; expected distinct "
                        "devices",
                        j, i, devices[i]);
                return NULL;
            }
    }
    nt_comm *c = nt__hobj_new(sizeof *c, COMM_MAGIC);
    int np = nt__mpi_active() && !local ? nt_process_count() : 1;
    if (c) {
        c->dev = malloc(sizeof *c->dev * (size_t)n);
        c->pcount = calloc((size_t)np, sizeof *c->pcount);
        c->pfirst = calloc((size_t)np, sizeof *c->pfirst);
    }
    if (!c || !c->dev || !c->pcount || !c->pfirst) {
        if (c) {
            free(c->dev);
            free(c->pcount);
            free(c->pfirst);
        }
        nt__hobj_free(c);
        nt__err_hostmem(NULL, fn, "a communicator");
        return NULL;
    }
    memcpy(c->dev, devices, sizeof *c->dev * (size_t)n);
    c->n = n;
    c->nproc = np;
    c->me = np > 1 ? nt_process_rank() : 0;
    char why[256] = "";
    int rc = 0;
    if (local)
        c->pcount[0] = n;
    else
        rc = nt__pcomm_create(n, c->pcount, &c->pc, why, sizeof why);
    if (rc < 0) {
        free(c->dev);
        free(c->pcount);
        free(c->pfirst);
        nt__hobj_free(c);
        nt__err(NULL, rc, fn, "%s", why);
        return NULL;
    }
    for (int p = 0; p < np; p++) {
        c->pfirst[p] = c->size;
        c->size += c->pcount[p];
    }
    c->first = c->pfirst[c->me];
    c->gen = nt__dist_generation();
    c->refs = 1;
    return c;
}

NT_API nt_comm *nt_comm_create(const int *devices, int n)
{
    return comm_create(devices, n, false);
}

nt_comm *nt__comm_create_local(const int *devices, int n)
{
    return comm_create(devices, n, true);
}

NT_API void nt_comm_destroy(nt_comm *c)
{
    if (!c)
        return;
    if (!nt__hobj_live(c, COMM_MAGIC)) { /* the error: destroyed already, ... */
        nt__hobj_check(c, COMM_MAGIC, NULL, "nt_comm_destroy", "c", "communicator");
        return;
    }
    comm_unref(c);
}

NT_API int nt_comm_size(const nt_comm *c)
{
    return c && c->magic == COMM_MAGIC ? c->size : -1;
}

NT_API int nt_comm_rank(const nt_comm *c, int i)
{
    if (!c || c->magic != COMM_MAGIC || i < 0 || i >= c->n)
        return -1;
    return c->first + i;
}

/* ------------------------------------------------------------------ */
/* Running a collective                                               */
/* ------------------------------------------------------------------ */

static const char *kind_api(nt__coll_kind k)
{
    static const char *const names[] = {"nt_all_reduce", "nt_all_gather", "nt_reduce_scatter",
                                        "nt_broadcast"};
    return names[k];
}

/* An error naming the collective and the user's call site. */
static nt__errobj *coll_error(const coll *c, int code, const char *fmt, ...)
    G_GNUC_PRINTF(3, 4);
static nt__errobj *coll_error(const coll *c, int code, const char *fmt, ...)
{
    char where[NT__SITE_MAX], head[NT__SITE_MAX + 64], msg[NT__ERRMSG_MAX], full[NT__ERRMSG_MAX];
    nt__site_format(&c->site, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(head, sizeof head, "%s (at %s): ", c->fn, where);
    nt__msg_join(full, sizeof full, head, msg, "");
    return nt__errobj_new(code, full);
}

/* Poisons every local output with e (keeps an earlier poison) and notes it
 * on the members' streams for nt_sync.  Takes e's reference. */
static void fail_all(coll *c, nt__errobj *e)
{
    for (int i = 0; i < c->n; i++) {
        nt_tensor *o = c->out[i];
        nt__errobj_ref(e);
        if (!AO_compare_and_swap_full(&o->st->poison, 0, (AO_t)e))
            nt__errobj_unref(e);
        nt__stream_note_error(c->stream[i], e, 0);
    }
    nt__errobj_unref(e);
}

/* Bytes of one member's input (broadcast: the root's shape). */
static size_t member_bytes(const nt_tensor *t)
{
    return (size_t)nt__numel(t->ndim, t->shape) * nt__dtype_size((nt_dtype)t->dtype);
}

/* Copies t's elements in row-major order into dst (any strides). */
static void pack(char *dst, const nt_tensor *t)
{
    size_t es = nt__dtype_size((nt_dtype)t->dtype);
    const char *src = nt__tensor_data(t);
    if (nt__is_contig(t)) {
        memcpy(dst, src, member_bytes(t));
        return;
    }
    int64_t idx[NT_MAX_DIMS] = {0};
    int64_t n = nt__numel(t->ndim, t->shape);
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++)
            off += idx[d] * t->stride[d];
        memcpy(dst + (size_t)k * es, src + off * (int64_t)es, es);
        nt__idx_next(idx, t->ndim, t->shape);
    }
}

/* What every process sends first: enough to check the members agree. */
typedef struct hdr {
    int32_t kind, op, root, dtype, ndim, nmem;
    uint64_t tag;
    int64_t shape[NT_MAX_DIMS];
} hdr;

static void fmt_shape(char *buf, size_t n, const hdr *h)
{
    char sh[128];
    snprintf(buf, n, "%s %s", nt_dtype_name((nt_dtype)h->dtype),
             nt__shape_str(h->ndim, h->shape, sh, sizeof sh));
}

/* An input's poison, referenced (the outputs carry it, as any op's do), or
 * NULL. */
static nt__errobj *poisoned_input(const coll *c)
{
    for (int i = 0; i < c->n; i++) {
        nt_tensor *t = c->in[i];
        nt__errobj *pe = t ? (nt__errobj *)AO_load_acquire(&t->st->poison) : NULL;
        if (pe) {
            nt__errobj_ref(pe);
            return pe;
        }
    }
    return NULL;
}

/* One completion's scratch: every global rank's input and times. */
typedef struct xfer {
    size_t bytes;        /* one rank's input */
    size_t *len, *off;   /* per process: its part of an exchange */
    hdr *hs;             /* per process: its description */
    double *ready, *end; /* per global rank: input ready, collective done (simulated ns) */
    char *all;           /* every global rank's input, packed in rank order */
    const void **vals;   /* per global rank: its input in `all` */
} xfer;

static void xfer_free(xfer *x)
{
    free(x->len);
    free(x->hs);
    free(x->ready);
    free(x->end);
    free(x->all);
    free(x->vals);
}

/* 0, or -1 (x is freed either way by xfer_free). */
static int xfer_new(xfer *x, const coll *c, const nt_tensor *ref)
{
    int N = c->comm->size, np = c->comm->nproc;
    x->bytes = member_bytes(ref);
    x->len = malloc(sizeof *x->len * (size_t)np * 2);
    x->off = x->len ? x->len + np : NULL;
    x->hs = malloc(sizeof *x->hs * (size_t)np);
    x->ready = malloc(sizeof *x->ready * (size_t)N);
    x->end = malloc(sizeof *x->end * (size_t)N);
    x->all = malloc(x->bytes * (size_t)N + 1);
    x->vals = malloc(sizeof *x->vals * (size_t)N);
    if (!x->len || !x->hs || !x->ready || !x->end || !x->all || !x->vals)
        return -1;
    for (int r = 0; r < N; r++)
        x->vals[r] = x->all + (size_t)r * x->bytes;
    return 0;
}

/* The local members' ready times (no earlier than their core's collective
 * engine is free) and inputs (broadcast: the root's only), at their global
 * ranks. */
static void gather_local(coll *c, xfer *x)
{
    nt_comm *cm = c->comm;
    g_mutex_lock(&cc_lock);
    for (int i = 0; i < c->n; i++) {
        double f = cc_free[cm->dev[i] % MAX_CORES];
        if (f > c->ready[i])
            c->ready[i] = f;
    }
    g_mutex_unlock(&cc_lock);
    bool bc = c->kind == NT__COLL_BROADCAST;
    for (int i = 0; i < c->n; i++) {
        int r = cm->first + i;
        x->ready[r] = c->ready[i];
        if (!bc || r == c->root)
            pack(x->all + (size_t)r * x->bytes, c->in[i]);
    }
}

/* Every process's description `hs` against this one's: 0, or -1 with *err. */
static int check_descriptions(const coll *c, const hdr *mine, const hdr *hs, nt__errobj **err)
{
    for (int p = 0; p < c->comm->nproc; p++) {
        const hdr *h = &hs[p];
        if (h->kind != mine->kind || h->tag != mine->tag || h->op != mine->op ||
            h->root != mine->root) {
            *err = coll_error(c, NT_ESTATE,
                              "process %d runs %s (its collective #%llu) where this process "
                              "runs %s (#%llu): every process must issue the same "
                              "collectives on a communicator in the same order",
                              p, kind_api((nt__coll_kind)h->kind), (unsigned long long)h->tag,
                              c->fn, (unsigned long long)mine->tag);
            return -1;
        }
        if (h->dtype != mine->dtype || h->ndim != mine->ndim ||
            memcmp(h->shape, mine->shape, sizeof(int64_t) * (size_t)mine->ndim)) {
            char a[160], b[160];
            fmt_shape(a, sizeof a, h);
            fmt_shape(b, sizeof b, mine);
            *err = coll_error(c, h->dtype != mine->dtype ? NT_EDTYPE : NT_ESHAPE,
                              "process %d's inputs are %s; this process's are %s", p, a, b);
            return -1;
        }
    }
    return 0;
}

/* The process that holds global rank r. */
static int process_of(const nt_comm *cm, int r)
{
    for (int p = 0; p < cm->nproc; p++)
        if (r >= cm->pfirst[p] && r < cm->pfirst[p] + cm->pcount[p])
            return p;
    return 0;
}

/* Between processes (MPI), in three exchanges: the descriptions, so a
 * mismatch is a clear error, not a garbled exchange; the inputs' ready
 * times; the inputs (broadcast: the root's only).  0, or -1 with *err. */
static int exchange(coll *c, const hdr *mine, xfer *x, nt__errobj **err)
{
    nt_comm *cm = c->comm;
    int np = cm->nproc, N = cm->size;
    char why[512] = "";
    for (int p = 0; p < np; p++) {
        x->len[p] = sizeof(hdr);
        x->off[p] = (size_t)p * sizeof(hdr);
    }
    int rc = nt__pcomm_allgather(cm->pc, mine, x->hs, x->len, x->off,
                                 "exchanging the collective's description (shape, dtype, op)",
                                 why, sizeof why);
    if (rc < 0) {
        *err = coll_error(c, rc, "%s", why);
        return -1;
    }
    if (check_descriptions(c, mine, x->hs, err) < 0)
        return -1;
    for (int p = 0; p < np; p++) {
        x->len[p] = sizeof(double) * (size_t)cm->pcount[p];
        x->off[p] = sizeof(double) * (size_t)cm->pfirst[p];
    }
    double *rtmp = malloc(sizeof(double) * (size_t)N);
    if (!rtmp) {
        *err = coll_error(c, NT_EHOSTMEM, "out of host memory for the exchange");
        return -1;
    }
    rc = nt__pcomm_allgather(cm->pc, x->ready + cm->first, rtmp, x->len, x->off,
                             "exchanging the inputs' ready times", why, sizeof why);
    if (rc == 0) {
        memcpy(x->ready, rtmp, sizeof(double) * (size_t)N);
        bool bc = c->kind == NT__COLL_BROADCAST;
        int root_proc = bc ? process_of(cm, c->root) : 0;
        for (int p = 0; p < np; p++) {
            x->len[p] = bc ? (p == root_proc ? x->bytes : 0) : x->bytes * (size_t)cm->pcount[p];
            x->off[p] = bc ? x->bytes * (size_t)c->root : x->bytes * (size_t)cm->pfirst[p];
        }
        rc = nt__pcomm_allgather(cm->pc, x->all + x->off[cm->me], x->all, x->len, x->off,
                                 "exchanging the inputs", why, sizeof why);
    }
    free(rtmp);
    if (rc < 0) {
        *err = coll_error(c, rc, "%s", why);
        return -1;
    }
    return 0;
}

/* Member i's output from every rank's input, in the rank tree: 0 or an
 * NT_* code. */
static int member_output(const coll *c, int i, const nt_tensor *ref, const xfer *x, char *dst)
{
    int N = c->comm->size, g = c->comm->first + i;
    nt_dtype dt = (nt_dtype)ref->dtype;
    int64_t count = nt__numel(ref->ndim, ref->shape);
    int rc = 0;
    switch (c->kind) {
    case NT__COLL_ALL_REDUCE:
        if (i == 0)
            rc = nt__tree_reduce(dst, x->vals, N, count, dt, c->op);
        else
            memcpy(dst, nt__tensor_data(c->out[0]), x->bytes);
        break;
    case NT__COLL_REDUCE_SCATTER: {
        int64_t blk = count / N;
        size_t es = nt__dtype_size(dt);
        const void **bv = malloc(sizeof *bv * (size_t)N);
        if (!bv)
            return NT_EHOSTMEM;
        for (int r = 0; r < N; r++)
            bv[r] = (const char *)x->vals[r] + (size_t)(blk * g) * es;
        rc = nt__tree_reduce(dst, bv, N, blk, dt, c->op);
        free(bv);
        break;
    }
    case NT__COLL_ALL_GATHER:
        memcpy(dst, x->all, x->bytes * (size_t)N);
        break;
    case NT__COLL_BROADCAST:
        memcpy(dst, x->vals[c->root], x->bytes);
        break;
    }
    return rc;
}

/* Every local output's values: 0, or -1 with *err. */
static int write_outputs(coll *c, const nt_tensor *ref, const xfer *x, nt__errobj **err)
{
    for (int i = 0; i < c->n; i++) {
        char *dst = nt__storage_materialize(c->out[i]->st);
        if (!dst) {
            *err = coll_error(c, NT_EHOSTMEM, "out of host memory for the output of member %d",
                              i);
            return -1;
        }
        int rc = member_output(c, i, ref, x, dst);
        if (rc < 0) {
            *err = coll_error(c, rc, "out of host memory for the reduction's scratch");
            return -1;
        }
    }
    return 0;
}

/* NT_TRACE: member i's span on its core's track group (simulated us);
 * under cc_lock. */
static void trace_member(const coll *c, int i, double full, const xfer *x)
{
    nt_comm *cm = c->comm;
    int d = cm->dev[i] % MAX_CORES, r = cm->first + i, N = cm->size;
    int pid = nt__sim_trace_pid(cm->dev[i]);
    unsigned g = nt__trace_generation();
    if (cc_trace_gen[d] != g) {
        cc_trace_gen[d] = g;
        nt__trace_thread_name(pid, CC_TRACE_TID, "collectives", CC_TRACE_TID);
    }
    char name[96], args[512], where[256], js[300];
    snprintf(name, sizeof name, "%s %s", c->fn + 3,
             c->kind == NT__COLL_ALL_REDUCE || c->kind == NT__COLL_REDUCE_SCATTER
                 ? nt__reduce_op_name(c->op)
                 : "");
    nt__site_format(&c->site, where, sizeof where);
    nt__trace_json_str(js, sizeof js, where);
    snprintf(args, sizeof args,
             "{\"rank\":%d,\"ranks\":%d,\"bytes\":%.0f,\"formula_us\":%.3f,\"site\":%s}", r, N,
             full, nt__coll_formula_ns(nt__topology_current(), c->kind, N, full) / 1e3, js);
    nt__trace_complete(pid, CC_TRACE_TID, name, x->ready[r] / 1e3,
                       (x->end[r] - x->ready[r]) / 1e3, args);
}

/* The simulated time: the schedule over every global rank, from when each
 * input was ready and its core's collective engine was free (gather_local,
 * before the ready times were exchanged). */
static void book_time(coll *c, xfer *x)
{
    nt_comm *cm = c->comm;
    int N = cm->size;
    double full = c->kind == NT__COLL_ALL_GATHER ? (double)x->bytes * N : (double)x->bytes;
    g_mutex_lock(&cc_lock);
    nt__coll_schedule(nt__topology_current(), c->kind, N, full, x->ready, x->end);
    for (int i = 0; i < c->n; i++) {
        int r = cm->first + i;
        cc_free[cm->dev[i] % MAX_CORES] = x->end[r];
        tensor_set_ready_ns(c->out[i], x->end[r]);
        if (nt__trace_at(NT__TRACE_KERNEL))
            trace_member(c, i, full, x);
    }
    g_mutex_unlock(&cc_lock);
}

/* The completer: every local member arrived.  Returns 0 or fails with *err
 * set (a new error object). */
static int complete(coll *c, nt__errobj **err)
{
    if ((*err = poisoned_input(c)) != NULL)
        return -1;
    /* the shape every rank's input has (broadcast: any member's template
     * or the root's input) */
    const nt_tensor *ref = NULL;
    for (int i = 0; i < c->n && !ref; i++)
        ref = c->in[i];
    hdr mine = {.kind = c->kind, .op = c->op, .root = c->root, .dtype = ref->dtype,
                .ndim = ref->ndim, .nmem = c->n, .tag = c->tag};
    memcpy(mine.shape, ref->shape, sizeof(int64_t) * (size_t)ref->ndim);
    xfer x = {0};
    int rc = xfer_new(&x, c, ref);
    if (rc < 0)
        *err = coll_error(c, NT_EHOSTMEM, "out of host memory for %zu bytes of inputs",
                          x.bytes * (size_t)c->comm->size);
    if (rc == 0) {
        gather_local(c, &x);
        if (c->comm->nproc > 1)
            rc = exchange(c, &mine, &x, err);
    }
    if (rc == 0)
        rc = write_outputs(c, ref, &x, err);
    if (rc == 0)
        book_time(c, &x);
    xfer_free(&x);
    return rc;
}

static void coll_unref(coll *c)
{
    if (!nt__ref_drop(&c->refs, 1))
        return;
    for (int i = 0; i < c->n; i++) {
        if (c->in[i])
            nt__tensor_iunref(c->in[i]);
        nt__tensor_iunref(c->out[i]);
    }
    comm_unref(c->comm);
    g_mutex_clear(&c->lock);
    g_cond_clear(&c->cond);
    free(c->in);
    free(c);
}

/* A member's record runs: arrive, then complete (the last) or wait. */
static void member_run(void *arg)
{
    member *m = arg;
    coll *c = m->c;
    if (c->in[m->i])
        c->ready[m->i] = tensor_ready_ns(c->in[m->i]);
    g_mutex_lock(&c->lock);
    c->here[m->i] = 1;
    bool last = ++c->arrived == c->n;
    if (last && c->state == ST_WAITING) {
        c->state = ST_RUNNING;
        g_mutex_unlock(&c->lock);
        nt__errobj *err = NULL;
        int rc = complete(c, &err);
        if (rc < 0)
            fail_all(c, err);
        g_mutex_lock(&c->lock);
        c->state = rc < 0 ? ST_FAILED : ST_DONE;
        g_cond_broadcast(&c->cond);
    } else if (!c->inline_run) {
        /* Wait until the collective is done: a later op of this stream may
         * read the output.  The timeout counts while members are missing;
         * once the completer runs, it bounds its own waits. */
        gint64 deadline =
            g_get_monotonic_time() + (gint64)(nt__coll_timeout_s() * G_USEC_PER_SEC);
        while (c->state == ST_WAITING || c->state == ST_RUNNING) {
            if (c->state == ST_WAITING && g_get_monotonic_time() >= deadline) {
                /* name the members whose records have not run */
                char missing[256] = "";
                size_t o = 0;
                for (int i = 0; i < c->n && o + 40 < sizeof missing; i++)
                    if (!c->here[i])
                        o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%d (device %d)",
                                              o ? ", " : "", i, c->comm->dev[i]);
                c->state = ST_FAILED;
                g_mutex_unlock(&c->lock);
                fail_all(c, coll_error(c, NT_ETIMEDOUT,
                                       "timed out after %g s (NT_COLLECTIVE_TIMEOUT) waiting for "
                                       "member %s: its input was never ready or its stream is "
                                       "blocked (%d of %d local members arrived)",
                                       nt__coll_timeout_s(), missing, c->arrived, c->n));
                g_mutex_lock(&c->lock);
                g_cond_broadcast(&c->cond);
                break;
            }
            g_cond_wait_until(&c->cond, &c->lock, c->state == ST_WAITING ? deadline
                                                  : g_get_monotonic_time() + 100000);
        }
    }
    g_mutex_unlock(&c->lock);
    coll_unref(c);
}

/* ------------------------------------------------------------------ */
/* The calls                                                          */
/* ------------------------------------------------------------------ */

/* The communicator and the argument arrays; every out[i] is NULL once out
 * is known to be an array. */
static int check_comm(const nt_site *site, const char *fn, const nt_comm *cm,
                      nt_tensor *const *in, nt_tensor **out)
{
    int rc = nt__comm_valid(site, fn, cm);
    if (rc)
        return rc;
    if (!out)
        return nt__err(site, NT_EINVAL, fn, "argument 'out' is NULL");
    for (int i = 0; i < cm->n; i++)
        out[i] = NULL;
    if (!in)
        return nt__err(site, NT_EINVAL, fn, "argument 'in' is NULL");
    return 0;
}

/* For dist/tp.c, dist/fp8.c and check_comm: the communicator alone, and its
 * local members. */
int nt__comm_valid(const nt_site *site, const char *fn, const nt_comm *cm)
{
    if (!cm)
        return nt__err(site, NT_EINVAL, fn, "argument 'c' is NULL");
    if (cm->magic != COMM_MAGIC)
        return nt__err(site, NT_EINVAL, fn, "argument 'c' is not a live communicator "
                                            "(destroyed?)");
    if (cm->gen != nt__dist_generation())
        return nt__err(site, NT_ESTATE, fn,
                       "communicator 'c' was created before the last nt_shutdown; create it "
                       "again after nt_init");
    return 0;
}
int nt__comm_local(const nt_comm *cm, const int **devs)
{
    *devs = cm->dev;
    return cm->n;
}

/* The reduction op and the broadcast root; *root_local: the root's local
 * member, or -1 (another process's, or not a broadcast). */
static int check_op_root(const nt_site *site, const char *fn, nt__coll_kind kind,
                         const nt_comm *cm, int op, int root, int *root_local)
{
    *root_local = -1;
    if ((kind == NT__COLL_ALL_REDUCE || kind == NT__COLL_REDUCE_SCATTER) &&
        !nt__reduce_op_name(op))
        return nt__err(site, NT_EINVAL, fn,
                       "op is %d; expected NT_REDUCE_SUM, NT_REDUCE_MEAN or NT_REDUCE_MAX", op);
    if (kind == NT__COLL_BROADCAST) {
        if (root < 0 || root >= cm->size)
            return nt__err(site, NT_EINVAL, fn, "root is %d; expected a rank 0 .. %d", root,
                           cm->size - 1);
        if (root >= cm->first && root < cm->first + cm->n)
            *root_local = root - cm->first;
    }
    return 0;
}

/* The inputs: live, on their member's device, one shape and dtype.  *ref:
 * the input whose shape and dtype every rank's has (broadcast: the root's,
 * when local). */
static int check_inputs(const nt_site *site, const char *fn, nt__coll_kind kind,
                        const nt_comm *cm, nt_tensor *const *in, int root, int root_local,
                        const nt_tensor **ref_out)
{
    const nt_tensor *ref = NULL;
    int refi = -1;
    char name[32];
    for (int i = 0; i < cm->n; i++) {
        snprintf(name, sizeof name, "in[%d]", i);
        if (kind == NT__COLL_BROADCAST && !in[i]) {
            if (i == root_local)
                return nt__err(site, NT_EINVAL, fn, "in[%d] is NULL; it is the root's input",
                               i);
            if (root_local < 0)
                return nt__err(site, NT_EINVAL, fn,
                               "in[%d] is NULL; the root (rank %d) is in another process, so "
                               "every member gives a tensor of the root's shape and dtype",
                               i, root);
            continue;
        }
        if (!nt__check_arg(site, fn, name, in[i]) || !nt__check_resident(site, fn, name, in[i]))
            return nt_last_error();
        int d = tensor_dev(in[i]);
        if (d != cm->dev[i])
            return nt__err(site, NT_EINVAL, fn,
                           "in[%d] is on device %d; expected member %d's device %d", i, d, i,
                           cm->dev[i]);
        if (!ref) {
            ref = in[i];
            refi = i;
            continue;
        }
        char a[128], b[128];
        if (in[i]->dtype != ref->dtype)
            return nt__err(site, NT_EDTYPE, fn, "in[%d] is %s; in[%d] is %s: expected one dtype",
                           i, nt_dtype_name((nt_dtype)in[i]->dtype), refi,
                           nt_dtype_name((nt_dtype)ref->dtype));
        if (in[i]->ndim != ref->ndim ||
            memcmp(in[i]->shape, ref->shape, sizeof(int64_t) * (size_t)ref->ndim))
            return nt__err(site, NT_ESHAPE, fn, "in[%d] has shape %s; in[%d] has %s", i,
                           nt__shape_str(in[i]->ndim, in[i]->shape, a, sizeof a), refi,
                           nt__shape_str(ref->ndim, ref->shape, b, sizeof b));
    }
    *ref_out = kind == NT__COLL_BROADCAST && root_local >= 0 ? in[root_local] : ref;
    return 0;
}

/* The outputs' shape (each rank's input is `ref`'s); refuses a mean of
 * integers. */
static int out_shape(const nt_site *site, const char *fn, nt__coll_kind kind,
                     const nt_comm *cm, const nt_tensor *ref, int op, int *ondim,
                     int64_t *oshape)
{
    nt_dtype dt = (nt_dtype)ref->dtype;
    /* the tree reduction (dist/tree.c) computes in f32 or i32: an f64
     * reduction would lose bits, so f64 is refused (gathers and broadcasts
     * only move bytes) */
    if ((kind == NT__COLL_ALL_REDUCE || kind == NT__COLL_REDUCE_SCATTER) &&
        (dt == NT_F64 || nt__dtype_is_fp8(dt)))
        return nt__err(site, NT_EDTYPE, fn,
                       "in[0] is %s, which a reducing collective does not take (it takes "
                       "f32, bf16, f16, i32 or u8; fp8 is a storage dtype: reduce the f32 "
                       "values, docs/ops.md section 15)", nt_dtype_name(dt));
    if ((kind == NT__COLL_ALL_REDUCE || kind == NT__COLL_REDUCE_SCATTER) &&
        op == NT_REDUCE_MEAN && !nt__dtype_is_float(dt))
        return nt__err(site, NT_EDTYPE, fn, "NT_REDUCE_MEAN needs a floating dtype; got %s",
                       nt_dtype_name(dt));
    *ondim = ref->ndim;
    memcpy(oshape, ref->shape, sizeof(int64_t) * NT_MAX_DIMS);
    if (kind != NT__COLL_ALL_GATHER && kind != NT__COLL_REDUCE_SCATTER)
        return 0;
    char a[128];
    if (ref->ndim < 1)
        return nt__err(site, NT_ESHAPE, fn, "the inputs are 0-d; expected a dim 0 to %s",
                       kind == NT__COLL_ALL_GATHER ? "concatenate along" : "split");
    if (kind == NT__COLL_ALL_GATHER) {
        oshape[0] = ref->shape[0] * cm->size;
    } else {
        if (ref->shape[0] % cm->size)
            return nt__err(site, NT_ESHAPE, fn,
                           "the inputs have shape %s; dim 0 must be a multiple of the "
                           "communicator's %d ranks",
                           nt__shape_str(ref->ndim, ref->shape, a, sizeof a), cm->size);
        oshape[0] = ref->shape[0] / cm->size;
    }
    return 0;
}

/* A zeroed collective of n members with its arrays (one block, at c->in),
 * or NULL (host memory). */
static coll *coll_alloc(int n)
{
    coll *c = calloc(1, sizeof *c);
    void *block = c ? calloc((size_t)n, sizeof(nt_tensor *) * 2 + sizeof(nt_stream *) +
                                            sizeof(double) + sizeof(member) + 1)
                    : NULL;
    if (!c || !block) {
        free(c);
        free(block);
        return NULL;
    }
    c->in = block;
    c->out = c->in + n;
    c->stream = (nt_stream **)(c->out + n);
    c->ready = (double *)(c->stream + n);
    c->mem = (member *)(c->ready + n);
    c->here = (uint8_t *)(c->mem + n);
    c->n = n;
    return c;
}

/* A collective with its outputs (dtype dt, shape ondim/oshape, one on each
 * member's device) and recs[i], member i's record: everything that can
 * fail, taken before anything is queued.  NULL with the error set. */
static coll *coll_new(const nt_site *site, const char *fn, const nt_comm *cm, nt_dtype dt,
                      int ondim, const int64_t *oshape, nt__rec **recs)
{
    int n = cm->n;
    coll *c = coll_alloc(n);
    if (!c) {
        nt__err_hostmem(site, fn, "a collective");
        return NULL;
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        nt_stream *s = member_stream(cm->dev[i]);
        c->stream[i] = s;
        nt__alloc_sid = s->id;
        nt__alloc_dev = (uint8_t)cm->dev[i];
        c->out[i] = nt__tensor_empty(dt, ondim, oshape, site, fn);
        nt__alloc_dev = 0;
        nt__alloc_sid = 0;
        if (!c->out[i])
            rc = nt_last_error();
        else if (!(recs[i] = nt__rec_alloc(s)))
            rc = nt__err_hostmem(site, fn, "an op record");
    }
    if (rc == 0)
        return c;
    for (int i = 0; i < n; i++) {
        if (c->out[i])
            nt_release(c->out[i]);
        if (recs[i])
            nt__rec_unalloc(recs[i]);
    }
    free(c->in);
    free(c);
    return NULL;
}

/* Fills c once nothing can fail: it holds the communicator, the inputs and
 * the outputs until its last member is done, and the issuing call's
 * reference until that call returns. */
static void coll_start(coll *c, const nt_site *site, const char *fn, nt__coll_kind kind,
                       nt_comm *cm, nt_tensor *const *in, int op, int root)
{
    int n = cm->n;
    c->comm = cm;
    AO_fetch_and_add1(&cm->refs);
    c->kind = kind;
    c->op = (nt_reduce_op)op;
    c->root = root;
    c->fn = fn;
    c->site = site ? *site : (nt_site){0};
    c->inline_run = NT__CFG(mode) == NT_MODE_DETERMINISTIC;
    c->tag = (uint64_t)AO_fetch_and_add1(&cm->issued);
    c->n = n;
    c->refs = (AO_t)n + 1;
    g_mutex_init(&c->lock);
    g_cond_init(&c->cond);
    for (int i = 0; i < n; i++) {
        c->in[i] = in[i];
        if (in[i])
            nt__tensor_iref(in[i]);
        if (c->fixed_out)
            nt__tensor_iref(c->out[i]);
        else
            c->out[i]->irefs++; /* the collective's, until its last member is done */
        c->mem[i] = (member){c, i};
    }
}

/* Member i's record r joins its stream through the dispatcher's one enqueue
 * path (deterministic mode: runs at once).  A host record, alone in its
 * batch: the ops before it are run and marked done first (core/internal.h).
 * Returns its seq; c->stream[i] is its stream. */
static uint64_t enqueue_member(coll *c, int i, nt__rec *r)
{
    r->type = NT_REC_HOST;
    r->flags = NT_RECF_ALONE;
    r->host_fn = member_run;
    r->host_arg = &c->mem[i];
    r->site = c->site;
    r->fn = c->fn;
    if (c->in[i]) {
        nt__tensor_iref(c->in[i]);
        r->in[0] = c->in[i];
        r->nin = 1;
    }
    if (c->fixed_out)
        nt__tensor_iref(c->out[i]);
    else
        c->out[i]->irefs++; /* the record's; a fresh handle no other thread knows */
    r->out[0] = c->out[i];
    r->nout = 1;
    return nt__rec_enqueue(r, &c->stream[i], c->inline_run);
}

/* Queues every member of c (started) with its record recs[i] (recs has
 * room for c->n sequence numbers after its c->n records) and drops the
 * caller's reference to c. */
static void coll_enqueue(coll *c, nt__rec **recs)
{
    int n = c->n;
    bool lazy = !c->inline_run && NT__CFG(mode) == NT_MODE_LAZY;
    uint64_t *seqs = (uint64_t *)(recs + n);
    for (int i = 0; i < n; i++)
        seqs[i] = enqueue_member(c, i, recs[i]);
    if (lazy) /* a held window must not keep a member from its collective */
        for (int i = 0; i < n; i++)
            nt__stream_request_flush(c->stream[i], seqs[i]);
    coll_unref(c); /* this call's */
}

/* Checks and issues one collective; every out[i] is NULL on failure. */
static int issue_now(const nt_site *site, nt__coll_kind kind, nt_comm *cm, nt_tensor *const *in,
                     nt_tensor **out, int op, int root)
{
    const char *fn = kind_api(kind);
    if (!nt__ensure_init())
        return nt_last_error();
    int root_local = -1, ondim = 0;
    int64_t oshape[NT_MAX_DIMS];
    const nt_tensor *ref = NULL;
    int rc = check_comm(site, fn, cm, in, out);
    if (rc == 0)
        rc = check_op_root(site, fn, kind, cm, op, root, &root_local);
    if (rc == 0)
        rc = check_inputs(site, fn, kind, cm, in, root, root_local, &ref);
    if (rc == 0)
        rc = out_shape(site, fn, kind, cm, ref, op, &ondim, oshape);
    if (rc < 0)
        return rc;

    int n = cm->n;
    nt__rec **recs = calloc((size_t)n, sizeof *recs + sizeof(uint64_t)); /* then the seqs */
    if (!recs)
        return nt__err_hostmem(site, fn, "a collective");
    coll *c = coll_new(site, fn, cm, (nt_dtype)ref->dtype, ondim, oshape, recs);
    if (!c) {
        free(recs);
        return nt_last_error();
    }
    /* Nothing fails from here on. */
    coll_start(c, site, fn, kind, cm, in, op, root);
    for (int i = 0; i < n; i++)
        out[i] = c->out[i];
    coll_enqueue(c, recs);
    free(recs);
    bool adopted = true;
    for (int i = 0; i < n; i++)
        adopted &= nt__scope_adopt(out[i], fn) != NULL;
    if (!adopted) {
        for (int i = 0; i < n; i++)
            out[i] = NULL;
        return nt_last_error();
    }
    return 0;
}

/* ---------------- captured collectives (fusion/graph.h) ----------------
 *
 * Inside a capture of several streams a collective is recorded as what a
 * replay issues again: the same kind, op and root on the same communicator,
 * reading the captured inputs (which the segments before it rewrite) and
 * writing the captured outputs in place (which the segments after it read),
 * its members on the streams they ran on. */

typedef struct ccap {
    nt_comm *comm;       /* referenced */
    nt__coll_kind kind;
    int op, root, n;
    nt_site site;
    nt_tensor **in, **out; /* internal references */
    nt_stream **stream;
} ccap;

typedef struct cprep {
    coll *c;
    nt__rec **recs;
} cprep;

static void ccap_release(void *rec)
{
    ccap *k = rec;
    for (int i = 0; i < k->n; i++) {
        if (k->in[i])
            nt__tensor_iunref(k->in[i]);
        nt__tensor_iunref(k->out[i]);
    }
    comm_unref(k->comm);
    free(k->in);
    free(k);
}

static void ccap_discard(void *prep)
{
    cprep *p = prep;
    for (int i = 0; i < p->c->n; i++)
        if (p->recs[i])
            nt__rec_unalloc(p->recs[i]);
    free(p->c->in);
    free(p->c);
    free(p->recs);
    free(p);
}

static void *ccap_prepare(void *rec, const nt_site *site)
{
    ccap *k = rec;
    const char *fn = kind_api(k->kind);
    int n = k->n;
    cprep *p = calloc(1, sizeof *p);
    coll *c = coll_alloc(n);
    nt__rec **recs = calloc((size_t)n, sizeof *recs + sizeof(uint64_t)); /* then the seqs */
    if (!p || !c || !recs) {
        free(p);
        if (c)
            free(c->in);
        free(c);
        free(recs);
        nt__err_hostmem(site, fn, "a captured collective's replay");
        return NULL;
    }
    p->c = c;
    p->recs = recs;
    for (int i = 0; i < n; i++) {
        c->stream[i] = k->stream[i];
        c->out[i] = k->out[i];
        if (!(recs[i] = nt__rec_alloc(k->stream[i]))) {
            ccap_discard(p);
            nt__err_hostmem(site, fn, "an op record");
            return NULL;
        }
    }
    return p;
}

static void ccap_issue(void *rec, void *prep)
{
    ccap *k = rec;
    cprep *p = prep;
    coll *c = p->c;
    const char *fn = kind_api(k->kind);
    c->fixed_out = true;
    /* the call site is the captured call's: an error of the replay names it */
    coll_start(c, &k->site, fn, k->kind, k->comm, k->in, k->op, k->root);
    coll_enqueue(c, p->recs);
    free(p->recs);
    free(p);
}

static const nt__capture_coll_ops ccap_ops = {ccap_prepare, ccap_issue, ccap_discard,
                                              ccap_release};

/* The record of a collective just issued (its members' streams in
 * streams[]), or NULL (host memory: the capture fails). */
static ccap *ccap_new(const nt_site *site, nt__coll_kind kind, nt_comm *cm,
                      nt_tensor *const *in, nt_tensor *const *out, int op, int root,
                      nt_stream *const *streams)
{
    int n = cm->n;
    ccap *k = calloc(1, sizeof *k);
    void *block = calloc((size_t)n, sizeof(nt_tensor *) * 2 + sizeof(nt_stream *));
    if (!k || !block) {
        free(k);
        free(block);
        return NULL;
    }
    k->in = block;
    k->out = k->in + n;
    k->stream = (nt_stream **)(k->out + n);
    k->comm = cm;
    AO_fetch_and_add1(&cm->refs);
    k->kind = kind;
    k->op = op;
    k->root = root;
    k->n = n;
    k->site = site ? *site : (nt_site){0};
    for (int i = 0; i < n; i++) {
        k->in[i] = in[i];
        if (in[i])
            nt__tensor_iref(in[i]);
        k->out[i] = out[i];
        nt__tensor_iref(out[i]);
        k->stream[i] = streams[i];
    }
    return k;
}

/* issue_now, recorded when a capture of several streams is in progress
 * (fusion/graph.h: nt__capture_coll_begin). */
static int issue(const nt_site *site, nt__coll_kind kind, nt_comm *cm, nt_tensor *const *in,
                 nt_tensor **out, int op, int root)
{
    bool grouped = false;
    if (nt__capturing() && cm && cm->magic == COMM_MAGIC) {
        int rc = nt__capture_coll_begin(site, kind_api(kind), cm->nproc, &grouped);
        if (rc) {
            for (int i = 0; out && i < cm->n; i++)
                out[i] = NULL;
            return rc;
        }
    }
    if (!grouped)
        return issue_now(site, kind, cm, in, out, op, root);
    int rc = issue_now(site, kind, cm, in, out, op, root);
    ccap *k = NULL;
    if (!rc) {
        nt_stream *st[MAX_CORES];
        int n = cm->n < MAX_CORES ? cm->n : MAX_CORES;
        for (int i = 0; i < n; i++)
            st[i] = member_stream(cm->dev[i]);
        k = cm->n <= MAX_CORES ? ccap_new(site, kind, cm, in, out, op, root, st) : NULL;
    }
    /* (issued but not recorded: n < 0 fails the capture) */
    nt__capture_coll_end(k, &ccap_ops, in, out, k ? cm->n : rc ? 0 : -1);
    return rc;
}

int nt_all_reduce_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, nt_tensor **out,
                     nt_reduce_op op)
{
    return issue(site, NT__COLL_ALL_REDUCE, c, in, out, (int)op, 0);
}
int nt_all_gather_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, nt_tensor **out)
{
    return issue(site, NT__COLL_ALL_GATHER, c, in, out, 0, 0);
}
int nt_reduce_scatter_at(const nt_site *site, nt_comm *c, nt_tensor *const *in,
                         nt_tensor **out, nt_reduce_op op)
{
    return issue(site, NT__COLL_REDUCE_SCATTER, c, in, out, (int)op, 0);
}
int nt_broadcast_at(const nt_site *site, nt_comm *c, nt_tensor *const *in, nt_tensor **out,
                    int root)
{
    return issue(site, NT__COLL_BROADCAST, c, in, out, 0, root);
}

#undef nt_all_reduce
#undef nt_all_gather
#undef nt_reduce_scatter
#undef nt_broadcast
NT_API int nt_all_reduce(nt_comm *c, nt_tensor *const *in, nt_tensor **out, nt_reduce_op op)
{
    return nt_all_reduce_at(NT_RA_SITE, c, in, out, op);
}
NT_API int nt_all_gather(nt_comm *c, nt_tensor *const *in, nt_tensor **out)
{
    return nt_all_gather_at(NT_RA_SITE, c, in, out);
}
NT_API int nt_reduce_scatter(nt_comm *c, nt_tensor *const *in, nt_tensor **out, nt_reduce_op op)
{
    return nt_reduce_scatter_at(NT_RA_SITE, c, in, out, op);
}
NT_API int nt_broadcast(nt_comm *c, nt_tensor *const *in, nt_tensor **out, int root)
{
    return nt_broadcast_at(NT_RA_SITE, c, in, out, root);
}
