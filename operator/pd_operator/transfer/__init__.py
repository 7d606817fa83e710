"""Moving KV through the real Mooncake transfer engine: the plan executor and the
KV-link probe with its test requests.

`mooncake` is imported lazily (inside `engine.open_engine`) so the operator itself never needs the
transfer engine installed; processes that host an engine are started with the `spawn` method and
import it there (as observed to work with mooncake-transfer-engine-non-cuda 0.3.13.post1).
"""
