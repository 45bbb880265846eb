"""A client of a Codec server, without I/O: what it asks, what it reads back, what it trusts.

Two such clients share it: the OpenAI SDK transport (proxy/sdk/) and codec-proxy in front of a
Codec server (`upstream_protocol = "codec"`, proxy/server/control/codec_upstream.py). Each does
its own I/O and nothing else: `ask.py` says which requests go as Codec and which refusals send
them back to JSON, `answer.py` what an answer's head says and how its body is rendered (with
proxy/core/render/), `assets.py` which maps and dictionaries are trusted (by their sha256), and
`reading.py` how a map, a dictionary or an error body is read within a bound.
"""
