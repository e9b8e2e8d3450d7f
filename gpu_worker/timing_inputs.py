"""A timed repetition's inputs: a pool set perturbed with values drawn for that repetition alone.

An entry is a number the worker hands out once per benchmark and side (gpu_worker.harness); its values are
`problem.perturbed(pool[entry % len(pool)], generator, distribution)` with the generator, on the device,
seeded with the entry's key. A candidate's child draws each key from the OS just before the repetition's
refill (`draw_key`), after the call before it returned, and reports it with the call: no value of a later
call exists in its process before that call. The reference child derives the same values from the same
key, so the baseline runs on exactly the candidate's values; its own repetitions take their keys from the
benchmark's secret noise seed (`entry_seed`). No side meets the same values twice, nor a permutation of
them: a memo keyed on the contents, on a sample of them or on an invariant of them finds nothing it stored.

`refill_cost` counts what making one repetition's values costs (device ops and bytes, and its time);
`scripts/refill_cost.py` reports it on a GPU. No torch at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import time


def pool_cases(dist: str, seed: int, pool: int) -> list[tuple[str, int]]:
    """The cases a distribution's timing set draws its value pool from: `pool` seeds from `seed` on."""
    return [(dist, int(seed) + k) for k in range(pool)]


def set_key(rotate: int, seed: int, pool: int) -> tuple:
    """What identifies a timing set: a child holding a set of this key makes none again."""
    return (rotate, int(seed), pool)


def entry_seed(noise_seed: int, entry: int) -> int:
    """The generator seed of one entry: a hash, so that no two (noise seed, entry) pairs share a stream."""
    d = hashlib.sha256(f"{int(noise_seed)}:{int(entry)}".encode()).digest()
    return int.from_bytes(d[:8], "little") >> 1


def draw_key(urandom) -> int:
    """A repetition's key, drawn from the OS (`urandom`: os.urandom, bound before any candidate loads)."""
    return int.from_bytes(urandom(8), "little") >> 1


def check_keys(keys, n: int) -> list[int]:
    """`keys` as a list of n distinct ints in [0, 2^63); ValueError otherwise."""
    if not isinstance(keys, (list, tuple)) or len(keys) != n:
        raise ValueError(f"keys must be a list of {n} ints, one per entry")
    out = []
    for k in keys:
        if type(k) is not int or not 0 <= k < 1 << 63:
            raise ValueError(f"keys must be ints in [0, 2^63), got {k!r}")
        out.append(k)
    if len(set(out)) != len(out):
        raise ValueError("keys must be distinct: a repetition's values are never met twice")
    return out


def check_entries(entries, avoid: range | None = None) -> list[int]:
    """`entries` as a list of distinct non-negative ints, none in `avoid`; ValueError otherwise."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError("entries must be a non-empty list of distinct non-negative ints")
    out = []
    for e in entries:
        if type(e) is not int or e < 0:
            raise ValueError(f"entries must be non-negative ints, got {e!r}")
        out.append(e)
    if len(set(out)) != len(out) or (avoid is not None and any(e in avoid for e in out)):
        raise ValueError("entries must be distinct, and distinct from the warm-up's: a repetition's values are "
                         "never met twice")
    return out


class FreshValues:
    """Derives entries' values on one device: `perturbed` and the generator class are taken before any
    candidate loads (the child's trusted references)."""

    def __init__(self, perturbed, distribution: str, device: str, generator_cls):
        self.perturbed, self.dist = perturbed, distribution
        self.gen = generator_cls(device=device)

    def __call__(self, pool: list, entry: int, key: int) -> dict:
        """Entry `entry`'s values: its pool set perturbed by draws seeded with `key`."""
        self.gen.manual_seed(int(key))
        return self.perturbed(pool[int(entry) % len(pool)], self.gen, self.dist)


# --- what a refill costs ---------------------------------------------------------------------------------

def _counting_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def nbytes(x) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, (list, tuple)):
            return sum(nbytes(y) for y in x)
        return 0

    class Count(TorchDispatchMode):
        """Device ops and the bytes their tensor arguments and results hold: what each op reads and writes
        (an op that reads a tensor twice, as x * x, counts it twice)."""

        def __init__(self):
            super().__init__()
            self.ops, self.bytes, self.names = 0, 0, {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket.__name__)
            if name not in ("detach", "alias", "view", "_to_copy_meta", "empty", "empty_like", "empty_strided"):
                self.ops += 1
                # an in-place op reads and writes its first argument; copy_ only writes it
                written = nbytes(args[0]) if name.endswith("_") and name != "copy_" else 0 if name == "copy_" \
                    else nbytes(out)
                self.bytes += nbytes(list(args) + list((kwargs or {}).values())) + written
                self.names[name] = self.names.get(name, 0) + 1
            return out

    return Count()


@contextlib.contextmanager
def _counting_passes(mode):
    """The one-pass kernels of baselines.perturb_kernels counted too (no torch op sees them): each reads its
    source where its law does and writes its destination once."""
    from baselines import perturb_kernels as pk

    saved = pk.elementwise, pk.rows

    def elementwise(src, dst, seed, law, a=0.0, b=0.0):
        read = src.element_size() if law in (pk.MIX, pk.RELATIVE) else 0
        mode.ops, mode.bytes = mode.ops + 1, mode.bytes + dst.numel() * (dst.element_size() + read)
        mode.names["perturb_elementwise"] = mode.names.get("perturb_elementwise", 0) + 1
        saved[0](src, dst, seed, law, a, b)

    def rows(src, dst, seed, noise):
        mode.ops, mode.bytes = mode.ops + 1, mode.bytes + dst.numel() * (dst.element_size() + src.element_size())
        mode.names["perturb_rows"] = mode.names.get("perturb_rows", 0) + 1
        saved[1](src, dst, seed, noise)

    pk.elementwise, pk.rows = elementwise, rows
    try:
        yield
    finally:
        pk.elementwise, pk.rows = saved


def refill_cost(problem, shape, distribution: str, device: str, cpu: bool, reps: int = 5) -> dict:
    """One repetition's refill (perturb a pool set, copy it into the static buffers): device ops, bytes read
    and written (counted per op), the bytes of the inputs, and milliseconds per repetition (CUDA events on a
    GPU, perf_counter on the CPU), the median of `reps`."""
    import torch

    pool = [problem.make_inputs(shape, distribution, s, device, cpu=cpu) for s in (1, 2)]
    static = {k: v.clone() for k, v in pool[0].items() if isinstance(v, torch.Tensor)}
    fresh = FreshValues(problem.perturbed, distribution, device, torch.Generator)

    def refill(e: int):
        vals = fresh(pool, e, entry_seed(12345, e))
        for k, v in static.items():
            v.copy_(vals[k])

    refill(0)  # first calls allocate
    mode = _counting_mode()
    with mode, _counting_passes(mode):
        refill(1)
    times = []
    for e in range(2, 2 + reps):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            refill(e)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            refill(e)
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    in_bytes = sum(v.numel() * v.element_size() for v in static.values())
    return {"ops": mode.ops, "bytes": mode.bytes, "input_bytes": in_bytes, "ms": times[len(times) // 2],
            "op_names": dict(sorted(mode.names.items()))}
