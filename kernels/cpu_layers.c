/* Every decoder layer of a small decode step in one call (built with cpu_decode.c by
   kernels/native_library.py, driven by kernels/cpu_layers.py).

   Why: a decode step of a few rows streams the weights once (the floor) plus, per layer,
   ~15 small torch ops and ~10 module calls, each a dispatch and, on two threads, a thread
   hand-off; on SmolLM2's 30 layers that overhead was a third of a single-stream step.
   Here one OpenMP region runs all layers: each projection reads a weight row once for
   all rows of the step (up to MAX_ROWS), the elementwise work runs in place between.

   Per layer (the Llama family; the same arithmetic as engine/models/llama.py in float32):
     h = rmsnorm(x) * ln1;  qkv = W_qkv h (+ b);  rotate q and k heads (RoPE);
     k, v -> cache at slots[t];  att = paged attention of q over each row's context;
     x += W_o att (+ b);  h = rmsnorm(x) * ln2;  gu = W_gu h (+ b);
     act = silu(gate) * up;  x += W_down act (+ b)

   Shapes (row-major, contiguous; T = rows <= MAX_ROWS, one decode per row):
     x        float [T, D]: the residual stream, in place (in: embeddings, out: the last
              layer's output, before the final norm)
     weights  [out, in] in weights_format: 0 float32, 1 bfloat16 (uint16 bit patterns),
              2 / 3 GGUF Q4_1 / Q8_0 blocks (cpu_quant_dot.c; in a multiple of 32),
              4 Q4_1 blocks in AMX tiles (cpu_amx_q4.c; out a multiple of 16, in of 32:
              the projections' inputs rounded to bf16, float32 sums, as the bf16 path);
              biases float [out] or NULL; ln1, ln2 float [D]
     caches   float32 or bfloat16 (cache_bf16: 0 float32, else bf16; 2 also asks for
              decode attention on AMX, cpu_decode_amx.h) [num_blocks, bs, kvh, d]
     cos, ssin float [T, d]: cos and sin with its first half negated (rope_for_rotate)
     slots    int64 [T] >= 0; tables int32 [T, table_stride]; ctx int32 [T], this step's
              token included; rows int32 [T] = 0 .. T-1 (row t is sequence t)
     scratch  float [T * (D + (nh + 2 kvh) d + nh d + 3 I)], then for format 4 the bf16
              inputs of a projection: [16 ceil(T / 16)][max(D, nh d, I)] uint16
   Returns 0, or -1 when the shapes are outside the limits (nothing written then). */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h"

#define MAX_ROWS 64 /* rows of a step */
#define GROUP 8     /* rows per pass over a weight row: accumulators in registers */
#define MAX_H 128    /* as cpu_decode.c */
#define MAX_HD 16384 /* as cpu_decode.c */
#define FORMAT_Q4_TILES 4 /* weights_format: Q4_1 blocks in cpu_amx_q4.c's tiles */

typedef struct {
    const void *qkv_w, *o_w, *gate_up_w, *down_w;
    const float *qkv_b, *o_b, *gate_up_b, *down_b, *ln1, *ln2;
    void *k_cache, *v_cache;
} bp_layer;

typedef struct {
    int64_t rows, hidden, heads, kv_heads, head_dim, inter, block_size, table_stride;
    int64_t weights_format, num_threads, cache_bf16;
    const float *cos, *ssin;
    const int64_t *slots;
    const int32_t *tables, *ctx, *seq_rows;
    float *scratch;
    float eps, scale;
} bp_step;

void bp_attention_item(int64_t it, int64_t per_seq, const float *q, int64_t q_stride,
                       const void *k_cache, const void *v_cache, int64_t cache_is_bf16,
                       int64_t nh, int64_t kvh, int64_t d, int64_t bs, const int32_t *tables,
                       int64_t table_stride, const int32_t *seqs, const int32_t *rows,
                       const int32_t *ctx, float scale, float *out);
int64_t bp_attention_items_per_decode(int64_t num_decodes, int64_t kvh, int64_t num_threads);
int bp_amx_decode_takes(int64_t cache_mode, int64_t nh, int64_t kvh, int64_t d);
int64_t bp_quant_row_bytes(int64_t format, int64_t K);
void bp_dot_group_quant(int64_t format, const uint8_t *w, int64_t row_bytes, int64_t K,
                        const float *in, float *out, int64_t n, int64_t m);
