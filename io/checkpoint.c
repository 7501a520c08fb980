/* io/checkpoint.c - checkpoints of parameters, optimizer state
 * (autograd/optim.h) and the loss scaler (amp/amp.h): nt_save, nt_load and
 * their nt_checkpoint_* forms.  The format is docs/checkpoint-format.md.
 *
 * io/ sits above autograd/ and amp/, so neither needs the other for this:
 * an optimizer knows nothing of files, a scaler nothing of optimizers'
 * files.  Concurrency: the optimizer's mutex is held while its state is
 * read or replaced. */
#include "amp/amp.h"
#include "autograd/optim.h"
#include "streams/stream.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ======================================================================== */
/* Checkpoints (docs/checkpoint-format.md)                                   */
/* ======================================================================== */

static const char CK_MAGIC[8] = {'N', 'T', 'C', 'K', 'P', 'T', '\r', '\n'};
#define CK_VERSION 1u
/* A file with a record of a dtype after NT_U8 (f64, i64, bool) is version 2, so a
 * reader built before those dtypes refuses it by its version ("format
 * version 2; this build reads version 1"), not by a record's dtype code;
 * files without one stay version 1, readable by every build. */
#define CK_VERSION_WIDE 2u
#define CK_DTYPE_V1_LAST NT_U8
/* And a file with an fp8 record (e4m3, e5m2) is version 3: a reader built
 * before fp8 refuses it by its version ("format version 3; this build reads
 * versions 1 and 2"). */
#define CK_VERSION_FP8 3u
#define CK_DTYPE_V2_LAST NT_BOOL
#define CK_HEADER 32
#define CK_ENTRY 96
#define CK_ALIGN 64
#define CK_OPTIONAL 0x8000u /* kinds a reader may skip if it does not know them */

enum {
    REC_PARAM = 1,       /* index: parameter */
    REC_OPT_META = 2,    /* optimizer kind, hyper-parameters, step counts (u8 bytes) */
    REC_OPT_STATE = 3,   /* index: parameter, slot: SLOT_* */
    REC_LOSS_SCALER = 4, /* amp's loss scaler (u8 bytes, SCALER_BYTES) */
    REC_OPT_GROUPS = 5,  /* the optimizer's parameter groups (u8 bytes) */
    REC_GENERATORS = 6,  /* generators' states, by position (u8 bytes) */
    REC_FP8 = 7,         /* an fp8 recipe's state (u8 bytes, FP8_FIXED + its floats) */
    /* the parameters' names (u8 bytes): optional, so an older reader loads
     * the file by position */
    REC_NAMES = CK_OPTIONAL | 7,
};
#define REC_LAST REC_FP8
#define FP8_FIXED 32 /* the fp8 recipe record's bytes before its floats */
#define NAME_MAX_BYTES 255 /* a tensor's name in a checkpoint */
#define NAMES_FIXED 8      /* the names record's bytes before its names */
#define GENS_FIXED 8       /* the generators record's bytes before its states */
#define SCALER_BYTES 64
enum { SLOT_S0 = 0, SLOT_S1 = 1, SLOT_MASTER = 2, SLOT_S2 = 3, NSLOTS = 4 };
#define GROUPS_FIXED 16 /* the group record's bytes before its groups */
#define GROUP_BYTES 96  /* per group */
#define FLAGS_ALL 15u   /* nesterov, master, amsgrad, centered */

#define META_FIXED 80 /* bytes before the per-parameter step counts */

/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as zlib and PNG. */
static uint32_t crc_table[256];
static GOnce crc_once = G_ONCE_INIT;

static gpointer crc_init(gpointer unused)
{
    (void)unused;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    return NULL;
}

static uint32_t crc32_of(const void *data, size_t n)
{
    g_once(&crc_once, crc_init, NULL);
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_f64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    put_u64(p, v);
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static double get_f64(const uint8_t *p)
{
    uint64_t v = get_u64(p);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

/* Tensor data is stored little-endian; on a big-endian host each element's
 * bytes are reversed in place (the operation is its own inverse). */
static void to_from_le(void *data, size_t nbytes, size_t esize)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    uint8_t *p = data;
    for (size_t i = 0; i + esize <= nbytes; i += esize)
        for (size_t a = 0, b = esize - 1; a < b; a++, b--) {
            uint8_t t = p[i + a];
            p[i + a] = p[i + b];
            p[i + b] = t;
        }
#else
    (void)data, (void)nbytes, (void)esize;
#endif
}

/* One record: table entry fields plus its data (owned). */
typedef struct {
    uint16_t kind;
    uint8_t dtype, ndim;
    uint32_t index, slot;
    int64_t shape[NT_MAX_DIMS];
    uint8_t *data;
    uint64_t nbytes;
    uint64_t offset; /* in the file */
    uint32_t crc;
} ck_rec;

/* The records of a checkpoint: an own array, so running out of host memory
 * is an error (NT_EHOSTMEM), not an abort. */
typedef struct {
    ck_rec *v;
    guint len, cap;
} ck_recs;

static bool recs_add(ck_recs *recs, const ck_rec *r)
{
    if (recs->len == recs->cap) {
        guint cap = recs->cap ? recs->cap * 2 : 16;
        ck_rec *v = realloc(recs->v, cap * sizeof *v);
        if (!v)
            return false;
        recs->v = v;
        recs->cap = cap;
    }
    recs->v[recs->len++] = *r;
    return true;
}

/* owns: the records' data is theirs (saving), not the file's (loading) */
static void rec_free(ck_recs *recs, bool owns)
{
    for (guint i = 0; owns && i < recs->len; i++)
        free(recs->v[i].data);
    free(recs->v);
    recs->v = NULL;
    recs->len = recs->cap = 0;
}

/* Appends a record holding t's values (a sync point). */
static int rec_tensor(ck_recs *recs, uint16_t kind, uint32_t index, uint32_t slot_,
                      nt_tensor *t)
{
    ck_rec r = {.kind = kind, .dtype = t->dtype, .ndim = (uint8_t)t->ndim, .index = index,
                .slot = slot_};
    for (int i = 0; i < t->ndim; i++)
        r.shape[i] = t->shape[i];
    size_t es = nt_dtype_size((nt_dtype)t->dtype);
    r.nbytes = (uint64_t)nt__numel(t->ndim, t->shape) * es;
    r.data = malloc(r.nbytes ? r.nbytes : 1);
    if (!r.data)
        return nt__err_hostmem(NULL, "nt_save", "a copy of a tensor");
    int rc = nt_to_host_at(NULL, t, r.data, r.nbytes);
    if (rc) {
        free(r.data);
        return rc;
    }
    to_from_le(r.data, r.nbytes, es);
    if (!recs_add(recs, &r)) {
        free(r.data);
        return nt__err_hostmem(NULL, "nt_save", "the list of records");
    }
    return 0;
}

static int rec_meta(ck_recs *recs, nt_optim *o)
{
    ck_rec r = {.kind = REC_OPT_META, .dtype = NT_U8, .ndim = 1};
    r.nbytes = META_FIXED + 8 * (uint64_t)o->n;
    r.shape[0] = (int64_t)r.nbytes;
    uint8_t *p = r.data = calloc(1, r.nbytes);
    if (!p)
        return nt__err_hostmem(NULL, "nt_save", "the optimizer record");
    const opt_group *g0 = &o->groups[0]; /* group 0's, as a one-group file has */
    put_u32(p + 0, (uint32_t)o->kind);
    put_u32(p + 4, (o->flags & ~2u) | (o->master ? 2u : 0u));
    put_u32(p + 8, (uint32_t)o->n);
    put_u64(p + 16, (uint64_t)o->steps);
    put_f64(p + 24, g0->lr);
    put_f64(p + 32, g0->momentum);
    put_f64(p + 40, g0->weight_decay);
    put_f64(p + 48, g0->beta1);
    put_f64(p + 56, g0->beta2);
    put_f64(p + 64, g0->eps);
    for (int i = 0; i < o->n; i++)
        put_u64(p + META_FIXED + 8 * i, (uint64_t)o->slots[i]->steps);
    if (!recs_add(recs, &r)) {
        free(p);
        return nt__err_hostmem(NULL, "nt_save", "the list of records");
    }
    return 0;
}

/* The group record: every group's parameter range and hyper-parameters. */
static const char *const group_field[] = {
    "lr", "initial_lr", "momentum", "weight_decay", "beta1", "beta2", "eps", "alpha",
    "lr_decay", "initial_accumulator_value"};
#define GROUP_NF 10

static void group_values(const opt_group *g, double v[GROUP_NF])
{
    double w[GROUP_NF] = {g->lr,    g->initial_lr, g->momentum, g->weight_decay, g->beta1,
                          g->beta2, g->eps,        g->alpha,    g->lr_decay,     g->init_acc};
    memcpy(v, w, sizeof w);
}

static void group_set(opt_group *g, const double v[GROUP_NF])
{
    g->lr = v[0], g->initial_lr = v[1], g->momentum = v[2], g->weight_decay = v[3];
    g->beta1 = v[4], g->beta2 = v[5], g->eps = v[6], g->alpha = v[7], g->lr_decay = v[8];
    g->init_acc = v[9];
}

static int rec_groups(ck_recs *recs, nt_optim *o)
{
    ck_rec r = {.kind = REC_OPT_GROUPS, .dtype = NT_U8, .ndim = 1};
    r.nbytes = GROUPS_FIXED + GROUP_BYTES * (uint64_t)o->ngroups;
    r.shape[0] = (int64_t)r.nbytes;
    uint8_t *p = r.data = calloc(1, r.nbytes);
    if (!p)
        return nt__err_hostmem(NULL, "nt_save", "the parameter group record");
    put_u32(p + 0, 1u); /* layout version */
    put_u32(p + 4, (uint32_t)o->ngroups);
    for (int g = 0; g < o->ngroups; g++) {
        uint8_t *e = p + GROUPS_FIXED + (size_t)g * GROUP_BYTES;
        put_u32(e + 0, (uint32_t)o->groups[g].first);
        put_u32(e + 4, (uint32_t)o->groups[g].n);
        double v[GROUP_NF];
        group_values(&o->groups[g], v);
        for (int k = 0; k < GROUP_NF; k++)
            put_f64(e + 8 + 8 * k, v[k]);
    }
    if (!recs_add(recs, &r)) {
        free(p);
        return nt__err_hostmem(NULL, "nt_save", "the list of records");
    }
    return 0;
}

/* The loss scaler's record: its state in a fixed little-endian layout
 * (docs/checkpoint-format.md). */
static int rec_scaler(ck_recs *recs, nt_grad_scaler *sc)
{
    nt__scaler_state st;
    nt__scaler_get_state(sc, &st);
    ck_rec r = {.kind = REC_LOSS_SCALER, .dtype = NT_U8, .ndim = 1};
    r.nbytes = SCALER_BYTES;
    r.shape[0] = SCALER_BYTES;
    uint8_t *p = r.data = calloc(1, r.nbytes);
    if (!p)
        return nt__err_hostmem(NULL, "nt_checkpoint_save", "the loss scaler record");
    put_u32(p + 0, 1u); /* layout version */
    put_f64(p + 8, st.scale);
    put_f64(p + 16, st.growth_factor);
    put_f64(p + 24, st.backoff_factor);
    put_u64(p + 32, (uint64_t)st.growth_interval);
    put_u64(p + 40, (uint64_t)st.growth_tracker);
    put_u64(p + 48, (uint64_t)st.skipped_steps);
    if (!recs_add(recs, &r)) {
        free(p);
        return nt__err_hostmem(NULL, "nt_checkpoint_save", "the list of records");
    }
    return 0;
}

static int io_err(const char *fn, const char *path, const char *what)
{
    char eb[128]; /* not g_strerror: it may allocate */
    const char *why = strerror_r(errno, eb, sizeof eb);
    return nt__err(NULL, errno == ENOMEM ? NT_EHOSTMEM : NT_EIO, fn, "%s '%s': %s", what, path,
                   why);
}

static int write_file(const char *fn, const char *path, ck_recs *recs)
{
    uint64_t table_end = CK_HEADER + (uint64_t)recs->len * CK_ENTRY + 8;
    uint64_t off = (table_end + CK_ALIGN - 1) / CK_ALIGN * CK_ALIGN;
    for (guint i = 0; i < recs->len; i++) {
        ck_rec *r = &recs->v[i];
        r->offset = off;
        r->crc = crc32_of(r->data, r->nbytes);
        off = (off + r->nbytes + CK_ALIGN - 1) / CK_ALIGN * CK_ALIGN;
    }
    /* no padding after the last record: every byte of the file is covered
     * by a checksum or is padding that must be zero */
    uint64_t total = recs->len ? recs->v[recs->len - 1].offset +
                                     recs->v[recs->len - 1].nbytes
                               : table_end;
    size_t hsize = (size_t)table_end;
    uint8_t *h = calloc(1, hsize);
    size_t tlen = strlen(path) + sizeof ".tmp";
    char *tmp = malloc(tlen);
    if (!h || !tmp) {
        free(h);
        free(tmp);
        return nt__err_hostmem(NULL, fn, "the checkpoint's header");
    }
    snprintf(tmp, tlen, "%s.tmp", path);
    memcpy(h, CK_MAGIC, 8);
    uint32_t version = CK_VERSION;
    for (guint i = 0; i < recs->len; i++)
        if (recs->v[i].dtype > CK_DTYPE_V2_LAST)
            version = CK_VERSION_FP8;
        else if (recs->v[i].dtype > CK_DTYPE_V1_LAST && version < CK_VERSION_WIDE)
            version = CK_VERSION_WIDE;
    put_u32(h + 8, version);
    put_u32(h + 12, recs->len);
    put_u64(h + 16, total);
    for (guint i = 0; i < recs->len; i++) {
        ck_rec *r = &recs->v[i];
        uint8_t *e = h + CK_HEADER + (size_t)i * CK_ENTRY;
        put_u16(e + 0, r->kind);
        e[2] = r->dtype;
        e[3] = r->ndim;
        put_u32(e + 4, r->index);
        put_u32(e + 8, r->slot);
        put_u32(e + 12, r->crc);
        put_u64(e + 16, r->offset);
        put_u64(e + 24, r->nbytes);
        for (int d = 0; d < r->ndim; d++)
            put_u64(e + 32 + 8 * d, (uint64_t)r->shape[d]);
    }
    put_u32(h + hsize - 8, crc32_of(h, hsize - 8));

    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = io_err(fn, tmp, "cannot create");
        goto out;
    }
    static const uint8_t zeros[CK_ALIGN];
    uint64_t pos = hsize;
    bool ok = fwrite(h, 1, hsize, f) == hsize;
    for (guint i = 0; ok && i < recs->len; i++) {
        ck_rec *r = &recs->v[i];
        ok = fwrite(zeros, 1, r->offset - pos, f) == r->offset - pos &&
             fwrite(r->data, 1, r->nbytes, f) == r->nbytes;
        pos = r->offset + r->nbytes;
    }
    ok = ok && fwrite(zeros, 1, total - pos, f) == total - pos;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (!ok) {
        rc = io_err(fn, tmp, "cannot write");
        fclose(f);
        unlink(tmp);
        goto out;
    }
    if (fclose(f) != 0) {
        rc = io_err(fn, tmp, "cannot write");
        unlink(tmp);
        goto out;
    }
    /* the rename is atomic: a reader sees the old file or the new one */
    if (rename(tmp, path) != 0) {
        rc = io_err(fn, path, "cannot rename the temporary file to");
        unlink(tmp);
    }
out:
    free(tmp);
    free(h);
    return rc;
}

