/* tests/test_tp.c - tensor parallelism (dist/tp.c, docs/parallel.md): the
 * differentiable collectives' values and gradients against references
 * computed here, the layers against the unsplit layer, the same bits for
 * every split (tp 1, 2, 4 and (dp, tp) in (1,1), (2,1), (1,2), (2,2)) in
 * every backend and mode, one backward over forwards interleaved layer by
 * layer over the members (the order a per-layer ZeRO-3 release needs), and
 * every error path.  Runs on 4 simulated
 * cores (NT_SIM_CORES=4, set before nt_init). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"
#include "crc32.h"

#define NDEV 4

/* The sum of every element (0-d). */
static nt_tensor *sum_all(nt_tensor *t)
{
    return nt_sum(t, NT_DIM_ALL, false);
}

static int setup(void **state)
{
    setenv("NT_SIM_CORES", "4", 1);
    return nt_test_setup(state);
}
static int teardown(void **state)
{
    int rc = nt_test_teardown(state);
    unsetenv("NT_SIM_CORES");
    return rc;
}

/* A communicator over devices first .. first + n - 1. */
static nt_comm *comm_of(int first, int n)
{
    int devs[NDEV] = {0};
    for (int i = 0; i < n; i++)
        devs[i] = first + i;
    nt_comm *c = nt_comm_create(devs, n);
    assert_non_null(c);
    return c;
}

/* A tensor on device dev from host floats. */
static nt_tensor *on_dev(int dev, const float *v, int nd, const int64_t *shape, bool grad)
{
    assert_int_equal(nt_device_set(dev), 0);
    nt_tensor *t = nt_from_host(v, NT_F32, nd, shape);
    assert_non_null(t);
    if (grad)
        assert_int_equal(nt_set_requires_grad(t, true), 0);
    assert_int_equal(nt_device_set(0), 0);
    return t;
}

static void host_of(nt_tensor *t, float *v)
{
    if (!t)
        fail_msg("no tensor: %s", nt_last_error_message());
    assert_int_equal(nt_to_host(t, v, (size_t)nt_numel(t) * 4), 0);
}

/* ---------------- the differentiable collectives ---------------- */

/* Values of member r: distinct per member, order-sensitive sums. */
static void member_vals(float *v, int r, int n)
{
    uint64_t s = 0x1234u + (uint64_t)r * 977u;
    nt_test_fill(v, (size_t)n, &s);
    for (int i = 0; i < n; i++)
        v[i] = ldexpf(v[i], (r * 5 + i) % 9 - 4);
}

/* Each member's loss is sum(out[i] * u_i) for a fixed u_i; the gradient
 * of the joined loss reaches in[i] through the collective's backward. */
static void run_coll(int kind, int n, int dim)
{
    enum { R = 4, C = 8 };
    nt_comm *c = comm_of(0, n);
    float iv[NDEV][R * C], uv[NDEV][R * C * NDEV];
    nt_tensor *in[NDEV], *out[NDEV], *loss[NDEV];
    int64_t sh[2] = {R, C};
    for (int i = 0; i < n; i++) {
        member_vals(iv[i], i, R * C);
        in[i] = on_dev(i, iv[i], 2, sh, true);
    }
    int rc = kind == 0   ? nt_tp_copy(c, in, out)
             : kind == 1 ? nt_tp_reduce(c, in, out)
             : kind == 2 ? nt_tp_gather(c, in, out, dim)
                         : nt_tp_split(c, in, out, dim);
    assert_int_equal(rc, 0);
    int64_t on = nt_numel(out[0]);
    for (int i = 0; i < n; i++) {
        member_vals(uv[i], 10 + i, (int)on);
        nt_tensor *u = on_dev(i, uv[i], nt_ndim(out[i]),
                              (int64_t[]){nt_shape(out[i], 0), nt_shape(out[i], 1)}, false);
        assert_int_equal(nt_device_set(i), 0);
        loss[i] = sum_all(nt_mul(out[i], u));
        assert_non_null(loss[i]);
    }
    assert_int_equal(nt_device_set(0), 0);
    nt_tensor *L = nt_tp_join(c, loss);
    assert_non_null(L);
    assert_int_equal(nt_tensor_device(L), 0);
    assert_int_equal(nt_backward(L), 0);
    /* the references, in double and then in the rank tree's f32 order */
    float ov[R * C * NDEV], gv[R * C * NDEV];
    for (int i = 0; i < n; i++) {
        host_of(out[i], ov);
        nt_tensor *g = nt_grad(in[i]);
        host_of(g, gv);
        nt_release(g);
        for (int k = 0; k < R * C; k++) {
            int row = k / C, col = k % C;
            float want_o = 0, want_g = 0;
            if (kind == 0) { /* out = in; grad = sum over members of u */
                want_o = iv[i][k];
                float s2[NDEV] = {0};
                for (int j = 0; j < n; j++)
                    s2[j] = uv[j][k];
                for (int len = n; len > 1; len = (len + 1) / 2)
                    for (int a = 0; 2 * a < len; a++)
                        s2[a] = 2 * a + 1 < len ? s2[2 * a] + s2[2 * a + 1] : s2[2 * a];
                want_g = s2[0];
            } else if (kind == 1) {
                float s2[NDEV] = {0};
                for (int j = 0; j < n; j++)
                    s2[j] = iv[j][k];
                for (int len = n; len > 1; len = (len + 1) / 2)
                    for (int a = 0; 2 * a < len; a++)
                        s2[a] = 2 * a + 1 < len ? s2[2 * a] + s2[2 * a + 1] : s2[2 * a];
                want_o = s2[0];
                want_g = uv[i][k];
            } else if (kind == 2) { /* gather along dim; grad: reduce-scatter */
                int oc = dim ? C * n : C;
                int orow = dim ? row : row + i * R, ocol = dim ? col + i * C : col;
                (void)orow;
                float s2[NDEV] = {0};
                for (int j = 0; j < n; j++)
                    s2[j] = uv[j][orow * oc + ocol];
                for (int len = n; len > 1; len = (len + 1) / 2)
                    for (int a = 0; 2 * a < len; a++)
                        s2[a] = 2 * a + 1 < len ? s2[2 * a] + s2[2 * a + 1] : s2[2 * a];
                want_g = s2[0];
                want_o = iv[i][k]; /* checked below through the gathered output */
            } else { /* split: out = my slice; grad = u_i in my place, u_j elsewhere */
                int pr = dim ? R : R / n, pc = dim ? C / n : C;
                int owner = dim ? col / pc : row / pr;
                int lr = dim ? row : row % pr, lc = dim ? col % pc : col;
                want_g = uv[owner][lr * pc + lc];
                want_o = iv[i][k];
            }
            if (kind < 2)
                assert_true(nt_test_ubits(ov[k]) == nt_test_ubits(want_o));
            assert_true(nt_test_ubits(gv[k]) == nt_test_ubits(want_g));
        }
        if (kind == 2) /* the gathered output holds every member's input */
            for (int j = 0; j < n; j++)
                for (int k = 0; k < R * C; k++) {
                    int row = k / C, col = k % C, oc = dim ? C * n : C;
                    int at = dim ? row * oc + col + j * C : (row + j * R) * oc + col;
                    assert_true(nt_test_ubits(ov[at]) == nt_test_ubits(iv[j][k]));
                }
        if (kind == 3) {
            int pr = dim ? R : R / n, pc = dim ? C / n : C;
            for (int a = 0; a < pr; a++)
                for (int b = 0; b < pc; b++) {
                    int row = dim ? a : a + i * pr, col = dim ? b + i * pc : b;
                    assert_true(nt_test_ubits(ov[a * pc + b]) ==
                                nt_test_ubits(iv[i][row * C + col]));
                }
        }
    }
    nt_comm_destroy(c);
}

