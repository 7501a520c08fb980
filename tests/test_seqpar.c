/* tests/test_seqpar.c - sequence parallelism and dropout under a mesh
 * (docs/parallel.md, "Sequence parallelism and dropout"):
 * nt_tp_column_linear_sp / nt_tp_row_linear_sp against the layers without
 * sp (outputs and every gradient, bit for bit, and against a double
 * reference), nt_tp_copy_blocks' gradient against the f32 tree written
 * out, at group sizes 1, 2 and 4; the char GPT of examples/gpt_mesh.h with
 * --sp and with dropout giving one CRC for every (dp, tp) split and ZeRO
 * stage on both backends; the forward loss with sp equal to the one
 * without; and the errors.  NT_TEST_QUICK (the sanitizer runs): the
 * splits of each model setting cut to four, the forward to one split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "mesh_harness.h"

/* ---------------- the layers ---------------- */

enum { LB = 2, LT = 8, LK = 16, LN = 8, BLK = 4 };

static float val(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static void fill(float *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = val(&seed);
}

static nt_comm *group(int size)
{
    int devs[4] = {0, 1, 2, 3};
    nt_comm *c = nt_comm_create(devs, size);
    assert_non_null(c);
    return c;
}

static nt_tensor *leaf(int dev, const float *v, int nd, const int64_t *shape)
{
    assert_int_equal(nt_device_set(dev), 0);
    nt_tensor *t = nt_from_host(v, NT_F32, nd, shape);
    assert_non_null(t);
    assert_int_equal(nt_set_requires_grad(t, true), 0);
    return t;
}

static void host(nt_tensor *t, float *out, size_t n)
{
    assert_non_null(t);
    assert_int_equal(nt_to_host(t, out, sizeof *out * n), 0);
}

/* Rows [r T/size, (r + 1) T/size) of every sequence of a [LB, LT, w] array. */
static void seq_slice(const float *full, int w, int size, int r, float *out)
{
    int tl = LT / size;
    for (int b = 0; b < LB; b++)
        memcpy(out + (size_t)b * tl * w, full + ((size_t)b * LT + (size_t)r * tl) * w,
               sizeof *out * (size_t)tl * w);
}

/* Column-parallel: nt_tp_column_linear of the whole x (replicated) and
 * nt_tp_column_linear_sp of its sequence slices: the same y, w's and b's
 * gradients, and x's gradient (sp: the member's slice); y against double. */
static void column_case(int size)
{
    nt_comm *c = group(size);
    int nl = LN / size;
    float x[LB * LT * LK], w[LN * LK], b[LN], u[LB * LT * LN];
    fill(x, sizeof x / sizeof *x, 1), fill(w, sizeof w / sizeof *w, 2);
    fill(b, LN, 3), fill(u, sizeof u / sizeof *u, 4);
    nt_tensor *xf[4], *xs[4], *w0[4], *w1[4], *b0[4], *b1[4], *y0[4], *y1[4], *l0[4], *l1[4];
    for (int r = 0; r < size; r++) {
        float xsl[LB * LT * LK];
        seq_slice(x, LK, size, r, xsl);
        xf[r] = leaf(r, x, 3, (int64_t[]){LB, LT, LK});
        xs[r] = leaf(r, xsl, 3, (int64_t[]){LB, LT / size, LK});
        w0[r] = leaf(r, w + r * nl * LK, 2, (int64_t[]){nl, LK});
        w1[r] = leaf(r, w + r * nl * LK, 2, (int64_t[]){nl, LK});
        b0[r] = leaf(r, b + r * nl, 1, (int64_t[]){nl});
        b1[r] = leaf(r, b + r * nl, 1, (int64_t[]){nl});
    }
    assert_int_equal(nt_tp_column_linear(c, xf, w0, b0, BLK, y0), 0);
    assert_int_equal(nt_tp_column_linear_sp(c, xs, w1, b1, BLK, 1, y1), 0);
    for (int r = 0; r < size; r++) {
        nt_device_set(r);
        float ul[LB * LT * LN];
        for (int i = 0; i < LB * LT; i++)
            for (int j = 0; j < nl; j++)
                ul[i * nl + j] = u[i * LN + r * nl + j];
        nt_tensor *ut = nt_from_host(ul, NT_F32, 3, (int64_t[]){LB, LT, nl});
        l0[r] = nt_sum(nt_mul(y0[r], ut), NT_DIM_ALL, false);
        l1[r] = nt_sum(nt_mul(y1[r], ut), NT_DIM_ALL, false);
        /* y: the same bits, and x w^T + b in double */
        float a[LB * LT * LN], bb[LB * LT * LN];
        host(y0[r], a, (size_t)LB * LT * nl);
        host(y1[r], bb, (size_t)LB * LT * nl);
        assert_memory_equal(a, bb, sizeof *a * (size_t)LB * LT * nl);
        for (int i = 0; i < LB * LT; i++)
            for (int j = 0; j < nl; j++) {
                double s = b[r * nl + j];
                for (int k = 0; k < LK; k++)
                    s += (double)x[i * LK + k] * w[(r * nl + j) * LK + k];
                assert_true(fabs(a[i * nl + j] - s) <= 1e-5 * (1 + fabs(s)));
            }
    }
    nt_device_set(0);
    assert_int_equal(nt_backward(nt_tp_join(c, l0)), 0);
    assert_int_equal(nt_backward(nt_tp_join(c, l1)), 0);
    for (int r = 0; r < size; r++) {
        float g0[LB * LT * LK], g1[LB * LT * LK], gs[LB * LT * LK];
        host(nt_grad(xf[r]), g0, (size_t)LB * LT * LK);
        host(nt_grad(xs[r]), g1, (size_t)LB * LT / size * LK);
        seq_slice(g0, LK, size, r, gs);
        assert_memory_equal(gs, g1, sizeof *g1 * (size_t)LB * LT / size * LK);
        /* x's gradient: u w summed over N, against double */
        for (int i = 0; i < LB * LT; i++)
            for (int k = 0; k < LK; k++) {
                double s = 0;
                for (int j = 0; j < LN; j++)
                    s += (double)u[i * LN + j] * w[j * LK + k];
                assert_true(fabs(g0[i * LK + k] - s) <= 1e-5 * (1 + fabs(s)));
            }
        host(nt_grad(w0[r]), g0, (size_t)nl * LK);
        host(nt_grad(w1[r]), g1, (size_t)nl * LK);
        assert_memory_equal(g0, g1, sizeof *g0 * (size_t)nl * LK);
        host(nt_grad(b0[r]), g0, (size_t)nl);
        host(nt_grad(b1[r]), g1, (size_t)nl);
        assert_memory_equal(g0, g1, sizeof *g0 * (size_t)nl);
    }
    nt_comm_destroy(c);
}

/* Row-parallel: nt_tp_row_linear (replicated y) and nt_tp_row_linear_sp
 * (y's sequence slice): the same y bits, and the same gradients when every
 * member's y gets the gradient u (sp: its slice of u).  The bias: the
 * same y bits; under sp through nt_tp_copy, whose all-reduce sums the
 * members' rows, its gradient the column sums of u (against double). */
static void row_case(int size)
{
    nt_comm *c = group(size);
    int kl = LK / size;
    float x[LB * LT * LK], w[LN * LK], u[LB * LT * LN], b[LN];
    fill(x, sizeof x / sizeof *x, 5), fill(w, sizeof w / sizeof *w, 6);
    fill(u, sizeof u / sizeof *u, 7), fill(b, LN, 8);
    nt_tensor *x0[4], *x1[4], *w0[4], *w1[4], *y0[4], *y1[4], *l0[4], *l1[4], *b0[4], *b1[4],
              *bc[4];
    for (int r = 0; r < size; r++) {
        float xl[LB * LT * LK], wl[LN * LK];
        for (int i = 0; i < LB * LT; i++)
            memcpy(xl + i * kl, x + i * LK + r * kl, sizeof *xl * (size_t)kl);
        for (int j = 0; j < LN; j++)
            memcpy(wl + j * kl, w + j * LK + r * kl, sizeof *wl * (size_t)kl);
        x0[r] = leaf(r, xl, 3, (int64_t[]){LB, LT, kl});
        x1[r] = leaf(r, xl, 3, (int64_t[]){LB, LT, kl});
        w0[r] = leaf(r, wl, 2, (int64_t[]){LN, kl});
        w1[r] = leaf(r, wl, 2, (int64_t[]){LN, kl});
        b0[r] = leaf(r, b, 1, (int64_t[]){LN});
        b1[r] = leaf(r, b, 1, (int64_t[]){LN});
    }
    assert_int_equal(nt_tp_copy(c, b1, bc), 0);
    assert_int_equal(nt_tp_row_linear(c, x0, w0, b0, BLK, y0), 0);
    assert_int_equal(nt_tp_row_linear_sp(c, x1, w1, bc, BLK, 1, y1), 0);
    for (int r = 0; r < size; r++) {
        nt_device_set(r);
        float a[LB * LT * LN], bb[LB * LT * LN], as[LB * LT * LN], us[LB * LT * LN];
        host(y0[r], a, (size_t)LB * LT * LN);
        host(y1[r], bb, (size_t)LB * LT / size * LN);
        seq_slice(a, LN, size, r, as);
        assert_memory_equal(as, bb, sizeof *bb * (size_t)LB * LT / size * LN);
        for (int i = 0; i < LB * LT; i++)
            for (int j = 0; j < LN; j++) {
                double s = b[j];
                for (int k = 0; k < LK; k++)
                    s += (double)x[i * LK + k] * w[j * LK + k];
                assert_true(fabs(a[i * LN + j] - s) <= 1e-5 * (1 + fabs(s)));
            }
        seq_slice(u, LN, size, r, us);
        nt_tensor *uf = nt_from_host(u, NT_F32, 3, (int64_t[]){LB, LT, LN});
        nt_tensor *ul = nt_from_host(us, NT_F32, 3, (int64_t[]){LB, LT / size, LN});
        l0[r] = nt_sum(nt_mul(y0[r], uf), NT_DIM_ALL, false);
        l1[r] = nt_sum(nt_mul(y1[r], ul), NT_DIM_ALL, false);
    }
    nt_device_set(0);
    assert_int_equal(nt_backward(nt_tp_join(c, l0)), 0);
    assert_int_equal(nt_backward(nt_tp_join(c, l1)), 0);
    for (int r = 0; r < size; r++) {
        float g0[LB * LT * LK], g1[LB * LT * LK];
        host(nt_grad(x0[r]), g0, (size_t)LB * LT * kl);
        host(nt_grad(x1[r]), g1, (size_t)LB * LT * kl);
        assert_memory_equal(g0, g1, sizeof *g0 * (size_t)LB * LT * kl);
        host(nt_grad(w0[r]), g0, (size_t)LN * kl);
        host(nt_grad(w1[r]), g1, (size_t)LN * kl);
        assert_memory_equal(g0, g1, sizeof *g0 * (size_t)LN * kl);
        host(nt_grad(b0[r]), g0, LN);
        host(nt_grad(b1[r]), g1, LN);
        for (int j = 0; j < LN; j++) {
            double s = 0;
            for (int i = 0; i < LB * LT; i++)
                s += u[i * LN + j];
            assert_true(fabs(g0[j] - s) <= 1e-5 * (1 + fabs(s)));
            assert_true(fabs(g1[j] - s) <= 1e-5 * (1 + fabs(s)));
        }
    }
    nt_comm_destroy(c);
}

static void test_linear_sp(void **state)
{
    (void)state;
    for (int cfg = 0; cfg < NT_TEST_NCFG; cfg += 3) { /* cpu det, sim adaptive, sim eager */
        nt_test_cfg(cfg);
        for (int size = 1; size <= 4; size *= 2) {
            nt_scope *s = nt_scope_begin();
            column_case(size);
            row_case(size);
            nt_scope_end(s);
        }
    }
}

/* nt_tp_copy_blocks: 4 blocks of gradient rows v_b (b = r nb + j) summed
 * as ((v0 + v1) + (v2 + v3)) in f32 at sizes 1, 2, 4 (nb 4, 2, 1); -0
 * rows give +0; the forward copies. */
static void test_copy_blocks(void **state)
{
    (void)state;
    enum { D = 5 };
    float p[D] = {1, 2, 3, 4, 5}, v[4][D];
    fill(&v[0][0], 4 * D, 9);
    v[0][1] = 1e8f, v[1][1] = 1.0f, v[2][1] = -1e8f, v[3][1] = 1.0f; /* order shows */
    for (int b = 0; b < 4; b++)
        v[b][4] = -0.0f;
    float want[D];
    for (int k = 0; k < D; k++) {
        float a = v[0][k] + v[1][k], b2 = v[2][k] + v[3][k];
        want[k] = a + b2;
    }
    want[4] = 0.0f;
    for (int cfg = 0; cfg < NT_TEST_NCFG; cfg += 3) {
        nt_test_cfg(cfg);
        for (int size = 1; size <= 4; size *= 2) {
            nt_scope *s = nt_scope_begin();
            nt_comm *c = group(size);
            int nb = 4 / size;
            nt_tensor *in[4], *out[4], *l[4];
            for (int r = 0; r < size; r++)
                in[r] = leaf(r, p, 1, (int64_t[]){D});
            assert_int_equal(nt_tp_copy_blocks(c, in, nb, out), 0);
            for (int r = 0; r < size; r++) {
                nt_device_set(r);
                assert_int_equal(nt_shape(out[r], 0), nb);
                float o[4 * D];
                host(out[r], o, (size_t)nb * D);
                for (int j = 0; j < nb; j++)
                    assert_memory_equal(o + j * D, p, sizeof p);
                nt_tensor *vt = nt_from_host(&v[r * nb][0], NT_F32, 2, (int64_t[]){nb, D});
                l[r] = nt_sum(nt_mul(out[r], vt), NT_DIM_ALL, false);
            }
            nt_device_set(0);
            assert_int_equal(nt_backward(nt_tp_join(c, l)), 0);
            for (int r = 0; r < size; r++) {
                float g[D];
                host(nt_grad(in[r]), g, D);
                assert_memory_equal(g, want, sizeof want);
            }
            nt_comm_destroy(c);
            nt_scope_end(s);
        }
    }
    nt_test_cfg(3);
}

static void test_layer_errors(void **state)
{
    (void)state;
    nt_scope *s = nt_scope_begin();
    nt_comm *c = group(2);
    float z[64] = {0};
    nt_tensor *x[2], *w[2], *y[2], *p[2];
    for (int r = 0; r < 2; r++) {
        x[r] = leaf(r, z, 3, (int64_t[]){1, 3, 4});
        w[r] = leaf(r, z, 2, (int64_t[]){4, 2});
        p[r] = leaf(r, z, 1, (int64_t[]){4});
    }
    nt_tensor *xr[2], *wc[2];
    for (int r = 0; r < 2; r++) {
        xr[r] = leaf(r, z, 3, (int64_t[]){1, 3, 2});
        wc[r] = leaf(r, z, 2, (int64_t[]){2, 4});
    }
    /* the sequence dim must not be the last */
    nt_test_expect_err(nt_tp_column_linear_sp(c, x, wc, NULL, 4, 2, y), NT_EINVAL,
                       "nt_tp_column_linear_sp", "dim is 2");
    nt_test_expect_err(nt_tp_column_linear_sp(c, x, wc, NULL, 4, -1, y), NT_EINVAL,
                       "nt_tp_column_linear_sp", "dim is -1");
    assert_null(y[0]);
    /* a sequence of 3 over 2 members */
    nt_test_expect_err(nt_tp_row_linear_sp(c, xr, w, NULL, 4, 1, y), NT_ESHAPE,
                       "nt_tp_row_linear_sp", "dim 1", "is 3", "size 2");
    /* blocks the group does not divide */
    nt_test_expect_err(nt_tp_row_linear_sp(c, xr, w, NULL, 3, 1, y), NT_EINVAL,
                       "nt_tp_row_linear_sp", "blocks is 3");
    nt_test_expect_err(nt_tp_column_linear_sp(NULL, x, wc, NULL, 4, 1, y), NT_EINVAL,
                       "nt_tp_column_linear_sp");
    /* copy_blocks: nb not a power of two; NULL arrays */
    nt_test_expect_err(nt_tp_copy_blocks(c, p, 3, y), NT_EINVAL, "nt_tp_copy_blocks",
                       "nb is 3");
    nt_test_expect_err(nt_tp_copy_blocks(c, p, 0, y), NT_EINVAL, "nt_tp_copy_blocks",
                       "nb is 0");
    nt_test_expect_err(nt_tp_copy_blocks(c, NULL, 2, y), NT_EINVAL, "nt_tp_copy_blocks",
                       "'in'");
    nt_test_expect_err(nt_tp_copy_blocks(c, p, 2, NULL), NT_EINVAL, "nt_tp_copy_blocks",
                       "'out'");
    nt_comm_destroy(c);
    nt_scope_end(s);
}

/* ---------------- the char GPT ---------------- */

enum { STEPS = 3, SHARDS = MESH_H_SHARDS, BATCH = MESH_H_BATCH, BLOCKS = MESH_H_BLOCKS };

typedef struct {
    int dp, tp, zero, cfg;
    bool sp;
    double dropout;
    int steps;
} run_spec;

/* Trains r->steps steps; the CRC of the parameters and the eval loss
 * after them (no dropout in the eval). */
static uint32_t run(const run_spec *r, double *eval)
{
    char cores[8], err[512];
    snprintf(cores, sizeof cores, "%d", r->dp * r->tp);
    setenv("NT_SIM_CORES", cores, 1);
    assert_int_equal(nt_init(), 0);
    nt_test_cfg(r->cfg);
    gpt_data d;
    mesh_h_data(&d);
    gpt_config c = mesh_h_cfg();
    gpt_train_opts o = mesh_h_opts(STEPS, 1);
    static gpt_mesh g;
    int rc = gptm_init(&g, &c, r->dp, r->tp, r->zero, BLOCKS, SHARDS, &o, err, sizeof err);
    if (!rc)
        rc = gptm_set_sp(&g, r->sp, err, sizeof err);
    if (!rc)
        rc = gptm_set_dropout(&g, r->dropout, err, sizeof err);
    int32_t xb[BATCH * 8], yb[BATCH * 8];
    for (int st = 0; st < r->steps && !rc; st++) {
        gpt_batch(&d, false, o.seed, st, BATCH, c.context, xb, yb);
        if (gptm_step(&g, &o, xb, yb, NULL))
            rc = gptm_fail(err, sizeof err, "step %d: %s", st, nt_last_error_message());
    }
    double ev = rc ? NAN : gptm_eval(&g, &d, &o, 1);
    if (!rc && isnan(ev))
        rc = gptm_fail(err, sizeof err, "eval: %s", nt_last_error_message());
    uint32_t crc = 0;
    if (!rc)
        rc = gptm_crc(&g, &crc, err, sizeof err);
    gptm_free(&g);
    gpt_data_free(&d);
    if (rc)
        fail_msg("(dp %d, tp %d, zero %d, sp %d, dropout %g): %s", r->dp, r->tp, r->zero, r->sp,
                 r->dropout, err);
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
    if (eval)
        *eval = ev;
    return crc;
}

/* Every split (and a ZeRO stage each) of one setting: one CRC. */
static uint32_t same_everywhere(bool sp, double dropout, const char *what)
{
    static const int runs[][4] = {
        /* dp, tp, zero, cfg (nt_test.h: 0 cpu deterministic, 3 sim adaptive, 6 sim eager) */
        {1, 1, 0, 3}, {1, 2, 1, 3}, {2, 2, 2, 3}, {1, 4, 3, 3}, {2, 4, 0, 3}, {4, 1, 1, 3},
        {1, 1, 0, 0}, {1, 2, 2, 0}, {2, 4, 3, 0}, {1, 4, 0, 6}, {2, 2, 1, 7}, {2, 4, 2, 4},
    };
    int nr = getenv("NT_TEST_QUICK") ? 4 : (int)(sizeof runs / sizeof runs[0]);
    uint32_t first = 0;
    for (int i = 0; i < nr; i++) {
        const int *q = runs[i];
        run_spec r = {q[0], q[1], q[2], q[3], sp, dropout, STEPS};
        uint32_t crc = run(&r, NULL);
        printf("# %s (dp %d, tp %d) zero %d %-4s %-14s %08x\n", what, q[0], q[1], q[2],
               NT_TEST_CFGS[q[3]][0], NT_TEST_CFGS[q[3]][1], crc);
        fflush(stdout);
        if (i == 0)
            first = crc;
        else if (crc != first)
            fail_msg("%s: (dp %d, tp %d) zero %d on %s %s gives %08x; (1, 1) gave %08x", what,
                     q[0], q[1], q[2], NT_TEST_CFGS[q[3]][0], NT_TEST_CFGS[q[3]][1], crc, first);
    }
    return first;
}

static void test_sp_bits(void **state)
{
    (void)state;
    uint32_t sp = same_everywhere(true, 0, "sp");
    run_spec plain = {1, 1, 0, 3, false, 0, STEPS};
    uint32_t none = run(&plain, NULL);
    printf("# sp %08x, without sp %08x (the layer norms' and biases' gradients sum the "
           "tokens by blocks under sp)\n", sp, none);
}

static void test_dropout_bits(void **state)
{
    (void)state;
    uint32_t d = same_everywhere(false, 0.25, "dropout");
    uint32_t dsp = same_everywhere(true, 0.25, "sp + dropout");
    run_spec plain = {1, 1, 0, 3, false, 0, STEPS}, psp = {1, 1, 0, 3, true, 0, STEPS};
    uint32_t none = run(&plain, NULL), nsp = run(&psp, NULL);
    printf("# dropout %08x (without %08x), sp + dropout %08x (without %08x)\n", d, none, dsp,
           nsp);
    assert_true(d != none);
    assert_true(dsp != nsp);
}

/* The forward: with and without sp, the same loss bits (every activation
 * is the same; only the replicated parameters' gradients sum otherwise). */
static void test_sp_forward(void **state)
{
    (void)state;
    static const int splits[][2] = {{1, 1}, {1, 2}, {2, 4}};
    int ns = getenv("NT_TEST_QUICK") ? 1 : 3;
    for (int i = 3 - ns; i < 3; i++)
        for (int cfg = 0; cfg < NT_TEST_NCFG; cfg += 3) {
            double a, b;
            run_spec r0 = {splits[i][0], splits[i][1], 0, cfg, false, 0, 0};
            run_spec r1 = {splits[i][0], splits[i][1], 0, cfg, true, 0, 0};
            run(&r0, &a);
            run(&r1, &b);
            printf("# eval loss before training (dp %d, tp %d) %s %s: %.9g, sp %.9g\n",
                   splits[i][0], splits[i][1], NT_TEST_CFGS[cfg][0], NT_TEST_CFGS[cfg][1], a, b);
            assert_memory_equal(&a, &b, sizeof a);
        }
}

static void test_model_errors(void **state)
{
    (void)state;
    setenv("NT_SIM_CORES", "2", 1);
    assert_int_equal(nt_init(), 0);
    char err[512] = "";
    gpt_config c = mesh_h_cfg();
    gpt_train_opts o = mesh_h_opts(STEPS, 1);
    static gpt_mesh g;
    c.context = 6; /* not a multiple of the 4 token blocks */
    assert_int_equal(gptm_init(&g, &c, 1, 2, 0, BLOCKS, SHARDS, &o, err, sizeof err), 0);
    assert_int_equal(gptm_set_sp(&g, true, err, sizeof err), -1);
    assert_non_null(strstr(err, "--sp: --context (6) must be a multiple of --blocks (4)"));
    assert_false(g.sp);
    assert_int_equal(gptm_set_dropout(&g, 0.1, err, sizeof err), -1);
    assert_non_null(strstr(err, "--dropout: --context (6) must be a multiple of --blocks (4)"));
    assert_int_equal(gptm_set_dropout(&g, 1.0, err, sizeof err), -1);
    assert_non_null(strstr(err, "--dropout (1) must be in [0, 1)"));
    assert_int_equal(gptm_set_dropout(&g, 0, err, sizeof err), 0);
    gptm_free(&g);
    assert_int_equal(gptm_check_sp(&c, 2, BLOCKS, 8, err, sizeof err), -1);
    assert_non_null(strstr(err, "--sp needs the dense MLP"));
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
}

static int setup4(void **state)
{
    (void)state;
    setenv("NT_SIM_CORES", "4", 1);
    assert_int_equal(nt_init(), 0);
    nt_test_cfg(3);
    return 0;
}

static int teardown4(void **state)
{
    (void)state;
    nt_shutdown();
    unsetenv("NT_SIM_CORES");
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_linear_sp, setup4, teardown4),
        cmocka_unit_test_setup_teardown(test_copy_blocks, setup4, teardown4),
        cmocka_unit_test_setup_teardown(test_layer_errors, setup4, teardown4),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_sp_forward),
        cmocka_unit_test(test_sp_bits),
        cmocka_unit_test(test_dropout_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
