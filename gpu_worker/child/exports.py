"""What leaves a child besides its replies: outputs copied after a call and written to files for the
reference child (the downloads of `verify` and `host_latency`, `write_exports`, with the late-write check), and the
fingerprints of timed calls (projections onto random vectors)."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from gpu_worker import protocol
from gpu_worker.child.core import compared_outputs

if TYPE_CHECKING:
    from gpu_worker.child.core import ChildCore
    from gpu_worker.child.inputs import ChildInputs

FINGERPRINT_CHUNK = 1 << 24  # elements per step of a fingerprint: its temporaries stay at 64 MB in fp32


class ChildExports:
    """A child's output files and fingerprints. Built with the child's core and its inputs (the late-write
    check compares as the mutation check does)."""

    PINNED = ("core", "inputs")  # by identity (ChildCore.pin_trusted)

    def __init__(self, core: ChildCore, inputs: ChildInputs):
        self.core, self.inputs = core, inputs
        self._pending: list = []  # (tag, outputs, device copies, handles) of verify calls: _download_verified
        self._to_write: list = []  # (host bytes, path) downloaded, not yet written: see cmd_write_exports
        self._to_check: list = []  # (tag, outputs as downloaded, copies taken after the call): cmd_write_exports
        self.timed_outputs: list = []  # (pool index, outputs) of timed calls picked at random (ChildTiming.cmd_time)

    def _export(self, outs: dict, tag: str) -> dict:
        """A device copy of each output, taken now and kept for `_download_verified`, and the handles
        ({path, dtype, shape}) of the files it becomes, for the reference child, which compares them with
        the oracle on its device. Only a path crosses the pipes: pickling a 67 MB output through the worker
        twice per case cost more CPU than the whole verification's GPU time (KDA at T = 8192)."""
        # the copy goes to host memory at once (a device copy per output per case held a prefill
        # verification at ~17 GB and made the device memory the pipeline's bottleneck)
        snap = {k: self.core.staging.download(v.detach()) for k, v in outs.items()
                if type(v) is __import__("torch").Tensor}
        handles = self._handles(snap, tag)  # an output that is no plain Tensor is reported by out_type_ok
        self._pending.append((tag, outs, snap, handles))
        return handles

    def reserve(self, cases: int) -> None:
        """Host memory for a verification's downloads of `cases` cases, written now (host work, before its
        device job: PinnedStaging.reserve): every output of each case, of the determinism rerun and of the
        stale-output probe, downloaded twice (the copy after the call, the buffer for the late-write check)."""
        import torch

        specs = self.core.output_specs(self.core.shape, cpu=self.core.cpu_mode).values()
        calls = cases + 1 + (cases > 1)
        self.core.staging.reserve([(s.shape, getattr(torch, s.dtype)) for s in specs for _ in range(2 * calls)])

    def clear_pending(self) -> None:
        """Drop what an earlier verification kept and never downloaded: a new one starts."""
        self._pending = []

    def _handles(self, outs: dict, tag: str) -> dict[str, protocol.OutputHandle]:
        return {name: protocol.OutputHandle(path=os.path.join(self.core.tmp, f"out-{tag}-{name}.bin"),
                                            dtype=str(v.dtype).replace("torch.", ""), shape=tuple(v.shape))
                for name, v in outs.items()}

    def _download(self, snap: dict, handles: dict) -> None:
        """Device copies to host memory, queued for `cmd_write_exports` (the worker holds an untimed
        device job's turn for the download only, not for the file writes)."""
        import torch

        for name, v in snap.items():
            host = self.core.T["contiguous"](v) if v.device.type == "cpu" else self.core.staging.download(v)
            flat = host.reshape(-1)
            self._to_write.append((self.core.T["view"](flat, torch.uint8), handles[name].path))

    def cmd_write_exports(self):
        """Host work, outside any device turn: the late-write check of the outputs `verify` downloaded, then
        the downloads' files. Returns the outputs that changed after their call returned."""
        t0 = self.core.T["perf"]()
        changed = []
        for tag, now, snap in self._to_check:  # bitwise, NaN-safe: the buffers as downloaded vs the copies
            changed += [f"{tag}/{name}" for name in self.inputs._mutated(now, snap)]
        self._to_check = []
        t1 = self.core.T["perf"]()
        for raw, path in self._to_write:
            raw.numpy().tofile(path)
        self._to_write = []
        return protocol.Exported(changed=changed,
                                 timing={"check": round(t1 - t0, 4), "write": round(self.core.T["perf"]() - t1, 4)})

    def _download_verified(self):
        """Download the outputs `verify` kept, for `write_exports`, as `verify`'s last step. They are the
        copies taken right after each call, and the candidate's own buffers must still equal them: an output
        that changed after the call returned means work outside the call (a late write), which is reported.
        The buffers are downloaded here, in the verification's device job; `write_exports` compares them,
        on the host, outside any turn. An output no longer a plain tensor is reported at once."""
        import torch

        t0 = self.core.T["perf"]()
        changed = []
        for tag, outs, snap, handles in self._pending:
            if any(type(outs.get(name)) is not torch.Tensor for name in snap):
                changed += [f"{tag}/{name}" for name in snap if type(outs.get(name)) is not torch.Tensor]
            else:  # the buffers as they are now, for write_exports' comparison with the copies
                self._to_check.append((tag, {name: self.core.staging.download(outs[name].detach())
                                             for name in snap}, snap))
            self._download(snap, handles)
        self._pending = []
        self.core.staging.release()
        self.core._sync()
        self.core._release()
        return protocol.Exported(changed=changed, timing={"download": round(self.core.T["perf"]() - t0, 4)})

    def _download_timed(self) -> list:
        """Download the timed calls' kept outputs (see cmd_time) for `write_exports`; returns the jobs
        whose files that writes (each names the pool entry its call ran on)."""
        jobs = []
        for n, (idx, kept) in enumerate(self.timed_outputs):  # already copies (cmd_time's keep)
            handles = self._handles(kept, f"timed{n}")
            self._download(kept, handles)
            jobs += [protocol.TimedJob(entry=idx, name=name, out=h) for name, h in handles.items()]
        self.timed_outputs = []
        self.core._release()
        return jobs

    def _projections(self, seed: int) -> dict:
        """Per compared floating-point output (as the problem specifies it, not as any tensor says), a
        vector of standard normal values drawn from `seed`, the same in every process for the same seed,
        device and size: the projection of an output onto it is that output's fingerprint (see
        `cmd_time`'s `check_seed`)."""
        import torch

        core, T = self.core, self.core.T
        specs = core.problem.output_specs(core.shape, cpu=core.cpu_mode)
        g = T["Generator"](device=core.device)
        g.manual_seed(int(seed))
        out = {}
        for n in compared_outputs(core.problem, core.shape, core.cpu_mode):
            if not getattr(torch, specs[n].dtype).is_floating_point:
                continue
            size = math.prod(specs[n].shape)
            v = T["empty"](size, dtype=T["bfloat16"], device=core.device)  # half an fp32 vector's memory
            for c in range(0, size, FINGERPRINT_CHUNK):  # drawn chunk by chunk: no fp32 copy of the whole
                w = min(FINGERPRINT_CHUNK, size - c)
                T["copy_"](T["narrow"](v, 0, c, w), T["randn"](w, generator=g, device=core.device, dtype=T["float32"]))
            out[n] = v
        return out

    def _fingerprint(self, outs: dict, proj: dict, squares: bool = False) -> list:
        """Each compared output projected onto its random vector, in fp32 chunks (device scalars; no
        synchronisation); with `squares`, [projection, sum of squares] per output, from the same chunks
        (the norm is the bound's scale). An output whose size is not its spec's fails here."""
        T, f32 = self.core.T, self.core.T["float32"]
        res = []
        for n, v in proj.items():
            flat = T["view"](T["contiguous"](outs[n]), -1)
            if flat.numel() != v.numel():
                raise ValueError(f"output {n!r} holds {flat.numel()} elements, its spec {v.numel()}")
            acc = sq = None
            for c in range(0, v.numel(), FINGERPRINT_CHUNK):
                w = min(FINGERPRINT_CHUNK, v.numel() - c)
                part = T["to"](T["narrow"](flat, 0, c, w), f32)
                d = T["dot"](part, T["to"](T["narrow"](v, 0, c, w), f32))
                acc = d if acc is None else T["add"](acc, d)
                if squares:
                    e = T["dot"](part, part)
                    sq = e if sq is None else T["add"](sq, e)
            res.append([acc, sq] if squares else acc)
        return res

    @staticmethod
    def _checks(timed: list, fps: list, proj: dict | None, squares: bool) -> list:
        """[entry, [fingerprint per compared output]] per timed repetition, with [its norm per compared
        output] in the reference role (whose fingerprints carry their sums of squares); empty without a seed."""
        if proj is None:
            return []
        out = []
        for (_, j), f in zip(timed, fps):
            if squares:
                out.append([j, [float(p) for p, _ in f], [math.sqrt(float(q)) for _, q in f]])
            else:
                out.append([j, [float(x) for x in f]])
        return out
