/* examples/demo.c - a tour of the API: tensors, ops, views, errors, streams.
 * Build against an installed ntensor with
 *   cc demo.c $(pkg-config --cflags --libs ntensor) */
#include <ntensor.h>
#include <stdio.h>

int main(void)
{
    if (nt_init() != 0) {
        fprintf(stderr, "nt_init: %s\n", nt_last_error_message());
        return 1;
    }
    nt_scope *s = nt_scope_begin(); /* everything made below dies at scope end */

    float data[6] = {1, 2, 3, 4, 5, 6};
    nt_tensor *x = nt_from_host(data, NT_F32, 2, (int64_t[]){2, 3});
    printf("x =\n");
    nt_print(x);

    /* Ops return at once; the work is queued on this thread's stream. */
    nt_tensor *y = nt_relu(nt_sub(nt_mul_scalar(x, 1.5), nt_full(NT_F32, 0, NULL, 4.0)));
    printf("relu(1.5 x - 4) =\n");
    nt_print(y); /* a sync point: waits for exactly what it prints */

    nt_tensor *xt = nt_transpose(x, 0, 1); /* a view: no copy */
    printf("x^T (a view, strides %lld,%lld) =\n", (long long)nt_stride(xt, 0),
           (long long)nt_stride(xt, 1));
    nt_print(xt);

    printf("x . x^T =\n");
    nt_print(nt_matmul(x, xt));
    printf("softmax(x, dim=1) =\n");
    nt_print(nt_softmax(x, 1));
    printf("sum over dim 0 = ");
    nt_print(nt_sum(x, 0, false));
    printf("x in bf16 = ");
    nt_print(nt_cast(x, NT_BF16));

    /* A bad call returns NULL and says why, naming this line. */
    nt_tensor *bad = nt_add(x, nt_ones(NT_F32, 1, (int64_t[]){4}));
    if (!bad)
        printf("expected error: %s\n", nt_last_error_message());
    nt_clear_error();

    /* A failure found while the queued op runs names the line that queued it. */
    int32_t idx[2] = {0, 7};
    nt_tensor *e = nt_embedding(x, nt_from_host(idx, NT_I32, 1, (int64_t[]){2}));
    double v;
    if (nt_item(nt_sum(e, NT_DIM_ALL, false), &v) != 0)
        printf("expected async error: %s\n", nt_last_error_message());
    nt_clear_error();

    nt_stats st;
    nt_stats_get(&st);
    printf("stats: %llu ops enqueued, %llu kernels, %llu syncs\n",
           (unsigned long long)st.ops_enqueued, (unsigned long long)st.kernels_launched,
           (unsigned long long)st.syncs);
    nt_scope_end(s);
    nt_shutdown();
    return 0;
}
