/* autograd/autograd.h - the tape.
 *
 * Every op that runs with grad enabled and an input that requires grad
 * records a node: its op and parameters, edges to the nodes that produced its
 * inputs (or to a leaf's accumulator), the shapes and dtypes of its inputs,
 * and the tensors its backward needs ("saved": fresh handles on the same
 * storage, with the storage version at save time, so an in-place write in
 * between is caught).  nt_backward walks the reachable nodes in reverse
 * creation order and calls each op's backward function, which enqueues
 * ordinary ops through the dispatcher -- backward is queued, fused and run
 * on the backend like the forward pass.
 *
 * Concurrency: a graph belongs to the thread that builds it; nt_backward on
 * one graph must not race with ops that extend it. */
#ifndef NT_AUTOGRAD_AUTOGRAD_H
#define NT_AUTOGRAD_AUTOGRAD_H

#include "dispatcher/dispatch.h"

typedef struct nt__node nt__node;

typedef struct nt__edge {
    nt__node *node; /* NULL: that input needs no gradient */
    int idx;        /* which output of node */
} nt__edge;

typedef struct nt__tmeta {
    uint8_t dtype;
    int8_t ndim;
    uint8_t dev;          /* the device it was on */
    int64_t shape[NT_MAX_DIMS];
} nt__tmeta;

struct nt__node {
    volatile AO_t refs;
    int op;               /* op id; NT_OP_COUNT + 0 marks a leaf accumulator */
    uint64_t seq;         /* creation order: a topological order */
    nt_site site;         /* the forward call */
    nt__params p;
    int nin;
    nt__edge *next;       /* [nin] */
    nt__tmeta *in_meta;   /* [nin] */
    int nout;
    nt__tmeta out_meta[NT__MAX_OUT];
    nt_tensor *saved_in[NT__MAX_IN];
    uint64_t saved_in_ver[NT__MAX_IN];
    nt_tensor *saved_out[NT__MAX_OUT];
    uint64_t saved_out_ver[NT__MAX_OUT];
    bool freed;           /* saved tensors dropped by a backward */
    int64_t *sizes;       /* cat: size of each input along p.dim */
    nt_tensor *leaf;      /* accumulator: the leaf (weak: cleared when it dies) */
    const struct nt__custom_op *custom; /* user ops */
    struct nt__ckpt *ckpt; /* nt_checkpoint's node (autograd/checkpoint.c) */
    nt__node *dead_next;  /* nt__node_unref's list of nodes to free */
    struct nt__ghook *hooks; /* nt_register_hook / nt_retain_grad, in order */
    struct nt__grp *grp;  /* a group op's member node (autograd/group.c) */
    int grp_idx;          /* which member */
};

/* A gradient hook on output idx of a node (an accumulator's idx 0 for a
 * leaf): fn(g, ctx) (nt_register_hook), or, with fn NULL, the retained
 * .grad of the non-leaf whose autograd state is ag (nt_retain_grad; ag is
 * cleared when that tensor dies). */
typedef struct nt__ghook {
    int idx;
    bool removed;      /* nt_remove_hook: inert until the node goes */
    nt_hook_handle id; /* nt_register_hook_handle's handle, else 0 */
    nt_grad_hook fn;
    void *ctx;
    struct nt__ag *ag;
    struct nt__ghook *next;
} nt__ghook;

#define NT__OP_ACCUMULATE (NT_OP_COUNT + 0)
#define NT__OP_CHECKPOINT (NT_OP_COUNT + 1)
#define NT__OP_GROUP (NT_OP_COUNT + 2)

/* Per-tensor autograd state (nt_tensor.ag). */
struct nt__ag {
    bool requires_grad;
    bool is_view;
    nt__node *grad_fn; /* non-leaf: the node that made it (a reference) */
    int out_idx;
    nt__node *acc;     /* leaf that requires grad: its accumulator (a reference) */
    nt_tensor *grad;   /* leaf: the accumulated gradient (one user reference);
                        * a non-leaf's that nt_retain_grad asked for */
    nt__node *retain_node; /* nt_retain_grad: the node holding its hook (a reference) */
    /* Leaf: its cast for the next forward's autocast, made ahead by an
     * optimizer step from the value it wrote (autograd/optim.c), so that
     * autocast takes it instead of queuing a cast that reads the parameter
     * again; valid while the storage's version is amp_ver.  amp_want: the
     * dtype autocast cast the leaf to since the last step, plus 1 (0: none),
     * which is what the next step makes. */
    nt_tensor *amp_cast;
    uint64_t amp_ver;
    uint8_t amp_want;
    /* the capture note of amp_cast (autograd/optim.c, ampcap), borrowed;
     * amp_opt: the leaf is an optimizer's parameter */
    struct ampcap *amp_cap;
    bool amp_opt;
};

