/* neuron/foreach.c - several elementwise and row programs as one kernel
 * (multi-tensor, "foreach" kernels: PyTorch's _foreach_* and fused AdamW).
 *
 * An optimizer step updates every parameter with the same chain of
 * elementwise ops; each parameter's chain fuses into one program, and
 * alone each program is a kernel of its own: dozens of small kernels a
 * step, each a round trip of 2 us DMAs with nothing to overlap.  When the
 * planner (fusion/plan.c) has several independent such programs in a row,
 * it opens a shared kernel (nt__sk_join_open), runs them through the
 * backend as usual, and closes it (nt__sk_join_close): ew.c's programs then
 * issue their instructions into the one open kernel (sk_join_enter /
 * sk_join_leave), each program on its own tiles, which it releases when it
 * is done, alternating the end of SBUF they come from and each starting
 * where the last program from its end stopped (as the kernels of a
 * captured program are placed, sim/core.c), so the next program's loads
 * run while this one computes and stores.  A program of one tile may hold
 * its ops and tiles for the next one (sk_join_hold; ew.c runs two such
 * tiles side by side), until that program leaves or the kernel closes.
 * Each program issues exactly the instructions it issues alone, so every
 * value has the same bits; only their placement in time changes.
 *
 * The programs of one shared kernel never read what another of them writes
 * (the planner checks it), so they may overlap freely.  State is the
 * calling thread's: a worker runs one batch at a time. */
#include "neuron/sk.h"
#include "sim/sim.h"

#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

/* as sim/core.c: past this a program from one end starts at the end */
#define SBUF_ORIGIN_MAX (24 * 1024)

typedef struct joinst {
    bool open;   /* between nt__sk_join_open and nt__sk_join_close */
    int n;       /* programs issued into s */
    const nt__fgroup *const *list; /* the programs to come (NULL: not known) */
    int nlist;
    bool hit;    /* the timing memo had the kernel: only values are wanted */
    bool bad;    /* a program failed: the kernel is not filed */
    bool told;   /* a program returned the kernel's error (sk_join_leave) */
    bool values; /* s's values come from the reference, program by program */
    bool down0;  /* where the first program's tiles went */
    int64_t org[2]; /* where the next program from each end starts */
    int (*flush)(void); /* instructions held for the next program (sk_join_hold) */
    nt_tile *hmark; /* the tiles from here on stay while some are held */
    int hold_n;     /* the program that held them */
    sk_k s;      /* the shared kernel, begun by the first program */
} joinst;

static _Thread_local joinst J;

int nt__sk_join_open(const nt__fgroup *const *g, int n)
{
    if (J.open)
        return 0;
    memset(&J, 0, sizeof J);
    J.open = true;
    J.list = g;
    J.nlist = n;
    return 0;
}

static int no_values(const void *arg)
{
    (void)arg;
    return 0;
}

int nt__sk_join_close(void)
{
    if (!J.open)
        return 0;
    int rc = 0;
    if (J.flush) { /* what a program held issues alone */
        int (*flush)(void) = J.flush;
        J.flush = NULL;
        rc = flush();
        J.bad |= rc != 0;
    }
    if (J.n > 0) {
        /* the timing memo files the kernel when every listed program ran
         * clean (the values were computed program by program) */
        if (J.values && (J.bad || J.n != J.nlist)) {
            free(J.s.mkey);
            J.s.mkey = NULL;
        }
        if (J.values)
            sk_values_end(&J.s, J.bad, no_values, NULL);
        int rc2 = sk_end(&J.s);
        if (!rc)
            rc = rc2;
        /* a program that failed returned its error (sk_join_leave), which
         * its op or group reports; the kernel ends there (sk_join_enter),
         * so the programs before it are complete: its error again here
         * would be a second one, without the op's name, on what they wrote */
        if (J.told)
            rc = 0;
    }
    memset(&J, 0, sizeof J);
    return rc;
}

