"""The checks a serving pod runs on itself before `vllm serve` starts (`pd-preflight`)."""
