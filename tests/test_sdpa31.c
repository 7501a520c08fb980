/* tests/test_sdpa31.c - attention's backward reading q, k, v where they
 * are: when q, k, v are heads of one [B, T, 3C] projection (views of one
 * storage at offsets o, o + s, o + 2s) and there is no mask, SDPA_BWD
 * takes them as one strided view with dO, O and lse (autograd/backward.c)
 * instead of packing copies of q, dO, O and k, v.  The gradient of the
 * projection is the same bits as through contiguous copies of q, k, v (the
 * packed path), on both backends, in every mode; heads in another order
 * (k after v) keep the packed path with the same bits, and cost more
 * kernels.
 *
 * And the forward writing its output where the caller's [B, T, C] wants it:
 * with q's heads inside its rows (the heads of a projection), the op's
 * output is [B, T, H, D] row-major, handed out as its [B, H, T, D] view,
 * so the permute and reshape back to [B, T, C] are views, no copy: the
 * same bits as the output of contiguous q, k, v copied into that layout,
 * op by op and captured, on both backends.  And (f32) the backward
 * writing dq, dk, dv where q, k, v lie, into one buffer that becomes the
 * projection's gradient with no copies into it (autograd/tape.c,
 * placed_into): the same bits however the slices' gradients meet. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntensor.h"
#include "nt_test.h"

typedef struct shp {
    int64_t B, T, H, D;
    bool causal;
} shp;

static uint64_t rs = 0x2545f4914f6cdd1dull;
static float urand(void) /* [-1, 1) */
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void config(const char *backend, const char *mode)
{
    assert_int_equal(nt_config_set("NT_BACKEND", backend), 0);
    assert_int_equal(nt_config_set("NT_REQUIRE_SIM", strcmp(backend, "sim") ? "0" : "1"), 0);
    assert_int_equal(nt_config_set("NT_MODE", mode), 0);
}

/* Head h of qkv [B, T, 3C] at column block blk (as examples/gpt_model.h's
 * gpt_heads): [B, H, T, D]. */
static nt_tensor *heads(nt_tensor *qkv, const shp *s, int blk, bool contig)
{
    int64_t C = s->H * s->D;
    nt_tensor *t = nt_slice(qkv, 2, blk * C, (blk + 1) * C, 1);
    t = nt_permute(nt_reshape(t, 4, (int64_t[]){s->B, s->T, s->H, s->D}), (int[]){0, 2, 1, 3});
    return contig ? nt_contiguous(t) : t;
}

/* The gradient of sum(sdpa(q, k, v) * w) with respect to qkv, q, k, v at
 * column blocks order[0..2] (contig: through contiguous copies); the
 * kernels the simulator ran in *kernels. */
static float *qkv_grad(const shp *s, const float *x, const float *w, const int order[3],
                       bool contig, nt_dtype dt, uint64_t *kernels)
{
    int64_t C = s->H * s->D, n = s->B * s->T * 3 * C;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *qkv = nt_from_host(x, NT_F32, 3, (int64_t[]){s->B, s->T, 3 * C});
    assert_non_null(qkv);
    nt_set_requires_grad(qkv, true);
    nt_tensor *W = nt_from_host(w, NT_F32, 4, (int64_t[]){s->B, s->H, s->T, s->D});
    nt_sync();
    nt_stats_reset();
    nt_tensor *x2 = dt == NT_F32 ? qkv : nt_cast(qkv, dt);
    nt_tensor *y = nt_scaled_dot_product_attention(heads(x2, s, order[0], contig),
                                                   heads(x2, s, order[1], contig),
                                                   heads(x2, s, order[2], contig), NULL,
                                                   s->causal, 0.0);
    if (y && dt != NT_F32)
        y = nt_cast(y, NT_F32);
    assert_non_null(y);
    nt_tensor *l = nt_sum(nt_mul(y, W), NT_DIM_ALL, false);
    assert_non_null(l);
    assert_int_equal(nt_backward(l), 0);
    float *g = malloc((size_t)n * sizeof(float));
    assert_int_equal(nt_to_host(nt_contiguous(nt_grad(qkv)), g, (size_t)n * sizeof(float)), 0);
    nt_stats st;
    nt_stats_get(&st);
    *kernels = st.sim_kernels;
    nt_scope_end(sc);
    return g;
}

