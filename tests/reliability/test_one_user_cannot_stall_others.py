"""Issue 43 against a real server on its SQLite file: a hostile PDF, a large import and a
burst of password guesses each cost bounded work, and other users go on being served."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.chat.documents import pdf_of_shared_empty_operators
from tests.chat.test_import import own_export_chains
from tests.servers import PASSWORD, started, users_code
from tools.live_server import LiveServer

PDF_TIMEOUT_S = 6.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    srv = LiveServer(
        tmp_path_factory.mktemp("stall-server"),
        tiny_model_dir,
        CHAT_PDF_TIMEOUT_S=str(PDF_TIMEOUT_S),
    )
    started(srv, users_code("alice", "bob"))
    yield srv
    srv.stop()


def api_session(server: LiveServer, username: str) -> httpx.Client:
    c = server.login(username, PASSWORD)
    c.headers["X-CSRFToken"] = c.cookies["csrftoken"]
    return c


def pdf_readers(server: LiveServer) -> list[psutil.Process]:
    assert server.proc is not None
    found = []
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if any("pdf_reader" in part for part in child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_pdf_that_stalls_pypdf_is_refused_within_the_time_bound_and_its_reader_is_gone(
    server: LiveServer,
) -> None:
    hostile = pdf_of_shared_empty_operators(pages=6)
    assert len(hostile) < 8_000  # a few KB that cost pypdf ~5 s of CPU a page
    alice = api_session(server, "alice")
    started = time.monotonic()
    answer = alice.post("/api/attachments/", files={"file": ("trap.pdf", hostile)})
    took = time.monotonic() - started
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "pdf_too_slow"
    assert "seconds" in answer.json()["error"]["message"]
    assert took < PDF_TIMEOUT_S + 4
    assert pdf_readers(server) == []
    # The server is not stalled meanwhile or after: a normal upload goes through.
    ok = alice.post("/api/attachments/", files={"file": ("notes.md", b"# Notes\nhello")})
    assert ok.status_code == 201


def test_a_pdf_reader_is_killed_as_soon_as_its_client_goes_away(server: LiveServer) -> None:
    alice = api_session(server, "alice")
    request = alice.build_request(
        "POST", "/api/attachments/", files={"file": ("trap.pdf", pdf_of_shared_empty_operators(6))}
    )
    head = f"POST /api/attachments/ HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() != "host")
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(head.encode() + b"\r\n" + request.read())
    deadline = time.monotonic() + 5
    while not pdf_readers(server):
        assert time.monotonic() < deadline, "the PDF reader never started"
        time.sleep(0.05)
    sock.close()
    left = time.monotonic()
    while pdf_readers(server):
        assert time.monotonic() - left < 2.0, "the reader outlived its client"
        time.sleep(0.05)
    # Well before the reader's own time bound would have ended it.
    assert time.monotonic() - left < PDF_TIMEOUT_S - 2


def test_another_users_writes_go_through_in_milliseconds_while_a_large_import_runs(
    server: LiveServer,
) -> None:
    # 10,000 messages: hundreds of the import's 10 ms write batches, and alice's writes
    # between them.
    body = own_export_chains(conversations=500, messages=20)
    bob, alice = api_session(server, "bob"), api_session(server, "alice")
    importing = threading.Event()
    waits: list[float] = []

    def alice_keeps_creating() -> None:
        importing.wait()
        while importing.is_set():
            started = time.monotonic()
            answer = alice.post("/api/conversations/", json={"title": "mine"})
            waits.append(time.monotonic() - started)
            assert answer.status_code == 201, answer.text
            time.sleep(0.02)

    with ThreadPoolExecutor(1) as pool:
        writes = pool.submit(alice_keeps_creating)
        importing.set()
        try:
            answer = bob.post("/api/conversations/import/", content=body, timeout=300)
        finally:
            importing.clear()
        writes.result()
    assert answer.status_code == 201 and answer.json()["imported"] == 500, answer.text[:300]
    assert len(waits) >= 20
    waits.sort()
    assert waits[-1] < 1.0, (waits[len(waits) // 2], waits[-5:])


def test_forty_simultaneous_log_ins_check_no_more_passwords_than_the_limit(
    server: LiveServer,
) -> None:
    server.make_user("carol", PASSWORD)
    clients = []
    for _ in range(40):
        c = httpx.Client(base_url=server.url, timeout=120)
        c.get("/accounts/login/")
        clients.append(c)
    barrier = threading.Barrier(len(clients))

    def attempt(i: int) -> str:
        c = clients[i]
        password = PASSWORD if i == 39 else f"wrong-guess-{i}"
        barrier.wait()
        answer = c.post(
            "/accounts/login/",
            data={"username": "carol", "password": password,
                  "csrfmiddlewaretoken": c.cookies["csrftoken"]},
        )  # fmt: skip
        c.close()
        if answer.status_code == 302:
            return "logged in"
        if "Too many failed log-ins" in answer.text:
            return "refused"
        assert "correct username and password" in answer.text, answer.text[:500]
        return "checked"

    with ThreadPoolExecutor(len(clients)) as pool:
        outcomes = Counter(pool.map(attempt, range(len(clients))))
    checked = outcomes["checked"] + outcomes["logged in"]
    assert checked <= 10, outcomes  # LOGIN_FAILURES_PER_ACCOUNT
    assert outcomes["refused"] >= 30, outcomes
