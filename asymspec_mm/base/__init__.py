"""The bottom layer: the gate's math, sampling, settings and errors; pure functions and small utilities (the models'
lock, timing, the log handling of other libraries' chatter). Nothing here imports another layer of the package.

Layers, bottom to top: ``base`` → ``engines`` → ``decode`` → ``requests`` → ``core`` → ``pipeline`` → the edges
(``cli``, ``serve``, ``eval``, ``bench``, ``tiny``); ``checkpoints`` builds model folders beside them. A layer imports
only the layers below it (``tests/test_layering.py``).
"""
