"""Slots the trusted code calls, pinned by identity (gpu_worker.pins): a module's attribute, an entry of a
class's dict or of a base's shadowed in a subclass, a builtin shadowed in a module, a dict's entry; torch's
own lazy rewrap is no rebinding; the check looks nothing up at call time and is one function for the
Pins' life."""

from __future__ import annotations

import dis
import types

import torch

from gpu_worker.child.core import _torch_rewrap
from gpu_worker.pins import Pins


def test_rebindings_of_every_kind_are_named():
    mod = types.ModuleType("trusted_mod")
    mod.timer = len

    class Base:
        def copy(self):
            return 1

    class Child(Base):
        pass

    table = {"perf": abs}
    p = Pins()
    check = p.check
    p.add_module(mod, shadowing=True)
    p.add_class(Child)
    p.add("T", table, ["perf"])
    assert p.changed() == [] and len(p) > 150
    mod.timer = max  # a module's attribute
    Child.copy = lambda self: 2  # a subclass's entry shadowing its base's
    mod.isinstance = lambda *a: True  # a builtin shadowed in the module's globals
    table["perf"] = min  # a dict's entry
    names = p.changed()
    assert set(names) == {"trusted_mod.timer", "trusted_mod.isinstance", "T.perf",
                          f"{Child.__module__}.{Child.__qualname__}.copy"}, names
    assert check is p.check and len(check()) == 4  # a caller may hold the check
    del Child.copy, mod.isinstance
    mod.timer, table["perf"] = len, abs
    assert p.changed() == []
    table["perf"] = min
    p.forget(table, ["perf"])  # the trusted code's own change
    assert p.changed() == []
    mod.timer = max
    p.repin()
    assert p.changed() == []


def test_the_check_looks_up_no_global_and_no_builtin():
    p = Pins()
    p.add("T", {"a": len}, ["a"])
    code = p.check.__code__
    loads = [i for c in [code] + [k for k in code.co_consts if isinstance(k, types.CodeType)]
             for i in dis.get_instructions(c) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
    assert loads == [], loads


def test_torch_s_own_lazy_wrapper_is_no_rebinding():
    fake = types.ModuleType("fake_torch")

    def seed(n):
        return n

    fake.manual_seed = seed
    p = Pins(same=_torch_rewrap(torch))
    p.add_module(fake)
    fake.manual_seed = torch._disable_dynamo(seed)  # what importing torch._dynamo does to torch.manual_seed
    assert p.changed() == [] and p.check() == []  # pinned again as it is now
    fake.manual_seed = torch._disable_dynamo(len)  # the same wrapper round another function
    assert p.changed() == ["fake_torch.manual_seed"]
