"""What the MARS names run (memcl_ops/mars/methods.py): `mars` is the paper's method whatever `--set` says of what
its sources state, its reconstructions stay switches, its ablations differ from it only in what they remove, and
the extensions turned off one by one lead from `mars-memcl` back to `mars`."""

import dataclasses

import pytest

from memcl.pipeline.config import load_config
from memcl_ops.mars.methods import EXTENSIONS
from memcl_ops.methods import METHODS, method_spec


def resolved(name: str, **settings: object):
    config = load_config(overrides={"method.name": name, **{f"method.{k}": v for k, v in settings.items()}})
    return method_spec(name).resolve(config.method)


def test_every_extension_off_is_the_papers_method_and_all_on_is_memcls():
    off = {key: value for ext in EXTENSIONS for key, value in ext.paper.items()}
    assert dataclasses.replace(resolved("mars-memcl", **off), name="mars") == resolved("mars")
    assert resolved("mars-memcl") == dataclasses.replace(load_config().method, name="mars-memcl")
    for ext in EXTENSIONS:  # each extension is on in memcl's MARS: its paper settings are not memcl's defaults
        on = resolved("mars-memcl")
        assert any(_read(on, key) != value for key, value in ext.paper.items()), ext.name


def test_the_papers_sourced_settings_win_over_set_and_its_reconstructions_do_not():
    paper = resolved("mars", **{"stage2.lambda_gaussian": 0.3, "stage2.lambda_anchor_ce": 0.3,
                                "sgse.signal": "reference", "stage1.smooth_target": "ln",
                                "stage2.anchor_scope": "old", "stage2.temperature": 2.0})
    assert (paper.stage2.lambda_gaussian, paper.stage2.lambda_anchor_ce, paper.sgse.signal) == (0.0, 0.0, "paper")
    assert (paper.stage1.smooth_target, paper.stage1.train_query, paper.stage1.optim.epochs) == ("raw", True, 20)
    assert (paper.stage2.anchor_points, paper.stage2.new_class_init, paper.stage2.lambda_lwf) == ("slot", "zero", 1.0)
    assert (paper.stage2.anchor_scope, paper.stage2.temperature) == ("old", 2.0)


@pytest.mark.parametrize("name, roles, removed", [
    ("mars-no-sgse", (True, False, True), {}),
    ("mars-no-stage1", (True, True, False), {}),
    ("mars-no-anchor", (True, True, True), {"lambda_anchor": 0.0}),
    ("mars-no-stage2", (True, True, True), {"lambda_anchor": 0.0, "lambda_lwf": 0.0}),
])
def test_each_ablation_is_the_papers_method_less_one_part(name, roles, removed):
    spec, paper = METHODS[name], METHODS["mars"]
    assert spec.role == "ablation" and (spec.memory, spec.sgse, spec.stage1) == roles
    assert paper.role == "paper" and (paper.memory, paper.sgse, paper.stage1) == (True, True, True)
    mine = resolved(name)
    theirs = resolved("mars")
    expected = dataclasses.replace(theirs, name=name, stage2=dataclasses.replace(theirs.stage2, **removed))
    assert mine == expected


def _read(config, dotted: str):
    for key in dotted.split("."):
        config = getattr(config, key)
    return config
