/* tests/fuzz/make_corpus.c - writes the seed corpora of the fuzz targets.
 *
 * Checkpoints (corpus/checkpoint/): files nt_checkpoint_save writes for the
 * parameters fuzz_checkpoint.c loads into (p0 f32 [3], p1 bf16 [2, 2]) with
 * no optimizer, SGD (plain, momentum, Nesterov), AdamW before and after
 * steps, master weights, and a loss scaler; each prefixed by the flags byte
 * that loads it successfully, and once more with the CRC-fixing bit set.
 * API programs (corpus/api/): a few op sequences that reach every opcode.
 * Run by hand (build/tests/fuzz/make_corpus tests/fuzz/corpus); the output
 * is committed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntensor.h"

static const char *root;

static void emit(const char *sub, const char *name, uint8_t flags, const char *ckpt)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", root, sub, name);
    FILE *out = fopen(path, "wb");
    if (!out) {
        perror(path);
        exit(1);
    }
    fputc(flags, out);
    if (ckpt) {
        FILE *in = fopen(ckpt, "rb");
        int c;
        while ((c = fgetc(in)) != EOF)
            fputc(c, out);
        fclose(in);
    }
    fclose(out);
}

static void step(nt_tensor **p, nt_optim *o)
{
    nt_optim_zero_grad(o);
    nt_tensor *l = nt_add(nt_sum(nt_mul(p[0], p[0]), NT_DIM_ALL, false),
                          nt_sum(nt_cast(p[1], NT_F32), NT_DIM_ALL, false));
    nt_backward(l);
    nt_optim_step(o);
    nt_release(l);
}

static void ckpt(const char *name, int kind, bool master, int steps, bool scaler, uint8_t flags)
{
    nt_tensor *p[2] = {nt_randn(NT_F32, 1, (int64_t[]){3}, 1),
                       nt_cast(nt_randn(NT_F32, 2, (int64_t[]){2, 2}, 2), NT_BF16)};
    nt_set_requires_grad(p[0], true);
    nt_set_requires_grad(p[1], true);
    nt_optim *o = kind == 1   ? nt_optim_sgd(p, 2, 0.1, 0.9, 1e-4, false)
                  : kind == 2 ? nt_optim_sgd(p, 2, 0.05, 0.5, 0, true)
                  : kind == 3 ? nt_optim_adamw(p, 2, 1e-3, 0.9, 0.999, 1e-8, 0.01)
                              : NULL;
    if (o && master)
        nt_optim_set_master_weights(o, true);
    for (int i = 0; i < steps && o; i++)
        step(p, o);
    nt_grad_scaler *s = scaler ? nt_grad_scaler_create(NULL) : NULL;
    const char *tmp = "/tmp/nt_make_corpus.ntck";
    if (nt_checkpoint_save(tmp, p, 2, o, s) != 0) {
        fprintf(stderr, "%s: %s\n", name, nt_last_error_message());
        exit(1);
    }
    char n2[128];
    emit("checkpoint", name, flags, tmp);
    snprintf(n2, sizeof n2, "%s-crcfix", name);
    emit("checkpoint", n2, flags | 1, tmp);
    remove(tmp);
    nt_grad_scaler_destroy(s);
    nt_optim_destroy(o);
    nt_release(p[0]);
    nt_release(p[1]);
}

static void api(const char *name, const uint8_t *prog, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/api/%s", root, name);
    FILE *f = fopen(path, "wb");
    fwrite(prog, 1, n, f);
    fclose(f);
}

int main(int argc, char **argv)
{
    root = argc > 1 ? argv[1] : "tests/fuzz/corpus";
    nt_init();
    /* flags: bit1 SGD, bit2 master weights, bit3 scaler, bit4 no optimizer */
    ckpt("params-only", 0, false, 0, false, 16);
    ckpt("sgd-fresh", 1, false, 0, false, 2);
    ckpt("sgd-momentum-2steps", 1, false, 2, false, 2);
    ckpt("sgd-nesterov-3steps", 2, false, 3, false, 2);
    ckpt("sgd-master-2steps", 1, true, 2, false, 2 | 4);
    ckpt("adamw-fresh", 3, false, 0, false, 0);
    ckpt("adamw-3steps", 3, false, 3, false, 0);
    ckpt("adamw-master-2steps", 3, true, 2, false, 4);
    ckpt("adamw-scaler-1step", 3, false, 1, true, 8);
    ckpt("sgd-scaler", 1, false, 1, true, 2 | 8);
    /* API programs: opcode, out register, arguments (fuzz_api.c's step()) */
    static const uint8_t p1[] = {
        0, 0, 0, 2, 2, 3, 9, 9, 9, 9, 9, 9, 9, 9, 0, 1,      /* r0 = zeros f32 [2,3] */
        0, 1, 0, 2, 2, 3, 9, 9, 9, 9, 9, 9, 9, 9, 3, 1, 5,   /* r1 = rand [2,3] */
        4, 2, 0, 0, 1,                                       /* r2 = r0 + r1 */
        3, 3, 5, 2,                                          /* r3 = relu(r2) */
        6, 4, 3, 1, 0, 0,                                    /* r4 = sum(r3, dim -5...) */
        17, 0, 3, 0, 0,                                      /* to_host(r3) */
        5, 5, 3, 4, 2, 4,                                    /* r5 = clamp(r3, .5, 2) */
        16, 3,                                               /* release r3 */
        3, 6, 0, 3,                                          /* r6 = neg(stale r3) */
        18, 0,                                               /* sync */
    };
    api("basic", p1, sizeof p1);
    static const uint8_t p2[] = {
        0, 0, 0, 3, 1, 1, 9, 9, 9, 9, 9, 9, 9, 9, 0, 1,      /* r0 = zeros [1,1] */
        11, 1, 0, 3, 213, 1, 9, 9, 9, 9, 9, 9, 9, 9,          /* r1 = expand(r0, [2^33, 1]) */
        11, 2, 0, 3, 1, 211, 9, 9, 9, 9, 9, 9, 9, 9,          /* r2 = expand(r0, [1, 2^31]) */
        4, 3, 0, 1, 2,                                       /* r3 = r1 + r2: must fail */
        7, 4, 0, 3, 16, 217, 9, 9, 9, 9, 9, 9, 9, 9,          /* reshape to [16, 2^62] */
        10, 5, 0, 1, 0, 3, 218,                              /* slice step INT64_MAX */
        12, 6, 1, 1, 1, 1, 3, 0,                             /* cat */
        14, 7, 0, 0, 1,                                      /* matmul */
        21, 0, 0, 1,                                         /* NT_MODE lazy */
        21, 0, 3, 7,                                         /* NT_MIN_SIM_FLOPS -1 */
        20, 0, 0, 0, 1,                                      /* requires grad */
        20, 1, 0, 1,                                         /* backward */
        20, 2, 0, 2,                                         /* grad */
        15, 0, 0, 1, 0, 4,                                   /* clamp_inplace */
        19, 3, 0, 1, 2, 3, 2,                                /* cross_entropy */
        22, 0, 0, 250,                                       /* metadata */
        23, 0, 0,                                            /* retain/release */
        13, 1, 0, 1, 1,                                      /* cast_sr */
        8, 2, 0, 1, 0,                                       /* transpose */
        9, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0,                     /* permute */
        1, 4, 2, 3, 0,                                       /* from_host */
        2, 5, 0, 0, 3, 2,                                    /* arange */
    };
    api("hostile", p2, sizeof p2);
    nt_shutdown();
    return 0;
}
