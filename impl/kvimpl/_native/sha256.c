/* SHA-256 (FIPS 180-4) and vLLM's sha256_cbor block hash.
 *
 * sha256_cbor hashes the canonical CBOR encoding of (parent, tuple(tokens),
 * extra_keys). For a block without extra keys that is a 3-array of a byte
 * string, an array of unsigned ints and null, which this file encodes itself
 * (the same bytes as cbor2.dumps(..., canonical=True); tests/impl/test_native.py
 * compares them with kvspec.hashing and the stored hash vectors). Blocks with
 * extra keys and the other hash functions are hashed in Python.
 */
#include "native.h"

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(Sha256 *s, const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    uint32_t e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
    s->h[5] += f;
    s->h[6] += g;
    s->h[7] += h;
}

void sha256_init(Sha256 *s) {
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, H0, sizeof H0);
    s->len = 0;
    s->n = 0;
}

void sha256_update(Sha256 *s, const uint8_t *data, size_t len) {
    s->len += len;
    if (s->n) {
        size_t take = 64 - s->n < len ? 64 - s->n : len;
        memcpy(s->buf + s->n, data, take);
        s->n += take;
        data += take;
        len -= take;
        if (s->n < 64)
            return;
        sha256_block(s, s->buf);
        s->n = 0;
    }
    while (len >= 64) {
        sha256_block(s, data);
        data += 64;
        len -= 64;
    }
    memcpy(s->buf, data, len);
    s->n = len;
}

void sha256_final(Sha256 *s, uint8_t out[32]) {
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80;
    sha256_update(s, &pad, 1);
    uint8_t zero = 0;
    while (s->n != 56)
        sha256_update(s, &zero, 1);
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(s, lenb, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

/* The CBOR head of major type `major` with argument `v`, shortest form. */
static size_t cbor_head(uint8_t *o, int major, uint64_t v) {
    uint8_t m = (uint8_t)(major << 5);
    if (v < 24) {
        o[0] = m | (uint8_t)v;
        return 1;
    }
    if (v < 0x100) {
        o[0] = m | 24;
        o[1] = (uint8_t)v;
        return 2;
    }
    if (v < 0x10000) {
        o[0] = m | 25;
        o[1] = (uint8_t)(v >> 8);
        o[2] = (uint8_t)v;
        return 3;
    }
    if (v < 0x100000000ULL) {
        o[0] = m | 26;
        for (int i = 0; i < 4; i++)
            o[1 + i] = (uint8_t)(v >> (24 - 8 * i));
        return 5;
    }
    o[0] = m | 27;
    for (int i = 0; i < 8; i++)
        o[1 + i] = (uint8_t)(v >> (56 - 8 * i));
    return 9;
}

void sha256_cbor_block(const uint8_t *parent, size_t parent_len, const int64_t *tokens, Py_ssize_t n,
                       uint8_t out[32]) {
    Sha256 s;
    uint8_t buf[512];
    size_t k = 0;
    sha256_init(&s);
    buf[k++] = 0x83; /* array of 3 */
    k += cbor_head(buf + k, 2, parent_len);
    memcpy(buf + k, parent, parent_len);
    k += parent_len;
    k += cbor_head(buf + k, 4, (uint64_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (k > sizeof buf - 16) {
            sha256_update(&s, buf, k);
            k = 0;
        }
        k += cbor_head(buf + k, 0, (uint64_t)tokens[i]);
    }
    buf[k++] = 0xf6; /* null: no extra keys */
    sha256_update(&s, buf, k);
    sha256_final(&s, out);
}
