"""testutil.py - what the Python tests share (testutil.c is the C side).

Design note. Server runs one of the loopback servers of tests/servers/
(fake_gcs.py, fake_metadata.py, fake_tpu.py, ...) the way every test
needs it: on port 0 with --port-file, found once the file holds the port
(a server that exits first, or writes nothing within PATIENCE, is an
error, never a measure), its stdout dropped, killed if the test process
dies (PR_SET_PDEATHSIG: SIGKILL, so that even a server a test stopped
with SIGSTOP goes), and stopped with SIGTERM. As a `with` block it wants
exit status 0 after that, unless the block raised.

    srv = testutil.Server("fake_gcs.py", "--bucket", "b").start()
    ... srv.url / srv.host / srv.port ...
    srv.stop()
"""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVERS = os.path.join(os.environ.get("CKPT_TEST_SRCDIR") or HERE,
                       "servers")
MULT = float(os.environ.get("CKPT_TEST_TIMEOUT_MULT", "1") or 1)
PATIENCE = 60 * MULT  # seconds before a start or stop is a failure

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _read_port(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text else 0


class Server:
    """SCRIPT (a file of tests/servers/, or a path) with ARGS, on a
    loopback port. args may be added to .args before start(); .dir is a
    private temporary directory (removed by stop()) for them to use."""

    def __init__(self, script, *args):
        self.script = (script if os.sep in script
                       else os.path.join(SERVERS, script))
        self.name = os.path.basename(script)
        self.args = [str(a) for a in args]
        self.dir = tempfile.mkdtemp(prefix="ckpt-srv-")
        self.proc = None
        self.port = 0
        self.host = self.url = None

    def start(self):
        pf = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen(
            [sys.executable, self.script, "--port-file", pf] + self.args,
            stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + PATIENCE
        while not self.port:
            self.port = _read_port(pf)
            if self.port:
                break
            rc = self.proc.poll()
            if rc is not None:
                self.stop()
                raise RuntimeError("%s exited with %d at start"
                                   % (self.name, rc))
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("%s wrote no port in %.0f s"
                                   % (self.name, PATIENCE))
            time.sleep(0.02)
        self.host = "127.0.0.1:%d" % self.port
        self.url = "http://" + self.host
        return self

    def stop(self):
        """SIGTERM (SIGKILL after PATIENCE); its exit status (None if it
        never ran). Can be called again."""
        rc = None
        if self.proc is not None:
            if self.proc.returncode is None:
                self.proc.terminate()
            try:
                rc = self.proc.wait(PATIENCE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = "hung"
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, etype, *_):
        rc = self.stop()
        if etype is None and rc != 0:
            raise AssertionError("%s: exit status %s after SIGTERM"
                                 % (self.name, rc))
