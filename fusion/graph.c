/* fusion/graph.c - captured programs: the recording, its compilation (the
 * static memory plan) and the replay (fusion/graph.h says how they fit;
 * docs/graphs.md what a user may rely on).
 *
 * The recording names tensors by what they are, not by pointer: a storage
 * by its id (a storage freed during the capture may have its header reused
 * by another), a view by its handle's id.  External storages (made before
 * the capture, or kept by someone after it) are referenced from the moment
 * the recording first sees them; the capture's own intermediates are not,
 * so the capture run frees them as an eager step would, and the runtime
 * tells the capture when one dies (nt__graph_storage_dead).  At the end,
 * an intermediate that died is planned: given an offset in the plan's
 * block, shared with every other whose lifetime (first to last step that
 * touches it) does not overlap. */
#include "fusion/graph.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/handle.h"
#include "core/hooks.h"
#include "debug/debug.h"
#include "sim/sim.h"
#include "fusion/fusion.h"
#include "streams/stream.h"

#define GRAPH_MAGIC 0x47524150u /* "GRAP" */
#define CAP_SLOTS 256           /* st->cap is a uint8_t; 0 = none */
#define NAME_MAX_LEN 63
#define PLAN_ALIGN 256          /* every planned buffer starts on this */

/* ---------------- the recording ---------------- */

typedef struct gstore {
    uint64_t id;
    nt__storage *st;     /* the capture's: referenced when external (held) */
    size_t nbytes;
    uint8_t dev;
    bool fresh;          /* made by a recorded op (a fresh output) */
    bool madehere;       /* made while capturing (st->cap), by whatever */
    bool held;           /* the recording holds a reference on st */
    bool written;        /* some step writes it */
    bool read_first;     /* some step reads it before any step writes it */
    bool dead;           /* freed before the capture ended */
    bool planned;
    bool grouped;        /* written by an earlier part of a capture of several streams
                            (a segment, a collective): the group keeps it, not the user */
    int first, last;     /* steps touching it */
    int64_t off;         /* planned: offset in the block */
    int input;           /* index into inputs, or -1 */
    nt__storage *nst;    /* the replay's storage */
    nt_site site;        /* where a handle on it was made */
    uint64_t tid;        /* that handle's id, for messages */
} gstore;

typedef struct gten {
    uint64_t hid;        /* the capture's handle id */
    int s;               /* its gstore */
    uint8_t dtype;
    int8_t ndim;
    int64_t offset;
    int64_t shape[NT_MAX_DIMS], stride[NT_MAX_DIMS];
    nt_site site;
    nt_tensor *h;        /* the replay's handle (internal reference) */
} gten;

enum { STEP_REC = 0, STEP_GROUP = 1 };

typedef struct gstep {
    uint8_t kind;
    bool joined;         /* shares the previous step's kernel (nt__fjoined) */
    int rec0, nrecs;     /* into recs */
    int t0, nin, nout;   /* into tix: nin operand slots then nout results */
    nt__fprog *prog;     /* STEP_GROUP: the graph's own copy */
    nt__fgroup grp;      /* STEP_GROUP: bound at compile */
} gstep;

typedef struct gpatch {
    uint64_t seq;        /* the record's seq at capture */
    int opid;            /* the op it waits for (pending) */
    int rec;             /* its copy (compile) */
    int step, op;        /* the group step and op holding the same scalar, or -1 */
    nt__patch_fn fn;
    void *ctx;
    int role, field;
} gpatch;

typedef struct ghook {
    void (*fn)(void *ctx, int64_t arg);
    void *ctx;
    int64_t arg;
    void (*release)(void *ctx);
    int (*check)(void *ctx, const nt_site *site); /* nt__capture_on_check's (fn NULL) */
} ghook;

typedef struct gleaf {
    nt_tensor *leaf;     /* held (internal reference) */
    const nt__leaf_access *acc;
    nt__storage *start;  /* the .grad's storage at the capture's start (referenced), or NULL */
    nt_tensor *end;      /* the .grad the step left (a user reference), or NULL */
} gleaf;

typedef struct ginput {
    char name[NAME_MAX_LEN + 1];
    uint64_t sid;        /* the captured storage's id */
    nt_tensor *cap;      /* the captured tensor: the program reads it (a user reference) */
    nt_tensor *t;        /* the tensor bound to it: copied into cap before each replay when
                            it is another (a user reference; cap itself until bound) */
    int s;               /* gstore, or -1: the program does not read it */
} ginput;

/* What the host side notes of a step: the inputs the user names, the
 * leaves whose .grad a replay checks and restores, the hooks a replay runs.
 * A capture's, or a capture of several streams' for all its segments. */
typedef struct gnotes {
    ginput *inputs;
    int ninputs, capinputs;
    gleaf *leaves;
    int nleaves, capleaves;
    ghook *hooks;
    int nhooks, caphooks;
} gnotes;

/* An open-addressing map from 64-bit ids to small indices. */
typedef struct idmap {
    uint64_t *key;
    int *val;
    size_t cap, n;
} idmap;

typedef struct ggroup ggroup;

struct nt__capture {
    int slot;                /* in caps[] and st->cap */
    ggroup *grp;             /* the capture of several streams it is a segment of, or NULL */
    nt_stream *stream;
    GThread *owner;
    nt_site site;            /* nt_graph_capture_begin's */
    uint64_t seq0;           /* the first seq the capture drew */
    uint64_t serial;         /* nt__capture_serial: unique per capture */
    int paused;              /* nt__capture_pause depth */
    /* pending for the next record of this thread */
    bool patch_pending;
    gpatch pend;
    /* what the worker records */
    gstep *steps;
    int nsteps, capsteps;
    nt__rec *recs;
    int nrecs, caprecs;
    int *tix;
    int ntix, captix;
    gten *tens;
    int ntens, captens;
    gstore *stores;
    int nstores, capstores;
    idmap tmap, smap;
    /* what the host records */
    gpatch *patches;
    int npatches, cappatches;
    gnotes notes;            /* (a segment's: its inputs only; its group keeps the rest) */
    /* the first reason the capture cannot become a program (host memory, a
     * refused call, an unsupported record): reported by capture_end */
    int err;
    char msg[512];
    /* storages made here that died (any thread, under lock) */
    GMutex lock;
    uint64_t *dead;
    size_t ndead, capdead;
};

struct nt_graph {
    NT__HOBJ_HEAD;           /* core/handle.h: the runtime it was made in; its
                                memory outlives it */
    struct nt_graph *live_prev, *live_next; /* every graph the runtime has (caps_lock) */
    nt_stream *stream;
    uint32_t sid;
    int dev;
    GMutex lock;             /* replays serialise */
    uint64_t seq0, nseq;     /* the capture's seqs: a replay draws nseq */
    gstep *steps;
    int nsteps;
    nt__rec *recs;
    int nrecs;
    int *tix;
    gten *tens;
    int ntens;
    gstore *stores;
    int nstores;
    gpatch *patches;
    int npatches, cappatches;
    ghook *hooks;
    int nhooks;
    gleaf *leaves;
    int nleaves;
    ginput *inputs;
    int ninputs;
    nt_tensor *block;        /* the plan's memory (a tensor of u8) */
    nt_graph_info info;
    bool on_sim;             /* some kernel runs on the simulator: one program */
    bool snap_ok;            /* snap holds the program's timing */
    bool prog_timed;         /* the replay running now times its program */
    nt__sim_prog_snap snap;
    volatile AO_t replays;
    /* a capture of several streams (nt_graph_capture_begin_multi): its parts
     * in the recorded order (stream is NULL; inputs, leaves and hooks are
     * the group's) */
    struct gitem *items;
    int nitems;
    bool multi;
};

/* A part of a capture of several streams: one stream's program (a
 * segment), or a collective (dist's record). */
typedef struct gitem {
    nt_graph *seg;
    void *coll;
    const nt__capture_coll_ops *ops;
    nt_tensor **uin;     /* a collective's inputs the user's program owns (internal
                            references): a replay checks they are alive */
    int nuin;
} gitem;

/* A capture of several streams in progress (the capturing thread's). */
struct ggroup {
    nt_site site;            /* nt_graph_capture_begin_multi's */
    uint64_t serial;         /* nt__capture_serial of every segment */
    gitem *items;
    int nitems, capitems;
    gnotes notes;            /* all its segments' (an input's s: the item of the segment
                                that reads it first, or -1) */
    idmap made;              /* storages written by the parts so far */
    int err;
    char msg[512];
};

typedef struct greplay {
    nt_graph *g;
    uint64_t seq0;
    uint64_t *pv;            /* a value per patch */
    nt_tensor **bound;       /* per input: the tensor to copy into it first (an internal
                                reference), or NULL */
    nt_site site;            /* nt_graph_replay's */
} greplay;

/* nt_stats' graph counters: written by workers at the end of a replay,
 * read by nt_stats_get (the fixed-point sums keep the totals exact in any
 * order, like the simulator's). */
static struct {
    GMutex lock;
    uint64_t replays, ops, kernels, hbm, plan;
    double sim, ideal, busy[NT_ENGINE_COUNT];
} gst;

static nt__capture *caps[CAP_SLOTS];
static GMutex caps_lock;
static nt_graph *live_graphs; /* caps_lock */
_Thread_local nt__capture *nt__tl_capture NT_TLS_HOT;
#define tl_cap nt__tl_capture
static _Thread_local ggroup *tl_grp;

/* ---------------- small containers ---------------- */

static bool grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return true;
    int n = *cap ? *cap * 2 : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

static size_t id_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static bool idmap_grow(idmap *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 256;
    uint64_t *k = calloc(ncap, sizeof *k);
    int *v = malloc(ncap * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->key[i]) {
            size_t j = id_hash(m->key[i]) & (ncap - 1);
            while (k[j])
                j = (j + 1) & (ncap - 1);
            k[j] = m->key[i];
            v[j] = m->val[i];
        }
    free(m->key);
    free(m->val);
    m->key = k;
    m->val = v;
    m->cap = ncap;
    return true;
}

