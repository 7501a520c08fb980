/* amp/fp8.c - fp8 autocast: scaling recipes and the fp8 matmul node.
 *
 * A recipe (nt_fp8_recipe) keeps, per device, one block of f32 device
 * tensors: scale [CAP], amax history [CAP, H], the step's amax [CAP] and
 * the format's max [CAP], where CAP = 3 x the most slots a device may have.
 * The k-th fp8 matmul a region issues on a device is slot k: rows 3k (its
 * a), 3k + 1 (its b), 3k + 2 (its output gradient).  The block is made at
 * the first fp8 matmul on the device, outside any capture
 * (nt__first_use_begin: a replay never refills it), and everything that
 * reads or writes it afterwards is a queued device op, so a captured step
 * replays the scales exactly as the step run op by op.
 *
 * Each slot is a registered user op (autograd/custom.c) whose ctx is the
 * slot: its forward takes the amax of a and b (delayed scaling: kept in the
 * device's list of records, one f32 [1] tensor each), scales and rounds
 * them to e4m3, runs the fp8 matmul; its backward records the gradient's
 * amax, rounds it to e5m2 (hybrid) and runs the two gradient matmuls on the
 * operands rounded again (the scales do not change between a forward and
 * its backward: they change only in nt_fp8_recipe_update, after the step).
 * The state is not an input of the node, so its in-place updates never
 * trip autograd's saved-tensor version checks.
 *
 * The update works on every row of a device at once, a dozen small ops
 * whatever the number of slots: collect (the records sorted by row, one
 * cat, one max per row over the shards that used it: the step's amax),
 * push (a cat of the step's amax and the history's first H-1 columns,
 * copied into the history), max over the window, fp8max / amax, times
 * 2^-margin, two compares and wheres that keep the old scale where the new
 * one is not positive finite, 1 / scale, and a fill of the step's amax.
 *
 * Checkpoints (io/checkpoint.c, record kind 7) read every device's block
 * (nt__fp8_state_get: the devices must agree) and write it back
 * (nt__fp8_state_set); the loaded state is kept as the recipe's preset, so
 * a device that makes its block later starts from it too. */
#include "amp/amp.h"

#include "autograd/autograd.h"
#include "core/handle.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define FP8_MAGIC 0x46503852u /* "FP8R" */
#define FP8_MAX_SLOTS 256
#define FP8_CAP (3 * FP8_MAX_SLOTS)
#define FP8_MAX_DEVS 64
#define FP8_MAX_HISTORY 4096

/* The formats' largest finite values (OCP FP8: e4m3 has no infinities). */
#define E4M3_MAX 448.0
#define E5M2_MAX 57344.0

/* The dtypes of the forward operands and of the gradients. */
#define FP8_FWD_DT NT_E4M3
#define FP8_BWD_DT NT_E5M2

typedef struct fp8_dev fp8_dev;

/* What a training forward of a slot (delayed scaling) keeps for its
 * backward: a and b rounded to the gradient's format with the forward's
 * scales (made by the forward's own rounding passes, so the backward reads
 * neither a nor b again) and the products of scale reciprocals the two
 * gradient matmuls take.  Found by the forward's output storage; used only
 * while the scales are the forward's (epoch) and by the same capture, else
 * the backward rounds a and b again as before: the same values either way. */
#define FP8_SAVED 8
typedef struct fp8_saved {
    const void *key;     /* the output's storage; NULL: free */
    unsigned epoch;      /* the device's scale epoch at the forward */
    nt_tensor *qa, *qb;  /* held */
    nt_tensor *pda, *pdb; /* f32 [1] views, held: ig * ib, ia * ig */
} fp8_saved;

typedef struct fp8_slot {
    nt_fp8_recipe *r;
    fp8_dev *d;
    int k;  /* slot index */
    int op; /* its registered user op */
    fp8_saved saved[FP8_SAVED]; /* under the recipe's lock */
    unsigned nsaved;            /* entries put so far (the next one: nsaved % FP8_SAVED) */
} fp8_slot;

struct fp8_dev {
    int dev;
    nt_tensor *scale, *hist, *pending, *fmax; /* f32 [CAP], [CAP, H], [CAP], [CAP] */
    nt_tensor *inv;                            /* f32 [CAP]: 1 / scale */
    /* the amaxes recorded since the last collect: rec[j] (f32 [1], held)
     * of row rec_row[j], in record order; folded: pending already holds
     * the max of earlier ones (a long step folded them in) */
    nt_tensor **rec;
    int *rec_row;
    int nrec, caprec;
    bool folded;
    nt_tensor *zero, *inf, *one;               /* f32 [1] constants */
    nt_tensor *max_e4m3, *max_e5m2;            /* f32 [1] */
    /* delayed scaling: the scales' epoch (bumped by every update) and the
     * products of their reciprocals each slot's matmuls take, f32 [S, 1]
     * each (prod[0][k] = ia ib, prod[1][k] = ig ib, prod[2][k] = ia ig),
     * made once per region (prod_region) from the scales of prod_epoch */
    unsigned epoch, prod_epoch, prod_region;
    nt_tensor *prod[3];
    int nslots;
    fp8_slot *slots[FP8_MAX_SLOTS];
};

struct nt_fp8_recipe {
    NT__HOBJ_HEAD; /* core/handle.h */
    GMutex lock;   /* devs, their slots (made on first use) */
    nt_fp8_recipe_opts o;
    unsigned id;
    fp8_dev *devs[FP8_MAX_DEVS];
    nt__fp8_state preset; /* a checkpoint's state (data NULL: none), for new blocks */
};

static volatile AO_t next_id, next_region;
/* The fp8 region this thread opened last (nt_fp8_autocast_begin): the
 * scale products are made once per region and device. */
static _Thread_local unsigned tls_region;
/* Set by the matmul hook: the node will be recorded (grad mode on and an
 * input requires grad), so the forward keeps what its backward needs. */
static _Thread_local bool tls_save;
/* Set by the matmul hook for the node's forward: record amaxes (grad mode
 * was on at the call: a training forward; an eval forward only reads). */
static _Thread_local bool tls_record;

bool nt__fp8_recipe_ok(nt_fp8_recipe *r, const char *fn)
{
    if (!nt__ensure_init())
        return false;
    return nt__hobj_check(r, FP8_MAGIC, NULL, fn, "r", "nt_fp8_recipe") == 0;
}

