"""A sandbox child's inputs: each case's inputs read from the input bank or generated (and banked, by the
reference child), staged in host memory, uploaded, fingerprinted, and compared bitwise after a call."""

from __future__ import annotations

import os
import sys

from gpu_worker import protocol


class ChildInputs:
    """A child's inputs: bank, staging, upload, fingerprint, mutation check."""

    def _inputs(self, dist: str, seed: int) -> dict:
        """Fresh device buffers holding one case's inputs."""
        import torch

        # prefetched sets (already on the device, see cmd_prepare) stay until the verification ends: the
        # determinism rerun and the stale-output probe get fresh copies of them instead of new inputs
        # generated and uploaded while the worker holds the GPU
        pre = self._prefetched.get((dist, seed))
        if pre is None:
            return self._to_device(self._host_inputs(dist, seed))
        here = torch.device(self.device).type

        def fresh(v):
            if not isinstance(v, torch.Tensor):
                return v
            return self.T["clone"](v) if v.device.type == here else self.T["to"](v, self.device)

        return {k: fresh(v) for k, v in pre.items()}

    def _to_device(self, inp: dict) -> dict:
        import torch

        return {k: (self.T["to"](v, self.device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}

    def cmd_stage(self, cases: list):
        """Cases' inputs into host memory now, from the bank or generated (and banked, by the reference):
        host work, which the worker asks for outside any device turn; the upload that follows takes them."""
        t0 = self.T["perf"]()
        cases = self._stage_cached(cases)  # a reference reads its cached cases instead (child_reference)
        staged = {(d, s): self._host_inputs(d, s) for d, s in cases}  # (an earlier staging of a case is taken)
        self._staged = staged  # replaced, not added to: a staging no upload took is dropped here, not kept
        return protocol.Staged(seconds=round(self.T["perf"]() - t0, 4))

    def _host_inputs(self, dist: str, seed: int) -> dict:
        """One case's inputs in host memory. The reference child (trusted) generates them and leaves a
        read-only copy in the input bank; candidate children read that copy (memory-mapped, copy-on-write)
        instead of generating several hundred MB with the CPU each (KDA: ~1 s per case on one core, many children at
        once). The reference never reads the bank: its own fingerprint of each case is what the candidate's
        is checked against, so an altered bank file is a rejection, not a silent agreement."""
        import torch

        staged = self._staged.pop((dist, seed), None)
        if staged is not None:
            return staged
        path = self._bank_path(dist, seed)
        t0 = self.T["perf"]()
        if path and self.role == "candidate" and os.path.exists(path):
            try:
                inp = torch.load(path, mmap=True, weights_only=True)
                self._count("bank", t0)
                return inp
            except Exception as e:  # noqa: BLE001 - a bad bank file only costs the generation below
                print(f"input bank {path} unreadable ({type(e).__name__}: {e}); generating", flush=True)
        inp = self.make_inputs(self.shape, dist, seed, "cpu", cpu=self.cpu_mode)
        self._count("generate", t0)
        if path and self.role == "reference" and not os.path.exists(path):
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
        """Seconds and count per step of input preparation, returned by cmd_prepare (the phase log)."""
        self.prep_timing[what] = self.prep_timing.get(what, 0.0) + self.T["perf"]() - t0
        self.prep_timing[what + "-n"] = self.prep_timing.get(what + "-n", 0) + 1

    def _bank_path(self, dist: str, seed: int) -> str | None:
        from baselines.problem import RANDOM_SHAPE

        root = os.environ.get("MARATHON_INPUT_BANK")
        if not root or self.bank_tag is None or self.shape.name.startswith(RANDOM_SHAPE):
            return None  # a random shape's inputs come from secret seeds, each used once
        key = repr((self.problem.name, self.shape.name, dist, int(seed), self.cpu_mode, self.bank_tag))
        return os.path.join(root, f"{self.problem.name}-{self.T['sha'](key.encode()).hexdigest()[:24]}.pt")

    @staticmethod
    def _generator_tag(problem) -> str | None:
        """Names the input generator's version: its source files and torch's version (torch's RNG
        streams may change between versions), so that a bank file is never read by other code."""
        import hashlib

        import torch

        import baselines.perturb  # noqa: F401 - a file's parameters are drawn through it

        h = hashlib.sha256(torch.__version__.encode())
        try:
            for mod in (getattr(problem.make_inputs, "__module__", None), "baselines.problem", "baselines.perturb"):
                f = getattr(sys.modules.get(mod), "__file__", None)
                if not f:
                    return None
                with open(f, "rb") as fh:
                    h.update(fh.read())
        except OSError:
            return None
        return h.hexdigest()[:16]

    def _hash(self, inputs: dict) -> str:
        """Fingerprint of the inputs (shape, dtype, fp64 sum and sum of squares, a strided sample), computed
        on the device: it shows that the candidate and reference processes generated the same inputs.
        Mutation is checked exactly, against a pristine copy (see `_pristine` / `_mutated`)."""
        import torch

        h = self.T["sha"]()
        for k in sorted(inputs):
            v = inputs[k]
            h.update(k.encode())
            if isinstance(v, torch.Tensor):
                d = v.detach().reshape(-1)
                f = d.double()
                step = max(1, d.numel() // 4096)
                sample = self.T["to"](d[::step].double(), "cpu").numpy().tobytes()
                h.update(f"{v.dtype}{tuple(v.shape)}{float(f.sum())!r}{float((f * f).sum())!r}".encode())
                h.update(sample)
            else:
                h.update(repr(v).encode())
        return h.hexdigest()

    def _pristine(self, inputs: dict) -> dict:
        import torch

        return {k: self.T["clone"](v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}

    def _mutated(self, inputs: dict, pristine: dict) -> list[str]:
        """Names of inputs that differ bitwise from the copy taken before the call."""
        import torch

        bad = []
        for k, ref in pristine.items():
            v = inputs[k]
            if v.shape != ref.shape or v.dtype != ref.dtype:
                bad.append(k)
                continue
            a = self.T["view"](self.T["contiguous"](v).reshape(-1), torch.uint8)
            b = self.T["view"](ref.reshape(-1), torch.uint8)
            if not bool(torch.equal(a, b)):
                bad.append(k)
        return bad

    def cmd_prepare(self, cases: list | None = None, rotate: int | None = None, dist: str | None = None,
                    kernels: bool = True, seed: int = 1000, pool: int = 3):
        """Generate inputs ahead (on the CPU side, before the worker's timing block): the verification
        cases' inputs and/or the timing sets."""
        self.prep_timing = {}
        if cases:
            # uploaded now, before the timing block (the worker holds an untimed device job for this);
            # bounded so that many children at once stay within the device's memory
            host = {(d, s): self._host_inputs(d, s) for d, s in cases}
            nbytes = sum(v.numel() * v.element_size() for inp in host.values() for v in inp.values()
                         if hasattr(v, "element_size"))
            # only small sets wait on the device; larger ones are uploaded case by case during the run
            # (KDA's six cases are 1.9 GB, prefill's 6.8 GB: held per waiting child, they filled the device)
            limit = self.settings.prefetch_gb * (1 << 30)
            t0 = self.T["perf"]()
            self._prefetched = {k: (self._to_device(v) if nbytes <= limit else v) for k, v in host.items()}
            self._sync()
            self._count("upload", t0)
            if kernels and self.cuda and self.module is not None:
                t0 = self.T["perf"]()
                self._load_kernels(self._inputs(*cases[0]), self._outputs())
                self._count("kernels", t0)
        if rotate:
            t0 = self.T["perf"]()
            self._prepare_timing(rotate, dist or self.problem.distributions[0], seed, pool)
            self._count("timing-sets", t0)
            # a child that has run the candidate (verified or timed it) has its kernels loaded already;
            # the pre-load is for a fresh one (it holds an untimed device job's turn for seconds)
            if not cases and self.cuda and self.module is not None and not self.ran:
                t0 = self.T["perf"]()
                self._load_kernels(*self._timing_set(dist, "prepare").sets[0])
                self._count("kernels", t0)
        if rotate and self.cuda and self.flush is not None and self.flush_graph is None:
            # a flush that did not capture runs on the stream, which delays the timed graph behind it: named
            # in the phase log, since a child's own output goes nowhere
            self.prep_timing["flush-on-stream"] = 1
        return protocol.Prepared(timing={k: round(v, 4) for k, v in self.prep_timing.items()})
