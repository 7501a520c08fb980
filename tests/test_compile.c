/* tests/test_compile.c - the simulated NeuronCore's programs for a
 * compiled (captured) training step give the eager step's bits:
 *   - attention with several heads in flight, their operands loaded and
 *     their results stored one DMA per group of heads at one stride (and
 *     head by head otherwise: a permuted view, a short last block, bf16):
 *     the sim kernel equals the CPU kernel bit for bit, forward and
 *     backward;
 *   - embedding's backward with the accumulator transposed (features on
 *     partitions, positions walked in order on every lane): the same bits
 *     as the CPU over odd vocabularies, widths past 128 and partial tiles,
 *     i32 and u8 indices, f32 and bf16 gradients;
 *   - a captured step of a small attention model (embedding, multi-head
 *     attention, MLP, clipping over many parameters, AdamW) replayed on the
 *     simulator, whose kernels now take SBUF and DMA queues away from each
 *     other, ends with the bits of the same steps run op by op, and those
 *     of the CPU backend; its simulated time repeats from run to run;
 *   - an HBM access waits only for accesses to the bytes it touches, not
 *     to the rest of their 16 KiB page. */
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

static void backend(const char *b)
{
    assert_int_equal(nt_config_set("NT_BACKEND", b), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(b, "sim") ? "0" : "1"), 0);
}