static void test_collectives(void **state)
{
    (void)state;
    static const int ns[] = {1, 2, 4};
    for (int a = 0; a < 3; a++)
        for (int kind = 0; kind < 4; kind++)
            for (int dim = 0; dim < 2; dim++) {
                nt_scope *s = nt_scope_begin();
                run_coll(kind, ns[a], dim);
                nt_scope_end(s);
            }
}

/* ---------------- the model: embedding, attention, MLP, CE ---------------- */

enum { V = 16, D = 16, HEADS = 4, FF = 32, BT = 2, T = 4, M = BT * T, BLOCKS = 4, NPAR = 10,
       SHARDS = 2 };

/* The parameters' full shapes and how they are split: 0 by rows, 1 by
 * columns, 2 replicated. */
static const struct {
    int64_t r, c;
    int split;
} PAR[NPAR] = {
    {V, D, 0},  /* embedding */
    {D, D, 0},  /* wq */
    {D, D, 0},  /* wk */
    {D, D, 0},  /* wv */
    {D, D, 1},  /* wo */
    {FF, D, 0}, /* w1 */
    {FF, 0, 0}, /* b1 */
    {D, FF, 1}, /* w2 */
    {D, 0, 2},  /* b2 */
    {V, D, 0},  /* output */
};

static void full_param(int j, float *v)
{
    uint64_t s = 777u + (uint64_t)j * 31u;
    int64_t n = PAR[j].r * (PAR[j].c ? PAR[j].c : 1);
    nt_test_fill(v, (size_t)n, &s);
    for (int64_t i = 0; i < n; i++)
        v[i] *= 0.4f;
}

/* Member r of tp's slice of parameter j (host). */
static void slice_param(int j, const float *full, int r, int tp, float *out, int64_t *shape,
                        int *nd)
{
    int64_t R = PAR[j].r, C = PAR[j].c ? PAR[j].c : 1;
    *nd = PAR[j].c ? 2 : 1;
    int64_t rr = PAR[j].split == 0 ? R / tp : R, cc = PAR[j].split == 1 ? C / tp : C;
    for (int64_t a = 0; a < rr; a++)
        for (int64_t b = 0; b < cc; b++) {
            int64_t ga = PAR[j].split == 0 ? a + r * rr : a;
            int64_t gb = PAR[j].split == 1 ? b + r * cc : b;
            out[a * cc + b] = full[ga * C + gb];
        }
    shape[0] = rr;
    shape[1] = cc;
}

static nt_dtype PDT = NT_F32; /* the model's parameters' dtype */

/* A parameter's values as f32 on the host. */
static void param_host(nt_tensor *t, float *v)
{
    assert_int_equal(nt_device_set(nt_tensor_device(t)), 0);
    nt_tensor *f = PDT == NT_F32 ? t : nt_cast(t, NT_F32);
    assert_int_equal(nt_device_set(0), 0);
    host_of(f, v);
    if (f != t)
        nt_release(f);
}

typedef struct model {
    int tp, dp, first;
    nt_comm *c;
    nt_tensor *p[NDEV][NPAR]; /* [member][param] */
} model;

