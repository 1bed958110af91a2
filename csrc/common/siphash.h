/* SipHash-1-3 (one compression round, three finalisation rounds) under a secret 128-bit key: the
 * keyed hash of every table whose keys a trace file chooses, in the policy kernel (allocation ids)
 * and in the readers (addresses, strings). A plain reversible mix would let crafted keys share one
 * probe run and make every lookup linear; with a per-process key the file cannot tell which collide.
 * Included by csrc/kernel/u64map.h and csrc/readers/rd_common.h. */
#ifndef ALLOCSIM_SIPHASH_H
#define ALLOCSIM_SIPHASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SIP_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIP_ROUND                                                                      \
    do {                                                                               \
        v0 += v1; v1 = SIP_ROTL(v1, 13); v1 ^= v0; v0 = SIP_ROTL(v0, 32);              \
        v2 += v3; v3 = SIP_ROTL(v3, 16); v3 ^= v2;                                     \
        v0 += v3; v3 = SIP_ROTL(v3, 21); v3 ^= v0;                                     \
        v2 += v1; v1 = SIP_ROTL(v1, 17); v1 ^= v2; v2 = SIP_ROTL(v2, 32);              \
    } while (0)

static inline uint64_t sip_load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* SipHash-1-3 of `len` bytes under the key (k0, k1). */
static inline uint64_t siphash13(const void *data, size_t len, uint64_t k0, uint64_t k1) {
    const uint8_t *in = (const uint8_t *)data;
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    size_t blocks = len / 8;
    for (size_t i = 0; i < blocks; i++) {
        uint64_t m = sip_load64(in + 8 * i);
        v3 ^= m;
        SIP_ROUND;
        v0 ^= m;
    }
    uint64_t last = (uint64_t)len << 56;
    const uint8_t *tail = in + 8 * blocks;
    for (size_t i = 0; i < (len & 7); i++) last |= (uint64_t)tail[i] << (8 * i);
    v3 ^= last;
    SIP_ROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIP_ROUND;
    SIP_ROUND;
    SIP_ROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* siphash13 of one uint64 as its 8 little-endian bytes, without the byte loop (the kernel's maps
 * hash one key per lookup). */
static inline uint64_t siphash13_u64(uint64_t x, uint64_t k0, uint64_t k1) {
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    v3 ^= x;
    SIP_ROUND;
    v0 ^= x;
    const uint64_t last = (uint64_t)8 << 56;     /* the message length (8 bytes) in the top byte */
    v3 ^= last;
    SIP_ROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIP_ROUND;
    SIP_ROUND;
    SIP_ROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

#endif /* ALLOCSIM_SIPHASH_H */
