"""Run the engine as its own process.

`--check` loads the model, generates one token and exits 0 (the compose healthcheck).
Without it the process keeps the engine loaded and logs its figures; web processes
reach it once the distributed engine mode lands (issue 4: Redis channel layer and
session affinity). Until then the web service runs the engine embedded.
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.core.management.base import BaseCommand, CommandError

from inference.client import engine_config_from_settings
from inference.engine import SamplingParams

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the inference engine in this process (or --check that it can start)."

    def add_arguments(self, parser) -> None:  # type: ignore[no-untyped-def]
        parser.add_argument("--check", action="store_true", help="load, generate one token, exit")
        parser.add_argument("--stats-every", type=float, default=30.0)

    def handle(self, *args: object, **options: object) -> None:
        from inference.engine import AsyncEngine

        started = time.monotonic()
        engine = AsyncEngine(engine_config_from_settings())
        try:
            asyncio.run(self._warm_up(engine))
        except Exception as exc:
            raise CommandError(f"the engine cannot generate: {exc}") from exc
        self.stdout.write(f"engine ready in {time.monotonic() - started:.1f}s")
        if options["check"]:
            engine.shutdown()
            return
        try:
            while True:
                time.sleep(float(options["stats_every"]))  # type: ignore[arg-type]
                log.info("engine stats: %s", engine.stats())
        except KeyboardInterrupt:
            pass
        finally:
            engine.shutdown()

    @staticmethod
    async def _warm_up(engine: object) -> None:
        ids = engine.tokenizer.encode("Hello", add_special_tokens=False)  # type: ignore[attr-defined]
        async for _ in engine.generate(ids, SamplingParams(max_tokens=1, temperature=0)):  # type: ignore[attr-defined]
            pass