static void model_init(model *m, int first, int tp, int dp)
{
    m->tp = tp;
    m->dp = dp;
    m->first = first;
    m->c = comm_of(first, tp);
    static float full[FF * D], part[FF * D];
    for (int j = 0; j < NPAR; j++) {
        full_param(j, full);
        for (int r = 0; r < tp; r++) {
            int64_t sh[2];
            int nd;
            slice_param(j, full, r, tp, part, sh, &nd);
            nt_tensor *t = on_dev(first + r, part, nd, sh, PDT == NT_F32);
            if (PDT != NT_F32) {
                assert_int_equal(nt_device_set(first + r), 0);
                nt_tensor *c = nt_cast(t, PDT);
                nt_release(t);
                assert_int_equal(nt_set_requires_grad(c, true), 0);
                t = c;
                assert_int_equal(nt_device_set(0), 0);
            }
            m->p[r][j] = t;
            nt_keep(m->p[r][j]);
        }
    }
}

static void model_free(model *m)
{
    for (int r = 0; r < m->tp; r++)
        for (int j = 0; j < NPAR; j++)
            nt_release(m->p[r][j]);
    nt_comm_destroy(m->c);
}

/* The members' losses of one batch (ids, targets [M]). */
static nt_tensor *model_loss(model *m, const int32_t *ids, const int32_t *tg)
{
    int n = m->tp;
    nt_tensor *idx[NDEV], *tgt[NDEV], *w[NPAR][NDEV], *x[NDEV], *a[NDEV], *h[NDEV],
        *y[NDEV], *lg[NDEV], *loss[NDEV];
    for (int r = 0; r < n; r++) {
        assert_int_equal(nt_device_set(m->first + r), 0);
        idx[r] = nt_from_host(ids, NT_I32, 2, (int64_t[]){BT, T});
        tgt[r] = nt_from_host(tg, NT_I32, 1, (int64_t[]){M});
        for (int j = 0; j < NPAR; j++)
            w[j][r] = m->p[r][j];
    }
    assert_int_equal(nt_tp_embedding(m->c, w[0], idx, x), 0);
    assert_int_equal(nt_tp_attention(m->c, x, w[1], w[2], w[3], w[4], HEADS, BLOCKS, a), 0);
    for (int r = 0; r < n; r++) {
        assert_int_equal(nt_device_set(m->first + r), 0);
        x[r] = nt_add(x[r], a[r]);
    }
    assert_int_equal(nt_tp_column_linear(m->c, x, w[5], w[6], BLOCKS, h), 0);
    for (int r = 0; r < n; r++) {
        assert_int_equal(nt_device_set(m->first + r), 0);
        h[r] = nt_gelu(h[r]);
    }
    assert_int_equal(nt_tp_row_linear(m->c, h, w[7], w[8], BLOCKS, y), 0);
    for (int r = 0; r < n; r++) {
        assert_int_equal(nt_device_set(m->first + r), 0);
        x[r] = nt_reshape(nt_add(x[r], y[r]), 2, (int64_t[]){M, D});
    }
    assert_int_equal(nt_tp_column_linear(m->c, x, w[9], NULL, BLOCKS, lg), 0);
    assert_int_equal(nt_tp_cross_entropy(m->c, lg, tgt, BLOCKS, loss), 0);
    assert_int_equal(nt_device_set(m->first), 0);
    nt_tensor *L = nt_tp_join(m->c, loss);
    assert_non_null(L);
    assert_int_equal(nt_device_set(0), 0);
    return L;
}

static void batch(int step, int shard, int32_t *ids, int32_t *tg)
{
    uint64_t s = 99u + (uint64_t)step * 1000u + (uint64_t)shard;
    for (int i = 0; i < M; i++) {
        ids[i] = (int32_t)(nt_test_rand32(&s) % V);
        tg[i] = (int32_t)(nt_test_rand32(&s) % V);
    }
}

/* Steps of SGD on (dp, tp): SHARDS fixed shards per step, dp rank g runs
 * shards g*S/dp ..; its gradients are summed in the shard tree (locally,
 * then over the data-parallel communicator of each tensor rank), and the
 * mean is applied.  Returns the CRC-32 of the full parameters (put back
 * together from the slices) and checks that replicas agree. */