NT_API nt_fp8_recipe *nt_fp8_recipe_create(const nt_fp8_recipe_opts *opts)
{
    const char *fn = "nt_fp8_recipe_create";
    if (!nt__ensure_init())
        return NULL;
    nt_fp8_recipe_opts o = {NT_FP8_DELAYED, NT_FP8_HYBRID, 16, 0};
    if (opts)
        o = *opts;
    if ((unsigned)o.scaling > NT_FP8_CURRENT) {
        nt__err(NULL, NT_EINVAL, fn, "opts->scaling is %d; expected NT_FP8_DELAYED or "
                "NT_FP8_CURRENT", (int)o.scaling);
        return NULL;
    }
    if ((unsigned)o.format > NT_FP8_E4M3_ALL) {
        nt__err(NULL, NT_EINVAL, fn, "opts->format is %d; expected NT_FP8_HYBRID or "
                "NT_FP8_E4M3_ALL", (int)o.format);
        return NULL;
    }
    if (o.amax_history_len < 1 || o.amax_history_len > FP8_MAX_HISTORY) {
        nt__err(NULL, NT_EINVAL, fn, "opts->amax_history_len is %d; expected 1..%d (the "
                "window of amaxes a delayed scale is taken from)", o.amax_history_len,
                FP8_MAX_HISTORY);
        return NULL;
    }
    if (o.margin < 0 || o.margin > 32) {
        nt__err(NULL, NT_EINVAL, fn, "opts->margin is %d; expected 0..32 (scale = fp8 max / "
                "amax / 2^margin)", o.margin);
        return NULL;
    }
    nt_fp8_recipe *r = nt__hobj_new(sizeof *r, FP8_MAGIC);
    if (!r) {
        nt__err_hostmem(NULL, fn, "the recipe");
        return NULL;
    }
    g_mutex_init(&r->lock);
    r->o = o;
    r->id = (unsigned)AO_fetch_and_add1(&next_id);
    memset(r->devs, 0, sizeof r->devs);
    return r;
}

static void saved_clear(fp8_saved *e, bool live)
{
    nt_tensor *ts[] = {e->qa, e->qb, e->pda, e->pdb};
    for (size_t i = 0; live && i < sizeof ts / sizeof *ts; i++)
        if (ts[i])
            nt_release(ts[i]);
    memset(e, 0, sizeof *e);
}

static void dev_free(fp8_dev *d, bool live)
{
    for (int j = 0; live && j < d->nrec; j++)
        nt_release(d->rec[j]);
    for (int i = 0; live && i < 3; i++)
        if (d->prod[i])
            nt_release(d->prod[i]);
    for (int k = 0; k < d->nslots; k++)
        for (int j = 0; j < FP8_SAVED; j++)
            saved_clear(&d->slots[k]->saved[j], live);
    g_free(d->rec);
    g_free(d->rec_row);
    nt_tensor *ts[] = {d->scale, d->inv, d->hist, d->pending, d->fmax, d->zero,
                       d->inf, d->one, d->max_e4m3, d->max_e5m2};
    for (size_t i = 0; live && i < sizeof ts / sizeof *ts; i++)
        if (ts[i])
            nt_release(ts[i]);
    for (int k = 0; k < d->nslots; k++)
        g_free(d->slots[k]);
    g_free(d);
}

NT_API void nt_fp8_recipe_destroy(nt_fp8_recipe *r)
{
    if (!r)
        return;
    if (!nt__hobj_live(r, FP8_MAGIC)) {
        nt__hobj_check(r, FP8_MAGIC, NULL, "nt_fp8_recipe_destroy", "r", "nt_fp8_recipe");
        return;
    }
    bool live = nt__hobj_current(r); /* else the tensors went with nt_shutdown */
    for (int i = 0; i < FP8_MAX_DEVS; i++)
        if (r->devs[i])
            dev_free(r->devs[i], live);
    g_free(r->preset.data);
    g_mutex_clear(&r->lock);
    nt__hobj_free(r);
}

NT_API int nt_fp8_autocast_begin(nt_fp8_recipe *r)
{
    if (!nt__fp8_recipe_ok(r, "nt_fp8_autocast_begin"))
        return nt_last_error();
    tls_region = (unsigned)AO_fetch_and_add1(&next_region) + 1;
    return nt__amp_push_fp8(r);
}

NT_API nt_fp8_recipe *nt_fp8_autocast_recipe(void) { return nt__amp_fp8_top(); }

/* A new f32 [n] (or [n, h]) tensor on the current device, out of any scope. */
static nt_tensor *persistent(int64_t n, int64_t h, double v)
{
    int64_t shape[2] = {n, h};
    nt_tensor *t = nt_full(NT_F32, h ? 2 : 1, shape, v);
    if (t)
        nt_keep(t);
    return t;
}

/* The format's max of each row: e4m3 for a and b, the gradient's format
 * for the third row of each slot. */
static nt_tensor *fmax_rows(nt_fp8_format f)
{
    static float v[FP8_CAP];
    static GMutex lock;
    g_mutex_lock(&lock);
    for (int i = 0; i < FP8_CAP; i++)
        v[i] = (float)(i % 3 == 2 && f == NT_FP8_HYBRID ? E5M2_MAX : E4M3_MAX);
    nt_tensor *t = nt_from_host(v, NT_F32, 1, (int64_t[]){FP8_CAP});
    g_mutex_unlock(&lock);
    if (t)
        nt_keep(t);
    return t;
}

static int dev_write(nt_fp8_recipe *r, fp8_dev *d, const nt__fp8_state *st);

/* The device block, made outside any capture (state made on first use). */
static fp8_dev *dev_make(nt_fp8_recipe *r, int dev)
{
    fp8_dev *d = g_try_new0(fp8_dev, 1);
    if (!d)
        return NULL;
    d->dev = dev;
    nt__first_use_begin();
    nt_scope *sc = nt_scope_begin();
    d->scale = persistent(FP8_CAP, 0, 1.0);
    d->hist = persistent(FP8_CAP, r->o.amax_history_len, 0.0);
    d->pending = persistent(FP8_CAP, 0, 0.0);
    d->inv = persistent(FP8_CAP, 0, 1.0);
    d->fmax = fmax_rows(r->o.format);
    d->zero = persistent(1, 0, 0.0);
    d->inf = persistent(1, 0, INFINITY);
    d->one = persistent(1, 0, 1.0);
    d->max_e4m3 = persistent(1, 0, E4M3_MAX);
    d->max_e5m2 = persistent(1, 0, E5M2_MAX);
    nt_scope_end(sc);
    bool ok = d->scale && d->inv && d->hist && d->pending && d->fmax && d->zero && d->inf &&
              d->one && d->max_e4m3 && d->max_e5m2;
    /* a loaded checkpoint's state seeds the block (it is still ours alone) */
    if (ok && r->preset.data && dev_write(r, d, &r->preset))
        ok = false;
    nt__first_use_end();
    if (!ok) {
        dev_free(d, true);
        return NULL;
    }
    return d;
}

