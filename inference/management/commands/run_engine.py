"""Run the engine as its own process: an engine worker (docs/workers.md).

The worker loads the engine, registers in Redis (ENGINE_WORKERS_REDIS_URL) with a
heartbeat carrying its load, and serves the web processes that run with
ENGINE_MODE=distributed. Start as many as the machine holds; each takes its share.
SIGTERM or Ctrl-C: it stops taking work, gives in-flight replies ENGINE_WORKER_DRAIN_S
to finish, ends the rest with a clear error, deregisters and exits.

A worker serves one model: the default (CHATAPP_MODEL), or `--model NAME` (a name from
CHATAPP_MODELS), `--model NAME=FOLDER` or `--model FOLDER`; it registers under that name
and the web processes route requests for that model to it.

`--check` loads the model, generates one token and exits 0. `--alive` exits 0 when a
worker on this host has a current heartbeat (the compose healthcheck: it loads nothing).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.catalog import ModelSpec, is_model_path, parse_model_list, served_models
from inference.client import engine_config_from_settings
from inference.engine import SamplingParams
from inference.engine.errors import UnsupportedModelError

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run an engine worker in this process (or --check that the engine can start)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="load, generate one token, exit")
        parser.add_argument(
            "--alive", action="store_true", help="exit 0 if a worker on this host is registered"
        )
        parser.add_argument(
            "--model",
            default="",
            help="the model to serve: a name from CHATAPP_MODELS, NAME=FOLDER or FOLDER "
            "(default: CHATAPP_MODEL)",
        )
        parser.add_argument("--stats-every", type=float, default=30.0)

    def handle(self, *args: object, **options: Any) -> None:
        if options["alive"]:
            self._alive()
            return
        from inference.engine import AsyncEngine

        spec = self._model(options["model"])
        started = time.monotonic()
        try:
            engine = AsyncEngine(engine_config_from_settings({"MODEL": spec.path}))
        except UnsupportedModelError as exc:
            # Refused before registering: no request is ever routed to this worker.
            raise CommandError(f"model {spec.name} is refused: {exc}") from exc
        try:
            asyncio.run(self._warm_up(engine))
        except Exception as exc:
            engine.shutdown()
            raise CommandError(f"the engine cannot generate: {exc}") from exc
        self.stdout.write(f"engine ready in {time.monotonic() - started:.1f}s ({spec.name})")
        if options["check"]:
            engine.shutdown()
            return
        try:
            asyncio.run(self._serve(engine, spec, float(options["stats_every"])))
        finally:
            engine.shutdown()

    @staticmethod
    def _model(option: str) -> ModelSpec:
        """The model `--model` names (default: the default model)."""
        try:
            cfg = settings.ENGINE
            specs = served_models(str(cfg["MODEL"]), list(cfg.get("MODELS") or ()))
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not option:
            return specs[0]
        named = next((s for s in specs if s.name == option), None)
        if named is not None:
            return named
        try:
            given = parse_model_list(option)
        except ValueError as exc:
            raise CommandError(str(exc).replace("CHATAPP_MODELS", "--model")) from exc
        if len(given) != 1 or ("=" not in option and not is_model_path(given[0].path)):
            names = ", ".join(s.name for s in specs)
            raise CommandError(
                f"--model {option!r} is neither a model name ({names}) nor a model folder "
                "or GGUF file"
            )
        return given[0]

    async def _serve(self, engine: Any, spec: ModelSpec, stats_every: float) -> None:
        from inference.workers.server import WorkerServer

        cfg = settings.ENGINE
        server = WorkerServer(
            engine,
            url=cfg["WORKERS_REDIS_URL"],
            namespace=cfg["WORKERS_NAMESPACE"],
            worker_id=cfg["WORKER_ID"] or None,
            model=spec.name,
            model_path=os.path.abspath(spec.path),
            flush_s=cfg["WORKER_FLUSH_MS"] / 1000,
            dead_after_s=float(cfg["WORKER_DEAD_AFTER_S"]),
            drain_s=float(cfg["WORKER_DRAIN_S"]),
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.stdout.write(f"engine worker {server.id} serving {spec.name}", ending="\n")
        self.stdout.flush()
        reporter = asyncio.create_task(self._report(engine, stats_every))
        try:
            await server.run(stop)
        finally:
            reporter.cancel()

    @staticmethod
    async def _report(engine: Any, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            log.info("engine stats: %s", engine.stats())

    @staticmethod
    async def _warm_up(engine: Any) -> None:
        ids = engine.tokenizer.encode("Hello", add_special_tokens=False)
        async for _ in engine.generate(ids, SamplingParams(max_tokens=1, temperature=0)):
            pass

    def _alive(self) -> None:
        from redis import Redis
        from redis.exceptions import RedisError

        from inference.workers.registry import live_workers_sync

        cfg = settings.ENGINE
        host = socket.gethostname()
        try:
            redis = Redis.from_url(
                cfg["WORKERS_REDIS_URL"], socket_connect_timeout=2, socket_timeout=2
            )
            workers = live_workers_sync(redis, cfg["WORKERS_NAMESPACE"])
        except (RedisError, OSError) as exc:
            raise CommandError(f"cannot reach Redis at {cfg['WORKERS_REDIS_URL']}: {exc}") from exc
        mine = [w.id for w in workers if w.host == host]
        if not mine:
            raise CommandError(f"no engine worker on {host} has a current heartbeat")
        self.stdout.write(f"alive: {', '.join(mine)}")
