"""Check and time the mla_decode / mla_prefill starting kernels against their baselines on one GPU.

    PYTHONUNBUFFERED=1 python3 scripts/gpu_mla.py [--parts ceil,decode,prefill] [--budget 240]

Correctness: every kernel config is run on NaN-poisoned outputs for each distribution and compared with
the fp64 oracle by rel-RMS; it passes when err <= max(tolerance_floor, tolerance_alpha * primary baseline
error) and no NaN is left. Timing: triton.testing.do_bench median (it zeroes a 256 MB buffer before every
call, so the 9.4 MB decode cache is not served from the 60 MB L2), and for decode also a CUDA graph of
ROT back-to-back calls over ROT different input sets (ROT * 9.4 MB > L2), replayed, time / call.
Full output goes to $OUT/gpu_mla.log and $OUT/gpu_mla.json (OUT defaults to /tmp/gpu_mla_out); a short
table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from baselines.problem import rel_rms  # noqa: E402
from baselines.registry import get_problem  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/gpu_mla_out"))
OUT.mkdir(parents=True, exist_ok=True)
LOG = open(OUT / "gpu_mla.log", "w")
RESULTS: dict = {"decode": [], "prefill": [], "baselines": [], "meta": {}}
T0 = time.time()
ROT = 8
PROBE_SDPA = False
PREFILL_DISTS = False

# the settings compared; P = PARTIAL_BF16, dv = SPLIT_DV
_D = dict(PARTIAL_BF16=False, SPLIT_DV=1)
DECODE_CONFIGS = [
    {**_D, **dict(BLOCK_H=16, BLOCK_N=32, NUM_SPLITS=64, num_warps=4, num_stages=2)},
    {**_D, **dict(BLOCK_H=16, BLOCK_N=32, NUM_SPLITS=64, num_warps=4, num_stages=3)},
    dict(BLOCK_H=16, BLOCK_N=32, NUM_SPLITS=64, PARTIAL_BF16=True, SPLIT_DV=1, num_warps=4, num_stages=3),
    dict(BLOCK_H=16, BLOCK_N=64, NUM_SPLITS=64, PARTIAL_BF16=True, SPLIT_DV=1, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_N=32, NUM_SPLITS=32, PARTIAL_BF16=False, SPLIT_DV=2, num_warps=4, num_stages=3),
    dict(BLOCK_H=16, BLOCK_N=32, NUM_SPLITS=32, PARTIAL_BF16=True, SPLIT_DV=2, num_warps=4, num_stages=3),
    dict(BLOCK_H=16, BLOCK_N=64, NUM_SPLITS=32, PARTIAL_BF16=True, SPLIT_DV=2, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_N=32, NUM_SPLITS=64, PARTIAL_BF16=True, SPLIT_DV=2, num_warps=4, num_stages=3),
    {**_D, **dict(BLOCK_H=64, BLOCK_N=64, NUM_SPLITS=32, num_warps=8, num_stages=2)},  # run 2's best Q4
    dict(BLOCK_H=64, BLOCK_N=64, NUM_SPLITS=32, PARTIAL_BF16=True, SPLIT_DV=1, num_warps=8, num_stages=2),
    dict(BLOCK_H=64, BLOCK_N=64, NUM_SPLITS=64, PARTIAL_BF16=True, SPLIT_DV=2, num_warps=8, num_stages=2),
    dict(BLOCK_H=64, BLOCK_N=32, NUM_SPLITS=64, PARTIAL_BF16=True, SPLIT_DV=2, num_warps=4, num_stages=2),
    dict(BLOCK_H=32, BLOCK_N=64, NUM_SPLITS=32, PARTIAL_BF16=True, SPLIT_DV=2, num_warps=8, num_stages=3),
    dict(BLOCK_H=64, BLOCK_N=64, NUM_SPLITS=16, PARTIAL_BF16=True, SPLIT_DV=1, num_warps=8, num_stages=2),
]
PREFILL_CONFIGS = [
    dict(BLOCK_M=64, BLOCK_N=64, SPLIT_DV=1, num_warps=8, num_stages=2),  # default (runs 1-2 best)
    dict(BLOCK_M=64, BLOCK_N=32, SPLIT_DV=2, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_N=64, SPLIT_DV=2, num_warps=8, num_stages=1),
]


class _Skip:
    """Stands in for a Triton kernel so that run() launches only the other one (phase timing)."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


