"""The agent worker: proposers (knob search, LLM turns and tools), rule checks, compaction, the notebook,
the ledger and reports. It imports nothing of the GPU worker (gpu_worker/)."""
