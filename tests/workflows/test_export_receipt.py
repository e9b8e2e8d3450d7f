"""The exported receipt's text (cli.export.receipt_markdown), from a receipt as `receipt_of` builds it."""

from __future__ import annotations

from cli.export import receipt_markdown


def _receipt(**measured) -> dict:
    return {"run_id": "r1", "problem": {"key": "kda", "kind": "built-in", "source_sha256": "ab"},
            "kernel": {"candidate_id": "c1", "iteration": 3, "source_key": "k", "source_sha256": "cd"},
            "best": {"speedup": 1.1, "time_ms": 2.0, "baseline_ms": 2.2, "interpreter": False,
                     "speedup_ci": [1.05, 1.15], "deciding_distribution": "strong", "rel_err": 3e-3},
            "measured_on": {"device": "NVIDIA H200", "driver": "580", "clocks": "", "torch": "2.11",
                            "triton": "3.6.0", "mode": "cuda-graph", "repetitions": 90, "spread": "",
                            **measured},
            "verify_command": "marathon verify kda kernel.py"}


def test_the_receipt_says_what_the_baseline_ran_with_where_that_was_recorded():
    text = receipt_markdown(_receipt(baseline_env="FLA_FLASH_KDA=0; autotune=37 shipped choices from X.json"))
    assert "- the baseline ran with: FLA_FLASH_KDA=0; autotune=37 shipped choices from X.json" in text
    assert "1.1x (95% CI 1.05-1.15)" in text and "measured on: NVIDIA H200" in text
    assert "baseline ran with" not in receipt_markdown(_receipt(baseline_env=""))
    assert "baseline ran with" not in receipt_markdown(_receipt())  # a receipt recorded before the field
