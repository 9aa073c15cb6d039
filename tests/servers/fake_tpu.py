#!/usr/bin/python3
"""fake_tpu: a loopback Cloud TPU API v2 and Cloud Logging API v2
(entries:list) for ckpt's tests (issue 9: ckptctl health, events --audit,
recover).

Python 3 standard library only. Started by the tests on 127.0.0.1 with port
0; the chosen port is printed ("fake_tpu listening on
http://127.0.0.1:PORT") and, with --port-file, written atomically to a file
once it serves. SIGTERM/SIGINT stop it cleanly. One process serves both
APIs on one port (their paths do not collide), so a client points both
endpoint overrides at it:

    python3 tests/servers/fake_tpu.py --port-file P [--nodes FILE]
        [--op-delay S] [--verbose]
    CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=http://127.0.0.1:PORT/
    CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING=http://127.0.0.1:PORT/

  client --HTTP--> Handler --auth, injected failure--> Store (tpu_store.py)
     nodes / operations (finished lazily when due) / log entries
     entries:list --filter--> logging_filter.py

THE REAL PROTOCOL (Google's REST references for tpu.googleapis.com v2 and
logging.googleapis.com v2, and the calls gcloud 528 makes, seen with
--log-http; FAKE marks guesses and simplifications):
- Every call carries `Authorization: Bearer TOKEN`; without one: 401
  UNAUTHENTICATED. Errors are Google's JSON error format
  {"error": {"code": HTTP, "message", "status": "NOT_FOUND"...}} with
  Content-Type application/json. The query parameter alt=json (gcloud
  sends it) is accepted and ignored, as are other system parameters.
- GET  /v2/projects/P/locations/Z/nodes/N        nodes.get (`gcloud
  compute tpus tpu-vm describe`): the Node, or 404 NOT_FOUND.
- GET  /v2/projects/P/locations/Z/nodes          nodes.list (`tpu-vm
  list`), pageSize/pageToken: {"nodes": [...], "nextPageToken"}; Z "-"
  lists every zone. FAKE: no pageSize means every node in one page.
- POST /v2/projects/P/locations/Z/nodes?nodeId=N nodes.create (`tpu-vm
  create`): body a Node (acceleratorType or acceleratorConfig and
  runtimeVersion required: 400; nodeId must match
  [a-z]([-a-z0-9]*[a-z0-9])?: 400; an existing name: 409
  ALREADY_EXISTS). The node exists at once in state CREATING; the reply
  is an Operation.
- DELETE /v2/projects/P/locations/Z/nodes/N      nodes.delete: the node
  goes to DELETING; the reply is an Operation.
- GET  /v2/projects/P/locations/Z/operations/OP  operations.get (gcloud
  polls it until done); GET .../operations lists them.
  Operation: {"name": "projects/P/locations/Z/operations/operation-...",
  "metadata": {"@type": "type.googleapis.com/google.cloud.tpu.v2.
  OperationMetadata", "createTime", "target", "verb", "apiVersion",
  "endTime" once done}, "done": bool, then either "response" (the Node
  with "@type": "type.googleapis.com/google.cloud.tpu.v2.Node" for a
  create, {"@type": "type.googleapis.com/google.protobuf.Empty"} for a
  delete) or "error" (a google.rpc.Status: {"code": gRPC code, e.g. 8
  RESOURCE_EXHAUSTED, "message"}: no "status" name in it). An operation
  is done op_delay_s after it started; a create then leaves the node
  READY and HEALTHY with networkEndpoints, a delete removes it, a failed
  create removes the node.
- Node: name (full resource name), acceleratorType, runtimeVersion,
  state (CREATING READY RESTARTING REIMAGING DELETING REPAIRING STOPPED
  STOPPING STARTING PREEMPTED TERMINATED HIDING HIDDEN UNHIDING), health
  (HEALTHY TIMEOUT UNHEALTHY_TENSORFLOW UNHEALTHY_MAINTENANCE; absent when
  unspecified), healthDescription, symptoms[] (objects: {"createTime",
  "symptomType": LOW_MEMORY OUT_OF_MEMORY EXECUTE_TIMED_OUT
  MESH_BUILD_FAIL HBM_OUT_OF_MEMORY PROJECT_ABUSE, "details",
  "workerId"}), upcomingMaintenance {type SCHEDULED|UNSCHEDULED,
  canReschedule (a JSON bool here, unlike the metadata server's string),
  windowStartTime, windowEndTime, latestWindowStartTime,
  maintenanceStatus PENDING|ONGOING}, networkConfig, networkEndpoints[],
  serviceAccount, schedulingConfig, metadata{} (startup-script...),
  labels, tags, createTime, id (int64 as a string), apiVersion "V2",
  cidrBlock, shieldedInstanceConfig. Output-only fields in a create body
  are ignored. FAKE: one networkEndpoint per 8 cores of v2/v3/v4 types,
  one otherwise; no acceleratorConfig is derived from acceleratorType.
- POST /v2/entries:list (`gcloud logging read`): JSON body resourceNames
  (projects/P ...; deprecated projectIds too; none: 400), filter (the
  Logging query language, see logging_filter.py; unparseable: 400),
  orderBy "timestamp asc" (default) | "timestamp desc" (else 400),
  pageSize (default 50, 1..1000, else 400), pageToken (opaque, bound to
  the query: another query's token is 400). Reply {"entries": [...],
  "nextPageToken"}; no match is {}. An entry belongs to the project its
  logName names (projects/P/logs/...). gcloud adds
  `timestamp>="NOW-1d"` (its --freshness) to the filter and asks
  "timestamp desc", pageSize = --limit or 1000.
- Audit entries (system events, logName projects/P/logs/
  cloudaudit.googleapis.com%2Fsystem_event): protoPayload {"@type":
  AuditLog, serviceName tpu.googleapis.com, methodName tpu.nodes.terminate
  | tpu.nodes.restart, resourceName the node, metadata.terminateReason for
  terminations}, resource {type, labels {project_id, zone, node_id}},
  timestamp, receiveTimestamp, severity NOTICE, insertId, operation {id
  "systemevent-...", producer, first, last}. Creates and deletes through
  the API add admin-activity entries (log
  cloudaudit.googleapis.com%2Factivity, methodName
  google.cloud.tpu.v2.Tpu.CreateNode / DeleteNode), two per call as for
  every long-running method: at the start (operation {id: the
  operation's name, first: true}) and at the end (last: true, the
  error in protoPayload.status if it failed). FAKE: the resource type
  "tpu_worker" and worker_id "0" are a guess for these entries.

TEST-ONLY EXTENSIONS (not part of any Google API; no token needed, never
failed, not recorded; JSON bodies and replies):
- POST /_fake/nodes NODE (or a list): puts nodes. NODE["name"] is the full
  name projects/P/locations/Z/nodes/N; absent fields get a READY, HEALTHY
  node's values; a field set to null is left out (e.g. "health": null for
  HEALTH_UNSPECIFIED). GET /_fake/nodes: every node. DELETE
  /_fake/nodes?name=FULL drops one at once (no operation).
  PATCH /_fake/nodes {"name": FULL, field: value|null, ..., "after_s":
  S}: merges fields into a node (null removes one; nothing else
  changes), now or S seconds from now (a node that recovers by itself).
- POST /_fake/maintenance {"node": FULL, "kind": "terminate"|"restart",
  "reason", "health", "state", "healthDescription", "time": RFC3339,
  "set": {field: value|null}, "after_s": S}: changes the node
  (terminate: health UNHEALTHY_MAINTENANCE unless given;
  healthDescription "The TPU had a maintenance event at T") and appends
  the system-event entry (tpu.nodes.terminate with
  metadata.terminateReason, or tpu.nodes.restart) at "time" (default:
  when applied). Reply: the node; with after_s it is applied S seconds
  later (reply {"scheduled": true}), so a test can have a node go down
  or come back while a command watches it. Scheduled changes and
  operations are applied lazily, at the first call (API or control)
  after they are due, in the order they were due.
- POST /_fake/logs ENTRY or [ENTRY...]: appends raw log entries (filled
  in when absent: insertId, timestamp now, receiveTimestamp). An entry
  is listed for projects/P only if its logName starts projects/P/logs/.
  GET /_fake/logs: all of them.
- POST /_fake/fail {"method": "POST", "path": "substring", "status": 429,
  "count": 2, "message": "...", "grpc_status": "...", "kind": K,
  "delay_s": S, "hang_s": H}: the next count (default 1) API calls that
  match (method and path substring, either may be left out) fail, after
  delay_s (default 0). Kinds: status (default): that HTTP status in
  Google's error format (status name from the code unless grpc_status);
  reset: the connection closed with a TCP RST, no reply; hang: no reply
  for hang_s (default 30) s, then closed; delay: answered normally after
  delay_s. DELETE /_fake/fail drops them all.
- POST /_fake/config {"op_delay_s": 0.5, "quota_exhausted": true,
  "create_error": {"code", "message"}, "create_state", "create_health",
  "token": T}: quota_exhausted makes create operations end with error
  code 8 RESOURCE_EXHAUSTED (and no node); token makes any other bearer
  token a 401. GET /_fake/config shows the settings.
- GET /_fake/requests: the API calls received, in order: {"method",
  "path", "query": {name: value}, "body": JSON or null,
  "authorization"}. DELETE /_fake/requests forgets them.
"""

