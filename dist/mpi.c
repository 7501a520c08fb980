/* dist/mpi.c - processes: MPI bootstrap and the byte exchange.
 *
 * MPI is optional (meson feature `mpi`, NT_HAVE_MPI).  When the process was
 * launched by mpirun, nt_init starts MPI (MPI_Init_thread, asking for
 * MPI_THREAD_MULTIPLE; the calls are serialised here anyway, so
 * MPI_THREAD_SERIALIZED is enough) and nt_shutdown finalizes it.  Between
 * processes the data moves with nonblocking sends and receives polled
 * against NT_COLLECTIVE_TIMEOUT, so a dead or silent peer is an error,
 * never a hang.  Never MPI_Allreduce: MPI does not fix its order, the rank
 * tree (tree.c) does, on the receiving side. */
#include "dist/dist.h"

#include <errno.h>
#include <math.h>

#ifdef NT_HAVE_MPI
#include <mpi.h>
#endif

static GMutex dist_lock;      /* nt__dist_init / shutdown */
#ifdef NT_HAVE_MPI
static bool peer_has_failed(void);
#endif
static bool dist_inited;
static double timeout_s = 60;
static volatile AO_t generation = 1;
static int proc_rank = 0, proc_count = 1;
static bool mpi_on;           /* this process runs MPI now */
static bool mpi_finalized;    /* MPI ran and was finalized: it cannot restart */

double nt__coll_timeout_s(void)
{
    double v;
    __atomic_load(&timeout_s, &v, __ATOMIC_RELAXED);
    return v;
}
bool nt__mpi_active(void) { return __atomic_load_n(&mpi_on, __ATOMIC_ACQUIRE); }
uint64_t nt__dist_generation(void) { return AO_load_acquire(&generation); }

NT_API int nt_process_rank(void)
{
    if (!nt__ensure_init())
        return 0;
    return proc_rank;
}

NT_API int nt_process_count(void)
{
    if (!nt__ensure_init())
        return 1;
    return proc_count;
}

/* Launched by an MPI launcher (Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE;
 * PMI/PMIx launchers set their own). */
static bool launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int nt__dist_init(void)
{
    g_mutex_lock(&dist_lock);
    if (dist_inited) {
        g_mutex_unlock(&dist_lock);
        return 0;
    }
    const char *v = getenv("NT_COLLECTIVE_TIMEOUT");
    double to = 60;
    if (v) {
        char *end;
        errno = 0;
        to = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(to) || to <= 0) {
            g_mutex_unlock(&dist_lock);
            return nt__err(NULL, NT_EINVAL, "nt_init",
                           "environment variable NT_COLLECTIVE_TIMEOUT is '%s'; expected a "
                           "number of seconds > 0",
                           v);
        }
    }
    nt__topology topo;
    int rc = nt__topology_load(&topo);
    if (rc < 0) {
        g_mutex_unlock(&dist_lock);
        return rc;
    }
    __atomic_store(&timeout_s, &to, __ATOMIC_RELAXED);
    nt__coll_reset_clocks();
    if (launched_by_mpirun()) {
#ifdef NT_HAVE_MPI
        if (mpi_finalized) {
            g_mutex_unlock(&dist_lock);
            return nt__err(NULL, NT_ESTATE, "nt_init",
                           "MPI was finalized by an earlier nt_shutdown and cannot start again "
                           "in this process (an MPI program runs nt_init .. nt_shutdown once)");
        }
        int inited = 0;
        MPI_Initialized(&inited);
        int prov = MPI_THREAD_SINGLE;
        if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov) != MPI_SUCCESS) {
            g_mutex_unlock(&dist_lock);
            return nt__err(NULL, NT_ECOMM, "nt_init", "MPI_Init_thread failed");
        }
        if (inited)
            MPI_Query_thread(&prov);
        if (prov < MPI_THREAD_SERIALIZED) {
            g_mutex_unlock(&dist_lock);
            return nt__err(NULL, NT_ECOMM, "nt_init",
                           "MPI gives thread level %d; ntensor needs MPI_THREAD_SERIALIZED or "
                           "more (stream workers make the calls)",
                           prov);
        }
        /* Errors come back as codes, so a dead peer is our error message
         * naming the collective, not MPI's abort of the job. */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &proc_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &proc_count);
        __atomic_store_n(&mpi_on, true, __ATOMIC_RELEASE);
