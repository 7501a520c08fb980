/* tests/test_attention.c - nt_scaled_dot_product_attention (docs/ops.md
 * §7a): values and gradients against an independent double-precision
 * softmax(q k^T * scale + mask) v, over shapes that cut the 128-key blocks
 * in odd places; the simulator's tile program equal to the CPU kernel bit
 * for bit (NT_REQUIRE_SIM=1); every mode and fusion setting the same bits;
 * strided inputs; fully masked rows; autocast. */
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
#include "cpu/cpu.h"

enum { M_NONE, M_U8, M_ADD };

typedef struct cfg {
    int64_t B, H, Tq, Tk, D, Dv;
    bool causal;
    int mask;     /* M_* */
    bool mask_bh; /* a per-(batch, head) mask [B, H, Tq, Tk]; else [Tq, Tk] */
    double scale; /* 0: 1/sqrt(D) */
} cfg;

static void config(const char *backend, const char *mode, const char *fusion)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(backend, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    assert_int_equal(nt_config_set("NT_FUSION", fusion), 0);
}

static uint64_t rs = 88172645463325252ull;
static double urand(void) /* [-1, 1) */
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

typedef struct host {
    cfg c;
    float *q, *k, *v, *dO, *madd;
    uint8_t *mu8;
    int64_t nm; /* mask elements */
} host;

static void host_make(host *h, const cfg *c, uint64_t seed)
{
    memset(h, 0, sizeof *h);
    h->c = *c;
    rs = seed * 0x9e3779b97f4a7c15ull + 1;
    int64_t BH = c->B * c->H;
    h->q = malloc((size_t)(BH * c->Tq * c->D + 1) * sizeof(float));
    h->k = malloc((size_t)(BH * c->Tk * c->D + 1) * sizeof(float));
    h->v = malloc((size_t)(BH * c->Tk * c->Dv + 1) * sizeof(float));
    h->dO = malloc((size_t)(BH * c->Tq * c->Dv + 1) * sizeof(float));
    for (int64_t i = 0; i < BH * c->Tq * c->D; i++)
        h->q[i] = (float)(1.5 * urand());
    for (int64_t i = 0; i < BH * c->Tk * c->D; i++)
        h->k[i] = (float)(1.5 * urand());
    for (int64_t i = 0; i < BH * c->Tk * c->Dv; i++)
        h->v[i] = (float)urand();
    for (int64_t i = 0; i < BH * c->Tq * c->Dv; i++)
        h->dO[i] = (float)urand();
    h->nm = (c->mask_bh ? BH : 1) * c->Tq * c->Tk;
    if (c->mask == M_U8) {
        h->mu8 = malloc((size_t)h->nm + 1);
        for (int64_t i = 0; i < h->nm; i++) /* every row keeps its first key */
            h->mu8[i] = (i % c->Tk == 0) || urand() > -0.4;
    }
    if (c->mask == M_ADD) {
        h->madd = malloc((size_t)(h->nm + 1) * sizeof(float));
        for (int64_t i = 0; i < h->nm; i++)
            h->madd[i] = urand() > 0.7 ? -1e4f : (float)(0.5 * urand());
    }
}

static void host_free(host *h)
{
    free(h->q), free(h->k), free(h->v), free(h->dO), free(h->madd), free(h->mu8);
}

/* The double-precision reference: y = softmax(s) v with s = q k^T * scale +
 * mask, and the gradients of sum(y * dO). */