/* x of n and w of nw values in [-1, 1) (malloc'd). */
static void rand_inputs(int64_t n, int64_t nw, float **x, float **w)
{
    *x = malloc((size_t)n * sizeof(float));
    *w = malloc((size_t)nw * sizeof(float));
    assert_non_null(*x);
    assert_non_null(*w);
    for (int64_t j = 0; j < n; j++)
        (*x)[j] = urand();
    for (int64_t j = 0; j < nw; j++)
        (*w)[j] = urand();
}

static const shp shapes[] = {
    {2, 130, 2, 8, true},
    {1, 5, 3, 4, false},
    {2, 129, 1, 32, true},
    {1, 1, 2, 8, false},
};

/* The kernel-count tests' shape and inputs (qkv and the loss's weights
 * [B, H, T, D]), on the simulator in deterministic mode. */
static const shp kshape = {2, 130, 2, 8, true};
static void kernel_case(float **x, float **w)
{
    int64_t C = kshape.H * kshape.D, nw = kshape.B * kshape.T * C;
    rand_inputs(3 * nw, nw, x, w);
    config("sim", "deterministic");
}

/* The gradient through the views equals the one through contiguous copies
 * (the packed path) bit for bit, on both backends and in every mode, and
 * the two backends agree; in f32 and with q, k, v in bf16. */
