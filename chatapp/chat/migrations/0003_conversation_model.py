"""Several models served (issue 17, item 2): a conversation's model, and on each message
the model and the tokenizer its token ids are in. Blank on the rows before: the default."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0002_attachments'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='model',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='message',
            name='model',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='message',
            name='tokenizer',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
    ]
