"""The vocab handshake: tokenizer maps (content, deterministic bytes, ids, checks), the
pre-tokenizer program, and the `/.well-known/codec/` discovery documents.
"""
