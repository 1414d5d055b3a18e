/* Dot products of GGUF block-quantized weight rows with float32 input rows, for the
   native decode layers' GEMV (kernels/cpu_layers.c, project()).

   Why: a decode step of a few rows is bound by reading the weights (SmolLM2-135M: 269 MB
   of bf16 projections a step). A GGUF checkpoint already holds its projections in blocks
   of 32 weights at 4.5-8.5 bits; reading those blocks as they are moves 1.9-3.5x fewer
   bytes than bf16, and the weights they decode to are exactly the float32 weights the
   model was loaded with (engine/models/gguf_blocks.py checks that at load), so the result
   is the float32 model's, in another summation order, not a further approximation.

   Formats (ggml's block layouts; a row of K weights is K / 32 blocks, back to back):
     Q4_1 (BP_Q4_1): fp16 d, fp16 m, 16 bytes; weight j = d * (qs[j] & 15) + m and weight
          j + 16 = d * (qs[j] >> 4) + m, j < 16 (20 bytes per 32 weights)
     Q8_0 (BP_Q8_0): fp16 d, 32 int8 q; weight j = d * q[j] (34 bytes per 32 weights)
   d * q is exact in float32 (11 + 8 significant bits), so both decode with one rounding at
   most (Q4_1's + m), as gguf-py's dequantization does.

   out[m * GROUP + t] = dot(w[m], in[t]) for m < M <= 2 weight rows (row_bytes apart) and
   t < N <= GROUP input rows (K apart): each block is decoded once for all N rows. */

#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h" /* half_to_f32 */
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define GROUP 8 /* as cpu_layers.c */
#define BP_Q4_1 2
#define BP_Q8_0 3

/* bytes of one block of 32 weights (0: not a format here) */
static inline int64_t block_bytes(int64_t format) {
    return format == BP_Q4_1 ? 20 : format == BP_Q8_0 ? 34 : 0;
}

int64_t bp_quant_row_bytes(int64_t format, int64_t K) {
    return K % 32 != 0 || block_bytes(format) == 0 ? -1 : K / 32 * block_bytes(format);
}


/* The 32 weights of one block as float32, in order. */
static inline void decode_block(int64_t format, const uint8_t *b, float *w) {
    const float d = half_to_f32(b);
    if (format == BP_Q4_1) {
        const float mn = half_to_f32(b + 2);
        for (int j = 0; j < 16; ++j) {
            w[j] = d * (float)(b[4 + j] & 15) + mn;
            w[j + 16] = d * (float)(b[4 + j] >> 4) + mn;
        }
    } else {
        for (int j = 0; j < 32; ++j) w[j] = d * (float)(int8_t)b[2 + j];
    }
}

#if defined(__AVX512F__)
/* The block's 32 weights as two vectors of 16 (weights 0-15, 16-31). */
static inline __attribute__((always_inline)) void decode_block_avx512(
    const int format, const uint8_t *b, const float *dm, __m512 *lo, __m512 *hi) {
    if (format == BP_Q4_1) {
        /* d and m: from the row's scale pass (dm), or (rows past SCALED_BLOCKS blocks) in
           one load, the pair (d, m) in every dword, widened, then each spread by a lane
           shuffle */
        __m512 d, mn;
        if (dm != NULL) {
            d = _mm512_set1_ps(dm[0]);
            mn = _mm512_set1_ps(dm[1]);
        } else {
            uint32_t pair;
            memcpy(&pair, b, sizeof pair);
            const __m512 both = _mm512_cvtph_ps(_mm256_set1_epi32((int)pair));
            d = _mm512_moveldup_ps(both);
            mn = _mm512_movehdup_ps(both);
        }
        /* the block's 16 possible weights d * q + m (q = 0..15), one FMA each as before,
           then looked up by each nibble: VPERMPS reads only an index's low 4 bits, so the
           widened byte indexes its low nibble and the byte >> 4 its high one. The weights
           are bit for bit those of converting q and an FMA per weight, in fewer ops (the
           single-row GEMV is bound by this decode, not by the bytes it reads). */
        const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512 table = _mm512_fmadd_ps(iota, d, mn);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 4)));
        *lo = _mm512_permutexvar_ps(q, table);
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
    } else {
        const __m512 d = _mm512_set1_ps(half_to_f32(b));
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(b + 2));
        const __m128i q1 = _mm_loadu_si128((const __m128i *)(b + 18));
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
    }
}

#define SCALED_BLOCKS 512 /* rows of up to this many Q4_1 blocks get their scales first */

static inline int32_t load_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* (d, m) of a Q4_1 row's n blocks as float32: dm[2 b], dm[2 b + 1]. Why a pass of its own:
   the GEMV is bound by its shuffle port, and converting each block's pair there took 3 of
   its ~6 shuffles a block; here 8 pairs take one conversion, and the block loop reads them
   by broadcast loads (a 1-row decode step 4.85 -> 4.5 ms, 3 rows 6.7 -> 6.1). */
