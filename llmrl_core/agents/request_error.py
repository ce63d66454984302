"""The error of a request the agent endpoint refuses."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the endpoint refuses (answered as an OpenAI error with ``status``; ``param``: the field)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
