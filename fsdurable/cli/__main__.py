"""``python -m fsdurable.cli`` is the ``fsdurable`` command (as ``python -m fsdurable`` is)."""

import sys

from . import main

sys.exit(main())
