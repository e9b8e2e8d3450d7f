"""A child's timing, both roles: the timing sets (static buffers refilled with fresh values before every
repetition), CUDA-graph capture, the timed blocks (`time`), host latency and the profiler's view."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_worker import protocol
from gpu_worker.timing_inputs import FreshValues, check_entries, check_keys, draw_key, entry_seed


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
    # per static set, its output buffers as the harness allocated them: what is poisoned, kept and
    # fingerprinted, whatever the candidate does to the dicts it is handed
    outs: list = field(default_factory=list)

    def values(self, e: int, key: int) -> dict:
        return self.fresh(self.pool, e, key)


class ChildTiming:
    """A child's timing commands, both roles."""

    # A timing set is `rotate` static input/output buffer sets (one CUDA graph each, when captured) and a
    # pool of `pool` input value sets generated from the worker's timing seeds. Before every repetition,
    # outside the timed interval, a static set's inputs are refilled in place with its entry's values (a
    # pool set perturbed by draws of that entry's own: timing_inputs), its outputs are NaN-poisoned and L2
    # is flushed; the reference child holds the same pool, so any repetition's outputs can be compared
    # with the baseline's on the values that repetition saw. A graph that baked in a result computed
    # during capture, or a cache keyed on buffers or on contents, fails there.
    # The reference child keeps one timing set per distribution (benchmarks share it, each under its
    # lock); a candidate child keeps the one it is being timed on.

    def _prepare_timing(self, rotate: int, dist: str, seed: int = 1000, pool: int = 3):
        import torch

        key = (rotate, int(seed), pool)
        have = self.timing.get(dist)
        if have is not None and have.key == key:
            return
        if self.role == "candidate":
            self._drop_timing()
        else:
            self.timing.pop(dist, None)
            self.base_outputs.clear()  # the next timed call of each set fills its entry again
        if pool < 2:
            raise ValueError("a timing set needs at least two pool entries (every refill changes the values)")
        entries = [self._inputs(dist, int(seed) + k) for k in range(pool)]
        sets = [({k: (self.T["clone"](v) if isinstance(v, torch.Tensor) else v)
                  for k, v in entries[i % pool].items()}, self._outputs()) for i in range(rotate)]
        fresh = FreshValues(self.perturbed, dist, self.device, self.T["Generator"])
        ts = self.timing[dist] = TimingSet(key=key, sets=sets, pool=entries, fresh=fresh,
                                           outs=[dict(out) for _, out in sets])
        if self.role == "candidate":  # what derives and holds the timed values, by identity (gpu_worker.pins)
            self._pinned_timing = [(self.timing, [dist]), (vars(ts), ["key", "sets", "pool", "fresh", "outs"]),
                                   (vars(fresh), ["perturbed", "dist", "gen"])]
            for m, keys in self._pinned_timing:
                self.pins.add("timing set", m, keys)
        if self.cuda and self.flush is None:
            from gpu_worker.devicetime import cold_bytes

            nbytes = cold_bytes()
            self.flush = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
            self.flush_sink = torch.zeros((), dtype=torch.float32, device="cuda")
            self.flush_graph = self._capture_flush()

    def _drop_timing(self):
        for m, keys in getattr(self, "_pinned_timing", ()):
            self.pins.forget(m, keys)
        self._pinned_timing = []
        self.timing.clear()

    def _timing_set(self, dist: str | None, what: str) -> "TimingSet":
        dist = dist or self.problem.distributions[0]
        ts = self.timing.get(dist)
        if ts is None:
            raise ValueError(f"{what} before the timing set of distribution {dist!r} was prepared")
        return ts

    def _fn(self):
        if self.role == "candidate":
            # the same dispatch guard as when verified: a timed call cannot be told from a checked one
            # (its host cost is no device time)
            from gpu_worker.guard import dispatch_guard

            run, threads, after = self.module.run, self.candidate_threads, self.after_candidate

            def run_guarded(inputs, out):
                before = threads()
                with dispatch_guard(outputs=out):
                    run(inputs, out)
                after(before)  # no thread left running, no slot of the trusted code rebound

            return run_guarded
        base, last = self.baseline, self.base_outputs

        def run_baseline(inputs, out):  # its own outputs, not copied into `out`: the copy is no baseline work
            last[id(out)] = base(inputs)

        return run_baseline

    def _refill(self, inp: dict, src: dict) -> None:
        """In place: the static set's inputs take the pool entry's values (same buffers, new contents)."""
        import torch

        for k, v in inp.items():
            if isinstance(v, torch.Tensor):
                self.T["copy_"](v, src[k])

    def _poison(self, out: dict) -> None:
        import torch

        for v in out.values():
            if type(v) is torch.Tensor and v.is_floating_point():
                self.T["fill_"](v, float("nan"))

    def _flush_l2(self) -> None:
        # read, not written: a flush that leaves L2 full of dirty lines slows the next kernel (a float sum
        # reads the buffer once and writes one scalar; a widening sum would first write a widened copy)
        self.T["sum"](self.flush, 0, out=self.flush_sink)

    def _capture_flush(self):
        """The L2 flush as a CUDA graph, or None if it does not capture. A graph replayed right after
        stream work starts ~1 us later on the device than one replayed after another graph (2 us for a
        handful of kernels), which would lie inside the timed interval: graph-mode repetitions are
        preceded by this graph, as back-to-back replays are by each other."""
        import torch

        try:
            g = self.T["graph"]()
            with torch.cuda.graph(g):
                self._flush_l2()
            self.T["sync"]()
            return g
        except Exception as e:  # noqa: BLE001 - a flush that does not capture runs on the stream
            print(f"L2 flush not captured ({type(e).__name__}: {e}); it runs on the stream", flush=True)
            self.T["sync"]()
            return None

    def _before_rep(self, ts: "TimingSet", r: int, e: int, key: int, graph: bool = False) -> None:
        """Everything a repetition needs that is not timed, queued on the stream ahead of its events (and
        outside any captured graph): entry e's values (drawn with `key`) into static set r, its outputs
        poisoned, and the L2 flush last, launched the way the timed work is (`graph`: as a graph replay)."""
        self._refill(ts.sets[r][0], ts.values(e, key))
        self._poison(ts.outs[r])
        if self.cuda:
            if graph and self.flush_graph is not None:
                self.T["replay"](self.flush_graph)
            else:
                self._flush_l2()

    def cmd_capture(self, dist: str | None = None):
        """Capture one CUDA graph per static set; the reply says whether this side captures (the worker
        times graph replays only when every side of the comparison does)."""
        ts = self._timing_set(dist, "capture")
        ts.graphs = None
        if self.role == "candidate":
            self.pins.forget(vars(ts), ["graphs"])
        if not self.cuda:
            return protocol.Captured(captured=False, why="no CUDA device")
        import torch

        fn = self._fn()
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # capture needs every lazy initialisation done: one call per set first
                for inp, out in ts.sets:
                    fn(inp, out)
            torch.cuda.current_stream().wait_stream(s)
            self.T["sync"]()
            graphs = []
            for inp, out in ts.sets:
                g = self.T["graph"]()
                with torch.cuda.graph(g):
                    fn(inp, out)
                graphs.append(g)
            self.T["sync"]()
        except Exception as e:  # noqa: BLE001 - a side that does not capture is timed back to back
            try:
                self.T["sync"]()
            except Exception:  # noqa: BLE001 - a broken context shows at the next call
                pass
            return protocol.Captured(captured=False, why=f"{type(e).__name__}: {str(e)[:300]}")
        ts.graphs = graphs
        if self.role == "candidate":  # what a graph-mode block replays, by identity
            self.pins.add("timing set", vars(ts), ["graphs"])
            self._pinned_timing.append((vars(ts), ["graphs"]))
        return protocol.Captured(captured=True, why="")

    def _cycles_per_ms(self) -> float:
        """The device's spin rate for torch.cuda._sleep, measured once per process."""
        if self.sleep_rate is None:
            start, end = self.T["Event"](enable_timing=True), self.T["Event"](enable_timing=True)
            self.T["sleep"](1000)  # first launch outside the measurement
            self.T["record"](start)
            self.T["sleep"](2_000_000)
            self.T["record"](end)
            self.T["sync"]()
            self.sleep_rate = 2_000_000 / max(self.T["elapsed"](start, end), 1e-3)
        return self.sleep_rate

    def _baseline_at(self, ts: "TimingSet", e: int, noise_seed: int) -> dict:
        """The baseline's outputs on entry e's values (each entry is met once: nothing is kept): drawn with
        the key the candidate's child reported for it when the baseline was timed on it, else the noise seed's."""
        key = self.entry_keys.get((int(noise_seed), int(e)), None) or entry_seed(noise_seed, e)
        outs = {k: v.detach() for k, v in self.baseline(ts.values(int(e), key)).items()}
        self._sync()
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
        T = self.T
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
        proj = self._projections(check_seed) if check_seed is not None else None
        reference = self.role == "reference"
        fps: list = []
        used: tuple = ()  # each timed repetition's key, in order

        def check(r: int, into: list | None):
            if proj is not None:
                outs = self.base_outputs[id(ts.sets[r][1])] if reference else ts.outs[r]
                f = self._fingerprint(outs, proj, squares=reference)
                if into is not None:
                    into.append(f)

        host_rep_ms = 0.0
        for n, (r, j) in enumerate(order[:warmup]):
            if self.cuda and n == warmup - 1:
                sync()
                t0 = perf()  # how long the host takes to queue one repetition: the device's wait covers the block
            self._before_rep(ts, r, j, key_of(None, j), graph=graph)
            launch(r)
            check(r, None)  # queued like a timed repetition's, so the host's queueing time counts it
            if self.cuda and n == warmup - 1:
                host_rep_ms = (perf() - t0) * 1e3
        times: tuple = ()
        if not self.cuda:
            for i, (r, j) in enumerate(timed):
                key = key_of(i, j)
                self._before_rep(ts, r, j, key)
                t0 = perf()
                launch(r)
                times = times + ((perf() - t0) * 1e3,)
                used = used + (key,)
                if i == pick:
                    self.timed_outputs.append((j, {k: T["clone"](v) for k, v in ts.outs[r].items()}))
                check(r, fps)
            return protocol.Timed(times=list(times), keys=list(used),
                                  mode="interpreter" if self.role == "candidate" or self.cpu_mode else "cpu",
                                  checks=self._checks(timed, fps, proj, reference), check_names=list(proj or {}))
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
                self.timed_outputs.append((j, {k: T["clone"](v) for k, v in ts.outs[r].items()}))
            check(r, fps)
        sync()
        times = tuple(T["elapsed"](s, e) for s, e in zip(starts, ends))
        self.ran = True
        return protocol.Timed(times=list(times), keys=list(used), mode=mode,
                              checks=self._checks(timed, fps, proj, reference), check_names=list(proj or {}))

    def _key_source(self, noise_seed: int | None, first: int, entries: list | None = None, keys: list | None = None,
                    shared: bool = False):
        """`key_of(i, entry)`: the key of timed repetition i (None: a warm-up) on `entry`. A candidate's
        child draws each from the OS when asked (just before the repetition's refill) and is handed no
        noise seed; the reference child takes the candidate's `keys` for the timed repetitions, else the
        worker's noise seed's (entry_seed), else, where no other process needs the values (`shared`
        false), a seed of its own drawn now."""
        if type(first) is not int or first < 0:
            raise ValueError(f"first must be a non-negative int, got {first!r}")
        urandom = self.T["urandom"]
        if self.role == "candidate":
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
        perf = self.T["perf"]
        key_of = self._key_source(noise_seed, first)
        walls: tuple = ()
        for i in range(reps):
            r = i % len(ts.sets)
            self._before_rep(ts, r, first + i, key_of(None, first + i))
            self._sync()
            t0 = perf()
            fn(*ts.sets[r])
            self._sync()
            walls = walls + ((perf() - t0) * 1e3,)
        return protocol.HostLatency(walls=list(walls), jobs=self._download_timed() if export else [])

    def cmd_park(self):
        """Drop the timing sets and the flush buffer before this child waits, kept, for a later benchmark:
        they cost ~0.3 s to make again and ~1.4 GB (KDA) of device memory to keep per waiting child."""
        self._drop_timing()
        self.flush = self.flush_graph = None
        self._release()
        return protocol.Empty()

    def cmd_profile(self, reps: int = 10, dist: str | None = None, noise_seed: int | None = None, first: int = 0):
        """torch.profiler (CUPTI) over the timed loop's steps, once with the work and once without it: the
        difference is the work's device kernel time per call, which the worker compares with the judged
        device time. Also returns the kernel names the work launched. Each refill takes the next entry from
        `first` on (2 + 2 x reps of them)."""
        from torch.profiler import ProfilerActivity, profile

        ts = self._timing_set(dist, "profile")
        fn = self._fn()
        rotate = len(ts.sets)
        key_of = self._key_source(noise_seed, first)
        entry = iter(range(first, first + 2 + 2 * reps))
        for i in range(2):
            e = next(entry)
            self._before_rep(ts, i % rotate, e, key_of(None, e))
            fn(*ts.sets[i % rotate])
        self._sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])

        def device_events(with_work: bool) -> dict:
            with profile(activities=acts) as prof:
                for i in range(reps):
                    e = next(entry)
                    self._before_rep(ts, i % rotate, e, key_of(None, e))
                    if with_work:
                        fn(*ts.sets[i % rotate])
                self._sync()
            kernels: dict[str, list] = {}
            for ev in prof.events():
                if self.cuda and "CUDA" in str(getattr(ev, "device_type", "")) and getattr(ev, "device_time", None) is not None:
                    k = kernels.setdefault(ev.name, [0.0, 0])
                    k[0] += ev.device_time / 1e3  # us -> ms
                    k[1] += 1
            return kernels

        with_work, without = device_events(True), device_events(False)
        total = (sum(v[0] for v in with_work.values()) - sum(v[0] for v in without.values())) / reps
        launches = (sum(v[1] for v in with_work.values()) - sum(v[1] for v in without.values())) / reps
        work = {k: (v[0] - without.get(k, [0.0, 0])[0]) / reps for k, v in with_work.items()
                if v[1] > without.get(k, [0.0, 0])[1]}
        return protocol.Profiled(kernels=work, kernel_ms_per_call=total, launches_per_call=launches)
