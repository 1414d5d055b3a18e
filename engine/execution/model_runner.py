"""The executor over a real model: flatten a step's batch, run one forward, sample.

Batch layout (T tokens from S sequences, concatenated):

    | decode 0 | decode 1 | ... | prefill chunk 0 ........ | prefill chunk 1 .. |
      1 token    1 token          n_0 tokens                 n_1 tokens

Sample rows: every decode, then the last token of each prefill chunk that reaches its
request's last known token. The model runner owns only weights, KV tensors and device
state; which tokens run is the scheduler's decision.

Prompt logprobs (requests with `prompt_logprobs`): the hidden rows of their chunks'
positions whose next token is a prompt token not yet scored go through the LM head too,
in slices of PROMPT_LOGPROB_ROWS rows (a [rows, V] float32 block each), chunk by chunk
as the prefill proceeds. Positions a recompute (after a preemption) runs again are not
scored twice; such requests skip the prefix cache until their prompt is scored
(`Request.needs_prompt_logprobs`).
"""

from __future__ import annotations

import torch

from engine.execution import native_heap
from engine.execution.sampler import sample, score_rows
from engine.logprobs import SampledTokens, TokenLogprob
from engine.models import LoadedModel, allocate_kv_caches, build_attention_metadata, cpu_dtype
from engine.records import PrefillChunk, SchedulerOutput
from engine.request import Request

CPU_KV_CACHE_BYTES = 1 << 30  # KV pool on CPU when not sized explicitly
GPU_MEMORY_UTILIZATION = 0.85  # share of free GPU memory given to the KV pool
PROMPT_LOGPROB_ROWS = 512  # prompt positions scored per LM-head call (bounds [rows, V])


def kv_block_bytes(loaded: LoadedModel, block_size: int, kv_cache_dtype: str) -> int:
    """Bytes of one block over all layers, K and V, in the cache's dtype (the
    kv_cache_dtype option, as ModelRunner allocates it: not always the weights')."""
    model = loaded.model
    dtype = cpu_dtype.kv_cache_dtype(kv_cache_dtype, loaded.dtype, loaded.dtype_plan)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * model.num_layers * block_size * model.num_kv_heads * model.head_dim * itemsize


def auto_num_kv_blocks(loaded: LoadedModel, block_size: int, kv_cache_dtype: str) -> int:
    """Blocks that fit the memory left for the KV pool: free GPU memory, or 1 GiB on CPU."""
    if loaded.device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(loaded.device)
        budget = int(free * GPU_MEMORY_UTILIZATION)
    else:
        budget = CPU_KV_CACHE_BYTES
    return max(1, budget // kv_block_bytes(loaded, block_size, kv_cache_dtype))


class ModelRunner:
    computes_logprobs = True  # the API refuses logprobs for executors without this

    def __init__(self, loaded: LoadedModel, num_kv_blocks: int, block_size: int,
                 kv_cache_dtype: str = "auto"):
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.kv_dtype = cpu_dtype.kv_cache_dtype(kv_cache_dtype, loaded.dtype,
                                                 loaded.dtype_plan)
        if torch.device(self.device).type == "cpu":  # steps' temporaries reuse freed pages
            native_heap.keep_freed_memory()
        self.kv_caches = allocate_kv_caches(
            self.model.num_layers, num_kv_blocks, block_size, self.model.num_kv_heads,
            self.model.head_dim, self.kv_dtype, self.device)

    def execute(self, out: SchedulerOutput) -> SampledTokens:
        """Run the step's batch; one sampled token per sample row, with the logprobs
        (and prompt logprobs) of the requests that ask."""
        input_ids, tables, context_lens, query_lens = [], [], [], []
        rows: list[int] = []  # index in the flat batch of each sample row
        sample_requests: list[Request] = []
        prompt_rows: list[tuple[PrefillChunk, int]] = []  # (chunk, its flat offset)
        for req in out.decodes:
            rows.append(len(input_ids))
            input_ids.append(req.token_ids[req.num_computed_tokens])
            tables.append(req.block_ids)
            context_lens.append(req.num_computed_tokens + 1)
            query_lens.append(1)
            sample_requests.append(req)
        for chunk in out.prefills:
            req, start = chunk.request, chunk.request.num_computed_tokens
            if req.needs_prompt_logprobs:
                prompt_rows.append((chunk, len(input_ids)))
            input_ids.extend(req.token_ids[start:start + chunk.num_tokens])
            tables.append(req.block_ids)
            context_lens.append(start + chunk.num_tokens)
            query_lens.append(chunk.num_tokens)
            if chunk.sample:
                rows.append(len(input_ids) - 1)
                sample_requests.append(req)
        positions, meta = build_attention_metadata(tables, context_lens, query_lens,
                                                   self.block_size, self.device)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            hidden = self.model(ids, positions, self.kv_caches, meta)  # [T, D]
            prompts = self._prompt_logprobs(hidden, prompt_rows) if prompt_rows else {}
            if not rows:
                return SampledTokens([], prompt_logprobs=prompts)
            index = torch.tensor(rows, dtype=torch.int64, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, index))  # [R, V]
            sampled = sample(logits, sample_requests)
            sampled.prompt_logprobs = prompts
            return sampled

    def _prompt_logprobs(self, hidden: torch.Tensor, chunks: list[tuple[PrefillChunk, int]],
                         ) -> dict[str, list[TokenLogprob]]:
        """Score the prompt positions these chunks computed: hidden [T, D], each chunk
        with its offset in the flat batch -> request id -> entries, in position order."""
        flat: list[int] = []  # rows of hidden to score
        targets: list[int] = []  # the prompt token each row is scored for
        top_n: list[int] = []
        owners: list[tuple[str, int]] = []  # (request id, rows) in order
        for chunk, offset in chunks:
            req = chunk.request
            start = req.num_computed_tokens
            first = max(start, len(req.prompt_logprobs))  # position i scores token i + 1
            end = min(start + chunk.num_tokens, req.num_prompt_tokens - 1)
            if end <= first:
                continue
            flat.extend(range(offset + first - start, offset + end - start))
            targets.extend(req.token_ids[first + 1:end + 1])
            top_n.extend([req.sampling_params.prompt_logprobs or 0] * (end - first))
            owners.append((req.request_id, end - first))
        scored: list[TokenLogprob] = []
        for lo in range(0, len(flat), PROMPT_LOGPROB_ROWS):
            hi = lo + PROMPT_LOGPROB_ROWS
            index = torch.tensor(flat[lo:hi], dtype=torch.int64, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, index))  # [rows, V]
            scored += score_rows(logits, torch.tensor(targets[lo:hi], device=self.device),
                                 top_n[lo:hi], rank=True)
        result, at = {}, 0
        for request_id, count in owners:
            result[request_id] = scored[at:at + count]
            at += count
        return result
