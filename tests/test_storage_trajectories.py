"""The Parquet trajectory store: schema round trip, atomic idempotent shards, validation, selection, URIs."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import datasets
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from storage_records import make_records

import storage.filesystems
from storage.schema import (
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TRAJECTORY_SCHEMA,
    TrajectoryValidationError,
    records_to_table,
    table_to_records,
)
from storage.trajectories import PARTITIONING, TrajectoryStore, TrajectoryStoreError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def records(tokenizer):
    return make_records("run-a", 3, n_prompts=2, group_size=4, tokenizer=tokenizer)


def _visible_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet") if not p.name.startswith("."))


def test_every_field_round_trips(tmp_path, records):
    store = TrajectoryStore(tmp_path)
    store.write_shard("run-a", 3, 0, records)
    back = store.read_records("run-a", version=3)
    assert back == records  # dataclass equality: every field, nested lists, maps, None, tz-aware timestamps
    multi_turn = back[3]
    assert multi_turn.tool_calls[0]["name"] == "python" and multi_turn.messages[2]["role"] == "tool"
    assert False in multi_turn.response_mask and back[1].ref_logprobs is None and back[0].ref_logprobs
    # float32 per-token values survive bit for bit
    np.testing.assert_array_equal(
        np.asarray(back[0].sampler_logprobs, dtype=np.float32), np.asarray(records[0].sampler_logprobs, np.float32)
    )
    # the same rows through datasets.Dataset (map column becomes key/value entries)
    dataset = store.read_dataset("run-a", version=3)
    assert isinstance(dataset, datasets.Dataset) and len(dataset) == len(records)
    assert dataset[0]["response_tokens"] == records[0].response_tokens
    assert {e["key"]: e["value"] for e in dataset[0]["reward_components"]} == records[0].reward_components
    assert dataset[3]["messages"] == records[3].messages


def test_schema_version_is_in_the_file_metadata(tmp_path, records):
    store = TrajectoryStore(tmp_path)
    info = store.write_shard("run-a", 3, 0, records)
    assert pq.read_schema(info.path).metadata[SCHEMA_VERSION_KEY] == str(SCHEMA_VERSION).encode()
    assert pq.read_schema(info.path).remove_metadata() == TRAJECTORY_SCHEMA.remove_metadata()
    assert hashlib.sha256(Path(info.path).read_bytes()).hexdigest() == info.sha256
    # a shard from a newer schema is refused, naming the file
    newer = records_to_table(records).replace_schema_metadata({SCHEMA_VERSION_KEY: b"99"})
    pq.write_table(newer, tmp_path / "run_id=run-a" / "policy_version=3" / "shard-00001.parquet")
    with pytest.raises(TrajectoryStoreError, match="shard-00001.parquet has schema version 99"):
        store.read_table("run-a")


def test_a_shard_of_schema_2_reads_with_no_weights_fingerprint(tmp_path, records):
    """Rows written before schema 3 (no ``weights_fingerprint`` column) still read: the column is null."""
    store = TrajectoryStore(tmp_path)
    info = store.write_shard("run-a", 3, 0, records)
    table = pq.read_table(info.path).drop(["weights_fingerprint"]).replace_schema_metadata({SCHEMA_VERSION_KEY: b"2"})
    pq.write_table(table, info.path)
    read = store.read_records("run-a", version=3)
    assert len(read) == len(records) and {r.weights_fingerprint for r in read} == {None}
    assert [r.response_tokens for r in read] == [r.response_tokens for r in records]


CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    import storage.filesystems
    from storage.trajectories import TrajectoryStore
    from storage_records import make_records

    def die(*args, **kwargs):
        os._exit(17)  # the process dies between the complete temporary write and the rename

    storage.filesystems.publish = die
    records = make_records("run-a", 3, n_prompts=1, group_size=3, seed=99)
    TrajectoryStore({root!r}).write_shard("run-a", 3, 0, records)
    """
)


