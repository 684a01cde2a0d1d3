"""Request bodies of the admin API: strict (unknown fields, wrong types and non-finite
numbers are 422)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

KindName = Literal["fact", "preference", "constraint", "error", "goal", "note"]
# At least one character that no engine (Python, ECMA, Rust regex) counts as whitespace.
VISIBLE = r"[^\s\x1c-\x1f\x85]"


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer includes 5.0; strict pydantic would refuse it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSONInt = Annotated[int, BeforeValidator(_whole_number)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RememberBody(Strict):
    # Past 8,000 characters the content is stored as several memories (parts of one source).
    content: str = Field(min_length=1, max_length=200_000, pattern=VISIBLE)
    kind: KindName = "fact"
    subject: str | None = Field(default=None, max_length=128)
    attribute: str | None = Field(default=None, max_length=128)
    value: str | None = Field(default=None, max_length=500)
    confidence: float = Field(default=0.9, ge=0, le=1)
    expires_at: float | None = Field(default=None, ge=0)
    observed_at: float | None = Field(
        default=None, ge=0, description="When it was said (unix time); recall favours the latest."
    )


class RecallBody(Strict):
    query: str = Field(max_length=100_000)
    top_k: JSONInt = Field(default=10, ge=1, le=100)
    kinds: list[KindName] | None = Field(default=None, max_length=6)
    min_similarity: float = Field(default=-1.0, ge=-1, le=1)


class ForgetBody(Strict):
    query: str = Field(min_length=1, max_length=10_000, pattern=VISIBLE)
    dry_run: bool = True
    top_k: JSONInt = Field(default=10, ge=1, le=100)
    min_similarity: float = Field(
        default=0.5, ge=-1, le=1, description="Only memories at least this close are forgotten."
    )
