"""The GPU machine's kit (scripts/gpu_wheels.py) and scripts/gpu_check.sh, as far as a CPU can check them without
the network: the pins against pyproject.toml's ranges and against each other's requirements, the folder checks,
and gpu_check.sh's "project not importable -> install the kit offline" branch against a one-wheel fake kit, with
everything it writes under its output folder. The real download (~26 MiB) is not run here."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

_spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "scripts" / "gpu_wheels.py")
kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kit)

# the GPU machine, for requirement markers: CPython 3.12 on Linux x86_64
MACHINE = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


def needs(requirements: list[str] | None) -> list[Requirement]:
    out = [Requirement(r) for r in requirements or []]
    return [r for r in out if r.marker is None or r.marker.evaluate(MACHINE)]


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pins_cover_the_projects_dependencies_within_their_ranges():
    """Every runtime dependency in pyproject.toml is on the machine (DEVICE_HAS) or pinned in the kit, inside the
    project's range (omegaconf 2.3.x, not the 2.4 an unpinned download takes); the kit's pytest meets the test
    extra's; every pin's name is canonical and no pin is also listed as the machine's own without a reason."""
    project = pyproject()["project"]
    for line in project["dependencies"]:
        req = Requirement(line)
        name = kit.canon(req.name)
        assert name in kit.PINS or name in kit.DEVICE_HAS, f"{line}: neither pinned in the kit nor on the machine"
        if name in kit.PINS:
            assert req.specifier.contains(kit.PINS[name], prereleases=True), (line, kit.PINS[name])
    tests = {kit.canon(Requirement(r).name): Requirement(r) for r in project["optional-dependencies"]["test"]}
    assert tests["pytest"].specifier.contains(kit.PINS["pytest"])
    assert kit.PINS["omegaconf"].startswith("2.3.")
    assert all(kit.canon(n) == n for n in kit.PINS)
    assert set(kit.PINS) & kit.DEVICE_HAS == set()
    assert kit.SDIST_ONLY.issubset(kit.PINS)


def test_each_pinned_wheel_needs_only_the_kit_or_the_machine():
    """The kit is closed: each pin's requirements (for CPython 3.12 on Linux x86_64) are pinned in the kit at a
    version they accept, or on the machine. Read from the installed metadata of each pin this environment holds
    at the pinned version (the .venv is set up with them; a pin held at another version is left out here)."""
    checked, problems = [], []
    for name, version in kit.PINS.items():
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked.append(name)
        for req in needs(dist.requires):
            dep = kit.canon(req.name)
            if dep in kit.PINS:
                if not req.specifier.contains(kit.PINS[dep], prereleases=True):
                    problems.append(f"{name} {version} needs {req}, pinned {kit.PINS[dep]}")
            elif dep not in kit.DEVICE_HAS:
                problems.append(f"{name} {version} needs {req}: not in the kit, not on the machine")
    if not checked:
        pytest.skip("no pin is installed here at its pinned version: the closure cannot be read")
    assert problems == []
    assert len(checked) >= len(kit.PINS) // 2, f"only {checked} checked"


