/* Decode attention read in place from the paged KV cache (built by kernels/native_library.py).

   One query per decode (its sequence's last position: it sees every key, no causal mask).
   Work item = a decode (or one KV head of it, see bp_decode_attention): its query heads
   read each key and value row where it lies, block by block through the block table
   (g = nh / kvh query heads share a KV head, GQA), with an online
   softmax per query head (running max m, sum l, unnormalised output acc; each tile of keys
   rescales them by exp(m_old - m_new)). Nothing is gathered: the bytes read are the context
   itself, once per layer. Items run in parallel under OpenMP (torch's own libgomp, already
   loaded in the process, so one thread pool serves both).

   Shapes (row-major):
     q       float32, row t of head i at q + t * q_stride + i * d (heads contiguous)
     caches  [num_blocks, bs, kvh, d], float32 or bfloat16 (uint16 bit patterns); cache_mode
             0 float32, 1 bfloat16, 2 bfloat16 with bf16 products on AMX (cpu_decode_amx.h)
             or else AVX-512-BF16 (cpu_decode_dpbf16.h), 3 the same never on AMX
     tables  int32 [S, table_stride]: block ids; only the ceil(ctx / bs) first are read
     ctx     int32 [S] >= 1: keys of sequence s
     seqs    int32 [num_decodes]: decode i is sequence seqs[i]
     rows    int32 [num_decodes]: the token row of decode i in q and out
     out     float32 [T, nh, d]: rows[i] written, other rows untouched
   Limits: nh <= MAX_H, nh * d <= MAX_HD (else -1, nothing written). */

#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h"

void bp_q4_amx_begin(void); /* cpu_amx_q4.c: this thread's tile palette, and its release */
void bp_q4_amx_end(void);

#define MAX_H 128    /* query heads */
#define MAX_HD 16384 /* query heads x head_dim: 64 KiB per stack buffer */
#define TILE 32 /* keys per softmax tile: scores stay in registers/L1 */

static inline float from_f32(float x) { return x; }

static inline float from_bf16(uint16_t x) { /* bf16 is the top half of a float32 */
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* dot(a, b) over d elements, b a cache row of float or bf16, and pv (below).
   NOTE: explicit AVX-512 where the compiler targets it: left to itself, gcc vectorised
   the loop over keys around these (a gather per element), 15x slower than this. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline __m512 ld16_f32(const float *b) { return _mm512_loadu_ps(b); }
static inline __m512 ld16_bf16(const uint16_t *b) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)b));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#define DEFINE_ROW_OPS(SUFFIX, T, CONV)                                                    \
static inline float dot_##SUFFIX(const float *a, const T *b, int64_t d) {                \
    __m512 acc = _mm512_setzero_ps();                                                     \
    int64_t x = 0;                                                                        \
    for (; x + 16 <= d; x += 16)                                                          \
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + x), ld16_##SUFFIX(b + x), acc);         \
    float sum = _mm512_reduce_add_ps(acc);                                                \
    for (; x < d; ++x) sum += a[x] * CONV(b[x]);                                          \
    return sum;                                                                           \
}                                                                                         \
/* acc[0:d] += sum_j p[j] * rows[j][0:d] over a tile: 64 columns at a time stay in four \
   registers across the tile's keys (one load and store of acc per tile, not per key) */  \
