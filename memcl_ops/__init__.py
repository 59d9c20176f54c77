"""memcl_ops: the maths of memcl (methods, losses, metrics, encoders, datasets). Never imports Ray."""

__version__ = "0.1.0"
