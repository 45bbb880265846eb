"""The one error `proxy.tokenizers` raises on purpose."""

from __future__ import annotations

from proxy.core.errors import ProxyError


class TokenizerLoadError(ProxyError):
    """A tokenizer source could not be loaded exactly as the backend tokenizes (500).

    The message is one line that names the file and the problem, because it ends up in startup
    logs and in the 500 body of every request until an operator fixes the configuration.
    """

    status_hint = 500
    error_type = "server_error"


def one_line(exc: BaseException) -> str:
    """A foreign exception's text folded onto one line, for embedding in our own message."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