static inline void q41_scales(const uint8_t *row, int64_t n, float *dm) {
    int64_t b = 0;
    for (; b + 8 <= n; b += 8) {
        const uint8_t *r = row + b * 20;
        const __m256i pairs = _mm256_set_epi32(
            load_i32(r + 140), load_i32(r + 120), load_i32(r + 100), load_i32(r + 80),
            load_i32(r + 60), load_i32(r + 40), load_i32(r + 20), load_i32(r));
        _mm512_storeu_ps(dm + 2 * b, _mm512_cvtph_ps(pairs));
    }
    for (; b < n; ++b) {
        dm[2 * b] = half_to_f32(row + b * 20);
        dm[2 * b + 1] = half_to_f32(row + b * 20 + 2);
    }
}

static inline __attribute__((always_inline)) void dot_rows_q(
    const int format, const uint8_t *w, int64_t row_bytes, int64_t K, const float *in,
    float *out, const int M, const int N) {
    const int64_t bytes = block_bytes(format);
    __m512 acc[2][GROUP], lo[2], hi[2];
    float dm[2][2 * SCALED_BLOCKS];
    const int scaled = format == BP_Q4_1 && K / 32 <= SCALED_BLOCKS;
    if (scaled)
        for (int m = 0; m < M; ++m) q41_scales(w + m * row_bytes, K / 32, dm[m]);
    for (int m = 0; m < M; ++m)
        for (int t = 0; t < N; ++t) acc[m][t] = _mm512_setzero_ps();
    for (int64_t x = 0, blk = 0; x < K; x += 32, blk += bytes) {
        for (int m = 0; m < M; ++m) { /* (a prefetch past the weights never faults) */
            _mm_prefetch((const char *)w + m * row_bytes + blk + WEIGHT_PREFETCH_BYTES,
                         _MM_HINT_T0);
            decode_block_avx512(format, w + m * row_bytes + blk,
                                scaled ? dm[m] + x / 16 : NULL, &lo[m], &hi[m]);
        }
        for (int t = 0; t < N; ++t) {
            const __m512 a = _mm512_loadu_ps(in + t * K + x);
            const __m512 b = _mm512_loadu_ps(in + t * K + x + 16);
            for (int m = 0; m < M; ++m)
                acc[m][t] = _mm512_fmadd_ps(hi[m], b, _mm512_fmadd_ps(lo[m], a, acc[m][t]));
        }
    }
    for (int m = 0; m < M; ++m)
        for (int t = 0; t < N; ++t) out[m * GROUP + t] = _mm512_reduce_add_ps(acc[m][t]);
}

#define Q_CASES(FMT, M)                                                                 \
    switch (n) {                                                                        \
    case 1: dot_rows_q(FMT, w, row_bytes, K, in, out, M, 1); break;                     \
    case 2: dot_rows_q(FMT, w, row_bytes, K, in, out, M, 2); break;                     \
    case 3: dot_rows_q(FMT, w, row_bytes, K, in, out, M, 3); break;                     \
    case 4: dot_rows_q(FMT, w, row_bytes, K, in, out, M, 4); break;                     \
    case 5: dot_rows_q(FMT, w, row_bytes, K, in, out, M, 5); break;                     \
    case 6: dot_rows_q(FMT, w, row_bytes, K, in, out, M, 6); break;                     \
    case 7: dot_rows_q(FMT, w, row_bytes, K, in, out, M, 7); break;                     \
    default: dot_rows_q(FMT, w, row_bytes, K, in, out, M, GROUP);                       \
    }

void bp_dot_group_quant(int64_t format, const uint8_t *w, int64_t row_bytes, int64_t K,
                        const float *in, float *out, int64_t n, int64_t m) {
    if (format == BP_Q4_1) {
        if (m == 2) { Q_CASES(BP_Q4_1, 2) } else { Q_CASES(BP_Q4_1, 1) }
    } else {
        if (m == 2) { Q_CASES(BP_Q8_0, 2) } else { Q_CASES(BP_Q8_0, 1) }
    }
}
#else
void bp_dot_group_quant(int64_t format, const uint8_t *w, int64_t row_bytes, int64_t K,
                        const float *in, float *out, int64_t n, int64_t m) {
    const int64_t bytes = block_bytes(format);
    float block[32];
    for (int64_t j = 0; j < m; ++j)
        for (int64_t t = 0; t < n; ++t) out[j * GROUP + t] = 0.0f;
    for (int64_t x = 0, blk = 0; x < K; x += 32, blk += bytes)
        for (int64_t j = 0; j < m; ++j) {
            decode_block(format, w + j * row_bytes + blk, block);
            for (int64_t t = 0; t < n; ++t) {
                float sum = 0.0f;
                for (int i = 0; i < 32; ++i) sum += block[i] * in[t * K + x + i];
                out[j * GROUP + t] += sum;
            }
        }
}
#endif

/* w [rows, K] in `format` -> out float [rows, K] (tests and the load-time check). */
int bp_dequantize_rows(int64_t format, const uint8_t *w, int64_t rows, int64_t K, float *out) {
    const int64_t row_bytes = bp_quant_row_bytes(format, K);
    if (row_bytes < 0) return -1;
    const int64_t bytes = block_bytes(format);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < K; x += 32)
            decode_block(format, w + r * row_bytes + x / 32 * bytes, out + r * K + x);
    return 0;
}
