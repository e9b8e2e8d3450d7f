"""What the compiled kernels' SASS says: HGMMA (wgmma) and TMA instructions, read with cuobjdump where it is
installed. Host work on the compile stage's cubins, outside every GPU hold."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor


def scan_sass(kernels: list[dict]) -> dict:
    """SASS via cuobjdump where available: HGMMA (wgmma) and UTMA* (TMA) instructions."""
    exe = shutil.which("cuobjdump")
    out = {"hgmma": False, "tma": False, "text": ""}
    if not exe:
        return out

    def disassemble(path):  # one cuobjdump per kernel, side by side: each takes about a second
        try:
            return subprocess.run([exe, "-sass", path], capture_output=True, text=True, timeout=60).stdout
        except Exception:  # noqa: BLE001
            return None

    found = [k for k in kernels if k.get("cubin_path") and os.path.exists(k["cubin_path"])]
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(found)))) as pool:
        listings = list(pool.map(disassemble, [k["cubin_path"] for k in found]))
    texts = []
    for k, s in zip(found, listings):
        if s is None:
            continue
        h = "HGMMA" in s
        t = "UTMALDG" in s or "UTMASTG" in s or "UBLKCP" in s
        out["hgmma"] |= h
        out["tma"] |= t
        texts.append(f"SASS {k.get('name')}: HGMMA={h} TMA={t} instructions={s.count(chr(10))}")
    out["text"] = "\n".join(texts)
    return out
