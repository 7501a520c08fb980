/* tests/test_foreach.c - foreach kernels (fusion/plan.c, "sharing a kernel";
 * neuron/foreach.c): an optimizer step's per-parameter updates, gradient
 * clipping's scaling and the loss scaler's unscale run as a few shared
 * kernels instead of one each, with the bits of the per-parameter kernels
 * (NT_FOREACH=0) on both backends, in every mode and captured; the kernel
 * counts drop as designed; errors stay with the parameter they belong to. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "sim/sim.h"

/* Parameters of odd sizes: one element, 3x5x7, one past a 2048 block, a
 * row of 33, a large one (past the 1M elements a program may have to
 * share a kernel: it runs alone), and bf16 ones. */
#define NP 41
enum { BIG = NP - 1 };
static void pshape(int i, int *nd, int64_t sh[3])
{
    static const int64_t s[8][3] = {{1, 0, 0},  {3, 5, 7},  {1, 2049, 0}, {130, 33, 0},
                                    {17, 0, 0}, {4, 6, 0},  {2, 3, 5},    {64, 64, 0}};
    static const int nds[8] = {1, 3, 2, 2, 1, 2, 3, 2};
    if (i == BIG) {
        *nd = 2, sh[0] = 1030, sh[1] = 1031;
        return;
    }
    *nd = nds[i % 8];
    memcpy(sh, s[i % 8], sizeof s[0]);
}
static nt_dtype pdtype(int i) { return i % 11 == 3 ? NT_BF16 : NT_F32; }

static int64_t pnumel(int i)
{
    int nd;
    int64_t sh[3];
    pshape(i, &nd, sh);
    return nt_test_numel(nd, sh);
}

static int64_t total_numel(void)
{
    int64_t n = 0;
    for (int i = 0; i < NP; i++)
        n += pnumel(i);
    return n;
}

enum { K_ADAMW, K_SGD, K_ADAMW_CLIP, K_SCALER, K_COUNT };
static const char *const kind_name[K_COUNT] = {"adamw", "sgd", "adamw+clip", "scaler+adam"};
#define STEPS 4

typedef struct world {
    nt_tensor *p[NP], *c[NP];
    nt_optim *opt;
    nt_grad_scaler *sc;
    int kind;
} world;

static nt_tensor *seeded(int i, uint64_t seed, float scale)
{
    int nd;
    int64_t sh[3];
    pshape(i, &nd, sh);
    int64_t n = pnumel(i);
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1;
    nt_test_fill(v, (size_t)n, &st);
    for (int64_t j = 0; j < n; j++)
        v[j] *= scale * (float)(1 + i % 5);
    nt_tensor *t = nt_cast(nt_from_host(v, NT_F32, nd, sh), pdtype(i));
    free(v);
    assert_non_null(t);
    return nt_keep(nt_contiguous(t));
}

static void world_make(world *w, int kind)
{
    memset(w, 0, sizeof *w);
    w->kind = kind;
    for (int i = 0; i < NP; i++) {
        w->p[i] = seeded(i, 1, 0.5f);
        w->c[i] = seeded(i, 2, 0.25f);
        assert_int_equal(nt_set_requires_grad(w->p[i], true), 0);
    }
    if (kind == K_SGD) {
        w->opt = nt_optim_sgd(w->p, NP, 0.05, 0.9, 0.01, false);
    } else if (kind == K_SCALER) {
        w->opt = nt_optim_adam(w->p, NP, 0.01, 0.9, 0.99, 1e-8, 0.01, 0);
        nt_grad_scaler_opts o = {0};
        o.init_scale = 1024.0;
        o.growth_factor = 2.0;
        o.backoff_factor = 0.5;
        o.growth_interval = 2;
        w->sc = nt_grad_scaler_create(&o);
        assert_non_null(w->sc);
    } else {
        w->opt = nt_optim_adamw(w->p, 20, 0.01, 0.9, 0.95, 1e-8, 0.1);
        assert_non_null(w->opt);
        assert_true(nt_optim_add_group(w->opt, w->p + 20, NP - 20, 0.02, 0.0) > 0);
    }
    assert_non_null(w->opt);
}

static void world_free(world *w)
{
    nt_optim_destroy(w->opt);
    if (w->sc)
        nt_grad_scaler_destroy(w->sc);
    for (int i = 0; i < NP; i++)
        nt_release(w->p[i]), nt_release(w->c[i]);
}

/* One training step: loss = sum_i sum(p_i * c_i * (1 + p_i)), its
 * backward, then the kind's clipping / scaling and update. */
