"""Copies between host memory and the device through two pinned staging buffers, chunk by chunk, where
MARATHON_PINNED_STAGING asks (off by default).

A copy from or into pageable memory goes through the driver's own staging at a fraction of the link's speed
(on an idle H100: 6.5 GB/s up, 1.4 GB/s down, against about 50 GB/s from or into pinned memory; the copies
scripts/copy_speed.py makes). Here the copy engine moves one chunk into (or out of) one pinned buffer while
the CPU copies the other. In a worker with a dozen children at once the staged copies were no faster than
the plain ones (docs/results.md), hence the default. Pinning a whole case instead costs as much host time as
it saves, and keeps hundreds of MB per child out of the OS's reach."""

from __future__ import annotations

#: bytes per staging buffer (two per child): large enough that a chunk's fixed costs vanish, small enough
#: that every child can keep its pair
CHUNK = 16 << 20
#: below this many bytes a plain copy is as fast (and needs no buffers)
SMALL = 1 << 20


def staging_refs() -> dict:
    """The references PinnedStaging calls, for one used outside a child (a script, a test); a child's staging
    takes them from ChildCore.T, captured before any candidate code."""
    import numpy
    import torch

    return {"to": torch.Tensor.to, "copy_": torch.Tensor.copy_, "contiguous": torch.Tensor.contiguous,
            "view": torch.Tensor.view, "empty": torch.empty, "numpy": torch.Tensor.numpy, "copyto": numpy.copyto}


class PinnedStaging:
    """Uploads and downloads of contiguous tensors through two pinned buffers of `chunk` bytes, made on the
    first large copy. `T`: the child's trusted references (ChildCore.T). `cuda` false (the interpreter, or
    MARATHON_PINNED_STAGING off): every copy is a plain one."""

    def __init__(self, T: dict, cuda: bool, pins=None, chunk: int = CHUNK):
        """`pins`: a candidate child's (gpu_worker.pins.Pins): the buffers and events, once made, are pinned
        by identity, as this object's other attributes are by its owner."""
        self.T, self.cuda, self.pins, self.chunk = T, cuda, pins, chunk
        self.buffers: tuple | None = None
        self.events: tuple | None = None

    def ready(self) -> None:
        """The buffers and their events, made once (with the CUDA context, outside any device turn)."""
        if self.buffers is None and self.cuda:
            import torch

            self.buffers = tuple(torch.empty(self.chunk, dtype=torch.uint8, pin_memory=True) for _ in range(2))
            self.events = (torch.cuda.Event(), torch.cuda.Event())
            if self.pins is not None:
                self.pins.forget(vars(self), ["buffers", "events"])
                self.pins.add("staging", vars(self), ["buffers", "events"])

    def _staged(self, v) -> bool:
        import torch

        # a strided tensor keeps its layout through a plain copy (what a problem's inputs may rely on)
        return self.cuda and type(v) is torch.Tensor and v.is_contiguous() and v.numel() * v.element_size() >= SMALL

    def _bytes(self, v):
        import torch

        return self.T["view"](v.reshape(-1), torch.uint8)

    def _host_copy(self, dst, src) -> None:
        # on one thread: torch's CPU copy fans out over an OpenMP thread per core in every child, which a
        # worker with a dozen children at once oversubscribes
        self.T["copyto"](self.T["numpy"](dst), self.T["numpy"](src))

    def upload(self, v, device: str):
        """`v` (host memory) as a new tensor on `device`. The copy is queued: the device's stream orders
        every later use of it, and the host may reuse nothing of `v`'s until the stream is synchronised."""
        if not self._staged(v) or v.device.type != "cpu":
            return self.T["to"](v, device)
        self.ready()
        src = self._bytes(v)
        out = self.T["empty"](tuple(v.shape), dtype=v.dtype, device=device)
        dst = self._bytes(out)
        for i, off in enumerate(range(0, src.numel(), self.chunk)):
            b, w = i % 2, min(self.chunk, src.numel() - off)
            self.events[b].synchronize()  # the buffer's last chunk has left it
            self._host_copy(self.buffers[b][:w], src[off:off + w])
            self.T["copy_"](dst[off:off + w], self.buffers[b][:w], non_blocking=True)
            self.events[b].record()  # on the current stream, as the copies
        return out

    def download(self, v):
        """A host copy of `v` (a device tensor), contiguous, once every queued work writing it has run."""
        if v.device.type == "cpu":
            return self.T["contiguous"](self.T["to"](v, "cpu", copy=True))
        v = self.T["contiguous"](v)
        if not self._staged(v):
            return self.T["to"](v, "cpu", copy=True)
        self.ready()
        src = self._bytes(v)
        out = self.T["empty"](tuple(v.shape), dtype=v.dtype, device="cpu")
        dst = self._bytes(out)
        offsets = list(range(0, src.numel(), self.chunk))

        def queue(i: int) -> None:
            b, off = i % 2, offsets[i]
            w = min(self.chunk, src.numel() - off)
            self.T["copy_"](self.buffers[b][:w], src[off:off + w], non_blocking=True)
            self.events[b].record()

        queue(0)
        for i, off in enumerate(offsets):
            if i + 1 < len(offsets):
                queue(i + 1)  # into the other buffer, whose chunk was copied out in the last step
            b, w = i % 2, min(self.chunk, src.numel() - off)
            self.events[b].synchronize()
            self._host_copy(dst[off:off + w], self.buffers[b][:w])
        return out