/* Backward of one node: gout[i] is the gradient of output i (NULL: zero);
 * set gin[i] (or leave NULL for no gradient) for each input whose edge is
 * live.  Every tensor here is owned by the scope nt_backward opened.  Ops are issued with b->site (the forward's call site).
 * Returns 0 or an error code with the thread error set. */
typedef struct nt__bctx {
    nt__node *n;
    nt_tensor *gout[NT__MAX_OUT];
    nt_tensor **gin;
    const nt_site *site;
    /* create_graph (double backward): the pass records the backward's ops,
     * and nt__saved_in/out hand out the saved tensors with their place in
     * the graph (uin/uout: made on first use, owned by the node's scope). */
    bool create;
    nt_tensor *uin[NT__MAX_IN];
    nt_tensor *uout[NT__MAX_OUT];
    /* set by a backward whose input gradients are views of this one buffer,
     * laid out as its inputs lie in their own input (attention's dq, dk, dv
     * as q, k, v lie in the qkv projection) and holding no -0: the
     * backwards of the slices that made those inputs take the buffer as
     * their input's gradient instead of writing into one (autograd/tape.c,
     * slice_into) */
    nt_tensor *placed;
} nt__bctx;

typedef int (*nt__bwd_fn)(nt__bctx *b);

typedef struct nt__bwd_entry {
    uint8_t save_in;  /* bit i: save input i */
    uint8_t save_out; /* bit i: save output i */
    nt__bwd_fn fn;
    int16_t helper;   /* bwd `helper(H)`: NT_OP_H */
} nt__bwd_entry;

/* The backward table (autograd/backward.c), indexed by op id. */
extern const nt__bwd_entry nt__bwd_table[];

/* Helpers for backward functions (autograd/backward.c). */
bool nt__edge_live(const nt__node *n, int i);
nt_tensor *nt__saved_in(nt__bctx *b, int i);
nt_tensor *nt__saved_out(nt__bctx *b, int i);

/* Double backward (create_graph, autograd/tape.c): while a node's backward
 * runs in a pass that records its ops, the name of its op (for the errors
 * of a backward that cannot be differentiated), else NULL.  nt__dbl_refuse
 * sets and returns that error (NT_ENOTSUP naming nt_backward and the op). */
extern _Thread_local const char *nt__dbl_of NT_TLS_HOT; /* read by every op's dispatch */
int nt__dbl_refuse(const nt_site *site, const char *why);
/* A saved tensor handed to a create_graph backward: a handle on its
 * storage that carries edge e (its gradient flows there), owned by the
 * open scope; t itself when e has no node.  NULL: out of memory. */
nt_tensor *nt__unpack(nt_tensor *t, nt__edge e);

/* The dispatcher's hooks (nt__dhooks; init/init.c registers them): record
 * the node of a call, whether grad mode is on, cat's node. */
int nt__ag_on_dispatch(nt__call *c);
bool nt__ag_grad_mode(void);
int nt__ag_on_cat(const nt_site *site, nt_tensor *const *ts, int n, int dim, nt_tensor *out);

/* Frees a handle's autograd metadata (core/tensor.c calls it through
 * core/hooks.h). */
void nt__ag_free(struct nt__ag *ag);

/* Group ops (autograd/group.c): one op over the members of a
 * communicator (the tensor-parallel layers and differentiable collectives of
 * dist/tp.c), whose backward needs every member's output gradient at once.
 * Member m's output gets a node of its own (op NT__OP_GROUP, one output,
 * the member's inputs as edges); the members' nodes are made one after the
 * other in one call, so a backward pass reaches every member's consumers
 * before any member (they were all made later), and when it reaches the
 * first member every member's output gradient is final.  The group's
 * backward runs then, once, for all members; each member's node hands its
 * own input gradients on when the pass reaches it.
 *
 * bwd(ctx, gout, gin): gout[m] is member m's output gradient (NULL: no
 * gradient reached it, i.e. zeros); it sets gin[m * nin + i] to the
 * gradient of member m's input i (or leaves it NULL).  Runs inside the
 * pass's scope with grad off; returns 0 or an error (thread error set). */
typedef int (*nt__grp_bwd_fn)(void *ctx, nt_tensor *const *gout, nt_tensor **gin);
typedef struct nt__grp {
    volatile AO_t refs;   /* one per member node */
    int nmem, nin;
    const char *api;      /* static: named in errors and traces */
    nt__grp_bwd_fn bwd;
    void (*free_ctx)(void *ctx);
    void *ctx;
    nt__node **mem;       /* [nmem] weak: cleared when a member's node goes */
    nt_tensor **gin;      /* [nmem * nin] the running pass's results (references) */
    int pending;          /* members of the running pass yet to take theirs */
    uint64_t pass;        /* the pass gin belongs to */
} nt__grp;
/* Records a group op: member m (0..nmem-1) has inputs in[m*nin ..
 * m*nin+nin) (entries may be NULL) and output out[m] (floating, made with
 * grad off).  Records nothing (and frees ctx) when grad mode is off or no
 * input requires grad; else the outputs require grad and ctx is freed with
 * the last member's node.  0 or NT_EHOSTMEM (ctx freed, nothing
 * recorded). */
