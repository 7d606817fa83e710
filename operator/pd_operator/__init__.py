"""pd-operator: prefill/decode disaggregated vLLM-Ascend serving on Kubernetes."""

__version__ = "0.1.0"
