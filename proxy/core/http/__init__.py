"""What the HTTP exchange decides, without doing IO: request validation, the upstream body,
hop-by-hop headers, content negotiation (Accept, Accept-Encoding, request Content-Encoding),
client versions, and the 426 upgrade answer.
"""
