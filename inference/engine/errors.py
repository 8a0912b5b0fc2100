"""Errors the engine raises to its callers. Each carries a stable machine code."""


class EngineError(Exception):
    """Something went wrong inside the engine; the request cannot continue."""

    code = "engine_error"
    # The engine worker that refused or failed the request (distributed mode; None: this
    # process's engine), so that the request's record names it.
    worker: str | None = None


class EngineBusyError(EngineError):
    """The waiting queue is full (requests or tokens): refused at once, try again later."""

    code = "busy"


class PromptTooLongError(EngineError):
    """The prompt (plus max_tokens) does not fit the model's context window."""

    code = "prompt_too_long"


class InvalidRequestError(EngineError):
    """Sampling settings or prompt ids are out of range."""

    code = "invalid_request"


class UnsupportedModelError(EngineError):
    """The model cannot be served correctly: an unknown architecture, rope type or weight
    type, or a tensor its architecture needs is missing. Raised at load, never mid-request."""

    code = "unsupported_model"