def test_shards_skip_dictionary_pages_and_keep_statistics_for_row_filters(tmp_path, tokenizer):
    """The store's encoding (TrajectoryStore.write_options): no dictionary pages anywhere, min/max statistics on
    the flat columns (a reward filter can skip a row group by them), none on the per-token lists."""
    store = TrajectoryStore(tmp_path)
    records = make_records("run-e", 0, n_prompts=4, group_size=4, tokenizer=tokenizer)
    info = store.write_shard("run-e", 0, 0, records)
    metadata = pq.ParquetFile(info.path).metadata
    chunks = {}
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            chunks[chunk.path_in_schema] = chunk
            assert not chunk.has_dictionary_page, chunk.path_in_schema
    reward = chunks["reward"].statistics
    assert reward is not None and reward.has_min_max
    assert (reward.min, reward.max) == (min(r.reward for r in records), max(r.reward for r in records))
    for nested in ("response_tokens.list.element", "sampler_logprobs.list.element", "messages.list.element.content"):
        assert chunks[nested].statistics is None or not chunks[nested].statistics.has_min_max, nested
    above = max(r.reward for r in records) + 1.0
    assert store.read_table("run-e", min_reward=above).num_rows == 0
    assert store.read_table("run-e", min_reward=min(r.reward for r in records)).num_rows == len(records)


def test_crash_between_temp_write_and_rename_leaves_no_visible_shard(tmp_path, records):
    store = TrajectoryStore(tmp_path)
    script = CRASHING_WRITER.format(tests=str(ROOT / "tests"), root=str(tmp_path))

    # 1. first write of a shard dies: a hidden temp file is left, no reader sees anything
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 17, proc.stderr[-2000:]
    partition = tmp_path / "run_id=run-a" / "policy_version=3"
    leftovers = [p.name for p in partition.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".shard-00000.parquet.tmp-")
    assert pq.ParquetFile(partition / leftovers[0]).metadata.num_rows == 3  # it was complete, just unpublished
    assert store.shards() == [] and store.read_table("run-a").num_rows == 0
    assert ds.dataset(tmp_path, schema=TRAJECTORY_SCHEMA, partitioning=PARTITIONING).count_rows() == 0

    # 2. the re-run writes the shard; the stale temp file is still ignored
    store.write_shard("run-a", 3, 0, records)
    assert [s.name for s in store.shards()] == ["shard-00000.parquet"]
    assert store.read_records("run-a") == records

    # 3. a crash while replacing an existing shard leaves the old complete shard in place
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 17, proc.stderr[-2000:]
    assert store.read_records("run-a") == records
    assert _visible_files(tmp_path) == ["run_id=run-a/policy_version=3/shard-00000.parquet"]

    # 4. the two stale temporary files can be reclaimed; fresh ones are left to live writers
    assert store.remove_stale_temp_files(min_age_s=3600) == []
    assert len(store.remove_stale_temp_files(min_age_s=0)) == 2
    assert [p.name for p in partition.iterdir()] == ["shard-00000.parquet"]
    assert store.read_records("run-a") == records


def test_failed_write_on_an_fsspec_filesystem_leaves_nothing(monkeypatch, records):
    fs = fsspec.filesystem("memory")
    store = TrajectoryStore("crash-test", filesystem=fs)

    def fail(*args, **kwargs):
        raise OSError("injected failure before the rename")

    monkeypatch.setattr(storage.filesystems, "publish", fail)
    with pytest.raises(OSError, match="injected"):
        store.write_shard("run-a", 3, 0, records)
    assert fs.find("/crash-test") == []  # the temporary object was removed too
    assert store.read_table().num_rows == 0
    fs.rm("/crash-test", recursive=True)


