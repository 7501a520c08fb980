/* dispatcher/api_rand.c - random tensors drawn from a generator: uniform(a,
 * b), normal(mean, std), randint, randperm and the Xavier and Kaiming
 * initialisers (torch.nn.init).
 *
 * Each takes one draw of its generator (NULL: the thread's default, at
 * (NT_SEED, 0) after nt_init) as the seed of core/rng.h's counter-based
 * streams and advances the generator by one, so two calls give different
 * tensors and a run from the same state gives the same ones.  The floating
 * ones are short compositions of existing ops, in f32, rounded once to the
 * dtype at the end (docs/ops.md gives the exact steps): nt_rand or nt_randn
 * of f32, times a scale, plus an offset.  randint and randperm are integer
 * draws made on the host from the same hash (exact: no float in them) and
 * copied to the device; a capture refuses them (a replay could not draw
 * again), as it says. */
#include <math.h>
#include <stdlib.h>

#include "core/rng.h"
#include "dispatcher/dispatch.h"

/* f32 draws of `op` (RAND or RANDN) from g, then * scale + shift, rounded
 * to dt: the composition every floating creation op here is (f64: the
 * draws, the scale and the shift in double). */
static nt_tensor *scaled(const nt_site *site, const char *fn, int op, nt_dtype dt, int ndim,
                         const int64_t *shape, double scale, double shift, nt_generator *g)
{
    if (!nt__dtype_is_float(dt)) {
        nt__err(site, NT_EDTYPE, fn, "argument 'dt' is %s; expected f32, bf16 or f16",
                nt_dtype_name(dt));
        return NULL;
    }
    uint64_t seed;
    if (!(g = nt__gen_take(site, fn, g, op, &seed)))
        return NULL;
    nt_scope *sc = nt_scope_begin();
    if (!sc) {
        nt__gen_done(g, false);
        nt__err_hostmem(site, fn, "a scope");
        return NULL;
    }
    nt_dtype cd = dt == NT_F64 ? NT_F64 : NT_F32; /* f64: 53-bit draws, double arithmetic */
    nt_tensor *y = op == NT_OP_RAND ? nt_rand_at(site, cd, ndim, shape, seed)
                                    : nt_randn_at(site, cd, ndim, shape, seed);
    nt__gen_done(g, y != NULL);
    if (y && scale != 1.0)
        y = nt_mul_scalar_at(site, y, scale);
    if (y && shift != 0.0)
        y = nt_add_scalar_at(site, y, shift);
    if (y && dt != cd)
        y = nt_cast_at(site, y, dt);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(sc);
    return y ? nt__scope_adopt(y, fn) : NULL;
}

static bool finite_arg(const nt_site *site, const char *fn, const char *name, double v)
{
    if (isfinite(v) && fabs(v) <= 3.4028234663852886e38)
        return true;
    nt__err(site, NT_EINVAL, fn, "argument '%s' is %g; expected a finite f32 value", name, v);
    return false;
}

NT_API nt_tensor *nt_uniform_at(const nt_site *site, nt_dtype dt, int ndim,
                                const int64_t *shape, double a, double b, nt_generator *g)
{
    const char *fn = "nt_uniform";
    if (!nt__ensure_init() || !finite_arg(site, fn, "a", a) || !finite_arg(site, fn, "b", b))
        return NULL;
    if (!(a <= b) || !finite_arg(site, fn, "b - a", b - a)) {
        if (!(a <= b))
            nt__err(site, NT_EINVAL, fn, "arguments a = %g, b = %g; expected a <= b", a, b);
        return NULL;
    }
    return scaled(site, fn, NT_OP_RAND, dt, ndim, shape, b - a, a, g);
}

NT_API nt_tensor *nt_normal_at(const nt_site *site, nt_dtype dt, int ndim, const int64_t *shape,
                               double mean, double std, nt_generator *g)
{
    const char *fn = "nt_normal";
    if (!nt__ensure_init() || !finite_arg(site, fn, "mean", mean) ||
        !finite_arg(site, fn, "std", std))
        return NULL;
    if (std < 0) {
        nt__err(site, NT_EINVAL, fn, "argument 'std' is %g; expected std >= 0", std);
        return NULL;
    }
    return scaled(site, fn, NT_OP_RANDN, dt, ndim, shape, std, mean, g);
}

/* A host buffer of draws, copied to an i32 tensor (the caller's scope). */
static nt_tensor *upload_i32(const nt_site *site, const char *fn, int32_t *v, int ndim,
                             const int64_t *shape)
{
    nt_tensor *t = nt_from_host_at(site, v, NT_I32, ndim, shape);
    free(v);
    if (!t)
        nt__err_within(fn);
    return t;
}

