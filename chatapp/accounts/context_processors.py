from django.conf import settings
from django.http import HttpRequest


def flags(request: HttpRequest) -> dict[str, object]:
    return {"allow_signup": settings.CHAT_ALLOW_SIGNUP}
