"""The versioned Arrow schema of one trajectory row, and its validation.

One row is one sampled response (one member of a GRPO group), with everything needed to train on it
again later without the engine: the chat messages, the prompt and response token ids, the per-token
assistant mask and log-probs, the reward and its parts, the advantage and how sampling ended.

Design choices:

- Per-token columns are Arrow lists (``int32`` token ids, ``bool`` mask, ``float32`` log-probs; vLLM
  and the trainer produce float32 log-probs, so storing float32 loses nothing). Scalars are float64.
- ``reward_components`` is an Arrow map (name -> value); ``tool_calls`` is a list of structs, one per
  call, with its arguments as a JSON string (tools take arbitrary arguments, a struct cannot hold them).
- The schema version lives in the schema metadata (``llmrl.schema_version``), hence in every Parquet
  footer. Readers refuse files from a newer schema with a message naming the file.
- Building a table goes column by column through pyarrow (fast); only when pyarrow refuses a column
  do we look for the offending row, so errors always name the row index and the field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

SCHEMA_VERSION = 3  # 2: sampling_params.logprobs_mode; 3: weights_fingerprint
SCHEMA_VERSION_KEY = b"llmrl.schema_version"
ROLES = ("system", "user", "assistant", "tool")

MESSAGE_TYPE = pa.struct([pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string())])
TOOL_CALL_TYPE = pa.struct(
    [
        pa.field("turn", pa.int32()),
        pa.field("name", pa.string()),
        pa.field("arguments", pa.string()),  # JSON text
        pa.field("result", pa.string()),
        pa.field("error", pa.bool_()),
    ]
)
SAMPLING_PARAMS_TYPE = pa.struct(
    [
        pa.field("temperature", pa.float64()),
        pa.field("top_p", pa.float64()),
        pa.field("top_k", pa.int32()),
        pa.field("max_tokens", pa.int32()),
        pa.field("seed", pa.int64()),
        # "processed_logprobs": sampler_logprobs are of the temperature-scaled distribution (score at `temperature`);
        # "raw_logprobs" or null (schema 1 rows): of the unscaled model (score at temperature 1).
        pa.field("logprobs_mode", pa.string()),
    ]
)


def _f(name: str, type_: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


TRAJECTORY_SCHEMA = pa.schema(
    [
        _f("run_id", pa.string()),
        _f("policy_version", pa.int64()),
        _f("prompt_id", pa.string()),
        _f("group_id", pa.string()),
        _f("sample_index", pa.int32()),
        _f("turn", pa.int32()),
        _f("messages", pa.list_(MESSAGE_TYPE)),
        _f("prompt_tokens", pa.list_(pa.int32())),
        _f("response_tokens", pa.list_(pa.int32())),
        _f("response_mask", pa.list_(pa.bool_())),
        _f("sampler_logprobs", pa.list_(pa.float32())),
        _f("ref_logprobs", pa.list_(pa.float32()), nullable=True),
        _f("reward", pa.float64()),
        _f("reward_components", pa.map_(pa.string(), pa.float64())),
        _f("advantage", pa.float64(), nullable=True),
        _f("finish_reason", pa.string()),
        _f("truncated", pa.bool_()),
        _f("num_tool_calls", pa.int32()),
        _f("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        _f("model_id", pa.string()),
        _f("sampling_params", SAMPLING_PARAMS_TYPE),
        _f("created_at", pa.timestamp("us", tz="UTC")),
        # the fingerprint of the weights the sampling engine held (llmrl_core.weight_sync.fingerprint); null in
        # rows of schema 2 and earlier, and in rows not sampled by an engine (SFT data, imports)
        _f("weights_fingerprint", pa.string(), nullable=True),
    ],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
FIELD_NAMES = tuple(TRAJECTORY_SCHEMA.names)
PER_TOKEN_FIELDS = ("response_mask", "sampler_logprobs", "ref_logprobs")


class TrajectoryValidationError(ValueError):
    """A trajectory row or table does not match the schema; the message names the row and field."""


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclasses.dataclass
class TrajectoryRecord:
    """One sampled response with its tokens, log-probs, reward and provenance (one Parquet row).

    ``response_mask`` is True on tokens the policy sampled (assistant) and False on tokens inserted by
    the environment (tool outputs, templates); ``sampler_logprobs`` and ``ref_logprobs`` have one entry
    per response token. ``turn`` is the index of the last assistant turn (0 for single-turn).
    ``sampling_params`` holds temperature, top_p, top_k, max_tokens, seed and logprobs_mode (missing keys are null).
    ``weights_fingerprint`` is the fingerprint of the weights the engine that sampled it held (None: unknown).
    """

    run_id: str
    policy_version: int
    prompt_id: str
    group_id: str
    sample_index: int
    messages: list[dict[str, str]]
    prompt_tokens: list[int]
    response_tokens: list[int]
    response_mask: list[bool]
    sampler_logprobs: list[float]
    reward: float
    finish_reason: str
    model_id: str
    turn: int = 0
    ref_logprobs: list[float] | None = None
    reward_components: dict[str, float] = dataclasses.field(default_factory=dict)
    advantage: float | None = None
    truncated: bool = False
    num_tool_calls: int = 0
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sampling_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    created_at: dt.datetime = dataclasses.field(default_factory=_utc_now)
    weights_fingerprint: str | None = None


def schema_version_of(schema: pa.Schema) -> int | None:
    """The llmrl schema version recorded in an Arrow/Parquet schema's metadata (None when absent)."""
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    return int(raw) if raw is not None else None


