"""``python -m ftis_flwr.cli``: the ``ftis-flwr`` command, from this interpreter's environment."""

import sys

from ftis_flwr.cli import main

sys.exit(main())
