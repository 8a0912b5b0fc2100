"""The renames of docs/architecture.md, "Words": a reply's `stats` became its `figures` (chat 0005)
and a rollup's `stats` its `percentiles` (observability 0002). Rows written before keep
their values, and migrating back gives the old columns with them again."""

from __future__ import annotations

import json
from pathlib import Path

from tests.migrations.test_from_before_the_split import ROOT, manage

# Run by the new code's `manage.py shell`, in one process (a process per step is slow).
BACK_AND_FORTH = """
import json
from django.core.management import call_command
from django.db import connection

JSON_COLUMNS = {"token_ids", "errors", "finish_reasons", "hists", "figures", "stats"}


def migrate(*target):
    call_command("migrate", *target, verbosity=0, interactive=False)


def columns(table):
    with connection.cursor() as c:
        return {col.name for col in connection.introspection.get_table_description(c, table)}


def insert(table, **given):
    # A row with `given`, and a plain value in every other column that needs one.
    values = dict(given)
    with connection.cursor() as c:
        info = c.execute(f'PRAGMA table_info("{table}")').fetchall()
        for _, name, kind, notnull, default, pk in info:
            if name in values or pk or not notnull or default is not None:
                continue
            kind = kind.lower()
            if any(t in kind for t in ("int", "bool", "real", "decimal")):
                values[name] = 0
            elif "date" in kind:
                values[name] = "2024-01-01 00:00:00"
            elif name in JSON_COLUMNS:
                values[name] = "[]" if name == "token_ids" else "{}"
            else:
                values[name] = ""
        names = ", ".join(f'"{n}"' for n in values)
        marks = ", ".join(["%s"] * len(values))
        c.execute(f'INSERT INTO "{table}" ({names}) VALUES ({marks})', list(values.values()))
        return c.lastrowid


def old_values():
    with connection.cursor() as c:
        message = c.execute("SELECT stats FROM chatapp_message").fetchone()[0]
        rollup = c.execute("SELECT stats FROM inference_minuterollup").fetchone()[0]
    return [json.loads(message), json.loads(rollup)]


found = {}
migrate()
# Back to the schema from before the renames, and rows written in it.
migrate("chat", "0004")
migrate("observability", "0001")
found["old_columns"] = [
    sorted({"stats", "figures"} & columns("chatapp_message")),
    sorted({"stats", "percentiles"} & columns("inference_minuterollup")),
]
alice = insert("auth_user", username="alice")
conv = insert("chatapp_conversation", owner_id=alice, title="Bread")
insert("chatapp_message", conversation_id=conv, role="assistant", text="Knead.",
       stats=json.dumps({"ttft_ms": 12.5}))
insert("inference_minuterollup", stats=json.dumps({"ttft_p99": 0.25}))

migrate()
from chatapp.chat.models import Message
from chatapp.observability.models import MinuteRollup

found["new"] = [
    list(Message.objects.values_list("figures", flat=True)),
    list(MinuteRollup.objects.values_list("percentiles", flat=True)),
]
migrate("chat", "0004")
migrate("observability", "0001")
found["back"] = old_values()
print(json.dumps(found))
"""


def test_the_renamed_fields_keep_their_values_both_ways(tmp_path: Path) -> None:
    out = manage(ROOT, tmp_path / "db.sqlite3", "shell", code=BACK_AND_FORTH)
    found = json.loads(out.strip().splitlines()[-1])
    assert found["old_columns"] == [["stats"], ["stats"]]
    assert found["new"] == [[{"ttft_ms": 12.5}], [{"ttft_p99": 0.25}]]
    assert found["back"] == [{"ttft_ms": 12.5}, {"ttft_p99": 0.25}]
