/* tests/fuzz/fuzz_api.c - fuzz target for sequences of public API calls.
 *
 * The input is a little program: each op is an opcode byte and argument
 * bytes, run against 8 tensor registers.  Arguments come from tables of
 * ordinary and hostile values (negative and huge dims, 2^31, 2^48, 2^62,
 * INT64_MAX, NaN, out-of-range dims and dtypes), registers may be empty
 * (NULL) or hold a handle released earlier in the same input (a stale
 * pointer inside the quarantine).
 *
 * What must hold after every call: a tensor result has 0..8 dims, sizes
 * >= 0 and at most 2^48 elements, a valid dtype; a NULL result or a
 * negative code comes with nt_last_error() set and a message naming the
 * function (or, for a sync point, the op whose error it reports); no crash
 * or sanitizer report.  Compute ops on inputs of more than 2^16 elements
 * are skipped (they are legal, only slow: an expanded 2^40-element view
 * summed takes 2^40 steps); ops whose result would pass 2^48 elements are
 * always run, since they must fail at once. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntensor.h"

#define NREG 8
#define MAXOPS 96
#define BIG ((int64_t)1 << 16)

static nt_tensor *reg[NREG];
static bool live[NREG]; /* reg[i] holds a reference of ours */
static long n_ok, n_err; /* results, for NT_FUZZ_VERBOSE */

typedef struct {
    const uint8_t *p;
    size_t n;
} rd_t;

static uint8_t u8(rd_t *r)
{
    if (!r->n)
        return 0;
    r->n--;
    return *r->p++;
}

static const int64_t DIMS[] = {1, 2, 3, 4, 0, 5, 8, 16, 1, 2, -1, -2, (int64_t)1 << 31,
                               (int64_t)1 << 33, (int64_t)1 << 47, (int64_t)1 << 48,
                               ((int64_t)1 << 48) + 1, (int64_t)1 << 62, INT64_MAX, INT64_MIN};
static int64_t dim(rd_t *r)
{
    uint8_t b = u8(r);
    return b < 200 ? (int64_t)(b % 6) : DIMS[b % (sizeof DIMS / sizeof DIMS[0])];
}
static const double VALS[] = {0.0, 1.0, -1.0, 0.5, 2.0, -3.5, 1e30, -1e-30, NAN, INFINITY,
                              -INFINITY, 65504.0, 1e-8, 5.0};
static double val(rd_t *r) { return VALS[u8(r) % (sizeof VALS / sizeof VALS[0])]; }
static int idim(rd_t *r)
{
    uint8_t b = u8(r);
    return b == 255 ? NT_DIM_ALL : b >= 250 ? INT32_MIN + b : (int)(b % 12) - 6;
}
static nt_dtype dtype(rd_t *r)
{
    uint8_t b = u8(r);
    return b >= 250 ? (nt_dtype)(b - 253) : (nt_dtype)(b % 5);
}
static int ridx(rd_t *r) { return u8(r) % NREG; }
static nt_tensor *tin(rd_t *r) { return reg[ridx(r)]; }

static void die(const char *fn, const char *what)
{
    fprintf(stderr, "fuzz_api: %s: %s (error %d: %s)\n", fn, what, nt_last_error(),
            nt_last_error_message());
    abort();
}

static bool usable(nt_tensor *t) { return nt_ndim(t) >= 0; }
static int64_t numel(nt_tensor *t) { return usable(t) ? nt_numel(t) : 0; }

static void check_error(const char *fn, bool sync_point)
{
    int e = nt_last_error();
    if (e >= 0 || e < -15)
        die(fn, "failed without an NT_E* error");
    const char *m = nt_last_error_message();
    if (!strstr(m, fn) && !(sync_point && strstr(m, "[reported by")))
        die(fn, "message does not name the function");
}

static void put(int i, nt_tensor *t)
{
    if (live[i])
        nt_release(reg[i]);
    reg[i] = t;
    live[i] = t != NULL;
}

