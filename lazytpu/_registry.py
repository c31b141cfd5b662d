"""One decorator registry: keys (ops, FX targets, names) -> what serves them.

    GRAPH_RULES = Registry("graph rule")

    @GRAPH_RULES.register(aten.sym_size.int)
    def _sym_size(fn, x, dim): ...

A registry is filled only through ``register``: each key once, a duplicate
raises ``ValueError`` naming the registry, the key and the function that
has it. ``register(*keys, wrap=f)`` stores ``f(fn)`` instead of ``fn`` (a
lowering stores a ``Rule``); a registry made with ``expand=`` registers what
that returns for each key (the lowering registry expands an op packet into
its functional overloads). The decorator returns ``fn`` itself.

Reads are a plain dict's, ``entries``: ``get`` is that dict's own bound
``get`` (a lookup per op costs what a dict's does; bind it to a module name,
``get_rule = RULES.get``, to skip even the attribute load), and ``in``,
``[]``, ``len``, iteration and ``keys()`` go to it. A test that swaps an
entry in does it on ``entries`` (``monkeypatch.setitem(RULES.entries, op,
rule)``); code never writes there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator


class Registry:
    """Keys -> registered values, each key registered once (see the module docstring)."""

    __slots__ = ("name", "expand", "entries", "get", "owners")

    def __init__(self, name: str, *, expand: Callable[[object], Iterable] | None = None) -> None:
        self.name = name  # what an entry is, for error messages: "lowering", "graph rule", ...
        self.expand = expand
        self.entries: dict = {}
        self.get = self.entries.get
        self.owners: dict = {}  # key -> the function registered for it

    def register(self, *keys, wrap: Callable | None = None) -> Callable[[Callable], Callable]:
        """A decorator registering ``fn`` (or ``wrap(fn)``) for every key.

        Raises:
            ValueError: a key already has an entry.
        """

        def decorator(fn: Callable) -> Callable:
            value = fn if wrap is None else wrap(fn)
            for given in keys:
                for key in (given,) if self.expand is None else self.expand(given):
                    if key in self.entries:
                        owner = self.owners.get(key)
                        first = getattr(owner, "__qualname__", repr(owner))
                        shown = repr(key) if isinstance(key, str) else key
                        raise ValueError(f"duplicate {self.name} for {shown}: {first} has it")
                    self.entries[key] = value
                    self.owners[key] = fn
            return fn

        return decorator

    def __contains__(self, key) -> bool:
        return key in self.entries

    def __getitem__(self, key):
        return self.entries[key]

    def __iter__(self) -> Iterator:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def keys(self):
        return self.entries.keys()

    def __repr__(self) -> str:
        return f"<Registry {self.name!r}: {len(self.entries)} entries>"
