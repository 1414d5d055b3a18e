"""Request shapes every route shares: the base that rules on a body's undeclared fields,
and the chat message (the chat completion route's and /tokenize's).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    PrivateAttr,
    field_validator,
    model_validator,
)

from control.api.field_policy import check_undeclared, log_ignored


class WarnsUndeclared(BaseModel):
    """A request body, or an object in one, whose undeclared fields field_policy.py rules
    on: refused (UNIMPLEMENTED), else ignored with a warning naming them by their path
    (`_field_path`: where the object sits in the body, "" at the top)."""

    # strict: "4", true or 4.0 for an int, "yes" or 1 for a bool are 400s naming the field,
    # as OpenAI's API answers them, not values guessed (an int is still a float's value)
    model_config = ConfigDict(extra="ignore", strict=True)
    _field_path: ClassVar[str] = ""
    _is_body: ClassVar[bool] = False  # a whole request: logs what it and its parts ignored
    _ignored: list[str] = PrivateAttr(default_factory=list)  # as the answer names them

    @model_validator(mode="wrap")
    @classmethod
    def _undeclared_fields(cls, data: Any, handler: ModelWrapValidatorHandler) -> Any:
        ignored = check_undeclared(cls.model_fields, data, cls._field_path)
        model = handler(data)
        if not isinstance(data, dict):  # an instance validated again keeps its own list
            return model
        model._ignored = ignored
        if cls._is_body:  # the body: one line for it and its parts
            log_ignored(cls.__name__, model.ignored_fields)
        return model



class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(WarnsUndeclared):
    _field_path: ClassVar[str] = "messages[]."

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        # an image or audio part would otherwise be a 400 listing why it is neither a
        # string nor a text part; say what it is instead
        for i, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise ValueError(f"part {i} is of type {kind[:40]!r}: this server serves a"
                                 " text-only model, so content is a string or text parts"
                                 " ({'type': 'text', 'text': ...})")
        return content

    @model_validator(mode="after")
    def _content_unless_assistant(self) -> ChatMessage:
        # OpenAI's rule: only an assistant's message (one that called tools) may have none
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (a string or text parts)")
        return self

    def as_template_dict(self) -> dict[str, str]:
        if isinstance(self.content, list):
            text = "".join(part.text for part in self.content)
        else:
            text = self.content or ""
        return {"role": self.role, "content": text}
