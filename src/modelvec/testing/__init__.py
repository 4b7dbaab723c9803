"""Test support that is not part of the library's path: a loopback Hub server (``modelvec.testing.localhub``).

Tests and the demo publish models on it and point ``HF_ENDPOINT`` at it; nothing in modelvec's
stages imports this package (an import-linter contract checks it).
"""
