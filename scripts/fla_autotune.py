"""FLA's autotuning choices for KDA on this GPU: captured from a process that autotunes, or checked in a
fresh process seeded with them (baselines.autotune_choices). Both start from an empty Triton cache of their
own, so that neither reads a choice from disk, and time each listed shape's first call (the autotuning, or
the chosen configs' compiles alone) and a second call.

    python scripts/fla_autotune.py capture [--out PATH] [--report R.json]   # default: the shipped file
    python scripts/fla_autotune.py check PATH [--report R2.json] [--against R.json]

`capture` writes the document after each shape, so a run cut short keeps what it finished. `check` names
the autotuners that benchmarked anyway (none, where the document holds every key) and, with `--against`, says
whether each shape's outputs are bitwise those of the capture (the same configs, so the same arithmetic).
Needs a GPU and fla.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _digest(out: dict) -> str:
    """The outputs' bits, hashed."""
    import torch

    h = hashlib.sha256()
    for name in sorted(out):
        h.update(name.encode() + out[name].detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _timed(fn, inputs) -> tuple[float, dict]:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(inputs)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["capture", "check"])
    ap.add_argument("path", nargs="?", help="check: the choices document")
    ap.add_argument("--out", help="capture: where the document goes (default: the shipped file for this GPU)")
    ap.add_argument("--report", help="a JSON report of the per-shape times and output digests")
    ap.add_argument("--against", help="check: a capture's report, to compare the outputs with")
    a = ap.parse_args(argv)
    if (a.mode == "check") != bool(a.path):
        ap.error("check takes the document's path; capture takes none (--out)")
    if a.against and a.mode != "check":
        ap.error("--against is for check")
    for given in (a.path, a.against):
        if given and not Path(given).is_file():
            ap.error(f"no such file: {given}")
    cache = tempfile.TemporaryDirectory(prefix="fla-autotune-")  # removed when the script exits, refused or not
    os.environ["TRITON_CACHE_DIR"] = cache.name  # before triton loads
    os.environ.setdefault("FLA_FLASH_KDA", "0")  # as the adapter sets it, before FLA loads (seeding loads it)

    import torch

    if not torch.cuda.is_available():
        ap.error("needs a GPU: the choices are what FLA's autotuner measures on one")
    from baselines import autotune_choices as choices
    from baselines.kda import baseline
    from baselines.registry import get_problem

    versions = baseline.fla_versions()
    out_path = Path(a.out or baseline.CHOICES_DIR / choices.gpu_file_name(versions["gpu"]))
    against = json.loads(Path(a.against).read_text())["shapes"] if a.against else {}
    if a.mode == "check":
        print(baseline.seed_shipped_choices(Path(a.path)), flush=True)
    kda = get_problem("kda")
    report: dict = {"mode": a.mode, "versions": versions, "shapes": {}}
    capture = a.mode == "capture"

    def run(x):
        return baseline.fla_chunk_kda(x, shipped_choices=not capture)

    for shape in kda.shapes:
        inputs = kda.make_inputs(shape, kda.distributions[0], 0, "cuda")
        first, out = _timed(run, inputs)
        second, _ = _timed(run, inputs)
        row = {"first_s": round(first, 2), "second_s": round(second, 4), "digest": _digest(out)}
        if shape.name in against:
            row["same_outputs"] = against[shape.name]["digest"] == row["digest"]
        report["shapes"][shape.name] = row
        if capture:
            doc = choices.capture("fla", versions, note="python scripts/fla_autotune.py capture; shapes: "
                                  + ", ".join(report["shapes"]))
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        tuners = choices.autotuners("fla")
        report["benchmarked"] = sorted(n for n, t in tuners.items() if hasattr(t, "bench_time"))
        report["autotuners_called"] = sum(1 for t in tuners.values() if t.cache)
        if a.report:  # after each shape too: a run cut short keeps what it measured
            Path(a.report).write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps({shape.name: row}), flush=True)
        del inputs, out
    print(json.dumps({k: v for k, v in report.items() if k != "shapes"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
