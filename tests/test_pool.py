"""The warm pool (engine/pool.py, engine/pool_server.py, `cutedebug pool`): a resident fork
server reused across `cutedebug run` invocations, keyed, replaced when dead or wedged,
bounded (idle exit, stop), and leaving no process behind."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from cutedebug.engine import lifeline, pool, pool_key, pool_spare, runner
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent
CLEAN = ROOT / "scenarios" / "minimal" / "clean.toml"


# ---- without a server -------------------------------------------------------------------------
def test_idle_time_is_bounded_and_named_when_wrong():
    assert pool.idle_seconds("30") == 30.0
    for bad in ("0", "-5", "nan", "x", str(pool.MAX_IDLE_S + 1)):
        with pytest.raises(ValueError, match=r"idle time .*\(0, 86400\]"):
            pool.idle_seconds(bad)


def test_the_key_follows_the_environment_but_not_its_volatile_part(monkeypatch):
    base = dict(os.environ)
    k0 = pool.key_of(pool.fingerprint(base))
    assert pool.key_of(pool.fingerprint({**base, "PWD": "/elsewhere", "SHLVL": "7"})) == k0
    assert (
        pool.key_of(pool.fingerprint({**base, "SSH_CONNECTION": "1 2 3 4", "TMUX_PANE": "%3"}))
        == k0
    )
    assert pool.key_of(pool.fingerprint({**base, lifeline.SESSION_VAR: "a b"})) == k0
    assert pool.key_of(pool.fingerprint({**base, "CUTE_DSL_ARCH": "sm_100a"})) != k0
    assert pool.key_of(pool.fingerprint({**base, "PYTHONPATH": "/other"})) != k0
    monkeypatch.setattr(sys, "executable", "/usr/bin/another-python")
    assert pool.key_of(pool.fingerprint(base)) != k0


def test_the_key_follows_the_project_sources(tmp_path, monkeypatch):
    pkg = tmp_path / "cutedebug"
    pkg.mkdir()
    mod = pkg / "m.py"
    mod.write_text("x = 1\n")
    monkeypatch.setattr(pool_key, "REPO_ROOT", tmp_path)
    k0 = pool.key_of(pool.fingerprint())
    mod.write_text("x = 22\n")  # an edit: size and mtime change
    assert pool.key_of(pool.fingerprint()) != k0
    monkeypatch.setattr(pool_key, "REPO_ROOT", ROOT)
    assert pool.key_of(pool.fingerprint()) != k0  # another checkout


def test_a_server_is_superseded_only_by_other_code_in_the_same_place():
    now = pool.home(pool.fingerprint())
    assert set(now) == {"repo", "python", "prefix", "sources", "dists"} and all(now.values())
    edited = {"home": {**now, "sources": "0" * 16}}
    upgraded = {"home": {**now, "dists": {"torch": ["torch-0.0.dist-info", "/x", 1]}}}
    assert pool.superseded(edited, now) and pool.superseded(upgraded, now)
    assert not pool.superseded({"home": now}, now)  # the same code: another environment's
    assert not pool.superseded({"home": {**edited["home"], "repo": "/other/checkout"}}, now)
    assert not pool.superseded({"home": {**edited["home"], "python": "/other/python"}}, now)
    assert not pool.superseded({"pid": 1}, now)  # a server from before homes were recorded
    assert not pool.superseded({"home": {**edited["home"], "sources": None}}, now)


def test_a_pool_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "p"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    monkeypatch.setenv(pool.DIR_VAR, str(d))
    with pytest.raises(pool.PoolError, match="not private"):
        pool.pool_dir()
    assert pool.client(start=True) is None  # a run then takes a fresh interpreter


def test_a_plain_run_without_a_server_leaves_no_file(tmp_path, monkeypatch):
    """`cutedebug run` (no --warm) looks for this environment's server: with none running it
    creates neither the pool folder nor a lock file."""
    missing = tmp_path / "never"
    monkeypatch.setenv(pool.DIR_VAR, str(missing))
    assert pool.client(start=False) is None and not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    monkeypatch.setenv(pool.DIR_VAR, str(empty))
    assert pool.client(start=False) is None and list(empty.iterdir()) == []


def test_pool_stop_all_tidies_what_idle_servers_left(tmp_path, monkeypatch, capsys):
    from cutedebug.commands import cli

    d = tmp_path / ("long-folder-name-" * 6)  # too long for a socket path: tidied all the same
    d.mkdir(mode=0o700)
    for name in ("pool-0123456789abcdef.lock", "pool-0123456789abcdef.log", "unrelated.txt"):
        (d / name).write_text("")
    # compile caches (engine/compile_cache.py): a server that was killed leaves its folder;
    # a running server's stays
    gone = subprocess.Popen(["true"])
    gone.wait()
    for pid in (gone.pid, os.getpid()):
        (d / f"pool-0123456789abcdef.{pid}.compiled" / "entry").mkdir(parents=True)
    monkeypatch.setenv(pool.DIR_VAR, str(d))
    assert cli.main(["pool", "stop", "--all"]) == 0
    assert "no server running" in capsys.readouterr().out
    assert sorted(p.name for p in d.iterdir()) == [
        f"pool-0123456789abcdef.{os.getpid()}.compiled",
        "unrelated.txt",
    ]
    monkeypatch.setenv(pool.DIR_VAR, str(tmp_path / "none"))
    assert cli.main(["pool", "status"]) == 0 and not (tmp_path / "none").exists()


def test_session_tags_are_rewritten_in_place_for_the_sweep():
    """A forked worker takes its command's session tags in the padded slot its server
    started with: /proc/PID/environ (what the sweep and the keeper read) shows them."""
    env = dict(os.environ)
    env[lifeline.SESSION_VAR] = lifeline.padded_session_tags(["a" * 32])
    code = (
        "import sys; from cutedebug.engine import lifeline; "
        "ok = lifeline.adopt_session_tags(['a' * 32, 'b' * 32, 'c' * 32]); "
        "env = open('/proc/self/environ', 'rb').read().split(b'\\0'); "
        "v = [e for e in env if e.startswith(b'CUTEDEBUG_SESSION_TAGS=')][0]; "
        "print(ok, v.split(b'=', 1)[1].split() == [b'a' * 32, b'b' * 32, b'c' * 32])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_pool_start_with_a_bad_idle_time_is_a_usage_error():
    r = subprocess.run(
        [sys.executable, "-m", "cutedebug", "pool", "start", "--idle", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 2
    assert "idle time '0'" in r.stderr and "(0, 86400]" in r.stderr


@pytest.mark.parametrize(
    "env, argv",
    [
        ({pool.IDLE_VAR: "abc"}, ["pool", "start"]),
        ({pool.IDLE_VAR: "-1", pool.WARM_VAR: "1"}, ["run", "--compile-only", str(CLEAN)]),
        ({pool.WARM_VAR: "maybe"}, ["run", "--compile-only", str(CLEAN)]),
        ({pool.WARM_VAR: "maybe"}, ["exec", "--", sys.executable, "-c", "pass"]),
    ],
)
def test_a_bad_pool_variable_is_a_usage_error_naming_it(env, argv, tmp_path):
    """A mistyped CUTEDEBUG_POOL_IDLE_S / CUTEDEBUG_WARM is the user's input: exit 2 naming
    the variable, not a harness error (exit 3, 'no server could be started') nor ignored."""
    # a short pool folder: under tmp_path (xdist's popen-gwN, this test's long name) the
    # socket path can pass 107 bytes, and that error would come first
    d = Path(tempfile.mkdtemp(prefix="cdpool-", dir="/tmp")) / "p"
    try:
        r = subprocess.run(
            [sys.executable, "-m", "cutedebug", *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT), pool.DIR_VAR: str(d), **env},
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert next(iter(env if len(env) == 1 else [pool.IDLE_VAR])) in r.stderr
        assert not d.exists() or not list(d.glob("pool-*.sock"))
    finally:
        shutil.rmtree(d.parent, ignore_errors=True)


# ---- with servers -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool_env():
    """A private pool folder (short: a Unix socket path is at most 107 bytes) for this
    module; every server in it is stopped at the end and must leave nothing."""
    d = tempfile.mkdtemp(prefix="cdpool-", dir="/tmp")
    saved = os.environ.get(pool.DIR_VAR)
    os.environ[pool.DIR_VAR] = d
    os.environ[pool.IDLE_VAR] = "300"
    # no spare worker (tests/test_pool_spare.py): these count the server's children
    os.environ[pool_spare.SPARE_VAR] = "0"
    yield d
    os.environ.pop(pool_spare.SPARE_VAR, None)
    left = []
    for r in pool.servers():
        left += pool.stop(r["key"])["left"]
    os.environ.pop(pool.IDLE_VAR, None)
    if saved is None:
        os.environ.pop(pool.DIR_VAR, None)
    else:
        os.environ[pool.DIR_VAR] = saved
    socks = list(Path(d).glob("pool-*.sock"))
    shutil.rmtree(d, ignore_errors=True)
    assert left == []
    assert not socks


def cli(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "cutedebug", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=env,
    )


def report_json(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.strip().startswith("report:"))
    return json.loads(
        (Path(line.split("report:", 1)[1].strip()).parent / "report.json").read_text()
    )


def server_meta() -> dict:
    key = pool.key_of(pool.fingerprint())
    return pool.read_meta(pool.Paths.of(pool.pool_dir(), key).meta) or {}


def carrying(tag: str) -> list[int]:
    return [p.pid for p in lifeline.processes(tag)]


@pytest.mark.slow
def test_two_runs_reuse_one_server_and_skip_the_imports(pool_env, tmp_path):
    import time

    from cutedebug.engine.timings import PLACED

    runs, walls = [], []
    for warm in ("--warm", "--warm", "--no-warm"):
        t0 = time.monotonic()
        r = cli("run", warm, "--compile-only", "--runs-dir", str(tmp_path), str(CLEAN))
        walls.append(time.monotonic() - t0)
        assert r.returncode == 0, r.stdout + r.stderr
        runs.append(report_json(r.stdout))
    first, second, fresh = runs
    for rep, wall in zip(runs, walls):
        # the command's whole wall in report.json's timings: its seconds before the run (the
        # pool's server start in them), the run's phases, which add up to the run's wall, and
        # its seconds after it until the report; only writing it and the exit are not there
        t = rep["timings"]
        placed = sum(t.get(k, 0.0) for k in PLACED) + t["unplaced_s"]
        assert abs(placed - t["wall_s"]) < 0.01, t
        assert t["cli_start_s"] >= t.get("pool_s", 0.0)
        # (the process's start time counts in clock ticks: up to 10 ms early)
        assert t["cli_start_s"] + t["wall_s"] + t["cli_after_s"] <= wall + 0.011, (t, wall)
        assert t["unplaced_s"] < 0.2 * t["wall_s"], t
    p1, p2 = first["evidence"]["pool"], second["evidence"]["pool"]
    assert p1["pid"] == p2["pid"] == server_meta()["pid"]
    assert (p1["started_now"], p2["started_now"]) == (True, False)
    assert "pool" not in fresh["evidence"]
    # the server's start (its imports) is paid once, by the first command
    assert first["timings"]["pool_s"] > 5 * second["timings"]["pool_s"]
    # a forked worker skips what a fresh interpreter imports
    assert second["timings"]["imports_s"] < 0.25 * fresh["timings"]["imports_s"]
    assert second["timings"]["spawn_s"] < fresh["timings"]["spawn_s"] + 1.0
    ptx = [(Path(r["run_dir"]) / "kernel.ptx").read_text() for r in runs]
    assert ptx[0] == ptx[1] == ptx[2]
    # the second run traced the same IR: its compile reused the first's (engine/compile_cache)
    cache = [r["evidence"]["compiled"]["compile_cache"] for r in runs]
    assert [c["reused"] for c in cache] == [False, True, None], cache
    assert cache[0]["key"] == cache[1]["key"]
    # the fresh worker of this machine (no GPU): a compile-only run, not cached (on a GPU a
    # fresh run worker uses the user's folder: tests/test_cold_compile_cache.py)
    assert cache[2]["why"] == "no compile cache for a compile-only run or without a GPU"
    folder = pool.compiled_folder(
        pool.Paths.of(pool.pool_dir(), pool.key_of(pool.fingerprint())).meta, p1["pid"]
    )
    assert len([e for e in folder.iterdir() if not e.name.startswith(".")]) == 1
    st = cli("pool", "status", "--json")
    rows = [r for r in json.loads(st.stdout) if r["this_env"]]
    assert len(rows) == 1 and rows[0]["answers"] and rows[0]["runs"] >= 2


@pytest.mark.slow
def test_a_hang_killed_through_the_pool_leaves_nothing_and_the_next_run_works(pool_env, tmp_path):
    c = pool.client(start=True)
    assert c is not None
    server = c.info["pid"]
    sc = S.adhoc(
        str(ROOT / "tests" / "helpers" / "hang_with_child.py") + ":Hang", {}, None, {}, "PASS"
    )
    sc = sc.with_overrides(limits=S.Limits(import_s=3.0))
    try:
        res = runner.run_scenario(sc, runs_root=tmp_path, forkserver=c)
    finally:
        c.close()
    assert res.evidence["pool"]["pid"] == server
    assert res.verdict is Verdict.HARNESS_ERROR and "deadline" in res.reason
    swept = res.evidence["swept_pids"]
    assert swept  # the grandchild in a session of its own (the worker went with its group)
    assert not [p for p in swept if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert psutil.Process(server).children(recursive=True) == []
    assert carrying(server_meta()["tag"]) == [server]  # nothing of the pool's but the server
    r = cli("run", "--warm", "--compile-only", "--runs-dir", str(tmp_path), str(CLEAN))
    assert r.returncode == 0, r.stdout + r.stderr
    assert report_json(r.stdout)["evidence"]["pool"]["pid"] == server


@pytest.mark.slow
def test_a_command_killed_mid_run_takes_its_worker_along(pool_env, tmp_path):
    """SIGKILL of the command: nobody watches its worker, so the server kills it (the
    connection closed) and its grandchild in a session of its own."""
    server = pool.client(start=True)
    assert server is not None
    spid = server.info["pid"]
    server.close()
    target = str(ROOT / "tests" / "helpers" / "hang_with_child.py") + ":Hang"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cutedebug", "run", "--warm", target, "--runs-dir", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    end = time.monotonic() + 60
    kids: list[psutil.Process] = []
    while time.monotonic() < end and len(kids) < 2:  # the worker and its grandchild
        kids = psutil.Process(spid).children(recursive=True)
        time.sleep(0.05)
    assert len(kids) == 2
    worker_tags = {k.environ().get(lifeline.RUN_TAG_VAR) for k in kids}
    assert len(worker_tags) == 1 and None not in worker_tags
    proc.kill()
    proc.wait()
    end = time.monotonic() + 10
    while time.monotonic() < end and (
        psutil.Process(spid).children(recursive=True) or any(carrying(t) for t in worker_tags)
    ):
        time.sleep(0.05)
    assert psutil.Process(spid).children(recursive=True) == []
    assert all(carrying(t) == [] for t in worker_tags)
    assert not [k for k in kids if k.is_running() and k.status() != "zombie"]
    assert psutil.Process(spid).is_running()  # the server itself stays for the next run


@pytest.mark.slow
def test_a_health_check_forks_from_the_pool(pool_env, tmp_path):
    c = pool.client(start=True)
    assert c is not None
    try:
        forked = runner.health_check(forkserver=c, run_dir=tmp_path)
    finally:
        c.close()
    fresh = runner.health_check()
    assert forked.get("forked") and not fresh.get("forked")
    assert forked["healthy"] == fresh["healthy"]


@pytest.mark.slow
def test_a_wedged_or_dead_server_is_replaced_never_a_traceback(pool_env, tmp_path):
    c = pool.client(start=True)
    assert c is not None
    old = server_meta()
    c.close()
    os.kill(old["pid"], signal.SIGSTOP)  # wedged: takes the connection, never answers
    r = cli("run", "--compile-only", "--runs-dir", str(tmp_path), str(CLEAN))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = report_json(r.stdout)
    new = server_meta()
    assert new["pid"] != old["pid"] and rep["evidence"]["pool"]["pid"] == new["pid"]
    assert rep["evidence"]["pool"]["started_now"]
    assert not psutil.pid_exists(old["pid"]) or (
        psutil.Process(old["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert carrying(old["tag"]) == []
    os.kill(new["pid"], signal.SIGKILL)  # dead: a socket file nobody listens on
    r = cli("run", "--compile-only", "--runs-dir", str(tmp_path), str(CLEAN))
    assert r.returncode == 0, r.stdout + r.stderr
    third = report_json(r.stdout)["evidence"]["pool"]
    assert third["pid"] not in (old["pid"], new["pid"]) and third["started_now"]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_another_environment_gets_another_server_which_exits_when_idle(pool_env, tmp_path):
    mine = pool.client(start=True)
    assert mine is not None
    mine.close()
    env = {**os.environ, "CUTEDEBUG_TEST_OTHER_ENV": "1", pool.IDLE_VAR: "3"}
    r = cli("pool", "start", env=env)
    assert r.returncode == 0 and "started server" in r.stdout, r.stdout + r.stderr
    rows = {row["key"]: row for row in pool.servers()}
    other = [row for row in rows.values() if not row["this_env"]]
    assert len(other) == 1 and other[0]["pid"] != mine.info["pid"]
    pid, tag = other[0]["pid"], other[0]["tag"]
    end = time.monotonic() + 30
    while (
        time.monotonic() < end
        and pool.servers()
        and any(row["pid"] == pid for row in pool.servers())
    ):
        time.sleep(0.2)
    assert all(row["pid"] != pid for row in pool.servers())  # gone by itself: idle exit
    assert carrying(tag) == []
    log = Path(other[0]["log"]).read_text()
    assert "exits: idle for 3 s" in log
    stop = cli("pool", "stop")  # this environment's
    assert stop.returncode == 0 and "0 process(es) left" in stop.stdout, stop.stdout
    assert not pool.servers()
    again = cli("pool", "stop")
    assert again.returncode == 0 and "no server running" in again.stdout


@pytest.mark.slow
def test_a_server_left_by_a_source_edit_retires_once_its_command_is_done(pool_env):
    """After an edit of the project's sources a command's key changes and it starts a new
    server; the old one can serve nobody again. The command that starts the new one retires
    it: it exits as soon as its last connected command is gone (not after its idle time),
    leaving nothing; a server of another checkout is left alone."""
    d = pool.pool_dir()
    now = pool.home(pool.fingerprint())
    pool.stop(pool.key_of(pool.fingerprint()))  # the next client must start its server
    old_key, other_key = "0ld0000000000000", "0ther00000000000"
    pool._start_server(pool.Paths.of(d, old_key), old_key, 300, {**now, "sources": "f" * 16})
    pool._start_server(
        pool.Paths.of(d, other_key), other_key, 300, {**now, "sources": "f" * 16, "repo": "/co"}
    )
    old = pool.read_meta(pool.Paths.of(d, old_key).meta)
    other = pool.read_meta(pool.Paths.of(d, other_key).meta)
    busy = pool.PoolClient(pool.Paths.of(d, old_key), old_key, {}, 300)
    assert busy._connect() == "ok"  # a command of the old code, still running
    c = pool.client(start=True)
    assert c is not None and c.info["started_now"]
    c.close()
    time.sleep(1.5)
    assert psutil.pid_exists(old["pid"])  # not while a command of it is connected
    rows = {r["key"]: r for r in pool.servers()}
    assert "superseded by server" in rows[old_key]["retired"]
    assert not rows[other_key]["retired"] and not rows[c.key]["retired"]
    st = cli("pool", "status")
    assert "retired (superseded by server" in st.stdout, st.stdout
    busy.close()
    end = time.monotonic() + 10
    while time.monotonic() < end and psutil.pid_exists(old["pid"]):
        time.sleep(0.05)
    assert not psutil.pid_exists(old["pid"]) or (
        psutil.Process(old["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert carrying(old["tag"]) == []
    assert "exits: retired: superseded by server" in pool.Paths.of(d, old_key).log.read_text()
    assert psutil.pid_exists(other["pid"])  # another checkout's: its idle exit stands
    assert pool.stop(other_key)["how"] == "stopped"


@pytest.mark.slow
def test_a_run_folder_removed_under_a_worker_does_not_end_the_server(pool_env, tmp_path):
    """The server writes a worker's exit status into its run folder; a folder gone by then
    (the user removed it, a test's tmp_path cleaned up) must not end the resident server
    and with it every other command's workers."""
    c = pool.client(start=True)
    assert c is not None
    server = c.info["pid"]
    gone = tmp_path / "removed"  # never created: the status cannot be written there
    try:
        child = c.spawn(gone / "request.json", tmp_path / "worker.log", dict(os.environ))
        end = time.monotonic() + 30
        while psutil.pid_exists(child.pid) and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)  # the server's next reap
    finally:
        c.close()
    again = pool.client(start=False)
    assert again is not None and again.info["pid"] == server
    again.close()


