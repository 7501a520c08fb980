/* dist/cost.c - topologies and the collectives' cost model.
 *
 * docs/collectives.md has the model, its formula and where each number
 * comes from.  Two views of one algorithm:
 *   nt__coll_formula_ns  the closed formula (every rank starting at once)
 *   nt__coll_schedule    the algorithm step by step: each transfer and each
 *                        reduction booked on its rank's timeline, waiting
 *                        for the data it forwards; ranks that start late
 *                        delay the ranks downstream of them.
 * Units: bytes, GB/s (1e9 bytes/s, so bytes / GBps = ns) and microseconds
 * for latencies. */
#include "dist/dist.h"

#include <errno.h>
#include <math.h>

/* The named topologies.  Sources (docs/collectives.md): cores per instance
 * and EFA bandwidth from the team's hardware notes (shared NEURONCORE.md,
 * "Chips, instances and collectives"); NeuronLink bandwidth, every latency
 * and the reduction rate are chosen, named parameters (the public docs give
 * no per-link figure). */
static const nt__topology topologies[] = {
    /* 1 Trainium chip, 2 NeuronCore-v2; EFA up to 25 Gbps */
    {"trn1.2xlarge", 2, 100.0, 2.0, 25.0 / 8, 20.0, 200.0},
    /* 16 chips (32 cores) on NeuronLink-v2; EFA 800 Gbps */
    {"trn1.32xlarge", 32, 100.0, 2.0, 800.0 / 8, 20.0, 200.0},
    /* 16 Trainium2 chips x 8 NeuronCore-v3; EFA chosen at 3.2 Tbps */
    {"trn2.48xlarge", 128, 128.0, 2.0, 3200.0 / 8, 20.0, 400.0},
};
#define DEFAULT_TOPOLOGY 1 /* trn1.32xlarge: 32 cores in one NeuronLink domain */

static nt__topology current = {"trn1.32xlarge", 32, 100.0, 2.0, 100.0, 20.0, 200.0};

bool nt__topology_named(const char *name, nt__topology *t)
{
    for (size_t i = 0; i < G_N_ELEMENTS(topologies); i++)
        if (!strcmp(name, topologies[i].name)) {
            *t = topologies[i];
            return true;
        }
    return false;
}

const nt__topology *nt__topology_current(void) { return &current; }

/* A positive finite number, or an error naming the variable. */
static int env_positive(const char *var, double *out)
{
    const char *v = getenv(var);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(d) || d <= 0)
        return nt__err(NULL, NT_EINVAL, "nt_init",
                       "environment variable %s is '%s'; expected a number > 0 (%s)", var, v,
                       strstr(var, "LATENCY") ? "microseconds" : "GB/s");
    *out = d;
    return 0;
}

int nt__topology_load(nt__topology *t)
{
    *t = topologies[DEFAULT_TOPOLOGY];
    const char *name = getenv("NT_SIM_TOPOLOGY");
    if (name && !nt__topology_named(name, t)) {
        *t = topologies[DEFAULT_TOPOLOGY];
        return nt__err(NULL, NT_EINVAL, "nt_init",
                       "environment variable NT_SIM_TOPOLOGY is '%s'; expected trn1.2xlarge, "
                       "trn1.32xlarge or trn2.48xlarge",
                       name);
    }
    nt__topology n = *t;
    int rc;
    if ((rc = env_positive("NT_SIM_LINK_GBPS", &n.link_gbps)) < 0 ||
        (rc = env_positive("NT_SIM_LINK_LATENCY_US", &n.link_latency_us)) < 0 ||
        (rc = env_positive("NT_SIM_EFA_GBPS", &n.efa_gbps)) < 0 ||
        (rc = env_positive("NT_SIM_EFA_LATENCY_US", &n.efa_latency_us)) < 0 ||
        (rc = env_positive("NT_SIM_REDUCE_GBPS", &n.reduce_gbps)) < 0)
        return rc;
    *t = n;
    current = n;
    return 0;
}

/* ------------------------------------------------------------------ */
/* The closed formula                                                 */
/* ------------------------------------------------------------------ */

/* A ring of n ranks: `steps` transfers of `chunk` bytes each (latency
 * lat_us, bandwidth gbps), `red` of them followed by a reduction of the
 * chunk at the reduce rate. */
static double ring_ns(int steps, int red, double chunk, double lat_us, double gbps, double rgbps)
{
    return steps * (lat_us * 1e3 + chunk / gbps) + red * (chunk / rgbps);
}

/* Steps of a ring collective over n ranks, and how many reduce. */
static void ring_steps(nt__coll_kind kind, int n, int *steps, int *red)
{
    switch (kind) {
    case NT__COLL_ALL_REDUCE: *steps = 2 * (n - 1); *red = n - 1; break;
    case NT__COLL_REDUCE_SCATTER: *steps = n - 1; *red = n - 1; break;
    case NT__COLL_ALL_GATHER: *steps = n - 1; *red = 0; break;
    /* a pipelined chain: n chunks pass n - 1 hops */
    case NT__COLL_BROADCAST: *steps = 2 * (n - 1); *red = 0; break;
    default: *steps = *red = 0; break;
    }
}