int nt__grp_record(const nt_site *site, const char *api, int nmem, int nin,
                   nt_tensor *const *in, nt_tensor *const *out, nt__grp_bwd_fn bwd,
                   void (*free_ctx)(void *), void *ctx);
void nt__grp_unref(nt__grp *g, int member);
/* Releases the results a pass left (references the group holds). */
void nt__grp_drop_results(nt__grp *g);

/* Custom ops (autograd/custom.c). */
struct nt__custom_op;
int nt__custom_backward(nt__bctx *b);
/* The definition of a registered tile-kernel op, or NULL. */
const nt_kernel_op_def *nt__custom_kernel_def(int op);
const nt__opinfo *nt__custom_opinfo(int op);
void nt__custom_shutdown(void);

/* Gradient checkpointing (autograd/checkpoint.c).  While nt_checkpoint
 * runs its block without a graph, nt__ckpt_capturing is set and every op
 * that records nothing hands its inputs to nt__ckpt_capture, which notes
 * those that require grad: they become inputs of the checkpoint's node. */
extern _Thread_local bool nt__ckpt_capturing NT_TLS_HOT;
void nt__ckpt_capture(nt_tensor *const *ts, int n);
/* Re-runs a checkpoint node's block with grad on; outs[0..n->nout) get the
 * recomputed outputs (owned by the caller), whose graph edges lead to
 * n->next[].  0 or an error naming nt_backward and the checkpoint. */
int nt__ckpt_recompute(nt__node *n, nt_tensor **outs);
/* Drops the node's saved tensors / frees its state (tape.c's drop_saved
 * and nt__node_unref). */
void nt__ckpt_drop_saved(struct nt__ckpt *ck);
void nt__ckpt_free(struct nt__ckpt *ck);
/* Sets the thread's no-grad depth, returning the old one (the recompute
 * runs with grad on inside nt_backward's no-grad region). */
int nt__ag_set_no_grad(int depth);

/* The thread's no-grad depth and the "backward of" tag read by dispatch. */
bool nt__ag_enabled(void);

nt__node *nt__node_new(int op, int nin, int nout);
void nt__node_unref(nt__node *n);
/* autograd/grad_hooks.c: nt_backward runs node n's hooks on its output
 * gradients (a hook's replacement goes into the slot); a node's hooks go
 * with it; a dying tensor's retained gradient stops. */
int nt__run_hooks(nt__node *n, nt_tensor **gout, const nt_site *site);
void nt__hooks_free(nt__node *n);
void nt__ag_unretain(struct nt__ag *ag);
/* The ag state of t, created on first use. */
struct nt__ag *nt__ag_of(nt_tensor *t);
/* The edge a consumer of t uses: t's grad_fn or its leaf accumulator. */
nt__edge nt__edge_of(nt_tensor *t);
/* A handle on t's storage without autograd state, holding a reference,
 * for saving. */
nt_tensor *nt__save(nt_tensor *t);

/* Work on a tensor's device (autograd/tape.c).  nt__dev_enter makes
 * device dev's default stream the thread's current one until
 * nt__dev_leave, if the current stream is on another device (the user's
 * own stream stays when it is on dev): the backward runs each node there,
 * optimizers update each parameter there, checkpoints load each tensor
 * there.  The streams' dependencies order the work against the other
 * streams' as usual. */
typedef struct {
    nt_stream *prev;
    bool moved;
} nt__devsw;
void nt__dev_enter(nt__devsw *d, int dev);
void nt__dev_leave(nt__devsw *d);

/* An optimizer's parameters (autograd/optim.c), for amp's loss scaler:
 * their count (NT_EINVAL for a bad opt) and parameter i (borrowed; the list
 * is fixed when the optimizer is made). */
int nt__optim_nparams(nt_optim *opt);
/* Autocast's lookup (autograd/optim.c): if src is exactly a leaf that
 * requires grad (the leaf itself, or a view chain back to the same view of
 * it), notes that the leaf was cast to dt and returns the leaf's cast made
 * ahead by an optimizer step when it is still valid (borrowed), else NULL. */
nt_tensor *nt__optim_cast_of(nt_tensor *src, nt_dtype dt);
/* The same, from autocast at site in fn: while capturing, a leaf without a
 * valid cast made ahead gets one made now, outside the program (optim.c,
 * ampcap_make). */
nt_tensor *nt__optim_cast_of_at(const nt_site *site, const char *fn, nt_tensor *src, nt_dtype dt);
nt_tensor *nt__optim_param(nt_optim *opt, int i);

/* State made on first use by a layer above fusion (amp/fp8.c's scales):
 * the ops between begin and end run but stay out of a capture in progress
 * (nt__capture_pause / resume, autograd/optim.c), so a replay never makes
 * the state again. */
void nt__first_use_begin(void);
void nt__first_use_end(void);

#endif