/* The index of id (ids are never 0), or -1. */
static int idmap_get(const idmap *m, uint64_t id)
{
    if (!m->cap)
        return -1;
    size_t j = id_hash(id) & (m->cap - 1);
    while (m->key[j]) {
        if (m->key[j] == id)
            return m->val[j];
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

static bool idmap_put(idmap *m, uint64_t id, int v)
{
    if ((m->n + 1) * 2 > m->cap && !idmap_grow(m))
        return false;
    size_t j = id_hash(id) & (m->cap - 1);
    while (m->key[j] && m->key[j] != id)
        j = (j + 1) & (m->cap - 1);
    if (!m->key[j])
        m->n++;
    m->key[j] = id;
    m->val[j] = v;
    return true;
}

static void idmap_free(idmap *m)
{
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* The capture cannot become a program: keeps the first reason. */
static void cap_fail(nt__capture *c, int code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static void cap_fail(nt__capture *c, int code, const char *fmt, ...)
{
    if (c->err)
        return;
    c->err = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
}

/* ---------------- recording (the thread running the kernels) ---------------- */

/* The gstore of t's storage, made on first sight.  fresh: t is the fresh
 * output of the step being recorded. */
static int store_of(nt__capture *c, nt_tensor *t, bool fresh)
{
    nt__storage *st = t->st;
    int i = idmap_get(&c->smap, st->id);
    if (i >= 0)
        return i;
    if (!grow((void **)&c->stores, &c->capstores, c->nstores + 1, sizeof *c->stores) ||
        !idmap_put(&c->smap, st->id, c->nstores)) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the recording");
        return -1;
    }
    gstore *g = &c->stores[c->nstores];
    memset(g, 0, sizeof *g);
    g->id = st->id;
    g->st = st;
    g->nbytes = st->nbytes;
    g->dev = st->dev;
    g->fresh = fresh;
    g->madehere = st->cap == (uint8_t)c->slot;
    g->first = c->nsteps;
    g->input = -1;
    g->site = t->site;
    g->tid = t->id;
    if (!fresh) {
        /* made before the capture, or outside the program: it outlives
         * the capture run, so the recording keeps it alive */
        nt__storage_ref(st);
        g->held = true;
    }
    return c->nstores++;
}

/* Records operand t of the step being recorded; returns its gten, or -1
 * (NULL operand, or host memory: the capture failed). */
static int ten_of(nt__capture *c, nt_tensor *t, bool write, bool fresh)
{
    if (!t)
        return -1;
    int s = store_of(c, t, fresh);
    if (s < 0)
        return -1;
    gstore *g = &c->stores[s];
    if (write)
        g->written = true;
    else if (!g->written)
        g->read_first = true;
    g->last = c->nsteps;
    int i = idmap_get(&c->tmap, t->id);
    if (i >= 0)
        return i;
    if (!grow((void **)&c->tens, &c->captens, c->ntens + 1, sizeof *c->tens) ||
        !idmap_put(&c->tmap, t->id, c->ntens)) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the recording");
        return -1;
    }
    gten *e = &c->tens[c->ntens];
    memset(e, 0, sizeof *e);
    e->hid = t->id;
    e->s = s;
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    e->offset = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        e->shape[d] = t->shape[d];
        e->stride[d] = t->stride[d];
    }
    e->site = t->site;
    return c->ntens++;
}

/* A new step with room for n operand slots; NULL on host memory. */
static gstep *step_new(nt__capture *c, int kind, int n)
{
    if (!grow((void **)&c->steps, &c->capsteps, c->nsteps + 1, sizeof *c->steps) ||
        !grow((void **)&c->tix, &c->captix, c->ntix + n, sizeof *c->tix)) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the recording");
        return NULL;
    }
    gstep *s = &c->steps[c->nsteps];
    memset(s, 0, sizeof *s);
    s->kind = (uint8_t)kind;
    s->t0 = c->ntix;
    c->ntix += n;
    return s;
}

/* A copy of r for the graph: no tensors (they are bound at compile), no
 * queue links. */
static int rec_copy(nt__capture *c, const nt__rec *r)
{
    if (!grow((void **)&c->recs, &c->caprecs, c->nrecs + 1, sizeof *c->recs)) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the recording");
        return -1;
    }
    nt__rec *q = &c->recs[c->nrecs];
    *q = *r;
    memset(q->in, 0, sizeof q->in);
    memset(q->out, 0, sizeof q->out);
    memset(&q->node, 0, sizeof q->node);
    q->ndeps = 0;
    q->span = 0;
    q->pool_next = NULL;
    return c->nrecs++;
}

void nt__capture_rec(nt__capture *c, const nt__rec *r)
{
    if (c->err)
        return;
    if (r->type == NT_REC_WAIT) {
        cap_fail(c, NT_ESTATE, "a stream wait for an event (nt_stream_wait_event) cannot be "
                               "captured: the program would wait for another stream's work");
        return;
    }
    if (r->type != NT_REC_OP) {
        char where[256];
        nt__site_format(&r->site, where, sizeof where);
        cap_fail(c, NT_ESTATE, "%s at %s cannot be captured: collectives run outside a "
                 "captured program", r->fn ? r->fn : "a collective", where);
        return;
    }
    int nin = r->nin, nout = r->nout;
    gstep *s = step_new(c, STEP_REC, nin + nout);
    if (!s)
        return;
    s->nin = nin;
    s->nout = nout;
    bool fresh = !(r->flags & NT_RECF_INPLACE);
    for (int i = 0; i < nin; i++)
        c->tix[s->t0 + i] = ten_of(c, r->in[i], false, false);
    for (int i = 0; i < nout; i++)
        c->tix[s->t0 + nin + i] = ten_of(c, r->out[i], true, fresh);
    for (int i = 0; i < nout; i++)
        if (r->out[i] && AO_load_acquire(&r->out[i]->st->poison)) {
            char where[256];
            nt__site_format(&r->site, where, sizeof where);
            cap_fail(c, NT_ESTATE, "%s at %s failed in the captured step (its error is "
                     "reported by the next sync on its result)", nt__op_api(r->op), where);
        }
    s->joined = nt__fjoined > 0;
    s->rec0 = rec_copy(c, r);
    s->nrecs = 1;
    if (s->rec0 >= 0)
        c->nsteps++;
}

void nt__capture_group(nt__capture *c, const nt__fgroup *g)
{
    if (c->err)
        return;
    const nt__fprog *p = g->prog;
    gstep *s = step_new(c, STEP_GROUP, p->next + p->nout);
    if (!s)
        return;
    s->nin = p->next;
    s->nout = p->nout;
    s->joined = nt__fjoined > 0;
    s->grp.backend = g->backend;
    s->prog = malloc(sizeof *s->prog);
    if (!s->prog) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the recording");
        return;
    }
    /* The program only: its fields up to the key never change once compiled;
     * the cache's fields after it (key, counts, recency list, hash chain) are
     * the cache's, changed by other workers under its lock -- not read here.
     * A replay never looks the copy up. */
    memset(s->prog, 0, sizeof *s->prog);
    memcpy(s->prog, p, offsetof(nt__fprog, key));
    s->prog->hash = p->hash;
    s->prog->refs = 1;
    for (int k = 0; k < p->next; k++)
        c->tix[s->t0 + k] = ten_of(c, g->ext[k], false, false);
    for (int o = 0; o < p->nout; o++) {
        /* fresh unless the op that defines the stored value wrote in place */
        int v = p->out_val[o];
        bool fresh = true;
        for (int k = 0; k < p->nops && k < g->nrecs; k++)
            if (p->ops[k].out == v)
                fresh = !(g->recs[k]->flags & NT_RECF_INPLACE);
        c->tix[s->t0 + p->next + o] = ten_of(c, g->out[o], true, fresh);
    }
    s->rec0 = c->nrecs;
    for (int k = 0; k < g->nrecs; k++)
        if (rec_copy(c, g->recs[k]) < 0)
            return;
    s->nrecs = g->nrecs;
    c->nsteps++;
}

/* ---------------- the host side of a capture ---------------- */

static int grp_switch(const nt_site *site, const char *fn, nt_stream *s);
static nt_graph *grp_end(const nt_site *site);

int nt__capture_check_stream(const nt_site *site, const char *fn, const nt__stream *s)
{
    nt__capture *c = tl_cap;
    if (c && c->stream != s && c->grp && !AO_load_acquire(&s->capture))
        return grp_switch(site, fn, (nt_stream *)s); /* the next segment */
    if (c && c->stream != s)
        return nt__err(site, NT_ESTATE, fn,
                       "the thread is capturing a program on stream '%s'; an op on stream "
                       "'%s' cannot be part of it",
                       c->stream->name, s->name);
    if (!c && AO_load_acquire(&s->capture))
        return nt__err(site, NT_ESTATE, fn,
                       "stream '%s' is being captured by another thread (nt_graph_capture_begin)",
                       s->name);
    return 0;
}

void nt__capture_note(nt__rec *r)
{
    nt__capture *c = tl_cap;
    if (!c)
        return;
    if (c->paused) {
        r->flags |= NT_RECF_NOCAPTURE;
        c->patch_pending = false;
        return;
    }
    if (c->patch_pending && r->type == NT_REC_OP && r->op == c->pend.opid) {
        c->patch_pending = false;
        if (!grow((void **)&c->patches, &c->cappatches, c->npatches + 1, sizeof *c->patches)) {
            cap_fail(c, NT_EHOSTMEM, "out of host memory for the capture's patches");
            return;
        }
        gpatch *p = &c->patches[c->npatches++];
        *p = c->pend;
        p->seq = r->seq;
    }
}

int nt__capture_refuse(const nt_site *site, const char *fn)
{
    nt__capture *c = tl_cap;
    if (!c)
        return 0;
    char where[256];
    nt__site_format(&c->site, where, sizeof where);
    int rc = nt__err(site, NT_ESTATE, fn,
                     "cannot read the device while capturing a program (nt_graph_capture_begin "
                     "at %s): a replay would not stop here; read after nt_graph_capture_end",
                     where);
    cap_fail(c, NT_ESTATE, "%s", nt_last_error_message());
    return rc;
}

void nt__capture_pause(void)
{
    nt__capture *c = tl_cap;
    if (c && c->paused++ == 0)
        nt__tl_cap = 0; /* what it makes now is not the program's */
}

void nt__capture_resume(void)
{
    nt__capture *c = tl_cap;
    if (c && c->paused > 0 && --c->paused == 0)
        nt__tl_cap = (uint8_t)c->slot;
}

void nt__capture_patch_next(nt__patch_fn fn, void *ctx, int role, int field, int op)
{
    nt__capture *c = tl_cap;
    if (!c || c->paused)
        return;
    c->patch_pending = true;
    c->pend = (gpatch){.fn = fn, .ctx = ctx, .role = role, .field = field, .rec = -1,
                       .step = -1, .op = -1, .opid = op};
}

void nt__capture_fail(int code, const char *fmt, ...)
{
    nt__capture *c = tl_cap;
    if (!c || c->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    cap_fail(c, code, "%s", m);
}

/* Where capture c keeps its notes: a capture of several streams keeps them
 * for all its segments (a hook runs once a replay; the leaves are checked
 * and restored once a replay, as the whole step leaves them). */
static gnotes *notes_of(nt__capture *c) { return c->grp ? &c->grp->notes : &c->notes; }

void nt__capture_on_replay(void (*fn)(void *ctx, int64_t arg), void *ctx, int64_t arg,
                           void (*retain)(void *ctx), void (*release)(void *ctx))
{
    nt__capture *c = tl_cap;
    if (!c || c->paused)
        return;
    gnotes *n = notes_of(c);
    for (int i = 0; i < n->nhooks; i++)
        if (n->hooks[i].fn == fn && fn && n->hooks[i].ctx == ctx) {
            n->hooks[i].arg = arg;
            return;
        }
    if (!grow((void **)&n->hooks, &n->caphooks, n->nhooks + 1, sizeof *n->hooks)) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the capture's hooks");
        return;
    }
    if (retain)
        retain(ctx);
    n->hooks[n->nhooks++] = (ghook){fn, ctx, arg, release, NULL};
}

void nt__capture_on_check(int (*check)(void *ctx, const nt_site *site), void *ctx,
                          void (*retain)(void *ctx), void (*release)(void *ctx))
{
    nt__capture *c = tl_cap;
    if (!c || c->paused)
        return;
    gnotes *n = notes_of(c);
    for (int i = 0; i < n->nhooks; i++)
        if (n->hooks[i].check == check && n->hooks[i].ctx == ctx)
            return;
    if (!grow((void **)&n->hooks, &n->caphooks, n->nhooks + 1, sizeof *n->hooks)) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the capture's hooks");
        return;
    }
    if (retain)
        retain(ctx);
    n->hooks[n->nhooks++] = (ghook){NULL, ctx, 0, release, check};
}

uint64_t nt__capture_serial(void) { return tl_cap ? tl_cap->serial : 0; } /* a group's: one */

static void hooks_release(ghook *h, int n)
{
    for (int i = 0; i < n; i++)
        if (h[i].release)
            h[i].release(h[i].ctx);
}

void nt__capture_note_leaf(nt_tensor *leaf, const nt__leaf_access *acc)
{
    nt__capture *c = tl_cap;
    if (!c || c->paused)
        return;
    gnotes *n = notes_of(c);
    for (int i = 0; i < n->nleaves; i++)
        if (n->leaves[i].leaf == leaf)
            return;
    if (!grow((void **)&n->leaves, &n->capleaves, n->nleaves + 1, sizeof *n->leaves)) {
        cap_fail(c, NT_EHOSTMEM, "out of host memory for the capture's leaves");
        return;
    }
    nt__tensor_iref(leaf);
    nt_tensor *gr = acc->grad_of(leaf);
    if (gr)
        nt__storage_ref(gr->st);
    n->leaves[n->nleaves++] = (gleaf){leaf, acc, gr ? gr->st : NULL, NULL};
}

