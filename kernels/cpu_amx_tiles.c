/* GGUF blocks re-laid as AMX B tiles (read by cpu_amx_q4.c; packed once at load by
   kernels/cpu_amx_q4.py). N % 16 == 0, K % 32 == 0: tile (nb, kb) covers weight rows
   16 nb .. 16 nb + 15 and columns 32 kb .. 32 kb + 31, tiles in order nb-major, so that
   B-tile row p (columns 2p, 2p + 1 of the 16 weight rows, as pairs) decodes from 16 or 32
   bytes with vector ops.

   Q4_1, 320 B a tile:
     fp16 d[16], fp16 m[16]   the block scale and minimum of each of the 16 rows
     uint8 q[16][16]          q[p][2j], q[p][2j + 1] = row j's weights 2p, 2p + 1 in the
                              low nibbles, row j + 8's in the high ones (j < 8): the low
                              nibbles of B-tile row p are rows 0-7's pairs in tile order,
                              the high ones rows 8-15's, so each half converts to bf16 in
                              place (no permute after VCVTNE2PS2BF16)
   Q8_0, 544 B a tile:
     fp16 d[16]               the block scale of each of the 16 rows
     int8 q[16][16][2]        q[p][n][c] = row n's weight 2p + c */

#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h" /* half_to_f32 */

#define Q4_TILE_BYTES 320
#define Q8_TILE_BYTES 544

/* Weight k (0..31) of a Q4_1 block: k < 16 the low nibble of byte 4 + k, else the high
   nibble of byte 4 + k - 16 */
static inline int q4_weight(const uint8_t *b, int k) {
    return k < 16 ? b[4 + k] & 15 : b[4 + k - 16] >> 4;
}

/* Row n of one tile from its GGUF block b (Q4_1: 20 bytes, Q8_0: 34). Q4_1 rows n and
   n + 8 share bytes: each sets its own nibble (rows are packed 0..15, every byte is
   written twice before it is read). */
static void pack_row_q4(uint8_t *tile, int n, const uint8_t *b) {
    memcpy(tile + 2 * n, b, 2);          /* d */
    memcpy(tile + 32 + 2 * n, b + 2, 2); /* m */
    const int shift = n < 8 ? 0 : 4, keep = n < 8 ? 0xF0 : 0x0F;
    for (int p = 0; p < 16; ++p)
        for (int c = 0; c < 2; ++c) {
            uint8_t *byte = tile + 64 + p * 16 + 2 * (n % 8) + c;
            *byte = (uint8_t)((*byte & keep) | q4_weight(b, 2 * p + c) << shift);
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
    const int shift = n < 8 ? 0 : 4;
    for (int p = 0; p < 16; ++p)
        for (int c = 0; c < 2; ++c)
            row[2 * p + c] = d * (float)((tile[64 + p * 16 + 2 * (n % 8) + c] >> shift) & 15) + m;
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