static uint64_t rs = 88172645463325252ull;
static float urand(void) /* [-1, 1) */
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_buf(int64_t n, uint64_t seed)
{
    rs = seed * 0x9e3779b97f4a7c15ull + 1;
    float *p = malloc((size_t)(n + 1) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = urand();
    return p;
}

static void to_host_f32(nt_tensor *t, float *out, int64_t n)
{
    nt_tensor *c = nt_cast(nt_contiguous(t), NT_F32);
    assert_non_null(c);
    assert_int_equal(nt_to_host(c, out, (size_t)n * sizeof *out), 0);
}

static void expect_bits(const float *a, const float *b, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (nt_test_ubits(a[i]) != nt_test_ubits(b[i]))
            fail_msg("%s: element %lld is %08x on the simulator, %08x on the CPU", what,
                     (long long)i, nt_test_ubits(a[i]), nt_test_ubits(b[i]));
}

/* ---------------- attention, heads in flight ---------------- */

typedef struct acfg {
    int64_t B, H, T, D;
    bool causal, permuted;
    nt_dtype dt;
} acfg;

/* y and the gradients of q, k, v (in that order, each B*H*T*D) */
static void attn_run(const acfg *c, const char *be, float *out)
{
    backend(be);
    nt_scope *sc = nt_scope_begin();
    int64_t n = c->B * c->H * c->T * c->D;
    int64_t sh[4] = {c->B, c->H, c->T, c->D}, tsh[4] = {c->B, c->T, c->H, c->D};
    nt_tensor *leaf[3], *in[3];
    for (int i = 0; i < 3; i++) {
        float *h = rand_buf(n, 11 + (uint64_t)i);
        /* permuted: the same values stored [B, T, H, D], viewed [B, H, T, D]
         * (heads of one batch one row apart, of the next batch far off) */
        nt_tensor *t = nt_from_host(h, NT_F32, 4, c->permuted ? tsh : sh);
        free(h);
        leaf[i] = nt_detach(c->dt == NT_F32 ? t : nt_cast(t, c->dt));
        assert_int_equal(nt_set_requires_grad(leaf[i], true), 0);
        in[i] = c->permuted ? nt_transpose(leaf[i], 1, 2) : leaf[i];
    }
    nt_tensor *y = nt_scaled_dot_product_attention(in[0], in[1], in[2], NULL, c->causal, 0.0);
    assert_non_null(y);
    float *gh = rand_buf(n, 5);
    nt_tensor *g = nt_from_host(gh, NT_F32, 4, sh);
    free(gh);
    if (c->dt != NT_F32)
        g = nt_cast(g, c->dt);
    assert_int_equal(nt_backward(nt_sum(nt_mul(y, g), NT_DIM_ALL, false)), 0);
    to_host_f32(y, out, n);
    for (int i = 0; i < 3; i++) {
        nt_tensor *gr = nt_grad(leaf[i]);
        assert_non_null(gr);
        if (c->permuted)
            gr = nt_transpose(gr, 1, 2);
        to_host_f32(gr, out + (1 + i) * n, n);
    }
    assert_int_equal(nt_sync(), 0);
    for (int i = 0; i < 3; i++)
        nt_release(leaf[i]);
    nt_scope_end(sc);
}

static void test_attention_heads_in_flight(void **state)
{
    (void)state;
    static const acfg cs[] = {
        {3, 2, 128, 32, true, false, NT_F32},  /* 6 heads: a group of 4, one of 2 */
        {1, 5, 256, 16, true, false, NT_F32},  /* two query blocks: 2 heads a group */
        {2, 3, 128, 32, false, true, NT_F32},  /* groups across batches: head by head */
        {2, 3, 100, 24, true, false, NT_F32},  /* a short block: head by head */
        {2, 2, 128, 32, true, false, NT_BF16}, /* bf16: widened head by head */
        {9, 1, 128, 8, false, false, NT_F32},  /* 9 heads: 4, 4 and 1 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const acfg *c = &cs[i];
        int64_t n = 4 * c->B * c->H * c->T * c->D;
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        attn_run(c, "sim", a);
        attn_run(c, "cpu", b);
        char what[96];
        snprintf(what, sizeof what, "attention case %zu (y, dq, dk, dv)", i);
        expect_bits(a, b, n, what);
        free(a);
        free(b);
    }
}

/* ---------------- embedding backward ---------------- */

typedef struct ecfg {
    int64_t V, D, P;
    nt_dtype idt, gdt;
} ecfg;

static void emb_run(const ecfg *c, const char *be, float *out)
{
    backend(be);
    nt_scope *sc = nt_scope_begin();
    float *wh = rand_buf(c->V * c->D, 3), *gh = rand_buf(c->P * c->D, 4);
    int32_t *ih = malloc((size_t)c->P * sizeof *ih);
    uint8_t *ih8 = malloc((size_t)c->P);
    for (int64_t p = 0; p < c->P; p++) { /* repeats, in no order; some rows never */
        ih[p] = (int32_t)((p * 7919 + p * p * 31) % (c->V - c->V / 5));
        ih8[p] = (uint8_t)ih[p];
    }
    nt_tensor *w = nt_from_host(wh, NT_F32, 2, (int64_t[]){c->V, c->D});
    if (c->gdt != NT_F32)
        w = nt_cast(w, c->gdt);
    w = nt_detach(w);
    assert_int_equal(nt_set_requires_grad(w, true), 0);
    nt_tensor *idx = c->idt == NT_U8 ? nt_from_host(ih8, NT_U8, 1, (int64_t[]){c->P})
                                     : nt_from_host(ih, NT_I32, 1, (int64_t[]){c->P});
    nt_tensor *g = nt_from_host(gh, NT_F32, 2, (int64_t[]){c->P, c->D});
    if (c->gdt != NT_F32)
        g = nt_cast(g, c->gdt);
    nt_tensor *y = nt_embedding(w, idx);
    assert_non_null(y);
    assert_int_equal(nt_backward(nt_sum(nt_mul(y, g), NT_DIM_ALL, false)), 0);
    to_host_f32(nt_grad(w), out, c->V * c->D);
    assert_int_equal(nt_sync(), 0);
    nt_release(w);
    nt_scope_end(sc);
    free(wh), free(gh), free(ih), free(ih8);
}

static void test_embedding_bwd_transposed(void **state)
{
    (void)state;
    static const ecfg cs[] = {
        {114, 128, 2048, NT_I32, NT_F32}, /* the character GPT's */
        {300, 200, 333, NT_I32, NT_F32},  /* two feature chunks, 3 row blocks, a partial tile */
        {200, 37, 129, NT_U8, NT_F32},    /* u8 indices */
        {130, 160, 260, NT_I32, NT_BF16}, /* bf16 gradient, widened on chip */
        {5, 1, 3, NT_I32, NT_F32},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int64_t n = cs[i].V * cs[i].D;
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        emb_run(&cs[i], "sim", a);
        emb_run(&cs[i], "cpu", b);
        char what[64];
        snprintf(what, sizeof what, "embedding gradient case %zu", i);
        expect_bits(a, b, n, what);
        free(a);
        free(b);
    }
}

/* ---------------- a captured step ---------------- */

enum { BT = 4, T = 128, V = 40, C = 32, NH = 2, NP = 8, STEPS = 4 };

typedef struct model {
    nt_tensor *p[NP]; /* wte, wqkv, bqkv, wo, w1, b1, w2, b2 */
    nt_optim *opt;
} model;

static const int64_t pshape[NP][2] = {{V, C}, {3 * C, C}, {3 * C, 1}, {C, C},
                                      {2 * C, C}, {2 * C, 1}, {V, 2 * C}, {V, 1}};

static void model_make(model *m)
{
    for (int i = 0; i < NP; i++) {
        int nd = pshape[i][1] == 1 ? 1 : 2;
        float *h = rand_buf(pshape[i][0] * pshape[i][1], 100 + (uint64_t)i);
        for (int64_t j = 0; j < pshape[i][0] * pshape[i][1]; j++)
            h[j] *= 0.2f;
        m->p[i] = nt_from_host(h, NT_F32, nd, pshape[i]);
        free(h);
        assert_int_equal(nt_set_requires_grad(m->p[i], true), 0);
    }
    m->opt = nt_optim_adamw(m->p, NP, 3e-3, 0.9, 0.95, 1e-8, 0.1);
    assert_non_null(m->opt);
}

static nt_tensor *step(model *m, nt_tensor *x, nt_tensor *y)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *h = nt_embedding(m->p[0], x); /* [BT, T, C] */
    nt_tensor *qkv = nt_linear(h, m->p[1], m->p[2]);
    nt_tensor *hd = nt_permute(nt_reshape(qkv, 5, (int64_t[]){BT, T, 3, NH, C / NH}),
                               (int[]){2, 0, 3, 1, 4}); /* [3, BT, NH, T, hd] */
    nt_tensor *q = nt_squeeze(nt_narrow(hd, 0, 0, 1), 0), *k = nt_squeeze(nt_narrow(hd, 0, 1, 1), 0);
    nt_tensor *v = nt_squeeze(nt_narrow(hd, 0, 2, 1), 0);
    nt_tensor *a = nt_scaled_dot_product_attention(q, k, v, NULL, true, 0.0);
    a = nt_reshape(nt_contiguous(nt_transpose(a, 1, 2)), 3, (int64_t[]){BT, T, C});
    h = nt_add(h, nt_linear(a, m->p[3], NULL));
    h = nt_gelu(nt_linear(h, m->p[4], m->p[5]));
    nt_tensor *logits = nt_linear(h, m->p[6], m->p[7]);
    nt_tensor *loss = nt_cross_entropy(nt_reshape(logits, 2, (int64_t[]){BT * T, V}), y);
    int rc = !loss || nt_backward(loss) || !nt_clip_grad_norm(m->p, NP, 0.5) ||
             nt_optim_step(m->opt) || nt_optim_zero_grad(m->opt);
    if (!rc)
        nt_keep(loss);
    nt_scope_end(s);
    return rc ? NULL : loss;
}

typedef struct result {
    uint32_t loss[STEPS];
    float *params;
    uint64_t sim_ns;
} result;

static int64_t params_numel(void)
{
    int64_t n = 0;
    for (int i = 0; i < NP; i++)
        n += pshape[i][0] * pshape[i][1];
    return n;
}

static void train(const char *be, bool capture, result *r)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_MODE", "lazy"), 0);
    backend(be);
    model m;
    model_make(&m);
    nt_graph *g = NULL;
    nt_tensor *gloss = NULL;
    int32_t xs[BT * T], ys[BT * T];
    for (int k = 0; k < STEPS; k++) {
        for (int i = 0; i < BT * T; i++) {
            xs[i] = (i * 13 + k * 7 + i / 5) % V;
            ys[i] = (i * 5 + k) % V;
        }
        nt_tensor *x = nt_from_host(xs, NT_I32, 2, (int64_t[]){BT, T});
        nt_tensor *y = nt_from_host(ys, NT_I32, 1, (int64_t[]){BT * T});
        nt_tensor *loss;
        if (k == 1)
            nt_stats_reset();
        if (!capture || k == 0) {
            loss = step(&m, x, y);
        } else if (k == 1) {
            assert_int_equal(nt_graph_capture_begin(), 0);
            assert_int_equal(nt_graph_input(x, "x"), 0);
            assert_int_equal(nt_graph_input(y, "y"), 0);
            gloss = step(&m, x, y);
            g = nt_graph_capture_end();
            assert_non_null(g);
            loss = nt_retain(gloss);
        } else {
            assert_int_equal(nt_graph_bind(g, "x", x), 0);
            assert_int_equal(nt_graph_bind(g, "y", y), 0);
            assert_int_equal(nt_graph_replay(g), 0);
            loss = nt_retain(gloss);
        }
        assert_non_null(loss);
        double l;
        assert_int_equal(nt_item(loss, &l), 0);
        r->loss[k] = nt_test_ubits((float)l);
        nt_release(loss), nt_release(x), nt_release(y);
    }
    nt_stats st;
    assert_int_equal(nt_stats_get(&st), 0);
    r->sim_ns = st.sim_time_ns;
    r->params = malloc((size_t)params_numel() * sizeof *r->params);
    for (int i = 0, off = 0; i < NP; i++) {
        to_host_f32(m.p[i], r->params + off, pshape[i][0] * pshape[i][1]);
        off += (int)(pshape[i][0] * pshape[i][1]);
    }
    if (g)
        nt_graph_destroy(g);
    nt_release(gloss);
    nt_optim_destroy(m.opt);
    for (int i = 0; i < NP; i++)
        nt_release(m.p[i]);
    assert_int_equal(nt_sync(), 0);
}

static void expect_same(const result *a, const result *b, const char *what)
{
    for (int k = 0; k < STEPS; k++)
        if (a->loss[k] != b->loss[k])
            fail_msg("%s: step %d's loss %08x against %08x", what, k, a->loss[k], b->loss[k]);
    expect_bits(a->params, b->params, params_numel(), what);
}

static void test_captured_step_same_bits(void **state)
{
    (void)state;
    result sim_eager, sim_cap, sim_cap2, cpu_eager, cpu_cap;
    train("sim", false, &sim_eager);
    train("sim", true, &sim_cap);
    train("sim", true, &sim_cap2);
    train("cpu", false, &cpu_eager);
    train("cpu", true, &cpu_cap);
    expect_same(&sim_cap, &sim_eager, "captured against op by op (sim)");
    expect_same(&cpu_eager, &sim_eager, "cpu against sim");
    expect_same(&cpu_cap, &sim_eager, "captured cpu against sim");
    /* the program's simulated time depends on the program only */
    print_message("# losses %08x %08x, simulated %llu ns captured, %llu op by op\n",
                  sim_eager.loss[0], sim_eager.loss[STEPS - 1], (unsigned long long)sim_cap.sim_ns,
                  (unsigned long long)sim_eager.sim_ns);
    assert_true(sim_cap.sim_ns > 0);
    assert_int_equal(sim_cap.sim_ns, sim_cap2.sim_ns);
    result *all[] = {&sim_eager, &sim_cap, &sim_cap2, &cpu_eager, &cpu_cap};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->params);
}

