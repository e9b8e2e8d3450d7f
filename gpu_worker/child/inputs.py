"""A sandbox child's inputs: each case's inputs read from the input bank or generated (and banked, by the
reference child), staged in host memory, uploaded, fingerprinted, and compared bitwise after a call."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from gpu_worker import protocol
from gpu_worker.child.transfers import populate

if TYPE_CHECKING:
    from gpu_worker.child.core import ChildCore


#: threads that draw a reference child's cases at once: half the host's cores (compiles and other children
#: use the rest)
GENERATION_THREADS = max(1, (os.cpu_count() or 2) // 2)


class ChildInputs:
    """A child's inputs: bank, staging, upload, fingerprint, mutation check. Built with the child's core."""

    PINNED = ("core",)  # what the trusted code reaches through this part, pinned by identity (ChildCore.pin_trusted)

    def __init__(self, core: ChildCore):
        self.core = core
        self.prefetched: dict = {}  # (dist, seed) -> a case's inputs uploaded ahead (ChildTiming.cmd_prepare)
        self._staged: dict = {}  # (dist, seed) -> host inputs read or generated ahead (cmd_stage), taken once
        # likewise a timing set's pool (cmd_stage_pool): a staging of cases does not drop it
        self.pool_staged: dict = {}
        self.prep_timing: dict = {}  # seconds and counts per step of input preparation (_count)
        self._counting = threading.Lock()  # cases drawn on threads count their steps

    def _inputs(self, dist: str, seed: int) -> dict:
        """Fresh device buffers holding one case's inputs."""
        import torch

        # prefetched sets (already on the device, see cmd_prepare) stay until the verification ends: the
        # determinism rerun and the stale-output probe get fresh copies of them instead of new inputs
        # generated and uploaded while the worker holds the GPU
        pre = self.prefetched.get((dist, seed))
        if pre is None:
            return self._to_device(self._host_inputs(dist, seed))
        here = torch.device(self.core.device).type

        def fresh(v):
            if not isinstance(v, torch.Tensor):
                return v
            return self.core.T["clone"](v) if v.device.type == here else self.core.staging.upload(v, self.core.device)

        return {k: fresh(v) for k, v in pre.items()}

    def _to_device(self, inp: dict) -> dict:
        import torch

        up, device = self.core.staging.upload, self.core.device
        return {k: (up(v, device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}

    def cmd_stage(self, cases: list, uncached=None):
        """Cases' inputs into host memory now, from the bank or generated (and banked, by the reference):
        host work, which the worker asks for outside any device turn; the upload that follows takes them.
        `uncached(cases)`: those of the cases still to read or generate (the reference role reads its
        cached cases instead: ChildReference._stage_cached)."""
        t0 = self.core.T["perf"]()
        cases = uncached(cases) if uncached is not None else cases
        # replaced, not added to: a staging no upload took is dropped here (one of its cases asked again is taken)
        self._staged = self._populated(self.host_inputs(cases))
        return protocol.Staged(seconds=round(self.core.T["perf"]() - t0, 4))

    def cmd_stage_pool(self, cases: list, banked_only: bool = False):
        """A timing set's pool cases into host memory now (host work, before the job that makes the set: the
        reference child draws them, several at once, about a second a KDA case on a core), kept apart from
        `cmd_stage`'s, which does not drop them; replaced by the next pool's. `banked_only`: those the input
        bank holds, the rest left to the set's job."""
        t0 = self.core.T["perf"]()
        cases = [c for c in cases if c not in self.prefetched]
        if banked_only:
            cases = [c for c in cases if (path := self._bank_path(*c)) and os.path.exists(path)]
        self.pool_staged = self._populated(self.host_inputs(cases))
        return protocol.Staged(seconds=round(self.core.T["perf"]() - t0, 4))

    def _populated(self, staged: dict) -> dict:
        """`staged`, a bank case's pages mapped in now (transfers.populate), not by the upload in its turn."""
        t0 = self.core.T["perf"]()
        for inp in staged.values():
            populate(inp.values(), self.core.T)
        self._count("populate", t0)
        return staged

    def stage_more(self, cases: list) -> None:
        """Those of `cases` not uploaded ahead drawn at once (`host_inputs`) and staged beside what is staged
        already, for `_inputs` to take: a timing set's pool."""
        self._staged.update(self.host_inputs([c for c in cases if c not in self.prefetched]))

    def host_inputs(self, cases: list) -> dict:
        """(dist, seed) -> that case's inputs in host memory (`_host_inputs`). The reference child, which
        generates them, draws several cases at once on threads of its own where the problem draws each case
        from a generator of its own (Problem.own_generators: the values are those of a draw alone): the
        first verification and the first timing sets of an empty host wait for it, about a second a KDA
        case on one core. A candidate's child reads the bank, and runs no thread of the harness's beside
        its candidate."""
        cases = list(dict.fromkeys((d, int(s)) for d, s in cases))
        own = getattr(self.core.problem, "own_generators", False)  # else they would interleave their draws
        threads = min(len(cases), GENERATION_THREADS) if self.core.role == "reference" and own else 1
        if threads <= 1:
            return {c: self._host_inputs(*c) for c in cases}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads, thread_name_prefix="inputs") as ex:
            return dict(zip(cases, ex.map(lambda c: self._host_inputs(*c), cases)))

    def _host_inputs(self, dist: str, seed: int) -> dict:
        """One case's inputs in host memory. The reference child (trusted) generates them and leaves a
        read-only copy in the input bank; candidate children read that copy (memory-mapped, copy-on-write)
        instead of generating several hundred MB with the CPU each (KDA: ~1 s per case on one core, many children at
        once). The reference never reads the bank: its own fingerprint of each case is what the candidate's
        is checked against, so an altered bank file is a rejection, not a silent agreement."""
        import torch

        staged = self._staged.pop((dist, seed), None)
        if staged is None:
            staged = self.pool_staged.pop((dist, seed), None)
        if staged is not None:
            return staged
        path = self._bank_path(dist, seed)
        t0 = self.core.T["perf"]()
        if path and self.core.role == "candidate" and os.path.exists(path):
            try:
                inp = torch.load(path, mmap=True, weights_only=True)
                self._count("bank", t0)
                return inp
            except Exception as e:  # noqa: BLE001 - a bad bank file only costs the generation below
                print(f"input bank {path} unreadable ({type(e).__name__}: {e}); generating", flush=True)
        inp = self.core.make_inputs(self.core.shape, dist, seed, "cpu", cpu=self.core.cpu_mode)
        self._count("generate", t0)
        if path and self.core.role == "reference" and not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            try:
                torch.save(inp, tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, path)  # atomic: a reader sees the whole file or none
            except OSError as e:  # a full /dev/shm: candidates generate their own, as before
                print(f"input bank write failed ({e})", flush=True)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        return inp

    def _count(self, what: str, t0: float) -> None:
        """Seconds and count per step of input preparation, returned by ChildTiming.cmd_prepare (the phase log);
        steps on threads at once (`host_inputs`) add their seconds each."""
        dt = self.core.T["perf"]() - t0
        with self._counting:
            self.prep_timing[what] = self.prep_timing.get(what, 0.0) + dt
            self.prep_timing[what + "-n"] = self.prep_timing.get(what + "-n", 0) + 1

    def _bank_path(self, dist: str, seed: int) -> str | None:
        from baselines.problem import RANDOM_SHAPE

        core = self.core
        root = os.environ.get("MARATHON_INPUT_BANK")
        if not root or core.bank_tag is None or core.shape.name.startswith(RANDOM_SHAPE):
            return None  # a random shape's inputs come from secret seeds, each used once
        key = repr((core.problem.name, core.shape.name, dist, int(seed), core.cpu_mode, core.bank_tag))
        return os.path.join(root, f"{core.problem.name}-{core.T['sha'](key.encode()).hexdigest()[:24]}.pt")

    def _hash(self, inputs: dict) -> str:
        """Fingerprint of the inputs (shape, dtype, fp64 sum and sum of squares, a strided sample), computed
        on the device: it shows that the candidate and reference processes generated the same inputs.
        Mutation is checked exactly, against a pristine copy (see `_pristine` / `_mutated`)."""
        import torch

        h = self.core.T["sha"]()
        for k in sorted(inputs):
            v = inputs[k]
            h.update(k.encode())
            if isinstance(v, torch.Tensor):
                d = v.detach().reshape(-1)
                f = d.double()
                step = max(1, d.numel() // 4096)
                sample = self.core.T["to"](d[::step].double(), "cpu").numpy().tobytes()
                h.update(f"{v.dtype}{tuple(v.shape)}{float(f.sum())!r}{float((f * f).sum())!r}".encode())
                h.update(sample)
            else:
                h.update(repr(v).encode())
        return h.hexdigest()

    def _pristine(self, inputs: dict) -> dict:
        import torch

        return {k: self.core.T["clone"](v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}

    def _mutated(self, inputs: dict, pristine: dict) -> list[str]:
        """Names of inputs that differ bitwise from the copy taken before the call."""
        import torch

        bad = []
        for k, ref in pristine.items():
            v = inputs[k]
            if v.shape != ref.shape or v.dtype != ref.dtype:
                bad.append(k)
                continue
            a = self.core.T["view"](self.core.T["contiguous"](v).reshape(-1), torch.uint8)
            b = self.core.T["view"](ref.reshape(-1), torch.uint8)
            if not bool(torch.equal(a, b)):
                bad.append(k)
        return bad
