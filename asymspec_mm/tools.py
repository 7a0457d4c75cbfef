"""The public path of tool-call parsing named in the design card (``asymspec_mm.tools.parse_tool_calls``); it lives
in :mod:`asymspec_mm.request.tools`, the requests layer."""

from .request.tools import ParsedAnswer, ToolCallStream, ToolError, parse_tool_calls

__all__ = ["ParsedAnswer", "ToolCallStream", "ToolError", "parse_tool_calls"]