/* Checks a tensor result and stores it in register `out`. */
static void result(const char *fn, nt_tensor *t, int out)
{
    if (!t) {
        check_error(fn, false);
        n_err++;
        return;
    }
    n_ok++;
    int nd = nt_ndim(t);
    if (nd < 0 || nd > NT_MAX_DIMS)
        die(fn, "result with a bad ndim");
    for (int i = 0; i < nd; i++)
        if (nt_shape(t, i) < 0)
            die(fn, "result with a negative size");
    int64_t n = nt_numel(t);
    if (n < 0 || n > ((int64_t)1 << 48))
        die(fn, "result with more than 2^48 elements");
    if ((unsigned)nt_dtype_of(t) >= NT_DTYPE_COUNT)
        die(fn, "result with a bad dtype");
    put(out, t);
}

static void rc_check(const char *fn, int rc, bool sync_point)
{
    if (rc > 0)
        die(fn, "positive return code");
    if (rc < 0) {
        if (nt_last_error() != rc)
            die(fn, "return code differs from nt_last_error()");
        check_error(fn, sync_point);
    }
}

/* Broadcast element count of a and b as a double (0 if not broadcastable). */
static double bcast_numel(nt_tensor *a, nt_tensor *b)
{
    if (!usable(a) || !usable(b))
        return 0;
    int na = nt_ndim(a), nb = nt_ndim(b), n = na > nb ? na : nb;
    double e = 1;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? nt_shape(a, ia) : 1, db = ib >= 0 ? nt_shape(b, ib) : 1;
        e *= (double)(da > db ? da : db);
    }
    return e;
}

typedef nt_tensor *(*un_fn)(nt_tensor *);
typedef nt_tensor *(*bin_fn)(nt_tensor *, nt_tensor *);
static const struct { const char *n; un_fn f; } UN[] = {
    {"nt_neg", nt_neg},       {"nt_exp", nt_exp},         {"nt_log", nt_log},
    {"nt_sqrt", nt_sqrt},     {"nt_abs", nt_abs},         {"nt_relu", nt_relu},
    {"nt_gelu", nt_gelu},     {"nt_sigmoid", nt_sigmoid}, {"nt_tanh", nt_tanh},
    {"nt_silu", nt_silu},     {"nt_rsqrt", nt_rsqrt},     {"nt_contiguous", nt_contiguous},
    {"nt_detach", nt_detach}, {"nt_zeros_like", nt_zeros_like},
};
static const struct { const char *n; bin_fn f; } BIN[] = {
    {"nt_add", nt_add}, {"nt_sub", nt_sub},         {"nt_mul", nt_mul},
    {"nt_div", nt_div}, {"nt_maximum", nt_maximum}, {"nt_minimum", nt_minimum},
    {"nt_eq", nt_eq},   {"nt_lt", nt_lt},           {"nt_ge", nt_ge},
};
#define N_(a) ((int)(sizeof a / sizeof a[0]))