def test_folder_check_names_every_fault(tmp_path):
    """wheel_problems: the right set passes; two versions, an unpinned wheel, a wrong version, a missing pin and
    wheels for another Python or platform are each named."""
    pins = {"alpha": "1.0", "beta-pkg": "2.0", "gamma": "3.0"}
    good = ["alpha-1.0-py3-none-any.whl", "beta_pkg-2.0-cp312-cp312-manylinux_2_17_x86_64.whl"]
    good.append("gamma-3.0-cp310-abi3-manylinux2014_x86_64.whl")
    ok = tmp_path / "ok"
    ok.mkdir()
    for name in good:
        (ok / name).touch()
    assert kit.wheel_problems(ok, pins) == []
    bad = tmp_path / "bad"
    shutil.copytree(ok, bad)
    (bad / "gamma-3.0-cp310-abi3-manylinux2014_x86_64.whl").unlink()
    for name in (
        "alpha-1.1-py3-none-any.whl",  # a second alpha, at another version
        "delta-1.0-py3-none-any.whl",  # not pinned
        "beta_pkg-2.0-cp311-cp311-manylinux_2_17_x86_64.whl",  # another Python (and a second beta)
        "epsilon-1.0-py3-none-win_amd64.whl",  # another platform, not pinned
    ):
        (bad / name).touch()
    found = "\n".join(kit.wheel_problems(bad, pins))
    for expected in (
        "alpha: two wheels",
        "alpha-1.1-py3-none-any.whl: version 1.1, pinned 1.0",
        "delta-1.0-py3-none-any.whl: not in PINS",
        "beta_pkg-2.0-cp311-cp311-manylinux_2_17_x86_64.whl: not installable by CPython 3.12",
        "epsilon-1.0-py3-none-win_amd64.whl: not installable",
        "gamma==3.0: no wheel",
    ):
        assert expected in found, found
    # a manylinux_2_28 wheel installs (torch's own tag there); a manylinux_2_34 one is not assumed to
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "alpha-1.0-cp312-cp312-manylinux_2_28_x86_64.whl").touch()
    (newer / "beta_pkg-2.0-cp312-cp312-manylinux_2_34_x86_64.whl").touch()
    found = kit.wheel_problems(newer, {"alpha": "1.0", "beta-pkg": "2.0"})
    assert [p.split(":")[0] for p in found] == ["beta_pkg-2.0-cp312-cp312-manylinux_2_34_x86_64.whl"]