#else
        nt__log(NT__LOG_WARN,
                "launched by mpirun, but this ntensor was built without MPI (meson option "
                "-Dmpi=enabled): every process runs alone");
#endif
    }
    dist_inited = true;
    g_mutex_unlock(&dist_lock);
    return 0;
}

void nt__dist_shutdown(void)
{
    g_mutex_lock(&dist_lock);
    if (!dist_inited) {
        g_mutex_unlock(&dist_lock);
        return;
    }
    AO_fetch_and_add1_release(&generation);
#ifdef NT_HAVE_MPI
    if (mpi_on) {
        __atomic_store_n(&mpi_on, false, __ATOMIC_RELEASE);
        int fin = 0;
        MPI_Finalized(&fin);
        /* After a peer failed, MPI_Finalize may wait for it forever (its
         * fence counts the dead process): the process ends without it. */
        if (!fin && !peer_has_failed())
            MPI_Finalize();
        mpi_finalized = true;
    }
#endif
    proc_rank = 0;
    proc_count = 1;
    dist_inited = false;
    g_mutex_unlock(&dist_lock);
}

#ifdef NT_HAVE_MPI

/* Every MPI call is made under this lock: stream workers of several
 * communicators may exchange at once, and MPI_THREAD_SERIALIZED is all we
 * ask of the library. */
static GMutex mpi_lock;

struct nt__pcomm {
    MPI_Comm comm;
    int nproc, me;
    unsigned tag;    /* next exchange's tag: calls on one pcomm are ordered */
    bool broken;     /* an exchange failed: its requests may still be live */
};

/* Polls reqs until all completed or the timeout: 0, NT_ETIMEDOUT (done[]
 * says which are still open) or NT_ECOMM (MPI returned an error). */
static int poll_all(MPI_Request *reqs, int n, const char *what, char *errbuf, size_t errlen,
                    const int *peer_of)
{
    double deadline = (double)nt__now_ns() + nt__coll_timeout_s() * 1e9;
    unsigned spins = 0;
    for (;;) {
        int flag = 0;
        g_mutex_lock(&mpi_lock);
        int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
        g_mutex_unlock(&mpi_lock);
        if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, s, &len);
            snprintf(errbuf, errlen, "MPI failed while %s: %s", what, s);
            return NT_ECOMM;
        }
        if (flag)
            return 0;
        if ((double)nt__now_ns() > deadline) {
            /* name the first process not heard from */
            int who = -1;
            for (int i = 0; i < n && who < 0; i++) {
                int f = 0;
                g_mutex_lock(&mpi_lock);
                if (reqs[i] != MPI_REQUEST_NULL)
                    MPI_Test(&reqs[i], &f, MPI_STATUS_IGNORE);
                else
                    f = 1;
                g_mutex_unlock(&mpi_lock);
                if (!f && peer_of[i] >= 0)
                    who = peer_of[i];
            }
            snprintf(errbuf, errlen,
                     "timed out after %g s (NT_COLLECTIVE_TIMEOUT) %s: process %d did not answer "
                     "(it exited, died or did not reach the same collective)",
                     nt__coll_timeout_s(), what, who);
            return NT_ETIMEDOUT;
        }
        /* spin briefly, then sleep: a collective waits for its peers'
         * kernels, which take milliseconds */
        if (++spins > 64)
            g_usleep(spins > 1024 ? 1000 : 50);
    }
}

/* After a failed exchange the requests may still be matched later: MPI may
 * still write the receive buffers and read the send buffers, so they are
 * kept (reachable, not freed) and the communicator is not used again. */
