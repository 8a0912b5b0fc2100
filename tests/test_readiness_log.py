"""The readiness probe's 503 while the model loads is not logged as an error; other 5xx are."""

from __future__ import annotations

import logging

import pytest
from django.http import HttpResponse
from django.test import Client
from django.utils.log import log_response


@pytest.fixture
def loading(monkeypatch):
    monkeypatch.setattr("chatapp.views.engine_health", lambda: ("loading", "the model is loading"))


def _errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django.request" and r.levelno >= logging.ERROR]


def test_the_probe_answers_503_while_loading_and_logs_no_error(loading, caplog):
    caplog.set_level(logging.INFO)
    response = Client().get("/healthz?engine=1")
    assert response.status_code == 503
    assert response.json()["checks"]["engine"]["state"] == "loading"
    assert _errors(caplog) == []


def test_other_server_errors_still_log(rf, caplog):
    caplog.set_level(logging.INFO)
    for path in ("/healthz", "/v1/chat/completions"):
        # A 503 elsewhere, and a 500 on the probe's own path, are real errors.
        status = 500 if path == "/healthz" else 503
        log_response("%s: %s", "Server Error", path, response=HttpResponse(status=status),
                     request=rf.get(path))  # fmt: skip
    assert [r.status_code for r in _errors(caplog)] == [500, 503]
