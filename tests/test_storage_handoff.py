"""Shared memory through which a trainer hands new weights to the engines on its host: the folder and the file."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import namedtuple

import pytest
import torch
from safetensors.torch import load_file

from runtime.cluster import Placement
from storage import handoff


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_folder_is_per_process_and_needs_room_for_twice_the_file(tmp_path, monkeypatch):
    folder = handoff.handoff_dir(1000, root=tmp_path)
    assert folder == tmp_path / f"llmrl-handoff-{os.getpid()}" and folder.is_dir()
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(64 << 20, 0, 64 << 20))  # a container's 64 MB
    assert handoff.handoff_dir(40 << 20, root=tmp_path) is None  # 80 MB needed
    assert handoff.handoff_dir(30 << 20, root=tmp_path) == folder
    (folder / "policy_v000001.safetensors").write_bytes(b"x" * (20 << 20))  # what this trainer holds counts as free
    assert handoff.handoff_dir(40 << 20, root=tmp_path) == folder
    assert handoff.handoff_dir(1, root=tmp_path / "absent") is None


def test_folders_of_dead_trainers_are_swept_and_live_ones_kept(tmp_path):
    dead = tmp_path / f"llmrl-handoff-{_dead_pid()}"
    dead.mkdir()
    (dead / "policy_v000003.safetensors").write_bytes(b"weights")
    alive = tmp_path / f"llmrl-handoff-{os.getppid()}"
    alive.mkdir()
    other = tmp_path / "llmrl-handoff-notapid"
    other.mkdir()
    assert handoff.sweep_orphans(tmp_path) == [dead]
    assert not dead.exists() and alive.is_dir() and other.is_dir()
    handoff.handoff_dir(10, root=tmp_path)  # sweeps too
    assert alive.is_dir()


@pytest.mark.parametrize(
    ("trainer", "rollout", "beside"),
    [
        ("tcp://127.0.0.1:4001", ["tcp://127.0.0.1:4002", "tcp://127.0.0.1:4003"], True),
        ("tcp://10.0.0.1:4001", ["tcp://10.0.0.1:4002", "tcp://10.0.0.2:4002"], False),
        ("tcp://10.0.0.1:4001", [], False),
    ],
)
def test_engines_are_beside_the_trainer_only_when_every_worker_shares_its_host(trainer, rollout, beside):
    assert Placement(None, rollout, trainer).engines_beside_trainer is beside


def _state(scale: float) -> dict[str, torch.Tensor]:
    embed = torch.arange(12, dtype=torch.float32).reshape(4, 3) * scale + 0.1234567
    return {
        "embed.weight": embed,
        "head.weight": embed,  # tied: the same tensor under two names
        "norm.weight": torch.full((3,), 1.0 + scale),
        "position_ids": torch.arange(4),
    }


def test_shared_weights_are_cast_written_once_then_rewritten_in_place(tmp_path):
    """The first version writes the file (floating tensors in the engines' dtype, a tied tensor once); later ones
    copy into the same file (same inode, same mapping) and a reader sees exactly the cast of the new weights."""
    shared = handoff.SharedWeights(torch.bfloat16, root=tmp_path)
    path = shared.write(_state(1.0))
    assert path == tmp_path / f"llmrl-handoff-{os.getpid()}" / "engine-weights.safetensors"
    first = load_file(path)
    assert sorted(first) == ["embed.weight", "norm.weight", "position_ids"]
    assert first["embed.weight"].dtype == torch.bfloat16 and first["position_ids"].dtype == torch.int64
    inode = path.stat().st_ino
    for scale in (2.0, -3.5):
        assert shared.write(_state(scale)) == path and path.stat().st_ino == inode  # rewritten in place
        again = load_file(path)
        for name, tensor in again.items():
            expected = _state(scale)[name]
            assert torch.equal(tensor, expected.to(torch.bfloat16) if expected.is_floating_point() else expected)
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_shared_weights_rewrite_the_file_when_the_layout_changes_and_step_aside_without_room(tmp_path, monkeypatch):
    shared = handoff.SharedWeights(torch.float32, root=tmp_path)
    path = shared.write(_state(1.0))
    grown = {**_state(1.0), "norm.weight": torch.ones(5)}  # another shape: a new file, not a copy into the old
    assert shared.write(grown) == path and torch.equal(load_file(path)["norm.weight"], torch.ones(5))
    Usage = namedtuple("Usage", "total used free")
    big = {"w": torch.zeros(20 << 20)}  # 80 MB in float32, 160 MB with room for the temporary file
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(64 << 20, 0, 64 << 20))  # a container's 64 MB
    assert shared.write(big) is None  # the trainer writes the checkpoint folder instead
    del shared
    assert not path.exists()  # the file goes with its owner


def test_a_killed_process_not_yet_reaped_counts_as_gone():
    """A trainer killed but not yet reaped by its parent (a zombie) is gone: its folder is an orphan."""
    import subprocess
    import time
    from pathlib import Path

    from storage.guardian import alive

    child = subprocess.Popen(["sleep", "30"])
    assert alive(child.pid)
    child.kill()  # not waited for: a zombie until reaped
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 5
    while " Z " not in stat.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert " Z " in stat.read_text() and not alive(child.pid)
    child.wait()
    assert not alive(child.pid)
