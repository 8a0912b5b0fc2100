"""The torch path's forward as one compiled graph (torch.compile, inductor).

What stays opaque: each linear product (`engine::linear`: fbgemm's fp16 products, faster on
CPUs than inductor's own frozen float32 GEMMs: `python -m inference.bench.linear_formats`)
and each layer's attention (`engine::attention`: writes the step's K/V into the paged pool
and attends, as vLLM keeps attention opaque), registered as custom ops through
torch.library so dynamo never breaks the graph there. Everything between them (embedding,
norms, rope, SiLU, the residual adds) is one inductor graph instead of ~15 eager ops a
layer.

The attention op reads the step's metadata (block tables, positions, how many rows are
real) from its model's `StepState`, set before each call, as vLLM's forward context does;
the graph's inputs are only the token ids and positions.

Shapes: on a CPU one graph with a dynamic row count covers every step from `min_rows` to
`max_rows` (padding rows to buckets would cost their matmuls in full there); on CUDA the
decode steps are padded to buckets and each bucket is captured as a CUDA graph
(cuda_graphs.py). Compiled code is cached under the cache folder (inductor's FX graph and
AOTAutograd caches), so a second start only traces.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from inference.engine.layers.attention import AttentionMetadata
    from inference.engine.layers.linear import Linear, StackedLinear
    from inference.engine.models.base import DecoderModel

log = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "on", "off")


@dataclass
class StepState:
    """One model's view of the step being run: what its attention op reads."""

    model: DecoderModel
    kv_caches: list[torch.Tensor] = field(default_factory=list)
    meta: AttentionMetadata | None = None
    rows: int = 0  # real rows; the rest of the batch is padding


_lock = threading.Lock()
_LINEARS: list[Linear | StackedLinear] = []
_STATES: list[StepState] = []


@torch.library.custom_op("engine::linear", mutates_args=())
def _linear_op(x: torch.Tensor, key: int) -> torch.Tensor:
    y: torch.Tensor = _LINEARS[key](x.contiguous())
    return y


@_linear_op.register_fake
def _linear_fake(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], _LINEARS[key].out_features)


@torch.library.custom_op("engine::attention", mutates_args=())
def _attention_op(qkv: torch.Tensor, model: int, layer: int) -> torch.Tensor:
    state = _STATES[model]
    assert state.meta is not None, "engine::attention ran outside a step"
    n = state.rows
    out = state.model.attend(qkv[:n].contiguous(), state.kv_caches[layer], state.meta, layer)
    if n == qkv.shape[0]:
        return out
    padded = out.new_zeros(qkv.shape[0], *out.shape[1:])
    padded[:n] = out
    return padded


@_attention_op.register_fake
def _attention_fake(qkv: torch.Tensor, model: int, layer: int) -> torch.Tensor:
    m = _STATES[model].model
    return qkv.new_empty(qkv.shape[0], m.num_heads, m.head_dim)


def _register(model: DecoderModel) -> int:
    """The model's key for the attention op; each of its Linears gets its `compile_key`."""
    with _lock:
        for layer in model.layers:
            for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
                lin.compile_key = len(_LINEARS)
                _LINEARS.append(lin)
        _STATES.append(StepState(model))
        return len(_STATES) - 1


def cache_dir() -> str:
    root = os.environ.get("CHATAPP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "chatapp"
    )
    return os.path.join(root, "inductor")