def decode_phases(K, sets, outs):
    """Graph times (ms/call) of the default config: whole, kernel 1 only, combine only, L2-hot (one set)."""
    calls = [(lambda i=i: K.run(sets[i], {"o": outs[i]})) for i in range(ROT)]
    res = {"whole": graph_time(calls)}
    res["l2_hot"] = graph_time([(lambda: K.run(sets[0], {"o": outs[0]})) for _ in range(ROT)])
    orig = K._mla_decode_combine
    K._mla_decode_combine = _Skip()
    try:
        res["partial_only"] = graph_time(calls)
    finally:
        K._mla_decode_combine = orig
    orig = K._mla_decode_partial
    K._mla_decode_partial = _Skip()
    try:
        res["combine_only"] = graph_time(calls)
    finally:
        K._mla_decode_partial = orig
    return res


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


def save():
    (OUT / "gpu_mla.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def left(budget):
    return budget - (time.time() - T0)


def short_knobs(k):
    ab = {"BLOCK_H": "H", "BLOCK_N": "N", "NUM_SPLITS": "S", "BLOCK_M": "M", "SPLIT_DV": "dv",
          "num_warps": "w", "num_stages": "st"}
    return " ".join(f"{ab.get(n, n)}{v}" for n, v in k.items())


def kernel_report(handle):
    try:
        return {"regs": handle.n_regs, "spills": handle.n_spills, "smem": handle.metadata.shared}
    except Exception:  # noqa: BLE001
        return {}


def graph_time(calls, reps=20):
    """calls: list of zero-arg callables, captured back-to-back into one graph; ms per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / (reps * len(calls)))
    return sorted(ts)[len(ts) // 2]


def ceilings():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = do_bench(lambda: y.copy_(x), warmup=20, rep=100, return_mode="median")
    bw = 2 * x.numel() / (t * 1e-3)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    tm = do_bench(lambda: a @ b, warmup=20, rep=200, return_mode="median")
    fl = 2 * 8192**3 / (tm * 1e-3)
    RESULTS["meta"].update(copy_Bps=bw, mm_flops=fl)
    log(f"ceilings: copy {bw / 1e12:.2f} TB/s (1 GiB, read+write), bf16 mm 8192^3 {fl / 1e12:.0f} TFLOP/s")
    del x, y, a, b
    torch.cuda.empty_cache()


def decode(budget):
    import baselines.mla_decode.kernel as K

    P = get_problem("mla_decode")
    defaults = dict(K.KNOBS)
    for shape in P.shapes:
        sets = [P.make_inputs(shape, "unit", 1000 + i, "cuda") for i in range(ROT)]
        spec = P.output_specs(shape)["o"]
        outs = [torch.empty(spec.shape, dtype=torch.bfloat16, device="cuda") for _ in range(ROT)]
        checks = {}
        for dist in P.distributions:
            inp = P.make_inputs(shape, dist, 7, "cuda")
            ref = P.oracle(inp)["o"]
            berr = {n: rel_rms(ref, f(inp)["o"]) for n, f in P.baselines().items()}
            tol = max(P.tolerance_floor, P.tolerance_alpha * next(iter(berr.values())))
            checks[dist] = (inp, ref, tol, berr)
            log(f"[decode {shape.name}] {dist}: baseline errs {berr} -> tol {tol:.2e}")
        floor = P.floor_ms(shape, RESULTS["meta"].get("copy_Bps", 4.27e12), RESULTS["meta"].get("mm_flops", 687e12))
        for name, f in P.baselines().items():
            it = [0]

            def fb():
                f(sets[it[0] % ROT])
                it[0] += 1

            t = do_bench(fb, warmup=25, rep=100, return_mode="median")
            tg = graph_time([(lambda s=s: f(s)) for s in sets])
            RESULTS["baselines"].append(dict(problem="decode", shape=shape.name, name=name, ms=t, graph_ms=tg))
            log(f"[decode {shape.name}] baseline {name}: do_bench {t * 1e3:.1f} us, graph {tg * 1e3:.1f} us")
        for knobs in DECODE_CONFIGS:
            if left(budget) < 0:
                log("budget spent; skipping the remaining decode configs")
                break
            K.KNOBS = {**defaults, **knobs}
            row = dict(problem="decode", shape=shape.name, knobs=knobs, floor_ms=floor)
            try:
                errs, ok = {}, True
                for dist, (inp, ref, tol, _) in checks.items():
                    o = torch.full(spec.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
                    K.run(inp, {"o": o})
                    torch.cuda.synchronize()
                    e = rel_rms(ref, o)
                    errs[dist] = e
                    ok = ok and not math.isnan(e) and e <= tol
                row.update(errs=errs, ok=ok, **{f"k1_{k}": v for k, v in kernel_report(K.LAUNCHED["partial"]).items()})
                it = [0]

                def fk():
                    i = it[0] % ROT
                    K.run(sets[i], {"o": outs[i]})
                    it[0] += 1

                row["ms"] = do_bench(fk, warmup=25, rep=100, return_mode="median")
                row["graph_ms"] = graph_time([(lambda i=i: K.run(sets[i], {"o": outs[i]})) for i in range(ROT)])
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                LOG.write(traceback.format_exc())
            RESULTS["decode"].append(row)
            log(f"[decode {shape.name}] {short_knobs(knobs)}: " + json.dumps({k: v for k, v in row.items() if k not in ("problem", "shape", "knobs")}))
            save()
        K.KNOBS = dict(defaults)
        try:
            ph = decode_phases(K, sets, outs)
            RESULTS["meta"][f"decode_phases {shape.name}"] = ph
            log(f"[decode {shape.name}] phases (graph, ms/call) of {short_knobs(defaults)}: {json.dumps(ph)}")
        except Exception as e:  # noqa: BLE001
            log(f"[decode {shape.name}] phase timing failed: {type(e).__name__}: {e}")
        del sets, outs, checks
        torch.cuda.empty_cache()
    K.KNOBS = defaults


def prefill(budget):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import baselines.mla_prefill.kernel as K

    P = get_problem("mla_prefill")
    defaults = dict(K.KNOBS)
    shape = P.shapes[0]
    spec = P.output_specs(shape)["o"]
    inp = P.make_inputs(shape, "unit", 7, "cuda")
    t = time.time()
    ref = P.oracle(inp)["o"]
    torch.cuda.synchronize()
    log(f"[prefill] fp64 oracle: {time.time() - t:.2f} s")
    floor = P.floor_ms(shape, RESULTS["meta"].get("copy_Bps", 4.27e12), RESULTS["meta"].get("mm_flops", 687e12))
    berr = {}
    for name, f in P.baselines().items():
        try:
            berr[name] = rel_rms(ref, f(inp)["o"])
            ms = do_bench(lambda: f(inp), warmup=1, rep=300, return_mode="median")
            RESULTS["baselines"].append(dict(problem="prefill", shape=shape.name, name=name, ms=ms, err=berr[name]))
            log(f"[prefill] baseline {name}: {ms:.2f} ms, err {berr[name]:.2e}")
        except Exception as e:  # noqa: BLE001
            log(f"[prefill] baseline {name} failed: {type(e).__name__}: {str(e)[:300]}")
    # which SDPA backends accept d_k = 576 != d_v = 512 (one timed call each)
    N, H, D = inp["q"].shape
    qh = inp["q"].permute(1, 0, 2).unsqueeze(0)
    k = inp["kv_cache"].view(1, 1, N, D).expand(1, H, N, D)
    v = inp["kv_cache"][:, :512].unsqueeze(0).unsqueeze(0).expand(1, H, N, 512)
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        if not PROBE_SDPA or (left(budget) < 60 and be == SDPBackend.MATH):
            break
        try:
            with sdpa_kernel([be]):
                F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=1 / math.sqrt(192))
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=1 / math.sqrt(192))
                b.record()
                torch.cuda.synchronize()
            log(f"[prefill] sdpa backend {be.name}: works, one call {a.elapsed_time(b):.2f} ms")
            RESULTS["meta"][f"sdpa_{be.name}"] = a.elapsed_time(b)
        except Exception as e:  # noqa: BLE001
            log(f"[prefill] sdpa backend {be.name}: fails ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
            RESULTS["meta"][f"sdpa_{be.name}"] = "fails"
        torch.cuda.empty_cache()
    tol = max(P.tolerance_floor, P.tolerance_alpha * berr.get("torch-ref", float("nan")))
    log(f"[prefill] tol {tol:.2e}; floor {floor:.2f} ms")
    o = torch.empty(spec.shape, dtype=torch.bfloat16, device="cuda")
    for knobs in PREFILL_CONFIGS:
        if left(budget) < 0:
            log("budget spent; skipping the remaining prefill configs")
            break
        K.KNOBS = {**defaults, **knobs}
        row = dict(problem="prefill", shape=shape.name, knobs=knobs, floor_ms=floor)
        try:
            o.fill_(float("nan"))
            t = time.time()
            K.run(inp, {"o": o})
            torch.cuda.synchronize()
            row["first_call_s"] = time.time() - t
            e = rel_rms(ref, o)
            row.update(err=e, ok=(not math.isnan(e)) and e <= tol, **kernel_report(K.LAUNCHED["fwd"]))
            if PREFILL_DISTS and knobs is PREFILL_CONFIGS[0]:
                for dist in P.distributions[1:]:
                    inp2 = P.make_inputs(shape, dist, 8, "cuda")
                    ref2 = P.oracle(inp2)["o"]
                    b2 = rel_rms(ref2, next(iter(P.baselines().values()))(inp2)["o"])
                    o.fill_(float("nan"))
                    K.run(inp2, {"o": o})
                    e2 = rel_rms(ref2, o)
                    row[f"err_{dist}"] = e2
                    row[f"base_err_{dist}"] = b2
                    row["ok"] = row["ok"] and (not math.isnan(e2)) and e2 <= max(P.tolerance_floor, P.tolerance_alpha * b2)
                    del inp2, ref2
                torch.cuda.empty_cache()
            row["ms"] = do_bench(lambda: K.run(inp, {"o": o}), warmup=1, rep=200, return_mode="median")
            row["TFLOPs"] = P.flops(shape) / (row["ms"] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            LOG.write(traceback.format_exc())
        RESULTS["prefill"].append(row)
        log(f"[prefill] {short_knobs(knobs)}: " + json.dumps({k: v for k, v in row.items() if k not in ("problem", "shape", "knobs")}))
        save()
    K.KNOBS = defaults


def table():
    log("\n=== summary (ms; decode: do_bench flushed / graph rotating) ===")
    for b in RESULTS["baselines"]:
        g = f" / {b['graph_ms']:.4f}" if "graph_ms" in b else ""
        log(f"BASE {b['problem']:7s} {b['shape']:20s} {b['name']:15s} {b['ms']:.4f}{g}")
    for r in RESULTS["decode"] + RESULTS["prefill"]:
        if "error" in r:
            log(f"KERN {r['problem']:7s} {r['shape']:20s} {short_knobs(r['knobs']):28s} ERROR {r['error'][:90]}")
            continue
        err = max(r["errs"].values()) if "errs" in r else r.get("err")
        g = f" / {r['graph_ms']:.4f}" if "graph_ms" in r else ""
        res = f"r{r.get('k1_regs', r.get('regs'))} sp{r.get('k1_spills', r.get('spills'))}"
        log(f"KERN {r['problem']:7s} {r['shape']:20s} {short_knobs(r['knobs']):28s} {r.get('ms', float('nan')):.4f}{g}"
            f"  err {err:.1e} ok={r.get('ok')} {res} floor {r['floor_ms']:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="ceil,decode,prefill")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; configs after this are skipped")
    ap.add_argument("--probe-sdpa", action="store_true", help="try each SDPA backend once on the prefill")
    ap.add_argument("--prefill-dists", action="store_true", help="check every distribution for the first prefill config")
    args = ap.parse_args()
    ap_dists = "--prefill-dists" in sys.argv
    global PROBE_SDPA, PREFILL_DISTS
    PROBE_SDPA = args.probe_sdpa
    PREFILL_DISTS = ap_dists
    RESULTS["meta"].update(torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name(),
                           cuda=torch.version.cuda, sms=torch.cuda.get_device_properties(0).multi_processor_count)
    log(json.dumps(RESULTS["meta"]))
    import baselines.mla_decode.baseline as B
    a = torch.randn(64, 576, device="cuda", dtype=torch.bfloat16)
    B.mm_fp32_out(a, a.t())
    RESULTS["meta"]["mm_out_dtype_fp32"] = B.MM_OUT_DTYPE.get("cuda")
    log(f"torch.mm(out_dtype=float32) on bf16 works: {B.MM_OUT_DTYPE.get('cuda')}")
    parts = args.parts.split(",")
    if "ceil" in parts:
        ceilings()
    if "decode" in parts:
        decode(args.budget * (0.5 if "prefill" in parts else 1.0))
    if "prefill" in parts:
        prefill(args.budget)
    table()
    save()
    log(f"total {time.time() - T0:.1f} s")


if __name__ == "__main__":
    main()
