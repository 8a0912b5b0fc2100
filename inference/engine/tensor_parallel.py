"""Tensor parallelism: one model split across N ranks, one all-reduce after o and after down.

The math lives in models/ (each rank's DecoderModel holds its shard and sums partial outputs
through `all_reduce`). This file is the plumbing:

- rank 0 is the engine's own process. It wraps its shard in TensorParallelModel, which looks
  like a DecoderModel to the model runner. Each forward first broadcasts the step's inputs
  (token ids, AttentionMetadata, the KV pool shape) to the other ranks, then runs its shard;
  the ranks meet again in every all-reduce. Logits are computed on rank 0 only.
- ranks 1..N-1 run `serve()`: build their shard, allocate their KV pool shards (same number
  of blocks as rank 0, learned from the first step), then forward whatever rank 0 sends
  until it says stop.

Started two ways:

- `EngineConfig(tensor_parallel_size=N)`: rank 0 spawns N-1 daemon processes and meets them
  on a free TCP port on 127.0.0.1.
- torchrun (`torchrun --nproc-per-node N manage.py run_engine ...` with the same setting):
  every process runs the same program; when the engine builds its model, ranks > 0 serve
  rank 0 instead and exit when it shuts down (they never return to the caller).

Backends: nccl when each rank has its own GPU, gloo otherwise (CPU, or ranks sharing a GPU).
Step inputs always travel over a gloo group, so they are plain pickled CPU objects.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import threading
import time
import traceback
import weakref
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from inference.engine.config import EngineConfig
from inference.engine.layers.attention import AttentionMetadata
from inference.engine.models import DecoderModel, load_config, load_model
from inference.engine.models.base import check_tensor_parallel_size

log = logging.getLogger(__name__)

# Ranks > 0 wait for the next step for as long as the engine is idle; a rank that dies
# closes its sockets, and gloo reports that at once, so a long timeout hides no hang.
IDLE_TIMEOUT = datetime.timedelta(days=30)
# How long rank 0 waits for spawned ranks to load their shards, and to stop.
START_TIMEOUT_S = 600.0
STOP_GRACE_S = 10.0


def build_model(
    config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str,
    max_len: int | None,
) -> Any:
    """DecoderModel for tensor_parallel_size 1, else rank 0's TensorParallelModel."""
    size = getattr(config, "tensor_parallel_size", 1)
    if size == 1:
        return load_model(
            config.model, dtype=dtype, device=device, quantization=quantization,
            max_len=max_len, native_max_rows=config.native_max_rows,
        )  # fmt: skip
    check_tensor_parallel_size(load_config(config.model), size)
    spec = ShardSpec(config.model, dtype, str(device), quantization, max_len, config.cpu_threads())
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return _join_torchrun(spec, size)
    return TensorParallelModel(spec, size)


