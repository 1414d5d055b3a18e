"""What a request asks its output to be: any JSON object, or JSON following one schema.

`StructuredOutput` is plain data (hashable, compared by kind and schema) until a frontend
binds it to a model (grammar.py), which adds the compiled grammar. The schema is kept as
compact JSON text (no spaces; keys in the client's order, which the output's properties
follow), so requests with the same schema share one compiled grammar however spaced.

Parsed from OpenAI's `response_format` ({"type": "text" | "json_object" | "json_schema"})
and vLLM's `guided_json` (a schema, as an object or JSON text); every message names the
field the client sent, so the server's 400 can name it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

# compact JSON; a bigger schema is refused before compiling (the server passes max_chars=None
# and applies its own limit, max_schema_bytes, which an operator may set: control/api/limits.py)
MAX_SCHEMA_CHARS = 65536
# json_object: any JSON object (OpenAI's JSON mode never yields an array or a scalar)
ANY_OBJECT_SCHEMA = '{"type":"object"}'


@dataclass(frozen=True)
class StructuredOutput:
    """kind: "json_object" or "json_schema"; schema: compact JSON text of the schema
    ("json_object" holds ANY_OBJECT_SCHEMA); name: the client's label (not compared);
    compiled: the grammar for one model's vocabulary, set by GrammarCache.bind (None:
    not bound yet; not compared)."""

    kind: Literal["json_object", "json_schema"]
    schema: str
    name: str = field(default="", compare=False)
    compiled: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def json_object(cls) -> StructuredOutput:
        return cls("json_object", ANY_OBJECT_SCHEMA)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, name: str = "", *,
                    field_name: str = "response_format",
                    max_chars: int | None = MAX_SCHEMA_CHARS) -> StructuredOutput:
        """`schema`: a JSON schema as a dict or as JSON text. Raises ValueError naming
        `field_name` when it is not a JSON object or has more than `max_chars` characters as
        compact JSON (None: any size; the caller bounds it)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{field_name}: the schema is not valid JSON ({exc})") from None
        if not isinstance(schema, dict):
            raise ValueError(f"{field_name}: the schema must be a JSON object, got"
                             f" {type(schema).__name__}")
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        if max_chars is not None and len(text) > max_chars:
            raise ValueError(f"{field_name}: the schema has {len(text)} characters; at most"
                             f" {max_chars} are accepted")
        return cls("json_schema", text, name)

    @classmethod
    def from_openai(cls, value: Any, *, max_chars: int | None = MAX_SCHEMA_CHARS,
                    ) -> StructuredOutput | None:
        """OpenAI's `response_format` -> a spec, or None for {"type": "text"} (no
        constraint). `json_schema` is {"name", "schema", "strict", "description"}: the
        schema is always enforced, so `strict` changes nothing (properties the schema does
        not list are never generated, strict or not)."""
        if not isinstance(value, dict):
            raise ValueError(f"response_format must be an object with a 'type', got {value!r}")
        kind = value.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object()
        if kind != "json_schema":
            raise ValueError(f"response_format.type={kind!r} must be one of 'text',"
                             " 'json_object', 'json_schema'")
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError("response_format.json_schema must be an object with a 'schema'"
                             ' (OpenAI\'s shape: {"name": ..., "schema": {...}, "strict": ...})')
        name = spec.get("name") or ""
        if not isinstance(name, str):
            raise ValueError(f"response_format.json_schema.name={name!r} must be a string")
        return cls.json_schema(spec["schema"], name, max_chars=max_chars)
