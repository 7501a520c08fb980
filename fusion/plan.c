/* fusion/plan.c - grouping a batch into fused kernels, liveness, the kernel
 * cache and the fusion log.  See fusion.h.
 *
 * The planner is one pass over the batch: each record either joins the open
 * group or closes it (with a reason the log reports) and starts the next.
 * Cost per record is bounded by the group limits, so planning is linear in
 * the batch size. */
#include "fusion.h"

#include <string.h>

#include "streams/stream.h"

nt__fstats nt__fst;
int (*nt__fused_sim)(const nt__fgroup *g);

/* The kernel cache: signature -> program, least recently used evicted past
 * NT_F_CACHE_MAX entries.  Programs are refcounted so an eviction cannot
 * free one a worker is running. */
#define NT_F_CACHE_MAX 4096
static GMutex cache_lock;
static GHashTable *cache;
static GQueue lru = G_QUEUE_INIT;
static volatile AO_t evictions;

static void prog_unref(nt__fprog *c)
{
    if (c && AO_fetch_and_sub1(&c->refs) == 1) {
        g_free(c->sig);
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
    if (r->op != NT_OP_SUM && r->op != NT_OP_MAX && r->op != NT_OP_MEAN)
        return false;
    const nt_tensor *x = r->in[0];
    return x->ndim >= 1 && r->p.dim == x->ndim - 1 && r->p.flag &&
           nt__dtype_is_float((nt_dtype)x->dtype) && x->shape[x->ndim - 1] > 1;
}

/* ---------------- views as keys ---------------- */

static bool same_view(const nt_tensor *a, const nt_tensor *b)
{
    if (a == b)
        return true;
    if (a->st != b->st || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i])
            return false;
    return true;
}

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

typedef struct {
    bool open;
    nt__fprog p;
    nt__fgroup g;
    nt_tensor *val_t[NT_F_MAXVALS];   /* the tensor (view) each value stands for */
    bool val_inplace[NT_F_MAXVALS];
    int first;                        /* index of the first record in the batch */
    int64_t red_shape[NT_MAX_DIMS];   /* ROW: [..., 1] */
    int nfull;                        /* ROW: values with a whole row each */
} gstate;

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
        if (s->val_t[v] && same_view(s->val_t[v], t))
            return v;
    return -1;
}

static bool storage_written(gstate *s, const nt__storage *st)
{
    for (int v = 0; v < s->p.nvals; v++)
        if (s->val_t[v] && s->val_t[v]->st == st)
            return true;
    return false;
}

static int find_or_add_ext(gstate *s, nt_tensor *t)
{
    for (int k = 0; k < s->p.next; k++)
        if (same_view(s->g.ext[k], t))
            return k;
    if (s->p.next >= NT_F_MAXEXT)
        return -1;
    int k = s->p.next++;
    s->g.ext[k] = t;
    s->p.ext[k].dtype = t->dtype;
    s->p.ext[k].red = 0;
    if (s->p.kind == NT_FK_ROW) {
        /* constant along the row: usable where a per-row value is */
        int64_t st[NT_MAX_DIMS];
        nt__bcast_strides(t, s->p.ndim, s->p.shape, st);
        s->p.ext[k].red = st[s->p.ndim - 1] == 0;
    }
    return k;
}

/* Resolves input t of a record to an operand; -128 on a hazard. */
#define NT_F_HAZARD (-128)
static int operand(gstate *s, nt_tensor *t)
{
    int v = find_val(s, t);
    if (v >= 0)
        return v;
    if (storage_written(s, t->st))
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
    memset(s->val_inplace, 0, sizeof s->val_inplace);
    s->open = true;
    s->first = first;
    s->nfull = 0;
    s->g.recs = recs + first;
    s->g.nrecs = 0;
    s->g.backend = backend;
}