static int step(world *w)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *loss = NULL;
    for (int i = 0; i < NP; i++) {
        nt_tensor *pi = nt_cast(w->p[i], NT_F32), *ci = nt_cast(w->c[i], NT_F32);
        nt_tensor *li = nt_sum(nt_mul(nt_mul(pi, ci), nt_add_scalar(pi, 1.0)), NT_DIM_ALL, false);
        loss = loss ? nt_add(loss, li) : li;
    }
    int rc;
    if (w->kind == K_SCALER) {
        rc = !loss || nt_backward(nt_grad_scaler_scale(w->sc, loss)) ||
             nt_grad_scaler_step(w->sc, w->opt) || nt_grad_scaler_update(w->sc);
    } else {
        rc = !loss || nt_backward(loss);
        if (!rc && w->kind == K_ADAMW_CLIP)
            rc = !nt_clip_grad_norm(w->p, NP, 0.5);
        if (!rc)
            rc = nt_optim_step(w->opt);
    }
    rc = rc || nt_optim_zero_grad(w->opt);
    nt_scope_end(s);
    return rc ? (nt_last_error() ? nt_last_error() : -1) : 0;
}

typedef struct res {
    float *params;
    uint64_t kernels_last; /* kernels of the last step (NT_STATS' counter) */
    int64_t graph_kernels; /* a replay's, captured */
} res;

/* STEPS steps (captured: step 0 eagerly, step 1 captured, the rest
 * replayed, the lr changed before each), the parameters after. */
static void run(int kind, const char *be, const char *mode, bool capture, bool foreach, res *r)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", be), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(be, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_FOREACH", foreach ? "1" : "0"), 0);
    world w;
    world_make(&w, kind);
    nt_graph *g = NULL;
    r->graph_kernels = -1;
    for (int k = 0; k < STEPS; k++) {
        if (kind != K_SCALER)
            assert_int_equal(nt_optim_set_lr(w.opt, 0.01 * (1.0 + 0.5 * k)), 0);
        assert_int_equal(nt_sync(), 0);
        nt_stats_reset();
        if (!capture || k == 0 || kind == K_SCALER) {
            assert_int_equal(step(&w), 0);
        } else if (k == 1) {
            assert_int_equal(nt_graph_capture_begin(), 0);
            assert_int_equal(step(&w), 0);
            g = nt_graph_capture_end();
            assert_non_null(g);
        } else {
            assert_int_equal(nt_graph_replay(g), 0);
        }
        assert_int_equal(nt_sync(), 0);
        nt_stats st;
        assert_int_equal(nt_stats_get(&st), 0);
        r->kernels_last = st.kernels_launched;
    }
    if (g) {
        nt_graph_info gi;
        assert_int_equal(nt_graph_info_get(g, &gi), 0);
        r->graph_kernels = gi.kernels;
        nt_graph_destroy(g);
    }
    int64_t n = total_numel();
    r->params = malloc((size_t)n * sizeof *r->params);
    assert_non_null(r->params);
    for (int i = 0, off = 0; i < NP; i++) {
        nt_tensor *c = nt_cast(w.p[i], NT_F32);
        assert_int_equal(nt_to_host(c, r->params + off, (size_t)pnumel(i) * sizeof(float)), 0);
        nt_release(c);
        off += (int)pnumel(i);
    }
    world_free(&w);
    assert_int_equal(nt_sync(), 0);
}

static void expect_bits(const res *a, const res *b, const char *what)
{
    int64_t n = total_numel();
    for (int64_t j = 0; j < n; j++)
        if (nt_test_ubits(a->params[j]) != nt_test_ubits(b->params[j]))
            fail_msg("%s: parameter element %lld is %08x, the per-parameter kernels' %08x", what,
                     (long long)j, nt_test_ubits(a->params[j]), nt_test_ubits(b->params[j]));
}

/* Every kind, both backends, every mode and captured: the same bits as the
 * per-parameter kernels (NT_FOREACH=0, deterministic, CPU). */
static void same_bits_kind(int kind)
{
    res ref;
    run(kind, "cpu", "deterministic", false, false, &ref);
    static const char *const modes[] = {"deterministic", "eager", "adaptive", "lazy", "lazy"};
    static const char *const bes[] = {"cpu", "sim"};
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 5; m++) {
            bool cap = m == 4;
            if (cap && kind == K_SCALER)
                continue; /* the scaler reads its flag on the host: not capturable */
            res r;
            run(kind, bes[b], modes[m], cap, true, &r);
            char what[128];
            snprintf(what, sizeof what, "%s, %s, %s", kind_name[kind], bes[b],
                     cap ? "captured" : modes[m]);
            expect_bits(&r, &ref, what);
            free(r.params);
        }
    free(ref.params);
}

static void test_adamw_same_bits(void **state)
{
    (void)state;
    same_bits_kind(K_ADAMW);
}

static void test_sgd_same_bits(void **state)
{
    (void)state;
    same_bits_kind(K_SGD);
}

