"""The device's schedule: who goes on a GPU worker's device and when (the owner and the dispatcher, over
the decisions of `turns`), the scheduling of many evaluations around the protocol, and the schedule's
simulator with its per-stage costs."""
