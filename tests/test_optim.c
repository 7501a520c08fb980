/* tests/test_optim.c - every optimizer against hand-computed updates (and
 * PyTorch 1.13: tests/torch_refs/optim.h), parameter groups, schedulers, their
 * error paths, master weights, checkpoints (round trip bit for bit, every
 * kind of bad file), a short training run, and bitwise-identical training
 * across modes. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "crc32.h"
#include "ntensor.h"
#include "nt_test.h"
#include "torch_refs/optim.h"


static int group_setup(void **state)
{
    (void)state;
    return nt_test_dir_make("optim");
}

static int group_teardown(void **state)
{
    (void)state;
    return nt_test_dir_remove();
}

/* A path in the test's directory (a small ring of buffers: copy it to keep
 * it across more than 8 calls). */
static const char *tpath(const char *name)
{
    static char buf[8][400];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 400, "%s/%s", nt_test_dir, name);
    return p;
}

#define N 5

static nt_tensor *param_f32(const float *v, int n)
{
    nt_tensor *t = nt_from_host(v, NT_F32, 1, (int64_t[]){n});
    assert_non_null(t);
    assert_int_equal(nt_set_requires_grad(t, true), 0);
    return t;
}

/* Gives p the gradient g exactly: loss = sum(p * g). */
static void set_grad(nt_tensor *p, const float *g, int n)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *c = nt_from_host(g, NT_F32, 1, (int64_t[]){n});
    assert_int_equal(nt_backward(nt_sum(nt_mul(p, c), NT_DIM_ALL, false)), 0);
    nt_scope_end(s);
}

static void read_f32(nt_tensor *t, float *out, int n)
{
    assert_int_equal(nt_to_host(t, out, sizeof(float) * (size_t)n), 0);
}

/* Within a few f32 ulps of the double-precision formula. */
static void assert_near(const float *got, const double *want, int n)
{
    for (int i = 0; i < n; i++) {
        double tol = 4 * FLT_EPSILON * fmax(fabs(want[i]), 1.0);
        if (fabs((double)got[i] - want[i]) > tol) {
            print_error("element %d: got %.9g, want %.9g (tolerance %.3g)\n", i, got[i],
                        want[i], tol);
            fail();
        }
    }
}

static const float P0[N] = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f};
static const float G[3][N] = {
    {0.1f, -0.4f, 0.25f, 1.5f, -0.05f},
    {-0.2f, 0.3f, 0.35f, 0.9f, 0.15f},
    {0.05f, -0.6f, -0.1f, 1.1f, 0.4f},
};

/* ---------------- SGD ---------------- */

typedef struct {
    double lr, momentum, wd;
    bool nesterov;
} sgd_cfg;

static void sgd_reference(const sgd_cfg *c, int steps, double *p)
{
    double buf[N];
    for (int i = 0; i < N; i++)
        p[i] = P0[i];
    for (int t = 0; t < steps; t++)
        for (int i = 0; i < N; i++) {
            double g = (double)G[t][i] + c->wd * p[i];
            if (c->momentum != 0) {
                buf[i] = t == 0 ? g : c->momentum * buf[i] + g;
                g = c->nesterov ? g + c->momentum * buf[i] : buf[i];
            }
            p[i] -= c->lr * g;
        }
}

static void test_sgd_against_formulas(void **state)
{
    (void)state;
    const sgd_cfg cfgs[] = {
        {0.1, 0, 0, false},     /* plain */
        {0.1, 0.9, 0, false},   /* momentum */
        {0.05, 0.8, 0, true},   /* nesterov */
        {0.1, 0.9, 0.1, false}, /* weight decay with momentum */
        {0.2, 0, 0.05, false},  /* weight decay alone */
        {0.1, 0.5, 0.2, true},  /* all of it */
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        const sgd_cfg *c = &cfgs[k];
        nt_tensor *p = param_f32(P0, N);
        nt_optim *o = nt_optim_sgd(&p, 1, c->lr, c->momentum, c->wd, c->nesterov);
        assert_non_null(o);
        for (int t = 0; t < 3; t++) {
            set_grad(p, G[t], N);
            assert_int_equal(nt_optim_step(o), 0);
            assert_int_equal(nt_optim_zero_grad(o), 0);
            float got[N];
            double want[N];
            read_f32(p, got, N);
            sgd_reference(c, t + 1, want);
            assert_near(got, want, N);
        }
        assert_int_equal(nt_optim_steps(o), 3);
        nt_optim_destroy(o);
        nt_release(p);
    }
}

/* ---------------- AdamW ---------------- */

typedef struct {
    double lr, b1, b2, eps, wd;
} adam_cfg;

/* steps_of[i]: the step count of each element's parameter (all one here). */
static void adamw_reference(const adam_cfg *c, int steps, double *p)
{
    double m[N] = {0}, v[N] = {0};
    for (int i = 0; i < N; i++)
        p[i] = P0[i];
    for (int t = 1; t <= steps; t++)
        for (int i = 0; i < N; i++) {
            double g = G[t - 1][i];
            p[i] *= 1 - c->lr * c->wd;
            m[i] = c->b1 * m[i] + (1 - c->b1) * g;
            v[i] = c->b2 * v[i] + (1 - c->b2) * g * g;
            double bc1 = 1 - pow(c->b1, t), bc2 = 1 - pow(c->b2, t);
            p[i] -= c->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + c->eps);
        }
}

static void test_adamw_against_formulas(void **state)
{
    (void)state;
    const adam_cfg cfgs[] = {
        {0.01, 0.9, 0.999, 1e-8, 0.01},
        {0.05, 0.8, 0.99, 1e-3, 0},
        {0.02, 0.5, 0.9, 0.1, 0.5},
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        const adam_cfg *c = &cfgs[k];
        nt_tensor *p = param_f32(P0, N);
        nt_optim *o = nt_optim_adamw(&p, 1, c->lr, c->b1, c->b2, c->eps, c->wd);
        assert_non_null(o);
        for (int t = 0; t < 3; t++) {
            set_grad(p, G[t], N);
            assert_int_equal(nt_sgd_step(o), 0); /* the alias works for any optimizer */
            assert_int_equal(nt_optim_zero_grad(o), 0);
            float got[N];
            double want[N];
            read_f32(p, got, N);
            adamw_reference(c, t + 1, want);
            assert_near(got, want, N);
        }
        nt_optim_destroy(o);
        nt_release(p);
    }
}

/* A parameter without a .grad is skipped and its step count stays: its
 * first real update uses bias corrections of step 1, as in PyTorch. */
static void test_skip_without_grad(void **state)
{
    (void)state;
    const adam_cfg c = {0.01, 0.9, 0.999, 1e-8, 0.01};
    nt_tensor *a = param_f32(P0, N), *b = param_f32(P0, N);
    nt_tensor *ps[2] = {a, b};
    nt_optim *o = nt_optim_adamw(ps, 2, c.lr, c.b1, c.b2, c.eps, c.wd);
    assert_non_null(o);
    for (int t = 0; t < 2; t++) {
        set_grad(a, G[t], N);
        assert_int_equal(nt_optim_step(o), 0);
        nt_optim_zero_grad(o);
    }
    float got[N];
    read_f32(b, got, N);
    assert_memory_equal(got, P0, sizeof got); /* untouched, bit for bit */
    /* b's first update: step 1 for b (a is at step 3 and gets no grad) */
    set_grad(b, G[0], N);
    assert_int_equal(nt_optim_step(o), 0);
    double want[N];
    read_f32(b, got, N);
    adamw_reference(&c, 1, want);
    assert_near(got, want, N);
    read_f32(a, got, N);
    adamw_reference(&c, 2, want);
    assert_near(got, want, N);
    assert_int_equal(nt_optim_steps(o), 3);
    nt_optim_destroy(o);
    nt_release(a), nt_release(b);
}

static void test_zero_grad_and_lr(void **state)
{
    (void)state;
    nt_tensor *p = param_f32(P0, N);
    nt_optim *o = nt_optim_sgd(&p, 1, 0.1, 0, 0, false);
    set_grad(p, G[0], N);
    nt_tensor *g = nt_grad(p);
    assert_non_null(g);
    nt_release(g);
    assert_int_equal(nt_optim_zero_grad(o), 0);
    assert_null(nt_grad(p));
    assert_int_equal(nt_last_error(), 0);
    /* no grad: a step changes nothing */
    assert_int_equal(nt_optim_step(o), 0);
    float got[N];
    read_f32(p, got, N);
    assert_memory_equal(got, P0, sizeof got);
    /* set_lr / get_lr, and lr 0 changes nothing */
    assert_true(nt_optim_get_lr(o) == 0.1);
    assert_int_equal(nt_optim_set_lr(o, 0.0), 0);
    assert_true(nt_optim_get_lr(o) == 0.0);
    set_grad(p, G[0], N);
    assert_int_equal(nt_optim_step(o), 0);
    read_f32(p, got, N);
    assert_memory_equal(got, P0, sizeof got);
    /* a new lr takes effect at the next step */
    assert_int_equal(nt_optim_set_lr(o, 0.25), 0);
    assert_int_equal(nt_optim_step(o), 0);
    read_f32(p, got, N);
    double want[N];
    for (int i = 0; i < N; i++)
        want[i] = (double)P0[i] - 0.25 * G[0][i];
    assert_near(got, want, N);
    /* bad lr values are refused and leave lr alone */
    assert_int_equal(nt_optim_set_lr(o, -1), NT_EINVAL);
    assert_int_equal(nt_optim_set_lr(o, NAN), NT_EINVAL);
    assert_int_equal(nt_optim_set_lr(o, INFINITY), NT_EINVAL);
    nt_clear_error();
    assert_true(nt_optim_get_lr(o) == 0.25);
    nt_optim_destroy(o);
    nt_release(p);
}

static void expect_null(nt_optim *o, int code)
{
    assert_null(o);
    assert_int_equal(nt_last_error(), code);
    assert_true(strlen(nt_last_error_message()) > 0);
    nt_clear_error();
}