def test_writing_a_shard_again_replaces_it(tmp_path, records):
    store = TrajectoryStore(tmp_path)
    first = store.write_shard("run-a", 3, 0, records)
    again = store.write_shard("run-a", 3, 0, records)
    assert again.sha256 == first.sha256  # same rows, same bytes
    assert store.read_table("run-a").num_rows == len(records)  # not doubled
    rerun = [dataclasses.replace(r, reward=r.reward + 1.0) for r in records[:5]]  # a re-run sampled differently
    store.write_shard("run-a", 3, 0, rerun)
    assert _visible_files(tmp_path) == ["run_id=run-a/policy_version=3/shard-00000.parquet"]
    assert store.read_records("run-a") == rerun
    store.write_shard("run-a", 3, "rollout-worker-1", records)
    assert [s.name for s in store.shards()] == ["rollout-worker-1.parquet", "shard-00000.parquet"]


BAD_ROWS = [
    ({"response_mask": [True]}, "response_mask"),
    ({"sampler_logprobs": [0.5]}, "sampler_logprobs"),
    ({"ref_logprobs": [float("nan")]}, "ref_logprobs"),
    ({"reward": float("inf")}, "reward"),
    ({"reward": "1.0"}, "reward"),
    ({"prompt_tokens": [1, -5]}, "prompt_tokens"),
    ({"response_tokens": [1, "x"]}, "response_tokens"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"finish_reason": None}, "finish_reason"),
    ({"finish_reason": ""}, "finish_reason"),
    ({"sample_index": -1}, "sample_index"),
    ({"policy_version": True}, "policy_version"),
    ({"num_tool_calls": 3}, "num_tool_calls"),
    ({"reward_components": {"format": float("nan")}}, "reward_components"),
    ({"sampling_params": {"temprature": 0.7}}, "sampling_params"),
    ({"created_at": __import__("datetime").datetime(2026, 1, 1)}, "created_at"),
]


@pytest.mark.parametrize(("change", "field"), BAD_ROWS, ids=[f for _, f in BAD_ROWS])
def test_a_malformed_row_is_rejected_naming_the_row_and_field(tmp_path, records, change, field):
    rows = [dataclasses.asdict(r) for r in records[:4]]
    n_tokens = len(rows[2]["response_tokens"])
    if field == "response_mask":
        change = {field: change[field] * (n_tokens - 1)}  # one entry short
    elif field in ("sampler_logprobs", "ref_logprobs"):
        change = {field: change[field] * n_tokens}  # right length, impossible values
    rows[2].update(change)
    if field == "num_tool_calls":
        rows[2]["tool_calls"] = [{"turn": 0, "name": "python", "arguments": "{}", "result": "", "error": False}]
    store = TrajectoryStore(tmp_path)
    with pytest.raises(TrajectoryValidationError, match=rf"row 2: field '{field}'"):
        store.write_shard("run-a", 3, 0, rows)
    assert store.shards() == []


def test_rows_must_belong_to_the_shard_partition(tmp_path, records):
    store = TrajectoryStore(tmp_path)
    with pytest.raises(TrajectoryValidationError, match="row 0: field 'policy_version': 3 does not match"):
        store.write_shard("run-a", 4, 0, records)
    with pytest.raises(TrajectoryValidationError, match="row 0: field 'run_id'"):
        store.write_shard("run-b", 3, 0, records)
    with pytest.raises(TrajectoryStoreError, match="invalid run id"):
        store.write_shard("../escape", 3, 0, records)
    with pytest.raises(TrajectoryValidationError, match="missing field 'reward'"):
        store.write_shard("run-a", 3, 0, records_to_table(records).drop_columns(["reward"]))


def _fill(store: TrajectoryStore, tokenizer) -> list:
    everything = []
    for run in ("run-a", "run-b"):
        for version in range(4):
            rows = make_records(run, version, n_prompts=2, group_size=4, tokenizer=tokenizer)
            store.write_shard(run, version, 0, rows[:4])
            store.write_shard(run, version, 1, rows[4:])
            everything.extend(rows)
    return everything


