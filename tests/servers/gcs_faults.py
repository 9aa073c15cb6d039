"""Fault injection for the fake Cloud Storage server.

Two sources, both producing a Fault that the HTTP handler carries out:

1. The retry-test interface of Google's emulator (storage-testbench):
   POST /retry_test {"instructions": {"storage.objects.insert": [...]}}
   creates a test; requests that carry `x-retry-test-id: ID` and map to a
   method with queued instructions take the first one. Instruction grammar
   (see fake_gcs.py for what each does on the wire):
     return-X                      answer HTTP X
     return-X-after-YK             take Y KiB of the upload body, answer X
     return-reset-connection       TCP RST, no answer
     return-broken-stream          send 4 bytes of the answer, then drop
     return-broken-stream-after-YK send Y KiB of a download, then drop
     stall-for-Ts-after-YK         pause T seconds after Y KiB, then go on
   "-after-YK" instructions are consumed only when the request really
   reaches Y KiB (as in the testbench, where the fault fires once the
   upload holds Y KiB); the other ones are consumed by the first matching
   request. GET /retry_test/ID reports the instructions left and
   `completed` (nothing left).

2. A random mode for soaks (test-only extension, not in the testbench):
   --fault-rate P --fault-seed S makes each Cloud Storage API request fail
   with probability P, picking uniformly among 503, 429, reset, broken
   stream and stall (a stall is 1-3 s, then the request is served).
   Counts are reported by GET /_fake/stats.

3. Lost replies (test-only extension, not in the testbench): the request
   that completes an upload to one object (a media or multipart insert,
   or a resumable session's final piece) is carried out, the object is
   stored, and then the connection is reset instead of answering; the
   client cannot tell whether the write landed. Armed per object name,
   for `times` requests, with no header on the requests (so it reaches
   clients that do not send x-retry-test-id):
     POST /_fake/lost_reply {"bucket": B, "name": N, "times": K}
     GET /_fake/lost_reply -> {"rules": [{"bucket", "name", "times",
                                          "fired"}]}
     DELETE /_fake/lost_reply -> every rule removed
   Each reset is counted in GET /_fake/stats as the fault "lost-reply".
"""

import random
import re
import threading
import uuid

_RE_CODE = re.compile(r"return-([0-9]{3})$")
_RE_CODE_AFTER = re.compile(r"return-([0-9]{3})-after-([0-9]+)K$")
_RE_RESET = re.compile(r"return-reset-connection$")
_RE_BROKEN = re.compile(r"return-broken-stream$")
_RE_BROKEN_AFTER = re.compile(r"return-broken-stream-after-([0-9]+)K$")
_RE_STALL = re.compile(r"stall-for-([0-9]+)s-after-([0-9]+)K$")


class Fault:
    """What to do to one request.

    kind: 'status' (answer `code` once `after` body bytes were taken, or at
    once when after is None), 'reset', 'broken' (send `after` bytes of the
    answer then drop; the default 4 as in the testbench), 'stall' (sleep
    `seconds` once `after` bytes went through, then continue).
    `consume` is called when the fault really fires.
    """

    def __init__(self, kind, code=0, after=None, seconds=0.0, consume=None,
                 label=""):
        self.kind = kind
        self.code = code
        self.after = after
        self.seconds = seconds
        self.label = label
        self._consume = consume
        self.fired = False

    def fire(self):
        if not self.fired:
            self.fired = True
            if self._consume:
                self._consume()


def parse_instruction(text):
    """Fault for one instruction string, or None when it is unknown."""
    m = _RE_CODE.match(text)
    if m:
        return Fault("status", code=int(m.group(1)), label=text)
    m = _RE_CODE_AFTER.match(text)
    if m:
        return Fault("status", code=int(m.group(1)),
                     after=int(m.group(2)) * 1024, label=text)
    if _RE_RESET.match(text):
        return Fault("reset", label=text)
    if _RE_BROKEN.match(text):
        return Fault("broken", after=4, label=text)
    m = _RE_BROKEN_AFTER.match(text)
    if m:
        return Fault("broken", after=int(m.group(1)) * 1024, label=text)
    m = _RE_STALL.match(text)
    if m:
        return Fault("stall", seconds=float(m.group(1)),
                     after=int(m.group(2)) * 1024, label=text)
    return None