sk_k *sk_join_enter(const char *name, bool *issue, nt_tile **mark)
{
    if (!J.open)
        return NULL;
    if (J.n == 0) {
        if (sk_begin(&J.s, name))
            return NULL; /* out of host memory: the program runs alone */
        J.values = sk_values_begin(&J.s);
        J.hit = J.values && J.list && sk_memo_list(&J.s, J.list, J.nlist);
        J.down0 = J.s.k->sbuf.down;
        J.org[J.down0] = J.s.k->sbuf.origin; /* where a program's kernel starts */
    } else if (nt_sim_kernel_error(J.s.k) || J.s.derr_code) {
        nt__sk_join_close(); /* a failed program ended it; the rest run alone */
        return NULL;
    }
    /* every other program from the other end of SBUF; the engine choices
     * start as in a kernel of its own (sk_begin) */
    bool d = (J.n & 1) ? !J.down0 : J.down0;
    J.s.k->sbuf.down = d;
    J.s.k->sbuf.origin = J.org[d];
    J.s.k->sbuf.hi = 0;
    J.s.eng = 0;
    J.s.scalar_first = false;
    *mark = J.s.k->tiles;
    /* an untimed program's snapshot has the time already (runtime.c's
     * memo_look): only the values are wanted */
    *issue = !(J.values && (J.hit || nt__sim_program_untimed()));
    return &J.s;
}

/* sk_run_rec's issue as sk_run_prog's prog */
typedef struct issue_fn {
    void (*issue)(sk_k *s, const nt__rec *r);
} issue_fn;

static int issue_prog(sk_k *s, const nt__rec *r, void *ctx)
{
    ((issue_fn *)ctx)->issue(s, r);
    return 0;
}

int sk_run_rec(const nt__rec *r, bool join, void (*issue)(sk_k *s, const nt__rec *r))
{
    nt_tile *mark;
    bool now;
    sk_k *js = join ? sk_join_enter("foreach", &now, &mark) : NULL;
    if (js) {
        if (now && !sk_join_unhold()) /* what a program held goes first */
            issue(js, r);
        return sk_join_leave(js, mark, 0, sk_ref_rec, r);
    }
    return sk_run_prog(r, NULL, issue_prog, &(issue_fn){issue});
}

int sk_run_prog(const nt__rec *r, const char *name,
                int (*prog)(sk_k *s, const nt__rec *r, void *ctx), void *ctx)
{
    sk_k s;
    int rc = sk_begin(&s, name ? name : nt__op_name(r->op));
    if (rc)
        return rc;
    bool values = sk_values_begin(&s); /* NT_SIM_PROGRAM_VALUES */
    if (values && sk_memo_rec(&s, r, false)) /* the same program ran before */
        return sk_end_values(&s, values, 0, r);
    return sk_end_values(&s, values, prog(&s, r, ctx), r);
}

bool sk_join_is(const sk_k *s)
{
    return J.open && s == &J.s;
}

void sk_join_hold(int (*flush)(void))
{
    J.flush = flush;
    J.hold_n = J.n;
}

int sk_join_unhold(void)
{
    int (*flush)(void) = J.flush;
    J.flush = NULL;
    return flush ? flush() : 0;
}

int sk_join_leave(sk_k *s, nt_tile *mark, int rc, int (*ref)(const void *arg), const void *arg)
{
    if (!J.hmark)
        J.hmark = mark;
    if (J.hold_n != J.n) { /* held only for the next program: it runs now, or
                            * (this one failed) its values are made (ew.c) */
        int hr = sk_join_unhold();
        if (!rc)
            rc = hr;
    }
    if (!J.flush) { /* nothing held: this program's tiles and any held go */
        for (nt_tile *t = s->k->tiles; t && t != J.hmark; t = t->next)
            if (t->live)
                nt_tile_release(s->k, t);
        J.hmark = NULL;
    }
    int64_t h = s->k->sbuf.hi; /* the next program from this end starts there */
    J.org[s->k->sbuf.down] = h < SBUF_ORIGIN_MAX ? h : 0;
    if (s->warm && !s->warm->live)
        s->warm = NULL; /* the next program warms its own */
    J.n++;
    /* the program's error, with its message: an instruction that failed
     * returns the kernel's bare code (its message is the kernel's, which
     * alone sk_end gives), and a refusal has none; the planner names the
     * op (fusion/exec.c) or replays the group op by op */
    J.told |= nt_sim_kernel_error(s->k) || s->derr_code;
    if (nt_sim_kernel_error(s->k))
        rc = nt__kerr(nt_sim_kernel_error(s->k), "simulator: %s", s->k->msg);
    else if (s->derr_code)
        rc = nt__kerr(s->derr_code, "%s", s->derr);
    else if (rc)
        rc = nt__kerr(rc, "no simulator program for this op (%s)", nt_strerror(rc));
    J.bad |= rc != 0;
    if (rc || !J.values)
        return rc;
    /* the values now: the planner reads none of them before the kernel
     * ends, and the next program reads none of what this one writes */
    double t0 = nt__sim_now_ns();
    rc = ref(arg);
    s->k->values_ns += nt__sim_now_ns() - t0;
    return rc;
}
