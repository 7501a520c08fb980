/* dispatcher/api_einsum.c - nt_einsum (issue 33): torch.einsum lowered to
 * ops that already give the same bits on every backend and mode
 * (nt_diagonal, nt_permute, nt_reshape, nt_sum_dims, nt_mul, nt_matmul), so
 * its values and gradients are those ops'.  The lowering is the op's
 * definition: docs/ops.md, "einsum", says which dims are summed first,
 * which go to the matmul's K and in which order.
 *
 * The equation is checked and the whole contraction is planned once with no
 * tensor made (a dry run of the same steps), so a bad call queues nothing;
 * then the steps run on the operands. */
#include <stdlib.h>
#include <string.h>

#include "dispatcher/dispatch.h"

/* Symbols: the letters 'A'..'Z', 'a'..'z' are 0..51 (ASCII order); the dims
 * a '...' covers are EI_NL + j, j = 0 .. E-1, right-aligned across the
 * operands (an operand whose '...' covers e dims has the last e). */
enum { EI_NL = 52, EI_NSYM = EI_NL + NT_MAX_DIMS };

/* a tensor's dims as symbols, with their sizes */
typedef struct {
    int nd;
    int8_t sym[NT_MAX_DIMS];
    int64_t sz[NT_MAX_DIMS];
} ei_term;

/* an operand's subscripts as written: its letters and where its '...' is */
typedef struct {
    int nl, ep; /* letters; the letter count before '...' (-1: none) */
    int8_t l[NT_MAX_DIMS];
} ei_sub;

typedef struct {
    const nt_site *site;
    const char *fn, *eq, *rhs; /* rhs: the output's subscripts, NULL if implicit */
    nt_tensor *const *ops;
    int n, ell;   /* operands; E, the most dims a '...' covers */
    bool dry;     /* plan only: no tensor is made */
    ei_sub *sub;
    ei_term out;
    int64_t size[EI_NSYM]; /* a symbol's size (the largest of its dims); -1: absent */
    int src[EI_NSYM];      /* the operand that gave it */
    int cnt[EI_NSYM];      /* occurrences in the operands */
    int last[EI_NSYM];     /* the last operand holding it */
    int rank[EI_NSYM];     /* position in the global order */
    bool in_out[EI_NSYM];
} ei_ctx;

typedef struct {
    nt_tensor *t;
    ei_term k;
} ei_val;

static int ei_sym(char ch) { return ch >= 'a' ? 26 + (ch - 'a') : ch - 'A'; }

