"""Test, benchmark and demo support: a real Kubernetes control plane and tools around it.

Not part of the installed package. See README.md here for how to use the fixtures.
"""