/* Tries to append record r; returns NULL on success or the reason why not. */
static const char *try_add(gstate *s, nt__rec *r, char *why, size_t whylen)
{
    nt_tensor *o = r->out[0];
    bool inplace = r->flags & NT_RECF_INPLACE;
    bool ew = nt__fusable_ew(r->op);
    bool red = is_row_reduce(r);
    bool mm = r->op == NT_OP_MATMUL && !inplace;
    if (s->g.nrecs == 0) {
        /* first record: it decides the kind and the iteration shape */
        if (mm) {
            s->p.kind = NT_FK_MM;
        } else if (red) {
            s->p.kind = NT_FK_ROW;
        } else {
            s->p.kind = NT_FK_EW;
        }
        const nt_tensor *shp = red ? r->in[0] : o;
        s->p.ndim = shp->ndim;
        for (int i = 0; i < shp->ndim; i++)
            s->p.shape[i] = shp->shape[i];
        if (red) {
            for (int i = 0; i < shp->ndim; i++)
                s->red_shape[i] = shp->shape[i];
            s->red_shape[shp->ndim - 1] = 1;
        }
    } else {
        if (r->backend != s->g.backend)
            return "backend change";
        if (mm)
            return "a matmul starts its own kernel";
        if (!ew && !red)
            return reason_buf(why, whylen, "%s is not fusable", nt__op_name(r->op));
        if (s->g.nrecs >= NT_F_MAXOPS)
            return "kernel op limit";
        if (red) {
            if (s->p.kind == NT_FK_MM)
                return "a reduction after a matmul epilogue";
            if (!shape_is(r->in[0], s->p.ndim, s->p.shape))
                return "shape change";
            if (s->p.kind == NT_FK_EW) {
                /* the EW group becomes a row group over the same shape */
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
            }
        } else if (s->p.kind == NT_FK_ROW) {
            if (!shape_is(o, s->p.ndim, s->p.shape) && !shape_is(o, s->p.ndim, s->red_shape))
                return "shape change";
        } else if (!shape_is(o, s->p.ndim, s->p.shape)) {
            return "shape change";
        }
    }
    if (!ew && !red && !mm)
        return reason_buf(why, whylen, "%s is not fusable", nt__op_name(r->op));
    if (s->p.nvals >= NT_F_MAXVALS)
        return "kernel value limit";

    /* operands */
    nt__fop op;
    memset(&op, 0, sizeof op);
    op.op = r->op;
    op.nin = r->nin;
    op.p = r->p;
    int nexts = s->p.next;
    for (int i = 0; i < r->nin; i++) {
        if (!r->in[i]) {
            op.a[i] = 0;
            continue;
        }
        int a = operand(s, r->in[i]);
        if (a <= NT_F_HAZARD) {
            s->p.next = nexts;
            return a == NT_F_HAZARD ? "reads another view of a value the kernel writes"
                                    : "kernel input limit";
        }
        op.a[i] = (int8_t)a;
    }
    /* ROW: an op with a per-row result may only use per-row operands */
    bool out_red = false;
    if (s->p.kind == NT_FK_ROW) {
        out_red = red || shape_is(o, s->p.ndim, s->red_shape);
        if (out_red && !red)
            for (int i = 0; i < r->nin; i++)
                if (r->in[i] && !operand_red(s, op.a[i])) {
                    s->p.next = nexts;
                    return "shape change";
                }
        if (!out_red && (s->nfull + 1) * s->p.shape[s->p.ndim - 1] * 4 > NT_F_ROW_BYTES) {
            s->p.next = nexts;
            return "SBUF capacity";
        }
    }
    /* in place: only element-aligned with every read of the same storage */
    if (inplace) {
        for (int k = 0; k < s->p.next; k++)
            if (s->g.ext[k]->st == o->st && !same_view(s->g.ext[k], o)) {
                s->p.next = nexts;
                return "in-place write to another view of a kernel input";
            }
        for (int v = 0; v < s->p.nvals; v++)
            if (s->val_t[v] && s->val_t[v]->st == o->st && !same_view(s->val_t[v], o)) {
                s->p.next = nexts;
                return "in-place write to another view of a kernel value";
            }
    }
    int v = s->p.nvals++;
    op.out = (int8_t)v;
    s->p.vals[v].dtype = o->dtype;
    s->p.vals[v].red = out_red;
    s->p.vals[v].store = -1;
    if (s->p.kind == NT_FK_ROW && !out_red)
        s->nfull++;
    /* an earlier value of the same view (an in-place chain) is superseded */
    int prev = find_val(s, o);
    if (prev >= 0)
        s->val_t[prev] = NULL;
    s->val_t[v] = o;
    s->val_inplace[v] = inplace;
    s->p.ops[s->p.nops++] = op;
    s->g.nrecs++;
    return NULL;
}

/* How many input slots of the group's records hold t. */
static int slots_in_group(const gstate *s, const nt_tensor *t)
{
    int n = 0;
    for (int k = 0; k < s->g.nrecs; k++) {
        const nt__rec *r = s->g.recs[k];
        for (int i = 0; i < r->nin; i++)
            n += r->in[i] == t;
        for (int i = 0; i < r->nout; i++)
            n += r->out[i] == t;
    }
    return n;
}

/* Can anything outside the group read t after it?  (See fusion.h.) */
static bool live_after(const gstate *s, nt_tensor *t, bool inplace, const char **why)
{
    if (inplace) {
        *why = "in-place destination";
        return true;
    }
    if (AO_load_full(&t->refs) > 0) {
        *why = "live user handle";
        return true;
    }
    if (AO_load_full(&t->st->refs) > 1) {
        *why = "another handle on its storage (a view, or saved for backward)";
        return true;
    }
    if ((int)AO_load_full(&t->irefs) > slots_in_group(s, t)) {
        *why = "read by a later kernel";
        return true;
    }
    return false;
}

