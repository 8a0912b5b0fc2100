"""Turns a scheduled batch into tensors, runs the model over the paged KV cache, returns logits.

Owns the KV cache tensors: per layer a key and a value pool of shape
[num_blocks, block_size, kv_heads, head_dim], sized by kv_pool_bytes (kv_budget.py).
"""

from __future__ import annotations

import logging

import torch

from inference.engine import huge_pages, kernels
from inference.engine.compiled_step import (
    COMPILE_MODES,
    CompiledStep,
    compile_unavailable_reason,
    compile_wins,
)
from inference.engine.config import EngineConfig
from inference.engine.cpu_backend import ALL_CORES_POOLED as ALL_CORES_POOLED
from inference.engine.cpu_backend import SPLIT_MIN_ROWS, invariant_fold_rows
from inference.engine.cuda_graphs import CudaGraphStep
from inference.engine.kv_budget import auto_pool_bytes, available_memory
from inference.engine.kv_codec import row_width
from inference.engine.kv_tier.redaction import redacted
from inference.engine.layers.attention import (
    PAGED_MAX_CHUNK,
    AttentionMetadata,
    DecodeGroup,
    PrefillChunk,
)
from inference.engine.models import load_config
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence
from inference.engine.tensor_parallel import build_model

log = logging.getLogger(__name__)

SPLIT_MODES = ("auto", "on", "off")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, quantization: str = "none") -> torch.dtype:
    """ "auto": float32 on a CPU whose weights are 4-bit blocks (the native small steps
    compute in float32; the large ones still multiply in bf16 where the CPU does it, see
    model._large_format), else bfloat16 where it is native, else float32."""
    if name == "auto":
        if device.type == "cpu" and quantization in ("int4", "hybrid"):
            return torch.float32
        if device.type == "cuda" or kernels.cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be auto, {', '.join(_DTYPES)}; got {name!r}")
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """ "float16" for torch.float16: as the settings, the config line and stats spell it."""
    return str(dtype).removeprefix("torch.")


def resolve_kv_dtype(
    name: str, device: torch.device, dtype: torch.dtype, quantization: str = "none"
) -> torch.dtype:
    """The KV pool's element type (EngineConfig.kv_dtype) for a model of `dtype`: with
    "auto", float16 for a float32 model with quantized weights on a CPU where the native
    kernels load (their attention, the paged and the chunk kernels read float16 pools),
    else `dtype`: the exact path (quantization "none") stays exact."""
    if name == "auto":
        quantized = quantization != "none"
        if device.type == "cpu" and dtype == torch.float32 and quantized and kernels.load():
            return torch.float16
        return dtype
    if name == "int8":
        # Rows of int8 with their scales (kv_codec.py): what the kernels read, on a CPU.
        if device.type != "cpu" or not kernels.load():
            raise ValueError(
                "kv_dtype int8 needs a CPU where the native kernels load (their attention "
                "reads int8 pools); use float16 or the model dtype here"
            )
        return torch.int8
    if name not in _DTYPES:
        raise ValueError(f"kv_dtype must be auto, int8, {', '.join(_DTYPES)}; got {name!r}")
    kv = _DTYPES[name]
    if device.type == "cpu" and kv == torch.bfloat16 and dtype == torch.float32:
        raise ValueError(
            "kv_dtype bfloat16 needs a bfloat16 model on a CPU (dtype bfloat16): a float32 "
            "model's kernels read float32 or float16 KV pools"
        )
    return kv


def resolve_quantization(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    model_fits_blocks: bool = True,
    dtype_explicit: bool = False,
) -> str:
    """ "auto": the weights stay in the model dtype when that dtype was asked for explicitly
    (ENGINE_DTYPE set: a float32 request gets float32 weights, not fp16 or 4-bit ones);
    else, on a CPU where the 4-bit kernels build, "hybrid" (4-bit weights for steps of a
    few rows, the float format for the rest); else fp16-stored weights for a float32 CPU
    model; else the model dtype as it is."""
    if name != "auto":
        return name
    if device.type != "cpu" or dtype_explicit:
        return "none"
    if kernels.load() is not None and model_fits_blocks:
        return "hybrid"
    return "fp16" if dtype == torch.float32 else "none"


