"""The openai_api app's models, in the tables the app `chatapp` made before the split (a
database made then keeps every row: chatapp/adopted_tables.py)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from chatapp.adopted_tables import CONTENTTYPES, adopt, move_content_types


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        CONTENTTYPES,
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        adopt(
            'chatapp',
            [
                migrations.CreateModel(
                    name='ApiKey',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=100)),
                        ('prefix', models.CharField(max_length=16)),
                        ('key_hash', models.CharField(max_length=64, unique=True)),
                        ('rate_limit_per_minute', models.PositiveIntegerField(default=0)),
                        ('max_concurrent', models.PositiveIntegerField(default=0)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_keys', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'chatapp_apikey',
                        'ordering': ['-created_at'],
                    },
                ),
            ],
        ),
        move_content_types('chatapp', 'openai_api', ['apikey']),
    ]