void nt__graph_storage_dead(const nt__storage *st)
{
    g_mutex_lock(&caps_lock);
    nt__capture *c = caps[st->cap];
    if (c) {
        g_mutex_lock(&c->lock);
        if (c->ndead == c->capdead) {
            size_t n = c->capdead ? c->capdead * 2 : 1024;
            uint64_t *d = realloc(c->dead, n * sizeof *d);
            if (d) {
                c->dead = d;
                c->capdead = n;
            }
        }
        if (c->ndead < c->capdead)
            c->dead[c->ndead++] = st->id;
        else
            cap_fail(c, NT_EHOSTMEM, "out of host memory for the capture's list of freed "
                                     "intermediates");
        g_mutex_unlock(&c->lock);
    }
    g_mutex_unlock(&caps_lock);
}

static void leaf_drop(gleaf *l)
{
    if (l->start)
        nt__storage_unref(l->start);
    if (l->end)
        nt_release(l->end);
    nt__tensor_iunref(l->leaf);
}

/* Drops what notes n hold (the references, the lists). */
static void notes_free(gnotes *n)
{
    for (int i = 0; i < n->nleaves; i++)
        leaf_drop(&n->leaves[i]);
    for (int i = 0; i < n->ninputs; i++) {
        nt_release(n->inputs[i].t);
        nt_release(n->inputs[i].cap);
    }
    hooks_release(n->hooks, n->nhooks);
    free(n->hooks);
    free(n->leaves);
    free(n->inputs);
}

static void capture_free(nt__capture *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nstores; i++)
        if (c->stores[i].held)
            nt__storage_unref(c->stores[i].st);
    for (int i = 0; i < c->nsteps; i++)
        free(c->steps[i].prog);
    notes_free(&c->notes);
    free(c->steps);
    free(c->recs);
    free(c->tix);
    free(c->tens);
    free(c->stores);
    free(c->patches);
    free(c->dead);
    idmap_free(&c->tmap);
    idmap_free(&c->smap);
    g_mutex_clear(&c->lock);
    free(c);
}

static bool graph_ok(const nt_site *site, const char *fn, nt_graph *g)
{
    /* NT_ESTATE for a graph made before the last nt_shutdown */
    return nt__hobj_check(g, GRAPH_MAGIC, site, fn, "g", "graph") == 0;
}

/* A capture of stream s for the calling thread (which captures none now):
 * the capture, or NULL with the error set (naming fn). */
static nt__capture *capture_open(const nt_site *site, const char *fn, nt_stream *s)
{
    if (AO_load_acquire(&s->capture)) {
        nt__err(site, NT_ESTATE, fn, "stream '%s' is being captured by another thread",
                s->name);
        return NULL;
    }
    nt__capture *c = calloc(1, sizeof *c);
    if (!c) {
        nt__err_hostmem(site, fn, "a capture");
        return NULL;
    }
    g_mutex_init(&c->lock);
    g_mutex_lock(&caps_lock);
    for (int i = 1; i < CAP_SLOTS && !c->slot; i++)
        if (!caps[i]) {
            caps[i] = c;
            c->slot = i;
        }
    g_mutex_unlock(&caps_lock);
    if (!c->slot) {
        capture_free(c);
        nt__err(site, NT_ESTATE, fn, "%d captures are in progress already", CAP_SLOTS - 1);
        return NULL;
    }
    /* Everything queued before is not the program's: run it first. */
    nt__stream_drain(s);
    c->stream = s;
    c->owner = g_thread_self();
    c->site = site ? *site : (nt_site){0};
    c->seq0 = nt__stream_last_seq(s) + 1;
    static AO_t serials;
    c->serial = (uint64_t)AO_fetch_and_add1(&serials) + 1;
    AO_store_release(&s->capture, (AO_t)c);
    tl_cap = c;
    nt__tl_cap = (uint8_t)c->slot;
    return c;
}

/* Ends the calling thread's capture: its step has run, its stream is free. */
static nt__capture *capture_close(void)
{
    nt__capture *c = tl_cap;
    /* The step runs now, planned whole; then the stream is ours again. */
    nt__stream_drain(c->stream);
    AO_store_release(&c->stream->capture, 0);
    tl_cap = NULL;
    nt__tl_cap = 0;
    g_mutex_lock(&caps_lock);
    caps[c->slot] = NULL;
    g_mutex_unlock(&caps_lock);
    return c;
}

/* The error of fn called while the thread captures (captures do not nest). */
static int nested_error(const nt_site *site, const char *fn)
{
    char where[256];
    nt__site_format(tl_grp ? &tl_grp->site : &tl_cap->site, where, sizeof where);
    return nt__err(site, NT_ESTATE, fn,
                   "the thread is capturing a program already (since %s); captures do not nest",
                   where);
}

NT_API int nt_graph_capture_begin_at(const nt_site *site)
{
    const char *fn = "nt_graph_capture_begin";
    if (!nt__ensure_init())
        return nt_last_error();
    if (tl_cap || tl_grp)
        return nested_error(site, fn);
    return capture_open(site, fn, nt__stream_current()) ? 0 : nt_last_error();
}
NT_API int nt_graph_capture_begin(void) { return nt_graph_capture_begin_at(NT_RA_SITE); }

/* Names t as an input in a list of inputs (a capture's or a group's):
 * nt_graph_input's checks, then the entry (its item `s` -1: not read yet). */
static int input_add(const nt_site *site, gnotes *n, nt_tensor *t, const char *name)
{
    const char *fn = "nt_graph_input";
    size_t len = name ? strlen(name) : 0;
    if (!name || len == 0 || len > NAME_MAX_LEN)
        return nt__err(site, NT_EINVAL, fn, "argument 'name' is %s; expected 1 to %d characters",
                       name ? "too long or empty" : "NULL", NAME_MAX_LEN);
    for (int i = 0; i < n->ninputs; i++) {
        if (!strcmp(n->inputs[i].name, name))
            return nt__err(site, NT_EINVAL, fn, "argument 'name' (\"%s\") names an input already",
                           name);
        if (n->inputs[i].sid == t->st->id)
            return nt__err(site, NT_EINVAL, fn, "argument 't' is (a view of) input \"%s\" already",
                           n->inputs[i].name);
    }
    if (!grow((void **)&n->inputs, &n->capinputs, n->ninputs + 1, sizeof *n->inputs))
        return nt__err_hostmem(site, fn, "an input");
    ginput *in = &n->inputs[n->ninputs++];
    memset(in, 0, sizeof *in);
    memcpy(in->name, name, len + 1);
    in->sid = t->st->id;
    in->cap = nt_retain(t);
    in->t = nt_retain(t);
    in->s = -1;
    return 0;
}

NT_API int nt_graph_input_at(const nt_site *site, nt_tensor *t, const char *name)
{
    const char *fn = "nt_graph_input";
    if (!nt__ensure_init() || !nt__check_arg(site, fn, "t", t))
        return nt_last_error();
    nt__capture *c = tl_cap;
    if (!c)
        return nt__err(site, NT_ESTATE, fn, "the thread is not capturing a program "
                                           "(nt_graph_capture_begin)");
    /* a group's: a segment that reads it takes it at its end */
    return input_add(site, notes_of(c), t, name);
}
NT_API int nt_graph_input(nt_tensor *t, const char *name)
{
    return nt_graph_input_at(NT_RA_SITE, t, name);
}

/* ---------------- compiling the recording ---------------- */

static int cmp_size_desc(const void *a, const void *b, void *ctx)
{
    const gstore *s = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    if (s[x].nbytes != s[y].nbytes)
        return s[x].nbytes < s[y].nbytes ? 1 : -1;
    return x - y; /* the same plan every time */
}

static int cmp_off(const void *a, const void *b, void *ctx)
{
    const gstore *s = ctx;
    int64_t x = s[*(const int *)a].off, y = s[*(const int *)b].off;
    return x < y ? -1 : x > y;
}

static size_t align_up(size_t n) { return (n + PLAN_ALIGN - 1) & ~(size_t)(PLAN_ALIGN - 1); }

/* Offsets for the planned storages: biggest first, each at the lowest
 * offset where it overlaps no placed storage whose lifetime overlaps its
 * own (first-fit over the placed ones sorted by offset).  Returns the
 * block's size, or SIZE_MAX on host memory. */
static size_t plan(gstore *st, int n, size_t *naive, int64_t *count)
{
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    int *placed = malloc((size_t)(n ? n : 1) * sizeof *placed);
    if (!order || !placed) {
        free(order);
        free(placed);
        return SIZE_MAX;
    }
    int m = 0;
    *naive = 0;
    for (int i = 0; i < n; i++)
        if (st[i].planned) {
            order[m++] = i;
            *naive += align_up(st[i].nbytes);
        }
    *count = m;
    g_qsort_with_data(order, m, sizeof *order, cmp_size_desc, st);
    size_t top = 0;
    int np = 0;
    for (int k = 0; k < m; k++) {
        gstore *a = &st[order[k]];
        size_t need = align_up(a->nbytes ? a->nbytes : 1);
        size_t off = 0;
        /* placed[] is kept sorted by offset */
        for (int j = 0; j < np; j++) {
            gstore *b = &st[placed[j]];
            if (b->last < a->first || a->last < b->first)
                continue; /* never alive together */
            size_t bo = (size_t)b->off, be = bo + align_up(b->nbytes ? b->nbytes : 1);
            if (off + need <= bo)
                break; /* fits in the gap before b */
            if (be > off)
                off = be;
        }
        a->off = (int64_t)off;
        if (off + need > top)
            top = off + need;
        placed[np++] = order[k];
        g_qsort_with_data(placed, np, sizeof *placed, cmp_off, st);
    }
    free(order);
    free(placed);
    return top;
}

static void graph_free(nt_graph *g);

/* The error (set, returned) for a storage made during the capture from host
 * data that the program reads but no recorded op writes: a replay would read
 * the same bytes again. */
static int baked_error(const nt_site *site, const gstore *s)
{
    char where[256];
    nt__site_format(&s->site, where, sizeof where);
    return nt__err(site, NT_ESTATE, "nt_graph_capture_end",
                   "tensor #%llu (made at %s) was filled from the host during the capture "
                   "and is read by the program: a replay would read the same values again; "
                   "make it before nt_graph_capture_begin, or name it with nt_graph_input and "
                   "bind each step's data with nt_graph_bind",
                   (unsigned long long)s->tid, where);
}