static uint32_t train(int dp, int tp, int steps)
{
    model g[NDEV];
    for (int d = 0; d < dp; d++)
        model_init(&g[d], d * tp, tp, dp);
    nt_comm *dpc[NDEV];
    for (int r = 0; r < tp; r++) {
        int devs[NDEV];
        for (int d = 0; d < dp; d++)
            devs[d] = d * tp + r;
        dpc[r] = nt_comm_create(devs, dp);
        assert_non_null(dpc[r]);
    }
    int per = SHARDS / dp;
    for (int st = 0; st < steps; st++) {
        nt_scope *sc = nt_scope_begin();
        nt_tensor *gs[NDEV][NDEV][NPAR][SHARDS]; /* [dp][member][param][local shard] */
        for (int d = 0; d < dp; d++)
            for (int k = 0; k < per; k++) {
                int32_t ids[M], tg[M];
                batch(st, d * per + k, ids, tg);
                nt_scope *s2 = nt_scope_begin();
                nt_tensor *L = model_loss(&g[d], ids, tg);
                assert_int_equal(nt_backward(L), 0);
                nt_scope_end(s2);
                for (int r = 0; r < tp; r++)
                    for (int j = 0; j < NPAR; j++) {
                        gs[d][r][j][k] = nt_grad(g[d].p[r][j]);
                        assert_non_null(gs[d][r][j][k]);
                        assert_int_equal(nt_zero_grad(g[d].p[r][j]), 0);
                    }
            }
        for (int r = 0; r < tp; r++)
            for (int j = 0; j < NPAR; j++) {
                nt_tensor *in[NDEV], *out[NDEV];
                for (int d = 0; d < dp; d++) {
                    assert_int_equal(nt_device_set(d * tp + r), 0);
                    nt_tensor **v = gs[d][r][j];
                    for (int len = per; len > 1; len = (len + 1) / 2)
                        for (int a = 0; 2 * a < len; a++)
                            v[a] = 2 * a + 1 < len ? nt_add(v[2 * a], v[2 * a + 1]) : v[2 * a];
                    in[d] = v[0];
                }
                assert_int_equal(nt_all_reduce(dpc[r], in, out, NT_REDUCE_SUM), 0);
                for (int d = 0; d < dp; d++) {
                    assert_int_equal(nt_device_set(d * tp + r), 0);
                    nt_no_grad_begin();
                    nt_tensor *upd = nt_mul_scalar(out[d], 0.5 / SHARDS);
                    assert_int_equal(nt_sub_inplace(g[d].p[r][j], upd), 0);
                    nt_no_grad_end();
                }
            }
        for (int d = 0; d < dp; d++)
            for (int r = 0; r < tp; r++)
                for (int j = 0; j < NPAR; j++)
                    for (int k = 0; k < per; k++)
                        nt_release(gs[d][r][j][k]);
        nt_scope_end(sc);
        assert_int_equal(nt_device_set(0), 0);
    }
    /* the full parameters, from dp rank 0; every dp rank's the same */
    uint32_t crc = 0;
    static float full[FF * D], part[FF * D], other[FF * D];
    for (int j = 0; j < NPAR; j++) {
        int64_t R = PAR[j].r, C = PAR[j].c ? PAR[j].c : 1;
        for (int r = 0; r < tp; r++) {
            param_host(g[0].p[r][j], part);
            int64_t rr = PAR[j].split == 0 ? R / tp : R, cc = PAR[j].split == 1 ? C / tp : C;
            for (int d = 1; d < dp; d++) {
                param_host(g[d].p[r][j], other);
                assert_memory_equal(part, other, (size_t)(rr * cc) * 4);
            }
            if (PAR[j].split == 2 && r > 0) { /* replicated: equal on every member */
                param_host(g[0].p[0][j], other);
                assert_memory_equal(part, other, (size_t)(rr * cc) * 4);
            }
            for (int64_t a = 0; a < rr; a++)
                for (int64_t b = 0; b < cc; b++) {
                    int64_t ga = PAR[j].split == 0 ? a + r * rr : a;
                    int64_t gb = PAR[j].split == 1 ? b + r * cc : b;
                    full[ga * C + gb] = part[a * cc + b];
                }
        }
        crc = crc32_ieee((const uint8_t *)full, (size_t)(R * C) * 4) ^ (crc * 31u);
    }
    for (int d = 0; d < dp; d++)
        model_free(&g[d]);
    for (int r = 0; r < tp; r++)
        nt_comm_destroy(dpc[r]);
    return crc;
}

/* The same bits for every split, backend and mode. */
static void test_bitwise(void **state)
{
    (void)state;
    static const int splits[][2] = {{1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}};
    enum { NS = sizeof splits / sizeof splits[0], STEPS = 3 };
    for (int dt = 0; dt < 2; dt++) {
    PDT = dt ? NT_BF16 : NT_F32;
    uint32_t first = 0;
    printf("# %s parameters after %d SGD steps, %d shards (crc32)\n", nt_dtype_name(PDT), STEPS,
           SHARDS);
    printf("# backend mode           fusion (1,1)    (1,2)    (1,4)    (2,1)    (2,2)\n");
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        uint32_t crc[NS];
        char row[200];
        int len = snprintf(row, sizeof row, "# %-7s %-14s %-6s", NT_TEST_CFGS[k][0],
                           NT_TEST_CFGS[k][1], NT_TEST_CFGS[k][2]);
        for (int s = 0; s < NS; s++) {
            crc[s] = train(splits[s][0], splits[s][1], STEPS);
            len += snprintf(row + len, sizeof row - (size_t)len, " %08x", crc[s]);
        }
        printf("%s\n", row);
        fflush(stdout);
        if (k == 0)
            first = crc[0];
        for (int s = 0; s < NS; s++)
            if (crc[s] != first)
                fail_msg("%s %s: (dp, tp) = (%d, %d) gives %08x, (1, 1) on the first "
                         "setting %08x", NT_TEST_CFGS[k][0], NT_TEST_CFGS[k][1], splits[s][0],
                         splits[s][1], crc[s], first);
    }
    }
    PDT = NT_F32;
    nt_test_cfg(3);
}

/* ---------------- one backward over the members, layer by layer ---------------- */

/* A per-layer release of ZeRO-3's gathered parameters (docs/sharding.md,
 * "Not done") needs the local devices' backwards to run layer by layer
 * together.  What it would rely on, pinned here: forwards interleaved layer
 * by layer over the members, their losses joined with nt_tp_join and one
 * nt_backward, run layer l's backward on every member before layer l - 1's
 * (the tape runs nodes newest first), and give each member the gradients
 * of its own backward, bit for bit. */
enum { LS_L = 3, LS_D = 32, LS_ROWS = 8 };
static int ls_order[2 * LS_L * NDEV], ls_n;

static nt_tensor *ls_mark_fwd(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_mul_scalar(in[0], 1.0);
}
static int ls_mark_bwd(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                       void *ctx)
{
    (void)in, (void)out;
    if (ls_n < (int)(sizeof ls_order / sizeof ls_order[0]))
        ls_order[ls_n++] = (int)(intptr_t)ctx;
    gin[0] = nt_mul_scalar(gout, 1.0);
    return gin[0] ? 0 : nt_last_error();
}