@dataclasses.dataclass
class ShardSpec:
    """What a rank needs to build its shard: the runner's resolved settings."""

    folder: str
    dtype: torch.dtype
    device: str
    quantization: str
    max_len: int | None
    cpu_threads: int  # the engine's budget; the ranks share it

    def build(self, rank: int, size: int, device: torch.device) -> DecoderModel:
        if device.type == "cpu":
            # N processes with the whole budget each would fight over the cores.
            torch.set_num_threads(max(1, self.cpu_threads // size))
        return load_model(
            self.folder,
            dtype=self.dtype,
            device=device,
            quantization=self.quantization,
            max_len=self.max_len,
            tp_rank=rank,
            tp_size=size,
            all_reduce=_all_reduce,
        )


class TensorParallelModel:
    """Rank 0's shard, shaped like a DecoderModel (attributes are the shard's, heads local)."""

    def __init__(self, spec: ShardSpec, size: int, spawn: bool = True) -> None:
        """spawn=True: start ranks 1..size-1 and the process group. spawn=False: both exist
        already (torchrun), and this process is rank 0."""
        if spawn and dist.is_initialized():
            raise RuntimeError(
                "a process group already exists: one tensor-parallel model per process"
            )
        self.size = size
        self.workers: list[Any] = []
        self.sync_timing = False  # CUDA: synchronize around all-reduces so timings are real
        self._stats = _zero_stats()
        self._closed = False
        self._broken = False
        self._owns_group = spawn
        # Whatever happens to this object (closed, collected, the interpreter exiting), the
        # spawned ranks must not outlive it.
        self._finalizer = weakref.finalize(self, _kill, self.workers)
        device = torch.device(spec.device)
        try:
            if spawn:
                self._spawn_and_join(spec, size, device)
            else:
                self.shard = spec.build(0, size, device)
            self.control = _control_group()
        except BaseException:
            self._finalizer()
            if spawn and dist.is_initialized():
                dist.destroy_process_group()
            raise
        _timer.enabled = True

    def _spawn_and_join(self, spec: ShardSpec, size: int, device: torch.device) -> None:
        backend = _backend(device, size)
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")
        pipes = []
        for rank in range(1, size):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_spawned_rank,
                args=(rank, size, init_method, backend, spec, send),
                name=f"tp-rank-{rank}",
                daemon=True,
            )
            p.start()
            send.close()
            self.workers.append(p)
            pipes.append(recv)
        # Load rank 0's shard while the others load theirs.
        self.shard = spec.build(0, size, device)
        _wait_until_loaded(self.workers, pipes)
        _init_group(backend, init_method, 0, size)

    def __getattr__(self, name: str) -> Any:
        # Everything the runner reads (num_layers, num_kv_heads, config, ...) is the shard's.
        shard = self.__dict__.get("shard")
        if shard is None:
            raise AttributeError(name)
        return getattr(shard, name)

    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_caches: list[torch.Tensor]
    ) -> torch.Tensor:
        if self._closed or self._broken:
            raise RuntimeError(
                "tensor parallel: the ranks are stopped or out of step after a failed step; "
                "restart the engine"
            )
        start = time.perf_counter()
        try:
            pool = kv_caches[0]
            step = ("forward", _to_cpu(input_ids), _to_cpu(meta), tuple(pool.shape), pool.dtype)
            dist.broadcast_object_list([step], src=0, group=self.control)
            self._stats["broadcast_seconds"] += time.perf_counter() - start
            _timer.sync = self.sync_timing and input_ids.device.type == "cuda"
            hidden = self.shard.forward(input_ids, meta, kv_caches)
            if _timer.sync:
                torch.cuda.synchronize()
        except BaseException:
            # The other ranks may be waiting inside an all-reduce this rank never reached:
            # the group cannot be trusted again.
            self._broken = True
            raise
        self._stats["forward_seconds"] += time.perf_counter() - start
        self._stats["steps"] += 1
        return hidden

    def compute_logits(self, hidden: torch.Tensor, as_rows: int | None = None) -> torch.Tensor:
        return self.shard.compute_logits(hidden, as_rows)

    def tp_stats(self) -> dict[str, float | int]:
        """Rank 0's view: steps, forward time (broadcast included), and the part of it spent
        sending inputs and inside all-reduces (waiting for slower ranks counts there)."""
        return {**self._stats, "allreduce_seconds": _timer.seconds, "allreduces": _timer.calls}

    def reset_tp_stats(self) -> None:
        self._stats = _zero_stats()
        _timer.seconds, _timer.calls = 0.0, 0

    def close(self) -> None:
        """Stop the other ranks and leave the process group. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if not self._broken:
            try:
                dist.broadcast_object_list([("stop",)], src=0, group=self.control)
            except Exception:  # a rank already gone: nothing left to tell
                log.warning("tensor parallel: could not tell the ranks to stop", exc_info=True)
            for p in self.workers:
                p.join(timeout=STOP_GRACE_S)
        self._finalizer()  # kills any rank that did not stop
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        _timer.enabled = False


# -- ranks > 0 ------------------------------------------------------------------------------


def serve(model: DecoderModel, device: torch.device) -> None:
    """Forward whatever rank 0 broadcasts until it says stop."""
    control = _control_group()
    pools: list[torch.Tensor] = []
    with torch.inference_mode():
        while True:
            message: list[Any] = [None]
            dist.broadcast_object_list(message, src=0, group=control)
            kind, *args = message[0]
            if kind == "stop":
                return
            input_ids, meta, pool_shape, pool_dtype = args
            if not pools or (tuple(pools[0].shape), pools[0].dtype) != (pool_shape, pool_dtype):
                pools = [
                    torch.zeros(pool_shape, dtype=pool_dtype, device=device)
                    for _ in range(model.num_layers)
                ]
            model.forward(input_ids.to(device), _to_device(meta, device), pools)


def _spawned_rank(
    rank: int, size: int, init_method: str, backend: str, spec: ShardSpec, pipe: Any
) -> None:
    _exit_with_parent()
    device = _rank_device(torch.device(spec.device), rank)
    try:
        model = spec.build(rank, size, device)
    except BaseException:
        pipe.send(traceback.format_exc())
        raise
    pipe.send("ready")
    pipe.close()
    _init_group(backend, init_method, rank, size)
    try:
        serve(model, device)
    finally:
        dist.destroy_process_group()


def _join_torchrun(spec: ShardSpec, size: int) -> TensorParallelModel:
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world != size:
        raise ValueError(f"tensor_parallel_size={size} but torchrun started {world} processes")
    device = torch.device(spec.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        spec = dataclasses.replace(spec, device=str(device))
    if not dist.is_initialized():
        _init_group(_backend(device, size), "env://", rank, size)
    if rank == 0:
        return TensorParallelModel(spec, size, spawn=False)
    model = spec.build(rank, size, device)
    serve(model, device)
    dist.destroy_process_group()
    # This process was only ever a rank: leave instead of going on to be an engine.
    raise SystemExit(0)


def _exit_with_parent() -> None:
    """A spawned rank ends when the engine's process does, however that one ended."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(0)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


