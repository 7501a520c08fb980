/* tests/fuzz/driver.c - runs a libFuzzer target without libFuzzer.
 *
 * The same harness (LLVMFuzzerTestOneInput) that clang's libFuzzer drives
 * for millions of executions (docs/fuzzing.md) runs here as a short,
 * deterministic regression in the normal gcc suite: every file of the seed
 * corpus, then N mutations of them from a fixed seed (bit flips, bytes set
 * to boundary values, 8-byte fields set to boundary integers and doubles,
 * truncation, duplicated and deleted chunks).  A broken invariant aborts
 * the harness; the driver prints TAP.
 *
 * Usage: driver CORPUS_DIR [N_MUTATIONS [SEED]]; NT_TEST_QUICK=1 divides N
 * by 10 (the sanitizer run). */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    uint8_t *d;
    size_t n;
} blob;

static uint64_t rng;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static size_t load_corpus(const char *dir, blob **out)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "driver: cannot open %s\n", dir);
        exit(2);
    }
    char **names = NULL;
    size_t nn = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        names = realloc(names, sizeof *names * (nn + 1));
        names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, nn, sizeof *names, cmp_names); /* readdir order is not fixed */
    blob *b = calloc(nn ? nn : 1, sizeof *b);
    size_t k = 0;
    for (size_t i = 0; i < nn; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        free(names[i]);
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        b[k].d = malloc(len > 0 ? (size_t)len : 1);
        b[k].n = fread(b[k].d, 1, len > 0 ? (size_t)len : 0, f);
        fclose(f);
        k++;
    }
    free(names);
    *out = b;
    return k;
}

static const uint8_t BYTES[] = {0, 1, 2, 3, 7, 8, 9, 0x7f, 0x80, 0xff, 0xfe, 64, 0x40, 0x3f};
static const int64_t INTS[] = {0, 1, -1, 2, 3, 64, 65, INT64_MAX, INT64_MIN, (int64_t)1 << 32,
                               (int64_t)1 << 48, (int64_t)1 << 62, -5, 0x7fffffff, 96};
static const double DBLS[] = {0.0, -0.0, 1.0, -1.0, 1.5, 0.999, NAN, INFINITY, -INFINITY,
                              1e-300, 1e300, 0.5};

/* One mutation of src into dst (dst->d has room for 2 * src->n + 64). */
static void mutate(const blob *src, blob *dst)
{
    memcpy(dst->d, src->d, src->n);
    dst->n = src->n;
    int rounds = 1 + (int)(next() % 4);
    for (int r = 0; r < rounds && dst->n; r++) {
        size_t at = next() % dst->n;
        switch (next() % 8) {
        case 0: dst->d[at] ^= (uint8_t)(1u << (next() % 8)); break;
        case 1: dst->d[at] = BYTES[next() % sizeof BYTES]; break;
        case 2: /* an 8-byte field (aligned, as the formats lay them out) */
            at &= ~(size_t)7;
            if (at + 8 <= dst->n) {
                int64_t v = INTS[next() % (sizeof INTS / sizeof INTS[0])];
                memcpy(dst->d + at, &v, 8);
            }
            break;
        case 3:
            at &= ~(size_t)7;
            if (at + 8 <= dst->n) {
                double v = DBLS[next() % (sizeof DBLS / sizeof DBLS[0])];
                memcpy(dst->d + at, &v, 8);
            }
            break;
        case 4: dst->n = at + 1; break; /* truncate */
        case 5: { /* duplicate a chunk */
            size_t len = 1 + next() % 32;
            if (at + len > dst->n)
                len = dst->n - at;
            if (dst->n + len <= 2 * src->n + 64) {
                memmove(dst->d + at + len, dst->d + at, dst->n - at);
                dst->n += len;
            }
            break;
        }
        case 6: { /* delete a chunk */
            size_t len = 1 + next() % 16;
            if (at + len > dst->n)
                len = dst->n - at;
            memmove(dst->d + at, dst->d + at + len, dst->n - at - len);
            dst->n -= len;
            break;
        }
        case 7: /* a 4-byte field */
            at &= ~(size_t)3;
            if (at + 4 <= dst->n) {
                uint32_t v = (uint32_t)INTS[next() % (sizeof INTS / sizeof INTS[0])];
                memcpy(dst->d + at, &v, 4);
            }
            break;
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR [N_MUTATIONS [SEED]]\n", argv[0]);
        return 2;
    }
    long n = argc > 2 ? atol(argv[2]) : 2000;
    rng = argc > 3 ? strtoull(argv[3], NULL, 0) : 0x9e3779b97f4a7c15ull;
    if (!rng)
        rng = 1;
    uint64_t seed = rng;
    const char *q = getenv("NT_TEST_QUICK");
    if (q && *q && *q != '0')
        n /= 10;
    blob *corpus;
    size_t nc = load_corpus(argv[1], &corpus);
    printf("1..2\n");
    if (!nc) {
        printf("not ok 1 - corpus %s is empty\n", argv[1]);
        return 1;
    }
    for (size_t i = 0; i < nc; i++)
        LLVMFuzzerTestOneInput(corpus[i].d, corpus[i].n);
    printf("ok 1 - %zu corpus inputs\n", nc);
    size_t maxn = 0;
    for (size_t i = 0; i < nc; i++)
        if (corpus[i].n > maxn)
            maxn = corpus[i].n;
    blob m = {malloc(2 * maxn + 64), 0};
    for (long i = 0; i < n; i++) {
        mutate(&corpus[next() % nc], &m);
        LLVMFuzzerTestOneInput(m.d, m.n);
    }
    printf("ok 2 - %ld mutations (seed 0x%llx)\n", n, (unsigned long long)seed);
    free(m.d);
    for (size_t i = 0; i < nc; i++)
        free(corpus[i].d);
    free(corpus);
    return 0;
}