/* Layer l of member k: tanh(h w), then the marker (ctx l * NDEV + k). */
static nt_tensor *ls_layer(const int *mark, nt_tensor *const *w, int k, int l, nt_tensor *h)
{
    assert_int_equal(nt_device_set(k), 0);
    nt_tensor *y = nt_op_call(mark[l * NDEV + k], (nt_tensor *[]){nt_tanh(nt_matmul(h, w[l]))});
    assert_non_null(y);
    return y;
}

/* Member gradients g[l] against a double reference of the same forward:
 * h_{l+1} = tanh(h_l w_l), loss = sum(h_L). */
static void ls_check_ref(const float *x, float (*w)[LS_D * LS_D], float (*g)[LS_D * LS_D])
{
    static double h[LS_L + 1][LS_ROWS * LS_D], gz[LS_ROWS * LS_D], gh[LS_ROWS * LS_D];
    for (int i = 0; i < LS_ROWS * LS_D; i++)
        h[0][i] = x[i];
    for (int l = 0; l < LS_L; l++)
        for (int r = 0; r < LS_ROWS; r++)
            for (int j = 0; j < LS_D; j++) {
                double a = 0;
                for (int q = 0; q < LS_D; q++)
                    a += h[l][r * LS_D + q] * w[l][q * LS_D + j];
                h[l + 1][r * LS_D + j] = tanh(a);
            }
    for (int i = 0; i < LS_ROWS * LS_D; i++)
        gh[i] = 1;
    for (int l = LS_L - 1; l >= 0; l--) {
        for (int i = 0; i < LS_ROWS * LS_D; i++)
            gz[i] = gh[i] * (1 - h[l + 1][i] * h[l + 1][i]);
        double big = 0, worst = 0;
        for (int q = 0; q < LS_D; q++)
            for (int j = 0; j < LS_D; j++) {
                double a = 0;
                for (int r = 0; r < LS_ROWS; r++)
                    a += h[l][r * LS_D + q] * gz[r * LS_D + j];
                big = fmax(big, fabs(a));
                worst = fmax(worst, fabs(a - g[l][q * LS_D + j]));
            }
        assert_true(big > 0);
        if (worst > 1e-4 * big)
            fail_msg("layer %d: gradient off the double reference by %g (largest %g)", l, worst,
                     big);
        for (int r = 0; r < LS_ROWS; r++)
            for (int q = 0; q < LS_D; q++) {
                double a = 0;
                for (int j = 0; j < LS_D; j++)
                    a += gz[r * LS_D + j] * w[l][q * LS_D + j];
                gh[r * LS_D + q] = a;
            }
    }
}

/* One run of the comparison under the current backend and mode. */
static void ls_run(const int *mark)
{
    nt_scope *sc = nt_scope_begin();
    assert_non_null(sc);
    ls_n = 0;
    static float wv[LS_L][LS_D * LS_D], xv[NDEV][LS_ROWS * LS_D];
    static float g1[NDEV][LS_L][LS_D * LS_D], g2[NDEV][LS_L][LS_D * LS_D];
    for (int l = 0; l < LS_L; l++) {
        member_vals(wv[l], 50 + l, LS_D * LS_D);
        for (int i = 0; i < LS_D * LS_D; i++)
            wv[l][i] = ldexpf(wv[l][i], -5); /* out of tanh's flat tails */
    }
    for (int k = 0; k < NDEV; k++)
        member_vals(xv[k], 70 + k, LS_ROWS * LS_D);
    nt_tensor *w[NDEV][LS_L], *x[NDEV];
    for (int k = 0; k < NDEV; k++) {
        for (int l = 0; l < LS_L; l++)
            w[k][l] = on_dev(k, wv[l], 2, (int64_t[]){LS_D, LS_D}, true);
        x[k] = on_dev(k, xv[k], 2, (int64_t[]){LS_ROWS, LS_D}, false);
    }
    /* each member's forward and backward in turn */
    for (int k = 0; k < NDEV; k++) {
        nt_tensor *h = x[k];
        for (int l = 0; l < LS_L; l++)
            h = ls_layer(mark, w[k], k, l, h);
        assert_int_equal(nt_backward(sum_all(h)), 0);
        for (int l = 0; l < LS_L; l++) {
            host_of(nt_grad(w[k][l]), g1[k][l]);
            assert_int_equal(nt_zero_grad(w[k][l]), 0);
        }
    }
    assert_int_equal(ls_n, LS_L * NDEV);
    for (int i = 0; i < ls_n; i++) /* member by member, each last layer first */
        assert_int_equal(ls_order[i], (LS_L - 1 - i % LS_L) * NDEV + i / LS_L);
    /* layer by layer over the members, one backward */
    ls_n = 0;
    nt_tensor *h[NDEV], *loss[NDEV];
    for (int k = 0; k < NDEV; k++)
        h[k] = x[k];
    for (int l = 0; l < LS_L; l++)
        for (int k = 0; k < NDEV; k++)
            h[k] = ls_layer(mark, w[k], k, l, h[k]);
    for (int k = 0; k < NDEV; k++) {
        assert_int_equal(nt_device_set(k), 0);
        loss[k] = sum_all(h[k]);
    }
    assert_int_equal(nt_device_set(0), 0);
    nt_comm *c = comm_of(0, NDEV);
    nt_tensor *L = nt_tp_join(c, loss);
    assert_non_null(L);
    assert_int_equal(nt_backward(L), 0);
    assert_int_equal(ls_n, LS_L * NDEV);
    for (int i = 0; i < ls_n; i++) /* layer by layer, the last member first in each */
        assert_int_equal(ls_order[i], (LS_L - 1 - i / NDEV) * NDEV + NDEV - 1 - i % NDEV);
    for (int k = 0; k < NDEV; k++)
        for (int l = 0; l < LS_L; l++) {
            host_of(nt_grad(w[k][l]), g2[k][l]);
            assert_memory_equal(g1[k][l], g2[k][l], sizeof g1[k][l]);
        }
    /* the values: a reference in double, computed here (the f32 order
     * differs: within 1e-4 of the largest gradient element) */
    for (int k = 0; k < NDEV; k++)
        ls_check_ref(xv[k], wv, g1[k]);
    nt_comm_destroy(c);
    nt_scope_end(sc);
}