static void test_clip_same_bits(void **state)
{
    (void)state;
    same_bits_kind(K_ADAMW_CLIP);
}

static void test_scaler_same_bits(void **state)
{
    (void)state;
    same_bits_kind(K_SCALER);
}

/* Lazy mode on the simulator: the update's 41 per-parameter kernels become
 * one shared one (64 a kernel; the big parameter runs alone), and the
 * clipping's 41 scalings likewise; a captured replay runs the same. */
static void test_kernel_counts(void **state)
{
    (void)state;
    for (int kind = K_ADAMW; kind <= K_ADAMW_CLIP; kind++) {
        res off, on, coff, con;
        run(kind, "sim", "lazy", false, false, &off);
        run(kind, "sim", "lazy", false, true, &on);
        run(kind, "sim", "lazy", true, false, &coff);
        run(kind, "sim", "lazy", true, true, &con);
        /* per stage: NP - 1 small programs in one kernel, the big one
         * alone: NP - 2 fewer */
        int stages = kind == K_ADAMW_CLIP ? 2 : 1;
        print_message("# %s: kernels a step %llu -> %llu, a replay %lld -> %lld\n", kind_name[kind],
                      (unsigned long long)off.kernels_last, (unsigned long long)on.kernels_last,
                      (long long)coff.graph_kernels, (long long)con.graph_kernels);
        assert_true(off.kernels_last - on.kernels_last >= (uint64_t)(stages * (NP - 2)));
        assert_true(coff.graph_kernels - con.graph_kernels >= stages * (NP - 2));
        assert_int_equal((int64_t)con.kernels_last, con.graph_kernels);
        expect_bits(&on, &off, "lazy");
        expect_bits(&con, &coff, "captured");
        free(off.params), free(on.params), free(coff.params), free(con.params);
    }
}

/* Gradient clipping alone on 12 f32 gradients [8, 16]: its 3 grad_norms
 * records (four gradients each) share one kernel, op by op (lazy) and in
 * a captured replay, on both backends; the clipped
 * gradients are the bits of the per-parameter kernels and the norm a host
 * computation's to f32 rounding. */
#define CN 12
typedef struct clipres {
    float g[CN][128];
    float total;
    uint64_t kernels, fk, fp; /* the clip's kernels; foreach kernels, programs */
    int64_t graph_kernels;
} clipres;

static void clip_run(const char *be, bool capture, bool foreach, clipres *r)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", be), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(be, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    assert_int_equal(nt_config_set("NT_FOREACH", foreach ? "1" : "0"), 0);
    nt_tensor *p[CN];
    float v[128];
    for (int i = 0; i < CN; i++) {
        uint64_t st = 77 + (uint64_t)i;
        nt_test_fill(v, 128, &st);
        p[i] = nt_keep(nt_from_host(v, NT_F32, 2, (int64_t[]){8, 16}));
        assert_int_equal(nt_set_requires_grad(p[i], true), 0);
    }
    nt_scope *sc = nt_scope_begin();
    nt_tensor *loss = NULL;
    for (int i = 0; i < CN; i++) { /* d loss / d p_i = (i + 1) p_i */
        nt_tensor *li = nt_sum(nt_mul_scalar(nt_mul(p[i], p[i]), 0.5 * (i + 1)), NT_DIM_ALL, false);
        loss = loss ? nt_add(loss, li) : li;
    }
    assert_int_equal(nt_backward(loss), 0);
    nt_scope_end(sc);
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_graph *g = NULL;
    if (capture)
        assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *total = nt_clip_grad_norm(p, CN, 0.5);
    assert_non_null(total);
    if (capture) {
        g = nt_graph_capture_end();
        assert_non_null(g);
    }
    assert_int_equal(nt_sync(), 0);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    r->kernels = st.kernels_launched;
    r->fk = st.foreach_kernels, r->fp = st.foreach_programs;
    r->graph_kernels = -1;
    if (g) {
        nt_graph_info gi;
        assert_int_equal(nt_graph_info_get(g, &gi), 0);
        r->graph_kernels = gi.kernels;
        nt_graph_destroy(g);
    }
    assert_int_equal(nt_to_host(total, &r->total, sizeof r->total), 0);
    for (int i = 0; i < CN; i++) {
        nt_tensor *gi = nt_grad(p[i]);
        assert_non_null(gi);
        assert_int_equal(nt_to_host(gi, r->g[i], sizeof r->g[i]), 0);
        nt_release(gi), nt_release(p[i]);
    }
    nt_release(total);
}

