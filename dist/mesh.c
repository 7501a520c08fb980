/* dist/mesh.c - a device mesh: the global ranks (every device of every
 * process, process by process) laid out row-major over named dimensions
 * (data, tensor, expert), and a communicator for each sub-group along a
 * dimension (docs/sharding.md).
 *
 * Global rank r has coordinates c[a] = (r / stride[a]) % dims[a], stride of
 * the last dimension 1.  The group of r along dimension a is the ranks that
 * differ from r in c[a] only; in increasing rank order they are in
 * increasing c[a], and a communicator's global ranks go by process, then
 * local index: so rank i of the group's communicator is coordinate i.
 *
 * A group inside one process gets a communicator of that process alone
 * (nt__comm_create_local: no exchange); a group spanning every process one
 * of nt_comm_create (collective: every process makes the same groups in the
 * same order, dimension by dimension, groups by their first rank).  A group
 * spanning some processes but not all is refused (NT_ENOTSUP). */
#include "core/handle.h"
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MESH_MAGIC 0x4d455348u /* "MESH" */
#define MESH_MAX_DIMS 3
#define MESH_NAME 16
/* What every process exchanges: its device count, ndims, dims, names. */
#define MESH_DESC (2 + MESH_MAX_DIMS + MESH_MAX_DIMS * MESH_NAME / 4)

static const char *const known[MESH_MAX_DIMS] = {"data", "tensor", "expert"};

struct nt_mesh {
    NT__HOBJ_HEAD;
    int ndims;
    int dims[MESH_MAX_DIMS];
    char names[MESH_MAX_DIMS][MESH_NAME];
    int ndev;                     /* this process's devices */
    int first;                    /* global rank of its device 0 */
    int size;                     /* global ranks */
    nt_comm **comm;               /* [ndims * ndev] the group of device i along a */
    nt_comm **owned;              /* the distinct communicators made */
    int nowned;
};

static void mesh_free(nt_mesh *m)
{
    if (!m)
        return;
    if (nt__hobj_current(m))
        for (int i = 0; i < m->nowned; i++)
            nt_comm_destroy(m->owned[i]);
    free(m->owned);
    free(m->comm);
    nt__hobj_free(m);
}

static int dim_index(const nt_mesh *m, const char *name)
{
    for (int a = 0; name && a < m->ndims; a++)
        if (!strcmp(m->names[a], name))
            return a;
    return -1;
}

static void layout_str(const int32_t *desc, char *buf, size_t n)
{
    int nd = desc[1];
    size_t at = 0;
    buf[0] = 0;
    for (int a = 0; a < nd && a < MESH_MAX_DIMS && at < n; a++) {
        char nm[MESH_NAME + 1] = {0};
        memcpy(nm, (const char *)(desc + 2 + MESH_MAX_DIMS) + a * MESH_NAME, MESH_NAME);
        at += (size_t)snprintf(buf + at, n - at, "%s%s=%d", a ? " x " : "", nm, desc[2 + a]);
    }
}

static bool check_args(const int *dims, const char *const *names, int ndims)
{
    const char *fn = "nt_mesh_create";
    if (!dims || !names)
        return nt__err(NULL, NT_EINVAL, fn, "argument '%s' is NULL", dims ? "names" : "dims"),
               false;
    if (ndims < 1 || ndims > MESH_MAX_DIMS)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'ndims' is %d; expected 1..%d", ndims,
                       MESH_MAX_DIMS),
               false;
    for (int a = 0; a < ndims; a++) {
        if (dims[a] < 1)
            return nt__err(NULL, NT_EINVAL, fn, "argument 'dims[%d]' is %d; expected >= 1", a,
                           dims[a]),
                   false;
        int k = 0;
        while (k < MESH_MAX_DIMS && !(names[a] && !strcmp(names[a], known[k])))
            k++;
        if (k == MESH_MAX_DIMS)
            return nt__err(NULL, NT_EINVAL, fn, "argument 'names[%d]' is %s%s%s; expected "
                           "\"data\", \"tensor\" or \"expert\"", a, names[a] ? "\"" : "",
                           names[a] ? names[a] : "NULL", names[a] ? "\"" : ""),
                   false;
        for (int b = 0; b < a; b++)
            if (!strcmp(names[a], names[b]))
                return nt__err(NULL, NT_EINVAL, fn, "argument 'names' gives \"%s\" at %d and "
                               "%d; expected distinct names", names[a], b, a),
                       false;
    }
    return true;
}

