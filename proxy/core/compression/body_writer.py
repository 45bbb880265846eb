"""A Codec response body, sans-IO: frames in, the bytes to send out, on the flush schedule.

One object per response owns the whole tail of the pipeline (codec-spec.md §5):

    frames --FlushPolicy--> flush windows --merge_frames--> --FrameEncoder--> --compressor-->

The edge owns only the clock and the awaited write: it calls `feed` with the frames a read
produced, writes what comes back, and when `deadline()` passes without a read it calls
`on_deadline` and writes that. Identity is one more compressor; with it every feed is written
at once, frame by frame, as the frames came (`IDENTITY_FLUSH`), since nothing is gained by
waiting. Times are seconds on any monotonic clock (the edge uses the event loop's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from proxy.core.compression.compressors import StreamCompressor
from proxy.core.compression.flush import FlushConfig, FlushPolicy, merge_frames
from proxy.core.http.content_coding import IDENTITY
from proxy.core.wire.frames import Frame, FrameEncoder

# An uncompressed body gains nothing from holding frames back or merging them.
IDENTITY_FLUSH: Final = FlushConfig(interval_ms=0, max_frames=0, merge=False)


def flush_config_for(coding: str, configured: FlushConfig) -> FlushConfig:
    """The schedule a response in `coding` is sent on: the configured one, or identity's.

    bench/compression.py measures each coding on this same schedule for the curve the coding
    negotiation reads (core/http/coding_sizes.py).
    """
    return IDENTITY_FLUSH if coding == IDENTITY else configured


class BodyWriter:
    """Encode, merge, compress and flush one stream's frames. `flush()` once, at the end."""

    __slots__ = (
        "_compressor",
        "_encode",
        "_encoder",
        "_every_frame",
        "_finished",
        "_merge",
        "_pending",
        "_plain",
        "_policy",
    )

    def __init__(
        self, encoder: FrameEncoder, compressor: StreamCompressor, config: FlushConfig
    ) -> None:
        self._encoder = encoder
        self._encode = encoder.encode
        self._compressor = compressor
        self._merge = config.merge
        self._every_frame = config.every_frame
        self._policy = FlushPolicy(config)
        self._pending: list[Frame] = []
        self._finished = False  # the compressed stream has been ended (terminal frame sent)
        # Every frame written at once, as encoded: nothing to schedule, merge or compress.
        self._plain = self._every_frame and not self._merge and compressor.coding == IDENTITY

    @property
    def encoder(self) -> FrameEncoder:
        return self._encoder

    @property
    def plain(self) -> bool:
        """Every frame is written at once, as encoded, with no schedule and no compression."""
        return self._plain

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, frames: Sequence[Frame], now: float) -> bytes:
        """Frames in stream order; the bytes to send now (often empty while a window fills)."""
        if not frames:
            return b""
        if self._plain:  # identity's path, once per token
            if frames[-1].done:
                self._finished = True
            if len(frames) == 1:
                return self._encode(frames[0])
            return b"".join([self._encode(frame) for frame in frames])
        if self._every_frame:  # no schedule to keep
            self._pending.extend(frames)
            return self._take_pending()
        flush_now = False
        for frame in frames:
            self._pending.append(frame)
            flush_now |= self._policy.on_frame(now, terminal=frame.done)
        return self._take_pending() if flush_now else b""

    def deadline(self) -> float | None:
        """When pending frames must be sent at the latest (`on_deadline`); None if none are."""
        return self._policy.deadline()

    def on_deadline(self, now: float) -> bytes:
        """The deadline has passed with no new frames: send what is pending."""
        return self._take_pending() if self._policy.due(now) else b""

    def flush(self) -> bytes:
        """End of input: everything pending, then the end of the compressed stream."""
        data = self._take_pending()
        if not self._finished:
            self._finished = True
            data += self._compressor.flush()
        return data

    def _take_pending(self) -> bytes:
        """Everything pending, encoded, compressed and synced (empty if nothing is pending).

        With the terminal frame the compressed stream is ended instead of synced: its end makes
        everything decodable too, without a sync marker before it.
        """
        if not self._pending:
            return b""
        frames = merge_frames(self._pending) if self._merge else self._pending
        self._pending = []
        self._policy.flushed()
        feed = self._compressor.feed
        encode = self._encode
        out = b"".join([feed(encode(frame)) for frame in frames])
        if frames[-1].done:
            self._finished = True
            return out + self._compressor.flush()
        return out + self._compressor.sync()
