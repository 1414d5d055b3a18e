/* Prefill attention over a bf16 paged KV cache on AMX (built with the other sources by
   kernels/native_library.py; driven by kernels/cpu_prefill_amx.py).

   Why: on a step of SmolLM2 prefills (2 threads) the float32 prefill kernel (cpu_prefill.c)
   runs ~85 GFLOP/s and torch's flash SDPA in bf16 (cpu_prefill_sdpa.py) ~105: it gathers
   each chunk's context out of the cache and pays a call per chunk and layer. Here
   both products of a tile run on AMX (TDPBF16PS: bf16 pairs, float32 sums), the softmax in
   AVX-512, and every chunk of the step is one call.

   Two passes:
   1. Pack (per chunk and KV head, once): the chunk's context keys, zero-padded to whole
      tiles of KT keys, re-laid as AMX B tiles (1 KB each: 16 rows of 16 dwords, a dword
      the bf16 pair (x[2p], x[2p + 1]) of row p):
        K: tile (16-key group, 32-column slice dc of d): row p, column n = key n's columns
           dc * 32 + 2p, 2p + 1            -> scores S = Q K^T
        V: tile (32-key group, 16-column slice nb of d): row p, column n = column nb * 16 + n
           of keys 2p, 2p + 1               -> outputs O = P V
   2. Items (chunk, query head, 16 query rows); for d = 64 item_d64
      (cpu_prefill_amx_d64.h: two passes, the output in tiles, AMX overlapped with the
      softmax), else item below: q rows scaled and rounded to bf16 (the A tiles), then per
      KT keys: S in 4 C tiles; online softmax per row (running max m, sum
      l) in AVX-512, the weights P rounded to bf16 (the A tiles of P V); P V into fresh C
      tiles, added to the row's float32 accumulator after scaling it by exp(m_old - m_new).
      Row j of a chunk at position p0 + j sees keys 0 .. p0 + j.

   Precision as cpu_prefill_sdpa.py: q * scale and P rounded to bf16 (K and V already are),
   scores, softmax and sums float32; the output float32.

   Shapes (row-major):
     q        float32, row t of head i at q + t * q_stride + i * d
     caches   bf16 [num_blocks, bs, kvh, d]
     tables   int32 [S, table_stride]: block ids; only the ceil(ctx / bs) first are read
     chunk_seq, chunk_row, chunk_len, chunk_ctx  int32 [num_chunks] (as cpu_prefill.c)
     out      float32, or bf16 where out_bf16 (rounded as torch's .to(bfloat16)) [T, nh, d]:
              the chunks' rows written, other rows untouched
   Limits: d 64 or 128, nh % kvh == 0, AMX granted (else -1, nothing written). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_vector_math.h" /* exp_nonpos, exp16_nonpos */

#define KT 64 /* keys a tile: 4 C tiles of scores, 2 A tiles of weights */
#define MAX_D 128

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#include <immintrin.h>

#define AMX_MEMORY_FENCE() __asm__ __volatile__("" : : : "memory") /* see cpu_amx_q4.c */

int bp_q4_amx_ready(void); /* cpu_amx_q4.c: AMX granted; its palette, all tiles 16 x 64 B */
void bp_q4_amx_begin(void);
void bp_q4_amx_end(void);

#include "cpu_prefill_amx_pack.h" /* kv_view, pack_context */

/* S[16][16 ng] (float32, row stride KT) = qa (16 x d bf16) x keys [k0, k0 + 16 ng)^T,
   ng (1..4) groups of 16 keys: past the last row's keys a tile's groups are not computed. */
