"""`python -m proxy` behaves like the `codec-proxy` command."""

import sys

from proxy.cli import main

sys.exit(main())