double nt__coll_formula_ns(const nt__topology *t, nt__coll_kind kind, int n, double bytes)
{
    if (n <= 1)
        return 0;
    int L = t->cores_per_instance;
    int steps, red;
    if (n <= L) {
        ring_steps(kind, n, &steps, &red);
        return ring_ns(steps, red, bytes / n, t->link_latency_us, t->link_gbps, t->reduce_gbps);
    }
    /* Hierarchical: I instances of L ranks.  The intra-instance phase
     * moves each local shard (bytes / L); between instances, each of the L
     * shards goes over the instance's EFA, which its L cores share. */
    int I = (n + L - 1) / L;
    double shard = bytes / L, efa = t->efa_gbps / L;
    double ns = 0;
    int s1, r1, s2, r2;
    switch (kind) {
    case NT__COLL_ALL_REDUCE:
        /* intra reduce-scatter, inter all-reduce of a shard, intra all-gather */
        ring_steps(NT__COLL_REDUCE_SCATTER, L, &s1, &r1);
        ring_steps(NT__COLL_ALL_REDUCE, I, &s2, &r2);
        ns = 2 * ring_ns(s1, 0, shard, t->link_latency_us, t->link_gbps, t->reduce_gbps) +
             r1 * (shard / t->reduce_gbps) +
             ring_ns(s2, r2, shard / I, t->efa_latency_us, efa, t->reduce_gbps);
        break;
    case NT__COLL_REDUCE_SCATTER:
        /* intra reduce-scatter of the whole input, inter reduce-scatter of
         * each shard */
        ring_steps(NT__COLL_REDUCE_SCATTER, L, &s1, &r1);
        ring_steps(NT__COLL_REDUCE_SCATTER, I, &s2, &r2);
        ns = ring_ns(s1, r1, shard, t->link_latency_us, t->link_gbps, t->reduce_gbps) +
             ring_ns(s2, r2, shard / I, t->efa_latency_us, efa, t->reduce_gbps);
        break;
    case NT__COLL_ALL_GATHER:
        /* inter all-gather of each rank's block, then intra all-gather of
         * the instance's blocks */
        ring_steps(NT__COLL_ALL_GATHER, I, &s2, &r2);
        ring_steps(NT__COLL_ALL_GATHER, L, &s1, &r1);
        ns = ring_ns(s2, 0, bytes / n, t->efa_latency_us, efa, t->reduce_gbps) +
             ring_ns(s1, 0, bytes / L, t->link_latency_us, t->link_gbps, t->reduce_gbps);
        break;
    case NT__COLL_BROADCAST:
        /* shard j goes down a chain of the instances' cores j, then each
         * instance all-gathers its shards */
        ring_steps(NT__COLL_BROADCAST, I, &s2, &r2);
        ring_steps(NT__COLL_ALL_GATHER, L, &s1, &r1);
        ns = ring_ns(s2, 0, shard / I, t->efa_latency_us, efa, t->reduce_gbps) +
             ring_ns(s1, 0, shard, t->link_latency_us, t->link_gbps, t->reduce_gbps);
        break;
    }
    return ns;
}

/* ------------------------------------------------------------------ */
/* The schedule                                                       */
/* ------------------------------------------------------------------ */

/* A ring over the ranks grp[0..g-1]: `steps` steps; at each, every rank
 * sends one chunk to the next rank of the ring, starting when it holds the
 * chunk (what it received, and for the first step its own input, t[]) and
 * its link is free; the receiver reduces it (the first `red` steps) once it
 * arrived and the receiver is done with its previous step.  t[grp[i]] is
 * rank grp[i]'s time, advanced in place.  Chunks are `bytes` split in g
 * parts as an element-granular split would (the first bytes % g parts one
 * byte bigger). */
static void ring_schedule(double *t, const int *grp, int g, int steps, int red, double bytes,
                          double lat_us, double gbps, double rgbps, double *tmp)
{
    double *link = tmp, *nt = tmp + g;
    for (int i = 0; i < g; i++)
        link[i] = 0;
    double base = floor(bytes / g), extra = bytes - base * g;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < g; i++) {
            int q = (i + 1) % g;
            /* the chunk rank i forwards at step s: index (i - s) mod g */
            int ci = ((i - s) % g + g) % g;
            double c = base + (ci < extra ? 1 : 0);
            double begin = t[grp[i]] > link[i] ? t[grp[i]] : link[i];
            double wire = c / gbps;
            double arrive = begin + lat_us * 1e3 + wire;
            link[i] = arrive;
            double done = arrive > t[grp[q]] ? arrive : t[grp[q]];
            if (s < red)
                done += c / rgbps;
            nt[q] = done;
        }
        for (int i = 0; i < g; i++)
            t[grp[i]] = nt[i];
    }
}