/* Every process's description (its device count and layout) into all
 * [nproc * MESH_DESC], exchanged over `world` (a collective of every
 * device); 0 or an error. */
static int exchange(nt_comm *world, const int32_t *mine, int ndev, int32_t *all, int nproc)
{
    if (nproc == 1) {
        memcpy(all, mine, sizeof(int32_t) * MESH_DESC);
        return 0;
    }
    nt_tensor *in[NT_MAX_DEVICES] = {0}, *out[NT_MAX_DEVICES] = {0};
    nt_stream *old = nt_stream_current();
    int rc = 0;
    nt_scope *sc = nt_scope_begin();
    if (!sc)
        return nt__err_hostmem(NULL, "nt_mesh_create", "a scope");
    for (int i = 0; i < ndev && !rc; i++) {
        nt_device_set(i);
        in[i] = nt_from_host(mine, NT_I32, 1, (int64_t[]){MESH_DESC});
        rc = in[i] ? 0 : nt_last_error();
    }
    nt_stream_set_current(old);
    if (!rc)
        rc = nt_all_gather(world, in, out);
    int total = nt_comm_size(world);
    int32_t *every = rc ? NULL : malloc(sizeof(int32_t) * MESH_DESC * (size_t)total);
    if (!rc && !every)
        rc = nt__err_hostmem(NULL, "nt_mesh_create", "the layouts");
    if (!rc)
        rc = nt_to_host(out[0], every, sizeof(int32_t) * MESH_DESC * (size_t)total);
    /* the first rank of each process: walk the blocks by their device counts */
    for (int p = 0, r = 0; !rc && p < nproc; p++) {
        if (r >= total) {
            rc = nt__err(NULL, NT_ECOMM, "nt_mesh_create", "the processes' device counts do "
                         "not add up to the %d ranks", total);
            break;
        }
        memcpy(all + (size_t)p * MESH_DESC, every + (size_t)r * MESH_DESC,
               sizeof(int32_t) * MESH_DESC);
        r += every[(size_t)r * MESH_DESC] > 0 ? every[(size_t)r * MESH_DESC] : 1;
    }
    free(every);
    nt_scope_end(sc);
    return rc;
}

/* The communicators of dimension a: one per group with a member here. */
static int make_groups(nt_mesh *m, int a, const int *pcount, const int *pfirst, int nproc,
                       int me)
{
    int stride = 1;
    for (int b = a + 1; b < m->ndims; b++)
        stride *= m->dims[b];
    int n = m->dims[a];
    for (int base = 0; base < m->size; base++) {
        if ((base / stride) % n)
            continue; /* not a group's first rank */
        int lo_p = -1, hi_p = -1, devs[NT_MAX_DEVICES], nd = 0;
        for (int c = 0; c < n; c++) {
            int r = base + c * stride, p = 0;
            while (p + 1 < nproc && r >= pfirst[p + 1])
                p++;
            lo_p = lo_p < 0 || p < lo_p ? p : lo_p;
            hi_p = p > hi_p ? p : hi_p;
            if (p == me)
                devs[nd++] = r - pfirst[me];
        }
        bool every = lo_p == 0 && hi_p == nproc - 1;
        bool one = lo_p == hi_p;
        if (!one && !every)
            return nt__err(NULL, NT_ENOTSUP, "nt_mesh_create",
                           "the \"%s\" group of rank %d spans processes %d..%d of %d; a group "
                           "must lie in one process or span all of them",
                           m->names[a], base, lo_p, hi_p, nproc);
        if (!nd && !every)
            continue;
        if (!nd)
            return nt__err(NULL, NT_ENOTSUP, "nt_mesh_create",
                           "the \"%s\" group of rank %d has no device in process %d", m->names[a],
                           base, me);
        nt_comm *c = one && nproc > 1 ? nt__comm_create_local(devs, nd) : nt_comm_create(devs, nd);
        if (!c)
            return nt__err_or(NT_EINVAL);
        m->owned[m->nowned++] = c;
        for (int i = 0; i < nd; i++)
            m->comm[a * m->ndev + devs[i]] = c;
        (void)pcount;
    }
    return 0;
}

