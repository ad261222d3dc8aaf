"""Decoding methods: one module per algorithm, all speaking the model interface in specbench.models."""
