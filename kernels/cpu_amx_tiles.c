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

/* GGUF Q4_1 rows [N][K / 32 blocks of 20 bytes] -> the Q4_1 tiles; -1 on bad sizes */
int bp_q4_tile_pack(const uint8_t *blocks, int64_t N, int64_t K, uint8_t *out) {
    if (N % 16 != 0 || K % 32 != 0 || N <= 0 || K <= 0) return -1;
    const int64_t row_bytes = K / 32 * 20, kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb) {
            uint8_t *tile = out + (nb * kbs + kb) * Q4_TILE_BYTES;
            for (int n = 0; n < 16; ++n) {
                const uint8_t *b = blocks + (nb * 16 + n) * row_bytes + kb * 20;
                memcpy(tile + 2 * n, b, 2);       /* d */
                memcpy(tile + 32 + 2 * n, b + 2, 2); /* m */
                for (int p = 0; p < 16; ++p) {
                    const int k0 = 2 * p, k1 = 2 * p + 1; /* weight j < 16: low nibble of b[4+j] */
                    const int q0 = k0 < 16 ? b[4 + k0] & 15 : b[4 + k0 - 16] >> 4;
                    const int q1 = k1 < 16 ? b[4 + k1] & 15 : b[4 + k1 - 16] >> 4;
                    tile[64 + p * 16 + n] = (uint8_t)(q0 | q1 << 4);
                }
            }
        }
    return 0;
}

/* The float32 weights of a Q4_1-tiled matrix, [N][K] (tests) */
int bp_q4_tile_unpack(const uint8_t *tiles, int64_t N, int64_t K, float *out) {
    if (N % 16 != 0 || K % 32 != 0) return -1;
    const int64_t kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb) {
            const uint8_t *tile = tiles + (nb * kbs + kb) * Q4_TILE_BYTES;
            for (int n = 0; n < 16; ++n) {
                const float d = half_to_f32(tile + 2 * n), m = half_to_f32(tile + 32 + 2 * n);
                for (int p = 0; p < 16; ++p) {
                    const uint8_t q = tile[64 + p * 16 + n];
                    float *row = out + (nb * 16 + n) * K + kb * 32;
                    row[2 * p] = d * (float)(q & 15) + m;
                    row[2 * p + 1] = d * (float)(q >> 4) + m;
                }
            }
        }
    return 0;
}

/* GGUF Q8_0 rows [N][K / 32 blocks of 34 bytes] -> the Q8_0 tiles; -1 on bad sizes */
int bp_q8_tile_pack(const uint8_t *blocks, int64_t N, int64_t K, uint8_t *out) {
    if (N % 16 != 0 || K % 32 != 0 || N <= 0 || K <= 0) return -1;
    const int64_t row_bytes = K / 32 * 34, kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb) {
            uint8_t *tile = out + (nb * kbs + kb) * Q8_TILE_BYTES;
            for (int n = 0; n < 16; ++n) {
                const uint8_t *b = blocks + (nb * 16 + n) * row_bytes + kb * 34;
                memcpy(tile + 2 * n, b, 2); /* d */
                for (int p = 0; p < 16; ++p) {
                    tile[32 + p * 32 + 2 * n] = b[2 + 2 * p];
                    tile[32 + p * 32 + 2 * n + 1] = b[2 + 2 * p + 1];
                }
            }
        }
    return 0;
}

/* The float32 weights of a Q8_0-tiled matrix, [N][K] (tests) */
int bp_q8_tile_unpack(const uint8_t *tiles, int64_t N, int64_t K, float *out) {
    if (N % 16 != 0 || K % 32 != 0) return -1;
    const int64_t kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb) {
            const uint8_t *tile = tiles + (nb * kbs + kb) * Q8_TILE_BYTES;
            for (int n = 0; n < 16; ++n) {
                const float d = half_to_f32(tile + 2 * n);
                float *row = out + (nb * 16 + n) * K + kb * 32;
                for (int p = 0; p < 16; ++p)
                    for (int c = 0; c < 2; ++c)
                        row[2 * p + c] = d * (float)(int8_t)tile[32 + p * 32 + 2 * n + c];
            }
        }
    return 0;
}
