"""A child's timing, both roles: the inputs and timing sets prepared ahead (`prepare`), the timing sets
(static buffers refilled with fresh values before every repetition), CUDA-graph capture, the timed blocks
(`time`) and host latency. The profiler's view of the same steps is child.profile's."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_worker import protocol
from gpu_worker.timing_inputs import FreshValues, check_entries, check_keys, draw_key, entry_seed, pool_cases, set_key

if TYPE_CHECKING:
    from gpu_worker.child.core import ChildCore
    from gpu_worker.child.exports import ChildExports
    from gpu_worker.child.inputs import ChildInputs
    from gpu_worker.child.loading import ChildLoading


@dataclass
class TimingSet:
    """One distribution's timing state: static buffers (what graphs read and write), the value pool, and
    what derives a repetition's values from it (gpu_worker.timing_inputs: an entry's values are a pool set
    perturbed by draws seeded from the benchmark's noise seed and the entry)."""

    key: tuple
    sets: list  # [(inputs, outputs)] static buffers, one graph each when captured
    pool: list  # [inputs] value sets the static inputs' values are made from
    fresh: FreshValues
    graphs: list | None = None
    # per static set, its input and output buffers as the harness allocated them: what is refilled, and
    # poisoned, kept and fingerprinted, whatever the candidate does to the dicts it is handed (`given`)
    ins: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    # reference role, per graph: the tensors the baseline returned when it was captured, which its replays
    # rewrite (an eager call of another benchmark returns new ones: base_outputs is not the graph's)
    graph_outs: list | None = None

    def values(self, e: int, key: int) -> dict:
        return self.fresh(self.pool, e, key)

    def given(self, r: int) -> tuple[dict, dict]:
        """Static set r's dicts as a call is handed them: the harness's own buffers again, whatever an
        earlier call put in them (a buffer of its own there would take the next refill, untimed)."""
        inp, out = self.sets[r]
        inp.clear()
        inp.update(self.ins[r])
        out.clear()
        out.update(self.outs[r])
        return inp, out