static inline void pv_##SUFFIX(float *acc, const float *p, const T *const *rows,         \
                               int64_t head, int64_t n, int64_t d) {                      \
    int64_t x = 0;                                                                        \
    for (; x + 64 <= d; x += 64) {                                                        \
        __m512 a0 = _mm512_loadu_ps(acc + x), a1 = _mm512_loadu_ps(acc + x + 16);         \
        __m512 a2 = _mm512_loadu_ps(acc + x + 32), a3 = _mm512_loadu_ps(acc + x + 48);    \
        for (int64_t j = 0; j < n; ++j) {                                                 \
            const T *b = rows[j] + head + x;                                              \
            const __m512 pj = _mm512_set1_ps(p[j]);                                       \
            a0 = _mm512_fmadd_ps(pj, ld16_##SUFFIX(b), a0);                               \
            a1 = _mm512_fmadd_ps(pj, ld16_##SUFFIX(b + 16), a1);                          \
            a2 = _mm512_fmadd_ps(pj, ld16_##SUFFIX(b + 32), a2);                          \
            a3 = _mm512_fmadd_ps(pj, ld16_##SUFFIX(b + 48), a3);                          \
        }                                                                                 \
        _mm512_storeu_ps(acc + x, a0);                                                    \
        _mm512_storeu_ps(acc + x + 16, a1);                                               \
        _mm512_storeu_ps(acc + x + 32, a2);                                               \
        _mm512_storeu_ps(acc + x + 48, a3);                                               \
    }                                                                                     \
    for (; x + 16 <= d; x += 16) {                                                        \
        __m512 a0 = _mm512_loadu_ps(acc + x);                                             \
        for (int64_t j = 0; j < n; ++j)                                                   \
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), ld16_##SUFFIX(rows[j] + head + x), \
                                 a0);                                                     \
        _mm512_storeu_ps(acc + x, a0);                                                    \
    }                                                                                     \
    for (; x < d; ++x)                                                                    \
        for (int64_t j = 0; j < n; ++j) acc[x] += p[j] * CONV(rows[j][head + x]);         \
}
#else
#define DEFINE_ROW_OPS(SUFFIX, T, CONV)                                                    \
static inline float dot_##SUFFIX(const float *a, const T *b, int64_t d) {                \
    float sum = 0.0f;                                                                     \
    for (int64_t x = 0; x < d; ++x) sum += a[x] * CONV(b[x]);                             \
    return sum;                                                                           \
}                                                                                         \
static inline void pv_##SUFFIX(float *acc, const float *p, const T *const *rows,         \
                               int64_t head, int64_t n, int64_t d) {                      \
    for (int64_t j = 0; j < n; ++j)                                                       \
        for (int64_t x = 0; x < d; ++x) acc[x] += p[j] * CONV(rows[j][head + x]);         \
}
#endif
DEFINE_ROW_OPS(f32, float, from_f32)
DEFINE_ROW_OPS(bf16, uint16_t, from_bf16)

/* Where keys k0 .. k0 + n - 1 of a sequence lie: kr[j] / vr[j] = the row of key k0 + j
   (element offset `head` into it), walking the block table block by block (no division
   per key: with a runtime block size that was two integer divisions a key). */
static inline void tile_rows(const int32_t *table, int64_t bs, int64_t row, int64_t head,
                             int64_t k0, int64_t n, const void **kr, const void **vr,
                             const void *kc, const void *vc, int64_t elem) {
    int64_t blk = k0 / bs, in = k0 % bs;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t off = (((int64_t)table[blk] * bs + in) * row + head) * elem;
        kr[j] = (const char *)kc + off;
        vr[j] = (const char *)vc + off;
        if (++in == bs) {
            in = 0;
            ++blk;
        }
    }
}

/* The next tile's rows (keys from .. from + TILE - 1, below ctx), `span` bytes of each,
   towards the cache while this one computes: blocks lie anywhere, so the hardware
   prefetcher cannot guess them. `shared`: only as far as the cache both threads read
   (T2), for rows whichever thread may take (prefetch_item). */
static inline void prefetch_rows(const int32_t *table, int64_t bs, int64_t row, int64_t head,
                                 int64_t from, int64_t ctx, const void *kc, const void *vc,
                                 int64_t elem, int64_t span, int shared) {
    if (from >= ctx) return;
    int64_t blk = from / bs, in = from % bs;
    for (int64_t pos = from; pos < from + TILE && pos < ctx; ++pos) {
        const int64_t off = (((int64_t)table[blk] * bs + in) * row + head) * elem;
        for (int64_t b = 0; b < span; b += 64) {
            if (shared) { /* locality 1: T2 */
                __builtin_prefetch((const char *)kc + off + b, 0, 1);
                __builtin_prefetch((const char *)vc + off + b, 0, 1);
            } else {
                __builtin_prefetch((const char *)kc + off + b);
                __builtin_prefetch((const char *)vc + off + b);
            }
        }
        if (++in == bs) {
            in = 0;
            ++blk;
        }
    }
}

/* An item's start: q scaled into qs, running max m (finite: exp_nonpos(m - m_new) stays a
   number), sum l and unnormalised output acc zeroed, for nq query heads of d */
static inline void item_start(const float *q, float scale, int64_t nq, int64_t d, float *qs,
                              float *acc, float *m, float *l) {
    for (int64_t i = 0; i < nq; ++i) {
        m[i] = -3.0e38f;
        l[i] = 0.0f;
    }
    for (int64_t x = 0; x < nq * d; ++x) {
        qs[x] = q[x] * scale;
        acc[x] = 0.0f;
    }
}

