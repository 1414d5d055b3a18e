"""Which replica serves a request: prefix and tenant affinity while load allows, else power
of two choices on live load. Pure functions over load snapshots (no Ray, no I/O), so every
decision is testable as a table.

    key = tenant + the prompt's first `prefix_chars` characters (or `prefix_tokens` ids)
    preferred = the live replica with the highest hash(key, replica id)   (rendezvous hashing)
    preferred.load - least.load <= max_imbalance  and
    (preferred.kv_usage < kv_busy  or
     preferred.kv_usage - least.kv_usage <= max_kv_imbalance)  -> preferred   ("affinity")
    otherwise two live replicas at random, the less loaded one            ("balance")

`precise` routes on what each replica holds (control/fleet/kv_index.py, fed by its KV
events), weighed against load: each live replica costs the prompt blocks it would have to
compute plus `load_blocks` per request it carries, and the cheapest wins when it holds any
of the prompt, within the same bounds ("precise"). So a prompt goes where its blocks are
until that replica carries more than (blocks saved / load_blocks) requests over another,
and then a second replica takes it and soon holds it too (a hot prefix replicates, as
llm-d's scorer trades its prefix and load scores). A prompt nobody holds, or whose holders
cost more than an idle replica, goes by affinity as above.

Rendezvous hashing is consistent: a replica that leaves moves only the keys it was preferred
for, and one that comes back gets the same keys again, so its prefix cache stays useful.
Every ingress computes the same preference with no shared state (ray.serve.llm's prefix-aware
router instead keeps a prefix tree of what each replica was sent, in one shared actor).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MODES = ("affinity", "precise", "pow2", "random")


class NoReplicaAvailable(Exception):
    """Every replica is down or failing its health polls."""


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as the router sees it: polled stats plus the ingress's own count."""

    replica_id: int
    healthy: bool = True  # answered its last stats poll, and no call to it has failed since
    waiting: int = 0  # queued in its engine (polled)
    running: int = 0  # running in its engine (polled)
    inflight: int = 0  # sent by this ingress and not yet answered (live, no poll lag)
    kv_usage: float = 0.0  # KV blocks held by requests / all blocks, 0..1 (polled)

    @property
    def load(self) -> int:
        """Requests on the replica: the poll's count, or ours when the poll is behind."""
        return max(self.inflight, self.waiting + self.running)


@dataclass(frozen=True)
class RoutingPolicy:
    # affinity | precise (the replica holding most of the prompt's blocks: kv_index.py) |
    # pow2 | random (the last two: baselines)
    mode: str = "affinity"
    max_imbalance: int = 4  # requests the preferred replica may carry over the least loaded
    max_kv_imbalance: float = 0.25  # KV usage it may carry over the least used, once it
    kv_busy: float = 0.5  # uses this share of its KV: below it a replica has room enough
    prefix_chars: int = 256  # prompt text hashed for affinity (~ the first 4 blocks of 16)
    prefix_tokens: int = 64  # prompt token ids hashed, for prompts sent as ids
    key_by_tenant: bool = True  # tenants with the same prefix may go to different replicas
    # precise: what one more request on a replica is worth, in prompt blocks (of 16
    # tokens) computed: the queue against the prefill a cached prefix saves
    load_blocks: float = 2.0

    def validate(self) -> RoutingPolicy:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {MODES}")
        if self.max_imbalance < 0:
            raise ValueError(f"max_imbalance={self.max_imbalance} must be >= 0")
        if not 0.0 <= self.max_kv_imbalance <= 1.0:
            raise ValueError(f"max_kv_imbalance={self.max_kv_imbalance} must be in 0..1")
        if not 0.0 <= self.kv_busy <= 1.0:
            raise ValueError(f"kv_busy={self.kv_busy} must be in 0..1")
        if not 0.0 <= self.load_blocks < float("inf"):
            raise ValueError(f"load_blocks={self.load_blocks} must be a number >= 0")
        if self.prefix_chars < 1 or self.prefix_tokens < 1:
            raise ValueError(f"prefix_chars={self.prefix_chars} and prefix_tokens="
                             f"{self.prefix_tokens} must be >= 1")
        return self


@dataclass(frozen=True)
class Decision:
    replica_id: int
    # precise (the holder cheapest in blocks to compute and load) | affinity | balance
    # (the preferred one too loaded, or no key) | random | only
    reason: str
    matched_blocks: int = 0  # precise: leading prompt blocks the chosen replica holds


