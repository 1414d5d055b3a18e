/* Prefill attention read in place from the paged KV cache (built with cpu_decode.c by
   kernels/native_library.py; driven by kernels/cpu_attention.py).

   A prefill chunk of sequence s is n query rows at positions p0 .. p0 + n - 1, where
   p0 = its ctx - n (the chunk's own keys are already in the cache); row j sees keys
   0 .. p0 + j (causal). Work item = (chunk, KV head h, tile of up to QT query rows): the
   tile's rows times the g = nh / kvh query heads of KV head h. The item walks the keys
   the tile's last row sees, KT at a time; each key tile is read from its blocks once,
   widened to float32 and transposed (kt [d][KT], vt [KT][d]), and every one of the item's
   rows reuses it: scores of one row for KT keys are d multiply-adds of a KT-wide vector,
   and its output gains KT rows of V, both plain loops gcc vectorises (16 lanes on
   AVX-512). Online softmax per row (running max m, sum l, unnormalised acc), as in
   cpu_decode.c. Nothing is gathered into a contiguous copy of the context.

   Shapes (row-major):
     q        float32, row t of head i at q + t * q_stride + i * d
     caches   [num_blocks, bs, kvh, d], float32 or bfloat16 (cache_bf16)
     tables   int32 [S, table_stride]: block ids; only the ceil(ctx / bs) first are read
     chunk_seq, chunk_row, chunk_len, chunk_ctx  int32 [num_chunks]: the chunk's sequence,
              first row in q / out, rows (>= 1), keys it sees (its own included, >= rows)
     out      float32 [T, nh, d]: the chunks' rows written, other rows untouched
   Limits: d <= MAX_D, g * d <= ITEM_MAX (else -1, nothing written). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_vector_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define QT 16          /* query rows a tile */
#define KT 32          /* keys a tile: two 16-lane vectors of scores */
#define MAX_D 256      /* head_dim */
#define ITEM_MAX 16384 /* floats of an item's rows (rows x g x d): 64 KiB per stack buffer */

typedef struct {
    const void *kc, *vc;
    int64_t bf16, kvh, d, bs;
    const int32_t *table; /* the sequence's block ids */
} kv_view;

/* Keys [k0, k0 + nk) of KV head h, widened: kt[x * KT + j] = K[k0 + j][x], vt[j * d + x] =
   V[k0 + j][x]; columns nk .. KT - 1 of kt and rows of vt are zero. */
static void load_tile(const kv_view *kv, int64_t h, int64_t k0, int64_t nk, float *kt,
                      float *vt) {
    const int64_t d = kv->d, row = kv->kvh * d;
    float krow[MAX_D];
    for (int64_t j = 0; j < KT; ++j) {
        if (j >= nk) {
            for (int64_t x = 0; x < d; ++x) kt[x * KT + j] = 0.0f;
            memset(vt + j * d, 0, (size_t)d * sizeof(float));
            continue;
        }
        const int64_t pos = k0 + j;
        const int64_t off = ((int64_t)kv->table[pos / kv->bs] * kv->bs + pos % kv->bs) * row
                            + h * d;
        const size_t size = kv->bf16 ? sizeof(uint16_t) : sizeof(float);
        widen((const char *)kv->kc + (size_t)off * size, (int)kv->bf16, d, krow);
        widen((const char *)kv->vc + (size_t)off * size, (int)kv->bf16, d, vt + j * d);
        for (int64_t x = 0; x < d; ++x) kt[x * KT + j] = krow[x];
    }
}

/* s[r * KT + j] = dot(qr + r * d, key j) for ROWS rows at once: each key vector loaded
   serves every row (ROWS x 2 accumulators stay in registers). */