static void reference(const host *h, double *y, double *dq, double *dk, double *dv)
{
    const cfg *c = &h->c;
    double sc = c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->D);
    double *s = malloc((size_t)(c->Tk + 1) * sizeof(double));
    double *dp = malloc((size_t)(c->Tk + 1) * sizeof(double));
    int64_t BH = c->B * c->H;
    if (dq) {
        memset(dq, 0, (size_t)(BH * c->Tq * c->D) * sizeof(double));
        memset(dk, 0, (size_t)(BH * c->Tk * c->D) * sizeof(double));
        memset(dv, 0, (size_t)(BH * c->Tk * c->Dv) * sizeof(double));
    }
    for (int64_t b = 0; b < BH; b++) {
        const float *q = h->q + b * c->Tq * c->D, *k = h->k + b * c->Tk * c->D;
        const float *v = h->v + b * c->Tk * c->Dv, *dO = h->dO + b * c->Tq * c->Dv;
        for (int64_t i = 0; i < c->Tq; i++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < c->Tk; j++) {
                double d = 0;
                for (int64_t e = 0; e < c->D; e++)
                    d += (double)q[i * c->D + e] * k[j * c->D + e];
                d *= sc;
                int64_t mi = (c->mask_bh ? b * c->Tq * c->Tk : 0) + i * c->Tk + j;
                if (c->mask == M_ADD)
                    d += h->madd[mi];
                if ((c->mask == M_U8 && !h->mu8[mi]) || (c->causal && j > i))
                    d = -INFINITY;
                s[j] = d;
                mx = d > mx ? d : mx;
            }
            double z = 0;
            for (int64_t j = 0; j < c->Tk; j++)
                z += s[j] = mx == -INFINITY ? 0.0 : exp(s[j] - mx);
            for (int64_t j = 0; j < c->Tk; j++)
                s[j] = z > 0 ? s[j] / z : 0.0; /* P; a row attending nothing: 0 */
            for (int64_t e = 0; e < c->Dv; e++) {
                double a = 0;
                for (int64_t j = 0; j < c->Tk; j++)
                    a += s[j] * v[j * c->Dv + e];
                y[(b * c->Tq + i) * c->Dv + e] = a;
            }
            if (!dq)
                continue;
            double rsum = 0;
            for (int64_t j = 0; j < c->Tk; j++) {
                double a = 0;
                for (int64_t e = 0; e < c->Dv; e++)
                    a += (double)dO[i * c->Dv + e] * v[j * c->Dv + e];
                dp[j] = a;
                rsum += a * s[j];
            }
            for (int64_t j = 0; j < c->Tk; j++) {
                double ds = s[j] * (dp[j] - rsum) * sc;
                for (int64_t e = 0; e < c->D; e++) {
                    dq[(b * c->Tq + i) * c->D + e] += ds * k[j * c->D + e];
                    dk[(b * c->Tk + j) * c->D + e] += ds * q[i * c->D + e];
                }
                for (int64_t e = 0; e < c->Dv; e++)
                    dv[(b * c->Tk + j) * c->Dv + e] += s[j] * dO[i * c->Dv + e];
            }
        }
    }
    free(s);
    free(dp);
}

/* What one run produced: y and (if grads) dq, dk, dv, as f32. */
typedef struct run_out {
    float *y, *dq, *dk, *dv;
    int rc;
    uint64_t fallbacks, sim_kernels;
} run_out;

static void run_free(run_out *r) { free(r->y), free(r->dq), free(r->dk), free(r->dv); }

static float *read_f32(nt_tensor *t)
{
    int64_t n = nt_numel(t);
    float *p = malloc((size_t)(n + 1) * sizeof(float));
    nt_tensor *f = nt_dtype_of(t) == NT_F32 ? t : nt_cast(t, NT_F32);
    assert_non_null(f);
    assert_int_equal(nt_to_host(nt_contiguous(f), p, (size_t)n * sizeof(float)), 0);
    return p;
}

/* Runs the op (and its backward with dO when grads) in the current
 * configuration.  strided: q, k, v come in as [B, T, H, D] permuted. */
