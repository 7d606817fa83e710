"""pd-proxy: the routing proxy of a PDDeployment (prefill, then decode with prefill's KV location).

Ours rather than vllm-ascend's example proxy, because the operator needs two things that script
does not give (vllm-project/vllm-ascend:
examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py @ v0.30.0rc2):
- membership that survives a restart: the script takes its upstreams in argv and changes them only
  through /instances/add and /instances/remove (since v0.13.0), held in the process alone, so a
  restarted proxy pod routes to its argv again; pd-proxy reads a mounted membership file
  (pd_operator.proxy.membership) and follows it while it runs;
- what each upstream still carries: the script exposes one global request count and drops a
  removed instance only once the whole proxy is idle; pd-proxy answers /pd/state with the requests
  in flight per upstream and, per prefill instance, those whose decode has not yet pulled the KV,
  so the operator deletes an instance when it, not the proxy, is done.
The request protocol is the script's (protocol.py).
"""
