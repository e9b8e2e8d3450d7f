"""Problem registry: one folder per problem (spec, oracle, baseline adapter, starting kernel, knobs)."""
