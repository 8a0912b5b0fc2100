"""The Celery app. With no broker configured, tasks run in-process (eager).

Its settings are the CELERY_* ones of chatapp/settings/base.py, the routes included: the
long jobs (LONG_TASKS) go to CELERY_LONG_QUEUE, everything else to CELERY_DEFAULT_QUEUE,
and each queue has its own worker (`celery -A chatapp worker --queues=...`; docs/jobs.md).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings.dev")

app = Celery("chatapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
