"""Every role is placed by `runtime.placement`: each actor holds the Ray resources its role was configured with (a
role not named keeps its default), computes on the device they give it (the CPU here: Ray assigned no GPU), and
the run learns what the default placement learns. metrics.json says where each role ran."""

import numpy as np
import pytest

from memcl.pipeline import runner
from memcl.pipeline.config import ConfigError, load_config

pytestmark = pytest.mark.ray


def _synthetic(tmp_path, **extra):
    return load_config(overrides={
        "data.dataset": "synthetic", "data.synthetic.classes": 6, "data.synthetic.dim": 16,
        "data.synthetic.train_per_class": 40, "data.synthetic.test_per_class": 20, "stream.tasks": 3,
        "stream.batch_size": 40, "method.router.initial_slots": 4, "method.stage1.optim.epochs": 2,
        "method.stage2.optim.epochs": 4, "runtime.out": str(tmp_path), "runtime.progress": False,
        "runtime.checkpoint": False, "runtime.actor_threads": 1, **extra})


def test_each_role_holds_what_its_placement_asks_and_learns_the_same(actors, tmp_path):
    placement = {"memory": {"num_cpus": 0.5}, "stage1": {"num_cpus": 0.25}, "stage2": {"num_cpus": 0.25}}
    placed = runner.run(_synthetic(tmp_path / "placed", **{"runtime.placement": placement}), actors=actors).metrics
    where = placed["placement"]
    assert set(where) == {"source", "memory", "monitor", "stage1", "stage2", "predictor"}  # MARS's roles, no encoder
    for role, asked in placement.items():
        assert where[role]["resources"] == {"CPU": asked["num_cpus"]}, (role, where[role])
    assert where["monitor"]["resources"] == {} and where["source"]["resources"] == {}  # the default: nothing
    assert {w["device"] for w in where.values()} == {"cpu"}  # no GPU assigned, none used
    default = runner.run(_synthetic(tmp_path / "default"), actors=actors).metrics
    np.testing.assert_array_equal(np.array(placed["acc_matrix"], float), np.array(default["acc_matrix"], float))
    assert placed["samples"] == default["samples"]


def test_placement_names_only_roles_that_exist(tmp_path):
    with pytest.raises(ConfigError, match=r"runtime.placement: no role \['encoder'\]; the roles are \['source'"):
        _synthetic(tmp_path, **{"runtime.placement": {"encoder": {"num_gpus": 1}}})
    with pytest.raises(ConfigError, match=r"runtime\.placement\.memory: unknown key"):
        _synthetic(tmp_path, **{"runtime.placement": {"memory": {"gpus": 1}}})