static void test_join_lockstep(void **state)
{
    (void)state;
    int mark[LS_L * NDEV];
    for (int l = 0; l < LS_L; l++)
        for (int k = 0; k < NDEV; k++) {
            char name[32];
            snprintf(name, sizeof name, "lockstep_mark_%d_%d", l, k);
            nt_op_def def = {name, 1, ls_mark_fwd, ls_mark_bwd, (void *)(intptr_t)(l * NDEV + k)};
            mark[l * NDEV + k] = nt_op_register(&def);
            assert_true(mark[l * NDEV + k] >= 0);
        }
    for (int k = 0; k < NT_TEST_NCFG; k++) {
        nt_test_cfg(k);
        ls_run(mark);
    }
    nt_test_cfg(3);
}

/* ---------------- the layers against the unsplit layer ---------------- */

/* Row- and column-parallel linear at tp 2 against nt_linear of the whole
 * tensors (values and gradients within f32 rounding: the orders differ). */
static void test_layers_vs_plain(void **state)
{
    (void)state;
    enum { MM = 6, K = 8, N = 8 };
    float xv[MM * K], wv[N * K], bv[N], gx[MM * K], gw[N * K], want[MM * N], got[MM * N];
    uint64_t s = 5;
    nt_test_fill(xv, MM * K, &s);
    nt_test_fill(wv, N * K, &s);
    nt_test_fill(bv, N, &s);
    for (int row = 0; row < 2; row++) {
        nt_scope *sc = nt_scope_begin();
        nt_comm *c = comm_of(0, 2);
        /* the reference */
        nt_tensor *X = on_dev(0, xv, 2, (int64_t[]){MM, K}, true);
        nt_tensor *W = on_dev(0, wv, 2, (int64_t[]){N, K}, true);
        nt_tensor *B = on_dev(0, bv, 1, (int64_t[]){N}, true);
        nt_tensor *Y = nt_linear(X, W, B);
        host_of(Y, want);
        assert_int_equal(nt_backward(sum_all(Y)), 0);
        /* the split */
        nt_tensor *x[2], *w[2], *b[2], *y[2], *l[2];
        float part[N * K];
        for (int r = 0; r < 2; r++) {
            if (row) { /* x [MM, K/2], w [N, K/2] */
                for (int a = 0; a < MM; a++)
                    for (int k2 = 0; k2 < K / 2; k2++)
                        part[a * K / 2 + k2] = xv[a * K + r * K / 2 + k2];
                x[r] = on_dev(r, part, 2, (int64_t[]){MM, K / 2}, true);
                for (int a = 0; a < N; a++)
                    for (int k2 = 0; k2 < K / 2; k2++)
                        part[a * K / 2 + k2] = wv[a * K + r * K / 2 + k2];
                w[r] = on_dev(r, part, 2, (int64_t[]){N, K / 2}, true);
                b[r] = on_dev(r, bv, 1, (int64_t[]){N}, true);
            } else {
                x[r] = on_dev(r, xv, 2, (int64_t[]){MM, K}, true);
                w[r] = on_dev(r, wv + r * (N / 2) * K, 2, (int64_t[]){N / 2, K}, true);
                b[r] = on_dev(r, bv + r * N / 2, 1, (int64_t[]){N / 2}, true);
            }
        }
        int rc = row ? nt_tp_row_linear(c, x, w, b, 2, y) : nt_tp_column_linear(c, x, w, b, 2, y);
        assert_int_equal(rc, 0);
        for (int r = 0; r < 2; r++) {
            host_of(y[r], got);
            for (int a = 0; a < MM; a++)
                for (int o = 0; o < (row ? N : N / 2); o++) {
                    float wnt = want[a * N + (row ? o : o + r * N / 2)];
                    assert_true(fabsf(got[a * (row ? N : N / 2) + o] - wnt) <= 1e-5f);
                }
            assert_int_equal(nt_device_set(r), 0);
            l[r] = sum_all(y[r]);
        }
        assert_int_equal(nt_device_set(0), 0);
        /* column: each member's loss is its part of the sum; the joined
         * loss would count the replicated x twice, so sum the parts instead
         * of joining them */
        nt_tensor *L;
        if (row)
            L = nt_tp_join(c, l);
        else
            L = nt_add(l[0], nt_to_device(l[1], 0));
        assert_int_equal(nt_backward(L), 0);
        host_of(nt_grad(X), gx);
        host_of(nt_grad(W), gw);
        for (int r = 0; r < 2; r++) {
            float g[N * K];
            host_of(nt_grad(w[r]), g);
            for (int a = 0; a < (row ? N : N / 2); a++)
                for (int k2 = 0; k2 < (row ? K / 2 : K); k2++) {
                    float wnt = row ? gw[a * K + r * K / 2 + k2] : gw[(a + r * N / 2) * K + k2];
                    assert_true(fabsf(g[a * (row ? K / 2 : K) + k2] - wnt) <= 1e-5f);
                }
            /* x's gradient: row, member r's columns; column, the whole sum
             * over N (the blocked all-reduce) on every member */
            host_of(nt_grad(x[r]), g);
            for (int a = 0; a < MM; a++)
                for (int k2 = 0; k2 < (row ? K / 2 : K); k2++) {
                    float wnt = row ? gx[a * K + r * K / 2 + k2] : gx[a * K + k2];
                    assert_true(fabsf(g[a * (row ? K / 2 : K) + k2] - wnt) <= 1e-5f);
                }
        }
        nt_comm_destroy(c);
        nt_scope_end(sc);
    }
}