/* What nt_checkpoint_write / nt_checkpoint_read add to the positional
 * calls (all zero for those). */
typedef struct {
    const char *const *names; /* a name per tensor, or NULL: by position */
    nt_generator *const *gens;
    int ngens;
    bool strict;              /* a named read: every name on both sides */
    nt_load_report *report;
    nt_fp8_recipe *fp8;       /* its state saved or restored (record kind 7) */
} ck_extra;

/* The tensors' list: at least one, unless the file holds an fp8 recipe's
 * state (n 0, tensors NULL: the recipe alone). */
static bool tensors_ok(const char *fn, nt_tensor *const *params, int n, const ck_extra *x)
{
    if (x->fp8 && n == 0 && !params)
        return true;
    return nt__check_list(fn, params, n, "tensor", NULL);
}

/* An fp8 recipe's state record (docs/checkpoint-format.md): settings,
 * slots, then scale, 1 / scale, the step's amax and the history as
 * little-endian f32. */
static int rec_fp8(ck_recs *recs, const char *fn, nt_fp8_recipe *r)
{
    nt__fp8_state st;
    int rc = nt__fp8_state_get(r, fn, &st);
    if (rc)
        return rc;
    uint64_t h = (uint64_t)st.o.amax_history_len, nf = 3 * (uint64_t)st.slots * (3 + h);
    ck_rec c = {.kind = REC_FP8, .dtype = NT_U8, .ndim = 1};
    c.nbytes = FP8_FIXED + 4 * nf;
    c.shape[0] = (int64_t)c.nbytes;
    uint8_t *p = c.data = calloc(1, c.nbytes);
    if (!p) {
        g_free(st.data);
        return nt__err_hostmem(NULL, fn, "the fp8 recipe record");
    }
    put_u32(p + 0, 1u); /* layout version */
    put_u32(p + 4, (uint32_t)st.o.scaling);
    put_u32(p + 8, (uint32_t)st.o.format);
    put_u32(p + 12, (uint32_t)st.o.amax_history_len);
    put_u32(p + 16, (uint32_t)st.o.margin);
    put_u32(p + 20, (uint32_t)st.slots);
    memcpy(p + FP8_FIXED, st.data, 4 * nf);
    to_from_le(p + FP8_FIXED, 4 * nf, 4);
    g_free(st.data);
    if (!recs_add(recs, &c)) {
        free(p);
        return nt__err_hostmem(NULL, fn, "the list of records");
    }
    return 0;
}

/* Names: each 1..255 bytes, distinct (NT_EINVAL naming the argument). */
static bool names_ok(const char *fn, const char *const *names, int n)
{
    for (int i = 0; i < n; i++) {
        size_t len = names[i] ? strlen(names[i]) : 0;
        if (!names[i] || len == 0 || len > NAME_MAX_BYTES) {
            nt__err(NULL, NT_EINVAL, fn, "argument 'names[%d]' is %s; expected a name of 1 to %d "
                    "bytes", i, !names[i] ? "NULL" : len ? "too long" : "empty", NAME_MAX_BYTES);
            return false;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j])) {
                nt__err(NULL, NT_EINVAL, fn, "arguments 'names[%d]' and 'names[%d]' are both "
                        "\"%s\"; expected distinct names", j, i, names[i]);
                return false;
            }
    }
    return true;
}

/* A settings record of `nbytes` bytes, zeroed, for the caller to fill. */
static int rec_bytes(ck_recs *recs, uint16_t kind, uint64_t nbytes, uint8_t **data)
{
    ck_rec r = {.kind = kind, .dtype = NT_U8, .ndim = 1, .nbytes = nbytes};
    r.shape[0] = (int64_t)nbytes;
    r.data = calloc(1, nbytes ? nbytes : 1);
    if (!r.data || !recs_add(recs, &r)) {
        free(r.data);
        return nt__err_hostmem(NULL, "nt_checkpoint_write", "a record");
    }
    *data = r.data;
    return 0;
}

/* count, reserved, then per name its u16 length and bytes */
static int rec_names(ck_recs *recs, const char *const *names, int n)
{
    uint64_t nb = NAMES_FIXED;
    for (int i = 0; i < n; i++)
        nb += 2 + strlen(names[i]);
    uint8_t *d;
    int rc = rec_bytes(recs, REC_NAMES, nb, &d);
    if (rc)
        return rc;
    put_u32(d, (uint32_t)n);
    uint8_t *q = d + NAMES_FIXED;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        put_u16(q, (uint16_t)len);
        memcpy(q + 2, names[i], len);
        q += 2 + len;
    }
    return 0;
}

