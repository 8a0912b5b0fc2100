# ruff: noqa: E501  (a jinja template, kept as the model families write it)
"""A tiny random-weight llama whose chat template has a tool format: ChatML with the
Hermes / Qwen2.5 tool section (`<tools>` in the system turn, calls as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, results as `<tool_response>`),
on the default model's tokenizer. The bundled template has no tool format."""

from __future__ import annotations

from pathlib import Path

from tests.tiny_model import build_tiny_llama

HERMES_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, \
"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{%- set call = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def build_tiny_tool_llama(folder: Path, tokenizer_source: Path) -> Path:
    """build_tiny_llama's model with HERMES_TEMPLATE as its chat template."""
    build_tiny_llama(folder, tokenizer_source)
    (folder / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    return folder
