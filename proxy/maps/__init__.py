"""Codec tokenizer maps around the sans-IO core: the packaged JSON Schema, publishing the map
of a loaded tokenizer, and the `codec-proxy map generate|verify` commands."""
