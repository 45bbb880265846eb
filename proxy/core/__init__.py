"""The sans-IO core: pure functions and small stateful objects with `feed()`/`flush()` methods.

Nothing in this package performs IO: no aiohttp, no asyncio, no sockets, no files. Bytes and
text go in, events, token IDs and bytes come out. `proxy.server` drives it.
"""
