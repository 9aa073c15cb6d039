#!/usr/bin/python3
"""Fidelity of tests/servers/fake_tpu.py, the loopback Cloud TPU API v2
and Cloud Logging API v2 (entries:list).

Usage: /usr/bin/python3 tests/test_tpu_fidelity.py MODE

  filter    the Logging query language subset (logging_filter.py):
            precedence, value lists, time and severity ordering, has,
            presence, negation, parse errors; and the page tokens;
  protocol  the wire behaviour spoken with http.client: bearer token,
            Google's error JSON, nodes get/list (paging)/create/delete with
            long-running operations, entries:list (filter, order, paging,
            limits) and every /_fake/ control (nodes, maintenance, logs,
            fail, config, requests);
  gcloud    Google's gcloud CLI with a private CLOUDSDK_CONFIG whose
            api_endpoint_overrides/tpu and /logging point at the server and
            auth/access_token_file holds a token: `compute tpus tpu-vm
            describe/list/create/delete` and `logging read` see and change
            what the server holds.

Each mode that needs a server starts its own (port 0, --port-file) and
stops it with SIGTERM, checking that it exits cleanly. Only `gcloud` can
skip (exit 77), when gcloud is not installed.
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "servers", "fake_tpu.py")
sys.path.insert(0, os.path.join(HERE, "servers"))
import logging_filter  # noqa: E402
import tpu_store  # noqa: E402
import testutil  # noqa: E402

P, Z = "ckpt-fid", "us-central2-b"
PARENT = "projects/%s/locations/%s" % (P, Z)
AUTH = {"Authorization": "Bearer ya29.test-token"}
SYS = "projects/%s/logs/cloudaudit.googleapis.com%%2Fsystem_event" % P
MAINT = 'protoPayload.methodName=("tpu.nodes.terminate" OR ' \
        '"tpu.nodes.restart")'
# a bound on how long anything may take before the test calls it a hang;
# never a speed assertion
PATIENCE = 60


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


class FakeTpu(testutil.Server):
    """fake_tpu.py in a subprocess, for one `with` block: started on port
    0, found through its port file, stopped with SIGTERM (exit 0 wanted)."""

    def __init__(self, *extra):
        testutil.Server.__init__(self, SERVER, *extra)

    def start(self):
        testutil.Server.start(self)
        self.base = self.url
        return self

    def call(self, method, path, body=None, headers=AUTH):
        """(status, parsed JSON reply) of one call on a fresh connection."""
        c = http.client.HTTPConnection("127.0.0.1", self.port,
                                       timeout=PATIENCE)
        try:
            data = json.dumps(body) if body is not None else None
            c.request(method, path, body=data, headers=dict(
                headers, **{"Content-Type": "application/json"}))
            r = c.getresponse()
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
        finally:
            c.close()

    def fake(self, method, what, body=None):
        st, rep = self.call(method, "/_fake/" + what, body, headers={})
        assert st == 200, (what, st, rep)
        return rep

    def wait_op(self, op):
        """Polls an operation until done, as gcloud does."""
        for _ in range(PATIENCE * 20):  # a hang guard, not a timing
            st, op = self.call("GET", "/v2/" + op["name"])
            assert st == 200, op
            if op["done"]:
                return op
            time.sleep(0.05)
        raise AssertionError("operation never done: %r" % op)


def node_json(name, **kw):
    n = {"name": "%s/nodes/%s" % (PARENT, name)}
    n.update(kw)
    return n


def audit_entry(node, method, ts, reason=None, project=P):
    e = {"logName": "projects/%s/logs/cloudaudit.googleapis.com%%2F"
         "system_event" % project, "timestamp": ts, "severity": "NOTICE",
         "insertId": "%s-%s" % (method, ts),
         "resource": {"type": "tpu_worker", "labels": {
             "node_id": node, "zone": Z, "project_id": project}},
         "protoPayload": {"methodName": method, "resourceName":
                          "%s/nodes/%s" % (PARENT, node)}}
    if reason:
        e["protoPayload"]["metadata"] = {"terminateReason": reason}
    return e


# --------------------------------------------------------------------------
# filter: the query language and the page tokens, no server

class Filter(unittest.TestCase):
    E1 = audit_entry("n1", "tpu.nodes.terminate",
                     "2026-12-01T10:00:00.5Z", "Host error")
    E2 = audit_entry("n1", "tpu.nodes.restart", "2026-12-01T10:05:00Z")
    E3 = audit_entry("n2", "tpu.nodes.terminate",
                     "2026-12-02T00:00:00+02:00", "Preempted")

    def sel(self, text, entries=None):
        tree = logging_filter.parse(text)
        return [e["insertId"] for e in entries or (self.E1, self.E2, self.E3)
                if logging_filter.matches(tree, e)]

    def ids(self, *es):
        return [e["insertId"] for e in es]

    def test_equality_and_value_lists(self):
        self.assertEqual(self.sel('protoPayload.methodName='
                                  '"tpu.nodes.restart"'), self.ids(self.E2))
        self.assertEqual(self.sel(MAINT), self.ids(self.E1, self.E2,
                                                   self.E3))
        self.assertEqual(self.sel('resource.labels.node_id="n2"'),
                         self.ids(self.E3))
        self.assertEqual(self.sel('resource.labels.node_id=n2'),
                         self.ids(self.E3))  # a bare word
        self.assertEqual(self.sel('logName="%s"' % SYS),
                         self.ids(self.E1, self.E2, self.E3))
        self.assertEqual(self.sel('logName="%s"' % SYS.replace(P, "x")), [])
        # not case sensitive, as the service
        self.assertEqual(self.sel('protoPayload.metadata.terminateReason='
                                  '"PREEMPTED"'), self.ids(self.E3))

    def test_and_or_precedence(self):
        both = MAINT + ' AND resource.labels.node_id="n1"'
        self.assertEqual(self.sel(both), self.ids(self.E1, self.E2))
        # juxtaposition is AND
        self.assertEqual(self.sel(MAINT + ' resource.labels.node_id="n1"'),
                         self.ids(self.E1, self.E2))
        # OR binds tighter than AND: (a OR b) AND c
        f = ('protoPayload.methodName="tpu.nodes.restart" OR '
             'protoPayload.methodName="tpu.nodes.terminate" AND '
             'resource.labels.node_id="n2"')
        self.assertEqual(self.sel(f), self.ids(self.E3))
        f = ('resource.labels.node_id="n2" AND '
             'protoPayload.methodName="tpu.nodes.terminate" OR '
             'protoPayload.methodName="tpu.nodes.restart"')
        self.assertEqual(self.sel(f), self.ids(self.E3))
        self.assertEqual(self.sel('(resource.labels.node_id="n1" AND '
                                  'protoPayload.methodName='
                                  '"tpu.nodes.restart") OR '
                                  'resource.labels.node_id="n2"'),
                         self.ids(self.E2, self.E3))

    def test_not(self):
        self.assertEqual(self.sel('NOT resource.labels.node_id="n1"'),
                         self.ids(self.E3))
        self.assertEqual(self.sel('-resource.labels.node_id="n1"'),
                         self.ids(self.E3))
        self.assertEqual(self.sel('resource.labels.node_id!="n1"'),
                         self.ids(self.E3))
        # NOT binds tighter than OR
        self.assertEqual(self.sel('NOT resource.labels.node_id="n1" OR '
                                  'protoPayload.methodName='
                                  '"tpu.nodes.restart"'),
                         self.ids(self.E2, self.E3))

    def test_timestamps(self):
        self.assertEqual(self.sel('timestamp>="2026-12-01T10:00:00.5Z"'),
                         self.ids(self.E1, self.E2, self.E3))
        self.assertEqual(self.sel('timestamp>"2026-12-01T10:00:00.5Z"'),
                         self.ids(self.E2, self.E3))
        # nanoseconds, and another offset for the same instant as E3
        self.assertEqual(self.sel('timestamp<="2026-12-01T10:00:00.500000'
                                  '000Z"'), self.ids(self.E1))
        self.assertEqual(self.sel('timestamp<"2026-12-01T22:00:00Z"'),
                         self.ids(self.E1, self.E2))
        self.assertEqual(self.sel('timestamp>="2026-12-01T22:00:00Z" '
                                  'timestamp<="2026-12-01T22:00:00Z"'),
                         self.ids(self.E3))
        self.assertEqual(self.sel('timestamp>="2026-12-01T10:01:00Z" AND '
                                  'timestamp<"2026-12-01T10:06:00Z"'),
                         self.ids(self.E2))
        self.assertEqual(logging_filter.parse_time("2026-12-01T10:00:00Z"),
                         logging_filter.parse_time(
                             "2026-12-01T12:00:00.000+02:00"))

    def test_has_presence_severity_regex(self):
        self.assertEqual(self.sel('protoPayload.metadata.terminateReason:'
                                  'host'), self.ids(self.E1))
        self.assertEqual(self.sel('protoPayload.metadata.terminateReason:*'),
                         self.ids(self.E1, self.E3))
        self.assertEqual(self.sel('severity>=NOTICE'),
                         self.ids(self.E1, self.E2, self.E3))
        self.assertEqual(self.sel('severity>WARNING'), [])
        self.assertEqual(self.sel('protoPayload.methodName=~"restart$"'),
                         self.ids(self.E2))
        self.assertEqual(self.sel('"Preempted"'), self.ids(self.E3))
        self.assertEqual(self.sel(''), self.ids(self.E1, self.E2, self.E3))
        e = {"labels": {"a.b/c": "x"}, "insertId": "q"}
        self.assertEqual(self.sel('labels."a.b/c"="x"', [e]), ["q"])

    def test_parse_errors(self):
        for bad in ('protoPayload.methodName=', '(a="b"', 'a="b")',
                    'a=("x" OR "y" AND "z")', 'a.b', 'a="unterminated',
                    'timestamp>="yesterday"', 'timestamp<("2026-01-01" OR '
                    '"soon")'):
            with self.assertRaises(logging_filter.FilterError, msg=bad):
                logging_filter.parse(bad)

    def test_page_tokens(self):
        q = {"f": "x"}
        self.assertEqual(tpu_store.Token.read(None, q), 0)
        t = tpu_store.Token.make(7, q)
        self.assertEqual(tpu_store.Token.read(t, q), 7)
        for bad, query in ((t, {"f": "y"}), ("garbage!", q), ("", q)):
            if bad == "":
                self.assertEqual(tpu_store.Token.read(bad, query), 0)
                continue
            with self.assertRaises(tpu_store.ApiError):
                tpu_store.Token.read(bad, query)


def run_filter():
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Filter)
    ok = unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful()
    return 0 if ok else 1


# --------------------------------------------------------------------------
# protocol

class Protocol(unittest.TestCase):
    """One server for the class; setUp() puts it back to a known state."""

    @classmethod
    def setUpClass(cls):
        cls.srv = cls.enterClassContext(FakeTpu("--op-delay", "0.2"))

    def setUp(self):
        s = self.srv
        s.fake("DELETE", "fail")
        s.fake("POST", "config", {"quota_exhausted": False, "token": None,
                                  "op_delay_s": 0.2})
        for n in s.fake("GET", "nodes"):
            s.call("DELETE", "/_fake/nodes?name=" + n["name"], headers={})

    def test_auth_required(self):
        s = self.srv
        s.fake("POST", "nodes", node_json("a1"))
        for hdrs in ({}, {"Authorization": "Bearer "},
                     {"Authorization": "Basic eHg6eXk="}):
            st, rep = s.call("GET", "/v2/%s/nodes/a1" % PARENT, headers=hdrs)
            self.assertEqual((st, rep["error"]["status"]),
                             (401, "UNAUTHENTICATED"), hdrs)
            self.assertEqual(rep["error"]["code"], 401)
        st, rep = s.call("POST", "/v2/entries:list", {"resourceNames": [
            "projects/" + P]}, headers={})
        self.assertEqual(st, 401)
        s.fake("POST", "config", {"token": "only-this"})
        self.assertEqual(s.call("GET", "/v2/%s/nodes/a1" % PARENT)[0], 401)
        self.assertEqual(s.call("GET", "/v2/%s/nodes/a1" % PARENT, headers={
            "Authorization": "Bearer only-this"})[0], 200)

    def test_get_and_errors(self):
        s = self.srv
        put = s.fake("POST", "nodes", node_json(
            "g1", health=None, state="PREEMPTED",
            symptoms=[{"symptomType": "HBM_OUT_OF_MEMORY", "workerId": "0",
                       "createTime": "2026-12-01T00:00:00Z",
                       "details": "d"}]))[0]
        st, node = s.call("GET", "/v2/%s/nodes/g1?alt=json" % PARENT)
        self.assertEqual((st, node), (200, put))
        self.assertEqual(node["name"], PARENT + "/nodes/g1")
        self.assertNotIn("health", node)  # HEALTH_UNSPECIFIED: left out
        self.assertEqual(node["state"], "PREEMPTED")
        for k in ("acceleratorType", "runtimeVersion", "networkConfig",
                  "networkEndpoints", "createTime", "id", "apiVersion"):
            self.assertIn(k, node)
        st, rep = s.call("GET", "/v2/%s/nodes/nope" % PARENT)
        self.assertEqual(st, 404)
        self.assertEqual(rep["error"]["status"], "NOT_FOUND")
        self.assertIn(PARENT + "/nodes/nope", rep["error"]["message"])
        self.assertEqual(s.call("GET", "/v2/projects/x/nodes")[0], 404)
        self.assertEqual(s.call("PATCH", "/v2/%s/nodes/g1" % PARENT, {})[0],
                         405)

    def test_list_and_paging(self):
        s = self.srv
        names = ["l%d" % i for i in range(5)]
        s.fake("POST", "nodes", [node_json(n) for n in names] + [
            {"name": "projects/%s/locations/europe-west4-a/nodes/x" % P},
            {"name": "projects/other/locations/%s/nodes/y" % Z}])
        st, rep = s.call("GET", "/v2/%s/nodes" % PARENT)
        self.assertEqual([n["name"].rsplit("/", 1)[1] for n in rep["nodes"]],
                         names)
        self.assertNotIn("nextPageToken", rep)
        got, token, pages = [], None, 0
        while True:
            q = "pageSize=2" + ("&pageToken=" + token if token else "")
            st, rep = s.call("GET", "/v2/%s/nodes?%s" % (PARENT, q))
            self.assertEqual(st, 200, rep)
            pages += 1
            got += [n["name"].rsplit("/", 1)[1] for n in rep["nodes"]]
            token = rep.get("nextPageToken")
            if not token:
                break
        self.assertEqual((got, pages), (names, 3))
        st, rep = s.call("GET", "/v2/projects/%s/locations/-/nodes" % P)
        self.assertEqual(len(rep["nodes"]), 6)
        # a token from another listing is refused
        st, rep = s.call("GET", "/v2/%s/nodes?pageSize=2" % PARENT)
        st, rep = s.call("GET", "/v2/projects/%s/locations/-/nodes?"
                         "pageToken=%s" % (P, rep["nextPageToken"]))
        self.assertEqual((st, rep["error"]["status"]),
                         (400, "INVALID_ARGUMENT"))
        st, rep = s.call("GET", "/v2/projects/none/locations/%s/nodes" % Z)
        self.assertEqual((st, rep), (200, {}))

    def test_create_and_delete_operations(self):
        s = self.srv
        body = {"acceleratorType": "v4-32",
                "runtimeVersion": "tpu-ubuntu2204-base",
                "metadata": {"startup-script": "#!/bin/sh\necho hi\n"},
                "networkConfig": {"network": "default",
                                  "enableExternalIps": True},
                "state": "READY", "name": "ignored"}
        st, op = s.call("POST", "/v2/%s/nodes?nodeId=c1&alt=json" % PARENT,
                        body)
        self.assertEqual(st, 200, op)
        self.assertFalse(op["done"])
        self.assertRegex(op["name"], "^%s/operations/operation-" % PARENT)
        self.assertEqual(op["metadata"]["verb"], "create")
        self.assertEqual(op["metadata"]["target"], PARENT + "/nodes/c1")
        st, node = s.call("GET", "/v2/%s/nodes/c1" % PARENT)
        self.assertEqual(node["state"], "CREATING")
        self.assertNotIn("health", node)
        st, dup = s.call("POST", "/v2/%s/nodes?nodeId=c1" % PARENT, body)
        self.assertEqual((st, dup["error"]["status"]),
                         (409, "ALREADY_EXISTS"))
        done = s.wait_op(op)
        self.assertNotIn("error", done)
        self.assertIn("endTime", done["metadata"])
        resp = done["response"]
        self.assertEqual(resp["@type"],
                         "type.googleapis.com/google.cloud.tpu.v2.Node")
        st, node = s.call("GET", "/v2/%s/nodes/c1" % PARENT)
        self.assertEqual((node["state"], node["health"]),
                         ("READY", "HEALTHY"))
        self.assertEqual(node["metadata"], body["metadata"])
        self.assertEqual(node["networkConfig"], body["networkConfig"])
        self.assertEqual(len(node["networkEndpoints"]), 4)  # v4-32: 4 hosts
        self.assertEqual(node["name"], PARENT + "/nodes/c1")
        # delete
        st, op = s.call("DELETE", "/v2/%s/nodes/c1" % PARENT)
        self.assertEqual((st, op["metadata"]["verb"]), (200, "delete"))
        self.assertEqual(s.call("GET", "/v2/%s/nodes/c1" % PARENT)[1]
                         ["state"], "DELETING")
        done = s.wait_op(op)
        self.assertEqual(done["response"]["@type"],
                         "type.googleapis.com/google.protobuf.Empty")
        self.assertEqual(s.call("GET", "/v2/%s/nodes/c1" % PARENT)[0], 404)
        self.assertEqual(s.call("DELETE", "/v2/%s/nodes/c1" % PARENT)[0],
                         404)
        ops = s.call("GET", "/v2/%s/operations" % PARENT)[1]["operations"]
        self.assertTrue(all(o["done"] for o in ops))
        # the admin-activity audit entries
        st, rep = s.call("POST", "/v2/entries:list", {
            "resourceNames": ["projects/" + P], "filter":
            'protoPayload.resourceName="%s/nodes/c1"' % PARENT})
        # (two per long-running call: its start and its end)
        self.assertEqual([(e["protoPayload"]["methodName"].rsplit(".")[-1],
                           sorted(e["operation"])) for e in rep["entries"]],
                         [("CreateNode", ["first", "id", "producer"]),
                          ("CreateNode", ["id", "last", "producer"]),
                          ("DeleteNode", ["first", "id", "producer"]),
                          ("DeleteNode", ["id", "last", "producer"])])
        self.assertEqual(rep["entries"][0]["operation"]["id"],
                         rep["entries"][1]["operation"]["id"])

    def test_create_refusals_and_quota(self):
        s = self.srv
        ok = {"acceleratorType": "v4-8", "runtimeVersion": "v"}
        for q, body in (("nodeId=Bad_Name", ok), ("", ok),
                        ("nodeId=q1", {"runtimeVersion": "v"}),
                        ("nodeId=q1", {"acceleratorType": "v4-8"})):
            st, rep = s.call("POST", "/v2/%s/nodes?%s" % (PARENT, q), body)
            self.assertEqual((st, rep["error"]["status"]),
                             (400, "INVALID_ARGUMENT"), (q, body))
        s.fake("POST", "config", {"quota_exhausted": True})
        st, op = s.call("POST", "/v2/%s/nodes?nodeId=q1" % PARENT, ok)
        self.assertEqual(st, 200)
        done = s.wait_op(op)
        self.assertEqual(done["error"]["code"], 8)
        self.assertIn("Quota", done["error"]["message"])
        self.assertNotIn("response", done)
        self.assertEqual(s.call("GET", "/v2/%s/nodes/q1" % PARENT)[0], 404)

    def test_injected_failures(self):
        s = self.srv
        s.fake("POST", "nodes", node_json("f1"))
        s.fake("POST", "fail", {"method": "GET", "path": "/nodes/f1",
                                "status": 429, "count": 2,
                                "message": "Quota exceeded for quota metric"})
        for _ in range(2):
            st, rep = s.call("GET", "/v2/%s/nodes/f1" % PARENT)
            self.assertEqual((st, rep["error"]["status"]),
                             (429, "RESOURCE_EXHAUSTED"))
            self.assertIn("Quota exceeded", rep["error"]["message"])
        self.assertEqual(s.call("GET", "/v2/%s/nodes/f1" % PARENT)[0], 200)
        # method and path must both match
        s.fake("POST", "fail", {"method": "DELETE", "status": 403})
        self.assertEqual(s.call("GET", "/v2/%s/nodes/f1" % PARENT)[0], 200)
        st, rep = s.call("DELETE", "/v2/%s/nodes/f1" % PARENT)
        self.assertEqual((st, rep["error"]["status"]),
                         (403, "PERMISSION_DENIED"))
        self.assertEqual(s.call("GET", "/v2/%s/nodes/f1" % PARENT)[1]
                         ["state"], "READY")  # the failed delete did nothing
        s.fake("POST", "fail", {"path": "entries:list", "status": 503})
        st, rep = s.call("POST", "/v2/entries:list",
                         {"resourceNames": ["projects/" + P]})
        self.assertEqual((st, rep["error"]["status"]), (503, "UNAVAILABLE"))

    def test_connection_faults(self):
        s = self.srv
        s.fake("POST", "nodes", node_json("k1"))
        path = "/v2/%s/nodes/k1" % PARENT
        s.fake("POST", "fail", {"path": "/nodes/k1", "kind": "reset"})
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            s.call("GET", path)
        s.fake("POST", "fail", {"path": "/nodes/k1", "kind": "hang",
                                "hang_s": 0.3})
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            s.call("GET", path)
        s.fake("POST", "fail", {"path": "/nodes/k1", "kind": "delay",
                                "delay_s": 0.3})
        t0 = time.monotonic()
        self.assertEqual(s.call("GET", path)[0], 200)
        self.assertGreaterEqual(time.monotonic() - t0, 0.3)
        self.assertEqual(s.call("GET", path)[0], 200)  # all used up
        st, rep = s.call("POST", "/_fake/fail", {"kind": "boom"}, headers={})
        self.assertEqual(st, 400)

    def test_node_shape(self):
        s = self.srv
        node = s.fake("POST", "nodes", node_json(
            "s1", acceleratorType="v4-32"))[0]
        self.assertEqual(node["acceleratorConfig"],
                         {"type": "V4", "topology": "2x2x4"})
        self.assertEqual(len(node["networkEndpoints"]), 4)
        self.assertRegex(node["id"], r"^\d+$")
        node = s.fake("POST", "nodes", node_json(
            "s2", acceleratorType="v5litepod-16"))[0]
        self.assertEqual((node["acceleratorConfig"]["topology"],
                          len(node["networkEndpoints"])), ("4x4", 4))
        # a create body is kept as proto3 JSON prints it
        st, op = s.call("POST", "/v2/%s/nodes?nodeId=s3" % PARENT, {
            "acceleratorType": "v4-8", "runtimeVersion": "v",
            "schedulingConfig": {"preemptible": False, "spot": False},
            "networkConfig": {"network": "default",
                              "enableExternalIps": False},
            "metadata": {"empty": ""}})
        s.wait_op(op)
        node = s.call("GET", "/v2/%s/nodes/s3" % PARENT)[1]
        self.assertEqual((node["schedulingConfig"], node["networkConfig"],
                          node["metadata"]),
                         ({}, {"network": "default"}, {"empty": ""}))
        # raw log entries get the fields the service always sets
        s.fake("POST", "logs", {"logName": SYS, "textPayload": "x"})
        e = s.fake("GET", "logs")[-1]
        self.assertTrue(e["insertId"] and e["receiveTimestamp"])
        self.assertIsNotNone(logging_filter.parse_time(e["timestamp"]))

    def test_patch_and_scheduled_changes(self):
        s = self.srv
        full = PARENT + "/nodes/p1"
        put = s.fake("POST", "nodes", node_json("p1", health="TIMEOUT"))[0]
        got = s.call("PATCH", "/_fake/nodes", {
            "name": full, "health": "HEALTHY", "healthDescription": None,
            "labels": {"a": "b"}}, headers={})[1]
        self.assertEqual(got, dict(put, health="HEALTHY", labels={"a": "b"}))
        # a node that goes down, then comes back by itself; and a change
        # due in an hour, which must not be applied yet
        self.assertTrue(s.fake("POST", "maintenance", {
            "node": full, "kind": "terminate", "state": "STOPPED",
            "after_s": 0.2})["scheduled"])
        for after, fields in ((0.4, {"state": "READY", "health": "HEALTHY"}),
                              (3600, {"labels": None})):
            st, rep = s.call("PATCH", "/_fake/nodes", dict(
                fields, name=full, after_s=after), headers={})
            self.assertEqual(st, 200)
        flt = {"resourceNames": ["projects/" + P],
               "filter": 'resource.labels.node_id="p1"'}
        for _ in range(PATIENCE * 20):  # a hang guard, not a timing
            n = s.call("GET", "/v2/" + full)[1]
            entries = s.call("POST", "/v2/entries:list", flt)[1]
            if entries and n["state"] == "READY":
                break
            time.sleep(0.02)
        # applied in the order they were due: down, then back
        self.assertEqual((n["state"], n["health"], n["labels"]),
                         ("READY", "HEALTHY", {"a": "b"}))
        self.assertEqual([e["protoPayload"]["methodName"]
                          for e in entries["entries"]],
                         ["tpu.nodes.terminate"])
        st, rep = s.call("PATCH", "/_fake/nodes", {"name": PARENT +
                                                   "/nodes/none"}, headers={})
        self.assertEqual(st, 404)

    def test_chunked_request_body(self):
        s = self.srv
        body = json.dumps({"resourceNames": ["projects/" + P],
                           "filter": 'resource.labels.node_id="none"'})
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=PATIENCE)
        c.request("POST", "/v2/entries:list", body=iter(
            [body[:10].encode(), body[10:].encode()]), headers=AUTH,
            encode_chunked=True)
        r = c.getresponse()
        self.assertEqual((r.status, json.loads(r.read())), (200, {}))
        c.close()
        self.assertEqual(s.fake("GET", "requests")[-1]["body"]["filter"],
                         'resource.labels.node_id="none"')

    def test_requests_recorded(self):
        s = self.srv
        s.fake("DELETE", "requests")
        s.call("GET", "/v2/%s/nodes/r1?alt=json" % PARENT)
        s.call("POST", "/v2/entries:list", {"resourceNames": ["projects/x"],
                                            "pageSize": 3})
        reqs = s.fake("GET", "requests")
        self.assertEqual([(r["method"], r["path"]) for r in reqs],
                         [("GET", "/v2/%s/nodes/r1" % PARENT),
                          ("POST", "/v2/entries:list")])
        self.assertEqual(reqs[0]["query"], {"alt": "json"})
        self.assertEqual(reqs[1]["body"]["pageSize"], 3)
        self.assertEqual(reqs[0]["authorization"], AUTH["Authorization"])

    def test_maintenance_control(self):
        s = self.srv
        s.fake("POST", "nodes", node_json("m1", upcomingMaintenance={
            "type": "SCHEDULED", "canReschedule": True,
            "maintenanceStatus": "PENDING",
            "windowStartTime": "2026-12-10T04:00:00Z"}))
        full = PARENT + "/nodes/m1"
        node = s.fake("POST", "maintenance", {
            "node": full, "kind": "terminate", "reason": "Host update",
            "state": "TERMINATED", "time": "2026-12-03T01:02:03.456Z",
            "set": {"upcomingMaintenance": None}})
        self.assertEqual((node["state"], node["health"]),
                         ("TERMINATED", "UNHEALTHY_MAINTENANCE"))
        self.assertIn("2026-12-03T01:02:03.456Z", node["healthDescription"])
        self.assertNotIn("upcomingMaintenance", node)
        s.fake("POST", "maintenance", {"node": full, "kind": "restart",
                                       "state": "READY"})
        got = s.call("GET", "/v2/" + full)[1]
        self.assertEqual((got["state"], got["health"]),
                         ("READY", "UNHEALTHY_MAINTENANCE"))
        st, rep = s.call("POST", "/v2/entries:list", {
            "resourceNames": ["projects/" + P], "orderBy": "timestamp asc",
            "filter": MAINT + ' AND resource.labels.node_id="m1"'})
        es = rep["entries"]
        self.assertEqual([e["protoPayload"]["methodName"] for e in es],
                         ["tpu.nodes.terminate", "tpu.nodes.restart"])
        self.assertEqual(es[0]["timestamp"], "2026-12-03T01:02:03.456Z")
        self.assertEqual(es[0]["protoPayload"]["metadata"]
                         ["terminateReason"], "Host update")
        self.assertEqual(es[0]["logName"], SYS)
        self.assertEqual(es[0]["protoPayload"]["resourceName"], full)
        st, rep = s.call("POST", "/_fake/maintenance", {
            "node": PARENT + "/nodes/none"}, headers={})
        self.assertEqual(st, 404)
        st, rep = s.call("POST", "/_fake/config", {"bogus": 1}, headers={})
        self.assertEqual(st, 400)

    def test_entries_list(self):
        s = self.srv
        node = "e%d" % time.time_ns()  # entries of this test only
        es = [audit_entry(node, "tpu.nodes.terminate",
                          "2026-11-0%dT00:00:00Z" % d, "r%d" % d)
              for d in (3, 1, 5, 2, 4)]
        es.append(audit_entry(node, "tpu.nodes.terminate",
                              "2026-11-01T00:00:00Z", project="other"))
        self.assertEqual(s.fake("POST", "logs", es)["appended"], 6)
        req = {"resourceNames": ["projects/" + P],
               "filter": 'resource.labels.node_id="%s"' % node}

        def reasons(rep):
            return [e["protoPayload"]["metadata"]["terminateReason"]
                    for e in rep.get("entries", [])]
        st, rep = s.call("POST", "/v2/entries:list", req)
        self.assertEqual(reasons(rep), ["r1", "r2", "r3", "r4", "r5"])
        st, rep = s.call("POST", "/v2/entries:list",
                         dict(req, orderBy="timestamp desc"))
        self.assertEqual(reasons(rep), ["r5", "r4", "r3", "r2", "r1"])
        got, token, pages = [], None, 0
        while True:
            page = dict(req, orderBy="timestamp desc", pageSize=2)
            if token:
                page["pageToken"] = token
            st, rep = s.call("POST", "/v2/entries:list", page)
            self.assertEqual(st, 200, rep)
            pages += 1
            got += reasons(rep)
            token = rep.get("nextPageToken")
            if not token:
                break
        self.assertEqual((got, pages), (["r5", "r4", "r3", "r2", "r1"], 3))
        st, rep = s.call("POST", "/v2/entries:list", dict(
            req, filter=req["filter"] + ' AND timestamp>="2026-11-03T00:00:'
            '00Z" AND timestamp<"2026-11-05T00:00:00Z"'))
        self.assertEqual(reasons(rep), ["r3", "r4"])
        st, rep = s.call("POST", "/v2/entries:list", dict(
            req, resourceNames=["projects/other"]))
        self.assertEqual(len(rep["entries"]), 1)
        st, rep = s.call("POST", "/v2/entries:list", dict(
            req, filter='resource.labels.node_id="none"'))
        self.assertEqual((st, rep), (200, {}))
        # the service's refusals
        for bad in ({"pageSize": 1001}, {"pageSize": -1},
                    {"orderBy": "insertId"}, {"resourceNames": []},
                    {"filter": 'timestamp>="'}, {"pageToken": "zzz"},
                    {"filter": "a=(b"}):
            st, rep = s.call("POST", "/v2/entries:list", dict(req, **bad))
            self.assertEqual((st, rep["error"]["status"]),
                             (400, "INVALID_ARGUMENT"), bad)


def start_options_and_sigterm():
    """--nodes and --op-delay at start; SIGTERM while a call hangs."""
    with tempfile.TemporaryDirectory(prefix="tpu-nodes-") as tmp:
        path = os.path.join(tmp, "nodes.json")
        with open(path, "w") as f:
            json.dump([node_json("o1", state="PREEMPTED"),
                       node_json("o2", health=None)], f)
        with FakeTpu("--nodes", path, "--op-delay", "3600") as s:
            st, rep = s.call("GET", "/v2/%s/nodes" % PARENT)
            assert [(n["state"], n.get("health")) for n in rep["nodes"]] == [
                ("PREEMPTED", "HEALTHY"), ("READY", None)], rep
            st, op = s.call("DELETE", "/v2/%s/nodes/o1" % PARENT)
            assert s.call("GET", "/v2/" + op["name"])[1]["done"] is False
            s.fake("POST", "fail", {"kind": "hang", "hang_s": 3600})
            c = http.client.HTTPConnection("127.0.0.1", s.port,
                                           timeout=PATIENCE)
            c.request("GET", "/v2/%s/nodes/o2" % PARENT, headers=AUTH)
            for _ in range(PATIENCE * 20):  # until the hang has begun
                if any(r["path"].endswith("/o2")
                       for r in s.fake("GET", "requests")):
                    break
                time.sleep(0.05)
        # __exit__ checked exit status 0 with the call still hanging
        c.close()
    print("--nodes, --op-delay, SIGTERM with a hanging call: ok")


def run_protocol():
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Protocol)
    ok = unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful()
    start_options_and_sigterm()
    return 0 if ok else 1


# --------------------------------------------------------------------------
# gcloud

# gcloud must see only the private config and the fake server: no
# user settings, no credentials, and no route out but loopback
DEAD_PROXY = "http://127.0.0.1:9"


def gcloud_env(cfg):
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("CLOUDSDK_", "GOOGLE_", "GCE_")) and
            k.lower() not in ("http_proxy", "https_proxy", "no_proxy")}
    return dict(keep, CLOUDSDK_CONFIG=cfg, CLOUDSDK_CORE_DISABLE_PROMPTS="1",
                HTTP_PROXY=DEAD_PROXY, HTTPS_PROXY=DEAD_PROXY,
                http_proxy=DEAD_PROXY, https_proxy=DEAD_PROXY,
                NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")


def find_gcloud():
    for exe in (shutil.which("gcloud"), "/usr/bin/gcloud"):
        if exe and os.access(exe, os.X_OK):
            return exe
    return None


def run_gcloud():
    exe = find_gcloud()
    if exe is None:
        skip("gcloud (Google Cloud CLI) is not installed")
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            failures.append(what)

    with FakeTpu("--op-delay", "1") as srv, tempfile.TemporaryDirectory(
            prefix="gcloud-tpu-") as tmp:
        cfg = os.path.join(tmp, "cfg")
        os.mkdir(cfg)
        token = "ya29.tpu-fidelity-%d" % os.getpid()
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(token + "\n")
        env = gcloud_env(cfg)
        # only this run's token is accepted, so a success proves it was sent
        srv.fake("POST", "config", {"token": token})

        def g(*args, ok=True):
            p = subprocess.run([exe] + list(args), env=env, cwd=tmp,
                               capture_output=True, timeout=300)
            if ok and p.returncode != 0:
                print("gcloud %s failed (%d):\n%s" % (
                    " ".join(args), p.returncode, p.stderr.decode()[-3000:]))
            return p

        for prop, val in (("core/project", P),
                          ("auth/access_token_file", token_file),
                          ("api_endpoint_overrides/tpu", srv.base + "/"),
                          ("api_endpoint_overrides/logging", srv.base + "/"),
                          ("core/disable_usage_reporting", "true"),
                          ("component_manager/disable_update_check",
                           "true")):
            check(g("config", "set", prop, val).returncode == 0,
                  "config set " + prop)
        zone = ("--zone", Z)
        window = {"type": "SCHEDULED", "canReschedule": True,
                  "maintenanceStatus": "PENDING",
                  "windowStartTime": "2026-12-10T04:00:00Z",
                  "windowEndTime": "2026-12-10T08:00:00Z",
                  "latestWindowStartTime": "2026-12-11T04:00:00Z"}
        held = srv.fake("POST", "nodes", node_json(
            "v1", state="READY", health="UNHEALTHY_MAINTENANCE",
            healthDescription="The TPU had a maintenance event at "
            "2026-12-03T03:44:36.265703305Z", upcomingMaintenance=window,
            symptoms=[{"symptomType": "LOW_MEMORY", "workerId": "0",
                       "createTime": "2026-12-03T03:44:36Z",
                       "details": "low memory"}],
            metadata={"startup-script": "echo hi"}))[0]

        # describe: JSON and the guide's `| grep health`
        p = g("compute", "tpus", "tpu-vm", "describe", "v1", *zone,
              "--format=json")
        shown = json.loads(p.stdout or b"{}")
        check(shown == held, "describe --format=json shows the node the "
              "server holds")
        p = g("compute", "tpus", "tpu-vm", "describe", "v1", *zone)
        lines = [ln for ln in p.stdout.decode().splitlines()
                 if "health" in ln]
        check(lines == ["health: UNHEALTHY_MAINTENANCE",
                        "healthDescription: The TPU had a maintenance event"
                        " at 2026-12-03T03:44:36.265703305Z"],
              "describe | grep health: %r" % lines)
        p = g("compute", "tpus", "tpu-vm", "describe", "nope", *zone,
              ok=False)
        err = p.stderr.decode()
        check(p.returncode != 0 and "NOT_FOUND" in err and
              PARENT + "/nodes/nope" in err,
              "describe of a missing node: %s" % err.strip()[:160])

        # list, across pages
        srv.fake("POST", "nodes", [node_json("v%d" % i) for i in range(2, 6)])
        srv.fake("DELETE", "requests")
        p = g("compute", "tpus", "tpu-vm", "list", *zone, "--page-size=2",
              "--format=value(name)")
        names = sorted(p.stdout.decode().split())
        check(names == ["v%d" % i for i in range(1, 6)],
              "list --page-size=2 shows every node: %r" % names)
        reqs = srv.fake("GET", "requests")
        check(len(reqs) == 3 and all(r["query"].get("pageSize") == "2"
                                     for r in reqs) and
              "pageToken" in reqs[-1]["query"],
              "list followed the page tokens (%d calls)" % len(reqs))
        check(all(r["authorization"] == "Bearer " + token for r in reqs),
              "the access token file's token was sent")
        srv.fake("POST", "nodes", {
            "name": "projects/%s/locations/europe-west4-a/nodes/w1" % P,
            "acceleratorType": "v5litepod-16"})
        p = g("compute", "tpus", "tpu-vm", "list", "--zone=-")
        rows = [ln.split() for ln in p.stdout.decode().splitlines()]
        check(rows and rows[0][:5] == ["NAME", "ZONE", "ACCELERATOR_TYPE",
                                       "TYPE", "TOPOLOGY"] and
              ["w1", "europe-west4-a", "v5litepod-16", "V5LITE_POD", "4x4"]
              in [r[:5] for r in rows] and len(rows) == 7,
              "list --zone=- (every zone) with type and topology: %r" %
              rows[:2])

        # gcloud retries a 503 (and so reads the error format right)
        srv.fake("DELETE", "requests")
        srv.fake("POST", "fail", {"method": "GET", "path": "/nodes/v1",
                                  "status": 503, "count": 1})
        p = g("compute", "tpus", "tpu-vm", "describe", "v1", *zone,
              "--format=value(health)")
        check(p.stdout.decode().strip() == "UNHEALTHY_MAINTENANCE" and
              len(srv.fake("GET", "requests")) == 2,
              "describe after one 503: retried, then the node")

        # create with a startup script, polled to the end
        script = "#!/bin/bash\nckptctl restore --latest\n"
        script_file = os.path.join(tmp, "startup.sh")
        with open(script_file, "w") as f:
            f.write(script)
        srv.fake("DELETE", "requests")
        p = g("compute", "tpus", "tpu-vm", "create", "c1", *zone,
              "--accelerator-type=v4-8", "--version=tpu-ubuntu2204-base",
              "--metadata-from-file=startup-script=" + script_file,
              "--labels=job=ckpt")
        check(p.returncode == 0, "create through gcloud")
        reqs = srv.fake("GET", "requests")
        polls = [r for r in reqs if "/operations/" in r["path"]]
        check(len(polls) >= 1, "gcloud polled the operation (%d times)" %
              len(polls))
        st, node = srv.call("GET", "/v2/%s/nodes/c1" % PARENT, headers={
            "Authorization": "Bearer " + token})
        check(st == 200 and node.get("metadata", {}).get("startup-script")
              == script and node.get("labels") == {"job": "ckpt"} and
              node.get("state") == "READY" and
              node.get("acceleratorType") == "v4-8",
              "the created node carries gcloud's settings: %r" % node.get(
                  "metadata"))

        # delete
        p = g("compute", "tpus", "tpu-vm", "delete", "c1", *zone, "--quiet")
        check(p.returncode == 0, "delete through gcloud")
        nodes = [n["name"] for n in srv.fake("GET", "nodes")]
        check(PARENT + "/nodes/c1" not in nodes, "the node is gone")

        # a create that fails with quota exhausted
        srv.fake("POST", "config", {"quota_exhausted": True})
        p = g("compute", "tpus", "tpu-vm", "create", "c2", *zone,
              "--accelerator-type=v4-8", "--version=tpu-ubuntu2204-base",
              ok=False)
        err = p.stderr.decode()
        check(p.returncode != 0 and "Quota" in err,
              "create with quota exhausted fails: %s" % err.strip()[-200:])
        srv.fake("POST", "config", {"quota_exhausted": False})

        # an API error in gcloud's words
        srv.fake("POST", "fail", {"method": "GET", "path": "/nodes/v1",
                                  "status": 403, "message":
                                  "Permission 'tpu.nodes.get' denied"})
        p = g("compute", "tpus", "tpu-vm", "describe", "v1", *zone,
              ok=False)
        err = p.stderr.decode()
        check(p.returncode != 0 and "tpu.nodes.get" in err,
              "a 403 reaches the user: %s" % err.strip()[:160])

        # maintenance history through `gcloud logging read`
        full = PARENT + "/nodes/v1"
        srv.fake("POST", "maintenance", {"node": full, "kind": "terminate",
                                         "reason": "Host maintenance",
                                         "state": "TERMINATED"})
        srv.fake("POST", "maintenance", {"node": full, "kind": "restart",
                                         "state": "READY"})
        old = audit_entry("v1", "tpu.nodes.terminate",
                          "2020-01-01T00:00:00Z", "long ago")
        other = audit_entry("v2", "tpu.nodes.terminate",
                            tpu_store.rfc3339(), "another node")
        srv.fake("POST", "logs", [old, other])
        flt = MAINT + ' AND resource.labels.node_id="v1"'
        p = g("logging", "read", flt, "--format=json")
        got = json.loads(p.stdout or b"[]")
        check([e["protoPayload"]["methodName"] for e in got] ==
              ["tpu.nodes.restart", "tpu.nodes.terminate"],
              "logging read: this node's recent entries, newest first: %r"
              % [e["protoPayload"]["methodName"] for e in got])
        check(got and got[-1]["protoPayload"]["metadata"]
              ["terminateReason"] == "Host maintenance",
              "logging read shows protoPayload.metadata.terminateReason")
        st, direct = srv.call("POST", "/v2/entries:list", {
            "resourceNames": ["projects/" + P], "filter": flt +
            ' AND timestamp>="2026-01-01T00:00:00Z"',
            "orderBy": "timestamp desc"}, headers={
                "Authorization": "Bearer " + token})
        check(direct.get("entries") == got,
              "logging read lists exactly what entries:list returns")
        p = g("logging", "read", flt, "--freshness=3650d", "--order=asc",
              "--format=json")
        got = json.loads(p.stdout or b"[]")
        check([e["protoPayload"]["metadata"].get("terminateReason")
               for e in got if "metadata" in e["protoPayload"]] ==
              ["long ago", "Host maintenance"],
              "logging read --order=asc --freshness: oldest first")
        p = g("logging", "read", flt, "--limit=1", "--format=json")
        got = json.loads(p.stdout or b"[]")
        check([e["protoPayload"]["methodName"] for e in got] ==
              ["tpu.nodes.restart"], "logging read --limit=1")
        srv.fake("DELETE", "requests")
        p = g("logging", "read", 'resource.labels.node_id="v1"',
              "--freshness=3650d", "--format=json")
        n_all = len(json.loads(p.stdout or b"[]"))
        reqs = srv.fake("GET", "requests")
        check(n_all == 3 and reqs and reqs[0]["body"]["resourceNames"] ==
              ["projects/" + P], "logging read sends resourceNames "
              "projects/P (%d entries)" % n_all)
    print("%d checks failed" % len(failures))
    return 1 if failures else 0


def main():
    modes = {"filter": run_filter, "protocol": run_protocol,
             "gcloud": run_gcloud}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        print("usage: test_tpu_fidelity.py %s" % "|".join(modes),
              file=sys.stderr)
        return 2
    return modes[sys.argv[1]]()


if __name__ == "__main__":
    sys.exit(main())
