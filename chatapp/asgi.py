"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings.dev")
# Django must be set up before anything imports models (the consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

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