static void test_clip_norms_share(void **state)
{
    (void)state;
    /* the host's reference: grad_i = (i + 1) p_i, total its 2-norm */
    double ss = 0;
    for (int i = 0; i < CN; i++) {
        float v[128];
        uint64_t st = 77 + (uint64_t)i;
        nt_test_fill(v, 128, &st);
        for (int j = 0; j < 128; j++)
            ss += (double)v[j] * (i + 1) * v[j] * (i + 1);
    }
    double total = sqrt(ss);
    static const char *const bes[] = {"cpu", "sim"};
    for (int b = 0; b < 2; b++)
        for (int cap = 0; cap < 2; cap++) {
            clipres off, on;
            clip_run(bes[b], cap, false, &off);
            clip_run(bes[b], cap, true, &on);
            print_message("# clip on %s%s: kernels %llu -> %llu, a replay %lld -> %lld\n",
                          bes[b], cap ? ", captured" : "", (unsigned long long)off.kernels,
                          (unsigned long long)on.kernels, (long long)off.graph_kernels,
                          (long long)on.graph_kernels);
            assert_true(fabs(on.total - total) <= 1e-5 * total);
            assert_true(nt_test_ubits(on.total) == nt_test_ubits(off.total));
            for (int i = 0; i < CN; i++)
                for (int j = 0; j < 128; j++)
                    if (nt_test_ubits(on.g[i][j]) != nt_test_ubits(off.g[i][j]))
                        fail_msg("%s: gradient %d element %d is %08x, unshared %08x", bes[b], i,
                                 j, nt_test_ubits(on.g[i][j]), nt_test_ubits(off.g[i][j]));
            /* the 3 grad_norms in one kernel: 2 fewer (the 12 scalings, of
             * one shape, are one elementwise kernel either way) */
            assert_true(off.kernels >= on.kernels + 2);
            assert_true(on.fp >= 3);
            assert_true(on.fk >= 1);
            if (cap) {
                assert_true(off.graph_kernels >= on.graph_kernels + 2);
                assert_int_equal((int64_t)on.kernels, on.graph_kernels);
            }
        }
    /* the clipped gradients against the host: g_i * min(1, 0.5 / total) */
    clipres r;
    clip_run("sim", true, true, &r);
    double coef = fmin(1.0, 0.5 / (total + 1e-6));
    for (int i = 0; i < CN; i++) {
        float v[128];
        uint64_t st = 77 + (uint64_t)i;
        nt_test_fill(v, 128, &st);
        for (int j = 0; j < 128; j++) {
            double want = (double)v[j] * (i + 1) * coef;
            assert_true(fabs(r.g[i][j] - want) <= 1e-5 * fabs(want) + 1e-7);
        }
    }
}

/* Two layer norms with a linear layer between them, l = sum(LN2(LN1(x)
 * W^T) * c).  The backward runs LN2's bias sum and row kernel, LN2's weight
 * sum (which reads that kernel's output, so it cannot share it), the linear
 * layer's two matmuls, then LN1's bias sum, row kernel and weight sum.  The
 * matmuls touch nothing the queue holds and pass it (fusion/plan.c,
 * join_passes), so LN2's weight sum waits and shares LN1's kernel: a
 * foreach kernel of 3 programs, one kernel fewer than when the matmuls
 * flushed the queue.  Lazy mode on both backends; the gradients are the
 * bits of the per-op kernels (NT_FOREACH=0) and of deterministic mode, and
 * LN2's bias gradient is the host's column sums of c. */
enum { PR = 128, PC = 32 };
typedef struct passrun {
    const float *x, *w, *c;
    float gx[PR * PC], gw1[PC], gw2[PC], gb1[PC], gb2[PC], gm[PC * PC];
    uint64_t kernels, fp;
} passrun;

static void pass_body(void *arg)
{
    passrun *r = arg;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *x = nt_from_host(r->x, NT_F32, 2, (int64_t[]){PR, PC});
    nt_tensor *m = nt_from_host(r->w, NT_F32, 2, (int64_t[]){PC, PC});
    nt_tensor *c = nt_from_host(r->c, NT_F32, 2, (int64_t[]){PR, PC});
    nt_tensor *w1 = nt_full(NT_F32, 1, (int64_t[]){PC}, 1.5);
    nt_tensor *b1 = nt_full(NT_F32, 1, (int64_t[]){PC}, 0.25);
    nt_tensor *w2 = nt_full(NT_F32, 1, (int64_t[]){PC}, 0.75);
    nt_tensor *b2 = nt_full(NT_F32, 1, (int64_t[]){PC}, -0.5);
    nt_tensor *ps[] = {x, m, w1, b1, w2, b2};
    for (int i = 0; i < 6; i++)
        assert_int_equal(nt_set_requires_grad(ps[i], true), 0);
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_tensor *h = nt_linear(nt_layer_norm(x, w1, b1, 1e-5), m, NULL);
    nt_tensor *l = nt_sum(nt_mul(nt_layer_norm(h, w2, b2, 1e-5), c), NT_DIM_ALL, false);
    assert_non_null(l);
    assert_int_equal(nt_backward(l), 0);
    float *dst[] = {r->gx, r->gm, r->gw1, r->gb1, r->gw2, r->gb2};
    size_t n[] = {sizeof r->gx, sizeof r->gm, sizeof r->gw1, sizeof r->gb1, sizeof r->gw2,
                  sizeof r->gb2};
    for (int i = 0; i < 6; i++)
        assert_int_equal(nt_to_host(nt_grad(ps[i]), dst[i], n[i]), 0);
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    r->kernels = st.kernels_launched, r->fp = st.foreach_programs;
    nt_scope_end(sc);
}