/* count, reserved, then per generator its seed and offset */
static int rec_gens(ck_recs *recs, nt_generator *const *gens, int ngens)
{
    uint8_t *d;
    int rc = rec_bytes(recs, REC_GENERATORS, GENS_FIXED + 16 * (uint64_t)ngens, &d);
    if (rc)
        return rc;
    put_u32(d, (uint32_t)ngens);
    for (int i = 0; i < ngens; i++) {
        uint64_t seed, off;
        nt_generator_get_state(gens[i], &seed, &off); /* checked live by the caller */
        put_u64(d + GENS_FIXED + 16 * (size_t)i, seed);
        put_u64(d + GENS_FIXED + 16 * (size_t)i + 8, off);
    }
    return 0;
}

/* gens: ngens >= 0 live generators (NT_EINVAL naming the argument). */
static bool gens_ok(const char *fn, nt_generator *const *gens, int ngens)
{
    if (ngens < 0 || (ngens && !gens)) {
        nt__err(NULL, NT_EINVAL, fn, "argument 'spec->gens' is %s with ngens %d; expected %s",
                gens ? "given" : "NULL", ngens, "ngens >= 0 generators");
        return false;
    }
    uint64_t s, o;
    for (int i = 0; i < ngens; i++)
        if (!gens[i] || nt_generator_get_state(gens[i], &s, &o) != 0) {
            nt_clear_error();
            nt__err(NULL, NT_EINVAL, fn, "argument 'spec->gens[%d]' is %s", i,
                    gens[i] ? "not a live generator" : "NULL");
            return false;
        }
    return true;
}

static int save_impl(const char *fn, const char *path, nt_tensor *const *params, int n,
                     nt_optim *opt, nt_grad_scaler *scaler, const ck_extra *x)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (!path || !*path)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'path' is %s", path ? "empty" : "NULL");
    if (!tensors_ok(fn, params, n, x) || (opt && !nt__optim_ok(opt, fn)) ||
        (scaler && !nt__scaler_ok(scaler, fn)) || (x->names && !names_ok(fn, x->names, n)) ||
        !gens_ok(fn, x->gens, x->ngens) || (x->fp8 && !nt__fp8_recipe_ok(x->fp8, fn)))
        return nt_last_error();
    if (opt)
        g_mutex_lock(&opt->lock);
    ck_recs recs_ = {0}, *recs = &recs_;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = rec_tensor(recs, REC_PARAM, (uint32_t)i, 0, params[i]);
    if (x->names && !rc)
        rc = rec_names(recs, x->names, n);
    if (x->ngens && !rc)
        rc = rec_gens(recs, x->gens, x->ngens);
    if (opt && !rc)
        rc = rec_meta(recs, opt);
    if (opt && !rc) {
        for (int i = 0; i < opt->n && !rc; i++) {
            slot *s = opt->slots[i];
            if (s->s0)
                rc = rec_tensor(recs, REC_OPT_STATE, (uint32_t)i, SLOT_S0, s->s0);
            if (!rc && s->s1)
                rc = rec_tensor(recs, REC_OPT_STATE, (uint32_t)i, SLOT_S1, s->s1);
            if (!rc && s->master)
                rc = rec_tensor(recs, REC_OPT_STATE, (uint32_t)i, SLOT_MASTER, s->master);
            if (!rc && s->s2)
                rc = rec_tensor(recs, REC_OPT_STATE, (uint32_t)i, SLOT_S2, s->s2);
        }
    }
    if (opt && !rc)
        rc = rec_groups(recs, opt);
    if (opt)
        g_mutex_unlock(&opt->lock);
    if (scaler && !rc)
        rc = rec_scaler(recs, scaler);
    if (x->fp8 && !rc)
        rc = rec_fp8(recs, fn, x->fp8);
    if (!rc)
        rc = write_file(fn, path, recs);
    rec_free(recs, true);
    return rc;
}

NT_API int nt_save(const char *path, nt_tensor *const *params, int n, nt_optim *opt)
{
    return save_impl("nt_save", path, params, n, opt, NULL, &(ck_extra){0});
}

NT_API int nt_checkpoint_save(const char *path, nt_tensor *const *params, int n,
                              nt_optim *opt, nt_grad_scaler *scaler)
{
    return save_impl("nt_checkpoint_save", path, params, n, opt, scaler, &(ck_extra){0});
}

NT_API int nt_checkpoint_write(const char *path, const nt_checkpoint_spec *spec)
{
    const char *fn = "nt_checkpoint_write";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!spec)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'spec' is NULL");
    ck_extra x = {.names = spec->names, .gens = spec->gens, .ngens = spec->ngens,
                  .fp8 = spec->fp8};
    return save_impl(fn, path, spec->tensors, spec->n, spec->opt, spec->scaler, &x);
}

/* ---------------- loading ---------------- */

