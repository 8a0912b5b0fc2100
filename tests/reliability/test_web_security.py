"""Remote content and origins: the Content-Security-Policy on every page, the WebSocket's
same-origin rule, log-in throttling, API keys in the admin and never cached."""

from __future__ import annotations

import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from chatapp.asgi import application
from chatapp.openai_api.keys import create_key
from tests.sockets import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a-long-test-password-1"


def policy(answer: Any) -> dict[str, list[str]]:
    header = answer["Content-Security-Policy"]
    directives = (part.strip().split() for part in header.split(";") if part.strip())
    return {d[0]: d[1:] for d in directives}


def test_every_page_sends_a_policy_that_blocks_remote_images_and_inline_script(
    make_user: Any,
) -> None:
    admin = make_user("boss")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client = Client()
    pages = ["/accounts/login/", "/accounts/signup/"]
    answers = [client.get(p) for p in pages]
    client.force_login(admin)
    pages += ["/", "/settings/keys/", "/admin/", "/admin/latency/", "/api/me/"]
    answers += [client.get(p) for p in pages[2:]]
    for page, answer in zip(pages, answers, strict=True):
        assert answer.status_code == 200, page
        csp = policy(answer)
        assert csp["img-src"] == ["'self'", "data:"], page
        assert csp["script-src"] == ["'self'"], page
        assert csp["default-src"] == ["'self'"], page
        assert "'unsafe-inline'" not in answer["Content-Security-Policy"], page


def test_the_keys_page_is_never_stored_by_a_browser_or_proxy(make_user: Any) -> None:
    client = Client()
    client.force_login(make_user("keeper"))
    for answer in (client.get("/settings/keys/"), client.post("/settings/keys/", {"name": "k"})):
        assert "no-store" in answer["Cache-Control"]
        assert "sk-chat-" not in answer["Cache-Control"]


def test_api_keys_are_listed_and_their_limits_editable_in_the_admin(make_user: Any) -> None:
    admin = make_user("root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    key, raw = create_key(make_user("owner"), "script")
    client = Client()
    client.force_login(admin)
    listing = client.get("/admin/openai_api/apikey/")
    assert listing.status_code == 200 and key.prefix in listing.content.decode()
    assert raw not in listing.content.decode()
    page = client.get(f"/admin/openai_api/apikey/{key.pk}/change/")
    assert page.status_code == 200
    saved = client.post(
        f"/admin/openai_api/apikey/{key.pk}/change/",
        {"name": "script", "rate_limit_per_minute": 7, "max_concurrent": 2,
         "revoked_at_0": "", "revoked_at_1": ""},
    )  # fmt: skip
    assert saved.status_code == 302, saved.content.decode()[:2000]
    key.refresh_from_db()
    assert (key.rate_limit_per_minute, key.max_concurrent) == (7, 2)


# --- the WebSocket's origin rule -----------------------------------------------------------


def connects(user: Any, origin: str | None, host: str = "127.0.0.1:8000", **extra: str) -> bool:
    async def attempt() -> bool:
        headers = [(b"host", host.encode())]
        if origin is not None:
            headers.append((b"origin", origin.encode()))
        headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
        headers += [(k.encode(), v.encode()) for k, v in extra.items()]
        communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    return async_to_sync(attempt)()


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:9999",  # another port of the same host
        "https://127.0.0.1:8000",  # another scheme
        "http://localhost:8000",  # another name for the same machine
        "http://localhost:3000",
        "http://127.0.0.1",  # the default port is another port
        "null",
        None,
        "http://evil.example",
    ],
)
def test_a_socket_from_another_origin_is_refused_as_csrf_refuses_a_post(
    origin: str | None, make_user: Any
) -> None:
    user = make_user("origins")
    assert connects(user, "http://127.0.0.1:8000")
    assert not connects(user, origin)
    if origin is None:
        return  # a browser always sends Origin on a socket; HTTP has no such rule then
    # Django's CSRF check on HTTP refuses a POST from the same origin.
    client = Client(enforce_csrf_checks=True, HTTP_HOST="127.0.0.1:8000")
    client.force_login(user)
    client.get("/")
    token = client.cookies["csrftoken"].value
    post = client.post(
        "/api/conversations/", data="{}", content_type="application/json",
        HTTP_X_CSRFTOKEN=token, HTTP_ORIGIN=origin,
    )  # fmt: skip
    assert post.status_code == 403


def test_a_socket_behind_a_tls_proxy_must_come_from_the_https_origin(
    make_user: Any, settings: Any
) -> None:
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    user = make_user("proxied")
    forwarded = {"x-forwarded-proto": "https"}
    assert connects(user, "https://chat.example", host="chat.example", **forwarded) is False
    settings.ALLOWED_HOSTS = ["chat.example"]
    assert connects(user, "https://chat.example", host="chat.example", **forwarded)
    assert not connects(user, "http://chat.example", host="chat.example", **forwarded)