#define ROWS 4
static void scores(const float *restrict qr, int64_t nrows, const float *restrict kt,
                   int64_t d, float *restrict s) {
#if defined(__AVX512F__)
    if (nrows == ROWS) {
        __m512 a[ROWS][2];
        for (int r = 0; r < ROWS; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
        for (int64_t x = 0; x < d; ++x) {
            const __m512 k0 = _mm512_loadu_ps(kt + x * KT), k1 = _mm512_loadu_ps(kt + x * KT + 16);
            for (int r = 0; r < ROWS; ++r) {
                const __m512 b = _mm512_set1_ps(qr[r * d + x]);
                a[r][0] = _mm512_fmadd_ps(b, k0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(b, k1, a[r][1]);
            }
        }
        for (int r = 0; r < ROWS; ++r) {
            _mm512_storeu_ps(s + r * KT, a[r][0]);
            _mm512_storeu_ps(s + r * KT + 16, a[r][1]);
        }
        return;
    }
#endif
    for (int64_t r = 0; r < nrows; ++r) {
        float *restrict sr = s + r * KT;
        for (int64_t j = 0; j < KT; ++j) sr[j] = 0.0f;
        for (int64_t x = 0; x < d; ++x) {
            const float qx = qr[r * d + x];
            const float *restrict kx = kt + x * KT;
#pragma omp simd
            for (int64_t j = 0; j < KT; ++j) sr[j] += qx * kx[j];
        }
    }
}

/* acc[0:d] = acc * corr + sum over j < n of p[j] * vt[j][0:d]: with AVX-512, 64 columns at
   a time stay in four registers across the keys (one load and store of acc a tile). */
static void pv(float *restrict acc, float corr, const float *restrict p,
               const float *restrict vt, int64_t n, int64_t d) {
    int64_t x = 0;
#if defined(__AVX512F__)
    const __m512 c = _mm512_set1_ps(corr);
    for (; x + 64 <= d; x += 64) {
        __m512 a0 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + x));
        __m512 a1 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + x + 16));
        __m512 a2 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + x + 32));
        __m512 a3 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + x + 48));
        for (int64_t j = 0; j < n; ++j) {
            const __m512 pj = _mm512_set1_ps(p[j]);
            const float *v = vt + j * d + x;
            a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v), a0);
            a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16), a1);
            a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 32), a2);
            a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 48), a3);
        }
        _mm512_storeu_ps(acc + x, a0);
        _mm512_storeu_ps(acc + x + 16, a1);
        _mm512_storeu_ps(acc + x + 32, a2);
        _mm512_storeu_ps(acc + x + 48, a3);
    }
#endif
    for (int64_t y = x; y < d; ++y) acc[y] *= corr;
    for (int64_t j = 0; j < n; ++j) {
        const float pj = p[j];
        const float *restrict vj = vt + j * d;
#pragma omp simd
        for (int64_t y = x; y < d; ++y) acc[y] += pj * vj[y];
    }
}

/* Softmax step of one row's scores s [KT] of which the first `visible` count: updates m,
   l, turns s into the weights p (0 past `visible`) and returns the old acc's factor. */
static float softmax_step(float *restrict s, int64_t visible, float *m, float *l) {
    float tile_max = -3.0e38f;
    for (int64_t j = 0; j < KT; ++j) {
        s[j] = j < visible ? s[j] : -3.0e38f;
        tile_max = s[j] > tile_max ? s[j] : tile_max;
    }
    const float m_new = tile_max > *m ? tile_max : *m;
    const float corr = exp_nonpos(*m - m_new);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < KT; ++j) {
        s[j] = j < visible ? exp_nonpos(s[j] - m_new) : 0.0f;
        sum += s[j];
    }
    *l = *l * corr + sum;
    *m = m_new;
    return corr;
}

