"""A Codec response body's bytes in, the OpenAI JSON they render to out.

    body bytes --StreamDecompressor--> frame bytes --FrameDecoder--> Frames --renderer--> JSON

What a client in front of a Codec server needs, in one object with the shape of every stateful
piece here: `feed` each read of the body as it arrives (content-coded, as on the wire), `flush`
at its end, `fail` when the connection breaks. Whatever goes wrong inside (a coding or a frame
that does not decode, bytes after the terminal frame) ends the answer the renderer's way: an
error event after the text so far (openai.py), never an exception in the middle of a body the
client is already reading.

The body is decoded a piece at a time (the decompressor's `pieces`), each piece's frames
rendered before the next is decoded: a frame is refused at the frame cap (codec-spec.md §10)
as its bytes come out of the coding, never after the whole read is decoded. Decoded frames hold
their IDs at 4 bytes each (proxy/core/wire/decoder.py), so a frame costs a small multiple of its
size, plus the text it renders to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol

from proxy.core.compression.decompressors import StreamDecompressor
from proxy.core.errors import ProxyError
from proxy.core.render.turn import TurnEnd
from proxy.core.wire.decoder import DEFAULT_MAX_FRAME_BYTES, FrameDecoder
from proxy.core.wire.frames import Frame

__all__ = ["FrameFormat", "RenderedBody", "Renderer"]

# The formats a Codec response is sent in (proxy/core/wire/formats.py `SERVED_AS_ASKED`).
FrameFormat = Literal["msgpack", "msgpack-delta", "protobuf"]


class Renderer(Protocol):
    """openai.py's `SseRenderer` and `CompletionRenderer`."""

    @property
    def done(self) -> bool: ...

    @property
    def end(self) -> TurnEnd | None: ...

    @property
    def tokens(self) -> int: ...

    def feed(self, frames: Iterable[Frame]) -> bytes: ...

    def flush(self) -> bytes: ...

    def fail(self, message: str) -> bytes: ...


class RenderedBody:
    """One Codec response body rendered for an OpenAI client."""

    __slots__ = ("_decompressor", "_frames", "renderer", "wire_bytes")

    def __init__(
        self,
        renderer: Renderer,
        stream_format: FrameFormat,
        decompressor: StreamDecompressor,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.renderer = renderer
        self._decompressor = decompressor
        self._frames = FrameDecoder(stream_format, max_frame_bytes)
        # The body's bytes as they came over the wire (content-coded): what Codec cost.
        self.wire_bytes = 0

    @property
    def done(self) -> bool:
        return self.renderer.done

    @property
    def tokens(self) -> int:
        """IDs received so far."""
        return self.renderer.tokens

    @property
    def map_drift(self) -> bool:
        """Whether the answer ended at an ID past the map's vocabulary (render/turn.py): the
        map is to be fetched again before another answer is rendered with it."""
        end = self.renderer.end
        return end is not None and end.map_drift

    def feed(self, data: bytes) -> bytes:
        self.wire_bytes += len(data)
        renderer = self.renderer
        if renderer.done:
            # The answer is complete: what follows the terminal frame is the server's error,
            # and the client has all it asked for.
            return b""
        out = []
        try:
            for piece in self._decompressor.pieces(data):
                out.append(renderer.feed(self._frames.feed(piece)))
                if self.done:
                    break
        except ProxyError as exc:
            out.append(renderer.fail(exc.message))
        return b"".join(out)

    def flush(self) -> bytes:
        if self.renderer.done:
            return b""
        try:
            self._decompressor.flush()
            self._frames.flush()
        except ProxyError as exc:
            return self.renderer.fail(exc.message)
        return self.renderer.flush()

    def fail(self, message: str) -> bytes:
        return self.renderer.fail(message)
