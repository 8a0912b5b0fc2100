"""A conversation as Markdown or JSON (the active branch), and the export job that zips all
of a user's conversations."""

from __future__ import annotations

import json
import zipfile
from typing import Any

from django.utils.text import slugify

from chatapp.chat import conversations
from chatapp.chat.models import Conversation
from chatapp.jobs.files import job_dir, relative_to_var
from chatapp.jobs.models import Job


def conversation_payload(conv: Conversation) -> dict[str, Any]:
    return {
        "conversation": conversations.conversation_json(conv),
        "messages": [conversations.message_json(m) for m in conversations.active_branch(conv)],
    }


def conversation_markdown(conv: Conversation) -> str:
    lines = [f"# {conv.title or 'Conversation'}", ""]
    if conv.system_prompt.strip():
        lines += ["**System:**", "", conv.system_prompt, ""]
    for m in conversations.active_branch(conv):
        who = {"user": "You", "assistant": "Assistant"}.get(m.role, m.role.title())
        lines += [f"**{who}:**", "", m.text, ""]
    return "\n".join(lines)


def export_all(job: Job) -> dict[str, Any]:
    """The export job: all of a user's conversations as a zip, one Markdown file each, or
    one JSON."""
    fmt = job.params.get("format", "md")
    if fmt not in ("md", "json"):
        raise ValueError(f"unknown export format {fmt!r}")
    convs = list(Conversation.objects.filter(owner=job.user).order_by("id"))
    path = job_dir(job) / f"conversations-{fmt}.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        if fmt == "json":
            data = [conversation_payload(c) for c in convs]
            zf.writestr("conversations.json", json.dumps(data, ensure_ascii=False, indent=2))
        else:
            for c in convs:
                name = f"{c.pk:05d}-{slugify(c.title)[:50] or 'conversation'}.md"
                zf.writestr(name, conversation_markdown(c))
    Job.objects.filter(pk=job.pk).update(
        file=relative_to_var(path), result={"conversations": len(convs)}
    )
    return {"conversations": len(convs)}