static void tile_scores(const uint16_t *qa, const uint32_t *kp, int64_t k0, int64_t d,
                        int ng, float *s) {
    const int64_t d32 = d / 32;
    const uint32_t *g = kp + (k0 / 16) * d32 * 256; /* the tile's first 16-key group */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t dc = 0; dc < d32; ++dc) {
        _tile_loadd(4, qa + dc * 32, d * 2);
        _tile_loadd(5, g + (0 * d32 + dc) * 256, 64);
        _tile_dpbf16ps(0, 4, 5);
        if (ng > 1) { _tile_loadd(6, g + (1 * d32 + dc) * 256, 64); _tile_dpbf16ps(1, 4, 6); }
        if (ng > 2) { _tile_loadd(7, g + (2 * d32 + dc) * 256, 64); _tile_dpbf16ps(2, 4, 7); }
        if (ng > 3) { _tile_loadd(5, g + (3 * d32 + dc) * 256, 64); _tile_dpbf16ps(3, 4, 5); }
    }
    _tile_stored(0, s, KT * 4);
    _tile_stored(1, s + 16, KT * 4);
    _tile_stored(2, s + 32, KT * 4);
    _tile_stored(3, s + 48, KT * 4);
    AMX_MEMORY_FENCE();
}

/* One row's online softmax over its `visible` (1..KT) first scores of s: updates *m, *l,
   writes the weights as bf16 to pa (zero past visible); returns exp(m_old - m_new). */
static float row_softmax(const float *s, int64_t visible, float *m, float *l, uint16_t *pa) {
    __m512 x[4];
    __mmask16 keep[4];
    __m512 mx = _mm512_set1_ps(-3.0e38f);
    for (int z = 0; z < 4; ++z) {
        const int64_t n = visible - 16 * z;
        keep[z] = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
        x[z] = _mm512_loadu_ps(s + 16 * z);
        mx = _mm512_mask_max_ps(mx, keep[z], mx, x[z]);
    }
    const float tile_max = _mm512_reduce_max_ps(mx);
    const float m_new = tile_max > *m ? tile_max : *m;
    const float corr = exp_nonpos(*m - m_new);
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int z = 0; z < 4; ++z) {
        x[z] = keep[z] ? _mm512_maskz_mov_ps(keep[z], exp16_nonpos(_mm512_sub_ps(x[z], mv)))
                       : _mm512_setzero_ps(); /* (and the scores never computed there) */
        sum = _mm512_add_ps(sum, x[z]);
    }
    *l = *l * corr + _mm512_reduce_add_ps(sum);
    *m = m_new;
    _mm512_storeu_si512(pa, (__m512i)_mm512_cvtne2ps_pbh(x[1], x[0]));
    _mm512_storeu_si512(pa + 32, (__m512i)_mm512_cvtne2ps_pbh(x[3], x[2]));
    return corr;
}

/* part[16][d] (float32, row stride d) = pa (16 x KT bf16) x V of keys [k0, k0 + KT);
   `halves` 1 when only the first 32 keys have weights */
static void tile_values(const uint16_t *pa, const uint32_t *vp, int64_t k0, int64_t d,
                        int halves, float *part) {
    const int64_t d16 = d / 16;
    for (int64_t c0 = 0; c0 < d16; c0 += 4) { /* 64 output columns at a time */
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kb = 0; kb < halves; ++kb) {
            const uint32_t *g = vp + ((k0 / 32 + kb) * d16 + c0) * 256;
            _tile_loadd(4, pa + kb * 32, KT * 2);
            _tile_loadd(5, g, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, g + 256, 64);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, g + 512, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, g + 768, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, part + c0 * 16, d * 4);
        _tile_stored(1, part + c0 * 16 + 16, d * 4);
        _tile_stored(2, part + c0 * 16 + 32, d * 4);
        _tile_stored(3, part + c0 * 16 + 48, d * 4);
    }
    AMX_MEMORY_FENCE();
}

/* Pass 2: rows j0 .. j0 + nr - 1 (nr <= 16) of a chunk at position p0 whose first row is
   out's row0, query head i; kp, vp its KV head's packed context. The calling thread has
   run bp_q4_amx_begin. */
