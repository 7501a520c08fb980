/* cpu/rope.c - rotary position embedding (op ROPE, core/rope.h): the
 * reference kernel.
 *
 * in[0] x, contiguous [N, T, D] (T = dim -2), in[1] NULL or the offset, a
 * one-element i32 tensor read now; out y of x's shape and dtype.  The
 * cos/sin table of the T positions is made once (nt__rope_table), then for
 * every row (n, t) each pair (x1, x2) -- (i, i + dims/2), or (2i, 2i + 1)
 * interleaved -- is loaded as f32, rotated (y1 = x1*c - x2*s, y2 = x2*c +
 * x1*s) and each result rounded once to y's dtype; features dims .. D-1
 * are copied bit for bit. */
#include "cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/rope.h"

/* The positions' offset: the tensor's value, checked, or the parameter. */
static int rope_offset(const nt__rec *r, int64_t T, int64_t *off)
{
    const nt_tensor *ot = r->in[1];
    *off = r->p.i[1];
    if (!ot)
        return 0;
    char msg[256];
    *off = nt__load_i32(nt__tensor_data(ot), (nt_dtype)ot->dtype, 0);
    if (!nt__rope_pos_ok(*off, T, msg, sizeof msg))
        return nt__kerr(NT_EINVAL, "%s", msg);
    return 0;
}

static void rope_row(const char *x, char *y, nt_dtype dt, const float *cs, int64_t D,
                     int64_t dims, bool il)
{
    int64_t h = dims / 2;
    for (int64_t i = 0; i < h; i++) {
        int64_t a = il ? 2 * i : i, b = il ? 2 * i + 1 : i + h;
        float x1 = nt__load_f32(x, dt, a), x2 = nt__load_f32(x, dt, b);
        float c = cs[i], s = cs[h + i];
        nt__store_f32(y, dt, a, x1 * c - x2 * s);
        nt__store_f32(y, dt, b, x2 * c + x1 * s);
    }
    size_t es = nt__dtype_size(dt);
    if (dims < D)
        memcpy(y + (size_t)dims * es, x + (size_t)dims * es, (size_t)(D - dims) * es);
}

int nt__cpu_rope(const nt__rec *r)
{
    const nt_tensor *x = r->in[0], *o = r->out[0];
    int nd = x->ndim;
    int64_t D = x->shape[nd - 1], T = x->shape[nd - 2];
    int64_t N = nt__numel(nd - 2, x->shape), dims = r->p.i[0];
    if (N * T * D == 0)
        return 0;
    int64_t off;
    int rc = rope_offset(r, T, &off);
    if (rc)
        return rc;
    float *cs = malloc(sizeof(float) * (size_t)(T * dims));
    if (!cs)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a [%lld, %lld] rope table",
                        (long long)T, (long long)dims);
    nt__rope_table(cs, off, 0, T, dims, r->p.f[0], r->p.f[1], r->p.flag & NT__ROPE_INVERSE);
    nt_dtype dt = (nt_dtype)x->dtype;
    size_t rb = (size_t)D * nt__dtype_size(dt);
    const char *xp = nt__tensor_data(x);
    char *yp = nt__tensor_data(o);
    for (int64_t n = 0; n < N; n++)
        for (int64_t t = 0; t < T; t++) {
            size_t row = (size_t)(n * T + t) * rb;
            rope_row(xp + row, yp + row, dt, cs + t * dims, D, dims,
                     r->p.flag & NT__ROPE_INTERLEAVED);
        }
    free(cs);
    return 0;
}