static bool ei_letter(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

/* a symbol as the user wrote it: a letter, or the '...' dims */
static const char *ei_name(int s, char *buf)
{
    if (s >= EI_NL)
        return "of '...'";
    buf[0] = '\'';
    buf[1] = (char)(s < 26 ? 'A' + s : 'a' + s - 26);
    buf[2] = '\'';
    buf[3] = 0;
    return buf;
}

/* ---------------- the equation ---------------- */

/* the characters: letters, spaces, ',' between operands, one '...' per
 * operand and in the output, one '->'; counts the operands */
static bool ei_scan(ei_ctx *c, int *nops)
{
    const char *e = c->eq, *fn = c->fn;
    int ops = 1, ell = 0;
    bool arrow = false;
    for (int i = 0; e[i]; i++) {
        char ch = e[i];
        if (ch == ' ' || ei_letter(ch))
            continue;
        if (ch == '.') {
            if (e[i + 1] != '.' || e[i + 2] != '.')
                return !nt__err(c->site, NT_EINVAL, fn, "argument 'equation' has a '.' at index "
                                "%d that is not part of an ellipsis '...'", i);
            if (ell++)
                return !nt__err(c->site, NT_EINVAL, fn, "argument 'equation' has a second '...' "
                                "at index %d, in %s; expected at most one per operand and one in "
                                "the output", i, arrow ? "the output" : "an operand");
            i += 2;
        } else if (ch == ',' && !arrow) {
            ops++;
            ell = 0;
        } else if (ch == '-' && e[i + 1] == '>') {
            if (arrow)
                return !nt__err(c->site, NT_EINVAL, fn, "argument 'equation' has a second '->' "
                                "at index %d; expected at most one", i);
            arrow = true;
            ell = 0;
            i++;
        } else if (ch == ',') {
            return !nt__err(c->site, NT_EINVAL, fn, "argument 'equation' has ',' at index %d, "
                            "in the output (after '->'); expected one output", i);
        } else if (ch == '-' || ch == '>') {
            return !nt__err(c->site, NT_EINVAL, fn, "argument 'equation' has a '%c' at index %d "
                            "that is not part of an arrow '->'", ch, i);
        } else {
            return !nt__err(c->site, NT_EINVAL, fn, "argument 'equation' has the character "
                            "0x%02x ('%c') at index %d; expected subscripts in [a-zA-Z], ',', "
                            "'...', '->' or spaces", (unsigned char)ch,
                            ch >= 0x20 && ch < 0x7f ? ch : '?', i);
        }
    }
    *nops = ops;
    return true;
}

/* each operand's subscripts against its dims; finds E and the output */
static bool ei_subs(ei_ctx *c)
{
    const char *e = c->eq;
    int i = 0;
    for (int k = 0; k < c->n; k++, i++) {
        ei_sub *s = &c->sub[k];
        s->nl = 0;
        s->ep = -1;
        for (; e[i] && e[i] != ',' && e[i] != '-'; i++)
            if (e[i] == '.') {
                s->ep = s->nl;
                i += 2;
            } else if (e[i] != ' ') {
                if (s->nl < NT_MAX_DIMS)
                    s->l[s->nl] = (int8_t)ei_sym(e[i]);
                s->nl++;
            }
        int nd = c->ops[k]->ndim;
        if (s->ep < 0 ? s->nl != nd : s->nl > nd)
            return !nt__err(c->site, NT_ESHAPE, c->fn, "operands[%d] has %d dims but the "
                            "equation gives it %d subscripts%s; expected %s %d", k, nd, s->nl,
                            s->ep < 0 ? " and no '...'" : " and a '...'",
                            s->ep < 0 ? "one per dim:" : "at most", nd);
        if (s->ep >= 0 && nd - s->nl > c->ell)
            c->ell = nd - s->nl;
    }
    c->rhs = e[i - 1] == '-' ? e + i + 1 : NULL;
    return true;
}

/* operand k's dims as symbols; the sizes of every symbol */
static bool ei_term_of(ei_ctx *c, int k, ei_term *t)
{
    const ei_sub *s = &c->sub[k];
    const nt_tensor *x = c->ops[k];
    int ne = x->ndim - s->nl, d = 0;
    for (int j = 0; j < s->nl; j++) {
        if (j == s->ep)
            for (int q = 0; q < ne; q++)
                t->sym[d++] = (int8_t)(EI_NL + c->ell - ne + q);
        t->sym[d++] = s->l[j];
    }
    if (s->ep == s->nl)
        for (int q = 0; q < ne; q++)
            t->sym[d++] = (int8_t)(EI_NL + c->ell - ne + q);
    t->nd = d;
    char b1[4];
    for (d = 0; d < t->nd; d++) {
        int y = t->sym[d];
        int64_t z = t->sz[d] = x->shape[d];
        for (int d0 = 0; d0 < d; d0++)
            if (t->sym[d0] == y && t->sz[d0] != z)
                return !nt__err(c->site, NT_ESHAPE, c->fn, "subscript %s is repeated in "
                                "operands[%d] over dims %d and %d of sizes %lld and %lld; "
                                "expected equal sizes (a diagonal)", ei_name(y, b1), k, d0, d,
                                (long long)t->sz[d0], (long long)z);
        c->cnt[y]++;
        c->last[y] = k;
        if (c->size[y] < 0 || c->size[y] == 1) {
            if (c->size[y] != z)
                c->src[y] = k;
            c->size[y] = z;
        } else if (z != 1 && z != c->size[y]) {
            return !nt__err(c->site, NT_ESHAPE, c->fn, "subscript %s has size %lld in dim %d of "
                            "operands[%d] but %lld in operands[%d]; expected equal sizes or 1",
                            ei_name(y, b1), (long long)z, d, k, (long long)c->size[y], c->src[y]);
        }
    }
    return true;
}

/* the output's symbols: the explicit ones, or the '...' dims then the
 * letters that occur once, in ASCII order */
static bool ei_output(ei_ctx *c)
{
    ei_term *o = &c->out;
    int nd = 0;
    char b1[4];
    if (!c->rhs) {
        for (int s = 0; s < c->ell; s++) /* c->ell <= NT_MAX_DIMS */
            o->sym[nd++] = (int8_t)(EI_NL + s);
        for (int s = 0; s < EI_NL; s++)
            if (c->cnt[s] == 1) {
                if (nd < NT_MAX_DIMS)
                    o->sym[nd] = (int8_t)s;
                nd++;
            }
    } else {
        for (const char *p = c->rhs; *p; p++) {
            if (*p == ' ')
                continue;
            int ns = 1, s0 = ei_sym(*p);
            if (*p == '.') {
                ns = c->ell;
                s0 = EI_NL;
                p += 2;
            } else if (c->size[s0] < 0) {
                return !nt__err(c->site, NT_EINVAL, c->fn, "output subscript %s appears in no "
                                "operand; expected subscripts of the operands",
                                ei_name(s0, b1));
            } else if (c->in_out[s0]) {
                return !nt__err(c->site, NT_EINVAL, c->fn, "output subscript %s appears more "
                                "than once; expected each at most once", ei_name(s0, b1));
            }
            for (int s = s0; s < s0 + ns; s++) {
                c->in_out[s] = true;
                if (nd < NT_MAX_DIMS)
                    o->sym[nd] = (int8_t)s;
                nd++;
            }
        }
    }
    if (nd > NT_MAX_DIMS)
        return !nt__err(c->site, NT_ESHAPE, c->fn, "the output would have %d dims; a tensor "
                        "has at most %d (NT_MAX_DIMS)", nd, NT_MAX_DIMS);
    o->nd = nd;
    for (int d = 0; d < nd; d++) {
        c->in_out[o->sym[d]] = true;
        o->sz[d] = c->size[o->sym[d]];
    }
    return true;
}

/* the global order: the output's symbols in its order, then the summed
 * '...' dims, then the summed letters in ASCII order */
static void ei_ranks(ei_ctx *c)
{
    int r = 0;
    for (int d = 0; d < c->out.nd; d++)
        c->rank[c->out.sym[d]] = r++;
    for (int s = EI_NL; s < EI_NSYM; s++)
        if (c->size[s] >= 0 && !c->in_out[s])
            c->rank[s] = r++;
    for (int s = 0; s < EI_NL; s++)
        if (c->size[s] >= 0 && !c->in_out[s])
            c->rank[s] = r++;
}

/* the whole equation, against the operands */
static bool ei_parse(ei_ctx *c, ei_term *in)
{
    int nops = 0;
    if (!ei_scan(c, &nops))
        return false;
    if (nops != c->n)
        return !nt__err(c->site, NT_EINVAL, c->fn, "argument 'n' is %d but the equation names "
                        "%d operand%s; expected one tensor per operand", c->n, nops,
                        nops == 1 ? "" : "s");
    for (int k = 0; k < c->n; k++) {
        nt_dtype dt = (nt_dtype)c->ops[k]->dtype, d0 = (nt_dtype)c->ops[0]->dtype;
        if (!nt__dtype_is_float(dt))
            return !nt__err(c->site, NT_EDTYPE, c->fn, "operands[%d] is %s; expected a "
                            "floating dtype (f32, bf16, f16)", k, nt_dtype_name(dt));
        if (dt != d0)
            return !nt__err(c->site, NT_EDTYPE, c->fn, "operands[%d] is %s but operands[0] is "
                            "%s; expected one dtype", k, nt_dtype_name(dt), nt_dtype_name(d0));
    }
    if (!ei_subs(c))
        return false;
    for (int s = 0; s < EI_NSYM; s++)
        c->size[s] = -1, c->last[s] = -1;
    for (int k = 0; k < c->n; k++)
        if (!ei_term_of(c, k, &in[k]))
            return false;
    if (!ei_output(c))
        return false;
    ei_ranks(c);
    return true;
}

/* ---------------- the steps ---------------- */

static bool ei_kept(const ei_ctx *c, int s, int i) { return c->in_out[s] || c->last[s] > i; }

static int ei_find(const ei_term *t, int s)
{
    for (int d = 0; d < t->nd; d++)
        if (t->sym[d] == s)
            return d;
    return -1;
}

/* v's dims put in the global order (a view) */
static bool ei_reorder(ei_ctx *c, ei_val *v)
{
    int perm[NT_MAX_DIMS], nd = v->k.nd;
    bool id = true;
    ei_term k = v->k;
    for (int d = 0; d < nd; d++)
        perm[d] = d;
    for (int d = 1; d < nd; d++) /* insertion sort by rank */
        for (int j = d; j > 0 && c->rank[k.sym[perm[j - 1]]] > c->rank[k.sym[perm[j]]]; j--) {
            int t = perm[j];
            perm[j] = perm[j - 1];
            perm[j - 1] = t;
            id = false;
        }
    for (int d = 0; d < nd; d++) {
        v->k.sym[d] = k.sym[perm[d]];
        v->k.sz[d] = k.sz[perm[d]];
    }
    if (!id && !c->dry)
        v->t = nt_permute_at(c->site, v->t, perm);
    return c->dry || v->t;
}

/* operand k with a repeated subscript's diagonal taken (first two dims
 * with one symbol, the diagonal a last dim, until none repeats), its dims
 * in the global order: views */
static bool ei_prepare(ei_ctx *c, int k, const ei_term *in, ei_val *v)
{
    v->t = c->ops[k];
    v->k = *in;
    for (int d1 = 0; d1 < v->k.nd; d1++)
        for (int d2 = d1 + 1; d2 < v->k.nd; d2++) {
            if (v->k.sym[d1] != v->k.sym[d2])
                continue;
            ei_term t = v->k;
            int n = 0;
            for (int d = 0; d < t.nd; d++)
                if (d != d1 && d != d2) {
                    v->k.sym[n] = t.sym[d];
                    v->k.sz[n++] = t.sz[d];
                }
            v->k.sym[n] = t.sym[d1];
            v->k.sz[n++] = t.sz[d1];
            v->k.nd = n;
            if (!c->dry && !(v->t = nt_diagonal_at(c->site, v->t, 0, d1, d2)))
                return false;
            d1 = -1; /* start again */
            break;
        }
    return ei_reorder(c, v);
}

/* v without the dims in drop[]: summed by nt_sum_dims (ascending dims, so
 * the flattened row is in the global order), or (sum false) dims of size 1
 * removed by a reshape */
static bool ei_remove(ei_ctx *c, ei_val *v, const bool *drop, bool sum, bool *computed)
{
    int dims[NT_MAX_DIMS], nr = 0, n = 0;
    int64_t sh[NT_MAX_DIMS];
    for (int d = 0; d < v->k.nd; d++)
        if (drop[d]) {
            dims[nr++] = d;
        } else {
            v->k.sym[n] = v->k.sym[d];
            sh[n] = v->k.sz[n] = v->k.sz[d];
            n++;
        }
    v->k.nd = n;
    if (!nr || c->dry)
        return true;
    if (sum)
        *computed = true;
    v->t = sum ? nt_sum_dims_at(c->site, v->t, nr, dims, false) : nt_reshape_at(c->site, v->t, n, sh);
    return v->t != NULL;
}

/* the product of the pair's groups: R [batch, M, K] and B [batch, K, N],
 * as one batched matmul [b, m, k] . [b, k, n] viewed [batch, M, N], or (no
 * K) as nt_mul of R [batch, M, 1...] and B [batch, 1..., N] */
static nt_tensor *ei_product(ei_ctx *c, ei_val *r, ei_val *b, const int *pr, const int *pb,
                             const int *ng)
{
    int nb = ng[0], nm = ng[1], nk = ng[2], nn = ng[3];
    nt_tensor *rt = nt_permute_at(c->site, r->t, pr), *bt = nt_permute_at(c->site, b->t, pb);
    int64_t g[4] = {1, 1, 1, 1}, shr[NT_MAX_DIMS], shb[NT_MAX_DIMS], sho[NT_MAX_DIMS];
    for (int d = 0; d < nb + nm + nk; d++) {
        int64_t z = r->k.sz[pr[d]];
        g[d < nb ? 0 : d < nb + nm ? 1 : 2] *= z;
        shr[d] = sho[d] = z;
    }
    for (int d = nb + nk; d < nb + nk + nn; d++) {
        g[3] *= sho[d - nk + nm] = b->k.sz[pb[d]];
        shb[d - nk + nm] = sho[d - nk + nm];
    }
    if (!rt || !bt)
        return NULL;
    if (!nk) {
        for (int d = 0; d < nb + nm + nn; d++) {
            shb[d] = d < nb ? sho[d] : d < nb + nm ? 1 : shb[d];
            shr[d] = d < nb + nm ? shr[d] : 1;
        }
        return nt_mul_at(c->site, nt_reshape_at(c->site, rt, nb + nm + nn, shr),
                         nt_reshape_at(c->site, bt, nb + nm + nn, shb));
    }
    int64_t s3r[3] = {g[0], g[1], g[2]}, s3b[3] = {g[0], g[2], g[3]};
    nt_tensor *p = nt_matmul_at(c->site, nt_reshape_at(c->site, rt, 3, s3r),
                                nt_reshape_at(c->site, bt, 3, s3b));
    return nt_reshape_at(c->site, p, nb + nm + nn, sho);
}

/* R (operands 0 .. i-1 contracted) with operand i, B: (1) a shared symbol
 * of size 1 on one side and more on the other is removed from the size-1
 * side (it broadcasts); (2) symbols on one side only that neither the
 * output nor a later operand holds are summed there; (3) the rest is
 * grouped: batch (both sides, kept), M (R only), K (both, not kept), N (B
 * only), each in the global order, and multiplied; (4) the result is put
 * in the global order */
static bool ei_pair(ei_ctx *c, ei_val *r, ei_val *b, int i, bool *computed)
{
    bool drop[NT_MAX_DIMS];
    for (int side = 0; side < 2; side++) {
        ei_val *u = side ? b : r, *o = side ? r : b;
        for (int d = 0; d < u->k.nd; d++) {
            int od = ei_find(&o->k, u->k.sym[d]);
            drop[d] = od >= 0 && u->k.sz[d] == 1 && o->k.sz[od] != 1;
        }
        if (!ei_remove(c, u, drop, false, computed))
            return false;
    }
    for (int side = 0; side < 2; side++) {
        ei_val *u = side ? b : r, *o = side ? r : b;
        for (int d = 0; d < u->k.nd; d++)
            drop[d] = ei_find(&o->k, u->k.sym[d]) < 0 && !ei_kept(c, u->k.sym[d], i);
        if (!ei_remove(c, u, drop, true, computed))
            return false;
    }
    int pr[NT_MAX_DIMS], pb[NT_MAX_DIMS], ng[4] = {0}, np = 0, nq = 0;
    for (int g = 0; g < 3; g++) /* R: batch, M, K; B: batch, K, then N */
        for (int d = 0; d < r->k.nd; d++) {
            int s = r->k.sym[d], bd = ei_find(&b->k, s);
            int grp = bd < 0 ? 1 : ei_kept(c, s, i) ? 0 : 2;
            if (grp != g)
                continue;
            pr[np++] = d;
            ng[g]++;
            if (g != 1)
                pb[nq++] = bd;
        }
    for (int d = 0; d < b->k.nd; d++)
        if (ei_find(&r->k, b->k.sym[d]) < 0) {
            pb[nq++] = d;
            ng[3]++;
        }
    ei_term t = {.nd = ng[0] + ng[1] + ng[3]};
    if (t.nd > NT_MAX_DIMS)
        return !nt__err(c->site, NT_ESHAPE, c->fn, "contracting operands[0..%d] would hold %d "
                        "dims; a tensor has at most %d (NT_MAX_DIMS)", i, t.nd, NT_MAX_DIMS);
    for (int d = 0; d < t.nd; d++) { /* batch and M from R, N from B */
        bool fr = d < ng[0] + ng[1];
        const ei_term *src = fr ? &r->k : &b->k;
        int sd = fr ? pr[d] : pb[d - ng[1] + ng[2]];
        t.sym[d] = src->sym[sd];
        t.sz[d] = src->sz[sd];
    }
    *computed = true;
    if (!c->dry && !(r->t = ei_product(c, r, b, pr, pb, ng)))
        return false;
    r->k = t;
    return ei_reorder(c, r);
}

/* the contraction, left to right (dry: the plan only) */
static nt_tensor *ei_run(ei_ctx *c, const ei_term *in)
{
    ei_val r, b;
    bool computed = false;
    if (!ei_prepare(c, 0, &in[0], &r))
        return NULL;
    if (c->n == 1) {
        bool drop[NT_MAX_DIMS];
        for (int d = 0; d < r.k.nd; d++)
            drop[d] = !c->in_out[r.k.sym[d]];
        if (!ei_remove(c, &r, drop, true, &computed))
            return NULL;
    }
    for (int i = 1; i < c->n; i++)
        if (!ei_prepare(c, i, &in[i], &b) || !ei_pair(c, &r, &b, i, &computed))
            return NULL;
    if (c->dry)
        return c->ops[0]; /* anything not NULL */
    return computed ? nt_contiguous_at(c->site, r.t) : nt__copy_to(c->site, c->fn, r.t, (nt_dtype)-1);
}

static bool ei_check_args(const nt_site *site, const char *fn, const char *equation, int n,
                          nt_tensor *const *operands)
{
    if (!equation)
        return !nt__err(site, NT_EINVAL, fn, "argument 'equation' is NULL; expected a string "
                        "such as \"bij,bjk->bik\"");
    if (!operands || n < 1)
        return !nt__err(site, NT_EINVAL, fn, "argument 'operands' is %s with n = %d; expected "
                        "an array of n >= 1 tensors", operands ? "an array" : "NULL", n);
    for (int k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "operands[%d]", k);
        if (!nt__check_arg(site, fn, name, operands[k]))
            return false;
    }
    return true;
}

