"""Mutants for the Triton kernels (kernels/triton_*.py) and the torch reference they are checked
against (kernels/reference.py) (pass of 2026-12-08: before it no module but the reference had a
planted bug): masks off by one, the online softmax and the split-K combine, GQA head mapping,
strides of q and v views, the KV write's slots, the split and tile heuristics, the input
checks; each has a test that fails on it (the kernels run in Triton's interpreter on CPU)."""

from __future__ import annotations

from mutant_spec import KRN, Mutant

DECODE = "kernels/triton_decode.py"
PREFILL = "kernels/triton_prefill.py"
TILE = "kernels/triton_tile.py"
LAUNCH = "kernels/triton_launch.py"
KV_WRITE = "kernels/triton_kv_write.py"
ATTENTION = "kernels/triton_attention.py"
REFERENCE = "kernels/reference.py"
TRITON_T = KRN + "test_triton.py"
EDGES_T = KRN + "test_triton_edges.py"
REF_T = KRN + "test_reference.py"
MIXED_T = TRITON_T + "::test_mixed_batch_matches_reference"
SPLIT_T = TRITON_T + "::test_decode_split_k_on_and_off"
PURE_T = TRITON_T + "::test_pure_decode_and_pure_prefill_batches"
ODD_T = TRITON_T + "::test_odd_shapes"
HEURISTIC_T = TRITON_T + "::test_heuristic_splits_few_long_sequences_only"
VIEWS_T = EDGES_T + "::test_q_views_match_reference"
OWN_ROWS_T = EDGES_T + "::test_decode_and_prefill_write_only_their_own_rows"

