"""The data plane: the bytes of each stream, from the upstream's connection to the client's.

Nothing here looks a request up in the app or the reloadable configuration: the control plane
decides (route, model, body kind, headers, timeouts) and hands the data plane what it decided.
"""
