"""logging_filter: the Cloud Logging query language, the part tests use.

Python 3 standard library only; imported by fake_tpu.py (no I/O here).

  filter text --tokens()--> [(kind, text)] --Parser--> tree of tuples
  tree + log entry (a dict, as entries:list returns it) --matches()--> bool

THE REAL LANGUAGE (Google's "Logging query language" page; FAKE marks
what this module simplifies):
- expression = ["NOT"] comparison { ("AND" | "OR") ["NOT"] comparison };
  terms next to each other with no operator are ANDed. NOT binds tightest,
  then OR, then AND: `a OR NOT b AND NOT c OR d` is
  `(a OR (NOT b)) AND ((NOT c) OR d)`. `-` before a term is NOT.
  Parentheses group.
- comparison = FIELD OP VALUE, OP one of = != > < >= <= : =~ !~.
  FIELD is a dotted path into the entry (protoPayload.methodName,
  resource.labels.node_id, protoPayload.metadata.terminateReason); a
  segment may be quoted (labels."a.b/c"). VALUE is a quoted string (\"
  and \\ escapes) or a bare word; a parenthesised list `("a" OR "b")`
  (AND too) compares against each.
- String comparisons are not case sensitive; `:` is "has" (substring);
  `FIELD:*` tests presence; =~ / !~ are RE2 regular expressions
  (FAKE: Python's re). `timestamp` compares as time (RFC 3339, any
  fraction and offset), `severity` by level (DEFAULT < DEBUG < INFO <
  NOTICE < WARNING < ERROR < CRITICAL < ALERT < EMERGENCY), numbers as
  numbers. A repeated field (list) matches if any element does. A field
  that is absent makes every comparison false except `!=`... (FAKE: the
  service's exact rule for != on a missing field is not documented;
  here it is true).
- A bare value with no field is a global restriction: every field has it
  (FAKE: a case-insensitive substring of the entry's JSON text).
- A filter that does not parse is 400 INVALID_ARGUMENT (FilterError).
  FAKE: functions (SEARCH, sample, ip_in_net, log_id) are not supported
  and are a FilterError.
"""

import datetime
import json
import re

SEVERITIES = ["DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR",
              "CRITICAL", "ALERT", "EMERGENCY"]
OPS = ("!=", ">=", "<=", "=~", "!~", "=", ">", "<", ":")
_TOKEN = re.compile(r'''
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<op>!=|>=|<=|=~|!~|=|>|<|:)
  | (?P<lp>\()
  | (?P<rp>\))
  | (?P<dot>\.)
  | (?P<minus>-(?=[\w"(]))
  | (?P<word>[^\s"()=!<>:.]+)
''', re.X)


class FilterError(ValueError):
    """The filter does not parse; the message says where."""


def tokens(text):
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise FilterError("unexpected character %r at %d" % (
                text[pos], pos))
        kind = m.lastgroup
        tok = m.group(kind)
        if kind == "str":
            tok = re.sub(r"\\(.)", r"\1", tok[1:-1])
        if kind != "ws":
            if kind == "word" and tok in ("AND", "OR", "NOT"):
                kind = tok
            out.append((kind, tok, pos))
        pos = m.end()
    return out


class Parser:
    """Recursive descent over tokens(); parse() gives the tree:
    ("and", [t...]) ("or", [t...]) ("not", t) ("cmp", path, op, values)
    ("global", value). values is ("list", conj, [v...]) or a string."""

    def __init__(self, text):
        self.text = text
        self.toks = tokens(text)
        self.i = 0

    def peek(self, off=0):
        j = self.i + off
        return self.toks[j] if j < len(self.toks) else (None, None, None)

    def take(self, kind=None):
        t = self.peek()
        if t[0] is None or (kind and t[0] != kind):
            raise FilterError("expected %s at %s in %r" % (
                kind or "a term", "end" if t[0] is None else t[2],
                self.text))
        self.i += 1
        return t

    def parse(self):
        if not self.toks:
            return ("and", [])
        tree = self.conj()
        if self.peek()[0] is not None:
            raise FilterError("unexpected %r at %d" % self.peek()[1:])
        return tree

    def conj(self):
        terms = [self.disj()]
        while self.peek()[0] not in (None, "rp", "OR"):
            if self.peek()[0] == "AND":
                self.take()
            terms.append(self.disj())
        return terms[0] if len(terms) == 1 else ("and", terms)

    def disj(self):
        terms = [self.unary()]
        while self.peek()[0] == "OR":
            self.take()
            terms.append(self.unary())
        return terms[0] if len(terms) == 1 else ("or", terms)

    def unary(self):
        if self.peek()[0] in ("NOT", "minus"):
            self.take()
            return ("not", self.unary())
        if self.peek()[0] == "lp":
            self.take()
            tree = self.conj()
            self.take("rp")
            return tree
        return self.comparison()

    def comparison(self):
        kind, tok, pos = self.take()
        if kind not in ("word", "str"):
            raise FilterError("unexpected %r at %d" % (tok, pos))
        path = [tok]
        while self.peek()[0] == "dot":
            self.take()
            path.append(self.take_one(("word", "str"))[1])
        if self.peek()[0] != "op":
            if len(path) > 1:
                raise FilterError("field %s without an operator at %d" % (
                    ".".join(path), pos))
            return ("global", tok)
        op = self.take()[1]
        value = self.value()
        if path in (["timestamp"], ["receiveTimestamp"]) and op != ":":
            for v in value[2] if isinstance(value, tuple) else [value]:
                if parse_time(v) is None:
                    raise FilterError("invalid timestamp %r at %d" % (v, pos))
        return ("cmp", path, op, value)

    def take_one(self, kinds):
        t = self.peek()
        if t[0] not in kinds:
            return self.take(kinds[0])
        self.i += 1
        return t

    def value(self):
        if self.peek()[0] == "lp":
            self.take()
            vals, conj = [self.value()], None
            while self.peek()[0] != "rp":
                k = self.take()[0]
                if k not in ("AND", "OR"):
                    raise FilterError("expected OR/AND in a value list "
                                      "in %r" % self.text)
                if conj not in (None, k):
                    raise FilterError("mixed AND/OR in a value list")
                conj = k
                vals.append(self.value())
            self.take("rp")
            return ("list", conj or "OR", vals)
        kind, tok, pos = self.take()
        if kind not in ("word", "str"):
            raise FilterError("expected a value at %d" % pos)
        # a bare value may contain dots (1.5, a.b): glue them back
        while kind == "word" and self.peek()[0] == "dot":
            self.take()
            tok += "." + self.take("word")[1]
        return tok