static void run(const host *h, nt_dtype dt, bool grads, bool strided, bool chain, run_out *r)
{
    const cfg *c = &h->c;
    memset(r, 0, sizeof *r);
    nt_stats_reset();
    nt_scope *sc = nt_scope_begin();
    int64_t qs[4] = {c->B, c->H, c->Tq, c->D}, ks[4] = {c->B, c->H, c->Tk, c->D};
    int64_t vs[4] = {c->B, c->H, c->Tk, c->Dv}, os[4] = {c->B, c->H, c->Tq, c->Dv};
    nt_tensor *q = nt_from_host(h->q, NT_F32, 4, qs), *k = nt_from_host(h->k, NT_F32, 4, ks);
    nt_tensor *v = nt_from_host(h->v, NT_F32, 4, vs);
    if (strided) { /* the same values laid out [B, T, H, D], viewed [B, H, T, D] */
        q = nt_transpose(nt_contiguous(nt_transpose(q, 1, 2)), 1, 2);
        k = nt_transpose(nt_contiguous(nt_transpose(k, 1, 2)), 1, 2);
        v = nt_transpose(nt_contiguous(nt_transpose(v, 1, 2)), 1, 2);
    }
    if (dt != NT_F32)
        q = nt_cast(q, dt), k = nt_cast(k, dt), v = nt_cast(v, dt);
    nt_tensor *leaf[3] = {q, k, v};
    if (grads)
        for (int i = 0; i < 3; i++) {
            leaf[i] = nt_detach(leaf[i]);
            nt_set_requires_grad(leaf[i], true);
        }
    nt_tensor *mask = NULL;
    int64_t ms[4] = {c->B, c->H, c->Tq, c->Tk};
    int mnd = c->mask_bh ? 4 : 2;
    const int64_t *msh = c->mask_bh ? ms : ms + 2;
    if (c->mask == M_U8)
        mask = nt_from_host(h->mu8, NT_U8, mnd, msh);
    if (c->mask == M_ADD)
        mask = nt_from_host(h->madd, NT_F32, mnd, msh);
    nt_sync();
    nt_stats_reset();
    nt_tensor *qq = leaf[0], *kk = leaf[1], *vv = leaf[2];
    if (chain)
        qq = nt_mul_scalar(qq, 1.0), kk = nt_mul_scalar(kk, 1.0), vv = nt_mul_scalar(vv, 1.0);
    nt_tensor *y = nt_scaled_dot_product_attention(qq, kk, vv, mask, c->causal, c->scale);
    if (chain && y)
        y = nt_mul_scalar(y, 1.0);
    if (!y) {
        r->rc = nt_last_error();
        print_message("sdpa failed: %s\n", nt_last_error_message());
        for (int i = 0; grads && i < 3; i++)
            nt_release(leaf[i]);
        nt_scope_end(sc);
        return;
    }
    if (grads) {
        nt_tensor *g = nt_from_host(h->dO, NT_F32, 4, os);
        if (dt != NT_F32)
            g = nt_cast(g, dt);
        nt_tensor *l = nt_sum(nt_mul(y, g), NT_DIM_ALL, false);
        assert_non_null(l);
        r->rc = nt_backward(l);
        if (r->rc)
            print_message("backward failed: %s\n", nt_last_error_message());
    }
    if (!r->rc && nt_sync()) {
        r->rc = nt_last_error();
        print_message("sync failed: %s\n", nt_last_error_message());
    }
    if (!r->rc) {
        r->y = read_f32(y);
        if (grads) {
            r->dq = read_f32(nt_grad(leaf[0]));
            r->dk = read_f32(nt_grad(leaf[1]));
            r->dv = read_f32(nt_grad(leaf[2]));
        }
    }
    nt_stats st;
    nt_stats_get(&st);
    r->fallbacks = st.cpu_fallbacks;
    r->sim_kernels = st.sim_kernels;
    for (int i = 0; grads && i < 3; i++)
        nt_release(leaf[i]);
    nt_scope_end(sc);
}

/* max |a - ref| / max(max |ref|, floor) */
static double rel_err(const float *a, const double *ref, int64_t n, double floor_)
{
    double mx = floor_, e = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= e)) /* NaN too */
            e = isnan(d) ? INFINITY : d;
    }
    return e / mx;
}

