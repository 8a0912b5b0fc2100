from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from chatapp import api, api_keys, openai_api, views
from chatapp.login_throttle import ThrottledAuthenticationForm

urlpatterns = [
    path("", views.index, name="index"),
    path("healthz", views.healthz, name="healthz"),
    # Pages that link no icon (the admin, the latency dashboard) make browsers ask here.
    path("favicon.ico", views.favicon, name="favicon"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(authentication_form=ThrottledAuthenticationForm),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/signup/", views.signup, name="signup"),
    path("api/me/", api.me),
    path("api/engine/", api.engine_info),
    path("api/chat/limits/", api.chat_limits),
    path("api/conversations/", api.conversations),
    path("api/conversations/<int:pk>/", api.conversation),
    re_path(r"^api/conversations/(?P<pk>[0-9]+)/export\.(?P<fmt>md|json)$", api.export),
    path("settings/keys/", api_keys.keys_page, name="api-keys"),
    path("settings/keys/<int:pk>/revoke", api_keys.revoke_key, name="api-key-revoke"),
    path("v1/models", openai_api.models),
    path("v1/chat/completions", openai_api.chat_completions),
    path("v1/completions", openai_api.completions),
    # Observability: /metrics, /admin/latency/ (before admin/), /api/exports/.
    path("", include("inference.urls")),
    path("admin/", admin.site.urls),
]
