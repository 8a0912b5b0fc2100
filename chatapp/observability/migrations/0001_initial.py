"""The observability app's models, in the tables the app `inference` made before the split (a
database made then keeps every row: chatapp/adopted_tables.py)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from chatapp.adopted_tables import CONTENTTYPES, adopt, move_content_types


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        CONTENTTYPES,
        ('chat', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        adopt(
            'inference',
            [
                migrations.CreateModel(
                    name='EngineSample',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('at', models.DateTimeField(db_index=True)),
                        ('worker', models.CharField(blank=True, default='', max_length=120)),
                        ('running', models.PositiveIntegerField(default=0)),
                        ('waiting', models.PositiveIntegerField(default=0)),
                        ('batch_size', models.PositiveIntegerField(default=0)),
                        ('step_tokens', models.PositiveIntegerField(default=0)),
                        ('step_seconds', models.FloatField(default=0.0)),
                        ('kv_usage', models.FloatField(default=0.0)),
                        ('prefix_queries', models.BigIntegerField(default=0)),
                        ('prefix_hits', models.BigIntegerField(default=0)),
                        ('refused', models.BigIntegerField(default=0)),
                        ('steps', models.BigIntegerField(default=0)),
                    ],
                    options={
                        'db_table': 'inference_enginesample',
                        'ordering': ['-at'],
                    },
                ),
                migrations.CreateModel(
                    name='MinuteRollup',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('minute', models.DateTimeField(unique=True)),
                        ('requests', models.PositiveIntegerField(default=0)),
                        ('errors', models.JSONField(blank=True, default=dict)),
                        ('finish_reasons', models.JSONField(blank=True, default=dict)),
                        ('stats', models.JSONField(blank=True, default=dict)),
                        ('hists', models.JSONField(blank=True, default=dict)),
                        ('output_tokens', models.PositiveIntegerField(default=0)),
                        ('prompt_tokens', models.PositiveIntegerField(default=0)),
                        ('cached_tokens', models.PositiveIntegerField(default=0)),
                        ('cached_tokens_redis', models.PositiveIntegerField(default=0)),
                        ('drafted_tokens', models.PositiveIntegerField(default=0)),
                        ('accepted_tokens', models.PositiveIntegerField(default=0)),
                        ('samples', models.PositiveIntegerField(default=0)),
                        ('running_avg', models.FloatField(null=True)),
                        ('waiting_avg', models.FloatField(null=True)),
                        ('batch_size_avg', models.FloatField(null=True)),
                        ('kv_usage_avg', models.FloatField(null=True)),
                        ('prefix_queries', models.BigIntegerField(default=0)),
                        ('prefix_hits', models.BigIntegerField(default=0)),
                        ('refused', models.BigIntegerField(default=0)),
                    ],
                    options={
                        'db_table': 'inference_minuterollup',
                        'ordering': ['-minute'],
                    },
                ),
                migrations.CreateModel(
                    name='RequestRecord',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('finished_at', models.DateTimeField(db_index=True)),
                        ('source', models.CharField(max_length=16)),
                        ('request_id', models.CharField(blank=True, default='', max_length=80)),
                        ('worker', models.CharField(blank=True, default='', max_length=120)),
                        ('ttft', models.FloatField(null=True)),
                        ('tpot', models.FloatField(null=True)),
                        ('itl_p50', models.FloatField(null=True)),
                        ('itl_p90', models.FloatField(null=True)),
                        ('itl_p99', models.FloatField(null=True)),
                        ('itl_hist', models.JSONField(blank=True, default=dict)),
                        ('queue_time', models.FloatField(null=True)),
                        ('prefill_time', models.FloatField(null=True)),
                        ('decode_time', models.FloatField(null=True)),
                        ('network_time', models.FloatField(null=True)),
                        ('e2e', models.FloatField(null=True)),
                        ('prompt_tokens', models.PositiveIntegerField(default=0)),
                        ('cached_tokens', models.PositiveIntegerField(default=0)),
                        ('cached_tokens_redis', models.PositiveIntegerField(default=0)),
                        ('output_tokens', models.PositiveIntegerField(default=0)),
                        ('drafted_tokens', models.PositiveIntegerField(default=0)),
                        ('accepted_tokens', models.PositiveIntegerField(default=0)),
                        ('preemptions', models.PositiveIntegerField(default=0)),
                        ('finish_reason', models.CharField(blank=True, default='', max_length=32)),
                        ('error_code', models.CharField(blank=True, default='', max_length=64)),
                        ('replayed', models.BooleanField(default=False)),
                        ('conversation', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='chat.conversation')),
                        ('user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'inference_requestrecord',
                        'ordering': ['-finished_at'],
                    },
                ),
            ],
        ),
        move_content_types('inference', 'observability', ['enginesample', 'minuterollup', 'requestrecord']),
    ]