static void expect_pass_bits(const passrun *a, const passrun *b)
{
    assert_memory_equal(a->gx, b->gx, sizeof a->gx);
    assert_memory_equal(a->gm, b->gm, sizeof a->gm);
    assert_memory_equal(a->gw1, b->gw1, sizeof a->gw1);
    assert_memory_equal(a->gb1, b->gb1, sizeof a->gb1);
    assert_memory_equal(a->gw2, b->gw2, sizeof a->gw2);
    assert_memory_equal(a->gb2, b->gb2, sizeof a->gb2);
}

static void test_sum_waits_past_matmuls(void **state)
{
    (void)state;
    static float x[PR * PC], w[PC * PC], c[PR * PC];
    uint64_t st = 0x5a3;
    nt_test_fill(x, PR * PC, &st);
    nt_test_fill(w, PC * PC, &st);
    nt_test_fill(c, PR * PC, &st);
    static passrun det, lazy, alone, first;
    static const char *const bes[] = {"cpu", "sim"};
    for (int b = 0; b < 2; b++) {
        det = (passrun){.x = x, .w = w, .c = c};
        lazy = det, alone = det;
        assert_int_equal(nt_config_set("NT_BACKEND", bes[b]), 0);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", b ? "1" : "0"), 0);
        assert_int_equal(nt_config_set("NT_MODE", "deterministic"), 0);
        pass_body(&det);
        assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
        char *log = nt_test_fusion_log(pass_body, &lazy);
        assert_non_null(strstr(log, "foreach kernel of 3 programs"));
        free(log);
        assert_int_equal(nt_config_set("NT_FOREACH", "0"), 0);
        pass_body(&alone);
        assert_int_equal(nt_config_set("NT_FOREACH", "1"), 0);
        print_message("# %s: kernels %llu unshared, %llu shared (%llu programs)\n", bes[b],
                      (unsigned long long)alone.kernels, (unsigned long long)lazy.kernels,
                      (unsigned long long)lazy.fp);
        assert_int_equal(alone.fp, 0);
        assert_true(lazy.kernels + 3 <= alone.kernels);
        expect_pass_bits(&lazy, &det);
        expect_pass_bits(&alone, &det);
        if (b == 0)
            first = det;
        else
            expect_pass_bits(&det, &first);
    }
    for (int j = 0; j < PC; j++) { /* d l / d b2 = the column sums of c */
        double s = 0;
        for (int i = 0; i < PR; i++)
            s += c[i * PC + j];
        assert_true(fabs(first.gb2[j] - s) <= 1e-5 * (1 + fabs(s)));
    }
}

/* Under bf16 autocast each linear layer's f32 bias gets its gradient as a
 * bf16 sum over dY's rows, which the autograd engine casts back to f32 for
 * the leaf.  The cast reads the sum just before it, so it cannot share the
 * sum's kernel, and alone it was a kernel of its own.  A lone cast now waits
 * in the queue as a unary op does (fusion/plan.c, join_kind): the matmuls
 * pass it, and it shares a kernel with the next layer's bias sum.  Three
 * layers, l = sum(lin3(gelu(lin2(gelu(lin1(x))))) * c), lazy mode on both
 * backends: at least two kernels fewer than with NT_FOREACH=0, and the
 * gradients are the bits of NT_FOREACH=0, NT_FUSION=0 and deterministic
 * mode; the last bias's gradient is the column sums of c (rounded to bf16
 * on the way, as the sum's result is bf16) within the roundings' bound. */
enum { BR = 256, BR_BIG = 16448, BC = 64, BL = 3 };
typedef struct biasrun {
    const float *x, *w, *c;
    int64_t rows;
    float gw[BL][BC * BC], gb[BL][BC];
    uint64_t kernels, fp;
} biasrun;