/* ---------------- HBM dependencies by bytes ---------------- */

/* The duration of a kernel storing one element to buf[o0] and one to
 * buf[o1] (the same 16 KiB page) on two queues. */
static double two_stores(float *buf, int64_t o0, int64_t o1)
{
    nt_sim_kernel *k = nt_sim_kernel_begin("two_stores");
    assert_non_null(k);
    nt_tile *t = nt_tile_alloc(k, "x", NT_MEM_SBUF, NT_F32, 1, 1);
    assert_non_null(t);
    nt_ap x = nt_tile_ap(t);
    assert_int_equal(nt_isa_memset(k, &x, 2.0, NT_ENGINE_VECTOR), 0);
    nt_ap h0 = nt_hbm_ap(buf, NT_F32, o0, 1, 1, 1), h1 = nt_hbm_ap(buf, NT_F32, o1, 1, 1, 1);
    assert_int_equal(nt_isa_dma_copy(k, &h0, &x, 0), 0);
    assert_int_equal(nt_isa_dma_copy(k, &h1, &x, 1), 0);
    nt_sim_report rep;
    assert_int_equal(nt_sim_kernel_end(k, &rep), 0);
    return rep.duration_ns;
}

/* Stores to different bytes of one page go at once; to the same bytes, one
 * after the other (a DMA waits only for the bytes it touches). */
