/* tests/test_collectives.c - the rank tree, the cost model, the
 * collective ops (dist/). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <unistd.h>

#include "ntensor.h"
#include "dispatcher/dispatch.h"
#include "dist/dist.h"
#include "streams/stream.h"
#include "nt_test.h"

/* ------------------------------------------------------------------ */
/* The rank tree against an independent reference                     */
/* ------------------------------------------------------------------ */

/* the seeded values of the rank-tree tests (nt_test.h's generator) */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint32_t rnd(void) { return nt_test_rand32(&rng_state); }
/* Values of very different magnitudes, so the order shows in the bits. */
static double rnd_val(void)
{
    double m = ((double)(rnd() % 2000001) - 1000000.0) / 1000000.0;
    return ldexp(m, (int)(rnd() % 40) - 20);
}

/* The reference: the tree written as a recursion over a list (new list per
 * level), each combine done in double and rounded to float -- which is
 * the correctly rounded f32 operation, computed another way. */
static double ref_combine(double a, double b, nt_reduce_op op)
{
    if (op == NT_REDUCE_MAX)
        return isnan(a) || isnan(b) ? NAN : (a > b ? a : b);
    return (double)(float)(a + b);
}
static double ref_tree(const double *v, int n, nt_reduce_op op)
{
    if (n == 1)
        return v[0];
    int m = (n + 1) / 2;
    double *up = malloc(sizeof *up * (size_t)m);
    for (int i = 0; i < n / 2; i++)
        up[i] = ref_combine(v[2 * i], v[2 * i + 1], op);
    if (n % 2)
        up[m - 1] = v[n - 1];
    double r = ref_tree(up, m, op);
    free(up);
    return r;
}

static double load(const void *p, nt_dtype dt, int64_t i) { return nt__load_f64(p, dt, i); }

static void check_tree(nt_dtype dt, nt_reduce_op op, int n, int64_t count)
{
    size_t es = nt__dtype_size(dt);
    void **v = malloc(sizeof *v * (size_t)n);
    for (int r = 0; r < n; r++) {
        v[r] = malloc((size_t)count * es + 1);
        for (int64_t i = 0; i < count; i++) {
            double x = rnd_val();
            if (dt == NT_I32)
                nt__store_i32(v[r], dt, i, (int32_t)rnd());
            else if (dt == NT_U8)
                nt__store_i32(v[r], dt, i, (int32_t)(rnd() & 255));
            else
                nt__store_f64(v[r], dt, i, x);
        }
    }
    if (nt__dtype_is_float(dt) && count > 3)
        nt__store_f64(v[n / 2], dt, 3, NAN); /* a NaN reaches the result */
    void *dst = malloc((size_t)count * es + 1);
    assert_int_equal(nt__tree_reduce(dst, (const void *const *)v, n, count, dt, op), 0);
    double *col = malloc(sizeof *col * (size_t)n);
    for (int64_t i = 0; i < count; i++) {
        if (nt__dtype_is_float(dt)) {
            for (int r = 0; r < n; r++)
                col[r] = load(v[r], dt, i);
            double want = ref_tree(col, n, op);
            if (op == NT_REDUCE_MEAN)
                want = (double)(float)(want * (double)(float)(1.0 / n));
            uint8_t wb[8]; /* the widest dtype */
            nt__store_f64(wb, dt, 0, want);
            double got = load(dst, dt, i), w = load(wb, dt, 0);
            if (isnan(w))
                assert_true(isnan(got));
            else if (memcmp((char *)dst + i * (int64_t)es, wb, es)) {
                fail_msg("dtype %d op %d n %d element %lld: got %a, want %a", dt, op, n,
                         (long long)i, got, w);
            }
        } else {
            int64_t acc = op == NT_REDUCE_MAX ? INT64_MIN : 0;
            for (int r = 0; r < n; r++) {
                int64_t x = (int64_t)load(v[r], dt, i);
                acc = op == NT_REDUCE_MAX ? (x > acc ? x : acc) : acc + x;
            }
            /* exact, then wrapped to the dtype (sums are order-free) */
            int64_t got = (int64_t)load(dst, dt, i);
            if (dt == NT_I32)
                assert_int_equal(got, (int32_t)(uint32_t)(uint64_t)acc);
            else
                assert_int_equal(got, (uint8_t)(uint64_t)acc);
        }
    }
    for (int r = 0; r < n; r++)
        free(v[r]);
    free(v);
    free(dst);
    free(col);
}