static void bias_body(void *arg)
{
    biasrun *r = arg;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *h = nt_from_host(r->x, NT_F32, 2, (int64_t[]){r->rows, BC});
    nt_tensor *c = nt_from_host(r->c, NT_F32, 2, (int64_t[]){r->rows, BC});
    nt_tensor *w[BL], *b[BL];
    for (int i = 0; i < BL; i++) {
        w[i] = nt_from_host(r->w + i * BC * BC, NT_F32, 2, (int64_t[]){BC, BC});
        b[i] = nt_full(NT_F32, 1, (int64_t[]){BC}, 0.125 * (i + 1));
        assert_int_equal(nt_set_requires_grad(w[i], true), 0);
        assert_int_equal(nt_set_requires_grad(b[i], true), 0);
    }
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    for (int i = 0; i < BL; i++) {
        h = nt_linear(h, w[i], b[i]);
        if (i + 1 < BL)
            h = nt_gelu(h);
    }
    assert_int_equal(nt_autocast_end(), 0);
    assert_int_equal(nt_dtype_of(h), NT_BF16);
    nt_tensor *l = nt_sum(nt_mul(h, c), NT_DIM_ALL, false);
    assert_non_null(l);
    assert_int_equal(nt_backward(l), 0);
    for (int i = 0; i < BL; i++) {
        assert_int_equal(nt_dtype_of(nt_grad(b[i])), NT_F32);
        assert_int_equal(nt_to_host(nt_grad(w[i]), r->gw[i], sizeof r->gw[i]), 0);
        assert_int_equal(nt_to_host(nt_grad(b[i]), r->gb[i], sizeof r->gb[i]), 0);
    }
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    r->kernels = st.kernels_launched, r->fp = st.foreach_programs;
    nt_scope_end(sc);
}

static void expect_bias_bits(const biasrun *a, const biasrun *b)
{
    assert_memory_equal(a->gw, b->gw, sizeof a->gw);
    assert_memory_equal(a->gb, b->gb, sizeof a->gb);
}

