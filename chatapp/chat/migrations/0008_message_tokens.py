from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0007_message_sources"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="tokens",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
