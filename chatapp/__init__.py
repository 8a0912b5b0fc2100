"""The Django project (settings, asgi, urls, celery) and its web apps: accounts, chat,
openai_api, observability, and the offline jobs they share."""

from chatapp.celery import app as celery_app

__all__ = ["celery_app"]