@pytest.mark.parametrize("verb, rc", [("start", 2), ("stop", 0)])
def test_a_pool_folder_too_long_for_a_socket_is_no_traceback(verb, rc):
    """CUTEDEBUG_POOL_DIR whose socket path would pass the 107-byte limit (a PoolError
    traceback, exit 3, before): `pool start` is a usage error naming the variable; `pool stop`
    finds no server there (none can bind), as `pool stop --all` does."""
    d = Path(tempfile.mkdtemp(prefix="cdpool-", dir="/tmp")) / ("x" * 90)
    d.mkdir(mode=0o700)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "cutedebug", "pool", verb],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env={**os.environ, pool.DIR_VAR: str(d)},
        )
    finally:
        shutil.rmtree(d.parent, ignore_errors=True)
    assert r.returncode == rc, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    if verb == "start":
        assert "too long for a Unix socket" in r.stderr and pool.DIR_VAR in r.stderr
    else:
        assert "no server running" in r.stdout


def test_unreadable_server_metadata_is_skipped_not_a_traceback(tmp_path, monkeypatch, capsys):
    """A metadata file that is not a server's (not an object, a pid that is not a number) is
    no server: status and stop --all go on (an AttributeError / ValueError, exit 3, before)."""
    from cutedebug.commands import cli

    d = tmp_path / "p"
    d.mkdir(mode=0o700)
    (d / "pool-0123456789abcdef.json").write_text("[1]")
    (d / "pool-1123456789abcdef.json").write_text('{"pid": "abc", "tag": "t"}')
    monkeypatch.setenv(pool.DIR_VAR, str(d))
    assert pool.read_meta(d / "pool-0123456789abcdef.json") is None
    assert cli.main(["pool", "status"]) == 0
    assert cli.main(["pool", "stop", "--all"]) == 0
    assert "no server running" in capsys.readouterr().out


def test_run_warm_says_why_no_server_could_be_had(tmp_path):
    """--warm over a pool folder others can write: the run goes on in a fresh interpreter and
    says that the folder is the reason (it pointed at a server log that does not exist)."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    r = subprocess.run(
        [sys.executable, "-m", "cutedebug", "run", "--warm", "--compile-only"]
        + ["--runs-dir", str(tmp_path / "runs"), str(CLEAN)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, pool.DIR_VAR: str(d)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no pool server could be had here" in r.stderr
    assert f"pool folder {d} is not private" in r.stderr