static void test_tree_every_dtype_op(void **state)
{
    (void)state;
    const nt_dtype dts[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    const int ns[] = {1, 2, 3, 5, 7, 8, 13, 32};
    for (size_t d = 0; d < 5; d++)
        for (int op = 0; op < 3; op++) {
            if (!nt__dtype_is_float(dts[d]) && op == NT_REDUCE_MEAN)
                continue;
            for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
                check_tree(dts[d], (nt_reduce_op)op, ns[k], 1100); /* > one chunk */
        }
}

static void test_tree_edges(void **state)
{
    (void)state;
    float a = 1, b = 2, d = -1;
    const void *v[2] = {&a, &b};
    assert_int_equal(nt__tree_reduce(&d, v, 2, 0, NT_F32, NT_REDUCE_SUM), 0);
    assert_true(d == -1); /* count 0 writes nothing */
    assert_int_equal(nt__tree_reduce(&d, v, 0, 1, NT_F32, NT_REDUCE_SUM), NT_EINVAL);
    int32_t i = 1;
    const void *vi[1] = {&i};
    assert_int_equal(nt__tree_reduce(&i, vi, 1, 1, NT_I32, NT_REDUCE_MEAN), NT_EDTYPE);
    /* the order shows: (1e8 + 1) + (-1e8 + 1) != ((1e8 + 1) - 1e8) + 1 */
    float w[4] = {1e8f, 1, -1e8f, 1}, out;
    const void *vw[4] = {&w[0], &w[1], &w[2], &w[3]};
    assert_int_equal(nt__tree_reduce(&out, vw, 4, 1, NT_F32, NT_REDUCE_SUM), 0);
    assert_true(out == (1e8f + 1.0f) + (-1e8f + 1.0f));
    /* mean of a power of two: exact */
    float m4[4] = {1, 2, 3, 4};
    const void *vm[4] = {&m4[0], &m4[1], &m4[2], &m4[3]};
    assert_int_equal(nt__tree_reduce(&out, vm, 4, 1, NT_F32, NT_REDUCE_MEAN), 0);
    assert_true(out == 2.5f);
    assert_string_equal(nt__reduce_op_name(NT_REDUCE_MAX), "max");
    assert_null(nt__reduce_op_name(7));
}

/* The contract data parallel relies on: ranks holding blocks of 2^k
 * consecutive shards, a tree over the ranks' own trees is the tree over
 * all shards, for any rank count. */
static void test_tree_composes(void **state)
{
    (void)state;
    enum { COUNT = 300 };
    for (int k = 0; k <= 3; k++) {
        int B = 1 << k;
        for (int ranks = 1; ranks <= 9; ranks++) {
            int S = B * ranks;
            for (int op = 0; op < 3; op += 2) { /* sum, max */
                float **sh = malloc(sizeof *sh * (size_t)S);
                for (int s = 0; s < S; s++) {
                    sh[s] = malloc(sizeof(float) * COUNT);
                    for (int i = 0; i < COUNT; i++)
                        sh[s][i] = (float)rnd_val();
                }
                float *all = malloc(sizeof(float) * COUNT);
                assert_int_equal(nt__tree_reduce(all, (const void *const *)sh, S, COUNT, NT_F32,
                                                 (nt_reduce_op)op),
                                 0);
                float **part = malloc(sizeof *part * (size_t)ranks);
                for (int r = 0; r < ranks; r++) {
                    part[r] = malloc(sizeof(float) * COUNT);
                    assert_int_equal(nt__tree_reduce(part[r], (const void *const *)(sh + r * B),
                                                     B, COUNT, NT_F32, (nt_reduce_op)op),
                                     0);
                }
                float *two = malloc(sizeof(float) * COUNT);
                assert_int_equal(nt__tree_reduce(two, (const void *const *)part, ranks, COUNT,
                                                 NT_F32, (nt_reduce_op)op),
                                 0);
                assert_memory_equal(all, two, sizeof(float) * COUNT);
                for (int s = 0; s < S; s++)
                    free(sh[s]);
                for (int r = 0; r < ranks; r++)
                    free(part[r]);
                free(sh);
                free(part);
                free(all);
                free(two);
            }
        }
    }
    /* and a block size that is not a power of two does not compose in
     * general (why the plan asks for one): 3 shards on 2 ranks of 1.5 are
     * not expressible, but blocks of 3 on 2 ranks give ((a+b)+c)+((d+e)+f)
     * where the big tree gives ((a+b)+(c+d))+(e+f) */
    float v[6] = {1e8f, 1, 1, -1e8f, 1, 1};
    const void *pv[6] = {&v[0], &v[1], &v[2], &v[3], &v[4], &v[5]};
    float all, p0, p1;
    nt__tree_reduce(&all, pv, 6, 1, NT_F32, NT_REDUCE_SUM);
    nt__tree_reduce(&p0, pv, 3, 1, NT_F32, NT_REDUCE_SUM);
    nt__tree_reduce(&p1, pv + 3, 3, 1, NT_F32, NT_REDUCE_SUM);
    float pp[2] = {p0, p1}, two;
    const void *ppv[2] = {&pp[0], &pp[1]};
    nt__tree_reduce(&two, ppv, 2, 1, NT_F32, NT_REDUCE_SUM);
    assert_true(all != two);
}

/* ------------------------------------------------------------------ */
/* The cost model                                                     */
/* ------------------------------------------------------------------ */

static void test_cost_formula_vs_schedule(void **state)
{
    (void)state;
    const char *topo[] = {"trn1.2xlarge", "trn1.32xlarge", "trn2.48xlarge"};
    const int ns[] = {2, 3, 4, 8, 16, 32, 64};
    for (int ti = 0; ti < 3; ti++) {
        nt__topology t;
        assert_true(nt__topology_named(topo[ti], &t));
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
            for (int kind = 0; kind < 4; kind++) {
                int n = ns[k];
                double bytes = 4.0 * 1024 * 1024 + 12345;
                double f = nt__coll_formula_ns(&t, (nt__coll_kind)kind, n, bytes);
                double st[64] = {0}, en[64];
                int steps = nt__coll_schedule(&t, (nt__coll_kind)kind, n, bytes, st, en);
                assert_true(steps > 0);
                double m = 0;
                for (int r = 0; r < n; r++)
                    m = en[r] > m ? en[r] : m;
                /* every rank starting at once: the schedule of steps
                 * meets the formula (chunks split at whole bytes) */
                if (fabs(m - f) > 1e-4 * f)
                    fail_msg("%s kind %d n %d: schedule %.1f ns, formula %.1f ns", topo[ti],
                             kind, n, m, f);
            }
    }
    /* the ring all-reduce formula, by hand: 2(N-1)/N x bytes / bw +
     * 2(N-1) x latency + (N-1)/N x bytes / reduce rate */
    nt__topology t;
    nt__topology_named("trn1.32xlarge", &t);
    double b = 1e6, n = 8;
    double want = 2 * (n - 1) / n * b / t.link_gbps + 2 * (n - 1) * t.link_latency_us * 1e3 +
                  (n - 1) / n * b / t.reduce_gbps;
    assert_true(fabs(nt__coll_formula_ns(&t, NT__COLL_ALL_REDUCE, 8, b) - want) < 1e-6 * want);
    assert_true(nt__coll_formula_ns(&t, NT__COLL_ALL_REDUCE, 1, b) == 0);
    /* one rank late: nobody ends before it started, and the late rank's
     * delay reaches the others (the ring forwards its chunks) */
    double st[8] = {0}, en[8];
    st[3] = 1e6;
    nt__coll_schedule(&t, NT__COLL_ALL_REDUCE, 8, b, st, en);
    double f = nt__coll_formula_ns(&t, NT__COLL_ALL_REDUCE, 8, b);
    for (int r = 0; r < 8; r++) {
        if (!(en[r] > 1e6 && en[r] <= 1e6 + 1.25 * f))
            fail_msg("rank %d ends at %.1f ns (late start 1e6, formula %.1f)", r, en[r], f);
    }
    /* across instances (trn1.2xlarge: 2 cores each) EFA makes it slower */
    nt__topology small;
    nt__topology_named("trn1.2xlarge", &small);
    assert_true(nt__coll_formula_ns(&small, NT__COLL_ALL_REDUCE, 8, b) >
                nt__coll_formula_ns(&t, NT__COLL_ALL_REDUCE, 8, b) * 2);
}

static void test_cost_public(void **state)
{
    (void)state;
    double f = -1, s = -1;
    assert_int_equal(nt_collective_cost(NT_COLL_ALL_REDUCE, 8, 1 << 20, &f, &s), 0);
    assert_true(f > 0 && fabs(s - f) <= 1e-6 * f + 1);
    assert_int_equal(nt_collective_cost(NT_COLL_BROADCAST, 1, 100, &f, NULL), 0);
    assert_true(f == 0);
    assert_int_equal(nt_collective_cost((nt_collective)9, 2, 1, &f, &s), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nt_collective_cost"));
    assert_int_equal(nt_collective_cost(NT_COLL_ALL_GATHER, 0, 1, &f, &s), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "ranks"));
    assert_int_equal(nt_collective_cost(NT_COLL_ALL_GATHER, 2, -1, &f, &s), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "bytes"));
}

