"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.engine.errors import InvalidRequestError

STRUCTURED_KINDS = (None, "json", "json_schema", "regex", "choice", "grammar", "structural_tag")


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature == 0 means greedy. top_k == 0, top_p == 1, min_p == 0,
    repetition_penalty == 1, frequency/presence_penalty == 0 and an empty logit_bias switch
    those off. `logprobs` (None: off) asks for each sampled token's log-probability and its
    `logprobs` most likely alternatives. `structured` names the grammar the output must
    follow ("json", "json_schema", "regex", "choice", "grammar", or "structural_tag": an
    xgrammar structural tag, as JSON, that tool calls use), `structured_spec` holds it.
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
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # (token id, bias) pairs: a list, not a dict, because msgpack (the workers' channel)
    # refuses integer map keys.
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    logprobs: int | None = None
    structured: str | None = None
    structured_spec: str = ""
    # Writing an output on (a reply cut short, continued): its last `structured_given`
    # prompt tokens are the output so far, which the grammar takes before the first new one.
    structured_given: int = 0

    @property
    def penalized(self) -> bool:
        """True when the logits need more than temperature and filters before a draw."""
        return bool(
            self.frequency_penalty or self.presence_penalty or self.logit_bias or self.structured
        )

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
        if not (-2.0 <= self.frequency_penalty <= 2.0 and -2.0 <= self.presence_penalty <= 2.0):
            raise InvalidRequestError("frequency and presence penalties must be in [-2, 2]")
        if len(self.logit_bias) > 1024 or any(not -100 <= b <= 100 for _, b in self.logit_bias):
            raise InvalidRequestError("logit_bias takes at most 1024 biases in [-100, 100]")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError("logprobs must be between 0 and 20")
        if self.structured not in STRUCTURED_KINDS:
            raise InvalidRequestError(f"structured must be one of {STRUCTURED_KINDS[1:]}")
        if not isinstance(self.structured_given, int) or self.structured_given < 0:
            raise InvalidRequestError("structured_given must be a count of tokens")
        if len(self.stop) > 16 or any(not s or len(s) > 256 for s in self.stop):
            raise InvalidRequestError("stop takes at most 16 non-empty strings of <= 256 chars")