NT_API nt_tensor *nt_randint_at(const nt_site *site, int64_t low, int64_t high, int ndim,
                                const int64_t *shape, nt_generator *g)
{
    const char *fn = "nt_randint";
    if (!nt__ensure_init() || !nt__check_shape(site, fn, ndim, shape))
        return NULL;
    int64_t n = nt__numel(ndim, shape);
    if (!(low < high) || low < INT32_MIN || high - 1 > INT32_MAX) {
        nt__err(site, NT_EINVAL, fn,
                "arguments low = %lld, high = %lld; expected low < high, both in i32's range "
                "(high - 1 <= 2^31 - 1)",
                (long long)low, (long long)high);
        return NULL;
    }
    uint64_t seed;
    if (!(g = nt__gen_take(site, fn, g, -1, &seed)))
        return NULL;
    int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) {
        nt__gen_done(g, false);
        nt__err_hostmem(site, fn, "the draws");
        return NULL;
    }
    /* element i: low + floor(h(seed, i) * (high - low) / 2^64), the high
     * word of the 128-bit product (its bias below (high - low) / 2^64) */
    uint64_t key = nt__rng_key(seed), range = (uint64_t)(high - low);
    for (int64_t i = 0; i < n; i++) {
        unsigned __int128 m = (unsigned __int128)nt__rng_bits(key, (uint64_t)i) * range;
        v[i] = (int32_t)(low + (int64_t)(uint64_t)(m >> 64));
    }
    nt__gen_done(g, true);
    return upload_i32(site, fn, v, ndim, shape);
}

NT_API nt_tensor *nt_randperm_at(const nt_site *site, int64_t n, nt_generator *g)
{
    const char *fn = "nt_randperm";
    if (!nt__ensure_init())
        return NULL;
    if (n < 0 || n > (int64_t)INT32_MAX + 1) {
        nt__err(site, NT_EINVAL, fn, "argument 'n' is %lld; expected 0 <= n <= 2^31",
                (long long)n);
        return NULL;
    }
    uint64_t seed;
    if (!(g = nt__gen_take(site, fn, g, -1, &seed)))
        return NULL;
    int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) {
        nt__gen_done(g, false);
        nt__err_hostmem(site, fn, "the permutation");
        return NULL;
    }
    /* Fisher-Yates from the top: step i (i = n-1 .. 1) swaps element i with
     * element j = floor(h(seed, i) * (i + 1) / 2^64) */
    uint64_t key = nt__rng_key(seed);
    for (int64_t i = 0; i < n; i++)
        v[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        unsigned __int128 m = (unsigned __int128)nt__rng_bits(key, (uint64_t)i) * (uint64_t)(i + 1);
        int64_t j = (int64_t)(uint64_t)(m >> 64);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
    nt__gen_done(g, true);
    return upload_i32(site, fn, v, 1, (int64_t[]){n});
}

/* ---------------- torch.nn.init ---------------- */

NT_API double nt_calculate_gain(nt_nonlinearity nl, double param)
{
    switch (nl) {
    case NT_GAIN_LINEAR:
    case NT_GAIN_SIGMOID: return 1.0;
    case NT_GAIN_TANH: return 5.0 / 3.0;
    case NT_GAIN_RELU: return sqrt(2.0);
    case NT_GAIN_LEAKY_RELU: return sqrt(2.0 / (1.0 + param * param));
    case NT_GAIN_SELU: return 3.0 / 4.0;
    }
    nt__err(NULL, NT_EINVAL, "nt_calculate_gain",
            "argument 'nl' is %d; expected an nt_nonlinearity", (int)nl);
    return NAN;
}

/* fan_in = shape[1] * receptive field, fan_out = shape[0] * receptive
 * field (torch.nn.init._calculate_fan_in_and_fan_out); 2 dims at least. */
static bool fans(const nt_site *site, const char *fn, int ndim, const int64_t *shape,
                 double *fan_in, double *fan_out)
{
    if (ndim < 2 || !shape || ndim > NT_MAX_DIMS) {
        nt__err(site, NT_ESHAPE, fn,
                "argument 'ndim' is %d; fan in and fan out need 2 to %d dims ([out, in, ...])",
                ndim, NT_MAX_DIMS);
        return false;
    }
    double rf = 1;
    for (int i = 2; i < ndim; i++)
        rf *= (double)shape[i];
    *fan_in = (double)shape[1] * rf;
    *fan_out = (double)shape[0] * rf;
    if (*fan_in <= 0 || *fan_out <= 0) {
        nt__err(site, NT_ESHAPE, fn, "the shape has an empty dim: fan in %g, fan out %g; "
                "expected both >= 1", *fan_in, *fan_out);
        return false;
    }
    return true;
}

static bool gain_ok(const nt_site *site, const char *fn, double gain)
{
    if (isfinite(gain) && gain >= 0)
        return true;
    nt__err(site, NT_EINVAL, fn, "argument 'gain' is %g; expected a finite gain >= 0", gain);
    return false;
}

NT_API nt_tensor *nt_xavier_uniform_at(const nt_site *site, nt_dtype dt, int ndim,
                                       const int64_t *shape, double gain, nt_generator *g)
{
    const char *fn = "nt_xavier_uniform";
    double fi, fo;
    if (!nt__ensure_init() || !gain_ok(site, fn, gain) || !fans(site, fn, ndim, shape, &fi, &fo))
        return NULL;
    double a = gain * sqrt(6.0 / (fi + fo));
    return scaled(site, fn, NT_OP_RAND, dt, ndim, shape, 2 * a, -a, g);
}

