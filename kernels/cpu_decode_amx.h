/* Decode attention over a bf16 KV cache on AMX tiles (included by cpu_decode.c after
   cpu_decode_tiled.h, whose softmax_tile it uses, and cpu_decode_dpbf16.h, whose
   interleave_values and pairs_finish it uses; part of the library's build hash,
   kernels/native_library.py).

   Why: the tiled item widens every K and V row to float32 and runs one FMA per element and
   query head; with the cache hot it still took ~13 us per SmolLM2 decode and layer (150
   keys, 9 heads), about 38% of a 64-decode step. Its time is instructions, not bytes: the
   same work with the cache out of L2 took only ~15% longer. Here both products of a tile
   of keys are TDPBF16PS (bf16 pairs, float32 sums) and the AVX-512 work left is the
   softmax and the re-laying of V:
   - scores, per 16 keys and KV head: S^T (16 keys x 16 columns, the KV head's g query
     heads and zeros) = K rows, loaded as an A tile straight from the cache (16 keys of a
     block lie one row apart), x q^T as a B tile (the item's query heads, scaled and
     rounded to bf16 once per item); a head's 16 scores are one gather of a column.
   - P V, per tile of 32 keys: O (16 rows: the heads, and zeros) = P (the tile's weights
     rounded to bf16, an A tile) x V (a B tile: row m = keys 2m and 2m + 1 interleaved),
     added to each head's float32 accumulator after scaling it by exp(m_old - m_new).
   Precision as the AMX prefill kernel (cpu_prefill_amx.c): q * scale and P rounded to
   bf16 (K and V already are), scores, softmax and sums float32. A float32 cache never
   comes here.

   V's interleave (unpacking 32 columns of two rows) puts, in each 128-bit lane k, columns
   8k + i in the low half's pairs and 8k + 4 + i in the high half's (i < 4); the
   accumulators keep that order for the whole item and pairs_finish restores the columns.

   The calling thread has configured the tiles (bp_q4_amx_begin: 16 rows of 64 bytes). */

#ifndef BP_CPU_DECODE_AMX_H
#define BP_CPU_DECODE_AMX_H

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#define AMX_DEC_MAX_D 128 /* d 64 or 128: four B tiles of V a round */
#define AMX_DEC_MAX_KV 8  /* KV heads an item: their q^T tiles on the stack (32 KB) */
/* Contexts up to this many keys keep the float32 item: the tiles' set-up per item (q^T
   tiles, a weight tile, tile stores) costs more than it saves there. 64 SmolLM2 decodes,
   30 layers, ms, float32 item / AMX: 1 key 0.91 / 1.59, 16 keys 1.73 / 1.74, 32 keys
   3.01 / 2.16, 150 keys 13.0 / 9.8. */
#define AMX_DEC_MIN_KEYS 16
#define AMX_DEC_FENCE() __asm__ __volatile__("" : : : "memory") /* see cpu_amx_q4.c */

int bp_q4_amx_ready(void); /* cpu_amx_q4.c: AMX granted to this process */

/* Whether bp_attention_item takes the AMX item for these heads: cache mode 2 (a bf16
   cache, bf16 products asked for: native_library.cache_mode). The calling regions
   (bp_decode_attention, cpu_layers.c) configure the tiles when it does. */
int bp_amx_decode_takes(int64_t cache_mode, int64_t nh, int64_t kvh, int64_t d) {
    return cache_mode == 2 && (d == 64 || d == 128) && nh / kvh <= 16 && bp_q4_amx_ready();
}

/* qt[(kv * d / 32 + dc) * 256 + 16 p + n] = the bf16 pair (2p, 2p + 1) of columns 32 dc ..
   of query head kv * g + n (scaled: qs), zero for n >= g: B tiles of q^T */