def test_readers_select_by_run_version_range_and_filters(tmp_path, tokenizer):
    store = TrajectoryStore(tmp_path)
    everything = _fill(store, tokenizer)
    assert store.runs() == ["run-a", "run-b"] and store.versions("run-b") == [0, 1, 2, 3]

    def expected(predicate):
        return [r for r in everything if predicate(r)]

    assert store.read_records("run-b", version=2) == expected(lambda r: r.run_id == "run-b" and r.policy_version == 2)
    got = store.read_records("run-a", min_version=1, max_version=2, min_reward=0.5)
    assert got == expected(lambda r: r.run_id == "run-a" and 1 <= r.policy_version <= 2 and r.reward >= 0.5)
    got = store.read_records(finish_reason="length", filter=pc.field("advantage") < 0)
    assert got == expected(lambda r: r.finish_reason == "length" and r.advantage < 0)
    assert len(got) > 0
    assert store.read_table(["run-a", "run-b"], max_version=0).num_rows == 16
    table = store.read_table("run-a", columns=["reward", "policy_version"])
    assert table.column_names == ["reward", "policy_version"] and table.num_rows == 32
    batches = list(store.iter_batches("run-b", batch_size=3))
    assert all(b.num_rows <= 3 for b in batches) and sum(b.num_rows for b in batches) == 32
    assert pa.Table.from_batches(batches).equals(store.read_table("run-b"))
    dataset = store.read_dataset("run-a", version=3, min_reward=1.0)
    best = expected(lambda r: r.run_id == "run-a" and r.policy_version == 3 and r.reward >= 1.0)
    assert dataset["reward"] == [r.reward for r in best] and len(best) > 0
    with pytest.raises(TrajectoryStoreError, match="empty version range"):
        store.read_table("run-a", min_version=3, max_version=1)
    assert store.read_table("run-c").num_rows == 0
    # the layout is plain hive partitioning: any pyarrow reader gets the same rows
    generic = ds.dataset(tmp_path, schema=TRAJECTORY_SCHEMA, partitioning=PARTITIONING).to_table()
    assert generic.num_rows == len(everything)
    assert sorted(generic.column("reward").to_pylist()) == sorted(r.reward for r in everything)


@pytest.mark.parametrize("kind", ["local-path", "file-uri", "memory-uri", "fsspec-object"])
def test_the_same_code_works_on_paths_and_uris(tmp_path, records, kind):
    if kind == "local-path":
        store = TrajectoryStore(tmp_path / "store")
    elif kind == "file-uri":
        store = TrajectoryStore((tmp_path / "store").as_uri())
    elif kind == "memory-uri":
        store = TrajectoryStore(f"memory://llmrl-test-{os.getpid()}/store")
    else:
        store = TrajectoryStore(f"/llmrl-obj-{os.getpid()}/store", filesystem=fsspec.filesystem("memory"))
    store.write_shard("run-a", 3, 0, records)
    store.write_shard("run-a", 3, 0, records)
    store.write_shard("run-a", 4, 0, [dataclasses.replace(r, policy_version=4) for r in records])
    assert [(s.policy_version, s.name) for s in store.shards()] == [
        (3, "shard-00000.parquet"),
        (4, "shard-00000.parquet"),
    ]
    assert store.read_records("run-a", version=3) == records
    assert store.partition_digest("run-a", 3)[1] == len(records)
    if kind in ("local-path", "file-uri"):
        assert _visible_files(tmp_path / "store") == [
            "run_id=run-a/policy_version=3/shard-00000.parquet",
            "run_id=run-a/policy_version=4/shard-00000.parquet",
        ]
    else:
        fsspec.filesystem("memory").rm(store.root.split("/store")[0], recursive=True)


