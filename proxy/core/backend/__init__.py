"""The upstreams as the proxy sees them: balancing and ejection, readiness checks, and the
tokenizer drift check against the backend's `/tokenize`.
"""
