"""``python -m verl.cli`` is the ``verl`` command."""

import sys

from verl.cli import main

sys.exit(main())
