"""What Ray-side checks refuse, on the command line: an actor whose constructor raises is one line (its error, not
Ray's traceback), the command exits non-zero, and the run that never started leaves no run folder."""

import pytest

from tests.killing import memcl

pytestmark = pytest.mark.ray


def test_an_encoder_that_cannot_load_is_one_line_and_leaves_no_run_folder(tmp_path):
    proc = memcl("run", "--set", "encoder.spec.name=hf:/no/such/model", "--set", "runtime.progress=false",
                 "--out", str(tmp_path))
    output, _ = proc.communicate(timeout=300)
    lines = output.strip().splitlines()
    assert proc.returncode == 2, output
    assert lines == ["memcl: error: hf:/no/such/model: not a local folder with a transformers model (config.json, "
                     "weights, tokenizer); memcl does not download models at run time"], output
    assert not list(tmp_path.iterdir())