/* ---------------- signatures and the cache ---------------- */

static char *signature(const nt__fprog *p)
{
    GString *g = g_string_sized_new(256);
    g_string_append_printf(g, "%d|", p->kind);
    for (int i = 0; i < p->ndim; i++)
        g_string_append_printf(g, "%lld,", (long long)p->shape[i]);
    g_string_append_c(g, '|');
    for (int k = 0; k < p->nops; k++) {
        const nt__fop *o = &p->ops[k];
        g_string_append_printf(g, "%u(%d,%d,%d)>%d", o->op, o->a[0], o->a[1], o->a[2], o->out);
        /* parameters, by bits */
        g_string_append_printf(g, "[%a,%a,%d,%d,%lld]", o->p.f[0], o->p.f[1], o->p.dim, o->p.flag,
                               (long long)o->p.i[0]);
    }
    g_string_append_c(g, '|');
    for (int v = 0; v < p->nvals; v++)
        g_string_append_printf(g, "%u%c%d,", p->vals[v].dtype, p->vals[v].red ? 'r' : 'f',
                               p->vals[v].store);
    g_string_append_c(g, '|');
    for (int k = 0; k < p->next; k++)
        g_string_append_printf(g, "%u%c,", p->ext[k].dtype, p->ext[k].red ? 'r' : 'f');
    return g_string_free(g, FALSE);
}

/* Looks the program up by signature (or caches this one); the caller owns
 * one reference. */
static nt__fprog *compile(const nt__fprog *p, bool *hit)
{
    char *sig = signature(p);
    g_mutex_lock(&cache_lock);
    nt__fprog *c = g_hash_table_lookup(cache, sig);
    if (c) {
        *hit = true;
        g_free(sig);
        g_queue_unlink(&lru, c->lru);
        g_queue_push_head_link(&lru, c->lru);
    } else {
        *hit = false;
        c = g_new(nt__fprog, 1);
        *c = *p;
        c->sig = sig;
        c->runs = 0;
        c->refs = 1; /* the cache's */
        g_queue_push_head(&lru, c);
        c->lru = lru.head;
        g_hash_table_insert(cache, c->sig, c);
        while (lru.length > NT_F_CACHE_MAX) {
            nt__fprog *old = g_queue_pop_tail(&lru);
            g_hash_table_remove(cache, old->sig);
            AO_fetch_and_add1(&evictions);
            prog_unref(old);
        }
    }
    AO_fetch_and_add1(&c->refs);
    g_mutex_unlock(&cache_lock);
    return c;
}

/* ---------------- the log ---------------- */

static void log_site(GString *g, const nt__rec *r)
{
    char where[160];
    nt__site_format(&r->site, where, sizeof where);
    g_string_append_printf(g, "%s%s (%s)", r->bwd_of ? "backward:" : "", nt__op_name(r->op), where);
}

static void log_break(const nt__rec *r, const char *reason)
{
    GString *g = g_string_new("fusion: break before ");
    log_site(g, r);
    g_string_append_printf(g, ": %s", reason);
    fprintf(stderr, "ntensor: %s\n", g->str);
    g_string_free(g, TRUE);
}

static const char *kind_name(nt__fkind k)
{
    return k == NT_FK_EW ? "elementwise" : k == NT_FK_ROW ? "row" : "matmul+epilogue";
}

static void log_group(const gstate *s, const nt__fprog *c, bool hit, int stored, int elided,
                      const char *const *why_stored)
{
    GString *g = g_string_new(NULL);
    g_string_append_printf(g, "fusion: kernel #%lu %s, %d ops [", (unsigned long)kernel_no,
                           kind_name(c->kind), s->g.nrecs);
    for (int k = 0; k < s->g.nrecs; k++) {
        if (k)
            g_string_append(g, ", ");
        log_site(g, s->g.recs[k]);
    }
    g_string_append_printf(g, "] reads %d, writes %d, elides %d intermediate%s; cache %s",
                           c->next, stored, elided, elided == 1 ? "" : "s", hit ? "hit" : "miss");
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
        g_string_append_printf(g, "; written out (%s):", why_stored[v]);
        for (int w = v; w < c->nvals; w++)
            if (why_stored[w] == why_stored[v])
                g_string_append_printf(g, " v%d", w);
    }
    fprintf(stderr, "ntensor: %s\n", g->str);
    g_string_free(g, TRUE);
}

/* ---------------- running ---------------- */

