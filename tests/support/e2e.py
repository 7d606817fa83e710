"""Settings of the e2e tier, from the environment.

Without PD_E2E_KUBECONFIG the tier runs against the test run's own control plane (tests/support:
kube-apiserver, etcd, controller-manager, scheduler, kwok NPU nodes) with the operator installed
by `helm install`, as a user would. PD_E2E_KUBECONFIG selects an external cluster instead.
"""

from __future__ import annotations

import os

KUBECONFIG = os.environ.get("PD_E2E_KUBECONFIG")
MODE = os.environ.get("PD_E2E_OPERATOR", "local") if KUBECONFIG else "installed"
"""installed: an operator with its webhook already serves the cluster (the chart's); local: the
tests run `pd-operator run` here against it, watching only the test namespace."""
NPU = os.environ.get("PD_E2E_NPU") == "1" or not KUBECONFIG
"""Whether serving pods can become Ready: NPU nodes, or kwok's fake ones on the launched cluster."""
WAIT_S = 180.0
"""How long a scenario waits for the operator to act (an external cluster may be slow)."""