static void check_values(const cfg *c, nt_dtype dt, double ytol, double gtol)
{
    host h;
    host_make(&h, c, (uint64_t)(c->Tq * 131 + c->Tk * 7 + c->D + c->mask));
    int64_t BH = c->B * c->H;
    int64_t ny = BH * c->Tq * c->Dv, nq = BH * c->Tq * c->D, nk = BH * c->Tk * c->D,
            nv = BH * c->Tk * c->Dv;
    double *y = malloc((size_t)(ny + 1) * sizeof(double)), *dq = malloc((size_t)(nq + 1) * 8),
           *dk = malloc((size_t)(nk + 1) * 8), *dv = malloc((size_t)(nv + 1) * 8);
    reference(&h, y, dq, dk, dv);
    run_out r;
    run(&h, dt, true, false, false, &r);
    assert_int_equal(r.rc, 0);
    double ey = rel_err(r.y, y, ny, 1e-3), eq = rel_err(r.dq, dq, nq, 1e-3),
           ek = rel_err(r.dk, dk, nk, 1e-3), ev = rel_err(r.dv, dv, nv, 1e-3);
    if (ey > ytol || eq > gtol || ek > gtol || ev > gtol)
        print_message("B%lld H%lld Tq%lld Tk%lld D%lld Dv%lld causal %d mask %d %s: "
                      "y %.3g dq %.3g dk %.3g dv %.3g\n",
                      (long long)c->B, (long long)c->H, (long long)c->Tq, (long long)c->Tk,
                      (long long)c->D, (long long)c->Dv, c->causal, c->mask, nt_dtype_name(dt),
                      ey, eq, ek, ev);
    assert_true(ey <= ytol);
    assert_true(eq <= gtol && ek <= gtol && ev <= gtol);
    run_free(&r);
    free(y), free(dq), free(dk), free(dv);
    host_free(&h);
}

static const cfg shapes[] = {
    {1, 1, 1, 1, 8, 8, false, M_NONE, false, 0},
    {1, 2, 5, 5, 16, 8, true, M_NONE, false, 0},
    {2, 1, 5, 7, 8, 12, false, M_U8, false, 0},
    {1, 2, 129, 129, 32, 32, true, M_NONE, false, 0},
    {1, 1, 129, 300, 16, 24, false, M_ADD, false, 0.3},
    {2, 2, 300, 129, 24, 16, false, M_U8, true, 0},
    {1, 1, 300, 300, 64, 40, true, M_ADD, false, 0},
    {1, 1, 257, 130, 8, 8, true, M_U8, false, -0.2},
    {1, 2, 3, 0, 4, 5, false, M_NONE, false, 0}, /* no keys: zeros */
    {2, 1, 0, 5, 4, 5, true, M_NONE, false, 0},  /* no queries: empty */
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* f32 values within 1e-5 (relative to the largest) of the double
 * reference, gradients within 1e-4, on the CPU and on the simulator */
static void test_values_cpu(void **state)
{
    (void)state;
    config("cpu", "deterministic", "1");
    for (size_t i = 0; i < NSHAPES; i++)
        check_values(&shapes[i], NT_F32, 1e-5, 1e-4);
}

static void test_values_sim(void **state)
{
    (void)state;
    config("sim", "deterministic", "1");
    for (size_t i = 0; i < NSHAPES; i++)
        check_values(&shapes[i], NT_F32, 1e-5, 1e-4);
}

/* bf16 inputs: bf16 output, the arithmetic still f32 (bf16's precision) */
static void test_values_bf16(void **state)
{
    (void)state;
    config("cpu", "deterministic", "1");
    cfg c = {1, 2, 70, 140, 16, 16, true, M_NONE, false, 0};
    /* the reference sees the f32 inputs; bf16 rounding of inputs and output */
    check_values(&c, NT_BF16, 3e-2, 6e-2);
}

static void assert_same(const float *a, const float *b, int64_t n, const char *what)
{
    if (memcmp(a, b, (size_t)n * sizeof(float))) {
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&a[i], &b[i], 4)) {
                print_message("%s differs at %lld: %.9g vs %.9g\n", what, (long long)i,
                              (double)a[i], (double)b[i]);
                break;
            }
        fail();
    }
}

