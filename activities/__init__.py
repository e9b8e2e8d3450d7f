"""Activities of the agent worker: proposers, rule checks, compaction, the artifact store."""
