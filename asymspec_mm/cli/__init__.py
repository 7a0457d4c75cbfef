"""The command line (``asymspec-mm``): :mod:`~asymspec_mm.cli.main` is its composition root (it alone may import
``ui``, and nothing imports it); the other modules are helpers the edges share: the options every subcommand takes,
output, run identities for resumable commands, the ``batch`` command and its files.
"""
