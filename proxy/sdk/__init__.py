"""Codec for the OpenAI Python SDK, by changing how its client is built and nothing else.

    import httpx
    from openai import OpenAI
    from proxy.sdk import CodecTransport

    client = OpenAI(
        base_url="http://codec-proxy:8080/v1",
        api_key="...",
        http_client=httpx.Client(transport=CodecTransport()),
    )

`AsyncCodecTransport` does the same for `AsyncOpenAI(http_client=httpx.AsyncClient(...))`. Streamed
completions and chat completions travel as Codec frames and reach the SDK as the JSON-SSE it
expects; everything else passes through untouched. Needs `httpx` (`pip install
'codec-proxy[sdk]'`). docs/CLIENTS.md says what comes back from frames and what cannot.
"""

from proxy.core.client.assets import CodecAssets, CodecIntegrityError
from proxy.sdk.transport import AsyncCodecTransport, CodecStats, CodecTransport

__all__ = [
    "AsyncCodecTransport",
    "CodecAssets",
    "CodecIntegrityError",
    "CodecStats",
    "CodecTransport",
]