static bool is_dead(nt__capture *c, uint64_t id)
{
    /* c->dead is appended in death order; a linear search per planned
     * candidate would be quadratic, so it is sorted once by the caller */
    size_t lo = 0, hi = c->ndead;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->dead[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->ndead && c->dead[lo] == id;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* compile's steps.  Each returns 0, or -1 with the error set (naming
 * nt_graph_capture_end). */

/* Graph g takes notes n over (n is left empty). */
static void notes_take(nt_graph *g, gnotes *n)
{
    g->inputs = n->inputs;
    g->ninputs = n->ninputs;
    g->leaves = n->leaves;
    g->nleaves = n->nleaves;
    g->hooks = n->hooks;
    g->nhooks = n->nhooks;
    *n = (gnotes){0};
}

/* The graph takes the recording over. */
static void take_recording(nt_graph *g, nt__capture *c)
{
    g->stream = c->stream;
    g->sid = c->stream->id;
    g->dev = c->stream->dev;
    g->seq0 = c->seq0;
    g->nseq = (uint64_t)c->nrecs; /* see renumber() */
#define TAKE(f) (g->f = c->f, c->f = NULL, g->n##f = c->n##f, c->n##f = 0)
    TAKE(steps);
    TAKE(recs);
    TAKE(tens);
    TAKE(stores);
    TAKE(patches);
#undef TAKE
    notes_take(g, &c->notes);
    g->tix = c->tix;
    c->tix = NULL;
    g->cappatches = c->cappatches;
}

/* What the step left in each of g's leaves' .grad (a replay restores it). */
static void leaves_settle(nt_graph *g)
{
    int nl = 0;
    for (int i = 0; i < g->nleaves; i++) {
        gleaf *lf = &g->leaves[i];
        if (!AO_load_full(&lf->leaf->refs)) {
            /* a leaf the user no longer holds (made and dropped inside the
             * step): nobody can see its .grad, nothing to check or restore */
            leaf_drop(lf);
            continue;
        }
        nt_tensor *e = lf->acc->grad_of(lf->leaf);
        lf->end = e ? nt_retain(e) : NULL;
        g->leaves[nl++] = *lf;
    }
    g->nleaves = nl;
}

/* Which storages the plan holds (the intermediates: made by a recorded op,
 * freed before the end), the rest being shared; the inputs; what the step
 * left in each leaf's .grad.  Refuses host data baked in. */
static int classify(const nt_site *site, nt_graph *g, nt__capture *c)
{
    if (c->ndead)
        qsort(c->dead, c->ndead, sizeof *c->dead, cmp_u64);
    leaves_settle(g);
    for (int i = 0; i < g->nstores; i++) {
        gstore *s = &g->stores[i];
        if (s->fresh && is_dead(c, s->id)) {
            s->dead = s->planned = true;
            continue;
        }
        if (!s->held) { /* made by the program and kept by the user (a loss) */
            nt__storage_ref(s->st);
            s->held = true;
        }
    }
    for (int k = 0; k < g->ninputs; k++) {
        ginput *in = &g->inputs[k];
        int s = idmap_get(&c->smap, in->sid);
        in->s = s;
        if (s < 0) /* the program does not touch it: binding it changes nothing */
            continue;
        g->stores[s].input = k;
        g->stores[s].planned = false; /* an input the program made and freed: kept */
    }
    for (int i = 0; i < g->nstores; i++) {
        gstore *s = &g->stores[i];
        s->grouped = c->grp && idmap_get(&c->grp->made, s->id) >= 0;
        if (s->madehere && !s->grouped && !s->fresh && s->read_first && s->input < 0)
            return baked_error(site, s), -1;
    }
    return 0;
}

/* The memory plan: offsets, the block, a borrowed storage per planned
 * intermediate, a handle per recorded tensor. */
static int allocate(const nt_site *site, nt_graph *g)
{
    const char *fn = "nt_graph_capture_end";
    size_t naive = 0;
    int64_t nplanned = 0;
    size_t top = plan(g->stores, g->nstores, &naive, &nplanned);
    if (top == SIZE_MAX)
        return nt__err_hostmem(site, fn, "the memory plan"), -1;
    g->info.plan_bytes = top;
    g->info.naive_bytes = naive;
    g->info.planned = nplanned;
    if (top) {
        nt__alloc_dev = (uint8_t)g->dev;
        g->block = nt__tensor_empty(NT_U8, 1, (int64_t[]){(int64_t)top}, site, fn);
        nt__alloc_dev = 0;
        if (!g->block)
            return -1; /* NT_ENOMEM, naming the size, set */
        if (!nt__storage_materialize(g->block->st))
            return nt__err_hostmem(site, fn, "the memory plan's block"), -1;
    }
    char *base = g->block ? nt__storage_data(g->block->st) : NULL;
    for (int i = 0; i < g->nstores; i++) {
        gstore *s = &g->stores[i];
        if (s->planned) {
            s->nst = nt__storage_borrowed(base + s->off, s->nbytes, g->dev);
            if (!s->nst)
                return nt__err_hostmem(site, fn, "a planned tensor"), -1;
        } else {
            s->nst = s->st;
            nt__storage_ref(s->nst);
        }
    }
    for (int i = 0; i < g->ntens; i++) {
        gten *e = &g->tens[i];
        e->h = nt__tensor_new_internal(g->stores[e->s].nst, (nt_dtype)e->dtype, e->ndim, e->shape,
                                       e->stride, e->offset, &e->site);
        if (!e->h)
            return nt__err_hostmem(site, fn, "a tensor handle"), -1;
    }
    return 0;
}

/* Every step's operands, and the group steps' record lists. */
static int bind_steps(const nt_site *site, nt_graph *g)
{
    for (int k = 0; k < g->nsteps; k++) {
        gstep *s = &g->steps[k];
        if (s->kind == STEP_REC) {
            nt__rec *r = &g->recs[s->rec0];
            for (int i = 0; i < s->nin; i++) {
                int t = g->tix[s->t0 + i];
                r->in[i] = t >= 0 ? g->tens[t].h : NULL;
            }
            for (int i = 0; i < s->nout; i++) {
                int t = g->tix[s->t0 + s->nin + i];
                r->out[i] = t >= 0 ? g->tens[t].h : NULL;
            }
            r->flags &= (uint8_t)~NT_RECF_NOCAPTURE;
            g->on_sim |= r->backend == NT_BACKEND_SIM;
            continue;
        }
        s->grp.prog = s->prog;
        for (int i = 0; i < s->nin; i++)
            s->grp.ext[i] = g->tens[g->tix[s->t0 + i]].h;
        for (int i = 0; i < s->nout; i++)
            s->grp.out[i] = g->tens[g->tix[s->t0 + s->nin + i]].h;
        s->grp.recs = malloc((size_t)s->nrecs * sizeof(nt__rec *));
        if (!s->grp.recs)
            return nt__err_hostmem(site, "nt_graph_capture_end", "a group's records"), -1;
        for (int j = 0; j < s->nrecs; j++)
            s->grp.recs[j] = &g->recs[s->rec0 + j];
        s->grp.nrecs = s->nrecs;
        g->info.fused_ops += s->nrecs;
        g->on_sim |= s->grp.backend == NT_BACKEND_SIM;
    }
    g->info.kernels = g->nsteps;
    for (int k = 0; k < g->nsteps; k++)
        g->info.kernels -= g->steps[k].joined; /* foreach kernels: one each */
    return 0;
}

/* Each patch finds the record copy (and the group's op) holding its
 * scalar; a dropout's backward is a dropout with the forward's seed
 * (autograd reissues it), so a seed patch also covers every dropout op
 * holding the same seed at capture. */
static int place_patches(const nt_site *site, nt_graph *g)
{
    for (int i = 0; i < g->npatches; i++) {
        gpatch *p = &g->patches[i];
        for (int k = 0; k < g->nsteps && p->rec < 0; k++) {
            gstep *s = &g->steps[k];
            for (int j = 0; j < s->nrecs; j++)
                if (g->recs[s->rec0 + j].seq == p->seq) {
                    p->rec = s->rec0 + j;
                    p->step = s->kind == STEP_GROUP ? k : -1;
                    p->op = s->kind == STEP_GROUP ? j : -1;
                    break;
                }
        }
    }
    int n0 = g->npatches;
    for (int i = 0; i < n0; i++) {
        if (g->patches[i].field != NT__PATCH_SEED || g->patches[i].rec < 0)
            continue;
        uint64_t seed = g->recs[g->patches[i].rec].p.seed;
        for (int k = 0; k < g->nsteps; k++) {
            gstep *st = &g->steps[k];
            for (int j = 0; j < st->nrecs; j++) {
                int ri = st->rec0 + j;
                nt__rec *r = &g->recs[ri];
                if (ri == g->patches[i].rec || r->type != NT_REC_OP || r->op != NT_OP_DROPOUT ||
                    r->p.seed != seed)
                    continue;
                if (!grow((void **)&g->patches, &g->cappatches, g->npatches + 1,
                          sizeof *g->patches))
                    return nt__err_hostmem(site, "nt_graph_capture_end", "the program's patches"),
                           -1;
                gpatch q = g->patches[i];
                q.rec = ri;
                q.step = st->kind == STEP_GROUP ? k : -1;
                q.op = st->kind == STEP_GROUP ? j : -1;
                g->patches[g->npatches++] = q;
            }
        }
    }
    return 0;
}

/* Renumbers the records 0, 1, 2... in seq order (from seq0): the seqs drawn
 * meanwhile for what is not the program's (state made on first use) are
 * not drawn by a replay, and a replay's k-th op then holds the k-th of the
 * seqs it draws -- what the same step run op by op after the capture would
 * hold, so random bits keyed by seq (stochastic rounding) match it. */
static int renumber(const nt_site *site, nt_graph *g)
{
    uint64_t *sq = malloc((size_t)(g->nrecs ? g->nrecs : 1) * sizeof *sq);
    if (!sq)
        return nt__err_hostmem(site, "nt_graph_capture_end", "the program's numbering"), -1;
    for (int i = 0; i < g->nrecs; i++)
        sq[i] = g->recs[i].seq;
    qsort(sq, (size_t)g->nrecs, sizeof *sq, cmp_u64);
    for (int i = 0; i < g->nrecs; i++) {
        uint64_t q = g->recs[i].seq;
        size_t lo = 0, hi = (size_t)g->nrecs;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (sq[mid] < q)
                lo = mid + 1;
            else
                hi = mid;
        }
        g->recs[i].seq = g->seq0 + lo;
    }
    free(sq);
    return 0;
}

/* Puts g on the runtime's list of live graphs (nt__graph_shutdown drops the
 * runtime of those left on it; graph_free takes g off). */
static void live_link(nt_graph *g)
{
    g_mutex_lock(&caps_lock);
    g->live_next = live_graphs;
    if (live_graphs)
        live_graphs->live_prev = g;
    live_graphs = g;
    g_mutex_unlock(&caps_lock);
}

/* The graph is whole: its counts, the statistics, the runtime's list. */
static void publish(nt_graph *g)
{
    g->info.ops = g->nrecs;
    for (int i = 0; i < g->nstores; i++)
        g->info.external += !g->stores[i].planned;
    g->info.inputs = g->ninputs;
    g->info.patches = g->npatches;
    g_mutex_lock(&gst.lock);
    if (g->info.plan_bytes > gst.plan)
        gst.plan = g->info.plan_bytes;
    g_mutex_unlock(&gst.lock);
    live_link(g);
    if (NT__CFG(stats_at_exit) || NT__CFG(fusion_log))
        fprintf(stderr,
                "ntensor: graph captured: %lld ops in %lld kernels (%lld fused); memory plan "
                "%.2f MiB for %lld intermediates (%.2f MiB without reuse); %lld shared "
                "tensors, %lld scalars refreshed per replay\n",
                (long long)g->info.ops, (long long)g->info.kernels,
                (long long)g->info.fused_ops, g->info.plan_bytes / 1048576.0,
                (long long)g->info.planned, g->info.naive_bytes / 1048576.0,
                (long long)g->info.external, (long long)g->npatches);
}

/* Turns the recording into a graph; the recording is consumed either way. */
static nt_graph *compile(const nt_site *site, nt__capture *c)
{
    nt_graph *g = nt__hobj_new(sizeof *g, GRAPH_MAGIC);
    if (!g) {
        nt__err_hostmem(site, "nt_graph_capture_end", "a graph");
        capture_free(c);
        return NULL;
    }
    g_mutex_init(&g->lock);
    take_recording(g, c);
    int rc = classify(site, g, c);
    idmap_free(&c->tmap);
    idmap_free(&c->smap);
    if (!rc)
        rc = allocate(site, g);
    if (!rc)
        rc = bind_steps(site, g);
    if (!rc)
        rc = place_patches(site, g); /* before renumbering: patches hold capture seqs */
    if (!rc)
        rc = renumber(site, g);
    capture_free(c);
    if (rc) {
        graph_free(g);
        return NULL;
    }
    publish(g);
    return g;
}

