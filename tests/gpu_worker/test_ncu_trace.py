"""The ncu proof's decisions on recorded-shape traces: ncu's CSV read, the trace split into calls by the
marker kernels, each refusal rule, the tolerance, which candidates are proven, and where ncu is found."""

from __future__ import annotations

import random

import pytest

from gpu_worker.ncu_trace import (Kernel, Markers, TraceError, counters_refused, find_ncu, judge_trace, ncu_command,
                                  parse_ncu_csv, profiling_taken, proof_due, source_kernel_names)
from gpu_worker.timing import crosscheck

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1UL>>"
        "(int, T2, T3)")
COPY = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)"
        "::[lambda() (instance 3)]::operator ()() const, std::array<char *, 2UL>, 4, TrivialOffsetCalculator<1, "
        "unsigned int>>(int, T1, T2, T3, T4, T5)")
RAND = ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, "
        "at::native::templates::cuda::normal_and_transform<float, float, curandStatePhilox4_32_10, "
        "at::native::normal_kernel>(at::TensorIteratorBase &, double, double, at::CUDAGeneratorImpl *)>(long, "
        "at::PhiloxCudaState, T3, T4)")
FLUSH = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>(T3)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
M = Markers.fresh("a1b2c3d4e5f6")
OWN = "canary_fast_softmax"
PID = 41207


def row(i: int, name: str, value: str, pid: int = PID, unit: str = "nsecond") -> str:
    cells = [str(i), str(pid), "python3.12", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(4096, 1, 1)",
             "NVIDIA H200", "9.0", "Command line profiler metrics", "gpu__time_duration.sum", unit, value]
    return ",".join('"' + c.replace('"', '""') + '"' for c in cells)


def trace(calls, before=None, between=None, after=None, warmup=1) -> list[tuple[str, float]]:
    """(name, ns) in launch order: the trusted prelude, OPEN, then per call the refill/flush, BEGIN, the
    call's kernels, END."""
    pre = before if before is not None else [(FILL, 1500.0), (COPY, 2100.0), (RAND, 3100.0), (FLUSH, 30000.0),
                                             (M.begin, 1100.0), (M.end, 1100.0)]
    out = list(pre) + [(M.open, 1100.0)]
    for i, c in enumerate(calls):
        out += (between or {}).get(i, [(COPY, 2100.0), (RAND, 3100.0), (FILL, 1500.0), (FLUSH, 30000.0)])
        out += [(M.begin, 1100.0)] + list(c) + [(M.end, 1100.0)]
    return out + list(after or [])


def kernels(entries, pid=PID) -> list[Kernel]:
    return [Kernel(i, pid, n, ns) for i, (n, ns) in enumerate(entries)]


def honest(n=11, ns=20000.0):
    return [[(OWN, ns)] for _ in range(n)]


def csv_text(entries) -> str:
    lines = ["==PROF== Connected to process 41207 (/usr/bin/python3.12)", HEADER]
    lines += [row(i, n, f"{ns:,.0f}") for i, (n, ns) in enumerate(entries)]
    return "\n".join(lines + ["==PROF== Disconnected from process 41207"]) + "\n"


def test_the_csv_is_read_in_launch_order_with_durations_in_nanoseconds():
    entries = trace(honest(3))
    ks = parse_ncu_csv(csv_text(entries))
    assert [k.name for k in ks] == [n for n, _ in entries]
    assert ks[0].pid == PID and ks[-1].id == len(entries) - 1
    assert ks[3].ns == 30000.0  # "30,000": ncu's thousands separator
    # rows arrive out of ID order and in other units: sorted by ID, scaled to ns
    text = "\n".join([HEADER, row(1, OWN, "2.5", unit="usecond"), row(0, FILL, "1,500")])
    ks = parse_ncu_csv(text)
    assert [(k.id, k.name, k.ns) for k in ks] == [(0, FILL, 1500.0), (1, OWN, 2500.0)]