static void test_hbm_bytes_not_pages(void **state)
{
    (void)state;
    static float buf[64];
    double apart = two_stores(buf, 0, 1), same = two_stores(buf, 3, 3);
    double near = two_stores(buf, 10, 11);
    assert_true(buf[0] == 2.0f && buf[1] == 2.0f && buf[3] == 2.0f);
    assert_true(apart == near);
    assert_true(same > 1.8 * apart);
}

/* ---------------- gradient clipping's norms in grad_norms kernels ---------------- */

/* Parameters of odd sizes (one block, two, three, 2049: one past a block, a
 * bf16 one, one without a gradient, more than 4 so several grad_norms) and
 * their gradients' values: random, with an Inf-free spread of scales. */
#define CN 9
static const int64_t cn_shape[CN][2] = {{1, 5},  {3, 7},    {50, 45}, {1, 1},   {130, 33},
                                        {4, 6},  {1, 2049}, {16, 16}, {7, 3}};

typedef struct clip_res {
    uint32_t total[2]; /* the first clip's total, then the second's */
    float *g;          /* the gradients after both */
} clip_res;

static int64_t cn_numel(void)
{
    int64_t n = 0;
    for (int i = 0; i < CN; i++)
        n += cn_shape[i][0] * cn_shape[i][1];
    return n;
}

