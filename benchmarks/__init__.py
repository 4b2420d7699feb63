"""Benchmarks, the demo and the emulated-hosts harness of torch_cgx; benchmarks/README.md.

Run from the repository root, each as ``python -m benchmarks.<name> [args]`` (or
``python -m benchmarks <name> [args]``; ``python -m benchmarks`` lists them). This folder is not
part of the installed package: it imports torch_cgx, and nothing in torch_cgx imports it.
"""
