"""Every route, by app: each app's own urls.py lists its paths."""

from django.contrib import admin
from django.urls import include, path

from chatapp import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    # Pages that link no icon (the admin, the latency dashboard) make browsers ask here.
    path("favicon.ico", views.favicon, name="favicon"),
    path("", include("chatapp.accounts.urls")),
    path("", include("chatapp.chat.urls")),
    path("", include("chatapp.openai_api.urls")),
    # /metrics and /admin/latency/ (before admin/, which would claim that path).
    path("", include("chatapp.observability.urls")),
    path("admin/", admin.site.urls),
]

handler404 = "chatapp.views.not_found"
handler500 = "chatapp.views.server_error"
