/* sim/trace.h - a Chrome/Perfetto trace writer (JSON object format).
 *
 * One process-wide trace file.  Any module adds events: the simulator puts
 * its engines and DMA queues under the "NeuronCore (simulated)" process
 * (NT_TRACE_PID_SIM, timestamps = simulated time), the host side (dispatcher,
 * fusion) uses NT_TRACE_PID_HOST with wall-clock timestamps.
 *
 * All functions are thread-safe: events are formatted on the caller's stack
 * and appended to a buffered FILE under one mutex.  nt__trace_close writes
 * the closing brackets, so the file is valid JSON once it returns; an atexit
 * hook closes a trace still open at exit.  Every call is a cheap no-op while
 * no trace is open. */
#ifndef NT_SIM_TRACE_H
#define NT_SIM_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    NT_TRACE_PID_SIM = 1,  /* the simulated NeuronCore */
    NT_TRACE_PID_HOST = 2, /* host threads: enqueue, fusion, workers */
    /* simulated core c > 0 (NT_SIM_CORES): NT_TRACE_PID_CORE0 + c; core 0
     * keeps NT_TRACE_PID_SIM */
    NT_TRACE_PID_CORE0 = 100,
};

/* What a trace holds (NT_TRACE_LEVEL), each level everything the one
 * before it holds and more: host (op enqueues, syncs), fusion (+ fused
 * kernels and fusion breaks), kernel (+ every kernel's host span, the
 * simulated kernels and collectives: the default), instruction (+ every
 * simulated engine instruction and DMA transfer). */
enum {
    NT__TRACE_HOST = 1,
    NT__TRACE_FUSION = 2,
    NT__TRACE_KERNEL = 3,
    NT__TRACE_INSTR = 4,
};
/* The level named by s ("host", "fusion", "kernel", "instruction"), or 0. */
int nt__trace_level_parse(const char *s);
const char *nt__trace_level_name(int level);
/* Parses NT_TRACE_STEPS's "a:b" (steps a to b - 1; "a:" no end; "a" the one
 * step a) into *first and *end (end INT64_MAX: none).  False if malformed. */
bool nt__trace_steps_parse(const char *s, int64_t *first, int64_t *end);
/* The filter the next nt__trace_open uses (and the open trace, from its
 * next step boundary on): the level, and the window of steps [first, end). */
void nt__trace_set_level(int level);
void nt__trace_set_steps(int64_t first, int64_t end);
/* The filter's level (NT__TRACE_*). */
int nt__trace_filter_level(void);

/* Opens `path` for writing (closing any open trace first).  Returns 0 or
 * NT_EIO. */
int nt__trace_open(const char *path);
/* Finishes and closes the trace; no-op if none is open. */
void nt__trace_close(void);
/* True while a trace is open and its step window holds the current step:
 * events are being written (one relaxed atomic load). */
bool nt__trace_enabled(void);
/* True while a trace file is open, whether or not its window is. */
bool nt__trace_is_open(void);
/* True while events of `level` (NT__TRACE_*) are being written. */
bool nt__trace_at(int level);

/* Step boundaries (a training step ends: debug/htrace.c's nt__htrace_step
 * calls these).  The step count starts at 0 with each trace file. */
/* True if the boundary about to be passed opens or closes the window, or
 * ends a step inside it: the caller drains the queues first, so each step's
 * events are that step's. */
bool nt__trace_step_wants_drain(void);
/* Passes a boundary: the step count moves on and the window opens or
 * closes.  Returns the bytes the ending step wrote if it was inside the
 * window (its number in *step), else -1. */
int64_t nt__trace_step_end(int64_t *step);
/* Counts nt__trace_open calls: a module that emits metadata once per file
 * (process and thread names) re-emits it when this changes. */
unsigned nt__trace_generation(void);

/* Wall-clock microseconds on the host tracks' clock: since the first host
 * event of the open trace file (debug/htrace.c, neuron/). */
double nt__htrace_now(void);

/* Metadata: names a process / a thread (track) and orders them in the UI. */
void nt__trace_process_name(int pid, const char *name, int sort_index);
void nt__trace_thread_name(int pid, int tid, const char *name, int sort_index);

/* A complete event ("ph":"X") from ts_us lasting dur_us.  `args_json` is
 * NULL or a JSON object text ("{...}") inserted as is. */
void nt__trace_complete(int pid, int tid, const char *name, double ts_us, double dur_us,
                        const char *args_json);
/* An instant event ("ph":"i", thread scope). */
void nt__trace_instant(int pid, int tid, const char *name, double ts_us,
                       const char *args_json);
/* A counter event ("ph":"C"); args_json holds the series, e.g. {"bytes":12}. */
void nt__trace_counter(int pid, const char *name, double ts_us, const char *args_json);

/* Writes s as a JSON string literal (with quotes and escapes) into buf;
 * returns the length written (truncates safely). */
size_t nt__trace_json_str(char *buf, size_t n, const char *s);

#endif
