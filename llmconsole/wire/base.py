"""The base every wire model shares: tolerant reading, frozen values."""

from __future__ import annotations

from typing import Any, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic_core import PydanticUndefined


class WireModel(BaseModel):
    """A value that crossed (or will cross) the control socket.

    Unknown fields are ignored (a newer daemon's additions), missing ones take their defaults (an
    older daemon's gaps), a field whose value does not fit its type takes its default too, and a
    list keeps the items that fit: a client shows the rest of an answer rather than nothing. A
    model is immutable once read, like the domain's snapshots."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @field_validator("*", mode="wrap")
    @classmethod
    def _odd_value_is_default(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        try:
            return handler(value)
        except ValidationError:
            field = cls.model_fields.get(info.field_name or "")
            if field is None:
                raise
            if isinstance(value, list) and get_origin(field.annotation) is list:  # it keeps the items that fit
                kept: list[Any] = []
                for item in value:
                    try:
                        kept.extend(handler([item]))
                    except ValidationError:
                        continue
                return kept
            if field.is_required():
                raise
            default = field.get_default(call_default_factory=True)
            if default is PydanticUndefined:
                raise
            return default

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent on the wire."""
        return self.model_dump(mode="json")
