"""A database made by the code before the apps were split (commit 64ed919: the apps
`chatapp` and `inference`) keeps every row when the new code migrates it, and ends up with
the same schema as a database the new code makes (chatapp/adopted_tables.py).

The old database is made the way that code makes it: its own `manage.py migrate`, then rows
written through its own models, in a checkout of that commit (`git archive`)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BRANCH_POINT = "64ed919"

WRITE_OLD_ROWS = """
import json
import chatapp
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone
from chatapp.models import ApiKey, Conversation, Message
from inference.models import EngineSample, Job, MinuteRollup, RequestRecord

assert chatapp.__file__.startswith(OLD_ROOT), chatapp.__file__
alice = get_user_model().objects.create_user("alice", password="a-long-test-password-1")
alice.user_permissions.add(Permission.objects.get(codename="view_conversation"))
conv = Conversation.objects.create(owner=alice, title="Bread", system_prompt="Be brief.")
q = Message.objects.create(conversation=conv, role="user", text="How?", token_ids=[1, 2])
a = Message.objects.create(conversation=conv, parent=q, role="assistant", text="Knead.",
                           token_ids=[3, 4], stats={"ttft_ms": 12.5})
conv.active_leaf = a
conv.save()
ApiKey.objects.create(owner=alice, name="laptop", prefix="sk-chat-abc", key_hash="h" * 64)
now = timezone.now()
RequestRecord.objects.create(finished_at=now, source="chat", request_id="r1", user=alice,
                             conversation=conv, ttft=0.25, itl_hist={"3": 2}, replayed=True)
EngineSample.objects.create(at=now, worker="w1", running=2, kv_usage=0.5)
MinuteRollup.objects.create(minute=now.replace(second=0, microsecond=0), requests=1,
                            stats={"ttft_p99": 0.25})
Job.objects.create(kind="kv_tier", user=alice, params={"x": 1}, result={"entries": 3})
print(json.dumps({"conversation": conv.pk, "reply": a.pk}))
"""

READ_NEW_ROWS = """
import json
import chatapp.chat.models
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from chatapp.chat.models import Conversation, Message
from chatapp.jobs.models import Job
from chatapp.observability.models import EngineSample, MinuteRollup, RequestRecord
from chatapp.openai_api.models import ApiKey

assert chatapp.chat.models.__file__.startswith(NEW_ROOT)
alice = get_user_model().objects.get(username="alice")
conv = Conversation.objects.get()
rec = RequestRecord.objects.get()
print(json.dumps({
    "conversation": [conv.pk, conv.title, conv.system_prompt, conv.owner_id == alice.pk],
    "active_leaf": conv.active_leaf_id,
    "messages": [[m.role, m.text, m.token_ids, m.figures] for m in Message.objects.order_by("id")],
    "api_keys": list(ApiKey.objects.values_list("name", "prefix")),
    "record": [rec.request_id, rec.ttft, rec.itl_hist, rec.replayed, rec.conversation_id],
    "samples": list(EngineSample.objects.values_list("worker", "running", "kv_usage")),
    "rollups": list(MinuteRollup.objects.values_list("requests", "percentiles")),
    "jobs": list(Job.objects.values_list("kind", "params", "result")),
    "may_view_conversations": alice.has_perm("chat.view_conversation"),
    "old_content_types": list(ContentType.objects.filter(app_label__in=["chatapp", "inference"])
                              .values_list("model", flat=True)),
}))
"""


def old_checkout(into: Path) -> Path:
    """The code of the branch point, as `git archive` gives it."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", BRANCH_POINT, "manage.py", "chatapp", "inference"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no commit {BRANCH_POINT} in this checkout's history (a shallow clone?): {exc}")
    with tarfile.open(fileobj=BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return into


def manage(root: Path, db: Path, *args: str, code: str | None = None) -> str:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{db}",
        "DJANGO_SETTINGS_MODULE": "chatapp.settings.dev",
        "CHATAPP_VAR_DIR": str(db.parent / f"var-{root.name}"),
        "ENGINE_PRELOAD": "false",
    }
    env.pop("PYTHONPATH", None)
    if code is not None:
        # The checkout each script asserts its code comes from.
        prefix = f"OLD_ROOT = NEW_ROOT = {str(root)!r}\n"
        args = (*args, "-c", prefix + code)
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def schema(db: Path) -> dict[str, list[tuple[str, str, int]]]:
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            t: sorted((c[1], c[2], c[3]) for c in conn.execute(f'PRAGMA table_info("{t}")'))
            for t in tables
            if t != "django_migrations" and not t.startswith("sqlite_")
        }


def test_a_database_made_before_the_split_keeps_every_row(tmp_path: Path) -> None:
    old = old_checkout(tmp_path / "old")
    db = tmp_path / "db.sqlite3"
    manage(old, db, "migrate", "--noinput")
    ids = json.loads(manage(old, db, "shell", code=WRITE_OLD_ROWS).strip().splitlines()[-1])

    manage(ROOT, db, "migrate", "--noinput")
    found = json.loads(manage(ROOT, db, "shell", code=READ_NEW_ROWS).strip().splitlines()[-1])

    assert found["conversation"] == [ids["conversation"], "Bread", "Be brief.", True]
    assert found["active_leaf"] == ids["reply"]
    assert found["messages"] == [
        ["user", "How?", [1, 2], {}],
        ["assistant", "Knead.", [3, 4], {"ttft_ms": 12.5}],
    ]
    assert found["api_keys"] == [["laptop", "sk-chat-abc"]]
    assert found["record"] == ["r1", 0.25, {"3": 2}, True, ids["conversation"]]
    assert found["samples"] == [["w1", 2, 0.5]]
    assert found["rollups"] == [[1, {"ttft_p99": 0.25}]]
    assert found["jobs"] == [["kv_tier", {"x": 1}, {"entries": 3}]]
    # The content types moved with their models: the permission a user held still holds.
    assert found["may_view_conversations"] is True
    assert found["old_content_types"] == []

    fresh = tmp_path / "fresh.sqlite3"
    manage(ROOT, fresh, "migrate", "--noinput")
    assert schema(db) == schema(fresh)


def test_a_database_the_old_code_migrated_part_way_is_refused_with_the_way_out(
    tmp_path: Path,
) -> None:
    old = old_checkout(tmp_path / "old")
    db = tmp_path / "db.sqlite3"
    manage(old, db, "migrate", "--noinput")
    manage(old, db, "migrate", "inference", "0001", "--noinput")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "ENGINE_PRELOAD": "false",
           "CHATAPP_VAR_DIR": str(tmp_path / "var")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode != 0
    assert "0002_request_record_replayed" in done.stderr
    assert "run `manage.py migrate` with that code first" in done.stderr
