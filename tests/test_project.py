"""The project's own files: docker compose, the two commands, settings."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


APP_SERVICES = ("web", "engine", "engine-gpu", "celery-worker", "celery-worker-long", "celery-beat")


def test_job_files_live_on_a_volume_the_web_and_the_workers_share() -> None:
    """The long queue writes exports and plots under VAR_DIR/jobs; web serves them."""
    data = compose()
    for name in ("web", "celery-worker", "celery-worker-long"):
        assert "job-files:/app/var/jobs" in data["services"][name]["volumes"], name
    assert "job-files" in data["volumes"]


def test_app_services_wait_for_the_schema_and_both_redis() -> None:
    services = compose()["services"]
    for name in APP_SERVICES:
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        for store in ("postgres", "redis", "redis-kv"):
            assert deps[store]["condition"] == "service_healthy", (name, store)
    assert services["redis-kv"]["healthcheck"]


def test_web_scales_behind_a_proxy_that_passes_websocket_upgrades() -> None:
    services = compose()["services"]
    assert "ports" not in services["web"], "a fixed host port stops `--scale web=N`"
    assert services["proxy"]["build"]["target"] == "proxy"
    assert "FROM debian:bookworm-slim AS proxy" in (ROOT / "Dockerfile").read_text()
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server web:8000;" in conf
    for line in (
        "proxy_set_header Upgrade $http_upgrade;",
        "proxy_set_header Connection $connection_upgrade;",
        "proxy_http_version 1.1;",
        "proxy_buffering off;",
    ):
        assert line in conf, line


def test_the_gpu_profile_replaces_the_cpu_engine_worker() -> None:
    """Routing spreads a model's requests over every worker that registers it: a CPU worker
    left beside the GPU one would take its share. The CPU worker is the `cpu` profile's,
    on by default through .env; `--profile gpu` replaces the default."""
    services = compose()["services"]
    assert services["engine"]["profiles"] == ["cpu"]
    assert services["engine-gpu"]["profiles"] == ["gpu"]
    assert "COMPOSE_PROFILES=cpu" in (ROOT / ".env").read_text().splitlines()


def test_every_service_has_a_memory_limit() -> None:
    for name, svc in compose()["services"].items():
        assert svc.get("mem_limit"), name


def test_the_build_context_leaves_out_the_hosts_environment_and_outputs() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "var/", "*.sqlite3", "frontend/node_modules", "frontend/dist"):
        assert entry in ignored, entry
    for entry in ("test-artifacts/", "bench-results/", ".pytest_cache", ".mypy_cache"):
        assert entry in ignored, entry


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_docker_compose_reads_the_file() -> None:
    """Compose's own parser, where it is installed (apt's docker-compose is enough)."""
    command = compose_command()
    if command is None:
        pytest.skip("docker compose is not installed")
    for profiles in ([], ["--profile", "gpu"]):
        out = subprocess.run(
            [*command, *profiles, "config", "--quiet"],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SECRET_KEY": "compose-config-check"},
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr


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
    for command in (
        "ruff check .",
        "ruff format --check .",
        ".venv/bin/mypy",
        "lint-imports",
        "tsc --noEmit",
    ):
        assert command in check_sh, command
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert {h["id"] for h in hooks} == {"ruff-check", "ruff-format", "mypy", "lint-imports", "tsc"}


def test_the_check_script_fails_and_names_every_failing_check(tmp_path: Path) -> None:
    """scripts/check.sh on a tiny project with a lint, a format, a type error and an import
    that breaks its layering contract."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check.sh", tmp_path / "scripts" / "check.sh")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mypy]\nfiles = ["pkg"]\n\n[tool.importlinter]\nroot_packages = ["pkg"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "low never imports high"\n'
        'type = "forbidden"\nsource_modules = ["pkg.low"]\nforbidden_modules = ["pkg.high"]\n'
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import os\nx: int = 'text'\ny=1\n")
    (tmp_path / "pkg" / "high.py").write_text("")
    (tmp_path / "pkg" / "low.py").write_text("import pkg.high\n\nz = pkg.high\n")
    run = subprocess.run(
        ["bash", "scripts/check.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "checks failed: ruff check, ruff format, mypy, lint-imports" in run.stderr
    assert 'Incompatible types in assignment (expression has type "str"' in run.stdout
    assert "low never imports high BROKEN" in run.stdout
    # Fixed, the same tree passes.
    (tmp_path / "pkg" / "__init__.py").write_text("x: int = 1\n")
    (tmp_path / "pkg" / "low.py").write_text("")
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
    from tools.live_server import WEBSOCKET_LIMITS

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


# --- the layout in docs/architecture.md -----------------------------------------------

# Django's own folders inside an app, named by the convention rather than the layout.
CONVENTIONAL = {"migrations", "management", "commands", "templates", "static", "__pycache__"}


def documented_layout() -> list[Path]:
    """Every path the layout in docs/architecture.md names: an entry is the text of a line
    before its description (two spaces or more), one or several names separated by commas,
    nested by indentation (two spaces a level); lines indented as far as descriptions
    continue one."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layout\n", 1)[1].split("```\n", 2)[1]
    parents: list[tuple[int, Path]] = []
    named = []
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= 20:
            continue
        entry = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        base = parents[-1][1] if parents else ROOT
        for name in (n.strip() for n in entry.split(",")):
            if name:
                named.append(base / name.rstrip("/"))
                if name.endswith("/"):
                    parents.append((indent, base / name.rstrip("/")))
    return named


def test_the_documented_layout_names_only_what_exists() -> None:
    missing = [str(p.relative_to(ROOT)) for p in documented_layout() if not p.exists()]
    assert not missing, f"docs/architecture.md's layout names what is not there: {missing}"


def test_the_documented_layout_names_every_package_folder() -> None:
    named = set(documented_layout())
    packages = [
        init.parent
        for top in ("chatapp", "inference")
        for init in (ROOT / top).rglob("__init__.py")
        if not CONVENTIONAL & set(init.parent.relative_to(ROOT).parts)
    ]
    unnamed = sorted(str(p.relative_to(ROOT)) for p in packages if p not in named)
    assert not unnamed, f"docs/architecture.md's layout leaves out these packages: {unnamed}"


def test_every_engine_setting_is_read_from_its_variable() -> None:
    """settings.ENGINE has one entry per EngineConfig field, read from ENGINE_<FIELD> (the
    model from CHATAPP_MODEL), and engine_config_from_settings passes each one on."""
    code = (
        "import dataclasses, django, json; django.setup(); "
        "from inference.client import engine_config_from_settings; "
        "print(json.dumps(dataclasses.asdict(engine_config_from_settings())))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatapp.settings.dev",
        "CHATAPP_MODEL": "/models/other",
        "ENGINE_BLOCK_SIZE": "32",
        "ENGINE_KV_TIER_TTL_S": "5",
        "ENGINE_ENABLE_PREFIX_CACHING": "false",
        "ENGINE_SPECULATIVE_MIN_ACCEPTANCE": "0.5",
        "ENGINE_SPECULATIVE_MODE": "ngram",
    }
    env.pop("ENGINE_KV_TIER_NAMESPACE", None)  # the test run's own (chatapp/settings/test.py)

    def config_under(env: dict[str, str]) -> dict:
        run = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout.splitlines()[-1])

    config = config_under(env)
    assert config["model"] == "/models/other"
    assert config["block_size"] == 32 and config["kv_tier_ttl_s"] == 5
    assert config["enable_prefix_caching"] is False
    assert config["speculative_min_acceptance"] == 0.5
    assert config["speculative_mode"] == "ngram"
    # The app's own defaults where they differ from the library's; the rest are its.
    assert config["kv_tier_url"] == "redis://127.0.0.1:6379/4"
    assert config["kv_tier_namespace"] == "kvtier" and config["kv_tier_max_mb"] == 2048
    # Speculation: "auto" unless set; set empty, off.
    for value, mode in ((None, "auto"), ("", "")):
        env.pop("ENGINE_SPECULATIVE_MODE", None)
        if value is not None:
            env["ENGINE_SPECULATIVE_MODE"] = value
        assert config_under(env)["speculative_mode"] == mode


def test_every_dependency_is_pinned_in_the_constraints_every_install_uses() -> None:
    """A dependency's new release reaches an install only through constraints.txt, which
    scripts/lock.sh writes from a tested venv (redis-py 8's read timeout broke the chat's
    channel layer unseen when redis was a bare range)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    for text in wanted:
        req = Requirement(text)
        if req.name == "torch":
            continue  # pinned exactly in pyproject.toml itself (the CPU build's file)
        pin = pins.get(canonicalize_name(req.name))
        assert pin, f"{req.name} is not in constraints.txt: run scripts/lock.sh"
        assert req.specifier.contains(pin, prereleases=True), f"{req.name}=={pin} vs {text}"
    for installer in ("scripts/setup.sh", "Dockerfile"):
        assert "-c constraints.txt" in (ROOT / installer).read_text(), installer
