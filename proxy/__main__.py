"""`python -m proxy` and the `codec-proxy` command.

SIGHUP is held from the first line on: its default action ends a process, and a reload can be
signalled at any moment (a config watcher that signals on each write, `kill -HUP`, `codec-proxy
reload`), also while the proxy imports and reads its configuration, which takes some 0.3 s
before `run_proxy`. Nothing slow is imported before the handler is in place.
"""

import sys

from proxy import hangups


def run() -> int:
    hangups.defer()
    from proxy.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
