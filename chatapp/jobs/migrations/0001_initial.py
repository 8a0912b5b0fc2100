"""The jobs app's models, in the tables the app `inference` made before the split (a
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
            'inference',
            [
                migrations.CreateModel(
                    name='Job',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('benchmark', 'Benchmark'), ('export', 'Export'), ('tuning', 'Tuning'), ('kv_tier', 'Kv Tier')], max_length=16)),
                        ('status', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('done', 'Done'), ('failed', 'Failed')], default='queued', max_length=16)),
                        ('params', models.JSONField(blank=True, default=dict)),
                        ('result', models.JSONField(blank=True, default=dict)),
                        ('log', models.TextField(blank=True, default='')),
                        ('file', models.CharField(blank=True, default='', max_length=255)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('started_at', models.DateTimeField(blank=True, null=True)),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'inference_job',
                        'ordering': ['-created_at', '-id'],
                    },
                ),
            ],
        ),
        move_content_types('inference', 'jobs', ['job']),
    ]
