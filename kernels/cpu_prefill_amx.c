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
   Limits: d 64 or 128, nh % kvh == 0, AMX granted (else -1, nothing written).

   The body (both passes, the items) is cpu_prefill_tiles.h, shared with cpu_prefill_bf16.c,
   which runs it on AVX-512-BF16 where a CPU has that and no AMX. */

#include <stdint.h>

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#include <immintrin.h>

/* The compiler does not order plain loads and stores around the tile intrinsics: a tile
   load can read a buffer before the stores that filled it (see cpu_amx_q4.c). */
#define AMX_MEMORY_FENCE() __asm__ __volatile__("" : : : "memory")

int bp_q4_amx_ready(void); /* cpu_amx_q4.c: AMX granted; its palette, all tiles 16 x 64 B */
void bp_q4_amx_begin(void);
void bp_q4_amx_end(void);

#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILES_FENCE() AMX_MEMORY_FENCE()
#define TILES_BEGIN() bp_q4_amx_begin()
#define TILES_END() bp_q4_amx_end()
#define TILES_COSTLIEST_FIRST 0
#define TILES_TWO_PASS_D64 1

#include "cpu_prefill_tiles.h" /* prefill_tiled */

#define AMX_BUILD 1
#else
#define AMX_BUILD 0
#endif

#define PREFILL_ENTRY bp_prefill_attention_amx
#define PREFILL_BUILT AMX_BUILD
#define PREFILL_READY() bp_q4_amx_ready()
#include "cpu_prefill_entry.h"
