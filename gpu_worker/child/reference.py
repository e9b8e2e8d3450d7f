"""The reference child's commands (trusted code only): setup, the oracle and the baseline's own error per
case, comparisons of candidates' output files with the oracle or the baseline, ceilings and receipts. The
cases' values and the ceilings are kept on disk across restarts (gpu_worker.caches), checked on every read."""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from gpu_worker import protocol

if TYPE_CHECKING:
    from gpu_worker.child.core import ChildCore
    from gpu_worker.child.inputs import ChildInputs
    from gpu_worker.child.timing import ChildTiming


class ChildReference:
    """The reference role's commands. Built with the child's core, its inputs and its timing (the timed
    calls' comparison runs the baseline on a timing set's values)."""

    PINNED = ("core", "inputs", "timing")  # by identity (ChildCore.pin_trusted)

    def __init__(self, core: ChildCore, inputs: ChildInputs, timing: ChildTiming):
        self.core, self.inputs, self.timing = core, inputs, timing
        self.oracles: OrderedDict = OrderedDict()  # (dist, seed) -> oracle outputs on the device, see _oracle
        self.case_cache = None  # the cases' cache on disk, from cmd_setup on (_case_cache)
        self._cached_cases: dict = {}  # (dist, seed) -> cached values read while staging, taken once
        self._baseline_ran = False  # see _baseline_warm

    def cmd_setup(self, problem: str, shape: str | None):
        assert self.core.role == "reference"
        p = self.core._setup_problem(problem, shape)
        bases = p.baselines()
        self.core.baseline_name, self.core.baseline = next(iter(bases.items()))
        self._cached_cases, self._baseline_ran = {}, False
        self.case_cache = self._case_cache()
        return protocol.SetUp(baseline=self.core.baseline_name, shape=self.core.shape.name, cuda=self.core.cuda)

    def _case_cache(self):
        """The cases' cache on disk (caches.ReferenceCaseCache), which a restarted worker's reference reads
        instead of generating inputs, computing oracles and running the baseline again."""
        import torch

        from gpu_worker.caches import ReferenceCaseCache, cache_root, reference_key

        core = self.core
        device = torch.cuda.get_device_name(0) if core.cuda else "cpu"
        base = reference_key(core.problem, core.shape, core.outputs, core.cpu_mode, core.bank_tag,
                             core.baseline_name, device)
        return ReferenceCaseCache(cache_root(core.settings), base, core.settings.oracle_disk_gb * (1 << 30))

    def _stage_cached(self, cases: list) -> list:
        """Of the cases a staging asks for, those still to generate: a reference case found in the cache
        is read into host memory here instead (host work, outside any device turn), unless the input bank
        lacks its inputs (then they are generated, and banked, for the candidates)."""
        if self.core.role != "reference" or self.case_cache is None or not self.case_cache.enabled:
            return cases
        rest = []
        self._cached_cases = {}  # replaced, as the staged inputs are: what no reference took is dropped
        for dist, seed in cases:
            bank = self.inputs._bank_path(dist, seed)
            if not self._baseline_warm() and not rest:  # the first case runs the baseline here (_cached_case)
                entry = None
            else:
                entry = None if bank and not os.path.exists(bank) else self.case_cache.get(dist, seed)
            if entry is None:
                rest.append((dist, seed))
            else:
                self._cached_cases[(dist, seed)] = entry
        return rest

    def _baseline_warm(self) -> bool:
        """Whether the baseline has run in this process: until it has, a case is computed in full, so that
        its first call (compiling, loading Triton's kernels and autotuning choices) happens where it did
        before the cache, in the warm-up, not in a benchmark's first timing block."""
        return self._baseline_ran

    def _cached_case(self, dist: str, seed: int, baseline: bool) -> dict | None:
        """A case's cached values (staged ahead, else read now), if they answer a request for them:
        with `baseline`, only an entry that holds the baseline's error."""
        if self.case_cache is None or (baseline and not self._baseline_warm()):
            return None
        entry = self._cached_cases.pop((dist, seed), None) or self.case_cache.get(dist, seed)
        if entry is None or (baseline and entry.get("baseline_err") is None):
            return None
        return entry

    def _oracle(self, dist: str, seed: int, inputs: dict | None = None) -> dict:
        """The oracle's outputs for one case, kept on this child's device (LRU within the settings'
        oracle_cache_gb) so that every later candidate is compared there, in fp64, without the oracle
        crossing a pipe. One that left the device is read back from the cases' cache, else computed."""
        key = (dist, seed)
        if key in self.oracles:
            self.oracles.move_to_end(key)
            return self.oracles[key]
        entry = self._cached_case(dist, seed, baseline=False) if inputs is None else None
        if entry is not None:
            return self._keep_oracle(dist, seed, self._uploaded(entry["oracle"]))
        if inputs is None:
            inputs = self.inputs._inputs(dist, seed)
        return self._keep_oracle(dist, seed, {k: v.detach() for k, v in self.core.problem.oracle(inputs).items()
                                              if k in self.core.outputs})

    def _uploaded(self, tensors: dict) -> dict:
        """A cached entry's tensors on this child's device."""
        return {k: self.core.staging.upload(v, self.core.device) for k, v in tensors.items()}

    def _keep_oracle(self, dist: str, seed: int, ref: dict) -> dict:
        cache = self.oracles
        cache[(dist, seed)] = ref
        limit = self.core.settings.oracle_cache_gb * (1 << 30)

        def nbytes():
            return sum(t.numel() * t.element_size() for r in cache.values() for t in r.values())

        while len(cache) > 1 and nbytes() > limit:
            cache.popitem(last=False)
        return ref

    def cmd_reference(self, cases: list, baseline: bool = True):
        """Per case: the inputs' fingerprint and the baseline's own error against the oracle (NaN without
        `baseline`: the baseline is not run); the oracle stays here, on the device, for `compare`."""
        from baselines.problem import rel_rms

        out = []
        for dist, seed in cases:
            t0 = time.perf_counter()
            entry = self._cached_case(dist, seed, baseline)
            if entry is not None:  # computed by an earlier reference child: only the upload of its oracle
                self._keep_oracle(dist, seed, self._uploaded(entry["oracle"]))
                self.core._sync()
                err = entry["baseline_err"] if baseline else math.nan
                out.append(protocol.ReferenceCase(dist=dist, seed=seed, hash=entry["hash"], baseline_err=err,
                                                  timing={"cached": time.perf_counter() - t0}))
                continue
            inputs = self.inputs._inputs(dist, seed)
            h = self.inputs._hash(inputs)
            self.core._sync()
            t1 = time.perf_counter()
            ref = self._oracle(dist, seed, inputs)
            self.core._sync()
            t2 = time.perf_counter()
            base = self.core.baseline(inputs) if baseline else None  # a first call compiles and autotunes
            if baseline:
                self._baseline_ran = True
            self.core._sync()
            t3 = time.perf_counter()
            errs = [rel_rms(ref[k], base[k]) for k in self.core.outputs] if baseline else [math.nan]
            if self.case_cache is not None:  # copied off the device now, written on its own thread
                self.case_cache.put(dist, seed, h, max(errs) if baseline else None,
                                    {k: self.core.staging.download(v) for k, v in ref.items()})
            out.append(protocol.ReferenceCase(dist=dist, seed=seed, hash=h, baseline_err=max(errs),
                                              timing={"inputs": t1 - t0, "oracle": t2 - t1, "baseline": t3 - t2}))
        return protocol.References(cases=out)

    def _import(self, handle: protocol.OutputHandle):
        """A tensor written by a candidate child's `_export`, on this child's device."""
        import torch

        dtype = getattr(torch, handle.dtype)
        nbytes = math.prod(handle.shape) * torch.empty((), dtype=dtype).element_size()
        if os.path.getsize(handle.path) != nbytes:
            raise ValueError(f"output file {handle.path} holds {os.path.getsize(handle.path)} bytes, "
                             f"expected {nbytes}")
        raw = torch.from_file(handle.path, shared=False, size=nbytes, dtype=torch.uint8)
        return self.core.staging.upload(raw, self.core.device).view(dtype).reshape(handle.shape)

    def cmd_compare_timed(self, jobs: list, noise_seed: int, dist: str | None = None):
        """Each job: a candidate's output from a timed call that ran on entry `set` of the timing set of
        `dist` (its values derived from `noise_seed`), compared with the baseline's output on the same
        values. Returns rel-RMS and non-finite count per job."""
        import torch

        from baselines.problem import rel_rms

        ts = self.timing._timing_set(dist, "compare_timed")
        res, last = [], [None, None]
        for job in jobs:
            o = self._import(job.out)  # one output on the device at a time
            if last[0] != job.entry:  # a call's outputs come together: the baseline runs once per entry
                last = [job.entry, self.timing._baseline_at(ts, job.entry, noise_seed)]
            ref = last[1][job.name]
            of = o.double()
            res.append(protocol.TimedComparison(rel_err=rel_rms(ref, of), nonfinite=int((~torch.isfinite(of)).sum())))
            o = of = None  # noqa: F841 - freed before the next output is read, and before the release below
        self.core._release()
        return protocol.TimedCompared(results=res)

    def cmd_compare(self, jobs: list):
        """Each job compares one output file (`out`) with the oracle of `case` ([dist, seed]) or with
        another output file (`other`, the determinism rerun). Returns per job: rel_err (rel-RMS in fp64,
        NaN if anything is non-finite), nonfinite (count in the output), constant (the output is constant
        where the reference is not)."""
        import torch

        from baselines.problem import rel_rms

        res = []
        t_import = t_math = 0.0
        perf = self.core.T["perf"]
        for job in jobs:
            t0 = perf()
            o = self._import(job.out)  # one output on the device at a time
            t_import += perf() - t0
            t0 = perf()
            if job.case is not None:
                t = self._oracle(*job.case)[job.name]
            else:
                t = self._import(job.other)
            of = o.double()
            nonfinite = int((~torch.isfinite(of)).sum())
            constant = bool(of.numel() > 1 and float(of.std()) == 0.0 and float(t.double().std()) > 0.0)
            res.append(protocol.Comparison(rel_err=rel_rms(t, of), nonfinite=nonfinite, numel=o.numel(),
                                           constant=constant))
            del o, of
            t_math += perf() - t0
        self.core._release()  # the imported outputs are gone: their blocks go back, the worker's budget sees it
        return protocol.Compared(results=res, timing={"import": round(t_import, 4), "oracle-and-math": round(t_math, 4)})

    def cmd_ceilings(self):
        """Measured ceilings for the physical floor: device-to-device copy bandwidth (read + write bytes)
        and bf16 matmul rate. CUDA only; read from the ceilings' cache where this GPU has been measured."""
        if not self.core.cuda:
            return protocol.Ceilings(bandwidth=None, flops=None)
        cache, key = self._ceilings_cache()
        found = cache.get_json(key)
        if isinstance(found, dict) and all(isinstance(found.get(k), float) for k in ("bandwidth", "flops")):
            return protocol.Ceilings(**found)
        ceil = self._measure_ceilings()
        cache.put_json(key, ceil.model_dump())
        return ceil

    def _ceilings_cache(self):
        """The ceilings' cache entry: per GPU model, host, torch and CUDA (a card's copy bandwidth and matmul
        rate do not change between a worker's starts; a new driver or torch measures again)."""
        import torch

        from gpu_worker.caches import DiskCache, cache_root, ceilings_key

        return DiskCache(cache_root(self.core.settings), "ceilings"), ceilings_key(torch.cuda.get_device_name(0))

    def _measure_ceilings(self):
        import torch

        n = 1 << 28  # 1 GiB of fp32
        a = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(10):
            s.record(); b.copy_(a); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        bw = 2 * 4 * n / (ts[0] / 1e3)
        del a, b
        m = 8192
        x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            x @ y
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            s.record(); x @ y; e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        fl = 2 * m ** 3 / (ts[0] / 1e3)
        return protocol.Ceilings(bandwidth=bw, flops=fl)

    def cmd_receipt(self):
        import subprocess

        import torch
        import triton

        d = {"torch": torch.__version__, "triton": triton.__version__, "device": "cpu (Triton interpreter)",
             "driver": "", "clocks": ""}
        if self.core.cuda:
            d["device"] = torch.cuda.get_device_name(0)
            try:
                q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw",
                                    "--format=csv,noheader", "-i", "0"], capture_output=True, text=True, timeout=10)
                f = [x.strip() for x in q.stdout.strip().split(",")]
                d["driver"] = f[0]
                d["clocks"] = f"sm {f[1]} (max {f[3]}), mem {f[2]}, {f[4]} C, {f[5]}"
            except Exception as e:  # noqa: BLE001
                d["clocks"] = f"nvidia-smi unavailable: {e}"
        return protocol.ReceiptFacts(**d, baseline_env=self.core.problem.baseline_env())
