"""The OpenAI-compatible API (/v1): its keys and their per-key limits."""