INVARIANT_MODES = ("seeded", "off")


def split_mixed(mode: str) -> bool:
    """Whether mixed steps split (EngineConfig.split_mixed_steps)."""
    if mode not in SPLIT_MODES:
        raise ValueError(f"split_mixed_steps must be one of {', '.join(SPLIT_MODES)}; got {mode!r}")
    return kernels.backend().split_mixed(mode)


def describe_engine(
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str,
    num_blocks: int,
    block_bytes: int,
    native_rows: int | None = None,
    split: bool = False,
    kv_dtype: torch.dtype | None = None,
) -> str:
    """The resolved configuration, as the one line an engine logs when it starts: what
    `auto` chose, and why, is visible without reading the code."""
    name = dtype_name(dtype)
    dtype_src = "auto" if config.dtype == "auto" else "set"
    if config.quantization != "auto":
        why = "set"
    elif config.dtype != "auto":
        why = f"auto: kept in {name} as the dtype was set explicitly"
    else:
        why = "auto"
    native = f", 4-bit native path up to {native_rows} rows" if native_rows else ""
    if native_rows:
        native += f", mixed steps {'split' if split else 'whole'}"
        if kernels.amx_available():
            layers, head = kernels.amx_min_rows()
            native += f", AMX tiles from {layers} rows (head {head})"
    if device.type == "cpu":
        isa = kernels.loaded_isa()
        native += f", kernels {isa.name if isa else 'none: torch products'}"
    pool_mb = num_blocks * block_bytes / 2**20
    kv_name = dtype_name(kv_dtype or dtype)
    kv_src = "auto" if config.kv_dtype == "auto" else "set"
    tier = redacted(config.kv_tier_url) if config.kv_tier_url else "off"
    if config.kv_tier_url and config.tensor_parallel_size > 1:
        tier += " (off: tensor parallel)"
    return (
        f"engine config: model={config.model} device={device} dtype={name} ({dtype_src}) "
        f"quantization={quantization} ({why}{native}) threads={config.cpu_threads()} "
        f"(small steps {config.small_step_cpu_threads()}) kv_pool={num_blocks} blocks x "
        f"{config.block_size} tokens ({pool_mb:.0f} MB, {kv_name} {kv_src}) "
        f"max_num_seqs={config.max_num_seqs} "
        f"tensor_parallel={config.tensor_parallel_size} "
        f"speculative={config.speculative_mode or 'off'} kv_tier={tier}"
    )


def kv_pool_bytes(
    config: EngineConfig, token_bytes: int, tokens_wanted: int, device: torch.device
) -> int:
    """The KV pool's size: ENGINE_KV_CACHE_MEMORY_MB, or with 0 by the model and the machine."""
    mb = config.kv_cache_memory_mb
    if mb < 0:
        raise ValueError(f"kv_cache_memory_mb must be 0 (by the machine) or more; got {mb}")
    if mb:
        return mb * 2**20
    return auto_pool_bytes(token_bytes, tokens_wanted, available_memory(device))


