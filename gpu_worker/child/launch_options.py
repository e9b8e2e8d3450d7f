"""Triton's compile options beyond a launch's own never reach a candidate's launch.

The rules refuse them as keywords of a call, but a launch also receives the keys of an autotuner's
`triton.Config` and a heuristic's values, which may be built at run time: an IR file (`ir_override`),
external libraries, PTX options, another architecture. Here every launch in a candidate child, Triton's
compiled one and the interpreter's, refuses them whatever way they came."""

from __future__ import annotations

from rules.host_language import LAUNCH_OPTIONS_TEXT, REFUSED_OPTIONS


def refuse_compile_options() -> None:
    """Wrap the launch entry points of this process's Triton (once)."""
    from triton.runtime.jit import JITFunction

    owners = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        owners.append(InterpretedFunction)
    except ImportError:  # a Triton without the interpreter
        pass
    for owner in owners:
        launch = owner.run
        if getattr(launch, "refuses_compile_options", False):
            continue

        def run(self, *args, _launch=launch, **kwargs):
            refused = sorted(REFUSED_OPTIONS & kwargs.keys())
            if refused:
                raise ValueError(f"launch option {', '.join(refused)}: Triton's compile options beyond a launch's "
                                 f"own ({LAUNCH_OPTIONS_TEXT}) are outside the language, however they reach the "
                                 "launch (a Config's or a heuristic's keys too)")
            return _launch(self, *args, **kwargs)

        run.refuses_compile_options = True
        owner.run = run
