"""What a run's actors reserve in GPUs, checked against what a machine or a cluster has before any actor starts
(pipeline/preflight.py): Ray would otherwise wait for them forever."""

from dataclasses import replace

import pytest

from memcl.pipeline import preflight
from memcl.pipeline.config import ConfigError, Placement, RuntimeConfig, load_config
from memcl_ops.methods import METHODS, lm_method

NSR = "pipeline/configs/nsr-bbc-cyclic.yaml"


def reserved(config) -> dict:
    return preflight.reserved_gpus(config, METHODS[config.method.name])


def test_workers_and_replicas_count_each_copy_and_auto_reserves_nothing():
    assert reserved(load_config(NSR)) == {}  # "auto": only what the cluster has
    workers = load_config(NSR, {"runtime.data_parallel": 4, "encoder.num_gpus": 0.5})
    assert reserved(workers) == {"adapter_trainer": (0.5, 4)}  # NSR's workers reserve what an encoder would
    placed = load_config(NSR, {"runtime.data_parallel": 2, "encoder.num_gpus": 0.5,
                               "runtime.placement": {"adapter_trainer": {"num_gpus": 1}}})
    assert reserved(placed) == {"adapter_trainer": (1, 2)}  # its own placement wins
    features = load_config(None, {"encoder.num_gpus": 1, "encoder.replicas": 3, "runtime.placement": {
        "stage2": {"num_gpus": 0.25}, "adapter_trainer": {"num_gpus": 1}}})
    assert reserved(features) == {"stage2": (0.25, 1), "encoder": (1, 3)}  # no adapter trainer in a features run


def test_a_cluster_with_fewer_gpus_than_the_actors_reserve_is_refused_in_one_line():
    config = load_config(NSR, {"runtime.data_parallel": 2, "runtime.placement": {"adapter_trainer": {"num_gpus": 1}}})
    preflight.check_gpus(reserved(config), 2, "the cluster has", preflight.RUN_COPIES)  # two GPUs: both workers fit
    with pytest.raises(ConfigError, match=r"reserve 2 GPUs \(adapter_trainer 1 x 2 actors\) and the cluster has 1"):
        preflight.check_gpus(reserved(config), 1, "the cluster has", preflight.RUN_COPIES)


def test_an_lm_run_counts_each_lm_replica_and_the_actors_its_methods_start():
    rt = RuntimeConfig(lm_replicas=3, placement={"lm_encoder": Placement(num_gpus=0.5), "memory": Placement(num_gpus=1),
                                                 "lm_trainer": Placement(num_gpus=1), "stage1": Placement(num_gpus=1)})
    lora, miita = (lm_method(name).tags for name in ("lora", "miita"))
    # stage1 is not an LM role; the trainer is started for a method that trains the LM, the memory for one that keeps
    assert preflight.lm_reserved_gpus(rt, set(lora)) == {"lm_encoder": (0.5, 3), "lm_trainer": (1, 1)}
    assert preflight.lm_reserved_gpus(rt, set(miita)) == {"lm_encoder": (0.5, 3), "memory": (1, 1)}
    assert preflight.lm_reserved_gpus(RuntimeConfig(), set(lora) | set(miita)) == {}  # by default none
    workers = replace(rt, data_parallel=2)  # the LoRA trainer's data-parallel workers each reserve its placement
    assert preflight.lm_reserved_gpus(workers, set(lora)) == {"lm_encoder": (0.5, 3), "lm_trainer": (1, 2)}
    with pytest.raises(ConfigError, match=r"reserve 2.5 GPUs \(lm_encoder 0.5 x 3 actors, lm_trainer 1\).*lower "
                                          r"runtime.lm_replicas, runtime.data_parallel or"):
        preflight.check_gpus(preflight.lm_reserved_gpus(rt, set(lora)), 2, "the cluster has", preflight.LM_COPIES)