static void amx_query_tiles(const float *qs, int64_t kvs, int64_t g, int64_t d, uint32_t *qt) {
    memset(qt, 0, (size_t)(kvs * d / 32) * 256 * sizeof *qt);
    for (int64_t i = 0; i < kvs * g; ++i)
        for (int64_t dc = 0; dc < d / 32; ++dc) {
            uint32_t pairs[16];
            const float *x = qs + i * d + 32 * dc;
            _mm512_storeu_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16),
                                                                    _mm512_loadu_ps(x)));
            uint32_t *tile = qt + ((i / g) * (d / 32) + dc) * 256;
            for (int p = 0; p < 16; ++p) tile[16 * p + i % g] = pairs[p];
        }
}

/* sT[kg * 256 + 16 j + n] = score of key 16 kg + j (kg < 2) for the KV head's query head n,
   over the tile's n_keys keys (rows kr[j] + off). With 16 | bs a group of 16 keys lies in
   one block, one row apart, and is read in place, a partial group too: the rows past n_keys
   are still the block's (their scores are never used). Else the keys go through a zeroed
   copy. Tiles: C 0 and 3 (the two groups), A 1, 4, 5, 7 and B 2, 6, so that no load waits
   for the product before it to release its tile. */
static void amx_scores(const uint16_t *const *kr, int64_t off, int64_t n_keys, int64_t d,
                       int64_t bs, int64_t row, const uint32_t *qt, float *sT) {
    uint16_t part[TILE * AMX_DEC_MAX_D];
    const uint16_t *g0 = kr[0] + off, *g1 = n_keys > 16 ? kr[16] + off : NULL;
    int64_t stride = row * 2;
    if (bs % 16 != 0) {
        for (int64_t j = 0; j < n_keys; ++j) memcpy(part + j * d, kr[j] + off, d * 2);
        memset(part + n_keys * d, 0, (size_t)((TILE - n_keys) * d * 2));
        g0 = part;
        g1 = n_keys > 16 ? part + 16 * d : NULL;
        stride = d * 2;
        AMX_DEC_FENCE();
    }
    _tile_zero(0);
    _tile_zero(3);
    for (int64_t dc = 0; dc < d / 32; dc += 2) { /* d 64 or 128: column chunks in pairs */
        _tile_loadd(1, g0 + 32 * dc, stride);
        _tile_loadd(2, qt + dc * 256, 64);
        _tile_dpbf16ps(0, 1, 2);
        if (g1) {
            _tile_loadd(4, g1 + 32 * dc, stride);
            _tile_dpbf16ps(3, 4, 2);
        }
        _tile_loadd(5, g0 + 32 * (dc + 1), stride);
        _tile_loadd(6, qt + (dc + 1) * 256, 64);
        _tile_dpbf16ps(0, 5, 6);
        if (g1) {
            _tile_loadd(7, g1 + 32 * (dc + 1), stride);
            _tile_dpbf16ps(3, 7, 6);
        }
    }
    _tile_stored(0, sT, 64);
    if (g1) _tile_stored(3, sT + 256, 64);
    AMX_DEC_FENCE();
}

/* ot[c * 256 + 16 r + w] = row r of pa (16 x 32 bf16) x column tile c of vp, c < d / 16 */
static void amx_weighted_values(const uint16_t *pa, const uint32_t *vp, int64_t d, float *ot) {
    _tile_loadd(3, pa, 64);
    for (int64_t c0 = 0; c0 < d / 16; c0 += 4) {
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        _tile_loadd(0, vp + 16 * c0, d * 4);
        _tile_dpbf16ps(4, 3, 0);
        _tile_loadd(1, vp + 16 * (c0 + 1), d * 4);
        _tile_dpbf16ps(5, 3, 1);
        _tile_loadd(2, vp + 16 * (c0 + 2), d * 4);
        _tile_dpbf16ps(6, 3, 2);
        _tile_loadd(0, vp + 16 * (c0 + 3), d * 4);
        _tile_dpbf16ps(7, 3, 0);
        _tile_stored(4, ot + c0 * 256, 64);
        _tile_stored(5, ot + (c0 + 1) * 256, 64);
        _tile_stored(6, ot + (c0 + 2) * 256, 64);
        _tile_stored(7, ot + (c0 + 3) * 256, 64);
    }
    AMX_DEC_FENCE();
}

