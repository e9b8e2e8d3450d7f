"""The child's pinned staging (gpu_worker.child.transfers): every byte arrives, in order, whatever the chunk
boundaries; strided and small tensors take the plain copy. On the CPU the upload's loop runs with
host tensors for buffers and events that record nothing (what the loop does between them is the subject); on
a GPU both directions against plain copies."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.child import transfers
from gpu_worker.child.transfers import PinnedStaging, staging_refs

T = staging_refs()


class _Event:
    """Stands in for a CUDA event on the CPU, where every copy has finished when it returns; counts use."""

    def __init__(self, log: list):
        self.log = log

    def record(self):
        self.log.append("record")

    def synchronize(self):
        self.log.append("sync")


def _cpu_staging(chunk: int, log: list) -> PinnedStaging:
    st = PinnedStaging(T, cuda=True, chunk=chunk)
    st.buffers = (torch.full((chunk,), 7, dtype=torch.uint8), torch.full((chunk,), 9, dtype=torch.uint8))
    st.events = (_Event(log), _Event(log))
    return st


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("chunk", [1 << 16, 3 * (1 << 16) + 5, 4 << 20])  # a chunk size no element divides too
def test_a_staged_copy_carries_every_byte(dtype, chunk):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 1 << 17, generator=g) * 10).to(dtype)  # 393,216 elements: past SMALL in each dtype but bool
    x = x if x.numel() * x.element_size() >= transfers.SMALL else x.repeat(4, 1)
    log: list = []
    st = _cpu_staging(chunk, log)
    up = st.upload(x, "cpu")
    assert up is not x and up.shape == x.shape and up.dtype == x.dtype and torch.equal(up, x)
    n = -(-x.numel() * x.element_size() // chunk)
    assert log.count("record") == n and log.count("sync") == n  # each chunk waits for its buffer, then queues
    down = st.download(x.t())  # host memory already: a contiguous copy of its own
    assert down.is_contiguous() and torch.equal(down, x.t()) and down.data_ptr() != x.data_ptr()


def test_small_and_strided_tensors_take_the_plain_copy():
    log: list = []
    st = _cpu_staging(1 << 16, log)
    small = torch.arange(10, dtype=torch.float32)
    strided = torch.randn(1024, 512)[:, ::2]
    assert torch.equal(st.upload(small, "cpu"), small)
    up = st.upload(strided, "cpu")
    assert torch.equal(up, strided) and up.stride() == strided.stride()  # its layout kept
    assert log == []


def test_without_cuda_no_buffers_are_made():
    st = PinnedStaging(T, cuda=False)
    st.ready()
    x = torch.randn(1 << 20)
    assert torch.equal(st.upload(x, "cpu"), x) and torch.equal(st.download(x), x)
    assert st.buffers is None


@pytest.mark.gpu
def test_on_a_gpu_staged_copies_equal_plain_ones():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    st = PinnedStaging(T, cuda=True)
    st.ready()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 7_000_001, generator=g).to(torch.bfloat16)  # 70 MB: several chunks, a partial last one
    up = st.upload(x, "cuda")
    assert torch.equal(up.cpu(), x)
    back = st.download(up * 2)
    assert torch.equal(back, (x.cuda() * 2).cpu())


def _faults_reading(values) -> int:
    """Minor page faults this process takes while reading every byte of `values` (no large allocation)."""
    import resource

    import numpy

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for v in values:
        v.reshape(-1).view(torch.uint8).numpy().sum(dtype=numpy.uint64)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.fixture()
def shm_path():
    """A file in /dev/shm, where the input bank lives (tmpfs: a mapping faults its pages in 16 at a time)."""
    import os
    import tempfile

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="populate-test-", suffix=".pt")
    os.close(fd)
    yield path
    os.unlink(path)


@pytest.mark.parametrize("with_madvise", [True, False])
def test_a_populated_mapping_is_read_without_page_faults(shm_path, with_madvise):
    """A bank case, memory-mapped as a candidate child maps it: read as mapped, it takes page faults (each
    inside the upload's device turn); populated first (host work), the same read takes next to none.
    Without madvise's MADV_POPULATE_READ (older kernels), the one-byte-per-page read does the same."""
    path = shm_path
    torch.save({"q": torch.randn(4 << 20), "beta": torch.rand(2 << 20).to(torch.bfloat16), "scale": 0.5}, path)
    pages = (16 << 20) // transfers.PAGE + (4 << 20) // transfers.PAGE
    as_mapped = torch.load(path, mmap=True, weights_only=True)
    assert _faults_reading([as_mapped["q"], as_mapped["beta"]]) > pages // 64  # fault-around: 16 pages a fault
    refs = dict(T, sum=torch.sum, madvise=transfers.madvise_ref() if with_madvise else None)
    populated = torch.load(path, mmap=True, weights_only=True)
    assert transfers.populate(populated.values(), refs) == (16 << 20) + (4 << 20)
    assert _faults_reading([populated["q"], populated["beta"]]) < pages // 256
    assert torch.equal(populated["q"], as_mapped["q"]) and populated["scale"] == 0.5


def test_a_download_lands_in_memory_reserved_and_written_ahead():
    """`reserve` allocates and writes the downloads' host memory in host work; a download then takes a
    reserved tensor of its shape and dtype (no page fault inside its device turn), a new one past them. A
    tensor planted among the reserved ones is never written into."""
    import resource

    st = PinnedStaging(T, cuda=False)
    v = torch.randn(4 << 20)  # 16 MiB: a fresh host tensor of it faults thousands of pages in
    assert st.reserve([((4 << 20,), torch.float32), ((2,), torch.int64)]) == (16 << 20) + 16
    planted = torch.zeros(4 << 20)
    st.reserved[((4 << 20,), torch.float32)].insert(0, planted)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    first = st.download(v)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert torch.equal(first, v) and first.data_ptr() != v.data_ptr() and faults < 64, faults
    second = st.download(v)  # the planted one is skipped: a new tensor
    assert torch.equal(second, v) and second is not planted and not planted.any()
    st.release()
    assert st.reserved == {} and torch.equal(st.download(v[::2]), v[::2])  # a strided one: copied contiguous
