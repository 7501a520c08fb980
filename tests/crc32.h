/* tests/crc32.h - CRC-32 (IEEE, the checksum of docs/checkpoint-format.md), for
 * tests that edit a checkpoint on purpose and rewrite its checksums so the
 * loader's field checks, not its CRC checks, must catch the edit. */
#ifndef NT_TESTS_CRC32_H
#define NT_TESTS_CRC32_H

#include <stddef.h>
#include <stdint.h>

static inline uint32_t crc32_ieee(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

#endif
