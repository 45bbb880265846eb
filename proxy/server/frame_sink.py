"""Where a Codec stream's frames go: encoded, written with backpressure, ended once."""

from __future__ import annotations

from typing import Protocol

from proxy.core.frames import Frame, FrameEncoder
from proxy.server.client_writer import ClientWriter


class FrameSink(Protocol):
    """Takes a stream's frames in order; `close()` after the terminal frame."""

    async def write(self, frames: list[Frame]) -> None: ...

    async def close(self) -> None: ...

    def abort(self) -> None:
        """Stop anything scheduled; called however the stream ended (close or not)."""


class DirectFrameSink:
    """Encode and write every batch of frames at once (identity encoding)."""

    def __init__(self, writer: ClientWriter, encoder: FrameEncoder) -> None:
        self._writer = writer
        self._encode = encoder.encode

    async def write(self, frames: list[Frame]) -> None:
        if frames:
            await self._writer.write(b"".join([self._encode(frame) for frame in frames]))

    async def close(self) -> None:
        await self._writer.close()

    def abort(self) -> None:
        pass  # nothing is ever scheduled