static nt_tensor *slot_forward(nt_tensor *const *in, void *ctx);
static int slot_backward(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out,
                         nt_tensor **gin, void *ctx);

/* Slot k of r on device dev, made (with its device block and user op) on
 * first use; NULL with the error set. */
static fp8_slot *slot_get(nt_fp8_recipe *r, int dev, int k)
{
    const char *fn = "nt_matmul";
    if (k >= FP8_MAX_SLOTS) {
        nt__err(NULL, NT_ESTATE, fn, "this fp8 autocast region issued %d fp8 matmuls on device "
                "%d; a region may issue at most %d", k + 1, dev, FP8_MAX_SLOTS);
        return NULL;
    }
    g_mutex_lock(&r->lock);
    fp8_dev *d = r->devs[dev];
    if (!d && !(d = r->devs[dev] = dev_make(r, dev))) {
        g_mutex_unlock(&r->lock);
        if (!nt_last_error())
            nt__err_hostmem(NULL, fn, "the fp8 recipe's state");
        return NULL;
    }
    fp8_slot *s = NULL;
    if (k < d->nslots) {
        s = d->slots[k];
    } else if (k == d->nslots && (s = g_try_new0(fp8_slot, 1)) != NULL) {
        char name[96];
        snprintf(name, sizeof name, "nt_fp8_matmul/r%u/d%d/s%d", r->id, dev, k);
        *s = (fp8_slot){r, d, k, -1};
        nt_op_def def = {name, 2, slot_forward, slot_backward, s};
        s->op = nt_op_register(&def);
        if (s->op < 0) {
            g_free(s);
            s = NULL;
        } else {
            d->slots[d->nslots++] = s;
        }
    }
    g_mutex_unlock(&r->lock);
    if (!s && !nt_last_error())
        nt__err(NULL, NT_ESTATE, fn, "fp8 slot %d of device %d skipped one (a region's "
                "matmuls are numbered in order)", k, dev);
    return s;
}

nt_tensor *nt__amp_fp8_matmul(const nt_site *site, nt_tensor *a, nt_tensor *b, bool *handled)
{
    int *next;
    nt_fp8_recipe *r = nt__amp_fp8_region(&next);
    if (!r)
        return NULL;
    if (!nt__check_arg(site, "nt_matmul", "a", a) || !nt__check_arg(site, "nt_matmul", "b", b)) {
        *handled = true;
        return NULL;
    }
    nt_dtype da = (nt_dtype)a->dtype, db = (nt_dtype)b->dtype;
    /* fp8 for x @ W: a floating a of >= 2 dims, a floating 2-D b; anything
     * else (batched products, f64) takes the bf16 policy */
    if (!nt__dtype_is_float(da) || !nt__dtype_is_float(db) || da == NT_F64 || db == NT_F64 ||
        b->ndim != 2 || a->ndim < 2 || a->shape[a->ndim - 1] != b->shape[0] ||
        nt_numel(a) == 0 || nt_numel(b) == 0)
        return NULL;
    *handled = true;
    fp8_slot *s = slot_get(r, nt_device_current(), (*next)++);
    if (!s)
        return NULL;
    tls_record = nt_grad_enabled();
    tls_save = tls_record && (nt_requires_grad(a) || nt_requires_grad(b));
    nt_tensor *in[2] = {a, b};
    return nt_op_call(s->op, in);
}

/* ---------------- the node's arithmetic ---------------- */

/* scale = (fmax / amax) * 2^-margin where positive finite, else `keep`
 * (amax [1] f32 or [n]). */
static nt_tensor *scale_from(nt_tensor *fm, nt_tensor *amax, int margin, nt_tensor *keep,
                             fp8_dev *d)
{
    nt_tensor *sf = nt_div(fm, amax);
    if (margin)
        sf = nt_mul_scalar(sf, ldexp(1.0, -margin));
    return nt_where(nt_gt(sf, d->zero), nt_where(nt_lt(sf, d->inf), sf, keep), keep);
}

/* amax |x| as f32 [1]: the infinity norm, one reduction (NaN propagates). */
static nt_tensor *amax1(nt_tensor *x)
{
    nt_tensor *m = nt_norm(x, INFINITY, NT_DIM_ALL, false);
    if (m && m->dtype != NT_F32)
        m = nt_cast(m, NT_F32);
    return nt_reshape(m, 1, (int64_t[]){1});
}

static int dev_collect(fp8_dev *d);

/* Keeps amax t (f32 [1]) of row `row` for the next collect (a new reference
 * taken); folds the records into the step's amax when they grow long (a
 * program that never calls nt_fp8_recipe_update). */
static int rec_add(fp8_slot *s, int row, nt_tensor *t)
{
    fp8_dev *d = s->d;
    if (!t)
        return nt_last_error();
    int rc = 0;
    g_mutex_lock(&s->r->lock);
    if (d->nrec >= 4096)
        rc = dev_collect(d);
    if (!rc && d->nrec == d->caprec) {
        int cap = d->caprec ? 2 * d->caprec : 64;
        nt_tensor **nr = g_try_renew(nt_tensor *, d->rec, (size_t)cap);
        if (nr)
            d->rec = nr;
        int *nrow = nr ? g_try_renew(int, d->rec_row, (size_t)cap) : NULL;
        if (nrow) {
            d->rec_row = nrow;
            d->caprec = cap;
        } else {
            rc = nt__err_hostmem(NULL, "nt_matmul", "the fp8 amax records");
        }
    }
    if (!rc) {
        d->rec[d->nrec] = nt_retain(t);
        d->rec_row[d->nrec++] = row;
    }
    g_mutex_unlock(&s->r->lock);
    return rc;
}

/* The scale of x for row i (0: a, 1: b, 2: the gradient) of slot s and its
 * reciprocal, as f32 [1] tensors: current scaling computes them from x;
 * delayed scaling reads the recipe's and, with `record`, keeps x's amax
 * for the step's amax of the row.  0 or an error. */
static int slot_scale(fp8_slot *s, int i, nt_tensor *x, bool record, nt_tensor **scale,
                      nt_tensor **inv)
{
    fp8_dev *d = s->d;
    int row = 3 * s->k + i;
    bool e5 = i == 2 && s->r->o.format == NT_FP8_HYBRID;
    if (s->r->o.scaling == NT_FP8_CURRENT) {
        *scale = scale_from(e5 ? d->max_e5m2 : d->max_e4m3, amax1(x), s->r->o.margin, d->one, d);
        *inv = nt_reciprocal(*scale);
    } else {
        int rc = record ? rec_add(s, row, amax1(x)) : 0;
        if (rc)
            return rc;
        *scale = nt_narrow(d->scale, 0, row, 1);
        *inv = nt_narrow(d->inv, 0, row, 1);
    }
    return *scale && *inv ? 0 : nt_last_error();
}