# -- plumbing -------------------------------------------------------------------------------


class _AllReduceTimer:
    enabled = False  # only rank 0 keeps the timings
    sync = False
    seconds = 0.0
    calls = 0


_timer = _AllReduceTimer()


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if not _timer.enabled:
        dist.all_reduce(t)
        return t
    if _timer.sync:
        torch.cuda.synchronize()
    start = time.perf_counter()
    dist.all_reduce(t)
    if _timer.sync:
        torch.cuda.synchronize()
    _timer.seconds += time.perf_counter() - start
    _timer.calls += 1
    return t


def _backend(device: torch.device, size: int) -> str:
    if device.type != "cuda":
        return "gloo"
    if torch.cuda.device_count() >= size:
        return "nccl"
    # nccl refuses two ranks on one GPU; gloo accepts CUDA tensors (copied through the host).
    log.warning(
        "tensor parallel: %d ranks share %d GPU(s); all-reduce goes over gloo",
        size,
        torch.cuda.device_count(),
    )
    return "gloo"


def _rank_device(device: torch.device, rank: int) -> torch.device:
    if device.type != "cuda":
        return device
    d = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


def _init_group(backend: str, init_method: str, rank: int, size: int) -> None:
    # On gloo the ranks also wait here for steps; nccl only ever carries all-reduces.
    timeout = IDLE_TIMEOUT if backend == "gloo" else None
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=size, timeout=timeout
    )


def _control_group() -> Any:
    """The group step inputs travel on: the default one on gloo, a gloo twin beside nccl."""
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_until_loaded(workers: list[Any], pipes: list[Any]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    for p, pipe in zip(workers, pipes, strict=True):
        while not pipe.poll(0.2):
            if not p.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"tensor parallel: {p.name} did not start (exit {p.exitcode})")
        message = pipe.recv()
        pipe.close()
        if message != "ready":
            raise RuntimeError(f"tensor parallel: {p.name} failed to load its shard:\n{message}")


def _kill(workers: list[Any]) -> None:
    for p in workers:
        if p.is_alive():
            p.kill()
        p.join(timeout=STOP_GRACE_S)


def _zero_stats() -> dict[str, float | int]:
    return {"steps": 0, "forward_seconds": 0.0, "broadcast_seconds": 0.0}


def _to_cpu(obj: Any) -> Any:
    return _to_device(obj, torch.device("cpu"))


def _to_device(obj: Any, device: torch.device) -> Any:
    """Every tensor inside obj (dataclasses, lists, tuples) on `device`; unchanged if there."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list | tuple):
        return type(obj)(_to_device(x, device) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        copy = object.__new__(type(obj))
        copy.__dict__.update({k: _to_device(v, device) for k, v in obj.__dict__.items()})
        return copy
    return obj
