/* The context re-laid as AMX B tiles for cpu_prefill_amx.c (pass 1 there; included by it
   inside its AMX section, after immintrin.h; part of the library's build hash,
   kernels/native_library.py). */

#ifndef BP_CPU_PREFILL_AMX_PACK_H
#define BP_CPU_PREFILL_AMX_PACK_H

typedef struct {
    const uint16_t *kc, *vc;
    int64_t kvh, d, bs;
    const int32_t *table; /* the chunk's sequence's block ids */
} kv_view;

/* Key `pos` of KV head h: its d bf16 in the cache */
static inline int64_t key_offset(const kv_view *kv, int64_t pos, int64_t h) {
    return ((int64_t)kv->table[pos / kv->bs] * kv->bs + pos % kv->bs) * kv->kvh * kv->d
           + h * kv->d;
}

/* In place: rows r[0..15] of 16 dwords -> their transpose (row p = dword p of each row) */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; ++i) { /* dword pairs of rows 2i, 2i + 1 */
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) { /* qword pairs: 4 rows' dwords per 128-bit lane */
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 8; ++i) { /* 128-bit lanes across rows i, i + 8 ... */
        const int a = (i / 4) * 8 + i % 4, b = a + 4;
        t[2 * i] = _mm512_shuffle_i32x4(r[a], r[b], 0x88);
        t[2 * i + 1] = _mm512_shuffle_i32x4(r[a], r[b], 0xDD);
    }
    for (int i = 0; i < 8; ++i) { /* column 4L + c gathers lane L of those four */
        const int c = i % 4, a = 2 * c + i / 4, b = a + 8;
        r[c + 4 * (i / 4)] = _mm512_shuffle_i32x4(t[a], t[b], 0x88);
        r[c + 4 * (i / 4) + 8] = _mm512_shuffle_i32x4(t[a], t[b], 0xDD);
    }
}

/* Pass 1 for one chunk and KV head: keys [0, ctx) into kp and vp (padded_keys x d bf16
   each, as tiles; keys from ctx on are zero). */
static void pack_context(const kv_view *kv, int64_t h, int64_t ctx, int64_t padded_keys,
                         uint32_t *kp, uint32_t *vp) {
    const int64_t d = kv->d, d32 = d / 32, d16 = d / 16;
    const uint16_t *keys[32];
    for (int64_t g = 0; g < padded_keys / 32; ++g) { /* 32 keys: two K groups, one V */
        for (int n = 0; n < 32; ++n) {
            const int64_t pos = g * 32 + n;
            keys[n] = pos < ctx ? kv->kc + key_offset(kv, pos, h) : NULL;
        }
        for (int half = 0; half < 2; ++half) /* K: a 16-key group's tiles */
            for (int64_t dc = 0; dc < d32; ++dc) {
                __m512i r[16];
                for (int n = 0; n < 16; ++n) {
                    const uint16_t *k = keys[16 * half + n];
                    r[n] = k ? _mm512_loadu_si512(k + dc * 32) : _mm512_setzero_si512();
                }
                transpose16(r);
                uint32_t *tile = kp + ((2 * g + half) * d32 + dc) * 256;
                for (int p = 0; p < 16; ++p) _mm512_storeu_si512(tile + 16 * p, r[p]);
            }
        for (int n = 0; n < 32; ++n) /* the same keys' values */
            if (keys[n]) keys[n] = kv->vc + (keys[n] - kv->kc);
        for (int64_t nb = 0; nb < d16; ++nb) /* V: row p = keys 2p, 2p + 1, paired */
            for (int p = 0; p < 16; ++p) {
                const uint16_t *v0 = keys[2 * p], *v1 = keys[2 * p + 1];
                const __m512i lo = v0 ? _mm512_cvtepu16_epi32(
                    _mm256_loadu_si256((const __m256i *)(v0 + nb * 16))) : _mm512_setzero_si512();
                const __m512i hi = v1 ? _mm512_cvtepu16_epi32(
                    _mm256_loadu_si256((const __m256i *)(v1 + nb * 16))) : _mm512_setzero_si512();
                _mm512_storeu_si512(vp + (g * d16 + nb) * 256 + 16 * p,
                                    _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
    }
}

#endif