static void step(rd_t *r)
{
    uint8_t op = u8(r) % 24;
    int out = ridx(r);
    nt_clear_error();
    switch (op) {
    case 0: { /* creation */
        nt_dtype dt = dtype(r);
        int nd = (int)(u8(r) % 11) - 1;
        int64_t sh[10];
        for (int i = 0; i < 10; i++)
            sh[i] = dim(r);
        uint8_t k = u8(r) % 5;
        const int64_t *shp = u8(r) == 0 ? NULL : sh;
        static const char *const names[] = {"nt_zeros", "nt_ones", "nt_full", "nt_rand",
                                            "nt_randn"};
        nt_tensor *t = k == 0   ? nt_zeros(dt, nd, shp)
                       : k == 1 ? nt_ones(dt, nd, shp)
                       : k == 2 ? nt_full(dt, nd, shp, val(r))
                       : k == 3 ? nt_rand(dt, nd, shp, u8(r))
                                : nt_randn(dt, nd, shp, u8(r));
        result(names[k], t, out);
        break;
    }
    case 1: { /* from_host: only with a buffer that holds the shape */
        static float buf[256];
        int64_t sh[2] = {dim(r), dim(r)};
        nt_dtype dt = dtype(r);
        double n = (double)sh[0] * (double)sh[1];
        bool fits = sh[0] >= 0 && sh[1] >= 0 && n * 4 <= sizeof buf;
        result("nt_from_host", nt_from_host(fits ? buf : NULL, dt, 2, sh), out);
        break;
    }
    case 2: { /* arange */
        nt_dtype dt = dtype(r);
        double a = val(r), b = val(r) * 16, s = val(r);
        if (fabs(b - a) / fabs(s) > 1e6)
            break; /* legal but big */
        result("nt_arange", nt_arange(dt, a, b, s), out);
        break;
    }
    case 3: {
        int k = u8(r) % N_(UN);
        nt_tensor *t = tin(r);
        if (numel(t) > BIG)
            break;
        result(UN[k].n, UN[k].f(t), out);
        break;
    }
    case 4: {
        int k = u8(r) % N_(BIN);
        nt_tensor *a = tin(r), *b = tin(r);
        double e = bcast_numel(a, b);
        if (e > BIG && e <= (double)((int64_t)1 << 48))
            break;
        result(BIN[k].n, BIN[k].f(a, b), out);
        break;
    }
    case 5: { /* scalar ops */
        nt_tensor *t = tin(r);
        if (numel(t) > BIG)
            break;
        double s = val(r), s2 = val(r);
        switch (u8(r) % 5) {
        case 0: result("nt_add_scalar", nt_add_scalar(t, s), out); break;
        case 1: result("nt_mul_scalar", nt_mul_scalar(t, s), out); break;
        case 2: result("nt_div_scalar", nt_div_scalar(t, s), out); break;
        case 3: result("nt_pow_scalar", nt_pow_scalar(t, s), out); break;
        case 4: result("nt_clamp", nt_clamp(t, s, s2), out); break;
        }
        break;
    }
    case 6: { /* reductions */
        nt_tensor *t = tin(r);
        if (numel(t) > BIG)
            break;
        int d = idim(r);
        bool keep = u8(r) & 1;
        switch (u8(r) % 6) {
        case 0: result("nt_sum", nt_sum(t, d, keep), out); break;
        case 1: result("nt_mean", nt_mean(t, d, keep), out); break;
        case 2: result("nt_max", nt_max(t, d, keep), out); break;
        case 3: result("nt_argmax", nt_argmax(t, d, keep), out); break;
        case 4: result("nt_softmax", nt_softmax(t, d), out); break;
        case 5: result("nt_log_softmax", nt_log_softmax(t, d), out); break;
        }
        break;
    }
    case 7: { /* reshape */
        nt_tensor *t = tin(r);
        int nd = (int)(u8(r) % 11) - 1;
        int64_t sh[10];
        for (int i = 0; i < 10; i++)
            sh[i] = dim(r);
        result("nt_reshape", nt_reshape(t, nd, sh), out);
        break;
    }
    case 8: {
        nt_tensor *t = tin(r);
        result("nt_transpose", nt_transpose(t, idim(r), idim(r)), out);
        break;
    }
    case 9: {
        nt_tensor *t = tin(r);
        int perm[NT_MAX_DIMS];
        for (int i = 0; i < NT_MAX_DIMS; i++)
            perm[i] = idim(r);
        result("nt_permute", nt_permute(t, perm), out);
        break;
    }
    case 10: {
        nt_tensor *t = tin(r);
        int d = idim(r);
        int64_t a = dim(r), b = dim(r), s = dim(r);
        result("nt_slice", nt_slice(t, d, a, b, s), out);
        break;
    }
    case 11: {
        nt_tensor *t = tin(r);
        int nd = (int)(u8(r) % 11) - 1;
        int64_t sh[10];
        for (int i = 0; i < 10; i++)
            sh[i] = dim(r);
        result("nt_expand", nt_expand(t, nd, sh), out);
        break;
    }
    case 12: {
        nt_tensor *ts[4] = {tin(r), tin(r), tin(r), tin(r)};
        int n = (int)(u8(r) % 6) - 1;
        int d = idim(r);
        double tot = 0;
        for (int i = 0; i < 4 && i < n; i++)
            tot += (double)numel(ts[i]);
        if (tot > BIG && tot <= (double)((int64_t)1 << 48))
            break;
        result("nt_cat", nt_cat(ts, n, d), out);
        break;
    }
    case 13: {
        nt_tensor *t = tin(r);
        if (numel(t) > BIG)
            break;
        nt_dtype dt = dtype(r);
        bool sr = u8(r) & 1;
        result(sr ? "nt_cast_sr" : "nt_cast", sr ? nt_cast_sr(t, dt) : nt_cast(t, dt), out);
        break;
    }
    case 14: {
        nt_tensor *a = tin(r), *b = tin(r);
        if (numel(a) > BIG || numel(b) > BIG)
            break;
        if (u8(r) & 1)
            result("nt_matmul", nt_matmul(a, b), out);
        else
            result("nt_linear", nt_linear(a, b, u8(r) & 1 ? tin(r) : NULL), out);
        break;
    }
    case 15: { /* in place */
        nt_tensor *d = tin(r), *s = tin(r);
        if (numel(d) > BIG || numel(s) > BIG)
            break;
        double v = val(r);
        int rc;
        const char *fn;
        switch (u8(r) % 6) {
        case 0: fn = "nt_copy_into", rc = nt_copy_into(d, s); break;
        case 1: fn = "nt_add_inplace", rc = nt_add_inplace(d, s); break;
        case 2: fn = "nt_mul_inplace", rc = nt_mul_inplace(d, s); break;
        case 3: fn = "nt_fill_inplace", rc = nt_fill_inplace(d, v); break;
        case 4: fn = "nt_clamp_inplace", rc = nt_clamp_inplace(d, v, val(r)); break;
        default: fn = "nt_relu_inplace", rc = nt_relu_inplace(d); break;
        }
        rc_check(fn, rc, false);
        break;
    }
    case 16: { /* release (the register keeps the stale pointer) */
        int i = out;
        int rc = nt_release(reg[i]);
        if (live[i] && rc != 0)
            die("nt_release", "releasing a live handle failed");
        if (!live[i] && reg[i] && rc != NT_ERELEASED)
            die("nt_release", "releasing a released handle was not NT_ERELEASED");
        live[i] = false;
        break;
    }
    case 17: { /* sync points */
        nt_tensor *t = tin(r);
        if (numel(t) > BIG)
            break;
        static uint8_t buf[4 * BIG];
        size_t nb = usable(t) ? (size_t)numel(t) * nt_dtype_size(nt_dtype_of(t)) : 16;
        if (u8(r) & 1 && nb)
            nb--; /* one byte short */
        double d;
        switch (u8(r) % 3) {
        case 0: rc_check("nt_to_host", nt_to_host(t, buf, nb), true); break;
        case 1: rc_check("nt_item", nt_item(t, &d), true); break;
        default: {
            char *s = nt_format(t);
            if (!s)
                check_error("nt_format", true);
            free(s);
        }
        }
        break;
    }
    case 18: {
        nt_clear_error();
        int rc = nt_sync();
        if (rc > 0)
            die("nt_sync", "positive code");
        break;
    }
    case 19: { /* nn */
        nt_tensor *a = tin(r), *b = tin(r), *c = tin(r);
        if (numel(a) > BIG || numel(b) > BIG || numel(c) > BIG)
            break;
        double eps = val(r);
        switch (u8(r) % 7) {
        case 0: result("nt_layer_norm", nt_layer_norm(a, b, c, eps), out); break;
        case 1: result("nt_rms_norm", nt_rms_norm(a, b, eps), out); break;
        case 2: result("nt_cross_entropy", nt_cross_entropy(a, b), out); break;
        case 3: result("nt_embedding", nt_embedding(a, b), out); break;
        case 4: result("nt_mse_loss", nt_mse_loss(a, b), out); break;
        case 5: {
            double e = bcast_numel(a, b), e2 = bcast_numel(b, c);
            if ((e > BIG && e <= 2.9e14) || (e2 > BIG && e2 <= 2.9e14))
                break;
            result("nt_where", nt_where(a, b, c), out);
            break;
        }
        default: result("nt_ones_like", nt_ones_like(a), out); break;
        }
        break;
    }
    case 20: { /* autograd */
        nt_tensor *t = tin(r);
        if (numel(t) > BIG)
            break;
        switch (u8(r) % 4) {
        case 0: rc_check("nt_set_requires_grad", nt_set_requires_grad(t, u8(r) & 1), false); break;
        case 1: {
            nt_tensor *l = nt_sum(t, NT_DIM_ALL, false);
            if (!l) {
                check_error("nt_sum", false);
                break;
            }
            int rc = nt_backward(l);
            rc_check("nt_backward", rc, false);
            nt_release(l);
            break;
        }
        case 2: {
            nt_tensor *g = nt_grad(t);
            if (g)
                result("nt_grad", g, out);
            else if (nt_last_error())
                check_error("nt_grad", false);
            break;
        }
        default: rc_check("nt_zero_grad", nt_zero_grad(t), false); break;
        }
        break;
    }
    case 21: { /* configuration, valid and not */
        static const char *const K[] = {"NT_MODE", "NT_BACKEND", "NT_FUSION", "NT_MIN_SIM_FLOPS",
                                        "NT_SR_SEED", "NT_STOCHASTIC_ROUNDING"};
        static const char *const V[] = {"eager", "lazy", "adaptive", "sim", "cpu", "0", "1",
                                        "-1", "17179869185G", "x", "", "deterministic"};
        int k = u8(r) % N_(K), v = u8(r) % N_(V);
        rc_check("nt_config_set", nt_config_set(K[k], V[v]), false);
        break;
    }
    case 22: { /* metadata on anything */
        nt_tensor *t = tin(r);
        int i = idim(r);
        (void)nt_ndim(t), (void)nt_shape(t, i), (void)nt_stride(t, i), (void)nt_numel(t);
        (void)nt_dtype_of(t), (void)nt_is_contiguous(t), (void)nt_requires_grad(t);
        break;
    }
    case 23: { /* retain + release, or keep */
        nt_tensor *t = tin(r);
        nt_tensor *k = nt_retain(t);
        if (k)
            nt_release(k);
        else
            check_error("nt_retain", false);
        break;
    }
    }
}

