"""The Django project and the chat feature."""

from chatapp.celery import app as celery_app

__all__ = ["celery_app"]
