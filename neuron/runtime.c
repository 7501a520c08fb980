/* neuron/runtime.c - the simulator as the runtime's default backend:
 * set-up, the kernel table, kernel begin/end with error mapping, HBM
 * scratch, and the tilers every kernel uses to map tensors onto tiles. */
#include "neuron/sk.h"
#include "sim/sim.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sim/trace.h"

/* ---------------- the kernel table ---------------- */

#define SK_EW(ID, name, nin, kind, flags, ...) [NT_OP_##ID] = nt__sk_ew,

/* Unsized: the assert below then sees a missing last row (a NULL entry
 * is an op left to the CPU: tests/test_simkernels.c lists them). */
static const nt__kernel_fn sk_table[] = {
    [NT_OP_FILL] = nt__sk_ew,
    [NT_OP_ARANGE] = nt__sk_arange,
    [NT_OP_RAND] = nt__sk_rand,
    [NT_OP_RANDN] = nt__sk_randn,
    NT_OPS_COPY(SK_EW)
    NT_OPS_UNARY(SK_EW)
    NT_OPS_SCALAR(SK_EW)
    NT_OPS_BINARY(SK_EW)
    NT_OPS_EW_BWD(SK_EW)
    NT_OPS_GRAD(SK_EW)
    NT_OPS_CMP(SK_EW)
    [NT_OP_WHERE] = nt__sk_ew,
    [NT_OP_SUM] = nt__sk_reduce,
    [NT_OP_MEAN] = nt__sk_reduce,
    [NT_OP_MAX] = nt__sk_reduce,
    [NT_OP_ARGMAX] = nt__sk_reduce,
    [NT_OP_SOFTMAX] = nt__sk_softmax,
    [NT_OP_LOG_SOFTMAX] = nt__sk_softmax,
    [NT_OP_LAYER_NORM] = nt__sk_norm,
    [NT_OP_RMS_NORM] = nt__sk_norm,
    [NT_OP_CROSS_ENTROPY] = nt__sk_cross_entropy,
    [NT_OP_MSE_LOSS] = nt__sk_mse_loss,
    [NT_OP_MATMUL] = nt__sk_matmul,
    [NT_OP_EMBEDDING] = nt__sk_embedding,
    [NT_OP_EMBEDDING_BWD] = nt__sk_embedding_bwd,
    [NT_OP_MIN] = nt__sk_reduce,
    [NT_OP_ARGMIN] = nt__sk_reduce,
    [NT_OP_ANY] = nt__sk_reduce,
    [NT_OP_NORM] = nt__sk_reduce,
    [NT_OP_GATHER] = nt__sk_gather,
    [NT_OP_INDEX_SELECT] = nt__sk_gather,
    [NT_OP_INDEX_ADD] = nt__sk_index_add,
    [NT_OP_TRIL] = nt__sk_ew,
    [NT_OP_TRIU] = nt__sk_ew,
    [NT_OP_MASKED_FILL] = nt__sk_ew,
    [NT_OP_DROPOUT] = nt__sk_dropout,
    [NT_OP_TOPK] = nt__sk_topk,
    [NT_OP_MULTINOMIAL] = nt__sk_multinomial,
    [NT_OP_SDPA] = nt__sk_sdpa,
    [NT_OP_SDPA_BWD] = nt__sk_sdpa_bwd,
    [NT_OP_AMAX] = nt__sk_reduce,
    [NT_OP_AMIN] = nt__sk_reduce,
    [NT_OP_CUMSUM] = nt__sk_scan,
    [NT_OP_CUMPROD] = nt__sk_scan,
    [NT_OP_LINREC] = nt__sk_scan,
    [NT_OP_ROPE] = nt__sk_rope,
    [NT_OP_SCATTER] = nt__sk_scatter,
    [NT_OP_SCATTER_ADD] = nt__sk_scatter,
    [NT_OP_CONV_GEMM] = nt__sk_conv_gemm,
    [NT_OP_CONV_WGRAD] = nt__sk_conv_wgrad,
    [NT_OP_BN_FWD] = nt__sk_batch_norm_fwd,
    [NT_OP_BN_BWD] = nt__sk_batch_norm_bwd,
    [NT_OP_GRAD_NORMS] = nt__sk_grad_norms,
    [NT_OP_GMM] = nt__sk_grouped_mm,
    [NT_OP_GMM_WGRAD] = nt__sk_grouped_mm_wgrad,
    [NT_OP_A2A_INDEX] = nt__sk_all_to_all_index,
    [NT_OP_MAX_POOL2D] = nt__sk_max_pool2d_fwd,
    [NT_OP_MAX_POOL2D_BWD] = nt__sk_max_pool2d_bwd,
};
#undef SK_EW

_Static_assert(sizeof sk_table / sizeof sk_table[0] == NT_OP_COUNT,
               "simulator kernel table out of step with the op table");

bool nt__sim_kernel_exists(int op) { return sk_table[op] != NULL; }

/* The table the backend runs: sk_table while the simulator is up, empty
 * otherwise (tests clear an entry to see the CPU fallback). */
nt__kernel_fn nt__sim_kernels[NT_OP_COUNT];

static int sim_init(void)
{
    int rc = nt_sim_init();
    if (rc == NT_EINVAL) { /* a bad NT_SIM_* variable: keep the reason */
        char m[1100];
        snprintf(m, sizeof m, "nt_init: %s", nt_last_error_message());
        nt__err_set(rc, m);
        return rc;
    }
    if (rc)
        return nt__err(NULL, rc, "nt_init", "the NeuronCore simulator failed to start (%s)",
                       nt_strerror(rc));
    memcpy(nt__sim_kernels, sk_table, sizeof sk_table);
    return 0;
}

