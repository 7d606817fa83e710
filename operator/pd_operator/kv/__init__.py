"""KV cache layout engine: page sizes, engine block sizes, compatibility findings and transfer plans.

Everything in this package is a pure function of data (no Kubernetes, no clock, no I/O beyond
reading a model config the caller hands over).
"""
