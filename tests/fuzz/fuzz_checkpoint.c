/* tests/fuzz/fuzz_checkpoint.c - fuzz target for nt_checkpoint_load / nt_load.
 *
 * Input: one flags byte, then the bytes of a checkpoint file.
 *   bit 0  recompute every CRC before loading, so that mutations reach the
 *          field checks instead of dying at the checksum
 *   bit 1  restore into an SGD optimizer (else AdamW)
 *   bit 2  that optimizer keeps master weights
 *   bit 3  pass a loss scaler too
 *   bit 4  pass no optimizer
 * The parameters are always p0 f32 [3] and p1 bf16 [2, 2], as in the seed
 * corpus (tests/fuzz/corpus/checkpoint, written by make_corpus.c).
 *
 * What must hold for every input: no crash, no sanitizer report; the load
 * returns 0 or a negative NT_E* code equal to nt_last_error() with a message
 * that names the function; nt_load (no optimizer, no scaler) accepts every
 * file the full load accepted; a successful load leaves finite, in-range
 * hyper-parameters (no NaN lr, no beta1 >= 1, no negative step count). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ntensor.h"
#include "tests/crc32.h"

static nt_tensor *P[2];
static nt_optim *sgd, *adam, *adam_m, *sgd_m;
static nt_grad_scaler *scaler;
static char path[256];

static void fail(const char *what, int rc)
{
    fprintf(stderr, "fuzz_checkpoint: %s (rc %d, error %d: %s)\n", what, rc, nt_last_error(),
            nt_last_error_message());
    abort();
}

static void remove_input(void) { remove(path); }

static void init_once(void)
{
    if (P[0])
        return;
    setenv("NT_LOG", "error", 0);
    setenv("NT_HBM_BYTES", "256M", 0);
    if (nt_init() != 0)
        fail("nt_init", -1);
    P[0] = nt_zeros(NT_F32, 1, (int64_t[]){3});
    P[1] = nt_zeros(NT_BF16, 2, (int64_t[]){2, 2});
    nt_set_requires_grad(P[0], true);
    nt_set_requires_grad(P[1], true);
    sgd = nt_optim_sgd(P, 2, 0.1, 0.9, 0, false);
    sgd_m = nt_optim_sgd(P, 2, 0.1, 0.9, 0, false);
    adam = nt_optim_adamw(P, 2, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    adam_m = nt_optim_adamw(P, 2, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    scaler = nt_grad_scaler_create(NULL);
    if (!P[0] || !P[1] || !sgd || !sgd_m || !adam || !adam_m || !scaler)
        fail("fixture", -1);
    nt_optim_set_master_weights(sgd_m, true);
    nt_optim_set_master_weights(adam_m, true);
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/nt_fuzz_ckpt_%d.ntck", dir, (int)getpid());
    atexit(remove_input);
}

static uint64_t rd(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites the data CRCs of records whose bounds are inside the buffer and
 * the header CRC, as a writer would have. */
static void fix_crcs(uint8_t *b, size_t n)
{
    if (n < 40)
        return;
    uint64_t count = rd(b + 12, 4);
    if (count > (n - 40) / 96)
        return;
    for (uint64_t i = 0; i < count; i++) {
        uint8_t *e = b + 32 + 96 * i;
        uint64_t off = rd(e + 16, 8), len = rd(e + 24, 8);
        if (off <= n && len <= n - off)
            wr32(e + 12, crc32_ieee(b + off, len));
    }
    size_t te = 32 + 96 * (size_t)count + 8;
    wr32(b + te - 8, crc32_ieee(b, te - 8));
}

static void check_err(const char *fn, int rc)
{
    if (rc > 0 || rc < -15)
        fail("not an NT_E* code", rc);
    if (rc == 0)
        return;
    if (nt_last_error() != rc)
        fail("return value differs from nt_last_error()", rc);
    if (strncmp(nt_last_error_message(), fn, strlen(fn)) != 0)
        fail("message does not start with the function's name", rc);
}

static void check_hyper(nt_optim *o)
{
    double lr = nt_optim_get_lr(o);
    if (!(isfinite(lr) && lr >= 0))
        fail("a successful load left lr out of range", 0);
    if (nt_optim_steps(o) < 0)
        fail("a successful load left a negative step count", 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init_once();
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    size_t n = size - 1;
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return 0;
    memcpy(b, data + 1, n);
    if (flags & 1)
        fix_crcs(b, n);
    FILE *f = fopen(path, "wb");
    if (!f)
        fail("cannot write the input file", -1);
    if (fwrite(b, 1, n, f) != n)
        fail("cannot write the input file", -1);
    fclose(f);
    free(b);

    nt_optim *o = (flags & 16)  ? NULL
                  : (flags & 2) ? ((flags & 4) ? sgd_m : sgd)
                                : ((flags & 4) ? adam_m : adam);
    nt_grad_scaler *s = (flags & 8) ? scaler : NULL;
    nt_clear_error();
    int rc = nt_checkpoint_load(path, P, 2, o, s);
    check_err("nt_checkpoint_load", rc);
    if (rc == 0) {
        if (o)
            check_hyper(o);
        if (s && !(nt_grad_scaler_get_scale(s) > 0))
            fail("a successful load left the scale out of range", 0);
    }
    if (getenv("NT_FUZZ_VERBOSE")) /* what each input did, for a corpus check */
        fprintf(stderr, "flags 0x%02x, %zu bytes: %d %s\n", flags, n, rc,
                nt_last_error_message());
    nt_clear_error();
    int rc2 = nt_load(path, P, 2, NULL);
    check_err("nt_load", rc2);
    if (rc == 0 && rc2 != 0)
        fail("nt_load refused a file nt_checkpoint_load accepted", rc2);
    nt_clear_error();
    int rs = nt_sync();
    if (rs != 0)
        fail("queued copies of a load failed", rs);
    return 0;
}
