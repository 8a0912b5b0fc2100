"""docs/settings.md is written from the code, and covers every variable the code reads."""

from __future__ import annotations

import ast
import textwrap

from chatapp.settings import reference


def test_every_variable_the_code_reads_has_a_row_with_its_meaning() -> None:
    missing = reference.undocumented()
    assert not missing, (
        f"no meaning written down for {missing}: add a docstring under the EngineConfig "
        "field, or a line to chatapp/settings/variables.py, then run "
        "python -m chatapp.settings.reference"
    )


def test_no_meaning_is_written_for_a_variable_nothing_reads() -> None:
    assert not reference.unread(), "chatapp/settings/variables.py names what nothing reads"


def test_docs_settings_md_is_what_the_generator_writes() -> None:
    assert reference.DOC.read_text() == reference.render(), (
        "docs/settings.md is stale: run python -m chatapp.settings.reference"
    )


def test_every_way_the_code_reads_the_environment_is_found() -> None:
    code = textwrap.dedent(
        """
        import os
        a = env_int("A_INT", 3)
        b = os.environ.get("B_GET", "x")
        c = os.environ["C_ITEM"]
        d = os.getenv("D_GETENV")
        os.environ.setdefault("E_SETDEFAULT", "1")
        f = "F_IN" in os.environ
        g = row_limits("ENGINE_G_BY_NAME", 16)
        os.environ["H_WRITTEN"] = "1"
        """
    )
    found = [
        (name, ast.unparse(default) if default is not None else None)
        for name, default in reference.reads_source(code)
    ]
    assert found == [
        ("A_INT", "3"),
        ("B_GET", "'x'"),
        ("C_ITEM", None),
        ("D_GETENV", None),
        ("E_SETDEFAULT", "'1'"),
        ("F_IN", None),
        ("ENGINE_G_BY_NAME", None),
    ]


def test_a_row_shows_the_default_a_user_gets() -> None:
    rows = {row.name: row for _, rows in reference.sections() for row in rows}
    assert rows["CHAT_MAX_FRAME_BYTES"].default == "262144"  # 256 * 1024, evaluated
    assert rows["ENGINE_MAX_NUM_SEQS"].default == "64"  # EngineConfig's own
    # The web app's default where it differs from the engine library's.
    assert rows["ENGINE_SPECULATIVE_MODE"].default.startswith("`auto`")
    assert rows["PORT"].default == "`8000`"  # scripts/run.sh