/* A tile's rows (tile_rows) and the next tile's towards the cache (prefetch_rows), `cols`
   elements of each row read */
static inline void tile_setup(const int32_t *table, int64_t bs, int64_t row, int64_t head,
                              int64_t k0, int64_t n, int64_t ctx, const void **kr,
                              const void **vr, const void *kc, const void *vc, int64_t elem,
                              int64_t cols) {
    tile_rows(table, bs, row, head, k0, n, kr, vr, kc, vc, elem);
    prefetch_rows(table, bs, row, head, k0 + TILE, ctx, kc, vc, elem, cols * elem, 0);
}

/* An item's end: out = acc / l per query head */
static inline void item_finish(const float *acc, const float *l, int64_t nq, int64_t d,
                               float *out) {
    for (int64_t i = 0; i < nq; ++i) {
        const float inv = 1.0f / l[i];
        for (int64_t x = 0; x < d; ++x) out[i * d + x] = acc[i * d + x] * inv;
    }
}

/* One item: query heads [0, nq) of one decode, reading KV heads h0 .. h0 + nq / g - 1
   (query head i reads KV head h0 + i / g), on a cache of element type T. */
#define DEFINE_ITEM(NAME, T, SUFFIX)                                                      \
static void NAME(const float *q, const void *kc, const void *vc, int64_t kvh, int64_t g,  \
                 int64_t nq, int64_t d, int64_t bs, int64_t h0, const int32_t *table,     \
                 int64_t ctx, float scale, float *out) {                                  \
    float qs[MAX_HD], acc[MAX_HD], m[MAX_H], l[MAX_H], p[TILE];                           \
    const int64_t row = kvh * d; /* elements from one token's K (V) row to the next */    \
    item_start(q, scale, nq, d, qs, acc, m, l);                                           \
    for (int64_t k0 = 0; k0 < ctx; k0 += TILE) {                                          \
        const int64_t n = ctx - k0 < TILE ? ctx - k0 : TILE; /* keys in this tile */      \
        const T *kr[TILE], *vr[TILE]; /* key k0 + j's row, at KV head h0 */               \
        tile_setup(table, bs, row, h0 * d, k0, n, ctx, (const void **)kr,                 \
                   (const void **)vr, kc, vc, (int64_t)sizeof(T), nq / g * d);            \
        for (int64_t i = 0; i < nq; ++i) {                                                \
            const float *qi = qs + i * d;                                                 \
            const int64_t head = (i / g) * d; /* this query head's KV head in a row */    \
            float tile_max = -3.0e38f;                                                    \
            for (int64_t j = 0; j < n; ++j) {                                             \
                p[j] = dot_##SUFFIX(qi, kr[j] + head, d);                                 \
                tile_max = p[j] > tile_max ? p[j] : tile_max;                             \
            }                                                                             \
            const float m_new = tile_max > m[i] ? tile_max : m[i];                        \
            const float corr = exp_nonpos(m[i] - m_new);                                  \
            float sum = 0.0f;                                                             \
            _Pragma("omp simd reduction(+:sum)")                                          \
            for (int64_t j = 0; j < n; ++j) {                                             \
                p[j] = exp_nonpos(p[j] - m_new);                                          \
                sum += p[j];                                                              \
            }                                                                             \
            l[i] = l[i] * corr + sum;                                                     \
            m[i] = m_new;                                                                 \
            float *ai = acc + i * d;                                                      \
            for (int64_t x = 0; x < d; ++x) ai[x] *= corr;                                \
            pv_##SUFFIX(ai, p, vr, head, n, d);                                          \
        }                                                                                 \
    }                                                                                     \
    item_finish(acc, l, nq, d, out);                                                      \
}

DEFINE_ITEM(item_f32, float, f32)
DEFINE_ITEM(item_bf16, uint16_t, bf16)

#include "cpu_decode_tiled.h" /* tiled_*: the KV-head-major items */
#include "cpu_decode_dpbf16.h" /* dp_item_bf16: both products in VDPBF16PS */
#include "cpu_decode_amx.h"   /* amx_item_bf16: both products on AMX tiles */

/* Item `it` of a step's decode attention, `per_seq` items per decode (see below): the
   query heads of decode it / per_seq that read KV heads h0 .. h0 + kvh / per_seq - 1.
   Also run by kernels/cpu_layers.c inside its own parallel region. */
