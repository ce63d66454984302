"""The shared-memory handoff folder a trainer leaves new weights in for the engines on its host."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import namedtuple

import pytest

from storage import handoff
from tasks.cluster import Placement


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
