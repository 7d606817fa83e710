"""The controller's integration tests use the shared fixtures (tests/support/fixtures.py): the chart
installed once per module (`release`) and operators started from it per test (`start_operator`)."""