NT_API nt_tensor *nt_einsum_at(const nt_site *site, const char *equation, int n,
                               nt_tensor *const *operands)
{
    const char *fn = "nt_einsum";
    if (!nt__ensure_init() || !ei_check_args(site, fn, equation, n, operands))
        return NULL;
    ei_ctx *c = calloc(1, sizeof *c);
    ei_sub *sub = malloc((size_t)n * sizeof *sub);
    ei_term *in = malloc((size_t)n * sizeof *in);
    nt_tensor *y = NULL;
    if (!c || !sub || !in) {
        nt__err_hostmem(site, fn, "the equation's subscripts");
        goto out;
    }
    *c = (ei_ctx){.site = site, .fn = fn, .eq = equation, .ops = operands, .n = n, .sub = sub,
                  .dry = true};
    if (!ei_parse(c, in) || !ei_run(c, in))
        goto out;
    c->dry = false;
    nt_scope *s = nt_scope_begin();
    if (!s) {
        nt__err_hostmem(site, fn, "a scope");
        goto out;
    }
    y = ei_run(c, in);
    if (y)
        nt_keep(y);
    else
        nt__err_within(fn);
    nt_scope_end(s);
    y = y ? nt__scope_adopt(y, fn) : NULL;
out:
    free(c);
    free(sub);
    free(in);
    return y;
}
NT_API nt_tensor *nt_einsum(const char *equation, int n, nt_tensor *const *operands)
{
    return nt_einsum_at(NT_RA_SITE, equation, n, operands);
}
