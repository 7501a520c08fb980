/* core/reduce.c - the canonical reduction order; see reduce.h. */
#include "core/reduce.h"

#include <math.h>

#include "core/ewise.h"
#include "core/optable.h"

float nt__red_block_sum_f32(const float *x, int64_t n, int64_t stride)
{
    float lane[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        lane[l] = 0.0f;
    int64_t i = 0;
    if (stride == 1) {
        for (; i + NT_RED_LANES <= n; i += NT_RED_LANES)
            for (int l = 0; l < NT_RED_LANES; l++)
                lane[l] += x[i + l];
    } else {
        for (; i + NT_RED_LANES <= n; i += NT_RED_LANES)
            for (int l = 0; l < NT_RED_LANES; l++)
                lane[l] += x[(i + l) * stride];
    }
    for (int l = 0; i < n; i++, l++)
        lane[l] += x[i * stride];
    for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++)
            lane[l] += lane[l + h];
    return lane[0];
}

float nt__red_block_max_f32(const float *x, int64_t n, int64_t stride)
{
    float lane[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        lane[l] = -INFINITY;
    int64_t i = 0;
    if (stride == 1) {
        /* nt__ew_maximum with both arms computed and picked by integer
         * masks (the same values, NaN included): GCC vectorises this, not
         * the ?: form under -ftrapping-math */
        for (; i + NT_RED_LANES <= n; i += NT_RED_LANES)
            for (int l = 0; l < NT_RED_LANES; l++) {
                float a = lane[l], b = x[i + l];
                int unord = (a != a) | (b != b);
                lane[l] = nt__fsel(unord, a + b, nt__fsel(b > a, b, a));
            }
    }
    for (; i + NT_RED_LANES <= n; i += NT_RED_LANES)
        for (int l = 0; l < NT_RED_LANES; l++)
            lane[l] = nt__ew_maximum(lane[l], x[(i + l) * stride]);
    for (int l = 0; i < n; i++, l++)
        lane[l] = nt__ew_maximum(lane[l], x[i * stride]);
    for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++)
            lane[l] = nt__ew_maximum(lane[l], lane[l + h]);
    return lane[0];
}

/* The max's lanes and folds with nt__ew_minimum (min is rare: no
 * vectorised arm). */
float nt__red_block_min_f32(const float *x, int64_t n, int64_t stride)
{
    float lane[NT_RED_LANES];
    for (int l = 0; l < NT_RED_LANES; l++)
        lane[l] = INFINITY;
    int64_t i = 0;
    for (; i + NT_RED_LANES <= n; i += NT_RED_LANES)
        for (int l = 0; l < NT_RED_LANES; l++)
            lane[l] = nt__ew_minimum(lane[l], x[(i + l) * stride]);
    for (int l = 0; i < n; i++, l++)
        lane[l] = nt__ew_minimum(lane[l], x[i * stride]);
    for (int h = NT_RED_LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++)
            lane[l] = nt__ew_minimum(lane[l], lane[l + h]);
    return lane[0];
}

float nt__red_sum_f32(const float *x, int64_t n, int64_t stride)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n; b += NT_RED_BLOCK) {
        int64_t m = n - b < NT_RED_BLOCK ? n - b : NT_RED_BLOCK;
        acc += nt__red_block_sum_f32(x + b * stride, m, stride);
    }
    return acc;
}

float nt__red_max_f32(const float *x, int64_t n, int64_t stride)
{
    float acc = -INFINITY;
    for (int64_t b = 0; b < n; b += NT_RED_BLOCK) {
        int64_t m = n - b < NT_RED_BLOCK ? n - b : NT_RED_BLOCK;
        acc = nt__ew_maximum(acc, nt__red_block_max_f32(x + b * stride, m, stride));
    }
    return acc;
}

float nt__red_min_f32(const float *x, int64_t n, int64_t stride)
{
    float acc = INFINITY;
    for (int64_t b = 0; b < n; b += NT_RED_BLOCK) {
        int64_t m = n - b < NT_RED_BLOCK ? n - b : NT_RED_BLOCK;
        acc = nt__ew_minimum(acc, nt__red_block_min_f32(x + b * stride, m, stride));
    }
    return acc;
}

int32_t nt__red_sum_i32(const int32_t *x, int64_t n, int64_t stride)
{
    uint32_t acc = 0;
    for (int64_t i = 0; i < n; i++)
        acc += (uint32_t)x[i * stride];
    return (int32_t)acc;
}

int nt__red_plan(int op, double ord, int *rop, int *pre, int *fin)
{
    /* the recipe is the flags column's NT_OPF_RED (core/optable.h) */
    if (op < 0 || op >= NT_OP_COUNT || !(nt__ops[op].flags & NT_OPF_REDUCTION))
        return -1; /* not a reduction: the caller's error */
    if (nt__op_red(op, rop, pre, fin))
        return 0;
    /* nt_norm: a sum of |x|^ord, its root; the orders with a cheaper form */
    *rop = NT_RED_SUM, *pre = NT_RED_PRE_POW, *fin = NT_RED_FIN_POW;
    if (ord == 2.0)
        *pre = NT_RED_PRE_SQ, *fin = NT_RED_FIN_SQRT;
    else if (ord == 1.0)
        *pre = NT_RED_PRE_ABS, *fin = NT_RED_FIN_NONE;
    else if (ord == INFINITY)
        *pre = NT_RED_PRE_ABS, *rop = NT_RED_MAX, *fin = NT_RED_FIN_NONE;
    else if (ord == -INFINITY)
        *pre = NT_RED_PRE_ABS, *rop = NT_RED_MIN, *fin = NT_RED_FIN_NONE;
    else if (ord == 0.0)
        *pre = NT_RED_PRE_NZ, *fin = NT_RED_FIN_NONE;
    return 0;
}