static void sim_shutdown(void)
{
    memset(nt__sim_kernels, 0, sizeof nt__sim_kernels);
    nt__sk_memo_clear();
    nt_sim_shutdown();
}

/* ---------------- kernels ---------------- */

int sk_begin(sk_k *s, const char *name)
{
    memset(s, 0, sizeof *s);
    s->k = nt_sim_kernel_begin(name);
    if (!s->k)
        return nt__kerr(NT_EHOSTMEM, "out of host memory for a simulator kernel");
    /* in a captured program the kernel's SBUF tiles go away from the
     * kernels just before it (sim/sim.h, "Programs"); and sk_qin's and
     * sk_qout's round robins start at the queue of their eight
     * that frees up first: in a captured program the queues carry over from
     * the kernels before, and a run of small kernels (the 4-byte copies of
     * the gradient norms into one vector) each started on queue 0 and 8,
     * every one waiting for the last one's transfers; alone, all queues are
     * free and the start is 0, 8 as before */
    nt__sim_kernel_spread(s->k);
    const double *qf = s->k->q_free;
    for (int q = 1; q < 8; q++) {
        if (qf[q] < qf[s->qin])
            s->qin = q;
        if (qf[8 + q] < qf[8 + s->qout])
            s->qout = q;
    }
    return 0;
}

nt_engine sk_eng(sk_k *s)
{
    double v = nt__sim_kernel_engine_free(s->k, NT_ENGINE_VECTOR);
    double a = nt__sim_kernel_engine_free(s->k, NT_ENGINE_SCALAR);
    if (v != a)
        return v < a ? NT_ENGINE_VECTOR : NT_ENGINE_SCALAR;
    s->eng ^= 1;
    return s->eng ? NT_ENGINE_VECTOR : NT_ENGINE_SCALAR;
}

nt_engine sk_eng_ap(sk_k *s, const nt_ap *dst)
{
    (void)dst;
    return s->scalar_first ? NT_ENGINE_SCALAR : sk_eng(s);
}

double sk_clock_ghz(nt_engine e)
{
    return e >= 0 && e < NT_ENGINE_COUNT ? nt__sim.cfg.clock_ghz[e] : 0;
}

int sk_qfree(sk_k *s)
{
    int best = 0;
    for (int q = 1; q < NT_SIM_DMA_QUEUES; q++)
        if (s->k->q_free[q] < s->k->q_free[best])
            best = q;
    return best;
}

int sk_warm_act(sk_k *s, nt_act_func f)
{
    /* one scratch element per kernel, kept: released, its bytes would go to
     * the next tile, which would wait for the warming activation */
    bool fresh = !s->warm;
    if (fresh && !(s->warm = sk_tile(s, "act.warm", NT_F32, 1, 1)))
        return nt_sim_kernel_error(s->k);
    nt_ap a = nt_tile_ap(s->warm);
    int rc = fresh ? nt_isa_memset(s->k, &a, 1.0, NT_ENGINE_GPSIMD) : 0;
    return rc ? rc : nt_isa_activation(s->k, &a, f, &a, NULL, NULL, NULL);
}

bool sk_values_begin(sk_k *s)
{
    if (!nt__sim_program_values() || !nt__sim_kernel_functional(s->k))
        return false;
    nt__sim_kernel_set_functional(s->k, false);
    return true;
}

/* ---------------- the timing memo (sk.h) ---------------- */

typedef struct memo_ent {
    uint64_t hash;
    uint8_t *key;
    size_t len;
    nt__sim_ksnap snap;
    struct memo_ent *next;
} memo_ent;

#define MEMO_BUCKETS 4096           /* a power of two */
#define MEMO_MAX_BYTES (64u << 20)  /* keys and snapshots; then start over */

static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static memo_ent *memo_tab[MEMO_BUCKETS];
static size_t memo_bytes;
static uint64_t memo_hits, memo_filed;
static atomic_bool memo_off_set, memo_off; /* NT_SIM_MEMO=0, or the tests' switch */

static bool memo_on(void)
{
    if (!atomic_load_explicit(&memo_off_set, memory_order_acquire)) {
        const char *v = getenv("NT_SIM_MEMO");
        atomic_store(&memo_off, v && v[0] == '0');
        atomic_store_explicit(&memo_off_set, true, memory_order_release);
    }
    /* a timed program issues every instruction: its kernels overlap, so no
     * kernel's timing alone can stand for it; an untimed one (its timing is
     * known) issues none it can skip (memo_look) */
    if (nt__sim_program_active())
        return nt__sim_program_untimed();
    return !atomic_load(&memo_off) && !nt__trace_enabled();
}

void nt__sk_memo_set(bool on)
{
    atomic_store(&memo_off, !on);
    atomic_store_explicit(&memo_off_set, true, memory_order_release);
}

void nt__sk_memo_counts(uint64_t *hits, uint64_t *filed)
{
    pthread_mutex_lock(&memo_lock);
    *hits = memo_hits;
    *filed = memo_filed;
    pthread_mutex_unlock(&memo_lock);
}

static void memo_clear_locked(void)
{
    for (size_t b = 0; b < MEMO_BUCKETS; b++)
        for (memo_ent *e = memo_tab[b], *n; e; e = n) {
            n = e->next;
            nt__sim_ksnap_free(&e->snap);
            free(e->key);
            free(e);
        }
    memset(memo_tab, 0, sizeof memo_tab);
    memo_bytes = 0;
}

void nt__sk_memo_clear(void)
{
    pthread_mutex_lock(&memo_lock);
    memo_clear_locked();
    pthread_mutex_unlock(&memo_lock);
}

/* The key under construction: bytes appended in a fixed order. */
typedef struct kbuf {
    uint8_t *b;
    size_t n, cap;
    bool oom;
} kbuf;

