"""MIITA (Memory-Induced Inference-Time Adaptation for Continual Learning with Small Language Models; arXiv, 2026):
correction directions extracted from a frozen causal LM by teacher forcing (directions.py), a byte-budgeted memory of
them and the inference-time update they give (answers.py), and the memory manager's store (store.py). The flow:
memcl_ops/roles/lm.py; the equations and defaults: docs/methods.md, "MIITA"."""