static void assert_run_same(const host *h, const run_out *a, const run_out *b)
{
    const cfg *c = &h->c;
    int64_t BH = c->B * c->H;
    assert_same(a->y, b->y, BH * c->Tq * c->Dv, "y");
    assert_same(a->dq, b->dq, BH * c->Tq * c->D, "dq");
    assert_same(a->dk, b->dk, BH * c->Tk * c->D, "dk");
    assert_same(a->dv, b->dv, BH * c->Tk * c->Dv, "dv");
}

/* The simulator's tile program gives the CPU kernel's bits, forward and
 * backward, f32 and bf16, and nothing falls back to the CPU. */
static void test_sim_equals_cpu(void **state)
{
    (void)state;
    nt_dtype dts[2] = {NT_F32, NT_BF16};
    for (size_t i = 0; i < NSHAPES; i++)
        for (int d = 0; d < 2; d++) {
            host h;
            host_make(&h, &shapes[i], 7 + i);
            run_out a, b;
            config("cpu", "deterministic", "1");
            run(&h, dts[d], true, false, false, &a);
            config("sim", "deterministic", "1");
            run(&h, dts[d], true, false, false, &b);
            assert_int_equal(a.rc, 0);
            assert_int_equal(b.rc, 0);
            assert_int_equal(b.fallbacks, 0);
            assert_true(b.sim_kernels > 0);
            assert_run_same(&h, &a, &b);
            run_free(&a);
            run_free(&b);
            host_free(&h);
        }
}

/* Every mode and fusion setting, on both backends, and strided (permuted)
 * inputs: the same bits as the deterministic CPU run. */
static void test_modes_and_strides(void **state)
{
    (void)state;
    static const char *be[2] = {"cpu", "sim"};
    static const char *modes[4][2] = {
        {"deterministic", "1"}, {"adaptive", "1"}, {"lazy", "1"}, {"eager", "0"}};
    cfg c = {2, 2, 130, 131, 16, 8, true, M_U8, false, 0};
    host h;
    host_make(&h, &c, 99);
    run_out ref;
    config("cpu", "deterministic", "1");
    run(&h, NT_F32, true, false, false, &ref);
    assert_int_equal(ref.rc, 0);
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 4; m++)
            for (int st = 0; st < 2; st++) {
                run_out r;
                config(be[b], modes[m][0], modes[m][1]);
                run(&h, NT_F32, true, st == 1, true, &r);
                assert_int_equal(r.rc, 0);
                assert_run_same(&h, &ref, &r);
                run_free(&r);
            }
    run_free(&ref);
    host_free(&h);
}

/* The CPU kernel leaves out the masked half of a causal block when the
 * operands the left-out terms read are finite (cpu/attention.c): with
 * finite operands, and with an Inf, a NaN or a -0 planted in one row of q,
 * k, v or dO (so some blocks skip and others, reading them, do not), the
 * bits of computing every block whole, and of the simulator's program. */
static void test_causal_skip_bitwise(void **state)
{
    (void)state;
    static const cfg cs[] = {
        {2, 2, 128, 128, 32, 32, true, M_NONE, false, 0}, /* the GPT's head */
        {1, 2, 300, 300, 16, 24, true, M_NONE, false, 0}, /* 3 blocks, a short last one */
        {1, 1, 257, 130, 8, 8, true, M_U8, false, -0.2},  /* Tq != Tk, with a mask */
        {1, 1, 45, 45, 8, 8, true, M_ADD, false, 0},      /* groups of SUB cut short */
    };
    static const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0x80000000u};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int plant = -1; plant < 16; plant++) {
            host h;
            host_make(&h, &cs[i], 31 + i);
            const cfg *c = &h.c;
            if (plant >= 0) { /* operand plant % 4, value plant / 4, one element */
                float *arr[4] = {h.q, h.k, h.v, h.dO};
                int64_t len[4] = {c->B * c->H * c->Tq * c->D, c->B * c->H * c->Tk * c->D,
                                  c->B * c->H * c->Tk * c->Dv, c->B * c->H * c->Tq * c->Dv};
                int op = plant % 4;
                int64_t at = (len[op] / 3 + 7 * plant) % len[op];
                memcpy(&arr[op][at], &special[plant / 4], 4);
            }
            run_out a, b;
            config("cpu", "deterministic", "1");
            __atomic_store_n(&nt__cpu_attn_causal_skip, 1, __ATOMIC_RELAXED);
            run(&h, NT_F32, true, false, false, &a);
            __atomic_store_n(&nt__cpu_attn_causal_skip, 0, __ATOMIC_RELAXED);
            run(&h, NT_F32, true, false, false, &b);
            __atomic_store_n(&nt__cpu_attn_causal_skip, 1, __ATOMIC_RELAXED);
            assert_int_equal(a.rc, 0);
            assert_int_equal(b.rc, 0);
            assert_run_same(&h, &a, &b);
            if (plant < 0) {
                run_free(&b);
                config("sim", "deterministic", "1");
                run(&h, NT_F32, true, false, false, &b);
                assert_int_equal(b.rc, 0);
                assert_run_same(&h, &a, &b);
            }
            run_free(&a);
            run_free(&b);
            host_free(&h);
        }
}

