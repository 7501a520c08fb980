/* examples/fmnist.h - reads a split of Fashion-MNIST (the gzip'ed IDX
 * files of Debian's dataset-fashion-mnist), checking every field: the one
 * reader of examples/fashion_mnist.c, examples/cnn.c and bench/cnn_step.
 * Messages start with the caller's program name.  Needs zlib (-lz) when
 * fmnist_load is called. */
#ifndef NT_EXAMPLES_FMNIST_H
#define NT_EXAMPLES_FMNIST_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zlib.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define FMNIST_PIXELS 784
#define FMNIST_CLASSES 10

typedef struct {
    int n;
    uint8_t *images; /* [n, 784] */
    uint8_t *labels; /* [n] */
    /* the decompressed files images and labels point into (fmnist_free
     * frees them; NULL when the caller filled images and labels itself) */
    uint8_t *image_file, *label_file;
} fmnist_data;

static inline uint32_t fmnist_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The size a .gz file says its contents have (the trailer's ISIZE, the
 * length mod 2^32 of its last member), or 0 when it cannot be read or is
 * more than deflate can expand the file to (a damaged trailer). */
static inline size_t fmnist_gz_isize(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t t[4];
    size_t n = 0;
    long flen = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (flen >= 4 && fseek(f, -4, SEEK_END) == 0 && fread(t, 1, 4, f) == 4)
        n = (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 | (size_t)t[3] << 24;
    if (f)
        fclose(f);
    return n <= (size_t)flen * 1032 ? n : 0; /* deflate's ratio is at most 1032:1 */
}

/* A buffer of cap bytes for fmnist_read_gz (free() releases it): one of 2
 * MiB or more starts on a 2 MiB boundary and is advised onto huge pages,
 * so writing the 47 MB of training images takes a few dozen page faults,
 * not 11,500 (the advice may be refused; the bytes are the same). */
static inline uint8_t *fmnist_buffer(size_t cap)
{
    const size_t huge = (size_t)2 << 20;
    if (cap < huge)
        return malloc(cap);
    void *p = NULL;
    if (posix_memalign(&p, huge, (cap + huge - 1) / huge * huge) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, (cap + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
    return p;
}

/* Decompresses a whole .gz file into one buffer sized from its trailer
 * (grown if the trailer is short of the truth).  Returns the bytes
 * (free() releases them) or NULL after printing what went wrong, naming
 * the file. */
static inline uint8_t *fmnist_read_gz(const char *prog, const char *path, size_t *len)
{
    size_t isize = fmnist_gz_isize(path);
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open '%s': %s\n", prog, path,
                errno ? strerror(errno) : "out of memory");
        if (errno == ENOENT)
            fprintf(stderr, "%s: install Debian's package dataset-fashion-mnist "
                            "(sh scripts/deps.sh dataset-fashion-mnist) or pass --data DIR\n",
                    prog);
        return NULL;
    }
    /* one byte past the expected end, so the read that finds the end
     * needs no growth */
    size_t cap = isize + 1 > (size_t)1 << 20 ? isize + 1 : (size_t)1 << 20, n = 0;
    uint8_t *buf = fmnist_buffer(cap);
    for (;;) {
        if (n == cap && buf) {
            cap *= 2;
            uint8_t *grown = realloc(buf, cap);
            if (!grown)
                free(buf);
            buf = grown;
        }
        if (!buf) {
            fprintf(stderr, "%s: out of memory reading '%s'\n", prog, path);
            gzclose(f);
            return NULL;
        }
        unsigned want = cap - n > (1u << 30) ? 1u << 30 : (unsigned)(cap - n);
        int got = gzread(f, buf + n, want);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            fprintf(stderr, "%s: '%s' is not a valid gzip file: %s\n", prog, path,
                    zerr == Z_ERRNO ? strerror(errno) : msg);
            free(buf);
            gzclose(f);
            return NULL;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    /* A truncated stream ends without an error from gzread in some zlib
     * versions; gzclose_r reports it. */
    int zrc = gzclose(f);
    if (zrc != Z_OK) {
        fprintf(stderr, "%s: '%s' is %s\n", prog, path,
                zrc == Z_BUF_ERROR ? "truncated (the gzip stream ends early)"
                                   : "corrupt (gzip checksum or format error)");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Loads one split (images and labels) and checks every field. */
static inline int fmnist_load(const char *prog, const char *dir, const char *prefix,
                              fmnist_data *d)
{
    char ipath[4096], lpath[4096];
    snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    size_t ilen, llen;
    uint8_t *img = fmnist_read_gz(prog, ipath, &ilen);
    if (!img)
        return -1;
    uint8_t *lab = fmnist_read_gz(prog, lpath, &llen);
    if (!lab) {
        free(img);
        return -1;
    }
    const char *bad = NULL, *badpath = ipath;
    if (ilen < 16 || fmnist_be32(img) != 0x00000803)
        bad = "bad magic (expected an IDX file of unsigned bytes with 3 dims, 0x00000803)";
    else if (fmnist_be32(img + 8) != 28 || fmnist_be32(img + 12) != 28)
        bad = "images are not 28 x 28";
    else if ((uint64_t)ilen != 16 + (uint64_t)fmnist_be32(img + 4) * FMNIST_PIXELS)
        bad = "its size does not match the image count in its header (truncated?)";
    if (!bad) {
        badpath = lpath;
        if (llen < 8 || fmnist_be32(lab) != 0x00000801)
            bad = "bad magic (expected an IDX file of unsigned bytes with 1 dim, 0x00000801)";
        else if ((uint64_t)llen != 8 + (uint64_t)fmnist_be32(lab + 4))
            bad = "its size does not match the label count in its header (truncated?)";
        else if (fmnist_be32(lab + 4) != fmnist_be32(img + 4))
            bad = "its label count differs from the image count";
        else if (fmnist_be32(lab + 4) == 0 || fmnist_be32(lab + 4) > (1u << 28))
            bad = "implausible label count";
    }
    for (uint32_t i = 0; !bad && i < fmnist_be32(lab + 4); i++)
        if (lab[8 + i] >= FMNIST_CLASSES)
            bad = "a label is outside 0..9";
    if (bad) {
        fprintf(stderr, "%s: malformed file '%s': %s\n", prog, badpath, bad);
        free(img);
        free(lab);
        return -1;
    }
    /* the images and labels stay where they were decompressed: no copy */
    d->n = (int)fmnist_be32(img + 4);
    d->images = img + 16;
    d->labels = lab + 8;
    d->image_file = img;
    d->label_file = lab;
    return 0;
}

static inline void fmnist_free(fmnist_data *d)
{
    free(d->image_file);
    free(d->label_file);
    d->images = d->labels = d->image_file = d->label_file = NULL;
    d->n = 0;
}

#endif
