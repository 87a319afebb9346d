"""``python -m fsdurable`` is the ``fsdurable`` command."""

import sys

from .cli import main

sys.exit(main())