static nt__ptrvec *abandoned;
static bool peer_failed; /* under mpi_lock */

static bool peer_has_failed(void)
{
    g_mutex_lock(&mpi_lock);
    bool f = peer_failed;
    g_mutex_unlock(&mpi_lock);
    return f;
}

static void abandon(nt__pcomm *pc, MPI_Request *reqs, int n, void *a, void *b)
{
    g_mutex_lock(&mpi_lock);
    pc->broken = true;
    peer_failed = true;
    for (int i = 0; i < n; i++)
        if (reqs[i] != MPI_REQUEST_NULL)
            MPI_Request_free(&reqs[i]);
    if (!abandoned)
        abandoned = nt__ptrvec_new(8);
    if (abandoned) {
        nt__ptrvec_add(abandoned, a);
        nt__ptrvec_add(abandoned, b);
    }
    g_mutex_unlock(&mpi_lock);
}

int nt__pcomm_create(int mine, int *counts, nt__pcomm **out, char *errbuf, size_t errlen)
{
    *out = NULL;
    if (!nt__mpi_active()) {
        counts[0] = mine;
        return 0;
    }
    nt__pcomm *pc = calloc(1, sizeof *pc);
    int *buf = malloc(sizeof *buf * (size_t)proc_count);
    if (!pc || !buf) {
        free(pc);
        free(buf);
        snprintf(errbuf, errlen, "out of host memory for the communicator");
        return NT_EHOSTMEM;
    }
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int peer[2] = {-1, -1};
    g_mutex_lock(&mpi_lock);
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &pc->comm, &req[0]);
    g_mutex_unlock(&mpi_lock);
    if (rc == MPI_SUCCESS)
        rc = poll_all(req, 1, "creating the communicator (MPI_Comm_idup)", errbuf, errlen,
                      peer);
    else {
        snprintf(errbuf, errlen, "MPI_Comm_idup failed");
        rc = NT_ECOMM;
    }
    if (rc < 0) {
        if (rc == NT_ETIMEDOUT) { /* the request may still complete: keep pc */
            nt__pcomm dummy = {0};
            abandon(&dummy, req, 1, pc, buf);
        } else {
            free(pc);
            free(buf);
        }
        return rc;
    }
    MPI_Comm_set_errhandler(pc->comm, MPI_ERRORS_RETURN);
    pc->nproc = proc_count;
    pc->me = proc_rank;
    buf[pc->me] = mine;
    g_mutex_lock(&mpi_lock);
    rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_INT, buf, 1, MPI_INT, pc->comm, &req[1]);
    g_mutex_unlock(&mpi_lock);
    if (rc == MPI_SUCCESS)
        rc = poll_all(&req[1], 1, "exchanging the members' counts", errbuf, errlen, peer);
    else {
        snprintf(errbuf, errlen, "MPI_Iallgather failed");
        rc = NT_ECOMM;
    }
    if (rc < 0) {
        abandon(pc, &req[1], 1, buf, NULL);
        return rc; /* pc stays, broken, on the abandoned list's side */
    }
    memcpy(counts, buf, sizeof *buf * (size_t)proc_count);
    free(buf);
    *out = pc;
    return 0;
}

void nt__pcomm_destroy(nt__pcomm *pc)
{
    if (!pc)
        return;
    if (!pc->broken && nt__mpi_active()) {
        g_mutex_lock(&mpi_lock);
        MPI_Comm_free(&pc->comm);
        g_mutex_unlock(&mpi_lock);
    }
    if (!pc->broken)
        free(pc);
}

