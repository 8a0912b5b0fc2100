"""A rollup's latency summaries are its percentiles (docs/architecture.md, "Words"):
MinuteRollup.stats is renamed MinuteRollup.percentiles; the rows keep their values."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('observability', '0001_initial'),
    ]

    operations = [
        migrations.RenameField(model_name='minuterollup', old_name='stats', new_name='percentiles'),
    ]
