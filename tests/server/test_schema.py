"""`GET /codec/schema` serves a proto3 schema that compiles and matches what we emit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from proxy.core import codec_pb2
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


async def test_schema_compiles_and_lists_only_emitted_fields(
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
    assert messages["CodecFrame"] == {"ids": 1, "done": 2, "finish_reason": 3}
    assert "ToolCall" not in messages  # not emitted yet, so not advertised
    # The fields we do emit have the numbers and types of the class that encodes them.
    generated = codec_pb2.CodecFrame.DESCRIPTOR.fields_by_name
    frame = next(m for m in served.message_type if m.name == "CodecFrame")
    for field in frame.field:
        assert generated[field.name].number == field.number
        assert generated[field.name].type == field.type
    assert messages["CodecRequest"] == {
        "prompt_ids": 1,
        "max_tokens": 2,
        "temperature": 3,
        "stop": 4,
        "stream_format": 5,
    }
