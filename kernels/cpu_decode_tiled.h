/* Decode attention items organised around the KV head (included by cpu_decode.c after
   its row ops, ld16_* and pv_f32, and its per-query-head items, which this falls back to
   without AVX-512; part of the library's build hash, kernels/native_library.py). */

#ifndef BP_CPU_DECODE_TILED_H
#define BP_CPU_DECODE_TILED_H

#if defined(__AVX512F__)
/* The same item, for head_dim a multiple of 16 up to TILED_MAX_D, organised around the KV
   head instead of the query head. Per tile of keys and KV head, its K and V rows are
   widened to float32 once into L1 scratch and shared by the g query heads that read them
   (item_* widens every row once per query head); each query head's scores come 16 keys at
   a time, their 16 dot-product vectors summed by one transpose-reduce (sum16) instead of
   16 horizontal sums. Same arithmetic as item_* in another summation order. */
#define TILED_MAX_D 256
_Static_assert(TILE == 32, "softmax_tile holds a tile in two 16-lane vectors");

/* v[j] = 16 partial-sum vectors of keys j = 0..15 -> one vector, lane j = sum of v[j] */
static inline __m512 sum16(__m512 v[16]) {
    __m512 w[8], x[4];
    for (int i = 0; i < 8; ++i) /* 128-bit lanes (a0+a2, a1+a3, b0+b2, b1+b3) */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i) /* lane L: key 4i + L's 4 partials */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
    const __m512 u = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    /* element 4L + m of u is key 4m + L */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, u);
}

/* The online softmax of one tile of n <= 32 scores p, in place: *m (running max) becomes
   max(*m, the tile's), p[j] = exp(p[j] - new max), *sum = their sum and *corr =
   exp(old max - new max), the factor for what was summed before */
static inline void softmax_tile(float *p, int64_t n, float *m, float *corr, float *sum) {
    const __mmask16 k0 = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
    const __mmask16 k1 = (__mmask16)(n >= 32 ? 0xFFFFu : n > 16 ? (1u << (n - 16)) - 1u : 0u);
    const __m512 low = _mm512_set1_ps(-3.0e38f);
    const __m512 p0 = _mm512_mask_loadu_ps(low, k0, p);
    const __m512 p1 = _mm512_mask_loadu_ps(low, k1, p + 16);
    const float tile_max = _mm512_reduce_max_ps(_mm512_max_ps(p0, p1));
    const float m_new = tile_max > *m ? tile_max : *m;
    *corr = exp_nonpos(*m - m_new);
    *m = m_new;
    const __m512 mv = _mm512_set1_ps(m_new);
    const __m512 e0 = _mm512_maskz_mov_ps(k0, exp16_nonpos(_mm512_sub_ps(p0, mv)));
    const __m512 e1 = _mm512_maskz_mov_ps(k1, exp16_nonpos(_mm512_sub_ps(p1, mv)));
    *sum = _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    _mm512_mask_storeu_ps(p, k0, e0);
    _mm512_mask_storeu_ps(p + 16, k1, e1);
}

/* p[0..n) = dot(q, rows[j]) for n <= TILE keys of float32 rows d apart (d % 16 == 0) */
static inline void scores_tile(const float *q, const float *rows, int64_t n, int64_t d,
                               float *p) {
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        __m512 acc[16];
        for (int j = 0; j < 16; ++j) {
            acc[j] = _mm512_setzero_ps();
            if (j0 + j >= n) continue; /* past the tile: a zero sum, never read */
            const float *r = rows + (j0 + j) * d;
            for (int64_t x = 0; x < d; x += 16)
                acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + x), _mm512_loadu_ps(r + x), acc[j]);
        }
        const __m512 sums = sum16(acc);
        const int64_t left = n - j0 < 16 ? n - j0 : 16;
        _mm512_mask_storeu_ps(p + j0, (__mmask16)((1u << left) - 1u), sums);
    }
}

#define DEFINE_TILED_ITEM(NAME, T, SUFFIX)                                                \
static void NAME(const float *q, const void *kc, const void *vc, int64_t kvh, int64_t g,  \
                 int64_t nq, int64_t d, int64_t bs, int64_t h0, const int32_t *table,     \
                 int64_t ctx, float scale, float *out) {                                  \
    float qs[MAX_HD], acc[MAX_HD], m[MAX_H], l[MAX_H], p[TILE];                           \
    float kt[TILE * TILED_MAX_D], vt[TILE * TILED_MAX_D]; /* one KV head's tile, fp32 */ \
    const float *vrow[TILE];                                                              \
    const int64_t row = kvh * d;                                                          \
    item_start(q, scale, nq, d, qs, acc, m, l);                                           \
    for (int64_t j = 0; j < TILE; ++j) vrow[j] = vt + j * d;                              \
    for (int64_t k0 = 0; k0 < ctx; k0 += TILE) {                                          \
        const int64_t n = ctx - k0 < TILE ? ctx - k0 : TILE;                              \
        /* this tile's rows and the next one's (kn, vn: nn rows), whose lines the       \
           widening below asks for a row at a time as it goes, not all in one burst as   \
           prefetch_rows does: 64 decodes over 150 keys ran ~10% faster so */            \
        const T *kr[TILE], *vr[TILE], *kn[TILE], *vn[TILE];                               \
        const int64_t after = ctx - k0 - TILE;                                            \
        const int64_t nn = after <= 0 ? 0 : after < TILE ? after : TILE;                  \
        tile_rows(table, bs, row, h0 * d, k0, n, (const void **)kr, (const void **)vr,    \
                  kc, vc, (int64_t)sizeof(T));                                            \
        tile_rows(table, bs, row, h0 * d, k0 + TILE, nn, (const void **)kn,               \
                  (const void **)vn, kc, vc, (int64_t)sizeof(T));                         \
        for (int64_t kv = 0; kv < nq / g; ++kv) { /* the item's KV heads, h0 + kv */      \
            for (int64_t j = 0; j < n; ++j) {                                             \
                for (int64_t b = 0; j < nn && b < d * (int64_t)sizeof(T); b += 64) {      \
                    __builtin_prefetch((const char *)(kn[j] + kv * d) + b);               \
                    __builtin_prefetch((const char *)(vn[j] + kv * d) + b);               \
                }                                                                         \
                for (int64_t x = 0; x < d; x += 16) {                                     \
                    _mm512_storeu_ps(kt + j * d + x, ld16_##SUFFIX(kr[j] + kv * d + x));  \
                    _mm512_storeu_ps(vt + j * d + x, ld16_##SUFFIX(vr[j] + kv * d + x));  \
                }                                                                         \
            }                                                                             \
            for (int64_t i = kv * g; i < (kv + 1) * g; ++i) {                             \
                scores_tile(qs + i * d, kt, n, d, p);                                     \
                float corr, sum;                                                          \
                softmax_tile(p, n, &m[i], &corr, &sum);                                   \
                l[i] = l[i] * corr + sum;                                                 \
                float *ai = acc + i * d;                                                  \
                for (int64_t x = 0; x < d; ++x) ai[x] *= corr;                            \
                pv_f32(ai, p, vrow, 0, n, d);                                             \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    item_finish(acc, l, nq, d, out);                                                      \
}

DEFINE_TILED_ITEM(tiled_f32, float, f32)
DEFINE_TILED_ITEM(tiled_bf16, uint16_t, bf16)
#define TILED_TAKES(d) ((d) % 16 == 0 && (d) <= TILED_MAX_D)
#else
#define TILED_TAKES(d) 0
#define tiled_f32 item_f32
#define tiled_bf16 item_bf16
#endif

#endif
