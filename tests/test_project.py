"""The project's own files: docker compose, the two commands, settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_every_service_with_a_real_command() -> None:
    services = compose()["services"]
    assert {"web", "redis", "postgres", "celery-worker", "celery-beat", "engine"} <= set(services)
    commands = {name: svc.get("command") for name, svc in services.items()}
    assert commands["web"][:1] == ["daphne"] and "chatapp.asgi:application" in commands["web"]
    assert commands["celery-worker"][:4] == ["celery", "-A", "chatapp", "worker"]
    assert commands["celery-beat"][:4] == ["celery", "-A", "chatapp", "beat"]
    # Every `manage.py X` a service runs is a command the project has.
    from django.core.management import get_commands

    known = set(get_commands())
    for name, cmd in commands.items():
        if cmd is None:
            continue  # an image's own entry point (postgres)
        words = cmd if isinstance(cmd, list) else [cmd]
        text = " ".join(words)
        for part in text.split("manage.py ")[1:]:
            assert part.split()[0] in known, (name, part)


def test_compose_services_have_healthchecks_and_volumes() -> None:
    data = compose()
    for name in ("postgres", "redis", "web", "engine", "celery-worker"):
        assert "healthcheck" in data["services"][name], name
    assert {"postgres-data", "model-cache"} <= set(data["volumes"])
    assert (ROOT / "Dockerfile").is_file()


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make run" in readme


def test_make_test_runs_every_static_check_before_the_tests() -> None:
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    # A failed check fails the run without stopping it (the tests still run).
    assert "scripts/check.sh || status=$?" in test_sh
    assert test_sh.index("scripts/check.sh") < test_sh.index("-m pytest")
    check_sh = (ROOT / "scripts" / "check.sh").read_text()
    for command in ("ruff check .", "ruff format --check .", ".venv/bin/mypy", "tsc --noEmit"):
        assert command in check_sh, command
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert {h["id"] for h in hooks} == {"ruff-check", "ruff-format", "mypy", "tsc"}


def test_the_check_script_fails_and_names_every_failing_check(tmp_path: Path) -> None:
    """scripts/check.sh on a tiny project with a lint, a format and a type error."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check.sh", tmp_path / "scripts" / "check.sh")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "pyproject.toml").write_text('[tool.mypy]\nfiles = ["pkg"]\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import os\nx: int = 'text'\ny=1\n")
    run = subprocess.run(
        ["bash", "scripts/check.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "checks failed: ruff check, ruff format, mypy" in run.stderr
    assert 'Incompatible types in assignment (expression has type "str"' in run.stdout
    # Fixed, the same tree passes.
    (tmp_path / "pkg" / "__init__.py").write_text("x: int = 1\n")
    run = subprocess.run(
        ["bash", "scripts/check.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checks passed" in run.stdout


def test_production_settings_pass_the_deploy_check() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatapp.settings.production",
        "DJANGO_SECRET_KEY": "x" * 64 + "-not-a-real-secret-but-long-and-random-enough-3f9a",
        "ENGINE_PRELOAD": "false",
    }
    out = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_engine_library_imports_nothing_from_django() -> None:
    for path in (ROOT / "inference" / "engine").rglob("*.py"):
        text = path.read_text()
        assert "import django" not in text and "from django" not in text, path


def test_every_server_launcher_lifts_daphnes_websocket_cap_above_the_apps_frame_limit() -> None:
    """Past daphne's own cap a frame drops the connection (1006) instead of getting the
    app's `frame_too_large`: every launcher sets the cap to 16 MiB."""
    from tests.live_server import WEBSOCKET_LIMITS

    launchers = {
        "compose": " ".join(compose()["services"]["web"]["command"]),
        "Dockerfile": (ROOT / "Dockerfile").read_text(),
        "run.sh": (ROOT / "scripts" / "run.sh").read_text(),
        "live_server": " ".join(WEBSOCKET_LIMITS),
    }
    for name, text in launchers.items():
        for flag in ("--websocket-max-message-size", "--websocket-max-frame-size"):
            assert flag in text, (name, flag)
        assert "16777216" in text, name
