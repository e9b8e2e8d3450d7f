"""The template's compiled kernels shared between the children that load it (gpu_worker.render_kernels):
which sources count as renders, what a child's cache gives the store, what the store gives a later child,
and what a corrupt entry costs (a compile, never a wrong kernel). Triton's cache folders are written here in
its layout (a `__grp__NAME.json` naming the folder's files by absolute path), since the interpreter compiles
none; the GPU test at the end loads the template twice in real children."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from baselines.registry import get_problem
from gpu_worker.render_kernels import RenderKernels, render_digest
from tests.gpu_worker.harnesses import _cuda, req
from workflows.contracts import EvalRequest


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("name", ["softmax", "kda"])
def test_the_template_and_its_renders_in_the_knob_space_are_renders(name):
    p = get_problem(name)
    t = p.template()
    assert render_digest(p, t) == sha(t)
    knobs = {k: v[-1] for k, v in p.knob_space().items()}
    r = p.render(knobs)
    assert r != t and render_digest(p, r) == sha(r)


def test_anything_else_is_not_a_render():
    p = get_problem("kda")
    space, base = p.knob_space(), p.default_knobs()
    t = p.template()
    assert render_digest(p, t + "\nimport os\n") is None  # a line of its own
    assert render_digest(p, t.replace("def ", "def  ", 1)) is None  # any other byte
    outside = next(k for k, v in space.items() if all(isinstance(x, int) and not isinstance(x, bool) for x in v))
    assert render_digest(p, p.render({outside: max(space[outside]) + 1})) is None  # a value the space lacks
    flag = next(k for k, v in space.items() if True in v)
    assert render_digest(p, p.render({flag: 1})) is None  # 1 == True, but not the space's value
    extra = t.replace("KNOBS = {", "KNOBS = {'EXTRA': 1, ", 1)
    assert render_digest(p, extra) is None
    assert render_digest(p, t.replace("KNOBS = {", "KNOBS = {" + "[" * 5000, 1)) is None  # no parse
    assert render_digest(p, "print('hi')\n") is None
    assert base  # the template has knobs to vary


def _triton_folder(cache: Path, name: str, kernel: str, payload: bytes = b"\x7fELF cubin") -> Path:
    d = cache / name
    d.mkdir(parents=True)
    (d / f"{kernel}.cubin").write_bytes(payload)
    (d / f"{kernel}.json").write_text(json.dumps({"name": kernel}))
    (d / f"__grp__{kernel}.json").write_text(json.dumps({"child_paths": {
        f"{kernel}.cubin": str(d / f"{kernel}.cubin"), f"{kernel}.json": str(d / f"{kernel}.json")}}))
    return d


@pytest.fixture
def settings(tmp_path):
    from gpu_worker.settings import GpuWorkerSettings

    return GpuWorkerSettings(cache_dir=tmp_path / "cache", gpu_workdir=tmp_path / "work")


def test_a_childs_entries_are_kept_and_given_to_the_next_child_of_the_same_source(tmp_path, settings):
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _triton_folder(first, "K1", "chunk_kda_prep")
    _triton_folder(first, "K2", "chunk_kda_state", b"state bits")
    _triton_folder(first, "H1", "_perturb_rows")  # the harness's: seeded from the trusted cache, not the source's
    (first / "K3").mkdir()  # being written: no group yet
    (first / "K3" / "x.cubin").write_bytes(b"half")
    store = RenderKernels(settings, False)
    assert store.harvest("s1", first) == 2 and store.harvest("s1", first) == 0  # stored once

    restarted = RenderKernels(settings, False)  # a worker started again finds them under the cache root
    assert restarted.seed("s1", second) == 2 and sorted(p.name for p in second.iterdir()) == ["K1", "K2"]
    assert (second / "K2" / "chunk_kda_state.cubin").read_bytes() == b"state bits"
    group = json.loads((second / "K1" / "__grp__chunk_kda_prep.json").read_text())["child_paths"]
    assert group == {"chunk_kda_prep.cubin": str(second / "K1" / "chunk_kda_prep.cubin"),
                     "chunk_kda_prep.json": str(second / "K1" / "chunk_kda_prep.json")}  # the copy's own paths
    assert restarted.seed("s1", second) == 0  # already there: left
    assert restarted.seed("s2", other) == 0 and not other.exists()  # another source gets nothing


def test_a_corrupt_entry_is_not_seeded_and_the_next_harvest_stores_it_again(tmp_path, settings):
    first = tmp_path / "a"
    _triton_folder(first, "K1", "k_one")
    _triton_folder(first, "K2", "k_two")
    store = RenderKernels(settings, False)
    store.harvest("s1", first)
    entry = store.disk.path(store._entry_key("K1"))
    raw = bytearray(entry.read_bytes())
    raw[-1] ^= 0xFF  # one bit of the cubin flipped on disk
    entry.write_bytes(bytes(raw))
    seeded = tmp_path / "b"
    assert store.seed("s1", seeded) == 1 and [p.name for p in seeded.iterdir()] == ["K2"]
    assert not entry.exists() and store.disk.get_json(store._index_key("s1")) == ["K2"]  # dropped, not trusted
    assert store.harvest("s1", first) == 1 and store.disk.get_json(store._index_key("s1")) == ["K1", "K2"]
    again = tmp_path / "c"
    assert store.seed("s1", again) == 2
    assert (again / "K1" / "k_one.cubin").read_bytes() == (first / "K1" / "k_one.cubin").read_bytes()


def test_an_entry_is_keyed_by_the_gpu_model_and_tritons_version(tmp_path, settings, monkeypatch):
    first = tmp_path / "a"
    _triton_folder(first, "K1", "k_one")
    store = RenderKernels(settings, False)
    store.harvest("s1", first)
    other = RenderKernels(settings, False)
    other.base = {**other.base, "gpu": "NVIDIA H100 80GB HBM3"}
    assert other.seed("s1", tmp_path / "b") == 0
    other.base = {**store.base, "triton": "0.0"}
    assert other.seed("s1", tmp_path / "c") == 0


def test_a_renders_child_is_seeded_before_its_load_and_harvested_after_its_compile(store):
    """The wiring: an evaluation's compile of the template asks the store for the source's entries before
    the child loads and gives it the child's cache after the compile; a source that is not a render, neither."""
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.harness import Evaluator

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    calls = []

    class Recording(RenderKernels):
        def seed(self, digest, own):
            calls.append(("seed", digest, Path(own).name))
            return 0

        def harvest(self, digest, own):
            calls.append(("harvest", digest, Path(own).name))
            return 0

    try:
        # on the CPU the harness keeps no store (the interpreter compiles nothing): one that records
        e.children.renders = Recording(e.ctx.settings, False)
        t = get_problem("softmax").template()
        assert e.compile(req(store, t)).ok
        assert calls == [("seed", sha(t), "triton-cache"), ("harvest", sha(t), "triton-cache")]
        calls.clear()
        assert e.compile(req(store, t + "\n# mine\n")).ok and calls == []
    finally:
        e.close()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs CUDA")
def test_on_a_gpu_the_second_child_of_the_template_compiles_nothing(store, settings):
    """Two compiles of the KDA template in fresh children: the first stores what Triton compiled, the second
    is given every entry and its compile finds them (Triton writes no new folder)."""
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.harness import Evaluator
    from gpu_worker.phases import phases_begin, phases_end

    e = Evaluator(store=store, interpreter=False, scheduler=Scheduler(spares=0), settings=settings)
    try:
        t = get_problem("kda").template()
        seen = []
        for i in range(2):
            r = EvalRequest(problem="kda", candidate_id=f"render-{i}", source_key=store.put_text(t))
            phases_begin()
            assert e.compile(r).ok
            seen.append(phases_end())
            e.loaded.shed()
        assert seen[0].get("render-harvest-n", 0) >= 2 and seen[0].get("render-seed-n", 0) == 0
        assert seen[1].get("render-seed-n", 0) == seen[0]["render-harvest-n"]
        assert seen[1].get("render-harvest-n", 0) == 0  # nothing new compiled
        assert seen[1]["compile.triton"] < seen[0]["compile.triton"]
    finally:
        e.close()
