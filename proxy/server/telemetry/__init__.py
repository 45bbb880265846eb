"""What the proxy reports about itself: Prometheus metrics and the per-request record."""