static void kb_put(kbuf *k, const void *p, size_t n)
{
    if (k->oom)
        return;
    if (k->n + n > k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 1024;
        while (cap < k->n + n)
            cap *= 2;
        uint8_t *b = realloc(k->b, cap);
        if (!b) {
            k->oom = true;
            return;
        }
        k->b = b;
        k->cap = cap;
    }
    memcpy(k->b + k->n, p, n);
    k->n += n;
}

static void kb_i64(kbuf *k, int64_t v) { kb_put(k, &v, sizeof v); }

/* imm: the float scalars are only instruction operands (immediates, memset
 * values) in this program, which no rule or cost reads: left out, so that a
 * schedule's learning rate or AdamW's bias corrections, new every step, do
 * not make a new program.  Else their bits (-0 and NaN payloads distinct). */
static void kb_params(kbuf *k, const nt__params *p, bool imm)
{
    for (int i = 0; i < 3 && !imm; i++)
        kb_put(k, &p->f[i], sizeof p->f[i]);
    for (int i = 0; i < NT_MAX_DIMS; i++)
        kb_i64(k, p->i[i]);
    kb_i64(k, p->dim);
    kb_i64(k, p->flag);
    kb_put(k, &p->seed, sizeof p->seed);
}

/* Tensor t, the n-th of the record's tensor list seen[]: which earlier
 * operand it is (kernels compare handles), else everything a program reads
 * of it: dtype, shape, strides, its offset in its storage and which earlier
 * operand's storage it shares (kernels compare storages).  Not the address:
 * distinct storages never overlap, and nothing in the timing depends on
 * where a buffer is -- HBM pages count from each pattern's base and only
 * which patterns share a base matters (sim/core.c, hbm_pages). */
static void kb_tensor(kbuf *k, const nt_tensor *t, const nt_tensor **seen, int n)
{
    int same = -1;
    for (int i = 0; i < n && same < 0; i++)
        if (seen[i] == t)
            same = i;
    kb_i64(k, t ? same : -2);
    seen[n] = t;
    if (!t || same >= 0)
        return;
    kb_i64(k, ((int64_t)t->dtype << 24) | ((int64_t)(uint8_t)t->ndim << 16) |
                  ((int64_t)t->expanded << 8) | t->dev);
    kb_i64(k, t->offset);
    for (int d = 0; d < t->ndim; d++) {
        kb_i64(k, t->shape[d]);
        kb_i64(k, t->stride[d]);
    }
    int sst = -1; /* which earlier operand's storage it shares (kernels compare them) */
    for (int i = 0; i < n && sst < 0; i++)
        if (seen[i] && seen[i]->st == t->st)
            sst = i;
    kb_i64(k, sst);
}

/* A kernel's operands: its inputs a[0..na) then its outputs b[0..nb), each
 * by kb_tensor against the ones before it (seen: room for na + nb). */
static void kb_operands(kbuf *k, nt_tensor *const *a, int na, nt_tensor *const *b, int nb,
                        const nt_tensor **seen, int base)
{
    for (int i = 0; i < na; i++)
        kb_tensor(k, a[i], seen, base + i);
    for (int i = 0; i < nb; i++)
        kb_tensor(k, b[i], seen, base + na + i);
}

/* What every key starts with: the kind of kernel and the simulator's
 * settings a program may read. */
static void kb_head(kbuf *k, int kind)
{
    kb_i64(k, kind);
    kb_i64(k, (int64_t)nt__sim.cfg.target); /* the whole configuration (config_for) */
    kb_i64(k, nt__sim_program_gemm());
}

/* A word at a time (keys are whole 8-byte words), splitmix64's finaliser
 * per word: the bucket index; entries still compare the whole key. */
static uint64_t kb_hash(const kbuf *k)
{
    uint64_t h = (uint64_t)k->n;
    for (size_t i = 0; i + 8 <= k->n; i += 8) {
        uint64_t w;
        memcpy(&w, k->b + i, 8);
        uint64_t z = (h ^ w) + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        h = z ^ (z >> 31);
    }
    for (size_t i = k->n & ~(size_t)7; i < k->n; i++) /* none today */
        h = (h ^ k->b[i]) * 0x100000001b3ull;
    return h;
}

/* Looks the key up: a hit restores its timing into s's kernel and frees the
 * key; a miss keeps it in s for sk_values_end. */
static bool memo_look(sk_k *s, kbuf *k)
{
    (void)s;
    if (nt__sim_program_untimed()) { /* the program's snapshot has the time */
        free(k->b);
        return true;
    }
    if (k->oom) {
        free(k->b);
        return false;
    }
    uint64_t h = kb_hash(k);
    bool hit = false;
    pthread_mutex_lock(&memo_lock);
    for (memo_ent *e = memo_tab[h & (MEMO_BUCKETS - 1)]; e && !hit; e = e->next)
        if (e->hash == h && e->len == k->n && !memcmp(e->key, k->b, k->n)) {
            hit = nt__sim_kernel_restore(s->k, &e->snap);
            memo_hits += hit;
        }
    pthread_mutex_unlock(&memo_lock);
    if (hit) {
        free(k->b);
        return true;
    }
    s->mkey = k->b;
    s->mlen = k->n;
    s->mhash = h;
    return false;
}

static void kb_rec(kbuf *k, const nt__rec *r, bool imm, const nt_tensor **seen, int base)
{
    kb_i64(k, ((int64_t)r->op << 24) | ((int64_t)r->nin << 16) | ((int64_t)r->nout << 8) |
                  r->flags);
    kb_params(k, &r->p, imm);
    kb_operands(k, r->in, r->nin, r->out, r->nout, seen, base);
}