/* x * scale in f32, saturated to +-fmax of dt (Inf to the max, NaN stays
 * NaN), rounded to dt (nearest even). */
static nt_tensor *clamp_cast(nt_tensor *t, nt_dtype dt)
{
    double fm = dt == NT_E5M2 ? E5M2_MAX : E4M3_MAX;
    return nt_cast(nt_clamp(t, -fm, fm), dt);
}

static nt_tensor *scaled(nt_tensor *x, nt_tensor *scale)
{
    nt_tensor *t = nt_mul(x, scale);
    if (t && t->dtype != NT_F32)
        t = nt_cast(t, NT_F32);
    return t;
}

static nt_tensor *quant(nt_tensor *x, nt_tensor *scale, nt_dtype dt)
{
    return clamp_cast(scaled(x, scale), dt);
}

/* One rounding pass over x (delayed scaling): q[0] = x rounded to dt[0] as
 * quant() does, in x's own shape (so that a product of it keeps the
 * caller's shape and its consumers join the matmul's epilogue), q[1] (when
 * dt[1] is an fp8 dtype) the same product rounded to dt[1], viewed as
 * [rows, last dim], and with am, *am = max |x| as f32 [1, 1] -- the
 * value amax1 gives (the maximum of exact magnitudes; NaN if any element
 * is NaN).  Queued so that the fused evaluators read x once: the product,
 * the roundings, |x| and its maximum along rows make one kernel (a row
 * program), and a second, small one reduces the row maxima. */
static int quant_pass(nt_tensor *x, nt_tensor *scale, const nt_dtype dt[2], nt_tensor **q,
                      nt_tensor **am)
{
    /* in x's own shape, so that the pass can join the kernel that made x
     * (an elementwise program of that shape); the roundings are fresh
     * tensors, the second viewed as [rows, last dim] */
    int64_t last = x->shape[x->ndim - 1], sh2[2] = {nt_numel(x) / last, last};
    nt_tensor *t = scaled(x, scale);
    q[0] = clamp_cast(t, dt[0]);
    q[1] = t && nt__dtype_is_fp8(dt[1]) ? nt_reshape(clamp_cast(t, dt[1]), 2, sh2) : NULL;
    if (am) {
        nt_tensor *rows = nt_max(nt_abs(x), x->ndim - 1, true);
        nt_tensor *m = rows ? nt_max(nt_reshape(rows, 2, (int64_t[]){1, sh2[0]}), 1, true) : NULL;
        if (m && m->dtype != NT_F32)
            m = nt_cast(m, NT_F32);
        *am = m;
    }
    bool ok = q[0] && (q[1] || !nt__dtype_is_fp8(dt[1])) && (!am || *am);
    return ok ? 0 : (nt__err_or(NT_EEXEC));
}

/* Joins amax am (f32 [1, 1], from quant_pass) to the step's amax of row
 * `row` in place: pending[row] = maximum(pending[row], am), queued right
 * after the reduction that made am so that the fused evaluators run both
 * in its kernel; the records' list (rec_add) and its concatenation at the
 * update are skipped.  The same value: the maximum of the same exact
 * magnitudes (pending starts at +0; NaN propagates). */
static int pend_max(fp8_slot *s, int row, nt_tensor *am)
{
    fp8_dev *d = s->d;
    nt_tensor *pv = nt_reshape(nt_narrow(d->pending, 0, row, 1), 2, (int64_t[]){1, 1});
    if (!pv || nt_copy_into(pv, nt_maximum(pv, am)))
        return nt__err_or(NT_EEXEC);
    g_mutex_lock(&s->r->lock);
    d->folded = true; /* pending holds amaxes of this step: collect joins them */
    g_mutex_unlock(&s->r->lock);
    return 0;
}

/* (qa . qb) / (sa sb) rounded to odt: the fp8 matmul with its dequantizing
 * multipliers ia = 1 / sa, ib = 1 / sb (nt_matmul_fp8: acc * round(ia ib)). */
static nt_tensor *mm(nt_tensor *qa, nt_tensor *qb, nt_tensor *ia, nt_tensor *ib, nt_dtype odt)
{
    nt_dtype mdt = odt == NT_F32 || odt == NT_BF16 ? odt : NT_F32;
    nt_tensor *y = nt_matmul_fp8(qa, qb, ia, ib, mdt);
    return y && mdt != odt ? nt_cast(y, odt) : y;
}

/* The dtype slot s rounds row i to in the forward (i 0, 1) or as the
 * gradient (i 2). */
static nt_dtype row_dtype(const fp8_slot *s, int i)
{
    return i == 2 && s->r->o.format == NT_FP8_HYBRID ? FP8_BWD_DT : FP8_FWD_DT;
}

/* (qa . qb) * p rounded to odt, p = round_f32(ia ib) made already: mm's
 * bits without its scale product. */
static nt_tensor *mmp(nt_tensor *qa, nt_tensor *qb, nt_tensor *p, nt_dtype odt)
{
    nt_dtype mdt = odt == NT_F32 || odt == NT_BF16 ? odt : NT_F32;
    nt_tensor *y = nt__matmul_fp8_prod(NULL, qa, qb, p, mdt);
    return y && mdt != odt ? nt_cast(y, odt) : y;
}

/* The products of scale reciprocals of every slot of d (delayed scaling),
 * f32 [S, 1] each: prod[0] = ia ib (the forward), prod[1] = ig ib (da),
 * prod[2] = ia ig (db), rows 3k, 3k + 1, 3k + 2 of inv being slot k's a, b
 * and gradient.  f32 products commute, so each is the bits mm's
 * scale_a * scale_b gives.  Made at a region's first fp8 matmul on the
 * device (three multiplies of [S, 1] columns: one small kernel), again
 * after an update or when a capture began or ended since (a captured
 * program then makes its own, so a replay reads the scales it should). */
