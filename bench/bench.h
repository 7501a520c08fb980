/* bench/bench.h - what every benchmark needs: a monotonic clock, the median
 * of repeats, a clean exit on a failed call, and PyTorch's nn.Linear
 * initialisation for the MLP benches.  Define BENCH_NAME (e.g.
 * "bench/fusion") before including. */
#ifndef NT_BENCH_H
#define NT_BENCH_H

#include <math.h>
#include <ntensor.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Runs argv (argv[0] a path, or a name looked up in PATH) with the
 * NAME=VALUE strings of env (NULL-terminated) added to its environment;
 * its whole standard output goes into out (cap bytes, NUL-terminated).
 * Returns its wait status (waitpid's), or -1 when it could not start.
 * Also used by tests that rerun their own executable (tests/test_ddp.c). */
static inline int bench_run_child(char *const *argv, const char *const *env, char *out,
                                  size_t cap)
{
    int fd[2];
    out[0] = '\0';
    if (pipe(fd))
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        for (int i = 0; env[i]; i++)
            putenv((char *)env[i]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fd[0]);
    int st;
    return waitpid(pid, &st, 0) == pid ? st : -1;
}

static inline double bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* CPU time of the whole process (every thread, the runtime's workers too). */
static inline double bench_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[0 .. n) and returns its median (the upper one for even n). */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp);
    /* an even count: the mean of the middle two (the upper one alone made
     * the median of two rounds their maximum) */
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Exits with the runtime's last error: `what` failed. */
static inline void bench_fail(const char *what)
{
    fprintf(stderr, "%s: %s failed: %s\n", BENCH_NAME, what, nt_last_error_message());
    exit(1);
}

/* bench_fail(what) when a call returned nonzero. */
static inline void bench_check(int rc, const char *what)
{
    if (rc)
        bench_fail(what);
}

/* Whether the interpreter `python` imports torch (a PyTorch peer can run);
 * false when its path cannot be quoted or it lacks torch.  The caller says
 * what is skipped. */
static inline bool bench_python_has_torch(const char *python)
{
    char cmd[1100];
    if (strlen(python) > 1000 || strchr(python, '\''))
        return false;
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' >/dev/null 2>&1", python);
    return system(cmd) == 0;
}

/* Runs the peer command `cmd` (a shell line), handing each line it prints to
 * fn; returns its exit status (nonzero also when it cannot start). */
static inline int bench_peer_lines(const char *cmd, void (*fn)(const char *line, void *arg),
                                   void *arg)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    char line[1024];
    while (fgets(line, sizeof line, p))
        fn(line, arg);
    return pclose(p);
}

/* PyTorch's nn.Linear initialisation: uniform in +-1/sqrt(fan_in), with
 * requires_grad set. */
static inline nt_tensor *bench_linear_param(int ndim, const int64_t *shape, double fan_in,
                                            uint64_t seed)
{
    double b = 1 / sqrt(fan_in);
    nt_tensor *u = nt_rand(NT_F32, ndim, shape, seed);
    nt_tensor *t = nt_add_scalar(nt_mul_scalar(u, 2 * b), -b);
    nt_release(u);
    if (!t || nt_set_requires_grad(t, true))
        bench_fail("init");
    return t;
}

/* The benches' MLP (in -> hid -> hid -> out): weight and bias of each
 * Linear layer, initialised as PyTorch does, with seeds 1 .. 6. */
static inline void bench_mlp_params(nt_tensor *p[6], int64_t in, int64_t hid, int64_t out)
{
    p[0] = bench_linear_param(2, (int64_t[]){hid, in}, (double)in, 1);
    p[1] = bench_linear_param(1, (int64_t[]){hid}, (double)in, 2);
    p[2] = bench_linear_param(2, (int64_t[]){hid, hid}, (double)hid, 3);
    p[3] = bench_linear_param(1, (int64_t[]){hid}, (double)hid, 4);
    p[4] = bench_linear_param(2, (int64_t[]){out, hid}, (double)hid, 5);
    p[5] = bench_linear_param(1, (int64_t[]){out}, (double)hid, 6);
}

#endif