NT_API nt_mesh *nt_mesh_create(const int *dims, const char *const *names, int ndims)
{
    const char *fn = "nt_mesh_create";
    if (!nt__ensure_init() || !check_args(dims, names, ndims))
        return NULL;
    int ndev = nt_device_count(), nproc = nt__mpi_active() ? nt_process_count() : 1;
    int me = nproc > 1 ? nt_process_rank() : 0;
    int32_t mine[MESH_DESC] = {0};
    mine[0] = ndev, mine[1] = ndims;
    for (int a = 0; a < ndims; a++) {
        mine[2 + a] = dims[a];
        strncpy((char *)(mine + 2 + MESH_MAX_DIMS) + a * MESH_NAME, names[a], MESH_NAME - 1);
    }
    int devs[NT_MAX_DEVICES];
    for (int i = 0; i < ndev; i++)
        devs[i] = i;
    nt_comm *world = nproc > 1 ? nt_comm_create(devs, ndev) : NULL;
    if (nproc > 1 && !world)
        return NULL;
    int32_t *all = calloc((size_t)nproc, sizeof(int32_t) * MESH_DESC);
    int *pcount = calloc((size_t)nproc * 2, sizeof *pcount);
    nt_mesh *m = nt__hobj_new(sizeof *m, MESH_MAGIC);
    int rc = !all || !pcount || !m ? nt__err_hostmem(NULL, fn, "the mesh") : 0;
    if (!rc)
        rc = exchange(world, mine, ndev, all, nproc);
    nt_comm_destroy(world);
    int *pfirst = pcount ? pcount + nproc : NULL;
    for (int p = 0; !rc && p < nproc; p++) {
        const int32_t *o = all + (size_t)p * MESH_DESC;
        if (memcmp(o + 1, mine + 1, sizeof(int32_t) * (MESH_DESC - 1))) {
            char a1[128], a2[128];
            layout_str(mine, a1, sizeof a1), layout_str(o, a2, sizeof a2);
            rc = nt__err(NULL, NT_EINVAL, fn, "process %d asks for the mesh %s but process %d "
                         "for %s; every process must give the same dims and names",
                         me, a1, p, a2);
        }
        pcount[p] = o[0];
        pfirst[p] = p ? pfirst[p - 1] + pcount[p - 1] : 0;
    }
    if (!rc) {
        m->ndims = ndims, m->ndev = ndev, m->first = pfirst[me];
        m->size = pfirst[nproc - 1] + pcount[nproc - 1];
        int prod = 1;
        char lay[128];
        for (int a = 0; a < ndims; a++) {
            m->dims[a] = dims[a], prod *= dims[a];
            snprintf(m->names[a], MESH_NAME, "%s", names[a]);
        }
        layout_str(mine, lay, sizeof lay);
        if (prod != m->size)
            rc = nt__err(NULL, NT_EINVAL, fn, "the mesh %s has %d ranks but there are %d "
                         "devices (%d here, %d processes); the dims' product must equal the "
                         "device count", lay, prod, m->size, ndev, nproc);
    }
    if (!rc) {
        m->comm = calloc((size_t)ndims * ndev, sizeof *m->comm);
        m->owned = calloc((size_t)ndims * ndev, sizeof *m->owned);
        rc = m->comm && m->owned ? 0 : nt__err_hostmem(NULL, fn, "the mesh's communicators");
    }
    for (int a = 0; a < ndims && !rc; a++)
        rc = make_groups(m, a, pcount, pfirst, nproc, me);
    free(all), free(pcount);
    if (rc) {
        mesh_free(m);
        return NULL;
    }
    return m;
}

