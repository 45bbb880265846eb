"""Rendering OpenAI JSON from Codec frames: the way back from IDs to what an OpenAI client reads.

Frames (decoded by proxy/core/wire/decoder.py) in, the JSON-SSE chunks of `/v1/completions` or
`/v1/chat/completions` out, or the whole JSON answer: `text.py` turns IDs into text with the
published map, `turn.py` a stream's frames into its text, tool calls and end, `openai.py` those
into OpenAI's shapes, `body.py` drives it all from a Codec response body's bytes, and
`response.py` is that body as the proxy's data plane streams it. A Codec client
(proxy/core/client/) assembles them for the answers it renders.
"""
