"""Deployment files (container, Kubernetes, Helm, ingress) and the tools that check them."""
