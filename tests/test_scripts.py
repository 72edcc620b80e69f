"""The quickstart scripts: which torch build scripts/setup.sh chooses (no network, no install: its functions are
sourced with a fake ``python`` that records pip's arguments and a fake ``nvidia-smi``), and that study.sh and
test.sh pass their arguments on."""

from __future__ import annotations

import http.server
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
BASH = "/bin/bash"
PIN = "torch==2.13.0"

# Stands in for the venv's python: records `python -m pip ...` and succeeds; says torch is missing (or installed,
# with FAKE_HAS_TORCH=1); runs anything else (the index probe) with the real interpreter.
FAKE_PYTHON = f"""#!{BASH}
if [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; echo "$*" >>"$PIP_LOG"; exit 0; fi
if [ "$1" = -c ] && [[ "$2" == *"import torch"* ]]; then
  [ "${{FAKE_HAS_TORCH:-0}}" = 1 ] || exit 1
  [[ "$2" == *print* ]] && echo 9.9.9
  exit 0
fi
exec {shlex.quote(sys.executable)} "$@"
"""


@pytest.fixture(scope="module")
def cpu_index() -> Iterator[str]:
    """A stand-in for PyTorch's CPU index on the loopback interface (the probe asks for <index>/torch/)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/whl/cpu"
    server.shutdown()
    server.server_close()


def unreachable_index() -> str:
    """A loopback port nobody listens on: the connection is refused at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


def choose_torch(
    tmp_path: Path, index: str, *, smi: bool, proc: bool, spec: str | None = None, has_torch: bool = False
) -> tuple[str, list[str], float]:
    """Source setup.sh and run its install_torch with PATH holding only the fakes: (the line it printed, pip's
    argument lines, seconds taken)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON)
    if smi:
        (bin_dir / "nvidia-smi").write_text(f"#!{BASH}\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    proc_dir = tmp_path / "driver-nvidia"
    if proc:
        proc_dir.mkdir()
    log = tmp_path / "pip.log"
    env = {
        "PATH": str(bin_dir),
        "PIP_LOG": str(log),
        "TORCH_CPU_INDEX": index,
        "LM_ABLATE_NVIDIA_PROC": str(proc_dir),
        "FAKE_HAS_TORCH": "1" if has_torch else "0",
        "HOME": str(tmp_path),
    }
    if spec is not None:
        env["TORCH_SPEC"] = spec
    start = time.perf_counter()
    out = subprocess.run(
        [BASH, "-c", f"source {shlex.quote(str(SETUP))} && install_torch"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("torch: "), out.stdout  # one line: the choice and why
    pip = log.read_text().splitlines() if log.exists() else []
    return lines[0], pip, took


def test_no_nvidia_smi_takes_the_cpu_index(tmp_path: Path, cpu_index: str) -> None:
    line, pip, _ = choose_torch(tmp_path, cpu_index, smi=False, proc=True)
    assert pip == [f"install -q {PIN} --index-url {cpu_index}"]
    assert "CPU build" in line and "nvidia-smi not found" in line, line


def test_missing_proc_driver_takes_the_cpu_index(tmp_path: Path, cpu_index: str) -> None:
    line, pip, _ = choose_torch(tmp_path, cpu_index, smi=True, proc=False)
    assert pip == [f"install -q {PIN} --index-url {cpu_index}"]
    assert "CPU build" in line and "driver-nvidia missing" in line, line


def test_unreachable_cpu_index_falls_back_to_the_plain_install_at_once(tmp_path: Path) -> None:
    line, pip, took = choose_torch(tmp_path, unreachable_index(), smi=False, proc=False)
    assert pip == [f"install -q {PIN}"]
    assert "unreachable" in line and "TORCH_SPEC" in line, line
    assert took < 10, took


def test_silent_cpu_index_is_given_up_after_its_timeout(tmp_path: Path) -> None:
    """An index that accepts the connection and never answers (a proxy that drops it) costs the probe's
    timeout, one try, then the plain install."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
        line, pip, took = choose_torch(
            tmp_path, f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu", smi=False, proc=False
        )
    assert pip == [f"install -q {PIN}"] and "unreachable" in line, line
    assert took < 15, took


def test_nvidia_driver_takes_the_default_index_without_probing(tmp_path: Path) -> None:
    # An unreachable CPU index must not matter (nor be waited for) when there is a driver.
    line, pip, _ = choose_torch(tmp_path, unreachable_index(), smi=True, proc=True)
    assert pip == [f"install -q {PIN}"]
    assert "NVIDIA driver found" in line, line


def test_torch_spec_overrides_the_choice(tmp_path: Path, cpu_index: str) -> None:
    spec = "torch==2.13.0 --index-url https://example.invalid/whl/cu126"
    line, pip, _ = choose_torch(tmp_path, cpu_index, smi=False, proc=False, spec=spec)
    assert pip == [f"install -q {spec}"]
    assert "TORCH_SPEC" in line, line


def test_installed_torch_is_kept(tmp_path: Path, cpu_index: str) -> None:
    line, pip, _ = choose_torch(tmp_path, cpu_index, smi=False, proc=False, has_torch=True)
    assert pip == []
    assert "9.9.9" in line and "kept" in line, line


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "activate").exists(), reason="needs the project's .venv")
@pytest.mark.parametrize(
    ("script", "args", "expect"),
    [("study.sh", ["--list"], "norm_2x2"), ("test.sh", ["--version"], "pytest")],
)
def test_quickstart_scripts_pass_their_arguments_on(tmp_path: Path, script: str, args: list[str], expect: str) -> None:
    """study.sh / test.sh set up, then hand their arguments to lm_ablate.study / pytest (set-up replaced by a
    stub here: it installs, which is not this test's business)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "setup.log"
    stub = bin_dir / "bash"  # the scripts call `bash scripts/setup.sh`
    stub.write_text(f'#!{BASH}\nif [ "$1" = scripts/setup.sh ]; then echo ran >>{log}; exit 0; fi\nexec {BASH} "$@"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    # Its own process group, ended whole on timeout: a study.sh that dropped `--list` would start the default study.
    proc = subprocess.Popen(
        [BASH, str(ROOT / "scripts" / script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{script} {' '.join(args)} did not finish: were its arguments passed on?")
    assert proc.returncode == 0, output
    assert log.read_text() == "ran\n"
    assert expect in output, output
