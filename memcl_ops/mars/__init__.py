"""MARS (MaRS: Memory-Adaptive Routing for Reliable Capacity Expansion and Knowledge Retention; ICLR 2026): a slot
router over frozen features (router.py, slots.py), SGSE's test for when the memory grows (sgse.py) and DCDA's two
training stages (dcda.py), with the distilling head (head.py). The flow that runs them: memcl_ops/roles/features.py;
the equations and defaults: docs/methods.md, "MARS"."""
