"""Read-only links to a conversation's snapshot (chatapp/chat/shares.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0003_conversation_model"),
    ]

    operations = [
        migrations.CreateModel(
            name="SharedLink",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("token", models.CharField(max_length=64, unique=True)),
                ("snapshot", models.JSONField(default=dict)),
                ("show_author", models.BooleanField(default=False)),
                ("show_settings", models.BooleanField(default=False)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("shared_at", models.DateTimeField()),
                (
                    "conversation",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="shared_link",
                        to="chat.conversation",
                    ),
                ),
            ],
            options={"ordering": ["-shared_at", "-id"]},
        ),
    ]
