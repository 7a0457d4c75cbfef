"""Read-only copies of JSON-shaped values: what a checked :class:`~asymspec_mm.request.request.Request` holds, so
that nothing can change a request after its check (a frozen dataclass stops attribute assignment, not a change
inside the list of messages or tools it holds). :func:`frozen` makes the copy; :func:`thawed` gives a plain,
changeable copy back to code outside the toolkit that may want ``list``/``dict`` (chat templates, xgrammar)."""

from __future__ import annotations

from typing import Any, NoReturn


class FrozenDict(dict):
    """A ``dict`` that refuses every change (it is still a ``dict``: readers, ``json.dumps`` and templates take it
    as one); copies and pickles are frozen too."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("this dict belongs to a checked Request and is read-only: build a new Request instead")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple:
        return (FrozenDict, (dict(self),))

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return self.__reduce__()

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict) -> FrozenDict:
        return self


def frozen(value: Any) -> Any:
    """``value`` with every ``dict`` in it a :class:`FrozenDict` and every ``list`` a ``tuple``, all the way down
    (other values, images included, are kept as they are)."""
    if isinstance(value, dict):
        return value if isinstance(value, FrozenDict) else FrozenDict({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """A plain copy of ``value`` (:func:`frozen`'s inverse): every ``dict`` (a :class:`FrozenDict` included) a new
    ``dict`` and every ``tuple`` or ``list`` a new ``list``, all the way down; other values are kept as they are. What
    a checked request's tools and formats are handed to templates and grammar compilers as, so that neither sees our
    read-only types nor can change the request."""
    if isinstance(value, dict):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thawed(v) for v in value]
    return value
