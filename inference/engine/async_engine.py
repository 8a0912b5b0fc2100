"""The asyncio front: the step loop runs in a daemon thread; callers stream deltas.

    engine = AsyncEngine(EngineConfig(model=path))
    async for delta in engine.generate(ids, SamplingParams(max_tokens=64)):
        ...

Each request gets an asyncio.Queue on the caller's event loop; the engine thread hands
deltas over with call_soon_threadsafe. The thread sleeps on an Event while there is no work.
The text of a request without stop strings is decoded as its consumer takes each delta
(LLMEngine.defer_text), so the step thread never waits for the tokenizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator

from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.errors import InvalidRequestError
from inference.engine.heap import freeze_loaded, thaw
from inference.engine.outputs import Delta
from inference.engine.sampling_params import SamplingParams
from inference.engine.streaming import until_finished

log = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.engine = LLMEngine(config)
        # Text is decoded here, on the caller's loop as each delta is taken, not in the step.
        self.engine.defer_text = True
        self.tokenizer = self.engine.tokenizer
        self.eos_token_ids: list[int] = self.engine.eos_token_ids
        self.max_model_len: int = self.engine.max_model_len
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Delta]]] = {}
        self._wakeup = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        freeze_loaded()  # no full collection walks the model's objects mid-step (heap.py)
        self._thread.start()

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        shared_prefix_tokens: int = 0,
    ) -> AsyncIterator[Delta]:
        """Stream the request's deltas; the last one has finished=True. `cache_salt` and
        `shared_prefix_tokens` scope its prefix reuse (LLMEngine.add_request).

        Raises EngineBusyError, PromptTooLongError or InvalidRequestError before the first
        delta. Leaving the loop early (break, aclose, cancellation) aborts the request.
        """
        if self._stopping:
            raise RuntimeError("the engine is shut down")
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        # Register the stream before queueing the request, so no delta can arrive unseen.
        rid = request_id or uuid.uuid4().hex
        if rid in self._streams:
            raise InvalidRequestError(f"request id {rid!r} is already streaming")
        self._streams[rid] = (loop, queue)
        try:
            if sampling.structured is not None:
                # Off the loop: add_request then finds the grammar compiled (cached).
                await asyncio.to_thread(self.engine.prepare_structured, sampling)
            self.engine.add_request(
                prompt_token_ids,
                sampling,
                request_id=rid,
                session_id=session_id,
                cache_salt=cache_salt,
                shared_prefix_tokens=shared_prefix_tokens,
            )
        except BaseException:
            self._streams.pop(rid, None)
            raise
        self._wakeup.set()
        try:
            async with contextlib.aclosing(until_finished(queue, lambda: self.abort(rid))) as s:
                async for delta in s:
                    yield delta.resolve_text()
        finally:
            self._streams.pop(rid, None)

    def abort(self, request_id: str) -> None:
        """Drop a request; its blocks are freed at the next step (thread-safe)."""
        self.engine.abort_request(request_id)
        self._wakeup.set()

    def stats(self) -> dict[str, object]:
        return self.engine.stats()

    def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout=30)
        if not self._thread.is_alive():  # a stop message must not cross a running step
            self.engine.close(flush_timeout=5.0)  # Redis tier write-backs, TP ranks
        for rid, (loop, queue) in list(self._streams.items()):
            delta = Delta(rid, finished=True, finish_reason="abort", error="engine shut down")
            self._deliver(loop, queue, delta)
        self._streams.clear()
        thaw()

    # -- the engine thread ------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            if not self.engine.has_work():
                self._wakeup.wait(timeout=0.5)
                self._wakeup.clear()
                continue
            try:
                deltas = self.engine.step()
            except Exception:
                # step() already turns model errors into error deltas; this is a last guard.
                log.exception("engine step raised")
                continue
            for delta in deltas:
                stream = self._streams.get(delta.request_id)
                if stream is not None:
                    self._deliver(*stream, delta)

    @staticmethod
    def _deliver(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Delta], d: Delta) -> None:
        # RuntimeError: the caller's event loop is closed; nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, d)
