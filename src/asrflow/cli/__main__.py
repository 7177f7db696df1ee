"""``python -m asrflow.cli``: the ``asrflow`` command line."""

import sys

from asrflow.cli import main

sys.exit(main())
