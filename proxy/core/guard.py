"""Between the transcoder and the client: the frames this client may receive.

`StreamGuard` wraps a `CodecTranscoder` without changing it and keeps its contract (exactly one
terminal frame, the last, no empty non-terminal frames). It applies, in one place for every
Codec stream:

* the finish-reason floor (proxy/core/http/versioning.py): `policy_violation` reaches only clients
  at 0.4 or above; older ones get `error` (codec-spec.md §2, §6);
* the safety policy, when one is enabled (codec-spec.md §8): IDs are released as the matcher
  clears them; `redact` swaps spans for placeholder IDs; `stop` ends the stream at once with a
  terminal `policy_violation` frame carrying none of the offending IDs, after which the edge
  must cancel the upstream request (`stopped` says so) rather than drain it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from proxy.core.http.versioning import ClientVersion, finish_reason_for
from proxy.core.safety.stream import PolicedIds
from proxy.core.stream.transcode import StreamOutcome
from proxy.core.wire import finish
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall


class FrameSource(Protocol):
    """What the edge pumps: upstream bytes in, frames out (`CodecTranscoder`'s interface)."""

    @property
    def done(self) -> bool: ...

    @property
    def outcome(self) -> StreamOutcome | None: ...

    @property
    def token_source(self) -> str | None: ...

    def feed(self, data: bytes) -> list[Frame]: ...

    def flush(self) -> list[Frame]: ...

    def fail(self, error: str) -> list[Frame]: ...


class StreamGuard:
    """A `FrameSource` that wraps another. One per response."""

    def __init__(
        self, source: FrameSource, client: ClientVersion, policed: PolicedIds | None = None
    ) -> None:
        self._source = source
        self._client = client
        self._policed = policed
        self._violation: str | None = None
        self._held_tools: tuple[ToolCall, ...] = ()
        self._redactions = 0
        self._sent = 0
        self._outcome: StreamOutcome | None = None

    @property
    def done(self) -> bool:
        return self._outcome is not None

    @property
    def stopped(self) -> str | None:
        """The category whose `stop` rule ended the stream; the upstream must be cancelled."""
        return self._violation

    @property
    def redactions(self) -> int:
        """How many spans the policy replaced with a placeholder so far."""
        return self._redactions

    @property
    def source(self) -> FrameSource:
        return self._source

    @property
    def outcome(self) -> StreamOutcome | None:
        return self._outcome

    @property
    def token_source(self) -> str | None:
        return self._source.token_source

    def feed(self, data: bytes) -> list[Frame]:
        return self._guard(self._source.feed(data))

    def flush(self) -> list[Frame]:
        return self._guard(self._source.flush())

    def fail(self, error: str) -> list[Frame]:
        return self._guard(self._source.fail(error))

    def _guard(self, frames: list[Frame]) -> list[Frame]:
        if self._outcome is not None:
            return []
        if self._policed is None and (not frames or not frames[-1].done):
            # The common case, once per feed: no policy, no terminal frame (only a
            # terminal frame can be last; what the floor changes is only its finish reason).
            for frame in frames:
                self._sent += len(frame.ids)
            return frames
        out: list[Frame] = []
        for frame in frames:
            guarded = frame if self._policed is None else self._police(self._policed, frame)
            if guarded is None:
                continue
            if guarded.done:
                reason = finish_reason_for(self._client, guarded.finish_reason or finish.ERROR)
                guarded = replace(guarded, finish_reason=reason)
            self._sent += len(guarded.ids)
            out.append(guarded)
            if guarded.done:
                self._finish(guarded)
                break
        return out

    def _police(self, policed: PolicedIds, frame: Frame) -> Frame | None:
        released = policed.feed(frame.ids)
        if frame.done:
            released = released.then(policed.flush())
        self._redactions += len(released.redactions)
        if released.stop is not None:
            self._violation = released.stop
            return Frame(released.ids, done=True, finish_reason=finish.POLICY_VIOLATION)
        # Tool calls are not policed text: they ride on the next frame that goes out, since a
        # non-terminal frame may not be empty (codec-spec.md §2).
        tools = self._held_tools + frame.tool_calls
        if not (frame.done or released.ids):
            self._held_tools = tools
            return None
        self._held_tools = ()
        return replace(frame, ids=released.ids, tool_calls=tools)

    def _finish(self, terminal: Frame) -> None:
        reason = terminal.finish_reason or finish.ERROR
        source = self._source.outcome
        if source is None:
            self._outcome = StreamOutcome(reason, None, self._sent, None)
            return
        error = None if self._violation is not None else source.error
        self._outcome = replace(source, finish_reason=reason, error=error, tokens=self._sent)
