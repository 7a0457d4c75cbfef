"""``python -m asymspec_mm.cli``: the ``asymspec-mm`` command."""

from .main import run

run()