static bool inited;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!inited) {
        setenv("NT_LOG", "error", 0);
        setenv("NT_HBM_BYTES", "64M", 0); /* big allocations fail fast */
        /* stale registers stay detectable for a whole input, whatever the
         * ops release internally meanwhile */
        setenv("NT_HANDLE_QUARANTINE", "65536", 0);
        if (nt_init() != 0)
            die("nt_init", "failed");
        inited = true;
    }
    rd_t r = {data, size};
    for (int i = 0; i < MAXOPS && r.n; i++)
        step(&r);
    if (getenv("NT_FUZZ_VERBOSE"))
        fprintf(stderr, "%zu bytes: %ld tensors made, %ld refused so far\n", size, n_ok, n_err);
    for (int i = 0; i < NREG; i++) {
        if (live[i])
            nt_release(reg[i]);
        reg[i] = NULL;
        live[i] = false;
    }
    nt_clear_error();
    nt_sync();
    nt_clear_error();
    /* back to the defaults for the next input */
    nt_config_set("NT_MODE", "adaptive");
    nt_config_set("NT_BACKEND", "sim");
    nt_config_set("NT_FUSION", "1");
    nt_config_set("NT_MIN_SIM_FLOPS", "0");
    nt_config_set("NT_SR_SEED", "0");
    nt_config_set("NT_STOCHASTIC_ROUNDING", "0");
    nt_clear_error();
    return 0;
}
