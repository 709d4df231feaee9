"""The fakes meeting what goes wrong outside them: a bad option to `python -m chaos.fakes` (a
port out of range or taken, a ledger path that cannot be a file) exits 2 with one line naming
it, and a ledger that cannot be written (a full disk) stops the fake with one named error, never
a traceback from its request threads."""

import contextlib
import errno
import http.client
import json
import os
import select
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from chaos.fakes import FakeProvider, FakeReceiver, Ledger, LedgerWriteError, read_ledger

REPO = Path(__file__).resolve().parents[2]
FULL = "/dev/full"  # every write fails with ENOSPC, as on a full disk
QUESTION = {"model": "m", "messages": [{"role": "user", "content": "Is this recorded?"}]}


def post(url, document, timeout=5.0) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", parts.path, body=json.dumps(document).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def fakes(*args, timeout=10) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.fakes", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def refused_with_one_line(done: subprocess.CompletedProcess, *words: str) -> str:
    """Assert an exit 2 with one stderr line holding each of `words` and no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("python -m chaos.fakes: error: ")
    for word in words:
        assert word in line, line
    return line


# --- bad options -----------------------------------------------------------------------------------

@pytest.mark.parametrize("port, reason", [("99999", "0..65535"), ("-1", "0..65535"),
                                          ("80a", "port number")])
def test_a_port_out_of_range_is_refused_naming_the_option(tmp_path, port, reason):
    done = fakes("provider", "--port", port, "--ledger", str(tmp_path / "p.jsonl"))
    refused_with_one_line(done, "--port", reason)
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("server", ["provider", "receiver"])
def test_a_port_already_taken_is_refused_naming_the_option(tmp_path, server):
    with FakeReceiver(tmp_path / "first.jsonl") as first:
        done = fakes(server, "--port", str(first.port), "--ledger", str(tmp_path / "p.jsonl"))
    refused_with_one_line(done, f"--port {first.port}", "already in use")


def test_a_ledger_that_is_a_folder_is_refused_naming_the_option(tmp_path):
    refused_with_one_line(fakes("provider", "--ledger", str(tmp_path)),
                          f"--ledger {tmp_path}", "is a folder")


def test_a_ledger_whose_folder_is_missing_is_refused_naming_the_folder(tmp_path):
    missing = tmp_path / "no-such-folder"
    refused_with_one_line(fakes("receiver", "--ledger", str(missing / "r.jsonl")),
                          "--ledger", f"its folder {missing} does not exist")
    assert not missing.exists()


def unwritable_folder(tmp_path) -> Path:
    """A folder no file can be created in, for this user: a read-only mode, or (root ignores
    modes) sysfs, which refuses new files to root too."""
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    if not os.access(folder, os.W_OK):
        return folder
    with contextlib.suppress(OSError):
        open(f"/sys/ninelives-{uuid.uuid4().hex}", "ab").close()
        pytest.fail("no folder here refuses this user a new file (sysfs took one)")
    return Path("/sys")


def test_a_ledger_in_a_folder_that_is_not_writable_is_refused_naming_the_option(tmp_path):
    folder = unwritable_folder(tmp_path)
    refused_with_one_line(fakes("provider", "--ledger", str(folder / "p.jsonl")),
                          "--ledger", f"cannot create a file in {folder}")


# --- a ledger that cannot be written ---------------------------------------------------------------

def test_a_ledger_that_cannot_be_written_keeps_its_first_error_and_writes_nothing_more():
    ledger = Ledger(FULL)  # a device is never read: reading /dev/full would never end
    with pytest.raises(LedgerWriteError) as first:
        ledger.append({"a": 1})
    assert (first.value.errno, first.value.filename, first.value.written) == (
        errno.ENOSPC, FULL, 0)
    with pytest.raises(LedgerWriteError):
        ledger.append({"a": 2})
    assert ledger.failure is first.value and ledger.entries() == [] == read_ledger(FULL)
    ledger.close()  # nothing left in a buffer to fail again


@pytest.mark.parametrize("fake_class, document", [(FakeProvider, QUESTION),
                                                  (FakeReceiver, {"amount": 1})])
def test_a_fake_whose_ledger_fails_answers_500_and_prints_no_traceback(capfd, fake_class,
                                                                       document):
    with fake_class(FULL) as fake:
        url = fake.url + ("/chat/completions" if fake_class is FakeProvider else "")
        answers = [post(url, document) for _ in range(3)]
        assert fake.ledger_failure.errno == errno.ENOSPC
    assert [status for status, _ in answers] == [500] * 3
    assert "could not write its ledger: No space left on device" in answers[0][1].decode()
    assert "Traceback" not in capfd.readouterr().err
    if fake_class is FakeReceiver:
        assert len(fake.applied()) == 3  # applied, then not recorded: the run has no verdict


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs, mounted for the test and unmounted after (root only)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.fail("mounting a tmpfs needs root and mount(8): the test suite runs as root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_disk_that_fills_up_keeps_every_line_written_before_and_refuses_the_rest(tiny_disk,
                                                                                    capfd):
    (tiny_disk / "filler").write_bytes(b"x" * (60 * 1024))  # about one page left
    with FakeProvider(tiny_disk / "provider.jsonl") as fake:
        statuses = [post(fake.url + "/chat/completions", QUESTION)[0] for _ in range(40)]
        failure = fake.ledger_failure
    assert failure is not None and failure.errno == errno.ENOSPC, statuses
    written = failure.written
    assert statuses == [200] * written + [500] * (40 - written) and written > 0
    entries = read_ledger(tiny_disk / "provider.jsonl")  # a torn last line is left out
    assert [e["seq"] for e in entries] == list(range(1, written + 1))
    assert "Traceback" not in capfd.readouterr().err


def test_the_command_stops_with_one_named_error_when_its_ledger_cannot_be_written():
    proc = subprocess.Popen([sys.executable, "-m", "chaos.fakes", "provider", "--ledger", FULL],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "the fake printed no URL line"
        url = json.loads(proc.stdout.readline())["url"]
        assert post(url + "/chat/completions", QUESTION)[0] == 500
        assert proc.wait(timeout=10) == 2
        [line] = proc.stderr.read().splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert line.startswith(f"python -m chaos.fakes: error: --ledger {FULL}: ")
    assert "No space left on device" in line and "after 0 lines" in line


def test_a_run_whose_provider_ledger_cannot_be_written_stops_with_one_named_error(
        tmp_path, monkeypatch, capfd):
    from chaos.commands import cli
    from chaos.run import runner

    class FullDiskProvider(FakeProvider):
        def __init__(self, ledger_path, **kwargs):
            super().__init__(FULL, **kwargs)

    monkeypatch.setattr(runner, "FakeProvider", FullDiskProvider)
    code = cli.main(["run", "smoke", "--profile", "smoke", "--seed", "1", "--out",
                     str(tmp_path), "--quiet"])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error" in line]  # after the run's title
    assert line.startswith(f"error: the fake provider could not write its ledger {FULL}: "
                           "No space left on device"), line
