/* GGUF blocks re-laid as AMX B tiles (read by cpu_amx_q4.c; packed once at load by
   kernels/cpu_amx_q4.py). N % 16 == 0, K % 32 == 0: tile (nb, kb) covers weight rows
   16 nb .. 16 nb + 15 and columns 32 kb .. 32 kb + 31, tiles in order nb-major, so that
   B-tile row p (columns 2p, 2p + 1 of the 16 weight rows, as pairs) decodes from 16 or 32
   bytes with vector ops.

   Q4_1, 320 B a tile:
     fp16 d[16], fp16 m[16]   the block scale and minimum of each of the 16 rows
     uint8 q[16][16]          q[p][n] = row n's weights 2p (low nibble), 2p + 1 (high)
   Q8_0, 544 B a tile:
     fp16 d[16]               the block scale of each of the 16 rows
     int8 q[16][16][2]        q[p][n][c] = row n's weight 2p + c */

#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h" /* half_to_f32 */

#define Q4_TILE_BYTES 320
#define Q8_TILE_BYTES 544

/* Row n of one tile from its GGUF block b (Q4_1: 20 bytes, Q8_0: 34) */
static void pack_row_q4(uint8_t *tile, int n, const uint8_t *b) {
    memcpy(tile + 2 * n, b, 2);          /* d */
    memcpy(tile + 32 + 2 * n, b + 2, 2); /* m */
    for (int p = 0; p < 16; ++p) {
        const int k0 = 2 * p, k1 = 2 * p + 1; /* weight j < 16: low nibble of b[4 + j] */
        const int q0 = k0 < 16 ? b[4 + k0] & 15 : b[4 + k0 - 16] >> 4;
        const int q1 = k1 < 16 ? b[4 + k1] & 15 : b[4 + k1 - 16] >> 4;
        tile[64 + p * 16 + n] = (uint8_t)(q0 | q1 << 4);
    }
}

static void pack_row_q8(uint8_t *tile, int n, const uint8_t *b) {
    memcpy(tile + 2 * n, b, 2); /* d */
    for (int p = 0; p < 16; ++p) {
        tile[32 + p * 32 + 2 * n] = b[2 + 2 * p];
        tile[32 + p * 32 + 2 * n + 1] = b[3 + 2 * p];
    }
}

/* Row n's 32 float32 weights of one tile, as gguf-py decodes them */
static void unpack_row_q4(const uint8_t *tile, int n, float *row) {
    const float d = half_to_f32(tile + 2 * n), m = half_to_f32(tile + 32 + 2 * n);
    for (int p = 0; p < 16; ++p) {
        const uint8_t q = tile[64 + p * 16 + n];
        row[2 * p] = d * (float)(q & 15) + m;
        row[2 * p + 1] = d * (float)(q >> 4) + m;
    }
}

static void unpack_row_q8(const uint8_t *tile, int n, float *row) {
    const float d = half_to_f32(tile + 2 * n);
    for (int k = 0; k < 32; ++k) row[k] = d * (float)(int8_t)tile[32 + k / 2 * 32 + 2 * n + k % 2];
}

/* rows [N][K / 32 blocks of block_bytes] -> tiles of tile_bytes; -1 on bad sizes */
static int pack(const uint8_t *blocks, int64_t N, int64_t K, uint8_t *out, int64_t block_bytes,
                int64_t tile_bytes, void (*pack_row)(uint8_t *, int, const uint8_t *)) {
    if (N % 16 != 0 || K % 32 != 0 || N <= 0 || K <= 0) return -1;
    const int64_t row_bytes = K / 32 * block_bytes, kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb)
            for (int n = 0; n < 16; ++n)
                pack_row(out + (nb * kbs + kb) * tile_bytes, n,
                         blocks + (nb * 16 + n) * row_bytes + kb * block_bytes);
    return 0;
}

/* The float32 weights [N][K] of a tiled matrix (tests) */
static int unpack(const uint8_t *tiles, int64_t N, int64_t K, float *out, int64_t tile_bytes,
                  void (*unpack_row)(const uint8_t *, int, float *)) {
    if (N % 16 != 0 || K % 32 != 0) return -1;
    const int64_t kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb)
            for (int n = 0; n < 16; ++n)
                unpack_row(tiles + (nb * kbs + kb) * tile_bytes, n,
                           out + (nb * 16 + n) * K + kb * 32);
    return 0;
}

int bp_q4_tile_pack(const uint8_t *blocks, int64_t N, int64_t K, uint8_t *out) {
    return pack(blocks, N, K, out, 20, Q4_TILE_BYTES, pack_row_q4);
}

int bp_q8_tile_pack(const uint8_t *blocks, int64_t N, int64_t K, uint8_t *out) {
    return pack(blocks, N, K, out, 34, Q8_TILE_BYTES, pack_row_q8);
}

int bp_q4_tile_unpack(const uint8_t *tiles, int64_t N, int64_t K, float *out) {
    return unpack(tiles, N, K, out, Q4_TILE_BYTES, unpack_row_q4);
}

int bp_q8_tile_unpack(const uint8_t *tiles, int64_t N, int64_t K, float *out) {
    return unpack(tiles, N, K, out, Q8_TILE_BYTES, unpack_row_q8);
}
