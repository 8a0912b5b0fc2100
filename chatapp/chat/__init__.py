"""The chat feature: conversations and messages, the socket, a reply's life, titles,
exports, and the KV tier warm-up of the system prompts conversations use."""
