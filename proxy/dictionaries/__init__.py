"""Pre-trained zstd dictionaries: loaded at start, and trained (codec-spec.md §5)."""