static void test_api_errors(void **state)
{
    (void)state;
    nt_tensor *p = param_f32(P0, N), *q = param_f32(P0, N);
    nt_tensor *ps[2] = {p, q};
    expect_null(nt_optim_sgd(NULL, 1, 0.1, 0, 0, false), NT_EINVAL);
    expect_null(nt_optim_sgd(ps, 0, 0.1, 0, 0, false), NT_EINVAL);
    expect_null(nt_optim_sgd(ps, -3, 0.1, 0, 0, false), NT_EINVAL);
    expect_null(nt_optim_adamw(NULL, 1, 1e-3, 0.9, 0.999, 1e-8, 0), NT_EINVAL);
    expect_null(nt_optim_adamw(ps, 0, 1e-3, 0.9, 0.999, 1e-8, 0), NT_EINVAL);
    expect_null(nt_optim_sgd(ps, 2, -0.1, 0, 0, false), NT_EINVAL);
    expect_null(nt_optim_sgd(ps, 2, NAN, 0, 0, false), NT_EINVAL);
    expect_null(nt_optim_sgd(ps, 2, 0.1, -0.9, 0, false), NT_EINVAL);
    expect_null(nt_optim_sgd(ps, 2, 0.1, 0.9, -1, false), NT_EINVAL);
    expect_null(nt_optim_sgd(ps, 2, 0.1, 0, 0, true), NT_EINVAL); /* nesterov, no momentum */
    expect_null(nt_optim_adamw(ps, 2, -1e-3, 0.9, 0.999, 1e-8, 0), NT_EINVAL);
    expect_null(nt_optim_adamw(ps, 2, 1e-3, 1.0, 0.999, 1e-8, 0), NT_EINVAL);
    expect_null(nt_optim_adamw(ps, 2, 1e-3, 0.9, -0.1, 1e-8, 0), NT_EINVAL);
    expect_null(nt_optim_adamw(ps, 2, 1e-3, 0.9, 0.999, -1, 0), NT_EINVAL);
    expect_null(nt_optim_adamw(ps, 2, 1e-3, 0.9, 0.999, 1e-8, -0.1), NT_EINVAL);
    /* the same tensor twice */
    nt_tensor *dup[2] = {p, p};
    expect_null(nt_optim_sgd(dup, 2, 0.1, 0, 0, false), NT_EINVAL);
    /* a NULL entry, an integer tensor, a non-leaf */
    nt_tensor *withnull[2] = {p, NULL};
    expect_null(nt_optim_sgd(withnull, 2, 0.1, 0, 0, false), NT_EINVAL);
    nt_tensor *it = nt_zeros(NT_I32, 1, (int64_t[]){3});
    expect_null(nt_optim_sgd(&it, 1, 0.1, 0, 0, false), NT_EDTYPE);
    nt_tensor *nonleaf = nt_mul_scalar(p, 2);
    assert_null(nt_optim_adamw(&nonleaf, 1, 1e-3, 0.9, 0.999, 1e-8, 0));
    assert_int_equal(nt_last_error(), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "leaf"));
    nt_clear_error();
    nt_release(it), nt_release(nonleaf);
    /* a released tensor */
    nt_tensor *gone = param_f32(P0, N);
    nt_release(gone);
    nt_tensor *withgone[2] = {p, gone};
    expect_null(nt_optim_sgd(withgone, 2, 0.1, 0, 0, false), NT_ERELEASED);
    /* NULL optimizer everywhere */
    assert_int_equal(nt_optim_step(NULL), NT_EINVAL);
    assert_int_equal(nt_sgd_step(NULL), NT_EINVAL);
    assert_int_equal(nt_optim_zero_grad(NULL), NT_EINVAL);
    assert_int_equal(nt_optim_set_lr(NULL, 0.1), NT_EINVAL);
    assert_true(isnan(nt_optim_get_lr(NULL)));
    assert_true(nt_optim_steps(NULL) < 0);
    assert_int_equal(nt_optim_set_master_weights(NULL, true), NT_EINVAL);
    nt_optim_destroy(NULL);
    nt_clear_error();
    /* the optimizer keeps its parameters alive after the user lets go */
    nt_optim *o = nt_optim_sgd(ps, 2, 0.5, 0, 0, false);
    assert_non_null(o);
    nt_tensor *g = nt_from_host(G[0], NT_F32, 1, (int64_t[]){N});
    set_grad(p, G[0], N);
    nt_release(p);
    assert_int_equal(nt_optim_step(o), 0);
    assert_int_equal(nt_sync(), 0);
    nt_optim_destroy(o);
    nt_release(q), nt_release(g);
}

static bool files_equal(const char *a, const char *b)
{
    FILE *f1 = fopen(a, "rb"), *f2 = fopen(b, "rb");
    assert_non_null(f1);
    assert_non_null(f2);
    int c1, c2;
    bool eq = true;
    do {
        c1 = fgetc(f1), c2 = fgetc(f2);
        eq = c1 == c2;
    } while (eq && c1 != EOF);
    fclose(f1), fclose(f2);
    return eq;
}

/* ---------------- master weights ---------------- */

static float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even (finite values) */
    return (uint16_t)(u >> 16);
}

/* Updates smaller than half a bf16 ulp vanish without masters and add up
 * with them. */
static void test_master_weights(void **state)
{
    (void)state;
    const float one[N] = {1, 1, 1, 1, 1};
    const float gv[N] = {1, 1, 1, 1, 1};
    for (int master = 0; master < 2; master++) {
        nt_tensor *p32 = nt_from_host(one, NT_F32, 1, (int64_t[]){N});
        nt_tensor *p = nt_cast(p32, NT_BF16);
        nt_release(p32);
        assert_int_equal(nt_set_requires_grad(p, true), 0);
        nt_optim *o = nt_optim_sgd(&p, 1, 1e-3, 0, 0, false);
        assert_int_equal(nt_optim_set_master_weights(o, master), 0);
        float m = 1.0f;
        for (int t = 0; t < 10; t++) {
            nt_scope *s = nt_scope_begin();
            nt_tensor *c = nt_cast(nt_from_host(gv, NT_F32, 1, (int64_t[]){N}), NT_BF16);
            assert_int_equal(nt_backward(nt_sum(nt_mul(p, c), NT_DIM_ALL, false)), 0);
            nt_scope_end(s);
            assert_int_equal(nt_optim_step(o), 0);
            nt_optim_zero_grad(o);
            m = m - (float)1e-3 * 1.0f;
        }
        uint16_t got[N];
        assert_int_equal(nt_to_host(p, got, sizeof got), 0);
        for (int i = 0; i < N; i++) {
            if (master)
                assert_int_equal(got[i], f32_to_bf16(m));
            else
                assert_true(bf16_to_f32(got[i]) == 1.0f);
        }
        if (master) {
            /* the masters survive a checkpoint, and turning them off keeps
             * the rounded values */
            const char *path = tpath("master.ckpt");
            assert_int_equal(nt_save(path, &p, 1, o), 0);
            nt_optim *o2 = nt_optim_sgd(&p, 1, 1e-3, 0, 0, false);
            assert_int_equal(nt_load(path, &p, 1, o2), 0);
            const char *path2 = tpath("master2.ckpt");
            assert_int_equal(nt_save(path2, &p, 1, o2), 0);
            assert_true(files_equal(path, path2));
            nt_optim_destroy(o2);
            assert_int_equal(nt_optim_set_master_weights(o, false), 0);
            assert_int_equal(nt_to_host(p, got, sizeof got), 0);
            assert_int_equal(got[0], f32_to_bf16(m));
        }
        nt_optim_destroy(o);
        nt_release(p);
    }
}

/* ---------------- a small MLP for training tests ---------------- */

enum { IN = 8, HID = 16, OUT = 4, BATCH = 32 };

typedef struct {
    nt_tensor *p[4]; /* w1 [HID, IN], b1, w2 [OUT, HID], b2 */
    nt_tensor *x, *y;
} mlp;

static nt_tensor *uparam(int ndim, const int64_t *shape, double bound, uint64_t seed)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *t = nt_keep(nt_add_scalar(nt_mul_scalar(nt_rand(NT_F32, ndim, shape, seed),
                                                       2 * bound), -bound));
    nt_scope_end(s);
    nt_set_requires_grad(t, true);
    return t;
}

/* Labels from a fixed random linear teacher, so the problem is learnable. */
static void mlp_init(mlp *m, uint64_t seed)
{
    m->p[0] = uparam(2, (int64_t[]){HID, IN}, 1 / sqrt(IN), seed);
    m->p[1] = uparam(1, (int64_t[]){HID}, 1 / sqrt(IN), seed + 1);
    m->p[2] = uparam(2, (int64_t[]){OUT, HID}, 1 / sqrt(HID), seed + 2);
    m->p[3] = uparam(1, (int64_t[]){OUT}, 1 / sqrt(HID), seed + 3);
    nt_scope *s = nt_scope_begin();
    m->x = nt_keep(nt_randn(NT_F32, 2, (int64_t[]){BATCH, IN}, 777));
    nt_tensor *teacher = nt_randn(NT_F32, 2, (int64_t[]){IN, OUT}, 778);
    m->y = nt_keep(nt_argmax(nt_matmul(m->x, teacher), 1, false));
    nt_scope_end(s);
}

static void mlp_free(mlp *m)
{
    for (int i = 0; i < 4; i++)
        nt_release(m->p[i]);
    nt_release(m->x), nt_release(m->y);
}

/* One training step; returns the loss (read, so a sync per step). */
static float mlp_step(mlp *m, nt_optim *o)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *h = nt_relu(nt_linear(m->x, m->p[0], m->p[1]));
    nt_tensor *loss = nt_cross_entropy(nt_linear(h, m->p[2], m->p[3]), m->y);
    assert_int_equal(nt_backward(loss), 0);
    assert_int_equal(nt_optim_step(o), 0);
    assert_int_equal(nt_optim_zero_grad(o), 0);
    float l;
    assert_int_equal(nt_to_host(loss, &l, sizeof l), 0);
    nt_scope_end(s);
    return l;
}

static void read_params(mlp *m, float *out)
{
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        int64_t n = nt_numel(m->p[i]);
        read_f32(m->p[i], out + off, (int)n);
        off += n;
    }
}

#define NPARAM (HID * IN + HID + OUT * HID + OUT)

static void test_training_loss_falls(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        mlp m;
        mlp_init(&m, 5);
        nt_optim *o = which ? nt_optim_sgd(m.p, 4, 0.1, 0.9, 0, false)
                            : nt_optim_adamw(m.p, 4, 0.02, 0.9, 0.999, 1e-8, 0.01);
        float first = mlp_step(&m, o), last = first;
        for (int t = 0; t < 150; t++)
            last = mlp_step(&m, o);
        if (!(last < 0.25f && last < first / 4)) {
            print_error("%s: loss %g -> %g\n", which ? "sgd" : "adamw", first, last);
            fail();
        }
        nt_optim_destroy(o);
        mlp_free(&m);
    }
}

/* ---------------- checkpoints ---------------- */

static void test_checkpoint_round_trip(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        const char *path = tpath("rt.ckpt"), *path2 = tpath("rt2.ckpt");
        /* uninterrupted: 3 steps, save, 3 more */
        mlp a;
        mlp_init(&a, 11);
        nt_optim *oa = which ? nt_optim_sgd(a.p, 4, 0.05, 0.9, 1e-3, true)
                             : nt_optim_adamw(a.p, 4, 0.01, 0.9, 0.999, 1e-8, 0.01);
        for (int t = 0; t < 3; t++)
            mlp_step(&a, oa);
        assert_int_equal(nt_optim_set_lr(oa, which ? 0.04 : 0.008), 0); /* restored too */
        assert_int_equal(nt_save(path, a.p, 4, oa), 0);
        assert_int_equal(access(tpath("rt.ckpt.tmp"), F_OK), -1); /* renamed away */
        float saved[NPARAM], cont_a[3];
        read_params(&a, saved);
        for (int t = 0; t < 3; t++)
            cont_a[t] = mlp_step(&a, oa);

        /* fresh model and optimizer with other values, then load */
        mlp b;
        mlp_init(&b, 99);
        nt_optim *ob = which ? nt_optim_sgd(b.p, 4, 1, 0, 0, false)
                             : nt_optim_adamw(b.p, 4, 1, 0.5, 0.5, 1, 0);
        if (which)
            assert_int_equal(nt_optim_step(ob), 0); /* no grads: a no-op, steps = 1 */
        assert_int_equal(nt_load(path, b.p, 4, ob), 0);
        float loaded[NPARAM];
        read_params(&b, loaded);
        assert_memory_equal(saved, loaded, sizeof saved);
        assert_int_equal(nt_optim_steps(ob), 3);
        assert_true(nt_optim_get_lr(ob) == (which ? 0.04 : 0.008));
        /* the state is bit for bit the same: saving it again gives the same file */
        assert_int_equal(nt_save(path2, b.p, 4, ob), 0);
        assert_true(files_equal(path, path2));
        /* and training continues identically */
        for (int t = 0; t < 3; t++) {
            float l = mlp_step(&b, ob);
            assert_memory_equal(&l, &cont_a[t], sizeof l);
        }
        float pa[NPARAM], pb[NPARAM];
        read_params(&a, pa);
        read_params(&b, pb);
        assert_memory_equal(pa, pb, sizeof pa);
        /* parameters alone, without an optimizer */
        assert_int_equal(nt_save(path, a.p, 4, NULL), 0);
        mlp c;
        mlp_init(&c, 5);
        assert_int_equal(nt_load(path, c.p, 4, NULL), 0);
        read_params(&c, pb);
        assert_memory_equal(pa, pb, sizeof pa);
        mlp_free(&c);
        nt_optim_destroy(oa), nt_optim_destroy(ob);
        mlp_free(&a), mlp_free(&b);
    }
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* The targets of the failing loads: known values that must survive. */
typedef struct {
    mlp m;
    nt_optim *o;
    float before[NPARAM];
} target;