static void test_views_equal_packed(void **state)
{
    (void)state;
    static const char *be[2] = {"cpu", "sim"};
    static const char *modes[4] = {"deterministic", "lazy", "adaptive", "eager"};
    static const int orders[2][3] = {{0, 1, 2}, {0, 2, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shp *s = &shapes[i];
        int64_t C = s->H * s->D, n = s->B * s->T * 3 * C, nw = s->B * s->T * C;
        float *x, *w;
        rand_inputs(n, nw, &x, &w);
        x[0] = -0.0f; /* a -0 in q: +0 in the gradient's sum either way */
        for (int o = 0; o < 4; o++) {
            nt_dtype dt = o < 2 ? NT_F32 : NT_BF16;
            float *first = NULL;
            for (int b = 0; b < 2; b++)
                for (int m = 0; m < 4; m++) {
                    uint64_t kv, kp;
                    config(be[b], modes[m]);
                    float *gv = qkv_grad(s, x, w, orders[o % 2], false, dt, &kv);
                    float *gp = qkv_grad(s, x, w, orders[o % 2], true, dt, &kp);
                    assert_memory_equal(gv, gp, (size_t)n * sizeof(float));
                    if (!first)
                        first = gv;
                    else
                        assert_memory_equal(gv, first, (size_t)n * sizeof(float));
                    if (gv != first)
                        free(gv);
                    free(gp);
                }
            free(first);
        }
        free(x);
        free(w);
    }
}

/* In place, q, k, v are not copied for the backward: heads in order run
 * fewer kernels than heads with k and v swapped (which keep the packed
 * path), the same ops otherwise. */
static void test_views_fewer_kernels(void **state)
{
    (void)state;
    const shp s = kshape;
    float *x, *w;
    kernel_case(&x, &w);
    uint64_t kin, kswap;
    free(qkv_grad(&s, x, w, (const int[]){0, 1, 2}, false, NT_F32, &kin));
    free(qkv_grad(&s, x, w, (const int[]){0, 2, 1}, false, NT_F32, &kswap));
    assert_true(kin > 0);
    assert_true(kin < kswap);
    free(x);
    free(w);
}

/* y = sdpa(heads of qkv) back in [B, T, C], and (grad) the gradient of
 * sum(y * w) with respect to qkv, through the heads' views or (contig)
 * contiguous copies of them; captured (cap): the step captured once and
 * replayed, the replay's values.  *kernels: the simulator's kernels of the
 * forward alone (op by op). */
static float *fwd_out(const shp *s, const float *x, const float *w, bool contig, bool cap,
                      nt_dtype dt, float **grad, uint64_t *kernels)
{
    int64_t C = s->H * s->D, n = s->B * s->T * 3 * C, no = s->B * s->T * C;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *qkv = nt_from_host(x, NT_F32, 3, (int64_t[]){s->B, s->T, 3 * C});
    nt_tensor *W = nt_from_host(w, NT_F32, 3, (int64_t[]){s->B, s->T, C});
    assert_non_null(qkv);
    assert_non_null(W);
    assert_int_equal(nt_set_requires_grad(qkv, true), 0);
    assert_int_equal(nt_sync(), 0);
    nt_stats_reset();
    nt_tensor *y = NULL;
    nt_graph *g = NULL;
    *kernels = 0;
    if (cap)
        assert_int_equal(nt_graph_capture_begin(), 0);
    nt_tensor *x2 = dt == NT_F32 ? qkv : nt_cast(qkv, dt);
    nt_tensor *q = heads(x2, s, 0, contig), *k = heads(x2, s, 1, contig),
              *v = heads(x2, s, 2, contig);
    nt_tensor *a = nt_scaled_dot_product_attention(q, k, v, NULL, s->causal, 0.0);
    assert_non_null(a);
    /* heads inside rows: a view of [B, T, H, D], permuted back for free */
    nt_tensor *p = nt_permute(a, (int[]){0, 2, 1, 3});
    if (!contig && s->H > 1 && s->T > 1) {
        assert_false(nt_is_contiguous(a));
        assert_true(nt_is_contiguous(p));
    }
    y = nt_reshape(p, 3, (int64_t[]){s->B, s->T, C});
    if (y && dt != NT_F32)
        y = nt_cast(y, NT_F32);
    assert_non_null(y);
    if (!cap) {
        assert_int_equal(nt_sync(), 0);
        nt_stats st;
        nt_stats_get(&st);
        *kernels = st.sim_kernels;
    }
    assert_int_equal(nt_backward(nt_sum(nt_mul(y, W), NT_DIM_ALL, false)), 0);
    if (cap) { /* the replay's gradient, from zero */
        g = nt_graph_capture_end();
        assert_non_null(g);
        assert_int_equal(nt_sync(), 0);
        assert_int_equal(nt_zero_grad(qkv), 0);
        assert_int_equal(nt_graph_replay(g), 0);
    }
    float *out = malloc((size_t)no * sizeof(float));
    assert_int_equal(nt_to_host(nt_contiguous(y), out, (size_t)no * sizeof(float)), 0);
    *grad = malloc((size_t)n * sizeof(float));
    assert_int_equal(nt_to_host(nt_contiguous(nt_grad(qkv)), *grad, (size_t)n * sizeof(float)),
                     0);
    if (g)
        nt_graph_destroy(g);
    nt_scope_end(sc);
    return out;
}

/* The output written with heads inside rows equals the output of
 * contiguous q, k, v (written as [B, H, T, D] and copied to [B, T, C]) bit
 * for bit, with the gradients, op by op in every mode and captured, on
 * both backends, f32 and bf16; the backends agree. */
static void test_out_heads_inside(void **state)
{
    (void)state;
    static const char *be[2] = {"cpu", "sim"};
    static const char *modes[3] = {"deterministic", "lazy", "adaptive"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shp *s = &shapes[i];
        int64_t C = s->H * s->D, n = s->B * s->T * 3 * C, no = s->B * s->T * C;
        float *x, *w;
        rand_inputs(n, no, &x, &w);
        for (int d = 0; d < 2; d++) {
            nt_dtype dt = d ? NT_BF16 : NT_F32;
            float *ref = NULL, *gref = NULL;
            for (int b = 0; b < 2; b++)
                for (int m = 0; m < 4; m++) {
                    uint64_t kv, kc;
                    float *gv, *gc;
                    config(be[b], modes[m < 3 ? m : 1]); /* m == 3: captured */
                    float *ov = fwd_out(s, x, w, false, m == 3, dt, &gv, &kv);
                    float *oc = fwd_out(s, x, w, true, m == 3, dt, &gc, &kc);
                    assert_memory_equal(ov, oc, (size_t)no * sizeof(float));
                    assert_memory_equal(gv, gc, (size_t)n * sizeof(float));
                    if (!ref) {
                        ref = oc, gref = gc;
                    } else {
                        assert_memory_equal(ov, ref, (size_t)no * sizeof(float));
                        assert_memory_equal(gv, gref, (size_t)n * sizeof(float));
                        free(oc);
                        free(gc);
                    }
                    free(ov);
                    free(gv);
                }
            free(ref);
            free(gref);
        }
        free(x);
        free(w);
    }
}

/* Deterministic, f32, sim: the forward of the heads' views back to [B, T,
 * C] is the one attention kernel (before: and a copy of its output); a
 * mixed layout (k a contiguous copy, or k and v broadcast over the heads)
 * keeps q's layout for the output, with the same bits. */
static void test_out_one_kernel(void **state)
{
    (void)state;
    const shp s = kshape;
    int64_t C = s.H * s.D, no = s.B * s.T * C;
    float *x, *w;
    kernel_case(&x, &w);
    uint64_t kv, kc;
    float *gv, *gc;
    float *ov = fwd_out(&s, x, w, false, false, NT_F32, &gv, &kv);
    float *oc = fwd_out(&s, x, w, true, false, NT_F32, &gc, &kc);
    assert_int_equal(kv, 1);
    assert_true(kc > kv);
    /* q a view, k and v contiguous: o with q's layout, the same bits */
    nt_scope *sc = nt_scope_begin();
    nt_tensor *qkv = nt_from_host(x, NT_F32, 3, (int64_t[]){s.B, s.T, 3 * C});
    nt_tensor *a = nt_scaled_dot_product_attention(heads(qkv, &s, 0, false),
                                                   heads(qkv, &s, 1, true),
                                                   heads(qkv, &s, 2, true), NULL, true, 0.0);
    assert_non_null(a);
    assert_false(nt_is_contiguous(a));
    float *om = malloc((size_t)no * sizeof(float));
    nt_tensor *y = nt_reshape(nt_permute(a, (int[]){0, 2, 1, 3}), 3, (int64_t[]){s.B, s.T, C});
    assert_int_equal(nt_to_host(y, om, (size_t)no * sizeof(float)), 0);
    assert_memory_equal(om, ov, (size_t)no * sizeof(float));
    /* k and v one head broadcast to all (stride 0 over the heads), q's
     * heads inside rows: the output as with contiguous copies of all */
    float *oe[2];
    for (int c = 0; c < 2; c++) {
        int64_t sh[4] = {s.B, s.H, s.T, s.D};
        nt_tensor *k1 = nt_slice(heads(qkv, &s, 1, false), 1, 0, 1, 1);
        nt_tensor *v1 = nt_slice(heads(qkv, &s, 2, false), 1, 0, 1, 1);
        nt_tensor *ke = nt_expand(k1, 4, sh), *ve = nt_expand(v1, 4, sh);
        nt_tensor *q = heads(qkv, &s, 0, c);
        if (c)
            ke = nt_contiguous(ke), ve = nt_contiguous(ve);
        nt_tensor *e = nt_scaled_dot_product_attention(q, ke, ve, NULL, true, 0.0);
        assert_non_null(e);
        assert_true(nt_is_contiguous(e) == (c == 1));
        oe[c] = malloc((size_t)no * sizeof(float));
        assert_int_equal(nt_to_host(nt_contiguous(e), oe[c], (size_t)no * sizeof(float)), 0);
    }
    assert_memory_equal(oe[0], oe[1], (size_t)no * sizeof(float));
    free(oe[0]);
    free(oe[1]);
    nt_scope_end(sc);
    free(om);
    free(ov);
    free(oc);
    free(gv);
    free(gc);
    free(x);
    free(w);
}

/* Head `which` of qkv [B, T, 3C] laid out per head as [B, T, H, 3, D]
 * (examples/gpt_mesh.h's gptm_head): each of q, k, v through a reshape of
 * its own, then a size-1 slice, so each has its own gradient slot, and
 * the three slots are thirds of the one buffer the backward writes. */
static nt_tensor *mesh_head(nt_tensor *qkv, const shp *s, int which, bool contig)
{
    nt_tensor *t = nt_reshape(qkv, 5, (int64_t[]){s->B, s->T, s->H, 3, s->D});
    t = nt_reshape(nt_slice(t, 3, which, which + 1, 1), 4, (int64_t[]){s->B, s->T, s->H, s->D});
    t = nt_permute(t, (int[]){0, 2, 1, 3});
    return contig ? nt_contiguous(t) : t;
}

/* The gradient of a leaf through sdpa of heads of qkv in f32 (contig:
 * through contiguous copies of the heads), in variants of how the slices'
 * gradients meet: 0 plain, 1 v's heads from a detached qkv (no gradient
 * for v's third: +0 there), 2 qkv also used outside attention (its
 * gradient a sum), 3 qkv a slice of a [B, T, 4C] leaf (q, k, v not one
 * dense block: written as before), 4 a reshape of qkv per head (mesh_head:
 * three slots in one buffer; each slot's +0 once zeroed the other two's
 * gradients, the whole of qkv's gradient +0). */
static float *variant_grad(const shp *s, const float *x, const float *w, int variant,
                           bool contig, int64_t *nout)
{
    int64_t C = s->H * s->D, W4 = variant == 3 ? 4 * C : 3 * C, n = s->B * s->T * W4;
    nt_scope *sc = nt_scope_begin();
    nt_tensor *leaf = nt_from_host(x, NT_F32, 3, (int64_t[]){s->B, s->T, W4});
    nt_tensor *W = nt_from_host(w, NT_F32, 4, (int64_t[]){s->B, s->H, s->T, s->D});
    assert_non_null(leaf);
    assert_non_null(W);
    assert_int_equal(nt_set_requires_grad(leaf, true), 0);
    nt_tensor *qkv = variant == 3 ? nt_slice(leaf, 2, C, 4 * C, 1) : nt_mul_scalar(leaf, 1.0);
    nt_tensor *vsrc = variant == 1 ? nt_detach(qkv) : qkv;
    nt_tensor *y = variant == 4 ? nt_scaled_dot_product_attention(
                                      mesh_head(qkv, s, 0, contig), mesh_head(qkv, s, 1, contig),
                                      mesh_head(qkv, s, 2, contig), NULL, s->causal, 0.0)
                                : nt_scaled_dot_product_attention(
                                      heads(qkv, s, 0, contig), heads(qkv, s, 1, contig),
                                      heads(vsrc, s, 2, contig), NULL, s->causal, 0.0);
    assert_non_null(y);
    nt_tensor *l = nt_sum(nt_mul(y, W), NT_DIM_ALL, false);
    if (variant == 2)
        l = nt_add(l, nt_sum(nt_mul(qkv, qkv), NT_DIM_ALL, false));
    assert_non_null(l);
    assert_int_equal(nt_backward(l), 0);
    float *g = malloc((size_t)n * sizeof(float));
    assert_int_equal(nt_to_host(nt_contiguous(nt_grad(leaf)), g, (size_t)n * sizeof(float)), 0);
    nt_scope_end(sc);
    *nout = n;
    return g;
}

/* dq, dk, dv written where q, k, v lie (f32) give the bits of the packed
 * path in every way the slices' gradients meet, on both backends, lazy
 * and deterministic; with a -0 in q and -0 rows of dO (P^T dO and dS
 * products of -0: the sums from +0 stay +0, never -0, so + 0 changes
 * nothing). */
static void test_placed_variants(void **state)
{
    (void)state;
    static const char *be[2] = {"cpu", "sim"};
    static const char *modes[2] = {"deterministic", "lazy"};
    for (size_t i = 0; i < 2; i++) {
        const shp *s = &shapes[i];
        int64_t C = s->H * s->D, n = s->B * s->T * 4 * C, nw = s->B * s->T * C;
        float *x, *w;
        rand_inputs(n, nw, &x, &w);
        for (int64_t j = 0; j < nw / 4; j++)
            w[j] = -0.0f; /* a quarter of -0: -0 rows of dO */
        x[0] = -0.0f;
        for (int v = 0; v < 5; v++)
            for (int b = 0; b < 2; b++)
                for (int m = 0; m < 2; m++) {
                    int64_t n1, n2;
                    config(be[b], modes[m]);
                    float *gv = variant_grad(s, x, w, v, false, &n1);
                    float *gc = variant_grad(s, x, w, v, true, &n2);
                    assert_int_equal(n1, n2);
                    assert_memory_equal(gv, gc, (size_t)n1 * sizeof(float));
                    int64_t nz = 0;
                    for (int64_t j = 0; j < n1; j++)
                        nz += gv[j] != 0.0f;
                    if (nz <= n1 / 4) /* gradients, not the +0 of a lost slice */
                        fail_msg("shape %zu variant %d %s %s: %lld of %lld nonzero", i, v, be[b],
                                 modes[m], (long long)nz, (long long)n1);
                    free(gv);
                    free(gc);
                }
        free(x);
        free(w);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_views_equal_packed, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_views_fewer_kernels, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_out_heads_inside, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_out_one_kernel, nt_test_setup,
                                        nt_test_teardown),
        cmocka_unit_test_setup_teardown(test_placed_variants, nt_test_setup,
                                        nt_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