/* Settings: each bad value is a clear error at nt_init naming it. */
static void test_env_settings(void **state)
{
    (void)state;
    nt_shutdown();
    const char *bad[][2] = {
        {"NT_SIM_TOPOLOGY", "trn9.huge"},   {"NT_SIM_LINK_GBPS", "-3"},
        {"NT_SIM_LINK_LATENCY_US", "abc"},  {"NT_SIM_EFA_GBPS", "0"},
        {"NT_SIM_EFA_LATENCY_US", "1e999"}, {"NT_SIM_REDUCE_GBPS", "nan"},
        {"NT_COLLECTIVE_TIMEOUT", "-1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        assert_int_equal(nt_init(), NT_EINVAL);
        assert_non_null(strstr(nt_last_error_message(), bad[i][0]));
        assert_non_null(strstr(nt_last_error_message(), bad[i][1]));
        unsetenv(bad[i][0]);
        nt_clear_error();
    }
    /* overrides apply to the named topology */
    setenv("NT_SIM_TOPOLOGY", "trn1.2xlarge", 1);
    setenv("NT_SIM_LINK_GBPS", "50", 1);
    setenv("NT_COLLECTIVE_TIMEOUT", "0.5", 1);
    assert_int_equal(nt_init(), 0);
    const nt__topology *t = nt__topology_current();
    assert_string_equal(t->name, "trn1.2xlarge");
    assert_int_equal(t->cores_per_instance, 2);
    assert_true(t->link_gbps == 50);
    assert_true(nt__coll_timeout_s() == 0.5);
    nt_shutdown();
    unsetenv("NT_SIM_TOPOLOGY");
    unsetenv("NT_SIM_LINK_GBPS");
    unsetenv("NT_COLLECTIVE_TIMEOUT");
    assert_int_equal(nt_init(), 0);
    assert_string_equal(nt__topology_current()->name, "trn1.32xlarge");
    assert_true(nt__coll_timeout_s() == 60);
    assert_int_equal(nt_process_count(), 1);
    assert_int_equal(nt_process_rank(), 0);
}


/* ------------------------------------------------------------------ */
/* The collective ops                                                 */
/* ------------------------------------------------------------------ */

/* Devices of this process (NT_SIM_CORES, set in main). */
static int ndev(void) { return nt_device_count(); }
static void dev_set(int d) { assert_int_equal(nt_device_set(d), 0); }


/* Every collective x dtype x op over devices 0..n-1 in the current mode:
 * values against the reference, read back through an op on each device
 * (so the outputs' readiness is what a later kernel waits for). */
static void all_ops_once(int n)
{
    int devs[64];
    for (int i = 0; i < n; i++)
        devs[i] = i;
    nt_comm *c = nt_comm_create(devs, n);
    assert_non_null(c);
    assert_int_equal(nt_comm_size(c), n);
    for (int i = 0; i < n; i++)
        assert_int_equal(nt_comm_rank(c, i), i);
    const nt_dtype dts[] = {NT_F32, NT_BF16, NT_F16, NT_I32, NT_U8};
    const int64_t rows = 2 * n, cols = 21;
    int64_t count = rows * cols;
    for (int di = 0; di < 5; di++) {
        nt_dtype dt = dts[di];
        size_t es = nt_dtype_size(dt);
        void *g[64];
        nt_tensor *in[64], *out[64];
        for (int r = 0; r < n; r++) {
            g[r] = malloc((size_t)count * es);
            nt_test_rank_input(g[r], dt, r, count);
            dev_set(r);
            nt_tensor *h = nt_from_host(g[r], dt, 2, (int64_t[]){rows, cols});
            in[r] = nt_mul_scalar(h, 1.0); /* made by a kernel on the device */
            assert_non_null(in[r]);
            nt_release(h);
        }
        dev_set(0);
        char *want = malloc((size_t)count * es * (size_t)n), *got = malloc((size_t)count * es * (size_t)n);
        for (int kind = 0; kind < 4; kind++)
            for (int op = 0; op < 3; op++) {
                if ((kind == 1 || kind == 3) && op > 0)
                    continue;
                if (op == NT_REDUCE_MEAN && !nt__dtype_is_float(dt))
                    continue;
                size_t ob = (size_t)count * es;
                int rc, root = n / 2;
                switch (kind) {
                case 0:
                    rc = nt_all_reduce(c, in, out, (nt_reduce_op)op);
                    break;
                case 1:
                    rc = nt_all_gather(c, in, out);
                    ob *= (size_t)n;
                    break;
                case 2:
                    rc = nt_reduce_scatter(c, in, out, (nt_reduce_op)op);
                    ob /= (size_t)n;
                    break;
                default:
                    rc = nt_broadcast(c, in, out, root);
                    break;
                }
                assert_int_equal(rc, 0);
                for (int i = 0; i < n; i++) {
                    switch (kind) {
                    case 0:
                        nt__tree_reduce(want, (const void *const *)g, n, count, dt, (nt_reduce_op)op);
                        break;
                    case 1:
                        for (int r = 0; r < n; r++)
                            memcpy(want + (size_t)r * count * es, g[r], (size_t)count * es);
                        break;
                    case 2: {
                        const void *bv[64];
                        for (int r = 0; r < n; r++)
                            bv[r] = (const char *)g[r] + (size_t)i * ob;
                        nt__tree_reduce(want, bv, n, count / n, dt, (nt_reduce_op)op);
                        break;
                    }
                    default:
                        memcpy(want, g[root], ob);
                    }
                    dev_set(i);
                    nt_tensor *y = nt_mul_scalar(out[i], 1.0);
                    assert_int_equal(nt_to_host(y, got, ob), 0);
                    if (memcmp(got, want, ob))
                        fail_msg("kind %d op %d dtype %s member %d of %d: values differ", kind, op,
                                 nt_dtype_name(dt), i, n);
                    assert_int_equal(nt_shape(out[i], 0),
                                     kind == 1 ? rows * n : kind == 2 ? rows / n : rows);
                    nt_release(y);
                    nt_release(out[i]);
                }
                dev_set(0);
            }
        for (int r = 0; r < n; r++) {
            nt_release(in[r]);
            free(g[r]);
        }
        free(want);
        free(got);
    }
    nt_comm_destroy(c);
    assert_int_equal(nt_sync(), 0);
}

static void test_ops_every_mode_backend(void **state)
{
    (void)state;
    const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};
    const char *backends[] = {"sim", "cpu"};
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 4; m++) {
            assert_int_equal(nt_config_set("NT_BACKEND", backends[b]), 0);
            if (!strcmp(modes[m], "deterministic"))
                assert_int_equal(nt_config_set("NT_DETERMINISTIC", "1"), 0);
            else {
                assert_int_equal(nt_config_set("NT_DETERMINISTIC", "0"), 0);
                assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
            }
            for (int n = 1; n <= ndev(); n++)
                all_ops_once(n);
        }
    nt_config_set("NT_DETERMINISTIC", "0");
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_BACKEND", "sim");
}

