"""The Codec wire: frames and their encoders, the client-side decoder, Path B request bodies,
the finish-reason vocabulary, tool calls on frames, and the served protobuf schema.

The lowest stage of the core: it knows bytes and the spec's formats, nothing of HTTP or of the
upstream's JSON.
"""
