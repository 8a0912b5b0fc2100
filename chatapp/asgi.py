"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import asyncio
import os
import sys
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings.dev")
# Django must be set up before anything imports models (the consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from chatapp.chat.generation import registry  # noqa: E402
from chatapp.chat.routing import websocket_urlpatterns  # noqa: E402
from chatapp.jobs.scheduler import start_in_process  # noqa: E402
from chatapp.origins import SameOriginValidator  # noqa: E402
from inference.client import preload_in_background  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

if settings.ENGINE["PRELOAD"]:
    preload_in_background()
# The periodic work this process runs itself (settings.PERIODIC_TASKS; beat runs the rest).
start_in_process()


def drain_on_shutdown() -> None:
    """Under daphne, SIGTERM stops twisted's reactor; a "before shutdown" trigger that
    returns a Deferred holds the stop until it fires. The replies running here get
    CHAT_DRAIN_S to finish and are saved before the process exits (docs/workers.md,
    "Draining"). Other servers (tests' communicators, uvicorn) have no reactor: nothing."""
    if "twisted.internet.reactor" not in sys.modules:
        return
    from twisted.internet import defer, reactor

    def drain() -> defer.Deferred[None]:
        # daphne's own "before shutdown" trigger cancels every connection's application at
        # once, which would close the sockets of the replies being drained (and of those
        # told "draining"): it is held back and run after the drain. The triggers fire in
        # the order they were added, and this one is added when daphne imports the app,
        # before daphne adds its own.
        event = getattr(reactor, "_eventTriggers", {}).get("shutdown")
        waiting: list[Any] = event.before if event is not None else []
        held = [t for t in waiting if getattr(t[0], "__name__", "") == "kill_all_applications"]
        for trigger in held:
            waiting.remove(trigger)

        async def drain_then_close() -> None:
            await registry.drain(settings.CHAT_DRAIN_S)
            for kill, args, kwargs in held:
                result = kill(*args, **kwargs)
                if isinstance(result, defer.Deferred):
                    await result.asFuture(asyncio.get_running_loop())

        return defer.Deferred.fromFuture(asyncio.ensure_future(drain_then_close()))

    reactor.addSystemEventTrigger("before", "shutdown", drain)  # type: ignore[arg-type]


drain_on_shutdown()