int bp_q4_amx_ready(void);
void bp_q4_amx_begin(void);
void bp_q4_amx_end(void);
void bp_q4_amx_project(const uint8_t *tiles, const float *bias, const float *in, int64_t T,
                       int64_t K, int64_t N, float *y, int64_t ldy, int accumulate,
                       uint16_t *a16);

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* out[m * GROUP + t] = dot(w[m], in[t]) for m < M <= 2 weight rows (K apart) and t < N
   <= GROUP input rows: each weight element is loaded once for all N rows and each input
   element once for both weight rows (M and N are constants after inlining, so the 2 x
   GROUP accumulators stay in registers). */
#if defined(__AVX512F__)
#include <immintrin.h>
#define DEFINE_DOT_ROWS(SUFFIX, T, LOAD16, CONV)                                          \
static inline __attribute__((always_inline)) void dot_rows_##SUFFIX(                     \
    const T *w, int64_t K, const float *in, float *out, const int M, const int N) {      \
    __m512 acc[2][GROUP], wv[2];                                                          \
    for (int m = 0; m < M; ++m)                                                           \
        for (int t = 0; t < N; ++t) acc[m][t] = _mm512_setzero_ps();                      \
    int64_t x = 0;                                                                        \
    for (; x + 16 <= K; x += 16) {                                                        \
        for (int m = 0; m < M; ++m) {                                                     \
            const char *ahead = (const char *)(w + m * K + x) + WEIGHT_PREFETCH_BYTES;   \
            _mm_prefetch(ahead, _MM_HINT_T0);                                             \
            wv[m] = LOAD16(w + m * K + x);                                                \
        }                                                                                 \
        for (int t = 0; t < N; ++t) {                                                     \
            const __m512 iv = _mm512_loadu_ps(in + t * K + x);                            \
            for (int m = 0; m < M; ++m) acc[m][t] = _mm512_fmadd_ps(wv[m], iv, acc[m][t]); \
        }                                                                                 \
    }                                                                                     \
    for (int m = 0; m < M; ++m)                                                           \
        for (int t = 0; t < N; ++t) {                                                     \
            float sum = _mm512_reduce_add_ps(acc[m][t]);                                  \
            for (int64_t r = x; r < K; ++r) sum += CONV(w[m * K + r]) * in[t * K + r];    \
            out[m * GROUP + t] = sum;                                                     \
        }                                                                                 \
}
static inline __m512 load16_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_bf16(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#else
#define DEFINE_DOT_ROWS(SUFFIX, T, LOAD16, CONV)                                          \
static inline void dot_rows_##SUFFIX(const T *w, int64_t K, const float *in, float *out, \
                                     const int M, const int N) {                          \
    for (int m = 0; m < M; ++m)                                                           \
        for (int t = 0; t < N; ++t) {                                                     \
            float sum = 0.0f;                                                             \
            _Pragma("omp simd reduction(+:sum)")                                          \
            for (int64_t r = 0; r < K; ++r) sum += CONV(w[m * K + r]) * in[t * K + r];    \
            out[m * GROUP + t] = sum;                                                     \
        }                                                                                 \
}
#endif
static inline float same_f32(float x) { return x; }
DEFINE_DOT_ROWS(f32, float, load16_f32, same_f32)
DEFINE_DOT_ROWS(bf16, uint16_t, load16_bf16, bf16_to_f32)

/* dot_rows with n <= GROUP input rows and m <= 2 weight rows, constants per case */
#define ROW_CASES(SUFFIX, M)                                                              \
    switch (n) {                                                                          \
    case 1: dot_rows_##SUFFIX(w, K, in, out, M, 1); break;                                \
    case 2: dot_rows_##SUFFIX(w, K, in, out, M, 2); break;                                \
    case 3: dot_rows_##SUFFIX(w, K, in, out, M, 3); break;                                \
    case 4: dot_rows_##SUFFIX(w, K, in, out, M, 4); break;                                \
    case 5: dot_rows_##SUFFIX(w, K, in, out, M, 5); break;                                \
    case 6: dot_rows_##SUFFIX(w, K, in, out, M, 6); break;                                \
    case 7: dot_rows_##SUFFIX(w, K, in, out, M, 7); break;                                \
    default: dot_rows_##SUFFIX(w, K, in, out, M, GROUP);                                  \
    }
