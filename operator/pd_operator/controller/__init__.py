"""The controller: kopf handlers around one level-based reconcile of a PDDeployment.

Only this package imports kopf, and only `client.py` talks to the Kubernetes API. The decisions
(what to apply or prune, the status, group restarts, the proxy's rollout gate, admission verdicts)
are pure functions in `diff.py`, `status.py`, `restarts.py`, `gate.py` and `admission.py`.
"""
