"""tpu_store: the state behind fake_tpu.py: nodes, long-running
operations, log entries, injected failures, the calls received.

Python 3 standard library only; no I/O (fake_tpu.py speaks HTTP). Every
method takes the one lock; time moves lazily: each call first finishes
the operations and applies the scheduled changes (/_fake/... after_s)
whose time has come, in due order (advance()), stamped with the time
they were due, so what a client sees never depends on a timer thread.

  POST nodes?nodeId --create()--> node CREATING + op --op_delay_s-->
  node READY/HEALTHY, op done {response: Node}   (or error, node gone)
  DELETE node --delete()--> node DELETING + op --op_delay_s--> node gone,
  op done {response: Empty}

See fake_tpu.py's top for the protocol; FAKE marks simplifications.
"""

import base64
import copy
import datetime
import hashlib
import json
import random
import re
import threading
import time

import logging_filter

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
OPMETA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
AUDIT_TYPE = "type.googleapis.com/google.cloud.audit.AuditLog"
SYSTEM_EVENT = "cloudaudit.googleapis.com%2Fsystem_event"
ACTIVITY = "cloudaudit.googleapis.com%2Factivity"
CREATE = "google.cloud.tpu.v2.Tpu.CreateNode"
DELETE = "google.cloud.tpu.v2.Tpu.DeleteNode"
# fields a client may set in a create body; the rest are output only
SETTABLE = ("description", "acceleratorType", "acceleratorConfig",
            "runtimeVersion", "networkConfig", "networkConfigs",
            "cidrBlock", "serviceAccount", "schedulingConfig", "labels",
            "metadata", "tags", "dataDisks", "shieldedInstanceConfig",
            "bootDiskConfig")
NODE_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
NODE_NAME = re.compile(r"projects/([^/]+)/locations/([^/]+)/nodes/([^/]+)$")
GRPC = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3,
        "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5, "ALREADY_EXISTS": 6,
        "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
        "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11,
        "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14,
        "DATA_LOSS": 15, "UNAUTHENTICATED": 16}
HTTP_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED",
               403: "PERMISSION_DENIED", 404: "NOT_FOUND",
               409: "ALREADY_EXISTS", 412: "FAILED_PRECONDITION",
               429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
               500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
               504: "DEADLINE_EXCEEDED"}
DEFAULT_CONFIG = {
        "op_delay_s": 0.5,        # time until an operation is done
        "quota_exhausted": False,  # creates end in RESOURCE_EXHAUSTED
        "create_error": None,     # {"code", "message"}: creates end so
        "create_state": "READY",  # a created node's state and health
        "create_health": "HEALTHY",
        "token": None,            # if set, the only bearer token accepted
        "max_requests": 10000,    # calls kept for /_fake/requests
        }


def merge(node, fields):
    """Sets fields in a node; a None value removes the field."""
    for k, v in fields.items():
        if v is None:
            node.pop(k, None)
        else:
            node[k] = copy.deepcopy(v)


