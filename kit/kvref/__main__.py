"""``python -m kvref``: the ``kvref`` command."""

import sys

from kvref.cli import main

sys.exit(main())
