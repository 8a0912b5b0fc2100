"""The names this module held before the architectures moved to models/ and layers/, kept
for code that still imports them from here. New code imports from where they live."""

from inference.engine.layers.attention import (
    PAGED_MAX_CHUNK,
    AttentionMetadata,
    DecodeGroup,
    PrefillChunk,
)
from inference.engine.layers.linear import (
    AMX_BLOCK_ROWS,
    AMX_COLUMNS,
    BF16_BLOCK_ROWS,
    HYBRID_MAX_ROWS,
    I16_BLOCK_ROWS,
    QUANTIZATIONS,
    Linear,
    WeightFormats,
    blocks_take_every_row,
    default_native_max_rows,
    head_block_rows,
    prompt_blocks,
)
from inference.engine.layers.rotary import rope_rotation_sin, rope_tables
from inference.engine.models import DecoderModel, load_config, load_model, load_weights
from inference.engine.models.base import check_tensor_parallel_size
from inference.engine.models.loader import BLOCKS_FILE, load_blocks, save_blocks

__all__ = [
    "AMX_BLOCK_ROWS", "AMX_COLUMNS", "BF16_BLOCK_ROWS", "BLOCKS_FILE", "HYBRID_MAX_ROWS",
    "I16_BLOCK_ROWS", "PAGED_MAX_CHUNK", "QUANTIZATIONS", "AttentionMetadata", "DecodeGroup",
    "DecoderModel", "Linear", "PrefillChunk", "WeightFormats", "blocks_take_every_row",
    "check_tensor_parallel_size", "default_native_max_rows", "head_block_rows", "load_blocks",
    "load_config", "load_model", "load_weights", "prompt_blocks", "rope_rotation_sin",
    "rope_tables", "save_blocks",
]  # fmt: skip