class ApiError(Exception):
    """An error reply in Google's JSON error format."""

    def __init__(self, code, message, status=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or HTTP_STATUS.get(code, "UNKNOWN")

    def body(self):
        return {"error": {"code": self.code, "message": self.message,
                          "status": self.status}}


def rfc3339(t=None):
    """Wall-clock time as Google writes it: UTC, microseconds, Z."""
    dt = datetime.datetime.fromtimestamp(
        time.time() if t is None else t, datetime.timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def time_key(entry):
    t = logging_filter.parse_time(str(entry.get("timestamp", "")))
    return t if t is not None else (0, 0)


TPU_TYPES = {"v2": ("V2", 2, 2), "v3": ("V3", 2, 2), "v4": ("V4", 2, 3),
             "v5p": ("V5P", 2, 3), "v5litepod": ("V5LITE_POD", 1, 2),
             "v6e": ("V6E", 1, 2)}  # (type, cores a chip, dimensions)
TOPOLOGY = {2: {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
                128: "8x16", 256: "16x16"},
            3: {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4",
                64: "4x4x4", 128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}}


def slice_shape(accel):
    """(hosts, acceleratorConfig or None) of an acceleratorType such as
    v4-32. FAKE: from the public tables for common sizes; v2/v3/v4/v5p
    hosts hold 8 cores, v5e/v6e hosts 4 chips (8 for a single host)."""
    m = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accel or "")
    if not m or m.group(1) not in TPU_TYPES:
        return 1, None
    kind, per_chip, dims = TPU_TYPES[m.group(1)]
    n = int(m.group(2))
    chips = n // per_chip
    if per_chip == 2:
        hosts = max(1, n // 8)
    else:
        hosts = 1 if n <= 8 else n // 4
    topo = TOPOLOGY[dims].get(chips)
    return hosts, ({"type": kind, "topology": topo} if topo else None)


def proto3(obj):
    """A message as proto3 JSON prints it: false, 0, "" and empty
    fields left out (maps such as metadata are not passed here)."""
    if isinstance(obj, dict):
        out = {k: proto3(v) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v not in (False, 0, "",
                                                           None, [], {})}
    if isinstance(obj, list):
        return [proto3(v) for v in obj]
    return obj


class Token:
    """Opaque page tokens bound to the query they page through."""

    @staticmethod
    def sig(query):
        return hashlib.sha256(json.dumps(query, sort_keys=True)
                              .encode()).hexdigest()[:12]

    @staticmethod
    def make(offset, query):
        raw = json.dumps({"o": offset, "q": Token.sig(query)}).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def read(token, query):
        """The offset a token continues at (0 without one)."""
        if not token:
            return 0
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            d = json.loads(raw)
            off = int(d["o"])
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "Invalid page token.")
        if off < 0 or d.get("q") != Token.sig(query):
            raise ApiError(400, "The page token does not belong to this "
                           "request.")
        return off


class Store:
    def __init__(self):
        self.lock = threading.Lock()
        self.nodes = {}    # full name -> node JSON
        self.ops = {}      # full name -> {"op", "due", "finish"}
        self.logs = []     # log entries, in arrival order
        self.fails = []    # {"method", "path", "status", "count", ...}
        self.later = []    # {"due", "due_wall", "finish"}: scheduled
        self.requests = []
        self.config = dict(DEFAULT_CONFIG)
        self.seq = 0
        self.rng = random.Random(7)

    # ---- housekeeping
    def advance(self):
        """Finishes the operations and applies the scheduled changes whose
        time has come, in the order they were due."""
        now = time.monotonic()
        with self.lock:
            due = [r for r in self.ops.values()
                   if not r["op"]["done"] and r["due"] <= now]
            due += [r for r in self.later if r["due"] <= now]
            self.later = [r for r in self.later if r["due"] > now]
            for rec in sorted(due, key=lambda r: r["due"]):
                at = rfc3339(rec["due_wall"])  # when it was due
                rec["finish"](at)
                if "op" in rec:
                    rec["op"]["done"] = True
                    rec["op"]["metadata"]["endTime"] = at

    def schedule(self, after_s, fn):
        """fn(at) to run after_s from now (lazily, at the next call after
        that); the caller holds the lock."""
        self.later.append({"due": time.monotonic() + after_s,
                           "due_wall": time.time() + after_s, "finish": fn})

    def record(self, method, path, query, body, auth):
        with self.lock:
            self.requests.append({"method": method, "path": path,
                                  "query": query, "body": body,
                                  "authorization": auth})
            del self.requests[:-self.config["max_requests"]]

    def take_fail(self, method, path):
        """The injected failure for this call, if any (uses one): a copy
        of the /_fake/fail request."""
        with self.lock:
            for f in self.fails:
                if f.get("method") and f["method"].upper() != method:
                    continue
                if f.get("path") and f["path"] not in path:
                    continue
                f["count"] -= 1
                if f["count"] <= 0:
                    self.fails.remove(f)
                return dict(f)
        return None

    def add_logs(self, entries):
        """Appends raw entries; insertId, timestamp and receiveTimestamp
        are filled in when absent."""
        if not all(isinstance(e, dict) for e in entries):
            raise ApiError(400, "log entries are JSON objects")
        with self.lock:
            for e in entries:
                self.seq += 1
                e.setdefault("timestamp", rfc3339())
                e.setdefault("receiveTimestamp", e["timestamp"])
                e.setdefault("insertId", "%x%06d" % (int(time.time()),
                                                     self.seq))
                self.logs.append(e)
        return len(entries)

    def check_token(self, auth):
        if not auth or not auth.startswith("Bearer ") or \
                not auth[7:].strip():
            raise ApiError(401, "Request is missing required authentication"
                           " credential. Expected OAuth 2 access token, "
                           "login cookie or other valid authentication "
                           "credential.")
        want = self.config.get("token")
        if want and auth[7:].strip() != want:
            raise ApiError(401, "Request had invalid authentication "
                           "credentials. Expected OAuth 2 access token, "
                           "login cookie or other valid authentication "
                           "credential.")

    # ---- nodes
    def fill(self, name, node):
        """Defaults for a node put through /_fake/nodes: absent fields get
        a READY, HEALTHY node's values; fields set to null are dropped."""
        m = NODE_NAME.match(name)
        if not m:
            raise ApiError(400, "node name must be projects/P/locations/Z/"
                           "nodes/N, not %r" % name)
        project, zone, _ = m.groups()
        self.seq += 1
        accel = node.get("acceleratorType") or "v4-8"
        region = zone.rsplit("-", 1)[0]
        base = {
            "name": name, "acceleratorType": accel,
            "runtimeVersion": "tpu-ubuntu2204-base",
            "state": self.config["create_state"],
            "health": self.config["create_health"],
            "createTime": rfc3339(),
            "id": str(4660000000000000000 + self.rng.randrange(10**15)),
            "apiVersion": "V2",
            "cidrBlock": "10.128.0.0/20",
            "networkConfig": {
                "network": "projects/%s/global/networks/default" % project,
                "subnetwork": "projects/%s/regions/%s/subnetworks/default"
                % (project, region), "enableExternalIps": True},
            "serviceAccount": {
                "email": "123456789012-compute@developer.gserviceaccount."
                "com", "scope": [
                    "https://www.googleapis.com/auth/cloud-platform"]},
            "schedulingConfig": {},
            "shieldedInstanceConfig": {},
        }
        hosts, accel_cfg = slice_shape(accel)
        if "acceleratorConfig" in node:  # FAKE: no type derived from it
            del base["acceleratorType"]
        elif accel_cfg:
            base["acceleratorConfig"] = accel_cfg
        out = dict(base)
        out.update(node)
        out["name"] = name
        if "networkEndpoints" not in node:
            out["networkEndpoints"] = [
                {"ipAddress": "10.128.0.%d" % (2 + w), "port": 8470,
                 "accessConfig": {"externalIp": "34.1.%d.%d" % (
                     self.seq % 250, 2 + w)}}
                for w in range(hosts)]
        return {k: v for k, v in out.items() if v is not None}

    def put_node(self, node):
        with self.lock:
            name = node.get("name", "")
            self.nodes[name] = self.fill(name, node)
            return copy.deepcopy(self.nodes[name])

    def get_node(self, name):
        with self.lock:
            if name not in self.nodes:
                raise ApiError(404, "Resource '%s' was not found" % name)
            return copy.deepcopy(self.nodes[name])

    def list_nodes(self, parent, page_size, token):
        """parent: projects/P/locations/Z (Z may be "-": every zone)."""
        with self.lock:
            proj, zone = parent.split("/")[1], parent.split("/")[3]
            names = sorted(
                n for n in self.nodes if NODE_NAME.match(n).group(1) == proj
                and zone in ("-", NODE_NAME.match(n).group(2)))
            if page_size < 0:
                raise ApiError(400, "page_size must not be negative")
            q = {"parent": parent, "n": "nodes"}
            off = Token.read(token, q)
            end = len(names) if page_size == 0 else off + page_size
            out = {"nodes": [copy.deepcopy(self.nodes[n])
                             for n in names[off:end]]}
            if end < len(names):
                out["nextPageToken"] = Token.make(end, q)
            if not out["nodes"]:
                del out["nodes"]
            return out

    def new_op(self, parent, verb, target, finish):
        """A long-running operation done after op_delay_s; the caller
        holds the lock."""
        self.seq += 1
        name = "%s/operations/operation-%d-%012x-%08x-%08x" % (
            parent, int(time.time() * 1000), self.rng.getrandbits(48),
            self.rng.getrandbits(32), self.seq)
        op = {"name": name, "metadata": {
            "@type": OPMETA_TYPE, "createTime": rfc3339(), "target": target,
            "verb": verb, "cancelRequested": False, "apiVersion": "v2"},
            "done": False}
        delay = float(self.config["op_delay_s"])
        self.ops[name] = {"op": op, "finish": finish,
                          "due": time.monotonic() + delay,
                          "due_wall": time.time() + delay}
        return copy.deepcopy(op)

    def create(self, parent, node_id, body, principal="user@example.com"):
        if not node_id or not NODE_ID.match(node_id):
            raise ApiError(400, "Invalid value for field 'nodeId': %r. Must "
                           "match regex [a-z]([-a-z0-9]*[a-z0-9])?" %
                           (node_id or ""))
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid JSON payload received.")
        if not body.get("acceleratorType") and \
                not body.get("acceleratorConfig"):
            raise ApiError(400, "Field 'acceleratorType' or "
                           "'acceleratorConfig' is required.")
        if not body.get("runtimeVersion"):
            raise ApiError(400, "Field 'runtimeVersion' is required.")
        name = "%s/nodes/%s" % (parent, node_id)
        with self.lock:
            if name in self.nodes:
                raise ApiError(409, "Resource '%s' already exists" % name)
            node = {k: copy.deepcopy(v) for k, v in body.items()
                    if k in SETTABLE}
            for k in ("networkConfig", "schedulingConfig",
                      "shieldedInstanceConfig", "serviceAccount"):
                if isinstance(node.get(k), dict):
                    node[k] = proto3(node[k])
            node = self.fill(name, node)
            node["state"] = "CREATING"
            for k in ("health", "networkEndpoints"):
                node.pop(k, None)
            self.nodes[name] = node
            err = self.config.get("create_error")
            if self.config.get("quota_exhausted") and not err:
                err = {"code": GRPC["RESOURCE_EXHAUSTED"], "message":
                       "Quota 'TPUV4sPodPerProjectPerZoneForTPUAPI' "
                       "exhausted. Limit 0 in zone %s" % parent.split("/")[3]}
            full = self.fill(name, dict(node, state=None, health=None))

            def finish(at):
                if err:
                    self.nodes.pop(name, None)
                    status = {"code": int(err.get("code", 8)),
                              "message": err.get("message", "")}
                    self.ops[op["name"]]["op"]["error"] = status
                    self.lro_audit(name, CREATE, op["name"], principal,
                                   last=True, error=status, at=at)
                    return
                self.lro_audit(name, CREATE, op["name"], principal,
                               last=True, at=at)
                n = self.nodes.get(name)
                if n is None:  # dropped meanwhile (/_fake/nodes)
                    self.ops[op["name"]]["op"]["error"] = {
                        "code": GRPC["ABORTED"], "message":
                        "The node was deleted while it was created."}
                    return
                if n["state"] == "CREATING":  # not if deleted meanwhile
                    n["state"] = self.config["create_state"]
                    n["health"] = self.config["create_health"]
                    n["networkEndpoints"] = full["networkEndpoints"]
                self.ops[op["name"]]["op"]["response"] = dict(
                    copy.deepcopy(n), **{"@type": NODE_TYPE})
            op = self.new_op(parent, "create", name, finish)
            self.lro_audit(name, CREATE, op["name"], principal,
                           request=dict(body, nodeId=node_id))
            return op

    def delete(self, name, principal="user@example.com"):
        with self.lock:
            if name not in self.nodes:
                raise ApiError(404, "Resource '%s' was not found" % name)
            self.nodes[name]["state"] = "DELETING"

            def finish(at):
                self.lro_audit(name, DELETE, op["name"], principal,
                               last=True, at=at)
                self.nodes.pop(name, None)
                self.ops[op["name"]]["op"]["response"] = {
                    "@type": EMPTY_TYPE}
            op = self.new_op(name.rsplit("/nodes/", 1)[0], "delete", name,
                             finish)
            self.lro_audit(name, DELETE, op["name"], principal)
            return op

    def get_op(self, name):
        with self.lock:
            if name not in self.ops:
                raise ApiError(404, "Operation '%s' not found" % name)
            return copy.deepcopy(self.ops[name]["op"])

    def list_ops(self, parent):
        with self.lock:
            ops = [copy.deepcopy(r["op"]) for n, r in sorted(
                self.ops.items()) if n.startswith(parent + "/")]
            return {"operations": ops} if ops else {}

    # ---- maintenance and audit entries
    def audit(self, node_name, log, method, principal, metadata=None,
              request=None, at=None, operation=None, status=None):
        """Appends an audit entry; the caller holds the lock."""
        project, zone, node_id = NODE_NAME.match(node_name).groups()
        self.seq += 1
        ts = at or rfc3339()
        payload = {"@type": AUDIT_TYPE, "status": status or {},
                   "authenticationInfo": {"principalEmail": principal},
                   "serviceName": "tpu.googleapis.com",
                   "methodName": method, "resourceName": node_name}
        if metadata:
            payload["metadata"] = metadata
        if request is not None:
            payload["request"] = request
        self.logs.append({
            "protoPayload": payload,
            "insertId": "%x%06d" % (int(time.time()), self.seq),
            "resource": {"type": "tpu_worker", "labels": {
                "project_id": project, "zone": zone, "node_id": node_id,
                "worker_id": "0"}},
            "timestamp": ts, "severity": "NOTICE",
            "logName": "projects/%s/logs/%s" % (project, log),
            "operation": operation or {
                "id": "systemevent-%d-%012x" % (int(time.time() * 1000),
                                                self.rng.getrandbits(48)),
                "producer": method, "first": True, "last": True},
            "receiveTimestamp": ts})

    def lro_audit(self, node_name, method, op_name, principal, last=False,
                  error=None, request=None, at=None):
        """An admin-activity entry of a long-running call: one when it
        starts (operation.first), one when it ends (operation.last)."""
        self.audit(node_name, ACTIVITY, method, principal, request=request,
                   at=at, operation={"id": op_name, "producer":
                              "tpu.googleapis.com",
                              ("last" if last else "first"): True},
                   status=error)

    def maintenance(self, req):
        """/_fake/maintenance: now, or after_s from now."""
        name = req.get("node", "")
        kind = req.get("kind", "terminate")
        if kind not in ("terminate", "restart"):
            raise ApiError(400, "kind must be terminate or restart")
        with self.lock:
            if name not in self.nodes:
                raise ApiError(404, "Resource '%s' was not found" % name)
            if req.get("after_s") is None:
                self.apply_maintenance(req, name, kind, req.get("time"))
                return copy.deepcopy(self.nodes[name])
            self.schedule(float(req["after_s"]), lambda at: name in
                          self.nodes and self.apply_maintenance(
                              req, name, kind, at))
            return {"scheduled": True, "after_s": float(req["after_s"])}

    def apply_maintenance(self, req, name, kind, at):
        """The node's change and its system-event entry; the caller holds
        the lock."""
        node = self.nodes[name]
        at = at or rfc3339()
        if kind == "terminate":
            node["health"] = req.get("health", "UNHEALTHY_MAINTENANCE")
        elif "health" in req:
            node["health"] = req["health"]
        if "state" in req:
            node["state"] = req["state"]
        node["healthDescription"] = req.get(
            "healthDescription", "The TPU had a maintenance event at %s" % at)
        merge(node, req.get("set", {}))
        meta = {}
        if kind == "terminate":
            meta["terminateReason"] = req.get(
                "reason", "Instance was terminated by maintenance")
        self.audit(name, SYSTEM_EVENT, "tpu.nodes." + kind,
                   "system@google.com", metadata=meta, at=at)

    def patch_node(self, req):
        """/_fake/nodes PATCH: fields merged into a node (null removes
        one), now or after_s from now."""
        req = dict(req)
        name = req.pop("name", "")
        after = req.pop("after_s", None)
        with self.lock:
            if name not in self.nodes:
                raise ApiError(404, "Resource '%s' was not found" % name)
            if after is None:
                merge(self.nodes[name], req)
                return copy.deepcopy(self.nodes[name])
            self.schedule(float(after), lambda at: name in self.nodes and
                          merge(self.nodes[name], req))
            return {"scheduled": True, "after_s": float(after)}

    # ---- entries:list
    def list_entries(self, req):
        names = list(req.get("resourceNames") or []) + [
            "projects/" + p for p in req.get("projectIds") or []]
        if not names:
            raise ApiError(400, "resourceNames is required.")
        for n in names:
            if not re.fullmatch(r"(projects|organizations|folders|"
                                r"billingAccounts)/[^/]+(/.*)?", n):
                raise ApiError(400, "Invalid resource name: %r" % n)
        order = " ".join(str(req.get("orderBy") or
                             "timestamp asc").lower().split())
        if order not in ("timestamp asc", "timestamp desc"):
            raise ApiError(400, "Invalid orderBy: %r; only \"timestamp "
                           "asc\" and \"timestamp desc\" are allowed." %
                           req.get("orderBy"))
        size = int(req.get("pageSize") or 50)
        if size < 0 or size > 1000:
            raise ApiError(400, "pageSize must be between 0 and 1000.")
        try:
            tree = logging_filter.parse(req.get("filter", ""))
        except logging_filter.FilterError as e:
            raise ApiError(400, "Unparseable filter: %s" % e)
        q = {"r": sorted(names), "f": req.get("filter", ""), "o": order}
        off = Token.read(req.get("pageToken"), q)
        with self.lock:
            logs = list(self.logs)
        prefixes = tuple(n.split("/locations/")[0] + "/logs/"
                         for n in names)
        try:
            hits = [e for e in logs
                    if str(e.get("logName", "")).startswith(prefixes)
                    and logging_filter.matches(tree, e)]
        except logging_filter.FilterError as e:
            raise ApiError(400, "Unparseable filter: %s" % e)
        hits.sort(key=time_key, reverse=(order == "timestamp desc"))
        out = {}
        if hits[off:off + size]:
            out["entries"] = copy.deepcopy(hits[off:off + size])
        if off + size < len(hits):
            out["nextPageToken"] = Token.make(off + size, q)
        return out
