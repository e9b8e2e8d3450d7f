"""The workflow with a timer slipped in before the loop: a typical careless change that must fail
replay. Kept in its own module because the workflow sandbox re-imports it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.optimization import KernelOptimization


@workflow.defn(name="KernelOptimization")
class ReorderedLoop(KernelOptimization):
    @workflow.run
    async def run(self, spec: Any):
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(spec)
