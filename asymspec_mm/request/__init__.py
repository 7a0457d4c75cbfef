"""Requests: the one request object, prompts, conversations, tools and grammars, compressed views (caption and
OCR), and the set-up that turns a request into a :class:`~asymspec_mm.request.session.Session` on the loaded models.

It sits above ``decode`` and ``engines`` and below the engine core (``asymspec_mm.core``), which it never imports:
set-up asks for its model calls through :mod:`asymspec_mm.engines.model_calls`.
"""