def test_other_metrics_rows_are_ignored_and_bad_csv_is_one_error():
    other = row(0, OWN, "12").replace("gpu__time_duration.sum", "sm__cycles_elapsed.avg")
    assert parse_ncu_csv("\n".join([HEADER, other, row(0, OWN, "12")]))[0].ns == 12.0
    with pytest.raises(TraceError, match="no ncu CSV header"):
        parse_ncu_csv("==PROF== Connected\n==ERROR== something\n")
    with pytest.raises(TraceError, match="lacks"):
        parse_ncu_csv('"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(TraceError, match="row 2 unreadable"):
        parse_ncu_csv("\n".join([HEADER, row(0, OWN, "12", unit="furlongs")]))
    with pytest.raises(TraceError, match="twice"):
        parse_ncu_csv("\n".join([HEADER, row(0, OWN, "12"), row(0, OWN, "13")]))


def test_an_honest_trace_is_proven_with_the_median_per_call_figure():
    calls = honest(11)
    calls[3] = [(OWN, 90000.0)]  # one slow call: the median ignores it
    calls[0] = [(OWN, 900000.0)]  # the warm-up is not timed
    v = judge_trace(kernels(trace(calls)), M, [OWN], warmup=1, reps=10, judged_ms=0.021)
    assert v.ok, v.refusals
    assert v.kernel_ms == pytest.approx(0.02) and v.launches == 1 and v.calls == 11 and v.seen == [OWN]
    assert v.allowed_ms == crosscheck(0.021, 0.02, 1)[1]
    assert v.text().startswith("proven: ncu kernel time 0.02 ms/call vs judged 0.021 ms")
    assert v.as_dict()["ok"] is True


def test_torch_fill_and_copy_inside_a_call_count_as_its_work():
    calls = [[(FILL, 1000.0), (OWN, 20000.0), (COPY, 1000.0)] for _ in range(11)]
    v = judge_trace(kernels(trace(calls)), M, [OWN], warmup=1, reps=10, judged_ms=0.022)
    assert v.ok, v.refusals
    assert v.kernel_ms == pytest.approx(0.022) and v.launches == 3


def test_a_library_kernel_inside_a_call_is_refused_by_name_and_call():
    calls = honest(11)
    calls[5] = [(GEMM, 15000.0), (OWN, 5000.0)]
    v = judge_trace(kernels(trace(calls)), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert not v.ok
    assert any(GEMM in r and "inside call 6" in r and "neither the candidate's Triton kernel" in r for r in v.refusals)
    assert v.family == "library-kernel"


def test_a_candidate_kernel_after_the_last_call_is_refused():
    entries = trace(honest(11), after=[(OWN, 20000.0)])
    v = judge_trace(kernels(entries), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert not v.ok
    assert [r for r in v.refusals if "launched outside any call (after the last call returned)" in r and OWN in r]
    assert v.family == "lazy-output" and judge_trace(kernels(trace(honest(11))), M, [OWN], 1, 10, 0.02).family is None


def test_a_candidate_kernel_between_calls_is_refused_and_named_by_where_it_ran():
    between = {4: [(COPY, 2100.0), (OWN, 20000.0), (FLUSH, 30000.0)]}
    v = judge_trace(kernels(trace(honest(11), between=between)), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert any("outside any call (after call 4 returned)" in r for r in v.refusals), v.refusals


def test_an_unknown_kernel_outside_the_calls_is_refused_and_the_trusted_ones_are_not():
    between = {2: [(COPY, 2100.0), (GEMM, 5000.0), (FLUSH, 30000.0)]}
    v = judge_trace(kernels(trace(honest(11), between=between)), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert len(v.refusals) == 1 and GEMM in v.refusals[0] and "no trusted step's" in v.refusals[0]


def test_a_wrong_marker_count_is_refused():
    v = judge_trace(kernels(trace(honest(10))), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert not v.ok and any("20 call markers" in r and "2 x 11" in r for r in v.refusals)
    forged = [[(M.end, 1100.0), (OWN, 20000.0), (M.begin, 1100.0)]] + honest(10)
    v = judge_trace(kernels(trace(forged)), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert not v.ok and any("24 call markers" in r for r in v.refusals)
    assert any(OWN in r and "outside any call" in r for r in v.refusals)  # the work it moved out is named
    doubled = [[(M.begin, 1100.0), (OWN, 20000.0)]] + honest(10)  # an extra BEGIN inside a call
    v = judge_trace(kernels(trace(doubled)), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert any("BEGIN marker" in r and "inside call 1" in r for r in v.refusals), v.refusals
    v = judge_trace(kernels(trace(honest(11), after=[(M.end, 1100.0)])), M, [OWN], 1, 10, 0.02)
    assert any("END marker" in r and "after the last call" in r for r in v.refusals), v.refusals


def test_without_one_open_marker_the_trace_is_refused_whole():
    entries = [e for e in trace(honest(11)) if e[0] != M.open]
    v = judge_trace(kernels(entries), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert not v.ok and "OPEN marker ran 0 times" in v.refusals[-1]
    assert "no kernel at all" in judge_trace([], M, [OWN], 1, 10, 0.02).refusals[0]


def test_a_candidate_kernel_named_like_a_trusted_one_or_a_library_is_refused():
    v = judge_trace(kernels(trace(honest(11))), M, [OWN, M.begin], warmup=1, reps=10, judged_ms=0.02)
    assert any(f"candidate kernel {M.begin!r} has the name of a trusted kernel" in r for r in v.refusals)
    calls = [[(GEMM, 20000.0)] for _ in range(11)]  # a library kernel claimed as the candidate's own
    v = judge_trace(kernels(trace(calls)), M, [GEMM + "(int)", OWN], warmup=1, reps=10, judged_ms=0.02)
    assert not v.ok and any("no Triton kernel has that name" in r for r in v.refusals)


def test_the_candidates_kernels_are_read_from_its_source():
    source = """
import triton
import triton.language as tl
from triton import jit


@triton.jit
def a(x):
    pass


@jit
def b(x):
    pass


@triton.autotune(configs=[], key=[])
@triton.jit(do_not_specialize=["n"])
def c(x, n):
    pass


def d(x):
    pass


e = triton.jit(d)


def run(inputs, out):
    def helper():
        pass
"""
    assert source_kernel_names(source) == ["a", "b", "c", "d"]
    assert source_kernel_names("def run(:") == []


def test_a_kernel_time_beyond_the_tolerance_is_refused():
    v = judge_trace(kernels(trace(honest(11, ns=20000.0))), M, [OWN], warmup=1, reps=10, judged_ms=0.03)
    assert not v.ok and v.kernel_ms == pytest.approx(0.02)
    assert any("differs from the judged 0.03 ms" in r for r in v.refusals)


def test_calls_with_no_kernel_of_the_candidates_are_refused():
    calls = [[(FILL, 20000.0)] for _ in range(11)]
    v = judge_trace(kernels(trace(calls)), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert any("no kernel of the candidate's own" in r for r in v.refusals)


def test_a_kernel_from_another_process_is_refused():
    ks = kernels(trace(honest(11)))
    ks[-3] = Kernel(ks[-3].id, PID + 1, ks[-3].name, ks[-3].ns)
    v = judge_trace(ks, M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert any(f"in process {PID + 1}" in r for r in v.refusals)


def test_many_refusals_are_cut_to_a_few_and_counted():
    calls = [[(GEMM, 20000.0)] for _ in range(11)]
    v = judge_trace(kernels(trace(calls)), M, [OWN], warmup=1, reps=10, judged_ms=0.02)
    assert len(v.refusals) == 9 and v.refusals[-1].startswith("... and ")


def test_every_would_be_best_is_proven_and_about_the_share_of_the_others():
    rng = random.Random(7)
    assert proof_due(True, 0.0, rng.random)
    assert not any(proof_due(False, 0.0, rng.random) for _ in range(100))
    drawn = sum(proof_due(False, 0.1, rng.random) for _ in range(4000))
    assert 300 < drawn < 500
    assert all(proof_due(False, 1.0, rng.random) for _ in range(100))


def test_markers_are_fresh_identifiers_and_the_command_traces_a_separate_process():
    assert M.open != M.begin and all(n.startswith("marathon_proof_") for n in M.names())
    with pytest.raises(ValueError):
        Markers.fresh("x; import os")
    cmd = ncu_command("/opt/ncu", "/w/ncu.csv", ["python", "-m", "gpu_worker.ncu_proof_child", "/w/spec.json"])
    assert cmd[0] == "/opt/ncu" and cmd[-4:] == ["python", "-m", "gpu_worker.ncu_proof_child", "/w/spec.json"]
    for flag, value in (("--metrics", "gpu__time_duration.sum"), ("--clock-control", "none"),
                        ("--cache-control", "none"), ("--print-units", "base"), ("--log-file", "/w/ncu.csv"),
                        ("--print-kernel-base", "demangled")):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--csv" in cmd


def test_ncu_is_found_on_path_else_under_the_install_directory():
    assert find_ncu(lambda n: "/usr/bin/ncu", lambda p: []) == "/usr/bin/ncu"
    installs = {"/opt/nvidia/nsight-compute/*/ncu": ["/opt/nvidia/nsight-compute/2024.1.0/ncu",
                                                     "/opt/nvidia/nsight-compute/2025.2.1/ncu"]}
    assert find_ncu(lambda n: None, lambda p: installs.get(p, [])) == "/opt/nvidia/nsight-compute/2025.2.1/ncu"
    assert find_ncu(lambda n: None, lambda p: []) is None


def test_only_ncus_own_error_line_says_the_counters_are_refused():
    assert counters_refused("==PROF== Connected to process 7\n==ERROR== ERR_NVGPUCTRPERM - The user does not "
                            "have permission to access NVIDIA GPU Performance Counters on the target device 0.\n")
    # a kernel of the candidate's named so appears in a CSV row: no excuse from the proof
    assert not counters_refused(csv_text(trace([[("ERR_NVGPUCTRPERM", 20000.0)]] * 11)))
    assert not counters_refused("")


def test_only_ncus_own_error_line_says_the_profiling_resources_were_taken():
    assert profiling_taken("==ERROR== Profiling failed because a driver resource was unavailable.\n")
    # a candidate's kernel so named would otherwise have its stage run again alone, draining the device
    assert not profiling_taken(csv_text(trace([[("driver resource was unavailable", 20000.0)]] * 11)))
    assert not profiling_taken("")


def test_the_ncu_session_logs_how_long_a_holder_waited_and_held_it():
    """The phase log shows how long proofs queue for the one ncu session: a second holder waits until the
    first lets go, and each logs its wait and its hold on its own thread."""
    import threading
    import time

    from gpu_worker.ncu_trace import ncu_session
    from gpu_worker.phases import phases_begin, phases_end

    entered, logged = threading.Event(), {}

    def first():
        phases_begin()
        with ncu_session():
            entered.set()
            time.sleep(0.3)
        logged["first"] = phases_end()

    def second():
        entered.wait(5)
        phases_begin()
        with ncu_session():
            pass
        logged["second"] = phases_end()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert logged["first"]["ncu-session.held"] >= 0.3, logged
    assert logged["first"]["ncu-session.wait"] < 0.1, logged
    assert logged["second"]["ncu-session.wait"] >= 0.2, logged
    assert logged["second"]["ncu-session.held"] < 0.1, logged