def configure_inductor_cache() -> None:
    """Inductor's on-disk caches under the cache folder, unless the environment already
    names another folder (TORCHINDUCTOR_CACHE_DIR). Importing torch._dynamo (transformers'
    models do) writes torch's own default there (/tmp/torchinductor_<user>), so that value
    counts as unset: else a process that imported it first compiled into /tmp, which a new
    machine or a reboot empties, and every start compiled cold."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, "", default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir()
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True


def compile_unavailable_reason(model: Any) -> str | None:
    """Why the compiled step cannot run for this model, or None."""
    if getattr(model, "tp_size", 1) > 1 or not hasattr(model, "layers_forward"):
        return "tensor parallelism runs the eager forward"
    if model.device.type == "cuda" and not getattr(model, "attention_plain", True):
        return "CUDA graphs attend by plain softmax; this model has windowed or capped layers"
    if model.device.type == "cpu":
        import shutil

        if shutil.which(os.environ.get("CXX") or "g++") is None:
            return "inductor needs a C++ compiler (g++) on a CPU"
    return None


def compile_wins(device: torch.device) -> bool:
    """What `auto` means on this device: on a CPU the compiled step measured a few percent
    faster than eager, which does not pay for its compile at start (`python -m
    inference.bench.step_profile --variants eager compiled`)."""
    return device.type == "cuda"


class CompiledStep:
    """The compiled forward of one model over steps of min_rows..max_rows rows (CPU: one
    graph with a dynamic row count)."""

    def __init__(self, model: DecoderModel, kv_caches: list[torch.Tensor], min_rows: int,
                 max_rows: int) -> None:  # fmt: skip
        configure_inductor_cache()
        self.model = model
        self.min_rows = max(2, min_rows)  # dynamo specializes sizes 0 and 1
        self.max_rows = max_rows
        self._key = _register(model)
        self.state = _STATES[self._key]
        self.state.kv_caches = kv_caches
        key = self._key
        ops = torch.ops.engine

        def linear(lin: Linear | StackedLinear, x: torch.Tensor) -> torch.Tensor:
            y: torch.Tensor = ops.linear(x, lin.compile_key)
            return y

        def attend(i: int, qkv: torch.Tensor) -> torch.Tensor:
            y: torch.Tensor = ops.attention(qkv, key, i)
            return y

        def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return model.layers_forward(input_ids, positions, linear, attend)

        # Dynamo keeps its compiled code (and its recompile limit) per code object: each
        # model's step gets one of its own, so a second engine in the process (a draft
        # model, a test's next engine) neither evicts nor counts against the first.
        code = forward.__code__.replace(co_name=f"engine_step_{key}")
        own = types.FunctionType(code, forward.__globals__, code.co_name, None, forward.__closure__)
        self._fn: Callable[..., torch.Tensor] = torch.compile(own, fullgraph=True)
        self.compile_seconds = 0.0
        self.steps = 0  # forwards run compiled
        self.compiled_now = False  # the last warm_up compiled (the cache did not hold it)

    def handles(self, rows: int, meta: AttentionMetadata | None = None) -> bool:
        return self.min_rows <= rows <= self.max_rows

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        state = self.state
        state.meta, state.rows = meta, input_ids.shape[0]
        self.steps += 1
        try:
            positions = meta.positions
            torch._dynamo.mark_dynamic(input_ids, 0, min=self.min_rows, max=self.max_rows)
            torch._dynamo.mark_dynamic(positions, 0, min=self.min_rows, max=self.max_rows)
            return self._fn(input_ids, positions)
        finally:
            state.meta = None

    def warm_up(self, step: Callable[[int], Any], progress: Callable[[str], None]) -> float:
        """Compile (or load from the cache) before the first request: `step(rows)` runs
        one real step of that many rows through `forward`. Returns the seconds it took."""
        from torch._dynamo.utils import counters

        start = time.perf_counter()
        where = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        progress(
            f"compiling the engine's step ({self.min_rows}-{self.max_rows} rows; about a "
            f"minute the first time, seconds once cached in {where})..."
        )
        misses = counters["inductor"]["fxgraph_cache_miss"]
        step(self.min_rows)
        step(self.min_rows + 7)  # a second size: proves the graph is dynamic, not specialized
        self.compile_seconds = time.perf_counter() - start
        self.compiled_now = counters["inductor"]["fxgraph_cache_miss"] > misses
        return self.compile_seconds