bool sk_memo_rec(sk_k *s, const nt__rec *r, bool imm)
{
    if (!memo_on())
        return false;
    kbuf k = {0};
    kb_head(&k, 1);
    const nt_tensor *seen[NT__MAX_IN + NT__MAX_OUT];
    kb_rec(&k, r, imm, seen, 0);
    return memo_look(s, &k);
}

static void kb_group(kbuf *k, const nt__fgroup *g, const nt_tensor **seen, int base);

bool sk_memo_group(sk_k *s, const nt__fgroup *g)
{
    if (!memo_on())
        return false;
    kbuf k = {0};
    kb_head(&k, 2);
    const nt_tensor *seen[NT_F_MAXEXT + NT_F_MAXOUT];
    kb_group(&k, g, seen, 0);
    return memo_look(s, &k);
}

/* A shared kernel's programs (neuron/foreach.c): each as above, their
 * operands compared across the programs too. */
bool sk_memo_list(sk_k *s, const nt__fgroup *const *g, int n)
{
    if (!memo_on())
        return false;
    int nt = 0;
    for (int i = 0; i < n; i++) {
        /* a stochastic-rounding cast draws from its record's key, new every
         * run: never filed (ew.c) */
        const nt__fprog *P = g[i]->prog;
        for (int k = 0; P && k < P->nops; k++)
            if (P->ops[k].op == NT_OP_CAST && (P->ops[k].p.flag & NT__CAST_SR))
                return false;
        const nt__rec *r = g[i]->recs[0];
        if (!P && r->op == NT_OP_CAST && (r->p.flag & NT__CAST_SR))
            return false;
        nt += P ? P->next + P->nout : r->nin + r->nout;
    }
    const nt_tensor **seen = malloc(sizeof *seen * (size_t)(nt > 0 ? nt : 1));
    if (!seen)
        return false;
    kbuf k = {0};
    kb_head(&k, 3);
    kb_i64(&k, n);
    for (int i = 0, base = 0; i < n; i++) {
        const nt__rec *r = g[i]->recs[0];
        if (g[i]->prog) {
            kb_group(&k, g[i], seen, base);
            base += g[i]->prog->next + g[i]->prog->nout;
        } else {
            kb_rec(&k, r, r->op != NT_OP_GRAD_NORMS, seen, base); /* ew.c: immediates */
            base += r->nin + r->nout;
        }
    }
    free(seen);
    return memo_look(s, &k);
}

static void kb_group(kbuf *k, const nt__fgroup *g, const nt_tensor **seen, int base)
{
    const nt__fprog *P = g->prog;
    kb_i64(k, P->kind);
    kb_i64(k, P->nops);
    kb_i64(k, P->nvals);
    kb_i64(k, P->next);
    kb_i64(k, P->nout);
    kb_i64(k, P->ndim);
    for (int d = 0; d < NT_MAX_DIMS; d++)
        kb_i64(k, P->shape[d]);
    for (int i = 0; i < P->nops; i++) {
        const nt__fop *o = &P->ops[i];
        kb_i64(k, (int64_t)((uint64_t)(uint8_t)o->a[3] << 56) | ((int64_t)o->op << 40) |
                       ((int64_t)o->nin << 32) |
                       ((int64_t)(uint8_t)o->a[0] << 24) | ((int64_t)(uint8_t)o->a[1] << 16) |
                       ((int64_t)(uint8_t)o->a[2] << 8) | (uint8_t)o->out);
        kb_params(k, &o->p, true); /* ew.c: scalars are immediates */
    }
    for (int i = 0; i < P->nvals; i++)
        kb_i64(k, ((int64_t)P->vals[i].dtype << 16) | ((int64_t)P->vals[i].red << 8) |
                       (uint8_t)P->vals[i].store);
    for (int i = 0; i < P->next; i++)
        kb_i64(k, ((int64_t)P->ext[i].dtype << 24) | ((int64_t)P->ext[i].red << 16) |
                       P->ext[i].bcast);
    for (int i = 0; i < P->nout; i++)
        kb_i64(k, P->out_val[i]);
    kb_operands(k, g->ext, P->next, g->out, P->nout, seen, base);
}

/* Files s's program under the key its miss kept, if it ran clean. */
static void memo_file(sk_k *s, int rc)
{
    uint8_t *key = s->mkey;
    s->mkey = NULL;
    if (!key)
        return;
    nt_sim_kernel *k = s->k;
    memo_ent *e = NULL;
    if (rc || nt_sim_kernel_error(k) || s->derr_code || s->nscratch || k->nfunc ||
        k->nopaque || nt__trace_enabled() || !(e = calloc(1, sizeof *e)) ||
        !nt__sim_kernel_snap(k, &e->snap)) {
        free(e);
        free(key);
        return;
    }
    e->hash = s->mhash;
    e->key = key;
    e->len = s->mlen;
    size_t bytes = sizeof *e + e->len + e->snap.n_iv * 2 * sizeof(double);
    pthread_mutex_lock(&memo_lock);
    if (memo_bytes + bytes > MEMO_MAX_BYTES)
        memo_clear_locked();
    memo_ent **b = &memo_tab[e->hash & (MEMO_BUCKETS - 1)];
    e->next = *b;
    *b = e;
    memo_bytes += bytes;
    memo_filed++;
    pthread_mutex_unlock(&memo_lock);
}

int sk_values_end(sk_k *s, int rc, int (*ref)(const void *arg), const void *arg)
{
    memo_file(s, rc);
    nt__sim_kernel_set_functional(s->k, true);
    if (rc || nt_sim_kernel_error(s->k))
        return rc;
    /* inside the kernel's window, so host_ns counts it (and host_values_ns:
     * what the program's values cost, apart from issuing and timing it); the
     * HBM it reads is final (earlier kernels flushed their functional work
     * at their end) */
    double t0 = nt__sim_now_ns();
    int r = ref(arg);
    s->k->values_ns += nt__sim_now_ns() - t0;
    return r;
}

