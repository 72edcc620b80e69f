#!/usr/bin/env python3
"""The wheels the borrowed GPU machine lacks, for its python3 (CPython 3.12, manylinux x86_64), in one folder.

    python scripts/gpu_wheels.py [--dest .gpu_wheels]        # here, with a package registry: download, check, size
    python scripts/gpu_wheels.py --verify SITE                # anywhere: each distribution installed in SITE (a
                                                              # pip --target folder) has what it requires

That machine (see scripts/gpu_check.sh) has no network; its python3 holds torch, transformers, numpy, pandas,
pyarrow, scipy, matplotlib, tokenizers, pytest, pyyaml, requests, ... (``DEVICE_HAS``: the names this kit relies
on, from the machine's package list) but not hydra-core, omegaconf, wandb, datasets, msgspec, submitit or the
Hydra launchers. ``PINS`` names every wheel of the kit: the project's dependencies that machine lacks and
everything they need that it lacks too, each at the version tested here with the project (the .venv), plus

  * typing-extensions and protobuf, which it has, but maybe older than pydantic-core (>= 4.16) and
    googleapis-common-protos (>= 6.33.5) need: small, and newer versions of both read older code;
  * pytest, pluggy and iniconfig: a known pytest (>= 8, the test extra's pin), run with
    PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 so that the machine's own pytest plugins stay out.

Downloads are binary only (``--only-binary=:all:``, ``--no-deps``: each dependency is named here), for
CPython 3.12 on manylinux_2_17 .. 2_28 x86_64 (that machine's torch wheel is manylinux_2_28, so its glibc is at
least 2.28). antlr4-python3-runtime 4.9.3 (omegaconf 2.3's and hydra-core 1.3's, ``==4.9.*``) exists only as an
sdist: it is built here into a pure-Python wheel with ``pip wheel``. omegaconf is pinned to 2.3.x: an unpinned
one is 2.4, outside the project's pin (and hydra-core 1.3's, ``<2.4``).

The folder is built anew in a temporary folder and then moved into place, so it never holds two versions of a
package (two stop the whole install there). Before the move: one wheel per pin, at the pinned version,
installable by CPython 3.12 / manylinux x86_64; after it, the folder's size and what travels to the machine
(this checkout's tracked and untracked-not-ignored files plus the folder) against the tool's 64 MiB. Exit 0
when all hold, 1 when a check fails, 2 on bad arguments. ``--verify``: 0 when every requirement is met, else 1.
When pyproject.toml's ranges or the versions in .venv move, update PINS: tests/test_gpu_kit.py names what no
longer fits.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".gpu_wheels"
MANIFEST = "KIT.txt"
TRAVEL_LIMIT = 64 * 2**20  # the device tool's limit on the working tree plus carried paths
TRAVEL_MARGIN = 4 * 2**20  # room for the work of others in the same checkout
PYTHON = (3, 12)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(28, 16, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]

# name -> version: the kit. Versions as tested with the project in .venv; pyproject.toml's ranges hold for the
# project's own (tests/test_gpu_kit.py checks both, and that each wheel's requirements are here or in DEVICE_HAS).
PINS = {
    # the project's dependencies (pyproject.toml) the machine lacks
    "hydra-core": "1.3.8",
    "omegaconf": "2.3.1",
    "hydra-joblib-launcher": "1.2.0",
    "hydra-submitit-launcher": "1.2.0",
    "wandb": "0.31.0",
    "msgspec": "0.23.0",
    "datasets": "5.2.0",
    # what those need and the machine lacks
    "antlr4-python3-runtime": "4.9.3",  # sdist only: built here (SDIST_ONLY)
    "submitit": "1.5.4",
    "dill": "0.4.1",
    "multiprocess": "0.70.19",
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "platformdirs": "4.14.9",
    "cwevals": "0.0.1b1",
    "distro": "1.9.0",
    "sniffio": "1.3.1",
    "opentelemetry-api": "1.45.2",
    "opentelemetry-sdk": "1.45.2",
    "opentelemetry-semantic-conventions": "0.66b2",
    "opentelemetry-proto": "1.45.2",
    "opentelemetry-exporter-otlp-proto-http": "1.45.2",
    "opentelemetry-exporter-otlp-proto-common": "1.45.2",
    "opentelemetry-exporter-otlp-common": "0.66b2",
    "opentelemetry-exporter-http-transport": "0.66b2",
    "googleapis-common-protos": "1.76.0",
    # the machine has these, maybe too old for the above
    "typing-extensions": "4.16.0",
    "protobuf": "7.36.2",
    # the test runner, known and alone
    "pytest": "9.2.0",
    "pluggy": "1.7.0",
    "iniconfig": "2.3.1",
}
SDIST_ONLY = {"antlr4-python3-runtime"}

# What the kit's wheels need that the machine's python3 has (its image's package list, read 2026-11-17, and the
# versions a session saw: torch 2.11.0+cu130, transformers 5.17.0, huggingface_hub 1.33.0, tokenizers 0.23.2,
# numpy 2.5.2, safetensors 0.8.0).
DEVICE_HAS = {
    "torch",
    "numpy",
    "pandas",
    "pyarrow",
    "scipy",
    "matplotlib",
    "tokenizers",
    "transformers",
    "safetensors",
    "huggingface-hub",
    "tqdm",
    "pyyaml",
    "packaging",
    "requests",
    "click",
    "cloudpickle",
    "joblib",
    "filelock",
    "fsspec",
    "xxhash",
    "anyio",
    "httpx",
    "pygments",
}


def canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def fail(message: str, code: int = 1) -> None:
    print(f"gpu_wheels: {message}", file=sys.stderr)
    raise SystemExit(code)


def supported_tags() -> set:
    from packaging import tags

    interpreter = f"cp{PYTHON[0]}{PYTHON[1]}"
    return set(tags.cpython_tags(PYTHON, abis=[interpreter, "abi3", "none"], platforms=PLATFORMS)) | set(
        tags.compatible_tags(PYTHON, interpreter, PLATFORMS)
    )


def wheel_problems(folder: Path, pins: dict[str, str]) -> list[str]:
    """Everything wrong with a folder of wheels as the kit for ``pins``: one line per problem."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    ok_tags = supported_tags()
    problems, seen = [], {}
    for path in sorted(folder.glob("*.whl")):
        try:
            name, version, _, wheel_tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename as err:
            problems.append(f"{path.name}: {err}")
            continue
        name = canon(name)
        if name in seen:
            problems.append(f"{name}: two wheels ({seen[name]}, {path.name}); pip there stops on two versions")
        seen[name] = path.name
        if name not in pins:
            problems.append(f"{path.name}: not in PINS")
        elif str(version) != pins[name]:
            problems.append(f"{path.name}: version {version}, pinned {pins[name]}")
        if not wheel_tags & ok_tags:
            problems.append(f"{path.name}: not installable by CPython {PYTHON[0]}.{PYTHON[1]} on manylinux x86_64")
    problems += [f"{name}=={pins[name]}: no wheel" for name in sorted(set(pins) - set(seen))]
    return problems