static int fmt_err(const char *fn, const char *path, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static int fmt_err(const char *fn, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char what[512];
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return nt__err(NULL, NT_EFORMAT, fn, "'%s' is not a valid checkpoint: %s", path, what);
}

static bool same_shape(const ck_rec *r, nt_tensor *t)
{
    if (r->ndim != t->ndim)
        return false;
    for (int i = 0; i < t->ndim; i++)
        if (r->shape[i] != t->shape[i])
            return false;
    return true;
}

static int mismatch(const char *fn, const char *path, const char *what, int idx,
                    const ck_rec *r, nt_tensor *t)
{
    char s1[128], s2[128];
    return nt__err(NULL, NT_ESHAPE, fn,
                   "'%s': %s %d is %s %s in the checkpoint but %s %s here", path, what, idx,
                   nt_dtype_name((nt_dtype)r->dtype), nt__shape_str(r->ndim, r->shape, s1, sizeof s1),
                   nt_dtype_name((nt_dtype)t->dtype), nt__shape_str(t->ndim, t->shape, s2, sizeof s2));
}

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const ck_rec *)a)->offset, y = ((const ck_rec *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Records must not overlap, and the bytes between them (alignment padding)
 * must be zero, so that no byte of the file escapes a check. */
static int check_gaps(const char *fn, const char *path, const uint8_t *b, uint64_t size,
                      uint64_t table_end, ck_recs *recs)
{
    ck_rec *sorted = malloc((recs->len ? recs->len : 1) * sizeof *sorted);
    if (!sorted)
        return nt__err_hostmem(NULL, fn, "the checkpoint's record list");
    if (recs->len) /* an empty list has no array (memcpy needs one) */
        memcpy(sorted, recs->v, recs->len * sizeof *sorted);
    qsort(sorted, recs->len, sizeof *sorted, by_offset);
    uint64_t pos = table_end;
    int rc = 0;
    for (guint i = 0; i <= recs->len && !rc; i++) {
        const ck_rec *r = i < recs->len ? &sorted[i] : NULL;
        uint64_t next = r ? r->offset : size;
        if (next < pos) {
            rc = fmt_err(fn, path, "records overlap at byte %llu", (unsigned long long)next);
            break;
        }
        for (uint64_t k = pos; k < next; k++)
            if (b[k]) {
                rc = fmt_err(fn, path, "nonzero padding byte at offset %llu (the file is corrupt)",
                             (unsigned long long)k);
                break;
            }
        if (r)
            pos = r->offset + r->nbytes;
    }
    free(sorted);
    return rc;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

static const char *kind_name(uint32_t kind)
{
    static const char *const names[] = {"unknown", "SGD",    "AdamW", "Adam",
                                        "RMSprop", "Adagrad", "Lion"};
    return kind <= NT__OPTIM_KIND_MAX ? names[kind] : names[0];
}

/* The group record (docs/checkpoint-format.md): its layout, each group's
 * range (contiguous from parameter 0) and hyper-parameters. */
static int check_groups(const char *fn, const char *path, const ck_rec *r)
{
    const char *what = "the parameter group record";
    const uint8_t *p = r->data;
    if (r->nbytes < GROUPS_FIXED || get_u32(p) != 1u)
        return fmt_err(fn, path, "%s has an unknown layout (%llu bytes, version %u; expected "
                       "version 1)", what, (unsigned long long)r->nbytes,
                       r->nbytes >= 4 ? get_u32(p) : 0u);
    uint32_t ng = get_u32(p + 4);
    if (ng < 1 || r->nbytes != GROUPS_FIXED + GROUP_BYTES * (uint64_t)ng)
        return fmt_err(fn, path, "%s's group count %u does not match its %llu bytes", what, ng,
                       (unsigned long long)r->nbytes);
    if (!all_zero(p + 8, 8))
        return fmt_err(fn, path, "%s's reserved bytes (8..15) are not zero", what);
    uint64_t next = 0;
    for (uint32_t g = 0; g < ng; g++) {
        const uint8_t *e = p + GROUPS_FIXED + (size_t)g * GROUP_BYTES;
        uint32_t first = get_u32(e), n = get_u32(e + 4);
        if (first != next || n < 1)
            return fmt_err(fn, path, "%s: group %u holds parameters %u..%llu (expected a "
                           "non-empty range from %llu)", what, g, first,
                           (unsigned long long)first + n - 1, (unsigned long long)next);
        next = (uint64_t)first + n;
        if (!all_zero(e + 88, 8))
            return fmt_err(fn, path, "%s: group %u's reserved bytes are not zero", what, g);
        for (int k = 0; k < GROUP_NF; k++) {
            double v = get_f64(e + 8 + 8 * k);
            bool beta = k == 4 || k == 5;
            if (beta ? !(v >= 0 && v < 1) : !(isfinite(v) && v >= 0))
                return fmt_err(fn, path, "%s: group %u's %s is %g (expected %s)", what, g,
                               group_field[k], v, beta ? "a value in [0, 1)"
                                                       : "a finite value >= 0");
        }
    }
    return 0;
}

/* The optimizer record's contents (docs/checkpoint-format.md), checked
 * whether or not the caller restores an optimizer: a file whose CRCs match
 * but whose hyper-parameters no optimizer could have (lr NaN, beta1 1.5, a
 * negative step count) is corrupt, and loading it would turn training to
 * NaN. */
static int check_meta(const char *fn, const char *path, const ck_rec *r)
{
    const char *what = "the optimizer record";
    if (r->nbytes < META_FIXED)
        return fmt_err(fn, path, "%s is %llu bytes, shorter than %d", what,
                       (unsigned long long)r->nbytes, META_FIXED);
    const uint8_t *m = r->data;
    uint32_t kind = get_u32(m), flags = get_u32(m + 4), mn = get_u32(m + 8);
    if (kind < KIND_SGD || kind > NT__OPTIM_KIND_MAX)
        return fmt_err(fn, path, "%s's optimizer kind is %u (expected 1 SGD, 2 AdamW, 3 Adam, "
                       "4 RMSprop, 5 Adagrad or 6 Lion)", what, kind);
    if (flags & ~FLAGS_ALL)
        return fmt_err(fn, path, "%s's flags are 0x%x (expected only bits 0 to 3)", what, flags);
    if (((flags & OPTF_AMSGRAD) && kind != KIND_ADAM && kind != KIND_ADAMW) ||
        ((flags & OPTF_CENTERED) && kind != KIND_RMSPROP))
        return fmt_err(fn, path, "%s's flags 0x%x do not belong to a %s", what, flags,
                       kind_name(kind));
    if (mn < 1 || r->nbytes != META_FIXED + 8 * (uint64_t)mn)
        return fmt_err(fn, path, "%s's parameter count %u does not match its %llu bytes", what,
                       mn, (unsigned long long)r->nbytes);
    if (!all_zero(m + 12, 4) || !all_zero(m + 72, 8))
        return fmt_err(fn, path, "%s's reserved bytes (12..15, 72..79) are not zero", what);
    int64_t steps = (int64_t)get_u64(m + 16);
    if (steps < 0 || steps > NT__OPTIM_MAX_STEPS) /* the next step would overflow */
        return fmt_err(fn, path, "%s's step count is %lld (expected 0..2^53 = %lld)", what,
                       (long long)steps, (long long)NT__OPTIM_MAX_STEPS);
    static const char *const names[] = {"lr", "momentum", "weight_decay", "beta1", "beta2", "eps"};
    bool sgd = kind == KIND_SGD;
    /* the fields each kind uses (bit i: names[i]); the others are 0 */
    static const unsigned used[] = {0, 0x07, 0x3d, 0x3d, 0x27, 0x25, 0x1d};
    for (int i = 0; i < 6; i++) {
        double v = get_f64(m + 24 + 8 * i);
        bool beta = i == 3 || i == 4;
        bool unused = !(used[kind] >> i & 1);
        bool ok = unused ? v == 0 && !signbit(v)
                         : beta ? v >= 0 && v < 1 : isfinite(v) && v >= 0;
        if (!ok) {
            char why[64];
            snprintf(why, sizeof why, "0: %s does not use it", kind_name(kind));
            return fmt_err(fn, path, "%s's %s is %g (expected %s)", what, names[i], v,
                           unused ? why
                           : beta ? "a value in [0, 1)"
                                  : "a finite value >= 0");
        }
    }
    if (flags & 1) {
        double momentum = get_f64(m + 32);
        if (!sgd || !(momentum > 0))
            return fmt_err(fn, path, "%s sets nesterov for %s (expected SGD with momentum > 0)",
                           what, sgd ? "momentum 0" : "AdamW");
    }
    for (uint32_t i = 0; i < mn; i++) {
        int64_t ps = (int64_t)get_u64(m + META_FIXED + 8 * i);
        if (ps < 0 || ps > steps)
            return fmt_err(fn, path, "%s's step count of parameter %u is %lld (expected 0..%lld, "
                           "the optimizer's steps)", what, i, (long long)ps, (long long)steps);
    }
    return 0;
}

/* The scaler state a loss-scaler record holds (bytes 8..55), checked. */
static int scaler_rec_state(const char *fn, const char *path, const ck_rec *r,
                            nt__scaler_state *st)
{
    const uint8_t *p = r->data;
    *st = (nt__scaler_state){get_f64(p + 8), get_f64(p + 16), get_f64(p + 24),
                             (int64_t)get_u64(p + 32), (int64_t)get_u64(p + 40),
                             (int64_t)get_u64(p + 48)};
    char why[160];
    if (!nt__scaler_state_valid(st, why, sizeof why))
        return fmt_err(fn, path, "the loss scaler record is invalid: %s", why);
    return 0;
}

/* The loss scaler record's fixed bytes (its values: plan_scaler). */
static int check_scaler_rec(const char *fn, const char *path, const ck_rec *r)
{
    if (r->nbytes != SCALER_BYTES || get_u32(r->data) != 1u)
        return fmt_err(fn, path, "the loss scaler record has an unknown layout (%llu bytes, "
                       "version %u; expected 64 bytes, version 1)", (unsigned long long)r->nbytes,
                       r->nbytes >= 4 ? get_u32(r->data) : 0u);
    if (!all_zero(r->data + 4, 4) || !all_zero(r->data + 56, 8))
        return fmt_err(fn, path, "the loss scaler record's reserved bytes (4..7, 56..63) are not "
                       "zero");
    nt__scaler_state st;
    return scaler_rec_state(fn, path, r, &st);
}

/* The names record: its count, each name 1..255 bytes without a NUL,
 * distinct, and nothing after the last (its count against the parameter
 * records is the load's check).  names (may be NULL): the count names. */
static int walk_names(const char *fn, const char *path, const ck_rec *r, const char **names,
                      uint16_t *lens)
{
    const uint8_t *d = r->data;
    if (r->nbytes < NAMES_FIXED || !all_zero(d + 4, 4))
        return fmt_err(fn, path, "the names record is %s", r->nbytes < NAMES_FIXED
                       ? "shorter than its header" : "not zero in its reserved bytes 4..7");
    uint32_t count = get_u32(d);
    uint64_t at = NAMES_FIXED;
    for (uint32_t i = 0; i < count; i++) {
        uint16_t len = at + 2 <= r->nbytes ? get_u16(d + at) : 0;
        if (len == 0 || len > NAME_MAX_BYTES || at + 2 + len > r->nbytes ||
            memchr(d + at + 2, 0, len))
            return fmt_err(fn, path, "name %u of the names record is malformed (empty, longer "
                           "than %d bytes, past the record's end or holding a NUL)", i,
                           NAME_MAX_BYTES);
        if (names) {
            names[i] = (const char *)d + at + 2;
            lens[i] = len;
            for (uint32_t j = 0; j < i; j++)
                if (lens[j] == len && !memcmp(names[j], names[i], len))
                    return fmt_err(fn, path, "names %u and %u of the names record are both "
                                   "\"%.*s\"", j, i, (int)len, names[i]);
        }
        at += 2 + (uint64_t)len;
    }
    if (at != r->nbytes)
        return fmt_err(fn, path, "the names record has %llu bytes after its %u names",
                       (unsigned long long)(r->nbytes - at), count);
    return 0;
}

static int check_names(const char *fn, const char *path, const ck_rec *r)
{
    uint32_t count = r->nbytes >= NAMES_FIXED ? get_u32(r->data) : 0;
    if (count > r->nbytes / 3) /* each name takes 3 bytes at least */
        return fmt_err(fn, path, "the names record counts %u names in %llu bytes", count,
                       (unsigned long long)r->nbytes);
    const char **nm = calloc(count + 1, sizeof *nm);
    uint16_t *lens = calloc(count + 1, sizeof *lens);
    int rc = nm && lens ? walk_names(fn, path, r, nm, lens)
                        : nt__err_hostmem(NULL, fn, "the checkpoint's names");
    free(nm);
    free(lens);
    return rc;
}

static int check_gens(const char *fn, const char *path, const ck_rec *r)
{
    if (r->nbytes < GENS_FIXED || !all_zero(r->data + 4, 4) ||
        r->nbytes != GENS_FIXED + 16 * (uint64_t)get_u32(r->data))
        return fmt_err(fn, path, "the generators record (%llu bytes) does not match its count",
                       (unsigned long long)r->nbytes);
    return 0;
}

/* An f32 of the fp8 record's floats (little-endian at p). */
static float fp8_f32(const uint8_t *p)
{
    uint32_t u = get_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The fp8 recipe record: its layout, settings in range, its size against
 * its slots and history, scales and their reciprocals positive finite,
 * amaxes not negative (NaN and +Inf are amaxes a step can have).  With st,
 * decodes it (a host block; g_free(st->data)). */
static int check_fp8_rec(const char *fn, const char *path, const ck_rec *r, nt__fp8_state *st)
{
    const char *what = "the fp8 recipe record";
    const uint8_t *p = r->data;
    if (r->nbytes < FP8_FIXED || get_u32(p) != 1u)
        return fmt_err(fn, path, "%s has an unknown layout (%llu bytes, version %u; expected "
                       "version 1)", what, (unsigned long long)r->nbytes,
                       r->nbytes >= 4 ? get_u32(p) : 0u);
    uint32_t sc = get_u32(p + 4), fm = get_u32(p + 8), h = get_u32(p + 12), mg = get_u32(p + 16);
    uint32_t slots = get_u32(p + 20);
    if (sc > 1 || fm > 1 || h < 1 || h > 4096 || mg > 32 || slots > 256)
        return fmt_err(fn, path, "%s has scaling %u, format %u, amax_history_len %u, margin %u, "
                       "%u slots (expected 0..1, 0..1, 1..4096, 0..32, 0..256)", what, sc, fm, h,
                       mg, slots);
    if (!all_zero(p + 24, 8))
        return fmt_err(fn, path, "%s's reserved bytes (24..31) are not zero", what);
    uint64_t n = 3 * (uint64_t)slots, nf = n * (3 + (uint64_t)h);
    if (r->nbytes != FP8_FIXED + 4 * nf)
        return fmt_err(fn, path, "%s is %llu bytes; %u slots with a history of %u make %llu",
                       what, (unsigned long long)r->nbytes, slots, h,
                       (unsigned long long)(FP8_FIXED + 4 * nf));
    const uint8_t *f = p + FP8_FIXED;
    for (uint64_t i = 0; i < nf; i++) {
        float v = fp8_f32(f + 4 * i);
        bool scale = i < 2 * n;
        if (scale ? !(v > 0.0f && v < INFINITY) : v < 0.0f)
            return fmt_err(fn, path, "%s's %s of row %llu is %g (expected %s)", what,
                           i < n ? "scale" : i < 2 * n ? "1 / scale" : i < 3 * n ? "step amax"
                                                                         : "amax history",
                           (unsigned long long)(i < 3 * n ? i % n : (i - 3 * n) / h), (double)v,
                           scale ? "positive and finite" : "an amax: not negative");
    }
    if (!st)
        return 0;
    if (!nt__fp8_state_alloc(st, (int)slots, (int)h))
        return nt__err_hostmem(NULL, fn, "the fp8 recipe's state");
    st->o = (nt_fp8_recipe_opts){(nt_fp8_scaling)sc, (nt_fp8_format)fm, (int)h, (int)mg};
    for (uint64_t i = 0; i < nf; i++)
        st->data[i] = fp8_f32(f + 4 * i);
    return 0;
}

/* The fp8 record for recipe fr: present once, its settings fr's (NT_EINVAL
 * naming the setting), decoded into *st.  Without fr: at most one record. */
static int plan_fp8(const char *fn, const char *path, ck_recs *recs, nt_fp8_recipe *fr,
                    nt__fp8_state *st)
{
    const ck_rec *rec = NULL;
    for (guint i = 0; i < recs->len; i++)
        if (recs->v[i].kind == REC_FP8) {
            if (rec)
                return fmt_err(fn, path, "two fp8 recipe records");
            rec = &recs->v[i];
        }
    if (!fr)
        return 0;
    if (!rec)
        return nt__err(NULL, NT_EINVAL, fn, "'%s' holds no fp8 recipe state (it was saved "
                       "without one); pass fp8 = NULL", path);
    int rc = check_fp8_rec(fn, path, rec, st);
    if (rc)
        return rc;
    nt_fp8_recipe_opts o = nt__fp8_opts(fr), f = st->o;
    const char *field = o.scaling != f.scaling ? "scaling" : o.format != f.format ? "format"
                        : o.amax_history_len != f.amax_history_len ? "amax_history_len"
                        : o.margin != f.margin ? "margin" : NULL;
    if (!field)
        return 0;
    int a = !strcmp(field, "scaling") ? (int)f.scaling : !strcmp(field, "format") ? (int)f.format
            : !strcmp(field, "margin") ? f.margin : f.amax_history_len;
    int b = !strcmp(field, "scaling") ? (int)o.scaling : !strcmp(field, "format") ? (int)o.format
            : !strcmp(field, "margin") ? o.margin : o.amax_history_len;
    g_free(st->data);
    st->data = NULL;
    return nt__err(NULL, NT_EINVAL, fn, "'%s' holds the state of an fp8 recipe with %s %d; "
                   "argument 'spec->fp8' has %s %d (make the recipe with the saved settings)",
                   path, field, a, field, b);
}

/* A settings record's contents (0 for the other kinds). */
static int check_settings(const char *fn, const char *path, const ck_rec *r)
{
    if (r->kind == REC_NAMES)
        return check_names(fn, path, r);
    if (r->kind == REC_GENERATORS)
        return check_gens(fn, path, r);
    if (r->kind == REC_OPT_META)
        return check_meta(fn, path, r);
    if (r->kind == REC_LOSS_SCALER)
        return check_scaler_rec(fn, path, r);
    if (r->kind == REC_OPT_GROUPS)
        return check_groups(fn, path, r);
    if (r->kind == REC_FP8)
        return check_fp8_rec(fn, path, r, NULL);
    return 0;
}

/* Record i's dtype and dim count: in range, and no dtype after u8 in a
 * version-1 file.  0 or NT_EFORMAT. */
static int check_dtype_dims(const char *fn, const char *path, uint32_t i, const ck_rec *r,
                            uint32_t version)
{
    if (r->dtype >= NT_DTYPE_COUNT || r->ndim > NT_MAX_DIMS)
        return fmt_err(fn, path, "record %u has dtype %u and %u dims", i, r->dtype, r->ndim);
    if (version == CK_VERSION && r->dtype > CK_DTYPE_V1_LAST)
        return fmt_err(fn, path, "record %u has dtype %s in a version-1 file (version 1 has "
                       "dtypes f32, bf16, f16, i32 and u8 only)", i,
                       nt_dtype_name((nt_dtype)r->dtype));
    if (version == CK_VERSION_WIDE && r->dtype > CK_DTYPE_V2_LAST)
        return fmt_err(fn, path, "record %u has dtype %s in a version-2 file (fp8 records "
                       "make a file version 3)", i, nt_dtype_name((nt_dtype)r->dtype));
    return 0;
}

/* Reads and checks the whole file: header, table, every record's bounds and
 * checksum.  On success *buf holds the file and *recs its records (data
 * pointing into *buf). */
static int read_checked(const char *fn, const char *path, uint8_t **buf, ck_recs *recs)
{
    *buf = NULL;
    *recs = (ck_recs){0};
    uint8_t *raw = NULL;
    size_t size = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return io_err(fn, path, "cannot open");
    /* the whole file: it is checked completely before anything is used */
    size_t cap = 1 << 16;
    raw = malloc(cap);
    for (;;) {
        uint8_t *more = size == cap ? realloc(raw, cap *= 2) : raw;
        if (!more) {
            fclose(f);
            free(raw);
            return nt__err_hostmem(NULL, fn, "the checkpoint's bytes");
        }
        raw = more;
        size_t got = fread(raw + size, 1, cap - size, f);
        size += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        int rc = io_err(fn, path, "cannot read");
        fclose(f);
        free(raw);
        return rc;
    }
    fclose(f);
    uint8_t *b = (uint8_t *)raw;
    int rc = 0;
    if (size < CK_HEADER + 8 || memcmp(b, CK_MAGIC, 8) != 0) {
        rc = size >= 8 && memcmp(b, CK_MAGIC, 8) != 0
                 ? fmt_err(fn, path, "bad magic (not an ntensor checkpoint)")
                 : fmt_err(fn, path, "truncated: %zu bytes, shorter than the header", (size_t)size);
        goto fail;
    }
    uint32_t version = get_u32(b + 8), count = get_u32(b + 12);
    uint64_t total = get_u64(b + 16);
    if (version != CK_VERSION && version != CK_VERSION_WIDE && version != CK_VERSION_FP8) {
        rc = fmt_err(fn, path, "format version %u; this build reads versions %u, %u and %u",
                     version, CK_VERSION, CK_VERSION_WIDE, CK_VERSION_FP8);
        goto fail;
    }
    if (total != size) {
        rc = total > size ? fmt_err(fn, path, "truncated: %zu of %llu bytes", (size_t)size,
                                    (unsigned long long)total)
                          : fmt_err(fn, path, "%zu bytes but the header says %llu", (size_t)size,
                                    (unsigned long long)total);
        goto fail;
    }
    uint64_t table_end = CK_HEADER + (uint64_t)count * CK_ENTRY + 8;
    if (table_end > size) {
        rc = fmt_err(fn, path, "the record table (%u records) runs past the end of the file",
                     count);
        goto fail;
    }
    if (get_u32(b + table_end - 8) != crc32_of(b, table_end - 8)) {
        rc = fmt_err(fn, path, "header checksum mismatch (the header or record table is corrupt)");
        goto fail;
    }
    if (!all_zero(b + 24, 8) || !all_zero(b + table_end - 4, 4)) {
        rc = fmt_err(fn, path, "the header's reserved bytes (%s) are not zero",
                     all_zero(b + 24, 8) ? "the 4 after the header checksum" : "24..31");
        goto fail;
    }
    ck_recs rs_ = {0}, *rs = &rs_;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = b + CK_HEADER + (size_t)i * CK_ENTRY;
        ck_rec r = {.kind = get_u16(e), .dtype = e[2], .ndim = e[3], .index = get_u32(e + 4),
                    .slot = get_u32(e + 8), .crc = get_u32(e + 12), .offset = get_u64(e + 16),
                    .nbytes = get_u64(e + 24)};
        bool known = (r.kind >= REC_PARAM && r.kind <= REC_LAST) || r.kind == REC_NAMES;
        if (!known && !(r.kind & CK_OPTIONAL)) {
            rc = fmt_err(fn, path, "record %u has kind %u, unknown to this build", i, r.kind);
            break;
        }
        if ((rc = check_dtype_dims(fn, path, i, &r, version)) != 0)
            break;
        for (int d = 0; d < r.ndim; d++)
            r.shape[d] = (int64_t)get_u64(e + 32 + 8 * d);
        char why[256];
        if (!nt__shape_ok(r.ndim, r.shape, why, sizeof why)) {
            rc = fmt_err(fn, path, "record %u: %s", i, why);
            break;
        }
        if (!all_zero(e + 32 + 8 * r.ndim, 8 * (size_t)(NT_MAX_DIMS - r.ndim))) {
            rc = fmt_err(fn, path, "record %u: the shape entries past its %u dims are not zero", i,
                         r.ndim);
            break;
        }
        uint64_t want = (uint64_t)nt__numel(r.ndim, r.shape) * nt_dtype_size((nt_dtype)r.dtype);
        if (want != r.nbytes) {
            rc = fmt_err(fn, path, "record %u: size %llu bytes, but its %s shape needs %llu", i,
                         (unsigned long long)r.nbytes, nt_dtype_name((nt_dtype)r.dtype),
                         (unsigned long long)want);
            break;
        }
        if (r.offset < table_end || r.offset % CK_ALIGN || r.offset > size ||
            r.nbytes > size - r.offset) {
            rc = fmt_err(fn, path, "record %u: offset %llu (expected a multiple of %d from %llu, "
                         "with its %llu bytes inside the file's %zu)", i,
                         (unsigned long long)r.offset, CK_ALIGN, (unsigned long long)table_end,
                         (unsigned long long)r.nbytes, size);
            break;
        }
        /* what each kind leaves unused is zero; settings records are bytes */
        bool settings = r.kind == REC_OPT_META || r.kind == REC_LOSS_SCALER ||
                        r.kind == REC_OPT_GROUPS || r.kind == REC_GENERATORS ||
                        r.kind == REC_NAMES || r.kind == REC_FP8;
        if (known && ((r.kind != REC_OPT_STATE && r.slot != 0) || (settings && r.index != 0) ||
                      (settings && (r.dtype != NT_U8 || r.ndim != 1)))) {
            rc = fmt_err(fn, path, "record %u (kind %u) has dtype %s, %u dims, index %u, slot %u "
                         "(expected %s)", i, r.kind, nt_dtype_name((nt_dtype)r.dtype), r.ndim,
                         r.index, r.slot, settings ? "u8, 1 dim, index 0, slot 0" : "slot 0");
            break;
        }
        r.data = b + r.offset;
        if (crc32_of(r.data, r.nbytes) != r.crc) {
            rc = fmt_err(fn, path, "checksum mismatch in the data of record %u", i);
            break;
        }
        rc = check_settings(fn, path, &r);
        if (rc)
            break;
        /* optional kinds unknown here too: their bytes are not padding */
        if (!recs_add(rs, &r)) {
            rc = nt__err_hostmem(NULL, fn, "the checkpoint's record list");
            break;
        }
    }
    if (!rc)
        rc = check_gaps(fn, path, b, size, table_end, rs);
    if (rc) {
        rec_free(rs, false);
        goto fail;
    }
    *buf = b;
    *recs = *rs;
    return 0;
fail:
    free(raw);
    return rc;
}

/* What a load will install, built completely before anything is touched. */
typedef struct {
    nt_tensor **vals;        /* [n] new values of the params */
    nt_tensor **state;       /* [opt->n * NSLOTS] new optimizer state, NULL where absent */
    int64_t *psteps;         /* [opt->n] */
    const uint8_t *meta;
    const uint8_t *groups;   /* the group record's bytes, or NULL (a file before groups) */
    nt__scaler_state scaler; /* when a scaler is loaded */
} ck_plan;

/* The record's values as a new tensor on device dev (the device of the
 * tensor it will be copied into). */
static nt_tensor *rec_to_tensor(ck_rec *r, int dev)
{
    /* little-endian to host order in place (the file buffer is ours) */
    to_from_le(r->data, r->nbytes, nt_dtype_size((nt_dtype)r->dtype));
    nt__devsw dv;
    nt__dev_enter(&dv, dev);
    nt_tensor *t = nt_from_host_at(NULL, r->data, (nt_dtype)r->dtype, r->ndim, r->shape);
    nt__dev_leave(&dv);
    return t ? nt_keep(t) : NULL;
}

/* An inner call's error (a device full, the host out of memory) as the
 * user's call's: "nt_load: loading '<path>': <the inner message>". */
static int load_failed(const char *fn, const char *path)
{
    int code = nt__err_or(NT_EINVAL);
    char head[NT__SITE_MAX], msg[NT__ERRMSG_MAX];
    snprintf(head, sizeof head, "%s: loading '%s': ", fn, path);
    nt__msg_join(msg, sizeof msg, head, nt_last_error_message(), "");
    nt__err_set(code, msg);
    return code;
}

/* Checks the scaler record and decodes it into pl->scaler. */
static int plan_scaler(const char *fn, const char *path, const ck_rec *r, ck_plan *pl)
{
    if (!r)
        return nt__err(NULL, NT_EINVAL, fn,
                       "'%s' holds no loss scaler state (it was saved without one); pass "
                       "scaler = NULL", path);
    if (r->nbytes != SCALER_BYTES || r->dtype != NT_U8 || get_u32(r->data) != 1u)
        return fmt_err(fn, path, "the loss scaler record has an unknown layout");
    return scaler_rec_state(fn, path, r, &pl->scaler);
}

/* The group record against the optimizer's groups: their number and sizes
 * must match (NT_ESHAPE).  A file without one (written before groups) has
 * one group, SGD's or AdamW's, whose values are the optimizer record's. */
static int plan_groups(const char *fn, const char *path, const ck_rec *grec, uint32_t kind,
                       nt_optim *o, ck_plan *pl)
{
    if (!grec) {
        if (kind != KIND_SGD && kind != KIND_ADAMW)
            return fmt_err(fn, path, "the %s optimizer record has no parameter group record",
                           kind_name(kind));
        if (o->ngroups != 1)
            return nt__err(NULL, NT_ESHAPE, fn, "'%s' holds 1 parameter group (a file written "
                           "before groups); the optimizer has %d", path, o->ngroups);
        return 0;
    }
    const uint8_t *p = grec->data;
    uint32_t ng = get_u32(p + 4);
    if ((int)ng != o->ngroups)
        return nt__err(NULL, NT_ESHAPE, fn, "'%s' holds %u parameter groups; the optimizer has %d",
                       path, ng, o->ngroups);
    for (uint32_t g = 0; g < ng; g++) {
        uint32_t n = get_u32(p + GROUPS_FIXED + (size_t)g * GROUP_BYTES + 4);
        if ((int)n != o->groups[g].n)
            return nt__err(NULL, NT_ESHAPE, fn, "'%s': parameter group %u holds %u parameters "
                           "in the checkpoint but %d here", path, g, n, o->groups[g].n);
    }
    pl->groups = p;
    return 0;
}

/* Group g's hyper-parameters as the file has them (the group record, or
 * the optimizer record of a file before groups: its initial_lr is
 * the lr, which nt_load replaces by the optimizer's own). */
static void group_rec_values(const ck_plan *pl, const uint8_t *meta, int g, double v[GROUP_NF])
{
    if (pl->groups) {
        const uint8_t *e = pl->groups + GROUPS_FIXED + (size_t)g * GROUP_BYTES;
        for (int k = 0; k < GROUP_NF; k++)
            v[k] = get_f64(e + 8 + 8 * k);
        return;
    }
    v[0] = get_f64(meta + 24), v[2] = get_f64(meta + 32), v[3] = get_f64(meta + 40);
    v[4] = get_f64(meta + 48), v[5] = get_f64(meta + 56), v[6] = get_f64(meta + 64);
    v[1] = v[0], v[7] = v[8] = v[9] = 0;
}

/* The state slot's bit in expected_state's mask (s0, s1, s2: 0, 1, 2). */
static int state_bit(uint32_t slot_) { return slot_ == SLOT_S2 ? 2 : (int)slot_; }

/* The state tensors (bits 0..2: s0, s1, s2; autograd/optim.h) parameter i
 * has after its first update, by the file's flags and its group's momentum. */
static unsigned expected_state(const ck_plan *pl, nt_optim *o, uint32_t mflags, int i)
{
    double v[GROUP_NF];
    int g = o->slots[i]->g;
    group_rec_values(pl, pl->meta, g, v);
    double momentum = v[2];
    switch (o->kind) {
    case KIND_SGD: return momentum != 0 ? 1u : 0u;
    case KIND_ADAMW:
    case KIND_ADAM: return 3u | (mflags & OPTF_AMSGRAD ? 4u : 0u);
    case KIND_RMSPROP: return 1u | (momentum > 0 ? 2u : 0u) | (mflags & OPTF_CENTERED ? 4u : 0u);
    default: return 1u;
    }
}

static int plan_load(const char *fn, const char *path, ck_recs *recs, nt_tensor *const *params,
                     int n, nt_optim *o, nt_grad_scaler *scaler, ck_plan *pl)
{
    int nparams = 0;
    ck_rec *meta = NULL, *srec = NULL, *grec = NULL;
    for (guint i = 0; i < recs->len; i++) {
        ck_rec *r = &recs->v[i];
        if (r->kind == REC_PARAM)
            nparams++;
        else if (r->kind == REC_OPT_META) {
            if (meta)
                return fmt_err(fn, path, "two optimizer records");
            meta = r;
        } else if (r->kind == REC_LOSS_SCALER) {
            if (srec)
                return fmt_err(fn, path, "two loss scaler records");
            srec = r;
        } else if (r->kind == REC_OPT_GROUPS) {
            if (grec)
                return fmt_err(fn, path, "two parameter group records");
            grec = r;
        }
    }
    if (scaler) {
        int rc = plan_scaler(fn, path, srec, pl);
        if (rc)
            return rc;
    }
    if (nparams != n)
        return nt__err(NULL, NT_ESHAPE, fn, "'%s' holds %d parameters; %d were passed", path,
                       nparams, n);
    if (o && !meta)
        return nt__err(NULL, NT_EINVAL, fn,
                       "'%s' holds no optimizer state (it was saved with opt = NULL); pass "
                       "opt = NULL to load only the parameters", path);
    uint32_t mflags = 0;
    if (o) {
        if (meta->nbytes < META_FIXED)
            return fmt_err(fn, path, "the optimizer record is %llu bytes, shorter than %d",
                           (unsigned long long)meta->nbytes, META_FIXED);
        const uint8_t *m = meta->data;
        uint32_t kind = get_u32(m), mn = get_u32(m + 8);
        mflags = get_u32(m + 4);
        if (meta->nbytes != META_FIXED + 8 * (uint64_t)mn)
            return fmt_err(fn, path, "the optimizer record's size does not match its %u parameters",
                           mn);
        if (kind != (uint32_t)o->kind)
            return nt__err(NULL, NT_EINVAL, fn, "'%s' holds %s state; the optimizer is %s",
                           path, kind_name(kind), kind_name(o->kind));
        if ((int)mn != o->n)
            return nt__err(NULL, NT_ESHAPE, fn,
                           "'%s' holds optimizer state for %u parameters; the optimizer has %d",
                           path, mn, o->n);
        int rc = plan_groups(fn, path, grec, kind, o, pl);
        if (rc)
            return rc;
        pl->meta = m;
        pl->psteps = calloc((size_t)o->n, sizeof *pl->psteps);
        pl->state = calloc((size_t)o->n * NSLOTS, sizeof *pl->state);
        if (!pl->psteps || !pl->state)
            return nt__err_hostmem(NULL, fn, "the optimizer state to load");
        for (int i = 0; i < o->n; i++)
            pl->psteps[i] = (int64_t)get_u64(m + META_FIXED + 8 * i);
    }
    pl->vals = calloc((size_t)n + 1, sizeof *pl->vals);
    if (!pl->vals)
        return nt__err_hostmem(NULL, fn, "the values to load");
    /* first every check, then every allocation */
    for (guint i = 0; i < recs->len; i++) {
        ck_rec *r = &recs->v[i];
        if (r->kind == REC_PARAM) {
            if (r->index >= (uint32_t)n || pl->vals[r->index] == (nt_tensor *)1)
                return fmt_err(fn, path, "parameter record with index %u (duplicate or out of range)",
                               r->index);
            nt_tensor *t = params[r->index];
            if (!t) { /* a named read leaves it */
                pl->vals[r->index] = (nt_tensor *)1;
                continue;
            }
            if (r->dtype != t->dtype || !same_shape(r, t))
                return mismatch(fn, path, "parameter", (int)r->index, r, t);
            if (t->expanded)
                return nt__err(NULL, NT_EINVAL, fn, "argument 'params[%u]' is an expanded view; "
                               "it cannot be written", r->index);
            pl->vals[r->index] = (nt_tensor *)1; /* seen */
        } else if (r->kind == REC_OPT_STATE && o) {
            if (r->index >= (uint32_t)o->n || r->slot >= NSLOTS ||
                pl->state[r->index * NSLOTS + r->slot])
                return fmt_err(fn, path, "optimizer state record (%u, %u) is duplicate or out of "
                               "range", r->index, r->slot);
            nt_tensor *p = o->slots[r->index]->p;
            bool master = (mflags & 2) && nt__optim_low_precision(p);
            nt_dtype want = r->slot == SLOT_MASTER || master ? NT_F32 : (nt_dtype)p->dtype;
            unsigned exp = expected_state(pl, o, mflags, (int)r->index);
            if ((r->slot == SLOT_MASTER && !master) ||
                (r->slot != SLOT_MASTER && !(exp >> state_bit(r->slot) & 1)))
                return fmt_err(fn, path, "optimizer state record (%u, %u) does not belong to this "
                               "optimizer's configuration", r->index, r->slot);
            if (r->dtype != want || !same_shape(r, p))
                return mismatch(fn, path, "optimizer state of parameter", (int)r->index, r, p);
            pl->state[r->index * NSLOTS + r->slot] = (nt_tensor *)1;
        }
    }
    if (o)
        for (int i = 0; i < o->n; i++) {
            nt_tensor **st = &pl->state[i * NSLOTS];
            if ((mflags & 2) && nt__optim_low_precision(o->slots[i]->p) && !st[SLOT_MASTER])
                return fmt_err(fn, path, "the master weight of parameter %d is missing", i);
            unsigned exp = expected_state(pl, o, mflags, i), got = 0;
            for (int k = 0; k < NSLOTS; k++)
                if (k != SLOT_MASTER && st[k])
                    got |= 1u << state_bit(k);
            if (got && got != exp)
                return fmt_err(fn, path, "parameter %d has only some of %s's state tensors", i,
                               kind_name(o->kind));
        }
    memset(pl->vals, 0, sizeof(nt_tensor *) * (size_t)n);
    if (pl->state)
        memset(pl->state, 0, sizeof(nt_tensor *) * (size_t)o->n * NSLOTS);
    /* each value goes on the device of the tensor it replaces, the
     * optimizer's state on its parameter's */
    for (guint i = 0; i < recs->len; i++) {
        ck_rec *r = &recs->v[i];
        if (r->kind == REC_PARAM && !params[r->index])
            continue;
        nt_tensor **dst = r->kind == REC_PARAM ? &pl->vals[r->index]
                          : r->kind == REC_OPT_STATE && o ? &pl->state[r->index * NSLOTS + r->slot]
                                                          : NULL;
        int dev = r->kind == REC_PARAM ? params[r->index]->dev
                  : dst                ? o->slots[r->index]->p->dev
                                       : 0;
        if (dst && !(*dst = rec_to_tensor(r, dev)))
            return load_failed(fn, path);
    }
    return 0;
}

static void plan_free(ck_plan *pl, int n, int nstate)
{
    if (pl->vals)
        for (int i = 0; i < n; i++)
            if (pl->vals[i] && pl->vals[i] != (nt_tensor *)1)
                nt_release(pl->vals[i]);
    if (pl->state)
        for (int i = 0; i < nstate; i++)
            if (pl->state[i] && pl->state[i] != (nt_tensor *)1)
                nt_release(pl->state[i]);
    free(pl->vals);
    free(pl->state);
    free(pl->psteps);
}

/* The install below queues one copy per parameter; each needs an op
 * record, and running out of host memory half-way would leave some
 * parameters loaded and others not.  So the records are taken first and
 * handed back to this thread's pool, where those copies find them. */
static int reserve_records(const char *fn, int n)
{
    nt__rec **r = calloc((size_t)n + 1, sizeof *r);
    if (!r)
        return nt__err_hostmem(NULL, fn, "the copies of the loaded values");
    nt_stream *s = nt__stream_current();
    int got = 0;
    while (got < n && (r[got] = nt__rec_alloc(s)) != NULL)
        got++;
    bool ok = got == n;
    while (got > 0)
        nt__rec_unalloc(r[--got]);
    free(r);
    return ok ? 0 : nt__err_hostmem(NULL, fn, "the copies of the loaded values");
}

/* "a", "b" and 3 more: up to 160 bytes of a list of names */
static void name_list(char *buf, size_t cap, char *const *names, int n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o < cap; i++) {
        if (o > 160) {
            snprintf(buf + o, cap - o, " and %d more", n - i);
            return;
        }
        o += (size_t)snprintf(buf + o, cap - o, "%s\"%s\"", i ? ", " : "", names[i]);
    }
}

/* The file's names (its names record, or "0", "1", ... for a file without
 * one) matched with the caller's: m[i] = the tensor that takes parameter
 * record i, NULL for one no name asks for.  Fills x->report; missing or
 * unexpected names fail a strict read (and a read with an optimizer); a
 * matched name with another dtype or shape fails it, naming both. */
typedef struct {
    int P;              /* parameter records */
    const char **fname; /* [P] the file's names (not NUL-terminated) */
    uint16_t *flen;
    char (*num)[12];    /* the positional names */
    ck_rec **byidx;     /* [P] parameter record i */
    char **miss, **unexp;
    int nmiss, nunexp;
} ck_names;

static void names_free(ck_names *k)
{
    free(k->fname);
    free(k->flen);
    free(k->num);
    free(k->byidx);
    for (int i = 0; i < k->nmiss; i++)
        free(k->miss[i]);
    for (int i = 0; i < k->nunexp; i++)
        free(k->unexp[i]);
    free(k->miss);
    free(k->unexp);
}

static int names_read(const char *fn, const char *path, ck_recs *recs, ck_names *k)
{
    ck_rec *nrec = NULL;
    for (guint i = 0; i < recs->len; i++) {
        k->P += recs->v[i].kind == REC_PARAM;
        if (recs->v[i].kind == REC_NAMES && nrec)
            return fmt_err(fn, path, "two names records");
        if (recs->v[i].kind == REC_NAMES)
            nrec = &recs->v[i];
    }
    size_t P = (size_t)k->P + 1;
    k->fname = calloc(P, sizeof *k->fname);
    k->flen = calloc(P, sizeof *k->flen);
    k->num = calloc(P, sizeof *k->num);
    k->byidx = calloc(P, sizeof *k->byidx);
    if (!k->fname || !k->flen || !k->num || !k->byidx)
        return nt__err_hostmem(NULL, fn, "the checkpoint's names");
    for (guint i = 0; i < recs->len; i++) {
        ck_rec *r = &recs->v[i];
        if (r->kind != REC_PARAM)
            continue;
        if (r->index >= (uint32_t)k->P || k->byidx[r->index])
            return fmt_err(fn, path, "parameter record with index %u (duplicate or out of range)",
                           r->index);
        k->byidx[r->index] = r;
    }
    if (nrec && get_u32(nrec->data) != (uint32_t)k->P)
        return fmt_err(fn, path, "the names record names %u tensors; the file holds %d",
                       get_u32(nrec->data), k->P);
    if (nrec)
        return walk_names(fn, path, nrec, k->fname, k->flen);
    for (int i = 0; i < k->P; i++) {
        snprintf(k->num[i], sizeof k->num[i], "%d", i);
        k->fname[i] = k->num[i];
        k->flen[i] = (uint16_t)strlen(k->num[i]);
    }
    return 0;
}

static int map_names(const char *fn, const char *path, ck_recs *recs, const ck_extra *x,
                     nt_tensor *const *params, int n, bool with_opt, nt_tensor ***out, int *np)
{
    ck_names k = {0};
    int rc = names_read(fn, path, recs, &k);
    nt_tensor **m = rc ? NULL : calloc((size_t)k.P + 1, sizeof *m);
    k.miss = calloc((size_t)n + 1, sizeof *k.miss);
    k.unexp = calloc((size_t)k.P + 1, sizeof *k.unexp);
    if (!rc && (!m || !k.miss || !k.unexp))
        rc = nt__err_hostmem(NULL, fn, "the name map");
    for (int j = 0; j < n && !rc; j++) {
        size_t len = strlen(x->names[j]);
        int i = 0;
        while (i < k.P && !(k.flen[i] == len && !memcmp(k.fname[i], x->names[j], len)))
            i++;
        if (i == k.P) {
            if (!(k.miss[k.nmiss++] = strdup(x->names[j])))
                rc = nt__err_hostmem(NULL, fn, "the report");
            continue;
        }
        ck_rec *r = k.byidx[i];
        nt_tensor *t = params[j];
        if (r->dtype != t->dtype || !same_shape(r, t)) {
            char a[128], b[128];
            nt__shape_str(r->ndim, r->shape, a, sizeof a);
            nt__shape_str(t->ndim, t->shape, b, sizeof b);
            rc = nt__err(NULL, NT_ESHAPE, fn, "'%s': tensor \"%s\" is %s %s in the file; the "
                         "tensor passed is %s %s", path, x->names[j],
                         nt_dtype_name((nt_dtype)r->dtype), a, nt_dtype_name((nt_dtype)t->dtype),
                         b);
        }
        m[i] = t;
    }
    for (int i = 0; i < k.P && !rc; i++)
        if (!m[i] && !(k.unexp[k.nunexp++] = strndup(k.fname[i], k.flen[i])))
            rc = nt__err_hostmem(NULL, fn, "the report");
    if (!rc && (x->strict || with_opt) && k.nmiss + k.nunexp) {
        char mb[256], ub[256];
        name_list(mb, sizeof mb, k.miss, k.nmiss);
        name_list(ub, sizeof ub, k.unexp, k.nunexp);
        rc = nt__err(NULL, NT_EINVAL, fn, "'%s': missing from the file: %s; in the file but not "
                     "passed: %s (%s)", path, *mb ? mb : "none", *ub ? ub : "none",
                     with_opt ? "an optimizer's state loads only when every name matches"
                              : "strict = false loads the names that match");
    }
    if (!rc && x->report) { /* the lists are the report's now */
        *x->report = (nt_load_report){.loaded = n - k.nmiss, .n_missing = k.nmiss,
                                      .n_unexpected = k.nunexp, .missing = k.miss,
                                      .unexpected = k.unexp};
        k.miss = k.unexp = NULL, k.nmiss = k.nunexp = 0;
    }
    *np = k.P;
    names_free(&k);
    if (rc) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* The generators' saved states, checked against the gens passed. */
static int plan_gens(const char *fn, const char *path, ck_recs *recs, const ck_extra *x,
                     const uint8_t **states)
{
    *states = NULL;
    if (!x->ngens)
        return 0;
    for (guint i = 0; i < recs->len; i++)
        if (recs->v[i].kind == REC_GENERATORS)
            *states = recs->v[i].data;
    if (!*states)
        return nt__err(NULL, NT_EINVAL, fn, "'%s' holds no generator state (it was saved "
                       "without one); pass ngens = 0", path);
    if (get_u32(*states) != (uint32_t)x->ngens)
        return nt__err(NULL, NT_ESHAPE, fn, "'%s' holds %u generators' states; %d were passed",
                       path, get_u32(*states), x->ngens);
    return 0;
}

static int load_impl(const char *fn, const char *path, nt_tensor *const *params, int n,
                     nt_optim *opt, nt_grad_scaler *scaler, const ck_extra *x)
{
    if (!nt__ensure_init())
        return nt_last_error();
    if (!path || !*path)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'path' is %s", path ? "empty" : "NULL");
    if (x->report)
        *x->report = (nt_load_report){0};
    if (!tensors_ok(fn, params, n, x) || (opt && !nt__optim_ok(opt, fn)) ||
        (scaler && !nt__scaler_ok(scaler, fn)) || (x->names && !names_ok(fn, x->names, n)) ||
        !gens_ok(fn, x->gens, x->ngens) || (x->fp8 && !nt__fp8_recipe_ok(x->fp8, fn)))
        return nt_last_error();
    uint8_t *buf;
    ck_recs recs_, *recs = &recs_;
    int rc = read_checked(fn, path, &buf, recs);
    if (rc)
        return rc;
    /* a named read: the tensors in the file's order, NULL where none */
    nt_tensor **mapped = NULL;
    const uint8_t *gstates = NULL;
    if (x->names)
        rc = map_names(fn, path, recs, x, params, n, opt != NULL, &mapped, &n);
    if (!rc)
        rc = plan_gens(fn, path, recs, x, &gstates);
    nt__fp8_state fst = {0};
    if (!rc)
        rc = plan_fp8(fn, path, recs, x->fp8, &fst);
    if (mapped)
        params = mapped;
    if (rc) {
        rec_free(recs, false);
        free(buf);
        return rc;
    }
    if (opt)
        g_mutex_lock(&opt->lock);
    ck_plan pl = {0};
    int nstate = opt ? opt->n * NSLOTS : 0;
    rc = plan_load(fn, path, recs, params, n, opt, scaler, &pl);
    if (!rc)
        rc = reserve_records(fn, n);
    if (!rc) {
        /* Everything is checked and staged: install it, each copy on its
         * tensor's device (the staged value is there too). */
        nt_no_grad_begin();
        for (int i = 0; i < n && !rc; i++) {
            if (!params[i])
                continue;
            nt__devsw dv;
            nt__dev_enter(&dv, params[i]->dev);
            rc = nt_copy_into_at(NULL, params[i], pl.vals[i]);
            nt__dev_leave(&dv);
        }
        nt_no_grad_end();
        if (rc)
            load_failed(fn, path);
        if (opt && !rc) {
            const uint8_t *m = pl.meta;
            uint32_t flags = get_u32(m + 4);
            opt->flags = flags & ~2u;
            opt->master = (flags & 2) != 0;
            opt->steps = (int64_t)get_u64(m + 16);
            for (int g = 0; g < opt->ngroups; g++) {
                double v[GROUP_NF];
                group_rec_values(&pl, m, g, v);
                if (!pl.groups) /* a file before groups: the base lr stays */
                    v[1] = opt->groups[g].initial_lr;
                group_set(&opt->groups[g], v);
            }
            for (int i = 0; i < opt->n; i++) {
                slot *s = opt->slots[i];
                nt_tensor **st[NSLOTS] = {&s->s0, &s->s1, &s->master, &s->s2};
                for (int k = 0; k < NSLOTS; k++) {
                    nt__optim_drop(st[k]);
                    *st[k] = pl.state[i * NSLOTS + k];
                    pl.state[i * NSLOTS + k] = NULL;
                }
                s->steps = pl.psteps[i];
            }
        }
    }
    if (scaler && !rc)
        nt__scaler_set_state(scaler, &pl.scaler);
    for (int i = 0; i < x->ngens && !rc; i++)
        nt_generator_set_state(x->gens[i], get_u64(gstates + GENS_FIXED + 16 * (size_t)i),
                               get_u64(gstates + GENS_FIXED + 16 * (size_t)i + 8));
    if (x->fp8 && !rc && (rc = nt__fp8_state_set(x->fp8, fn, &fst)) != 0)
        load_failed(fn, path);
    g_free(fst.data);
    if (opt)
        g_mutex_unlock(&opt->lock);
    plan_free(&pl, n, nstate);
    rec_free(recs, false);
    free(buf);
    free(mapped);
    if (rc && x->report)
        nt_load_report_clear(x->report);
    return rc;
}

NT_API int nt_load(const char *path, nt_tensor *const *params, int n, nt_optim *opt)
{
    return load_impl("nt_load", path, params, n, opt, NULL, &(ck_extra){0});
}

NT_API int nt_checkpoint_load(const char *path, nt_tensor *const *params, int n,
                              nt_optim *opt, nt_grad_scaler *scaler)
{
    return load_impl("nt_checkpoint_load", path, params, n, opt, scaler, &(ck_extra){0});
}

NT_API int nt_checkpoint_read(const char *path, const nt_checkpoint_spec *spec, bool strict,
                              nt_load_report *report)
{
    const char *fn = "nt_checkpoint_read";
    if (report)
        *report = (nt_load_report){0};
    if (!nt__ensure_init())
        return nt_last_error();
    if (!spec)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'spec' is NULL");
    ck_extra x = {.names = spec->names, .gens = spec->gens, .ngens = spec->ngens,
                  .strict = strict, .report = report, .fp8 = spec->fp8};
    int rc = load_impl(fn, path, spec->tensors, spec->n, spec->opt, spec->scaler, &x);
    if (!rc && report && !spec->names)
        report->loaded = spec->n; /* by position: every one */
    return rc;
}

NT_API void nt_load_report_clear(nt_load_report *r)
{
    if (!r)
        return;
    for (int i = 0; r->missing && i < r->n_missing; i++)
        free(r->missing[i]);
    for (int i = 0; r->unexpected && i < r->n_unexpected; i++)
        free(r->unexpected[i]);
    free(r->missing);
    free(r->unexpected);
    *r = (nt_load_report){0};
}

NT_API int nt_checkpoint_list(const char *path, nt_checkpoint_entry **entries, int *n)
{
    const char *fn = "nt_checkpoint_list";
    if (!nt__ensure_init())
        return nt_last_error();
    if (!path || !*path || !entries || !n)
        return nt__err(NULL, NT_EINVAL, fn, "argument '%s' is %s",
                       !path || !*path ? "path" : !entries ? "entries" : "n",
                       path && !*path ? "empty" : "NULL");
    *entries = NULL;
    *n = 0;
    uint8_t *buf;
    ck_recs recs_, *recs = &recs_;
    int rc = read_checked(fn, path, &buf, recs);
    if (rc)
        return rc;
    ck_names k = {0};
    rc = names_read(fn, path, recs, &k);
    nt_checkpoint_entry *e = rc ? NULL : calloc((size_t)k.P + 1, sizeof *e);
    if (!rc && !e)
        rc = nt__err_hostmem(NULL, fn, "the list");
    for (int i = 0; i < k.P && !rc; i++) {
        const ck_rec *r = k.byidx[i];
        e[i].dtype = (nt_dtype)r->dtype;
        e[i].ndim = r->ndim;
        memcpy(e[i].shape, r->shape, sizeof e[i].shape);
        if (!(e[i].name = strndup(k.fname[i], k.flen[i])))
            rc = nt__err_hostmem(NULL, fn, "the list");
    }
    if (rc && e) {
        nt_checkpoint_list_free(e, k.P);
        e = NULL;
    }
    if (!rc) {
        *entries = e;
        *n = k.P;
    }
    names_free(&k);
    rec_free(recs, false);
    free(buf);
    return rc;
}

NT_API void nt_checkpoint_list_free(nt_checkpoint_entry *entries, int n)
{
    for (int i = 0; entries && i < n; i++)
        free(entries[i].name);
    free(entries);
}
