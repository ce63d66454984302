"""RayDataLoadingPrimer: one DataLoadingPrimer in a Dask actor, shared by the envs that name it (TorchRL's
actor-hosted primer), with TorchRL's argument rules."""

from __future__ import annotations

import json

import pytest
from torch.utils.data import DataLoader

from llmrl_core.envs import ChatEnv, DataLoadingPrimer, RayDataLoadingPrimer

ROWS = [{"id": f"p{i}", "query": f"question {i}", "answer": str(i)} for i in range(12)]


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        yield c


def _env(primer) -> ChatEnv:
    env = ChatEnv(batch_size=(2,), system_prompt="S")
    env.append_transform(primer)
    return env


def _users(out) -> list[str]:
    return [h[-1].content for h in out["history", "prompt"]]


def test_two_envs_naming_one_actor_draw_from_one_cursor(client):
    first = RayDataLoadingPrimer(dataloader=ROWS, batch_size=2, shuffle=False, actor_name="shared", client=client)
    second = RayDataLoadingPrimer(dataloader_factory=lambda: ROWS, batch_size=2, actor_name="shared", client=client)
    try:
        a, b = _env(first), _env(second)
        drawn = _users(a.reset_batch()) + _users(b.reset_batch()) + _users(a.reset_batch())
        assert drawn == [f"question {i}" for i in range(6)]  # no prompt twice: one cursor, in the actor
        assert first.batch_size == 2 and second.repeats == 1 and first.epoch == 0
        state = a.state_dict()  # the shared cursor, as a checkpoint keeps it
        assert _users(b.reset_batch()) == ["question 6", "question 7"]
        b.load_state_dict(json.loads(json.dumps(state)))
        assert _users(a.reset_batch()) == ["question 6", "question 7"]  # both envs continue from the restored cursor
        first.reset_dataloader()
        assert _users(b.reset_batch()) == ["question 0", "question 1"]
        assert repr(first).startswith("RayDataLoadingPrimer(source=")
    finally:
        first.close()
        second.close()
    assert repr(first) == "RayDataLoadingPrimer(actor=None)"


def test_without_a_name_each_primer_has_its_own_actor(client):
    with (
        RayDataLoadingPrimer(dataloader=ROWS, batch_size=2, shuffle=False, client=client) as one,
        RayDataLoadingPrimer(dataloader=ROWS, batch_size=2, shuffle=False, client=client) as two,
    ):
        assert _users(_env(one).reset_batch()) == _users(_env(two).reset_batch()) == ["question 0", "question 1"]


def test_use_ray_service_builds_the_hosted_primer_with_groups(client):
    primer = DataLoadingPrimer(ROWS, batch_size=2, repeats=2, group_repeats=True, use_ray_service=True, client=client)
    try:
        assert isinstance(primer, RayDataLoadingPrimer)
        rows = primer.provide_prompts(4)
        assert [r.group_id for r in rows] == [0, 0, 1, 1] and rows[0].data == rows[1].data
    finally:
        primer.close()


def test_torchrls_argument_rules_hold_before_any_actor_starts():
    with pytest.raises(ValueError, match="Cannot provide both 'dataloader' and 'dataloader_factory'"):
        RayDataLoadingPrimer(dataloader=ROWS, dataloader_factory=lambda: ROWS)
    with pytest.raises(ValueError, match="Must provide exactly one of 'dataloader' or 'dataloader_factory'"):
        RayDataLoadingPrimer()
    with pytest.raises(ValueError, match="primers= takes TorchRL specs"):
        RayDataLoadingPrimer(dataloader=ROWS, primers=object())
    with pytest.raises(ValueError, match="ray_init_config=.* is a Ray setting"):
        RayDataLoadingPrimer(dataloader=ROWS, num_cpus=1, ray_init_config={"address": "auto"})


def test_num_cpus_defaults_to_the_dataloaders_workers(client):
    loader = DataLoader(ROWS, batch_size=2, num_workers=3)
    with RayDataLoadingPrimer(dataloader=loader, batch_size=2, client=client) as primer:
        assert primer.num_cpus == 3
    with RayDataLoadingPrimer(dataloader_factory=lambda: DataLoader(ROWS), batch_size=2, client=client) as primer:
        assert primer.num_cpus == 1  # num_workers 0: one CPU, as TorchRL
        for name in ("dataloader", "endless_dataloader", "stack_method"):
            with pytest.raises(NotImplementedError, match=f"{name} is not implemented for RayDataLoadingPrimer"):
                getattr(primer, name)
