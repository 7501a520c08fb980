/* examples/custom_kernel.c - a user op whose forward is a tile kernel on the
 * simulated NeuronCore, with a gradient.
 *
 * softplus(x) = log(1 + exp(x)), computed in the stable form
 *
 *     softplus(x) = relu(x) + log(1 + exp(-|x|))
 *
 * as a tile program: each [128, F] tile of x is DMA'd into SBUF, ScalarE
 * computes |x|, exp(-|x|) (scale -1), log(. + 1) (bias 1) and relu(x),
 * VectorE adds, and the sum is DMA'd back to HBM.  Two tile buffers
 * alternate so the next tile's load overlaps this tile's compute.  The
 * backward, d softplus / dx = sigmoid(x), is written with ntensor ops.
 *
 * Build: part of the tree (meson); run: build/examples/custom_kernel. */
#include <math.h>
#include <ntensor/sim.h> /* the tile-kernel API; it includes <ntensor.h> */
#include <stdio.h>
#include <string.h>

/* ---- the shape rule: one contiguous floating tensor in, the same out ---- */
static int softplus_shape(const nt_tensor_view *in, int nin, nt_tensor_view *out, char *why,
                          size_t whylen, void *ctx)
{
    (void)nin, (void)ctx;
    if (in[0].dtype != NT_F32 && in[0].dtype != NT_BF16 && in[0].dtype != NT_F16) {
        snprintf(why, whylen, "x is %s; expected f32, bf16 or f16", nt_dtype_name(in[0].dtype));
        return NT_EDTYPE;
    }
    int64_t expect = 1;
    for (int i = in[0].ndim - 1; i >= 0; i--) {
        if (in[0].shape[i] != 1 && in[0].stride[i] != expect) {
            snprintf(why, whylen, "x is not contiguous (call nt_contiguous first)");
            return NT_EINVAL;
        }
        expect *= in[0].shape[i];
    }
    out->dtype = in[0].dtype;
    out->ndim = in[0].ndim;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    return 0;
}

/* ---- the kernel ---- */
enum { F = 1024 }; /* free elements per partition of a tile */

static int softplus_kernel(nt_sim_kernel *k, const nt_tensor_view *in, int nin,
                           const nt_tensor_view *out, void *ctx)
{
    (void)nin, (void)ctx;
    nt_dtype dt = in[0].dtype;
    int64_t n = 1;
    for (int i = 0; i < in[0].ndim; i++)
        n *= in[0].shape[i];
    nt_tile *x[2], *a[2], *y[2];
    for (int b = 0; b < 2; b++) {
        x[b] = nt_tile_alloc(k, "x", NT_MEM_SBUF, dt, 128, F);
        a[b] = nt_tile_alloc(k, "t", NT_MEM_SBUF, NT_F32, 128, F); /* f32 temporaries */
        y[b] = nt_tile_alloc(k, "y", NT_MEM_SBUF, dt, 128, F);
    }
    nt_tile *r = nt_tile_alloc(k, "relu", NT_MEM_SBUF, NT_F32, 128, F);
    nt_isa_scalar minus1 = {NULL, -1.0f}, plus1 = {NULL, 1.0f};
    int t = 0;
    for (int64_t i0 = 0; i0 < n; t++) {
        /* a tile: up to 128 rows of F elements, or the last short row */
        int64_t rows = (n - i0) / F;
        int np = rows ? (int)(rows < 128 ? rows : 128) : 1;
        int64_t w = rows ? F : n - i0;
        int b = t & 1;
        nt_ap hx = nt_hbm_ap(in[0].data, dt, i0, np, F, w);
        nt_ap hy = nt_hbm_ap(out->data, dt, i0, np, F, w);
        nt_ap X = nt_tile_slice(x[b], 0, np, 0, w), A = nt_tile_slice(a[b], 0, np, 0, w);
        nt_ap Y = nt_tile_slice(y[b], 0, np, 0, w), R = nt_tile_slice(r, 0, np, 0, w);
        nt_isa_dma_copy(k, &X, &hx, b);                                      /* load */
        nt_isa_activation(k, &A, NT_ACT_ABS, &X, NULL, NULL, NULL);          /* |x| */
        nt_isa_activation(k, &A, NT_ACT_EXP, &A, &minus1, NULL, NULL);      /* exp(-|x|) */
        nt_isa_activation(k, &A, NT_ACT_LOG, &A, NULL, &plus1, NULL);       /* log(. + 1) */
        nt_isa_activation(k, &R, NT_ACT_RELU, &X, NULL, NULL, NULL);         /* relu(x) */
        nt_isa_tensor_tensor(k, &Y, &R, &A, NT_ALU_ADD, NT_ENGINE_VECTOR);  /* rounds once */
        nt_isa_dma_copy(k, &hy, &Y, 8 + b);                                  /* store */
        i0 += np * w;
    }
    /* a broken rule (SBUF full, a bad pattern...) makes every later call a
     * no-op; the runtime reports the kernel's message with this op's name */
    return nt_sim_kernel_error(k);
}

