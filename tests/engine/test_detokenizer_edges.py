"""The detokenizer at its edges (engine/output/detokenizer.py): how much text a stop string
holds back, which of several stop strings ends the text, tokens after a stop, and special
tokens kept when asked. Text is fed one character a token (each ASCII character is one
token of the byte-level tokenizer), so what is held back is exact."""

from __future__ import annotations

import pytest
from fixtures.tiny_models import build_tokenizer

from engine.output.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _char_ids(tokenizer, text: str) -> list[int]:
    ids = [tokenizer.encode(c, add_special_tokens=False) for c in text]
    assert all(len(one) == 1 for one in ids)
    return [one[0] for one in ids]


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    deltas = []
    for token in ids:
        detok.add_tokens([token])
        deltas.append(detok.take_delta(final=False))
    return deltas


def test_no_start_of_a_stop_string_is_streamed(tokenizer):
    """Stop "brown": the last 4 characters wait; "brow" shows nothing of it, "brown" cuts."""
    detok = IncrementalDetokenizer(tokenizer, [], stop=("brown",))
    deltas = _stream(detok, _char_ids(tokenizer, "say brown"))
    assert "".join(deltas[:8]) == "say "  # through "say brow": its "brow" held back
    assert detok.stopped_on == "brown"
    assert "".join(deltas) + detok.take_delta(final=True) == "say "


def test_the_earliest_stop_string_in_the_text_wins(tokenizer):
    """Both complete with the same token; the text stops before the one that starts first,
    whatever the order the client listed them in."""
    detok = IncrementalDetokenizer(tokenizer, [], stop=("over", "game over"))
    streamed = "".join(_stream(detok, _char_ids(tokenizer, "the game over")))
    assert detok.stopped_on == "game over"
    assert streamed + detok.take_delta(final=True) == "the " == detok.text


def test_tokens_after_a_stop_add_no_text(tokenizer):
    """A step may sample past the stop string (several tokens at once): they add nothing."""
    detok = IncrementalDetokenizer(tokenizer, [], stop=("brown",))
    detok.add_tokens(_char_ids(tokenizer, "the brown fox jumps"))
    assert (detok.text, detok.stopped_on) == ("the ", "brown")
    detok.add_tokens(_char_ids(tokenizer, " more"))
    assert detok.take_delta(final=True) == "the "


def test_skip_special_tokens_false_shows_them(tokenizer):
    eos = tokenizer.eos_token_id
    ids = _char_ids(tokenizer, "hi") + [eos] + _char_ids(tokenizer, "yo")
    shown = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    shown.add_tokens(ids)
    assert shown.take_delta(final=True) == "hi" + tokenizer.eos_token + "yo"
    hidden = IncrementalDetokenizer(tokenizer, [])
    hidden.add_tokens(ids)
    assert hidden.take_delta(final=True) == "hiyo"
