/* examples/custom_op.c - a user op built from ntensor ops, with its gradient.
 *
 * The Huber loss term, elementwise, with threshold delta:
 *
 *     huber(x) = 0.5 x^2                  where |x| <= delta
 *                delta (|x| - 0.5 delta)  elsewhere
 *
 *     d huber / dx = clamp(x, -delta, delta)
 *
 * The forward and the backward are written with public ops, exactly as the
 * built-in ops' backward functions are, so the op is queued, fused and run
 * on whichever backend the program uses.  nt_gradcheck compares the backward
 * with central finite differences; the program exits non-zero if they
 * disagree, or if the op's value differs from the same ops issued by hand.
 *
 * Build: part of the tree (meson); run: build/examples/custom_op. */
#include <math.h>
#include <ntensor.h>
#include <stdio.h>

typedef struct {
    double delta;
} huber_ctx;

/* x: any floating shape -> huber(x), same shape and dtype. */
static nt_tensor *huber_forward(nt_tensor *const *in, void *ctx)
{
    double d = ((huber_ctx *)ctx)->delta;
    nt_tensor *x = in[0];
    nt_tensor *ax = nt_abs(x);
    nt_tensor *quad = nt_mul_scalar(nt_mul(x, x), 0.5);
    nt_tensor *lin = nt_mul_scalar(nt_add_scalar(ax, -0.5 * d), d);
    nt_tensor *inside = nt_le(ax, nt_full_like(ax, d));
    return nt_where(inside, quad, lin);
}

/* gout: like x -> gin[0] = gout * clamp(x, -delta, delta). */
static int huber_backward(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out, nt_tensor **gin,
                          void *ctx)
{
    (void)out;
    double d = ((huber_ctx *)ctx)->delta;
    gin[0] = nt_mul(gout, nt_clamp(in[0], -d, d));
    return gin[0] ? 0 : nt_last_error();
}

static int huber_id;
static nt_tensor *huber(nt_tensor *const *in, void *ctx)
{
    (void)ctx;
    return nt_op_call(huber_id, in);
}

static int fail(const char *what)
{
    fprintf(stderr, "custom_op: %s: %s\n", what, nt_last_error_message());
    nt_shutdown();
    return 1;
}

int main(void)
{
    if (nt_init() != 0)
        return fail("nt_init");
    static huber_ctx hc = {1.0};
    nt_op_def def = {"huber", 1, huber_forward, huber_backward, &hc};
    huber_id = nt_op_register(&def);
    if (huber_id < 0)
        return fail("nt_op_register");

    nt_scope *s = nt_scope_begin();
    float xs[8] = {-3.0f, -1.5f, -0.75f, -0.1f, 0.2f, 0.9f, 1.25f, 4.0f};
    nt_tensor *x = nt_from_host(xs, NT_F32, 1, (int64_t[]){8});
    nt_set_requires_grad(x, true);

    /* The value: the registered op gives the bits of its ops issued by hand. */
    float y[8], ref[8];
    nt_tensor *in[1] = {x};
    if (nt_to_host(huber(in, NULL), y, sizeof y) != 0 ||
        nt_to_host(huber_forward(in, &hc), ref, sizeof ref) != 0)
        return fail("forward");
    for (int i = 0; i < 8; i++) {
        double a = fabs(xs[i]);
        double want = a <= hc.delta ? 0.5 * xs[i] * xs[i] : hc.delta * (a - 0.5 * hc.delta);
        printf("huber(%5.2f) = %.6f\n", xs[i], y[i]);
        if (y[i] != ref[i] || fabs(y[i] - want) > 1e-6) {
            fprintf(stderr, "custom_op: huber(%g) = %g, expected %g\n", xs[i], y[i], want);
            nt_shutdown();
            return 1;
        }
    }

    /* The gradient, against central finite differences. */
    if (nt_gradcheck(huber, in, 1, NULL, 1e-2, 2e-2, 2e-2) != 0)
        return fail("nt_gradcheck");
    printf("gradcheck: ok\n");
    nt_scope_end(s);
    nt_shutdown();
    return 0;
}
