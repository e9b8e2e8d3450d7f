"""The compile stage (gpu_worker.harness.compile): the compiler's error handed back as it is, and the SASS
scan of the compiled kernels in its report."""

from __future__ import annotations

import os

from tests.gpu_worker.harnesses import kernel, req


def test_compile_error_returned_verbatim(ev, store):
    c = ev.compile(req(store, kernel("syntax_error_kernel")))
    assert not c.ok
    assert "arange" in c.error or "constexpr" in c.error, c.error
    assert c.log_key


def test_sass_scan_reads_every_kernel(ev, tmp_path, monkeypatch):
    # cuobjdump stands in as a script here (no CUDA toolkit on CI); the scan runs one per kernel, side by side
    tool = tmp_path / "cuobjdump"
    tool.write_text('#!/bin/sh\ncase "$2" in *a.cubin) echo "  HGMMA.64x128x16.F32.BF16";; '
                    '*) echo "  UTMALDG.2D [UR4], [UR6]";; esac\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for n in ("a", "b"):
        (tmp_path / f"{n}.cubin").write_bytes(b"\0")
    from gpu_worker.sass import scan_sass

    out = scan_sass([{"name": "ka", "cubin_path": str(tmp_path / "a.cubin")},
                     {"name": "kb", "cubin_path": str(tmp_path / "b.cubin")},
                     {"name": "gone", "cubin_path": str(tmp_path / "missing.cubin")}])
    assert out["hgmma"] and out["tma"]
    assert "SASS ka: HGMMA=True TMA=False" in out["text"] and "SASS kb: HGMMA=False TMA=True" in out["text"]
