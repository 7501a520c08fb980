/* amp/amp.h - mixed precision: what the rest of the library calls.
 *
 * autocast.c  the per-thread region stack and the dispatcher hook
 *             (nt__amp_on_call) that applies the per-op policy;
 * scaler.c    the dynamic loss scaler (nt_grad_scaler);
 * fp8.c       fp8 autocast: recipes, scales, amax histories, the fp8
 *             matmul node (nt_fp8_recipe, nt_fp8_autocast_begin).
 * Stochastic rounding lives in core/dtype.h (the conversions and the random
 * bits, shared by every kernel) and dispatcher/api_ew.c (the flag on a
 * CAST record).  docs/amp.md describes all three. */
#ifndef NT_AMP_AMP_H
#define NT_AMP_AMP_H

#include "dispatcher/dispatch.h"

/* Turns autocast off on the calling thread until the matching resume:
 * the library's own helpers (the scaler's checks) run at their own
 * precision inside a user's region.  Nestable. */
void nt__amp_suspend(void);
void nt__amp_resume(void);
/* The autocast dtype that applies to the calling thread's next op (none
 * while suspended or inside nt_backward), or NT_DTYPE_COUNT. */
nt_dtype nt__amp_active(void);
/* The dispatcher's hook (nt__dhooks.amp_on_call, registered by
 * init/init.c): casts c's inputs by the autocast policy; 0 or an error. */
int nt__amp_on_call(nt__call *c);
/* nt__dhooks.amp_cast: t cast to dt (f32 -> the region's dtype) the way
 * autocast casts an input: the cast an optimizer step made ahead when t is
 * a parameter it updated and nothing wrote since (autograd/optim.c), else
 * a queued CAST.  nt_linear's bias goes through it. */
nt_tensor *nt__amp_cast(const nt_site *site, const char *fn, nt_tensor *t, nt_dtype dt);
/* nt__dhooks.amp_enter / amp_leave: pushes dt (NT_DTYPE_COUNT: autocast
 * off) as the thread's innermost region, whatever regions are open or the
 * backward tag says, so nt_checkpoint's recompute runs as its forward did;
 * NT_ESTATE when the stack is full. */
int nt__amp_enter(nt_dtype dt);
void nt__amp_leave(void);

/* fp8 autocast (amp/fp8.c).  nt__amp_push_fp8 opens a region of recipe r
 * (its ops follow the bf16 policy, matmuls go to r); nt__amp_fp8_region
 * gives the recipe of the innermost region if it applies to the calling
 * thread's next op (not suspended, not in a backward) and sets *next to
 * its counter of fp8 matmuls issued; nt__amp_fp8_top the innermost
 * region's recipe or NULL. */
int nt__amp_push_fp8(nt_fp8_recipe *r);
nt_fp8_recipe *nt__amp_fp8_region(int **next);
nt_fp8_recipe *nt__amp_fp8_top(void);
/* nt__dhooks.amp_fp8_matmul: under an fp8 region, runs nt_matmul(a, b) as
 * an fp8 matmul and sets *handled; else leaves *handled false. */
nt_tensor *nt__amp_fp8_matmul(const nt_site *site, nt_tensor *a, nt_tensor *b, bool *handled);
/* For dist/ (nt_fp8_recipe_update): checks r (NT_EINVAL naming fn); the
 * step's amaxes of r on device dev as a new view [3 * slots] (NULL with
 * NT_ESTATE naming fn when dev has no slot); the push and rescale of every
 * device's state (queued ops). */
bool nt__fp8_recipe_ok(nt_fp8_recipe *r, const char *fn);
nt_tensor *nt__fp8_pending(nt_fp8_recipe *r, int dev, const char *fn);
int nt__fp8_apply(nt_fp8_recipe *r, const char *fn);
/* Folds the amaxes recorded since the last call into each device's step
 * amax (nt__fp8_pending's values): first thing in an update. */
int nt__fp8_collect(nt_fp8_recipe *r, const char *fn);
/* Makes a stream of dev the thread's current one (the current stream if it
 * is on dev, else dev's default); returns the old one to restore. */
nt_stream *nt__fp8_enter(int dev);

/* An fp8 recipe's state as a checkpoint stores it (record kind 7,
 * io/checkpoint.c): its settings, its slot count and, for rows 0 .. 3 slots
 * - 1, scale, 1 / scale, the step's amax and the amax history (rows of
 * o.amax_history_len, newest first); one host block (data, g_free) the
 * four arrays point into.  nt__fp8_state_get collects the step's amaxes
 * and reads every device's state (a sync): devices must agree (NT_ESTATE
 * naming fn and two devices); a recipe that ran nothing gives what it
 * loaded last, or 0 slots.  nt__fp8_state_set copies st into r: every
 * device's block now, and the blocks devices make later (checked by the
 * caller: st's settings are r's).  nt__fp8_opts gives r's settings. */
typedef struct nt__fp8_state {
    nt_fp8_recipe_opts o;
    int slots;
    float *data, *scale, *inv, *pending, *hist;
} nt__fp8_state;
int nt__fp8_state_get(nt_fp8_recipe *r, const char *fn, nt__fp8_state *st);
int nt__fp8_state_set(nt_fp8_recipe *r, const char *fn, const nt__fp8_state *st);
nt_fp8_recipe_opts nt__fp8_opts(nt_fp8_recipe *r);
/* A state block for `slots` slots of history h (zeroed), its arrays set;
 * false when the host is out of memory. */
bool nt__fp8_state_alloc(nt__fp8_state *st, int slots, int h);

/* The loss scaler's state as the checkpoint stores it (record kind 4). */
typedef struct nt__scaler_state {
    double scale, growth_factor, backoff_factor;
    int64_t growth_interval, growth_tracker, skipped_steps;
} nt__scaler_state;

/* Checks s (NT_EINVAL with a message naming fn if it is not a live scaler). */
bool nt__scaler_ok(nt_grad_scaler *s, const char *fn);
void nt__scaler_get_state(nt_grad_scaler *s, nt__scaler_state *out);
/* Returns false (with the reason in why) if st is not a valid state. */
bool nt__scaler_state_valid(const nt__scaler_state *st, char *why, size_t whylen);
/* Installs a valid state; a pending step's overflow flag is dropped. */
void nt__scaler_set_state(nt_grad_scaler *s, const nt__scaler_state *st);

#endif
