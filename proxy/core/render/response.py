"""A Codec upstream's answer, rendered for a JSON client, as the proxy's data plane streams it.

codec-proxy in front of a Codec server (`upstream_protocol = "codec"`, docs/DEPLOY.md "Codec on
the long hop") asks the upstream for frames and answers its own clients in OpenAI JSON: the
SSE chunks of a streamed request, or the whole body of one that is not.
`RenderedResponseBody` is that answer as a `ResponseBody` (proxy/core/bodies.py: `feed` each
upstream read, `flush` at the end, `fail` when the upstream breaks), over the renderer's
`RenderedBody` (body.py, as proxy/core/client/answer.py assembles it), so the data plane
streams it as it streams every other kind.

* Streamed: the response starts with the first bytes rendered (a chat's role chunk comes with
  the first read). A failure after that is the renderer's: OpenAI's error event, then `[DONE]`.
* Whole: nothing is sent until the answer is complete, so its status can still say how it
  ended: 200 with the answer, or 502 with the error object when the stream failed (`error`).
"""

from __future__ import annotations

from typing import Final

from proxy.core.render.body import RenderedBody
from proxy.core.render.openai import CompletionRenderer, SseRenderer

__all__ = ["FAILED_STATUS", "STREAM_HEADERS", "WHOLE_HEADERS", "RenderedResponseBody"]

# What a JSON client's answer says of itself. No `Codec-*` header: the client never asked for
# Codec, and the frames it was made from are this proxy's business. A stream must be neither
# cached nor buffered by an intermediary (as the proxy's Codec streams, peers.md must-have 3).
STREAM_HEADERS: Final = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)
WHOLE_HEADERS: Final = (("Content-Type", "application/json"),)
# A whole answer whose stream failed: the upstream's fault, as for any relayed 5xx.
FAILED_STATUS: Final = 502


class RenderedResponseBody:
    """One Codec answer rendered as JSON: a `ResponseBody`."""

    __slots__ = ("_body", "_streamed", "size")

    passes_through = False

    def __init__(self, body: RenderedBody) -> None:
        self._body = body
        self._streamed = isinstance(body.renderer, SseRenderer)
        self.size = 0  # bytes rendered so far: the whole answer's length once `done`

    @property
    def streamed(self) -> bool:
        return self._streamed

    @property
    def ready(self) -> bool:
        return self._body.done or (self._streamed and self.size > 0)

    @property
    def done(self) -> bool:
        """The terminal frame was rendered (or the answer failed): nothing more is read."""
        return self._body.done

    @property
    def tokens(self) -> int:
        """Token IDs received so far."""
        return self._body.tokens

    @property
    def map_drift(self) -> bool:
        """The answer ended at an ID past its map's vocabulary (body.py)."""
        return self._body.map_drift

    @property
    def error(self) -> str | None:
        """Why a whole answer is an error object instead (None while it is not)."""
        renderer = self._body.renderer
        return renderer.error if isinstance(renderer, CompletionRenderer) else None

    @property
    def status(self) -> int:
        """The status of a whole answer once `done`; a stream's is 200 from the start."""
        return FAILED_STATUS if self.error is not None else 200

    def feed(self, chunk: bytes, now: float) -> bytes:
        return self._out(self._body.feed(chunk))

    def deadline(self) -> float | None:
        return None

    def on_deadline(self, now: float) -> bytes:
        return b""

    def flush(self, now: float) -> bytes:
        return self._out(self._body.flush())

    def fail(self, error: str, now: float) -> bytes | None:
        return self._out(self._body.fail(error))

    def _out(self, data: bytes) -> bytes:
        self.size += len(data)
        return data
