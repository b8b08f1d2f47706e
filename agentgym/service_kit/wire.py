"""The wire pieces every agentgym HTTP service shares: the error body (``ErrorBody``) and integer request
fields that take integral floats (``WholeNumber``, ``whole_number``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _integral(value: Any) -> Any:
    # JSON Schema's "integer" is a mathematical integer: 2305.0 is one, true is not. Strict models
    # would refuse the first; this lets it through as 2305 and leaves everything else to them.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer field of a strict request model that also takes integral floats (``2305.0``), not bools.
WholeNumber = Annotated[int, BeforeValidator(_integral)]


def whole_number(**bounds: int) -> Any:
    """``WholeNumber`` with bounds (``ge``, ``gt``, ``le``, ``lt``) that show in the JSON schema.

    The bounds sit on the ``int`` before the validator that admits ``3.0``; put after it (or on an
    optional field) pydantic would write them into the schema under names no client knows.

    Example:
        >>> from pydantic import TypeAdapter
        >>> TypeAdapter(whole_number(ge=1, le=9)).json_schema()
        {'maximum': 9, 'minimum': 1, 'type': 'integer'}
    """
    return Annotated[int, Field(**bounds), BeforeValidator(_integral)]  # type: ignore[call-overload]


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="Exception class name, e.g. 'UnknownSession' or 'RequestRejected'.")
    message: str = Field(description="What was wrong and how to fix it.")


class ErrorBody(BaseModel):
    """The one shape of every error response."""

    error: ErrorDetail

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"error": {"type": "UnknownSession",
                                                   "message": "no live session 'abc'"}}]}
    )