/* The item of cpu_decode.c (query heads [0, nq) of one decode, KV heads from h0) */
static void amx_item_bf16(const float *q, const void *kc, const void *vc, int64_t kvh,
                          int64_t g, int64_t nq, int64_t d, int64_t bs, int64_t h0,
                          const int32_t *table, int64_t ctx, float scale, float *out) {
    float qs[MAX_HD], acc[MAX_HD], m[MAX_H], l[MAX_H], p[TILE], corr[16];
    float sT[2 * 256], ot[AMX_DEC_MAX_D / 16 * 256];
    uint32_t qt[AMX_DEC_MAX_KV * AMX_DEC_MAX_D / 32 * 256], vp[16 * AMX_DEC_MAX_D];
    uint16_t pa[16 * 32];
    const int64_t row = kvh * d, d32 = d / 32;
    const __m512i column = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96,
                                            80, 64, 48, 32, 16, 0);
    item_start(q, scale, nq, d, qs, acc, m, l);
    amx_query_tiles(qs, nq / g, g, d, qt);
    memset(pa, 0, sizeof pa); /* rows past g stay zero */
    for (int64_t k0 = 0; k0 < ctx; k0 += TILE) {
        const int64_t n = ctx - k0 < TILE ? ctx - k0 : TILE;
        const uint16_t *kr[TILE], *vr[TILE];
        tile_setup(table, bs, row, h0 * d, k0, n, ctx, (const void **)kr, (const void **)vr,
                   kc, vc, 2, nq / g * d);
        for (int64_t kv = 0; kv < nq / g; ++kv) {
            amx_scores(kr, kv * d, n, d, bs, row, qt + kv * d32 * 256, sT);
            interleave_values(vr, kv * d, n, d, vp); /* (cpu_decode_dpbf16.h) */
            for (int64_t h = 0; h < g; ++h) {
                _mm512_storeu_ps(p, _mm512_i32gather_ps(column, sT + h, 4));
                if (n > 16) _mm512_storeu_ps(p + 16, _mm512_i32gather_ps(column, sT + 256 + h, 4));
                float sum;
                const int64_t i = kv * g + h;
                softmax_tile(p, n, &m[i], &corr[h], &sum);
                l[i] = l[i] * corr[h] + sum;
                const __mmask16 k0m = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
                const __mmask16 k1m = (__mmask16)(n >= 32 ? 0xFFFFu : n > 16 ? (1u << (n - 16)) - 1u : 0u);
                _mm512_storeu_si512(pa + 32 * h, (__m512i)_mm512_cvtne2ps_pbh(
                    _mm512_maskz_loadu_ps(k1m, p + 16), _mm512_maskz_loadu_ps(k0m, p)));
            }
            AMX_DEC_FENCE();
            amx_weighted_values(pa, vp, d, ot);
            for (int64_t h = 0; h < g; ++h) {
                float *ai = acc + (kv * g + h) * d;
                const __m512 c = _mm512_set1_ps(corr[h]);
                for (int64_t x = 0; x < d; x += 16)
                    _mm512_storeu_ps(ai + x, _mm512_fmadd_ps(_mm512_loadu_ps(ai + x), c,
                                     _mm512_loadu_ps(ot + (x / 16) * 256 + 16 * h)));
            }
        }
    }
    pairs_finish(acc, l, nq, d, out);
}
#define AMX_ITEM_TAKES(nq, g) ((nq) / (g) <= AMX_DEC_MAX_KV)
#else
int bp_amx_decode_takes(int64_t cache_mode, int64_t nh, int64_t kvh, int64_t d) {
    (void)cache_mode, (void)nh, (void)kvh, (void)d;
    return 0;
}
#define AMX_ITEM_TAKES(nq, g) 0
#define AMX_DEC_MIN_KEYS 0
#define amx_item_bf16 item_bf16
#endif

#endif
