"""The ingress's prefix keys (control/fleet/prefix_keys.py) for bodies its replica refuses:
none, so the router places the request as it would without them and the replica answers
the 400 in its own words, never a 500 from the ingress."""

from __future__ import annotations

import pytest

from control.fleet.prefix_keys import RequestKeys

CHAT = "/v1/chat/completions"
BLOCK = 4


class Tokenizer:
    """One token per character; a chat template that, like many models' templates, raises
    on a conversation whose roles do not alternate."""

    chat_template = "{{ messages }}"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        roles = [m["role"] for m in messages]
        if any(a == b for a, b in zip(roles, roles[1:], strict=False)):
            raise RuntimeError("Conversation roles must alternate user/assistant/user/...")
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)


@pytest.fixture
def keys():
    made = RequestKeys(Tokenizer(), b"k" * 32)
    yield lambda path, body: made.keys(path, body, {}, BLOCK, "tenant")
    made.close()


def test_bodies_the_replica_serves_have_their_blocks(keys):
    assert len(keys("/v1/completions", {"prompt": [1] * 17})) == 4
    assert len(keys(CHAT, {"messages": [{"role": "user", "content": "x" * 20}]})) > 0


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": [2**70] * 17}),  # past int64: the hash cannot pack it
    ("/v1/completions", {"prompt": [[2**63] * 17]}),
    (CHAT, {"messages": [{"role": "user", "content": "a" * 20},
                         {"role": "user", "content": "b" * 20}]}),  # the template raises
])
def test_a_body_that_breaks_the_hashing_has_no_keys(keys, path, body):
    assert keys(path, body) == []