NT_API nt_graph *nt_graph_capture_end_at(const nt_site *site)
{
    const char *fn = "nt_graph_capture_end";
    if (!nt__ensure_init())
        return NULL;
    if (tl_grp)
        return grp_end(site);
    nt__capture *c = tl_cap;
    if (!c) {
        nt__err(site, NT_ESTATE, fn, "the thread is not capturing a program "
                                     "(nt_graph_capture_begin)");
        return NULL;
    }
    capture_close();
    if (!c->err && c->nrecs == 0)
        cap_fail(c, NT_ESTATE, "it recorded no op");
    if (c->err) {
        char where[256];
        nt__site_format(&c->site, where, sizeof where);
        nt__err(site, c->err, fn, "the capture begun at %s cannot be replayed: %s", where, c->msg);
        capture_free(c);
        return NULL;
    }
    return compile(site, c);
}
NT_API nt_graph *nt_graph_capture_end(void) { return nt_graph_capture_end_at(NT_RA_SITE); }

/* ---------------- captures of several streams ---------------- */

static void grp_fail(ggroup *G, int code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static void grp_fail(ggroup *G, int code, const char *fmt, ...)
{
    if (G->err)
        return;
    G->err = code ? code : NT_ESTATE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(G->msg, sizeof G->msg, fmt, ap);
    va_end(ap);
}

/* The parts' references: each segment graph, each collective's record. */
static void items_free(gitem *it, int n)
{
    for (int i = 0; i < n; i++) {
        if (it[i].seg)
            nt_graph_destroy(it[i].seg);
        if (it[i].coll)
            it[i].ops->release(it[i].coll);
        for (int k = 0; k < it[i].nuin; k++)
            nt__tensor_iunref(it[i].uin[k]);
        free(it[i].uin);
    }
    free(it);
}

static void grp_free(ggroup *G)
{
    items_free(G->items, G->nitems);
    notes_free(&G->notes);
    idmap_free(&G->made);
    free(G);
}

/* Ends the segment in progress (if any) and appends its program to the
 * group; an empty segment is dropped.  Errors go to the group. */
static void seg_finish(const nt_site *site, ggroup *G)
{
    nt__capture *c = tl_cap;
    if (!c)
        return;
    capture_close();
    if (c->err || G->err || c->nrecs == 0) {
        if (c->err)
            grp_fail(G, c->err, "%s", c->msg);
        capture_free(c);
        return;
    }
    /* the group's inputs this segment reads first are its inputs */
    for (int k = 0; k < G->notes.ninputs; k++) {
        ginput *gi = &G->notes.inputs[k];
        if (gi->s >= 0 || idmap_get(&c->smap, gi->sid) < 0)
            continue;
        gnotes *n = &c->notes;
        if (!grow((void **)&n->inputs, &n->capinputs, n->ninputs + 1, sizeof *n->inputs)) {
            grp_fail(G, NT_EHOSTMEM, "out of host memory for a segment's inputs");
            capture_free(c);
            return;
        }
        ginput *in = &n->inputs[n->ninputs++];
        *in = *gi;
        in->cap = nt_retain(gi->cap);
        in->t = nt_retain(gi->cap);
        in->s = -1;
        gi->s = G->nitems;
    }
    if (!grow((void **)&G->items, &G->capitems, G->nitems + 1, sizeof *G->items)) {
        grp_fail(G, NT_EHOSTMEM, "out of host memory for the capture's parts");
        capture_free(c);
        return;
    }
    nt_graph *g = compile(site, c); /* consumes c */
    if (!g) {
        grp_fail(G, nt_last_error(), "%s", nt_last_error_message());
        return;
    }
    G->items[G->nitems++] = (gitem){g, NULL, NULL};
    for (int i = 0; i < g->nstores; i++)
        if (g->stores[i].written && !g->stores[i].planned &&
            !idmap_put(&G->made, g->stores[i].id, 1))
            grp_fail(G, NT_EHOSTMEM, "out of host memory for the capture's storages");
}

/* Opens a segment on s for the group (what the last one had pending
 * carried over by the caller). */
static nt__capture *seg_open(const nt_site *site, const char *fn, ggroup *G, nt_stream *s)
{
    nt__capture *c = capture_open(site, fn, s);
    if (!c) {
        grp_fail(G, nt_last_error(), "%s", nt_last_error_message());
        return NULL;
    }
    c->grp = G;
    c->serial = G->serial;
    c->site = G->site;
    return c;
}

static int grp_switch(const nt_site *site, const char *fn, nt_stream *s)
{
    ggroup *G = tl_grp;
    nt__capture *old = tl_cap;
    int paused = old->paused;
    bool pp = old->patch_pending;
    gpatch pend = old->pend;
    seg_finish(site, G);
    nt__capture *c = seg_open(site, fn, G, s);
    if (!c)
        return nt_last_error();
    c->paused = paused; /* state made on first use stays out of the program */
    if (paused)
        nt__tl_cap = 0;
    c->patch_pending = pp;
    c->pend = pend;
    return 0;
}

int nt__capture_coll_begin(const nt_site *site, const char *fn, int processes, bool *grouped)
{
    *grouped = false;
    ggroup *G = tl_grp;
    if (!G || !tl_cap || tl_cap->paused)
        return 0; /* a single-stream capture refuses it when it runs */
    if (processes > 1) {
        char where[256];
        nt__site_format(&G->site, where, sizeof where);
        int rc = nt__err(site, NT_ESTATE, fn,
                         "its communicator spans %d processes, and a capture of several streams "
                         "(nt_graph_capture_begin_multi at %s) replays this process's devices "
                         "only: run this step op by op",
                         processes, where);
        grp_fail(G, NT_ESTATE, "%s", nt_last_error_message());
        return rc;
    }
    seg_finish(site, G);
    *grouped = true;
    return 0;
}

void nt__capture_coll_end(void *rec, const nt__capture_coll_ops *ops, nt_tensor *const *in,
                          nt_tensor *const *out, int n)
{
    ggroup *G = tl_grp;
    if (!G) {
        if (rec)
            ops->release(rec);
        return;
    }
    if (rec && !grow((void **)&G->items, &G->capitems, G->nitems + 1, sizeof *G->items)) {
        grp_fail(G, NT_EHOSTMEM, "out of host memory for the capture's parts");
        ops->release(rec);
        rec = NULL;
    }
    if (!rec && n < 0)
        grp_fail(G, NT_EHOSTMEM, "out of host memory for a captured collective");
    if (rec) {
        gitem *it = &G->items[G->nitems++];
        *it = (gitem){NULL, rec, ops, calloc((size_t)n + 1, sizeof *it->uin), 0};
        if (!it->uin)
            grp_fail(G, NT_EHOSTMEM, "out of host memory for the capture's parts");
        for (int i = 0; i < n && it->uin; i++)
            if (in[i] && idmap_get(&G->made, in[i]->st->id) < 0) {
                nt__tensor_iref(in[i]);
                it->uin[it->nuin++] = in[i];
            }
        for (int i = 0; i < n; i++)
            if (out[i] && !idmap_put(&G->made, out[i]->st->id, 1))
                grp_fail(G, NT_EHOSTMEM, "out of host memory for the capture's storages");
    }
    seg_open(&G->site, "nt_graph_capture_begin_multi", G, nt__stream_current());
}

NT_API int nt_graph_capture_begin_multi_at(const nt_site *site)
{
    const char *fn = "nt_graph_capture_begin_multi";
    if (!nt__ensure_init())
        return nt_last_error();
    if (tl_cap || tl_grp)
        return nested_error(site, fn);
    ggroup *G = calloc(1, sizeof *G);
    if (!G)
        return nt__err_hostmem(site, fn, "a capture");
    G->site = site ? *site : (nt_site){0};
    nt__capture *c = capture_open(site, fn, nt__stream_current());
    if (!c) {
        free(G);
        return nt_last_error();
    }
    c->grp = G;
    G->serial = c->serial;
    tl_grp = G;
    return 0;
}
NT_API int nt_graph_capture_begin_multi(void)
{
    return nt_graph_capture_begin_multi_at(NT_RA_SITE);
}

static nt_graph *grp_end(const nt_site *site)
{
    const char *fn = "nt_graph_capture_end";
    ggroup *G = tl_grp;
    seg_finish(site, G);
    tl_grp = NULL;
    if (!G->err && G->nitems == 0)
        grp_fail(G, NT_ESTATE, "it recorded no op");
    nt_graph *g = G->err ? NULL : nt__hobj_new(sizeof *g, GRAPH_MAGIC);
    if (!g) {
        char where[256];
        nt__site_format(&G->site, where, sizeof where);
        if (G->err)
            nt__err(site, G->err, fn, "the capture begun at %s cannot be replayed: %s", where,
                    G->msg);
        else
            nt__err_hostmem(site, fn, "a graph");
        grp_free(G);
        return NULL;
    }
    g_mutex_init(&g->lock);
    g->multi = true;
    g->dev = -1;
#define TAKE(f) (g->f = G->f, G->f = NULL, g->n##f = G->n##f, G->n##f = 0)
    TAKE(items);
#undef TAKE
    notes_take(g, &G->notes);
    leaves_settle(g); /* what the whole step left in each leaf's .grad */
    for (int i = 0; i < g->nitems; i++) {
        nt_graph *sg = g->items[i].seg;
        if (!sg)
            continue;
        g->info.ops += sg->info.ops;
        g->info.kernels += sg->info.kernels;
        g->info.fused_ops += sg->info.fused_ops;
        g->info.plan_bytes += sg->info.plan_bytes;
        g->info.naive_bytes += sg->info.naive_bytes;
        g->info.planned += sg->info.planned;
        g->info.external += sg->info.external;
        g->info.patches += sg->info.patches;
    }
    g->info.inputs = g->ninputs;
    grp_free(G);
    live_link(g);
    return g;
}

/* ---------------- replay ---------------- */

/* Drops everything g holds of the runtime (handles, storages, the plan's
 * block): at nt_graph_destroy, or at nt_shutdown for a graph still alive
 * (which then keeps only its host-side arrays until destroyed). */
static void graph_release_runtime(nt_graph *g)
{
    for (int i = 0; i < g->ntens; i++)
        if (g->tens[i].h)
            nt__tensor_iunref(g->tens[i].h);
    for (int i = 0; i < g->nstores; i++) {
        if (g->stores[i].nst)
            nt__storage_unref(g->stores[i].nst);
        if (g->stores[i].held)
            nt__storage_unref(g->stores[i].st);
    }
    for (int i = 0; i < g->nleaves; i++)
        leaf_drop(&g->leaves[i]);
    for (int i = 0; i < g->ninputs; i++) {
        if (g->inputs[i].t)
            nt_release(g->inputs[i].t);
        if (g->inputs[i].cap)
            nt_release(g->inputs[i].cap);
    }
    if (g->block)
        nt_release(g->block);
    for (int i = 0; i < g->nitems; i++)
        if (g->items[i].coll) {
            g->items[i].ops->release(g->items[i].coll);
            g->items[i].coll = NULL;
        }
    hooks_release(g->hooks, g->nhooks);
    g->ntens = g->nstores = g->nleaves = g->ninputs = g->nhooks = 0;
    g->block = NULL;
}

static void graph_free(nt_graph *g)
{
    if (!g)
        return;
    g_mutex_lock(&caps_lock);
    if (g->live_prev || g->live_next || live_graphs == g) {
        if (g->live_prev)
            g->live_prev->live_next = g->live_next;
        else
            live_graphs = g->live_next;
        if (g->live_next)
            g->live_next->live_prev = g->live_prev;
    }
    g_mutex_unlock(&caps_lock);
    graph_release_runtime(g);
    items_free(g->items, g->nitems); /* a capture of several streams: its segments */
    for (int k = 0; k < g->nsteps; k++) {
        free(g->steps[k].prog);
        free(g->steps[k].grp.recs);
    }
    free(g->steps);
    free(g->recs);
    free(g->tix);
    free(g->tens);
    free(g->stores);
    free(g->patches);
    free(g->hooks);
    free(g->leaves);
    free(g->inputs);
    g_mutex_clear(&g->lock);
    nt__hobj_free(g); /* a second destroy finds a dead graph */
}

static void set_field(nt__params *p, int field, uint64_t v)
{
    if (field == NT__PATCH_SEED)
        p->seed = v;
    else
        memcpy(&p->f[field], &v, sizeof p->f[field]);
}

static int cmp_range(const void *a, const void *b)
{
    const nt__sim_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Starts the replay's kernels as one simulator program (sim/sim.h): timed
 * the first time (and whenever the timing memo is off or a trace is
 * open), then from the snapshot.  False: run them as separate kernels (the
 * host is out of memory for the ranges: the same values, slower time). */
static bool sim_program_begin(nt_graph *g)
{
    nt__sim_range *r = malloc((size_t)(g->nstores + 1) * sizeof *r);
    if (!r)
        return false;
    int n = 0;
    double after = 0.0;
    if (g->block) {
        uintptr_t lo = (uintptr_t)nt__storage_data(g->block->st);
        r[n++] = (nt__sim_range){lo, lo + g->info.plan_bytes};
    }
    for (int i = 0; i < g->nstores; i++) {
        gstore *e = &g->stores[i];
        if (e->planned)
            continue;
        nt__storage *st = e->nst;
        uintptr_t lo = (uintptr_t)nt__storage_data(st);
        r[n++] = (nt__sim_range){lo, lo + (st->nbytes ? st->nbytes : 1)};
        double ready = nt__storage_ready_get(st);
        if (ready > after)
            after = ready;
    }
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0; /* views of one storage can repeat it; none overlap otherwise */
    for (int i = 0; i < n; i++)
        if (!m || r[i].lo >= r[m - 1].hi)
            r[m++] = r[i];
    bool timed = !g->snap_ok || nt__trace_enabled() || (getenv("NT_SIM_MEMO") &&
                                                         getenv("NT_SIM_MEMO")[0] == '0');
    int rc = nt__sim_program_begin(after, r, m, timed ? NULL : &g->snap);
    free(r);
    g->prog_timed = timed;
    return rc == 0;
}

static void sim_program_end(nt_graph *g)
{
    nt__sim_prog_snap sn;
    double end = nt__sim_program_end(g->prog_timed ? &sn : NULL);
    if (g->prog_timed && !nt__trace_enabled()) {
        g->snap = sn;
        g->snap_ok = true;
    }
    g_mutex_lock(&gst.lock);
    gst.sim += g->snap.makespan_ns;
    gst.ideal += g->snap.tensor_ideal_ns;
    gst.hbm += g->snap.hbm_read_bytes + g->snap.hbm_write_bytes;
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        gst.busy[e] += g->snap.busy_ns[e];
    g_mutex_unlock(&gst.lock);
    /* what it wrote is ready at the program's end */
    for (int i = 0; i < g->nstores; i++) {
        gstore *e = &g->stores[i];
        if (e->written)
            nt__storage_ready_set(e->planned ? e->nst : e->nst, end);
    }
    for (int t = 0; t < g->ntens; t++)
        if (g->stores[g->tens[t].s].written)
            nt__storage_ready_set(g->tens[t].h->st, end);
}

/* Input k's bound tensor copied into the captured one, as nt_copy_into
 * would (one op of the replay, its seq the replay's last, on the graph's
 * backend: on the simulator a kernel of the program, timed like any). */
static void copy_in(nt_graph *g, const greplay *rp, int k)
{
    nt__rec r;
    memset(&r, 0, sizeof r);
    r.type = NT_REC_OP;
    r.op = NT_OP_COPY;
    r.nin = 1;
    r.nout = 1;
    r.flags = NT_RECF_INPLACE;
    r.backend = g->on_sim ? NT_BACKEND_SIM : NT_BACKEND_CPU;
    r.in[0] = rp->bound[k];
    r.out[0] = g->inputs[k].cap;
    r.site = rp->site;
    r.fn = "nt_graph_replay";
    r.stream = g->stream;
    r.sid = g->stream->id;
    r.seq = rp->seq0 + g->nseq - 1;
    nt__exec_rec(&r);
}

/* The replay record's function, on the worker (or inline). */
static void graph_run(void *arg)
{
    greplay *rp = arg;
    nt_graph *g = rp->g;
    for (int i = 0; i < g->npatches; i++) {
        gpatch *p = &g->patches[i];
        if (p->rec >= 0)
            set_field(&g->recs[p->rec].p, p->field, rp->pv[i]);
        if (p->step >= 0)
            set_field(&g->steps[p->step].prog->ops[p->op].p, p->field, rp->pv[i]);
    }
    /* the inputs bound to other tensors: their values into the captured
     * ones (every view of a captured input, the user's too, sees them) */
    for (int k = 0; k < g->ninputs; k++)
        if (rp->bound[k])
            copy_in(g, rp, k);
    /* what the program writes afresh starts clean: an error of an earlier
     * replay is not this one's */
    for (int i = 0; i < g->nstores; i++) {
        gstore *s = &g->stores[i];
        if ((s->planned || (s->fresh && !s->read_first)) && AO_load(&s->nst->poison)) {
            nt__errobj *e = (nt__errobj *)AO_load(&s->nst->poison);
            AO_store(&s->nst->poison, 0);
            nt__errobj_unref(e);
        }
    }
    nt_stream *s = g->stream;
    uint64_t shift = rp->seq0 - g->seq0;
    bool prog = g->on_sim && sim_program_begin(g);
    for (int i = 0; i < g->nrecs; i++) {
        nt__rec *r = &g->recs[i];
        r->stream = s;
        r->sid = s->id;
        r->seq += shift;
    }
    int jn = 0, jb = 0; /* programs of the open shared kernel, its backend */
    for (int k = 0; k < g->nsteps; k++) {
        gstep *st = &g->steps[k];
        if (jn && !st->joined) {
            nt__fusion_join(jb, false, jn);
            jn = 0;
        }
        if (!jn && k + 1 < g->nsteps && g->steps[k + 1].joined) {
            jb = st->kind == STEP_REC ? g->recs[st->rec0].backend : st->grp.backend;
            nt__fusion_join(jb, true, 0);
            jn = 1;
        } else if (jn) {
            jn++;
        }
        if (st->kind == STEP_REC)
            nt__exec_rec(&g->recs[st->rec0]);
        else
            nt__fusion_replay_group(&st->grp);
    }
    if (jn)
        nt__fusion_join(jb, false, jn);
    if (prog)
        sim_program_end(g);
    g_mutex_lock(&gst.lock);
    gst.replays++;
    gst.ops += (uint64_t)g->info.ops;
    gst.kernels += (uint64_t)g->info.kernels;
    g_mutex_unlock(&gst.lock);
    /* back to the capture's numbering, so the next shift is from there */
    for (int i = 0; i < g->nrecs; i++)
        g->recs[i].seq -= shift;
    for (int k = 0; k < g->ninputs; k++)
        if (rp->bound[k])
            nt__tensor_iunref(rp->bound[k]);
    free(rp->pv);
    free(rp->bound);
    free(rp);
}

NT_API int nt_graph_bind_at(const nt_site *site, nt_graph *g, const char *name, nt_tensor *t)
{
    const char *fn = "nt_graph_bind";
    if (!nt__ensure_init() || !graph_ok(site, fn, g) || !nt__check_arg(site, fn, "t", t))
        return nt_last_error();
    if (!name)
        return nt__err(site, NT_EINVAL, fn, "argument 'name' is NULL");
    int k = 0;
    while (k < g->ninputs && strcmp(g->inputs[k].name, name))
        k++;
    if (k == g->ninputs)
        return nt__err(site, NT_EINVAL, fn, "argument 'name' (\"%s\") is not an input of the graph",
                       name);
    if (g->multi && g->inputs[k].s >= 0) { /* the segment that reads it first copies it in */
        g_mutex_lock(&g->lock); /* not while a replay of the group reads the binding */
        int rc = nt_graph_bind_at(site, g->items[g->inputs[k].s].seg, name, t);
        g_mutex_unlock(&g->lock);
        return rc;
    }
    const gten *e = NULL;
    for (int i = 0; i < g->ntens && !e; i++)
        if (g->tens[i].s == g->inputs[k].s)
            e = &g->tens[i];
    nt_tensor *c = g->inputs[k].cap; /* the captured input: the reference */
    char s1[128], s2[128];
    if (t->dtype != c->dtype)
        return nt__err(site, NT_EDTYPE, fn, "input \"%s\" is %s; argument 't' is %s", name,
                       nt_dtype_name((nt_dtype)c->dtype), nt_dtype_name((nt_dtype)t->dtype));
    bool same = t->ndim == c->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = t->shape[d] == c->shape[d] && t->stride[d] == c->stride[d];
    if (!same)
        return nt__err(site, NT_ESHAPE, fn,
                       "input \"%s\" has shape %s (with its strides); argument 't' has shape %s "
                       "or other strides",
                       name, nt__shape_str(c->ndim, c->shape, s1, sizeof s1),
                       nt__shape_str(t->ndim, t->shape, s2, sizeof s2));
    if (t->dev != c->dev)
        return nt__err(site, NT_EINVAL, fn, "argument 't' is on device %d; input \"%s\" on %d",
                       t->dev, name, c->dev);
    if (t->st->nbytes < c->st->nbytes && e)
        return nt__err(site, NT_ESHAPE, fn, "argument 't' views a smaller storage than input "
                                            "\"%s\"", name);
    g_mutex_lock(&g->lock);
    nt_tensor *old = g->inputs[k].t;
    g->inputs[k].t = nt_retain(t);
    g_mutex_unlock(&g->lock);
    /* The captured tensor stays the shape reference through the new one:
     * same dtype, shape and strides. */
    nt_release(old);
    return 0;
}
NT_API int nt_graph_bind(nt_graph *g, const char *name, nt_tensor *t)
{
    return nt_graph_bind_at(NT_RA_SITE, g, name, t);
}

static void add_dep(nt__rec *r, const nt_stream *s, uint64_t packed, bool *overflow)
{
    if (!packed || NT__PACK_SID(packed) == s->id || nt__packed_done(packed))
        return;
    for (int i = 0; i < r->ndeps; i++)
        if (r->deps[i] == packed)
            return;
    if (r->ndeps < (int)G_N_ELEMENTS(r->deps))
        r->deps[r->ndeps++] = packed;
    else
        *overflow = true;
}

/* A replay's error: tensor #id (made at made), which `reader` reads, was
 * released. */
static int released_error(const nt_site *site, uint64_t id, const nt_site *made,
                          const char *reader)
{
    char where[256];
    nt__site_format(made, where, sizeof where);
    return nt__err(site, NT_ERELEASED, "nt_graph_replay",
                   "tensor #%llu (made at %s), which %s reads, was released",
                   (unsigned long long)id, where, reader);
}

/* Checks what the capture assumed, under g->lock; 0 or the error (set). */
static int replay_checks(const nt_site *site, nt_graph *g)
{
    const char *fn = "nt_graph_replay";
    char where[256];
    for (int i = 0; i < g->nstores; i++) {
        gstore *s = &g->stores[i];
        if (s->planned || !s->read_first || s->input >= 0 || s->grouped)
            continue;
        /* something the program reads and the user's program owns */
        if (!AO_load(&s->st->hrefs) && !s->fresh)
            return released_error(site, s->tid, &s->site, "the captured program");
    }
    for (int k = 0; k < g->ninputs; k++) {
        nt_tensor *t = g->inputs[k].t;
        if (t->magic != NT__MAGIC_LIVE || !AO_load(&t->refs))
            return nt__err(site, NT_ERELEASED, fn, "input \"%s\" was released",
                           g->inputs[k].name);
    }
    for (int i = 0; i < g->nleaves; i++) {
        gleaf *lf = &g->leaves[i];
        nt_tensor *gr = lf->acc->grad_of(lf->leaf);
        if ((gr ? gr->st : NULL) == lf->start)
            continue;
        nt__site_format(&lf->leaf->site, where, sizeof where);
        if (!lf->start)
            return nt__err(site, NT_ESTATE, fn,
                           "the parameter made at %s has a gradient now; when the program was "
                           "captured it had none, and the program starts it: zero the gradients "
                           "(nt_optim_zero_grad) before replaying, or in the captured step",
                           where);
        return nt__err(site, NT_ESTATE, fn,
                       "the parameter made at %s has %s gradient now than when the program was "
                       "captured, and the program adds to that one: keep the gradient the "
                       "captured step left, or capture again",
                       where, gr ? "another" : "no");
    }
    for (int i = 0; i < g->nhooks; i++) {
        int rc = g->hooks[i].check ? g->hooks[i].check(g->hooks[i].ctx, site) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

/* A prepared replay (or the part of one replay_prep made) that is not
 * queued: nothing is bound to it yet (replay_enqueue binds). */
static void replay_unprep(greplay *rp, nt__rec *r)
{
    if (r)
        nt__rec_unalloc(r);
    if (!rp)
        return;
    free(rp->pv);
    free(rp->bound);
    free(rp);
}

/* A replay's allocations (nothing queued yet): 0, or the error (set). */
static int replay_prep(const nt_site *site, nt_graph *g, greplay **rpo, nt__rec **ro)
{
    greplay *rp = calloc(1, sizeof *rp);
    if (rp) {
        rp->pv = calloc((size_t)g->npatches + 1, sizeof *rp->pv);
        rp->bound = calloc((size_t)g->ninputs + 1, sizeof *rp->bound);
    }
    nt__rec *r = nt__rec_alloc(g->stream);
    if (!rp || !rp->pv || !rp->bound || !r) {
        replay_unprep(rp, r);
        return nt__err_hostmem(site, "nt_graph_replay", "a replay");
    }
    rp->g = g;
    *rpo = rp;
    *ro = r;
    return 0;
}

/* The scalars this step would have (all computed before any hook moves a
 * counter). */
static void replay_scalars(nt_graph *g, greplay *rp)
{
    for (int i = 0; i < g->npatches; i++)
        rp->pv[i] = g->patches[i].fn(g->patches[i].ctx, g->patches[i].role);
}

/* Then the counters, and the leaves' .grads as the step leaves them (the
 * program rewrites them; reading one waits for the replay like any op's
 * result). */
static void replay_hooks(nt_graph *g)
{
    for (int i = 0; i < g->nhooks; i++)
        if (g->hooks[i].fn)
            g->hooks[i].fn(g->hooks[i].ctx, g->hooks[i].arg);
    for (int i = 0; i < g->nleaves; i++) {
        gleaf *lf = &g->leaves[i];
        if (lf->acc->grad_of(lf->leaf) != lf->end)
            lf->acc->set_grad(lf->leaf, lf->end);
    }
}

/* Queues the prepared replay on stream s (consumes rp and r). */
static void replay_enqueue(const nt_site *site, nt_graph *g, nt_stream *s, greplay *rp,
                           nt__rec *r)
{
    r->type = NT_REC_HOST;
    r->host_fn = graph_run;
    r->host_arg = rp;
    r->site = site ? *site : (nt_site){0};
    r->fn = "nt_graph_replay";
    rp->site = r->site;
    bool overflow = false;
    for (int k = 0; k < g->ninputs; k++) {
        nt_tensor *t = g->inputs[k].t;
        if (t == g->inputs[k].cap) /* (an input the program never reads is copied too:
                                       a view of it the user kept reads it) */
            continue;
        nt__tensor_iref(t);
        rp->bound[k] = t;
        add_dep(r, s, AO_load(&t->st->last_write), &overflow);
    }
    for (int i = 0; i < g->nstores; i++) {
        gstore *e = &g->stores[i];
        if (e->planned)
            continue;
        add_dep(r, s, AO_load(&e->st->last_write), &overflow);
        if (e->written)
            add_dep(r, s, AO_load(&e->st->last_read), &overflow);
    }
    if (overflow) /* more streams than a record can wait for: wait here */
        for (int i = 0; i < g->nstores; i++)
            if (!g->stores[i].planned) {
                nt__wait_packed(AO_load(&g->stores[i].st->last_write));
                nt__wait_packed(AO_load(&g->stores[i].st->last_read));
            }
    uint64_t seq0 = nt__stream_next_seqs(&s, (uint32_t)g->nseq);
    rp->seq0 = seq0;
    r->seq = seq0;
    r->sid = s->id;
    r->span = (uint32_t)g->nseq;
    uint64_t packed = NT__PACK(s->id, seq0 + g->nseq - 1);
    for (int k = 0; k < g->ninputs; k++)
        if (rp->bound[k]) {
            AO_store(&rp->bound[k]->st->last_read, packed);
            AO_fetch_and_add1(&g->inputs[k].cap->st->version);
            AO_store_release(&g->inputs[k].cap->st->last_write, packed);
        }
    for (int i = 0; i < g->nstores; i++) {
        gstore *e = &g->stores[i];
        if (e->planned)
            continue;
        nt__storage *st = e->st;
        if (e->written) {
            AO_fetch_and_add1(&st->version);
            AO_store_release(&st->last_write, packed);
        } else {
            AO_store(&st->last_read, packed);
        }
    }
    AO_fetch_and_add1(&g->replays);
    NT__COUNT(ops_enqueued, 1);
    if (NT__CFG(mode) == NT_MODE_DETERMINISTIC) {
        for (int d = 0; d < r->ndeps; d++)
            nt__wait_packed(r->deps[d]);
        nt__stream_run_inline(s, r);
    } else {
        nt__stream_enqueue(s, r);
    }
}

static int seq_check(const nt_site *site, const nt_graph *g)
{
    if (g->nseq == 0 || g->nseq > UINT32_MAX)
        return nt__err(site, NT_ESTATE, "nt_graph_replay",
                       "the graph holds %llu ops; a replay holds 1 to %u",
                       (unsigned long long)g->nseq, UINT32_MAX);
    return 0;
}

/* A capture of several streams: every part's checks, then every part's
 * allocations, then every segment's scalars, then the hooks, then the parts
 * queued in the recorded order -- each segment on its stream, each
 * collective on its members' streams, as the step op by op queues them. */
static int grp_replay(const nt_site *site, nt_graph *g)
{
    g_mutex_lock(&g->lock);
    int n = g->nitems, rc = replay_checks(site, g);
    for (int i = 0; i < n && !rc; i++) {
        gitem *it = &g->items[i];
        if (it->seg) {
            rc = seq_check(site, it->seg);
            if (!rc)
                rc = replay_checks(site, it->seg);
        }
        for (int k = 0; k < it->nuin && !rc; k++)
            if (!AO_load(&it->uin[k]->st->hrefs))
                rc = released_error(site, it->uin[k]->id, &it->uin[k]->site,
                                    "a captured collective");
    }
    greplay **rps = rc ? NULL : calloc((size_t)n, sizeof *rps);
    nt__rec **rs = rc ? NULL : calloc((size_t)n, sizeof *rs);
    void **preps = rc ? NULL : calloc((size_t)n, sizeof *preps);
    if (!rc && (!rps || !rs || !preps))
        rc = nt__err_hostmem(site, "nt_graph_replay", "a replay");
    for (int i = 0; i < n && !rc; i++) {
        gitem *it = &g->items[i];
        if (it->seg)
            rc = replay_prep(site, it->seg, &rps[i], &rs[i]);
        else if (!(preps[i] = it->ops->prepare(it->coll, site)))
            rc = nt__err_or(NT_EHOSTMEM);
    }
    if (rc) {
        for (int i = 0; i < n && rps && rs && preps; i++) {
            if (rps[i])
                replay_unprep(rps[i], rs[i]);
            if (preps[i])
                g->items[i].ops->discard(preps[i]);
        }
    } else {
        for (int i = 0; i < n; i++)
            if (g->items[i].seg)
                replay_scalars(g->items[i].seg, rps[i]);
        replay_hooks(g);
        for (int i = 0; i < n; i++) {
            gitem *it = &g->items[i];
            if (it->seg)
                replay_enqueue(site, it->seg, it->seg->stream, rps[i], rs[i]);
            else
                it->ops->issue(it->coll, preps[i]);
        }
        AO_fetch_and_add1(&g->replays);
    }
    g_mutex_unlock(&g->lock);
    free(rps);
    free(rs);
    free(preps);
    if (!rc)
        nt__htrace_step();
    return rc;
}

NT_API int nt_graph_replay_at(const nt_site *site, nt_graph *g)
{
    const char *fn = "nt_graph_replay";
    if (!nt__ensure_init() || !graph_ok(site, fn, g))
        return nt_last_error();
    if (tl_cap || tl_grp)
        return nt__err(site, NT_ESTATE, fn, "the thread is capturing a program; a replay cannot "
                                           "be part of another capture");
    if (g->multi)
        return grp_replay(site, g);
    nt_stream *s = nt__stream_current();
    if (s != g->stream)
        return nt__err(site, NT_EINVAL, fn,
                       "the graph was captured on stream '%s'; the thread's current stream is "
                       "'%s' (nt_stream_set_current)",
                       g->stream->name, s->name);
    int rc = seq_check(site, g);
    if (rc)
        return rc;
    g_mutex_lock(&g->lock);
    rc = replay_checks(site, g);
    greplay *rp = NULL;
    nt__rec *r = NULL;
    if (!rc)
        rc = replay_prep(site, g, &rp, &r);
    if (!rc) {
        replay_scalars(g, rp);
        replay_hooks(g);
        replay_enqueue(site, g, s, rp, r);
    }
    g_mutex_unlock(&g->lock);
    if (!rc)
        nt__htrace_step(); /* a replay is a step of NT_TRACE_STEPS */
    return rc;
}
NT_API int nt_graph_replay(nt_graph *g) { return nt_graph_replay_at(NT_RA_SITE, g); }

NT_API int nt_graph_info_get(nt_graph *g, nt_graph_info *out)
{
    const char *fn = "nt_graph_info_get";
    if (!nt__ensure_init() || !graph_ok(NULL, fn, g))
        return nt_last_error();
    if (!out)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'out' is NULL");
    *out = g->info;
    out->replays = (int64_t)AO_load(&g->replays);
    return 0;
}

NT_API void nt_graph_destroy(nt_graph *g)
{
    if (!g)
        return;
    if (!nt__hobj_live(g, GRAPH_MAGIC)) { /* the error: destroyed already, ... */
        nt__hobj_check(g, GRAPH_MAGIC, NULL, "nt_graph_destroy", "g", "graph");
        return;
    }
    if (nt__hobj_current(g) && g->stream)
        nt__stream_drain(g->stream); /* queued replays read it (a capture of several
                                        streams: each segment drains its own) */
    graph_free(g);
}

int nt__graph_check_plan(const nt_graph *g, char *why, size_t n)
{
    for (int i = 0; i < g->nitems; i++)
        if (g->items[i].seg && nt__graph_check_plan(g->items[i].seg, why, n))
            return -1;
    if (g->multi)
        return 0; /* its segments hold the plans */
    size_t sum = 0;
    for (int i = 0; i < g->nstores; i++) {
        const gstore *a = &g->stores[i];
        if (!a->planned)
            continue;
        sum += align_up(a->nbytes ? a->nbytes : 1);
        if (a->off < 0 || (uint64_t)a->off + a->nbytes > g->info.plan_bytes) {
            snprintf(why, n, "storage #%d [%lld, +%zu) leaves the %llu-byte block", i,
                     (long long)a->off, a->nbytes, (unsigned long long)g->info.plan_bytes);
            return -1;
        }
        for (int j = i + 1; j < g->nstores; j++) {
            const gstore *b = &g->stores[j];
            if (!b->planned || b->last < a->first || a->last < b->first)
                continue;
            if (a->off < b->off + (int64_t)b->nbytes && b->off < a->off + (int64_t)a->nbytes) {
                snprintf(why, n, "storages #%d (steps %d-%d) and #%d (steps %d-%d) overlap", i,
                         a->first, a->last, j, b->first, b->last);
                return -1;
            }
        }
    }
    if (g->info.plan_bytes > sum) {
        snprintf(why, n, "the block (%llu bytes) is bigger than its storages together (%zu)",
                 (unsigned long long)g->info.plan_bytes, sum);
        return -1;
    }
    return 0;
}

void nt__graph_stats(nt_stats *out)
{
    g_mutex_lock(&gst.lock);
    uint64_t plan = gst.plan;
    out->graph_replays = gst.replays;
    out->graph_ops_replayed = gst.ops;
    out->graph_kernels_replayed = gst.kernels;
    out->graph_plan_bytes = plan;
    out->graph_sim_ns = (uint64_t)gst.sim;
    out->graph_sim_hbm_bytes = gst.hbm;
    out->graph_sim_ideal_ns = gst.ideal;
    for (int e = 0; e < NT_ENGINE_COUNT && e < 5; e++)
        out->graph_sim_busy_ns[e] = gst.busy[e];
    g_mutex_unlock(&gst.lock);
}

void nt__graph_stats_reset(void)
{
    g_mutex_lock(&gst.lock);
    gst.replays = gst.ops = gst.kernels = gst.hbm = gst.plan = 0;
    gst.sim = gst.ideal = 0;
    memset(gst.busy, 0, sizeof gst.busy);
    g_mutex_unlock(&gst.lock);
}

/* ---------------- the capture cache ---------------- */

#define CACHE_MAGIC 0x47434348u /* "GCCH" */
#define CACHE_MAX 64

typedef struct centry {
    nt_graph *g;
    nt_tensor **outs;      /* the graph's outputs (references of the cache) */
    uint64_t used;         /* the cache's clock at its last run */
    uint8_t dt[NT_F_MAXEXT];
    int8_t nd[NT_F_MAXEXT];
    int64_t shape[NT_F_MAXEXT][NT_MAX_DIMS], stride[NT_F_MAXEXT][NT_MAX_DIMS];
    uint8_t dev[NT_F_MAXEXT];
} centry;

struct nt_graph_cache {
    uint32_t magic;
    nt_graph_fn fn;
    void *ctx;
    int nin, nout, max;
    centry e[CACHE_MAX];
    int n;
    uint64_t clock;
    nt_graph_cache_stats st;
    GMutex lock;
};

NT_API nt_graph_cache *nt_graph_cache_create(nt_graph_fn fn, void *ctx, int nin, int nout,
                                             int max_graphs)
{
    const char *f = "nt_graph_cache_create";
    if (!nt__ensure_init())
        return NULL;
    if (!fn) {
        nt__err(NULL, NT_EINVAL, f, "argument 'fn' is NULL");
        return NULL;
    }
    if (nin < 0 || nin > NT_F_MAXEXT || nout < 0 || nout > 64) {
        nt__err(NULL, NT_EINVAL, f, "nin %d and nout %d: expected 0..%d inputs and 0..64 outputs",
                nin, nout, NT_F_MAXEXT);
        return NULL;
    }
    if (max_graphs < 1 || max_graphs > CACHE_MAX) {
        nt__err(NULL, NT_EINVAL, f, "argument 'max_graphs' is %d; expected 1 to %d", max_graphs,
                CACHE_MAX);
        return NULL;
    }
    nt_graph_cache *c = calloc(1, sizeof *c);
    if (!c) {
        nt__err_hostmem(NULL, f, "a graph cache");
        return NULL;
    }
    c->magic = CACHE_MAGIC;
    c->fn = fn;
    c->ctx = ctx;
    c->nin = nin;
    c->nout = nout;
    c->max = max_graphs;
    g_mutex_init(&c->lock);
    return c;
}

static bool entry_matches(const centry *e, nt_tensor *const *in, int n)
{
    for (int i = 0; i < n; i++) {
        const nt_tensor *t = in[i];
        if (t->dtype != e->dt[i] || t->ndim != e->nd[i] || t->dev != e->dev[i])
            return false;
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] != e->shape[i][d] || t->stride[d] != e->stride[i][d])
                return false;
    }
    return true;
}

static void entry_drop(nt_graph_cache *c, centry *e)
{
    nt_graph_destroy(e->g);
    for (int i = 0; i < c->nout; i++)
        if (e->outs[i])
            nt_release(e->outs[i]);
    free(e->outs);
    memset(e, 0, sizeof *e);
}

static const char *input_name(int i, char *buf)
{
    snprintf(buf, 12, "%d", i);
    return buf;
}

/* A miss: captures fn on the inputs into a new entry (evicting the least
 * recently used when full). */
static int cache_capture(const nt_site *site, nt_graph_cache *c, nt_tensor *const *in,
                         nt_tensor **out)
{
    const char *f = "nt_graph_cache_run";
    centry ne;
    memset(&ne, 0, sizeof ne);
    ne.outs = calloc((size_t)(c->nout ? c->nout : 1), sizeof *ne.outs);
    if (!ne.outs)
        return nt__err_hostmem(site, f, "a cache entry");
    int rc = nt_graph_capture_begin_at(site);
    char nm[12];
    for (int i = 0; !rc && i < c->nin; i++)
        rc = nt_graph_input_at(site, in[i], input_name(i, nm));
    if (!rc)
        rc = c->fn(c->ctx, in, c->nin, ne.outs, c->nout);
    int code = rc ? nt__err_or(rc) : 0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nt_last_error_message());
    if (tl_cap || !rc) { /* end the capture whatever happened */
        ne.g = nt_graph_capture_end_at(site);
        if (!ne.g && !code)
            return free(ne.outs), nt_last_error();
    }
    if (code) {
        nt_graph_destroy(ne.g);
        for (int i = 0; i < c->nout; i++)
            if (ne.outs[i])
                nt_release(ne.outs[i]);
        free(ne.outs);
        return nt__err(site, code, f, "the step failed while captured: %s", msg);
    }
    for (int i = 0; i < c->nin; i++) {
        ne.dt[i] = in[i]->dtype;
        ne.nd[i] = in[i]->ndim;
        ne.dev[i] = in[i]->dev;
        for (int d = 0; d < in[i]->ndim; d++) {
            ne.shape[i][d] = in[i]->shape[d];
            ne.stride[i][d] = in[i]->stride[d];
        }
    }
    for (int i = 0; i < c->nout; i++) {
        if (ne.outs[i])
            nt_keep(ne.outs[i]); /* the cache's, out of the caller's scope */
        out[i] = ne.outs[i] ? nt_retain(ne.outs[i]) : NULL;
        if (out[i])
            nt__scope_adopt(out[i], f);
    }
    int slot = c->n;
    if (c->n == c->max) { /* evict the least recently used */
        slot = 0;
        for (int k = 1; k < c->n; k++)
            if (c->e[k].used < c->e[slot].used)
                slot = k;
        entry_drop(c, &c->e[slot]);
        c->st.evictions++;
    } else {
        c->n++;
    }
    ne.used = ++c->clock;
    c->e[slot] = ne;
    c->st.captures++;
    return 0;
}

NT_API int nt_graph_cache_run_at(const nt_site *site, nt_graph_cache *c, nt_tensor *const *in,
                                 nt_tensor **out)
{
    const char *f = "nt_graph_cache_run";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!c || c->magic != CACHE_MAGIC)
        return nt__err(site, NT_EINVAL, f, "argument 'c' is %s", c ? "not a live graph cache"
                                                                    : "NULL");
    if ((c->nin && !in) || (c->nout && !out))
        return nt__err(site, NT_EINVAL, f, "argument '%s' is NULL", !out ? "outputs" : "inputs");
    for (int i = 0; i < c->nout; i++)
        out[i] = NULL;
    char arg[32];
    for (int i = 0; i < c->nin; i++) {
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        if (!nt__check_arg(site, f, arg, in[i]))
            return nt_last_error();
    }
    g_mutex_lock(&c->lock);
    int rc = 0, hit = -1;
    nt_stream *s = nt__stream_current();
    for (int k = 0; k < c->n && hit < 0; k++)
        if (c->e[k].g->stream == s && entry_matches(&c->e[k], in, c->nin))
            hit = k;
    if (hit < 0) {
        rc = cache_capture(site, c, in, out);
    } else {
        centry *e = &c->e[hit];
        char nm[12];
        for (int i = 0; !rc && i < c->nin; i++)
            rc = nt_graph_bind_at(site, e->g, input_name(i, nm), in[i]);
        if (!rc)
            rc = nt_graph_replay_at(site, e->g);
        if (!rc) {
            e->used = ++c->clock;
            c->st.replays++;
            for (int i = 0; i < c->nout; i++)
                out[i] = e->outs[i] ? nt__scope_adopt(nt_retain(e->outs[i]), f) : NULL;
        }
    }
    c->st.graphs = c->n;
    g_mutex_unlock(&c->lock);
    return rc;
}
NT_API int nt_graph_cache_run(nt_graph_cache *c, nt_tensor *const *in, nt_tensor **out)
{
    return nt_graph_cache_run_at(NT_RA_SITE, c, in, out);
}