class RetryTests:
    """The retry_test resources, shared by all handler threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tests = {}

    def create(self, instructions, transport="HTTP"):
        if not isinstance(instructions, dict) or not instructions:
            raise ValueError("instructions is not defined")
        for method, items in instructions.items():
            if not isinstance(items, list):
                raise ValueError("instructions for %s must be a "
                                 "list" % method)
            for it in items:
                if not isinstance(it, str) or \
                   parse_instruction(it) is None:
                    raise ValueError("unknown instruction %r"
                                     % (it,))
        tid = uuid.uuid4().hex
        with self.lock:
            self.tests[tid] = {
                    "id": tid,
                    "instructions": {k: list(v) for k, v in
                                     instructions.items()},
                    "transport": transport,
            }
            return self._view(tid)

    def _view(self, tid):
        t = self.tests[tid]
        left = {k: list(v) for k, v in t["instructions"].items()}
        return {"id": tid, "instructions": left,
                "transport": t["transport"],
                "completed": not any(left.values())}

    def get(self, tid):
        with self.lock:
            return self._view(tid) if tid in self.tests else None

    def list(self):
        with self.lock:
            return [self._view(t) for t in self.tests]

    def delete(self, tid):
        with self.lock:
            return self.tests.pop(tid, None) is not None

    def next_fault(self, tid, method):
        """The fault for this request, or None."""
        with self.lock:
            t = self.tests.get(tid)
            if t is None:
                return None
            queue = t["instructions"].get(method)
            if not queue:
                return None
            text = queue[0]
        fault = parse_instruction(text)

        def consume():
            with self.lock:
                q = self.tests.get(tid, {}).get(
                        "instructions", {}).get(method)
                if q and q[0] == text:
                    q.pop(0)
        fault._consume = consume
        return fault


class RandomFaults:
    """--fault-rate mode: a seeded random fault for some requests."""

    KINDS = ("503", "429", "reset", "broken", "stall")

    def __init__(self, rate, seed):
        self.rate = rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def next_fault(self, has_body, is_download):
        if self.rate <= 0:
            return None
        with self.lock:
            if self.rng.random() >= self.rate:
                return None
            kind = self.rng.choice(self.KINDS)
            frac = self.rng.random()
            secs = 1.0 + 2.0 * self.rng.random()
        if kind in ("503", "429"):
            # half of the upload faults happen mid-body
            after = None
            if has_body and frac < 0.5:
                after = int(frac * 2 * (8 << 20))
            return Fault("status", code=int(kind), after=after,
                         label="random-" + kind)
        if kind == "reset":
            return Fault("reset", label="random-reset")
        if kind == "broken":
            if not is_download:
                return Fault("reset", label="random-reset")
            return Fault("broken", after=int(frac * (4 << 20)),
                         label="random-broken")
        return Fault("stall", seconds=secs, after=int(frac * (1 << 20)),
                     label="random-stall")


class LostReplies:
    """Lost-reply rules: store the upload, then reset (see above)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rules = []

    def arm(self, req):
        """Add the rule of a POST body; ValueError when malformed."""
        if not isinstance(req, dict):
            raise ValueError("expected a JSON object")
        bucket, name = req.get("bucket"), req.get("name")
        times = req.get("times", 1)
        if not isinstance(bucket, str) or not isinstance(name, str) or \
           not bucket or not name:
            raise ValueError("bucket and name are required strings")
        if not isinstance(times, int) or times < 1:
            raise ValueError("times must be a positive integer")
        rule = {"bucket": bucket, "name": name, "times": times,
                "fired": 0}
        with self.lock:
            self.rules.append(rule)
        return dict(rule)

    def view(self):
        with self.lock:
            return [dict(r) for r in self.rules]

    def clear(self):
        with self.lock:
            self.rules = []

    def take(self, bucket, name):
        """A reset Fault for the upload just stored, or None (the rule
        is used up here: the caller resets at once)."""
        with self.lock:
            for r in self.rules:
                if r["bucket"] == bucket and r["name"] == name and \
                   r["fired"] < r["times"]:
                    r["fired"] += 1
                    return Fault("reset", label="lost-reply")
        return None
