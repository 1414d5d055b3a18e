"""Malformed requests for hostile_traffic's poison phase, sent over raw sockets (an HTTP client
would refuse most of them: bench/raw_http.py), and what each may be answered.

Each kind is a list of `Poison` requests, built once (the big bodies too) and cycled:

    token_ids       out-of-range ids in every id field: stop_token_ids, logit_bias keys
                    (negative, huge, 2**63, non-ASCII digits "²" "٣"), prompt ids, /detokenize
    wrong_types     a string where a number goes, a list for a string, NaN, Infinity, null
    extreme_floats  valid-typed sampling values at the edges (5e-324, 1e308): accepted or 400
    huge            a body 2 MiB over max_body_bytes (Content-Length, and chunked): 413;
                    megabyte strings under the limit (prompt, stop, user): 400
    long_lists      thousands of stop strings, logit_bias entries, stop ids, messages
    generated       n x max_tokens far past the limit; max_tokens 2**63
    user            `user` outside Latin-1 ("用户"), control characters, CR LF (an injected
                    header must not reach the answer), lone surrogates
    headers         X-Tenant / X-Lane / X-Priority / X-Deadline-Ms with control characters,
                    UTF-8 and Latin-1 bytes, 10k characters, "²"
    json            malformed: truncated, trailing bytes, not an object, invalid UTF-8
    nesting         100k-deep arrays and objects, in the body and inside fields
    content_type    text/plain, form, multipart, none, UTF-16, a gzip claim
    schemas         invalid response_format / guided_json schemas, and strange valid ones

Expected: 4xx (413 for a body over the limit); `ACCEPTABLE` marks the strange but valid
requests the server may serve instead (each asks for 1 token). Never a 5xx, never a hang.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bench import raw_http
from control.api.limits import RequestLimits

CLIENT_ERROR = frozenset(range(400, 500))
TOO_LARGE = frozenset({413})
ACCEPTABLE = CLIENT_ERROR | {200}  # strange but valid: served (1 token) or refused
BODY_LIMIT = RequestLimits().max_body_bytes  # the server runs with the default limits
OVER_LIMIT = BODY_LIMIT + 2 * 1024 * 1024
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
BASE = {"prompt": "Poison", "max_tokens": 1}  # a valid body the cases spoil one field of


@dataclass(frozen=True)
class Poison:
    kind: str
    name: str  # what is wrong with it, short, for the report
    body: bytes
    path: str = COMPLETIONS
    headers: tuple[tuple[bytes, bytes], ...] = ()
    content_type: bytes | None = b"application/json"
    expect: frozenset[int] = CLIENT_ERROR
    chunked: bool = False  # Transfer-Encoding: chunked, no Content-Length


def _field(kind: str, name: str, raw: str, *, path: str = COMPLETIONS,
           expect: frozenset[int] = CLIENT_ERROR, base: dict | None = None,
           label: str = "") -> Poison:
    """BASE (or `base`) with one more key, `raw` being its JSON text as sent (NaN, 1e999 and
    lone surrogates are not what json.dumps writes)."""
    head = json.dumps(base if base is not None else BASE)[:-1]
    return Poison(kind, label or f"{name}={raw[:40]}", f'{head}, "{name}": {raw}}}'.encode(),
                  path, expect=expect)


def _chat(raw_messages: str, name: str, kind: str) -> Poison:
    return Poison(kind, name, f'{{"max_tokens": 1, "messages": {raw_messages}}}'.encode(), CHAT)


def token_ids() -> list[Poison]:
    k, ids = "token_ids", ["-1", "512000", str(2**31), str(2**63), str(2**64), "1e30", "1.5"]
    cases = [_field(k, "stop_token_ids", f"[{i}]") for i in ids]
    keys = ["-1", "²", "٣", "１", str(2**63), "9" * 40, "1e3", " ", "", "0x10"]
    cases += [_field(k, "logit_bias", json.dumps({key: 1.0}, ensure_ascii=False))
              for key in keys]
    cases += [_field(k, "logit_bias", json.dumps({key: 1.0}), path=CHAT,
                     base={"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
              for key in keys[:3]]
    cases += [Poison(k, f"prompt=[{i}]", f'{{"prompt": [{i}], "max_tokens": 1}}'.encode())
              for i in ids]
    cases += [Poison(k, f"prompt=[[{i}]]", f'{{"prompt": [[{i}]], "max_tokens": 1}}'.encode())
              for i in ids[:4]]
    cases += [Poison(k, f"detokenize [{i}]", f'{{"tokens": [{i}]}}'.encode(), "/detokenize")
              for i in ids]
    return cases


def wrong_types() -> list[Poison]:
    bad = ['"ten"', "[1]", '{"a": 1}', "NaN", "Infinity", "-Infinity", "1e999"]
    fields = ["max_tokens", "temperature", "top_p", "top_k", "seed", "n", "logprobs",
              "priority", "min_tokens", "repetition_penalty", "presence_penalty"]
    cases = [_field("wrong_types", f, v) for f in fields for v in bad]
    for name, values in {"prompt": ["null", "5", '{"a": 1}', "[1.5]", "[null]", '[["a"]]'],
                         "stop": ["5", '[1]', '{"a": 1}', '[""]'],
                         "stop_token_ids": ['"1"', '[[1]]', '{"a": 1}'],
                         "stream": ['"maybe"', "[]"], "stream_options": ["3", '"on"'],
                         "logit_bias": ["[]", '{"1": "big"}', '{"1": NaN}', '{"1": 1e999}'],
                         "user": ["5", "[]"], "cache_salt": ["5", '""'],
                         "response_format": ['"json"', "[]", '{"type": 5}']}.items():
        cases += [_field("wrong_types", name, v) for v in values]
    cases += [_chat(m, f"messages={m[:30]}", "wrong_types") for m in
              ['"hi"', "[]", "[5]", '[{"role": "wizard", "content": "x"}]',
               '[{"role": "user", "content": 5}]', '[{"role": "user", "content": [5]}]']]
    return cases


def extreme_floats() -> list[Poison]:
    k, tiny, big = "extreme_floats", "5e-324", "1e308"
    bodies = [{"repetition_penalty": tiny, "top_k": 2}, {"repetition_penalty": tiny},
              {"repetition_penalty": big}, {"temperature": tiny}, {"top_p": tiny},
              {"top_p": tiny, "top_k": 1}, {"min_p": 1, "temperature": 2},
              {"presence_penalty": 2, "frequency_penalty": -2, "repetition_penalty": tiny},
              {"logit_bias": '{"1": 100, "2": -100}', "temperature": tiny}]
    return [Poison(k, ",".join(f"{f}={v}" for f, v in b.items()),
                   ('{"prompt": "Poison poison poison", "max_tokens": 2, '
                    + ", ".join(f'"{f}": {v}' for f, v in b.items()) + "}").encode(),
                   expect=ACCEPTABLE) for b in bodies]


def huge() -> list[Poison]:
    over = json.dumps({"prompt": "a" * OVER_LIMIT, "max_tokens": 1}).encode()
    under = BODY_LIMIT // 4  # characters, well inside the body limit
    return [Poison("huge", f"body of {len(over)} bytes", over, expect=TOO_LARGE),
            Poison("huge", f"chunked body of {len(over)} bytes", over, expect=TOO_LARGE,
                   chunked=True),
            Poison("huge", f"body of {len(over)} bytes to /tokenize", over, "/tokenize",
                   expect=TOO_LARGE),
            _field("huge", "prompt", json.dumps("b" * under)),
            Poison("huge", f"/tokenize a prompt of {under} characters",
                   json.dumps({"prompt": "b" * under}).encode(), "/tokenize"),
            _field("huge", "stop", json.dumps(["s" * under])),
            _field("huge", "user", json.dumps("u" * under)),
            _field("huge", "cache_salt", json.dumps("c" * under))]


def long_lists() -> list[Poison]:
    k = "long_lists"
    return [_field(k, "stop", json.dumps([f"s{i}" for i in range(5000)])),
            _field(k, "logit_bias", json.dumps({str(i % 500): 1.0 for i in range(5000)})),
            _field(k, "logit_bias", json.dumps({str(i): 1.0 for i in range(5000)})),
            _field(k, "stop_token_ids", json.dumps([1] * 100_000)),
            _field(k, "stop_token_ids", json.dumps(list(range(100_000)))),
            Poison(k, "prompt of 400k ids", json.dumps({"prompt": [1] * 400_000,
                                                        "max_tokens": 1}).encode()),
            _chat(json.dumps([{"role": "user", "content": "x"}] * 20_000), "20k messages", k)]


def generated() -> list[Poison]:
    k = "generated"
    cases = [(16, 2**31), (16, 65_536), (1, 2**63), (1, 10**30), (10**9, 1), (2**63, 1)]
    return [Poison(k, f"n={n} max_tokens={m}",
                   json.dumps({"prompt": "x", "n": n, "max_tokens": m}).encode())
            for n, m in cases] + [
        _field(k, "min_tokens", str(10**9)),
        _field(k, "max_completion_tokens", str(2**62), path=CHAT,
               base={"messages": [{"role": "user", "content": "x"}]})]


def user_names() -> list[Poison]:
    ok = [r'"用户"', r'"\u202eevil"', r'"\ud83d\ude00"', r'"José"']
    bad = [r'"a\u0000b"', r'"a\u0007b"', r'"a\r\nX-Injected: 1"', r'"\ud800"', r'"\udfff x"']
    return ([_field("user", "user", v, expect=ACCEPTABLE) for v in ok]
            + [_field("user", "user", v, expect=ACCEPTABLE) for v in bad]
            + [_field("user", "user", v, expect=ACCEPTABLE,
                      base={**BASE, "stream": True}) for v in ok + bad])


def header_values() -> list[Poison]:
    body = json.dumps(BASE).encode()
    values = {b"\x01ab": CLIENT_ERROR, b"a\x7fb": CLIENT_ERROR, b"\x00": CLIENT_ERROR,
              "用户".encode(): ACCEPTABLE, "José".encode("latin-1"): ACCEPTABLE,
              b"a" * 10_000: CLIENT_ERROR, b"\t": ACCEPTABLE}
    cases = [Poison("headers", f"{name.decode()}: {value[:12]!r}", body,
                    headers=((name, value),), expect=expect)
             for name in (b"X-Tenant", b"X-Lane") for value, expect in values.items()]
    numbers = [b"\xc2\xb2", "٣".encode(), b"1e3", b"9" * 40, b"NaN", b"0x10"]
    cases += [Poison("headers", f"{name.decode()}: {value!r}", body, headers=((name, value),))
              for name in (b"X-Priority", b"X-Deadline-Ms", b"X-Request-Timeout-Ms")
              for value in numbers]
    return cases


def malformed_json() -> list[Poison]:
    k = "json"
    bodies = {"truncated": b'{"prompt": "x",', "trailing bytes": b'{"prompt": "x"} }}',
              "empty": b"", "null": b"null", "array": b"[]", "string": b'"x"', "number": b"1",
              "invalid UTF-8": b'{"prompt": "\xc3\x28", "max_tokens": 1}',
              "UTF-16 BOM": b"\xff\xfe{", "single quotes": b"{'prompt': 'x'}",
              "NaN top": b"NaN", "lone backslash": b'{"prompt": "\\"}',
              "bad escape": b'{"prompt": "\\x41"}', "comment": b'{"prompt": "x" /* c */}'}
    cases = [Poison(k, name, body) for name, body in bodies.items()]
    cases.append(Poison(k, "UTF-8 BOM", b'\xef\xbb\xbf{"prompt": "x", "max_tokens": 1}',
                        expect=ACCEPTABLE))
    cases.append(Poison(k, "duplicate keys", b'{"prompt": "x", "prompt": 5, "max_tokens": 1}',
                        expect=ACCEPTABLE))
    return cases


def nesting() -> list[Poison]:
    k, deep = "nesting", 100_000
    return [Poison(k, "100k-deep arrays", b"[" * deep + b"]" * deep),
            Poison(k, "100k-deep objects", b'{"a":' * deep + b"1" + b"}" * deep),
            _field(k, "prompt", "[" * deep + "]" * deep),
            _field(k, "logit_bias", '{"1": ' + "[" * deep + "]" * deep + "}"),
            _field(k, "response_format", '{"type": "json_schema", "json_schema": {"name": "x", '
                   '"schema": ' + '{"items": ' * 5000 + "{}" + "}" * 5000 + "}}",
                   expect=ACCEPTABLE),
            _field(k, "stream_options", '{"include_usage": ' + "[" * deep + "]" * deep + "}")]


def content_types() -> list[Poison]:
    k, body = "content_type", json.dumps(BASE).encode()
    boundary = b"----poison"
    multipart = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n'
                 b"x\r\n--" + boundary + b"--\r\n")
    return [Poison(k, "text/plain", body, content_type=b"text/plain"),
            Poison(k, "form", b"prompt=x&max_tokens=1",
                   content_type=b"application/x-www-form-urlencoded"),
            Poison(k, "multipart", multipart,
                   content_type=b"multipart/form-data; boundary=" + boundary),
            Poison(k, "multipart, no boundary", multipart, content_type=b"multipart/form-data"),
            Poison(k, "no content type", body, content_type=None, expect=ACCEPTABLE),
            Poison(k, "UTF-16 JSON", json.dumps(BASE).encode("utf-16"),
                   content_type=b"application/json; charset=utf-16", expect=ACCEPTABLE),
            Poison(k, "gzip claim", body, headers=((b"Content-Encoding", b"gzip"),),
                   expect=ACCEPTABLE),
            Poison(k, "xml", b"<prompt>x</prompt>", content_type=b"application/xml")]


def schemas() -> list[Poison]:
    def schema(raw: str, expect: frozenset[int] = CLIENT_ERROR) -> Poison:
        return _field("schemas", "response_format", '{"type": "json_schema", "json_schema": '
                      f'{{"name": "x", "schema": {raw}}}}}', expect=expect,
                      label=f"response_format schema {raw[:50]}")

    formats = ['{"type": "json_schema"}', '{"type": "json_schema", "json_schema": 5}',
               '{"type": "nope"}']
    return ([_field("schemas", "response_format", f) for f in formats]
            + [_field("schemas", "response_format", '{"type": "json_object"}', expect=ACCEPTABLE)]
            + [schema(s) for s in ["5", '{"type": "frobnicate"}', '{"$ref": "#/nowhere"}',
                                   '{"type": "string", "pattern": "["}',
                                   '{"enum": [' + ", ".join(map(str, range(50_000))) + "]}"]]
            + [schema(s, ACCEPTABLE) for s in [
                '{"$ref": "#"}', '{"type": "string", "pattern": "(a+)+$"}',
                '{"type": "string", "minLength": 1000000000}',
                '{"type": "array", "minItems": 1000000000}',
                '{"type": "integer", "minimum": 1e308, "maximum": -1e308}', '{"enum": []}']]
            + [_field("schemas", "guided_json", g) for g in ['"not json"', '"{"', "5"]])


KINDS = (token_ids, wrong_types, extreme_floats, huge, long_lists, generated, user_names,
         header_values, malformed_json, nesting, content_types, schemas)


# The control stream: ordinary traffic sent the same way (a raw socket, a connection each)
# at the poison's rate, so that what the poison costs can be told from what any traffic
# costs; a tokenization does the HTTP, JSON and tokenizer-thread work a refusal does.
BENIGN = "benign"


def benign() -> list[Poison]:
    return [Poison(BENIGN, "tokenize 'hi'", b'{"prompt": "hi"}', path="/tokenize",
                   expect=frozenset({200}))]


def all_poison(kinds: tuple[str, ...] = ()) -> dict[str, list[Poison]]:
    """kind -> its requests (the bodies built now: the big ones take a moment); only
    `kinds` when given (BENIGN: the control stream, never among the poison)."""
    if kinds == (BENIGN,):
        return {BENIGN: benign()}
    built = {cases[0].kind: cases for cases in (make() for make in KINDS)}
    return {kind: cases for kind, cases in built.items() if not kinds or kind in kinds}


def _request_head(poison: Poison, host: str, tenant: bytes) -> bytes:
    lines = [b"POST " + poison.path.encode() + b" HTTP/1.1", b"Host: " + host.encode(),
             b"Connection: close"]
    if poison.content_type is not None:
        lines.append(b"Content-Type: " + poison.content_type)
    lines.append(b"Transfer-Encoding: chunked" if poison.chunked
                 else b"Content-Length: " + str(len(poison.body)).encode())
    names = {name.lower() for name, _ in poison.headers}
    if b"x-tenant" not in names:
        lines.append(b"X-Tenant: " + tenant)
    lines += [name + b": " + value for name, value in poison.headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def send(poison: Poison, host: str, port: int, tenant: bytes, timeout_s: float
               ) -> tuple[int | str, bytes]:
    """Send one poison request on its own connection -> (status, the answer's first bytes);
    see bench/raw_http.py."""
    return await raw_http.send(host, port, _request_head(poison, host, tenant), poison.body,
                               chunked=poison.chunked, timeout_s=timeout_s)