def test_s3_uri_against_a_local_moto_server(s3_server, records):
    uri = s3_server.uri("trajectories")  # s3://llmrl/trajectories?endpoint_override=...&scheme=http&region=...
    store = TrajectoryStore(uri)
    store.write_shard("run-a", 3, 0, records)
    store.write_shard("run-a", 3, 0, records)
    assert [s.name for s in store.shards()] == ["shard-00000.parquet"]
    assert store.read_records("run-a", version=3) == records
    keys = [info.path for info in store.fs.get_file_info(pafs.FileSelector("llmrl", recursive=True)) if info.size]
    assert keys == ["llmrl/trajectories/run_id=run-a/policy_version=3/shard-00000.parquet"]  # no temp object left
    assert store.partition_uri("run-a", 3) == uri.replace("?", "/run_id=run-a/policy_version=3?")


def test_table_to_records_inverts_records_to_table(records):
    table = records_to_table(records)
    assert table_to_records(table) == records
    assert records_to_table(table_to_records(table)).equals(table)


def test_nan_log_probs_are_allowed_only_on_tokens_the_policy_did_not_sample(tmp_path):
    """Multi-turn rows hold tool tokens (response_mask False) that have no sampler log-prob: NaN there is
    the honest value; NaN on a policy token is refused, naming the row."""
    from storage.schema import TrajectoryValidationError, records_to_table
    from tests.storage_records import make_records

    records = make_records("r", 0, n_prompts=1, group_size=4)
    tool_row = records[3]  # every 4th sample is a two-turn tool call with masked tool tokens
    assert False in tool_row.response_mask
    tool_row.sampler_logprobs = [
        lp if m else float("nan") for lp, m in zip(tool_row.sampler_logprobs, tool_row.response_mask, strict=True)
    ]
    tool_row.ref_logprobs = None
    assert records_to_table(records).num_rows == 4
    records[0].sampler_logprobs = [float("nan")] + records[0].sampler_logprobs[1:]
    with pytest.raises(TrajectoryValidationError, match="row 0: field 'sampler_logprobs'"):
        records_to_table(records)


def test_chosen_versions_are_checked_against_the_store(tmp_path):
    store = TrajectoryStore(str(tmp_path / "store"))
    for version in (1, 3):
        store.write_shard("run-a", version, 0, make_records("run-a", version, n_prompts=1, group_size=2))
    assert store.chosen_versions("run-a", [1, 3]) == [1, 3] and store.chosen_versions("run-a", [3]) == [3]
    with pytest.raises(ValueError, match=r"has no stored trajectories of version\(s\) \[2\] .*\(it has \[1, 3\]\)$"):
        store.chosen_versions("run-a", [2, 3])
    # every version (the default) of a run with a partition missing between its first and last: refused, naming it
    with pytest.raises(ValueError, match=r"version\(s\) \[2\] .*\(it has \[1, 3\]\): a version's partition is missing"):
        store.chosen_versions("run-a")
    store.write_shard("run-a", 2, 0, make_records("run-a", 2, n_prompts=1, group_size=2))
    assert store.chosen_versions("run-a") == [1, 2, 3]
    with pytest.raises(ValueError, match=r"version\(s\) \[4\] .*\(it has 1\.\.3\)$"):
        store.chosen_versions("run-a", [4])
    with pytest.raises(ValueError, match=r"run 'run-b' has no stored trajectories in .*store"):
        store.chosen_versions("run-b")


def test_sft_and_offline_refuse_a_source_run_without_trajectories_before_starting(tmp_path):
    from typer.testing import CliRunner

    from llmrl_cli.main import app

    sources = {"sft": ["source=trajectories", "trajectories.run_id=ghost"], "offline": ["source.run_id=ghost"]}
    for flow, setting in sources.items():
        args = ["run", flow, "--set", f"runs_dir={tmp_path}"] + [a for s in setting for a in ("--set", s)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == f"error: run 'ghost' has no stored trajectories in {tmp_path}/trajectories"
