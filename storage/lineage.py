"""Lineage in MLflow: which data, config, code and parent weights produced each policy version.

Mapping onto MLflow:

- one **experiment** per pipeline (``grpo``, ``sft``...), one **run** per training run, found again by
  the tag ``llmrl_run_id`` (re-opening a run after a crash resumes the same MLflow run);
- the run carries the config (flattened params, ``config.json`` artifact, ``llmrl_config_hash`` tag)
  and the code version (``mlflow.source.git.commit`` plus ``llmrl_git_dirty``);
- per-iteration metrics use ``step = policy_version``;
- every trajectory partition and training dataset is a run **input** (``log_inputs``) with its
  digest, source URI and a ``policy_version`` input tag; nothing is copied;
- every policy version is an MLflow **LoggedModel** named ``policy`` whose tags say ``policy_version``,
  ``parent_version``, checkpoint URI and sha256, config hash, git commit and the data it was trained
  on; optionally also a registered model version with the alias ``policy_v<N>``. The weights stay in
  the checkpoint store (the manifest is attached as a model artifact, not the 0.5 GB file).
- a JSON document per version (``lineage/policy_version=<N>.json`` in the run's artifacts) holds the
  whole answer for ``llmrl lineage RUN --version N`` (see :mod:`storage.lineage_query`).

The default tracking store is one per runs root, shared by every run under it (so one MLflow UI shows
them all: ``llmrl ui``): ``sqlite:///<runs root>/mlflow.db`` with artifacts in ``<runs root>/mlartifacts``.
A run recorded before that (its own ``<run_dir>/mlflow.db``) keeps its store. :class:`LineageConfig` names
any other tracking URI (a server for many concurrent runs: sqlite serialises writers). Everything goes
through an explicit ``MlflowClient`` (no global MLflow state), so several recorders can coexist in
one process. Record lineage from one process (the flow), not from many Dask workers: sqlite
serialises writers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import (  # noqa: E402
    Dataset,
    DatasetInput,
    InputTag,
    LoggedModelStatus,
    Metric,
    Param,
    Run,
    RunTag,
    ViewType,
)
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_GIT_COMMIT, MLFLOW_RUN_NAME  # noqa: E402

from storage.checkpoints import CheckpointManifest  # noqa: E402
from storage.hashing import canonical_json, config_hash, file_sha256  # noqa: E402
from storage.trajectories import TrajectoryStore, check_name  # noqa: E402

RUN_TAG = "llmrl_run_id"
PIPELINE_TAG = "llmrl_pipeline"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CONFIG_HASH_TAG = "llmrl_config_hash"
MAX_PARAM_LEN = 6000


class LineageError(RuntimeError):
    """Lineage cannot be recorded or found (unknown run or version, conflicting config)."""


@dataclasses.dataclass
class LineageConfig:
    """Where lineage goes: a tracking URI (default: sqlite under the run dir) and optional registry name."""

    tracking_uri: str | None = None
    artifact_location: str | None = None
    registry_uri: str | None = None
    registered_model: str | None = None


@dataclasses.dataclass(frozen=True)
class DataRef:
    """A dataset input as recorded: name, digest, source URI, rows, and the policy version it came from."""

    name: str
    digest: str
    source: str
    kind: str
    num_rows: int | None = None
    policy_version: int | None = None


def tracking_root(run_dir: str | os.PathLike[str]) -> Path:
    """The folder holding the default MLflow store of ``run_dir``: its runs root, or the run dir itself for a
    run recorded with a per-run store (``<run_dir>/mlflow.db``, before the store was shared)."""
    run_dir = Path(run_dir).expanduser().absolute()
    return run_dir if (run_dir / "mlflow.db").is_file() else run_dir.parent


def default_tracking_uri(run_dir: str | os.PathLike[str]) -> str:
    """``sqlite:///<runs root>/mlflow.db``: one store for every run under the runs root (see :func:`tracking_root`)."""
    return f"sqlite:///{tracking_root(run_dir) / 'mlflow.db'}"


def default_artifact_location(run_dir: str | os.PathLike[str]) -> str:
    """``file://<runs root>/mlartifacts`` (MLflow keeps each run's artifacts under its own run uuid there)."""
    return (tracking_root(run_dir) / "mlartifacts").as_uri()