def test_an_origin_in_csrf_trusted_origins_may_open_a_socket(make_user: Any, settings: Any) -> None:
    user = make_user("trusted")
    assert not connects(user, "http://localhost:3000")
    settings.CSRF_TRUSTED_ORIGINS = ["http://localhost:3000", "https://*.example.com"]
    assert connects(user, "http://localhost:3000")
    assert connects(user, "https://chat.example.com")
    assert not connects(user, "http://chat.example.com")


# --- log-in throttling ---------------------------------------------------------------------


def log_in(username: str, password: str, address: str = "10.0.0.1") -> Any:
    client = Client(REMOTE_ADDR=address)
    answer = client.post("/accounts/login/", {"username": username, "password": password})
    answer.logged_in = "_auth_user_id" in client.session
    return answer


def test_a_dozen_wrong_passwords_lock_the_account_even_for_the_right_one(
    make_user: Any, settings: Any
) -> None:
    make_user("victim", PASSWORD)
    failures = [log_in("victim", f"guess-{i}") for i in range(12)]
    assert all(a.status_code == 200 and not a.logged_in for a in failures)
    right = log_in("victim", PASSWORD)
    assert not right.logged_in
    assert "Too many failed log-ins" in right.content.decode()
    # The account is throttled from any address, until the window ends.
    assert not log_in("victim", PASSWORD, address="10.9.9.9").logged_in
    # Another account from another address is untouched.
    make_user("bystander", PASSWORD)
    assert log_in("bystander", PASSWORD, address="10.9.9.9").logged_in


def test_one_address_guessing_across_accounts_is_throttled(make_user: Any, settings: Any) -> None:
    settings.LOGIN_FAILURES_PER_ADDRESS = 5
    make_user("target", PASSWORD)
    for i in range(5):
        assert not log_in(f"nobody{i}", "wrong", address="10.6.6.6").logged_in
    refused = log_in("target", PASSWORD, address="10.6.6.6")
    assert not refused.logged_in and "Too many failed log-ins" in refused.content.decode()
    assert log_in("target", PASSWORD, address="10.7.7.7").logged_in


def test_the_window_opens_at_the_first_failure_and_locks_until_it_ends(
    make_user: Any, settings: Any
) -> None:
    # Buckets fixed to the clock (3 s ones here) would split these failures 1.2 s apart
    # about 40% of the time and start the count again; the window must not.
    settings.LOGIN_FAILURE_WINDOW_S = 3
    settings.LOGIN_FAILURES_PER_ACCOUNT = 3
    make_user("patient", PASSWORD)
    first = time.monotonic()
    assert not log_in("patient", "wrong-1").logged_in
    time.sleep(1.2)
    assert not any(log_in("patient", f"wrong-{i}").logged_in for i in (2, 3))
    refused = log_in("patient", PASSWORD)
    assert not refused.logged_in
    assert "from this address. Try again in 1 minute." in refused.content.decode()
    time.sleep(max(0.0, first + 3.5 - time.monotonic()))
    assert log_in("patient", PASSWORD).logged_in


def test_one_ipv6_client_cannot_dodge_the_limit_by_walking_its_64(
    make_user: Any, settings: Any
) -> None:
    settings.LOGIN_FAILURES_PER_ADDRESS = 3
    make_user("v6", PASSWORD)
    for i in range(3):
        assert not log_in(f"ghost{i}", "wrong", address=f"2001:db8:1:2::{i + 1:x}").logged_in
    assert not log_in("v6", PASSWORD, address="2001:db8:1:2:ffff::9").logged_in
    assert log_in("v6", PASSWORD, address="2001:db8:1:3::1").logged_in


def test_log_in_works_uncounted_while_the_cache_is_away(
    make_user: Any, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A Redis cache at a port where nothing listens: the counters are unreachable.
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:9/0",
        }
    }
    settings.LOGIN_FAILURES_PER_ACCOUNT = 2
    make_user("unlucky", PASSWORD)
    assert not any(log_in("unlucky", f"wrong-{i}").logged_in for i in range(4))
    assert log_in("unlucky", PASSWORD).logged_in
    assert "log-in failure counters unavailable" in caplog.text


def test_successful_log_ins_are_never_throttled(make_user: Any) -> None:
    make_user("regular", PASSWORD)
    assert all(log_in("regular", PASSWORD).logged_in for _ in range(15))


def test_the_admin_log_in_is_throttled_too(make_user: Any) -> None:
    admin = make_user("chief", PASSWORD)
    admin.is_staff = True
    admin.save()
    for i in range(10):
        Client(REMOTE_ADDR="10.1.1.1").post(
            "/admin/login/", {"username": "chief", "password": f"no{i}"}
        )
    client = Client(REMOTE_ADDR="10.1.1.1")
    answer = client.post("/admin/login/", {"username": "chief", "password": PASSWORD})
    assert "_auth_user_id" not in client.session
    assert "Too many failed log-ins" in answer.content.decode()
