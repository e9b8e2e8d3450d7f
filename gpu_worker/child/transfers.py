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
#: madvise(2)'s MADV_POPULATE_READ (Linux 5.14): a range's pages mapped in for reading now
POPULATE_READ = 22
PAGE = 4096


def staging_refs() -> dict:
    """The references PinnedStaging calls, for one used outside a child (a script, a test); a child's staging
    takes them from ChildCore.T, captured before any candidate code."""
    import numpy
    import torch

    return {"to": torch.Tensor.to, "copy_": torch.Tensor.copy_, "contiguous": torch.Tensor.contiguous,
            "zero_": torch.Tensor.zero_, "view": torch.Tensor.view, "empty": torch.empty, "numpy": torch.Tensor.numpy,
            "copyto": numpy.copyto}


def madvise_ref():
    """libc's madvise, for `populate` (None where it cannot be had): a child captures it with its other trusted
    references, before any candidate code."""
    import ctypes

    try:
        f = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return f


def populate(values, T: dict) -> int:
    """The host pages behind the tensors among `values` (a case memory-mapped from the input bank) mapped
    into this process now, as host work: the upload that reads them later, inside a device turn, then takes
    no page fault. A child maps each bank file afresh, and a fresh mapping's first read of a 320 MiB case
    cost about twice a mapped one's on a CPU (scripts/host_pages.py). One madvise per tensor; where the
    kernel has no MADV_POPULATE_READ, a read of one byte per page. Returns the bytes populated."""
    import torch

    done = 0
    for v in values:
        if type(v) is not torch.Tensor or v.device.type != "cpu" or not v.is_contiguous() or not v.numel():
            continue
        nbytes = v.numel() * v.element_size()
        start = v.data_ptr() // PAGE * PAGE
        madvise = T.get("madvise")
        if madvise is None or madvise(start, v.data_ptr() + nbytes - start, POPULATE_READ) != 0:
            T["sum"](T["view"](v.reshape(-1), torch.uint8)[::PAGE], dtype=torch.int64)
        done += nbytes
    return done


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
        self.reserved: dict[tuple, list] = {}  # (shape, dtype) -> host tensors written ahead (`reserve`)
        self._ours: set[int] = set()  # ids of those tensors: a download lands only in memory made here

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

    def reserve(self, specs: list) -> int:
        """Host memory for the downloads to come, one tensor per (shape, dtype) in `specs`, allocated and
        written now, in host work: a download into fresh memory takes a page fault (and the kernel's zeroing)
        per 4 KiB page inside its device turn, about five times the copy itself on a CPU
        (scripts/host_pages.py). Replaces what an earlier reservation left. Returns the bytes reserved."""
        self.reserved, self._ours, done = {}, set(), 0
        for shape, dtype in specs:
            t = self.T["empty"](tuple(shape), dtype=dtype, device="cpu")
            self.T["zero_"](t)
            self.reserved.setdefault((tuple(shape), dtype), []).append(t)
            self._ours.add(id(t))
            done += t.numel() * t.element_size()
        return done

    def release(self) -> None:
        """What the last reservation left unused, given back."""
        self.reserved, self._ours = {}, set()

    def _host(self, v):
        """A host tensor to download `v` into: a reserved one of its shape and dtype, else a new one."""
        free = self.reserved.get((tuple(v.shape), v.dtype))
        while free:
            t = free.pop()
            if id(t) in self._ours and t.is_contiguous() and t.device.type == "cpu":
                self._ours.discard(id(t))
                return t
        return self.T["empty"](tuple(v.shape), dtype=v.dtype, device="cpu")

    def download(self, v):
        """A host copy of `v` (a device tensor), contiguous, once every queued work writing it has run; into
        reserved memory where `reserve` left some of its shape and dtype."""
        v = self.T["contiguous"](v)
        if not self._staged(v) or v.device.type == "cpu":
            out = self._host(v)
            self.T["copy_"](out, v)
            return out
        self.ready()
        src = self._bytes(v)
        out = self._host(v)
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
