"""Incremental text equals the whole decode, across multi-byte characters and stops."""

from __future__ import annotations

import pytest
from fixtures.tiny_models import build_tokenizer

from engine.output.detokenizer import IncrementalDetokenizer

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
