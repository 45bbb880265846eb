"""The control plane: routes, validation, auth, errors, discovery, the proxy's own answers."""