import argparse
import http.server
import json
import os
import re
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpu_store  # noqa: E402
from tpu_store import ApiError  # noqa: E402

NODE = re.compile(r"/v2/(projects/[^/]+/locations/[^/]+/nodes/[^/]+)$")
NODES = re.compile(r"/v2/(projects/[^/]+/locations/[^/]+)/nodes$")
OP = re.compile(r"/v2/(projects/[^/]+/locations/[^/]+/operations/[^/]+)$")
FAIL_KINDS = ("status", "reset", "hang", "delay")
OPS = re.compile(r"/v2/(projects/[^/]+/locations/[^/]+)/operations$")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ESF"
    sys_version = ""

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("fake_tpu: " + (fmt % args) + "\n")

    def send_json(self, code, obj):
        data = (json.dumps(obj, indent=2) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Vary", "Origin, X-Origin, Referer")
        self.end_headers()
        self.wfile.write(data)

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raw = self.read_chunked()
        else:
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self.close_connection = True
                raise ApiError(400, "Invalid Content-Length.")
            raw = self.rfile.read(n) if n > 0 else b""
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "Invalid JSON payload received.")

    def read_chunked(self):
        """A request body sent with Transfer-Encoding: chunked."""
        out = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0",
                       16)
            if size == 0:
                while self.rfile.readline().strip():  # trailers
                    pass
                return out
            out += self.rfile.read(size)
            self.rfile.readline()  # the CRLF after the chunk

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def do_PATCH(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def dispatch(self):
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = dict(urllib.parse.parse_qsl(url.query,
                                            keep_blank_values=True))
        try:
            if path.startswith("/_fake/"):
                return self.control(path[7:], query)
            body = self.read_body()
        except ApiError as e:
            return self.send_json(e.code, e.body())
        store = self.server.store
        store.record(self.command, path, query, body,
                     self.headers.get("Authorization"))
        try:
            store.check_token(self.headers.get("Authorization"))
            fail = store.take_fail(self.command, path)
            if fail and self.inject(fail):
                return
            store.advance()
            code, reply = self.api(path, query, body)
        except ApiError as e:
            code, reply = e.code, e.body()
        self.send_json(code, reply)

    def api(self, path, query, body):
        store = self.server.store
        m = NODE.match(path)
        if m and self.command == "GET":
            return 200, store.get_node(m.group(1))
        if m and self.command == "DELETE":
            return 200, store.delete(m.group(1))
        m = NODES.match(path)
        if m and self.command == "GET":
            try:
                size = int(query.get("pageSize") or 0)
            except ValueError:
                raise ApiError(400, "Invalid value for pageSize")
            return 200, store.list_nodes(m.group(1), size,
                                         query.get("pageToken"))
        if m and self.command == "POST":
            return 200, store.create(m.group(1), query.get("nodeId"),
                                     body or {})
        m = OP.match(path)
        if m and self.command == "GET":
            return 200, store.get_op(m.group(1))
        m = OPS.match(path)
        if m and self.command == "GET":
            return 200, store.list_ops(m.group(1))
        if path == "/v2/entries:list" and self.command == "POST":
            return 200, store.list_entries(body or {})
        if NODE.match(path) or NODES.match(path) or OP.match(path) or \
                path == "/v2/entries:list":
            raise ApiError(405, "Method %s not allowed on %s" % (
                self.command, path), "METHOD_NOT_ALLOWED")
        raise ApiError(404, "The requested URL %s was not found on this "
                       "server." % path)

    def inject(self, f):
        """Applies an injected failure; True when the call is answered
        (or abandoned) by it, False to go on normally after a delay."""
        time.sleep(float(f.get("delay_s", 0)))
        kind = f.get("kind", "status")
        if kind == "reset":  # TCP RST, no reply
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return True
        if kind == "hang":  # no reply for hang_s, then close
            time.sleep(float(f.get("hang_s", 30)))
            self.close_connection = True
            return True
        if kind == "delay":
            return False
        raise ApiError(int(f.get("status", 503)),
                       f.get("message") or "Injected failure.",
                       f.get("grpc_status"))

    # ---- test-only control
    def control(self, what, query):
        store = self.server.store
        body = self.read_body()
        cmd = (self.command, what)
        if what not in ("config", "requests"):
            store.advance()
        if cmd == ("POST", "nodes"):
            nodes = body if isinstance(body, list) else [body or {}]
            return self.send_json(200, [store.put_node(n) for n in nodes])
        if cmd == ("GET", "nodes"):
            with store.lock:
                return self.send_json(200, list(store.nodes.values()))
        if cmd == ("PATCH", "nodes"):
            return self.send_json(200, store.patch_node(body or {}))
        if cmd == ("DELETE", "nodes"):
            with store.lock:
                gone = store.nodes.pop(query.get("name", ""), None)
            return self.send_json(200 if gone else 404, {"deleted":
                                                         bool(gone)})
        if cmd == ("POST", "maintenance"):
            return self.send_json(200, store.maintenance(body or {}))
        if cmd == ("POST", "logs"):
            n = store.add_logs(body if isinstance(body, list) else [body])
            return self.send_json(200, {"appended": n})
        if cmd == ("GET", "logs"):
            with store.lock:
                return self.send_json(200, list(store.logs))
        if cmd == ("POST", "fail"):
            f = dict(body or {})
            f["count"] = int(f.get("count", 1))
            f["status"] = int(f.get("status", 503))
            if f.setdefault("kind", "status") not in FAIL_KINDS:
                raise ApiError(400, "kind is one of %s" % (FAIL_KINDS,))
            with store.lock:
                store.fails.append(f)
            return self.send_json(200, f)
        if cmd == ("DELETE", "fail"):
            with store.lock:
                store.fails.clear()
            return self.send_json(200, {})
        if cmd == ("POST", "config"):
            with store.lock:
                bad = sorted(set(body or {}) - set(store.config))
                if bad:
                    raise ApiError(400, "unknown settings %s" % bad)
                store.config.update(body or {})
                return self.send_json(200, dict(store.config))
        if cmd == ("GET", "config"):
            with store.lock:
                return self.send_json(200, dict(store.config))
        if cmd == ("GET", "requests"):
            with store.lock:
                return self.send_json(200, list(store.requests))
        if cmd == ("DELETE", "requests"):
            with store.lock:
                store.requests.clear()
            return self.send_json(200, {})
        raise ApiError(404, "no control %s /_fake/%s" % cmd)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, verbose=False):
        super().__init__(addr, Handler)
        self.verbose = verbose
        self.store = tpu_store.Store()

    def handle_error(self, request, client_address):
        """A client that hung up is not news; the rest only with
        --verbose."""
        if self.verbose and not isinstance(sys.exc_info()[1],
                                           ConnectionError):
            http.server.ThreadingHTTPServer.handle_error(
                self, request, client_address)


