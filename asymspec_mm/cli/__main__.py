"""``python -m asymspec_mm.cli``: the ``asymspec-mm`` command."""

import sys

from .main import main

sys.exit(main())