/* A row that may attend no key gives 0 and gradient 0 (PyTorch: NaN);
 * other rows are unaffected. */
static void test_fully_masked_row(void **state)
{
    (void)state;
    cfg c = {1, 1, 4, 140, 8, 8, false, M_U8, false, 0};
    host h;
    host_make(&h, &c, 5);
    memset(h.mu8 + 2 * c.Tk, 0, (size_t)c.Tk); /* row 2 attends nothing */
    int64_t ny = c.Tq * c.Dv;
    double *y = malloc((size_t)ny * sizeof(double)), *dq = malloc((size_t)(c.Tq * c.D) * 8),
           *dk = malloc((size_t)(c.Tk * c.D) * 8), *dv = malloc((size_t)(c.Tk * c.Dv) * 8);
    reference(&h, y, dq, dk, dv);
    for (int b = 0; b < 2; b++) {
        config(b ? "sim" : "cpu", "deterministic", "1");
        run_out r;
        run(&h, NT_F32, true, false, false, &r);
        assert_int_equal(r.rc, 0);
        for (int64_t e = 0; e < c.Dv; e++)
            assert_true(r.y[2 * c.Dv + e] == 0.0f);
        for (int64_t e = 0; e < c.D; e++)
            assert_true(r.dq[2 * c.D + e] == 0.0f);
        assert_true(rel_err(r.y, y, ny, 1e-3) <= 1e-5);
        assert_true(rel_err(r.dk, dk, c.Tk * c.D, 1e-3) <= 1e-4);
        run_free(&r);
    }
    free(y), free(dq), free(dk), free(dv);
    host_free(&h);
}

static nt_tensor *attn_f(nt_tensor *const *in, void *ctx)
{
    const cfg *c = ctx;
    nt_tensor *mask = NULL;
    if (c->mask == M_U8) {
        uint8_t m[6 * 9];
        for (int i = 0; i < 54; i++)
            m[i] = i % 9 == 0 || i % 4 != 1;
        mask = nt_from_host(m, NT_U8, 2, (int64_t[]){6, 9});
    } else if (c->mask == M_ADD) {
        float m[9];
        for (int i = 0; i < 9; i++)
            m[i] = 0.25f * (float)(i % 3) - 0.3f;
        mask = nt_from_host(m, NT_F32, 1, (int64_t[]){9});
    }
    return nt_scaled_dot_product_attention(in[0], in[1], in[2], mask, c->causal, c->scale);
}