static void item(const float *q, int64_t q_stride, const uint32_t *kp, const uint32_t *vp,
                 int64_t d, int64_t p0, int64_t row0, int64_t j0, int64_t nr, int64_t i,
                 int64_t nh, float scale, void *out, int out_bf16) {
    uint16_t qa[16 * MAX_D] __attribute__((aligned(64)));
    uint16_t pa[16 * KT] __attribute__((aligned(64)));
    float s[16 * KT] __attribute__((aligned(64)));
    float part[16 * MAX_D] __attribute__((aligned(64)));
    float acc[16 * MAX_D] __attribute__((aligned(64)));
    float m[16], l[16], corr[16];
    for (int64_t r = 0; r < 16; ++r) {
        if (r < nr) {
            const float *src = q + (row0 + j0 + r) * q_stride + i * d;
            for (int64_t x = 0; x < d; x += 16) /* rounded to nearest even, as narrow() */
                _mm256_storeu_si256((__m256i *)(qa + r * d + x), (__m256i)_mm512_cvtneps_pbh(
                    _mm512_mul_ps(_mm512_loadu_ps(src + x), _mm512_set1_ps(scale))));
        } else {
            memset(qa + r * d, 0, (size_t)d * sizeof(uint16_t));
        }
        m[r] = -3.0e38f;
        l[r] = 0.0f;
    }
    memset(pa, 0, sizeof pa); /* rows past nr stay zero */
    memset(acc, 0, (size_t)(16 * d) * sizeof(float));
    AMX_MEMORY_FENCE();
    const int64_t keys = p0 + j0 + nr; /* the last row sees keys 0 .. keys - 1 */
    for (int64_t k0 = 0; k0 < keys; k0 += KT) {
        const int64_t here = keys - k0 < KT ? keys - k0 : KT; /* keys any row sees here */
        tile_scores(qa, kp, k0, d, (int)((here + 15) / 16), s);
        for (int64_t r = 0; r < nr; ++r) {
            int64_t visible = p0 + j0 + r + 1 - k0;
            visible = visible > KT ? KT : visible;
            if (visible <= 0) { /* this row sees none of these keys */
                memset(pa + r * KT, 0, KT * sizeof(uint16_t));
                corr[r] = 1.0f;
                continue;
            }
            corr[r] = row_softmax(s + r * KT, visible, m + r, l + r, pa + r * KT);
        }
        AMX_MEMORY_FENCE();
        tile_values(pa, vp, k0, d, here > 32 ? 2 : 1, part);
        for (int64_t r = 0; r < nr; ++r) {
            const __m512 c = _mm512_set1_ps(corr[r]);
            for (int64_t x = 0; x < d; x += 16)
                _mm512_storeu_ps(acc + r * d + x,
                                 _mm512_fmadd_ps(_mm512_loadu_ps(acc + r * d + x), c,
                                                 _mm512_loadu_ps(part + r * d + x)));
        }
    }
    for (int64_t r = 0; r < nr; ++r) {
        const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
        float row[128];
        for (int64_t x = 0; x < d; x += 16)
            _mm512_storeu_ps(row + x, _mm512_mul_ps(_mm512_loadu_ps(acc + r * d + x), inv));
        store_out_row(row, out, out_bf16, ((row0 + j0 + r) * nh + i) * d, d);
    }
}

#include "cpu_prefill_amx_d64.h" /* item_d64 */

#define AMX_BUILD 1
#else
#define AMX_BUILD 0
#endif

/* Returns 0, or -1 (nothing written) outside the limits above, when AMX is not granted,
   or when the packed contexts cannot be allocated. */
