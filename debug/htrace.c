/* debug/htrace.c - the host side of the NT_TRACE file.
 *
 * The simulator writes its engines and DMA queues under the "NeuronCore
 * (simulated)" process (simulated time); this file adds a "host" process
 * with one track per thread (wall-clock time since the trace opened):
 *
 *   user threads   an instant per op enqueued (op or collective, call site,
 *                  seq, the other streams' work it waits for, output),
 *                  a span per sync point (which sync, call site, how long
 *                  it waited and for what)
 *   worker tracks  a span per kernel run (op, call site), a span per fused
 *                  kernel (its ops, values written and elided, cache hit),
 *                  an instant per fusion break (before which op, why)
 *
 * Every function here is called only while nt__trace_enabled(); the trace
 * writer (sim/trace.c) serialises the file. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "debug/debug.h"
#include "streams/stream.h"

static _Thread_local struct {
    unsigned gen; /* trace generation this thread's track was named in */
    int tid;
} tl_track;

/* This thread's track id, named the first time it is used in a trace.
 * `stream` is the stream whose record the thread runs, if any. */
static int track(const nt_stream *stream)
{
    unsigned gen = nt__trace_generation();
    if (tl_track.gen == gen && tl_track.tid)
        return tl_track.tid;
    int tid = (int)syscall(SYS_gettid);
    char name[96], tname[32] = "";
    int sort;
    pthread_getname_np(pthread_self(), tname, sizeof tname);
    if (tid == (int)getpid()) {
        snprintf(name, sizeof name, "main thread");
        sort = 0;
    } else if (stream && pthread_equal(stream->worker, pthread_self())) {
        snprintf(name, sizeof name, "worker of %s", stream->name);
        sort = 100 + (int)stream->id;
    } else {
        snprintf(name, sizeof name, "thread %d%s%s", tid, tname[0] ? " " : "", tname);
        sort = 10;
    }
    nt__trace_thread_name(NT_TRACE_PID_HOST, tid, name, sort);
    tl_track.gen = gen;
    tl_track.tid = tid;
    return tid;
}

const char *nt__rec_label(const nt__rec *r, char *buf, size_t n)
{
    /* a host record (a collective's member) has no op: its call names it */
    const char *api = r->type == NT_REC_OP ? nt__op_api(r->op) : r->fn ? r->fn : "host work";
    if (r->bwd_of)
        snprintf(buf, n, "%s (backward of %s)", api, r->bwd_of);
    else if (r->fn && strcmp(r->fn, api) != 0)
        snprintf(buf, n, "%s (in %s)", api, r->fn);
    else
        snprintf(buf, n, "%s", api);
    return buf;
}

/* Appends "key":"escaped value" (with a leading comma unless first). */
static void jstr(nt__strbuf *g, const char *key, const char *val)
{
    char q[512];
    nt__trace_json_str(q, sizeof q, val);
    nt__sb_printf(g, "%s\"%s\":%s", g->len > 1 ? "," : "", key, q);
}

static void jnum(nt__strbuf *g, const char *key, double v)
{
    nt__sb_printf(g, "%s\"%s\":%.17g", g->len > 1 ? "," : "", key, v);
}

static void jsite(nt__strbuf *g, const nt_site *site)
{
    char where[256];
    nt__site_format(site, where, sizeof where);
    jstr(g, "site", where);
}

void nt__htrace_enqueue(const nt__rec *r, const nt_stream *s)
{
    double ts = nt__htrace_now();
    int tid = track(NULL);
    char label[128], shape[160];
    nt__strbuf g_ = {0}, *g = &g_; /* a failed buffer gives "{}" */
    nt__sb_append(g, "{");
    jsite(g, &r->site);
    jnum(g, "seq", (double)r->seq);
    jstr(g, "stream", s->name);
    if (r->ndeps) {
        /* the work on other streams this op waits for, each once */
        char w[512];
        size_t o = 0;
        w[0] = 0;
        for (int d = 0; d < r->ndeps && o < sizeof w; d++) {
            const nt_stream *ds = nt__stream_by_id(NT__PACK_SID(r->deps[d]));
            o += (size_t)snprintf(w + o, sizeof w - o, "%s%s seq %llu", d ? ", " : "",
                                  ds ? ds->name : "a destroyed stream",
                                  (unsigned long long)NT__PACK_SEQ(r->deps[d]));
        }
        jstr(g, "waits_for", w);
    }
    if (r->out[0]) {
        nt__shape_str(r->out[0]->ndim, r->out[0]->shape, shape, sizeof shape);
        nt__sb_printf(g, ",\"out\":\"t#%llu %s %s\"", (unsigned long long)r->out[0]->id, shape,
                      nt_dtype_name((nt_dtype)r->out[0]->dtype));
    }
    nt__sb_append_c(g, '}');
    nt__trace_instant(NT_TRACE_PID_HOST, tid, nt__rec_label(r, label, sizeof label), ts,
                      nt__sb_str(g, "{}"));
    free(g->str);
}