NT_API void nt_mesh_destroy(nt_mesh *m)
{
    if (!m)
        return;
    if (!nt__hobj_live(m, MESH_MAGIC)) {
        nt__hobj_check(m, MESH_MAGIC, NULL, "nt_mesh_destroy", "m", "mesh");
        return;
    }
    mesh_free(m);
}

/* need_name: the call names a dimension (NULL refused); dev -2: none. */
static int mesh_arg(const nt_mesh *m, const char *fn, const char *name, bool need_name, int dev,
                    int *a)
{
    if (!nt__ensure_init())
        return NT_ESTATE;
    int rc = nt__hobj_check(m, MESH_MAGIC, NULL, fn, "m", "mesh");
    if (rc)
        return rc;
    if (name && (*a = dim_index(m, name)) < 0) {
        char lay[128];
        int32_t desc[MESH_DESC] = {0};
        desc[1] = m->ndims;
        for (int b = 0; b < m->ndims; b++) {
            desc[2 + b] = m->dims[b];
            memcpy((char *)(desc + 2 + MESH_MAX_DIMS) + b * MESH_NAME, m->names[b], MESH_NAME);
        }
        layout_str(desc, lay, sizeof lay);
        return nt__err(NULL, NT_EINVAL, fn, "argument 'name' is \"%s\"; the mesh %s has no such "
                       "dimension", name, lay);
    }
    if (!name && need_name)
        return nt__err(NULL, NT_EINVAL, fn, "argument 'name' is NULL");
    if (dev != -2 && (dev < 0 || dev >= m->ndev))
        return nt__err(NULL, NT_EINVAL, fn, "argument 'dev' is %d; expected a device 0..%d of "
                       "this process", dev, m->ndev - 1);
    return 0;
}

NT_API nt_comm *nt_mesh_comm(nt_mesh *m, const char *name, int dev)
{
    int a = -1;
    if (mesh_arg(m, "nt_mesh_comm", name, true, dev, &a))
        return NULL;
    return m->comm[a * m->ndev + dev];
}

NT_API int nt_mesh_size(const nt_mesh *m, const char *name)
{
    int a = -1;
    int rc = mesh_arg(m, "nt_mesh_size", name, false, -2, &a);
    if (rc)
        return rc;
    return name ? m->dims[a] : m->size;
}

NT_API int nt_mesh_coord(const nt_mesh *m, const char *name, int dev)
{
    int a = -1;
    int rc = mesh_arg(m, "nt_mesh_coord", name, true, dev, &a);
    if (rc)
        return rc;
    int stride = 1;
    for (int b = a + 1; b < m->ndims; b++)
        stride *= m->dims[b];
    return ((m->first + dev) / stride) % m->dims[a];
}

NT_API int nt_mesh_rank(const nt_mesh *m, int dev)
{
    int a = -1;
    int rc = mesh_arg(m, "nt_mesh_rank", NULL, false, dev, &a);
    if (rc)
        return rc;
    return m->first + dev;
}

NT_API int nt_mesh_group(const nt_mesh *m, const char *name, int dev, int *devs, int cap)
{
    int a = -1;
    int rc = mesh_arg(m, "nt_mesh_group", name, true, dev, &a);
    if (rc)
        return rc;
    if (!devs || cap < 1)
        return nt__err(NULL, NT_EINVAL, "nt_mesh_group", "argument '%s' is %s; expected room "
                       "for the group's devices", devs ? "cap" : "devs", devs ? "< 1" : "NULL");
    int n = 0;
    for (int i = 0; i < m->ndev; i++)
        if (m->comm[a * m->ndev + i] == m->comm[a * m->ndev + dev]) {
            if (n == cap)
                return nt__err(NULL, NT_EINVAL, "nt_mesh_group", "argument 'cap' is %d; the "
                               "group has more devices here", cap);
            devs[n++] = i;
        }
    return n;
}