/* Inputs released right after the call: the collective keeps them alive
 * until every member has read them. */
static void test_inputs_released_early(void **state)
{
    (void)state;
    int n = ndev();
    int devs[64];
    nt_tensor *in[64], *out[64];
    for (int i = 0; i < n; i++) {
        devs[i] = i;
        dev_set(i);
        in[i] = nt_full(NT_F32, 1, (int64_t[]){1000}, (double)(i + 1));
    }
    dev_set(0);
    nt_comm *c = nt_comm_create(devs, n);
    assert_int_equal(nt_all_reduce(c, in, out, NT_REDUCE_SUM), 0);
    nt_comm_destroy(c); /* queued work keeps what it needs */
    for (int i = 0; i < n; i++)
        nt_release(in[i]);
    float v[1000];
    for (int i = 0; i < n; i++) {
        assert_int_equal(nt_to_host(out[i], v, sizeof v), 0);
        assert_true(v[0] == (float)(n * (n + 1) / 2) && v[999] == v[0]);
        nt_release(out[i]);
    }
}

/* Bad input: a clear error at the call naming the function and the
 * argument, nothing queued, every out[i] NULL. */
static void test_bad_input(void **state)
{
    (void)state;
    int d0 = 0;
    nt_tensor *x = nt_ones(NT_F32, 1, (int64_t[]){6});
    nt_tensor *xi = nt_ones(NT_I32, 1, (int64_t[]){6});
    nt_tensor *s0 = nt_full(NT_F32, 0, NULL, 1.0);
    nt_tensor *out[2] = {(nt_tensor *)1, (nt_tensor *)1};
    nt_tensor *dead = nt_ones(NT_F32, 1, (int64_t[]){6});
    nt_release(dead);
    assert_int_equal(nt_sync(), 0);
    uint64_t before = nt__tensor_live_handles();
#define BAD(call, code, text)                                                    \
    do {                                                                         \
        out[0] = (nt_tensor *)1;                                                 \
        nt_clear_error();                                                        \
        assert_int_equal((call), (code));                                        \
        if (!strstr(nt_last_error_message(), (text)))                            \
            fail_msg("message '%s' lacks '%s'", nt_last_error_message(), (text)); \
        assert_true(out[0] == NULL || out[0] == (nt_tensor *)1);                 \
    } while (0)
    /* comm creation */
    assert_null(nt_comm_create(NULL, 1));
    assert_non_null(strstr(nt_last_error_message(), "nt_comm_create: argument 'devices'"));
    assert_null(nt_comm_create(&d0, 0));
    assert_non_null(strstr(nt_last_error_message(), "n is 0"));
    assert_null(nt_comm_create((int[]){ndev()}, 1));
    assert_non_null(strstr(nt_last_error_message(), "devices[0]"));
    assert_int_equal(nt_comm_size(NULL), -1);
    assert_int_equal(nt_comm_rank(NULL, 0), -1);
    nt_comm_destroy(NULL);
    nt_comm *c = nt_comm_create(&d0, 1);
    assert_non_null(c);
    assert_int_equal(nt_comm_rank(c, 1), -1);
    /* the ops */
    BAD(nt_all_reduce(NULL, &x, out, NT_REDUCE_SUM), NT_EINVAL, "nt_all_reduce: argument 'c'");
    BAD(nt_all_reduce(c, NULL, out, NT_REDUCE_SUM), NT_EINVAL, "argument 'in'");
    assert_null(out[0]);
    assert_int_equal(nt_all_reduce(c, &x, NULL, NT_REDUCE_SUM), NT_EINVAL);
    BAD(nt_all_reduce(c, &x, out, (nt_reduce_op)7), NT_EINVAL, "op is 7");
    BAD(nt_reduce_scatter(c, &x, out, (nt_reduce_op)-1), NT_EINVAL, "nt_reduce_scatter");
    BAD(nt_all_reduce(c, &xi, out, NT_REDUCE_MEAN), NT_EDTYPE, "NT_REDUCE_MEAN");
    BAD(nt_all_reduce(c, (nt_tensor *[]){NULL}, out, NT_REDUCE_SUM), NT_EINVAL, "in[0]");
    BAD(nt_all_gather(c, &s0, out), NT_ESHAPE, "0-d");
    BAD(nt_reduce_scatter(c, &s0, out, NT_REDUCE_SUM), NT_ESHAPE, "0-d");
    BAD(nt_broadcast(c, &x, out, 1), NT_EINVAL, "root is 1");
    BAD(nt_broadcast(c, &x, out, -1), NT_EINVAL, "root is -1");
    BAD(nt_broadcast(c, (nt_tensor *[]){NULL}, out, 0), NT_EINVAL, "the root's input");
    BAD(nt_all_gather(c, &dead, out), NT_ERELEASED, "nt_all_gather");
    assert_int_equal(nt_sync(), 0);
    assert_true(nt__tensor_live_handles() == before); /* nothing made, nothing queued */
    /* a communicator of an earlier session */
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    x = nt_ones(NT_F32, 1, (int64_t[]){6});
    BAD(nt_all_reduce(c, &x, out, NT_REDUCE_SUM), NT_ESTATE, "before the last nt_shutdown");
    nt_comm_destroy(c);
    nt_release(x);
#undef BAD
}

