"""The spec's rules: the one validator, and the facts it checks (instance shapes, ports, names, scaling
bounds, the settings the operator reserves). Pure."""