static void target_init(target *t)
{
    mlp_init(&t->m, 42);
    t->o = nt_optim_adamw(t->m.p, 4, 0.123, 0.9, 0.999, 1e-8, 0);
    mlp_step(&t->m, t->o);
    read_params(&t->m, t->before);
}

static void target_check(target *t)
{
    float now[NPARAM];
    read_params(&t->m, now);
    assert_memory_equal(now, t->before, sizeof now);
    assert_int_equal(nt_optim_steps(t->o), 1);
    assert_true(nt_optim_get_lr(t->o) == 0.123);
}

static void expect_load_error(target *t, const char *path, int code, const char *words)
{
    int rc = nt_load(path, t->m.p, 4, t->o);
    if (rc != code || !strstr(nt_last_error_message(), words) ||
        !strstr(nt_last_error_message(), path)) {
        print_error("load of %s: rc %d (want %d), message: %s (want '%s')\n", path, rc, code,
                    nt_last_error_message(), words);
        fail();
    }
    assert_int_equal(nt_last_error(), code);
    nt_clear_error();
    target_check(t);
}

static void test_checkpoint_errors(void **state)
{
    (void)state;
    mlp src;
    mlp_init(&src, 3);
    nt_optim *so = nt_optim_adamw(src.p, 4, 0.01, 0.9, 0.999, 1e-8, 0);
    for (int k = 0; k < 2; k++)
        mlp_step(&src, so);
    char good[400], bad[400];
    snprintf(good, sizeof good, "%s", tpath("good.ckpt"));
    snprintf(bad, sizeof bad, "%s", tpath("bad.ckpt"));
    assert_int_equal(nt_save(good, src.p, 4, so), 0);
    size_t n;
    uint8_t *bytes = slurp(good, &n);

    target t;
    target_init(&t);

    /* missing */
    expect_load_error(&t, tpath("missing.ckpt"), NT_EIO, "cannot open");
    expect_load_error(&t, nt_test_dir, NT_EIO, "cannot read"); /* a directory */
    /* truncated at several offsets: in the header, the table, the data */
    size_t cuts[] = {0, 5, 8, 20, 31, 40, 200, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(bad, bytes, cuts[i]);
        expect_load_error(&t, bad, NT_EFORMAT, "truncated");
    }
    /* bad magic, bad version */
    uint8_t *b2 = malloc(n);
    memcpy(b2, bytes, n);
    b2[0] = 'X';
    spit(bad, b2, n);
    expect_load_error(&t, bad, NT_EFORMAT, "magic");
    memcpy(b2, bytes, n);
    b2[8] = 7;
    spit(bad, b2, n);
    expect_load_error(&t, bad, NT_EFORMAT, "version");
    /* a flipped byte in the record table, then in each record's data */
    memcpy(b2, bytes, n);
    b2[32 + 40] ^= 0x10;
    spit(bad, b2, n);
    expect_load_error(&t, bad, NT_EFORMAT, "checksum");
    /* in the data: the first byte of the first record (its offset is in
     * the table), the last byte of the file, and bytes across the file
     * (data or zero padding: both are checked) */
    size_t first = (size_t)bytes[32 + 16] | (size_t)bytes[32 + 17] << 8;
    size_t flips[] = {first, n - 1, n / 2, n / 3, 2 * n / 3};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(b2, bytes, n);
        b2[flips[i]] ^= 0x01;
        spit(bad, b2, n);
        int rc = nt_load(bad, t.m.p, 4, t.o);
        if (rc != NT_EFORMAT)
            fail_msg("a flipped byte at %zu of %zu: rc %d", flips[i], n, rc);
        if (i < 2)
            assert_non_null(strstr(nt_last_error_message(), "checksum mismatch in the data"));
        nt_clear_error();
        target_check(&t);
    }
    /* a file that is not a checkpoint at all */
    spit(bad, (const uint8_t *)"hello, world, this is text and not a checkpoint file....", 56);
    expect_load_error(&t, bad, NT_EFORMAT, "magic");
    /* wrong count */
    int rc = nt_load(good, t.m.p, 3, t.o);
    assert_int_equal(rc, NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "4 parameters; 3 were passed"));
    nt_clear_error();
    target_check(&t);
    /* wrong dtype and wrong shape in the LAST parameter: the earlier ones
     * would match, and must not be written either */
    nt_tensor *keep3 = t.m.p[3];
    t.m.p[3] = nt_zeros(NT_BF16, 1, (int64_t[]){OUT});
    rc = nt_load(good, t.m.p, 4, NULL);
    assert_int_equal(rc, NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "bf16"));
    nt_clear_error();
    nt_release(t.m.p[3]);
    t.m.p[3] = nt_zeros(NT_F32, 1, (int64_t[]){OUT + 1});
    rc = nt_load(good, t.m.p, 4, NULL);
    assert_int_equal(rc, NT_ESHAPE);
    assert_non_null(strstr(nt_last_error_message(), "[5]"));
    nt_clear_error();
    nt_release(t.m.p[3]);
    t.m.p[3] = keep3;
    target_check(&t);
    /* an optimizer of another kind, or opt for a file without its state */
    nt_optim *sgd = nt_optim_sgd(t.m.p, 4, 0.5, 0.9, 0, false);
    rc = nt_load(good, t.m.p, 4, sgd);
    assert_int_equal(rc, NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "AdamW"));
    nt_clear_error();
    assert_true(nt_optim_get_lr(sgd) == 0.5);
    nt_optim_destroy(sgd);
    const char *noopt = tpath("noopt.ckpt");
    assert_int_equal(nt_save(noopt, src.p, 4, NULL), 0);
    expect_load_error(&t, noopt, NT_EINVAL, "no optimizer state");
    /* an optimizer over a different number of parameters */
    nt_optim *small = nt_optim_adamw(t.m.p, 3, 0.5, 0.9, 0.999, 1e-8, 0);
    rc = nt_load(good, t.m.p, 4, small);
    assert_int_equal(rc, NT_ESHAPE);
    nt_clear_error();
    nt_optim_destroy(small);
    target_check(&t);
    /* bad arguments */
    assert_int_equal(nt_load(NULL, t.m.p, 4, NULL), NT_EINVAL);
    assert_int_equal(nt_load(good, NULL, 4, NULL), NT_EINVAL);
    assert_int_equal(nt_load(good, t.m.p, 0, NULL), NT_EINVAL);
    assert_int_equal(nt_save(NULL, t.m.p, 4, NULL), NT_EINVAL);
    assert_int_equal(nt_save(good, t.m.p, -1, NULL), NT_EINVAL);
    nt_clear_error();
    /* saving into a directory that does not exist */
    const char *nodir = tpath("no/such/dir.ckpt");
    assert_int_equal(nt_save(nodir, t.m.p, 4, t.o), NT_EIO);
    assert_non_null(strstr(nt_last_error_message(), "no/such/dir.ckpt"));
    nt_clear_error();
    /* after all that, the good file still loads */
    assert_int_equal(nt_load(good, t.m.p, 4, t.o), 0);
    assert_int_equal(nt_optim_steps(t.o), 2);

    free(b2);
    free(bytes);
    nt_optim_destroy(so), nt_optim_destroy(t.o);
    mlp_free(&src), mlp_free(&t.m);
}

/* ---------------- step counts at their bound ---------------- */

/* The step counts of a checkpoint (docs/checkpoint-format.md: the optimizer
 * record's bytes 16..23 and one u64 per parameter from byte 80) set to
 * `steps`, its checksums recomputed: a valid file. */
static void write_steps(const char *from, const char *to, uint64_t steps)
{
    size_t n;
    uint8_t *b = slurp(from, &n);
    uint32_t count = (uint32_t)(b[12] | b[13] << 8 | b[14] << 16 | (uint32_t)b[15] << 24);
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *e = b + 32 + 96 * i;
        if ((e[0] | e[1] << 8) != 2) /* the optimizer record */
            continue;
        uint64_t off = 0, len = 0;
        for (int k = 7; k >= 0; k--) {
            off = off << 8 | e[16 + k];
            len = len << 8 | e[24 + k];
        }
        for (uint64_t at = 16; at < len; at = at == 16 ? 80 : at + 8)
            for (int k = 0; k < 8; k++)
                b[off + at + k] = (uint8_t)(steps >> (8 * k));
        uint32_t c = crc32_ieee(b + off, len);
        for (int k = 0; k < 4; k++)
            e[12 + k] = (uint8_t)(c >> (8 * k));
    }
    size_t te = 32 + 96 * (size_t)count + 8;
    uint32_t c = crc32_ieee(b, te - 8);
    for (int k = 0; k < 4; k++)
        b[te - 8 + k] = (uint8_t)(c >> (8 * k));
    spit(to, b, n);
    free(b);
}

/* A count can reach 2^53 and never goes past it: the step at the bound is
 * refused (NT_ESTATE) and writes nothing, so no count overflows; nt_load
 * refuses a count past the bound (tests/test_badinput.c: INT64_MAX). */
static void test_step_count_bound(void **state)
{
    (void)state;
    const float v[N] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f}, g[N] = {1, -2, 0.5f, 3, -1};
    nt_tensor *p = param_f32(v, N);
    nt_optim *o = nt_optim_adamw(&p, 1, 0.01, 0.9, 0.999, 1e-8, 0);
    set_grad(p, g, N);
    assert_int_equal(nt_optim_step(o), 0);
    const char *path = tpath("steps.ckpt"), *edited = tpath("steps_edited.ckpt");
    char keep[400];
    snprintf(keep, sizeof keep, "%s", edited);
    assert_int_equal(nt_save(path, &p, 1, o), 0);

    const int64_t bound = (int64_t)1 << 53;
    write_steps(path, keep, (uint64_t)bound - 1);
    assert_int_equal(nt_load(keep, &p, 1, o), 0);
    assert_true(nt_optim_steps(o) == bound - 1);
    assert_int_equal(nt_optim_step(o), 0); /* reaches the bound */
    assert_true(nt_optim_steps(o) == bound);
    float before[N], after[N];
    read_f32(p, before, N);
    int line = __LINE__ + 1;
    assert_int_equal(nt_optim_step(o), NT_ESTATE);
    const char *m = nt_last_error_message();
    assert_true(strncmp(m, "nt_optim_step: ", 15) == 0);
    assert_non_null(strstr(m, "step count is 9007199254740992"));
    char where[64];
    snprintf(where, sizeof where, "test_optim.c:%d in test_step_count_bound", line);
    assert_non_null(strstr(m, where));
    nt_clear_error();
    read_f32(p, after, N);
    assert_memory_equal(after, before, sizeof before);
    assert_true(nt_optim_steps(o) == bound);

    write_steps(path, keep, (uint64_t)bound + 2);
    assert_int_equal(nt_load(keep, &p, 1, o), NT_EFORMAT);
    assert_non_null(strstr(nt_last_error_message(), "step count is 9007199254740994"));
    assert_non_null(strstr(nt_last_error_message(), keep));
    nt_clear_error();
    assert_true(nt_optim_steps(o) == bound);

    nt_optim_destroy(o);
    nt_release(p);
}