/* Vocabulary-parallel cross-entropy at tp 2 and 4 against a double
 * reference of the mean cross-entropy; the logits' gradient against
 * (softmax - onehot) / M. */
static void test_cross_entropy_ref(void **state)
{
    (void)state;
    enum { MM = 5, VV = 16 };
    float lv[MM * VV];
    int32_t tv[MM] = {0, 15, 7, 8, 3};
    uint64_t s = 17;
    nt_test_fill(lv, MM * VV, &s);
    for (int i = 0; i < MM * VV; i++)
        lv[i] *= 4.0f;
    double want = 0, gref[MM * VV];
    for (int a = 0; a < MM; a++) {
        double mx = -1e30, se = 0;
        for (int v = 0; v < VV; v++)
            mx = fmax(mx, lv[a * VV + v]);
        for (int v = 0; v < VV; v++)
            se += exp(lv[a * VV + v] - mx);
        want += (log(se) + mx - lv[a * VV + tv[a]]) / MM;
        for (int v = 0; v < VV; v++)
            gref[a * VV + v] = (exp(lv[a * VV + v] - mx) / se - (v == tv[a])) / MM;
    }
    for (int tp = 1; tp <= 4; tp *= 2) {
        nt_scope *sc = nt_scope_begin();
        nt_comm *c = comm_of(0, tp);
        nt_tensor *lg[NDEV], *tg[NDEV], *loss[NDEV];
        float part[MM * VV];
        int vl = VV / tp;
        for (int r = 0; r < tp; r++) {
            for (int a = 0; a < MM; a++)
                for (int v = 0; v < vl; v++)
                    part[a * vl + v] = lv[a * VV + r * vl + v];
            lg[r] = on_dev(r, part, 2, (int64_t[]){MM, vl}, true);
            assert_int_equal(nt_device_set(r), 0);
            tg[r] = nt_from_host(tv, NT_I32, 1, (int64_t[]){MM});
        }
        assert_int_equal(nt_device_set(0), 0);
        assert_int_equal(nt_tp_cross_entropy(c, lg, tg, 4, loss), 0);
        for (int r = 0; r < tp; r++) {
            float got;
            host_of(loss[r], &got);
            assert_true(fabs(got - want) <= 1e-5 * fabs(want) + 1e-6);
        }
        assert_int_equal(nt_backward(nt_tp_join(c, loss)), 0);
        for (int r = 0; r < tp; r++) {
            host_of(nt_grad(lg[r]), part);
            for (int a = 0; a < MM; a++)
                for (int v = 0; v < vl; v++)
                    assert_true(fabs(part[a * vl + v] - gref[a * VV + r * vl + v]) <= 1e-6);
        }
        nt_comm_destroy(c);
        nt_scope_end(sc);
    }
}

/* ---------------- gradcheck ---------------- */

/* The layers whose output is replicated, at tp 2, through nt_tp_join (one
 * member's value; every member's copy gets the gradient): in[0..1] the
 * members' x slices, in[2..3] their weights. */
static nt_comm *GC;
static nt_tensor *gc_row(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    nt_tensor *y[2];
    if (nt_tp_row_linear(GC, in, in + 2, NULL, 2, y))
        return NULL;
    return nt_tp_join(GC, y);
}
static nt_tensor *gc_ce(nt_tensor *const *in, void *ctx)
{
    nt_tensor **tg = ctx, *l[2];
    if (nt_tp_cross_entropy(GC, in, tg, 4, l))
        return NULL;
    return nt_tp_join(GC, l);
}
static nt_tensor *gc_emb(nt_tensor *const *in, void *ctx)
{
    nt_tensor **ids = ctx, *e[2];
    if (nt_tp_embedding(GC, in, ids, e))
        return NULL;
    return nt_tp_join(GC, e);
}

static void test_gradcheck(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    GC = comm_of(0, 2);
    float v[64];
    uint64_t s = 41;
    nt_tensor *in[4];
    for (int i = 0; i < 4; i++) {
        nt_test_fill(v, 64, &s);
        in[i] = on_dev(i % 2, v, 2, (int64_t[]){3, 4}, true); /* x [3, 4], w [3, 4] */
    }
    int grc = nt_gradcheck(gc_row, in, 4, NULL, 1e-2, 2e-2, 2e-2);
    if (grc)
        fail_msg("%s", nt_last_error_message());
    int32_t t3[3] = {0, 5, 7}, i4[4] = {7, 0, 3, 4};
    nt_tensor *tg[2], *ids[2];
    for (int r = 0; r < 2; r++) {
        assert_int_equal(nt_device_set(r), 0);
        tg[r] = nt_from_host(t3, NT_I32, 1, (int64_t[]){3});
        ids[r] = nt_from_host(i4, NT_I32, 1, (int64_t[]){4});
    }
    assert_int_equal(nt_device_set(0), 0);
    assert_int_equal(nt_gradcheck(gc_ce, in, 2, tg, 1e-2, 2e-2, 2e-2), 0);
    assert_int_equal(nt_gradcheck(gc_emb, in, 2, ids, 1e-2, 2e-2, 2e-2), 0);
    nt_comm_destroy(GC);
    nt_scope_end(sc);
}

