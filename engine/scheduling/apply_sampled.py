"""Update, the third part of a step: apply the executor's sampled tokens to the requests.

Each scheduled request's `num_computed_tokens` grows by the tokens it ran; full blocks are
registered in the prefix cache; one sampled token is appended per sample row (every
decode, then every prefill chunk that reached its request's last token); a request that
samples a stop token or reaches max_tokens / max_model_len ends, its blocks freed. When the
executor returned logprobs (`SampledTokens`), each asking row's entry is appended to its
request's `logprobs`, and each prefill chunk's prompt entries to its `prompt_logprobs`.
"""

from __future__ import annotations

from engine.errors import SchedulerInvariantError
from engine.logprobs import SampledTokens
from engine.records import SchedulerOutput
from engine.request import Request, RequestStatus
from engine.scheduling.state import SchedulerState


def apply_sampled(state: SchedulerState, out: SchedulerOutput, sampled_token_ids: list[int],
                  now: float) -> tuple[list[Request], list[Request]]:
    """Advance each scheduled request; append sampled tokens; end those that stop.

    `sampled_token_ids` has one id per sample row (decodes, then sampled prefills).
    Returns the requests of the sample rows, in row order, and those that finished.
    """
    bm = state.block_manager
    block_size = bm.block_size
    finished: list[Request] = []
    rows = list(out.decodes)
    for chunk in out.prefills:
        req = chunk.request
        req.num_computed_tokens += chunk.num_tokens
        if req.num_computed_tokens // block_size > len(req.block_hashes):
            bm.cache_full_blocks(req)
        if chunk.sample:
            rows.append(req)
            req.prefill_done_time = now
            if req.first_token_time is None:
                req.first_token_time = now
                if state.is_static(req.lane):
                    state.lanes[req.lane].batch_closed = True
    if len(sampled_token_ids) != len(rows):
        raise SchedulerInvariantError(
            f"step {out.step_id}: {len(sampled_token_ids)} sampled tokens for {len(rows)}"
            f" sample rows ({len(out.decodes)} decodes, then sampled prefill chunks)")
    for req, token_id in zip(out.decodes, sampled_token_ids, strict=False):  # hot path
        req.num_computed_tokens += 1
        if req.num_computed_tokens % block_size == 0:  # a block just became full
            bm.cache_full_blocks(req)
        tokens = req.token_ids
        tokens.append(token_id)
        req.token_times.append(now)
        if token_id in req.stop_token_ids or len(tokens) >= req.max_num_tokens:
            state.finish(req, _stop_status(req, token_id), now)
            finished.append(req)
    for req, token_id in zip(rows[len(out.decodes):], sampled_token_ids[len(out.decodes):],
                             strict=True):
        req.token_ids.append(token_id)
        req.token_times.append(now)
        if token_id in req.stop_token_ids or len(req.token_ids) >= req.max_num_tokens:
            state.finish(req, _stop_status(req, token_id), now)
            finished.append(req)
        else:  # prompt (or recompute) done: from now on one token a step
            state.lanes[req.lane].add_decoding(req)
    if isinstance(sampled_token_ids, SampledTokens):
        _apply_logprobs(out, rows, sampled_token_ids)
    return rows, finished


def _apply_logprobs(out: SchedulerOutput, rows: list[Request], sampled: SampledTokens,
                    ) -> None:
    """Keep what the requests asked for: the sample rows' entries (row order), and the
    prompt entries of this step's prefill chunks (position order, after those before)."""
    if sampled.logprobs is not None:
        for req, entry in zip(rows, sampled.logprobs, strict=True):
            if entry is not None:
                req.logprobs.append(entry)
    if sampled.prompt_logprobs:
        for chunk in out.prefills:
            entries = sampled.prompt_logprobs.get(chunk.request.request_id)
            if entries:
                chunk.request.prompt_logprobs.extend(entries)


def _stop_status(req: Request, token_id: int) -> RequestStatus:
    """A request's end after its last token: a stop token (EOS too) is STOPPED, else
    LENGTH (max_tokens or max_model_len)."""
    return RequestStatus.STOPPED if token_id in req.stop_token_ids else RequestStatus.LENGTH