/* Rows r0 .. r0 + nr - 1 of a chunk starting at position p0, KV head h (g query heads). */
static void item(const float *q, int64_t q_stride, const kv_view *kv, int64_t g, int64_t p0,
                 int64_t row0, int64_t r0, int64_t nr, int64_t h, float scale, void *out,
                 int out_bf16, int64_t nh) {
    const int64_t d = kv->d, rows = nr * g;
    float qs[ITEM_MAX], acc[ITEM_MAX], m[ITEM_MAX / 16], l[ITEM_MAX / 16];
    float kt[MAX_D * KT], vt[KT * MAX_D];
    for (int64_t j = 0; j < nr; ++j)
        for (int64_t i = 0; i < g; ++i) {
            const float *src = q + (row0 + r0 + j) * q_stride + (h * g + i) * d;
            float *dst = qs + (j * g + i) * d;
            for (int64_t x = 0; x < d; ++x) dst[x] = src[x] * scale;
        }
    memset(acc, 0, (size_t)(rows * d) * sizeof(float));
    for (int64_t r = 0; r < rows; ++r) {
        m[r] = -3.0e38f;
        l[r] = 0.0f;
    }
    const int64_t keys = p0 + r0 + nr; /* the tile's last row sees keys 0 .. keys - 1 */
    for (int64_t k0 = 0; k0 < keys; k0 += KT) {
        const int64_t nk = keys - k0 < KT ? keys - k0 : KT;
        load_tile(kv, h, k0, nk, kt, vt);
        /* rows r = j * g + i (query row j, head i); row j sees keys up to p0 + r0 + j */
        const int64_t first = k0 > p0 + r0 ? (k0 - p0 - r0) * g : 0; /* rows before: none */
        for (int64_t r = first; r < rows; r += ROWS) {
            const int64_t n = rows - r < ROWS ? rows - r : ROWS;
            float s[ROWS * KT];
            scores(qs + r * d, n, kt, d, s);
            for (int64_t k = 0; k < n; ++k) {
                int64_t visible = p0 + r0 + (r + k) / g + 1 - k0;
                visible = visible < nk ? visible : nk;
                const float corr = softmax_step(s + k * KT, visible, m + r + k, l + r + k);
                pv(acc + (r + k) * d, corr, s + k * KT, vt, visible, d);
            }
        }
    }
    for (int64_t j = 0; j < nr; ++j)
        for (int64_t i = 0; i < g; ++i) {
            const int64_t r = j * g + i;
            const float inv = 1.0f / l[r];
            float row[MAX_D];
            for (int64_t x = 0; x < d; ++x) row[x] = acc[r * d + x] * inv;
            store_out_row(row, out, out_bf16, ((row0 + r0 + j) * nh + h * g + i) * d, d);
        }
}

/* Returns 0, or -1 (nothing written) when the shapes pass the limits above. */
int bp_prefill_attention(const float *q, int64_t q_stride, const void *k_cache,
                         const void *v_cache, int64_t cache_bf16, int64_t num_chunks,
                         const int32_t *chunk_seq, const int32_t *chunk_row,
                         const int32_t *chunk_len, const int32_t *chunk_ctx, int64_t nh,
                         int64_t kvh, int64_t d, int64_t bs, const int32_t *tables,
                         int64_t table_stride, float scale, void *out, int64_t out_bf16,
                         int64_t num_threads) {
    const int64_t g = nh / kvh;
    if (d > MAX_D || g * kvh != nh || g * d > ITEM_MAX) return -1;
    int64_t qt = ITEM_MAX / (g * d); /* rows a tile: the item's buffers hold qt * g * d */
    qt = qt < QT ? qt : QT;
    qt = qt < ITEM_MAX / 16 / g ? qt : ITEM_MAX / 16 / g; /* and m, l hold qt * g */
    int64_t *first = malloc((size_t)(num_chunks + 1) * sizeof(int64_t)); /* items before */
    if (first == NULL) return -1;
    first[0] = 0;
    for (int64_t c = 0; c < num_chunks; ++c)
        first[c + 1] = first[c] + kvh * ((chunk_len[c] + qt - 1) / qt);
    const int64_t items = first[num_chunks];
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1)
    for (int64_t it = 0; it < items; ++it) {
        int64_t lo = 0, hi = num_chunks - 1; /* the chunk whose items hold `it` */
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (first[mid] <= it) lo = mid; else hi = mid - 1;
        }
        const int64_t c = lo, k = it - first[c], s = chunk_seq[c], n = chunk_len[c];
        const int64_t h = k % kvh, r0 = (k / kvh) * qt;
        const kv_view kv = {k_cache, v_cache, cache_bf16, kvh, d, bs,
                            tables + s * table_stride};
        item(q, q_stride, &kv, g, chunk_ctx[c] - n, chunk_row[c], r0,
             n - r0 < qt ? n - r0 : qt, h, scale, out, (int)out_bf16, nh);
    }
    free(first);
    return 0;
}