/* ---------------- several devices ---------------- */

/* NT_SIM_CORES=2: parameters on devices 0 and 1, driven from a thread whose
 * device is 0 (or 1).  A step updates each parameter on its device,
 * nt_clip_grad_norm sums norms across devices, a loss scaler unscales and
 * checks gradients on every device, nt_load loads each tensor
 * (and the optimizer's state) on its device; every value has the bits of
 * the same work on one device. */
static int devices_setup(void **state)
{
    setenv("NT_SIM_CORES", "2", 1);
    return nt_test_setup(state);
}

static int devices_teardown(void **state)
{
    nt_test_teardown(state);
    unsetenv("NT_SIM_CORES");
    return 0;
}

#define DN 6

/* Parameter i on device devs[i], with values fixed by seed. */
static void dev_params(nt_tensor **p, const int *devs, int seed)
{
    for (int i = 0; i < 2; i++) {
        float v[DN];
        for (int k = 0; k < DN; k++)
            v[k] = (float)((k * 7 + i * 3 + seed) % 11 - 5) / 4.0f;
        assert_int_equal(nt_device_set(devs[i]), 0);
        p[i] = param_f32(v, DN);
        assert_int_equal(nt_tensor_device(p[i]), devs[i]);
    }
    assert_int_equal(nt_device_set(0), 0);
}

/* Gives each parameter a gradient of step `step`, on its device. */
static void dev_grads(nt_tensor **p, int step)
{
    for (int i = 0; i < 2; i++) {
        float g[DN];
        for (int k = 0; k < DN; k++)
            g[k] = (float)((k * 5 + i * 13 + step * 3) % 9 - 4) / (2.0f + (float)step);
        assert_int_equal(nt_device_set(nt_tensor_device(p[i])), 0);
        set_grad(p[i], g, DN);
    }
}

/* One step from a thread on device `from`: gradients, a loss scaler's
 * unscale (scale 1024: exact), clip (its total read into *total),
 * optimizer step. */
static void dev_step(nt_tensor **p, nt_optim *o, int step, int from, float *total)
{
    dev_grads(p, step);
    assert_int_equal(nt_device_set(from), 0);
    nt_grad_scaler *sc = nt_grad_scaler_create(&(nt_grad_scaler_opts){1024, 2, 0.5, 100});
    assert_non_null(sc);
    if (nt_grad_scaler_unscale(sc, o) != 0)
        fail_msg("nt_grad_scaler_unscale: %s", nt_last_error_message());
    nt_grad_scaler_destroy(sc);
    nt_tensor *t = nt_clip_grad_norm(p, 2, 0.75);
    if (!t)
        fail_msg("nt_clip_grad_norm: %s", nt_last_error_message());
    assert_int_equal(nt_tensor_device(t), from);
    assert_int_equal(nt_to_host(t, total, sizeof *total), 0);
    nt_release(t);
    if (nt_optim_step(o) != 0)
        fail_msg("nt_optim_step: %s", nt_last_error_message());
    assert_int_equal(nt_optim_zero_grad(o), 0);
    assert_int_equal(nt_device_set(0), 0);
}

static void dev_read(nt_tensor **p, float *out)
{
    for (int i = 0; i < 2; i++)
        read_f32(p[i], out + i * DN, DN);
}

static void test_devices_step_clip_load(void **state)
{
    (void)state;
    assert_int_equal(nt_device_count(), 2);
    static const int one[2] = {0, 0}, two[2] = {0, 1};
    const char *path = tpath("dev.ckpt");
    float ref[2 * DN], got[2 * DN], tref[5], tgot[5];

    /* the reference: everything on device 0, five steps */
    nt_tensor *p[2];
    dev_params(p, one, 1);
    nt_optim *o = nt_optim_adamw(p, 2, 0.05, 0.9, 0.999, 1e-8, 0.01);
    for (int k = 0; k < 5; k++)
        dev_step(p, o, k, 0, &tref[k]);
    dev_read(p, ref);
    nt_optim_destroy(o);
    nt_release(p[0]), nt_release(p[1]);

    /* the same on two devices, stepped from device 0 and from device 1 */
    dev_params(p, two, 1);
    o = nt_optim_adamw(p, 2, 0.05, 0.9, 0.999, 1e-8, 0.01);
    for (int k = 0; k < 3; k++)
        dev_step(p, o, k, k == 1, &tgot[k]);
    assert_int_equal(nt_save(path, p, 2, o), 0);
    for (int k = 3; k < 5; k++)
        dev_step(p, o, k, 0, &tgot[k]);
    dev_read(p, got);
    assert_memory_equal(got, ref, sizeof ref);
    assert_memory_equal(tgot, tref, sizeof tref);
    nt_optim_destroy(o);
    nt_release(p[0]), nt_release(p[1]);

    /* loaded from device 0 into parameters on devices 0 and 1, with the
     * optimizer: the last two steps give the same bits (the state went to
     * each parameter's device, or the step from device 1 would fail) */
    nt_tensor *q[2];
    dev_params(q, two, 5);
    o = nt_optim_adamw(q, 2, 0.5, 0.9, 0.999, 1e-8, 0);
    assert_int_equal(nt_device_set(0), 0);
    if (nt_load(path, q, 2, o) != 0)
        fail_msg("nt_load: %s", nt_last_error_message());
    assert_int_equal(nt_optim_steps(o), 3);
    for (int k = 3; k < 5; k++)
        dev_step(q, o, k, k == 4, &tgot[k]);
    dev_read(q, got);
    assert_memory_equal(got, ref, sizeof ref);
    assert_memory_equal(tgot + 3, tref + 3, 2 * sizeof *tref);

    /* a load that fails on the device-1 parameter (its shape) writes
     * neither, and names nt_load and the file */
    float before[2 * DN];
    dev_read(q, before);
    assert_int_equal(nt_device_set(1), 0);
    nt_tensor *bad = nt_zeros(NT_F32, 1, (int64_t[]){DN + 1});
    assert_int_equal(nt_device_set(0), 0);
    nt_tensor *r[2] = {q[0], bad};
    assert_int_equal(nt_load(path, r, 2, NULL), NT_ESHAPE);
    assert_true(strncmp(nt_last_error_message(), "nt_load: ", 9) == 0);
    assert_non_null(strstr(nt_last_error_message(), path));
    nt_clear_error();
    dev_read(q, got);
    assert_memory_equal(got, before, sizeof before);
    assert_int_equal(nt_optim_steps(o), 5);

    nt_release(bad);
    nt_optim_destroy(o);
    nt_release(q[0]), nt_release(q[1]);
}

/* ---------------- modes ---------------- */

/* A wider MLP than above (K > 128: several matmul K-tiles), trained with
 * AdamW for a few steps; every loss and every parameter bit must match
 * between deterministic mode and the asynchronous, fused modes. */
enum { MIN = 300, MHID = 200, MOUT = 10, MBATCH = 64 };
#define MNPARAM (MHID * MIN + MHID + MOUT * MHID + MOUT)

