"""Benchmarks of torch_cgx: ``python -m torch_cgx.bench <subcommand> [args]``."""