int sk_ref_rec(const void *r)
{
    const nt__rec *rec = r;
    return nt__backends[NT_BACKEND_CPU]->kernels[rec->op](rec);
}

int sk_ref_fused(const void *g) { return nt__backends[NT_BACKEND_CPU]->run_fused(g); }

int sk_end_values(sk_k *s, bool values, int rc, const nt__rec *r)
{
    if (values)
        rc = sk_values_end(s, rc, sk_ref_rec, r);
    int rc2 = sk_end(s);
    return rc2 ? rc2 : rc;
}

int sk_data_error(sk_k *s, int code, const char *fmt, ...)
{
    if (s->derr_code)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->derr, sizeof s->derr, fmt, ap);
    va_end(ap);
    s->derr_code = code;
    return code;
}

void *sk_scratch(sk_k *s, size_t n)
{
    if (s->nscratch >= (int)G_N_ELEMENTS(s->scratch)) {
        sk_data_error(s, NT_ENOMEM, "too many scratch buffers in one kernel");
        return NULL;
    }
    nt__arena_host_failed(); /* forget an earlier failure */
    void *p = nt__arena_alloc_scratch(n ? n : 1, nt__sim_thread_core()); /* this core's HBM */
    if (!p && nt__arena_host_failed()) {
        sk_data_error(s, NT_EHOSTMEM, "out of host memory for %zu bytes of scratch", n);
        return NULL;
    }
    if (!p) {
        sk_data_error(s, NT_ENOMEM,
                      "device memory (HBM) is full: the kernel needs %zu bytes of scratch", n);
        return NULL;
    }
    s->scratch[s->nscratch] = p;
    s->scratch_bytes[s->nscratch++] = n ? n : 1;
    return p;
}

static unsigned trace_gen_seen;

int sk_end(sk_k *s)
{
    double t0 = nt__now_ns();
    free(s->mkey); /* a miss that never reached sk_values_end */
    s->mkey = NULL;
    nt_sim_report rep;
    int rc = nt_sim_kernel_end(s->k, &rep);
    s->k = NULL;
    for (int i = 0; i < s->nscratch; i++)
        nt__arena_free(s->scratch[i], s->scratch_bytes[i], nt__sim_thread_core());
    s->nscratch = 0;
    if (nt__trace_at(NT__TRACE_KERNEL)) {
        unsigned g = nt__trace_generation();
        /* kernels of several cores end at once: one names the track */
        if (__atomic_exchange_n(&trace_gen_seen, g, __ATOMIC_RELAXED) != g) {
            nt__trace_process_name(NT_TRACE_PID_HOST, "host", 2);
            nt__trace_thread_name(NT_TRACE_PID_HOST, 100, "simulator kernels (wall clock)", 100);
        }
        char args[256], q[96];
        nt__trace_json_str(q, sizeof q, rep.name);
        snprintf(args, sizeof args,
                 "{\"kernel\":%s,\"sim_start_us\":%.3f,\"sim_us\":%.3f,\"instructions\":%llu}", q,
                 rep.start_ns / 1e3, rep.duration_ns / 1e3, (unsigned long long)rep.instructions);
        (void)t0;
        /* on the host tracks' clock (debug/htrace.c): one origin per file */
        nt__trace_instant(NT_TRACE_PID_HOST, 100, rep.name, nt__htrace_now(), args);
    }
    if (s->derr_code)
        return nt__kerr(s->derr_code, "%s", s->derr);
    if (rc)
        return nt__kerr(rc, "simulator: %s", rep.message);
    return 0;
}

/* ---------------- views ---------------- */

void sk_hv_of(sk_hv *v, const nt_tensor *t, int ndim, const int64_t *shape)
{
    v->base = nt__tensor_data(t);
    v->dt = (nt_dtype)t->dtype;
    nt__bcast_strides(t, ndim, shape, v->st);
}

/* ---------------- the elementwise tiler ---------------- */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The DMA time of a scheme, roughly: per tile a load's fixed cost and its
 * bytes (4 per element) at the rate its partitions' engines give. */
static double tiler_cost(int64_t tiles, int64_t np, int64_t nf)
{
    int64_t eng = (np + 7) / 8;
    if (eng > 16)
        eng = 16;
    return (double)tiles * (2000.0 + (double)(np * nf * 4) / ((double)eng * 17.0));
}

/* The cost of T's scheme (tiles of it). */
static double tiler_scheme_cost(const sk_tiler *T, int64_t tiles)
{
    int n = T->nd, P = T->P;
    if (P == n - 1) {
        int64_t rows = cdiv(T->c[n - 1], T->cs);
        return tiler_cost(tiles, rows < 128 ? rows : 128, T->cs);
    }
    int64_t tail = 1;
    for (int i = P + 2; i < n; i++)
        tail *= T->c[i];
    return tiler_cost(tiles, T->c[P] < 128 ? T->c[P] : 128, T->cs * tail);
}

/* Iteration order is free for an elementwise program (every operand's
 * pattern moves with it), so the partition dim need not sit just before
 * the free dims: a permuted copy ([B, T, H, hd] -> [B, H, T, hd], the
 * heads of attention) had T on partitions and only hd = 32 on the free
 * axis, 64 tiles of 16 KiB each paying a DMA's fixed cost twice.  Tries
 * each dim q (not the innermost) on partitions with the other dims, in
 * their order, split into outer dims and free dims (the innermost among
 * these), and takes the order whose DMA time (tiler_cost) is clearly
 * below the scheme's, best tiles. */
