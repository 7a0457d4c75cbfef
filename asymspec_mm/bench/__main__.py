"""``python -m asymspec_mm.bench [bench options]``."""

from .cli import main

raise SystemExit(main())
