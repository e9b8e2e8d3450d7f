"""How a benchmark's figures are decided: the timing mode, the statistics per input distribution, the
worst-over-distributions verdict, and the profiler cross-check's threshold. Plain functions, no torch:
the worker process calls them, the children only measure.

The judged figure is device time: the interval between two events recorded in stream order around the
work, with the host far ahead of the device, so host launch latency never lies inside it. Host latency
of a synchronous call is measured on its own and reported beside the speedup, never inside it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: both sides captured as CUDA graphs: each repetition replays one graph over a rotated input set
GRAPH = "cuda-graph"
#: a side does not capture: eager calls queued back to back behind a device-side wait, one sync at the end
BACK_TO_BACK = "back-to-back"
#: profiler kernel time per call and judged device time agree within this fraction ...
CROSSCHECK_REL = 0.05
#: ... or within this many milliseconds, whichever is larger ...
CROSSCHECK_ABS_MS = 0.003
#: ... plus this much per launch: the device's dispatch of each kernel (after the start event, between the
#: kernels of a graph or a stream), which lies in the judged interval but in no kernel's profiled duration
DISPATCH_MS = 0.001


def choose_mode(captured: list[bool]) -> str:
    """Every side of a comparison is timed the same way: graph replay only if all of them captured."""
    return GRAPH if captured and all(captured) else BACK_TO_BACK


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        return math.nan
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bootstrap_ratio_ci(base: list[float], cand: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of median(base) / median(cand) (the speedup)."""
    rng = np.random.default_rng(seed)
    b = np.asarray(base, dtype=float)
    c = np.asarray(cand, dtype=float)
    bi = rng.integers(0, len(b), size=(n, len(b)))
    ci = rng.integers(0, len(c), size=(n, len(c)))
    ratios = np.median(b[bi], axis=1) / np.median(c[ci], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


#: samples a side before the interval may end a candidate's timing: one block of 20 repetitions on CUDA
EARLY_STOP_SAMPLES = 15


def clearly_slower(best: list[float], cand: list[float], min_samples: int = EARLY_STOP_SAMPLES) -> bool:
    """Whether the timing so far already shows the candidate slower than the current best: the 95% interval
    of median(best) / median(candidate) lies wholly below 1, on at least `min_samples` samples a side."""
    if not best or min(len(best), len(cand)) < min_samples:
        return False
    return bootstrap_ratio_ci(best, cand)[1] < 1.0


def another_block(blocks_done: int, best: list[float], cand: list[float], decisive: bool = True) -> bool:
    """Whether a distribution's timing goes on to another block: the first always; then, on the decisive
    distribution (the one where the best is slowest against the baseline, see `decisive_dist`), only while
    the samples do not show the candidate clearly slower than the best there. Slower than the best on
    another distribution decides nothing: the worst speedup is what is compared."""
    return blocks_done == 0 or not (decisive and clearly_slower(best, cand))


def shown_slower(figures: DistributionFigures, decisive: bool = True) -> bool:
    """Whether a timed decisive distribution shows the candidate clearly slower than the best there (its
    interval against the best wholly below 1): its worst speedup is then below the best's, so the
    distributions after it are not timed."""
    ci = figures.vs_best_ci
    return decisive and ci is not None and ci[1] < 1.0


def decisive_dist(distributions: list[str], best_deciding: str | None) -> str | None:
    """The distribution that can end a candidate's timing early: where the best's worst speedup was
    measured (timed first), or the only one. None: every distribution is timed in full."""
    if best_deciding in distributions:
        return best_deciding
    return distributions[0] if len(distributions) == 1 else None


@dataclass
class DistributionFigures:
    """One distribution's figures from its device-time samples (ms) and host latencies (ms); the harness
    adds how it was timed (mode, blocks, captures) and what the timed outputs' checks found."""

    dist: str
    time_ms: float
    baseline_ms: float
    speedup: float
    speedup_ci: tuple[float, float]
    samples: int
    iqr_ms: tuple[float, float]
    baseline_iqr_ms: tuple[float, float]
    host_ms: float | None
    baseline_host_ms: float | None
    samples_ms: tuple[list[float], list[float], list[float]]  # candidate, baseline, best (empty: no best)
    best_time_ms: float | None = None
    vs_best_ci: tuple[float, float] | None = None
    mode: str = ""
    blocks: int = 0
    planned_blocks: int = 0
    captures: dict[str, bool] = field(default_factory=dict)
    timed_outputs: str = ""


def distribution_figures(dist: str, cand: list[float], base: list[float], best: list[float] | None,
                         cand_host: list[float], base_host: list[float]) -> DistributionFigures:
    """One distribution's figures from its device-time samples (ms) and its host latencies (ms)."""
    t, b = median(cand), median(base)
    return DistributionFigures(
        dist=dist, time_ms=t, baseline_ms=b, speedup=b / t if t > 0 else math.nan,
        speedup_ci=bootstrap_ratio_ci(base, cand), samples=len(cand),
        iqr_ms=(quantile(cand, .25), quantile(cand, .75)), baseline_iqr_ms=(quantile(base, .25), quantile(base, .75)),
        host_ms=median(cand_host) if cand_host else None,
        baseline_host_ms=median(base_host) if base_host else None,
        samples_ms=(list(cand), list(base), list(best or [])),
        best_time_ms=median(best) if best else None, vs_best_ci=bootstrap_ratio_ci(best, cand) if best else None)


def worst_speedup_ratio_ci(per_dist: list[DistributionFigures], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the candidate's worst speedup over the best's worst speedup,
    both against the baseline timed beside them in the same benchmark: min_d base_d / cand_d over
    min_d base_d / best_d, every distribution's three sample sets resampled together. On one distribution
    it is median(best) / median(candidate)."""
    rng = np.random.default_rng(seed)
    worst_c = np.full(n, np.inf)
    worst_b = np.full(n, np.inf)
    for d in per_dist:
        c, b, k = (np.asarray(x, dtype=float) for x in d.samples_ms)
        mc = np.median(c[rng.integers(0, len(c), size=(n, len(c)))], axis=1)
        mb = np.median(b[rng.integers(0, len(b), size=(n, len(b)))], axis=1)
        mk = np.median(k[rng.integers(0, len(k), size=(n, len(k)))], axis=1)
        worst_c = np.minimum(worst_c, mb / mc)
        worst_b = np.minimum(worst_b, mb / mk)
    lo, hi = np.percentile(worst_c / worst_b, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Verdict:
    """The benchmark's verdict over distributions (see `decide`)."""

    worst: DistributionFigures  # the distribution whose speedup decides
    speedup: float
    speedup_ci: tuple[float, float]
    geomean_speedup: float
    vs_best_ci: tuple[float, float] | None  # the worst speedup over the best's; None without a best


def decide(per_dist: list[DistributionFigures]) -> Verdict:
    """The verdict over distributions: the worst speedup decides; its interval is the conservative one
    for a minimum (the lowest lower bound and the lowest upper bound over distributions), so a kernel
    fast only on easy inputs neither wins nor is crowned. Against the best, what acceptance reads is the
    interval of worst speedup over the best's worst speedup (`worst_speedup_ratio_ci`): a kernel that
    trades speed on an easy distribution for speed on the deciding one can be crowned. The geometric mean
    is reported beside it."""
    if not per_dist:
        raise ValueError("no distribution was timed")
    worst = min(per_dist, key=lambda d: d.speedup)
    speedups = [d.speedup for d in per_dist]
    return Verdict(
        worst=worst, speedup=worst.speedup,
        speedup_ci=(min(d.speedup_ci[0] for d in per_dist), min(d.speedup_ci[1] for d in per_dist)),
        geomean_speedup=float(math.exp(sum(math.log(s) for s in speedups) / len(speedups)))
        if all(s > 0 for s in speedups) else math.nan,
        vs_best_ci=worst_speedup_ratio_ci(per_dist) if all(d.vs_best_ci for d in per_dist) else None)


def crosscheck(judged_ms: float, kernel_ms: float, launches: float = 1.0) -> tuple[bool, float]:
    """Whether profiler (CUPTI) kernel time per call agrees with the judged device time: within
    CROSSCHECK_REL of it or CROSSCHECK_ABS_MS, whichever is larger, plus DISPATCH_MS per launch. Returns
    (ok, allowed gap in ms)."""
    allowed = max(CROSSCHECK_REL * judged_ms, CROSSCHECK_ABS_MS) + DISPATCH_MS * max(launches, 1.0)
    return abs(kernel_ms - judged_ms) <= allowed, allowed


#: torch's kernels for the ops a candidate's torch may run (fill and copy/cast; ALLOWED_ATEN_OPS), by a
#: prefix no Triton kernel's name can have and the functor the op instantiates
TORCH_FILL_COPY_KERNELS = (("void at::native::", "FillFunctor"), ("void at::native::", "direct_copy_kernel_cuda"),
                           ("Memset (Device)", ""), ("Memcpy DtoD", ""))


def is_torch_fill_or_copy(kernel: str) -> bool:
    return any(kernel.startswith(prefix) and marker in kernel for prefix, marker in TORCH_FILL_COPY_KERNELS)


def foreign_kernels(work_kernels, candidate_kernels) -> list[str]:
    """The kernels the work launched (those the trace shows more often with the work than without it, so
    never the harness's own flush, refill, poison or fingerprint) that are neither one of the candidate's
    own Triton kernels, by exact name, nor torch's fill or copy that the run-time guard allows: a library's
    or torch's kernel there did part of the work."""
    own = set(candidate_kernels)
    return sorted(k for k in work_kernels if k not in own and not is_torch_fill_or_copy(k))


#: The judge against an independent device-time measurement (scripts/device_time_check.py): its speedup may
#: read higher by at most this fraction ...
AGREE_ABOVE = 0.02
#: ... and lower by at most what the fresh-value refill costs the next kernel, for kernels under
#: SHORT_KERNEL_MS: the check replays unchanged copies back to back, where every judged repetition follows
#: the refill, the poison and the flush of its own buffers. The cost measured on one H200 at decode's
#: shapes: at most 1.7 us (docs/results.md, Cross-examination); longer kernels get the figures' tolerance.
REFILL_GAP_MS = 0.0017
SHORT_KERNEL_MS = 0.05


def agreement(judged_speedup: float, check_speedup: float, check_ms: float, tolerance: float = 0.03
              ) -> tuple[bool, float, float]:
    """Whether the judge's speedup agrees with an independent measurement's: at most AGREE_ABOVE above it,
    and below it by at most the refill's cost on a kernel of `check_ms` under SHORT_KERNEL_MS (the check's
    speedup with REFILL_GAP_MS added to the kernel), else by at most `tolerance`. Returns (ok, low, high)."""
    high = check_speedup * (1 + AGREE_ABOVE)
    if check_ms < SHORT_KERNEL_MS:
        low = check_speedup * check_ms / (check_ms + REFILL_GAP_MS)
    else:
        low = check_speedup / (1 + tolerance)
    return low <= judged_speedup <= high, low, high


def cushion_ms(host_per_rep_ms: float, reps: int, device_floor_ms: float = 0.0, cap_ms: float = 400.0) -> float:
    """How long the device waits before a back-to-back block: long enough that the host, queueing one
    repetition in `host_per_rep_ms` (taken 1.5x), stays ahead of the device through the whole block, so
    no host time falls between a repetition's events. The device spends at least `device_floor_ms` on
    each repetition (a lower bound: that side's fastest timed work so far; 0 when unknown), so the host
    need only be ahead by the first repetition plus what it loses on each later one."""
    h = 1.5 * max(host_per_rep_ms, 0.0)
    behind = max(h - max(device_floor_ms, 0.0), 0.0)
    return min(cap_ms, h + max(reps - 1, 0) * behind + 1.0)


def canary_host_work(busy: dict, plain: dict) -> tuple[bool, float]:
    """Timing canary: a candidate doing the plain canary's device work plus host-side busy work before it
    launches must measure 0.97-1.03x the plain one (host work is not device time)."""
    ratio = plain["time_ms"] / busy["time_ms"]
    return 0.97 <= ratio <= 1.03, ratio


def canary_launch_count(one: dict, many: dict, extra_launches: int) -> tuple[bool, float, float]:
    """Timing canary: one kernel's work as many launches against one launch; their judged times may
    differ by no more than their profiler kernel times do, plus the cross-check's allowance (which counts
    the device's dispatch of each extra launch)."""
    judged = many["time_ms"] - one["time_ms"]
    kernels = many["kernel_ms"] - one["kernel_ms"]
    _, allowed = crosscheck(one["time_ms"], one["kernel_ms"], launches=1 + extra_launches)
    return abs(judged - kernels) <= allowed, judged, kernels