class ModelRunner:
    def __init__(
        self, config: EngineConfig, max_model_len: int | None = None, kv_tokens: int | None = None
    ) -> None:
        """`kv_tokens`: what an unsized pool holds (a draft model's, as many tokens as its
        target's pool), else every sequence at its full context (kv_budget.py)."""
        self.config = config
        self.device = resolve_device(config.device)
        model_config = load_config(config.model)
        widths = (
            model_config.hidden_size,
            model_config.intermediate_size // max(1, config.tensor_parallel_size),
        )
        self.quantization = resolve_quantization(
            config.quantization,
            self.device,
            resolve_dtype(config.dtype, self.device),
            all(k % 64 == 0 for k in widths),
            dtype_explicit=config.dtype != "auto",
        )
        self.dtype = resolve_dtype(config.dtype, self.device, self.quantization)
        self.kv_dtype = resolve_kv_dtype(
            config.kv_dtype, self.device, self.dtype, self.quantization
        )
        self.model = build_model(  # a DecoderModel, or rank 0 of tensor_parallel_size ranks
            config,
            dtype=self.dtype,
            device=self.device,
            quantization=self.quantization,
            max_len=max_model_len,
        )
        m = self.model
        self.block_size = config.block_size
        block_bytes = (
            2
            * m.num_layers
            * self.block_size
            * m.num_kv_heads
            * row_width(m.head_dim, self.kv_dtype)
            * self.kv_dtype.itemsize
        )
        # The context asked for, or the model's (the engine caps it by the pool).
        self.model_len = max_model_len or m.config.max_position_embeddings
        wanted = kv_tokens or config.max_num_seqs * self.model_len
        pool_bytes = kv_pool_bytes(config, block_bytes // self.block_size, wanted, self.device)
        self.kv_cache_mb = pool_bytes // 2**20
        self.num_blocks = max(2, pool_bytes // block_bytes)
        native = getattr(m, "native", None)
        self.split_mixed = split_mixed(config.split_mixed_steps)
        if config.batch_invariant not in INVARIANT_MODES:
            raise ValueError(
                f"batch_invariant must be one of {', '.join(INVARIANT_MODES)}; "
                f"got {config.batch_invariant!r}"
            )
        self.batch_invariant = config.batch_invariant
        log.info(
            "%s",
            describe_engine(
                config, self.device, self.dtype, self.quantization, self.num_blocks,
                block_bytes, native.max_rows if native is not None else None, self.split_mixed,
                self.kv_dtype,
            ),
        )  # fmt: skip
        # Per layer one pool, head-major: keys are heads [0, kv_heads), values the rest, so
        # one copy writes a step's K and V and one gather reads a sequence's context with
        # every head's tokens contiguous (what the attention matmuls want).
        compiled = self._compile_wanted()
        # CUDA graphs' padding rows write into a block of their own, past the manager's.
        graphs = compiled and self.device.type == "cuda"
        pool_blocks = self.num_blocks + 1 if graphs else self.num_blocks
        shape = (
            2 * m.num_kv_heads,
            pool_blocks,
            self.block_size,
            row_width(m.head_dim, self.kv_dtype),
        )
        self.kv_caches = [
            huge_pages.zeros(shape, self.kv_dtype, self.device) for _ in range(m.num_layers)
        ]
        self.compiled: CompiledStep | CudaGraphStep | None = None
        if graphs:
            self.compiled = self._cuda_graphs()
        elif compiled:
            self.compiled = self._compiled_step()

    def _compile_wanted(self) -> bool:
        mode = self.config.compile
        if mode not in COMPILE_MODES:
            choices = ", ".join(COMPILE_MODES)
            raise ValueError(f"compile must be one of {choices}; got {mode!r}")
        if mode == "off" or (mode == "auto" and not compile_wins(self.device)):
            return False
        reason = compile_unavailable_reason(self.model)
        if reason is not None:
            log.warning("the compiled step is off (%s): running the eager forward", reason)
            return False
        return True

    def _cuda_graphs(self) -> CudaGraphStep | None:
        """Decode steps as CUDA graphs, the row buckets captured now."""
        max_blocks = min(self.num_blocks, -(-self.model_len // self.block_size))
        try:
            step = CudaGraphStep(
                self.model, self.kv_caches, self.config.max_num_seqs, max_blocks,
                self.block_size, scratch_block=self.num_blocks,
            )  # fmt: skip
            log.info("capturing CUDA graphs for decode steps of %s rows...", step.buckets)
            with torch.inference_mode():
                step.capture_all()
        except Exception as exc:
            log.warning("capturing CUDA graphs failed, running the eager forward: %s", exc)
            return None
        return step

    def _compiled_step(self) -> CompiledStep | None:
        """The compiled forward for the torch path's steps, compiled (or loaded from the
        cache) now, or None where that fails (one logged warning)."""
        native = getattr(self.model, "native", None)
        # Past its first rows the native path takes decodes alone, so prompts' chunks from
        # any_chunk_rows + 1 rows on take the torch path: the compiled graph covers them.
        min_rows = native.any_chunk_rows + 1 if native is not None else 1
        try:
            step = CompiledStep(
                self.model, self.kv_caches, min_rows, self.config.max_num_batched_tokens
            )
            seconds = step.warm_up(lambda rows: self._warm_up(step, rows), log.info)
        except Exception as exc:
            log.warning("compiling the step failed, running the eager forward: %s", exc)
            return None
        how = "compiled, and cached for the next start" if step.compiled_now else "from the cache"
        log.info("compiled step ready: %.1f s extra at startup (%s)", seconds, how)
        return step

    @torch.inference_mode()
    def _warm_up(self, step: CompiledStep, rows: int) -> None:
        """One step of `rows` one-token sequences at position 0 of block 0, before any
        request: what they write there is overwritten by whichever sequence gets the block
        before it reads it."""
        seqs = []
        for i in range(rows):
            seq = Sequence(f"warm-up-{i}", [0], SamplingParams(max_tokens=1))
            seq.block_table = [0]
            seqs.append(seq)
        # The torch path's inputs, whichever path a real step of these rows would take.
        input_ids, meta, _ = self._prepare(seqs, [1] * rows, False)
        self._set_threads(False, rows)
        step.forward(input_ids, meta)

    def _forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, native: bool
    ) -> torch.Tensor:
        rows = input_ids.shape[0]
        step = self.compiled
        if step is not None and not native and step.handles(rows, meta):
            try:
                return step.forward(input_ids, meta)
            except Exception as exc:
                # Rerunning the step eagerly is safe: it writes the same K/V to the same slots.
                log.warning("the compiled step failed, running the eager forward: %s", exc)
                self.compiled = None
        hidden: torch.Tensor = self.model.forward(input_ids, meta, self.kv_caches)
        return hidden

    @torch.inference_mode()
    def read_blocks(self, block_ids: list[int]) -> list[torch.Tensor]:
        """A copy of these blocks' K and V on the CPU, per layer
        [2 * kv_heads, len(block_ids), block_size, head_dim].

        Per layer rather than one tensor: allocations of a few MB come back from the heap
        warm, while one of ~100 MB is a fresh mmap whose page faults cost more than the copy.
        """
        idx = torch.tensor(block_ids, device=self.device)
        return [cache.index_select(1, idx).cpu() for cache in self.kv_caches]

    @torch.inference_mode()
    def write_blocks(self, block_ids: list[int], kv: list[torch.Tensor]) -> None:
        """Put K and V shaped like read_blocks' into these blocks of the pool."""
        idx = torch.tensor(block_ids, device=self.device)
        for layer, cache in enumerate(self.kv_caches):
            cache.index_copy_(1, idx, kv[layer].to(self.device))

    @torch.inference_mode()
    def run(
        self, batch: ScheduledBatch, all_logits: bool = False
    ) -> tuple[list[Sequence], torch.Tensor]:
        """Run one step. Returns the sequences that sample a token now and their logits.

        A sequence samples when this step computes its last uncomputed token: one row of
        logits, or 1 + len(seq.draft_tokens) rows when it carries speculative guesses
        (its rows are consecutive, in the order of the returned sequences). With
        all_logits=True the logits of every input row come back instead (tests).
        """
        # Decodes first, shortest context first (so similar lengths end up grouped); chunks
        # too long for the native paged attention last.
        order = sorted(
            range(len(batch)),
            key=lambda i: (
                batch.num_tokens[i] != 1,
                batch.num_tokens[i] > PAGED_MAX_CHUNK,
                batch.seqs[i].num_computed_tokens,
            ),
        )
        seqs = [batch.seqs[i] for i in order]
        counts = [batch.num_tokens[i] for i in order]
        invariant = [i for i, s in enumerate(seqs) if s.cache_scope.invariant]
        parts: list[tuple[list[Sequence], list[int]]] | None
        if invariant and self._folds_invariant(seqs, counts):
            # Every row on the one-row products (_run_part's invariant), in one forward.
            parts = [(seqs, counts)]
        elif invariant:
            # Batch-invariant rows first, in a forward of their own.
            rest = [i for i in range(len(seqs)) if not seqs[i].cache_scope.invariant]
            parts = [([seqs[i] for i in invariant], [counts[i] for i in invariant])]
            if rest:
                parts.append(([seqs[i] for i in rest], [counts[i] for i in rest]))
        else:
            parts = self._split(seqs, counts)
        if parts is None:
            return self._run_part(seqs, counts, len(seqs), all_logits)
        # Each part's forward in turn (the invariant rows', the decodes', the chunks'): each
        # part's sampling rows in its order.
        done = [
            self._run_part(s, c, len(seqs), all_logits, any(x.cache_scope.invariant for x in s))
            for s, c in parts
        ]
        sampled = [seq for part_seqs, _ in done for seq in part_seqs]
        logits = [part_logits for _, part_logits in done if part_logits.numel()]
        return sampled, torch.cat(logits) if logits else torch.empty(0)

    def _split(
        self, seqs: list[Sequence], counts: list[int]
    ) -> list[tuple[list[Sequence], list[int]]] | None:
        """A step mixing prompts' chunks with decodes, as (decodes, chunks) to run as two
        forwards: the decodes (and speculative guesses) on the native path, the chunks on the
        torch path; None: one forward. On the torch path every row costs a float row of
        products, while the native path serves its rows from the 4-bit blocks on every core:
        past a few rows of decodes, two forwards take less than one (docs/performance.md,
        "Mixed steps")."""
        native = getattr(self.model, "native", None)
        if native is None or not self.split_mixed or self._native_step(seqs, counts):
            return None
        small = [i for i, n in enumerate(counts) if n <= native.any_chunk_rows]
        small_rows = sum(counts[i] for i in small)
        if len(small) == len(counts) or small_rows < SPLIT_MIN_ROWS:
            return None
        if not native.handles(small_rows, [counts[i] for i in small if counts[i] > 1]):
            return None
        large = [i for i, n in enumerate(counts) if n > native.any_chunk_rows]
        return [
            ([seqs[i] for i in small], [counts[i] for i in small]),
            ([seqs[i] for i in large], [counts[i] for i in large]),
        ]

    @property
    def invariant_rows(self) -> bool:
        """Whether this runner computes seeded requests' rows batch-invariant (_run_part's
        invariant): where the native path runs, unless configured off."""
        native = getattr(self.model, "native", None)
        return native is not None and self.batch_invariant == "seeded"

    def _folds_invariant(self, seqs: list[Sequence], counts: list[int]) -> bool:
        """Whether a step with batch-invariant rows runs all its rows as they do, in one
        forward: where the native path takes the whole step and a second forward would
        cost more than the one-row products cost the others' rows (cpu_backend's)."""
        rows = sum(counts)
        return self._native_step(seqs, counts) and rows <= invariant_fold_rows()

    def _run_part(
        self,
        seqs: list[Sequence],
        counts: list[int],
        streams: int,
        all_logits: bool,
        invariant: bool = False,
    ) -> tuple[list[Sequence], torch.Tensor]:
        """One forward over these sequences (ordered as run() orders them) and the logits of
        their sampling rows; `streams`: the whole step's, which set its threads.

        invariant: every row, a prompt's as a decode's, goes through the native path as a
        step of one row would (the products and the head picked for one row, attention row
        by row; each gives a row the same bits at any number of rows), so a row's bits do
        not depend on the step's other rows, on how its prompt was chunked or on whether
        its prefix came from the cache (whose blocks CacheScope.invariant keeps apart)."""
        native = invariant or self._native_step(seqs, counts)
        input_ids, meta, sample_rows = self._prepare(seqs, counts, native)
        if invariant:
            meta.as_rows = 1
        elif guesses := sum(
            # Speculative guesses ride after a sequence's last token.
            max(0, s.num_computed_tokens + n - len(s))
            for s, n in zip(seqs, counts, strict=True)
        ):
            meta.as_rows = sum(counts) - guesses
        self._set_threads(native, streams, pooled=self._pooled(sum(counts)))
        if invariant:
            hidden = self.model.native.forward(input_ids, meta, self.kv_caches)
        else:
            hidden = self._forward(input_ids, meta, native)
        if all_logits:
            return seqs, self.model.compute_logits(hidden, meta.as_rows)
        sampling = [s for s, r in zip(seqs, sample_rows, strict=True) if r is not None]
        rows = [r for r in sample_rows if r is not None]
        as_rows = 1 if invariant else None
        if any(s.draft_tokens for s in sampling):
            if not invariant:
                as_rows = len(rows)
            # A sequence checking k guesses needs the logits of its last k + 1 rows.
            rows = [
                i
                for s, r in zip(sampling, rows, strict=True)
                for i in range(r - len(s.draft_tokens), r + 1)
            ]
        if not rows:
            return [], torch.empty(0)
        if len(rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(rows, device=self.device)]
        return sampling, self.model.compute_logits(hidden, as_rows)

    def _native_step(self, seqs: list[Sequence], counts: list[int]) -> bool:
        """Whether this step takes the native path (native_decode.py)."""
        native = getattr(self.model, "native", None)
        if native is None:
            return False
        return bool(native.handles(sum(counts), [n for n in counts if n > 1]))

    def _pooled(self, rows: int) -> str | None:
        """Which 4-bit product a torch-path step of `rows` rows runs in the kernels' pool
        (bf16 activations, AMX's tiles or 16-bit activations: model.prompt_blocks), or None
        where its products are torch's."""
        layers = getattr(self.model, "layers", None)
        if not layers:
            return None
        # A GGUF's Q8_0 products have no prompt_rows (a Q4_K_M file's q/k/v where its v is
        # Q6_K): the layer's 4-bit ones say.
        first = layers[0]
        lin = max((first.qkv, first.o, first.gate_up, first.down), key=lambda x: x.prompt_rows)
        if rows > int(lin.prompt_rows):
            return None
        return str(lin.prompt_product)

    def _set_threads(self, native: bool, streams: int, pooled: str | None = None) -> None:
        """`pooled`: the product of a torch-path step whose products run in the kernels'
        pool (_pooled)."""
        if self.device.type != "cpu":
            return
        pool, want = kernels.backend().step_threads(
            native, streams, pooled, self.config.cpu_threads(), self.config.small_step_cpu_threads()
        )
        kernels.set_threads(pool)
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def _prepare(
        self, seqs: list[Sequence], counts: list[int], native: bool
    ) -> tuple[torch.Tensor, AttentionMetadata, list[int | None]]:
        if native or getattr(self.model, "paged", None) is None:
            return self._prepare_grouped(seqs, counts, masks=not native)
        long = [n > PAGED_MAX_CHUNK for n in counts]
        if long != sorted(long):  # the long chunks must come last (run() orders them so)
            return self._prepare_grouped(seqs, counts)
        return self._prepare_flat(seqs, counts)

    def _prepare_flat(
        self, seqs: list[Sequence], counts: list[int]
    ) -> tuple[torch.Tensor, AttentionMetadata, list[int | None]]:
        """The step's inputs for the native paged attention: per row its token, position and
        sequence, per sequence its block table; no slots, groups or masks (the kernel takes
        each row's slot from its table). Built with list slices and ranges, no loop per token."""
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        row_seq: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int | None] = []
        long_chunks: list[tuple[int, int, int, int]] = []  # (seq index, row, start, n)
        num_decodes = 0
        for i, (seq, n) in enumerate(zip(seqs, counts, strict=True)):
            start = seq.num_computed_tokens
            end = start + n
            row = len(ids)
            if n == 1:
                ids.append(seq.token_ids[start])
                positions.append(start)
                row_seq.append(i)
                num_decodes += 1
            else:
                ids.extend(seq.token_ids[start:end])
                if end > len(seq):  # speculative guesses ride after the last token
                    ids.extend(seq.draft_tokens[: end - len(seq)])
                positions.extend(range(start, end))
                row_seq.extend([i] * n)
                if n > PAGED_MAX_CHUNK:
                    long_chunks.append((i, row, start, n))
            tables.append(seq.block_table[: -(-end // bs)])
            sample_rows.append(row + n - 1 if end >= len(seq) else None)
        width = max(len(t) for t in tables)
        for t in tables:
            if len(t) < width:
                t.extend([0] * (width - len(t)))
        dev = self.device
        table_t = torch.tensor(tables, device=dev)
        meta = AttentionMetadata(
            positions=torch.tensor(positions, device=dev),
            slot_mapping=torch.empty(0, dtype=torch.long, device=dev),
            num_decodes=num_decodes,
            row_seq=torch.tensor(row_seq, dtype=torch.int32, device=dev),
            tables=table_t,
            paged_rows=long_chunks[0][1] if long_chunks else len(ids),
        )
        for i, row, start, n in long_chunks:
            table = table_t[i, : -(-(start + n) // bs)]
            pos = meta.positions[row : row + n]
            slots = table[pos // bs] * bs + pos % bs
            meta.prefills.append(PrefillChunk(row, n, start + n, table, slots))
        return torch.tensor(ids, device=dev), meta, sample_rows

    def _prepare_grouped(
        self, seqs: list[Sequence], counts: list[int], masks: bool = True
    ) -> tuple[torch.Tensor, AttentionMetadata, list[int | None]]:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int | None] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        for seq, n in zip(seqs, counts, strict=True):
            start = seq.num_computed_tokens
            end = start + n
            row = len(ids)
            ids.extend(seq.token_ids[start:end])
            if end > len(seq):  # speculative guesses ride after the last token
                ids.extend(seq.draft_tokens[: end - len(seq)])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            num_blocks = -(-end // bs)
            if n == 1:
                decode_tables.append(table[:num_blocks])
                decode_lens.append(end)
            else:
                block_table = torch.tensor(table[:num_blocks], device=self.device)
                prefills.append(PrefillChunk(row, n, end, block_table))
            sample_rows.append(row + n - 1 if end >= len(seq) else None)

        dev = self.device
        meta = AttentionMetadata(
            positions=torch.tensor(positions, device=dev),
            slot_mapping=torch.tensor(slots, device=dev),
            num_decodes=len(decode_tables),
            prefills=prefills,
        )
        # masks=False: the native path reads only the block tables and positions.
        start = 0
        for group in _group_by_length(decode_lens):
            tables = [decode_tables[i] for i in group]
            lens = [decode_lens[i] for i in group]
            meta.decode_groups.append(self._decode_group(start, tables, lens, masks))
            start += len(group)
        return torch.tensor(ids, device=dev), meta, sample_rows

    def _decode_group(
        self, start: int, tables: list[list[int]], lens: list[int], masks: bool = True
    ) -> DecodeGroup:
        bs, dev = self.block_size, self.device
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        mask = None
        if masks and min(lens) < width * bs:
            key_pos = torch.arange(width * bs, device=dev)
            blocked = key_pos[None, :] >= torch.tensor(lens, device=dev)[:, None]
            mask = torch.zeros(blocked.shape, dtype=self.dtype, device=dev)
            mask.masked_fill_(blocked, float("-inf"))
            mask = mask[:, None, None, :]  # [count, 1, 1, ctx]
        return DecodeGroup(start, len(tables), torch.tensor(padded, device=dev), mask)


def _group_by_length(lens: list[int], min_len: int = 256) -> list[list[int]]:
    """Split ascending context lengths where padding to the group's longest would more than
    double the work; short contexts (under min_len) always share one group."""
    groups: list[list[int]] = []
    for i, n in enumerate(lens):
        if groups and (n <= min_len or n <= 2 * lens[groups[-1][0]]):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
