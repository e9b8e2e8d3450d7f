"""How fast one case's inputs reach the device and its outputs come back, on a GPU: `python scripts/copy_speed.py
[PROBLEM ...] [--reps N]`. Per problem (its primary shape, first distribution), the inputs memory-mapped from a
file in /dev/shm as the input bank holds them, copied up and the same bytes copied down, three ways: plain
copies (pageable host memory, what a `.to()` does), through a child's pinned staging
(gpu_worker.child.transfers.PinnedStaging), and from and into pinned buffers holding the whole case (the
link's speed: what neither of the others can beat). Seconds and GB/s, the median of the repetitions;
every copy is checked bitwise against the plain one. Beside them, what the two ways the staging avoids cost
on the host: allocating pinned buffers for a whole case, and pinning the mapped case in place
(`cudaHostRegister`), with the resident memory that adds to the process."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(problem_name: str, reps: int) -> list[str]:
    import torch

    from baselines.registry import get_problem
    from gpu_worker.child.transfers import PinnedStaging, staging_refs

    p = get_problem(problem_name)
    shape = p.shapes[0]
    inputs = {k: v for k, v in p.make_inputs(shape, p.distributions[0], 1, "cpu").items() if torch.is_tensor(v)}
    path = f"/dev/shm/copy-speed-{os.getpid()}.pt"
    torch.save(inputs, path)
    nbytes = sum(v.numel() * v.element_size() for v in inputs.values())
    staging = PinnedStaging(staging_refs(), cuda=True)
    staging.ready()
    t = time.perf_counter()
    pinned = {k: torch.empty_like(v, pin_memory=True) for k, v in inputs.items()}
    alloc = time.perf_counter() - t
    register = _register(path, torch)

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t, out

    ways = {"plain": ([], []), "staged": ([], []), "pinned": ([], [])}
    try:
        for _ in range(reps):
            mapped = torch.load(path, mmap=True, weights_only=True)
            up, want = timed(lambda: {k: v.to("cuda") for k, v in mapped.items()})
            down, back = timed(lambda: {k: v.to("cpu") for k, v in want.items()})
            ways["plain"][0].append(up)
            ways["plain"][1].append(down)
            mapped = torch.load(path, mmap=True, weights_only=True)
            up, got = timed(lambda: {k: staging.upload(v, "cuda") for k, v in mapped.items()})
            down, got_back = timed(lambda: {k: staging.download(v) for k, v in got.items()})
            assert all(torch.equal(got[k], want[k]) and torch.equal(got_back[k], back[k]) for k in want)
            ways["staged"][0].append(up)
            ways["staged"][1].append(down)
            for k, v in inputs.items():
                pinned[k].copy_(v)
            up, got = timed(lambda: {k: v.to("cuda", non_blocking=True) for k, v in pinned.items()})
            down, _ = timed(lambda: [pinned[k].copy_(v, non_blocking=True) for k, v in got.items()])
            assert all(torch.equal(got[k], want[k]) for k in want)
            ways["pinned"][0].append(up)
            ways["pinned"][1].append(down)
    finally:
        os.unlink(path)
    lines = [f"{problem_name} {shape.name}: one case, {nbytes / 2**20:.0f} MiB ({', '.join(inputs)}); pinned "
             f"buffers for it allocated in {alloc * 1e3:.0f} ms; {register}"]
    for way, (ups, downs) in ways.items():
        u, d = statistics.median(ups), statistics.median(downs)
        lines.append(f"  {way:7s} up {u * 1e3:7.1f} ms ({nbytes / u / 1e9:5.1f} GB/s)   "
                     f"down {d * 1e3:7.1f} ms ({nbytes / d / 1e9:5.1f} GB/s)")
    return lines


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _register(path: str, torch) -> str:
    """The mapped case pinned in place, each tensor's pages registered with the driver, then unregistered."""
    mapped = torch.load(path, mmap=True, weights_only=True)
    cudart, page = torch.cuda.cudart(), os.sysconf("SC_PAGE_SIZE")
    spans = sorted((v.data_ptr() // page * page, -(-(v.data_ptr() + v.numel() * v.element_size()) // page) * page)
                   for v in mapped.values())
    merged: list[list[int]] = []
    for a, b in spans:  # tensors sharing a page are registered as one span
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    before = _rss_mib()
    t = time.perf_counter()
    errors = {int(cudart.cudaHostRegister(a, b - a, 0)) for a, b in merged}
    took = time.perf_counter() - t
    grew = _rss_mib() - before
    for a, _ in merged:
        cudart.cudaHostUnregister(a)
    if errors != {0}:
        return f"registering the mapped case failed (CUDA errors {sorted(errors)})"
    return f"registering the mapped case took {took * 1e3:.0f} ms and added {grew:.0f} MiB resident"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="*", default=["kda"])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("copy_speed: no CUDA device (the copies it measures are between host memory and a GPU)", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name())
    for name in a.problems:
        print("\n".join(measure(name, a.reps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
