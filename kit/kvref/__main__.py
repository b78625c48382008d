"""``python -m kvref``: the ``kvref`` command."""

import sys

from kvref.console import main

sys.exit(main())