def parse(text):
    return Parser(text or "").parse()


def parse_time(s):
    """RFC 3339 (any fraction, Z or offset; a bare date too) to
    (epoch seconds, nanoseconds); None if it is not a time."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)(?:[Tt ](\d\d:\d\d:\d\d)"
                     r"(?:\.(\d{1,9}))?)?([Zz]|[+-]\d\d:\d\d)?", s.strip())
    if not m:
        return None
    tz = m.group(4) or "Z"
    tz = "+00:00" if tz in "Zz" else tz
    try:
        dt = datetime.datetime.fromisoformat(
            "%sT%s%s" % (m.group(1), m.group(2) or "00:00:00", tz))
    except ValueError:
        return None
    nanos = int((m.group(3) or "").ljust(9, "0"))
    return (int(dt.timestamp()), nanos)


def lookup(entry, path):
    """The values at a dotted path (a list: lists fan out); [] if absent."""
    cur = [entry]
    for seg in path:
        nxt = []
        for c in cur:
            if isinstance(c, list):
                c_list = c
            else:
                c_list = [c]
            for x in c_list:
                if isinstance(x, dict) and seg in x:
                    nxt.append(x[seg])
        cur = nxt
    out = []
    for c in cur:
        out.extend(c if isinstance(c, list) else [c])
    return out


def _key(path, v):
    """A comparable form of a value for ordering operators."""
    if path == ["timestamp"] or path == ["receiveTimestamp"]:
        t = parse_time(str(v))
        if t is not None:
            return t
    if path == ["severity"] and str(v).upper() in SEVERITIES:
        return SEVERITIES.index(str(v).upper())
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return str(v).lower()


def _cmp1(path, op, have, want):
    if isinstance(have, (dict, list)):
        have = json.dumps(have)
    if isinstance(have, bool):
        have = "true" if have else "false"
    if op == ":":
        return want == "*" or str(want).lower() in str(have).lower()
    if op in ("=~", "!~"):
        hit = re.search(want, str(have)) is not None
        return hit if op == "=~" else not hit
    a, b = _key(path, have), _key(path, want)
    if type(a) is not type(b):
        a, b = str(have).lower(), str(want).lower()
    return {"=": a == b, "!=": a != b, ">": a > b, "<": a < b,
            ">=": a >= b, "<=": a <= b}[op]


def _cmp(path, op, values, want):
    if isinstance(want, tuple):  # ("list", conj, [...])
        res = [_cmp(path, op, values, w) for w in want[2]]
        return all(res) if want[1] == "AND" else any(res)
    if not values:
        return op in ("!=", "!~")
    if op in ("!=", "!~"):
        return all(_cmp1(path, op, v, want) for v in values)
    return any(_cmp1(path, op, v, want) for v in values)


def matches(tree, entry):
    kind = tree[0]
    if kind == "and":
        return all(matches(t, entry) for t in tree[1])
    if kind == "or":
        return any(matches(t, entry) for t in tree[1])
    if kind == "not":
        return not matches(tree[1], entry)
    if kind == "global":
        return tree[1].lower() in json.dumps(entry).lower()
    _, path, op, want = tree
    if op in ("=~", "!~"):
        try:
            for w in (want[2] if isinstance(want, tuple) else [want]):
                re.compile(w)
        except re.error as e:
            raise FilterError("bad regular expression: %s" % e)
    return _cmp(path, op, lookup(entry, path), want)