TRITON_MUTANTS: list[Mutant] = [
    # ---- the decode kernel and its split-K reduce (kernels/triton_decode.py) --------------
    Mutant("tri-decode-reads-key-past-context", DECODE,
           "        n_valid = n < hi\n", "        n_valid = n <= hi\n", (SPLIT_T,),
           "each decode also attends to the key one past its context (a padding slot or another"
           " sequence's block): wrong next tokens"),
    Mutant("tri-decode-gqa-interleaved", DECODE,
           "heads = kv_head * GROUP + g  # [G]",
           "heads = kv_head + g * (num_heads // GROUP)  # [G]", (SPLIT_T,),
           "with GQA, query head h reads KV head h % num_kv_heads, not h // group: decodes of"
           " Llama-3-style models attend with another head's keys"),
    Mutant("tri-decode-scale-without-log2e", DECODE,
           "out, part_out, part_lse, scale * LOG2_E,", "out, part_out, part_lse, scale,",
           (SPLIT_T,),
           "decode scores go through exp2 scaled as for exp: every decode's softmax is flatter"
           " (temperature 1 / ln 2) than the prefill's"),
    Mutant("tri-split-lse-natural-log", DECODE,
           "m_i + tl.log2(l_safe)", "m_i + tl.log(l_safe)", (SPLIT_T,),
           "split-K partials carry a log-sum-exp in mixed bases: long-context decodes with few"
           " sequences weight their splits wrongly"),
    Mutant("tri-split-empty-divides-by-zero", DECODE,
           "l_safe = tl.where(has_keys, l_i, 1.0)", "l_safe = l_i", (SPLIT_T,),
           "a split past a shorter sequence's context divides 0 by 0: NaN outputs for every"
           " shorter sequence of a split-K batch"),
    Mutant("tri-reduce-padding-splits-weighted", DECODE,
           'mask=j < num_splits, other=float("-inf"))', "mask=j < num_splits, other=0.0)",
           (SPLIT_T,),
           "the padding splits of a split count that is not a power of two enter the reduce's"
           " normaliser: decode outputs shrink toward zero"),
    Mutant("tri-decode-writes-prefill-rows", DECODE,
           "if tl.load(query_start_loc_ptr + seq + 1) - row != 1:  # not a decode",
           "if tl.load(query_start_loc_ptr + seq + 1) - row < 1:  # not a decode", (OWN_ROWS_T,),
           "the decode kernel also writes each prefill chunk's first row, attending over the"
           " whole context (future tokens included); only launch order hides it"),
    Mutant("tri-decode-q-read-with-out-strides", DECODE,
           "q.stride(0), q.stride(1), out.stride(0), out.stride(1),",
           "out.stride(0), out.stride(1), out.stride(0), out.stride(1),", (VIEWS_T,),
           "a q that is a view of the fused qkv projection is read at out's row stride: each"
           " decode after the first attends with another token's query"),
    Mutant("tri-decode-out-float32", DECODE,
           "        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)",
           "        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)", (SPLIT_T,),
           "decode_attention returns float32 for a 16-bit model: the next layer's matmul gets"
           " mixed dtypes"),
    Mutant("tri-splits-ignore-min-split", DECODE,
           "min(wanted, max_context_len // MIN_TOKENS_PER_SPLIT, MAX_SPLITS)",
           "min(wanted, MAX_SPLITS)", (HEURISTIC_T,),
           "a 600-token decode is cut into 33 splits of ~20 keys: the reduce costs more than it"
           " saves"),
    Mutant("tri-splits-when-device-full", DECODE,
           "programs >= num_sms or", "programs > num_sms or",
           (EDGES_T + "::test_split_heuristic_at_its_boundaries",),
           "a batch whose programs exactly fill the SMs still splits: each step pays a reduce"
           " launch for nothing"),
    # ---- the prefill kernel (kernels/triton_prefill.py) ----------------------------------
    Mutant("tri-prefill-causal-strict", PREFILL,
           "visible = (n[None, :] <= pos[:, None])", "visible = (n[None, :] < pos[:, None])",
           (MIXED_T,),
           "prompt tokens do not attend to themselves: wrong prefill outputs, NaN for a"
           " prompt's first token"),
    Mutant("tri-prefill-unmasked-phase-uses-last-row", PREFILL,
           "full_end = (ctx - q_len + first_row // GROUP + 1)",
           "full_end = (ctx - q_len + last_token + 1)", (MIXED_T,),
           "the unmasked key phase runs up to the tile's last row: early rows of a chunk see"
           " later tokens of it"),
    Mutant("tri-prefill-gqa-interleaved", PREFILL,
           "heads = kv_head * GROUP + r % GROUP  # [M]",
           "heads = kv_head + r % GROUP * tl.num_programs(1)  # [M]", (MIXED_T,),
           "with GQA, a prompt's query head h reads KV head h % num_kv_heads, not h // group"),
    Mutant("tri-prefill-find-sequence-strict", PREFILL,
           "* GROUP // BLOCK_M + mid <= tile", "* GROUP // BLOCK_M + mid < tile", (MIXED_T,),
           "a sequence's first tile is taken for the previous sequence's spare one: its first"
           " rows are never written (uninitialised output)"),
    Mutant("tri-prefill-chunk-positions-from-zero", PREFILL,
           "pos = ctx - q_len + t  # [M]", "pos = t  # [M]", (MIXED_T,),
           "a chunk after a cached prefix is masked as if it started at position 0: chunked"
           " prefill tokens miss most of the prefix"),
    Mutant("tri-prefill-q-read-with-out-strides", PREFILL,
           "q.stride(0), q.stride(1), out.stride(0), out.stride(1),",
           "out.stride(0), out.stride(1), out.stride(0), out.stride(1),", (VIEWS_T,),
           "a q that is a view of the fused qkv projection is read at out's row stride: prompt"
           " tokens attend with other tokens' queries"),
    Mutant("tri-prefill-computes-decodes", PREFILL,
           "MIN_QUERY_LEN=2 if skip_decodes else 1,", "MIN_QUERY_LEN=1,", (OWN_ROWS_T,),
           "every decode of a mixed step is computed again in the prefill kernel's 16+-row"
           " tiles (up to 32x the work) and overwrites the decode kernel's split-K result"),
    Mutant("tri-prefill-tiles-never-shrink", PREFILL,
           "    block_m = min(block_m, pow2_at_least(rows))\n", "",
           (EDGES_T + "::test_prefill_tiles_shrink_to_the_longest_chunk",),
           "a step of short chunks runs 128-row tiles: up to 8x the tensor-core work for its"
           " rows"),
    # ---- the shared tile and online softmax (kernels/triton_tile.py) ---------------------
    Mutant("tri-tile-block-table-ignored", TILE,
           "block = tl.load(table_row_ptr + n // BLOCK_SIZE, mask=n_valid, other=0).to(tl.int64)",
           "block = (n // BLOCK_SIZE).to(tl.int64)", (PURE_T,),
           "position n is read from block n // block_size of the cache, not the sequence's own:"
           " every sequence attends to whatever blocks 0, 1, ... hold"),
    Mutant("tri-tile-kv-head-offset-dropped", TILE,
           "(n % BLOCK_SIZE) * stride_token + head_offset", "(n % BLOCK_SIZE) * stride_token",
           (ODD_T,), "every KV head reads KV head 0's keys and values"),
    Mutant("tri-tile-dim-mask-off-by-one", TILE,
           "mask = row_mask[:, None] & (dims[None, :] < HEAD_DIM)",
           "mask = row_mask[:, None] & (dims[None, :] <= HEAD_DIM)", (ODD_T,),
           "a head_dim that is not a power of two (80) also reads the next head's first lane"
           " into q and k: wrong scores"),
    Mutant("tri-softmax-sum-not-rescaled", TILE,
           "l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i + tl.sum(p, 1)", (SPLIT_T,),
           "the softmax denominator keeps earlier tiles at their old max: contexts past one KV"
           " step come out scaled down"),
    Mutant("tri-softmax-acc-not-rescaled", TILE,
           "acc=acc * alpha[:, None]", "acc=acc", (SPLIT_T,),
           "earlier tiles' weighted values are not rescaled when the max rises: contexts past"
           " one KV step over-weight their first keys"),
    Mutant("tri-softmax-max-not-running", TILE,
           "m_new = tl.maximum(m_i, tl.max(s, 1))", "m_new = tl.max(s, 1)", (MIXED_T,),
           "the running max is the newest tile's alone: a prompt row whose last tile is all"
           " future keys gets max -inf and a NaN output"),
    Mutant("tri-softmax-masked-score-zero", TILE,
           's = tl.where(visible, s, float("-inf"))', "s = tl.where(visible, s, 0.0)",
           (MIXED_T,),
           "masked keys (future tokens, padding) get score 0, not -inf: prompts attend to the"
           " future"),
    # ---- launch facts and input checks (kernels/triton_launch.py) ------------------------
    Mutant("tri-fp32-dots-in-tf32", LAUNCH,
           'return "ieee" if dtype == torch.float32 or dot_in_fp32(dtype, kernel) else "tf32"',
           'return "ieee" if dot_in_fp32(dtype, kernel) else "tf32"',
           (EDGES_T + "::test_float32_dots_stay_ieee",),
           "on a GPU, float32 attention multiplies in TF32 (10-bit mantissa): fp32 outputs"
           " drift ~1e-3 from the reference"),
    Mutant("tri-gqa-ratio-unchecked", LAUNCH,
           "    if num_heads % num_kv_heads != 0:", "    if num_heads < num_kv_heads:",
           (EDGES_T + "::test_heads_not_a_multiple_of_kv_heads_are_refused",),
           "6 query heads over 4 KV heads launch with group 1: two heads' outputs are"
           " uninitialised memory, no error"),
    Mutant("tri-q-stride-not-made-unit", LAUNCH,
           "return q if q.stride(2) == 1 else q.contiguous()", "return q", (VIEWS_T,),
           "a q whose head_dim is not its innermost stride is read as if it were: wrong"
           " attention"),
    # ---- the KV write (kernels/triton_kv_write.py) ---------------------------------------
    Mutant("tri-kv-write-skips-slot-zero", KV_WRITE,
           "if slot < 0:  # padding token", "if slot <= 0:  # padding token",
           (TRITON_T + "::test_write_kv_matches_reference",),
           "the token at slot 0 (block 0, offset 0) is never stored: it is attended as garbage"),
    Mutant("tri-kv-write-v-with-k-strides", KV_WRITE,
           "k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),",
           "k.stride(0), k.stride(1), k.stride(2), k.stride(0), k.stride(1), k.stride(2),",
           (EDGES_T + "::test_write_kv_odd_head_count_and_v_layout",),
           "a v laid out unlike k is read with k's strides: the cache stores scrambled values"),
    Mutant("tri-kv-write-heads-unmasked", KV_WRITE,
           "mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)", "mask = dims < HEAD_DIM",
           (EDGES_T + "::test_write_kv_odd_head_count_and_v_layout",),
           "with 3 KV heads (padded to 4) each write also stores a fourth head over the next"
           " slot's head 0: another token's keys are overwritten"),
    # ---- the backend's dispatch (kernels/triton_attention.py) ----------------------------
    Mutant("tri-mixed-batch-decodes-never-launched", ATTENTION,
           "if max_query_len == 1 or q.shape[0] < context_lens.shape[0] * max_query_len:",
           "if max_query_len == 1:", (PURE_T,),
           "in a step mixing decodes and prefill chunks the decode rows are never computed:"
           " uninitialised output for every running request"),
    # ---- the torch reference, the oracle (kernels/reference.py) --------------------------
    Mutant("tri-reference-causal-mask-from-zero", REFERENCE,
           "q_pos = torch.arange(context_len - q_len, context_len, device=device)",
           "q_pos = torch.arange(q_len, device=device)",
           (REF_T + "::test_causal_mask_puts_the_chunk_at_the_end_of_its_context",),
           "the oracle masks a chunk after a cached prefix as if it started at position 0:"
           " the reference backend's chunked prefill misses the prefix"),
    Mutant("tri-reference-dense-gqa-tiled", REFERENCE,
           "kf = k.float().repeat_interleave(group, dim=1)", "kf = k.float().repeat(1, group, 1)",
           (REF_T + "::test_mixed_batch_matches_dense",),
           "the dense oracle maps query head h to KV head h % kvh: GQA tests compare against"
           " the wrong attention"),
    Mutant("tri-reference-decode-last-partial-block", REFERENCE,
           "owned = -(-context_lens.long() // block_size)",
           "owned = context_lens.long() // block_size",
           (REF_T + "::test_decodes_of_similar_lengths_batched_match_dense",),
           "batched decodes read block 0 in place of their last, partly filled block: wrong"
           " keys for most decodes"),
]
