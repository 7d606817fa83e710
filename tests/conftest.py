"""Shared fixtures for every test directory: the real control plane (tests/support/fixtures.py).

pytest puts tests/ on sys.path for this file, so `support` imports as a package from any test.
"""

pytest_plugins = ["support.fixtures"]
