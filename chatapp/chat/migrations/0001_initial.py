"""The chat app's models, in the tables the app `chatapp` made before the split (a
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
                    name='Conversation',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('title', models.CharField(blank=True, default='', max_length=200)),
                        ('system_prompt', models.TextField(blank=True, default='')),
                        ('temperature', models.FloatField(default=0.7)),
                        ('top_p', models.FloatField(default=0.95)),
                        ('max_tokens', models.PositiveIntegerField(default=512)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='conversations', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'chatapp_conversation',
                        'ordering': ['-updated_at', '-id'],
                    },
                ),
                migrations.CreateModel(
                    name='Message',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(choices=[('system', 'System'), ('user', 'User'), ('assistant', 'Assistant')], max_length=16)),
                        ('text', models.TextField(blank=True, default='')),
                        ('token_ids', models.JSONField(blank=True, default=list)),
                        ('status', models.CharField(choices=[('complete', 'Complete'), ('streaming', 'Streaming'), ('stopped', 'Stopped'), ('error', 'Error')], default='complete', max_length=16)),
                        ('finish_reason', models.CharField(blank=True, default='', max_length=32)),
                        ('error', models.TextField(blank=True, default='')),
                        ('stats', models.JSONField(blank=True, default=dict)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('conversation', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='chat.conversation')),
                        ('parent', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='children', to='chat.message')),
                    ],
                    options={
                        'db_table': 'chatapp_message',
                        'ordering': ['id'],
                    },
                ),
                migrations.AddField(
                    model_name='conversation',
                    name='active_leaf',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='chat.message'),
                ),
                migrations.AddIndex(
                    model_name='message',
                    index=models.Index(fields=['conversation', 'id'], name='chatapp_mes_convers_e374d3_idx'),
                ),
                migrations.AddIndex(
                    model_name='conversation',
                    index=models.Index(fields=['owner', '-updated_at'], name='chatapp_con_owner_i_beaa0a_idx'),
                ),
            ],
        ),
        move_content_types('chatapp', 'chat', ['conversation', 'message']),
    ]