void bp_attention_item(int64_t it, int64_t per_seq, const float *q, int64_t q_stride,
                       const void *k_cache, const void *v_cache, int64_t cache_mode,
                       int64_t nh, int64_t kvh, int64_t d, int64_t bs, const int32_t *tables,
                       int64_t table_stride, const int32_t *seqs, const int32_t *rows,
                       const int32_t *ctx, float scale, float *out) {
    const int64_t g = nh / kvh, kv_per_item = kvh / per_seq;
    const int64_t i = it / per_seq, h0 = (it % per_seq) * kv_per_item, s = seqs[i];
    const float *qi = q + (int64_t)rows[i] * q_stride + h0 * g * d;
    float *oi = out + ((int64_t)rows[i] * nh + h0 * g) * d;
    const int32_t *table = tables + s * table_stride;
    const int tiled = TILED_TAKES(d);
    if (bp_amx_decode_takes(cache_mode, nh, kvh, d) && AMX_ITEM_TAKES(kv_per_item * g, g) &&
        ctx[s] > AMX_DEC_MIN_KEYS)
        amx_item_bf16(qi, k_cache, v_cache, kvh, g, kv_per_item * g, d, bs, h0, table, ctx[s],
                      scale, oi);
    else if (DP_TAKES(cache_mode, d, ctx[s]))
        dp_item_bf16(qi, k_cache, v_cache, kvh, g, kv_per_item * g, d, bs, h0, table, ctx[s],
                     scale, oi);
    else if (cache_mode)
        (tiled ? tiled_bf16 : item_bf16)(qi, k_cache, v_cache, kvh, g, kv_per_item * g, d, bs,
                                         h0, table, ctx[s], scale, oi);
    else
        (tiled ? tiled_f32 : item_f32)(qi, k_cache, v_cache, kvh, g, kv_per_item * g, d, bs,
                                       h0, table, ctx[s], scale, oi);
}

/* Item `it`'s first tile of keys towards the shared cache (T2: L3, which the thread that
   takes the item reads from, whichever it is), for the item two ahead of the one starting:
   within an item each tile fetches the next, so without this the first tile of every item
   waits on memory. */
static void prefetch_item(int64_t it, int64_t items, int64_t per_seq,
                          const void *k_cache, const void *v_cache, int64_t elem, int64_t kvh,
                          int64_t d, int64_t bs, const int32_t *tables, int64_t table_stride,
                          const int32_t *seqs, const int32_t *ctx) {
    if (it >= items) return;
    const int64_t kv_per_item = kvh / per_seq, s = seqs[it / per_seq];
    prefetch_rows(tables + s * table_stride, bs, kvh * d, (it % per_seq) * kv_per_item * d, 0,
                  ctx[s], k_cache, v_cache, elem, kv_per_item * d * elem, 1);
}

/* Items per decode: a whole decode (all heads: each K/V row is read once, in order) when
   there are at least 4 decodes per thread; else one KV head of a decode, so that a few
   long decodes still spread over the threads. */
int64_t bp_attention_items_per_decode(int64_t num_decodes, int64_t kvh, int64_t num_threads) {
    return num_decodes >= 4 * num_threads ? 1 : kvh;
}

/* Returns 0, or -1 when the heads do not fit the stack buffers (nothing written then). */
int bp_decode_attention(const float *q, int64_t q_stride, const void *k_cache,
                        const void *v_cache, int64_t cache_mode, int64_t num_decodes,
                        int64_t nh, int64_t kvh, int64_t d, int64_t bs, const int32_t *tables,
                        int64_t table_stride, const int32_t *seqs, const int32_t *rows,
                        const int32_t *ctx, float scale, float *out, int64_t num_threads) {
    if (nh > MAX_H || nh * d > MAX_HD || (nh / kvh) * kvh != nh) return -1;
    const int64_t per_seq = bp_attention_items_per_decode(num_decodes, kvh, num_threads);
    const int64_t items = num_decodes * per_seq;
    const int amx = bp_amx_decode_takes(cache_mode, nh, kvh, d);
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        if (amx) bp_q4_amx_begin(); /* each thread's tile palette */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; ++it) {
            prefetch_item(it + 2, items, per_seq, k_cache, v_cache, cache_mode ? 2 : 4, kvh,
                          d, bs, tables, table_stride, seqs, ctx);
            bp_attention_item(it, per_seq, q, q_stride, k_cache, v_cache, cache_mode, nh,
                              kvh, d, bs, tables, table_stride, seqs, rows, ctx, scale, out);
        }
        if (amx) bp_q4_amx_end();
    }
    return 0;
}
