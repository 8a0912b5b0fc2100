"""Serving: the engine library (inference.engine) and every way to reach it (client.py,
backends/, workers/). No Django models, and no import of the web apps (chatapp)."""
