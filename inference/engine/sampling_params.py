"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.engine.errors import InvalidRequestError


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature == 0 means greedy. top_k == 0, top_p == 1, min_p == 0 and
    repetition_penalty == 1 switch those filters off.
    """

    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        """Raise InvalidRequestError with a readable message if a field is out of range."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be a positive integer")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError("temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidRequestError("top_k must be >= 0 (0 disables it)")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError("min_p must be between 0 and 1")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise InvalidRequestError("repetition_penalty must be in (0, 10]")
        if len(self.stop) > 16 or any(not s or len(s) > 256 for s in self.stop):
            raise InvalidRequestError("stop takes at most 16 non-empty strings of <= 256 chars")
