/* examples/debug_demo.c - a small program to debug.
 *
 * docs/debugging.md walks through a gdb session on it, and tests/gdb_test.py
 * drives gdb over it (the "@name" comments mark the lines it stops at).
 * Run it with NT_DETERMINISTIC=1 to step from a call into its kernel, with
 * NT_MODE=lazy to see ops wait in the queue (nt-queue), with NT_CHECK_NAN=1
 * to have the NaN below named, with NT_TRACE=trace.json for a trace. */
#include <ntensor.h>
#include <stdio.h>

int main(void)
{
    if (nt_init() != 0) {
        fprintf(stderr, "nt_init: %s\n", nt_last_error_message());
        return 1;
    }
    nt_scope *scope = nt_scope_begin();

    float xa[6] = {1, 2, 3, 4, 5, 6};
    float wa[6] = {0.5f, -1, 2, 0.25f, -0.5f, 1};
    nt_tensor *x = nt_from_host(xa, NT_F32, 2, (int64_t[]){2, 3});
    nt_tensor *w = nt_from_host(wa, NT_F32, 2, (int64_t[]){2, 3});

    nt_tensor *y = nt_add(x, w);                   /* @add */
    nt_tensor *z = nt_relu(nt_mul_scalar(y, 2.0)); /* @relu */
    nt_tensor *p = nt_exp(nt_neg(z));
    nt_tensor *q = nt_sum(p, 1, false);
    nt_print(y);                                   /* @print_y */
    nt_tensor *r = nt_mul(q, q);                   /* @mul */
    nt_print(r);                                   /* @print_r */

    /* bf16 and a tensor big enough to be summarised */
    nt_tensor *h = nt_cast(y, NT_BF16);
    nt_tensor *big = nt_reshape(nt_arange(NT_F32, 0, 2000, 1), 2, (int64_t[]){40, 50});
    nt_print(h);
    nt_print(big);                                 /* @print_big */

    /* log of a negative number: NaN (named under NT_CHECK_NAN=1) */
    nt_tensor *lg = nt_log(nt_sub(x, nt_full(NT_F32, 0, NULL, 2.0))); /* @log */
    double v;
    if (nt_item(nt_sum(lg, NT_DIM_ALL, false), &v) != 0) /* @item */
        printf("error: %s\n", nt_last_error_message());
    else
        printf("sum of log = %g\n", v);

    /* an index out of range: the queued op fails, its output is poisoned */
    int32_t idx[2] = {0, 7};
    nt_tensor *e = nt_embedding(w, nt_from_host(idx, NT_I32, 1, (int64_t[]){2})); /* @embed */
    if (nt_sync() != 0)
        printf("error: %s\n", nt_last_error_message());

    /* a released handle */
    nt_tensor *tmp = nt_keep(nt_ones(NT_F32, 1, (int64_t[]){3}));
    nt_release(tmp);
    printf("done\n");                              /* @done */

    (void)e;
    nt_scope_end(scope);
    nt_shutdown();
    return 0;
}
