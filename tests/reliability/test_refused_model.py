"""A model the engine cannot serve stops the process that would serve it, at start and by
name: the web server exits non-zero instead of answering 503 for good, and an engine worker
exits before it registers. Real processes, started as a deployment starts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.tiny_model import build_tiny_llama
from tools.live_server import DjangoProcess, LiveServer


def _unknown_architecture(folder: Path) -> Path:
    folder.mkdir()
    config = {"model_type": "mamba", "architectures": ["MambaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _server_fails_to_start(workdir: Path, model: Path) -> tuple[int | None, str]:
    srv = LiveServer(workdir, model)
    with pytest.raises(RuntimeError, match="server exited"):
        srv.start()
    assert srv.proc is not None
    return srv.proc.wait(timeout=30), srv.log.read_text()


def test_the_web_server_exits_naming_an_unsupported_architecture(tmp_path):
    status, log = _server_fails_to_start(tmp_path, _unknown_architecture(tmp_path / "m"))
    assert status != 0
    assert "model type 'mamba' (MambaForCausalLM) is not supported; supported: " in log


def test_the_web_server_exits_naming_a_tensor_missing_from_its_model(tmp_path, real_model_dir):
    folder = build_tiny_llama(tmp_path / "m", real_model_dir)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    status, log = _server_fails_to_start(tmp_path, folder)
    assert status != 0
    assert "'layers.1.mlp.down_proj.weight' is missing" in log


def test_an_engine_worker_refuses_an_unsupported_model_before_registering(tmp_path):
    model = _unknown_architecture(tmp_path / "m")
    proc = DjangoProcess(tmp_path, model)
    with pytest.raises(RuntimeError) as err:
        proc.manage("run_engine", "--check", "--model", str(model))
    assert "is refused: model type 'mamba' (MambaForCausalLM) is not supported" in str(err.value)
