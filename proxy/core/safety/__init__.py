"""The safety policy: a public descriptor, private rules, and the matcher that enforces them.

codec-spec.md §8. The descriptor is published; the rules (banned token IDs, banned strings,
regular expressions) never leave the process: not in a response, a log line or an error.
"""