static void train_in_mode(const char *mode, float *losses, float *params)
{
    if (!strcmp(mode, "deterministic"))
        assert_int_equal(nt_config_set("NT_DETERMINISTIC", "1"), 0);
    else
        assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    nt_tensor *p[4] = {
        uparam(2, (int64_t[]){MHID, MIN}, 1 / sqrt(MIN), 31),
        uparam(1, (int64_t[]){MHID}, 1 / sqrt(MIN), 32),
        uparam(2, (int64_t[]){MOUT, MHID}, 1 / sqrt(MHID), 33),
        uparam(1, (int64_t[]){MOUT}, 1 / sqrt(MHID), 34),
    };
    nt_tensor *x = nt_randn(NT_F32, 2, (int64_t[]){MBATCH, MIN}, 35);
    int32_t lab[MBATCH];
    for (int i = 0; i < MBATCH; i++)
        lab[i] = (i * 7) % MOUT;
    nt_tensor *y = nt_from_host(lab, NT_I32, 1, (int64_t[]){MBATCH});
    nt_optim *o = nt_optim_adamw(p, 4, 0.01, 0.9, 0.999, 1e-8, 0.01);
    nt_tensor *held[4] = {0};
    for (int t = 0; t < 4; t++) {
        /* queue all steps before reading, so fused modes see whole steps */
        nt_scope *s = nt_scope_begin();
        nt_tensor *h = nt_relu(nt_linear(x, p[0], p[1]));
        nt_tensor *loss = nt_cross_entropy(nt_linear(h, p[2], p[3]), y);
        assert_int_equal(nt_backward(loss), 0);
        assert_int_equal(nt_optim_step(o), 0);
        assert_int_equal(nt_optim_zero_grad(o), 0);
        held[t] = nt_keep(loss);
        nt_scope_end(s);
    }
    for (int t = 0; t < 4; t++) {
        assert_int_equal(nt_to_host(held[t], &losses[t], sizeof(float)), 0);
        nt_release(held[t]);
    }
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        int64_t n = nt_numel(p[i]);
        read_f32(p[i], params + off, (int)n);
        off += n;
        nt_release(p[i]);
    }
    nt_optim_destroy(o);
    nt_release(x), nt_release(y);
    assert_int_equal(nt_config_set("NT_DETERMINISTIC", "0"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
}

static void test_bitwise_across_modes(void **state)
{
    (void)state;
    static float ref_p[MNPARAM], p[MNPARAM];
    float ref_l[4], l[4];
    train_in_mode("deterministic", ref_l, ref_p);
    assert_true(ref_l[3] < ref_l[0]); /* it trains */
    const char *modes[] = {"adaptive", "eager", "lazy"};
    for (int k = 0; k < 3; k++) {
        train_in_mode(modes[k], l, p);
        assert_memory_equal(ref_l, l, sizeof l);
        assert_memory_equal(ref_p, p, sizeof p);
    }
}


/* ================ groups, Adam, RMSprop, Adagrad, Lion, schedulers ================ */

/* The optimizer of torch reference case k (tests/torch_refs/optim.h's
 * tr_opt_cases, in order) on p (one parameter). */
static nt_optim *make_case(int k, nt_tensor *p)
{
    switch (k) {
    case 0: return nt_optim_adam(&p, 1, 1e-2, 0.9, 0.999, 1e-8, 0, 0);
    case 1: return nt_optim_adam(&p, 1, 5e-3, 0.8, 0.99, 1e-6, 0.1, NT_OPTIM_AMSGRAD);
    case 2: return nt_optim_adamw(&p, 1, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    case 3: return nt_optim_adamw_ex(&p, 1, 2e-2, 0.9, 0.95, 1e-8, 0.1, NT_OPTIM_AMSGRAD);
    case 4: return nt_optim_rmsprop(&p, 1, 1e-2, 0.99, 1e-8, 0, 0, false);
    case 5: return nt_optim_rmsprop(&p, 1, 3e-3, 0.9, 1e-6, 0.05, 0.9, true);
    case 6: return nt_optim_adagrad(&p, 1, 1e-2, 0, 0, 0, 1e-10);
    case 7: return nt_optim_adagrad(&p, 1, 5e-2, 0.1, 0.1, 0.1, 1e-8);
    case 8: return nt_optim_lion(&p, 1, 1e-3, 0.9, 0.99, 0.1);
    default: return nt_optim_sgd(&p, 1, 1e-2, 0.9, 0.01, true);
    }
}
#define NCASES ((int)(sizeof tr_opt_cases / sizeof tr_opt_cases[0]))

/* p gets the gradient g (shape of p) exactly: loss = sum(p * g). */
static void set_grad_nd(nt_tensor *p, const float *g)
{
    nt_scope *s = nt_scope_begin();
    nt_tensor *c = nt_from_host(g, NT_F32, 3, tr_opt_shape); /* p is 3x5x7 */
    assert_int_equal(nt_backward(nt_sum(nt_mul(p, c), NT_DIM_ALL, false)), 0);
    nt_scope_end(s);
}

/* f32 distance in ulps (ordered integers; NaNs must match as NaN) */
static int64_t ulps(uint32_t a, uint32_t b)
{
    float fa, fb;
    memcpy(&fa, &a, 4), memcpy(&fb, &b, 4);
    if (isnan(fa) || isnan(fb))
        return isnan(fa) && isnan(fb) ? 0 : INT64_MAX;
    int64_t ia = (a & 0x80000000u) ? -(int64_t)(a & 0x7fffffffu) : (int64_t)a;
    int64_t ib = (b & 0x80000000u) ? -(int64_t)(b & 0x7fffffffu) : (int64_t)b;
    return ia > ib ? ia - ib : ib - ia;
}

/* Runs torch case k for TR_OPT_STEPS steps; out: the parameter after each. */
static void run_torch_case(int k, uint32_t out[TR_OPT_STEPS][TR_OPT_NEL])
{
    nt_tensor *p = nt_from_host(tr_opt_p0, NT_F32, 3, tr_opt_shape);
    assert_int_equal(nt_set_requires_grad(p, true), 0);
    nt_optim *o = make_case(k, p);
    assert_non_null(o);
    for (int t = 0; t < TR_OPT_STEPS; t++) {
        set_grad_nd(p, (const float *)(tr_opt_grads + (size_t)t * TR_OPT_NEL));
        assert_int_equal(nt_optim_step(o), 0);
        assert_int_equal(nt_optim_zero_grad(o), 0);
        assert_int_equal(nt_to_host(p, out[t], sizeof out[t]), 0);
    }
    nt_optim_destroy(o);
    nt_release(p);
}

/* Each optimizer against PyTorch 1.13 (scripts/torch_refs/optim.py), on
 * both backends (the same bits).  Not bitwise: PyTorch's CPU kernels for
 * add(x, alpha) and addcmul (m * beta1 + (1 - beta1) * g, v * beta2 +
 * (1 - beta2) * g * g, grad + wd * p) run as fused multiply-adds in their
 * vector forms, one rounding where ntensor (-ffp-contract=off, the same on
 * both backends) has two; and ntensor's AdamW keeps its lerp form of m
 * (autograd/optim.c).  The differences stay a few ulps over four steps. */
static void test_torch_refs_optimizers(void **state)
{
    (void)state;
    static uint32_t cpu[TR_OPT_STEPS][TR_OPT_NEL], sim[TR_OPT_STEPS][TR_OPT_NEL];
    int fails = 0;
    for (int k = 0; k < NCASES; k++) {
        assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
        run_torch_case(k, cpu);
        assert_int_equal(nt_config_set("NT_BACKEND", "sim"), 0);
        run_torch_case(k, sim);
        assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
        assert_memory_equal(cpu, sim, sizeof cpu);
        /* the distance in f32 epsilons of the parameter's scale: the larger
         * of its value and its starting value (an element that training
         * brings near 0 would count cancellation as many ulps) */
        double worst = 0;
        int at = -1;
        for (int t = 0; t < TR_OPT_STEPS; t++)
            for (int i = 0; i < TR_OPT_NEL; i++) {
                uint32_t wb = tr_opt_cases[k].want[(size_t)t * TR_OPT_NEL + i];
                float g, w, p0;
                memcpy(&g, &cpu[t][i], 4), memcpy(&w, &wb, 4), memcpy(&p0, &tr_opt_p0[i], 4);
                double scale = fmax(fmax(fabs(w), fabs(p0)), 1e-30);
                double d =
                    ulps(cpu[t][i], wb) == 0 ? 0 : fabs((double)g - w) / (FLT_EPSILON * scale);
                if (d > worst)
                    worst = d, at = t * TR_OPT_NEL + i;
            }
        print_message("# %-16s max %.2f eps from PyTorch (at %d)\n", tr_opt_cases[k].name, worst,
                      at);
        if (!(worst <= 4))
            fails++;
    }
    assert_int_equal(fails, 0);
}

/* ---- double-precision references for the new optimizers (N = 5, G[3]) ---- */

typedef struct {
    int kind; /* 0 adam, 1 adamw amsgrad, 2 rmsprop, 3 adagrad, 4 lion */
    double lr, b1, b2, eps, wd, mom, alpha, lr_decay, init;
    bool ams, centered;
} new_cfg;

static void new_reference(const new_cfg *c, int steps, double *p)
{
    double m[N] = {0}, v[N] = {0}, vmax[N] = {0}, buf[N] = {0}, ga[N] = {0};
    for (int i = 0; i < N; i++) {
        p[i] = P0[i];
        v[i] = c->kind == 3 ? c->init : 0;
    }
    for (int t = 1; t <= steps; t++)
        for (int i = 0; i < N; i++) {
            double g = G[t - 1][i];
            if (c->kind == 0 || c->kind == 1) {
                if (c->kind == 0)
                    g += c->wd * p[i];
                else
                    p[i] *= 1 - c->lr * c->wd;
                m[i] = c->b1 * m[i] + (1 - c->b1) * g;
                v[i] = c->b2 * v[i] + (1 - c->b2) * g * g;
                vmax[i] = fmax(vmax[i], v[i]);
                double vv = c->ams ? vmax[i] : v[i];
                double bc1 = 1 - pow(c->b1, t), bc2 = 1 - pow(c->b2, t);
                p[i] -= c->lr / bc1 * m[i] / (sqrt(vv) / sqrt(bc2) + c->eps);
            } else if (c->kind == 2) {
                g += c->wd * p[i];
                v[i] = c->alpha * v[i] + (1 - c->alpha) * g * g;
                double var = v[i];
                if (c->centered) {
                    ga[i] = c->alpha * ga[i] + (1 - c->alpha) * g;
                    var -= ga[i] * ga[i];
                }
                double avg = sqrt(var) + c->eps;
                if (c->mom > 0) {
                    buf[i] = c->mom * buf[i] + g / avg;
                    p[i] -= c->lr * buf[i];
                } else {
                    p[i] -= c->lr * g / avg;
                }
            } else if (c->kind == 3) {
                g += c->wd * p[i];
                v[i] += g * g;
                p[i] -= c->lr / (1 + (t - 1) * c->lr_decay) * g / (sqrt(v[i]) + c->eps);
            } else {
                p[i] *= 1 - c->lr * c->wd;
                double u = c->b1 * m[i] + (1 - c->b1) * g;
                p[i] -= c->lr * (u > 0 ? 1 : u < 0 ? -1 : 0);
                m[i] = c->b2 * m[i] + (1 - c->b2) * g;
            }
        }
}

static nt_optim *new_make(const new_cfg *c, nt_tensor **p, int n)
{
    switch (c->kind) {
    case 0: return nt_optim_adam(p, n, c->lr, c->b1, c->b2, c->eps, c->wd,
                                 c->ams ? NT_OPTIM_AMSGRAD : 0);
    case 1: return nt_optim_adamw_ex(p, n, c->lr, c->b1, c->b2, c->eps, c->wd,
                                     c->ams ? NT_OPTIM_AMSGRAD : 0);
    case 2: return nt_optim_rmsprop(p, n, c->lr, c->alpha, c->eps, c->wd, c->mom, c->centered);
    case 3: return nt_optim_adagrad(p, n, c->lr, c->lr_decay, c->wd, c->init, c->eps);
    default: return nt_optim_lion(p, n, c->lr, c->b1, c->b2, c->wd);
    }
}

static const new_cfg NEW_CFGS[] = {
    {.kind = 0, .lr = 0.01, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8},
    {.kind = 0, .lr = 0.02, .b1 = 0.5, .b2 = 0.9, .eps = 0.1, .wd = 0.5, .ams = true},
    {.kind = 1, .lr = 0.03, .b1 = 0.8, .b2 = 0.99, .eps = 1e-3, .wd = 0.1, .ams = true},
    {.kind = 2, .lr = 0.01, .alpha = 0.99, .eps = 1e-8},
    {.kind = 2, .lr = 0.01, .alpha = 0.9, .eps = 1e-6, .wd = 0.1, .mom = 0.9, .centered = true},
    {.kind = 3, .lr = 0.01, .eps = 1e-10},
    {.kind = 3, .lr = 0.1, .lr_decay = 0.5, .wd = 0.2, .init = 0.3, .eps = 1e-8},
    {.kind = 4, .lr = 0.01, .b1 = 0.9, .b2 = 0.99, .wd = 0.3},
};
#define NNEW ((int)(sizeof NEW_CFGS / sizeof NEW_CFGS[0]))

static void test_new_optims_against_formulas(void **state)
{
    (void)state;
    for (int k = 0; k < NNEW; k++) {
        const new_cfg *c = &NEW_CFGS[k];
        nt_tensor *p = param_f32(P0, N);
        nt_optim *o = new_make(c, &p, 1);
        assert_non_null(o);
        for (int t = 0; t < 3; t++) {
            set_grad(p, G[t], N);
            assert_int_equal(nt_optim_step(o), 0);
            assert_int_equal(nt_optim_zero_grad(o), 0);
            float got[N];
            double want[N];
            read_f32(p, got, N);
            new_reference(c, t + 1, want);
            assert_near(got, want, N);
        }
        nt_optim_destroy(o);
        nt_release(p);
    }
}

/* The same training in every mode, on both backends and captured (one
 * step recorded, replayed with the lr a scheduler sets): the same bits. */
static void train_new(const new_cfg *c, const char *backend, const char *mode, bool captured,
                      float *out)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    if (!strcmp(mode, "deterministic"))
        assert_int_equal(nt_config_set("NT_DETERMINISTIC", "1"), 0);
    else
        assert_int_equal(nt_config_set("NT_MODE", mode), 0);
    nt_tensor *p[2] = {param_f32(P0, N), param_f32(P0, 3)};
    nt_optim *o = new_make(c, p, 1);
    assert_non_null(o);
    assert_int_equal(nt_optim_add_group(o, &p[1], 1, c->lr * 0.5, 0.05), 1);
    nt_scheduler *sc = nt_scheduler_cosine(o, 2, 6, c->lr * 0.1);
    assert_non_null(sc);
    nt_graph *gr = NULL;
    nt_tensor *gin = nt_from_host(G[0], NT_F32, 1, (int64_t[]){N});
    for (int t = 0; t < 6; t++) {
        nt_tensor *gt = nt_from_host(G[t % 3], NT_F32, 1, (int64_t[]){N});
        assert_int_equal(nt_scheduler_step(sc), 0);
        if (captured && gr) {
            assert_int_equal(nt_graph_bind(gr, "g", gt), 0);
            assert_int_equal(nt_graph_replay(gr), 0);
        } else {
            bool cap = captured && t == 0; /* from the first step: state made once */
            if (cap) {
                assert_int_equal(nt_graph_capture_begin(), 0);
                assert_int_equal(nt_graph_input(gt, "g"), 0);
            }
            nt_scope *s = nt_scope_begin();
            nt_tensor *l = nt_add(nt_sum(nt_mul(p[0], gt), NT_DIM_ALL, false),
                                  nt_sum(nt_mul(p[1], nt_slice(gt, 0, 0, 3, 1)), NT_DIM_ALL,
                                         false));
            assert_int_equal(nt_backward(l), 0);
            assert_int_equal(nt_optim_step(o), 0);
            assert_int_equal(nt_optim_zero_grad(o), 0);
            nt_scope_end(s);
            if (cap)
                assert_non_null(gr = nt_graph_capture_end());
        }
        nt_release(gt);
    }
    assert_int_equal(nt_optim_steps(o), 6);
    read_f32(p[0], out, N);
    read_f32(p[1], out + N, 3);
    nt_graph_destroy(gr);
    nt_release(gin);
    nt_scheduler_destroy(sc);
    nt_optim_destroy(o);
    nt_release(p[0]), nt_release(p[1]);
    assert_int_equal(nt_config_set("NT_DETERMINISTIC", "0"), 0);
    assert_int_equal(nt_config_set("NT_MODE", "adaptive"), 0);
    assert_int_equal(nt_config_set("NT_BACKEND", "cpu"), 0);
}

static void test_new_optims_bitwise_everywhere(void **state)
{
    (void)state;
    const char *modes[] = {"deterministic", "adaptive", "eager", "lazy"};
    for (int k = 0; k < NNEW; k++) {
        float ref[N + 3], got[N + 3];
        train_new(&NEW_CFGS[k], "cpu", "deterministic", false, ref);
        for (int b = 0; b < 2; b++)
            for (int m = 0; m < 4; m++)
                for (int cap = 0; cap < 2; cap++) {
                    if (cap && m != 1)
                        continue; /* captured: the default mode */
                    train_new(&NEW_CFGS[k], b ? "sim" : "cpu", modes[m], cap, got);
                    if (memcmp(ref, got, sizeof ref)) {
                        print_error("config %d on %s, %s%s differs\n", k, b ? "sim" : "cpu",
                                    modes[m], cap ? ", captured" : "");
                        fail();
                    }
                }
    }
}

/* Groups: each group's parameters get the bits of a one-group optimizer
 * with that group's lr and weight decay. */
static void test_param_groups(void **state)
{
    (void)state;
    for (int k = 0; k < NNEW; k++) {
        new_cfg c0 = NEW_CFGS[k], c1 = c0;
        c1.lr = c0.lr * 0.3, c1.wd = 0.2;
        /* the group's own betas or momentum where the kind has them */
        bool betas = c0.kind <= 1 || c0.kind == 4, mom = c0.kind == 2;
        if (betas)
            c1.b1 = 0.7, c1.b2 = 0.95;
        if (mom)
            c1.mom = 0.5;
        nt_tensor *a = param_f32(P0, N), *b = param_f32(P0, N);
        nt_tensor *a1 = param_f32(P0, N), *b1 = param_f32(P0, N);
        nt_optim *o = new_make(&c0, &a, 1);
        if (k & 1) /* the plain form: the first group's betas and momentum */
            c1.b1 = c0.b1, c1.b2 = c0.b2, c1.mom = c0.mom;
        assert_int_equal(k & 1 ? nt_optim_add_group(o, &b, 1, c1.lr, c1.wd)
                               : nt_optim_add_group_ex(o, &b, 1, c1.lr, c1.wd,
                                                       betas ? c1.b1 : NAN, betas ? c1.b2 : NAN,
                                                       mom ? c1.mom : NAN),
                         1);
        assert_true(nt_optim_get_group_beta1(o, 1) == c1.b1);
        assert_true(nt_optim_get_group_momentum(o, 1) == c1.mom);
        assert_int_equal(nt_optim_ngroups(o), 2);
        nt_optim *oa = new_make(&c0, &a1, 1), *ob = new_make(&c1, &b1, 1);
        for (int t = 0; t < 3; t++) {
            set_grad(a, G[t], N), set_grad(b, G[2 - t], N);
            set_grad(a1, G[t], N), set_grad(b1, G[2 - t], N);
            assert_int_equal(nt_optim_step(o), 0);
            assert_int_equal(nt_optim_step(oa), 0);
            assert_int_equal(nt_optim_step(ob), 0);
            nt_optim_zero_grad(o), nt_optim_zero_grad(oa), nt_optim_zero_grad(ob);
        }
        float x[N], y[N];
        read_f32(a, x, N), read_f32(a1, y, N);
        assert_memory_equal(x, y, sizeof x);
        read_f32(b, x, N), read_f32(b1, y, N);
        assert_memory_equal(x, y, sizeof x);
        assert_true(nt_optim_get_group_lr(o, 1) == c1.lr);
        assert_true(nt_optim_get_group_weight_decay(o, 1) == c1.wd);
        nt_optim_destroy(o), nt_optim_destroy(oa), nt_optim_destroy(ob);
        nt_release(a), nt_release(b), nt_release(a1), nt_release(b1);
    }
    /* per-group lr, set_lr for all, errors */
    nt_tensor *p[3] = {param_f32(P0, N), param_f32(P0, 2), param_f32(P0, 3)};
    nt_optim *o = nt_optim_adam(p, 1, 0.1, 0.9, 0.999, 1e-8, 0, 0);
    assert_int_equal(nt_optim_add_group(o, &p[1], 2, 0.01, 0), 1);
    assert_true(nt_optim_get_group_lr(o, 0) == 0.1 && nt_optim_get_group_lr(o, 1) == 0.01);
    assert_int_equal(nt_optim_set_group_lr(o, 1, 0.02), 0);
    assert_true(nt_optim_get_group_lr(o, 1) == 0.02);
    assert_true(nt_optim_get_group_initial_lr(o, 1) == 0.01);
    assert_int_equal(nt_optim_set_lr(o, 0.5), 0);
    assert_true(nt_optim_get_group_lr(o, 0) == 0.5 && nt_optim_get_group_lr(o, 1) == 0.5);
    assert_int_equal(nt_optim_add_group(o, &p[2], 1, 0.1, 0), NT_EINVAL); /* overlap */
    assert_non_null(strstr(nt_last_error_message(), "params[0]"));
    assert_non_null(strstr(nt_last_error_message(), "group 1"));
    assert_int_equal(nt_optim_add_group(o, (nt_tensor *[]){p[0]}, 1, 0.1, 0), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "group 0"));
    assert_int_equal(nt_optim_add_group(o, &p[1], 1, -1, 0), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "'lr'"));
    assert_int_equal(nt_optim_add_group(o, &p[1], 1, 0.1, NAN), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "'weight_decay'"));
    assert_int_equal(nt_optim_add_group_ex(o, &p[2], 1, 0.1, 0, NAN, NAN, 0.9), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "'momentum'"));
    assert_non_null(strstr(nt_last_error_message(), "nt_optim_add_group_ex"));
    assert_int_equal(nt_optim_add_group_ex(o, &p[2], 1, 0.1, 0, 1.0, NAN, NAN), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "'beta1'"));
    assert_int_equal(nt_optim_add_group_ex(o, &p[2], 1, 0.1, 0, 0.9, -0.1, NAN), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "'beta2'"));
    assert_int_equal(nt_optim_set_group_lr(o, 2, 0.1), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "'group'"));
    assert_true(isnan(nt_optim_get_group_lr(o, -1)));
    assert_int_equal(nt_optim_ngroups(o), 2);
    nt_optim_destroy(o);
    /* SGD: a group's own momentum, the same bits as a one-group SGD */
    nt_tensor *s1 = param_f32(P0, N), *s2 = param_f32(P0, N);
    o = nt_optim_sgd(&p[0], 1, 0.1, 0.9, 0, true);
    assert_int_equal(nt_optim_add_group_ex(o, &s1, 1, 0.05, 0.01, NAN, NAN, 0), NT_EINVAL);
    assert_non_null(strstr(nt_last_error_message(), "nesterov"));
    assert_int_equal(nt_optim_add_group_ex(o, &s1, 1, 0.05, 0.01, NAN, NAN, 0.5), 1);
    nt_optim *os = nt_optim_sgd(&s2, 1, 0.05, 0.5, 0.01, true);
    for (int t = 0; t < 3; t++) {
        set_grad(s1, G[t], N), set_grad(s2, G[t], N);
        assert_int_equal(nt_optim_step(o), 0);
        assert_int_equal(nt_optim_step(os), 0);
        nt_optim_zero_grad(o), nt_optim_zero_grad(os);
    }
    float x[N], y[N];
    read_f32(s1, x, N), read_f32(s2, y, N);
    assert_memory_equal(x, y, sizeof x);
    nt_optim_destroy(o), nt_optim_destroy(os);
    nt_release(s1), nt_release(s2);
    for (int i = 0; i < 3; i++)
        nt_release(p[i]);
}