NT_API int nt_graph_cache_stats_get(nt_graph_cache *c, nt_graph_cache_stats *out)
{
    if (!c || c->magic != CACHE_MAGIC || !out)
        return nt__err(NULL, NT_EINVAL, "nt_graph_cache_stats_get", "argument '%s' is %s",
                       !out ? "out" : "c", !out ? "NULL" : "not a live graph cache");
    g_mutex_lock(&c->lock);
    *out = c->st;
    g_mutex_unlock(&c->lock);
    return 0;
}

NT_API void nt_graph_cache_destroy(nt_graph_cache *c)
{
    if (!c || c->magic != CACHE_MAGIC)
        return;
    c->magic = 0;
    for (int k = 0; k < c->n; k++)
        entry_drop(c, &c->e[k]);
    g_mutex_clear(&c->lock);
    free(c);
}

/* ---------------- set-up ---------------- */

void nt__graph_init(void) { nt__graph_stats_reset(); }

void nt__graph_shutdown(void)
{
    /* Graphs made before are dead from now on (their handles and storages
     * go with the runtime's pools; nt__epoch moves on after those). */
    nt__capture *c = tl_cap;
    if (c) {
        tl_cap = NULL;
        nt__tl_cap = 0;
    }
    g_mutex_lock(&caps_lock);
    for (int i = 0; i < CAP_SLOTS; i++)
        caps[i] = NULL;
    nt_graph *live = live_graphs;
    live_graphs = NULL;
    for (nt_graph *g = live; g; g = g->live_next)
        g->live_prev = NULL;
    g_mutex_unlock(&caps_lock);
    for (nt_graph *g = live, *n; g; g = n) {
        n = g->live_next;
        g->live_next = NULL;
        graph_release_runtime(g);
    }
    if (c) /* its stream went with the others: only the recording is left */
        capture_free(c);
    ggroup *G = tl_grp;
    tl_grp = NULL;
    if (G) { /* a capture of several streams in progress: its segments are dead graphs */
        for (int i = 0; i < G->nitems; i++)
            if (G->items[i].seg) {
                graph_free(G->items[i].seg);
                G->items[i].seg = NULL;
            }
        grp_free(G);
    }
}
