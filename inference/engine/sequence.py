"""One request's state as it moves through the engine: tokens, progress, KV blocks, timings."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

import torch

from inference.engine.cache_scope import UNSALTED, CacheScope
from inference.engine.kv_tier.blocks import RestoredPrefix
from inference.engine.outputs import RequestFigures, TokenLogprob
from inference.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inference.engine.detokenizer import IncrementalDetokenizer
    from inference.engine.structured import GrammarState


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
        cache_scope: CacheScope = UNSALTED,
    ) -> None:
        self.request_id = request_id
        self.session_id = session_id
        # Which prefix chain this request's KV blocks join (kv_cache.CacheScope).
        self.cache_scope = cache_scope
        self.sampling = sampling
        # The engine clamps max_tokens to the context left and adds eos to the stop ids.
        self.max_tokens = sampling.max_tokens
        self.stop_token_ids: set[int] = set(sampling.stop_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        # Blocks [start, end) the KV cache holds back for this sequence to grow into: the
        # room its latest run left after itself (kv_cache.py, "claims").
        self.kv_room: tuple[int, int] | None = None
        # Prefix-index hashes of this sequence's full blocks, in order (a hash chain).
        self.block_hashes: list[int] = []
        # The same chain as stable digests (the Redis tier's keys), one per full block.
        self.block_digests: list[bytes] = []
        # Redis tier: while a lookup for this prompt's prefix runs, the scheduler does not
        # admit the sequence; its result (blocks to copy into the pool) waits here.
        self.kv_lookup_pending = False
        self.kv_restore: RestoredPrefix | None = None
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.figures = RequestFigures(
            arrival_time=arrival_time if arrival_time is not None else time.time(),
            prompt_tokens=len(prompt_token_ids),
        )
        # Seeded requests own a generator so their draws do not depend on the batch.
        self.generator: torch.Generator | None = None
        if sampling.seed is not None:
            self.generator = torch.Generator().manual_seed(sampling.seed)
        # Filled by the sampler when the request asks for logprobs: its latest token's.
        self.last_logprob: TokenLogprob | None = None
        # A structured-output request's grammar matcher (structured.py), fed each token.
        self.grammar: GrammarState | None = None
        # Filled by the engine: the detokenizer state for this request.
        self.detokenizer: IncrementalDetokenizer | None = None
        # Speculative decoding: this step's guesses for the tokens after the last one (not
        # in token_ids; the step computes [last token, *draft_tokens] and keeps what the
        # model agrees with), and the proposer's distributions over them (None: one-hot).
        self.draft_tokens: list[int] = []
        self.draft_probs: torch.Tensor | None = None
        # Acceptance since the last (re)start of speculation for this sequence; below the
        # engine's bar it pauses until num_output_tokens reaches spec_resume_at.
        self.spec_window_drafted = 0
        self.spec_window_accepted = 0
        self.spec_window_checks = 0
        self.spec_resume_at = 0

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

    def clear_draft(self) -> None:
        self.draft_tokens = []
        self.draft_probs = None