static int dev_prods(fp8_dev *d, GMutex *lock)
{
    g_mutex_lock(lock);
    bool fresh = d->prod[0] && d->prod_region == tls_region && d->prod_epoch == d->epoch &&
                 d->prod[0]->st->cap == nt__tl_cap;
    g_mutex_unlock(lock);
    if (fresh)
        return 0;
    nt_tensor *c[3], *p[3];
    nt_tensor *inv3 = nt_reshape(d->inv, 2, (int64_t[]){FP8_MAX_SLOTS, 3});
    for (int i = 0; i < 3; i++)
        c[i] = nt_narrow(inv3, 1, i, 1);
    p[0] = nt_mul(c[0], c[1]);
    p[1] = nt_mul(c[2], c[1]);
    p[2] = nt_mul(c[0], c[2]);
    if (!p[0] || !p[1] || !p[2])
        return nt__err_or(NT_EEXEC);
    g_mutex_lock(lock);
    for (int i = 0; i < 3; i++) {
        if (d->prod[i])
            nt_release(d->prod[i]);
        d->prod[i] = nt_retain(p[i]);
    }
    d->prod_region = tls_region;
    d->prod_epoch = d->epoch;
    g_mutex_unlock(lock);
    return 0;
}

/* Slot k's product i as f32 [1] (a view of the device's). */
static nt_tensor *slot_prod(fp8_slot *s, int i)
{
    g_mutex_lock(&s->r->lock);
    nt_tensor *p = s->d->prod[i];
    nt_tensor *v = p ? nt_reshape(nt_narrow(p, 0, s->k, 1), 1, (int64_t[]){1}) : NULL;
    g_mutex_unlock(&s->r->lock);
    return v;
}

/* Keeps e for the backward of the node whose output is `key` (the oldest
 * entry of the slot makes room: its backward, if it ever runs, rounds
 * again). */
static void saved_put(fp8_slot *s, const fp8_saved *e)
{
    g_mutex_lock(&s->r->lock);
    fp8_saved *at = NULL;
    for (int j = 0; j < FP8_SAVED && !at; j++)
        if (s->saved[j].key == e->key)
            at = &s->saved[j]; /* a dead output's storage made again */
    if (!at)
        at = &s->saved[s->nsaved++ % FP8_SAVED];
    saved_clear(at, true);
    *at = *e;
    at->epoch = s->d->epoch; /* the scales the forward's roundings used */
    g_mutex_unlock(&s->r->lock);
}

/* Takes the entry of output storage key out of the slot (true), or leaves
 * *e zeroed (false). */
static bool saved_take(fp8_slot *s, const void *key, fp8_saved *e)
{
    memset(e, 0, sizeof *e);
    g_mutex_lock(&s->r->lock);
    for (int j = 0; j < FP8_SAVED && !e->key; j++)
        if (key && s->saved[j].key == key) {
            *e = s->saved[j];
            memset(&s->saved[j], 0, sizeof s->saved[j]);
        }
    g_mutex_unlock(&s->r->lock);
    return e->key != NULL;
}

/* The forward under delayed scaling: one rounding pass per operand that
 * also records its amax (a training forward) and, when the node will be
 * recorded, rounds it to the gradient's format for the backward (hybrid);
 * the matmul takes its scale product made once per region.  The same bits
 * as the unfused sequence (quant, amax1, mm). */
static nt_tensor *fwd_delayed(fp8_slot *s, nt_tensor *a, nt_tensor *b)
{
    fp8_dev *d = s->d;
    if (dev_prods(d, &s->r->lock))
        return NULL;
    nt_dtype gdt = row_dtype(s, 2);
    bool two = tls_save && gdt != FP8_FWD_DT;
    nt_dtype dts[2] = {FP8_FWD_DT, two ? gdt : NT_DTYPE_COUNT};
    nt_tensor *qa[2], *qb[2], *ama = NULL, *amb = NULL;
    nt_tensor *sa = nt_narrow(d->scale, 0, 3 * s->k, 1), *sb = nt_narrow(d->scale, 0, 3 * s->k + 1, 1);
    /* b = w^T (what nt_linear passes): the pass reads w in its own
     * (contiguous) layout and the roundings are viewed transposed back */
    nt_tensor *wt = nt_transpose(b, 0, 1);
    bool tr = wt && !nt_is_contiguous(b) && nt_is_contiguous(wt);
    if (!sa || !sb || !wt || quant_pass(a, sa, dts, qa, tls_record ? &ama : NULL) ||
        (tls_record && pend_max(s, 3 * s->k, ama)) ||
        quant_pass(tr ? wt : b, sb, dts, qb, tls_record ? &amb : NULL) ||
        (tls_record && pend_max(s, 3 * s->k + 1, amb)))
        return NULL;
    for (int i = 0; tr && i < 2; i++)
        if (qb[i] && !(qb[i] = nt_transpose(qb[i], 0, 1)))
            return NULL;
    nt_tensor *p = slot_prod(s, 0);
    nt_tensor *y = p ? mmp(qa[0], qb[0], p, NT_BF16) : NULL;
    if (y && tls_save) {
        int64_t K = b->shape[0];
        fp8_saved e = {y->st, 0,
                       two ? qa[1] : nt_reshape(qa[0], 2, (int64_t[]){nt_numel(a) / K, K}),
                       two ? qb[1] : qb[0], slot_prod(s, 1), slot_prod(s, 2)};
        if (!e.qa || !e.pda || !e.pdb)
            return NULL;
        nt_retain(e.qa);
        nt_retain(e.qb);
        nt_retain(e.pda);
        nt_retain(e.pdb);
        saved_put(s, &e);
    }
    return y;
}

static nt_tensor *slot_forward(nt_tensor *const *in, void *ctx)
{
    fp8_slot *s = ctx;
    nt_tensor *a = in[0], *b = in[1];
    int64_t K = b->shape[0], N = b->shape[1], M = nt_numel(a) / K;
    nt_scope *sc = nt_scope_begin();
    nt__amp_suspend();
    nt_tensor *a2 = nt_reshape(a, 2, (int64_t[]){M, K});
    nt_tensor *sa, *sb, *ia, *ib, *y = NULL;
    if (a2 && s->r->o.scaling == NT_FP8_DELAYED)
        y = fwd_delayed(s, a, b);
    else if (a2 && !slot_scale(s, 0, a2, tls_record, &sa, &ia) &&
             !slot_scale(s, 1, b, tls_record, &sb, &ib))
        y = mm(quant(a2, sa, FP8_FWD_DT), quant(b, sb, FP8_FWD_DT), ia, ib, NT_BF16);
    if (y && y->ndim != a->ndim) { /* (delayed scaling: y has a's shape already) */
        int64_t shape[NT_MAX_DIMS];
        for (int i = 0; i < a->ndim - 1; i++)
            shape[i] = a->shape[i];
        shape[a->ndim - 1] = N;
        y = nt_reshape(y, a->ndim, shape);
    }
    nt__amp_resume();
    if (y)
        nt_keep(y);
    nt_scope_end(sc);
    return y ? nt__scope_adopt(y, "nt_matmul") : NULL;
}

