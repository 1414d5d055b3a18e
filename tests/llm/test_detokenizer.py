"""Incremental text equals the whole decode, across multi-byte characters and stops."""

from __future__ import annotations

import pytest
from fixtures.tiny_models import build_tokenizer

from engine.output.detokenizer import IncrementalDetokenizer, backend_decoder

TEXTS = ["héllo wörld", "emoji 👋 in the middle 🚀!", "日本語のテキスト", "plain ascii text"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_deltas_add_up_to_the_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Say:", add_special_tokens=False))
    deltas = []
    for token in ids:
        detok.add_tokens([token])
        deltas.append(detok.take_delta(final=False))
    deltas.append(detok.take_delta(final=True))
    assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_held_back_then_cut(tokenizer):
    ids = tokenizer.encode("the quick brown fox jumps", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], stop=("brown",))
    streamed = ""
    for token in ids:
        detok.add_tokens([token])
        streamed += detok.take_delta(final=False)
        assert "brow" not in streamed  # a stop string's start is never shown early
    streamed += detok.take_delta(final=True)
    assert detok.stopped_on == "brown"
    assert streamed == "the quick "


def test_an_output_ending_inside_a_character_still_shows_its_bytes(tokenizer):
    """A length limit can cut a multi-byte character: the final delta carries what is left
    (as U+FFFD, as the whole decode shows it) instead of dropping those tokens' text."""
    ids = tokenizer.encode("ok 🚀", add_special_tokens=False)
    cut = next(n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tokenizer, [])
    streamed = ""
    for token in ids[:cut]:
        detok.add_tokens([token])
        streamed += detok.take_delta(final=False)
    assert "\ufffd" not in streamed  # held back while the character may still complete
    streamed += detok.take_delta(final=True)
    assert streamed == tokenizer.decode(ids[:cut]) and streamed.endswith("\ufffd")
    assert detok.text == streamed


@pytest.mark.parametrize("skip", [True, False])
def test_the_backend_decode_is_the_tokenizers_decode(tokenizer, skip):
    """The window goes to the Rust tokenizer directly (backend_decoder): the same text as
    tokenizer.decode for any ids, special tokens among them."""
    import random

    fast = backend_decoder(tokenizer)
    assert fast is not None  # the tests' tokenizer is a stock fast one, cleanup off
    rng = random.Random(3)
    specials = list(tokenizer.all_special_ids)
    assert specials
    for _ in range(200):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 12))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        assert fast(ids, skip_special_tokens=skip) == tokenizer.decode(
            ids, skip_special_tokens=skip)


def test_tokenizers_whose_decode_differs_keep_it(tokenizer, monkeypatch):
    class Overriding(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):
            return "x" * len(token_ids)

    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    assert backend_decoder(tokenizer) is None  # its cleanup runs in Python
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", False)
    monkeypatch.setattr(tokenizer, "__class__", Overriding)
    assert backend_decoder(tokenizer) is None
    detok = IncrementalDetokenizer(tokenizer, [])
    detok.add_tokens([5, 6])
    assert detok.text == "xx"  # its own decode, not the backend's
    assert backend_decoder(object()) is None