def _row_dict(row: TrajectoryRecord | Mapping[str, Any], index: int) -> dict[str, Any]:
    if isinstance(row, TrajectoryRecord):
        data = dataclasses.asdict(row)
    elif isinstance(row, Mapping):
        data = dict(row)
    else:
        raise TrajectoryValidationError(f"row {index}: expected a TrajectoryRecord or a mapping, got {type(row)}")
    unknown = sorted(set(data) - set(FIELD_NAMES))
    if unknown:
        raise TrajectoryValidationError(f"row {index}: unknown field(s) {unknown}")
    defaults = {"turn": 0, "reward_components": {}, "truncated": False, "num_tool_calls": 0, "tool_calls": []}
    for key, value in defaults.items():
        data.setdefault(key, value)
    data.setdefault("sampling_params", {})
    missing = [name for name in FIELD_NAMES if name not in data and TRAJECTORY_SCHEMA.field(name).nullable is False]
    if missing:
        raise TrajectoryValidationError(f"row {index}: missing field '{missing[0]}'")
    return data


def _column(name: str, values: list[Any]) -> pa.Array:
    """Convert one column, naming the first offending row when pyarrow refuses it."""
    type_ = TRAJECTORY_SCHEMA.field(name).type
    if name == "sampling_params":
        unknown = {k for v in values if isinstance(v, Mapping) for k in v} - set(SAMPLING_PARAMS_TYPE.names)
        if unknown:
            bad = next(i for i, v in enumerate(values) if isinstance(v, Mapping) and set(v) & unknown)
            raise TrajectoryValidationError(f"row {bad}: field 'sampling_params': unknown key(s) {sorted(unknown)}")
    if name == "created_at":
        for i, value in enumerate(values):
            if isinstance(value, dt.datetime) and value.tzinfo is None:
                raise TrajectoryValidationError(f"row {i}: field 'created_at': naive datetime, give a timezone")
    if type_ in (pa.int32(), pa.int64()) or (pa.types.is_list(type_) and type_.value_type == pa.int32()):
        for i, value in enumerate(values):  # pyarrow would silently accept bools as ints
            items = value if isinstance(value, list | tuple) else [value]
            if any(isinstance(v, bool) for v in items):
                raise TrajectoryValidationError(f"row {i}: field '{name}': expected integers, got a bool")
    try:
        return pa.array(values, type=type_, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as first:
        for i, value in enumerate(values):
            try:
                pa.array([value], type=type_)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as err:
                raise TrajectoryValidationError(f"row {i}: field '{name}': {err} (value: {value!r:.200})") from err
        raise TrajectoryValidationError(f"field '{name}': {first}") from first


def records_to_table(records: Iterable[TrajectoryRecord | Mapping[str, Any]]) -> pa.Table:
    """Build a validated Arrow table (with the schema version in its metadata) from records or dicts."""
    rows = [_row_dict(row, i) for i, row in enumerate(records)]
    columns = [_column(name, [row.get(name) for row in rows]) for name in FIELD_NAMES]
    table = pa.Table.from_arrays(columns, schema=TRAJECTORY_SCHEMA)
    validate_table(table)
    return table


def _first_bad(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first True in a boolean array (nulls count as False), or None."""
    filled = pc.fill_null(mask, False)
    if not pc.any(filled).as_py():
        return None
    return pc.index(filled, True).as_py()


def _check(table: pa.Table, bad: pa.ChunkedArray | pa.Array, field: str, what: str) -> None:
    index = _first_bad(bad)
    if index is not None:
        value = table.column(field)[index].as_py()
        raise TrajectoryValidationError(f"row {index}: field '{field}': {what} (value: {value!r:.200})")


def _conform(table: pa.Table) -> pa.Table:
    """Check names and types field by field, cast compatible columns, and attach the schema metadata."""
    missing = [name for name in FIELD_NAMES if name not in table.column_names]
    if missing:
        raise TrajectoryValidationError(f"missing field '{missing[0]}'")
    extra = sorted(set(table.column_names) - set(FIELD_NAMES))
    if extra:
        raise TrajectoryValidationError(f"unknown field(s) {extra}")
    columns = []
    for field in TRAJECTORY_SCHEMA:
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                raise TrajectoryValidationError(
                    f"field '{field.name}': type {column.type} does not match the schema's {field.type}: {err}"
                ) from err
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=TRAJECTORY_SCHEMA)


def validate_table(table: pa.Table) -> pa.Table:
    """Validate a whole table against the schema and its row rules; returns it conformed to the schema.

    Row rules: required fields are not null; the per-token columns have one entry per response token;
    log-probs are finite and <= 0 (1e-3 slack); reward is finite; token ids, indices, versions and
    counts are non-negative; ``num_tool_calls`` equals the number of ``tool_calls`` when they are given;
    message roles are system/user/assistant/tool; ``finish_reason`` is not empty.
    """
    table = _conform(table).combine_chunks()
    for field in TRAJECTORY_SCHEMA:
        if not field.nullable and table.column(field.name).null_count:
            _check(table, pc.is_null(table.column(field.name)), field.name, "must not be null")
    n_tokens = pc.list_value_length(table.column("response_tokens"))
    for name in PER_TOKEN_FIELDS:
        lengths = pc.list_value_length(table.column(name))
        _check(table, pc.not_equal(lengths, n_tokens), name, "length differs from len(response_tokens)")
    for name in ("sampler_logprobs", "ref_logprobs"):
        present = pc.is_valid(table.column(name))  # ref_logprobs may be null for a whole row
        values, mask = pc.filter(table.column(name), present), pc.filter(table.column("response_mask"), present)
        rows = pc.filter(pa.array(range(table.num_rows)), present)
        flat = pc.list_flatten(values)
        parents = pc.take(rows, pc.list_parent_indices(values))
        policy = pc.list_flatten(mask)  # NaN marks a token the policy did not sample
        bad = pc.or_(pc.and_(pc.is_nan(flat), policy), pc.greater(flat, 1e-3))
        if pc.any(pc.fill_null(bad, False)).as_py():
            row = parents[_first_bad(bad)].as_py()
            raise TrajectoryValidationError(
                f"row {row}: field '{name}': log-probs must be <= 0, and not NaN on policy tokens (response_mask) "
                f"(value: {table.column(name)[row].as_py()!r:.200})"
            )
    for name in ("prompt_tokens", "response_tokens"):
        flat = pc.list_flatten(table.column(name))
        bad = pc.less(flat, 0)
        if pc.any(pc.fill_null(bad, True)).as_py():
            row = pc.list_parent_indices(table.column(name))[_first_bad(pc.fill_null(bad, True))].as_py()
            raise TrajectoryValidationError(f"row {row}: field '{name}': token ids must be non-negative, non-null")
    reward = table.column("reward")
    _check(table, pc.invert(pc.is_finite(reward)), "reward", "must be finite")
    advantage = table.column("advantage")
    _check(table, pc.invert(pc.is_finite(advantage)), "advantage", "must be finite (or null)")
    for name in ("policy_version", "sample_index", "turn", "num_tool_calls"):
        _check(table, pc.less(table.column(name), 0), name, "must be >= 0")
    for name in ("run_id", "prompt_id", "group_id", "finish_reason", "model_id"):
        _check(table, pc.equal(pc.utf8_length(table.column(name)), 0), name, "must not be empty")
    n_calls = pc.list_value_length(table.column("tool_calls"))
    given = pc.greater(n_calls, 0)
    miscounted = pc.and_(given, pc.not_equal(n_calls, table.column("num_tool_calls")))
    _check(table, miscounted, "num_tool_calls", "differs from the number of tool_calls")
    roles = pc.struct_field(pc.list_flatten(table.column("messages")), "role")
    bad_roles = pc.invert(pc.is_in(roles, value_set=pa.array(ROLES)))
    if pc.any(pc.fill_null(bad_roles, True)).as_py():
        row = pc.list_parent_indices(table.column("messages"))[_first_bad(pc.fill_null(bad_roles, True))].as_py()
        raise TrajectoryValidationError(f"row {row}: field 'messages': role must be one of {ROLES}")
    components = to_datasets_table(table).column("reward_components")
    values = pc.struct_field(pc.list_flatten(components), "value")
    bad_values = pc.fill_null(pc.invert(pc.is_finite(values)), True)
    if pc.any(bad_values).as_py():
        row = pc.list_parent_indices(components)[_first_bad(bad_values)].as_py()
        raise TrajectoryValidationError(f"row {row}: field 'reward_components': values must be finite, non-null")
    return table


def table_to_records(table: pa.Table) -> list[TrajectoryRecord]:
    """Turn a trajectory table back into records (maps become dicts, timestamps aware datetimes)."""
    records = []
    for row in table.to_pylist():
        row["reward_components"] = dict(row["reward_components"] or [])
        row["sampling_params"] = {k: v for k, v in (row["sampling_params"] or {}).items() if v is not None}
        records.append(TrajectoryRecord(**{k: row[k] for k in FIELD_NAMES}))
    return records


def to_datasets_table(table: pa.Table) -> pa.Table:
    """The same table with the map column as a list of {key, value} structs (``datasets`` has no map type)."""
    if "reward_components" not in table.column_names:
        return table
    index = table.column_names.index("reward_components")
    entries = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.float64())]))
    return table.set_column(index, "reward_components", table.column("reward_components").cast(entries))


def sequence_or_single(value: str | Sequence[str]) -> list[str]:
    """Normalise a string-or-sequence argument to a list of strings."""
    return [value] if isinstance(value, str) else list(value)