/* Bad hyper-parameters: NT_EINVAL naming the argument. */
static void test_new_optims_errors(void **state)
{
    (void)state;
    nt_tensor *p = param_f32(P0, N);
    assert_null(nt_optim_adam(&p, 1, -1, 0.9, 0.999, 1e-8, 0, 0));
    assert_non_null(strstr(nt_last_error_message(), "nt_optim_adam"));
    assert_non_null(strstr(nt_last_error_message(), "'lr'"));
#define BAD(call, arg)                                                                       \
    do {                                                                                     \
        assert_null(call);                                                                   \
        assert_int_equal(nt_last_error(), NT_EINVAL);                                        \
        if (!strstr(nt_last_error_message(), arg)) {                                         \
            print_error("%s: %s\n", #call, nt_last_error_message());                         \
            fail();                                                                          \
        }                                                                                    \
    } while (0)
    BAD(nt_optim_adam(&p, 1, 1e-3, 1.0, 0.999, 1e-8, 0, 0), "'beta1'");
    BAD(nt_optim_adam(&p, 1, 1e-3, 0.9, NAN, 1e-8, 0, 0), "'beta2'");
    BAD(nt_optim_adam(&p, 1, 1e-3, 0.9, 0.999, -1, 0, 0), "'eps'");
    BAD(nt_optim_adam(&p, 1, 1e-3, 0.9, 0.999, 1e-8, INFINITY, 0), "'weight_decay'");
    BAD(nt_optim_adam(&p, 1, 1e-3, 0.9, 0.999, 1e-8, 0, 2), "'flags'");
    BAD(nt_optim_adamw_ex(&p, 1, 1e-3, 0.9, 0.999, 1e-8, 0, 8), "'flags'");
    BAD(nt_optim_rmsprop(&p, 1, 1e-2, -0.5, 1e-8, 0, 0, false), "'alpha'");
    BAD(nt_optim_rmsprop(&p, 1, 1e-2, 0.99, 1e-8, 0, -0.1, false), "'momentum'");
    BAD(nt_optim_adagrad(&p, 1, 1e-2, -1, 0, 0, 1e-10), "'lr_decay'");
    BAD(nt_optim_adagrad(&p, 1, 1e-2, 0, 0, -1, 1e-10), "'initial_accumulator_value'");
    BAD(nt_optim_lion(&p, 1, 1e-4, 0.9, 1.5, 0), "'beta2'");
    BAD(nt_optim_lion(&p, 1, NAN, 0.9, 0.99, 0), "'lr'");
    BAD(nt_optim_lion(NULL, 1, 1e-4, 0.9, 0.99, 0), "params");
    BAD(nt_optim_rmsprop((nt_tensor *[]){p, p}, 2, 1e-2, 0.99, 1e-8, 0, 0, false), "params");
    /* schedulers */
    nt_optim *o = nt_optim_sgd(&p, 1, 0.1, 0, 0, false);
    BAD(nt_scheduler_steplr(o, 0, 0.5), "'step_size'");
    BAD(nt_scheduler_steplr(o, 2, -0.5), "'gamma'");
    BAD(nt_scheduler_cosine(o, -1, 10, 0), "'warmup_steps'");
    BAD(nt_scheduler_cosine(o, 5, 4, 0), "'total_steps'");
    BAD(nt_scheduler_cosine(o, 1, 10, NAN), "'min_lr'");
    BAD(nt_scheduler_linear(o, 0, 1, 5), "'start_factor'");
    BAD(nt_scheduler_linear(o, 0.5, 1.5, 5), "'end_factor'");
    BAD(nt_scheduler_linear(o, 0.5, 1, 0), "'total_iters'");
    BAD(nt_scheduler_onecycle(o, 0, 10, 0.3, 25, 1e4), "'max_lr'");
    BAD(nt_scheduler_onecycle(o, 0.1, 0, 0.3, 25, 1e4), "'total_steps'");
    BAD(nt_scheduler_onecycle(o, 0.1, 10, 1.3, 25, 1e4), "'pct_start'");
    BAD(nt_scheduler_onecycle(o, 0.1, 10, 0.3, 0, 1e4), "'div_factor'");
    BAD(nt_scheduler_onecycle(o, 0.1, 10, 0.3, 25, -1), "'final_div_factor'");
    BAD(nt_scheduler_cosine(NULL, 1, 10, 0), "opt");
#undef BAD
    assert_int_equal(nt_scheduler_step(NULL), NT_EINVAL);
    nt_scheduler *s = nt_scheduler_steplr(o, 2, 0.5);
    assert_non_null(s);
    nt_optim_destroy(o);
    assert_int_equal(nt_scheduler_step(s), NT_ESTATE); /* its optimizer is gone */
    assert_non_null(strstr(nt_last_error_message(), "destroyed"));
    nt_scheduler_destroy(s);
    nt_scheduler_destroy(s); /* twice: an error, no crash */
    assert_int_equal(nt_last_error(), NT_EINVAL);
    nt_release(p);
}

static void check_seq(const char *name, nt_scheduler *(*make)(nt_optim *), const double (*want)[2],
                      int n, double rel)
{
    nt_tensor *p[2] = {param_f32(P0, N), param_f32(P0, 2)};
    nt_optim *o = nt_optim_sgd(p, 1, 0.1, 0, 0, false);
    assert_int_equal(nt_optim_add_group(o, &p[1], 1, 0.02, 0), 1);
    nt_scheduler *s = make(o);
    assert_non_null(s);
    for (int k = 0; k < n; k++) {
        if (k) { /* no .grads: the step only counts */
            assert_int_equal(nt_optim_step(o), 0);
            assert_int_equal(nt_scheduler_step(s), 0);
        }
        for (int g = 0; g < 2; g++) {
            double got = nt_scheduler_get_lr(s, g), w = want[k][g];
            if (!(fabs(got - w) <= rel * fabs(w))) {
                print_error("%s position %d group %d: lr %.17g, PyTorch %.17g\n", name, k, g, got,
                            w);
                fail();
            }
            assert_true(nt_optim_get_group_lr(o, g) == got);
        }
    }
    nt_scheduler_destroy(s);
    nt_optim_destroy(o);
    nt_release(p[0]), nt_release(p[1]);
}

static nt_scheduler *mk_steplr(nt_optim *o) { return nt_scheduler_steplr(o, 3, 0.5); }
static nt_scheduler *mk_linear(nt_optim *o) { return nt_scheduler_linear(o, 0.25, 1.0, 5); }
static nt_scheduler *mk_onecycle(nt_optim *o)
{
    return nt_scheduler_onecycle(o, 0.1, 20, 0.3, 25, 1e4);
}
static nt_scheduler *mk_cosine(nt_optim *o) { return nt_scheduler_cosine(o, 3, 10, 0.001); }

#define NROWS(a) ((int)(sizeof(a) / sizeof(a)[0]))

/* Every scheduler's lr sequence against PyTorch's (two groups, each scaled
 * from its own base lr).  StepLR multiplies as PyTorch does: the same
 * doubles.  LinearLR is the closed form (PyTorch's step() multiplies
 * ratios): within 1e-15 relative.  OneCycleLR and the cosine (its
 * documented formula; PyTorch 1.13 has no one class for it) compute the
 * same expressions: the same doubles. */
static void test_schedulers_against_torch(void **state)
{
    (void)state;
    check_seq("steplr", mk_steplr, tr_sched_steplr, NROWS(tr_sched_steplr), 0);
    check_seq("linear", mk_linear, tr_sched_linear, NROWS(tr_sched_linear), 1e-15);
    check_seq("onecycle", mk_onecycle, tr_sched_onecycle, NROWS(tr_sched_onecycle), 0);
    check_seq("cosine", mk_cosine, tr_sched_cosine, NROWS(tr_sched_cosine), 0);

    /* one-cycle past its end: PyTorch raises at its 21st step */
    nt_tensor *p = param_f32(P0, N);
    nt_optim *o = nt_optim_adam(&p, 1, 0.1, 0.9, 0.999, 1e-8, 0, 0);
    nt_scheduler *s = mk_onecycle(o);
    for (int k = 1; k < TR_ONECYCLE_FAILS_AT; k++) {
        assert_int_equal(nt_optim_step(o), 0);
        assert_int_equal(nt_scheduler_step(s), 0);
    }
    assert_int_equal(nt_optim_step(o), 0);
    double lr = nt_optim_get_lr(o);
    assert_int_equal(nt_scheduler_step(s), NT_ESTATE);
    assert_non_null(strstr(nt_last_error_message(), "nt_scheduler_step"));
    assert_non_null(strstr(nt_last_error_message(), "tried to step 21 times"));
    assert_true(nt_optim_get_lr(o) == lr); /* nothing changed */
    nt_scheduler_destroy(s);
    /* a one-cycle made past its end fails at once, changing nothing */
    double base = nt_optim_get_group_initial_lr(o, 0);
    assert_null(nt_scheduler_onecycle(o, 0.5, 20, 0.3, 25, 1e4));
    assert_true(nt_optim_get_group_initial_lr(o, 0) == base);
    assert_int_equal(nt_last_error(), NT_ESTATE);
    assert_non_null(strstr(nt_last_error_message(), "nt_scheduler_onecycle"));
    nt_optim_destroy(o);
    nt_release(p);
}

/* ---- checkpoints of groups, every optimizer's state, schedulers ---- */

static nt_optim *ck_make(int k, nt_tensor **p)
{
    nt_optim *o = k < NNEW ? new_make(&NEW_CFGS[k], p, 1)
                           : nt_optim_sgd(p, 1, 0.05, 0.9, 0.01, false);
    assert_non_null(o);
    /* group 1 with its own betas, or without the momentum group 0 has (its
     * parameters then have no momentum state) */
    int kind = k < NNEW ? NEW_CFGS[k].kind : -1;
    bool betas = kind == 0 || kind == 1 || kind == 4, mom = kind == -1 || kind == 2;
    assert_int_equal(nt_optim_add_group_ex(o, &p[1], 2, 0.004, 0, betas ? 0.8 : NAN,
                                           betas ? 0.9 : NAN, mom ? 0 : NAN),
                     1);
    return o;
}

static void ck_params(nt_tensor **p, float seed)
{
    float v[N];
    for (int i = 0; i < N; i++)
        v[i] = P0[i] * seed;
    p[0] = param_f32(v, N), p[1] = param_f32(v + 1, 3), p[2] = param_f32(v + 2, 2);
}

static void ck_step(nt_tensor **p, nt_optim *o, nt_scheduler *s, int t)
{
    assert_int_equal(nt_scheduler_step(s), 0);
    set_grad(p[0], G[t % 3], N), set_grad(p[1], G[(t + 1) % 3], 3);
    if (t % 2 == 0) /* p[2] skips every other step: its own count */
        set_grad(p[2], G[(t + 2) % 3], 2);
    assert_int_equal(nt_optim_step(o), 0);
    assert_int_equal(nt_optim_zero_grad(o), 0);
}

static void ck_read(nt_tensor **p, float *out)
{
    read_f32(p[0], out, N), read_f32(p[1], out + N, 3), read_f32(p[2], out + N + 3, 2);
}

static void test_checkpoint_groups_states(void **state)
{
    (void)state;
    const char *path = tpath("groups.ckpt"), *path2 = tpath("groups2.ckpt");
    for (int k = 0; k <= NNEW; k++) {
        nt_tensor *a[3], *b[3];
        ck_params(a, 1);
        nt_optim *oa = ck_make(k, a);
        nt_scheduler *sa = nt_scheduler_cosine(oa, 2, 8, 1e-4);
        for (int t = 0; t < 3; t++)
            ck_step(a, oa, sa, t);
        assert_int_equal(nt_save(path, a, 3, oa), 0);
        for (int t = 3; t < 6; t++)
            ck_step(a, oa, sa, t);
        float want[N + 5], got[N + 5];
        ck_read(a, want);

        ck_params(b, -2); /* other values, other lrs */
        nt_optim *ob = ck_make(k, b);
        assert_int_equal(nt_optim_set_group_lr(ob, 1, 0.3), 0);
        assert_int_equal(nt_load(path, b, 3, ob), 0);
        assert_int_equal(nt_optim_steps(ob), 3);
        assert_int_equal(nt_save(path2, b, 3, ob), 0); /* the same state: the same file */
        assert_true(files_equal(path, path2));
        nt_scheduler *sb = nt_scheduler_cosine(ob, 2, 8, 1e-4); /* made after the load */
        for (int t = 3; t < 6; t++)
            ck_step(b, ob, sb, t);
        ck_read(b, got);
        assert_memory_equal(want, got, sizeof want);
        for (int g = 0; g < 2; g++)
            assert_true(nt_optim_get_group_lr(oa, g) == nt_optim_get_group_lr(ob, g));

        /* group mismatches: NT_ESHAPE, nothing changed */
        nt_tensor *c[3];
        ck_params(c, 3);
        nt_optim *one = k < NNEW ? new_make(&NEW_CFGS[k], c, 3)
                                 : nt_optim_sgd(c, 3, 0.05, 0.9, 0.01, false);
        assert_int_equal(nt_load(path, c, 3, one), NT_ESHAPE);
        assert_non_null(strstr(nt_last_error_message(), "2 parameter groups"));
        nt_optim *two = k < NNEW ? new_make(&NEW_CFGS[k], c, 2)
                                 : nt_optim_sgd(c, 2, 0.05, 0.9, 0.01, false);
        assert_int_equal(nt_optim_add_group(two, &c[2], 1, 0.1, 0), 1);
        assert_int_equal(nt_load(path, c, 3, two), NT_ESHAPE);
        assert_non_null(strstr(nt_last_error_message(), "group 0 holds 1 parameters"));
        assert_int_equal(nt_optim_steps(two), 0);
        /* another kind */
        nt_optim *other = k < NNEW && NEW_CFGS[k].kind == 0 ? nt_optim_lion(c, 1, 0.1, 0.9, 0.99, 0)
                                 : nt_optim_adam(c, 1, 0.1, 0.9, 0.99, 1e-8, 0, 0);
        assert_int_equal(nt_optim_add_group(other, &c[1], 2, 0.1, 0), 1);
        assert_int_equal(nt_load(path, c, 3, other), NT_EINVAL);
        nt_optim_destroy(one), nt_optim_destroy(two), nt_optim_destroy(other);
        nt_scheduler_destroy(sa), nt_scheduler_destroy(sb);
        nt_optim_destroy(oa), nt_optim_destroy(ob);
        for (int i = 0; i < 3; i++)
            nt_release(a[i]), nt_release(b[i]), nt_release(c[i]);
    }
}


/* A file from before parameter groups: the group record made an optional
 * kind (0x8005), which the reader skips, so only the optimizer record
 * describes the one group -- what an old writer wrote.  It loads into a
 * one-group SGD or AdamW optimizer (bit for bit, training continues the
 * same), not into a two-group one (NT_ESHAPE) nor into Adam (NT_EFORMAT:
 * Adam's record needs its groups). */
static void make_pre_groups(const char *from, const char *to)
{
    size_t n;
    uint8_t *b = slurp(from, &n);
    uint32_t count = (uint32_t)(b[12] | b[13] << 8 | b[14] << 16 | (uint32_t)b[15] << 24);
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *e = b + 32 + 96 * i;
        if ((e[0] | e[1] << 8) == 5)
            e[1] = 0x80;
    }
    size_t te = 32 + 96 * (size_t)count + 8;
    uint32_t c = crc32_ieee(b, te - 8);
    for (int k = 0; k < 4; k++)
        b[te - 8 + k] = (uint8_t)(c >> (8 * k));
    spit(to, b, n);
    free(b);
}