int bp_prefill_attention_amx(const float *q, int64_t q_stride, const uint16_t *k_cache,
                             const uint16_t *v_cache, int64_t num_chunks,
                             const int32_t *chunk_seq, const int32_t *chunk_row,
                             const int32_t *chunk_len, const int32_t *chunk_ctx, int64_t nh,
                             int64_t kvh, int64_t d, int64_t bs, const int32_t *tables,
                             int64_t table_stride, float scale, void *out,
                             int64_t out_bf16, int64_t num_threads) {
#if AMX_BUILD
    const int64_t g = nh / kvh;
    if ((d != 64 && d != 128) || g * kvh != nh || num_chunks < 1 || !bp_q4_amx_ready())
        return -1;
    /* packed[c]: the chunk's kvh contexts, K then V, each padded_keys x d bf16 */
    int64_t *first = malloc((size_t)(2 * num_chunks + 1) * sizeof(int64_t));
    if (first == NULL) return -1;
    int64_t *packed = first + num_chunks + 1, words = 0;
    first[0] = 0;
    for (int64_t c = 0; c < num_chunks; ++c) {
        packed[c] = words;
        words += kvh * 2 * ((chunk_ctx[c] + KT - 1) / KT * KT) * d / 2;
        first[c + 1] = first[c] + nh * ((chunk_len[c] + 15) / 16);
    }
    uint32_t *pack = aligned_alloc(64, (size_t)words * sizeof(uint32_t));
    if (pack == NULL) {
        free(first);
        return -1;
    }
    const int64_t items = first[num_chunks];
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t ch = 0; ch < num_chunks * kvh; ++ch) {
            const int64_t c = ch / kvh, h = ch % kvh, ctx = chunk_ctx[c];
            const int64_t padded = (ctx + KT - 1) / KT * KT, size = padded * d / 2;
            const kv_view kv = {k_cache, v_cache, kvh, d, bs,
                                tables + chunk_seq[c] * table_stride};
            uint32_t *kp = pack + packed[c] + h * 2 * size;
            pack_context(&kv, h, ctx, padded, kp, kp + size);
        }
        bp_q4_amx_begin();
        /* guided: an item takes ~1 us on SmolLM2's prompts, and fetching each one alone
           (dynamic, 1) spent ~3% of a prefill step on the shared counter's atomic; items
           grow costlier within a chunk, which fixed chunks of them leave unbalanced.
           Prefill steps of the offline workload (6 alternating runs): 718 -> 677 ms a run
           (dynamic, 8: 732; split by an estimate of each item's cost: 685). */
#pragma omp for schedule(guided)
        for (int64_t it = 0; it < items; ++it) {
            int64_t lo = 0, hi = num_chunks - 1; /* the chunk whose items hold `it` */
            while (lo < hi) {
                const int64_t mid = (lo + hi + 1) / 2;
                if (first[mid] <= it) lo = mid; else hi = mid - 1;
            }
            const int64_t c = lo, k = it - first[c], n = chunk_len[c], i = k % nh;
            const int64_t j0 = (k / nh) * 16, ctx = chunk_ctx[c];
            const int64_t size = (ctx + KT - 1) / KT * KT * d / 2;
            const uint32_t *kp = pack + packed[c] + (i / g) * 2 * size;
            const int64_t nr = n - j0 < 16 ? n - j0 : 16;
            if (d == 64)
                item_d64(q, q_stride, kp, kp + size, ctx - n, chunk_row[c], j0, nr, i, nh,
                         scale, out, (int)out_bf16);
            else
                item(q, q_stride, kp, kp + size, d, ctx - n, chunk_row[c], j0, nr, i, nh,
                     scale, out, (int)out_bf16);
        }
        bp_q4_amx_end();
    }
    free(pack);
    free(first);
    return 0;
#else /* no AMX in this build: callers keep torch's SDPA */
    (void)q; (void)q_stride; (void)k_cache; (void)v_cache; (void)num_chunks; (void)chunk_seq;
    (void)chunk_row; (void)chunk_len; (void)chunk_ctx; (void)nh; (void)kvh; (void)d;
    (void)bs; (void)tables; (void)table_stride; (void)scale; (void)out; (void)out_bf16;
    (void)num_threads;
    return -1;
#endif
}