/* ---- the gradient: gout * sigmoid(x), with ntensor ops ---- */
static int softplus_backward(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out,
                             nt_tensor **gin, void *ctx)
{
    (void)out, (void)ctx;
    gin[0] = nt_mul(gout, nt_sigmoid(in[0]));
    return gin[0] ? 0 : nt_last_error();
}

int main(void)
{
    if (nt_init())
        return 1;
    nt_kernel_op_def def = {
        .name = "softplus",
        .nin = 1,
        .shape = softplus_shape,
        .kernel = softplus_kernel,
        .backward = softplus_backward,
    };
    int op = nt_op_register_kernel(&def);
    if (op < 0) {
        fprintf(stderr, "register: %s\n", nt_last_error_message());
        return 1;
    }

    int64_t shape[2] = {300, 1000};
    nt_tensor *x = nt_randn(NT_F32, 2, shape, 42);
    nt_set_requires_grad(x, true);
    nt_sim_stats_reset();
    nt_tensor *y = nt_op_call(op, (nt_tensor *[]){x}); /* queued like any op */
    nt_tensor *loss = nt_mean(y, NT_DIM_ALL, false);
    if (nt_backward(loss)) {
        fprintf(stderr, "backward: %s\n", nt_last_error_message());
        return 1;
    }

    /* check against the same function built from ntensor ops */
    nt_tensor *ref = nt_add(nt_relu(x), nt_log(nt_add_scalar(nt_exp(nt_neg(nt_abs(x))), 1.0)));
    double err, l;
    nt_tensor *d = nt_max(nt_abs(nt_sub(y, ref)), NT_DIM_ALL, false);
    if (nt_item(d, &err) || nt_item(loss, &l)) {
        fprintf(stderr, "error: %s\n", nt_last_error_message());
        return 1;
    }
    nt_tensor *g = nt_grad(x);
    double g0;
    nt_item(nt_sum(g, NT_DIM_ALL, false), &g0);
    nt_sim_stats st;
    nt_sim_stats_get(&st);
    printf("softplus tile kernel on %lld x %lld f32: mean %.6f, max |kernel - ntensor ops| = %g\n",
           (long long)shape[0], (long long)shape[1], l, err);
    printf("gradient sum %.6f (the mean of sigmoid(x))\n", g0);
    printf("simulator: %llu kernels, %.1f us simulated, ScalarE busy %.0f%%, %.1f MB HBM traffic\n",
           (unsigned long long)st.kernels, st.sim_ns / 1e3, 100.0 * st.utilization[NT_ENGINE_SCALAR],
           (double)(st.hbm_read_bytes + st.hbm_write_bytes) / 1e6);

    /* the shape rule's error path */
    nt_tensor *xi = nt_arange(NT_I32, 0, 10, 1);
    if (!nt_op_call(op, (nt_tensor *[]){xi}))
        printf("as expected: %s\n", nt_last_error_message());
    nt_shutdown();
    return err == 0.0 ? 0 : 1;
}