static void bias_case(int64_t rows, uint64_t fewer)
{
    static float x[BR_BIG * BC], w[BL * BC * BC], c[BR_BIG * BC];
    uint64_t st = 0xb16;
    nt_test_fill(x, (size_t)(rows * BC), &st);
    nt_test_fill(w, BL * BC * BC, &st);
    nt_test_fill(c, (size_t)(rows * BC), &st);
    for (int i = 0; i < BL * BC * BC; i++)
        w[i] *= 0.125f;
    static biasrun det, lazy, alone, unfused, first;
    static const char *const bes[] = {"cpu", "sim"};
    for (int be = 0; be < 2; be++) {
        det = (biasrun){.x = x, .w = w, .c = c, .rows = rows};
        lazy = det, alone = det, unfused = det;
        assert_int_equal(nt_config_set("NT_BACKEND", bes[be]), 0);
        assert_int_equal(nt_config_set("NT_REQUIRE_SIM", be ? "1" : "0"), 0);
        assert_int_equal(nt_config_set("NT_MODE", "deterministic"), 0);
        bias_body(&det);
        assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
        bias_body(&lazy);
        assert_int_equal(nt_config_set("NT_FOREACH", "0"), 0);
        bias_body(&alone);
        assert_int_equal(nt_config_set("NT_FOREACH", "1"), 0);
        assert_int_equal(nt_config_set("NT_FUSION", "0"), 0);
        bias_body(&unfused);
        assert_int_equal(nt_config_set("NT_FUSION", "1"), 0);
        print_message("# %s: kernels %llu unshared, %llu shared (%llu programs)\n", bes[be],
                      (unsigned long long)alone.kernels, (unsigned long long)lazy.kernels,
                      (unsigned long long)lazy.fp);
        assert_int_equal(alone.fp, 0);
        assert_true(lazy.kernels + fewer <= alone.kernels);
        expect_bias_bits(&lazy, &det);
        expect_bias_bits(&alone, &det);
        expect_bias_bits(&unfused, &det);
        if (be == 0)
            first = det;
        else
            expect_bias_bits(&det, &first);
    }
    /* d l / d b3: the column sums of bf16(c) (the gradient reaching the
     * bf16 output), summed in f32 and rounded to bf16 (2^-9 relative) */
    for (int j = 0; j < BC; j++) {
        double s = 0, sa = 0;
        for (int64_t i = 0; i < rows; i++) {
            uint32_t u = nt_test_ubits(c[i * BC + j]);
            float v = nt_test_fbits((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
            s += v, sa += fabs(v);
        }
        assert_true(fabs(first.gb[BL - 1][j] - s) <= 0x1p-8 * fabs(s) + 0x1p-16 * sa);
    }
}

static void test_bias_casts_share(void **state)
{
    (void)state;
    bias_case(BR, 2);
}

/* The same with sums too big to wait in the queue (BR_BIG * BC elements
 * read: past the 1M a program may have to share a kernel).  Such a sum,
 * touching nothing the queue holds, runs before it (fusion/plan.c,
 * passes_kind) where it flushed it and left a waiting cast to run alone:
 * three kernels fewer than NT_FOREACH=0 (two when the sums flushed). */
static void test_bias_casts_pass_big_sums(void **state)
{
    (void)state;
    assert_true((int64_t)BR_BIG * BC > 1 << 20);
    bias_case(BR_BIG, 3);
}

/* A parameter whose gradient failed: its update fails with the first
 * error, the others update with their usual bits, whether or not the
 * updates share kernels. */
static void test_poisoned_gradient(void **state)
{
    (void)state;
    float got[2][64 * 64];
    for (int f = 0; f < 2; f++) {
        nt_shutdown();
        assert_int_equal(nt_init(), 0);
        assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
        assert_int_equal(nt_config_set("NT_FOREACH", f ? "1" : "0"), 0);
        world w;
        world_make(&w, K_ADAMW);
        nt_scope *s = nt_scope_begin();
        nt_tensor *loss = NULL;
        for (int i = 0; i < NP; i++) {
            nt_tensor *li = nt_sum(nt_mul(nt_cast(w.p[i], NT_F32), nt_cast(w.c[i], NT_F32)),
                                   NT_DIM_ALL, false);
            loss = loss ? nt_add(loss, li) : li;
        }
        assert_int_equal(nt_backward(loss), 0);
        /* parameter 5's gradient times an embedding with an index out of
         * range: poisoned when it runs */
        nt_tensor *tab = nt_ones(NT_F32, 2, (int64_t[]){4, 6});
        nt_tensor *bad = nt_embedding(tab, nt_full(NT_I32, 1, (int64_t[]){4}, 9.0));
        nt_tensor *g5 = nt_grad(w.p[5]);
        assert_int_equal(nt_mul_inplace(g5, bad), 0);
        nt_release(g5);
        assert_int_equal(nt_optim_step(w.opt), 0);
        nt_scope_end(s);
        float v[4 * 6];
        nt_test_expect_err(nt_to_host(w.p[5], v, sizeof v), NT_ERANGE, "nt_embedding",
                           "test_foreach.c:");
        /* parameter 7 (64 x 64) updated as usual */
        nt_tensor *c = nt_cast(w.p[7], NT_F32);
        assert_int_equal(nt_to_host(c, got[f], sizeof got[f]), 0);
        nt_release(c);
        world_free(&w);
        nt_clear_error();
    }
    assert_memory_equal(got[0], got[1], sizeof got[0]);
}

/* A program of one tile held in a shared kernel (neuron/ew.c ew_lone) whose
 * stores may touch the bytes of the next one's (held_clash): it runs alone
 * first.  A replay's memory plan (fusion/graph.c) gives a dead intermediate
 * and a later one the same offset when their lifetimes do not overlap, so
 * A, a chain of six ops storing x (dead at once), and B, one op storing y
 * (summed into acc after the kernel), write the same bytes: run side by
 * side (run_ops2), A's store, its sixth op, would come after B's, its
 * first, and acc would sum x.  x is stored only if its handle is live
 * when its batch is planned (a capture is otherwise one batch, planned at
 * its end): NT_MAX_INFLIGHT=2 ends a batch at every 64th op, and of the 64
 * iterations of a step, nine ops each (odd: every place in an iteration
 * comes at a multiple of 64 once), one ends a batch right after B.  A reads
 * acc, which the iteration before wrote, so A starts the shared kernel and
 * is the one held.  Only a replay has x and y in the same bytes; a gdb
 * breakpoint on held_clash's true path in ew_lone is hit in the captured
 * simulator run only, and with the check off acc is inf there. */
#define HI 64
static const int64_t HA[2] = {10, 10}, HB[2] = {9, 11};

static nt_tensor *held_input(int nd, const int64_t *sh, uint64_t seed)
{
    int64_t n = nt_test_numel(nd, sh);
    float v[128];
    uint64_t st = seed;
    assert_true(n <= 128);
    nt_test_fill(v, (size_t)n, &st);
    nt_tensor *t = nt_from_host(v, NT_F32, nd, sh);
    assert_non_null(t);
    return t;
}

static void held_step(nt_tensor *acc, nt_tensor *p1, nt_tensor *p2)
{
    for (int i = 0; i < HI; i++) {
        nt_tensor *t = nt_mul(p1, acc), *u = nt_add_scalar(t, 0.25);
        nt_release(t);
        t = nt_mul_scalar(u, 1.5);
        nt_release(u);
        u = nt_sub(t, p1);
        nt_release(t);
        t = nt_mul(u, u);
        nt_release(u);
        nt_tensor *x = nt_add(t, p1); /* A's output, never read */
        nt_release(t);
        nt_tensor *y = nt_mul_scalar(p2, 3.0); /* B */
        nt_tensor *s = nt_sum(y, NT_DIM_ALL, false);
        assert_non_null(x);
        assert_non_null(s);
        assert_int_equal(nt_add_inplace(acc, s), 0);
        nt_release(x), nt_release(y), nt_release(s);
    }
}

/* STEPS steps (captured: step 0 eagerly, step 1 captured, the rest
 * replayed); acc after them. */
static float held_run(const char *be, const char *mode, bool capture)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", be), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(be, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    char mi[32];
    snprintf(mi, sizeof mi, "%s", nt_config_get("NT_MAX_INFLIGHT"));
    assert_int_equal(nt_config_set("NT_MAX_INFLIGHT", "2"), 0);
    /* every instruction computes its values (the suite's setting): with the
     * values once per program, from the CPU kernels in program order, the
     * stores' order in the simulator would not show */
    assert_int_equal(nt_sim_init(), 0); /* reads NT_SIM_PROGRAM_VALUES */
    bool pv = nt__sim_program_values();
    nt__sim_set_program_values(false);
    nt_tensor *acc = held_input(1, (int64_t[]){1}, 3), *p1 = held_input(2, HA, 4),
              *p2 = held_input(2, HB, 5);
    nt_graph *g = NULL;
    for (int k = 0; k < STEPS; k++) {
        assert_int_equal(nt_sync(), 0);
        if (!capture || k == 0) {
            held_step(acc, p1, p2);
        } else if (k == 1) {
            assert_int_equal(nt_graph_capture_begin(), 0);
            held_step(acc, p1, p2);
            g = nt_graph_capture_end();
            assert_non_null(g);
        } else {
            assert_int_equal(nt_graph_replay(g), 0);
        }
    }
    float v;
    assert_int_equal(nt_to_host(acc, &v, sizeof v), 0);
    if (g) {
        nt_graph_info gi;
        assert_int_equal(nt_graph_info_get(g, &gi), 0);
        assert_true(gi.planned > 0); /* the intermediates share the plan's block */
        nt_graph_destroy(g);
    }
    nt_release(acc), nt_release(p1), nt_release(p2);
    assert_int_equal(nt_config_set("NT_MAX_INFLIGHT", mi), 0);
    nt__sim_set_program_values(pv);
    return v;
}

static void test_held_tile_clash(void **state)
{
    (void)state;
    float ref = held_run("cpu", "deterministic", false);
    static const char *const modes[] = {"deterministic", "adaptive", "lazy", "lazy"};
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 4; m++) {
            const char *be = b ? "sim" : "cpu";
            float v = held_run(be, modes[m], m == 3);
            if (nt_test_ubits(v) != nt_test_ubits(ref))
                fail_msg("%s, %s: acc is %08x (%g), op by op %08x (%g)", be,
                         m == 3 ? "captured" : modes[m], nt_test_ubits(v), (double)v,
                         nt_test_ubits(ref), (double)ref);
        }
}

