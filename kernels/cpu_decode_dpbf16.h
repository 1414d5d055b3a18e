/* Decode attention over a bf16 KV cache with VDPBF16PS, for CPUs with AVX-512-BF16 and no
   AMX (included by cpu_decode.c after cpu_decode_tiled.h, whose sum16 and softmax_tile it
   uses, and before cpu_decode_amx.h, which shares interleave_values and pairs_finish; part
   of the library's build hash, kernels/native_library.py).

   Why: the tiled item (cpu_decode_tiled.h) widens every K and V row to float32 and runs one
   FMA per element and query head; on an AMD EPYC (Zen 4) attention was 27% of a 64-decode
   step over 150-token contexts. Here both products take bf16 pairs as they lie, 32
   multiply-adds an instruction, the widening gone:
   - scores: per key and query head, d / 32 VDPBF16PS of the head's q (scaled, rounded to
     bf16 once per item) with the K row read in place from its block, 16 keys' partial
     vectors summed by one transpose-reduce (sum16);
   - P V, per tile of 32 keys and KV head: V's rows interleaved in pairs (keys 2m, 2m + 1,
     interleave_values, once for the KV head's g query heads), then per query head and pair
     one VDPBF16PS per 16 columns with the pair of weights (rounded to bf16) broadcast,
     into accumulators in interleaved column order, restored by pairs_finish.
   Precision as the AMX item (cpu_decode_amx.h) and the prefill kernels: q * scale and P
   rounded to bf16 (K and V already are), scores, softmax and sums float32.

   Taken for cache mode 2 (bf16 products asked for) where AMX does not take the item, and
   for cache mode 3 (the same, never on AMX: the tests' switch), head_dim a multiple of 32
   up to DP_MAX_D, contexts over DP_MIN_KEYS. */

#ifndef BP_CPU_DECODE_DPBF16_H
#define BP_CPU_DECODE_DPBF16_H

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define DP_MAX_D 256
/* Up to this many keys the tiled float32 item keeps the decode, as on AMX: the gain there
   is small. 64 SmolLM2 decodes, one layer, 2 threads, an AMD EPYC, ms, float32 products /
   this item: 1 key 0.064 / 0.065, 8 keys 0.055 / 0.051, 16 0.072 / 0.058, 32 0.122 /
   0.090, 150 0.408 / 0.274, 600 2.51 / 2.24 (the cache out of L2: bytes, not instructions) */
#define DP_MIN_KEYS 16
#define DP_TAKES(mode, d, ctx) \
    ((mode) >= 2 && (d) % 32 == 0 && (d) <= DP_MAX_D && (ctx) > DP_MIN_KEYS)

/* Whether decodes over more than DP_MIN_KEYS keys of this cache mode and head_dim take the
   item below (where AMX does not take them: bp_amx_decode_takes) */
int bp_dp_decode_takes(int64_t cache_mode, int64_t d) {
    return DP_TAKES(cache_mode, d, DP_MIN_KEYS + 1);
}

/* vp[m * d ...] = V rows 2m, 2m + 1 (+ off) interleaved, m < 16; rows past n_keys zero.
   Per 32 columns x: vp + m * d + x holds columns 8k + i of each 128-bit lane k (i < 4) as
   (row 2m, row 2m + 1) pairs, vp + m * d + x + 16 columns 8k + 4 + i (unpacklo/hi). */
static void interleave_values(const uint16_t *const *vr, int64_t off, int64_t n_keys,
                              int64_t d, uint32_t *vp) {
    static const uint16_t zeros[DP_MAX_D];
    for (int64_t m = 0; m < 16; ++m) {
        const uint16_t *a = 2 * m < n_keys ? vr[2 * m] + off : zeros;
        const uint16_t *b = 2 * m + 1 < n_keys ? vr[2 * m + 1] + off : zeros;
        for (int64_t x = 0; x < d; x += 32) {
            const __m512i ra = _mm512_loadu_si512(a + x), rb = _mm512_loadu_si512(b + x);
            _mm512_storeu_si512(vp + m * d + x, _mm512_unpacklo_epi16(ra, rb));
            _mm512_storeu_si512(vp + m * d + x + 16, _mm512_unpackhi_epi16(ra, rb));
        }
    }
}

/* out = acc / l per query head, acc's columns in interleave_values' order put back */
static void pairs_finish(const float *acc, const float *l, int64_t nq, int64_t d, float *out) {
    const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i second =
        _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int64_t i = 0; i < nq; ++i) {
        const __m512 inv = _mm512_set1_ps(1.0f / l[i]);
        for (int64_t x = 0; x < d; x += 32) {
            const __m512 lo = _mm512_loadu_ps(acc + i * d + x);
            const __m512 hi = _mm512_loadu_ps(acc + i * d + x + 16);
            _mm512_storeu_ps(out + i * d + x,
                             _mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), inv));
            _mm512_storeu_ps(out + i * d + x + 16,
                             _mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), inv));
        }
    }
}

/* p[0..n) = dot(qb, K row j + off) for the tile's n <= 32 keys; qb d bf16 */
static inline __attribute__((always_inline)) void dp_scores(const uint16_t *qb, const uint16_t *const *kr, int64_t off,
                             int64_t n, int64_t d, float *p) {
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        __m512 acc[16];
        for (int j = 0; j < 16; ++j) {
            acc[j] = _mm512_setzero_ps();
            if (j0 + j >= n) continue; /* past the tile: a zero sum, never read */
            const uint16_t *r = kr[j0 + j] + off;
            for (int64_t x = 0; x < d; x += 32)
                acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(qb + x),
                                          (__m512bh)_mm512_loadu_si512(r + x));
        }
        const __m512 sums = sum16(acc);
        const int64_t left = n - j0 < 16 ? n - j0 : 16;
        _mm512_mask_storeu_ps(p + j0, (__mmask16)((1u << left) - 1u), sums);
    }
}

