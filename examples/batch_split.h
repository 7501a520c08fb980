/* examples/batch_split.h - B independent pieces of work over C simulated
 * NeuronCores, in the spirit of the trnfft notes: core c takes the
 * contiguous block of B/C pieces [c*B/C, (c+1)*B/C), with its own copy of
 * the weights and no communication at all.  A piece is a small MLP
 * inference: y_b = softmax(gelu(x_b W1) W2) over rows of x_b.
 *
 * Shared by examples/batch_split (one run per core count, bit-for-bit check)
 * and bench/batch_split (host wall time of 2 cores over 1).  Every core runs
 * the same ops on the same values, so the outputs are the 1-core run's bit
 * for bit, whatever C. */
#ifndef NT_EXAMPLES_BATCH_SPLIT_H
#define NT_EXAMPLES_BATCH_SPLIT_H

#include <ntensor.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

typedef struct bs_cfg {
    int pieces;           /* B */
    int rows, in, hidden, out; /* x_b: rows x in; W1: in x hidden; W2: hidden x out */
    uint64_t seed;
} bs_cfg;

typedef struct bs_result {
    int cores;
    double wall_ns;                   /* host wall time of the pieces (best run) */
    double sim_ns[NT_MAX_DEVICES];    /* each core's simulated kernel time */
    uint64_t kernels[NT_MAX_DEVICES];
} bs_result;

static inline double bs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct bs_job {
    const bs_cfg *cfg;
    int dev, first, count; /* pieces [first, first + count) */
    float *out;            /* pieces * rows * out floats, piece-major */
    int rc;
    char err[512];
} bs_job;

/* One core's block: enqueue every piece on the device's default stream,
 * then read the results back. */
static void *bs_core(void *p)
{
    bs_job *j = p;
    const bs_cfg *c = j->cfg;
    j->rc = nt_device_set(j->dev);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *w1 = nt_randn(NT_F32, 2, (int64_t[]){c->in, c->hidden}, c->seed);
    nt_tensor *w2 = nt_randn(NT_F32, 2, (int64_t[]){c->hidden, c->out}, c->seed + 1);
    w1 = nt_mul_scalar(w1, 1.0 / 16);
    w2 = nt_mul_scalar(w2, 1.0 / 16);
    nt_tensor **ys = calloc((size_t)j->count, sizeof *ys);
    for (int i = 0; i < j->count && ys && !j->rc; i++) {
        int b = j->first + i;
        nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){c->rows, c->in}, c->seed + 100 + (uint64_t)b);
        nt_tensor *h = nt_gelu(nt_matmul(x, w1));
        ys[i] = nt_softmax(nt_matmul(h, w2), -1);
        if (!ys[i])
            j->rc = nt_last_error();
    }
    size_t per = (size_t)c->rows * (size_t)c->out;
    for (int i = 0; i < j->count && ys && !j->rc; i++)
        j->rc = nt_to_host(ys[i], j->out + (size_t)(j->first + i) * per, per * sizeof(float));
    if (!ys && !j->rc)
        j->rc = -1;
    if (j->rc)
        snprintf(j->err, sizeof j->err, "%s", nt_last_error_message());
    free(ys);
    nt_scope_end(sc);
    return NULL;
}

/* Runs every piece over `cores` cores `reps` times in one nt_init (the first
 * run warms the caches; the wall time is the best of the others, or the only
 * one); out gets the pieces' outputs.  Returns 0 or an error code (message on
 * stderr). */
static int bs_run(const bs_cfg *c, int cores, int reps, float *out, bs_result *res)
{
    char v[16];
    snprintf(v, sizeof v, "%d", cores);
    setenv("NT_SIM_CORES", v, 1);
    if (nt_init() != 0) {
        fprintf(stderr, "batch_split: nt_init: %s\n", nt_last_error_message());
        return -1;
    }
    memset(res, 0, sizeof *res);
    res->cores = cores;
    int rc = 0;
    for (int r = 0; r < reps && !rc; r++) {
        nt_sim_stats_reset();
        bs_job jobs[NT_MAX_DEVICES];
        pthread_t th[NT_MAX_DEVICES];
        double t0 = bs_now_ns();
        for (int d = 0; d < cores; d++) {
            int lo = (int)((long)c->pieces * d / cores), hi = (int)((long)c->pieces * (d + 1) / cores);
            jobs[d] = (bs_job){c, d, lo, hi - lo, out, 0, ""};
            if (pthread_create(&th[d], NULL, bs_core, &jobs[d]) != 0) {
                fprintf(stderr, "batch_split: no thread for core %d\n", d);
                cores = d;
                rc = -1;
                break;
            }
        }
        for (int d = 0; d < cores; d++)
            pthread_join(th[d], NULL);
        double wall = bs_now_ns() - t0;
        for (int d = 0; d < cores && !rc; d++)
            if (jobs[d].rc) {
                fprintf(stderr, "batch_split: core %d: %s\n", d, jobs[d].err);
                rc = jobs[d].rc;
            }
        if (rc)
            break;
        if (r == 1 || reps == 1 || wall < res->wall_ns)
            res->wall_ns = wall;
        for (int d = 0; d < cores; d++) {
            nt_sim_stats st;
            if (nt_device_stats_get(d, &st) == 0) {
                res->sim_ns[d] = st.sim_ns;
                res->kernels[d] = st.kernels;
            }
        }
    }
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
    return rc;
}

/* The largest simulated time of any core: the run's simulated makespan. */
static inline double bs_sim_max(const bs_result *r)
{
    double m = 0;
    for (int d = 0; d < r->cores; d++)
        if (r->sim_ns[d] > m)
            m = r->sim_ns[d];
    return m;
}

#endif