int nt__coll_schedule(const nt__topology *t, nt__coll_kind kind, int n, double bytes,
                      const double *start, double *end)
{
    for (int r = 0; r < n; r++)
        end[r] = start[r];
    if (n <= 1)
        return 0;
    int L = t->cores_per_instance;
    int *grp = malloc(sizeof *grp * (size_t)n);
    double *tmp = malloc(sizeof *tmp * 2 * (size_t)n);
    if (!grp || !tmp) { /* the formula, from the latest start */
        double s0 = 0;
        for (int r = 0; r < n; r++)
            s0 = start[r] > s0 ? start[r] : s0;
        for (int r = 0; r < n; r++)
            end[r] = s0 + nt__coll_formula_ns(t, kind, n, bytes);
        free(grp);
        free(tmp);
        return 0;
    }
    int steps, red, booked = 0;
    if (n <= L) {
        for (int r = 0; r < n; r++)
            grp[r] = r;
        ring_steps(kind, n, &steps, &red);
        ring_schedule(end, grp, n, steps, red, bytes, t->link_latency_us, t->link_gbps,
                      t->reduce_gbps, tmp);
        booked = steps;
    } else {
        int I = (n + L - 1) / L;
        double shard = bytes / L, efa = t->efa_gbps / L;
        /* the rings inside each instance (the last may be short) */
#define INTRA(kd, b)                                                                   \
    do {                                                                               \
        for (int in = 0; in < I; in++) {                                               \
            int g = 0;                                                                 \
            for (int r = in * L; r < n && r < (in + 1) * L; r++)                       \
                grp[g++] = r;                                                          \
            ring_steps((kd), g, &steps, &red);                                         \
            ring_schedule(end, grp, g, steps, red, (b) * g / L, t->link_latency_us,    \
                          t->link_gbps, t->reduce_gbps, tmp);                          \
        }                                                                              \
        ring_steps((kd), L, &steps, &red);                                             \
        booked += steps;                                                               \
    } while (0)
        /* the rings between instances: local index j of every instance */
#define INTER(kd, b, bw)                                                               \
    do {                                                                               \
        for (int j = 0; j < L; j++) {                                                  \
            int g = 0;                                                                 \
            for (int in = 0; in < I; in++)                                             \
                if (in * L + j < n)                                                    \
                    grp[g++] = in * L + j;                                             \
            ring_steps((kd), g, &steps, &red);                                         \
            ring_schedule(end, grp, g, steps, red, (b), t->efa_latency_us, (bw),       \
                          t->reduce_gbps, tmp);                                        \
        }                                                                              \
        ring_steps((kd), I, &steps, &red);                                             \
        booked += steps;                                                               \
    } while (0)
        switch (kind) {
        case NT__COLL_ALL_REDUCE:
            INTRA(NT__COLL_REDUCE_SCATTER, bytes);
            INTER(NT__COLL_ALL_REDUCE, shard, efa);
            INTRA(NT__COLL_ALL_GATHER, bytes);
            break;
        case NT__COLL_REDUCE_SCATTER:
            INTRA(NT__COLL_REDUCE_SCATTER, bytes);
            INTER(NT__COLL_REDUCE_SCATTER, shard, efa);
            break;
        case NT__COLL_ALL_GATHER:
            INTER(NT__COLL_ALL_GATHER, bytes * I / n, efa);
            INTRA(NT__COLL_ALL_GATHER, bytes);
            break;
        case NT__COLL_BROADCAST:
            INTER(NT__COLL_BROADCAST, shard, efa);
            INTRA(NT__COLL_ALL_GATHER, bytes);
            break;
        }
#undef INTRA
#undef INTER
    }
    free(grp);
    free(tmp);
    return booked;
}

NT_API int nt_collective_cost(nt_collective kind, int ranks, double bytes, double *formula_ns,
                              double *schedule_ns)
{
    static const char fn[] = "nt_collective_cost";
    if (!nt__ensure_init())
        return nt_last_error();
    if ((unsigned)kind > NT_COLL_BROADCAST)
        return nt__err(NULL, NT_EINVAL, fn, "kind is %d; expected an nt_collective", (int)kind);
    if (ranks < 1)
        return nt__err(NULL, NT_EINVAL, fn, "ranks is %d; expected >= 1", ranks);
    if (!(bytes >= 0) || !isfinite(bytes))
        return nt__err(NULL, NT_EINVAL, fn, "bytes is %g; expected a finite number >= 0", bytes);
    const nt__topology *t = nt__topology_current();
    if (formula_ns)
        *formula_ns = nt__coll_formula_ns(t, (nt__coll_kind)kind, ranks, bytes);
    if (schedule_ns) {
        double *st = calloc((size_t)ranks, sizeof *st), *en = malloc(sizeof *en * (size_t)ranks);
        if (!st || !en) {
            free(st);
            free(en);
            return nt__err_hostmem(NULL, fn, "the schedule");
        }
        nt__coll_schedule(t, (nt__coll_kind)kind, ranks, bytes, st, en);
        double m = 0;
        for (int r = 0; r < ranks; r++)
            m = en[r] > m ? en[r] : m;
        *schedule_ns = m;
        free(st);
        free(en);
    }
    return 0;
}