/* The backward under delayed scaling with the forward's entry e: one
 * rounding pass over the gradient that records its amax, and the two
 * gradient matmuls on the forward's roundings of a and b. */
static int bwd_saved(fp8_slot *s, fp8_saved *e, nt_tensor *a, nt_tensor *b, nt_tensor *g,
                     nt_tensor **gin)
{
    nt_dtype dts[2] = {row_dtype(s, 2), NT_DTYPE_COUNT};
    nt_tensor *qg[2], *am, *sg = nt_narrow(s->d->scale, 0, 3 * s->k + 2, 1);
    if (!sg || quant_pass(g, sg, dts, qg, &am) || pend_max(s, 3 * s->k + 2, am))
        return nt__err_or(NT_EEXEC);
    /* da in g's shape (a's leading dims), db from g viewed as [rows, N] */
    int64_t N = b->shape[1];
    nt_tensor *da = mmp(qg[0], nt_transpose(e->qb, 0, 1), e->pda, (nt_dtype)a->dtype);
    nt_tensor *g2 = nt_reshape(qg[0], 2, (int64_t[]){nt_numel(g) / N, N});
    /* b = w^T (nt_linear): db made in w's layout, db^T = g^T . a (the same
     * products summed in the same order over the rows, so the same bits),
     * and viewed transposed back: its gradient reaches w with no transposing
     * copy */
    nt_tensor *wt = nt_transpose(b, 0, 1), *db = NULL;
    bool tr = wt && !nt_is_contiguous(b) && nt_is_contiguous(wt);
    if (g2 && tr)
        db = nt_transpose(mmp(nt_transpose(g2, 0, 1), e->qa, e->pdb, (nt_dtype)b->dtype), 0, 1);
    else if (g2)
        db = mmp(nt_transpose(e->qa, 0, 1), g2, e->pdb, (nt_dtype)b->dtype);
    if (!da || !db)
        return nt_last_error();
    gin[0] = da->ndim == a->ndim ? da : nt_reshape(da, a->ndim, a->shape);
    gin[1] = db;
    return gin[0] ? 0 : nt_last_error();
}

static int slot_backward(nt_tensor *gout, nt_tensor *const *in, nt_tensor *out,
                         nt_tensor **gin, void *ctx)
{
    fp8_slot *s = ctx;
    nt_tensor *a = in[0], *b = in[1];
    int64_t K = b->shape[0], N = b->shape[1], M = nt_numel(a) / K;
    nt_tensor *a2 = nt_reshape(a, 2, (int64_t[]){M, K});
    nt_tensor *g2 = nt_reshape(gout, 2, (int64_t[]){M, N});
    fp8_saved e;
    if (s->r->o.scaling == NT_FP8_DELAYED && saved_take(s, out ? out->st : NULL, &e)) {
        /* the forward's roundings hold while the scales are the forward's
         * and the backward runs where the forward did (the same capture or
         * none) */
        g_mutex_lock(&s->r->lock);
        bool ok = e.epoch == s->d->epoch && e.qa->st->cap == nt__tl_cap;
        g_mutex_unlock(&s->r->lock);
        int rc = ok ? bwd_saved(s, &e, a, b, gout, gin) : -1;
        saved_clear(&e, true);
        if (rc >= 0)
            return rc;
    }
    nt_tensor *sg, *sa, *sb, *ig, *ia, *ib;
    if (!a2 || !g2 || slot_scale(s, 2, g2, true, &sg, &ig) ||
        slot_scale(s, 0, a2, false, &sa, &ia) || slot_scale(s, 1, b, false, &sb, &ib))
        return nt_last_error();
    /* TensorE multiplies two operands of one fp8 format (nc_matmul: both
     * e4m3 or both e5m2), so the gradient's partners are rounded to the
     * gradient's format, each with its own scale */
    nt_dtype gdt = row_dtype(s, 2);
    nt_tensor *qg = quant(g2, sg, gdt);
    nt_tensor *qa = quant(a2, sa, gdt), *qb = quant(b, sb, gdt);
    nt_tensor *da = mm(qg, nt_transpose(qb, 0, 1), ig, ib, (nt_dtype)a->dtype);
    nt_tensor *db = mm(nt_transpose(qa, 0, 1), qg, ia, ig, (nt_dtype)b->dtype);
    if (!da || !db)
        return nt_last_error();
    gin[0] = nt_reshape(da, a->ndim, a->shape);
    gin[1] = db;
    return gin[0] ? 0 : nt_last_error();
}

/* ---------------- the update ---------------- */

nt_stream *nt__fp8_enter(int dev)
{
    nt_stream *old = nt_stream_current();
    if (nt_stream_device(old) != dev)
        nt_stream_set_current(nt_stream_default_on(dev));
    return old;
}

/* Device dev's block of r and its slot count then (*n; 0 without a
 * block), read under the recipe's lock. */
static fp8_dev *dev_of(nt_fp8_recipe *r, int dev, int *n)
{
    g_mutex_lock(&r->lock);
    fp8_dev *d = dev >= 0 && dev < FP8_MAX_DEVS ? r->devs[dev] : NULL;
    *n = d ? d->nslots : 0;
    g_mutex_unlock(&r->lock);
    return d;
}

nt_tensor *nt__fp8_pending(nt_fp8_recipe *r, int dev, const char *fn)
{
    int ns;
    fp8_dev *d = dev_of(r, dev, &ns);
    if (!d || !ns) {
        nt__err(NULL, NT_ESTATE, fn, "device %d ran no fp8 matmul of this recipe", dev);
        return NULL;
    }
    return nt_narrow(d->pending, 0, 0, 3 * (int64_t)ns);
}

/* The step's amax of every row from the records (called with the recipe's
 * lock held, on any stream: it enters d's device): records sorted by row
 * (stable), one cat; when every row has m records, one max over [n, m];
 * else a max per row (rows without a record: 0).  Joined with what pending
 * holds when earlier records were folded in; written to pending. */
