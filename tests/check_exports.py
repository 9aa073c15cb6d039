#!/usr/bin/python3
"""check_exports.py - the shared library exports exactly the public API.

Usage: check_exports.py LIBCKPT.so libckpt.map ckpt.h [NM]

Three lists must agree:
  - the functions declared CKPT_API in the public header,
  - the names listed (never by wildcard) in the version script's global:
    sections, each exactly once,
  - the symbols `nm -D --defined-only` finds in the built library (other
    than version nodes), each bound to a version node of the map.
Prints every difference and exits 1 if there is one.
"""
import re
import subprocess
import sys


def header_functions(text):
    """Names of the functions declared CKPT_API (comments and preprocessor
    lines removed first, so the #define of CKPT_API itself is skipped)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(l for l in text.split("\n")
                     if not l.lstrip().startswith("#"))
    names = []
    for decl in text.split(";"):
        if not re.search(r"\bCKPT_API\b", decl):
            continue
        m = re.search(r"\b(ckpt_\w+)\s*\(", decl)
        if not m:
            raise SystemExit("cannot parse declaration: %s" % decl.strip())
        names.append(m.group(1))
    return names


def map_symbols(text):
    """{version node: [names in global:]} and a list of problems."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"#[^\n]*", " ", text)
    nodes, problems = {}, []
    for m in re.finditer(r"(\w[\w.]*)\s*\{(.*?)\}\s*([\w.]*)\s*;", text,
                         flags=re.S):
        node, body = m.group(1), m.group(2)
        section, names = None, []
        for tok in re.findall(r"[^\s;]+:|[^\s;]+", body):
            if tok.endswith(":"):
                section = tok[:-1]
                continue
            if section == "global":
                if any(c in tok for c in "*?["):
                    problems.append("map: wildcard %r in global: of %s"
                                    % (tok, node))
                names.append(tok)
            elif section == "local" and tok != "*":
                problems.append("map: unexpected local entry %r" % tok)
        nodes[node] = names
    if not nodes:
        problems.append("map: no version node found")
    return nodes, problems


def library_symbols(lib, nm):
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] == "A":
            continue  # version node definitions
        name, _, version = parts[2].partition("@")
        syms[name] = version.lstrip("@")
    return syms


def main(argv):
    if len(argv) not in (4, 5):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    lib, mapfile, header = argv[1:4]
    nm = argv[4] if len(argv) == 5 else "nm"
    with open(header) as f:
        declared = header_functions(f.read())
    with open(mapfile) as f:
        nodes, problems = map_symbols(f.read())
    exported = library_symbols(lib, nm)

    listed = {}
    for node, names in nodes.items():
        for n in names:
            if n in listed:
                problems.append("map: %s listed in %s and %s"
                                % (n, listed[n], node))
            listed[n] = node
    if len(set(declared)) != len(declared):
        problems.append("header: a function is declared twice")
    declared = set(declared)

    for n in sorted(declared - set(listed)):
        problems.append("declared CKPT_API but not in the map: " + n)
    for n in sorted(set(listed) - declared):
        problems.append("in the map but not declared CKPT_API: " + n)
    for n in sorted(declared - set(exported)):
        problems.append("declared CKPT_API but not exported: " + n)
    for n in sorted(set(exported) - declared):
        problems.append("exported but not declared CKPT_API: " + n)
    for n, version in sorted(exported.items()):
        if n in listed and version != listed[n]:
            problems.append("%s is exported as version %r, the map says %s"
                            % (n, version, listed[n]))
    for p in problems:
        print(p)
    print("%d functions declared, %d listed in %d version node(s), "
          "%d exported" % (len(declared), len(listed), len(nodes),
                           len(exported)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