/* NT_FOREACH takes 0 or 1; NT_CHECK_NAN runs every program alone and names
 * the op that made the NaN. */
static void test_errors(void **state)
{
    (void)state;
    nt_test_expect_err(nt_config_set("NT_FOREACH", "2"), NT_EINVAL, "NT_FOREACH",
                       "expected 0 or 1");
    assert_string_equal(nt_config_get("NT_FOREACH"), "1");
    assert_int_equal(nt_config_set("NT_FOREACH", "0"), 0);
    assert_string_equal(nt_config_get("NT_FOREACH"), "0");
    assert_int_equal(nt_config_set("NT_FOREACH", "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "1"), 0);
    nt_tensor *a = nt_full(NT_F32, 1, (int64_t[]){5}, -1.0);
    nt_tensor *b = nt_full(NT_F32, 1, (int64_t[]){7}, 4.0);
    nt_tensor *ra = nt_sqrt(a), *rb = nt_sqrt(b);
    nt_test_expect_err(nt_sync(), NT_ENAN, "nt_sqrt", "test_foreach.c:");
    float v[7];
    assert_int_equal(nt_to_host(rb, v, sizeof v), 0);
    assert_true(v[0] == 2.0f);
    nt_release(a), nt_release(b), nt_release(ra), nt_release(rb);
    assert_int_equal(nt_config_set("NT_CHECK_NAN", "0"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_adamw_same_bits, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sgd_same_bits, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_clip_same_bits, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_scaler_same_bits, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_kernel_counts, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_clip_norms_share, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sum_waits_past_matmuls, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bias_casts_share, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bias_casts_pass_big_sums, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_poisoned_gradient, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_held_tile_clash, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_errors, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
