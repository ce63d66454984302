"""DataLoadingPrimer: sources, repeats and GRPO groups, seeded shuffling, epochs, resume, DatasetChatEnv."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmrl_core.envs import DataLoadingPrimer, DatasetChatEnv

ROWS = [{"id": f"p{i}", "query": f"question {i}", "answer": str(i)} for i in range(10)]


def ids(rows):
    return [r.prompt_id for r in rows]


def test_sources_jsonl_parquet_hf_dataset_and_iterables(tmp_path):
    import datasets

    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    sources = [jsonl, str(parquet), datasets.Dataset.from_list(ROWS), ROWS, (r for r in ROWS)]
    for source in sources:
        primer = DataLoadingPrimer(source, batch_size=10, shuffle=False)
        assert ids(primer.next_batch()) == [r["id"] for r in ROWS], source


def test_bad_sources_name_file_and_row(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "a"}\n{"query": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        DataLoadingPrimer(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DataLoadingPrimer(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        (tmp_path / "x.csv").write_text("a")
        DataLoadingPrimer(tmp_path / "x.csv")
    with pytest.raises(TypeError, match="row 1 is a str"):
        DataLoadingPrimer([{"query": "a"}, "oops"], batch_size=2, shuffle=False).next_batch()
    with pytest.raises(ValueError, match="row 0 has no field 'question'"):
        DataLoadingPrimer(ROWS, rename={"question": "query"}, shuffle=False).next_batch()
    with pytest.raises(ValueError, match="is empty"):
        DataLoadingPrimer([])


def test_group_repeats_gives_adjacent_copies_sharing_a_group_id():
    primer = DataLoadingPrimer(ROWS, batch_size=2, repeats=3, group_repeats=True, seed=1)
    first, second = primer.next_batch(), primer.next_batch()
    assert len(first) == 6
    assert [r.group_id for r in first] == [0, 0, 0, 1, 1, 1]
    assert [r.group_id for r in second] == [2, 2, 2, 3, 3, 3]
    assert [r.sample_index for r in first] == [0, 1, 2, 0, 1, 2]
    for batch in (first, second):
        for g in range(2):
            group = batch[3 * g : 3 * g + 3]
            assert len({r.prompt_id for r in group}) == 1 and len({json.dumps(r.data) for r in group}) == 1
    assert len(set(ids(first)) | set(ids(second))) == 4


def test_ungrouped_repeats_come_successively_across_batches():
    primer = DataLoadingPrimer(ROWS, batch_size=2, repeats=3, group_repeats=False, shuffle=False)
    batches = [primer.next_batch() for _ in range(3)]
    flat = [r for b in batches for r in b]
    assert all(len(b) == 2 for b in batches)
    assert ids(flat) == ["p0", "p0", "p0", "p1", "p1", "p1"]
    assert [r.group_id for r in flat] == [0, 0, 0, 1, 1, 1]
    assert [r.sample_index for r in flat] == [0, 1, 2, 0, 1, 2]


def test_seeded_shuffle_and_epochs_cover_every_row_once():
    a = DataLoadingPrimer(ROWS, batch_size=3, seed=7)
    b = DataLoadingPrimer(ROWS, batch_size=3, seed=7)
    c = DataLoadingPrimer(ROWS, batch_size=3, seed=8)
    seq_a = [i for _ in range(10) for i in ids(a.next_batch())]  # 30 prompts = 3 epochs
    seq_b = [i for _ in range(10) for i in ids(b.next_batch())]
    seq_c = [i for _ in range(10) for i in ids(c.next_batch())]
    assert seq_a == seq_b and seq_a != seq_c
    assert seq_a[:10] != [r["id"] for r in ROWS]  # shuffled
    for epoch in range(3):
        assert Counter(seq_a[10 * epoch : 10 * epoch + 10]) == Counter(r["id"] for r in ROWS)
    assert seq_a[:10] != seq_a[10:20]  # a new permutation each epoch
    assert a.epoch == 3  # 30 prompts used: the next one opens epoch 3


def test_reset_dataloader_restarts_the_stream():
    primer = DataLoadingPrimer(ROWS, batch_size=4, seed=3)
    first = ids(primer.next_batch())
    primer.next_batch()
    primer.reset_dataloader()
    again = primer.next_batch()
    assert ids(again) == first
    assert again[0].group_id == 8  # group ids keep counting, so they stay unique in the run
    primer.reset_dataloader(seed=4)
    assert ids(primer.next_batch()) != first


@pytest.mark.parametrize("group_repeats", [True, False])
def test_resume_continues_with_unseen_prompts(group_repeats):
    def run(primer, n):
        return [(r.prompt_id, r.group_id, r.sample_index) for _ in range(n) for r in primer.next_batch()]

    kwargs = dict(batch_size=3, repeats=2, group_repeats=group_repeats, seed=11)
    reference = run(DataLoadingPrimer(ROWS, **kwargs), 9)
    interrupted = DataLoadingPrimer(ROWS, **kwargs)
    before = run(interrupted, 4)
    saved = json.loads(json.dumps(interrupted.state_dict()))  # the cursor survives a JSON round trip
    resumed = DataLoadingPrimer(ROWS, **kwargs)
    resumed.load_state_dict(saved)
    after = run(resumed, 5)
    assert before + after == reference
    # within the first epoch no prompt starts a second group
    groups = {}
    for pid, gid, _ in before + after:
        groups.setdefault(gid, pid)
    first_epoch = [groups[g] for g in sorted(groups)][: len(ROWS)]
    assert len(set(first_epoch)) == len(ROWS)


def test_resume_refuses_a_different_source():
    primer = DataLoadingPrimer(ROWS, batch_size=2)
    state = primer.state_dict()
    with pytest.raises(ValueError, match="saved for 10 rows"):
        DataLoadingPrimer(ROWS[:5]).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle=True"):
        DataLoadingPrimer(ROWS, shuffle=False).load_state_dict(state)


def test_dataset_chat_env_draws_groups_and_resumes(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"question": r["query"], "answer": r["answer"]}) for r in ROWS))
    make = lambda: DatasetChatEnv(  # noqa: E731
        path,
        batch_size=2,
        repeats=4,
        group_repeats=True,
        rename={"question": "query"},
        system_prompt="S",
        seed=5,
        id_key=None,
    )
    env = make()
    out = env.reset_batch()
    history = out["history", "prompt"]
    assert out.batch_size[0] == 8 and out["group_id"] == [0] * 4 + [1] * 4
    assert history[0].role == ["system", "user"] and history[0][1].content.startswith("question ")
    assert history[0][1].content == history[3][1].content
    state = env.state_dict()
    next_env = make()
    next_env.load_state_dict(json.loads(json.dumps(state)))
    expected = env.reset_batch()
    got = next_env.reset_batch()
    assert [h[1].content for h in got["history", "prompt"]] == [h[1].content for h in expected["history", "prompt"]]
    assert got["group_id"] == expected["group_id"] == [2] * 4 + [3] * 4


def _numbers(limit=None):
    """A one-shot iterator (a generator): rows 0, 1, 2, ... (endless without ``limit``)."""
    i = 0
    while limit is None or i < limit:
        yield {"query": f"q{i}", "id": i}
        i += 1


def test_an_endless_iterator_is_streamed_in_order_never_listed():
    primer = DataLoadingPrimer(_numbers(), batch_size=3, repeats=2)  # group_repeats=False: copies run on
    first, second = primer.next_batch(), primer.next_batch()
    assert [(r.prompt_id, r.group_id, r.sample_index) for r in first + second] == [
        (0, 0, 0), (0, 0, 1), (1, 1, 0), (1, 1, 1), (2, 2, 0), (2, 2, 1),
    ]  # fmt: skip
    assert "stream" in repr(primer) and primer.epoch == 0


def test_a_stream_cursor_resumes_over_the_same_iterator_recreated():
    primer = DataLoadingPrimer(_numbers(), batch_size=3, repeats=2)
    primer.next_batch()  # rows 0, 1 drawn; a copy of row 1 is still owed
    state = primer.state_dict()
    expected = [(r.prompt_id, r.group_id, r.sample_index) for r in primer.next_batch()]
    restored = DataLoadingPrimer(_numbers(), batch_size=3, repeats=2)
    restored.load_state_dict(state)
    assert [(r.prompt_id, r.group_id, r.sample_index) for r in restored.next_batch()] == expected
    sized = DataLoadingPrimer([{"query": "a"}], batch_size=1)
    with pytest.raises(ValueError, match="saved for a stream"):
        sized.load_state_dict(state)


def test_streams_of_strings_batches_and_collated_columns():
    strings = DataLoadingPrimer(iter([["x", "y"], ["z"]]), batch_size=3, str_key="text")
    assert [r.data for r in strings.next_batch()] == [{"text": "x"}, {"text": "y"}, {"text": "z"}]
    collated = DataLoadingPrimer(iter([{"query": ["a", "b"], "answer": ["1", "2"]}]), batch_size=2)
    assert [r.data for r in collated.next_batch()] == [{"query": "a", "answer": "1"}, {"query": "b", "answer": "2"}]


def test_a_one_shot_stream_that_ends_says_so():
    primer = DataLoadingPrimer(_numbers(limit=2), batch_size=3)
    with pytest.raises(ValueError, match="prompt stream generator ended after 2 rows"):
        primer.next_batch()