def test_the_kit_folder_is_ignored_and_named_alike_everywhere():
    """.gitignore ignores the folder (and the temporary one it is built in), so it travels only when carried;
    gpu_check.sh's default and its documented run call name the folder the download writes."""
    for path in (".gpu_wheels/x.whl", ".gpu_wheels.abc123/kit/x.whl"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        if done.returncode == 128:
            pytest.skip("not a git checkout")
        assert done.returncode == 0, f"{path} is not ignored"
    assert kit.DEST.name == ".gpu_wheels"
    text = SCRIPT.read_text()
    assert 'run(command="LM_ABLATE_GPU_OUT=$OUT bash scripts/gpu_check.sh", carry=[".gpu_wheels"]' in text
    assert "LM_ABLATE_GPU_WHEELS:-.gpu_wheels}" in text


# ----------------------------------------------------------------- gpu_check.sh against a one-wheel fake kit


def fake_wheel(folder: Path) -> Path:
    """A real, installable wheel of one module, ``fakekit_probe``; it requires packaging (met here) and a package
    that exists nowhere (so that --verify has something to report)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fakekit_probe-0.1-py3-none-any.whl"
    info = "fakekit_probe-0.1.dist-info"
    files = {
        "fakekit_probe/__init__.py": "VALUE = 1\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: fakekit-probe\nVersion: 0.1\n"
        "Requires-Dist: packaging\nRequires-Dist: surely-absent-package-4c1d>=1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]))
    return path


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A checkout holding only the two scripts: whatever else appears in it was written by gpu_check.sh."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("gpu_check.sh", "gpu_wheels.py"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    return repo


def base_env(tmp_path: Path) -> dict[str, str]:
    return {
        "LM_ABLATE_GPU_PYTHON": sys.executable,
        "LM_ABLATE_GPU_OUT": str(tmp_path / "out"),
        "LM_ABLATE_GPU_SITE": str(tmp_path / "site"),
        "LM_ABLATE_GPU_WHEELS": str(tmp_path / "kit"),
        "LM_ABLATE_GPU_PROBE": "fakekit_probe",
        "PIP_NO_INDEX": "1",
    }


def gpu_check(repo: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LM_ABLATE_GPU_")} | base_env(tmp_path) | env
    return subprocess.run(
        ["bash", str(repo / "scripts" / "gpu_check.sh")], env=full, capture_output=True, text=True, timeout=120
    )


def files_in(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def test_gpu_check_installs_the_kit_offline_when_the_project_is_not_importable(checkout, tmp_path):
    """The probe module is missing -> the kit's wheels are installed with pip --no-index --no-deps --target into
    the site folder, put on PYTHONPATH, checked (--verify names the requirement nothing meets, and the check goes
    on), the probe imports; then, without CUDA, 'nothing to check', status 0. Its log is in the output folder, and
    nothing is written into the checkout."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA the check would go on to run the GPU tests")
    fake_wheel(tmp_path / "kit")
    before = files_in(checkout)
    done = gpu_check(checkout, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert log == done.stdout
    assert "import fakekit_probe failed: installing 1 wheels from" in log
    assert "requirement not met: fakekit-probe 0.1 needs surely-absent-package-4c1d>=1: not installed" in log
    assert "gpu_wheels: 1 distributions in" in log and "1 requirements not met" in log
    assert "gpu_check: no CUDA device here; nothing to check" in log
    assert (tmp_path / "site" / "fakekit_probe" / "__init__.py").is_file()
    assert files_in(tmp_path / "out") == {"gpu_check.log"}
    assert files_in(checkout) == before


def test_gpu_check_removes_the_scratch_site_it_made(checkout, tmp_path):
    """Without LM_ABLATE_GPU_SITE the kit goes into a new folder under $TMPDIR, removed when the check ends."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA the check would go on to run the GPU tests")
    fake_wheel(tmp_path / "kit")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LM_ABLATE_GPU_")} | base_env(tmp_path)
    del env["LM_ABLATE_GPU_SITE"]
    env["TMPDIR"] = str(scratch)
    script = checkout / "scripts" / "gpu_check.sh"
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"offline into {scratch}/lm_ablate_gpu_site." in done.stdout
    assert list(scratch.glob("lm_ablate_gpu_site.*")) == []


def test_gpu_check_uses_what_is_importable_without_installing(checkout, tmp_path):
    """When the probe imports (here: a module of the standard library), the kit is neither needed nor touched."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA the check would go on to run the GPU tests")
    done = gpu_check(checkout, tmp_path, LM_ABLATE_GPU_PROBE="json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installing" not in done.stdout and "nothing to check" in done.stdout
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no kit", "holds no wheels: run python scripts/gpu_wheels.py here and carry .gpu_wheels"),
        ("kit without the module", "with the kit installed, import fakekit_probe_not_there still fails"),
        ("output folder is a file", "LM_ABLATE_GPU_OUT="),
        ("bad budget", "whole seconds expected"),
        ("no interpreter", "gpu_check: no interpreter"),
    ],
)
def test_gpu_check_refuses_in_one_line(checkout, tmp_path, case, expected):
    """What cannot start: status 2 and one line saying why (in the log too, where the output folder exists)."""
    env: dict[str, str] = {}
    if case == "kit without the module":
        fake_wheel(tmp_path / "kit")
        env["LM_ABLATE_GPU_PROBE"] = "fakekit_probe_not_there"
    elif case == "output folder is a file":
        (tmp_path / "file").write_text("")
        env["LM_ABLATE_GPU_OUT"] = str(tmp_path / "file")
    elif case == "bad budget":
        env["LM_ABLATE_GPU_BUDGET_S"] = "ten"
    elif case == "no interpreter":
        env["LM_ABLATE_GPU_PYTHON"] = str(tmp_path / "python-nowhere")
    done = gpu_check(checkout, tmp_path, **env)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("gpu_check: ")]
    assert len(lines) == 1 and expected in lines[0], done.stdout + done.stderr


def test_bad_folders_are_refused_before_any_download(tmp_path, capsys):
    """--verify of a missing folder; --dest that is a file or a folder holding more than wheels (it is replaced
    whole): status 2, one line, nothing touched."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("x")
    (tmp_path / "work" / "a-1.0-py3-none-any.whl").write_text("")
    cases = {
        ("--verify", str(tmp_path / "nowhere")): "no such folder",
        ("--dest", str(tmp_path / "file")): "is a file",
        ("--dest", str(tmp_path / "work")): "holds more than a kit (notes.txt): not replaced",
    }
    for args, expected in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            kit.main(list(args))
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err
    assert (tmp_path / "file").read_text() == "x" and (tmp_path / "work" / "notes.txt").is_file()