static void tiler_reorder(sk_tiler *T, int64_t best)
{
    int n = T->nd;
    if (n < 3)
        return;
    double cur = tiler_scheme_cost(T, best), bc = 0.8 * cur;
    int bq = -1, bj = 0;
    int64_t bcs = 0;
    for (int q = 0; q < n - 1; q++) {
        int oth[NT_MAX_DIMS], no = 0;
        for (int i = 0; i < n; i++)
            if (i != q)
                oth[no++] = i;
        for (int j = 0; j < no; j++) {
            if (no - j > 4)
                continue;
            int64_t tail = 1, outer = 1;
            for (int i = j + 1; i < no; i++)
                tail *= T->c[oth[i]];
            for (int i = 0; i < j; i++)
                outer *= T->c[oth[i]];
            if (tail > T->fmax)
                continue;
            int64_t cs = T->fmax / tail;
            if (cs > T->c[oth[j]])
                cs = T->c[oth[j]];
            int64_t tiles = outer * cdiv(T->c[q], 128) * cdiv(T->c[oth[j]], cs);
            double cost = tiler_cost(tiles, T->c[q] < 128 ? T->c[q] : 128, cs * tail);
            if (cost < bc) {
                bc = cost;
                bq = q, bj = j;
                bcs = cs;
            }
        }
    }
    if (bq < 0)
        return;
    int order[NT_MAX_DIMS], no = 0;
    for (int i = 0; i < n; i++)
        if (i != bq)
            order[no++] = i;
    memmove(order + bj + 1, order + bj, (size_t)(no - bj) * sizeof *order);
    order[bj] = bq;
    int64_t c[NT_MAX_DIMS], st[SK_MAXOPND][NT_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        c[i] = T->c[order[i]];
        for (int k = 0; k < T->nop; k++)
            st[k][i] = T->st[k][order[i]];
    }
    memcpy(T->c, c, sizeof c);
    for (int k = 0; k < T->nop; k++)
        memcpy(T->st[k], st[k], sizeof st[k]);
    T->P = bj;
    T->cs = bcs;
}

void sk_tiler_init(sk_tiler *T, int nd, const int64_t *shape, int nop, const sk_hv *v,
                   int64_t fmax)
{
    memset(T, 0, sizeof *T);
    T->nop = nop;
    T->fmax = fmax < 1 ? 1 : fmax;
    for (int k = 0; k < nop; k++) {
        T->base[k] = v[k].base;
        T->dt[k] = v[k].dt;
    }
    /* collapse dims where every operand is contiguous across them; drop
     * size-1 dims */
    int n = 0;
    for (int i = 0; i < nd; i++) {
        if (shape[i] == 0) {
            T->nd = 0; /* empty */
            return;
        }
        if (shape[i] == 1)
            continue;
        bool merge = n > 0;
        for (int k = 0; k < nop && merge; k++)
            merge = T->st[k][n - 1] == v[k].st[i] * shape[i];
        if (merge) {
            T->c[n - 1] *= shape[i];
            for (int k = 0; k < nop; k++)
                T->st[k][n - 1] = v[k].st[i];
            continue;
        }
        T->c[n] = shape[i];
        for (int k = 0; k < nop; k++)
            T->st[k][n] = v[k].st[i];
        n++;
    }
    if (n == 0) {
        T->c[0] = 1;
        for (int k = 0; k < nop; k++)
            T->st[k][0] = 0;
        n = 1;
    }
    T->nd = n;
    /* scheme "split the last dim into rows of F" */
    int64_t L = T->c[n - 1], outer = 1;
    for (int i = 0; i < n - 1; i++)
        outer *= T->c[i];
    int64_t F = cdiv(L, 128);
    if (F > T->fmax)
        F = T->fmax;
    int64_t best = outer * cdiv(cdiv(L, F), 128);
    T->P = n - 1;
    T->cs = F;
    /* scheme "partitions over dim P, free dims P+1 .. (dim P+1 chunked)" */
    for (int P = n - 2; P >= 0 && P >= n - 5; P--) {
        int64_t tail = 1;
        for (int i = P + 2; i < n; i++)
            tail *= T->c[i];
        if (tail > T->fmax)
            break;
        int64_t cs = T->fmax / tail;
        if (cs > T->c[P + 1])
            cs = T->c[P + 1];
        int64_t o = 1;
        for (int i = 0; i < P; i++)
            o *= T->c[i];
        int64_t tiles = o * cdiv(T->c[P], 128) * cdiv(T->c[P + 1], cs);
        if (tiles < best) {
            best = tiles;
            T->P = P;
            T->cs = cs;
        }
    }
    tiler_reorder(T, best);
}

static nt_ap hbm_pat(const sk_tiler *T, int k, int64_t off, int np, int64_t pstep)
{
    nt_ap a;
    memset(&a, 0, sizeof a);
    a.hbm = T->base[k];
    a.dtype = T->dt[k];
    a.np = np;
    a.pstep = pstep;
    a.offset = off;
    return a;
}

/* One tile of rows of the innermost dim (d = n - 1): np partitions of nf
 * elements each, the first at element `first` of that dim, partition p at
 * `first + p * pstep`. */
static int row_tile(const sk_tiler *T, sk_tile_iter *it, const int64_t *off, int np,
                    int64_t nf, int64_t first, int64_t pstep,
                    int (*fn)(void *ctx, const sk_tile_iter *t), void *ctx)
{
    it->np = np;
    it->nf = nf;
    for (int k = 0; k < T->nop; k++) {
        int64_t s = T->st[k][T->nd - 1];
        it->ap[k] = hbm_pat(T, k, off[k] + first * s, np, pstep * s);
        it->ap[k].ndim = 1;
        it->ap[k].num[0] = nf;
        it->ap[k].step[0] = s;
    }
    return fn(ctx, it);
}