/* ai (d float32, interleaved order) = ai * corr + P V over the tile's pairs; p the n
   weights (float32), vp interleave_values' pairs */
static inline __attribute__((always_inline)) void dp_weighted_values(float *ai, float corr, const float *p, int64_t n,
                                      const uint32_t *vp, int64_t d) {
    uint32_t wp[16]; /* the weights of keys 2m, 2m + 1 as one bf16 pair */
    const __mmask16 k0 = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
    const __mmask16 k1 = (__mmask16)(n >= 32 ? 0xFFFFu : n > 16 ? (1u << (n - 16)) - 1u : 0u);
    _mm512_storeu_si512(wp, (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(k1, p + 16),
                                                         _mm512_maskz_loadu_ps(k0, p)));
    const int64_t pairs = (n + 1) / 2;
    const __m512 c = _mm512_set1_ps(corr);
    for (int64_t x = 0; x < d; x += 64) { /* up to 4 accumulators of 16 columns */
        const int64_t parts = d - x < 64 ? (d - x) / 16 : 4;
        /* two sets (even and odd pairs) so that 8 sums are in flight: one set's chain of
           VDPBF16PS waits on its latency at every pair */
        __m512 even[4], odd[4];
        for (int64_t u = 0; u < parts; ++u) {
            even[u] = _mm512_mul_ps(_mm512_loadu_ps(ai + x + 16 * u), c);
            odd[u] = _mm512_setzero_ps();
        }
        int64_t m = 0;
        for (; m + 1 < pairs; m += 2) {
            const __m512bh w0 = (__m512bh)_mm512_set1_epi32((int)wp[m]);
            const __m512bh w1 = (__m512bh)_mm512_set1_epi32((int)wp[m + 1]);
            for (int64_t u = 0; u < parts; ++u) {
                even[u] = _mm512_dpbf16_ps(
                    even[u], (__m512bh)_mm512_loadu_si512(vp + m * d + x + 16 * u), w0);
                odd[u] = _mm512_dpbf16_ps(
                    odd[u], (__m512bh)_mm512_loadu_si512(vp + (m + 1) * d + x + 16 * u), w1);
            }
        }
        if (m < pairs) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)wp[m]);
            for (int64_t u = 0; u < parts; ++u)
                even[u] = _mm512_dpbf16_ps(
                    even[u], (__m512bh)_mm512_loadu_si512(vp + m * d + x + 16 * u), w);
        }
        for (int64_t u = 0; u < parts; ++u)
            _mm512_storeu_ps(ai + x + 16 * u, _mm512_add_ps(even[u], odd[u]));
    }
}

/* The item of cpu_decode.c (query heads [0, nq) of one decode, KV heads from h0); inlined
   into dp_item_bf16 once per head_dim it names, so that the loops over d unroll there */
static inline __attribute__((always_inline)) void dp_item_d(
        const float *q, const void *kc, const void *vc, int64_t kvh, int64_t g, int64_t nq,
        const int64_t d, int64_t bs, int64_t h0, const int32_t *table, int64_t ctx,
        float scale, float *out) {
    float qs[MAX_HD], acc[MAX_HD], m[MAX_H], l[MAX_H], p[TILE];
    uint16_t qb[MAX_HD];
    uint32_t vp[16 * DP_MAX_D];
    const int64_t row = kvh * d;
    item_start(q, scale, nq, d, qs, acc, m, l);
    for (int64_t x = 0; x < nq * d; x += 16) /* rounded to nearest even, as narrow() */
        _mm256_storeu_si256((__m256i *)(qb + x),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(qs + x)));
    for (int64_t k0 = 0; k0 < ctx; k0 += TILE) {
        const int64_t n = ctx - k0 < TILE ? ctx - k0 : TILE;
        const uint16_t *kr[TILE], *vr[TILE];
        tile_setup(table, bs, row, h0 * d, k0, n, ctx, (const void **)kr, (const void **)vr,
                   kc, vc, 2, nq / g * d);
        for (int64_t kv = 0; kv < nq / g; ++kv) {
            interleave_values(vr, kv * d, n, d, vp);
            for (int64_t i = kv * g; i < (kv + 1) * g; ++i) {
                float corr, sum;
                dp_scores(qb + i * d, kr, kv * d, n, d, p);
                softmax_tile(p, n, &m[i], &corr, &sum);
                l[i] = l[i] * corr + sum;
                dp_weighted_values(acc + i * d, corr, p, n, vp, d);
            }
        }
    }
    pairs_finish(acc, l, nq, d, out);
}

static void dp_item_bf16(const float *q, const void *kc, const void *vc, int64_t kvh,
                         int64_t g, int64_t nq, int64_t d, int64_t bs, int64_t h0,
                         const int32_t *table, int64_t ctx, float scale, float *out) {
    if (d == 64) /* a constant d: the score and weight loops unroll (10-20% of the item) */
        dp_item_d(q, kc, vc, kvh, g, nq, 64, bs, h0, table, ctx, scale, out);
    else if (d == 128)
        dp_item_d(q, kc, vc, kvh, g, nq, 128, bs, h0, table, ctx, scale, out);
    else
        dp_item_d(q, kc, vc, kvh, g, nq, d, bs, h0, table, ctx, scale, out);
}
#else
int bp_dp_decode_takes(int64_t cache_mode, int64_t d) {
    (void)cache_mode, (void)d;
    return 0;
}
#define DP_TAKES(mode, d, ctx) 0
#define dp_item_bf16 item_bf16
#endif

#endif
