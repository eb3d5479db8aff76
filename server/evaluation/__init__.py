"""Evaluation harnesses: measure context assembly on public data nobody here wrote.

`locomo` reads the LoCoMo conversations and the audit errata (pure), `metrics` computes evidence
coverage, the summaries and the baselines (pure), `harness` loads the data through the public
gRPC API, asks every question and reports (`satchel eval locomo`).
"""
