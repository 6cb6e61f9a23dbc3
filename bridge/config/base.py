"""The base of every routes.yaml model: unknown keys are errors, values are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Problem", "Strict"]

#: A rule a connection breaks: the key it is about (None: the connection as a whole), and why.
Problem = tuple[str | None, str]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
