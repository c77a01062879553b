"""``python -m countersink``: the ``countersink`` command."""

import sys

from countersink.cli import main

sys.exit(main())