/* ---------------- bad input ---------------- */

static void test_errors(void **state)
{
    (void)state;
    nt_scope *sc = nt_scope_begin();
    nt_comm *c2 = comm_of(0, 2);
    float v[64] = {0};
    nt_tensor *a[2] = {on_dev(0, v, 2, (int64_t[]){4, 4}, true),
                       on_dev(1, v, 2, (int64_t[]){4, 4}, true)};
    nt_tensor *odd[2] = {on_dev(0, v, 2, (int64_t[]){3, 4}, true),
                         on_dev(1, v, 2, (int64_t[]){3, 4}, true)};
    nt_tensor *swapped[2] = {a[1], a[0]};
    nt_tensor *mism[2] = {a[0], odd[1]};
    nt_tensor *out[2] = {(nt_tensor *)1, (nt_tensor *)1};
    /* NULL */
    nt_test_expect_err(nt_tp_copy(NULL, a, out), NT_EINVAL, "nt_tp_copy", "'c' is NULL");
    nt_test_expect_err(nt_tp_reduce(c2, NULL, out), NT_EINVAL, "nt_tp_reduce", "'in' is NULL");
    nt_test_expect_err(nt_tp_gather(c2, a, NULL, 0), NT_EINVAL, "nt_tp_gather", "'out'");
    nt_tensor *hole[2] = {a[0], NULL};
    nt_test_expect_err(nt_tp_split(c2, hole, out, 0), NT_EINVAL, "nt_tp_split", "in[1]");
    assert_null(out[0]);
    /* wrong members' tensors */
    nt_test_expect_err(nt_tp_copy(c2, swapped, out), NT_EINVAL, "nt_tp_copy", "in[0]",
                       "device 1", "member 0's device 0");
    /* shapes that differ between members, sizes that do not divide */
    nt_test_expect_err(nt_tp_reduce(c2, mism, out), NT_ESHAPE, "nt_tp_reduce", "[3, 4]",
                       "[4, 4]");
    nt_test_expect_err(nt_tp_split(c2, odd, out, 0), NT_ESHAPE, "nt_tp_split", "3",
                       "size 2");
    nt_test_expect_err(nt_tp_gather(c2, a, out, 2), NT_EINVAL, "nt_tp_gather", "dim is 2");
    /* layers */
    nt_tensor *w[2] = {on_dev(0, v, 2, (int64_t[]){2, 4}, true),
                       on_dev(1, v, 2, (int64_t[]){2, 4}, true)};
    nt_test_expect_err(nt_tp_column_linear(c2, a, w, NULL, 3, out), NT_EINVAL,
                       "nt_tp_column_linear", "blocks is 3", "size 2");
    nt_test_expect_err(nt_tp_column_linear(c2, a, w, NULL, 8, out), NT_ESHAPE,
                       "nt_tp_column_linear", "is 4", "8 blocks");
    nt_test_expect_err(nt_tp_column_linear(c2, a, w, a, 2, out), NT_ESHAPE,
                       "nt_tp_column_linear", "b has shape [4, 4]");
    nt_test_expect_err(nt_tp_row_linear(c2, a, NULL, NULL, 2, out), NT_EINVAL,
                       "nt_tp_row_linear", "'w' is NULL");
    int32_t iv[4] = {0, 1, 2, 3};
    assert_int_equal(nt_device_set(0), 0);
    nt_tensor *i0 = nt_from_host(iv, NT_I32, 1, (int64_t[]){4});
    assert_int_equal(nt_device_set(1), 0);
    nt_tensor *i1 = nt_from_host(iv, NT_I32, 1, (int64_t[]){4});
    assert_int_equal(nt_device_set(0), 0);
    nt_tensor *ids[2] = {i0, i1}, *fids[2] = {a[0], a[1]};
    nt_test_expect_err(nt_tp_embedding(c2, w, fids, out), NT_EDTYPE, "nt_tp_embedding",
                       "idx[0] is f32");
    nt_test_expect_err(nt_tp_cross_entropy(c2, a, ids, 3, out), NT_EINVAL,
                       "nt_tp_cross_entropy", "blocks is 3");
    nt_test_expect_err(nt_tp_cross_entropy(c2, w, ids, 2, out), NT_ESHAPE,
                       "nt_tp_cross_entropy", "[2, 4]", "[4]");
    nt_tensor *x3[2] = {on_dev(0, v, 3, (int64_t[]){1, 2, 8}, true),
                        on_dev(1, v, 3, (int64_t[]){1, 2, 8}, true)};
    nt_test_expect_err(nt_tp_row_linear(c2, x3, w, NULL, 2, out), NT_ESHAPE,
                       "nt_tp_row_linear", "[1, 2, 8]", "[2, 4]");
    nt_test_expect_err(nt_tp_attention(c2, x3, w, w, w, w, 3, 2, out), NT_EINVAL,
                       "nt_tp_attention", "heads is 3");
    nt_test_expect_err(nt_tp_join(c2, mism) ? 0 : nt_last_error(), NT_ESHAPE, "nt_tp_join");
    /* a destroyed communicator */
    nt_comm *dead = comm_of(0, 2);
    nt_comm_destroy(dead);
    nt_test_expect_err(nt_tp_copy(dead, a, out), NT_EINVAL, "nt_tp_copy", "not a live");
    /* still works */
    assert_int_equal(nt_tp_copy(c2, a, out), 0);
    nt_comm_destroy(c2);
    nt_scope_end(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_collectives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layers_vs_plain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_ref, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bitwise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_lockstep, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
