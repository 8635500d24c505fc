"""Hosts: places that run onnxruntime and return hashed outputs (local, emulated, ssh, imported)."""