def travelling_bytes() -> int:
    """Size of what the device tool sends without carry: tracked and untracked-not-ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    paths = {ROOT / p for p in out.decode().split("\0") if p}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command)
    if done.returncode:
        fail(f"pip {args[0]} failed (status {done.returncode}); see pip's output above")


def download(dest: Path) -> int:
    if dest.exists():  # it is replaced whole: only ever a kit
        if not dest.is_dir():
            fail(f"--dest {dest} is a file", 2)
        other = [p.name for p in dest.iterdir() if p.suffix != ".whl" and p.name != MANIFEST]
        if other:
            fail(f"--dest {dest} holds more than a kit ({', '.join(other[:3])}): not replaced", 2)
    binary = [f"{n}=={v}" for n, v in PINS.items() if n not in SDIST_ONLY]
    built = [f"{n}=={v}" for n, v in PINS.items() if n in SDIST_ONLY]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gpu_wheels.", dir=dest.parent) as tmp:
        new = Path(tmp) / "kit"
        target = ["--python-version", f"{PYTHON[0]}.{PYTHON[1]}", "--implementation", "cp"]
        target += [arg for p in PLATFORMS for arg in ("--platform", p)]
        pip("download", "--no-deps", "--only-binary=:all:", *target, "-d", str(new), *binary)
        # pure Python (checked below: its tag must be py3-none-any, which any CPython installs)
        pip("wheel", "--no-deps", "--no-binary=:all:", "-w", str(new), *built)
        for stray in new.iterdir():
            if stray.suffix != ".whl":  # pip wheel can leave the sdist it built from
                stray.unlink()
        problems = wheel_problems(new, PINS)
        if problems:
            fail("the downloaded set is not the kit:\n  " + "\n  ".join(problems))
        wheels = sorted(new.glob("*.whl"))
        lines = [f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.stat().st_size:>9}  {w.name}" for w in wheels]
        (new / MANIFEST).write_text(
            "# sha256, bytes, wheel: written by scripts/gpu_wheels.py; pip install --no-index --no-deps *.whl\n"
            + "\n".join(lines)
            + "\n"
        )
        if dest.exists():
            shutil.rmtree(dest)
        new.rename(dest)
    kit = sum(p.stat().st_size for p in dest.iterdir())
    largest = sorted(dest.glob("*.whl"), key=lambda p: -p.stat().st_size)[:4]
    print(f"gpu_wheels: {len(wheels)} wheels, {kit / 2**20:.1f} MiB in {dest}")
    print("  largest: " + ", ".join(f"{p.name.split('-')[0]} {p.stat().st_size / 2**20:.1f} MiB" for p in largest))
    inside = dest.resolve().is_relative_to(ROOT.resolve())
    if inside:
        try:
            tree = travelling_bytes()
        except (OSError, subprocess.CalledProcessError) as err:
            print(f"  travelling size not checked (git ls-files: {err})")
            return 0
        total = tree + kit
        print(
            f"  travels with carry=[{dest.relative_to(ROOT)!s}]: {total / 2**20:.1f} MiB "
            f"(checkout {tree / 2**20:.1f} + kit {kit / 2**20:.1f}) of {TRAVEL_LIMIT / 2**20:.0f} MiB"
        )
        if total > TRAVEL_LIMIT - TRAVEL_MARGIN:
            fail(f"{total / 2**20:.1f} MiB would travel: over the tool's limit less {TRAVEL_MARGIN >> 20} MiB")
    return 0


def requirement_problems(site: Path) -> tuple[int, list[str]]:
    """Each distribution installed in ``site`` against its requirements (the running python's markers; extras
    not asked for are skipped), resolved over the whole sys.path: one line per requirement not met."""
    from packaging.requirements import Requirement

    dists = list(md.distributions(path=[str(site)]))
    problems = []
    for dist in dists:
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                problems.append(f"{dist.metadata['Name']} {dist.version} needs {req}: not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                problems.append(f"{dist.metadata['Name']} {dist.version} needs {req}: {req.name} {have} found")
    return len(dists), problems


def verify(site: Path) -> int:
    if not site.is_dir():
        fail(f"--verify {site}: no such folder", 2)
    try:
        count, problems = requirement_problems(site)
    except ImportError:  # packaging: on that machine, as on any with pip's dependencies installed
        print("gpu_wheels: packaging is not importable here: requirements not checked")
        return 1
    for line in problems:
        print(f"gpu_wheels: requirement not met: {line}")
    verdict = f"{len(problems)} requirements not met" if problems else "every requirement met"
    print(f"gpu_wheels: {count} distributions in {site}; {verdict}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEST, help="the kit's folder (default: .gpu_wheels/)")
    parser.add_argument("--verify", type=Path, metavar="SITE", help="check the distributions installed in SITE")
    a = parser.parse_args(argv)
    if a.verify is not None:
        return verify(a.verify)
    if os.environ.get("PIP_NO_INDEX"):
        fail("PIP_NO_INDEX is set: the download needs a package registry", 2)
    return download(a.dest)


if __name__ == "__main__":
    sys.exit(main())