def prompt_prefix(body: dict[str, Any], policy: RoutingPolicy) -> str | None:
    """The part of an OpenAI request body that affinity hashes; None when it has no prompt.
    Chat: the messages' roles and contents in order (the system prompt comes first)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt[: policy.prefix_chars]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return "ids:" + ",".join(map(str, prompt[: policy.prefix_tokens]))
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        text = "".join(f"{m.get('role', '')}:{_content(m.get('content'))}\n"
                       for m in messages if isinstance(m, dict))
        return text[: policy.prefix_chars]
    return None


def _content(content: Any) -> str:
    if isinstance(content, list):  # parts: [{"type": "text", "text": ...}]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def affinity_key(prefix: str | None, tenant: str, cache_salt: str | None,
                 policy: RoutingPolicy) -> bytes | None:
    if prefix is None:
        return None
    tenant_part = tenant if policy.key_by_tenant else ""
    return f"{tenant_part}\x00{cache_salt or ''}\x00{prefix}".encode()


def rendezvous_score(key: bytes, replica_id: int) -> int:
    digest = hashlib.blake2b(key + b"\x00" + str(replica_id).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def preferred(key: bytes, loads: Sequence[ReplicaLoad]) -> ReplicaLoad:
    return max(loads, key=lambda r: rendezvous_score(key, r.replica_id))


def choose(key: bytes | None, loads: Sequence[ReplicaLoad], policy: RoutingPolicy,
           rng: random.Random, matched: dict[int, int] | None = None) -> Decision:
    """The replica for one request. Raises NoReplicaAvailable when none is healthy.
    `matched` (precise): replica id -> leading blocks of the prompt it holds. A prompt no
    replica holds any of is placed by affinity, so a new prefix's requests gather."""
    live = [r for r in loads if r.healthy]
    if not live:
        raise NoReplicaAvailable("no replica is healthy (all down or restarting)")
    if len(live) == 1:
        return Decision(live[0].replica_id, "only")
    if policy.mode == "random":
        return Decision(rng.choice(live).replica_id, "random")
    if policy.mode == "precise" and matched and max(matched.values()) > 0:
        return _cheapest(key, live, policy, matched, rng)
    if policy.mode in ("affinity", "precise") and key is not None:
        best = preferred(key, live)
        if _within(best, live, policy):
            return Decision(best.replica_id, "affinity")
    return _balance(live, rng)


def _cheapest(key: bytes | None, live: Sequence[ReplicaLoad], policy: RoutingPolicy,
              matched: dict[int, int], rng: random.Random) -> Decision:
    """Precise: the first replica within the bounds in order of cost (blocks to compute +
    load_blocks per request carried; the prompt's length is the same everywhere, so minus
    the blocks held stands for the blocks to compute), then load, then the prefix's
    rendezvous hash, so spill-overs (and a restarted replica's refill) gather in one
    place instead of scattering."""
    def order(r: ReplicaLoad) -> tuple[float, int, float, int]:
        rank = -rendezvous_score(key, r.replica_id) if key is not None else 0
        cost = policy.load_blocks * r.load - matched.get(r.replica_id, 0)
        return (cost, r.load, r.kv_usage, rank)

    for best in sorted(live, key=order):
        if _within(best, live, policy):
            held = matched.get(best.replica_id, 0)
            if held:
                return Decision(best.replica_id, "precise", held)
            hashed = key is not None and best is preferred(key, live)
            return Decision(best.replica_id, "affinity" if hashed else "balance")
    return _balance(live, rng)


def _within(best: ReplicaLoad, live: Sequence[ReplicaLoad], policy: RoutingPolicy) -> bool:
    """`best` carries no more than the policy's imbalance over the least loaded. KV usage
    counts only above `kv_busy`: a few long prompts gathered where their prefix is cached
    raise one replica's usage well over another's with no block short, and turning them
    away there would scatter the very requests whose blocks it holds."""
    kv_ok = (best.kv_usage < policy.kv_busy
             or best.kv_usage - min(r.kv_usage for r in live) <= policy.max_kv_imbalance)
    return best.load - min(r.load for r in live) <= policy.max_imbalance and kv_ok


def _balance(live: Sequence[ReplicaLoad], rng: random.Random) -> Decision:
    """Power of two choices: two live replicas at random, the less loaded."""
    first, second = rng.sample(live, 2)
    pick = min((first, second), key=lambda r: (r.load, r.kv_usage))
    return Decision(pick.replica_id, "balance")
