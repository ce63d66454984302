"""The Python sandbox: ordinary runs, and hostile snippets that must be contained and reported."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from llmrl_core.tools import landlock
from llmrl_core.tools.sandbox import Sandbox, SandboxConfig, SandboxLimits, isolation_gaps, run_python

ROOT = Path(__file__).resolve().parents[1]
LIMITS = SandboxLimits(wall_time_s=3, cpu_time_s=3, memory_bytes=512 << 20, max_processes=16, output_bytes=4096)
CONFIG = SandboxConfig(limits=LIMITS)


@pytest.fixture
def box():
    with Sandbox(CONFIG) as sandbox:
        yield sandbox


def test_runs_code_keeps_state_and_reports_errors(box):
    first = box.run("x = 6 * 7\nprint('x is', x)")
    assert (first.ok, first.status, first.stdout) == (True, "ok", "x is 42\n")
    second = box.run("import sys\nprint(x + 1)\nprint('warn', file=sys.stderr)\n1 / 0")
    assert not second.ok and second.status == "error" and second.error == "ZeroDivisionError"
    assert second.stdout == "43\n"
    assert second.stderr.startswith("warn\nTraceback (most recent call last):")
    assert "1 / 0" in second.stderr and second.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert box.run("print(x)").stdout == "42\n"  # an exception does not lose the state


def test_environment_is_scrubbed_and_parent_env_unreachable(monkeypatch):
    monkeypatch.setenv("LLMRL_TEST_SECRET", "hunter2-do-not-leak")
    code = textwrap.dedent(
        """
        import os
        print(sorted(os.environ))
        print(dict(os.environ))
        for pid in {os.getppid(), 1}:
            try:
                print(open(f"/proc/{pid}/environ", "rb").read())
            except OSError as exc:
                print("refused", pid, type(exc).__name__)
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    print(name, open(f"/proc/{name}/environ", "rb").read()[:4000])
                except OSError:
                    pass
        """
    )
    with Sandbox(CONFIG) as box:
        result = box.run(code)
    assert result.ok, result.stderr
    assert "hunter2" not in result.stdout + result.stderr
    assert "LLMRL_TEST_SECRET" not in result.stdout
    env_names = eval(result.stdout.splitlines()[0])  # noqa: S307 (a list literal we printed)
    assert set(env_names) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONIOENCODING"} | {
        "PYTHONDONTWRITEBYTECODE",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
    }


def test_infinite_loop_times_out_and_interpreter_survives(box):
    box.run("kept = 'still here'")
    start = time.monotonic()
    result = box.run("while True:\n    pass")
    assert time.monotonic() - start < LIMITS.wall_time_s + 1.5
    assert result.status == "timeout" and not result.ok
    assert "time limit exceeded" in result.error and "TimeoutError" in result.stderr
    assert box.run("print(kept)").stdout == "still here\n"


def test_loop_that_ignores_the_alarm_hits_the_cpu_limit(box):
    result = box.run("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass")
    assert result.status == "timeout" and not result.ok
    assert box.run("print('next')").stdout == "next\n"


def test_block_that_blocks_all_signals_is_killed_from_outside(box):
    box.run("before = 1")
    start = time.monotonic()
    code = (
        "import signal, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGXCPU})\n"
        "time.sleep(60)"
    )
    result = box.run(code)
    assert time.monotonic() - start < LIMITS.wall_time_s + CONFIG.kill_grace_s + 2
    assert result.status == "timeout" and "killed" in result.error and result.state_lost
    after = box.run("print(before)")  # a fresh interpreter: the state is gone, and it says so
    assert after.state_lost and after.status == "error" and "NameError" in after.stderr


def test_fork_bomb_is_contained(box):
    start = time.monotonic()
    result = box.run("import os\nwhile True:\n    os.fork()")
    assert not result.ok
    assert result.error in ("BlockingIOError", "OSError") or result.status in ("timeout", "crashed")
    assert time.monotonic() - start < LIMITS.wall_time_s + CONFIG.kill_grace_s + 2
    time.sleep(0.3)
    leftover = psutil.Process(box._proc.pid).children(recursive=True)
    assert len(leftover) <= 1, leftover  # only the interpreter (PID 1 of its namespace) remains
    assert box.run("print('alive')").stdout == "alive\n"


def test_memory_bomb_is_contained():
    limits = SandboxLimits(wall_time_s=10, cpu_time_s=10, memory_bytes=256 << 20)
    with Sandbox(SandboxConfig(limits=limits)) as box:
        _check_memory_bomb(box, limits)


def _check_memory_bomb(box: Sandbox, limits: SandboxLimits) -> None:
    big = box.run("x = bytearray(50 * 1024**3)")
    assert big.error == "MemoryError"
    start = time.monotonic()
    grow = box.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024**2))")
    assert grow.error == "MemoryError" and time.monotonic() - start < limits.wall_time_s
    assert box.run("del chunks\nprint('ok')").stdout == "ok\n"


def test_writes_outside_the_working_dir_are_refused(box, tmp_path):
    target = tmp_path / "escaped.txt"
    for path in (target, Path("/tmp/llmrl-sandbox-escape.txt"), ROOT / "escaped.txt"):
        result = box.run(f"open({str(path)!r}, 'w').write('x')")
        assert result.error == "PermissionError", (path, result)
        assert not path.exists()
    inside = box.run("open('inside.txt', 'w').write('fine')\nimport os\nprint(os.listdir('.'))")
    assert inside.ok and "inside.txt" in inside.stdout
    assert (Path(box.workdir) / "inside.txt").read_text() == "fine"
    secret = box.run("print(open(os.path.expanduser('~root/.bashrc')).read())")
    assert not secret.ok


def test_network_is_unreachable(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    python_level = box.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
    assert not python_level.ok and python_level.error in ("PermissionError", "OSError", "ConnectionRefusedError")
    raw = textwrap.dedent(
        f"""
        import ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.socket(2, 1, 0)
        addr = struct.pack("=H", 2) + struct.pack("!H", {port}) + bytes([127, 0, 0, 1]) + bytes(8)
        rc = libc.connect(fd, addr, 16)
        print(rc, ctypes.get_errno())
        """
    )
    via_ctypes = box.run(raw)  # bypasses Python's socket module and its audit hook
    assert via_ctypes.ok
    rc, errno_value = map(int, via_ctypes.stdout.split())
    assert rc == -1 and errno_value != 0
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()


def test_huge_output_is_capped_and_reported(box):
    start = time.monotonic()
    result = box.run(
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\nprint('end')"
    )
    assert result.ok and result.truncated
    assert len(result.stdout) == LIMITS.output_bytes
    assert time.monotonic() - start < 10
    assert box.run("print('small')").stdout == "small\n"  # nothing of the flood leaks into the next block


def test_crash_is_reported_and_next_run_starts_fresh(box):
    box.run("state = 1")
    segfault = box.run("import ctypes\nctypes.string_at(0)")
    assert segfault.status == "crashed" and "SIGSEGV" in segfault.error and segfault.state_lost
    again = box.run("print('fresh')")
    assert again.ok and again.stdout == "fresh\n" and again.state_lost
    hard_exit = box.run("import os\nos._exit(3)")
    assert hard_exit.status == "crashed" and "exit status 3" in hard_exit.error
    assert box.run("print('again')").stdout == "again\n"


def test_one_shot_run_python_cleans_up():
    result = run_python("import os\nprint(os.getcwd())", CONFIG)
    assert result.ok
    assert not os.path.exists(result.stdout.strip())


def test_isolation_report_names_every_layer(box):
    report = box.isolation
    for key in ("network", "filesystem", "processes", "capabilities"):
        assert key in report, report
    if sys.platform == "linux" and landlock.abi_version() >= 1:
        assert report["filesystem"].startswith("Landlock")


def test_fallback_without_namespaces_still_contains(tmp_path):
    config = SandboxConfig(limits=LIMITS, namespaces=False)
    with Sandbox(config) as box:
        assert "namespaces" not in box.isolation
        assert box.run(f"open({str(tmp_path / 'x')!r}, 'w')").error == "PermissionError"
        assert (
            box.run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)").error == "PermissionError"
        )
        assert not box.run("import os\nwhile True:\n    os.fork()").ok


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to switch to a plain user")
def test_non_root_user_gets_the_same_containment():
    """As uid 65534 with the system Python (the venv's interpreter lives under /root): user namespaces."""
    system_python = "/usr/bin/python3"
    if not os.path.exists(system_python):
        pytest.fail("this test needs /usr/bin/python3 (Debian python3) to run the sandbox as a plain user")
    script_dir = Path(tempfile.mkdtemp(prefix="llmrl-user-test-"))
    try:
        _run_as_plain_user(system_python, script_dir)
    finally:
        shutil.rmtree(script_dir, ignore_errors=True)


def _run_as_plain_user(system_python: str, tmp_path: Path) -> None:
    script = tmp_path / "as_user.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            sys.path.insert(0, {str(ROOT)!r})
            from llmrl_core.tools.sandbox import Sandbox, SandboxConfig, SandboxLimits
            limits = SandboxLimits(wall_time_s=3, cpu_time_s=3, memory_bytes=512 << 20, max_processes=16)
            with Sandbox(SandboxConfig(limits=limits, workdir_parent="/tmp")) as box:
                out = {{"report": box.isolation}}
                out["net"] = box.run("import socket\\nsocket.create_connection(('127.0.0.1', 9), timeout=1)").error
                out["write"] = box.run("open('/tmp/llmrl-user-escape', 'w')").error
                out["fork"] = box.run("import os\\nwhile True:\\n    os.fork()").ok
                out["loop"] = box.run("while True: pass").status
                out["ok"] = box.run("print(1 + 1)").stdout
            print(json.dumps(out))
            """
        )
    )
    os.chmod(tmp_path, 0o755)
    os.chmod(script, 0o644)
    proc = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", system_python, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "LLMRL_TEST_SECRET": "x"},
    )
    assert proc.returncode == 0, proc.stderr
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["report"]["uid"] == 65534
    assert out["net"] == "PermissionError" and out["write"] == "PermissionError"
    assert out["fork"] is False and out["loop"] == "timeout" and out["ok"] == "2\n"
    assert not os.path.exists("/tmp/llmrl-user-escape")
    assert "user" in out["report"]["namespaces"] and out["report"]["network"].startswith("isolated")


def test_legitimate_work_still_runs(box):
    code = textwrap.dedent(
        """
        import json, subprocess, sys, tempfile
        import numpy as np
        print(int(np.arange(10).sum()))
        print(subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout.strip())
        with tempfile.NamedTemporaryFile("w") as fh:
            fh.write("ok")
        print(json.dumps({"a": 1}))
        """
    )
    result = box.run(code)
    assert result.ok, result.stderr
    assert result.stdout.split() == ["45", "7", '{"a":', "1}"]


def test_a_full_report_has_no_gaps_and_each_missing_layer_is_named():
    full = {
        "uid": 0,
        "processes": "cgroup pids.max (/sys/fs/cgroup/pids/x)",
        "namespaces": "net,mnt,ipc,uts,pid",
        "network": "isolated (new network namespace, no interfaces up)",
        "filesystem": "Landlock ABI 7: write only in the working directory, read system/Python dirs",
        "capabilities": "none",
    }
    assert isolation_gaps(full) == []
    assert isolation_gaps({**full, "uid": 1000, "processes": "RLIMIT_NPROC"}) == []  # binds for a user
    weak = {**full, "filesystem": "no Landlock: plain file permissions only", "processes": "unlimited (root ...)"}
    assert isolation_gaps(weak) == [
        "filesystem: no Landlock: plain file permissions only",
        "processes: unlimited (root ...)",
    ]


def test_a_sandbox_weaker_than_full_says_so_once(caplog, monkeypatch):
    """Without namespaces and Landlock (as on a machine that lacks them), the first sandbox logs what is missing;
    the next ones (one per episode) do not repeat it."""
    from llmrl_core.tools import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "_WARNED_GAPS", set())
    config = SandboxConfig(limits=LIMITS, namespaces=False, landlock=False)
    with caplog.at_level("WARNING", logger="llmrl.sandbox"):
        for _ in range(2):
            with Sandbox(config) as box:
                assert box.run("print(1)").stdout == "1\n"
    warnings = [r.getMessage() for r in caplog.records if r.name == "llmrl.sandbox"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("model-written code runs with weaker isolation than full here: namespaces: not used")
    assert "network: Python audit hook only" in warnings[0]
    assert "filesystem: Landlock disabled by configuration" in warnings[0]
