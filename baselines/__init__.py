"""Problem registry: one folder per problem (spec, oracle, baseline adapter, starting kernel, knobs), and
problems from outside the project, a file or a folder stored by content (external/)."""
