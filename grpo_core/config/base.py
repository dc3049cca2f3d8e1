"""What every config section shares: the error type and the strict base model."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot run. `field` is the dotted path of the culprit."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"config error: {field}: {message}" if field else f"config error: {message}")


class Section(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
