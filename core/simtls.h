/* core/simtls.h - per-thread hand-offs between the runtime and the
 * simulator (defined in core/hooks.c, which the standalone simulator library
 * links too).  sim/sim.h documents their meaning through the functions that
 * wrap them (nt__sim_thread_core_set, nt__sim_thread_after,
 * nt__sim_thread_last_end); the stream workers and the executor set and read
 * them directly, without calling up into sim/. */
#ifndef NT_CORE_SIMTLS_H
#define NT_CORE_SIMTLS_H

/* The simulated core (device) whose kernels this thread runs; 0 unless set. */
extern _Thread_local int nt__tl_core __attribute__((tls_model("initial-exec")));
/* The next kernel begun on this thread starts no earlier than this
 * (simulated ns on its core's clock); reset to 0 by that kernel. */
extern _Thread_local double nt__tl_sim_after __attribute__((tls_model("initial-exec")));
/* Simulated end of the last kernel this thread ended (-1: none since the
 * executor last cleared it). */
extern _Thread_local double nt__tl_sim_end __attribute__((tls_model("initial-exec")));

#endif
