"""One upstream response becoming frames: SSE decoding, chunk parsing, where the IDs come from
(the backend's or retokenized), tool-call assembly, and the transcoder that guarantees one
terminal frame.
"""