/* The per-parameter path this replaced, in public ops: n_i = nt_norm(g_i),
 * total = nt_norm(cat(n_i)), coef = min(1/(total + 1e-6) * max, 1), g *= coef. */
static nt_tensor *clip_reference(nt_tensor **g, int n, double max_norm)
{
    nt_tensor *ns[CN];
    for (int i = 0; i < n; i++)
        ns[i] = nt_reshape(nt_norm(nt_cast(g[i], NT_F32), 2.0, NT_DIM_ALL, false), 1,
                           (int64_t[]){1});
    nt_tensor *total = nt_norm(nt_cat(ns, n, 0), 2.0, NT_DIM_ALL, false);
    nt_tensor *coef =
        nt_clamp(nt_mul_scalar(nt_reciprocal(nt_add_scalar(total, 1e-6)), max_norm), -INFINITY, 1.0);
    for (int i = 0; i < n; i++)
        assert_int_equal(nt_mul_inplace(g[i], nt_cast(coef, nt_dtype_of(g[i]))), 0);
    return total;
}

/* Clips twice (captured: the capture runs the first, a replay the second);
 * reference: clip_reference on plain tensors instead of nt_clip_grad_norm. */
static void clip_run(const char *be, const char *mode, bool capture, bool reference, clip_res *r)
{
    nt_shutdown();
    assert_int_equal(nt_init(), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    backend(be);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *p[CN], *g[CN];
    int ng = 0;
    for (int i = 0; i < CN; i++) {
        int64_t n = cn_shape[i][0] * cn_shape[i][1];
        float *v = rand_buf(n, 100 + (uint64_t)i);
        for (int64_t j = 0; j < n; j++)
            v[j] *= (float)(1 << (i % 5)) * 0.37f;
        nt_dtype dt = i == 3 || i == 7 ? NT_BF16 : NT_F32;
        nt_tensor *c = nt_cast(nt_from_host(v, NT_F32, 2, cn_shape[i]), dt);
        free(v);
        p[i] = nt_zeros(dt, 2, cn_shape[i]);
        assert_int_equal(nt_set_requires_grad(p[i], true), 0);
        if (i == 5)
            continue; /* no gradient: skipped */
        if (reference) {
            g[ng++] = nt_contiguous(nt_mul_scalar(c, 1.0));
        } else {
            assert_int_equal(nt_backward(nt_sum(nt_mul(p[i], c), NT_DIM_ALL, false)), 0);
            g[ng++] = nt_grad(p[i]);
        }
    }
    nt_tensor *t0, *t1;
    if (reference) {
        t0 = clip_reference(g, ng, 0.25);
        t1 = clip_reference(g, ng, 0.25);
    } else if (capture) {
        assert_int_equal(nt_graph_capture_begin(), 0);
        t0 = nt_contiguous(nt_clip_grad_norm(p, CN, 0.25));
        nt_graph *gr = nt_graph_capture_end();
        assert_non_null(gr);
        double v0;
        assert_int_equal(nt_item(t0, &v0), 0);
        r->total[0] = nt_test_ubits((float)v0);
        assert_int_equal(nt_graph_replay(gr), 0);
        t1 = t0;
        nt_graph_destroy(gr);
    } else {
        t0 = nt_clip_grad_norm(p, CN, 0.25);
        t1 = nt_clip_grad_norm(p, CN, 0.25);
    }
    assert_non_null(t0);
    assert_non_null(t1);
    double v;
    if (!capture) {
        assert_int_equal(nt_item(t0, &v), 0);
        r->total[0] = nt_test_ubits((float)v);
    }
    assert_int_equal(nt_item(t1, &v), 0);
    r->total[1] = nt_test_ubits((float)v);
    r->g = malloc((size_t)cn_numel() * sizeof *r->g);
    assert_non_null(r->g);
    for (int i = 0, k = 0, off = 0; i < CN; i++) {
        int64_t n = cn_shape[i][0] * cn_shape[i][1];
        if (i == 5)
            continue;
        to_host_f32(g[k++], r->g + off, n);
        off += (int)n;
    }
    nt_scope_end(sc);
    for (int i = 0; i < CN; i++)
        nt_release(p[i]);
    assert_int_equal(nt_sync(), 0);
}

/* nt_clip_grad_norm's norms (grad_norms, up to 4 gradients a kernel) give
 * the bits of the per-parameter nt_norm path it replaced: the totals and
 * the clipped gradients, on both backends, in every mode and captured. */
static void test_clip_norms_same_bits(void **state)
{
    (void)state;
    clip_res ref;
    clip_run("cpu", "deterministic", false, true, &ref);
    static const char *modes[] = {"deterministic", "eager", "adaptive", "lazy"};
    static const char *bes[] = {"cpu", "sim"};
    int64_t n = cn_numel() - cn_shape[5][0] * cn_shape[5][1];
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 5; m++) {
            clip_res r;
            bool cap = m == 4;
            clip_run(bes[b], cap ? "lazy" : modes[m], cap, false, &r);
            if (r.total[0] != ref.total[0] || r.total[1] != ref.total[1])
                fail_msg("%s %s: totals %08x %08x, the per-parameter path %08x %08x", bes[b],
                         cap ? "captured" : modes[m], r.total[0], r.total[1], ref.total[0],
                         ref.total[1]);
            for (int64_t j = 0; j < n; j++)
                if (nt_test_ubits(r.g[j]) != nt_test_ubits(ref.g[j]))
                    fail_msg("%s %s: clipped gradient element %lld differs", bes[b],
                             cap ? "captured" : modes[m], (long long)j);
            free(r.g);
        }
    /* the reference path on the simulator agrees too */
    clip_res rs;
    clip_run("sim", "eager", false, true, &rs);
    assert_int_equal(rs.total[0], ref.total[0]);
    assert_int_equal(rs.total[1], ref.total[1]);
    assert_memory_equal(rs.g, ref.g, (size_t)n * sizeof *rs.g);
    free(rs.g);
    free(ref.g);
}

static int setup(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_attention_heads_in_flight, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_embedding_bwd_transposed, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_captured_step_same_bits, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_hbm_bytes_not_pages, setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_clip_norms_same_bits, setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
