"""Pre-flight checks: everything a run needs that can be checked cheaply, checked before it starts anything.

Every flow calls :func:`preflight` on its config before its first Prefect task, Dask cluster, engine or
file write (and the CLI before it starts a flow at all), so a bad run id, model reference or data source fails
in a second with a message naming the setting, the file and the row, and leaves nothing behind:

- run ids (``run_id``, ``source.run_id``, ``trajectories.run_id``) are safe folder names;
- ``model``: the packaged default, a local model folder (with ``config.json``), or a hub id that is in the local
  Hugging Face cache (an uncached id fails when the machine is offline: ``HF_HUB_OFFLINE`` /
  ``TRANSFORMERS_OFFLINE``);
- data sources open, are not empty, and their first rows have the fields the env reads, as non-empty strings;
- ``runs_dir``: a local folder this user can write (or create), or (GRPO and collect runs) a URI of a filesystem
  pyarrow or fsspec knows;
- ``tracking_uri``: a path or a URI with a scheme MLflow stores (sqlite, file, http(s), databricks, a database);
- ``rollout.max_model_len`` within the model's ``max_position_embeddings`` (a local or cached model's config).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from llmrl_core.paths import SAFE_NAME

FIRST_ROWS = 16  # rows read from each data source (a first batch)


class PreflightError(ValueError):
    """A setting that would make the run fail later; the message names the setting and what to do."""


def check_run_id(run_id: Any, setting: str = "run_id") -> str:
    """``run_id`` as a safe folder name (letters, digits, ``.``, ``_``, ``-``; no path separators)."""
    if not isinstance(run_id, str) or not SAFE_NAME.match(run_id) or ".tmp-" in run_id:
        raise PreflightError(
            f"{setting}: {run_id!r} is not a valid run id (use letters, digits, '.', '_' and '-', starting with a "
            "letter or digit, at most 200 characters; no '/')"
        )
    return run_id


def _offline() -> bool:
    flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes") for k in flags)


def model_config_file(model: Any) -> Path | None:
    """The ``config.json`` of a local model folder or a cached hub model, without preparing or downloading
    anything (the packaged default's once it is prepared; None for what is not at hand)."""
    from llmrl_core.model_store import DEFAULT_MODEL_ALIASES, default_model_dir

    if model is None or (isinstance(model, str) and model.lower() in DEFAULT_MODEL_ALIASES):
        prepared = default_model_dir() / "config.json"
        return prepared if prepared.is_file() else None
    path = Path(str(model)).expanduser()
    if (path / "config.json").is_file():
        return path / "config.json"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return None
    cached = try_to_load_from_cache(str(model), "config.json")
    return Path(cached) if isinstance(cached, str) else None


def check_context_length(model: Any, max_model_len: int, setting: str = "rollout.max_model_len") -> None:
    """``max_model_len`` tokens fit the model's ``max_position_embeddings`` (vLLM refuses it after loading)."""
    import json

    file = model_config_file(model)
    if file is None:
        return
    try:
        limit = json.loads(file.read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return
    if isinstance(limit, int | float) and not isinstance(limit, bool) and max_model_len > limit:
        limit = int(limit)  # some configs write it as a float (the packaged SmolLM2: 8192.0)
        raise PreflightError(
            f"{setting}={max_model_len} exceeds the model's max_position_embeddings ({limit}, {file}); "
            f"set {setting} <= {limit}"
        )


def check_model(model: Any, setting: str = "model") -> None:
    """The model reference resolves without a download this machine cannot make (see the module docstring)."""
    from llmrl_core.model_store import DEFAULT_MODEL_ALIASES

    if model is None or (isinstance(model, str) and model.lower() in DEFAULT_MODEL_ALIASES):
        return
    text = str(model)
    path = Path(text).expanduser()
    looks_like_path = text.startswith(("/", ".", "~")) or os.sep + os.sep in text or text.count("/") > 1
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PreflightError(f"{setting}: {path} is a folder but has no config.json (not a Hugging Face model)")
        check_model_files(path, setting)
        return
    if path.exists():
        raise PreflightError(f"{setting}: {path} is a file; give the model's folder (the one with config.json)")
    if looks_like_path:
        raise PreflightError(f"{setting}: {text!r}: no such folder (give a model folder, a hub id, or 'default')")
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover (transformers depends on it)
        return
    cached = try_to_load_from_cache(text, "config.json")
    if isinstance(cached, str):
        return
    if _offline():
        raise PreflightError(
            f"{setting}: {text!r} is neither a local folder nor a model in the Hugging Face cache, and this "
            "machine is offline (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); download it where there is a network "
            "(`huggingface-cli download`) or use 'default' (the packaged SmolLM2-135M)"
        )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


def check_model_files(path: Path, setting: str = "model") -> None:
    """A local model folder is complete: a tokenizer, weights, and every safetensors file whole (safetensors opens
    it: its header reads and the file covers every tensor), so a folder copied in part is refused here, not after
    the workers started loading it."""
    import json

    from safetensors import SafetensorError, safe_open

    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise PreflightError(
            f"{setting}: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); copy the model's tokenizer "
            "files into the folder (`tokenizer.save_pretrained(folder)`)"
        )
    shards = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            wanted = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise PreflightError(f"{setting}: {index} is not a readable safetensors index ({err})") from err
        missing = [name for name in wanted if not (path / name).is_file()]
        if missing:
            raise PreflightError(f"{setting}: {path} lacks {missing[:3]} (listed in {index.name})")
    if not shards and not any(path.glob("pytorch_model*.bin")) and not any(path.glob("*.pt")):
        raise PreflightError(f"{setting}: {path} has no weights (no *.safetensors or pytorch_model*.bin)")
    for shard in shards:  # opening reads the header and checks that the file covers every tensor it lists
        try:
            with safe_open(str(shard), framework="numpy"):
                pass
        except (SafetensorError, OSError) as err:
            raise PreflightError(
                f"{setting}: {shard} does not open as safetensors ({err}): the file is truncated or damaged; copy "
                "it again"
            ) from err


def source_rows(
    source: str, setting: str, limit: int = FIRST_ROWS, env_options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The first ``limit`` rows of a data source string (clear errors for unknown schemes, bad files, no rows);
    ``env_options``: the run's ``env.args`` (behind ``reasoning_gym:`` sources)."""
    return _opened(source, setting, limit, env_options)[0]


def _opened(
    source: str, setting: str, limit: int = FIRST_ROWS, env_options: Mapping[str, Any] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """:func:`source_rows`, and how many rows the source has."""
    from llmrl_core.builtin_data.sources import resolve_source
    from llmrl_core.envs.data_sources import open_source

    if not isinstance(source, str) or not source:
        raise PreflightError(f"{setting}: expected a source name or a file path, got {source!r}")
    if "://" in source:
        raise PreflightError(
            f"{setting}: {source!r}: remote sources are not read here (no downloads at run time); save the rows "
            "as a local .jsonl/.parquet file, or use gsm8k:train, arithmetic:train, ifeval, guess_number:train"
        )
    try:
        resolved = resolve_source(source, env_options)
        rows = open_source(resolved)
        count = len(rows)
        first = [rows[i] for i in range(min(limit, count))]
    except (OSError, ValueError, TypeError) as err:
        raise PreflightError(f"{setting}: {err}") from err
    if count == 0:
        raise PreflightError(f"{setting}: {source!r} has no rows")
    return first, count


def check_rows(rows: Iterable[dict[str, Any]], fields: Iterable[str], where: str) -> None:
    """Each row has each field as a non-empty string; the error names the row (counted from 0, and as the n-th row,
    which is the line of a .jsonl file without blank lines) and the field."""
    for index, row in enumerate(rows):
        which = f"row {index} (the {ordinal(index + 1)} row)"
        for name in fields:
            if name not in row:
                raise PreflightError(f"{where}: {which} has no field {name!r} (fields: {sorted(row)})")
            value = row[name]
            if not isinstance(value, str) or not value.strip():
                raise PreflightError(
                    f"{where}: {which} field {name!r} must be a non-empty string, got "
                    f"{type(value).__name__} {value!r:.60}"
                )


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def env_fields(env: Any) -> tuple[str, ...]:
    """The row fields the run's env reads: its prompt field, and ``answer`` for the answer-checking built-ins."""
    if env.factory is not None or getattr(env, "verifiers", None):  # a verifiers env may have no answers
        return (env.prompt_field,)
    answered = ("gsm8k", "arithmetic", "gsm8k_python", "arithmetic_python", "arithmetic_mcp", "reasoning_gym")
    if env.name in (*answered, "countdown"):
        return (env.prompt_field, "answer")
    return (env.prompt_field,)


def held_out_source(env_name: str | None, eval_source: str) -> str:
    """The held-out source an evaluation of a run in env ``env_name`` reads: IFEval's own prompts for the ifeval
    env, else the task's ``eval_source`` (one rule for the evaluate flow and a GRPO run's final evaluation)."""
    return "ifeval" if env_name == "ifeval" else eval_source


def final_eval_source(cfg: Any) -> str:
    """The held-out source a GRPO run's final evaluation reads."""
    return held_out_source(cfg.env.name, cfg.task.eval_source)


def check_source(source: str, fields: Iterable[str], setting: str, env_options: Mapping[str, Any] | None = None) -> int:
    """The source opens, has rows, and its first rows carry ``fields`` as non-empty strings; its number of rows."""
    rows, count = _opened(source, setting, env_options=env_options)
    check_rows(rows, tuple(fields), f"{setting} {source!r}")
    return count


TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "databricks", "databricks-uc", "uc", "postgresql", "mysql",
                    "mssql", "postgresql+psycopg2", "mysql+pymysql")  # fmt: skip


def check_tracking_uri(uri: Any, setting: str = "tracking_uri") -> None:
    """A tracking URI MLflow can open: a path, or one of :data:`TRACKING_SCHEMES`."""
    if uri is None:
        return
    text = str(uri)
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if scheme and scheme.lower() not in TRACKING_SCHEMES:
        raise PreflightError(
            f"{setting}={text!r}: MLflow has no tracking store for the scheme {scheme!r} "
            f"(use a path, or one of {', '.join(TRACKING_SCHEMES[:6])}, ...)"
        )


def _writable_folder(path: Path, setting: str) -> None:
    """``path`` exists as a folder this user can write, or could be created (its nearest existing parent is)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise PreflightError(f"{setting}={str(path)!r}: {existing} is a file, not a folder")
    where = "it" if existing == path else f"its parent {existing}"
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PreflightError(f"{setting}={str(path)!r}: {where} is not writable by this user; choose another folder")
    import tempfile

    try:  # a file made and removed at once: root passes os.access even where nothing can be written (/proc, ro mounts)
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".llmrl-write-probe-"):
            pass
    except OSError as err:
        raise PreflightError(
            f"{setting}={str(path)!r}: {where} cannot hold a new file ({err.strerror or err}); choose another folder"
        ) from err


def check_runs_dir(runs_dir: Any, setting: str = "runs_dir") -> None:
    """A local ``runs_dir`` is a folder this user can write (or create); a remote one (``s3://...``) names a
    filesystem that can be opened (every flow keeps its workers' data there: trajectories, staging, prepared
    training sets, checkpoints, trainer state)."""
    text = str(runs_dir or "")
    if not text:
        return
    if "://" not in text or text.startswith("file://"):
        _writable_folder(Path(text.removeprefix("file://")).expanduser(), setting)
        return
    import pyarrow as pa
    import pyarrow.fs as pafs

    from llmrl_core.uris import split_s3_timeouts

    try:
        pafs.FileSystem.from_uri(split_s3_timeouts(text)[0])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OSError) as arrow_err:
        try:
            import fsspec

            fsspec.core.url_to_fs(text)
        except Exception as err:
            raise PreflightError(
                f"{setting}={text!r}: cannot open this filesystem URI (pyarrow: {arrow_err}; fsspec: {err})"
            ) from err


def check_dask_address(address: Any, setting: str = "dask.address", timeout: float = 3.0) -> None:
    """A scheduler answers at ``address`` (a TCP connection within ``timeout`` seconds): an address with nothing
    behind it is said in one line before the run writes or starts anything (Dask itself retries for its connect
    timeout, then fails inside the flow)."""
    import socket
    from urllib.parse import urlsplit

    if not address:
        return
    text = str(address)
    parts = urlsplit(text if "://" in text else f"tcp://{text}")
    if parts.scheme not in ("tcp", "tls"):
        return  # inproc://, ucx://: nothing to probe from here
    try:
        host, port = parts.hostname, parts.port
    except ValueError as err:
        raise PreflightError(f"{setting}={text!r}: not a host:port address ({err})") from err
    if not host or port is None:
        raise PreflightError(f"{setting}={text!r}: give the scheduler's host and port, e.g. tcp://10.0.0.5:8786")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        raise PreflightError(
            f"{setting}={text!r}: no Dask scheduler answers there ({err.strerror or err}); start one (`dask "
            "scheduler`) and its workers, or leave dask.address unset for a local cluster"
        ) from err


def check_grpo_training(cfg: Any) -> None:
    """Settings under which GRPO would run and learn nothing: one sample per group (every advantage is 0), a
    micro-batch budget smaller than one answer."""
    if cfg.data.group_size < 2:
        raise PreflightError(
            f"data.group_size={cfg.data.group_size}: GRPO compares the answers of a group, so it needs at least 2 "
            "(with 1 every advantage is 0 and nothing is learned); use `llmrl run collect` to only sample"
        )
    if cfg.train.token_budget <= cfg.rollout.max_new_tokens:
        raise PreflightError(
            f"train.token_budget={cfg.train.token_budget} cannot hold one sequence (its prompt plus up to "
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} answer tokens): raise train.token_budget"
        )


def preflight(cfg: Any, *, training: bool = True) -> None:
    """Check a run config of any flow (GRPO/collect, SFT, offline) before the flow starts anything.

    ``training=False`` (the collect flow): a GRPO config that only samples, so its group size and token budget
    need not allow a training step."""
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from llmrl_core.pipeline.offline_config import OfflineConfig
    from llmrl_core.pipeline.sft_config import SFTConfig

    check_run_id(cfg.run_id)
    check_model(cfg.model)
    check_runs_dir(cfg.runs_dir)
    check_tracking_uri(getattr(cfg, "tracking_uri", None))
    check_dask_address(getattr(getattr(cfg, "dask", None), "address", None))
    if isinstance(cfg, GRPOConfig):
        check_context_length(cfg.model, cfg.rollout.max_model_len)
        if training:
            check_grpo_training(cfg)
        rows = check_source(cfg.data.source, env_fields(cfg.env), "data.source", cfg.env.options)
        if rows < cfg.data.prompts_per_iteration:
            raise PreflightError(
                f"data.prompts_per_iteration={cfg.data.prompts_per_iteration} is more than data.source "
                f"{cfg.data.source!r} has ({rows} rows): a batch would hold the same prompt twice; set "
                f"data.prompts_per_iteration <= {rows} (data.group_size sets how often each prompt is sampled)"
            )
        if training and cfg.final_eval.questions > 0:  # read after training: a bad one would cost the whole run
            check_source(final_eval_source(cfg), env_fields(cfg.env), "task.eval_source", cfg.env.options)
    elif isinstance(cfg, SFTConfig):
        if cfg.source == "dataset":
            rows = source_rows(cfg.data.source, "data.source")
            key = cfg.data.messages_key
            plain = [r for r in rows if key not in r]
            check_rows(plain, ("question", "answer"), f"data.source {cfg.data.source!r} (rows without {key!r})")
        else:
            check_run_id(cfg.trajectories.run_id, "trajectories.run_id")
    elif isinstance(cfg, OfflineConfig):
        check_run_id(cfg.source.run_id, "source.run_id")
