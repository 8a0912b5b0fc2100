"""A reply's numbers are its figures (docs/architecture.md, "Words"): Message.stats is
renamed Message.figures; the rows keep their values."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0004_shares'),
    ]

    operations = [
        migrations.RenameField(model_name='message', old_name='stats', new_name='figures'),
    ]