class ChildTiming:
    """A child's timing commands, both roles, and the preparation of inputs and timing sets ahead of them.
    Built with the child's core, its inputs, its exports (fingerprints, kept outputs) and its loading
    (the candidate's kernels loaded ahead)."""

    PINNED = ("core", "inputs", "exports", "loading", "timing_sets")  # by identity (ChildCore.pin_trusted)

    # A timing set is `rotate` static input/output buffer sets (one CUDA graph each, when captured) and a
    # pool of `pool` input value sets generated from the worker's timing seeds. Before every repetition,
    # outside the timed interval, a static set's inputs are refilled in place with its entry's values (a
    # pool set perturbed by draws of that entry's own: timing_inputs), its outputs are NaN-poisoned and L2
    # is flushed; the reference child holds the same pool, so any repetition's outputs can be compared
    # with the baseline's on the values that repetition saw. A graph that baked in a result computed
    # during capture, or a cache keyed on buffers or on contents, fails there.
    # The reference child keeps one timing set per distribution (benchmarks share it, each under its
    # lock); a candidate child keeps the one it is being timed on.

    def __init__(self, core: ChildCore, inputs: ChildInputs, exports: ChildExports, loading: ChildLoading):
        self.core, self.inputs, self.exports, self.loading = core, inputs, exports, loading
        self.timing_sets: dict[str, TimingSet] = {}  # distribution -> its timing set
        self._pinned_timing: list = []  # (mapping, keys) of the timing set pinned in a candidate's child
        # reference role: per static output set (the id of its dict), what the timed baseline returned last;
        # a graph's replays rewrite the tensors it returned when captured
        self.base_outputs: dict = {}
        self.entry_keys: OrderedDict = OrderedDict()  # reference role: (noise seed, entry) -> a candidate's key
        self.sleep_rate = None  # device spin cycles per millisecond (cmd_time's cushion)
        self.flush = self.flush_sink = self.flush_graph = None  # the L2 flush's buffer, its sum's sink, its graph

    def cmd_prepare(self, cases: list | None = None, rotate: int | None = None, dist: str | None = None,
                    kernels: bool = True, seed: int = 1000, pool: int = 3, capture: bool = False):
        """Generate inputs ahead (on the CPU side, before the worker's timing block): the verification
        cases' inputs and/or the timing sets; with `capture`, then the timing set's graphs, in the same job."""
        core, inputs = self.core, self.inputs
        inputs.prep_timing = {}
        if cases:
            # uploaded now, before the timing block (the worker holds an untimed device job for this);
            # bounded so that many children at once stay within the device's memory
            host = inputs.host_inputs(cases)
            nbytes = sum(v.numel() * v.element_size() for inp in host.values() for v in inp.values()
                         if hasattr(v, "element_size"))
            # only small sets wait on the device; larger ones are uploaded case by case during the run
            # (KDA's six cases are 1.9 GB, prefill's 6.8 GB: held per waiting child, they filled the device)
            limit = core.settings.prefetch_gb * (1 << 30)
            t0 = core.T["perf"]()
            inputs.prefetched = {k: (inputs._to_device(v) if nbytes <= limit else v) for k, v in host.items()}
            core._sync()
            inputs._count("upload", t0)
            if kernels and core.cuda and core.module is not None:
                t0 = core.T["perf"]()
                self.loading._load_kernels(inputs._inputs(*cases[0]), core._outputs())
                inputs._count("kernels", t0)
        if rotate:
            t0 = core.T["perf"]()
            self._prepare_timing(rotate, dist or core.problem.distributions[0], seed, pool)
            inputs._count("timing-sets", t0)
            # a child that has run the candidate (verified or timed it) has its kernels loaded already;
            # the pre-load is for a fresh one (it holds an untimed device job's turn for seconds)
            if not cases and core.cuda and core.module is not None and not core.ran:
                t0 = core.T["perf"]()
                self.loading._load_kernels(*self._timing_set(dist, "prepare").sets[0])
                inputs._count("kernels", t0)
        if rotate and core.cuda and self.flush is not None and self.flush_graph is None:
            # a flush that did not capture runs on the stream, which delays the timed graph behind it: named
            # in the phase log, since a child's own output goes nowhere
            inputs.prep_timing["flush-on-stream"] = 1
        captured = None
        if rotate and capture:
            t0 = core.T["perf"]()
            captured = self.capture(dist)
            inputs._count("capture", t0)
        return protocol.Prepared(timing={k: round(v, 4) for k, v in inputs.prep_timing.items()}, captured=captured)

    def _prepare_timing(self, rotate: int, dist: str, seed: int = 1000, pool: int = 3):
        import torch

        key = set_key(rotate, seed, pool)
        have = self.timing_sets.get(dist)
        if have is not None and have.key == key:
            return
        if self.core.role == "candidate":
            self._drop_timing()
        else:
            self.timing_sets.pop(dist, None)
            self.base_outputs.clear()  # the next timed call of each set fills its entry again
        if pool < 2:
            raise ValueError("a timing set needs at least two pool entries (every refill changes the values)")
        cases = pool_cases(dist, seed, pool)
        self.inputs.stage_more(cases)  # drawn at once (the reference child's threads)
        entries = [self.inputs._inputs(*c) for c in cases]
        sets = [({k: (self.core.T["clone"](v) if isinstance(v, torch.Tensor) else v)
                  for k, v in entries[i % pool].items()}, self.core._outputs()) for i in range(rotate)]
        fresh = FreshValues(self.core.perturbed, dist, self.core.device, self.core.T["Generator"])
        ts = self.timing_sets[dist] = TimingSet(key=key, sets=sets, pool=entries, fresh=fresh,
                                           ins=[dict(inp) for inp, _ in sets], outs=[dict(out) for _, out in sets])
        if self.core.cuda:  # the refill's own kernels loaded now, outside any timing window (the values unused)
            ts.values(0, entry_seed(int(seed), -1))
            self.core._sync()
        if self.core.role == "candidate":  # what derives and holds the timed values, by identity (gpu_worker.pins)
            self._pinned_timing = [(self.timing_sets, [dist]),
                                   (vars(ts), ["key", "sets", "pool", "fresh", "ins", "outs"]),
                                   (vars(fresh), ["perturbed", "dist", "gen"])]
            for m, keys in self._pinned_timing:
                self.core.pins.add("timing set", m, keys)
        if self.core.cuda and self.flush is None:
            from gpu_worker.devicetime import cold_bytes

            nbytes = cold_bytes()
            self.flush = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
            self.flush_sink = torch.zeros((), dtype=torch.float32, device="cuda")
            self.flush_graph = self._capture_flush()

    def _drop_timing(self):
        for m, keys in self._pinned_timing:
            self.core.pins.forget(m, keys)
        self._pinned_timing = []
        self.timing_sets.clear()

    def _timing_set(self, dist: str | None, what: str) -> "TimingSet":
        dist = dist or self.core.problem.distributions[0]
        ts = self.timing_sets.get(dist)
        if ts is None:
            raise ValueError(f"{what} before the timing set of distribution {dist!r} was prepared")
        return ts

    def _fn(self):
        if self.core.role == "candidate":
            # the same dispatch guard as when verified: a timed call cannot be told from a checked one
            # (its host cost is no device time)
            from gpu_worker.guard import dispatch_guard

            run, threads, after = self.core.module.run, self.core.candidate_threads, self.core.after_candidate

            def run_guarded(inputs, out):
                before = threads()
                with dispatch_guard(outputs=out):
                    run(inputs, out)
                after(before)  # no thread left running, no slot of the trusted code rebound

            return run_guarded
        base, last = self.core.baseline, self.base_outputs

        def run_baseline(inputs, out):  # its own outputs, not copied into `out`: the copy is no baseline work
            last[id(out)] = base(inputs)

        return run_baseline

    def _refill(self, inp: dict, src: dict) -> None:
        """In place: the static set's inputs take the pool entry's values (same buffers, new contents)."""
        import torch

        for k, v in inp.items():
            if isinstance(v, torch.Tensor):
                self.core.T["copy_"](v, src[k])

    def _poison(self, out: dict) -> None:
        import torch

        for v in out.values():
            if type(v) is torch.Tensor and v.is_floating_point():
                self.core.T["fill_"](v, float("nan"))

    def _flush_l2(self) -> None:
        # read, not written: a flush that leaves L2 full of dirty lines slows the next kernel (a float sum
        # reads the buffer once and writes one scalar; a widening sum would first write a widened copy)
        self.core.T["sum"](self.flush, 0, out=self.flush_sink)

    def _capture_flush(self):
        """The L2 flush as a CUDA graph, or None if it does not capture. A graph replayed right after
        stream work starts ~1 us later on the device than one replayed after another graph (2 us for a
        handful of kernels), which would lie inside the timed interval: graph-mode repetitions are
        preceded by this graph, as back-to-back replays are by each other."""
        import torch

        try:
            g = self.core.T["graph"]()
            with torch.cuda.graph(g):
                self._flush_l2()
            self.core.T["sync"]()
            return g
        except Exception as e:  # noqa: BLE001 - a flush that does not capture runs on the stream
            print(f"L2 flush not captured ({type(e).__name__}: {e}); it runs on the stream", flush=True)
            self.core.T["sync"]()
            return None

    def _before_rep(self, ts: "TimingSet", r: int, e: int, key: int, graph: bool = False) -> None:
        """Everything a repetition needs that is not timed, queued on the stream ahead of its events (and
        outside any captured graph): entry e's values (drawn with `key`) into static set r, its outputs
        poisoned, and the L2 flush last, launched the way the timed work is (`graph`: as a graph replay)."""
        ts.given(r)
        self._refill(ts.ins[r], ts.values(e, key))
        self._poison(ts.outs[r])
        if self.core.cuda:
            if graph and self.flush_graph is not None:
                self.core.T["replay"](self.flush_graph)
            else:
                self._flush_l2()

    def capture(self, dist: str | None = None) -> protocol.Captured:
        """Capture one CUDA graph per static set (Prepare's `capture`); says whether this side captures (the
        worker times graph replays only when every side of the comparison does)."""
        ts = self._timing_set(dist, "capture")
        reference = self.core.role == "reference"
        if reference and ts.graphs is not None:
            # the trusted side's graphs serve every benchmark of this timing set: captured once, they are
            # never rebuilt under another benchmark's prepared blocks
            return protocol.Captured(captured=True, why="")
        ts.graphs = ts.graph_outs = None
        if not reference:
            self.core.pins.forget(vars(ts), ["graphs"])
        if not self.core.cuda:
            return protocol.Captured(captured=False, why="no CUDA device")
        import torch

        fn = self._fn()
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # capture needs every lazy initialisation done: one call per set first
                for r in range(len(ts.sets)):
                    fn(*ts.given(r))
            torch.cuda.current_stream().wait_stream(s)
            self.core.T["sync"]()
            graphs, graph_outs = [], []
            for r in range(len(ts.sets)):
                inp, out = ts.given(r)
                g = self.core.T["graph"]()
                with torch.cuda.graph(g):
                    fn(inp, out)
                graphs.append(g)
                if reference:
                    graph_outs.append(self.base_outputs[id(out)])
            self.core.T["sync"]()
        except Exception as e:  # noqa: BLE001 - a side that does not capture is timed back to back
            try:
                self.core.T["sync"]()
            except Exception:  # noqa: BLE001 - a broken context shows at the next call
                pass
            return protocol.Captured(captured=False, why=f"{type(e).__name__}: {str(e)[:300]}")
        ts.graphs, ts.graph_outs = graphs, (graph_outs if reference else None)
        if not reference:  # what a graph-mode block replays, by identity
            self.core.pins.add("timing set", vars(ts), ["graphs"])
            self._pinned_timing.append((vars(ts), ["graphs"]))
        return protocol.Captured(captured=True, why="")

    def _cycles_per_ms(self) -> float:
        """The device's spin rate for torch.cuda._sleep, measured once per process."""
        if self.sleep_rate is None:
            start, end = self.core.T["Event"](enable_timing=True), self.core.T["Event"](enable_timing=True)
            self.core.T["sleep"](1000)  # first launch outside the measurement
            self.core.T["record"](start)
            self.core.T["sleep"](2_000_000)
            self.core.T["record"](end)
            self.core.T["sync"]()
            self.sleep_rate = 2_000_000 / max(self.core.T["elapsed"](start, end), 1e-3)
        return self.sleep_rate

    def _baseline_at(self, ts: "TimingSet", e: int, noise_seed: int) -> dict:
        """The baseline's outputs on entry e's values (each entry is met once: nothing is kept): drawn with
        the key the candidate's child reported for it when the baseline was timed on it, else the noise seed's."""
        key = self.entry_keys.get((int(noise_seed), int(e)), None) or entry_seed(noise_seed, e)
        outs = {k: v.detach() for k, v in self.core.baseline(ts.values(int(e), key)).items()}
        self.core._sync()
        return outs

    def cmd_time(self, reps: int, warmup: int = 3, mode: str = "back-to-back", keep_one: bool = False,
                 dist: str | None = None, check_seed: int | None = None, device_floor_ms: float = 0.0,
                 entries: list | None = None, noise_seed: int | None = None, first: int = 0,
                 keys: list | None = None):
        """Time `reps` repetitions on the prepared timing set; returns per-repetition device milliseconds.

        CUDA: the device first waits (a spin kernel) long enough for the host to stay ahead of it through
        the block (`cushion_ms`; `device_floor_ms`: a lower bound of the device's time per repetition);
        then each repetition is refill, poison, L2 flush, start event, the work (a graph replay in
        "cuda-graph" mode, an eager call in "back-to-back" mode), end event; one synchronize at the end.
        Host time therefore never lies between a repetition's events. Without CUDA the same steps run
        eagerly around perf_counter (the interpreter stand-in: its times say nothing about speed).

        Repetition i runs on entry first + i (the worker hands out each entry once per benchmark and side);
        given `entries`, the timed repetitions run on those instead, after `warmup` from first on. An
        entry's values are a pool set perturbed by draws from its key (gpu_worker.timing_inputs). A
        candidate's child draws each repetition's key from the OS just before its refill, after the call
        before it returned, and reports the timed ones (`Timed.keys`): no value of a later call exists in
        its process before that call. The reference child is given the candidate's keys with its entries,
        else derives keys from the worker's `noise_seed` (without one: a seed of its own).

        With `keep_one` the outputs of one repetition, picked at random, are copied for `host_latency`'s download
        with the entry it ran on. With `check_seed` every repetition's outputs are also fingerprinted after
        its end event (outside the timed interval, before the next refill): projected onto random vectors
        drawn from the seed; the reference role adds each output's norm. The worker compares the two call
        by call, and no baseline call is spent on the comparison alone.

        What the loop needs is bound before it starts, in this frame, and every call of the candidate is
        followed by its checks (ChildCore.after_candidate): the timers, the refill and the fingerprint
        cannot be rebound under it, and the times and keys it records are tuples."""
        T = self.core.T
        perf, urandom, record, sync = T["perf"], T["urandom"], T.get("record"), T.get("sync")
        ts = self._timing_set(dist, "time")
        if mode == "cuda-graph" and ts.graphs is None:
            raise ValueError("cuda-graph timing asked of a side that did not capture")
        fn = self._fn()
        rotate, warmup = len(ts.sets), max(warmup, 1)
        shared = entries is not None or check_seed is not None
        key_of = self._key_source(noise_seed, first, entries, keys, shared=shared)
        warm = list(range(first, first + warmup))
        if entries is not None:
            entries = check_entries(entries, avoid=range(first, first + warmup))
            reps = len(entries)
        elif type(reps) is not int or reps < 1:
            raise ValueError(f"reps must be a positive int, got {reps!r}")
        else:
            entries = list(range(first + warmup, first + warmup + reps))
        order = tuple((i % rotate, e) for i, e in enumerate(warm + entries))
        # every timed repetition ran on values its buffers never held (at capture they held a pool set
        # itself): a result fixed then, or cached per buffer or per content, cannot be right there
        pick = int.from_bytes(urandom(4), "little") % reps if keep_one else -1
        graph = mode == "cuda-graph"

        def launch(r: int):
            if graph:
                T["replay"](ts.graphs[r])
            else:
                fn(*ts.sets[r])

        timed = order[warmup:]
        proj = self.exports._projections(check_seed) if check_seed is not None else None
        reference = self.core.role == "reference"
        fps: list = []
        used: tuple = ()  # each timed repetition's key, in order

        def check(r: int, into: list | None):
            if proj is not None:
                if not reference:
                    outs = ts.outs[r]
                else:  # the baseline's own outputs: a graph's rewritten by its replay, else the call's
                    outs = ts.graph_outs[r] if graph else self.base_outputs[id(ts.sets[r][1])]
                f = self.exports._fingerprint(outs, proj, squares=reference)
                if into is not None:
                    into.append(f)

        host_rep_ms = 0.0
        for n, (r, j) in enumerate(order[:warmup]):
            if self.core.cuda and n == warmup - 1:
                sync()
                t0 = perf()  # how long the host takes to queue one repetition: the device's wait covers the block
            self._before_rep(ts, r, j, key_of(None, j), graph=graph)
            launch(r)
            check(r, None)  # queued like a timed repetition's, so the host's queueing time counts it
            if self.core.cuda and n == warmup - 1:
                host_rep_ms = (perf() - t0) * 1e3
        times: tuple = ()
        if not self.core.cuda:
            for i, (r, j) in enumerate(timed):
                key = key_of(i, j)
                self._before_rep(ts, r, j, key)
                t0 = perf()
                launch(r)
                times = times + ((perf() - t0) * 1e3,)
                used = used + (key,)
                if i == pick:
                    self.exports.timed_outputs.append((j, {k: T["clone"](v) for k, v in ts.outs[r].items()}))
                check(r, fps)
            return protocol.Timed(times=list(times), keys=list(used),
                                  mode="interpreter" if self.core.role == "candidate" or self.core.cpu_mode else "cpu",
                                  checks=self.exports._checks(timed, fps, proj, reference),
                                  check_names=list(proj or {}))
        sync()
        from gpu_worker.timing import cushion_ms

        starts = tuple(T["Event"](enable_timing=True) for _ in timed)
        ends = tuple(T["Event"](enable_timing=True) for _ in timed)
        T["sleep"](int(cushion_ms(host_rep_ms, len(timed), device_floor_ms) * self._cycles_per_ms()))
        for i, (r, j) in enumerate(timed):
            key = key_of(i, j)
            self._before_rep(ts, r, j, key, graph=graph)
            record(starts[i])
            launch(r)
            record(ends[i])
            used = used + (key,)
            if i == pick:
                self.exports.timed_outputs.append((j, {k: T["clone"](v) for k, v in ts.outs[r].items()}))
            check(r, fps)
        sync()
        times = tuple(T["elapsed"](s, e) for s, e in zip(starts, ends))
        self.core.ran = True
        return protocol.Timed(times=list(times), keys=list(used), mode=mode,
                              checks=self.exports._checks(timed, fps, proj, reference), check_names=list(proj or {}))

    def _key_source(self, noise_seed: int | None, first: int, entries: list | None = None, keys: list | None = None,
                    shared: bool = False):
        """`key_of(i, entry)`: the key of timed repetition i (None: a warm-up) on `entry`. A candidate's
        child draws each from the OS when asked (just before the repetition's refill) and is handed no
        noise seed; the reference child takes the candidate's `keys` for the timed repetitions, else the
        worker's noise seed's (entry_seed), else, where no other process needs the values (`shared`
        false), a seed of its own drawn now."""
        if type(first) is not int or first < 0:
            raise ValueError(f"first must be a non-negative int, got {first!r}")
        urandom = self.core.T["urandom"]
        if self.core.role == "candidate":
            if noise_seed is not None or keys is not None:
                raise ValueError("a candidate's child draws every repetition's values itself: it is handed no "
                                 "noise seed and no keys")
            return lambda i, e, _draw=draw_key, _urandom=urandom: _draw(_urandom)
        if noise_seed is None:
            if shared:
                raise ValueError("entries and check_seed need the benchmark's noise_seed: without it no other "
                                 "process derives the values a repetition ran on")
            noise_seed = draw_key(urandom)
        noise_seed = int(noise_seed)
        if keys is None:
            return lambda i, e: entry_seed(noise_seed, e)
        if entries is None:
            raise ValueError("keys are given with the entries they belong to")
        given = tuple(check_keys(keys, len(entries)))
        for e, k in zip(entries, given):  # for the kept outputs' comparison (_baseline_at)
            self.entry_keys[(noise_seed, int(e))] = k
        while len(self.entry_keys) > 100_000:
            self.entry_keys.popitem(last=False)
        return lambda i, e: entry_seed(noise_seed, e) if i is None else given[i]

    def cmd_host_latency(self, reps: int = 10, dist: str | None = None, noise_seed: int | None = None,
                         first: int = 0, export: bool = False):
        """Host latency of a synchronous call (milliseconds from the call to the end of a synchronize,
        L2 flushed before it): what a caller waits, launch overhead included. Reported beside the device
        time, never inside a speedup. Call i runs on entry first + i. With `export`, then the timed calls'
        kept outputs downloaded (`_download_timed`): the distribution's last device step of this child."""
        ts = self._timing_set(dist, "host latency")
        fn = self._fn()
        perf = self.core.T["perf"]
        key_of = self._key_source(noise_seed, first)
        walls: tuple = ()
        for i in range(reps):
            r = i % len(ts.sets)
            self._before_rep(ts, r, first + i, key_of(None, first + i))
            self.core._sync()
            t0 = perf()
            fn(*ts.sets[r])
            self.core._sync()
            walls = walls + ((perf() - t0) * 1e3,)
        return protocol.HostLatency(walls=list(walls), jobs=self.exports._download_timed() if export else [])

    def cmd_park(self):
        """Drop the timing sets and the flush buffer before this child waits, kept, for a later benchmark:
        they cost ~0.3 s to make again and ~1.4 GB (KDA) of device memory to keep per waiting child."""
        self._drop_timing()
        self.flush = self.flush_graph = None
        self.core._release()
        return protocol.Empty()
