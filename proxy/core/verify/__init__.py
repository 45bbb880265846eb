"""Continuous verification: a sampled stream's IDs, decoded as a client decodes them with the
published map, checked against the text the upstream streamed.

Decoding with the map's bytes (not the `tokenizers` object the IDs came from, which agrees by
construction) is what makes the check worth something: it catches a map that does not say what
the tokenizer does, a table that went wrong, and IDs the text does not account for.
"""
