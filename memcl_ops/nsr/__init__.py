"""NSR (Neural Subspace Reallocation: Continual Learning as Retrieval-Based Subspace Memory Management; arXiv
2606.30067): one active LoRA adapter inside the frozen encoder (adapter.py) and a bank of compressed adapters keyed by
task (task_bank.py, store.py). The flow: memcl_ops/roles/nsr.py; the equations and defaults: docs/methods.md, "NSR"."""
