"""What the engine hands back: text deltas and, at the end, the request's figures."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RequestFigures:
    """The figures of one request: its times and token counts (docs/architecture.md, "Words":
    figures are one request's numbers, stats the engine's live snapshot).

    Timestamps are wall-clock seconds (time.time()); definitions follow vLLM's."""

    arrival_time: float
    scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    # Time each output token became available (one entry per token).
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    # Prompt tokens whose KV came from the memory tier, and from the Redis tier; the rest
    # were computed.
    cached_tokens: int = 0
    cached_tokens_redis: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    # Speculative decoding: guesses checked by the model, and those it kept.
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    replayed: bool = False  # answered by the response cache, not the engine

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        if self.scheduled_time is None:
            return None
        return self.scheduled_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1): mean time per output token after the first."""
        if self.e2e is None or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive output tokens."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "ttft": self.ttft,
            "tpot": self.tpot,
            "e2e": self.e2e,
            "queue_time": self.queue_time,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_tokens_redis": self.cached_tokens_redis,
            "output_tokens": self.output_tokens,
            "preemptions": self.preemptions,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "replayed": self.replayed,
        }


@dataclass
class TokenLogprob:
    """A sampled token's log-probability and the `top` most likely tokens' (id, logprob),
    from the model's own distribution: the raw logits' log-softmax, before penalties,
    biases, a grammar's mask and temperature (vLLM's default `raw_logprobs`), so that they
    sum to the text's log-likelihood under the model."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Delta:
    """New output of one request since its previous delta.

    The last delta of a request has finished=True, a finish_reason
    ("stop", "length", "abort" or "error"), and its figures.
    """

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    figures: RequestFigures | None = None
    # One per token of token_ids, where the request asked for logprobs.
    logprobs: list[TokenLogprob] | None = None
    # The text of these tokens, not decoded yet (LLMEngine.defer_text: the consumer decodes
    # it, off the step's path); `resolve_text()` appends it to `text`, in order.
    text_job: Callable[[], str] | None = field(default=None, repr=False, compare=False)

    def resolve_text(self) -> Delta:
        if self.text_job is not None:
            job, self.text_job = self.text_job, None
            self.text += job()
        return self
