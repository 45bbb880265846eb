"""codec-proxy: an aiohttp reverse proxy that turns OpenAI JSON-SSE into Codec token-ID frames."""

__version__ = "0.1.0"