/* A poisoned input: the outputs carry its error (the op that failed and
 * its line), as any op's do. */
static void test_poisoned_input(void **state)
{
    (void)state;
    nt_tensor *w = nt_ones(NT_F32, 2, (int64_t[]){3, 2});
    int32_t bad[1] = {9};
    nt_tensor *idx = nt_from_host(bad, NT_I32, 1, (int64_t[]){1});
    nt_tensor *e = nt_embedding(w, idx); /* fails when it runs */
    nt_comm *c = nt_comm_create((int[]){0}, 1);
    nt_tensor *out = NULL;
    assert_int_equal(nt_all_reduce(c, &e, &out, NT_REDUCE_SUM), 0);
    float v[2];
    assert_int_equal(nt_to_host(out, v, sizeof v), NT_ERANGE);
    assert_non_null(strstr(nt_last_error_message(), "nt_embedding"));
    nt_clear_error();
    nt_sync();
    nt_clear_error();
    nt_release(out);
    nt_release(e);
    nt_release(idx);
    nt_release(w);
    nt_comm_destroy(c);
}

/* Bad input across members (two devices). */
static void test_bad_input_members(void **state)
{
    (void)state;
    dev_set(0);
    nt_tensor *a0 = nt_ones(NT_F32, 1, (int64_t[]){6});
    nt_tensor *b0 = nt_ones(NT_F32, 1, (int64_t[]){3});
    dev_set(1);
    nt_tensor *a1 = nt_ones(NT_F32, 1, (int64_t[]){6});
    nt_tensor *s1 = nt_ones(NT_F32, 1, (int64_t[]){5});
    nt_tensor *i1 = nt_ones(NT_I32, 1, (int64_t[]){6});
    nt_tensor *b1 = nt_ones(NT_F32, 1, (int64_t[]){3});
    dev_set(0);
    assert_null(nt_comm_create((int[]){1, 1}, 2));
    assert_non_null(strstr(nt_last_error_message(), "distinct"));
    nt_comm *c = nt_comm_create((int[]){0, 1}, 2);
    assert_non_null(c);
    nt_tensor *out[2] = {(nt_tensor *)1, (nt_tensor *)1};
    assert_int_equal(nt_all_reduce(c, (nt_tensor *[]){a0, s1}, out, NT_REDUCE_SUM), NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "in[1] has shape [5]; in[0] has [6]"));
    assert_null(out[0]);
    assert_null(out[1]);
    assert_int_equal(nt_all_gather(c, (nt_tensor *[]){a0, i1}, out), NT_EDTYPE);
    assert_non_null(strstr(nt_last_error_message(), "in[1] is i32"));
    assert_int_equal(nt_all_reduce(c, (nt_tensor *[]){a0, a0}, out, NT_REDUCE_MAX), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "in[1] is on device 0; expected member 1's device 1"));
    assert_int_equal(nt_reduce_scatter(c, (nt_tensor *[]){b0, b1}, out, NT_REDUCE_SUM), NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "multiple of the communicator's 2 ranks"));
    assert_int_equal(nt_broadcast(c, (nt_tensor *[]){NULL, a1}, out, 0), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "in[0] is NULL; it is the root's input"));
    /* a NULL input of a member other than the root is fine */
    assert_int_equal(nt_broadcast(c, (nt_tensor *[]){NULL, s1}, out, 1), 0);
    float v[5];
    assert_int_equal(nt_tensor_device(out[0]), 0);
    assert_int_equal(nt_tensor_device(out[1]), 1);
    assert_int_equal(nt_to_host(out[0], v, sizeof v), 0);
    assert_true(v[0] == 1 && v[4] == 1);
    nt_release(out[0]);
    nt_release(out[1]);
    nt_comm_destroy(c);
    nt_tensor *all[] = {a0, b0, a1, s1, i1, b1};
    for (int i = 0; i < 6; i++)
        nt_release(all[i]);
    assert_int_equal(nt_sync(), 0);
}

