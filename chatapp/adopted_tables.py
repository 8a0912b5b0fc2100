"""How the apps' first migrations keep the databases made before the split.

Until commit 64ed919 the models lived in two apps, `chatapp` (conversations, messages, API
keys) and `inference` (request records, engine samples, rollups, jobs). Each model kept
its table name (Meta.db_table) when it moved, and each new app's 0001 migration adopts
those tables: a SeparateDatabaseAndState whose state operations are the ordinary ones,
and whose database operation creates only the tables that are not there yet. So a
database made by the old code keeps every row, and a new database gets the same tables.
The content types move with their models, so permissions and the admin's history stay
attached. A database the old code migrated only part way is refused, with the way out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import migrations
from django.db.migrations.operations.base import Operation
from django.db.migrations.operations.fields import FieldOperation
from django.db.migrations.operations.models import CreateModel, ModelOptionOperation
from django.db.migrations.recorder import MigrationRecorder
from django.db.migrations.state import ProjectState

# The migrations the old apps had, all of which a database must have had applied.
LEGACY_MIGRATIONS = {
    "chatapp": ("0001_initial", "0002_api_keys"),
    "inference": ("0001_initial", "0002_request_record_replayed", "0003_job_kind_kv_tier"),
}
CONTENTTYPES = ("contenttypes", "0002_remove_content_type_name")


def _model_of(op: Operation) -> str:
    if isinstance(op, CreateModel):
        return op.name_lower
    if isinstance(op, FieldOperation | ModelOptionOperation):
        return op.model_name_lower
    if hasattr(op, "model_name"):  # AddIndex, AddConstraint
        return str(op.model_name).lower()
    raise TypeError(f"cannot tell which model {op!r} changes")


class CreateMissingTables(Operation):
    """Run `operations` on the database for the models whose table is not there yet."""

    reversible = True
    reduces_to_sql = False

    def __init__(self, legacy_app: str, operations: Sequence[Operation]) -> None:
        self.legacy_app = legacy_app
        self.operations = list(operations)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [self.legacy_app, self.operations], {}

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        for op in self.operations:
            op.state_forwards(app_label, state)

    def _steps(self, app_label: str, from_state: ProjectState) -> list[Any]:
        steps = []
        state = from_state.clone()
        for op in self.operations:
            before = state.clone()
            op.state_forwards(app_label, state)
            table = state.apps.get_model(app_label, _model_of(op))._meta.db_table
            steps.append((op, table, before, state.clone()))
        return steps

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        connection = schema_editor.connection
        existing = set(connection.introspection.table_names())
        steps = self._steps(app_label, from_state)
        adopted = sorted({table for _, table, _, _ in steps if table in existing})
        if adopted:
            self._check_history(connection, adopted)
        for op, table, before, after in steps:
            if table not in existing:
                op.database_forwards(app_label, schema_editor, before, after)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        for op, _, before, after in reversed(self._steps(app_label, to_state)):
            op.database_backwards(app_label, schema_editor, after, before)

    def _check_history(self, connection: Any, tables: list[str]) -> None:
        applied = {name for app, name in MigrationRecorder(connection).applied_migrations()
                   if app == self.legacy_app}  # fmt: skip
        missing = [m for m in LEGACY_MIGRATIONS[self.legacy_app] if m not in applied]
        if missing:
            raise RuntimeError(
                f"the tables {', '.join(tables)} were made by the app {self.legacy_app!r} of "
                f"the code before the split (commit 64ed919), whose migrations "
                f"{', '.join(missing)} were never applied: run `manage.py migrate` with that "
                "code first, then with this one"
            )

    def describe(self) -> str:
        return f"Create the tables of the {self.legacy_app!r} app that are not there yet"


def adopt(legacy_app: str, operations: Sequence[Operation]) -> migrations.SeparateDatabaseAndState:
    """The app's models in its state; in the database, the old tables kept or made."""
    return migrations.SeparateDatabaseAndState(
        state_operations=list(operations),
        database_operations=[CreateMissingTables(legacy_app, operations)],
    )


def move_content_types(legacy_app: str, app_label: str, models: Sequence[str]) -> Operation:
    """The models' content types from the old app label to the new one (and back)."""

    def mover(src: str, dst: str) -> Callable[[Any, Any], None]:
        def move(apps: Any, schema_editor: Any) -> None:
            content_types = apps.get_model("contenttypes", "ContentType").objects.using(
                schema_editor.connection.alias
            )
            for model in models:
                if not content_types.filter(app_label=dst, model=model).exists():
                    content_types.filter(app_label=src, model=model).update(app_label=dst)

        return move

    return migrations.RunPython(mover(legacy_app, app_label), mover(app_label, legacy_app))
