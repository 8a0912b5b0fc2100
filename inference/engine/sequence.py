"""One request's state as it moves through the engine: tokens, progress, KV blocks, timings."""

from __future__ import annotations

import enum
import time

import torch

from inference.engine.outputs import RequestMetrics
from inference.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request: prompt plus generated tokens, and how much of it the KV cache holds.

    The KV cache holds the first `num_computed_tokens` tokens. The newest sampled token is
    never in the cache yet: it is the input of the next decode step. A sequence whose
    uncomputed tail is longer than one token is (still, or again after preemption) prefilling.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.session_id = session_id
        self.sampling = sampling
        # The engine clamps max_tokens to the context left and adds eos to the stop ids.
        self.max_tokens = sampling.max_tokens
        self.stop_token_ids: set[int] = set(sampling.stop_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        # Prefix-index hashes of this sequence's full blocks, in order (a hash chain).
        self.block_hashes: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.metrics = RequestMetrics(
            arrival_time=arrival_time if arrival_time is not None else time.time(),
            prompt_tokens=len(prompt_token_ids),
        )
        # Seeded requests own a generator so their draws do not depend on the batch.
        self.generator: torch.Generator | None = None
        if sampling.seed is not None:
            self.generator = torch.Generator().manual_seed(sampling.seed)
        # Filled by the engine: the detokenizer state for this request.
        self.detokenizer: object | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, len={len(self)}, "
            f"computed={self.num_computed_tokens}, status={self.status.value})"
        )

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
