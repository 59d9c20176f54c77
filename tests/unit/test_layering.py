import pkgutil
import subprocess
import sys

import memcl_ops


def test_memcl_ops_never_imports_ray():
    modules = [m.name for m in pkgutil.walk_packages(memcl_ops.__path__, "memcl_ops.")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "assert 'ray' not in sys.modules, [m for m in sys.modules if m.startswith('ray')]\n"
            "print(len(sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(modules) >= 6