static void test_checkpoint_before_groups(void **state)
{
    (void)state;
    const char *path = tpath("new.ckpt"), *old = tpath("old.ckpt");
    for (int which = 0; which < 3; which++) {
        nt_tensor *a = param_f32(P0, N), *b = param_f32(G[0], N);
        nt_optim *oa = which == 0   ? nt_optim_adamw(&a, 1, 0.01, 0.9, 0.999, 1e-8, 0.01)
                       : which == 1 ? nt_optim_sgd(&a, 1, 0.05, 0.9, 0.01, true)
                                    : nt_optim_adam(&a, 1, 0.01, 0.9, 0.999, 1e-8, 0.01, 0);
        for (int t = 0; t < 2; t++) {
            set_grad(a, G[t], N);
            assert_int_equal(nt_optim_step(oa), 0);
            nt_optim_zero_grad(oa);
        }
        assert_int_equal(nt_optim_set_lr(oa, 0.02), 0);
        assert_int_equal(nt_save(path, &a, 1, oa), 0);
        make_pre_groups(path, old);
        nt_optim *ob = which == 0   ? nt_optim_adamw(&b, 1, 0.5, 0.5, 0.5, 1, 0)
                       : which == 1 ? nt_optim_sgd(&b, 1, 0.5, 0, 0, false)
                                    : nt_optim_adam(&b, 1, 0.5, 0.5, 0.5, 1, 0, 0);
        if (which == 2) {
            assert_int_equal(nt_load(old, &b, 1, ob), NT_EFORMAT);
            assert_non_null(strstr(nt_last_error_message(), "no parameter group record"));
        } else {
            nt_tensor *c = param_f32(P0, N);
            nt_optim *two = nt_optim_sgd(&c, 1, 0.1, 0, 0, false);
            if (which == 0) {
                nt_optim_destroy(two);
                two = nt_optim_adamw(&c, 1, 0.1, 0.9, 0.999, 1e-8, 0);
            }
            nt_tensor *d = param_f32(P0, 2);
            assert_int_equal(nt_optim_add_group(two, &d, 1, 0.1, 0), 1);
            int lrc = nt_load(old, &c, 1, two);
            if (lrc != NT_ESHAPE)
                print_error("%s\n", nt_last_error_message());
            assert_int_equal(lrc, NT_ESHAPE);
            assert_non_null(strstr(nt_last_error_message(), "the optimizer has 2"));
            nt_optim_destroy(two);
            nt_release(c), nt_release(d);

            assert_int_equal(nt_load(old, &b, 1, ob), 0);
            assert_true(nt_optim_get_lr(ob) == 0.02);
            assert_true(nt_optim_get_group_initial_lr(ob, 0) == 0.5); /* its own */
            for (int t = 2; t < 3; t++) {
                set_grad(a, G[t], N), set_grad(b, G[t], N);
                assert_int_equal(nt_optim_step(oa), 0);
                assert_int_equal(nt_optim_step(ob), 0);
            }
            float x[N], y[N];
            read_f32(a, x, N), read_f32(b, y, N);
            assert_memory_equal(x, y, sizeof x);
        }
        nt_optim_destroy(oa), nt_optim_destroy(ob);
        nt_release(a), nt_release(b);
    }
}