/* A member that never arrives: the other's wait ends after
 * NT_COLLECTIVE_TIMEOUT with an error naming the collective, its line and
 * the missing member, and the late member finds the collective failed. */
static GMutex blk_lock;
static GCond blk_cond;
static bool blk_open;

static void blocker(void *arg)
{
    (void)arg;
    g_mutex_lock(&blk_lock);
    while (!blk_open)
        g_cond_wait(&blk_cond, &blk_lock);
    g_mutex_unlock(&blk_lock);
}

static void block_stream(nt_stream *s)
{
    nt__rec *r = nt__rec_alloc(s);
    assert_non_null(r);
    r->type = NT_REC_HOST;
    r->host_fn = blocker;
    r->host_arg = NULL;
    r->seq = nt__stream_next_seq(&s);
    r->sid = s->id;
    nt__stream_enqueue(s, r);
}

static void test_timeout(void **state)
{
    (void)state;
    const char *modes[] = {"eager", "adaptive", "lazy"};
    for (int m = 0; m < 3; m++) {
        nt_shutdown();
        setenv("NT_COLLECTIVE_TIMEOUT", "0.2", 1);
        assert_int_equal(nt_init(), 0);
        assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
        blk_open = false;
        dev_set(1);
        nt_tensor *x1 = nt_full(NT_F32, 1, (int64_t[]){8}, 2.0);
        block_stream(nt_stream_default_on(1)); /* device 1's stream stops here */
        dev_set(0);
        nt_tensor *x0 = nt_full(NT_F32, 1, (int64_t[]){8}, 1.0);
        nt_comm *c = nt_comm_create((int[]){0, 1}, 2);
        nt_tensor *out[2];
        int line = __LINE__ + 1;
        assert_int_equal(nt_all_reduce(c, (nt_tensor *[]){x0, x1}, out, NT_REDUCE_SUM), 0);
        float v[8];
        assert_int_equal(nt_to_host(out[0], v, sizeof v), NT_ETIMEDOUT);
        char where[64];
        snprintf(where, sizeof where, "test_collectives.c:%d", line);
        const char *msg = nt_last_error_message();
        if (!strstr(msg, "nt_all_reduce (at ") || !strstr(msg, where) ||
            !strstr(msg, "member 1 (device 1)") || !strstr(msg, "NT_COLLECTIVE_TIMEOUT"))
            fail_msg("mode %s: unexpected message '%s'", modes[m], msg);
        g_mutex_lock(&blk_lock);
        blk_open = true;
        g_cond_broadcast(&blk_cond);
        g_mutex_unlock(&blk_lock);
        assert_int_equal(nt_to_host(out[1], v, sizeof v), NT_ETIMEDOUT);
        nt_clear_error();
        nt_sync();
        nt_sync();
        nt_clear_error();
        /* the communicator still works */
        assert_int_equal(nt_all_reduce(c, (nt_tensor *[]){x0, x1}, out + 0, NT_REDUCE_SUM), 0);
        assert_int_equal(nt_to_host(out[1], v, sizeof v), 0);
        assert_true(v[0] == 3 && v[7] == 3);
        nt_release(out[0]);
        nt_release(out[1]);
        nt_release(x0);
        nt_release(x1);
        nt_comm_destroy(c);
        unsetenv("NT_COLLECTIVE_TIMEOUT");
    }
    nt_config_set("NT_MODE", "adaptive");
}

/* A member's input made on another device from an op its stream ran just
 * before the collective: device 1 copies what device 0 computed, then both
 * all-reduce.  Device 0's worker must mark its producer done before its
 * member waits, or device 1's copy (waiting for the producer) never runs
 * and the collective times out: members run in batches of their own
 * (NT_RECF_ALONE).  No timing: with the defect it is an NT_ETIMEDOUT. */
