"""`GET /codec/schema` serves a proto3 schema that compiles and matches what we emit."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2

from proxy.core.wire import codec_pb2
from proxy.core.wire.schema import served_schema
from tests.server.conftest import ProxyClient


def compile_schema(text: str, tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    (tmp_path / "served.proto").write_text(text)
    out = tmp_path / "served.desc"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{tmp_path}",
            f"--descriptor_set_out={out}",
            "served.proto",
        ],
        check=True,
    )
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


async def test_schema_compiles_and_lists_the_emitted_fields(
    proxy: ProxyClient,
    tmp_path: Path,
) -> None:
    async with proxy.get("/codec/schema") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    assert "message CodecFrame" in text
    assert "message CodecRequest" in text
    (served,) = compile_schema(text, tmp_path).file
    messages = {m.name: {f.name: f.number for f in m.field} for m in served.message_type}
    # Chat streams emit tool calls, so field 4 and its message are advertised.
    assert messages["CodecFrame"] == {"ids": 1, "done": 2, "finish_reason": 3, "tool_calls": 4}
    assert messages["ToolCall"] == {"name": 1, "arguments_json": 2, "id": 3}
    # The fields we emit have the numbers and types of the classes that encode them.
    for name, descriptor in [
        ("CodecFrame", codec_pb2.CodecFrame.DESCRIPTOR),
        ("ToolCall", codec_pb2.ToolCall.DESCRIPTOR),
    ]:
        generated = descriptor.fields_by_name
        served_message = next(m for m in served.message_type if m.name == name)
        for field in served_message.field:
            assert generated[field.name].number == field.number
            assert generated[field.name].type == field.type
    assert messages["CodecRequest"] == {
        "prompt_ids": 1,
        "max_tokens": 2,
        "temperature": 3,
        "stop": 4,
        "stream_format": 5,
    }


def test_schema_without_tool_calls_drops_field_4_and_its_message(tmp_path: Path) -> None:
    # served_schema can still advertise a proxy that emits no tool calls (codec-spec.md §3.4).
    proto = resources.files("proxy").joinpath("codec.proto").read_text()
    (served,) = compile_schema(served_schema(proto, tool_calls=False), tmp_path).file
    messages = {m.name: {f.name: f.number for f in m.field} for m in served.message_type}
    assert messages["CodecFrame"] == {"ids": 1, "done": 2, "finish_reason": 3}
    assert "ToolCall" not in messages