/* Master weights and the loss scaler with the new optimizers: a bf16
 * parameter with masters follows an f32 run on the same (bf16-exact)
 * values and gradients, rounded -- and its state and masters survive a
 * checkpoint; a scaled loss (a power of two) unscaled by nt_grad_scaler
 * steps to the same bits as the plain loss. */
static void test_new_optims_master_scaler(void **state)
{
    (void)state;
    for (int k = 0; k < NNEW; k++) {
        const new_cfg *c = &NEW_CFGS[k];
        nt_scope *sc = nt_scope_begin();
        nt_tensor *p32 = nt_cast(nt_cast(nt_from_host(P0, NT_F32, 1, (int64_t[]){N}), NT_BF16),
                                 NT_F32);
        nt_tensor *pf = nt_keep(nt_detach(p32)), *pb = nt_keep(nt_cast(p32, NT_BF16));
        nt_scope_end(sc);
        assert_int_equal(nt_set_requires_grad(pf, true), 0);
        assert_int_equal(nt_set_requires_grad(pb, true), 0);
        nt_optim *of = new_make(c, &pf, 1), *ob = new_make(c, &pb, 1);
        assert_int_equal(nt_optim_set_master_weights(ob, true), 0);
        for (int t = 0; t < 3; t++) {
            nt_scope *s = nt_scope_begin();
            nt_tensor *g = nt_cast(nt_from_host(G[t], NT_F32, 1, (int64_t[]){N}), NT_BF16);
            assert_int_equal(nt_backward(nt_sum(nt_mul(pb, g), NT_DIM_ALL, false)), 0);
            assert_int_equal(nt_backward(nt_sum(nt_mul(pf, nt_cast(g, NT_F32)), NT_DIM_ALL,
                                                false)), 0);
            nt_scope_end(s);
            assert_int_equal(nt_optim_step(of), 0);
            assert_int_equal(nt_optim_step(ob), 0);
            nt_optim_zero_grad(of), nt_optim_zero_grad(ob);
        }
        float f[N];
        uint16_t b[N];
        read_f32(pf, f, N);
        assert_int_equal(nt_to_host(pb, b, sizeof b), 0);
        for (int i = 0; i < N; i++)
            assert_int_equal(b[i], f32_to_bf16(f[i]));
        const char *path = tpath("nm.ckpt"), *path2 = tpath("nm2.ckpt");
        assert_int_equal(nt_save(path, &pb, 1, ob), 0);
        nt_optim *o2 = new_make(c, &pb, 1);
        assert_int_equal(nt_load(path, &pb, 1, o2), 0);
        assert_int_equal(nt_save(path2, &pb, 1, o2), 0);
        assert_true(files_equal(path, path2));
        nt_optim_destroy(o2), nt_optim_destroy(of), nt_optim_destroy(ob);
        nt_release(pf), nt_release(pb);

        /* the loss scaler */
        nt_tensor *a = param_f32(P0, N), *z = param_f32(P0, N);
        nt_optim *oa = new_make(c, &a, 1), *oz = new_make(c, &z, 1);
        nt_grad_scaler *gs = nt_grad_scaler_create(NULL);
        assert_non_null(gs);
        for (int t = 0; t < 3; t++) {
            set_grad(a, G[t], N);
            assert_int_equal(nt_optim_step(oa), 0);
            nt_scope *s = nt_scope_begin();
            nt_tensor *gt = nt_from_host(G[t], NT_F32, 1, (int64_t[]){N});
            nt_tensor *l = nt_sum(nt_mul(z, gt), NT_DIM_ALL, false);
            assert_int_equal(nt_backward(nt_grad_scaler_scale(gs, l)), 0);
            nt_scope_end(s);
            assert_int_equal(nt_grad_scaler_step(gs, oz), 0);
            assert_int_equal(nt_grad_scaler_update(gs), 0);
            nt_optim_zero_grad(oa), nt_optim_zero_grad(oz);
        }
        float x[N], y[N];
        read_f32(a, x, N), read_f32(z, y, N);
        assert_memory_equal(x, y, sizeof x);
        nt_grad_scaler_destroy(gs);
        nt_optim_destroy(oa), nt_optim_destroy(oz);
        nt_release(a), nt_release(z);
    }
    /* a group added with master weights on gets its masters: 10 steps of
     * 1e-3 move a bf16 1.0 only through them */
    const float one[N] = {1, 1, 1, 1, 1};
    nt_tensor *q[2];
    for (int i = 0; i < 2; i++) {
        nt_tensor *t = nt_from_host(one, NT_F32, 1, (int64_t[]){N});
        q[i] = nt_cast(t, NT_BF16);
        nt_release(t);
        assert_int_equal(nt_set_requires_grad(q[i], true), 0);
    }
    nt_optim *o = nt_optim_sgd(&q[0], 1, 1e-3, 0, 0, false);
    assert_int_equal(nt_optim_set_master_weights(o, true), 0);
    assert_int_equal(nt_optim_add_group(o, &q[1], 1, 1e-3, 0), 1);
    float m = 1.0f;
    for (int t = 0; t < 10; t++) {
        for (int i = 0; i < 2; i++) {
            nt_scope *s = nt_scope_begin();
            nt_tensor *c = nt_cast(nt_from_host(one, NT_F32, 1, (int64_t[]){N}), NT_BF16);
            assert_int_equal(nt_backward(nt_sum(nt_mul(q[i], c), NT_DIM_ALL, false)), 0);
            nt_scope_end(s);
        }
        assert_int_equal(nt_optim_step(o), 0);
        nt_optim_zero_grad(o);
        m = m - (float)1e-3 * 1.0f;
    }
    for (int i = 0; i < 2; i++) {
        uint16_t got[N];
        assert_int_equal(nt_to_host(q[i], got, sizeof got), 0);
        assert_int_equal(got[0], f32_to_bf16(m));
        nt_release(q[i]);
    }
    nt_optim_destroy(o);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sgd_against_formulas, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_adamw_against_formulas, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_skip_without_grad, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_zero_grad_and_lr, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_api_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_master_weights, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_training_loss_falls, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_round_trip, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_bitwise_across_modes, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_step_count_bound, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_torch_refs_optimizers, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_optims_against_formulas, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_optims_bitwise_everywhere, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_param_groups, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_optims_errors, nt_test_setup, nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_schedulers_against_torch, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_groups_states, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_before_groups, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_optims_master_scaler, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_devices_step_clip_load, devices_setup,
                                        devices_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
