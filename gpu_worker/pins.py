"""What a candidate child's trusted code calls, pinned by identity before the candidate loads.

A candidate that escapes the static rules runs arbitrary Python in the child's process: it can rebind a
module's attribute (`time.perf_counter`), an entry of a class's dict (`torch.Tensor.copy_`, a handler of
the child's), of an instance's dict or of a dict the harness keeps (`self.T["perf"]`). `Pins` holds, for
every such slot the trusted code depends on, the object it held when the slot was pinned; `changed()` names
the slots that hold another object now. The child checks after every call of the candidate, before any of
its own code runs again (gpu_worker.child.core.ChildCore.after_candidate), so a rebinding is refused before
it is used, even one the candidate would undo later.

The check cannot be rebound itself the same ways: it is a function whose state lives in its default
arguments (reading or writing `__defaults__` and `__code__` from candidate code is refused by the guard's
audit hook), that looks up no global and no builtin at call time, and whose table is a tuple.
"""

from __future__ import annotations

import operator
import sys
import types

_MISSING = object()


def _slots(mapping, keys=None) -> list[tuple]:
    """(mapping, key, object now) for each key (default: every key whose value is a function, a builtin,
    a class or a module: what code calls or reaches through; data that changes as the program runs is left)."""
    kinds = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
             types.MethodWrapperType, types.ClassMethodDescriptorType, types.GetSetDescriptorType,
             types.MemberDescriptorType, staticmethod, classmethod, property, type, types.ModuleType)
    if keys is None:
        keys = [k for k, v in list(mapping.items()) if isinstance(v, kinds)]
    return [(mapping, k, mapping.get(k, _MISSING)) for k in keys]


def _groups(table: tuple) -> tuple:
    groups: dict[int, tuple] = {}
    for m, k, v in table:
        g = groups.setdefault(id(m), (m, [], []))
        g[1].append(k)
        g[2].append(v)
    return tuple((m, tuple(ks), tuple(vs), (_MISSING,) * len(ks)) for m, ks, vs in groups.values())


def _make_check(state: list):
    """The check over `state[0]` (grouped slots), one C-level pass per mapping (`map` over `dict.get`):
    tens of microseconds for a few thousand slots. The list is reachable only through the function's
    defaults; `Pins.add` replaces its item."""

    def changed(_state=state, _map=map, _any=any, _is_not=operator.is_not, _missing=_MISSING, _zip=zip):
        return [(m, k) for m, ks, vs, none in _state[0] if _any(_map(_is_not, _map(m.get, ks, none), vs))
                for k, v in _zip(ks, vs) if m.get(k, _missing) is not v]

    return changed


class Pins:
    """Slots pinned by identity (see the module's docstring). `add` pins more (trusted code only, right
    after a check: what it pins is what the trusted code created or verified); `forget` drops the slots of
    a mapping the trusted code changes itself; `check()` returns (mapping, key) of each slot that holds
    another object than when pinned, `changed()` their names. `check` is one function for the Pins' life:
    a caller may hold it."""

    def __init__(self, same=None):
        """`same(old, new)`: whether a slot's new object is the pinned one under a wrapper of the library's
        own (torch wraps some of its functions when a module of its is first imported)."""
        self.table: tuple = ()
        self.names: dict = {}  # id(mapping) -> its name in reports
        self.same = same
        self.check = _make_check([()])

    def _set(self, table: tuple) -> None:
        self.table = table
        self.check.__defaults__[0][0] = _groups(table)

    def add(self, name: str, mapping, keys=None) -> None:
        if isinstance(mapping, types.MappingProxyType):  # a class's dict: its dict.get is 5x faster than the proxy's
            import gc

            mapping = gc.get_referents(mapping)[0]
        if not isinstance(mapping, dict):
            raise TypeError(f"{name}: a dict is pinned, not {type(mapping).__name__}")
        self.names[id(mapping)] = name
        self._set(self.table + tuple(_slots(mapping, keys)))

    def repin(self) -> None:
        """Every slot again as it is now: after the trusted code's own changes (the guard's install), before
        any candidate code runs."""
        self._set(tuple((m, k, m.get(k, _MISSING)) for m, k, _ in self.table))

    def forget(self, mapping, keys) -> None:
        keys = set(keys)
        self._set(tuple(s for s in self.table if not (s[0] is mapping and s[1] in keys)))

    def add_module(self, module, shadowing: bool = False) -> None:
        """The module's functions, classes and submodules; with `shadowing`, also the absence of every
        builtin's name from its dict (its code looks builtins up through its globals first)."""
        self.add(module.__name__, vars(module))
        if shadowing:
            import builtins

            self.add(module.__name__, vars(module), [k for k in vars(builtins) if k not in vars(module)])

    def add_class(self, cls) -> None:
        """Every name the class resolves through its own dict and its bases' (not `object`'s), in each of
        those dicts: an entry added to a subclass's dict shadows its base's."""
        mro = cls.__mro__[:-1]
        names = {k for c in mro for k in vars(c) if k != "__doc__"}
        for c in mro:
            self.add(f"{c.__module__}.{c.__qualname__}", vars(c), sorted(names))

    def changed(self) -> list[str]:
        found = self.check()
        if found and self.same is not None:
            pinned = {(id(m), k): v for m, k, v in self.table}
            benign = {(id(m), k) for m, k in found if self.same(pinned[(id(m), k)], m.get(k, _MISSING))}
            if benign:  # pinned again as they are now
                self._set(tuple((m, k, m.get(k, _MISSING) if (id(m), k) in benign else v) for m, k, v in self.table))
                found = [(m, k) for m, k in found if (id(m), k) not in benign]
        return [f"{self.names.get(id(m), '?')}.{k}" for m, k in found]

    def __len__(self) -> int:
        return len(self.table)


def trusted_modules() -> list:
    """The loaded modules whose code serves a candidate child's commands."""
    names = ("gpu_worker.child", "gpu_worker.child.process", "gpu_worker.child.server", "gpu_worker.child.core",
             "gpu_worker.child.inputs", "gpu_worker.child.loading", "gpu_worker.child.verify",
             "gpu_worker.child.exports", "gpu_worker.child.timing", "gpu_worker.child.profile",
             "gpu_worker.child.reference", "gpu_worker.child.transfers", "gpu_worker.timing_inputs",
             "gpu_worker.protocol", "gpu_worker.guard",
             "gpu_worker.pins", "gpu_worker.wall", "multiprocessing.connection", "pickle", "time", "os", "threading",
             "hashlib", "math")
    return [sys.modules[n] for n in names if n in sys.modules]
