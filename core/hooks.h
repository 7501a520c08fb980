/* core/hooks.h - the calls core/ makes into the layers above it.
 *
 * core/ includes nothing above it; where it must call up (freeing a
 * tensor's autograd state, naming a user op), it calls through this table,
 * which the top-level registration (init/init.c) fills at the first
 * nt_init, before any other thread can reach the library's state.  Each
 * entry's type is its prototype: the registration assigns the real
 * function, so a signature change fails to compile.  An entry may be NULL
 * (the module is not registered): callers check. */
#ifndef NT_CORE_HOOKS_H
#define NT_CORE_HOOKS_H

#include "core/internal.h"

typedef struct nt__core_hooks {
    /* autograd/tape.c: frees a handle's autograd metadata */
    void (*ag_free)(struct nt__ag *ag);
    /* autograd/custom.c: the info of a registered user op, or NULL */
    const nt__opinfo *(*custom_opinfo)(int op);
    /* autograd/custom.c: the tile kernel of a registered user op, or NULL
     * (backends run them: neuron/user.c) */
    const nt_kernel_op_def *(*custom_kernel_def)(int op);
    /* fusion/graph.c: a storage made during a capture (st->cap) is being
     * freed (any thread; st is still whole) */
    void (*storage_dead)(const nt__storage *st);
} nt__core_hooks;

extern nt__core_hooks nt__chooks;

/* Set (release) by nt_init once every module is up, cleared by
 * nt_shutdown; nt__initialized / nt__ensure_init (core/internal.h) read it.
 * Written only under nt_init's lock (dispatcher/config.c). */
extern volatile AO_t nt__inited;

#endif