static void dot_group_f32(const float *w, int64_t K, const float *in, float *out, int64_t n,
                          int64_t m) {
    if (m == 2) { ROW_CASES(f32, 2) } else { ROW_CASES(f32, 1) }
}
static void dot_group_bf16(const uint16_t *w, int64_t K, const float *in, float *out,
                           int64_t n, int64_t m) {
    if (m == 2) { ROW_CASES(bf16, 2) } else { ROW_CASES(bf16, 1) }
}

/* y[t, o] = (accumulate ? y[t, o] : 0) + (dot(W[o], in[t]) + b[o]) for o < N, t < T;
   W in `format` (see the header), in [T, K], y rows ldy apart. Pairs of output rows are
   split over the team (omp for); rows of the step go GROUP at a time (the weight rows stay
   in L1 between groups). a16: format 4's bf16 inputs (see the header), else unused. */
static void project(const void *w, int format, const float *bias, const float *in,
                    int64_t T, int64_t K, int64_t N, float *y, int64_t ldy, int accumulate,
                    uint16_t *a16) {
    if (format == FORMAT_Q4_TILES) {
        bp_q4_amx_project((const uint8_t *)w, bias, in, T, K, N, y, ldy, accumulate, a16);
        return;
    }
    const int64_t row_bytes = format == 0 ? K * 4 : format == 1 ? K * 2
                                                                : bp_quant_row_bytes(format, K);
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < (N + 1) / 2; ++pair) {
        const int64_t o = 2 * pair, m = o + 1 < N ? 2 : 1;
        const void *wo = (const char *)w + o * row_bytes;
        float dots[2][MAX_ROWS], part[2 * GROUP];
        for (int64_t t0 = 0; t0 < T; t0 += GROUP) {
            const int64_t n = T - t0 < GROUP ? T - t0 : GROUP;
            if (format == 1)
                dot_group_bf16((const uint16_t *)wo, K, in + t0 * K, part, n, m);
            else if (format == 0)
                dot_group_f32((const float *)wo, K, in + t0 * K, part, n, m);
            else
                bp_dot_group_quant(format, (const uint8_t *)wo, row_bytes, K, in + t0 * K,
                                   part, n, m);
            for (int64_t j = 0; j < m; ++j)
                for (int64_t t = 0; t < n; ++t) dots[j][t0 + t] = part[j * GROUP + t];
        }
        for (int64_t j = 0; j < m; ++j) {
            const float b = bias ? bias[o + j] : 0.0f;
            for (int64_t t = 0; t < T; ++t)
                y[t * ldy + o + j] = (accumulate ? y[t * ldy + o + j] : 0.0f) + (dots[j][t] + b);
        }
    }
}

/* Whether `format` is one project() reads, with K a whole number of its blocks (and for
   tiles N of 16-row tiles, AMX granted). */
static int format_fits(int64_t format, int64_t K, int64_t N) {
    if (format == FORMAT_Q4_TILES) return K % 32 == 0 && N % 16 == 0 && bp_q4_amx_ready();
    return format == 0 || format == 1 || bp_quant_row_bytes(format, K) > 0;
}

/* Rows split over the team (an orphaned omp for: called inside the layers' region) */
static void rmsnorm_rows(const float *x, const float *w, int64_t T, int64_t D, float eps,
                         float *h) {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const float *xt = x + t * D;
        float ss = 0.0f;
#pragma omp simd reduction(+:ss)
        for (int64_t i = 0; i < D; ++i) ss += xt[i] * xt[i];
        const float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t i = 0; i < D; ++i) h[t * D + i] = xt[i] * r * w[i];
    }
}

/* q and k heads of each row rotated in place (x * cos + roll(x, d / 2) * ssin), then the
   row's k and v heads written to its cache slot (float32 or rounded to bfloat16). Rows
   split over the team, as rmsnorm_rows. */
static void rope_and_store(const bp_step *s, float *qkv, int64_t qkv_width, void *kc,
                           void *vc) {
    const size_t cache_size = s->cache_bf16 ? sizeof(uint16_t) : sizeof(float);
    const int64_t d = s->head_dim, half = d / 2, kvd = s->kv_heads * d;
    float tmp[MAX_HD];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < s->rows; ++t) {
        float *row = qkv + t * qkv_width;
        const float *c = s->cos + t * d, *sn = s->ssin + t * d;
        for (int64_t j = 0; j < s->heads + s->kv_heads; ++j) {
            float *v = row + j * d;
            memcpy(tmp, v, (size_t)d * sizeof(float));
            rotate_head(tmp, c, sn, half, v);
        }
        const size_t at = (size_t)(s->slots[t] * kvd) * cache_size;
        narrow(row + s->heads * d, (char *)kc + at, (int)s->cache_bf16, kvd);
        narrow(row + (s->heads + s->kv_heads) * d, (char *)vc + at, (int)s->cache_bf16, kvd);
    }
}