NT_API nt_tensor *nt_xavier_normal_at(const nt_site *site, nt_dtype dt, int ndim,
                                      const int64_t *shape, double gain, nt_generator *g)
{
    const char *fn = "nt_xavier_normal";
    double fi, fo;
    if (!nt__ensure_init() || !gain_ok(site, fn, gain) || !fans(site, fn, ndim, shape, &fi, &fo))
        return NULL;
    return scaled(site, fn, NT_OP_RANDN, dt, ndim, shape, gain * sqrt(2.0 / (fi + fo)), 0, g);
}

/* gain / sqrt(fan) of torch.nn.init.kaiming_*_ */
static bool kaiming_std(const nt_site *site, const char *fn, int ndim, const int64_t *shape,
                        double a, nt_fan_mode mode, nt_nonlinearity nl, double *std)
{
    double fi, fo;
    if (mode != NT_FAN_IN && mode != NT_FAN_OUT) {
        nt__err(site, NT_EINVAL, fn, "argument 'mode' is %d; expected NT_FAN_IN or NT_FAN_OUT",
                (int)mode);
        return false;
    }
    if (!isfinite(a)) {
        nt__err(site, NT_EINVAL, fn, "argument 'a' is %g; expected a finite slope", a);
        return false;
    }
    if (!fans(site, fn, ndim, shape, &fi, &fo))
        return false;
    double gain = nt_calculate_gain(nl, a);
    if (isnan(gain)) {
        nt__err(site, NT_EINVAL, fn, "argument 'nl' is %d; expected an nt_nonlinearity",
                (int)nl);
        return false;
    }
    *std = gain / sqrt(mode == NT_FAN_IN ? fi : fo);
    return true;
}

NT_API nt_tensor *nt_kaiming_uniform_at(const nt_site *site, nt_dtype dt, int ndim,
                                        const int64_t *shape, double a, nt_fan_mode mode,
                                        nt_nonlinearity nl, nt_generator *g)
{
    const char *fn = "nt_kaiming_uniform";
    double std;
    if (!nt__ensure_init() || !kaiming_std(site, fn, ndim, shape, a, mode, nl, &std))
        return NULL;
    double bound = sqrt(3.0) * std;
    return scaled(site, fn, NT_OP_RAND, dt, ndim, shape, 2 * bound, -bound, g);
}

NT_API nt_tensor *nt_kaiming_normal_at(const nt_site *site, nt_dtype dt, int ndim,
                                       const int64_t *shape, double a, nt_fan_mode mode,
                                       nt_nonlinearity nl, nt_generator *g)
{
    const char *fn = "nt_kaiming_normal";
    double std;
    if (!nt__ensure_init() || !kaiming_std(site, fn, ndim, shape, a, mode, nl, &std))
        return NULL;
    return scaled(site, fn, NT_OP_RANDN, dt, ndim, shape, std, 0, g);
}

/* the plain entry points: the caller's return address as the site */
NT_API nt_tensor *nt_uniform(nt_dtype dt, int ndim, const int64_t *shape, double a, double b,
                             nt_generator *g)
{
    return nt_uniform_at(NT_RA_SITE, dt, ndim, shape, a, b, g);
}
NT_API nt_tensor *nt_normal(nt_dtype dt, int ndim, const int64_t *shape, double mean,
                            double std, nt_generator *g)
{
    return nt_normal_at(NT_RA_SITE, dt, ndim, shape, mean, std, g);
}
NT_API nt_tensor *nt_randint(int64_t low, int64_t high, int ndim, const int64_t *shape,
                             nt_generator *g)
{
    return nt_randint_at(NT_RA_SITE, low, high, ndim, shape, g);
}
NT_API nt_tensor *nt_randperm(int64_t n, nt_generator *g)
{
    return nt_randperm_at(NT_RA_SITE, n, g);
}
NT_API nt_tensor *nt_xavier_uniform(nt_dtype dt, int ndim, const int64_t *shape, double gain,
                                    nt_generator *g)
{
    return nt_xavier_uniform_at(NT_RA_SITE, dt, ndim, shape, gain, g);
}
NT_API nt_tensor *nt_xavier_normal(nt_dtype dt, int ndim, const int64_t *shape, double gain,
                                   nt_generator *g)
{
    return nt_xavier_normal_at(NT_RA_SITE, dt, ndim, shape, gain, g);
}
NT_API nt_tensor *nt_kaiming_uniform(nt_dtype dt, int ndim, const int64_t *shape, double a,
                                     nt_fan_mode mode, nt_nonlinearity nl, nt_generator *g)
{
    return nt_kaiming_uniform_at(NT_RA_SITE, dt, ndim, shape, a, mode, nl, g);
}
NT_API nt_tensor *nt_kaiming_normal(nt_dtype dt, int ndim, const int64_t *shape, double a,
                                    nt_fan_mode mode, nt_nonlinearity nl, nt_generator *g)
{
    return nt_kaiming_normal_at(NT_RA_SITE, dt, ndim, shape, a, mode, nl, g);
}