int nt__pcomm_allgather(nt__pcomm *pc, const void *send, void *recv, const size_t *len,
                        const size_t *off, const char *what, char *errbuf, size_t errlen)
{
    int np = pc->nproc, me = pc->me;
    if ((char *)recv + off[me] != send)
        memcpy((char *)recv + off[me], send, len[me]);
    if (pc->broken) {
        snprintf(errbuf, errlen, "an earlier exchange on this communicator failed");
        return NT_ECOMM;
    }
    if (!nt__mpi_active()) {
        snprintf(errbuf, errlen, "MPI was finalized (nt_shutdown)");
        return NT_ESTATE;
    }
    /* Nonblocking point-to-point, one send and one receive per peer; MPI
     * counts are ints, so big blocks go in pieces of at most 1 GiB. */
    const size_t piece = (size_t)1 << 30;
    int nreq = 0;
    for (int p = 0; p < np; p++)
        if (p != me)
            nreq += 2 * (int)((len[p] + piece - 1) / piece + (len[me] + piece - 1) / piece) + 2;
    MPI_Request *reqs = malloc(sizeof *reqs * (size_t)nreq);
    int *peer = malloc(sizeof *peer * (size_t)nreq);
    /* both buffers must outlive a failure (see abandon) */
    size_t total = 1;
    for (int p = 0; p < np; p++)
        if (off[p] + len[p] > total)
            total = off[p] + len[p];
    void *sbuf = malloc(len[me] ? len[me] : 1);
    char *rbuf = malloc(total);
    if (!reqs || !peer || !sbuf || !rbuf) {
        free(reqs);
        free(peer);
        free(sbuf);
        free(rbuf);
        snprintf(errbuf, errlen, "out of host memory for the exchange");
        return NT_EHOSTMEM;
    }
    memcpy(sbuf, send, len[me]);
    int n = 0, rc = MPI_SUCCESS;
    g_mutex_lock(&mpi_lock);
    int tag = (int)(pc->tag++ % 30000u);
    for (int p = 0; p < np && rc == MPI_SUCCESS; p++) {
        if (p == me)
            continue;
        for (size_t o = 0; o < len[p] && rc == MPI_SUCCESS; o += piece) {
            peer[n] = p;
            rc = MPI_Irecv(rbuf + off[p] + o, (int)(len[p] - o < piece ? len[p] - o : piece),
                           MPI_BYTE, p, tag, pc->comm, &reqs[n++]);
        }
        for (size_t o = 0; o < len[me] && rc == MPI_SUCCESS; o += piece) {
            peer[n] = p;
            rc = MPI_Isend((char *)sbuf + o, (int)(len[me] - o < piece ? len[me] - o : piece),
                           MPI_BYTE, p, tag, pc->comm, &reqs[n++]);
        }
    }
    g_mutex_unlock(&mpi_lock);
    int ret = 0;
    if (rc != MPI_SUCCESS) {
        snprintf(errbuf, errlen, "MPI failed to start the exchange");
        ret = NT_ECOMM;
    } else {
        ret = poll_all(reqs, n, what, errbuf, errlen, peer);
    }
    if (ret < 0) {
        abandon(pc, reqs, n, sbuf, rbuf);
    } else {
        for (int p = 0; p < np; p++)
            if (p != me)
                memcpy((char *)recv + off[p], rbuf + off[p], len[p]);
        free(sbuf);
        free(rbuf);
    }
    free(reqs);
    free(peer);
    return ret;
}

#else /* no MPI: one process */

struct nt__pcomm {
    int unused;
};

int nt__pcomm_create(int mine, int *counts, nt__pcomm **out, char *errbuf, size_t errlen)
{
    (void)errbuf;
    (void)errlen;
    counts[0] = mine;
    *out = NULL;
    return 0;
}

void nt__pcomm_destroy(nt__pcomm *pc) { (void)pc; }

int nt__pcomm_allgather(nt__pcomm *pc, const void *send, void *recv, const size_t *len,
                        const size_t *off, const char *what, char *errbuf, size_t errlen)
{
    (void)pc;
    (void)what;
    (void)errbuf;
    (void)errlen;
    if ((char *)recv + off[0] != send)
        memcpy((char *)recv + off[0], send, len[0]);
    return 0;
}

#endif