static void test_member_after_cross_device_producer(void **state)
{
    (void)state;
    const char *modes[] = {"eager", "adaptive", "lazy", "deterministic"};
    nt_comm *c = nt_comm_create((int[]){0, 1}, 2);
    assert_non_null(c);
    for (int m = 0; m < 4; m++) {
        bool det = !strcmp(modes[m], "deterministic");
        assert_int_equal(nt_config_set("NT_DETERMINISTIC", det ? "1" : "0"), 0);
        if (!det)
            assert_int_equal(nt_config_set("NT_MODE", modes[m]), 0);
        for (int it = 0; it < 20; it++) {
            nt_scope *sc = nt_scope_begin();
            dev_set(0);
            nt_tensor *a = nt_full(NT_F32, 1, (int64_t[]){4096}, 2.0);
            for (int k = 0; k < 8; k++)
                a = nt_add_scalar(a, 1.0);
            dev_set(1);
            nt_tensor *b = nt_to_device(a, 1);
            nt_tensor *out[2];
            assert_int_equal(nt_all_reduce(c, (nt_tensor *[]){a, b}, out, NT_REDUCE_SUM), 0);
            float v[2];
            assert_int_equal(nt_to_host(nt_slice(out[1], 0, 0, 2, 1), v, sizeof v), 0);
            assert_true(v[0] == 20.0f && v[1] == 20.0f);
            nt_scope_end(sc);
            dev_set(0);
        }
    }
    nt_config_set("NT_DETERMINISTIC", "0");
    nt_config_set("NT_MODE", "adaptive");
    nt_comm_destroy(c);
}

/* The simulated time: outputs are ready when the schedule over the
 * members' input-ready times ends, and a core's next collective starts no
 * earlier than its previous one ended. */
static void test_sim_time(void **state)
{
    (void)state;
    int n = ndev();
    int devs[64];
    nt_tensor *in[64], *out[64], *out2[64];
    for (int i = 0; i < n; i++) {
        devs[i] = i;
        dev_set(i);
        in[i] = nt_full(NT_F32, 1, (int64_t[]){1 << 16}, 1.0);
    }
    dev_set(0);
    assert_int_equal(nt_sync(), 0);
    double start = 0;
    for (int i = 0; i < n; i++)
        start = fmax(start, nt__storage_ready_get(in[i]->st));
    nt_comm *c = nt_comm_create(devs, n);
    assert_int_equal(nt_all_reduce(c, in, out, NT_REDUCE_SUM), 0);
    assert_int_equal(nt_all_reduce(c, in, out2, NT_REDUCE_SUM), 0);
    assert_int_equal(nt_sync(), 0);
    double f = 0, sched = 0;
    assert_int_equal(nt_collective_cost(NT_COLL_ALL_REDUCE, n, 4.0 * (1 << 16), &f, &sched), 0);
    for (int i = 0; i < n; i++) {
        double e1 = nt__storage_ready_get(out[i]->st), e2 = nt__storage_ready_get(out2[i]->st);
        assert_true(e1 > start && e1 <= start + sched * 1.0001 + 1);
        /* the second waits for the first on every core's collective engine */
        assert_true(e2 >= e1 + sched * 0.9999 - 1);
        nt_release(out[i]);
        nt_release(out2[i]);
        nt_release(in[i]);
    }
    nt_comm_destroy(c);
}

/* NT_TRACE: each core's track group gets a span per collective. */
static void test_trace(void **state)
{
    (void)state;
    nt_shutdown();
    char path[] = "/tmp/nt_coll_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    setenv("NT_TRACE", path, 1);
    assert_int_equal(nt_init(), 0);
    nt_tensor *in[2], *out[2];
    for (int i = 0; i < 2; i++) {
        dev_set(i);
        in[i] = nt_full(NT_F32, 1, (int64_t[]){1024}, 1.0);
    }
    dev_set(0);
    nt_comm *c = nt_comm_create((int[]){0, 1}, 2);
    assert_int_equal(nt_reduce_scatter(c, in, out, NT_REDUCE_MAX), 0);
    assert_int_equal(nt_sync(), 0);
    for (int i = 0; i < 2; i++) {
        nt_release(in[i]);
        nt_release(out[i]);
    }
    nt_comm_destroy(c);
    nt_shutdown();
    unsetenv("NT_TRACE");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    unlink(path);
    assert_non_null(strstr(buf, "\"name\":\"reduce_scatter max\""));
    assert_non_null(strstr(buf, "\"rank\":1,\"ranks\":2"));
    assert_non_null(strstr(buf, "\"collectives\""));
    assert_int_equal(nt_init(), 0);
}

/* ------------------------------------------------------------------ */
/* One enqueue path: a collective's member is queued as any op is      */
/* ------------------------------------------------------------------ */

/* A host record that notes it ran. */
static bool host_ran;
static void note_run(void *arg)
{
    *(bool *)arg = true;
}

static void unblock(void)
{
    g_mutex_lock(&blk_lock);
    blk_open = true;
    g_cond_broadcast(&blk_cond);
    g_mutex_unlock(&blk_lock);
}

/* A failed assertion while a stream is blocked must not hang the shutdown. */
static int unblock_teardown(void **state)
{
    unblock();
    return nt_test_teardown(state);
}

/* How many of the trace's host instants (one event a line) are named
 * `name`; *with: how many of those contain `with`. */
static int trace_instants(const char *text, const char *name, const char *with, int *nwith)
{
    char nm[96];
    snprintf(nm, sizeof nm, "\"name\":\"%s\"", name);
    int count = 0;
    *nwith = 0;
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char *line = g_strndup(l, len);
        if (strstr(line, "\"ph\":\"i\",\"s\":\"t\",\"pid\":2,") && strstr(line, nm)) {
            count++;
            *nwith += strstr(line, with) != NULL;
        }
        g_free(line);
        l += len + (e != NULL);
    }
    return count;
}

