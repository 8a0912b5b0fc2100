"""The native kernels are built ahead, never by a serving process: a wheel carries their
sources and builds them at setup (python -m inference.engine.kernels.build), and a machine
with no C compiler serves on torch's products, says so, and answers the same.

Both run against a fresh virtual environment holding the wheel of this checkout, with this
environment's packages (torch, transformers) visible beneath it rather than downloaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.engine.test_engine import _hf_greedy

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # The fresh environment's own package, not this checkout's: no PYTHONPATH, cwd elsewhere.
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    # A copy as a clean clone has it: no built libraries, and the wheel build's folders
    # stay out of this checkout.
    skip = shutil.ignore_patterns("__pycache__", "built", "*.so", "migrations_cache")
    for package in ("chatapp", "inference"):
        shutil.copytree(REPO / package, src / package, ignore=skip)
    shutil.copy(REPO / "pyproject.toml", src)
    wheel = _run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(root / "dist")],
        cwd=root,
    )  # fmt: skip
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=root).stdout.strip()  # fmt: skip
    # A plain path line: this environment's packages, but not its editable checkout (whose
    # finder only a .pth's import line would install).
    (Path(site) / "outer_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (whl,) = (root / "dist").glob("chatapp-*.whl")
    install = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(whl)],
        cwd=root,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-2000:]
    return python


def _built_dir(python: Path) -> Path:
    code = "from inference.engine.kernels.library import BUILT_DIR; print(BUILT_DIR)"
    built = Path(_run([str(python), "-c", code], cwd=python.parent).stdout.strip())
    assert built.is_relative_to(python.parents[1]), f"{built} is not the wheel's"
    return built


def test_a_wheel_carries_the_kernels_sources_and_builds_them_at_setup(fresh_python, tmp_path):
    shutil.rmtree(_built_dir(fresh_python), ignore_errors=True)
    built = _run([str(fresh_python), "-m", "inference.engine.kernels.build"], cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr[-2000:]
    assert "kernels: chose " in built.stdout
    product = (
        "import torch\n"
        "from inference.engine import kernels\n"
        "from inference.engine.quantized import Q4_1\n"
        "x = torch.randn(3, 256)\n"
        "q = Q4_1.quantize(torch.randn(64, 256) * 0.05).for_kernel()\n"
        "want = x @ q.dequantize().T\n"
        "assert ((q.matmul_t(x) - want).norm() / want.norm()).item() < 0.01\n"
        "print(kernels.loaded_isa().name)\n"
    )
    ran = _run([str(fresh_python), "-c", product], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert f"kernels: chose {ran.stdout.strip()} " in built.stdout


def test_without_a_compiler_the_engine_serves_on_torch_and_says_so(
    fresh_python: Path, tmp_path: Path, tiny_model_path: Path, hf_tiny: LlamaForCausalLM
):
    shutil.rmtree(_built_dir(fresh_python), ignore_errors=True)
    no_cc = {"CC": str(tmp_path / "no-such-cc"), "PATH": str(tmp_path)}
    built = _run([str(fresh_python), "-m", "inference.engine.kernels.build"], tmp_path, **no_cc)
    assert built.returncode == 1
    assert "no C compiler" in built.stdout and "the engine uses torch" in built.stdout
    prompt = torch.randint(0, 1000, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    serve = (
        "import json, sys\n"
        "from inference.engine import EngineConfig, SamplingParams\n"
        "from inference.engine.engine import LLMEngine\n"
        "from inference.engine.model_runner import resolve_quantization, resolve_device\n"
        f"engine = LLMEngine(EngineConfig(model={str(tiny_model_path)!r}, dtype='float32',\n"
        "                                 quantization='none', kv_cache_memory_mb=8))\n"
        f"engine.add_request({prompt}, SamplingParams(max_tokens=8, temperature=0.0,\n"
        "                                             ignore_eos=True), request_id='r')\n"
        "ids = []\n"
        "while engine.has_work():\n"
        "    ids += [t for d in engine.step() for t in d.token_ids]\n"
        "auto = resolve_quantization('auto', resolve_device('cpu'), __import__('torch').float32)\n"
        "print(json.dumps({'ids': ids, 'auto': auto}))\n"
    )
    ran = _run([str(fresh_python), "-c", serve], tmp_path, **no_cc)
    assert ran.returncode == 0, ran.stderr[-2000:]
    said = "native kernels off, the engine uses torch's products: they are not built"
    assert ran.stderr.count(said) == 1, ran.stderr[-2000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["ids"] == _hf_greedy(hf_tiny, prompt, 8)
    assert out["auto"] == "fp16"  # the 4-bit weights need the kernels