static void layer(const bp_layer *L, const bp_step *s, float *x, float *h, float *qkv,
                  float *att, float *gu, float *act, uint16_t *a16, int64_t per_seq) {
    const int64_t T = s->rows, D = s->hidden, nh = s->heads, d = s->head_dim;
    const int64_t I = s->inter, qkv_width = (nh + 2 * s->kv_heads) * d;
    const int fmt = (int)s->weights_format;
    rmsnorm_rows(x, L->ln1, T, D, s->eps, h);
    project(L->qkv_w, fmt, L->qkv_b, h, T, D, qkv_width, qkv, qkv_width, 0, a16);
    rope_and_store(s, qkv, qkv_width, L->k_cache, L->v_cache);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < T * per_seq; ++it)
        bp_attention_item(it, per_seq, qkv, qkv_width, L->k_cache, L->v_cache,
                          s->cache_bf16, nh, s->kv_heads, d, s->block_size, s->tables,
                          s->table_stride, s->seq_rows, s->seq_rows, s->ctx, s->scale, att);
    project(L->o_w, fmt, L->o_b, att, T, nh * d, D, x, D, 1, a16);
    rmsnorm_rows(x, L->ln2, T, D, s->eps, h);
    project(L->gate_up_w, fmt, L->gate_up_b, h, T, D, 2 * I, gu, 2 * I, 0, a16);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const float *gate = gu + t * 2 * I;
        silu_mul_row(gate, gate + I, I, act + t * I);
    }
    project(L->down_w, fmt, L->down_b, act, T, I, D, x, D, 1, a16);
}

int bp_decode_layers(const bp_layer *layers, int64_t num_layers, const bp_step *s, float *x) {
    const int64_t T = s->rows, D = s->hidden, nh = s->heads, kvh = s->kv_heads;
    const int64_t d = s->head_dim, I = s->inter;
    const int64_t fmt = s->weights_format;
    if (T < 1 || T > MAX_ROWS || nh > MAX_H || nh * d > MAX_HD || d % 2 != 0 ||
        kvh < 1 || nh % kvh != 0 || !format_fits(fmt, D, (nh + 2 * kvh) * d) ||
        !format_fits(fmt, nh * d, D) || !format_fits(fmt, D, 2 * I) || !format_fits(fmt, I, D))
        return -1;
    float *h = s->scratch, *qkv = h + T * D, *att = qkv + T * (nh + 2 * kvh) * d;
    float *gu = att + T * nh * d, *act = gu + T * 2 * I;
    uint16_t *a16 = (uint16_t *)(act + T * I);
    const int64_t per_seq = bp_attention_items_per_decode(T, kvh, s->num_threads);
    const int amx = fmt == FORMAT_Q4_TILES || bp_amx_decode_takes(s->cache_bf16, nh, kvh, d);
#pragma omp parallel num_threads(s->num_threads) if (s->num_threads > 1)
    {
        if (amx) bp_q4_amx_begin(); /* each thread's tile palette */
        for (int64_t l = 0; l < num_layers; ++l)
            layer(&layers[l], s, x, h, qkv, att, gu, act, a16, per_seq);
        if (amx) bp_q4_amx_end();
    }
    return 0;
}

/* y [T, N] = in [T, K] W^T (+ b) for one projection (lm_head on a small step): W [N, K]
   in weights_format (see the header), in float [T, K], y float [T, N]. Returns -1 when T
   is outside 1..MAX_ROWS or K does not fit the format (nothing written). */
int bp_project_rows(const void *w, int64_t weights_format, const float *bias, const float *in,
                    int64_t T, int64_t K, int64_t N, float *y, int64_t num_threads) {
    /* lm_head's GGUF blocks are not tiled: tiles are the decoder layers' alone */
    if (T < 1 || T > MAX_ROWS || weights_format == FORMAT_Q4_TILES ||
        !format_fits(weights_format, K, N))
        return -1;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    project(w, (int)weights_format, bias, in, T, K, N, y, N, 0, NULL);
    return 0;
}
