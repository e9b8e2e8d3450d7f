"""What a walled candidate child may execute: Triton's compiler (its ptxas builds and the launcher's C
compiler with the programs it runs), each with the loader and the script interpreters that its execution
takes (gpu_worker.wall installs the wall that allows these and nothing else)."""

from __future__ import annotations

import glob
import os
import re
import struct


def _elf_interpreter(path: str) -> str | None:
    """The loader a dynamically linked executable names (PT_INTERP); the kernel executes it too."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                ptype, = struct.unpack_from("<I", table, i * phentsize)
                if ptype == 3:  # PT_INTERP
                    off, = struct.unpack_from("<Q", table, i * phentsize + 8)
                    size, = struct.unpack_from("<Q", table, i * phentsize + 32)
                    f.seek(off)
                    return f.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _script_programs(path: str) -> list[str]:
    """What a script the kernel executes runs in turn: its `#!` interpreter (through `env`, the program
    it names) and the executable files its text names by absolute path, as a compiler's wrapper script
    does (`exec /opt/toolchain/libexec/gcc "$@"`). Empty for a file that is not a script."""
    import shutil

    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    text = head.decode(errors="replace")
    lines = text[2:].splitlines()
    words = lines[0].split() if lines else []
    out = []
    if words:
        out.append(words[0])
        if os.path.basename(words[0]) == "env" and len(words) > 1:
            found = shutil.which(words[1])
            if found:
                out.append(found)
    for m in re.finditer(r"(?<![\w.$])(/[\w.+-]+(?:/[\w.+-]+)+)", text):
        q = m.group(1)
        if os.path.isfile(q) and os.access(q, os.X_OK):
            out.append(q)
    return out


def exec_closure(exec_files) -> list[str]:
    """The files the kernel must be let execute for `exec_files` to run: each one's real path, the ELF
    loader it names, and for a script its interpreter and the programs it names, followed transitively."""
    seen: set[str] = set()
    todo = [os.path.realpath(f) for f in exec_files]
    while todo:
        real = todo.pop()
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        interp = _elf_interpreter(real)
        if interp and os.path.exists(interp):
            todo.append(os.path.realpath(interp))
        todo += [os.path.realpath(q) for q in _script_programs(real)]
    return sorted(seen)


def c_compiler_programs() -> list[str]:
    """The C compiler Triton builds each kernel signature's launcher module with (at the kernel's first
    launch), chosen as Triton chooses it (CC, else gcc, else clang), and the programs it runs in turn
    (cc1, as, collect2, ld), asked of the compiler itself. Empty where there is no C compiler."""
    import shutil
    import subprocess

    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    cc = shutil.which(cc) if cc else None
    if not cc:
        return []
    out = [cc]
    for prog in ("cc1", "as", "collect2", "ld"):
        try:
            name = subprocess.run([cc, f"-print-prog-name={prog}"], capture_output=True, text=True,
                                  timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        path = name if os.path.isabs(name) else shutil.which(name) if name else None
        if path and os.path.isfile(path):
            out.append(path)
    return out


def compiler_binaries() -> list[str]:
    """The ptxas builds Triton ships and the one its knobs name, which it runs lazily, at a kernel's first
    launch (as it runs the launcher's C compiler: `c_compiler_programs`). What else it runs (ldconfig,
    `ptxas --version`) runs once per process, before the wall, when the child's CUDA and Triton are
    initialised."""
    out = []
    try:
        from triton import knobs

        for name in ("ptxas", "ptxas_blackwell"):
            tool = getattr(knobs.nvidia, name, None)
            path = getattr(tool, "path", None) if tool is not None else None
            if path and os.path.isfile(path):
                out.append(path)
        import triton.backends.nvidia as nvidia  # the builds Triton ships, whichever one a knob names

        out += sorted(glob.glob(os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas*")))
    except Exception as e:  # noqa: BLE001 - no NVIDIA backend: nothing to allow
        print(f"wall: no ptxas found ({type(e).__name__}: {e})", flush=True)
    return list(dict.fromkeys(p for p in out if os.path.isfile(p)))


def candidate_exec_files(cuda: bool) -> tuple[list[str], list[str]]:
    """(ptxas builds, the launcher's C compiler programs): what a candidate child may execute, Triton's
    compiler only. Empty without CUDA."""
    ptxas = compiler_binaries() if cuda else []
    return ptxas, (c_compiler_programs() if ptxas else [])