int sk_tiler_run(const sk_tiler *T, int (*fn)(void *ctx, const sk_tile_iter *t), void *ctx)
{
    if (T->nd == 0)
        return 0;
    int n = T->nd, P = T->P;
    int nouter = P == n - 1 ? n - 1 : P;
    int64_t idx[NT_MAX_DIMS] = {0};
    sk_tile_iter it;
    for (;;) {
        int64_t off[SK_MAXOPND];
        for (int k = 0; k < T->nop; k++) {
            off[k] = 0;
            for (int i = 0; i < nouter; i++)
                off[k] += idx[i] * T->st[k][i];
        }
        if (P == n - 1) {
            /* rows of F elements; tile t holds rows t * Pp .. t * Pp + Pp - 1,
             * one contiguous stretch of memory.  (Interleaving the tiles --
             * partition p of tile t on row p * nt + t -- put neighbouring
             * tiles' rows on the same 16 KiB HBM pages of the simulator's
             * dependency tracking, so an in-place update like AdamW's waited
             * for the previous tile's stores before loading the next tile.) */
            int64_t L = T->c[n - 1], F = T->cs, rows = L / F, rem = L % F;
            int64_t Pp = rows < 128 ? rows : 128, nt = Pp ? rows / Pp : 0;
            for (int64_t t = 0; t < nt; t++) {
                int rc = row_tile(T, &it, off, (int)Pp, F, t * Pp * F, F, fn, ctx);
                if (rc)
                    return rc;
            }
            for (int64_t r0 = Pp * nt; r0 < rows; r0 += 128) {
                int np = (int)(rows - r0 < 128 ? rows - r0 : 128);
                int rc = row_tile(T, &it, off, np, F, r0 * F, F, fn, ctx);
                if (rc)
                    return rc;
            }
            if (rem) {
                int rc = row_tile(T, &it, off, 1, rem, rows * F, 0, fn, ctx);
                if (rc)
                    return rc;
            }
        } else {
            int64_t tail = 1;
            for (int i = P + 2; i < n; i++)
                tail *= T->c[i];
            for (int64_t p0 = 0; p0 < T->c[P]; p0 += 128) {
                it.np = (int)(T->c[P] - p0 < 128 ? T->c[P] - p0 : 128);
                for (int64_t j0 = 0; j0 < T->c[P + 1]; j0 += T->cs) {
                    int64_t nf1 = T->c[P + 1] - j0 < T->cs ? T->c[P + 1] - j0 : T->cs;
                    it.nf = nf1 * tail;
                    for (int k = 0; k < T->nop; k++) {
                        it.ap[k] = hbm_pat(T, k, off[k] + p0 * T->st[k][P] + j0 * T->st[k][P + 1],
                                           it.np, T->st[k][P]);
                        it.ap[k].ndim = n - 1 - P;
                        it.ap[k].num[0] = nf1;
                        it.ap[k].step[0] = T->st[k][P + 1];
                        for (int i = P + 2; i < n; i++) {
                            it.ap[k].num[i - P - 1] = T->c[i];
                            it.ap[k].step[i - P - 1] = T->st[k][i];
                        }
                    }
                    int rc = fn(ctx, &it);
                    if (rc)
                        return rc;
                }
            }
        }
        if (!nt__idx_next(idx, nouter, T->c)) /* next outer index */
            break;
    }
    return 0;
}

/* ---------------- rows ---------------- */

int sk_rows_run(const sk_rows *R, int (*fn)(void *ctx, int64_t ioff, int64_t ooff, int np),
                void *ctx)
{
    if (R->C == 0)
        return 0;
    for (int i = 0; i < R->nouter; i++)
        if (R->oshape[i] == 0)
            return 0;
    int64_t idx[NT_MAX_DIMS] = {0};
    for (;;) {
        int64_t oi = 0, oo = 0;
        for (int i = 0; i < R->nouter; i++)
            oi += idx[i] * R->osi[i], oo += idx[i] * R->oso[i];
        for (int64_t c0 = 0; c0 < R->C; c0 += 128) {
            int np = (int)(R->C - c0 < 128 ? R->C - c0 : 128);
            int rc = fn(ctx, oi + c0 * R->sc, oo + c0 * R->oc, np);
            if (rc)
                return rc;
        }
        if (!nt__idx_next(idx, R->nouter, R->oshape))
            break;
    }
    return 0;
}

/* ---------------- shared tile programs ---------------- */

typedef struct contig_ctx {
    sk_k *s;
} contig_ctx;

static int contig_tile(void *ctx, const sk_tile_iter *t)
{
    sk_k *s = ((contig_ctx *)ctx)->s;
    return nt_isa_dma_copy(s->k, &t->ap[0], &t->ap[1], sk_qin(s));
}

int sk_hbm_contig(sk_k *s, const nt_tensor *t, void *dst)
{
    sk_hv v[2];
    v[0].base = dst;
    v[0].dt = (nt_dtype)t->dtype;
    nt__contig_strides(t->ndim, t->shape, v[0].st);
    sk_hv_of(&v[1], t, t->ndim, t->shape);
    sk_tiler T;
    sk_tiler_init(&T, t->ndim, t->shape, 2, v, 1 << 20);
    contig_ctx c = {s};
    return sk_tiler_run(&T, contig_tile, &c);
}