def options():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port-file", help="written (atomically) with the "
                    "port once the server answers")
    ap.add_argument("--port", type=int, default=0, help="0: any free one")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--op-delay", type=float,
                    help="seconds until an operation is done")
    ap.add_argument("--nodes", help="a JSON file: nodes to start with "
                    "(as POST /_fake/nodes takes them)")
    ap.add_argument("--verbose", action="store_true")
    return ap.parse_args()


def publish_port(path, port):
    """The port into PATH through a rename, so a reader never sees a
    partial file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)))
    with os.fdopen(fd, "w") as f:
        f.write("%d\n" % port)
    os.replace(tmp, path)


def main():
    a = options()
    # SIGTERM/SIGINT are taken with sigwait() below, blocked before any
    # thread starts so that no handler runs inside a request
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM,
                                              signal.SIGINT})
    srv = Server((a.host, a.port), a.verbose)
    if a.op_delay is not None:
        srv.store.config["op_delay_s"] = a.op_delay
    if a.nodes:
        with open(a.nodes) as f:
            nodes = json.load(f)
        for n in nodes if isinstance(nodes, list) else [nodes]:
            srv.store.put_node(n)
    loop = threading.Thread(target=srv.serve_forever, args=(0.2,))
    loop.start()
    port = srv.server_address[1]
    if a.port_file:
        publish_port(a.port_file, port)
    print("fake_tpu listening on http://%s:%d" % (a.host, port), flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    srv.shutdown()
    loop.join()
    srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
