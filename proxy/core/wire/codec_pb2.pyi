from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CodecFrame(_message.Message):
    __slots__ = ("ids", "done", "finish_reason", "tool_calls")
    IDS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    done: bool
    finish_reason: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., done: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("name", "arguments_json", "id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    id: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class CodecRequest(_message.Message):
    __slots__ = ("prompt_ids", "max_tokens", "temperature", "stop", "stream_format")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STREAM_FORMAT_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    temperature: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stream_format: str
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stream_format: _Optional[str] = ...) -> None: ...
