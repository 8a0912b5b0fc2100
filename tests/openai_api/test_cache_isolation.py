"""No user learns another's text from the prefix cache (issue 14, item 1).

`usage.prompt_tokens_details.cached_tokens` and the chat's `figures.cached_tokens` count the
prompt tokens the KV cache already held. Were the cache shared, they would tell bob, block
by block, whether anyone recently sent the same leading text: guess a secret, read the
count. Prefix reuse is scoped by owner (docs/kv-tier.md, "Whose blocks"), so bob's count
is the same for every guess, and alice's own next turn still finds her blocks.

Against a real server process (daphne, the tiny model, the Redis KV tier on), alice over
the chat socket, bob over the chat socket and the official `openai` client.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.servers import PASSWORD
from tools.live_server import LiveServer

NOTE = (
    "Private note for my own records, please keep it safe: the code for the blue locker "
    "in the basement storage room is {code}. Remind me of it when I ask about the locker."
)
SECRET = "58-27-93"
GUESSES = ("31-27-93", "58-27-90", SECRET)


PROBES = ("bob", "carol", "dave")  # one guess each, so no probe hits its own earlier guess


@pytest.fixture(scope="module")
def people(server: LiveServer) -> dict[str, str]:
    """alice, the probing users and erin, each with an API key of their own: made in one
    `manage.py shell` (LiveServer.make_user and make_key start one each, a second or more
    apiece, ten in all)."""
    names = ("alice", *PROBES, "erin")
    made = server.python(
        "import json; from django.contrib.auth import get_user_model as g; "
        "from chatapp.openai_api.keys import create_key; "
        f"users = [g().objects.create_user(n, password={PASSWORD!r}) for n in {names!r}]; "
        "print(json.dumps({u.username: create_key(u, 'test')[1] for u in users}))"
    )
    keys: dict[str, str] = json.loads(made.splitlines()[-1])
    assert sorted(keys) == sorted(names)
    return keys


def api(server: LiveServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def cached_over_api(server: LiveServer, key: str, code: str, note: str = NOTE, **extra: Any) -> int:
    reply = api(server, key).chat.completions.create(
        model=server_model(server, key),
        messages=[{"role": "user", "content": note.format(code=code)}],
        max_tokens=1,
        temperature=0,
        extra_body=extra or None,
    )
    return reply.usage.prompt_tokens_details.cached_tokens


def server_model(server: LiveServer, key: str) -> str:
    return api(server, key).models.list().data[0].id


def chat_send(
    server: LiveServer, username: str, text: str, conversation_id: int | None = None
) -> dict[str, Any]:
    """Send `text` over the chat socket; the `done` frame (with conversation_id added)."""
    with server.chat_socket(username, PASSWORD) as sock:
        sock.send(
            json.dumps(
                {
                    "type": "send",
                    "conversation_id": conversation_id,
                    "text": text,
                    "settings": {"max_tokens": 8, "temperature": 0},
                }
            )
        )
        while True:
            frame = json.loads(sock.recv(timeout=60))
            if frame["type"] == "conversation":
                conversation_id = frame["conversation"]["id"]
            if frame["type"] == "error":
                raise AssertionError(frame)
            if frame["type"] == "done":
                assert frame["status"] == "complete", frame
                return {**frame, "conversation_id": conversation_id}


def test_bob_cannot_tell_whether_alice_sent_a_text_from_cached_tokens(
    server: LiveServer, people: dict[str, str]
) -> None:
    done = chat_send(server, "alice", NOTE.format(code=SECRET))
    assert done["figures"]["prompt_tokens"] > 48  # several whole KV blocks to give away

    # Shared, the counts grew with each digit guessed right (the issue saw 32, 48, 64).
    # Scoped by owner, the count is 0 for every guess, the right one included.
    probes = zip(PROBES, GUESSES, strict=True)
    counts = [cached_over_api(server, people[who], code) for who, code in probes]
    assert counts == [0, 0, 0]
    # Over the chat socket too, in a conversation of another user's own.
    assert chat_send(server, "erin", NOTE.format(code=SECRET))["figures"]["cached_tokens"] == 0


def test_alice_still_reuses_her_own_prefix_in_the_chat_and_over_the_api(
    server: LiveServer, people: dict[str, str]
) -> None:
    first = chat_send(server, "alice", NOTE.format(code="12-34-56"))
    again = chat_send(server, "alice", "And what was the code?", first["conversation_id"])
    # Her next turn finds everything up to the last whole block of turn one.
    block = 16
    turn_one = first["figures"]["prompt_tokens"] + first["figures"]["output_tokens"]
    assert again["figures"]["cached_tokens"] >= turn_one - 2 * block, (again, first)
    # Her API key is hers: the same text over the API reuses what her chat computed.
    assert cached_over_api(server, people["alice"], "12-34-56") > 48


def test_an_api_cache_salt_splits_the_key_owner_s_scope_and_joins_no_other(
    server: LiveServer, people: dict[str, str]
) -> None:
    alice, bob = people["alice"], people["bob"]
    note = "A different matter, never sent before in this test module. " + NOTE
    cached_over_api(server, alice, "77-77-77", note)  # now in alice's own scope
    # vLLM's field: a scope of its own inside alice's, so nothing of hers is found...
    assert cached_over_api(server, alice, "77-77-77", note, cache_salt="tenant-a") == 0
    assert cached_over_api(server, alice, "77-77-77", note, cache_salt="tenant-a") > 48
    # ... and the same value from bob's key is bob's own scope, not alice's.
    assert cached_over_api(server, bob, "77-77-77", note, cache_salt="tenant-a") == 0
    with pytest.raises(openai.BadRequestError) as refused:
        cached_over_api(server, bob, "77-77-77", note, cache_salt="")
    assert refused.value.body["param"] == "cache_salt"  # type: ignore[index]