def git_state(path: str | os.PathLike[str] | None = None) -> tuple[str | None, bool | None]:
    """(commit sha, dirty) of the git checkout holding ``path`` (default: this code); (None, None) without git."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, (bool(status) if status is not None else None)


def flatten_config(config: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a (nested) config into ``a.b.c -> value`` strings for MLflow params."""
    data = json.loads(canonical_json(config))
    flat: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else k)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[key or "config"] = text[:MAX_PARAM_LEN]

    walk(data, prefix)
    return flat


def _source_type(uri: str) -> str:
    if "://" not in uri:
        return "local"
    scheme = uri.split("://", 1)[0]
    return "local" if scheme == "file" else scheme


def _now_ms() -> int:
    return int(time.time() * 1000)


class LineageRecorder:
    """Record a training run's lineage in MLflow (see the module docstring for the mapping).

    ``LineageRecorder(run_dir, pipeline="grpo", run_id="gsm8k-001", config=cfg)`` creates or resumes the
    run; use it as a context manager or call :meth:`end`. A resume with a config of another hash is a
    :class:`LineageError`, unless ``new_run`` says the run has no published version (an earlier attempt failed
    before publishing, or its folder was removed): that attempt's MLflow run is then deleted (restorable with
    ``mlflow runs restore``; :attr:`replaced_run` names it) and a new one recorded.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        pipeline: str,
        run_id: str,
        config: Any = None,
        lineage_config: LineageConfig | None = None,
        code_dir: str | os.PathLike[str] | None = None,
        accepted_hashes: Collection[str] = (),
        new_run: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.settings = lineage_config or LineageConfig()
        self.tracking_uri = self.settings.tracking_uri or default_tracking_uri(self.run_dir)
        if self.tracking_uri.startswith("sqlite:///"):
            Path(self.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.settings.registry_uri)
        self.pipeline = pipeline
        self.run_id = check_name(run_id, "run id")
        self.experiment_id = self._experiment(pipeline)
        self.git_commit, self.git_dirty = git_state(code_dir)
        self.config_hash = config_hash(config) if config is not None else None
        # what an older llmrl recorded for the same settings (e.g. before a setting left the hash): a resume
        self.accepted_hashes = frozenset(accepted_hashes)
        # a run with no published version: an MLflow run of an earlier attempt with other settings is replaced
        self.new_run = new_run
        self.replaced_run: str | None = None  # the MLflow run id it replaced (deleted; ``mlflow runs restore``)
        self.mlflow_run_id = self._open_run(config)
        self.forked_from: dict[str, Any] | None = None  # set by mark_fork: the run and version this run started from

    # ----------------------------------------------------------------- run set-up
    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if EXPERIMENT_KIND_TAG not in found.tags:  # created by an older llmrl
                self.client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, "custom_model_development")
            return found.experiment_id
        location = self.settings.artifact_location
        if location is None and self.settings.tracking_uri is None:
            location = default_artifact_location(self.run_dir)
        try:
            # the kind tag opens the experiment in MLflow 3's training-runs view (not the GenAI traces view)
            tags = {PIPELINE_TAG: name, EXPERIMENT_KIND_TAG: "custom_model_development"}
            return self.client.create_experiment(name, artifact_location=location, tags=tags)
        except MlflowException:  # created concurrently
            return self.client.get_experiment_by_name(name).experiment_id

    def _open_run(self, config: Any) -> str:
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.{RUN_TAG} = '{self.run_id}'")
        previous = runs[0].data.tags.get(CONFIG_HASH_TAG) if runs else None
        if self.config_hash and previous and previous != self.config_hash and previous not in self.accepted_hashes:
            if not self.new_run:
                raise LineageError(
                    f"run {self.run_id!r} was recorded with config hash {previous}, now {self.config_hash}: "
                    "a changed config needs a new run id"
                )
            # nothing of that attempt was published (its folder may be gone): its record makes way for this one
            self.replaced_run = runs[0].info.run_id
            self.client.set_tag(self.replaced_run, "llmrl_replaced_by_config", self.config_hash)
            self.client.delete_run(self.replaced_run)
            runs = []
        if runs:
            run = runs[0]
            self.config_hash = self.config_hash or previous  # resumed without a config: keep the recorded one
            self.client.update_run(run.info.run_id, status="RUNNING")
            run_uuid = run.info.run_id
        else:
            tags = {RUN_TAG: self.run_id, PIPELINE_TAG: self.pipeline, MLFLOW_RUN_NAME: self.run_id}
            run_uuid = self.client.create_run(self.experiment_id, tags=tags, run_name=self.run_id).info.run_id
        tags = [RunTag("llmrl_run_dir", str(self.run_dir))]
        if self.git_commit:
            tags += [RunTag(MLFLOW_GIT_COMMIT, self.git_commit), RunTag("llmrl_git_dirty", str(self.git_dirty))]
        params: list[Param] = []
        if config is not None and not (runs and runs[0].data.tags.get(CONFIG_HASH_TAG)):
            tags.append(RunTag(CONFIG_HASH_TAG, self.config_hash))
            params = [Param(k[:250], v) for k, v in flatten_config(config).items()]
            self.client.log_text(run_uuid, json.dumps(json.loads(canonical_json(config)), indent=2), "config.json")
        self.client.log_batch(run_uuid, tags=tags)
        for start in range(0, len(params), 100):
            self.client.log_batch(run_uuid, params=params[start : start + 100])
        return run_uuid

    def __enter__(self) -> LineageRecorder:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        stopped = exc_type is not None and (
            issubclass(exc_type, KeyboardInterrupt | SystemExit) or exc_type.__name__ == "TerminationSignal"
        )
        self.end("KILLED" if stopped else "FAILED" if exc_type else "FINISHED")

    def end(self, status: str = "FINISHED") -> None:
        """Mark the MLflow run finished (or FAILED / KILLED)."""
        self.client.set_terminated(self.mlflow_run_id, status=status)

    def mark_fork(self, source_run: str, version: int) -> None:
        """Record that this run starts from version ``version`` of ``source_run``: every lineage record names the
        fork point, the run is tagged with it and becomes a child of the source's MLflow run (when that run is in
        this tracking store)."""
        self.forked_from = {"run_id": source_run, "policy_version": version}
        tags = {"llmrl.forked_from": f"{source_run}@{version}"}
        try:
            tags["mlflow.parentRunId"] = find_run(self.client, source_run).info.run_id
        except LineageError:
            pass  # the source's lineage lives in another tracking store: the tag alone names it
        self.set_tags(tags)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tag the run (e.g. the dtype and device each stage resolved to on this hardware)."""
        for key, value in tags.items():
            self.client.set_tag(self.mlflow_run_id, key, str(value))

    # ----------------------------------------------------------------- per iteration
    def log_metrics(self, policy_version: int, metrics: Mapping[str, float]) -> None:
        """Log an iteration's metrics with ``step = policy_version``."""
        now = _now_ms()
        batch = [Metric(k, float(v), now, int(policy_version)) for k, v in metrics.items()]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.mlflow_run_id, metrics=batch[start : start + 1000])

    def _log_input(self, ref: DataRef, context: str, extra_tags: Mapping[str, str] | None = None) -> None:
        entity = Dataset(
            name=ref.name,
            digest=ref.digest[:36],
            source_type=_source_type(ref.source),
            source=json.dumps({"uri": ref.source}),
            profile=json.dumps({"num_rows": ref.num_rows}) if ref.num_rows is not None else None,
        )
        tags = [InputTag(MLFLOW_DATASET_CONTEXT, context), InputTag("llmrl_kind", ref.kind)]
        if ref.policy_version is not None:
            tags.append(InputTag("policy_version", str(ref.policy_version)))
        tags += [InputTag(k, str(v)) for k, v in (extra_tags or {}).items()]
        self.client.log_inputs(self.mlflow_run_id, datasets=[DatasetInput(dataset=entity, tags=tags)])

    def log_trajectory_partition(
        self,
        store: TrajectoryStore,
        policy_version: int,
        *,
        run_id: str | None = None,
        context: str = "training",
        shard_prefix: str | None = None,
    ) -> DataRef:
        """Record one (run, policy_version) trajectory partition as a run input: digest, source, rows (only the
        shards named ``shard_prefix*`` when given: one training batch of an asynchronous run)."""
        run_id = run_id or self.run_id
        digest, rows, shards = store.partition_digest(run_id, policy_version, shard_prefix)
        if not shards:
            raise LineageError(f"no trajectory shards for run {run_id!r}, policy_version {policy_version} in {store}")
        batch = f"/{shard_prefix}*" if shard_prefix else ""
        ref = DataRef(
            name=f"trajectories/{run_id}/policy_version={policy_version}{batch}",
            digest=digest,
            source=store.partition_uri(run_id, policy_version),
            kind="trajectories",
            num_rows=rows,
            policy_version=policy_version,
        )
        self._log_input(ref, context, {"num_shards": str(len(shards))})
        return ref

    def log_training_dataset(
        self,
        source: str | os.PathLike[str],
        *,
        name: str | None = None,
        digest: str | None = None,
        num_rows: int | None = None,
        context: str = "training",
    ) -> DataRef:
        """Record a prompt / SFT dataset (local file, URI or hub id); a local file's digest is its sha256."""
        source = os.fspath(source)
        if digest is None:
            path = Path(source)
            if not path.is_file():
                raise LineageError(f"give a digest for {source!r}: it is not a local file to hash")
            digest = file_sha256(path)
            source = str(path.absolute())
        ref = DataRef(name=name or Path(source).name, digest=digest, source=source, kind="dataset", num_rows=num_rows)
        self._log_input(ref, context)
        return ref

    def log_version(
        self,
        policy_version: int,
        *,
        checkpoint: CheckpointManifest | None = None,
        checkpoint_uri: str | None = None,
        parent_version: int | None = None,
        data: Sequence[DataRef] = (),
        params: Mapping[str, Any] | None = None,
        iteration_config: Any = None,
        metrics: Mapping[str, float] | None = None,
        weights_fingerprints: Mapping[str, str] | None = None,
    ) -> str:
        """Record what produced ``policy_version``: a LoggedModel + the lineage JSON; returns the model id.

        ``parent_version`` defaults to the checkpoint manifest's; ``iteration_config`` (if it differs
        from the run config) gets its own hash; ``params`` are this iteration's settings;
        ``weights_fingerprints``: the weights' fingerprint in each engine dtype (which the engines were checked to
        hold; independent of the checkpoint file's bytes, unlike its sha256).
        """
        if checkpoint is not None and checkpoint.policy_version != policy_version:
            raise LineageError(f"checkpoint is version {checkpoint.policy_version}, not {policy_version}")
        if parent_version is None and checkpoint is not None:
            parent_version = checkpoint.parent_version
        version_hash = config_hash(iteration_config) if iteration_config is not None else self.config_hash
        for stale in self._model_ids(policy_version):  # a re-run of this version replaces its record
            self.client.delete_logged_model(stale)
        parent_model = self.find_model_id(parent_version) if parent_version is not None else None
        record = {
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "mlflow_run_id": self.mlflow_run_id,
            "policy_version": policy_version,
            "parent_version": parent_version,
            "parent_model_id": parent_model,
            "config_hash": version_hash,
            "git_commit": self.git_commit,
            "git_dirty": self.git_dirty,
            "params": {k: str(v) for k, v in (params or {}).items()},
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            "data": [dataclasses.asdict(ref) for ref in data],
            "checkpoint": dataclasses.asdict(checkpoint) if checkpoint is not None else None,
            "checkpoint_uri": checkpoint_uri,
            "weights_fingerprints": dict(weights_fingerprints or {}),
            "forked_from": self.forked_from,
            "recorded_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        tags = {
            RUN_TAG: self.run_id,
            "policy_version": str(policy_version),
            "parent_version": "" if parent_version is None else str(parent_version),
            CONFIG_HASH_TAG: version_hash or "",
            "git_commit": self.git_commit or "",
            "checkpoint_uri": checkpoint_uri or "",
            "checkpoint": "kept" if checkpoint_uri else "",  # "pruned" once keep_checkpoints deleted it (mark_pruned)
            "checkpoint_sha256": checkpoint.sha256 if checkpoint else "",
            "weights_fingerprint": ",".join(f"{d}:{f}" for d, f in sorted((weights_fingerprints or {}).items())),
            "parent_model_id": parent_model or "",
            "trained_on": json.dumps([ref.name for ref in data])[:7000],
        }
        model = self.client.create_logged_model(
            self.experiment_id,
            name=f"{self.run_id}-v{policy_version}",  # the MLflow UI lists models by name: say which version
            source_run_id=self.mlflow_run_id,
            tags=tags,
            params={k[:250]: v[:MAX_PARAM_LEN] for k, v in record["params"].items()},
            model_type="llmrl-policy",
        )
        record["model_id"] = model.model_id
        text = json.dumps(record, indent=2, sort_keys=True)
        self.client.log_text(self.mlflow_run_id, text, version_artifact_path(policy_version))
        if checkpoint is not None:
            self._attach_manifest(model.model_id, checkpoint)
        self.client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        if metrics:
            now = _now_ms()
            batch = [Metric(k, float(v), now, policy_version, model_id=model.model_id) for k, v in metrics.items()]
            self.client.log_batch(self.mlflow_run_id, metrics=batch)
        if self.settings.registered_model:
            self._register(model.model_id, model.artifact_location, policy_version)
        return model.model_id

    def _attach_manifest(self, model_id: str, checkpoint: CheckpointManifest) -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "checkpoint_manifest.json").write_text(checkpoint.to_json(), encoding="utf-8")
            self.client.log_model_artifacts(model_id, folder)

    def _register(self, model_id: str, artifact_location: str, policy_version: int) -> None:
        name = self.settings.registered_model
        try:
            self.client.create_registered_model(name, tags={PIPELINE_TAG: self.pipeline})
        except MlflowException as err:
            if "already exists" not in str(err).lower():
                raise
        tags = {RUN_TAG: self.run_id, "policy_version": str(policy_version), "llmrl_model_id": model_id}
        # The source is the model's artifact location, not "models:/<id>": MLflow's sqlite registry
        # resolves a models:/ URI with the *global* tracking URI (an MLflow TODO), not this client's.
        version = self.client.create_model_version(
            name, artifact_location, run_id=self.mlflow_run_id, tags=tags, model_id=model_id
        )
        self.client.set_registered_model_alias(name, f"policy_v{policy_version}", version.version)

    def _model_ids(self, policy_version: int) -> list[str]:
        models = self.client.search_logged_models(
            [self.experiment_id],
            filter_string=f"tags.{RUN_TAG} = '{self.run_id}' AND tags.policy_version = '{policy_version}'",
        )
        return [m.model_id for m in models]

    def mark_pruned(self, kept: Iterable[int]) -> list[int]:
        """Tag this run's logged models whose checkpoint is gone (not in ``kept``: pruned by ``keep_checkpoints``)
        ``checkpoint: pruned``, so the MLflow UI and ``llmrl lineage`` do not point at a deleted file as if it were
        there; returns the versions newly marked."""
        kept, marked, token = set(kept), [], None
        while True:  # the models still marked kept (at most keep_checkpoints plus the keep_every ones), page by page
            page = self.client.search_logged_models(
                [self.experiment_id],
                filter_string=f"tags.{RUN_TAG} = '{self.run_id}' AND tags.checkpoint = 'kept'",
                page_token=token,
            )
            for model in page:
                version = (model.tags or {}).get("policy_version", "")
                if version.isdigit() and int(version) not in kept:
                    self.client.set_logged_model_tags(model.model_id, {"checkpoint": "pruned"})
                    marked.append(int(version))
            token = page.token
            if not token:
                return sorted(marked)

    def find_model_id(self, policy_version: int) -> str | None:
        """The LoggedModel id recorded for a policy version of this run (None when not recorded)."""
        found = self._model_ids(policy_version)
        return found[0] if found else None


def find_run(client: MlflowClient, run_id: str) -> Run:
    """The MLflow run of an llmrl run id, in any experiment (the newest if there are several)."""
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if experiments:
        runs = client.search_runs(experiments, filter_string=f"tags.{RUN_TAG} = '{run_id}'", max_results=1)
        if runs:
            return runs[0]
    raise LineageError(f"no MLflow run for llmrl run {run_id!r} at {client.tracking_uri}")


def version_artifact_path(policy_version: int) -> str:
    """Run artifact path of a version's lineage JSON."""
    return f"lineage/policy_version={policy_version:06d}.json"
