"""``python -m picrl``: the same CLI as the ``picrl`` script."""

import sys

from picrl.cli import main

sys.exit(main())