/* Finite differences agree with the recomputing backward. */
static void test_gradcheck(void **state)
{
    (void)state;
    config("cpu", "deterministic", "1");
    cfg cs[3] = {{1, 2, 6, 9, 5, 3, true, M_NONE, false, 0},
                 {1, 2, 6, 9, 5, 3, false, M_U8, false, 0.7},
                 {1, 2, 6, 9, 5, 3, false, M_ADD, false, 0}};
    for (int t = 0; t < 3; t++) {
        nt_scope *sc = nt_scope_begin();
        host h;
        host_make(&h, &cs[t], 3 + t);
        nt_tensor *in[3] = {nt_from_host(h.q, NT_F32, 3, (int64_t[]){2, 6, 5}),
                            nt_from_host(h.k, NT_F32, 3, (int64_t[]){2, 9, 5}),
                            nt_from_host(h.v, NT_F32, 3, (int64_t[]){2, 9, 3})};
        for (int i = 0; i < 3; i++)
            nt_set_requires_grad(in[i], true);
        int rc = nt_gradcheck(attn_f, in, 3, &cs[t], 1e-2, 2e-3, 2e-2);
        if (rc)
            print_message("%s\n", nt_last_error_message());
        assert_int_equal(rc, 0);
        host_free(&h);
        nt_scope_end(sc);
    }
}

/* A head too long for the simulator's SBUF runs on the CPU backend (the
 * same arithmetic): counted as a fallback, refused at the call under
 * NT_REQUIRE_SIM=1. */
static void test_long_falls_back(void **state)
{
    (void)state;
    cfg c = {1, 1, 1, 40000, 8, 8, false, M_NONE, false, 0};
    host h;
    host_make(&h, &c, 11);
    double *y = malloc(8 * sizeof(double)), *dq = malloc(8 * 8),
           *dk = malloc((size_t)(40000 * 8) * 8), *dv = malloc((size_t)(40000 * 8) * 8);
    reference(&h, y, dq, dk, dv);
    run_out a, b;
    config("cpu", "deterministic", "1");
    run(&h, NT_F32, true, false, false, &a);
    config("sim", "deterministic", "1");
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "0"), 0);
    run(&h, NT_F32, true, false, false, &b);
    assert_int_equal(a.rc, 0);
    assert_int_equal(b.rc, 0);
    assert_true(b.fallbacks >= 2); /* the forward and the backward */
    assert_run_same(&h, &a, &b);
    assert_true(rel_err(b.y, y, 8, 1e-3) <= 1e-5);
    assert_true(rel_err(b.dk, dk, 40000 * 8, 1e-3) <= 1e-4);
    run_free(&a);
    run_free(&b);
    /* NT_REQUIRE_SIM=1: a clear error at the call, naming the function */
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", "1"), 0);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *q = nt_zeros(NT_F32, 2, (int64_t[]){1, 8});
    nt_tensor *k = nt_zeros(NT_F32, 2, (int64_t[]){40000, 8});
    assert_null(nt_scaled_dot_product_attention(q, k, k, NULL, false, 0));
    assert_int_equal(nt_last_error(), NT_ENOTSUP);
    assert_non_null(strstr(nt_last_error_message(), "nt_scaled_dot_product_attention"));
    nt_clear_error();
    nt_scope_end(sc);
    free(y), free(dq), free(dk), free(dv);
    host_free(&h);
}

/* autocast: the inputs run in bf16 (the amp column LOW), like PyTorch's
 * sdpa under autocast. */
static void test_autocast(void **state)
{
    (void)state;
    config("cpu", "deterministic", "1");
    nt_scope *sc = nt_scope_begin();
    nt_tensor *q = nt_randn(NT_F32, 3, (int64_t[]){2, 5, 8}, 1);
    assert_int_equal(nt_autocast_begin(NT_BF16), 0);
    nt_tensor *y = nt_scaled_dot_product_attention(q, q, q, NULL, true, 0);
    assert_int_equal(nt_autocast_end(), 0);
    assert_non_null(y);
    assert_int_equal(nt_dtype_of(y), NT_BF16);
    assert_int_equal(nt_ndim(y), 3);
    assert_int_equal(nt_shape(y, 2), 8);
    nt_scope_end(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_values_cpu, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_values_sim, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_values_bf16, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_sim_equals_cpu, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_modes_and_strides, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_causal_skip_bitwise, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_fully_masked_row, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_long_falls_back, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_autocast, nt_test_setup, nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
