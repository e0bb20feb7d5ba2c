"""Inference engines behind one protocol: the local CPU engine and SGLang servers speak the same API."""