void nt__htrace_sync(const char *fn, const nt_site *site, uint64_t tensor_id, uint64_t packed,
                     double t0)
{
    double t1 = nt__htrace_now();
    int tid = track(NULL);
    nt__strbuf g_ = {0}, *g = &g_; /* a failed buffer gives "{}" */
    nt__sb_append(g, "{");
    jsite(g, site);
    if (tensor_id)
        nt__sb_printf(g, ",\"tensor\":\"t#%llu\"", (unsigned long long)tensor_id);
    if (packed) {
        nt_stream *s = nt__stream_by_id(NT__PACK_SID(packed));
        char w[96];
        snprintf(w, sizeof w, "%s seq %llu", s ? s->name : "a destroyed stream",
                 (unsigned long long)NT__PACK_SEQ(packed));
        jstr(g, "waited_for", w);
    }
    jnum(g, "wait_us", t1 - t0);
    nt__sb_append_c(g, '}');
    char name[64];
    snprintf(name, sizeof name, "sync: %s", fn);
    nt__trace_complete(NT_TRACE_PID_HOST, tid, name, t0, t1 - t0, nt__sb_str(g, "{}"));
    free(g->str);
}

void nt__htrace_kernel(const nt__rec *r, double t0, int rc)
{
    if (!nt__trace_at(NT__TRACE_KERNEL))
        return;
    double t1 = nt__htrace_now();
    int tid = track(r->stream);
    char label[128];
    nt__strbuf g_ = {0}, *g = &g_; /* a failed buffer gives "{}" */
    nt__sb_append(g, "{");
    jsite(g, &r->site);
    jnum(g, "seq", (double)r->seq);
    jstr(g, "backend", r->backend == NT_BACKEND_SIM ? "sim" : "cpu");
    if (rc < 0)
        jstr(g, "error", nt__kerr_msg());
    nt__sb_append_c(g, '}');
    nt__trace_complete(NT_TRACE_PID_HOST, tid, nt__rec_label(r, label, sizeof label), t0,
                       t1 - t0, nt__sb_str(g, "{}"));
    free(g->str);
}

/* "exp (x.c:5 in main)", as the fusion log names an op. */
static void op_site(const nt__rec *r, char *buf, size_t n)
{
    char where[200], label[128];
    nt__site_format(&r->site, where, sizeof where);
    snprintf(buf, n, "%s (%s)", nt__rec_label(r, label, sizeof label), where);
}

void nt__htrace_fused(const char *kind, unsigned long kernel_no, nt__rec *const *recs, int n,
                      int written, int elided, bool hit, double t0, int rc)
{
    if (!nt__trace_at(NT__TRACE_FUSION))
        return;
    double t1 = nt__htrace_now();
    int tid = track(n ? recs[0]->stream : NULL);
    nt__strbuf g_ = {0}, *g = &g_; /* a failed buffer gives "{}" */
    nt__sb_append(g, "{\"ops\":[");
    for (int k = 0; k < n; k++) {
        char one[400], q[512];
        op_site(recs[k], one, sizeof one);
        nt__trace_json_str(q, sizeof q, one);
        nt__sb_printf(g, "%s%s", k ? "," : "", q);
    }
    nt__sb_printf(g, "],\"written\":%d,\"elided\":%d,\"cache\":\"%s\"", written, elided,
                  hit ? "hit" : "miss");
    if (rc < 0)
        nt__sb_append(g, ",\"result\":\"failed: replayed op by op\"");
    nt__sb_append_c(g, '}');
    char name[96];
    snprintf(name, sizeof name, "fused %s kernel #%lu (%d ops)", kind, kernel_no, n);
    nt__trace_complete(NT_TRACE_PID_HOST, tid, name, t0, t1 - t0, nt__sb_str(g, "{}"));
    free(g->str);
}

void nt__htrace_break(const nt__rec *r, const char *reason)
{
    if (!nt__trace_at(NT__TRACE_FUSION))
        return;
    double ts = nt__htrace_now();
    int tid = track(r->stream);
    char one[400];
    op_site(r, one, sizeof one);
    nt__strbuf g_ = {0}, *g = &g_; /* a failed buffer gives "{}" */
    nt__sb_append(g, "{");
    jstr(g, "before", one);
    jstr(g, "reason", reason);
    nt__sb_append_c(g, '}');
    nt__trace_instant(NT_TRACE_PID_HOST, tid, "fusion break", ts, nt__sb_str(g, "{}"));
    free(g->str);
}

static void drain_one(nt_stream *s, void *arg)
{
    (void)arg;
    nt__stream_drain(s); /* an error stays with the stream for its sync */
}

void nt__htrace_step(void)
{
    if (!nt__trace_is_open())
        return;
    if (nt__trace_step_wants_drain())
        nt__streams_foreach(drain_one, NULL);
    int64_t step = 0, bytes = nt__trace_step_end(&step);
    if (bytes >= 0 && NT__CFG(log_level) >= NT__LOG_WARN)
        fprintf(stderr, "ntensor: trace: step %lld wrote %.1f KB (NT_TRACE_LEVEL %s)\n",
                (long long)step, (double)bytes / 1024.0,
                nt__trace_level_name(nt__trace_filter_level()));
}
