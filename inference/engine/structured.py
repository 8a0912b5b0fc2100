"""Structured outputs: a request's reply follows a grammar (any JSON, a JSON schema, a
regex, one of several strings, or an EBNF/GBNF grammar), enforced while decoding.

xgrammar compiles the grammar once per (kind, spec) against this tokenizer's vocabulary,
and a matcher per request gives, before each step's sampling, the bitmask of the tokens
that keep the output inside the grammar (vLLM and SGLang use it the same way). The mask
sets every other token's logit to -inf, so greedy and sampled rows alike can only pick
a token the grammar allows; the grammar allows the end-of-sequence tokens only where the
output is complete. xgrammar is imported on the first structured request only.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from inference.engine.errors import InvalidRequestError
from inference.engine.json_schema_limits import check_enforceable

if TYPE_CHECKING:
    from inference.engine.sequence import Sequence


class GrammarState:
    """One request's matcher: where its output stands in its grammar."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> bool:
        """Advance by a sampled token; False if the grammar did not allow it."""
        if self.matcher.is_terminated():
            return True  # the stop token after a complete output: nothing left to check
        return bool(self.matcher.accept_token(token))

    @property
    def done(self) -> bool:
        return bool(self.matcher.is_terminated())


# Compiled grammars kept, newest used last: a client repeating its schema (every request
# of an agent loop) compiles it once.
GRAMMAR_CACHE_SIZE = 128


class StructuredOutputs:
    """Grammars for one tokenizer: compiled (cached), one matcher per request, masks.

    A compile takes from milliseconds to a second or more (a schema with many patterned
    strings); `compiled` may run on any thread, and the async front runs it on a worker
    thread before the request reaches add_request, whose `start` then finds it cached."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(info, max_threads=2)
        # Masks are computed on one worker thread while the model runs (fill_async).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_lock = threading.Lock()

    def start(self, kind: str, spec: str) -> GrammarState:
        """A matcher at the start of the grammar; InvalidRequestError if it does not compile."""
        return GrammarState(self._xgr.GrammarMatcher(self.compiled(kind, spec)))

    def compiled(self, kind: str, spec: str) -> Any:
        """The grammar compiled, from the cache when it was before (thread-safe: two threads
        compiling one new grammar at once both compile it, and one result is kept)."""
        key = (kind, spec)
        with self._cache_lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        try:
            compiled = self._compile(kind, spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidRequestError(
                f"the {kind} for structured output is invalid: {exc}"
            ) from exc
        with self._cache_lock:
            self._cache[key] = compiled
            while len(self._cache) > GRAMMAR_CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, kind: str, spec: str) -> Any:
        c = self.compiler
        if kind == "json":
            # OpenAI's json_object: an object at the top, whatever is inside it.
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if kind == "json_schema":
            check_enforceable(json.loads(spec))
            # Compact separators: the reply stays short and the schema still decides it.
            return c.compile_json_schema(spec, any_whitespace=False, strict_mode=True)
        if kind == "regex":
            return c.compile_regex(spec)
        if kind == "choice":
            choices = json.loads(spec)
            return c.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in choices))
        if kind == "grammar":
            return c.compile_grammar(spec)
        if kind == "structural_tag":
            return c.compile_structural_tag(spec)
        raise ValueError(f"unknown structured output kind {kind!r}")

    def fill(self, seqs: list[Sequence]) -> torch.Tensor:
        """The bitmask [len(seqs), ceil(vocab / 32)] of each sequence's allowed tokens."""
        mask = self._xgr.allocate_token_bitmask(len(seqs), self.vocab_size)
        for i, seq in enumerate(seqs):
            assert seq.grammar is not None
            seq.grammar.matcher.fill_next_token_bitmask(mask, i)
        return mask

    def fill_async(self, seqs: list[Sequence]) -> GrammarMasks:
        """fill() on the mask thread: started before the step's forward, read after it."""
        return GrammarMasks(self, seqs, self._pool.submit(self.fill, seqs))

    def apply(self, logits: torch.Tensor, rows: list[int], mask: torch.Tensor) -> None:
        """-inf, in place, on the tokens each of `rows` may not take (mask: one row each).
        xgrammar's CPU apply: numpy unpacking and torch shifts measured no faster."""
        full = torch.full((logits.shape[0], mask.shape[1]), -1, dtype=mask.dtype)
        full[rows] = mask
        self._xgr.apply_token_bitmask_inplace(
            logits, full, vocab_size=self.vocab_size, indices=rows
        )
        if logits.shape[1] > self.vocab_size:  # padding ids past the tokenizer's: never
            logits[torch.tensor(rows), self.vocab_size :] = float("-inf")


class GrammarMasks:
    """A step's masks, filling on the mask thread while the model runs."""

    def __init__(
        self, owner: StructuredOutputs, seqs: list[Sequence], pending: Future[torch.Tensor]
    ) -> None:
        self.owner = owner
        self.row_of = {id(s): i for i, s in enumerate(seqs)}
        self.pending = pending

    def apply(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> None:
        """Mask rows `rows` of logits, whose sequences are seqs[rows]; a sequence whose mask
        was not started (it was not expected to sample) gets one now."""
        mask = self.pending.result()
        late = [i for i in rows if id(seqs[i]) not in self.row_of]
        picked = mask[[self.row_of[id(seqs[i])] for i in rows if i not in late]]
        if late:
            extra = self.owner.fill([seqs[i] for i in late])
            rows = [i for i in rows if i not in late] + late
            picked = torch.cat([picked, extra])
        self.owner.apply(logits, rows, picked)