/* Collectives go through the dispatcher's enqueue (nt__rec_enqueue): each
 * member's record is an instant on the host track of the NT_TRACE file,
 * naming the collective and its call site and the other stream's work it
 * waits for; and the path waits once per writer, however often the record
 * reads its output. */
static void test_enqueue_path(void **state)
{
    (void)state;
    nt_shutdown();
    char path[] = "/tmp/nt_coll_htrace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    setenv("NT_TRACE", path, 1);
    assert_int_equal(nt_init(), 0);
    dev_set(0);
    /* a's writer stays queued on s2 (behind a blocked record) meanwhile */
    nt_stream *s2 = nt_stream_create();
    assert_non_null(s2);
    blk_open = false;
    block_stream(s2);
    assert_int_equal(nt_stream_set_current(s2), 0);
    nt_tensor *a = nt_full(NT_F32, 1, (int64_t[]){64}, 1.0);
    assert_int_equal(nt_stream_set_current(nt_stream_default()), 0);
    uint64_t aw = AO_load(&a->st->last_write);
    assert_int_equal(NT__PACK_SID(aw), s2->id);
    assert_false(nt__packed_done(aw));

    /* a record that reads a twice waits for its writer once */
    nt_stream *s = nt__stream_current();
    nt__rec *r = nt__rec_alloc(s);
    assert_non_null(r);
    r->type = NT_REC_HOST;
    r->host_fn = note_run;
    r->host_arg = &host_ran;
    r->fn = "test_enqueue_path";
    r->site = (nt_site){"test_collectives.c", "test_enqueue_path", __LINE__, NULL};
    nt__tensor_iref(a);
    nt__tensor_iref(a);
    r->in[0] = r->in[1] = a;
    r->nin = 2;
    host_ran = false;
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    uint64_t before = st.ops_enqueued;
    nt__rec_enqueue(r, &s, false);
    /* r cannot run (nor its worker clear its waits) before a's writer
     * has, which waits for the blocker: its fields are still as queued
     * (checked once the blocker is open) */
    int r_ndeps = r->ndeps;
    uint64_t r_dep0 = r->deps[0];

    /* a collective whose member 0 reads a */
    dev_set(1);
    nt_tensor *b = nt_full(NT_F32, 1, (int64_t[]){64}, 2.0);
    dev_set(0);
    nt_comm *c = nt_comm_create((int[]){0, 1}, 2);
    assert_non_null(c);
    nt_tensor *out[2];
    int line = __LINE__ + 1;
    assert_int_equal(nt_all_reduce(c, (nt_tensor *[]){a, b}, out, NT_REDUCE_SUM), 0);
    unblock();
    assert_int_equal(r_ndeps, 1);
    assert_true(r_dep0 == aw);
    float v[64];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(nt_to_host(out[i], v, sizeof v), 0);
        assert_true(v[0] == 3.0f && v[63] == 3.0f);
    }
    assert_int_equal(nt_sync(), 0);
    assert_true(host_ran);
    /* the host record, the collective's two members and b's fill */
    assert_int_equal(nt_stats_get(&st), 0);
    assert_int_equal(st.ops_enqueued - before, 4);
    char waits[96];
    snprintf(waits, sizeof waits, "\"waits_for\":\"%s seq %llu\"", s2->name,
             (unsigned long long)NT__PACK_SEQ(aw));
    nt_tensor *all[] = {a, b, out[0], out[1]};
    for (int i = 0; i < 4; i++)
        nt_release(all[i]);
    nt_comm_destroy(c);
    assert_int_equal(nt_stream_destroy(s2), 0);
    nt_shutdown(); /* closes the trace */
    unsetenv("NT_TRACE");
    assert_int_equal(nt_init(), 0);

    char *text = NULL;
    assert_true(g_file_get_contents(path, &text, NULL, NULL));
    unlink(path);
    char where[64];
    snprintf(where, sizeof where, "test_collectives.c:%d", line);
    int nwith;
    /* one instant per member, at the user's line */
    assert_int_equal(trace_instants(text, "nt_all_reduce", where, &nwith), 2);
    assert_int_equal(nwith, 2);
    /* member 0 waits for a's writer on s2 (the whole list: one entry);
     * member 1, whose input its own stream wrote, for nothing */
    assert_int_equal(trace_instants(text, "nt_all_reduce", "\"waits_for\"", &nwith), 2);
    assert_int_equal(nwith, 1);
    assert_int_equal(trace_instants(text, "nt_all_reduce", waits, &nwith), 2);
    assert_int_equal(nwith, 1);
    /* the record that reads a twice: one entry too */
    assert_int_equal(trace_instants(text, "test_enqueue_path", waits, &nwith), 1);
    assert_int_equal(nwith, 1);
    g_free(text);
}

int main(void)
{
    /* four cores: members 1..4 in every test (unless the caller set it) */
    setenv("NT_SIM_CORES", "4", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_every_dtype_op),
        cmocka_unit_test(test_tree_edges),
        cmocka_unit_test(test_tree_composes),
        cmocka_unit_test(test_cost_formula_vs_schedule),
        cmocka_unit_test_setup_teardown(test_cost_public, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_env_settings, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_ops_every_mode_backend, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_inputs_released_early, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_poisoned_input, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_input_members, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_timeout, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_member_after_cross_device_producer, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sim_time, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_trace, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_path, nt_test_setup, unblock_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
