"""A frame sink that compresses a Codec stream and flushes it on the policy's schedule.

The sans-IO parts decide everything: `FlushPolicy` when to flush, `merge_frames` what a flush
window becomes, the `StreamCompressor` the bytes. This module owns what they cannot: the clock
(the event loop's), the timer that flushes a window when the upstream goes quiet, and the
awaited writes (backpressure reaches the upstream, as with the direct sink).
"""

from __future__ import annotations

import asyncio

from proxy.core.compressors import StreamCompressor
from proxy.core.flush import FlushConfig, FlushPolicy, merge_frames
from proxy.core.frames import Frame, FrameEncoder
from proxy.server.client_writer import ClientWriter


class CompressingFrameSink:
    """`FrameSink` with one compression context for the whole response (codec-spec.md §5).

    Writes come from two places, the pump (`write`, `close`) and the deadline timer; a lock
    keeps their flushes whole and in order. If a timer flush fails (the client left), the
    error is raised by the pump's next call, which then stops reading the upstream.
    """

    def __init__(
        self,
        writer: ClientWriter,
        encoder: FrameEncoder,
        compressor: StreamCompressor,
        config: FlushConfig,
    ) -> None:
        self._writer = writer
        self._encode = encoder.encode
        self._compressor = compressor
        self._merge = config.merge
        self._policy = FlushPolicy(config)
        self._pending: list[Frame] = []
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._finished = False  # the compressor has been finished (terminal frame sent)

    async def write(self, frames: list[Frame]) -> None:
        self._raise_failure()
        if not frames:
            return
        now = self._loop.time()
        flush_now = False
        for frame in frames:
            self._pending.append(frame)
            flush_now |= self._policy.on_frame(now, terminal=frame.done)
        if flush_now:
            await self._flush()
        else:
            self._arm_timer()

    async def close(self) -> None:
        """Flush what is left, end the compressed stream, end the body."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._timer_task is not None:
            # Let a flush in progress finish: cut short, its bytes would corrupt the stream.
            await self._timer_task
        self._raise_failure()
        async with self._lock:
            data = self._take_pending()
            if not self._finished:
                data += self._compressor.finish()
                self._finished = True
            if data:
                await self._writer.write(data)
        await self._writer.close()

    def abort(self) -> None:
        """Stop any scheduled flush: the stream ended without `close()` (the client left)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._timer_task is not None and not self._timer_task.done():
            self._timer_task.cancel()

    def _arm_timer(self) -> None:
        deadline = self._policy.deadline()
        if deadline is None:
            return
        if self._timer is not None and self._timer.when() == deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        if self._timer_task is None or self._timer_task.done():
            self._timer_task = self._loop.create_task(self._flush_from_timer())

    async def _flush_from_timer(self) -> None:
        try:
            await self._flush()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client left: hand it to the pump, which must stop
            self._failure = exc

    async def _flush(self) -> None:
        async with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            data = self._take_pending()
            if data:
                await self._writer.write(data)
            # Frames that arrived during the write start the next window.
            self._arm_timer()

    def _take_pending(self) -> bytes:
        """Everything pending, encoded, compressed and flushed (empty if nothing pending).

        With the terminal frame the compressor is finished instead of flushed: the end of the
        stream makes everything decodable too, without a flush marker before it.
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
            return out + self._compressor.finish()
        return out + self._compressor.flush()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
