"""The logits processors (engine/execution/logits_processors.py) against transformers' own
processors where one exists (repetition penalty, min_p, min new tokens) and OpenAI's formula
where not (presence and frequency penalties, logit_bias); batched rows against row-by-row;
greedy rows affected; nothing built and nothing changed when no row uses them."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
)

from engine.execution.logits_processors import ProcessorTensors, apply_processors
from engine.execution.sampler import SamplingTensors, filter_logits, sample
from engine.request import Request, SamplingParams

VOCAB = 50
EOS = 7
PROMPT = [3, 4, 4, 9, 12]
OUTPUT = [12, 20, 20, 20, 31]


def make_request(prompt=PROMPT, output=OUTPUT, **params) -> Request:
    req = Request("r", list(prompt), SamplingParams(**params), arrival_time=0.0,
                  eos_token_id=EOS)
    req.token_ids.extend(output)
    return req


def processed(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    procs = ProcessorTensors.from_requests(requests, VOCAB, logits.device)
    assert procs is not None
    return apply_processors(logits, procs)


def logits_for(rows: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=gen) * 3


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_is_transformers(penalty):
    req = make_request(repetition_penalty=penalty)
    logits = logits_for(1)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(
        torch.tensor([req.token_ids]), logits.clone())
    assert torch.equal(processed(logits, [req]), expected)


@pytest.mark.parametrize(("temperature", "min_p"), [(1.0, 0.1), (0.7, 0.05), (1.5, 0.5)])
def test_min_p_is_transformers(temperature, min_p):
    req = make_request(temperature=temperature, min_p=min_p)
    logits = logits_for(1, seed=1)
    ours = filter_logits(logits, SamplingTensors.from_params([req.sampling_params], VOCAB,
                                                             logits.device))
    ids = torch.tensor([req.token_ids])
    ref = MinPLogitsWarper(min_p)(ids, TemperatureLogitsWarper(temperature)(ids, logits))
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    assert 0 < int(torch.isinf(ours).sum()) < VOCAB  # the case filters something
    torch.testing.assert_close(ours[~torch.isinf(ours)], ref[~torch.isinf(ref)])


def test_min_p_of_one_keeps_the_top_token_and_samples_it():
    """min_p = 1 drops every token less likely than the top one, never the top one itself:
    a sampled row then always gets the argmax (ties at the top all stay)."""
    logits = logits_for(1, seed=2)
    logits[0, [5, 17]] = logits.max() + 1.0  # a two-way tie at the top
    params = SamplingParams(temperature=1.0, min_p=1.0)
    ours = filter_logits(logits, SamplingTensors.from_params([params], VOCAB, logits.device))
    assert torch.isfinite(ours[0]).nonzero()[:, 0].tolist() == [5, 17]
    picked = {sample(logits, [make_request(temperature=1.0, min_p=1.0, seed=s)])[0]
              for s in range(12)}
    assert picked == {5, 17}


@pytest.mark.parametrize("min_tokens", [3, 5, 6, 9])
def test_min_tokens_is_transformers(min_tokens):
    """EOS is masked while fewer than min_tokens were generated (5 so far), as transformers
    masks it; past that, the logits are untouched."""
    req = make_request(min_tokens=min_tokens, max_tokens=16)
    logits = logits_for(1, seed=2)
    expected = MinNewTokensLengthLogitsProcessor(len(PROMPT), min_tokens, EOS)(
        torch.tensor([req.token_ids]), logits.clone())
    assert torch.equal(processed(logits, [req]), expected)
    assert bool(torch.isinf(expected[0, EOS])) == (len(OUTPUT) < min_tokens)


def test_min_tokens_masks_stop_token_ids_unless_eos_is_ignored():
    req = make_request(min_tokens=8, stop_token_ids=(11, 40), ignore_eos=True)
    out = processed(logits_for(1), [req])
    assert torch.isinf(out[0, [11, 40]]).all()
    assert not torch.isinf(out[0, EOS])  # ignore_eos: EOS is an ordinary token


@pytest.mark.parametrize(("presence", "frequency"), [(0.5, 0.0), (0.0, 0.7), (-1.2, 1.9)])
def test_presence_and_frequency_penalties_are_openais_formula(presence, frequency):
    """OpenAI: logit -= count * frequency + (count > 0) * presence, over the output only."""
    req = make_request(presence_penalty=presence, frequency_penalty=frequency)
    logits = logits_for(1, seed=3)
    expected = logits.clone()
    for token in set(OUTPUT):
        count = OUTPUT.count(token)
        expected[0, token] -= count * frequency + presence
    torch.testing.assert_close(processed(logits, [req]), expected, rtol=0, atol=1e-6)
    untouched = [t for t in range(VOCAB) if t not in OUTPUT]
    assert torch.equal(processed(logits, [req])[0, untouched], logits[0, untouched])


def test_logit_bias_adds_to_the_logits():
    req = make_request(logit_bias={5: 100.0, 6: -100.0, 12: 2.5})
    logits = logits_for(1, seed=4)
    expected = logits.clone()
    expected[0, 5] += 100.0
    expected[0, 6] -= 100.0
    expected[0, 12] += 2.5
    assert torch.equal(processed(logits, [req]), expected)


MIXED = [  # each processor alone, all together, and a row that uses none
    dict(repetition_penalty=1.4),
    dict(presence_penalty=0.8, frequency_penalty=0.3),
    dict(logit_bias={1: 5.0, 2: -3.0}),
    dict(min_tokens=10, max_tokens=20),
    dict(),
    dict(repetition_penalty=0.8, presence_penalty=-0.5, frequency_penalty=1.0,
         logit_bias={EOS: 4.0, 30: 1.5}, min_tokens=6, max_tokens=8),
]


def mixed_requests() -> list[Request]:
    outputs = [OUTPUT, [1, 1, 2], [], OUTPUT[:2], [44], OUTPUT]
    return [make_request(output=out, **params) for out, params in zip(outputs, MIXED,
                                                                        strict=True)]


def test_a_batch_of_mixed_rows_equals_each_row_alone():
    requests = mixed_requests()
    logits = logits_for(len(requests), seed=5)
    batched = processed(logits, requests)
    for i, req in enumerate(requests):
        alone = ProcessorTensors.from_requests([req], VOCAB, logits.device)
        row = logits[i:i + 1] if alone is None else apply_processors(logits[i:i + 1], alone)
        assert torch.equal(batched[i:i + 1], row), MIXED[i]
    assert torch.equal(batched[4], logits[4])  # the row without processors: bit-identical


def test_nothing_is_built_or_changed_when_no_row_uses_a_processor():
    requests = [make_request(temperature=0.0), make_request(temperature=0.9, top_p=0.8,
                                                            top_k=5, min_p=0.2, seed=3)]
    assert ProcessorTensors.from_requests(requests, VOCAB, torch.device("cpu")) is None
    neutral = SamplingParams(presence_penalty=0.0, frequency_penalty=0.0,
                             repetition_penalty=1.0, logit_bias={}, min_tokens=0)
    assert not neutral.uses_processors


def test_greedy_rows_follow_the_processed_logits():
    logits = logits_for(3, seed=6)
    logits[:, EOS] = 50.0  # EOS is every row's argmax
    requests = [make_request(temperature=0.0),
                make_request(temperature=0.0, min_tokens=9, max_tokens=10),
                make_request(temperature=0.0, logit_bias={42: 100.0})]
    tokens = sample(logits, requests)
    assert tokens[0] == EOS
    assert tokens[1] == int(torch.argmax(torch.cat([logits[1, :EOS], torch.tensor([-1e9]),
                                                    logits[1, EOS + 1:]])))
    assert tokens[2] == 42
    # repetition: the prompt's repeated argmax loses its place under a strong penalty
    row = logits_for(1, seed=7)
    row[0, 4] = row.max() + 0.1  # token 4 is in the prompt
    assert sample(row, [make_request(temperature=0.0)]) == [4]
    assert sample(row, [make_request(temperature=0.0, repetition_penalty=50.0)]) != [4]


def test_a_seeded_penalized_request_samples_the_same_whatever_shares_its_batch():
    def alone(seed: int) -> list[int]:
        req = make_request(temperature=1.0, seed=seed, presence_penalty=1.5,
                           repetition_penalty=1.3, logit_bias={3: 2.0}, min_p=0.05)
        return [sample(logits_for(1, seed=step), [req])[0] for step in range(6)]

    def in_batch(seed: int) -> list[int]:
        others = mixed_requests()
        req = make_request(temperature=1.0, seed=seed, presence_penalty=1.5,
                           repetition_penalty=1.3, logit_bias={3: 2.0}, min_p=0.05)
        picked = []
        for step in range(6):
            logits = torch.cat([logits_for(len(others), seed=100 + step)[:2],
                                logits_for(1, seed=step),
                                logits_for(len(others), seed=200 + step)[2:]])
            picked.append(sample(logits, others[:2] + [req] + others[2:])[2])
        return picked

    assert alone(11) == in_batch(11)


@pytest.mark.parametrize(("params", "field"), [
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3.0), "frequency_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(logit_bias={3: 101.0}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens"),
])
def test_bad_values_are_refused_naming_the_field(params, field):
    with pytest.raises(ValueError, match=f"^{field}="):
        SamplingParams(**params)


def test_a_token_id_equal_to_the_vocabulary_size_is_outside_it():
    params = SamplingParams(stop_token_ids=[VOCAB - 1, VOCAB], logit_bias={VOCAB: 1.0, 0: 2.0})
    assert params.token_ids_outside(VOCAB) == {"stop_token_ids": [VOCAB], "logit_bias": [VOCAB]}
    inside = SamplingParams(stop_token_ids=[VOCAB - 1], logit_bias={VOCAB - 1: 1.0})
    assert inside.token_ids_outside(VOCAB) == {}


def test_offline_llm_refuses_logit_bias_outside_the_vocabulary(tiny_loaded):
    from engine import LLM

    llm = LLM(tiny_loaded, num_kv_blocks=64)
    vocab = tiny_loaded.hf_config.vocab_size
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, logit_bias={vocab + 3: 5.0}),
                     use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, vocab, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, logit_bias={3: 5.0}),
                       use_tqdm=False)
    assert len(out[0].token_ids) == 2  # still usable after the refusals