const void *sk_contig_of(sk_k *s, const nt_tensor *t)
{
    if (nt__is_contig(t))
        return nt__tensor_data(t);
    size_t n = (size_t)nt__numel(t->ndim, t->shape) * nt__dtype_size((nt_dtype)t->dtype);
    void *p = sk_scratch(s, n);
    if (!p)
        return NULL;
    if (sk_hbm_contig(s, t, p))
        return NULL;
    return p;
}

int sk_seq_combine(sk_k *s, const nt_ap *acc, const nt_ap *vals, nt_alu_op op)
{
    nt_sim_kernel *k = s->k;
    int np = vals->np;
    nt_tile *tp = nt_tile_alloc(k, "seq.T", NT_MEM_PSUM, NT_F32, 1, np);
    nt_tile *one = sk_tile(s, "seq.one", NT_F32, 1, 1);
    nt_tile *row = sk_tile(s, "seq.row", NT_F32, 1, np);
    if (!tp || !one || !row)
        return nt_sim_kernel_error(k);
    nt_ap T = nt_tile_ap(tp), O = nt_tile_ap(one), Rw = nt_tile_ap(row);
    nt_isa_nc_transpose(k, &T, vals);
    nt_isa_memset(k, &O, 1.0, NT_ENGINE_VECTOR);
    O.num[0] = np;
    O.step[0] = 0;
    nt_isa_tensor_tensor_scan(k, &Rw, &O, &T, &(nt_isa_scalar){acc, 0.0f}, NT_ALU_MUL, op);
    nt_ap last = nt_tile_slice(row, 0, 1, np - 1, 1);
    nt_isa_tensor_copy(k, acc, &last, NT_ENGINE_VECTOR);
    nt_tile_release(k, tp);
    nt_tile_release(k, one);
    nt_tile_release(k, row);
    return nt_sim_kernel_error(k);
}

int sk_fold(sk_k *s, const nt_ap *acc, const nt_ap *x, nt_alu_op op)
{
    nt_sim_kernel *k = s->k;
    int np = x->np;
    int64_t m = x->num[0];
    int64_t nbf = m / NT_RED_BLOCK, rem = m % NT_RED_BLOCK, nb = nbf + (rem > 0);
    nt_tile *part = sk_tile(s, "fold.part", NT_F32, np, nb);
    nt_tile *scan = sk_tile(s, "fold.scan", NT_F32, np, nb);
    nt_tile *one = sk_tile(s, "fold.one", NT_F32, np, 1);
    if (!part || !scan || !one)
        return nt_sim_kernel_error(k);
    int rc = 0;
    if (nbf) {
        nt_ap xb = *x;
        xb.ndim = 2;
        xb.num[0] = nbf, xb.step[0] = NT_RED_BLOCK * x->step[0];
        xb.num[1] = NT_RED_BLOCK, xb.step[1] = x->step[0];
        nt_ap p = nt_tile_slice(part, 0, np, 0, nbf);
        rc = nt_isa_tensor_reduce(k, &p, &xb, op, 1);
    }
    if (!rc && rem) {
        nt_ap xr = *x;
        xr.offset += nbf * NT_RED_BLOCK * x->step[0];
        xr.num[0] = rem;
        nt_ap p = nt_tile_slice(part, 0, np, nbf, 1);
        rc = nt_isa_tensor_reduce(k, &p, &xr, op, 0);
    }
    nt_ap o = nt_tile_ap(one);
    if (!rc)
        rc = nt_isa_memset(k, &o, 1.0, NT_ENGINE_GPSIMD);
    o.num[0] = nb;
    o.step[0] = 0;
    nt_ap p = nt_tile_ap(part), sc = nt_tile_ap(scan), last = nt_tile_slice(scan, 0, np, nb - 1, 1);
    if (!rc)
        rc = nt_isa_tensor_tensor_scan(k, &sc, &o, &p, &(nt_isa_scalar){acc, 0}, NT_ALU_MUL, op);
    if (!rc)
        rc = nt_isa_tensor_copy(k, acc, &last, NT_ENGINE_VECTOR);
    nt_tile_release(k, part);
    nt_tile_release(k, scan);
    nt_tile_release(k, one);
    return rc ? rc : nt_sim_kernel_error(k);
}

/* ---------------- nt_stats ---------------- */

static void sim_stats_fill(nt_stats *out)
{
    nt_sim_stats st;
    if (nt_sim_stats_get(&st))
        return;
    out->sim_kernels = st.kernels;
    out->sim_time_ns = (uint64_t)st.sim_ns;
    out->sim_hbm_bytes = st.hbm_read_bytes + st.hbm_write_bytes;
}

static void sim_stats_clear(void) { nt_sim_stats_reset(); }

/* ---------------- the backend ---------------- */

/* Attention runs here only when a head fits SBUF (the tile program keeps
 * one resident); every other op its table has, whatever the parameters. */
static const bool sim_checked[NT_OP_COUNT] = {[NT_OP_SDPA] = true, [NT_OP_SDPA_BWD] = true,
                                               [NT_OP_ROPE] = true};

static bool sim_supports(int op, const nt__params *p)
{
    return op == NT_OP_ROPE ? nt__sk_rope_fits(p) : nt__sk_sdpa_fits(op, p);
}

const nt__backend_i nt__sim_backend = {
    .name = "sim",
    .init = sim_init,
    .shutdown = sim_shutdown,
    .kernels = nt__sim_kernels,
    /* every op its table has, whatever the parameters (stochastic-rounding
     * casts included), except attention that does not fit SBUF */
    .supports = sim_supports,
    .checked = sim_checked,
    .custom_kernel = nt__sk_custom_kernel,
    .run_fused = nt__sk_fused,
    .kernel_open = nt__sk_join_open,
    .kernel_close = nt__sk_join_close,
    .stats_fill = sim_stats_fill,
    .stats_clear = sim_stats_clear,
};