static int dev_collect(fp8_dev *d)
{
    int n = 3 * d->nslots, nrec = d->nrec;
    if (!nrec)
        return 0;
    int *cnt = g_try_new0(int, (size_t)n + 1);
    nt_tensor **ord = g_try_new(nt_tensor *, (size_t)nrec);
    if (!cnt || !ord) {
        g_free(cnt);
        g_free(ord);
        return nt__err_hostmem(NULL, "nt_fp8_recipe_update", "the amax records");
    }
    for (int j = 0; j < nrec; j++)
        cnt[d->rec_row[j] + 1]++;
    bool uniform = true;
    for (int r = 1; r < n; r++)
        uniform &= cnt[r + 1] == cnt[1];
    for (int r = 0; r < n; r++) /* cnt[r]: the first place of row r */
        cnt[r + 1] += cnt[r];
    for (int j = 0; j < nrec; j++)
        ord[cnt[d->rec_row[j]]++] = d->rec[j];
    nt_stream *old = nt__fp8_enter(d->dev);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *all = nt_cat(ord, nrec, 0), *v = NULL;
    int m = nrec / n;
    if (all && uniform)
        v = m > 1 ? nt_amax(nt_reshape(all, 2, (int64_t[]){n, m}), 1, (int[]){1}, false) : all;
    else if (all) {
        /* cnt[r] is now the end of row r */
        nt_tensor **rows = g_try_new(nt_tensor *, (size_t)n);
        for (int r = 0, at = 0; rows && r < n; at = cnt[r++])
            rows[r] = cnt[r] > at ? nt_amax(nt_narrow(all, 0, at, cnt[r] - at), 1, (int[]){0}, true)
                                  : d->zero;
        v = rows ? nt_cat(rows, n, 0) : NULL;
        g_free(rows);
    }
    nt_tensor *p = nt_narrow(d->pending, 0, 0, n);
    if (v && d->folded)
        v = nt_maximum(v, p);
    int rc = v && p && !nt_copy_into(p, v) ? 0 : (nt__err_or(NT_EINVAL));
    nt_scope_end(sc);
    nt_stream_set_current(old);
    g_free(cnt);
    g_free(ord);
    for (int j = 0; j < nrec; j++)
        nt_release(d->rec[j]);
    d->nrec = 0;
    d->folded = !rc;
    return rc;
}

int nt__fp8_collect(nt_fp8_recipe *r, const char *fn)
{
    int rc = 0;
    g_mutex_lock(&r->lock);
    for (int i = 0; i < FP8_MAX_DEVS && !rc; i++)
        if (r->devs[i])
            rc = dev_collect(r->devs[i]);
    g_mutex_unlock(&r->lock);
    if (rc)
        nt__err_within(fn);
    return rc;
}

/* Push the step's amax into d's history, rescale, clear the step's amax. */
static int dev_apply(nt_fp8_recipe *r, fp8_dev *d, int nslots)
{
    int64_t n = 3 * (int64_t)nslots, H = r->o.amax_history_len;
    nt_tensor *p = nt_narrow(d->pending, 0, 0, n);
    nt_tensor *h = nt_narrow(d->hist, 0, 0, n);
    nt_tensor *cur = nt_narrow(d->scale, 0, 0, n);
    nt_tensor *col = nt_unsqueeze(p, 1);
    nt_tensor *pushed = col;
    if (H > 1) {
        nt_tensor *parts[2] = {col, nt_narrow(h, 1, 0, H - 1)};
        pushed = parts[1] ? nt_cat(parts, 2, 1) : NULL;
    }
    if (!pushed || nt_copy_into(h, pushed))
        return nt_last_error();
    nt_tensor *am = nt_amax(h, 1, (int[]){1}, false);
    nt_tensor *sf = am ? scale_from(nt_narrow(d->fmax, 0, 0, n), am, r->o.margin, cur, d) : NULL;
    if (!sf || nt_copy_into(cur, sf) || nt_copy_into(nt_narrow(d->inv, 0, 0, n), nt_reciprocal(sf)) ||
        nt_fill_inplace(p, 0.0))
        return nt_last_error();
    g_mutex_lock(&r->lock);
    d->folded = false;
    d->epoch++;
    g_mutex_unlock(&r->lock);
    return 0;
}

int nt__fp8_apply(nt_fp8_recipe *r, const char *fn)
{
    if (r->o.scaling == NT_FP8_CURRENT)
        return 0;
    int rc = 0;
    nt_scope *sc = nt_scope_begin();
    for (int i = 0; i < FP8_MAX_DEVS && !rc; i++) {
        int ns;
        fp8_dev *d = dev_of(r, i, &ns);
        if (!d || !ns)
            continue;
        nt_stream *old = nt__fp8_enter(d->dev);
        rc = dev_apply(r, d, ns);
        nt_stream_set_current(old);
    }
    nt_scope_end(sc);
    if (rc)
        nt__err_within(fn);
    return rc;
}

NT_API int nt_fp8_recipe_slots(nt_fp8_recipe *r, int dev)
{
    const char *fn = "nt_fp8_recipe_slots";
    if (!nt__fp8_recipe_ok(r, fn))
        return -1;
    if (dev < 0 || dev >= nt_device_count()) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'dev' is %d; expected 0..%d", dev,
                nt_device_count() - 1);
        return -1;
    }
    int ns;
    dev_of(r, dev, &ns);
    return ns;
}

NT_API nt_tensor *nt_fp8_recipe_state(nt_fp8_recipe *r, int dev, int which)
{
    const char *fn = "nt_fp8_recipe_state";
    if (!nt__fp8_recipe_ok(r, fn))
        return NULL;
    if (dev < 0 || dev >= nt_device_count()) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'dev' is %d; expected 0..%d", dev,
                nt_device_count() - 1);
        return NULL;
    }
    if (which < 0 || which > 2) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'which' is %d; expected 0 (scales), 1 (amax "
                "histories) or 2 (the step's amaxes)", which);
        return NULL;
    }
    int ns;
    fp8_dev *d = dev_of(r, dev, &ns);
    if (!d || !ns) {
        nt__err(NULL, NT_ESTATE, fn, "device %d ran no fp8 matmul of this recipe yet", dev);
        return NULL;
    }
    if (which == 2 && nt__fp8_collect(r, fn))
        return NULL;
    nt_tensor *t = which == 0 ? d->scale : which == 1 ? d->hist : d->pending;
    return nt_narrow(t, 0, 0, 3 * (int64_t)ns);
}

/* ---------------- checkpoints (io/checkpoint.c, record kind 7) ---------------- */

nt_fp8_recipe_opts nt__fp8_opts(nt_fp8_recipe *r) { return r->o; }

bool nt__fp8_state_alloc(nt__fp8_state *st, int slots, int h)
{
    size_t n = 3 * (size_t)slots;
    st->slots = slots;
    st->data = g_try_new0(float, n * (3 + (size_t)h) + 1);
    st->scale = st->data;
    st->inv = st->data ? st->scale + n : NULL;
    st->pending = st->data ? st->inv + n : NULL;
    st->hist = st->data ? st->pending + n : NULL;
    return st->data != NULL;
}

