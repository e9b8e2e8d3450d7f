"""What a case's host pages cost the copies that read and write them, on the host alone (no GPU needed):
`python scripts/host_pages.py [PROBLEM ...] [--reps N]`. Per problem (its primary shape, first distribution),
its inputs saved in /dev/shm as the input bank holds them, then read whole by one thread into a 16 MiB buffer
(the host side of an upload) three ways: from a fresh mapping, as a child that maps a bank file afresh reads
it (its page faults inside the copy); from a fresh mapping populated first (gpu_worker.child.transfers.populate,
a stage's host work, timed apart); and from the same mapping again. Then its outputs' bytes (as the problem
specifies them) written into a new host tensor (torch's allocator: no huge pages asked for), as a download
does, and into the same memory again. Milliseconds, the median of the repetitions, with the page faults of one of them."""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHUNK = 16 << 20


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(fn) -> tuple[float, int]:
    f, t = _faults(), time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3, _faults() - f


def _read(values, buf) -> None:
    import numpy
    import torch

    for v in values:
        flat = v.reshape(-1).view(torch.uint8).numpy()
        for off in range(0, flat.size, CHUNK):
            w = min(CHUNK, flat.size - off)
            numpy.copyto(buf[:w], flat[off:off + w])


def _write(dst, src) -> None:
    import numpy

    for off in range(0, dst.size, CHUNK):
        w = min(CHUNK, dst.size - off)
        numpy.copyto(dst[off:off + w], src[:w])


def measure(problem_name: str, reps: int) -> list[str]:
    import numpy
    import torch

    from baselines.registry import get_problem
    from gpu_worker.child.transfers import madvise_ref, populate, staging_refs

    torch.set_num_threads(1)
    p = get_problem(problem_name)
    shape = p.shapes[0]
    inputs = {k: v for k, v in p.make_inputs(shape, p.distributions[0], 1, "cpu").items() if torch.is_tensor(v)}
    in_bytes = sum(v.numel() * v.element_size() for v in inputs.values())
    outs = p.output_specs(shape)
    out_bytes = sum(math.prod(s.shape) * getattr(torch, s.dtype).itemsize for s in outs.values())
    path = f"/dev/shm/host-pages-{os.getpid()}.pt"
    torch.save(inputs, path)
    del inputs
    refs = dict(staging_refs(), sum=torch.sum, madvise=madvise_ref())
    buf = numpy.empty(CHUNK, dtype=numpy.uint8)
    buf.fill(0)
    rows: dict[str, list[tuple[float, int]]] = {k: [] for k in
                                                 ("fresh", "populate", "populated", "again", "new", "reused")}
    try:
        for _ in range(reps):
            mapped = torch.load(path, mmap=True, weights_only=True)
            rows["fresh"].append(_timed(lambda: _read(mapped.values(), buf)))
            rows["again"].append(_timed(lambda: _read(mapped.values(), buf)))
            mapped = torch.load(path, mmap=True, weights_only=True)
            rows["populate"].append(_timed(lambda: populate(mapped.values(), refs)))
            rows["populated"].append(_timed(lambda: _read(mapped.values(), buf)))
            del mapped
            src = numpy.ones(min(out_bytes, CHUNK), dtype=numpy.uint8)
            dst = torch.empty(out_bytes, dtype=torch.uint8).numpy()  # a download's new tensor, untouched
            rows["new"].append(_timed(lambda: _write(dst, src)))
            rows["reused"].append(_timed(lambda: _write(dst, src)))
            del dst
    finally:
        os.unlink(path)

    def cell(k: str) -> str:
        ms = statistics.median(t for t, _ in rows[k])
        return f"{ms:7.1f} ms ({rows[k][-1][1]} faults)"

    return [f"{problem_name} {shape.name}: inputs {in_bytes / 2**20:.0f} MiB, outputs {out_bytes / 2**20:.0f} MiB, "
            f"{reps} repetitions, madvise populate {'yes' if refs['madvise'] else 'no'}",
            f"  inputs read from a fresh mapping     {cell('fresh')}",
            f"  populate a fresh mapping (host work) {cell('populate')}",
            f"  inputs read once populated           {cell('populated')}",
            f"  inputs read again, same mapping      {cell('again')}",
            f"  outputs written into new memory      {cell('new')}",
            f"  outputs written into written memory  {cell('reused')}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="*", default=["kda"])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    if not os.path.isdir("/dev/shm"):
        print("host_pages: no /dev/shm (where the input bank lives)", file=sys.stderr)
        return 2
    for name in a.problems:
        print("\n".join(measure(name, a.reps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
