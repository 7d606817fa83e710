"""What a serving image is and can do: the vllm-ascend releases as data, and what an installed
vllm-ascend really contains (read from its source)."""