/* Planning time excludes kernels: the clock stops around every run. */
static _Thread_local uint64_t plan_t0;
static void plan_pause(void) { AO_fetch_and_add(&nt__fst.plan_ns, (AO_t)(nt__now_ns() - plan_t0)); }
static void plan_resume(void) { plan_t0 = nt__now_ns(); }


static void run_group(gstate *s)
{
    if (!s->open || s->g.nrecs == 0)
        return;
    s->open = false;
    if (s->g.nrecs == 1) {
        plan_pause();
        nt__exec_rec(s->g.recs[0]);
        plan_resume();
        return;
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
        if (live_after(s, t, s->val_inplace[v], &why)) {
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
    s->g.prog = c;
    AO_fetch_and_add1(&c->runs);
    AO_fetch_and_add1(&kernel_no);
    AO_fetch_and_add1(&nt__fst.groups);
    AO_fetch_and_add(&nt__fst.fused_ops, (AO_t)s->g.nrecs);
    AO_fetch_and_add1(hit ? &nt__fst.hits : &nt__fst.misses);
    AO_fetch_and_add(&nt__fst.stored, (AO_t)stored);
    AO_fetch_and_add(&nt__fst.elided, (AO_t)elided);
    if (nt__cfg.fusion_log)
        log_group(s, c, hit, stored, elided, why_stored);

    /* An input already poisoned: run op by op so only its consumers fail. */
    bool poisoned = false;
    for (int k = 0; k < c->next; k++)
        if (AO_load_acquire(&s->g.ext[k]->st->poison))
            poisoned = true;
    int rc = NT_ENOTSUP;
    plan_pause();
    if (!poisoned) {
        if (s->g.backend == NT_BACKEND_SIM && nt__fused_sim)
            rc = nt__fused_sim(&s->g);
        else if (s->g.backend == NT_BACKEND_CPU)
            rc = nt__fused_cpu(&s->g);
    }
    prog_unref(c);
    s->g.prog = NULL;
    if (rc == 0) {
        NT__COUNT(ops_executed, s->g.nrecs);
        NT__COUNT(kernels, 1);
        plan_resume();
        return;
    }
    /* Could not run fused (no executor, or it failed): replay op by op,
     * which names the exact op that fails. */
    for (int k = 0; k < s->g.nrecs; k++)
        nt__exec_rec(s->g.recs[k]);
    plan_resume();
}

void nt__fusion_run(nt__rec **recs, int n)
{
    gstate s;
    s.open = false;
    char why[128];
    plan_resume();
    for (int k = 0; k < n; k++) {
        nt__rec *r = recs[k];
        if (r->type != NT_REC_OP || r->op >= NT_OP_COUNT) {
            run_group(&s);
            plan_pause();
            nt__exec_rec(r);
            plan_resume();
            continue;
        }
        if (s.open) {
            const char *reason = try_add(&s, r, why, sizeof why);
            if (!reason)
                continue;
            AO_fetch_and_add1(&nt__fst.breaks);
            if (nt__cfg.fusion_log)
                log_break(r, reason);
            run_group(&s);
        }
        group_reset(&s, recs, k, r->backend);
        if (try_add(&s, r, why, sizeof why)) { /* cannot even start a group */
            s.open = false;
            plan_pause();
            nt__exec_rec(r);
            plan_resume();
        }
    }
    run_group(&s);
    plan_pause();
    if (n > 0 && nt__cfg.fusion_log)
        fprintf(stderr, "ntensor: fusion: batch of %d ops ends: %s\n", n,
                nt__batch_end_reason ? nt__batch_end_reason : "end of the queued work");
}

/* ---------------- set-up ---------------- */

int nt__fusion_init(void)
{
    g_mutex_lock(&cache_lock);
    if (!cache)
        cache = g_hash_table_new(g_str_hash, g_str_equal);
    g_mutex_unlock(&cache_lock);
    memset(&nt__fst, 0, sizeof nt__fst);
    kernel_no = 0;
    nt__fusion_batch = nt__fusion_run;
    return 0;
}

void nt__fusion_shutdown(void)
{
    g_mutex_lock(&cache_lock);
    if (cache)
        g_hash_table_destroy(cache);
    cache = NULL;
    nt__fprog *c;
    while ((c = g_queue_pop_head(&lru)) != NULL)
        prog_unref(c);
    g_mutex_unlock(&cache_lock);
}

uint64_t nt__fusion_cache_size(void)
{
    g_mutex_lock(&cache_lock);
    uint64_t n = cache ? g_hash_table_size(cache) : 0;
    g_mutex_unlock(&cache_lock);
    return n;
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
}

void nt__fusion_stats_reset(void)
{
    memset((void *)&nt__fst, 0, sizeof nt__fst);
}
