"""Offline jobs, shared by the apps: the Job record, queueing a task to the broker or to
this process, the in-process scheduler, and `manage.py run_job`."""