/* Rows [0, n) of d's scale, 1 / scale, step amax and history into st's
 * arrays (a sync, on d's device). */
static int dev_read(fp8_dev *d, int64_t n, int64_t h, nt__fp8_state *st)
{
    nt_stream *old = nt__fp8_enter(d->dev);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *src[4] = {d->scale, d->inv, d->pending, d->hist};
    float *dst[4] = {st->scale, st->inv, st->pending, st->hist};
    int rc = 0;
    for (int i = 0; i < 4 && !rc; i++) {
        nt_tensor *v = nt_narrow(src[i], 0, 0, n);
        size_t nb = (size_t)(n * (i == 3 ? h : 1)) * sizeof(float);
        rc = v ? nt_to_host(v, dst[i], nb) : nt_last_error();
    }
    nt_scope_end(sc);
    nt_stream_set_current(old);
    return rc;
}

/* d's state from st: rows below 3 st->slots from it, the others as a new
 * block has them (scale 1, amaxes 0); the records of the step so far are
 * dropped, and the loaded step amax is kept for the next collect (folded).
 * With r's lock held, or on a block not yet shared. */
static int dev_write(nt_fp8_recipe *r, fp8_dev *d, const nt__fp8_state *st)
{
    int64_t h = r->o.amax_history_len, n = 3 * (int64_t)st->slots;
    float *b = g_try_new0(float, (size_t)FP8_CAP * (3 + (size_t)h));
    if (!b)
        return nt__err_hostmem(NULL, "nt_checkpoint_read", "the fp8 recipe's state");
    float *src[4] = {b, b + FP8_CAP, b + 2 * FP8_CAP, b + 3 * FP8_CAP};
    for (int i = 0; i < FP8_CAP; i++)
        src[0][i] = src[1][i] = 1.0f;
    memcpy(src[0], st->scale, (size_t)n * sizeof(float));
    memcpy(src[1], st->inv, (size_t)n * sizeof(float));
    memcpy(src[2], st->pending, (size_t)n * sizeof(float));
    memcpy(src[3], st->hist, (size_t)(n * h) * sizeof(float));
    bool held = false;
    for (int64_t i = 0; i < n; i++)
        held |= st->pending[i] != 0.0f; /* NaN too */
    nt_stream *old = nt__fp8_enter(d->dev);
    nt_scope *sc = nt_scope_begin();
    nt_tensor *dst[4] = {d->scale, d->inv, d->pending, d->hist};
    int rc = 0;
    for (int k = 0; k < 4 && !rc; k++) {
        nt_tensor *t = nt_from_host(src[k], NT_F32, dst[k]->ndim, dst[k]->shape);
        rc = t && !nt_copy_into(dst[k], t) ? 0 : (nt__err_or(NT_EINVAL));
    }
    nt_scope_end(sc);
    nt_stream_set_current(old);
    g_free(b);
    if (rc)
        return rc;
    for (int j = 0; j < d->nrec; j++)
        nt_release(d->rec[j]);
    d->nrec = 0;
    d->folded = held;
    return 0;
}

/* The state of one device that has slots (st) against another's (t): the
 * replicas of a data-parallel run hold the same bits. */
static int state_differs(const char *fn, const nt__fp8_state *st, int a, const nt__fp8_state *t,
                         int b, int h)
{
    if (t->slots != st->slots)
        return nt__err(NULL, NT_ESTATE, fn, "the fp8 recipe has %d slots on device %d and %d on "
                       "device %d: every replica must run the same matmuls", st->slots, a,
                       t->slots, b);
    size_t nb = 3 * (size_t)st->slots * (3 + (size_t)h) * sizeof(float);
    if (memcmp(st->data, t->data, nb))
        return nt__err(NULL, NT_ESTATE, fn, "the fp8 recipe's state on device %d differs from "
                       "device %d's: reduce the amaxes over every replica (nt_fp8_recipe_update "
                       "with a communicator of them) before saving", b, a);
    return 0;
}

int nt__fp8_state_get(nt_fp8_recipe *r, const char *fn, nt__fp8_state *st)
{
    memset(st, 0, sizeof *st);
    if (nt__fp8_collect(r, fn))
        return nt_last_error();
    int h = r->o.amax_history_len, first = -1, rc = 0;
    nt__fp8_state other = {0};
    for (int i = 0; i < FP8_MAX_DEVS && !rc; i++) {
        int ns;
        fp8_dev *d = dev_of(r, i, &ns);
        if (!d || !ns)
            continue;
        nt__fp8_state *t = first < 0 ? st : &other;
        g_free(t->data);
        if (!nt__fp8_state_alloc(t, ns, h))
            rc = nt__err_hostmem(NULL, fn, "the fp8 recipe's state");
        else if ((rc = dev_read(d, 3 * (int64_t)ns, h, t)) != 0)
            nt__err_within(fn);
        else if (first >= 0)
            rc = state_differs(fn, st, first, t, i, h);
        if (first < 0)
            first = i;
    }
    g_free(other.data);
    if (!rc && first < 0) { /* nothing ran: what was loaded last, or no slot */
        g_mutex_lock(&r->lock);
        int ns = r->preset.data ? r->preset.slots : 0;
        if (!nt__fp8_state_alloc(st, ns, h))
            rc = nt__err_hostmem(NULL, fn, "the fp8 recipe's state");
        else if (ns)
            memcpy(st->data, r->preset.data, 3 * (size_t)ns * (3 + (size_t)h) * sizeof(float));
        g_mutex_unlock(&r->lock);
    }
    st->o = r->o;
    if (rc) {
        g_free(st->data);
        memset(st, 0, sizeof *st);
    }
    return rc;
}

int nt__fp8_state_set(nt_fp8_recipe *r, const char *fn, const nt__fp8_state *st)
{
    int h = r->o.amax_history_len;
    nt__fp8_state keep;
    if (!nt__fp8_state_alloc(&keep, st->slots, h))
        return nt__err_hostmem(NULL, fn, "the fp8 recipe's state");
    keep.o = r->o;
    memcpy(keep.data, st->data, 3 * (size_t)st->slots * (3 + (size_t)h) * sizeof(float));
    int rc = 0;
    g_mutex_lock(&r->lock);
    g_free(r->preset.data);
    r->preset = keep;
    for (int i = 0; i < FP8_MAX_DEVS && !rc; i++)
        if (r->devs[i])
            rc = dev_write(r, r->devs[i], &r->preset);
    g_mutex_unlock(&r->lock);
    if (rc)
        nt__err_within(fn);
    return rc;
}
